/* sim.c -- the simulator: the one memory and time accounting
 *
 * Uses (through internal.h): base.c (the steps' objects, the copy slots and the
 * recorder of buffer lifetimes live here: plan.c builds on them). */
#include "internal.h"

/* The simulator's byte flags: D, G per tensor; P, fwd_done, bwd_done per
 * op; then H, inflight per copy slot (tensors, then ops' saved states),
 * cleared by a reset only after a copy step touched them. */
static size_t rkm__sim_flags(const rkm_graph *g) { return g->n_tensors * 2 + g->n_ops * 3 + 1; }
static size_t rkm__sim_bytes(const rkm_graph *g) { return rkm__sim_flags(g) + 2 * (g->n_tensors + g->n_ops); }

RKM__PRIVATE void rkm__sim_free(rkm__sim *s)
{
    if (!s->g) return;
    rkm_context *ctx = s->g->ctx;
    rkm__free(ctx, s->D, rkm__sim_bytes(s->g));
    rkm__free(ctx, s->recv, (s->g->n_tensors + 1) * sizeof *s->recv);
    rkm__free(ctx, s->copy_end, (s->g->n_tensors + s->g->n_ops + 1) * sizeof *s->copy_end);
    memset(s, 0, sizeof *s);
}

/* The contract's start state: inputs live, nothing else. */
RKM__PRIVATE void rkm__sim_reset(rkm__sim *s)
{
    const rkm_graph *g = s->g;
    memset(s->D, 0, rkm__sim_flags(g));
    if (s->copied) memset(s->H, 0, 2 * (g->n_tensors + g->n_ops));
    s->copied = s->in_flight = 0;
    memset(s->recv, 0, (g->n_tensors + 1) * sizeof *s->recv);
    s->loss_done = 0;
    s->mem = s->host_mem = s->fwd_top = 0;
    s->clock = s->d2h_free = s->h2d_free = s->stall = s->d2h_busy = s->h2d_busy = 0;
    for (size_t t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].flags & RKM_TENSOR_INPUT) {
            s->D[t] = 1;
            s->mem += g->tensors[t].bytes;
        }
}

/* dst (initialised for src's graph) in src's state: a replay resumed from
 * a step instead of the first. */
RKM__PRIVATE void rkm__sim_copy(rkm__sim *dst, const rkm__sim *src)
{
    const rkm_graph *g = src->g;
    rkm__sim s = *src;
    s.D = dst->D, s.G = dst->G, s.P = dst->P, s.fwd_done = dst->fwd_done, s.bwd_done = dst->bwd_done;
    s.H = dst->H, s.inflight = dst->inflight, s.recv = dst->recv, s.copy_end = dst->copy_end;
    memcpy(s.D, src->D, rkm__sim_bytes(g));
    memcpy(s.recv, src->recv, (g->n_tensors + 1) * sizeof *s.recv);
    memcpy(s.copy_end, src->copy_end, (g->n_tensors + g->n_ops + 1) * sizeof *s.copy_end);
    *dst = s;
}

RKM__PRIVATE rkm_result rkm__sim_init(const rkm_graph *g, rkm__sim *s)
{
    memset(s, 0, sizeof *s);
    size_t nb = rkm__sim_bytes(g), nt = g->n_tensors + 1, ns = g->n_tensors + g->n_ops + 1;
    uint8_t *b = rkm__alloc(g->ctx, nb);
    int32_t *recv = rkm__alloc(g->ctx, nt * sizeof *recv);
    double *end = rkm__alloc(g->ctx, ns * sizeof *end);
    if (!b || !recv || !end) {
        rkm__free(g->ctx, b, nb);
        rkm__free(g->ctx, recv, nt * sizeof *recv);
        rkm__free(g->ctx, end, ns * sizeof *end);
        return rkm__nomem(g->ctx, "simulator");
    }
    s->g = g;
    s->D = b;
    s->G = b + g->n_tensors;
    s->P = s->G + g->n_tensors;
    s->fwd_done = s->P + g->n_ops;
    s->bwd_done = s->fwd_done + g->n_ops;
    s->H = b + rkm__sim_flags(g);
    s->inflight = s->H + g->n_tensors + g->n_ops;
    memset(s->H, 0, 2 * (g->n_tensors + g->n_ops));
    s->recv = recv;
    s->copy_end = end;
    rkm__sim_reset(s);
    return RKM_OK;
}

/* Make tensor t live (a block replay's starting checkpoint). */
RKM__PRIVATE void rkm__sim_give_tensor(rkm__sim *s, int32_t t)
{
    if (t < 0 || s->D[t]) return;
    s->D[t] = 1;
    s->mem += s->g->tensors[t].bytes;
}

/* Make grad(t) live and complete (as if every contributor had run). */
RKM__PRIVATE void rkm__sim_give_grad(rkm__sim *s, int32_t t)
{
    if (t < 0 || s->G[t]) return;
    s->G[t] = 1;
    s->recv[t] = s->g->tensors[t].n_contrib;
    s->mem += s->g->tensors[t].bytes;
}

RKM__PRIVATE int rkm__grad_complete(const rkm__sim *s, int32_t t)
{
    return s->G[t] && s->recv[t] == s->g->tensors[t].n_contrib;
}

/* What a forward of o adds to the live memory: its outputs not live yet,
 * its saved state when run with save. */
