/* test_sample.c - the sampler chain (docs/SAMPLING.md): the RNG, greedy and its ties, each
 * filter's effect, penalties, determinism, and the drawn distribution against the expected
 * softmax (chi-square with a fixed seed). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sample/sample.h"

static sample_params off(void) { /* every filter off, temperature 1 */
    sample_params p = sample_params_default();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 42;
    return p;
}

/* Draws n tokens from logits with p; counts[n_vocab]. */
static int draw_counts(const sample_params *p, const float *logits, int32_t n_vocab, int n,
                       long *counts) {
    sample_state *s;
    if (sample_init(p, n_vocab, &s, NULL) != HM_OK) return 0;
    memset(counts, 0, (size_t)n_vocab * sizeof(long));
    for (int i = 0; i < n; i++) {
        int32_t t = -1;
        if (sample_token(s, logits, &t, NULL) != HM_OK || t < 0 || t >= n_vocab) {
            sample_free(s);
            return 0;
        }
        counts[t]++;
    }
    sample_free(s);
    return 1;
}

static void test_rng(void) {
    /* splitmix64 from state 0 (Vigna's reference splitmix64.c): first three outputs */
    HM_CHECK(sample_rng_u64(0, 0) == 0xE220A8397B1DCDAFull);
    HM_CHECK(sample_rng_u64(0, 1) == 0x6E789E6AA1B965F4ull);
    HM_CHECK(sample_rng_u64(0, 2) == 0x06C45D188009454Full);
    /* uniform: in [0,1), 24-bit grid, 16 buckets near-equal over 2^20 draws */
    long b[16] = {0};
    int in_range = 1, grid = 1;
    const long n = 1 << 20;
    for (long i = 0; i < n; i++) {
        float u = sample_uniform(7, (uint64_t)i);
        in_range &= u >= 0.0f && u < 1.0f;
        grid &= (float)(u * 16777216.0f) == floorf(u * 16777216.0f);
        if (u >= 0.0f && u < 1.0f) b[(int)(u * 16)]++;
    }
    double chi = 0, e = n / 16.0;
    for (int i = 0; i < 16; i++) chi += (b[i] - e) * (b[i] - e) / e;
    HM_CHECK(in_range && grid);
    HM_CHECK_MSG(chi < 40.0, "uniform chi2 %g (15 dof)", chi); /* p ~ 5e-4 */
    HM_CHECK(sample_uniform(1, 0) != sample_uniform(2, 0));
}

static void test_greedy(void) {
    sample_params p = off();
    p.temperature = 0.0f;
    sample_state *s;
    HM_REQUIRE(sample_init(&p, 6, &s, NULL) == HM_OK);
    float l[6] = {1.0f, 3.0f, -2.0f, 3.0f, 2.9f, 3.0f};
    int32_t t;
    HM_CHECK(sample_token(s, l, &t, NULL) == HM_OK && t == 1); /* ties: lower id */
    l[1] = 2.0f;
    HM_CHECK(sample_token(s, l, &t, NULL) == HM_OK && t == 3);
    float neg[6] = {-5, -5, -5, -5, -5, -5};
    HM_CHECK(sample_token(s, neg, &t, NULL) == HM_OK && t == 0);
    l[2] = NAN;
    hm_error err;
    HM_CHECK(sample_token(s, l, &t, &err) == HM_ERR_ARG);
    sample_free(s);
    /* top_k = 1 is greedy whatever the temperature */
    p = off();
    p.top_k = 1;
    p.temperature = 5.0f;
    float l2[6] = {1.0f, 3.0f, -2.0f, 3.0f, 2.9f, 3.0f};
    long c[6];
    HM_CHECK(draw_counts(&p, l2, 6, 200, c) && c[1] == 200);
}

/* greedy over wide vocabularies (the eight-lane pass): the first maximum as a plain scan finds
 * it, on logits drawn from a few values (ties in every lane), signed zeros, -inf, and a NaN at
 * the end (an error naming its index) */
