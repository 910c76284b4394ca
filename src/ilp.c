/* ilp.c -- the block ILP: the model and lp_solve (the one file that includes it)
 *
 * Uses (through internal.h): base.c, graph.c, sim.c, plan.c, ilp_sched.c. */
#include "internal.h"

/* A block: forward ops (global ids, topological order) of a finalized graph,
 * the separator x_in entering it (-1: none) and x_out leaving it (the loss
 * tensor for the last block). Its schedule is two runs of graph-level steps:
 *   F  from inputs + x_in: every block op's forward once, in order, with
 *      `save` where the phantom is kept; frees. Ends with x_in, x_out and
 *      whatever B needs live ("kept").
 *   B  from F's end state plus grad(x_out) live and complete (the caller sets
 *      it with rkm__sim_give_grad; the last block starts B with `loss`):
 *      recomputations, every block backward once, frees. Ends with inputs +
 *      x_in live, grad(x_in) live (if it has one), nothing else.
 *
 *   rkm__ilp_block_create(g, ops, n_ops, x_in, x_out, is_last, &b)
 *      builds the budget-independent model (the whole graph: x_in = -1,
 *      x_out = loss, is_last = 1: that is Checkmate's whole-graph form).
 *   rkm__ilp_block_solve(b, peak_budget, kept_budget, time_limit_s, &steps,
 *                        &n_fwd, &n_bwd, &stats, &found)
 *      least-time schedule whose replayed peak is <= peak_budget and whose
 *      memory at the end of F ("kept", x_in and x_out included) is <=
 *      kept_budget (UINT64_MAX: no limit); absolute bytes, inputs included,
 *      like every memory figure of a block (see options.c).
 *      steps[0..n_fwd) is F, then n_bwd steps of B; the caller frees them
 *      with rkm__free(ctx, steps, (n_fwd + n_bwd) * sizeof *steps).
 *      found = 0 (steps NULL) when no schedule fits; that is RKM_OK too.
 *      time_limit_s (<= 0: 1 s) is turned into work budgets (lp_solve
 *      callbacks, steps replayed by the greedy) worth about that much time,
 *      so that the result is the same on every machine, however slow,
 *      loaded or sanitized: no clock of its own (a sanitized build under
 *      load met a wall clock at 20x the limit in its greedy, and planned
 *      differently); only the caller's deadline below is a clock.
 *   rkm__ilp_block_deadline(b, t): later solves also stop at rkm__now() t
 *      (the planner's time_limit; results may then differ too).
 *   rkm__ilp_block_watch(b, stop, user): later solves also stop where
 *      stop(user, done) answers non-zero (the planner's check, which
 *      reports progress; `done`: the solve's work so far, 0..1).
 *      Stats counters accumulate (zero them first); proven/bound/time
 *      describe this call.
 *   rkm__ilp_block_destroy(b)
 *   rkm__ilp_block_create_copies(g, &b), rkm__ilp_block_solve_copies(b,
 *      budget, cutoff, time_limit_s, &steps, &n, offload, &stats, &found):
 *      the whole graph with a copy link, each slot also able to wait in host
 *      memory (see "copies" below); checkmate's with a link (offload.c).
 *
 * A block is four parts, each with one owner and its own init and free:
 * rkm__ilp_shape (numbering and structure, fixed at create), rkm__ilp_model
 * (the lprec and its column maps), rkm__ilp_memo (what solves learn: found
 * schedules, budget pairs proven empty, the floors) and rkm__ilp_scratch
 * (one solve's working memory, handed explicitly to the functions using it).
 *
 * Shape of the model (docs: lpsolve.md, formulation `fb`): stage 0 runs the
 * forward ops in order, then stage t = 1..nb runs the recomputations it
 * chooses (topological order) and the t-th backward (reverse order). Stage 1
 * opens with the "loss node": grad(x_out) appears. Values are data tensors
 * made by block ops (S: live at a stage start), phantoms (RP: the one stage
 * whose run of the op saves it; it then lives until the op's backward) and
 * gradients (fixed by the backward order: constants). Memory is the chain of
 * Q columns (a node's peak, bounded by the peak budget); the kept budget
 * plus grad(x_out) is the bound of the loss node's Q. Frees are continuous F columns (disaggregated).
 * A solution is read out as "who runs where" only; the steps free every
 * tensor right after its last use, which never needs more memory than the
 * model counted. Every schedule is replayed by the simulator before use.
 * Stages never reorder backwards and the forward pass never recomputes: the
 * optimum is over that family of schedules (tests/test_ilp.c checks it
 * against an exhaustive search of that family, and of all plans).
 *
 * Around the ILP, per solve: budgets below a floor (what some step always
 * needs) or under a pair already proven empty answer at once; a schedule
 * proven optimal for larger budgets that fits is optimal here too; else the
 * fastest fitting schedule among those found by earlier solves of the block
 * and a greedy (local search over per-op modes: keep, recompute in every
 * stage that reads it, recompute once and keep) is the incumbent, and
 * lp_solve runs with its objective as a cutoff (status INFEASIBLE or 25
 * then proves it optimal). The stage-window LNS of lpsolve.md was tried on
 * the whole-graph form of gpt2-tiny, peer-gpt and mlp16 and never improved
 * the incumbent, so it is not here. */

#ifdef RKM_OMIT_SOLVER

struct rkm__ilp_block {
    int unused;
};

RKM__PRIVATE rkm_result rkm__ilp_block_create(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in,
                                        int32_t x_out, int is_last, rkm__ilp_block **out)
{
    (void)ops, (void)n_ops, (void)x_in, (void)x_out, (void)is_last;
    *out = NULL;
    return rkm__err(g->ctx, RKM_ERROR_UNSUPPORTED, "block ILP: built without lp_solve (RKM_OMIT_SOLVER)");
}

RKM__PRIVATE rkm_result rkm__ilp_block_solve(rkm__ilp_block *b, uint64_t peak_budget, uint64_t kept_budget,
                                       double time_limit_s, rkm_step **steps, size_t *n_fwd, size_t *n_bwd,
                                       rkm__ilp_stats *st, int *found)
{
    (void)b, (void)peak_budget, (void)kept_budget, (void)time_limit_s, (void)st;
    *steps = NULL;
    *n_fwd = *n_bwd = 0;
    *found = 0;
    /* No block, so no context for a message: rkm__ilp_block_create refused. */
    return RKM_ERROR_INTERNAL;
}

RKM__PRIVATE rkm_result rkm__ilp_block_create_copies(const rkm_graph *g, rkm__ilp_block **out)
{
    *out = NULL;
    return rkm__err(g->ctx, RKM_ERROR_UNSUPPORTED, "block ILP: built without lp_solve (RKM_OMIT_SOLVER)");
}

RKM__PRIVATE rkm_result rkm__ilp_block_solve_copies(rkm__ilp_block *b, uint64_t budget, double cutoff, double time_limit_s,
                                              rkm_step **steps, size_t *n_steps, uint8_t *offload, rkm__ilp_stats *st,
                                              int *found)
{
    (void)b, (void)budget, (void)cutoff, (void)time_limit_s, (void)offload, (void)st;
    *steps = NULL;
    *n_steps = 0;
    *found = 0;
    return RKM_ERROR_INTERNAL; /* no block: rkm__ilp_block_create_copies refused */
}

RKM__PRIVATE void rkm__ilp_block_destroy(rkm__ilp_block *b) { (void)b; }
RKM__PRIVATE void rkm__ilp_block_deadline(rkm__ilp_block *b, double deadline) { (void)b, (void)deadline; }
RKM__PRIVATE void rkm__ilp_block_watch(rkm__ilp_block *b, int (*stop)(void *user, double done), void *user)
{
    (void)b, (void)stop, (void)user;
}

#else /* !RKM_OMIT_SOLVER */

/* Without lp_solve's header, say what to do rather than only that a file
 * is missing (where the compiler can tell: __has_include, gcc 5, clang). */
#if defined(__has_include)
#if !__has_include(<lpsolve/lp_lib.h>)
#error "rockmate: <lpsolve/lp_lib.h> not found. Install lp_solve (Debian, Ubuntu: apt-get install liblpsolve55-dev libsuitesparse-dev) or build without the solver: cc -DRKM_OMIT_SOLVER -c rockmate.c (see rockmate.h, COMPILE-TIME SWITCHES)"
#endif
#endif
#include <lpsolve/lp_lib.h>

/* ---- the one lock around lp_solve ---------------------------------------- */

/* C11 threads where the C library has them; pthreads where it says it has
 * none (__STDC_NO_THREADS__), where <threads.h> is missing although the
 * macro is not defined (macOS: __has_include tells), or on request
 * (RKM_USE_PTHREADS). */
#if !defined(RKM_USE_PTHREADS) && !defined(__STDC_NO_THREADS__)
#if defined(__has_include)
#if __has_include(<threads.h>)
#define RKM__C11_THREADS 1
#endif
#else
#define RKM__C11_THREADS 1
#endif
#endif

#ifdef RKM__C11_THREADS
#include <threads.h>
static mtx_t rkm__ilp_mtx;
static once_flag rkm__ilp_once = ONCE_FLAG_INIT;
static void rkm__ilp_mtx_init(void) { (void)mtx_init(&rkm__ilp_mtx, mtx_plain); }
static void rkm__ilp_lock(void)
{
    call_once(&rkm__ilp_once, rkm__ilp_mtx_init);
    (void)mtx_lock(&rkm__ilp_mtx);
}
static void rkm__ilp_unlock(void) { (void)mtx_unlock(&rkm__ilp_mtx); }
#else
#include <pthread.h>
static pthread_mutex_t rkm__ilp_mtx = PTHREAD_MUTEX_INITIALIZER;
static void rkm__ilp_lock(void) { (void)pthread_mutex_lock(&rkm__ilp_mtx); }
static void rkm__ilp_unlock(void) { (void)pthread_mutex_unlock(&rkm__ilp_mtx); }
#endif

/* ---- the block ----------------------------------------------------------- */

