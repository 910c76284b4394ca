/* gpt2_model.h -- GPT-2 in fp32 on the CPU, run through rockmate: the
 * kernels (forward and backward of every op, in the spirit of llm.c's
 * train_gpt2.c), the parameters and AdamW, a counting allocator, and the
 * rockmate callbacks that find or make every activation buffer.
 *
 * Memory: every activation, activation gradient, phantom and workspace
 * lives either in one arena per plan (arena mode: the plan's layout, one
 * allocation made before training, rkm_arena_exec_run places each buffer) or
 * is allocated and freed in the callbacks through gpt2_mem (malloc mode).
 * Both count bytes exactly as rockmate's contract does, so either peak is
 * comparable to the simulator's. Inputs (tokens, targets) are part of it.
 * Parameters, their gradients and the AdamW state are plain malloc, outside
 * the budget.
 *
 * Determinism: kernels are single-threaded with a fixed summation order, and
 * dropout masks come from a counter-based generator keyed by (seed, step key,
 * op, element), so a recomputed forward reproduces its output bit for bit.
 * Build with -ffp-contract=off so the compiler fuses no multiply-add. */
#ifndef GPT2_MODEL_H
#define GPT2_MODEL_H

#include <math.h>

#include "copier.h"
#include "gpt2_graph.h"

/* The model is C11; the CUDA trainer includes it from C++ as its reference. */
#ifdef __cplusplus
#define GPT2_RESTRICT __restrict__
#else
#define GPT2_RESTRICT restrict
#endif

/* ---------------------------------------------------------------------------
 * Counting allocator
 * ------------------------------------------------------------------------- */

typedef struct gpt2_mem {
    uint64_t cur, peak; /* bytes live now, most bytes live at once */
    int64_t blocks;     /* buffers live now */
} gpt2_mem;

static inline void *gpt2_mem_alloc(gpt2_mem *m, uint64_t bytes, int zero)
{
    void *p = zero ? calloc(1, (size_t)bytes) : malloc((size_t)bytes);
    if (!p) return NULL;
    m->cur += bytes;
    m->blocks++;
    if (m->cur > m->peak) m->peak = m->cur;
    return p;
}

static inline void gpt2_mem_free(gpt2_mem *m, void *p, uint64_t bytes)
{
    if (!p) return;
    free(p);
    m->cur -= bytes;
    m->blocks--;
}

/* ---------------------------------------------------------------------------
 * Random numbers: a counter-based generator (splitmix64's finalizer)
 * ------------------------------------------------------------------------- */

static inline uint64_t gpt2_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The key of one op's draws in one training step. */
static inline uint64_t gpt2_key(uint64_t seed, uint64_t step, uint64_t op)
{
    return gpt2_mix(gpt2_mix(seed) ^ gpt2_mix(step * 0x100000001b3ull + op));
}

/* Uniform in [0, 1) with 24 bits, the i-th draw under `key`. */
static inline float gpt2_uniform(uint64_t key, uint64_t i)
{
    return (float)(gpt2_mix(key ^ gpt2_mix(i)) >> 40) * (1.0f / 16777216.0f);
}

/* ---------------------------------------------------------------------------
 * Kernels. N is the number of rows (B*T); a NULL input gradient is skipped.
 * Backwards accumulate (+=) into every gradient, as in llm.c.
 * ------------------------------------------------------------------------- */

static inline void encoder_forward(float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tok[b * T + t] * C, *p = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
        }
}

static inline void encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            float *de = dwte + (size_t)tok[b * T + t] * C, *dp = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                de[i] += d[i];
                dp[i] += d[i];
            }
        }
}

/* mean and rstd may be NULL (forward without save). */
static inline void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *bias, int N, int C)
{
    for (int r = 0; r < N; r++) {
        const float *x = inp + (size_t)r * C;
        float *o = out + (size_t)r * C;
        float m = 0.0f, v = 0.0f;
        for (int i = 0; i < C; i++) m += x[i];
        m /= (float)C;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        for (int i = 0; i < C; i++) o[i] = (s * (x[i] - m)) * w[i] + bias[i];
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = s;
    }
}

static inline void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int N, int C)
{
    for (int r = 0; r < N; r++) {
        const float *d = dout + (size_t)r * C, *x = inp + (size_t)r * C;
        float m = mean[r], s = rstd[r], dmean = 0.0f, dnormmean = 0.0f;
        for (int i = 0; i < C; i++) {
            float dn = w[i] * d[i];
            dmean += dn;
            dnormmean += dn * ((x[i] - m) * s);
        }
        dmean /= (float)C;
        dnormmean /= (float)C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dn = w[i] * d[i];
            db[i] += d[i];
            dw[i] += norm * d[i];
            if (dinp) dinp[(size_t)r * C + i] += ((dn - dmean) - norm * dnormmean) * s;
        }
    }
}

/* out (N,OC) = inp (N,C) @ w(OC,C)^T + bias. Each output is one sum over i
 * in order (the same bits as the plain loop), but eight rows go together so
 * the compiler can run the eight sums side by side: their inputs are first
 * copied, 64 columns at a time, into a small interleaved stack buffer, and the
 * partial sums wait in `out` between column chunks. Leftover rows (N % 8)
 * take the plain loop. */
#define GPT2_MM_ROWS 8
#define GPT2_MM_COLS 64