static void test_greedy_wide(void) {
    sample_params p = off();
    p.temperature = 0.0f;
    const int32_t n = 1031;
    sample_state *s;
    HM_REQUIRE(sample_init(&p, n, &s, NULL) == HM_OK);
    float *l = malloc(sizeof(float) * n);
    HM_REQUIRE(l);
    uint64_t r = 99;
    const float vals[6] = {-INFINITY, -1.5f, -0.0f, 0.0f, 2.25f, 7.0f};
    int ok = 1;
    for (int rep = 0; rep < 200; rep++) {
        const int top = rep % 6; /* the largest value this draw may use */
        for (int32_t t = 0; t < n; t++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            l[t] = vals[(r >> 33) % (uint64_t)(top + 1)];
        }
        int32_t best = 0, got = -1;
        for (int32_t t = 1; t < n; t++)
            if (l[t] > l[best]) best = t;
        ok &= sample_token(s, l, &got, NULL) == HM_OK && got == best;
    }
    HM_CHECK_MSG(ok, "wide greedy differs from the first-maximum scan");
    l[n - 1] = NAN;
    hm_error err;
    int32_t t;
    HM_CHECK(sample_token(s, l, &t, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "token 1030 is NaN") != NULL, "%s", err.msg);
    sample_free(s);
    /* the default chain (no working copy without penalties) refuses it too */
    sample_params d = sample_params_default();
    HM_REQUIRE(sample_init(&d, n, &s, NULL) == HM_OK);
    hm_error_clear(&err);
    HM_CHECK(sample_token(s, l, &t, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "token 1030 is NaN") != NULL, "%s", err.msg);
    l[n - 1] = -INFINITY;
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = l[i] > mx ? l[i] : mx;
    /* the last draw holds -inf and -1.5 only: min-p leaves the maxima */
    HM_CHECK(sample_token(s, l, &t, NULL) == HM_OK && t >= 0 && t < n && l[t] == mx);
    free(l);
    sample_free(s);
}

static void test_penalties(void) {
    sample_params p = off();
    p.temperature = 0.0f;
    p.repeat_penalty = 1.5f;
    sample_state *s;
    HM_REQUIRE(sample_init(&p, 3, &s, NULL) == HM_OK);
    float l[3] = {2.0f, 1.5f, -1.0f};
    int32_t t;
    HM_CHECK(sample_token(s, l, &t, NULL) == HM_OK && t == 0);
    sample_accept(s, 0); /* 2 / 1.5 = 1.33 < 1.5 */
    HM_CHECK(sample_token(s, l, &t, NULL) == HM_OK && t == 1);
    sample_free(s);
    /* negative logits are multiplied: -1 * 1.5 stays below the others */
    float l3[3] = {-1.0f, -1.2f, -3.0f};
    HM_REQUIRE(sample_init(&p, 3, &s, NULL) == HM_OK);
    sample_accept(s, 0); /* -1.5 < -1.2 */
    HM_CHECK(sample_token(s, l3, &t, NULL) == HM_OK && t == 1);
    sample_free(s);
    /* frequency and presence: l - (c * freq + presence) */
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.3f;
    HM_REQUIRE(sample_init(&p, 3, &s, NULL) == HM_OK);
    sample_accept(s, 0);
    sample_accept(s, 0); /* 2 - 0.6 = 1.4 < 1.5 */
    HM_CHECK(sample_token(s, l, &t, NULL) == HM_OK && t == 1);
    sample_free(s);
    p.frequency_penalty = 0.2f; /* 2 - 0.4 = 1.6 */
    HM_REQUIRE(sample_init(&p, 3, &s, NULL) == HM_OK);
    sample_accept(s, 0);
    sample_accept(s, 0);
    HM_CHECK(sample_token(s, l, &t, NULL) == HM_OK && t == 0);
    sample_free(s);
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.6f; /* once or twice: 2 - 0.6 = 1.4 */
    HM_REQUIRE(sample_init(&p, 3, &s, NULL) == HM_OK);
    sample_accept(s, 0);
    sample_accept(s, 0);
    HM_CHECK(sample_token(s, l, &t, NULL) == HM_OK && t == 1);
    sample_free(s);
    /* only the last penalty_last_n tokens count */
    p.presence_penalty = 0.0f;
    p.repeat_penalty = 1.5f;
    p.penalty_last_n = 3;
    HM_REQUIRE(sample_init(&p, 3, &s, NULL) == HM_OK);
    sample_accept(s, 0);
    sample_accept(s, 1);
    sample_accept(s, 1);
    sample_accept(s, 1); /* 0 fell out of the window: 2 > 1.5/1.5 */
    HM_CHECK(sample_token(s, l, &t, NULL) == HM_OK && t == 0);
    sample_reset(s);
    HM_CHECK(sample_token(s, l, &t, NULL) == HM_OK && t == 0);
    sample_free(s);
    /* bad parameters */
    hm_error err;
    p.repeat_penalty = 0.0f;
    HM_CHECK(sample_init(&p, 3, &s, &err) == HM_ERR_ARG);
    p.repeat_penalty = INFINITY; /* 0 * inf would make a NaN logit */
    HM_CHECK(sample_init(&p, 3, &s, &err) == HM_ERR_ARG);
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 1e37f; /* 64 repeats: an infinite penalty, inf - inf on an inf logit */
    HM_CHECK(sample_init(&p, 3, &s, &err) == HM_ERR_ARG);
    HM_CHECK_MSG(strstr(err.msg, "could become infinite") != NULL, "%s", err.msg);
    p.frequency_penalty = 0.0f;
    p.penalty_last_n = -1;
    HM_CHECK(sample_init(&p, 3, &s, &err) == HM_ERR_ARG);
    p.penalty_last_n = 64;
    HM_CHECK(sample_init(&p, 0, &s, &err) == HM_ERR_ARG);
}

