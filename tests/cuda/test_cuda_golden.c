/* test_cuda_golden.c - the whole model on the GPU against the HuggingFace goldens of the CPU
 * issue (tests/model/golden): every tiny architecture in f32, q8_0, q4_k_m (and mxfp4), with
 * -ngl 99 --gpu-strict, checked with golden_check.h's GPU bars (top-1 >= 99%, NLL within 0.1%,
 * f32 logits within 5e-3 x std). Without a GPU it checks that a strict GPU context on a golden
 * model fails with a message naming the reason (and fails itself under HOTMOE_EXPECT_GPU=1). */
#include "../model/golden_check.h"
#include "cuda_test_util.h"

static const char *k_files[] = {
    "tiny-qwen3moe-f32.golden",   "tiny-mixtral-f32.golden",     "tiny-olmoe-f32.golden",
    "tiny-gpt-oss-f32.golden",    "tiny-qwen2moe-f32.golden",    "tiny-qwen3moe-q8_0.golden",
    "tiny-qwen3moe-q4_k_m.golden", "tiny-mixtral-q8_0.golden",   "tiny-mixtral-q4_k_m.golden",
    "tiny-olmoe-q8_0.golden",     "tiny-olmoe-q4_k_m.golden",    "tiny-gpt-oss-q8_0.golden",
    "tiny-gpt-oss-q4_k_m.golden", "tiny-gpt-oss-mxfp4.golden",   "tiny-qwen2moe-q8_0.golden",
    "tiny-qwen2moe-q4_k_m.golden"};

static void test_golden_gpu(void) {
    if (tu_have_gpu()) {
        for (size_t i = 0; i < sizeof(k_files) / sizeof(k_files[0]); i++)
            check_one_on(k_files[i], false, true);
        return;
    }
    /* no GPU: strict mode refuses (never a silent CPU run), and says why */
    char gg[512];
    HM_REQUIRE(ft_forge(forge_preset_find("tiny-olmoe"), FORGE_MIX_Q8_0, 42, "golden-gpu-none",
                        false, 2, gg, sizeof(gg), NULL, 0) == HM_OK);
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(gg, NULL, &m, &err) == HM_OK);
    hm_context_params cp = hm_context_default_params();
    cp.n_ctx = 64;
    cp.n_gpu_layers = 99;
    cp.gpu_strict = true;
    hm_context *c = NULL;
    HM_CHECK(hm_context_init(m, &cp, &c, &err) != HM_OK);
    HM_CHECK(c == NULL);
    HM_CHECK_MSG(strstr(err.msg, "--gpu-strict") != NULL, "message: %s", err.msg);
    hm_model_free(m);
}

TU_TEST_MAIN(test_golden_gpu)
