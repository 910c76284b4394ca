/* structure.c -- structure (separators, blocks, classes of identical blocks) and finalize
 *
 * Uses (through internal.h): base.c, graph.c, baseline.c (finalize's figures). */
#include "internal.h"

/* Separators are the tensors that dominate the loss in the graph that
 * runs from a virtual source to the first ops (those that read only input
 * tensors, which are live all the time), from each op to its outputs and
 * from each non-input tensor to the ops that read it: every path from the
 * source to the loss passes through them. Ops are in topological order, so
 * one pass gives every node's immediate dominator: a tensor's is its
 * producer, an op's the nearest common dominator of the tensors it reads
 * (the source for a first op), found by binary lifting in O(log n). The
 * loss's dominators are then the chain of immediate dominators above it.
 * Nodes: 0 the source, 1 + i op i, 1 + n_ops + t tensor t. */
static int32_t rkm__dom_lca(int32_t *const *up, const int32_t *depth, int levels, int32_t a, int32_t b)
{
    if (depth[a] < depth[b]) {
        int32_t t = a;
        a = b;
        b = t;
    }
    for (int k = levels - 1; k >= 0; k--)
        if (depth[a] - (1 << k) >= depth[b]) a = up[k][a];
    if (a == b) return a;
    for (int k = levels - 1; k >= 0; k--)
        if (up[k][a] != up[k][b]) a = up[k][a], b = up[k][b];
    return up[0][a];
}

/* Separators in op order: tensors with a gradient, other than the loss,
 * through which every path from the first ops to the loss passes. */
static rkm_result rkm__separators(const rkm_graph *g, int32_t *seps, int32_t *n_seps)
{
    size_t nodes = 1 + g->n_ops + g->n_tensors;
    int levels = 1;
    while (levels < 31 && ((size_t)1 << levels) < nodes) levels++;
    int32_t *depth = rkm__alloc(g->ctx, nodes * sizeof *depth);
    int32_t *up[31] = {NULL};
    int ok = depth != NULL;
    for (int k = 0; k < levels && ok; k++) ok = (up[k] = rkm__alloc(g->ctx, nodes * sizeof *up[k])) != NULL;
    *n_seps = 0;
    if (ok) {
        int32_t tensor0 = 1 + (int32_t)g->n_ops;
        depth[0] = 0;
        for (int k = 0; k < levels; k++) up[k][0] = 0;
        for (size_t i = 0; i < g->n_ops; i++) {
            const rkm__op *o = &g->ops[i];
            int32_t v = 1 + (int32_t)i, dom = -1;
            for (int32_t k = 0; k < o->n_in; k++) {
                int32_t t = o->in[k];
                if (g->tensors[t].flags & RKM_TENSOR_INPUT) continue;
                dom = dom < 0 ? tensor0 + t : rkm__dom_lca(up, depth, levels, dom, tensor0 + t);
            }
            if (dom < 0) dom = 0; /* a first op */
            for (int32_t k = 0; k <= o->n_out; k++) { /* the op, then its outputs */
                int32_t x = k ? tensor0 + o->out[k - 1] : v, d = k ? v : dom;
                depth[x] = depth[d] + 1;
                up[0][x] = d;
                for (int l = 1; l < levels; l++) up[l][x] = up[l - 1][up[l - 1][x]];
            }
        }
        /* the loss's dominators, from the loss up: reversed into op order */
        for (int32_t x = up[0][tensor0 + g->loss]; x > 0; x = up[0][x]) {
            int32_t t = x - tensor0;
            if (t >= 0 && g->tensors[t].has_grad) seps[(*n_seps)++] = t;
        }
        for (int32_t i = 0, j = *n_seps - 1; i < j; i++, j--) {
            int32_t t = seps[i];
            seps[i] = seps[j];
            seps[j] = t;
        }
    }
    rkm__free(g->ctx, depth, nodes * sizeof *depth);
    for (int k = 0; k < levels; k++) rkm__free(g->ctx, up[k], nodes * sizeof *up[k]);
    return ok ? RKM_OK : rkm__nomem(g->ctx, "structure");
}

