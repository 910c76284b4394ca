/* gpt2_cuda.cu -- GPT-2 (llm.c's layout, fp32) trained on one GPU through
 * rockmate: the graph of examples/gpt2_graph.h, cuBLAS for the matmuls and
 * plain kernels for the rest, every activation buffer carved from a
 * rockmate device arena (cuda/rockmate_cuda.h).
 *
 * What it does: profile the baseline step on the GPU (event times and
 * workspaces make a new graph, which every plan below is made on), run the
 * baseline plan, then for each
 * budget plan with rockmate and run the plan, and print per budget the
 * measured peak (the arena's, in the contract's bytes), the simulated peak,
 * the measured step time, the predicted and measured overhead, and the
 * gradient check: the loss and every parameter gradient compared bit for bit
 * with the baseline plan's on the same GPU.
 *
 * Determinism (what makes the bitwise check meaningful): one stream; cuBLAS
 * in CUBLAS_PEDANTIC_MATH (no TF32, no reduced precision) with a fixed
 * workspace; no atomics anywhere: every reduction has a fixed order (warp
 * shuffles, fixed shared-memory trees, sequential chains), the embedding
 * gradient sums each token's positions along a chain prepared on the host.
 * A recomputed forward therefore reproduces its output bit for bit, and
 * gradient contributions are summed pairwise-commutatively (each gradient
 * here has at most two contributors), so any valid plan gives the
 * baseline's bits.
 *
 *   gpt2_cuda [--preset tiny|124M] [--layers L] [--channels C] [--heads NH]
 *             [--vocab V] [--batch B] [--seq T] [--dropout P]
 *             [--budgets 100,50,33,min] [--algo rockmate|rotor|sqrt|none]
 *             [--steps N] [--profile-runs N] [--check-cpu]
 *
 * --check-cpu also runs the CPU reference (examples/gpt2_model.h) on the
 * same weights and batch and compares loss and gradients (tolerance: fp32
 * summation order differs). Exit status: 0 all checks passed, 1 a check
 * failed, 2 bad usage, 3 an error (CUDA, planning). */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/rockmate_cuda.h"
#include "rockmate.h"

/* The CPU reference (and its weight initialisation) is header-only C; the
 * CUDA trainer uses part of it. C's `restrict` is __restrict__ in C++. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#define restrict __restrict__
#include "gpt2_model.h"
#undef restrict
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* ===========================================================================
 * Kernels
 * ========================================================================= */

#define WARP 32
#define TPB 256

static unsigned blocks_for(size_t n, unsigned per) { return (unsigned)((n + per - 1) / per); }

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum/max for blockDim.x == TPB: warps, then warp 0 over the
 * warp results; the same order every time. */
__device__ float block_reduce(float v, int is_max)
{
    __shared__ float part[TPB / WARP];
    __shared__ float result;
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (lane == 0) part[w] = v;
    __syncthreads();
    if (w == 0) {
        float x = lane < TPB / WARP ? part[lane] : (is_max ? -INFINITY : 0.0f);
        x = is_max ? warp_max(x) : warp_sum(x);
        if (lane == 0) result = x;
    }
    __syncthreads();
    float r = result;
    __syncthreads();
    return r;
}

/* The counter-based generator of gpt2_model.h, on the device: dropout masks
 * are the CPU trainer's, bit for bit. */
__device__ __forceinline__ uint64_t d_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ float d_uniform(uint64_t key, uint64_t i)
{
    return (float)(d_mix(key ^ d_mix(i)) >> 40) * (1.0f / 16777216.0f);
}

__global__ void encoder_fwd_k(float *out, const int32_t *tok, const float *wte, const float *wpe, int BT, int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)BT * C) return;
    size_t p = i / C, c = i % C;
    out[i] = wte[(size_t)tok[p] * C + c] + wpe[(p % T) * C + c];
}

/* dwte: one thread per (first position of a token, channel) walks the chain
 * of that token's positions in order. */
__global__ void encoder_bwd_wte_k(float *dwte, const float *dout, const int32_t *tok, const int32_t *first,
                                  const int32_t *next, int n_first, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n_first * C) return;
    int c = (int)(i % C);
    int p = first[i / C];
    float s = 0.0f;
    for (int q = p; q >= 0; q = next[q]) s += dout[(size_t)q * C + c];
    dwte[(size_t)tok[p] * C + c] += s;
}

/* dwpe[t] sums the B positions at time t, in batch order. */
__global__ void encoder_bwd_wpe_k(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += dout[(size_t)b * T * C + i];
    dwpe[i] += s;
}

/* One warp per row. mean/rstd may be NULL (forward without save). */
__global__ void layernorm_fwd_k(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                                int N, int C)
{
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const float *xr = x + (size_t)row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += WARP) s += xr[i];
    float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int i = lane; i < C; i += WARP) v += (xr[i] - m) * (xr[i] - m);
    float rs = 1.0f / sqrtf(warp_sum(v) / (float)C + 1e-5f);
    float *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += WARP) o[i] = (rs * (xr[i] - m)) * w[i] + b[i];
    if (lane == 0 && mean) mean[row] = m;
    if (lane == 0 && rstd) rstd[row] = rs;
}

/* dinp of layernorm, one warp per row. */
__global__ void layernorm_bwd_k(float *dinp, const float *dout, const float *x, const float *w, const float *mean,
                                const float *rstd, int N, int C)
{
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const float *d = dout + (size_t)row * C, *xr = x + (size_t)row * C;
    float m = mean[row], s = rstd[row], dm = 0.0f, dnm = 0.0f;
    for (int i = lane; i < C; i += WARP) {
        float dn = w[i] * d[i];
        dm += dn;
        dnm += dn * ((xr[i] - m) * s);
    }
    dm = warp_sum(dm) / (float)C;
    dnm = warp_sum(dnm) / (float)C;
    float *di = dinp + (size_t)row * C;
    for (int i = lane; i < C; i += WARP) {
        float norm = (xr[i] - m) * s, dn = w[i] * d[i];
        di[i] += ((dn - dm) - norm * dnm) * s;
    }
}

/* Column sums over N rows, 32 columns per block of 32x32 threads:
 * db[c] += sum_r dout[r,c]; with x: dw[c] += sum_r norm(r,c) * dout[r,c]
 * (layernorm's weight gradient). Fixed order: strided partial sums, then
 * a sequential sum of the 32 partials. */
