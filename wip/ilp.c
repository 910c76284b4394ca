/* ===========================================================================
 * 9. Block ILP (lp_solve)
 * ===========================================================================
 *
 * A block: forward ops (global ids, topological order) of a finalized graph,
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
 *   rkm__ilp_block_solve(b, peak, kept, time_limit_s, &steps, &n_fwd, &n_bwd,
 *                        &stats, &found)
 *      least-time schedule whose replayed peak (absolute, inputs included) is
 *      <= peak and whose memory at the end of F is <= kept (UINT64_MAX: no
 *      limit). steps[0..n_fwd) is F, then n_bwd steps of B; the caller frees
 *      them with rkm__free(ctx, steps, (n_fwd + n_bwd) * sizeof *steps).
 *      found = 0 (steps NULL) when no schedule fits; that is RKM_OK too.
 *      time_limit_s (<= 0: 1 s) is turned into work budgets (lp_solve
 *      callbacks, steps replayed by the greedy) worth about that much time,
 *      so that the result is the same on every machine; a wall clock at
 *      twice the limit stops a slow or loaded machine (results may then
 *      differ).
 *      Stats counters accumulate (zero them first); proven/bound/time
 *      describe this call.
 *   rkm__ilp_block_destroy(b)
 *
 * Shape of the model (docs: lpsolve.md, formulation `fb`): stage 0 runs the
 * forward ops in order, then stage t = 1..nb runs the recomputations it
 * chooses (topological order) and the t-th backward (reverse order). Stage 1
 * opens with the "loss node": grad(x_out) appears. Values are data tensors
 * made by block ops (S: live at a stage start), phantoms (RP: the one stage
 * whose run of the op saves it; it then lives until the op's backward) and
 * gradients (fixed by the backward order: constants). Memory is the chain of
 * Q columns (a node's peak, bounded by the budget); the kept budget is the
 * bound of the loss node's Q. Frees are continuous F columns (disaggregated).
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
#ifndef RKM_ILP_INCLUDED
#define RKM_ILP_INCLUDED

typedef struct rkm__ilp_stats {
    int32_t solves, optimal, suboptimal, infeasible, timeout, failed; /* lp_solve outcomes (accumulated) */
    double seconds;  /* wall time in rkm__ilp_block_solve (accumulated) */
    int proven;      /* this call: the schedule (or "none fits") is optimal for the model */
    double time;     /* this call: the returned schedule's time (0 if none) */
    double bound;    /* this call: a lower bound on the model's optimal time */
} rkm__ilp_stats;

typedef struct rkm__ilp_block rkm__ilp_block;

#ifdef RKM_OMIT_SOLVER

struct rkm__ilp_block {
    int unused;
};

static rkm_result rkm__ilp_block_create(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in,
                                        int32_t x_out, int is_last, rkm__ilp_block **out)
{
    (void)ops, (void)n_ops, (void)x_in, (void)x_out, (void)is_last;
    *out = NULL;
    return rkm__err(g->ctx, RKM_ERROR_UNSUPPORTED, "block ILP: built without lp_solve (RKM_OMIT_SOLVER)");
}

static rkm_result rkm__ilp_block_solve(rkm__ilp_block *b, uint64_t peak_budget, uint64_t kept_budget,
                                       double time_limit_s, rkm_step **steps, size_t *n_fwd, size_t *n_bwd,
                                       rkm__ilp_stats *st, int *found)
{
    (void)b, (void)peak_budget, (void)kept_budget, (void)time_limit_s, (void)st;
    *steps = NULL;
    *n_fwd = *n_bwd = 0;
    *found = 0;
    return RKM_ERROR_UNSUPPORTED;
}

static void rkm__ilp_block_destroy(rkm__ilp_block *b) { (void)b; }

#else /* !RKM_OMIT_SOLVER */

#include <lpsolve/lp_lib.h>

/* ---- the one lock around lp_solve ---------------------------------------- */

#if !defined(__STDC_NO_THREADS__)
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
#define RKM__ILP_CACHE 64 /* schedules remembered per block */
/* Work budgets, so that results do not depend on the machine's speed: a
 * time limit of 1 s allows lp_solve this many abort-callback calls times
 * model size (columns + rows), and the greedy half this many replayed steps
 * (each about 1 s on a 2020s core); the wall clock at RKM__ILP_WALL_SAFETY
 * times the limit stops a slow machine anyway. */
#define RKM__ILP_CALLS_PER_S 2.0e7
#define RKM__ILP_STEPS_PER_S 1.5e7 /* greedy: steps of the schedules it replays */
#define RKM__ILP_WALL_SAFETY 2.0
#define RKM__ILP_MAX_COLS 200000 /* beyond, building the model alone takes too long */

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
 * phantom is saved; and its replayed figures. */
typedef struct rkm__ilp_sched {
    uint8_t *r;    /* [(nb+1)*n]: r[t*n+v], op v runs in stage t (row 0 all 1) */
    int32_t *save; /* [n]: stage of v's save run, -1 if none */
    uint64_t peak, kept;
    double time;
    /* in the cache: proven optimal for every budget up to (bpeak, bkept) */
    int proven;
    uint64_t bpeak, bkept;
} rkm__ilp_sched;

/* Budgets proven to admit no schedule (nor does any smaller pair). */
typedef struct rkm__ilp_none {
    uint64_t peak, kept;
} rkm__ilp_none;

/* What a solve may spend: work units (deterministic) and a wall clock. */
typedef struct rkm__ilp_budget {
    double calls, max_calls; /* lp_solve abort-callback calls */
    double evals, max_evals; /* steps of the schedules the greedy replayed */
    double deadline;         /* rkm__now() past which everything stops */
} rkm__ilp_budget;

static int rkm__ilp_spent(const rkm__ilp_budget *u, int greedy)
{
    if (greedy ? u->evals >= u->max_evals : u->calls >= u->max_calls) return 1;
    return rkm__now() > u->deadline;
}

struct rkm__ilp_block {
    const rkm_graph *g;
    rkm_context *ctx;
    int32_t n, nt, nb;        /* forward ops, block tensors, backward stages */
    int32_t x_in, x_out, is_last;
    int32_t *op;              /* [n] global id of local op v */
    int32_t *lt;              /* [g->n_tensors] local index of a block tensor, else -1 */
    int32_t *tg;              /* [nt] global id of local tensor i */
    int32_t *tprod;           /* [nt] local producer of i */
    int32_t *rd_off, *rd;     /* readers of i among the block ops: rd[rd_off[i] .. rd_off[i+1]) */
    int32_t n_rd;             /* rd's allocated length */
    int32_t *st;              /* [n] stage of v's backward, 0 if it has none */
    int32_t *bop;             /* [nb+1] local op whose backward is stage t */
    int32_t *need_o, *need_t; /* last stage where an op's run / a tensor can be useful */
    int32_t *last0;           /* [nt] last stage-0 node that touches i */
    uint64_t static_bytes;    /* inputs + x_in: live all along */
    uint64_t *gstart;         /* [nb+2] gradient bytes live at the start of stage t */
    uint64_t *gnew, *gfree;   /* [nb+1] gradient bytes made / freed by stage t's backward */
    double base_time;         /* every forward once and every backward */
    double tscale, mscale;    /* objective and byte divisors */
    /* the model */
    lprec *lp;
    int32_t ncols, nrows;
    int32_t *colR, *colRP;    /* [(nb+1)*n], 0: no column */
    int32_t *colS;            /* [(nb+2)*nt] */
    rkm__ilp_node *node;      /* stage t's nodes: node[node_off[t] .. node_off[t+1]) */
    int32_t *node_off;        /* [nb+2] */
    int32_t n_nodes;
    rkm__ilp_free *fcand;
    int32_t n_fcand;
    int bad;                  /* a row that never holds: no schedule at any budget */
    double *x;                /* [ncols] solution */
    /* schedules found so far (ring), and scratch */
    rkm__ilp_sched cache[RKM__ILP_CACHE];
    int32_t n_cache, cache_next;
    rkm__ilp_none none[RKM__ILP_CACHE];
    int32_t n_none, none_next;
    uint64_t min_peak, min_kept; /* no schedule has a lower peak / kept memory */
    rkm__ilp_sched tmp, best, alt, cand; /* scratch: a trial, the best, the greedy's two */
    uint8_t *greedy_x;        /* [n] the greedy's recompute set: 0 keep, 1 always, 2 once */
    uint8_t *seen2;           /* [n] greedy scratch */
    int32_t *live;            /* [nt] emit scratch */
    int32_t *rbuf;            /* [max_list] emit scratch: one op's in or saved list */
    int32_t max_list;
    size_t last_steps;        /* steps of the last schedule measured (work count) */
    rkm__sim sim;
};

static size_t rkm__ilp_rsize(const rkm__ilp_block *b) { return (size_t)(b->nb + 1) * (size_t)b->n; }

static rkm__ilp_free *rkm__ilp_fend(const rkm__ilp_block *b, int32_t k)
{
    return b->fcand + (k + 1 < b->n_nodes ? b->node[k + 1].f0 : b->n_fcand);
}

static int rkm__ilp_sched_alloc(rkm__ilp_block *b, rkm__ilp_sched *s)
{
    s->r = rkm__calloc(b->ctx, rkm__ilp_rsize(b) + 1, 1);
    s->save = rkm__calloc(b->ctx, (size_t)b->n + 1, sizeof *s->save);
    return s->r && s->save;
}

