/* test_cuda_quant.c - the GPU quantised products equal the CPU's bytes (cuda_quant.h):
 * for all 14 weight types x k in {256, 768, 2048, 32*37 where the block allows} x n_tok in
 * {1, 2, 3, 5, 8, 13}: activation rows (cuda_quantize_act vs quant_act_quantize_ref),
 * cuda_matvec vs cpu_matmul, cuda_moe_matvec vs cpu_moe_matmul (repeated ids, -1 skips, both
 * x_per_slot; skipped rows untouched; ids >= n_expert skipped on the GPU; 5 experts, where a
 * step of several tokens takes the tiled instance, and 40, where up to 13 tokens x 3 take a
 * pair per CTA), cuda_moe_gate_up vs
 * the CPU's gate/up + bias + activation (silu, gpt-oss's, gelu; with and without biases) and
 * cuda_get_rows vs quant_dequantize_row, and cuda_quantize_act_glu vs cuda_swiglu +
 * cuda_quantize_act. Without a GPU: cuda_act_row_bytes equals
 * quant_act_row_size for every type, and every launcher fails cleanly with a message.
 * Weights are quantised from seeded random floats (quant_quantize_row), so scales are finite. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_quant.h"
#include "harness.h"

#include "cuda_test_util.h"

static const uint32_t k_types[] = {HM_TYPE_F32,  HM_TYPE_F16,   HM_TYPE_BF16, HM_TYPE_Q8_0,
                                   HM_TYPE_Q4_0, HM_TYPE_Q4_1,  HM_TYPE_Q5_0, HM_TYPE_Q5_1,
                                   HM_TYPE_Q4_K, HM_TYPE_Q5_K,  HM_TYPE_Q6_K, HM_TYPE_MXFP4,
                                   HM_TYPE_IQ4_NL, HM_TYPE_IQ4_XS};
#define N_TYPES (sizeof(k_types) / sizeof(k_types[0]))
static const int64_t k_ks[] = {256, 768, 2048, 32 * 37};
#define MAX_TOK 13

static void test_row_bytes(void) {
    for (size_t i = 0; i < N_TYPES; i++)
        for (size_t j = 0; j < sizeof(k_ks) / sizeof(k_ks[0]); j++) {
            const uint32_t t = k_types[i];
            const size_t want = quant_act_row_size(quant_act_for(t), k_ks[j]);
            HM_CHECK_MSG(cuda_act_row_bytes(t, k_ks[j]) == want, "%s k %lld", hm_type_name(t),
                         (long long)k_ks[j]);
            HM_CHECK(hm_type_get(t)->block_size == 256 && k_ks[j] % 256 ? want == 0 : want > 0);
        }
    HM_CHECK(cuda_act_row_bytes(HM_TYPE_Q4_K, 768) == 3 * sizeof(block_q8_K));
    HM_CHECK(cuda_act_row_bytes(HM_TYPE_Q4_0, 64) == 2 * sizeof(block_q8_32));
    HM_CHECK(cuda_act_row_bytes(HM_TYPE_F16, 10) == 40);
    HM_CHECK(cuda_act_row_bytes(HM_TYPE_Q2_K, 256) == 0); /* unsupported type */
}

/* Arguments are never touched when the call fails; the status says why. */
static void check_fails(hm_status st, const hm_error *err, const char *what) {
    HM_CHECK_MSG(st == HM_ERR_UNSUPPORTED || st == HM_ERR_CUDA, "%s: status %d", what, (int)st);
    HM_CHECK_MSG(err->msg[0] != '\0', "%s: no message", what);
}

