/* bench_cuda_gemm - throughput of the tensor-core prompt GEMM (cuda_gemm.h) at pp512 sizes.
 *
 *   bench_cuda_gemm [--iters N]
 *
 * Dense: y[512][4096] = x[512][2048] . W^T per weight type. Grouped: 128 experts of 768 rows
 * (k 2048, gate/up-like, shared x) and of 2048 rows (k 768, down-like, x per slot), 512 tokens
 * x 8 slots with uniformly random distinct experts per token. Each figure is the mean of N
 * timed calls (cudaEvent around the loop, after 3 warm-up calls), including the f32->f16
 * activation conversion and (grouped) the routing kernel. TFLOP/s counts 2 * n_tok(pairs) *
 * n_rows * k; the fraction is of the device's dense f16 tensor-core peak (H100/H200 SXM 989.4
 * TFLOP/s, H100 PCIe 756; other devices: no fraction). Prints a markdown table. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HOTMOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_device.h"
#include "cuda/cuda_gemm.h"
#include "quant/quant.h"

#include "bench_cuda_util.h"

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* device copy of n_rows random rows of k elements of type t (64 distinct rows repeated: the
 * kernel's cost does not depend on the values; the matrix still has its full size) */
static void *dev_weights(uint32_t t, int64_t n_rows, int64_t k, uint64_t *seed) {
    size_t rb = hm_row_size(t, k);
    enum { DISTINCT = 64 };
    uint8_t *h = malloc(rb * DISTINCT);
    float *src = malloc(sizeof(float) * (size_t)k);
    for (int r = 0; r < DISTINCT; r++) {
        for (int64_t i = 0; i < k; i++) src[i] = (float)((int64_t)(rng_next(seed) % 2001) - 1000) * 1e-5f;
        if (quant_quantize_row(t, src, h + rb * (size_t)r, k) != HM_OK) {
            fprintf(stderr, "bench_cuda_gemm: cannot quantise %s\n", hm_type_name(t));
            exit(1);
        }
    }
    uint8_t *d = NULL;
    CK(cudaMalloc((void **)&d, rb * (size_t)n_rows));
    for (int64_t r = 0; r < n_rows; r += DISTINCT) {
        int64_t n = n_rows - r < DISTINCT ? n_rows - r : DISTINCT;
        CK(cudaMemcpy(d + rb * (size_t)r, h, rb * (size_t)n, cudaMemcpyHostToDevice));
    }
    free(h), free(src);
    return d;
}

