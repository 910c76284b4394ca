/* ilp_sched.c -- the block ILP's schedules: steps, replay, the greedy, a block's shape
 *
 * Uses (through internal.h): base.c, graph.c, sim.c, plan.c. */
#include "internal.h"

#ifndef RKM_OMIT_SOLVER

/* ---- the shape's small queries, the work meter's check, errors --------- */

RKM__PRIVATE int rkm__ilp_spent(const rkm__ilp_work *u, int greedy)
{
    if (greedy ? u->evals >= u->max_evals : u->calls >= u->max_calls) return 1;
    if (u->stop && u->stop(u->user, fmax(u->calls / u->max_calls, u->evals / u->max_evals))) return 1;
    return rkm__now() > u->deadline;
}

RKM__PRIVATE size_t rkm__ilp_rsize(const rkm__ilp_shape *b) { return (size_t)(b->nb + 1) * (size_t)b->n; }

/* Copy src's contents and figures into dst, which keeps its own arrays. */
RKM__PRIVATE void rkm__ilp_sched_copy(const rkm__ilp_shape *b, rkm__ilp_sched *dst, const rkm__ilp_sched *src)
{
    rkm__ilp_sched own = *dst;
    memcpy(own.r, src->r, rkm__ilp_rsize(b));
    memcpy(own.save, src->save, (size_t)b->n * sizeof *own.save);
    *dst = *src;
    dst->r = own.r;
    dst->save = own.save;
    dst->r_bytes = own.r_bytes;
    dst->n_save = own.n_save;
}

