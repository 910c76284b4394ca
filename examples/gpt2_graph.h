/* gpt2_graph.h -- one GPT-2 training step (llm.c's train_gpt2.c layout, fp32)
 * as a rockmate graph, with exact byte sizes. Header-only and kernel-free, so
 * the CPU trainer (gpt2.c) and the CUDA trainer share it; compiles as C11 and
 * as C++.
 *
 * Per layer l the ops are (tensor written in brackets):
 *   hl.ln1 [hl.ln1]  hl.qkv [hl.qkv]  hl.attn [hl.atty]  hl.attproj [hl.attproj]
 *   (hl.attdrop [hl.attdrop])  hl.res2 [hl.res2]  hl.ln2 [hl.ln2]  hl.fc [hl.fch]
 *   hl.gelu [hl.gelu]  hl.fcproj [hl.fcproj]  (hl.fcdrop [hl.fcdrop])  hl.res3 [hl.res3]
 * framed by encoder [encoded] before and lnf [lnf], lm_head [logits],
 * softmax [probs], xent [losses] after; the dropout ops exist only when the
 * shape asks for them. Inputs: tokens and targets, int32 (B,T).
 *
 * What each op keeps for its backward, as the kernels really use it:
 *   layernorm: its input (saved) and mean, rstd (phantom, 2 floats per row);
 *   encoder: the tokens; matmul: its input; gelu: its input; residual: nothing;
 *   attention: qkv (saved), the probabilities (phantom, B*NH*T*T floats);
 *     the backward's dpreatt and datt are backward workspace;
 *   dropout: its mask (phantom, one byte per element);
 *   softmax: its output; cross-entropy: probs and targets.
 * What each forward writes on every run (the graph's scratch): attention
 * computes its scores and then, in place, their softmax in a buffer of the
 * probabilities' size on every run, so its whole phantom is scratch: the
 * saved state when it runs with save (or while that is live), else the
 * call's workspace (rkm_fwd_call.ws_bytes), and no other forward workspace.
 * Layernorm writes mean and rstd only when it saves them (it keeps them in
 * registers otherwise) and dropout its mask likewise, so they have none:
 * every forward needs exactly what the contract counts.
 *
 * Usage: gpt2_graph gg; gpt2_graph_build(ctx, &shape, &gg) -> gg.g finalized;
 * gg.ops[op id] says what to run for each graph op; gpt2_graph_free(&gg).
 * Op costs start as a FLOP-count guess; rkm_graph_profile measures them
 * into a new graph (same ops and tensors) to plan and run with. A host whose
 * kernels need other workspaces (cuBLAS, a fused attention) makes a graph
 * with its own costs with rkm_graph_with_costs before planning. */
#ifndef GPT2_GRAPH_H
#define GPT2_GRAPH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rockmate.h"

typedef struct gpt2_shape {
    int L;       /* layers */
    int C;       /* channels */
    int NH;      /* heads; C % NH == 0 */
    int V;       /* vocabulary */
    int B, T;    /* batch, sequence length (also wpe's rows) */
    int dropout; /* 1: dropout ops after attproj and fcproj */
    int inplace; /* 1: GELU's and the residual adds' backwards run in place
                    (grad_inplace): the residual stream's gradient stays in
                    one buffer down the layers, as llm.c's dresidual */
} gpt2_shape;

typedef enum gpt2_kind {
    GPT2_ENCODER,
    GPT2_LAYERNORM,
    GPT2_MATMUL,
    GPT2_ATTENTION,
    GPT2_RESIDUAL,
    GPT2_GELU,
    GPT2_DROPOUT,
    GPT2_SOFTMAX,
    GPT2_XENT
} gpt2_kind;

/* Parameter tensors in llm.c's order; per-layer ones hold L slices. */
typedef enum gpt2_param {
    GPT2_WTE, GPT2_WPE, GPT2_LN1W, GPT2_LN1B, GPT2_QKVW, GPT2_QKVB,
    GPT2_ATTPROJW, GPT2_ATTPROJB, GPT2_LN2W, GPT2_LN2B, GPT2_FCW, GPT2_FCB,
    GPT2_FCPROJW, GPT2_FCPROJB, GPT2_LNFW, GPT2_LNFB, GPT2_NUM_PARAMS
} gpt2_param;