#define RKM__ILP_ONE (-1) /* a variable reference that is the constant 1 */

/* Scratch in the ILP: a forward's transient bytes count as
 * rkm__fwd_ws_most on every run. The simulator counts the scratch only on
 * runs that keep no saved state, so the ILP over-counts a `save` run by at
 * most the scratch (<= phantom): its schedules stay within their budgets. */

struct rkm__ilp_block {
    rkm__ilp_shape shape;
    rkm__ilp_model model;
    rkm__ilp_memo memo;
    rkm__ilp_scratch scratch;
    double deadline; /* the caller's wall-clock stop (its planner's), INFINITY: none */
    int (*stop)(void *user, double done); /* the caller's own check, or NULL (rkm__ilp_work) */
    void *stop_user;
};

/* Solves stop at `deadline` (rkm__now()) too, besides their own limits:
 * the planner's time_limit. */
RKM__PRIVATE void rkm__ilp_block_deadline(rkm__ilp_block *b, double deadline) { b->deadline = deadline; }

/* Solves also stop where stop(user, done) answers non-zero, asked at every
 * check of their work (the whole-graph ILP's planner reports its progress
 * from there). */
RKM__PRIVATE void rkm__ilp_block_watch(rkm__ilp_block *b, int (*stop)(void *user, double done), void *user)
{
    b->stop = stop;
    b->stop_user = user;
}

static rkm__ilp_free *rkm__ilp_fend(const rkm__ilp_model *md, int32_t k)
{
    return md->fcand + (k + 1 < md->n_nodes ? md->node[k + 1].f0 : md->n_fcand);
}

static int rkm__ilp_sched_alloc(const rkm__ilp_shape *b, rkm__ilp_sched *s)
{
    s->r_bytes = rkm__ilp_rsize(b) + 1;
    s->n_save = (size_t)b->n + 1;
    s->r = rkm__calloc(b->ctx, s->r_bytes, 1);
    s->save = rkm__calloc(b->ctx, s->n_save, sizeof *s->save);
    return s->r && s->save;
}

static void rkm__ilp_sched_free(rkm_context *ctx, rkm__ilp_sched *s)
{
    rkm__free(ctx, s->r, s->r_bytes);
    rkm__free(ctx, s->save, s->n_save * sizeof *s->save);
    s->r = NULL;
    s->save = NULL;
}

/* ---- the model ----------------------------------------------------------- */

static int32_t rkm__ilp_R(const rkm__ilp_shape *b, const rkm__ilp_model *md, int32_t t, int32_t v)
{
    return t == 0 ? RKM__ILP_ONE : md->colR[(size_t)t * (size_t)b->n + (size_t)v];
}

static int32_t rkm__ilp_RP(const rkm__ilp_shape *b, const rkm__ilp_model *md, int32_t t, int32_t v)
{
    return md->colRP[(size_t)t * (size_t)b->n + (size_t)v];
}

static int32_t rkm__ilp_S(const rkm__ilp_shape *b, const rkm__ilp_model *md, int32_t t, int32_t i)
{
    return t >= 1 && t <= b->nb + 1 ? md->colS[(size_t)t * (size_t)b->nt + (size_t)i] : 0;
}

/* ---- copies (the whole graph with a copy link) ----
 *
 * rkm__ilp_block_create_copies adds to the whole-graph form a third choice
 * for every copy slot x (tensor i = x, or the saved state of op x - nt)
 * that a backward stage needs: spend the backward's start in host memory
 * (O). Its offload starts when the forward
 * makes it; D[x,k]: it is off the device from stage 0's node k on (after
 * its last stage-0 read, once its copy is done), by the forward's end at
 * the latest. It comes back for stage t by a prefetch: during stage t - 1's
 * backward (P[BWD][t,x]: live from that backward's start), during all of
 * stage t - 1 (P[STAGE]: live from its start, the recomputations' time to
 * hide behind too), or at its end, the compute stream waiting for it
 * (P[WAIT]: live from t's start, its copy's time added): a
 * tensor as often as stages need it, a saved state once, for its backward.
 * Time is the recomputations' and the compute stream's waits: P[WAIT]'s,
 * WF[k] before forward node k (k = n: the loss) for offloads, W[t] at stage
 * t's end for its prefetches. The device-to-host stream is one machine
 * with release times (each offload's node end) and deadlines (D's node
 * start), preemptive: for every window from a slot's release to a node
 * start, the offloads released in it and due by then fit its compute time
 * and the waits in it (that is exact for preemptive schedules). The
 * read-out keeps the recomputations and the set of slots offloaded; the
 * offload pass places the copies on that schedule, those slots first
 * (offload.c), and the simulator measures it. */

static int32_t rkm__ilp_O(const rkm__ilp_model *md, int32_t x) { return md->colO ? md->colO[x] : 0; }

/* D[x,k] (k < n), or O[x] at k = n: off the device by node k. */
static int32_t rkm__ilp_D(const rkm__ilp_shape *b, const rkm__ilp_model *md, int32_t x, int32_t k)
{
    if (!md->colD || k < 0) return 0;
    return k >= b->n ? md->colO[x] : md->colD[(size_t)x * (size_t)b->n + (size_t)k];
}

/* P[kind][t,x] (RKM__ILP_BACK_*). */
static int32_t rkm__ilp_P(const rkm__ilp_shape *b, const rkm__ilp_model *md, int kind, int32_t t, int32_t x)
{
    const int32_t *col = md->colP[kind];
    return col && t >= 1 && t <= b->nb + 1 ? col[(size_t)t * (size_t)(b->nt + b->n) + (size_t)x] : 0;
}

/* The stages slot x may come back for: lo..hi. */
static void rkm__ilp_back_for(const rkm__ilp_shape *b, int32_t x, int32_t *lo, int32_t *hi)
{
    *lo = x < b->nt ? 1 : b->st[x - b->nt];
    *hi = x < b->nt ? b->need_t[x] : *lo;
}

/* P[WAIT][1,i]: back for stage 1, after the loss node (0: none). */
static int32_t rkm__ilp_P1(const rkm__ilp_shape *b, const rkm__ilp_model *md, int32_t i)
{
    return rkm__ilp_P(b, md, RKM__ILP_BACK_WAIT, 1, i);
}

/* Slot x's graph-wide copy slot (docs: rkm__slot_bytes), its producer in
 * stage 0, the first node it may be freed before (after its last touch
 * there), its bytes and its copy's time in tscale units. */
static int32_t rkm__ilp_cslot(const rkm__ilp_shape *b, int32_t x)
{
    return x < b->nt ? b->tg[x] : (int32_t)b->g->n_tensors + b->op[x - b->nt];
}
static int32_t rkm__ilp_cprod(const rkm__ilp_shape *b, int32_t x) { return x < b->nt ? b->tprod[x] : x - b->nt; }
static int32_t rkm__ilp_cfirst(const rkm__ilp_shape *b, int32_t x)
{
    return x < b->nt ? b->last0[x] + 1 : x - b->nt + 1;
}
static double rkm__ilp_cbytes(const rkm__ilp_shape *b, int32_t x) /* in mscale units */
{
    return (double)rkm__slot_bytes(b->g, rkm__ilp_cslot(b, x)) / b->mscale;
}
static double rkm__ilp_ctime(const rkm__ilp_shape *b, int32_t x, double bytes_per_second)
{
    return rkm__copy_seconds(b->g, rkm__ilp_cslot(b, x), bytes_per_second) / b->tscale;
}

/* Whether slot x gets copy columns: a backward stage needs it. */
static int rkm__ilp_copyable(const rkm__ilp_shape *b, int32_t x)
{
    return x < b->nt ? b->need_t[x] >= 1 && b->tg[x] != b->x_out
                     : rkm__ilp_phantom(b, x - b->nt) && b->st[x - b->nt] >= 1;
}

/* The copy columns, numbered after the others (c: the last so far). */
static void rkm__ilp_copy_columns(const rkm__ilp_shape *b, rkm__ilp_model *md, int32_t *c)
{
    for (int32_t x = 0; x < b->nt + b->n; x++) {
        if (!rkm__ilp_copyable(b, x)) continue;
        md->colO[x] = ++*c;
        for (int32_t k = rkm__ilp_cfirst(b, x); k < b->n; k++) md->colD[(size_t)x * (size_t)b->n + (size_t)k] = ++*c;
        int32_t lo, hi;
        rkm__ilp_back_for(b, x, &lo, &hi);
        for (int32_t t = lo; t <= hi; t++)
            for (int kind = 0; kind < RKM__ILP_BACK_KINDS; kind++)
                if (t > 1 || kind == RKM__ILP_BACK_WAIT) /* for stage 1: after the loss node */
                    md->colP[kind][(size_t)t * (size_t)(b->nt + b->n) + (size_t)x] = ++*c;
    }
    for (int32_t t = 1; t < b->nb; t++) md->colW[t] = ++*c;
    for (int32_t k = 1; k <= b->n; k++) md->colWF[k] = ++*c;
}

/* Append a node (and its free candidates: block tensors it reads or makes,
 * unless the stage's backward is sure to read them later). */
static void rkm__ilp_add_node(const rkm__ilp_shape *b, rkm__ilp_model *md, int32_t t, int kind, int32_t v, int32_t *c,
                              int32_t *nn, int32_t *nf)
{
    const rkm_graph *g = b->g;
    int32_t q = ++*c;
    if (md->node) md->node[*nn] = (rkm__ilp_node){kind, v, q, *nf};
    ++*nn;
    if (t == 0) return; /* stage 0 frees are fixed by S[1] */
    const rkm__op *o = v >= 0 ? &g->ops[b->op[v]] : NULL;
    for (int32_t l = 0; l < (kind == RKM__ILP_NODE_FWD ? 2 : 1); l++) {
        const int32_t *list = kind == RKM__ILP_NODE_LOSS ? &b->x_out
                              : kind == RKM__ILP_NODE_BWD ? o->saved
                              : l == 0                    ? o->in
                                                          : o->out;
        int32_t len = kind == RKM__ILP_NODE_LOSS ? 1
                      : kind == RKM__ILP_NODE_BWD ? o->n_saved
                      : l == 0                    ? o->n_in
                                                  : o->n_out;
        for (int32_t k = 0; k < len; k++) {
            int32_t i = b->lt[list[k]];
            if (i < 0 || (kind == RKM__ILP_NODE_FWD && rkm__ilp_bwd_reads(b, t, i))) continue;
            int32_t f = ++*c;
            if (md->node) md->fcand[*nf] = (rkm__ilp_free){i, f};
            ++*nf;
        }
    }
}