/* Two blocks are identical when their ops match one to one with the same
 * lists (tensors named relative to the block), sizes and flags, and times
 * within the tolerance. */
static int rkm__close(double a, double b)
{
    double m = a > b ? a : b;
    return fabs(a - b) <= RKM__CLASS_TIME_TOLERANCE * m;
}

/* A tensor seen from a block: an input tensor (its id), the block input
 * (-1), or output k of the block's j-th op (-(2 + j * 65536 + k)). */
RKM__PRIVATE int64_t rkm__local_ref(const rkm_graph *g, const rkm__block *b, int32_t t)
{
    if (g->tensors[t].flags & RKM_TENSOR_INPUT) return t;
    if (t == b->in) return -1;
    int32_t p = g->tensors[t].producer;
    int32_t j = p - b->ops[0];
    if (j < 0 || j >= b->n_ops) return INT64_MIN; /* not local: never equal */
    const rkm__op *o = &g->ops[p];
    int32_t k = 0;
    while (o->out[k] != t) k++;
    return -(2 + (int64_t)j * 65536 + k);
}

static int rkm__same_list(const rkm_graph *g, const rkm__block *a, const rkm__block *b, const int32_t *la,
                          const int32_t *lb, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        const rkm__tensor *x = &g->tensors[la[i]], *y = &g->tensors[lb[i]];
        int64_t ra = rkm__local_ref(g, a, la[i]), rb = rkm__local_ref(g, b, lb[i]);
        /* The block output's other contributors are outside the block. */
        int inner = la[i] != a->out;
        if (ra == INT64_MIN || ra != rb || x->bytes != y->bytes || x->flags != y->flags || x->has_grad != y->has_grad ||
            (inner && x->n_contrib != y->n_contrib))
            return 0;
    }
    return 1;
}

static int rkm__same_block(const rkm_graph *g, const rkm__block *a, const rkm__block *b)
{
    if (a->n_ops != b->n_ops || (a->in < 0) != (b->in < 0) || (a->out == g->loss) != (b->out == g->loss)) return 0;
    if (rkm__local_ref(g, a, a->out) != rkm__local_ref(g, b, b->out)) return 0;
    if (a->in >= 0 && g->tensors[a->in].bytes != g->tensors[b->in].bytes) return 0;
    for (int32_t j = 0; j < a->n_ops; j++) {
        const rkm__op *x = &g->ops[a->ops[j]], *y = &g->ops[b->ops[j]];
        if (x->n_in != y->n_in || x->n_out != y->n_out || x->n_saved != y->n_saved || x->phantom != y->phantom ||
            x->fwd_ws != y->fwd_ws || x->scratch != y->scratch || x->bwd_ws != y->bwd_ws || x->has_bwd != y->has_bwd ||
            x->flags != y->flags ||
            !rkm__close(x->fwd, y->fwd) || !rkm__close(x->bwd, y->bwd))
            return 0;
        if (!rkm__same_list(g, a, b, x->in, y->in, x->n_in) || !rkm__same_list(g, a, b, x->out, y->out, x->n_out) ||
            !rkm__same_list(g, a, b, x->saved, y->saved, x->n_saved))
            return 0;
    }
    return 1;
}

/* A block's signature: a hash of what rkm__same_block compares exactly
 * (everything but the times), so that only blocks of equal signature are
 * compared. */
static uint64_t rkm__block_sig(const rkm_graph *g, const rkm__block *b)
{
    uint64_t h = 14695981039346656037ull;
#define RKM__MIX(v) (h = (h ^ (uint64_t)(v)) * UINT64_C(1099511628211))
    RKM__MIX(b->n_ops);
    RKM__MIX(b->in < 0 ? 0 : g->tensors[b->in].bytes + 1);
    RKM__MIX(b->out == g->loss);
    for (int32_t j = 0; j < b->n_ops; j++) {
        const rkm__op *o = &g->ops[b->ops[j]];
        RKM__MIX(o->n_in), RKM__MIX(o->n_out), RKM__MIX(o->n_saved), RKM__MIX(o->phantom), RKM__MIX(o->fwd_ws);
        RKM__MIX(o->scratch), RKM__MIX(o->bwd_ws), RKM__MIX(o->has_bwd), RKM__MIX(o->flags);
        for (int32_t k = 0; k < o->n_in + o->n_out; k++) {
            const rkm__tensor *t = &g->tensors[k < o->n_in ? o->in[k] : o->out[k - o->n_in]];
            RKM__MIX(t->bytes), RKM__MIX(t->flags), RKM__MIX(t->has_grad);
        }
    }
#undef RKM__MIX
    return h;
}

