/* tiny_graph.h -- for the exhaustive tests (test_ilp, test_offload): random
 * graphs small enough that a search over every plan ends, and what their
 * Dijkstra searches share (a binary heap, the frees after a backward). */
#ifndef TINY_GRAPH_H
#define TINY_GRAPH_H

/* A random graph of n ops: a chain with skips, some ops with two outputs,
 * nograd outputs, phantoms, workspaces; the last op makes the loss. With
 * 0 < cut < n, op cut-1's first output is a separator: ops from cut on read
 * only it and x. */
static inline rkm_graph *random_graph(rkm_context *ctx, int32_t n, int32_t cut)
{
    rkm_graph *g;
    if (rkm_graph_create(ctx, &g)) return NULL;
    int32_t x, pool[32], np = 0, last = -1;
    char name[32];
    CHECK(rkm_graph_add_tensor(g, "x", 16u * (uint32_t)rng_int(1, 4), RKM_TENSOR_INPUT, &x) == RKM_OK);
    pool[np++] = x;
    for (int32_t k = 0; k < n; k++) {
        int32_t in[2], out[2], saved[4], ni = 0, no = rng_int(1, k + 1 < n ? 2 : 1), ns = 0;
        in[ni++] = last >= 0 ? last : x;
        int32_t extra = pool[rng_int(0, np - 1)];
        if (rng_int(0, 2) == 0 && extra != in[0]) in[ni++] = extra;
        for (int32_t j = 0; j < no; j++) {
            unsigned flags = (j == 1 && rng_int(0, 3) == 0) ? RKM_TENSOR_NOGRAD : 0;
            snprintf(name, sizeof name, "t%d_%d", (int)k, (int)j);
            CHECK(rkm_graph_add_tensor(g, name, 16u * (uint32_t)rng_int(1, 6), flags, &out[j]) == RKM_OK);
        }
        for (int32_t j = 0; j < ni; j++)
            if (rng_int(0, 1)) saved[ns++] = in[j];
        for (int32_t j = 0; j < no; j++)
            if (rng_int(0, 2) == 0) saved[ns++] = out[j];
        if (k + 1 == cut) np = 1; /* after the cut, only x and this op's first output are readable */
        rkm_op_desc d = {0};
        snprintf(name, sizeof name, "op%d", (int)k);
        d.name = name;
        d.fwd_seconds = 1e-6 * rng_int(1, 9) + 1e-9 * rng_int(0, 99);
        d.bwd_seconds = 2e-6 * rng_int(1, 9);
        d.in = in, d.n_in = ni, d.out = out, d.n_out = no, d.saved = saved, d.n_saved = ns;
        d.phantom = rng_int(0, 2) == 0 ? 16u * (uint32_t)rng_int(1, 4) : 0;
        d.fwd_ws = rng_int(0, 3) == 0 ? 16u * (uint32_t)rng_int(1, 4) : 0;
        d.bwd_ws = rng_int(0, 3) == 0 ? 16u * (uint32_t)rng_int(1, 4) : 0;
        CHECK(rkm_graph_add_op(g, &d, NULL) == RKM_OK);
        last = out[0];
        for (int32_t j = 0; j < (k + 1 == cut ? 1 : no); j++) pool[np++] = out[j];
    }
    CHECK(rkm_graph_set_loss(g, last) == RKM_OK);
    if (rkm_graph_finalize(g) != RKM_OK) {
        rkm_graph_destroy(g);
        return NULL;
    }
    return g;
}

/* After `bwd op`: free its saved state and its outputs' gradients, dead now
 * (never worse; the searches make it a rule to stay small). */
static inline void tiny_free_after_bwd(rkm__sim *s, int32_t op)
{
    const rkm__op *o = &s->g->ops[op];
    uint64_t pk;
    int32_t obj;
    rkm_step fs = {RKM_STEP_FREE_SAVED, op, 0, 0};
    if (s->P[op]) (void)rkm__sim_step(s, &fs, &pk, &obj);
    for (int32_t k = 0; k < o->n_out; k++) {
        rkm_step fg = {RKM_STEP_FREE_GRAD, o->out[k], 0, 0};
        if (s->G[o->out[k]]) (void)rkm__sim_step(s, &fg, &pk, &obj);
    }
}

/* A min-heap of (d, id): Dijkstra's queue. */
typedef struct tiny_item {
    double d;
    uint64_t id;
} tiny_item;

typedef struct tiny_heap {
    tiny_item *v;
    size_t n, cap;
} tiny_heap;

static inline void tiny_heap_push(tiny_heap *q, double d, uint64_t id)
{
    if (q->n == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 4096;
        q->v = realloc(q->v, q->cap * sizeof *q->v);
        CHECK(q->v != NULL);
    }
    size_t h = q->n++;
    while (h > 0 && q->v[(h - 1) / 2].d > d) {
        q->v[h] = q->v[(h - 1) / 2];
        h = (h - 1) / 2;
    }
    q->v[h] = (tiny_item){d, id};
}

static inline tiny_item tiny_heap_pop(tiny_heap *q)
{
    tiny_item top = q->v[0], x = q->v[--q->n];
    size_t h = 0;
    for (;;) {
        size_t c = 2 * h + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && q->v[c + 1].d < q->v[c].d) c++;
        if (q->v[c].d >= x.d) break;
        q->v[h] = q->v[c];
        h = c;
    }
    if (q->n) q->v[h] = x;
    return top;
}

#endif
