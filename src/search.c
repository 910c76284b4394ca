/* search.c -- the local search: one judge and rule, its moves, the descent, kicks, rockmate's portfolio and phases
 *
 * Uses (through internal.h): base.c, plan.c, sim.c, layout.c, baseline.c, progress.c, produce.c, offload.c.
 *
 * One search over the canonical plan form (a plan's compute steps, with
 * the earliest frees: polish below). Every candidate is that form with
 * one move applied, judged by one replay at a target budget (rkm__judge)
 * and kept by one rule (rkm__accept: less excess over the target, or as
 * much and faster). The moves:
 *
 *   move                      built by             judged                          made in
 *   drop a recomputation      rkm__polish_drop     at the target                   polish; the squeeze's prune
 *   rebuild before a reader   rkm__squeeze_move    at the target, over it          the squeeze's rounds
 *   re-save before a backward rkm__squeeze_move    at the target, over it          the squeeze's rounds
 *   kick                      rkm__polish_drop     at any peak, then the descent   rkm__solve_kicked
 *   trade a recomputation     rkm__polish_drop     with the offload pass's copies  rkm__offload_moves
 *     for a copy
 *   squeeze into the arena    the descent          at targets below the peak       rkm__arena_fit
 *
 * The descent (rkm__descend: squeeze within the target, then polish) is
 * the one way down from a plan; the drivers below only choose where it
 * starts (the portfolio, DTR's missed plan) and at which target (the
 * budget, the rungs under it, the arena's). What a driver asks is an
 * rkm__ask passed by value; every replay is charged to the call's meter. */
#include "internal.h"

/* ---- the search's share of the call's work -------------------------------
 *
 * Each of the fit's tries (rkm__planner_try) gives the search a share of
 * what is left of the call's meter (progress.c): RKM__SOLVE_WORK at most,
 * and no more than its request leaves (rkm__ask.work_end: the offloading
 * bases' shared work). Every step the search replays, in polish, the squeeze and
 * the kicks, is charged to both; within the share, the squeeze and the
 * kicks have shares of their own, so that one does not starve the next.
 * Work is counted in replayed steps, not time, so plans do not depend on
 * the machine. */
RKM__PRIVATE void rkm__search_begin(rkm_planner *pl, rkm__ask ask)
{
    uint64_t spent = rkm__work_spent(pl), left = rkm__work_left(pl);
    uint64_t end_left = ask.work_end > spent ? ask.work_end - spent : 0;
    uint64_t share = end_left < RKM__SOLVE_WORK ? end_left : RKM__SOLVE_WORK;
    pl->work_left = share < left ? share : left;
}

/* What a part of the search may spend: its share, or what the try and the
 * call have left; nothing past the deadline. */
static uint64_t rkm__share(rkm_planner *pl, uint64_t cap)
{
    if (rkm__over(pl)) return 0;
    uint64_t left = rkm__work_left(pl);
    if (pl->work_left < left) left = pl->work_left;
    return cap < left ? cap : left;
}

static void rkm__spend(rkm_planner *pl, uint64_t work)
{
    pl->work_left = work < pl->work_left ? pl->work_left - work : 0;
    rkm__work_charge(pl, work);
}

/* ---- resumed replays ------------------------------------------------------
 *
 * The search's candidates are a reference plan (polish's best, the
 * squeeze's whole plan) changed from some step on, and most are turned
 * down. The reference is replayed once with its simulator state kept before
 * RKM__CHECKPOINTS evenly spaced steps; a candidate replays from the last
 * of them at or before its first step that differs, and stops where its
 * peak or excess so far already turns it down. The figures of a replay
 * that runs to the end are those of one from the start, bit for bit: the
 * prefix's peak, excess and first step over the budget are the
 * reference's, the excess is summed in step order and the time is the
 * simulator's clock. The work counted stays that of a whole replay, so no
 * plan depends on this. */
typedef struct rkm__replay {
    rkm__steps ref;                    /* the reference's steps */
    rkm__sim cp[RKM__CHECKPOINTS];     /* the state before step at[k] */
    size_t at[RKM__CHECKPOINTS];
    uint64_t peak[RKM__CHECKPOINTS];   /* the steps before it: their peak, */
    double excess[RKM__CHECKPOINTS];   /* excess over the budget, */
    int64_t first[RKM__CHECKPOINTS];   /* first step over it (-1: none) */
    int n;                             /* checkpoints kept (0: no reference) */
    uint64_t budget;
} rkm__replay;

/* A replay's figures: peak, time, excess over the budget (each step's peak
 * above it, summed in step order) and the first step over it (-1: none). */
typedef struct rkm__figures {
    uint64_t peak;
    double time, excess;
    int64_t first;
} rkm__figures;

static void rkm__replay_free(rkm__replay *rp)
{
    for (int k = 0; k < RKM__CHECKPOINTS; k++) rkm__sim_free(&rp->cp[k]);
    rkm__steps_free(&rp->ref);
}

/* Steps [from, to) on s, folded into f: 1 when all hold, 0 when one does
 * not or the peak or excess goes over max_peak / max_excess. */
static int rkm__replay_steps(rkm__sim *s, const rkm_step *steps, size_t from, size_t to, uint64_t budget,
                             uint64_t max_peak, double max_excess, rkm__figures *f)
{
    for (size_t i = from; i < to; i++) {
        uint64_t pk;
        int32_t obj;
        if (rkm__sim_step(s, &steps[i], &pk, &obj) != RKM_RULE_NONE) return 0;
        if (pk > f->peak) f->peak = pk;
        if (pk > budget) {
            f->excess += (double)(pk - budget);
            if (f->first < 0) f->first = (int64_t)i;
        }
        if (f->peak > max_peak || f->excess > max_excess) return 0;
    }
    f->time = s->clock;
    return 1;
}

/* s in the state of rp's last checkpoint at or before step `at` (the
 * start's where there is none): its index, or -1. */
static int rkm__replay_resume(const rkm__replay *rp, rkm__sim *s, size_t at)
{
    int k = rp->n - 1;
    while (k >= 0 && rp->at[k] > at) k--;
    if (k >= 0) rkm__sim_copy(s, &rp->cp[k]);
    else rkm__sim_reset(s);
    return k;
}

/* Replay steps[0..n) on s (resumed from rp's checkpoint where it shares
 * rp's steps up to it and budget is rp's; checkpoint 0 is the start's):
 * 1 when every step holds within max_peak and max_excess (then *f; s is at
 * the plan's end), else 0. */
static int rkm__replay_run(const rkm__replay *rp, rkm__sim *s, const rkm_step *steps, size_t n, uint64_t budget,
                           uint64_t max_peak, double max_excess, rkm__figures *f)
{
    size_t same = 0, lim = n < rp->ref.n ? n : rp->ref.n;
    while (same < lim && !memcmp(&steps[same], &rp->ref.s[same], sizeof *steps)) same++;
    int k = rkm__replay_resume(rp, s, rp->budget == budget ? same : 0);
    *f = k >= 0 ? (rkm__figures){rp->peak[k], 0, rp->excess[k], rp->first[k]} : (rkm__figures){s->mem, 0, 0, -1};
    return rkm__replay_steps(s, steps, k >= 0 ? rp->at[k] : 0, n, budget, max_peak, max_excess, f);
}

/* s in the state of rp's reference before its step `at`. */
static void rkm__replay_to(const rkm__replay *rp, rkm__sim *s, size_t at)
{
    int k = rkm__replay_resume(rp, s, at);
    size_t from = k >= 0 ? rp->at[k] : 0;
    rkm_sim_result res;
    (void)rkm__sim_run(s, rp->ref.s + from, at - from, &res, NULL); /* a prefix of a valid plan */
}

/* steps[0..n) (valid) as rp's reference at `budget`, replayed on s: 1,
 * or 0 on NOMEM (then rp has none). */
static int rkm__replay_set(rkm__replay *rp, rkm__sim *s, const rkm_step *steps, size_t n, uint64_t budget)
{
    rp->n = 0;
    rp->budget = budget;
    if (!rkm__reserve(rp->ref.ctx, (void **)&rp->ref.s, &rp->ref.cap, n + 1, sizeof *steps)) return 0;
    if (n) memcpy(rp->ref.s, steps, n * sizeof *steps);
    rp->ref.n = n;
    rkm__sim_reset(s);
    rkm__figures f = {s->mem, 0, 0, -1};
    for (int k = 0; k < RKM__CHECKPOINTS; k++) {
        size_t from = k ? rp->at[k - 1] : 0, at = n * (size_t)k / RKM__CHECKPOINTS;
        if (!rkm__replay_steps(s, steps, from, at, budget, UINT64_MAX, INFINITY, &f)) return 1; /* none more */
        if (!rp->cp[k].g && rkm__sim_init(s->g, &rp->cp[k])) return 0;
        rkm__sim_copy(&rp->cp[k], s);
        rp->at[k] = at, rp->peak[k] = f.peak, rp->excess[k] = f.excess, rp->first[k] = f.first;
        rp->n = k + 1;
    }
    return 1;
}

