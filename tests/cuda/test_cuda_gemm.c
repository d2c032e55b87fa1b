/* Tensor-core prompt GEMM (cuda_gemm.h). f16 inputs with f32 accumulation are not the canonical
 * dot product, so results are compared, per output y[t][r], against
 *   exact:  sum_i w_i x_i in double, w_i = quant_dequantize_row's f32 values, x_i the f32 input;
 *   f16ref: the same with w_i and x_i first rounded to f16 (what the tensor cores multiply);
 *   cpu:    cpu_matmul / cpu_moe_matmul (q8 activations for block types, f32 for float types);
 * each error normalised by s = sum_i |w_i x_i|. Tolerances (with their derivation):
 *   exact  <= 2e-3: two f16 roundings (2 * 2^-11 relative each product) + f32 accumulation;
 *   f16ref <= k * 2^-24 + 1e-6: f32 accumulation in a different order only;
 *   cpu    <= 2e-2 for q8-activated types (the CPU's activation quantisation, <= 1/254 of a
 *             block's max per element, dominates), 2e-3 for f32/f16/bf16 weights.
 * Every type x two shapes (n_tok 9..512, k 768/2048/2304/2880, rows not multiples of 64); the
 * grouped product with repeated, skipped (-1) and out-of-range ids, both x_per_slot modes, and
 * untouched output rows for skipped slots. Without a GPU: the planning functions and the clean
 * error paths (HM_ERR_UNSUPPORTED / HM_ERR_ARG / HM_ERR_CUDA with a message). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/matmul.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_gemm.h"
#include "harness.h"
#include "cuda_test_util.h"
#include "quant/fp16.h"
#include "quant/quant.h"

#ifdef HOTMOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static const uint32_t k_types[] = {
    HM_TYPE_F32,  HM_TYPE_F16,   HM_TYPE_BF16,   HM_TYPE_Q4_0, HM_TYPE_Q4_1,
    HM_TYPE_Q5_0, HM_TYPE_Q5_1,  HM_TYPE_Q8_0,   HM_TYPE_MXFP4, HM_TYPE_IQ4_NL,
    HM_TYPE_Q4_K, HM_TYPE_Q5_K,  HM_TYPE_Q6_K,   HM_TYPE_IQ4_XS,
};
enum { N_TYPES = sizeof(k_types) / sizeof(k_types[0]) };

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* ---- host-only checks (every build) ---- */

static void test_planning(void) {
    for (int i = 0; i < N_TYPES; i++) HM_CHECK_MSG(cuda_gemm_supported(k_types[i]), "%s", hm_type_name(k_types[i]));
    HM_CHECK(!cuda_gemm_supported(HM_TYPE_Q8_K));
    HM_CHECK(!cuda_gemm_supported(HM_TYPE_Q2_K));
    HM_CHECK(!cuda_gemm_supported(HM_TYPE_COUNT + 5));
    HM_CHECK(cuda_gemm_scratch_size(768, 9) >= 768 * 9 * 2);
    HM_CHECK(cuda_gemm_scratch_size(0, 9) == 0);
    /* the tile bound holds for any routing: simulate random ones */
    uint64_t seed = 77;
    for (int trial = 0; trial < 200; trial++) {
        int n_expert = 1 + (int)(rng_next(&seed) % 160), n_pairs = 1 + (int)(rng_next(&seed) % 3000);
        int cnt[160] = {0};
        int skew = (int)(rng_next(&seed) % 3); /* 0 uniform, 1 few experts, 2 one expert */
        for (int p = 0; p < n_pairs; p++) {
            int e = (int)(rng_next(&seed) % (uint64_t)n_expert);
            if (skew == 1) e %= 3 < n_expert ? 3 : n_expert;
            if (skew == 2) e = 0;
            cnt[e]++;
        }
        int64_t tiles = 0;
        for (int e = 0; e < n_expert; e++) tiles += (cnt[e] + CUDA_GEMM_TILE_TOK - 1) / CUDA_GEMM_TILE_TOK;
        HM_CHECK_MSG(tiles <= cuda_gemm_moe_max_tiles(n_pairs, n_expert), "%lld tiles > bound",
                     (long long)tiles);
    }
    cuda_gemm_moe_args a = {.wtype = HM_TYPE_Q4_K, .n_expert = 128, .n_rows = 768, .k = 2048,
                            .x_per_slot = 1, .n_tok = 512, .n_used = 8};
    HM_CHECK(cuda_gemm_moe_scratch_size(&a) >= (size_t)512 * 8 * 2048 * 2 + 512 * 8 * 4);
    a.x_per_slot = 0;
    HM_CHECK(cuda_gemm_moe_scratch_size(&a) >= (size_t)512 * 2048 * 2 + 512 * 8 * 4);
}