static inline void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                                  int OC)
{
    float xt[GPT2_MM_COLS * GPT2_MM_ROWS];
    int r0 = 0;
    for (; r0 + GPT2_MM_ROWS <= N; r0 += GPT2_MM_ROWS)
        for (int i0 = 0; i0 < C; i0 += GPT2_MM_COLS) {
            int ni = C - i0 < GPT2_MM_COLS ? C - i0 : GPT2_MM_COLS;
            for (int i = 0; i < ni; i++)
                for (int k = 0; k < GPT2_MM_ROWS; k++) xt[i * GPT2_MM_ROWS + k] = inp[(size_t)(r0 + k) * C + i0 + i];
            for (int o = 0; o < OC; o++) {
                const float *wr = w + (size_t)o * C + i0;
                float acc[GPT2_MM_ROWS];
                for (int k = 0; k < GPT2_MM_ROWS; k++)
                    acc[k] = i0 ? out[(size_t)(r0 + k) * OC + o] : bias ? bias[o] : 0.0f;
                for (int i = 0; i < ni; i++)
                    for (int k = 0; k < GPT2_MM_ROWS; k++) acc[k] += xt[i * GPT2_MM_ROWS + k] * wr[i];
                for (int k = 0; k < GPT2_MM_ROWS; k++) out[(size_t)(r0 + k) * OC + o] = acc[k];
            }
        }
    for (; r0 < N; r0++)
        for (int o = 0; o < OC; o++) {
            const float *x = inp + (size_t)r0 * C, *wr = w + (size_t)o * C;
            float acc = bias ? bias[o] : 0.0f;
            for (int i = 0; i < C; i++) acc += x[i] * wr[i];
            out[(size_t)r0 * OC + o] = acc;
        }
}

/* a[i] += b[i] * d: independent lanes, so it vectorizes without reordering
 * any sum (restrict: gradients never alias the values they are made from). */
static inline void gpt2_axpy(float *GPT2_RESTRICT a, const float *GPT2_RESTRICT b, float d, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) /* a fixed-length body the compiler vectorizes at -O2 */
        for (int k = 0; k < 8; k++) a[i + k] += b[i + k] * d;
    for (; i < n; i++) a[i] += b[i] * d;
}

static inline void matmul_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                   const float *w, int N, int C, int OC)
{
    for (int r = 0; r < N && dinp; r++)
        for (int o = 0; o < OC; o++) gpt2_axpy(dinp + (size_t)r * C, w + (size_t)o * C, dout[(size_t)r * OC + o], C);
    for (int o = 0; o < OC; o++)
        for (int r = 0; r < N; r++) {
            if (db) db[o] += dout[(size_t)r * OC + o];
            gpt2_axpy(dw + (size_t)o * C, inp + (size_t)r * C, dout[(size_t)r * OC + o], C);
        }
}

/* inp (B,T,3C) holds q,k,v; att (B,NH,T,T) gets the scaled scores and then,
 * in place, their causal softmax: the probabilities the backward reads. */
static inline void attention_forward(float *out, float *att, const float *inp, int B, int T, int C, int NH)
{
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *q = inp + ((size_t)b * T + t) * C3 + h * hs;
                size_t row = (((size_t)b * NH + h) * T + t) * T;
                float *a = att + row, maxv = -INFINITY, sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = inp + ((size_t)b * T + t2) * C3 + h * hs + C;
                    float v = 0.0f;
                    for (int i = 0; i < hs; i++) v += q[i] * k[i];
                    a[t2] = v * scale;
                    if (a[t2] > maxv) maxv = a[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] = expf(a[t2] - maxv);
                    sum += a[t2];
                }
                for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
                float *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = inp + ((size_t)b * T + t2) * C3 + h * hs + 2 * C;
                    for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
            }
}

/* dpreatt and datt: zeroed (B,NH,T,T) workspace. */
static inline void attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout, const float *inp,
                               const float *att, int B, int T, int C, int NH)
{
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                size_t row = (((size_t)b * NH + h) * T + t) * T;
                const float *a = att + row, *d = dout + ((size_t)b * T + t) * C + h * hs;
                const float *q = inp + ((size_t)b * T + t) * C3 + h * hs;
                float *da = datt + row, *dp = dpreatt + row, *dq = dinp + ((size_t)b * T + t) * C3 + h * hs;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = inp + ((size_t)b * T + t2) * C3 + h * hs + 2 * C;
                    float *dv = dinp + ((size_t)b * T + t2) * C3 + h * hs + 2 * C;
                    for (int i = 0; i < hs; i++) {
                        da[t2] += v[i] * d[i];
                        dv[i] += a[t2] * d[i];
                    }
                }
                for (int t2 = 0; t2 <= t; t2++)
                    for (int t3 = 0; t3 <= t; t3++)
                        dp[t3] += a[t2] * ((t2 == t3 ? 1.0f : 0.0f) - a[t3]) * da[t2];
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = inp + ((size_t)b * T + t2) * C3 + h * hs + C;
                    float *dk = dinp + ((size_t)b * T + t2) * C3 + h * hs + C;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += k[i] * dp[t2] * scale;
                        dk[i] += q[i] * dp[t2] * scale;
                    }
                }
            }
}

static inline void residual_forward(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* da += dout, db += dout; in place (da == dout, a new gradient) da is
 * made 0 + dout, as `+=` on a zeroed buffer would, before db reads dout. */
static inline void residual_backward(float *da, float *db, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float d = dout[i];
        if (db) db[i] += d;
        if (da) da[i] = (da == dout ? 0.0f : da[i]) + d;
    }
}

#define GPT2_GELU_K 0.7978845608028654f /* sqrt(2/pi) */

static inline void gelu_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GPT2_GELU_K * (x + 0.044715f * x * x * x)));
    }
}

/* dinp += g * dout; in place (dinp == dout, a new gradient) it writes
 * 0 + g * dout, the value the `+=` gives on a zeroed buffer, bit for bit. */
static inline void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], u = GPT2_GELU_K * (x + 0.044715f * x * x * x);
        float th = tanhf(u), ch = coshf(u), sech2 = 1.0f / (ch * ch);
        float g = 0.5f * (1.0f + th) + x * 0.5f * sech2 * GPT2_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        float d = g * dout[i];
        dinp[i] = (dinp == dout ? 0.0f : dinp[i]) + d;
    }
}

/* Inverted dropout: keep with probability 1-p, scale kept values by
 * 1/(1-p). mask (one byte per element) may be NULL (forward without save). */
