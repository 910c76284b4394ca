/* llmc_graph.h -- the training step of llm.c's train_gpt2.c as a rockmate
 * graph: one graph op per call of gpt2_forward's kernel list, with the
 * buffers those kernels really read and write. Header-only and kernel-free:
 * examples/llmc.c runs it with a user's llm.c checkout, tests/test_llmc.c
 * with stand-in kernels of the same semantics. docs/porting.md explains
 * every declaration below.
 *
 * Ops, in gpt2_forward's order (tensors written in brackets):
 *   encoder [encoded]
 *   per layer l:  hl.ln1 [hl.ln1]  hl.qkv [hl.qkv]  hl.attn [hl.atty]
 *     hl.attproj [hl.attproj]  hl.res2 [hl.residual2]  hl.ln2 [hl.ln2]
 *     hl.fc [hl.fch]  hl.gelu [hl.fch_gelu]  hl.fcproj [hl.fcproj]
 *     hl.res3 [hl.residual3]
 *   lnf [lnf]  lm_head [logits]  softmax_xent [probs, losses]
 * softmax_xent runs softmax_forward then crossentropy_forward, and its
 * backward is llm.c's fused crossentropy_softmax_backward (dlogits from
 * probs): llm.c has no dprobs, so probs is an output without a gradient.
 *
 * What the kernels need, as declared:
 *   layernorm: saved=input; phantom=scratch=mean,rstd (2 floats per row):
 *     layernorm_forward always writes them;
 *   attention: saved=qkv; phantom=scratch=att (B*NH*T*T floats), which
 *     attention_forward always writes; fwd_ws=preatt (written, never read
 *     by the backward); bwd_ws=dpreatt,datt (the backward adds into them:
 *     the host zeroes them);
 *   encoder: saved=tokens; matmul, gelu: saved=input; residual: nothing;
 *   softmax_xent: saved=probs,targets.
 * Inputs: tokens and targets, int32 (B,T). Logits and probs are (B,T,Vp),
 * Vp >= V the padded vocabulary, as in llm.c.
 *
 * Usage: llmc_graph gg; llmc_graph_build(ctx, &shape, &gg) -> gg.g
 * finalized; gg.ops[op id] says which kernel each op runs; then
 * llmc_graph_order_forced() to confirm that no plan can change a gradient's
 * accumulation order; llmc_graph_free(&gg). */
#ifndef LLMC_GRAPH_H
#define LLMC_GRAPH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rockmate.h"
#include "gpt2_graph.h" /* the parameter table, shared */

typedef struct llmc_shape {
    int L, C, NH; /* layers, channels, heads (C % NH == 0) */
    int V, Vp;    /* vocabulary, padded vocabulary (Vp >= V) */
    int maxT;     /* wpe's rows (T <= maxT) */
    int B, T;     /* batch, sequence length */
} llmc_shape;

typedef enum llmc_kind {
    LLMC_ENCODER,
    LLMC_LAYERNORM,
    LLMC_MATMUL,
    LLMC_ATTENTION,
    LLMC_RESIDUAL,
    LLMC_GELU,
    LLMC_SOFTMAX_XENT
} llmc_kind;

/* Parameter tensors in llm.c's ParameterTensors order. */
typedef enum llmc_param {
    LLMC_WTE, LLMC_WPE, LLMC_LN1W, LLMC_LN1B, LLMC_QKVW, LLMC_QKVB,
    LLMC_ATTPROJW, LLMC_ATTPROJB, LLMC_LN2W, LLMC_LN2B, LLMC_FCW, LLMC_FCB,
    LLMC_FCPROJW, LLMC_FCPROJB, LLMC_LNFW, LLMC_LNFB, LLMC_NUM_PARAMS
} llmc_param;

_Static_assert((int)LLMC_NUM_PARAMS == (int)GPT2_NUM_PARAMS && (int)LLMC_LNFB == (int)GPT2_LNFB,
               "llm.c's parameter tensors are our GPT-2's, in the same order");

