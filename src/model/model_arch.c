/* model_arch.c - one descriptor per supported architecture.
 *
 * DESIGN: the facts come from llama.cpp's src/models/<arch>.cpp graphs and llama-arch.cpp
 * (tensor names), and from HF transformers' modeling files for the same models: which norms,
 * biases, rope ordering, gating and activation each uses. Adding an architecture that fits these
 * flags is one row here; nothing else in model/ is per-architecture.
 */
#include <string.h>

#include "model/model_internal.h"

static const hm_arch_desc k_archs[HM_ARCH_COUNT] = {
    [HM_ARCH_QWEN3MOE] = {.arch = HM_ARCH_QWEN3MOE, .name = "qwen3moe", .qk_norm = HM_QKNORM_HEAD,
                          .rope = HM_ROPE_NEOX, .gating = HM_GATING_SOFTMAX_TOPK_NORM,
                          .swiglu = HM_SWIGLU_SILU, .ff_exp_key = true},
    [HM_ARCH_LLAMA] = {.arch = HM_ARCH_LLAMA, .name = "llama", .qk_norm = HM_QKNORM_NONE,
                       .rope = HM_ROPE_NORM, .gating = HM_GATING_SOFTMAX_TOPK_NORM,
                       .swiglu = HM_SWIGLU_SILU},
    [HM_ARCH_OLMOE] = {.arch = HM_ARCH_OLMOE, .name = "olmoe", .qk_norm = HM_QKNORM_FULL,
                       .rope = HM_ROPE_NEOX, .gating = HM_GATING_SOFTMAX_TOPK,
                       .swiglu = HM_SWIGLU_SILU},
    [HM_ARCH_GPTOSS] = {.arch = HM_ARCH_GPTOSS, .name = "gpt-oss", .qk_norm = HM_QKNORM_NONE,
                        .bias_qkv = true, .bias_o = true, .sinks = true, .swa_period = 2,
                        .rope = HM_ROPE_NEOX, .rope_yarn = true, .yarn_truncate = false,
                        .post_attn_norm_name = true,
                        .gating = HM_GATING_TOPK_SOFTMAX, .router_bias = true,
                        .expert_bias = true, .swiglu = HM_SWIGLU_OAI, .ff_exp_key = true},
    [HM_ARCH_QWEN2MOE] = {.arch = HM_ARCH_QWEN2MOE, .name = "qwen2moe", .qk_norm = HM_QKNORM_NONE,
                          .bias_qkv = true, .rope = HM_ROPE_NEOX,
                          .gating = HM_GATING_SOFTMAX_TOPK, .shared_expert = true,
                          .swiglu = HM_SWIGLU_SILU, .ff_exp_key = true},
    /* Qwen3-Next: llama.cpp src/models/qwen3next.cpp, transformers modeling_qwen3_next.py; the
     * zero-centred norms' 1 is folded into the GGUF weights by the converter */
    [HM_ARCH_QWEN3NEXT] = {.arch = HM_ARCH_QWEN3NEXT, .name = "qwen3next",
                           .qk_norm = HM_QKNORM_HEAD, .rope = HM_ROPE_NEOX,
                           .post_attn_norm_name = true, .gating = HM_GATING_SOFTMAX_TOPK_NORM,
                           .shared_expert = true, .swiglu = HM_SWIGLU_SILU, .ff_exp_key = true,
                           .hybrid = true, .attn_gate = true, .fused_gate_up = true},
    /* Qwen3.5-MoE: llama.cpp src/models/qwen35moe.cpp and convert_hf_to_gguf's
     * Qwen3_5MoeTextModel, transformers modeling_qwen3_5_moe.py; qwen3next's layers with
     * separate b/a projections, value heads in tiled order and the multi-section rope, which
     * for text (every section at the token's position) is NEOX's rope on the first n_rot dims
     * (ggml's imrope rotates the pairs (i, i + n_rot/2) as NEOX does, transformers' interleaved
     * mrope recomposes equal frequencies) */
    [HM_ARCH_QWEN35MOE] = {.arch = HM_ARCH_QWEN35MOE, .name = "qwen35moe",
                           .qk_norm = HM_QKNORM_HEAD, .rope = HM_ROPE_NEOX,
                           .post_attn_norm_name = true, .gating = HM_GATING_SOFTMAX_TOPK_NORM,
                           .shared_expert = true, .swiglu = HM_SWIGLU_SILU, .ff_exp_key = true,
                           .hybrid = true, .attn_gate = true, .ssm_ab_split = true,
                           .ssm_v_tiled = true, .rope_sections = true, .fused_gate_up = true},
    /* Gemma 4 (the MoE model, e.g. 26B-A4B): llama.cpp src/models/gemma4.cpp and
     * convert_hf_to_gguf's Gemma4Model, transformers modeling_gemma4.py (docs/GEMMA4.md). The
     * layer kinds come from sliding_window_pattern, not swa_period; norms are stored as the model
     * multiplies by them (no 1 + w) */
    [HM_ARCH_GEMMA4] = {.arch = HM_ARCH_GEMMA4, .name = "gemma4", .qk_norm = HM_QKNORM_HEAD,
                        .rope = HM_ROPE_NEOX, .gating = HM_GATING_SOFTMAX_TOPK_NORM,
                        .swiglu = HM_SWIGLU_GELU, .ff_exp_key = true, .gemma4 = true,
                        .fused_gate_up = true},
};

const hm_arch_desc *hm_arch_find(const char *name, size_t len) {
    for (int i = 0; i < HM_ARCH_COUNT; i++)
        if (strlen(k_archs[i].name) == len && !memcmp(k_archs[i].name, name, len))
            return &k_archs[i];
    return NULL;
}

const hm_arch_desc *hm_arch_get(hm_arch arch) {
    return (unsigned)arch < HM_ARCH_COUNT ? &k_archs[arch] : NULL;
}

const char *hm_arch_supported_list(void) {
    return "qwen3moe, llama, olmoe, gpt-oss, qwen2moe, qwen3next, qwen35moe, gemma4";
}

cpu_rope_params hm_model_rope_params(const hm_model *m) {
    const hm_hparams *hp = &m->hp;
    cpu_rope_params rp = cpu_rope_default(m->desc->rope == HM_ROPE_NEOX ? CPU_ROPE_NEOX
                                                                        : CPU_ROPE_NORM,
                                          (int)hp->n_rot, hp->rope_base);
    rp.freq_scale = hp->rope_freq_scale;
    rp.ext_factor = hp->yarn_ext_factor;
    rp.attn_factor = hp->yarn_attn_factor;
    rp.n_ctx_orig = (int)hp->rope_orig_ctx;
    rp.beta_fast = hp->yarn_beta_fast;
    rp.beta_slow = hp->yarn_beta_slow;
    rp.yarn_truncate = hp->yarn_truncate;
    rp.freq_factors = m->rope_freqs.data; /* gemma4's; NULL elsewhere */
    return rp;
}

cpu_rope_params hm_model_rope_params_swa(const hm_model *m) {
    if (!m->desc->gemma4) return hm_model_rope_params(m);
    return cpu_rope_default(CPU_ROPE_NEOX, (int)m->hp.n_rot_swa, m->hp.rope_base_swa);
}

void hm_model_layer_kv(const hm_model *m, int il, int64_t *n_head_kv, int64_t *head_dim) {
    const bool swa = m->desc->gemma4 && m->layers[il].swa;
    *n_head_kv = swa ? m->hp.n_head_kv_swa : m->hp.n_head_kv;
    *head_dim = swa ? m->hp.head_dim_swa : m->hp.head_dim_k;
}
