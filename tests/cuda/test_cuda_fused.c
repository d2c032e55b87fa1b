/* Fused decode kernels (cuda_fused.h) against the unfused launcher sequences they replace, BYTE
 * FOR BYTE on random inputs:
 *   cuda_fused_norm_quant   = [moe_add_bias; moe_combine; shexp_combine; add] or [add];
 *                             rmsnorm; quantize_act (f32 / q8_32 / q8_K activations, with and
 *                             without ids, bias, a shared expert's term, norm weights;
 *                             residual-only mode)
 *   cuda_matvec_multi       = cuda_matvec per matrix + cuda_add_bias (+ cuda_add for
 *                             accumulating matrices; 6 weight types, row counts not multiples
 *                             of the CTA's rows, 1..8 tokens)
 *   cuda_fused_qk_rope_store = per-head rmsnorm of q and k; cuda_rope_qk; cuda_kv_store (norm /
 *                             neox / partial / YaRN rope, positions inside and beyond the rope
 *                             table, beyond n_ctx and negative)
 *   cuda_fused_router       = cuda_matvec (f32) + cuda_router (both gating modes, bias, renorm,
 *                             tied logits, more experts than the cluster has warps); with the
 *                             norm in front = cuda_fused_norm_quant + the plain fused router
 *                             (q8_K, q8_32 and f32 activations)
 * Without a GPU: the host-side argument checks and, in a CUDA build, launches that fail cleanly
 * with HM_ERR_CUDA naming the kernel. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/cuda_attn.h"
#include "cuda/cuda_fused.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_quant.h"
#include "cuda_test_util.h"
#include "harness.h"
#include "quant/qtypes.h"
#include "quant/quant.h"

#ifdef HOTMOE_HAVE_CUDA
/* wide-range values with zeros and a few large ones */
static void fill_mix(uint64_t *s, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) {
        const float u = tu_unit(s), v = tu_unit(s);
        x[i] = scale * u * expf(2.0f * v);
        const uint64_t r = tu_next(s) % 97;
        if (r == 0) x[i] = 0.0f;
        if (r == 1) x[i] = -0.0f;
        if (r == 2) x[i] = 300.0f * u;
    }
}
#endif

/* ---- every build ---- */

static void test_host(void) {
#ifndef HOTMOE_HAVE_CUDA
    HM_CHECK(!cuda_compiled());
#else
    hm_error err;
    hm_error_clear(&err);
    HM_CHECK(cuda_compiled());
    HM_CHECK(cuda_fused_norm_quant(NULL, NULL, &err) == HM_ERR_ARG);
    cuda_fused_norm_args a;
    memset(&a, 0, sizeof(a));
    a.n_tok = 1;
    a.n = CUDA_FUSED_NORM_MAX + 1;
    HM_CHECK(cuda_fused_norm_quant(&a, NULL, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "bad shape") != NULL, "%s", err.msg);
    a.n = 2880;
    a.xn = (float *)(uintptr_t)256;
    a.act = (void *)(uintptr_t)256;
    a.wtype = HM_TYPE_Q4_K; /* q8_K rows need n % 256 == 0 */
    HM_CHECK(cuda_fused_norm_quant(&a, NULL, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "q4_K") != NULL, "%s", err.msg);
    a.wtype = HM_TYPE_Q2_K; /* no activation format */
    HM_CHECK(cuda_fused_norm_quant(&a, NULL, &err) == HM_ERR_UNSUPPORTED);
    a.wtype = HM_TYPE_Q8_0;
    a.ey = (const float *)(uintptr_t)256; /* combine without gating weights */
    HM_CHECK(cuda_fused_norm_quant(&a, NULL, &err) == HM_ERR_ARG);
    a.gw = (const float *)(uintptr_t)256;
    a.n_used = 1;
    a.sh = (const float *)(uintptr_t)256; /* a shared expert's term without its gate */
    HM_CHECK(cuda_fused_norm_quant(&a, NULL, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "sgate") != NULL, "%s", err.msg);
    a.ey = NULL;
    a.gw = NULL;
    a.sh = NULL;
    a.n_used = 0;
    a.x = (float *)(uintptr_t)256; /* no sync area */
    HM_CHECK(cuda_fused_norm_quant(&a, NULL, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "d_sync") != NULL, "%s", err.msg);

    cuda_multi_mat m[CUDA_MULTI_MAX + 1];
    memset(m, 0, sizeof(m));
    HM_CHECK(cuda_matvec_multi(HM_TYPE_Q8_0, 64, NULL, 1, m, 0, NULL, &err) == HM_ERR_ARG);
    HM_CHECK(cuda_matvec_multi(HM_TYPE_Q8_0, 64, NULL, 1, m, CUDA_MULTI_MAX + 1, NULL, &err) ==
             HM_ERR_ARG);
    HM_CHECK(cuda_matvec_multi(HM_TYPE_Q8_0, 48, NULL, 1, m, 1, NULL, &err) == HM_ERR_ARG);
    HM_CHECK(cuda_matvec_multi(HM_TYPE_Q2_K, 256, NULL, 1, m, 1, NULL, &err) ==
             HM_ERR_UNSUPPORTED);
    m[0].n_rows = 8; /* rows without a matrix */
    HM_CHECK(cuda_matvec_multi(HM_TYPE_Q8_0, 64, NULL, 1, m, 1, NULL, &err) == HM_ERR_ARG);

    cuda_fused_qk_args q;
    memset(&q, 0, sizeof(q));
    q.n_head = 4;
    q.n_head_kv = 2;
    q.head_dim = 512; /* > 256 */
    q.n_tok = 1;
    q.n_ctx = 16;
    q.rope.p = cpu_rope_default(CPU_ROPE_NEOX, 64, 10000.0f);
    HM_CHECK(cuda_fused_qk_rope_store(&q, NULL, &err) == HM_ERR_ARG);
    q.head_dim = 64;
    q.rope.p.n_dims = 63;
    HM_CHECK(cuda_fused_qk_rope_store(&q, NULL, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "n_dims 63") != NULL, "%s", err.msg);
    cuda_fused_router_args r;
    memset(&r, 0, sizeof(r));
    r.n_expert = 8;
    r.k = 64;
    r.n_tok = 1;
    r.mode = CPU_GATE_SOFTMAX_TOPK;
    HM_CHECK(cuda_fused_router(&r, NULL, &err) == HM_ERR_ARG); /* n_used 0 */
    HM_CHECK(cuda_fused_router(NULL, NULL, &err) == HM_ERR_ARG);
    r.n_used = 2;
    r.n_expert = CUDA_FUSED_ROUTER_MAX + 1;
    HM_CHECK(cuda_fused_router(&r, NULL, &err) == HM_ERR_ARG);
    /* the norm in front: whole rows in shared memory, whole activation blocks */
    HM_CHECK(cuda_fused_router_norm_ok(2048, 1, HM_TYPE_Q4_K));
    HM_CHECK(cuda_fused_router_norm_ok(2880, 8, HM_TYPE_MXFP4));
    HM_CHECK(!cuda_fused_router_norm_ok(2880, 1, HM_TYPE_Q4_K)); /* 2880 % 256 */
    HM_CHECK(!cuda_fused_router_norm_ok(1 << 20, 1, HM_TYPE_F32));
    void *p = (void *)(uintptr_t)4096; /* never dereferenced: the checks refuse first */
    r.n_expert = 8;
    r.w = r.x = p;
    r.logits = p;
    r.d_ids = p;
    r.d_weights = p;
    r.d_sync = p;
    r.norm_w = p;
    r.k = 2880;
    r.wtype = HM_TYPE_Q4_K;
    hm_error_clear(&err);
    HM_CHECK(cuda_fused_router(&r, NULL, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "norm in front") != NULL, "%s", err.msg);
#endif
}