static void test_errors(void) {
    int n = tu_gpu_count();
    if (tu_expect_gpu()) HM_CHECK_MSG(n >= 1, "HOTMOE_EXPECT_GPU=1 but no device");
#ifdef HOTMOE_HAVE_CUDA
    hm_error err;
    _Alignas(16) char dummy[64];
    float *fp = (float *)dummy;
    hm_error_clear(&err);
    HM_CHECK(cuda_gemm(HM_TYPE_Q8_K, dummy, 64, 256, fp, 9, fp, dummy, 1 << 20, NULL, &err) ==
             HM_ERR_UNSUPPORTED);
    HM_CHECK_MSG(strstr(err.msg, "q8_K") != NULL, "%s", err.msg);
    HM_CHECK(cuda_gemm(HM_TYPE_Q4_K, dummy, 64, 768 + 32, fp, 9, fp, dummy, 1 << 20, NULL, &err) ==
             HM_ERR_ARG);
    HM_CHECK(err.msg[0] != '\0');
    HM_CHECK(cuda_gemm(HM_TYPE_Q8_0, dummy, 64, 768, fp, 9, fp, dummy, 16, NULL, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "scratch") != NULL, "%s", err.msg);
    HM_CHECK(cuda_gemm(HM_TYPE_Q8_0, dummy + 2, 64, 768, fp, 9, fp, dummy, 1 << 20, NULL, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "aligned") != NULL, "%s", err.msg);
    cuda_gemm_moe_args a = {.wtype = HM_TYPE_Q8_0, .w = dummy, .n_expert = CUDA_GEMM_MAX_EXPERTS + 1,
                            .n_rows = 64, .k = 768, .x = fp, .ids = (const int32_t *)dummy,
                            .n_tok = 9, .n_used = 2, .y = fp};
    HM_CHECK(cuda_gemm_moe(&a, dummy, 1 << 20, NULL, &err) == HM_ERR_ARG);
    if (n == 0) {
        /* a valid call on a machine without a device fails at the launch, with a message */
        hm_error_clear(&err);
        hm_status st = cuda_gemm(HM_TYPE_Q8_0, dummy, 64, 768, fp, 9, fp, dummy, 1 << 20, NULL, &err);
        HM_CHECK_MSG(st == HM_ERR_CUDA, "status %d", (int)st);
        HM_CHECK_MSG(strstr(err.msg, "gemm") != NULL, "%s", err.msg);
    }
#else
    HM_CHECK(!cuda_compiled());
    HM_CHECK(n == 0);
#endif
    if (n == 0) printf("no CUDA device: GPU checks not run\n");
}

#ifdef HOTMOE_HAVE_CUDA

/* uniform in [-1, 1) */
static float rng_unit(uint64_t *s) { return (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0); }

/* copy of v[0..n) rounded to f16 (what the tensor cores multiply) */
static float *round_f16(const float *v, int64_t n) {
    float *r = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) r[i] = hm_fp16_to_f32(hm_f32_to_fp16(v[i]));
    return r;
}

typedef struct {
    double exact, f16ref, cpu; /* largest normalised errors */
} errs;

/* Quantised random weights [n_rows][k] of type t and their f32 values. Rows get different
 * magnitudes (as trained weights do). */
static void *make_weights(uint32_t t, int64_t n_rows, int64_t k, uint64_t *seed, float **deq) {
    size_t rb = hm_row_size(t, k);
    uint8_t *q = malloc(rb * (size_t)n_rows);
    float *src = malloc(sizeof(float) * (size_t)k);
    *deq = malloc(sizeof(float) * (size_t)(k * n_rows));
    for (int64_t r = 0; r < n_rows; r++) {
        float scale = 0.02f * (float)(1 + r % 7);
        for (int64_t i = 0; i < k; i++) src[i] = scale * (rng_unit(seed) + 0.5f * rng_unit(seed));
        HM_CHECK(quant_quantize_row(t, src, q + rb * (size_t)r, k) == HM_OK);
        HM_CHECK(quant_dequantize_row(t, q + rb * (size_t)r, *deq + r * k, k) == HM_OK);
    }
    free(src);
    return q;
}

