/* test_hot_admit.c - the hot cache's online admission (moe/hot_admit.h) on hand-made routing
 * whose admissions are derived in the comments: policy names, static (counts only), lru
 * (victims by last use, K per layer per step), lfru (decayed frequencies; a newcomer must beat
 * its victim), a two-phase workload's hit counts (static 100 of 200, lru 197), bad configs. */
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
    HM_CHECK(d.policy == HOT_POLICY_STATIC && d.max_per_step == 1 && d.decay == 0.9);
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

HM_TEST_MAIN(test_names, test_lru, test_k, test_lfru, test_phases, test_bad)
