/* test_llmc.c -- examples/llmc.c without an llm.c checkout: the same graph
 * (llmc_graph.h) and the same host (llmc_host.h), run with stand-in
 * kernels written here that have llm.c's train_gpt2.c names, signatures and
 * semantics: layernorm always writes mean/rstd, attention always writes
 * preatt and att, softmax and cross-entropy forwards are separate and their
 * backward is one fused kernel (dlogits from probs), every backward adds
 * (+=) into its gradients, logits and probs are padded to Vp.
 *
 * The reference is the one-activation-block step in the manner of llm.c's
 * gpt2_forward and gpt2_backward (every buffer allocated and zeroed up
 * front, the backward in gpt2_backward's order). The baseline plan and
 * every planned budget (100, 60, 40 % and the floor, several algorithms)
 * must give its loss and parameter gradients bit for bit in both of the
 * host's memory modes: malloc, with the counted activation peak equal to
 * the predicted one; arena, with the arena's peak equal to it and the
 * region the exec allocated (the plan's arena) within the budget. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>

#include "test.h"

/* ---------------------------------------------------------------------------
 * Stand-in kernels with llm.c's semantics. N = B*T rows.
 * ------------------------------------------------------------------------- */

static void encoder_forward(float *out, int *inp, float *wte, float *wpe, int B, int T, int C)
{
    for (int n = 0; n < B * T; n++)
        for (int i = 0; i < C; i++) out[n * C + i] = wte[inp[n] * C + i] + wpe[(n % T) * C + i];
}

static void encoder_backward(float *dwte, float *dwpe, float *dout, int *inp, int B, int T, int C)
{
    for (int n = 0; n < B * T; n++)
        for (int i = 0; i < C; i++) {
            dwte[inp[n] * C + i] += dout[n * C + i];
            dwpe[(n % T) * C + i] += dout[n * C + i];
        }
}

/* Writes mean and rstd on every call. */
static void layernorm_forward(float *out, float *mean, float *rstd, float *inp, float *weight, float *bias, int B,
                              int T, int C)
{
    for (int n = 0; n < B * T; n++) {
        const float *x = inp + n * C;
        float m = 0.0f, var = 0.0f;
        for (int i = 0; i < C; i++) m += x[i];
        m /= (float)C;
        for (int i = 0; i < C; i++) var += (x[i] - m) * (x[i] - m);
        var /= (float)C;
        float s = 1.0f / sqrtf(var + 1e-5f);
        for (int i = 0; i < C; i++) out[n * C + i] = (x[i] - m) * s * weight[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

static void layernorm_backward(float *dinp, float *dweight, float *dbias, float *dout, float *inp, float *weight,
                               float *mean, float *rstd, int B, int T, int C)
{
    for (int n = 0; n < B * T; n++) {
        const float *x = inp + n * C, *d = dout + n * C;
        float sum_dn = 0.0f, sum_dn_norm = 0.0f;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - mean[n]) * rstd[n];
            sum_dn += weight[i] * d[i];
            sum_dn_norm += weight[i] * d[i] * norm;
        }
        sum_dn /= (float)C;
        sum_dn_norm /= (float)C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - mean[n]) * rstd[n];
            dbias[i] += d[i];
            dweight[i] += norm * d[i];
            dinp[n * C + i] += (weight[i] * d[i] - sum_dn - norm * sum_dn_norm) * rstd[n];
        }
    }
}

static void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int B, int T, int C,
                           int OC)
{
    for (int n = 0; n < B * T; n++)
        for (int o = 0; o < OC; o++) {
            float acc = bias ? bias[o] : 0.0f;
            for (int i = 0; i < C; i++) acc += inp[n * C + i] * weight[o * C + i];
            out[n * OC + o] = acc;
        }
}

static void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int B, int T, int C, int OC)
{
    for (int n = 0; n < B * T; n++)
        for (int o = 0; o < OC; o++)
            for (int i = 0; i < C; i++) dinp[n * C + i] += weight[o * C + i] * dout[n * OC + o];
    for (int o = 0; o < OC; o++)
        for (int n = 0; n < B * T; n++) {
            if (dbias) dbias[o] += dout[n * OC + o];
            for (int i = 0; i < C; i++) dweight[o * C + i] += inp[n * C + i] * dout[n * OC + o];
        }
}

/* inp (B,T,3C) = q,k,v; preatt and att (B,NH,T,T), both written. */
static void attention_forward(float *out, float *preatt, float *att, float *inp, int B, int T, int C, int NH)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *q = inp + (b * T + t) * 3 * C + h * hs;
                float *pre = preatt + ((b * NH + h) * T + t) * T, *a = att + ((b * NH + h) * T + t) * T;
                float *o = out + (b * T + t) * C + h * hs;
                float maxv = -10000.0f, sum = 0.0f;
                for (int u = 0; u <= t; u++) {
                    const float *k = inp + (b * T + u) * 3 * C + C + h * hs;
                    float dot = 0.0f;
                    for (int i = 0; i < hs; i++) dot += q[i] * k[i];
                    pre[u] = dot * scale;
                    if (pre[u] > maxv) maxv = pre[u];
                }
                for (int u = 0; u <= t; u++) sum += (a[u] = expf(pre[u] - maxv));
                for (int u = 0; u < T; u++) a[u] = u <= t ? a[u] * (1.0f / sum) : 0.0f;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                for (int u = 0; u <= t; u++)
                    for (int i = 0; i < hs; i++) o[i] += a[u] * inp[(b * T + u) * 3 * C + 2 * C + h * hs + i];
            }
}

