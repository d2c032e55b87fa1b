/* test_route_synth.c - synthetic routing from a routing profile (moe/route_synth.h): fitted to
 * the published Qwen3-30B-A3B figures (bench/profiles/qwen3-30b-a3b-published.json: 65 of 128
 * experts for 90 % of the selections, 45 % repeating at the next token), 20,000 generated tokens
 * measured with the routing statistics give those figures back (within 5 experts and 0.03); no
 * profile gives uniform routing (repeat near n_used / n_expert); the same seed gives the same
 * routing and another seed another; every token's experts are distinct; layers differ in which
 * experts are popular; bad shapes are refused. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "moe/route_synth.h"
#include "moe/routing_stats.h"

#define N_TOK 20000

/* Layer il's figures over N_TOK tokens of s (one sequence). */
static bool figures(route_synth *s, int il, int ne, int k, moe_routing_figures *f) {
    moe_routing_stats *rs = NULL;
    hm_error err;
    if (moe_routing_stats_init(&rs, 1, ne, k, &err) != HM_OK) return false;
    int32_t ids[64];
    route_synth_begin(s);
    bool distinct = true;
    for (int t = 0; t < N_TOK; t++) {
        route_synth_next(s, il, ids, NULL);
        for (int a = 0; a < k; a++)
            for (int b = a + 1; b < k; b++) distinct = distinct && ids[a] != ids[b];
        moe_routing_stats_record(rs, 0, 1, k, ids, NULL);
    }
    HM_CHECK_MSG(distinct, "a token with an expert twice");
    moe_routing_profile p;
    bool ok = moe_routing_stats_profile(rs, "test", &p, &err) == HM_OK;
    if (ok) *f = p.avg;
    moe_routing_profile_free(&p);
    moe_routing_stats_free(rs);
    return ok;
}

static void test_published_qwen3(void) {
    moe_routing_profile p;
    hm_error err;
    HM_REQUIRE(moe_routing_profile_load("bench/profiles/qwen3-30b-a3b-published.json", &p, &err) ==
               HM_OK);
    route_synth *s = NULL;
    HM_REQUIRE(route_synth_init(&p, 48, 128, 8, 42, &s, &err) == HM_OK);
    for (int il = 0; il < 48; il += 47) {
        moe_routing_figures f;
        HM_REQUIRE(figures(s, il, 128, 8, &f));
        printf("layer %d: z %.3f q %.3f: experts for 90%% %.0f, repeat.1 %.3f, repeat.8 %.3f, "
               "LRU 40%% %.3f\n", il, route_synth_skew(s), route_synth_reuse(s), f.experts_for[1],
               f.repeat[0], f.repeat[2], f.lru_hit[3]);
        HM_CHECK_MSG(fabs(f.experts_for[1] - 65) <= 5, "experts for 90%%: %.0f", f.experts_for[1]);
        HM_CHECK_MSG(fabs(f.repeat[0] - 0.45) <= 0.03, "repeat.1: %.3f", f.repeat[0]);
    }
    route_synth_free(s);
    moe_routing_profile_free(&p);
}

static void test_uniform(void) {
    route_synth *s = NULL;
    hm_error err;
    HM_REQUIRE(route_synth_init(NULL, 2, 64, 4, 7, &s, &err) == HM_OK);
    HM_CHECK(route_synth_skew(s) == 0 && route_synth_reuse(s) == 0);
    moe_routing_figures f;
    HM_REQUIRE(figures(s, 1, 64, 4, &f));
    HM_CHECK_MSG(fabs(f.repeat[0] - 4.0 / 64) <= 0.02 && fabs(f.top_share[1] - 0.25) <= 0.03,
                 "repeat.1 %.3f, top 25%% share %.3f", f.repeat[0], f.top_share[1]);
    route_synth_free(s);
    /* the shipped uniform profile (every figure null) draws the same way */
    moe_routing_profile p;
    HM_REQUIRE(moe_routing_profile_load("bench/profiles/uniform-128x8.json", &p, &err) == HM_OK);
    HM_REQUIRE(route_synth_init(&p, 48, 128, 8, 7, &s, &err) == HM_OK);
    HM_CHECK(route_synth_skew(s) == 0 && route_synth_reuse(s) == 0);
    route_synth_free(s);
    moe_routing_profile_free(&p);
}

static void test_determinism(void) {
    route_synth *a = NULL, *b = NULL, *c = NULL;
    hm_error err;
    moe_routing_profile p;
    HM_REQUIRE(moe_routing_profile_load("bench/profiles/qwen3-30b-a3b-published.json", &p, &err) ==
               HM_OK);
    HM_REQUIRE(route_synth_init(&p, 3, 128, 8, 1, &a, &err) == HM_OK);
    HM_REQUIRE(route_synth_init(&p, 3, 128, 8, 1, &b, &err) == HM_OK);
    HM_REQUIRE(route_synth_init(&p, 3, 128, 8, 2, &c, &err) == HM_OK);
    int same_ab = 1, same_ac = 1, same_layers = 1;
    for (int t = 0; t < 100; t++)
        for (int il = 0; il < 3; il++) {
            int32_t x[8], y[8], z[8];
            route_synth_next(a, il, x, NULL);
            route_synth_next(b, il, y, NULL);
            route_synth_next(c, il, z, NULL);
            same_ab &= !memcmp(x, y, sizeof(x));
            same_ac &= !memcmp(x, z, sizeof(x));
        }
    /* the most frequent expert of layers 0 and 1 over 2,000 tokens */
    int top[2] = {0, 0};
    for (int il = 0; il < 2; il++) {
        int cnt[128] = {0};
        int32_t x[8];
        for (int t = 0; t < 2000; t++) {
            route_synth_next(a, il, x, NULL);
            for (int k = 0; k < 8; k++) cnt[x[k]]++;
        }
        for (int e = 1; e < 128; e++)
            if (cnt[e] > cnt[top[il]]) top[il] = e;
    }
    same_layers = top[0] == top[1];
    HM_CHECK(same_ab && !same_ac && !same_layers);
    route_synth_free(a);
    route_synth_free(b);
    route_synth_free(c);
    moe_routing_profile_free(&p);
}

static void test_bad(void) {
    route_synth *s = NULL;
    hm_error err;
    HM_CHECK(route_synth_init(NULL, 0, 8, 2, 1, &s, &err) == HM_ERR_ARG && !s);
    HM_CHECK(route_synth_init(NULL, 2, 8, 9, 1, &s, &err) == HM_ERR_ARG && !s);
}

HM_TEST_MAIN(test_published_qwen3, test_uniform, test_determinism, test_bad)