/* Give every variable its column; list each stage's nodes. Counting pass
 * when md->node is NULL (column numbers are the same in both passes). */
static void rkm__ilp_columns(const rkm__ilp_shape *b, rkm__ilp_model *md)
{
    int32_t c = 0, nn = 0, nf = 0, xo = b->lt[b->x_out];
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++)
            if (b->need_o[v] >= t) md->colR[(size_t)t * (size_t)b->n + (size_t)v] = ++c;
    for (int32_t t = 0; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++)
            if (rkm__ilp_phantom(b, v) && t <= b->st[v]) md->colRP[(size_t)t * (size_t)b->n + (size_t)v] = ++c;
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t i = 0; i < b->nt; i++)
            if (t <= b->need_t[i])
                md->colS[(size_t)t * (size_t)b->nt + (size_t)i] = t == 1 && i == xo ? RKM__ILP_ONE : ++c;
    for (int32_t t = 0; t <= b->nb; t++) {
        if (md->node) md->node_off[t] = nn;
        if (t == 1) rkm__ilp_add_node(b, md, t, RKM__ILP_NODE_LOSS, -1, &c, &nn, &nf);
        for (int32_t v = 0; v < b->n; v++)
            if (rkm__ilp_R(b, md, t, v)) rkm__ilp_add_node(b, md, t, RKM__ILP_NODE_FWD, v, &c, &nn, &nf);
        if (t >= 1) rkm__ilp_add_node(b, md, t, RKM__ILP_NODE_BWD, b->bop[t], &c, &nn, &nf);
    }
    if (md->node) md->node_off[b->nb + 1] = nn;
    if (md->colO) rkm__ilp_copy_columns(b, md, &c);
    md->ncols = c;
    md->n_nodes = nn;
    md->n_fcand = nf;
}

/* The gathered model: an entry (a row's column and coefficient), and a row
 * (its first entry, type LE, GE or EQ, and right-hand side). */
typedef struct rkm__ilp_entry {
    int col;
    REAL val;
} rkm__ilp_entry;
typedef struct rkm__ilp_rowhead {
    size_t start;
    int type;
    REAL rhs;
} rkm__ilp_rowhead;

/* A row being built: coefficients merged per column, constants apart. */
typedef struct rkm__ilp_row {
    rkm_context *ctx;
    int *col;
    REAL *val;
    double *dense;  /* [ncols+1] */
    uint8_t *seen;  /* [ncols+1] */
    int n;
    double k;       /* constant part of the left-hand side */
    int bad;        /* a row without columns that cannot hold */
    int nomem;      /* the gathered rows could not grow */
    /* The rows, gathered whole before lp_solve sees any (rkm__ilp_load):
     * lp_solve keeps the column bounds after the rows in one array, so a
     * row added to a model that has its columns moves them all, and that
     * was half of rockmate's planning time on a 60-op block. */
    rkm__ilp_entry *ent; /* row after row */
    size_t n_ent, cap_ent;
    rkm__ilp_rowhead *rows;
    size_t n_rows, cap_rows;
    REAL *obj;      /* [ncols+1] objective coefficients */
} rkm__ilp_row;

/* Add coef * ref (a column, RKM__ILP_ONE, or 0: nothing). */
static void rkm__ilp_term(rkm__ilp_row *w, int32_t ref, double coef)
{
    if (ref == RKM__ILP_ONE) w->k += coef;
    if (ref <= 0) return;
    if (!w->seen[ref]) {
        w->seen[ref] = 1;
        w->col[w->n++] = ref;
    }
    w->dense[ref] += coef;
}

/* Gather the row `lhs type rhs` and reset the builder. */
static void rkm__ilp_emit_row(rkm__ilp_row *w, int type, double rhs)
{
    int m = 0;
    for (int j = 0; j < w->n; j++) {
        int c = w->col[j];
        if (w->dense[c] != 0) {
            w->col[m] = c;
            w->val[m++] = w->dense[c];
        }
        w->dense[c] = 0;
        w->seen[c] = 0;
    }
    rhs -= w->k;
    if (m == 0) {
        if ((type == LE && rhs < -1e-9) || (type == GE && rhs > 1e-9) || (type == EQ && fabs(rhs) > 1e-9)) w->bad = 1;
    } else if (!rkm__reserve(w->ctx, (void **)&w->ent, &w->cap_ent, w->n_ent + (size_t)m, sizeof *w->ent) ||
               !rkm__reserve(w->ctx, (void **)&w->rows, &w->cap_rows, w->n_rows + 1, sizeof *w->rows)) {
        w->nomem = 1;
    } else {
        w->rows[w->n_rows++] = (rkm__ilp_rowhead){w->n_ent, type, rhs};
        for (int j = 0; j < m; j++) w->ent[w->n_ent++] = (rkm__ilp_entry){w->col[j], w->val[j]};
    }
    w->n = 0;
    w->k = 0;
}

/* Stage of node k. */
static int32_t rkm__ilp_stage_of(const rkm__ilp_model *md, int32_t k)
{
    int32_t t = 0;
    while (k >= md->node_off[t + 1]) t++;
    return t;
}

/* Row sets of the model (see the comment at the top of the section).
 * Dependencies, and recompute only what is not live. */
static void rkm__ilp_rows_deps(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    const rkm_graph *g = b->g;
    for (int32_t k = md->node_off[1]; k < md->n_nodes; k++) {
        const rkm__ilp_node *nd = &md->node[k];
        if (nd->kind == RKM__ILP_NODE_LOSS) continue;
        int32_t t = rkm__ilp_stage_of(md, k);
        const rkm__op *o = &g->ops[b->op[nd->v]];
        int fwd = nd->kind == RKM__ILP_NODE_FWD;
        const int32_t *list = fwd ? o->in : o->saved;
        for (int32_t j = 0; j < (fwd ? o->n_in : o->n_saved); j++) {
            int32_t i = b->lt[list[j]];
            if (i < 0) continue;
            /* fwd: R[t,v] <= R[t,p] + S[t,i];  bwd: R[t,p] + S[t,i] >= 1 */
            if (fwd) rkm__ilp_term(w, rkm__ilp_R(b, md, t, nd->v), 1);
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, b->tprod[i]), fwd ? -1 : 1);
            rkm__ilp_term(w, rkm__ilp_S(b, md, t, i), fwd ? -1 : 1);
            if (t == 1) rkm__ilp_term(w, rkm__ilp_P1(b, md, i), fwd ? -1 : 1);
            rkm__ilp_emit_row(w, fwd ? LE : GE, fwd ? 0 : 1);
        }
        if (!fwd) continue;
        for (int32_t j = 0; j < o->n_out; j++) {
            /* recompute only what is not live: R[t,v] + S[t,T] <= 1; but the
             * loss node may free x_out before stage 1 recomputes it (counted
             * as new memory: exact or more) */
            if (t == 1 && o->out[j] == b->x_out) continue;
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, nd->v), 1);
            rkm__ilp_term(w, rkm__ilp_S(b, md, t, b->lt[o->out[j]]), 1);
            rkm__ilp_emit_row(w, LE, 1);
        }
    }
}

/* Checkpoint continuity and the phantoms' save runs. */
static void rkm__ilp_rows_carry(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    for (int32_t i = 0; i < b->nt; i++) /* S[t+1,i] <= S[t,i] + R[t,p] */
        for (int32_t t = 1; t < b->need_t[i]; t++) {
            rkm__ilp_term(w, rkm__ilp_S(b, md, t + 1, i), 1);
            rkm__ilp_term(w, rkm__ilp_S(b, md, t, i), -1);
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, b->tprod[i]), -1);
            for (int kind = 0; kind < RKM__ILP_BACK_KINDS; kind++) /* or back from host memory */
                rkm__ilp_term(w, rkm__ilp_P(b, md, kind, t + 1, i), -1);
            if (t == 1) rkm__ilp_term(w, rkm__ilp_P1(b, md, i), -1);
            rkm__ilp_emit_row(w, LE, 0);
        }
    for (int32_t v = 0; v < b->n; v++) { /* one save run, on a run: sum_t RP[t,v] = 1, RP <= R */
        if (!rkm__ilp_phantom(b, v)) continue;
        for (int32_t t = 0; t <= b->st[v]; t++) rkm__ilp_term(w, rkm__ilp_RP(b, md, t, v), 1);
        rkm__ilp_emit_row(w, EQ, 1);
        for (int32_t t = 1; t <= b->st[v]; t++) {
            rkm__ilp_term(w, rkm__ilp_RP(b, md, t, v), 1);
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, v), -1);
            rkm__ilp_emit_row(w, LE, 0);
        }
        /* dominance: an op recomputed in its own backward's stage saves there */
        for (int32_t t = 0; t < b->st[v]; t++) rkm__ilp_term(w, rkm__ilp_RP(b, md, t, v), 1);
        rkm__ilp_term(w, rkm__ilp_R(b, md, b->st[v], v), 1);
        rkm__ilp_emit_row(w, LE, 1);
    }
}

/* Is later node j (same stage) a recomputation reading block tensor i? */
static int rkm__ilp_node_reads(const rkm__ilp_shape *b, const rkm__ilp_node *nd, int32_t i)
{
    if (nd->kind != RKM__ILP_NODE_FWD) return 0;
    const rkm__op *o = &b->g->ops[b->op[nd->v]];
    return rkm__list_has(o->in, o->n_in, b->tg[i]);
}

