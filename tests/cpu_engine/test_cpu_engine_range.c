/* test_cpu_engine_range.c - the CPU engine's layer range (cpu_engine_params.layer_begin /
 * layer_end, cpu_engine_forward): for every tiny preset in f32 and q8_0, and every split point k
 * in 1..n_layer-1, an engine of layers [0, k) followed by one of [k, n_layer), handing the hidden
 * rows from the first to the second, gives the whole model's logits byte for byte: a 13-token
 * prompt in ubatches of 5 (all logits), then 6 tokens one per call (the one-job decode step on 2
 * threads, except qwen2moe's shared expert), after a rewind too. The range [0, n_layer) with
 * x_out hands back the rows the whole model's output norm reads. Also: the range's KV bytes, and
 * the argument errors (a bad range, logits asked of a range that stops early, no input rows,
 * cpu_engine_decode on a range). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cpu_engine/cpu_engine.h"
#include "harness.h"
#include "model/model.h"

#define N_PROMPT 13
#define N_STEP 6
#define N_UB 5
#define N_CTX 32

static const char *k_presets[] = {"tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe", "tiny-gpt-oss",
                                  "tiny-qwen2moe"};

static cpu_engine_params eparams(int l0, int l1) {
    return (cpu_engine_params){.n_ctx = N_CTX, .n_ubatch = N_UB, .n_threads = 2,
                               .type_k = HM_TYPE_F16, .type_v = HM_TYPE_F16, .layer_begin = l0,
                               .layer_end = l1};
}

static void prompt_ids(int32_t *ids, int n, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((x >> 33) % 957);
    }
}

/* The logits [N_PROMPT + N_STEP][n_vocab] of the prompt (ubatches of N_UB) then one token per
 * call, through a (whole, b NULL) or b after a (split at a's end). */
static bool run(cpu_engine *a, cpu_engine *b, const int32_t *ids, int64_t V, int64_t E,
                float *lo) {
    float rows[N_UB * 256];
    if (E > 256) return false;
    hm_error err;
    const int n_all = N_PROMPT + N_STEP;
    for (int done = 0; done < n_all;) {
        const int n = done < N_PROMPT ? (N_PROMPT - done < N_UB ? N_PROMPT - done : N_UB) : 1;
        const hm_logits_mode mode = done < N_PROMPT ? HM_LOGITS_ALL : HM_LOGITS_LAST;
        float *out = lo + (size_t)done * (size_t)V;
        hm_status st;
        if (!b) {
            st = cpu_engine_forward(a, ids + done, NULL, n, done, NULL, out, mode, &err);
        } else {
            st = cpu_engine_forward(a, ids + done, NULL, n, done, rows, NULL, HM_LOGITS_NONE,
                                    &err);
            if (st == HM_OK)
                st = cpu_engine_forward(b, NULL, rows, n, done, NULL, out, mode, &err);
        }
        if (st != HM_OK) {
            fprintf(stderr, "forward at %d: %s\n", done, err.msg);
            return false;
        }
        done += n;
    }
    return true;
}

