/* exec.c -- the executor and the profiler
 *
 * Uses (through internal.h): base.c, graph.c, plan.c, baseline.c. */
#include "internal.h"

static rkm_result rkm__cb_fail(const rkm_plan *p, size_t i, const char *which, int code)
{
    char text[RKM__NAME_MAX + 32];
    rkm_step_text(p->g, &p->steps[i], text, sizeof text);
    return rkm__err(p->ctx, RKM_ERROR_CALLBACK, "step %zu (%s): the %s callback returned %d", i, text, which, code);
}

/* The callback each step kind calls (by rkm_step_kind), for messages. */
static const char *const rkm__callback_names[RKM__STEP_KINDS] = {
    "forward", "loss", "backward", "free_tensor", "free_saved", "free_grad", "offload", "prefetch", "wait", "free_host"};

/* The callback of a copy step. */
static int (*rkm__copy_callback(const rkm_callbacks *cb, int32_t kind))(void *, const rkm_copy_call *)
{
    switch (kind) {
    case RKM_STEP_OFFLOAD: return cb->offload;
    case RKM_STEP_PREFETCH: return cb->prefetch;
    case RKM_STEP_WAIT: return cb->wait;
    default: return cb->free_host;
    }
}

/* The optional callback of a step that is neither fwd nor bwd. */
static int (*rkm__buffer_callback(const rkm_callbacks *cb, int32_t kind))(void *, const rkm_buffer_call *)
{
    switch (kind) {
    case RKM_STEP_LOSS: return cb->loss;
    case RKM_STEP_FREE: return cb->free_tensor;
    case RKM_STEP_FREE_SAVED: return cb->free_saved;
    default: return cb->free_grad;
    }
}

/* Call the host for step i of micro-batch `micro`. */
static int rkm__call_step(const rkm_plan *p, const rkm_callbacks *cb, size_t i, int32_t micro)
{
    const rkm_step *st = &p->steps[i];
    const uint8_t *fl = p->flags + p->flag_off[i];
    const rkm__op *o = st->kind == RKM_STEP_FWD || st->kind == RKM_STEP_BWD ? &p->g->ops[st->index] : NULL;
    if (st->kind == RKM_STEP_FWD) {
        rkm_fwd_call c = {(int64_t)i, st->index, st->save,    fl[0],      o->in,
                          o->n_in,    o->out,     o->n_out,    fl + 2,     o->phantom,
                          o->fwd_ws + (fl[1] ? o->scratch : 0), micro};
        return cb->forward(cb->user, &c);
    }
    if (st->kind == RKM_STEP_BWD) {
        rkm_bwd_call c = {(int64_t)i, st->index, o->in,  o->n_in,     o->out,     o->n_out,
                          fl,               fl + o->n_in, o->saved, o->n_saved, o->phantom, o->bwd_ws, micro};
        return cb->backward(cb->user, &c);
    }
    if (st->kind >= RKM_STEP_OFFLOAD) {
        int (*copy)(void *, const rkm_copy_call *) = rkm__copy_callback(cb, st->kind);
        uint64_t bytes = st->save ? p->g->ops[st->index].phantom : p->g->tensors[st->index].bytes;
        rkm_copy_call c = {(int64_t)i, st->index, st->save, bytes, p->peer[i], micro};
        return copy ? copy(cb->user, &c) : 0;
    }
    int (*fn)(void *, const rkm_buffer_call *) = rkm__buffer_callback(cb, st->kind);
    uint64_t bytes = st->kind == RKM_STEP_FREE_SAVED ? p->g->ops[st->index].phantom : p->g->tensors[st->index].bytes;
    rkm_buffer_call c = {(int64_t)i, st->index, bytes, micro};
    return fn ? fn(cb->user, &c) : 0;
}

/* Profiling: the walk times every forward and backward call with a clock. */
typedef struct rkm__prof {
    double (*clock)(void *);
    void *user; /* the desc's, for clock and after_run */
    int (*after_run)(void *, int32_t);
    double *fwd, *bwd; /* [run * n_ops + op] */
    size_t n_ops;
    int32_t run;
} rkm__prof;

/* Walk steps [from, to) of the plan calling the host; with pr, time its
 * forwards and backwards. */
static rkm_result rkm__walk(const rkm_plan *p, size_t from, size_t to, int32_t micro, const rkm_callbacks *cb,
                            rkm__prof *pr)
{
    for (size_t i = from; i < to; i++) {
        int32_t kind = p->steps[i].kind;
        int timed = pr && (kind == RKM_STEP_FWD || kind == RKM_STEP_BWD);
        double t0 = timed ? pr->clock(pr->user) : 0;
        int rc = rkm__call_step(p, cb, i, micro);
        if (timed) {
            double *samples = kind == RKM_STEP_FWD ? pr->fwd : pr->bwd;
            samples[(size_t)pr->run * pr->n_ops + (size_t)p->steps[i].index] = pr->clock(pr->user) - t0;
        }
        if (rc) return rkm__cb_fail(p, i, rkm__callback_names[kind], rc);
    }
    return RKM_OK;
}

/* One profiling run, then the host's after_run hook. */
static rkm_result rkm__profile_run(const rkm_plan *p, const rkm_callbacks *cb, rkm__prof *pr)
{
    rkm_result r = rkm__walk(p, 0, p->n_steps, 0, cb, pr);
    int rc = r || !pr->after_run ? 0 : pr->after_run(pr->user, pr->run);
    if (rc)
        return rkm__err(p->ctx, RKM_ERROR_CALLBACK, "rkm_graph_profile: the after_run callback returned %d after run %d",
                        rc, (int)pr->run);
    return r;
}