/* probabilities 0.5, 0.3, 0.15, 0.05 (logits = ln p) */
static void four(float *l) {
    l[0] = logf(0.5f);
    l[1] = logf(0.3f);
    l[2] = logf(0.15f);
    l[3] = logf(0.05f);
}

static void test_filters(void) {
    float l[4];
    four(l);
    long c[4];
    sample_params p = off();
    HM_CHECK(draw_counts(&p, l, 4, 4000, c) && c[0] && c[1] && c[2] && c[3]);
    p.top_k = 3;
    HM_CHECK(draw_counts(&p, l, 4, 4000, c) && c[0] && c[1] && c[2] && c[3] == 0);
    p.top_k = 0;
    p.top_p = 0.7f; /* 0.5 < 0.7 <= 0.8: keep 2 */
    HM_CHECK(draw_counts(&p, l, 4, 4000, c) && c[0] && c[1] && !c[2] && !c[3]);
    p.top_p = 0.45f; /* keep 1 */
    HM_CHECK(draw_counts(&p, l, 4, 1000, c) && c[0] == 1000);
    p.top_p = 0.9f; /* 0.8 < 0.9 <= 0.95: keep 3 */
    HM_CHECK(draw_counts(&p, l, 4, 4000, c) && c[0] && c[1] && c[2] && !c[3]);
    p.top_p = 1.0f;
    p.min_p = 0.2f; /* p >= 0.1: keep 3 */
    HM_CHECK(draw_counts(&p, l, 4, 4000, c) && c[0] && c[1] && c[2] && !c[3]);
    p.min_p = 0.5f; /* p >= 0.25: keep 2 */
    HM_CHECK(draw_counts(&p, l, 4, 4000, c) && c[0] && c[1] && !c[2] && !c[3]);
    /* top-k keeps the lower id among equal logits at its boundary */
    float eq[5] = {1, 2, 2, 2, 0};
    long c5[5];
    p = off();
    p.top_k = 2;
    HM_CHECK(draw_counts(&p, eq, 5, 2000, c5) && c5[1] && c5[2] && !c5[3] && !c5[0] && !c5[4]);
    p.top_k = 300; /* k > insertion limit path: full sort (k >= n_vocab: all kept) */
    HM_CHECK(draw_counts(&p, eq, 5, 2000, c5) && c5[0] && c5[1] && c5[2] && c5[3] && c5[4]);
}

/* Chi-square of counts against softmax(l / T) over k tokens. */
static double chi2(const float *l, int k, double T, const long *c, long n) {
    double m = -INFINITY, s = 0, x = 0;
    for (int i = 0; i < k; i++) m = fmax(m, l[i] / T);
    for (int i = 0; i < k; i++) s += exp(l[i] / T - m);
    for (int i = 0; i < k; i++) {
        double e = n * exp(l[i] / T - m) / s;
        x += (c[i] - e) * (c[i] - e) / e;
    }
    return x;
}