/* F[t,i,k] <= R[t,k];  F + S[t+1,i] <= 1;  F + R[t,j] <= 1 for later readers j.
 * The loss node may free x_out only if stage 1 makes it again before the
 * backward reads it or stage 2 keeps it: there the hazards allow R[1,p]. */
static void rkm__ilp_rows_frees(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    for (int32_t k = md->node_off[1]; k < md->n_nodes; k++) {
        const rkm__ilp_node *nd = &md->node[k];
        int32_t t = rkm__ilp_stage_of(md, k), end = md->node_off[t + 1];
        int loss = nd->kind == RKM__ILP_NODE_LOSS;
        int32_t remake = loss ? rkm__ilp_R(b, md, 1, b->tprod[b->lt[b->x_out]]) : 0;
        for (const rkm__ilp_free *f = md->fcand + nd->f0; f < rkm__ilp_fend(md, k); f++) {
            if (nd->kind == RKM__ILP_NODE_FWD || (loss && rkm__ilp_bwd_reads(b, 1, f->i))) {
                rkm__ilp_term(w, f->col, 1);
                rkm__ilp_term(w, loss ? remake : rkm__ilp_R(b, md, t, nd->v), -1);
                rkm__ilp_emit_row(w, LE, 0);
            }
            if (rkm__ilp_S(b, md, t + 1, f->i)) {
                rkm__ilp_term(w, f->col, 1);
                rkm__ilp_term(w, rkm__ilp_S(b, md, t + 1, f->i), 1);
                rkm__ilp_term(w, remake, -1);
                rkm__ilp_emit_row(w, LE, 1);
            }
            for (int32_t j = k + 1; j < end; j++)
                if (rkm__ilp_node_reads(b, &md->node[j], f->i)) {
                    rkm__ilp_term(w, f->col, 1);
                    rkm__ilp_term(w, rkm__ilp_R(b, md, t, md->node[j].v), 1);
                    rkm__ilp_emit_row(w, LE, 1);
                }
        }
    }
}

/* Memory: Q[k] = what the previous node left + what node k makes + its
 * workspace. Stage 0 frees each tensor after its last stage-0 use unless
 * kept (S[1]); later stages start from what is kept. In mscale units. */
static void rkm__ilp_rows_memory(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    const rkm_graph *g = b->g;
    double ms = b->mscale;
    for (int32_t k = 0; k < md->n_nodes; k++) {
        const rkm__ilp_node *nd = &md->node[k];
        int32_t t = rkm__ilp_stage_of(md, k), v = nd->v;
        const rkm__op *o = v >= 0 ? &g->ops[b->op[v]] : NULL;
        rkm__ilp_term(w, nd->q, 1);
        if (k > md->node_off[t]) { /* what node k-1 left */
            const rkm__ilp_node *pv = &md->node[k - 1];
            const rkm__op *po = pv->v >= 0 ? &g->ops[b->op[pv->v]] : NULL;
            rkm__ilp_term(w, pv->q, -1);
            if (pv->kind == RKM__ILP_NODE_FWD)
                rkm__ilp_term(w, rkm__ilp_R(b, md, t, pv->v), (double)rkm__fwd_ws_most(po) / ms);
            if (pv->kind == RKM__ILP_NODE_BWD)
                rkm__ilp_term(w, RKM__ILP_ONE, ((double)po->bwd_ws + (double)b->gfree[t] + (double)po->phantom) / ms);
            for (const rkm__ilp_free *f = md->fcand + pv->f0; t > 0 && f < rkm__ilp_fend(md, k - 1); f++)
                rkm__ilp_term(w, f->col, (double)g->tensors[b->tg[f->i]].bytes / ms);
            for (int32_t i = 0; t == 0 && i < b->nt; i++)
                if (b->last0[i] == pv->v) { /* freed unless kept or offloaded */
                    rkm__ilp_term(w, RKM__ILP_ONE, (double)g->tensors[b->tg[i]].bytes / ms);
                    rkm__ilp_term(w, rkm__ilp_S(b, md, 1, i), -(double)g->tensors[b->tg[i]].bytes / ms);
                    rkm__ilp_term(w, rkm__ilp_O(md, i), -(double)g->tensors[b->tg[i]].bytes / ms);
                }
            for (int32_t x = 0; t == 0 && md->colO && x < b->nt + b->n; x++) { /* offloads done by node v */
                rkm__ilp_term(w, rkm__ilp_D(b, md, x, v), rkm__ilp_cbytes(b, x));
                rkm__ilp_term(w, rkm__ilp_D(b, md, x, v - 1), -rkm__ilp_cbytes(b, x));
            }
        } else { /* the stage start */
            rkm__ilp_term(w, RKM__ILP_ONE, -(double)(b->static_bytes + b->gstart[t]) / ms);
            for (int32_t i = 0; i < b->nt; i++)
                rkm__ilp_term(w, rkm__ilp_S(b, md, t, i), -(double)g->tensors[b->tg[i]].bytes / ms);
            for (int32_t u = 0; u < b->n; u++) {
                for (int32_t t0 = 0; t0 < t && rkm__ilp_phantom(b, u) && t <= b->st[u]; t0++)
                    rkm__ilp_term(w, rkm__ilp_RP(b, md, t0, u), -(double)g->ops[b->op[u]].phantom / ms);
                if (t && (t < b->st[u] || t == 1)) /* in host memory until it comes back */
                    rkm__ilp_term(w, rkm__ilp_O(md, b->nt + u), (double)g->ops[b->op[u]].phantom / ms);
            }
            for (int32_t x = 0; t && md->colO && x < b->nt + b->n; x++) /* prefetches during the whole stage */
                rkm__ilp_term(w, rkm__ilp_P(b, md, RKM__ILP_BACK_STAGE, t + 1, x), -rkm__ilp_cbytes(b, x));
        }
        if (nd->kind == RKM__ILP_NODE_LOSS) rkm__ilp_term(w, RKM__ILP_ONE, -(double)g->tensors[b->x_out].bytes / ms);
        if (nd->kind == RKM__ILP_NODE_BWD) rkm__ilp_term(w, RKM__ILP_ONE, -((double)b->gnew[t] + (double)o->bwd_ws) / ms);
        for (int32_t x = 0; k == md->node_off[1] + 1 && md->colO && x < b->nt + b->n; x++) /* back after the loss */
            rkm__ilp_term(w, rkm__ilp_P1(b, md, x), -rkm__ilp_cbytes(b, x));
        for (int32_t x = 0; nd->kind == RKM__ILP_NODE_BWD && md->colO && x < b->nt + b->n; x++) /* its prefetches */
            rkm__ilp_term(w, rkm__ilp_P(b, md, RKM__ILP_BACK_BWD, t + 1, x), -rkm__ilp_cbytes(b, x));
        if (nd->kind == RKM__ILP_NODE_FWD) {
            double made = (double)rkm__fwd_ws_most(o);
            for (int32_t j = 0; j < o->n_out; j++) made += (double)g->tensors[o->out[j]].bytes;
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, v), -made / ms);
            if (rkm__ilp_phantom(b, v) && t <= b->st[v])
                rkm__ilp_term(w, rkm__ilp_RP(b, md, t, v), -(double)o->phantom / ms);
        }
        rkm__ilp_emit_row(w, EQ, 0);
    }
}

/* Dominance: keep a tensor only if a stage reads or carries it; recompute an
 * op only if something later in the stage reads it, carries it or its
 * phantom is saved. They cut equivalent schedules, not the optimum. */
static void rkm__ilp_rows_dominance(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    const rkm_graph *g = b->g;
    int32_t xo = b->lt[b->x_out];
    for (int32_t t = 1; t <= b->nb; t++) {
        for (int32_t i = 0; i < b->nt; i++) {
            if (rkm__ilp_S(b, md, t, i) <= 0 || rkm__ilp_bwd_reads(b, t, i) || (t == 1 && i == xo)) continue;
            rkm__ilp_term(w, rkm__ilp_S(b, md, t, i), 1);
            for (int32_t j = b->rd_off[i]; j < b->rd_off[i + 1]; j++)
                rkm__ilp_term(w, rkm__ilp_R(b, md, t, b->rd[j]), -1);
            rkm__ilp_term(w, rkm__ilp_S(b, md, t + 1, i), -1);
            rkm__ilp_emit_row(w, LE, 0);
        }
        for (int32_t v = 0; v < b->n; v++) {
            if (!rkm__ilp_R(b, md, t, v)) continue;
            const rkm__op *o = &g->ops[b->op[v]];
            int sure = 0;
            for (int32_t k = 0; k < o->n_out; k++) sure |= rkm__ilp_bwd_reads(b, t, b->lt[o->out[k]]);
            if (sure) continue;
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, v), 1);
            for (int32_t k = 0; k < o->n_out; k++) {
                int32_t i = b->lt[o->out[k]];
                for (int32_t j = b->rd_off[i]; j < b->rd_off[i + 1]; j++)
                    rkm__ilp_term(w, rkm__ilp_R(b, md, t, b->rd[j]), -1);
                rkm__ilp_term(w, rkm__ilp_S(b, md, t + 1, i), -1);
            }
            rkm__ilp_term(w, rkm__ilp_RP(b, md, t, v), -1);
            rkm__ilp_emit_row(w, LE, 0);
        }
    }
}

/* The device-to-host stream: for every release a (a slot's producer) and
 * node start k after it, the offloads released from a on and done by k
 * fit the compute time between (rows that cannot bind are left out). */
