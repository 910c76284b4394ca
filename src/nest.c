/* nest.c -- a big block as a graph of its own: nesting, and drop options
 *
 * Uses (through internal.h): base.c, graph.c, plan.c, baseline.c, progress.c, produce.c, search.c
 * (rkm__canonical_draft); the nested planner comes from planner.c through a
 * function pointer (rkm__planner_maker). */
#include "internal.h"

/* ---- nesting: a big block planned as a graph of its own ------------------
 *
 * A block without separators inside may have some once its input is held:
 * a U-Net's outer block is a pooling, the whole inner U-Net and a decoder
 * level, tied together only by the skip tensor, which is the block's input.
 * The block as a graph of its own (its input and the graph's inputs are
 * inputs there, a stand-in loss reads and saves its output) is cut into a
 * chain by the same structure detection, and a planner one level down (the
 * same pipeline, so big blocks there nest again) gives it options: its
 * chain DP's plans at a grid of peak budgets, mapped back op for op, are
 * offered to the block like the ILP's, and the replay decides as always.
 * Budgets are the same bytes at both levels: the nested graph's inputs
 * are exactly what is live all the time in the block's own replay. */

/* Op `op` of g added to h, its tensors renamed by `to` (g's id -> h's);
 * the outputs become h's tensors (their names are their ids in g, so none
 * can clash) and map[h's id] = g's id. ids: scratch for the three lists. */
static rkm_result rkm__nest_op(const rkm_graph *g, rkm_graph *h, int32_t op, int32_t *to, int32_t *map, int32_t *ids)
{
    const rkm__op *o = &g->ops[op];
    char name[32];
    rkm_result r = RKM_OK;
    for (int32_t k = 0; k < o->n_out && !r; k++) {
        const rkm__tensor *t = &g->tensors[o->out[k]];
        snprintf(name, sizeof name, "t%d", (int)o->out[k]);
        r = rkm_graph_add_tensor(h, name, t->bytes, t->flags & RKM_TENSOR_NOGRAD, &to[o->out[k]]);
        if (!r) map[to[o->out[k]]] = o->out[k];
    }
    int32_t *in = ids, *out = in + o->n_in, *saved = out + o->n_out;
    for (int32_t k = 0; k < o->n_in; k++) in[k] = to[o->in[k]];
    for (int32_t k = 0; k < o->n_out; k++) out[k] = to[o->out[k]];
    for (int32_t k = 0; k < o->n_saved; k++) saved[k] = to[o->saved[k]];
    snprintf(name, sizeof name, "o%d", (int)op);
    /* in-place words left out: planner models do not count them anyway */
    rkm_op_desc d = {name, o->fwd, o->bwd, in, o->n_in, out, o->n_out, saved, o->n_saved,
                     o->phantom, o->fwd_ws, o->bwd_ws, o->scratch, 0};
    return r ? r : rkm_graph_add_op(h, &d, NULL);
}

/* The loss of h: g's loss when block b has it, else a stand-in that reads
 * and saves b's output (so that the output is live when the forward part
 * of a nested plan ends, as a block option leaves it). */
static rkm_result rkm__nest_loss(const rkm_graph *g, const rkm__block *b, rkm_graph *h, const int32_t *to)
{
    if (b->out == g->loss) return rkm_graph_set_loss(h, to[g->loss]);
    int32_t loss, x = to[b->out];
    rkm_result r = rkm_graph_add_tensor(h, "loss", 4, 0, &loss);
    rkm_op_desc d = {"loss", 0, 0, &x, 1, &loss, 1, &x, 1, 0, 0, 0, 0, 0};
    if (!r) r = rkm_graph_add_op(h, &d, NULL);
    return r ? r : rkm_graph_set_loss(h, loss);
}

/* Block b of g as a graph of its own, finalized, in *out; map[h's tensor]
 * = g's tensor (h's stand-in loss excepted). */
