/* test_cuda_delta.c - the gated delta net on the GPU (cuda_delta.h) against the CPU engine's
 * recurrent block written with cpu/ops.h's functions in cpu_engine_hybrid.c's order, for
 * qwen3next's layout (grouped value heads, b/a per key head, head size 16) and qwen35moe's
 * (tiled value heads, split b/a, head size 128):
 *   - two sequences in one call (runs of 5 tokens and 1 token: the token-by-token kernel): the
 *     convolution's output (SiLU, L2 norms, q scale) and its state byte for byte; the heads'
 *     outputs and delta states within 1e-5 of their largest magnitude, identical bytes counted
 *     (softplus's double log1p/exp may round apart from libm's); the same tokens one per call
 *     give the prompt's bytes;
 *   - three sequences of 200, 70 and 5 tokens in one call (the first two in the chunked form,
 *     over several chunks and a partial one): the convolution still byte for byte, the outputs
 *     and states within 1e-4 of their largest magnitude (the same sums in another order).
 * Without a GPU: the argument checks only. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/ops_math.h"
#include "cuda/cuda_delta.h"
#include "cuda/cuda_device.h"
#include "cuda_test_util.h"
#include "harness.h"

static void test_host(void) {
    hm_error err;
    hm_error_clear(&err);
    cuda_delta_args a = {.nk = 2, .nv = 3, .dk = 16, .dv = 32, .conv_k = 4, .n_tok = 1, .n_runs = 1,
                         .state_stride = 1};
    if (!cuda_compiled()) {
        HM_CHECK(cuda_delta_net(&a, NULL, &err) == HM_ERR_UNSUPPORTED && strstr(err.msg, "without CUDA"));
        return;
    }
    HM_CHECK(cuda_delta_net(&a, NULL, &err) == HM_ERR_ARG); /* 3 % 2 */
    a.nv = 4;
    a.dk = 48;
    HM_CHECK(cuda_delta_net(&a, NULL, &err) == HM_ERR_ARG && strstr(err.msg, "unsupported shape"));
    a.dk = 16;
    HM_CHECK(cuda_delta_net(&a, NULL, &err) == HM_ERR_ARG && strstr(err.msg, "missing buffers"));
    HM_CHECK(cuda_delta_net(NULL, NULL, &err) == HM_ERR_ARG);
}

#ifdef HOTMOE_HAVE_CUDA

typedef struct {
    const char *name;
    int nk, nv, dk, dv, K, tiled, split;
} shape;

static const shape k_shapes[] = {
    {"qwen3next-like", 2, 4, 16, 16, 4, 0, 0}, /* tiny-qwen3next's heads: a half warp */
    {"qwen35moe-like", 2, 4, 128, 128, 4, 1, 1},
};

static float softplus_ref(float x) { return x > 20.0f ? x : (float)log1p(exp((double)x)); }

/* The CPU side for the tokens of one sequence, in order (cpu_engine_hybrid.c's linear_block
 * after its products, for one state). */
