/* forge_presets.c - the models forge can write: real shapes of released MoE models and tiny
 * test models that keep every feature of their architecture.
 *
 * DESIGN: a constant table; the CLI copies an entry and may override a few fields
 * (--n-layer, --n-expert, ...), after which forge_preset_check validates the combination.
 * Real shapes are taken from the models' config.json files (hidden_size, moe_intermediate_size,
 * num_experts, vocab_size, rope_theta, ...). Tiny presets keep head_dim 64 where the arch
 * demands it (gpt-oss) and use 256-wide rows where K-quants should be exercised without
 * llama.cpp's fallback types.
 */
#include <string.h>
#include <strings.h>

#include "forge/forge.h"

/* clang-format off */
static const forge_preset k_presets[] = {
    /* Qwen/Qwen3-30B-A3B */
    {.name = "qwen3-30b-a3b", .model_name = "Qwen3-30B-A3B", .arch = FORGE_ARCH_QWEN3MOE,
     .n_vocab = 151936, .n_embd = 2048, .n_layer = 48, .n_head = 32, .n_head_kv = 4, .head_dim = 128,
     .n_ff = 6144, .n_ff_exp = 768, .n_expert = 128, .n_expert_used = 8, .n_ctx = 40960,
     .rms_eps = 1e-6, .rope_base = 1000000.0, .special_base = 151643, .n_merges_max = 6000},
    /* mistralai/Mixtral-8x7B-Instruct-v0.1 */
    {.name = "mixtral-8x7b", .model_name = "Mixtral-8x7B-Instruct-v0.1", .arch = FORGE_ARCH_LLAMA,
     .n_vocab = 32000, .n_embd = 4096, .n_layer = 32, .n_head = 32, .n_head_kv = 8, .head_dim = 128,
     .n_ff = 14336, .n_expert = 8, .n_expert_used = 2, .n_ctx = 32768,
     .rms_eps = 1e-5, .rope_base = 1000000.0, .special_base = 0, .n_merges_max = 6000},
    /* allenai/OLMoE-1B-7B-0924 */
    {.name = "olmoe-1b-7b", .model_name = "OLMoE-1B-7B-0924", .arch = FORGE_ARCH_OLMOE,
     .n_vocab = 50304, .n_embd = 2048, .n_layer = 16, .n_head = 16, .n_head_kv = 16, .head_dim = 128,
     .n_ff = 1024, .n_expert = 64, .n_expert_used = 8, .n_ctx = 4096,
     .rms_eps = 1e-5, .rope_base = 10000.0, .special_base = 50279, .n_merges_max = 6000},
    /* openai/gpt-oss-20b */
    {.name = "gpt-oss-20b", .model_name = "gpt-oss-20b", .arch = FORGE_ARCH_GPTOSS,
     .n_vocab = 201088, .n_embd = 2880, .n_layer = 24, .n_head = 64, .n_head_kv = 8, .head_dim = 64,
     .n_ff = 2880, .n_ff_exp = 2880, .n_expert = 32, .n_expert_used = 4, .n_ctx = 131072,
     .rms_eps = 1e-5, .rope_base = 150000.0, .sliding_window = 128, .yarn_factor = 32.0,
     .yarn_orig_ctx = 4096, .special_base = 199998, .n_merges_max = 6000},
    /* openai/gpt-oss-120b */
    {.name = "gpt-oss-120b", .model_name = "gpt-oss-120b", .arch = FORGE_ARCH_GPTOSS,
     .n_vocab = 201088, .n_embd = 2880, .n_layer = 36, .n_head = 64, .n_head_kv = 8, .head_dim = 64,
     .n_ff = 2880, .n_ff_exp = 2880, .n_expert = 128, .n_expert_used = 4, .n_ctx = 131072,
     .rms_eps = 1e-5, .rope_base = 150000.0, .sliding_window = 128, .yarn_factor = 32.0,
     .yarn_orig_ctx = 4096, .special_base = 199998, .n_merges_max = 6000},
    /* Qwen/Qwen1.5-MoE-A2.7B-Chat */
    {.name = "qwen1.5-moe-a2.7b", .model_name = "Qwen1.5-MoE-A2.7B-Chat", .arch = FORGE_ARCH_QWEN2MOE,
     .n_vocab = 151936, .n_embd = 2048, .n_layer = 24, .n_head = 16, .n_head_kv = 16, .head_dim = 128,
     .n_ff = 5632, .n_ff_exp = 1408, .n_ff_shexp = 5632, .n_expert = 60, .n_expert_used = 4,
     .n_ctx = 8192, .rms_eps = 1e-6, .rope_base = 1000000.0, .special_base = 151643, .n_merges_max = 6000},
    /* Qwen/Qwen3-Next-80B-A3B-Instruct (Qwen3-Coder-Next has the same layers): 36 gated delta-net
     * layers and 12 full-attention ones (every 4th), 512 experts top-10 + a gated shared expert */
    {.name = "qwen3-next-80b-a3b", .model_name = "Qwen3-Next-80B-A3B-Instruct", .arch = FORGE_ARCH_QWEN3NEXT,
     .n_vocab = 151936, .n_embd = 2048, .n_layer = 48, .n_head = 16, .n_head_kv = 2, .head_dim = 256,
     .n_ff = 5120, .n_ff_exp = 512, .n_ff_shexp = 512, .n_expert = 512, .n_expert_used = 10,
     .n_ctx = 262144, .rms_eps = 1e-6, .rope_base = 10000000.0, .special_base = 151643, .n_merges_max = 6000,
     .n_rot = 64, .ssm_conv_kernel = 4, .ssm_n_k_heads = 16, .ssm_n_v_heads = 32, .ssm_head_k = 128,
     .ssm_head_v = 128},
    /* Qwen/Qwen3.5-35B-A3B (text model; Qwen3.6-35B-A3B has the same shapes): config.json's
     * text_config and transformers' Qwen3_5MoeTextConfig defaults: hidden 2048, 40 layers
     * (10 x (3 gated delta net + 1 gated attention)), attention 16 q / 2 kv heads of 256 with
     * rope on 64 dims (partial_rotary_factor 0.25, theta 1e7, mrope_section [11, 11, 10]
     * interleaved), delta net 16 q/k heads and 32 v heads of 128, conv kernel 4; 256 experts of
     * 512, top-8 + a gated shared expert of 512; vocab 248320 (<|endoftext|> 248044); context
     * 262144; one MTP block (mtp_num_hidden_layers 1) */
    {.name = "qwen3.5-35b-a3b", .model_name = "Qwen3.5-35B-A3B", .arch = FORGE_ARCH_QWEN35MOE,
     .n_vocab = 248320, .n_embd = 2048, .n_layer = 40, .n_head = 16, .n_head_kv = 2, .head_dim = 256,
     .n_ff = 0, .n_ff_exp = 512, .n_ff_shexp = 512, .n_expert = 256, .n_expert_used = 8,
     .n_ctx = 262144, .rms_eps = 1e-6, .rope_base = 10000000.0, .special_base = 248044, .n_merges_max = 6000,
     .n_rot = 64, .ssm_conv_kernel = 4, .ssm_n_k_heads = 16, .ssm_n_v_heads = 32, .ssm_head_k = 128,
     .ssm_head_v = 128, .rope_sections = {11, 11, 10, 0}, .n_nextn = 1},
    /* google/gemma-4-26B-A4B(-it), config.json's text_config: hidden 2816, 30 layers (5 sliding
     * of window 1024 then 1 full, x5), 16 query heads; sliding layers 8 kv heads of 256, rope
     * theta 1e4 on all of them; full layers 2 kv heads of 512 (attention_k_eq_v), proportional
     * rope theta 1e6 with partial_rotary_factor 0.25 (128 of 512); a dense GELU MLP of 2112
     * beside 128 experts of 704, top-8; vocab 262144; context 262144; softcap 30 */
    {.name = "gemma-4-26b-a4b", .model_name = "Gemma-4-26B-A4B", .arch = FORGE_ARCH_GEMMA4,
     .n_vocab = 262144, .n_embd = 2816, .n_layer = 30, .n_head = 16, .n_head_kv = 8, .head_dim = 256,
     .n_ff = 2112, .n_ff_exp = 704, .n_expert = 128, .n_expert_used = 8, .n_ctx = 262144,
     .rms_eps = 1e-6, .rope_base = 10000.0, .sliding_window = 1024, .special_base = 262144 - 64,
     .n_merges_max = 6000, .n_rot = 128, .head_dim_full = 512, .n_head_kv_full = 2, .swa_period = 6,
     .rope_base_full = 1000000.0, .softcap = 30.0},

    /* tiny test models: every feature of the arch, small dims */
    {.name = "tiny-qwen3moe", .model_name = "tiny-qwen3moe", .arch = FORGE_ARCH_QWEN3MOE, .tiny = true,
     .n_vocab = 1024, .n_embd = 256, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
     .n_ff = 512, .n_ff_exp = 128, .n_expert = 16, .n_expert_used = 4, .n_ctx = 4096,
     .rms_eps = 1e-6, .rope_base = 1000000.0, .special_base = 1024 - 32, .n_merges_max = 700},
    {.name = "tiny-mixtral", .model_name = "tiny-mixtral", .arch = FORGE_ARCH_LLAMA, .tiny = true,
     .n_vocab = 1024, .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
     .n_ff = 256, .n_expert = 8, .n_expert_used = 2, .n_ctx = 4096,
     .rms_eps = 1e-5, .rope_base = 1000000.0, .special_base = 0, .n_merges_max = 700},
    {.name = "tiny-olmoe", .model_name = "tiny-olmoe", .arch = FORGE_ARCH_OLMOE, .tiny = true,
     .n_vocab = 1024, .n_embd = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 4, .head_dim = 32,
     .n_ff = 128, .n_expert = 8, .n_expert_used = 2, .n_ctx = 4096,
     .rms_eps = 1e-5, .rope_base = 10000.0, .special_base = 1024 - 24, .n_merges_max = 700},
    {.name = "tiny-gpt-oss", .model_name = "tiny-gpt-oss", .arch = FORGE_ARCH_GPTOSS, .tiny = true,
     .n_vocab = 1024, .n_embd = 128, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
     .n_ff = 128, .n_ff_exp = 128, .n_expert = 8, .n_expert_used = 4, .n_ctx = 4096,
     .rms_eps = 1e-5, .rope_base = 150000.0, .sliding_window = 8, .yarn_factor = 32.0,
     .yarn_orig_ctx = 128, .special_base = 1024 - 40, .n_merges_max = 700},
    {.name = "tiny-qwen2moe", .model_name = "tiny-qwen2moe", .arch = FORGE_ARCH_QWEN2MOE, .tiny = true,
     .n_vocab = 1024, .n_embd = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 4, .head_dim = 32,
     .n_ff = 256, .n_ff_exp = 64, .n_ff_shexp = 256, .n_expert = 8, .n_expert_used = 4, .n_ctx = 4096,
     .rms_eps = 1e-6, .rope_base = 1000000.0, .special_base = 1024 - 8, .n_merges_max = 700},
    /* 4 layers: 0-2 gated delta net (2 key heads, 4 value heads), 3 full attention */
    {.name = "tiny-qwen3next", .model_name = "tiny-qwen3next", .arch = FORGE_ARCH_QWEN3NEXT, .tiny = true,
     .n_vocab = 1024, .n_embd = 64, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .head_dim = 32,
     .n_ff = 128, .n_ff_exp = 32, .n_ff_shexp = 64, .n_expert = 8, .n_expert_used = 4, .n_ctx = 4096,
     .rms_eps = 1e-6, .rope_base = 10000000.0, .special_base = 1024 - 32, .n_merges_max = 700,
     .n_rot = 8, .ssm_conv_kernel = 4, .ssm_n_k_heads = 2, .ssm_n_v_heads = 4, .ssm_head_k = 16,
     .ssm_head_v = 16},
    /* 4 layers: 0-2 gated delta net (2 key heads, 4 value heads: the value-head order matters),
     * 3 full attention (rope on 8 of 32 dims, sections 2/1/1 as transformers' test model), then
     * one MTP block (blk.4) */
    {.name = "tiny-qwen35moe", .model_name = "tiny-qwen35moe", .arch = FORGE_ARCH_QWEN35MOE, .tiny = true,
     .n_vocab = 1024, .n_embd = 64, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .head_dim = 32,
     .n_ff = 0, .n_ff_exp = 32, .n_ff_shexp = 64, .n_expert = 8, .n_expert_used = 4, .n_ctx = 4096,
     .rms_eps = 1e-6, .rope_base = 10000000.0, .special_base = 1024 - 32, .n_merges_max = 700,
     .n_rot = 8, .ssm_conv_kernel = 4, .ssm_n_k_heads = 2, .ssm_n_v_heads = 4, .ssm_head_k = 16,
     .ssm_head_v = 16, .rope_sections = {2, 1, 1, 0}, .n_nextn = 1},
    /* 4 layers: 0 and 2 sliding (window 4, 2 kv heads of 32), 1 and 3 full (1 kv head of 64,
     * rope on 16 of its 64 dims) */
    {.name = "tiny-gemma4moe", .model_name = "tiny-gemma4moe", .arch = FORGE_ARCH_GEMMA4, .tiny = true,
     .n_vocab = 1024, .n_embd = 128, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .head_dim = 32,
     .n_ff = 64, .n_ff_exp = 32, .n_expert = 16, .n_expert_used = 4, .n_ctx = 4096,
     .rms_eps = 1e-6, .rope_base = 10000.0, .sliding_window = 4, .special_base = 1024 - 32,
     .n_merges_max = 700, .n_rot = 16, .head_dim_full = 64, .n_head_kv_full = 1, .swa_period = 2,
     .rope_base_full = 1000000.0, .softcap = 30.0},
};
/* clang-format on */

