/* rockmate.h -- plan and run activation re-materialization for training steps.
 *
 * rockmate is an embeddable C11 library. A host (a training engine written in C
 * or CUDA) describes one training step as a graph of forward ops and the
 * activation tensors they make, gives a memory budget for activations, and gets
 * back a plan: a schedule of forward, backward, recompute and free steps that
 * stays under the budget at the least extra compute the planner can find. The
 * library then walks the plan and calls the host's own functions. It never
 * touches tensor data.
 *
 * The method is Rockmate's (ICML 2023): the graph is cut into a sequence of
 * blocks, each kind of block gets several memory/time options, and a Rotor-style
 * dynamic program along the chain picks options and checkpoints. Where the host
 * can copy to host memory (a graph's copy link), plans may also offload tensors
 * there and prefetch them back, on copy streams beside the compute
 * (docs/formats.md, "Offloading").
 *
 * QUICK START
 *
 *     rkm_context *ctx;  rkm_graph *g;  rkm_plan *plan;
 *     rkm_context_create(NULL, &ctx);               // NULL desc: malloc, silent
 *     rkm_graph_read_file(ctx, "model.rkg", &g);    // or rkm_graph_create + add_*
 *     rkm_solve_desc sd = RKM_ZERO;                 // zero: the best algorithm built in
 *     if (rkm_plan_solve(g, &sd, budget_bytes, &plan) != RKM_OK)
 *         fprintf(stderr, "%s\n", rkm_context_errmsg(ctx));
 *     else
 *         rkm_plan_execute(plan, &callbacks);       // once per training step
 *     rkm_plan_destroy(plan); rkm_graph_destroy(g); rkm_context_destroy(ctx);
 *
 * CONVENTIONS
 *
 * - A zeroed desc means the defaults: RKM_ZERO zeroes a
 *   struct in C and in C++ alike (`rkm_callbacks cb = RKM_ZERO;`, then set
 *   the fields you use), where C's `= {0}` is an error in C++ for structs
 *   that start with an enum and C++'s `= {}` is not C11.
 * - Every fallible function returns an rkm_result. Every failing call made
 *   through a context writes a message there that names the object
 *   (file:line, step, op or tensor) and the rule that was broken:
 *   rkm_context_errmsg(). A failed call leaves its output pointer NULL, the
 *   struct it fills (stats, info, copy figures, capacity) zeroed, and
 *   nothing half-built. RKM_ERROR_INTERNAL is a bug in the library, never a
 *   consequence of the input; please report it with the message.
 * - No call crashes on a NULL pointer: one given a NULL object returns
 *   RKM_ERROR_ARGUMENT (a function without a result does nothing, a query
 *   answers 0, -1, NULL or RKM_ARENA_NONE, a stats call zeroes its output);
 *   a NULL output or input beside a valid object is RKM_ERROR_ARGUMENT with
 *   a message.
 * - Every allocation of the library's own goes through the context's
 *   allocator (Lua style: one function, user data, the old size on realloc
 *   and free). lp_solve's do not: it calls malloc and free itself. So the
 *   allocator sees everything in a RKM_OMIT_SOLVER build, and in a build
 *   with lp_solve in every call but planning with RKM_ALGO_ROCKMATE (block
 *   and whole-graph ILPs) or RKM_ALGO_CHECKMATE (the whole-graph ILP), and
 *   so RKM_ALGO_DEFAULT, which is rockmate there.
 * - The library never aborts and never prints; messages go to the optional
 *   logger.
 * - Objects have one owner and one destroy function. What an object was made
 *   from lives as long as it does, as sqlite3_close_v2 does: destroying a
 *   graph while plans, planners or arena execs made from it live, or a
 *   context while objects made with it live, only marks it destroyed; those
 *   objects keep working exactly as before (their failing calls still
 *   write the context's message and call its logger), and the graph or
 *   context is freed when the last of them is destroyed, in any order. The
 *   graph and context they reach (rkm_plan_graph, rkm_graph_context) stay
 *   usable meanwhile, to read the message or to make new objects, which
 *   hold them in turn. Destroying an object twice, or using it after it is
 *   freed, is undefined, as with free.
 * - Threads: a context is shared by everything made with it: every failing
 *   call on any of its graphs, plans, planners or executors writes the
 *   context's one message and calls its logger and allocator. So the objects
 *   made from one context, together with the context, are used from one
 *   thread at a time (two graphs of one context in two threads race). To
 *   work in several threads at once, give each thread its own context and
 *   make its objects from that context; objects of distinct contexts may be
 *   used in distinct threads at the same time. Their only shared state is
 *   lp_solve, whose calls are serialised by one internal lock; an allocator
 *   or logger given to several such contexts must itself be thread-safe.
 * - Ids are dense int32 indices: tensors 0..num_tensors-1 in declaration
 *   order, ops 0..num_ops-1 in declaration (topological) order.
 * - Output is deterministic: the same graph and options give the same plan,
 *   byte for byte, on every machine.
 *
 * OBJECT LIFETIMES (data flows one way)
 *
 *   context  owns the allocator, the logger and the message; mutable only
 *            through its message.
 *   graph    a builder until rkm_graph_finalize; from then on immutable,
 *            costs included: its gradients, block structure, classes and
 *            baseline figures are derived once, at finalize, from what was
 *            built. New costs (measured, profiled) make a new graph
 *            (rkm_graph_with_costs, rkm_graph_profile), which plans exactly
 *            as the same graph written to .rkg and read back.
 *   plan     born checked: every plan the library hands out (planner,
 *            baseline, reader, rkm_plan_create) has been simulated valid
 *            once, at birth, and keeps its figures (peak, time, per-step
 *            memory, the executor's annotations, the buffers' lifetimes).
 *            An invalid step list is refused with the rule it breaks. A
 *            plan never changes; every query is const and recomputes
 *            nothing.
 *   planner  holds what does not depend on the budget (block options, the
 *            DP table); each solve returns a new plan owned by the caller. It
 *            is the one object that changes after creation: its ILP
 *            counters grow, and its smallest budget is computed at the first
 *            rkm_planner_min_budget and kept.
 *
 * MEMORY AND TIME ACCOUNTING (see docs/formats.md, the contract)
 *
 * The live memory while a plan is replayed is
 *     sum(bytes of live tensors, inputs included)
 *   + sum(phantom of ops whose saved state is live)
 *   + sum(bytes of T for every live gradient grad(T))
 * and a step's peak adds what the step creates and its workspace. Budgets,
 * peaks and the baseline peak are all in this one unit, exact bytes. Time is
 * the sum of the ops' fwd/bwd seconds over the steps.
 *
 * Readings of the contract where it leaves room (each chosen to keep plans
 * correct):
 * - A budget counts the `input` tensors too: they are part of mem.
 * - A budget is the memory the host allocates for activations. A planned
 *   plan's budget bounds its arena: the one allocation of its layout, every
 *   buffer rounded up to the solve desc's alignment (rkm_solve_desc,
 *   rkm_plan_layout), which is at least its aligned peak, which is at least
 *   its peak (the contract's exact bytes). A read or hand-built plan and
 *   the baseline are made for no budget: their peak, aligned peak and
 *   arena (at 256 bytes) are reported; the CLI's `check --budget B` says
 *   whether the arena (at --align) fits B.
 * - For structure detection an op whose every `in` is an `input` tensor (or
 *   that has no `in` at all) is a "first op": inputs are live all the time,
 *   so they never separate blocks.
 * - A name list (in=, out=, saved=) may not name a tensor twice.
 * - A tensor may carry both `input` and `nograd` (nograd is then redundant).
 * - The loss tensor may not be an `input` (it must be produced by an op).
 * - A graph whose total bytes (2 x all tensors + all phantoms + the largest
 *   workspace) overflow 64 bits is rejected, so no sum can overflow.
 * - `fwd OP` without `save` on an op whose saved state is live is allowed:
 *   it recomputes outputs and leaves the saved state as it is.
 * - In place (`inplace`, `grad_inplace`; RKM_OP_INPLACE, RKM_OP_GRAD_INPLACE)
 *   says what an op's kernel can do; whether a run does is the plan's step
 *   (`fwd OP inplace`, `bwd OP inplace`), so a plan without such steps
 *   means what it meant before. The baseline and every planner's plan run
 *   in place exactly where the plain plan would free the input (or the
 *   output's gradient) right after without reading it again: one buffer
 *   fewer for a while, no step higher. The planners' own models (block
 *   ILPs, the chain DP's options, DTR) do not count in-place runs: they are
 *   conservative there, and the simulator's figures of the lowered plan are
 *   the ones reported and checked against the budget.
 * - An op's costs (times, workspaces) are part of the graph: finalize
 *   derives the block classes from them, so they are never changed on a
 *   finalized graph.
 *
 * PIPELINES
 *
 * A model cut into P stages on P devices, M micro-batches a step:
 *
 *     rkm_pipeline_desc pd = RKM_ZERO;
 *     pd.stages = 4; pd.micro_batches = 8; pd.budget = device_bytes;
 *     rkm_pipeline *pp;
 *     rkm_pipeline_plan(g, &pd, &pp);               // the cut, each stage's plan
 *     rkm_pipeline_stage(pp, rank, &info, &stage_graph, &stage_plan);
 *     // per micro-batch m, in the schedule's order (rkm_pipeline_simulate):
 *     rkm_plan_execute_phase(stage_plan, 0, m, &cb); // forward: then send the output
 *     rkm_plan_execute_phase(stage_plan, 1, m, &cb); // backward: the gradient arrived
 *
 * A stage graph's input is `input grad` (its gradient is left for the host
 * to send back), its output `output` (the loss step receives its gradient);
 * rkm_graph_cut makes them; rkm_plan_stage_layout gives each micro-batch in
 * flight its slot of the stage's arena. docs/formats.md, "Pipeline stages".
 *
 * COMPILE-TIME SWITCHES
 *
 *   RKM_OMIT_SOLVER  leave lp_solve out: RKM_ALGO_CHECKMATE returns
 *                    RKM_ERROR_UNSUPPORTED; RKM_ALGO_ROCKMATE (and
 *                    RKM_ALGO_DEFAULT, a zeroed solve desc, as in the full
 *                    build) is the same search without the block ILP's
 *                    options: a block's options are its two extremes, its
 *                    drop options (on chains of big blocks) and, for a big
 *                    block that nests, the nested planner's, and the
 *                    whole-graph ILP gives no candidate; rotor, sqrt,
 *                    dtr and none plan as in the full build; loading,
 *                    checking and executing plans is unaffected. No LGPL
 *                    code is linked.
 *
 *   RKM_USE_PTHREADS use pthreads for the one lock around lp_solve. By
 *                    default the lock is C11's <threads.h> where the C
 *                    library has it, and pthreads where it does not: where
 *                    __STDC_NO_THREADS__ is defined, or where the compiler
 *                    has __has_include (gcc 5, clang) and finds no
 *                    <threads.h> (macOS). Either way link with -pthread.
 *                    Without RKM_OMIT_SOLVER and without lp_solve's header,
 *                    such a compiler stops with an #error that says what to
 *                    install (Debian: liblpsolve55-dev libsuitesparse-dev).
 */
#ifndef ROCKMATE_H
#define ROCKMATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A zero initializer for any of the public structs, the same spelling in C
 * and C++: `rkm_solve_desc sd = RKM_ZERO;`. */
#ifdef __cplusplus
#define RKM_ZERO {}
#else
#define RKM_ZERO {0}
#endif

