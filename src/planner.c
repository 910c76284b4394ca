/* planner.c -- the planner: its API, every block's options, the drivers of solve and min_budget
 *
 * Uses (through internal.h): base.c, graph.c, plan.c, sim.c, layout.c, baseline.c, options.c, ilp.c, chain.c,
 * progress.c, produce.c, offload.c, search.c, nest.c.
 *
 * The top of the pipeline: rkm_planner_create (the desc's defaults, every
 * block's options from the block ILP, nesting and drop options, the chain
 * in DP slots and its table), then the drivers that pick among the plans
 * of the files below (produce.c, offload.c, search.c): a solve's plan
 * fitted to its arena, the smallest budget, and with a copy link the
 * bases offloaded. Nesting plans a block with a planner of its own:
 * nest.c gets rkm__planner_make handed down (rkm__planner_maker). */
#include "internal.h"

/* The planner's figures so far, ILP counters included. */
static void rkm__planner_figures(const rkm_planner *pl, rkm_planner_stats *st)
{
    memset(st, 0, sizeof *st);
    st->algo = pl->d.algo;
    st->blocks = pl->g->n_blocks;
    st->block_classes = pl->g->n_classes;
    st->options = (int32_t)pl->n_dpo;
    st->ilp_solves = pl->ilp.solves;
    st->ilp_optimal = pl->ilp.optimal;
    st->ilp_suboptimal = pl->ilp.suboptimal;
    st->ilp_infeasible = pl->ilp.infeasible;
    st->ilp_timeout = pl->ilp.timeout;
    st->ilp_failed = pl->ilp.failed;
    st->ilp_skipped = pl->ilp_skipped;
    st->ilp_seconds = pl->ilp.seconds;
    st->create_seconds = pl->create_seconds;
    st->nested_classes = pl->nested;
    st->cut = pl->cuts;
    st->work = pl->work_spent;
    st->work_limit = pl->work_limit;
}

/* ---- creation: every block's options, the chain in DP slots, its table --- */

static uint64_t rkm__ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

/* Bytes and DP slots: the planner's only conversions. A slot is pl->q
 * bytes above the input tensors (always live). */

/* Slots for a byte count, rounded up (so the DP never under-counts). */
static int32_t rkm__slots_up(const rkm_planner *pl, uint64_t bytes)
{
    uint64_t s = rkm__ceil_div(bytes, pl->q);
    return s > INT32_MAX / 4 ? INT32_MAX / 4 : (int32_t)s;
}

/* The DP's view of the chain: every figure converted to slots, the one
 * place where block figures (absolute bytes, options.c) become the DP's
 * (slots above the inputs, chain.c): tensor sizes round up on their own,
 * memory figures round up once the inputs are taken off. */
static rkm_result rkm__planner_chain(rkm_planner *pl)
{
    const rkm_graph *g = pl->g;
    size_t n_opt = 0;
    for (int32_t b = 0; b < g->n_blocks; b++) n_opt += pl->bo[b].n_opt;
    pl->dpb = rkm__calloc(pl->ctx, (size_t)g->n_blocks, sizeof *pl->dpb);
    pl->dpo = rkm__calloc(pl->ctx, n_opt, sizeof *pl->dpo);
    pl->n_dpo = n_opt;
    if (!pl->dpb || !pl->dpo) return rkm__nomem(pl->ctx, "planner");
    size_t at = 0;
    for (int32_t b = 0; b < g->n_blocks; b++) {
        const rkm__block *k = &g->blocks[b];
        const rkm__bopts *bo = &pl->bo[b];
        rkm__dp_block *x = &pl->dpb[b];
        x->in_sz = k->in >= 0 ? rkm__slots_up(pl, g->tensors[k->in].bytes) : 0;
        x->g_out = k->out != g->loss ? rkm__slots_up(pl, g->tensors[k->out].bytes) : 0;
        x->tfn = bo->tfn;
        x->pfn = rkm__slots_up(pl, bo->pfn - g->input_bytes);
        uint64_t out_bytes = g->tensors[k->out].bytes;
        x->opt = pl->dpo + at;
        x->n_opt = (int32_t)bo->n_opt;
        for (size_t i = 0; i < bo->n_opt; i++, at++) {
            const rkm__option *o = &bo->opt[i];
            rkm__dp_option *y = &pl->dpo[at];
            y->tf = o->tf;
            y->tb = o->tb;
            /* The DP's kept is besides x_{i-1} and x_i; x_in rounds up with
             * it, as the DP subtracts them together. */
            y->kept = rkm__slots_up(pl, o->kept - out_bytes - g->input_bytes) - x->in_sz;
            y->pf = rkm__slots_up(pl, o->pf - g->input_bytes);
            y->pb = rkm__slots_up(pl, o->pb - g->input_bytes);
        }
    }
    return RKM_OK;
}

RKM__PRIVATE double rkm__elapsed(const rkm_planner *pl) { return rkm__now() - pl->t0; }

/* ---- the work a call may do (the rule: internal.h, RKM__WORK_MIN) -------- */

/* W: a solve's work, from the graph's size alone. */
static uint64_t rkm__work_solve(const rkm_planner *pl)
{
    double w = (double)RKM__WORK_PER_OBJECT * (double)(pl->g->n_ops + pl->g->n_tensors);
    return w < (double)RKM__WORK_MIN ? RKM__WORK_MIN : w >= 0x1p62 ? (uint64_t)1 << 62 : (uint64_t)w;
}

