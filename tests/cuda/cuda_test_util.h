/* cuda_test_util.h - small helpers shared by the tests/cuda programs: a seeded
 * generator, the GPU presence rule of the CUDA tests (no GPU: GPU checks are skipped with a
 * line, unless HOTMOE_EXPECT_GPU=1, which makes their absence a failure) and device buffers
 * (CUDA builds only). */
#ifndef HM_TESTS_CUDA_TEST_UTIL_H
#define HM_TESTS_CUDA_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_device.h"
#include "harness.h"

#ifdef HOTMOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static inline uint64_t tu_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
/* uniform in [-1, 1) */
static inline float tu_unit(uint64_t *s) { return (float)((double)(tu_next(s) >> 11) * 0x1p-52 - 1.0); }

static inline void tu_fill(uint64_t *s, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = tu_unit(s) * scale;
}

/* HOTMOE_EXPECT_GPU=1: the GPU machine's run, where a missing device is a failure. */
static inline int tu_expect_gpu(void) {
    const char *e = getenv("HOTMOE_EXPECT_GPU");
    return e && e[0] == '1';
}

/* CUDA devices present (0 when the query fails or the build has no CUDA), silently */
static inline int tu_gpu_count(void) {
    cuda_device_info d[4];
    int n = 0;
    hm_error err;
    hm_error_clear(&err);
    return cuda_device_query(d, 4, &n, &err) == HM_OK ? n : 0;
}

/* 1 when GPU checks can run; otherwise prints the skip line and checks that no GPU was
 * required. */
static inline int tu_have_gpu(void) {
    cuda_device_info d[4];
    int n = 0;
    hm_error err;
    hm_error_clear(&err);
    HM_CHECK_MSG(cuda_device_query(d, 4, &n, &err) == HM_OK, "%s", err.msg);
    if (n > 0) return 1;
    HM_CHECK_MSG(!tu_expect_gpu(), "HOTMOE_EXPECT_GPU=1 but no CUDA device (compiled: %d)",
                 cuda_compiled());
    printf("no CUDA device: GPU checks not run\n");
    return 0;
}

#ifdef HOTMOE_HAVE_CUDA
/* device copy of n bytes of h (h NULL: uninitialised); NULL on failure */
static inline void *tu_dev(const void *h, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) return NULL;
    if (h && n && cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

/* waits for the device, then copies n bytes back; 1 on success */
static inline int tu_get(void *h, const void *d, size_t n) {
    if (cudaDeviceSynchronize() != cudaSuccess) return 0;
    return cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess;
}

static inline int tu_put(void *d, const void *h, size_t n) {
    return cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess;
}
#endif

#endif