__global__ void colsum_k(float *db, float *dw, const float *dout, const float *x, const float *mean,
                         const float *rstd, int N, int C)
{
    __shared__ float sb[32][33], sw[32][33];
    int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx;
    float pb = 0.0f, pw = 0.0f;
    if (c < C)
        for (int r = ty; r < N; r += 32) {
            float d = dout[(size_t)r * C + c];
            pb += d;
            if (dw) pw += ((x[(size_t)r * C + c] - mean[r]) * rstd[r]) * d;
        }
    sb[ty][tx] = pb;
    sw[ty][tx] = pw;
    __syncthreads();
    if (ty != 0 || c >= C) return;
    float tb = 0.0f, tw = 0.0f;
    for (int k = 0; k < 32; k++) {
        tb += sb[k][tx];
        tw += sw[k][tx];
    }
    if (db) db[c] += tb;
    if (dw) dw[c] += tw;
}

__global__ void add_bias_k(float *out, const float *bias, size_t N, int OC)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N * OC) out[i] += bias[i % OC];
}

/* Causal softmax over rows of T scores (row = (b,h,t)), one warp per row;
 * att may be pre itself (in place: each element is read, then written, by
 * the same lane). */
__global__ void attn_softmax_k(float *att, const float *pre, int rows, int T)
{
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= rows) return;
    int t = row % T;
    const float *p = pre + (size_t)row * T;
    float *a = att + (size_t)row * T;
    float mx = -INFINITY, s = 0.0f;
    for (int i = lane; i <= t; i += WARP) mx = fmaxf(mx, p[i]);
    mx = warp_max(mx);
    for (int i = lane; i <= t; i += WARP) s += expf(p[i] - mx);
    s = warp_sum(s);
    for (int i = lane; i < T; i += WARP) a[i] = i <= t ? expf(p[i] - mx) / s : 0.0f;
}

/* dpre[t3] = att[t3] * (datt[t3] - sum_t2 att[t2] datt[t2]) on the causal
 * part, 0 elsewhere; one warp per row. */
__global__ void attn_softmax_bwd_k(float *dpre, const float *datt, const float *att, int rows, int T)
{
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= rows) return;
    int t = row % T;
    const float *a = att + (size_t)row * T, *da = datt + (size_t)row * T;
    float dot = 0.0f;
    for (int i = lane; i <= t; i += WARP) dot += a[i] * da[i];
    dot = warp_sum(dot);
    float *dp = dpre + (size_t)row * T;
    for (int i = lane; i < T; i += WARP) dp[i] = i <= t ? a[i] * (da[i] - dot) : 0.0f;
}

__global__ void residual_fwd_k(float *out, const float *a, const float *b, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

__global__ void residual_bwd_k(float *da, float *db, const float *dout, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (da) da[i] += dout[i];
    if (db) db[i] += dout[i];
}

#define GELU_K 0.7978845608028654f

__global__ void gelu_fwd_k(float *out, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    out[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + 0.044715f * v * v * v)));
}

__global__ void gelu_bwd_k(float *dinp, const float *x, const float *dout, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i], u = GELU_K * (v + 0.044715f * v * v * v);
    float th = tanhf(u), ch = coshf(u), sech2 = 1.0f / (ch * ch);
    float g = 0.5f * (1.0f + th) + v * 0.5f * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
    dinp[i] += g * dout[i];
}

__global__ void dropout_fwd_k(float *out, uint8_t *mask, const float *x, size_t n, float p, uint64_t key)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int keep = d_uniform(key, i) >= p;
    out[i] = keep ? x[i] * (1.0f / (1.0f - p)) : 0.0f;
    if (mask) mask[i] = (uint8_t)keep;
}

__global__ void dropout_bwd_k(float *dinp, const float *dout, const uint8_t *mask, size_t n, float p)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && mask[i]) dinp[i] += dout[i] * (1.0f / (1.0f - p));
}

/* Softmax over the vocabulary, one block of TPB per row. */
__global__ void softmax_fwd_k(float *probs, const float *logits, int V)
{
    const float *x = logits + (size_t)blockIdx.x * V;
    float *p = probs + (size_t)blockIdx.x * V;
    float mx = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < V; i += TPB) mx = fmaxf(mx, x[i]);
    mx = block_reduce(mx, 1);
    for (int i = threadIdx.x; i < V; i += TPB) s += expf(x[i] - mx);
    s = block_reduce(s, 0);
    for (int i = threadIdx.x; i < V; i += TPB) p[i] = expf(x[i] - mx) / s;
}

__global__ void softmax_bwd_k(float *dlogits, const float *dprobs, const float *probs, int V)
{
    size_t off = (size_t)blockIdx.x * V;
    float dot = 0.0f;
    for (int i = threadIdx.x; i < V; i += TPB) dot += dprobs[off + i] * probs[off + i];
    dot = block_reduce(dot, 0);
    for (int i = threadIdx.x; i < V; i += TPB) dlogits[off + i] += probs[off + i] * (dprobs[off + i] - dot);
}

__global__ void xent_fwd_k(float *losses, const float *probs, const int32_t *targets, int N, int V)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < N) losses[r] = -logf(probs[(size_t)r * V + targets[r]]);
}

__global__ void xent_bwd_k(float *dprobs, const float *dlosses, const float *probs, const int32_t *targets, int N,
                           int V)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N) return;
    size_t i = (size_t)r * V + targets[r];
    dprobs[i] += -dlosses[r] / probs[i];
}

__global__ void fill_k(float *x, float v, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

/* ===========================================================================
 * The trainer's state and the rockmate callbacks
 * ========================================================================= */

typedef struct trainer {
    gpt2_graph gg;
    gpt2_shape s;
    gpt2_model host_model;              /* weights (host copy, CPU reference) */
    float *params, *grads;              /* device, outside the budget */
    float *p[GPT2_NUM_PARAMS], *g[GPT2_NUM_PARAMS];
    int32_t *h_tokens, *h_targets;      /* the batch */
    int32_t *d_first, *d_next;          /* per-token position chains (encoder backward) */
    int n_first;
    float *d_losses;                    /* a copy of the per-position losses of the last step */
    void *cublas_ws;
    size_t cublas_ws_bytes;
    cudaStream_t stream;
    cublasHandle_t cublas;
    rkm_cuda_arena *ca;                 /* the arena of the step being run */
    float dropout;
    uint64_t seed, key;
    char err[256];
} trainer;

static int fail_msg(trainer *tr, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tr->err, sizeof tr->err, fmt, ap);
    va_end(ap);
    return 1;
}

/* The message of rockmate's last failure (the arena's included): it goes
 * to the graph's context. */
static const char *lib_msg(const trainer *tr) { return rkm_context_errmsg(rkm_graph_context(tr->gg.g)); }

static int fail_cuda(trainer *tr, cudaError_t e, const char *what)
{
    snprintf(tr->err, sizeof tr->err, "%s: %s", what, cudaGetErrorString(e));
    return 1;
}