#define N_PRESETS ((int)(sizeof(k_presets) / sizeof(k_presets[0])))

int forge_preset_count(void) { return N_PRESETS; }

const forge_preset *forge_preset_at(int i) {
    return i >= 0 && i < N_PRESETS ? &k_presets[i] : NULL;
}

const forge_preset *forge_preset_find(const char *name) {
    for (int i = 0; i < N_PRESETS; i++)
        if (!strcasecmp(k_presets[i].name, name)) return &k_presets[i];
    return NULL;
}

static const char *const k_arch_names[FORGE_ARCH_COUNT] = {
    [FORGE_ARCH_QWEN3MOE] = "qwen3moe", [FORGE_ARCH_LLAMA] = "llama",
    [FORGE_ARCH_OLMOE] = "olmoe",       [FORGE_ARCH_GPTOSS] = "gpt-oss",
    [FORGE_ARCH_QWEN2MOE] = "qwen2moe", [FORGE_ARCH_QWEN3NEXT] = "qwen3next",
    [FORGE_ARCH_QWEN35MOE] = "qwen35moe", [FORGE_ARCH_GEMMA4] = "gemma4",
};

const char *forge_arch_name(forge_arch a) {
    return (unsigned)a < FORGE_ARCH_COUNT ? k_arch_names[a] : "?";
}

