/* drive.c -- the drivers: a solve's plan fitted to its arena, the smallest budget, offloading's bases; each call's work rule
 *
 * Uses (through internal.h): base.c, plan.c, baseline.c, progress.c, produce.c, offload.c, search.c.
 *
 * What the planner's API calls (planner.c) ask of the producers and the
 * search below: each request is an rkm__ask passed by value, each probe
 * of a bisection gets its own argument, and every part is charged to the
 * call's one work meter, whose limits are set here (the rule:
 * docs/design.md, 'Effort'). */
#include "internal.h"

/* ---- the work a call may do (the rule: internal.h, RKM__WORK_MIN) -------- */

/* Checkmate's ILP work a solve (half of time_limit, measured like
 * ilp_time_limit; as much again with copies), in the meter's units. */
RKM__PRIVATE uint64_t rkm__work_checkmate(const rkm_planner *pl)
{
    if (pl->d.algo != RKM_ALGO_CHECKMATE) return 0;
    double s = pl->d.time_limit * RKM__CHECKMATE_SHARE * (rkm__offloads(pl) ? 2 : 1) * RKM__ILP_STEPS_PER_S;
    return s >= 0x1p62 ? (uint64_t)1 << 62 : (uint64_t)s;
}

/* The smallest budget's search: the same amount whichever call makes it,
 * so that its result does not depend on the order of the calls. */
static uint64_t rkm__work_min(const rkm_planner *pl)
{
    return RKM__WORK_MIN_BUDGET * rkm__work_solve(pl->g) + rkm__work_checkmate(pl);
}

/* What a call on the planner may still have to seek of the smallest
 * budget: the recompute-only one, then with a copy link the one below it. */
RKM__PRIVATE uint64_t rkm__work_min_left(const rkm_planner *pl)
{
    return (pl->min_budget && !pl->min_cut ? 0 : rkm__work_min(pl)) +
           (rkm__offloads(pl) && !(pl->off_min && !pl->min_cut) ? rkm__work_min(pl) : 0);
}

/* ---- a solve's plan: the algorithm's, fitted to its arena ---------------- */

/* The algorithms that plan with the chain DP. */
RKM__PRIVATE int rkm__uses_chain(rkm_algo a)
{
    return a == RKM_ALGO_ROCKMATE || a == RKM_ALGO_ROTOR || rkm__fixed_chain(a);
}

/* The chain's fixed schedules: sqrt's segments, full's blocks. */
RKM__PRIVATE int rkm__fixed_chain(rkm_algo a) { return a == RKM_ALGO_SQRT || a == RKM_ALGO_FULL; }

static rkm_result rkm__planner_try(rkm_planner *pl, uint64_t budget, rkm__ask ask, rkm_plan **out);

/* rkm__fit_less's maker: the algorithm's plan for `budget` (its peak,
 * counted at the alignment, within it) as the host gets it; `ask` is the
 * driver's rkm__ask. */
static rkm_result rkm__planner_make_one(rkm_planner *pl, uint64_t budget, void *ask, rkm_plan **out)
{
    rkm_plan *p;
    *out = NULL;
    rkm_result r = rkm__planner_try(pl, budget, *(const rkm__ask *)ask, &p);
    return r || !p ? r : rkm__planner_handout(pl, p, out);
}

/* The algorithm's plan for `budget` whose arena fits it, or *out NULL
 * (rkm__fit_less plans again for less where the arena is over; *need as
 * there), and for rockmate, where its first plan's arena was over the
 * budget, the faster of that and DTR's plan for the budget itself: DTR
 * plans to an allocator of the budget's bytes, so its arena fits, and the
 * tries' smaller budgets may give slower plans than DTR's alone (dag4x50
 * at 20 % when this was written: 47.2 % overhead, DTR 46.0 %; at 08088b6
 * rockmate's own is 21.07 %, DTR's 45.97 %) or none. */