static inline void dropout_forward(float *out, uint8_t *mask, const float *inp, size_t n, float p, uint64_t key)
{
    float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++) {
        int keep = gpt2_uniform(key, i) >= p;
        out[i] = keep ? inp[i] * scale : 0.0f;
        if (mask) mask[i] = (uint8_t)keep;
    }
}

static inline void dropout_backward(float *dinp, const float *dout, const uint8_t *mask, size_t n, float p)
{
    float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++)
        if (mask[i]) dinp[i] += dout[i] * scale;
}

static inline void softmax_forward(float *probs, const float *logits, int N, int V)
{
    for (int r = 0; r < N; r++) {
        const float *x = logits + (size_t)r * V;
        float *p = probs + (size_t)r * V, maxv = -INFINITY, sum = 0.0f;
        for (int i = 0; i < V; i++)
            if (x[i] > maxv) maxv = x[i];
        for (int i = 0; i < V; i++) {
            p[i] = expf(x[i] - maxv);
            sum += p[i];
        }
        for (int i = 0; i < V; i++) p[i] /= sum;
    }
}

/* dlogits_i += p_i * (dp_i - sum_j dp_j p_j). */
static inline void softmax_backward(float *dlogits, const float *dprobs, const float *probs, int N, int V)
{
    for (int r = 0; r < N; r++) {
        const float *p = probs + (size_t)r * V, *dp = dprobs + (size_t)r * V;
        float *dl = dlogits + (size_t)r * V, dot = 0.0f;
        for (int i = 0; i < V; i++) dot += dp[i] * p[i];
        for (int i = 0; i < V; i++) dl[i] += p[i] * (dp[i] - dot);
    }
}

static inline void xent_forward(float *losses, const float *probs, const int32_t *targets, int N, int V)
{
    for (int r = 0; r < N; r++) losses[r] = -logf(probs[(size_t)r * V + targets[r]]);
}

static inline void xent_backward(float *dprobs, const float *dlosses, const float *probs, const int32_t *targets, int N,
                          int V)
{
    for (int r = 0; r < N; r++) {
        size_t i = (size_t)r * V + targets[r];
        dprobs[i] += -dlosses[r] / probs[i];
    }
}

/* ---------------------------------------------------------------------------
 * Parameters and AdamW (outside the activation budget)
 * ------------------------------------------------------------------------- */

typedef struct gpt2_model {
    gpt2_shape shape;
    size_t sizes[GPT2_NUM_PARAMS], num_params;
    float *params, *grads, *m, *v; /* one block each, num_params floats */
    float *p[GPT2_NUM_PARAMS], *g[GPT2_NUM_PARAMS];
} gpt2_model;

/* Standard normal by Box-Muller from the counter-based generator. */
static inline float gpt2_normal(uint64_t key, uint64_t i)
{
    float u1 = gpt2_uniform(key, 2 * i), u2 = gpt2_uniform(key, 2 * i + 1);
    return sqrtf(-2.0f * logf(1.0f - u1)) * cosf(6.2831853071795864f * u2);
}

/* GPT-2's initialisation: weights N(0, 0.02), the two residual projections
 * scaled by 1/sqrt(2L), layernorms 1 and 0, biases 0. */
static inline void gpt2__init_param(gpt2_model *md, int k, uint64_t seed)
{
    static const int ones[] = {GPT2_LN1W, GPT2_LN2W, GPT2_LNFW};
    static const int normal[] = {GPT2_WTE, GPT2_WPE, GPT2_QKVW, GPT2_ATTPROJW, GPT2_FCW, GPT2_FCPROJW};
    float std = 0.0f, fill = 0.0f;
    for (size_t i = 0; i < sizeof ones / sizeof ones[0]; i++)
        if (ones[i] == k) fill = 1.0f;
    for (size_t i = 0; i < sizeof normal / sizeof normal[0]; i++)
        if (normal[i] == k) std = 0.02f;
    if (k == GPT2_ATTPROJW || k == GPT2_FCPROJW) std /= sqrtf(2.0f * (float)md->shape.L);
    for (size_t i = 0; i < md->sizes[k]; i++)
        md->p[k][i] = std > 0.0f ? std * gpt2_normal(gpt2_key(seed, 0, (uint64_t)k), i) : fill;
}

static inline void gpt2_model_free(gpt2_model *md)
{
    free(md->params);
    free(md->grads);
    free(md->m);
    free(md->v);
    memset(md, 0, sizeof *md);
}

/* 0 on success, -1 when out of memory. */
static inline int gpt2_model_init(gpt2_model *md, const gpt2_shape *shape, uint64_t seed)
{
    size_t off = 0;
    memset(md, 0, sizeof *md);
    md->shape = *shape;
    gpt2_param_sizes(shape, md->sizes);
    for (int k = 0; k < GPT2_NUM_PARAMS; k++) md->num_params += md->sizes[k];
    md->params = (float *)malloc(md->num_params * sizeof(float));
    md->grads = (float *)calloc(md->num_params, sizeof(float));
    md->m = (float *)calloc(md->num_params, sizeof(float));
    md->v = (float *)calloc(md->num_params, sizeof(float));
    if (!md->params || !md->grads || !md->m || !md->v) {
        gpt2_model_free(md);
        return -1;
    }
    for (int k = 0; k < GPT2_NUM_PARAMS; k++) {
        md->p[k] = md->params + off;
        md->g[k] = md->grads + off;
        off += md->sizes[k];
        gpt2__init_param(md, k, seed);
    }
    return 0;
}

static inline void gpt2_model_zero_grad(gpt2_model *md) { memset(md->grads, 0, md->num_params * sizeof(float)); }

/* AdamW as in llm.c's gpt2_update; t counts updates from 1. */
static inline void gpt2_model_update(gpt2_model *md, float lr, float wd, int t)
{
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
    for (size_t i = 0; i < md->num_params; i++) {
        float g = md->grads[i];
        md->m[i] = b1 * md->m[i] + (1.0f - b1) * g;
        md->v[i] = b2 * md->v[i] + (1.0f - b2) * g * g;
        md->params[i] -= lr * ((md->m[i] / c1) / (sqrtf(md->v[i] / c2) + eps) + wd * md->params[i]);
    }
}

