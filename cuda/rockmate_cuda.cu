/* rockmate_cuda.cu -- see rockmate_cuda.h. The bookkeeping is rockmate_arena.c
 * (plain C, tested on the CPU); this file adds the device memory, the
 * cudaEvent timing and the CUDA error handling. */
#include "rockmate_cuda.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* What the timing layer returns to the executor when a CUDA call failed
 * (the host's own non-zero values pass through unchanged). */
#define RKM__CU_FAILED (-0x4355)

struct rkm_cuda_arena {
    rkm_alloc_fn alloc;
    void *alloc_user;
    const rkm_graph *g;
    int32_t n_ops;
    int measure;
    rkm_arena_exec *x;
    rkm_callbacks host;
    cudaStream_t stream;
    char *base;
    uint64_t capacity;
    /* Profiling only (NULL otherwise): per op fwd start/end, bwd start/end
     * events, and whether the call ran in this step. */
    cudaEvent_t *ev;
    uint8_t *ran;
    int cuda_failed;
    rkm_result cuda_code;
    char errmsg[512];
};

rkm_result rkm_cuda_result(cudaError_t e)
{
    if (e == cudaSuccess) return RKM_OK;
    return e == cudaErrorMemoryAllocation ? RKM_ERROR_NOMEM : RKM_ERROR_CALLBACK;
}

static void rkm__cu_msg(char *buf, size_t size, const char *fmt, ...)
{
    if (!buf || !size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

/* Record a failed CUDA call on the arena; returns its rkm_result. */
static rkm_result rkm__cu_fail(rkm_cuda_arena *ca, cudaError_t e, const char *what)
{
    ca->cuda_failed = 1;
    ca->cuda_code = rkm_cuda_result(e);
    rkm__cu_msg(ca->errmsg, sizeof ca->errmsg, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return ca->cuda_code;
}

/* ---------------------------------------------------------------------------
 * The timing layer between the arena's executor and the host
 * ------------------------------------------------------------------------- */

static int rkm__cu_record(rkm_cuda_arena *ca, size_t ev_index)
{
    cudaError_t e = cudaEventRecord(ca->ev[ev_index], ca->stream);
    if (e != cudaSuccess) {
        rkm__cu_fail(ca, e, "cudaEventRecord");
        return RKM__CU_FAILED;
    }
    return 0;
}

/* Events around the host's call when profiling; which = 0 fwd, 1 bwd. */
static int rkm__cu_timed(rkm_cuda_arena *ca, int32_t op, int which, int rc_host_call(rkm_cuda_arena *, const void *),
                         const void *call)
{
    size_t e0 = (size_t)op * 4 + (size_t)which * 2;
    int rc = ca->ev ? rkm__cu_record(ca, e0) : 0;
    if (rc) return rc;
    if ((rc = rc_host_call(ca, call))) return rc;
    if (!ca->ev) return 0;
    if ((rc = rkm__cu_record(ca, e0 + 1))) return rc;
    ca->ran[(size_t)op * 2 + (size_t)which] = 1;
    return 0;
}

static int rkm__cu_host_fwd(rkm_cuda_arena *ca, const void *c)
{
    return ca->host.forward(ca->host.user, (const rkm_fwd_call *)c);
}

static int rkm__cu_host_bwd(rkm_cuda_arena *ca, const void *c)
{
    return ca->host.backward(ca->host.user, (const rkm_bwd_call *)c);
}

static int rkm__cu_forward(void *user, const rkm_fwd_call *c)
{
    return rkm__cu_timed((rkm_cuda_arena *)user, c->op, 0, rkm__cu_host_fwd, c);
}

static int rkm__cu_backward(void *user, const rkm_bwd_call *c)
{
    return rkm__cu_timed((rkm_cuda_arena *)user, c->op, 1, rkm__cu_host_bwd, c);
}

static int rkm__cu_loss(void *user, int32_t t)
{
    rkm_cuda_arena *ca = (rkm_cuda_arena *)user;
    return ca->host.loss ? ca->host.loss(ca->host.user, t) : 0;
}

static int rkm__cu_free_tensor(void *user, int32_t t)
{
    rkm_cuda_arena *ca = (rkm_cuda_arena *)user;
    return ca->host.free_tensor ? ca->host.free_tensor(ca->host.user, t) : 0;
}

static int rkm__cu_free_saved(void *user, int32_t op)
{
    rkm_cuda_arena *ca = (rkm_cuda_arena *)user;
    return ca->host.free_saved ? ca->host.free_saved(ca->host.user, op) : 0;
}

static int rkm__cu_free_grad(void *user, int32_t t)
{
    rkm_cuda_arena *ca = (rkm_cuda_arena *)user;
    return ca->host.free_grad ? ca->host.free_grad(ca->host.user, t) : 0;
}

/* ---------------------------------------------------------------------------
 * The arena
 * ------------------------------------------------------------------------- */

rkm_result rkm_cuda_arena_create(const rkm_cuda_arena_desc *d, rkm_cuda_arena **out, char *errmsg,
                                 size_t errmsg_size)
{
    rkm__cu_msg(errmsg, errmsg_size, "%s", "");
    if (!out) return RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!d || !d->graph || !d->host || !d->host->forward || !d->host->backward ||
        (!d->layout && d->capacity == RKM_ARENA_UNBOUNDED)) {
        rkm__cu_msg(errmsg, errmsg_size, "rkm_cuda_arena_create: graph, host forward and backward are required, "
                                         "and a bounded capacity or a layout plan");
        return RKM_ERROR_ARGUMENT;
    }
    if (d->layout && (d->measure || rkm_plan_graph(d->layout) != d->graph)) {
        rkm__cu_msg(errmsg, errmsg_size, "rkm_cuda_arena_create: a layout plan must be of the graph, "
                                         "and excludes measure mode");
        return RKM_ERROR_ARGUMENT;
    }
    rkm_alloc_fn fn = d->alloc ? d->alloc : rkm_arena_default_alloc;
    void *fu = d->alloc ? d->alloc_user : NULL;
    rkm_cuda_arena *ca = (rkm_cuda_arena *)fn(fu, NULL, 0, sizeof *ca);
    if (!ca) return RKM_ERROR_NOMEM;
    memset(ca, 0, sizeof *ca);
    ca->alloc = fn;
    ca->alloc_user = fu;
    ca->g = d->graph;
    ca->n_ops = rkm_graph_num_ops(d->graph);
    ca->measure = d->measure != 0;
    ca->host = *d->host;
    ca->stream = d->stream;
    ca->capacity = d->capacity;
    rkm_callbacks layer = {ca, rkm__cu_forward, rkm__cu_backward, rkm__cu_loss, rkm__cu_free_tensor,
                           rkm__cu_free_saved, rkm__cu_free_grad};
    rkm_arena_exec_desc xd = {d->graph, d->capacity, d->measure, &layer, d->alloc, d->alloc_user};
    rkm_result r = d->layout ? rkm_arena_exec_create_layout(&xd, d->layout, &ca->x) : rkm_arena_exec_create(&xd, &ca->x);
    if (r != RKM_OK) {
        if (d->layout)
            rkm__cu_msg(errmsg, errmsg_size, "rkm_cuda_arena_create: layout: %s: %s", rkm_result_string(r),
                        rkm_context_errmsg(rkm_graph_context(d->graph)));
        else
            rkm__cu_msg(errmsg, errmsg_size, "rkm_cuda_arena_create: bookkeeping: %s (%llu bytes)",
                        rkm_result_string(r), (unsigned long long)d->capacity);
        rkm_cuda_arena_destroy(ca);
        return r;
    }
    /* Layout mode: the device region is the layout's arena size. */
    rkm_arena_stats st;
    rkm_arena_exec_arena_stats(ca->x, &st);
    ca->capacity = st.capacity;
    if (ca->capacity > 0) {
        cudaError_t e = cudaMalloc((void **)&ca->base, (size_t)ca->capacity);
        if (e != cudaSuccess) {
            rkm__cu_msg(errmsg, errmsg_size, "cudaMalloc(%llu bytes): %s", (unsigned long long)ca->capacity,
                        cudaGetErrorString(e));
            ca->base = NULL;
            rkm_cuda_arena_destroy(ca);
            return rkm_cuda_result(e);
        }
    }
    *out = ca;
    return RKM_OK;
}

rkm_result rkm_cuda_arena_create_for_plan(rkm_plan *plan, const rkm_callbacks *host, cudaStream_t stream,
                                          rkm_cuda_arena **out, rkm_arena_layout_info *layout, char *errmsg,
                                          size_t errmsg_size)
{
    if (!out) return RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!plan) return RKM_ERROR_ARGUMENT;
    rkm_sim_result sim;
    rkm_result r = rkm_plan_simulate(plan, &sim, NULL);
    if (r != RKM_OK) {
        rkm__cu_msg(errmsg, errmsg_size, "%s", rkm_context_errmsg(rkm_graph_context(rkm_plan_graph(plan))));
        return r;
    }
    rkm_cuda_arena_desc d;
    memset(&d, 0, sizeof d);
    d.graph = rkm_plan_graph(plan);
    d.layout = plan;
    d.host = host;
    d.stream = stream;
    if ((r = rkm_cuda_arena_create(&d, out, errmsg, errmsg_size)) != RKM_OK) return r;
    if (layout) {
        layout->peak = sim.peak;
        layout->capacity = (*out)->capacity;
        layout->slack = layout->capacity - sim.peak;
    }
    return RKM_OK;
}

void rkm_cuda_arena_destroy(rkm_cuda_arena *ca)
{
    if (!ca) return;
    if (ca->base) (void)cudaFree(ca->base);
    rkm_arena_exec_destroy(ca->x);
    ca->alloc(ca->alloc_user, ca, sizeof *ca, 0);
}

rkm_result rkm_cuda_arena_run(rkm_cuda_arena *ca, const rkm_plan *plan)
{
    if (!ca || !plan) return RKM_ERROR_ARGUMENT;
    ca->cuda_failed = 0;
    ca->errmsg[0] = 0;
    rkm_result r = rkm_arena_exec_run(ca->x, plan);
    if (r != RKM_OK) {
        if (ca->cuda_failed) return ca->cuda_code;
        rkm__cu_msg(ca->errmsg, sizeof ca->errmsg, "%s", rkm_arena_exec_errmsg(ca->x));
        return r;
    }
    /* Launch errors of the host's kernels (faults show at the next sync). */
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? RKM_OK : rkm__cu_fail(ca, e, "after the step");
}

static void *rkm__cu_ptr(const rkm_cuda_arena *ca, uint64_t off)
{
    if (!ca || off == RKM_ARENA_NONE) return NULL;
    return ca->base ? ca->base + off : NULL;
}

void *rkm_cuda_tensor(const rkm_cuda_arena *ca, int32_t t)
{
    return ca ? rkm__cu_ptr(ca, rkm_arena_exec_tensor(ca->x, t)) : NULL;
}

void *rkm_cuda_grad(const rkm_cuda_arena *ca, int32_t t)
{
    return ca ? rkm__cu_ptr(ca, rkm_arena_exec_grad(ca->x, t)) : NULL;
}

void *rkm_cuda_saved(const rkm_cuda_arena *ca, int32_t op)
{
    return ca ? rkm__cu_ptr(ca, rkm_arena_exec_saved(ca->x, op)) : NULL;
}

rkm_result rkm_cuda_scratch(rkm_cuda_arena *ca, uint64_t bytes, void **ptr)
{
    if (!ca || !ptr) return RKM_ERROR_ARGUMENT;
    uint64_t off;
    rkm_result r = rkm_arena_exec_scratch(ca->x, bytes, &off);
    *ptr = r == RKM_OK ? rkm__cu_ptr(ca, off) : NULL;
    return r;
}

void rkm_cuda_arena_stats(const rkm_cuda_arena *ca, rkm_arena_stats *out) { rkm_arena_exec_arena_stats(ca->x, out); }

const char *rkm_cuda_arena_errmsg(const rkm_cuda_arena *ca) { return ca ? ca->errmsg : ""; }

/* ---------------------------------------------------------------------------
 * The profiler
 * ------------------------------------------------------------------------- */

/* Events and sample storage of one profile. */
typedef struct rkm__cu_prof {
    size_t n_ev, n_samples;
    cudaEvent_t *ev;   /* 4 per op, then step start and end */
    uint8_t *ran;      /* 2 per op */
    double *fwd, *bwd; /* [run * n_ops + op] seconds */
    double *step;      /* [run] */
    double *col;       /* one op's samples, sorted in place */
} rkm__cu_prof;

static void rkm__cu_prof_free(rkm_cuda_arena *ca, rkm__cu_prof *p)
{
    for (size_t i = 0; p->ev && i < p->n_ev; i++)
        if (p->ev[i]) (void)cudaEventDestroy(p->ev[i]);
    if (p->ev) ca->alloc(ca->alloc_user, p->ev, p->n_ev * sizeof *p->ev, 0);
    if (p->ran) ca->alloc(ca->alloc_user, p->ran, (size_t)ca->n_ops * 2 + 1, 0);
    if (p->fwd) ca->alloc(ca->alloc_user, p->fwd, p->n_samples * sizeof(double), 0);
    ca->ev = NULL;
    ca->ran = NULL;
}

static rkm_result rkm__cu_prof_init(rkm_cuda_arena *ca, rkm__cu_prof *p, int32_t runs)
{
    size_t no = (size_t)ca->n_ops;
    memset(p, 0, sizeof *p);
    p->n_ev = no * 4 + 2;
    p->n_samples = no * 2 * (size_t)runs + 2 * (size_t)runs;
    p->ev = (cudaEvent_t *)ca->alloc(ca->alloc_user, NULL, 0, p->n_ev * sizeof *p->ev);
    p->ran = (uint8_t *)ca->alloc(ca->alloc_user, NULL, 0, no * 2 + 1);
    p->fwd = (double *)ca->alloc(ca->alloc_user, NULL, 0, p->n_samples * sizeof(double));
    if (!p->ev || !p->ran || !p->fwd) {
        rkm__cu_prof_free(ca, p);
        rkm__cu_msg(ca->errmsg, sizeof ca->errmsg, "rkm_cuda_profile: out of host memory");
        return RKM_ERROR_NOMEM;
    }
    memset(p->ev, 0, p->n_ev * sizeof *p->ev);
    memset(p->fwd, 0, p->n_samples * sizeof(double));
    p->bwd = p->fwd + no * (size_t)runs;
    p->step = p->bwd + no * (size_t)runs;
    p->col = p->step + runs;
    for (size_t i = 0; i < p->n_ev; i++) {
        cudaError_t e = cudaEventCreate(&p->ev[i]);
        if (e != cudaSuccess) {
            p->ev[i] = NULL;
            rkm_result r = rkm__cu_fail(ca, e, "cudaEventCreate");
            rkm__cu_prof_free(ca, p);
            return r;
        }
    }
    ca->ev = p->ev;
    ca->ran = p->ran;
    return RKM_OK;
}

static rkm_result rkm__cu_elapsed(rkm_cuda_arena *ca, cudaEvent_t a, cudaEvent_t b, double *seconds)
{
    float ms = 0.0f;
    cudaError_t e = cudaEventElapsedTime(&ms, a, b);
    *seconds = (double)ms * 1e-3;
    return e == cudaSuccess ? RKM_OK : rkm__cu_fail(ca, e, "cudaEventElapsedTime");
}

/* One baseline step with events; run >= 0 stores its samples. */
static rkm_result rkm__cu_prof_step(rkm_cuda_arena *ca, rkm__cu_prof *p, const rkm_plan *plan, int32_t run)
{
    size_t no = (size_t)ca->n_ops;
    cudaEvent_t s0 = p->ev[no * 4], s1 = p->ev[no * 4 + 1];
    cudaError_t e;
    memset(p->ran, 0, no * 2);
    if ((e = cudaEventRecord(s0, ca->stream)) != cudaSuccess) return rkm__cu_fail(ca, e, "cudaEventRecord");
    rkm_result r = rkm_cuda_arena_run(ca, plan);
    if (r != RKM_OK) return r;
    if ((e = cudaEventRecord(s1, ca->stream)) != cudaSuccess) return rkm__cu_fail(ca, e, "cudaEventRecord");
    if ((e = cudaEventSynchronize(s1)) != cudaSuccess) return rkm__cu_fail(ca, e, "the profiled step");
    if (run < 0) return RKM_OK;
    size_t base = (size_t)run * no;
    for (size_t op = 0; op < no && r == RKM_OK; op++) {
        if (p->ran[op * 2]) r = rkm__cu_elapsed(ca, p->ev[op * 4], p->ev[op * 4 + 1], &p->fwd[base + op]);
        if (r == RKM_OK && p->ran[op * 2 + 1])
            r = rkm__cu_elapsed(ca, p->ev[op * 4 + 2], p->ev[op * 4 + 3], &p->bwd[base + op]);
    }
    return r == RKM_OK ? rkm__cu_elapsed(ca, s0, s1, &p->step[run]) : r;
}

/* Trimmed means of the samples and the measured workspaces into g. */
static rkm_result rkm__cu_prof_apply(rkm_cuda_arena *ca, rkm__cu_prof *p, rkm_graph *g, int32_t runs, double trim,
                                     double *sum)
{
    size_t no = (size_t)ca->n_ops;
    *sum = 0.0;
    for (size_t op = 0; op < no; op++) {
        double t[2];
        for (int k = 0; k < 2; k++) {
            const double *src = k ? p->bwd : p->fwd;
            for (int32_t i = 0; i < runs; i++) p->col[i] = src[(size_t)i * no + op];
            t[k] = rkm_trimmed_mean(p->col, (size_t)runs, trim);
            *sum += t[k];
        }
        uint64_t fws, bws;
        rkm_arena_exec_measured_ws(ca->x, (int32_t)op, &fws, &bws);
        rkm_result r = rkm_graph_set_op_costs(g, (int32_t)op, t[0], t[1], fws, bws);
        if (r != RKM_OK) {
            rkm__cu_msg(ca->errmsg, sizeof ca->errmsg, "rkm_graph_set_op_costs: %s",
                        rkm_context_errmsg(rkm_graph_context(g)));
            return r;
        }
    }
    return RKM_OK;
}

rkm_result rkm_cuda_profile(rkm_cuda_arena *ca, rkm_graph *g, const rkm_cuda_profile_desc *desc,
                            rkm_cuda_profile_result *out)
{
    if (!ca || !g) return RKM_ERROR_ARGUMENT;
    if (!ca->measure || g != ca->g) {
        rkm__cu_msg(ca->errmsg, sizeof ca->errmsg, "rkm_cuda_profile: needs a measuring arena made on this graph");
        return RKM_ERROR_ARGUMENT;
    }
    int32_t runs = desc && desc->runs > 0 ? desc->runs : 5;
    int32_t warmup = !desc || desc->warmup == 0 ? 1 : desc->warmup < 0 ? 0 : desc->warmup;
    double trim = desc && desc->trim > 0.0 ? desc->trim : 0.2;
    rkm_plan *plan = NULL;
    rkm_result r = rkm_plan_baseline(g, &plan);
    if (r != RKM_OK) {
        rkm__cu_msg(ca->errmsg, sizeof ca->errmsg, "baseline plan: %s", rkm_context_errmsg(rkm_graph_context(g)));
        return r;
    }
    rkm__cu_prof p;
    if ((r = rkm__cu_prof_init(ca, &p, runs)) != RKM_OK) {
        rkm_plan_destroy(plan);
        return r;
    }
    for (int32_t i = -warmup; i < runs && r == RKM_OK; i++) r = rkm__cu_prof_step(ca, &p, plan, i);
    double sum = 0.0;
    if (r == RKM_OK) r = rkm__cu_prof_apply(ca, &p, g, runs, trim, &sum);
    if (r == RKM_OK && out) {
        rkm_arena_stats st;
        rkm_cuda_arena_stats(ca, &st);
        out->step_seconds = rkm_trimmed_mean(p.step, (size_t)runs, trim);
        out->sum_op_seconds = sum;
        out->peak = st.peak;
    }
    rkm__cu_prof_free(ca, &p);
    rkm_plan_destroy(plan);
    return r;
}