/* No GPU (or no CUDA build): every entry point returns an error with a message. */
static void test_clean_errors(void) {
    float dummy[64];
    int32_t ids[1] = {0};
    hm_error err;
    hm_error_clear(&err);
    /* an unsupported type is refused before anything reaches the device */
    hm_status st = cuda_matvec(HM_TYPE_Q2_K, dummy, 1, 256, dummy, 1, dummy, NULL, &err);
    HM_CHECK(st == HM_ERR_UNSUPPORTED);
    if (cuda_compiled()) HM_CHECK_MSG(strstr(err.msg, "q2_K") != NULL, "%s", err.msg);
    if (cuda_compiled()) { /* shape errors are host-side too */
        hm_error_clear(&err);
        HM_CHECK(cuda_matvec(HM_TYPE_Q4_K, dummy, 1, 100, dummy, 1, dummy, NULL, &err) == HM_ERR_ARG);
        HM_CHECK(strstr(err.msg, "k = 100") != NULL);
        cuda_moe_gate_up_args ga = {.gate = {.wtype = HM_TYPE_Q4_K, .w = dummy, .n_expert = 1,
                                             .n_rows = 1, .k = 256, .act = dummy, .ids = ids,
                                             .n_tok = 1, .n_used = 1},
                                    .up_wtype = HM_TYPE_Q6_K, .up_w = dummy, .out = dummy};
        HM_CHECK(cuda_moe_gate_up(&ga, NULL, &err) == HM_ERR_UNSUPPORTED);
        hm_error_clear(&err); /* float weights read f32 rows: nothing to quantise */
        HM_CHECK(cuda_quantize_act_glu(HM_TYPE_F16, dummy, dummy, 256, 1, dummy, NULL, &err) ==
                     HM_ERR_ARG && strstr(err.msg, "f32 rows"));
    }
    if (tu_have_gpu()) return; /* the launches below would run */
    hm_error_clear(&err);
    check_fails(cuda_quantize_act(HM_TYPE_Q4_K, dummy, 256, 1, dummy, NULL, &err), &err, "quantize_act");
    hm_error_clear(&err);
    check_fails(cuda_matvec(HM_TYPE_Q4_K, dummy, 1, 256, dummy, 1, dummy, NULL, &err), &err, "matvec");
    cuda_moe_args a = {.wtype = HM_TYPE_Q8_0, .w = dummy, .n_expert = 1, .n_rows = 1, .k = 32,
                       .act = dummy, .ids = ids, .n_tok = 1, .n_used = 1, .y = dummy};
    hm_error_clear(&err);
    check_fails(cuda_moe_matvec(&a, NULL, &err), &err, "moe_matvec");
    cuda_moe_gate_up_args g = {.gate = a, .up_wtype = HM_TYPE_Q8_0, .up_w = dummy, .out = dummy};
    hm_error_clear(&err);
    check_fails(cuda_moe_gate_up(&g, NULL, &err), &err, "moe_gate_up");
    hm_error_clear(&err);
    check_fails(cuda_get_rows(HM_TYPE_Q8_0, dummy, 34, ids, 1, 32, dummy, NULL, &err), &err, "get_rows");
}

#ifdef HOTMOE_HAVE_CUDA

static const int64_t k_ntoks[] = {1, 2, 3, 5, 8, 13};
static uint64_t g_seed = 0x9e3779b97f4a7c15ull;

/* rows x k weights of type t quantised from random floats in [-1, 1) */
static uint8_t *make_weights(uint32_t t, int64_t rows, int64_t k) {
    const size_t rs = hm_row_size(t, k);
    uint8_t *w = malloc(rs * (size_t)rows);
    float *f = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < rows && w; r++) {
        tu_fill(&g_seed, f, k, 1.0f);
        if (quant_quantize_row(t, f, w + (size_t)r * rs, k) != HM_OK) {
            free(w);
            w = NULL;
        }
    }
    free(f);
    return w;
}

#define CU(call) HM_REQUIRE((call) == HM_OK)
#define SENTINEL 12345.0f