RKM__PRIVATE rkm_result rkm__planner_fit(rkm_planner *pl, uint64_t budget, rkm__ask ask, rkm_plan **out, uint64_t *need)
{
    uint64_t over = 0;
    rkm_plan *p = NULL, *q = NULL;
    pl->stage_cap = pl->d.in_flight > 1 ? budget : 0;
    rkm_result r = rkm__fit_less(pl, budget, rkm__planner_make_one, &ask, out, &over);
    pl->stage_cap = 0;
    if (need) *need = over;
    if (r || !over || pl->d.algo != RKM_ALGO_ROCKMATE || budget >= pl->base_peak) return r;
    if (!(r = rkm__solve_dtr(pl, budget, &p, NULL)) && p) r = rkm__handout_within(pl, p, budget, &q, NULL);
    if (r) {
        rkm_plan_destroy(*out);
        *out = NULL;
        return r;
    }
    *out = rkm__faster(*out, q);
    return RKM_OK;
}

/* The plan of an algorithm that plans one micro-batch (all but rockmate's
 * search and checkmate's ILP) for `budget` (rkm__maker; arg unused). */
static rkm_result rkm__planner_one(rkm_planner *pl, uint64_t budget, void *arg, rkm_plan **out)
{
    (void)arg;
    *out = NULL;
    rkm_algo a = pl->d.algo;
    if (!rkm__fixed_chain(a) && budget >= pl->base_peak) return rkm__plan_baseline(pl->g, out); /* nothing is faster */
    if (a == RKM_ALGO_DTR) return rkm__solve_dtr(pl, budget, out, NULL);
    if (rkm__fixed_chain(a)) { /* a fixed schedule; where it does not fit, the baseline may */
        rkm_result r = rkm__solve_chain(pl, a == RKM_ALGO_SQRT ? RKM__CHAIN_SQRT : RKM__CHAIN_FULL, budget, out);
        return r || *out || budget < pl->base_peak ? r : rkm__plan_baseline(pl->g, out);
    }
    if (rkm__uses_chain(a)) return rkm__solve_dp(pl, budget, out);
    return RKM_OK;
}