/* Report an error of block b: "block ILP: first..last: why". */
RKM__PRIVATE rkm_result rkm__ilp_err(const rkm__ilp_shape *b, rkm_result code, const char *fmt, ...)
{
    char why[RKM__ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return rkm__err(b->ctx, code, "block ILP: %s..%s: %s", b->g->ops[b->op[0]].name, b->g->ops[b->op[b->n - 1]].name,
                    why);
}

RKM__PRIVATE int rkm__ilp_phantom(const rkm__ilp_shape *b, int32_t v)
{
    const rkm__op *o = &b->g->ops[b->op[v]];
    return o->phantom > 0 && o->has_bwd;
}

/* Local tensor of global t if it is a block tensor, else -1. */
RKM__PRIVATE int32_t rkm__ilp_loc(const rkm__ilp_shape *b, int32_t t) { return b->lt[t]; }

/* Does stage t's backward read block tensor i (saved)? */
RKM__PRIVATE int rkm__ilp_bwd_reads(const rkm__ilp_shape *b, int32_t t, int32_t i)
{
    if (t < 1 || t > b->nb) return 0;
    const rkm__op *o = &b->g->ops[b->op[b->bop[t]]];
    return rkm__list_has(o->saved, o->n_saved, b->tg[i]);
}

/* ---- schedules: steps, replay ------------------------------------------- */

static int rkm__ilp_push(rkm__ilp_out *o, int32_t kind, int32_t index, int32_t save)
{
    return rkm__steps_push(&o->l, kind, index, save);
}

/* The most events a schedule of the block has (rkm__ilp_events). */
RKM__PRIVATE size_t rkm__ilp_events_max(const rkm__ilp_shape *b)
{
    return (size_t)b->n * (size_t)(b->nb + 1) + (size_t)b->nb + 2;
}

/* Events of a schedule in order: stage 0's forwards, the loss node, then per
 * stage its recomputations and its backward. Returns the count. */
static size_t rkm__ilp_events(const rkm__ilp_shape *b, const rkm__ilp_sched *s, rkm__ilp_event *ev)
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
static int32_t rkm__ilp_reads(const rkm__ilp_shape *b, const rkm__ilp_event *e, int32_t *buf)
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

/* Emit the main step of event e. */
static int rkm__ilp_emit_event(const rkm__ilp_shape *b, const rkm__ilp_sched *s, const rkm__ilp_event *e,
                               rkm__ilp_out *o)
{
    const rkm_graph *g = b->g;
    if (e->kind == RKM__ILP_NODE_LOSS) return b->is_last ? rkm__ilp_push(o, RKM_STEP_LOSS, g->loss, 0) : 1;
    int32_t gop = b->op[e->v];
    if (e->kind == RKM__ILP_NODE_FWD)
        return rkm__ilp_push(o, RKM_STEP_FWD, gop, rkm__ilp_phantom(b, e->v) && s->save[e->v] == e->t);
    return rkm__ilp_push(o, RKM_STEP_BWD, gop, 0);
}

/* After a backward: its saved state and its outputs' gradients are dead. */
static int rkm__ilp_emit_bwd_frees(const rkm__ilp_shape *b, int32_t v, rkm__ilp_out *o)
{
    const rkm__op *op = &b->g->ops[b->op[v]];
    if (op->phantom > 0 && !rkm__ilp_push(o, RKM_STEP_FREE_SAVED, b->op[v], 0)) return 0;
    for (int32_t k = 0; k < op->n_out; k++)
        if (b->g->tensors[op->out[k]].has_grad && !rkm__ilp_push(o, RKM_STEP_FREE_GRAD, op->out[k], 0)) return 0;
    return 1;
}

/* Block tensor i is freed after event e: into e's list, in tensor order
 * (what a sort of the points by event, then tensor, gave). 0: no memory. */
static int rkm__ilp_free_at(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, size_t *n, size_t e, int32_t i)
{
    if (!rkm__reserve(b->ctx, (void **)&rp->fp, &rp->fcap, *n + 1, sizeof *rp->fp)) return 0;
    int32_t *at = &rp->fhead[e];
    while (*at >= 0 && rp->fp[*at].i < i) at = &rp->fp[*at].next;
    rp->fp[*n] = (rkm__ilp_fpoint){i, *at};
    *at = (int32_t)(*n)++;
    return 1;
}

/* Free points of the block tensors of the schedule whose m events are in
 * rp->ev, into rp->fhead's lists: each right after its last use before it
 * is made again, or right after it is made if nothing reads it. 0: no
 * memory. */
static int rkm__ilp_free_points(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, size_t m)
{
    const rkm__ilp_event *ev = rp->ev;
    int32_t *live = rp->live;
    size_t n = 0;
    int ok = 1;
    for (int32_t i = 0; i < b->nt; i++) live[i] = -1;
    for (size_t e = 0; e < m; e++) rp->fhead[e] = -1;
    /* Lifetimes: live[i] is the last event that touched i since it was made. */
    for (size_t e = 0; e < m && ok; e++) {
        int32_t nr = rkm__ilp_reads(b, &ev[e], rp->rbuf);
        for (int32_t j = 0; j < nr; j++) live[rp->rbuf[j]] = (int32_t)e;
        if (ev[e].kind != RKM__ILP_NODE_FWD) continue;
        const rkm__op *op = &b->g->ops[b->op[ev[e].v]];
        for (int32_t k = 0; k < op->n_out && ok; k++) {
            int32_t i = rkm__ilp_loc(b, op->out[k]);
            if (live[i] >= 0) ok = rkm__ilp_free_at(b, rp, &n, (size_t)live[i], i);
            live[i] = (int32_t)e;
        }
    }
    for (int32_t i = 0; i < b->nt && ok; i++)
        if (live[i] >= 0) ok = rkm__ilp_free_at(b, rp, &n, (size_t)live[i], i);
    return ok;
}

/* The steps of schedule s appended to o->l (empty, the caller's): events in
 * order, each followed by the frees rkm__ilp_free_points puts there. On
 * RKM_ERROR_NOMEM o->l is freed. */
RKM__PRIVATE rkm_result rkm__ilp_emit(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, const rkm__ilp_sched *s,
                                rkm__ilp_out *o)
{
    o->n_fwd = 0;
    size_t m = rkm__ilp_events(b, s, rp->ev);
    int ok = rkm__ilp_free_points(b, rp, m);
    for (size_t e = 0; e < m && ok; e++) {
        ok = rkm__ilp_emit_event(b, s, &rp->ev[e], o);
        if (ok && rp->ev[e].kind == RKM__ILP_NODE_BWD) ok = rkm__ilp_emit_bwd_frees(b, rp->ev[e].v, o);
        for (int32_t f = rp->fhead[e]; ok && f >= 0; f = rp->fp[f].next)
            ok = rkm__ilp_push(o, RKM_STEP_FREE, b->tg[rp->fp[f].i], 0);
        if (ok && e + 1 < m && rp->ev[e + 1].kind == RKM__ILP_NODE_LOSS) o->n_fwd = o->l.n;
    }
    if (!ok) {
        rkm__steps_free(&o->l);
        o->n_fwd = 0;
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for a schedule's steps");
    }
    return RKM_OK;
}

/* Does the simulator's state hold exactly the block's end state? */
static int rkm__ilp_end_ok(const rkm__ilp_shape *b, const rkm__sim *s)
{
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

/* Replay a block schedule from the block's start state; fills the figures
 * of s (absolute bytes; kept: all that is live at the end of F). Returns 1
 * if it is valid and ends in the block's end state. */
static int rkm__ilp_replay(const rkm__ilp_shape *b, rkm__sim *sim, const rkm__ilp_out *o, rkm__ilp_sched *s)
{
    rkm_sim_result r1, r2;
    rkm__sim_reset(sim);
    rkm__sim_give_tensor(sim, b->x_in);
    if (!rkm__sim_run(sim, o->l.s, o->n_fwd, &r1, NULL)) return 0;
    s->kept = sim->mem;
    if (!b->is_last) rkm__sim_give_grad(sim, b->x_out);
    if (!rkm__sim_run(sim, o->l.s + o->n_fwd, o->l.n - o->n_fwd, &r2, NULL)) return 0;
    s->peak = r1.peak > r2.peak ? r1.peak : r2.peak;
    s->time = r1.time + r2.time;
    return rkm__ilp_end_ok(b, sim);
}

/* Emit and replay schedule s, setting its figures. Returns 1 if valid;
 * RKM_ERROR_NOMEM is reported through *res. */
RKM__PRIVATE int rkm__ilp_measure(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, rkm__ilp_sched *s, rkm_result *res)
{
    rkm__ilp_out o = {rp->steps, 0};
    o.l.n = 0;
    *res = rkm__ilp_emit(b, rp, s, &o);
    rp->steps = o.l; /* its buffer, for the next schedule */
    if (*res) return 0;
    rp->last_steps = o.l.n;
    return rkm__ilp_replay(b, &rp->sim, &o, s);
}

RKM__PRIVATE int rkm__ilp_fits(const rkm__ilp_sched *s, uint64_t peak_budget, uint64_t kept_budget)
{
    return s->peak <= peak_budget && s->kept <= kept_budget;
}

/* ---- greedy: a recompute set -------------------------------------------- */

/* Mark op v to run in stage row r when the recompute set says it does not
 * keep its outputs from earlier: 1, recompute in every stage that reads
 * them; 2, recompute in the first such stage and keep them (and the
 * phantom) from there. */
static void rkm__ilp_greedy_need(const rkm__ilp_greedy_ws *gw, uint8_t *r, int32_t v)
{
    if (gw->x[v] == 1 || (gw->x[v] == 2 && !gw->seen2[v])) r[v] = 1;
}

/* The schedule that the recompute set gw->x describes: each stage
 * recomputes, from what is live, what its backward reads (the phantom of an
 * op with x != 0 included). */
static void rkm__ilp_greedy_sched(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_sched *s)
{
    const rkm_graph *g = b->g;
    const uint8_t *x = gw->x;
    size_t n = (size_t)b->n;
    memset(s->r, 0, rkm__ilp_rsize(b));
    memset(s->r, 1, n);
    memset(gw->seen2, 0, n);
    for (int32_t v = 0; v < b->n; v++) s->save[v] = !rkm__ilp_phantom(b, v) ? -1 : x[v] ? b->st[v] : 0;
    for (int32_t t = 1; t <= b->nb; t++) {
        uint8_t *r = s->r + (size_t)t * n;
        int32_t o = b->bop[t];
        const rkm__op *bo = &g->ops[b->op[o]];
        if (rkm__ilp_phantom(b, o)) rkm__ilp_greedy_need(gw, r, o);
        for (int32_t k = 0; k < bo->n_saved; k++) {
            int32_t i = rkm__ilp_loc(b, bo->saved[k]);
            if (i >= 0) rkm__ilp_greedy_need(gw, r, b->tprod[i]);
        }
        for (int32_t v = b->n; v-- > 0;) {
            if (!r[v]) continue;
            const rkm__op *op = &g->ops[b->op[v]];
            for (int32_t k = 0; k < op->n_in; k++) {
                int32_t i = rkm__ilp_loc(b, op->in[k]);
                if (i >= 0) rkm__ilp_greedy_need(gw, r, b->tprod[i]);
            }
        }
        for (int32_t v = 0; v < b->n; v++)
            if (r[v] && x[v] == 2) {
                gw->seen2[v] = 1;
                if (rkm__ilp_phantom(b, v)) s->save[v] = t;
            }
    }
}

/* How far s is over the budgets (0: fits). */
static uint64_t rkm__ilp_excess(const rkm__ilp_sched *s, uint64_t peak_budget, uint64_t kept_budget)
{
    uint64_t e = s->peak > peak_budget ? s->peak - peak_budget : 0;
    uint64_t f = s->kept > kept_budget ? s->kept - kept_budget : 0;
    return e > UINT64_MAX - f ? UINT64_MAX : e + f;
}

/* Is a better than c: fitting first, then less excess, then less time? */
static int rkm__ilp_better(const rkm__ilp_sched *a, const rkm__ilp_sched *c, uint64_t peak_budget,
                           uint64_t kept_budget)
{
    uint64_t ea = rkm__ilp_excess(a, peak_budget, kept_budget), ec = rkm__ilp_excess(c, peak_budget, kept_budget);
    if (ea != ec) return ea < ec;
    return a->time < c->time;
}

/* Evaluate the recompute set with op v set to `val` into gw->trial.
 * Returns 1 if valid. */
static int rkm__ilp_greedy_try(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_replayer *rp, int32_t v,
                               uint8_t val, rkm_result *res)
{
    uint8_t keep = gw->x[v];
    gw->x[v] = val;
    rkm__ilp_greedy_sched(b, gw, &gw->trial);
    int ok = rkm__ilp_measure(b, rp, &gw->trial, res);
    gw->x[v] = keep;
    return ok;
}

/* One round of the local search: every change of one op's mode, the best
 * (excess, time) below *out's into *out. *pick: the op changed (-1: none),
 * *to its new mode. The wall clock (not the work, which stops between
 * rounds) ends a round early: a round of a 60-op block takes tens of ms. */
static rkm_result rkm__ilp_greedy_round(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_replayer *rp,
                                        uint64_t peak_budget, uint64_t kept_budget, rkm__ilp_work *work,
                                        rkm__ilp_sched *out, int32_t *pick, uint8_t *to)
{
    rkm_result res = RKM_OK;
    int32_t xo = b->tprod[rkm__ilp_loc(b, b->x_out)];
    *pick = -1;
    for (int32_t v = 0; v < b->n && !(v > 0 && rkm__now() > work->deadline); v++)
        for (uint8_t val = 0; val < 3 && b->need_o[v] >= 1 && v != xo; val++) {
            if (val == gw->x[v]) continue;
            int ok = rkm__ilp_greedy_try(b, gw, rp, v, val, &res);
            work->evals += (double)rp->last_steps;
            if (!ok) {
                if (res) return res;
                continue;
            }
            if (rkm__ilp_better(&gw->trial, out, peak_budget, kept_budget)) {
                *pick = v;
                *to = val;
                rkm__ilp_sched_copy(b, out, &gw->trial);
            }
        }
    return RKM_OK;
}

/* Local search over recompute sets from gw->x: take the change of one op's
 * mode that gives the best (excess, time) while it improves. Leaves the
 * best schedule in *out (not gw->trial or gw->alt). */
static rkm_result rkm__ilp_descend(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_replayer *rp,
                                   uint64_t peak_budget, uint64_t kept_budget, rkm__ilp_work *work,
                                   rkm__ilp_sched *out)
{
    rkm_result res = RKM_OK;
    rkm__ilp_greedy_sched(b, gw, out);
    if (!rkm__ilp_measure(b, rp, out, &res)) {
        if (res) return res;
        return rkm__ilp_err(b, RKM_ERROR_INTERNAL, "internal error: the greedy's first schedule does not replay");
    }
    for (int32_t round = 0; round < 4 * b->n && !rkm__ilp_spent(work, 1); round++) {
        int32_t pick;
        uint8_t to = 0;
        if ((res = rkm__ilp_greedy_round(b, gw, rp, peak_budget, kept_budget, work, out, &pick, &to))) return res;
        if (pick < 0) break;
        gw->x[pick] = to;
    }
    return RKM_OK;
}

/* Greedy: the local search from "recompute nothing" and from "recompute
 * everything", the better of the two in *out (valid, maybe not fitting). */
RKM__PRIVATE rkm_result rkm__ilp_greedy(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_replayer *rp,
                                  uint64_t peak_budget, uint64_t kept_budget, rkm__ilp_work *work, rkm__ilp_sched *out)
{
    memset(gw->x, 1, (size_t)b->n);
    rkm_result r = rkm__ilp_descend(b, gw, rp, peak_budget, kept_budget, work, &gw->alt);
    if (r) return r;
    memset(gw->x, 0, (size_t)b->n);
    if ((r = rkm__ilp_descend(b, gw, rp, peak_budget, kept_budget, work, out))) return r;
    if (rkm__ilp_better(&gw->alt, out, peak_budget, kept_budget)) rkm__ilp_sched_copy(b, out, &gw->alt);
    return RKM_OK;
}

/* ---- structure of a block ------------------------------------------------ */

/* Check the block against the graph: ops in topological order, reads only
 * inputs, x_in and block tensors, block tensors read outside only if x_out. */
RKM__PRIVATE rkm_result rkm__ilp_check(const rkm__ilp_shape *b, const int32_t *opl)
{
    const rkm_graph *g = b->g;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_in; k++) {
            int32_t t = o->in[k];
            if (b->lt[t] >= 0 || t == b->x_in || (g->tensors[t].flags & RKM_TENSOR_INPUT)) {
                if (t != b->x_out || b->is_last) continue;
                return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "op %s reads the block's output %s", o->name,
                                    g->tensors[t].name);
            }
            return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "op %s reads %s, made outside the block", o->name,
                                g->tensors[t].name);
        }
    }
    for (size_t x = 0; x < g->n_ops; x++) {
        if (opl[x] >= 0) continue;
        const rkm__op *o = &g->ops[x];
        for (int32_t k = 0; k < o->n_in; k++)
            if (b->lt[o->in[k]] >= 0 && o->in[k] != b->x_out)
                return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "%s is read by op %s outside the block",
                                    g->tensors[o->in[k]].name, o->name);
    }
    if (b->x_in >= 0 && b->lt[b->x_in] >= 0)
        return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "x_in %s is made inside the block", g->tensors[b->x_in].name);
    if (b->lt[b->x_out] < 0) return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "no block op makes x_out");
    if (!g->tensors[b->x_out].has_grad)
        return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "x_out %s has no gradient", g->tensors[b->x_out].name);
    return RKM_OK;
}