typedef struct {
    uint32_t t;
    int64_t k, n_rows, n_expert;
    size_t rs, ab;
    uint8_t *w, *w2;     /* host: [n_expert][n_rows] rows (matvec uses expert 0) */
    float *x;            /* host [MAX_TOK * 3][k] (per-slot inputs for MoE) */
    void *dw, *dw2, *dx, *dact;
} fixture;

/* activations: GPU bytes vs CPU for n rows of x */
static void check_act(fixture *f, int64_t n) {
    hm_error err;
    hm_error_clear(&err);
    CU(cuda_quantize_act(f->t, f->dx, f->k, n, f->dact, NULL, &err));
    uint8_t *g = malloc(f->ab * (size_t)n), *c = malloc(f->ab * (size_t)n);
    HM_REQUIRE(tu_get(g, f->dact, f->ab * (size_t)n));
    for (int64_t r = 0; r < n; r++)
        quant_act_quantize_ref(quant_act_for(f->t), f->x + r * f->k, c + (size_t)r * f->ab, f->k);
    HM_CHECK_MSG(memcmp(g, c, f->ab * (size_t)n) == 0, "%s k %lld: activation bytes differ",
                 hm_type_name(f->t), (long long)f->k);
    free(g);
    free(c);
}

static void check_matvec(fixture *f, int64_t n_tok) {
    hm_error err;
    hm_error_clear(&err);
    const size_t ny = (size_t)(n_tok * f->n_rows);
    float *yc = malloc(ny * 4), *yg = malloc(ny * 4);
    float *dy = tu_dev(NULL, ny * 4);
    HM_REQUIRE(dy);
    CU(cpu_matmul(NULL, NULL, f->t, f->w, f->n_rows, f->k, f->x, n_tok, yc, NULL, 0, &err));
    CU(cuda_matvec(f->t, f->dw, f->n_rows, f->k, f->dact, n_tok, dy, NULL, &err));
    HM_REQUIRE(tu_get(yg, dy, ny * 4));
    HM_CHECK_MSG(memcmp(yc, yg, ny * 4) == 0, "%s k %lld n_tok %lld: matvec differs (%g vs %g)",
                 hm_type_name(f->t), (long long)f->k, (long long)n_tok, yc[0], yg[0]);
    cudaFree(dy);
    free(yc);
    free(yg);
}

static void fill_sentinel(float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = SENTINEL;
}

/* ids [n_tok][n_used]: repeats, a -1 skip, and (GPU only) an id >= n_expert */
static void make_ids(int32_t *ids, int64_t n_tok, int n_used, int64_t n_expert, int bad_id) {
    for (int64_t i = 0; i < n_tok * n_used; i++) ids[i] = (int32_t)(tu_next(&g_seed) % (uint64_t)n_expert);
    if (n_tok * n_used > 2) ids[1] = -1;
    if (n_tok > 1) ids[n_used] = ids[0]; /* same expert in two tokens */
    if (bad_id && n_tok * n_used > 3) ids[3] = (int32_t)n_expert;
}

