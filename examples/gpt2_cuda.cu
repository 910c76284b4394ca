/* gpt2_cuda.cu -- GPT-2 (llm.c's layout, fp32) trained on one GPU through
 * rockmate: the graph of examples/gpt2_graph.h, cuBLAS for the matmuls and
 * plain kernels for the rest, every activation buffer carved from a
 * rockmate device arena (cuda/rockmate_cuda.h).
 *
 * What it does: profile the baseline step on the GPU (event times and
 * workspaces make a new graph, which every plan below is made on), run the
 * baseline plan, then for each budget plan with the chosen algorithm (the
 * library's default: rockmate, without its ILP options in a build without lp_solve) and
 * run the plan, and print per budget the measured peak (the arena's, in
 * the contract's bytes), the simulated peak, the arena (the device region
 * the plan's layout reserves), the measured step time, the predicted and
 * measured overhead, and the gradient check: the loss and every parameter
 * gradient compared bit for bit with the baseline plan's on the same GPU.
 * A line "result LABEL: budget=... arena=..." repeats each row in bytes.
 *
 * Determinism (what makes the bitwise check meaningful): one stream; cuBLAS
 * in CUBLAS_PEDANTIC_MATH (no TF32, no reduced precision) with a fixed
 * workspace; no atomics anywhere: every reduction has a fixed order (warp
 * shuffles, fixed shared-memory trees, sequential chains), the embedding
 * gradient sums each token's positions along a chain prepared on the host.
 * A recomputed forward therefore reproduces its output bit for bit. A
 * gradient with two contributors (the residual stream's: a layernorm's
 * backward and a residual's) is g = 0 + a + b in the order the plan runs
 * the two backwards; that is a + b either way only if each `+=` rounds the
 * product before the sum. nvcc's default -fmad=true fuses `g += x * s`
 * into one FMA (round(x*s + g)), and then the order changes the bits: the
 * baseline and a plan agree only because this graph happens to force one
 * order. The Makefile builds the CUDA sources with -fmad=false (as the C
 * code with -ffp-contract=off), so that any valid plan gives the baseline's
 * bits whatever the order.
 *
 * In place (--inplace 1, RKM_OP_GRAD_INPLACE on GELU and the residual
 * adds): a backward run in place writes grad(in[0]) over grad(out)'s
 * buffer, so its kernel writes 0 + contribution there instead of adding
 * into it (residual_bwd_k, gelu_bwd_k).
 *
 *   gpt2_cuda [--preset tiny|124M] [--layers L] [--channels C] [--heads NH]
 *             [--vocab V] [--batch B] [--seq T] [--dropout P] [--inplace 0|1]
 *             [--budgets 100,50,33,min] [--algo rockmate|rotor|sqrt|dtr|none]
 *             [--steps N] [--warmup N] [--profile-runs N]
 *             [--check-cpu] [--check-perturb PARAM] [--poison] [--check-arena] [--copy BW]
 *
 * --copy BW gives the (profiled) graph a copy link of BW bytes a second each
 * way: rockmate may then offload activations and saved states to pinned
 * host memory and prefetch them back. The arena makes those copies itself
 * (cuda/rockmate_cuda.h, "Offloading": two copy streams and events, no
 * host code), and the gradient check holds them to the baseline's bits.
 *
 * --steps timed steps per plan after --warmup untimed ones (5 and 1; the
 * profile warms up as many); --profile-runs 0 plans on the graph's own
 * FLOP-count guesses instead of measured costs. --check-cpu also runs the CPU reference
 * (examples/gpt2_model.h) on the same weights and batch and compares the
 * loss and each parameter tensor's gradient at the tensor's own scale
 * (tolerance: fp32 summation orders differ); --check-perturb PARAM moves
 * one gradient of that tensor (wte, ..., lnfb) before the comparison, which
 * must then fail (a test of the check). --poison fills every buffer a plan
 * releases with NaNs (rkm_cuda_arena_desc.poison), so that a kernel that
 * reads one after its free shows in the gradients. --check-arena fails a
 * plan whose arena exceeds its budget.
 *
 * Profiling the tiny preset times mostly the CPU: its kernels are shorter
 * than their launches, and the profile line says so ("launch-bound", see
 * cuda/rockmate_cuda.h); plans on it are planned on launch gaps.
 *
 * Exit status: 0 all checks passed, 1 a check failed, 2 bad usage, 3 an
 * error (CUDA, planning).
 *
 * Stage mode: built with -DGPT2_CUDA_MPI (make cuda: build/gpt2_cuda_mpi;
 * on the dummy device build/tests/gpt2_cuda_pipe_dummy), this file is the
 * pipeline trainer of examples/gpt2_cuda_pipe.cuh instead: one MPI rank per
 * stage, the same kernels on each stage's buffers, NCCL or MPI between
 * ranks (that file's header says more). */
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
#include "args.h"
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

/* Column sums over N rows in two passes, every sum in a fixed order (no
 * atomics): colsum_part_k, on blocks of 32x32 threads, each block 32
 * columns of one chunk of rows (strided partial sums per thread, then the
 * 32 partials in order), writes pb[chunk][c] = sum of dout[r,c] over the
 * chunk's rows and, with x, pw[chunk][c] = sum of norm(r,c) * dout[r,c]
 * (layernorm's weight gradient); colsum_sum_k adds the chunks' partials
 * in chunk order into db (and dw). Rows cut into up to 16 chunks so that
 * C = 768 makes 384 blocks rather than 24 (one chunk left 108 of an H200's
 * 132 SMs idle). */