static rkm_result rkm__planner_try(rkm_planner *pl, uint64_t budget, rkm__ask ask, rkm_plan **out)
{
    *out = NULL;
    rkm__search_begin(pl, ask);
    rkm_algo a = pl->d.algo;
    if (a == RKM_ALGO_ROCKMATE && budget >= pl->base_peak) { /* nothing is faster, where it fits */
        rkm_result r = rkm__plan_baseline(pl->g, out);
        if (r || rkm__stage_peak(*out, pl->d.in_flight) <= budget) return r;
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    if (a == RKM_ALGO_ROCKMATE) return rkm__solve_rockmate(pl, budget, ask, out);
    /* One solve's work is worth about its share of the limit; on a slow
     * machine the call's deadline (rkm__over) stops it first. */
    if (a == RKM_ALGO_CHECKMATE)
        return rkm__solve_checkmate(pl, budget, pl->d.time_limit * RKM__CHECKMATE_SHARE, !(ask.skip & RKM__SKIP_COPIES), out);
    return rkm__stage_share(pl, budget, rkm__planner_one, NULL, out, NULL);
}

/* ---- the smallest budget ------------------------------------------------- */

static rkm_result rkm__min_budget(rkm_planner *pl, uint64_t *out, uint64_t *at);

/* The smallest budget's fits: whole solves, many of them, so without the
 * whole-graph ILP start (the bisection has taken its least peak already)
 * and DTR's missed track; checkmate's recompute-only (its floor with a
 * link below it: rkm__checkmate_below). */
static const rkm__ask rkm__ask_min = {UINT64_MAX, RKM__SKIP_ILP | RKM__SKIP_MISSED | RKM__SKIP_COPIES};

/* A stage's (pl->d.in_flight > 1): the floors are one micro-batch's, a
 * lower bound, and the baseline always fits its own stage arena, so the
 * smallest budget is bisected between the two, to 1/512 of the upper,
 * each probe a solve's fit (the whole-graph ILP's start included: on a
 * small stage its kept budgets find what the chain DP's share does not). */
static rkm_result rkm__min_budget_stage(rkm_planner *pl, uint64_t *out)
{
    uint64_t lo, at;
    rkm_plan *p = NULL;
    rkm_result r = rkm__min_budget(pl, &lo, &at);
    if (!r && !(r = rkm__plan_baseline(pl->g, &p))) r = rkm__planner_handout(pl, p, &p);
    uint64_t hi = p ? p->stats.stage_arena_bytes : 0;
    for (int k = 0; !r && k < RKM__MIN_BUDGET_DOWN && hi > lo + hi / 512 && !rkm__over(pl); k++) {
        uint64_t mid = lo + (hi - lo) / 2;
        rkm_plan *q = NULL;
        if ((r = rkm__planner_fit(pl, mid, RKM__ASK_SOLVE, &q, NULL))) break; /* a solve's starts: the ILP's too */
        if (q) {
            rkm_plan_destroy(p);
            p = q;
            hi = q->stats.stage_arena_bytes;
        } else
            lo = mid;
    }
    if (r) {
        rkm_plan_destroy(p);
        return r;
    }
    pl->min_plan = p;
    *out = hi;
    return RKM_OK;
}

/* The smallest budget the planner meets, and the plan that meets it
 * (pl->min_plan): from the least budget the algorithm plans for (its peaks
 * counted at the alignment) upwards, by the least arena of the plans that
 * did not fit, else by steps that double from 1/RKM__MIN_BUDGET_STEPS of the
 * way to the baseline peak, until a plan fits (the baseline's arena always
 * does); then down, while the budget one byte under the plan's arena finds
 * a plan. The budget is that plan's arena: rkm_planner_solve meets any
 * budget from there on, with this plan where its own search finds none
 * (the searches are not monotone in the budget). */
static rkm_result rkm__min_budget_fit(rkm_planner *pl, uint64_t *out)
{
    if (pl->d.in_flight > 1) return rkm__min_budget_stage(pl, out);
    uint64_t m, at, failed = 0;
    rkm_plan *p = NULL;
    rkm__progress_part(pl, 0, RKM__PROGRESS_FLOORS);
    rkm_result r = rkm__min_budget(pl, &m, &at);
    rkm__progress_part(pl, RKM__PROGRESS_FLOORS, (1 + RKM__PROGRESS_FLOORS) / 2);
    uint64_t step = pl->base_peak > m ? (pl->base_peak - m) / RKM__MIN_BUDGET_STEPS : 0;
    for (int k = 0; !r && !p; k++) {
        uint64_t need = 0;
        /* the baseline, laid out, fits its own arena; past the deadline,
         * after one try at the least peak */
        if (k == RKM__MIN_BUDGET_UP || (k > 0 && rkm__over(pl))) {
            if (!(r = rkm__plan_baseline(pl->g, &p))) r = rkm__planner_handout(pl, p, &p);
        } else if (!(r = rkm__planner_fit(pl, m, rkm__ask_min, &p, &need)) && !p) {
            failed = m;
            uint64_t up = at > m ? at - m : step > pl->d.alignment ? step : pl->d.alignment;
            if (at > m) at = 0; /* first, the budget the least peak was made for */
            else step *= 2;
            m = need > m ? need : m + up;
        }
    }
    /* then down: a budget just under that arena may find another plan, but
     * not one under a budget that found none on the way up (the searches
     * are not monotone, but a failing solve is the dearest of all) */
    rkm__progress_part(pl, (1 + RKM__PROGRESS_FLOORS) / 2, 1);
    for (int k = 0; !r && k < RKM__MIN_BUDGET_DOWN && p->stats.stage_arena_bytes > failed + 1 && !rkm__over(pl); k++) {
        rkm_plan *q = NULL;
        if ((r = rkm__planner_fit(pl, p->stats.stage_arena_bytes - 1, rkm__ask_min, &q, NULL)) || !q) break;
        rkm_plan_destroy(p);
        p = q;
    }
    if (r) {
        rkm_plan_destroy(p);
        return r;
    }
    pl->min_plan = p;
    *out = p->stats.stage_arena_bytes;
    return RKM_OK;
}

/* The smallest budget, kept unless a cut call found it (then the next call
 * looks again), within the call's deadline. */
RKM__PRIVATE rkm_result rkm__min_budget_get(rkm_planner *pl, uint64_t *out)
{
    if (!pl->min_budget || pl->min_cut) {
        rkm_plan_destroy(pl->min_plan);
        rkm_plan_destroy(pl->off_min_plan);
        pl->min_plan = pl->off_min_plan = NULL;
        pl->off_min = 0;
        uint64_t was = rkm__work_part(pl, rkm__work_min(pl));
        rkm_result r = rkm__min_budget_fit(pl, &pl->min_budget);
        rkm__work_part_end(pl, was);
        if (r) {
            pl->min_budget = 0;
            return r;
        }
        pl->min_cut = pl->cut;
    }
    *out = pl->min_budget;
    return RKM_OK;
}

/* The smallest budget the planner meets: with a copy link, rockmate's and
 * checkmate's offloading may meet less than their recompute-only floors. */
RKM__PRIVATE rkm_result rkm__planner_min(rkm_planner *pl, uint64_t *out)
{
    return rkm__offloads(pl) ? rkm__offload_min_budget(pl, out) : rkm__min_budget_get(pl, out);
}

/* Checkmate: feasibility is monotone in the budget; the probes share the
 * time limit, and one that times out counts as infeasible, so this is the
 * least budget the solver could meet. */
static rkm_result rkm__probe_checkmate(rkm_planner *pl, uint64_t budget, void *ask, rkm_plan **out)
{
    return rkm__solve_checkmate(pl, budget, pl->d.time_limit * RKM__CHECKMATE_SHARE / RKM__BISECT_CHECKMATE,
                                !(((const rkm__ask *)ask)->skip & RKM__SKIP_COPIES), out);
}

/* On graphs small enough for the whole-graph ILP, rockmate's candidates
 * reach below the floors of the chain DP, sqrt and DTR (a random DAG of 60
 * ops: 41.5 % where they stop at 42.2 %): the whole-graph ILP's plan (at a
 * fifth of a solve's work, which the solve's own search extends), else the
 * squeeze's. */
static rkm_result rkm__probe_small(rkm_planner *pl, uint64_t budget, void *arg, rkm_plan **out)
{
    (void)arg;
    rkm__search_begin(pl, RKM__ASK_SOLVE);
    rkm_result r = rkm__solve_checkmate(pl, budget, RKM__BISECT_SMALL_SECONDS, 0, out);
    if (r == RKM_ERROR_SOLVER) r = RKM_OK; /* as in rkm__start_ilp: the squeeze stands */
    return r || *out ? r : rkm__solve_squeezed(pl, budget, out);
}

/* The least peak of the plans the planner's algorithm makes (*out), and
 * the budget the plan of that peak was made for (*at, at least *out): the
 * searches are not monotone in the budget. */
static rkm_result rkm__min_budget(rkm_planner *pl, uint64_t *out, uint64_t *at)
{
    rkm_result r = RKM_OK;
    *out = *at = pl->base_peak;
    if (pl->d.algo == RKM_ALGO_ROTOR || pl->d.algo == RKM_ALGO_ROCKMATE) {
        uint64_t floor;
        int64_t slots;
        if (!(r = rkm__chain_floor(pl, &floor, &slots)) && floor && floor < *out) *out = *at = floor;
    } else if (pl->d.algo == RKM_ALGO_CHECKMATE) {
        uint64_t ignored;
        rkm__ask plain = rkm__ask_min;
        r = rkm__bisect(pl, rkm__probe_checkmate, &plain, RKM__BISECT_CHECKMATE, 1, pl->lower_bound, out, &ignored, NULL);
        *at = *out;
    }
    /* sqrt's one schedule: rockmate has it among its candidates, so its
     * floor too (in place, it can peak below the chain DP's) */
    if (!r && (rkm__fixed_chain(pl->d.algo) || pl->d.algo == RKM_ALGO_ROCKMATE)) {
        rkm_plan *p;
        int rule = pl->d.algo == RKM_ALGO_FULL ? RKM__CHAIN_FULL : RKM__CHAIN_SQRT;
        if (!(r = rkm__solve_chain(pl, rule, UINT64_MAX, &p)) && p && p->stats.peak < *out) *out = *at = p->stats.peak;
        rkm_plan_destroy(p);
    }
    if (!r && (pl->d.algo == RKM_ALGO_DTR || pl->d.algo == RKM_ALGO_ROCKMATE) && rkm__dtr_affordable(pl)) {
        uint64_t dtr;
        if (pl->d.algo == RKM_ALGO_ROCKMATE) rkm__progress_part(pl, 0, RKM__PROGRESS_FLOORS / 2);
        if (!(r = rkm__dtr_min_budget(pl, &dtr)) && dtr < *out) *out = dtr, *at = pl->dtr_min_at;
    }
    if (!r && pl->d.algo == RKM_ALGO_ROCKMATE &&
        rkm__affords(pl->g, (int64_t)pl->g->n_ops, RKM__NEED_GRAPH_ILP)) {
        rkm__progress_part(pl, RKM__PROGRESS_FLOORS / 2, RKM__PROGRESS_FLOORS);
        r = rkm__bisect(pl, rkm__probe_small, NULL, RKM__BISECT_SMALL, 1, pl->lower_bound, out, at, NULL);
    }
    if (*at < *out) *at = *out;
    return r;
}

/* ---- with a copy link: offloading's drivers (offload.c places copies) ---- */

/* The plans rkm__offload_below offloads, made as its probes need them. */
typedef struct rkm__bases {
    rkm_plan *b[RKM__OFFLOAD_MIN_BASES]; /* NULL: no plan there */
    int made;
} rkm__bases;

/* Base k of rkm__offload_min_budget, into bs->b[k]. */
static rkm_result rkm__off_min_base(rkm_planner *pl, rkm__bases *bs, int k)
{
    const int n = RKM__OFFLOAD_MIN_BASES;
    double floor = (double)pl->min_budget;
    if (k == 0) return rkm__plan_copy(pl->min_plan, &bs->b[0]);
    if (k == n - 1) return rkm__plan_baseline(pl->user, &bs->b[k]);
    return rkm__planner_fit(pl, (uint64_t)(floor * pow((double)pl->base_peak / floor, (double)k / (n - 1))),
                            RKM__ASK_SOLVE, &bs->b[k], NULL);
}

/* `budget` met by offloading one of the bases of rkm__offload_min_budget
 * (`bases`, an rkm__bases), the first that fits, copies the compute stream
 * waits for allowed. A base is made when a probe first needs it (where the
 * floor's own plan meets every probe, no other is). */
static rkm_result rkm__probe_offload(rkm_planner *pl, uint64_t budget, void *bases, rkm_plan **out)
{
    rkm__bases *bs = bases;
    rkm_result r = RKM_OK;
    *out = NULL;
    for (int k = 0; k < RKM__OFFLOAD_MIN_BASES && !r && !*out; k++) {
        if (k == bs->made && !(r = rkm__off_min_base(pl, bs, k))) bs->made++;
        if (!r && bs->b[k]) r = rkm__offload_exposed(pl, bs->b[k], budget, NULL, out);
    }
    return r;
}

/* Rockmate below its recompute-only floor `min`: the least budget a
 * bisection from the graph's lower bound meets by offloading a base: the
 * floor's own plan (what its peak steps hold besides their own needs can
 * wait in host memory, as in rkm__planner_offload), rockmate's plans for
 * budgets spaced geometrically from the floor to the baseline peak (fewer
 * recomputations, more to offload), the baseline. The bases do not depend
 * on the budget, so the probes only offload. *p: the plan met (NULL:
 * none). */
static rkm_result rkm__offload_below(rkm_planner *pl, uint64_t min, rkm_plan **p, int *stopped)
{
    rkm__bases bs = {{NULL}, 0};
    uint64_t hi = min, at = min;
    rkm_result r = RKM_OK;
    if (pl->min_plan && min > pl->lower_bound) {
        r = rkm__bisect(pl, rkm__probe_offload, &bs, RKM__BISECT_OFFLOAD, 0, pl->lower_bound, &hi, &at, stopped);
        if (!r && hi < min) r = rkm__probe_offload(pl, hi, &bs, p); /* the plan met there, again */
    }
    for (int k = 0; k < RKM__OFFLOAD_MIN_BASES; k++) rkm_plan_destroy(bs.b[k]);
    return r;
}

/* Checkmate below its recompute-only floor `min`: the least budget a
 * bisection from the graph's lower bound meets with the ILP with copies
 * too, the plan met there laid out into *p (NULL: none, or its arena not
 * below the floor). */
static rkm_result rkm__checkmate_below(rkm_planner *pl, uint64_t min, rkm_plan **p, int *stopped)
{
    uint64_t hi = min, at = min;
    rkm_result r = RKM_OK;
    rkm__ask copies = RKM__ASK_SOLVE;
    if (min > pl->lower_bound)
        r = rkm__bisect(pl, rkm__probe_checkmate, &copies, RKM__BISECT_CHECKMATE, 1, pl->lower_bound, &hi, &at, stopped);
    if (!r && hi < min) r = rkm__planner_fit(pl, at, copies, p, NULL);
    if (*p && (*p)->stats.stage_arena_bytes >= min) {
        rkm_plan_destroy(*p);
        *p = NULL;
    }
    return r;
}

/* The smallest budget of an algorithm that offloads (rkm__offloads) on a
 * graph with a copy link (*out): the recompute-only floor
 * (rkm__min_budget_get), or below it the least budget its own search
 * meets (rkm__offload_below, rkm__checkmate_below). The result is that
 * plan's arena, the plan kept in pl->off_min_plan (rkm_planner_solve hands
 * out a copy where its own search finds nothing); kept with the floor (a
 * cut bisection makes both be sought again). */
RKM__PRIVATE rkm_result rkm__offload_min_budget(rkm_planner *pl, uint64_t *out)
{
    uint64_t min;
    rkm_result r = rkm__min_budget_get(pl, &min);
    if (r || pl->off_min) {
        *out = r ? 0 : pl->off_min;
        return r;
    }
    rkm_plan *p = NULL;
    int stopped = 0;
    uint64_t was = rkm__work_part(pl, rkm__work_min(pl));
    r = pl->d.algo == RKM_ALGO_ROCKMATE ? rkm__offload_below(pl, min, &p, &stopped)
                                        : rkm__checkmate_below(pl, min, &p, &stopped);
    rkm__work_part_end(pl, was);
    if (r) {
        rkm_plan_destroy(p);
        return r;
    }
    pl->off_min = p ? p->stats.stage_arena_bytes : min;
    pl->off_min_plan = p;
    pl->min_cut |= stopped;
    *out = pl->off_min;
    return RKM_OK;
}

/* Rockmate on a graph with a copy link, into *p (NULL if no plan fits;
 * nothing on an error): the faster of its recompute-only plan and a plan
 * that offloads. The bases to offload from are plans with fewer
 * recomputations than the budget's: first the baseline (where its hidden
 * copies fit, nothing is faster, and no recompute-only solve runs), then
 * rockmate's plan for the budget plus a share of what the slower copy stream
 * moves in the baseline's forward time (about what can leave the device
 * unseen while the forward runs), at most the geometric mean of the budget
 * and the baseline peak (a fast link would otherwise leave only the
 * baseline); where the copies do not bring that plan within the budget (too
 * many, each with its latency), a plan for a quarter as much more memory,
 * and where there is no plan (below the recompute-only floor), one for half
 * way to the baseline peak: RKM__OFFLOAD_BASES plans at most, until one fits
 * with hidden copies (a base where only exposed ones fit is a candidate, not
 * the end). A base is planned without the whole-graph ILP start, the phases
 * (kicks, rungs) and DTR's missed track (rkm__ask.skip), which on the bundled
 * graphs doubled a base's time for the same overheads (bench_offload: one
 * row of 39 moved, by 0.01 point), and the bases' searches together do at
 * most the work the recompute-only solve's did (a whole solve's where it
 * found no plan), so a solve with a link plans in about twice the time
 * without (each base used to get a whole solve's: gpt2-124M-b4-t64 at its
 * floor with 25 GB/s, three bases of 21 M replayed steps each after a solve
 * of 20 M). Where none of those gives a plan either, below the floor, the
 * plan that meets the floor (the smallest budget's, found once per planner):
 * what its peak steps hold besides their own needs (a chain's checkpoint)
 * can wait in host memory. Last, two planners that choose copies as they
 * go, which can beat offloading a plan made without them: DTR's plans with
 * copies, each run stopped where its clock passes the fastest so far
 * (gpt2-124M-b4-t64 at 50 % with 450 GB/s: 12.65 % overhead against the
 * pass's 16.64 %), and the chain DP with block inputs in host memory
 * (gpt2-xl-b4-t1024 at 30 % with 25 GB/s: 4.29 % against 5.82 %). Then
 * the offload moves (search.c) on the fastest of all, within
 * RKM__OFFLOAD_MOVES_WORK of the solve's work: its recomputations traded
 * for copies where that is faster (gpt2-124M-b4-t64 at 50 % with 450 GB/s:
 * 12.65 % -> 2.70 %). */
RKM__PRIVATE rkm_result rkm__planner_offload(rkm_planner *pl, uint64_t budget, rkm_plan **p)
{
    const rkm_graph *g = pl->g;
    rkm_plan *base = NULL, *q = NULL, *x = NULL;
    *p = NULL;
    rkm_result r = rkm__plan_baseline(pl->user, &base);
    if (!r) r = rkm__offload_try(pl, base, budget, NULL, &q, &x);
    rkm_plan_destroy(base);
    base = NULL;
    uint64_t done = rkm__work_spent(pl);
    if (!r && !(q && q->stats.time <= pl->base_time)) r = rkm__planner_fit(pl, budget, RKM__ASK_SOLVE, p, NULL);
    /* the bases together: RKM__OFFLOAD_BASE_WORK of what that solve did, or
     * a solve's search where it found no plan (only a base can give one),
     * without the whole-graph ILP start, the phases and the missed track;
     * the offload moves, RKM__OFFLOAD_MOVES_WORK of it */
    double solve = *p ? (double)(rkm__work_spent(pl) - done) : (double)RKM__SOLVE_WORK;
    rkm__ask bases = {rkm__work_spent(pl) + (*p ? (uint64_t)(solve * RKM__OFFLOAD_BASE_WORK) : RKM__SOLVE_WORK),
                      RKM__SKIP_ILP | RKM__SKIP_PHASES | RKM__SKIP_MISSED};
    *p = rkm__faster(*p, q);
    q = NULL;
    if (!r && *p && (*p)->stats.time <= pl->base_time) {
        rkm_plan_destroy(x);
        return RKM_OK; /* nothing is faster */
    }
    double fwd = 0, bw = fmin(g->copy.d2h_bytes_per_second, g->copy.h2d_bytes_per_second);
    for (size_t i = 0; i < g->n_ops; i++) fwd += g->ops[i].fwd;
    double up = fmin((double)budget + RKM__OFFLOAD_HIDE * bw * fwd, sqrt((double)budget * (double)pl->base_peak));
    for (int k = 0; k < RKM__OFFLOAD_BASES && !q && !r && (k == 0 || rkm__work_spent(pl) < bases.work_end); k++) {
        r = rkm__planner_fit(pl, (uint64_t)up, bases, &base, NULL);
        if (!r && base) r = rkm__offload_try(pl, base, budget, NULL, &q, &x);
        /* no plan there (below the recompute-only floor): more memory;
         * copies that do not fit: less */
        up = base ? (double)budget + (up - (double)budget) / 4 : (up + (double)pl->base_peak) / 2;
        rkm_plan_destroy(base);
        base = NULL;
    }
    uint64_t min;
    if (!r && !*p && !q && !(r = rkm__min_budget_get(pl, &min)) && pl->min_plan && budget < min)
        r = rkm__offload_exposed(pl, pl->min_plan, budget, NULL, &q); /* below the floor: offload what its peak holds */
    *p = rkm__faster(*p, rkm__faster(q, x));
    rkm_plan *d = NULL, *c = NULL;
    if (!r) r = rkm__dtr_offloads(pl, budget, *p ? (*p)->stats.time : INFINITY, &d);
    *p = rkm__faster(*p, d);
    if (!r) r = rkm__chain_offloads(pl, budget, *p ? (*p)->stats.time : INFINITY, &c);
    *p = rkm__faster(*p, c);
    if (!r && *p) r = rkm__offload_moves(pl, budget, (uint64_t)(solve * RKM__OFFLOAD_MOVES_WORK), p);
    if (r) { /* nothing half-built: the plan taken goes too */
        rkm_plan_destroy(*p);
        *p = NULL;
    }
    return r;
}

/* Checkmate's plan with copies (*p) against the plan it hands out where
 * it finds none at the budget: its recompute-only floor's, kept where it
 * fits and is faster. The ILP counts memory conservatively (a forward's scratch on
 * every run), so its recompute-only solve can find nothing at a budget
 * that a plan made for more memory fits (inplace-split at 93 %: 13.02 %
 * overhead from the smallest budget's plan, 26.01 % with copies at
 * 100 MB/s). */
RKM__PRIVATE rkm_result rkm__checkmate_fallback(rkm_planner *pl, uint64_t budget, rkm_plan **p)
{
    uint64_t min;
    rkm_result r = rkm__min_budget_get(pl, &min);
    const rkm_plan *m = pl->min_plan;
    if (r || !m || m->stats.stage_arena_bytes > budget || !(m->stats.time < (*p)->stats.time)) return r;
    rkm_plan *q;
    if ((r = rkm__plan_copy(m, &q))) return r;
    rkm_plan_destroy(*p);
    *p = q;
    return RKM_OK;
}
