/* rockmate_arena.h -- the device-free half of rockmate's CUDA support.
 *
 * Plain C11, no CUDA: compiled into the CUDA helpers (rockmate_cuda.cu) and
 * into the CPU test suite, so that every byte of bookkeeping is tested on
 * machines without a GPU. Three parts:
 *
 * 1. rkm_arena: an allocator over offsets in one region [0, capacity). It
 *    hands out 256-byte aligned offsets, first fit over a free list sorted by
 *    offset, coalescing neighbours on free. Deterministic: the same sequence
 *    of calls gives the same offsets. It counts the *requested* bytes (the
 *    contract's unit: no alignment), their peak, and the high-water mark (the
 *    region actually needed: max of offset + requested bytes).
 *
 * 2. rkm_arena_exec: runs a plan (rkm_plan_execute) with the buffers of the
 *    step carved from an arena: every `input` tensor once at creation, then
 *    per step what the contract says the step creates (new outputs, the
 *    phantom of a `save`, new gradients, the gradient of the loss, the
 *    workspace of the call), released by the free steps and at the end of the
 *    call for workspaces. The host's own callbacks run inside and look their
 *    buffers up by id. The arena's current bytes therefore follow the
 *    plan's live memory (rkm_plan_mem_after) step for step, and its peak is
 *    the plan's peak (rkm_plan_stats), to the byte.
 *
 *    Workspace: during a forward or backward call the host takes scratch
 *    buffers with rkm_arena_exec_scratch; they are released when the call
 *    returns. Each scratch request counts rounded up to 256 bytes, so that
 *    the buffers can sit one after another, aligned, in one block.
 *    - plan mode (measure = 0): the op's declared fwd_ws/bwd_ws is reserved
 *      as one block before the call and the scratch buffers are cut from it;
 *      asking for more than the graph declares is an error (it would break
 *      the plan's peak).
 *    - measure mode (measure = 1, for profiling): nothing is reserved; every
 *      scratch buffer comes from the arena and the op's workspace is
 *      measured as (peak arena bytes during the call) - (live bytes before
 *      it) - (the outputs, phantom or gradients the call creates). The
 *      largest value seen per op is kept.
 *
 * 3. Statistics: rkm_trimmed_mean, in rockmate.h, shared with the library.
 *
 * Layout pass: rkm_arena_layout runs a plan through an rkm_arena_exec over
 * an unbounded arena with no host, so it learns the exact region that the
 * same sequence of allocations needs (peak + alignment and fragmentation
 * slack). An arena of that capacity then runs the plan with the very same
 * offsets: the free lists agree below the high-water mark, and first fit
 * never looks above it.
 *
 * Layout mode: rkm_arena_exec_create_layout takes the library's own layout
 * instead (rkm_plan_layout: an offset per buffer from the plan's exact
 * lifetimes). The arena's capacity is the layout's arena_bytes, and every
 * buffer the run creates (inputs at creation, then per step the new outputs,
 * phantom, workspace, new gradients, grad(loss)) is matched with the
 * layout's next buffer by kind, index and creation step and placed at its
 * offset; a mismatch, or a buffer that would overlap a live one, fails the
 * run. Requested bytes, current and peak are counted as in first fit.
 *
 * Errors: every fallible call returns an rkm_result and, on failure, writes
 * its message through rkm_context_fail to a context: the graph's
 * (rkm_graph_context) for an exec, the one given to rkm_arena_create for a
 * bare arena. Read it with rkm_context_errmsg; it names the object (step,
 * op, tensor, offset) and the rule. A call given a NULL object has no
 * context and returns RKM_ERROR_ARGUMENT without a message.
 * RKM_ERROR_INTERNAL is a bug (a check of the bookkeeping against the
 * library's own figures failed), never a consequence of the input. All
 * memory comes from the context's allocator (rkm_context_realloc).
 *
 * Names: public rkm_arena_*, internal rkm__arena_* (and rkm__exec_*).
 * Nothing here prints or aborts. */