/* ---- polish: local search on a plan's compute steps ----------------------
 *
 * Any valid plan is its compute steps (fwd, loss, bwd) plus frees. The
 * frees that follow from the compute steps alone are the earliest ones:
 * a tensor goes right after its last read before it is made again (or for
 * good), a saved state right after its backward, a gradient right after
 * the backward of its tensor's producer. No step's peak grows (a tensor
 * recomputed in place counts the same as one freed and made again), a
 * save whose state no backward reads is dropped, and a forward none of
 * whose outputs is read before it is made again is dead and goes. The
 * search drops one recomputing forward at a time (its outputs then live on
 * from the op's previous forward, which takes over its save) and keeps the
 * change when the rule accepts it (valid within the target, and faster),
 * until a sweep keeps none or the solve's work is spent. With
 * a copy link the same search makes the offload moves: each candidate gets
 * the offload pass's copies before the simulator judges it, so a dropped
 * recomputation may leave a tensor live across the peak, in host memory
 * there (rkm__offload_moves). */

/* A recomputing forward polish may drop: at step j of its best plan. */
typedef struct rkm__move {
    double fwd; /* the time dropping it saves */
    size_t j;
} rkm__move;

typedef struct rkm__polish {
    const rkm_graph *g;
    rkm_planner *pl;  /* its deadline stops the search (rkm__over) */
    rkm__sim sim;
    rkm__steps cur;   /* the compute steps of the best plan so far */
    rkm__steps cand;  /* a candidate's compute steps */
    rkm__steps full;  /* a candidate's whole plan */
    rkm__steps frees; /* scratch: frees after each compute step, backwards */
    rkm__steps low;   /* scratch: w->full run in place where it can */
    size_t *fr_at;    /* per candidate step: its first free in frees */
    size_t cap_at;
    uint8_t *need;    /* per tensor: read before it is made again */
    uint8_t *pneed;   /* per op: its backward comes before its next save */
    rkm__replay rp;   /* the replay of the best plan so far (the squeeze's: its whole plan) */
    uint64_t budget;  /* the target: candidates are judged at it */
    uint64_t work;
    uint64_t limit;   /* the work it may do (the solve's, rkm__search_begin) */
    rkm__figures fig; /* w->cur's figures at the target (polish: excess 0) */
    int lower;        /* the judge lowers candidates in place (polish; the squeeze's positions are w->full's) */
    int copies;       /* the judge adds the offload pass's copies (rkm__offload_moves) */
    int arena;        /* a stage's: candidates kept only where their arena fits (rkm__stage_fits) */
    rkm__move *order; /* the offload moves of a sweep, in the order it tries them */
    size_t *renum;    /* scratch: per step of w->cand, its step in w->cur after a move (rkm__moves_renumber) */
    size_t cap_order, cap_renum;
} rkm__polish;

static int rkm__is_compute(const rkm_step *s) { return s->kind == RKM_STEP_FWD || s->kind == RKM_STEP_LOSS || s->kind == RKM_STEP_BWD; }

/* Note `free t` after the step being scanned when nothing later reads t
 * (inputs are never freed). */
static int rkm__polish_free_unread(rkm__polish *w, int32_t t)
{
    if (w->need[t] || (w->g->tensors[t].flags & RKM_TENSOR_INPUT)) return 1;
    return rkm__steps_push(&w->frees, RKM_STEP_FREE, t, 0);
}

/* The frees after compute step s (scanning backwards, need says what later
 * steps read), then s's own reads; 0 on NOMEM, *dead for a dead forward. */
static int rkm__polish_scan(rkm__polish *w, rkm_step *s, int *dead)
{
    const rkm_graph *g = w->g;
    int ok = 1;
    *dead = 0;
    if (s->kind == RKM_STEP_LOSS) {
        ok = rkm__polish_free_unread(w, s->index);
        w->need[s->index] = 1;
        return ok;
    }
    const rkm__op *o = &g->ops[s->index];
    if (s->kind == RKM_STEP_BWD) {
        if (o->phantom > 0) ok = rkm__steps_push(&w->frees, RKM_STEP_FREE_SAVED, s->index, 0);
        for (int32_t k = 0; k < o->n_out && ok; k++)
            if (g->tensors[o->out[k]].has_grad) ok = rkm__steps_push(&w->frees, RKM_STEP_FREE_GRAD, o->out[k], 0);
        for (int32_t k = 0; k < o->n_saved && ok; k++) ok = rkm__polish_free_unread(w, o->saved[k]);
        for (int32_t k = 0; k < o->n_saved; k++) w->need[o->saved[k]] = 1;
        w->pneed[s->index] = 1;
        return ok;
    }
    s->save = s->save && w->pneed[s->index];
    if (s->save) w->pneed[s->index] = 0;
    int used = s->save;
    for (int32_t k = 0; k < o->n_out; k++) used |= w->need[o->out[k]];
    if (!used) {
        *dead = 1;
        return 1;
    }
    for (int32_t k = 0; k < o->n_in + o->n_out && ok; k++) ok = rkm__polish_free_unread(w, o->in[k]);
    for (int32_t k = 0; k < o->n_out; k++) w->need[o->out[k]] = 0;
    for (int32_t k = 0; k < o->n_in; k++) w->need[o->in[k]] = 1;
    return ok;
}

/* w->full: the candidate's compute steps (dead forwards left out) with the
 * earliest frees. 0 on NOMEM. */
static int rkm__polish_expand(rkm__polish *w)
{
    size_t n = w->cand.n;
    if (!rkm__reserve(w->g->ctx, (void **)&w->fr_at, &w->cap_at, n + 1, sizeof *w->fr_at)) return 0;
    memset(w->need, 0, w->g->n_tensors);
    memset(w->pneed, 0, w->g->n_ops);
    w->frees.n = w->full.n = 0;
    for (size_t i = n; i-- > 0;) {
        int dead;
        w->fr_at[i + 1] = w->frees.n;
        if (!rkm__polish_scan(w, &w->cand.s[i], &dead)) return 0;
        if (dead) w->cand.s[i].kind = -1; /* left out below */
    }
    w->fr_at[0] = w->frees.n;
    if (!rkm__reserve(w->g->ctx, (void **)&w->full.s, &w->full.cap, n + w->frees.n + 1, sizeof *w->full.s)) return 0;
    rkm_step *out = w->full.s;
    for (size_t i = 0; i < n; i++) {
        const rkm_step *s = &w->cand.s[i];
        if (s->kind < 0) continue;
        *out++ = (rkm_step){.kind = s->kind, .index = s->index, .save = s->save};
        /* the frees of step i are frees[fr_at[i+1] .. fr_at[i]), in scan order */
        size_t nf = w->fr_at[i] - w->fr_at[i + 1];
        if (nf) memcpy(out, &w->frees.s[w->fr_at[i + 1]], nf * sizeof *out);
        out += nf;
    }
    w->full.n = (size_t)(out - w->full.s);
    return 1;
}

/* ---- the judge and the one acceptance rule ------------------------------
 *
 * Every candidate of the search is judged the same way: its canonical
 * form (w->full) replayed at the target, w->budget, and its figures
 * compared with the current plan's by one rule: it is over the target by
 * less (excess: the bytes over it summed over the steps), or by as much
 * and is faster. Under the target both have excess 0, so the rule is
 * "valid and faster"; over it, less excess first. */
static int rkm__accept(const rkm__figures *cand, const rkm__figures *cur)
{
    return cand->excess < cur->excess || (cand->excess == cur->excess && cand->time < cur->time);
}

/* Replay w->full at w->budget, stopping once its excess passes
 * max_excess: run in place where it can with w->lower (in w->low: the
 * squeeze reads w->full's own steps); with w->copies, with the offload
 * pass's copies for the budget, hidden ones or else ones the compute
 * stream waits for (none: it does not fit). 1 when valid within
 * max_excess (then *f), 0 when not, -1 on NOMEM. */
static int rkm__judge(rkm__polish *w, double max_excess, rkm__figures *f)
{
    int32_t obj;
    const rkm__steps *run = &w->full;
    rkm__steps d = {w->g->ctx, NULL, 0, 0};
    if (w->lower && w->g->has_inplace) {
        if (!rkm__reserve(w->g->ctx, (void **)&w->low.s, &w->low.cap, w->full.n + 1, sizeof *w->low.s)) return -1;
        if (w->full.n) memcpy(w->low.s, w->full.s, w->full.n * sizeof *w->low.s);
        w->low.n = w->full.n;
        if (rkm__lower_inplace(w->g, &w->low)) return -1;
        run = &w->low;
    }
    if (w->copies) {
        if (rkm__offload_plan(w->g, run->s, run->n, w->budget, 1, NULL, &d, &w->work)) return -1;
        if (!d.n) return 0;
        run = &d;
    }
    w->work += run->n;
    int ok = rkm__replay_run(&w->rp, &w->sim, run->s, run->n, w->budget, UINT64_MAX, max_excess, f) &&
             rkm__sim_end(&w->sim, &obj) == RKM_RULE_NONE;
    rkm__steps_free(&d);
    return ok;
}