typedef struct rkm__sigidx {
    uint64_t sig;
    int32_t block;
} rkm__sigidx;

static int rkm__sigidx_cmp(const void *x, const void *y)
{
    const rkm__sigidx *a = x, *b = y;
    if (a->sig != b->sig) return a->sig < b->sig ? -1 : 1;
    return (a->block > b->block) - (a->block < b->block);
}

/* Classes: a block takes the class of the first earlier block it is the
 * same as (rkm__same_block), else a new one. Only blocks of one signature
 * can be the same, so each is compared with the earlier ones of its
 * signature: O(n log n) on a chain of distinct blocks, not O(n^2). */
static rkm_result rkm__classes(rkm_graph *g)
{
    int32_t n = g->n_blocks;
    rkm__sigidx *v = rkm__alloc(g->ctx, ((size_t)n + 1) * sizeof *v);
    int32_t *rep = rkm__alloc(g->ctx, ((size_t)n + 1) * sizeof *rep); /* the first block of b's class */
    if (!v || !rep) {
        rkm__free(g->ctx, v, ((size_t)n + 1) * sizeof *v);
        rkm__free(g->ctx, rep, ((size_t)n + 1) * sizeof *rep);
        return rkm__nomem(g->ctx, "structure");
    }
    for (int32_t b = 0; b < n; b++) v[b] = (rkm__sigidx){rkm__block_sig(g, &g->blocks[b]), b};
    qsort(v, (size_t)n, sizeof *v, rkm__sigidx_cmp);
    for (int32_t i = 0, start = 0; i < n; i++) { /* the earlier blocks of its signature, in block order */
        if (i && v[i].sig != v[i - 1].sig) start = i;
        int32_t b = v[i].block;
        rep[b] = b;
        for (int32_t k = start; k < i && rep[b] == b; k++)
            if (rkm__same_block(g, &g->blocks[v[k].block], &g->blocks[b])) rep[b] = rep[v[k].block];
    }
    g->n_classes = 0; /* numbered in block order */
    for (int32_t b = 0; b < n; b++) g->blocks[b].cls = rep[b] == b ? g->n_classes++ : g->blocks[rep[b]].cls;
    rkm__free(g->ctx, v, ((size_t)n + 1) * sizeof *v);
    rkm__free(g->ctx, rep, ((size_t)n + 1) * sizeof *rep);
    return RKM_OK;
}

/* Cut at the separators. Blocks are runs of consecutive ops: an op that is
 * not an ancestor of a separator is a descendant of it. Runs of one-op
 * blocks are merged, RKM__MERGE_RUN ops at most, so that chains of tiny ops
 * (an MLP, a GPT's head) do not become a block each: every block boundary is
 * held from its forward to its block's backward, so boundaries cost memory,
 * while the block ILP handles what lies inside a block. Measured against
 * pairs: runs of 4 take rockmate's smallest budget on gpt2-124M from 65 % to
 * 49 % and its overhead on gpt2-tiny at 41 % from 31 % to 20 %; longer runs
 * gain little more for rockmate and cost rotor (two options a block) more
 * of its range (an 8-layer MLP: 47 % at pairs, 58 % at 4, 68 % at 6). */
