/* test_matmul.c - cpu_matmul and cpu_moe_matmul equal, bit for bit, quant_dot_ref of every
 * (row, token) pair, with 1, 2 and 3 threads, batches 1..70, the best kernel table and the
 * reference table; skipped MoE slots are left untouched; bad ids and types are refused; the
 * fused forms (cpu_matmul_multi, cpu_moe_matmul_pair with a post step, the one-job expert FFN
 * cpu_moe_ffn) equal the single products; activation rows quantised in parts equal whole rows;
 * a product job's on_rows hook sees every row once, after it is written; products that read
 * repacked copies (cpu_matmul_mat.x8, cpu_moe_args.x8: quant_x8's kernel) give the same bits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/threadpool.h"
#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "harness.h"

static unsigned long long g_rng = 0x243f6a8885a308d3ull;
static uint32_t rnd(void) {
    return hm_t_rnd(&g_rng);
}
static float rndf(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f; }

/* n_rows rows of k elements of type t: quantised from random floats (valid blocks). */
static uint8_t *make_weights(uint32_t t, int64_t rows, int64_t k) {
    size_t rs = hm_row_size(t, k);
    uint8_t *w = malloc(rs * (size_t)rows);
    float *f = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < k; i++) f[i] = rndf(-1, 1);
        if (quant_quantize_row(t, f, w + (size_t)r * rs, k) != HM_OK) {
            free(w);
            w = NULL;
            break;
        }
    }
    free(f);
    return w;
}

static float *make_x(int64_t n) {
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = rndf(-3, 3);
    return x;
}

/* quant_dot_ref of weight row r with x (quantised by the reference). */
static float ref_dot(uint32_t t, const uint8_t *w, int64_t r, int64_t k, const float *x) {
    quant_act act = quant_act_for(t);
    uint8_t *a = malloc(quant_act_row_size(act, k));
    quant_act_quantize_ref(act, x, a, k);
    float v = quant_dot_ref(t, k, w + (size_t)r * hm_row_size(t, k), a);
    free(a);
    return v;
}

static const uint32_t k_types[] = {HM_TYPE_Q8_0, HM_TYPE_Q4_K, HM_TYPE_MXFP4, HM_TYPE_Q6_K,
                                   HM_TYPE_Q5_K, HM_TYPE_IQ4_XS, HM_TYPE_Q4_0, HM_TYPE_Q4_1,
                                   HM_TYPE_Q5_0, HM_TYPE_Q5_1, HM_TYPE_IQ4_NL, HM_TYPE_F32,
                                   HM_TYPE_F16, HM_TYPE_BF16};

static void test_matmul_all(void) {
    static const int64_t batches[] = {1, 2, 3, 5, 16, 17, 70};
    const int64_t n_rows = 133; /* 1 thread: chunks of 16 rows (full tiles), 3 threads: 4 */
    tp_pool *pools[3];
    for (int i = 0; i < 3; i++) HM_REQUIRE(tp_init(i + 1, &pools[i], NULL) == HM_OK);
    const quant_kernels *tabs[2] = {quant_kernels_best(), quant_kernels_get(QUANT_ISA_REF)};
    for (size_t ti = 0; ti < sizeof(k_types) / sizeof(k_types[0]); ti++) {
        uint32_t t = k_types[ti];
        int bs = hm_type_get(t)->block_size;
        int64_t k = bs == 256 ? 512 : 32 * 9; /* 9 blocks: a partial lane group */
        uint8_t *w = make_weights(t, n_rows, k);
        HM_REQUIRE(w != NULL);
        float *x = make_x(70 * k);
        float *ref = malloc(sizeof(float) * 70 * (size_t)n_rows);
        for (int64_t tok = 0; tok < 70; tok++)
            for (int64_t r = 0; r < n_rows; r++) ref[tok * n_rows + r] = ref_dot(t, w, r, k, x + tok * k);
        float *y = malloc(sizeof(float) * 70 * (size_t)n_rows);
        int heavy = t == HM_TYPE_Q8_0 || t == HM_TYPE_Q4_K || t == HM_TYPE_MXFP4;
        for (int tab = 0; tab < 2; tab++)
            for (int th = 0; th < 3; th++)
                for (size_t bi = 0; bi < sizeof(batches) / sizeof(batches[0]); bi++) {
                    int64_t nt = batches[bi];
                    if (!heavy && nt != 1 && nt != 17) continue;
                    if (tab == 1 && nt > 17) continue; /* reference table: slow */
                    memset(y, 0xff, sizeof(float) * 70 * (size_t)n_rows);
                    hm_error err;
                    hm_status st = cpu_matmul(pools[th], tabs[tab], t, w, n_rows, k, x, nt, y, NULL, 0, &err);
                    HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
                    HM_CHECK_MSG(memcmp(y, ref, sizeof(float) * (size_t)(nt * n_rows)) == 0,
                                 "%s %s threads %d batch %lld", tabs[tab]->name, hm_type_name(t),
                                 th + 1, (long long)nt);
                }
        /* batch 1..70 for q4_K with 2 threads and caller scratch */
        if (t == HM_TYPE_Q4_K) {
            size_t ss = cpu_matmul_scratch_size(t, k, 70);
            void *scratch = malloc(ss);
            for (int64_t nt = 1; nt <= 70; nt++) {
                HM_CHECK(cpu_matmul(pools[1], NULL, t, w, n_rows, k, x, nt, y, scratch, ss, NULL) == HM_OK);
                HM_CHECK_MSG(memcmp(y, ref, sizeof(float) * (size_t)(nt * n_rows)) == 0, "batch %lld", (long long)nt);
            }
            free(scratch);
        }
        free(w);
        free(x);
        free(ref);
        free(y);
    }
    for (int i = 0; i < 3; i++) tp_free(pools[i]);
}

