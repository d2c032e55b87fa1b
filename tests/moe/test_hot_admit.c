/* test_hot_admit.c - the hot cache's online admission (moe/hot_admit.h) on hand-made routing
 * whose admissions are derived in the comments: policy names, static (counts only), lru
 * (victims by last use, K per layer per step), lfru (decayed frequencies; a newcomer must beat
 * its victim), a two-phase workload's hit counts (static 100 of 200, lru 197), the guard that
 * pauses admissions that do not pay (uniform routing) and keeps those that do, bad configs. */
#include <stdbool.h>
#include <string.h>

#include "harness.h"
#include "moe/hot_admit.h"

static hot_admit *make(int nl, int ne, const uint8_t *hot, hot_policy p, int k, double decay) {
    hot_admit_cfg c = {.policy = p, .max_per_step = k, .decay = decay};
    hot_admit *a = NULL;
    hm_error err;
    HM_CHECK_MSG(hot_admit_init(nl, ne, hot, &c, &a, &err) == HM_OK, "%s", err.msg);
    return a;
}

static int step(hot_admit *a, const int32_t *ids, int n, hot_exchange *x) {
    if (!a) return -1;
    hot_admit_observe(a, 0, ids, n);
    return hot_admit_step(a, x, 8);
}

static void test_names(void) {
    hot_policy p;
    hm_error err;
    HM_CHECK(hot_policy_parse("lru", &p, &err) == HM_OK && p == HOT_POLICY_LRU);
    HM_CHECK(hot_policy_parse("lfru", &p, &err) == HM_OK && p == HOT_POLICY_LFRU);
    HM_CHECK(hot_policy_parse("static", &p, &err) == HM_OK && p == HOT_POLICY_STATIC);
    HM_CHECK(!strcmp(hot_policy_name(HOT_POLICY_LFRU), "lfru"));
    HM_CHECK(hot_policy_parse("LRU", &p, &err) == HM_ERR_ARG &&
             strstr(err.msg, "'LRU' (known: static, lru, lfru)"));
    const hot_admit_cfg d = hot_admit_default();
    HM_CHECK(d.policy == HOT_POLICY_STATIC && d.max_per_step == 1 && d.decay == 0.9 &&
             d.min_useful == 0.5);
}

/* LRU, 4 experts, slots {0, 1}, K = 1:
 *   step 1 uses 2: victims 0, 1 unused, never used -> lower id 0: {1, 2};
 *   step 2 uses 0: victims 1 (last: never), 2 (step 1) -> 1: {0, 2};
 *   step 3 uses 2, 3: 3 misses; victim 0 (the only hot one unused): {2, 3}. */
static void test_lru(void) {
    const uint8_t hot[4] = {1, 1, 0, 0};
    hot_admit *a = make(1, 4, hot, HOT_POLICY_LRU, 1, 0.9);
    hot_exchange x[8];
    const int32_t s1[] = {2}, s2[] = {0}, s3[] = {2, 3};
    HM_CHECK(step(a, s1, 1, x) == 1 && x[0].out == 0 && x[0].in == 2);
    HM_CHECK(step(a, s2, 1, x) == 1 && x[0].out == 1 && x[0].in == 0);
    HM_CHECK(step(a, s3, 2, x) == 1 && x[0].out == 0 && x[0].in == 3);
    const uint8_t *m = hot_admit_map(a);
    HM_CHECK(!m[0] && !m[1] && m[2] && m[3]);
    uint64_t h, mi, ad;
    hot_admit_counts(a, &h, &mi, &ad);
    HM_CHECK(h == 1 && mi == 3 && ad == 3);
    hot_admit_free(a);
}

/* K: three misses in one step, slots {0, 1, 2} of 6; K = 1 admits one, K = 2 two (the misses
 * ranked by uses this step: 5 twice, then 3, 4 by id). */
static void test_k(void) {
    const uint8_t hot[6] = {1, 1, 1, 0, 0, 0};
    const int32_t ids[] = {4, 5, 3, 5};
    hot_exchange x[8];
    for (int k = 1; k <= 2; k++) {
        hot_admit *a = make(1, 6, hot, HOT_POLICY_LRU, k, 0.9);
        HM_CHECK(step(a, ids, 4, x) == k && x[0].in == 5 && x[0].out == 0);
        if (k == 2) HM_CHECK(x[1].in == 3 && x[1].out == 1);
        hot_admit_free(a);
    }
}

/* LFRU, 3 experts, slot {0}, decay 0.5:
 *   step 1 uses 0 twice: f0 = 2;
 *   step 2 uses 1: f0 = 1, f1 = 1: not higher, no admission (lru would have admitted);
 *   step 3 uses 1: f0 = 0.5, f1 = 1.5: admitted in place of 0. */
static void test_lfru(void) {
    const uint8_t hot[3] = {1, 0, 0};
    hot_admit *a = make(1, 3, hot, HOT_POLICY_LFRU, 1, 0.5);
    hot_exchange x[8];
    const int32_t s1[] = {0, 0}, s2[] = {1};
    HM_CHECK(step(a, s1, 2, x) == 0);
    HM_CHECK(step(a, s2, 1, x) == 0);
    HM_CHECK(step(a, s2, 1, x) == 1 && x[0].out == 0 && x[0].in == 1);
    hot_admit_free(a);
}

/* Two phases of 50 steps, two tokens' worth of ids each: {0, 1} then {2, 3}; slots {0, 1}.
 * static: 100 hits of 200. lru, K = 1: step 51 misses 2 and 3 (2 admitted for 0), step 52
 * misses 3 (admitted for 1): 197 hits. */
