/* cuda_check.cuh - the status of the last kernel launch, as the launchers report it. */
#ifndef HM_CUDA_CUDA_CHECK_CUH
#define HM_CUDA_CUDA_CHECK_CUH

#include <cuda_runtime.h>

extern "C" {
#include "base/status.h"
}

/* HM_OK, or HM_ERR_CUDA "CUDA kernel KERNEL: reason" when the last launch failed. */
static inline hm_status cu_launched(const char *kernel, hm_error *err) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? HM_OK
                            : hm_error_set(err, HM_ERR_CUDA, "CUDA kernel %s: %s", kernel,
                                           cudaGetErrorString(e));
}

#endif