static void test_matmul_errors(void) {
    float x[64] = {0}, y[4];
    uint8_t w[4 * 34] = {0};
    hm_error err;
    HM_CHECK(cpu_matmul(NULL, NULL, HM_TYPE_Q2_K, w, 1, 256, x, 1, y, NULL, 0, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK(strstr(err.msg, "q2_K") != NULL);
    HM_CHECK(cpu_matmul(NULL, NULL, HM_TYPE_Q8_0, w, 1, 48, x, 1, y, NULL, 0, &err) == HM_ERR_ARG);
    char small[8];
    HM_CHECK(cpu_matmul(NULL, NULL, HM_TYPE_Q8_0, w, 4, 32, x, 1, y, small, sizeof(small), &err) == HM_ERR_ARG);
}

static void run_moe_case(tp_pool *pool, uint32_t t, int64_t n_tok, int per_slot) {
    const int64_t n_expert = 6, n_rows = 21;
    const int n_used = 3;
    int64_t k = hm_type_get(t)->block_size == 256 ? 256 : 96;
    uint8_t *w = make_weights(t, n_expert * n_rows, k);
    HM_REQUIRE(w != NULL);
    int64_t nx = per_slot ? n_tok * n_used : n_tok;
    float *x = make_x(nx * k);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n_tok * n_used));
    for (int64_t p = 0; p < n_tok * n_used; p++) ids[p] = (rnd() % 9 == 0) ? -1 : (int32_t)(rnd() % n_expert);
    size_t ny = (size_t)(n_tok * n_used * n_rows);
    float *y = malloc(sizeof(float) * ny);
    for (size_t i = 0; i < ny; i++) y[i] = -777.0f;
    cpu_moe_args a = {.wtype = t, .w = w, .n_expert = n_expert, .n_rows = n_rows, .k = k, .x = x,
                      .x_per_slot = per_slot, .ids = ids, .n_tok = n_tok, .n_used = n_used, .y = y};
    hm_error err;
    HM_CHECK_MSG(cpu_moe_matmul(pool, NULL, &a, NULL, 0, &err) == HM_OK, "%s", err.msg);
    int bad = 0;
    for (int64_t tok = 0; tok < n_tok; tok++)
        for (int s = 0; s < n_used; s++) {
            int64_t p = tok * n_used + s;
            const float *xr = x + (per_slot ? p : tok) * k;
            for (int64_t r = 0; r < n_rows; r++) {
                float got = y[p * n_rows + r];
                float want = ids[p] < 0 ? -777.0f : ref_dot(t, w, ids[p] * n_rows + r, k, xr);
                if (memcmp(&got, &want, 4) != 0) bad++;
            }
        }
    HM_CHECK_MSG(bad == 0, "%s tokens %lld per_slot %d threads %d: %d wrong", hm_type_name(t),
                 (long long)n_tok, per_slot, tp_size(pool), bad);
    /* an id out of range is refused before anything is written */
    ids[0] = (int32_t)n_expert;
    for (size_t i = 0; i < ny; i++) y[i] = -777.0f;
    HM_CHECK(cpu_moe_matmul(pool, NULL, &a, NULL, 0, &err) == HM_ERR_RANGE);
    HM_CHECK(y[0] == -777.0f && y[ny - 1] == -777.0f);
    free(w);
    free(x);
    free(ids);
    free(y);
}

