/* options.c -- block options: extremes, replay, dominance
 *
 * Uses (through internal.h): base.c, graph.c, plan.c, sim.c, baseline.c, structure.c. */
#include "internal.h"

/* Bytes: every memory figure of a block and every budget, from the planner
 * (planner.c) through the block options here to the block ILP (ilp.c),
 * is absolute bytes, the graph's input tensors included: what the simulator
 * measures. "peak" is the most live at any point; "kept" is everything live
 * at the end of a block's forward part (inputs, x_in, x_out and what the
 * backward keeps); a budget of either is peak_budget / kept_budget. The chain
 * DP (chain.c) alone counts otherwise, in slots above the inputs (its kept
 * besides x_{i-1} and x_i); rkm__planner_chain is the one conversion. */

static void rkm__option_free(rkm_context *ctx, rkm__option *o)
{
    rkm__free(ctx, o->steps, (o->n_fwd + o->n_bwd) * sizeof *o->steps);
    o->steps = NULL;
}

RKM__PRIVATE void rkm__bopts_free(rkm_context *ctx, rkm__bopts *b)
{
    rkm__free(ctx, b->nosave, b->n_nosave * sizeof *b->nosave);
    for (size_t i = 0; i < b->n_opt; i++) rkm__option_free(ctx, &b->opt[i]);
    rkm__free(ctx, b->opt, b->cap_opt * sizeof *b->opt);
    memset(b, 0, sizeof *b);
}

/* Is t a tensor of the block (made by one of its ops)? */
static int rkm__in_block(const rkm_graph *g, const rkm__block *b, int32_t t)
{
    int32_t p = g->tensors[t].producer;
    return p >= b->ops[0] && p <= b->ops[b->n_ops - 1];
}

/* Does a block op with a backward, from op index `from` down to the block's
 * first op, save t? (from = last op: any backward of the block.) */
static int rkm__bwd_needs(const rkm_graph *g, const rkm__block *b, int32_t t, int32_t from)
{
    for (int32_t i = from; i >= b->ops[0]; i--) {
        const rkm__op *o = &g->ops[i];
        if (o->has_bwd && rkm__list_has(o->saved, o->n_saved, t)) return 1;
    }
    return 0;
}

/* Is t read by a forward of the block after op i? */
static int rkm__fwd_reads_after(const rkm_graph *g, const rkm__block *b, int32_t t, int32_t i)
{
    for (int32_t j = i + 1; j <= b->ops[b->n_ops - 1]; j++)
        if (rkm__list_has(g->ops[j].in, g->ops[j].n_in, t)) return 1;
    return 0;
}

/* The block's forward, every tensor freed after its last use; with `keep`
 * it saves phantoms and keeps what the backward reads (the block's baseline
 * forward), without it keeps only x_in and x_out (the no-save forward). */
static int rkm__gen_forward(const rkm_graph *g, const rkm__block *b, int keep, rkm__steps *l)
{
    int32_t last = b->ops[b->n_ops - 1];
    for (int32_t i = b->ops[0]; i <= last; i++) {
        const rkm__op *o = &g->ops[i];
        if (!rkm__steps_push(l, RKM_STEP_FWD, i, keep && rkm__saves_phantom(o))) return 0;
        for (int32_t k = 0; k < o->n_in + o->n_out; k++) {
            int32_t t = o->in[k];
            if (t == b->out || !rkm__in_block(g, b, t) || rkm__fwd_reads_after(g, b, t, i)) continue;
            if (keep && rkm__bwd_needs(g, b, t, last)) continue;
            if (!rkm__steps_push(l, RKM_STEP_FREE, t, 0)) return 0;
        }
    }
    return 1;
}