/* The transient bytes of a forward of op x: its workspace, and its scratch
 * when the run keeps no saved state (with save, or with the saved state
 * live already, the scratch is written into the saved state). */
RKM__PRIVATE uint64_t rkm__sim_fwd_ws(const rkm__sim *s, const rkm__op *o, int32_t x, int save)
{
    return o->fwd_ws + (!save && !s->P[x] ? o->scratch : 0);
}

/* What a forward of o adds to the live memory: its outputs not live yet
 * (but out[0] of a run in place, which takes in[0]'s bytes), its saved
 * state when run with save. */
static uint64_t rkm__sim_fwd_adds(const rkm__sim *s, const rkm__op *o, int save, int inplace)
{
    uint64_t add = save ? o->phantom : 0;
    for (int32_t k = inplace ? 1 : 0; k < o->n_out; k++)
        if (!s->D[o->out[k]]) add += s->g->tensors[o->out[k]].bytes;
    return add;
}

/* What a backward of o adds: the gradients of its inputs not live yet (but
 * grad(in[0]) of a run in place, which takes grad(out[0])'s bytes). */
static uint64_t rkm__sim_bwd_adds(const rkm__sim *s, const rkm__op *o, int inplace)
{
    uint64_t add = 0;
    for (int32_t k = inplace ? 1 : 0; k < o->n_in; k++) {
        const rkm__tensor *t = &s->g->tensors[o->in[k]];
        if (t->has_grad && !s->G[o->in[k]]) add += t->bytes;
    }
    return add;
}

/* The in-place rules of a fwd or bwd step of o (RKM_RULE_NONE without
 * inplace): declared, and the buffer it makes not live yet. */
static rkm_rule rkm__sim_inplace_rule(const rkm__sim *s, const rkm_step *st, const rkm__op *o, int32_t *obj)
{
    if (!st->inplace) return RKM_RULE_NONE;
    int fwd = st->kind == RKM_STEP_FWD;
    if (!(o->flags & (fwd ? RKM_OP_INPLACE : RKM_OP_GRAD_INPLACE))) return RKM_RULE_INPLACE_NOT_DECLARED;
    *obj = fwd ? o->out[0] : o->in[0];
    if (fwd && s->D[o->out[0]]) return RKM_RULE_INPLACE_OUT_LIVE;
    if (!fwd && s->G[o->in[0]]) return RKM_RULE_INPLACE_GRAD_LIVE;
    *obj = st->index;
    return RKM_RULE_NONE;
}

/* Copy slots (rkm__copy_slot): tensors, then ops' saved states. */
RKM__PRIVATE uint64_t rkm__slot_bytes(const rkm_graph *g, int32_t t)
{
    return (size_t)t < g->n_tensors ? g->tensors[t].bytes : g->ops[(size_t)t - g->n_tensors].phantom;
}

/* The most slots one step touches (rkm__slot_touches). */
RKM__PRIVATE size_t rkm__slot_touches_max(const rkm_graph *g)
{
    size_t most = 1;
    for (size_t i = 0; i < g->n_ops; i++)
        if ((size_t)(g->ops[i].n_in + g->ops[i].n_out) + 1 > most) most = (size_t)(g->ops[i].n_in + g->ops[i].n_out) + 1;
    return most;
}

/* The slots step st reads, makes or frees, into v (at most
 * rkm__slot_touches_max entries): its tensors, and its op's saved state
 * for a forward that makes or writes it, a backward that reads it, a
 * free_saved, and a copy step of it. */
RKM__PRIVATE int32_t rkm__slot_touches(const rkm_graph *g, const rkm_step *st, int32_t *v)
{
    int32_t n;
    const int32_t *t = rkm__step_objects(g, st, 0, &n);
    for (int32_t k = 0; k < n; k++) v[k] = t[k];
    const rkm__op *o = st->kind == RKM_STEP_FWD || st->kind == RKM_STEP_BWD || st->kind == RKM_STEP_FREE_SAVED
                       ? &g->ops[st->index] : NULL;
    if ((o && o->phantom > 0) || (st->kind >= RKM_STEP_OFFLOAD && st->save))
        v[n++] = (int32_t)(g->n_tensors + (size_t)st->index);
    return n;
}

/* The seconds a copy of `bytes` takes at bytes_per_second: the one formula
 * of the simulator and of the planners that predict it. */
static double rkm__copy_time(const rkm_graph *g, uint64_t bytes, double bytes_per_second)
{
    return g->copy.latency_seconds + (double)bytes / bytes_per_second;
}

/* The same for copy slot t. */
RKM__PRIVATE double rkm__copy_seconds(const rkm_graph *g, int32_t t, double bytes_per_second)
{
    return rkm__copy_time(g, rkm__slot_bytes(g, t), bytes_per_second);
}

/* When a copy of `bytes` started now on a stream free from *stream ends;
 * the stream is busy until then. */
static double rkm__sim_copy_start(rkm__sim *s, uint64_t bytes, double bytes_per_second, double *stream, double *busy)
{
    double start = s->clock > *stream ? s->clock : *stream;
    double took = rkm__copy_time(s->g, bytes, bytes_per_second);
    *stream = start + took;
    *busy += took;
    return *stream;
}