RKM__PRIVATE rkm_result rkm__structure_detect(rkm_graph *g)
{
    rkm__graph_free_blocks(g);
    int32_t *seps = rkm__alloc(g->ctx, (g->n_tensors + 1) * sizeof *seps);
    int32_t *ends = rkm__alloc(g->ctx, (g->n_ops + 1) * sizeof *ends); /* last op of each block */
    rkm_result r = seps && ends ? RKM_OK : rkm__nomem(g->ctx, "structure");
    int32_t n_seps = 0, n = 0;
    if (!r) r = rkm__separators(g, seps, &n_seps);
    if (!r) {
        for (int32_t i = 0; i < n_seps; i++) ends[n++] = g->tensors[seps[i]].producer;
        ends[n++] = (int32_t)g->n_ops - 1;
        int32_t m = 0, prev = -1; /* merge runs of one-op blocks */
        for (int32_t i = 0; i < n; i++) {
            int single = ends[i] - prev == 1;
            for (int run = 1; single && run < RKM__MERGE_RUN && i + 1 < n && ends[i + 1] - ends[i] == 1; run++) i++;
            prev = ends[i];
            ends[m] = ends[i];
            seps[m] = i < n_seps ? seps[i] : g->loss;
            m++;
        }
        n = m;
        g->blocks = rkm__calloc(g->ctx, (size_t)n, sizeof *g->blocks);
        g->block_ops = rkm__alloc(g->ctx, g->n_ops * sizeof *g->block_ops);
        if (!g->blocks || !g->block_ops) {
            rkm__free(g->ctx, g->blocks, (size_t)n * sizeof *g->blocks);
            rkm__free(g->ctx, g->block_ops, g->n_ops * sizeof *g->block_ops);
            g->blocks = NULL;
            g->block_ops = NULL;
            r = rkm__nomem(g->ctx, "structure");
        }
    }
    if (!r) {
        g->n_blocks = n;
        for (size_t i = 0; i < g->n_ops; i++) g->block_ops[i] = (int32_t)i;
        for (int32_t b = 0; b < n; b++) {
            rkm__block *k = &g->blocks[b];
            int32_t first = b ? ends[b - 1] + 1 : 0;
            k->ops = g->block_ops + first;
            k->n_ops = ends[b] - first + 1;
            k->in = b ? g->blocks[b - 1].out : -1;
            k->out = b == n - 1 ? g->loss : seps[b];
            k->cls = -1;
        }
        r = rkm__classes(g);
    }
    rkm__free(g->ctx, seps, (g->n_tensors + 1) * sizeof *seps);
    rkm__free(g->ctx, ends, (g->n_ops + 1) * sizeof *ends);
    return r;
}

static void rkm__graph_derive(rkm_graph *g)
{
    for (size_t t = 0; t < g->n_tensors; t++) {
        g->tensors[t].has_grad = 0;
        g->tensors[t].n_contrib = 0;
        g->tensors[t].n_readers = 0;
    }
    g->has_inplace = 0;
    for (size_t i = 0; i < g->n_ops; i++) {
        for (int32_t k = 0; k < g->ops[i].n_in; k++) g->tensors[g->ops[i].in[k]].n_readers++;
        g->has_inplace |= g->ops[i].flags != 0;
    }
    /* Readers come after producers, so one reverse pass settles both. */
    g->tensors[g->loss].has_grad = 1;
    g->tensors[g->loss].n_contrib = 1;
    for (size_t i = g->n_ops; i-- > 0;) {
        rkm__op *o = &g->ops[i];
        o->has_bwd = 0;
        for (int32_t k = 0; k < o->n_out; k++)
            if (g->tensors[o->out[k]].has_grad) o->has_bwd = 1;
        if (!o->has_bwd) continue;
        for (int32_t k = 0; k < o->n_in; k++) {
            rkm__tensor *t = &g->tensors[o->in[k]];
            if (t->flags & RKM_TENSOR_NOGRAD || (t->flags & (RKM_TENSOR_INPUT | RKM_TENSOR_INPUT_GRAD)) == RKM_TENSOR_INPUT)
                continue;
            t->has_grad = 1;
            t->n_contrib++;
        }
    }
}

/* 2 x all tensors + all phantoms + the largest workspace fits in 64 bits,
 * so that no memory sum anywhere can overflow. */