/* What one graph op runs. */
typedef struct llmc_opdef {
    llmc_kind kind;
    int layer;         /* 0..L-1, or -1 outside the layers */
    int weight, bias;  /* llmc_param or -1 */
    int C, OC;         /* matmul: input and output channels */
    int32_t in[2], out[2];
    int n_in, n_out;
    uint64_t fwd_ws;   /* as declared: where the scratch starts in a forward's workspace */
    uint64_t scratch;
} llmc_opdef;

typedef struct llmc_graph {
    rkm_graph *g;
    llmc_shape shape;
    int32_t tokens, targets, probs, losses; /* tensor ids; losses is the loss */
    int32_t n_ops;
    llmc_opdef *ops;                        /* indexed by op id; malloc'd */
} llmc_graph;

/* Elements of each parameter tensor, as llm.c's fill_in_parameter_sizes:
 * the same table as our own GPT-2's (same tensors, same order), with the
 * padded vocabulary and wpe's maxT rows. */
static inline void llmc_param_sizes(const llmc_shape *s, size_t sizes[LLMC_NUM_PARAMS])
{
    gpt2_shape gs;
    memset(&gs, 0, sizeof gs);
    gs.L = s->L;
    gs.C = s->C;
    gs.V = s->Vp;
    gs.T = s->maxT;
    gpt2_param_sizes(&gs, sizes);
}

/* Elements of one layer's slice of a per-layer parameter (0 for the others). */
static inline size_t llmc_param_stride(const llmc_shape *s, int param)
{
    size_t sizes[LLMC_NUM_PARAMS];
    llmc_param_sizes(s, sizes);
    if (param == LLMC_WTE || param == LLMC_WPE || param == LLMC_LNFW || param == LLMC_LNFB) return 0;
    return sizes[param] / (size_t)s->L;
}

static inline int llmc_shape_ok(const llmc_shape *s)
{
    return s->L >= 1 && s->C >= 1 && s->NH >= 1 && s->C % s->NH == 0 && s->V >= 1 && s->Vp >= s->V &&
           s->B >= 1 && s->T >= 1 && s->maxT >= s->T;
}

/* ---------------------------------------------------------------------------
 * Building
 * ------------------------------------------------------------------------- */

#define LLMC_SAVE_IN0 1u /* the backward reads in[0] */
#define LLMC_SAVE_IN1 2u /* ... in[1] */
#define LLMC_SAVE_OUT0 4u /* ... out[0] */

/* One op to add: its definition, the output tensors to declare, what it keeps. */
typedef struct llmc__spec {
    const char *name;
    const char *out_name[2];
    uint64_t out_bytes[2];
    llmc_opdef def;    /* in[] and n_in set by the caller; out[] filled here */
    unsigned saved;    /* LLMC_SAVE_* */
    uint64_t phantom, scratch, fwd_ws, bwd_ws;
    double flops;      /* forward FLOPs: a first cost guess */
} llmc__spec;

static inline llmc__spec llmc__op(const char *name, const char *out_name, uint64_t out_bytes, llmc_kind kind,
                                  int layer, int weight, int bias, int32_t in0, int32_t in1)
{
    llmc__spec sp;
    memset(&sp, 0, sizeof sp);
    sp.name = name;
    sp.out_name[0] = out_name;
    sp.out_bytes[0] = out_bytes;
    sp.def.kind = kind;
    sp.def.layer = layer;
    sp.def.weight = weight;
    sp.def.bias = bias;
    sp.def.in[0] = in0;
    sp.def.in[1] = in1;
    sp.def.n_in = in1 >= 0 ? 2 : 1;
    sp.def.n_out = 1;
    return sp;
}

/* Costs start as a guess (1 GFLOP/s, backward twice the forward); a host
 * that wants plans tuned to its machine profiles them (rkm_graph_profile). */
