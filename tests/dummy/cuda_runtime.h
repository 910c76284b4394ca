/* cuda_runtime.h -- the dummy device: a CPU stand-in for exactly the CUDA
 * runtime calls that cuda/ and examples/gpt2_cuda.cu make, so that their
 * host code and their kernels build with g++ and run without a GPU (see
 * tests/dummy/README.md for what it checks and what it cannot show).
 *
 * A .cu file builds against it as C++17 with -I tests/dummy, once its
 * launches `k<<<grid, block, shmem, stream>>>(args)` are spelled
 * RKM_DUMMY_LAUNCH(k, grid, block, shmem, stream)(args) (the Makefile's sed
 * does that, line for line). Kernels run on the CPU, block by block, each
 * thread of a block on its own small stack, so that __syncthreads and warp
 * shuffles work; __shared__ variables are the kernel's statics, which is
 * per-block memory since one block runs at a time.
 *
 * The runtime is stream-ordered and lazy: launches, copies, memsets and
 * event records queue on their stream and run only when something waits
 * for them (a synchronisation, a synchronous copy, cudaFree), so that a
 * host that reads a result before the event it needs reads stale bytes, as
 * on a GPU. */
#ifndef RKM_DUMMY_CUDA_RUNTIME_H
#define RKM_DUMMY_CUDA_RUNTIME_H

#ifndef __cplusplus
#error "the dummy device is C++: compile .cu files with g++ -x c++ -std=c++17"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
/* One block runs at a time, so a kernel's statics are its block's shared
 * memory (uninitialised on a GPU too). */
#define __shared__ static

/* The values are the real runtime's. */
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;
struct CUevent_st;
typedef struct CUevent_st *cudaEvent_t;

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

/* The thread being run (set by the dummy before it runs or resumes one). */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

cudaError_t cudaMalloc(void **ptr, size_t bytes);
template <class T> cudaError_t cudaMalloc(T **ptr, size_t bytes) { return cudaMalloc((void **)ptr, bytes); }
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t bytes);
template <class T> cudaError_t cudaMallocHost(T **ptr, size_t bytes) { return cudaMallocHost((void **)ptr, bytes); }
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream = 0);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream = 0);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);

/* Device code. */
void __syncthreads(void);

namespace rkm_dummy {

/* A queued kernel: call runs one thread (the builtins set), destroy frees
 * the job once every block has run. */
struct job {
    void (*call)(job *);
    void (*destroy)(job *);
};

/* Queue a launch on `stream` after checking its configuration against the
 * device's limits (an error goes to cudaGetLastError and nothing runs) and
 * its pointer arguments (each must be NULL or inside device or pinned host
 * memory: another pointer faults when the kernel runs). Takes `j`. */
void launch(const char *name, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, job *j, const void *const *ptrs,
            int n_ptrs);

/* __shfl_xor_sync's exchange: the calling lane's bits in, its partner's
 * out, once every lane of the warp has arrived. */
uint64_t shfl_xor(unsigned mask, uint64_t v, int lane_mask, int width);

template <class... P> struct kernel_job : job {
    void (*fn)(P...);
    std::tuple<P...> args;
    kernel_job(void (*f)(P...), std::tuple<P...> a) : job{run, drop}, fn(f), args(std::move(a)) {}
    static void run(job *j)
    {
        kernel_job *k = static_cast<kernel_job *>(j);
        std::apply(k->fn, k->args);
    }
    static void drop(job *j) { delete static_cast<kernel_job *>(j); }
};

template <class T> void add_ptr(const void **ptrs, int *n, const T &v)
{
    if constexpr (std::is_pointer_v<T>) ptrs[(*n)++] = (const void *)v;
}

template <class F> struct launcher;

/* k<<<grid, block, shmem, stream>>>(args): a call with the kernel's
 * parameter types, so the arguments convert as nvcc converts them (NULL
 * included), and are copied when the launch is made. */
template <class... P> struct launcher<void (*)(P...)> {
    const char *name;
    void (*fn)(P...);
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
    launcher(const char *n, void (*f)(P...), dim3 g, dim3 b, size_t sh = 0, cudaStream_t s = 0)
        : name(n), fn(f), grid(g), block(b), shmem(sh), stream(s)
    {
    }
    void operator()(P... a) const
    {
        kernel_job<P...> *j = new kernel_job<P...>(fn, std::tuple<P...>(a...));
        const void *ptrs[sizeof...(P) + 1];
        int n = 0;
        std::apply([&](const auto &...v) { (add_ptr(ptrs, &n, v), ...); }, j->args);
        launch(name, grid, block, shmem, stream, j, ptrs, n);
    }
};

} /* namespace rkm_dummy */

#define RKM_DUMMY_LAUNCH(kernel, ...) ::rkm_dummy::launcher<decltype(&kernel)>(#kernel, &kernel, __VA_ARGS__)

template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move 4 or 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = rkm_dummy::shfl_xor(mask, bits, lane_mask, width);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

#endif /* RKM_DUMMY_CUDA_RUNTIME_H */