static int rkm__bytes_fit(const rkm_graph *g)
{
    uint64_t total = 0, ws = 0;
    int ok = 1;
    for (size_t t = 0; t < g->n_tensors && ok; t++)
        ok = rkm__add_u64(total, g->tensors[t].bytes, &total) && rkm__add_u64(total, g->tensors[t].bytes, &total);
    for (size_t i = 0; i < g->n_ops && ok; i++) {
        uint64_t f = 0; /* rkm__fwd_ws_most, checked here */
        ok = rkm__add_u64(total, g->ops[i].phantom, &total) && rkm__add_u64(g->ops[i].fwd_ws, g->ops[i].scratch, &f);
        if (f > ws) ws = f;
        if (g->ops[i].bwd_ws > ws) ws = g->ops[i].bwd_ws;
    }
    return ok && rkm__add_u64(total, ws, &total);
}

static rkm_result rkm__graph_check_whole(rkm_graph *g)
{
    if (g->loss < 0) return rkm__gerr(g, RKM_ERROR_GRAPH, g->src_line, "no loss statement (exactly one is required)");
    for (size_t t = 0; t < g->n_tensors; t++) {
        const rkm__tensor *x = &g->tensors[t];
        if (!(x->flags & RKM_TENSOR_INPUT) && x->producer < 0)
            return rkm__gerr(g, RKM_ERROR_GRAPH, x->line, "tensor %s: not an input and no op writes it", x->name);
    }
    /* Every op must be an ancestor of the loss: mark backwards from it. */
    uint8_t *anc = rkm__calloc(g->ctx, g->n_ops + 1, 1);
    uint8_t *need = rkm__calloc(g->ctx, g->n_tensors + 1, 1);
    rkm_result r = RKM_OK;
    if (!anc || !need) {
        r = rkm__nomem(g->ctx, "rkm_graph_finalize");
        goto done;
    }
    need[g->loss] = 1;
    for (size_t i = g->n_ops; i-- > 0;) {
        const rkm__op *o = &g->ops[i];
        for (int32_t k = 0; k < o->n_out && !anc[i]; k++) anc[i] = need[o->out[k]];
        if (anc[i])
            for (int32_t k = 0; k < o->n_in; k++) need[o->in[k]] = 1;
    }
    for (size_t i = 0; i < g->n_ops; i++)
        if (!anc[i]) {
            r = rkm__gerr(g, RKM_ERROR_GRAPH, g->ops[i].line, "op %s: not an ancestor of the loss %s", g->ops[i].name,
                          g->tensors[g->loss].name);
            break;
        }
    if (r == RKM_OK && !rkm__bytes_fit(g))
        r = rkm__gerr(g, RKM_ERROR_GRAPH, g->src_line, "byte counts too large: their total must fit in 64 bits");
done:
    rkm__free(g->ctx, anc, g->n_ops + 1);
    rkm__free(g->ctx, need, g->n_tensors + 1);
    return r;
}

/* Once gradients are known: grad_inplace's two tensors have one, and so
 * does every stage input (else nothing would be sent back). */
static rkm_result rkm__check_grads(const rkm_graph *g)
{
    for (size_t t = 0; t < g->n_tensors; t++) {
        const rkm__tensor *x = &g->tensors[t];
        if ((x->flags & RKM_TENSOR_INPUT_GRAD) && !x->has_grad)
            return rkm__gerr(g, RKM_ERROR_GRAPH, x->line, "tensor %s: input grad, but no op that reads it has a "
                             "backward, so it gets no gradient to send back (declare it input)", x->name);
    }
    for (size_t i = 0; i < g->n_ops; i++) {
        const rkm__op *o = &g->ops[i];
        if (!(o->flags & RKM_OP_GRAD_INPLACE)) continue;
        const rkm__tensor *a = &g->tensors[o->in[0]], *b = &g->tensors[o->out[0]];
        if (!a->has_grad || !b->has_grad)
            return rkm__gerr(g, RKM_ERROR_GRAPH, o->line, "op %s: grad_inplace needs gradients of %s and %s; %s has none",
                             o->name, a->name, b->name, a->has_grad ? b->name : a->name);
    }
    return RKM_OK;
}

