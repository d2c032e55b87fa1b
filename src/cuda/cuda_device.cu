/* cuda_device.cu - device enumeration for the CUDA build (see cuda_device.h). */
#include <cuda_runtime.h>
#include <string.h>

extern "C" {
#include "cuda/cuda_device.h"
}

extern "C" int cuda_compiled(void) { return 1; }

extern "C" hm_status cuda_device_query(cuda_device_info *out, int max, int *n, hm_error *err) {
    *n = 0;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        cudaGetLastError(); /* clear the sticky-free error */
        return HM_OK;
    }
    if (e != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
    for (int i = 0; i < count && i < max; i++) {
        cudaDeviceProp p;
        e = cudaGetDeviceProperties(&p, i);
        if (e != cudaSuccess)
            return hm_error_set(err, HM_ERR_CUDA, "cudaGetDeviceProperties(%d): %s", i,
                                cudaGetErrorString(e));
        cuda_device_info *d = &out[i];
        memset(d, 0, sizeof(*d));
        strncpy(d->name, p.name, sizeof(d->name) - 1);
        d->cc_major = p.major;
        d->cc_minor = p.minor;
        d->total_bytes = p.totalGlobalMem;
        d->sm_count = p.multiProcessorCount;
        size_t free_b = 0, total_b = 0;
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            d->free_bytes = free_b;
        *n = i + 1;
    }
    return HM_OK;
}