static void rkm__ilp_sched_free(rkm__ilp_block *b, rkm__ilp_sched *s)
{
    rkm__free(b->ctx, s->r, rkm__ilp_rsize(b) + 1);
    rkm__free(b->ctx, s->save, ((size_t)b->n + 1) * sizeof *s->save);
    s->r = NULL;
    s->save = NULL;
}

static void rkm__ilp_sched_copy(const rkm__ilp_block *b, rkm__ilp_sched *dst, const rkm__ilp_sched *src)
{
    memcpy(dst->r, src->r, rkm__ilp_rsize(b));
    memcpy(dst->save, src->save, (size_t)b->n * sizeof *dst->save);
    dst->peak = src->peak;
    dst->kept = src->kept;
    dst->time = src->time;
    dst->proven = src->proven;
    dst->bpeak = src->bpeak;
    dst->bkept = src->bkept;
}

static int rkm__ilp_phantom(const rkm__ilp_block *b, int32_t v)
{
    const rkm__op *o = &b->g->ops[b->op[v]];
    return o->phantom > 0 && o->has_bwd;
}

/* Local tensor of global t if it is a block tensor, else -1. */
static int32_t rkm__ilp_loc(const rkm__ilp_block *b, int32_t t) { return b->lt[t]; }

/* Does stage t's backward read block tensor i (saved)? */
static int rkm__ilp_bwd_reads(const rkm__ilp_block *b, int32_t t, int32_t i)
{
    if (t < 1 || t > b->nb) return 0;
    const rkm__op *o = &b->g->ops[b->op[b->bop[t]]];
    return rkm__list_has(o->saved, o->n_saved, b->tg[i]);
}

/* ---- schedules: steps, replay ------------------------------------------- */

typedef struct rkm__ilp_out {
    rkm_step *s;
    size_t n, cap;
    size_t n_fwd;
} rkm__ilp_out;

static int rkm__ilp_push(rkm__ilp_block *b, rkm__ilp_out *o, int32_t kind, int32_t index, int32_t save)
{
    if (!rkm__reserve(b->ctx, (void **)&o->s, &o->cap, o->n + 1, sizeof *o->s)) return 0;
    o->s[o->n].kind = kind;
    o->s[o->n].index = index;
    o->s[o->n].save = save;
    o->n++;
    return 1;
}

/* One compute event of a schedule. */
typedef struct rkm__ilp_event {
    int32_t kind, v, t;
} rkm__ilp_event;

/* Events of a schedule in order: stage 0's forwards, the loss node, then per
 * stage its recomputations and its backward. Returns the count. */
static size_t rkm__ilp_events(const rkm__ilp_block *b, const rkm__ilp_sched *s, rkm__ilp_event *ev)
{
    size_t m = 0;
    for (int32_t v = 0; v < b->n; v++) ev[m++] = (rkm__ilp_event){RKM__ILP_NODE_FWD, v, 0};
    ev[m++] = (rkm__ilp_event){RKM__ILP_NODE_LOSS, -1, 1};
    for (int32_t t = 1; t <= b->nb; t++) {
        for (int32_t v = 0; v < b->n; v++)
            if (s->r[(size_t)t * (size_t)b->n + (size_t)v]) ev[m++] = (rkm__ilp_event){RKM__ILP_NODE_FWD, v, t};
        ev[m++] = (rkm__ilp_event){RKM__ILP_NODE_BWD, b->bop[t], t};
    }
    return m;
}

/* Block tensors an event reads, through a callback-free list: fills buf
 * (capacity enough for any op's in/saved list) and returns the count. */
static int32_t rkm__ilp_reads(const rkm__ilp_block *b, const rkm__ilp_event *e, int32_t *buf)
{
    int32_t k = 0;
    if (e->kind == RKM__ILP_NODE_LOSS) {
        buf[k++] = rkm__ilp_loc(b, b->x_out);
        return k;
    }
    const rkm__op *o = &b->g->ops[b->op[e->v]];
    const int32_t *list = e->kind == RKM__ILP_NODE_FWD ? o->in : o->saved;
    int32_t nl = e->kind == RKM__ILP_NODE_FWD ? o->n_in : o->n_saved;
    for (int32_t j = 0; j < nl; j++)
        if (rkm__ilp_loc(b, list[j]) >= 0) buf[k++] = rkm__ilp_loc(b, list[j]);
    return k;
}

typedef struct rkm__ilp_freeat {
    size_t e;
    int32_t i;
} rkm__ilp_freeat;