/* activations with occasional outliers (x8) */
static float *make_x(int64_t rows, int64_t k, uint64_t *seed) {
    float *x = malloc(sizeof(float) * (size_t)(rows * k));
    for (int64_t i = 0; i < rows * k; i++) {
        x[i] = rng_unit(seed);
        if (rng_next(seed) % 97 == 0) x[i] *= 8.0f;
    }
    return x;
}

/* compares one output against the double references of w (f32 values) . x; w16 and x16 are
 * their f16-rounded copies */
static void cmp_out(const float *w, const float *w16, const float *x, const float *x16, int64_t k,
                    float got, float cpu, errs *e, int *bad) {
    double ex = 0, h = 0, s = 0;
    for (int64_t i = 0; i < k; i++) {
        const double p = (double)w[i] * x[i];
        ex += p;
        h += (double)w16[i] * x16[i];
        s += fabs(p);
    }
    if (!isfinite(got)) {
        (*bad)++;
        return;
    }
    if (s == 0) s = 1e-30;
    double a = fabs(got - ex) / s, b = fabs(got - h) / s, c = fabs((double)got - cpu) / s;
    if (a > e->exact) e->exact = a;
    if (b > e->f16ref) e->f16ref = b;
    if (c > e->cpu) e->cpu = c;
}

static void check_errs(const char *what, uint32_t t, int64_t k, const errs *e, int bad) {
    double tol_cpu = quant_act_for(t) == QUANT_ACT_F32 ? 2e-3 : 2e-2;
    double tol_h = (double)k * 0x1p-24 + 1e-6;
    printf("  %-6s %-8s k=%-5lld exact %.2e  f16ref %.2e  cpu %.2e\n", what, hm_type_name(t),
           (long long)k, e->exact, e->f16ref, e->cpu);
    HM_CHECK_MSG(bad == 0, "%s %s: %d non-finite outputs", what, hm_type_name(t), bad);
    HM_CHECK_MSG(e->exact <= 2e-3, "%s %s: error vs exact %.3e", what, hm_type_name(t), e->exact);
    HM_CHECK_MSG(e->f16ref <= tol_h, "%s %s: error vs f16 reference %.3e", what, hm_type_name(t), e->f16ref);
    HM_CHECK_MSG(e->cpu <= tol_cpu, "%s %s: difference from cpu %.3e", what, hm_type_name(t), e->cpu);
}

#define CU(call) HM_CHECK_MSG((call) == cudaSuccess, "%s", #call)

static void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    CU(cudaMalloc(&d, n ? n : 1));
    if (h && n) CU(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

static void run_dense(uint32_t t, int64_t n_tok, int64_t n_rows, int64_t k, uint64_t *seed) {
    float *wd;
    void *wq = make_weights(t, n_rows, k, seed, &wd);
    float *x = make_x(n_tok, k, seed);
    size_t wbytes = hm_row_size(t, k) * (size_t)n_rows, ybytes = sizeof(float) * (size_t)(n_tok * n_rows);
    float *y = malloc(ybytes), *ycpu = malloc(ybytes);
    hm_error err;
    hm_error_clear(&err);
    HM_CHECK_MSG(cpu_matmul(NULL, NULL, t, wq, n_rows, k, x, n_tok, ycpu, NULL, 0, &err) == HM_OK, "%s", err.msg);

    void *dw = dev_copy(wq, wbytes), *dx = dev_copy(x, sizeof(float) * (size_t)(n_tok * k));
    void *dy = dev_copy(NULL, ybytes);
    size_t ss = cuda_gemm_scratch_size(k, n_tok);
    void *ds = dev_copy(NULL, ss);
    hm_status st = cuda_gemm(t, dw, n_rows, k, dx, n_tok, dy, ds, ss, NULL, &err);
    HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(y, dy, ybytes, cudaMemcpyDeviceToHost));
    errs e = {0, 0, 0};
    int bad = 0;
    float *w16 = round_f16(wd, n_rows * k), *x16 = round_f16(x, n_tok * k);
    for (int64_t tk = 0; tk < n_tok; tk++)
        for (int64_t r = 0; r < n_rows; r++)
            cmp_out(wd + r * k, w16 + r * k, x + tk * k, x16 + tk * k, k, y[tk * n_rows + r],
                    ycpu[tk * n_rows + r], &e, &bad);
    free(w16), free(x16);
    char what[32];
    snprintf(what, sizeof(what), "%lldx%lld", (long long)n_tok, (long long)n_rows);
    check_errs(what, t, k, &e, bad);
    cudaFree(dw), cudaFree(dx), cudaFree(dy), cudaFree(ds);
    free(wq), free(wd), free(x), free(y), free(ycpu);
}