/* Checkmate's ILP work a solve (half of time_limit, measured like
 * ilp_time_limit; as much again with copies), in the meter's units. */
static uint64_t rkm__work_checkmate(const rkm_planner *pl)
{
    if (pl->d.algo != RKM_ALGO_CHECKMATE) return 0;
    double s = pl->d.time_limit * RKM__CHECKMATE_SHARE * (rkm__offloads(pl) ? 2 : 1) * RKM__ILP_STEPS_PER_S;
    return s >= 0x1p62 ? (uint64_t)1 << 62 : (uint64_t)s;
}

/* The smallest budget's search: the same amount whichever call makes it,
 * so that its result does not depend on the order of the calls. */
static uint64_t rkm__work_min(const rkm_planner *pl)
{
    return RKM__WORK_MIN_BUDGET * rkm__work_solve(pl) + rkm__work_checkmate(pl);
}

/* What a call on the planner may still have to seek of the smallest
 * budget: the recompute-only one, then with a copy link the one below it. */
static uint64_t rkm__work_min_left(const rkm_planner *pl)
{
    return (pl->min_budget && !pl->min_cut ? 0 : rkm__work_min(pl)) +
           (rkm__offloads(pl) && !(pl->off_min && !pl->min_cut) ? rkm__work_min(pl) : 0);
}

/* A call on a made planner (solve, min_budget) starts at `now`: it gets
 * what the planner's creation left of time_limit, so that creation and
 * the call together, one plan's planning, stay within it. */
static void rkm__call_start(rkm_planner *pl, double now, rkm_stage stage, uint64_t budget)
{
    pl->deadline = now + (pl->d.time_limit - pl->create_seconds);
    pl->cut = 0;
    rkm__work_start(pl, (stage == RKM_STAGE_SOLVE ? rkm__work_solve(pl) + rkm__work_checkmate(pl) : 0) +
                            rkm__work_min_left(pl));
    rkm__progress_begin(pl, stage, budget);
}

/* Peak a block's ops need at least: the inputs stay live throughout, plus
 * the largest single step. */
static uint64_t rkm__block_floor(const rkm_graph *g, const rkm__block *b)
{
    uint64_t need = 0;
    for (int32_t i = b->ops[0]; i <= b->ops[b->n_ops - 1]; i++) {
        const rkm__op *o = &g->ops[i];
        uint64_t f = rkm__bytes_union(g, o->in, o->n_in, o->out, o->n_out, 0) + rkm__fwd_ws_most(o);
        uint64_t k = o->has_bwd ? rkm__bytes_union(g, o->saved, o->n_saved, NULL, 0, 0) + o->phantom + o->bwd_ws +
                                      rkm__bytes_union(g, o->out, o->n_out, o->in, o->n_in, 1)
                                : 0;
        if (f > need) need = f;
        if (k > need) need = k;
    }
    return g->input_bytes + need;
}

/* A class's claim on the block ILP budget: its blocks' forward time (what
 * recomputing can cost, so what a better option can save) times its ops
 * (what a solve of its block takes); never 0 for a block with ops. */
static double rkm__class_weight(const rkm_planner *pl, int32_t cls)
{
    const rkm_graph *g = pl->g;
    double w = 0;
    for (int32_t k = 0; k < g->n_blocks; k++) {
        const rkm__block *b = &g->blocks[k];
        if (b->cls != cls) continue;
        double fwd = pl->base_time * 1e-6;
        for (int32_t j = 0; j < b->n_ops; j++) fwd += g->ops[b->ops[j]].fwd;
        w += fwd * b->n_ops;
    }
    return w;
}

/* A grid of block ILP solves for block b's class: np peak budgets from
 * peak_lo to peak_hi by nk kept budgets from kept_lo to the baseline's
 * kept, each solve at most `lim` seconds of work and what is left of the
 * class's share `allow` (spent: pl->ilp.work - work0). Every schedule is
 * replayed on every block of the class (mapped op for op) and replay
 * decides what becomes an option. Per peak budget (a row) the kept budgets
 * go from loose to tight: a schedule that already fits a tighter kept
 * budget is that budget's answer too (the optimum of a looser problem that
 * is feasible in a tighter one), and a proven infeasible kept budget ends
 * the row. Once the share is spent, or the deadline passed, the rest are
 * left out. */
typedef struct rkm__grid {
    uint64_t peak_lo, peak_hi, kept_lo;
    int32_t np, nk;
    double lim, allow, work0;
    int32_t next;      /* the next point, row by row */
    uint64_t row_kept; /* kept memory of the row's last schedule */
} rkm__grid;

/* The grid's points from gr->next on; with `probe`, up to the first solve
 * that finds a schedule (*hard: it reached its work limit). */