/* Stages (backwards in reverse order), readers, and how late each op and
 * tensor can be useful (need). fill: [nt] zeroed counters. */
RKM__PRIVATE void rkm__ilp_derive(rkm__ilp_shape *b, int32_t *fill)
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
            b->rd[b->rd_off[i] + fill[i]++] = v;
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
static uint64_t rkm__ilp_list_bytes(const rkm__ilp_shape *b, const int32_t *list, int32_t n)
{
    uint64_t m = 0;
    for (int32_t k = 0; k < n; k++)
        if (b->lt[list[k]] >= 0) m += b->g->tensors[list[k]].bytes;
    return m;
}

/* What must be live at some node of every schedule: x_out (and its
 * gradient) at the boundary, an op's inputs and outputs in the forward pass,
 * a backward's saved tensors, phantom and gradients. */
RKM__PRIVATE void rkm__ilp_floors(const rkm__ilp_shape *b, rkm__ilp_memo *memo)
{
    const rkm_graph *g = b->g;
    uint64_t xo = g->tensors[b->x_out].bytes;
    memo->min_kept = b->static_bytes + xo;
    memo->min_peak = memo->min_kept + xo;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        uint64_t m = b->static_bytes + rkm__ilp_list_bytes(b, o->in, o->n_in) + rkm__ilp_list_bytes(b, o->out, o->n_out);
        if (m + rkm__fwd_ws_most(o) > memo->min_peak) memo->min_peak = m + rkm__fwd_ws_most(o);
        int32_t t = b->st[v];
        if (!t) continue;
        m = b->static_bytes + (t == 1 ? xo : b->gstart[t]) + b->gnew[t] + o->bwd_ws + o->phantom +
            rkm__ilp_list_bytes(b, o->saved, o->n_saved);
        if (m > memo->min_peak) memo->min_peak = m;
    }
}

