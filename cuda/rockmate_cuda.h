/* rockmate_cuda.h -- what a CUDA host needs to run rockmate plans on a GPU.
 *
 * 1. A device activation arena (rkm_cuda_arena): ONE cudaMalloc, sized
 *    for a plan in one of the library's arena modes (rockmate.h "Arena"):
 *    layout (what rkm_cuda_arena_create_for_plan uses: rkm_plan_layout's
 *    arena_bytes, an offset per buffer) or first fit (rkm_arena_capacity:
 *    the plan's peak plus the alignment and fragmentation slack of the
 *    library's deterministic first-fit arena), out of which every activation,
 *    phantom, gradient and workspace of a training step is carved as the
 *    executor's callbacks ask. The host's own rkm_callbacks run inside; they
 *    find their device buffers with rkm_cuda_tensor / rkm_cuda_grad /
 *    rkm_cuda_saved and take workspace with rkm_cuda_scratch. The arena
 *    counts requested bytes as the contract does, so its measured peak is
 *    comparable, byte for byte, with the plan's (and equal to it in plan
 *    mode).
 *
 *    Stream-ordered release: the host enqueues all its kernels on one
 *    stream. A free step returns the range to the arena at once, without
 *    synchronising: every kernel that read the buffer is already queued,
 *    and any kernel that reuses the range is queued after them on the same
 *    stream, so it runs after them. A host that uses several streams must
 *    make them wait for one another (events) before returning from a
 *    callback.
 *
 *    Poisoning (desc.poison, for checks): the region is filled with 0xff
 *    bytes (NaN floats, -1 ints) when it is allocated, and so is every
 *    buffer a free step releases and every scratch buffer when its call
 *    returns, in stream order (cudaMemsetAsync on the host's stream). A
 *    kernel that reads a buffer after its free, or a new buffer before
 *    writing it, then reads NaNs (or, once the range is reused, another
 *    buffer's values) instead of the stale values a plan that frees
 *    nothing would have left there, and the gradients show it.
 *
 * 2. A profiler (rkm_cuda_profile): runs the baseline plan a few times
 *    through a measuring arena, times every forward and backward call with
 *    cudaEvents recorded on the host's stream around the callback (no
 *    synchronisation inside the step), takes the trimmed mean per op, takes
 *    each op's workspace as the arena saw it (peak arena bytes during the
 *    call minus live bytes before it minus what the call creates), and makes
 *    a new graph with those costs (rkm_graph_with_costs): graphs are
 *    immutable, so the host plans on the graph the profiler returns.
 *
 *    What the events measure: the GPU's time from the first event to the
 *    second, which is the op's kernels only while the GPU has work queued.
 *    When kernels are shorter than the CPU's time to launch them (small
 *    shapes: examples/gpt2_cuda.cu's tiny preset), the GPU idles between
 *    launches, the first event completes as soon as it is recorded, and an
 *    op's time is mostly the CPU's launch time: the costs then measure the
 *    CPU, and plans trade recomputation for launch overhead. The result's
 *    host_seconds (the CPU's time to enqueue a step) says when: close to
 *    step_seconds, the step was launch-bound. Profile at the shape that
 *    will be trained.
 *
 * 3. Offloading (docs/formats.md, "Offloading"): an arena made for a plan
 *    with copy steps (desc.plan, layout mode) makes its copies itself, the
 *    host writing no copy code. At creation: two copy streams
 *    (cudaStreamNonBlocking: ordered only by the events below), one pinned
 *    host region (cudaMallocHost) with a 256-byte-aligned buffer per tensor
 *    or saved state the plan offloads (so its size is at least the plan's
 *    host_peak; each buffer is reused by every step) and an event per such
 *    buffer. An `offload` or `prefetch` step records an event on the
 *    host's stream, makes its copy stream wait for it (the copy starts
 *    after every kernel issued so far: the contract's time model, and a
 *    prefetch's range may have been another buffer's), queues the
 *    cudaMemcpyAsync and records the slot's event; `wait` makes the host's
 *    stream wait for that event (cudaStreamWaitEvent: the CPU never
 *    blocks). The host's offload/prefetch/wait/free_host callbacks, if set,
 *    are called after the arena's work (to log; they must not copy). A plan
 *    with copies run in an arena made without it fails at its first copy,
 *    named (RKM_ERROR_ARGUMENT). Failed copies are RKM_ERROR_CALLBACK with
 *    the CUDA error and the step.
 *
 * Errors: every CUDA call is checked; nothing aborts or prints. Functions
 * return an rkm_result and, on failure, write the message to the graph's
 * context (rkm_context_errmsg(rkm_graph_context(graph))), naming the CUDA
 * call, the step or the op: RKM_ERROR_NOMEM for cudaErrorMemoryAllocation
 * (or an arena too small), RKM_ERROR_CALLBACK for any other CUDA error or a
 * failing host callback, and the codes of the library's arena (rkm_arena_exec_run). Host-side
 * bookkeeping memory comes from the context's allocator.
 *
 * Build: compiled by nvcc (C++17); link librockmate (the arena is part of
 * it) and cudart. */
#ifndef ROCKMATE_CUDA_H
#define ROCKMATE_CUDA_H

#include <cuda_runtime.h>

#include "../rockmate.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rkm_cuda_arena rkm_cuda_arena;