static void test_moe(void) {
    static const int64_t toks[] = {1, 2, 7, 40};
    static const uint32_t types[] = {HM_TYPE_Q8_0, HM_TYPE_Q4_K, HM_TYPE_MXFP4, HM_TYPE_F16};
    for (int th = 1; th <= 3; th++) {
        tp_pool *p = NULL;
        HM_REQUIRE(tp_init(th, &p, NULL) == HM_OK);
        for (int ti = 0; ti < 4; ti++)
            for (int i = 0; i < 4; i++)
                for (int ps = 0; ps < 2; ps++) run_moe_case(p, types[ti], toks[i], ps);
        tp_free(p);
    }
}

/* cpu_matmul_multi and cpu_moe_matmul_pair give exactly the values of the single products. */
static void post_mix(void *ctx, int64_t p, int64_t r0, int64_t r1) {
    float **ab = ctx; /* a[p][r] = a[p][r] * 2 + b[p][r], rows [r0, r1) of 21 */
    for (int64_t r = r0; r < r1; r++) ab[0][p * 21 + r] = ab[0][p * 21 + r] * 2.0f + ab[1][p * 21 + r];
}

static void test_multi(void) {
    static const uint32_t tq[3] = {HM_TYPE_Q4_K, HM_TYPE_Q6_K, HM_TYPE_Q4_K};
    static const int64_t rows[3] = {133, 21, 5};
    const int64_t k = 512;
    hm_error err;
    HM_REQUIRE(quant_act_for(HM_TYPE_Q4_K) == quant_act_for(HM_TYPE_Q6_K));
    for (int th = 1; th <= 3; th++) {
        tp_pool *pool = NULL;
        HM_REQUIRE(tp_init(th, &pool, NULL) == HM_OK);
        for (int64_t n_tok = 1; n_tok <= 9; n_tok += 8) {
            float *x = make_x(n_tok * k);
            cpu_matmul_mat m[3];
            float *want[3];
            int bad = 0;
            for (int i = 0; i < 3; i++) {
                m[i] = (cpu_matmul_mat){.wtype = tq[i], .w = make_weights(tq[i], rows[i], k),
                                        .n_rows = rows[i], .y = malloc(sizeof(float) * (size_t)(n_tok * rows[i]))};
                want[i] = malloc(sizeof(float) * (size_t)(n_tok * rows[i]));
                HM_REQUIRE(cpu_matmul(pool, NULL, tq[i], m[i].w, rows[i], k, x, n_tok, want[i], NULL, 0, &err) == HM_OK);
            }
            HM_CHECK_MSG(cpu_matmul_multi(pool, NULL, 3, m, k, x, n_tok, NULL, 0, &err) == HM_OK, "%s", err.msg);
            for (int i = 0; i < 3; i++)
                bad += memcmp(m[i].y, want[i], sizeof(float) * (size_t)(n_tok * rows[i])) != 0;
            HM_CHECK_MSG(bad == 0, "multi: %d products differ (threads %d, tokens %lld)", bad, th, (long long)n_tok);
            m[1].wtype = HM_TYPE_Q8_0; /* another activation format */
            HM_CHECK(cpu_matmul_multi(pool, NULL, 3, m, k, x, n_tok, NULL, 0, &err) == HM_ERR_ARG);
            for (int i = 0; i < 3; i++) {
                free((void *)m[i].w);
                free(m[i].y);
                free(want[i]);
            }
            /* gate/up pair with a post step, 6 experts of 21 rows, 3 slots, one skipped */
            const int64_t ne = 6, nr = 21, np = n_tok * 3;
            uint8_t *wg = make_weights(HM_TYPE_Q4_K, ne * nr, k), *wu = make_weights(HM_TYPE_Q6_K, ne * nr, k);
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)np);
            for (int64_t p = 0; p < np; p++) ids[p] = p == 1 ? -1 : (int32_t)(rnd() % ne);
            float *ya = calloc((size_t)(np * nr), sizeof(float)), *yb = calloc((size_t)(np * nr), sizeof(float));
            float *wa = calloc((size_t)(np * nr), sizeof(float)), *wb = calloc((size_t)(np * nr), sizeof(float));
            cpu_moe_args a = {.wtype = HM_TYPE_Q4_K, .w = wg, .n_expert = ne, .n_rows = nr, .k = k, .x = x,
                              .ids = ids, .n_tok = n_tok, .n_used = 3, .y = wa};
            cpu_moe_args b = a;
            b.wtype = HM_TYPE_Q6_K, b.w = wu, b.y = wb;
            HM_REQUIRE(cpu_moe_matmul(pool, NULL, &a, NULL, 0, &err) == HM_OK);
            HM_REQUIRE(cpu_moe_matmul(pool, NULL, &b, NULL, 0, &err) == HM_OK);
            for (int64_t i = 0; i < np * nr; i++) wa[i] = wa[i] * 2.0f + wb[i];
            a.y = ya, b.y = yb;
            float *ab[2] = {ya, yb};
            HM_CHECK_MSG(cpu_moe_matmul_pair(pool, NULL, &a, &b, post_mix, ab, NULL, 0, &err) == HM_OK, "%s", err.msg);
            HM_CHECK_MSG(memcmp(ya, wa, sizeof(float) * (size_t)(np * nr)) == 0 &&
                         memcmp(yb, wb, sizeof(float) * (size_t)(np * nr)) == 0,
                         "moe pair differs (threads %d, tokens %lld)", th, (long long)n_tok);
            b.n_rows = 20;
            HM_CHECK(cpu_moe_matmul_pair(pool, NULL, &a, &b, NULL, NULL, NULL, 0, &err) == HM_ERR_ARG);
            free(wg);
            free(wu);
            free(ids);
            free(ya);
            free(yb);
            free(wa);
            free(wb);
            free(x);
        }
        tp_free(pool);
    }
}

