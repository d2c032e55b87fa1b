/* cuda_test_util.h - small helpers shared by the tests/cuda programs: a seeded
 * generator, the GPU presence rule of the CUDA tests (no GPU: GPU checks are skipped with a
 * line, unless HOTMOE_EXPECT_GPU=1, which makes their absence a failure), TU_TEST_MAIN (a
 * program that could not run its GPU checks exits TU_SKIP_CODE: ctest reports it skipped, not
 * passed), device buffers, their byte comparison and random weight rows (CUDA builds only). */
#ifndef HM_TESTS_CUDA_TEST_UTIL_H
#define HM_TESTS_CUDA_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_device.h"
#include "harness.h"
#include "quant/qtypes.h"
#include "quant/quant.h"

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

/* the first index of the largest of row[0..n) (greedy decoding in tests) */
static inline int32_t tu_argmax(const float *row, int64_t n) {
    int32_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (row[i] > row[b]) b = (int32_t)i;
    return b;
}

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

/* The exit status of a test program whose checks passed but which could not run all of them
 * (no CUDA device, or a build without CUDA): CMakeLists.txt gives it to ctest as
 * SKIP_RETURN_CODE, so the test is counted as skipped, never as passed. */
#define TU_SKIP_CODE 77

/* The status of a GPU test program after its checks: a failure stays a failure; with no CUDA
 * device the host-side checks passed but the GPU ones did not run, so the program reports
 * itself skipped (and fails instead under HOTMOE_EXPECT_GPU=1). */
static inline int tu_exit_status(int rc) {
    if (rc != 0 || tu_gpu_count() > 0) return rc;
    if (tu_expect_gpu()) {
        fprintf(stderr, "HOTMOE_EXPECT_GPU=1 but no CUDA device\n");
        return 1;
    }
    printf("skipped: %s; the host checks passed, the GPU checks did not run (exit %d)\n",
           cuda_compiled() ? "no CUDA device" : "built without CUDA", TU_SKIP_CODE);
    return TU_SKIP_CODE;
}

/* HM_TEST_MAIN for the GPU test programs: the same run, then tu_exit_status. */
#define TU_TEST_MAIN(...)                                                                  \
    int main(void) {                                                                       \
        hm_t_fn fns[] = {__VA_ARGS__};                                                     \
        return tu_exit_status(                                                             \
            hm_t_run(#__VA_ARGS__, fns, (int)(sizeof(fns) / sizeof(fns[0]))));             \
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

/* first byte where a and b differ, or -1 */
static inline int64_t tu_diff_at(const void *a, const void *b, size_t n) {
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return (int64_t)i;
    return -1;
}

/* device buffers a and b (n bytes) must hold the same bytes */
static inline void tu_same_dev(const void *a, const void *b, size_t n, const char *what, int cfg) {
    uint8_t *x = malloc(n ? n : 1), *y = malloc(n ? n : 1);
    HM_REQUIRE(x && y);
    HM_REQUIRE(tu_get(x, a, n) && tu_get(y, b, n));
    const int64_t d = tu_diff_at(x, y, n);
    HM_CHECK_MSG(d < 0, "config %d: %s differs at byte %lld of %zu", cfg, what, (long long)d, n);
    free(x);
    free(y);
}

/* random weight rows of type t: quantised random floats (random bytes if t has no quantiser) */
static inline uint8_t *tu_make_weights(uint64_t *s, uint32_t t, int64_t rows, int64_t k) {
    const size_t rb = hm_row_size(t, k);
    uint8_t *w = malloc(rb * rows);
    float *f = malloc(sizeof(float) * k);
    if (!w || !f) {
        free(w);
        free(f);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        tu_fill(s, f, k, 1.0f);
        if (quant_quantize_row(t, f, w + rb * r, k) != HM_OK)
            for (size_t i = 0; i < rb; i++) w[rb * r + i] = (uint8_t)tu_next(s);
    }
    free(f);
    return w;
}
#endif

#endif