static void test_no_gpu_error(void) {
#ifdef HOTMOE_HAVE_CUDA
    if (tu_gpu_count() > 0) return; /* GPU tests cover it */
    hm_error err;
    void *p = (void *)(uintptr_t)4096; /* never dereferenced: the launch itself fails */
    hm_error_clear(&err);
    cuda_fused_norm_args a;
    memset(&a, 0, sizeof(a));
    a.x = p;
    a.xn = p;
    a.act = p;
    a.wtype = HM_TYPE_Q8_0;
    a.n_tok = 2;
    a.n = 64;
    a.d_sync = p;
    HM_CHECK(cuda_fused_norm_quant(&a, NULL, &err) == HM_ERR_CUDA);
    HM_CHECK_MSG(strstr(err.msg, "k_fused_norm") != NULL, "%s", err.msg);
    cuda_multi_mat m = {p, 8, NULL, p, 0};
    hm_error_clear(&err);
    HM_CHECK(cuda_matvec_multi(HM_TYPE_Q8_0, 64, p, 1, &m, 1, NULL, &err) == HM_ERR_CUDA);
    HM_CHECK_MSG(strstr(err.msg, "k_matvec_multi") != NULL, "%s", err.msg);
    cuda_fused_qk_args q;
    memset(&q, 0, sizeof(q));
    q.q = q.k = p;
    q.v = p;
    q.n_head = 4;
    q.n_head_kv = 2;
    q.head_dim = 64;
    q.n_tok = 1;
    q.d_pos = p;
    q.k_cache = q.v_cache = p;
    q.n_ctx = 16;
    q.rope.p = cpu_rope_default(CPU_ROPE_NEOX, 64, 10000.0f);
    hm_error_clear(&err);
    HM_CHECK(cuda_fused_qk_rope_store(&q, NULL, &err) == HM_ERR_CUDA);
    HM_CHECK_MSG(strstr(err.msg, "k_fused_qk") != NULL, "%s", err.msg);
    hm_error_clear(&err);
    cuda_fused_router_args r;
    memset(&r, 0, sizeof(r));
    r.w = r.x = p;
    r.n_expert = 8;
    r.k = 64;
    r.n_tok = 1;
    r.n_used = 2;
    r.mode = CPU_GATE_SOFTMAX_TOPK;
    r.renorm = 1;
    r.logits = r.d_weights = p;
    r.d_ids = p;
    r.d_sync = p;
    HM_CHECK(cuda_fused_router(&r, NULL, &err) == HM_ERR_CUDA);
    HM_CHECK_MSG(strstr(err.msg, "k_fused_router") != NULL, "%s", err.msg);
#endif
}

#ifdef HOTMOE_HAVE_CUDA

/* ---- GPU ---- */