static int rkm__ilp_freeat_cmp(const void *a, const void *c)
{
    const rkm__ilp_freeat *x = a, *y = c;
    if (x->e != y->e) return x->e < y->e ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* Emit the main step of event e. */
static int rkm__ilp_emit_event(rkm__ilp_block *b, const rkm__ilp_sched *s, const rkm__ilp_event *e, rkm__ilp_out *o)
{
    const rkm_graph *g = b->g;
    if (e->kind == RKM__ILP_NODE_LOSS) return b->is_last ? rkm__ilp_push(b, o, RKM_STEP_LOSS, g->loss, 0) : 1;
    int32_t gop = b->op[e->v];
    if (e->kind == RKM__ILP_NODE_FWD)
        return rkm__ilp_push(b, o, RKM_STEP_FWD, gop, rkm__ilp_phantom(b, e->v) && s->save[e->v] == e->t);
    return rkm__ilp_push(b, o, RKM_STEP_BWD, gop, 0);
}

/* After a backward: its saved state and its outputs' gradients are dead. */
static int rkm__ilp_emit_bwd_frees(rkm__ilp_block *b, int32_t v, rkm__ilp_out *o)
{
    const rkm__op *op = &b->g->ops[b->op[v]];
    if (op->phantom > 0 && !rkm__ilp_push(b, o, RKM_STEP_FREE_SAVED, b->op[v], 0)) return 0;
    for (int32_t k = 0; k < op->n_out; k++)
        if (b->g->tensors[op->out[k]].has_grad && !rkm__ilp_push(b, o, RKM_STEP_FREE_GRAD, op->out[k], 0)) return 0;
    return 1;
}

/* The steps of schedule s: events in order, each block tensor freed right
 * after its last use before it is made again (or right after it is made if
 * nothing reads it). o->s is allocated through the context (o->cap items). */
static rkm_result rkm__ilp_emit(rkm__ilp_block *b, const rkm__ilp_sched *s, rkm__ilp_out *o)
{
    rkm_context *ctx = b->ctx;
    size_t cap_ev = (size_t)b->n * (size_t)(b->nb + 1) + (size_t)b->nb + 2;
    rkm__ilp_event *ev = rkm__alloc(ctx, cap_ev * sizeof *ev);
    rkm__ilp_freeat *fr = NULL;
    size_t n_fr = 0, cap_fr_now = 0;
    int32_t *buf = b->rbuf;
    int ok = ev != NULL;
    memset(o, 0, sizeof *o);
    size_t m = ok ? rkm__ilp_events(b, s, ev) : 0;
    for (int32_t i = 0; i < b->nt; i++) b->live[i] = -1;
    /* Lifetimes: live[i] is the last event that touched i since it was made. */
    for (size_t e = 0; e < m && ok; e++) {
        int32_t nr = rkm__ilp_reads(b, &ev[e], buf);
        for (int32_t j = 0; j < nr; j++) b->live[buf[j]] = (int32_t)e;
        if (ev[e].kind != RKM__ILP_NODE_FWD) continue;
        const rkm__op *op = &b->g->ops[b->op[ev[e].v]];
        for (int32_t k = 0; k < op->n_out && ok; k++) {
            int32_t i = rkm__ilp_loc(b, op->out[k]);
            if (b->live[i] >= 0) {
                ok = rkm__reserve(ctx, (void **)&fr, &cap_fr_now, n_fr + 1, sizeof *fr);
                if (ok) fr[n_fr++] = (rkm__ilp_freeat){(size_t)b->live[i], i};
            }
            b->live[i] = (int32_t)e;
        }
    }
    for (int32_t i = 0; i < b->nt && ok; i++)
        if (b->live[i] >= 0) {
            ok = rkm__reserve(ctx, (void **)&fr, &cap_fr_now, n_fr + 1, sizeof *fr);
            if (ok) fr[n_fr++] = (rkm__ilp_freeat){(size_t)b->live[i], i};
        }
    if (ok && n_fr) qsort(fr, n_fr, sizeof *fr, rkm__ilp_freeat_cmp);
    size_t f = 0;
    for (size_t e = 0; e < m && ok; e++) {
        ok = rkm__ilp_emit_event(b, s, &ev[e], o);
        if (ok && ev[e].kind == RKM__ILP_NODE_BWD) ok = rkm__ilp_emit_bwd_frees(b, ev[e].v, o);
        for (; ok && f < n_fr && fr[f].e == e; f++) ok = rkm__ilp_push(b, o, RKM_STEP_FREE, b->tg[fr[f].i], 0);
        if (ok && e + 1 < m && ev[e + 1].kind == RKM__ILP_NODE_LOSS) o->n_fwd = o->n;
    }
    rkm__free(ctx, ev, cap_ev * sizeof *ev);
    rkm__free(ctx, fr, cap_fr_now * sizeof *fr);
    if (!ok) {
        rkm__free(ctx, o->s, o->cap * sizeof *o->s);
        memset(o, 0, sizeof *o);
        return rkm__nomem(ctx, "block ILP schedule");
    }
    return RKM_OK;
}

/* Does the simulator's state hold exactly the block's end state? */
static int rkm__ilp_end_ok(const rkm__ilp_block *b)
{
    const rkm__sim *s = &b->sim;
    const rkm_graph *g = b->g;
    for (int32_t v = 0; v < b->n; v++) {
        int32_t x = b->op[v];
        if ((g->ops[x].has_bwd && !s->bwd_done[x]) || s->P[x]) return 0;
    }
    if (b->is_last && !s->loss_done) return 0;
    for (size_t t = 0; t < g->n_tensors; t++) {
        int is_in = (g->tensors[t].flags & RKM_TENSOR_INPUT) || (int32_t)t == b->x_in;
        if (s->D[t] != is_in) return 0;
        int want_g = (int32_t)t == b->x_in && g->tensors[t].has_grad;
        if (s->G[t] != want_g) return 0;
        if (want_g && !rkm__grad_complete(s, (int32_t)t)) return 0;
    }
    return 1;
}

/* Replay a block schedule from the block's start state; fills the figures.
 * Returns 1 if it is valid and ends in the block's end state. */
static int rkm__ilp_replay(rkm__ilp_block *b, const rkm_step *steps, size_t n_fwd, size_t n, uint64_t *peak,
                           uint64_t *kept, double *time)
{
    rkm__sim *s = &b->sim;
    rkm_sim_result r1, r2;
    rkm__sim_reset(s);
    rkm__sim_give_tensor(s, b->x_in);
    if (!rkm__sim_run(s, steps, n_fwd, &r1, NULL)) return 0;
    *kept = s->mem;
    if (!b->is_last) rkm__sim_give_grad(s, b->x_out);
    if (!rkm__sim_run(s, steps + n_fwd, n - n_fwd, &r2, NULL)) return 0;
    *peak = r1.peak > r2.peak ? r1.peak : r2.peak;
    *time = r1.time + r2.time;
    return rkm__ilp_end_ok(b);
}

/* Emit and replay schedule s, setting its figures. Returns 1 if valid;
 * RKM_ERROR_NOMEM is reported through *res. */
static int rkm__ilp_measure(rkm__ilp_block *b, rkm__ilp_sched *s, rkm_result *res)
{
    rkm__ilp_out o;
    *res = rkm__ilp_emit(b, s, &o);
    if (*res) return 0;
    int ok = rkm__ilp_replay(b, o.s, o.n_fwd, o.n, &s->peak, &s->kept, &s->time);
    b->last_steps = o.n;
    rkm__free(b->ctx, o.s, o.cap * sizeof *o.s);
    return ok;
}

static int rkm__ilp_fits(const rkm__ilp_sched *s, uint64_t peak, uint64_t kept)
{
    return s->peak <= peak && s->kept <= kept;
}

/* ---- greedy: a recompute set -------------------------------------------- */

/* Mark op v to run in stage row r when x says it does not keep its outputs
 * from earlier: 1, recompute in every stage that reads them; 2, recompute
 * in the first such stage and keep them (and the phantom) from there. */
static void rkm__ilp_greedy_need(rkm__ilp_block *b, const uint8_t *x, uint8_t *r, int32_t v)
{
    if (x[v] == 1 || (x[v] == 2 && !b->seen2[v])) r[v] = 1;
}

/* The schedule that recompute set x (greedy_x) describes: each stage
 * recomputes, from what is live, what its backward reads (the phantom of an
 * op with x != 0 included). */
static void rkm__ilp_greedy_sched(rkm__ilp_block *b, const uint8_t *x, rkm__ilp_sched *s)
{
    const rkm_graph *g = b->g;
    size_t n = (size_t)b->n;
    memset(s->r, 0, rkm__ilp_rsize(b));
    memset(s->r, 1, n);
    memset(b->seen2, 0, n);
    for (int32_t v = 0; v < b->n; v++) s->save[v] = !rkm__ilp_phantom(b, v) ? -1 : x[v] ? b->st[v] : 0;
    for (int32_t t = 1; t <= b->nb; t++) {
        uint8_t *r = s->r + (size_t)t * n;
        int32_t o = b->bop[t];
        const rkm__op *bo = &g->ops[b->op[o]];
        if (rkm__ilp_phantom(b, o)) rkm__ilp_greedy_need(b, x, r, o);
        for (int32_t k = 0; k < bo->n_saved; k++) {
            int32_t i = rkm__ilp_loc(b, bo->saved[k]);
            if (i >= 0) rkm__ilp_greedy_need(b, x, r, b->tprod[i]);
        }
        for (int32_t v = b->n; v-- > 0;) {
            if (!r[v]) continue;
            const rkm__op *op = &g->ops[b->op[v]];
            for (int32_t k = 0; k < op->n_in; k++) {
                int32_t i = rkm__ilp_loc(b, op->in[k]);
                if (i >= 0) rkm__ilp_greedy_need(b, x, r, b->tprod[i]);
            }
        }
        for (int32_t v = 0; v < b->n; v++)
            if (r[v] && x[v] == 2) {
                b->seen2[v] = 1;
                if (rkm__ilp_phantom(b, v)) s->save[v] = t;
            }
    }
}

/* How far s is over the budgets (0: fits). */
static uint64_t rkm__ilp_excess(const rkm__ilp_sched *s, uint64_t peak, uint64_t kept)
{
    uint64_t e = s->peak > peak ? s->peak - peak : 0;
    uint64_t f = s->kept > kept ? s->kept - kept : 0;
    return e > UINT64_MAX - f ? UINT64_MAX : e + f;
}

/* Is a better than c: fitting first, then less excess, then less time? */
static int rkm__ilp_better(const rkm__ilp_sched *a, const rkm__ilp_sched *c, uint64_t peak, uint64_t kept)
{
    uint64_t ea = rkm__ilp_excess(a, peak, kept), ec = rkm__ilp_excess(c, peak, kept);
    if (ea != ec) return ea < ec;
    return a->time < c->time;
}

/* Evaluate x with op v set to `val` into b->tmp. Returns 1 if valid. */
static int rkm__ilp_greedy_try(rkm__ilp_block *b, int32_t v, uint8_t val, rkm_result *res)
{
    uint8_t keep = b->greedy_x[v];
    b->greedy_x[v] = val;
    rkm__ilp_greedy_sched(b, b->greedy_x, &b->tmp);
    int ok = rkm__ilp_measure(b, &b->tmp, res);
    b->greedy_x[v] = keep;
    return ok;
}

/* Local search over recompute sets from x (greedy_x): take the change of one
 * op's mode that gives the best (excess, time) while it improves. Leaves the
 * best schedule in *out. */
static rkm_result rkm__ilp_descend(rkm__ilp_block *b, uint64_t peak, uint64_t kept, rkm__ilp_budget *u,
                                   rkm__ilp_sched *out)
{
    rkm_result res = RKM_OK;
    rkm__ilp_greedy_sched(b, b->greedy_x, out);
    if (!rkm__ilp_measure(b, out, &res)) return res ? res : RKM_ERROR_SOLVER;
    int32_t xo = b->tprod[rkm__ilp_loc(b, b->x_out)];
    for (int32_t round = 0; round < 4 * b->n && !rkm__ilp_spent(u, 1); round++) {
        int32_t pick = -1;
        uint8_t to = 0;
        for (int32_t v = 0; v < b->n; v++)
            for (uint8_t val = 0; val < 3 && b->need_o[v] >= 1 && v != xo; val++) {
                if (val == b->greedy_x[v]) continue;
                int ok = rkm__ilp_greedy_try(b, v, val, &res);
                u->evals += (double)b->last_steps;
                if (!ok) {
                    if (res) return res;
                    continue;
                }
                if (rkm__ilp_better(&b->tmp, out, peak, kept)) {
                    pick = v;
                    to = val;
                    rkm__ilp_sched_copy(b, out, &b->tmp);
                }
            }
        if (pick < 0) break;
        b->greedy_x[pick] = to;
    }
    return RKM_OK;
}

/* Greedy: the local search from "recompute nothing" and from "recompute
 * everything", the better of the two in *out (valid, maybe not fitting;
 * not b->tmp or b->alt, which it uses). */
static rkm_result rkm__ilp_greedy(rkm__ilp_block *b, uint64_t peak, uint64_t kept, rkm__ilp_budget *u,
                                  rkm__ilp_sched *out)
{
    memset(b->greedy_x, 1, (size_t)b->n);
    rkm_result r = rkm__ilp_descend(b, peak, kept, u, &b->alt);
    if (r) return r;
    memset(b->greedy_x, 0, (size_t)b->n);
    if ((r = rkm__ilp_descend(b, peak, kept, u, out))) return r;
    if (rkm__ilp_better(&b->alt, out, peak, kept)) rkm__ilp_sched_copy(b, out, &b->alt);
    return RKM_OK;
}

/* ---- structure of a block ------------------------------------------------ */

/* Check the block against the graph: ops in topological order, reads only
 * inputs, x_in and block tensors, block tensors read outside only if x_out. */
static rkm_result rkm__ilp_check(const rkm__ilp_block *b, const int32_t *opl)
{
    const rkm_graph *g = b->g;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_in; k++) {
            int32_t t = o->in[k];
            if (b->lt[t] >= 0 || t == b->x_in || (g->tensors[t].flags & RKM_TENSOR_INPUT)) {
                if (t != b->x_out || b->is_last) continue;
                return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "block ILP: op %s reads the block's output %s", o->name,
                                g->tensors[t].name);
            }
            return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "block ILP: op %s reads %s, made outside the block", o->name,
                            g->tensors[t].name);
        }
    }
    for (size_t x = 0; x < g->n_ops; x++) {
        if (opl[x] >= 0) continue;
        const rkm__op *o = &g->ops[x];
        for (int32_t k = 0; k < o->n_in; k++)
            if (b->lt[o->in[k]] >= 0 && o->in[k] != b->x_out)
                return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "block ILP: %s is read by op %s outside the block",
                                g->tensors[o->in[k]].name, o->name);
    }
    if (b->x_in >= 0 && b->lt[b->x_in] >= 0)
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "block ILP: x_in %s is made inside the block", g->tensors[b->x_in].name);
    if (b->lt[b->x_out] < 0) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "block ILP: no block op makes x_out");
    if (!g->tensors[b->x_out].has_grad)
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "block ILP: x_out %s has no gradient", g->tensors[b->x_out].name);
    return RKM_OK;
}

