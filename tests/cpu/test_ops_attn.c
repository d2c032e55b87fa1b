/* test_ops_attn.c - attention over the KV cache ring against a double-precision reference
 * written here: GQA, causal prompt batches and decode steps, sliding window with a ring that
 * wraps, sinks, f32/f16/bf16/q8_0 caches; bit-identical results for 1, 2, 3 threads, for a
 * batch versus token-by-token and for the SIMD versus scalar kernels; float caches (f32, f16,
 * bf16) within a bound on their rounding of the attention of the unrounded f32 K/V; the cache's
 * error cases; K/V stored head by head equal to whole rows. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/threadpool.h"
#include "cpu/ops.h"
#include "harness.h"
#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/qtypes.h"
#include "quant/quant.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(float lo, float hi) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    double u = (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
    return (float)(lo + (hi - lo) * u);
}

static tp_pool *pools[3];

typedef struct {
    uint32_t tk, tv;
    int n_head, n_kv, hd;
    int64_t window; /* 0 = full */
    int sinks;
} cfg;

#define NPOS 28
static const int batches[] = {20, 1, 1, 1, 5}; /* sums to NPOS */

typedef struct {
    float *q;          /* [NPOS][n_head][hd] */
    float *k, *v;      /* [NPOS][n_kv][hd] */
    float *sink;       /* [n_head] */
} seq_data;

static seq_data make_data(const cfg *c) {
    seq_data d;
    int64_t nq = (int64_t)NPOS * c->n_head * c->hd, nk = (int64_t)NPOS * c->n_kv * c->hd;
    d.q = malloc(nq * sizeof(float));
    d.k = malloc(nk * sizeof(float));
    d.v = malloc(nk * sizeof(float));
    d.sink = malloc(c->n_head * sizeof(float));
    for (int64_t i = 0; i < nq; i++) d.q[i] = frand(-2, 2);
    for (int64_t i = 0; i < nk; i++) d.k[i] = frand(-2, 2);
    for (int64_t i = 0; i < nk; i++) d.v[i] = frand(-1, 1);
    for (int h = 0; h < c->n_head; h++) d.sink[h] = frand(-2, 3);
    return d;
}

static void free_data(seq_data *d) {
    free(d->q); free(d->k); free(d->v); free(d->sink);
}

/* The values a cache of type t gives back for row x (n elements). */
static void cache_roundtrip(uint32_t t, const float *x, double *out, int n) {
    uint8_t buf[4096];
    float tmp[1024];
    quant_quantize_row(t, x, buf, n);
    quant_dequantize_row(t, buf, tmp, n);
    for (int i = 0; i < n; i++) out[i] = tmp[i];
}

/* out [n_head][hd] for the token at position p. */
static void ref_attention(const cfg *c, const seq_data *d, int p, double *out) {
    int n_rep = c->n_head / c->n_kv;
    double qe[256], ke[256], ve[256], sc[NPOS];
    double scale = (double)(1.0f / sqrtf((float)c->hd));
    int q0 = c->window > 0 && p - c->window + 1 > 0 ? (int)(p - c->window + 1) : 0;
    for (int h = 0; h < c->n_head; h++) {
        int g = h / n_rep;
        for (int i = 0; i < c->hd; i++) qe[i] = d->q[((int64_t)p * c->n_head + h) * c->hd + i];
        double m = c->sinks ? d->sink[h] : -INFINITY;
        for (int q = q0; q <= p; q++) {
            cache_roundtrip(c->tk, d->k + ((int64_t)q * c->n_kv + g) * c->hd, ke, c->hd);
            double s = 0;
            for (int i = 0; i < c->hd; i++) s += qe[i] * ke[i];
            sc[q] = s * scale;
            m = fmax(m, sc[q]);
        }
        double den = c->sinks ? exp(d->sink[h] - m) : 0.0;
        for (int i = 0; i < c->hd; i++) out[h * c->hd + i] = 0;
        for (int q = q0; q <= p; q++) {
            double e = exp(sc[q] - m);
            den += e;
            cache_roundtrip(c->tv, d->v + ((int64_t)q * c->n_kv + g) * c->hd, ve, c->hd);
            for (int i = 0; i < c->hd; i++) out[h * c->hd + i] += e * ve[i];
        }
        for (int i = 0; i < c->hd; i++) out[h * c->hd + i] /= den;
    }
}

