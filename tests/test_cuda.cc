/* test_cuda.cc -- cuda/rockmate_cuda.cu on the dummy device (tests/dummy),
 * and the dummy device itself: that it catches what a GPU's runtime would
 * (launches over the device's limits, divergent barriers, a read before the
 * event it needs, a pointer outside device memory), and that cuda/ poisons
 * what a plan frees, keeps the allocator's rules on its failure paths and
 * frees everything when CUDA calls fail. Kernels are launched through
 * RKM_DUMMY_LAUNCH: this file is C++ for the dummy only. */
#include "cuda/rockmate_cuda.h"
#include "cublas_v2.h"
#include "dummy.h"
#include "test.h"

#include <vector>

static const unsigned char POISON = 0xff;

/* ---------------------------------------------------------------------------
 * Kernels of the dummy's own tests
 * ------------------------------------------------------------------------- */

__global__ void set_k(int *out, int v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v;
}

__global__ void copy_k(int *dst, const int *src, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

/* Sum of in[0..blockDim) per block: shuffles within warps, then shared
 * memory and warp 0, as the trainer's block_reduce. */
__global__ void block_sum_k(float *out, const float *in)
{
    __shared__ float part[32];
    unsigned t = threadIdx.x, lane = t % 32, w = t / 32;
    float v = in[blockIdx.x * blockDim.x + t];
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) part[w] = v;
    __syncthreads();
    if (w == 0) {
        float x = lane < blockDim.x / 32 ? part[lane] : 0.0f;
        for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
        if (lane == 0) out[blockIdx.x] = x;
    }
}

/* Threads past n return before the barrier the others wait at. */
__global__ void divergent_k(int *out, int n)
{
    int i = threadIdx.x;
    if (i >= n) return;
    __syncthreads();
    out[i] = i;
}

static int *dev_ints(int n)
{
    int *p = NULL;
    CHECK(cudaMalloc(&p, (size_t)n * sizeof(int)) == cudaSuccess);
    return p;
}

static std::vector<int> host_ints(const int *d, int n)
{
    std::vector<int> h((size_t)n, 0);
    CHECK(cudaMemcpy(h.data(), d, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
}

/* ---------------------------------------------------------------------------
 * The dummy device
 * ------------------------------------------------------------------------- */

/* A launch over the device's limits is refused at the launch, as a GPU's
 * runtime refuses it, and nothing runs. */
TEST(dummy_launch_limits)
{
    int *d = dev_ints(2048);
    CHECK(cudaMemsetAsync(d, 0, 2048 * sizeof(int)) == cudaSuccess);
    const dim3 bad_blocks[] = {dim3(1025), dim3(32, 33), dim3(1, 1, 65), dim3(0)};
    for (size_t k = 0; k < N_OF(bad_blocks); k++) {
        RKM_DUMMY_LAUNCH(set_k, 1, bad_blocks[k])(d, 7, 2048);
        CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    }
    RKM_DUMMY_LAUNCH(set_k, dim3(0), 256)(d, 7, 2048);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    RKM_DUMMY_LAUNCH(set_k, dim3(1, 65536), 256)(d, 7, 2048);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    RKM_DUMMY_LAUNCH(set_k, 1, 256, 64 << 10)(d, 7, 2048); /* dynamic shared memory */
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess); /* read and reset */
    RKM_DUMMY_LAUNCH(set_k, 2, 1024)(d, 7, 2048);
    CHECK(cudaGetLastError() == cudaSuccess);
    std::vector<int> h = host_ints(d, 2048);
    int sevens = 0;
    for (int v : h) sevens += v == 7;
    CHECK(sevens == 2048); /* only the valid launch ran */
    CHECK(cudaFree(d) == cudaSuccess);
}

/* Shuffles and __syncthreads give every thread its block's values. */
TEST(dummy_barriers_and_shuffles)
{
    const int blocks = 3, threads = 256;
    float *in, *out;
    std::vector<float> h((size_t)blocks * threads), r((size_t)blocks);
    for (size_t i = 0; i < h.size(); i++) h[i] = (float)(i % 7);
    CHECK(cudaMalloc(&in, h.size() * sizeof(float)) == cudaSuccess);
    CHECK(cudaMalloc(&out, r.size() * sizeof(float)) == cudaSuccess);
    CHECK(cudaMemcpy(in, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    RKM_DUMMY_LAUNCH(block_sum_k, blocks, threads)(out, in);
    CHECK(cudaMemcpy(r.data(), out, r.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int b = 0; b < blocks; b++) {
        float want = 0.0f;
        for (int t = 0; t < threads; t++) want += h[(size_t)b * threads + t];
        CHECK(r[(size_t)b] == want);
    }
    CHECK(cudaFree(in) == cudaSuccess);
    CHECK(cudaFree(out) == cudaSuccess);
}

/* A barrier some threads of the block exited before: a GPU hangs or
 * faults; the dummy faults (sticky, as a lost context). */
TEST(dummy_divergent_barrier)
{
    int *d = dev_ints(64);
    RKM_DUMMY_LAUNCH(divergent_k, 1, 64)(d, 40);
    CHECK(cudaGetLastError() == cudaSuccess); /* the launch itself is fine */
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    int *e = NULL;
    CHECK(cudaMalloc(&e, 4) == cudaErrorLaunchFailure && e == NULL); /* sticky */
    rkm_dummy::reset_errors();
    CHECK(cudaFree(d) == cudaSuccess);
}

/* A kernel given a host pointer faults when it runs (illegal address); so
 * does a GEMM whose matrix reaches past its allocation. */
TEST(dummy_illegal_pointers)
{
    std::vector<int> host(16, 0);
    RKM_DUMMY_LAUNCH(set_k, 1, 16)(host.data(), 1, 16);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
    CHECK(host[0] == 0); /* it did not run */
    rkm_dummy::reset_errors();

    float *a, *c;
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h;
    CHECK(cudaMalloc(&a, 8 * 8 * sizeof(float)) == cudaSuccess);
    CHECK(cudaMalloc(&c, 8 * 8 * sizeof(float)) == cudaSuccess);
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, 8, a, 8, &zero, c, 8) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, 7, a, 8, &zero, c, 8) ==
          CUBLAS_STATUS_INVALID_VALUE); /* lda < m */
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 9, 8, &one, a, 8, a, 8, &zero, c, 8) ==
          CUBLAS_STATUS_EXECUTION_FAILED); /* B and C have 8 columns */
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
    rkm_dummy::reset_errors();
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
    CHECK(cudaFree(a) == cudaSuccess);
    CHECK(cudaFree(c) == cudaSuccess);
}

