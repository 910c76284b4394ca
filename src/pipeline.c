/* pipeline.c -- pipeline planning: the cut across devices and each stage's plan
 *
 * Uses (through internal.h): base.c, graph.c, plan.c, pipe.c, structure.c, planner.c.
 *
 * A pipeline is P stage graphs (structure.c's cut at block boundaries),
 * each planned like any graph for its device's budget with its
 * micro-batches in flight (rkm_solve_desc.in_flight), and the step's time
 * is the pipeline replay's (pipe.c) over the stage plans' phase times and
 * the boundary tensors' transfers. Choosing the cut is a search over block
 * boundaries for the least bottleneck stage, its stages estimated by
 * rotor's plans (a chain DP: milliseconds where rockmate's search takes
 * about a second on a GPT-2 XL stage); then the cut it finds and the
 * uniform cut are planned with the desc's algorithm and the faster
 * pipeline is kept. */
#include "internal.h"

struct rkm_pipeline {
    rkm_context *ctx;
    const rkm_graph *g; /* held */
    int32_t n;
    rkm_graph **stage;
    rkm_plan **plan;
    rkm_pipeline_stage_info *info;
    double step_time;
};

void rkm_pipeline_destroy(rkm_pipeline *pp)
{
    if (!pp) return;
    for (int32_t s = 0; s < pp->n; s++) {
        if (pp->plan) rkm_plan_destroy(pp->plan[s]);
        if (pp->stage) rkm_graph_destroy(pp->stage[s]);
    }
    rkm_context *ctx = pp->ctx;
    rkm__free(ctx, pp->stage, (size_t)pp->n * sizeof *pp->stage);
    rkm__free(ctx, pp->plan, (size_t)pp->n * sizeof *pp->plan);
    rkm__free(ctx, pp->info, (size_t)pp->n * sizeof *pp->info);
    const rkm_graph *g = pp->g;
    rkm__free(ctx, pp, sizeof *pp);
    rkm__graph_release(g);
}

double rkm_pipeline_step_time(const rkm_pipeline *pp) { return pp ? pp->step_time : 0; }
int32_t rkm_pipeline_num_stages(const rkm_pipeline *pp) { return pp ? pp->n : 0; }

rkm_result rkm_pipeline_stage(const rkm_pipeline *pp, int32_t s, rkm_pipeline_stage_info *info, const rkm_graph **graph,
                              const rkm_plan **plan)
{
    if (info) memset(info, 0, sizeof *info);
    if (graph) *graph = NULL;
    if (plan) *plan = NULL;
    if (!pp) return RKM_ERROR_ARGUMENT;
    if (s < 0 || s >= pp->n)
        return rkm__err(pp->ctx, RKM_ERROR_ARGUMENT, "rkm_pipeline_stage: stage %d does not exist (%d stages)", (int)s,
                        (int)pp->n);
    if (info) *info = pp->info[s];
    if (graph) *graph = pp->stage[s];
    if (plan) *plan = pp->plan[s];
    return RKM_OK;
}

/* A block's forward time: the baseline's. */
static double rkm__block_fwd(const rkm_graph *g, int32_t b)
{
    double t = 0;
    for (int32_t j = 0; j < g->blocks[b].n_ops; j++) t += g->ops[g->blocks[b].ops[j]].fwd;
    return t;
}

/* The first block of each stage (first[0] = 0, first[P] = blocks) at the
 * boundaries nearest to equal shares of the forward time. */
static void rkm__uniform_firsts(const rkm_graph *g, int32_t p, int32_t *first)
{
    int32_t nb = g->n_blocks;
    double total = 0, at = 0;
    for (int32_t b = 0; b < nb; b++) total += rkm__block_fwd(g, b);
    first[0] = 0, first[p] = nb;
    int32_t b = 0;
    for (int32_t s = 1; s < p; s++) {
        double want = total * s / p;
        /* the boundary nearest to `want`, leaving a block for each stage on either side */
        while (b < nb && at + rkm__block_fwd(g, b) <= want) at += rkm__block_fwd(g, b++);
        int32_t c = b;
        if (b < nb && want - at > at + rkm__block_fwd(g, b) - want) c = b + 1;
        if (c < first[s - 1] + 1) c = first[s - 1] + 1;
        if (c > nb - (p - s)) c = nb - (p - s);
        first[s] = c;
        while (b < c) at += rkm__block_fwd(g, b++);
    }
}

