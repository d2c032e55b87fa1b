/* test_cuda_lane.c - the GPU engine as a lane of a CPU context's expert executor
 * (runtime/gpu_lane.h, cuda_engine_experts).
 *
 * Host checks (any machine): without a GPU engine the lane cannot be installed usefully, and
 * cuda_engine_experts of a build without CUDA says so. With a GPU, for every tiny preset x
 * f32/q8_0/q4_k_m (and mxfp4 for gpt-oss): the odd experts of every layer on the GPU lane give
 * logits byte-identical to the all-CPU context, for a 21-token prompt in ubatches of 8 and for
 * 8 one-token steps; a permuted expert->slot map on the engine changes nothing either;
 * arguments out of range are refused. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_engine.h"
#include "cuda_test_util.h"
#include "harness.h"
#include "model/residency.h"
#include "quant/qtypes.h"
#include "runtime/context.h"
#include "runtime/gpu_lane.h"

#define N_PROMPT 21
#define N_DEC 8

/* Logits of the prompt (all positions) then N_DEC one-token steps (last position each). */
static bool run(hm_context *c, const int32_t *ids, int64_t V, float *out) {
    hm_error err;
    hm_context_reset(c);
    if (hm_decode(c, ids, N_PROMPT, 0, out, HM_LOGITS_ALL, &err) != HM_OK) {
        fprintf(stderr, "prompt: %s\n", err.msg);
        return false;
    }
    for (int i = 0; i < N_DEC; i++)
        if (hm_decode(c, ids + N_PROMPT + i, 1, N_PROMPT + i, out + (N_PROMPT + i) * V,
                      HM_LOGITS_LAST, &err) != HM_OK) {
            fprintf(stderr, "step %d: %s\n", i, err.msg);
            return false;
        }
    return true;
}

static void check_model(const char *preset, forge_mix mix) {
    char path[512];
    HM_REQUIRE(ft_forged("cudalane", preset, mix, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(m);
    const int64_t V = hp->n_vocab, L = hp->n_layer, NE = hp->n_expert;
    int32_t ids[N_PROMPT + N_DEC];
    for (int i = 0; i < N_PROMPT + N_DEC; i++) ids[i] = 3 + (i * 37 + 11) % 900;
    hm_context_params cp = hm_context_default_params();
    cp.n_ctx = 64;
    cp.n_ubatch = 8;
    cp.n_threads = 2;
    hm_context *c = NULL;
    HM_REQUIRE(hm_context_init(m, &cp, &c, &err) == HM_OK);
    const size_t sz = (size_t)(N_PROMPT + N_DEC) * (size_t)V;
    float *a = malloc(sz * 4), *b = malloc(sz * 4);
    HM_REQUIRE(a && b && run(c, ids, V, a));

    for (int permuted = 0; permuted < 2; permuted++) {
        hm_residency res;
        HM_REQUIRE(hm_residency_init_device(&res, (int)L, (int)NE, &err) == HM_OK);
        if (permuted)
            for (int il = 0; il < L; il++)
                for (int e = 0; e < NE; e++)
                    res.slot[hm_residency_at(&res, il, e)] = (int32_t)((e * 7 + 3) % NE);
        cuda_engine_params gp = {.device = 0, .n_ctx = 64, .n_ubatch = 8,
                                 .type_k = HM_TYPE_F16, .type_v = HM_TYPE_F16, .res = &res};
        cuda_engine *g = NULL;
        HM_CHECK_MSG(cuda_engine_init(m, &gp, &g, &err) == HM_OK, "%s", err.msg);
        if (!g) break;
        moe_exec *x = hm_context_exec(c);
        HM_REQUIRE(moe_exec_set_lane_fn(x, 1, runtime_gpu_lane, g, &err) == HM_OK);
        for (int il = 0; il < L; il++)
            for (int e = 1; e < NE; e += 2) HM_REQUIRE(moe_exec_set_lane(x, il, e, 1, &err) == HM_OK);
        const uint64_t s0 = cuda_engine_host_syncs(g);
        HM_CHECK(run(c, ids, V, b));
        HM_CHECK_MSG(!memcmp(a, b, sz * 4), "%s %s%s: odd experts on the GPU lane changed the "
                     "logits", preset, forge_mix_name(mix), permuted ? " (permuted slots)" : "");
        HM_CHECK(cuda_engine_host_syncs(g) > s0); /* the lane ran */
        /* arguments out of range are refused, nothing computed */
        float xr[8] = {0}, yr[8];
        int32_t one[8] = {1, -1, -1, -1, -1, -1, -1, -1};
        HM_CHECK(cuda_engine_experts(g, (int)L, 1, xr, one, yr, &err) == HM_ERR_ARG);
        HM_CHECK(cuda_engine_experts(g, 0, 0, xr, one, yr, &err) == HM_ERR_ARG);
        HM_REQUIRE(moe_exec_set_lane_fn(x, 1, NULL, NULL, &err) == HM_OK);
        cuda_engine_free(g);
        hm_residency_free(&res);
    }
    HM_CHECK(run(c, ids, V, b) && !memcmp(a, b, sz * 4));
    free(a), free(b);
    hm_context_free(c);
    hm_model_free(m);
}

static void test_gpu_lane(void) {
    /* host: the lane's entry without a device or CUDA refuses cleanly */
    if (!tu_have_gpu()) {
        if (!cuda_compiled()) {
            hm_error err;
            float x[4] = {0}, y[4];
            int32_t id = 0;
            HM_CHECK(cuda_engine_experts(NULL, 0, 1, x, &id, y, &err) == HM_ERR_UNSUPPORTED);
        }
        return;
    }
    const char *presets[] = {"tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe", "tiny-gpt-oss",
                             "tiny-qwen2moe"};
    const forge_mix mixes[] = {FORGE_MIX_F32, FORGE_MIX_Q8_0, FORGE_MIX_Q4_K_M, FORGE_MIX_MXFP4};
    for (int p = 0; p < 5; p++)
        for (int k = 0; k < 4; k++) {
            if (mixes[k] == FORGE_MIX_MXFP4 && strcmp(presets[p], "tiny-gpt-oss")) continue;
            check_model(presets[p], mixes[k]);
        }
}

TU_TEST_MAIN(test_gpu_lane)