/* Versions and the ABI. The version here is the one source: the Makefile
 * reads RKM_VERSION_STRING for the shared library's file name
 * (librockmate.so.MAJOR.MINOR.PATCH) and its soname (librockmate.so.MAJOR),
 * and for rockmate.pc.
 * - A change to the ABI: a public struct's size or layout (a field added,
 *   removed, moved or retyped), a function's signature, an enum's values,
 *   bumps the minor while the major is 0 (0.x makes no binary promise
 *   across minors; the soname stays librockmate.so.0), and the major from
 *   1.0 on, which renames the soname. A fix that changes none of these
 *   bumps the patch.
 * - Descs are read with zero meaning "the default", so a field added at the
 *   end of a desc keeps source compatibility (code that zeroes its desc and
 *   sets the fields it knows still builds and means what it meant), but not
 *   binary compatibility: the library reads the new field past the end of
 *   an old program's desc. Rebuild against the new header.
 * - tests/test_abi.c pins every public struct's size and layout (LP64), so
 *   an ABI change cannot go in unnoticed.
 * 0.2.0: the public structs changed since 0.1.0 (rkm_step grew from 12 to
 * 16 bytes with inplace; descs gained fields; structs were added).
 * 0.3.0: the arena exec has one desc with a mode (rkm_arena_exec_desc.mode,
 * .plan) and one constructor; rkm_arena_layout became rkm_arena_capacity;
 * every stats getter returns an rkm_result; rkm_solve_desc gained a
 * progress callback (rkm_progress) and rkm_result RKM_ERROR_CANCELLED.
 * 0.4.0: offloading: the copy steps (rkm_step_kind, rkm_rule), the graph's
 * rkm_copy_desc, rkm_copy_call; rkm_sim_result, rkm_plan_stats and
 * rkm_callbacks gained fields at their ends.
 * 0.5.0: rkm_parse_budget takes the graph and the alignment (a percentage is
 * of the baseline's arena at that alignment, rkm_graph_baseline_arena, no
 * longer of the baseline peak: "100%" is the baseline, at no overhead);
 * rkm_graph_baseline_arena; RKM_ZERO. Not the ABI, but what files mean:
 * plan files are written as version 2 (their alignment, their graph's
 * fingerprint: docs/formats.md); version 1 files read as before, and an
 * older library refuses a version 2 file at its header.
 * 0.6.0: rkm_planner_stats gained work and work_limit at its end (each call's
 * work meter).
 * 0.7.0: pipeline stages: rkm_pipeline_simulate and its structs; stage
 * graphs (RKM_TENSOR_INPUT_GRAD, rkm_graph_set_output, rkm_graph_cut);
 * rkm_rule RKM_RULE_END_INPUT_GRAD_MISSING (RKM_RULE_COUNT moved); plan
 * phases (rkm_plan_phase_step, rkm_plan_execute_phase), and the call
 * structs gained `micro` at their ends. */
#define RKM_VERSION_MAJOR 0
#define RKM_VERSION_MINOR 7
#define RKM_VERSION_PATCH 0
#define RKM_VERSION_STRING "0.7.0"
#define RKM_VERSION_NUMBER (RKM_VERSION_MAJOR * 10000 + RKM_VERSION_MINOR * 100 + RKM_VERSION_PATCH)

/* The version of the compiled library, RKM_VERSION_STRING when the header
 * and the library agree, e.g. "0.6.0". */
const char *rkm_version(void);
int rkm_version_number(void);

/* ---------------------------------------------------------------------------
 * Results
 * ------------------------------------------------------------------------- */

typedef enum rkm_result {
    RKM_OK = 0,
    RKM_ERROR_NOMEM,       /* the allocator returned NULL, or the chain DP's tables would pass
                              the planner's cap of 1 GiB (the message gives the figure and
                              what to change; rockmate then plans without the chain DP) */
    RKM_ERROR_ARGUMENT,    /* a NULL pointer, an id out of range, a bad option */
    RKM_ERROR_STATE,       /* not allowed now (a builder call on a finalized graph...) */
    RKM_ERROR_IO,          /* a file could not be opened, read or written */
    RKM_ERROR_PARSE,       /* text that does not follow the file syntax */
    RKM_ERROR_GRAPH,       /* a graph that breaks a rule of the contract */
    RKM_ERROR_PLAN,        /* a plan that breaks a rule of the contract */
    RKM_ERROR_BUDGET,      /* no plan of the chosen algorithm fits the budget */
    RKM_ERROR_CALLBACK,    /* a host callback returned non-zero */
    RKM_ERROR_SOLVER,      /* lp_solve failed in a way that left no usable result */
    RKM_ERROR_TIMEOUT,     /* rkm_solve_desc.time_limit ran out before any plan was found */
    RKM_ERROR_UNSUPPORTED, /* compiled out (RKM_OMIT_SOLVER) */
    RKM_ERROR_INTERNAL,    /* a bug in the library: a check of its own results failed */
    RKM_ERROR_CANCELLED,   /* rkm_solve_desc.progress returned non-zero: the call stopped */
    RKM_RESULT_COUNT
} rkm_result;

/* A short constant description of a result code ("out of memory", ...). */
const char *rkm_result_string(rkm_result r);

/* ---------------------------------------------------------------------------
 * Context: allocator, logger, last error message
 * ------------------------------------------------------------------------- */

typedef struct rkm_context rkm_context;

/* One allocator for everything the library allocates (not lp_solve: see
 * CONVENTIONS), as in Lua: new_size == 0 frees `ptr` (whose
 * size was old_size) and returns NULL; otherwise it returns a block of
 * new_size bytes holding the first min(old, new) bytes of `ptr` (ptr may be
 * NULL, then old_size is 0), or NULL on failure, leaving ptr untouched. */
typedef void *(*rkm_alloc_fn)(void *user, void *ptr, size_t old_size, size_t new_size);

typedef enum rkm_log_level {
    RKM_LOG_ERROR = 1, /* every failed call, with its message */
    RKM_LOG_WARN = 2,  /* something degraded: an odd lp_solve status, a schedule that
                          failed its replay and was replaced by the fallback */
    RKM_LOG_INFO = 3,  /* planning progress: blocks, options, DP */
    RKM_LOG_DEBUG = 4  /* lp_solve's own messages, per-solve details */
} rkm_log_level;

typedef void (*rkm_log_fn)(void *user, rkm_log_level level, const char *message);

typedef struct rkm_context_desc {
    rkm_alloc_fn alloc; /* NULL: the C library's realloc/free */
    void *alloc_user;
    rkm_log_fn log;     /* NULL: silent */
    void *log_user;
    int log_level;      /* messages at or below this level are sent; 0: RKM_LOG_WARN */
} rkm_context_desc;

/* desc may be NULL (all defaults); a zeroed desc is the same. On failure *out
 * is NULL and there is no context to hold a message: RKM_ERROR_NOMEM, or
 * RKM_ERROR_ARGUMENT for a log_level outside 0..RKM_LOG_DEBUG. */
rkm_result rkm_context_create(const rkm_context_desc *desc, rkm_context **out);
/* Frees the context, or, while graphs or arenas made with it (or objects
 * made from those) live, marks it destroyed and frees it when the last of
 * them is destroyed (CONVENTIONS). */
void rkm_context_destroy(rkm_context *ctx);
/* The message of the most recent failed call made through this context; ""
 * before the first failure. A successful call leaves it as it is (read it
 * only after a call has failed): every failing call writes its own message
 * first, so the message always belongs to the latest failure. A call given a
 * NULL object has no context to write to: it returns RKM_ERROR_ARGUMENT and
 * leaves the message alone. */
const char *rkm_context_errmsg(const rkm_context *ctx);

/* For code built on the library (cuda/ uses them): allocate through the
 * context's allocator (the rkm_alloc_fn convention), and fail through its
 * message channel: rkm_context_fail formats the message, logs it at
 * RKM_LOG_ERROR and returns code. */