/* Gradient bytes along the backward order (fixed, so constants). */
static rkm_result rkm__ilp_grad_bytes(rkm__ilp_shape *b)
{
    const rkm_graph *g = b->g;
    uint8_t *gl = rkm__calloc(b->ctx, g->n_tensors + 1, 1);
    if (!gl) return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the gradient bytes");
    uint64_t live = g->tensors[b->x_out].bytes;
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
    return RKM_OK;
}

/* Gradient bytes, static bytes, base time and the two scales. */
RKM__PRIVATE rkm_result rkm__ilp_constants(rkm__ilp_shape *b)
{
    const rkm_graph *g = b->g;
    uint64_t mx = 1;
    rkm_result r = rkm__ilp_grad_bytes(b);
    if (r) return r;
    b->static_bytes = g->input_bytes;
    if (b->x_in >= 0 && !(g->tensors[b->x_in].flags & RKM_TENSOR_INPUT)) b->static_bytes += g->tensors[b->x_in].bytes;
    b->base_time = 0;
    b->tscale = 0;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        b->base_time += o->fwd + (o->has_bwd ? o->bwd : 0);
        if (o->fwd > b->tscale) b->tscale = o->fwd;
        uint64_t m = o->phantom > rkm__fwd_ws_most(o) ? o->phantom : rkm__fwd_ws_most(o);
        if (o->bwd_ws > m) m = o->bwd_ws;
        for (int32_t k = 0; k < o->n_out; k++)
            if (g->tensors[o->out[k]].bytes > m) m = g->tensors[o->out[k]].bytes;
        if (m > mx) mx = m;
    }
    if (!(b->tscale > 0)) b->tscale = 1;
    /* A power of two: bytes / mscale is exact in a double. */
    b->mscale = 1;
    while (b->mscale * 2 <= (double)mx) b->mscale *= 2;
    return RKM_OK;
}