/* A product job's activation rows quantised in parts (whole blocks) equal the whole-row
 * quantisation; parts that are not whole blocks are refused. */
static void test_job_parts(void) {
    static const uint32_t types[3] = {HM_TYPE_Q4_K, HM_TYPE_Q8_0, HM_TYPE_F16};
    static const int64_t blk[3] = {256, 32, 1};
    const int64_t k = 1024, n_tok = 3;
    hm_error err;
    float *x = make_x(n_tok * k);
    for (int i = 0; i < 3; i++) {
        uint8_t *w = make_weights(types[i], 8, k);
        float y[3 * 8];
        const cpu_matmul_mat m = {.wtype = types[i], .w = w, .n_rows = 8, .y = y};
        const size_t ss = cpu_matmul_scratch_size(types[i], k, n_tok);
        uint8_t *sa = malloc(ss), *sb = malloc(ss);
        cpu_matmul_job ja, jb;
        HM_REQUIRE(cpu_matmul_job_init(&ja, NULL, 1, &m, k, n_tok, 2, sa, ss, &err) == HM_OK);
        HM_REQUIRE(cpu_matmul_job_init(&jb, NULL, 1, &m, k, n_tok, 2, sb, ss, &err) == HM_OK);
        memset(sb, 0xA5, ss);
        cpu_matmul_job_quantize(&ja, x);
        for (int64_t t = n_tok - 1; t >= 0; t--) /* parts of 2 blocks and 1 block, out of order */
            for (int64_t i0 = 0; i0 < k;) {
                const int64_t n = (i0 / blk[i]) % 3 == 0 && i0 + 2 * blk[i] <= k ? 2 * blk[i] : blk[i];
                HM_REQUIRE(cpu_matmul_job_part_ok(&jb, i0, n));
                cpu_matmul_job_quantize_part(&jb, x, t, i0, n);
                i0 += n;
            }
        HM_CHECK_MSG(memcmp(sa, sb, ss) == 0, "%s: activation parts differ from the row",
                     hm_type_name(types[i]));
        HM_CHECK(!cpu_matmul_job_part_ok(&jb, 0, k + blk[i]) && !cpu_matmul_job_part_ok(&jb, -1, 1));
        if (blk[i] > 1)
            HM_CHECK(!cpu_matmul_job_part_ok(&jb, blk[i] / 2, blk[i]) &&
                     !cpu_matmul_job_part_ok(&jb, 0, blk[i] + 1));
        free(w);
        free(sa);
        free(sb);
    }
    free(x);
}

/* A product job run as a stage calls on_rows once for every row of every matrix, after the
 * rows are written. */
typedef struct {
    const float *y[2];
    const float *want[2];
    int seen[2][300];
    int bad;
} rows_seen;

static void count_rows(void *ctx, int mi, int64_t r0, int64_t r1) {
    rows_seen *s = ctx;
    for (int64_t r = r0; r < r1; r++) {
        s->seen[mi][r]++;
        s->bad += s->y[mi][r] != s->want[mi][r]; /* written before the call */
    }
}