/* Stages (backwards in reverse order), readers, and how late each op and
 * tensor can be useful (need). */
static void rkm__ilp_derive(rkm__ilp_block *b)
{
    const rkm_graph *g = b->g;
    int32_t t = 0;
    for (int32_t v = b->n; v-- > 0;) {
        b->st[v] = g->ops[b->op[v]].has_bwd ? ++t : 0;
        if (b->st[v]) b->bop[b->st[v]] = v;
    }
    for (int32_t i = 0; i <= b->nt; i++) b->rd_off[i] = 0;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_in; k++)
            if (b->lt[o->in[k]] >= 0) b->rd_off[b->lt[o->in[k]] + 1]++;
    }
    for (int32_t i = 0; i < b->nt; i++) b->rd_off[i + 1] += b->rd_off[i];
    for (int32_t i = 0; i < b->nt; i++) b->last0[i] = b->tprod[i];
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_in; k++) {
            int32_t i = b->lt[o->in[k]];
            if (i < 0) continue;
            b->rd[b->rd_off[i] + b->live[i]++] = v; /* live[]: fill counters, zeroed by the caller */
            b->last0[i] = v;
        }
    }
    for (int32_t v = b->n; v-- > 0;) {
        const rkm__op *o = &g->ops[b->op[v]];
        int32_t nv = rkm__ilp_phantom(b, v) ? b->st[v] : 0;
        for (int32_t k = 0; k < o->n_out; k++) {
            int32_t i = b->lt[o->out[k]], nd = o->out[k] == b->x_out ? 1 : 0;
            for (int32_t j = b->rd_off[i]; j < b->rd_off[i + 1]; j++)
                if (b->need_o[b->rd[j]] > nd) nd = b->need_o[b->rd[j]];
            for (int32_t s = 1; s <= b->nb; s++)
                if (s > nd && rkm__ilp_bwd_reads(b, s, i)) nd = s;
            b->need_t[i] = nd;
            if (nd > nv) nv = nd;
        }
        b->need_o[v] = nv;
    }
}

/* Sum of bytes of the block tensors in a list. */
static uint64_t rkm__ilp_list_bytes(const rkm__ilp_block *b, const int32_t *list, int32_t n)
{
    uint64_t m = 0;
    for (int32_t k = 0; k < n; k++)
        if (b->lt[list[k]] >= 0) m += b->g->tensors[list[k]].bytes;
    return m;
}

/* What must be live at some node of every schedule: x_out (and its
 * gradient) at the boundary, an op's inputs and outputs in the forward pass,
 * a backward's saved tensors, phantom and gradients. */
static void rkm__ilp_floors(rkm__ilp_block *b)
{
    const rkm_graph *g = b->g;
    uint64_t xo = g->tensors[b->x_out].bytes;
    b->min_kept = b->static_bytes + xo;
    b->min_peak = b->min_kept + xo;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        uint64_t m = b->static_bytes + rkm__ilp_list_bytes(b, o->in, o->n_in) + rkm__ilp_list_bytes(b, o->out, o->n_out);
        if (m + o->fwd_ws > b->min_peak) b->min_peak = m + o->fwd_ws;
        int32_t t = b->st[v];
        if (!t) continue;
        m = b->static_bytes + (t == 1 ? xo : b->gstart[t]) + b->gnew[t] + o->bwd_ws + o->phantom +
            rkm__ilp_list_bytes(b, o->saved, o->n_saved);
        if (m > b->min_peak) b->min_peak = m;
    }
}

/* Gradient bytes along the backward order (fixed, so constants), static
 * bytes, base time and the two scales. */
static rkm_result rkm__ilp_constants(rkm__ilp_block *b)
{
    const rkm_graph *g = b->g;
    uint8_t *gl = rkm__calloc(b->ctx, g->n_tensors + 1, 1);
    if (!gl) return rkm__nomem(b->ctx, "block ILP");
    uint64_t live = g->tensors[b->x_out].bytes, mx = 1;
    gl[b->x_out] = 1;
    b->gstart[1] = 0;
    for (int32_t t = 1; t <= b->nb; t++) {
        if (t > 1) b->gstart[t] = live;
        const rkm__op *o = &g->ops[b->op[b->bop[t]]];
        b->gnew[t] = b->gfree[t] = 0;
        for (int32_t k = 0; k < o->n_in; k++)
            if (g->tensors[o->in[k]].has_grad && !gl[o->in[k]]) {
                gl[o->in[k]] = 1;
                b->gnew[t] += g->tensors[o->in[k]].bytes;
            }
        for (int32_t k = 0; k < o->n_out; k++)
            if (g->tensors[o->out[k]].has_grad && gl[o->out[k]]) {
                gl[o->out[k]] = 0;
                b->gfree[t] += g->tensors[o->out[k]].bytes;
            }
        live = live + b->gnew[t] - b->gfree[t];
    }
    b->gstart[b->nb + 1] = live;
    rkm__free(b->ctx, gl, g->n_tensors + 1);
    b->static_bytes = g->input_bytes;
    if (b->x_in >= 0 && !(g->tensors[b->x_in].flags & RKM_TENSOR_INPUT)) b->static_bytes += g->tensors[b->x_in].bytes;
    b->base_time = 0;
    b->tscale = 0;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        b->base_time += o->fwd + (o->has_bwd ? o->bwd : 0);
        if (o->fwd > b->tscale) b->tscale = o->fwd;
        uint64_t m = o->phantom > o->fwd_ws ? o->phantom : o->fwd_ws;
        if (o->bwd_ws > m) m = o->bwd_ws;
        for (int32_t k = 0; k < o->n_out; k++)
            if (g->tensors[o->out[k]].bytes > m) m = g->tensors[o->out[k]].bytes;
        if (m > mx) mx = m;
    }
    if (!(b->tscale > 0)) b->tscale = 1;
    rkm__ilp_floors(b);
    /* A power of two: bytes / mscale is exact in a double. */
    b->mscale = 1;
    while (b->mscale * 2 <= (double)mx) b->mscale *= 2;
    return RKM_OK;
}

/* ---- the model ----------------------------------------------------------- */

static int32_t rkm__ilp_R(const rkm__ilp_block *b, int32_t t, int32_t v)
{
    return t == 0 ? RKM__ILP_ONE : b->colR[(size_t)t * (size_t)b->n + (size_t)v];
}

static int32_t rkm__ilp_RP(const rkm__ilp_block *b, int32_t t, int32_t v)
{
    return b->colRP[(size_t)t * (size_t)b->n + (size_t)v];
}

static int32_t rkm__ilp_S(const rkm__ilp_block *b, int32_t t, int32_t i)
{
    return t >= 1 && t <= b->nb + 1 ? b->colS[(size_t)t * (size_t)b->nt + (size_t)i] : 0;
}

/* Append a node (and its free candidates: block tensors it reads or makes,
 * unless the stage's backward is sure to read them later). */
static void rkm__ilp_add_node(rkm__ilp_block *b, int32_t t, int kind, int32_t v, int32_t *c, int32_t *nn, int32_t *nf)
{
    const rkm_graph *g = b->g;
    int32_t q = ++*c;
    if (b->node) b->node[*nn] = (rkm__ilp_node){kind, v, q, *nf};
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
            if (b->node) b->fcand[*nf] = (rkm__ilp_free){i, f};
            ++*nf;
        }
    }
}

/* Give every variable its column; list each stage's nodes. Counting pass
 * when b->node is NULL (column numbers are the same in both passes). */
static void rkm__ilp_columns(rkm__ilp_block *b)
{
    int32_t c = 0, nn = 0, nf = 0, xo = b->lt[b->x_out];
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++)
            if (b->need_o[v] >= t) b->colR[(size_t)t * (size_t)b->n + (size_t)v] = ++c;
    for (int32_t t = 0; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++)
            if (rkm__ilp_phantom(b, v) && t <= b->st[v]) b->colRP[(size_t)t * (size_t)b->n + (size_t)v] = ++c;
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t i = 0; i < b->nt; i++)
            if (t <= b->need_t[i])
                b->colS[(size_t)t * (size_t)b->nt + (size_t)i] = t == 1 && i == xo ? RKM__ILP_ONE : ++c;
    for (int32_t t = 0; t <= b->nb; t++) {
        if (b->node) b->node_off[t] = nn;
        if (t == 1) rkm__ilp_add_node(b, t, RKM__ILP_NODE_LOSS, -1, &c, &nn, &nf);
        for (int32_t v = 0; v < b->n; v++)
            if (rkm__ilp_R(b, t, v)) rkm__ilp_add_node(b, t, RKM__ILP_NODE_FWD, v, &c, &nn, &nf);
        if (t >= 1) rkm__ilp_add_node(b, t, RKM__ILP_NODE_BWD, b->bop[t], &c, &nn, &nf);
    }
    if (b->node) b->node_off[b->nb + 1] = nn;
    b->ncols = c;
    b->n_nodes = nn;
    b->n_fcand = nf;
}