typedef struct rkm_cuda_arena_desc {
    const rkm_graph *graph;    /* finalized; the arena keeps it alive; its context takes the messages */
    /* As rkm_arena_exec_desc's: the mode (0: layout; RKM_ARENA_MEASURE for
     * rkm_cuda_profile), the plan (layout: the one it runs; first fit:
     * sizes capacity 0) and the device bytes to allocate (0: what the plan
     * needs in the mode; never RKM_ARENA_UNBOUNDED). */
    rkm_arena_mode mode;
    const rkm_plan *plan;
    uint64_t capacity;
    const rkm_callbacks *host; /* the host's callbacks (copied); forward and backward required */
    cudaStream_t stream;       /* the one stream the host's kernels run on */
    int poison;                /* 1: poison the region and every buffer released (above) */
} rkm_cuda_arena_desc;

/* cudaMalloc(capacity) and the bookkeeping; the inputs are carved at once
 * (fill them through rkm_cuda_tensor before a step). The region's base is
 * aligned as the offsets are: cudaMalloc's 256 bytes, or for a plan laid
 * out at a larger alignment, alignment - 1 bytes more allocated and the
 * first aligned byte taken. */
rkm_result rkm_cuda_arena_create(const rkm_cuda_arena_desc *desc, rkm_cuda_arena **out);
/* The arena for `plan` in layout mode: one cudaMalloc of rkm_plan_layout's
 * arena_bytes, every buffer at its layout offset; it runs this plan (as
 * rkm_cuda_arena_create with desc.plan = plan in layout mode, without
 * poisoning). If info is not NULL it receives the plan's peak, the capacity
 * (the layout's arena size) and slack (capacity - peak). */
rkm_result rkm_cuda_arena_create_for_plan(const rkm_plan *plan, const rkm_callbacks *host, cudaStream_t stream,
                                          rkm_cuda_arena **out, rkm_arena_capacity_info *info);
/* Frees the device memory (cudaFree synchronises with pending work). */
void rkm_cuda_arena_destroy(rkm_cuda_arena *ca);

/* One training step under `plan` (of the arena's graph). Asynchronous like
 * the host's kernels: nothing waits for the stream. The arena's stats then
 * hold the step's peak. A callback that fails for a CUDA reason of its own
 * can say so with rkm_arena_exec_host_fail (rkm_cuda_arena_exec). The CUDA
 * runtime's last error is read before the step (an error an earlier call
 * left fails the run, named as such) and after it (a launch error of the
 * step's kernels). */
rkm_result rkm_cuda_arena_run(rkm_cuda_arena *ca, const rkm_plan *plan);

/* Device pointers of live buffers; NULL when not live. */
void *rkm_cuda_tensor(const rkm_cuda_arena *ca, int32_t tensor);
void *rkm_cuda_grad(const rkm_cuda_arena *ca, int32_t tensor);
void *rkm_cuda_saved(const rkm_cuda_arena *ca, int32_t op);
/* Workspace inside a forward/backward callback, released when it returns;
 * counts rounded up to 256 bytes (rkm_arena_exec_scratch). */
rkm_result rkm_cuda_scratch(rkm_cuda_arena *ca, uint64_t bytes, void **ptr);

void rkm_cuda_arena_stats(const rkm_cuda_arena *ca, rkm_arena_stats *out);
/* The bookkeeping underneath (for rkm_arena_exec_host_fail and queries). */
rkm_arena_exec *rkm_cuda_arena_exec(const rkm_cuda_arena *ca);

/* cudaSuccess -> RKM_OK, cudaErrorMemoryAllocation -> RKM_ERROR_NOMEM,
 * anything else -> RKM_ERROR_CALLBACK. */
rkm_result rkm_cuda_result(cudaError_t e);

/* Zero means default; negative runs or a trim outside [0, 0.5) (NaN
 * included) are refused with RKM_ERROR_ARGUMENT, as by rkm_graph_profile. */
typedef struct rkm_cuda_profile_desc {
    int32_t runs;   /* timed baseline steps; 0: 5 */
    int32_t warmup; /* untimed steps first (cuBLAS heuristics, caches); 0: 1; < 0: none */
    double trim;    /* fraction dropped at each end; 0: 0.2 */
} rkm_cuda_profile_desc;

typedef struct rkm_cuda_profile_result {
    double step_seconds;    /* trimmed mean of the whole baseline step (events around it) */
    double sum_op_seconds;  /* sum of the ops' new fwd and bwd: the new graph's baseline time */
    uint64_t peak;          /* the arena's peak in the last step, measured workspaces included */
    double host_seconds;    /* trimmed mean of the CPU's time to enqueue a step (a wall clock
                               around rkm_cuda_arena_run); near step_seconds the GPU waited
                               for launches and the op times are the CPU's (see above) */
} rkm_cuda_profile_result;

/* Profile the arena's graph through `ca` (measure mode) and make *out: that
 * graph with every op's fwd/bwd seconds set to the trimmed mean of its event
 * times and fwd_ws/bwd_ws to the largest workspace the arena saw per call,
 * as rkm_graph_with_costs does (same context, same ids). The arena's graph
 * is unchanged; plan on *out, and destroy it when done. res may be NULL.
 * The callbacks run for real: reset what they accumulate afterwards. */
rkm_result rkm_cuda_profile(rkm_cuda_arena *ca, const rkm_cuda_profile_desc *desc, rkm_cuda_profile_result *res,
                            rkm_graph **out);

#ifdef __cplusplus
}
#endif
#endif /* ROCKMATE_CUDA_H */