static int fail_cublas(trainer *tr, cublasStatus_t s, const char *what)
{
    snprintf(tr->err, sizeof tr->err, "%s: cuBLAS status %d", what, (int)s);
    return 1;
}

static int launched(trainer *tr, const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : fail_cuda(tr, e, what);
}

static float *T_(trainer *tr, int32_t t) { return (float *)rkm_cuda_tensor(tr->ca, t); }
static float *G_(trainer *tr, int32_t t) { return (float *)rkm_cuda_grad(tr->ca, t); }

/* A parameter's slice for a layer (whole outside the layers). */
static float *param_at(trainer *tr, float *const *base, int param, int layer)
{
    if (param < 0) return NULL;
    return base[param] + (layer < 0 ? 0 : (size_t)layer * gpt2_param_slice(&tr->s, param));
}

/* Row-major matmuls through column-major cuBLAS (see the derivations in
 * each comment: a row-major (R x K) matrix is a column-major (K x R) one). */
static const float ONE = 1.0f, ZERO = 0.0f;

/* out (N x OC) = inp (N x C) . W(OC x C)^T */
static cublasStatus_t mm_fwd(trainer *tr, float *out, const float *inp, const float *w, int N, int C, int OC)
{
    return cublasSgemm(tr->cublas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &ONE, w, C, inp, C, &ZERO, out, OC);
}

/* dinp (N x C) += dout (N x OC) . W (OC x C); dW (OC x C) += dout^T . inp */
static cublasStatus_t mm_bwd(trainer *tr, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                             int N, int C, int OC)
{
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (dinp) s = cublasSgemm(tr->cublas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &ONE, w, C, dout, OC, &ONE, dinp, C);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasSgemm(tr->cublas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &ONE, inp, C, dout, OC, &ONE, dw, C);
    return s;
}

static uint64_t scores_bytes(const gpt2_shape *s)
{
    return (uint64_t)s->B * (uint64_t)s->NH * (uint64_t)s->T * (uint64_t)s->T * 4;
}

/* Per batch row b, heads batched with stride hs. qkv is (B,T,3C), scores
 * (B,NH,T,T) row-major; a row-major (T x T) score matrix S[t][t2] is the
 * column-major matrix with element (t2, t). */
static int attention_fwd(trainer *tr, float *out, float *pre, float *att, const float *qkv)
{
    const gpt2_shape *s = &tr->s;
    int T = s->T, C = s->C, NH = s->NH, hs = C / NH, C3 = 3 * C;
    long long tt = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < s->B; b++) {
        const float *q = qkv + (size_t)b * T * C3, *k = q + C, *v = q + 2 * C;
        float *pb = pre + (size_t)b * NH * tt, *ab = att + (size_t)b * NH * tt, *ob = out + (size_t)b * T * C;
        /* S^T(t2,t) = sum_d K(t2,d) Q(t,d): (K as hs x T)^T . (Q as hs x T) */
        cublasStatus_t st = cublasSgemmStridedBatched(tr->cublas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &scale, k, C3,
                                                      hs, q, C3, hs, &ZERO, pb, T, tt, NH);
        if (st != CUBLAS_STATUS_SUCCESS) return fail_cublas(tr, st, "attention scores");
        attn_softmax_k<<<blocks_for((size_t)NH * T, TPB / WARP), TPB, 0, tr->stream>>>(ab, pb, NH * T, T);
        if (launched(tr, "attention softmax")) return 1;
        /* O (as hs x T, ld C) = V (as hs x T, ld 3C) . A^T (as T x T) */
        st = cublasSgemmStridedBatched(tr->cublas, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &ONE, v, C3, hs, ab, T, tt,
                                       &ZERO, ob, C, hs, NH);
        if (st != CUBLAS_STATUS_SUCCESS) return fail_cublas(tr, st, "attention output");
    }
    return 0;
}

static int attention_bwd(trainer *tr, float *dqkv, float *dpre, float *datt, const float *dout, const float *qkv,
                         const float *att)
{
    const gpt2_shape *s = &tr->s;
    int T = s->T, C = s->C, NH = s->NH, hs = C / NH, C3 = 3 * C;
    long long tt = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < s->B; b++) {
        const float *q = qkv + (size_t)b * T * C3, *k = q + C, *v = q + 2 * C;
        const float *ab = att + (size_t)b * NH * tt, *db = dout + (size_t)b * T * C;
        float *dq = dqkv + (size_t)b * T * C3, *dk = dq + C, *dv = dq + 2 * C;
        float *dab = datt + (size_t)b * NH * tt, *dpb = dpre + (size_t)b * NH * tt;
        cublasStatus_t st;
        /* dA^T(t2,t) = sum_d V(t2,d) dO(t,d) */
        st = cublasSgemmStridedBatched(tr->cublas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &ONE, v, C3, hs, db, C, hs,
                                       &ZERO, dab, T, tt, NH);
        /* dV(t2,d) += sum_t A(t,t2) dO(t,d): (dO as hs x T) . (A^T)^T */
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasSgemmStridedBatched(tr->cublas, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &ONE, db, C, hs, ab, T, tt,
                                           &ONE, dv, C3, hs, NH);
        if (st != CUBLAS_STATUS_SUCCESS) return fail_cublas(tr, st, "attention backward (datt, dv)");
        attn_softmax_bwd_k<<<blocks_for((size_t)NH * T, TPB / WARP), TPB, 0, tr->stream>>>(dpb, dab, ab, NH * T, T);
        if (launched(tr, "attention softmax backward")) return 1;
        /* dQ(t,d) += scale sum_t2 dP(t,t2) K(t2,d): (K as hs x T) . dP^T */
        st = cublasSgemmStridedBatched(tr->cublas, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &scale, k, C3, hs, dpb, T, tt,
                                       &ONE, dq, C3, hs, NH);
        /* dK(t2,d) += scale sum_t dP(t,t2) Q(t,d): (Q as hs x T) . (dP^T)^T */
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasSgemmStridedBatched(tr->cublas, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &scale, q, C3, hs, dpb, T,
                                           tt, &ONE, dk, C3, hs, NH);
        if (st != CUBLAS_STATUS_SUCCESS) return fail_cublas(tr, st, "attention backward (dq, dk)");
    }
    return 0;
}