rkm_result rkm_graph_finalize(rkm_graph *g)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_builder(g, "rkm_graph_finalize");
    if (r) return r;
    if ((r = rkm__graph_check_whole(g))) return r;
    rkm__graph_derive(g);
    if ((r = rkm__check_grads(g))) return r;
    g->input_bytes = 0;
    for (size_t t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].flags & RKM_TENSOR_INPUT) g->input_bytes += g->tensors[t].bytes;
    if ((r = rkm__structure_detect(g))) return r;
    if ((r = rkm__graph_figures(g))) {
        rkm__graph_free_blocks(g);
        return r;
    }
    g->finalized = 1;
    return RKM_OK;
}

/* Rebuild g's tensors, ops (with their costs from `costs`, or g's when
 * NULL) and loss into the empty graph n, every byte count rounded up to
 * `align` (1: as they are), the tensor flags in `drop` cleared, then
 * finalize it: everything derived comes from the new figures, as when the
 * graph's file is read. */
static rkm_result rkm__graph_rebuild(const rkm_graph *g, const rkm_op_costs *costs, const rkm_copy_desc *copy,
                                     uint64_t align, unsigned drop, rkm_graph *n)
{
    rkm_result r = RKM_OK;
    for (size_t t = 0; t < g->n_tensors && !r; t++)
        r = rkm_graph_add_tensor(n, g->tensors[t].name, rkm__round_up(g->tensors[t].bytes, align),
                                 g->tensors[t].flags & ~drop, NULL);
    for (size_t i = 0; i < g->n_ops && !r; i++) {
        const rkm__op *o = &g->ops[i];
        rkm_op_costs c = costs ? costs[i] : (rkm_op_costs){o->fwd, o->bwd, o->fwd_ws, o->bwd_ws};
        /* a stage input made plain has no gradient to take grad(out[0])'s buffer */
        unsigned flags = o->n_in && (g->tensors[o->in[0]].flags & drop & RKM_TENSOR_INPUT_GRAD) ? o->flags & ~RKM_OP_GRAD_INPLACE
                                                                                                : o->flags;
        rkm_op_desc d = {o->name, c.fwd_seconds, c.bwd_seconds, o->in, o->n_in, o->out, o->n_out, o->saved, o->n_saved,
                         rkm__round_up(o->phantom, align), rkm__round_up(c.fwd_ws, align), rkm__round_up(c.bwd_ws, align),
                         rkm__round_up(o->scratch, align), flags};
        r = rkm_graph_add_op(n, &d, NULL);
    }
    if (!r) r = g->output ? rkm_graph_set_output(n, g->loss) : rkm_graph_set_loss(n, g->loss);
    if (!r) r = rkm_graph_set_copy(n, copy);
    if (!r) r = rkm_graph_finalize(n);
    return r;
}

/* The graph a planner plans with at alignment `align`: g with every byte
 * count rounded up to it, so that the planners' own accounting (the
 * simulator's peak of that graph) bounds the plan's aligned peak; and its
 * stage inputs plain inputs, since the planners' models know no input
 * gradient (the plan's replay on g, which has them, is what is checked
 * against the budget: rkm__planner_handout). *out NULL when g's counts
 * are multiples of align already and it has no stage input (g itself
 * serves). */
RKM__PRIVATE rkm_result rkm__graph_aligned(const rkm_graph *g, uint64_t align, rkm_graph **out)
{
    *out = NULL;
    int aligned = 1;
    for (size_t t = 0; t < g->n_tensors && aligned; t++) aligned = !(g->tensors[t].flags & RKM_TENSOR_INPUT_GRAD);
    for (size_t t = 0; t < g->n_tensors && aligned; t++) aligned = g->tensors[t].bytes % align == 0;
    for (size_t i = 0; i < g->n_ops && aligned; i++) {
        const rkm__op *o = &g->ops[i];
        aligned = (o->phantom | o->fwd_ws | o->bwd_ws | o->scratch) % align == 0;
    }
    if (aligned) return RKM_OK;
    rkm_graph *n;
    rkm_result r = rkm_graph_create(g->ctx, &n);
    if (!r && (r = rkm__graph_rebuild(g, NULL, &g->copy, align, RKM_TENSOR_INPUT_GRAD, n))) rkm_graph_destroy(n);
    if (r == RKM_ERROR_GRAPH) { /* the rounded sums no longer fit 64 bits: the one rule a copy can break */
        char why[RKM__ERRMSG_SIZE];
        snprintf(why, sizeof why, "%s", rkm_context_errmsg(g->ctx));
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "solve desc: at alignment %llu the graph's byte counts no longer "
                        "fit: %s", (unsigned long long)align, why);
    }
    if (!r) *out = n;
    return r;
}