/* mode: 0 norm only, 1 + add, 2 + combine (ids, some skipped), 3 + combine with down bias,
 * 4 + combine without ids, 5 residual (add) only (no norm), 6 + combine with the down bias
 * stored by device slot (bias_ids: a permutation of the ids, as the engine's slots), 7 +
 * combine and a shared expert's term (sh * sigmoid(sgate)) */
static void norm_case(int cfg, uint32_t wtype, int64_t n, int64_t nt, int mode, int with_w) {
    const int K = 4, NE = 16;
    const float eps = 1e-6f;
    uint64_t s = 1000 + (uint64_t)cfg;
    float *hx = malloc(sizeof(float) * nt * n), *hadd = malloc(sizeof(float) * nt * n);
    float *hey = malloc(sizeof(float) * nt * K * n), *hgw = malloc(sizeof(float) * nt * K);
    float *hb = malloc(sizeof(float) * NE * n), *hw = malloc(sizeof(float) * n);
    int32_t *hids = malloc(sizeof(int32_t) * nt * K), *hbids = malloc(sizeof(int32_t) * nt * K);
    float *hsh = malloc(sizeof(float) * nt * n), *hsg = malloc(sizeof(float) * nt);
    HM_REQUIRE(hx && hadd && hey && hgw && hb && hw && hids && hbids && hsh && hsg);
    fill_mix(&s, hsh, nt * n, 1.0f);
    tu_fill(&s, hsg, nt, 3.0f);
    fill_mix(&s, hx, nt * n, 2.0f);
    fill_mix(&s, hadd, nt * n, 1.0f);
    fill_mix(&s, hey, nt * K * n, 1.0f);
    fill_mix(&s, hb, NE * n, 0.5f);
    tu_fill(&s, hw, n, 1.5f);
    for (int64_t i = 0; i < nt * K; i++) {
        hgw[i] = 0.5f + 0.5f * tu_unit(&s);
        hids[i] = (int32_t)(tu_next(&s) % NE);
    }
    hids[1] = -1;                 /* skipped slot */
    if (nt * K > 6) hids[6] = NE; /* out of range: combined, no bias (as the launchers) */
    for (int64_t i = 0; i < nt * K; i++)
        hbids[i] = hids[i] >= 0 && hids[i] < NE ? (hids[i] * 7 + 3) % NE : hids[i];
    const size_t xb = sizeof(float) * nt * n;
    const size_t arow = cuda_act_row_bytes(wtype, n), ab = arow * nt;
    float *x1 = tu_dev(hx, xb), *x2 = tu_dev(hx, xb), *add = tu_dev(hadd, xb);
    float *ey1 = tu_dev(hey, xb * K), *ey2 = tu_dev(hey, xb * K), *gw = tu_dev(hgw, 4 * nt * K);
    float *bias = tu_dev(hb, sizeof(float) * NE * n), *w = tu_dev(hw, sizeof(float) * n);
    int32_t *ids = tu_dev(hids, 4 * nt * K), *bids = tu_dev(hbids, 4 * nt * K);
    float *sh = tu_dev(hsh, xb), *sg = tu_dev(hsg, 4 * nt);
    float *xn1 = tu_dev(NULL, xb), *xn2 = tu_dev(NULL, xb), *proj = tu_dev(NULL, xb);
    void *act1 = tu_dev(NULL, ab), *act2 = tu_dev(NULL, ab);
    HM_REQUIRE(x1 && x2 && add && ey1 && ey2 && gw && bias && w && ids && bids && xn1 && xn2 &&
               proj && act1 && act2 && sh && sg);
    HM_REQUIRE(cudaMemset(act1, 0x5a, ab) == cudaSuccess && cudaMemset(act2, 0x5a, ab) == cudaSuccess);
    hm_error err;
    hm_error_clear(&err);
    const bool combine = (mode >= 2 && mode <= 4) || mode >= 6, norm = mode != 5;
    const int32_t *cids = mode == 4 ? NULL : ids;
    const bool f32 = arow == 4 * (size_t)n;
    /* unfused */
    hm_status st = HM_OK;
    if (combine) {
        if (mode == 3) st = cuda_moe_add_bias(ey1, bias, ids, nt, K, n, NE, NULL, &err);
        if (mode == 6) st = cuda_moe_add_bias(ey1, bias, bids, nt, K, n, NE, NULL, &err);
        if (st == HM_OK) st = cuda_moe_combine(ey1, gw, cids, nt, K, n, proj, NULL, &err);
        if (st == HM_OK && mode == 7) st = cuda_shexp_combine(proj, sh, sg, nt, n, NULL, &err);
        if (st == HM_OK) st = cuda_add(x1, proj, x1, nt * n, NULL, &err);
    } else if (mode == 1 || mode == 5) {
        st = cuda_add(x1, add, x1, nt * n, NULL, &err);
    }
    if (st == HM_OK && norm) st = cuda_rmsnorm(x1, with_w ? w : NULL, xn1, nt, n, eps, NULL, &err);
    if (st == HM_OK && norm && !f32) st = cuda_quantize_act(wtype, xn1, n, nt, act1, NULL, &err);
    HM_CHECK_MSG(st == HM_OK, "config %d unfused: %s", cfg, err.msg);
    /* fused, twice on one sync area (its counters must be left ready for the next call) */
    int *sync = tu_dev(NULL, sizeof(int) * 2 * nt);
    HM_REQUIRE(sync && cudaMemset(sync, 0, sizeof(int) * 2 * nt) == cudaSuccess);
    for (int rep = 0; rep < 2; rep++) {
        HM_REQUIRE(tu_put(x2, hx, xb) && tu_put(ey2, hey, xb * K) &&
                   cudaMemset(xn2, 0, xb) == cudaSuccess && cudaMemset(act2, 0x5a, ab) == cudaSuccess);
        cuda_fused_norm_args a;
        memset(&a, 0, sizeof(a));
        a.d_sync = sync;
        a.x = x2;
        a.add = mode == 1 || mode == 5 ? add : NULL;
        if (combine) {
            a.ey = ey2;
            a.gw = gw;
            a.ids = cids;
            a.n_used = K;
            a.ey_bias = mode == 3 || mode == 6 ? bias : NULL;
            a.bias_ids = mode == 6 ? bids : NULL;
            a.n_expert = NE;
            a.sh = mode == 7 ? sh : NULL;
            a.sgate = mode == 7 ? sg : NULL;
        }
        a.norm_w = with_w ? w : NULL;
        a.eps = eps;
        a.xn = norm ? xn2 : NULL;
        a.wtype = wtype;
        a.act = act2;
        a.n_tok = nt;
        a.n = n;
        st = cuda_fused_norm_quant(&a, NULL, &err);
        HM_CHECK_MSG(st == HM_OK, "config %d fused (rep %d): %s", cfg, rep, err.msg);
        tu_same_dev(x1, x2, xb, "x", cfg);
        if (norm) tu_same_dev(xn1, xn2, xb, "xn", cfg);
        tu_same_dev(act1, act2, ab, "act", cfg); /* untouched (0x5a) for f32 types and mode 5 */
        if (combine) { /* the fused kernel leaves ey as it was */
            float *back = malloc(xb * K);
            HM_REQUIRE(back && tu_get(back, ey2, xb * K));
            HM_CHECK_MSG(tu_diff_at(back, hey, xb * K) < 0, "config %d: ey written", cfg);
            free(back);
        }
    }
    void *bufs[] = {x1, x2, add, ey1, ey2, gw, bias, w, ids, bids, xn1, xn2, proj, act1, act2,
                    sync, sh, sg};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) cudaFree(bufs[i]);
    free(hx);
    free(hadd);
    free(hey);
    free(hgw);
    free(hb);
    free(hw);
    free(hids);
    free(hbids);
    free(hsh);
    free(hsg);
}

