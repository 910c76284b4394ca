/* internal.h -- what the library's source files share: system headers, the
 * tuning table, internal types and the functions one file defines and
 * others call. Private: never installed, never included by users.
 *
 * Every source file in src/ includes this header first and nothing else of ours. The
 * amalgamation (make amalgamation -> rockmate.c) is this header followed by
 * the files in pipeline order; there RKM__PRIVATE is `static`, so the
 * library exports only the rkm_ API. */
#ifndef RKM__INTERNAL_H
#define RKM__INTERNAL_H

#if !defined(_POSIX_C_SOURCE) && !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include "rockmate.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h> /* the chain DP's min loops */
#endif

#ifdef RKM__AMALGAMATION
#define RKM__PRIVATE static
#else
#define RKM__PRIVATE
#endif

struct _lprec; /* lp_solve's model: only ilp.c includes <lpsolve/lp_lib.h> */

/* ===========================================================================
 * Tuning: every constant that the plans or the planning effort depend on,
 * one a line with what it bounds or sets and its unit. Each but the three
 * below can be set from the compiler's command line (-DRKM__NAME=...,
 * luaconf.h's way), so that a benchmark sweeps it without editing. Work is
 * counted in deterministic units (replayed steps, solver calls), never in
 * seconds, so that a plan is the same on every machine. The measurements
 * that set them: docs/design.md, 'Tuning'.
 * Not overridable: RKM__MAX_ALIGNMENT, RKM__ERRMSG_SIZE, RKM__NAME_MAX (limits of the formats and buffer sizes).
 * ======================================================================== */

/* ---- rkm_solve_desc's defaults (rockmate.h documents each) ---- */

#ifndef RKM__DEFAULT_SLOTS
#define RKM__DEFAULT_SLOTS 1000 /* slots: the chain DP's memory grid */
#endif
#ifndef RKM__DEFAULT_TIME_LIMIT
#define RKM__DEFAULT_TIME_LIMIT 60.0 /* seconds of wall clock a plan's planning */
#endif
#ifndef RKM__DEFAULT_ILP_TIME_LIMIT
#define RKM__DEFAULT_ILP_TIME_LIMIT 0.03 /* seconds of ILP work a block solve */
#endif
#ifndef RKM__DEFAULT_PEAK_POINTS
#define RKM__DEFAULT_PEAK_POINTS 5 /* peak budgets a block class */
#endif
#ifndef RKM__DEFAULT_KEPT_POINTS
#define RKM__DEFAULT_KEPT_POINTS 10 /* kept budgets a peak budget */
#endif
#ifndef RKM__DEFAULT_NEST_OPS
#define RKM__DEFAULT_NEST_OPS 24 /* ops: larger blocks that chain up are nested */
#endif
#ifndef RKM__DEFAULT_ILP_BUDGET
#define RKM__DEFAULT_ILP_BUDGET 2.0 /* seconds of block ILP work a planner */
#endif
#define RKM__MAX_ALIGNMENT ((uint64_t)1 << 30) /* bytes: the largest alignment a plan may state */

/* ---- structure (structure.c) ---- */

#ifndef RKM__CLASS_TIME_TOLERANCE
#define RKM__CLASS_TIME_TOLERANCE 0.20 /* relative difference of op times within a class of identical blocks */
#endif
#ifndef RKM__MERGE_RUN
#define RKM__MERGE_RUN 4 /* blocks at most in a run of small blocks merged into one */
#endif

/* ---- block options: the block ILP (ilp.c) and who gets it (planner.c) ---- */

#ifndef RKM__ILP_CALLS_PER_S
#define RKM__ILP_CALLS_PER_S 2.0e7 /* lp_solve abort-callback calls x model size per second of ILP work */
#endif
#ifndef RKM__ILP_STEPS_PER_S
#define RKM__ILP_STEPS_PER_S 1.5e7 /* the greedy's replayed steps per second of ILP work */
#endif
#ifndef RKM__ILP_MAX_COLS
#define RKM__ILP_MAX_COLS 200000 /* columns of a block ILP model at most (a size limit) */
#endif
#ifndef RKM__ILP_CACHE
#define RKM__ILP_CACHE 64 /* schedules remembered per block */
#endif
#ifndef RKM__ILP_HARD_KEPT
#define RKM__ILP_HARD_KEPT 0.6 /* fraction of the kept budgets a hard class gets */
#endif
#ifndef RKM__ILP_HARD_EFFORT
#define RKM__ILP_HARD_EFFORT 2.0 /* times the ILP work of a hard class's solve */
#endif
#ifndef RKM__ILP_MIN_SHARE
#define RKM__ILP_MIN_SHARE 0.1 /* ilp_time_limits: a smaller share of the ILP pool gets no solve */
#endif

/* ---- nesting (nest.c) ---- */

#ifndef RKM__NEST_PEEL
#define RKM__NEST_PEEL 4 /* ops the nested chain's largest block has at least fewer than the block */
#endif
#ifndef RKM__NEST_DEPTH
#define RKM__NEST_DEPTH 16 /* levels of nesting at most */
#endif
#ifndef RKM__NEST_POINTS
#define RKM__NEST_POINTS 8 /* peak budgets of the nested planner's grid */
#endif
#ifndef RKM__DROP_POINTS
#define RKM__DROP_POINTS 12 /* drop options a class gets (1/this of the droppable bytes apart) */
#endif

/* ---- the chain DP (chain.c, planner.c) ---- */

#ifndef RKM__DP_MAX_BYTES
#define RKM__DP_MAX_BYTES (1024.0 * 1024 * 1024) /* bytes of the DP's table at most (a size limit) */
#endif
#ifndef RKM__SLOTS_UP
#define RKM__SLOTS_UP 16 /* slot budgets tried above the floor and above a budget */
#endif
#ifndef RKM__DP_TILE
#define RKM__DP_TILE 256 /* columns of the DP's table solved together (speed only) */
#endif

/* ---- bounds (baseline.c) ---- */

#ifndef RKM__BOUND_UNITS
#define RKM__BOUND_UNITS 4096 /* units of the time bound's knapsack capacity */
#endif

/* ---- DTR (dtr.c) ---- */

#ifndef RKM__DTR_STEPS_PER_OBJECT
#define RKM__DTR_STEPS_PER_OBJECT 16 /* steps a DTR run may take per op and tensor */
#endif
#ifndef RKM__DTR_STEPS_MIN
#define RKM__DTR_STEPS_MIN 64 /* steps a DTR run may take at least */
#endif
#ifndef RKM__PREFETCH_PRICE
#define RKM__PREFETCH_PRICE 0.25 /* fraction of a prefetch's copy time an eviction to host is priced at */
#endif

/* ---- the work meter (progress.c, drive.c): one a call ----
 * Units: one replayed plan step (the search's replays, a DTR run's steps,
 * the offload pass's), one buffer or section visited (layout), or
 * 1/RKM__ILP_STEPS_PER_S s of ILP work. W = max(RKM__WORK_MIN,
 * RKM__WORK_PER_OBJECT x (ops + tensors)); a solve may do W (and what its
 * smallest budget takes where it must seek it), rkm_planner_min_budget
 * RKM__WORK_MIN_BUDGET x W, creation W plus ilp_budget's and checkmate
 * time_limit's ILP work. */
#ifndef RKM__WORK_MIN
#define RKM__WORK_MIN 128000000u /* units a solve may do at least */
#endif
#ifndef RKM__WORK_PER_OBJECT
#define RKM__WORK_PER_OBJECT 262144u /* units a solve may do per op and tensor of the graph */
#endif
#ifndef RKM__WORK_MIN_BUDGET
#define RKM__WORK_MIN_BUDGET 32 /* solves' work the smallest budget's search may do */
#endif

/* ---- effort: what a graph's size affords (progress.c, rkm__affords) ----
 * The one rule for the parts whose cost grows as the square of the ops
 * they work on (the graph's, or a block's): a part runs where
 * need x ops^2 <= W, W the graph's solve work above. Since W grows with
 * the graph, so does what it affords; at W's floor the levels below fall
 * at 64, 256, 48, 24 and 1264 ops. */
#ifndef RKM__NEED_GRAPH_ILP
#define RKM__NEED_GRAPH_ILP 31250.0 /* units per op^2: the whole-graph ILP, the rungs, the small bisection, full kicks */
#endif
#ifndef RKM__NEED_KICKS
#define RKM__NEED_KICKS 1950.0 /* units per op^2: the kicks (half the squeeze's work below the ILP's level) */
#endif
#ifndef RKM__NEED_BLOCK_ILP
#define RKM__NEED_BLOCK_ILP 55000.0 /* units per block op^2: a block ILP */
#endif
#ifndef RKM__NEED_NESTED_ILP
#define RKM__NEED_NESTED_ILP 220000.0 /* units per block op^2: a block ILP beside nested options */
#endif
#ifndef RKM__NEED_DTR
#define RKM__NEED_DTR 80.0 /* units per op^2: DTR's plans among rockmate's candidates */
#endif

/* ---- the search (search.c): a share of the call's work a try ---- */