static rkm_result rkm__class_grid(rkm_planner *pl, rkm__sim *s, const rkm__block *b, rkm__ilp_block *ib, rkm__grid *gr,
                                  int probe, int *hard)
{
    const rkm_graph *g = pl->g;
    const rkm__option all = pl->bo[b - g->blocks].opt[0]; /* copied: adding options may move the array */
    rkm_result r = RKM_OK;
    for (; gr->next < gr->np * gr->nk && !r; gr->next++) {
        int32_t i = gr->next / gr->nk, j = gr->nk - 1 - gr->next % gr->nk;
        if (j == gr->nk - 1) gr->row_kept = UINT64_MAX;
        double fp = gr->np > 1 ? (double)i / (gr->np - 1) : 1.0, fk = gr->nk > 1 ? (double)j / (gr->nk - 1) : 1.0;
        uint64_t peak_budget = gr->peak_lo + (uint64_t)((double)(gr->peak_hi - gr->peak_lo) * fp);
        uint64_t kept_budget = gr->kept_lo + (uint64_t)((double)(all.kept - gr->kept_lo) * fk);
        double share = gr->allow - (pl->ilp.work - gr->work0);
        if (gr->row_kept <= kept_budget) continue;
        if (share <= 0 || rkm__over(pl)) {
            pl->ilp_skipped++;
            continue;
        }
        rkm_step *steps = NULL;
        size_t nf = 0, nb = 0;
        int found = 0;
        int32_t timeouts = pl->ilp.timeout;
        rkm__progress_sub(pl, (pl->ilp.work - gr->work0) / gr->allow);
        double lim = rkm__work_ilp_seconds(pl, fmin(gr->lim, share)), w0 = pl->ilp.work;
        r = rkm__ilp_block_solve(ib, peak_budget, kept_budget, lim, &steps, &nf, &nb, &pl->ilp, &found);
        rkm__work_charge_ilp(pl, pl->ilp.work - w0, lim);
        (void)rkm__over(pl); /* the solve may have stopped at the deadline */
        if (!r && !found && pl->ilp.proven) gr->next = (i + 1) * gr->nk - 1; /* the row ends */
        if (r || !found) continue;
        rkm__option o = {steps, nf, nb, 0, 0, 0, 0, 0, 0};
        if (rkm__option_measure(s, b, &o)) gr->row_kept = o.kept;
        r = rkm__class_add(pl, s, b, steps, nf, nb);
        rkm__free(pl->ctx, steps, (nf + nb) * sizeof *steps);
        if (probe) {
            *hard = pl->ilp.timeout > timeouts;
            gr->next++;
            break;
        }
    }
    return r;
}

/* ILP options of block b's class, from `allow` seconds of solver work (the
 * class's share): the desc's grid (ilp_peak_points x ilp_kept_points) at
 * ilp_time_limit a solve, but where the first solve that finds a schedule
 * reaches its work limit, the block is hard for the solver and its options
 * are better from fewer solves with more work each (RKM__ILP_HARD_KEPT). */
static rkm_result rkm__class_ilp(rkm_planner *pl, rkm__sim *s, const rkm__block *b, uint64_t peak_lo, uint64_t peak_hi,
                                 double allow)
{
    const rkm_graph *g = pl->g;
    rkm__grid gr = {peak_lo, peak_hi, 0, pl->d.ilp_peak_points, pl->d.ilp_kept_points, pl->d.ilp_time_limit, allow,
                    pl->ilp.work, 0, UINT64_MAX};
    /* kept when nothing but the inputs, x_in and x_out is */
    gr.kept_lo = g->input_bytes + (b->in >= 0 ? g->tensors[b->in].bytes : 0) + g->tensors[b->out].bytes;
    rkm__ilp_block *ib;
    rkm_result r = rkm__ilp_block_create(g, b->ops, b->n_ops, b->in, b->out, b->out == g->loss, &ib);
    if (r) return r;
    rkm__ilp_block_deadline(ib, pl->deadline);
    int hard = 0;
    r = rkm__class_grid(pl, s, b, ib, &gr, 1, &hard);
    if (!r && hard) { /* the probe's option stays; the grid starts over */
        gr.nk = (int32_t)ceil(gr.nk * RKM__ILP_HARD_KEPT);
        gr.lim *= RKM__ILP_HARD_EFFORT;
        gr.next = 0;
    }
    if (!r) r = rkm__class_grid(pl, s, b, ib, &gr, 0, &hard);
    rkm__ilp_block_destroy(ib);
    return r;
}

/* Whether the chain has blocks to trade memory between: two or more of
 * more than RKM__MERGE_RUN ops (dag4x50's 4 blocks of 49 and 50, peer-gpt's
 * 8 of 5 and 8). Only there do drop options pay: on graphs of one big
 * block and a few small ones (random30's 28 ops, dag60's 59, dag100's 97)
 * the whole-graph search plans the block, and the options moved plans
 * both ways (random30 at 40 %: 23.36 -> 24.17 %; dag100 at 50 %: 11.33 ->
 * 11.83 %, at 40 %: 115.0 -> 25.0 %). */
static int rkm__drop_chain(const rkm_graph *g)
{
    int32_t big = 0;
    for (int32_t k = 0; k < g->n_blocks; k++) big += g->blocks[k].n_ops > RKM__MERGE_RUN;
    return big >= 2;
}

/* Options of one class, solved on its first block: a nested planner's
 * where the block nests, drop options on a chain of big blocks
 * (rkm__drop_chain), the block ILP's (with lp_solve) unless the nested planner
 * covered a block too big for it or the block is too big for the ILP. The
 * class spends the block ILP budget left times its weight w over wl, its
 * own and that of the classes still to come, so what one class leaves goes
 * to the next. */
