/* test_tiered_perf.c - the live layer perf counters (runtime/tiered_perf.c, seed 001's MoE layer
 * perf) on a tiny forged qwen3moe, the test thread playing the GPU (tiered_test_util.h) and
 * also writing the GPU's clock into each layer's flags as the hand-off kernels do (the request
 * posted before ready; the wait's start and end, then stamp_seq, after the answer):
 *  - off: no counters, the JSON call refuses, the mode reads off, the GPU is not asked for
 *    times (ctl.stamps 0; 1 while the counters are on);
 *  - every layer's calls, tokens and hot/cold split are what was posted; its hot-lane, join-wait
 *    and wall times are the sums of the stamps written, the last step's included (taken when
 *    the counters are read), moe_time_us is the wall time, the cold lane the CPU's (> 0);
 *    launches = calls; no copies without a copy lane (every fetch and post-fetch counter 0);
 *  - a layer with one inconsistent stamp (answer seen before the wait began) shows no GPU times
 *    ("not measured") and its CPU time as moe_time_us; the other layers keep theirs;
 *  - requests before the counters were enabled are not counted, nor their stamps;
 *  - the file reads back through the learn schema's reader (every perf field type-checked);
 *  - the summary over the layers (hm_tiered_perf_summary) adds up to the same sums.
 */
#include <jansson.h>
#include <math.h>
#include <unistd.h>

#include "moe/learn_file.h"
#include "runtime/tiered.h"
#define TIERED_TEST_TAG "tieredperf"
#include "tiered_test_util.h"

#define HOT_NS(L, s) (2000ull + 100ull * (uint64_t)(L) + (uint64_t)(s))
#define WAIT_NS(L, s) (5000ull + 10ull * (uint64_t)(s) + (uint64_t)(L))

/* The GPU's side of request seq of layer L: the post's clock before the request is published. */
static void stamp_post(fake_gpu *g, int L, uint32_t seq, uint64_t t0) {
    g->v.flags[L].t_post[seq & 1] = t0;
}

/* ... and the wait kernel's, after the answer: t_wait, t_seen, then stamp_seq (release). */
static void stamp_wait(fake_gpu *g, int L, uint32_t seq, uint64_t t1, uint64_t t2) {
    cuda_handoff_flags *f = &g->v.flags[L];
    f->t_wait = t1;
    f->t_seen = t2;
    __atomic_store_n(&f->stamp_seq, seq, __ATOMIC_RELEASE);
}

/* Step s (its sequence number, as the engine's: consecutive steps alternate t_post's entry)
 * over every host layer: n tokens, the first slot of every token posted hot (mixed
 * layer); the stamps as above unless stamps is false (a GPU without them: an old step); bad_L:
 * that layer's stamp has the answer seen before the wait began. Counts the posted split. */
static bool step(fake_gpu *g, int s, int n, bool stamps, int bad_L, uint64_t *hot,
                 uint64_t *cold) {
    const cuda_handoff_view *v = &g->v;
    const int K = v->n_used;
    for (int j = 0; j < v->n_host; j++) {
        const int L = v->host_layers[j];
        fill_request(g, n, 0);
        for (int t = 0; t < n; t++) v->ids[t * K] = -2 - v->ids[t * K];
        *hot += (uint64_t)n;
        *cold += (uint64_t)n * (uint64_t)(K - 1);
        const uint32_t seq = (uint32_t)s; /* the engine's: one number a step */
        const uint64_t t0 = 1000000000ull * (uint64_t)s + 1000000ull * (uint64_t)L;
        if (stamps) stamp_post(g, L, seq, t0);
        publish(g, L, seq, (uint32_t)L, (uint32_t)n);
        if (wait_answer(g, L, seq, 30.0) != 1 || !answer_ok(g, L, n)) return false;
        const uint64_t t1 = t0 + HOT_NS(L, s), t2 = t1 + WAIT_NS(L, s);
        if (stamps) stamp_wait(g, L, seq, t1, L == bad_L ? t1 - 1 : t2);
    }
    return true;
}

static double num(const json_t *o, const char *k) {
    const json_t *x = json_object_get(o, k);
    return json_is_number(x) ? json_number_value(x) : -1.0;
}

/* The perf JSON of t, parsed; NULL after a failed check. */
static json_t *perf_json(hm_tiered *t) {
    hm_json j;
    hm_json_init_buf(&j, false);
    hm_error err;
    json_t *root = NULL;
    if (hm_tiered_perf_json(t, &j, "qwen3moe", NULL, &err) == HM_OK &&
        hm_json_finish(&j, &err) == HM_OK) {
        size_t len = 0;
        const char *s = hm_json_data(&j, &len);
        root = json_loadb(s, len, 0, NULL);
    } else {
        HM_CHECK_MSG(false, "perf json: %s", err.msg);
    }
    hm_json_free(&j);
    HM_CHECK(root != NULL);
    return root;
}