rkm_result rkm_graph_uniform_cut(const rkm_graph *g, int32_t stages, int32_t *cuts)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_finalized(g, "rkm_graph_uniform_cut");
    if (r) return r;
    if (stages < 1 || stages > g->n_blocks)
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_uniform_cut: %d stages of a graph of %d blocks (1 to %d)",
                        (int)stages, (int)g->n_blocks, (int)g->n_blocks);
    if (stages > 1 && !cuts) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_uniform_cut: cuts is NULL");
    int32_t *first = rkm__alloc(g->ctx, ((size_t)stages + 1) * sizeof *first);
    if (!first) return rkm__nomem(g->ctx, "rkm_graph_uniform_cut");
    rkm__uniform_firsts(g, stages, first);
    for (int32_t s = 1; s < stages; s++) cuts[s - 1] = g->blocks[first[s]].in;
    rkm__free(g->ctx, first, ((size_t)stages + 1) * sizeof *first);
    return RKM_OK;
}

/* ---- one stage ------------------------------------------------------------ */

/* The planning state of one call. */
typedef struct rkm__pipe_call {
    const rkm_graph *g;
    rkm_pipeline_desc d;   /* budgets: n_budgets == stages, or NULL */
    int32_t p, nb;
    double *est;           /* [s][i][j]: rotor's stage time estimate; NAN unknown, INFINITY no plan */
} rkm__pipe_call;

static uint64_t rkm__stage_budget(const rkm__pipe_call *c, int32_t s) { return c->d.budgets ? c->d.budgets[s] : c->d.budget; }

static int32_t rkm__stage_k(const rkm__pipe_call *c, int32_t s)
{
    int32_t m = c->d.micro_batches, k = c->d.schedule == RKM_PIPE_GPIPE ? m : c->p - s;
    return k < m ? k : m;
}

/* A plan's two phases' times. */
static void rkm__phase_times(const rkm_plan *p, double *fwd, double *bwd)
{
    double f = 0;
    for (int64_t i = 0; i < p->loss_step; i++)
        if (p->steps[i].kind == RKM_STEP_FWD) f += p->g->ops[p->steps[i].index].fwd;
    *fwd = f;
    *bwd = p->stats.time - f;
}

/* Stage s as blocks [i, j), planned with `algo` (the desc's solve
 * otherwise) for its budget and in-flight count: *graph and *plan (NULL
 * and RKM_OK where no plan fits; then *need, if not NULL, the smallest
 * budget the planner meets, 0 if unknown). */
static rkm_result rkm__stage_plan(const rkm__pipe_call *c, int32_t s, int32_t i, int32_t j, rkm_algo algo,
                                  rkm_graph **graph, rkm_plan **plan, uint64_t *need)
{
    *graph = NULL, *plan = NULL;
    if (need) *need = 0;
    rkm_result r = rkm__graph_stage(c->g, i, j, graph);
    if (r) return r;
    rkm_solve_desc sd = c->d.solve;
    sd.in_flight = rkm__stage_k(c, s);
    if (algo != RKM_ALGO_DEFAULT) sd.algo = algo;
    rkm_planner *pl = NULL;
    if (!(r = rkm_planner_create(*graph, &sd, &pl))) {
        r = rkm_planner_solve(pl, rkm__stage_budget(c, s), plan);
        if (r == RKM_ERROR_BUDGET) {
            r = RKM_OK;
            if (need && rkm_planner_min_budget(pl, need)) *need = 0;
        }
    }
    rkm_planner_destroy(pl);
    if (r) {
        rkm_graph_destroy(*graph);
        *graph = NULL;
    }
    return r;
}

/* Rotor's time for stage s as blocks [i, j) (both phases of one
 * micro-batch), INFINITY where it has no plan; cached. */
static rkm_result rkm__stage_est(rkm__pipe_call *c, int32_t s, int32_t i, int32_t j, double *t)
{
    double *e = &c->est[((size_t)s * (size_t)c->nb + (size_t)i) * ((size_t)c->nb + 1) + (size_t)j];
    if (isnan(*e)) {
        rkm_graph *sg;
        rkm_plan *p;
        rkm_result r = rkm__stage_plan(c, s, i, j, RKM_ALGO_ROTOR, &sg, &p, NULL);
        if (r) return r;
        *e = p ? p->stats.time : INFINITY;
        rkm_plan_destroy(p);
        rkm_graph_destroy(sg);
    }
    *t = *e;
    return RKM_OK;
}