static void rkm__ilp_rows_d2h(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    double bw = b->g->copy.d2h_bytes_per_second;
    int32_t nx = b->nt + b->n;
    for (int32_t a = 0; a < b->n; a++) {
        int released = 0;
        for (int32_t x = 0; x < nx && !released; x++) released = rkm__ilp_O(md, x) && rkm__ilp_cprod(b, x) == a;
        for (int32_t k = a + 1; released && k <= b->n; k++) {
            double window = b->fstart[k] - b->fstart[a + 1], total = 0;
            for (int32_t x = 0; x < nx; x++)
                if (rkm__ilp_cprod(b, x) >= a && rkm__ilp_D(b, md, x, k)) total += rkm__ilp_ctime(b, x, bw);
            if (total <= window) continue;
            for (int32_t x = 0; x < nx; x++)
                if (rkm__ilp_cprod(b, x) >= a) rkm__ilp_term(w, rkm__ilp_D(b, md, x, k), rkm__ilp_ctime(b, x, bw));
            for (int32_t j = a + 1; j <= k; j++) rkm__ilp_term(w, md->colWF[j], -1); /* waits widen it */
            rkm__ilp_emit_row(w, LE, window);
        }
    }
}

/* The host-to-device stream: what comes back for stage t + 1 is copied
 * while stage t's backward runs, or all of stage t (its recomputations
 * too), beyond that the compute stream waits (W[t]). */
static void rkm__ilp_rows_h2d(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    const rkm_graph *g = b->g;
    double bw = g->copy.h2d_bytes_per_second;
    for (int32_t t = 1; t < b->nb; t++)
        for (int stage = 0; stage < 2; stage++) {
            for (int32_t x = 0; x < b->nt + b->n; x++) {
                rkm__ilp_term(w, rkm__ilp_P(b, md, RKM__ILP_BACK_BWD, t + 1, x), rkm__ilp_ctime(b, x, bw));
                if (stage) rkm__ilp_term(w, rkm__ilp_P(b, md, RKM__ILP_BACK_STAGE, t + 1, x), rkm__ilp_ctime(b, x, bw));
            }
            for (int32_t v = 0; stage && v < b->n; v++)
                rkm__ilp_term(w, rkm__ilp_R(b, md, t, v), -g->ops[b->op[v]].fwd / b->tscale);
            rkm__ilp_term(w, md->colW[t], -1);
            rkm__ilp_emit_row(w, LE, g->ops[b->op[b->bop[t]]].bwd / b->tscale);
        }
}

/* The copy rows (see "copies" above): D only grows, to O; O only where
 * the tensor is not kept on the device, or the saved state made in stage
 * 0; P only from host memory; the two streams' windows. */
static void rkm__ilp_rows_copies(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    for (int32_t x = 0; x < b->nt + b->n; x++) {
        int32_t o = rkm__ilp_O(md, x);
        if (!o) continue;
        for (int32_t k = rkm__ilp_cfirst(b, x); k < b->n; k++) {
            if (!rkm__ilp_D(b, md, x, k)) continue;
            rkm__ilp_term(w, rkm__ilp_D(b, md, x, k), 1);
            rkm__ilp_term(w, rkm__ilp_D(b, md, x, k + 1), -1);
            rkm__ilp_emit_row(w, LE, 0);
        }
        rkm__ilp_term(w, o, 1);
        if (x < b->nt) rkm__ilp_term(w, rkm__ilp_S(b, md, 1, x), 1);
        else rkm__ilp_term(w, rkm__ilp_RP(b, md, 0, x - b->nt), -1);
        rkm__ilp_emit_row(w, LE, x < b->nt ? 1 : 0);
        int32_t lo, hi;
        rkm__ilp_back_for(b, x, &lo, &hi);
        for (int32_t t = lo; t <= hi; t++) { /* a saved state comes back once, a tensor from its host copy */
            for (int kind = 0; kind < RKM__ILP_BACK_KINDS; kind++) rkm__ilp_term(w, rkm__ilp_P(b, md, kind, t, x), 1);
            if (x < b->nt) {
                rkm__ilp_term(w, o, -1);
                rkm__ilp_emit_row(w, LE, 0);
            }
        }
        if (x >= b->nt) {
            rkm__ilp_term(w, o, -1);
            rkm__ilp_emit_row(w, EQ, 0);
        }
    }
    rkm__ilp_rows_d2h(b, md, w);
    rkm__ilp_rows_h2d(b, md, w);
}

/* ---- lp_solve ------------------------------------------------------------ */

static int __WINAPI rkm__ilp_abortfn(lprec *lp, void *work)
{
    rkm__ilp_work *u = work;
    (void)lp;
    u->calls++;
    return rkm__ilp_spent(u, 0) ? TRUE : FALSE;
}

static void __WINAPI rkm__ilp_logfn(lprec *lp, void *ctx, char *buf)
{
    (void)lp;
    rkm__log((rkm_context *)ctx, RKM_LOG_DEBUG, "lp_solve: %s", buf);
}

/* The objective of a schedule: recomputation time in tscale units. */
static double rkm__ilp_obj(const rkm__ilp_shape *b, const rkm__ilp_sched *s)
{
    double z = 0;
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++)
            if (s->r[(size_t)t * (size_t)b->n + (size_t)v]) z += b->g->ops[b->op[v]].fwd / b->tscale;
    return z;
}

/* The row builder's arrays, for nc - 1 columns. 0: no memory. */
static int rkm__ilp_row_init(rkm_context *ctx, rkm__ilp_row *w, size_t nc)
{
    memset(w, 0, sizeof *w);
    w->ctx = ctx;
    w->col = rkm__alloc(ctx, nc * sizeof *w->col);
    w->val = rkm__alloc(ctx, nc * sizeof *w->val);
    w->dense = rkm__calloc(ctx, nc, sizeof *w->dense);
    w->seen = rkm__calloc(ctx, nc, 1);
    w->obj = rkm__calloc(ctx, nc, sizeof *w->obj);
    return w->col && w->val && w->dense && w->seen && w->obj;
}

static void rkm__ilp_row_free(rkm_context *ctx, rkm__ilp_row *w, size_t nc)
{
    rkm__free(ctx, w->col, nc * sizeof *w->col);
    rkm__free(ctx, w->val, nc * sizeof *w->val);
    rkm__free(ctx, w->dense, nc * sizeof *w->dense);
    rkm__free(ctx, w->seen, nc);
    rkm__free(ctx, w->obj, nc * sizeof *w->obj);
    rkm__free(ctx, w->ent, w->cap_ent * sizeof *w->ent);
    rkm__free(ctx, w->rows, w->cap_rows * sizeof *w->rows);
}

/* The objective: the time of the forwards run in stages 1.., in w->obj. */
static void rkm__ilp_objective(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++) {
            int32_t c = rkm__ilp_R(b, md, t, v);
            if (c > 0) w->obj[c] += b->g->ops[b->op[v]].fwd / b->tscale;
        }
    for (int32_t t = 1; md->colW && t < b->nb; t++) w->obj[md->colW[t]] = 1;
    for (int32_t k = 1; md->colWF && k <= b->n; k++) w->obj[md->colWF[k]] = 1;
    for (int32_t t = 0; md->colO && t <= b->nb + 1; t++)
        for (int32_t x = 0; x < b->nt + b->n; x++)
            if (rkm__ilp_P(b, md, RKM__ILP_BACK_WAIT, t, x) > 0)
                w->obj[rkm__ilp_P(b, md, RKM__ILP_BACK_WAIT, t, x)] = rkm__ilp_ctime(b, x, b->g->copy.h2d_bytes_per_second);
}

/* Binary columns and the bounds of the F columns. */
static void rkm__ilp_set_columns(const rkm__ilp_shape *b, rkm__ilp_model *md)
{
    lprec *lp = md->lp;
    for (size_t j = 0; j < (size_t)(b->nb + 1) * (size_t)b->n; j++) {
        if (md->colR[j] > 0) set_binary(lp, md->colR[j], TRUE);
        if (md->colRP[j] > 0) set_binary(lp, md->colRP[j], TRUE);
    }
    for (size_t j = 0; j < (size_t)(b->nb + 2) * (size_t)b->nt; j++)
        if (md->colS[j] > 0) set_binary(lp, md->colS[j], TRUE);
    for (int32_t f = 0; f < md->n_fcand; f++) set_upbo(lp, md->fcand[f].col, 1);
    for (int32_t x = 0; md->colO && x < b->nt + b->n; x++) {
        for (int32_t k = 0; k < b->n && rkm__ilp_O(md, x); k++)
            if (rkm__ilp_D(b, md, x, k) > 0) set_binary(lp, rkm__ilp_D(b, md, x, k), TRUE);
        if (rkm__ilp_O(md, x) > 0) set_binary(lp, rkm__ilp_O(md, x), TRUE);
    }
    for (int32_t t = 0; md->colO && t <= b->nb + 1; t++)
        for (int32_t x = 0; x < b->nt + b->n; x++)
            for (int kind = 0; kind < RKM__ILP_BACK_KINDS; kind++)
                if (rkm__ilp_P(b, md, kind, t, x) > 0) set_binary(lp, rkm__ilp_P(b, md, kind, t, x), TRUE);
}

/* The gathered rows and objective as columns (row 0 the objective), each
 * in row order: ent[at[c] .. at[c + 1]). 0: no memory. */
static int rkm__ilp_by_column(const rkm__ilp_row *w, size_t nc, size_t *at, int *row, REAL *val)
{
    size_t *fill = rkm__calloc(w->ctx, nc, sizeof *fill);
    if (!fill) return 0;
    memset(at, 0, (nc + 1) * sizeof *at);
    for (size_t c = 1; c < nc; c++) at[c + 1] = w->obj[c] != 0;
    for (size_t e = 0; e < w->n_ent; e++) at[w->ent[e].col + 1]++;
    for (size_t c = 1; c < nc; c++) at[c + 1] += at[c];
    for (size_t c = 1; c < nc; c++) {
        fill[c] = at[c];
        if (w->obj[c] != 0) row[fill[c]] = 0, val[fill[c]++] = w->obj[c];
    }
    for (size_t i = 0; i < w->n_rows; i++)
        for (size_t e = w->rows[i].start; e < (i + 1 < w->n_rows ? w->rows[i + 1].start : w->n_ent); e++) {
            size_t c = (size_t)w->ent[e].col;
            row[fill[c]] = (int)i + 1;
            val[fill[c]++] = w->ent[e].val;
        }
    rkm__free(w->ctx, fill, nc * sizeof *fill);
    return 1;
}