/* offload, prefetch, wait, free_host (the index in range): of tensor x, or
 * with `saved` of op x's saved state (copy slot n_tensors + x). */
static rkm_rule rkm__sim_copy_step(rkm__sim *s, const rkm_step *st, uint64_t *peak, int32_t *obj)
{
    const rkm_graph *g = s->g;
    int32_t x = st->index;
    size_t slot = rkm__copy_slot(g, st);
    *obj = (int32_t)slot;
    uint8_t *live = st->save ? &s->P[x] : &s->D[x];
    uint64_t bytes = st->save ? g->ops[x].phantom : g->tensors[x].bytes;
    int copying = st->kind == RKM_STEP_OFFLOAD || st->kind == RKM_STEP_PREFETCH;
    if (copying && !(g->copy.d2h_bytes_per_second > 0)) return RKM_RULE_COPY_NO_BANDWIDTH;
    switch (st->kind) {
    case RKM_STEP_OFFLOAD:
        if (!*live || (!st->save && (g->tensors[x].flags & RKM_TENSOR_INPUT))) return RKM_RULE_OFFLOAD_NOT_LIVE;
        if (s->inflight[slot]) return RKM_RULE_COPY_IN_FLIGHT;
        if (s->H[slot]) return RKM_RULE_OFFLOAD_ON_HOST;
        s->H[slot] = 1;
        s->host_mem += bytes;
        s->inflight[slot] = RKM__COPY_OFFLOAD;
        s->copied = 1;
        s->in_flight++;
        s->copy_end[slot] = rkm__sim_copy_start(s, bytes, g->copy.d2h_bytes_per_second, &s->d2h_free, &s->d2h_busy);
        return RKM_RULE_NONE;
    case RKM_STEP_PREFETCH:
        if (!s->H[slot]) return RKM_RULE_PREFETCH_NOT_ON_HOST;
        if (*live) return RKM_RULE_PREFETCH_LIVE;
        *peak = s->mem + bytes;
        *live = 1;
        s->mem += bytes;
        s->inflight[slot] = RKM__COPY_PREFETCH;
        s->in_flight++;
        s->copy_end[slot] = rkm__sim_copy_start(s, bytes, g->copy.h2d_bytes_per_second, &s->h2d_free, &s->h2d_busy);
        return RKM_RULE_NONE;
    case RKM_STEP_WAIT:
        if (!s->inflight[slot]) return RKM_RULE_WAIT_NO_COPY;
        s->inflight[slot] = RKM__COPY_NONE;
        s->in_flight--;
        s->stall = s->copy_end[slot] > s->clock ? s->copy_end[slot] - s->clock : 0;
        s->clock += s->stall;
        return RKM_RULE_NONE;
    case RKM_STEP_FREE_HOST:
        if (!s->H[slot]) return RKM_RULE_FREE_HOST_NOT_ON_HOST;
        if (s->inflight[slot]) return RKM_RULE_COPY_IN_FLIGHT;
        s->H[slot] = 0;
        s->host_mem -= bytes;
        return RKM_RULE_NONE;
    }
    return RKM_RULE_BAD_STEP;
}

/* A forward of o with copies in flight: 1 (*obj the tensor or op) if it
 * reads a tensor being prefetched, consumes one in place or recomputes
 * into one with any copy in flight, or writes its scratch into its saved
 * state while that is copied. */
static int rkm__sim_fwd_copies(const rkm__sim *s, const rkm_step *st, const rkm__op *o, int32_t *obj)
{
    for (int32_t k = 0; k < o->n_in; k++) {
        *obj = o->in[k];
        if (s->inflight[o->in[k]] == RKM__COPY_PREFETCH || (k == 0 && st->inplace && s->inflight[o->in[0]])) return 1;
    }
    for (int32_t k = 0; k < o->n_out; k++) {
        *obj = o->out[k];
        if (s->inflight[o->out[k]]) return 1;
    }
    *obj = (int32_t)(s->g->n_tensors + (size_t)st->index);
    return s->inflight[s->g->n_tensors + (size_t)st->index] && o->scratch > 0;
}

/* A backward of op x with copies in flight: 1 (*obj the tensor or op) if
 * it reads a tensor or its saved state while being prefetched. */
static int rkm__sim_bwd_copies(const rkm__sim *s, const rkm__op *o, int32_t x, int32_t *obj)
{
    for (int32_t k = 0; k < o->n_saved; k++) {
        *obj = o->saved[k];
        if (s->inflight[o->saved[k]] == RKM__COPY_PREFETCH) return 1;
    }
    *obj = (int32_t)(s->g->n_tensors + (size_t)x);
    return s->inflight[s->g->n_tensors + (size_t)x] == RKM__COPY_PREFETCH;
}

/* Check one step's requirements; on success apply it, set *peak to the
 * step's peak and return RKM_RULE_NONE. On failure the state is unchanged
 * and *obj names the op or tensor concerned. */