void *rkm_context_realloc(rkm_context *ctx, void *ptr, size_t old_size, size_t new_size);
rkm_result rkm_context_fail(rkm_context *ctx, rkm_result code, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---------------------------------------------------------------------------
 * Graph: build through the API or read a .rkg file, then finalize
 * ------------------------------------------------------------------------- */

typedef struct rkm_graph rkm_graph;

#define RKM_TENSOR_INPUT 1u  /* given by the host, live all the time, no gradient */
#define RKM_TENSOR_NOGRAD 2u /* never has a gradient (indices, masks) */
/* With RKM_TENSOR_INPUT: a pipeline stage's input (the .rkg words `input
 * grad`), received from the previous stage. Live all the time like any
 * input, but it has a gradient, made by the backwards of the ops that read
 * it (at least one must have a backward): at the end of the plan that
 * gradient is live and complete, and the host sends it back to the
 * previous stage and releases it after rkm_plan_execute returns (it is in
 * the plan's memory and arena to the end, as the inputs are). Planners plan
 * such a graph as if the tensor were a plain input and keep the plans
 * whose replay here (with the gradient) fits the budget. */
#define RKM_TENSOR_INPUT_GRAD 4u

typedef struct rkm_op_desc {
    const char *name;
    double fwd_seconds;
    double bwd_seconds;
    const int32_t *in;   /* tensor ids it reads (activations only; never parameters) */
    int32_t n_in;
    const int32_t *out;  /* tensor ids it writes; at least one */
    int32_t n_out;
    const int32_t *saved; /* tensors among in and out that the backward reads */
    int32_t n_saved;
    uint64_t phantom;    /* bytes kept for the backward only, when run with save */
    uint64_t fwd_ws;     /* transient workspace during the forward call */
    uint64_t bwd_ws;     /* transient workspace during the backward call */
    /* The part of the phantom (<= phantom) that the forward writes on every
     * run, save or not: normalisation statistics (layernorm's mean/rstd),
     * attention probabilities. A run without save needs it as transient
     * workspace (counted in the step's peak, gone after the call, handed to
     * the host in rkm_fwd_call.ws_bytes); a run with save keeps it as part
     * of the phantom; a run while the saved state is live writes it there. */
    uint64_t scratch;
    unsigned flags;      /* RKM_OP_INPLACE, RKM_OP_GRAD_INPLACE */
} rkm_op_desc;

/* In-place kernels (rkm_op_desc.flags; the .rkg words `inplace` and
 * `grad_inplace`). Both concern the op's first input and first output,
 * which must have the same size. They say what the host's kernel CAN do; a
 * plan step says whether a run does (`fwd OP inplace`, `bwd OP inplace`):
 * - RKM_OP_INPLACE: the forward can write out[0] over in[0] (ReLU, GELU,
 *   `x += y`). A run in place needs no new bytes for out[0]: it takes in[0]'s
 *   buffer, and in[0] is gone after it (in[0] may not be an `input`).
 * - RKM_OP_GRAD_INPLACE: the backward can write grad(in[0]) over grad(out[0])
 *   (GELU's backward in llm.c; a residual add, whose gradient passes
 *   through). A run in place makes grad(in[0]) (its first contribution) in
 *   grad(out[0])'s buffer, which is gone after it. Along a residual chain of
 *   such ops the gradient stays in one buffer: llm.c's `dresidual`. Both
 *   tensors must have a gradient.
 * The planners run an op in place wherever the plan would otherwise free
 * the input (gradient) right after without reading it again; the baseline
 * does the same, as the plain step of such a host would. */
#define RKM_OP_INPLACE 1u
#define RKM_OP_GRAD_INPLACE 2u

rkm_result rkm_graph_create(rkm_context *ctx, rkm_graph **out);
/* Frees the graph, or, while plans, planners or arena execs made from it
 * live, marks it destroyed and frees it when the last of them is
 * destroyed (CONVENTIONS). */
void rkm_graph_destroy(rkm_graph *g);

/* Builder calls, in file order: tensors are declared before use, ops in a
 * topological order, the loss last. Each call checks the rules it can and
 * leaves the graph unchanged on failure. */
rkm_result rkm_graph_add_tensor(rkm_graph *g, const char *name, uint64_t bytes, unsigned flags,
                                int32_t *id);
rkm_result rkm_graph_add_op(rkm_graph *g, const rkm_op_desc *desc, int32_t *id);
rkm_result rkm_graph_set_loss(rkm_graph *g, int32_t tensor);
/* A pipeline stage's output (the .rkg statement `output T`), in place of
 * the loss: the same rules, and in plans it plays the loss's part (the
 * `loss` step, rkm_graph_loss), but its gradient is not seeded by the
 * host: it arrives from the next stage. The step before the `loss` step
 * ends the stage's forward phase (the output is sent), the `loss` step
 * receives grad(T) (rkm_callbacks.loss: allocate it and receive it). */
rkm_result rkm_graph_set_output(rkm_graph *g, int32_t tensor);
/* Checks the whole-graph rules, derives gradients, backwards and
 * contributors, detects the block structure and its classes, and computes
 * the baseline figures. After it the graph is immutable. */
rkm_result rkm_graph_finalize(rkm_graph *g);

/* Read a .rkg file (or text) into a finalized graph. Errors name
 * source:line and the rule. source_name is used in messages only. */
rkm_result rkm_graph_read_file(rkm_context *ctx, const char *path, rkm_graph **out);
rkm_result rkm_graph_read_string(rkm_context *ctx, const char *text, size_t len,
                                 const char *source_name, rkm_graph **out);

/* Output sink: return 0 on success, non-zero to stop with RKM_ERROR_IO. */
typedef int (*rkm_write_fn)(void *user, const char *data, size_t len);

/* Write a finalized graph as .rkg text; it reads back identical. */
rkm_result rkm_graph_write(const rkm_graph *g, rkm_write_fn write, void *user);
rkm_result rkm_graph_write_file(const rkm_graph *g, const char *path);

/* An op's costs: what profiling measures. */
typedef struct rkm_op_costs {
    double fwd_seconds, bwd_seconds;
    uint64_t fwd_ws, bwd_ws;
} rkm_op_costs;

/* A new finalized graph: g (finalized) with op i's costs replaced by
 * costs[i], for every op (num_ops entries). Everything finalize derives is
 * derived again from the new costs, so the new graph plans exactly as its
 * .rkg file read back would. g is unchanged. */
rkm_result rkm_graph_with_costs(const rkm_graph *g, const rkm_op_costs *costs, rkm_graph **out);

/* Copies between the device and host memory (offloading; docs/formats.md,
 * "Offloading"). A copy of B bytes takes latency + B / bandwidth seconds
 * on its own stream, one for each direction, beside the compute stream. A
 * graph without them (all zero, the default) has no copies: its plans
 * keep or recompute, exactly as before copies existed. */
typedef struct rkm_copy_desc {
    double d2h_bytes_per_second; /* device to host (offload); > 0, or 0 with h2d 0: none */
    double h2d_bytes_per_second; /* host to device (prefetch) */
    double latency_seconds;      /* per copy, >= 0 */
} rkm_copy_desc;
/* Builder call, before finalize (the .rkg statement `copy`); NULL or all
 * zero clears it. Both bandwidths are positive and finite, or both 0. */
rkm_result rkm_graph_set_copy(rkm_graph *g, const rkm_copy_desc *copy);
/* The graph's copy figures (all zero: none). */
rkm_result rkm_graph_copy_get(const rkm_graph *g, rkm_copy_desc *out);
/* A new finalized graph: g (finalized) with these copy figures (NULL: none),
 * everything else as in g. g is unchanged. */
rkm_result rkm_graph_with_copy(const rkm_graph *g, const rkm_copy_desc *copy, rkm_graph **out);

rkm_context *rkm_graph_context(const rkm_graph *g);
int rkm_graph_is_finalized(const rkm_graph *g);
int32_t rkm_graph_num_tensors(const rkm_graph *g);
int32_t rkm_graph_num_ops(const rkm_graph *g);
int32_t rkm_graph_loss(const rkm_graph *g); /* -1 before set_loss or set_output */
int32_t rkm_graph_output(const rkm_graph *g); /* the stage's output; -1 if none (a loss, or not yet) */
int32_t rkm_graph_find_tensor(const rkm_graph *g, const char *name); /* -1 if none */
int32_t rkm_graph_find_op(const rkm_graph *g, const char *name);     /* -1 if none */

typedef struct rkm_tensor_info {
    const char *name;
    uint64_t bytes;
    unsigned flags;          /* RKM_TENSOR_INPUT | RKM_TENSOR_NOGRAD | RKM_TENSOR_INPUT_GRAD */
    int32_t producer;        /* op id, -1 for inputs */
    int has_grad;            /* after finalize */
    int32_t n_contributors;  /* backwards (and the loss step) that add to grad(T) */
} rkm_tensor_info;

/* Pointers inside the filled structs stay valid while the graph lives.
 * rkm_graph_op_info gives the op as it was added (the desc of
 * rkm_graph_add_op). An op has a backward when one of its outputs has a
 * gradient (rkm_tensor_info.has_grad). */
rkm_result rkm_graph_tensor_info(const rkm_graph *g, int32_t tensor, rkm_tensor_info *out);
rkm_result rkm_graph_op_info(const rkm_graph *g, int32_t op, rkm_op_desc *out);

/* Figures of a finalized graph, computed once by finalize. */
typedef struct rkm_graph_stats {
    uint64_t input_bytes;   /* bytes of the input tensors: in every step's memory */
    uint64_t baseline_peak; /* the baseline plan's peak */
    double baseline_time;   /* the baseline plan's time */
    uint64_t lower_bound;   /* no valid plan can peak below this (largest single step) */
    int32_t blocks;         /* blocks of the sequence */
    int32_t block_classes;  /* classes of blocks (rkm_block_info.class_id) */
} rkm_graph_stats;
rkm_result rkm_graph_stats_get(const rkm_graph *g, rkm_graph_stats *out);

/* The arena of the graph's baseline plan (rkm_plan_baseline) laid out at
 * `alignment` (a power of two; 0: 256, as rkm_solve_desc.alignment): the one
 * allocation of the plain "store all" step at that alignment, at least its
 * aligned peak, which is at least baseline_peak. It is the 100 % of a
 * percent budget (rkm_parse_budget, the CLI, the examples): a budget of it
 * plans with algorithm none, and every algorithm but sqrt (a fixed
 * schedule, which recomputes at any budget it meets) meets it with no
 * overhead. RKM_ERROR_GRAPH where the buffers rounded up pass 64 bits. */
rkm_result rkm_graph_baseline_arena(const rkm_graph *g, uint64_t alignment, uint64_t *out);

/* A lower bound on the extra compute (seconds over the baseline time) of
 * every valid plan whose peak is at most `budget`, whatever made it. At the
 * loss step no backward has run yet, and every tensor a backward reads and
 * every phantom it needs is either live or made again later by another
 * forward of its op; so the ops whose state does not fit in what the loss
 * step leaves of the budget run their forward at least twice. The bound is
 * the least forward time of such ops (a knapsack over the ops, bytes
 * rounded in the bound's favour). 0 from the baseline peak up, and on a
 * graph with a copy link (such state may wait in host memory instead);
 * RKM_ERROR_BUDGET below the lower bound (no plan at all). */
rkm_result rkm_graph_time_bound(const rkm_graph *g, uint64_t budget, double *extra_seconds);

/* Pipeline stages: g (finalized) cut at n_cuts tensors into n_cuts + 1
 * stage graphs, stages[0..n_cuts] (finalized, owned by the caller). Each
 * cut is a block boundary (rkm_block_info.input), in block order: every
 * path from the first ops to the loss passes through it, so the ops
 * before it in file order are its ancestors and the ops after it its
 * descendants, and nothing but it and `input` tensors crosses it. Stage s
 * holds the ops after cut s-1 up to and including the producer of cut s,
 * in g's order, with g's names: cut s-1 is its input (`input grad`),
 * cut s its output (`output`); the last stage ends at g's loss. The
 * `input` tensors a stage's ops read are inputs there too (each stage
 * holds its own); the copy link is g's. An op that declares `inplace`
 * over a cut (its in[0]) loses it in its stage: an input is never
 * overwritten. The stages' steps, run one after
 * another (the forward phases from the first stage on, then the backward
 * phases from the last), are g's: the same ops on the same values, and
 * grad(cut s) handed from stage s+1, complete, to stage s's `loss` step.
 * On failure every stages[s] is NULL. */
rkm_result rkm_graph_cut(const rkm_graph *g, const int32_t *cuts, int32_t n_cuts, rkm_graph **stages);

/* The block structure (computed by finalize): a sequence of blocks, each a
 * run of ops between two separator tensors. */
typedef struct rkm_block_info {
    const int32_t *ops;  /* op ids, in topological order */
    int32_t n_ops;
    int32_t input;       /* separator tensor entering the block, -1 for the first */
    int32_t output;      /* separator leaving it; the loss tensor for the last */
    int32_t class_id;    /* blocks with the same class_id have the same structure, sizes and
                            flags, and op times within a tolerance: they share ILP schedules */
} rkm_block_info;
rkm_result rkm_graph_block_info(const rkm_graph *g, int32_t block, rkm_block_info *out);

/* ---------------------------------------------------------------------------
 * Plans: steps, files, the simulator, the baseline
 * ------------------------------------------------------------------------- */

typedef struct rkm_plan rkm_plan;

typedef enum rkm_step_kind {
    RKM_STEP_FWD = 0,    /* index: op; save: 0 or 1 */
    RKM_STEP_LOSS,       /* index: the loss tensor */
    RKM_STEP_BWD,        /* index: op */
    RKM_STEP_FREE,       /* index: tensor */
    RKM_STEP_FREE_SAVED, /* index: op */
    RKM_STEP_FREE_GRAD,  /* index: tensor */
    /* Copies to and from host memory (graphs with a copy bandwidth,
     * rkm_graph_set_copy; docs/formats.md, "Offloading"): */
    RKM_STEP_OFFLOAD,    /* index: tensor; start copying it to a new host copy */
    RKM_STEP_PREFETCH,   /* index: tensor; start copying its host copy back into
                            a new device buffer */
    RKM_STEP_WAIT,       /* index: tensor; the compute stream waits for its copy */
    RKM_STEP_FREE_HOST   /* index: tensor; release its host copy. On these four,
                            save 1 means an op's saved state instead (index: the op;
                            `offload OP saved`) */
} rkm_step_kind;

typedef struct rkm_step {
    int32_t kind;  /* rkm_step_kind */
    int32_t index; /* op or tensor id, see rkm_step_kind */
    int32_t save;  /* RKM_STEP_FWD: 1 for `fwd OP save`; a copy step: 1 for the op's
                      saved state (`offload OP saved`) */
    int32_t inplace; /* RKM_STEP_FWD, RKM_STEP_BWD: 1 for `fwd OP [save] inplace`,
                        `bwd OP inplace` (the op declares RKM_OP_INPLACE /
                        RKM_OP_GRAD_INPLACE); 0 otherwise */
} rkm_step;

/* The rule a plan broke, as the simulator names it. */
typedef enum rkm_rule {
    RKM_RULE_NONE = 0,
    RKM_RULE_FWD_INPUT_MISSING,     /* fwd: an `in` tensor is not live */
    RKM_RULE_SAVE_NOT_ALLOWED,      /* fwd save: phantom is 0 or the op has no backward */
    RKM_RULE_SAVE_ALREADY_LIVE,     /* fwd save: the op's saved state is already live */
    RKM_RULE_LOSS_TENSOR_MISSING,   /* loss: the loss tensor is not live */
    RKM_RULE_LOSS_TWICE,            /* loss: already ran */
    RKM_RULE_BWD_NO_BACKWARD,       /* bwd: the op has no backward */
    RKM_RULE_BWD_TWICE,             /* bwd: already ran */
    RKM_RULE_BWD_SAVED_MISSING,     /* bwd: a saved tensor is not live */
    RKM_RULE_BWD_PHANTOM_MISSING,   /* bwd: phantom > 0 and the saved state is not live */
    RKM_RULE_BWD_GRAD_MISSING,      /* bwd: an output's gradient is not live */
    RKM_RULE_BWD_GRAD_INCOMPLETE,   /* bwd: an output's gradient lacks a contribution */
    RKM_RULE_FREE_NOT_LIVE,         /* free: the tensor is not live */
    RKM_RULE_FREE_INPUT,            /* free: the tensor is an input */
    RKM_RULE_FREE_SAVED_NOT_LIVE,   /* free_saved: the saved state is not live */
    RKM_RULE_FREE_GRAD_NOT_LIVE,    /* free_grad: the gradient is not live */
    RKM_RULE_FREE_GRAD_INCOMPLETE,  /* free_grad: the gradient lacks a contribution */
    RKM_RULE_END_LOSS_MISSING,      /* end: loss never ran */
    RKM_RULE_END_BWD_MISSING,       /* end: an op's backward never ran */
    RKM_RULE_END_TENSOR_LIVE,       /* end: a non-input tensor is still live */
    RKM_RULE_END_SAVED_LIVE,        /* end: a saved state is still live */
    RKM_RULE_END_GRAD_LIVE,         /* end: a gradient is still live */
    RKM_RULE_BAD_STEP,              /* a step kind or index out of range */
    RKM_RULE_INPLACE_NOT_DECLARED,  /* fwd/bwd inplace: the op does not declare it */
    RKM_RULE_INPLACE_OUT_LIVE,      /* fwd inplace: out[0] is live already */
    RKM_RULE_INPLACE_GRAD_LIVE,     /* bwd inplace: grad(in[0]) is live already */
    RKM_RULE_COPY_NO_BANDWIDTH,     /* offload, prefetch: the graph has no copy bandwidth */
    RKM_RULE_OFFLOAD_NOT_LIVE,      /* offload: the tensor is not live, or is an input */
    RKM_RULE_OFFLOAD_ON_HOST,       /* offload: the tensor has a host copy already */
    RKM_RULE_PREFETCH_NOT_ON_HOST,  /* prefetch: the tensor has no host copy */
    RKM_RULE_PREFETCH_LIVE,         /* prefetch: the tensor is live already */
    RKM_RULE_WAIT_NO_COPY,          /* wait: the tensor has no copy in flight */
    RKM_RULE_COPY_IN_FLIGHT,        /* a step reads a tensor being prefetched, or writes or
                                       frees one (or its host copy) with a copy in flight */
    RKM_RULE_FREE_HOST_NOT_ON_HOST, /* free_host: the tensor has no host copy */
    RKM_RULE_END_COPY_IN_FLIGHT,    /* end: a copy was never waited for */
    RKM_RULE_END_HOST_LIVE,         /* end: a host copy is still live */
    RKM_RULE_END_INPUT_GRAD_MISSING,/* end: a stage input's gradient (RKM_TENSOR_INPUT_GRAD)
                                       is not live and complete: it is sent back */
    RKM_RULE_COUNT
} rkm_rule;

/* A short constant description of a rule. */
const char *rkm_rule_string(rkm_rule rule);

typedef struct rkm_sim_result {
    int valid;          /* 1 if every rule holds */
    rkm_rule rule;      /* the first broken rule */
    int64_t fail_step;  /* its step index; num_steps for end-of-plan rules; -1 if valid */
    int32_t fail_object;/* the op or tensor concerned, -1 if none; for the copy rules
                           (RKM_RULE_COPY_NO_BANDWIDTH..RKM_RULE_END_HOST_LIVE) a copy
                           slot: the tensor, or num_tensors + the op for its saved state */
    rkm_step failed;    /* the step at fail_step, as given (zeros for end-of-plan rules) */
    uint64_t peak;      /* max over the steps replayed of the step's peak */
    int64_t peak_step;  /* the first step that reaches the peak */
    double time;        /* sum of fwd/bwd seconds of the steps replayed, plus the
                           compute stream's waits for copies (wait_seconds) */
    size_t num_steps;   /* steps in the step list (all of them, valid or not) */
    size_t recomputes;  /* fwd steps (all of them) of an op whose fwd came earlier */
    uint64_t host_peak; /* the most bytes of host copies live at once (0 without copies) */
    double wait_seconds;/* the part of time the compute stream waited for copies */
} rkm_sim_result;

/* A step as a plan file spells it ("fwd h0.attn save"), NUL-terminated and
 * cut to fit size bytes; "<kind K index I>" for a step out of range. */
void rkm_step_text(const rkm_graph *g, const rkm_step *s, char *buf, size_t size);

/* A plan is born checked: each function below replays the steps against
 * the graph once and hands out the plan only if every rule of the contract
 * holds. Otherwise it returns RKM_ERROR_PLAN with the message naming the step
 * and the rule, *out NULL, and *res (when given) filled up to the failure.
 * On success *res (when given) has the plan's figures. */

/* A plan of a finalized graph from a step list (copied): hand-built plans. */
rkm_result rkm_plan_create(const rkm_graph *g, const rkm_step *steps, size_t num_steps, rkm_sim_result *res,
                           rkm_plan **out);
/* Read .rkp text: syntax and names (RKM_ERROR_PARSE with source:line), then
 * the rules as above. A version 2 file (what rkm_plan_write writes) also
 * names the plan's alignment, at which the plan read is laid out
 * (rkm_plan_stats.alignment), and fingerprints the graph the plan was made
 * for: against a graph that differs in what the simulator reads (tensor
 * sizes and flags, op costs, structure, the copy link; names play no part)
 * it is refused, RKM_ERROR_PARSE naming the line and the first difference
 * (the tensor or op, where one differs). A version 1 file (steps only)
 * reads as it always did: laid out at 256, no check of the graph
 * (docs/formats.md, "Plan file"). */
rkm_result rkm_plan_read_file(const rkm_graph *g, const char *path, rkm_sim_result *res, rkm_plan **out);
rkm_result rkm_plan_read_string(const rkm_graph *g, const char *text, size_t len, const char *source_name,
                                rkm_sim_result *res, rkm_plan **out);
/* The "store all" plan of the contract. */
rkm_result rkm_plan_baseline(const rkm_graph *g, rkm_plan **out);
void rkm_plan_destroy(rkm_plan *p);

/* A version 2 .rkp file: header, alignment, the graph's fingerprint, steps. */
rkm_result rkm_plan_write(const rkm_plan *p, rkm_write_fn write, void *user);
rkm_result rkm_plan_write_file(const rkm_plan *p, const char *path);

const rkm_graph *rkm_plan_graph(const rkm_plan *p);
size_t rkm_plan_num_steps(const rkm_plan *p);
const rkm_step *rkm_plan_steps(const rkm_plan *p);
/* Per step (num_steps entries, owned by the plan): the live memory after
 * the step, and the contract's peak during it (whose maximum is the plan's
 * peak). */
const uint64_t *rkm_plan_mem_after(const rkm_plan *p);
const uint64_t *rkm_plan_step_peaks(const rkm_plan *p);

/* ---------------------------------------------------------------------------
 * Memory layout: one arena, an offset for every buffer
 * ------------------------------------------------------------------------- */

typedef enum rkm_buffer_kind {
    RKM_BUFFER_TENSOR = 0, /* index: tensor (input tensors: created at step -1) */
    RKM_BUFFER_PHANTOM,    /* index: op, from `fwd OP save` to `free_saved OP` */
    RKM_BUFFER_GRAD,       /* index: tensor whose gradient it holds */
    RKM_BUFFER_WORKSPACE   /* index: op; lives during its one step */
} rkm_buffer_kind;

typedef struct rkm_buffer {
    int32_t kind;        /* rkm_buffer_kind */
    int32_t index;       /* tensor or op, see rkm_buffer_kind */
    int64_t first_step;  /* the step that creates it (-1 for inputs) */
    int64_t last_step;   /* the step that releases it (its own step for a workspace;
                            num_steps for inputs, which are never released) */
    uint64_t bytes;
    uint64_t offset;     /* in the arena; a multiple of the alignment */
    int64_t takes_over;  /* -1; or, for the buffer an in-place step makes (out[0],
                            grad(in[0])), the index in this list of the buffer
                            whose bytes it takes over (in[0], grad(out[0])),
                            released by that same step: same bytes, same offset */
} rkm_buffer;

/* The buffers a plan creates, known exactly from its replay at birth. */
size_t rkm_plan_num_buffers(const rkm_plan *p);

/* Every buffer of the plan in one arena: lifetimes are known exactly, so
 * buffers whose lifetimes overlap never share a byte and a host can make
 * one allocation and never fragment. buffers receives
 * rkm_plan_num_buffers(p) entries in creation order; within a step: a
 * forward's new outputs (in out order), its phantom, its workspace (with
 * the op's scratch when the run keeps no saved state); a backward's new
 * input gradients (in order), its workspace; the loss step's grad(loss).
 * Offsets are multiples of the alignment; buffers an in-place step chains
 * (takes_over) share one offset.
 *
 * Every plan is laid out once, at its birth, at its own alignment
 * (rkm_plan_stats.alignment): `alignment` 0 or that one copies that layout
 * and *arena_bytes is rkm_plan_stats.arena_bytes. Any other power of two
 * lays the plan out anew into the caller's array (the plan is not
 * changed). The arena is never below the aligned peak (the most aligned
 * bytes live in one step, which no layout can beat) and reaches it on most
 * plans: the placer (src/layout.c) tries an O(n log n) skyline,
 * then, where that misses, a bounded search whose work is counted in units,
 * not seconds, so that the same plan gets the same offsets on every
 * machine. */
rkm_result rkm_plan_layout(const rkm_plan *p, uint64_t alignment, rkm_buffer *buffers, uint64_t *arena_bytes);

/* ---------------------------------------------------------------------------
 * Planning
 * ------------------------------------------------------------------------- */

typedef enum rkm_algo {
    RKM_ALGO_DEFAULT = 0,  /* rockmate, in either build */
    RKM_ALGO_ROCKMATE,     /* blocks, ILP (and nested) options per block class, chain DP,
                              and the best of that, sqrt, DTR and the whole-graph ILP;
                              under RKM_OMIT_SOLVER the same without either ILP. On a
                              graph with a copy link (rkm_graph_set_copy) it also
                              offloads to host memory where that is faster (copies
                              added to its own plans, DTR's plans with copies, the
                              chain DP with each segment's input in host memory,
                              then a search that trades the fastest plan's
                              recomputations for copies); so do DTR and checkmate;
                              the other algorithms never do */
    RKM_ALGO_ROTOR,        /* chain DP with two options per block */
    RKM_ALGO_SQRT,         /* Chen et al.: checkpoint about every sqrt(n)-th block */
    RKM_ALGO_CHECKMATE,    /* the ILP on the whole graph (small graphs); needs lp_solve.
                              With a copy link, also the ILP with copies (each tensor
                              or saved state a later stage needs may wait in host
                              memory, offloaded in the forward, prefetched for a
                              stage; the compute stream's waits priced in), the
                              offload pass placing its copies; the faster plan kept,
                              and its smallest budget may be below the recompute-only
                              one. Its time limit goes to each of the two solves */
    RKM_ALGO_NONE,         /* the baseline plan */
    RKM_ALGO_DTR,          /* DTR (Kirisame et al.) simulated offline: any graph, any budget it
                              meets. With a copy link, an eviction may send a tensor or
                              saved state to host memory instead (its copy started at
                              its write and done by then, its prefetch back cheaper than
                              recomputing it), the faster of that and recompute-only
                              kept */
    RKM_ALGO_FULL,         /* every block recomputed before its backward from its input,
                              which the forward keeps (Megatron-LM's full
                              recomputation); a fixed schedule, as sqrt */
    RKM_ALGO_COUNT
} rkm_algo;

const char *rkm_algo_name(rkm_algo algo); /* "default", "rockmate", ... */
/* *out set from a name of rkm_algo_name, or RKM_ERROR_ARGUMENT with a
 * message in ctx listing the names. */
rkm_result rkm_algo_from_name(rkm_context *ctx, const char *name, rkm_algo *out);

typedef struct rkm_progress rkm_progress; /* below */

/* Zero means default for every field; negative, NaN or infinite values are
 * refused (RKM_ERROR_ARGUMENT naming the field), but for nest_ops, where
 * any negative value means never. */
typedef struct rkm_solve_desc {
    rkm_algo algo;
    int32_t slots;           /* DP memory slots over the baseline peak; 0: 1000 */
    /* Wall-clock seconds for planning one plan; 0: 60 (there is no "no
     * limit": a large value is one). rkm_planner_create runs within it, and
     * each rkm_planner_solve or rkm_planner_min_budget call within what the
     * creation left of it (the limit minus create_seconds), so that
     * rkm_plan_solve as a whole does. It is a safety stop checked between
     * the search's candidates, moves and probes, never inside one, and
     * every call makes its first candidate (rockmate and rotor: the chain
     * DP's plan, from at least its first 256 slots; DTR: one run;
     * checkmate: one solve, stopped at the limit). So a call overruns the
     * limit by the unit of work in progress and its finish, above all the
     * layout of the plan it hands out (bounded in work, not time;
     * bench/bench_timeout measures the overrun, bench/RESULTS.md has the
     * figures). A call the limit cuts
     * returns the best plan found by then, flagged (rkm_plan_stats.cut,
     * rkm_planner_stats.cut), or RKM_ERROR_TIMEOUT where it found none; a
     * cut plan may differ from run to run. Plans the limit does not cut
     * are the same on every machine, as if there were none: every call is
     * bounded by its work meter (rkm_planner_stats.work_limit; within it
     * ilp_time_limit and ilp_budget), not by the clock, and one that spends
     * it ends with its best plan or RKM_ERROR_BUDGET, uncut. Checkmate also
     * spends time_limit as work: half of it a solve (a
     * 24th a probe of its smallest budget), measured like ilp_time_limit;
     * with a copy link as much again for the ILP with copies. */
    double time_limit;
    /* Seconds per ILP solve; 0: 0.03. Enforced as a deterministic amount of
     * solver work calibrated to about that time on a current core, so that
     * plans do not depend on the machine's speed or load (a sanitized
     * build plans as any other); only time_limit stops a solve sooner. */
    double ilp_time_limit;
    int32_t ilp_peak_points; /* peak budgets per block class; 0: 5 */
    /* Kept budgets per peak budget; 0: 10. A class whose first solve to
     * find a schedule reaches ilp_time_limit gets 60 % of them (rounded up),
     * each solve twice the work. */
    int32_t ilp_kept_points;
    /* Nesting (rockmate): a block of more ops than this whose ops, with its
     * input held, cut into a chain of smaller blocks (a U-Net's levels) is
     * also planned as a graph of its own, and that nested planner's plans
     * become the block's options. Such a block gets the block ILP too
     * only where it is small for the graph's size (24 ops on graphs of up
     * to 488 ops and tensors, more on larger ones: docs/design.md,
     * "Effort"), so by default nested blocks have only the nested options
     * and a smaller nest_ops gives the smaller nested blocks both. 0: 24;
     * negative: never. */
    int32_t nest_ops;
    /* Seconds of block ILP work for the whole planner (nested planners
     * included), measured like ilp_time_limit; 0: 2. Each class of blocks
     * gets what is left times its weight (its blocks' forward time times
     * their ops) over that of the classes still to come, so a class that
     * needs less leaves more to the next; solves beyond it are left out
     * (rkm_planner_stats.ilp_skipped). */
    double ilp_budget;
    /* The alignment of the host's buffers (a power of two; 0: 256, what
     * RKM_ARENA_ALIGN and cudaMalloc give). The budget bounds the plan's
     * arena at this alignment: the planners count every buffer rounded up
     * to it, and a plan is returned only if its own layout
     * (rkm_plan_layout with alignment 0) fits the budget. 1: exact bytes,
     * as the contract counts them. */
    uint64_t alignment;
    /* Progress and cancellation (NULL: none; zeroed descs of older code
     * stay valid): see rkm_progress below. */
    int (*progress)(void *user, const rkm_progress *p);
    void *progress_user;
    /* A pipeline stage's plan (rkm_plan_stage_memory): the most
     * micro-batches its device holds between their two phases (1F1B's
     * min(stages - stage, micro-batches), GPipe's micro-batches). The
     * budget then bounds the stage's arena, in_flight slots and the
     * transient region (rkm_plan_stats.stage_arena_bytes), and its peak
     * with them in flight (stage_peak). 0: 1, a plain step. Above 1 the
     * graph may have no copy link (RKM_ERROR_UNSUPPORTED: offloading in a
     * pipeline stage is not planned). */
    int32_t in_flight;
} rkm_solve_desc;

/* What a planner call is doing, for rkm_solve_desc.progress.
 *
 * Planning a large graph can take seconds, so a host
 * may want to show how far a call is, and to stop it. Every call that
 * plans (rkm_planner_create, rkm_planner_solve, rkm_planner_min_budget, so
 * rkm_plan_solve) reports once as it starts (fraction 0), then from the
 * checks of time_limit (between candidates, moves and probes, and inside
 * the whole-graph ILP's solve) at most every 0.1 s of wall clock; the
 * chain DP (rkm_planner_create of rockmate and rotor, bounded) and a
 * plan's layout run without reports.
 * Reporting changes no plan: a callback that returns 0 leaves every plan
 * byte for byte what it is without one (it costs one call per report).
 *
 * Returning non-zero cancels the call: it stops at the next check, as one
 * that time_limit cut would, and returns RKM_ERROR_CANCELLED with a message
 * naming the stage and how far it was; no plan is handed out (*out NULL),
 * a cancelled rkm_planner_create makes no planner, and a planner whose
 * solve or min_budget was cancelled plans on as if that call had never
 * been made (the next call finds the same plans; a cancelled call is not
 * counted in rkm_planner_stats.cut). The callback runs inside the call,
 * for the whole-graph ILP while lp_solve's one lock is held: it must not
 * call the library's planners, and should return quickly. */
typedef enum rkm_stage {
    RKM_STAGE_CREATE = 1,  /* rkm_planner_create: block options (block ILPs, nested
                              planners), the chain DP */
    RKM_STAGE_SOLVE,       /* rkm_planner_solve: the search for one budget */
    RKM_STAGE_MIN_BUDGET   /* rkm_planner_min_budget: the smallest-budget search */
} rkm_stage;

struct rkm_progress {
    rkm_stage stage;
    rkm_algo algo;          /* the planner's, never RKM_ALGO_DEFAULT */
    const char *stage_name; /* "create", "solve" or "min_budget" (constant) */
    /* How much of this call's work is done, in [0, 1], never less than in
     * the call's previous report: the larger of the work meters' (block
     * ILP budget by class, the search's work, the ILP solve's, the
     * bisection's probes) and the share of time_limit spent. An estimate:
     * a call may end well before 1 (a search that converged early). */
    double fraction;
    /* The simulated time of the fastest plan the call found so far within
     * its budget (its peak, counted at the alignment), 0 if none yet, and
     * always 0 but in solves; with baseline_time, the overhead so far. */
    double best_time;
    double baseline_time;   /* the graph's, for best_time / baseline_time - 1 */
    uint64_t budget;        /* solve: the budget being planned for (bytes); else 0 */
    double seconds;         /* wall time since the call started */
};

/* A plan's own figures, fixed at its birth. */
typedef struct rkm_plan_stats {
    rkm_algo algo;          /* the planner's algorithm; RKM_ALGO_NONE for a plan not
                               made by a planner (baseline, read, hand-built) */
    uint64_t budget;        /* the budget it was planned for (a planner's plan); for
                               rkm_plan_baseline's plan its peak (the least budget it
                               meets in exact bytes: its arena may be above it); 0 for
                               a read or hand-built plan */
    uint64_t peak;          /* the simulator's peak */
    int64_t peak_step;      /* the first step that reaches it */
    double time;            /* the simulator's time */
    uint64_t baseline_peak; /* the graph's */
    double baseline_time;
    double overhead;        /* time / baseline_time - 1 (0 if baseline_time is 0) */
    size_t recomputes;      /* fwd steps of ops whose forward already ran */
    double solve_seconds;   /* wall time the planner spent on this plan (create included) */
    double gap;             /* checkmate: (time - bound) / time, bound being the LP relaxation's
                               lower bound over the ILP's schedule family (not over every
                               plan); 0 when the solve proved its schedule optimal in that
                               family, for its plans with copies (the model's times
                               are estimates there, so no bound) and for the other
                               algorithms */
    /* The plan's own memory layout (rkm_plan_layout with alignment 0),
     * made once at its birth: */
    uint64_t alignment;     /* its alignment: the solve desc's for a planned plan, its
                               file's for a read plan (256 without one), 256
                               (RKM_ARENA_ALIGN) for the baseline and built plans;
                               0 (no layout, the two figures below 0) for such a plan whose
                               buffers rounded up to it add up past 64 bits */
    uint64_t aligned_peak;  /* the most bytes live in one step, each buffer rounded up to
                               the alignment: no layout at it is smaller; >= peak */
    uint64_t arena_bytes;   /* the layout's arena, what a host allocates: >= aligned_peak,
                               equal to it on most plans; a planned plan's is <= its budget */
    /* 1: rkm_solve_desc.time_limit cut the planning of this plan (its
     * planner's creation included): the best plan found by then, which may
     * differ from run to run and machine to machine. 0: planned to the end,
     * and for plans not made by a planner. */
    int cut;
    /* Offloading (docs/formats.md; all 0 for a plan without copies): */
    uint64_t host_peak;     /* the most bytes of host copies live at once */
    double wait_seconds;    /* the part of `time` the compute stream waited for copies */
    double d2h_seconds;     /* the device-to-host copy stream's busy time */
    double h2d_seconds;     /* the host-to-device copy stream's busy time */
    size_t offloads;        /* offload steps */
    /* As a pipeline stage (rkm_solve_desc.in_flight; rkm_plan_stage_memory
     * with that many in flight): 1, peak and arena_bytes for a plan not
     * planned as a stage of more. A planned plan's two are within its
     * budget. */
    int32_t in_flight;
    uint64_t stage_peak;
    uint64_t stage_arena_bytes;
} rkm_plan_stats;

rkm_result rkm_plan_stats_get(const rkm_plan *p, rkm_plan_stats *out);

/* A planner holds what does not depend on the budget (block options), so
 * that many budgets are planned cheaply. */
typedef struct rkm_planner rkm_planner;
rkm_result rkm_planner_create(const rkm_graph *g, const rkm_solve_desc *desc, rkm_planner **out);
void rkm_planner_destroy(rkm_planner *pl);
/* A plan for `budget` bytes, or RKM_ERROR_BUDGET with the message giving
 * the smallest budget this algorithm can meet (RKM_ERROR_TIMEOUT instead
 * where the time limit cut the search, or the planner's creation, before
 * one was found). Under the graph's lower bound (rkm_graph_stats) no plan
 * of any algorithm exists: that is refused at once, without a search,
 * and the message names the bound and the step that needs it, and the
 * smallest budget only once rkm_planner_min_budget (or a call that needed
 * it) has found it. The budget is the memory
 * the host allocates for the step: the plan's arena (its own layout, at
 * the desc's alignment) is at most `budget`, and so are its aligned peak
 * and its peak. The planners count every buffer rounded up to the
 * alignment; where the layout of the plan they find still misses its
 * aligned peak by more than the budget leaves, they plan again for that
 * much less (a few times at most). */
rkm_result rkm_planner_solve(rkm_planner *pl, uint64_t budget, rkm_plan **out);
/* The smallest budget (bytes) the planner meets: the arena of the plan it
 * found there. The first call computes it (the least peak of the
 * algorithm's plans: for checkmate a bisection of solves; for DTR, and
 * for rockmate on graphs small enough for the whole-graph ILP, a
 * bisection too; then, from
 * there upwards, the solve itself until a plan's arena fits, and down
 * while one byte under that arena still finds a plan); later calls return
 * the same value. rkm_planner_solve meets it and every budget above it
 * (where its own search finds no plan there, it hands out a copy of this
 * one), and not one byte under it (the descent stops there, or after a
 * few plans). The searches are not monotone in the
 * budget, so a budget further below may still be met: "smallest" is the
 * least this search found, not a proof. On a graph with a copy link,
 * DTR's counts its plans with copies too (so it may be lower than without
 * the link), and
 * rockmate's goes below that recompute-only floor where offloading meets
 * less: a bisection from the graph's lower bound over a few fixed plans
 * offloaded (the floor's own, plans for more memory, the baseline), the
 * result the arena of the plan met there; rkm_planner_solve meets it and
 * every budget above (with that plan where its own search, whose plans to
 * offload depend on the budget, finds none), and may meet less. */
rkm_result rkm_planner_min_budget(rkm_planner *pl, uint64_t *out);

/* What a planner did so far: its structure and its ILP work. */
typedef struct rkm_planner_stats {
    rkm_algo algo;          /* never RKM_ALGO_DEFAULT: the algorithm it resolved to */
    int32_t blocks, block_classes;
    int32_t options;        /* block options the DP chooses among, all blocks */
    int32_t ilp_solves, ilp_optimal, ilp_suboptimal, ilp_infeasible, ilp_timeout, ilp_failed;
    /* Block ILP solves left out because desc.ilp_budget (solver work) or
     * desc.time_limit (wall clock: the plans then depend on the machine's
     * speed, and `cut` counts the creation) ran out: the options, the plans
     * and the smallest budget may be worse than with more. 0 when neither
     * was reached. */
    int32_t ilp_skipped;
    double ilp_seconds;
    double create_seconds;  /* wall time of rkm_planner_create */
    /* Block classes given options by a nested planner (rkm_solve_desc.nest_ops),
     * at every level; the ILP counters above include the nested planners'. */
    int32_t nested_classes;
    /* Calls on this planner (its creation, solves, rkm_planner_min_budget)
     * that desc.time_limit cut; 0: none. A cut creation left options out,
     * so every plan of the planner is flagged cut; a cut min_budget returns
     * the smallest budget found by then (at worst the baseline's arena),
     * and the next call looks again. */
    int32_t cut;
    /* The work of the planner's last call (its creation, a solve or
     * rkm_planner_min_budget) and that call's limit, in deterministic units
     * (about one replayed plan step each; docs/design.md, 'Effort'). Each
     * call has one meter, started as it begins and charged by every part
     * of it (the search, DTR runs, layouts, the offload pass, ILP solves,
     * probes of the smallest budget): work <= work_limit always, and a call
     * that spends its limit stops with its best plan, or RKM_ERROR_BUDGET
     * where it has none, as deterministically as one that does not (only
     * time_limit makes a call depend on the machine). The limit grows with
     * the graph (ops and tensors) and, for creation, with ilp_budget. */
    uint64_t work, work_limit;
} rkm_planner_stats;
rkm_result rkm_planner_stats_get(const rkm_planner *pl, rkm_planner_stats *out);

/* planner_create + planner_solve + planner_destroy. */
rkm_result rkm_plan_solve(const rkm_graph *g, const rkm_solve_desc *desc, uint64_t budget,
                          rkm_plan **out);

/* Parse a budget as on the command line: a decimal number
 * ([0-9]*[.[0-9]*][(e|E)[+-]N], a digit somewhere), then nothing or B
 * (bytes), KiB, MiB, GiB (powers of 1024), KB, MB, GB (powers of 1000) or
 * % (of the graph's baseline arena at `alignment`, rkm_graph_baseline_arena:
 * what the plain step allocates, so that "100%" is the baseline with no
 * overhead): "123", "123B", "64MiB", "1.5GB", "1e6", "40%". `alignment` is
 * the solve desc's (0: 256); byte budgets do not depend on it. Fractional
 * byte counts round down. Anything else (hex, inf, spaces) is
 * RKM_ERROR_ARGUMENT with a message in g's context; *out is 0 on failure. */
rkm_result rkm_parse_budget(const rkm_graph *g, const char *text, uint64_t alignment, uint64_t *out);

/* ---------------------------------------------------------------------------
 * Execution: the plan calls the host
 * ------------------------------------------------------------------------- */

/* Each call carries what the host needs to run the step without asking the
 * graph: the op's tensors, which buffers are new, the workspace it may use.
 * Pointers point into the plan or the graph and are valid during the call.
 *
 * New buffers are never zeroed by the library (it touches no data): a new
 * output (out_new 1), a new gradient (RKM_GRAD_NEW) and the workspace come
 * as the host allocated them. A kernel that accumulates (llm.c's backwards
 * all do `+=`) wants its new gradients and its scratch (dpreatt) zeroed:
 * the host zeroes exactly the buffers these flags mark new, and only those,
 * since an ACCUMULATE gradient already holds earlier contributions.
 *
 * A run in place (RKM_OUT_INPLACE, RKM_GRAD_INPLACE) allocates nothing: the
 * host moves the input's buffer to the output (grad(out[0])'s to
 * grad(in[0])) and must not zero it, for it holds the values the kernel
 * reads; an accumulating kernel writes 0 + d there, which is what `+=` on
 * a zeroed buffer gives (examples/gpt2_model.h does so). */
typedef struct rkm_fwd_call {
    int64_t step;          /* index in the plan */
    int32_t op;
    int save;              /* keep the phantom (saved state) for the backward */
    int recompute;         /* this op's forward already ran earlier in the plan */
    const int32_t *in;     /* the op's `in` tensors (n_in), in the op's order */
    int32_t n_in;
    const int32_t *out;    /* the op's `out` tensors (n_out) */
    int32_t n_out;
    const uint8_t *out_new;/* per output: RKM_OUT_* */
    uint64_t phantom;      /* the op's phantom: with save, the saved state to allocate */
    uint64_t ws_bytes;     /* the transient memory the call may use: the op's
                              fwd_ws, plus its scratch when this run keeps no
                              saved state (not save, and the saved state not
                              live); the layout's workspace buffer has this size */
    int32_t micro;         /* the micro-batch (rkm_plan_execute_phase); 0 otherwise */
} rkm_fwd_call;

/* Per output of a forward call. */
#define RKM_OUT_LIVE 0    /* live already: recompute into it (same values) */
#define RKM_OUT_NEW 1     /* not live: allocate it */
#define RKM_OUT_INPLACE 2 /* out[0] of a run in place: it takes over in[0]'s
                             buffer (write over in[0]); in[0] is gone after
                             the call, and no free step follows for it */

/* Per input gradient of a backward call. */
#define RKM_GRAD_NONE 0       /* this input has no gradient: do not compute one */
#define RKM_GRAD_NEW 1        /* allocate grad(T); this is its first contribution */
#define RKM_GRAD_ACCUMULATE 2 /* grad(T) is live: add into it */
#define RKM_GRAD_INPLACE 3    /* in[0] of a run in place: grad(in[0]) takes over
                                 grad(out[0])'s buffer (write it there; its
                                 first contribution); grad(out[0]) is gone
                                 after the call, and no free_grad follows */

