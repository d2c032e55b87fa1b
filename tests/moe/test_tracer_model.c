/* test_tracer_model.c - the tracer attached to the real forward pass (tiny-olmoe and
 * tiny-gpt-oss, f32): logits bit-identical with and without it (seed 000), its counts equal to
 * those of an independent route hook (an observer of its own, hm_context_set_observer); counts handed over in bulk
 * (moe_tracer_add_counts, as from a GPU engine) give the same tracer for a batch plus single-token
 * decodes, calls per layer = forward calls, and its cost printed: the record calls of a
 * 128-token prompt timed alone against that prompt's forward pass (informative, not asserted:
 * timings on a shared 2-core machine). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "../forge/forge_test_util.h"
#include "runtime/context.h"
#include "moe/tracer.h"

typedef struct {
    int n_layer, n_expert;
    uint64_t hits[64][64];
    uint64_t calls[64];
} hook_counts;

static void count_hook(void *user, int layer, int64_t n_tok, int n_used, const int32_t *ids,
                       const float *weights) {
    hook_counts *h = user;
    (void)weights;
    h->calls[layer]++;
    for (int64_t i = 0; i < n_tok * n_used; i++)
        if (ids[i] >= 0) h->hits[layer][ids[i]]++;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check_preset(const char *preset) {
    char tag[96], path[512];
    snprintf(tag, sizeof(tag), "tracer-model-%s", preset);
    HM_REQUIRE(ft_forge(forge_preset_find(preset), FORGE_MIX_F32, 42, tag, false, 2, path,
                        sizeof(path), NULL, 0) == HM_OK);
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(m);
    const int V = (int)hp->n_vocab, L = (int)hp->n_layer, E = (int)hp->n_expert;
    HM_REQUIRE(L <= 64 && E <= 64);
    hm_context_params cp = hm_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 2;
    hm_context *c = NULL;
    HM_REQUIRE(hm_context_init(m, &cp, &c, &err) == HM_OK);

    int32_t prompt[256];
    for (int i = 0; i < 256; i++) prompt[i] = (int32_t)((i * 37 + 11) % 900 + 3);
    const int n_prompt = 40, n_dec = 5;
    float *a = malloc(sizeof(float) * (size_t)V * (n_prompt + n_dec));
    float *b = malloc(sizeof(float) * (size_t)V * (n_prompt + n_dec));
    HM_REQUIRE(a && b);

    /* without the tracer */
    hm_context_reset(c);
    HM_REQUIRE(hm_decode(c, prompt, n_prompt, 0, a, HM_LOGITS_ALL, &err) == HM_OK);
    for (int s = 0; s < n_dec; s++)
        HM_REQUIRE(hm_decode(c, &prompt[n_prompt + s], 1, n_prompt + s,
                             a + (size_t)V * (n_prompt + s), HM_LOGITS_LAST, &err) == HM_OK);

    /* an independent observer hook, then the tracer: the same logits, the same counts */
    moe_tracer_config tc;
    moe_tracer_config_init(&tc);
    tc.stats = true;
    moe_tracer *t = NULL;
    HM_REQUIRE(moe_tracer_init(&t, &tc, L, E, (int)hp->n_expert_used, &err) == HM_OK);
    hook_counts *h = calloc(1, sizeof(*h));
    HM_REQUIRE(h);
    const moe_observer hook = {.route = count_hook, .user = h};
    for (int run = 0; run < 2; run++) {
        if (run == 0) HM_REQUIRE(hm_context_set_observer(c, &hook, &err) == HM_OK);
        else HM_REQUIRE(hm_context_set_tracer(c, t, &err) == HM_OK);
        hm_context_reset(c);
        HM_REQUIRE(hm_decode(c, prompt, n_prompt, 0, b, HM_LOGITS_ALL, &err) == HM_OK);
        for (int s = 0; s < n_dec; s++)
            HM_REQUIRE(hm_decode(c, &prompt[n_prompt + s], 1, n_prompt + s,
                                 b + (size_t)V * (n_prompt + s), HM_LOGITS_LAST, &err) == HM_OK);
        HM_CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)V * (n_prompt + n_dec)),
                     "%s: logits differ with the %s attached", preset, run ? "tracer" : "hook");
    }
    HM_REQUIRE(hm_context_set_tracer(c, NULL, &err) == HM_OK);
    /* counts handed over in bulk (as a GPU engine's device counters are) give the same tracer */
    moe_tracer *t2 = NULL;
    HM_REQUIRE(moe_tracer_init(&t2, &tc, L, E, (int)hp->n_expert_used, &err) == HM_OK);
    for (int l = 0; l < L; l++)
        moe_tracer_add_counts(t2, l, h->calls[l], h->calls[l] ? (uint64_t)(n_prompt + n_dec) : 0,
                              h->hits[l]);
    HM_CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)V * (n_prompt + n_dec)),
                 "%s: logits differ with the tracer attached", preset);
    int bad = 0;
    uint64_t total = 0;
    for (int l = 0; l < L; l++) {
        bad += moe_tracer_calls(t, l) != h->calls[l] || h->calls[l] != (uint64_t)(1 + n_dec);
        bad += moe_tracer_tokens(t, l) != (uint64_t)(n_prompt + n_dec);
        bad += moe_tracer_calls(t2, l) != h->calls[l] || moe_tracer_tokens(t2, l) != moe_tracer_tokens(t, l);
        for (int e = 0; e < E; e++) {
            bad += moe_tracer_hits(t, l, e) != h->hits[l][e];
            bad += moe_tracer_hits(t2, l, e) != h->hits[l][e];
            total += moe_tracer_hits(t, l, e);
        }
    }
    HM_CHECK_MSG(bad == 0, "%s: %d tracer counts differ from the route hook's", preset, bad);
    HM_CHECK(total == (uint64_t)L * (n_prompt + n_dec) * (uint64_t)hp->n_expert_used);
    HM_CHECK(moe_tracer_rejected(t) == 0);

    /* cost: the tracer's record calls for a 128-token prompt (one per layer, synthetic ids)
     * timed on their own, against the forward pass without the tracer; best of 3 / 5 */
    float *lg = malloc(sizeof(float) * (size_t)V);
    HM_REQUIRE(lg);
    double fwd = 1e9, rec = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        hm_context_reset(c);
        double t0 = now_s();
        HM_REQUIRE(hm_decode(c, prompt, 128, 0, lg, HM_LOGITS_LAST, &err) == HM_OK);
        double dt = now_s() - t0;
        if (dt < fwd) fwd = dt;
    }
    const int K = (int)hp->n_expert_used;
    int32_t *ids = malloc(sizeof(int32_t) * 128 * (size_t)K);
    HM_REQUIRE(ids);
    for (int i = 0; i < 128 * K; i++) ids[i] = (int32_t)((i * 7 + i / K) % E);
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        for (int it = 0; it < 100; it++)
            for (int l = 0; l < L; l++) moe_tracer_record(t, l, ids, 128, K);
        double dt = (now_s() - t0) / 100;
        if (dt < rec) rec = dt;
    }
    printf("  %-14s 128-token prompt: forward %.2f ms, tracer records %.2f us (%.3f%%)\n", preset,
           fwd * 1e3, rec * 1e6, 100.0 * rec / fwd);
    free(ids);
    free(lg);
    moe_tracer_free(t2);
    free(h);
    moe_tracer_free(t);
    free(a);
    free(b);
    hm_context_free(c);
    hm_model_free(m);
    remove(path);
}

static void test_tracer_olmoe(void) { check_preset("tiny-olmoe"); }
static void test_tracer_gptoss(void) { check_preset("tiny-gpt-oss"); }

HM_TEST_MAIN(test_tracer_olmoe, test_tracer_gptoss)