/* ---- a block's shape (ilp.c's part (a)) ---------------------------------- */

/* *where = count zeroed items of elem bytes, recorded in a. 0: no memory. */
RKM__PRIVATE int rkm__ilp_take(rkm_context *ctx, rkm__ilp_arrays *a, void *where, size_t count, size_t elem)
{
    void **p = where;
    if (a->n == RKM__ILP_MAX_ARRAYS) return 0; /* internal: raise RKM__ILP_MAX_ARRAYS */
    *p = rkm__calloc(ctx, count, elem);
    if (!*p) return 0;
    a->at[a->n] = p;
    a->bytes[a->n++] = count * elem;
    return 1;
}

RKM__PRIVATE void rkm__ilp_drop(rkm_context *ctx, rkm__ilp_arrays *a)
{
    for (int k = 0; k < a->n; k++) {
        rkm__free(ctx, *a->at[k], a->bytes[k]);
        *a->at[k] = NULL;
    }
    a->n = 0;
}

/* Stage 0's node start times, for the copy columns. 0: no memory. */
static int rkm__ilp_fstart(rkm__ilp_shape *b)
{
    if (!rkm__ilp_take(b->ctx, &b->arrays, &b->fstart, (size_t)b->n + 1, sizeof *b->fstart)) return 0;
    for (int32_t v = 0; v < b->n; v++) b->fstart[v + 1] = b->fstart[v] + b->g->ops[b->op[v]].fwd / b->tscale;
    return 1;
}