static const char *const k_mix_names[FORGE_MIX_COUNT] = {"f32", "f16", "q8_0", "q4_k_m", "mxfp4"};
/* llama_ftype values: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7, MOSTLY_Q4_K_M 15, MOSTLY_MXFP4_MOE 38 */
static const uint32_t k_mix_ftype[FORGE_MIX_COUNT] = {0, 1, 7, 15, 38};

const char *forge_mix_name(forge_mix m) {
    return (unsigned)m < FORGE_MIX_COUNT ? k_mix_names[m] : "?";
}

int forge_mix_from_name(const char *name) {
    for (int i = 0; i < FORGE_MIX_COUNT; i++)
        if (!strcasecmp(k_mix_names[i], name)) return i;
    return -1;
}

uint32_t forge_mix_file_type(forge_mix m) {
    return (unsigned)m < FORGE_MIX_COUNT ? k_mix_ftype[m] : 0;
}

int64_t forge_preset_ff_exp(const forge_preset *p) {
    /* llama (mixtral) and olmoe size their experts with feed_forward_length */
    if (p->arch == FORGE_ARCH_LLAMA || p->arch == FORGE_ARCH_OLMOE) return p->n_ff;
    return p->n_ff_exp;
}

bool forge_arch_hybrid(forge_arch a) { return a == FORGE_ARCH_QWEN3NEXT || a == FORGE_ARCH_QWEN35MOE; }