#ifndef RKM__SOLVE_WORK
#define RKM__SOLVE_WORK 64000000u /* replayed steps a solve's search */
#endif
#ifndef RKM__CHECKPOINTS
#define RKM__CHECKPOINTS 16 /* states of a reference replay kept (speed only) */
#endif
#ifndef RKM__SQUEEZE_WORK
#define RKM__SQUEEZE_WORK 20000000u /* replayed steps: the squeeze's share of a solve */
#endif
#ifndef RKM__SQUEEZE_CHAIN
#define RKM__SQUEEZE_CHAIN 32 /* ops: the longest chain of forwards a squeeze move inserts */
#endif
#ifndef RKM__SQUEEZE_LOOK
#define RKM__SQUEEZE_LOOK 4 /* moves a squeeze round looks ahead on */
#endif
#ifndef RKM__SQUEEZE_LOOK_WORK
#define RKM__SQUEEZE_LOOK_WORK 4000000u /* replayed steps of a solve's squeezes that look ahead */
#endif
#ifndef RKM__SQUEEZE_STARTS
#define RKM__SQUEEZE_STARTS 6 /* the squeeze's chain DP starts */
#endif
#ifndef RKM__SQUEEZE_STEP
#define RKM__SQUEEZE_STEP 0.05 /* fraction of the budget: the first start's extra memory, doubling */
#endif
#ifndef RKM__SQUEEZE_DTR_STARTS
#define RKM__SQUEEZE_DTR_STARTS 3 /* the squeeze's DTR starts */
#endif
#ifndef RKM__KICK_TRIALS
#define RKM__KICK_TRIALS 64 /* kicks a solve at most */
#endif
#ifndef RKM__KICK_WORK_LARGE
#define RKM__KICK_WORK_LARGE (RKM__SQUEEZE_WORK / 2) /* replayed steps of the kicks' squeeze below the ILP's level */
#endif
#ifndef RKM__RUNG_KICK_TRIALS
#define RKM__RUNG_KICK_TRIALS 32 /* kicks a rung at most */
#endif
#ifndef RKM__SEARCH_PHASES /* the phases after the portfolio: {fraction of the budget, kicks at most} */
#define RKM__SEARCH_PHASES {{1.0, RKM__KICK_TRIALS}, {0.96, RKM__RUNG_KICK_TRIALS}, {0.90, RKM__RUNG_KICK_TRIALS}}
#endif
#ifndef RKM__MISSED_KICK_TRIALS
#define RKM__MISSED_KICK_TRIALS 32 /* kicks of the missed DTR plan's track at most */
#endif
#ifndef RKM__WHOLE_GRAPH_SECONDS
#define RKM__WHOLE_GRAPH_SECONDS 0.5 /* seconds of ILP work a whole-graph solve */
#endif
#ifndef RKM__CHECKMATE_SHARE
#define RKM__CHECKMATE_SHARE 0.5 /* fraction of time_limit a checkmate solve */
#endif

/* ---- the smallest budget (drive.c) ---- */

#ifndef RKM__BISECT_CHECKMATE
#define RKM__BISECT_CHECKMATE 12 /* probes of checkmate's bisection */
#endif
#ifndef RKM__BISECT_DTR
#define RKM__BISECT_DTR 40 /* probes of DTR's bisection */
#endif
#ifndef RKM__BISECT_SMALL
#define RKM__BISECT_SMALL 8 /* probes of rockmate's bisection below the chain DP's floor */
#endif
#ifndef RKM__BISECT_SMALL_SECONDS
#define RKM__BISECT_SMALL_SECONDS (RKM__WHOLE_GRAPH_SECONDS / 5) /* seconds of ILP work a probe there */
#endif
#ifndef RKM__BISECT_OFFLOAD
#define RKM__BISECT_OFFLOAD 16 /* probes of the bisection below the recompute-only floor */
#endif
#ifndef RKM__OFFLOAD_MIN_BASES
#define RKM__OFFLOAD_MIN_BASES 5 /* bases of a probe there */
#endif
#ifndef RKM__MIN_BUDGET_STEPS
#define RKM__MIN_BUDGET_STEPS 256 /* the first step up is 1/this of the way to the baseline peak */
#endif
#ifndef RKM__MIN_BUDGET_UP
#define RKM__MIN_BUDGET_UP (2 * RKM__LAYOUT_TRIES) /* tries up before the baseline */
#endif
#ifndef RKM__MIN_BUDGET_DOWN
#define RKM__MIN_BUDGET_DOWN (4 * RKM__LAYOUT_TRIES) /* plans down at most */
#endif

/* ---- the arena (layout.c, drive.c) ---- */

#ifndef RKM__SHARE_TRIES
#define RKM__SHARE_TRIES 8 /* a stage's one-micro-batch plans: budgets tried */
#endif
#ifndef RKM__PIPE_BISECT
#define RKM__PIPE_BISECT 24 /* the cut search's rounds on the bottleneck stage's time */
#endif
#ifndef RKM__STAGE_KEPT_POINTS
#define RKM__STAGE_KEPT_POINTS 8 /* a stage's whole-graph ILP: kept budgets tried */
#endif
#ifndef RKM__LAYOUT_TRIES
#define RKM__LAYOUT_TRIES 4 /* plans again for less when the arena is over the budget */
#endif
#ifndef RKM__ARENA_FIT_TRIES
#define RKM__ARENA_FIT_TRIES 2 /* squeezes below the budget when the arena is over it */
#endif
#ifndef RKM__LAYOUT_WORK
#define RKM__LAYOUT_WORK 10000000u /* units of work of the stages after the skyline, a layout */
#endif
#ifndef RKM__LAYOUT_GREEDY_ITEMS
#define RKM__LAYOUT_GREEDY_ITEMS 2048 /* buffers: larger layouts skip the O(n^2) greedy */
#endif
#ifndef RKM__LAYOUT_FIRSTFIT_WORK
#define RKM__LAYOUT_FIRSTFIT_WORK 200000000u /* units of work of first fit, a layout */
#endif

/* ---- offloading (offload.c) ---- */

#ifndef RKM__OFFLOAD_HIDE
#define RKM__OFFLOAD_HIDE 0.5 /* fraction of the forward's copy volume the second base adds */
#endif
#ifndef RKM__OFFLOAD_BASES
#define RKM__OFFLOAD_BASES 3 /* bases tried at most */
#endif
#ifndef RKM__OFFLOAD_BASE_WORK
#define RKM__OFFLOAD_BASE_WORK 0.75 /* fraction of the solve's search work the bases' searches */
#endif
#ifndef RKM__OFFLOAD_MOVES_WORK
#define RKM__OFFLOAD_MOVES_WORK (1.0 / 64) /* fraction of the solve's search work the offload moves */
#endif

/* ---- progress reports (progress.c): they change no plan ---- */

#ifndef RKM__PROGRESS_SECONDS
#define RKM__PROGRESS_SECONDS 0.1 /* seconds of wall clock between reports at least */
#endif
#ifndef RKM__PROGRESS_CLASSES
#define RKM__PROGRESS_CLASSES 0.95 /* fraction of creation's progress: its block classes */
#endif
#ifndef RKM__PROGRESS_FLOORS
#define RKM__PROGRESS_FLOORS 0.6 /* fraction of min_budget's progress: its floors */
#endif

/* ---- base.c ---- */

#define RKM__ERRMSG_SIZE 512 /* bytes of an error message */
#define RKM__NAME_MAX 255 /* bytes of a name at most (the formats' limit) */

struct rkm_context {
    rkm_alloc_fn alloc;
    void *alloc_user;
    rkm_log_fn log;
    void *log_user;
    int log_level;
    char errmsg[RKM__ERRMSG_SIZE];
    /* Lifetime (rockmate.h, CONVENTIONS): the graphs and arenas made with
     * it that are alive (they keep it alive; what is made from them keeps
     * them alive); destroyed: rkm_context_destroy came while some were, so
     * the last one's release frees it. */
    size_t live;
    int destroyed;
};

/* A name -> id map: open addressing over FNV-1a hashes, ids index `names`. */
typedef struct rkm__map {
    int32_t *slots; /* -1 empty, else id */
    size_t cap;     /* power of two */
    size_t count;
} rkm__map;

typedef const char *(*rkm__name_of)(const void *owner, int32_t id);

/* ---- graph.c ---- */

typedef struct rkm__tensor {
    char *name;
    uint64_t bytes;
    unsigned flags;
    int32_t producer;      /* op id, -1 for inputs and not-yet-produced */
    int32_t line;          /* source line, 0 when built through the API */
    int has_grad;
    int32_t n_contrib;     /* backwards reading it (+1 for the loss tensor) */
    int32_t n_readers;     /* ops reading it */
} rkm__tensor;

typedef struct rkm__op {
    char *name;
    double fwd, bwd;
    int32_t *in, *out, *saved; /* one allocation: in, then out, then saved */
    int32_t n_in, n_out, n_saved;
    uint64_t phantom, fwd_ws, bwd_ws;
    uint64_t scratch; /* of the phantom, written by every forward (transient without save) */
    unsigned flags;   /* RKM_OP_INPLACE, RKM_OP_GRAD_INPLACE */
    int32_t line;
    int has_bwd;
} rkm__op;

typedef struct rkm__block {
    int32_t *ops;      /* op ids in topological order (points into block_ops) */
    int32_t n_ops;
    int32_t in;        /* separator entering, -1 for the first block */
    int32_t out;       /* separator leaving; the loss tensor for the last block */
    int32_t cls;       /* class id */
} rkm__block;