#define COLSUM_CHUNKS 16

static int colsum_rows_per_chunk(int N)
{
    int r = (N + COLSUM_CHUNKS - 1) / COLSUM_CHUNKS;
    return r > 32 ? r : 32;
}

__global__ void colsum_part_k(float *pb, float *pw, const float *dout, const float *x, const float *mean,
                              const float *rstd, int N, int C, int rows_per_chunk)
{
    __shared__ float sb[32][33], sw[32][33];
    int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx;
    int r0 = blockIdx.y * rows_per_chunk, r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
    float b = 0.0f, w = 0.0f;
    if (c < C)
        for (int r = r0 + ty; r < r1; r += 32) {
            float d = dout[(size_t)r * C + c];
            b += d;
            if (pw) w += ((x[(size_t)r * C + c] - mean[r]) * rstd[r]) * d;
        }
    sb[ty][tx] = b;
    sw[ty][tx] = w;
    __syncthreads();
    if (ty != 0 || c >= C) return;
    float tb = 0.0f, tw = 0.0f;
    for (int k = 0; k < 32; k++) {
        tb += sb[k][tx];
        tw += sw[k][tx];
    }
    pb[(size_t)blockIdx.y * C + c] = tb;
    if (pw) pw[(size_t)blockIdx.y * C + c] = tw;
}

__global__ void colsum_sum_k(float *db, float *dw, const float *pb, const float *pw, int chunks, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float tb = 0.0f, tw = 0.0f;
    for (int k = 0; k < chunks; k++) {
        tb += pb[(size_t)k * C + c];
        if (dw) tw += pw[(size_t)k * C + c];
    }
    db[c] += tb;
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

/* da += dout, db += dout. In place (inplace: da is dout's buffer, grad(a)
 * a new gradient there) da becomes 0 + dout, the value `+=` gives on a
 * zeroed buffer, bit for bit (-0 included), after db has read dout. */
__global__ void residual_bwd_k(float *da, float *db, const float *dout, size_t n, int inplace)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float d = dout[i];
    if (db) db[i] += d;
    if (da) da[i] = (inplace ? 0.0f : da[i]) + d;
}

#define GELU_K 0.7978845608028654f

__global__ void gelu_fwd_k(float *out, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    out[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + 0.044715f * v * v * v)));
}

/* dinp += g * dout; in place (dinp is dout's buffer) dinp = 0 + g * dout,
 * each element read before it is written by the same thread. */