RKM__PRIVATE rkm_rule rkm__sim_step(rkm__sim *s, const rkm_step *st, uint64_t *peak, int32_t *obj)
{
    const rkm_graph *g = s->g;
    *obj = -1;
    if (!rkm__step_index_ok(g, st)) return RKM_RULE_BAD_STEP;
    int32_t x = st->index;
    *obj = x;
    *peak = s->mem;
    switch (st->kind) {
    case RKM_STEP_FWD: {
        const rkm__op *o = &g->ops[x];
        for (int32_t k = 0; k < o->n_in; k++)
            if (!s->D[o->in[k]]) {
                *obj = o->in[k];
                return RKM_RULE_FWD_INPUT_MISSING;
            }
        if (s->in_flight && rkm__sim_fwd_copies(s, st, o, obj)) return RKM_RULE_COPY_IN_FLIGHT;
        if (st->save && (o->phantom == 0 || !o->has_bwd)) return RKM_RULE_SAVE_NOT_ALLOWED;
        if (st->save && s->P[x]) return RKM_RULE_SAVE_ALREADY_LIVE;
        rkm_rule rule = rkm__sim_inplace_rule(s, st, o, obj);
        if (rule != RKM_RULE_NONE) return rule;
        uint64_t add = rkm__sim_fwd_adds(s, o, st->save, st->inplace);
        *peak = s->mem + add + rkm__sim_fwd_ws(s, o, x, st->save);
        /* the forward phase's highest (hold: no copies, so only forwards rise) */
        if (s->hold && !s->loss_done && *peak > s->fwd_top) s->fwd_top = *peak;
        if (st->inplace) s->D[o->in[0]] = 0; /* out[0] has its bytes */
        for (int32_t k = 0; k < o->n_out; k++) s->D[o->out[k]] = 1;
        if (st->save) s->P[x] = 1;
        s->fwd_done[x] = 1;
        s->mem += add;
        s->clock += o->fwd;
        return RKM_RULE_NONE;
    }
    case RKM_STEP_LOSS:
        if (s->loss_done) return RKM_RULE_LOSS_TWICE;
        if (!s->D[x]) return RKM_RULE_LOSS_TENSOR_MISSING;
        if (s->in_flight && s->inflight[x] == RKM__COPY_PREFETCH) return RKM_RULE_COPY_IN_FLIGHT;
        if (s->hold) { /* bounded: graphs are (rkm__bytes_fit), and in_flight is an int32_t */
            uint64_t others = s->mem < (UINT64_MAX >> 2) / (uint64_t)s->hold ? s->mem * (uint64_t)s->hold : UINT64_MAX >> 2;
            s->mem += others;
            s->fwd_top += others;
        }
        *peak = s->mem + g->tensors[x].bytes;
        if (s->fwd_top > *peak) *peak = s->fwd_top;
        s->loss_done = 1;
        s->G[x] = 1;
        s->recv[x] = 1;
        s->mem += g->tensors[x].bytes;
        return RKM_RULE_NONE;
    case RKM_STEP_BWD: {
        const rkm__op *o = &g->ops[x];
        if (!o->has_bwd) return RKM_RULE_BWD_NO_BACKWARD;
        if (s->bwd_done[x]) return RKM_RULE_BWD_TWICE;
        for (int32_t k = 0; k < o->n_saved; k++)
            if (!s->D[o->saved[k]]) {
                *obj = o->saved[k];
                return RKM_RULE_BWD_SAVED_MISSING;
            }
        if (s->in_flight && rkm__sim_bwd_copies(s, o, x, obj)) return RKM_RULE_COPY_IN_FLIGHT;
        if (o->phantom > 0 && !s->P[x]) return RKM_RULE_BWD_PHANTOM_MISSING;
        for (int32_t k = 0; k < o->n_out; k++) {
            int32_t t = o->out[k];
            if (!g->tensors[t].has_grad) continue;
            *obj = t;
            if (!s->G[t]) return RKM_RULE_BWD_GRAD_MISSING;
            if (!rkm__grad_complete(s, t)) return RKM_RULE_BWD_GRAD_INCOMPLETE;
        }
        *obj = x;
        rkm_rule rule = rkm__sim_inplace_rule(s, st, o, obj);
        if (rule != RKM_RULE_NONE) return rule;
        uint64_t add = rkm__sim_bwd_adds(s, o, st->inplace);
        *peak = s->mem + add + o->bwd_ws;
        if (st->inplace) s->G[o->out[0]] = 0; /* grad(in[0]) has its bytes */
        for (int32_t k = 0; k < o->n_in; k++) {
            int32_t t = o->in[k];
            if (!g->tensors[t].has_grad) continue;
            s->G[t] = 1;
            s->recv[t]++;
        }
        s->bwd_done[x] = 1;
        s->mem += add;
        s->clock += o->bwd;
        return RKM_RULE_NONE;
    }
    case RKM_STEP_FREE:
        if (g->tensors[x].flags & RKM_TENSOR_INPUT) return RKM_RULE_FREE_INPUT;
        if (!s->D[x]) return RKM_RULE_FREE_NOT_LIVE;
        if (s->in_flight && s->inflight[x]) return RKM_RULE_COPY_IN_FLIGHT;
        s->D[x] = 0;
        s->mem -= g->tensors[x].bytes;
        return RKM_RULE_NONE;
    case RKM_STEP_FREE_SAVED:
        if (!s->P[x]) return RKM_RULE_FREE_SAVED_NOT_LIVE;
        if (s->in_flight && s->inflight[g->n_tensors + (size_t)x]) {
            *obj = (int32_t)(g->n_tensors + (size_t)x);
            return RKM_RULE_COPY_IN_FLIGHT;
        }
        s->P[x] = 0;
        s->mem -= g->ops[x].phantom;
        return RKM_RULE_NONE;
    case RKM_STEP_FREE_GRAD:
        if (!s->G[x]) return RKM_RULE_FREE_GRAD_NOT_LIVE;
        if (!rkm__grad_complete(s, x)) return RKM_RULE_FREE_GRAD_INCOMPLETE;
        s->G[x] = 0;
        s->mem -= g->tensors[x].bytes;
        return RKM_RULE_NONE;
    default: return rkm__sim_copy_step(s, st, peak, obj);
    }
}