static inline rkm_result llmc__add(llmc_graph *gg, llmc__spec *sp)
{
    int32_t saved[3], n_saved = 0, id;
    rkm_op_desc d;
    rkm_result r;
    for (int k = 0; k < sp->def.n_out; k++)
        if ((r = rkm_graph_add_tensor(gg->g, sp->out_name[k], sp->out_bytes[k], 0, &sp->def.out[k])) != RKM_OK)
            return r;
    if (sp->saved & LLMC_SAVE_IN0) saved[n_saved++] = sp->def.in[0];
    if (sp->saved & LLMC_SAVE_IN1) saved[n_saved++] = sp->def.in[1];
    if (sp->saved & LLMC_SAVE_OUT0) saved[n_saved++] = sp->def.out[0];
    sp->def.fwd_ws = sp->fwd_ws;
    sp->def.scratch = sp->scratch;
    memset(&d, 0, sizeof d);
    d.name = sp->name;
    d.fwd_seconds = sp->flops * 1e-9 + 1e-6;
    d.bwd_seconds = 2.0 * d.fwd_seconds;
    d.in = sp->def.in;
    d.n_in = sp->def.n_in;
    d.out = sp->def.out;
    d.n_out = sp->def.n_out;
    d.saved = saved;
    d.n_saved = n_saved;
    d.phantom = sp->phantom;
    d.scratch = sp->scratch;
    d.fwd_ws = sp->fwd_ws;
    d.bwd_ws = sp->bwd_ws;
    if ((r = rkm_graph_add_op(gg->g, &d, &id)) != RKM_OK) return r;
    gg->ops[id] = sp->def;
    gg->n_ops = id + 1;
    return RKM_OK;
}

static inline int32_t llmc__last(const llmc_graph *gg) { return gg->ops[gg->n_ops - 1].out[0]; }

static inline uint64_t llmc__BT(const llmc_shape *s) { return (uint64_t)s->B * (uint64_t)s->T; }

/* layernorm_forward(out, mean, rstd, inp, w, b): mean and rstd are written
 * on every call, and only the backward reads them. */
static inline rkm_result llmc__layernorm(llmc_graph *gg, const char *name, int layer, int w, int b, int32_t x)
{
    uint64_t BT = llmc__BT(&gg->shape), C = (uint64_t)gg->shape.C;
    llmc__spec sp = llmc__op(name, name, BT * C * 4, LLMC_LAYERNORM, layer, w, b, x, -1);
    sp.saved = LLMC_SAVE_IN0;
    sp.phantom = sp.scratch = 2 * BT * 4;
    sp.flops = 8.0 * (double)(BT * C);
    return llmc__add(gg, &sp);
}

static inline rkm_result llmc__matmul(llmc_graph *gg, const char *name, const char *out_name, int layer, int w,
                                      int b, int C, int OC, int32_t x)
{
    uint64_t BT = llmc__BT(&gg->shape);
    llmc__spec sp = llmc__op(name, out_name, BT * (uint64_t)OC * 4, LLMC_MATMUL, layer, w, b, x, -1);
    sp.def.C = C;
    sp.def.OC = OC;
    sp.saved = LLMC_SAVE_IN0;
    sp.flops = 2.0 * (double)BT * C * OC;
    return llmc__add(gg, &sp);
}

/* attention_forward(out, preatt, att, inp): both (B,NH,T,T), both written
 * on every call; the backward reads att only. attention_backward adds into
 * dpreatt and datt. */