/* What one graph op runs. Matmul: n = input width, m = output width.
 * Layernorm: n = m = C. Elementwise ops: n = m = elements. */
typedef struct gpt2_opdef {
    gpt2_kind kind;
    int layer;      /* 0..L-1, or -1 outside the layers (weights are then whole) */
    int weight;     /* gpt2_param or -1 */
    int bias;       /* gpt2_param or -1 */
    int n, m;
    int32_t in[2];  /* tensor ids, in the graph's in order */
    int n_in;
    int32_t out;    /* every op here has exactly one output */
} gpt2_opdef;

typedef struct gpt2_graph {
    rkm_graph *g;
    gpt2_shape shape;
    int32_t tokens, targets, loss; /* tensor ids */
    int32_t n_ops;
    gpt2_opdef *ops;               /* indexed by op id; malloc'd */
} gpt2_graph;

/* Elements of each parameter tensor (llm.c's sizes; wpe has T rows). */
static inline void gpt2_param_sizes(const gpt2_shape *s, size_t sizes[GPT2_NUM_PARAMS])
{
    size_t L = (size_t)s->L, C = (size_t)s->C;
    sizes[GPT2_WTE] = (size_t)s->V * C;
    sizes[GPT2_WPE] = (size_t)s->T * C;
    sizes[GPT2_LN1W] = L * C;
    sizes[GPT2_LN1B] = L * C;
    sizes[GPT2_QKVW] = L * 3 * C * C;
    sizes[GPT2_QKVB] = L * 3 * C;
    sizes[GPT2_ATTPROJW] = L * C * C;
    sizes[GPT2_ATTPROJB] = L * C;
    sizes[GPT2_LN2W] = L * C;
    sizes[GPT2_LN2B] = L * C;
    sizes[GPT2_FCW] = L * 4 * C * C;
    sizes[GPT2_FCB] = L * 4 * C;
    sizes[GPT2_FCPROJW] = L * C * 4 * C;
    sizes[GPT2_FCPROJB] = L * C;
    sizes[GPT2_LNFW] = C;
    sizes[GPT2_LNFB] = C;
}

/* Elements of one layer's slice of a per-layer parameter (whole size for
 * the others, which are used with layer -1). */
static inline size_t gpt2_param_slice(const gpt2_shape *s, int param)
{
    size_t sizes[GPT2_NUM_PARAMS];
    gpt2_param_sizes(s, sizes);
    if (param == GPT2_WTE || param == GPT2_WPE || param == GPT2_LNFW || param == GPT2_LNFB)
        return sizes[param];
    return sizes[param] / (size_t)s->L;
}

static inline int gpt2_shape_ok(const gpt2_shape *s)
{
    return s->L >= 1 && s->C >= 1 && s->NH >= 1 && s->C % s->NH == 0 && s->V >= 1 && s->B >= 1 &&
           s->T >= 1 && (s->dropout == 0 || s->dropout == 1);
}

#define GPT2_SAVE_IN0 1u /* the backward reads in[0] */
#define GPT2_SAVE_IN1 2u /* ... in[1] */
#define GPT2_SAVE_OUT 4u /* ... the output */

/* One op to add: the opdef, the output tensor, what it keeps and needs. */
typedef struct gpt2__opspec {
    const char *name, *out_name;
    uint64_t out_bytes;
    gpt2_opdef def;      /* in[] and n_in set by the caller; out filled here */
    unsigned saved;      /* GPT2_SAVE_* */
    uint64_t phantom, fwd_ws, bwd_ws, scratch;
    unsigned flags;      /* RKM_OP_GRAD_INPLACE */
    double flops;        /* forward FLOPs, for a first time estimate */
} gpt2__opspec;

/* A first guess of the costs before profiling: 1 GFLOP/s, backward twice
 * the forward; rkm_graph_profile replaces both with measurements. */