/* A row being built: coefficients merged per column, constants apart. */
typedef struct rkm__ilp_row {
    int *col;
    REAL *val;
    double *dense;  /* [ncols+1] */
    uint8_t *seen;  /* [ncols+1] */
    int n;
    double k;       /* constant part of the left-hand side */
    int bad;        /* a row without columns that cannot hold */
    int failed;     /* lp_solve refused a row */
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

/* Send the row `lhs type rhs` to lp_solve and reset the builder. */
static void rkm__ilp_emit_row(rkm__ilp_block *b, rkm__ilp_row *w, int type, double rhs)
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
    } else if (!add_constraintex(b->lp, m, w->val, w->col, type, rhs)) {
        w->failed = 1;
    }
    w->n = 0;
    w->k = 0;
}

/* Stage of node k. */
static int32_t rkm__ilp_stage_of(const rkm__ilp_block *b, int32_t k)
{
    int32_t t = 0;
    while (k >= b->node_off[t + 1]) t++;
    return t;
}

/* Row sets of the model; see the comment at the top of the section. */
static void rkm__ilp_rows_deps(rkm__ilp_block *b, rkm__ilp_row *w)
{
    const rkm_graph *g = b->g;
    for (int32_t k = b->node_off[1]; k < b->n_nodes; k++) {
        const rkm__ilp_node *nd = &b->node[k];
        if (nd->kind == RKM__ILP_NODE_LOSS) continue;
        int32_t t = rkm__ilp_stage_of(b, k);
        const rkm__op *o = &g->ops[b->op[nd->v]];
        int fwd = nd->kind == RKM__ILP_NODE_FWD;
        const int32_t *list = fwd ? o->in : o->saved;
        for (int32_t j = 0; j < (fwd ? o->n_in : o->n_saved); j++) {
            int32_t i = b->lt[list[j]];
            if (i < 0) continue;
            /* fwd: R[t,v] <= R[t,p] + S[t,i];  bwd: R[t,p] + S[t,i] >= 1 */
            if (fwd) rkm__ilp_term(w, rkm__ilp_R(b, t, nd->v), 1);
            rkm__ilp_term(w, rkm__ilp_R(b, t, b->tprod[i]), fwd ? -1 : 1);
            rkm__ilp_term(w, rkm__ilp_S(b, t, i), fwd ? -1 : 1);
            rkm__ilp_emit_row(b, w, fwd ? LE : GE, fwd ? 0 : 1);
        }
        if (!fwd) continue;
        for (int32_t j = 0; j < o->n_out; j++) {
            /* recompute only what is not live: R[t,v] + S[t,T] <= 1; but the
             * loss node may free x_out before stage 1 recomputes it (counted
             * as new memory: exact or more) */
            if (t == 1 && o->out[j] == b->x_out) continue;
            rkm__ilp_term(w, rkm__ilp_R(b, t, nd->v), 1);
            rkm__ilp_term(w, rkm__ilp_S(b, t, b->lt[o->out[j]]), 1);
            rkm__ilp_emit_row(b, w, LE, 1);
        }
    }
    for (int32_t i = 0; i < b->nt; i++) /* S[t+1,i] <= S[t,i] + R[t,p] */
        for (int32_t t = 1; t < b->need_t[i]; t++) {
            rkm__ilp_term(w, rkm__ilp_S(b, t + 1, i), 1);
            rkm__ilp_term(w, rkm__ilp_S(b, t, i), -1);
            rkm__ilp_term(w, rkm__ilp_R(b, t, b->tprod[i]), -1);
            rkm__ilp_emit_row(b, w, LE, 0);
        }
    for (int32_t v = 0; v < b->n; v++) { /* one save run, on a run: sum_t RP[t,v] = 1, RP <= R */
        if (!rkm__ilp_phantom(b, v)) continue;
        for (int32_t t = 0; t <= b->st[v]; t++) rkm__ilp_term(w, rkm__ilp_RP(b, t, v), 1);
        rkm__ilp_emit_row(b, w, EQ, 1);
        for (int32_t t = 1; t <= b->st[v]; t++) {
            rkm__ilp_term(w, rkm__ilp_RP(b, t, v), 1);
            rkm__ilp_term(w, rkm__ilp_R(b, t, v), -1);
            rkm__ilp_emit_row(b, w, LE, 0);
        }
        /* dominance: an op recomputed in its own backward's stage saves there */
        for (int32_t t = 0; t < b->st[v]; t++) rkm__ilp_term(w, rkm__ilp_RP(b, t, v), 1);
        rkm__ilp_term(w, rkm__ilp_R(b, b->st[v], v), 1);
        rkm__ilp_emit_row(b, w, LE, 1);
    }
}

/* Is later node j (same stage) a recomputation reading block tensor i? */
static int rkm__ilp_node_reads(const rkm__ilp_block *b, const rkm__ilp_node *nd, int32_t i)
{
    if (nd->kind != RKM__ILP_NODE_FWD) return 0;
    const rkm__op *o = &b->g->ops[b->op[nd->v]];
    return rkm__list_has(o->in, o->n_in, b->tg[i]);
}

/* F[t,i,k] <= R[t,k];  F + S[t+1,i] <= 1;  F + R[t,j] <= 1 for later readers j.
 * The loss node may free x_out only if stage 1 makes it again before the
 * backward reads it or stage 2 keeps it: there the hazards allow R[1,p]. */
static void rkm__ilp_rows_frees(rkm__ilp_block *b, rkm__ilp_row *w)
{
    for (int32_t k = b->node_off[1]; k < b->n_nodes; k++) {
        const rkm__ilp_node *nd = &b->node[k];
        int32_t t = rkm__ilp_stage_of(b, k), end = b->node_off[t + 1];
        int loss = nd->kind == RKM__ILP_NODE_LOSS;
        int32_t remake = loss ? rkm__ilp_R(b, 1, b->tprod[b->lt[b->x_out]]) : 0;
        for (const rkm__ilp_free *f = b->fcand + nd->f0; f < rkm__ilp_fend(b, k); f++) {
            if (nd->kind == RKM__ILP_NODE_FWD || (loss && rkm__ilp_bwd_reads(b, 1, f->i))) {
                rkm__ilp_term(w, f->col, 1);
                rkm__ilp_term(w, loss ? remake : rkm__ilp_R(b, t, nd->v), -1);
                rkm__ilp_emit_row(b, w, LE, 0);
            }
            if (rkm__ilp_S(b, t + 1, f->i)) {
                rkm__ilp_term(w, f->col, 1);
                rkm__ilp_term(w, rkm__ilp_S(b, t + 1, f->i), 1);
                rkm__ilp_term(w, remake, -1);
                rkm__ilp_emit_row(b, w, LE, 1);
            }
            for (int32_t j = k + 1; j < end; j++)
                if (rkm__ilp_node_reads(b, &b->node[j], f->i)) {
                    rkm__ilp_term(w, f->col, 1);
                    rkm__ilp_term(w, rkm__ilp_R(b, t, b->node[j].v), 1);
                    rkm__ilp_emit_row(b, w, LE, 1);
                }
        }
    }
}

/* Memory: Q[k] = what the previous node left + what node k makes + its
 * workspace. Stage 0 frees each tensor after its last stage-0 use unless
 * kept (S[1]); later stages start from what is kept. In mscale units. */
static void rkm__ilp_rows_memory(rkm__ilp_block *b, rkm__ilp_row *w)
{
    const rkm_graph *g = b->g;
    double ms = b->mscale;
    for (int32_t k = 0; k < b->n_nodes; k++) {
        const rkm__ilp_node *nd = &b->node[k];
        int32_t t = rkm__ilp_stage_of(b, k), v = nd->v;
        const rkm__op *o = v >= 0 ? &g->ops[b->op[v]] : NULL;
        rkm__ilp_term(w, nd->q, 1);
        if (k > b->node_off[t]) { /* what node k-1 left */
            const rkm__ilp_node *pv = &b->node[k - 1];
            const rkm__op *po = pv->v >= 0 ? &g->ops[b->op[pv->v]] : NULL;
            rkm__ilp_term(w, pv->q, -1);
            if (pv->kind == RKM__ILP_NODE_FWD) rkm__ilp_term(w, rkm__ilp_R(b, t, pv->v), (double)po->fwd_ws / ms);
            if (pv->kind == RKM__ILP_NODE_BWD)
                rkm__ilp_term(w, RKM__ILP_ONE, ((double)po->bwd_ws + (double)b->gfree[t] + (double)po->phantom) / ms);
            for (const rkm__ilp_free *f = b->fcand + pv->f0; t > 0 && f < rkm__ilp_fend(b, k - 1); f++)
                rkm__ilp_term(w, f->col, (double)g->tensors[b->tg[f->i]].bytes / ms);
            for (int32_t i = 0; t == 0 && i < b->nt; i++)
                if (b->last0[i] == pv->v) {
                    rkm__ilp_term(w, RKM__ILP_ONE, (double)g->tensors[b->tg[i]].bytes / ms);
                    rkm__ilp_term(w, rkm__ilp_S(b, 1, i), -(double)g->tensors[b->tg[i]].bytes / ms);
                }
        } else { /* the stage start */
            rkm__ilp_term(w, RKM__ILP_ONE, -(double)(b->static_bytes + b->gstart[t]) / ms);
            for (int32_t i = 0; i < b->nt; i++)
                rkm__ilp_term(w, rkm__ilp_S(b, t, i), -(double)g->tensors[b->tg[i]].bytes / ms);
            for (int32_t u = 0; u < b->n; u++)
                for (int32_t t0 = 0; t0 < t && rkm__ilp_phantom(b, u) && t <= b->st[u]; t0++)
                    rkm__ilp_term(w, rkm__ilp_RP(b, t0, u), -(double)g->ops[b->op[u]].phantom / ms);
        }
        if (nd->kind == RKM__ILP_NODE_LOSS) rkm__ilp_term(w, RKM__ILP_ONE, -(double)g->tensors[b->x_out].bytes / ms);
        if (nd->kind == RKM__ILP_NODE_BWD) rkm__ilp_term(w, RKM__ILP_ONE, -((double)b->gnew[t] + (double)o->bwd_ws) / ms);
        if (nd->kind == RKM__ILP_NODE_FWD) {
            double made = (double)o->fwd_ws;
            for (int32_t j = 0; j < o->n_out; j++) made += (double)g->tensors[o->out[j]].bytes;
            rkm__ilp_term(w, rkm__ilp_R(b, t, v), -made / ms);
            if (rkm__ilp_phantom(b, v) && t <= b->st[v]) rkm__ilp_term(w, rkm__ilp_RP(b, t, v), -(double)o->phantom / ms);
        }
        rkm__ilp_emit_row(b, w, EQ, 0);
    }
}