/* Local ids: ops (checked topological), block tensors and their producers. */
static rkm_result rkm__ilp_locals(rkm__ilp_shape *b, const int32_t *ops, int32_t *opl)
{
    const rkm_graph *g = b->g;
    b->nt = 0;
    b->max_list = 1;
    for (int32_t v = 0; v < b->n; v++) {
        int32_t x = ops[v];
        if (x < 0 || (size_t)x >= g->n_ops || (v > 0 && x <= ops[v - 1]))
            return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "block ILP: op %d of the block has id %d: ids must be valid "
                                                        "and increasing", (int)v, (int)x);
        b->op[v] = x;
        opl[x] = v;
        const rkm__op *o = &g->ops[x];
        b->nt += o->n_out;
        if (o->n_in >= b->max_list) b->max_list = o->n_in + 1;
        if (o->n_saved >= b->max_list) b->max_list = o->n_saved + 1;
    }
    return RKM_OK;
}

/* The shape's arrays whose size is known once n, nt, nb are. 0: no memory. */
static int rkm__ilp_shape_arrays(rkm__ilp_shape *b)
{
    rkm_context *ctx = b->ctx;
    rkm__ilp_arrays *a = &b->arrays;
    size_t n = (size_t)b->n, nt = (size_t)b->nt, nb = (size_t)b->nb;
    return rkm__ilp_take(ctx, a, &b->tg, nt, sizeof *b->tg) && rkm__ilp_take(ctx, a, &b->tprod, nt, sizeof *b->tprod) &&
           rkm__ilp_take(ctx, a, &b->rd_off, nt + 1, sizeof *b->rd_off) &&
           rkm__ilp_take(ctx, a, &b->st, n, sizeof *b->st) && rkm__ilp_take(ctx, a, &b->bop, nb + 1, sizeof *b->bop) &&
           rkm__ilp_take(ctx, a, &b->need_o, n, sizeof *b->need_o) &&
           rkm__ilp_take(ctx, a, &b->need_t, nt, sizeof *b->need_t) &&
           rkm__ilp_take(ctx, a, &b->last0, nt, sizeof *b->last0) &&
           rkm__ilp_take(ctx, a, &b->gstart, nb + 2, sizeof *b->gstart) &&
           rkm__ilp_take(ctx, a, &b->gnew, nb + 1, sizeof *b->gnew) &&
           rkm__ilp_take(ctx, a, &b->gfree, nb + 1, sizeof *b->gfree);
}

