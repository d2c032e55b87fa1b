/* Device elementwise ops, RMS norm, MoE bias/combine, shared-expert combine, routers and RoPE
 * (cuda_ops.h) against the CPU functions of cpu/ops.h: every output compared BYTE FOR BYTE
 * (cuda_ops.h claims bit-identity). Inputs span many magnitudes (x * e^(5u)), include exp's
 * saturation range (|x| ~ 90..120), zeros of both signs, and router logits with many ties.
 * RoPE: the table path (cos/sin made by cpu_rope itself) must equal cpu_rope for norm, neox,
 * partial n_dims and YaRN (truncated and not); the device-double path (positions beyond the
 * table) is compared too and its mismatches counted (expected 0; at most 1e-5 of the values,
 * each within 1 ulp, is allowed: CUDA's double cos/sin differ from libm by <= 2 double ulp).
 * Without a GPU: the host checks (argument errors, the rope table identity) and, in a CUDA
 * build, a launch that fails cleanly with HM_ERR_CUDA naming the kernel. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/cuda_ops.h"
#include "cuda_test_util.h"
#include "harness.h"

#ifdef HOTMOE_HAVE_CUDA
/* first index where the bytes differ, or -1 */
static int64_t first_diff(const void *a, const void *b, int64_t n, size_t elem) {
    const uint8_t *x = a, *y = b;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(x + i * elem, y + i * elem, elem)) return i;
    return -1;
}

/* wide-range values: u * e^(5 v), some zeros and saturating magnitudes */
static void fill_wide(uint64_t *s, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float u = tu_unit(s), v = tu_unit(s);
        x[i] = u * expf(5.0f * v);
        uint64_t r = tu_next(s) % 64;
        if (r == 0) x[i] = 0.0f;
        if (r == 1) x[i] = -0.0f;
        if (r == 2) x[i] = 90.0f + 30.0f * u;
        if (r == 3) x[i] = -90.0f - 30.0f * u;
    }
}

static cpu_rope_params rope_yarn(int n_dims, int truncate) {
    cpu_rope_params p = cpu_rope_default(CPU_ROPE_NEOX, n_dims, 150000.0f);
    p.freq_scale = 1.0f / 32.0f;
    p.ext_factor = 1.0f;
    p.n_ctx_orig = 4096;
    p.yarn_truncate = truncate;
    return p;
}
#endif

/* ---- every build ---- */