/* The contract's end-of-plan rules. */
RKM__PRIVATE rkm_rule rkm__sim_end(const rkm__sim *s, int32_t *obj)
{
    const rkm_graph *g = s->g;
    *obj = -1;
    if (!s->loss_done) return RKM_RULE_END_LOSS_MISSING;
    for (size_t i = 0; i < g->n_ops; i++) {
        *obj = (int32_t)i;
        if (g->ops[i].has_bwd && !s->bwd_done[i]) return RKM_RULE_END_BWD_MISSING;
        if (s->P[i] && !s->inflight[g->n_tensors + i]) return RKM_RULE_END_SAVED_LIVE;
        *obj = (int32_t)(g->n_tensors + i);
        if (s->inflight[g->n_tensors + i]) return RKM_RULE_END_COPY_IN_FLIGHT;
        if (s->H[g->n_tensors + i]) return RKM_RULE_END_HOST_LIVE;
    }
    for (size_t t = 0; t < g->n_tensors; t++) {
        *obj = (int32_t)t;
        if (s->inflight[t]) return RKM_RULE_END_COPY_IN_FLIGHT;
        if (s->D[t] && !(g->tensors[t].flags & RKM_TENSOR_INPUT)) return RKM_RULE_END_TENSOR_LIVE;
        if (g->tensors[t].flags & RKM_TENSOR_INPUT_GRAD) { /* sent back once the plan is done */
            if (!rkm__grad_complete(s, (int32_t)t)) return RKM_RULE_END_INPUT_GRAD_MISSING;
        } else if (s->G[t])
            return RKM_RULE_END_GRAD_LIVE;
        if (s->H[t]) return RKM_RULE_END_HOST_LIVE;
    }
    *obj = -1;
    return RKM_RULE_NONE;
}

static int rkm__buf_open(rkm__recorder *rc, int32_t kind, int32_t index, int64_t step, uint64_t bytes)
{
    rkm_plan *p = rc->p;
    if (!rkm__reserve(p->ctx, (void **)&p->buffers, &p->cap_buffers, p->n_buffers + 1, sizeof *p->buffers)) return 0;
    rkm_buffer *x = &p->buffers[p->n_buffers];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    x->index = index;
    x->first_step = x->last_step = step;
    x->bytes = bytes;
    x->takes_over = -1;
    if (kind == RKM_BUFFER_TENSOR) rc->open_t[index] = (int64_t)p->n_buffers;
    if (kind == RKM_BUFFER_GRAD) rc->open_g[index] = (int64_t)p->n_buffers;
    if (kind == RKM_BUFFER_PHANTOM) rc->open_p[index] = (int64_t)p->n_buffers;
    p->n_buffers++;
    return 1;
}

static void rkm__buf_close(rkm__recorder *rc, int64_t *open, int32_t index, int64_t step)
{
    rc->p->buffers[open[index]].last_step = step;
    open[index] = -1;
}

/* An in-place step i: the buffer open in from[from_index] passes its bytes
 * to a new buffer (kind, index) that takes it over. */
static int rkm__buf_take_over(rkm__recorder *rc, int64_t *from, int32_t from_index, int32_t kind, int32_t index,
                              int64_t i)
{
    int64_t old = from[from_index];
    if (old < 0) return 1; /* not live: the step breaks a rule */
    rkm__buf_close(rc, from, from_index, i);
    if (!rkm__buf_open(rc, kind, index, i, rc->p->buffers[old].bytes)) return 0;
    rc->p->buffers[rc->p->n_buffers - 1].takes_over = old;
    return 1;
}

RKM__PRIVATE void rkm__recorder_free(rkm__recorder *rc)
{
    rkm__free(rc->p->ctx, rc->open_t, rc->n_open * sizeof *rc->open_t);
    rc->open_t = NULL;
}

/* Open arrays, and the input tensors' buffers: live from before the first
 * step to after the last. */
RKM__PRIVATE rkm_result rkm__recorder_init(rkm__recorder *rc, rkm_plan *p)
{
    const rkm_graph *g = p->g;
    memset(rc, 0, sizeof *rc);
    rc->p = p;
    size_t nt = g->n_tensors + 1, no = g->n_ops + 1;
    rc->n_open = 2 * nt + no;
    rc->open_t = rkm__alloc(p->ctx, rc->n_open * sizeof *rc->open_t);
    if (!rc->open_t) return rkm__nomem(p->ctx, "plan");
    rc->open_g = rc->open_t + nt;
    rc->open_p = rc->open_g + nt;
    for (size_t i = 0; i < rc->n_open; i++) rc->open_t[i] = -1;
    for (size_t t = 0; t < g->n_tensors; t++) {
        if (!(g->tensors[t].flags & RKM_TENSOR_INPUT)) continue;
        if (!rkm__buf_open(rc, RKM_BUFFER_TENSOR, (int32_t)t, -1, g->tensors[t].bytes)) {
            rkm__recorder_free(rc);
            return rkm__nomem(p->ctx, "plan");
        }
        p->buffers[p->n_buffers - 1].last_step = (int64_t)p->n_steps;
    }
    return RKM_OK;
}