rkm_result rkm_graph_with_costs(const rkm_graph *g, const rkm_op_costs *costs, rkm_graph **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_with_costs: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!g) return RKM_ERROR_ARGUMENT;
    if (!costs) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_with_costs: costs is NULL");
    rkm_result r = rkm__check_finalized(g, "rkm_graph_with_costs");
    if (r) return r;
    rkm_graph *n;
    if ((r = rkm_graph_create(g->ctx, &n))) return r;
    if ((r = rkm__graph_rebuild(g, costs, &g->copy, 1, 0, n))) {
        rkm_graph_destroy(n);
        return r;
    }
    *out = n;
    return RKM_OK;
}

rkm_result rkm_graph_with_copy(const rkm_graph *g, const rkm_copy_desc *copy, rkm_graph **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_with_copy: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_finalized(g, "rkm_graph_with_copy");
    rkm_graph *n = NULL;
    if (!r) r = rkm_graph_create(g->ctx, &n);
    if (!r && (r = rkm__graph_rebuild(g, NULL, copy, 1, 0, n))) rkm_graph_destroy(n);
    if (!r) *out = n;
    return r;
}

/* Stage s of a cut: ops (lo, hi] (op ids), entered by `in` (-1 for the
 * first stage), left by `out`, which is g's loss (or output) for the last;
 * built into the empty graph n and finalized. */
static rkm_result rkm__stage_build(const rkm_graph *g, int32_t lo, int32_t hi, int32_t in, int32_t out, rkm_graph *n)
{
    rkm_context *ctx = g->ctx;
    int32_t *to = rkm__alloc(ctx, (g->n_tensors + 1) * sizeof *to); /* g's tensor -> n's */
    int32_t *ids = rkm__alloc(ctx, (2 * g->n_tensors + 1) * sizeof *ids); /* an op's lists: saved is within in+out */
    rkm_result r = to && ids ? RKM_OK : rkm__nomem(ctx, "rkm_graph_cut");
    for (size_t t = 0; !r && t < g->n_tensors; t++) to[t] = -1;
    for (int32_t i = lo + 1; !r && i <= hi; i++) { /* its tensors: what its ops read and write */
        const rkm__op *o = &g->ops[i];
        for (int32_t k = 0; k < o->n_in; k++) to[o->in[k]] = 0;
        for (int32_t k = 0; k < o->n_out; k++) to[o->out[k]] = 0;
    }
    for (size_t t = 0; !r && t < g->n_tensors; t++) {
        if (to[t] < 0) continue;
        const rkm__tensor *x = &g->tensors[t];
        unsigned flags = (int32_t)t == in ? RKM_TENSOR_INPUT | RKM_TENSOR_INPUT_GRAD : x->flags;
        r = rkm_graph_add_tensor(n, x->name, x->bytes, flags, &to[t]);
    }
    for (int32_t i = lo + 1; !r && i <= hi; i++) {
        const rkm__op *o = &g->ops[i];
        int32_t *in_ids = ids, *out_ids = ids + o->n_in, *saved_ids = out_ids + o->n_out;
        for (int32_t k = 0; k < o->n_in; k++) in_ids[k] = to[o->in[k]];
        for (int32_t k = 0; k < o->n_out; k++) out_ids[k] = to[o->out[k]];
        for (int32_t k = 0; k < o->n_saved; k++) saved_ids[k] = to[o->saved[k]];
        /* an input is never overwritten: a forward in place over the cut runs out of place in its stage */
        unsigned flags = o->n_in && o->in[0] == in ? o->flags & ~RKM_OP_INPLACE : o->flags;
        rkm_op_desc d = {o->name, o->fwd, o->bwd, in_ids, o->n_in, out_ids, o->n_out, saved_ids, o->n_saved,
                         o->phantom, o->fwd_ws, o->bwd_ws, o->scratch, flags};
        r = rkm_graph_add_op(n, &d, NULL);
    }
    if (!r) r = out == g->loss && !g->output ? rkm_graph_set_loss(n, to[out]) : rkm_graph_set_output(n, to[out]);
    if (!r) r = rkm_graph_set_copy(n, &g->copy);
    if (!r) r = rkm_graph_finalize(n);
    rkm__free(ctx, to, (g->n_tensors + 1) * sizeof *to);
    rkm__free(ctx, ids, (2 * g->n_tensors + 1) * sizeof *ids);
    return r;
}