/* Number block tensors and stages; allocate the shape's arrays. */
static rkm_result rkm__ilp_number(rkm__ilp_shape *b)
{
    const rkm_graph *g = b->g;
    int32_t i = 0;
    b->nb = 0;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        b->nb += o->has_bwd ? 1 : 0;
        for (int32_t k = 0; k < o->n_out; k++) b->lt[o->out[k]] = i++;
    }
    if ((double)(b->nb + 1) * b->n > 20.0 * RKM__ILP_MAX_COLS)
        return rkm__ilp_err(b, RKM_ERROR_SOLVER, "%d ops are too many for one model", (int)b->n);
    if (!rkm__ilp_shape_arrays(b)) return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the block's structure");
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_out; k++) {
            b->tg[b->lt[o->out[k]]] = o->out[k];
            b->tprod[b->lt[o->out[k]]] = v;
        }
    }
    return RKM_OK;
}

/* Readers, stages, needs (see rkm__ilp_derive) and constants. */
static rkm_result rkm__ilp_structure(rkm__ilp_shape *b)
{
    const rkm_graph *g = b->g;
    size_t n_rd = 0;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_in; k++) n_rd += b->lt[o->in[k]] >= 0;
    }
    int32_t *fill = rkm__calloc(b->ctx, (size_t)b->nt + 1, sizeof *fill);
    if (!fill || !rkm__ilp_take(b->ctx, &b->arrays, &b->rd, n_rd + 1, sizeof *b->rd)) {
        rkm__free(b->ctx, fill, ((size_t)b->nt + 1) * sizeof *fill);
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the readers");
    }
    rkm__ilp_derive(b, fill);
    rkm__free(b->ctx, fill, ((size_t)b->nt + 1) * sizeof *fill);
    return rkm__ilp_constants(b);
}