static void test_job_on_rows(void) {
    const int64_t k = 512, rows[2] = {300, 37};
    hm_error err;
    float *x = make_x(k);
    tp_pool *pool = NULL;
    HM_REQUIRE(tp_init(3, &pool, NULL) == HM_OK);
    cpu_matmul_mat m[2];
    float *want[2];
    for (int i = 0; i < 2; i++) {
        m[i] = (cpu_matmul_mat){.wtype = HM_TYPE_Q4_K, .w = make_weights(HM_TYPE_Q4_K, rows[i], k),
                                .n_rows = rows[i], .y = calloc((size_t)rows[i], sizeof(float))};
        want[i] = malloc(sizeof(float) * (size_t)rows[i]);
        HM_REQUIRE(cpu_matmul(NULL, NULL, HM_TYPE_Q4_K, m[i].w, rows[i], k, x, 1, want[i], NULL, 0,
                              &err) == HM_OK);
    }
    const size_t ss = cpu_matmul_scratch_size(HM_TYPE_Q4_K, k, 1);
    void *scr = malloc(ss);
    cpu_matmul_job j;
    HM_REQUIRE(cpu_matmul_job_init(&j, NULL, 2, m, k, 1, 3, scr, ss, &err) == HM_OK);
    static rows_seen s;
    memset(&s, 0, sizeof(s));
    s.y[0] = m[0].y, s.y[1] = m[1].y, s.want[0] = want[0], s.want[1] = want[1];
    j.on_rows = count_rows;
    j.on_rows_ctx = &s;
    cpu_matmul_job_quantize(&j, x);
    const tp_stage st = cpu_matmul_job_stage(&j);
    tp_run_stages(pool, &st, 1);
    int wrong = 0;
    for (int i = 0; i < 2; i++)
        for (int64_t r = 0; r < rows[i]; r++) wrong += s.seen[i][r] != 1;
    HM_CHECK_MSG(wrong == 0, "%d rows not seen exactly once", wrong);
    HM_CHECK_MSG(s.bad == 0, "%d rows seen before they were written", s.bad);
    for (int i = 0; i < 2; i++) {
        free((void *)m[i].w);
        free(m[i].y);
        free(want[i]);
    }
    free(scr);
    free(x);
    tp_free(pool);
}

/* cpu_moe_ffn (gate/up + post + down in one job) gives exactly the two-job results, and with a
 * slot sum exactly cpu_moe_add_bias + cpu_moe_combine + cpu_add after them. */
enum { FFN_F = 256 };
static void post_mix_f(void *ctx, int64_t p, int64_t r0, int64_t r1) {
    float **ab = ctx; /* a[p][r] = a[p][r] * 2 + b[p][r], rows [r0, r1) of FFN_F */
    for (int64_t r = r0; r < r1; r++)
        ab[0][p * FFN_F + r] = ab[0][p * FFN_F + r] * 2.0f + ab[1][p * FFN_F + r];
}