/* The stage of blocks [first, end) of g (finalized) into *out. */
RKM__PRIVATE rkm_result rkm__graph_stage(const rkm_graph *g, int32_t first, int32_t end, rkm_graph **out)
{
    int32_t in = first ? g->blocks[first].in : -1, out_t = end < g->n_blocks ? g->blocks[end].in : g->loss;
    int32_t lo = first ? g->tensors[in].producer : -1, hi = end < g->n_blocks ? g->tensors[out_t].producer : (int32_t)g->n_ops - 1;
    rkm_result r = rkm_graph_create(g->ctx, out);
    if (!r && (r = rkm__stage_build(g, lo, hi, in, out_t, *out))) {
        rkm_graph_destroy(*out);
        *out = NULL;
    }
    return r;
}

rkm_result rkm_graph_cut(const rkm_graph *g, const int32_t *cuts, int32_t n_cuts, rkm_graph **stages)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    if (!stages) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_cut: stages is NULL");
    for (int32_t s = 0; s <= n_cuts && n_cuts >= 0; s++) stages[s] = NULL;
    rkm_result r = rkm__check_finalized(g, "rkm_graph_cut");
    if (r) return r;
    if (n_cuts < 0 || (n_cuts && !cuts))
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_cut: %d cuts%s (0 or more, in an array)", (int)n_cuts,
                        n_cuts > 0 ? " given as NULL" : "");
    /* A cut is a block boundary: every path from the first ops to the loss
     * passes through it, so the ops before it (in file order) are its
     * ancestors, those after it its descendants, and nothing but it and
     * the inputs crosses. */
    int32_t prev = 0;
    for (int32_t c = 0; c < n_cuts; c++) {
        int32_t t = cuts[c], b = 1;
        while (b < g->n_blocks && g->blocks[b].in != t) b++;
        if (t < 0 || (size_t)t >= g->n_tensors)
            return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_cut: cut %d: tensor id %d does not exist", (int)c,
                            (int)t);
        if (b >= g->n_blocks)
            return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_cut: cut %d: tensor %s is not a block boundary (a cut "
                            "is the input of a block, rkm_block_info.input; this graph has %d)", (int)c,
                            g->tensors[t].name, (int)g->n_blocks - 1);
        if (b <= prev)
            return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_cut: cut %d: tensor %s does not come after cut %d, "
                            "tensor %s (the cuts go in block order, each once)", (int)c, g->tensors[t].name,
                            (int)c - 1, g->tensors[cuts[c - 1]].name);
        prev = b;
    }
    for (int32_t s = 0; s <= n_cuts && !r; s++) {
        int32_t in = s ? cuts[s - 1] : -1, out = s < n_cuts ? cuts[s] : g->loss;
        int32_t lo = s ? g->tensors[in].producer : -1, hi = s < n_cuts ? g->tensors[out].producer : (int32_t)g->n_ops - 1;
        if (!(r = rkm_graph_create(g->ctx, &stages[s])) && (r = rkm__stage_build(g, lo, hi, in, out, stages[s]))) {
            char msg[RKM__ERRMSG_SIZE];
            snprintf(msg, sizeof msg, "%s", rkm_context_errmsg(g->ctx));
            r = rkm__err(g->ctx, r == RKM_ERROR_NOMEM ? r : RKM_ERROR_INTERNAL, "rkm_graph_cut: stage %d: %s", (int)s, msg);
        }
    }
    if (r)
        for (int32_t s = 0; s <= n_cuts; s++) {
            rkm_graph_destroy(stages[s]);
            stages[s] = NULL;
        }
    return r;
}