static void test_norm(void) {
    const uint32_t types[] = {HM_TYPE_F16, HM_TYPE_Q8_0, HM_TYPE_Q4_K};
    const int64_t ns[] = {2048, 2880, 256};
    const int64_t nts[] = {1, 3, 8, 11};
    int cfg = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int ni = 0; ni < 3; ni++) {
            if (types[ti] == HM_TYPE_Q4_K && ns[ni] % 256) continue;
            for (int mode = 0; mode < 8; mode++) {
                const int64_t nt = nts[(ni + mode) % 3];
                norm_case(cfg++, types[ti], ns[ni], nt, mode, (mode + ti) % 3 != 0);
            }
        }
    norm_case(cfg++, HM_TYPE_Q4_K, 2048, 40, 2, 1); /* 320 blocks: two launches */
    printf("fused norm: %d configurations byte-identical\n", cfg);
}

static void test_multi(void) {
    const uint32_t types[] = {HM_TYPE_Q4_K, HM_TYPE_Q6_K, HM_TYPE_Q8_0,
                              HM_TYPE_MXFP4, HM_TYPE_F16, HM_TYPE_Q4_0};
    const int64_t rows[3] = {517, 61, 66}, k = 1024;
    const int64_t nts[] = {1, 2, 5, 8};
    uint64_t s = 77;
    int cfg = 0;
    for (int ti = 0; ti < 6; ti++)
        for (int ni = 0; ni < 4; ni++, cfg++) {
            const uint32_t t = types[ti];
            const int64_t nt = nts[ni];
            const size_t arow = cuda_act_row_bytes(t, k);
            float *hx = malloc(sizeof(float) * nt * k);
            HM_REQUIRE(hx);
            tu_fill(&s, hx, nt * k, 2.0f);
            float *x = tu_dev(hx, sizeof(float) * nt * k);
            void *act = tu_dev(NULL, arow * nt);
            HM_REQUIRE(x && act);
            hm_error err;
            hm_error_clear(&err);
            HM_CHECK(cuda_quantize_act(t, x, k, nt, act, NULL, &err) == HM_OK);
            cuda_multi_mat m[3];
            float *y1[3], *bias[3];
            void *w[3];
            for (int i = 0; i < 3; i++) {
                uint8_t *hw = tu_make_weights(&s, t, rows[i], k);
                float *hb = malloc(sizeof(float) * rows[i]);
                HM_REQUIRE(hw && hb);
                tu_fill(&s, hb, rows[i], 1.0f);
                w[i] = tu_dev(hw, hm_row_size(t, k) * rows[i]);
                bias[i] = tu_dev(hb, sizeof(float) * rows[i]);
                y1[i] = tu_dev(NULL, sizeof(float) * nt * rows[i]);
                m[i].w = w[i];
                m[i].n_rows = rows[i];
                m[i].bias = (i + ni) % 2 ? bias[i] : NULL;
                /* accumulating matrices add to y's old values (the residual stream) */
                m[i].accumulate = (i + ti) % 2;
                float *hy = malloc(sizeof(float) * nt * rows[i]);
                HM_REQUIRE(hy);
                tu_fill(&s, hy, nt * rows[i], 3.0f);
                m[i].y = tu_dev(hy, sizeof(float) * nt * rows[i]);
                float *y0 = tu_dev(hy, sizeof(float) * nt * rows[i]);
                HM_REQUIRE(w[i] && bias[i] && y1[i] && m[i].y && y0);
                free(hw);
                free(hb);
                free(hy);
                hm_status st = cuda_matvec(t, w[i], rows[i], k, act, nt, y1[i], NULL, &err);
                if (st == HM_OK && m[i].bias)
                    st = cuda_add_bias(y1[i], m[i].bias, nt, rows[i], NULL, &err);
                if (st == HM_OK && m[i].accumulate)
                    st = cuda_add(y0, y1[i], y1[i], nt * rows[i], NULL, &err);
                HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
                cudaFree(y0);
            }
            const int n_mat = 1 + (ni + ti) % 3; /* 1, 2 or 3 matrices in one launch */
            hm_status st = cuda_matvec_multi(t, k, act, nt, m, n_mat, NULL, &err);
            HM_CHECK_MSG(st == HM_OK, "config %d: %s", cfg, err.msg);
            for (int i = 0; i < n_mat; i++)
                tu_same_dev(y1[i], m[i].y, sizeof(float) * nt * rows[i], hm_type_name(t), cfg);
            for (int i = 0; i < 3; i++) {
                cudaFree(w[i]);
                cudaFree(bias[i]);
                cudaFree(y1[i]);
                cudaFree(m[i].y);
            }
            cudaFree(x);
            cudaFree(act);
            free(hx);
        }
    printf("fused multi matvec: %d configurations byte-identical\n", cfg);
}