static inline rkm_result gpt2__add(gpt2_graph *gg, gpt2__opspec *sp)
{
    int32_t out, saved[3], n_saved = 0, id;
    rkm_result r = rkm_graph_add_tensor(gg->g, sp->out_name, sp->out_bytes, 0, &out);
    rkm_op_desc d;
    if (r != RKM_OK) return r;
    sp->def.out = out;
    if (sp->saved & GPT2_SAVE_IN0) saved[n_saved++] = sp->def.in[0];
    if (sp->saved & GPT2_SAVE_IN1) saved[n_saved++] = sp->def.in[1];
    if (sp->saved & GPT2_SAVE_OUT) saved[n_saved++] = out;
    memset(&d, 0, sizeof d);
    d.name = sp->name;
    d.fwd_seconds = sp->flops * 1e-9 + 1e-6;
    d.bwd_seconds = 2.0 * d.fwd_seconds;
    d.in = sp->def.in;
    d.n_in = sp->def.n_in;
    d.out = &out;
    d.n_out = 1;
    d.saved = saved;
    d.n_saved = n_saved;
    d.phantom = sp->phantom;
    d.fwd_ws = sp->fwd_ws;
    d.bwd_ws = sp->bwd_ws;
    d.scratch = sp->scratch;
    d.flags = sp->flags;
    r = rkm_graph_add_op(gg->g, &d, &id);
    if (r != RKM_OK) return r;
    gg->ops[id] = sp->def;
    gg->n_ops = id + 1;
    return RKM_OK;
}

/* An opspec with its opdef filled; in1 < 0 for a one-input op. */
static inline gpt2__opspec gpt2__spec(const char *name, const char *out_name, gpt2_kind kind, int layer,
                                      int weight, int bias, int n, int m, int32_t in0, int32_t in1)
{
    gpt2__opspec sp;
    memset(&sp, 0, sizeof sp);
    sp.name = name;
    sp.out_name = out_name;
    sp.def.kind = kind;
    sp.def.layer = layer;
    sp.def.weight = weight;
    sp.def.bias = bias;
    sp.def.n = n;
    sp.def.m = m;
    sp.def.in[0] = in0;
    sp.def.in[1] = in1;
    sp.def.n_in = in1 >= 0 ? 2 : 1;
    sp.def.out = -1;
    return sp;
}

/* The output id of the op just added. */
static inline int32_t gpt2__last(const gpt2_graph *gg) { return gg->ops[gg->n_ops - 1].out; }

static inline rkm_result gpt2__layernorm(gpt2_graph *gg, const char *name, int layer, int w, int b, int32_t x)
{
    const gpt2_shape *s = &gg->shape;
    uint64_t BT = (uint64_t)s->B * (uint64_t)s->T;
    gpt2__opspec sp = gpt2__spec(name, name, GPT2_LAYERNORM, layer, w, b, s->C, s->C, x, -1);
    sp.out_bytes = BT * (uint64_t)s->C * 4;
    sp.saved = GPT2_SAVE_IN0;
    sp.phantom = 2 * BT * 4;
    sp.flops = 8.0 * (double)BT * s->C;
    return gpt2__add(gg, &sp);
}

static inline rkm_result gpt2__matmul(gpt2_graph *gg, const char *name, const char *out_name, int layer, int w,
                                      int b, int n, int m, int32_t x)
{
    const gpt2_shape *s = &gg->shape;
    uint64_t BT = (uint64_t)s->B * (uint64_t)s->T;
    gpt2__opspec sp = gpt2__spec(name, out_name, GPT2_MATMUL, layer, w, b, n, m, x, -1);
    sp.out_bytes = BT * (uint64_t)m * 4;
    sp.saved = GPT2_SAVE_IN0;
    sp.flops = 2.0 * (double)BT * n * m;
    return gpt2__add(gg, &sp);
}

/* Elementwise ops over `count` floats: residual (two inputs), gelu, dropout. */
static inline rkm_result gpt2__elementwise(gpt2_graph *gg, const char *name, gpt2_kind kind, int layer,
                                           uint64_t count, int32_t a, int32_t b)
{
    gpt2__opspec sp = gpt2__spec(name, name, kind, layer, -1, -1, (int)count, (int)count, a, b);
    sp.out_bytes = count * 4;
    sp.saved = kind == GPT2_GELU ? GPT2_SAVE_IN0 : 0u;
    sp.phantom = kind == GPT2_DROPOUT ? count : 0; /* one byte of mask per element */
    /* grad(in[0]) over grad(out): GELU's backward is elementwise, and a
     * residual add passes its gradient through to the stream (in[0]) */
    sp.flags = gg->shape.inplace && (kind == GPT2_GELU || kind == GPT2_RESIDUAL) ? RKM_OP_GRAD_INPLACE : 0u;
    sp.flops = 10.0 * (double)count;
    return gpt2__add(gg, &sp);
}