#ifndef ROCKMATE_ARENA_H
#define ROCKMATE_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "../rockmate.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RKM_ARENA_ALIGN 256u
/* Offset of a buffer that is not live. */
#define RKM_ARENA_NONE UINT64_MAX
/* Capacity of an arena that never runs out (layout passes). */
#define RKM_ARENA_UNBOUNDED UINT64_MAX
/* Scratch buffers one call may take. */
#define RKM_ARENA_MAX_SCRATCH 64

/* ---------------------------------------------------------------------------
 * 1. The offset allocator
 * ------------------------------------------------------------------------- */

typedef struct rkm_arena rkm_arena;

typedef struct rkm_arena_stats {
    uint64_t capacity;   /* bytes of the region; RKM_ARENA_UNBOUNDED for layout passes */
    uint64_t current;    /* requested bytes of the live blocks */
    uint64_t peak;       /* max of current since creation or the last reset_peak */
    uint64_t high_water; /* max of offset + requested bytes over every block ever carved */
    uint32_t blocks;     /* live blocks */
} rkm_arena_stats;

/* An arena over [0, capacity) that holds at most max_blocks live blocks.
 * ctx (kept; it must outlive the arena) gives the allocator and takes the
 * messages of this arena's failures. All memory is taken here, none by
 * alloc/free. RKM_ERROR_ARGUMENT for max_blocks 0 or UINT32_MAX, and for a
 * NULL ctx (with no message: there is nowhere to write it). */
rkm_result rkm_arena_create(rkm_context *ctx, uint64_t capacity, uint32_t max_blocks, rkm_arena **out);
void rkm_arena_destroy(rkm_arena *a);
/* A block of `bytes` (> 0) at a 256-aligned offset: the lowest free range
 * that holds it. RKM_ERROR_NOMEM when none does or max_blocks are live;
 * RKM_ERROR_ARGUMENT for 0 bytes. */
rkm_result rkm_arena_alloc(rkm_arena *a, uint64_t bytes, uint64_t *offset);
/* Release the block that starts at offset. RKM_ERROR_ARGUMENT, naming the
 * offset, if no live block starts there (a double free, a stray offset). */
rkm_result rkm_arena_free(rkm_arena *a, uint64_t offset);
void rkm_arena_stats_get(const rkm_arena *a, rkm_arena_stats *out);
/* Start a new peak measurement: peak = current. */
void rkm_arena_reset_peak(rkm_arena *a);
/* Release every block: back to the empty region (peak and high water kept). */
void rkm_arena_clear(rkm_arena *a);

/* ---------------------------------------------------------------------------
 * 2. Running a plan with buffers carved from an arena
 * ------------------------------------------------------------------------- */

typedef struct rkm_arena_exec rkm_arena_exec;

/* The exec's context is the graph's: its allocator serves the bookkeeping
 * and its message channel every failure. */
typedef struct rkm_arena_exec_desc {
    const rkm_graph *graph;     /* finalized; must outlive the exec */
    uint64_t capacity;          /* of the arena it creates; RKM_ARENA_UNBOUNDED allowed */
    int measure;                /* 0: reserve declared workspaces; 1: measure them */
    const rkm_callbacks *host;  /* called inside each step (copied); NULL: bookkeeping only */
} rkm_arena_exec_desc;

/* Creates the arena and carves every input tensor from it (in id order), so
 * the host can fill them before running a plan. RKM_ERROR_NOMEM if the
 * inputs do not fit; RKM_ERROR_ARGUMENT for a graph not finalized or a
 * host without forward or backward. */
rkm_result rkm_arena_exec_create(const rkm_arena_exec_desc *desc, rkm_arena_exec **out);
void rkm_arena_exec_destroy(rkm_arena_exec *x);

/* Layout mode: an exec that runs `plan` (of desc->graph) with every buffer
 * at the offset rkm_plan_layout(plan, RKM_ARENA_ALIGN) gives it, in an
 * arena of the layout's arena_bytes (desc->capacity is ignored; read the
 * capacity back with rkm_arena_exec_arena_stats). The layout is copied: the
 * plan may go afterwards, but rkm_arena_exec_run must be given a plan that
 * creates the same buffers in the same order (the plan itself), else the
 * run fails with RKM_ERROR_STATE. RKM_ERROR_ARGUMENT for measure mode or a
 * plan of another graph. */