static cpu_rope_params qk_rope(int c, int hd) {
    cpu_rope_params p;
    if (c == 0) p = cpu_rope_default(CPU_ROPE_NEOX, hd, 1000000.0f);
    else if (c == 1) p = cpu_rope_default(CPU_ROPE_NORM, hd / 2, 10000.0f);
    else if (c == 4) p = cpu_rope_default(CPU_ROPE_NEOX, hd / 4, 10000000.0f); /* qwen3next */
    else {
        p = cpu_rope_default(CPU_ROPE_NEOX, hd, 150000.0f);
        p.freq_scale = 1.0f / 32.0f;
        p.ext_factor = 1.0f;
        p.n_ctx_orig = 4096;
        p.yarn_truncate = c == 3;
    }
    return p;
}

static void test_qk(void) {
    const int64_t n_ctx = 64, n_table = 40, nt_max = 8;
    /* distinct positions: in the table, beyond it, beyond n_ctx (not stored), negative */
    const int32_t hpos[8] = {0, 39, 40, 63, 64, 70, -1, 17};
    int cfg = 0;
    for (int hd = 64; hd <= 256; hd *= 2)
        for (int c = 0; c < 5; c++)
            for (int norm = 0; norm < 3; norm++, cfg++) {
                const int nh = norm == 1 ? 4 : 8, nkv = norm == 1 ? 4 : 2;
                const int64_t nt = cfg % 2 ? nt_max : 3;
                uint64_t s = 500 + (uint64_t)cfg;
                const size_t qb = sizeof(float) * nt * nh * hd, kb = sizeof(float) * nt * nkv * hd;
                const size_t cb = 2 * (size_t)n_ctx * nkv * hd;
                float *hq = malloc(qb), *hk = malloc(kb), *hv = malloc(kb);
                float *hqn = malloc(sizeof(float) * hd), *hkn = malloc(sizeof(float) * hd);
                uint16_t *hc = malloc(cb);
                cpu_rope_params p = qk_rope(c, hd);
                float *htab = malloc(sizeof(float) * n_table * p.n_dims);
                HM_REQUIRE(hq && hk && hv && hqn && hkn && hc && htab);
                fill_mix(&s, hq, nt * nh * hd, 2.0f);
                fill_mix(&s, hk, nt * nkv * hd, 2.0f);
                fill_mix(&s, hv, nt * nkv * hd, 2.0f);
                tu_fill(&s, hqn, hd, 1.5f);
                tu_fill(&s, hkn, hd, 1.5f);
                for (size_t i = 0; i < cb / 2; i++) hc[i] = (uint16_t)tu_next(&s);
                hm_error err;
                hm_error_clear(&err);
                HM_CHECK(cuda_rope_table_fill(&p, n_table, htab, &err) == HM_OK);
                float *q1 = tu_dev(hq, qb), *q2 = tu_dev(hq, qb), *k1 = tu_dev(hk, kb);
                float *k2 = tu_dev(hk, kb), *v = tu_dev(hv, kb), *qn = tu_dev(hqn, 4 * hd);
                float *kn = tu_dev(hkn, 4 * hd), *tab = tu_dev(htab, 4 * n_table * p.n_dims);
                uint16_t *kc1 = tu_dev(hc, cb), *vc1 = tu_dev(hc, cb);
                uint16_t *kc2 = tu_dev(hc, cb), *vc2 = tu_dev(hc, cb);
                int32_t *pos = tu_dev(hpos, sizeof(int32_t) * nt);
                HM_REQUIRE(q1 && q2 && k1 && k2 && v && qn && kn && tab && kc1 && vc1 && kc2 &&
                           vc2 && pos);
                const bool w = norm != 2; /* norm 2: per-head norm without weights */
                cuda_rope_args ra = {p, tab, n_table};
                hm_status st = HM_OK;
                if (norm) {
                    st = cuda_rmsnorm(q1, w ? qn : NULL, q1, nt * nh, hd, 1e-6f, NULL, &err);
                    if (st == HM_OK)
                        st = cuda_rmsnorm(k1, w ? kn : NULL, k1, nt * nkv, hd, 1e-6f, NULL, &err);
                }
                if (st == HM_OK) st = cuda_rope_qk(q1, nh, k1, nkv, nt, hd, pos, &ra, NULL, &err);
                if (st == HM_OK)
                    st = cuda_kv_store(HM_TYPE_F16, kc1, vc1, n_ctx, nkv, hd, k1, v, nt, pos, NULL,
                                       &err);
                HM_CHECK_MSG(st == HM_OK, "config %d unfused: %s", cfg, err.msg);
                cuda_fused_qk_args a;
                memset(&a, 0, sizeof(a));
                a.q = q2;
                a.k = k2;
                a.v = v;
                a.n_head = nh;
                a.n_head_kv = nkv;
                a.head_dim = hd;
                a.n_tok = nt;
                a.qk_norm = norm != 0;
                a.q_norm = w ? qn : NULL;
                a.k_norm = w ? kn : NULL;
                a.eps = 1e-6f;
                a.d_pos = pos;
                a.rope = ra;
                a.k_cache = kc2;
                a.v_cache = vc2;
                a.n_ctx = n_ctx;
                st = cuda_fused_qk_rope_store(&a, NULL, &err);
                HM_CHECK_MSG(st == HM_OK, "config %d fused: %s", cfg, err.msg);
                tu_same_dev(q1, q2, qb, "q", cfg);
                tu_same_dev(k1, k2, kb, "k", cfg);
                tu_same_dev(kc1, kc2, cb, "k cache", cfg);
                tu_same_dev(vc1, vc2, cb, "v cache", cfg);
                void *bufs[] = {q1, q2, k1, k2, v, qn, kn, tab, kc1, vc1, kc2, vc2, pos};
                for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) cudaFree(bufs[i]);
                free(hq);
                free(hk);
                free(hv);
                free(hqn);
                free(hkn);
                free(hc);
                free(htab);
            }
    printf("fused q/k norm + rope + kv store: %d configurations byte-identical\n", cfg);
}