struct rkm_graph {
    rkm_context *ctx;
    rkm__tensor *tensors;
    size_t n_tensors, cap_tensors;
    rkm__op *ops;
    size_t n_ops, cap_ops;
    rkm__map tensor_map, op_map;
    int32_t loss;
    int32_t loss_line;
    int output;      /* the loss is a stage's output (rkm_graph_set_output): its gradient arrives */
    int finalized;
    int has_inplace; /* some op declares RKM_OP_INPLACE or RKM_OP_GRAD_INPLACE (at finalize) */
    rkm_copy_desc copy; /* copy bandwidths; d2h 0: no copies (offloading) */
    uint64_t input_bytes;
    rkm__block *blocks;
    int32_t n_blocks, n_classes;
    int32_t *block_ops; /* storage for all blocks' op lists (n_ops entries) */
    rkm_graph_stats stats; /* computed once by finalize */
    /* Set by a reader so that builder errors can name file:line. */
    const char *src_name;
    int32_t src_line;
    /* Lifetime, as the context's: the plans, planners and arena execs that
     * hold it (rkm__graph_hold); destroyed: rkm_graph_destroy came while
     * some were alive. Bookkeeping, not content: it changes on a graph
     * handed out as const, where nothing else does. */
    size_t live;
    int destroyed;
};

/* ---- rkg.c ---- */

#define RKM__MAX_TOKENS 16

/* A statement reader shared by the .rkg and .rkp parsers: one statement a
 * line, tokens split by spaces or tabs, '#' to the end of the line ignored. */
typedef struct rkm__reader {
    rkm_context *ctx;
    const char *src;
    const char *p, *end;
    int32_t line;
    char *buf;
    size_t cap;
    char *tok[RKM__MAX_TOKENS];
    int ntok;
} rkm__reader;

/* Buffered output through a rkm_write_fn. */
typedef struct rkm__out {
    rkm_write_fn fn;
    void *user;
    char buf[4096];
    size_t n;
    int failed;
} rkm__out;

/* ---- plan.c ---- */

/* A plan is born checked (rkm__plan_birth, sim.c) and never changes. */
struct rkm_plan {
    const rkm_graph *g;
    rkm_context *ctx;
    rkm_step *steps;
    size_t n_steps;
    uint64_t *mem_after, *step_peak; /* [n_steps] */
    /* Executor annotations: for step i, flag_off[i] indexes `flags`:
     * fwd -> [recompute, out_new...], bwd -> [in_grad...]. */
    size_t *flag_off;
    uint8_t *flags;
    size_t n_flags;
    /* Copies: for an offload or prefetch step the wait that completes it,
     * for a wait the step that started its copy, -1 for other steps; NULL
     * when the plan has no copy step. */
    int64_t *peer;
    rkm_buffer *buffers; /* lifetimes from the replay; offsets 0 (rkm_plan_layout places them) */
    size_t n_buffers, cap_buffers;
    int64_t loss_step;   /* the `loss` step: the backward phase starts there */
    rkm_plan_stats stats;
};

/* A growable step list: what producers of plans build, before birth. */
typedef struct rkm__steps {
    rkm_context *ctx;
    rkm_step *s;
    size_t n, cap;
} rkm__steps;

/* ---- sim.c ---- */

/* Replay state. Everything that measures memory or time (the checker, the
 * baseline, block options, the planner) goes through rkm__sim_step. */
typedef struct rkm__sim {
    const rkm_graph *g;
    uint8_t *D;        /* per tensor: live */
    uint8_t *G;        /* per tensor: gradient live */
    int32_t *recv;     /* per tensor: contributions received by grad(T) */
    uint8_t *P;        /* per op: saved state (phantom) live */
    uint8_t *fwd_done; /* per op: forward ran at least once */
    uint8_t *bwd_done; /* per op: backward ran */
    int loss_done;
    uint64_t mem;
    /* Copies (offloading): per copy slot (each tensor, then each op's
     * saved state: rkm__copy_slot), whether it has a host copy (H) and
     * which copy is in flight (RKM__COPY_*) ending when (copy_end); the
     * streams' clocks; the host bytes. */
    uint8_t *H, *inflight;
    double *copy_end;
    double clock, d2h_free, h2d_free, stall, d2h_busy, h2d_busy;
    uint64_t host_mem;
    int copied;        /* a copy step ran since the last reset (H, inflight to clear) */
    int32_t in_flight; /* copies in flight: the steps check theirs only when > 0 */
    /* A pipeline stage's search (rkm_solve_desc.in_flight - 1): the other
     * micro-batches in flight, each holding what this one holds at its
     * `loss` step (its kept bytes). From that step on they are counted in
     * mem; the forward phase's steps ran before the kept bytes were known,
     * so the loss step's peak also covers the highest of theirs (fwd_top)
     * plus the others'. The replay's peak is then the stage's
     * (rkm__stage_peak). 0 everywhere else: every plan's own figures are
     * one micro-batch's. */
    int32_t hold;
    uint64_t fwd_top;
} rkm__sim;
#define RKM__STEP_KINDS 10 /* rkm_step_kind's values */
#define RKM__COPY_NONE 0
#define RKM__COPY_OFFLOAD 1
#define RKM__COPY_PREFETCH 2

/* What a plan's birth records besides its figures: the executor's flags
 * and every buffer's lifetime. open_*: per tensor / tensor / op, its open
 * buffer (-1 if none). */
typedef struct rkm__recorder {
    rkm_plan *p;
    int64_t *open_t, *open_g, *open_p;
    size_t n_open;
    size_t at; /* next free entry of p->flags */
} rkm__recorder;

/* ---- layout.c ---- */

/* The placer's stages (rkm__layout's `stages`; bench_layout compares them). */
#define RKM__LAY_SKYLINE 1u
#define RKM__LAY_GREEDY 2u
#define RKM__LAY_SEARCH 4u
#define RKM__LAY_ALL 7u

/* ---- pipe.c ---- */

RKM__PRIVATE uint64_t rkm__plan_kept(const rkm_plan *p);
RKM__PRIVATE uint64_t rkm__stage_peak(const rkm_plan *p, int32_t k);
RKM__PRIVATE rkm_result rkm__stage_memory(const rkm_plan *p, int32_t warm, int32_t m, uint64_t align, rkm_buffer *bufs,
                                          rkm_stage_memory *out);

/* ---- options.c ---- */

/* An option of a block: a schedule of the block's own steps (forward part
 * then backward part, global ids) and its five figures, all measured by
 * replaying the schedule in the simulator from the block's start state:
 *   pf   peak of the forward part
 *   kept memory live after the forward part
 *   pb   peak of the backward part (starts from kept plus grad(x_out)) */
typedef struct rkm__option {
    rkm_step *steps;
    size_t n_fwd, n_bwd;
    double tf, tb;
    uint64_t kept, pf, pb;
    size_t seq; /* order of arrival: the last tie-break, so sorting is total */
} rkm__option;

/* Per block: the no-save forward (run to reach a checkpoint) and options. */
typedef struct rkm__bopts {
    rkm_step *nosave;
    size_t n_nosave;
    double tfn;
    uint64_t pfn;
    rkm__option *opt;
    size_t n_opt, cap_opt;
    size_t arrived; /* options offered so far */
} rkm__bopts;

/* ---- ilp.c ---- */

typedef struct rkm__ilp_stats {
    int32_t solves, optimal, suboptimal, infeasible, timeout, failed; /* lp_solve outcomes (accumulated) */
    double seconds;  /* wall time in rkm__ilp_block_solve (accumulated) */
    double work;     /* solver work spent, in seconds of its calibration (accumulated; deterministic) */
    int proven;      /* this call: the schedule (or "none fits") is optimal for the model */
    double time;     /* this call: the returned schedule's time (0 if none) */
    double bound;    /* this call: a lower bound on the model's optimal time */
} rkm__ilp_stats;

/* Whether the build has lp_solve (RKM_OMIT_SOLVER leaves it out). */
#ifdef RKM_OMIT_SOLVER
#define RKM__HAVE_ILP 0
#else
#define RKM__HAVE_ILP 1
#endif

typedef struct rkm__ilp_block rkm__ilp_block;

#ifndef RKM_OMIT_SOLVER
enum { RKM__ILP_NODE_FWD, RKM__ILP_NODE_BWD, RKM__ILP_NODE_LOSS };

typedef struct rkm__ilp_node {
    int32_t kind; /* RKM__ILP_NODE_* */
    int32_t v;    /* local op (fwd: the op run; bwd: the op whose backward runs) */
    int32_t q;    /* its Q column */
    int32_t f0;   /* its free candidates: fcand[f0 .. next node's f0) */
} rkm__ilp_node;

typedef struct rkm__ilp_free {
    int32_t i;   /* local tensor */
    int32_t col; /* its F column */
} rkm__ilp_free;

/* A schedule as the model sees it: who runs in which stage, where each
 * phantom is saved; and its replayed figures (absolute bytes, like every
 * memory figure and budget of the block ILP). */
typedef struct rkm__ilp_sched {
    uint8_t *r;    /* [(nb+1)*n]: r[t*n+v], op v runs in stage t (row 0 all 1) */
    int32_t *save; /* [n]: stage of v's save run, -1 if none */
    size_t r_bytes, n_save; /* allocated */
    uint64_t peak, kept;
    double time;
    /* in the cache: proven optimal for every budget pair up to these */
    int proven;
    uint64_t peak_budget, kept_budget;
} rkm__ilp_sched;

/* A budget pair proven to admit no schedule (nor does any smaller pair). */
typedef struct rkm__ilp_none {
    uint64_t peak_budget, kept_budget;
} rkm__ilp_none;