static rkm_result rkm__nest_graph(const rkm_graph *g, const rkm__block *b, int32_t *map, rkm_graph **out)
{
    *out = NULL;
    int32_t most = 0;
    for (int32_t j = 0; j < b->n_ops; j++) {
        const rkm__op *o = &g->ops[b->ops[j]];
        if (o->n_in + o->n_out + o->n_saved > most) most = o->n_in + o->n_out + o->n_saved;
    }
    int32_t *to = rkm__alloc(g->ctx, g->n_tensors * sizeof *to), *ids = rkm__alloc(g->ctx, (size_t)most * sizeof *ids);
    rkm_graph *h = NULL;
    rkm_result r = to && ids ? rkm_graph_create(g->ctx, &h) : rkm__nomem(g->ctx, "nested graph");
    char name[32];
    for (size_t t = 0; t < g->n_tensors && !r; t++) {
        to[t] = -1;
        if (!(g->tensors[t].flags & RKM_TENSOR_INPUT) && (int32_t)t != b->in) continue;
        snprintf(name, sizeof name, "t%zu", t);
        r = rkm_graph_add_tensor(h, name, g->tensors[t].bytes, RKM_TENSOR_INPUT, &to[t]);
        if (!r) map[to[t]] = (int32_t)t;
    }
    for (int32_t j = 0; j < b->n_ops && !r; j++) r = rkm__nest_op(g, h, b->ops[j], to, map, ids);
    if (!r) r = rkm__nest_loss(g, b, h, to);
    if (!r) r = rkm_graph_finalize(h);
    if (r && r != RKM_ERROR_NOMEM) { /* g was valid, so its block is: a bug */
        char why[RKM__ERRMSG_SIZE];
        snprintf(why, sizeof why, "%s", rkm_context_errmsg(g->ctx));
        r = rkm__err(g->ctx, RKM_ERROR_INTERNAL, "internal error: block %s..%s as a graph of its own: %s",
                     g->ops[b->ops[0]].name, g->ops[b->ops[b->n_ops - 1]].name, why);
    }
    rkm__free(g->ctx, to, g->n_tensors * sizeof *to);
    rkm__free(g->ctx, ids, (size_t)most * sizeof *ids);
    if (r) rkm_graph_destroy(h);
    else *out = h;
    return r;
}

/* Does h cut b into a chain worth planning (its largest block peels at
 * least RKM__NEST_PEEL ops off b)? */
static int rkm__nest_worth(const rkm_graph *h, const rkm__block *b)
{
    int32_t most = 0;
    for (int32_t k = 0; k < h->n_blocks; k++)
        if (h->blocks[k].n_ops > most) most = h->blocks[k].n_ops;
    return most <= b->n_ops - RKM__NEST_PEEL;
}

/* Nested plan p (of h) as block b's steps: in g's ids, the stand-in
 * loss's steps left out, the forward part (*nf steps) being what comes
 * before the loss step; *steps (p's step count long) is the caller's. */
static rkm_result rkm__nest_steps(const rkm_graph *g, const rkm__block *b, const rkm_plan *p, const int32_t *map,
                                  rkm_step **steps, size_t *n, size_t *nf)
{
    const rkm_graph *h = p->g;
    int stand = b->out != g->loss;
    int32_t loss_op = h->tensors[h->loss].producer;
    rkm_step *st = *steps = rkm__alloc(g->ctx, p->n_steps * sizeof *st);
    if (!st) return rkm__nomem(g->ctx, "nested options");
    *n = *nf = 0;
    for (size_t i = 0; i < p->n_steps; i++) {
        rkm_step x = p->steps[i];
        int on_op = rkm__step_on_op(x.kind);
        if (x.kind == RKM_STEP_LOSS) *nf = *n;
        if (stand && (on_op ? x.index == loss_op : x.index == h->loss)) continue;
        x.index = on_op ? b->ops[x.index] : map[x.index];
        st[(*n)++] = x;
    }
    return RKM_OK;
}

/* Nested plan p as an option offered to block b's class. */
static rkm_result rkm__nest_offer(rkm_planner *pl, rkm__sim *s, const rkm__block *b, const rkm_plan *p,
                                  const int32_t *map)
{
    rkm_step *st = NULL;
    size_t n = 0, nf = 0;
    rkm_result r = rkm__nest_steps(pl->g, b, p, map, &st, &n, &nf);
    if (!r) r = rkm__class_add(pl, s, b, st, nf, n - nf);
    if (st) rkm__free(pl->ctx, st, p->n_steps * sizeof *st);
    return r;
}