static void cpu_side(const shape *s, int64_t n_all, int t0, int len, float *state, const float *w,
                     const float *dt, const float *A, const float *nw, float *qkv, const float *z,
                     const float *ba, float *out) {
    const int64_t cd = 2 * s->nk * s->dk + s->nv * s->dv, r = s->nv / s->nk;
    float *row = malloc(sizeof(float) * (size_t)cd), *scr = malloc(sizeof(float) * 2 * (size_t)s->dv);
    HM_REQUIRE(row && scr);
    const float qscale = 1.0f / sqrtf((float)s->dk);
    for (int t = t0; t < t0 + len; t++) {
        float *y = qkv + (int64_t)t * cd;
        cpu_conv1d_causal(state, w, y, row, cd, s->K);
        cpu_silu(NULL, row, y, cd);
        for (int64_t h = 0; h < 2 * s->nk; h++) cpu_l2_norm(y + h * s->dk, s->dk, 1e-6f);
        cpu_scale(NULL, y, qscale, y, (int64_t)s->nk * s->dk);
        for (int64_t h = 0; h < s->nv; h++) {
            const int64_t g = s->tiled ? h % s->nk : h / r;
            float *S = state + (int64_t)(s->K - 1) * cd + h * s->dk * s->dv;
            const float *bp = s->split ? ba + (int64_t)t * s->nv + h : ba + (int64_t)t * 2 * s->nv + g * 2 * r + h % r;
            const float *ap = s->split ? bp + n_all * s->nv : bp + r;
            const float beta = 1.0f / (1.0f + hm_expf(-*bp));
            const float gl = softplus_ref(*ap + dt[h]) * A[h];
            float *o = out + (int64_t)t * s->nv * s->dv + h * s->dv;
            cpu_delta_rule(S, y + g * s->dk, y + s->nk * s->dk + g * s->dk,
                           y + 2 * s->nk * s->dk + h * s->dv, gl, beta, s->dk, s->dv, o, scr,
                           0);
            cpu_rmsnorm(NULL, o, nw, o, 1, s->dv, 1e-6f);
            cpu_silu(NULL, z + (int64_t)t * s->nv * s->dv + h * s->dv, scr + s->dv, s->dv);
            cpu_mul(NULL, o, scr + s->dv, o, s->dv);
        }
    }
    free(row);
    free(scr);
}

static double worst_rel(const float *a, const float *b, int64_t n, int64_t *same) {
    double mx = 0, d = 0;
    *same = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs((double)a[i]));
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        *same += memcmp(a + i, b + i, 4) == 0;
    }
    return d / (mx > 0 ? mx : 1);
}

/* runs[n_runs] cover tokens 0 .. n-1, run i of sequence i; tol: the heads' outputs' and delta
 * states' bound (relative to their largest magnitude); one_by_one: the same tokens one per call
 * must give the same bytes (runs of the token-by-token kernel) */