/* Unit roundoff of a float cache type (round to nearest even: |x' - x| <= u |x| for normal
 * values) and the largest absolute error below its normal range (half its smallest subnormal
 * step); 0 for f32 (stored as is), -1 for a type without such a bound (q8_0). */
static double cache_unit(uint32_t t, double *abs_err) {
    *abs_err = 0;
    if (t == HM_TYPE_F32) return 0;
    if (t == HM_TYPE_F16) return *abs_err = 0x1p-25, 0x1p-11;
    if (t == HM_TYPE_BF16) return *abs_err = 0x1p-134, 0x1p-8;
    return -1;
}

/* The token at p with the unrounded f32 K/V (out [n_head][hd], double) and, per head, a bound
 * on how far attention over K/V rounded to the cache types can be from it (bound [n_head]).
 * With |k' - k| <= uk |k| + ak per element, every score moves by at most
 * d_q = scale (uk sum|q k| + ak sum|q|) (1 + 2^-20 slack), so each softmax weight (sink
 * included: it is not rounded) changes by a factor in [e^-2d, e^2d], d = max d_q, and
 * sum |p'_q - p_q| <= e^2d - 1. With |v' - v| <= uv |v| + av and vmax = max |v| over the
 * window, |out' - out| <= (e^2d - 1)(vmax (1 + uv) + av) + uv vmax + av. Exact in real
 * arithmetic; the f32 kernel adds the 1e-5 the rounded reference already allows. */
static void ref_attention_exact(const cfg *c, const seq_data *d, int p, double *out,
                                double *bound) {
    int n_rep = c->n_head / c->n_kv;
    double ak, av, sc[NPOS];
    const double uk = cache_unit(c->tk, &ak), uv = cache_unit(c->tv, &av);
    double scale = (double)(1.0f / sqrtf((float)c->hd));
    int q0 = c->window > 0 && p - c->window + 1 > 0 ? (int)(p - c->window + 1) : 0;
    for (int h = 0; h < c->n_head; h++) {
        int g = h / n_rep;
        const float *qe = d->q + ((int64_t)p * c->n_head + h) * c->hd;
        double m = c->sinks ? d->sink[h] : -INFINITY, dmax = 0, vmax = 0;
        for (int q = q0; q <= p; q++) {
            const float *ke = d->k + ((int64_t)q * c->n_kv + g) * c->hd;
            const float *ve = d->v + ((int64_t)q * c->n_kv + g) * c->hd;
            double s = 0, sqk = 0, sq = 0;
            for (int i = 0; i < c->hd; i++) {
                s += (double)qe[i] * ke[i];
                sqk += fabs((double)qe[i] * ke[i]);
                sq += fabs((double)qe[i]);
                vmax = fmax(vmax, fabs((double)ve[i]));
            }
            sc[q] = s * scale;
            dmax = fmax(dmax, scale * (uk * sqk + ak * sq) * (1 + 0x1p-20));
            m = fmax(m, sc[q]);
        }
        double den = c->sinks ? exp(d->sink[h] - m) : 0.0;
        for (int i = 0; i < c->hd; i++) out[h * c->hd + i] = 0;
        for (int q = q0; q <= p; q++) {
            double e = exp(sc[q] - m);
            den += e;
            const float *ve = d->v + ((int64_t)q * c->n_kv + g) * c->hd;
            for (int i = 0; i < c->hd; i++) out[h * c->hd + i] += e * ve[i];
        }
        for (int i = 0; i < c->hd; i++) out[h * c->hd + i] /= den;
        bound[h] = expm1(2 * dmax) * (vmax * (1 + uv) + av) + uv * vmax + av;
    }
}