/* A pipeline stage's candidate, w->full, that the rule accepts within the
 * target: does its arena as the host gets it (a slot per micro-batch in
 * flight and the transients around them) fit the stage's budget too? The
 * replay's peak is the stage's, a lower bound of that arena, and where the
 * layout lies above it a faster plan over the budget would hide a slower
 * one within it (a 5-op chain at 3 in flight, tests/test_pipe.c). 1 yes,
 * 0 no, -1 on NOMEM. */
static int rkm__stage_fits(rkm__polish *w)
{
    rkm_planner *pl = w->pl;
    rkm__steps d;
    rkm_plan *p = NULL;
    uint64_t arena = UINT64_MAX;
    rkm_result r = rkm__steps_copy(pl->ctx, w->full.s, w->full.n, &d, "plan polish");
    if (!r) r = rkm__draft_birth(pl, pl->g, &d, &p);
    if (!r) r = rkm__stage_arena(pl, p, &arena);
    rkm_plan_destroy(p);
    w->work += w->full.n;
    return r == RKM_ERROR_NOMEM ? -1 : !r && arena <= pl->stage_cap;
}

/* What the arena of a plan searched for `target` must fit: the target, or
 * in a pipeline stage's fit the stage's budget (the fit may search at
 * targets below it: rkm__fit_less). */
static uint64_t rkm__arena_cap(const rkm_planner *pl, uint64_t target) { return pl->stage_cap ? pl->stage_cap : target; }

/* Keep the candidate (its live compute steps) when the rule accepts it. */
static int rkm__polish_try(rkm__polish *w, int *kept)
{
    rkm__figures f;
    *kept = 0;
    if (!rkm__polish_expand(w)) return 0;
    int ok = rkm__judge(w, w->fig.excess, &f);
    if (ok < 0) return 0;
    if (!ok || !rkm__accept(&f, &w->fig)) return 1;
    if (w->arena && f.excess == 0 && (ok = rkm__stage_fits(w)) <= 0) return ok == 0;
    w->fig = f;
    w->cur.n = 0;
    for (size_t i = 0; i < w->cand.n; i++)
        if (w->cand.s[i].kind >= 0 && !rkm__steps_push(&w->cur, w->cand.s[i].kind, w->cand.s[i].index, w->cand.s[i].save))
            return 0;
    *kept = 1;
    if (w->copies) return 1; /* no reference to resume from: copies change the whole plan */
    const rkm__steps *run = w->lower && w->g->has_inplace ? &w->low : &w->full; /* what the judge replayed */
    return rkm__replay_set(&w->rp, &w->sim, run->s, run->n, w->budget);
}

/* The candidate without recomputing forward j (-1 when step j is not one):
 * index of the op's previous forward, which takes over j's save. */
static int64_t rkm__polish_drop(rkm__polish *w, size_t j)
{
    const rkm_step *c = w->cur.s;
    if (c[j].kind != RKM_STEP_FWD) return -1;
    size_t h = j;
    while (h-- > 0)
        if (c[h].kind == RKM_STEP_FWD && c[h].index == c[j].index) break;
    w->work += j - (h + 1); /* the search back counts as work too */
    if (h == (size_t)-1 || (c[j].save && c[h].save)) return -1;
    w->cand.n = 0;
    for (size_t i = 0; i < w->cur.n; i++)
        if (i != j && !rkm__steps_push(&w->cand, c[i].kind, c[i].index, c[i].save)) return -2;
    if (c[j].save) w->cand.s[h].save = 1;
    return (int64_t)h;
}

static void rkm__polish_free(rkm__polish *w)
{
    rkm__sim_free(&w->sim);
    rkm__steps_free(&w->cur);
    rkm__steps_free(&w->cand);
    rkm__steps_free(&w->full);
    rkm__steps_free(&w->frees);
    rkm__steps_free(&w->low);
    rkm__free(w->g->ctx, w->fr_at, w->cap_at * sizeof *w->fr_at);
    rkm__free(w->g->ctx, w->order, w->cap_order * sizeof *w->order);
    rkm__free(w->g->ctx, w->renum, w->cap_renum * sizeof *w->renum);
    rkm__free(w->g->ctx, w->need, w->g->n_tensors);
    rkm__free(w->g->ctx, w->pneed, w->g->n_ops);
    rkm__replay_free(&w->rp);
}

/* Whether polish, or the squeeze on it, may go on: work left within its
 * limit and the deadline not passed. */
static int rkm__polish_more(rkm__polish *w) { return w->work < w->limit && !rkm__over(w->pl); }

/* Try dropping the recomputing forward at step j (a no-op where step j
 * is not one): 1, *got when kept; 0 on NOMEM. */
static int rkm__polish_move(rkm__polish *w, size_t j, int *got)
{
    *got = 0;
    int64_t h = rkm__polish_drop(w, j);
    return h != -2 && (h < 0 || rkm__polish_try(w, got));
}

/* Drop recomputations while one fits, sweeping the steps in order until a
 * sweep keeps none, the work runs out or the deadline passes. 0 on NOMEM. */
static int rkm__polish_search(rkm__polish *w)
{
    int kept = 1;
    while (kept && rkm__polish_more(w)) {
        kept = 0;
        for (size_t j = 0; j < w->cur.n && rkm__polish_more(w); j++) {
            int got;
            if (!rkm__polish_move(w, j, &got)) return 0;
            if (got) kept = 1, j--; /* step j is another one now */
        }
    }
    return 1;
}

/* Costliest first, then in step order. */
static int rkm__move_cmp(const void *x, const void *y)
{
    const rkm__move *a = x, *b = y;
    if (a->fwd != b->fwd) return a->fwd < b->fwd ? 1 : -1;
    return (a->j > b->j) - (a->j < b->j);
}

/* After a kept drop of step j: the moves still to try, order[from..*n),
 * renumbered to their steps in the new w->cur, where polish_try left out
 * step j and the forwards that became dead (marked in w->cand, which is
 * w->cur before the move without step j); those left out go. 0 on NOMEM. */
static int rkm__moves_renumber(rkm__polish *w, size_t j, size_t from, size_t *n)
{
    if (!rkm__reserve(w->g->ctx, (void **)&w->renum, &w->cap_renum, w->cand.n + 1, sizeof *w->renum)) return 0;
    size_t live = 0, out = from;
    for (size_t c = 0; c < w->cand.n; c++) w->renum[c] = w->cand.s[c].kind >= 0 ? live++ : SIZE_MAX;
    for (size_t m = from; m < *n; m++) {
        size_t c = w->order[m].j - (w->order[m].j > j);
        if (w->renum[c] != SIZE_MAX) w->order[out++] = (rkm__move){w->order[m].fwd, w->renum[c]};
    }
    *n = out;
    return 1;
}

/* polish_search for the offload moves: each sweep tries every
 * recomputing forward once, the costliest first (a move saves its op's
 * forward; with the moves' small share of work, trying the large savings
 * first found 1.7 points more on gpt2-xl-b4-t1024 at 10 % with 25 GB/s
 * and 2.3 on unet-d6 at 50 %, 0.1 less on a few rows), until a sweep
 * keeps none, the work runs out or the deadline passes. 0 on NOMEM. */
static int rkm__polish_costly(rkm__polish *w)
{
    int kept = 1;
    while (kept && rkm__polish_more(w)) {
        kept = 0;
        size_t n = 0;
        if (!rkm__reserve(w->g->ctx, (void **)&w->order, &w->cap_order, w->cur.n + 1, sizeof *w->order)) return 0;
        for (size_t j = 0; j < w->cur.n; j++)
            if (w->cur.s[j].kind == RKM_STEP_FWD) w->order[n++] = (rkm__move){w->g->ops[w->cur.s[j].index].fwd, j};
        qsort(w->order, n, sizeof *w->order, rkm__move_cmp);
        for (size_t k = 0; k < n && rkm__polish_more(w); k++) {
            int got;
            if (!rkm__polish_move(w, w->order[k].j, &got)) return 0;
            if (got && !rkm__moves_renumber(w, w->order[k].j, k + 1, &n)) return 0;
            kept |= got;
        }
    }
    return 1;
}

/* A polish of the plan of g whose steps are steps[0..n) (its compute
 * steps are what it keeps); pl (NULL when only expanded) gives the
 * deadline. */