/* A stream runs its work when something waits for it, not before: a
 * kernel on stream 2 that reads what stream 1 writes, without waiting for
 * stream 1's event, reads the stale bytes; with cudaStreamWaitEvent, the
 * new ones. A time asked for before its events ran is cudaErrorNotReady;
 * a pinned copy read before its stream is synchronised is stale. */
TEST(dummy_read_before_event)
{
    cudaStream_t s1, s2;
    cudaEvent_t e0, e1;
    const int n = 64;
    int *src = dev_ints(n), *dst = dev_ints(n), *pinned = NULL;
    CHECK(cudaStreamCreate(&s1) == cudaSuccess && cudaStreamCreate(&s2) == cudaSuccess);
    CHECK(cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess);
    CHECK(cudaMallocHost(&pinned, n * sizeof(int)) == cudaSuccess);
    CHECK(cudaMemsetAsync(src, 0, n * sizeof(int), s1) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s1) == cudaSuccess);

    CHECK(cudaEventRecord(e0, s1) == cudaSuccess);
    RKM_DUMMY_LAUNCH(set_k, 1, n, 0, s1)(src, 5, n);
    CHECK(cudaEventRecord(e1, s1) == cudaSuccess);
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1) == cudaErrorNotReady);
    RKM_DUMMY_LAUNCH(copy_k, 1, n, 0, s2)(dst, src, n); /* no wait: a race */
    CHECK(cudaStreamSynchronize(s2) == cudaSuccess);
    CHECK(host_ints(dst, n)[0] == 0); /* read before stream 1 wrote */
    CHECK(cudaStreamSynchronize(s1) == cudaSuccess);
    CHECK(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess);

    RKM_DUMMY_LAUNCH(set_k, 1, n, 0, s1)(src, 9, n);
    CHECK(cudaEventRecord(e1, s1) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(s2, e1, 0) == cudaSuccess);
    RKM_DUMMY_LAUNCH(copy_k, 1, n, 0, s2)(dst, src, n);
    CHECK(cudaMemcpyAsync(pinned, dst, n * sizeof(int), cudaMemcpyDeviceToHost, s2) == cudaSuccess);
    CHECK(pinned[0] == (int)0xffffffff); /* the copy has not run: still the poison */
    CHECK(cudaStreamSynchronize(s2) == cudaSuccess);
    CHECK(pinned[0] == 9 && pinned[n - 1] == 9);

    CHECK(cudaFreeHost(pinned) == cudaSuccess);
    CHECK(cudaEventDestroy(e0) == cudaSuccess && cudaEventDestroy(e1) == cudaSuccess);
    CHECK(cudaStreamDestroy(s1) == cudaSuccess && cudaStreamDestroy(s2) == cudaSuccess);
    CHECK(cudaFree(src) == cudaSuccess && cudaFree(dst) == cudaSuccess);
}

/* A non-blocking stream keeps no implicit order with the legacy default
 * stream (a blocking one waits for it): the arena's copy streams are such,
 * so that only their events order them. */
TEST(dummy_nonblocking_stream)
{
    cudaStream_t nb, bl;
    const int n = 32;
    int *src = dev_ints(n), *dst = dev_ints(n);
    CHECK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreate(&bl) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&bl, 2) == cudaErrorInvalidValue);
    (void)cudaGetLastError();
    CHECK(cudaMemsetAsync(src, 0, n * sizeof(int)) == cudaSuccess && cudaMemsetAsync(dst, 0, n * sizeof(int)) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    RKM_DUMMY_LAUNCH(set_k, 1, n, 0, 0)(src, 7, n); /* on the legacy stream, not run yet */
    RKM_DUMMY_LAUNCH(copy_k, 1, n, 0, nb)(dst, src, n);
    CHECK(cudaStreamSynchronize(nb) == cudaSuccess);
    CHECK(host_ints(dst, n)[0] == 0); /* it did not wait for the legacy stream */
    RKM_DUMMY_LAUNCH(copy_k, 1, n, 0, bl)(dst, src, n);
    CHECK(cudaStreamSynchronize(bl) == cudaSuccess);
    CHECK(host_ints(dst, n)[0] == 7); /* a blocking stream did */
    CHECK(cudaStreamDestroy(nb) == cudaSuccess && cudaStreamDestroy(bl) == cudaSuccess);
    CHECK(cudaFree(src) == cudaSuccess && cudaFree(dst) == cudaSuccess);
}