/* ---------------------------------------------------------------------------
 * One training step's buffers and the rockmate callbacks
 *
 * Two memory modes, chosen when the step is made:
 * - malloc (gpt2_step_init): the callbacks allocate and free every buffer
 *   through gpt2_mem, gpt2_step_load the inputs; run with gpt2_step_run.
 * - arena (gpt2_step_init_arena): one rkm_arena_exec per plan, made before
 *   training by gpt2_step_open (the plan's layout: one allocation); every
 *   buffer sits at its layout offset and the callbacks only look it up.
 *   gpt2_step_run_arena copies the loaded batch into the exec's inputs and
 *   runs the plan: a training step allocates nothing.
 * Either way exactly what the kernels accumulate into is zeroed: new input
 * gradients (RKM_GRAD_NEW) and the backward workspace; everything else is
 * written before it is read. Arena memory is reused, so this matters there.
 * ------------------------------------------------------------------------- */

typedef struct gpt2_step {
    const gpt2_graph *gg;
    gpt2_model *model;
    int arena;          /* 1: arena mode, 0: malloc mode */
    gpt2_mem mem;       /* malloc mode: the counted buffers */
    rkm_arena_exec *ax; /* arena mode: the exec of the step in progress */
    void *base;         /* its region */
    int32_t *batch;     /* arena mode: the loaded tokens, then targets (B*T each) */
    int loaded;         /* a batch is loaded */
    void **act;         /* per tensor: its buffer while live */
    void **phantom;     /* per op: its saved state while live */
    float **grad;       /* per tensor: its gradient while live */
    float dropout;      /* p */
    uint64_t seed;      /* dropout seed */
    uint64_t key;       /* the training step's key for dropout masks */
    double loss;        /* mean loss, set by the loss callback */
    uint64_t peak;      /* the last step's measured activation peak */
    copier *cp;         /* offloading: the copy streams (NULL: the graph has no copy link) */
    gpt2_mem host;      /* offloading: the host copies, counted */
    void **host_act;    /* per tensor: its host copy while it has one */
    void **host_saved;  /* per op: its saved state's host copy */
    uint64_t *copy;     /* per copy slot (tensors, then ops): its copy in flight, copier_start's ticket */
    uint64_t host_peak; /* the last step's measured host peak */
    char err[160];      /* why a callback failed */
} gpt2_step;

static inline int gpt2__fail(gpt2_step *st, const char *what, int32_t id)
{
    snprintf(st->err, sizeof st->err, "%s (id %d)", what, (int)id);
    return 1;
}

static inline uint64_t gpt2__tbytes(const gpt2_step *st, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(st->gg->g, t, &ti) == RKM_OK ? ti.bytes : 0;
}

/* A buffer the step creates: where the exec carved it (offset `off`), or
 * counted; zero: the kernels accumulate into it. NULL when out of memory. */
static inline void *gpt2__new(gpt2_step *st, uint64_t off, uint64_t bytes, int zero)
{
    void *p;
    if (!st->ax) return gpt2_mem_alloc(&st->mem, bytes, zero);
    p = rkm_arena_ptr(st->base, off);
    if (p && zero) memset(p, 0, (size_t)bytes);
    return p;
}

/* A buffer a free step releases (the exec takes its own back by itself). */
static inline void gpt2__release(gpt2_step *st, void *p, uint64_t bytes)
{
    if (!st->ax) gpt2_mem_free(&st->mem, p, bytes);
}

/* The call's workspace of `bytes` (the call's ws_bytes): cut from the
 * exec's reservation for the call, or counted. NULL for 0 bytes or out of
 * memory. Release it with gpt2__release. */
static inline float *gpt2__ws(gpt2_step *st, uint64_t bytes, int zero)
{
    uint64_t off = 0;
    if (!bytes || (st->ax && rkm_arena_exec_scratch(st->ax, bytes, &off) != RKM_OK)) return NULL;
    return (float *)gpt2__new(st, off, bytes, zero);
}

/* A parameter's slice for the op's layer (whole outside layers). */
static inline float *gpt2__w(float *const *base, const gpt2_shape *s, int param, int layer)
{
    if (param < 0) return NULL;
    return base[param] + (layer < 0 ? 0 : (size_t)layer * gpt2_param_slice(s, param));
}

/* Attention writes its probabilities on every run (the graph's scratch):
 * into the saved state while it is live (with save, or kept from an earlier
 * run), else into the call's workspace (ws_bytes then includes them). */
static inline void gpt2__forward_kernel(gpt2_step *st, const gpt2_opdef *d, int32_t op, int save, float *ws)
{
    const gpt2_shape *s = &st->gg->shape;
    int N = s->B * s->T;
    float *out = (float *)st->act[d->out], *x = (float *)st->act[d->in[0]];
    float *ph = save ? (float *)st->phantom[op] : NULL;
    float *w = gpt2__w(st->model->p, s, d->weight, d->layer), *b = gpt2__w(st->model->p, s, d->bias, d->layer);
    switch (d->kind) {
    case GPT2_ENCODER: encoder_forward(out, (const int32_t *)x, w, b, s->B, s->T, s->C); break;
    case GPT2_LAYERNORM: layernorm_forward(out, ph, ph ? ph + N : NULL, x, w, b, N, s->C); break;
    case GPT2_MATMUL: matmul_forward(out, x, w, b, N, d->n, d->m); break;
    case GPT2_ATTENTION:
        attention_forward(out, st->phantom[op] ? (float *)st->phantom[op] : ws, x, s->B, s->T, s->C, s->NH);
        break;
    case GPT2_RESIDUAL: residual_forward(out, x, (const float *)st->act[d->in[1]], (size_t)d->n); break;
    case GPT2_GELU: gelu_forward(out, x, (size_t)d->n); break;
    case GPT2_DROPOUT:
        dropout_forward(out, (uint8_t *)ph, x, (size_t)d->n, st->dropout, gpt2_key(st->seed, st->key, (uint64_t)op));
        break;
    case GPT2_SOFTMAX: softmax_forward(out, x, N, s->V); break;
    case GPT2_XENT: xent_forward(out, x, (const int32_t *)st->act[d->in[1]], N, s->V); break;
    }
}