static void check_model(const char *preset, forge_mix mix) {
    char path[512], tag[96];
    snprintf(tag, sizeof(tag), "cperange-%s-%s", preset, forge_mix_name(mix));
    HM_REQUIRE(ft_forge(forge_preset_find(preset), mix, 42, tag, false, 2, path, sizeof(path),
                        NULL, 0) == HM_OK);
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(m);
    const int nl = (int)hp->n_layer;
    const int64_t V = hp->n_vocab, E = hp->n_embd;
    const size_t sz = (size_t)(N_PROMPT + N_STEP) * (size_t)V;
    int32_t ids[N_PROMPT + N_STEP];
    prompt_ids(ids, N_PROMPT + N_STEP, 11);
    float *ref = malloc(sz * sizeof(float)), *got = malloc(sz * sizeof(float));
    HM_REQUIRE(ref && got);

    cpu_engine *whole = NULL;
    cpu_engine_params wp = eparams(0, 0);
    HM_REQUIRE(cpu_engine_init(m, &wp, &whole, &err) == HM_OK);
    int b0 = -1, b1 = -1;
    cpu_engine_layers(whole, &b0, &b1);
    HM_CHECK(b0 == 0 && b1 == nl);
    HM_CHECK(run(whole, NULL, ids, V, E, ref));

    for (int k = 1; k < nl; k++) {
        cpu_engine *a = NULL, *b = NULL;
        cpu_engine_params pa = eparams(0, k), pb = eparams(k, nl);
        HM_CHECK_MSG(cpu_engine_init(m, &pa, &a, &err) == HM_OK, "%s", err.msg);
        HM_CHECK_MSG(cpu_engine_init(m, &pb, &b, &err) == HM_OK, "%s", err.msg);
        if (!a || !b) {
            cpu_engine_free(a);
            cpu_engine_free(b);
            continue;
        }
        /* the KV cache of the range's layers only: the two halves add up to the whole */
        HM_CHECK(cpu_engine_bytes(m, &pa) < cpu_engine_bytes(m, &wp));
        HM_CHECK(cpu_engine_bytes(m, &pb) < cpu_engine_bytes(m, &wp));
        memset(got, 0, sz * sizeof(float));
        HM_CHECK(run(a, b, ids, V, E, got));
        HM_CHECK_MSG(!memcmp(ref, got, sz * sizeof(float)), "%s %s: layers [0,%d) + [%d,%d) != "
                     "the whole model", preset, forge_mix_name(mix), k, k, nl);
        /* rewound to 0 (the cache overwritten) and run again: the same bytes */
        cpu_engine_reset(a);
        cpu_engine_reset(b);
        memset(got, 0, sz * sizeof(float));
        HM_CHECK(run(a, b, ids, V, E, got));
        HM_CHECK_MSG(!memcmp(ref, got, sz * sizeof(float)), "%s %s k=%d: second run differs",
                     preset, forge_mix_name(mix), k);
        /* errors: logits of a range that stops before the last layer; no input rows;
         * cpu_engine_decode on a range */
        float rows[256];
        HM_CHECK(cpu_engine_forward(a, ids, NULL, 1, 0, rows, got, HM_LOGITS_LAST, &err) ==
                 HM_ERR_ARG);
        HM_CHECK(cpu_engine_forward(b, ids, NULL, 1, 0, NULL, got, HM_LOGITS_LAST, &err) ==
                 HM_ERR_ARG && strstr(err.msg, "hidden rows"));
        HM_CHECK(cpu_engine_decode(a, ids, 1, 0, got, HM_LOGITS_LAST, &err) == HM_ERR_STATE);
        cpu_engine_free(a);
        cpu_engine_free(b);
    }

    /* [0, n_layer) with x_out: the rows the output norm reads; the logits still come */
    {
        cpu_engine *a = NULL;
        cpu_engine_params pa = eparams(0, nl);
        HM_REQUIRE(cpu_engine_init(m, &pa, &a, &err) == HM_OK);
        float rows[N_UB * 256];
        HM_CHECK(cpu_engine_forward(a, ids, NULL, N_UB, 0, rows, got, HM_LOGITS_ALL, &err) ==
                 HM_OK);
        HM_CHECK(!memcmp(got, ref, (size_t)N_UB * (size_t)V * sizeof(float)));
        bool finite = true, nonzero = false;
        for (int64_t i = 0; i < N_UB * E; i++) {
            finite = finite && rows[i] == rows[i];
            nonzero = nonzero || rows[i] != 0.0f;
        }
        HM_CHECK(finite && nonzero);
        cpu_engine_free(a);
    }
    /* bad ranges */
    const int bad[][2] = {{-1, 1}, {1, 1}, {2, 1}, {0, nl + 1}, {nl, nl + 1}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cpu_engine *x = NULL;
        cpu_engine_params px = eparams(bad[i][0], bad[i][1]);
        HM_CHECK_MSG(cpu_engine_init(m, &px, &x, &err) == HM_ERR_ARG && !x &&
                         strstr(err.msg, "layer range"),
                     "[%d, %d)", bad[i][0], bad[i][1]);
    }
    cpu_engine_free(whole);
    free(ref);
    free(got);
    hm_model_free(m);
}

static void test_range_equals_whole(void) {
    for (size_t i = 0; i < sizeof(k_presets) / sizeof(k_presets[0]); i++) {
        check_model(k_presets[i], FORGE_MIX_F32);
        check_model(k_presets[i], FORGE_MIX_Q8_0);
    }
}

HM_TEST_MAIN(test_range_equals_whole)