static rkm_result rkm__polish_init(rkm__polish *w, rkm_planner *pl, const rkm_graph *g, const rkm_step *steps, size_t n,
                                   uint64_t budget)
{
    memset(w, 0, sizeof *w);
    w->g = g;
    w->pl = pl;
    w->budget = budget;
    w->limit = UINT64_MAX;
    w->fig = (rkm__figures){0, INFINITY, 0, -1}; /* the first candidate, p's own compute steps, only has to fit */
    w->lower = 1;
    w->cur.ctx = w->cand.ctx = w->full.ctx = w->frees.ctx = w->low.ctx = w->rp.ref.ctx = g->ctx;
    w->need = rkm__alloc(g->ctx, g->n_tensors);
    w->pneed = rkm__alloc(g->ctx, g->n_ops);
    if (!w->need || !w->pneed || rkm__sim_init(g, &w->sim)) return rkm__nomem(g->ctx, "plan polish");
    w->sim.hold = pl ? pl->d.in_flight - 1 : 0; /* a stage's: judged with the others in flight */
    for (size_t i = 0; i < n; i++) {
        const rkm_step *s = &steps[i];
        if (rkm__is_compute(s) && !rkm__steps_push(&w->cand, s->kind, s->index, s->save))
            return rkm__nomem(g->ctx, "plan polish");
    }
    return RKM_OK;
}

/* The draft of g whose compute steps are those of steps[0..n), with the
 * earliest frees (polish's canonical form, dead forwards left out): for
 * plans made from compute steps alone (nest.c's drop options). */
RKM__PRIVATE rkm_result rkm__canonical_draft(const rkm_graph *g, const rkm_step *steps, size_t n, rkm__steps *out)
{
    rkm__polish w;
    rkm_result r = rkm__polish_init(&w, NULL, g, steps, n, UINT64_MAX);
    if (!r && !rkm__polish_expand(&w)) r = rkm__nomem(g->ctx, "plan polish");
    if (!r) {
        *out = w.full;
        w.full = (rkm__steps){g->ctx, NULL, 0, 0};
    }
    rkm__polish_free(&w);
    return r;
}

/* Polish the plan p of pl's graph at `budget` within `limit` work: 1 when
 * it found a plan faster than p (w->time), whose compute steps, with the
 * earliest frees, are then in w->full; 0 when not; -1 on NOMEM. The work
 * is spent from the solve's meter; the caller frees w. */
static int rkm__polish_run(rkm__polish *w, rkm_planner *pl, const rkm_plan *p, uint64_t budget, uint64_t limit,
                           int copies, int arena)
{
    int kept = 0;
    rkm_result r = rkm__polish_init(w, pl, pl->g, p->steps, p->n_steps, budget);
    w->limit = limit;
    w->copies = copies;
    w->arena = arena;
    int ok = !r && rkm__polish_try(w, &kept) && (!kept || (copies ? rkm__polish_costly(w) : rkm__polish_search(w)));
    rkm__spend(pl, w->work);
    if (!ok) return -1;
    if (!kept || !(w->fig.time < p->stats.time)) return 0;
    rkm__steps_free(&w->cand);
    w->cand = w->cur; /* expand the best */
    w->cur = (rkm__steps){pl->ctx, NULL, 0, 0};
    return rkm__polish_expand(w) ? 1 : -1;
}

/* *p replaced by a faster plan within the budget when the search finds one
 * (with `arena`, one whose stage arena fits: rkm__stage_fits). */
static rkm_result rkm__polish_at(rkm_planner *pl, uint64_t budget, int arena, rkm_plan **p)
{
    rkm__polish w;
    rkm_plan *np = NULL;
    int found = rkm__polish_run(&w, pl, *p, budget, rkm__share(pl, UINT64_MAX), 0, arena);
    rkm_result r = found < 0 ? rkm__nomem(pl->ctx, "plan polish") : RKM_OK;
    if (found > 0 && !(r = rkm__planned_birth(pl, &w.full, &np))) {
        rkm_plan_destroy(*p);
        *p = np;
    }
    rkm__polish_free(&w);
    return r;
}

/* *p polished at `budget`. In a stage's fit, then on at the stage's budget
 * keeping only candidates whose arena fits it: from that plan where its
 * arena fits, else from *p, the one whose arena fits before the faster
 * (rkm__prefer). The first polish may pass through plans whose arena is
 * over, and end over it (a 5-op chain's ILP start, tests/test_pipe.c); the
 * second reaches plans whose peak is over the target though their arena
 * fits (the same chain; peer-gpt's stages at 25 %, P = 2: 2.6 % faster
 * than polishing at the stage's budget alone). */
static rkm_result rkm__polish_plan(rkm_planner *pl, uint64_t budget, rkm_plan **p)
{
    if (!pl->stage_cap) return rkm__polish_at(pl, budget, 0, p);
    rkm_plan *q = NULL;
    uint64_t a = UINT64_MAX;
    rkm_result r = rkm__plan_copy(*p, &q);
    if (!r) r = rkm__polish_at(pl, budget, 0, &q);
    if (!r) r = rkm__stage_arena(pl, q, &a);
    if (!r && a <= pl->stage_cap) { /* on from the polished plan */
        rkm_plan_destroy(*p);
        *p = q;
        q = NULL;
    }
    if (!r && !rkm__over(pl)) r = rkm__polish_at(pl, pl->stage_cap, 1, p);
    if (!r) return rkm__prefer(pl, p, q, NULL);
    rkm_plan_destroy(q);
    return r;
}

/* Offload moves: polish with the offload pass as its judge. A move drops a
 * recomputation from the compute steps of *p (a plan with copies, made by
 * any of rockmate's ways) and the pass's copies of the result must bring
 * it within the budget; it is kept when the plan with those copies is
 * faster. So a tensor the plan rebuilt is kept and waits in host memory
 * instead, where its copies cost less (gpt2-124M-b4-t64 at 50 % with 450 GB/s:
 * DTR's plan with copies at 12.65 % overhead, 2.70 % after the moves). The
 * result, laid out, replaces *p where it is faster and its arena fits. */
RKM__PRIVATE rkm_result rkm__offload_moves(rkm_planner *pl, uint64_t budget, uint64_t limit, rkm_plan **p)
{
    rkm__polish w;
    rkm_plan *b = NULL, *q = NULL;
    int found = rkm__polish_run(&w, pl, *p, budget, limit, 1, 0);
    rkm_result r = found < 0 ? rkm__nomem(pl->ctx, "offload moves") : RKM_OK;
    if (found > 0 && !(r = rkm__planned_birth(pl, &w.full, &b))) r = rkm__offload_fit(pl, b, budget, 1, NULL, &q);
    rkm_plan_destroy(b);
    if (q && q->stats.time < (*p)->stats.time) {
        rkm_plan_destroy(*p);
        *p = q;
    } else
        rkm_plan_destroy(q);
    rkm__polish_free(&w);
    return r;
}

/* ---- squeeze: a plan over the budget brought within it -------------------
 *
 * A plan made for more memory than the budget is often much faster than
 * any the chain DP makes within it: the DP keeps a block's input live
 * through the block's whole backward and its checkpoints from their forward
 * on, where the best plans free such tensors and rebuild them partway. The
 * squeeze takes a plan that peaks above the budget and, while it does,
 * applies one move at the first step over it, on a tensor or saved state
 * that is live there but not used by the step:
 *   - a tensor is recomputed before its next reader (or right after the
 *     step): forwards of its producer and, back from it, of the producers
 *     of what is not live there (at most RKM__SQUEEZE_CHAIN ops);
 *   - an op's saved state is made by a forward just before its backward
 *     (with the same chain for the op's inputs) instead of where it was.
 * polish's expansion adds the earliest frees, which drop the tensor or state
 * in between. Of the moves the rule accepts, each round takes the one with
 * the least time added per byte of excess removed (one that removes none
 * but is faster first); the search stops when the plan fits, when the rule
 * accepts no move, or when the work (replayed steps, not seconds) runs
 * out. The descent polishes what fits. */

typedef struct rkm__squeeze {
    rkm__polish w;
    uint8_t *live;  /* per tensor: live before the first step over the budget */
    uint8_t *livep; /* per op: saved state live there */
    uint8_t *vlive; /* per tensor: live before the step a move inserts at */
    uint8_t *mark;  /* per op: in the recompute being built */
    size_t *pos;    /* per step of w.cur: its index in w.rp.ref, w.cur's whole plan */
    size_t cap_pos;
    uint64_t look_limit; /* the work up to which rounds look ahead (w.limit: all it may do) */
    int n_top;           /* the moves of a round with the best scores, best first */
    double top_score[RKM__SQUEEZE_LOOK];
    int32_t top_obj[RKM__SQUEEZE_LOOK];
    int top_early[RKM__SQUEEZE_LOOK];
} rkm__squeeze;

/* A move's score: time added per byte of excess removed (the least is
 * the best), for a candidate the rule accepts (-INFINITY where it removes
 * none but is faster); INFINITY for one it turns down. */
static double rkm__squeeze_score(int ok, const rkm__figures *f, const rkm__figures *cur)
{
    if (ok <= 0 || !rkm__accept(f, cur)) return INFINITY;
    return f->excess < cur->excess ? (f->time - cur->time) / (cur->excess - f->excess) : -INFINITY;
}