static void check_moe(fixture *f, int64_t n_tok, int per_slot) {
    const int n_used = 3;
    hm_error err;
    hm_error_clear(&err);
    const int64_t np = n_tok * n_used;
    const size_t ny = (size_t)(np * f->n_rows);
    int32_t ids[MAX_TOK * 3];
    make_ids(ids, n_tok, n_used, f->n_expert, 0);
    float *yc = malloc(ny * 4), *yg = malloc(ny * 4);
    fill_sentinel(yc, ny);
    float *dy = tu_dev(yc, ny * 4);
    int32_t *dids = tu_dev(ids, sizeof(ids));
    HM_REQUIRE(dy && dids);
    cpu_moe_args ca = {.wtype = f->t, .w = f->w, .n_expert = f->n_expert, .n_rows = f->n_rows,
                       .k = f->k, .x = f->x, .x_per_slot = per_slot, .ids = ids, .n_tok = n_tok,
                       .n_used = n_used, .y = yc};
    CU(cpu_moe_matmul(NULL, NULL, &ca, NULL, 0, &err));
    CU(cuda_quantize_act(f->t, f->dx, f->k, per_slot ? np : n_tok, f->dact, NULL, &err));
    cuda_moe_args ga = {.wtype = f->t, .w = f->dw, .n_expert = f->n_expert, .n_rows = f->n_rows,
                        .k = f->k, .act = f->dact, .x_per_slot = per_slot, .ids = dids,
                        .n_tok = n_tok, .n_used = n_used, .y = dy};
    CU(cuda_moe_matvec(&ga, NULL, &err));
    HM_REQUIRE(tu_get(yg, dy, ny * 4));
    HM_CHECK_MSG(memcmp(yc, yg, ny * 4) == 0, "%s k %lld n_tok %lld per_slot %d: moe differs",
                 hm_type_name(f->t), (long long)f->k, (long long)n_tok, per_slot);
    if (np > 3) { /* an id >= n_expert skips its slot on the device */
        make_ids(ids, n_tok, n_used, f->n_expert, 1);
        fill_sentinel(yg, ny);
        HM_REQUIRE(tu_put(dy, yg, ny * 4) && tu_put(dids, ids, sizeof(ids)));
        CU(cuda_moe_matvec(&ga, NULL, &err));
        HM_REQUIRE(tu_get(yg, dy, ny * 4));
        for (int64_t p = 0; p < np; p++) {
            const int skipped = ids[p] < 0 || ids[p] >= f->n_expert;
            if (skipped) HM_CHECK(yg[p * f->n_rows] == SENTINEL && yg[p * f->n_rows + f->n_rows - 1] == SENTINEL);
            else HM_CHECK(yg[p * f->n_rows] != SENTINEL);
        }
    }
    cudaFree(dy);
    cudaFree(dids);
    free(yc);
    free(yg);
}

/* fused gate/up vs the CPU: two grouped products, then bias + activation per valid pair */
static void check_gate_up(fixture *f, int64_t n_tok, int kind, int bias) {
    const int n_used = 3;
    hm_error err;
    hm_error_clear(&err);
    const int64_t np = n_tok * n_used, F = f->n_rows;
    const size_t ny = (size_t)(np * F), nb = (size_t)(f->n_expert * F);
    int32_t ids[MAX_TOK * 3];
    make_ids(ids, n_tok, n_used, f->n_expert, 0);
    float *eg = malloc(ny * 4), *eu = malloc(ny * 4), *yc = malloc(ny * 4), *yg = malloc(ny * 4);
    float *bg = malloc(nb * 4), *bu = malloc(nb * 4);
    tu_fill(&g_seed, bg, (int64_t)nb, 0.5f);
    tu_fill(&g_seed, bu, (int64_t)nb, 0.5f);
    fill_sentinel(yc, ny);
    float *dy = tu_dev(yc, ny * 4), *dbg = tu_dev(bg, nb * 4), *dbu = tu_dev(bu, nb * 4);
    int32_t *dids = tu_dev(ids, sizeof(ids));
    HM_REQUIRE(dy && dids && dbg && dbu);
    cpu_moe_args a = {.wtype = f->t, .w = f->w, .n_expert = f->n_expert, .n_rows = F, .k = f->k,
                      .x = f->x, .x_per_slot = 0, .ids = ids, .n_tok = n_tok, .n_used = n_used,
                      .y = eg};
    cpu_moe_args b = a;
    b.w = f->w2, b.y = eu;
    CU(cpu_moe_matmul(NULL, NULL, &a, NULL, 0, &err));
    CU(cpu_moe_matmul(NULL, NULL, &b, NULL, 0, &err));
    const int simd = cpu_act_simd();
    for (int64_t p = 0; p < np; p++) {
        if (ids[p] < 0) continue;
        float *g = eg + p * F, *u = eu + p * F;
        if (bias) {
            const int32_t zero = 0;
            cpu_moe_add_bias(NULL, g, bg + (int64_t)ids[p] * F, &zero, 1, 1, F);
            cpu_moe_add_bias(NULL, u, bu + (int64_t)ids[p] * F, &zero, 1, 1, F);
        }
        cpu_swiglu_slice(g, u, yc + p * F, F, kind, 1.702f, 7.0f, simd);
    }
    CU(cuda_quantize_act(f->t, f->dx, f->k, n_tok, f->dact, NULL, &err));
    cuda_moe_gate_up_args ga = {
        .gate = {.wtype = f->t, .w = f->dw, .n_expert = f->n_expert, .n_rows = F, .k = f->k,
                 .act = f->dact, .x_per_slot = 0, .ids = dids, .n_tok = n_tok, .n_used = n_used},
        .up_wtype = f->t, .up_w = f->dw2, .gate_b = bias ? dbg : NULL, .up_b = bias ? dbu : NULL,
        .glu = (cuda_glu)kind, .alpha = 1.702f, .limit = 7.0f, .out = dy};
    CU(cuda_moe_gate_up(&ga, NULL, &err));
    HM_REQUIRE(tu_get(yg, dy, ny * 4));
    HM_CHECK_MSG(memcmp(yc, yg, ny * 4) == 0, "%s k %lld n_tok %lld activation %d bias %d: gate/up differs",
                 hm_type_name(f->t), (long long)f->k, (long long)n_tok, kind, bias);
    cudaFree(dy);
    cudaFree(dbg);
    cudaFree(dbu);
    cudaFree(dids);
    free(eg);
    free(eu);
    free(yc);
    free(yg);
    free(bg);
    free(bu);
}