typedef struct rkm_bwd_call {
    int64_t step;
    int32_t op;
    const int32_t *in;      /* the op's `in` tensors (n_in) */
    int32_t n_in;
    const int32_t *out;     /* the op's `out` tensors (n_out) */
    int32_t n_out;
    const uint8_t *in_grad; /* per input: RKM_GRAD_* */
    const uint8_t *out_grad;/* per output: 1 = grad(out) is live and complete,
                               read it; 0 = the output has no gradient (treat
                               it as zero) */
    const int32_t *saved;   /* the op's `saved` tensors (n_saved): live now */
    int32_t n_saved;
    uint64_t phantom;       /* the op's phantom: its saved state, live now when > 0 */
    uint64_t ws_bytes;      /* the op's declared bwd workspace */
    int32_t micro;         /* the micro-batch (rkm_plan_execute_phase); 0 otherwise */
} rkm_bwd_call;

/* The loss step and the three free steps: one buffer each. */
typedef struct rkm_buffer_call {
    int64_t step;   /* index in the plan */
    int32_t index;  /* loss, free_tensor, free_grad: the tensor; free_saved: the op */
    uint64_t bytes; /* of the buffer made (loss: grad(loss)) or released
                       (free_saved: the op's phantom) */
    int32_t micro;         /* the micro-batch (rkm_plan_execute_phase); 0 otherwise */
} rkm_buffer_call;