/* Largest |out - exact| / (bound + 1e-5) over every token of out [NPOS][n_head][hd] (a float
 * cache within its bound gives <= 1); also the largest |out - exact| in *maxd. */
static double exact_ratio(const cfg *c, const seq_data *d, const float *out, double *maxd) {
    double *ex = malloc((size_t)c->n_head * c->hd * sizeof(double));
    double *bd = malloc((size_t)c->n_head * sizeof(double));
    double worst = 0;
    *maxd = 0;
    for (int p = 0; p < NPOS; p++) {
        ref_attention_exact(c, d, p, ex, bd);
        for (int h = 0; h < c->n_head; h++)
            for (int i = 0; i < c->hd; i++) {
                double e = fabs(out[((size_t)p * c->n_head + h) * c->hd + i] - ex[h * c->hd + i]);
                *maxd = fmax(*maxd, e);
                worst = fmax(worst, e / (bd[h] + 1e-5));
            }
    }
    free(ex);
    free(bd);
    return worst;
}

/* Runs the sequence (batches, or one token at a time) on pool; out: [NPOS][n_head][hd].
 * Returns the largest |difference| from the reference, or -1 on an error. */
/* scalar: the scalar loops instead of the AVX2 kernels. */
static double run_seq(const cfg *c, const seq_data *d, tp_pool *pool, int one_by_one, int scalar,
                      float *out) {
    cpu_kv_layer kv;
    int64_t max_b = one_by_one ? 1 : 20;
    int64_t slots = c->window > 0 ? cpu_kv_slots_needed(c->window, max_b) : NPOS + 3;
    hm_error err;
    if (cpu_kv_init(&kv, c->tk, c->tv, c->n_kv, c->hd, slots, &err) != HM_OK) return -1;
    double maxe = 0;
    double *ref = malloc((size_t)c->n_head * c->hd * sizeof(double));
    int64_t pos = 0;
    for (int bi = 0; pos < NPOS; bi++) {
        int64_t nb = one_by_one ? 1 : batches[bi];
        cpu_attn_args a = {0};
        a.n_head = c->n_head;
        a.n_tok = nb;
        a.pos0 = pos;
        a.window = c->window;
        a.sinks = c->sinks ? d->sink : NULL;
        a.q = d->q + pos * c->n_head * c->hd;
        a.k_new = d->k + pos * c->n_kv * c->hd;
        a.v_new = d->v + pos * c->n_kv * c->hd;
        a.out = out + pos * c->n_head * c->hd;
        a.no_simd = scalar;
        size_t ss = cpu_attention_scratch_size(&kv, &a, pool ? tp_size(pool) : 1);
        void *scr = bi % 2 ? malloc(ss) : NULL; /* both caller scratch and own allocation */
        hm_status st = cpu_attention(pool, &kv, &a, scr, ss, &err);
        free(scr);
        if (st != HM_OK) {
            fprintf(stderr, "attention: %s\n", err.msg);
            maxe = -1;
            break;
        }
        for (int64_t t = 0; t < nb; t++) {
            ref_attention(c, d, (int)(pos + t), ref);
            for (int i = 0; i < c->n_head * c->hd; i++)
                maxe = fmax(maxe, fabs(a.out[t * c->n_head * c->hd + i] - ref[i]));
        }
        pos += nb;
    }
    free(ref);
    cpu_kv_free(&kv);
    return maxe;
}