/* What a solve may spend: work units (deterministic) and a wall clock. */
typedef struct rkm__ilp_work {
    double calls, max_calls; /* lp_solve abort-callback calls */
    double evals, max_evals; /* steps of the schedules the greedy replayed */
    double deadline;         /* rkm__now() past which everything stops */
    /* The caller's own check (its planner's rkm__over, which reports
     * progress, `done` being how far this solve's work is), or NULL;
     * non-zero stops the solve like the deadline. */
    int (*stop)(void *user, double done);
    void *user;
} rkm__ilp_work;

/* The arrays of one part of a block, each recorded with its size when it
 * is allocated, so that the part frees exactly what it took. */
#define RKM__ILP_MAX_ARRAYS 16
typedef struct rkm__ilp_arrays {
    void **at[RKM__ILP_MAX_ARRAYS];
    size_t bytes[RKM__ILP_MAX_ARRAYS];
    int n;
} rkm__ilp_arrays;

/* (a) The block: its numbering and structure, fixed once created. */
typedef struct rkm__ilp_shape {
    const rkm_graph *g;
    rkm_context *ctx;
    int32_t n, nt, nb;        /* forward ops, block tensors, backward stages */
    int32_t x_in, x_out, is_last;
    int32_t *op;              /* [n] global id of local op v */
    int32_t *lt;              /* [g->n_tensors] local index of a block tensor, else -1 */
    int32_t *tg;              /* [nt] global id of local tensor i */
    int32_t *tprod;           /* [nt] local producer of i */
    int32_t *rd_off, *rd;     /* readers of i among the block ops: rd[rd_off[i] .. rd_off[i+1]) */
    int32_t *st;              /* [n] stage of v's backward, 0 if it has none */
    int32_t *bop;             /* [nb+1] local op whose backward is stage t */
    int32_t *need_o, *need_t; /* last stage where an op's run / a tensor can be useful */
    int32_t *last0;           /* [nt] last stage-0 node that touches i */
    int32_t max_list;         /* longest in or saved list of an op, plus one */
    uint64_t static_bytes;    /* inputs + x_in: live all along */
    uint64_t *gstart;         /* [nb+2] gradient bytes live at the start of stage t */
    uint64_t *gnew, *gfree;   /* [nb+1] gradient bytes made / freed by stage t's backward */
    double base_time;         /* every forward once and every backward */
    double tscale, mscale;    /* objective and byte divisors */
    int copies;               /* the whole graph with copy columns (rkm__ilp_block_create_copies) */
    double *fstart;           /* [n+1] (copies) stage 0's node k starts at fstart[k] (tscale units) */
    rkm__ilp_arrays arrays;
} rkm__ilp_shape;

/* How a slot comes back from host memory in the copy model (ilp.c). */
enum { RKM__ILP_BACK_BWD, RKM__ILP_BACK_WAIT, RKM__ILP_BACK_STAGE, RKM__ILP_BACK_KINDS };

/* (b) The LP model of the block, budget-independent: budgets are bounds
 * that each solve sets. */
typedef struct rkm__ilp_model {
    struct _lprec *lp; /* lp_solve's lprec; only ilp.c includes lp_lib.h */
    int32_t ncols, nrows;
    int32_t *colR, *colRP;    /* [(nb+1)*n], 0: no column */
    int32_t *colS;            /* [(nb+2)*nt] */
    rkm__ilp_node *node;      /* stage t's nodes: node[node_off[t] .. node_off[t+1]) */
    int32_t *node_off;        /* [nb+2] */
    int32_t n_nodes;
    rkm__ilp_free *fcand;
    int32_t n_fcand;
    /* With shape.copies (else NULL), a copy slot x is block tensor i = x
     * or the saved state of op v = x - nt: */
    int32_t *colO;            /* [nt+n] x spends the backward's start in host memory */
    int32_t *colD;            /* [(nt+n)*n] x off the device from stage 0's node k on */
    int32_t *colP[RKM__ILP_BACK_KINDS]; /* [(nb+2)*(nt+n)] x back for stage t, each way */
    int32_t *colW;            /* [nb+1] the compute stream's wait for prefetches at stage t's end */
    int32_t *colWF;           /* [n+1] its wait for offloads before forward node k (n: the loss) */
    int bad;                  /* a row that never holds: no schedule at any budget */
    int stale;                /* its last solve was aborted: rebuilt before the next */
    double *x;                /* [ncols] solution */
    rkm__ilp_arrays arrays;
} rkm__ilp_model;

/* (c) What solves of the block learn and later solves use. */
typedef struct rkm__ilp_memo {
    rkm__ilp_sched cache[RKM__ILP_CACHE]; /* schedules found so far (ring) */
    int32_t n_cache, cache_next;
    rkm__ilp_none none[RKM__ILP_CACHE];   /* budget pairs proven empty (ring) */
    int32_t n_none, none_next;
    uint64_t min_peak, min_kept;          /* no schedule has a lower peak / kept memory */
} rkm__ilp_memo;

/* One compute event of a schedule (ilp_sched.c). */
typedef struct rkm__ilp_event {
    int32_t kind, v, t;
} rkm__ilp_event;

/* A free point: block tensor i is freed after an event; the next at the
 * same event (its list in tensor order), -1: none. */
typedef struct rkm__ilp_fpoint {
    int32_t i, next;
} rkm__ilp_fpoint;

/* (d) Scratch of one solve, in three parts with one user each. Emitting and
 * replaying a schedule (rkm__ilp_measure), its buffers kept from one
 * schedule to the next (the greedy measures thousands): */
typedef struct rkm__ilp_replayer {
    int32_t *live;      /* [nt] last event that touched a tensor */
    int32_t *rbuf;      /* [max_list] one op's in or saved list */
    rkm__ilp_event *ev; /* [events] a schedule's events in order */
    int32_t *fhead;     /* [events] the first free point after each event, -1: none */
    rkm__ilp_fpoint *fp; /* free points (fcap, grown) */
    size_t fcap;
    rkm__steps steps;   /* the measured schedule's steps (grown) */
    size_t last_steps;  /* steps of the last schedule measured (work count) */
    rkm__sim sim;
} rkm__ilp_replayer;

/* The greedy (rkm__ilp_greedy) and its two trial schedules: */
typedef struct rkm__ilp_greedy_ws {
    uint8_t *x;     /* [n] the recompute set: 0 keep, 1 always, 2 once */
    uint8_t *seen2; /* [n] ops with x = 2 that have run again */
    rkm__ilp_sched trial, alt;
} rkm__ilp_greedy_ws;

/* And rkm__ilp_block_solve's own two schedules. */
typedef struct rkm__ilp_scratch {
    rkm__ilp_replayer rp;
    rkm__ilp_greedy_ws gr;
    rkm__ilp_sched best;  /* the incumbent */
    rkm__ilp_sched found; /* the greedy's result, then lp_solve's solution */
    rkm__ilp_arrays arrays;
} rkm__ilp_scratch;

/* ---- ilp_sched.c ---- */

/* A schedule's steps, and where its forward part ends. */
typedef struct rkm__ilp_out {
    rkm__steps l;
    size_t n_fwd;
} rkm__ilp_out;

#endif

/* ---- chain.c ---- */

/* ===========================================================================
 * 10. Chain DP
 * ===========================================================================
 *
 * An abstract chain of blocks 0..n-1. Block i reads x_{i-1} (nothing for
 * block 0) and writes x_i (the loss for the last block, counted inside that
 * block's own numbers: its output has 0 slots). Memory is in integer slots
 * above the graph's inputs (rkm__planner_chain converts the blocks' bytes,
 * options.c, to them).
 * Per block: in_sz (slots of x_{i-1}), g_out (slots of grad(x_i)), a no-save
 * forward (time tfn, peak pfn counting x_{i-1} and x_i) and options k, each
 * (tf, tb, kept, pf, pb): F_k leaves x_{i-1}, x_i and `kept` slots live and
 * peaks at pf (counting them); B_k starts from x_{i-1}, x_i, kept, grad(x_i),
 * peaks at pb (counting them), and leaves x_{i-1} and grad(x_{i-1}).
 *
 * Peaks are raised to the live sets they count (rkm__dp_pf and friends): a
 * caller rounds each size and peak up to slots on its own, so a rounded peak
 * can fall below the sum of its rounded parts; the raise keeps the DP from
 * promising memory that is not there.
 *
 * Opt(a, b, m): least time for blocks a..b when x_{a-1} is live (held by the
 * caller), grad(x_b) is live, and m slots hold everything of the segment,
 * x_{a-1} and grad(x_b) included. It ends with x_{a-1} and grad(x_{a-1}).
 *   option k:      F_k(a), Opt(a+1, b, m - in_a - kept_k), B_k(a)
 *   checkpoint j:  no-save forward a..j-1 (x_{t-1} freed after block t > a),
 *                  Opt(j, b, m - in_a), free x_{j-1}, Opt(a, j-1, m)
 * On a chain with a copy link (to_host, from_host of block a > 0), each has
 * a twin where x_{a-1} waits in host memory instead of taking in_a slots
 * from the segment after it (Beaumont, Eyraud-Dubois, Shilova, NeurIPS
 * 2021, for chains):
 *   option k:      offload x_{a-1}, F_k(a), wait, free x_{a-1},
 *                  Opt(a+1, b, m - kept_k), prefetch x_{a-1}, wait, B_k(a)
 *   checkpoint j:  offload x_{a-1}, no-save forward a..j-1, wait, free
 *                  x_{a-1}, Opt(j, b, m), free x_{j-1}, prefetch x_{a-1},
 *                  wait, Opt(a, j-1, m)
 * The offload hides behind the forward it is issued before; what it does
 * not is waited for, and the prefetch is waited for whole, so every copy
 * ends before the segment that follows it starts: the copy streams are
 * idle at each segment's start, and the twin's time is exactly its
 * forward, backward and segments plus max(0, to_host - forward) +
 * from_host (the planner then moves prefetches ahead where the budget
 * lets them hide: rkm__dtr_hoist). A twin with no segment after it (option
 * k at a == b) frees nothing and is left out.
 * Ties (exactly equal times) go to the first candidate in this order:
 * options in their given order, then checkpoints by increasing j.
 * Infeasible cells have cost INFINITY and decision RKM__DP_NONE; a cost of 0
 * is an ordinary cost.
 *
 * Block-level schedules (rkm__dp_ops) are what the planner flattens; the DP's
 * reconstruction and the sqrt schedule produce them, rkm__dp_eval measures
 * them with the rules of rkm__dp_apply. */
