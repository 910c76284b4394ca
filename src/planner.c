/* planner.c -- the planner's API: creation (every block's options, the chain in DP slots, its table), solve, min_budget, stats
 *
 * Uses (through internal.h): base.c, graph.c, plan.c, sim.c, layout.c, baseline.c, options.c, ilp.c, chain.c,
 * progress.c, produce.c, offload.c, nest.c, drive.c.
 *
 * The top of the pipeline: rkm_planner_create (the desc's defaults, every
 * block's options from the block ILP, nesting and drop options, the chain
 * in DP slots and its table), then the calls, each with its work meter,
 * that hand a request to the drivers (drive.c). Nesting plans a block
 * with a planner of its own: nest.c gets rkm__planner_make handed down
 * (rkm__planner_maker). */
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

/* A call on a made planner (solve, min_budget) starts at `now`: it gets
 * what the planner's creation left of time_limit, so that creation and
 * the call together, one plan's planning, stay within it. */
static void rkm__call_start(rkm_planner *pl, double now, rkm_stage stage, uint64_t budget)
{
    pl->deadline = now + (pl->d.time_limit - pl->create_seconds);
    pl->cut = 0;
    rkm__work_start(pl, (stage == RKM_STAGE_SOLVE ? rkm__work_solve(pl->g) + rkm__work_checkmate(pl) : 0) +
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
        rkm__ilp_turn t = rkm__work_ilp_begin(pl, fmin(gr->lim, share));
        r = rkm__ilp_block_solve(ib, peak_budget, kept_budget, t.lim, &steps, &nf, &nb, &pl->ilp, &found);
        rkm__work_ilp_end(pl, t);
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
    if (!r && rkm__affords(g, b->n_ops, nested ? RKM__NEED_NESTED_ILP : RKM__NEED_BLOCK_ILP) && RKM__HAVE_ILP) {
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
    if (d->in_flight < 0)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "solve desc: in_flight is %d (micro-batches: 1 or more, 0 for 1)",
                        (int)d->in_flight);
    if (d->in_flight == 0) d->in_flight = 1;
    if (d->in_flight > 1 && g->copy.d2h_bytes_per_second > 0)
        return rkm__err(ctx, RKM_ERROR_UNSUPPORTED, "solve desc: in_flight %d on a graph with a copy link: offloading "
                        "in a pipeline stage is not planned (plan the stage's graph without its copy link)",
                        (int)d->in_flight);
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
        rkm__work_start(pl, rkm__work_solve(pl->g) + (uint64_t)(fmin(d.ilp_budget, 0x1p32) * RKM__ILP_STEPS_PER_S));
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
        if (!r && !rkm__fixed_chain(d.algo)) r = rkm__planner_dp(pl);
        if (!r && !rkm__fixed_chain(d.algo) && !depth)
            rkm__log(pl->ctx, RKM_LOG_INFO, "chain DP: %d blocks x %d slots (%llu bytes each) in %.3f s", (int)g->n_blocks,
                     (int)d.slots, (unsigned long long)pl->q, rkm__now() - t);
    }
    if (!parent) r = rkm__progress_result(pl, r, "rkm_planner_create");
    if (r) {
        rkm_planner_destroy(pl);
        return r;
    }
    pl->create_seconds = rkm__now() - pl->t0;
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

/* The planner's figures of a plan it hands out; over budget is a bug. */
static rkm_result rkm__planner_finish(rkm_planner *pl, rkm_plan *p, uint64_t budget, double t_start)
{
    rkm_plan_stats *st = &p->stats;
    if (st->stage_peak > budget || st->stage_arena_bytes > budget)
        return rkm__err(pl->ctx, RKM_ERROR_INTERNAL, "internal error: the %s plan peaks at %llu bytes in an arena of "
                        "%llu (%d in flight), over the budget of %llu", rkm_algo_name(pl->d.algo),
                        (unsigned long long)st->stage_peak, (unsigned long long)st->stage_arena_bytes,
                        (int)st->in_flight, (unsigned long long)budget);
    st->algo = pl->d.algo;
    st->budget = budget;
    st->solve_seconds = pl->create_seconds + (rkm__now() - t_start);
    st->cut = pl->cut || pl->create_cut;
    return RKM_OK;
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
    uint64_t was = rkm__work_part(pl, rkm__work_solve(pl->g) + rkm__work_checkmate(pl)); /* the rest: the smallest budget's */
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