static inline rkm_result llmc__attention(llmc_graph *gg, const char *name, const char *out_name, int layer,
                                         int32_t qkv)
{
    const llmc_shape *s = &gg->shape;
    uint64_t BT = llmc__BT(s), scores = (uint64_t)s->B * (uint64_t)s->NH * (uint64_t)s->T * (uint64_t)s->T * 4;
    llmc__spec sp = llmc__op(name, out_name, BT * (uint64_t)s->C * 4, LLMC_ATTENTION, layer, -1, -1, qkv, -1);
    sp.saved = LLMC_SAVE_IN0;
    sp.phantom = sp.scratch = scores; /* att */
    sp.fwd_ws = scores;               /* preatt */
    sp.bwd_ws = 2 * scores;           /* dpreatt, datt */
    sp.flops = 2.0 * (double)s->B * s->T * s->T * s->C;
    return llmc__add(gg, &sp);
}

static inline rkm_result llmc__residual(llmc_graph *gg, const char *name, int layer, int32_t a, int32_t b)
{
    uint64_t n = llmc__BT(&gg->shape) * (uint64_t)gg->shape.C;
    llmc__spec sp = llmc__op(name, name, n * 4, LLMC_RESIDUAL, layer, -1, -1, a, b);
    sp.flops = (double)n;
    return llmc__add(gg, &sp);
}

/* One transformer block as gpt2_forward's loop body; *x: the residual
 * stream in (encoded or the previous residual3), then out. */
static inline rkm_result llmc__layer(llmc_graph *gg, int l, int32_t *x)
{
    uint64_t BT = llmc__BT(&gg->shape);
    int C = gg->shape.C;
    char n[12][40];
    const char *suffix[12] = {"ln1", "qkv", "attn", "atty", "attproj", "res2",
                              "residual2", "ln2", "fc", "fch", "gelu", "fch_gelu"};
    int32_t residual2;
    llmc__spec sp;
    rkm_result r;
    for (int i = 0; i < 12; i++) snprintf(n[i], sizeof n[i], "h%d.%s", l, suffix[i]);
    if ((r = llmc__layernorm(gg, n[0], l, LLMC_LN1W, LLMC_LN1B, *x)) != RKM_OK) return r;
    if ((r = llmc__matmul(gg, n[1], n[1], l, LLMC_QKVW, LLMC_QKVB, C, 3 * C, llmc__last(gg))) != RKM_OK) return r;
    if ((r = llmc__attention(gg, n[2], n[3], l, llmc__last(gg))) != RKM_OK) return r;
    if ((r = llmc__matmul(gg, n[4], n[4], l, LLMC_ATTPROJW, LLMC_ATTPROJB, C, C, llmc__last(gg))) != RKM_OK)
        return r;
    sp = llmc__op(n[5], n[6], BT * (uint64_t)C * 4, LLMC_RESIDUAL, l, -1, -1, *x, llmc__last(gg));
    sp.flops = (double)(BT * (uint64_t)C);
    if ((r = llmc__add(gg, &sp)) != RKM_OK) return r;
    residual2 = llmc__last(gg);
    if ((r = llmc__layernorm(gg, n[7], l, LLMC_LN2W, LLMC_LN2B, residual2)) != RKM_OK) return r;
    if ((r = llmc__matmul(gg, n[8], n[9], l, LLMC_FCW, LLMC_FCB, C, 4 * C, llmc__last(gg))) != RKM_OK) return r;
    sp = llmc__op(n[10], n[11], BT * 4 * (uint64_t)C * 4, LLMC_GELU, l, -1, -1, llmc__last(gg), -1);
    sp.saved = LLMC_SAVE_IN0;
    sp.flops = 10.0 * (double)(BT * 4 * (uint64_t)C);
    if ((r = llmc__add(gg, &sp)) != RKM_OK) return r;
    snprintf(n[0], sizeof n[0], "h%d.fcproj", l);
    if ((r = llmc__matmul(gg, n[0], n[0], l, LLMC_FCPROJW, LLMC_FCPROJB, 4 * C, C, llmc__last(gg))) != RKM_OK)
        return r;
    snprintf(n[0], sizeof n[0], "h%d.res3", l);
    snprintf(n[1], sizeof n[1], "h%d.residual3", l);
    sp = llmc__op(n[0], n[1], BT * (uint64_t)C * 4, LLMC_RESIDUAL, l, -1, -1, residual2, llmc__last(gg));
    sp.flops = (double)(BT * (uint64_t)C);
    if ((r = llmc__add(gg, &sp)) != RKM_OK) return r;
    *x = llmc__last(gg);
    return RKM_OK;
}