static int forward_kernel(trainer *tr, const gpt2_opdef *d, int32_t op, float *out, float *ph)
{
    const gpt2_shape *s = &tr->s;
    int N = s->B * s->T;
    size_t n = (size_t)d->n;
    float *x = T_(tr, d->in[0]), *w = param_at(tr, tr->p, d->weight, d->layer);
    float *b = param_at(tr, tr->p, d->bias, d->layer);
    cudaStream_t st = tr->stream;
    switch (d->kind) {
    case GPT2_ENCODER:
        encoder_fwd_k<<<blocks_for((size_t)N * s->C, TPB), TPB, 0, st>>>(out, (const int32_t *)x, w, b, N, s->T, s->C);
        break;
    case GPT2_LAYERNORM:
        layernorm_fwd_k<<<blocks_for((size_t)N, TPB / WARP), TPB, 0, st>>>(out, ph, ph ? ph + N : NULL, x, w, b, N,
                                                                            s->C);
        break;
    case GPT2_MATMUL: {
        cublasStatus_t cs = mm_fwd(tr, out, x, w, N, d->n, d->m);
        if (cs != CUBLAS_STATUS_SUCCESS) return fail_cublas(tr, cs, "matmul forward");
        if (b) add_bias_k<<<blocks_for((size_t)N * d->m, TPB), TPB, 0, st>>>(out, b, (size_t)N, d->m);
        break;
    }
    case GPT2_ATTENTION: {
        /* The scores, then in place their softmax, on every run (the
         * graph's scratch): into the saved state while it is live (with
         * save, or kept from an earlier run), else into the workspace. */
        void *att = rkm_cuda_saved(tr->ca, op);
        if (!att && rkm_cuda_scratch(tr->ca, scores_bytes(s), &att) != RKM_OK) {
            snprintf(tr->err, sizeof tr->err, "attention: no workspace");
            return 1;
        }
        if (attention_fwd(tr, out, (float *)att, (float *)att, x)) return 1;
        break;
    }
    case GPT2_RESIDUAL:
        residual_fwd_k<<<blocks_for(n, TPB), TPB, 0, st>>>(out, x, T_(tr, d->in[1]), n);
        break;
    case GPT2_GELU: gelu_fwd_k<<<blocks_for(n, TPB), TPB, 0, st>>>(out, x, n); break;
    case GPT2_DROPOUT:
        dropout_fwd_k<<<blocks_for(n, TPB), TPB, 0, st>>>(out, (uint8_t *)ph, x, n, tr->dropout,
                                                          gpt2_key(tr->seed, tr->key, (uint64_t)op));
        break;
    case GPT2_SOFTMAX: softmax_fwd_k<<<N, TPB, 0, st>>>(out, x, s->V); break;
    case GPT2_XENT:
        xent_fwd_k<<<blocks_for((size_t)N, TPB), TPB, 0, st>>>(out, x, (const int32_t *)T_(tr, d->in[1]), N, s->V);
        break;
    }
    return launched(tr, "forward kernel");
}

static int cb_forward(void *user, const rkm_fwd_call *c)
{
    trainer *tr = (trainer *)user;
    const gpt2_opdef *d = &tr->gg.ops[c->op];
    float *ph = c->save ? (float *)rkm_cuda_saved(tr->ca, c->op) : NULL;
    return forward_kernel(tr, d, c->op, T_(tr, d->out), ph);
}

static int backward_kernel(trainer *tr, const gpt2_opdef *d, int32_t op, float *const din[2])
{
    const gpt2_shape *s = &tr->s;
    int N = s->B * s->T;
    size_t n = (size_t)d->n;
    float *dout = G_(tr, d->out), *x = T_(tr, d->in[0]), *ph = (float *)rkm_cuda_saved(tr->ca, op);
    float *w = param_at(tr, tr->p, d->weight, d->layer);
    float *dw = param_at(tr, tr->g, d->weight, d->layer), *db = param_at(tr, tr->g, d->bias, d->layer);
    cudaStream_t st = tr->stream;
    dim3 cs_block(32, 32);
    switch (d->kind) {
    case GPT2_ENCODER:
        encoder_bwd_wte_k<<<blocks_for((size_t)tr->n_first * s->C, TPB), TPB, 0, st>>>(
            dw, dout, (const int32_t *)x, tr->d_first, tr->d_next, tr->n_first, s->C);
        if (launched(tr, "encoder backward")) return 1;
        encoder_bwd_wpe_k<<<blocks_for((size_t)s->T * s->C, TPB), TPB, 0, st>>>(db, dout, s->B, s->T, s->C);
        break;
    case GPT2_LAYERNORM:
        if (din[0])
            layernorm_bwd_k<<<blocks_for((size_t)N, TPB / WARP), TPB, 0, st>>>(din[0], dout, x, w, ph, ph + N, N, s->C);
        if (launched(tr, "layernorm backward")) return 1;
        colsum_k<<<blocks_for((size_t)s->C, 32), cs_block, 0, st>>>(db, dw, dout, x, ph, ph + N, N, s->C);
        break;
    case GPT2_MATMUL: {
        cublasStatus_t cs = mm_bwd(tr, din[0], dw, dout, x, w, N, d->n, d->m);
        if (cs != CUBLAS_STATUS_SUCCESS) return fail_cublas(tr, cs, "matmul backward");
        if (db) colsum_k<<<blocks_for((size_t)d->m, 32), cs_block, 0, st>>>(db, NULL, dout, NULL, NULL, NULL, N, d->m);
        break;
    }
    case GPT2_ATTENTION: {
        void *ws;
        uint64_t sb = scores_bytes(s);
        if (rkm_cuda_scratch(tr->ca, 2 * sb, &ws) != RKM_OK) {
            snprintf(tr->err, sizeof tr->err, "attention backward: no workspace");
            return 1;
        }
        if (attention_bwd(tr, din[0], (float *)ws, (float *)ws + sb / 4, dout, x, ph)) return 1;
        break;
    }
    case GPT2_RESIDUAL: residual_bwd_k<<<blocks_for(n, TPB), TPB, 0, st>>>(din[0], din[1], dout, n); break;
    case GPT2_GELU: gelu_bwd_k<<<blocks_for(n, TPB), TPB, 0, st>>>(din[0], x, dout, n); break;
    case GPT2_DROPOUT:
        dropout_bwd_k<<<blocks_for(n, TPB), TPB, 0, st>>>(din[0], dout, (const uint8_t *)ph, n, tr->dropout);
        break;
    case GPT2_SOFTMAX: softmax_bwd_k<<<N, TPB, 0, st>>>(din[0], dout, T_(tr, d->out), s->V); break;
    case GPT2_XENT:
        xent_bwd_k<<<blocks_for((size_t)N, TPB), TPB, 0, st>>>(din[0], dout, x, (const int32_t *)T_(tr, d->in[1]), N,
                                                               s->V);
        break;
    }
    return launched(tr, "backward kernel");
}