static void test_distribution(void) {
    float l[6] = {0.3f, -0.5f, 1.2f, 0.0f, 0.9f, -1.5f};
    long c[6];
    const long n = 60000;
    /* 5 dof: chi2 < 25 has p ~ 1.4e-4 of a false alarm; with the fixed seed the result is fixed */
    for (int ti = 0; ti < 3; ti++) {
        double T[3] = {1.0, 0.7, 1.8};
        sample_params p = off();
        p.temperature = (float)T[ti];
        p.seed = 1000 + (uint64_t)ti;
        HM_REQUIRE(draw_counts(&p, l, 6, (int)n, c));
        double x = chi2(l, 6, T[ti], c, n);
        HM_CHECK_MSG(x < 25.0, "T=%g: chi2 %g", T[ti], x);
    }
    /* a larger vocabulary through the full-sort path (top-k off), 200 tokens in 8 buckets */
    enum { NV = 200 };
    float *lv = malloc(NV * sizeof(float));
    long *cv = malloc(NV * sizeof(long));
    for (int i = 0; i < NV; i++) lv[i] = (float)((i * 37) % 101) / 25.0f;
    sample_params p = off();
    p.seed = 99;
    HM_REQUIRE(draw_counts(&p, lv, NV, 8000, cv));
    double m = 0, s = 0, eb[8] = {0}, cb[8] = {0};
    for (int i = 0; i < NV; i++) m = fmax(m, lv[i]);
    for (int i = 0; i < NV; i++) s += exp(lv[i] - m);
    for (int i = 0; i < NV; i++) {
        eb[i % 8] += 8000.0 * exp(lv[i] - m) / s;
        cb[i % 8] += (double)cv[i];
    }
    double x = 0;
    for (int b = 0; b < 8; b++) x += (cb[b] - eb[b]) * (cb[b] - eb[b]) / eb[b];
    HM_CHECK_MSG(x < 30.0, "vocab 200: chi2 %g (7 dof)", x);
    free(lv);
    free(cv);
}

static void test_determinism(void) {
    float l[6] = {0.3f, -0.5f, 1.2f, 0.0f, 0.9f, -1.5f};
    sample_params p = off();
    p.seed = 123;
    sample_state *a, *b, *c;
    HM_REQUIRE(sample_init(&p, 6, &a, NULL) == HM_OK);
    HM_REQUIRE(sample_init(&p, 6, &b, NULL) == HM_OK);
    p.seed = 124;
    HM_REQUIRE(sample_init(&p, 6, &c, NULL) == HM_OK);
    int32_t ta[64], tb[64], tc[64];
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 64; i++) {
        sample_token(a, l, &ta[i], NULL);
        sample_token(b, l, &tb[i], NULL);
        sample_token(c, l, &tc[i], NULL);
        same_ab &= ta[i] == tb[i];
        same_ac &= ta[i] == tc[i];
    }
    HM_CHECK(same_ab && !same_ac);
    /* reset replays the same draws */
    sample_reset(a);
    int replay = 1;
    for (int i = 0; i < 64; i++) {
        int32_t t;
        sample_token(a, l, &t, NULL);
        replay &= t == ta[i];
    }
    HM_CHECK(replay);
    /* a draw is a pure function of (seed, step): the first draw is the documented pick */
    float u = sample_uniform(123, 0), tot = 0, cum = 0;
    int order[6] = {2, 4, 0, 3, 1, 5}; /* (logit desc, id asc) */
    for (int i = 0; i < 6; i++) tot += expf(l[order[i]] - l[2]);
    int pick = 5;
    for (int i = 0; i < 6; i++) {
        cum += expf(l[order[i]] - l[2]);
        if (cum > u * tot) { pick = order[i]; break; }
    }
    HM_CHECK(pick == ta[0]); /* libm expf here: the same pick unless u lands within 1e-6 of an edge */
    sample_free(a);
    sample_free(b);
    sample_free(c);
}

/* k > 256 takes the radix-sort path: ties at the top-k boundary keep the lower ids, and -0 and
 * +0 are equal logits. */