typedef struct rkm__dp_option {
    double tf, tb;   /* forward and backward time */
    int32_t kept;    /* slots kept from F_k to B_k, besides x_{i-1} and x_i */
    int32_t pf, pb;  /* peak slots of F_k and B_k (see above) */
} rkm__dp_option;

typedef struct rkm__dp_block {
    int32_t in_sz;   /* slots of x_{i-1}; must be 0 for the first block */
    int32_t g_out;   /* slots of grad(x_i); must be 0 for the last block */
    int32_t pfn;     /* peak of the no-save forward, counting x_{i-1} and x_i */
    double tfn;      /* time of the no-save forward */
    int32_t n_opt;
    const rkm__dp_option *opt;
    double to_host, from_host; /* seconds to copy x_{i-1} each way; both 0: it stays on the device */
} rkm__dp_block;

enum {
    RKM__DP_FWD_OPT,    /* F_k of `block`, k = `option` */
    RKM__DP_BWD_OPT,    /* B_k of `block` (the last block's includes the loss step) */
    RKM__DP_FWD_NOSAVE, /* no-save forward of `block`: only x_block is left */
    RKM__DP_FREE_OUT,   /* free x_block, the output of `block` */
    RKM__DP_OFFLOAD_IN, /* start copying x_{block-1} to host memory */
    RKM__DP_DROP_IN,    /* wait for that copy, free x_{block-1} */
    RKM__DP_FETCH_IN    /* copy x_{block-1} back, wait for it, release the host copy */
};

typedef struct rkm__dp_op {
    int32_t kind, block, option; /* option: -1 unless FWD_OPT or BWD_OPT */
} rkm__dp_op;

typedef struct rkm__dp_ops {
    rkm__dp_op *v;
    size_t n, cap;
} rkm__dp_ops;

/* A candidate of a cell (a, b, m), m >= start: its cost is base, plus
 * Opt of pair p1 at m - sh, plus Opt of pair p2 at m (RKM__DP_NOROW: none). */
typedef struct rkm__dp_term {
    double base;
    int32_t start, sh;
    uint32_t p1, p2;
} rkm__dp_term;

/* The same, while enumerating: constant for m >= cf, decision dec. */
typedef struct rkm__dp_cand {
    rkm__dp_term x;
    int64_t cf;
    uint32_t dec;
} rkm__dp_cand;

typedef struct rkm__dp_table {
    const rkm__dp_block *bl; /* the chain (the caller keeps it alive) */
    int32_t n, M;
    size_t row;      /* M + 1 cells per pair (a, b) */
    double *cost;    /* Opt(a, b, m) at [rkm__dp_pair(n, a, b) * row + m] */
    int64_t *lo;     /* per pair: least feasible m (may exceed M) */
    int32_t *hi;     /* per pair: the cost is constant for m >= hi */
    rkm__dp_cand *cands; /* scratch: the candidates of one pair */
    double *bound;       /* scratch: a bound per candidate of one pair */
    size_t n_cands;      /* capacity of both: most options of a block + n */
    rkm__dp_term *terms; /* while solving: every pair's feasible candidates */
    size_t n_terms, cap_terms;
    size_t *term_at;     /* per pair: its first term; its last is term_at[p] + term_n[p] */
    uint32_t *term_n;
} rkm__dp_table;

/* ---- dtr.c ---- */

/* Eviction scores, least evicted first. DTR's own is cost / (bytes x
 * staleness); the planner tries them all and keeps the fastest plan, since
 * which one wins depends on the graph. */
enum {
    RKM__DTR_H,        /* cost / (bytes x staleness) */
    RKM__DTR_H_EQ,     /* the same, cost counting evicted inputs to recompute too */
    RKM__DTR_COST,     /* cost / bytes: cheapest per byte */
    RKM__DTR_LRU,      /* 1 / staleness */
    RKM__DTR_SCORES
};

/* ---- planner.c ---- */

/* The call in progress as desc.progress sees it (progress.c): how far it
 * is, in a part [lo, hi] of the call's work whose own progress is `sub`,
 * or the search's meter (work_left) in a solve. */
typedef struct rkm__progress {
    rkm_progress p;          /* the last report (fraction never goes back) */
    double start, last;      /* rkm__now() at the call's start, at the last report */
    double lo, hi, sub;      /* the part under way and how far it is, in [0, 1] */
    double ilp;              /* how far the whole-graph ILP's solve under way is */
    int cancelled;           /* the callback returned non-zero: the call stops */
} rkm__progress;

/* What a driver asks of a solve's search (planner.c: a solve's fit, the
 * smallest budget's fits, the bases a solve with a link offloads), passed
 * down by value: the planner object keeps no mode. */
typedef struct rkm__ask {
    uint64_t work_end; /* the search's shares end where the call has spent this much (UINT64_MAX: no end) */
    unsigned skip;     /* parts left out: RKM__SKIP_* */
} rkm__ask;
enum {
    RKM__SKIP_ILP = 1,     /* the whole-graph ILP start */
    RKM__SKIP_MISSED = 2,  /* DTR's missed plan's track */
    RKM__SKIP_PHASES = 4,  /* the kicks and the rungs */
    RKM__SKIP_COPIES = 8   /* checkmate's ILP with copies (its recompute-only floor is sought) */
};
#define RKM__ASK_SOLVE ((rkm__ask){UINT64_MAX, 0})

struct rkm_planner {
    const rkm_graph *g;      /* what it plans with: the user's graph, sizes rounded up to the alignment */
    const rkm_graph *user;   /* the user's graph: its plans are born there */
    rkm_graph *own;          /* g when it is a copy (sizes not already multiples of the alignment) */
    rkm_context *ctx;
    rkm_solve_desc d;
    uint64_t base_peak;      /* the graph's figures */
    double base_time;
    uint64_t lower_bound;
    double t0;               /* planner creation time: the time budget runs from here */
    /* The wall-clock safety stop (desc.time_limit): the call in progress
     * (create, a solve, min_budget) stops its search past it, at the checks
     * of rkm__over; cut says that happened, so the result may depend on
     * the machine. Without a cut the deadline never changed a thing. */
    double deadline;
    int cut;                 /* the call in progress was cut */
    int create_cut;          /* rkm_planner_create was: its options, so every plan, depend on the clock */
    int min_cut;             /* min_budget / min_plan came from a cut call: computed again next time */
    uint64_t stage_cap;      /* a stage's fit in progress (d.in_flight > 1): its budget, which the search's
                              * valid plans' arenas fit (rkm__planner_fit); 0 outside one */
    int32_t cuts;            /* calls cut so far (rkm_planner_stats.cut) */
    rkm__bopts *bo;          /* per block, NULL for checkmate and none */
    uint64_t q;              /* bytes per DP slot */
    rkm__dp_block *dpb;      /* the chain in slots */
    rkm__dp_option *dpo;
    size_t n_dpo;
    rkm__dp_table table;     /* built once, for M = slots (rotor, rockmate) */
    rkm__dp_block *off_dpb;  /* with a copy link: the chain whose block inputs may wait in host memory */
    rkm__dp_table off_table; /* its table (chain.c's twins), built at the first solve that offloads */
    double create_seconds;
    rkm__ilp_stats ilp;      /* ILP counters */
    uint64_t min_budget;     /* cached by rkm_planner_min_budget; 0: not yet */
    rkm_plan *min_plan;      /* the plan that meets it (handed out: laid out, on the user's graph) */
    uint64_t off_min;        /* with a copy link, the smallest budget offloading meets, once bisected; 0: not yet */
    rkm_plan *off_min_plan;  /* the plan that meets it, if below min_budget (else NULL) */
    uint64_t dtr_min;        /* DTR's smallest budget, once bisected; 0: not yet */
    uint64_t dtr_min_at;     /* the budget DTR made that plan for (in place, its peak is lower) */
    int32_t ilp_skipped;     /* block ILP solves left out: time_limit ran out */
    uint64_t chain_floor;    /* the least peak of the chain DP's plans, once scanned; 0: not yet */
    int64_t chain_floor_slots; /* the slot budget whose plan peaks there */
    int32_t depth;           /* 0; a nested planner (one block planned as a graph): its parent's + 1 */
    double pool;             /* block ILP work left (d.ilp_budget at first), in seconds of its calibration */
    int32_t nested;          /* classes whose options came from a nested planner */
    uint64_t kick_work;      /* the kicks' squeeze work per solve (bench/bench_kick sets 0 to compare) */
    uint64_t work_left;      /* the search's share left in this try (search.c) */
    /* The call's work meter (progress.c), on the top planner only: what the
     * call may spend, what it has spent, and the cap of the part under way
     * (rkm__work_part); in RKM__WORK's units. */
    uint64_t work_limit, work_spent, work_cap;
    /* A nested planner's parent (nest.c), NULL at the top: its checks are
     * the parent's too, so that the parent reports and a cancel stops it. */
    rkm_planner *parent;
    rkm__progress prog;      /* the call's progress (progress.c); only the top planner reports */
};