/* The GEMMs against a plain loop (both transposes, strided batches; beta 0
 * ignores what C holds, NaNs included, as cuBLAS does). */
TEST(dummy_gemm)
{
    const int m = 5, n = 3, k = 4, batch = 2;
    std::vector<float> A((size_t)batch * m * k), B((size_t)batch * k * n), C((size_t)batch * m * n);
    for (size_t i = 0; i < A.size(); i++) A[i] = (float)((i * 7) % 5) - 2.0f;
    for (size_t i = 0; i < B.size(); i++) B[i] = (float)((i * 3) % 4) - 1.5f;
    float *dA, *dB, *dC;
    CHECK(cudaMalloc(&dA, A.size() * 4) == cudaSuccess && cudaMalloc(&dB, B.size() * 4) == cudaSuccess);
    CHECK(cudaMalloc(&dC, C.size() * 4) == cudaSuccess); /* poisoned: NaNs */
    CHECK(cudaMemcpy(dA, A.data(), A.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const float alpha = 2.0f, beta = 0.0f;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = ta ? k : m, ldb = tb ? n : k;
            CHECK(cublasSgemmStridedBatched(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n,
                                            k, &alpha, dA, lda, m * k, dB, ldb, k * n, &beta, dC, m, m * n,
                                            batch) == CUBLAS_STATUS_SUCCESS);
            CHECK(cudaMemcpy(C.data(), dC, C.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
            for (int b = 0; b < batch; b++)
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < n; j++) {
                        float s = 0.0f;
                        for (int p = 0; p < k; p++) {
                            float a = ta ? A[(size_t)b * m * k + (size_t)i * lda + p]
                                         : A[(size_t)b * m * k + (size_t)p * lda + i];
                            float x = tb ? B[(size_t)b * k * n + (size_t)p * ldb + j]
                                         : B[(size_t)b * k * n + (size_t)j * ldb + p];
                            s += a * x;
                        }
                        CHECK(C[(size_t)b * m * n + (size_t)j * m + i] == alpha * s);
                    }
        }
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
    CHECK(cudaFree(dA) == cudaSuccess && cudaFree(dB) == cudaSuccess && cudaFree(dC) == cudaSuccess);
}

/* ---------------------------------------------------------------------------
 * cuda/rockmate_cuda.cu
 * ------------------------------------------------------------------------- */

/* A host that writes every buffer a step gives it (a pattern of its own
 * per kind, through stream-ordered memsets) and takes its workspace as
 * scratch. */
typedef struct host {
    rkm_cuda_arena *ca;
    const rkm_graph *g;
    cudaStream_t stream;
} host;

static uint64_t tbytes(const rkm_graph *g, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(g, t, &ti) == RKM_OK ? ti.bytes : 0;
}

static int fill(host *h, void *p, int v, uint64_t bytes)
{
    if (!bytes) return 0;
    if (!p) return 1;
    return cudaMemsetAsync(p, v, (size_t)bytes, h->stream) != cudaSuccess;
}

static int scratch(host *h, uint64_t bytes)
{
    void *p;
    if (!bytes) return 0;
    return rkm_cuda_scratch(h->ca, bytes, &p) != RKM_OK || fill(h, p, 0x33, bytes);
}

static int host_fwd(void *user, const rkm_fwd_call *c)
{
    host *h = (host *)user;
    for (int32_t k = 0; k < c->n_out; k++)
        if (fill(h, rkm_cuda_tensor(h->ca, c->out[k]), 0x11, tbytes(h->g, c->out[k]))) return 1;
    if (c->save && fill(h, rkm_cuda_saved(h->ca, c->op), 0x22, c->phantom)) return 1;
    return scratch(h, c->ws_bytes);
}

static int host_bwd(void *user, const rkm_bwd_call *c)
{
    host *h = (host *)user;
    for (int32_t k = 0; k < c->n_in; k++)
        if (c->in_grad[k] != RKM_GRAD_NONE && fill(h, rkm_cuda_grad(h->ca, c->in[k]), 0x44, tbytes(h->g, c->in[k])))
            return 1;
    return scratch(h, c->ws_bytes);
}

static int host_loss(void *user, const rkm_buffer_call *c)
{
    host *h = (host *)user;
    return fill(h, rkm_cuda_grad(h->ca, c->index), 0x55, c->bytes);
}

static rkm_callbacks host_callbacks(host *h)
{
    rkm_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.user = h;
    cb.forward = host_fwd;
    cb.backward = host_bwd;
    cb.loss = host_loss;
    return cb;
}

/* Bytes of the arena's region that are not the poison, after a step. */
static size_t unpoisoned_after_step(const rkm_graph *g, const rkm_plan *plan, int poison)
{
    host h = {NULL, g, NULL};
    rkm_callbacks cb = host_callbacks(&h);
    rkm_cuda_arena_desc d;
    memset(&d, 0, sizeof d);
    d.graph = g;
    d.host = &cb;
    d.plan = plan;
    d.poison = poison;
    CHECK(cudaStreamCreate(&h.stream) == cudaSuccess);
    d.stream = h.stream;
    size_t bad = SIZE_MAX;
    if (rkm_cuda_arena_create(&d, &h.ca) == RKM_OK) {
        if (rkm_cuda_arena_run(h.ca, plan) != RKM_OK) {
            fprintf(stderr, "run: %s\n", rkm_context_errmsg(rkm_graph_context(g)));
            CHECK(0);
        }
        CHECK(cudaStreamSynchronize(h.stream) == cudaSuccess);
        rkm_arena_stats st;
        rkm_cuda_arena_stats(h.ca, &st);
        int32_t in0 = 0; /* the region's base, from the first input's offset */
        while (in0 < rkm_graph_num_tensors(g) && rkm_cuda_tensor(h.ca, in0) == NULL) in0++;
        char *base = (char *)rkm_cuda_tensor(h.ca, in0) - rkm_arena_exec_tensor(rkm_cuda_arena_exec(h.ca), in0);
        std::vector<unsigned char> bytes((size_t)st.capacity);
        CHECK(cudaMemcpy(bytes.data(), base, bytes.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
        bad = 0;
        for (unsigned char b : bytes) bad += b != POISON;
        rkm_cuda_arena_destroy(h.ca);
    } else {
        fprintf(stderr, "arena: %s\n", rkm_context_errmsg(rkm_graph_context(g)));
        CHECK(0);
    }
    CHECK(cudaStreamDestroy(h.stream) == cudaSuccess);
    return bad;
}

/* With poisoning, whatever a step wrote is poison again once the step is
 * over (every buffer but the inputs is freed, and the inputs were never
 * written): frees and scratch buffers are poisoned in stream order, after
 * the writes of the step. Without it, the step's writes stay. In-place
 * runs move buffers without a free: what they take over is poisoned at
 * its own free. */
TEST(cuda_poison_frees)
{
    (void)cudaGetLastError();
    rkm_context *ctx = test_new_ctx();
    const char *names[] = {"gpt2-tiny", "multi-output"};
    for (size_t i = 0; i < N_OF(names); i++)
        for (int inplace = 0; inplace < 2; inplace++) {
            rkm_graph *g = inplace ? test_load_inplace_graph(ctx, names[i]) : test_load_graph(ctx, names[i]);
            rkm_plan *base = NULL, *small = NULL;
            rkm_planner *pl = NULL;
            rkm_solve_desc sd;
            uint64_t budget = 0;
            memset(&sd, 0, sizeof sd);
            sd.algo = RKM_ALGO_DTR; /* any graph, recomputations and frees at its smallest budget */
            CHECK(g && rkm_plan_baseline(g, &base) == RKM_OK && rkm_planner_create(g, &sd, &pl) == RKM_OK);
            CHECK(rkm_planner_min_budget(pl, &budget) == RKM_OK && rkm_planner_solve(pl, budget, &small) == RKM_OK);
            rkm_planner_destroy(pl);
            const rkm_plan *plans[] = {base, small};
            for (int p = 0; p < 2; p++) {
                if (!plans[p]) continue;
                size_t left = unpoisoned_after_step(g, plans[p], 1);
                if (left)
                    fprintf(stderr, "%s%s plan %d: %zu bytes not poisoned\n", names[i], inplace ? " in place" : "", p,
                            left);
                CHECK(left == 0);
                CHECK(unpoisoned_after_step(g, plans[p], 0) > 0); /* the writes are there without it */
            }
            rkm_plan_destroy(base);
            rkm_plan_destroy(small);
            rkm_graph_destroy(g);
        }
    rkm_context_destroy(ctx);
    CHECK(rkm_dummy::live("device") == 0 && rkm_dummy::live("streams") == 0);
}

/* A host with a bug poisoning exists for: op "reduce" reads, besides its
 * input b, the tensor a through a pointer kept from a's forward, though it
 * does not declare a as an input, so the plan frees a before (and between
 * that free and the read, nothing is written but the poison). */
__global__ void fill_f_k(float *x, float v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

__global__ void sum_k(float *out, const float *a, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i];
    out[0] = s;
}

typedef struct stale_host {
    rkm_cuda_arena *ca;
    int32_t x, a, b, loss;
    float *kept_a; /* the bug */
    float *probe;  /* the loss as the step made it, outside the arena */
} stale_host;

static const int STALE_N = 1024;

static int stale_fwd(void *user, const rkm_fwd_call *c)
{
    stale_host *h = (stale_host *)user;
    float *out = (float *)rkm_cuda_tensor(h->ca, c->out[0]);
    if (c->out[0] == h->a) h->kept_a = out;
    if (c->out[0] == h->loss) RKM_DUMMY_LAUNCH(sum_k, 1, 1)(out, h->kept_a, STALE_N); /* a, not b */
    else RKM_DUMMY_LAUNCH(fill_f_k, 4, 256)(out, 1.5f, STALE_N);
    return cudaGetLastError() != cudaSuccess;
}

static int stale_bwd(void *user, const rkm_bwd_call *c)
{
    stale_host *h = (stale_host *)user;
    if (c->in_grad[0] != RKM_GRAD_NONE)
        RKM_DUMMY_LAUNCH(fill_f_k, 4, 256)((float *)rkm_cuda_grad(h->ca, c->in[0]), 1.0f, STALE_N);
    return cudaGetLastError() != cudaSuccess;
}

static int stale_loss(void *user, const rkm_buffer_call *c)
{
    stale_host *h = (stale_host *)user;
    RKM_DUMMY_LAUNCH(fill_f_k, 1, 32)((float *)rkm_cuda_grad(h->ca, c->index), 1.0f, 1);
    return cudaMemcpyAsync(h->probe, rkm_cuda_tensor(h->ca, c->index), 4, cudaMemcpyDeviceToDevice) != cudaSuccess ||
           cudaGetLastError() != cudaSuccess;
}

/* The loss as the buggy host computes it under the baseline plan, with and
 * without poisoning. */
static float stale_loss_of(int poison)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL;
    stale_host h;
    memset(&h, 0, sizeof h);
    const uint64_t bytes = STALE_N * sizeof(float);
    CHECK(rkm_graph_create(ctx, &g) == RKM_OK);
    CHECK(rkm_graph_add_tensor(g, "x", bytes, RKM_TENSOR_INPUT, &h.x) == RKM_OK);
    CHECK(rkm_graph_add_tensor(g, "a", bytes, 0, &h.a) == RKM_OK);
    CHECK(rkm_graph_add_tensor(g, "b", bytes, 0, &h.b) == RKM_OK);
    CHECK(rkm_graph_add_tensor(g, "loss", 4, 0, &h.loss) == RKM_OK);
    int32_t ins[3] = {h.x, h.a, h.b}, outs[3] = {h.a, h.b, h.loss};
    const char *names[3] = {"make", "use", "reduce"};
    for (int i = 0; i < 3; i++) {
        rkm_op_desc d;
        memset(&d, 0, sizeof d);
        d.name = names[i];
        d.fwd_seconds = d.bwd_seconds = 1e-6;
        d.in = &ins[i];
        d.n_in = 1;
        d.out = &outs[i];
        d.n_out = 1;
        d.saved = i == 2 ? &ins[i] : NULL; /* "use" declares nothing: the bug */
        d.n_saved = i == 2;
        CHECK(rkm_graph_add_op(g, &d, NULL) == RKM_OK);
    }
    CHECK(rkm_graph_set_loss(g, h.loss) == RKM_OK && rkm_graph_finalize(g) == RKM_OK);
    rkm_plan *p = NULL;
    CHECK(rkm_plan_baseline(g, &p) == RKM_OK);
    rkm_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.user = &h;
    cb.forward = stale_fwd;
    cb.backward = stale_bwd;
    cb.loss = stale_loss;
    rkm_cuda_arena_desc d;
    memset(&d, 0, sizeof d);
    d.graph = g;
    d.host = &cb;
    d.plan = p;
    d.poison = poison;
    float got = 0.0f;
    CHECK(cudaMalloc(&h.probe, bytes) == cudaSuccess);
    CHECK(rkm_cuda_arena_create(&d, &h.ca) == RKM_OK);
    CHECK(rkm_cuda_arena_run(h.ca, p) == RKM_OK);
    CHECK(cudaMemcpy(&got, h.probe, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess);
    rkm_cuda_arena_destroy(h.ca);
    CHECK(cudaFree(h.probe) == cudaSuccess);
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    return got;
}

/* Without poisoning the freed tensor still holds its values, and the bug
 * gives the right loss (1024 x 1.5); with it, the read gives NaNs. */
TEST(cuda_poison_catches_a_stale_read)
{
    (void)cudaGetLastError();
    CHECK(stale_loss_of(0) == 1536.0f);
    float poisoned = stale_loss_of(1);
    CHECK(poisoned != poisoned);
}

/* A counting allocator that checks the rkm_alloc_fn convention (a NULL
 * block comes with old size 0) and fails its nth allocation. */
static long alloc_calls, alloc_fail_at, alloc_violations;
static size_t alloc_live;

/* cuda/'s calls of rkm_context_realloc (the Makefile links this program
 * with --wrap=rkm_context_realloc): a NULL block given a size breaks its
 * rule, though the library then does not pass it on to the allocator. */
static long realloc_null_sized;
extern "C" void *__real_rkm_context_realloc(rkm_context *ctx, void *ptr, size_t old_size, size_t new_size);
extern "C" void *__wrap_rkm_context_realloc(rkm_context *ctx, void *ptr, size_t old_size, size_t new_size)
{
    if (!ptr && old_size) realloc_null_sized++;
    return __real_rkm_context_realloc(ctx, ptr, old_size, new_size);
}

static void *checking_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    if (!ptr && old_size) alloc_violations++;
    if (new_size == 0) {
        if (ptr) alloc_live -= old_size;
        free(ptr);
        return NULL;
    }
    if (++alloc_calls == alloc_fail_at) return NULL;
    void *p = realloc(ptr, new_size);
    if (p) alloc_live += new_size - (ptr ? old_size : 0);
    return p;
}

static rkm_context *checking_ctx(void)
{
    rkm_context_desc d;
    memset(&d, 0, sizeof d);
    d.alloc = checking_alloc;
    rkm_context *ctx = NULL;
    if (rkm_context_create(&d, &ctx) != RKM_OK) exit(2);
    return ctx;
}

/* Profiles gpt2-tiny through a measuring arena with `fail` (an allocation
 * or a CUDA call) made to fail; returns rkm_cuda_profile's result (or
 * the arena's when that failed first). */
static rkm_result profile_once(rkm_context *ctx, const rkm_graph *g, long fail_alloc, const char *fail_call, long nth)
{
    host h = {NULL, g, NULL};
    rkm_callbacks cb = host_callbacks(&h);
    rkm_cuda_arena_desc d;
    memset(&d, 0, sizeof d);
    d.graph = g;
    d.host = &cb;
    d.mode = RKM_ARENA_MEASURE;
    d.capacity = 1u << 20;
    rkm_result r = rkm_cuda_arena_create(&d, &h.ca);
    rkm_graph *out = NULL;
    rkm_cuda_profile_desc pd = {2, -1, 0.0};
    rkm_cuda_profile_result res;
    alloc_calls = 0;
    alloc_fail_at = fail_alloc;
    if (fail_call) rkm_dummy::fail_nth(fail_call, rkm_dummy::calls(fail_call) + nth);
    if (r == RKM_OK) r = rkm_cuda_profile(h.ca, &pd, &res, &out);
    alloc_fail_at = 0;
    rkm_dummy::reset_errors();
    (void)cudaGetLastError();
    if (r == RKM_OK) CHECK(out != NULL && res.host_seconds > 0.0 && res.step_seconds > 0.0);
    else CHECK(out == NULL && rkm_context_errmsg(ctx)[0] != '\0');
    rkm_graph_destroy(out);
    rkm_cuda_arena_destroy(h.ca);
    return r;
}

/* Every allocation rkm_cuda_profile makes, failed in turn: RKM_ERROR_NOMEM,
 * nothing left allocated, and no size given with a NULL block, neither to
 * the allocator nor by cuda/ to rkm_context_realloc (its failure path freed
 * its arrays with their sizes whether or not they had been allocated). */
TEST(cuda_profile_alloc_failures)
{
    rkm_context *ctx = checking_ctx();
    rkm_graph *g = test_load_graph(ctx, "multi-output");
    CHECK(g != NULL);
    size_t live0 = alloc_live;
    alloc_violations = realloc_null_sized = 0;
    CHECK(profile_once(ctx, g, 0, NULL, 0) == RKM_OK);
    long n = alloc_calls, nomem = 0;
    CHECK(n > 4);
    for (long k = 1; k <= n; k++) {
        rkm_result r = profile_once(ctx, g, k, NULL, 0);
        nomem += r == RKM_ERROR_NOMEM;
        CHECK(r == RKM_OK || r == RKM_ERROR_NOMEM);
        CHECK(alloc_live == live0);
    }
    CHECK(nomem >= 4);
    if (alloc_violations || realloc_null_sized)
        fprintf(stderr, "NULL blocks with a size: %ld to the allocator, %ld from cuda/\n", alloc_violations,
                realloc_null_sized);
    CHECK(alloc_violations == 0 && realloc_null_sized == 0);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(rkm_dummy::live("device") == 0 && rkm_dummy::live("events") == 0);
}

/* CUDA calls of the profile failing (event creation, records, a copy):
 * the CUDA error's name in the message, every event destroyed. */
TEST(cuda_profile_cuda_failures)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = test_load_graph(ctx, "multi-output");
    CHECK(g != NULL);
    long n_ev = 4 * rkm_graph_num_ops(g) + 2;
    const long nths[] = {1, 2, n_ev / 2, n_ev};
    for (size_t i = 0; i < N_OF(nths); i++) {
        CHECK(profile_once(ctx, g, 0, "cudaEventCreate", nths[i]) == RKM_ERROR_NOMEM);
        CHECK(strstr(rkm_context_errmsg(ctx), "cudaEventCreate") != NULL);
        CHECK(rkm_dummy::live("events") == 0);
    }
    for (long k = 1; k <= 3; k++) {
        CHECK(profile_once(ctx, g, 0, "cudaEventRecord", k) == RKM_ERROR_CALLBACK);
        CHECK(strstr(rkm_context_errmsg(ctx), "cudaErrorLaunchFailure") != NULL);
        CHECK(rkm_dummy::live("events") == 0);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(rkm_dummy::live("device") == 0);
}

/* Offloading through the arena: docs/formats.md's worked example with a
 * copy (offload h, free it, prefetch it back before bwd gelu), its freed
 * buffers poisoned. Each backward copies the first and last byte of every
 * non-input tensor it saves to pinned memory in stream order: all must be
 * the forward's 0x11, which they are only if the offload waited for the
 * forward that wrote h (seen when copies run early) and bwd gelu for the
 * prefetch (seen when they run late). */
#define G_COPY                                                                                              \
    "rockmate-graph 1\ncopy d2h=1000 h2d=1000\ntensor x 400 input\ntensor h 1000\ntensor a 1000\n"        \
    "tensor s 1000\ntensor loss 4\nop fc fwd=2 bwd=4 in=x out=h saved=x\nop gelu fwd=1 bwd=1 in=h out=a "  \
    "saved=h\nop add fwd=0.5 bwd=0.5 in=h,a out=s\nop ce fwd=1 bwd=1 in=s out=loss saved=s phantom=200 "     \
    "fwd_ws=100\nloss loss\n"
#define P_COPY                                                                                   \
    "rockmate-plan 1\n"                                                                          \
    "fwd fc\nfwd gelu\noffload h\nfwd add\nfree a\nfwd ce save\nwait h\nfree h\nloss\nfree loss\n" \
    "bwd ce\nfree_saved ce\nfree_grad loss\nfree s\nbwd add\nfree_grad s\nprefetch h\nwait h\n"  \
    "bwd gelu\nfree_grad a\nfree h\nfree_host h\nbwd fc\nfree_grad h\n"

typedef struct copy_host {
    host h; /* first: the shared callbacks take it */
    unsigned char *seen; /* pinned: the bytes the backwards saw */
    int n_seen;
} copy_host;

static int copy_bwd(void *user, const rkm_bwd_call *c)
{
    copy_host *ch = (copy_host *)user;
    for (int32_t k = 0; k < c->n_saved; k++) {
        rkm_tensor_info ti;
        const char *p = (const char *)rkm_cuda_tensor(ch->h.ca, c->saved[k]);
        if (rkm_graph_tensor_info(ch->h.g, c->saved[k], &ti) != RKM_OK || (ti.flags & RKM_TENSOR_INPUT)) continue;
        if (!p || ch->n_seen > 62) return 1;
        for (uint64_t at : {(uint64_t)0, ti.bytes - 1})
            if (cudaMemcpyAsync(ch->seen + ch->n_seen++, p + at, 1, cudaMemcpyDeviceToHost, ch->h.stream) != cudaSuccess)
                return 1;
    }
    return host_bwd(user, c);
}

TEST(cuda_arena_copies)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL;
    rkm_plan *p = NULL;
    CHECK(rkm_graph_read_string(ctx, G_COPY, strlen(G_COPY), "copy.rkg", &g) == RKM_OK);
    CHECK(g && rkm_plan_read_string(g, P_COPY, strlen(P_COPY), "copy.rkp", NULL, &p) == RKM_OK);
    copy_host ch;
    memset(&ch, 0, sizeof ch);
    ch.h.g = g;
    CHECK(cudaMallocHost(&ch.seen, 64) == cudaSuccess && cudaStreamCreate(&ch.h.stream) == cudaSuccess);
    rkm_callbacks cb = host_callbacks(&ch.h);
    cb.user = &ch;
    cb.backward = copy_bwd;
    rkm_cuda_arena_desc d;
    memset(&d, 0, sizeof d);
    d.graph = g;
    d.host = &cb;
    d.plan = p;
    d.poison = 1;
    d.stream = ch.h.stream;
    long pinned0 = rkm_dummy::live("pinned"), streams0 = rkm_dummy::live("streams");
    CHECK(p && rkm_cuda_arena_create(&d, &ch.h.ca) == RKM_OK);
    /* its copy streams and its pinned region (host), made once */
    CHECK(rkm_dummy::live("pinned") == pinned0 + 1 && rkm_dummy::live("streams") == streams0 + 2);
    for (int step = 0; step < 4 && ch.h.ca; step++) { /* the pinned buffer is reused */
        rkm_dummy::eager_nonblocking(step % 2); /* copies run late, then early */
        ch.n_seen = 0;
        memset(ch.seen, 0, 64);
        CHECK(rkm_cuda_arena_run(ch.h.ca, p) == RKM_OK);
        CHECK(cudaStreamSynchronize(ch.h.stream) == cudaSuccess);
        CHECK(ch.n_seen == 4); /* s (bwd ce) and h (bwd gelu); fc saves x, an input */
        for (int i = 0; i < ch.n_seen; i++) CHECK(ch.seen[i] == 0x11);
    }
    rkm_dummy::eager_nonblocking(false);
    rkm_cuda_arena_destroy(ch.h.ca);
    CHECK(rkm_dummy::live("pinned") == pinned0 && rkm_dummy::live("streams") == streams0);

    /* An arena made without the plan (first fit) has no pinned buffers:
     * the offload fails, named, and the arena is still usable. */
    d.mode = RKM_ARENA_FIRST_FIT;
    d.plan = NULL;
    d.capacity = 1 << 16;
    CHECK(rkm_cuda_arena_create(&d, &ch.h.ca) == RKM_OK);
    CHECK(ch.h.ca && rkm_cuda_arena_run(ch.h.ca, p) == RKM_ERROR_ARGUMENT);
    CHECK(strstr(rkm_context_errmsg(ctx), "offload of tensor 1: the arena has no pinned buffer") != NULL);
    rkm_cuda_arena_destroy(ch.h.ca);

    /* The pinned region failing: NOMEM, named, nothing left. */
    d.mode = RKM_ARENA_LAYOUT;
    d.plan = p;
    d.capacity = 0;
    rkm_dummy::fail_nth("cudaMallocHost", rkm_dummy::calls("cudaMallocHost") + 1);
    CHECK(rkm_cuda_arena_create(&d, &ch.h.ca) == RKM_ERROR_NOMEM && ch.h.ca == NULL);
    CHECK(strstr(rkm_context_errmsg(ctx), "copies: cudaMallocHost (1024 pinned bytes)") != NULL);
    rkm_dummy::reset_errors();
    (void)cudaGetLastError();
    CHECK(rkm_dummy::live("pinned") == pinned0 && rkm_dummy::live("streams") == streams0);

    CHECK(cudaStreamDestroy(ch.h.stream) == cudaSuccess && cudaFreeHost(ch.seen) == cudaSuccess);
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(rkm_dummy::live("device") == 0);
}

/* A host that checks that every device pointer a call sees (tensors,
 * gradients, saved states, scratch) is a multiple of `align`. */
typedef struct align_host {
    rkm_cuda_arena *ca;
    uintptr_t align;
    long long checked, bad;
} align_host;

static void acheck(align_host *h, const void *p)
{
    h->checked++;
    h->bad += !p || (uintptr_t)p % h->align != 0;
}

static int ascratch(align_host *h, uint64_t bytes)
{
    void *p = NULL;
    if (bytes && rkm_cuda_scratch(h->ca, bytes, &p) != RKM_OK) return 1;
    if (bytes) acheck(h, p);
    return 0;
}

static int align_fwd(void *user, const rkm_fwd_call *c)
{
    align_host *h = (align_host *)user;
    for (int32_t k = 0; k < c->n_in; k++) acheck(h, rkm_cuda_tensor(h->ca, c->in[k]));
    for (int32_t k = 0; k < c->n_out; k++) acheck(h, rkm_cuda_tensor(h->ca, c->out[k]));
    if (c->save) acheck(h, rkm_cuda_saved(h->ca, c->op));
    return ascratch(h, c->ws_bytes);
}

static int align_bwd(void *user, const rkm_bwd_call *c)
{
    align_host *h = (align_host *)user;
    for (int32_t k = 0; k < c->n_in; k++)
        if (c->in_grad[k] != RKM_GRAD_NONE) acheck(h, rkm_cuda_grad(h->ca, c->in[k]));
    for (int32_t k = 0; k < c->n_out; k++)
        if (c->out_grad[k]) acheck(h, rkm_cuda_grad(h->ca, c->out[k]));
    for (int32_t k = 0; k < c->n_saved; k++) acheck(h, rkm_cuda_tensor(h->ca, c->saved[k]));
    if (c->phantom) acheck(h, rkm_cuda_saved(h->ca, c->op));
    return ascratch(h, c->ws_bytes);
}

/* The device region is aligned as the exec's offsets are, whatever the
 * plan's alignment, though cudaMalloc (and so the dummy) promises only 256
 * bytes: plans at 64, 256 and 4096 in layout mode (their alignment), and
 * the 4096 one in first fit (256). */
TEST(cuda_arena_aligned)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = test_load_scratch_graph(ctx, "gpt2-tiny"); /* with workspaces */
    const uint64_t aligns[] = {64, 256, 4096};
    for (size_t i = 0; g && i < N_OF(aligns); i++) {
        rkm_solve_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.algo = RKM_ALGO_NONE;
        sd.alignment = aligns[i];
        rkm_plan *p = NULL;
        CHECK(rkm_plan_solve(g, &sd, UINT64_MAX, &p) == RKM_OK);
        for (int mode = RKM_ARENA_LAYOUT; p && mode <= RKM_ARENA_FIRST_FIT; mode++) {
            align_host h = {NULL, (uintptr_t)(mode == RKM_ARENA_LAYOUT ? aligns[i] : RKM_ARENA_ALIGN), 0, 0};
            rkm_callbacks cb;
            memset(&cb, 0, sizeof cb);
            cb.user = &h;
            cb.forward = align_fwd;
            cb.backward = align_bwd;
            rkm_cuda_arena_desc d;
            memset(&d, 0, sizeof d);
            d.graph = g;
            d.mode = (rkm_arena_mode)mode;
            d.plan = p;
            d.host = &cb;
            CHECK(rkm_cuda_arena_create(&d, &h.ca) == RKM_OK);
            CHECK(h.ca && rkm_cuda_arena_run(h.ca, p) == RKM_OK);
            if (h.bad)
                fprintf(stderr, "alignment %llu, mode %d: %lld of %lld pointers misaligned\n",
                        (unsigned long long)aligns[i], mode, h.bad, h.checked);
            CHECK(h.checked > 100 && h.bad == 0);
            rkm_cuda_arena_destroy(h.ca);
        }
        rkm_plan_destroy(p);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(rkm_dummy::live("device") == 0);
}

/* A failed cudaMalloc of the region: NOMEM, the size in the message. */
TEST(cuda_arena_malloc_failure)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = test_load_graph(ctx, "multi-output");
    rkm_plan *p = NULL;
    host h = {NULL, g, NULL};
    rkm_callbacks cb = host_callbacks(&h);
    CHECK(g && rkm_plan_baseline(g, &p) == RKM_OK);
    rkm_dummy::fail_nth("cudaMalloc", rkm_dummy::calls("cudaMalloc") + 1);
    CHECK(rkm_cuda_arena_create_for_plan(p, &cb, NULL, &h.ca, NULL) == RKM_ERROR_NOMEM && h.ca == NULL);
    CHECK(strstr(rkm_context_errmsg(ctx), "cudaMalloc") != NULL);
    rkm_dummy::reset_errors();
    (void)cudaGetLastError();
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(rkm_dummy::live("device") == 0);
}

/* An arena destroyed last, after its plan's graph and context
 * (rockmate.h, CONVENTIONS: they live as long as it does): it runs and
 * fails as before, and its destroy frees them without touching them
 * after. */
TEST(cuda_arena_outlives_its_context)
{
    size_t live0 = alloc_live;
    rkm_context *ctx = checking_ctx();
    rkm_graph *g = test_load_graph(ctx, "multi-output");
    rkm_plan *p = NULL;
    host h = {NULL, g, NULL};
    rkm_callbacks cb = host_callbacks(&h);
    CHECK(g && rkm_plan_baseline(g, &p) == RKM_OK);
    CHECK(p && rkm_cuda_arena_create_for_plan(p, &cb, NULL, &h.ca, NULL) == RKM_OK);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(h.ca && rkm_cuda_arena_run(h.ca, p) == RKM_OK);
    CHECK(rkm_cuda_scratch(h.ca, 16, NULL) == RKM_ERROR_ARGUMENT);
    CHECK(strstr(rkm_context_errmsg(rkm_graph_context(rkm_plan_graph(p))), "ptr is NULL") != NULL);
    rkm_plan_destroy(p);
    CHECK(alloc_live > live0);
    rkm_cuda_arena_destroy(h.ca);
    CHECK(alloc_live == live0); /* the context went too */
    CHECK(rkm_dummy::live("device") == 0);
}

int main(void)
{
    RUN(dummy_launch_limits);
    RUN(dummy_barriers_and_shuffles);
    RUN(dummy_divergent_barrier);
    RUN(dummy_illegal_pointers);
    RUN(dummy_read_before_event);
    RUN(dummy_nonblocking_stream);
    RUN(dummy_gemm);
    RUN(cuda_poison_frees);
    RUN(cuda_poison_catches_a_stale_read);
    RUN(cuda_profile_alloc_failures);
    RUN(cuda_profile_cuda_failures);
    RUN(cuda_arena_aligned);
    RUN(cuda_arena_malloc_failure);
    RUN(cuda_arena_copies);
    RUN(cuda_arena_outlives_its_context);
    TEST_END();
}