static float *dev_x(int64_t n, uint64_t *seed) {
    float *h = malloc(sizeof(float) * (size_t)n), *d = NULL;
    for (int64_t i = 0; i < n; i++) h[i] = (float)((int64_t)(rng_next(seed) % 2001) - 1000) * 1e-3f;
    CK(cudaMalloc((void **)&d, sizeof(float) * (size_t)n));
    CK(cudaMemcpy(d, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static double peak_tflops(const char *name) {
    if (strstr(name, "H100") && strstr(name, "PCIe")) return 756.0;
    if (strstr(name, "H100") || strstr(name, "H200")) return 989.4;
    return 0;
}

static void report(const char *what, uint32_t t, double flops, double ms, double peak) {
    double tf = flops / (ms * 1e-3) / 1e12;
    printf("| %s | %s | %.3f | %.1f | ", what, hm_type_name(t), ms, tf);
    if (peak > 0) printf("%.1f%% |\n", 100.0 * tf / peak);
    else printf("- |\n");
    fflush(stdout);
}

static double time_dense(uint32_t t, int64_t n_tok, int64_t n_rows, int64_t k, int iters, uint64_t *seed) {
    void *w = dev_weights(t, n_rows, k, seed);
    float *x = dev_x(n_tok * k, seed), *y = NULL;
    CK(cudaMalloc((void **)&y, sizeof(float) * (size_t)(n_tok * n_rows)));
    size_t ss = cuda_gemm_scratch_size(k, n_tok);
    void *s = NULL;
    CK(cudaMalloc(&s, ss));
    hm_error err;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < iters + 3; i++) {
        if (i == 3) CK(cudaEventRecord(e0, NULL));
        if (cuda_gemm(t, w, n_rows, k, x, n_tok, y, s, ss, NULL, &err) != HM_OK) {
            fprintf(stderr, "bench_cuda_gemm: %s\n", err.msg);
            exit(1);
        }
    }
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(w), cudaFree(x), cudaFree(y), cudaFree(s);
    return ms / iters;
}

static double time_moe(uint32_t t, int64_t n_tok, int n_used, int64_t n_expert, int64_t n_rows,
                       int64_t k, int x_per_slot, int iters, uint64_t *seed) {
    void *w = dev_weights(t, n_expert * n_rows, k, seed);
    int64_t n_pairs = n_tok * n_used;
    float *x = dev_x((x_per_slot ? n_pairs : n_tok) * k, seed), *y = NULL;
    CK(cudaMalloc((void **)&y, sizeof(float) * (size_t)(n_pairs * n_rows)));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_pairs), *dids = NULL;
    for (int64_t tk = 0; tk < n_tok; tk++)
        for (int s = 0; s < n_used; s++) {
            int32_t id;
            int dup;
            do { /* distinct experts within a token, as a router's top-k */
                id = (int32_t)(rng_next(seed) % (uint64_t)n_expert);
                dup = 0;
                for (int j = 0; j < s; j++) dup |= ids[tk * n_used + j] == id;
            } while (dup);
            ids[tk * n_used + s] = id;
        }
    CK(cudaMalloc((void **)&dids, sizeof(int32_t) * (size_t)n_pairs));
    CK(cudaMemcpy(dids, ids, sizeof(int32_t) * (size_t)n_pairs, cudaMemcpyHostToDevice));
    cuda_gemm_moe_args a = {.wtype = t, .w = w, .n_expert = n_expert, .n_rows = n_rows, .k = k,
                            .x = x, .x_per_slot = x_per_slot, .ids = dids, .n_tok = n_tok,
                            .n_used = n_used, .y = y};
    size_t ss = cuda_gemm_moe_scratch_size(&a);
    void *s = NULL;
    CK(cudaMalloc(&s, ss));
    hm_error err;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < iters + 3; i++) {
        if (i == 3) CK(cudaEventRecord(e0, NULL));
        if (cuda_gemm_moe(&a, s, ss, NULL, &err) != HM_OK) {
            fprintf(stderr, "bench_cuda_gemm: %s\n", err.msg);
            exit(1);
        }
    }
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(w), cudaFree(x), cudaFree(y), cudaFree(s), cudaFree(dids);
    free(ids);
    return ms / iters;
}

int main(int argc, char **argv) {
    int iters = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cuda_gemm [--iters N]\n");
            return 2;
        }
    }
    if (iters < 1) iters = 1;
    cuda_device_info dev[1];
    int n = 0;
    hm_error err;
    if (cuda_device_query(dev, 1, &n, &err) != HM_OK || n == 0) {
        printf("bench_cuda_gemm: no CUDA device\n");
        return 0;
    }
    const double peak = peak_tflops(dev[0].name);
    printf("device: %s (%d SMs), dense f16 tensor peak %.1f TFLOP/s, %d iterations\n\n",
           dev[0].name, dev[0].sm_count, peak, iters);
    printf("| product | type | ms | TFLOP/s | of peak |\n|---|---|---|---|---|\n");
    uint64_t seed = 42;
    const uint32_t types[] = {HM_TYPE_F16, HM_TYPE_BF16, HM_TYPE_Q8_0, HM_TYPE_Q4_0, HM_TYPE_Q4_K,
                              HM_TYPE_Q5_K, HM_TYPE_Q6_K, HM_TYPE_MXFP4, HM_TYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        double ms = time_dense(types[i], 512, 4096, 2048, iters, &seed);
        report("dense 512 tok x 4096 rows x k 2048", types[i], 2.0 * 512 * 4096 * 2048, ms, peak);
    }
    const uint32_t mtypes[] = {HM_TYPE_Q4_K, HM_TYPE_MXFP4, HM_TYPE_Q8_0, HM_TYPE_F16};
    for (size_t i = 0; i < sizeof(mtypes) / sizeof(mtypes[0]); i++) {
        double ms = time_moe(mtypes[i], 512, 8, 128, 768, 2048, 0, iters, &seed);
        report("grouped 128 exp x 768 rows x k 2048, 512 tok x 8", mtypes[i],
               2.0 * 512 * 8 * 768 * 2048, ms, peak);
        ms = time_moe(mtypes[i], 512, 8, 128, 2048, 768, 1, iters, &seed);
        report("grouped 128 exp x 2048 rows x k 768 (x per slot), 512 tok x 8", mtypes[i],
               2.0 * 512 * 8 * 2048 * 768, ms, peak);
    }
    return 0;
}

#else
int main(void) {
    printf("bench_cuda_gemm: built without CUDA\n");
    return 0;
}
#endif