static void check_cfg(const cfg *c, const char *name) {
    seq_data d = make_data(c);
    size_t n = (size_t)NPOS * c->n_head * c->hd;
    float *out[5];
    for (int i = 0; i < 5; i++) out[i] = malloc(n * sizeof(float));
    double e[5];
    for (int p = 0; p < 3; p++) e[p] = run_seq(c, &d, pools[p], 0, 0, out[p]);
    e[3] = run_seq(c, &d, pools[1], 1, 0, out[3]);
    e[4] = run_seq(c, &d, pools[2], 0, 1, out[4]);
    printf("%-24s max |diff| from the double reference %.3g", name, e[0]);
    HM_CHECK_MSG(e[0] >= 0 && e[0] < 1e-5, "%s: max |diff| %g", name, e[0]);
    double ak, av;
    if (cache_unit(c->tk, &ak) >= 0 && cache_unit(c->tv, &av) >= 0) {
        /* float caches: close to attention over the unrounded f32 K/V, within the bound */
        double maxd, r = exact_ratio(c, &d, out[0], &maxd);
        printf(", from unrounded K/V %.3g (%.2f of the bound)", maxd, r);
        HM_CHECK_MSG(r <= 1, "%s: %.3g from attention over unrounded K/V, %.2f x the bound",
                     name, maxd, r);
    }
    printf("\n");
    HM_CHECK_MSG(!memcmp(out[0], out[1], n * 4) && !memcmp(out[0], out[2], n * 4),
                 "%s: thread counts differ", name);
    HM_CHECK_MSG(!memcmp(out[0], out[3], n * 4), "%s: batch != token by token", name);
    HM_CHECK_MSG(!memcmp(out[0], out[4], n * 4), "%s: SIMD != scalar kernels", name);
    for (int i = 0; i < 5; i++) free(out[i]);
    free_data(&d);
}

static int pools_up(void) {
    for (int i = 0; i < 3; i++)
        if (!pools[i] && tp_init(i + 1, &pools[i], NULL) != HM_OK) return 0;
    return 1;
}

static void test_attention_full(void) {
    HM_REQUIRE(pools_up());
    cfg c1 = {HM_TYPE_F32, HM_TYPE_F32, 8, 2, 64, 0, 0};
    check_cfg(&c1, "f32 gqa 8/2");
    cfg c2 = {HM_TYPE_F16, HM_TYPE_F16, 4, 4, 128, 0, 0};
    check_cfg(&c2, "f16 mha 4/4");
    cfg c3 = {HM_TYPE_Q8_0, HM_TYPE_Q8_0, 6, 2, 64, 0, 0};
    check_cfg(&c3, "q8_0 gqa 6/2");
    cfg c4 = {HM_TYPE_F16, HM_TYPE_Q8_0, 16, 1, 32, 0, 0};
    check_cfg(&c4, "f16 K q8_0 V, mqa 16/1");
    cfg c5 = {HM_TYPE_BF16, HM_TYPE_BF16, 8, 2, 64, 0, 0};
    check_cfg(&c5, "bf16 gqa 8/2");
    cfg c6 = {HM_TYPE_BF16, HM_TYPE_F32, 12, 4, 128, 0, 0}; /* 3 heads per group: 1 x 4 tiles */
    check_cfg(&c6, "bf16 K f32 V, gqa 12/4");
    cfg c7 = {HM_TYPE_F32, HM_TYPE_BF16, 5, 1, 48, 0, 0}; /* head_dim 48: scalar loops only */
    check_cfg(&c7, "f32 K bf16 V, hd 48");
    cfg c8 = {HM_TYPE_Q8_0, HM_TYPE_BF16, 4, 2, 32, 0, 0};
    check_cfg(&c8, "q8_0 K bf16 V");
}