static void check_get_rows(fixture *f) {
    const int64_t n = 5;
    const int32_t ids[5] = {3, 0, 3, (int32_t)(f->n_rows - 1), 1};
    hm_error err;
    hm_error_clear(&err);
    float *yc = malloc((size_t)(n * f->k) * 4), *yg = malloc((size_t)(n * f->k) * 4);
    float *dy = tu_dev(NULL, (size_t)(n * f->k) * 4);
    int32_t *dids = tu_dev(ids, sizeof(ids));
    HM_REQUIRE(dy && dids);
    for (int64_t i = 0; i < n; i++)
        CU(quant_dequantize_row(f->t, f->w + (size_t)ids[i] * f->rs, yc + i * f->k, f->k));
    CU(cuda_get_rows(f->t, f->dw, f->rs, dids, n, f->k, dy, NULL, &err));
    HM_REQUIRE(tu_get(yg, dy, (size_t)(n * f->k) * 4));
    HM_CHECK_MSG(memcmp(yc, yg, (size_t)(n * f->k) * 4) == 0, "%s k %lld: get_rows differs",
                 hm_type_name(f->t), (long long)f->k);
    cudaFree(dy);
    cudaFree(dids);
    free(yc);
    free(yg);
}

static void run_type_k(uint32_t t, int64_t k, int64_t n_expert) {
    fixture f = {.t = t, .k = k, .n_rows = 67, .n_expert = n_expert};
    f.rs = hm_row_size(t, k);
    f.ab = cuda_act_row_bytes(t, k);
    const int64_t nx = MAX_TOK * 3;
    f.w = make_weights(t, f.n_expert * f.n_rows, k);
    f.w2 = make_weights(t, f.n_expert * f.n_rows, k);
    f.x = malloc((size_t)(nx * k) * 4);
    HM_REQUIRE(f.w && f.w2 && f.x);
    tu_fill(&g_seed, f.x, nx * k, 3.0f);
    f.x[5] = 0.0f; /* a zero; block 0 of row 1 all zero (amax = 0) */
    memset(f.x + k, 0, 32 * sizeof(float));
    f.dw = tu_dev(f.w, f.rs * (size_t)(f.n_expert * f.n_rows));
    f.dw2 = tu_dev(f.w2, f.rs * (size_t)(f.n_expert * f.n_rows));
    f.dx = tu_dev(f.x, (size_t)(nx * k) * 4);
    f.dact = tu_dev(NULL, f.ab * (size_t)nx);
    HM_REQUIRE(f.dw && f.dw2 && f.dx && f.dact);
    check_act(&f, nx);
    for (size_t i = 0; i < sizeof(k_ntoks) / sizeof(k_ntoks[0]); i++) {
        const int64_t n = k_ntoks[i];
        hm_error err;
        hm_error_clear(&err);
        CU(cuda_quantize_act(t, f.dx, k, n, f.dact, NULL, &err));
        check_matvec(&f, n);
        check_moe(&f, n, 0);
        check_moe(&f, n, 1);
        check_gate_up(&f, n, (int)(i % 3), (int)((i >> 1) & 1));
    }
    check_gate_up(&f, 2, 1, 1);
    check_gate_up(&f, 2, 2, 0);
    check_get_rows(&f);
    cudaFree(f.dw);
    cudaFree(f.dw2);
    cudaFree(f.dx);
    cudaFree(f.dact);
    free(f.w);
    free(f.w2);
    free(f.x);
}