static void test_host(void) {
    hm_error err;
#ifndef HOTMOE_HAVE_CUDA
    HM_CHECK(!cuda_compiled());
    (void)err;
#else
    HM_CHECK(cuda_compiled());
    /* argument errors need no device */
    hm_error_clear(&err);
    HM_CHECK(cuda_router(NULL, NULL, 1, 8, 0, CPU_GATE_SOFTMAX_TOPK, 0, NULL, NULL, NULL, NULL,
                         &err) == HM_ERR_ARG);
    HM_CHECK(strstr(err.msg, "k (0)") != NULL);
    HM_CHECK(cuda_router(NULL, NULL, 1, 8, 9, CPU_GATE_SOFTMAX_TOPK, 0, NULL, NULL, NULL, NULL,
                         &err) == HM_ERR_ARG);
    HM_CHECK(cuda_router(NULL, NULL, 1, 8, 2, (cpu_gate_mode)7, 0, NULL, NULL, NULL, NULL,
                         &err) == HM_ERR_ARG);
    int32_t fake_slot_of[8];
    const cuda_route_out half = {fake_slot_of, NULL, NULL, NULL}; /* a table, no output */
    HM_CHECK(cuda_router(NULL, NULL, 1, 8, 2, CPU_GATE_SOFTMAX_TOPK, 0, NULL, NULL, &half, NULL,
                         &err) == HM_ERR_ARG &&
             strstr(err.msg, "slot_of and dslot"));
    cuda_rope_args ra = {cpu_rope_default(CPU_ROPE_NEOX, 63, 10000.0f), NULL, 0};
    HM_CHECK(cuda_rope_qk(NULL, 1, NULL, 0, 1, 64, NULL, &ra, NULL, &err) == HM_ERR_ARG);
    HM_CHECK(strstr(err.msg, "n_dims 63") != NULL);
    ra.p = rope_yarn(64, 0);
    ra.p.n_ctx_orig = 0;
    HM_CHECK(cuda_rope_qk(NULL, 1, NULL, 0, 1, 64, NULL, &ra, NULL, &err) == HM_ERR_ARG);
    HM_CHECK(cuda_rmsnorm(NULL, NULL, NULL, -1, 8, 1e-6f, NULL, &err) == HM_ERR_ARG);

    /* the rope table holds cpu_rope's own cos/sin: rotating random vectors with it in float
     * gives cpu_rope's bytes (norm, neox, YaRN both variants, partial n_dims) */
    const cpu_rope_params cfg[] = {cpu_rope_default(CPU_ROPE_NORM, 128, 10000.0f),
                                   cpu_rope_default(CPU_ROPE_NEOX, 64, 1000000.0f),
                                   rope_yarn(64, 0), rope_yarn(64, 1)};
    const int hd = 128, n_pos = 700;
    uint64_t s = 11;
    float *table = malloc((size_t)n_pos * 64 * 2 * sizeof(float));
    float *x = malloc((size_t)n_pos * hd * sizeof(float)), *y = malloc((size_t)n_pos * hd * sizeof(float));
    int32_t *pos = malloc(n_pos * sizeof(int32_t));
    HM_REQUIRE(table && x && y && pos);
    for (int c = 0; c < 4; c++) {
        const cpu_rope_params *p = &cfg[c];
        const int np = p->n_dims / 2, neox = p->mode == CPU_ROPE_NEOX;
        HM_CHECK(cuda_rope_table_fill(p, n_pos, table, &err) == HM_OK);
        tu_fill(&s, x, (int64_t)n_pos * hd, 3.0f);
        memcpy(y, x, (size_t)n_pos * hd * sizeof(float));
        for (int i = 0; i < n_pos; i++) pos[i] = i;
        HM_CHECK(cpu_rope(NULL, x, n_pos, 1, hd, pos, p, &err) == HM_OK);
        int64_t bad = 0;
        for (int t = 0; t < n_pos; t++)
            for (int i = 0; i < np; i++) {
                const float cc = table[((size_t)t * np + i) * 2], ss = table[((size_t)t * np + i) * 2 + 1];
                const int i0 = neox ? i : 2 * i, i1 = neox ? i + np : 2 * i + 1;
                float *r = y + (size_t)t * hd;
                const float x0 = r[i0], x1 = r[i1];
                r[i0] = x0 * cc - x1 * ss;
                r[i1] = x0 * ss + x1 * cc;
            }
        bad = first_diff(x, y, (int64_t)n_pos * hd, 4);
        HM_CHECK_MSG(bad < 0, "rope config %d: table rotation differs at %lld", c, (long long)bad);
    }
    free(table);
    free(x);
    free(y);
    free(pos);
#endif
}

static void test_no_gpu_error(void) {
#ifdef HOTMOE_HAVE_CUDA
    if (tu_gpu_count() > 0) return; /* GPU tests cover it */
    hm_error err;
    hm_error_clear(&err);
    hm_status st = cuda_add(NULL, NULL, NULL, 16, NULL, &err);
    HM_CHECK(st == HM_ERR_CUDA);
    HM_CHECK_MSG(strstr(err.msg, "cuda_add") != NULL, "%s", err.msg);
    hm_error_clear(&err);
    st = cuda_rmsnorm(NULL, NULL, NULL, 2, 16, 1e-6f, NULL, &err);
    HM_CHECK(st == HM_ERR_CUDA);
    HM_CHECK_MSG(strstr(err.msg, "rmsnorm_kernel") != NULL, "%s", err.msg);
#endif
}

#ifdef HOTMOE_HAVE_CUDA

/* ---- GPU ---- */