/* The block's baseline backward, from the state its baseline forward left. */
static int rkm__gen_backward(const rkm_graph *g, const rkm__block *b, rkm__steps *l)
{
    int32_t last = b->ops[b->n_ops - 1];
    if (b->out == g->loss && !rkm__steps_push(l, RKM_STEP_LOSS, g->loss, 0)) return 0;
    if (!rkm__bwd_needs(g, b, b->out, last) && !rkm__steps_push(l, RKM_STEP_FREE, b->out, 0)) return 0;
    for (int32_t i = last; i >= b->ops[0]; i--) {
        const rkm__op *o = &g->ops[i];
        if (!o->has_bwd) continue;
        if (!rkm__steps_push(l, RKM_STEP_BWD, i, 0)) return 0;
        if (rkm__saves_phantom(o) && !rkm__steps_push(l, RKM_STEP_FREE_SAVED, i, 0)) return 0;
        for (int32_t k = 0; k < o->n_out; k++)
            if (g->tensors[o->out[k]].has_grad && !rkm__steps_push(l, RKM_STEP_FREE_GRAD, o->out[k], 0)) return 0;
        for (int32_t k = 0; k < o->n_saved; k++) {
            int32_t t = o->saved[k];
            if (!rkm__in_block(g, b, t) || rkm__bwd_needs(g, b, t, i - 1)) continue;
            if (!rkm__steps_push(l, RKM_STEP_FREE, t, 0)) return 0;
        }
    }
    return 1;
}

/* Replay an option from the block's start state; fill its figures. Returns
 * 1 when both parts are valid and the backward ends in the block's end
 * state: x_in live, grad(x_in) live and complete, nothing else of the block. */
RKM__PRIVATE int rkm__option_measure(rkm__sim *s, const rkm__block *b, rkm__option *o)
{
    const rkm_graph *g = s->g;
    rkm_sim_result r;
    rkm__sim_reset(s);
    rkm__sim_give_tensor(s, b->in);
    uint64_t base = g->input_bytes + (b->in >= 0 ? g->tensors[b->in].bytes : 0);
    if (!rkm__sim_run(s, o->steps, o->n_fwd, &r, NULL) || !s->D[b->out]) return 0;
    o->tf = r.time;
    o->pf = r.peak;
    o->kept = s->mem;
    if (b->out != g->loss) rkm__sim_give_grad(s, b->out);
    if (!rkm__sim_run(s, o->steps + o->n_fwd, o->n_bwd, &r, NULL)) return 0;
    o->tb = r.time;
    o->pb = r.peak;
    for (int32_t i = b->ops[0]; i <= b->ops[b->n_ops - 1]; i++)
        if (s->P[i] || (g->ops[i].has_bwd && !s->bwd_done[i])) return 0;
    uint64_t end = base + (b->in >= 0 && g->tensors[b->in].has_grad ? g->tensors[b->in].bytes : 0);
    if (b->in >= 0 && g->tensors[b->in].has_grad && !rkm__grad_complete(s, b->in)) return 0;
    return s->mem == end && (b->in < 0 || s->D[b->in]);
}

/* Replay the no-save forward: it must leave exactly x_in and x_out. */
static int rkm__nosave_measure(rkm__sim *s, const rkm__block *b, rkm__bopts *bo)
{
    const rkm_graph *g = s->g;
    rkm_sim_result r;
    rkm__sim_reset(s);
    rkm__sim_give_tensor(s, b->in);
    if (!rkm__sim_run(s, bo->nosave, bo->n_nosave, &r, NULL) || !s->D[b->out]) return 0;
    bo->tfn = r.time;
    bo->pfn = r.peak;
    uint64_t end = g->input_bytes + g->tensors[b->out].bytes + (b->in >= 0 ? g->tensors[b->in].bytes : 0);
    return s->mem == end;
}

/* Does a dominate b (no worse in every figure)? */
static int rkm__dominates(const rkm__option *a, const rkm__option *b)
{
    return a->tf + a->tb <= b->tf + b->tb && a->kept <= b->kept && a->pf <= b->pf && a->pb <= b->pb;
}

/* Measure an option and add it unless an option already there dominates
 * it; drop those it dominates. Takes ownership of o->steps either way.
 * Returns 0 on allocation failure, else 1; *valid says whether it replayed. */