static void test_moe_ffn(void) {
    static const uint32_t tdown[2] = {HM_TYPE_Q4_K, HM_TYPE_Q8_0};
    const int64_t ne = 6, E = 512, F = FFN_F, used = 3;
    hm_error err;
    int bad = 0, runs = 0;
    for (int th = 1; th <= 8; th += th < 3 ? 1 : 5) { /* 1, 2, 3 and an oversubscribed 8 */
        tp_pool *pool = NULL;
        HM_REQUIRE(tp_init(th, &pool, NULL) == HM_OK);
        for (int64_t n_tok = 1; n_tok <= 5; n_tok += 2)
            for (int td = 0; td < 2; td++) {
                const int64_t np = n_tok * used;
                float *x = make_x(n_tok * E);
                uint8_t *wg = make_weights(HM_TYPE_Q4_K, ne * F, E), *wu = make_weights(HM_TYPE_Q4_K, ne * F, E);
                uint8_t *wd = make_weights(tdown[td], ne * E, F);
                int32_t *ids = malloc(sizeof(int32_t) * (size_t)np);
                for (int64_t q = 0; q < np; q++) ids[q] = q == 1 ? -1 : (int32_t)(rnd() % ne);
                float *ga = calloc((size_t)(np * F), sizeof(float)), *gb = calloc((size_t)(np * F), sizeof(float));
                float *fa = calloc((size_t)(np * F), sizeof(float)), *fb = calloc((size_t)(np * F), sizeof(float));
                float *want = calloc((size_t)(np * E), sizeof(float)), *got = calloc((size_t)(np * E), sizeof(float));
                cpu_moe_args g = {.wtype = HM_TYPE_Q4_K, .w = wg, .n_expert = ne, .n_rows = F, .k = E,
                                  .x = x, .ids = ids, .n_tok = n_tok, .n_used = (int)used, .y = ga};
                cpu_moe_args u = g;
                u.w = wu, u.y = gb;
                cpu_moe_args d = {.wtype = tdown[td], .w = wd, .n_expert = ne, .n_rows = E, .k = F,
                                  .x = ga, .x_per_slot = 1, .ids = ids, .n_tok = n_tok,
                                  .n_used = (int)used, .y = want};
                float *ab[2] = {ga, gb};
                HM_REQUIRE(cpu_moe_matmul_pair(pool, NULL, &g, &u, post_mix_f, ab, NULL, 0, &err) == HM_OK);
                HM_REQUIRE(cpu_moe_matmul(pool, NULL, &d, NULL, 0, &err) == HM_OK);
                g.y = fa, u.y = fb, d.x = fa, d.y = got;
                float *fab[2] = {fa, fb};
                HM_CHECK_MSG(cpu_moe_ffn(pool, NULL, &g, &u, post_mix_f, fab, &d, NULL, NULL, 0, &err) == HM_OK,
                             "%s", err.msg);
                bad += memcmp(fa, ga, sizeof(float) * (size_t)(np * F)) != 0 ||
                       memcmp(got, want, sizeof(float) * (size_t)(np * E)) != 0;
                runs++;
                /* the slot sum inside the job: bias, weighted sum, residual add, as the calls */
                float *bias = make_x(ne * E), *w = make_x(np), *res = make_x(n_tok * E);
                float *res_want = malloc(sizeof(float) * (size_t)(n_tok * E));
                float *out = malloc(sizeof(float) * (size_t)(n_tok * E));
                float *out_want = malloc(sizeof(float) * (size_t)(n_tok * E));
                memcpy(res_want, res, sizeof(float) * (size_t)(n_tok * E));
                cpu_moe_add_bias(NULL, want, bias, ids, n_tok, (int)used, E);
                cpu_moe_combine(NULL, want, w, ids, n_tok, (int)used, E, out_want);
                cpu_add(NULL, res_want, out_want, res_want, n_tok * E);
                const cpu_moe_sum sum = {.w = w, .bias = bias, .out = out, .residual = res};
                HM_CHECK_MSG(cpu_moe_ffn(pool, NULL, &g, &u, post_mix_f, fab, &d, &sum, NULL, 0, &err) == HM_OK,
                             "%s", err.msg);
                bad += memcmp(out, out_want, sizeof(float) * (size_t)(n_tok * E)) != 0 ||
                       memcmp(res, res_want, sizeof(float) * (size_t)(n_tok * E)) != 0;
                runs++;
                free(bias); free(w); free(res); free(res_want); free(out); free(out_want);
                d.x = ga; /* down must read the gate product */
                HM_CHECK(cpu_moe_ffn(pool, NULL, &g, &u, post_mix_f, fab, &d, NULL, NULL, 0, &err) == HM_ERR_ARG);
                free(x); free(wg); free(wu); free(wd); free(ids);
                free(ga); free(gb); free(fa); free(fb); free(want); free(got);
            }
        tp_free(pool);
    }
    HM_CHECK_MSG(bad == 0, "moe ffn differs from the two-job products in %d of %d runs", bad, runs);
}

/* rows (a multiple of 8) of type t repacked by eights; NULL if the type has no such form */
static uint8_t *repack_rows(uint32_t t, const uint8_t *w, int64_t rows, int64_t k) {
    uint8_t *x8 = malloc(hm_row_size(t, k) * (size_t)rows);
    if (x8 && quant_x8_repack_rows(t, k, w, hm_row_size(t, k), rows, x8, NULL, NULL) != HM_OK) {
        free(x8);
        x8 = NULL;
    }
    return x8;
}

/* The repacked path (decode: up to 4 tokens per product, few pairs per expert) and the batch
 * path beside it give the dot tiles' bits: dense products of 1..6 tokens (q4_K, q6_K, mxfp4 and
 * q8_0, one
 * matrix repacked and one not in the same job), grouped products with shared and per-slot
 * inputs, and the one-job FFN with gate/up/down all repacked. */