/* A new lprec from the gathered model (under the lock): the rows first,
 * then each column appended at the end, which moves nothing. */
static rkm_result rkm__ilp_load(const rkm__ilp_shape *b, rkm__ilp_model *md, const rkm__ilp_row *w)
{
    size_t nc = (size_t)md->ncols + 1, ne = w->n_ent + nc;
    size_t *at = rkm__alloc(b->ctx, (nc + 1) * sizeof *at);
    int *row = rkm__alloc(b->ctx, ne * sizeof *row);
    REAL *val = rkm__alloc(b->ctx, ne * sizeof *val);
    rkm_result r = RKM_OK;
    if (!at || !row || !val || !rkm__ilp_by_column(w, nc, at, row, val))
        r = rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the model");
    rkm__ilp_lock();
    if (!r && !(md->lp = make_lp((int)w->n_rows, 0))) r = rkm__ilp_err(b, RKM_ERROR_NOMEM, "lp_solve: out of memory");
    if (!r) {
        int ok = 1;
        set_outputfile(md->lp, "");
        set_verbose(md->lp, NEUTRAL);
        put_logfunc(md->lp, rkm__ilp_logfn, b->ctx);
        for (size_t i = 0; i < w->n_rows && ok; i++)
            ok = set_constr_type(md->lp, (int)i + 1, w->rows[i].type) && set_rh(md->lp, (int)i + 1, w->rows[i].rhs);
        for (size_t c = 1; c < nc && ok; c++) ok = add_columnex(md->lp, (int)(at[c + 1] - at[c]), val + at[c], row + at[c]);
        if (ok) rkm__ilp_set_columns(b, md);
        set_minim(md->lp);
        set_bb_floorfirst(md->lp, BRANCH_FLOOR);
        md->nrows = get_Nrows(md->lp);
        if (!ok) r = rkm__ilp_err(b, RKM_ERROR_SOLVER, "lp_solve refused the model");
    }
    rkm__ilp_unlock();
    rkm__free(b->ctx, at, (nc + 1) * sizeof *at);
    rkm__free(b->ctx, row, ne * sizeof *row);
    rkm__free(b->ctx, val, ne * sizeof *val);
    return r;
}

/* Build the lprec: objective and rows gathered, then loaded. */
static rkm_result rkm__ilp_build(const rkm__ilp_shape *b, rkm__ilp_model *md)
{
    size_t nc = (size_t)md->ncols + 1;
    rkm__ilp_row w;
    rkm_result r = RKM_OK;
    if (!rkm__ilp_row_init(b->ctx, &w, nc)) r = rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for a row");
    if (!r) {
        rkm__ilp_objective(b, md, &w);
        rkm__ilp_rows_deps(b, md, &w);
        rkm__ilp_rows_carry(b, md, &w);
        rkm__ilp_rows_frees(b, md, &w);
        rkm__ilp_rows_memory(b, md, &w);
        rkm__ilp_rows_dominance(b, md, &w);
        if (md->colO) rkm__ilp_rows_copies(b, md, &w);
        md->bad = w.bad;
        r = w.nomem ? rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the model's rows") : rkm__ilp_load(b, md, &w);
    }
    rkm__ilp_row_free(b->ctx, &w, nc);
    return r;
}

/* lp_solve's solution as a schedule: r and save of *s. */
static void rkm__ilp_read_solution(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_sched *s)
{
    get_variables(md->lp, md->x);
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++) {
            int32_t c = rkm__ilp_R(b, md, t, v);
            s->r[(size_t)t * (size_t)b->n + (size_t)v] = c > 0 && md->x[c - 1] > 0.5;
        }
    for (int32_t v = 0; v < b->n; v++) {
        s->save[v] = -1;
        for (int32_t t = 0; t <= b->nb && rkm__ilp_phantom(b, v); t++) {
            int32_t c = rkm__ilp_RP(b, md, t, v);
            if (c > 0 && md->x[c - 1] > 0.5) s->save[v] = t;
        }
    }
    memset(s->r, 1, (size_t)b->n);
}

/* Solve under the budgets (under the lock): the peak budget bounds every
 * node's Q, the kept budget (memory at the end of F) plus grad(x_out) the
 * loss node's. cutoff < 0: none. Reads a solution into *out (r, save) when
 * lp_solve has one. *root: the LP bound lp_solve found at the root
 * (objective units), or -1. */
static int rkm__ilp_run(const rkm__ilp_shape *b, rkm__ilp_model *md, uint64_t peak_budget, uint64_t kept_budget,
                        double cutoff, rkm__ilp_work *work, rkm__ilp_sched *out, double *root)
{
    const double lim = 9007199254740992.0; /* 2^53: exact as a double */
    double xb = (double)b->g->tensors[b->x_out].bytes;
    rkm__ilp_lock();
    lprec *lp = md->lp;
    double inf = get_infinite(lp);
    double q_peak = (double)peak_budget >= lim ? inf : (double)peak_budget / b->mscale;
    double q_loss = (double)kept_budget >= lim - xb ? inf : ((double)kept_budget + xb) / b->mscale;
    for (int32_t k = 0; k < md->n_nodes; k++) set_upbo(lp, md->node[k].q, q_peak);
    set_upbo(lp, md->node[md->node_off[1]].q, q_loss < q_peak ? q_loss : q_peak);
    set_obj_bound(lp, cutoff >= 0 ? cutoff : inf);
    put_abortfunc(lp, rkm__ilp_abortfn, work);
    int status = solve(lp);
    *root = lp->real_solution < inf && lp->real_solution > -inf ? lp->real_solution : -1;
    if (status == OPTIMAL || status == SUBOPTIMAL) rkm__ilp_read_solution(b, md, out);
    put_abortfunc(lp, NULL, NULL);
    rkm__ilp_unlock();
    return status;
}

/* ---- entry points -------------------------------------------------------- */

/* Remember a found schedule (ring of RKM__ILP_CACHE, no duplicates), with
 * the budgets it is proven optimal for, if it is. */
static void rkm__ilp_remember(const rkm__ilp_shape *b, rkm__ilp_memo *memo, rkm__ilp_sched *s, uint64_t peak_budget,
                              uint64_t kept_budget, int proven)
{
    s->proven = proven;
    s->peak_budget = peak_budget;
    s->kept_budget = kept_budget;
    for (int32_t c = 0; c < memo->n_cache; c++) {
        rkm__ilp_sched *e = &memo->cache[c];
        if (memcmp(e->r, s->r, rkm__ilp_rsize(b)) || memcmp(e->save, s->save, (size_t)b->n * sizeof *s->save)) continue;
        if (proven && (!e->proven || (peak_budget >= e->peak_budget && kept_budget >= e->kept_budget))) {
            e->proven = 1;
            e->peak_budget = peak_budget;
            e->kept_budget = kept_budget;
        }
        return;
    }
    rkm__ilp_sched_copy(b, &memo->cache[memo->cache_next], s);
    memo->cache_next = (memo->cache_next + 1) % RKM__ILP_CACHE;
    if (memo->n_cache < RKM__ILP_CACHE) memo->n_cache++;
}

/* Remember budgets that admit nothing. */
static void rkm__ilp_remember_none(rkm__ilp_memo *memo, uint64_t peak_budget, uint64_t kept_budget)
{
    memo->none[memo->none_next] = (rkm__ilp_none){peak_budget, kept_budget};
    memo->none_next = (memo->none_next + 1) % RKM__ILP_CACHE;
    if (memo->n_none < RKM__ILP_CACHE) memo->n_none++;
}

/* Take schedule s as the incumbent *best if it fits and is faster (or there
 * is none yet: *have = 0). */
static void rkm__ilp_consider(const rkm__ilp_shape *b, const rkm__ilp_sched *s, rkm__ilp_sched *best,
                              uint64_t peak_budget, uint64_t kept_budget, int *have)
{
    if (!rkm__ilp_fits(s, peak_budget, kept_budget) || (*have && !(s->time < best->time))) return;
    rkm__ilp_sched_copy(b, best, s);
    *have = 1;
}

/* What earlier solves settle: 1 if nothing fits (proven), 2 if *best is
 * proven optimal; else 0, with *best the fastest fitting schedule seen
 * (*have). */
static int rkm__ilp_recall(const rkm__ilp_shape *b, const rkm__ilp_memo *memo, uint64_t peak_budget,
                           uint64_t kept_budget, rkm__ilp_sched *best, int *have)
{
    *have = 0;
    if (peak_budget < memo->min_peak || kept_budget < memo->min_kept) return 1;
    for (int32_t c = 0; c < memo->n_none; c++)
        if (peak_budget <= memo->none[c].peak_budget && kept_budget <= memo->none[c].kept_budget) return 1;
    for (int32_t c = 0; c < memo->n_cache; c++) {
        const rkm__ilp_sched *s = &memo->cache[c];
        if (!rkm__ilp_fits(s, peak_budget, kept_budget)) continue;
        if (s->proven && peak_budget <= s->peak_budget && kept_budget <= s->kept_budget) {
            rkm__ilp_sched_copy(b, best, s);
            *have = 1;
            return 2;
        }
        rkm__ilp_consider(b, s, best, peak_budget, kept_budget, have);
    }
    return 0;
}

/* The steps of schedule s, in an allocation of exactly their size. */
static rkm_result rkm__ilp_output(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, const rkm__ilp_sched *s,
                                  rkm_step **steps, size_t *n_fwd, size_t *n_bwd)
{
    rkm__ilp_out o = {{b->ctx, NULL, 0, 0}, 0};
    rkm_result r = rkm__ilp_emit(b, rp, s, &o);
    if (r) return r;
    size_t n = o.l.n;
    rkm_step *out = rkm__steps_take(&o.l);
    if (!out && n) {
        rkm__steps_free(&o.l);
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for a schedule's steps");
    }
    *steps = out;
    *n_fwd = o.n_fwd;
    *n_bwd = n - o.n_fwd;
    return RKM_OK;
}