static int cb_backward(void *user, const rkm_bwd_call *c)
{
    trainer *tr = (trainer *)user;
    const gpt2_opdef *d = &tr->gg.ops[c->op];
    float *din[2] = {NULL, NULL};
    for (int i = 0; i < d->n_in; i++) {
        if (c->in_grad[i] == RKM_GRAD_NONE) continue;
        din[i] = G_(tr, d->in[i]);
        if (c->in_grad[i] == RKM_GRAD_NEW) {
            /* Kernels accumulate: a new gradient starts at zero. */
            rkm_tensor_info ti;
            rkm_graph_tensor_info(tr->gg.g, d->in[i], &ti);
            cudaError_t e = cudaMemsetAsync(din[i], 0, (size_t)ti.bytes, tr->stream);
            if (e != cudaSuccess) return fail_cuda(tr, e, "zeroing a new gradient");
        }
    }
    if (!din[0] && !din[1] && d->weight < 0 && d->bias < 0) return 0; /* no gradient to make */
    if (!din[0] && d->kind != GPT2_RESIDUAL && d->kind != GPT2_ENCODER && d->kind != GPT2_LAYERNORM &&
        d->kind != GPT2_MATMUL)
        return fail_msg(tr, "backward of op %d: its input has no gradient", (int)c->op);
    return backward_kernel(tr, d, c->op, din);
}

/* grad(loss) = 1/(B*T) everywhere (the loss is the mean), and a copy of
 * the per-position losses for the report. */
static int cb_loss(void *user, const rkm_buffer_call *call)
{
    trainer *tr = (trainer *)user;
    int32_t t = call->index;
    size_t n = (size_t)tr->s.B * tr->s.T;
    fill_k<<<blocks_for(n, TPB), TPB, 0, tr->stream>>>(G_(tr, t), 1.0f / (float)n, n);
    if (launched(tr, "loss gradient")) return 1;
    cudaError_t e = cudaMemcpyAsync(tr->d_losses, T_(tr, t), n * sizeof(float), cudaMemcpyDeviceToDevice, tr->stream);
    return e == cudaSuccess ? 0 : fail_cuda(tr, e, "copying the losses");
}

static rkm_callbacks trainer_callbacks(trainer *tr)
{
    rkm_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.user = tr;
    cb.forward = cb_forward;
    cb.backward = cb_backward;
    cb.loss = cb_loss;
    return cb;
}

/* ===========================================================================
 * Setup: weights, batch, cuBLAS
 * ========================================================================= */

#define CK(call, what)                                                     \
    do {                                                                   \
        cudaError_t e_ = (call);                                           \
        if (e_ != cudaSuccess) return fail_cuda(tr, e_, what);             \
    } while (0)

/* Per token, the chain of its positions in order (for the deterministic
 * embedding gradient). */