static void test_gpu_bytes(void) {
    if (!tu_have_gpu()) return;
    for (size_t i = 0; i < N_TYPES; i++)
        for (size_t j = 0; j < sizeof(k_ks) / sizeof(k_ks[0]); j++) {
            const int64_t k = k_ks[j];
            if (k % hm_type_get(k_types[i])->block_size) continue;
            for (int64_t ne = 5; ne <= 40; ne += 35) { /* 5 experts: tiles; 40: a pair per CTA */
                const int before = hm_t_failed_checks;
                run_type_k(k_types[i], k, ne);
                if (hm_t_failed_checks != before)
                    printf("FAILED: %s k %lld, %lld experts\n", hm_type_name(k_types[i]), (long long)k,
                           (long long)ne);
            }
        }
}

/* extreme activations: tiny amax (id = +inf corner), huge values, exact halves */
static void test_gpu_act_corners(void) {
    if (!tu_have_gpu()) return;
    const int64_t k = 512;
    float x[512];
    for (int i = 0; i < 256; i++) x[i] = (i % 3 - 1) * 1e-38f * (float)(i % 7); /* amax < 127/FLT_MAX */
    for (int i = 256; i < 512; i++) x[i] = (float)(i - 384) * 0.5f;           /* ties at x * id */
    x[300] = 3e38f;
    const uint32_t types[2] = {HM_TYPE_Q8_0, HM_TYPE_Q4_K};
    for (int ti = 0; ti < 2; ti++) {
        const size_t ab = cuda_act_row_bytes(types[ti], k);
        void *dx = tu_dev(x, sizeof(x)), *da = tu_dev(NULL, ab);
        uint8_t *g = malloc(ab), *c = malloc(ab);
        hm_error err;
        hm_error_clear(&err);
        HM_REQUIRE(dx && da);
        CU(cuda_quantize_act(types[ti], dx, k, 1, da, NULL, &err));
        HM_REQUIRE(tu_get(g, da, ab));
        quant_act_quantize_ref(quant_act_for(types[ti]), x, c, k);
        HM_CHECK_MSG(memcmp(g, c, ab) == 0, "%s: corner activation bytes differ", hm_type_name(types[ti]));
        cudaFree(dx);
        cudaFree(da);
        free(g);
        free(c);
    }
}

/* SwiGLU inside the quantisation: cuda_swiglu + cuda_quantize_act's bytes, 3 rows, q8_32 and
 * q8_K activations */