/* The nested planner's counters, added to its parent's (its classes only
 * when it gave options: `offered`). */
static void rkm__nest_count(rkm_planner *pl, const rkm_planner *sub, int offered)
{
    if (offered) pl->nested += 1 + sub->nested;
    pl->ilp_skipped += sub->ilp_skipped;
    pl->cut |= sub->cut;
    pl->ilp.solves += sub->ilp.solves;
    pl->ilp.optimal += sub->ilp.optimal;
    pl->ilp.suboptimal += sub->ilp.suboptimal;
    pl->ilp.infeasible += sub->ilp.infeasible;
    pl->ilp.timeout += sub->ilp.timeout;
    pl->ilp.failed += sub->ilp.failed;
    pl->ilp.seconds += sub->ilp.seconds;
    pl->ilp.work += sub->ilp.work;
}

/* ---- drop options: all kept but a set of cheap tensors --------------------
 *
 * On chains of random-DAG blocks too big for the block ILP (dag4x50's 50
 * ops), the whole-graph ILP's plan is, block by block, one schedule: the
 * forward keeps all but a set of tensors cheap to make again for the bytes
 * they hold, and the backward makes each of them again once, just before
 * its first reader; offered as options, its blocks' schedules take
 * rockmate below that plan. The sets here are the prefixes of the ops in
 * order of forward time per byte they free (outputs a backward reads, and
 * the saved state); each is its compute steps with the earliest frees
 * (rkm__canonical_draft), replayed as an option like any other. */

/* Push `fwd j save` onto c after the forwards it needs that are dropped
 * and not made again yet (made[j]: it was). */
static int rkm__drop_remake(const rkm_graph *h, int32_t j, uint8_t *drop, uint8_t *made, rkm__steps *c)
{
    const rkm__op *o = &h->ops[j];
    for (int32_t k = 0; k < o->n_in; k++) {
        int32_t q = h->tensors[o->in[k]].producer;
        if (q >= 0 && drop[q] && !made[q] && !rkm__drop_remake(h, q, drop, made, c)) return 0;
    }
    made[j] = 1;
    return rkm__steps_push(c, RKM_STEP_FWD, j, rkm__saves_phantom(o));
}

/* The compute steps of h's baseline `base` with the ops drop[] made again
 * in the backward, each once, before its first reader there. */
static int rkm__drop_steps(const rkm_graph *h, const rkm_plan *base, uint8_t *drop, uint8_t *made, rkm__steps *c)
{
    int after = 0;
    memset(made, 0, h->n_ops);
    c->n = 0;
    for (size_t i = 0; i < base->n_steps; i++) {
        const rkm_step *st = &base->steps[i];
        if (st->kind == RKM_STEP_BWD) {
            const rkm__op *o = &h->ops[st->index];
            if (drop[st->index] && !made[st->index] && rkm__saves_phantom(o) &&
                !rkm__drop_remake(h, st->index, drop, made, c))
                return 0;
            for (int32_t k = 0; k < o->n_saved; k++) {
                int32_t q = h->tensors[o->saved[k]].producer;
                if (q >= 0 && drop[q] && !made[q] && !rkm__drop_remake(h, q, drop, made, c)) return 0;
            }
        }
        after |= st->kind == RKM_STEP_LOSS;
        if ((st->kind == RKM_STEP_FWD && !after) || st->kind == RKM_STEP_LOSS || st->kind == RKM_STEP_BWD)
            if (!rkm__steps_push_step(c, st)) return 0;
    }
    return 1;
}

/* The plan of h (a block as a graph of its own, `base` its baseline) with
 * the ops drop[] (h->n_ops flags, then as many of scratch) made again in
 * the backward, each once, before its first reader there; c: scratch. */
RKM__PRIVATE rkm_result rkm__drop_plan(rkm_planner *pl, const rkm_graph *h, const rkm_plan *base, uint8_t *drop,
                                      rkm__steps *c, rkm_plan **out)
{
    rkm__steps d = {pl->ctx, NULL, 0, 0};
    *out = NULL;
    if (!rkm__drop_steps(h, base, drop, drop + h->n_ops, c)) return rkm__nomem(pl->ctx, "drop options");
    rkm_result r = rkm__canonical_draft(h, c->s, c->n, &d);
    return r ? r : rkm__draft_birth(pl, h, &d, out);
}