/* Dominance: keep a tensor only if a stage reads or carries it; recompute an
 * op only if something later in the stage reads it, carries it or its
 * phantom is saved. They cut equivalent schedules, not the optimum. */
static void rkm__ilp_rows_dominance(rkm__ilp_block *b, rkm__ilp_row *w)
{
    const rkm_graph *g = b->g;
    int32_t xo = b->lt[b->x_out];
    for (int32_t t = 1; t <= b->nb; t++) {
        for (int32_t i = 0; i < b->nt; i++) {
            if (rkm__ilp_S(b, t, i) <= 0 || rkm__ilp_bwd_reads(b, t, i) || (t == 1 && i == xo)) continue;
            rkm__ilp_term(w, rkm__ilp_S(b, t, i), 1);
            for (int32_t j = b->rd_off[i]; j < b->rd_off[i + 1]; j++) rkm__ilp_term(w, rkm__ilp_R(b, t, b->rd[j]), -1);
            rkm__ilp_term(w, rkm__ilp_S(b, t + 1, i), -1);
            rkm__ilp_emit_row(b, w, LE, 0);
        }
        for (int32_t v = 0; v < b->n; v++) {
            if (!rkm__ilp_R(b, t, v)) continue;
            const rkm__op *o = &g->ops[b->op[v]];
            int sure = 0;
            for (int32_t k = 0; k < o->n_out; k++) sure |= rkm__ilp_bwd_reads(b, t, b->lt[o->out[k]]);
            if (sure) continue;
            rkm__ilp_term(w, rkm__ilp_R(b, t, v), 1);
            for (int32_t k = 0; k < o->n_out; k++) {
                int32_t i = b->lt[o->out[k]];
                for (int32_t j = b->rd_off[i]; j < b->rd_off[i + 1]; j++) rkm__ilp_term(w, rkm__ilp_R(b, t, b->rd[j]), -1);
                rkm__ilp_term(w, rkm__ilp_S(b, t + 1, i), -1);
            }
            rkm__ilp_term(w, rkm__ilp_RP(b, t, v), -1);
            rkm__ilp_emit_row(b, w, LE, 0);
        }
    }
}

/* ---- lp_solve ------------------------------------------------------------ */

static int __WINAPI rkm__ilp_abortfn(lprec *lp, void *budget)
{
    rkm__ilp_budget *u = budget;
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
static double rkm__ilp_obj(const rkm__ilp_block *b, const rkm__ilp_sched *s)
{
    double z = 0;
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++)
            if (s->r[(size_t)t * (size_t)b->n + (size_t)v]) z += b->g->ops[b->op[v]].fwd / b->tscale;
    return z;
}

/* Build the lprec (under the lock): columns, objective, rows, settings. */
static rkm_result rkm__ilp_build(rkm__ilp_block *b)
{
    rkm_context *ctx = b->ctx;
    size_t nc = (size_t)b->ncols + 1;
    rkm__ilp_row w = {0};
    w.col = rkm__alloc(ctx, nc * sizeof *w.col);
    w.val = rkm__alloc(ctx, nc * sizeof *w.val);
    w.dense = rkm__calloc(ctx, nc, sizeof *w.dense);
    w.seen = rkm__calloc(ctx, nc, 1);
    rkm_result r = RKM_OK;
    if (!w.col || !w.val || !w.dense || !w.seen) r = rkm__nomem(ctx, "block ILP");
    rkm__ilp_lock();
    if (!r && !(b->lp = make_lp(0, b->ncols))) r = rkm__nomem(ctx, "block ILP: lp_solve");
    if (!r) {
        lprec *lp = b->lp;
        set_outputfile(lp, "");
        set_verbose(lp, NEUTRAL);
        put_logfunc(lp, rkm__ilp_logfn, ctx);
        for (size_t j = 0; j < (size_t)(b->nb + 1) * (size_t)b->n; j++) {
            if (b->colR[j] > 0) set_binary(lp, b->colR[j], TRUE);
            if (b->colRP[j] > 0) set_binary(lp, b->colRP[j], TRUE);
        }
        for (size_t j = 0; j < (size_t)(b->nb + 2) * (size_t)b->nt; j++)
            if (b->colS[j] > 0) set_binary(lp, b->colS[j], TRUE);
        for (int32_t f = 0; f < b->n_fcand; f++) set_upbo(lp, b->fcand[f].col, 1);
        set_add_rowmode(lp, TRUE);
        for (int32_t t = 1; t <= b->nb; t++)
            for (int32_t v = 0; v < b->n; v++) rkm__ilp_term(&w, rkm__ilp_R(b, t, v), b->g->ops[b->op[v]].fwd / b->tscale);
        int m = 0;
        for (int j = 0; j < w.n; j++) {
            w.col[m] = w.col[j];
            w.val[m++] = w.dense[w.col[j]];
            w.dense[w.col[j]] = 0;
            w.seen[w.col[j]] = 0;
        }
        w.n = 0;
        if (m && !set_obj_fnex(lp, m, w.val, w.col)) w.failed = 1;
        rkm__ilp_rows_deps(b, &w);
        rkm__ilp_rows_frees(b, &w);
        rkm__ilp_rows_memory(b, &w);
        rkm__ilp_rows_dominance(b, &w);
        set_add_rowmode(lp, FALSE);
        set_minim(lp);
        set_bb_floorfirst(lp, BRANCH_FLOOR);
        b->nrows = get_Nrows(lp);
        b->bad = w.bad;
        if (w.failed) r = rkm__err(ctx, RKM_ERROR_SOLVER, "block ILP: lp_solve refused the model");
    }
    rkm__ilp_unlock();
    rkm__free(ctx, w.col, nc * sizeof *w.col);
    rkm__free(ctx, w.val, nc * sizeof *w.val);
    rkm__free(ctx, w.dense, nc * sizeof *w.dense);
    rkm__free(ctx, w.seen, nc);
    return r;
}

/* Solve under the budgets (under the lock). cutoff < 0: none. Reads a
 * solution into b->tmp (r, save) when lp_solve has one. *root: the LP bound
 * lp_solve found at the root (objective units), or -1. */
static int rkm__ilp_run(rkm__ilp_block *b, uint64_t peak, uint64_t kept, double cutoff, rkm__ilp_budget *u,
                        double *root)
{
    const double lim = 9007199254740992.0; /* 2^53: exact as a double */
    uint64_t xb = b->g->tensors[b->x_out].bytes;
    rkm__ilp_lock();
    lprec *lp = b->lp;
    double inf = get_infinite(lp);
    double bp = (double)peak >= lim ? inf : (double)peak / b->mscale;
    double bk = (double)kept >= lim - (double)xb ? inf : ((double)kept + (double)xb) / b->mscale;
    for (int32_t k = 0; k < b->n_nodes; k++) set_upbo(lp, b->node[k].q, bp);
    set_upbo(lp, b->node[b->node_off[1]].q, bk < bp ? bk : bp);
    set_obj_bound(lp, cutoff >= 0 ? cutoff : inf);
    put_abortfunc(lp, rkm__ilp_abortfn, u);
    int status = solve(lp);
    *root = lp->real_solution < inf && lp->real_solution > -inf ? lp->real_solution : -1;
    if (status == OPTIMAL || status == SUBOPTIMAL) {
        get_variables(lp, b->x);
        rkm__ilp_sched *s = &b->tmp;
        for (int32_t t = 1; t <= b->nb; t++)
            for (int32_t v = 0; v < b->n; v++) {
                int32_t c = rkm__ilp_R(b, t, v);
                s->r[(size_t)t * (size_t)b->n + (size_t)v] = c > 0 && b->x[c - 1] > 0.5;
            }
        for (int32_t v = 0; v < b->n; v++) {
            s->save[v] = -1;
            for (int32_t t = 0; t <= b->nb && rkm__ilp_phantom(b, v); t++) {
                int32_t c = rkm__ilp_RP(b, t, v);
                if (c > 0 && b->x[c - 1] > 0.5) s->save[v] = t;
            }
        }
        memset(s->r, 1, (size_t)b->n);
    }
    put_abortfunc(lp, NULL, NULL);
    rkm__ilp_unlock();
    return status;
}

