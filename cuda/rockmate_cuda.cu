/* rockmate_cuda.cu -- see rockmate_cuda.h. The bookkeeping is the library's
 * arena (rockmate.h, "Arena"; tested on the CPU); this file adds the device memory, the
 * cudaEvent timing and the CUDA error handling. */
#include "rockmate_cuda.h"

#include <string.h>

#include <chrono>

struct rkm_cuda_arena {
    rkm_context *ctx; /* the graph's: allocator and messages */
    const rkm_graph *g;
    int32_t n_ops;
    int measure;
    rkm_arena_exec *x;
    rkm_callbacks host;
    cudaStream_t stream;
    char *base;       /* the region, aligned as the exec's offsets are */
    char *block;      /* the cudaMalloc that holds it */
    uint64_t capacity;
    /* Poisoning (desc.poison): the scratch buffers the call in progress
     * took, filled with POISON when it returns. */
    int poison;
    void *scratch[RKM_ARENA_MAX_SCRATCH];
    uint64_t scratch_bytes[RKM_ARENA_MAX_SCRATCH];
    int n_scratch;
    /* Profiling only (NULL otherwise): per op fwd start/end, bwd start/end
     * events, and whether the call ran in this step. */
    cudaEvent_t *ev;
    uint8_t *ran;
    /* Offloading (desc.plan has copy steps): the two copy streams, device
     * to host and back; one pinned host region with a buffer per tensor or
     * saved state the plan offloads (pin_off per copy slot: tensors, then
     * ops; RKM__CU_NO_PIN where none); per such slot the event its latest
     * copy records when done; `ready`, recorded on the compute stream where
     * a copy is issued, which the copy stream then waits for. */
    int32_t n_tensors;
    cudaStream_t copy[2];
    cudaEvent_t ready;
    char *pinned;
    uint64_t pinned_bytes;
    uint64_t *pin_off;
    cudaEvent_t *done;
};

#define RKM__CU_NO_PIN UINT64_MAX

/* 0xff bytes: every float a NaN, every int -1. */
#define RKM__CU_POISON 0xff

rkm_result rkm_cuda_result(cudaError_t e)
{
    if (e == cudaSuccess) return RKM_OK;
    return e == cudaErrorMemoryAllocation ? RKM_ERROR_NOMEM : RKM_ERROR_CALLBACK;
}

/* A failed CUDA call outside a step: the message in the context. */
static rkm_result rkm__cu_fail(rkm_cuda_arena *ca, cudaError_t e, const char *what)
{
    return rkm_context_fail(ca->ctx, rkm_cuda_result(e), "%s: %s (%s)", what, cudaGetErrorString(e),
                            cudaGetErrorName(e));
}

/* Host memory back to the context: NULL (an allocation that failed, or
 * none made) is not freed, so the allocator is never given a size with
 * no block (the rkm_alloc_fn convention). */
static void rkm__cu_free(rkm_cuda_arena *ca, void *ptr, size_t bytes)
{
    if (ptr) (void)rkm_context_realloc(ca->ctx, ptr, bytes, 0);
}

/* ---------------------------------------------------------------------------
 * The timing layer between the arena's executor and the host
 * ------------------------------------------------------------------------- */

/* Inside a step: a failed record is the layer's own callback failure, which
 * the exec reports after the step with the CUDA error's code. */