/* Does compute step s read or make tensor t? */
static int rkm__step_touches(const rkm_graph *g, const rkm_step *s, int32_t t)
{
    int32_t n;
    const int32_t *v = rkm__step_objects(g, s, 0, &n);
    for (int32_t k = 0; k < n; k++)
        if (v[k] == t) return 1;
    return 0;
}

/* Does compute step s read tensor t? */
static int rkm__step_reads(const rkm_graph *g, const rkm_step *s, int32_t t)
{
    if (s->kind != RKM_STEP_FWD) return rkm__step_touches(g, s, t);
    const rkm__op *o = &g->ops[s->index];
    for (int32_t k = 0; k < o->n_in; k++)
        if (o->in[k] == t) return 1;
    return 0;
}

/* Mark op x and, back from it, the producers of what it reads that is
 * neither live (`live`) nor an input. The count of marked ops. */
static size_t rkm__squeeze_mark(rkm__squeeze *q, int32_t x, const uint8_t *live)
{
    const rkm_graph *g = q->w.g;
    size_t n = 0;
    memset(q->mark, 0, g->n_ops);
    q->mark[x] = 1;
    for (int32_t o = x; o >= 0; o--) { /* producers come first in graph order */
        if (!q->mark[o]) continue;
        n++;
        for (int32_t k = 0; k < g->ops[o].n_in; k++) {
            int32_t t = g->ops[o].in[k];
            if (!(g->tensors[t].flags & RKM_TENSOR_INPUT) && !live[t]) q->mark[g->tensors[t].producer] = 1;
        }
    }
    return n;
}

/* w.cand: w.cur with forwards of the marked ops (in graph order, which is
 * topological) before compute step v, op `saver`'s with save (-1: none),
 * and without the save of step h (SIZE_MAX: none). 0 on NOMEM. */
static int rkm__squeeze_insert(rkm__squeeze *q, size_t v, int32_t saver, size_t h)
{
    rkm__polish *w = &q->w;
    w->cand.n = 0;
    for (size_t i = 0; i < w->cur.n; i++) {
        if (i == v)
            for (int32_t o = 0; o < (int32_t)w->g->n_ops; o++)
                if (q->mark[o] && !rkm__steps_push(&w->cand, RKM_STEP_FWD, o, o == saver)) return 0;
        const rkm_step *s = &w->cur.s[i];
        if (!rkm__steps_push(&w->cand, s->kind, s->index, s->save && i != h)) return 0;
    }
    return 1;
}

/* w.cur: the compute steps of w.full (dead forwards are gone from it), and
 * where each is in it; w.rp: w.full's replay, the reference of the moves
 * to come. 0 on NOMEM. */
static int rkm__squeeze_take(rkm__squeeze *q)
{
    rkm__polish *w = &q->w;
    w->cur.n = 0;
    for (size_t i = 0; i < w->full.n; i++) {
        const rkm_step *s = &w->full.s[i];
        if (!rkm__is_compute(s)) continue;
        if (!rkm__reserve(w->g->ctx, (void **)&q->pos, &q->cap_pos, w->cur.n + 1, sizeof *q->pos)) return 0;
        q->pos[w->cur.n] = i;
        if (!rkm__steps_push(&w->cur, s->kind, s->index, s->save)) return 0;
    }
    return rkm__replay_set(&w->rp, &w->sim, w->full.s, w->full.n, w->budget);
}

/* `live`: the tensors live before w.cur's whole plan's step `at`; `livep` (when not
 * NULL) the ops whose saved state is. */
static void rkm__squeeze_live_at(rkm__squeeze *q, size_t at, uint8_t *live, uint8_t *livep)
{
    rkm__polish *w = &q->w;
    w->work += at;
    rkm__replay_to(&w->rp, &w->sim, at);
    memcpy(live, w->sim.D, w->g->n_tensors);
    if (livep) memcpy(livep, w->sim.P, w->g->n_ops);
}

/* The next compute step after c that reads t, or w.cur.n. */
static size_t rkm__squeeze_next(rkm__squeeze *q, size_t c, int32_t t)
{
    size_t v = c + 1;
    while (v < q->w.cur.n && !rkm__step_reads(q->w.g, &q->w.cur.s[v], t)) v++;
    q->w.work += v - c;
    return v;
}

/* Build move `obj` at compute step c into w.cand: for a tensor t (obj <
 * n_tensors), recompute it before its next reader; for op o's saved state
 * (obj = n_tensors + o), save it again just before o's backward instead
 * of where it was saved. 0 when there is no such move, -1 on NOMEM. */
static int rkm__squeeze_move(rkm__squeeze *q, size_t c, int32_t obj, int early)
{
    const rkm_graph *g = q->w.g;
    const rkm_step *cur = q->w.cur.s;
    int32_t nt = (int32_t)g->n_tensors, x = obj < nt ? g->tensors[obj].producer : obj - nt;
    size_t v = c + 1, h = SIZE_MAX;
    if (obj < nt) {
        v = rkm__squeeze_next(q, c, obj);
    } else {
        while (v < q->w.cur.n && !(cur[v].kind == RKM_STEP_BWD && cur[v].index == x)) v++;
        for (h = c; h != SIZE_MAX && !(cur[h].kind == RKM_STEP_FWD && cur[h].index == x && cur[h].save); h--) {}
        q->w.work += v - c + (h == SIZE_MAX ? c : c - h);
        if (h == SIZE_MAX) return 0;
    }
    if (v == q->w.cur.n || (early && v == c + 1)) return 0;
    if (early) v = c + 1;
    rkm__squeeze_live_at(q, q->pos[v], q->vlive, NULL);
    if (obj < nt) q->vlive[obj] = 0; /* freed in between */
    if (rkm__squeeze_mark(q, x, q->vlive) > RKM__SQUEEZE_CHAIN) return 0;
    return rkm__squeeze_insert(q, v, obj < nt ? -1 : x, h) && rkm__polish_expand(&q->w) ? 1 : -1;
}

/* Keep move (obj, early) among the round's RKM__SQUEEZE_LOOK best scores
 * (on a tie, the one found first stays ahead). */
static void rkm__squeeze_top(rkm__squeeze *q, double score, int32_t obj, int early)
{
    int n = q->n_top, i = n;
    while (i > 0 && q->top_score[i - 1] > score) i--;
    if (i >= RKM__SQUEEZE_LOOK) return;
    if (n == RKM__SQUEEZE_LOOK) n--; /* the last one falls out */
    for (int k = n; k > i; k--) {
        q->top_score[k] = q->top_score[k - 1];
        q->top_obj[k] = q->top_obj[k - 1];
        q->top_early[k] = q->top_early[k - 1];
    }
    q->top_score[i] = score, q->top_obj[i] = obj, q->top_early[i] = early;
    q->n_top = n + 1;
}

static int rkm__squeeze_apply(rkm__squeeze *q, int64_t *first, int32_t t, int early);

/* Drop recomputing forwards of w.cur while the rule accepts one (polish's
 * move, over the target). 0 on NOMEM. */
static int rkm__squeeze_prune(rkm__squeeze *q, int64_t *first)
{
    rkm__polish *w = &q->w;
    for (size_t j = 0; j < w->cur.n && rkm__polish_more(&q->w); j++) {
        rkm__figures f;
        int64_t h = rkm__polish_drop(w, j);
        if (h == -2 || (h >= 0 && !rkm__polish_expand(w))) return 0;
        int ok = h >= 0 ? rkm__judge(w, w->fig.excess, &f) : 0;
        if (ok < 0) return 0;
        if (!ok || !rkm__accept(&f, &w->fig)) continue;
        w->fig = f, *first = f.first;
        if (!rkm__squeeze_take(q)) return 0;
        j--; /* step j is another one now */
    }
    return 1;
}

/* Move (obj, early) applied and pruned: its figures *f; then w.cur back as
 * it was (kept in *save). 0 on NOMEM. */
static int rkm__squeeze_look(rkm__squeeze *q, int64_t first, int32_t obj, int early, rkm__steps *save,
                             rkm__figures *f)
{
    rkm__polish *w = &q->w;
    rkm__figures was = w->fig;
    save->n = 0;
    for (size_t i = 0; i < w->cur.n; i++)
        if (!rkm__steps_push(save, w->cur.s[i].kind, w->cur.s[i].index, w->cur.s[i].save)) return 0;
    if (!rkm__squeeze_apply(q, &first, obj, early) || !rkm__squeeze_prune(q, &first)) return 0;
    *f = w->fig;
    w->cand.n = 0;
    for (size_t i = 0; i < save->n; i++)
        if (!rkm__steps_push(&w->cand, save->s[i].kind, save->s[i].index, save->s[i].save)) return 0;
    if (!rkm__polish_expand(w) || rkm__judge(w, INFINITY, &w->fig) <= 0 || !rkm__squeeze_take(q)) return 0;
    w->fig = was;
    return 1;
}

/* Of the round's best moves, the one that scores best after a prune. 0 on
 * NOMEM. */