static inline rkm_result llmc__build_ops(llmc_graph *gg)
{
    const llmc_shape *s = &gg->shape;
    uint64_t BT = llmc__BT(s), Vp = (uint64_t)s->Vp;
    llmc__spec sp;
    int32_t x;
    rkm_result r;
    if ((r = rkm_graph_add_tensor(gg->g, "tokens", BT * 4, RKM_TENSOR_INPUT, &gg->tokens)) != RKM_OK) return r;
    if ((r = rkm_graph_add_tensor(gg->g, "targets", BT * 4, RKM_TENSOR_INPUT, &gg->targets)) != RKM_OK) return r;
    sp = llmc__op("encoder", "encoded", BT * (uint64_t)s->C * 4, LLMC_ENCODER, -1, LLMC_WTE, LLMC_WPE, gg->tokens,
                  -1);
    sp.saved = LLMC_SAVE_IN0;
    sp.flops = (double)(BT * (uint64_t)s->C);
    if ((r = llmc__add(gg, &sp)) != RKM_OK) return r;
    x = llmc__last(gg);
    for (int l = 0; l < s->L; l++)
        if ((r = llmc__layer(gg, l, &x)) != RKM_OK) return r;
    if ((r = llmc__layernorm(gg, "lnf", -1, LLMC_LNFW, LLMC_LNFB, x)) != RKM_OK) return r;
    /* matmul_forward(logits, lnf, wte, NULL, B, T, C, Vp): tied, no bias */
    if ((r = llmc__matmul(gg, "lm_head", "logits", -1, LLMC_WTE, -1, s->C, s->Vp, llmc__last(gg))) != RKM_OK)
        return r;
    sp = llmc__op("softmax_xent", "probs", BT * Vp * 4, LLMC_SOFTMAX_XENT, -1, -1, -1, llmc__last(gg), gg->targets);
    sp.out_name[1] = "losses";
    sp.out_bytes[1] = BT * 4;
    sp.def.n_out = 2;
    sp.saved = LLMC_SAVE_OUT0 | LLMC_SAVE_IN1; /* crossentropy_softmax_backward reads probs, targets */
    sp.flops = 5.0 * (double)(BT * Vp);
    if ((r = llmc__add(gg, &sp)) != RKM_OK) return r;
    gg->probs = gg->ops[gg->n_ops - 1].out[0];
    gg->losses = gg->ops[gg->n_ops - 1].out[1];
    if ((r = rkm_graph_set_loss(gg->g, gg->losses)) != RKM_OK) return r;
    return rkm_graph_finalize(gg->g);
}

static inline void llmc_graph_free(llmc_graph *gg)
{
    rkm_graph_destroy(gg->g);
    free(gg->ops);
    memset(gg, 0, sizeof *gg);
}

/* Build and finalize the graph. On failure *gg is left empty:
 * RKM_ERROR_ARGUMENT for a shape llmc_shape_ok rejects, RKM_ERROR_NOMEM, or
 * the library's error with the context's message. */
static inline rkm_result llmc_graph_build(rkm_context *ctx, const llmc_shape *shape, llmc_graph *gg)
{
    size_t max_ops = 4 + (size_t)(shape->L > 0 ? shape->L : 0) * 10;
    rkm_result r;
    memset(gg, 0, sizeof *gg);
    if (!llmc_shape_ok(shape)) return RKM_ERROR_ARGUMENT;
    gg->shape = *shape;
    gg->ops = (llmc_opdef *)calloc(max_ops, sizeof *gg->ops);
    if (!gg->ops) return RKM_ERROR_NOMEM;
    r = rkm_graph_create(ctx, &gg->g);
    if (r == RKM_OK) r = llmc__build_ops(gg);
    if (r != RKM_OK) llmc_graph_free(gg);
    return r;
}