/* Measure lp_solve's solution s (*valid: it replays) and consider it. */
static rkm_result rkm__ilp_offer(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, rkm__ilp_sched *s,
                                 rkm__ilp_sched *best, uint64_t peak_budget, uint64_t kept_budget, int *have,
                                 int *valid)
{
    rkm_result r = RKM_OK;
    *valid = rkm__ilp_measure(b, rp, s, &r);
    if (*valid) rkm__ilp_consider(b, s, best, peak_budget, kept_budget, have);
    return r;
}

/* lp_solve's verdict into the stats; returns whether the best (or "none")
 * is proven optimal. */
static int rkm__ilp_verdict(const rkm__ilp_shape *b, int status, int cutoff, int have, int valid, rkm__ilp_stats *st)
{
    st->solves++;
    switch (status) {
    case OPTIMAL:
        st->optimal++;
        return valid;
    case SUBOPTIMAL: st->suboptimal++; return 0;
    case INFEASIBLE:
    case ACCURACYERROR:
        /* under a cutoff both mean "nothing better than the incumbent" */
        if (cutoff) {
            st->optimal++;
            return 1;
        }
        if (status == INFEASIBLE) {
            st->infeasible++;
            return !have;
        }
        break;
    case USERABORT:
    case TIMEOUT: st->timeout++; return 0;
    default: break;
    }
    st->failed++;
    rkm__log(b->ctx, RKM_LOG_WARN, "block ILP: lp_solve returned status %d", status);
    return 0;
}

/* Hand the incumbent out: its steps, time and bound. */
static rkm_result rkm__ilp_finish(const rkm__ilp_shape *b, rkm__ilp_scratch *sc, double t0, rkm_step **steps,
                                  size_t *n_fwd, size_t *n_bwd, rkm__ilp_stats *st, int *found)
{
    st->time = sc->best.time;
    if (st->proven || st->bound > st->time) st->bound = st->time;
    rkm_result r = rkm__ilp_output(b, &sc->rp, &sc->best, steps, n_fwd, n_bwd);
    *found = r == RKM_OK;
    st->seconds += rkm__now() - t0;
    return r;
}

/* A fresh lprec for the block (the old one is deleted). */
static rkm_result rkm__ilp_rebuild(const rkm__ilp_shape *b, rkm__ilp_model *md)
{
    rkm__ilp_lock();
    delete_lp(md->lp);
    md->lp = NULL;
    rkm__ilp_unlock();
    return rkm__ilp_build(b, md);
}

/* lp_solve on the block's model (see rkm__ilp_run; *status: lp_solve's).
 * lp_solve 5.5.2.5 can crash (coldual) re-solving an lprec whose last
 * solve was aborted: such a model is rebuilt before reuse (not at once:
 * the whole-graph ILP's block is not reused, and a solve the time limit
 * stopped should return at once). */
static rkm_result rkm__ilp_lp(rkm__ilp_block *bk, uint64_t peak_budget, uint64_t kept_budget, double cutoff,
                              rkm__ilp_work *work, double *root, int *status)
{
    rkm_result r;
    if (bk->model.stale && (r = rkm__ilp_rebuild(&bk->shape, &bk->model))) return r;
    *status = rkm__ilp_run(&bk->shape, &bk->model, peak_budget, kept_budget, cutoff, work, &bk->scratch.found, root);
    bk->model.stale = *status != OPTIMAL && *status != INFEASIBLE;
    return RKM_OK;
}

/* lp_solve on the model, with the incumbent's objective (if *have) as a
 * cutoff; its solution, if valid and better, becomes the incumbent. Sets
 * *proven and *root (see rkm__ilp_run). */
static rkm_result rkm__ilp_exact(rkm__ilp_block *bk, uint64_t peak_budget, uint64_t kept_budget, rkm__ilp_work *work,
                                 int *have, int *proven, double *root, rkm__ilp_stats *st)
{
    const rkm__ilp_shape *b = &bk->shape;
    rkm__ilp_scratch *sc = &bk->scratch;
    int valid = 0, status;
    double obj = *have ? rkm__ilp_obj(b, &sc->best) : -1;
    double cutoff = *have ? obj - 1e-9 * (1 + obj) : -1;
    rkm_result r = rkm__ilp_lp(bk, peak_budget, kept_budget, cutoff, work, root, &status);
    if (r) return r;
    if (status == OPTIMAL || status == SUBOPTIMAL) {
        if ((r = rkm__ilp_offer(b, &sc->rp, &sc->found, &sc->best, peak_budget, kept_budget, have, &valid))) return r;
        if (!valid) rkm__log(b->ctx, RKM_LOG_WARN, "block ILP: a solution failed its replay; kept the fallback");
    }
    *proven = rkm__ilp_verdict(b, status, cutoff >= 0, *have, valid, st);
    return RKM_OK;
}

/* A solve's work budgets, worth about lim seconds (see the top). */
static rkm__ilp_work rkm__ilp_work_for(const rkm__ilp_block *bk, double lim)
{
    return (rkm__ilp_work){0, lim * RKM__ILP_CALLS_PER_S / (bk->model.ncols + bk->model.nrows), 0,
                           lim * RKM__ILP_STEPS_PER_S / 2, bk->deadline, bk->stop, bk->stop_user};
}

RKM__PRIVATE rkm_result rkm__ilp_block_solve(rkm__ilp_block *bk, uint64_t peak_budget, uint64_t kept_budget,
                                       double time_limit_s, rkm_step **steps, size_t *n_fwd, size_t *n_bwd,
                                       rkm__ilp_stats *st, int *found)
{
    const rkm__ilp_shape *b = &bk->shape;
    rkm__ilp_scratch *sc = &bk->scratch;
    double t0 = rkm__now(), lim = time_limit_s > 0 ? time_limit_s : 1.0;
    rkm__ilp_work work = rkm__ilp_work_for(bk, lim);
    *steps = NULL;
    *n_fwd = *n_bwd = 0;
    *found = 0;
    st->proven = 0;
    st->time = st->bound = 0;
    int have = 0, known = rkm__ilp_recall(b, &bk->memo, peak_budget, kept_budget, &sc->best, &have);
    if (known) {
        st->proven = 1;
        if (known == 1) {
            st->seconds += rkm__now() - t0;
            return RKM_OK;
        }
        return rkm__ilp_finish(b, sc, t0, steps, n_fwd, n_bwd, st, found);
    }
    rkm_result r = rkm__ilp_greedy(b, &sc->gr, &sc->rp, peak_budget, kept_budget, &work, &sc->found);
    if (r) return r;
    rkm__ilp_consider(b, &sc->found, &sc->best, peak_budget, kept_budget, &have);
    /* Nothing recomputed: no schedule is faster. */
    int proven = have && rkm__ilp_obj(b, &sc->best) == 0;
    double root = -1;
    /* lp_solve only before the caller's deadline: past it, it would stop at
     * once, after its own set-up (tens of ms on 60 ops); counted so */
    if (!proven && !bk->model.bad && rkm__now() > work.deadline)
        st->solves++, st->timeout++;
    else if (!proven && !bk->model.bad &&
             (r = rkm__ilp_exact(bk, peak_budget, kept_budget, &work, &have, &proven, &root, st)))
        return r;
    if (!have && proven) rkm__ilp_remember_none(&bk->memo, peak_budget, kept_budget);
    st->work += lim * fmax(work.calls / work.max_calls, work.evals / work.max_evals);
    st->proven = proven;
    if (!have) {
        st->seconds += rkm__now() - t0;
        return RKM_OK;
    }
    st->bound = proven ? sc->best.time : b->base_time + (root > 0 ? root * b->tscale : 0);
    rkm__ilp_remember(b, &bk->memo, &sc->best, peak_budget, kept_budget, proven);
    return rkm__ilp_finish(b, sc, t0, steps, n_fwd, n_bwd, st, found);
}

/* The copy model's schedule for `budget`, lp_solve alone: its
 * recomputations as steps without copies (steps[0..*n_steps), the
 * caller's), which peak over the budget where the model offloads, and the
 * copy slots it offloads (offload[g->n_tensors + g->n_ops], 1 for each);
 * the caller places the copies and has the simulator judge. Only
 * schedules the model times under `cutoff` (seconds; INFINITY: none) are
 * sought: the model's time is the plan's without copies, and an estimate
 * with them (a prefetch it counts as waited for may hide where the
 * offload pass puts it). *found 0 (steps NULL) when lp_solve finds none
 * in its work; that is RKM_OK too. No memo: the model's floors and the
 * greedy are recompute-only. */
RKM__PRIVATE rkm_result rkm__ilp_block_solve_copies(rkm__ilp_block *bk, uint64_t budget, double cutoff, double time_limit_s,
                                              rkm_step **steps, size_t *n_steps, uint8_t *offload, rkm__ilp_stats *st,
                                              int *found)
{
    const rkm__ilp_shape *b = &bk->shape;
    rkm__ilp_scratch *sc = &bk->scratch;
    double t0 = rkm__now(), lim = time_limit_s > 0 ? time_limit_s : 1.0;
    rkm__ilp_work work = rkm__ilp_work_for(bk, lim);
    rkm_result r = RKM_OK;
    *steps = NULL;
    *n_steps = 0;
    *found = 0;
    st->proven = 0;
    st->time = st->bound = 0;
    if (!b->copies) return rkm__ilp_err(b, RKM_ERROR_INTERNAL, "internal error: a copy solve of a model without copies");
    double root, obj = isfinite(cutoff) ? (cutoff - b->base_time) / b->tscale : -1;
    /* past the deadline, or nothing is faster than every forward and backward once */
    if (bk->model.bad || rkm__now() > work.deadline || (isfinite(cutoff) && obj <= 0)) return RKM_OK;
    int status;
    if ((r = rkm__ilp_lp(bk, budget, UINT64_MAX, obj > 0 ? obj - 1e-9 * (1 + obj) : -1, &work, &root, &status)))
        return r;
    int valid = (status == OPTIMAL || status == SUBOPTIMAL) && rkm__ilp_measure(b, &sc->rp, &sc->found, &r);
    if (r) return r;
    st->proven = rkm__ilp_verdict(b, status, obj > 0, 0, valid, st);
    st->work += lim * fmax(work.calls / work.max_calls, work.evals / work.max_evals);
    if (valid) {
        size_t nf, nb;
        st->time = sc->found.time;
        st->bound = st->proven ? st->time : b->base_time + (root > 0 ? root * b->tscale : 0);
        r = rkm__ilp_output(b, &sc->rp, &sc->found, steps, &nf, &nb);
        *n_steps = nf + nb;
        *found = r == RKM_OK;
        memset(offload, 0, b->g->n_tensors + b->g->n_ops);
        for (int32_t x = 0; x < b->nt + b->n; x++) /* lp_solve's solution is still in md->x */
            offload[rkm__ilp_cslot(b, x)] = rkm__ilp_O(&bk->model, x) && bk->model.x[rkm__ilp_O(&bk->model, x) - 1] > 0.5;
    }
    st->seconds += rkm__now() - t0;
    return r;
}