static void test_elementwise(void) {
    const int64_t n = 100003;
    uint64_t s = 5;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    HM_REQUIRE(a && b && ref && got);
    fill_wide(&s, a, n);
    fill_wide(&s, b, n);
    float *da = tu_dev(a, n * 4), *db = tu_dev(b, n * 4), *dy = tu_dev(NULL, n * 4);
    HM_REQUIRE(da && db && dy);
    hm_error err;
    for (int op = 0; op < 7; op++) {
        hm_status st = HM_OK;
        const char *name[] = {"add", "scale", "silu", "sigmoid", "swiglu", "swiglu_oai", "geglu"};
        switch (op) {
        case 0: cpu_add(NULL, a, b, ref, n); st = cuda_add(da, db, dy, n, NULL, &err); break;
        case 1: cpu_scale(NULL, a, 0.37f, ref, n); st = cuda_scale(da, 0.37f, dy, n, NULL, &err); break;
        case 2: cpu_silu(NULL, a, ref, n); st = cuda_silu(da, dy, n, NULL, &err); break;
        case 3: cpu_sigmoid(NULL, a, ref, n); st = cuda_sigmoid(da, dy, n, NULL, &err); break;
        case 4: cpu_swiglu(NULL, a, b, ref, n); st = cuda_swiglu(da, db, dy, n, NULL, &err); break;
        case 6:
            cpu_geglu(NULL, a, b, ref, n);
            st = cuda_glu_act(CPU_GLU_GELU, da, db, dy, n, NULL, &err);
            break;
        default:
            cpu_swiglu_oai(NULL, a, b, ref, n, 1.702f, 7.0f);
            st = cuda_swiglu_oai(da, db, dy, n, 1.702f, 7.0f, NULL, &err);
        }
        HM_CHECK_MSG(st == HM_OK, "%s: %s", name[op], err.msg);
        HM_REQUIRE(tu_get(got, dy, n * 4));
        int64_t d = first_diff(ref, got, n, 4);
        HM_CHECK_MSG(d < 0, "%s differs at %lld: cpu %a gpu %a (in %a, %a)", name[op], (long long)d,
                     (double)ref[d < 0 ? 0 : d], (double)got[d < 0 ? 0 : d], (double)a[d < 0 ? 0 : d],
                     (double)b[d < 0 ? 0 : d]);
    }
    /* soft-capping: CUDA's tanhf against libm's, within a few ulp */
    for (int64_t i = 0; i < n; i++) ref[i] = 30.0f * tanhf(a[i] / 30.0f);
    HM_CHECK(cuda_softcap(da, 30.0f, n, NULL, &err) == HM_OK);
    HM_REQUIRE(tu_get(got, da, n * 4));
    int far = 0;
    for (int64_t i = 0; i < n; i++)
        far += fabsf(got[i] - ref[i]) > 4e-7f * fmaxf(fabsf(ref[i]), 1.0f);
    HM_CHECK_MSG(far == 0, "softcap: %d values off", far);
    HM_CHECK(cuda_softcap(da, 0.0f, n, NULL, &err) == HM_ERR_ARG);
    HM_REQUIRE(cudaMemcpy(da, a, (size_t)n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    /* in place: swiglu into gate */
    cpu_swiglu(NULL, a, b, ref, n);
    HM_CHECK(cuda_swiglu(da, db, da, n, NULL, &err) == HM_OK);
    HM_REQUIRE(tu_get(got, da, n * 4));
    HM_CHECK(first_diff(ref, got, n, 4) < 0);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dy);
    free(a);
    free(b);
    free(ref);
    free(got);
}

static void test_rmsnorm(void) {
    const int64_t shapes[][2] = {{1, 4096}, {3, 2880}, {7, 128}, {2, 5}, {1, 5003}, {64, 64}, {1, 1}};
    uint64_t s = 17;
    hm_error err;
    for (size_t c = 0; c < sizeof(shapes) / sizeof(shapes[0]); c++) {
        const int64_t rows = shapes[c][0], n = shapes[c][1], tot = rows * n;
        float *x = malloc(tot * 4), *w = malloc(n * 4), *ref = malloc(tot * 4), *got = malloc(tot * 4);
        HM_REQUIRE(x && w && ref && got);
        fill_wide(&s, x, tot);
        tu_fill(&s, w, n, 2.0f);
        float *dx = tu_dev(x, tot * 4), *dw = tu_dev(w, n * 4), *dy = tu_dev(NULL, tot * 4);
        HM_REQUIRE(dx && dw && dy);
        for (int wmode = 0; wmode < 3; wmode++) { /* weight, no weight, in place */
            const float *wc = wmode == 1 ? NULL : w;
            cpu_rmsnorm(NULL, x, wc, ref, rows, n, 1e-6f);
            float *out = wmode == 2 ? dx : dy;
            HM_CHECK(cuda_rmsnorm(dx, wmode == 1 ? NULL : dw, out, rows, n, 1e-6f, NULL, &err) == HM_OK);
            HM_REQUIRE(tu_get(got, out, tot * 4));
            int64_t d = first_diff(ref, got, tot, 4);
            HM_CHECK_MSG(d < 0, "rmsnorm %lldx%lld mode %d differs at %lld", (long long)rows,
                         (long long)n, wmode, (long long)d);
        }
        cudaFree(dx);
        cudaFree(dw);
        cudaFree(dy);
        free(x);
        free(w);
        free(ref);
        free(got);
    }
}

static void test_moe_rows(void) {
    const int64_t n_tok = 5, n = 777;
    const int n_used = 4, n_expert = 6;
    uint64_t s = 23;
    hm_error err;
    const int64_t ny = n_tok * n_used * n;
    float *y = malloc(ny * 4), *bias = malloc(n_expert * n * 4), *w = malloc(n_tok * n_used * 4);
    float *ref = malloc(ny * 4), *got = malloc(ny * 4), *sh = malloc(n_tok * n * 4), *gate = malloc(n_tok * 4);
    int32_t ids[5 * 4];
    HM_REQUIRE(y && bias && w && ref && got && sh && gate);
    fill_wide(&s, y, ny);
    tu_fill(&s, bias, n_expert * n, 1.0f);
    tu_fill(&s, w, n_tok * n_used, 1.0f);
    tu_fill(&s, sh, n_tok * n, 2.0f);
    tu_fill(&s, gate, n_tok, 6.0f);
    for (int i = 0; i < n_tok * n_used; i++) ids[i] = (int)(tu_next(&s) % (n_expert + 1)) - 1; /* -1..5 */
    ids[3] = ids[2]; /* a repeat */
    float *dy = tu_dev(y, ny * 4), *db = tu_dev(bias, n_expert * n * 4), *dw = tu_dev(w, n_tok * n_used * 4);
    int32_t *di = tu_dev(ids, sizeof(ids));
    float *dout = tu_dev(NULL, n_tok * n * 4), *dsh = tu_dev(sh, n_tok * n * 4), *dg = tu_dev(gate, n_tok * 4);
    HM_REQUIRE(dy && db && dw && di && dout && dsh && dg);

    /* per-expert bias */
    memcpy(ref, y, ny * 4);
    cpu_moe_add_bias(NULL, ref, bias, ids, n_tok, n_used, n);
    HM_CHECK(cuda_moe_add_bias(dy, db, di, n_tok, n_used, n, n_expert, NULL, &err) == HM_OK);
    HM_REQUIRE(tu_get(got, dy, ny * 4));
    HM_CHECK(first_diff(ref, got, ny, 4) < 0);
    /* combine, with and without ids */
    for (int with_ids = 0; with_ids < 2; with_ids++) {
        float *o = malloc(n_tok * n * 4), *og = malloc(n_tok * n * 4);
        HM_REQUIRE(o && og);
        cpu_moe_combine(NULL, ref, w, with_ids ? ids : NULL, n_tok, n_used, n, o);
        HM_CHECK(cuda_moe_combine(dy, dw, with_ids ? di : NULL, n_tok, n_used, n, dout, NULL, &err) == HM_OK);
        HM_REQUIRE(tu_get(og, dout, n_tok * n * 4));
        HM_CHECK_MSG(first_diff(o, og, n_tok * n, 4) < 0, "combine ids %d", with_ids);
        if (with_ids) {
            /* shared expert: proj += sh * sigmoid(gate), the CPU's sigmoid/scale/add sequence */
            float sg[5];
            memcpy(sg, gate, sizeof(sg));
            cpu_sigmoid(NULL, sg, sg, n_tok);
            float *tmp = malloc(n_tok * n * 4);
            HM_REQUIRE(tmp);
            for (int t = 0; t < n_tok; t++) cpu_scale(NULL, sh + t * n, sg[t], tmp + t * n, n);
            cpu_add(NULL, o, tmp, o, n_tok * n);
            HM_CHECK(cuda_shexp_combine(dout, dsh, dg, n_tok, n, NULL, &err) == HM_OK);
            HM_REQUIRE(tu_get(og, dout, n_tok * n * 4));
            HM_CHECK(first_diff(o, og, n_tok * n, 4) < 0);
            free(tmp);
        }
        free(o);
        free(og);
    }
    /* row bias */
    memcpy(ref, sh, n_tok * n * 4);
    cpu_add_bias(NULL, ref, bias, n_tok, n);
    HM_CHECK(cuda_add_bias(dsh, db, n_tok, n, NULL, &err) == HM_OK);
    HM_REQUIRE(tu_get(got, dsh, n_tok * n * 4));
    HM_CHECK(first_diff(ref, got, n_tok * n, 4) < 0);
    cudaFree(dy);
    cudaFree(db);
    cudaFree(dw);
    cudaFree(di);
    cudaFree(dout);
    cudaFree(dsh);
    cudaFree(dg);
    free(y);
    free(bias);
    free(w);
    free(ref);
    free(got);
    free(sh);
    free(gate);
}

static void test_router(void) {
    const int experts[] = {4, 32, 128, 257, 4096};
    const int ks[] = {1, 2, 4, 8};
    const int64_t n_tok = 6;
    uint64_t s = 31;
    hm_error err;
    int cases = 0;
    for (size_t ie = 0; ie < sizeof(experts) / sizeof(experts[0]); ie++) {
        const int ne = experts[ie];
        float *l = malloc(n_tok * ne * 4), *bias = malloc(ne * 4);
        HM_REQUIRE(l && bias);
        float *dl = tu_dev(NULL, n_tok * ne * 4), *dbias = tu_dev(NULL, ne * 4);
        int32_t *dids = tu_dev(NULL, n_tok * 8 * 4);
        float *dwt = tu_dev(NULL, n_tok * 8 * 4);
        HM_REQUIRE(dl && dbias && dids && dwt);
        for (int ties = 0; ties < 2; ties++) {
            for (int64_t i = 0; i < n_tok * ne; i++)
                l[i] = ties ? roundf(tu_unit(&s) * 3.0f) * 0.5f : tu_unit(&s) * 8.0f;
            for (int e = 0; e < ne; e++) bias[e] = ties ? roundf(tu_unit(&s)) * 0.5f : tu_unit(&s);
            HM_REQUIRE(tu_put(dl, l, n_tok * ne * 4) && tu_put(dbias, bias, ne * 4));
            for (size_t ik = 0; ik < sizeof(ks) / sizeof(ks[0]); ik++)
                for (int mode = 0; mode < 2; mode++)
                    for (int renorm = 0; renorm < 2; renorm++)
                        for (int wb = 0; wb < 2; wb++) {
                            const int k = ks[ik];
                            if (k > ne) continue;
                            int32_t ids[6 * 8], gids[6 * 8];
                            float wt[6 * 8], gwt[6 * 8];
                            HM_REQUIRE(cpu_router(NULL, l, wb ? bias : NULL, n_tok, ne, k,
                                                  (cpu_gate_mode)mode, renorm, ids, wt, &err) == HM_OK);
                            HM_REQUIRE(cuda_router(dl, wb ? dbias : NULL, n_tok, ne, k,
                                                   (cpu_gate_mode)mode, renorm, dids, dwt, NULL,
                                                   NULL, &err) == HM_OK);
                            HM_REQUIRE(tu_get(gids, dids, n_tok * k * 4) && tu_get(gwt, dwt, n_tok * k * 4));
                            HM_CHECK_MSG(first_diff(ids, gids, n_tok * k, 4) < 0 &&
                                             first_diff(wt, gwt, n_tok * k, 4) < 0,
                                         "router ne %d k %d mode %d renorm %d bias %d ties %d", ne,
                                         k, mode, renorm, wb, ties);
                            cases++;
                        }
        }
        cudaFree(dl);
        cudaFree(dbias);
        cudaFree(dids);
        cudaFree(dwt);
        free(l);
        free(bias);
    }
    HM_CHECK(cases > 100);
}

static void test_rope(void) {
    const struct {
        cpu_rope_params p;
        int hd;
    } cfg[] = {{cpu_rope_default(CPU_ROPE_NORM, 128, 10000.0f), 128},
               {cpu_rope_default(CPU_ROPE_NEOX, 128, 1000000.0f), 128},
               {cpu_rope_default(CPU_ROPE_NEOX, 32, 10000.0f), 80}, /* partial rotation */
               {rope_yarn(64, 0), 64},
               {rope_yarn(64, 1), 64}};
    const int n_head = 4, n_kv = 2, n_table = 3000;
    const int64_t n_tok = 48;
    uint64_t s = 41;
    hm_error err;
    int64_t dev_total = 0, dev_bad = 0;
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        const cpu_rope_params *p = &cfg[c].p;
        const int hd = cfg[c].hd, np = p->n_dims / 2;
        float *table = malloc((size_t)n_table * np * 2 * 4);
        HM_REQUIRE(table);
        HM_REQUIRE(cuda_rope_table_fill(p, n_table, table, &err) == HM_OK);
        float *dtab = tu_dev(table, (size_t)n_table * np * 2 * 4);
        int32_t pos[48];
        for (int t = 0; t < n_tok; t++) pos[t] = t < 8 ? t : (int32_t)(tu_next(&s) % (n_table + 40));
        pos[8] = n_table - 1;
        pos[9] = n_table; /* first position past the table */
        const int64_t nq = n_tok * n_head * hd, nk = n_tok * n_kv * hd;
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *gq = malloc(nq * 4), *gk = malloc(nk * 4);
        HM_REQUIRE(q && k && gq && gk && dtab);
        tu_fill(&s, q, nq, 4.0f);
        tu_fill(&s, k, nk, 4.0f);
        float *dq = tu_dev(q, nq * 4), *dk = tu_dev(k, nk * 4);
        int32_t *dpos = tu_dev(pos, sizeof(pos));
        HM_REQUIRE(dq && dk && dpos);
        HM_REQUIRE(cpu_rope(NULL, q, n_tok, n_head, hd, pos, p, &err) == HM_OK);
        HM_REQUIRE(cpu_rope(NULL, k, n_tok, n_kv, hd, pos, p, &err) == HM_OK);
        /* with the table: positions < n_table bit-identical by construction; others too */
        cuda_rope_args ra = {*p, dtab, n_table};
        HM_CHECK_MSG(cuda_rope_qk(dq, n_head, dk, n_kv, n_tok, hd, dpos, &ra, NULL, &err) == HM_OK, "%s", err.msg);
        HM_REQUIRE(tu_get(gq, dq, nq * 4) && tu_get(gk, dk, nk * 4));
        int64_t dq_ = first_diff(q, gq, nq, 4), dk_ = first_diff(k, gk, nk, 4);
        HM_CHECK_MSG(dq_ < 0 && dk_ < 0, "rope config %zu: q differs at %lld, k at %lld", c,
                     (long long)dq_, (long long)dk_);

        /* the device-double path on every position 0..n_table-1 (one head, no table) */
        const int64_t np_all = n_table;
        float *x = malloc(np_all * hd * 4), *gx = malloc(np_all * hd * 4);
        int32_t *pall = malloc(np_all * 4);
        HM_REQUIRE(x && gx && pall);
        for (int64_t t = 0; t < np_all; t++) pall[t] = (int32_t)t;
        tu_fill(&s, x, np_all * hd, 2.0f);
        float *dx = tu_dev(x, np_all * hd * 4);
        int32_t *dpall = tu_dev(pall, np_all * 4);
        HM_REQUIRE(dx && dpall);
        HM_REQUIRE(cpu_rope(NULL, x, np_all, 1, hd, pall, p, &err) == HM_OK);
        cuda_rope_args rn = {*p, NULL, 0};
        HM_CHECK(cuda_rope_qk(dx, 1, NULL, 0, np_all, hd, dpall, &rn, NULL, &err) == HM_OK);
        HM_REQUIRE(tu_get(gx, dx, np_all * hd * 4));
        for (int64_t i = 0; i < np_all * hd; i++) {
            dev_total++;
            if (memcmp(&x[i], &gx[i], 4)) {
                dev_bad++;
                int32_t a, b;
                memcpy(&a, &x[i], 4);
                memcpy(&b, &gx[i], 4);
                HM_CHECK_MSG(abs(a - b) <= 1, "rope device path %zu: %a vs %a", c, (double)x[i], (double)gx[i]);
            }
        }
        cudaFree(dx);
        cudaFree(dpall);
        free(x);
        free(gx);
        free(pall);
        cudaFree(dq);
        cudaFree(dk);
        cudaFree(dpos);
        cudaFree(dtab);
        free(q);
        free(k);
        free(gq);
        free(gk);
        free(table);
    }
    printf("rope device-double path: %lld of %lld values differ from cpu_rope\n", (long long)dev_bad,
           (long long)dev_total);
    HM_CHECK(dev_bad * 100000 <= dev_total);
}

static void test_gpu(void) {
    if (!tu_have_gpu()) return;
    test_elementwise();
    test_rmsnorm();
    test_moe_rows();
    test_router();
    test_rope();
}

#else

static void test_gpu(void) {
    HM_CHECK(!cuda_compiled());
    (void)tu_have_gpu();
}

#endif

TU_TEST_MAIN(test_host, test_no_gpu_error, test_gpu)