/* The callbacks a walk of plan p needs (p NULL: any plan without copies). */
static rkm_result rkm__callbacks_ok(rkm_context *ctx, const rkm_plan *p, const rkm_callbacks *cb, const char *fn)
{
    if (!cb) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: callbacks are NULL", fn);
    if (!cb->forward || !cb->backward)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: the forward and backward callbacks are required", fn);
    if (p && p->peer && (!cb->offload || !cb->prefetch || !cb->wait))
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: the plan copies tensors to the host: the offload, prefetch and "
                        "wait callbacks are required", fn);
    return RKM_OK;
}

rkm_result rkm_plan_execute(const rkm_plan *p, const rkm_callbacks *cb)
{
    if (!p) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__callbacks_ok(p->ctx, p, cb, "rkm_plan_execute");
    return r ? r : rkm__walk(p, 0, p->n_steps, 0, cb, NULL);
}

int64_t rkm_plan_phase_step(const rkm_plan *p) { return p ? p->loss_step : -1; }

rkm_result rkm_plan_execute_phase(const rkm_plan *p, int phase, int32_t micro, const rkm_callbacks *cb)
{
    if (!p) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__callbacks_ok(p->ctx, p, cb, "rkm_plan_execute_phase");
    if (!r && (phase < 0 || phase > 1 || micro < 0))
        r = rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_execute_phase: phase %d, micro-batch %d (phase 0 or 1, "
                     "micro-batch >= 0)", phase, (int)micro);
    size_t at = (size_t)p->loss_step;
    return r ? r : phase ? rkm__walk(p, at, p->n_steps, micro, cb, NULL) : rkm__walk(p, 0, at, micro, cb, NULL);
}

static double rkm__default_clock(void *user)
{
    (void)user;
    return rkm__now();
}

static int rkm__cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double rkm_trimmed_mean(double *samples, size_t n, double trim)
{
    if (n == 0 || !samples) return 0.0;
    if (!(trim > 0.0)) trim = 0.0; /* also NaN */
    if (trim > 0.5) trim = 0.5;
    qsort(samples, n, sizeof *samples, rkm__cmp_double);
    /* The epsilon keeps 0.2 * 10 from flooring to 1 on rounding. */
    size_t drop = (size_t)floor((double)n * trim + 1e-9);
    if (drop > (n - 1) / 2) drop = (n - 1) / 2;
    double sum = 0.0;
    for (size_t i = drop; i < n - drop; i++) sum += samples[i];
    return sum / (double)(n - 2 * drop);
}

static rkm_result rkm__profile_defaults(const rkm_graph *g, const rkm_profile_desc *desc, rkm_profile_desc *d)
{
    memset(d, 0, sizeof *d);
    if (desc) *d = *desc;
    if (d->runs < 0)
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "profile desc: runs is %d (positive, or 0 for the default)", (int)d->runs);
    if (!(d->trim >= 0 && d->trim < 0.5))
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "profile desc: trim is %g (in [0, 0.5), 0 for the default)", d->trim);
    if (d->runs == 0) d->runs = 5;
    if (d->trim == 0) d->trim = 0.2;
    if (!d->clock) d->clock = rkm__default_clock;
    return RKM_OK;
}

/* Each op's trimmed means over the runs' samples. */
static void rkm__profile_costs(const rkm_graph *g, const rkm__prof *pr, const rkm_profile_desc *d, double *col,
                               rkm_op_costs *costs)
{
    for (size_t i = 0; i < g->n_ops; i++) {
        rkm_op_costs *c = &costs[i];
        c->fwd_ws = g->ops[i].fwd_ws;
        c->bwd_ws = g->ops[i].bwd_ws;
        for (int32_t k = 0; k < d->runs; k++) col[k] = pr->fwd[(size_t)k * g->n_ops + i];
        c->fwd_seconds = rkm_trimmed_mean(col, (size_t)d->runs, d->trim);
        for (int32_t k = 0; k < d->runs; k++) col[k] = pr->bwd[(size_t)k * g->n_ops + i];
        c->bwd_seconds = g->ops[i].has_bwd ? rkm_trimmed_mean(col, (size_t)d->runs, d->trim) : 0;
    }
}

rkm_result rkm_graph_profile(const rkm_graph *g, const rkm_callbacks *cb, const rkm_profile_desc *desc, rkm_graph **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_profile: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_profile_desc d;
    rkm_result r = rkm__callbacks_ok(g->ctx, NULL, cb, "rkm_graph_profile");
    if (!r) r = rkm__profile_defaults(g, desc, &d);
    rkm_plan *p = NULL;
    if (!r) r = rkm__plan_baseline(g, &p);
    if (r) return r;
    size_t n = (size_t)d.runs * g->n_ops, size = (2 * n + (size_t)d.runs) * sizeof(double);
    rkm__prof pr = {d.clock, d.user, d.after_run, NULL, NULL, g->n_ops, 0};
    pr.fwd = rkm__calloc(g->ctx, 1, size);
    rkm_op_costs *costs = rkm__calloc(g->ctx, g->n_ops + 1, sizeof *costs);
    if (!pr.fwd || !costs) r = rkm__nomem(g->ctx, "rkm_graph_profile");
    if (!r) {
        pr.bwd = pr.fwd + n;
        for (pr.run = 0; pr.run < d.runs && !r; pr.run++) r = rkm__profile_run(p, cb, &pr);
    }
    if (!r) {
        rkm__profile_costs(g, &pr, &d, pr.bwd + n, costs); /* the last runs doubles: one op's samples */
        r = rkm_graph_with_costs(g, costs, out);
    }
    rkm__free(g->ctx, pr.fwd, size);
    rkm__free(g->ctx, costs, (g->n_ops + 1) * sizeof *costs);
    rkm_plan_destroy(p);
    return r;
}