static inline int gpt2_cb_forward(void *user, const rkm_fwd_call *c)
{
    gpt2_step *st = (gpt2_step *)user;
    const gpt2_opdef *d = &st->gg->ops[c->op];
    float *ws;
    for (int i = 0; i < d->n_in; i++)
        if (!st->act[d->in[i]]) return gpt2__fail(st, "forward: input not live", d->in[i]);
    if (c->out_new[0]) {
        if (st->act[d->out]) return gpt2__fail(st, "forward: new output already live", d->out);
        st->act[d->out] = gpt2__new(st, rkm_arena_exec_tensor(st->ax, d->out), gpt2__tbytes(st, d->out), 0);
    } else if (!st->act[d->out]) {
        return gpt2__fail(st, "forward: output to recompute in place is not live", d->out);
    }
    if (c->save) {
        if (st->phantom[c->op]) return gpt2__fail(st, "forward: saved state already live", c->op);
        st->phantom[c->op] = gpt2__new(st, rkm_arena_exec_saved(st->ax, c->op), c->phantom, 0);
    }
    ws = gpt2__ws(st, c->ws_bytes, 0);
    if (!st->act[d->out] || (c->save && !st->phantom[c->op]) || (c->ws_bytes && !ws))
        return gpt2__fail(st, "forward: out of memory", c->op);
    if (d->kind == GPT2_ATTENTION && !st->phantom[c->op] && c->ws_bytes < c->phantom)
        return gpt2__fail(st, "forward: attention has nowhere to write its probabilities", c->op);
    gpt2__forward_kernel(st, d, c->op, c->save, ws);
    gpt2__release(st, ws, c->ws_bytes);
    return 0;
}

/* The buffer of tensor t if the op's backward declares it saved, else NULL:
 * a backward sees only what its `saved` list promises, so a kernel that
 * read anything else would crash under the plans that free it. */
static inline void *gpt2__saved(const gpt2_step *st, const rkm_bwd_call *c, int32_t t)
{
    for (int i = 0; i < c->n_saved; i++)
        if (c->saved[i] == t) return st->act[t];
    return NULL;
}

static inline void gpt2__backward_kernel(gpt2_step *st, const gpt2_opdef *d, const rkm_bwd_call *c, int32_t op,
                                  float *const din[2], float *ws)
{
    const gpt2_shape *s = &st->gg->shape;
    int N = s->B * s->T;
    float *dout = st->grad[d->out], *x = (float *)gpt2__saved(st, c, d->in[0]), *ph = (float *)st->phantom[op];
    const int32_t *targets = d->n_in > 1 ? (const int32_t *)gpt2__saved(st, c, d->in[1]) : NULL;
    float *w = gpt2__w(st->model->p, s, d->weight, d->layer);
    float *dw = gpt2__w(st->model->g, s, d->weight, d->layer), *db = gpt2__w(st->model->g, s, d->bias, d->layer);
    switch (d->kind) {
    case GPT2_ENCODER: encoder_backward(dw, db, dout, (const int32_t *)x, s->B, s->T, s->C); break;
    case GPT2_LAYERNORM: layernorm_backward(din[0], dw, db, dout, x, w, ph, ph + N, N, s->C); break;
    case GPT2_MATMUL: matmul_backward(din[0], dw, db, dout, x, w, N, d->n, d->m); break;
    case GPT2_ATTENTION:
        attention_backward(din[0], ws, ws + c->ws_bytes / 8, dout, x, ph, s->B, s->T, s->C, s->NH);
        break;
    case GPT2_RESIDUAL: residual_backward(din[0], din[1], dout, (size_t)d->n); break;
    case GPT2_GELU: gelu_backward(din[0], x, dout, (size_t)d->n); break;
    case GPT2_DROPOUT: dropout_backward(din[0], dout, (const uint8_t *)ph, (size_t)d->n, st->dropout); break;
    case GPT2_SOFTMAX: softmax_backward(din[0], dout, (const float *)gpt2__saved(st, c, d->out), N, s->V); break;
    case GPT2_XENT: xent_backward(din[0], dout, x, targets, N, s->V); break;
    }
}

/* Makes din[i] point at grad(in[i]) as the executor asks (new: zeroed). */
static inline int gpt2__input_grads(gpt2_step *st, const gpt2_opdef *d, const rkm_bwd_call *c, float *din[2])
{
    for (int i = 0; i < d->n_in; i++) {
        int32_t t = d->in[i];
        din[i] = NULL;
        if (c->in_grad[i] == RKM_GRAD_NEW) {
            if (st->grad[t]) return gpt2__fail(st, "backward: new gradient already live", t);
            st->grad[t] = (float *)gpt2__new(st, rkm_arena_exec_grad(st->ax, t), gpt2__tbytes(st, t), 1);
            if (!st->grad[t]) return gpt2__fail(st, "backward: out of memory", t);
        } else if (c->in_grad[i] == RKM_GRAD_INPLACE) { /* grad(out)'s buffer, handed over after the kernel */
            if (st->grad[t]) return gpt2__fail(st, "backward: in-place gradient already live", t);
            st->grad[t] = st->grad[d->out];
        } else if (c->in_grad[i] == RKM_GRAD_ACCUMULATE && !st->grad[t]) {
            return gpt2__fail(st, "backward: gradient to accumulate into is not live", t);
        }
        if (c->in_grad[i] != RKM_GRAD_NONE) din[i] = st->grad[t];
    }
    return 0;
}