static inline rkm_result gpt2__attention(gpt2_graph *gg, const char *name, const char *out_name, int layer,
                                         int32_t qkv)
{
    const gpt2_shape *s = &gg->shape;
    uint64_t BT = (uint64_t)s->B * (uint64_t)s->T;
    uint64_t scores = (uint64_t)s->B * (uint64_t)s->NH * (uint64_t)s->T * (uint64_t)s->T * 4;
    gpt2__opspec sp = gpt2__spec(name, out_name, GPT2_ATTENTION, layer, -1, -1, 3 * s->C, s->C, qkv, -1);
    sp.out_bytes = BT * (uint64_t)s->C * 4;
    sp.saved = GPT2_SAVE_IN0;
    sp.phantom = scores;    /* att */
    sp.scratch = scores;    /* att, written on every run (the scores first, in place) */
    sp.bwd_ws = 2 * scores; /* dpreatt, datt */
    sp.flops = 2.0 * (double)s->B * s->T * s->T * s->C;
    return gpt2__add(gg, &sp);
}

/* Residual branch output, followed by its dropout when the shape has it. */
static inline rkm_result gpt2__maybe_dropout(gpt2_graph *gg, const char *name, int layer, int32_t *x)
{
    uint64_t count = (uint64_t)gg->shape.B * (uint64_t)gg->shape.T * (uint64_t)gg->shape.C;
    rkm_result r;
    if (!gg->shape.dropout) return RKM_OK;
    r = gpt2__elementwise(gg, name, GPT2_DROPOUT, layer, count, *x, -1);
    if (r == RKM_OK) *x = gpt2__last(gg);
    return r;
}

/* One transformer block; *x is the residual stream in, then out. */
static inline rkm_result gpt2__layer(gpt2_graph *gg, int l, int32_t *x)
{
    const gpt2_shape *s = &gg->shape;
    uint64_t BTC = (uint64_t)s->B * (uint64_t)s->T * (uint64_t)s->C;
    int C = s->C;
    char n[12][48];
    const char *suffix[12] = {"ln1", "qkv", "attn", "atty", "attproj", "attdrop",
                              "res2", "ln2", "fc", "fch", "gelu", "fcproj"};
    int32_t res, y;
    rkm_result r;
    for (int i = 0; i < 12; i++) snprintf(n[i], sizeof n[i], "h%d.%s", l, suffix[i]);
    if ((r = gpt2__layernorm(gg, n[0], l, GPT2_LN1W, GPT2_LN1B, *x)) != RKM_OK) return r;
    if ((r = gpt2__matmul(gg, n[1], n[1], l, GPT2_QKVW, GPT2_QKVB, C, 3 * C, gpt2__last(gg))) != RKM_OK) return r;
    if ((r = gpt2__attention(gg, n[2], n[3], l, gpt2__last(gg))) != RKM_OK) return r;
    if ((r = gpt2__matmul(gg, n[4], n[4], l, GPT2_ATTPROJW, GPT2_ATTPROJB, C, C, gpt2__last(gg))) != RKM_OK)
        return r;
    y = gpt2__last(gg);
    if ((r = gpt2__maybe_dropout(gg, n[5], l, &y)) != RKM_OK) return r;
    if ((r = gpt2__elementwise(gg, n[6], GPT2_RESIDUAL, l, BTC, *x, y)) != RKM_OK) return r;
    res = gpt2__last(gg);
    if ((r = gpt2__layernorm(gg, n[7], l, GPT2_LN2W, GPT2_LN2B, res)) != RKM_OK) return r;
    if ((r = gpt2__matmul(gg, n[8], n[9], l, GPT2_FCW, GPT2_FCB, C, 4 * C, gpt2__last(gg))) != RKM_OK) return r;
    if ((r = gpt2__elementwise(gg, n[10], GPT2_GELU, l, 4 * BTC, gpt2__last(gg), -1)) != RKM_OK) return r;
    if ((r = gpt2__matmul(gg, n[11], n[11], l, GPT2_FCPROJW, GPT2_FCPROJB, 4 * C, C, gpt2__last(gg))) != RKM_OK)
        return r;
    y = gpt2__last(gg);
    snprintf(n[0], sizeof n[0], "h%d.fcdrop", l);
    if ((r = gpt2__maybe_dropout(gg, n[0], l, &y)) != RKM_OK) return r;
    snprintf(n[0], sizeof n[0], "h%d.res3", l);
    if ((r = gpt2__elementwise(gg, n[0], GPT2_RESIDUAL, l, BTC, res, y)) != RKM_OK) return r;
    *x = gpt2__last(gg);
    return RKM_OK;
}