static void test_off(void) {
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q8_0);
    HM_REQUIRE(m);
    fake_gpu g;
    hm_tiered *t = start(m, &g, false);
    HM_REQUIRE(t);
    HM_CHECK(round_trip(&g, 0, 2));
    HM_CHECK(hm_tiered_perf_mode(t) == HM_LAYER_PERF_OFF);
    hm_json j;
    hm_json_init_buf(&j, false);
    hm_error err;
    HM_CHECK(hm_tiered_perf_json(t, &j, NULL, NULL, &err) == HM_ERR_STATE);
    hm_json_free(&j);
    hm_tiered_perf_sum sum;
    HM_CHECK(hm_tiered_perf_summary(t, &sum, &err) == HM_ERR_STATE && sum.calls == 0);
    hm_tiered_free(t);
    fake_free(&g);
    hm_model_free(m);
}

static void test_lane_times(void) {
    alarm(600);
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q8_0);
    HM_REQUIRE(m);
    fake_gpu g;
    hm_tiered *t = start(m, &g, false);
    HM_REQUIRE(t);
    const cuda_handoff_view *v = &g.v;
    const int S = 9, bad_L = v->host_layers[v->n_host - 1];
    uint64_t h0 = 0, c0 = 0, hot = 0, cold = 0;
    HM_REQUIRE(step(&g, 1, 2, true, -1, &h0, &c0)); /* before the counters: not counted */
    hm_error err;
    HM_CHECK(g.v.ctl->stamps == 0); /* off: the GPU's waits write no times */
    HM_REQUIRE(hm_tiered_perf_enable(t, &err) == HM_OK);
    HM_CHECK(hm_tiered_perf_mode(t) == HM_LAYER_PERF_FULL && g.v.ctl->stamps == 1);
    bool ok = true;
    for (int s = 2; s < 2 + S && ok; s++)
        ok = step(&g, s, 1 + s % 3, true, s == 5 ? bad_L : -1, &hot, &cold);
    HM_REQUIRE(ok);
    json_t *root = perf_json(t);
    HM_REQUIRE(root);
    const json_t *layers = json_object_get(root, "layers");
    uint64_t tok = 0;
    for (int s = 2; s < 2 + S; s++) tok += (uint64_t)(1 + s % 3);
    uint64_t hs = 0, cs = 0;
    for (int j = 0; j < v->n_host; j++) {
        const int L = v->host_layers[j];
        const json_t *ly = json_array_get(layers, (size_t)L);
        double hot_us = 0, wait_us = 0;
        for (int s = 2; s < 2 + S; s++) {
            hot_us += (double)HOT_NS(L, s) / 1000.0;
            wait_us += (double)WAIT_NS(L, s) / 1000.0;
        }
        HM_CHECK_MSG(num(ly, "calls") == S && num(ly, "tokens") == (double)tok &&
                         num(ly, "parallel_launches") == S,
                     "layer %d: calls %g tokens %g launches %g", L, num(ly, "calls"),
                     num(ly, "tokens"), num(ly, "parallel_launches"));
        hs += (uint64_t)num(ly, "hot_slots_total");
        cs += (uint64_t)num(ly, "cold_slots_total");
        const double cpu = num(ly, "parallel_cold_lane_time_us");
        HM_CHECK_MSG(cpu > 0, "layer %d: cold lane %g us", L, cpu);
        if (L == bad_L) {
            HM_CHECK_MSG(!json_object_get(ly, "parallel_wall_time_us") &&
                             !json_object_get(ly, "parallel_hot_lane_time_us") &&
                             !json_object_get(ly, "parallel_join_wait_time_us") &&
                             num(ly, "moe_time_us") == cpu,
                         "layer %d (a bad stamp): GPU times written, moe_time_us %g", L,
                         num(ly, "moe_time_us"));
            continue;
        }
        const double wall = num(ly, "parallel_wall_time_us");
        HM_CHECK_MSG(fabs(num(ly, "parallel_hot_lane_time_us") - hot_us) < 1e-6 &&
                         fabs(num(ly, "parallel_join_wait_time_us") - wait_us) < 1e-6 &&
                         fabs(wall - (hot_us + wait_us)) < 1e-6 && num(ly, "moe_time_us") == wall,
                     "layer %d: hot %g (%g), wait %g (%g), wall %g, moe %g", L,
                     num(ly, "parallel_hot_lane_time_us"), hot_us,
                     num(ly, "parallel_join_wait_time_us"), wait_us, wall, num(ly, "moe_time_us"));
        static const char *const zero[] = {"fetch_experts", "fetch_bytes", "fetch_fallbacks",
                                           "postfetch_experts", "postfetch_bytes",
                                           "postfetch_fallbacks", "parallel_fallbacks",
                                           "fetch_wait_time_us", "postfetch_wait_time_us"};
        for (size_t k = 0; k < sizeof(zero) / sizeof(zero[0]); k++)
            HM_CHECK_MSG(num(ly, zero[k]) == 0, "layer %d: %s %g without a copy lane", L,
                         zero[k], num(ly, zero[k]));
    }
    HM_CHECK_MSG(hs == hot && cs == cold, "slots: hot %llu (%llu), cold %llu (%llu)",
                 (unsigned long long)hs, (unsigned long long)hot, (unsigned long long)cs,
                 (unsigned long long)cold);
    json_decref(root);
    /* the summary: every layer's calls, the timed ones (all but the bad stamp), their sums */
    hm_tiered_perf_sum sum;
    HM_REQUIRE(hm_tiered_perf_summary(t, &sum, &err) == HM_OK);
    double hot_all = 0, wait_all = 0;
    for (int j = 0; j < v->n_host; j++)
        for (int s = 2; s < 2 + S; s++) {
            const int L = v->host_layers[j];
            if (L == bad_L && s == 5) continue;
            hot_all += (double)HOT_NS(L, s) / 1000.0;
            wait_all += (double)WAIT_NS(L, s) / 1000.0;
        }
    const uint64_t calls = (uint64_t)S * (uint64_t)v->n_host;
    HM_CHECK_MSG(sum.layers == v->n_host && sum.calls == calls && sum.timed == calls - 1 &&
                     fabs(sum.hot_us - hot_all) < 1e-6 && fabs(sum.wait_us - wait_all) < 1e-6 &&
                     fabs(sum.wall_us - hot_all - wait_all) < 1e-6 && sum.cold_us > 0 &&
                     sum.fetch_experts == 0 && sum.fallbacks == 0,
                 "summary: %d layers, %llu calls (%llu timed), hot %g (%g), wait %g (%g)",
                 sum.layers, (unsigned long long)sum.calls, (unsigned long long)sum.timed,
                 sum.hot_us, hot_all, sum.wait_us, wait_all);
    /* the file: the learn schema's reader takes every field */
    char pf[64];
    snprintf(pf, sizeof(pf), "/tmp/hotmoe_tperf_%d.json", (int)getpid());
    HM_CHECK_MSG(hm_tiered_perf_write(t, pf, "qwen3moe", NULL, &err) == HM_OK, "%s", err.msg);
    moe_learn l;
    if (moe_learn_load(pf, &l, &err) == HM_OK) {
        const moe_learn_layer *ly = &l.layers[v->host_layers[0]];
        HM_CHECK(ly->calls == (uint64_t)S && ly->has_moe_time && ly->has_branch_counts);
        moe_learn_free(&l);
    } else {
        HM_CHECK_MSG(false, "perf file: %s", err.msg);
    }
    remove(pf);
    HM_CHECK(hm_tiered_perf_disable(t) == HM_OK && g.v.ctl->stamps == 0);
    hm_tiered_free(t);
    fake_free(&g);
    hm_model_free(m);
}