static void test_dense(void) {
    if (tu_gpu_count() == 0) return;
    uint64_t seed = 12345;
    /* (n_tok, n_rows, k) pairs per type; k must be a multiple of the type's block */
    for (int i = 0; i < N_TYPES; i++) {
        uint32_t t = k_types[i];
        int kq = hm_type_get(t)->block_size == 256;
        run_dense(t, 9 + 8 * i, 65 + 13 * i, kq ? 768 : 2880, &seed);
        run_dense(t, i % 2 ? 512 : 130, 70, kq ? 2304 : 2048, &seed);
    }
}

/* grouped: ids with repeats, -1 and >= n_expert; y starts as a sentinel that skipped slots keep */
static void run_moe(uint32_t t, int64_t n_tok, int n_used, int64_t n_expert, int64_t n_rows,
                    int64_t k, int x_per_slot, uint64_t *seed) {
    float *wd;
    void *wq = make_weights(t, n_expert * n_rows, k, seed, &wd);
    int64_t n_pairs = n_tok * n_used, x_rows = x_per_slot ? n_pairs : n_tok;
    float *x = make_x(x_rows, k, seed);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_pairs), *ids_cpu = malloc(sizeof(int32_t) * (size_t)n_pairs);
    for (int64_t p = 0; p < n_pairs; p++) {
        uint64_t r = rng_next(seed) % 100;
        int32_t id = (int32_t)(rng_next(seed) % (uint64_t)n_expert);
        if (r < 8) id = -1;
        else if (r < 11) id = (int32_t)n_expert + (int32_t)(r % 3); /* out of range: skipped */
        else if (r < 25 && p % n_used) id = ids[p - 1];               /* repeat in a token */
        ids[p] = id;
        ids_cpu[p] = id >= n_expert ? -1 : id;
    }
    const float sentinel = -12345.5f;
    size_t ybytes = sizeof(float) * (size_t)(n_pairs * n_rows);
    float *y = malloc(ybytes), *ycpu = malloc(ybytes);
    for (int64_t i = 0; i < n_pairs * n_rows; i++) y[i] = sentinel;
    hm_error err;
    hm_error_clear(&err);
    cpu_moe_args ca = {.wtype = t, .w = wq, .n_expert = n_expert, .n_rows = n_rows, .k = k, .x = x,
                       .x_per_slot = x_per_slot, .ids = ids_cpu, .n_tok = n_tok, .n_used = n_used, .y = ycpu};
    HM_CHECK_MSG(cpu_moe_matmul(NULL, NULL, &ca, NULL, 0, &err) == HM_OK, "%s", err.msg);

    size_t wbytes = hm_row_size(t, k) * (size_t)(n_expert * n_rows);
    void *dw = dev_copy(wq, wbytes), *dx = dev_copy(x, sizeof(float) * (size_t)(x_rows * k));
    void *dids = dev_copy(ids, sizeof(int32_t) * (size_t)n_pairs), *dy = dev_copy(y, ybytes);
    cuda_gemm_moe_args a = {.wtype = t, .w = dw, .n_expert = n_expert, .n_rows = n_rows, .k = k,
                            .x = dx, .x_per_slot = x_per_slot, .ids = dids, .n_tok = n_tok,
                            .n_used = n_used, .y = dy};
    size_t ss = cuda_gemm_moe_scratch_size(&a);
    void *ds = dev_copy(NULL, ss);
    hm_status st = cuda_gemm_moe(&a, ds, ss, NULL, &err);
    HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(y, dy, ybytes, cudaMemcpyDeviceToHost));
    errs e = {0, 0, 0};
    int bad = 0, kept = 1;
    float *w16 = round_f16(wd, n_expert * n_rows * k), *x16 = round_f16(x, x_rows * k);
    for (int64_t p = 0; p < n_pairs; p++) {
        const int64_t xo = (x_per_slot ? p : p / n_used) * k;
        for (int64_t r = 0; r < n_rows; r++) {
            const float v = y[p * n_rows + r];
            const int64_t wo = ((int64_t)ids_cpu[p] * n_rows + r) * k;
            if (ids_cpu[p] < 0) kept &= v == sentinel;
            else cmp_out(wd + wo, w16 + wo, x + xo, x16 + xo, k, v, ycpu[p * n_rows + r], &e, &bad);
        }
    }
    free(w16), free(x16);
    HM_CHECK_MSG(kept, "%s: a skipped slot's rows were written", hm_type_name(t));
    char what[32];
    snprintf(what, sizeof(what), "moe/%d", x_per_slot);
    check_errs(what, t, k, &e, bad);
    cudaFree(dw), cudaFree(dx), cudaFree(dids), cudaFree(dy), cudaFree(ds);
    free(wq), free(wd), free(x), free(ids), free(ids_cpu), free(y), free(ycpu);
}