/* After the last step: the stage inputs' gradients, sent back after the
 * plan, live to its end as the inputs do. */
RKM__PRIVATE void rkm__recorder_end(rkm__recorder *rc)
{
    const rkm_graph *g = rc->p->g;
    for (size_t t = 0; t < g->n_tensors; t++)
        if ((g->tensors[t].flags & RKM_TENSOR_INPUT_GRAD) && rc->open_g[t] >= 0)
            rkm__buf_close(rc, rc->open_g, (int32_t)t, (int64_t)rc->p->n_steps);
}

/* Before step i (s: the state before it, st's index in range): the flags
 * the executor passes and the buffers the step creates. */
static int rkm__record_before(rkm__recorder *rc, const rkm__sim *s, const rkm_step *st, int64_t i)
{
    const rkm_graph *g = s->g;
    uint8_t *fl = rc->p->flags;
    int32_t x = st->index;
    rc->p->flag_off[i] = rc->at;
    switch (st->kind) {
    case RKM_STEP_FWD: {
        const rkm__op *o = &g->ops[x];
        uint64_t ws = rkm__sim_fwd_ws(s, o, x, st->save);
        fl[rc->at++] = s->fwd_done[x];
        fl[rc->at++] = ws != o->fwd_ws; /* the call's workspace holds the scratch */
        for (int32_t k = 0; k < o->n_out; k++)
            fl[rc->at++] = k == 0 && st->inplace ? RKM_OUT_INPLACE : s->D[o->out[k]] ? RKM_OUT_LIVE : RKM_OUT_NEW;
        if (st->inplace && !rkm__buf_take_over(rc, rc->open_t, o->in[0], RKM_BUFFER_TENSOR, o->out[0], i)) return 0;
        for (int32_t k = st->inplace ? 1 : 0; k < o->n_out; k++)
            if (!s->D[o->out[k]] && !rkm__buf_open(rc, RKM_BUFFER_TENSOR, o->out[k], i, g->tensors[o->out[k]].bytes))
                return 0;
        if (st->save && !rkm__buf_open(rc, RKM_BUFFER_PHANTOM, x, i, o->phantom)) return 0;
        return !ws || rkm__buf_open(rc, RKM_BUFFER_WORKSPACE, x, i, ws);
    }
    case RKM_STEP_BWD: {
        const rkm__op *o = &g->ops[x];
        if (st->inplace && !rkm__buf_take_over(rc, rc->open_g, o->out[0], RKM_BUFFER_GRAD, o->in[0], i)) return 0;
        for (int32_t k = 0; k < o->n_in; k++) {
            int32_t t = o->in[k];
            int new_grad = g->tensors[t].has_grad && !s->G[t];
            fl[rc->at++] = k == 0 && st->inplace ? RKM_GRAD_INPLACE : !g->tensors[t].has_grad ? RKM_GRAD_NONE
                           : new_grad ? RKM_GRAD_NEW : RKM_GRAD_ACCUMULATE;
            if (new_grad && rc->open_g[t] < 0 && !rkm__buf_open(rc, RKM_BUFFER_GRAD, t, i, g->tensors[t].bytes)) return 0;
        }
        for (int32_t k = 0; k < o->n_out; k++) fl[rc->at++] = (uint8_t)g->tensors[o->out[k]].has_grad;
        return !o->bwd_ws || rkm__buf_open(rc, RKM_BUFFER_WORKSPACE, x, i, o->bwd_ws);
    }
    case RKM_STEP_LOSS: return s->loss_done || rkm__buf_open(rc, RKM_BUFFER_GRAD, x, i, g->tensors[x].bytes);
    case RKM_STEP_PREFETCH:
        if (st->save) return s->P[x] || rkm__buf_open(rc, RKM_BUFFER_PHANTOM, x, i, g->ops[x].phantom);
        return s->D[x] || rkm__buf_open(rc, RKM_BUFFER_TENSOR, x, i, g->tensors[x].bytes);
    }
    return 1;
}

/* After step i held: the buffers it releases. */
static void rkm__record_after(rkm__recorder *rc, const rkm_step *st, int64_t i)
{
    switch (st->kind) {
    case RKM_STEP_FREE: rkm__buf_close(rc, rc->open_t, st->index, i); break;
    case RKM_STEP_FREE_SAVED: rkm__buf_close(rc, rc->open_p, st->index, i); break;
    case RKM_STEP_FREE_GRAD: rkm__buf_close(rc, rc->open_g, st->index, i); break;
    case RKM_STEP_LOSS: rc->p->loss_step = i; break; /* the phases' boundary (a valid plan has one) */
    }
}

/* Replay steps[0..n) from the current state. Fills res (peak, time, and on
 * failure rule/fail_step/fail_object), and when given: mem_after and
 * step_peak per step, and what a plan's birth records (rc). Returns 1 if
 * every step held, -1 if recording ran out of memory, 0 otherwise. */