/* ---- entry points -------------------------------------------------------- */

/* Remember a found schedule (ring of RKM__ILP_CACHE, no duplicates), with
 * the budgets it is proven optimal for, if it is. */
static void rkm__ilp_remember(rkm__ilp_block *b, rkm__ilp_sched *s, uint64_t peak, uint64_t kept, int proven)
{
    s->proven = proven;
    s->bpeak = peak;
    s->bkept = kept;
    for (int32_t c = 0; c < b->n_cache; c++) {
        rkm__ilp_sched *e = &b->cache[c];
        if (memcmp(e->r, s->r, rkm__ilp_rsize(b)) || memcmp(e->save, s->save, (size_t)b->n * sizeof *s->save)) continue;
        if (proven && (!e->proven || (peak >= e->bpeak && kept >= e->bkept))) {
            e->proven = 1;
            e->bpeak = peak;
            e->bkept = kept;
        }
        return;
    }
    rkm__ilp_sched_copy(b, &b->cache[b->cache_next], s);
    b->cache_next = (b->cache_next + 1) % RKM__ILP_CACHE;
    if (b->n_cache < RKM__ILP_CACHE) b->n_cache++;
}

/* Remember budgets that admit nothing. */
static void rkm__ilp_remember_none(rkm__ilp_block *b, uint64_t peak, uint64_t kept)
{
    b->none[b->none_next] = (rkm__ilp_none){peak, kept};
    b->none_next = (b->none_next + 1) % RKM__ILP_CACHE;
    if (b->n_none < RKM__ILP_CACHE) b->n_none++;
}

/* What earlier solves settle: 1 if nothing fits (proven), 2 if b->best is
 * proven optimal; else 0, with b->best the fastest fitting schedule seen
 * (*have). */
static int rkm__ilp_recall(rkm__ilp_block *b, uint64_t peak, uint64_t kept, int *have)
{
    *have = 0;
    if (peak < b->min_peak || kept < b->min_kept) return 1;
    for (int32_t c = 0; c < b->n_none; c++)
        if (peak <= b->none[c].peak && kept <= b->none[c].kept) return 1;
    for (int32_t c = 0; c < b->n_cache; c++) {
        const rkm__ilp_sched *s = &b->cache[c];
        if (!rkm__ilp_fits(s, peak, kept)) continue;
        if (s->proven && peak <= s->bpeak && kept <= s->bkept) {
            rkm__ilp_sched_copy(b, &b->best, s);
            *have = 1;
            return 2;
        }
        if (!*have || s->time < b->best.time) {
            rkm__ilp_sched_copy(b, &b->best, s);
            *have = 1;
        }
    }
    return 0;
}

/* The steps of b->best, in an allocation of exactly their size. */
static rkm_result rkm__ilp_output(rkm__ilp_block *b, rkm_step **steps, size_t *n_fwd, size_t *n_bwd)
{
    rkm__ilp_out o;
    rkm_result r = rkm__ilp_emit(b, &b->best, &o);
    if (r) return r;
    rkm_step *s = rkm__realloc(b->ctx, o.s, o.cap * sizeof *o.s, o.n * sizeof *o.s);
    if (!s) {
        rkm__free(b->ctx, o.s, o.cap * sizeof *o.s);
        return rkm__nomem(b->ctx, "block ILP schedule");
    }
    *steps = s;
    *n_fwd = o.n_fwd;
    *n_bwd = o.n - o.n_fwd;
    return RKM_OK;
}

/* Take b->tmp as the best if it is valid, fits and is faster. */
static rkm_result rkm__ilp_offer(rkm__ilp_block *b, uint64_t peak, uint64_t kept, int *have, int *valid)
{
    rkm_result r = RKM_OK;
    *valid = rkm__ilp_measure(b, &b->tmp, &r);
    if (*valid && rkm__ilp_fits(&b->tmp, peak, kept) && (!*have || b->tmp.time < b->best.time)) {
        rkm__ilp_sched_copy(b, &b->best, &b->tmp);
        *have = 1;
    }
    return r;
}

/* lp_solve's verdict into the stats; returns whether the best (or "none")
 * is proven optimal. */
static int rkm__ilp_verdict(rkm__ilp_block *b, int status, int cutoff, int have, int valid, rkm__ilp_stats *st)
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

/* Hand b->best out: its steps, time and bound. */
static rkm_result rkm__ilp_finish(rkm__ilp_block *b, double t0, rkm_step **steps, size_t *n_fwd, size_t *n_bwd,
                                  rkm__ilp_stats *st, int *found)
{
    st->time = b->best.time;
    if (st->proven || st->bound > st->time) st->bound = st->time;
    rkm_result r = rkm__ilp_output(b, steps, n_fwd, n_bwd);
    *found = r == RKM_OK;
    st->seconds += rkm__now() - t0;
    return r;
}

static rkm_result rkm__ilp_block_solve(rkm__ilp_block *b, uint64_t peak_budget, uint64_t kept_budget,
                                       double time_limit_s, rkm_step **steps, size_t *n_fwd, size_t *n_bwd,
                                       rkm__ilp_stats *st, int *found)
{
    double t0 = rkm__now(), lim = time_limit_s > 0 ? time_limit_s : 1.0;
    rkm__ilp_budget u = {0, lim * RKM__ILP_CALLS_PER_S / (b->ncols + b->nrows), 0, lim * RKM__ILP_STEPS_PER_S / 2,
                         t0 + lim * RKM__ILP_WALL_SAFETY};
    *steps = NULL;
    *n_fwd = *n_bwd = 0;
    *found = 0;
    st->proven = 0;
    st->time = st->bound = 0;
    int have = 0, valid = 0, known = rkm__ilp_recall(b, peak_budget, kept_budget, &have);
    if (known) {
        st->proven = 1;
        if (known == 1) {
            st->seconds += rkm__now() - t0;
            return RKM_OK;
        }
        return rkm__ilp_finish(b, t0, steps, n_fwd, n_bwd, st, found);
    }
    rkm_result r = rkm__ilp_greedy(b, peak_budget, kept_budget, &u, &b->cand);
    if (r) return r;
    if (rkm__ilp_fits(&b->cand, peak_budget, kept_budget) && (!have || b->cand.time < b->best.time)) {
        rkm__ilp_sched_copy(b, &b->best, &b->cand);
        have = 1;
    }
    /* Nothing recomputed: no schedule is faster. */
    int proven = have && rkm__ilp_obj(b, &b->best) == 0;
    double root = -1;
    if (!proven && !b->bad) {
        double obj = have ? rkm__ilp_obj(b, &b->best) : -1;
        double cutoff = have ? obj - 1e-9 * (1 + obj) : -1;
        int status = rkm__ilp_run(b, peak_budget, kept_budget, cutoff, &u, &root);
        if (status == OPTIMAL || status == SUBOPTIMAL) {
            if ((r = rkm__ilp_offer(b, peak_budget, kept_budget, &have, &valid))) return r;
            if (!valid) rkm__log(b->ctx, RKM_LOG_WARN, "block ILP: a solution failed its replay; kept the fallback");
        }
        proven = rkm__ilp_verdict(b, status, cutoff >= 0, have, valid, st);
    }
    if (!have && proven) rkm__ilp_remember_none(b, peak_budget, kept_budget);
    st->proven = proven;
    if (!have) {
        st->seconds += rkm__now() - t0;
        return RKM_OK;
    }
    st->bound = proven ? b->best.time : b->base_time + (root > 0 ? root * b->tscale : 0);
    rkm__ilp_remember(b, &b->best, peak_budget, kept_budget, proven);
    return rkm__ilp_finish(b, t0, steps, n_fwd, n_bwd, st, found);
}

static void rkm__ilp_block_destroy(rkm__ilp_block *b)
{
    if (!b) return;
    rkm_context *ctx = b->ctx;
    const rkm_graph *g = b->g;
    size_t n = (size_t)b->n, nt = (size_t)b->nt, nb = (size_t)b->nb;
    if (b->lp) {
        rkm__ilp_lock();
        delete_lp(b->lp);
        rkm__ilp_unlock();
    }
    rkm__sim_free(&b->sim);
    for (int c = 0; c < RKM__ILP_CACHE; c++) rkm__ilp_sched_free(b, &b->cache[c]);
    rkm__ilp_sched_free(b, &b->tmp);
    rkm__ilp_sched_free(b, &b->best);
    rkm__ilp_sched_free(b, &b->alt);
    rkm__ilp_sched_free(b, &b->cand);
    rkm__free(ctx, b->op, n * sizeof *b->op);
    rkm__free(ctx, b->lt, (g->n_tensors + 1) * sizeof *b->lt);
    rkm__free(ctx, b->tg, nt * sizeof *b->tg);
    rkm__free(ctx, b->tprod, nt * sizeof *b->tprod);
    rkm__free(ctx, b->rd_off, (nt + 1) * sizeof *b->rd_off);
    rkm__free(ctx, b->rd, (size_t)b->n_rd * sizeof *b->rd);
    rkm__free(ctx, b->st, n * sizeof *b->st);
    rkm__free(ctx, b->bop, (nb + 1) * sizeof *b->bop);
    rkm__free(ctx, b->need_o, n * sizeof *b->need_o);
    rkm__free(ctx, b->need_t, nt * sizeof *b->need_t);
    rkm__free(ctx, b->last0, nt * sizeof *b->last0);
    rkm__free(ctx, b->gstart, (nb + 2) * sizeof *b->gstart);
    rkm__free(ctx, b->gnew, (nb + 1) * sizeof *b->gnew);
    rkm__free(ctx, b->gfree, (nb + 1) * sizeof *b->gfree);
    rkm__free(ctx, b->colR, (nb + 1) * n * sizeof *b->colR);
    rkm__free(ctx, b->colRP, (nb + 1) * n * sizeof *b->colRP);
    rkm__free(ctx, b->colS, (nb + 2) * nt * sizeof *b->colS);
    rkm__free(ctx, b->node, (size_t)b->n_nodes * sizeof *b->node);
    rkm__free(ctx, b->node_off, (nb + 2) * sizeof *b->node_off);
    rkm__free(ctx, b->fcand, (size_t)b->n_fcand * sizeof *b->fcand);
    rkm__free(ctx, b->x, ((size_t)b->ncols + 1) * sizeof *b->x);
    rkm__free(ctx, b->greedy_x, n);
    rkm__free(ctx, b->seen2, n);
    rkm__free(ctx, b->live, nt * sizeof *b->live);
    rkm__free(ctx, b->rbuf, (size_t)b->max_list * sizeof *b->rbuf);
    rkm__free(ctx, b, sizeof *b);
}