/* Adds into dinp, dpreatt and datt. */
static void attention_backward(float *dinp, float *dpreatt, float *datt, float *dout, float *inp, float *att, int B,
                               int T, int C, int NH)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *a = att + ((b * NH + h) * T + t) * T, *d = dout + (b * T + t) * C + h * hs;
                float *da = datt + ((b * NH + h) * T + t) * T, *dp = dpreatt + ((b * NH + h) * T + t) * T;
                int qi = (b * T + t) * 3 * C + h * hs;
                for (int u = 0; u <= t; u++) {
                    int vi = (b * T + u) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        da[u] += inp[vi + i] * d[i];
                        dinp[vi + i] += a[u] * d[i];
                    }
                }
                for (int u = 0; u <= t; u++)
                    for (int w = 0; w <= t; w++) dp[w] += a[u] * ((u == w ? 1.0f : 0.0f) - a[w]) * da[u];
                for (int u = 0; u <= t; u++) {
                    int ki = (b * T + u) * 3 * C + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dinp[qi + i] += inp[ki + i] * dp[u] * scale;
                        dinp[ki + i] += inp[qi + i] * dp[u] * scale;
                    }
                }
            }
}

static void residual_forward(float *out, float *inp1, float *inp2, int N)
{
    for (int i = 0; i < N; i++) out[i] = inp1[i] + inp2[i];
}

static void residual_backward(float *dinp1, float *dinp2, float *dout, int N)
{
    for (int i = 0; i < N; i++) {
        dinp1[i] += dout[i];
        dinp2[i] += dout[i];
    }
}

#define GELU_K 0.7978845608f /* sqrt(2/pi) */

