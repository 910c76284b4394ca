/* produce.c -- the planner's plans for a budget: chain DP and sqrt, DTR, with copies; births, handouts
 *
 * Uses (through internal.h): base.c, graph.c, plan.c, sim.c, layout.c, baseline.c, options.c, chain.c, dtr.c,
 * progress.c.
 *
 * The lower half of the planner: what rkm_planner's set-up leaves (block
 * options, the chain in slots, the DP table: planner.c) turned into plans
 * for a budget, the producers that the search, nesting, offloading and
 * the top drivers (drive.c) call. */
#include "internal.h"

/* Budgets and DP slots (planner.c converts bytes: rkm__slots_up): a slot
 * is pl->q bytes above the input tensors (always live). */

/* The most slots the chain DP's table holds: d.slots, fewer where the time
 * limit cut its solve. */
static int32_t rkm__top_slots(const rkm_planner *pl) { return pl->table.n ? pl->table.M : pl->d.slots; }

/* The slots a budget (absolute bytes) affords, rounded down and at most the
 * table's; -1 when the inputs alone do not fit. */
static int64_t rkm__budget_slots(const rkm_planner *pl, uint64_t budget)
{
    if (budget < pl->g->input_bytes) return -1;
    uint64_t m = (budget - pl->g->input_bytes) / pl->q;
    return m > (uint64_t)rkm__top_slots(pl) ? rkm__top_slots(pl) : (int64_t)m;
}

/* The absolute bytes of m slots: the budget they stand for. */
RKM__PRIVATE uint64_t rkm__slots_budget(const rkm_planner *pl, int64_t m) { return pl->g->input_bytes + (uint64_t)m * pl->q; }

/* Turn block-level operations into graph-level steps. */
static rkm_result rkm__flatten(const rkm_planner *pl, const rkm__dp_op *ops, size_t n, rkm__steps *p)
{
    const rkm_graph *g = pl->g;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        const rkm__bopts *bo = &pl->bo[ops[i].block];
        int32_t in = g->blocks[ops[i].block].in; /* x_{block-1} */
        const rkm_step *s = NULL;
        size_t m = 0;
        switch (ops[i].kind) {
        case RKM__DP_FWD_OPT: s = bo->opt[ops[i].option].steps, m = bo->opt[ops[i].option].n_fwd; break;
        case RKM__DP_BWD_OPT:
            s = bo->opt[ops[i].option].steps + bo->opt[ops[i].option].n_fwd, m = bo->opt[ops[i].option].n_bwd;
            break;
        case RKM__DP_FWD_NOSAVE: s = bo->nosave, m = bo->n_nosave; break;
        case RKM__DP_FREE_OUT: ok = rkm__steps_push(p, RKM_STEP_FREE, g->blocks[ops[i].block].out, 0); break;
        case RKM__DP_OFFLOAD_IN: ok = rkm__steps_push(p, RKM_STEP_OFFLOAD, in, 0); break;
        case RKM__DP_DROP_IN: ok = rkm__steps_push(p, RKM_STEP_WAIT, in, 0) && rkm__steps_push(p, RKM_STEP_FREE, in, 0); break;
        case RKM__DP_FETCH_IN:
            ok = rkm__steps_push(p, RKM_STEP_PREFETCH, in, 0) && rkm__steps_push(p, RKM_STEP_WAIT, in, 0) &&
                 rkm__steps_push(p, RKM_STEP_FREE_HOST, in, 0);
            break;
        }
        for (size_t k = 0; k < m && ok; k++) ok = rkm__steps_push(p, s[k].kind, s[k].index, s[k].save);
    }
    return ok ? RKM_OK : rkm__nomem(pl->ctx, "plan");
}

/* Add a schedule found on block `from` to every block of its class. */
RKM__PRIVATE rkm_result rkm__class_add(rkm_planner *pl, rkm__sim *s, const rkm__block *from, const rkm_step *steps, size_t nf,
                                 size_t nb)
{
    const rkm_graph *g = pl->g;
    for (int32_t k = 0; k < g->n_blocks; k++) {
        if (g->blocks[k].cls != from->cls) continue;
        rkm__option o;
        memset(&o, 0, sizeof o);
        o.n_fwd = nf;
        o.n_bwd = nb;
        o.steps = rkm__alloc(pl->ctx, (nf + nb) * sizeof *o.steps);
        if (!o.steps) return rkm__nomem(pl->ctx, "block options");
        for (size_t t = 0; t < nf + nb; t++) o.steps[t] = rkm__map_step(g, from, &g->blocks[k], steps[t]);
        int valid;
        if (!rkm__bopts_add(pl->ctx, s, &g->blocks[k], &pl->bo[k], &o, &valid)) return rkm__nomem(pl->ctx, "block options");
    }
    return RKM_OK;
}

/* The planner's memory, freed: rkm_planner_destroy's, and a nested
 * planner's (nest.c). */