/* What dropping op j of h frees for its forward time: the bytes of its
 * outputs that a backward reads (but the block's output, read by h's loss
 * op `keep`) and its saved state. */
static double rkm__drop_ratio(const rkm_graph *h, int32_t j, const uint8_t *read, int32_t keep, uint64_t *bytes)
{
    const rkm__op *o = &h->ops[j];
    *bytes = rkm__saves_phantom(o) ? o->phantom : 0;
    for (int32_t k = 0; k < o->n_out; k++)
        if (read[o->out[k]]) *bytes += h->tensors[o->out[k]].bytes;
    for (int32_t k = 0; k < h->ops[keep].n_in; k++)
        for (int32_t m = 0; m < o->n_out; m++)
            if (o->out[m] == h->ops[keep].in[k]) *bytes = 0;
    return *bytes ? o->fwd / (double)*bytes : INFINITY;
}

/* The ops of h that dropping frees bytes, in order[] by forward time per
 * byte (ratio[], bytes[]: per op; read: h->n_tensors of scratch, zeroed),
 * ties in op order; their count, and *total their bytes. */
static int32_t rkm__drop_order(const rkm_graph *h, uint8_t *read, int32_t *order, double *ratio, uint64_t *bytes,
                               uint64_t *total)
{
    int32_t m = 0, n = (int32_t)h->n_ops, keep = h->tensors[h->loss].producer;
    for (int32_t j = 0; j < n; j++)
        for (int32_t k = 0; h->ops[j].has_bwd && k < h->ops[j].n_saved; k++) read[h->ops[j].saved[k]] = 1;
    for (int32_t j = 0; j < n; j++) {
        ratio[j] = j == keep ? INFINITY : rkm__drop_ratio(h, j, read, keep, &bytes[j]);
        if (ratio[j] == INFINITY) continue;
        *total += bytes[j];
        int32_t k = m++; /* insertion, stable */
        for (; k > 0 && ratio[order[k - 1]] > ratio[j]; k--) order[k] = order[k - 1];
        order[k] = j;
    }
    return m;
}

/* Block b's drop options (RKM__DROP_POINTS prefixes, by bytes freed),
 * offered to its class; past the deadline, no more. */
RKM__PRIVATE rkm_result rkm__drop_options(rkm_planner *pl, rkm__sim *s, const rkm__block *b)
{
    const rkm_graph *g = pl->g;
    int32_t *map = rkm__alloc(pl->ctx, (g->n_tensors + 1) * sizeof *map);
    rkm_graph *h = NULL;
    rkm_plan *base = NULL;
    rkm_result r = map ? rkm__nest_graph(g, b, map, &h) : rkm__nomem(pl->ctx, "drop options");
    if (!r) r = rkm__plan_baseline(h, &base);
    size_t n = r ? 0 : h->n_ops;
    uint8_t *read = r ? NULL : rkm__calloc(pl->ctx, h->n_tensors + 2 * n, 1), *drop = read ? read + h->n_tensors : NULL;
    int32_t *order = r ? NULL : rkm__alloc(pl->ctx, n * sizeof *order);
    double *ratio = r ? NULL : rkm__alloc(pl->ctx, n * sizeof *ratio);
    uint64_t *bytes = r ? NULL : rkm__alloc(pl->ctx, n * sizeof *bytes), total = 0;
    rkm__steps c = {pl->ctx, NULL, 0, 0};
    if (!r && (!read || !order || !ratio || !bytes)) r = rkm__nomem(pl->ctx, "drop options");
    int32_t m = r ? 0 : rkm__drop_order(h, read, order, ratio, bytes, &total);
    uint64_t freed = 0;
    for (int32_t i = 0, p = 0; i < RKM__DROP_POINTS && !r && !rkm__over(pl); i++) {
        uint64_t goal = total / RKM__DROP_POINTS * (uint64_t)(i + 1);
        int more = 0;
        for (; p < m && freed < goal; p++, more = 1) {
            drop[order[p]] = 1;
            freed += bytes[order[p]];
        }
        if (!more) continue;
        rkm_plan *q = NULL;
        r = rkm__drop_plan(pl, h, base, drop, &c, &q);
        if (!r) r = rkm__nest_offer(pl, s, b, q, map);
        rkm_plan_destroy(q);
    }
    rkm__steps_free(&c);
    rkm__free(pl->ctx, bytes, n * sizeof *bytes);
    rkm__free(pl->ctx, ratio, n * sizeof *ratio);
    rkm__free(pl->ctx, order, n * sizeof *order);
    rkm__free(pl->ctx, read, read ? h->n_tensors + 2 * n : 0);
    rkm_plan_destroy(base);
    rkm_graph_destroy(h);
    rkm__free(pl->ctx, map, (g->n_tensors + 1) * sizeof *map);
    return r;
}

