/* test_hot_update.c - the hot cache's updater (moe/hot_update.h) on hand-made caches and scores
 * whose exchanges are derived in the comments: pairs per layer (best cold against worst hot,
 * while it gains), the global order by gain, the max_exchange cap from the rate, rate 0
 * (static), ties, the statistics and their line, bad rates; with the window's counts, only the
 * pairs that stand out from chance. */
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
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, NULL, 30, 10, 1.0, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 3 && st.candidates == 3 && st.max_exchange == 4 && st.exchanged == 3);
    HM_CHECK(x[0].layer == 0 && x[0].out == 1 && x[0].in == 2 && x[0].gain == 3);
    HM_CHECK(x[1].layer == 1 && x[1].out == 2 && x[1].in == 0 && x[1].gain == 9);
    HM_CHECK(x[2].layer == 1 && x[2].out == 3 && x[2].in == 1 && x[2].gain == 1);
    HM_CHECK(st.layers_changed == 2 && st.active && st.hit_rate == 0.75);
    /* rate 0.5: max_exchange 2, the two best gains (9 and 3), one per layer */
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, NULL, 30, 10, 0.5, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 2 && st.max_exchange == 2 && st.candidates == 3);
    HM_CHECK(x[0].layer == 0 && x[0].in == 2 && x[1].layer == 1 && x[1].in == 0);
    /* rate 0.3: floor(1.2) = 1: only the gain of 9 */
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, NULL, 30, 10, 0.3, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 1 && x[0].layer == 1 && x[0].out == 2 && x[0].in == 0);
    HM_CHECK(st.layers_changed == 1);
    /* rate 1 into room for one: the best gain alone, nothing written past it */
    x[1].layer = -7;
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, NULL, 30, 10, 1.0, x, 1, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 1 && st.exchanged == 1 && st.max_exchange == 4 && x[0].gain == 9);
    HM_CHECK(x[1].layer == -7);
}

static void test_static_and_ties(void) {
    hot_exchange x[4];
    int n = 7;
    hot_update_stats st;
    hm_error err;
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, NULL, 0, 0, 0.0, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 0 && !st.active && st.exchanged == 0 && st.hit_rate == 0);
    /* ties: one layer, hot {0, 1} both 1, cold {2, 3} both 2: lower ids first on both sides:
     * 2 -> 0, 3 -> 1; equal scores never exchange */
    const uint8_t hot[4] = {1, 1, 0, 0};
    const double s[4] = {1, 1, 2, 2}, same[4] = {1, 1, 1, 1};
    HM_REQUIRE(hot_update_plan(1, 4, hot, s, NULL, 1, 1, 1.0, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 2 && x[0].out == 0 && x[0].in == 2 && x[1].out == 1 && x[1].in == 3);
    HM_REQUIRE(hot_update_plan(1, 4, hot, same, NULL, 1, 1, 1.0, x, 4, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 0 && st.active && st.candidates == 0);
}

static void test_format_and_errors(void) {
    hot_exchange x[4];
    int n = 0;
    hot_update_stats st;
    hm_error err;
    HM_REQUIRE(hot_update_plan(2, 4, k_hot, k_score, NULL, 30, 10, 0.5, x, 4, &n, &st, &err) == HM_OK);
    char line[256];
    hot_update_format(&st, line, sizeof(line));
    HM_CHECK_MSG(!strcmp(line, "hot cache update: active 1, update_rate 0.500, hit_rate 0.7500, "
                               "hot_slots 30, cold_slots 10, candidates 3, max_exchange 2, "
                               "exchanged 2, layers_changed 2"),
                 "%s", line);
    HM_CHECK(hot_update_plan(2, 4, k_hot, k_score, NULL, 1, 1, 1.5, x, 4, &n, &st, &err) == HM_ERR_ARG &&
             strstr(err.msg, "--moe-hot-cache-update-rate 1.5"));
    HM_CHECK(hot_update_plan(2, 4, k_hot, k_score, NULL, 1, 1, NAN, x, 4, &n, &st, &err) == HM_ERR_ARG);
    HM_CHECK(hot_update_plan(2, 4, k_hot, k_score, NULL, 1, 1, -0.1, x, 4, &n, &st, &err) == HM_ERR_ARG);
}

/* One layer of 128 experts (z = sqrt(2 ln 128) = 3.115), hot 0..31 counted 4 each but expert 5
 * counted 1; the cold ones 4 each but expert 40 counted 11. 40 -> 5 gains 10, within chance
 * (3.115 sqrt(12) = 10.79): without counts exchanged, with them not. With expert 41 counted 20:
 * 41 -> 5 gains 19 > 3.115 sqrt(21) = 14.27, taken; then 40 -> (a 4) gains 7 < 3.115 sqrt(15)
 * = 12.06: the layer stops there. */
static void test_chance(void) {
    enum { NE = 128 };
    uint8_t hot[NE] = {0};
    uint64_t c[NE];
    double s[NE];
    for (int e = 0; e < NE; e++) c[e] = 4, hot[e] = e < 32;
    c[5] = 1;
    c[40] = 11;
    for (int e = 0; e < NE; e++) s[e] = (double)c[e];
    hot_exchange x[8];
    int n = -1;
    hot_update_stats st;
    hm_error err;
    HM_REQUIRE(hot_update_plan(1, NE, hot, s, NULL, 1, 1, 1.0, x, 8, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 1 && x[0].in == 40 && x[0].out == 5);
    HM_REQUIRE(hot_update_plan(1, NE, hot, s, c, 1, 1, 1.0, x, 8, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 0 && st.candidates == 0);
    c[41] = 20, s[41] = 20;
    HM_REQUIRE(hot_update_plan(1, NE, hot, s, c, 1, 1, 1.0, x, 8, &n, &st, &err) == HM_OK);
    HM_CHECK(n == 1 && x[0].in == 41 && x[0].out == 5 && x[0].gain == 19.0);
}

HM_TEST_MAIN(test_pairs, test_static_and_ties, test_format_and_errors, test_chance)