static inline int gpt2_cb_backward(void *user, const rkm_bwd_call *c)
{
    gpt2_step *st = (gpt2_step *)user;
    const gpt2_opdef *d = &st->gg->ops[c->op];
    float *din[2], *ws;
    if (!st->grad[d->out]) return gpt2__fail(st, "backward: output gradient not live", d->out);
    for (int i = 0; i < c->n_saved; i++)
        if (!st->act[c->saved[i]]) return gpt2__fail(st, "backward: saved tensor not live", c->saved[i]);
    if (c->phantom && !st->phantom[c->op]) return gpt2__fail(st, "backward: saved state not live", c->op);
    if (gpt2__input_grads(st, d, c, din)) return 1;
    if (!(ws = gpt2__ws(st, c->ws_bytes, 1)) && c->ws_bytes) return gpt2__fail(st, "backward: out of memory", c->op);
    gpt2__backward_kernel(st, d, c, c->op, din, ws);
    if (c->n_in && c->in_grad[0] == RKM_GRAD_INPLACE) st->grad[d->out] = NULL; /* now grad(in[0]) */
    gpt2__release(st, ws, c->ws_bytes);
    return 0;
}

/* grad(loss) = 1/(B*T) everywhere: the loss is the mean over positions. */
static inline int gpt2_cb_loss(void *user, const rkm_buffer_call *c)
{
    gpt2_step *st = (gpt2_step *)user;
    int32_t t = c->index;
    uint64_t bytes = c->bytes;
    size_t n = (size_t)(bytes / sizeof(float));
    const float *losses = (const float *)st->act[t];
    double sum = 0.0;
    if (!losses) return gpt2__fail(st, "loss: tensor not live", t);
    if (st->grad[t]) return gpt2__fail(st, "loss: gradient already live", t);
    if (!(st->grad[t] = (float *)gpt2__new(st, rkm_arena_exec_grad(st->ax, t), bytes, 0)))
        return gpt2__fail(st, "loss: out of memory", t);
    for (size_t i = 0; i < n; i++) {
        st->grad[t][i] = 1.0f / (float)n;
        sum += losses[i];
    }
    st->loss = sum / (double)n;
    return 0;
}

static inline int gpt2_cb_free_tensor(void *user, const rkm_buffer_call *c)
{
    gpt2_step *st = (gpt2_step *)user;
    if (!st->act[c->index]) return gpt2__fail(st, "free: tensor not live", c->index);
    gpt2__release(st, st->act[c->index], c->bytes);
    st->act[c->index] = NULL;
    return 0;
}

static inline int gpt2_cb_free_saved(void *user, const rkm_buffer_call *c)
{
    gpt2_step *st = (gpt2_step *)user;
    if (!st->phantom[c->index]) return gpt2__fail(st, "free_saved: saved state not live", c->index);
    gpt2__release(st, st->phantom[c->index], c->bytes);
    st->phantom[c->index] = NULL;
    return 0;
}

static inline int gpt2_cb_free_grad(void *user, const rkm_buffer_call *c)
{
    gpt2_step *st = (gpt2_step *)user;
    if (!st->grad[c->index]) return gpt2__fail(st, "free_grad: gradient not live", c->index);
    gpt2__release(st, st->grad[c->index], c->bytes);
    st->grad[c->index] = NULL;
    return 0;
}

/* Offloading (a graph with a copy link): an offloaded activation or saved
 * state gets a host copy (counted in st->host), made on the device-to-host
 * stream while the kernels go on; a prefetch makes its device buffer anew
 * and fills it on the other stream; wait blocks until the copy is done. */
static inline void **gpt2__host_slot(gpt2_step *st, const rkm_copy_call *c)
{
    return c->saved ? &st->host_saved[c->index] : &st->host_act[c->index];
}

static inline void **gpt2__dev_slot(gpt2_step *st, const rkm_copy_call *c)
{
    return c->saved ? &st->phantom[c->index] : &st->act[c->index];
}

static inline uint64_t *gpt2__copy_slot(gpt2_step *st, const rkm_copy_call *c)
{
    return &st->copy[(c->saved ? rkm_graph_num_tensors(st->gg->g) : 0) + c->index];
}

static inline int gpt2_cb_offload(void *user, const rkm_copy_call *c)
{
    gpt2_step *st = (gpt2_step *)user;
    void **host = gpt2__host_slot(st, c), *dev = *gpt2__dev_slot(st, c);
    if (!st->cp || !dev || *host) return gpt2__fail(st, "offload: no copy streams, buffer not live or on the host", c->index);
    if (!(*host = gpt2_mem_alloc(&st->host, c->bytes, 0))) return gpt2__fail(st, "offload: out of host memory", c->index);
    *gpt2__copy_slot(st, c) = copier_start(st->cp, COPIER_D2H, *host, dev, (size_t)c->bytes);
    return 0;
}

static inline int gpt2_cb_prefetch(void *user, const rkm_copy_call *c)
{
    gpt2_step *st = (gpt2_step *)user;
    void **host = gpt2__host_slot(st, c), **dev = gpt2__dev_slot(st, c);
    uint64_t off = c->saved ? rkm_arena_exec_saved(st->ax, c->index) : rkm_arena_exec_tensor(st->ax, c->index);
    if (!st->cp || !*host || *dev) return gpt2__fail(st, "prefetch: no copy streams, no host copy or buffer live", c->index);
    if (!(*dev = gpt2__new(st, off, c->bytes, 0))) return gpt2__fail(st, "prefetch: out of memory", c->index);
    *gpt2__copy_slot(st, c) = copier_start(st->cp, COPIER_H2D, *dev, *host, (size_t)c->bytes);
    return 0;
}

static inline int gpt2_cb_wait(void *user, const rkm_copy_call *c)
{
    gpt2_step *st = (gpt2_step *)user;
    if (!st->cp) return gpt2__fail(st, "wait: no copy streams", c->index);
    copier_wait(st->cp, *gpt2__copy_slot(st, c));
    return 0;
}

