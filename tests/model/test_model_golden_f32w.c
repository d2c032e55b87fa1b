/* test_model_golden_f32w.c - quantised models loaded with hm_model_params.f32_weights (the
 * reference's dequantised weights, f32 activations) against the HuggingFace goldens: the forward
 * pass's own accuracy on every weight type (golden_check.h describes the checks). */
#include "golden_check.h"

static void test_golden_quantised_f32_weights(void) {
    const char *f[] = {
        "tiny-qwen3moe-q8_0.golden", "tiny-qwen3moe-q4_k_m.golden", "tiny-mixtral-q8_0.golden",
        "tiny-mixtral-q4_k_m.golden", "tiny-olmoe-q8_0.golden", "tiny-olmoe-q4_k_m.golden",
        "tiny-gpt-oss-q8_0.golden", "tiny-gpt-oss-q4_k_m.golden", "tiny-gpt-oss-mxfp4.golden",
        "tiny-qwen2moe-q8_0.golden", "tiny-qwen2moe-q4_k_m.golden"};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) check_one(f[i], true);
}

HM_TEST_MAIN(test_golden_quantised_f32_weights)