/* Whether every stage fits within `cap` seconds, the stages taken as long
 * as they can be from the first (first[0 .. P]): a stage's time grows
 * with its blocks, so the longest first stage leaves the most to the
 * others. The baseline's time bounds a stage's from below, so the longest
 * candidate is found by bisection under that bound. */
static rkm_result rkm__pipe_fits(rkm__pipe_call *c, const double *base, double cap, int32_t *first, int *fits)
{
    *fits = 0;
    first[0] = 0;
    for (int32_t s = 0; s < c->p; s++) {
        int32_t i = first[s], lo = i + 1, hi = s == c->p - 1 ? c->nb : c->nb - (c->p - 1 - s);
        if (s < c->p - 1)
            while (hi > lo && base[hi] - base[i] > cap) hi--;
        double t;
        rkm_result r = rkm__stage_est(c, s, i, hi, &t);
        if (r) return r;
        if (s == c->p - 1) {
            first[c->p] = c->nb;
            *fits = t <= cap;
            return RKM_OK;
        }
        if (t > cap) { /* the longest that fits: at lo at least, or none */
            if ((r = rkm__stage_est(c, s, i, lo, &t))) return r;
            if (t > cap) return RKM_OK;
            while (hi - lo > 1) {
                int32_t mid = lo + (hi - lo) / 2;
                if ((r = rkm__stage_est(c, s, i, mid, &t))) return r;
                if (t <= cap) lo = mid;
                else hi = mid;
            }
            hi = lo;
        }
        first[s + 1] = hi;
    }
    return RKM_OK;
}

/* The cut whose bottleneck stage (rotor's estimate) is least: bisection
 * on the bottleneck, RKM__PIPE_BISECT rounds. *found 0 where no cut fits
 * under rotor. */
static rkm_result rkm__pipe_search(rkm__pipe_call *c, int32_t *first, int *found)
{
    int32_t nb = c->nb, p = c->p;
    double *base = rkm__alloc(c->g->ctx, ((size_t)nb + 1) * sizeof *base);
    int32_t *try_first = rkm__alloc(c->g->ctx, ((size_t)p + 1) * sizeof *try_first);
    rkm_result r = base && try_first ? RKM_OK : rkm__nomem(c->g->ctx, "pipeline search");
    *found = 0;
    if (!r) {
        base[0] = 0;
        for (int32_t b = 0; b < nb; b++) {
            double t = 0;
            for (int32_t k = 0; k < c->g->blocks[b].n_ops; k++) {
                const rkm__op *o = &c->g->ops[c->g->blocks[b].ops[k]];
                t += o->fwd + (o->has_bwd ? o->bwd : 0);
            }
            base[b + 1] = base[b] + t;
        }
        /* the bottleneck lies between a P-th of the baseline and what rotor
         * needs for the whole graph on one stage's budget, or the largest
         * stage estimate found on the way */
        double lo = base[nb] / p, hi = 0;
        int fits = 0;
        rkm__uniform_firsts(c->g, p, try_first);
        for (int32_t s = 0; s < p && !r; s++) {
            double t = 0;
            r = rkm__stage_est(c, s, try_first[s], try_first[s + 1], &t);
            if (!r && t > hi) hi = t;
        }
        if (!r && isfinite(hi) && !(r = rkm__pipe_fits(c, base, hi, first, &fits)) && fits) *found = 1;
        if (!r && !*found) { /* the uniform cut has a stage rotor cannot plan: look above it */
            for (hi = base[nb] * 4; !r && !*found && hi < base[nb] * 1024; hi *= 4)
                if (!(r = rkm__pipe_fits(c, base, hi, first, &fits)) && fits) *found = 1;
        }
        for (int k = 0; !r && *found && k < RKM__PIPE_BISECT && hi > lo * (1 + 1e-6); k++) {
            double mid = lo + (hi - lo) / 2;
            if ((r = rkm__pipe_fits(c, base, mid, try_first, &fits))) break;
            if (fits) {
                hi = mid;
                memcpy(first, try_first, ((size_t)p + 1) * sizeof *first);
            } else
                lo = mid;
        }
    }
    rkm__free(c->g->ctx, base, ((size_t)nb + 1) * sizeof *base);
    rkm__free(c->g->ctx, try_first, ((size_t)p + 1) * sizeof *try_first);
    return r;
}

