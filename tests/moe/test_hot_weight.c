/* test_hot_weight.c - the hot cache's weighting modes (moe/hot_weight.h) on hand-made
 * observations whose scores are derived in the comments: mode names, flat, time, pressure,
 * smooth_pressure, balanced, the layer curve, layers without hits, files without timings or
 * hot/cold split, bad configs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "moe/hot_weight.h"

static int close_to(double a, double b) { return fabs(a - b) <= 1e-12 + 1e-9 * fabs(b); }

/* Three layers of two experts. Layer 0: hits 6, 2 (8), 2 calls, 40 us (20 per call), cold 4, 0.
 * Layer 1: hits 1, 3 (4), 2 calls, 20 us (10 per call), cold 1, 3. Layer 2: no hits. */
typedef struct {
    uint64_t hits[3][2], hot[3][2], cold[3][2];
    moe_learn_layer ly[3];
    moe_learn l;
} obs;

static void make(obs *o, bool timed, bool split) {
    memset(o, 0, sizeof(*o));
    const uint64_t h[3][2] = {{6, 2}, {1, 3}, {0, 0}}, c[3][2] = {{4, 0}, {1, 3}, {0, 0}};
    const double t[3] = {40, 20, 0};
    for (int il = 0; il < 3; il++) {
        for (int e = 0; e < 2; e++) {
            o->hits[il][e] = h[il][e];
            o->cold[il][e] = c[il][e];
            o->hot[il][e] = h[il][e] - c[il][e];
        }
        o->ly[il] = (moe_learn_layer){.calls = il < 2 ? 2 : 0, .experts = o->hits[il],
                                      .has_moe_time = timed && il < 2, .moe_time_us = t[il],
                                      .has_branch_counts = split,
                                      .hot_experts = split ? o->hot[il] : NULL,
                                      .cold_experts = split ? o->cold[il] : NULL};
    }
    o->l = (moe_learn){.n_layer = 3, .n_expert = 2, .n_expert_used = 1, .layers = o->ly};
}

static void score(const obs *o, hot_weighting mode, double curve, double s[6], double w[3],
                  hot_weight_info *info) {
    hot_weight_cfg c = {.mode = mode, .layer_curve = curve};
    hm_error err;
    HM_REQUIRE(hot_weight_score(&o->l, &c, s, w, info, &err) == HM_OK);
}

static void test_names(void) {
    hot_weighting w;
    hm_error err;
    const char *names[] = {"flat", "pressure", "smooth_pressure", "time", "balanced"};
    for (int i = 0; i < 5; i++) {
        HM_CHECK(hot_weighting_parse(names[i], &w, &err) == HM_OK && (int)w == i);
        HM_CHECK(!strcmp(hot_weighting_name(w), names[i]));
    }
    HM_CHECK(hot_weighting_parse("pressur", &w, &err) == HM_ERR_ARG &&
             strstr(err.msg, "'pressur'") && strstr(err.msg, HOT_WEIGHT_NAMES));
    const hot_weight_cfg d = hot_weight_default();
    HM_CHECK(d.mode == HOT_WEIGHT_FLAT && d.layer_curve == 0.5);
}

/* flat: w = 1 on layers with hits, scores = hits; layer 2 scores 0 with weight 0. */
static void test_flat(void) {
    obs o;
    make(&o, true, true);
    double s[6], w[3];
    hot_weight_info info;
    score(&o, HOT_WEIGHT_FLAT, 0.5, s, w, &info);
    HM_CHECK(info.timed && info.split);
    HM_CHECK(w[0] == 1 && w[1] == 1 && w[2] == 0);
    const double want[6] = {6, 2, 1, 3, 0, 0};
    for (int i = 0; i < 6; i++) HM_CHECK_MSG(close_to(s[i], want[i]), "s[%d] %g", i, s[i]);
}

/* time: per call 20 and 10 us, mean 15: w = 4/3, 2/3; curve 1 -> scores 8, 8/3, 2/3, 2;
 * curve 0.5 -> sqrt(4/3), sqrt(2/3). */