static void test_repacked(void) {
    static const uint32_t types[] = {HM_TYPE_Q4_K, HM_TYPE_Q6_K, HM_TYPE_MXFP4, HM_TYPE_Q8_0};
    hm_error err;
    int bad = 0, runs = 0;
    for (int th = 1; th <= 3; th += 2) {
        tp_pool *pool = NULL;
        HM_REQUIRE(tp_init(th, &pool, NULL) == HM_OK);
        for (int ti = 0; ti < (int)(sizeof(types) / sizeof(types[0])); ti++) {
            const uint32_t t = types[ti];
            const int64_t k = 512, n_rows = 136, ne = 5, F = 64, used = 3;
            uint8_t *w = make_weights(t, n_rows, k), *w2 = make_weights(t, 40, k);
            uint8_t *x8 = repack_rows(t, w, n_rows, k);
            HM_REQUIRE(w && w2 && x8);
            float *x = make_x(6 * k), *want = malloc(sizeof(float) * 6 * (size_t)n_rows);
            float *got = malloc(sizeof(float) * 6 * (size_t)n_rows), *y2 = malloc(sizeof(float) * 6 * 40);
            for (int64_t nt = 1; nt <= 6; nt++) {
                HM_REQUIRE(cpu_matmul(pool, NULL, t, w, n_rows, k, x, nt, want, NULL, 0, &err) == HM_OK);
                const cpu_matmul_mat m[2] = {{.wtype = t, .w = w, .n_rows = n_rows, .y = got, .x8 = x8},
                                             {.wtype = t, .w = w2, .n_rows = 40, .y = y2}};
                HM_CHECK_MSG(cpu_matmul_multi(pool, NULL, 2, m, k, x, nt, NULL, 0, &err) == HM_OK, "%s", err.msg);
                bad += memcmp(got, want, sizeof(float) * (size_t)(nt * n_rows)) != 0;
                runs++;
            }
            /* grouped: ne experts of F rows, shared (gate/up) and per-slot (down) inputs */
            uint8_t *we = make_weights(t, ne * F, k), *xe = repack_rows(t, we, ne * F, k);
            HM_REQUIRE(we && xe);
            for (int ps = 0; ps < 2; ps++)
                for (int64_t nt = 1; nt <= 7; nt += 3) {
                    const int64_t np = nt * used;
                    float *xi = make_x(np * k), *ya = malloc(sizeof(float) * (size_t)(np * F));
                    float *yb = malloc(sizeof(float) * (size_t)(np * F));
                    int32_t *ids = malloc(sizeof(int32_t) * (size_t)np);
                    for (int64_t q = 0; q < np; q++) ids[q] = q == 2 ? -1 : (int32_t)(rnd() % ne);
                    for (int64_t i = 0; i < np * F; i++) ya[i] = yb[i] = -5.0f;
                    cpu_moe_args a = {.wtype = t, .w = we, .n_expert = ne, .n_rows = F, .k = k,
                                      .x = xi, .x_per_slot = ps, .ids = ids, .n_tok = nt,
                                      .n_used = (int)used, .y = ya};
                    HM_REQUIRE(cpu_moe_matmul(pool, NULL, &a, NULL, 0, &err) == HM_OK);
                    a.y = yb, a.x8 = xe;
                    HM_CHECK_MSG(cpu_moe_matmul(pool, NULL, &a, NULL, 0, &err) == HM_OK, "%s", err.msg);
                    bad += memcmp(ya, yb, sizeof(float) * (size_t)(np * F)) != 0;
                    runs++;
                    free(xi); free(ya); free(yb); free(ids);
                }
            /* the one-job FFN with all three products repacked (F2 = post_mix_f's row length) */
            const int64_t F2 = 256, E2 = 256;
            uint8_t *wg = make_weights(t, ne * F2, E2), *wu = make_weights(t, ne * F2, E2);
            uint8_t *wd = make_weights(t, ne * E2, F2);
            uint8_t *xg = repack_rows(t, wg, ne * F2, E2), *xu = repack_rows(t, wu, ne * F2, E2);
            uint8_t *xd = repack_rows(t, wd, ne * E2, F2);
            HM_REQUIRE(wg && wu && wd && xg && xu && xd);
            for (int64_t nt = 1; nt <= 2; nt++) {
                const int64_t np = nt * used;
                float *xi = make_x(nt * E2);
                int32_t *ids = malloc(sizeof(int32_t) * (size_t)np);
                for (int64_t q = 0; q < np; q++) ids[q] = (int32_t)((q * 2 + nt) % ne);
                float *out[2][3]; /* [plain, repacked][gate, up, down] */
                for (int v = 0; v < 2; v++) {
                    for (int i = 0; i < 3; i++) out[v][i] = calloc((size_t)(np * (i < 2 ? F2 : E2)), sizeof(float));
                    cpu_moe_args g = {.wtype = t, .w = wg, .n_expert = ne, .n_rows = F2, .k = E2,
                                      .x = xi, .ids = ids, .n_tok = nt, .n_used = (int)used,
                                      .y = out[v][0], .x8 = v ? xg : NULL};
                    cpu_moe_args u = g;
                    u.w = wu, u.y = out[v][1], u.x8 = v ? xu : NULL;
                    cpu_moe_args d = {.wtype = t, .w = wd, .n_expert = ne, .n_rows = E2, .k = F2,
                                      .x = out[v][0], .x_per_slot = 1, .ids = ids, .n_tok = nt,
                                      .n_used = (int)used, .y = out[v][2], .x8 = v ? xd : NULL};
                    float *ab[2] = {out[v][0], out[v][1]};
                    HM_CHECK_MSG(cpu_moe_ffn(pool, NULL, &g, &u, post_mix_f, ab, &d, NULL, NULL, 0, &err) == HM_OK,
                                 "%s", err.msg);
                }
                bad += memcmp(out[0][2], out[1][2], sizeof(float) * (size_t)(np * E2)) != 0;
                runs++;
                for (int v = 0; v < 2; v++)
                    for (int i = 0; i < 3; i++) free(out[v][i]);
                free(xi); free(ids);
            }
            free(wg); free(wu); free(wd); free(xg); free(xu); free(xd);
            free(we); free(xe); free(w); free(w2); free(x8); free(x); free(want); free(got); free(y2);
        }
        tp_free(pool);
    }
    HM_CHECK_MSG(bad == 0, "repacked products differ from the dot tiles' in %d of %d runs", bad, runs);
}