static void gelu_forward(float *out, float *inp, int N)
{
    for (int i = 0; i < N; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

static void gelu_backward(float *dinp, float *inp, float *dout, int N)
{
    for (int i = 0; i < N; i++) {
        float x = inp[i], u = GELU_K * (x + 0.044715f * x * x * x), c = coshf(u);
        float g = 0.5f * (1.0f + tanhf(u)) + x * 0.5f * (1.0f / (c * c)) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += g * dout[i];
    }
}

/* probs over the first V of Vp columns; the padding is written as zero. */
static void softmax_forward(float *probs, float *logits, int B, int T, int V, int Vp)
{
    for (int n = 0; n < B * T; n++) {
        const float *x = logits + n * Vp;
        float *p = probs + n * Vp, maxv = -10000.0f, sum = 0.0f;
        for (int i = 0; i < V; i++) maxv = x[i] > maxv ? x[i] : maxv;
        for (int i = 0; i < V; i++) sum += (p[i] = expf(x[i] - maxv));
        for (int i = 0; i < V; i++) p[i] /= sum;
        for (int i = V; i < Vp; i++) p[i] = 0.0f;
    }
}

static void crossentropy_forward(float *losses, float *probs, int *targets, int B, int T, int Vp)
{
    for (int n = 0; n < B * T; n++) losses[n] = -logf(probs[n * Vp + targets[n]]);
}

/* Through both: dlogits += (probs - onehot) * dlosses, the padding left alone. */
static void crossentropy_softmax_backward(float *dlogits, float *dlosses, float *probs, int *targets, int B, int T,
                                          int V, int Vp)
{
    for (int n = 0; n < B * T; n++)
        for (int i = 0; i < V; i++)
            dlogits[n * Vp + i] += (probs[n * Vp + i] - (i == targets[n] ? 1.0f : 0.0f)) * dlosses[n];
}

#include "../examples/llmc_host.h"

/* ---------------------------------------------------------------------------
 * Model and the one-block reference step
 * ------------------------------------------------------------------------- */

#define MAX_L 4

static llmc_shape tiny_shape(void)
{
    llmc_shape s;
    s.L = 2, s.C = 32, s.NH = 2, s.V = 60, s.Vp = 64, s.maxT = 16, s.B = 2, s.T = 16;
    return s;
}

typedef struct model {
    llmc_shape s;
    size_t num_params;
    float *params_memory, *grads_memory;
    float *p[LLMC_NUM_PARAMS], *g[LLMC_NUM_PARAMS];
    int *tokens, *targets;
} model;

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float uniform(uint64_t i) { return (float)(mix(i) >> 40) * (1.0f / 16777216.0f); }

static void model_free(model *m)
{
    free(m->params_memory);
    free(m->grads_memory);
    free(m->tokens);
    free(m->targets);
    memset(m, 0, sizeof *m);
}

static int model_init(model *m, llmc_shape s)
{
    size_t sizes[LLMC_NUM_PARAMS], off = 0, BT = (size_t)s.B * (size_t)s.T;
    memset(m, 0, sizeof *m);
    m->s = s;
    llmc_param_sizes(&s, sizes);
    for (int k = 0; k < LLMC_NUM_PARAMS; k++) m->num_params += sizes[k];
    m->params_memory = (float *)malloc(m->num_params * sizeof(float));
    m->grads_memory = (float *)calloc(m->num_params, sizeof(float));
    m->tokens = (int *)malloc(BT * sizeof(int));
    m->targets = (int *)malloc(BT * sizeof(int));
    if (!m->params_memory || !m->grads_memory || !m->tokens || !m->targets) return -1;
    for (int k = 0; k < LLMC_NUM_PARAMS; k++) {
        int ln_weight = k == LLMC_LN1W || k == LLMC_LN2W || k == LLMC_LNFW;
        m->p[k] = m->params_memory + off;
        m->g[k] = m->grads_memory + off;
        for (size_t i = 0; i < sizes[k]; i++) {
            float u = 2.0f * uniform(off + i) - 1.0f;
            m->p[k][i] = ln_weight ? 1.0f + 0.1f * u : 0.05f * u;
        }
        off += sizes[k];
    }
    for (size_t i = 0; i < BT; i++) {
        m->tokens[i] = (int)(mix(1000003 + i) % (uint64_t)s.V);
        m->targets[i] = (int)(mix(2000003 + i) % (uint64_t)s.V);
    }
    return 0;
}

/* Per-layer activations of the one-block step. */
enum { A_LN1, A_LN1_MR, A_QKV, A_ATTY, A_PREATT, A_ATT, A_ATTPROJ, A_RES2, A_LN2, A_LN2_MR, A_FCH, A_FCH_GELU,
       A_FCPROJ, A_RES3, A_PER_LAYER };
enum { H_ENCODED, H_LNF, H_LNF_MR, H_LOGITS, H_PROBS, H_LOSSES, H_COUNT };

typedef struct block {
    float *l[MAX_L][A_PER_LAYER], *h[H_COUNT];
} block;

static size_t layer_size(const llmc_shape *s, int k)
{
    size_t BT = (size_t)s->B * s->T, C = (size_t)s->C, scores = (size_t)s->B * s->NH * s->T * s->T;
    switch (k) {
    case A_LN1_MR: case A_LN2_MR: return 2 * BT;
    case A_QKV: return 3 * BT * C;
    case A_PREATT: case A_ATT: return scores;
    case A_FCH: case A_FCH_GELU: return 4 * BT * C;
    default: return BT * C;
    }
}

static size_t head_size(const llmc_shape *s, int k)
{
    size_t BT = (size_t)s->B * s->T;
    return k == H_ENCODED || k == H_LNF ? BT * s->C : k == H_LNF_MR ? 2 * BT : k == H_LOSSES ? BT : BT * s->Vp;
}

static int block_alloc(block *b, const llmc_shape *s)
{
    int ok = 1;
    memset(b, 0, sizeof *b);
    for (int l = 0; l < s->L; l++)
        for (int k = 0; k < A_PER_LAYER; k++) ok &= (b->l[l][k] = (float *)calloc(layer_size(s, k), 4)) != NULL;
    for (int k = 0; k < H_COUNT; k++) ok &= (b->h[k] = (float *)calloc(head_size(s, k), 4)) != NULL;
    return ok ? 0 : -1;
}

static void block_free(block *b)
{
    for (int l = 0; l < MAX_L; l++)
        for (int k = 0; k < A_PER_LAYER; k++) free(b->l[l][k]);
    for (int k = 0; k < H_COUNT; k++) free(b->h[k]);
}

/* A parameter's layer slice. */
static float *W(model *m, float *const *base, int k, int l) { return llmc__param(base, &m->s, k, l); }

/* The training step with every activation in one zeroed block: forward in
 * gpt2_forward's order, backward in gpt2_backward's. */
static int reference_step(model *m, float *loss)
{
    const llmc_shape *s = &m->s;
    int B = s->B, T = s->T, C = s->C, NH = s->NH, L = s->L, BT = B * T;
    block a, d;
    float **P = m->p, **G = m->g, mean_loss = 0.0f;
    if (L > MAX_L || block_alloc(&a, s) || block_alloc(&d, s)) return -1;
    memset(m->grads_memory, 0, m->num_params * sizeof(float));
    encoder_forward(a.h[H_ENCODED], m->tokens, P[LLMC_WTE], P[LLMC_WPE], B, T, C);
    for (int l = 0; l < L; l++) {
        float **x = a.l[l], *res = l ? a.l[l - 1][A_RES3] : a.h[H_ENCODED];
        layernorm_forward(x[A_LN1], x[A_LN1_MR], x[A_LN1_MR] + BT, res, W(m, P, LLMC_LN1W, l), W(m, P, LLMC_LN1B, l),
                          B, T, C);
        matmul_forward(x[A_QKV], x[A_LN1], W(m, P, LLMC_QKVW, l), W(m, P, LLMC_QKVB, l), B, T, C, 3 * C);
        attention_forward(x[A_ATTY], x[A_PREATT], x[A_ATT], x[A_QKV], B, T, C, NH);
        matmul_forward(x[A_ATTPROJ], x[A_ATTY], W(m, P, LLMC_ATTPROJW, l), W(m, P, LLMC_ATTPROJB, l), B, T, C, C);
        residual_forward(x[A_RES2], res, x[A_ATTPROJ], BT * C);
        layernorm_forward(x[A_LN2], x[A_LN2_MR], x[A_LN2_MR] + BT, x[A_RES2], W(m, P, LLMC_LN2W, l),
                          W(m, P, LLMC_LN2B, l), B, T, C);
        matmul_forward(x[A_FCH], x[A_LN2], W(m, P, LLMC_FCW, l), W(m, P, LLMC_FCB, l), B, T, C, 4 * C);
        gelu_forward(x[A_FCH_GELU], x[A_FCH], BT * 4 * C);
        matmul_forward(x[A_FCPROJ], x[A_FCH_GELU], W(m, P, LLMC_FCPROJW, l), W(m, P, LLMC_FCPROJB, l), B, T, 4 * C, C);
        residual_forward(x[A_RES3], x[A_RES2], x[A_FCPROJ], BT * C);
    }
    layernorm_forward(a.h[H_LNF], a.h[H_LNF_MR], a.h[H_LNF_MR] + BT, a.l[L - 1][A_RES3], P[LLMC_LNFW], P[LLMC_LNFB], B,
                      T, C);
    matmul_forward(a.h[H_LOGITS], a.h[H_LNF], P[LLMC_WTE], NULL, B, T, C, s->Vp);
    softmax_forward(a.h[H_PROBS], a.h[H_LOGITS], B, T, s->V, s->Vp);
    crossentropy_forward(a.h[H_LOSSES], a.h[H_PROBS], m->targets, B, T, s->Vp);
    for (int i = 0; i < BT; i++) mean_loss += a.h[H_LOSSES][i];
    *loss = mean_loss / (float)BT;

    for (int i = 0; i < BT; i++) d.h[H_LOSSES][i] = 1.0f / (float)BT;
    crossentropy_softmax_backward(d.h[H_LOGITS], d.h[H_LOSSES], a.h[H_PROBS], m->targets, B, T, s->V, s->Vp);
    matmul_backward(d.h[H_LNF], G[LLMC_WTE], NULL, d.h[H_LOGITS], a.h[H_LNF], P[LLMC_WTE], B, T, C, s->Vp);
    layernorm_backward(d.l[L - 1][A_RES3], G[LLMC_LNFW], G[LLMC_LNFB], d.h[H_LNF], a.l[L - 1][A_RES3], P[LLMC_LNFW],
                       a.h[H_LNF_MR], a.h[H_LNF_MR] + BT, B, T, C);
    for (int l = L - 1; l >= 0; l--) {
        float **x = a.l[l], **dx = d.l[l];
        float *res = l ? a.l[l - 1][A_RES3] : a.h[H_ENCODED], *dres = l ? d.l[l - 1][A_RES3] : d.h[H_ENCODED];
        residual_backward(dx[A_RES2], dx[A_FCPROJ], dx[A_RES3], BT * C);
        matmul_backward(dx[A_FCH_GELU], W(m, G, LLMC_FCPROJW, l), W(m, G, LLMC_FCPROJB, l), dx[A_FCPROJ],
                        x[A_FCH_GELU], W(m, P, LLMC_FCPROJW, l), B, T, 4 * C, C);
        gelu_backward(dx[A_FCH], x[A_FCH], dx[A_FCH_GELU], BT * 4 * C);
        matmul_backward(dx[A_LN2], W(m, G, LLMC_FCW, l), W(m, G, LLMC_FCB, l), dx[A_FCH], x[A_LN2],
                        W(m, P, LLMC_FCW, l), B, T, C, 4 * C);
        layernorm_backward(dx[A_RES2], W(m, G, LLMC_LN2W, l), W(m, G, LLMC_LN2B, l), dx[A_LN2], x[A_RES2],
                           W(m, P, LLMC_LN2W, l), x[A_LN2_MR], x[A_LN2_MR] + BT, B, T, C);
        residual_backward(dres, dx[A_ATTPROJ], dx[A_RES2], BT * C);
        matmul_backward(dx[A_ATTY], W(m, G, LLMC_ATTPROJW, l), W(m, G, LLMC_ATTPROJB, l), dx[A_ATTPROJ], x[A_ATTY],
                        W(m, P, LLMC_ATTPROJW, l), B, T, C, C);
        attention_backward(dx[A_QKV], dx[A_PREATT], dx[A_ATT], dx[A_ATTY], x[A_QKV], x[A_ATT], B, T, C, NH);
        matmul_backward(dx[A_LN1], W(m, G, LLMC_QKVW, l), W(m, G, LLMC_QKVB, l), dx[A_QKV], x[A_LN1],
                        W(m, P, LLMC_QKVW, l), B, T, C, 3 * C);
        layernorm_backward(dres, W(m, G, LLMC_LN1W, l), W(m, G, LLMC_LN1B, l), dx[A_LN1], res, W(m, P, LLMC_LN1W, l),
                           x[A_LN1_MR], x[A_LN1_MR] + BT, B, T, C);
    }
    encoder_backward(G[LLMC_WTE], G[LLMC_WPE], d.h[H_ENCODED], m->tokens, B, T, C);
    block_free(&a);
    block_free(&d);
    return 0;
}

/* ---------------------------------------------------------------------------
 * Fixture: model, reference, graph, host
 * ------------------------------------------------------------------------- */

typedef struct fixture {
    rkm_context *ctx;
    model m;
    float *ref_grads, ref_loss;
    llmc_graph gg;
    llmc_step st;  /* malloc mode */
    llmc_step sta; /* arena mode, same graph and model */
    int64_t scratch_ws_calls; /* forwards whose workspace held the scratch (no saved state live) */
} fixture;

static void fixture_free(fixture *f)
{
    if (f->st.gg) llmc_step_free(&f->st);
    if (f->sta.gg) llmc_step_free(&f->sta);
    if (f->gg.g) llmc_graph_free(&f->gg);
    model_free(&f->m);
    free(f->ref_grads);
    rkm_context_destroy(f->ctx);
}

static int fixture_init(fixture *f, llmc_shape s)
{
    memset(f, 0, sizeof *f);
    if (rkm_context_create(NULL, &f->ctx) != RKM_OK || model_init(&f->m, s) || reference_step(&f->m, &f->ref_loss))
        return -1;
    if (!(f->ref_grads = (float *)malloc(f->m.num_params * sizeof(float)))) return -1;
    memcpy(f->ref_grads, f->m.grads_memory, f->m.num_params * sizeof(float));
    if (llmc_graph_build(f->ctx, &s, &f->gg) != RKM_OK) {
        fprintf(stderr, "graph: %s\n", rkm_context_errmsg(f->ctx));
        return -1;
    }
    if (llmc_step_init(&f->st, &f->gg, f->m.p, f->m.g, f->m.tokens, f->m.targets)) return -1;
    return llmc_step_init_arena(&f->sta, &f->gg, f->m.p, f->m.g, f->m.tokens, f->m.targets);
}

/* The host's forward, counting the runs that kept their scratch in the workspace. */
static int counting_forward(void *user, const rkm_fwd_call *c)
{
    fixture *f = (fixture *)user;
    const llmc_opdef *d = &f->gg.ops[c->op];
    if (d->scratch && c->ws_bytes == d->fwd_ws + d->scratch) f->scratch_ws_calls++;
    return llmc_cb_forward(&f->st, c);
}

static int cb_backward(void *user, const rkm_bwd_call *c) { return llmc_cb_backward(&((fixture *)user)->st, c); }
static int cb_loss(void *user, const rkm_buffer_call *c) { return llmc_cb_loss(&((fixture *)user)->st, c); }
static int cb_free(void *user, const rkm_buffer_call *c) { return llmc_cb_free_tensor(&((fixture *)user)->st, c); }
static int cb_free_saved(void *user, const rkm_buffer_call *c) { return llmc_cb_free_saved(&((fixture *)user)->st, c); }
static int cb_free_grad(void *user, const rkm_buffer_call *c) { return llmc_cb_free_grad(&((fixture *)user)->st, c); }

/* One step under `plan` as llmc_step_run does it, through the counting
 * forward. 1 when loss and gradients are the reference's bit for bit and
 * the counted peak is the predicted one. */
static int run_and_compare(fixture *f, const rkm_plan *plan, const char *what)
{
    rkm_callbacks cb = {.user = f, .forward = counting_forward, .backward = cb_backward, .loss = cb_loss,
                        .free_tensor = cb_free, .free_saved = cb_free_saved, .free_grad = cb_free_grad};
    rkm_plan_stats ps;
    rkm_result r;
    int same;
    memset(f->m.grads_memory, 0, f->m.num_params * sizeof(float));
    f->st.mem.peak = f->st.mem.cur;
    f->st.mean_loss = -1.0f;
    f->st.err[0] = 0;
    r = rkm_plan_execute(plan, &cb);
    rkm_plan_stats_get(plan, &ps);
    if (r != RKM_OK) {
        fprintf(stderr, "%s: step failed: %s; %s\n", what, f->st.err, rkm_context_errmsg(f->ctx));
        llmc_step_release(&f->st);
        return 0;
    }
    same = !memcmp(&f->st.mean_loss, &f->ref_loss, sizeof(float)) &&
           !memcmp(f->m.grads_memory, f->ref_grads, f->m.num_params * sizeof(float));
    if (!same) fprintf(stderr, "%s: loss or gradients differ from the reference\n", what);
    if (ps.peak != f->st.mem.peak)
        fprintf(stderr, "%s: measured peak %llu, predicted %llu\n", what, (unsigned long long)f->st.mem.peak,
                (unsigned long long)ps.peak);
    if (f->st.mem.blocks != 2) fprintf(stderr, "%s: %lld buffers left\n", what, (long long)f->st.mem.blocks - 2);
    return same && ps.peak == f->st.mem.peak && f->st.mem.blocks == 2;
}

static int same_as_reference(const fixture *f, float loss)
{
    return !memcmp(&loss, &f->ref_loss, sizeof(float)) &&
           !memcmp(f->m.grads_memory, f->ref_grads, f->m.num_params * sizeof(float));
}

/* The inputs' bytes: all an exec holds between steps. */
static uint64_t input_bytes(const fixture *f)
{
    return llmc__tbytes(&f->sta, f->gg.tokens) + llmc__tbytes(&f->sta, f->gg.targets);
}

/* One step of `plan` in arena mode (an exec of its own, made and destroyed
 * here): the reference's loss and gradients bit for bit, the arena's peak
 * the plan's, the region the plan's arena and within `budget` (0: none, for
 * the baseline, whose arena is its buffers each rounded up to 256 bytes,
 * over its peak), nothing left live, nothing through llmc_mem. */
static void check_arena_step(fixture *f, const rkm_plan *plan, uint64_t budget, const char *what)
{
    rkm_arena_exec *x = NULL;
    rkm_plan_stats ps;
    rkm_arena_stats as;
    CHECK(rkm_plan_stats_get(plan, &ps) == RKM_OK);
    CHECK(llmc_step_open(&f->sta, plan, &x) == RKM_OK);
    if (!x) return;
    CHECK(rkm_arena_exec_mode(x) == RKM_ARENA_LAYOUT);
    CHECK(llmc_step_run_arena(&f->sta, x, plan, f->m.num_params) == RKM_OK);
    CHECK(rkm_arena_exec_stats_get(x, &as) == RKM_OK);
    CHECK(same_as_reference(f, f->sta.mean_loss));
    CHECK_EQ_U64(as.peak, ps.peak);
    CHECK_EQ_U64(f->sta.peak, ps.peak);
    CHECK_EQ_U64(as.capacity, ps.arena_bytes);
    if (budget) CHECK(as.capacity <= budget);
    CHECK(llmc_step_leaks(&f->sta) == 0);
    CHECK_EQ_U64(as.current, input_bytes(f));
    CHECK(f->sta.mem.peak == 0 && f->sta.mem.blocks == 0);
    if (test_current_failed) fprintf(stderr, "  %s, arena: %s %s\n", what, f->sta.err, rkm_context_errmsg(f->ctx));
    rkm_arena_exec_destroy(x);
}

/* ---------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------- */

/* The graph declares what llm.c's kernels read and write. */
TEST(graph_declares_llmc_kernels)
{
    fixture f;
    llmc_shape s = tiny_shape();
    uint64_t BT = (uint64_t)s.B * s.T, scores = (uint64_t)s.B * s.NH * s.T * s.T * 4;
    char why[256];
    CHECK(fixture_init(&f, s) == 0);
    if (!test_current_failed) {
        CHECK(rkm_graph_num_ops(f.gg.g) == 10 * s.L + 4);
        CHECK(rkm_graph_num_tensors(f.gg.g) == 10 * s.L + 7);
        for (int32_t op = 0; op < f.gg.n_ops; op++) {
            rkm_op_desc d;
            const llmc_opdef *o = &f.gg.ops[op];
            CHECK(rkm_graph_op_info(f.gg.g, op, &d) == RKM_OK);
            if (o->kind == LLMC_LAYERNORM) {
                CHECK(d.phantom == 2 * BT * 4 && d.scratch == d.phantom && d.fwd_ws == 0 && d.bwd_ws == 0);
                CHECK(d.n_saved == 1 && d.saved[0] == d.in[0]);
            } else if (o->kind == LLMC_ATTENTION) {
                CHECK(d.phantom == scores && d.scratch == scores && d.fwd_ws == scores && d.bwd_ws == 2 * scores);
            } else {
                CHECK(d.phantom == 0 && d.scratch == 0 && d.fwd_ws == 0 && d.bwd_ws == 0);
            }
            if (o->kind == LLMC_RESIDUAL) CHECK(d.n_saved == 0 && d.n_in == 2);
        }
        rkm_tensor_info probs, losses, res;
        CHECK(rkm_graph_tensor_info(f.gg.g, f.gg.probs, &probs) == RKM_OK && !probs.has_grad);
        CHECK(probs.bytes == BT * (uint64_t)s.Vp * 4);
        CHECK(rkm_graph_tensor_info(f.gg.g, f.gg.losses, &losses) == RKM_OK && rkm_graph_loss(f.gg.g) == f.gg.losses);
        /* the residual stream's gradients: two contributors each (residual, layernorm) */
        CHECK(rkm_graph_tensor_info(f.gg.g, rkm_graph_find_tensor(f.gg.g, "h0.residual2"), &res) == RKM_OK);
        CHECK(res.n_contributors == 2);
        CHECK(rkm_graph_tensor_info(f.gg.g, rkm_graph_find_tensor(f.gg.g, "encoded"), &res) == RKM_OK);
        CHECK(res.n_contributors == 2);
        CHECK(llmc_graph_order_forced(&f.gg, why, sizeof why));
        if (why[0]) fprintf(stderr, "%s\n", why);
    }
    fixture_free(&f);
}

/* The baseline plan, one callback per kernel, is the one-block step bit
 * for bit: the graph wires every kernel as gpt2_forward/backward do. */
TEST(baseline_is_the_one_block_step)
{
    fixture f;
    rkm_plan *base = NULL;
    CHECK(fixture_init(&f, tiny_shape()) == 0);
    CHECK(!test_current_failed && rkm_plan_baseline(f.gg.g, &base) == RKM_OK);
    if (!test_current_failed) {
        CHECK(run_and_compare(&f, base, "baseline"));
        CHECK(isfinite(f.ref_loss) && f.ref_loss > 0.0f);
        /* and llmc_step_run, the example's path, agrees */
        CHECK(llmc_step_run(&f.st, base, f.m.num_params) == RKM_OK);
        CHECK(!memcmp(f.m.grads_memory, f.ref_grads, f.m.num_params * sizeof(float)));
        CHECK_EQ_U64(f.st.peak, f.st.mem.peak);
        check_arena_step(&f, base, 0, "baseline");
    }
    rkm_plan_destroy(base);
    fixture_free(&f);
}

/* Every algorithm at 100, 60, 40 % and its floor, in both modes: the
 * reference's loss and gradients bit for bit, measured peak = predicted,
 * within the budget (the arena too: check_arena_step); the floor
 * recomputes, and runs layernorm/attention forwards without saved state,
 * their mean/rstd/att in the workspace. Rotor once more at alignment 4: the
 * exec lays out at the plan's alignment, not 256. */
TEST(plans_are_bit_identical)
{
    static const struct {
        rkm_algo algo;
        uint64_t alignment;
    } algos[] = {{RKM_ALGO_DEFAULT, 0}, {RKM_ALGO_ROTOR, 0}, {RKM_ALGO_DTR, 0}, {RKM_ALGO_ROTOR, 4}};
    static const double fractions[] = {1.0, 0.6, 0.4};
    static const char *labels[] = {"100%", "60%", "40%", "floor"};
    fixture f;
    rkm_graph_stats gs;
    CHECK(fixture_init(&f, tiny_shape()) == 0);
    if (test_current_failed) {
        fixture_free(&f);
        return;
    }
    rkm_graph_stats_get(f.gg.g, &gs);
    for (size_t a = 0; a < N_OF(algos); a++) {
        rkm_solve_desc sd;
        rkm_planner *pl = NULL;
        memset(&sd, 0, sizeof sd);
        sd.algo = algos[a].algo;
        sd.alignment = algos[a].alignment;
        CHECK(rkm_planner_create(f.gg.g, &sd, &pl) == RKM_OK);
        for (int i = 0; i < 4 && pl; i++) {
            uint64_t budget = 0;
            rkm_plan *plan = NULL;
            rkm_plan_stats ps;
            char what[64];
            rkm_result r;
            if (i < 3) budget = (uint64_t)((double)gs.baseline_peak * fractions[i]);
            else CHECK(rkm_planner_min_budget(pl, &budget) == RKM_OK);
            r = rkm_planner_solve(pl, budget, &plan);
            if (r == RKM_ERROR_BUDGET && i < 3 && algos[a].algo != RKM_ALGO_DEFAULT) continue;
            CHECK(r == RKM_OK);
            if (r != RKM_OK) continue;
            snprintf(what, sizeof what, "%s at %s, alignment %llu", rkm_algo_name(algos[a].algo), labels[i],
                     (unsigned long long)algos[a].alignment);
            rkm_plan_stats_get(plan, &ps);
            CHECK(ps.peak <= budget && ps.arena_bytes <= budget);
            CHECK_EQ_U64(ps.alignment, algos[a].alignment ? algos[a].alignment : RKM_ARENA_ALIGN);
            f.scratch_ws_calls = 0;
            CHECK(run_and_compare(&f, plan, what));
            if (i == 3) {
                CHECK(ps.recomputes > 0);
                CHECK(f.scratch_ws_calls > 0);
            }
            check_arena_step(&f, plan, budget, what);
            rkm_plan_destroy(plan);
        }
        rkm_planner_destroy(pl);
    }
    fixture_free(&f);
}

/* Some parameter gradient is a NaN: the poison (all bits set) shows. */
static int poison_shows(const fixture *f)
{
    for (size_t i = 0; i < f->m.num_params; i++)
        if (isnan(f->m.grads_memory[i])) return 1;
    return 0;
}

/* Arena mode poisons and zeroes as malloc mode does: unzeroed, the poison
 * of new gradients shows (the region's old bytes would not); zeroed, the
 * same exec gives the reference's gradients. */
static void check_unzeroed_arena(fixture *f, const rkm_plan *plan)
{
    rkm_arena_exec *x = NULL;
    CHECK(llmc_step_open(&f->sta, plan, &x) == RKM_OK);
    f->sta.skip_zeroing = 1;
    CHECK(llmc_step_run_arena(&f->sta, x, plan, f->m.num_params) == RKM_OK);
    CHECK(poison_shows(f));
    f->sta.skip_zeroing = 0;
    CHECK(llmc_step_run_arena(&f->sta, x, plan, f->m.num_params) == RKM_OK);
    CHECK(same_as_reference(f, f->sta.mean_loss));
    rkm_arena_exec_destroy(x);
}

/* The zeroing is needed: a host that leaves new gradients and the backward
 * workspace as allocated (poisoned) gets NaNs, so the checks above would
 * catch a host that forgot it; in both modes. */
TEST(unzeroed_gradients_are_caught)
{
    fixture f;
    rkm_plan *base = NULL;
    CHECK(fixture_init(&f, tiny_shape()) == 0);
    CHECK(!test_current_failed && rkm_plan_baseline(f.gg.g, &base) == RKM_OK);
    if (!test_current_failed) {
        f.st.skip_zeroing = 1;
        CHECK(llmc_step_run(&f.st, base, f.m.num_params) == RKM_OK);
        CHECK(poison_shows(&f));
        f.st.skip_zeroing = 0;
        CHECK(llmc_step_run(&f.st, base, f.m.num_params) == RKM_OK);
        CHECK(!memcmp(f.m.grads_memory, f.ref_grads, f.m.num_params * sizeof(float)));
        check_unzeroed_arena(&f, base);
    }
    rkm_plan_destroy(base);
    fixture_free(&f);
}

/* After a failed arena step nothing is left live, the exec holds only its
 * inputs, and its own plan still runs bit for bit. */
static void check_clean_after_failure(fixture *f, rkm_arena_exec *x, const rkm_plan *plan)
{
    rkm_arena_stats as;
    CHECK(rkm_arena_exec_stats_get(x, &as) == RKM_OK);
    CHECK_EQ_U64(as.current, input_bytes(f));
    CHECK(llmc_step_leaks(&f->sta) == 0);
    CHECK(llmc_step_run_arena(&f->sta, x, plan, f->m.num_params) == RKM_OK);
    CHECK(same_as_reference(f, f->sta.mean_loss));
}

/* An exec runs the plan it was laid out for: given another, the step fails
 * with RKM_ERROR_STATE and a message, midway, where the plans part. */
static void check_wrong_plan(fixture *f, rkm_arena_exec *x, const rkm_plan *wrong, const rkm_plan *right)
{
    CHECK(llmc_step_run_arena(&f->sta, x, wrong, f->m.num_params) == RKM_ERROR_STATE);
    CHECK(strstr(rkm_context_errmsg(f->ctx), "layout") != NULL);
    check_clean_after_failure(f, x, right);
}

/* A callback that fails (here: a stale pointer the host forgot, so that the
 * softmax's new output looks live) stops the step with RKM_ERROR_CALLBACK
 * and the host's reason. */
static void check_failed_callback(fixture *f, rkm_arena_exec *x, const rkm_plan *plan)
{
    f->sta.act[f->gg.probs] = f->sta.batch[0];
    CHECK(llmc_step_run_arena(&f->sta, x, plan, f->m.num_params) == RKM_ERROR_CALLBACK);
    CHECK(strstr(f->sta.err, "new output already live") != NULL);
    check_clean_after_failure(f, x, plan);
}

/* Each mode refuses the other's calls, and a step without an exec. */
static void check_wrong_mode(fixture *f, rkm_arena_exec *x, const rkm_plan *plan)
{
    rkm_arena_exec *none = NULL;
    CHECK(llmc_step_run(&f->sta, plan, f->m.num_params) == RKM_ERROR_STATE);
    CHECK(llmc_step_run_arena(&f->st, x, plan, f->m.num_params) == RKM_ERROR_STATE);
    CHECK(llmc_step_open(&f->st, plan, &none) == RKM_ERROR_STATE && !none);
    CHECK(llmc_step_run_arena(&f->sta, NULL, plan, f->m.num_params) == RKM_ERROR_STATE);
    CHECK(f->st.mem.blocks == 2 && f->sta.mem.blocks == 0);
    check_clean_after_failure(f, x, plan);
}

/* Arena mode fails cleanly: an exec given another plan than its own (both
 * ways between the baseline and the floor plan), a failing callback, a
 * call of the wrong mode. */
TEST(arena_failures_are_clean)
{
    fixture f;
    rkm_plan *base = NULL, *floor_plan = NULL;
    rkm_planner *pl = NULL;
    rkm_solve_desc sd;
    rkm_arena_exec *xb = NULL, *xf = NULL;
    uint64_t budget = 0;
    memset(&sd, 0, sizeof sd);
    sd.algo = RKM_ALGO_ROTOR; /* any plan that recomputes; rotor's is quick */
    CHECK(fixture_init(&f, tiny_shape()) == 0);
    CHECK(!test_current_failed && rkm_plan_baseline(f.gg.g, &base) == RKM_OK);
    CHECK(!test_current_failed && rkm_planner_create(f.gg.g, &sd, &pl) == RKM_OK);
    CHECK(!test_current_failed && rkm_planner_min_budget(pl, &budget) == RKM_OK);
    CHECK(!test_current_failed && rkm_planner_solve(pl, budget, &floor_plan) == RKM_OK);
    CHECK(!test_current_failed && llmc_step_open(&f.sta, base, &xb) == RKM_OK);
    CHECK(!test_current_failed && llmc_step_open(&f.sta, floor_plan, &xf) == RKM_OK);
    if (!test_current_failed) {
        check_wrong_plan(&f, xb, floor_plan, base);
        check_wrong_plan(&f, xf, base, floor_plan);
        check_failed_callback(&f, xf, floor_plan);
        check_wrong_mode(&f, xb, base);
    }
    rkm_arena_exec_destroy(xb);
    rkm_arena_exec_destroy(xf);
    rkm_plan_destroy(floor_plan);
    rkm_plan_destroy(base);
    rkm_planner_destroy(pl);
    fixture_free(&f);
}

/* llmc_graph_order_forced refuses a graph where two sibling ops add into
 * one gradient: a plan may run their backwards in either order. */
TEST(order_check_catches_siblings)
{
    rkm_context *ctx = NULL;
    llmc_graph gg;
    int32_t x, h, u, v, y;
    char why[256] = "";
    memset(&gg, 0, sizeof gg);
    gg.shape = tiny_shape();
    CHECK(rkm_context_create(NULL, &ctx) == RKM_OK && rkm_graph_create(ctx, &gg.g) == RKM_OK);
    gg.ops = (llmc_opdef *)calloc(4, sizeof *gg.ops);
    if (!test_current_failed && gg.ops) {
        const int32_t *ins[4] = {&x, &h, &h, NULL};
        int32_t two[2], *outs[4] = {&h, &u, &v, &y};
        const char *names[4] = {"a", "b", "c", "d"}, *tnames[4] = {"h", "u", "v", "y"};
        CHECK(rkm_graph_add_tensor(gg.g, "x", 16, RKM_TENSOR_INPUT, &x) == RKM_OK);
        for (int i = 0; i < 4; i++) {
            rkm_op_desc d;
            int32_t id;
            memset(&d, 0, sizeof d);
            CHECK(rkm_graph_add_tensor(gg.g, tnames[i], 16, 0, outs[i]) == RKM_OK);
            two[0] = u, two[1] = v;
            d.name = names[i];
            d.in = ins[i] ? ins[i] : two;
            d.n_in = ins[i] ? 1 : 2;
            d.out = outs[i];
            d.n_out = 1;
            CHECK(rkm_graph_add_op(gg.g, &d, &id) == RKM_OK);
            gg.ops[id].kind = LLMC_MATMUL;
            gg.ops[id].weight = gg.ops[id].bias = -1;
            gg.ops[id].n_in = d.n_in;
            gg.ops[id].in[0] = d.in[0];
            gg.ops[id].in[1] = d.n_in > 1 ? d.in[1] : -1;
            gg.ops[id].out[0] = *outs[i];
            gg.ops[id].n_out = 1;
            gg.n_ops = id + 1;
        }
        CHECK(rkm_graph_set_loss(gg.g, y) == RKM_OK && rkm_graph_finalize(gg.g) == RKM_OK);
        CHECK(!llmc_graph_order_forced(&gg, why, sizeof why));
        CHECK(strstr(why, "ops b and c") != NULL);
    }
    llmc_graph_free(&gg);
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(graph_declares_llmc_kernels);
    RUN(baseline_is_the_one_block_step);
    RUN(plans_are_bit_identical);
    RUN(unzeroed_gradients_are_caught);
    RUN(arena_failures_are_clean);
    RUN(order_check_catches_siblings);
    TEST_END();
}
