/* dummy.h -- what a test asks of the dummy device (tests/dummy) beyond the
 * CUDA API: injected failures and call counts.
 *
 * Failures can also be injected from the environment, for programs that
 * do not include this header: RKM_DUMMY_FAIL="cudaEventCreate:3,launch:1"
 * makes the third cudaEventCreate and the first kernel launch fail. */
#ifndef RKM_DUMMY_H
#define RKM_DUMMY_H

#include "cuda_runtime.h"

namespace rkm_dummy {

/* The calls that count and can be made to fail, with the error they then
 * return: cudaMalloc and cudaMallocHost (cudaErrorMemoryAllocation),
 * cudaEventCreate (cudaErrorMemoryAllocation), cudaEventRecord,
 * cudaMemcpy, cudaMemcpyAsync, cudaMemsetAsync and cudaStreamCreate
 * (cudaErrorLaunchFailure), launch (a kernel launch:
 * cudaErrorLaunchOutOfResources from cudaGetLastError, nothing runs),
 * cublasCreate and gemm (cublasSgemm and cublasSgemmStridedBatched:
 * CUBLAS_STATUS_EXECUTION_FAILED). */

/* The nth call (from 1) of `what` from now on fails; 0 cancels. */
void fail_nth(const char *what, long nth);
/* Calls of `what` made so far (failed ones included). */
long calls(const char *what);
/* Forget injected failures, the last error and a sticky error (a test
 * that provoked a fault goes on). */
void reset_errors(void);

/* Objects alive now: "device" and "pinned" allocations, "streams",
 * "events", "handles" (cuBLAS). */
long live(const char *what);

/* The order a GPU may pick for a non-blocking stream's work: by default it
 * runs only when something waits for it (late: a read before its wait sees
 * stale bytes); eager, as soon as it is queued, after only the events it
 * waits for (early: a copy not told to wait for its producer copies stale
 * bytes). A test of stream order runs both. */
void eager_nonblocking(bool on);

} /* namespace rkm_dummy */

#endif /* RKM_DUMMY_H */