/* Encoder, the layers, and the head down to the per-position losses. */
static inline rkm_result gpt2__build_ops(gpt2_graph *gg)
{
    const gpt2_shape *s = &gg->shape;
    uint64_t BT = (uint64_t)s->B * (uint64_t)s->T;
    gpt2__opspec sp;
    int32_t x;
    rkm_result r;
    if ((r = rkm_graph_add_tensor(gg->g, "tokens", BT * 4, RKM_TENSOR_INPUT, &gg->tokens)) != RKM_OK) return r;
    if ((r = rkm_graph_add_tensor(gg->g, "targets", BT * 4, RKM_TENSOR_INPUT, &gg->targets)) != RKM_OK) return r;
    sp = gpt2__spec("encoder", "encoded", GPT2_ENCODER, -1, GPT2_WTE, GPT2_WPE, s->C, s->C, gg->tokens, -1);
    sp.out_bytes = BT * (uint64_t)s->C * 4;
    sp.saved = GPT2_SAVE_IN0;
    sp.flops = (double)BT * s->C;
    if ((r = gpt2__add(gg, &sp)) != RKM_OK) return r;
    x = gpt2__last(gg);
    for (int l = 0; l < s->L; l++)
        if ((r = gpt2__layer(gg, l, &x)) != RKM_OK) return r;
    if ((r = gpt2__layernorm(gg, "lnf", -1, GPT2_LNFW, GPT2_LNFB, x)) != RKM_OK) return r;
    /* the lm_head is tied to wte, without bias */
    if ((r = gpt2__matmul(gg, "lm_head", "logits", -1, GPT2_WTE, -1, s->C, s->V, gpt2__last(gg))) != RKM_OK)
        return r;
    sp = gpt2__spec("softmax", "probs", GPT2_SOFTMAX, -1, -1, -1, s->V, s->V, gpt2__last(gg), -1);
    sp.out_bytes = BT * (uint64_t)s->V * 4;
    sp.saved = GPT2_SAVE_OUT;
    sp.flops = 5.0 * (double)BT * s->V;
    if ((r = gpt2__add(gg, &sp)) != RKM_OK) return r;
    sp = gpt2__spec("xent", "losses", GPT2_XENT, -1, -1, -1, s->V, 1, gpt2__last(gg), gg->targets);
    sp.out_bytes = BT * 4;
    sp.saved = GPT2_SAVE_IN0 | GPT2_SAVE_IN1;
    sp.flops = (double)BT;
    if ((r = gpt2__add(gg, &sp)) != RKM_OK) return r;
    gg->loss = gpt2__last(gg);
    if ((r = rkm_graph_set_loss(gg->g, gg->loss)) != RKM_OK) return r;
    return rkm_graph_finalize(gg->g);
}

static inline void gpt2_graph_free(gpt2_graph *gg)
{
    rkm_graph_destroy(gg->g);
    free(gg->ops);
    memset(gg, 0, sizeof *gg);
}

/* Build and finalize the graph of one training step. On failure *gg is
 * left empty: RKM_ERROR_ARGUMENT for a shape gpt2_shape_ok rejects,
 * RKM_ERROR_NOMEM, or the library's error with the context's message. */
static inline rkm_result gpt2_graph_build(rkm_context *ctx, const gpt2_shape *shape, gpt2_graph *gg)
{
    size_t max_ops = 5 + (size_t)(shape->L > 0 ? shape->L : 0) * 12;
    rkm_result r;
    memset(gg, 0, sizeof *gg);
    if (!gpt2_shape_ok(shape)) return RKM_ERROR_ARGUMENT;
    gg->shape = *shape;
    gg->ops = (gpt2_opdef *)calloc(max_ops, sizeof *gg->ops);
    if (!gg->ops) return RKM_ERROR_NOMEM;
    r = rkm_graph_create(ctx, &gg->g);
    if (r == RKM_OK) r = gpt2__build_ops(gg);
    if (r != RKM_OK) gpt2_graph_free(gg);
    return r;
}

#endif /* GPT2_GRAPH_H */