static void test_attention_window_sinks(void) {
    HM_REQUIRE(pools_up());
    cfg c1 = {HM_TYPE_F32, HM_TYPE_F32, 8, 2, 64, 6, 1}; /* gpt-oss-like: window + sinks */
    check_cfg(&c1, "f32 window 6 sinks");
    cfg c2 = {HM_TYPE_F16, HM_TYPE_F16, 8, 2, 64, 6, 0};
    check_cfg(&c2, "f16 window 6");
    cfg c3 = {HM_TYPE_Q8_0, HM_TYPE_F16, 4, 2, 64, 0, 1};
    check_cfg(&c3, "q8_0 K full sinks");
    cfg c4 = {HM_TYPE_F16, HM_TYPE_F16, 4, 4, 64, 1, 1}; /* window 1: only itself (+ sink) */
    check_cfg(&c4, "window 1");
    cfg c5 = {HM_TYPE_BF16, HM_TYPE_BF16, 8, 2, 64, 6, 1};
    check_cfg(&c5, "bf16 window 6 sinks");
    cfg c6 = {HM_TYPE_F32, HM_TYPE_F32, 16, 2, 64, 0, 1};
    check_cfg(&c6, "f32 gqa 16/2 sinks");

    /* a dominant sink takes nearly all the mass: output ~ 0 */
    cpu_kv_layer kv;
    HM_REQUIRE(cpu_kv_init(&kv, HM_TYPE_F32, HM_TYPE_F32, 1, 32, 8, NULL) == HM_OK);
    float q[32], k[32], v[32], out[32], sink = 60.0f;
    for (int i = 0; i < 32; i++) { q[i] = 0.1f; k[i] = 0.1f; v[i] = 1.0f; }
    cpu_attn_args a = {.n_head = 1, .n_tok = 1, .pos0 = 0, .sinks = &sink, .q = q, .k_new = k,
                       .v_new = v, .out = out};
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, NULL) == HM_OK);
    HM_CHECK(fabsf(out[0]) < 1e-20f);
    a.sinks = NULL; /* without it the single position gets weight 1 */
    a.k_new = a.v_new = NULL;
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, NULL) == HM_OK);
    HM_CHECK(out[0] == 1.0f && out[31] == 1.0f);
    cpu_kv_free(&kv);
}

static void test_kv_errors(void) {
    hm_error err;
    cpu_kv_layer kv;
    HM_CHECK(cpu_kv_init(&kv, HM_TYPE_Q8_0, HM_TYPE_F16, 2, 48, 8, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK(cpu_kv_init(&kv, HM_TYPE_Q4_0, HM_TYPE_F16, 2, 64, 8, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK_MSG(strstr(err.msg, "q4_0") && strstr(err.msg, "f32, f16, bf16 or q8_0"), "%s",
                 err.msg);
    HM_CHECK(cpu_kv_init(&kv, HM_TYPE_F16, HM_TYPE_Q8_K, 2, 64, 8, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK(cpu_kv_init(&kv, HM_TYPE_BF16, HM_TYPE_F32, 2, 48, 8, &err) == HM_OK); /* any hd */
    HM_CHECK(kv.k_row_size == 2 * 48 * 2 && kv.v_row_size == 2 * 48 * 4);
    cpu_kv_free(&kv);
    HM_CHECK(cpu_kv_slots_needed(128, 512) == 639 && cpu_kv_slots_needed(0, 512) == -1);

    HM_REQUIRE(cpu_kv_init(&kv, HM_TYPE_F16, HM_TYPE_F16, 2, 32, 6, &err) == HM_OK);
    float q[4 * 8 * 32], k[8 * 2 * 32], v[8 * 2 * 32], out[4 * 8 * 32];
    for (int i = 0; i < 8 * 2 * 32; i++) { k[i] = frand(-1, 1); v[i] = frand(-1, 1); }
    for (int i = 0; i < 4 * 8 * 32; i++) q[i] = frand(-1, 1);
    cpu_attn_args a = {.n_head = 4, .n_tok = 1, .pos0 = 3, .window = 6, .q = q, .k_new = k,
                       .v_new = v, .out = out};
    /* positions 0..2 were never stored */
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, &err) == HM_ERR_STATE);
    HM_CHECK(strstr(err.msg, "position 0") != NULL);
    /* a batch of 3 with window 6 needs 8 slots */
    a.pos0 = 0;
    a.n_tok = 3;
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, &err) == HM_OK);
    a.pos0 = 3;
    a.n_tok = 3;
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, &err) == HM_OK); /* reads 0..5: fits 6 */
    a.pos0 = 6;
    a.n_tok = 2; /* reads 1..7: 7 positions > 6 slots */
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, &err) == HM_ERR_STATE);
    a.n_tok = 1; /* reads 1..6 */
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, &err) == HM_OK);
    /* rewinding to position 2 needs position 0, overwritten by 6 */
    a.pos0 = 2;
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, &err) == HM_ERR_STATE);
    /* shapes, scratch */
    a.pos0 = 7;
    a.n_head = 3;
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, &err) == HM_ERR_ARG);
    a.n_head = 4;
    char small[16];
    HM_CHECK(cpu_attention(NULL, &kv, &a, small, sizeof(small), &err) == HM_ERR_ARG);
    a.v_new = NULL;
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, &err) == HM_ERR_ARG);
    cpu_kv_clear(&kv);
    a.v_new = v;
    a.pos0 = 0;
    HM_CHECK(cpu_attention(NULL, &kv, &a, NULL, 0, &err) == HM_OK);
    cpu_kv_free(&kv);

    /* q8_0 cache refuses non-finite rows and says which position */
    HM_REQUIRE(cpu_kv_init(&kv, HM_TYPE_Q8_0, HM_TYPE_Q8_0, 2, 32, 8, &err) == HM_OK);
    k[2 * 32 + 5] = NAN;
    HM_CHECK(cpu_kv_store(NULL, &kv, 4, 2, k, v, &err) == HM_ERR_RANGE);
    HM_CHECK(strstr(err.msg, "position 5") != NULL);
    HM_CHECK(kv.slot_pos[4] == 4 && kv.slot_pos[5] == -1);
    cpu_kv_free(&kv);
}