static inline int gpt2_cb_free_host(void *user, const rkm_copy_call *c)
{
    gpt2_step *st = (gpt2_step *)user;
    void **host = gpt2__host_slot(st, c);
    if (!*host) return gpt2__fail(st, "free_host: no host copy", c->index);
    gpt2_mem_free(&st->host, *host, c->bytes);
    *host = NULL;
    return 0;
}

/* After a failed step: the copies still going end, then every host copy is
 * released (a complete step leaves none). */
static inline void gpt2__release_host(gpt2_step *st)
{
    int32_t nt = rkm_graph_num_tensors(st->gg->g), no = rkm_graph_num_ops(st->gg->g);
    rkm_op_desc oi;
    if (st->cp) copier_drain(st->cp);
    for (int32_t t = 0; t < nt; t++)
        if (st->host_act[t]) gpt2_mem_free(&st->host, st->host_act[t], gpt2__tbytes(st, t));
    for (int32_t op = 0; op < no; op++)
        if (st->host_saved[op] && rkm_graph_op_info(st->gg->g, op, &oi) == RKM_OK)
            gpt2_mem_free(&st->host, st->host_saved[op], oi.phantom);
    memset(st->host_act, 0, (size_t)nt * sizeof *st->host_act);
    memset(st->host_saved, 0, (size_t)no * sizeof *st->host_saved);
}

static inline rkm_callbacks gpt2_callbacks(gpt2_step *st)
{
    rkm_callbacks cb; /* assigned field by field: gpt2_cuda.cu's C++17 reads this header too */
    memset(&cb, 0, sizeof cb);
    cb.user = st;
    cb.forward = gpt2_cb_forward;
    cb.backward = gpt2_cb_backward;
    cb.loss = gpt2_cb_loss;
    cb.free_tensor = gpt2_cb_free_tensor;
    cb.free_saved = gpt2_cb_free_saved;
    cb.free_grad = gpt2_cb_free_grad;
    cb.offload = gpt2_cb_offload;
    cb.prefetch = gpt2_cb_prefetch;
    cb.wait = gpt2_cb_wait;
    cb.free_host = gpt2_cb_free_host;
    return cb;
}

static inline void gpt2_step_free(gpt2_step *st)
{
    free(st->act);
    free(st->phantom);
    free(st->grad);
    free(st->host_act);
    free(st->host_saved);
    free(st->copy);
    free(st->batch);
    memset(st, 0, sizeof *st);
}

/* Malloc mode. 0 on success, -1 when out of memory. */
static inline int gpt2_step_init(gpt2_step *st, const gpt2_graph *gg, gpt2_model *md, float dropout, uint64_t seed)
{
    size_t nt = (size_t)rkm_graph_num_tensors(gg->g), no = (size_t)rkm_graph_num_ops(gg->g);
    memset(st, 0, sizeof *st);
    st->gg = gg;
    st->model = md;
    st->dropout = dropout;
    st->seed = seed;
    st->act = (void **)calloc(nt, sizeof *st->act);
    st->phantom = (void **)calloc(no, sizeof *st->phantom);
    st->grad = (float **)calloc(nt, sizeof *st->grad);
    st->host_act = (void **)calloc(nt, sizeof *st->host_act);
    st->host_saved = (void **)calloc(no, sizeof *st->host_saved);
    st->copy = (uint64_t *)calloc(nt + no, sizeof *st->copy);
    if (!st->act || !st->phantom || !st->grad || !st->host_act || !st->host_saved || !st->copy) {
        gpt2_step_free(st);
        return -1;
    }
    return 0;
}

/* Arena mode (see above). 0 on success, -1 when out of memory. */
static inline int gpt2_step_init_arena(gpt2_step *st, const gpt2_graph *gg, gpt2_model *md, float dropout,
                                       uint64_t seed)
{
    size_t bt = (size_t)gg->shape.B * (size_t)gg->shape.T;
    if (gpt2_step_init(st, gg, md, dropout, seed)) return -1;
    st->arena = 1;
    if (!(st->batch = (int32_t *)malloc(2 * bt * sizeof(int32_t)))) {
        gpt2_step_free(st);
        return -1;
    }
    return 0;
}

/* Arena mode: the exec that runs `plan` (of the step's graph, which must
 * outlive it), its region allocated here, once, from the plan's layout.
 * The caller destroys it (rkm_arena_exec_destroy) before the graph. */
static inline rkm_result gpt2_step_open(gpt2_step *st, const rkm_plan *plan, rkm_arena_exec **out)
{
    rkm_callbacks cb = gpt2_callbacks(st);
    rkm_arena_exec_desc d;
    memset(&d, 0, sizeof d);
    d.graph = st->gg->g;
    d.host = &cb;
    d.plan = plan; /* layout mode (0): every buffer at its offset in the plan's layout */
    d.allocate = 1;
    return rkm_arena_exec_create(&d, out);
}

/* Loads a batch of B*T tokens and targets. Malloc mode: into the input
 * buffers, made live (counted) on the first load; arena mode: into the
 * step's copy, which each run puts into its exec's inputs. */
static inline int gpt2_step_load(gpt2_step *st, const int32_t *tokens, const int32_t *targets)
{
    int32_t ids[2] = {st->gg->tokens, st->gg->targets};
    const int32_t *src[2] = {tokens, targets};
    size_t bt = (size_t)st->gg->shape.B * (size_t)st->gg->shape.T;
    for (int i = 0; i < 2; i++) {
        uint64_t bytes = gpt2__tbytes(st, ids[i]);
        if (st->arena) {
            memcpy(st->batch + i * bt, src[i], bt * sizeof(int32_t));
            continue;
        }
        if (!st->act[ids[i]] && !(st->act[ids[i]] = gpt2_mem_alloc(&st->mem, bytes, 0))) return -1;
        memcpy(st->act[ids[i]], src[i], (size_t)bytes);
    }
    st->loaded = 1;
    return 0;
}