/* ---- a whole pipeline ----------------------------------------------------- */

/* The pipeline of cut `first` (stage s: blocks first[s] .. first[s + 1])
 * planned with the desc's algorithm into *out; *out NULL where a stage
 * has no plan (*bad: that stage, *need: its smallest budget). */
static rkm_result rkm__pipe_make(const rkm__pipe_call *c, const int32_t *first, rkm_pipeline **out, int32_t *bad,
                                 uint64_t *need)
{
    const rkm_graph *g = c->g;
    rkm_context *ctx = g->ctx;
    int32_t p = c->p;
    *out = NULL;
    rkm_pipeline *pp = rkm__calloc(ctx, 1, sizeof *pp);
    rkm_pipe_stage *ps = rkm__calloc(ctx, (size_t)p, sizeof *ps);
    rkm_result r = pp && ps ? RKM_OK : rkm__nomem(ctx, "pipeline");
    if (!r) {
        pp->ctx = ctx;
        pp->g = g;
        rkm__graph_hold(g);
        pp->n = p;
        pp->stage = rkm__calloc(ctx, (size_t)p, sizeof *pp->stage);
        pp->plan = rkm__calloc(ctx, (size_t)p, sizeof *pp->plan);
        pp->info = rkm__calloc(ctx, (size_t)p, sizeof *pp->info);
        if (!pp->stage || !pp->plan || !pp->info) r = rkm__nomem(ctx, "pipeline");
    }
    for (int32_t s = 0; s < p && !r; s++) {
        r = rkm__stage_plan(c, s, first[s], first[s + 1], RKM_ALGO_DEFAULT, &pp->stage[s], &pp->plan[s], need);
        if (!r && !pp->plan[s]) {
            *bad = s;
            rkm_pipeline_destroy(pp);
            rkm__free(ctx, ps, (size_t)p * sizeof *ps);
            return RKM_OK;
        }
        if (r) break;
        const rkm_plan *q = pp->plan[s];
        rkm_pipeline_stage_info *in = &pp->info[s];
        const rkm__block *b0 = &g->blocks[first[s]], *b1 = &g->blocks[first[s + 1] - 1];
        in->first_op = b0->ops[0], in->last_op = b1->ops[b1->n_ops - 1];
        in->first_block = first[s], in->n_blocks = first[s + 1] - first[s];
        in->budget = rkm__stage_budget(c, s);
        in->overhead = q->stats.overhead;
        rkm__phase_times(q, &in->fwd_seconds, &in->bwd_seconds);
        rkm_stage_memory sm;
        r = rkm_plan_stage_memory(q, c->d.schedule, s, p, c->d.micro_batches, q->stats.alignment, &sm);
        in->in_flight = sm.in_flight, in->kept_bytes = sm.kept_bytes, in->peak = sm.peak, in->arena_bytes = sm.arena_bytes;
        double link = c->d.link_bytes_per_second;
        ps[s].fwd = in->fwd_seconds, ps[s].bwd = in->bwd_seconds;
        if (link > 0 && s < p - 1) ps[s].send_fwd = (double)g->tensors[g->blocks[first[s + 1]].in].bytes / link;
        if (link > 0 && s > 0) ps[s].send_bwd = (double)g->tensors[b0->in].bytes / link;
    }
    if (!r) r = rkm_pipeline_simulate(ctx, ps, p, c->d.micro_batches, c->d.schedule, NULL, NULL, &pp->step_time);
    rkm__free(ctx, ps, (size_t)p * sizeof *ps);
    if (r) {
        rkm_pipeline_destroy(pp);
        return r;
    }
    *out = pp;
    return RKM_OK;
}