/* Steps without stamps (a GPU that wrote none, or perf enabled after they were taken): the
 * layer shows its CPU time only. */
static void test_no_stamps(void) {
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q8_0);
    HM_REQUIRE(m);
    fake_gpu g;
    hm_tiered *t = start(m, &g, true);
    HM_REQUIRE(t);
    hm_error err;
    HM_REQUIRE(hm_tiered_perf_enable(t, &err) == HM_OK);
    uint64_t hot = 0, cold = 0;
    HM_REQUIRE(step(&g, 1, 3, false, -1, &hot, &cold));
    HM_REQUIRE(step(&g, 2, 3, false, -1, &hot, &cold));
    json_t *root = perf_json(t);
    HM_REQUIRE(root);
    const json_t *layers = json_object_get(root, "layers");
    for (int j = 0; j < g.v.n_host; j++) {
        const json_t *ly = json_array_get(layers, (size_t)g.v.host_layers[j]);
        HM_CHECK(num(ly, "calls") == 2 && !json_object_get(ly, "parallel_wall_time_us") &&
                 num(ly, "moe_time_us") == num(ly, "parallel_cold_lane_time_us"));
    }
    /* a layer the CPU does not serve: calls 0, no perf fields */
    const json_t *ly0 = json_array_get(layers, 0);
    HM_CHECK(num(ly0, "calls") == 0 && !json_object_get(ly0, "moe_time_us") &&
             !json_object_get(ly0, "parallel_launches"));
    json_decref(root);
    hm_tiered_free(t);
    fake_free(&g);
    hm_model_free(m);
}

HM_TEST_MAIN(test_off, test_lane_times, test_no_stamps)