/* cpu_kv_store_head, head by head, writes cpu_kv_store's bytes; a non-finite q8_0 head fails
 * (float caches keep infinities) */
static void test_kv_store_head(void) {
    enum { NT = 4 };
    static const uint32_t types[NT] = {HM_TYPE_F32, HM_TYPE_F16, HM_TYPE_BF16, HM_TYPE_Q8_0};
    enum { NKV = 3, HD = 64, SLOTS = 5 };
    float k[2][NKV * HD], v[2][NKV * HD];
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < NKV * HD; i++) k[t][i] = frand(-3, 3), v[t][i] = frand(-3, 3);
    hm_error err;
    for (int ti = 0; ti < NT; ti++) {
        cpu_kv_layer a, b;
        HM_REQUIRE(cpu_kv_init(&a, types[ti], types[NT - 1 - ti], NKV, HD, SLOTS, &err) == HM_OK);
        HM_REQUIRE(cpu_kv_init(&b, types[ti], types[NT - 1 - ti], NKV, HD, SLOTS, &err) == HM_OK);
        HM_REQUIRE(cpu_kv_store(NULL, &a, 4, 2, &k[0][0], &v[0][0], &err) == HM_OK); /* slots 4, 0 */
        for (int t = 0; t < 2; t++)
            for (int h = NKV - 1; h >= 0; h--) /* any order */
                HM_CHECK(cpu_kv_store_head(&b, 4 + t, h, &k[t][h * HD], &v[t][h * HD]) == HM_OK);
        HM_CHECK(b.slot_pos[4] == -1 && b.slot_pos[0] == -1); /* not marked yet */
        cpu_kv_mark(&b, 4, 2);
        HM_CHECK(b.slot_pos[4] == 4 && b.slot_pos[0] == 5);
        HM_CHECK_MSG(memcmp(a.k, b.k, a.k_row_size * SLOTS) == 0 &&
                         memcmp(a.v, b.v, a.v_row_size * SLOTS) == 0,
                     "K/V %s/%s: stored by head differs", hm_type_name(types[ti]),
                     hm_type_name(types[NT - 1 - ti]));
        float bad[HD];
        memcpy(bad, &v[0][0], sizeof(bad));
        bad[7] = INFINITY;
        HM_CHECK(cpu_kv_store_head(&b, 6, 1, &k[0][0], bad) ==
                 (types[NT - 1 - ti] == HM_TYPE_Q8_0 ? HM_ERR_RANGE : HM_OK));
        cpu_kv_free(&a);
        cpu_kv_free(&b);
    }
}

static void test_cleanup(void) {
    for (int i = 0; i < 3; i++) {
        tp_free(pools[i]);
        pools[i] = NULL;
    }
}

HM_TEST_MAIN(test_attention_full, test_attention_window_sinks, test_kv_errors, test_kv_store_head,
             test_cleanup)