RKM__PRIVATE void rkm__planner_free(rkm_planner *pl)
{
    if (!pl) return;
    if (pl->bo)
        for (int32_t b = 0; b < pl->g->n_blocks; b++) rkm__bopts_free(pl->ctx, &pl->bo[b]);
    rkm__free(pl->ctx, pl->bo, (size_t)pl->g->n_blocks * sizeof *pl->bo);
    rkm__free(pl->ctx, pl->dpb, (size_t)pl->g->n_blocks * sizeof *pl->dpb);
    rkm__free(pl->ctx, pl->dpo, pl->n_dpo * sizeof *pl->dpo);
    rkm__dp_table_free(pl->ctx, &pl->table);
    rkm__free(pl->ctx, pl->off_dpb, (size_t)pl->g->n_blocks * sizeof *pl->off_dpb);
    rkm__dp_table_free(pl->ctx, &pl->off_table);
    rkm_plan_destroy(pl->min_plan);
    rkm_plan_destroy(pl->off_min_plan);
    rkm_graph_destroy(pl->own);
    rkm__graph_free_holder(pl->ctx, pl, sizeof *pl, pl->user);
}

/* Birth of a draft the planner made for g (its graph, or a block's as a
 * graph of its own), taken: an invalid one is a bug. */
RKM__PRIVATE rkm_result rkm__draft_birth(rkm_planner *pl, const rkm_graph *g, rkm__steps *draft, rkm_plan **out)
{
    rkm_result r = rkm__lower_inplace(g, draft);
    if (r) {
        rkm__steps_free(draft);
        return r;
    }
    r = rkm__plan_birth(g, draft, NULL, out);
    if (r != RKM_ERROR_PLAN) return r;
    char why[RKM__ERRMSG_SIZE];
    snprintf(why, sizeof why, "%s", rkm_context_errmsg(pl->ctx));
    return rkm__err(pl->ctx, RKM_ERROR_INTERNAL, "internal error: the %s plan does not replay: %s",
                    rkm_algo_name(pl->d.algo), why);
}

/* Birth of a draft of the planner's graph (taken), its progress noted. */
RKM__PRIVATE rkm_result rkm__planned_birth(rkm_planner *pl, rkm__steps *draft, rkm_plan **out)
{
    rkm_result r = rkm__draft_birth(pl, pl->g, draft, out);
    if (!r) rkm__progress_plan(pl, *out);
    return r;
}

/* *out (a plan of the user's graph) laid out at the desc's alignment, on
 * the call's meter, with its figures as a stage of d.in_flight (the order
 * F0 .. Fk-1 B0 .. Bk-1 holds k as 1F1B's and GPipe's do, so its figures
 * are theirs); destroyed, *out NULL, on failure. */