bool forge_layer_recurrent(const forge_preset *p, int il) {
    return forge_arch_hybrid(p->arch) && il < p->n_layer && (il + 1) % 4 != 0;
}

int64_t forge_preset_n_rot(const forge_preset *p) { return p->n_rot > 0 ? p->n_rot : p->head_dim; }

bool forge_arch_own_layout(forge_arch a) { return forge_arch_hybrid(a) || a == FORGE_ARCH_GEMMA4; }

bool forge_arch_fused_gate_up(forge_arch a) {
    return forge_arch_hybrid(a) || a == FORGE_ARCH_GEMMA4;
}

bool forge_layer_swa(const forge_preset *p, int il) {
    return p->arch == FORGE_ARCH_GEMMA4 && p->swa_period > 0 && (il + 1) % p->swa_period != 0;
}

hm_status forge_preset_check(const forge_preset *p, hm_error *err) {
#define NEED(cond, ...) \
    do { if (!(cond)) return hm_error_set(err, HM_ERR_ARG, __VA_ARGS__); } while (0)
    NEED(p->n_layer >= 1 && p->n_layer <= 1024, "n_layer %lld out of range 1..1024", (long long)p->n_layer);
    NEED(p->n_expert >= 2 && p->n_expert <= 1024, "n_expert %lld out of range 2..1024", (long long)p->n_expert);
    NEED(p->n_expert_used >= 1 && p->n_expert_used <= p->n_expert,
         "n_expert_used %lld must be in 1..n_expert (%lld)", (long long)p->n_expert_used,
         (long long)p->n_expert);
    NEED(p->n_embd >= 32 && p->n_embd % 32 == 0, "n_embd %lld must be a positive multiple of 32",
         (long long)p->n_embd);
    NEED(p->n_head >= 1 && p->n_head_kv >= 1 && p->n_head % p->n_head_kv == 0,
         "n_head %lld must be a multiple of n_head_kv %lld", (long long)p->n_head, (long long)p->n_head_kv);
    NEED(p->head_dim >= 2 && p->head_dim % 2 == 0, "head_dim %lld must be even", (long long)p->head_dim);
    NEED(p->n_head * p->head_dim % 32 == 0, "n_head * head_dim must be a multiple of 32");
    if (p->arch == FORGE_ARCH_QWEN2MOE || p->arch == FORGE_ARCH_OLMOE)
        NEED(p->n_head * p->head_dim == p->n_embd, "%s needs n_head * head_dim == n_embd",
             forge_arch_name(p->arch));
    if (p->arch == FORGE_ARCH_GPTOSS) NEED(p->head_dim == 64, "gpt-oss needs head_dim 64");
    /* llama.cpp sizes olmoe's attn_k_norm {n_embd}: only consistent without GQA */
    if (p->arch == FORGE_ARCH_OLMOE) NEED(p->n_head_kv == p->n_head, "olmoe needs n_head_kv == n_head");
    int64_t ff = forge_preset_ff_exp(p);
    NEED(ff >= 32 && ff % 32 == 0, "expert width %lld must be a positive multiple of 32", (long long)ff);
    const int64_t rot_max = p->arch == FORGE_ARCH_GEMMA4 ? p->head_dim_full : p->head_dim;
    NEED(forge_preset_n_rot(p) >= 2 && forge_preset_n_rot(p) % 2 == 0 && forge_preset_n_rot(p) <= rot_max,
         "n_rot %lld must be even and at most head_dim", (long long)forge_preset_n_rot(p));
    if (p->arch == FORGE_ARCH_GEMMA4) {
        NEED(p->head_dim_full >= 2 && p->head_dim_full % 2 == 0 && p->n_head * p->head_dim_full % 32 == 0,
             "gemma4: global head_dim %lld must be even, n_head x it a multiple of 32", (long long)p->head_dim_full);
        NEED(p->n_head_kv_full >= 1 && p->n_head % p->n_head_kv_full == 0,
             "gemma4: n_head %lld must be a multiple of the full layers' kv heads %lld",
             (long long)p->n_head, (long long)p->n_head_kv_full);
        NEED(p->swa_period >= 1 && p->n_layer % p->swa_period == 0,
             "gemma4: the last layer must be full attention (n_layer a multiple of the period %lld;"
             " transformers forces it)", (long long)p->swa_period);
        NEED(p->sliding_window >= 1, "gemma4: sliding window must be >= 1");
        NEED(p->n_ff >= 32 && p->n_ff % 32 == 0, "gemma4: dense MLP width must be a multiple of 32");
        NEED(p->softcap >= 0.0 && p->rope_base_full > 0.0, "gemma4: bad softcap or full-layer rope base");
    }
    if (forge_arch_hybrid(p->arch)) {
        NEED(p->ssm_conv_kernel >= 1 && p->ssm_conv_kernel <= 64, "ssm conv kernel out of range 1..64");
        NEED(p->ssm_n_k_heads >= 1 && p->ssm_n_v_heads >= 1 && p->ssm_n_v_heads % p->ssm_n_k_heads == 0,
             "linear value heads %lld must be a multiple of key heads %lld", (long long)p->ssm_n_v_heads,
             (long long)p->ssm_n_k_heads);
        NEED(p->ssm_head_k >= 2 && p->ssm_head_v >= 2 && p->ssm_n_v_heads * p->ssm_head_v % 32 == 0,
             "linear head sizes: value heads x value head size must be a multiple of 32");
    }
    if (p->arch == FORGE_ARCH_QWEN35MOE) {
        int64_t sum = 0;
        for (int k = 0; k < 4; k++) sum += p->rope_sections[k] >= 0 ? p->rope_sections[k] : -1000000;
        NEED(sum > 0 && 2 * sum <= forge_preset_n_rot(p), "rope sections must be >= 0 and cover at most n_rot / 2 pairs");
        NEED(p->n_nextn >= 0 && p->n_nextn <= 4, "n_nextn %lld out of range 0..4", (long long)p->n_nextn);
    }
    if (p->arch == FORGE_ARCH_QWEN2MOE || forge_arch_hybrid(p->arch))
        NEED(p->n_ff_shexp >= 32 && p->n_ff_shexp % 32 == 0, "shared expert width must be a multiple of 32");
    NEED(p->n_vocab >= 600 && p->n_vocab <= 1000000, "n_vocab %lld out of range 600..1000000",
         (long long)p->n_vocab);
    NEED(p->special_base >= 0 && p->special_base < p->n_vocab, "special tokens do not fit the vocabulary");
    return HM_OK;
#undef NEED
}