RKM__PRIVATE int rkm__sim_run_peaks(rkm__sim *s, const rkm_step *steps, size_t n, rkm_sim_result *res, uint64_t *mem_after,
                              uint64_t *step_peak, rkm__recorder *rc)
{
    memset(res, 0, sizeof *res);
    res->fail_step = -1;
    res->fail_object = -1;
    res->peak = s->mem;
    res->peak_step = -1;
    res->num_steps = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t pk;
        int32_t obj;
        if (rc && rkm__step_index_ok(s->g, &steps[i]) && !rkm__record_before(rc, s, &steps[i], (int64_t)i)) return -1;
        rkm_rule rule = rkm__sim_step(s, &steps[i], &pk, &obj);
        if (rule != RKM_RULE_NONE) {
            res->rule = rule;
            res->fail_step = (int64_t)i;
            res->fail_object = obj;
            res->failed = steps[i];
            return 0;
        }
        if (rc) rkm__record_after(rc, &steps[i], (int64_t)i);
        if (res->peak_step < 0 || pk > res->peak) {
            res->peak = pk;
            res->peak_step = (int64_t)i;
        }
        if (steps[i].kind == RKM_STEP_FWD) res->time += s->g->ops[steps[i].index].fwd;
        else if (steps[i].kind == RKM_STEP_BWD) res->time += s->g->ops[steps[i].index].bwd;
        else if (steps[i].kind == RKM_STEP_WAIT) {
            res->time += s->stall;
            res->wait_seconds += s->stall;
        }
        if (s->host_mem > res->host_peak) res->host_peak = s->host_mem;
        if (mem_after) mem_after[i] = s->mem;
        if (step_peak) step_peak[i] = pk;
    }
    return 1;
}

RKM__PRIVATE int rkm__sim_run(rkm__sim *s, const rkm_step *steps, size_t n, rkm_sim_result *res, uint64_t *mem_after)
{
    return rkm__sim_run_peaks(s, steps, n, res, mem_after, NULL, NULL) == 1;
}

/* Each rule: its text, and whether the object it names is a tensor (0),
 * an op (1) or a copy slot (2: a tensor, or n_tensors + an op for its saved
 * state). */
static const struct rkm__rule_info {
    const char *text;
    int on_op;
} rkm__rules[RKM_RULE_COUNT] = {
    [RKM_RULE_NONE] = {"no rule broken", 0},
    [RKM_RULE_FWD_INPUT_MISSING] = {"fwd: every in tensor must be live", 0},
    [RKM_RULE_SAVE_NOT_ALLOWED] = {"fwd save: the op must have phantom > 0 and a backward", 1},
    [RKM_RULE_SAVE_ALREADY_LIVE] = {"fwd save: the op's saved state must not be live already", 1},
    [RKM_RULE_LOSS_TENSOR_MISSING] = {"loss: the loss tensor must be live", 0},
    [RKM_RULE_LOSS_TWICE] = {"loss: runs exactly once", 0},
    [RKM_RULE_BWD_NO_BACKWARD] = {"bwd: the op must have a backward", 1},
    [RKM_RULE_BWD_TWICE] = {"bwd: each backward runs exactly once", 1},
    [RKM_RULE_BWD_SAVED_MISSING] = {"bwd: every saved tensor must be live", 0},
    [RKM_RULE_BWD_PHANTOM_MISSING] = {"bwd: the op's saved state (phantom) must be live", 1},
    [RKM_RULE_BWD_GRAD_MISSING] = {"bwd: the gradient of every output with a gradient must be live", 0},
    [RKM_RULE_BWD_GRAD_INCOMPLETE] = {"bwd: the gradient of every output must be complete (all contributors ran)", 0},
    [RKM_RULE_FREE_NOT_LIVE] = {"free: the tensor must be live", 0},
    [RKM_RULE_FREE_INPUT] = {"free: an input tensor is never freed", 0},
    [RKM_RULE_FREE_SAVED_NOT_LIVE] = {"free_saved: the op's saved state must be live", 1},
    [RKM_RULE_FREE_GRAD_NOT_LIVE] = {"free_grad: the gradient must be live", 0},
    [RKM_RULE_FREE_GRAD_INCOMPLETE] = {"free_grad: the gradient must be complete (all contributors ran)", 0},
    [RKM_RULE_END_LOSS_MISSING] = {"end: the loss step must have run", 0},
    [RKM_RULE_END_BWD_MISSING] = {"end: every op with a backward must run it", 1},
    [RKM_RULE_END_TENSOR_LIVE] = {"end: only input tensors may be live", 0},
    [RKM_RULE_END_SAVED_LIVE] = {"end: no saved state may be live", 1},
    [RKM_RULE_END_GRAD_LIVE] = {"end: no gradient may be live (but a stage input's)", 0},
    [RKM_RULE_BAD_STEP] = {"step kind or index out of range", 0},
    [RKM_RULE_INPLACE_NOT_DECLARED] = {"inplace: the op must declare it (inplace for fwd, grad_inplace for bwd)", 1},
    [RKM_RULE_INPLACE_OUT_LIVE] = {"fwd inplace: out[0] must not be live (it takes in[0]'s buffer)", 0},
    [RKM_RULE_INPLACE_GRAD_LIVE] = {"bwd inplace: grad(in[0]) must not be live (it takes grad(out[0])'s buffer)", 0},
    [RKM_RULE_COPY_NO_BANDWIDTH] = {"offload, prefetch: the graph must have a copy bandwidth", 2},
    [RKM_RULE_OFFLOAD_NOT_LIVE] = {"offload: the tensor (saved state) must be live, and not an input", 2},
    [RKM_RULE_OFFLOAD_ON_HOST] = {"offload: the tensor must have no host copy already", 2},
    [RKM_RULE_PREFETCH_NOT_ON_HOST] = {"prefetch: the tensor must have a host copy", 2},
    [RKM_RULE_PREFETCH_LIVE] = {"prefetch: the tensor must not be live", 2},
    [RKM_RULE_WAIT_NO_COPY] = {"wait: the tensor must have a copy in flight", 2},
    [RKM_RULE_COPY_IN_FLIGHT] = {"copy in flight: a tensor being prefetched is read, or one with a copy in flight is "
                                 "written or freed, before its wait", 2},
    [RKM_RULE_FREE_HOST_NOT_ON_HOST] = {"free_host: the tensor must have a host copy", 2},
    [RKM_RULE_END_COPY_IN_FLIGHT] = {"end: every copy must have been waited for", 2},
    [RKM_RULE_END_HOST_LIVE] = {"end: no host copy may be live", 2},
    [RKM_RULE_END_INPUT_GRAD_MISSING] = {"end: a stage input's gradient must be live and complete (it is sent back)", 0},
};