__global__ void gelu_bwd_k(float *dinp, const float *x, const float *dout, size_t n, int inplace)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i], u = GELU_K * (v + 0.044715f * v * v * v);
    float th = tanhf(u), ch = coshf(u), sech2 = 1.0f / (ch * ch);
    float g = 0.5f * (1.0f + th) + v * 0.5f * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
    float d = g * dout[i];
    dinp[i] = (inplace ? 0.0f : dinp[i]) + d;
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
    /* Stage mode (gpt2_cuda_pipe.cuh): the running micro-batch's buffers by
     * whole-graph id and its call's workspace, placed by the stage's own
     * callbacks in the stage's region; st_act NULL: the arena's. */
    void **st_act, **st_grad, **st_saved;
    unsigned char *st_ws;
    uint64_t st_ws_bytes, st_ws_used;
    /* The pipeline's reference: lm_head's part of wte's gradient apart (the
     * last stage's); NULL: into wte's, with the encoder's. */
    float *head_wte;
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
    snprintf(tr->err, sizeof tr->err, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
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

static float *T_(trainer *tr, int32_t t) { return (float *)(tr->st_act ? tr->st_act[t] : rkm_cuda_tensor(tr->ca, t)); }
static float *G_(trainer *tr, int32_t t) { return (float *)(tr->st_act ? tr->st_grad[t] : rkm_cuda_grad(tr->ca, t)); }
static void *S_(trainer *tr, int32_t op) { return tr->st_act ? tr->st_saved[op] : rkm_cuda_saved(tr->ca, op); }

/* Workspace inside a call: the arena's, or in stage mode carved from the
 * call's workspace buffer, each piece rounded up to 256 bytes as the arena
 * counts scratch (so a profiled workspace holds them). */
static rkm_result scratch(trainer *tr, uint64_t bytes, void **ptr)
{
    if (!tr->st_act) return rkm_cuda_scratch(tr->ca, bytes, ptr);
    uint64_t b = (bytes + 255) / 256 * 256;
    if (b > tr->st_ws_bytes - tr->st_ws_used) return RKM_ERROR_NOMEM;
    *ptr = tr->st_ws + tr->st_ws_used;
    tr->st_ws_used += b;
    return RKM_OK;
}

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
        void *att = S_(tr, op);
        if (!att && scratch(tr, scores_bytes(s), &att) != RKM_OK) {
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

/* In place (RKM_OUT_INPLACE) the output is the input's buffer: the
 * elementwise kernels (each thread reads its element before it writes it)
 * run so as they are; the others cannot, and no graph here declares them
 * in place (RKM_OP_INPLACE). */
static int cb_forward(void *user, const rkm_fwd_call *c)
{
    trainer *tr = (trainer *)user;
    const gpt2_opdef *d = &tr->gg.ops[c->op];
    if (c->out_new[0] == RKM_OUT_INPLACE && d->kind != GPT2_RESIDUAL && d->kind != GPT2_GELU &&
        d->kind != GPT2_DROPOUT)
        return fail_msg(tr, "forward of op %d in place: its kernel cannot run in place", (int)c->op);
    float *ph = c->save ? (float *)S_(tr, c->op) : NULL;
    return forward_kernel(tr, d, c->op, T_(tr, d->out), ph);
}

/* db (and, with x, layernorm's dw) += the column sums of dout (N x C), the
 * partial sums in the call's workspace. */
static int colsum(trainer *tr, float *db, float *dw, const float *dout, const float *x, const float *mean,
                  const float *rstd, int N, int C)
{
    int rows = colsum_rows_per_chunk(N), chunks = (N + rows - 1) / rows;
    void *ws;
    uint64_t bytes = (uint64_t)chunks * (uint64_t)C * sizeof(float) * (dw ? 2u : 1u);
    if (scratch(tr, bytes, &ws) != RKM_OK) return fail_msg(tr, "column sums: no workspace");
    float *pb = (float *)ws, *pw = dw ? pb + (size_t)chunks * C : NULL;
    colsum_part_k<<<dim3(blocks_for((size_t)C, 32), (unsigned)chunks), dim3(32, 32), 0, tr->stream>>>(
        pb, pw, dout, x, mean, rstd, N, C, rows);
    if (launched(tr, "column sums")) return 1;
    colsum_sum_k<<<blocks_for((size_t)C, TPB), TPB, 0, tr->stream>>>(db, dw, pb, pw, chunks, C);
    return launched(tr, "column sums");
}

/* inplace: din[0] is grad(out)'s buffer (RKM_GRAD_INPLACE), to be written
 * over, not added into. */
static int backward_kernel(trainer *tr, const gpt2_opdef *d, int32_t op, float *const din[2], int inplace)
{
    const gpt2_shape *s = &tr->s;
    int N = s->B * s->T;
    size_t n = (size_t)d->n;
    float *dout = G_(tr, d->out), *x = T_(tr, d->in[0]), *ph = (float *)S_(tr, op);
    float *w = param_at(tr, tr->p, d->weight, d->layer);
    float *dw = param_at(tr, tr->g, d->weight, d->layer), *db = param_at(tr, tr->g, d->bias, d->layer);
    if (tr->head_wte && d->kind == GPT2_MATMUL && d->weight == GPT2_WTE) dw = tr->head_wte;
    cudaStream_t st = tr->stream;
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
        return colsum(tr, db, dw, dout, x, ph, ph + N, N, s->C);
    case GPT2_MATMUL: {
        cublasStatus_t cs = mm_bwd(tr, din[0], dw, dout, x, w, N, d->n, d->m);
        if (cs != CUBLAS_STATUS_SUCCESS) return fail_cublas(tr, cs, "matmul backward");
        if (db) return colsum(tr, db, NULL, dout, NULL, NULL, NULL, N, d->m);
        break;
    }
    case GPT2_ATTENTION: {
        void *ws;
        uint64_t sb = scores_bytes(s);
        if (scratch(tr, 2 * sb, &ws) != RKM_OK) {
            snprintf(tr->err, sizeof tr->err, "attention backward: no workspace");
            return 1;
        }
        if (attention_bwd(tr, din[0], (float *)ws, (float *)ws + sb / 4, dout, x, ph)) return 1;
        break;
    }
    case GPT2_RESIDUAL:
        residual_bwd_k<<<blocks_for(n, TPB), TPB, 0, st>>>(din[0], din[1], dout, n, inplace);
        break;
    case GPT2_GELU: gelu_bwd_k<<<blocks_for(n, TPB), TPB, 0, st>>>(din[0], x, dout, n, inplace); break;
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
    /* In place grad(in[0]) is grad(out)'s buffer (the arena hands it over
     * for the call): neither zeroed nor added into, but written. Only
     * GELU's and the residual's kernels know how (RKM_OP_GRAD_INPLACE). */
    int inplace = d->n_in > 0 && c->in_grad[0] == RKM_GRAD_INPLACE;
    if (inplace && d->kind != GPT2_RESIDUAL && d->kind != GPT2_GELU)
        return fail_msg(tr, "backward of op %d in place: its kernel cannot run in place", (int)c->op);
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
    return backward_kernel(tr, d, c->op, din, inplace);
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

/* The graph with the backward workspaces these kernels take: the column
 * sums' partials (layernorm, matmul with a bias) besides attention's, each
 * rounded up to 256 bytes as the arena counts scratch. The graph of
 * gpt2_graph.h declares the CPU kernels' (graphs are immutable: a new one). */
static rkm_result cuda_workspaces(trainer *tr)
{
    int32_t n = rkm_graph_num_ops(tr->gg.g);
    int N = tr->s.B * tr->s.T, chunks = (N + colsum_rows_per_chunk(N) - 1) / colsum_rows_per_chunk(N);
    rkm_op_costs *c = (rkm_op_costs *)calloc((size_t)n, sizeof *c);
    rkm_graph *g = NULL;
    if (!c) return RKM_ERROR_NOMEM;
    rkm_result r = RKM_OK;
    for (int32_t op = 0; op < n && r == RKM_OK; op++) {
        rkm_op_desc od;
        const gpt2_opdef *d = &tr->gg.ops[op];
        if ((r = rkm_graph_op_info(tr->gg.g, op, &od)) != RKM_OK) break;
        c[op].fwd_seconds = od.fwd_seconds;
        c[op].bwd_seconds = od.bwd_seconds;
        c[op].fwd_ws = od.fwd_ws;
        c[op].bwd_ws = od.bwd_ws;
        uint64_t cols = d->kind == GPT2_LAYERNORM ? 2u * (uint64_t)tr->s.C
                        : d->kind == GPT2_MATMUL && d->bias >= 0 ? (uint64_t)d->m : 0u;
        if (cols) c[op].bwd_ws = ((uint64_t)chunks * cols * sizeof(float) + 255) / 256 * 256;
    }
    if (r == RKM_OK) r = rkm_graph_with_costs(tr->gg.g, c, &g);
    free(c);
    if (r != RKM_OK) return r;
    rkm_graph_destroy(tr->gg.g);
    tr->gg.g = g; /* same ids: gg.ops serves it */
    return RKM_OK;
}

static int trainer_init(trainer *tr, rkm_context *ctx, const gpt2_shape *shape, float dropout)
{
    memset(tr, 0, sizeof *tr);
    tr->s = *shape;
    tr->dropout = dropout;
    tr->seed = 1234;
    tr->key = 1;
    rkm_result r = gpt2_graph_build(ctx, shape, &tr->gg);
    if (r == RKM_OK) r = cuda_workspaces(tr);
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
    /* A fixed batch: tokens from the generator, targets the next token; in
     * pinned memory, which the stream's copies read when they run (a
     * pageable source would be staged by the CPU at every copy). */
    CK(cudaMallocHost((void **)&tr->h_tokens, N * sizeof(int32_t)), "pinned batch");
    CK(cudaMallocHost((void **)&tr->h_targets, N * sizeof(int32_t)), "pinned batch");
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
    cudaFreeHost(tr->h_tokens);
    cudaFreeHost(tr->h_targets);
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

/* A failure of rockmate's (the arena's included): its result and message,
 * and the callback's own reason (a CUDA error) when one failed. */
static int fail_lib(trainer *tr, const char *what, rkm_result r)
{
    char host[sizeof tr->err];
    memcpy(host, tr->err, sizeof host);
    return fail_msg(tr, "%s: %s: %s%s%s", what, rkm_result_string(r), lib_msg(tr), host[0] ? " / " : "", host);
}

/* One training step (parameter gradients zeroed first) under plan. */
static int step(trainer *tr, const rkm_plan *plan)
{
    CK(cudaMemsetAsync(tr->grads, 0, tr->host_model.num_params * sizeof(float), tr->stream), "zero gradients");
    tr->err[0] = 0;
    rkm_result r = rkm_cuda_arena_run(tr->ca, plan);
    return r == RKM_OK ? 0 : fail_lib(tr, "step", r);
}

/* Run `steps` timed steps (after `warmup` untimed ones) and return the
 * trimmed mean seconds per step; the loss and the gradients are those of
 * the last. */
static int timed_steps(trainer *tr, const rkm_plan *plan, int warmup, int steps, double *seconds)
{
    cudaEvent_t e0, e1;
    int have0 = 0, have1 = 0, rc = 0;
    double *t = (double *)calloc((size_t)steps, sizeof(double));
    if (!t) return fail_msg(tr, "out of host memory");
    cudaError_t e = cudaEventCreate(&e0);
    have0 = e == cudaSuccess;
    if (have0) {
        e = cudaEventCreate(&e1);
        have1 = e == cudaSuccess;
    }
    if (e != cudaSuccess) rc = fail_cuda(tr, e, "creating the step's events");
    for (int i = -warmup; i < steps && !rc; i++) {
        float ms = 0.0f;
        e = cudaEventRecord(e0, tr->stream);
        if (e == cudaSuccess) rc = step(tr, plan);
        if (!rc && e == cudaSuccess) e = cudaEventRecord(e1, tr->stream);
        if (!rc && e == cudaSuccess) e = cudaEventSynchronize(e1);
        if (!rc && e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
        if (!rc && e != cudaSuccess) rc = fail_cuda(tr, e, "timing a step");
        if (i >= 0) t[i] = ms * 1e-3;
    }
    *seconds = rc ? 0.0 : rkm_trimmed_mean(t, (size_t)steps, 0.2);
    free(t);
    if (have0) cudaEventDestroy(e0);
    if (have1) cudaEventDestroy(e1);
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
    int steps, warmup, profile_runs, check_cpu, poison, check_arena;
    int perturb; /* --check-perturb: the parameter tensor, -1 none */
    double copy_bw; /* --copy: bytes a second each way to pinned host memory; 0: no copy link */
} options;

/* Parameter tensors by name, in gpt2_param's order (--check-perturb, the
 * CPU check's report). */
static const char *const PARAM_NAMES[GPT2_NUM_PARAMS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

static int usage(const char *msg)
{
    fprintf(stderr,
            "gpt2_cuda: %s\nusage: gpt2_cuda [--preset tiny|124M] [--layers L] [--channels C] [--heads NH]\n"
            "       [--vocab V] [--batch B] [--seq T] [--dropout P] [--inplace 0|1] [--budgets 100,50,33,min]\n"
            "       [--algo rockmate|rotor|sqrt|dtr|none] [--steps N] [--warmup N] [--profile-runs N]\n"
            "       [--check-cpu] [--check-perturb PARAM] [--poison] [--check-arena] [--copy BW]\n",
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
    o->algo = RKM_ALGO_DEFAULT; /* rockmate (without its ILP options in a build without lp_solve) */
    o->steps = 5;
    o->warmup = 1;
    o->profile_runs = 5;
    o->perturb = -1;
    int inplace = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *flag = strcmp(a, "--check-cpu") == 0 ? &o->check_cpu : strcmp(a, "--poison") == 0 ? &o->poison
                  : strcmp(a, "--check-arena") == 0 ? &o->check_arena : NULL;
        if (flag) {
            *flag = 1;
            continue;
        }
        if (!v || strncmp(a, "--", 2) != 0) return usage("unknown option, or an option without its value");
        i++;
        if (strcmp(a, "--preset") == 0) {
            if (strcmp(v, "tiny") && strcmp(v, "124M")) return usage("--preset is tiny or 124M");
            preset(o, v);
            continue;
        }
        int *n = !strcmp(a, "--layers") ? &o->shape.L : !strcmp(a, "--channels") ? &o->shape.C
               : !strcmp(a, "--heads") ? &o->shape.NH : !strcmp(a, "--vocab") ? &o->shape.V
               : !strcmp(a, "--batch") ? &o->shape.B : !strcmp(a, "--seq") ? &o->shape.T
               : !strcmp(a, "--steps") ? &o->steps : !strcmp(a, "--warmup") ? &o->warmup
               : !strcmp(a, "--profile-runs") ? &o->profile_runs : NULL;
        double x;
        if (n) {
            if (!arg_int(v, 0, INT_MAX, n)) return usage("a shape, --steps, --warmup, --profile-runs: a whole number");
        } else if (strcmp(a, "--dropout") == 0) {
            if (!arg_double(v, &x)) return usage("--dropout: a decimal number");
            o->dropout = (float)x;
        } else if (strcmp(a, "--inplace") == 0 && (!strcmp(v, "0") || !strcmp(v, "1"))) inplace = !strcmp(v, "1");
        else if (strcmp(a, "--copy") == 0) {
            if (!arg_double(v, &o->copy_bw) || !(o->copy_bw > 0)) return usage("--copy: bytes per second, a positive number");
        } else if (strcmp(a, "--algo") == 0) {
            if (rkm_algo_from_name(ctx, v, &o->algo) != RKM_OK) return usage(rkm_context_errmsg(ctx));
        } else if (strcmp(a, "--budgets") == 0) {
            if (!parse_budgets(o, v)) return usage("--budgets: percentages or min, comma separated");
        } else if (strcmp(a, "--check-perturb") == 0) {
            for (int k = 0; k < GPT2_NUM_PARAMS; k++)
                if (strcmp(v, PARAM_NAMES[k]) == 0) o->perturb = k;
            if (o->perturb < 0) return usage("--check-perturb: a parameter tensor (wte, wpe, ln1w, ..., lnfb)");
        } else {
            return usage("unknown option");
        }
    }
    o->shape.dropout = o->dropout > 0.0f;
    o->shape.inplace = inplace; /* after --preset */
    if (!gpt2_shape_ok(&o->shape) || o->dropout < 0.0f || o->dropout >= 1.0f || o->steps < 1 || o->warmup < 0 ||
        o->profile_runs < 0)
        return usage("bad shape, dropout, steps, warm-up or profile runs");
    return 0;
}

/* A device arena for tr's graph: desc's mode, plan and capacity, tr's
 * callbacks and stream, poisoned with --poison. */
static rkm_result arena_create(trainer *tr, const options *o, rkm_arena_mode mode, const rkm_plan *plan,
                               uint64_t capacity)
{
    rkm_callbacks cb = trainer_callbacks(tr);
    rkm_cuda_arena_desc d;
    memset(&d, 0, sizeof d);
    d.graph = tr->gg.g;
    d.mode = mode;
    d.plan = plan;
    d.capacity = capacity;
    d.host = &cb;
    d.stream = tr->stream;
    d.poison = o->poison;
    return rkm_cuda_arena_create(&d, &tr->ca);
}

/* Profile the baseline through a measuring arena: event times and
 * workspaces make a new graph (graphs are immutable), which replaces
 * tr->gg.g: same ids, so gg.ops and the callbacks serve it unchanged, and
 * every plan from here on is made on the measured costs. */
static int profile(trainer *tr, const options *o)
{
    rkm_plan *base = NULL;
    rkm_arena_capacity_info lay;
    rkm_result r = rkm_plan_baseline(tr->gg.g, &base);
    if (r == RKM_OK) r = rkm_arena_capacity(base, RKM_ARENA_FIRST_FIT, &lay);
    rkm_plan_destroy(base);
    if (r != RKM_OK) return fail_msg(tr, "baseline layout: %s", lib_msg(tr));
    /* The declared workspaces are a guess: leave room for more. */
    if ((r = arena_create(tr, o, RKM_ARENA_MEASURE, NULL, lay.capacity + lay.capacity / 4 + (64u << 20))) != RKM_OK)
        return fail_lib(tr, "profiling arena", r);
    int rc = load_batch(tr);
    rkm_cuda_profile_desc pd = {o->profile_runs, o->warmup > 0 ? o->warmup : -1, 0.2};
    rkm_cuda_profile_result pr;
    rkm_graph *profiled = NULL;
    tr->err[0] = 0;
    if (!rc && (r = rkm_cuda_profile(tr->ca, &pd, &pr, &profiled)) != RKM_OK) rc = fail_lib(tr, "profile", r);
    if (!rc) {
        printf("profile: %d runs, baseline step %.3f ms (events around the step), sum of op times %.3f ms, "
               "measured peak %.1f MiB; the CPU enqueued a step in %.3f ms\n",
               o->profile_runs, pr.step_seconds * 1e3, pr.sum_op_seconds * 1e3, (double)pr.peak / 1048576.0,
               pr.host_seconds * 1e3);
        /* Events around an op time the GPU from the first to the second:
         * with no work queued behind them, that is the CPU's launches. */
        if (pr.host_seconds > 0.5 * pr.step_seconds)
            printf("profile: launch-bound: the GPU waited for the CPU for much of the step, so the op times "
                   "are mostly launch gaps (CPU time), not kernel times; plans made on them trade "
                   "recomputation for launches (profile a larger shape to plan a real one)\n");
    }
    rkm_cuda_arena_destroy(tr->ca); /* before its graph */
    tr->ca = NULL;
    if (profiled) {
        rkm_graph_destroy(tr->gg.g);
        tr->gg.g = profiled;
    }
    return rc;
}

/* --copy: the graph (profiled or not) with a copy link in its place. */
static int add_copy_link(trainer *tr, double bw)
{
    rkm_copy_desc c = {bw, bw, 0.0};
    rkm_graph *g = NULL;
    rkm_result r = rkm_graph_with_copy(tr->gg.g, &c, &g);
    if (r != RKM_OK) return fail_lib(tr, "copy link", r);
    rkm_graph_destroy(tr->gg.g);
    tr->gg.g = g;
    printf("copy: %.3g bytes a second each way to pinned host memory\n", bw);
    return 0;
}

typedef struct reference {
    float *grads, *losses;
    double loss, step_seconds, sim_time;
} reference;

typedef struct outcome {
    uint64_t budget, sim_peak, measured_peak, arena_bytes;
    double sim_time, step_seconds, loss;
    int grads_equal, loss_equal;
} outcome;

/* Run `plan` on an arena of its layout: timings, the last step's loss and
 * gradients (into grads/losses, pinned host memory). */
static int run_plan(trainer *tr, const options *o, const rkm_plan *plan, float *grads, float *losses, outcome *out)
{
    rkm_plan_stats ps; /* the plan's figures, fixed at its birth */
    rkm_result r = rkm_plan_stats_get(plan, &ps);
    if (r != RKM_OK) return fail_lib(tr, "plan", r);
    tr->err[0] = 0;
    if ((r = arena_create(tr, o, RKM_ARENA_LAYOUT, plan, 0)) != RKM_OK) return fail_lib(tr, "arena", r);
    int rc = load_batch(tr);
    if (!rc) rc = timed_steps(tr, plan, o->warmup, o->steps, &out->step_seconds);
    if (!rc) rc = fetch_results(tr, grads, &out->loss, losses);
    rkm_arena_stats st;
    rkm_cuda_arena_stats(tr->ca, &st);
    out->sim_peak = ps.peak;
    out->sim_time = ps.time;
    out->measured_peak = st.peak;
    out->arena_bytes = st.capacity; /* the device region: the layout's arena */
    rkm_cuda_arena_destroy(tr->ca);
    tr->ca = NULL;
    return rc;
}

/* A row of the table, and the same in exact bytes on a line of its own
 * for scripts ("result LABEL: budget=... arena=..."): the arena is the
 * device region the plan's layout reserved, which must fit the budget too
 * (--check-arena). */
static void print_row(const char *label, const outcome *o, const reference *ref)
{
    const char *grads = o->grads_equal && o->loss_equal ? "identical" : "DIFFERENT";
    printf("%-9s %12.1f %12.1f %10.1f %10.3f %+9.2f%% %+9.2f%%  %.6f  %s\n", label,
           (double)o->measured_peak / 1048576.0, (double)o->sim_peak / 1048576.0,
           (double)o->arena_bytes / 1048576.0, o->step_seconds * 1e3, 100.0 * (o->sim_time / ref->sim_time - 1.0),
           100.0 * (o->step_seconds / ref->step_seconds - 1.0), o->loss, grads);
    printf("result %s: budget=%llu sim_peak=%llu measured_peak=%llu arena=%llu grads=%s\n", label,
           (unsigned long long)o->budget, (unsigned long long)o->sim_peak, (unsigned long long)o->measured_peak,
           (unsigned long long)o->arena_bytes, grads);
}

/* Loss and gradients of the CPU reference on the same weights and batch,
 * compared with a tolerance (different summation orders), each parameter
 * tensor at its own scale: max |gpu - cpu| over the tensor within 1e-3 of
 * the tensor's own max |cpu| (a bias's or a layernorm's gradient is orders
 * of magnitude below wte's, so a scale shared by all would let any error
 * in them through). NaNs fail. gpu: the baseline's gradients. */
static int check_cpu(trainer *tr, const float *gpu, double gpu_loss)
{
    gpt2_step st;
    rkm_plan *base;
    if (gpt2_step_init(&st, &tr->gg, &tr->host_model, tr->dropout, tr->seed)) return -1;
    if (rkm_plan_baseline(tr->gg.g, &base) != RKM_OK) {
        gpt2_step_free(&st);
        return -1;
    }
    int bad = gpt2_step_load(&st, tr->h_tokens, tr->h_targets) != 0;
    if (!bad) bad = gpt2_step_run(&st, base, tr->key) != RKM_OK;
    int ok = !bad, worst = 0;
    double worst_ratio = -1.0, max_all = 0.0;
    size_t off = 0;
    for (int k = 0; k < GPT2_NUM_PARAMS && !bad; k++) {
        double max_ref = 0.0, max_diff = 0.0;
        for (size_t i = off; i < off + tr->host_model.sizes[k]; i++) {
            double c = tr->host_model.grads[i], d = fabs((double)gpu[i] - c);
            if (fabs(c) > max_ref) max_ref = fabs(c);
            if (!(d <= max_diff)) max_diff = d == d ? d : INFINITY; /* NaN: infinitely wrong */
        }
        off += tr->host_model.sizes[k];
        if (max_ref > max_all) max_all = max_ref;
        double ratio = max_ref > 0.0 ? max_diff / max_ref : max_diff > 0.0 ? INFINITY : 0.0;
        if (!(ratio <= 1e-3)) {
            ok = 0;
            printf("cpu check: %s: max |gpu-cpu| %.3e vs its max |cpu| %.3e: MISMATCH\n", PARAM_NAMES[k], max_diff,
                   max_ref);
        }
        if (ratio > worst_ratio) worst_ratio = ratio, worst = k;
    }
    double ldiff = fabs(st.loss - gpu_loss) / fabs(st.loss);
    if (!(ldiff < 1e-4)) ok = 0;
    printf("cpu check: loss cpu %.6f gpu %.6f (rel diff %.2e); gradients per parameter tensor, worst %s "
           "(max |gpu-cpu| / max |cpu| %.2e, at most 1e-3; the largest of all %.3e): %s\n",
           st.loss, gpu_loss, ldiff, PARAM_NAMES[worst], worst_ratio, max_all, ok ? "ok" : "MISMATCH");
    gpt2_step_unload(&st);
    gpt2_step_free(&st);
    rkm_plan_destroy(base);
    return ok ? 0 : 1;
}

/* The baseline's GPU gradients for the CPU check, one element of tensor
 * o->perturb moved by 5 % of the tensor's largest gradient
 * (--check-perturb: the check must see it). A copy: the plans still
 * compare with the baseline's own bits. NULL when out of memory. */
static float *perturbed(const trainer *tr, const options *o, const float *grads)
{
    size_t np = tr->host_model.num_params, off = 0;
    float *g = (float *)malloc(np * sizeof(float));
    if (!g) return NULL;
    memcpy(g, grads, np * sizeof(float));
    for (int k = 0; k < o->perturb; k++) off += tr->host_model.sizes[k];
    float m = 0.0f;
    for (size_t i = off; i < off + tr->host_model.sizes[o->perturb]; i++) m = fmaxf(m, fabsf(g[i]));
    g[off] += 0.05f * m;
    printf("cpu check: --check-perturb %s: its first gradient moved by %.3e\n", PARAM_NAMES[o->perturb],
           (double)(0.05f * m));
    return g;
}

static int run_budgets(trainer *tr, const options *o, reference *ref, float *grads, float *losses, int *failed)
{
    rkm_solve_desc sd;
    rkm_planner *pl;
    rkm_planner_stats pst;
    memset(&sd, 0, sizeof sd);
    sd.algo = o->algo;
    rkm_result r = rkm_planner_create(tr->gg.g, &sd, &pl);
    if (r != RKM_OK) return fail_lib(tr, "planner", r);
    if (rkm_planner_stats_get(pl, &pst) == RKM_OK) printf("planner: %s\n", rkm_algo_name(pst.algo));
    uint64_t base_peak = 0; /* the 100 % of --budgets: the baseline's arena at the plans' alignment */
    if ((r = rkm_graph_baseline_arena(tr->gg.g, sd.alignment, &base_peak)) != RKM_OK) return fail_lib(tr, "baseline arena", r);
    int rc = 0;
    for (int i = 0; i < o->n_budgets && !rc; i++) {
        uint64_t budget = (uint64_t)((double)base_peak * o->budgets[i] / 100.0);
        rkm_plan *plan = NULL;
        char label[32];
        snprintf(label, sizeof label, "%g%%", o->budgets[i]);
        if (o->budgets[i] < 0.0) {
            if ((r = rkm_planner_min_budget(pl, &budget)) != RKM_OK) {
                rc = fail_lib(tr, "smallest budget", r);
                break;
            }
            snprintf(label, sizeof label, "min %.0f%%", 100.0 * (double)budget / (double)base_peak);
        }
        r = rkm_planner_solve(pl, budget, &plan);
        if (r == RKM_ERROR_BUDGET) {
            printf("%-9s no %s plan fits: %s\n", label, rkm_algo_name(pst.algo), lib_msg(tr));
            continue;
        }
        if (r != RKM_OK) {
            rc = fail_lib(tr, label, r);
            break;
        }
        outcome oc;
        memset(&oc, 0, sizeof oc);
        oc.budget = budget;
        rc = run_plan(tr, o, plan, grads, losses, &oc);
        if (!rc) {
            size_t n = (size_t)tr->s.B * tr->s.T;
            oc.grads_equal = memcmp(grads, ref->grads, tr->host_model.num_params * sizeof(float)) == 0;
            oc.loss_equal = memcmp(losses, ref->losses, n * sizeof(float)) == 0;
            print_row(label, &oc, ref);
            rkm_plan_stats ps;
            if (rkm_plan_stats_get(plan, &ps) == RKM_OK && ps.offloads)
                printf("%-9s %zu offloads to pinned host memory (host peak %llu bytes), predicted waits %.3f ms\n",
                       label, ps.offloads, (unsigned long long)ps.host_peak, ps.wait_seconds * 1e3);
            if (!oc.grads_equal || !oc.loss_equal || oc.measured_peak != oc.sim_peak || oc.sim_peak > budget)
                *failed = 1;
            if (o->check_arena && oc.arena_bytes > budget) {
                printf("%-9s the arena (%llu bytes) is over the budget\n", label, (unsigned long long)oc.arena_bytes);
                *failed = 1;
            }
        }
        rkm_plan_destroy(plan);
    }
    rkm_planner_destroy(pl);
    return rc;
}

/* Host buffers the results are copied into: pinned, as the device copies
 * want them. */
static int pinned_floats(trainer *tr, float **p, size_t n)
{
    CK(cudaMallocHost((void **)p, n * sizeof(float)), "pinned results");
    return 0;
}

static int run_all(trainer *tr, const options *o, int *failed)
{
    size_t np = tr->host_model.num_params, N = (size_t)tr->s.B * tr->s.T;
    reference ref;
    float *grads = NULL, *losses = NULL;
    memset(&ref, 0, sizeof ref);
    int rc = pinned_floats(tr, &grads, np);
    if (!rc) rc = pinned_floats(tr, &losses, N);
    if (!rc) rc = pinned_floats(tr, &ref.grads, np);
    if (!rc) rc = pinned_floats(tr, &ref.losses, N);
    if (!rc && o->profile_runs > 0) rc = profile(tr, o);
    if (!rc && o->copy_bw > 0) rc = add_copy_link(tr, o->copy_bw);
    rkm_plan *base = NULL;
    outcome bo;
    memset(&bo, 0, sizeof bo);
    if (!rc && rkm_plan_baseline(tr->gg.g, &base) != RKM_OK) rc = fail_msg(tr, "baseline: %s", lib_msg(tr));
    if (!rc) {
        rkm_graph_stats gs;
        if (rkm_graph_stats_get(tr->gg.g, &gs) == RKM_OK) bo.budget = gs.baseline_peak;
        rc = run_plan(tr, o, base, ref.grads, ref.losses, &bo);
    }
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
        float *g = o->perturb >= 0 ? perturbed(tr, o, ref.grads) : ref.grads;
        int c = g ? check_cpu(tr, g, ref.loss) : -1;
        if (g != ref.grads) free(g);
        if (c < 0) rc = fail_msg(tr, "cpu check: setup failed");
        else if (c > 0) *failed = 1;
    }
    if (!rc) rc = run_budgets(tr, o, &ref, grads, losses, failed);
    rkm_plan_destroy(base);
    cudaFreeHost(grads);
    cudaFreeHost(losses);
    cudaFreeHost(ref.grads);
    cudaFreeHost(ref.losses);
    return rc;
}

#ifdef GPT2_CUDA_MPI
/* The MPI build (make: build/gpt2_cuda_mpi, and on the dummy device
 * build/tests/gpt2_cuda_pipe_dummy) runs the stage mode only. */
#include "gpt2_cuda_pipe.cuh"

int main(int argc, char **argv)
{
    (void)run_all, (void)parse; /* the single-device driver, unused here */
    return pipe_main(argc, argv);
}
#else
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
    printf("gpt2_cuda: L=%d C=%d NH=%d V=%d B=%d T=%d dropout=%g inplace=%d algo=%s%s\n", o.shape.L, o.shape.C,
           o.shape.NH, o.shape.V, o.shape.B, o.shape.T, (double)o.dropout, o.shape.inplace, rkm_algo_name(o.algo),
           o.poison ? " poison" : "");
    int rc = trainer_init(&tr, ctx, &o.shape, o.dropout);
    if (!rc) rc = run_all(&tr, &o, &failed);
    if (rc) fprintf(stderr, "gpt2_cuda: %s\n", tr.err);
    trainer_free(&tr);
    rkm_context_destroy(ctx);
    if (rc) return 3;
    printf("gpt2_cuda: %s\n", failed ? "CHECK FAILED" : "all checks passed");
    return failed ? 1 : 0;
}
#endif