/* (a) The block's shape: checked against the graph, numbered, derived
 * (with copies: stage 0's node start times too). */
RKM__PRIVATE rkm_result rkm__ilp_shape_init(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in,
                                           int32_t x_out, int is_last, int copies, rkm__ilp_shape *b)
{
    rkm_context *ctx = g->ctx;
    b->g = g;
    b->ctx = ctx;
    b->n = n_ops;
    b->x_in = x_in;
    b->x_out = x_out;
    b->is_last = is_last ? 1 : 0;
    int32_t *opl = rkm__alloc(ctx, (g->n_ops + 1) * sizeof *opl);
    rkm_result r = RKM_OK;
    if (!opl || !rkm__ilp_take(ctx, &b->arrays, &b->lt, g->n_tensors + 1, sizeof *b->lt) ||
        !rkm__ilp_take(ctx, &b->arrays, &b->op, (size_t)n_ops, sizeof *b->op))
        r = rkm__err(ctx, RKM_ERROR_NOMEM, "block ILP: out of memory for a block of %d ops", (int)n_ops);
    if (!r) {
        for (size_t x = 0; x < g->n_ops; x++) opl[x] = -1;
        for (size_t t = 0; t < g->n_tensors; t++) b->lt[t] = -1;
        r = rkm__ilp_locals(b, ops, opl);
    }
    if (!r) r = rkm__ilp_number(b);
    if (!r) r = rkm__ilp_check(b, opl);
    if (!r) r = rkm__ilp_structure(b);
    b->copies = copies;
    if (!r && copies && !rkm__ilp_fstart(b)) r = rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the copy columns");
    rkm__free(ctx, opl, (g->n_ops + 1) * sizeof *opl);
    return r;
}

#endif /* RKM_OMIT_SOLVER */