/* The norm in front of the router (a: the plain case's arguments, x the residual rows):
 * cuda_fused_norm_quant (norm weights, the experts' activation type) then the plain fused
 * router, against one cuda_fused_router with norm_w; xn, act, logits, ids, weights compared. */
static void router_norm_case(int c, int cfg, const float *x, const cuda_fused_router_args *a) {
    const uint32_t wtypes[] = {HM_TYPE_Q4_K, HM_TYPE_MXFP4, HM_TYPE_F32, HM_TYPE_Q8_0};
    const uint32_t wt = wtypes[c];
    const int64_t nt = a->n_tok, k = a->k, ne = a->n_expert;
    const int ku = a->n_used;
    HM_CHECK_MSG(cuda_fused_router_norm_ok(k, nt, wt), "config %d: norm in front refused", cfg);
    const size_t arow = cuda_act_row_bytes(wt, k);
    const bool f32 = arow == 4 * (size_t)k;
    uint64_t s = 4000 + (uint64_t)cfg;
    float *hn = malloc(sizeof(float) * k);
    HM_REQUIRE(hn);
    tu_fill(&s, hn, k, 1.0f);
    float *nw = tu_dev(hn, sizeof(float) * k);
    float *xn1 = tu_dev(NULL, sizeof(float) * nt * k), *xn2 = tu_dev(NULL, sizeof(float) * nt * k);
    void *act1 = f32 ? NULL : tu_dev(NULL, arow * nt), *act2 = f32 ? NULL : tu_dev(NULL, arow * nt);
    float *l1 = tu_dev(NULL, sizeof(float) * nt * ne), *l2 = tu_dev(NULL, sizeof(float) * nt * ne);
    float *g1 = tu_dev(NULL, sizeof(float) * nt * ku), *g2 = tu_dev(NULL, sizeof(float) * nt * ku);
    int32_t *i1 = tu_dev(NULL, 4 * nt * ku), *i2 = tu_dev(NULL, 4 * nt * ku);
    const int zero[16] = {0};
    int *nsync = tu_dev(zero, sizeof(zero)), *rsync = tu_dev(zero, sizeof(zero));
    HM_REQUIRE(nw && xn1 && xn2 && (f32 || (act1 && act2)) && l1 && l2 && g1 && g2 && i1 && i2 &&
               nsync && rsync);
    hm_error err;
    hm_error_clear(&err);
    cuda_fused_norm_args na;
    memset(&na, 0, sizeof(na));
    na.x = (float *)x;
    na.norm_w = nw;
    na.eps = 1e-6f;
    na.xn = xn1;
    na.wtype = wt;
    na.act = act1;
    na.n_tok = nt;
    na.n = k;
    na.d_sync = nsync;
    hm_status st = cuda_fused_norm_quant(&na, NULL, &err);
    cuda_fused_router_args r = *a;
    r.x = xn1;
    r.logits = l1;
    r.d_ids = i1;
    r.d_weights = g1;
    r.d_sync = rsync;
    if (st == HM_OK) st = cuda_fused_router(&r, NULL, &err);
    HM_CHECK_MSG(st == HM_OK, "config %d norm + router: %s", cfg, err.msg);
    r = *a;
    r.norm_w = nw;
    r.eps = 1e-6f;
    r.xn = xn2;
    r.wtype = wt;
    r.act = act2;
    r.logits = l2;
    r.d_ids = i2;
    r.d_weights = g2;
    r.d_sync = rsync;
    st = cuda_fused_router(&r, NULL, &err);
    HM_CHECK_MSG(st == HM_OK, "config %d router with the norm: %s", cfg, err.msg);
    tu_same_dev(xn1, xn2, sizeof(float) * nt * k, "router norm xn", cfg);
    if (!f32) tu_same_dev(act1, act2, arow * nt, "router norm act", cfg);
    tu_same_dev(l1, l2, sizeof(float) * nt * ne, "router norm logits", cfg);
    tu_same_dev(i1, i2, 4 * nt * ku, "router norm ids", cfg);
    tu_same_dev(g1, g2, sizeof(float) * nt * ku, "router norm weights", cfg);
    void *bufs[] = {nw, xn1, xn2, act1, act2, l1, l2, g1, g2, i1, i2, nsync, rsync};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i]) cudaFree(bufs[i]);
    free(hn);
}