RKM__PRIVATE int rkm__bopts_add(rkm_context *ctx, rkm__sim *s, const rkm__block *b, rkm__bopts *bo, rkm__option *o, int *valid)
{
    *valid = rkm__option_measure(s, b, o);
    if (!*valid) {
        rkm__option_free(ctx, o);
        return 1;
    }
    for (size_t i = 0; i < bo->n_opt; i++)
        if (rkm__dominates(&bo->opt[i], o)) {
            rkm__option_free(ctx, o);
            return 1;
        }
    size_t m = 0;
    for (size_t i = 0; i < bo->n_opt; i++) {
        if (rkm__dominates(o, &bo->opt[i])) rkm__option_free(ctx, &bo->opt[i]);
        else bo->opt[m++] = bo->opt[i];
    }
    bo->n_opt = m;
    if (!rkm__reserve(ctx, (void **)&bo->opt, &bo->cap_opt, bo->n_opt + 1, sizeof *bo->opt)) {
        rkm__option_free(ctx, o);
        return 0;
    }
    o->seq = bo->arrived++;
    bo->opt[bo->n_opt++] = *o;
    return 1;
}

/* Less memory first, then less time, then fewer steps, then arrival: a
 * total order, so qsort gives the same result on every C library, and the
 * DP prefers earlier options on ties. */
RKM__PRIVATE int rkm__option_cmp(const void *x, const void *y)
{
    const rkm__option *a = x, *b = y;
    if (a->kept != b->kept) return a->kept < b->kept ? -1 : 1;
    if (a->pf != b->pf) return a->pf < b->pf ? -1 : 1;
    if (a->pb != b->pb) return a->pb < b->pb ? -1 : 1;
    double ta = a->tf + a->tb, tb = b->tf + b->tb;
    if (ta != tb) return ta < tb ? -1 : 1;
    if (a->n_fwd + a->n_bwd != b->n_fwd + b->n_bwd) return a->n_fwd + a->n_bwd < b->n_fwd + b->n_bwd ? -1 : 1;
    return (a->seq > b->seq) - (a->seq < b->seq);
}

/* The two extremes of a block: its own baseline, and the no-save forward. */
RKM__PRIVATE rkm_result rkm__bopts_extremes(rkm__sim *s, const rkm__block *b, rkm__bopts *bo)
{
    const rkm_graph *g = s->g;
    rkm__steps l = {g->ctx, NULL, 0, 0};
    rkm__option o;
    memset(&o, 0, sizeof o);
    int ok = rkm__gen_forward(g, b, 0, &l);
    bo->n_nosave = l.n;
    if (ok) bo->nosave = rkm__steps_take(&l);
    if (!ok || !bo->nosave) {
        rkm__free(g->ctx, l.s, l.cap * sizeof *l.s);
        bo->n_nosave = 0;
        return rkm__nomem(g->ctx, "block options");
    }
    ok = rkm__gen_forward(g, b, 1, &l);
    o.n_fwd = l.n;
    ok = ok && rkm__gen_backward(g, b, &l);
    o.n_bwd = l.n - o.n_fwd;
    if (ok) o.steps = rkm__steps_take(&l);
    if (!ok || !o.steps) {
        rkm__free(g->ctx, l.s, l.cap * sizeof *l.s);
        return rkm__nomem(g->ctx, "block options");
    }
    int valid;
    if (!rkm__bopts_add(g->ctx, s, b, bo, &o, &valid)) return rkm__nomem(g->ctx, "block options");
    if (!valid || !rkm__nosave_measure(s, b, bo))
        return rkm__err(g->ctx, RKM_ERROR_INTERNAL, "internal error: block %s..%s: its baseline schedule does not replay",
                        g->ops[b->ops[0]].name, g->ops[b->ops[b->n_ops - 1]].name);
    return RKM_OK;
}

/* Map a step of block `from` onto the identical block `to`. */
RKM__PRIVATE rkm_step rkm__map_step(const rkm_graph *g, const rkm__block *from, const rkm__block *to, rkm_step st)
{
    if (st.kind == RKM_STEP_LOSS) return st;
    if (rkm__step_on_op(st.kind)) {
        st.index = to->ops[st.index - from->ops[0]];
        return st;
    }
    int64_t ref = rkm__local_ref(g, from, st.index);
    if (ref >= 0) return st;
    if (ref == -1) {
        st.index = to->in;
        return st;
    }
    int64_t code = -ref - 2;
    st.index = g->ops[to->ops[code / 65536]].out[code % 65536];
    return st;
}