/* ---------------------------------------------------------------------------
 * Accumulation order
 * ------------------------------------------------------------------------- */

/* 1 if the op has a backward: one of its outputs has a gradient. */
static inline int llmc__has_backward(const llmc_graph *gg, int32_t op)
{
    for (int k = 0; k < gg->ops[op].n_out; k++) {
        rkm_tensor_info ti;
        if (rkm_graph_tensor_info(gg->g, gg->ops[op].out[k], &ti) == RKM_OK && ti.has_grad) return 1;
    }
    return 0;
}

/* 1 if op b depends on op a through tensors that have gradients (a path
 * a -> t -> ... -> b). Then b's backward runs before a's in every valid
 * plan: a's backward needs grad(t) complete, which needs the backward of
 * every reader of t, and so on down to b. */
static inline int llmc__grad_path(const llmc_graph *gg, int32_t a, int32_t b)
{
    int32_t n = gg->n_ops;
    char *reach = (char *)calloc((size_t)n, 1);
    int found = 0;
    if (!reach) return 0;
    reach[a] = 1;
    for (int32_t op = a + 1; op <= b && op < n; op++) /* ops are in topological order */
        for (int i = 0; i < gg->ops[op].n_in && !reach[op]; i++) {
            int32_t t = gg->ops[op].in[i];
            rkm_tensor_info ti;
            if (rkm_graph_tensor_info(gg->g, t, &ti) == RKM_OK && ti.producer >= 0 && ti.has_grad &&
                reach[ti.producer] && llmc__has_backward(gg, op))
                reach[op] = 1;
        }
    found = b < n && reach[b];
    free(reach);
    return found;
}

/* A backward adds into a gradient from many ops: its float sums depend on
 * the order in which those backwards run. Checks that the graph leaves a
 * plan no choice: for every activation gradient with two or more
 * contributors, and every parameter (slice) two ops add into, the ops are
 * ordered by dependency, so every valid plan runs their backwards in the
 * one order llm.c's gpt2_backward uses (a reverse topological order). 1 when
 * forced; 0 with the first pair that is not in `why`. */
static inline int llmc_graph_order_forced(const llmc_graph *gg, char *why, size_t size)
{
    int32_t n = gg->n_ops;
    for (int32_t a = 0; a < n; a++)
        for (int32_t b = a + 1; b < n; b++) {
            const llmc_opdef *x = &gg->ops[a], *y = &gg->ops[b];
            int shared = 0;
            for (int i = 0; i < x->n_in; i++)
                for (int j = 0; j < y->n_in; j++) {
                    rkm_tensor_info ti;
                    if (x->in[i] == y->in[j] && rkm_graph_tensor_info(gg->g, x->in[i], &ti) == RKM_OK && ti.has_grad)
                        shared = 1;
                }
            for (int p = 0; p < 2; p++) {
                int px = p ? x->bias : x->weight;
                if (px < 0) continue;
                if ((px == y->weight || px == y->bias) &&
                    (x->layer == y->layer || llmc_param_stride(&gg->shape, px) == 0))
                    shared = 1;
            }
            if (shared && !llmc__grad_path(gg, a, b)) {
                rkm_op_desc da, db;
                rkm_graph_op_info(gg->g, a, &da);
                rkm_graph_op_info(gg->g, b, &db);
                snprintf(why, size, "ops %s and %s add into one gradient and neither depends on the other: a plan "
                         "may run their backwards in either order", da.name, db.name);
                return 0;
            }
        }
    if (size) why[0] = 0;
    return 1;
}

#endif /* LLMC_GRAPH_H */