/* The copy steps (offloading; docs/formats.md). The host keeps at most one
 * host copy per tensor and per saved state, which it allocates on offload
 * and releases on free_host; a plan may prefetch from it more than once (a
 * tensor off the device for several gaps is offloaded once). The device
 * buffer of a prefetch is new, released by a later free (or free_saved)
 * step: a host that runs the plan itself (rkm_plan_execute) allocates it,
 * then starts the copy into it; under rkm_arena_exec_run the exec carves it
 * at its offset before calling the host's prefetch, which finds it with
 * rkm_arena_exec_tensor (rkm_arena_exec_saved) and only starts the copy.
 * The exec touches no device buffer on offload, wait and free_host: it
 * calls the host's (offload, prefetch and wait are required there, as
 * here); the host copy is the host's own memory, outside the arena. */
typedef struct rkm_copy_call {
    int64_t step;      /* index in the plan */
    int32_t index;     /* the tensor; with saved, the op */
    int saved;         /* 1: the op's saved state (its phantom), not a tensor */
    uint64_t bytes;
    int64_t wait_step; /* offload, prefetch: the wait step that completes this copy;
                          wait: the step that started it; free_host: -1 */
    int32_t micro;         /* the micro-batch (rkm_plan_execute_phase); 0 otherwise */
} rkm_copy_call;