static inline void gpt2_step_unload(gpt2_step *st)
{
    int32_t ids[2] = {st->gg->tokens, st->gg->targets};
    for (int i = 0; i < 2 && !st->arena; i++) {
        gpt2_mem_free(&st->mem, st->act[ids[i]], gpt2__tbytes(st, ids[i]));
        st->act[ids[i]] = NULL;
    }
    st->loaded = 0;
}

/* Malloc mode: frees whatever a failed step left live, inputs excepted. */
static inline void gpt2_step_release(gpt2_step *st)
{
    int32_t nt = rkm_graph_num_tensors(st->gg->g), no = rkm_graph_num_ops(st->gg->g);
    gpt2__release_host(st); /* first: no copy may still read or write a buffer freed below */
    for (int32_t t = 0; t < nt; t++) {
        rkm_buffer_call c = {-1, t, gpt2__tbytes(st, t), 0};
        if (st->act[t] && t != st->gg->tokens && t != st->gg->targets) gpt2_cb_free_tensor(st, &c);
        if (st->grad[t]) gpt2_cb_free_grad(st, &c);
    }
    for (int32_t op = 0; op < no; op++) {
        rkm_op_desc oi;
        if (!st->phantom[op] || rkm_graph_op_info(st->gg->g, op, &oi) != RKM_OK) continue;
        rkm_buffer_call c = {-1, op, oi.phantom, 0};
        gpt2_cb_free_saved(st, &c);
    }
}

/* Buffers other than the inputs still live: 0 after a complete step. */
static inline int64_t gpt2_step_leaks(const gpt2_step *st)
{
    int32_t nt = rkm_graph_num_tensors(st->gg->g), no = rkm_graph_num_ops(st->gg->g);
    int64_t n = 0;
    if (!st->arena)
        return st->mem.blocks + st->host.blocks - (st->act[st->gg->tokens] != NULL) -
               (st->act[st->gg->targets] != NULL);
    n = st->host.blocks;
    for (int32_t t = 0; t < nt; t++)
        n += (st->act[t] && t != st->gg->tokens && t != st->gg->targets) + (st->grad[t] != NULL);
    for (int32_t op = 0; op < no; op++) n += st->phantom[op] != NULL;
    return n;
}

/* What both modes do before a step: parameter gradients zeroed (the
 * backwards accumulate into them), dropout masks drawn under `key`. */
static inline void gpt2__step_begin(gpt2_step *st, uint64_t key)
{
    gpt2_model_zero_grad(st->model);
    st->host.peak = st->host.cur;
    st->key = key;
    st->err[0] = 0;
    st->loss = NAN;
}

/* Malloc mode: one training step under `plan` on the loaded batch. The
 * measured activation peak (gpt2_mem's) is left in st->peak. */
static inline rkm_result gpt2_step_run(gpt2_step *st, const rkm_plan *plan, uint64_t key)
{
    rkm_callbacks cb = gpt2_callbacks(st);
    rkm_result r;
    if (st->arena) {
        snprintf(st->err, sizeof st->err, "gpt2_step_run: an arena step runs with gpt2_step_run_arena");
        return RKM_ERROR_STATE;
    }
    gpt2__step_begin(st, key);
    st->mem.peak = st->mem.cur;
    r = rkm_plan_execute(plan, &cb);
    st->peak = st->mem.peak;
    st->host_peak = st->host.peak;
    if (r == RKM_OK && gpt2_step_leaks(st) != 0) {
        snprintf(st->err, sizeof st->err, "%lld buffers still live after the step", (long long)gpt2_step_leaks(st));
        r = RKM_ERROR_STATE;
    }
    if (r != RKM_OK) gpt2_step_release(st);
    return r;
}

/* Arena mode: one training step under `plan` through x (gpt2_step_open of
 * that plan) on the loaded batch. Allocates nothing. The measured
 * activation peak (the arena's) is left in st->peak. */
static inline rkm_result gpt2_step_run_arena(gpt2_step *st, rkm_arena_exec *x, const rkm_plan *plan, uint64_t key)
{
    int32_t ids[2] = {st->gg->tokens, st->gg->targets};
    size_t bt = (size_t)st->gg->shape.B * (size_t)st->gg->shape.T;
    uint64_t inputs = 0;
    rkm_arena_stats as;
    rkm_result r;
    if (!st->arena || !st->loaded || !x) {
        snprintf(st->err, sizeof st->err, "gpt2_step_run_arena: %s",
                 !st->arena ? "a malloc step runs with gpt2_step_run" : !x ? "no exec" : "no batch loaded");
        return RKM_ERROR_STATE;
    }
    gpt2__step_begin(st, key);
    st->ax = x;
    st->base = rkm_arena_exec_base(x);
    for (int i = 0; i < 2; i++) {
        st->act[ids[i]] = rkm_arena_ptr(st->base, rkm_arena_exec_tensor(x, ids[i]));
        memcpy(st->act[ids[i]], st->batch + i * bt, bt * sizeof(int32_t));
        inputs += gpt2__tbytes(st, ids[i]);
    }
    r = rkm_arena_exec_run(x, plan);
    rkm_arena_exec_stats_get(x, &as);
    st->peak = as.peak;
    st->host_peak = st->host.peak;
    if (r == RKM_OK && (gpt2_step_leaks(st) != 0 || as.current != inputs)) {
        snprintf(st->err, sizeof st->err, "%lld buffers (%llu bytes) still live after the step",
                 (long long)gpt2_step_leaks(st), (unsigned long long)(as.current - inputs));
        r = RKM_ERROR_STATE;
    }
    if (r != RKM_OK) gpt2__release_host(st);
    /* the region's pointers are the exec's: nothing else to free */
    memset(st->act, 0, (size_t)rkm_graph_num_tensors(st->gg->g) * sizeof *st->act);
    memset(st->grad, 0, (size_t)rkm_graph_num_tensors(st->gg->g) * sizeof *st->grad);
    memset(st->phantom, 0, (size_t)rkm_graph_num_ops(st->gg->g) * sizeof *st->phantom);
    st->ax = NULL;
    st->base = NULL;
    return r;
}

#endif /* GPT2_MODEL_H */