/* ---- search.c ---- */

/* ===========================================================================
 * Functions one file defines and others call
 * ======================================================================== */

/* base.c */
RKM__PRIVATE void *rkm__alloc(rkm_context *ctx, size_t size);
RKM__PRIVATE void *rkm__calloc(rkm_context *ctx, size_t n, size_t elem);
RKM__PRIVATE void *rkm__realloc(rkm_context *ctx, void *ptr, size_t old_size, size_t new_size);
RKM__PRIVATE void rkm__free(rkm_context *ctx, void *ptr, size_t size);
RKM__PRIVATE int rkm__reserve_grow(rkm_context *ctx, void **p, size_t *cap, size_t need, size_t elem);
/* Grow *p (an array of `elem`-byte items with capacity *cap) to hold `need`:
 * inline where it has room, as on nearly every call (as a call, 6 % of a
 * solve's time on dag4x50). */
static inline int rkm__reserve(rkm_context *ctx, void **p, size_t *cap, size_t need, size_t elem)
{
    return need <= *cap || rkm__reserve_grow(ctx, p, cap, need, elem);
}
RKM__PRIVATE char *rkm__strdup(rkm_context *ctx, const char *s);
RKM__PRIVATE void rkm__strfree(rkm_context *ctx, char *s);
RKM__PRIVATE void rkm__log(rkm_context *ctx, rkm_log_level level, const char *fmt, ...);
RKM__PRIVATE rkm_result rkm__err(rkm_context *ctx, rkm_result code, const char *fmt, ...);
RKM__PRIVATE rkm_result rkm__nomem(rkm_context *ctx, const char *where);
RKM__PRIVATE double rkm__now(void);
RKM__PRIVATE int rkm__add_u64(uint64_t a, uint64_t b, uint64_t *out);
RKM__PRIVATE uint64_t rkm__round_up(uint64_t v, uint64_t a);
RKM__PRIVATE int32_t rkm__map_find(const rkm__map *m, const char *name, rkm__name_of name_of, const void *owner);
RKM__PRIVATE int rkm__map_insert(rkm_context *ctx, rkm__map *m, int32_t id, rkm__name_of name_of, const void *owner);
RKM__PRIVATE void rkm__map_free(rkm_context *ctx, rkm__map *m);
/* Lifetimes: an object made with ctx (graph, arena) holds it from its
 * birth and releases it as the last thing it does in its destroy; the last
 * release of a destroyed context frees it. */
RKM__PRIVATE void rkm__ctx_hold(rkm_context *ctx);
RKM__PRIVATE void rkm__ctx_release(rkm_context *ctx);
/* A holder's destroy ends with this: free the holder (size bytes), then
 * release ctx. */
RKM__PRIVATE void rkm__ctx_free_holder(rkm_context *ctx, void *holder, size_t size);

/* graph.c */
RKM__PRIVATE uint64_t rkm__fwd_ws_most(const rkm__op *o);
RKM__PRIVATE const char *rkm__tensor_name_of(const void *g, int32_t id);
RKM__PRIVATE int rkm__name_ok(const char *s);
RKM__PRIVATE void rkm__graph_free_blocks(rkm_graph *g);
/* As rkm__ctx_hold for what is made from a graph (plan, planner, arena
 * exec): held from birth, released as the last thing of its destroy. */
RKM__PRIVATE void rkm__graph_hold(const rkm_graph *g);
RKM__PRIVATE void rkm__graph_release(const rkm_graph *g);
/* A holder's destroy ends with this: free the holder (size bytes, with
 * ctx), then release g. */
RKM__PRIVATE void rkm__graph_free_holder(rkm_context *ctx, void *holder, size_t size, const rkm_graph *g);
/* *slot, the graph a holder holds, becomes g (held; the old one released). */
RKM__PRIVATE void rkm__graph_rehold(const rkm_graph **slot, const rkm_graph *g);
RKM__PRIVATE int rkm__list_has(const int32_t *list, int32_t n, int32_t x);
RKM__PRIVATE rkm_result rkm__check_finalized(const rkm_graph *g, const char *fn);
/* Graph error: prefixes "source:line: " when a reader is active. */
RKM__PRIVATE rkm_result rkm__gerr(const rkm_graph *g, rkm_result code, int32_t line, const char *fmt, ...);
/* RKM_ERROR_STATE unless g is a builder (not finalized). */
RKM__PRIVATE rkm_result rkm__check_builder(const rkm_graph *g, const char *fn);

/* text.c */
RKM__PRIVATE rkm_result rkm__rerr(rkm__reader *r, rkm_result code, const char *fmt, ...);
RKM__PRIVATE rkm_result rkm__next_stmt(rkm__reader *r);
RKM__PRIVATE void rkm__reader_free(rkm__reader *r);
RKM__PRIVATE int rkm__parse_u64(const char *s, uint64_t *out);
RKM__PRIVATE size_t rkm__decimal_len(const char *s);
RKM__PRIVATE int rkm__decimal_value(const char *s, size_t n, double *out);
RKM__PRIVATE rkm_result rkm__slurp(rkm_context *ctx, const char *path, char **data, size_t *len);
RKM__PRIVATE void rkm__out_flush(rkm__out *o);
RKM__PRIVATE void rkm__outf(rkm__out *o, const char *fmt, ...);
RKM__PRIVATE rkm_result rkm__write_file(rkm_context *ctx, const char *path, rkm_result (*writer)(const void *, rkm_write_fn, void *), const void *obj);