static void test_gpu_act_glu(void) {
    if (!tu_have_gpu()) return;
    const int64_t k = 512, n = 3;
    float *g = malloc(sizeof(float) * k * n), *u = malloc(sizeof(float) * k * n);
    HM_REQUIRE(g && u);
    tu_fill(&g_seed, g, k * n, 6.0f);
    tu_fill(&g_seed, u, k * n, 3.0f);
    g[5] = -90.0f, g[7] = 90.0f; /* silu's tails */
    const uint32_t types[2] = {HM_TYPE_Q8_0, HM_TYPE_Q4_K};
    for (int ti = 0; ti < 2; ti++) {
        const size_t ab = cuda_act_row_bytes(types[ti], k) * (size_t)n;
        float *dg = tu_dev(g, sizeof(float) * k * n), *du = tu_dev(u, sizeof(float) * k * n);
        float *dy = tu_dev(NULL, sizeof(float) * k * n);
        void *a1 = tu_dev(NULL, ab), *a2 = tu_dev(NULL, ab);
        uint8_t *h1 = malloc(ab), *h2 = malloc(ab);
        HM_REQUIRE(dg && du && dy && a1 && a2 && h1 && h2);
        hm_error err;
        hm_error_clear(&err);
        CU(cuda_swiglu(dg, du, dy, k * n, NULL, &err));
        CU(cuda_quantize_act(types[ti], dy, k, n, a1, NULL, &err));
        CU(cuda_quantize_act_glu(types[ti], dg, du, k, n, a2, NULL, &err));
        HM_REQUIRE(tu_get(h1, a1, ab) && tu_get(h2, a2, ab));
        HM_CHECK_MSG(memcmp(h1, h2, ab) == 0, "%s: SwiGLU + quantise in one launch differs",
                     hm_type_name(types[ti]));
        void *dev[] = {dg, du, dy, a1, a2};
        for (int i = 0; i < 5; i++) cudaFree(dev[i]);
        free(h1);
        free(h2);
    }
    free(g);
    free(u);
}

/* every 16-bit pattern (NaNs, infinities, subnormals) of f16 and bf16 through get_rows */
static void test_gpu_half_patterns(void) {
    if (!tu_have_gpu()) return;
    const int64_t k = 65536;
    uint16_t *h = malloc((size_t)k * 2);
    float *yc = malloc((size_t)k * 4), *yg = malloc((size_t)k * 4);
    for (int64_t i = 0; i < k; i++) h[i] = (uint16_t)i;
    const int32_t id = 0;
    const uint32_t types[2] = {HM_TYPE_F16, HM_TYPE_BF16};
    for (int ti = 0; ti < 2; ti++) {
        void *dh = tu_dev(h, (size_t)k * 2), *dy = tu_dev(NULL, (size_t)k * 4), *did = tu_dev(&id, 4);
        hm_error err;
        hm_error_clear(&err);
        HM_REQUIRE(dh && dy && did);
        CU(cuda_get_rows(types[ti], dh, (size_t)k * 2, did, 1, k, dy, NULL, &err));
        HM_REQUIRE(tu_get(yg, dy, (size_t)k * 4));
        CU(quant_dequantize_row(types[ti], h, yc, k));
        HM_CHECK_MSG(memcmp(yc, yg, (size_t)k * 4) == 0, "%s: half patterns differ", hm_type_name(types[ti]));
        cudaFree(dh);
        cudaFree(dy);
        cudaFree(did);
    }
    free(h);
    free(yc);
    free(yg);
}

#else
static void test_gpu_half_patterns(void) { HM_CHECK(!cuda_compiled()); }
static void test_gpu_bytes(void) { HM_CHECK(!tu_have_gpu()); }
static void test_gpu_act_corners(void) { HM_CHECK(!cuda_compiled()); }
static void test_gpu_act_glu(void) { HM_CHECK(!cuda_compiled()); }
#endif

TU_TEST_MAIN(test_row_bytes, test_clean_errors, test_gpu_act_corners, test_gpu_act_glu,
             test_gpu_half_patterns, test_gpu_bytes)