/* ---- the parts: init and free -------------------------------------------- */

/* (a), the shape, is in ilp_sched.c. */

/* (b) The model: columns, nodes, free candidates, and the lprec. */
static rkm_result rkm__ilp_model_init(const rkm__ilp_shape *b, rkm__ilp_model *md)
{
    rkm_context *ctx = b->ctx;
    rkm__ilp_arrays *a = &md->arrays;
    size_t n = (size_t)b->n, nt = (size_t)b->nt, nb = (size_t)b->nb;
    if (!rkm__ilp_take(ctx, a, &md->colR, (nb + 1) * n, sizeof *md->colR) ||
        !rkm__ilp_take(ctx, a, &md->colRP, (nb + 1) * n, sizeof *md->colRP) ||
        !rkm__ilp_take(ctx, a, &md->colS, (nb + 2) * nt, sizeof *md->colS) ||
        !rkm__ilp_take(ctx, a, &md->node_off, nb + 2, sizeof *md->node_off) ||
        (b->copies && (!rkm__ilp_take(ctx, a, &md->colO, nt + n, sizeof *md->colO) ||
                       !rkm__ilp_take(ctx, a, &md->colD, (nt + n) * n, sizeof *md->colD) ||
                       !rkm__ilp_take(ctx, a, &md->colP[0], (nb + 2) * (nt + n), sizeof *md->colP[0]) ||
                       !rkm__ilp_take(ctx, a, &md->colP[1], (nb + 2) * (nt + n), sizeof *md->colP[1]) ||
                       !rkm__ilp_take(ctx, a, &md->colP[2], (nb + 2) * (nt + n), sizeof *md->colP[2]) ||
                       !rkm__ilp_take(ctx, a, &md->colW, nb + 1, sizeof *md->colW) ||
                       !rkm__ilp_take(ctx, a, &md->colWF, n + 1, sizeof *md->colWF))))
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the model's columns");
    rkm__ilp_columns(b, md); /* count */
    if (md->ncols > RKM__ILP_MAX_COLS)
        return rkm__ilp_err(b, RKM_ERROR_SOLVER, "%d ops make %d columns, more than lp_solve can take (%d)", (int)b->n,
                            (int)md->ncols, RKM__ILP_MAX_COLS);
    if (!rkm__ilp_take(ctx, a, &md->node, (size_t)md->n_nodes, sizeof *md->node) ||
        !rkm__ilp_take(ctx, a, &md->fcand, (size_t)md->n_fcand, sizeof *md->fcand) ||
        !rkm__ilp_take(ctx, a, &md->x, (size_t)md->ncols + 1, sizeof *md->x))
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the model's nodes");
    rkm__ilp_columns(b, md);
    return rkm__ilp_build(b, md);
}

static void rkm__ilp_model_free(rkm_context *ctx, rkm__ilp_model *md)
{
    if (md->lp) {
        rkm__ilp_lock();
        delete_lp(md->lp);
        rkm__ilp_unlock();
        md->lp = NULL;
    }
    rkm__ilp_drop(ctx, &md->arrays);
}

/* (c) The memo: the floors, and room for the cache's schedules. */
static rkm_result rkm__ilp_memo_init(const rkm__ilp_shape *b, rkm__ilp_memo *memo)
{
    rkm__ilp_floors(b, memo);
    for (int c = 0; c < RKM__ILP_CACHE; c++)
        if (!rkm__ilp_sched_alloc(b, &memo->cache[c]))
            return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the schedule cache");
    return RKM_OK;
}

static void rkm__ilp_memo_free(rkm_context *ctx, rkm__ilp_memo *memo)
{
    for (int c = 0; c < RKM__ILP_CACHE; c++) rkm__ilp_sched_free(ctx, &memo->cache[c]);
}

/* (d) The scratch of a solve. */
static rkm_result rkm__ilp_scratch_init(const rkm__ilp_shape *b, rkm__ilp_scratch *sc)
{
    rkm_context *ctx = b->ctx;
    rkm__ilp_arrays *a = &sc->arrays;
    size_t n = (size_t)b->n, nt = (size_t)b->nt;
    if (!rkm__ilp_take(ctx, a, &sc->gr.x, n, 1) || !rkm__ilp_take(ctx, a, &sc->gr.seen2, n, 1) ||
        !rkm__ilp_take(ctx, a, &sc->rp.live, nt, sizeof *sc->rp.live) ||
        !rkm__ilp_take(ctx, a, &sc->rp.rbuf, (size_t)b->max_list, sizeof *sc->rp.rbuf) ||
        !rkm__ilp_take(ctx, a, &sc->rp.ev, rkm__ilp_events_max(b), sizeof *sc->rp.ev) ||
        !rkm__ilp_take(ctx, a, &sc->rp.fhead, rkm__ilp_events_max(b), sizeof *sc->rp.fhead) ||
        !rkm__ilp_sched_alloc(b, &sc->gr.trial) || !rkm__ilp_sched_alloc(b, &sc->gr.alt) ||
        !rkm__ilp_sched_alloc(b, &sc->best) || !rkm__ilp_sched_alloc(b, &sc->found))
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for a solve's scratch");
    sc->rp.steps.ctx = ctx;
    rkm_result r = rkm__sim_init(b->g, &sc->rp.sim);
    return r ? rkm__ilp_err(b, r, "out of memory for the simulator") : RKM_OK;
}

static void rkm__ilp_scratch_free(rkm_context *ctx, rkm__ilp_scratch *sc)
{
    rkm__sim_free(&sc->rp.sim);
    rkm__steps_free(&sc->rp.steps);
    rkm__free(ctx, sc->rp.fp, sc->rp.fcap * sizeof *sc->rp.fp);
    rkm__ilp_sched_free(ctx, &sc->gr.trial);
    rkm__ilp_sched_free(ctx, &sc->gr.alt);
    rkm__ilp_sched_free(ctx, &sc->best);
    rkm__ilp_sched_free(ctx, &sc->found);
    rkm__ilp_drop(ctx, &sc->arrays);
}

RKM__PRIVATE void rkm__ilp_block_destroy(rkm__ilp_block *bk)
{
    if (!bk) return;
    rkm_context *ctx = bk->shape.ctx;
    rkm__ilp_model_free(ctx, &bk->model);
    rkm__ilp_memo_free(ctx, &bk->memo);
    rkm__ilp_scratch_free(ctx, &bk->scratch);
    rkm__ilp_drop(ctx, &bk->shape.arrays);
    rkm__free(ctx, bk, sizeof *bk);
}

static rkm_result rkm__ilp_create(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in, int32_t x_out,
                                  int is_last, int copies, rkm__ilp_block **out)
{
    *out = NULL;
    rkm_context *ctx = g->ctx;
    if (!g->finalized) return rkm__err(ctx, RKM_ERROR_STATE, "block ILP: the graph is not finalized");
    if (!ops || n_ops < 1 || (size_t)n_ops > g->n_ops || x_out < 0 || (size_t)x_out >= g->n_tensors ||
        x_in < -1 || (x_in >= 0 && (size_t)x_in >= g->n_tensors) || (is_last && x_out != g->loss))
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "block ILP: bad block (ops, x_in, x_out or is_last)");
    rkm__ilp_block *bk = rkm__calloc(ctx, 1, sizeof *bk);
    if (!bk) return rkm__err(ctx, RKM_ERROR_NOMEM, "block ILP: out of memory for a block of %d ops", (int)n_ops);
    bk->deadline = INFINITY;
    rkm_result r = rkm__ilp_shape_init(g, ops, n_ops, x_in, x_out, is_last, copies, &bk->shape);
    if (!r) r = rkm__ilp_model_init(&bk->shape, &bk->model);
    if (!r) r = rkm__ilp_memo_init(&bk->shape, &bk->memo);
    if (!r) r = rkm__ilp_scratch_init(&bk->shape, &bk->scratch);
    if (r) {
        rkm__ilp_block_destroy(bk);
        return r;
    }
    *out = bk;
    return RKM_OK;
}

RKM__PRIVATE rkm_result rkm__ilp_block_create(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in,
                                        int32_t x_out, int is_last, rkm__ilp_block **out)
{
    return rkm__ilp_create(g, ops, n_ops, x_in, x_out, is_last, 0, out);
}

/* The whole graph's model with copy columns; g has a copy link. */
RKM__PRIVATE rkm_result rkm__ilp_block_create_copies(const rkm_graph *g, rkm__ilp_block **out)
{
    *out = NULL;
    if (!(g->copy.d2h_bytes_per_second > 0) || !(g->copy.h2d_bytes_per_second > 0))
        return rkm__err(g->ctx, RKM_ERROR_INTERNAL, "internal error: block ILP with copies on a graph without a link");
    return rkm__ilp_create(g, g->block_ops, (int32_t)g->n_ops, -1, g->loss, 1, 1, out);
}

#endif /* RKM_OMIT_SOLVER */