static int prepare_chains(trainer *tr)
{
    int N = tr->s.B * tr->s.T, V = tr->s.V;
    int32_t *last = (int32_t *)malloc((size_t)V * sizeof(int32_t));
    int32_t *next = (int32_t *)malloc((size_t)N * sizeof(int32_t));
    int32_t *first = (int32_t *)malloc((size_t)N * sizeof(int32_t));
    if (!last || !next || !first) {
        free(last), free(next), free(first);
        snprintf(tr->err, sizeof tr->err, "out of host memory");
        return 1;
    }
    for (int v = 0; v < V; v++) last[v] = -1;
    tr->n_first = 0;
    for (int p = 0; p < N; p++) {
        int32_t tok = tr->h_tokens[p];
        next[p] = -1;
        if (last[tok] < 0) first[tr->n_first++] = p;
        else next[last[tok]] = p;
        last[tok] = p;
    }
    cudaError_t e = cudaMalloc((void **)&tr->d_first, (size_t)N * sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMalloc((void **)&tr->d_next, (size_t)N * sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMemcpy(tr->d_first, first, (size_t)tr->n_first * sizeof(int32_t), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(tr->d_next, next, (size_t)N * sizeof(int32_t), cudaMemcpyHostToDevice);
    free(last), free(next), free(first);
    return e == cudaSuccess ? 0 : fail_cuda(tr, e, "token chains");
}

static int trainer_init(trainer *tr, rkm_context *ctx, const gpt2_shape *shape, float dropout)
{
    memset(tr, 0, sizeof *tr);
    tr->s = *shape;
    tr->dropout = dropout;
    tr->seed = 1234;
    tr->key = 1;
    rkm_result r = gpt2_graph_build(ctx, shape, &tr->gg);
    if (r != RKM_OK) {
        snprintf(tr->err, sizeof tr->err, "graph: %s", rkm_context_errmsg(ctx));
        return 1;
    }
    if (gpt2_model_init(&tr->host_model, shape, tr->seed)) {
        snprintf(tr->err, sizeof tr->err, "weights: out of host memory");
        return 1;
    }
    size_t np = tr->host_model.num_params, N = (size_t)shape->B * shape->T, off = 0;
    /* A blocking stream: it waits for the synchronous copies (weights,
     * batch) made on the legacy default stream. */
    CK(cudaStreamCreate(&tr->stream), "stream");
    CK(cudaMalloc((void **)&tr->params, np * sizeof(float)), "parameters");
    CK(cudaMalloc((void **)&tr->grads, np * sizeof(float)), "parameter gradients");
    CK(cudaMalloc((void **)&tr->d_losses, N * sizeof(float)), "losses");
    CK(cudaMemcpy(tr->params, tr->host_model.params, np * sizeof(float), cudaMemcpyHostToDevice), "upload");
    for (int k = 0; k < GPT2_NUM_PARAMS; k++) {
        tr->p[k] = tr->params + off;
        tr->g[k] = tr->grads + off;
        off += tr->host_model.sizes[k];
    }
    /* A fixed batch: tokens from the generator, targets the next token. */
    tr->h_tokens = (int32_t *)malloc(N * sizeof(int32_t));
    tr->h_targets = (int32_t *)malloc(N * sizeof(int32_t));
    if (!tr->h_tokens || !tr->h_targets) return fail_msg(tr, "out of host memory");
    for (size_t i = 0; i < N; i++) tr->h_tokens[i] = (int32_t)(gpt2_mix(tr->seed * 31 + i) % (uint64_t)shape->V);
    for (size_t i = 0; i < N; i++) tr->h_targets[i] = tr->h_tokens[(i + 1) % N];
    if (prepare_chains(tr)) return 1;
    cublasStatus_t cs = cublasCreate(&tr->cublas);
    if (cs == CUBLAS_STATUS_SUCCESS) cs = cublasSetStream(tr->cublas, tr->stream);
    if (cs == CUBLAS_STATUS_SUCCESS) cs = cublasSetMathMode(tr->cublas, CUBLAS_PEDANTIC_MATH);
    if (cs != CUBLAS_STATUS_SUCCESS) return fail_cublas(tr, cs, "cuBLAS setup");
    /* A fixed cuBLAS workspace (outside the budget, like the weights). */
    tr->cublas_ws_bytes = 32u << 20;
    CK(cudaMalloc(&tr->cublas_ws, tr->cublas_ws_bytes), "cuBLAS workspace");
    cs = cublasSetWorkspace(tr->cublas, tr->cublas_ws, tr->cublas_ws_bytes);
    return cs == CUBLAS_STATUS_SUCCESS ? 0 : fail_cublas(tr, cs, "cuBLAS workspace");
}

static void trainer_free(trainer *tr)
{
    if (tr->cublas) cublasDestroy(tr->cublas);
    cudaFree(tr->cublas_ws);
    cudaFree(tr->params);
    cudaFree(tr->grads);
    cudaFree(tr->d_losses);
    cudaFree(tr->d_first);
    cudaFree(tr->d_next);
    if (tr->stream) cudaStreamDestroy(tr->stream);
    free(tr->h_tokens);
    free(tr->h_targets);
    gpt2_model_free(&tr->host_model);
    if (tr->gg.g) gpt2_graph_free(&tr->gg);
}

/* Copy the batch into the arena's input tensors. */
static int load_batch(trainer *tr)
{
    size_t bytes = (size_t)tr->s.B * tr->s.T * sizeof(int32_t);
    CK(cudaMemcpyAsync(rkm_cuda_tensor(tr->ca, tr->gg.tokens), tr->h_tokens, bytes, cudaMemcpyHostToDevice,
                       tr->stream),
       "tokens");
    CK(cudaMemcpyAsync(rkm_cuda_tensor(tr->ca, tr->gg.targets), tr->h_targets, bytes, cudaMemcpyHostToDevice,
                       tr->stream),
       "targets");
    CK(cudaStreamSynchronize(tr->stream), "loading the batch");
    return 0;
}

/* One training step (parameter gradients zeroed first) under plan. */
static int step(trainer *tr, const rkm_plan *plan)
{
    CK(cudaMemsetAsync(tr->grads, 0, tr->host_model.num_params * sizeof(float), tr->stream), "zero gradients");
    tr->err[0] = 0;
    rkm_result r = rkm_cuda_arena_run(tr->ca, plan);
    if (r != RKM_OK) {
        char host[sizeof tr->err];
        memcpy(host, tr->err, sizeof host); /* a callback's own reason, if any */
        return fail_msg(tr, "step: %s: %s%s%s", rkm_result_string(r), lib_msg(tr),
                        host[0] ? " / " : "", host);
    }
    return 0;
}

/* Run `steps` timed steps (after one warm-up) and return the trimmed mean
 * seconds per step; the loss and the gradients are those of the last. */
static int timed_steps(trainer *tr, const rkm_plan *plan, int steps, double *seconds)
{
    cudaEvent_t e0, e1;
    double *t = (double *)calloc((size_t)steps, sizeof(double));
    if (!t) return fail_msg(tr, "out of host memory");
    int rc = 0;
    CK(cudaEventCreate(&e0), "event");
    CK(cudaEventCreate(&e1), "event");
    for (int i = -1; i < steps && !rc; i++) {
        float ms = 0.0f;
        cudaError_t e = cudaEventRecord(e0, tr->stream);
        if (e == cudaSuccess) rc = step(tr, plan);
        if (!rc && e == cudaSuccess) e = cudaEventRecord(e1, tr->stream);
        if (!rc && e == cudaSuccess) e = cudaEventSynchronize(e1);
        if (!rc && e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
        if (!rc && e != cudaSuccess) rc = fail_cuda(tr, e, "timing a step");
        if (i >= 0) t[i] = ms * 1e-3;
    }
    *seconds = rkm_trimmed_mean(t, (size_t)steps, 0.2);
    free(t);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc;
}

/* Loss (mean, double, fixed order) and parameter gradients of the last step. */
static int fetch_results(trainer *tr, float *grads, double *loss, float *losses)
{
    size_t N = (size_t)tr->s.B * tr->s.T;
    CK(cudaStreamSynchronize(tr->stream), "step");
    CK(cudaMemcpy(grads, tr->grads, tr->host_model.num_params * sizeof(float), cudaMemcpyDeviceToHost), "gradients");
    CK(cudaMemcpy(losses, tr->d_losses, N * sizeof(float), cudaMemcpyDeviceToHost), "losses");
    double s = 0.0;
    for (size_t i = 0; i < N; i++) s += losses[i];
    *loss = s / (double)N;
    return 0;
}

/* ===========================================================================
 * Driver
 * ========================================================================= */

typedef struct options {
    gpt2_shape shape;
    float dropout;
    double budgets[16];
    int n_budgets;
    rkm_algo algo;
    int steps, profile_runs, check_cpu;
} options;

static int usage(const char *msg)
{
    fprintf(stderr,
            "gpt2_cuda: %s\nusage: gpt2_cuda [--preset tiny|124M] [--layers L] [--channels C] [--heads NH]\n"
            "       [--vocab V] [--batch B] [--seq T] [--dropout P] [--budgets 100,50,33,min]\n"
            "       [--algo rockmate|rotor|sqrt|none] [--steps N] [--profile-runs N] [--check-cpu]\n",
            msg);
    return 2;
}

static void preset(options *o, const char *name)
{
    gpt2_shape tiny = {2, 128, 4, 512, 2, 64, 0, 0};
    gpt2_shape gpt124 = {12, 768, 12, 50257, 8, 1024, 0, 0};
    o->shape = strcmp(name, "tiny") == 0 ? tiny : gpt124;
}

static int parse_budgets(options *o, const char *s)
{
    o->n_budgets = 0;
    while (*s && o->n_budgets < 16) {
        char *end;
        double v = strtod(s, &end);
        if (strncmp(s, "min", 3) == 0) { /* the planner's smallest budget */
            v = -1.0;
            end = (char *)s + 3;
        } else if (end == s || v <= 0.0) {
            return 0;
        }
        o->budgets[o->n_budgets++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return 0;
    }
    return o->n_budgets > 0;
}

/* ctx: for the library's name look-ups (their messages). */
static int parse(rkm_context *ctx, options *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    preset(o, "124M");
    parse_budgets(o, "100,50,33");
    o->algo = RKM_ALGO_ROCKMATE;
    o->steps = 5;
    o->profile_runs = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--check-cpu") == 0) {
            o->check_cpu = 1;
            continue;
        }
        if (!v || strncmp(a, "--", 2) != 0) return usage("unknown option, or an option without its value");
        i++;
        if (strcmp(a, "--preset") == 0) {
            if (strcmp(v, "tiny") && strcmp(v, "124M")) return usage("--preset is tiny or 124M");
            preset(o, v);
        } else if (strcmp(a, "--layers") == 0) o->shape.L = atoi(v);
        else if (strcmp(a, "--channels") == 0) o->shape.C = atoi(v);
        else if (strcmp(a, "--heads") == 0) o->shape.NH = atoi(v);
        else if (strcmp(a, "--vocab") == 0) o->shape.V = atoi(v);
        else if (strcmp(a, "--batch") == 0) o->shape.B = atoi(v);
        else if (strcmp(a, "--seq") == 0) o->shape.T = atoi(v);
        else if (strcmp(a, "--dropout") == 0) o->dropout = (float)atof(v);
        else if (strcmp(a, "--steps") == 0) o->steps = atoi(v);
        else if (strcmp(a, "--profile-runs") == 0) o->profile_runs = atoi(v);
        else if (strcmp(a, "--algo") == 0) {
            if (rkm_algo_from_name(ctx, v, &o->algo) != RKM_OK) return usage(rkm_context_errmsg(ctx));
        } else if (strcmp(a, "--budgets") == 0) {
            if (!parse_budgets(o, v)) return usage("--budgets: percentages or min, comma separated");
        } else {
            return usage("unknown option");
        }
    }
    o->shape.dropout = o->dropout > 0.0f;
    if (!gpt2_shape_ok(&o->shape) || o->dropout < 0.0f || o->dropout >= 1.0f || o->steps < 1 ||
        o->profile_runs < 1)
        return usage("bad shape, dropout, steps or profile runs");
    return 0;
}

/* Profile the baseline through a measuring arena: event times and
 * workspaces make a new graph (graphs are immutable), which replaces
 * tr->gg.g: same ids, so gg.ops and the callbacks serve it unchanged, and
 * every plan from here on is made on the measured costs. */
static int profile(trainer *tr, const options *o)
{
    rkm_plan *base = NULL;
    rkm_arena_layout_info lay;
    rkm_result r = rkm_plan_baseline(tr->gg.g, &base);
    if (r == RKM_OK) r = rkm_arena_layout(base, &lay);
    rkm_plan_destroy(base);
    if (r != RKM_OK) return fail_msg(tr, "baseline layout: %s", lib_msg(tr));
    /* The declared workspaces are a guess: leave room for more. */
    rkm_callbacks cb = trainer_callbacks(tr);
    rkm_cuda_arena_desc d;
    memset(&d, 0, sizeof d);
    d.graph = tr->gg.g;
    d.capacity = lay.capacity + lay.capacity / 4 + (64u << 20);
    d.measure = 1;
    d.host = &cb;
    d.stream = tr->stream;
    if ((r = rkm_cuda_arena_create(&d, &tr->ca)) != RKM_OK) return fail_msg(tr, "profiling arena: %s", lib_msg(tr));
    int rc = load_batch(tr);
    rkm_cuda_profile_desc pd = {o->profile_runs, 1, 0.2};
    rkm_cuda_profile_result pr;
    rkm_graph *profiled = NULL;
    if (!rc && (r = rkm_cuda_profile(tr->ca, &pd, &pr, &profiled)) != RKM_OK)
        rc = fail_msg(tr, "profile: %s: %s", rkm_result_string(r), lib_msg(tr));
    if (!rc)
        printf("profile: %d runs, baseline step %.3f ms (events around the step), sum of op times %.3f ms, "
               "measured peak %.1f MiB\n",
               o->profile_runs, pr.step_seconds * 1e3, pr.sum_op_seconds * 1e3, (double)pr.peak / 1048576.0);
    rkm_cuda_arena_destroy(tr->ca); /* before its graph */
    tr->ca = NULL;
    if (profiled) {
        rkm_graph_destroy(tr->gg.g);
        tr->gg.g = profiled;
    }
    return rc;
}

typedef struct reference {
    float *grads, *losses;
    double loss, step_seconds, sim_time;
} reference;

typedef struct outcome {
    uint64_t sim_peak, measured_peak, arena_bytes;
    double sim_time, step_seconds, loss;
    int grads_equal, loss_equal;
} outcome;

/* Run `plan` on an exact arena: timings, the last step's loss and
 * gradients (into grads/losses). */
static int run_plan(trainer *tr, const rkm_plan *plan, int steps, float *grads, float *losses, outcome *out)
{
    rkm_callbacks cb = trainer_callbacks(tr);
    rkm_arena_layout_info lay;
    rkm_plan_stats ps; /* the plan's figures, fixed at its birth */
    if (rkm_plan_stats_get(plan, &ps) != RKM_OK) return fail_msg(tr, "plan: %s", lib_msg(tr));
    if (rkm_cuda_arena_create_for_plan(plan, &cb, tr->stream, &tr->ca, &lay) != RKM_OK)
        return fail_msg(tr, "arena: %s", lib_msg(tr));
    int rc = load_batch(tr);
    if (!rc) rc = timed_steps(tr, plan, steps, &out->step_seconds);
    if (!rc) rc = fetch_results(tr, grads, &out->loss, losses);
    rkm_arena_stats st;
    rkm_cuda_arena_stats(tr->ca, &st);
    out->sim_peak = ps.peak;
    out->sim_time = ps.time;
    out->measured_peak = st.peak;
    out->arena_bytes = lay.capacity;
    rkm_cuda_arena_destroy(tr->ca);
    tr->ca = NULL;
    return rc;
}

static void print_row(const char *label, const outcome *o, const reference *ref)
{
    printf("%-9s %12.1f %12.1f %10.1f %10.3f %+9.2f%% %+9.2f%%  %.6f  %s\n", label,
           (double)o->measured_peak / 1048576.0, (double)o->sim_peak / 1048576.0,
           (double)o->arena_bytes / 1048576.0, o->step_seconds * 1e3, 100.0 * (o->sim_time / ref->sim_time - 1.0),
           100.0 * (o->step_seconds / ref->step_seconds - 1.0), o->loss,
           o->grads_equal && o->loss_equal ? "identical" : "DIFFERENT");
}

/* Loss and gradients of the CPU reference on the same weights and batch,
 * compared with a tolerance (different summation orders). */
static int check_cpu(trainer *tr, const reference *ref)
{
    gpt2_step st;
    rkm_plan *base;
    if (gpt2_step_init(&st, &tr->gg, &tr->host_model, tr->dropout, tr->seed)) return -1;
    if (rkm_plan_baseline(tr->gg.g, &base) != RKM_OK) return -1;
    int bad = gpt2_step_load(&st, tr->h_tokens, tr->h_targets) != 0;
    if (!bad) bad = gpt2_step_run(&st, base, tr->key) != RKM_OK;
    double max_ref = 0.0, max_diff = 0.0;
    for (size_t i = 0; !bad && i < tr->host_model.num_params; i++) {
        double c = tr->host_model.grads[i], gdiff = fabs((double)ref->grads[i] - c);
        if (fabs(c) > max_ref) max_ref = fabs(c);
        if (gdiff > max_diff) max_diff = gdiff;
    }
    double ldiff = fabs(st.loss - ref->loss) / fabs(st.loss);
    int ok = !bad && ldiff < 1e-4 && max_diff <= 1e-3 * max_ref;
    printf("cpu check: loss cpu %.6f gpu %.6f (rel diff %.2e); gradients max |gpu-cpu| %.3e vs max |cpu| %.3e: %s\n",
           st.loss, ref->loss, ldiff, max_diff, max_ref, ok ? "ok" : "MISMATCH");
    gpt2_step_unload(&st);
    gpt2_step_free(&st);
    rkm_plan_destroy(base);
    return ok ? 0 : 1;
}

static int run_budgets(trainer *tr, const options *o, reference *ref, float *grads, float *losses, int *failed)
{
    rkm_solve_desc sd;
    rkm_planner *pl;
    memset(&sd, 0, sizeof sd);
    sd.algo = o->algo;
    rkm_result r = rkm_planner_create(tr->gg.g, &sd, &pl);
    if (r != RKM_OK) return fail_msg(tr, "planner: %s", lib_msg(tr));
    uint64_t base_peak = 0;
    rkm_graph_stats gs;
    if (rkm_graph_stats_get(tr->gg.g, &gs) == RKM_OK) base_peak = gs.baseline_peak;
    int rc = 0;
    for (int i = 0; i < o->n_budgets && !rc; i++) {
        uint64_t budget = (uint64_t)((double)base_peak * o->budgets[i] / 100.0);
        rkm_plan *plan = NULL;
        char label[32];
        snprintf(label, sizeof label, "%g%%", o->budgets[i]);
        if (o->budgets[i] < 0.0) {
            if ((r = rkm_planner_min_budget(pl, &budget)) != RKM_OK) {
                rc = fail_msg(tr, "smallest budget: %s", lib_msg(tr));
                break;
            }
            snprintf(label, sizeof label, "min %.0f%%", 100.0 * (double)budget / (double)base_peak);
        }
        r = rkm_planner_solve(pl, budget, &plan);
        if (r == RKM_ERROR_BUDGET) {
            printf("%-9s no %s plan fits: %s\n", label, rkm_algo_name(o->algo), lib_msg(tr));
            continue;
        }
        if (r != RKM_OK) {
            rc = fail_msg(tr, "plan at %s: %s", label, lib_msg(tr));
            break;
        }
        outcome oc;
        memset(&oc, 0, sizeof oc);
        rc = run_plan(tr, plan, o->steps, grads, losses, &oc);
        if (!rc) {
            size_t n = (size_t)tr->s.B * tr->s.T;
            oc.grads_equal = memcmp(grads, ref->grads, tr->host_model.num_params * sizeof(float)) == 0;
            oc.loss_equal = memcmp(losses, ref->losses, n * sizeof(float)) == 0;
            print_row(label, &oc, ref);
            if (!oc.grads_equal || !oc.loss_equal || oc.measured_peak != oc.sim_peak || oc.sim_peak > budget)
                *failed = 1;
        }
        rkm_plan_destroy(plan);
    }
    rkm_planner_destroy(pl);
    return rc;
}

static int run_all(trainer *tr, const options *o, int *failed)
{
    size_t np = tr->host_model.num_params, N = (size_t)tr->s.B * tr->s.T;
    reference ref;
    memset(&ref, 0, sizeof ref);
    float *grads = (float *)malloc(np * sizeof(float)), *losses = (float *)malloc(N * sizeof(float));
    ref.grads = (float *)malloc(np * sizeof(float));
    ref.losses = (float *)malloc(N * sizeof(float));
    int rc = !grads || !losses || !ref.grads || !ref.losses;
    if (rc) snprintf(tr->err, sizeof tr->err, "out of host memory");
    if (!rc) rc = profile(tr, o);
    rkm_plan *base = NULL;
    outcome bo;
    memset(&bo, 0, sizeof bo);
    if (!rc && rkm_plan_baseline(tr->gg.g, &base) != RKM_OK)
        rc = fail_msg(tr, "baseline: %s", lib_msg(tr));
    if (!rc) rc = run_plan(tr, base, o->steps, ref.grads, ref.losses, &bo);
    if (!rc) {
        ref.loss = bo.loss;
        ref.step_seconds = bo.step_seconds;
        ref.sim_time = bo.sim_time;
        bo.grads_equal = bo.loss_equal = 1;
        printf("%-9s %12s %12s %10s %10s %10s %10s  %-8s  %s\n", "budget", "meas MiB", "sim MiB", "arena MiB",
               "step ms", "pred ovh", "meas ovh", "loss", "grads+loss vs baseline");
        print_row("baseline", &bo, &ref);
        if (bo.measured_peak != bo.sim_peak) *failed = 1;
    }
    if (!rc && o->check_cpu) {
        int c = check_cpu(tr, &ref);
        if (c < 0) rc = fail_msg(tr, "cpu check: setup failed");
        else if (c > 0) *failed = 1;
    }
    if (!rc) rc = run_budgets(tr, o, &ref, grads, losses, failed);
    rkm_plan_destroy(base);
    free(grads), free(losses), free(ref.grads), free(ref.losses);
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    rkm_context *ctx;
    if (rkm_context_create(NULL, &ctx) != RKM_OK) return 3;
    int u = parse(ctx, &o, argc, argv);
    if (u) {
        rkm_context_destroy(ctx);
        return u;
    }
    trainer tr;
    int failed = 0;
    printf("gpt2_cuda: L=%d C=%d NH=%d V=%d B=%d T=%d dropout=%g algo=%s\n", o.shape.L, o.shape.C, o.shape.NH,
           o.shape.V, o.shape.B, o.shape.T, (double)o.dropout, rkm_algo_name(o.algo));
    int rc = trainer_init(&tr, ctx, &o.shape, o.dropout);
    if (!rc) rc = run_all(&tr, &o, &failed);
    if (rc) fprintf(stderr, "gpt2_cuda: %s\n", tr.err);
    trainer_free(&tr);
    rkm_context_destroy(ctx);
    if (rc) return 3;
    printf("gpt2_cuda: %s\n", failed ? "CHECK FAILED" : "all checks passed");
    return failed ? 1 : 0;
}