static int rkm__squeeze_pick(rkm__squeeze *q, int64_t first, int32_t *bt, int *be)
{
    rkm__steps save = {q->w.g->ctx, NULL, 0, 0};
    double best = INFINITY;
    int ok = 1;
    for (int i = 0; i < q->n_top && ok; i++) {
        rkm__figures f;
        ok = rkm__squeeze_look(q, first, q->top_obj[i], q->top_early[i], &save, &f);
        double score = rkm__squeeze_score(ok, &f, &q->w.fig);
        if (ok && score < best) best = score, *bt = q->top_obj[i], *be = q->top_early[i];
    }
    rkm__steps_free(&save);
    return ok;
}

/* The best move of a round (w.cur first over the budget at w.full's step
 * `first`): (*bt, *be), *bt -1 where the rule accepts none. 0 on NOMEM. */
static int rkm__squeeze_round(rkm__squeeze *q, int64_t first, int32_t *bt, int *be)
{
    rkm__polish *w = &q->w;
    const rkm_graph *g = w->g;
    size_t c = 0;
    while (q->pos[c] != (size_t)first) c++; /* over the budget: a compute step */
    rkm__squeeze_live_at(q, (size_t)first, q->live, q->livep);
    double bscore = INFINITY;
    *bt = -1;
    const rkm_step *at = &w->cur.s[c];
    for (size_t t = 0; t < g->n_tensors + g->n_ops && rkm__polish_more(&q->w); t++) {
        int32_t o = (int32_t)(t - g->n_tensors);
        if (t < g->n_tensors ? !q->live[t] || (g->tensors[t].flags & RKM_TENSOR_INPUT) || rkm__step_touches(g, at, (int32_t)t)
                             : !q->livep[o] || (at->kind == RKM_STEP_BWD && at->index == o))
            continue;
        for (int early = 0; early < 2; early++) {
            rkm__figures f;
            int ok = rkm__squeeze_move(q, c, (int32_t)t, early);
            if (ok > 0) ok = rkm__judge(w, w->fig.excess, &f);
            if (ok < 0) return 0;
            double score = rkm__squeeze_score(ok, &f, &w->fig);
            if (score < bscore) {
                *bt = (int32_t)t, *be = early;
                bscore = score;
            }
            if (w->work < q->look_limit && isfinite(score)) rkm__squeeze_top(q, score, (int32_t)t, early);
        }
    }
    int ok = q->n_top > 1 ? rkm__squeeze_pick(q, first, bt, be) : 1;
    q->n_top = 0;
    return ok;
}

/* Apply the move for tensor t to w.cur (and w.full, w.fig, *first). 1
 * when done, 0 on NOMEM. */
static int rkm__squeeze_apply(rkm__squeeze *q, int64_t *first, int32_t t, int early)
{
    size_t c = 0;
    while (q->pos[c] != (size_t)*first) c++;
    if (rkm__squeeze_move(q, c, t, early) <= 0 || rkm__judge(&q->w, INFINITY, &q->w.fig) <= 0) return 0;
    *first = q->w.fig.first;
    return rkm__squeeze_take(q);
}

static void rkm__squeeze_free(rkm__squeeze *q)
{
    const rkm_graph *g = q->w.g;
    rkm__free(g->ctx, q->live, g->n_tensors);
    rkm__free(g->ctx, q->vlive, g->n_tensors);
    rkm__free(g->ctx, q->livep, g->n_ops);
    rkm__free(g->ctx, q->mark, g->n_ops);
    rkm__free(g->ctx, q->pos, q->cap_pos * sizeof *q->pos);
    rkm__polish_free(&q->w);
}

/* Plan p (valid, any peak) squeezed within `budget`: *out, or NULL when
 * the search does not get there within *left work; rounds look ahead while
 * it has done less than *look_left (NULL: never). What it does is taken off
 * both. */
static rkm_result rkm__squeeze_plan(rkm_planner *pl, const rkm_plan *p, uint64_t budget, uint64_t *left,
                                    uint64_t *look_left, rkm_plan **out)
{
    const rkm_graph *g = pl->g;
    rkm__squeeze q;
    memset(&q, 0, sizeof q);
    q.look_limit = look_left && *look_left < *left ? *look_left : look_left ? *left : 0;
    *out = NULL;
    rkm_result r = rkm__polish_init(&q.w, pl, pl->g, p->steps, p->n_steps, budget);
    q.w.limit = *left;
    q.w.lower = 0; /* the moves' positions are w.full's */
    q.live = rkm__alloc(g->ctx, g->n_tensors);
    q.vlive = rkm__alloc(g->ctx, g->n_tensors);
    q.livep = rkm__alloc(g->ctx, g->n_ops);
    q.mark = rkm__alloc(g->ctx, g->n_ops);
    int64_t first = -1;
    int ok = !r && q.live && q.vlive && q.livep && q.mark && rkm__polish_expand(&q.w) ? rkm__judge(&q.w, INFINITY, &q.w.fig)
                                                                                     : -1;
    first = q.w.fig.first;
    if (ok > 0) ok = rkm__squeeze_take(&q) ? 1 : -1;
    while (ok > 0 && first >= 0 && rkm__polish_more(&q.w)) {
        int32_t t;
        int early = 0;
        if (!rkm__squeeze_round(&q, first, &t, &early)) ok = -1;
        if (ok < 0 || t < 0) break;
        int look = q.w.work < q.look_limit;
        ok = rkm__squeeze_apply(&q, &first, t, early) && (!look || rkm__squeeze_prune(&q, &first)) ? 1 : -1;
    }
    if (ok < 0 && !r) r = rkm__nomem(pl->ctx, "plan squeeze");
    if (!r && ok > 0 && first < 0) {
        rkm__steps d = q.w.rp.ref; /* w.cur's whole plan, within the budget: taken */
        q.w.rp.ref = (rkm__steps){g->ctx, NULL, 0, 0};
        r = rkm__planned_birth(pl, &d, out);
    }
    *left = q.w.work < *left ? *left - q.w.work : 0;
    if (look_left) *look_left = q.w.work < *look_left ? *look_left - q.w.work : 0;
    rkm__squeeze_free(&q);
    return r;
}

/* ---- the descent: the search's one way down from a plan ------------------
 *
 * p squeezed within `target` (the squeeze's share *left and the solve's
 * work, what it did taken off both; its rounds look ahead within
 * *look_left, NULL: never), then polished there: *out, or NULL where the
 * squeeze does not get within the target. The squeeze's greedy moves
 * leave recomputations that polish drops. */
