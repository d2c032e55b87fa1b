/* test_model_golden.c - f32 models and quantised models in their native arithmetic against the
 * HuggingFace goldens (the checks and figures are described in golden_check.h). */
#include "golden_check.h"

static const char *k_quantised[] = {
    "tiny-qwen3moe-q8_0.golden", "tiny-qwen3moe-q4_k_m.golden", "tiny-mixtral-q8_0.golden",
    "tiny-mixtral-q4_k_m.golden", "tiny-olmoe-q8_0.golden", "tiny-olmoe-q4_k_m.golden",
    "tiny-gpt-oss-q8_0.golden", "tiny-gpt-oss-q4_k_m.golden", "tiny-gpt-oss-mxfp4.golden",
    "tiny-qwen2moe-q8_0.golden", "tiny-qwen2moe-q4_k_m.golden"};
#define N_QUANTISED (sizeof(k_quantised) / sizeof(k_quantised[0]))

static void test_golden_f32(void) {
    const char *f[] = {"tiny-qwen3moe-f32.golden", "tiny-mixtral-f32.golden",
                       "tiny-olmoe-f32.golden", "tiny-gpt-oss-f32.golden",
                       "tiny-qwen2moe-f32.golden"};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) check_one(f[i], false);
}

static void test_golden_quantised_native(void) {
    for (size_t i = 0; i < N_QUANTISED; i++) check_one(k_quantised[i], false);
}

HM_TEST_MAIN(test_golden_f32, test_golden_quantised_native)