/* Callbacks return 0 on success; any other value stops the walk and
 * rkm_plan_execute returns RKM_ERROR_CALLBACK naming the step and the value.
 * forward and backward are required, the others may be NULL (skipped). */
typedef struct rkm_callbacks {
    void *user;
    int (*forward)(void *user, const rkm_fwd_call *call);
    int (*backward)(void *user, const rkm_bwd_call *call);
    int (*loss)(void *user, const rkm_buffer_call *call); /* allocate and seed grad(loss) */
    int (*free_tensor)(void *user, const rkm_buffer_call *call);
    int (*free_saved)(void *user, const rkm_buffer_call *call);
    int (*free_grad)(void *user, const rkm_buffer_call *call);
    /* Required only by a plan with copy steps (rkm_plan_stats.offloads > 0):
     * offload starts copying the tensor's device buffer into a new host
     * copy and returns without waiting (a copy stream); prefetch starts
     * copying the host copy into the tensor's new device buffer; wait
     * returns once the copy started at call->wait_step is complete (a
     * compute stream waits for it: later kernels may read the tensor, or
     * its device buffer be released). free_host may be NULL. */
    int (*offload)(void *user, const rkm_copy_call *call);
    int (*prefetch)(void *user, const rkm_copy_call *call);
    int (*wait)(void *user, const rkm_copy_call *call);
    int (*free_host)(void *user, const rkm_copy_call *call);
} rkm_callbacks;

/* Walk the plan (valid: every plan is). Never allocates.
 *
 * After a failure (a callback returned non-zero at step s, the `step` of
 * its call) nothing more is called: the buffers the host allocated in the
 * steps before s and was not told to free are still its own, and so is
 * what the failed call did. Those are the plan's buffers with
 * first_step < s <= last_step (rkm_plan_layout; the inputs, first_step -1,
 * are the host's anyway). A host that keeps a pointer per tensor, gradient
 * and saved state, NULL when free, can instead free every non-NULL one.
 *
 *     rkm_buffer *b = malloc(rkm_plan_num_buffers(p) * sizeof *b);
 *     uint64_t arena;
 *     if (b && rkm_plan_layout(p, 0, b, &arena) == RKM_OK)
 *         for (size_t i = 0; i < rkm_plan_num_buffers(p); i++)
 *             if (b[i].first_step >= 0 && b[i].first_step < s && b[i].last_step >= s)
 *                 my_release(b[i].kind, b[i].index);   // tensor, phantom or gradient
 *     free(b);
 *
 * rkm_arena_exec_run does this itself: a failed run releases every buffer
 * but the inputs. */
rkm_result rkm_plan_execute(const rkm_plan *p, const rkm_callbacks *cb);

/* Pipeline stages run a plan in two phases, one micro-batch at a time,
 * with other micro-batches' phases between them (docs/formats.md,
 * "Pipeline stages"). The forward phase (phase 0) is the steps before the
 * `loss` step: at its end the stage's output is sent, and what is live is
 * what the micro-batch keeps until its backward. The backward phase
 * (phase 1) is the rest, from the `loss` step (the output's gradient
 * arrives) to the end (the input's gradient is sent). Run in that order,
 * the two are rkm_plan_execute. rkm_plan_phase_step is the index of the
 * `loss` step, where phase 1 starts (-1 for NULL).
 * rkm_plan_execute_phase walks one phase as rkm_plan_execute walks the
 * plan, and passes `micro` (>= 0) in every call it makes, so that the host
 * finds that micro-batch's buffers. */
int64_t rkm_plan_phase_step(const rkm_plan *p);
rkm_result rkm_plan_execute_phase(const rkm_plan *p, int phase, int32_t micro, const rkm_callbacks *cb);

/* ---------------------------------------------------------------------------
 * Arena: one region per training step, an offset per buffer
 * ------------------------------------------------------------------------- */