static rkm_result rkm__descend(rkm_planner *pl, const rkm_plan *p, uint64_t target, uint64_t *left, uint64_t *look_left,
                               rkm_plan **out)
{
    uint64_t have = rkm__share(pl, *left), l = have;
    rkm_result r = rkm__squeeze_plan(pl, p, target, &l, look_left, out);
    *left -= have - l;
    rkm__spend(pl, have - l);
    if (!r && *out) r = rkm__polish_plan(pl, target, out);
    if (r) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* The squeeze starts from the chain DP's plans for the budget's multiples
 * 1 + RKM__SQUEEZE_STEP * 2^i, i < RKM__SQUEEZE_STARTS (5 % to 160 % more
 * memory), and below the DP's floor from the floor's plan: on the bundled
 * graphs the start that squeezes best lies anywhere from 7 % to 86 % above
 * the budget, so one start is not enough. */

/* The chain DP's plan for start i of the squeeze at `budget` (-1: the
 * floor's, when the budget is below it), or NULL. */
static rkm_result rkm__squeeze_start(rkm_planner *pl, uint64_t budget, int i, rkm_plan **out)
{
    uint64_t floor;
    int64_t slots;
    *out = NULL;
    if (i < 0) {
        rkm_result r = rkm__chain_floor(pl, &floor, &slots);
        return r || !floor || floor <= budget ? r : rkm__solve_chain(pl, RKM__CHAIN_DP, rkm__slots_budget(pl, slots), out);
    }
    int dtr = i >= RKM__SQUEEZE_STARTS;
    double b = (double)budget * (1 + RKM__SQUEEZE_STEP * (double)(1u << (dtr ? i - RKM__SQUEEZE_STARTS : i)));
    uint64_t at = b >= 0x1p64 ? UINT64_MAX : (uint64_t)b;
    if (dtr && !rkm__dtr_affordable(pl)) return RKM_OK;
    return dtr ? rkm__dtr_plan(pl, at, 0, out, NULL) : rkm__solve_chain(pl, RKM__CHAIN_DP, at, out);
}

/* The fastest plan within `budget` that the squeeze makes from its starts,
 * each polished, or *out NULL. A start that fits already, or that is the
 * previous one's plan again, is left out. */
RKM__PRIVATE rkm_result rkm__solve_squeezed(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    uint64_t left = RKM__SQUEEZE_WORK, look_left = RKM__SQUEEZE_LOOK_WORK, last_peak = 0;
    double last_time = -1;
    rkm_result r = RKM_OK;
    *out = NULL;
    for (int i = -1; i < RKM__SQUEEZE_STARTS + RKM__SQUEEZE_DTR_STARTS && !r && rkm__share(pl, left) > 0; i++) {
        rkm_plan *a = NULL, *b = NULL;
        r = rkm__squeeze_start(pl, budget, i, &a);
        if (!r && a && a->stats.peak > budget && !(a->stats.time == last_time && a->stats.peak == last_peak)) {
            last_time = a->stats.time;
            last_peak = a->stats.peak;
            r = rkm__descend(pl, a, budget, &left, &look_left, &b);
        }
        rkm_plan_destroy(a);
        *out = rkm__faster(*out, b);
    }
    if (r) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* ---- kick: leave a local optimum of polish and squeeze -------------------
 *
 * Polish only drops recomputations and the squeeze only adds them, so a
 * plan they both leave alone may still be one swap away from a faster one
 * (mlp16 at 36.85 %: checkpoints at act5, act9, act13 where act4, act10,
 * act13 save two forwards). A kick drops one recomputing forward of the
 * best plan even where the plan then peaks over the budget, squeezes the
 * result back within it and polishes that; the best plan moves to the
 * first result that is faster, and the kicks start over from it. At most
 * RKM__KICK_TRIALS kicks a solve (each a squeeze and a polish): measured on
 * the bundled graphs, 64 reach what 200 do but on peer-gpt (27.05 % against
 * 26.72 % at 25 %) in 0.05 s instead of 0.11 s. */
RKM__PRIVATE uint64_t rkm__kick_work(const rkm_graph *g)
{
    int64_t n = (int64_t)g->n_ops;
    if (!rkm__affords(g, n, RKM__NEED_KICKS)) return 0;
    return rkm__affords(g, n, RKM__NEED_GRAPH_ILP) ? RKM__SQUEEZE_WORK : RKM__KICK_WORK_LARGE;
}

/* A copy of w.full as a plan when it replays valid at any peak, else NULL. */
static rkm_result rkm__kick_candidate(rkm_planner *pl, rkm__polish *w, rkm_plan **out)
{
    rkm__figures f;
    *out = NULL;
    int ok = rkm__judge(w, INFINITY, &f); /* any excess */
    if (ok <= 0) return ok ? rkm__nomem(pl->ctx, "plan kick") : RKM_OK;
    rkm__steps d;
    rkm_result r = rkm__steps_copy(pl->ctx, w->full.s, w->full.n, &d, "plan kick");
    return r ? r : rkm__planned_birth(pl, &d, out);
}

/* The kick of recomputing forward j of w.cur: squeezed within `budget` and
 * polished, into *best when faster (then *improved; rkm__prefer's rule). */
static rkm_result rkm__kick_one(rkm_planner *pl, rkm__polish *w, size_t j, uint64_t budget, uint64_t *left,
                                rkm_plan **best, int *trials, int *improved)
{
    int64_t h = rkm__polish_drop(w, j);
    if (h == -2 || (h >= 0 && !rkm__polish_expand(w))) return rkm__nomem(pl->ctx, "plan kick");
    rkm_plan *a = NULL, *b = NULL;
    rkm_result r = h >= 0 ? rkm__kick_candidate(pl, w, &a) : RKM_OK;
    if (!r && a) {
        (*trials)++;
        r = rkm__descend(pl, a, budget, left, NULL, &b); /* many kicks: no lookahead */
        if (!r && b) { /* the faster, but in a stage's fit not one whose arena is over */
            r = rkm__prefer(pl, best, b, improved);
            b = NULL;
        }
    }
    rkm_plan_destroy(a);
    rkm_plan_destroy(b);
    return r;
}

/* *best (within `budget`) replaced by the faster plans of at most
 * max_trials kicks. */
static rkm_result rkm__solve_kicked(rkm_planner *pl, uint64_t budget, int max_trials, rkm_plan **best)
{
    int trials = 0, improved = 1;
    rkm_result r = RKM_OK;
    uint64_t left = pl->kick_work;
    while (!r && improved && trials < max_trials && rkm__share(pl, left) > 0) {
        rkm__polish w;
        int kept = 0;
        improved = 0;
        r = rkm__polish_init(&w, pl, pl->g, (*best)->steps, (*best)->n_steps, budget);
        if (!r && !rkm__polish_try(&w, &kept)) r = rkm__nomem(pl->ctx, "plan kick");
        for (size_t j = 0; !r && kept && !improved && j < w.cur.n && trials < max_trials && rkm__share(pl, left) > 0; j++)
            r = rkm__kick_one(pl, &w, j, budget, &left, best, &trials, &improved);
        rkm__spend(pl, w.work);
        rkm__polish_free(&w);
    }
    return r;
}

/* ---- the portfolio: where rockmate's search starts ---------------------
 *
 * Each start is a plan for the budget, or none: the chain DP's for the
 * budget's own slots and, apart, its faster one for a few slots more (each
 * is polished on its own, and the slower one before polish may end faster),
 * sqrt's, DTR's, the whole-graph ILP's on graphs small enough for it, and
 * the squeeze's of plans for more memory. The order is the tie-break: of
 * two plans as fast, the earlier start's stays. */
enum { RKM__START_DP, RKM__START_DP_UP, RKM__START_SQRT, RKM__START_DTR, RKM__START_ILP, RKM__START_SQUEEZE, RKM__STARTS };

/* The whole-graph ILP's plan: one start among several, so where lp_solve
 * fails on it the others stand. Not in the smallest budget's fits: there
 * the bisection has already taken the ILP's least peak, and near it the
 * ILP's plans rarely fit their arena while each solve costs up to its
 * work limit (random30: the smallest budget 1517568 -> 1481728 bytes
 * without it, in 2.6 s instead of 4.7). */
static rkm_result rkm__start_ilp(rkm_planner *pl, uint64_t budget, rkm__ask ask, rkm_plan **out)
{
    if (!rkm__affords(pl->g, (int64_t)pl->g->n_ops, RKM__NEED_GRAPH_ILP) || (ask.skip & RKM__SKIP_ILP)) return RKM_OK;
    rkm_result r = rkm__solve_checkmate(pl, budget, RKM__WHOLE_GRAPH_SECONDS, 0, out);
    if (r != RKM_ERROR_SOLVER) return r;
    rkm__log(pl->ctx, RKM_LOG_WARN, "whole-graph ILP left out: %s", rkm_context_errmsg(pl->ctx));
    return RKM_OK;
}

/* Start k at `budget` into p[k] (DP_UP reads p[DP]); the squeeze's comes
 * polished; DTR's sets *missed (below). */
static rkm_result rkm__start(rkm_planner *pl, int k, uint64_t budget, rkm__ask ask, rkm_plan **p, rkm_plan **missed)
{
    switch (k) {
    case RKM__START_DP: return rkm__solve_dp_at(pl, budget, &p[k]);
    case RKM__START_DP_UP: return rkm__solve_dp_up(pl, budget, p[RKM__START_DP], &p[k]);
    case RKM__START_SQRT: return rkm__solve_fixed(pl, budget, &p[k]);
    case RKM__START_DTR: return rkm__solve_dtr(pl, budget, &p[k], ask.skip & RKM__SKIP_MISSED ? NULL : missed);
    case RKM__START_ILP: return rkm__start_ilp(pl, budget, ask, &p[k]);
    default: return rkm__solve_squeezed(pl, budget, &p[k]);
    }
}

/* ---- the search's phases: kicks at the budget, then rungs below it -------
 *
 * After the portfolio, one loop over a table: the first phase kicks the
 * best plan at the budget itself; each later one (a rung) squeezes at a
 * fraction of the budget, kicks that plan there and polishes it at the
 * budget, since a plan for less memory fits too and the squeeze and the
 * kicks are local searches that can end better from a tighter start (on
 * mlp16, rockmate's plan costs 37.86 % at 36.85 % to 38 % of the baseline
 * peak but 40.56 % at 39 % to 42 %, and squeezing and kicking at 96 % or
 * 90 % of those budgets finds the 37.86 % plan again). Rungs run where the
 * graph affords the whole-graph ILP (rkm__affords): on gpt2-124M (125 ops)
 * they took a solve from 0.4 to 0.7 s and found nothing. Every phase draws on the solve's
 * one work meter and stops at its deadline. */
typedef struct rkm__phase {
    double at; /* the budget's fraction it searches at */
    int kicks; /* at most this many kicks */
} rkm__phase;

static const rkm__phase rkm__phases[] = RKM__SEARCH_PHASES;

/* Phase ph for `budget` from *best (the portfolio's plan, or the phases'
 * so far): *best is the faster of it and the phase's plan. */
static rkm_result rkm__phase_run(rkm_planner *pl, const rkm__phase *ph, uint64_t budget, rkm_plan **best)
{
    uint64_t target = ph->at < 1 ? (uint64_t)((double)budget * ph->at) : budget;
    rkm_plan *q = NULL;
    rkm_result r = RKM_OK;
    if (ph->at < 1) r = rkm__solve_squeezed(pl, target, &q);
    else q = *best, *best = NULL; /* kicked in place */
    if (!r && q) r = rkm__solve_kicked(pl, target, ph->kicks, &q);
    if (!r && q && ph->at < 1) r = rkm__polish_plan(pl, budget, &q);
    if (r) {
        rkm_plan_destroy(q);
        return r;
    }
    return rkm__prefer(pl, best, q, NULL);
}

/* DTR's plans in bytes mode whose layout misses the budget are no starts:
 * the portfolio's plans lay out within it, or the planner's fit plans
 * again for less. Polished and kicked, though, such a plan often lays out
 * within it (its frees move to the earliest), and the search from it is
 * faster than from the starts (dag4x50 at 70/40/30 %: 4.05/14.05/18.76 ->
 * 3.05/11.74/16.69 %): so it is a track of its own, which replaces *best
 * where it ends faster and its arena fits. Not in the smallest budget's
 * fits (whole solves, many of them). */
static rkm_result rkm__missed_track(rkm_planner *pl, uint64_t budget, rkm_plan *m, rkm_plan **best)
{
    rkm_plan *k = NULL; /* m kicked; the kicks may leave the arena over even where m's fits */
    rkm_result r = rkm__over(pl) ? RKM_OK : rkm__polish_plan(pl, budget, &m);
    if (!r && m) r = rkm__plan_copy(m, &k);
    if (!r && k) r = rkm__solve_kicked(pl, budget, RKM__MISSED_KICK_TRIALS, &k);
    for (int i = 0; i < 2 && !r; i++) { /* the kicked plan first, then m */
        rkm_plan **c = i ? &m : &k;
        uint64_t arena = UINT64_MAX;
        if (!*c || !((*c)->stats.time < (*best)->stats.time)) continue;
        if ((r = rkm__planner_arena(pl, *c, &arena)) || arena > rkm__arena_cap(pl, budget)) continue;
        rkm_plan_destroy(*best);
        *best = *c;
        *c = NULL;
    }
    rkm_plan_destroy(k);
    rkm_plan_destroy(m);
    return r;
}

/* The search's plan whose arena, as the host gets it, is over the budget
 * though its peak is within it (the layout's search runs out of work above
 * the aligned peak on plans of many buffers: dag4x50 at 30 %, 664 of them,
 * 2 % over) gives way to the fastest whose arena fits of the portfolio's
 * plan (*runner, taken then) and the plan squeezed and polished at budgets
 * below its peak: first by the arena's excess, then bisecting between the
 * highest whose arena fits and the lowest whose arena does not
 * (RKM__ARENA_FIT_TRIES in all), since one squeezed by the excess often
 * lays out well within the budget. Where none fits, the planner's fit
 * solves again for less: a whole solve where this is a few squeezes and
 * layouts (dag4x50 at 30 %: 12.98 %, the portfolio's plan; the fit's
 * 13.22 %, 1.5 s later). */
static rkm_result rkm__arena_fit(rkm_planner *pl, uint64_t target, rkm_plan **best, rkm_plan **runner)
{
    uint64_t arena = UINT64_MAX, ra = UINT64_MAX, budget = rkm__arena_cap(pl, target);
    rkm_result r = rkm__planner_arena(pl, *best, &arena);
    if (r || arena <= budget) return r;
    if (*runner && (r = rkm__planner_arena(pl, *runner, &ra))) return r;
    rkm_plan *fit = ra <= budget ? *runner : NULL;
    if (fit) *runner = NULL;
    uint64_t bp = rkm__stage_peak(*best, pl->d.in_flight), hi = bp < target ? bp : target, lo = 0;
    uint64_t at = rkm__less(hi, UINT64_MAX, arena, budget);
    for (int k = 0; !r && at > lo && at < hi && k < RKM__ARENA_FIT_TRIES && !rkm__over(pl); k++) {
        uint64_t left = RKM__SQUEEZE_WORK, a = UINT64_MAX;
        rkm_plan *q = NULL;
        r = rkm__descend(pl, *best, at, &left, NULL, &q);
        if (!r && q) r = rkm__planner_arena(pl, q, &a);
        if (!r && q && a <= budget) {
            lo = at;
            fit = rkm__faster(fit, q);
        } else {
            rkm_plan_destroy(q);
            if (!q) break; /* the squeeze got nowhere: lower does not help */
            hi = at;
        }
        at = lo ? lo + (hi - lo) / 2 : rkm__less(at, UINT64_MAX, a, budget);
    }
    if (!r && fit) {
        rkm_plan_destroy(*best);
        *best = fit;
    } else
        rkm_plan_destroy(fit);
    return r;
}

/* Rockmate's plan: every start but the squeeze's, each polished; the
 * squeeze's; the fastest of them through the phases; DTR's missed plan's
 * track; the arena's fit (with the portfolio's plan). All of it within the
 * solve's work and, past the chain DP's plan, its deadline. */
static rkm_result rkm__dp_maker(rkm_planner *pl, uint64_t budget, void *arg, rkm_plan **out)
{
    (void)arg;
    return rkm__solve_dp(pl, budget, out);
}

RKM__PRIVATE rkm_result rkm__solve_rockmate(rkm_planner *pl, uint64_t budget, rkm__ask ask, rkm_plan **out)
{
    rkm_plan *p[RKM__STARTS] = {NULL}, *missed = NULL;
    /* a stage's starts from one micro-batch's planners are made for its
     * share of the budget (rkm__stage_share, found with the chain DP); the
     * whole-graph ILP, the fixed schedules (each fits its stage or not),
     * the squeeze and every judge take the stage's own */
    uint64_t one = budget;
    rkm_result r = pl->d.in_flight > 1 ? rkm__stage_share(pl, budget, rkm__dp_maker, NULL, &p[RKM__START_DP], &one) : RKM_OK;
    rkm_plan_destroy(p[RKM__START_DP]);
    p[RKM__START_DP] = NULL;
    for (int k = 0; k < RKM__START_SQUEEZE && !r && (k == 0 || !rkm__over(pl)); k++)
        r = rkm__start(pl, k, k == RKM__START_ILP || k == RKM__START_SQRT ? budget : one, ask, p, &missed);
    for (int k = 0; k < RKM__START_SQUEEZE && !r; k++)
        if (p[k] && !rkm__over(pl)) r = rkm__polish_plan(pl, budget, &p[k]);
    if (!r) r = rkm__start(pl, RKM__START_SQUEEZE, budget, ask, p, NULL);
    /* In a stage's fit the phases go on from the fastest start whose arena
     * fits (kicked from a faster one whose arena does not, they miss plans
     * that the fitting one's kicks reach: a 5-op chain, tests/test_pipe.c),
     * and the fastest start of all, where it is another, is fitted to the
     * arena apart (the fit's repair of it is faster on gpt2-xl's stages);
     * the faster of the two whose arena fits stays. Elsewhere the phases
     * go on from the fastest start, the arena's fit with the portfolio's
     * plan as its runner. */
    rkm_plan *best = NULL, *runner = NULL, *alt = NULL;
    int fit = -1;
    for (int k = 0; k < RKM__STARTS && !r && pl->stage_cap; k++) {
        uint64_t a;
        if (p[k] && !(r = rkm__stage_arena(pl, p[k], &a)) && a <= pl->stage_cap &&
            (fit < 0 || p[k]->stats.time < p[fit]->stats.time))
            fit = k;
    }
    for (int k = 0; k < RKM__STARTS; k++)
        if (k != fit) best = rkm__faster(best, p[k]);
    if (fit >= 0) {
        if (best && best->stats.time < p[fit]->stats.time) alt = best;
        else rkm_plan_destroy(best);
        best = p[fit];
    }
    if (!r && best && fit < 0) r = rkm__plan_copy(best, &runner);
    for (size_t k = 0; k < sizeof rkm__phases / sizeof *rkm__phases && !r && best && !(ask.skip & RKM__SKIP_PHASES); k++) {
        if (k > 0 && (!rkm__affords(pl->g, (int64_t)pl->g->n_ops, RKM__NEED_GRAPH_ILP) || rkm__over(pl))) break;
        r = rkm__phase_run(pl, &rkm__phases[k], budget, &best);
    }
    if (!r && missed && best) r = rkm__missed_track(pl, budget, missed, &best);
    else rkm_plan_destroy(missed);
    if (!r && best) r = rkm__arena_fit(pl, budget, &best, &runner);
    rkm_plan_destroy(runner);
    runner = NULL;
    if (!r && alt) r = rkm__arena_fit(pl, budget, &alt, &runner);
    if (!r) r = rkm__prefer(pl, &best, alt, NULL);
    else rkm_plan_destroy(alt);
    if (r) {
        rkm_plan_destroy(best);
        return r;
    }
    *out = best;
    return RKM_OK;
}