static void test_moe(void) {
    if (tu_gpu_count() == 0) return;
    uint64_t seed = 999;
    /* few experts, many pairs each (several tiles per expert) */
    run_moe(HM_TYPE_Q4_K, 150, 4, 5, 70, 768, 0, &seed);
    run_moe(HM_TYPE_MXFP4, 150, 4, 5, 70, 2880, 1, &seed);
    /* many experts, a few pairs each, and unselected experts */
    run_moe(HM_TYPE_Q8_0, 61, 8, 48, 96, 768, 1, &seed);
    run_moe(HM_TYPE_F16, 61, 8, 48, 96, 768, 0, &seed);
    run_moe(HM_TYPE_IQ4_XS, 33, 8, 128, 64, 768, 0, &seed);
    run_moe(HM_TYPE_Q6_K, 9, 2, 16, 130, 2048, 1, &seed);
}

/* an all-skipped routing launches no work and writes nothing */
static void test_moe_all_skipped(void) {
    if (tu_gpu_count() == 0) return;
    const int64_t n_tok = 20, n_rows = 64, k = 256;
    const int n_used = 3;
    uint64_t seed = 5;
    float *wd;
    void *wq = make_weights(HM_TYPE_Q4_K, 4 * n_rows, k, &seed, &wd);
    int32_t ids[20 * 3];
    for (int i = 0; i < 60; i++) ids[i] = i % 2 ? -1 : 4;
    float *x = make_x(n_tok, k, &seed), y[20 * 3 * 64];
    for (int i = 0; i < 20 * 3 * 64; i++) y[i] = 7.0f;
    void *dw = dev_copy(wq, hm_row_size(HM_TYPE_Q4_K, k) * 4 * n_rows);
    void *dx = dev_copy(x, sizeof(float) * n_tok * k), *dids = dev_copy(ids, sizeof(ids));
    void *dy = dev_copy(y, sizeof(y));
    cuda_gemm_moe_args a = {.wtype = HM_TYPE_Q4_K, .w = dw, .n_expert = 4, .n_rows = n_rows, .k = k,
                            .x = dx, .ids = dids, .n_tok = n_tok, .n_used = n_used, .y = dy};
    size_t ss = cuda_gemm_moe_scratch_size(&a);
    void *ds = dev_copy(NULL, ss);
    hm_error err;
    HM_CHECK_MSG(cuda_gemm_moe(&a, ds, ss, NULL, &err) == HM_OK, "%s", err.msg);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(y, dy, sizeof(y), cudaMemcpyDeviceToHost));
    int same = 1;
    for (int i = 0; i < 20 * 3 * 64; i++) same &= y[i] == 7.0f;
    HM_CHECK(same);
    cudaFree(dw), cudaFree(dx), cudaFree(dids), cudaFree(dy), cudaFree(ds);
    free(wq), free(wd), free(x);
}

TU_TEST_MAIN(test_planning, test_errors, test_dense, test_moe, test_moe_all_skipped)
#else
TU_TEST_MAIN(test_planning, test_errors)
#endif