/* Every activation, phantom, gradient and workspace of a training step
 * carved from one region instead of one allocation per buffer (glibc's
 * malloc of 128 KiB and more is an mmap/munmap each time). Two objects:
 *
 * rkm_arena: an allocator over offsets in [0, capacity): 256-byte aligned
 * offsets, first fit, neighbours coalesced on free. Deterministic. It counts
 * the requested bytes (the contract's unit, no alignment), their peak, and
 * the high-water mark (max of offset + requested bytes).
 *
 * rkm_arena_exec: runs a plan (rkm_plan_execute) with every buffer carved
 * from a region: the `input` tensors once at creation (fill them before a
 * run), then per step what the step creates (new outputs, the phantom of a
 * `save`, new gradients, grad(loss), the call's workspace), released by the
 * free steps. The host's own callbacks (desc.host) run inside each step,
 * after its buffers are carved and before they are released, and find them
 * with rkm_arena_exec_tensor/grad/saved. The region's current bytes follow
 * rkm_plan_mem_after step for step and its peak is the plan's peak, to the
 * byte.
 *
 * One desc makes every exec; its mode says where buffers go, and each field
 * means the same in every mode:
 * - RKM_ARENA_LAYOUT (0, what a host normally wants): every buffer at its
 *   offset in desc.plan's own layout (rkm_plan_layout with alignment 0),
 *   offsets and scratch aligned as the plan was laid out
 *   (rkm_plan_stats.alignment: 256 unless the solve desc or plan file said otherwise).
 *   The region it needs is the plan's arena_bytes, which for a planned plan
 *   is at most its budget. The exec runs that plan only.
 * - RKM_ARENA_FIRST_FIT: each buffer at the lowest 256-aligned offset free
 *   when it is made, as a dynamic allocator would; it runs any plan of the
 *   graph. It can need more than the plan's arena, since it does not know
 *   the lifetimes ahead (bench/bench_layout measures how much more on
 *   the bundled graphs' plans).
 * - RKM_ARENA_MEASURE (profiling): first fit, and each op's workspace is
 *   measured as what its scratch requests took (rkm_arena_exec_scratch).
 *
 * desc.capacity is the region's bytes in every mode; 0 means what desc.plan
 * needs in that mode (rkm_arena_capacity). Layout mode needs a plan and at
 * least its arena_bytes; the first-fit modes take a plan only to size the
 * region.
 *
 * Where the region is: the exec deals in offsets. A CPU host sets
 * desc.allocate and the exec allocates the region itself, once, through the
 * context's allocator (rkm_arena_exec_base); a device host allocates it
 * itself (one cudaMalloc of the capacity, cuda/rockmate_cuda.h). Either way
 * rkm_arena_ptr(base, offset) is the buffer's address. Offsets, scratch
 * included, are multiples of the mode's alignment (layout: the plan's
 * rkm_plan_stats.alignment; first fit and measure: RKM_ARENA_ALIGN), and so
 * is the base of the region the exec allocates (it asks the allocator for
 * alignment - 1 bytes more), so every buffer's address is aligned. A host
 * that allocates the region must align its base the same way (cudaMalloc
 * gives 256; cuda/ pads for a larger plan alignment): the exec never sees
 * that address and cannot check it. The library never touches the region's
 * bytes: new buffers are not zeroed.
 *
 *     rkm_arena_exec_desc d = {.graph = g, .plan = plan, .host = &callbacks, .allocate = 1};
 *     rkm_arena_exec *x;
 *     rkm_arena_exec_create(&d, &x);                   // the one allocation
 *     void *base = rkm_arena_exec_base(x);
 *     float *inp = rkm_arena_ptr(base, rkm_arena_exec_tensor(x, input_id));
 *     ... fill the inputs; then per training step:
 *     rkm_arena_exec_run(x, plan);   // callbacks: rkm_arena_ptr(base, rkm_arena_exec_tensor(x, t))
 *     rkm_arena_exec_destroy(x);
 *
 * The host's callbacks in an exec allocate and free nothing: each buffer a
 * step makes (grad(loss) included) is carved before the host's callback
 * and found with rkm_arena_exec_tensor/grad/saved; a free step releases it
 * after the host's free callback, which is still called (so that a device
 * host may order its stream). Callbacks written for rkm_plan_execute that
 * malloc and free each buffer must not be reused as they are: set the free
 * callbacks NULL or make them no-ops, or they free the arena's memory.
 * And the exec is made after its callbacks: their `user` must lead to the
 * exec (and the region) once rkm_arena_exec_create returns, as in
 *
 *     typedef struct { rkm_arena_exec *x; char *base; } my_host;
 *     static int my_fwd(void *user, const rkm_fwd_call *c)
 *     {
 *         my_host *h = user;
 *         float *y = rkm_arena_ptr(h->base, rkm_arena_exec_tensor(h->x, c->out[0]));
 *         ...
 *     }
 *     my_host h = {0};
 *     rkm_callbacks cb = {.user = &h, .forward = my_fwd, .backward = my_bwd, .loss = my_loss};  // no frees
 *     rkm_arena_exec_desc d = {.graph = g, .plan = plan, .host = &cb, .allocate = 1};
 *     if (rkm_arena_exec_create(&d, &h.x) == RKM_OK)
 *         h.base = rkm_arena_exec_base(h.x);                // before the first run
 *
 * Errors: messages go to the graph's context (for an exec) or the one given
 * to rkm_arena_create. Every call that can fail returns an rkm_result; one
 * given a NULL object returns RKM_ERROR_ARGUMENT without a message (the
 * stats getters zero *out first), rkm_arena_reset_peak and rkm_arena_clear
 * do nothing. RKM_ERROR_INTERNAL is a bug (the bookkeeping disagrees with
 * the plan). */

#define RKM_ARENA_ALIGN 256u
/* Offset of a buffer that is not live. */
#define RKM_ARENA_NONE UINT64_MAX
/* Capacity of an arena that never runs out (layout passes). */
#define RKM_ARENA_UNBOUNDED UINT64_MAX
/* Scratch buffers one call may take (measure mode). */
#define RKM_ARENA_MAX_SCRATCH 64

typedef struct rkm_arena rkm_arena;

typedef struct rkm_arena_stats {
    uint64_t capacity;   /* bytes of the region; RKM_ARENA_UNBOUNDED for layout passes */
    uint64_t current;    /* requested bytes of the live blocks */
    uint64_t peak;       /* max of current since creation or the last reset_peak */
    uint64_t high_water; /* max of offset + requested bytes over every block ever carved */
    uint32_t blocks;     /* live blocks */
} rkm_arena_stats;

/* An arena over [0, capacity) holding at most max_blocks live blocks
 * (1..UINT32_MAX-1). ctx (kept; the arena keeps it alive) gives the allocator
 * and takes the messages. All memory is taken here, none by alloc/free. */
rkm_result rkm_arena_create(rkm_context *ctx, uint64_t capacity, uint32_t max_blocks, rkm_arena **out);
void rkm_arena_destroy(rkm_arena *a);
/* A block of `bytes` (> 0) at the lowest free 256-aligned offset that holds
 * it. RKM_ERROR_NOMEM when none does or max_blocks are live. */
rkm_result rkm_arena_alloc(rkm_arena *a, uint64_t bytes, uint64_t *offset);
/* Release the block that starts at offset; RKM_ERROR_ARGUMENT, naming the
 * offset, if no live block starts there. */
rkm_result rkm_arena_free(rkm_arena *a, uint64_t offset);
rkm_result rkm_arena_stats_get(const rkm_arena *a, rkm_arena_stats *out);
void rkm_arena_reset_peak(rkm_arena *a); /* peak = current */
void rkm_arena_clear(rkm_arena *a);      /* release every block (peak and high water kept) */

typedef enum rkm_arena_mode {
    RKM_ARENA_LAYOUT = 0,    /* every buffer at its offset in desc.plan's layout */
    RKM_ARENA_FIRST_FIT = 1, /* the lowest free offset when a buffer is made */
    RKM_ARENA_MEASURE = 2    /* first fit, and the ops' workspaces measured */
} rkm_arena_mode;

typedef struct rkm_arena_exec rkm_arena_exec;

typedef struct rkm_arena_exec_desc {
    const rkm_graph *graph;     /* finalized; the exec keeps it alive; its context takes the messages */
    rkm_arena_mode mode;        /* 0: layout */
    const rkm_plan *plan;       /* of graph; layout: the plan whose layout the exec follows
                                   (copied: the plan may go); first fit: sizes capacity 0 */
    uint64_t capacity;          /* the region's bytes; 0: what plan needs in this mode
                                   (rkm_arena_capacity); RKM_ARENA_UNBOUNDED (first fit,
                                   without allocate): a region that never runs out */
    const rkm_callbacks *host;  /* called inside each step (copied); NULL: bookkeeping only */
    int allocate;               /* 1: the exec allocates the region (rkm_arena_exec_base), its
                                   base aligned as the offsets are; 0: the host does, and must
                                   align it so ("Where the region is" above) */
} rkm_arena_exec_desc;

/* Carves the inputs (in id order; in layout mode at the layout's offsets).
 * RKM_ERROR_NOMEM if they do not fit or the region cannot be allocated;
 * RKM_ERROR_ARGUMENT, naming the field, for a graph not finalized, an
 * unknown mode, layout mode without a plan or with a capacity below the
 * plan's arena_bytes, capacity 0 without a plan, a plan of another graph,
 * a host without forward or backward, or allocate with an unbounded
 * capacity. */
rkm_result rkm_arena_exec_create(const rkm_arena_exec_desc *desc, rkm_arena_exec **out);
void rkm_arena_exec_destroy(rkm_arena_exec *x);
rkm_arena_mode rkm_arena_exec_mode(const rkm_arena_exec *x); /* RKM_ARENA_LAYOUT for NULL */

/* One training step: rkm_plan_execute(plan) with the buffers carved and
 * released around the host's callbacks. The peak is reset to the inputs
 * first, so the stats afterwards give this step's peak. In layout mode the
 * plan must create the same buffers in the same order as the desc's plan
 * (RKM_ERROR_STATE otherwise). On failure every buffer but the inputs is
 * released and the message names the step: RKM_ERROR_NOMEM (region too
 * small), RKM_ERROR_CALLBACK (a host callback returned non-zero; a failed
 * scratch request of that call is appended), RKM_ERROR_STATE, the code
 * given to rkm_arena_exec_host_fail, or RKM_ERROR_INTERNAL. */
rkm_result rkm_arena_exec_run(rkm_arena_exec *x, const rkm_plan *plan);

/* For a host callback that fails for a reason of its own (a CUDA error):
 * keeps the code and the message and returns the value the callback must
 * return; the run then fails with `code`, the message prefixed with the
 * step. */