static int rkm__cu_record(rkm_cuda_arena *ca, size_t ev_index)
{
    cudaError_t e = cudaEventRecord(ca->ev[ev_index], ca->stream);
    if (e == cudaSuccess) return 0;
    return rkm_arena_exec_host_fail(ca->x, rkm_cuda_result(e), "cudaEventRecord around op %d: %s (%s)",
                                    (int)(ev_index / 4), cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Poisoning: fill a buffer the step no longer holds, in stream order
 * (after every kernel that read it, before any that reuses its range). */
static int rkm__cu_poison(rkm_cuda_arena *ca, void *ptr, uint64_t bytes, const char *what)
{
    if (!ca->poison || !ptr || !bytes) return 0;
    cudaError_t e = cudaMemsetAsync(ptr, RKM__CU_POISON, (size_t)bytes, ca->stream);
    if (e == cudaSuccess) return 0;
    return rkm_arena_exec_host_fail(ca->x, rkm_cuda_result(e), "poisoning %s (cudaMemsetAsync of %llu bytes): %s (%s)",
                                    what, (unsigned long long)bytes, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* The host's forward (f) or backward (b) call, between events when
 * profiling; with poisoning, its scratch buffers poisoned after it. */
static int rkm__cu_call(void *user, int32_t op, const rkm_fwd_call *f, const rkm_bwd_call *b)
{
    rkm_cuda_arena *ca = (rkm_cuda_arena *)user;
    size_t which = f ? 0 : 1, e0 = (size_t)op * 4 + which * 2;
    int rc = ca->ev ? rkm__cu_record(ca, e0) : 0;
    ca->n_scratch = 0;
    if (!rc) rc = f ? ca->host.forward(ca->host.user, f) : ca->host.backward(ca->host.user, b);
    for (int i = 0; i < ca->n_scratch && !rc; i++)
        rc = rkm__cu_poison(ca, ca->scratch[i], ca->scratch_bytes[i], "a scratch buffer");
    ca->n_scratch = 0;
    if (rc || !ca->ev) return rc;
    if ((rc = rkm__cu_record(ca, e0 + 1))) return rc;
    ca->ran[(size_t)op * 2 + which] = 1;
    return 0;
}

static int rkm__cu_forward(void *user, const rkm_fwd_call *c) { return rkm__cu_call(user, c->op, c, NULL); }
static int rkm__cu_backward(void *user, const rkm_bwd_call *c) { return rkm__cu_call(user, c->op, NULL, c); }

/* The loss and the frees reach the host's hooks unchanged (only forward and
 * backward calls are timed); kind picks the hook. */
enum { RKM__CU_LOSS, RKM__CU_FREE_TENSOR, RKM__CU_FREE_SAVED, RKM__CU_FREE_GRAD };

static int rkm__cu_pass(void *user, int kind, const rkm_buffer_call *call)
{
    rkm_cuda_arena *ca = (rkm_cuda_arena *)user;
    const rkm_callbacks *h = &ca->host;
    int (*hook)(void *, const rkm_buffer_call *) = kind == RKM__CU_LOSS          ? h->loss
                                                   : kind == RKM__CU_FREE_TENSOR ? h->free_tensor
                                                   : kind == RKM__CU_FREE_SAVED  ? h->free_saved
                                                                                 : h->free_grad;
    int rc = hook ? hook(h->user, call) : 0;
    if (rc || kind == RKM__CU_LOSS) return rc;
    /* A free step: the buffer is still the arena's until this returns. */
    void *ptr = kind == RKM__CU_FREE_TENSOR ? rkm_cuda_tensor(ca, call->index)
                : kind == RKM__CU_FREE_SAVED ? rkm_cuda_saved(ca, call->index)
                                             : rkm_cuda_grad(ca, call->index);
    return rkm__cu_poison(ca, ptr, call->bytes, "a freed buffer");
}

static int rkm__cu_loss(void *user, const rkm_buffer_call *c) { return rkm__cu_pass(user, RKM__CU_LOSS, c); }
static int rkm__cu_free_tensor(void *user, const rkm_buffer_call *c) { return rkm__cu_pass(user, RKM__CU_FREE_TENSOR, c); }
static int rkm__cu_free_saved(void *user, const rkm_buffer_call *c) { return rkm__cu_pass(user, RKM__CU_FREE_SAVED, c); }
static int rkm__cu_free_grad(void *user, const rkm_buffer_call *c) { return rkm__cu_pass(user, RKM__CU_FREE_GRAD, c); }

/* Copies: the arena makes them; the host's hooks, if any, are told after. */
static size_t rkm__cu_slot(const rkm_cuda_arena *ca, const rkm_copy_call *c)
{
    return (size_t)(c->saved ? ca->n_tensors : 0) + (size_t)c->index;
}

static int rkm__cu_copy_fail(rkm_cuda_arena *ca, const rkm_copy_call *c, const char *what, cudaError_t e)
{
    return rkm_arena_exec_host_fail(ca->x, rkm_cuda_result(e), "%s of %s %d: %s (%s)", what,
                                    c->saved ? "the saved state of op" : "tensor", (int)c->index,
                                    cudaGetErrorString(e), cudaGetErrorName(e));
}

/* An offload (h2d 0) or a prefetch (1): on its copy stream, after every
 * kernel issued so far on the compute stream (the contract's time model:
 * a copy starts at the compute clock; and the prefetch's range may have
 * been another buffer's), then the slot's event. */
static int rkm__cu_copy(void *user, int h2d, const rkm_copy_call *c)
{
    rkm_cuda_arena *ca = (rkm_cuda_arena *)user;
    size_t slot = rkm__cu_slot(ca, c);
    const char *what = h2d ? "prefetch" : "offload";
    if (!ca->pin_off || ca->pin_off[slot] == RKM__CU_NO_PIN)
        return rkm_arena_exec_host_fail(ca->x, RKM_ERROR_ARGUMENT,
                                        "%s of %s %d: the arena has no pinned buffer for it: make it for this "
                                        "plan (rkm_cuda_arena_desc.plan)", what,
                                        c->saved ? "the saved state of op" : "tensor", (int)c->index);
    void *dev = c->saved ? rkm_cuda_saved(ca, c->index) : rkm_cuda_tensor(ca, c->index);
    void *host = ca->pinned + ca->pin_off[slot];
    cudaStream_t s = ca->copy[h2d];
    cudaError_t e = cudaEventRecord(ca->ready, ca->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s, ca->ready, 0);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(h2d ? dev : host, h2d ? host : dev, (size_t)c->bytes,
                            h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaEventRecord(ca->done[slot], s);
    if (e != cudaSuccess) return rkm__cu_copy_fail(ca, c, what, e);
    int (*hook)(void *, const rkm_copy_call *) = h2d ? ca->host.prefetch : ca->host.offload;
    return hook ? hook(ca->host.user, c) : 0;
}

static int rkm__cu_offload(void *user, const rkm_copy_call *c) { return rkm__cu_copy(user, 0, c); }
static int rkm__cu_prefetch(void *user, const rkm_copy_call *c) { return rkm__cu_copy(user, 1, c); }

/* wait: the compute stream waits for the copy's event; nothing blocks. */
static int rkm__cu_wait(void *user, const rkm_copy_call *c)
{
    rkm_cuda_arena *ca = (rkm_cuda_arena *)user;
    cudaError_t e = cudaStreamWaitEvent(ca->stream, ca->done[rkm__cu_slot(ca, c)], 0);
    if (e != cudaSuccess) return rkm__cu_copy_fail(ca, c, "wait", e);
    return ca->host.wait ? ca->host.wait(ca->host.user, c) : 0;
}

/* free_host: the pinned buffer stays the arena's, for the next step. */
static int rkm__cu_free_host(void *user, const rkm_copy_call *c)
{
    rkm_cuda_arena *ca = (rkm_cuda_arena *)user;
    return ca->host.free_host ? ca->host.free_host(ca->host.user, c) : 0;
}

/* ---------------------------------------------------------------------------
 * The arena
 * ------------------------------------------------------------------------- */

/* The desc's own rules (the exec checks the rest: graph, mode, plan). */
static rkm_result rkm__cu_check_desc(rkm_context *ctx, const rkm_cuda_arena_desc *d)
{
    if (!d->host || !d->host->forward || !d->host->backward)
        return rkm_context_fail(ctx, RKM_ERROR_ARGUMENT,
                                "rkm_cuda_arena_create: the host's forward and backward callbacks are required");
    if (d->capacity == RKM_ARENA_UNBOUNDED)
        return rkm_context_fail(ctx, RKM_ERROR_ARGUMENT,
                                "rkm_cuda_arena_create: a device arena needs a bounded capacity (or 0 and a plan)");
    return RKM_OK;
}

/* The alignment of the exec's offsets (rockmate.h, "Where the region is"):
 * the plan's in layout mode, RKM_ARENA_ALIGN in the first-fit modes. */
static uint64_t rkm__cu_align(const rkm_cuda_arena_desc *d)
{
    rkm_plan_stats ps;
    if (d->mode == RKM_ARENA_LAYOUT && rkm_plan_stats_get(d->plan, &ps) == RKM_OK && ps.alignment)
        return ps.alignment;
    return RKM_ARENA_ALIGN;
}

/* The device region: the exec's capacity (the layout's arena size in
 * layout mode), its base aligned as the offsets are. cudaMalloc gives 256
 * bytes, enough for any alignment up to it; a larger plan alignment gets
 * alignment - 1 bytes more and the first aligned byte. */
static rkm_result rkm__cu_malloc(rkm_cuda_arena *ca, uint64_t align)
{
    rkm_arena_stats st;
    rkm_arena_exec_stats_get(ca->x, &st);
    ca->capacity = st.capacity;
    if (ca->capacity == 0) return RKM_OK;
    uint64_t pad = align > RKM_ARENA_ALIGN ? align - 1 : 0;
    if (ca->capacity > UINT64_MAX - pad || ca->capacity + pad > SIZE_MAX)
        return rkm_context_fail(ca->ctx, RKM_ERROR_NOMEM, "rkm_cuda_arena_create: the region of %llu bytes, plus "
                                "%llu to align its base to %llu, is more than an allocation holds",
                                (unsigned long long)ca->capacity, (unsigned long long)pad, (unsigned long long)align);
    cudaError_t e = cudaMalloc((void **)&ca->block, (size_t)(ca->capacity + pad));
    if (e == cudaSuccess) ca->base = ca->block + (align - (uint64_t)(uintptr_t)ca->block % align) % align;
    /* Poisoned before the host fills the inputs, whatever stream it uses. */
    if (e == cudaSuccess && ca->poison) e = cudaMemsetAsync(ca->base, RKM__CU_POISON, (size_t)ca->capacity, ca->stream);
    if (e == cudaSuccess && ca->poison) e = cudaStreamSynchronize(ca->stream);
    if (e == cudaSuccess) return RKM_OK;
    if (ca->block) (void)cudaFree(ca->block);
    ca->block = ca->base = NULL;
    return rkm_context_fail(ca->ctx, rkm_cuda_result(e), "rkm_cuda_arena_create: cudaMalloc(%llu bytes): %s (%s)",
                            (unsigned long long)(ca->capacity + pad), cudaGetErrorString(e), cudaGetErrorName(e));
}

/* The bytes of copy slot i (a tensor's, or an op's saved state). */
static uint64_t rkm__cu_slot_bytes(const rkm_cuda_arena *ca, size_t i)
{
    rkm_tensor_info ti;
    rkm_op_desc oi;
    if (i < (size_t)ca->n_tensors) return rkm_graph_tensor_info(ca->g, (int32_t)i, &ti) == RKM_OK ? ti.bytes : 0;
    return rkm_graph_op_info(ca->g, (int32_t)(i - (size_t)ca->n_tensors), &oi) == RKM_OK ? oi.phantom : 0;
}

static void rkm__cu_copies_close(rkm_cuda_arena *ca)
{
    size_t n = (size_t)ca->n_tensors + (size_t)ca->n_ops;
    for (int k = 0; k < 2; k++) /* copies still queued (a failed step's) end before their buffers go */
        if (ca->copy[k]) (void)cudaStreamSynchronize(ca->copy[k]), (void)cudaStreamDestroy(ca->copy[k]);
    for (size_t i = 0; ca->done && i < n; i++)
        if (ca->done[i]) (void)cudaEventDestroy(ca->done[i]);
    if (ca->ready) (void)cudaEventDestroy(ca->ready);
    if (ca->pinned) (void)cudaFreeHost(ca->pinned);
    rkm__cu_free(ca, ca->done, n * sizeof *ca->done);
    rkm__cu_free(ca, ca->pin_off, n * sizeof *ca->pin_off);
    ca->done = NULL, ca->pin_off = NULL, ca->pinned = NULL, ca->ready = NULL, ca->copy[0] = ca->copy[1] = NULL;
}

/* Lays out one pinned buffer per slot the plan offloads (256-byte aligned). */
static uint64_t rkm__cu_pin_layout(rkm_cuda_arena *ca, const rkm_plan *plan)
{
    const rkm_step *st = rkm_plan_steps(plan);
    size_t n = (size_t)ca->n_tensors + (size_t)ca->n_ops;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) ca->pin_off[i] = RKM__CU_NO_PIN;
    for (size_t k = 0; k < rkm_plan_num_steps(plan); k++) {
        size_t i = (size_t)(st[k].save ? ca->n_tensors : 0) + (size_t)st[k].index;
        if (st[k].kind != RKM_STEP_OFFLOAD || ca->pin_off[i] != RKM__CU_NO_PIN) continue;
        ca->pin_off[i] = total;
        total += (rkm__cu_slot_bytes(ca, i) + 255) / 256 * 256;
    }
    return total;
}

/* For a plan with copy steps: the copy streams (non-blocking: no implicit
 * order with the legacy stream, only the events below), the pinned region
 * (cudaMallocHost, once), the events. */
static rkm_result rkm__cu_copies_open(rkm_cuda_arena *ca, const rkm_plan *plan)
{
    rkm_plan_stats ps;
    size_t n = (size_t)ca->n_tensors + (size_t)ca->n_ops;
    if (!plan || rkm_plan_stats_get(plan, &ps) != RKM_OK || ps.offloads == 0) return RKM_OK;
    ca->pin_off = (uint64_t *)rkm_context_realloc(ca->ctx, NULL, 0, n * sizeof *ca->pin_off);
    ca->done = (cudaEvent_t *)rkm_context_realloc(ca->ctx, NULL, 0, n * sizeof *ca->done);
    if (!ca->pin_off || !ca->done)
        return rkm_context_fail(ca->ctx, RKM_ERROR_NOMEM, "rkm_cuda_arena_create: no memory for the copy slots");
    memset(ca->done, 0, n * sizeof *ca->done);
    ca->pinned_bytes = rkm__cu_pin_layout(ca, plan);
    const char *what = "cudaMallocHost";
    cudaError_t e = cudaMallocHost((void **)&ca->pinned, (size_t)ca->pinned_bytes);
    for (int k = 0; k < 2 && e == cudaSuccess; k++) {
        what = "cudaStreamCreateWithFlags";
        e = cudaStreamCreateWithFlags(&ca->copy[k], cudaStreamNonBlocking);
    }
    if (e == cudaSuccess) what = "cudaEventCreate", e = cudaEventCreate(&ca->ready);
    for (size_t i = 0; i < n && e == cudaSuccess; i++)
        if (ca->pin_off[i] != RKM__CU_NO_PIN) e = cudaEventCreate(&ca->done[i]);
    if (e == cudaSuccess) return RKM_OK;
    return rkm_context_fail(ca->ctx, rkm_cuda_result(e), "rkm_cuda_arena_create: copies: %s (%llu pinned bytes): %s (%s)",
                            what, (unsigned long long)ca->pinned_bytes, cudaGetErrorString(e), cudaGetErrorName(e));
}

rkm_result rkm_cuda_arena_create(const rkm_cuda_arena_desc *d, rkm_cuda_arena **out)
{
    if (out) *out = NULL;
    if (!d || !d->graph) return RKM_ERROR_ARGUMENT; /* no context to tell */
    rkm_context *ctx = rkm_graph_context(d->graph);
    if (!out) return rkm_context_fail(ctx, RKM_ERROR_ARGUMENT, "rkm_cuda_arena_create: out is NULL");
    rkm_result r = rkm__cu_check_desc(ctx, d);
    if (r != RKM_OK) return r;
    rkm_cuda_arena *ca = (rkm_cuda_arena *)rkm_context_realloc(ctx, NULL, 0, sizeof *ca);
    if (!ca) return rkm_context_fail(ctx, RKM_ERROR_NOMEM, "rkm_cuda_arena_create: no memory for the arena");
    memset(ca, 0, sizeof *ca);
    ca->ctx = ctx;
    ca->g = d->graph;
    ca->n_ops = rkm_graph_num_ops(d->graph);
    ca->measure = d->mode == RKM_ARENA_MEASURE;
    ca->poison = d->poison != 0;
    ca->host = *d->host;
    ca->stream = d->stream;
    ca->n_tensors = rkm_graph_num_tensors(d->graph);
    rkm_callbacks layer = {ca,
                           rkm__cu_forward,
                           rkm__cu_backward,
                           rkm__cu_loss,
                           rkm__cu_free_tensor,
                           rkm__cu_free_saved,
                           rkm__cu_free_grad,
                           rkm__cu_offload,
                           rkm__cu_prefetch,
                           rkm__cu_wait,
                           rkm__cu_free_host};
    rkm_arena_exec_desc xd;
    memset(&xd, 0, sizeof xd);
    xd.graph = d->graph;
    xd.mode = d->mode;
    xd.plan = d->plan;
    xd.capacity = d->capacity;
    xd.host = &layer;
    r = rkm_arena_exec_create(&xd, &ca->x);
    if (r == RKM_OK) r = rkm__cu_malloc(ca, rkm__cu_align(d));
    if (r == RKM_OK) r = rkm__cu_copies_open(ca, d->plan);
    if (r != RKM_OK) {
        rkm_cuda_arena_destroy(ca);
        return r;
    }
    *out = ca;
    return RKM_OK;
}

rkm_result rkm_cuda_arena_create_for_plan(const rkm_plan *plan, const rkm_callbacks *host, cudaStream_t stream,
                                          rkm_cuda_arena **out, rkm_arena_capacity_info *info)
{
    if (out) *out = NULL;
    if (!plan) return RKM_ERROR_ARGUMENT;
    rkm_cuda_arena_desc d;
    memset(&d, 0, sizeof d);
    d.graph = rkm_plan_graph(plan);
    d.plan = plan; /* layout mode (0) */
    d.host = host;
    d.stream = stream;
    rkm_result r = rkm_cuda_arena_create(&d, out);
    if (r != RKM_OK || !info) return r;
    rkm_plan_stats ps;
    (void)rkm_plan_stats_get(plan, &ps); /* cannot fail: plan is not NULL */
    info->peak = ps.peak;
    info->capacity = (*out)->capacity;
    info->slack = info->capacity - ps.peak;
    return RKM_OK;
}

void rkm_cuda_arena_destroy(rkm_cuda_arena *ca)
{
    if (!ca) return;
    rkm__cu_copies_close(ca);
    if (ca->block) (void)cudaFree(ca->block);
    rkm_arena_exec *x = ca->x;
    (void)rkm_context_realloc(ca->ctx, ca, sizeof *ca, 0);
    rkm_arena_exec_destroy(x); /* last: it holds the graph, so the context, which may go with it */
}

rkm_result rkm_cuda_arena_run(rkm_cuda_arena *ca, const rkm_plan *plan)
{
    if (!ca) return RKM_ERROR_ARGUMENT;
    /* An error left by an earlier call is not this step's. */
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return rkm__cu_fail(ca, e, "rkm_cuda_arena_run: before the step, an earlier CUDA call failed");
    rkm_result r = rkm_arena_exec_run(ca->x, plan);
    if (r != RKM_OK) return r;
    /* Launch errors of the host's kernels (faults show at the next sync). */
    e = cudaGetLastError();
    return e == cudaSuccess ? RKM_OK : rkm__cu_fail(ca, e, "rkm_cuda_arena_run: after the step");
}

static void *rkm__cu_ptr(const rkm_cuda_arena *ca, uint64_t off) { return rkm_arena_ptr(ca->base, off); }

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
    if (!ca) return RKM_ERROR_ARGUMENT;
    if (!ptr) return rkm_context_fail(ca->ctx, RKM_ERROR_ARGUMENT, "rkm_cuda_scratch: ptr is NULL");
    uint64_t off;
    rkm_result r = rkm_arena_exec_scratch(ca->x, bytes, &off);
    *ptr = r == RKM_OK ? rkm__cu_ptr(ca, off) : NULL;
    if (r == RKM_OK && ca->n_scratch < RKM_ARENA_MAX_SCRATCH) { /* the exec allows no more */
        ca->scratch[ca->n_scratch] = *ptr;
        ca->scratch_bytes[ca->n_scratch++] = bytes;
    }
    return r;
}

void rkm_cuda_arena_stats(const rkm_cuda_arena *ca, rkm_arena_stats *out) { rkm_arena_exec_stats_get(ca->x, out); }

rkm_arena_exec *rkm_cuda_arena_exec(const rkm_cuda_arena *ca) { return ca ? ca->x : NULL; }

/* ---------------------------------------------------------------------------
 * The profiler
 * ------------------------------------------------------------------------- */

/* Events, sample storage and the new costs of one profile. */
typedef struct rkm__cu_prof {
    int32_t runs, warmup;
    double trim;
    size_t n_ev, n_samples;
    cudaEvent_t *ev;     /* 4 per op, then step start and end */
    uint8_t *ran;        /* 2 per op */
    double *fwd, *bwd;   /* [run * n_ops + op] seconds */
    double *step;        /* [run] */
    double *host;        /* [run]: seconds the CPU took to enqueue the step */
    double *col;         /* one op's samples, sorted in place */
    rkm_op_costs *costs; /* n_ops: what the new graph gets */
} rkm__cu_prof;

/* The desc's values, defaults applied; RKM_ERROR_ARGUMENT as
 * rkm_graph_profile refuses them. */
static rkm_result rkm__cu_prof_desc(rkm_cuda_arena *ca, const rkm_cuda_profile_desc *desc, rkm__cu_prof *p)
{
    rkm_cuda_profile_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (d.runs < 0)
        return rkm_context_fail(ca->ctx, RKM_ERROR_ARGUMENT, "rkm_cuda_profile: runs %d is negative", (int)d.runs);
    if (!(d.trim >= 0.0 && d.trim < 0.5))
        return rkm_context_fail(ca->ctx, RKM_ERROR_ARGUMENT, "rkm_cuda_profile: trim %g is not in [0, 0.5)", d.trim);
    p->runs = d.runs > 0 ? d.runs : 5;
    p->warmup = d.warmup == 0 ? 1 : d.warmup < 0 ? 0 : d.warmup;
    p->trim = d.trim > 0.0 ? d.trim : 0.2;
    return RKM_OK;
}

static void rkm__cu_prof_free(rkm_cuda_arena *ca, rkm__cu_prof *p)
{
    for (size_t i = 0; p->ev && i < p->n_ev; i++)
        if (p->ev[i]) (void)cudaEventDestroy(p->ev[i]);
    rkm__cu_free(ca, p->ev, p->n_ev * sizeof *p->ev);
    rkm__cu_free(ca, p->ran, (size_t)ca->n_ops * 2 + 1);
    rkm__cu_free(ca, p->fwd, p->n_samples * sizeof(double));
    rkm__cu_free(ca, p->costs, (size_t)ca->n_ops * sizeof *p->costs + 1);
    p->ev = NULL;
    p->ran = NULL;
    p->fwd = NULL;
    p->costs = NULL;
    ca->ev = NULL;
    ca->ran = NULL;
}

/* Zeroed host memory from the context, or NULL. */
static void *rkm__cu_zalloc(rkm_cuda_arena *ca, size_t bytes)
{
    void *m = rkm_context_realloc(ca->ctx, NULL, 0, bytes);
    if (m) memset(m, 0, bytes);
    return m;
}

static rkm_result rkm__cu_prof_init(rkm_cuda_arena *ca, rkm__cu_prof *p)
{
    size_t no = (size_t)ca->n_ops, runs = (size_t)p->runs;
    p->n_ev = no * 4 + 2;
    p->n_samples = no * 2 * runs + 3 * runs;
    p->ev = (cudaEvent_t *)rkm__cu_zalloc(ca, p->n_ev * sizeof *p->ev);
    p->ran = (uint8_t *)rkm__cu_zalloc(ca, no * 2 + 1);
    p->fwd = (double *)rkm__cu_zalloc(ca, p->n_samples * sizeof(double));
    p->costs = (rkm_op_costs *)rkm__cu_zalloc(ca, no * sizeof *p->costs + 1);
    if (!p->ev || !p->ran || !p->fwd || !p->costs) {
        rkm__cu_prof_free(ca, p);
        return rkm_context_fail(ca->ctx, RKM_ERROR_NOMEM, "rkm_cuda_profile: no host memory for %zu samples of %zu ops",
                                p->n_samples, no);
    }
    p->bwd = p->fwd + no * runs;
    p->step = p->bwd + no * runs;
    p->host = p->step + runs;
    p->col = p->host + runs;
    for (size_t i = 0; i < p->n_ev; i++) {
        cudaError_t e = cudaEventCreate(&p->ev[i]);
        if (e != cudaSuccess) {
            p->ev[i] = NULL;
            rkm_result r = rkm__cu_fail(ca, e, "rkm_cuda_profile: cudaEventCreate");
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
    return e == cudaSuccess ? RKM_OK : rkm__cu_fail(ca, e, "rkm_cuda_profile: cudaEventElapsedTime");
}

/* One baseline step with events; run >= 0 stores its samples. */
static rkm_result rkm__cu_prof_step(rkm_cuda_arena *ca, rkm__cu_prof *p, const rkm_plan *plan, int32_t run)
{
    size_t no = (size_t)ca->n_ops;
    cudaEvent_t s0 = p->ev[no * 4], s1 = p->ev[no * 4 + 1];
    cudaError_t e;
    memset(p->ran, 0, no * 2);
    if ((e = cudaEventRecord(s0, ca->stream)) != cudaSuccess)
        return rkm__cu_fail(ca, e, "rkm_cuda_profile: cudaEventRecord before the step");
    std::chrono::steady_clock::time_point h0 = std::chrono::steady_clock::now();
    rkm_result r = rkm_cuda_arena_run(ca, plan);
    double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count();
    if (r != RKM_OK) return r;
    if ((e = cudaEventRecord(s1, ca->stream)) != cudaSuccess)
        return rkm__cu_fail(ca, e, "rkm_cuda_profile: cudaEventRecord after the step");
    if ((e = cudaEventSynchronize(s1)) != cudaSuccess)
        return rkm__cu_fail(ca, e, "rkm_cuda_profile: the profiled step");
    if (run < 0) return RKM_OK;
    p->host[run] = host;
    size_t base = (size_t)run * no;
    for (size_t op = 0; op < no && r == RKM_OK; op++) {
        if (p->ran[op * 2]) r = rkm__cu_elapsed(ca, p->ev[op * 4], p->ev[op * 4 + 1], &p->fwd[base + op]);
        if (r == RKM_OK && p->ran[op * 2 + 1])
            r = rkm__cu_elapsed(ca, p->ev[op * 4 + 2], p->ev[op * 4 + 3], &p->bwd[base + op]);
    }
    return r == RKM_OK ? rkm__cu_elapsed(ca, s0, s1, &p->step[run]) : r;
}

/* The new costs: trimmed means of the samples, the measured workspaces.
 * Returns the sum of the times (the new baseline time). */
static double rkm__cu_prof_costs(rkm_cuda_arena *ca, rkm__cu_prof *p)
{
    size_t no = (size_t)ca->n_ops;
    double sum = 0.0;
    for (size_t op = 0; op < no; op++) {
        double t[2];
        for (int k = 0; k < 2; k++) {
            const double *src = k ? p->bwd : p->fwd;
            for (int32_t i = 0; i < p->runs; i++) p->col[i] = src[(size_t)i * no + op];
            t[k] = rkm_trimmed_mean(p->col, (size_t)p->runs, p->trim);
            sum += t[k];
        }
        rkm_op_costs *c = &p->costs[op];
        c->fwd_seconds = t[0];
        c->bwd_seconds = t[1];
        rkm_arena_exec_measured_ws(ca->x, (int32_t)op, &c->fwd_ws, &c->bwd_ws);
    }
    return sum;
}

rkm_result rkm_cuda_profile(rkm_cuda_arena *ca, const rkm_cuda_profile_desc *desc, rkm_cuda_profile_result *res,
                            rkm_graph **out)
{
    if (out) *out = NULL;
    if (!ca) return RKM_ERROR_ARGUMENT;
    if (!out) return rkm_context_fail(ca->ctx, RKM_ERROR_ARGUMENT, "rkm_cuda_profile: out is NULL");
    if (!ca->measure)
        return rkm_context_fail(ca->ctx, RKM_ERROR_ARGUMENT,
                                "rkm_cuda_profile: the arena does not measure (create it in RKM_ARENA_MEASURE mode)");
    rkm__cu_prof p;
    memset(&p, 0, sizeof p);
    rkm_result r = rkm__cu_prof_desc(ca, desc, &p);
    rkm_plan *plan = NULL;
    if (r == RKM_OK) r = rkm_plan_baseline(ca->g, &plan);
    if (r == RKM_OK) r = rkm__cu_prof_init(ca, &p);
    if (r != RKM_OK) {
        rkm_plan_destroy(plan);
        return r;
    }
    for (int32_t i = -p.warmup; i < p.runs && r == RKM_OK; i++) r = rkm__cu_prof_step(ca, &p, plan, i);
    double sum = r == RKM_OK ? rkm__cu_prof_costs(ca, &p) : 0.0;
    if (r == RKM_OK) r = rkm_graph_with_costs(ca->g, p.costs, out);
    if (r == RKM_OK && res) {
        rkm_arena_stats st;
        rkm_cuda_arena_stats(ca, &st);
        res->step_seconds = rkm_trimmed_mean(p.step, (size_t)p.runs, p.trim);
        res->host_seconds = rkm_trimmed_mean(p.host, (size_t)p.runs, p.trim);
        res->sum_op_seconds = sum;
        res->peak = st.peak;
    }
    rkm__cu_prof_free(ca, &p);
    rkm_plan_destroy(plan);
    return r;
}