/* plan.c */
/* Append a step (not in place); 0 on NOMEM. Inline: the search's inner loops. */
static inline int rkm__steps_push(rkm__steps *l, int32_t kind, int32_t index, int32_t save)
{
    if (!rkm__reserve(l->ctx, (void **)&l->s, &l->cap, l->n + 1, sizeof *l->s)) return 0;
    l->s[l->n++] = (rkm_step){.kind = kind, .index = index, .save = save};
    return 1;
}
RKM__PRIVATE int rkm__steps_push_step(rkm__steps *l, const rkm_step *st);
RKM__PRIVATE rkm_step *rkm__steps_take(rkm__steps *l);
RKM__PRIVATE void rkm__steps_free(rkm__steps *l);
RKM__PRIVATE rkm_result rkm__steps_copy(rkm_context *ctx, const rkm_step *steps, size_t n, rkm__steps *d, const char *what);
RKM__PRIVATE rkm_result rkm__plan_birth(const rkm_graph *g, rkm__steps *draft, rkm_sim_result *res, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__plan_copy(const rkm_plan *p, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__plan_handout(rkm_result r, uint64_t alignment, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__plan_args(const rkm_graph *g, rkm_plan **out, int input_ok, const char *fn, const char *what);

/* sim.c */
RKM__PRIVATE uint64_t rkm__slot_bytes(const rkm_graph *g, int32_t t);
RKM__PRIVATE size_t rkm__slot_touches_max(const rkm_graph *g);
RKM__PRIVATE int32_t rkm__slot_touches(const rkm_graph *g, const rkm_step *st, int32_t *v);
RKM__PRIVATE double rkm__copy_seconds(const rkm_graph *g, int32_t t, double bytes_per_second);
RKM__PRIVATE void rkm__sim_free(rkm__sim *s);
RKM__PRIVATE void rkm__sim_reset(rkm__sim *s);
RKM__PRIVATE void rkm__sim_copy(rkm__sim *dst, const rkm__sim *src);
RKM__PRIVATE rkm_result rkm__sim_init(const rkm_graph *g, rkm__sim *s);
RKM__PRIVATE void rkm__sim_give_tensor(rkm__sim *s, int32_t t);
RKM__PRIVATE void rkm__sim_give_grad(rkm__sim *s, int32_t t);
RKM__PRIVATE int rkm__grad_complete(const rkm__sim *s, int32_t t);
RKM__PRIVATE uint64_t rkm__sim_fwd_ws(const rkm__sim *s, const rkm__op *o, int32_t x, int save);
RKM__PRIVATE rkm_rule rkm__sim_step(rkm__sim *s, const rkm_step *st, uint64_t *peak, int32_t *obj);
RKM__PRIVATE rkm_rule rkm__sim_end(const rkm__sim *s, int32_t *obj);
RKM__PRIVATE int rkm__sim_run_peaks(rkm__sim *s, const rkm_step *steps, size_t n, rkm_sim_result *res, uint64_t *mem_after, uint64_t *step_peak, rkm__recorder *rc);
RKM__PRIVATE int rkm__sim_run(rkm__sim *s, const rkm_step *steps, size_t n, rkm_sim_result *res, uint64_t *mem_after);
RKM__PRIVATE int rkm__step_on_op(int32_t kind);
RKM__PRIVATE size_t rkm__copy_slot(const rkm_graph *g, const rkm_step *st);
RKM__PRIVATE int rkm__step_index_ok(const rkm_graph *g, const rkm_step *s);
RKM__PRIVATE const int32_t *rkm__step_objects(const rkm_graph *g, const rkm_step *st, int grads, int32_t *n);
/* The buffers' lifetimes, recorded by a replay (rkm__sim_run_peaks) */
RKM__PRIVATE rkm_result rkm__recorder_init(rkm__recorder *rc, rkm_plan *p);
RKM__PRIVATE void rkm__recorder_end(rkm__recorder *rc);
RKM__PRIVATE void rkm__recorder_free(rkm__recorder *rc);
/* The object a broken rule concerns, by name ("" if none) */
RKM__PRIVATE const char *rkm__obj_name(const rkm_graph *g, rkm_rule rule, int32_t obj);

/* layout.c */
/* work (NULL: none): in, the units first fit and the later stages may do
 * (each also within its RKM__LAYOUT_ constant); out, the units they did */
RKM__PRIVATE rkm_result rkm__layout(rkm_context *ctx, rkm_buffer *b, size_t n, uint64_t align, unsigned stages, uint64_t *work, uint64_t *arena, uint64_t *peak);
RKM__PRIVATE int rkm__layout_fits(const rkm_plan *p, uint64_t align);
RKM__PRIVATE rkm_result rkm__plan_seal(rkm_plan *p, uint64_t alignment, uint64_t *work);

/* baseline.c */
RKM__PRIVATE int rkm__saves_phantom(const rkm__op *o);
RKM__PRIVATE rkm_result rkm__lower_inplace(const rkm_graph *g, rkm__steps *d);
RKM__PRIVATE rkm_result rkm__plan_baseline(const rkm_graph *g, rkm_plan **out);
RKM__PRIVATE uint64_t rkm__bytes_union(const rkm_graph *g, const int32_t *a, int32_t na, const int32_t *b, int32_t nb, int grads_only);
RKM__PRIVATE rkm_result rkm__graph_figures(rkm_graph *g);
RKM__PRIVATE uint64_t rkm__lower_bound(const rkm_graph *g, int32_t *op, int *bwd);

/* structure.c */
RKM__PRIVATE int64_t rkm__local_ref(const rkm_graph *g, const rkm__block *b, int32_t t);
RKM__PRIVATE rkm_result rkm__structure_detect(rkm_graph *g);
/* finalize's work again on a copy of g with these costs, copy link, or
 * alignment (the planner's graph whose sizes are rounded up to it) */
RKM__PRIVATE rkm_result rkm__graph_aligned(const rkm_graph *g, uint64_t align, rkm_graph **out);
RKM__PRIVATE rkm_result rkm__graph_stage(const rkm_graph *g, int32_t first, int32_t end, rkm_graph **out);

/* options.c */
RKM__PRIVATE void rkm__bopts_free(rkm_context *ctx, rkm__bopts *b);
RKM__PRIVATE int rkm__option_measure(rkm__sim *s, const rkm__block *b, rkm__option *o);
RKM__PRIVATE int rkm__bopts_add(rkm_context *ctx, rkm__sim *s, const rkm__block *b, rkm__bopts *bo, rkm__option *o, int *valid);
RKM__PRIVATE int rkm__option_cmp(const void *x, const void *y);
RKM__PRIVATE rkm_result rkm__bopts_extremes(rkm__sim *s, const rkm__block *b, rkm__bopts *bo);
RKM__PRIVATE rkm_step rkm__map_step(const rkm_graph *g, const rkm__block *from, const rkm__block *to, rkm_step st);

/* ilp.c */
RKM__PRIVATE rkm_result rkm__ilp_block_create(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in, int32_t x_out, int is_last, rkm__ilp_block **out);
RKM__PRIVATE rkm_result rkm__ilp_block_solve(rkm__ilp_block *b, uint64_t peak_budget, uint64_t kept_budget, double time_limit_s, rkm_step **steps, size_t *n_fwd, size_t *n_bwd, rkm__ilp_stats *st, int *found);
RKM__PRIVATE rkm_result rkm__ilp_block_create_copies(const rkm_graph *g, rkm__ilp_block **out);
RKM__PRIVATE rkm_result rkm__ilp_block_solve_copies(rkm__ilp_block *b, uint64_t budget, double cutoff, double time_limit_s, rkm_step **steps, size_t *n_steps, uint8_t *offload, rkm__ilp_stats *st, int *found);
RKM__PRIVATE void rkm__ilp_block_destroy(rkm__ilp_block *b);
RKM__PRIVATE void rkm__ilp_block_deadline(rkm__ilp_block *b, double deadline);
RKM__PRIVATE void rkm__ilp_block_watch(rkm__ilp_block *b, int (*stop)(void *user, double done), void *user);


/* ilp_sched.c */
#ifndef RKM_OMIT_SOLVER
RKM__PRIVATE int rkm__ilp_spent(const rkm__ilp_work *u, int greedy);
RKM__PRIVATE size_t rkm__ilp_rsize(const rkm__ilp_shape *b);
RKM__PRIVATE void rkm__ilp_sched_copy(const rkm__ilp_shape *b, rkm__ilp_sched *dst, const rkm__ilp_sched *src);
RKM__PRIVATE rkm_result rkm__ilp_err(const rkm__ilp_shape *b, rkm_result code, const char *fmt, ...);
RKM__PRIVATE int rkm__ilp_phantom(const rkm__ilp_shape *b, int32_t v);
RKM__PRIVATE int32_t rkm__ilp_loc(const rkm__ilp_shape *b, int32_t t);
RKM__PRIVATE int rkm__ilp_bwd_reads(const rkm__ilp_shape *b, int32_t t, int32_t i);
RKM__PRIVATE size_t rkm__ilp_events_max(const rkm__ilp_shape *b);
RKM__PRIVATE rkm_result rkm__ilp_emit(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, const rkm__ilp_sched *s, rkm__ilp_out *o);
RKM__PRIVATE int rkm__ilp_measure(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, rkm__ilp_sched *s, rkm_result *res);
RKM__PRIVATE int rkm__ilp_fits(const rkm__ilp_sched *s, uint64_t peak_budget, uint64_t kept_budget);
RKM__PRIVATE rkm_result rkm__ilp_greedy(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_replayer *rp, uint64_t peak_budget, uint64_t kept_budget, rkm__ilp_work *work, rkm__ilp_sched *out);
RKM__PRIVATE rkm_result rkm__ilp_check(const rkm__ilp_shape *b, const int32_t *opl);
RKM__PRIVATE void rkm__ilp_derive(rkm__ilp_shape *b, int32_t *fill);
RKM__PRIVATE int rkm__ilp_take(rkm_context *ctx, rkm__ilp_arrays *a, void *where, size_t count, size_t elem);
RKM__PRIVATE void rkm__ilp_drop(rkm_context *ctx, rkm__ilp_arrays *a);
RKM__PRIVATE rkm_result rkm__ilp_shape_init(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in, int32_t x_out, int is_last, int copies, rkm__ilp_shape *b);
RKM__PRIVATE void rkm__ilp_floors(const rkm__ilp_shape *b, rkm__ilp_memo *memo);
RKM__PRIVATE rkm_result rkm__ilp_constants(rkm__ilp_shape *b);
#endif

/* chain.c */
RKM__PRIVATE void rkm__dp_ops_free(rkm_context *ctx, rkm__dp_ops *o);
RKM__PRIVATE rkm_result rkm__dp_eval(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, const rkm__dp_ops *ops, double *time, int64_t *peak);
RKM__PRIVATE rkm_result rkm__dp_min_slots(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, int64_t *min);
RKM__PRIVATE void rkm__dp_table_free(rkm_context *ctx, rkm__dp_table *t);
RKM__PRIVATE double rkm__dp_bytes(const rkm__dp_block *bl, int32_t n, int32_t M);
RKM__PRIVATE rkm_result rkm__dp_solve(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, int32_t M, double deadline, rkm__dp_table *t, int *cut);
RKM__PRIVATE double rkm__dp_opt(const rkm__dp_table *t, int32_t a, int32_t b, int32_t m);
RKM__PRIVATE rkm_result rkm__dp_schedule(rkm_context *ctx, rkm__dp_table *t, int32_t m, rkm__dp_ops *ops);
/* Segments of seg blocks (0: about sqrt(n)): each one's input kept, its
 * blocks recomputed before their backwards (1: every block, Megatron's
 * full recomputation). */
RKM__PRIVATE rkm_result rkm__dp_sqrt(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, int32_t seg, rkm__dp_ops *ops);

/* dtr.c; copy sets of rkm__dtr_steps: 0 recompute-only, 1..4 with copies */
#define RKM__DTR_COPY_SETS 5
RKM__PRIVATE rkm_result rkm__dtr_hoist(const rkm_plan *p, uint64_t budget, rkm__steps *out);
/* *work: in, the steps the run may take at most; out, the steps it took */
RKM__PRIVATE rkm_result rkm__dtr_steps(const rkm_graph *g, uint64_t budget, int score, int bytes_mode, int copies,
                                      double max_time, uint64_t *work, rkm__steps *draft);

/* progress.c */
RKM__PRIVATE int rkm__over(rkm_planner *pl);
RKM__PRIVATE void rkm__work_start(rkm_planner *pl, uint64_t limit);
RKM__PRIVATE uint64_t rkm__work_left(rkm_planner *pl);
RKM__PRIVATE uint64_t rkm__work_spent(rkm_planner *pl);
RKM__PRIVATE void rkm__work_charge(rkm_planner *pl, uint64_t work);
typedef struct rkm__ilp_turn {
    double lim;   /* the solve's work limit, in seconds of ILP work */
    double work0; /* pl->ilp.work before it */
} rkm__ilp_turn;
RKM__PRIVATE rkm__ilp_turn rkm__work_ilp_begin(rkm_planner *pl, double lim);
RKM__PRIVATE void rkm__work_ilp_end(rkm_planner *pl, rkm__ilp_turn t);
RKM__PRIVATE uint64_t rkm__work_part(rkm_planner *pl, uint64_t allow);
RKM__PRIVATE void rkm__work_part_end(rkm_planner *pl, uint64_t was);
RKM__PRIVATE uint64_t rkm__work_solve(const rkm_graph *g);
RKM__PRIVATE int rkm__affords(const rkm_graph *g, int64_t ops, double need);
RKM__PRIVATE void rkm__progress_begin(rkm_planner *pl, rkm_stage stage, uint64_t budget);
RKM__PRIVATE int rkm__progress_report(rkm_planner *pl, double now, int force);
RKM__PRIVATE void rkm__progress_part(rkm_planner *pl, double lo, double hi);
RKM__PRIVATE void rkm__progress_sub(rkm_planner *pl, double sub);
RKM__PRIVATE void rkm__progress_plan(rkm_planner *pl, const rkm_plan *p);
RKM__PRIVATE int rkm__progress_ilp(void *user, double done);
RKM__PRIVATE rkm_result rkm__progress_result(rkm_planner *pl, rkm_result r, const char *what);

/* produce.c */
RKM__PRIVATE void rkm__planner_free(rkm_planner *pl);
RKM__PRIVATE uint64_t rkm__slots_budget(const rkm_planner *pl, int64_t m);
RKM__PRIVATE rkm_result rkm__class_add(rkm_planner *pl, rkm__sim *s, const rkm__block *from, const rkm_step *steps, size_t nf, size_t nb);
RKM__PRIVATE rkm_result rkm__planned_birth(rkm_planner *pl, rkm__steps *draft, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__draft_birth(rkm_planner *pl, const rkm_graph *g, rkm__steps *draft, rkm_plan **out);
/* The chain's plans: the DP's, sqrt's fixed checkpoints, the DP's with
 * block inputs in host memory where that is faster (a graph with a link). */
enum { RKM__CHAIN_DP, RKM__CHAIN_SQRT, RKM__CHAIN_OFF, RKM__CHAIN_FULL };
RKM__PRIVATE rkm_result rkm__solve_fixed(rkm_planner *pl, uint64_t budget, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__solve_chain(rkm_planner *pl, int rule, uint64_t budget, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__chain_floor(rkm_planner *pl, uint64_t *peak, int64_t *slots);
RKM__PRIVATE rkm_result rkm__solve_dp_at(rkm_planner *pl, uint64_t budget, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__solve_dp_up(rkm_planner *pl, uint64_t budget, const rkm_plan *own, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__solve_dp(rkm_planner *pl, uint64_t budget, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__dtr_plan(rkm_planner *pl, uint64_t budget, int first, rkm_plan **out, rkm_plan **missed);
RKM__PRIVATE rkm_result rkm__solve_dtr(rkm_planner *pl, uint64_t budget, rkm_plan **out, rkm_plan **missed);
RKM__PRIVATE rkm_result rkm__dtr_offloads(rkm_planner *pl, uint64_t budget, double bound, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__chain_offloads(rkm_planner *pl, uint64_t budget, double bound, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__planner_arena(rkm_planner *pl, const rkm_plan *p, uint64_t *arena);
RKM__PRIVATE rkm_result rkm__handout_seal(rkm_planner *pl, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__planner_handout(rkm_planner *pl, rkm_plan *p, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__handout_within(rkm_planner *pl, rkm_plan *p, uint64_t budget, rkm_plan **out, uint64_t *arena);
RKM__PRIVATE int rkm__dtr_affordable(const rkm_planner *pl);
/* A maker of plans laid out as the host gets them, for rkm__fit_less: a
 * plan for `budget` (its arena may be over it), or *out NULL. */
typedef rkm_result (*rkm__maker)(rkm_planner *pl, uint64_t budget, void *arg, rkm_plan **out);
RKM__PRIVATE uint64_t rkm__less(uint64_t asked, uint64_t peak, uint64_t arena, uint64_t budget);
RKM__PRIVATE rkm_result rkm__stage_share(rkm_planner *pl, uint64_t budget, rkm__maker make, void *arg, rkm_plan **out,
                                        uint64_t *one);
RKM__PRIVATE rkm_result rkm__fit_less(rkm_planner *pl, uint64_t budget, rkm__maker make, void *arg, rkm_plan **out,
                                     uint64_t *need);
/* A probe of a smallest budget's bisection: a plan for `budget` or *out
 * NULL; `arg` is the search's own (the bases it offloads, what it asks). */
typedef rkm_result (*rkm__probe)(rkm_planner *pl, uint64_t budget, void *arg, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__bisect(rkm_planner *pl, rkm__probe probe, void *arg, int probes, int by_peak, uint64_t lo,
                                   uint64_t *hi, uint64_t *at, int *stopped);
RKM__PRIVATE rkm_plan *rkm__faster(rkm_plan *a, rkm_plan *b);
RKM__PRIVATE rkm_result rkm__prefer(rkm_planner *pl, rkm_plan **best, rkm_plan *q, int *took);
RKM__PRIVATE rkm_result rkm__stage_arena(rkm_planner *pl, const rkm_plan *p, uint64_t *arena);
RKM__PRIVATE rkm_result rkm__dtr_min_budget(rkm_planner *pl, uint64_t *out);

/* offload.c */
RKM__PRIVATE rkm_result rkm__offload_plan(const rkm_graph *g, const rkm_step *base, size_t n, uint64_t budget, int exposed,
                                         const uint8_t *prefer, rkm__steps *out, uint64_t *work);
RKM__PRIVATE rkm_result rkm__offload_fit(rkm_planner *pl, const rkm_plan *b, uint64_t budget, int exposed, const uint8_t *prefer, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__offload_exposed(rkm_planner *pl, const rkm_plan *b, uint64_t budget, const uint8_t *prefer,
                                            rkm_plan **out);
RKM__PRIVATE rkm_result rkm__offload_try(rkm_planner *pl, const rkm_plan *b, uint64_t budget, const uint8_t *prefer,
                                        rkm_plan **q, rkm_plan **x);
RKM__PRIVATE int rkm__offloads(const rkm_planner *pl);
RKM__PRIVATE rkm_result rkm__ilp_offloads(rkm_planner *pl, uint64_t budget, double bound, double time_limit, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__solve_checkmate(rkm_planner *pl, uint64_t budget, double time_limit, int copies, rkm_plan **out);

/* search.c */
RKM__PRIVATE void rkm__search_begin(rkm_planner *pl, rkm__ask ask);
RKM__PRIVATE rkm_result rkm__offload_moves(rkm_planner *pl, uint64_t budget, uint64_t limit, rkm_plan **p);
RKM__PRIVATE rkm_result rkm__solve_squeezed(rkm_planner *pl, uint64_t budget, rkm_plan **out);
RKM__PRIVATE rkm_result rkm__canonical_draft(const rkm_graph *g, const rkm_step *steps, size_t n, rkm__steps *out);
RKM__PRIVATE uint64_t rkm__kick_work(const rkm_graph *g);
RKM__PRIVATE rkm_result rkm__solve_rockmate(rkm_planner *pl, uint64_t budget, rkm__ask ask, rkm_plan **out);

/* nest.c */
RKM__PRIVATE rkm_result rkm__drop_options(rkm_planner *pl, rkm__sim *s, const rkm__block *b);
RKM__PRIVATE rkm_result rkm__drop_plan(rkm_planner *pl, const rkm_graph *h, const rkm_plan *base, uint8_t *drop, rkm__steps *c, rkm_plan **out);
/* A planner for g below `parent`: rkm__planner_make (planner.c), handed
 * down to nesting, the planner's recursion (a block planned as a graph of
 * its own), so that nest.c calls nothing above it. */
typedef rkm_result (*rkm__planner_maker)(const rkm_graph *g, const rkm_solve_desc *desc, rkm_planner *parent,
                                         rkm_planner **out);
RKM__PRIVATE rkm_result rkm__nest_options(rkm_planner *pl, rkm__planner_maker make, rkm__sim *s, const rkm__block *b,
                                         uint64_t peak_lo, uint64_t peak_hi, double allow, int *nested);

/* drive.c */
RKM__PRIVATE uint64_t rkm__work_checkmate(const rkm_planner *pl);
RKM__PRIVATE uint64_t rkm__work_min_left(const rkm_planner *pl);
RKM__PRIVATE int rkm__uses_chain(rkm_algo a);
RKM__PRIVATE int rkm__fixed_chain(rkm_algo a);
RKM__PRIVATE rkm_result rkm__planner_fit(rkm_planner *pl, uint64_t budget, rkm__ask ask, rkm_plan **out, uint64_t *need);
/* The planner's smallest budget (recompute only), kept; pl->min_plan meets it. */
RKM__PRIVATE rkm_result rkm__min_budget_get(rkm_planner *pl, uint64_t *out);
RKM__PRIVATE rkm_result rkm__offload_min_budget(rkm_planner *pl, uint64_t *out);
RKM__PRIVATE rkm_result rkm__planner_min(rkm_planner *pl, uint64_t *out);
RKM__PRIVATE rkm_result rkm__planner_offload(rkm_planner *pl, uint64_t budget, rkm_plan **p);
RKM__PRIVATE rkm_result rkm__checkmate_fallback(rkm_planner *pl, uint64_t budget, rkm_plan **p);

/* planner.c */
RKM__PRIVATE rkm_result rkm__planner_make(const rkm_graph *g, const rkm_solve_desc *desc, rkm_planner *parent, rkm_planner **out);

#endif /* RKM__INTERNAL_H */