static void test_router(void) {
    /* qwen3-like, gpt-oss-like (bias, top-k then softmax), odd sizes (k = 250: rows staged 4
     * bytes at a time); 11 tokens: two tiles */
    const int64_t nes[] = {128, 32, 60, 200}, ks[] = {2048, 2880, 250, 512};
    const int kus[] = {8, 4, 4, 6};
    const int64_t nts[] = {1, 3, 8, 11};
    int cfg = 0;
    for (int c = 0; c < 4; c++)
        for (int ni = 0; ni < 4; ni++, cfg++) {
            const int64_t ne = nes[c], k = ks[c], nt = nts[ni];
            const int ku = kus[c];
            const cpu_gate_mode mode = c == 1 ? CPU_GATE_TOPK_SOFTMAX : CPU_GATE_SOFTMAX_TOPK;
            const int renorm = c == 0 || (c == 3 && ni == 1);
            uint64_t s = 900 + (uint64_t)cfg;
            float *hw = malloc(sizeof(float) * ne * k), *hx = malloc(sizeof(float) * nt * k);
            float *hb = malloc(sizeof(float) * ne);
            HM_REQUIRE(hw && hx && hb);
            tu_fill(&s, hw, ne * k, 0.05f);
            for (int64_t r = 3; r + 1 < ne; r += 7) /* equal rows: tied logits, id order */
                memcpy(hw + (r + 1) * k, hw + r * k, sizeof(float) * k);
            tu_fill(&s, hx, nt * k, 1.0f);
            tu_fill(&s, hb, ne, 0.5f);
            float *w = tu_dev(hw, sizeof(float) * ne * k), *x = tu_dev(hx, sizeof(float) * nt * k);
            float *b = c == 1 || c == 2 ? tu_dev(hb, sizeof(float) * ne) : NULL;
            float *l1 = tu_dev(NULL, sizeof(float) * nt * ne), *l2 = tu_dev(NULL, sizeof(float) * nt * ne);
            float *g1 = tu_dev(NULL, sizeof(float) * nt * ku), *g2 = tu_dev(NULL, sizeof(float) * nt * ku);
            int32_t *i1 = tu_dev(NULL, 4 * nt * ku), *i2 = tu_dev(NULL, 4 * nt * ku);
            /* the expert->slot table (a permutation: gcd(7, ne) == 1) and the slots written */
            int32_t *hperm = malloc(4 * ne);
            HM_REQUIRE(hperm);
            for (int64_t e = 0; e < ne; e++) hperm[e] = (int32_t)((e * 7 + 3) % ne);
            int32_t *perm = tu_dev(hperm, 4 * ne);
            int32_t *s1 = tu_dev(NULL, 4 * nt * ku), *s2 = tu_dev(NULL, 4 * nt * ku);
            /* routing counters of each router: hits [ne], stat {calls, tokens} */
            uint32_t *c1 = tu_dev(NULL, 4 * ne), *c2 = tu_dev(NULL, 4 * ne);
            uint64_t *t1 = tu_dev(NULL, 16), *t2 = tu_dev(NULL, 16);
            HM_REQUIRE(perm && s1 && s2 && c1 && c2 && t1 && t2);
            HM_REQUIRE(cudaMemset(c1, 0, 4 * ne) == cudaSuccess &&
                       cudaMemset(c2, 0, 4 * ne) == cudaSuccess &&
                       cudaMemset(t1, 0, 16) == cudaSuccess && cudaMemset(t2, 0, 16) == cudaSuccess);
            const cuda_route_out o1 = {perm, s1, c1, t1};
            const int zero[2] = {0, 0};
            int *sync = tu_dev(zero, sizeof(zero)); /* nt <= 16: two tiles of 8 */
            HM_REQUIRE(w && x && l1 && l2 && g1 && g2 && i1 && i2 && sync &&
                       (b || (c != 1 && c != 2)));
            hm_error err;
            hm_error_clear(&err);
            hm_status st = cuda_matvec(HM_TYPE_F32, w, ne, k, x, nt, l1, NULL, &err);
            if (st == HM_OK)
                st = cuda_router(l1, b, nt, (int)ne, ku, mode, renorm, i1, g1, &o1, NULL, &err);
            HM_CHECK_MSG(st == HM_OK, "config %d unfused: %s", cfg, err.msg);
            cuda_fused_router_args ra;
            memset(&ra, 0, sizeof(ra));
            ra.w = w;
            ra.n_expert = ne;
            ra.k = k;
            ra.x = x;
            ra.n_tok = nt;
            ra.bias = b;
            ra.n_used = ku;
            ra.mode = mode;
            ra.renorm = renorm;
            ra.logits = l2;
            ra.d_ids = i2;
            ra.d_weights = g2;
            ra.d_sync = sync;
            ra.out.slot_of = perm;
            ra.out.dslot = s2;
            ra.out.hits = c2;
            ra.out.stat = t2;
            /* twice: the second call finds the counter rezeroed by the first */
            for (int rep = 0; rep < 2 && st == HM_OK; rep++) {
                if (rep) cudaMemset(i2, 0xff, 4 * nt * ku);
                st = cuda_fused_router(&ra, NULL, &err);
            }
            HM_CHECK_MSG(st == HM_OK, "config %d fused: %s", cfg, err.msg);
            int left[2] = {-1, -1};
            HM_CHECK(tu_get(left, sync, sizeof(left)) && left[0] == 0 && left[1] == 0);
            tu_same_dev(l1, l2, sizeof(float) * nt * ne, "router logits", cfg);
            tu_same_dev(i1, i2, 4 * nt * ku, "router ids", cfg);
            tu_same_dev(g1, g2, sizeof(float) * nt * ku, "router weights", cfg);
            tu_same_dev(s1, s2, 4 * nt * ku, "router device slots", cfg);
            {
                int32_t *hi = malloc(4 * nt * ku), *hs = malloc(4 * nt * ku);
                HM_REQUIRE(hi && hs && tu_get(hi, i1, 4 * nt * ku) && tu_get(hs, s1, 4 * nt * ku));
                int bad = 0;
                for (int64_t i = 0; i < nt * ku; i++)
                    bad += hi[i] < 0 || hi[i] >= ne || hs[i] != hperm[hi[i]];
                HM_CHECK_MSG(!bad, "config %d: %d device slots are not slot_of[id]", cfg, bad);
                /* counts: the ids' histogram and one call of nt tokens per launch (the fused
                 * router ran twice) */
                uint32_t *h1 = malloc(4 * ne), *h2 = malloc(4 * ne);
                uint64_t st1[2], st2[2];
                HM_REQUIRE(h1 && h2 && tu_get(h1, c1, 4 * ne) && tu_get(h2, c2, 4 * ne) &&
                           tu_get(st1, t1, 16) && tu_get(st2, t2, 16));
                HM_CHECK_MSG(st1[0] == 1 && st1[1] == (uint64_t)nt && st2[0] == 2 &&
                                 st2[1] == 2 * (uint64_t)nt,
                             "config %d: calls/tokens %llu/%llu, fused %llu/%llu", cfg,
                             (unsigned long long)st1[0], (unsigned long long)st1[1],
                             (unsigned long long)st2[0], (unsigned long long)st2[1]);
                for (int64_t i = 0; i < nt * ku; i++)
                    if (hi[i] >= 0 && hi[i] < ne) h1[hi[i]] -= 1, h2[hi[i]] -= 2;
                bad = 0;
                for (int64_t e = 0; e < ne; e++) bad += h1[e] != 0 || h2[e] != 0;
                HM_CHECK_MSG(!bad, "config %d: %d experts' hits are not the ids' histogram", cfg,
                             bad);
                free(h1);
                free(h2);
                free(hi);
                free(hs);
            }
            memset(&ra.out, 0, sizeof(ra.out));
            if (nt <= 8) router_norm_case(c, cfg, x, &ra);
            void *bufs[] = {w, x, b, l1, l2, g1, g2, i1, i2, sync, perm, s1, s2, c1, c2, t1, t2};
            for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
                if (bufs[i]) cudaFree(bufs[i]);
            free(hw);
            free(hx);
            free(hb);
            free(hperm);
        }
    printf("fused router: %d configurations byte-identical (device slots and counts included)\n",
           cfg);
}

#endif

static void test_gpu(void) {
    if (!tu_have_gpu()) return;
#ifdef HOTMOE_HAVE_CUDA
    test_norm();
    test_multi();
    test_qk();
    test_router();
#endif
}

TU_TEST_MAIN(test_host, test_no_gpu_error, test_gpu)
