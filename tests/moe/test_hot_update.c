/* test_hot_update.c - the hot cache's updater (moe/hot_update.h) on hand-made caches and scores
 * whose exchanges are derived in the comments: pairs per layer (best cold against worst hot,
 * while it gains), the global order by gain, the max_exchange cap from the rate, rate 0
 * (static), ties, the statistics and their line, bad rates. */
#include <math.h>
#include <string.h>

#include "harness.h"
#include "moe/hot_update.h"

/* Two layers of four experts, two hot each.
 * Layer 0: hot {0, 1} scores 5, 1; cold {2, 3} scores 4, 0.5.
 *   candidates 2 (4), 3 (0.5); victims 1 (1), 0 (5): pair 2 -> 1 gains 3; 3 vs 0: 0.5 < 5 stop.
 * Layer 1: hot {2, 3} scores 0, 2; cold {0, 1} scores 9, 3.
 *   candidates 0 (9), 1 (3); victims 2 (0), 3 (2): 0 -> 2 gains 9; 1 -> 3 gains 1.
 * Gains: (1: 0->2) 9, (0: 2->1) 3, (1: 1->3) 1. */
static const uint8_t k_hot[8] = {1, 1, 0, 0, 0, 0, 1, 1};
static const double k_score[8] = {5, 1, 4, 0.5, 9, 3, 0, 2};

static void test_pairs(void) {
    hot_exchange x[4];
    int n = 0;
    hot_update_stats st;
    hm_error err;
    /* rate 1: max_exchange 4, the three pairs, sorted by layer then victim */
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, 30, 10, 1.0, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 3 && st.candidates == 3 && st.max_exchange == 4 && st.exchanged == 3);
    HM_CHECK(x[0].layer == 0 && x[0].out == 1 && x[0].in == 2 && x[0].gain == 3);
    HM_CHECK(x[1].layer == 1 && x[1].out == 2 && x[1].in == 0 && x[1].gain == 9);
    HM_CHECK(x[2].layer == 1 && x[2].out == 3 && x[2].in == 1 && x[2].gain == 1);
    HM_CHECK(st.layers_changed == 2 && st.active && st.hit_rate == 0.75);
    /* rate 0.5: max_exchange 2, the two best gains (9 and 3), one per layer */
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, 30, 10, 0.5, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 2 && st.max_exchange == 2 && st.candidates == 3);
    HM_CHECK(x[0].layer == 0 && x[0].in == 2 && x[1].layer == 1 && x[1].in == 0);
    /* rate 0.3: floor(1.2) = 1: only the gain of 9 */
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, 30, 10, 0.3, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 1 && x[0].layer == 1 && x[0].out == 2 && x[0].in == 0);
    HM_CHECK(st.layers_changed == 1);
    /* rate 1 into room for one: the best gain alone, nothing written past it */
    x[1].layer = -7;
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, 30, 10, 1.0, x, 1, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 1 && st.exchanged == 1 && st.max_exchange == 4 && x[0].gain == 9);
    HM_CHECK(x[1].layer == -7);
}

static void test_static_and_ties(void) {
    hot_exchange x[4];
    int n = 7;
    hot_update_stats st;
    hm_error err;
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, 0, 0, 0.0, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 0 && !st.active && st.exchanged == 0 && st.hit_rate == 0);
    /* ties: one layer, hot {0, 1} both 1, cold {2, 3} both 2: lower ids first on both sides:
     * 2 -> 0, 3 -> 1; equal scores never exchange */
    const uint8_t hot[4] = {1, 1, 0, 0};
    const double s[4] = {1, 1, 2, 2}, same[4] = {1, 1, 1, 1};
    HM_REQUIRE(hot_update_plan(1, 4, hot, s, 1, 1, 1.0, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 2 && x[0].out == 0 && x[0].in == 2 && x[1].out == 1 && x[1].in == 3);
    HM_REQUIRE(hot_update_plan(1, 4, hot, same, 1, 1, 1.0, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 0 && st.active && st.candidates == 0);
}

static void test_format_and_errors(void) {
    hot_exchange x[4];
    int n = 0;
    hot_update_stats st;
    hm_error err;
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, 30, 10, 0.5, x, 4, &n, &st, &err) == HM_OK);
    char line[256];
    hot_update_format(&st, line, sizeof(line));
    HM_CHECK_MSG(!strcmp(line, "hot cache update: active 1, update_rate 0.500, hit_rate 0.7500, "
                               "hot_slots 30, cold_slots 10, candidates 3, max_exchange 2, "
                               "exchanged 2, layers_changed 2"),
                 "%s", line);
    HM_CHECK(hot_update_plan(2, 4, k_hot, k_score, 1, 1, 1.5, x, 4, &n, &st, &err) == HM_ERR_ARG &&
             strstr(err.msg, "--moe-hot-cache-update-rate 1.5"));
    HM_CHECK(hot_update_plan(2, 4, k_hot, k_score, 1, 1, NAN, x, 4, &n, &st, &err) == HM_ERR_ARG);
    HM_CHECK(hot_update_plan(2, 4, k_hot, k_score, 1, 1, -0.1, x, 4, &n, &st, &err) == HM_ERR_ARG);
}

HM_TEST_MAIN(test_pairs, test_static_and_ties, test_format_and_errors)