RKM__PRIVATE rkm_result rkm__handout_seal(rkm_planner *pl, rkm_plan **out)
{
    uint64_t work = rkm__work_left(pl);
    rkm_result r = rkm__plan_seal(*out, pl->d.alignment, &work);
    rkm__work_charge(pl, work);
    int32_t k = pl->d.in_flight;
    rkm_stage_memory sm;
    if (!r && k > 1 && !(r = rkm__stage_memory(*out, k - 1, k, pl->d.alignment, NULL, &sm))) {
        (*out)->stats.in_flight = k;
        (*out)->stats.stage_peak = sm.peak;
        (*out)->stats.stage_arena_bytes = sm.arena_bytes;
    }
    if (r) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* The planner's plan p (kept), of the aligned graph, born on the user's
 * graph (pl->g != pl->user). */
static rkm_result rkm__user_birth(rkm_planner *pl, const rkm_plan *p, rkm_plan **out)
{
    rkm__steps d;
    rkm_result r = rkm__steps_copy(pl->ctx, p->steps, p->n_steps, &d, "plan");
    if (!r && (r = rkm__plan_birth(pl->user, &d, NULL, out)) == RKM_ERROR_PLAN)
        r = rkm__err(pl->ctx, RKM_ERROR_INTERNAL, "internal error: the %s plan does not replay on the user's graph",
                     rkm_algo_name(pl->d.algo));
    return r;
}

/* The planner's plan p (taken) as the host gets it: born on the user's
 * graph (p is of the aligned one, unless they are the same) and laid out
 * at the desc's alignment. */
RKM__PRIVATE rkm_result rkm__planner_handout(rkm_planner *pl, rkm_plan *p, rkm_plan **out)
{
    *out = NULL;
    rkm_result r = RKM_OK;
    if (pl->g != pl->user) {
        r = rkm__user_birth(pl, p, out);
        if (!r) (*out)->stats.gap = p->stats.gap;
        rkm_plan_destroy(p);
        if (r) return r;
    } else
        *out = p;
    return rkm__handout_seal(pl, out);
}

/* The arena plan p (kept) would have as the host gets it. */
RKM__PRIVATE rkm_result rkm__planner_arena(rkm_planner *pl, const rkm_plan *p, uint64_t *arena)
{
    rkm_plan *c, *q;
    rkm_result r = rkm__plan_copy(p, &c);
    if (!r && !(r = rkm__planner_handout(pl, c, &q))) {
        *arena = q->stats.stage_arena_bytes;
        rkm_plan_destroy(q);
    }
    return r;
}

/* The stage arena of plan p of the planner's graph (d.in_flight > 1) as
 * the host gets it (rkm__handout_seal's), without the plan's own layout,
 * which the stage's does not read: p born on the user's graph (whose
 * input may have a gradient that the planner's has not), its buffers
 * rounded up to the alignment. */
RKM__PRIVATE rkm_result rkm__stage_arena(rkm_planner *pl, const rkm_plan *p, uint64_t *arena)
{
    rkm_stage_memory sm;
    rkm_plan *u = NULL;
    int32_t k = pl->d.in_flight;
    rkm_result r = pl->g != pl->user ? rkm__user_birth(pl, p, &u) : RKM_OK;
    if (!r) r = rkm__stage_memory(u ? u : p, k - 1, k, pl->d.alignment, NULL, &sm);
    rkm_plan_destroy(u);
    *arena = r ? UINT64_MAX : sm.arena_bytes;
    return r;
}

/* Plan p (taken) as the host gets it into *out where its arena fits the
 * budget; else *out NULL and *arena (if not NULL) that arena. */
RKM__PRIVATE rkm_result rkm__handout_within(rkm_planner *pl, rkm_plan *p, uint64_t budget, rkm_plan **out, uint64_t *arena)
{
    rkm_result r = rkm__planner_handout(pl, p, out);
    if (!r && (*out)->stats.stage_arena_bytes > budget) {
        if (arena) *arena = (*out)->stats.stage_arena_bytes;
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* ---- plan again for less ---------------------------------------------------
 *
 * A plan made for budget b whose arena (as the host gets it) is over the
 * budget, its peak within it: the layout missed the aligned peak by more
 * than the room left, so the next try asks for that much less, below the
 * plan's own aligned peak (a budget between the two gives the same plan).
 * One loop for every maker of plans (the planner's algorithm, the offload
 * pass): RKM__LAYOUT_TRIES tries at most, while the call has work and time
 * (the first try always: each ends in a layout, which nothing cuts). */

/* The budget to ask for after a plan made for `asked` (aligned peak
 * `peak`; a stage's: its stage peak) laid out in `arena` over `budget`; 0:
 * nothing below. */
RKM__PRIVATE uint64_t rkm__less(uint64_t asked, uint64_t peak, uint64_t arena, uint64_t budget)
{
    uint64_t below = peak < asked ? peak : asked, over = arena - budget;
    return below > over ? below - over : 0;
}

/* The plan of `make` whose arena fits `budget`, or *out NULL; *need (if
 * not NULL): the least arena of the plans that did not fit, 0 if none. */
RKM__PRIVATE rkm_result rkm__fit_less(rkm_planner *pl, uint64_t budget, rkm__maker make, void *arg, rkm_plan **out,
                                     uint64_t *need)
{
    *out = NULL;
    if (need) *need = 0;
    uint64_t b = budget, over = 0; /* over: the least budget asked whose plan's arena was over */
    for (int k = 0; k < RKM__LAYOUT_TRIES && b && (k == 0 || !rkm__over(pl)); k++) {
        rkm_plan *q;
        rkm_result r = make(pl, b, arg, &q);
        if (r || !q) return r;
        uint64_t arena = q->stats.stage_arena_bytes;
        if (arena <= budget) {
            *out = q;
            break;
        }
        if (need && (!*need || arena < *need)) *need = arena;
        over = b;
        b = rkm__less(b, q->stats.in_flight > 1 ? q->stats.stage_peak : q->stats.aligned_peak, arena, budget);
        rkm_plan_destroy(q);
    }
    /* A stage's arena is further from its peak (a slot per micro-batch in
     * flight): bisect between the largest budget asked that fit and the
     * least that did not, for a faster plan or a first one. */
    uint64_t lo = *out ? b : 0, hi = over;
    for (int k = 0; pl->d.in_flight > 1 && hi > lo + hi / 256 && k < RKM__SHARE_TRIES && !rkm__over(pl); k++) {
        uint64_t at = lo + (hi - lo) / 2;
        rkm_plan *q;
        rkm_result r = make(pl, at, arg, &q);
        if (r) {
            rkm_plan_destroy(*out);
            *out = NULL;
            return r;
        }
        if (!q) { /* below what the maker meets: nothing lower will do */
            lo = at;
            continue;
        }
        if (q->stats.stage_arena_bytes <= budget) {
            *out = rkm__faster(*out, q);
            lo = at;
        } else {
            if (need && (!*need || q->stats.stage_arena_bytes < *need)) *need = q->stats.stage_arena_bytes;
            hi = at;
            rkm_plan_destroy(q);
        }
    }
    return RKM_OK;
}

/* ---- a stage's share -------------------------------------------------------
 *
 * A planner of one micro-batch (the chain DP, DTR, the fixed schedules)
 * planning a pipeline stage of k in flight (pl->d.in_flight): a plan within
 * budget / k always fits the stage's budget (what a micro-batch keeps is
 * within its peak, so k of them and one peak are within k peaks), a larger
 * one may too, and be faster. So the stage's plan is the fastest of the
 * planner's plans for one-micro-batch budgets between the two whose stage
 * peak (rkm__stage_peak) fits: from the budget itself down, bisecting
 * between the largest one that fits and the smallest that does not (a
 * budget with no plan counts as too small), RKM__SHARE_TRIES plans. *one:
 * the largest one-micro-batch budget that gave a fitting plan (budget / k
 * where none did). k = 1: make's plan for the budget. */
RKM__PRIVATE rkm_result rkm__stage_share(rkm_planner *pl, uint64_t budget, rkm__maker make, void *arg, rkm_plan **out,
                                        uint64_t *one)
{
    int32_t k = pl->d.in_flight;
    *out = NULL;
    if (one) *one = budget;
    if (k <= 1) return make(pl, budget, arg, out);
    uint64_t lo = budget / (uint64_t)k, hi = budget, fit = lo;
    rkm_result r = RKM_OK;
    for (int t = 0; t < RKM__SHARE_TRIES && !r && (t == 0 || (hi > lo + 1 && !rkm__over(pl))); t++) {
        uint64_t at = t == 0 ? hi : t == 1 ? lo : lo + (hi - lo) / 2;
        rkm_plan *p = NULL;
        if ((r = make(pl, at, arg, &p))) break;
        if (p && rkm__stage_peak(p, k) <= budget) {
            *out = rkm__faster(*out, p);
            fit = lo = at;
            if (t == 0) break; /* the budget's own plan: nothing above it */
        } else {
            if (p) hi = at; /* over: a smaller share */
            else lo = at;   /* no plan: too small a share, a larger one */
            rkm_plan_destroy(p);
        }
    }
    if (one) *one = fit;
    if (r) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* A draft from a block-level schedule; freed on failure. */
static rkm_result rkm__draft_from_ops(rkm_planner *pl, const rkm__dp_ops *ops, rkm__steps *d)
{
    rkm_result r = rkm__flatten(pl, ops->v, ops->n, d);
    if (r) rkm__steps_free(d);
    return r;
}

/* The chain's block-level schedule (rule: RKM__CHAIN_*) for m slots into
 * ops, or ops empty when it has none. */
static rkm_result rkm__chain_ops(rkm_planner *pl, int rule, int64_t m, rkm__dp_ops *ops)
{
    const rkm_graph *g = pl->g;
    if (rule == RKM__CHAIN_SQRT || rule == RKM__CHAIN_FULL)
        return rkm__dp_sqrt(pl->ctx, pl->dpb, g->n_blocks, rule == RKM__CHAIN_FULL, ops);
    rkm__dp_table *tb = rule == RKM__CHAIN_OFF ? &pl->off_table : &pl->table;
    const rkm__dp_block *bl = rule == RKM__CHAIN_OFF ? pl->off_dpb : pl->dpb;
    if (!tb->n) return RKM_OK; /* left out: over RKM__DP_MAX_BYTES */
    if (m > tb->M) m = tb->M;
    double opt = rkm__dp_opt(tb, 0, g->n_blocks - 1, (int32_t)m), t = 0;
    int64_t peak = 0;
    if (!isfinite(opt)) return RKM_OK;
    rkm_result r = rkm__dp_schedule(pl->ctx, tb, (int32_t)m, ops);
    /* The block-level schedule must be the DP's own answer (its time is
     * summed in another order, hence the relative tolerance). */
    if (!r) r = rkm__dp_eval(pl->ctx, bl, g->n_blocks, ops, &t, &peak);
    if (!r && (fabs(t - opt) > 1e-9 * opt || peak > (int64_t)m))
        r = rkm__err(pl->ctx, RKM_ERROR_INTERNAL, "internal error: chain DP schedule takes %g s and %lld slots, not %g s in %llu",
                     t, (long long)peak, opt, (unsigned long long)m);
    return r;
}

/* The chain's plan for `budget` (rule: RKM__CHAIN_*), or *out NULL when it
 * has none. */
RKM__PRIVATE rkm_result rkm__solve_chain(rkm_planner *pl, int rule, uint64_t budget, rkm_plan **out)
{
    *out = NULL;
    int64_t m = rkm__budget_slots(pl, budget);
    if (m < 0) return RKM_OK;
    rkm__dp_ops ops = {NULL, 0, 0};
    rkm__steps d = {pl->ctx, NULL, 0, 0};
    rkm_result r = rkm__chain_ops(pl, rule, m, &ops);
    if (!r && ops.n) r = rkm__draft_from_ops(pl, &ops, &d);
    rkm__dp_ops_free(pl->ctx, &ops);
    if (!r && d.n) r = rkm__planned_birth(pl, &d, out);
    if (!r && *out && (*out)->stats.peak > budget) { /* sqrt: a fixed schedule fits or not */
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* The faster of the chain's fixed schedules (sqrt's segments, full's
 * blocks) whose peak fits `budget` (rkm__maker; arg unused). */
static rkm_result rkm__fixed_maker(rkm_planner *pl, uint64_t budget, void *arg, rkm_plan **out)
{
    (void)arg;
    rkm_plan *full = NULL;
    rkm_result r = rkm__solve_chain(pl, RKM__CHAIN_SQRT, budget, out);
    if (!r) r = rkm__solve_chain(pl, RKM__CHAIN_FULL, budget, &full);
    *out = rkm__faster(*out, full);
    return r;
}

/* The faster of the chain's fixed schedules that fits `budget`, a stage's
 * by its stage peak (rkm__stage_share), or *out NULL. */
RKM__PRIVATE rkm_result rkm__solve_fixed(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    return rkm__stage_share(pl, budget, rkm__fixed_maker, NULL, out, NULL);
}

/* The chain DP's floor: the least peak among its plans for the smallest
 * feasible slot budget and the RKM__SLOTS_UP above it, and that budget.
 * Computed once; 0 when the DP has no plan at all. */
RKM__PRIVATE rkm_result rkm__chain_floor(rkm_planner *pl, uint64_t *peak, int64_t *slots)
{
    if (!pl->chain_floor && pl->table.n) {
        int64_t m = 0;
        rkm_result r = rkm__dp_min_slots(pl->ctx, pl->dpb, pl->g->n_blocks, &m);
        if (r == RKM_ERROR_BUDGET) r = RKM_OK; /* no DP plan */
        for (int64_t k = m; !r && m > 0 && k <= m + RKM__SLOTS_UP && k <= rkm__top_slots(pl); k++) {
            rkm_plan *p;
            r = rkm__solve_chain(pl, RKM__CHAIN_DP, rkm__slots_budget(pl, k), &p);
            if (!r && p && (!pl->chain_floor || p->stats.peak < pl->chain_floor)) {
                pl->chain_floor = p->stats.peak;
                pl->chain_floor_slots = k;
            }
            rkm_plan_destroy(p);
        }
        if (r) return r;
    }
    *peak = pl->chain_floor;
    *slots = pl->chain_floor_slots;
    return RKM_OK;
}

/* The chain DP's plan for `budget`: below the DP's own slot budget but at
 * or above its floor, the floor's plan, so that every budget from the
 * reported floor up has a plan. */
RKM__PRIVATE rkm_result rkm__solve_dp_at(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    rkm_result r = rkm__solve_chain(pl, RKM__CHAIN_DP, budget, out);
    uint64_t floor;
    int64_t slots;
    if (r || *out || (r = rkm__chain_floor(pl, &floor, &slots)) || !floor || budget < floor) return r;
    return rkm__solve_chain(pl, RKM__CHAIN_DP, rkm__slots_budget(pl, slots), out);
}

/* The fastest of the chain DP's plans for the RKM__SLOTS_UP slot budgets
 * above `budget`'s own that still peak within it, when faster than `own`
 * (rkm__solve_dp_at's plan), else *out NULL. Sizes round up to slots one
 * by one, so a plan for more slots than the budget affords often fits it
 * in bytes (on mlp16 at 36.85 %: 51.4 % overhead for 2 slots more, against
 * 75.7 %). Only slot budgets where the DP's time falls are flattened. */
RKM__PRIVATE rkm_result rkm__solve_dp_up(rkm_planner *pl, uint64_t budget, const rkm_plan *own, rkm_plan **out)
{
    *out = NULL;
    int64_t m = rkm__budget_slots(pl, budget);
    if (!own || m < 0) return RKM_OK; /* below the floor: none, as the floor says */
    double last = rkm__dp_opt(&pl->table, 0, pl->g->n_blocks - 1, (int32_t)m);
    rkm_result r = RKM_OK;
    for (int64_t k = m + 1; k <= m + RKM__SLOTS_UP && k <= rkm__top_slots(pl) && !r; k++) {
        double opt = rkm__dp_opt(&pl->table, 0, pl->g->n_blocks - 1, (int32_t)k);
        if (!(opt < last)) continue;
        last = opt;
        rkm_plan *p = NULL;
        r = rkm__solve_chain(pl, RKM__CHAIN_DP, rkm__slots_budget(pl, k), &p);
        if (p && (p->stats.peak > budget || !(p->stats.time < own->stats.time))) {
            rkm_plan_destroy(p);
            p = NULL;
        }
        *out = rkm__faster(*out, p);
    }
    return r;
}

/* The chain DP's plan for `budget`: the faster of rkm__solve_dp_at's and
 * rkm__solve_dp_up's. Below the floor there is still no plan (the floor
 * stays the smallest budget met); above it the result is monotone in the
 * budget: a larger one tries the same slot budgets or ones the DP says are
 * faster. */
RKM__PRIVATE rkm_result rkm__solve_dp(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    rkm_plan *up = NULL;
    rkm_result r = rkm__solve_dp_at(pl, budget, out);
    if (!r) r = rkm__solve_dp_up(pl, budget, *out, &up);
    *out = rkm__faster(up, *out);
    return r;
}

/* A bytes-mode plan stays only if its layout fits the budget (*p NULL
 * otherwise; then it goes to *missed, the faster, where that is not NULL):
 * where it does, it is often faster than the allocator's, which evicts to
 * make holes a placer that knows every lifetime does not need. The skyline
 * and first fit only (the search's work, on every candidate, made the
 * planner fuzzer 8x slower); the plan's own layout at its birth is never
 * worse. */
static rkm_result rkm__dtr_fits(rkm_planner *pl, uint64_t budget, rkm_plan **p, rkm_plan **missed)
{
    size_t n = (*p)->n_buffers;
    rkm_buffer *b = rkm__alloc(pl->ctx, (n + 1) * sizeof *b);
    uint64_t arena = UINT64_MAX, peak;
    rkm_result r = b ? RKM_OK : rkm__nomem(pl->ctx, "dtr layout");
    if (b) memcpy(b, (*p)->buffers, n * sizeof *b);
    uint64_t work = rkm__work_left(pl);
    if (!r && rkm__layout(pl->ctx, b, n, pl->d.alignment, RKM__LAY_SKYLINE, &work, &arena, &peak))
        r = rkm__nomem(pl->ctx, "dtr layout");
    if (!r) rkm__work_charge(pl, work);
    rkm__free(pl->ctx, b, (n + 1) * sizeof *b);
    if (r || arena > budget) {
        if (!r && missed) *missed = rkm__faster(*missed, *p);
        else rkm_plan_destroy(*p);
        *p = NULL;
    }
    return r;
}

/* DTR's plan *p with its prefetches moved ahead of need (rkm__dtr_hoist),
 * where that is faster and its layout fits the budget (moving them breaks
 * DTR's own allocator's guarantee); else *p as it was. */
static rkm_result rkm__dtr_ahead(rkm_planner *pl, uint64_t budget, rkm_plan **p)
{
    rkm__steps d = {pl->ctx, NULL, 0, 0};
    rkm_plan *q = NULL;
    rkm_result r = rkm__dtr_hoist(*p, budget, &d);
    if (!r && d.n) r = rkm__planned_birth(pl, &d, &q);
    else rkm__steps_free(&d);
    if (!r && q) r = rkm__dtr_fits(pl, budget, &q, NULL);
    *p = rkm__faster(*p, q);
    return r;
}

/* DTR's run with eviction score `score`, in bytes mode or not, with copy
 * set `copies` (rkm__dtr_steps), into *out where it is faster than *out
 * and than `bound` (a run whose clock passes either stops there: a
 * thrashing one would run to max_steps). missed as in rkm__dtr_plan. */
static rkm_result rkm__dtr_one(rkm_planner *pl, uint64_t budget, int score, int bytes, int copies, double bound,
                               rkm_plan **out, rkm_plan **missed)
{
    rkm__steps d = {pl->ctx, NULL, 0, 0};
    rkm_plan *p = NULL;
    uint64_t work = rkm__work_left(pl);
    rkm_result r = rkm__dtr_steps(pl->g, budget, score, bytes, copies, *out ? fmin(bound, (*out)->stats.time) : bound,
                                  &work, &d);
    rkm__work_charge(pl, work);
    if (!r && d.n) r = rkm__planned_birth(pl, &d, &p);
    if (!r && p && bytes) r = rkm__dtr_fits(pl, budget, &p, missed);
    if (!r && p && p->stats.offloads) r = rkm__dtr_ahead(pl, budget, &p);
    if (p && !(p->stats.time < bound)) {
        rkm_plan_destroy(p);
        p = NULL;
    }
    *out = rkm__faster(*out, p);
    return r;
}

/* DTR's runs with copy sets from..to - 1 (0: recompute-only), each
 * score on the allocator, then in bytes mode unless `first`; into *out
 * the fastest under `bound`, or NULL. first: stop at the first plan. On
 * an error, nothing. */
static rkm_result rkm__dtr_runs(rkm_planner *pl, uint64_t budget, int first, int from, int to, double bound,
                                rkm_plan **out, rkm_plan **missed)
{
    rkm_result r = RKM_OK;
    int runs = (first ? 1 : 2) * RKM__DTR_SCORES;
    *out = NULL;
    for (int k = from * runs; k < to * runs && !r && !(first && *out) && (k == from * runs || !rkm__over(pl)); k++)
        r = rkm__dtr_one(pl, budget, k % RKM__DTR_SCORES, k % runs >= RKM__DTR_SCORES, k / runs, bound, out, missed);
    if (r) {
        rkm_plan_destroy(*out);
        *out = NULL;
        if (missed) {
            rkm_plan_destroy(*missed);
            *missed = NULL;
        }
    }
    return r;
}

/* The fastest of DTR's plans for exactly `budget` (one per eviction score
 * on the allocator, then in bytes mode where the layout fits; for `--algo
 * dtr` on a graph with a copy link, all of those again four times with
 * evictions to host memory, at each price, with saved states too or
 * tensors only: dtr.c), or *out NULL where none
 * meets it. first: stop at the first plan (to learn whether there is one;
 * the allocator's only, without copies, then with). missed (if not NULL):
 * the fastest bytes-mode plan whose layout did not fit, or NULL. */
RKM__PRIVATE rkm_result rkm__dtr_plan(rkm_planner *pl, uint64_t budget, int first, rkm_plan **out, rkm_plan **missed)
{
    int sets = pl->d.algo == RKM_ALGO_DTR && pl->g->copy.d2h_bytes_per_second > 0 ? RKM__DTR_COPY_SETS : 1;
    return rkm__dtr_runs(pl, budget, first, 0, sets, INFINITY, out, missed);
}

/* DTR's plans with copies only (rockmate's candidates on a graph with a
 * link: its recompute-only ones are among its starts), the fastest under
 * `bound`, as the host gets it (rkm__planner_handout) where its arena
 * fits, into *out; else NULL. */
RKM__PRIVATE rkm_result rkm__dtr_offloads(rkm_planner *pl, uint64_t budget, double bound, rkm_plan **out)
{
    *out = NULL;
    if (!rkm__dtr_affordable(pl) || !(pl->g->copy.d2h_bytes_per_second > 0)) return RKM_OK;
    rkm_plan *p = NULL;
    rkm_result r = rkm__dtr_runs(pl, budget, 0, 1, RKM__DTR_COPY_SETS, bound, &p, NULL);
    return r || !p ? r : rkm__handout_within(pl, p, budget, out, NULL);
}

/* The chain with its block inputs free to wait in host memory (chain.c's
 * twins, the prefetch priced at RKM__PREFETCH_PRICE of its copy: the plan's
 * prefetches are moved ahead after, where they hide) and its table for m
 * slots at least: made at the first solve that offloads, again for more
 * slots (a column depends on those before it only, so a table for fewer
 * slots holds the same values: no plan depends on the order of the
 * calls). A table cut by the deadline is not kept (a later call would plan
 * on the clock's table without being cut). */
static rkm_result rkm__chain_off(rkm_planner *pl, int64_t m)
{
    const rkm_graph *g = pl->g;
    size_t n = (size_t)g->n_blocks;
    if ((pl->off_table.n && pl->off_table.M >= m) || !pl->table.n || m < 0) return RKM_OK;
    if (!pl->off_dpb) {
        if (!(pl->off_dpb = rkm__alloc(pl->ctx, n * sizeof *pl->off_dpb))) return rkm__nomem(pl->ctx, "chain DP");
        for (size_t b = 0; b < n; b++) {
            rkm__dp_block *x = &pl->off_dpb[b];
            int32_t in = g->blocks[b].in;
            *x = pl->dpb[b];
            if (in < 0 || !x->in_sz || (g->tensors[in].flags & RKM_TENSOR_INPUT)) continue;
            x->to_host = rkm__copy_seconds(g, in, g->copy.d2h_bytes_per_second);
            x->from_host = rkm__copy_seconds(g, in, g->copy.h2d_bytes_per_second) * RKM__PREFETCH_PRICE;
        }
    }
    rkm__dp_table_free(pl->ctx, &pl->off_table);
    if (rkm__dp_bytes(pl->off_dpb, (int32_t)n, (int32_t)m) > RKM__DP_MAX_BYTES) return RKM_OK;
    int cut;
    rkm_result r = rkm__dp_solve(pl->ctx, pl->off_dpb, (int32_t)n, (int32_t)m, rkm__over(pl) ? -INFINITY : pl->deadline,
                                 &pl->off_table, &cut);
    if (!r && cut) rkm__dp_table_free(pl->ctx, &pl->off_table);
    pl->cut |= cut;
    return r;
}

/* What no chain plan with twins in m slots beats: the plain chain DP's
 * time in m + S slots, S every block input's (without its copies a twin
 * schedule is a plain one that holds at most S more), or where the table
 * does not reach there, the sum of each block's fastest option. */
static double rkm__chain_off_floor(const rkm_planner *pl, int64_t m)
{
    const rkm_graph *g = pl->g;
    double least = 0;
    for (int32_t b = 0; b < g->n_blocks; b++) {
        double f = INFINITY;
        for (int32_t k = 0; k < pl->dpb[b].n_opt; k++) f = fmin(f, pl->dpb[b].opt[k].tf + pl->dpb[b].opt[k].tb);
        least += f;
        m += pl->dpb[b].in_sz;
    }
    return m <= pl->table.M ? rkm__dp_opt(&pl->table, 0, g->n_blocks - 1, (int32_t)m) : least;
}

/* The chain DP's plan for `budget` with block inputs in host memory where
 * that is faster (chain.c's twins: each copy waited for before the segment
 * after it), where it has any, its prefetches then moved ahead where they
 * hide and the layout fits (rkm__dtr_ahead), as the host gets it; where
 * its arena misses the budget, the plan for that much less,
 * RKM__LAYOUT_TRIES times at most. *out NULL where none fits, or where no
 * such plan can be faster than `bound` (rkm__chain_off_floor: on
 * gpt2-xl-b4-t1024 with 25 GB/s the table took 0.11..0.14 s at 50..90 %,
 * where the pass's plans are within that floor). */
RKM__PRIVATE rkm_result rkm__chain_offloads(rkm_planner *pl, uint64_t budget, double bound, rkm_plan **out)
{
    *out = NULL;
    int64_t m = rkm__budget_slots(pl, budget);
    if (!(pl->g->copy.d2h_bytes_per_second > 0) || !pl->table.n || m < 0 || rkm__chain_off_floor(pl, m) >= bound)
        return RKM_OK;
    rkm_result r = rkm__chain_off(pl, m);
    uint64_t target = budget, arena = 0;
    for (int k = 0; k < RKM__LAYOUT_TRIES && !r && !*out && pl->off_table.n && (k == 0 || !rkm__over(pl)); k++) {
        rkm_plan *p = NULL;
        if (k > 0 && target <= arena - budget) break;
        if (k > 0) target -= arena - budget;
        r = rkm__solve_chain(pl, RKM__CHAIN_OFF, target, &p);
        if (!r && p && !p->stats.offloads) { /* the chain DP's own plan: rockmate's search starts there */
            rkm_plan_destroy(p);
            break;
        }
        if (!r && p) r = rkm__dtr_ahead(pl, budget, &p);
        if (r) rkm_plan_destroy(p); /* rkm__dtr_ahead keeps it on an error */
        if (r || !p) break;
        r = rkm__handout_within(pl, p, budget, out, &arena);
    }
    return r;
}

/* DTR's plan for `budget`, else for its smallest budget where that is
 * below; missed as in rkm__dtr_plan, for `budget` itself. */
RKM__PRIVATE rkm_result rkm__solve_dtr(rkm_planner *pl, uint64_t budget, rkm_plan **out, rkm_plan **missed)
{
    *out = NULL;
    if (missed) *missed = NULL;
    if (!rkm__dtr_affordable(pl)) return RKM_OK;
    rkm_result r = rkm__dtr_plan(pl, budget, 0, out, missed);
    if (r || *out || rkm__over(pl)) return r;
    uint64_t min;
    if ((r = rkm__dtr_min_budget(pl, &min)) || min > budget || rkm__over(pl)) return r;
    if ((r = rkm__dtr_plan(pl, min, 0, out, NULL)) || *out || rkm__over(pl)) return r;
    return rkm__dtr_plan(pl, pl->dtr_min_at, 1, out, NULL); /* the floor's own plan */
}

/* Whether rockmate tries DTR's plans: a DTR run is O(steps x live
 * buffers), which a long graph cannot afford among several candidates (a
 * chain of 20000 ops: 9 s a run); `--algo dtr` always runs. */
RKM__PRIVATE int rkm__dtr_affordable(const rkm_planner *pl)
{
    return pl->d.algo == RKM_ALGO_DTR || rkm__affords(pl->g, (int64_t)pl->g->n_ops, RKM__NEED_DTR);
}

/* The faster of two plans (a on a tie); the other is destroyed. */
RKM__PRIVATE rkm_plan *rkm__faster(rkm_plan *a, rkm_plan *b)
{
    if (!a || !b) return a ? a : b;
    int keep_a = a->stats.time <= b->stats.time;
    rkm_plan_destroy(keep_a ? b : a);
    return keep_a ? a : b;
}

/* *best becomes the faster of it and q (both taken; either may be NULL),
 * but in a pipeline stage's fit (pl->stage_cap) a plan whose arena fits
 * the stage's budget goes before one whose arena does not: a stage's peak
 * is only a lower bound of its arena. *took (if not NULL): q was kept. */
RKM__PRIVATE rkm_result rkm__prefer(rkm_planner *pl, rkm_plan **best, rkm_plan *q, int *took)
{
    uint64_t a = 0, b = 0;
    rkm_result r = RKM_OK;
    int take = q && (!*best || q->stats.time < (*best)->stats.time); /* rkm__faster's rule */
    if (pl->stage_cap && *best && q && !(r = rkm__stage_arena(pl, *best, &a)) && !(r = rkm__stage_arena(pl, q, &b)) &&
        (a <= pl->stage_cap) != (b <= pl->stage_cap))
        take = b <= pl->stage_cap;
    if (r) take = 0;
    if (took) *took = take;
    if (take) {
        rkm_plan_destroy(*best);
        *best = q;
    } else
        rkm_plan_destroy(q);
    return r;
}

/* One bisection serves every smallest-budget search: between lo and *hi
 * (a budget met), `probes` probes, none started past the deadline; a probe
 * that finds a plan at budget m sets *at = m and *hi = m, or the plan's
 * peak when by_peak (where every budget from a plan's peak on is met too);
 * one that finds none moves lo above m. Where success is not monotone in
 * the budget (DTR, the search) this is the least budget the probes met.
 * *stopped (if not NULL): the deadline ended it. */
RKM__PRIVATE rkm_result rkm__bisect(rkm_planner *pl, rkm__probe probe, void *arg, int probes, int by_peak, uint64_t lo,
                                   uint64_t *hi, uint64_t *at, int *stopped)
{
    rkm_result r = RKM_OK;
    int over = 0;
    double p0 = pl->prog.lo, p1 = pl->prog.hi;
    for (int it = 0; it < probes && lo < *hi && !r && !(over = rkm__over(pl)); it++) {
        rkm__progress_part(pl, p0 + (p1 - p0) * it / probes, p0 + (p1 - p0) * (it + 1) / probes);
        uint64_t mid = lo + (*hi - lo) / 2;
        rkm_plan *p = NULL;
        r = probe(pl, mid, arg, &p);
        if (!r && p) *hi = by_peak ? p->stats.peak : mid, *at = mid;
        else if (!r) lo = mid + 1;
        rkm_plan_destroy(p);
    }
    rkm__progress_part(pl, p0, p1);
    if (stopped) *stopped = over && pl->cut; /* spent work ends it as deterministically as the probes' count */
    return r;
}

/* DTR plans on an allocator of the budget's bytes: a plan's peak can be
 * below the arena it needed, so the budget, not the peak, is what is met. */
static rkm_result rkm__probe_dtr(rkm_planner *pl, uint64_t budget, void *arg, rkm_plan **out)
{
    (void)arg;
    return rkm__dtr_plan(pl, budget, 1, out, NULL);
}

/* DTR's smallest budget, kept after the first call the deadline did not
 * cut. */
RKM__PRIVATE rkm_result rkm__dtr_min_budget(rkm_planner *pl, uint64_t *out)
{
    if (!pl->dtr_min) {
        uint64_t hi = pl->base_peak, at = pl->base_peak;
        int stopped;
        rkm_result r = rkm__bisect(pl, rkm__probe_dtr, NULL, RKM__BISECT_DTR, 0, pl->lower_bound, &hi, &at, &stopped);
        if (r) return r;
        pl->dtr_min_at = at;
        if (stopped) { /* a cut bisection is not kept */
            *out = hi;
            return RKM_OK;
        }
        pl->dtr_min = hi;
    }
    *out = pl->dtr_min;
    return RKM_OK;
}