static rkm_result rkm__class_options(rkm_planner *pl, rkm__sim *s, int32_t cls, double w, double wl)
{
    const rkm_graph *g = pl->g;
    int32_t rep = 0;
    while (g->blocks[rep].cls != cls) rep++;
    const rkm__block *b = &g->blocks[rep];
    /* The block's baseline (its only option yet) bounds the grid. */
    const rkm__option *all = &pl->bo[rep].opt[0];
    uint64_t peak_hi = all->pf > all->pb ? all->pf : all->pb, peak_lo = rkm__block_floor(g, b);
    if (peak_lo > peak_hi) peak_lo = peak_hi;
    double work0 = pl->ilp.work, allow = pl->pool * w / wl;
    int nested = 0;
    rkm_result r = rkm__nest_options(pl, rkm__planner_make, s, b, peak_lo, peak_hi, allow, &nested);
    if (!r && rkm__drop_chain(g)) r = rkm__drop_options(pl, s, b);
    double left = allow - (pl->ilp.work - work0);
    if (!r && !(nested && b->n_ops > RKM__ILP_FLAT_OPS) && b->n_ops <= RKM__ILP_MAX_OPS && RKM__HAVE_ILP) {
        /* a share below a tenth of one solve's limit buys no solve but costs
         * the model's build (a chain of 5000 distinct blocks: 17 s of it);
         * it is spent all the same, or the last of many such classes would
         * get the others' and build after all */
        if (left < RKM__ILP_MIN_SHARE * pl->d.ilp_time_limit) {
            pl->ilp_skipped += pl->d.ilp_peak_points * pl->d.ilp_kept_points;
            pl->pool = fmax(0, pl->pool - left);
        } else
            r = rkm__class_ilp(pl, s, b, peak_lo, peak_hi, left);
    }
    pl->pool = fmax(0, pl->pool - (pl->ilp.work - work0));
    return r;
}

/* Every class's options, heaviest class first (by rkm__class_weight, then
 * in order): what it leaves of its share goes to the lighter ones, which
 * often need less than they would be given (peer-gpt: with the default
 * budget, lightest first leaves 12 of 72 solves out, heaviest first none). */
static rkm_result rkm__planner_classes(rkm_planner *pl, rkm__sim *s)
{
    int32_t n = pl->g->n_classes;
    double *w = rkm__alloc(pl->ctx, (size_t)n * sizeof *w), wl = 0;
    int32_t *order = rkm__alloc(pl->ctx, (size_t)n * sizeof *order);
    rkm_result r = w && order ? RKM_OK : rkm__nomem(pl->ctx, "planner");
    for (int32_t c = 0; c < n && !r; c++) {
        w[c] = rkm__class_weight(pl, c);
        wl += w[c];
        int32_t k = c; /* insertion, stable: equal weights keep their order */
        for (; k > 0 && w[order[k - 1]] < w[c]; k--) order[k] = order[k - 1];
        order[k] = c;
    }
    double all = wl;
    for (int32_t i = 0; i < n && !r; i++) {
        rkm__progress_part(pl, RKM__PROGRESS_CLASSES * (1 - wl / all), RKM__PROGRESS_CLASSES * (1 - (wl - w[order[i]]) / all));
        r = rkm__class_options(pl, s, order[i], w[order[i]], wl);
        wl -= w[order[i]];
    }
    rkm__free(pl->ctx, w, (size_t)n * sizeof *w);
    rkm__free(pl->ctx, order, (size_t)n * sizeof *order);
    return r;
}

/* Every block's options: the two extremes, and for rockmate the ILP's. */
static rkm_result rkm__planner_options(rkm_planner *pl)
{
    const rkm_graph *g = pl->g;
    pl->bo = rkm__calloc(pl->ctx, (size_t)g->n_blocks, sizeof *pl->bo);
    if (!pl->bo) return rkm__nomem(pl->ctx, "planner");
    rkm__sim s;
    rkm_result r = rkm__sim_init(g, &s);
    for (int32_t b = 0; b < g->n_blocks && !r; b++) r = rkm__bopts_extremes(&s, &g->blocks[b], &pl->bo[b]);
    if (!r && pl->d.algo == RKM_ALGO_ROCKMATE) r = rkm__planner_classes(pl, &s);
    if (pl->ilp_skipped && !pl->depth && !pl->prog.cancelled)
        rkm__log(pl->ctx, RKM_LOG_WARN,
                 "%s ran out: %d block ILP solves left out; plans may be worse",
                 pl->cut ? "the time limit" : "the block ILP budget (ilp_budget)",
                 (int)pl->ilp_skipped);
    if (pl->ilp.solves > 0 && pl->ilp.timeout == pl->ilp.solves && !pl->depth)
        rkm__log(pl->ctx, RKM_LOG_WARN,
                 "every block ILP solve (%d) reached its work limit (ilp_time_limit %g s): the options are the "
                 "solver's best within it; a larger ilp_time_limit may find better ones",
                 (int)pl->ilp.solves, pl->d.ilp_time_limit);
    for (int32_t b = 0; b < g->n_blocks && !r; b++)
        qsort(pl->bo[b].opt, pl->bo[b].n_opt, sizeof *pl->bo[b].opt, rkm__option_cmp);
    if (s.g) rkm__sim_free(&s);
    return r;
}

void rkm_planner_destroy(rkm_planner *pl) { rkm__planner_free(pl); }

/* A count option: 0 means default; negative refused. */
static rkm_result rkm__desc_count(rkm_context *ctx, const char *what, int32_t *v, int32_t dflt)
{
    if (*v < 0) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "solve desc: %s is %d (positive, or 0 for the default)", what, (int)*v);
    if (*v == 0) *v = dflt;
    return RKM_OK;
}