static void test_sort_path(void) {
    enum { NV = 280, K = 257, DRAWS = 5000 }; /* ~19 draws per kept token: none is missed */
    static float l[NV];
    static long c[NV];
    for (int i = 0; i < NV; i++) l[i] = (float)(5 - i / 50) * 0.001f; /* ties in classes of 50 */
    sample_params p = off();
    p.top_k = K;
    p.seed = 5;
    HM_REQUIRE(draw_counts(&p, l, NV, DRAWS, c));
    int ok = 1;
    for (int i = 0; i < NV; i++) ok &= i < K ? c[i] > 0 : c[i] == 0;
    HM_CHECK(ok);
    for (int i = 0; i < NV; i++) l[i] = i % 2 ? 0.0f : -0.0f;
    HM_REQUIRE(draw_counts(&p, l, NV, DRAWS, c));
    ok = 1;
    for (int i = 0; i < NV; i++) ok &= i < K ? c[i] > 0 : c[i] == 0;
    HM_CHECK(ok);
    /* negative and positive logits of many magnitudes: the K largest are kept */
    for (int i = 0; i < NV; i++) l[i] = (float)((i * 7919) % NV - 140) * ((i % 3) ? 0.013f : -0.7f);
    float sorted[NV];
    memcpy(sorted, l, sizeof(sorted));
    for (int i = 1; i < NV; i++) /* insertion sort, descending */
        for (int j = i; j > 0 && sorted[j] > sorted[j - 1]; j--) {
            float t = sorted[j]; sorted[j] = sorted[j - 1]; sorted[j - 1] = t;
        }
    p.temperature = 1000.0f; /* flatten so every kept token is drawn */
    HM_REQUIRE(draw_counts(&p, l, NV, DRAWS, c));
    ok = 1;
    for (int i = 0; i < NV; i++) ok &= l[i] > sorted[K] ? c[i] > 0 : (l[i] < sorted[K - 1] ? c[i] == 0 : 1);
    HM_CHECK(ok && sorted[K - 1] > sorted[K]);
}

/* 5000 tokens with top-k off take the radix sort: ties (and -0/+0) at the top-p cut keep the
 * lower ids; positive logits above negative ones, larger above smaller. */
static void test_radix_path(void) {
    enum { NV = 5000 };
    static float l[NV];
    static long c[NV];
    for (int i = 0; i < NV; i++) l[i] = -20.0f;
    for (int i = 4990; i < NV; i++) l[i] = i % 2 ? 0.0f : -0.0f;
    sample_params p = off(); /* top-k off: the whole vocabulary is sorted */
    p.top_p = 0.45f;         /* 10 tied tokens of p ~ 0.1 each: top-p keeps the first 5 */
    p.seed = 11;
    HM_REQUIRE(draw_counts(&p, l, NV, 400, c));
    int ok = 1;
    for (int i = 0; i < NV; i++) ok &= i >= 4990 && i < 4995 ? c[i] > 0 : c[i] == 0;
    HM_CHECK(ok);
    uint64_t st = 3;
    for (int i = 0; i < NV; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((double)(st >> 11) * 0x1.0p-53 * 1900.0 - 1000.0); /* [-1000, 900) */
    }
    const int top[5] = {4321, 17, 2500, 3999, 808};
    for (int i = 0; i < 5; i++) l[top[i]] = 990.0f - 10.0f * (float)i;
    p.top_p = 1.0f;
    p.min_p = expf(-45.0f); /* keeps logits >= 990 - 45: the five planted ones */
    p.temperature = 100.0f;
    HM_REQUIRE(draw_counts(&p, l, NV, 400, c));
    long in = 0;
    for (int i = 0; i < 5; i++) {
        HM_CHECK(c[top[i]] > 0);
        in += c[top[i]];
    }
    HM_CHECK(in == 400);
    p.min_p = 0.0f; /* untruncated: the most likely token is the largest logit */
    p.temperature = 1.0f;
    HM_REQUIRE(draw_counts(&p, l, NV, 50, c));
    HM_CHECK(c[4321] == 50);
}

HM_TEST_MAIN(test_radix_path, test_sort_path, test_rng, test_greedy, test_greedy_wide, test_penalties,
             test_filters, test_distribution, test_determinism)