static void test_phases(void) {
    const uint8_t hot[4] = {1, 1, 0, 0};
    const hot_policy pol[2] = {HOT_POLICY_STATIC, HOT_POLICY_LRU};
    const uint64_t want[2] = {100, 197};
    for (int p = 0; p < 2; p++) {
        hot_admit *a = make(1, 4, hot, pol[p], 1, 0.9);
        hot_exchange x[8];
        for (int s = 0; s < 100; s++) {
            const int32_t ids[2] = {s < 50 ? 0 : 2, s < 50 ? 1 : 3};
            step(a, ids, 2, x);
        }
        uint64_t h, m, ad;
        hot_admit_counts(a, &h, &m, &ad);
        HM_CHECK_MSG(h == want[p] && h + m == 200, "%s: %llu hits", hot_policy_name(pol[p]),
                     (unsigned long long)h);
        hot_admit_free(a);
    }
}

/* The guard (min_useful 0.5): 64 experts, 16 slots, lru, K = 1, 4 selections a step.
 *   uniform: an admitted expert is used about as often as the one it evicted, so the layer
 *   pauses; after the first 500 steps, the probes (one per 32 steps) and the few admissions of
 *   a share that recovered: far fewer than the ~1 a step without the guard;
 *   a window of 8 experts drifting by one every 40 steps (wrapping over experts 16..63): every
 *   admission is used many times, the victims not at all, the layer never pauses and the cache
 *   follows the window (hits > 90 % after the start). */
static uint64_t lcg(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

static void draw(int32_t *ids, int lo, int span, uint64_t *x) {
    for (int k = 0; k < 4; k++) {
        int32_t e;
        bool again;
        do {
            e = lo + (int32_t)(lcg(x) % (uint64_t)span);
            again = false;
            for (int j = 0; j < k; j++) again = again || ids[j] == e;
        } while (again);
        ids[k] = e;
    }
}

static void test_guard(void) {
    uint8_t hot[64] = {0};
    for (int e = 0; e < 16; e++) hot[e] = 1;
    for (int pass = 0; pass < 2; pass++) {
        const bool uniform = pass == 0;
        hot_admit_cfg c = hot_admit_default();
        c.policy = HOT_POLICY_LRU;
        for (int guard = 0; guard < 2; guard++) {
            c.min_useful = guard ? 0.5 : 0.0;
            hot_admit *a = NULL;
            hm_error err;
            HM_REQUIRE(hot_admit_init(1, 64, hot, &c, &a, &err) == HM_OK);
            uint64_t x = 5, adm_late = 0, adm_start = 0, h0 = 0, m0 = 0, ad0 = 0, pause0 = 0;
            for (int t = 0; t < 2500; t++) {
                int32_t ids[4];
                draw(ids, uniform ? 0 : 16 + (t / 40) % 41, uniform ? 64 : 8, &x);
                hot_exchange ex[8];
                hot_admit_observe(a, 0, ids, 4);
                const int n = hot_admit_step(a, ex, 8);
                if (t >= 500) adm_late += (uint64_t)n;
                if (t < 32) adm_start += (uint64_t)n;
                if (t == 499) {
                    hot_admit_counts(a, &h0, &m0, &ad0);
                    pause0 = hot_admit_paused(a);
                }
            }
            uint64_t h, m, ad;
            hot_admit_counts(a, &h, &m, &ad);
            const double hit = (double)(h - h0) / (double)(h - h0 + m - m0);
            if (uniform && guard) /* 75 when written; the start: probes only, no flood */
                HM_CHECK_MSG(adm_late < 300 && hot_admit_paused(a) > 1000 && adm_start <= 2,
                             "uniform, guard: %llu admissions in 2000 steps, %llu paused, %llu "
                             "in the first 32 steps", (unsigned long long)adm_late,
                             (unsigned long long)hot_admit_paused(a),
                             (unsigned long long)adm_start);
            if (uniform && !guard)
                HM_CHECK_MSG(adm_late > 1500 && hot_admit_paused(a) == 0,
                             "uniform, no guard: %llu admissions", (unsigned long long)adm_late);
            if (!uniform) /* the guard's probes open the layer within its first windows */
                HM_CHECK_MSG(hit > 0.9 && hot_admit_paused(a) == pause0 && pause0 < 100 &&
                                 adm_late >= 40,
                             "window%s: hit rate %.3f, %llu admissions, %llu paused",
                             guard ? ", guard" : "", hit, (unsigned long long)adm_late,
                             (unsigned long long)hot_admit_paused(a));
            hot_admit_free(a);
        }
    }
}

static void test_bad(void) {
    const uint8_t hot[2] = {1, 0};
    hot_admit_cfg c = hot_admit_default();
    hot_admit *a = NULL;
    hm_error err;
    c.max_per_step = 0;
    HM_CHECK(hot_admit_init(1, 2, hot, &c, &a, &err) == HM_ERR_ARG && !a);
    c = hot_admit_default();
    c.decay = 0;
    HM_CHECK(hot_admit_init(1, 2, hot, &c, &a, &err) == HM_ERR_ARG && !a);
    c.decay = 1.5;
    HM_CHECK(hot_admit_init(1, 2, hot, &c, &a, &err) == HM_ERR_ARG && !a);
}

HM_TEST_MAIN(test_names, test_lru, test_k, test_lfru, test_phases, test_guard, test_bad)