/* A seconds option: 0 means default; negative, NaN or infinite refused. */
static rkm_result rkm__desc_seconds(rkm_context *ctx, const char *what, double *v, double dflt)
{
    if (!(*v >= 0) || !isfinite(*v))
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "solve desc: %s is %g (finite and positive, or 0 for the default)", what, *v);
    if (*v == 0) *v = dflt;
    return RKM_OK;
}

static rkm_result rkm__desc_defaults(const rkm_graph *g, const rkm_solve_desc *desc, rkm_solve_desc *d)
{
    memset(d, 0, sizeof *d);
    if (desc) *d = *desc;
    rkm_context *ctx = g->ctx;
    if ((int)d->algo < 0 || d->algo >= RKM_ALGO_COUNT)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "solve desc: algorithm %d does not exist", (int)d->algo);
    if (d->algo == RKM_ALGO_DEFAULT) d->algo = RKM_ALGO_ROCKMATE;
    rkm_result r;
    if ((r = rkm__desc_count(ctx, "slots", &d->slots, RKM__DEFAULT_SLOTS)) ||
        (r = rkm__desc_count(ctx, "ilp_peak_points", &d->ilp_peak_points, RKM__DEFAULT_PEAK_POINTS)) ||
        (r = rkm__desc_count(ctx, "ilp_kept_points", &d->ilp_kept_points, RKM__DEFAULT_KEPT_POINTS)) ||
        (r = rkm__desc_seconds(ctx, "time_limit", &d->time_limit, RKM__DEFAULT_TIME_LIMIT)) ||
        (r = rkm__desc_seconds(ctx, "ilp_time_limit", &d->ilp_time_limit, RKM__DEFAULT_ILP_TIME_LIMIT)) ||
        (r = rkm__desc_seconds(ctx, "ilp_budget", &d->ilp_budget, RKM__DEFAULT_ILP_BUDGET)))
        return r;
    if (d->alignment == 0) d->alignment = RKM_ARENA_ALIGN;
    if ((d->alignment & (d->alignment - 1)) || d->alignment > RKM__MAX_ALIGNMENT)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "solve desc: alignment %llu is not a power of two up to %llu",
                        (unsigned long long)d->alignment, (unsigned long long)RKM__MAX_ALIGNMENT);
    if (d->nest_ops == 0) d->nest_ops = RKM__DEFAULT_NEST_OPS;
    if (d->nest_ops < 0) d->nest_ops = INT32_MAX;
#ifdef RKM_OMIT_SOLVER
    /* rockmate plans without its ILP options (rkm__class_options) */
    if (d->algo == RKM_ALGO_CHECKMATE)
        return rkm__err(ctx, RKM_ERROR_UNSUPPORTED, "solve: %s needs lp_solve, left out by RKM_OMIT_SOLVER",
                        rkm_algo_name(d->algo));
#endif
    return RKM_OK;
}

static rkm_result rkm__planner_dp(rkm_planner *pl);

static int rkm__uses_chain(rkm_algo a) { return a == RKM_ALGO_ROCKMATE || a == RKM_ALGO_ROTOR || a == RKM_ALGO_SQRT; }

/* A planner for g with settings d (defaults applied), below `parent` (NULL:
 * the one the user made): nested planners do not log, and their checks
 * are their parent's (rkm__over). */
RKM__PRIVATE rkm_result rkm__planner_make(const rkm_graph *g, const rkm_solve_desc *desc, rkm_planner *parent, rkm_planner **out)
{
    int32_t depth = parent ? parent->depth + 1 : 0;
    const rkm_solve_desc d = *desc;
    rkm_result r = RKM_OK;
    const rkm_graph_stats gs = g->stats;
    rkm_planner *pl = rkm__calloc(g->ctx, 1, sizeof *pl);
    if (!pl) return rkm__nomem(g->ctx, "rkm_planner_create");
    pl->g = pl->user = g;
    rkm__graph_hold(g);
    pl->ctx = g->ctx;
    pl->d = d;
    pl->depth = depth;
    pl->parent = parent;
    pl->pool = d.ilp_budget;
    pl->kick_work = rkm__kick_work(g);
    if (!parent) /* creation: the block ILP pool, and a solve's worth for the nested planners */
        rkm__work_start(pl, rkm__work_solve(pl) + (uint64_t)(fmin(d.ilp_budget, 0x1p32) * RKM__ILP_STEPS_PER_S));
    rkm__search_begin(pl, RKM__ASK_SOLVE); /* for white-box callers of the search's parts */
    pl->t0 = rkm__now();
    pl->deadline = pl->t0 + d.time_limit;
    pl->base_peak = gs.baseline_peak;
    pl->base_time = gs.baseline_time;
    pl->lower_bound = gs.lower_bound;
    uint64_t span = gs.baseline_peak - g->input_bytes;
    pl->q = span ? rkm__ceil_div(span, (uint64_t)d.slots) : 1;
    if (!parent) rkm__progress_begin(pl, RKM_STAGE_CREATE, 0);
    if (rkm__uses_chain(d.algo)) {
        r = rkm__planner_options(pl);
        if (!r) r = rkm__planner_chain(pl);
        if (!r && !depth)
            rkm__log(pl->ctx, RKM_LOG_INFO, "%s: %d blocks in %d classes, %zu options (%d classes nested); %d ILP "
                     "solves in %.3f s", rkm_algo_name(d.algo), (int)g->n_blocks, (int)g->n_classes, pl->n_dpo,
                     (int)pl->nested, (int)pl->ilp.solves, pl->ilp.seconds);
        double t = rkm__now();
        if (!r && d.algo != RKM_ALGO_SQRT) r = rkm__planner_dp(pl);
        if (!r && d.algo != RKM_ALGO_SQRT && !depth)
            rkm__log(pl->ctx, RKM_LOG_INFO, "chain DP: %d blocks x %d slots (%llu bytes each) in %.3f s", (int)g->n_blocks,
                     (int)d.slots, (unsigned long long)pl->q, rkm__now() - t);
    }
    if (!parent) r = rkm__progress_result(pl, r, "rkm_planner_create");
    if (r) {
        rkm_planner_destroy(pl);
        return r;
    }
    pl->create_seconds = rkm__elapsed(pl);
    pl->create_cut = pl->cut;
    pl->cuts = pl->cut;
    *out = pl;
    return RKM_OK;
}