int rkm_arena_exec_host_fail(rkm_arena_exec *x, rkm_result code, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Offsets of live buffers, RKM_ARENA_NONE when not live (a zero-byte
 * buffer is live at an offset and takes no space). */
uint64_t rkm_arena_exec_tensor(const rkm_arena_exec *x, int32_t tensor);
uint64_t rkm_arena_exec_grad(const rkm_arena_exec *x, int32_t tensor);
uint64_t rkm_arena_exec_saved(const rkm_arena_exec *x, int32_t op); /* the op's phantom */

/* The region the exec allocated (desc.allocate), NULL otherwise. */
void *rkm_arena_exec_base(const rkm_arena_exec *x);
/* base + offset; NULL for a NULL base or RKM_ARENA_NONE. */
void *rkm_arena_ptr(void *base, uint64_t offset);

/* During a forward or backward callback: a scratch buffer of `bytes`,
 * released when the callback returns; each counts rounded up to 256 bytes.
 * Layout and first fit: cut from the op's declared workspace (fwd_ws or
 * bwd_ws, reserved before the call); more is RKM_ERROR_NOMEM. Measure mode:
 * carved from the region (RKM_ERROR_NOMEM beyond its capacity or
 * RKM_ARENA_MAX_SCRATCH buffers), and the op's workspace is measured as
 * the region's peak during the call minus the live bytes before it minus
 * what the call creates. RKM_ERROR_STATE outside a call. */
rkm_result rkm_arena_exec_scratch(rkm_arena_exec *x, uint64_t bytes, uint64_t *offset);

/* Measure mode: the largest workspace seen per op so far (0 if none ran);
 * RKM_ERROR_ARGUMENT (both 0) for an op out of range. */
rkm_result rkm_arena_exec_measured_ws(const rkm_arena_exec *x, int32_t op, uint64_t *fwd_ws, uint64_t *bwd_ws);
/* The region's figures (rkm_arena_stats_get of the exec's arena). */
rkm_result rkm_arena_exec_stats_get(const rkm_arena_exec *x, rkm_arena_stats *out);

/* The region an exec in `mode` needs for `plan`: layout, the plan's
 * arena_bytes; first fit and measure, the high-water mark of a first-fit
 * run of the plan on an unbounded region (its peak checked against the
 * plan's; measure mode reserves the declared workspaces here). */
typedef struct rkm_arena_capacity_info {
    uint64_t peak;     /* requested bytes: the plan's peak */
    uint64_t capacity; /* the region to allocate: peak + slack */
    uint64_t slack;    /* alignment and fragmentation */
} rkm_arena_capacity_info;
rkm_result rkm_arena_capacity(const rkm_plan *plan, rkm_arena_mode mode, rkm_arena_capacity_info *out);

/* ---------------------------------------------------------------------------
 * Profiling: measure each op's times through the host's callbacks
 * ------------------------------------------------------------------------- */

/* Zero means default; a negative runs or a trim outside [0, 0.5) (NaN
 * included) is refused with RKM_ERROR_ARGUMENT. */
typedef struct rkm_profile_desc {
    int32_t runs;     /* baseline steps to time; 0: 5 */
    double trim;      /* fraction dropped at each end before the mean; 0: 0.2 */
    /* A clock in seconds; NULL: a monotonic wall clock. A GPU host gives one
     * that synchronises its stream first. */
    double (*clock)(void *user);
    /* Called after each run (0..runs-1), e.g. to zero the parameter
     * gradients that run's backwards accumulated; non-zero stops profiling
     * with RKM_ERROR_CALLBACK. NULL: nothing is called. */
    int (*after_run)(void *user, int32_t run);
    void *user;       /* given to clock and after_run */
} rkm_profile_desc;

/* Runs the baseline plan of g `runs` times through cb, timing every forward
 * and backward callback, and makes *out: g with each op's fwd/bwd seconds
 * set to the trimmed mean of its samples (workspaces as in g), as
 * rkm_graph_with_costs does. g is unchanged. The callbacks run for real:
 * each run is a whole training step, so a host that accumulates parameter
 * gradients (the backward callbacks add into them) ends with `runs` steps'
 * worth of them, unless desc->after_run resets them after every run. The
 * host's activations are left as after a training step: every buffer the
 * plan made is freed by its own free steps. */
rkm_result rkm_graph_profile(const rkm_graph *g, const rkm_callbacks *cb, const rkm_profile_desc *desc,
                             rkm_graph **out);

/* The profiler's statistic, for hosts that time ops their own way (the CUDA
 * profiler): sorts samples[0..n) and returns the mean after dropping
 * floor(n * trim) samples at each end (trim clamped to [0, 0.5], at least
 * one sample kept); 0 for n == 0. */
double rkm_trimmed_mean(double *samples, size_t n, double trim);

/* ---------------------------------------------------------------------------
 * Pipelines: one step of P stages on P devices, M micro-batches
 * ------------------------------------------------------------------------- */

/* The order each stage runs its micro-batches' phases in. */
typedef enum rkm_pipe_schedule {
    /* Megatron-LM's non-interleaved 1F1B: stage s (0-based) runs
     * min(P - s - 1, M) warm-up forwards, then one forward and one
     * backward while forwards remain, then the remaining backwards; it
     * holds at most min(P - s, M) micro-batches in flight. */
    RKM_PIPE_1F1B = 0,
    /* GPipe: every forward, then every backward (in micro-batch order); M
     * in flight on every stage. */
    RKM_PIPE_GPIPE = 1
} rkm_pipe_schedule;

/* One stage's times in seconds: one micro-batch's forward phase and
 * backward phase, the transfer of its output to stage s + 1 and of its
 * input's gradient to stage s - 1 (ignored at the pipeline's ends). */
typedef struct rkm_pipe_stage {
    double fwd, bwd;
    double send_fwd, send_bwd;
} rkm_pipe_stage;

/* One phase of one micro-batch on one stage, as the replay timed it. */
typedef struct rkm_pipe_phase {
    int32_t stage, micro;
    int32_t bwd;       /* 0: the forward phase, 1: the backward phase */
    double start, end; /* seconds from the step's start */
    double arrive;     /* when what it sends is at the neighbour (end where it sends nothing) */
} rkm_pipe_phase;

/* Replays one training step of the pipeline stages[0..n_stages) with
 * `micro_batches` micro-batches under `schedule`. Each stage is one device
 * running one phase at a time in the schedule's order; a phase starts when
 * its device is free and what it reads has arrived: a forward of
 * micro-batch m at stage s > 0 reads m's output of stage s - 1, a backward
 * at s < P - 1 the gradient of that output from stage s + 1 (the last
 * stage's backward follows its own forward). Each boundary has one link
 * per direction, carrying one transfer at a time in the order sent. Sets
 * *step_time (the last phase's end) and, where not NULL, phases (2 x P x M
 * entries: stage s's phases in its order at [s * 2M ...]) and in_flight
 * (P entries: the most micro-batches whose forward ran and backward did
 * not). At least one stage and one micro-batch, every time finite and at
 * least 0, else RKM_ERROR_ARGUMENT naming the stage and the field. */
rkm_result rkm_pipeline_simulate(rkm_context *ctx, const rkm_pipe_stage *stages, int32_t n_stages,
                                 int32_t micro_batches, rkm_pipe_schedule schedule, rkm_pipe_phase *phases,
                                 int32_t *in_flight, double *step_time);

/* A stage plan's memory on its device, with its micro-batches in flight.
 * Under `schedule`, stage `stage` of n_stages runs micro_batches
 * micro-batches, each a forward phase then a backward phase of plan p
 * (rkm_plan_execute_phase), in the order rkm_pipeline_simulate replays:
 * up to in_flight = min(n_stages - stage, micro_batches) of them (1F1B;
 * GPipe: all) hold what their forward phase left until their backward
 * runs. Each micro-batch has its own buffers: its inputs from the start
 * of its forward phase, its input's gradient to the end of its backward
 * phase (then sent and released). The replay of that order is the one
 * source of `peak`: at every step, that step's peak plus what the other
 * micro-batches hold.
 *
 * The layout (at `alignment`, a power of two; 0: the plan's own, or 256
 * for a plan without one) is one micro-batch's, in [0, slot_bytes +
 * transient_bytes): the buffers live across the phase boundary (the `loss`
 * step), the inputs included, lie in [0, slot_bytes), the slot; every
 * other buffer lies wholly below slot_bytes (in the slot, where the kept
 * ones are not at that time) or wholly above it (in the region the running
 * phase has to itself). On the device each micro-batch in flight has a
 * slot of its own and the phases share one region: micro-batch m's buffer
 * at offset o lies at o + (m mod in_flight) x slot_bytes below slot_bytes
 * and at o + (in_flight - 1) x slot_bytes above (under both schedules the
 * micro-batches in flight at once are consecutive). So the arena is
 * in_flight x slot_bytes + transient_bytes, at least the aligned peak of
 * the replay, and a stage planned for a budget (rkm_solve_desc.in_flight)
 * has it within the budget. With one in flight, the plan's own layout
 * where it is smaller (slot_bytes its arena, transient_bytes 0).
 * rkm_plan_stage_layout fills buffers (rkm_plan_num_buffers entries, as
 * rkm_plan_layout) with those offsets. */
typedef struct rkm_stage_memory {
    int32_t in_flight;        /* the most micro-batches between their two phases */
    uint64_t kept_bytes;      /* what one holds between them: live before the `loss` step */
    uint64_t fwd_peak;        /* the forward phase's peak, one micro-batch alone */
    uint64_t bwd_peak;        /* the backward phase's */
    uint64_t peak;            /* the replay's peak (exact bytes) */
    uint64_t slot_bytes;      /* one micro-batch's slot: its kept buffers */
    uint64_t transient_bytes; /* the transient region */
    uint64_t arena_bytes;     /* in_flight x slot_bytes + transient_bytes */
    uint64_t alignment;       /* of the layout */
} rkm_stage_memory;
rkm_result rkm_plan_stage_memory(const rkm_plan *p, rkm_pipe_schedule schedule, int32_t stage, int32_t n_stages,
                                 int32_t micro_batches, uint64_t alignment, rkm_stage_memory *out);
rkm_result rkm_plan_stage_layout(const rkm_plan *p, rkm_pipe_schedule schedule, int32_t stage, int32_t n_stages,
                                 int32_t micro_batches, uint64_t alignment, rkm_buffer *buffers,
                                 rkm_stage_memory *out);

/* ---------------------------------------------------------------------------
 * Pipeline planning: the cut across devices and each stage's plan
 * ------------------------------------------------------------------------- */

/* What to plan: g cut into `stages` stages on as many devices, running
 * `micro_batches` micro-batches a step under `schedule`. Zero means the
 * default where one exists. */
typedef struct rkm_pipeline_desc {
    int32_t stages;              /* P >= 1 */
    int32_t micro_batches;       /* M >= 1 */
    rkm_pipe_schedule schedule;  /* RKM_PIPE_1F1B (0) or RKM_PIPE_GPIPE */
    uint64_t budget;             /* every device's budget for activations (bytes) */
    const uint64_t *budgets;     /* or one per stage (n_budgets == stages); NULL: budget */
    int32_t n_budgets;
    double link_bytes_per_second; /* each boundary's link, per direction; 0: transfers are free */
    const int32_t *cuts;         /* stages - 1 cut tensors (rkm_graph_cut's), kept as given;
                                    NULL: the planner chooses them */
    rkm_solve_desc solve;        /* each stage's planner (its in_flight is set per stage) */
} rkm_pipeline_desc;

/* One stage of a planned pipeline. */
typedef struct rkm_pipeline_stage_info {
    int32_t first_op, last_op;   /* the stage's ops in the whole graph: [first_op, last_op] */
    int32_t first_block, n_blocks; /* and its blocks */
    int32_t in_flight;           /* micro-batches it holds between their phases */
    uint64_t budget;             /* its device's */
    double fwd_seconds;          /* one micro-batch's forward phase */
    double bwd_seconds;          /* and backward phase */
    double overhead;             /* its plan's: time / the stage's baseline time - 1 */
    uint64_t kept_bytes;         /* what a micro-batch holds between its phases */
    uint64_t peak;               /* with in_flight of them (rkm_plan_stage_memory) */
    uint64_t arena_bytes;        /* what its device allocates, <= budget */
} rkm_pipeline_stage_info;

typedef struct rkm_pipeline rkm_pipeline;

/* Plans a pipeline of g (finalized): the cut (desc->cuts, or the one this
 * call chooses) and each stage's plan, made with desc->solve for its
 * budget with its micro-batches in flight, and the step's time, from
 * rkm_pipeline_simulate over the stage plans' phase times and the
 * boundary tensors' transfers. Choosing, it minimises that step time: a
 * search over cuts at block boundaries, each stage estimated with rotor's
 * plan (fast), then the best cut found and the uniform cut
 * (rkm_graph_uniform_cut) planned with desc->solve, the faster kept.
 * RKM_ERROR_ARGUMENT for a bad desc (P < 1, M < 1, P above the graph's
 * blocks, a budget list of another length than P, cuts that rkm_graph_cut
 * refuses); RKM_ERROR_BUDGET where a stage has no plan within its budget,
 * the message naming the stage and the smallest budget that stage meets
 * (with a chosen cut: of the uniform cut's first such stage). Nothing is
 * made on failure. */
rkm_result rkm_pipeline_plan(const rkm_graph *g, const rkm_pipeline_desc *desc, rkm_pipeline **out);
void rkm_pipeline_destroy(rkm_pipeline *pp);
/* The step's time (seconds), its stage count; a stage's figures, graph
 * and plan (any output may be NULL; they live as long as pp). */
double rkm_pipeline_step_time(const rkm_pipeline *pp);
int32_t rkm_pipeline_num_stages(const rkm_pipeline *pp);
rkm_result rkm_pipeline_stage(const rkm_pipeline *pp, int32_t stage, rkm_pipeline_stage_info *info,
                              const rkm_graph **graph, const rkm_plan **plan);
/* The uniform cut of g into `stages` stages: cuts[0 .. stages - 2] at the
 * block boundaries nearest to equal shares of the baseline's forward time
 * (each stage at least one block). RKM_ERROR_ARGUMENT where stages is
 * below 1 or above the graph's blocks. */
rkm_result rkm_graph_uniform_cut(const rkm_graph *g, int32_t stages, int32_t *cuts);

#ifdef __cplusplus
}
#endif
#endif /* ROCKMATE_H */