/* The desc's rules, its cuts as first blocks. */
static rkm_result rkm__pipe_args(const rkm_graph *g, const rkm_pipeline_desc *d, int32_t *first)
{
    rkm_context *ctx = g->ctx;
    int32_t p = d->stages;
    if (d->micro_batches < 1 || d->micro_batches > INT32_MAX / 2)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "pipeline: %d micro-batches (at least 1)", (int)d->micro_batches);
    if (d->schedule != RKM_PIPE_1F1B && d->schedule != RKM_PIPE_GPIPE)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "pipeline: unknown schedule %d (RKM_PIPE_1F1B or RKM_PIPE_GPIPE)",
                        (int)d->schedule);
    if (d->budgets && d->n_budgets != p)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "pipeline: %d budgets for %d stages (one per stage, or one for all)",
                        (int)d->n_budgets, (int)p);
    if (!(d->link_bytes_per_second >= 0 && d->link_bytes_per_second < INFINITY))
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "pipeline: link of %g bytes/s (finite, >= 0; 0: free transfers)",
                        d->link_bytes_per_second);
    first[0] = 0, first[p] = g->n_blocks;
    for (int32_t s = 1; d->cuts && s < p; s++) {
        int32_t t = d->cuts[s - 1], b = 1;
        while (b < g->n_blocks && g->blocks[b].in != t) b++;
        if (t < 0 || (size_t)t >= g->n_tensors || b >= g->n_blocks || b <= first[s - 1])
            return rkm__err(ctx, RKM_ERROR_ARGUMENT, "pipeline: cut %d (tensor id %d) is not a block boundary after the "
                            "cut before it (rkm_graph_cut)", (int)s - 1, (int)t);
        first[s] = b;
    }
    return RKM_OK;
}

rkm_result rkm_pipeline_plan(const rkm_graph *g, const rkm_pipeline_desc *desc, rkm_pipeline **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_pipeline_plan: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_finalized(g, "rkm_pipeline_plan");
    if (r) return r;
    if (!desc) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_pipeline_plan: desc is NULL");
    rkm_context *ctx = g->ctx;
    int32_t p = desc->stages, nb = g->n_blocks;
    if (p < 1 || p > nb)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "pipeline: %d stages, but the graph has %d block(s), so %d stage(s) at most "
                        "(a stage holds whole blocks)", (int)p, (int)nb, (int)nb);
    rkm__pipe_call c = {g, *desc, p, nb, NULL};
    int32_t *first = rkm__alloc(ctx, 2 * ((size_t)p + 1) * sizeof *first), *uni = first ? first + p + 1 : NULL;
    if (!first) return rkm__nomem(ctx, "pipeline");
    if ((r = rkm__pipe_args(g, desc, first))) {
        rkm__free(ctx, first, 2 * ((size_t)p + 1) * sizeof *first);
        return r;
    }
    int32_t bad = -1;
    uint64_t need = 0;
    rkm_pipeline *best = NULL;
    if (desc->cuts || p == 1) {
        r = rkm__pipe_make(&c, first, &best, &bad, &need);
    } else {
        size_t n_est = (size_t)p * (size_t)nb * ((size_t)nb + 1);
        c.est = (size_t)p * (size_t)nb * ((size_t)nb + 1) <= SIZE_MAX / sizeof *c.est ? rkm__alloc(ctx, n_est * sizeof *c.est)
                                                                                     : NULL;
        if (!c.est) r = rkm__nomem(ctx, "pipeline search");
        for (size_t k = 0; !r && k < n_est; k++) c.est[k] = NAN;
        int found = 0;
        rkm_pipeline *u = NULL;
        rkm__uniform_firsts(g, p, uni);
        if (!r) r = rkm__pipe_search(&c, first, &found);
        if (!r && found) r = rkm__pipe_make(&c, first, &best, &bad, &need);
        if (!r) r = rkm__pipe_make(&c, uni, &u, &bad, &need); /* its failure is the one reported */
        if (!r && u && (!best || u->step_time < best->step_time)) {
            rkm_pipeline_destroy(best);
            best = u;
        } else
            rkm_pipeline_destroy(u);
        rkm__free(ctx, c.est, n_est * sizeof *c.est);
    }
    rkm__free(ctx, first, 2 * ((size_t)p + 1) * sizeof *first);
    if (r) return r;
    if (!best) {
        char needs[64] = "";
        if (need) snprintf(needs, sizeof needs, "; it needs %llu bytes at least", (unsigned long long)need);
        return rkm__err(ctx, RKM_ERROR_BUDGET, "pipeline: stage %d (%d in flight) has no %s plan within its budget of "
                        "%llu bytes%s", (int)bad, (int)rkm__stage_k(&c, bad),
                        rkm_algo_name(c.d.solve.algo ? c.d.solve.algo : RKM_ALGO_ROCKMATE),
                        (unsigned long long)rkm__stage_budget(&c, bad), needs);
    }
    *out = best;
    return RKM_OK;
}