rkm_result rkm_planner_create(const rkm_graph *g, const rkm_solve_desc *desc, rkm_planner **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_planner_create: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_finalized(g, "rkm_planner_create");
    if (r) return r;
    rkm_solve_desc d;
    rkm_graph *ag;
    if ((r = rkm__desc_defaults(g, desc, &d)) || (r = rkm__graph_aligned(g, d.alignment, &ag))) return r;
    if ((r = rkm__planner_make(ag ? ag : g, &d, NULL, out))) {
        rkm_graph_destroy(ag);
        return r;
    }
    rkm__graph_rehold(&(*out)->user, g); /* the user's graph, not its own copy */
    (*out)->own = ag;
    return RKM_OK;
}

/* The chain DP's table, if it fits under RKM__DP_MAX_BYTES. Rotor without it
 * has nothing to plan with: refused, with the figure and the knob. Rockmate
 * goes on without the chain DP (sqrt, DTR), with a warning. */
static rkm_result rkm__planner_dp(rkm_planner *pl)
{
    int32_t n = pl->g->n_blocks, M = pl->d.slots;
    double need = rkm__dp_bytes(pl->dpb, n, M);
    if (need <= RKM__DP_MAX_BYTES) {
        int cut; /* past the deadline or cancelled: the first tile only (the table is no loop of the meter's) */
        (void)rkm__over(pl);
        rkm_result r = rkm__dp_solve(pl->ctx, pl->dpb, n, M, pl->cut ? -INFINITY : pl->deadline, &pl->table, &cut);
        pl->cut |= cut;
        return r;
    }
    if (pl->d.algo == RKM_ALGO_ROCKMATE) {
        rkm__log(pl->ctx, RKM_LOG_WARN, "chain DP left out: %d blocks x %d slots would take %.3g GiB (the cap is %.3g GiB)",
                 (int)n, (int)M, need / 1073741824.0, RKM__DP_MAX_BYTES / 1073741824.0);
        return RKM_OK;
    }
    int32_t fit = M;
    while (fit > 1 && rkm__dp_bytes(pl->dpb, n, fit) > RKM__DP_MAX_BYTES) fit /= 2;
    char hint[96];
    if (rkm__dp_bytes(pl->dpb, n, fit) <= RKM__DP_MAX_BYTES)
        snprintf(hint, sizeof hint, "use %d slots or fewer (rkm_solve_desc.slots, --slots)", (int)fit);
    else
        snprintf(hint, sizeof hint, "the chain has too many blocks for the DP at any slot count");
    return rkm__err(pl->ctx, RKM_ERROR_NOMEM,
                    "chain DP: %d blocks x %d slots would take %.3g GiB, over the planner's cap of %.3g GiB: %s, or "
                    "plan with rockmate or dtr",
                    (int)n, (int)M, need / 1073741824.0, RKM__DP_MAX_BYTES / 1073741824.0, hint);
}

/* ---- a solve's plan: the algorithm's, fitted to its arena ---------------- */

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
 * at 20 %: 47.2 % overhead, DTR 46.0 %) or none (at DTR's smallest
 * budget). */