/* The expert job's stage size known before the routing (cpu_moe_ffn_job_items) is the plan's,
 * for one token's K distinct experts, on 1..16 threads and several shapes; the planned job run
 * as a stage gives cpu_moe_ffn's bytes. */
static void test_ffn_job_items(void) {
    static const int64_t shapes[][4] = {{128, 2048, 768, 8}, {32, 2880, 2880, 4}, {6, 512, 256, 3},
                                        {60, 2048, 1408, 4}};
    hm_error err;
    int bad = 0, runs = 0;
    for (int si = 0; si < 4; si++) {
        const int64_t ne = shapes[si][0], E = shapes[si][1], F = shapes[si][2];
        const int K = (int)shapes[si][3];
        int32_t ids[8];
        for (int s = 0; s < K; s++) ids[s] = (int32_t)((s * 7 + 3) % ne);
        float *x = calloc((size_t)E, sizeof(float)), *eg = calloc((size_t)(K * F), sizeof(float));
        float *eu = calloc((size_t)(K * F), sizeof(float)), *ey = calloc((size_t)(K * E), sizeof(float));
        cpu_moe_args g = {.wtype = HM_TYPE_Q8_0, .w = x, .n_expert = ne, .n_rows = F, .k = E,
                          .x = x, .ids = ids, .n_tok = 1, .n_used = K, .y = eg};
        cpu_moe_args u = g;
        u.y = eu;
        cpu_moe_args d = {.wtype = HM_TYPE_Q8_0, .w = x, .n_expert = ne, .n_rows = E, .k = F,
                          .x = eg, .x_per_slot = 1, .ids = ids, .n_tok = 1, .n_used = K, .y = ey};
        const size_t ss = cpu_moe_ffn_scratch_size(&g, &d);
        void *scratch = malloc(ss), *job = malloc(cpu_moe_ffn_job_size());
        HM_REQUIRE(x && eg && eu && ey && scratch && job);
        for (int nth = 1; nth <= 16; nth++) {
            HM_REQUIRE(cpu_moe_ffn_job_init(job, NULL, &g, &u, NULL, NULL, &d, NULL, scratch, ss,
                                            nth, &err) == HM_OK);
            bad += cpu_moe_ffn_job_n_items(job) != cpu_moe_ffn_job_items(&g, &u, &d, K, nth);
            bad += cpu_moe_ffn_job_stage(job).n_items != cpu_moe_ffn_job_n_items(job);
            runs++;
        }
        free(x); free(eg); free(eu); free(ey); free(scratch); free(job);
    }
    HM_CHECK_MSG(bad == 0, "planned expert job sizes differ in %d of %d plans", bad, runs);
}

HM_TEST_MAIN(test_matmul_all, test_matmul_errors, test_moe, test_multi, test_job_parts,
             test_job_on_rows, test_moe_ffn, test_repacked, test_ffn_job_items)