static void test_time(void) {
    obs o;
    make(&o, true, false);
    double s[6], w[3];
    hot_weight_info info;
    score(&o, HOT_WEIGHT_TIME, 1.0, s, w, &info);
    HM_CHECK(info.timed && !info.split);
    HM_CHECK(close_to(w[0], 4.0 / 3) && close_to(w[1], 2.0 / 3));
    HM_CHECK(close_to(s[0], 8) && close_to(s[1], 8.0 / 3) && close_to(s[2], 2.0 / 3) &&
             close_to(s[3], 2));
    score(&o, HOT_WEIGHT_TIME, 0.5, s, w, &info);
    HM_CHECK(close_to(w[0], sqrt(4.0 / 3)) && close_to(w[1], sqrt(2.0 / 3)));
    HM_CHECK(close_to(s[0], 6 * sqrt(4.0 / 3)));
    /* curve 0: every layer with hits weighs 1 */
    score(&o, HOT_WEIGHT_TIME, 0.0, s, w, &info);
    HM_CHECK(w[0] == 1 && w[1] == 1 && close_to(s[3], 3));
}

/* pressure: miss shares 4/8 = 0.5 and 4/4 = 1, times 20 and 10 -> 10 and 10: equal weights;
 * without the split (miss 1): 20 and 10, as time. smooth_pressure with curve 1: sqrt(10) twice
 * -> 1, 1; without split sqrt(20), sqrt(10), mean (sqrt 20 + sqrt 10) / 2. */
static void test_pressure(void) {
    obs o;
    make(&o, true, true);
    double s[6], w[3];
    hot_weight_info info;
    score(&o, HOT_WEIGHT_PRESSURE, 1.0, s, w, &info);
    HM_CHECK(close_to(w[0], 1) && close_to(w[1], 1));
    score(&o, HOT_WEIGHT_SMOOTH_PRESSURE, 1.0, s, w, &info);
    HM_CHECK(close_to(w[0], 1) && close_to(w[1], 1));
    make(&o, true, false);
    score(&o, HOT_WEIGHT_PRESSURE, 1.0, s, w, &info);
    HM_CHECK(close_to(w[0], 4.0 / 3) && close_to(w[1], 2.0 / 3));
    score(&o, HOT_WEIGHT_SMOOTH_PRESSURE, 1.0, s, w, &info);
    const double m = (sqrt(20.0) + sqrt(10.0)) / 2;
    HM_CHECK(close_to(w[0], sqrt(20.0) / m) && close_to(w[1], sqrt(10.0) / m));
    HM_CHECK(w[0] / w[1] < 4.0 / 3 / (2.0 / 3)); /* damped against pressure's ratio 2 */
}

/* No timings: time and pressure fall back (time 1 everywhere; pressure = the miss share). */
static void test_untimed(void) {
    obs o;
    make(&o, false, true);
    double s[6], w[3];
    hot_weight_info info;
    score(&o, HOT_WEIGHT_TIME, 1.0, s, w, &info);
    HM_CHECK(!info.timed && info.split && w[0] == 1 && w[1] == 1);
    score(&o, HOT_WEIGHT_PRESSURE, 1.0, s, w, &info); /* 0.5 and 1, mean 0.75 */
    HM_CHECK(close_to(w[0], 2.0 / 3) && close_to(w[1], 4.0 / 3));
}

/* balanced: layer hits 8 and 4, mean 6: scale 6/8 and 6/4 -> 4.5, 1.5, 1.5, 4.5. */
static void test_balanced(void) {
    obs o;
    make(&o, true, true);
    double s[6], w[3];
    score(&o, HOT_WEIGHT_BALANCED, 0.5, s, w, NULL);
    const double want[6] = {4.5, 1.5, 1.5, 4.5, 0, 0};
    for (int i = 0; i < 6; i++) HM_CHECK_MSG(close_to(s[i], want[i]), "s[%d] %g", i, s[i]);
}

static void test_bad(void) {
    obs o;
    make(&o, true, true);
    double s[6], w[3];
    hm_error err;
    hot_weight_cfg c = {.mode = HOT_WEIGHT_FLAT, .layer_curve = -0.1};
    HM_CHECK(hot_weight_score(&o.l, &c, s, w, NULL, &err) == HM_ERR_ARG &&
             strstr(err.msg, "--moe-hot-cache-layer-curve -0.1"));
    c.layer_curve = NAN;
    HM_CHECK(hot_weight_score(&o.l, &c, s, w, NULL, &err) == HM_ERR_ARG);
    c.layer_curve = 1;
    c.mode = HOT_WEIGHT_COUNT;
    HM_CHECK(hot_weight_score(&o.l, &c, s, w, NULL, &err) == HM_ERR_ARG);
}

HM_TEST_MAIN(test_names, test_flat, test_time, test_pressure, test_untimed, test_balanced,
             test_bad)