RKM__PRIVATE rkm_result rkm__planner_fit(rkm_planner *pl, uint64_t budget, rkm__ask ask, rkm_plan **out, uint64_t *need)
{
    uint64_t over = 0;
    rkm_plan *p = NULL, *q = NULL;
    rkm_result r = rkm__fit_less(pl, budget, rkm__planner_make_one, &ask, out, &over);
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

/* The planner's figures of a plan it hands out; over budget is a bug. */
static rkm_result rkm__planner_finish(rkm_planner *pl, rkm_plan *p, uint64_t budget, double t_start)
{
    rkm_plan_stats *st = &p->stats;
    if (st->peak > budget || st->arena_bytes > budget)
        return rkm__err(pl->ctx, RKM_ERROR_INTERNAL, "internal error: the %s plan peaks at %llu bytes in an arena of "
                        "%llu, over the budget of %llu", rkm_algo_name(pl->d.algo), (unsigned long long)st->peak,
                        (unsigned long long)st->arena_bytes, (unsigned long long)budget);
    st->algo = pl->d.algo;
    st->budget = budget;
    st->solve_seconds = pl->create_seconds + (rkm__now() - t_start);
    st->cut = pl->cut || pl->create_cut;
    return RKM_OK;
}

static rkm_result rkm__planner_try(rkm_planner *pl, uint64_t budget, rkm__ask ask, rkm_plan **out)
{
    *out = NULL;
    rkm__search_begin(pl, ask);
    rkm_algo a = pl->d.algo;
    if (a != RKM_ALGO_SQRT && budget >= pl->base_peak) return rkm__plan_baseline(pl->g, out); /* nothing is faster */
    if (a == RKM_ALGO_ROCKMATE) return rkm__solve_rockmate(pl, budget, ask, out);
    if (a == RKM_ALGO_DTR) return rkm__solve_dtr(pl, budget, out, NULL);
    if (a == RKM_ALGO_SQRT) { /* a fixed schedule; where it does not fit, the baseline may */
        rkm_result r = rkm__solve_chain(pl, RKM__CHAIN_SQRT, budget, out);
        return r || *out || budget < pl->base_peak ? r : rkm__plan_baseline(pl->g, out);
    }
    if (rkm__uses_chain(a)) return rkm__solve_dp(pl, budget, out);
    /* One solve's work is worth about its share of the limit; on a slow
     * machine the call's deadline (rkm__over) stops it first. */
    if (a == RKM_ALGO_CHECKMATE)
        return rkm__solve_checkmate(pl, budget, pl->d.time_limit * RKM__CHECKMATE_SHARE, !(ask.skip & RKM__SKIP_COPIES), out);
    return RKM_OK;
}

/* ---- the smallest budget ------------------------------------------------- */

static rkm_result rkm__min_budget(rkm_planner *pl, uint64_t *out, uint64_t *at);

/* The smallest budget's fits: whole solves, many of them, so without the
 * whole-graph ILP start (the bisection has taken its least peak already)
 * and DTR's missed track; checkmate's recompute-only (its floor with a
 * link below it: rkm__checkmate_below). */
static const rkm__ask rkm__ask_min = {UINT64_MAX, RKM__SKIP_ILP | RKM__SKIP_MISSED | RKM__SKIP_COPIES};

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
    for (int k = 0; !r && k < RKM__MIN_BUDGET_DOWN && p->stats.arena_bytes > failed + 1 && !rkm__over(pl); k++) {
        rkm_plan *q = NULL;
        if ((r = rkm__planner_fit(pl, p->stats.arena_bytes - 1, rkm__ask_min, &q, NULL)) || !q) break;
        rkm_plan_destroy(p);
        p = q;
    }
    if (r) {
        rkm_plan_destroy(p);
        return r;
    }
    pl->min_plan = p;
    *out = p->stats.arena_bytes;
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
static rkm_result rkm__planner_min(rkm_planner *pl, uint64_t *out)
{
    return rkm__offloads(pl) ? rkm__offload_min_budget(pl, out) : rkm__min_budget_get(pl, out);
}

rkm_result rkm_planner_min_budget(rkm_planner *pl, uint64_t *out)
{
    if (!pl || !out) return pl ? rkm__err(pl->ctx, RKM_ERROR_ARGUMENT, "rkm_planner_min_budget: out is NULL") : RKM_ERROR_ARGUMENT;
    rkm__call_start(pl, rkm__now(), RKM_STAGE_MIN_BUDGET, 0);
    rkm_result r = rkm__planner_min(pl, out);
    if (pl->prog.cancelled) *out = 0;
    pl->cuts += pl->cut && !pl->prog.cancelled;
    return rkm__progress_result(pl, r, "rkm_planner_min_budget");
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
    if (!r && (pl->d.algo == RKM_ALGO_SQRT || pl->d.algo == RKM_ALGO_ROCKMATE)) {
        rkm_plan *p;
        if (!(r = rkm__solve_chain(pl, RKM__CHAIN_SQRT, UINT64_MAX, &p)) && p && p->stats.peak < *out) *out = *at = p->stats.peak;
        rkm_plan_destroy(p);
    }
    if (!r && (pl->d.algo == RKM_ALGO_DTR || pl->d.algo == RKM_ALGO_ROCKMATE) && rkm__dtr_affordable(pl)) {
        uint64_t dtr;
        if (pl->d.algo == RKM_ALGO_ROCKMATE) rkm__progress_part(pl, 0, RKM__PROGRESS_FLOORS / 2);
        if (!(r = rkm__dtr_min_budget(pl, &dtr)) && dtr < *out) *out = dtr, *at = pl->dtr_min_at;
    }
    if (!r && pl->d.algo == RKM_ALGO_ROCKMATE && pl->g->n_ops <= RKM__WHOLE_GRAPH_OPS) {
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
    if (*p && (*p)->stats.arena_bytes >= min) {
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
    pl->off_min = p ? p->stats.arena_bytes : min;
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
    if (r || !m || m->stats.arena_bytes > budget || !(m->stats.time < (*p)->stats.time)) return r;
    rkm_plan *q;
    if ((r = rkm__plan_copy(m, &q))) return r;
    rkm_plan_destroy(*p);
    *p = q;
    return RKM_OK;
}

/* ---- the API's calls ----------------------------------------------------- */

/* No plan for `budget`: RKM_ERROR_TIMEOUT where the call or the planner's
 * creation was cut (a search to the end, from all the options, might have
 * found one), else RKM_ERROR_BUDGET. */
static rkm_result rkm__no_plan(rkm_planner *pl, uint64_t budget, uint64_t min)
{
    if (pl->cut || pl->create_cut)
        return rkm__err(pl->ctx, RKM_ERROR_TIMEOUT,
                        "%s: the time limit of %g s ran out before a plan for %llu bytes was found (creating the "
                        "planner took %.3g s of it); a larger time_limit (--time-limit) may find one",
                        rkm_algo_name(pl->d.algo), pl->d.time_limit, (unsigned long long)budget, pl->create_seconds);
    return rkm__err(pl->ctx, RKM_ERROR_BUDGET, "%s: no plan fits a budget of %llu bytes; the smallest it can meet is %llu bytes",
                    rkm_algo_name(pl->d.algo), (unsigned long long)budget, (unsigned long long)min);
}

/* A budget under the graph's lower bound: no plan of any algorithm fits
 * it, copies or not, whatever the time, so no search, and no search for
 * the smallest budget either (seconds on a large graph, for a message):
 * the message names the step that needs more, and the smallest budget
 * where a call found it. */
static rkm_result rkm__under_bound(rkm_planner *pl, uint64_t budget)
{
    const char *name = rkm_algo_name(pl->d.algo);
    int copies = rkm__offloads(pl);
    char min[96];
    if (pl->min_budget && !pl->min_cut && (!copies || pl->off_min))
        snprintf(min, sizeof min, "; the smallest it can meet is %llu bytes",
                 (unsigned long long)(copies ? pl->off_min : pl->min_budget));
    else
        snprintf(min, sizeof min, " (rkm_planner_min_budget gives the smallest budget %s meets)", name);
    int32_t op;
    int bwd;
    uint64_t lb = rkm__lower_bound(pl->g, &op, &bwd);
    return rkm__err(pl->ctx, RKM_ERROR_BUDGET,
                    "%s: no plan fits a budget of %llu bytes: no plan of any algorithm peaks under %llu bytes, what "
                    "%s%s%s alone holds%s",
                    name, (unsigned long long)budget, (unsigned long long)lb,
                    op < 0 ? "the loss step" : bwd ? "the backward of op '" : "the forward of op '",
                    op < 0 ? "" : pl->g->ops[op].name, op < 0 ? "" : "'", min);
}

static rkm_result rkm__planner_solve(rkm_planner *pl, uint64_t budget, double t, rkm_plan **out)
{
    if (budget < pl->lower_bound) return rkm__under_bound(pl, budget);
    rkm_plan *p;
    int copies = rkm__offloads(pl) && pl->d.algo == RKM_ALGO_ROCKMATE;
    uint64_t was = rkm__work_part(pl, rkm__work_solve(pl) + rkm__work_checkmate(pl)); /* the rest: the smallest budget's */
    rkm_result r = copies ? rkm__planner_offload(pl, budget, &p) : rkm__planner_fit(pl, budget, RKM__ASK_SOLVE, &p, NULL);
    rkm__work_part_end(pl, was);
    if (!r && p && p->stats.offloads && pl->d.algo == RKM_ALGO_CHECKMATE && (r = rkm__checkmate_fallback(pl, budget, &p)))
        rkm_plan_destroy(p);
    if (r) return r;
    if (!p) {
        uint64_t min;
        if ((r = rkm__planner_min(pl, &min))) return r;
        if (budget < min) return rkm__no_plan(pl, budget, min);
        if ((r = rkm__plan_copy(budget < pl->min_budget ? pl->off_min_plan : pl->min_plan, &p))) return r;
    }
    if ((r = rkm__planner_finish(pl, p, budget, t))) {
        rkm_plan_destroy(p);
        return r;
    }
    *out = p;
    return RKM_OK;
}

rkm_result rkm_planner_solve(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    if (out) *out = NULL;
    if (!pl || !out) return pl ? rkm__err(pl->ctx, RKM_ERROR_ARGUMENT, "rkm_planner_solve: out is NULL") : RKM_ERROR_ARGUMENT;
    double t = rkm__now();
    rkm__call_start(pl, t, RKM_STAGE_SOLVE, budget);
    rkm_result r = rkm__planner_solve(pl, budget, t, out);
    if (pl->prog.cancelled) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    pl->cuts += pl->cut && !pl->prog.cancelled;
    return rkm__progress_result(pl, r, "rkm_planner_solve");
}

rkm_result rkm_planner_stats_get(const rkm_planner *pl, rkm_planner_stats *out)
{
    if (out) memset(out, 0, sizeof *out); /* zeroed on every error (rockmate.h) */
    if (!pl || !out) return pl ? rkm__err(pl->ctx, RKM_ERROR_ARGUMENT, "rkm_planner_stats_get: out is NULL") : RKM_ERROR_ARGUMENT;
    rkm__planner_figures(pl, out);
    return RKM_OK;
}

rkm_result rkm_plan_solve(const rkm_graph *g, const rkm_solve_desc *desc, uint64_t budget, rkm_plan **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_solve: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    rkm_planner *pl;
    rkm_result r = rkm_planner_create(g, desc, &pl);
    if (r) return r;
    r = rkm_planner_solve(pl, budget, out);
    rkm_planner_destroy(pl);
    return r;
}

rkm_result rkm_plan_stats_get(const rkm_plan *p, rkm_plan_stats *out)
{
    if (out) memset(out, 0, sizeof *out); /* zeroed on every error (rockmate.h) */
    if (!p || !out) return p ? rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_stats_get: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = p->stats;
    return RKM_OK;
}