rkm_result rkm_arena_exec_create_layout(const rkm_arena_exec_desc *desc, const rkm_plan *plan,
                                        rkm_arena_exec **out);
/* 1 for an exec made by rkm_arena_exec_create_layout. */
int rkm_arena_exec_is_layout(const rkm_arena_exec *x);

/* One training step: rkm_plan_execute(plan) with the buffers carved and
 * released around the host's callbacks. The arena's peak is reset to the
 * input bytes first, so afterwards the stats give this step's peak. The
 * plan must be of the exec's graph (RKM_ERROR_ARGUMENT). On failure every
 * buffer but the inputs is released and the context's message names the
 * step: RKM_ERROR_NOMEM (arena too small: the buffer and the bytes in use),
 * RKM_ERROR_CALLBACK (a host callback returned non-zero: the executor's
 * message, followed by a failed scratch request of that call if any),
 * RKM_ERROR_STATE (a layout exec given a plan whose buffers are not the
 * layout's), the code a host gave rkm_arena_exec_host_fail, or
 * RKM_ERROR_INTERNAL (the bookkeeping disagrees with the plan). */
rkm_result rkm_arena_exec_run(rkm_arena_exec *x, const rkm_plan *plan);

/* For a host callback that fails for a reason of its own (a CUDA error):
 * records the code and the message and returns the non-zero value the
 * callback must return. The run then fails with `code`, the message
 * prefixed with the step. */
int rkm_arena_exec_host_fail(rkm_arena_exec *x, rkm_result code, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Offsets of live buffers in the arena, RKM_ARENA_NONE when not live (a
 * zero-byte buffer is live at offset 0 and takes no space). */
uint64_t rkm_arena_exec_tensor(const rkm_arena_exec *x, int32_t tensor);
uint64_t rkm_arena_exec_grad(const rkm_arena_exec *x, int32_t tensor);
uint64_t rkm_arena_exec_saved(const rkm_arena_exec *x, int32_t op); /* the op's phantom */

/* During a forward or backward callback: a scratch buffer of `bytes`,
 * released when the callback returns. RKM_ERROR_STATE outside a call;
 * RKM_ERROR_NOMEM beyond the declared workspace (plan mode), or beyond the
 * arena's capacity or RKM_ARENA_MAX_SCRATCH buffers (measure mode). The
 * message names the op and the step; if the callback then fails, the run's
 * message repeats it. */
rkm_result rkm_arena_exec_scratch(rkm_arena_exec *x, uint64_t bytes, uint64_t *offset);

/* Measure mode: the largest workspace seen in the op's forward and
 * backward calls so far (0 if none ran). */
void rkm_arena_exec_measured_ws(const rkm_arena_exec *x, int32_t op, uint64_t *fwd_ws, uint64_t *bwd_ws);
void rkm_arena_exec_arena_stats(const rkm_arena_exec *x, rkm_arena_stats *out);

/* The plan's exact first-fit arena: what an rkm_arena_exec in plan mode
 * needs to run it. Runs the plan (every plan is valid) on an unbounded
 * arena and checks that the arena's peak equals the plan's
 * (RKM_ERROR_INTERNAL otherwise). Messages go to the graph's context. */
typedef struct rkm_arena_layout_info {
    uint64_t peak;     /* requested bytes: equals the plan's peak */
    uint64_t capacity; /* the region to allocate: peak + slack */
    uint64_t slack;    /* capacity - peak: alignment and fragmentation */
} rkm_arena_layout_info;
rkm_result rkm_arena_layout(const rkm_plan *plan, rkm_arena_layout_info *out);

/* ---------------------------------------------------------------------------
 * 3. Statistics
 * ------------------------------------------------------------------------- */

/* rkm_trimmed_mean (rockmate.h) is the profiler's statistic. */

#ifdef __cplusplus
}
#endif
#endif /* ROCKMATE_ARENA_H */