const char *rkm_rule_string(rkm_rule rule)
{
    if ((int)rule < 0 || rule >= RKM_RULE_COUNT) return "unknown rule";
    return rkm__rules[rule].text;
}

RKM__PRIVATE const char *rkm__obj_name(const rkm_graph *g, rkm_rule rule, int32_t obj)
{
    if (obj < 0) return "";
    if (rkm__rules[rule].on_op == 2 && (size_t)obj >= g->n_tensors) {
        obj -= (int32_t)g->n_tensors;
        return (size_t)obj < g->n_ops ? g->ops[obj].name : "";
    }
    if (rkm__rules[rule].on_op == 1) return (size_t)obj < g->n_ops ? g->ops[obj].name : "";
    return (size_t)obj < g->n_tensors ? g->tensors[obj].name : "";
}

/* Does a step of this kind name an op (fwd, bwd, free_saved), not a tensor?
 * (A copy step names an op when it copies its saved state: `save`.) */
RKM__PRIVATE int rkm__step_on_op(int32_t kind)
{
    return kind == RKM_STEP_FWD || kind == RKM_STEP_BWD || kind == RKM_STEP_FREE_SAVED;
}

/* A copy step's slot in the simulator's copy arrays: the tensor, or after
 * the tensors the op whose saved state it copies. */
RKM__PRIVATE size_t rkm__copy_slot(const rkm_graph *g, const rkm_step *st)
{
    return st->save ? g->n_tensors + (size_t)st->index : (size_t)st->index;
}

RKM__PRIVATE inline int rkm__step_index_ok(const rkm_graph *g, const rkm_step *s)
{
    int compute = s->kind == RKM_STEP_FWD || s->kind == RKM_STEP_BWD;
    if (s->inplace != 0 && !(compute && s->inplace == 1)) return 0;
    switch (s->kind) {
    case RKM_STEP_FWD: return s->index >= 0 && (size_t)s->index < g->n_ops && (s->save == 0 || s->save == 1);
    case RKM_STEP_BWD:
    case RKM_STEP_FREE_SAVED: return s->index >= 0 && (size_t)s->index < g->n_ops;
    case RKM_STEP_LOSS: return s->index == g->loss;
    case RKM_STEP_FREE:
    case RKM_STEP_FREE_GRAD:
    case RKM_STEP_OFFLOAD:
    case RKM_STEP_PREFETCH:
    case RKM_STEP_WAIT:
    case RKM_STEP_FREE_HOST:
        return s->index >= 0 && (s->save == 0 ? (size_t)s->index < g->n_tensors
                                 : s->save == 1 && (size_t)s->index < g->n_ops && g->ops[s->index].phantom > 0);
    default: return 0;
    }
}

/* The tensors that step st reads, makes or frees (grads 0), or whose
 * gradients it does (grads 1): *n ids, in the graph or the step. */
RKM__PRIVATE const int32_t *rkm__step_objects(const rkm_graph *g, const rkm_step *st, int grads, int32_t *n)
{
    const rkm__op *o = st->kind == RKM_STEP_FWD || st->kind == RKM_STEP_BWD ? &g->ops[st->index] : NULL;
    switch (st->kind) {
    case RKM_STEP_FWD: *n = grads ? 0 : o->n_in + o->n_out; return o->in; /* in, out contiguous */
    case RKM_STEP_BWD: *n = grads ? o->n_in + o->n_out : o->n_saved; return grads ? o->in : o->saved;
    case RKM_STEP_LOSS: *n = 1; return &st->index;
    case RKM_STEP_FREE: *n = !grads; return &st->index;
    case RKM_STEP_FREE_GRAD: *n = grads != 0; return &st->index;
    case RKM_STEP_FREE_SAVED: *n = 0; return NULL; /* a saved state, no tensor */
    default: *n = !grads && !st->save; return &st->index; /* a copy reads or makes the tensor (not a saved state) */
    }
}