static void run_case(const shape *s, const cuda_delta_run *runs, int n_runs, int n, double tol,
                     bool one_by_one) {
    hm_error err;
    hm_error_clear(&err);
    uint64_t sd = 99 + (uint64_t)s->dk + (uint64_t)n;
    const int64_t cd = 2 * s->nk * s->dk + s->nv * s->dv, vd = (int64_t)s->nv * s->dv;
    const int64_t stride = (int64_t)(s->K - 1) * cd + vd * s->dk, nba = 2 * (int64_t)n * s->nv;
    const int64_t nst = n_runs * stride;
    float *w = malloc(sizeof(float) * (size_t)(cd * s->K)), *dt = malloc(sizeof(float) * (size_t)s->nv);
    float *A = malloc(sizeof(float) * (size_t)s->nv), *nw = malloc(sizeof(float) * (size_t)s->dv);
    float *st = malloc(sizeof(float) * (size_t)nst), *st_ref = malloc(sizeof(float) * (size_t)nst);
    float *qkv = malloc(sizeof(float) * (size_t)(n * cd)), *qkv_ref = malloc(sizeof(float) * (size_t)(n * cd));
    float *z = malloc(sizeof(float) * (size_t)(n * vd)), *ba = malloc(sizeof(float) * (size_t)nba);
    float *out = malloc(sizeof(float) * (size_t)(n * vd)), *out_ref = malloc(sizeof(float) * (size_t)(n * vd));
    HM_REQUIRE(w && dt && A && nw && st && st_ref && qkv && qkv_ref && z && ba && out && out_ref);
    tu_fill(&sd, w, cd * s->K, 0.6f);
    tu_fill(&sd, dt, s->nv, 1.0f);
    for (int h = 0; h < s->nv; h++) A[h] = -0.2f - 2.0f * fabsf(tu_unit(&sd));
    tu_fill(&sd, nw, s->dv, 1.0f);
    tu_fill(&sd, st_ref, nst, 0.5f); /* states carried from earlier tokens */
    tu_fill(&sd, qkv_ref, n * cd, 2.0f);
    tu_fill(&sd, z, n * vd, 2.0f);
    tu_fill(&sd, ba, nba, 3.0f);
    memcpy(st, st_ref, sizeof(float) * (size_t)nst);
    memcpy(qkv, qkv_ref, sizeof(float) * (size_t)(n * cd));
    for (int i = 0; i < n_runs; i++)
        cpu_side(s, n, runs[i].t0, runs[i].len, st_ref + i * stride, w, dt, A, nw, qkv_ref, z, ba,
                 out_ref);

    cuda_delta_args a = {.nk = s->nk, .nv = s->nv, .dk = s->dk, .dv = s->dv, .conv_k = s->K,
                         .v_tiled = s->tiled, .ab_split = s->split, .eps = 1e-6f, .n_tok = n,
                         .n_runs = n_runs, .state_stride = stride};
    a.d_runs = tu_dev(runs, sizeof(cuda_delta_run) * (size_t)n_runs);
    a.conv_w = tu_dev(w, sizeof(float) * (size_t)(cd * s->K));
    a.dt = tu_dev(dt, sizeof(float) * (size_t)s->nv);
    a.a = tu_dev(A, sizeof(float) * (size_t)s->nv);
    a.norm_w = tu_dev(nw, sizeof(float) * (size_t)s->dv);
    a.state = tu_dev(st, sizeof(float) * (size_t)nst);
    a.qkv = tu_dev(qkv, sizeof(float) * (size_t)(n * cd));
    a.z = tu_dev(z, sizeof(float) * (size_t)(n * vd));
    a.ba = tu_dev(ba, sizeof(float) * (size_t)nba);
    a.out = tu_dev(NULL, sizeof(float) * (size_t)(n * vd));
    HM_REQUIRE(a.d_runs && a.conv_w && a.dt && a.a && a.norm_w && a.state && a.qkv && a.z && a.ba && a.out);
    HM_CHECK_MSG(cuda_delta_net(&a, NULL, &err) == HM_OK, "%s", err.msg);
    float *g_st = malloc(sizeof(float) * (size_t)nst), *g_qkv = malloc(sizeof(float) * (size_t)(n * cd));
    HM_REQUIRE(g_st && g_qkv);
    HM_REQUIRE(tu_get(g_st, a.state, sizeof(float) * (size_t)nst) &&
               tu_get(g_qkv, a.qkv, sizeof(float) * (size_t)(n * cd)) &&
               tu_get(out, a.out, sizeof(float) * (size_t)(n * vd)));
    HM_CHECK_MSG(memcmp(g_qkv, qkv_ref, sizeof(float) * (size_t)(n * cd)) == 0,
                 "%s: the convolution's output differs from the CPU's bytes", s->name);
    const size_t conv_b = sizeof(float) * (size_t)((s->K - 1) * cd);
    int64_t same_o = 0, same_s = 0;
    const double eo = worst_rel(out_ref, out, n * vd, &same_o);
    double es = 0;
    for (int i = 0; i < n_runs; i++) {
        HM_CHECK_MSG(!memcmp(g_st + i * stride, st_ref + i * stride, conv_b),
                     "%s: sequence %d's convolution state differs", s->name, i);
        es = fmax(es, worst_rel(st_ref + i * stride + (s->K - 1) * cd,
                                g_st + i * stride + (s->K - 1) * cd, vd * s->dk, &same_s));
    }
    printf("  %s, %d tokens in %d runs: heads' output %.3g (%lld of %lld bytes-equal), states "
           "%.3g\n", s->name, n, n_runs, eo, (long long)same_o, (long long)(n * vd), es);
    HM_CHECK_MSG(eo <= tol && es <= tol, "%s, %d tokens: output %.3g, states %.3g (bound %.3g)",
                 s->name, n, eo, es, tol);

    if (one_by_one) {
        /* the same tokens one per call, each call with its own one-token buffers as a decode step
         * has them (n_tok sizes every buffer, ba's layout included): the prompt's bytes */
        HM_REQUIRE(tu_put(a.state, st, sizeof(float) * (size_t)nst));
        float *out1 = malloc(sizeof(float) * (size_t)(n * vd));
        float *st1 = malloc(sizeof(float) * (size_t)nst);
        float ba1[2 * 256];
        HM_REQUIRE(out1 && st1 && 2 * s->nv <= 2 * 256);
        cuda_delta_args a1 = a;
        a1.n_tok = 1, a1.n_runs = 1;
        a1.qkv = tu_dev(NULL, sizeof(float) * (size_t)cd);
        float *d_z1 = tu_dev(NULL, sizeof(float) * (size_t)vd);
        float *d_ba1 = tu_dev(NULL, sizeof(float) * 2 * (size_t)s->nv);
        a1.z = d_z1, a1.ba = d_ba1;
        a1.out = tu_dev(NULL, sizeof(float) * (size_t)vd);
        HM_REQUIRE(a1.qkv && d_z1 && d_ba1 && a1.out);
        for (int t = 0; t < n; t++) {
            int seq = 0;
            while (seq + 1 < n_runs && t >= runs[seq + 1].t0) seq++;
            const cuda_delta_run one = {0, 1, seq};
            for (int h = 0; h < s->nv; h++) {
                ba1[h] = s->split ? ba[(int64_t)t * s->nv + h] : ba[(int64_t)t * 2 * s->nv + h];
                ba1[s->nv + h] = s->split ? ba[(int64_t)(n + t) * s->nv + h]
                                          : ba[(int64_t)t * 2 * s->nv + s->nv + h];
            }
            HM_REQUIRE(tu_put((void *)a1.d_runs, &one, sizeof(one)) &&
                       tu_put(a1.qkv, qkv + (int64_t)t * cd, sizeof(float) * (size_t)cd) &&
                       tu_put(d_z1, z + (int64_t)t * vd, sizeof(float) * (size_t)vd) &&
                       tu_put(d_ba1, ba1, sizeof(float) * 2 * (size_t)s->nv));
            HM_CHECK(cuda_delta_net(&a1, NULL, &err) == HM_OK);
            HM_REQUIRE(tu_get(out1 + (int64_t)t * vd, a1.out, sizeof(float) * (size_t)vd));
        }
        HM_REQUIRE(tu_get(st1, a.state, sizeof(float) * (size_t)nst));
        HM_CHECK_MSG(!memcmp(out1, out, sizeof(float) * (size_t)(n * vd)) &&
                     !memcmp(st1, g_st, sizeof(float) * (size_t)nst),
                     "%s: one token per call differs from the prompt in one call", s->name);
        cudaFree(a1.qkv), cudaFree(d_z1), cudaFree(d_ba1), cudaFree(a1.out);
        free(out1), free(st1);
    }
    void *dev[] = {(void *)a.d_runs, (void *)a.conv_w, (void *)a.dt, (void *)a.a, (void *)a.norm_w,
                   a.state, a.qkv, (void *)a.z, (void *)a.ba, a.out};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) cudaFree(dev[i]);
    free(w), free(dt), free(A), free(nw), free(st), free(st_ref), free(qkv), free(qkv_ref), free(z);
    free(ba), free(out), free(out_ref), free(g_st), free(g_qkv);
}

static void test_gpu(void) {
    if (!tu_have_gpu()) return;
    const cuda_delta_run shortr[2] = {{0, 5, 0}, {5, 1, 1}};
    const cuda_delta_run longr[3] = {{0, 200, 0}, {200, 70, 1}, {270, 5, 2}};
    HM_CHECK(CUDA_DELTA_CHUNK_MIN <= 70 && CUDA_DELTA_CHUNK_MIN > 5);
    for (size_t i = 0; i < sizeof(k_shapes) / sizeof(k_shapes[0]); i++) {
        run_case(&k_shapes[i], shortr, 2, 6, 1e-5, true);
        run_case(&k_shapes[i], longr, 3, 275, 1e-4, false);
    }
}

#else

static void test_gpu(void) { (void)tu_have_gpu(); }

#endif

TU_TEST_MAIN(test_host, test_gpu)