/* Block b's options from a nested planner made by `make` (planner.c's
 * rkm__planner_make, handed down: the planner's recursion), whose block
 * ILP budget is `allow`, over peak budgets from the nested floor (or the
 * block's, if higher) to peak_hi; *nested: some were offered. Nothing
 * happens for blocks of nest_ops ops or fewer, below RKM__NEST_DEPTH
 * levels, past the deadline, or where b does not cut. */
RKM__PRIVATE rkm_result rkm__nest_options(rkm_planner *pl, rkm__planner_maker make, rkm__sim *s, const rkm__block *b,
                                         uint64_t peak_lo, uint64_t peak_hi, double allow, int *nested)
{
    const rkm_graph *g = pl->g;
    *nested = 0;
    if (b->n_ops <= pl->d.nest_ops || pl->depth + 1 >= RKM__NEST_DEPTH || rkm__over(pl)) return RKM_OK;
    int32_t *map = rkm__alloc(pl->ctx, (g->n_tensors + 1) * sizeof *map);
    rkm_graph *h = NULL;
    rkm_planner *sub = NULL;
    rkm_result r = map ? rkm__nest_graph(g, b, map, &h) : rkm__nomem(pl->ctx, "nested graph");
    if (!r && rkm__nest_worth(h, b)) {
        rkm_solve_desc d = pl->d;
        d.time_limit = fmax(pl->deadline - rkm__now(), 1e-9); /* its deadline is ours */
        d.ilp_budget = allow > 0 ? allow : 1e-9;
        uint64_t floor = 0, dtr = 0;
        int64_t slots;
        r = make(h, &d, pl, &sub);
        if (!r) r = rkm__chain_floor(sub, &floor, &slots);
        if (!r) r = rkm__dtr_min_budget(sub, &dtr);
        if (floor == 0 || dtr < floor) floor = dtr;
        /* grad(x_in) is not in h (its input has none): the nested plans are
         * made for that much less, so that the options fit the grid's peaks */
        uint64_t gx = b->in >= 0 && g->tensors[b->in].has_grad ? g->tensors[b->in].bytes : 0;
        uint64_t lo = floor + gx > peak_lo ? floor + gx : peak_lo;
        if (lo < gx) lo = gx; /* never: the block's floor counts x_in */
        uint64_t hi = peak_hi > lo ? peak_hi : lo;
        /* the chain DP's plan and DTR's at each point: DTR reaches below
         * the chain's floor, where the nested blocks' boundaries are held */
        for (int i = 0; i < 2 * RKM__NEST_POINTS && !r && !rkm__over(sub); i++) {
            rkm_plan *p = NULL;
            uint64_t budget = lo - gx + (uint64_t)((double)(hi - lo) * (i / 2) / (RKM__NEST_POINTS - 1));
            r = i % 2 ? rkm__solve_dtr(sub, budget, &p, NULL) : rkm__solve_dp(sub, budget, &p);
            if (!r && p) r = rkm__nest_offer(pl, s, b, p, map);
            *nested |= p != NULL;
            rkm_plan_destroy(p);
        }
        if (sub) rkm__nest_count(pl, sub, *nested);
    }
    rkm__planner_free(sub);
    rkm_graph_destroy(h);
    rkm__free(pl->ctx, map, (g->n_tensors + 1) * sizeof *map);
    return r;
}