/* Local ids: ops (checked topological), block tensors and their producers. */
static rkm_result rkm__ilp_locals(rkm__ilp_block *b, const int32_t *ops, int32_t *opl)
{
    const rkm_graph *g = b->g;
    b->nt = 0;
    b->max_list = 1;
    for (int32_t v = 0; v < b->n; v++) {
        int32_t x = ops[v];
        if (x < 0 || (size_t)x >= g->n_ops || (v > 0 && x <= ops[v - 1]))
            return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "block ILP: op ids must be valid and increasing");
        b->op[v] = x;
        opl[x] = v;
        const rkm__op *o = &g->ops[x];
        b->nt += o->n_out;
        if (o->n_in >= b->max_list) b->max_list = o->n_in + 1;
        if (o->n_saved >= b->max_list) b->max_list = o->n_saved + 1;
    }
    return RKM_OK;
}

/* Allocate every array whose size is known once n, nt, nb are. */
static int rkm__ilp_alloc_arrays(rkm__ilp_block *b)
{
    rkm_context *ctx = b->ctx;
    size_t n = (size_t)b->n, nt = (size_t)b->nt, nb = (size_t)b->nb;
    b->tg = rkm__calloc(ctx, nt, sizeof *b->tg);
    b->tprod = rkm__calloc(ctx, nt, sizeof *b->tprod);
    b->rd_off = rkm__calloc(ctx, nt + 1, sizeof *b->rd_off);
    b->st = rkm__calloc(ctx, n, sizeof *b->st);
    b->bop = rkm__calloc(ctx, nb + 1, sizeof *b->bop);
    b->need_o = rkm__calloc(ctx, n, sizeof *b->need_o);
    b->need_t = rkm__calloc(ctx, nt, sizeof *b->need_t);
    b->last0 = rkm__calloc(ctx, nt, sizeof *b->last0);
    b->gstart = rkm__calloc(ctx, nb + 2, sizeof *b->gstart);
    b->gnew = rkm__calloc(ctx, nb + 1, sizeof *b->gnew);
    b->gfree = rkm__calloc(ctx, nb + 1, sizeof *b->gfree);
    b->colR = rkm__calloc(ctx, (nb + 1) * n, sizeof *b->colR);
    b->colRP = rkm__calloc(ctx, (nb + 1) * n, sizeof *b->colRP);
    b->colS = rkm__calloc(ctx, (nb + 2) * nt, sizeof *b->colS);
    b->node_off = rkm__calloc(ctx, nb + 2, sizeof *b->node_off);
    b->greedy_x = rkm__calloc(ctx, n, 1);
    b->seen2 = rkm__calloc(ctx, n, 1);
    b->live = rkm__calloc(ctx, nt, sizeof *b->live);
    b->rbuf = rkm__calloc(ctx, (size_t)b->max_list, sizeof *b->rbuf);
    int ok = b->tg && b->tprod && b->rd_off && b->st && b->bop && b->need_o && b->need_t && b->last0 && b->gstart &&
             b->gnew && b->gfree && b->colR && b->colRP && b->colS && b->node_off && b->greedy_x && b->seen2 && b->live && b->rbuf;
    ok = ok && rkm__ilp_sched_alloc(b, &b->tmp) && rkm__ilp_sched_alloc(b, &b->best) && rkm__ilp_sched_alloc(b, &b->alt) &&
              rkm__ilp_sched_alloc(b, &b->cand);
    for (int c = 0; c < RKM__ILP_CACHE && ok; c++) ok = rkm__ilp_sched_alloc(b, &b->cache[c]);
    return ok;
}

/* Number block tensors, fill readers, stages, needs, constants, columns. */
static rkm_result rkm__ilp_prepare(rkm__ilp_block *b, const int32_t *opl)
{
    const rkm_graph *g = b->g;
    int32_t i = 0;
    b->nb = 0;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        b->nb += o->has_bwd ? 1 : 0;
        for (int32_t k = 0; k < o->n_out; k++) {
            b->lt[o->out[k]] = i;
            i++;
        }
    }
    if ((double)(b->nb + 1) * b->n > 20.0 * RKM__ILP_MAX_COLS)
        return rkm__err(b->ctx, RKM_ERROR_SOLVER, "block ILP: %d ops are too many for one model", (int)b->n);
    if (!rkm__ilp_alloc_arrays(b)) return rkm__nomem(b->ctx, "block ILP");
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_out; k++) {
            b->tg[b->lt[o->out[k]]] = o->out[k];
            b->tprod[b->lt[o->out[k]]] = v;
        }
        for (int32_t k = 0; k < o->n_in; k++) b->n_rd += b->lt[o->in[k]] >= 0;
    }
    rkm_result r = rkm__ilp_check(b, opl);
    if (r) return r;
    if (!(b->rd = rkm__calloc(b->ctx, (size_t)b->n_rd + 1, sizeof *b->rd))) return rkm__nomem(b->ctx, "block ILP");
    b->n_rd += 1;
    rkm__ilp_derive(b);
    if ((r = rkm__ilp_constants(b))) return r;
    rkm__ilp_columns(b); /* count */
    if (b->ncols > RKM__ILP_MAX_COLS)
        return rkm__err(b->ctx, RKM_ERROR_SOLVER, "block ILP: %d ops make %d columns, more than lp_solve can take (%d)",
                        (int)b->n, (int)b->ncols, RKM__ILP_MAX_COLS);
    b->node = rkm__calloc(b->ctx, (size_t)b->n_nodes, sizeof *b->node);
    b->fcand = rkm__calloc(b->ctx, (size_t)b->n_fcand, sizeof *b->fcand);
    b->x = rkm__calloc(b->ctx, (size_t)b->ncols + 1, sizeof *b->x);
    if (!b->node || !b->fcand || !b->x) return rkm__nomem(b->ctx, "block ILP");
    rkm__ilp_columns(b);
    return RKM_OK;
}

static rkm_result rkm__ilp_block_create(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in,
                                        int32_t x_out, int is_last, rkm__ilp_block **out)
{
    *out = NULL;
    rkm_context *ctx = g->ctx;
    if (!g->finalized) return rkm__err(ctx, RKM_ERROR_STATE, "block ILP: the graph is not finalized");
    if (!ops || n_ops < 1 || (size_t)n_ops > g->n_ops || x_out < 0 || (size_t)x_out >= g->n_tensors ||
        x_in < -1 || (x_in >= 0 && (size_t)x_in >= g->n_tensors) || (is_last && x_out != g->loss))
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "block ILP: bad block (ops, x_in, x_out or is_last)");
    rkm__ilp_block *b = rkm__calloc(ctx, 1, sizeof *b);
    int32_t *opl = rkm__alloc(ctx, (g->n_ops + 1) * sizeof *opl);
    if (b) b->lt = rkm__alloc(ctx, (g->n_tensors + 1) * sizeof *b->lt);
    if (b) b->op = rkm__alloc(ctx, (size_t)n_ops * sizeof *b->op);
    if (!b || !opl || !b->lt || !b->op) {
        if (b) {
            rkm__free(ctx, b->lt, (g->n_tensors + 1) * sizeof *b->lt);
            rkm__free(ctx, b->op, (size_t)n_ops * sizeof *b->op);
            rkm__free(ctx, b, sizeof *b);
        }
        rkm__free(ctx, opl, (g->n_ops + 1) * sizeof *opl);
        return rkm__nomem(ctx, "block ILP");
    }
    b->g = g;
    b->ctx = ctx;
    b->n = n_ops;
    b->x_in = x_in;
    b->x_out = x_out;
    b->is_last = is_last ? 1 : 0;
    for (size_t x = 0; x < g->n_ops; x++) opl[x] = -1;
    for (size_t t = 0; t < g->n_tensors; t++) b->lt[t] = -1;
    rkm_result r = rkm__ilp_locals(b, ops, opl);
    if (!r) r = rkm__ilp_prepare(b, opl);
    if (!r) r = rkm__ilp_build(b);
    if (!r) r = rkm__sim_init(g, &b->sim);
    rkm__free(ctx, opl, (g->n_ops + 1) * sizeof *opl);
    if (r) {
        rkm__ilp_block_destroy(b);
        return r;
    }
    *out = b;
    return RKM_OK;
}

#endif /* RKM_OMIT_SOLVER */
#endif /* RKM_ILP_INCLUDED */
