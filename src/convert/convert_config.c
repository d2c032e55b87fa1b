/* convert_config.c - a checkpoint's config.json as a forge_preset: the architecture (from
 * "architectures" or "model_type") and the hyper-parameters llama.cpp's keys are made from.
 *
 * DESIGN: one table maps the transformers classes to forge's architectures; the fields are read
 * by name with the defaults transformers' config classes use (head_dim = hidden/heads,
 * num_key_value_heads = heads, rope_theta 10000). transformers 5 writes some fields under other
 * names, read as well: num_local_experts for num_experts (qwen3_moe, olmoe, qwen2_moe), and the
 * rope_parameters object ({rope_theta, rope_type, factor, original_max_position_embeddings})
 * for rope_theta and rope_scaling; the older name wins when both are present. The hybrids
 * (Qwen3NextForCausalLM, Qwen3_5MoeForCausalLM) add the linear_* sizes, partial_rotary_factor
 * (n_rot = int(head_dim x it), default 0.25), qwen35moe's mrope_section (default [11, 11, 10])
 * and mtp_num_hidden_layers; Qwen3_5MoeForConditionalGeneration's fields are read from its
 * text_config. Layer patterns other than full attention every 4th layer are refused. gemma4
 * (Gemma4ForCausalLM; Gemma4ForConditionalGeneration's text_config) adds the full layers' own
 * sizes (global_head_dim, num_global_key_value_heads), top_k_experts, the sliding/full pattern
 * from layer_types (swa_period: sliding layers then one full, repeated), the two rope
 * bases and the partial rotary factor from rope_parameters' full_attention / sliding_attention,
 * final_logit_softcapping; the variants hotmoe does not load (a full layer's own V, shared KV
 * layers, per-layer inputs, no MoE block) are refused by field. Every
 * missing or mistyped field is reported as "DIR/config.json: FIELD: problem". Values kept as
 * doubles (epsilons, rope bases) are rounded to f32 only where the GGUF key is written, as
 * convert_hf_to_gguf does.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "convert/convert_internal.h"

static const struct {
    const char *cls, *model_type;
    forge_arch arch;
} k_archs[] = {
    {"Qwen3MoeForCausalLM", "qwen3_moe", FORGE_ARCH_QWEN3MOE},
    {"MixtralForCausalLM", "mixtral", FORGE_ARCH_LLAMA},
    {"OlmoeForCausalLM", "olmoe", FORGE_ARCH_OLMOE},
    {"Qwen2MoeForCausalLM", "qwen2_moe", FORGE_ARCH_QWEN2MOE},
    {"GptOssForCausalLM", "gpt_oss", FORGE_ARCH_GPTOSS},
    {"Qwen3NextForCausalLM", "qwen3_next", FORGE_ARCH_QWEN3NEXT},
    {"Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", FORGE_ARCH_QWEN35MOE},
    /* the published Qwen3.5-MoE checkpoints: the text model's fields under text_config */
    {"Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", FORGE_ARCH_QWEN35MOE},
    {"Gemma4ForCausalLM", "gemma4_text", FORGE_ARCH_GEMMA4},
    /* the published Gemma 4 checkpoints: the text model's fields under text_config */
    {"Gemma4ForConditionalGeneration", "gemma4", FORGE_ARCH_GEMMA4},
};
#define N_ARCHS (sizeof(k_archs) / sizeof(k_archs[0]))

const char *convert_supported_archs(void) {
    return "Qwen3MoeForCausalLM, MixtralForCausalLM, OlmoeForCausalLM, Qwen2MoeForCausalLM, "
           "GptOssForCausalLM, Qwen3NextForCausalLM, Qwen3_5MoeForCausalLM, "
           "Qwen3_5MoeForConditionalGeneration, Gemma4ForCausalLM, Gemma4ForConditionalGeneration";
}

typedef struct {
    const char *path;
    json_t *root;
    hm_error *err;
} cfg;

static hm_status get_int(const cfg *c, const char *key, bool required, int64_t dflt, int64_t *out) {
    json_t *v = json_object_get(c->root, key);
    if (!v || json_is_null(v)) {
        if (required)
            return hm_error_set(c->err, HM_ERR_NOT_FOUND, "%s: %s: missing", c->path, key);
        *out = dflt;
        return HM_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return hm_error_set(c->err, HM_ERR_FORMAT, "%s: %s: must be a non-negative integer",
                            c->path, key);
    *out = (int64_t)json_integer_value(v);
    return HM_OK;
}

static hm_status get_num(const cfg *c, const char *key, bool required, double dflt, double *out) {
    json_t *v = json_object_get(c->root, key);
    if (!v || json_is_null(v)) {
        if (required)
            return hm_error_set(c->err, HM_ERR_NOT_FOUND, "%s: %s: missing", c->path, key);
        *out = dflt;
        return HM_OK;
    }
    if (!json_is_number(v))
        return hm_error_set(c->err, HM_ERR_FORMAT, "%s: %s: must be a number", c->path, key);
    *out = json_number_value(v);
    return HM_OK;
}

/* key, or else alt (transformers 5's name); a missing pair is reported under key. */
static hm_status get_int_alt(const cfg *c, const char *key, const char *alt, int64_t *out) {
    json_t *v = json_object_get(c->root, key);
    if ((!v || json_is_null(v)) && json_object_get(c->root, alt)) key = alt;
    return get_int(c, key, true, 0, out);
}

/* the rope_parameters object of transformers 5, or NULL */
static json_t *rope_parameters(const cfg *c) {
    json_t *rp = json_object_get(c->root, "rope_parameters");
    return json_is_object(rp) ? rp : NULL;
}

static hm_status find_arch(const cfg *c, forge_arch *a) {
    json_t *archs = json_object_get(c->root, "architectures"),
           *mt = json_object_get(c->root, "model_type");
    const char *cls = json_is_array(archs) && json_is_string(json_array_get(archs, 0))
                          ? json_string_value(json_array_get(archs, 0))
                          : NULL;
    const char *type = json_is_string(mt) ? json_string_value(mt) : NULL;
    for (size_t i = 0; i < N_ARCHS; i++)
        if ((cls && !strcmp(cls, k_archs[i].cls)) ||
            (!cls && type && !strcmp(type, k_archs[i].model_type))) {
            *a = k_archs[i].arch;
            return HM_OK;
        }
    if (!cls && !type)
        return hm_error_set(c->err, HM_ERR_FORMAT,
                            "%s: architectures: missing (and no model_type); supported: %s",
                            c->path, convert_supported_archs());
    return hm_error_set(c->err, HM_ERR_UNSUPPORTED,
                        "%s: unsupported architecture %s; supported: %s", c->path, cls ? cls : type,
                        convert_supported_archs());
}

/* the hybrids' fields: the gated delta net's sizes, the partial rope, qwen35moe's rope sections
 * and MTP blocks; a layer pattern other than full attention every 4th layer is refused */
static hm_status read_hybrid(const cfg *c, forge_preset *p) {
    hm_status st = HM_OK;
    static const char *const keys[5] = {"linear_conv_kernel_dim", "linear_num_key_heads",
                                        "linear_num_value_heads", "linear_key_head_dim",
                                        "linear_value_head_dim"};
    int64_t *dst[5] = {&p->ssm_conv_kernel, &p->ssm_n_k_heads, &p->ssm_n_v_heads, &p->ssm_head_k,
                       &p->ssm_head_v};
    for (int k = 0; k < 5 && st == HM_OK; k++) st = get_int(c, keys[k], true, 0, dst[k]);
    int64_t fai = 4;
    if (st == HM_OK) st = get_int(c, "full_attention_interval", false, 4, &fai);
    if (st == HM_OK && fai != 4)
        return hm_error_set(c->err, HM_ERR_UNSUPPORTED,
                            "%s: full_attention_interval: %lld unsupported (llama.cpp's layout: 4)",
                            c->path, (long long)fai);
    json_t *lt = json_object_get(c->root, "layer_types");
    for (size_t i = 0; st == HM_OK && json_is_array(lt) && i < json_array_size(lt); i++) {
        const char *k = json_string_value(json_array_get(lt, i));
        const char *want = (i + 1) % 4 ? "linear_attention" : "full_attention";
        if (!k || strcmp(k, want))
            return hm_error_set(c->err, HM_ERR_UNSUPPORTED,
                                "%s: layer_types[%zu]: %s unsupported (llama.cpp's layout: %s)",
                                c->path, i, k ? k : "not a string", want);
    }
    json_t *mlp_only = json_object_get(c->root, "mlp_only_layers");
    if (st == HM_OK && json_is_array(mlp_only) && json_array_size(mlp_only) > 0)
        return hm_error_set(c->err, HM_ERR_UNSUPPORTED,
                            "%s: mlp_only_layers: dense layers unsupported", c->path);
    /* rope: partial_rotary_factor and mrope_section at the top or in rope_parameters
     * (transformers 5) / rope_scaling; n_rot = int(head_dim x factor), convert_hf_to_gguf's */
    json_t *rp = rope_parameters(c), *rs = json_object_get(c->root, "rope_scaling");
    double prf = 0.25;
    cfg sub = {c->path, rp, c->err};
    if (st == HM_OK) {
        if (json_object_get(c->root, "partial_rotary_factor") || !rp)
            st = get_num(c, "partial_rotary_factor", false, 0.25, &prf);
        else
            st = get_num(&sub, "partial_rotary_factor", false, 0.25, &prf);
    }
    p->n_rot = (int64_t)((double)p->head_dim * prf);
    if (st != HM_OK || p->arch != FORGE_ARCH_QWEN35MOE) return st;
    json_t *ms = rp ? json_object_get(rp, "mrope_section") : NULL;
    if (!ms && json_is_object(rs)) ms = json_object_get(rs, "mrope_section");
    const int64_t dflt[3] = {11, 11, 10}; /* _Qwen35MRopeMixin's default */
    if (ms && (!json_is_array(ms) || json_array_size(ms) < 1 || json_array_size(ms) > 4))
        return hm_error_set(c->err, HM_ERR_FORMAT,
                            "%s: mrope_section: must be an array of 1..4 integers", c->path);
    for (int k = 0; k < 4; k++) {
        json_t *v = ms ? json_array_get(ms, (size_t)k) : NULL;
        if (ms && v && (!json_is_integer(v) || json_integer_value(v) < 0))
            return hm_error_set(c->err, HM_ERR_FORMAT,
                                "%s: mrope_section[%d]: must be a non-negative integer", c->path,
                                k);
        p->rope_sections[k] = ms ? (v ? (int64_t)json_integer_value(v) : 0) : k < 3 ? dflt[k] : 0;
    }
    return get_int(c, "mtp_num_hidden_layers", false, 0, &p->n_nextn);
}

/* a boolean field with its default; a non-boolean is an error */
static hm_status get_bool(const cfg *c, const char *key, bool dflt, bool *out) {
    json_t *v = json_object_get(c->root, key);
    *out = dflt;
    if (!v || json_is_null(v)) return HM_OK;
    if (!json_is_boolean(v))
        return hm_error_set(c->err, HM_ERR_FORMAT, "%s: %s: must be a boolean", c->path, key);
    *out = json_is_true(v);
    return HM_OK;
}

/* gemma4's fields beyond the common ones (Gemma4TextConfig's names) */
static hm_status read_gemma4(const cfg *c, forge_preset *p) {
    hm_status st = get_int(c, "num_experts", true, 0, &p->n_expert);
    if (st == HM_OK) st = get_int(c, "moe_intermediate_size", true, 0, &p->n_ff_exp);
    if (st == HM_OK) st = get_int(c, "sliding_window", true, 0, &p->sliding_window);
    if (st == HM_OK) st = get_int(c, "global_head_dim", false, p->head_dim, &p->head_dim_full);
    if (st == HM_OK)
        st = get_int(c, "num_global_key_value_heads", false, p->n_head_kv, &p->n_head_kv_full);
    if (st == HM_OK) st = get_num(c, "final_logit_softcapping", false, 0.0, &p->softcap);
    if (st != HM_OK) return st;
    /* the variants the loader refuses, refused here by field */
    bool k_eq_v = false, moe = false;
    int64_t shared = 0, per_layer = 0;
    if ((st = get_bool(c, "attention_k_eq_v", false, &k_eq_v)) != HM_OK) return st;
    if ((st = get_bool(c, "enable_moe_block", false, &moe)) != HM_OK) return st;
    if ((st = get_int(c, "num_kv_shared_layers", false, 0, &shared)) != HM_OK) return st;
    if ((st = get_int(c, "hidden_size_per_layer_input", false, 0, &per_layer)) != HM_OK) return st;
    if (!moe)
        return hm_error_set(c->err, HM_ERR_UNSUPPORTED,
                            "%s: enable_moe_block: must be true (the MoE Gemma 4 only)", c->path);
    if (!k_eq_v)
        return hm_error_set(c->err, HM_ERR_UNSUPPORTED,
                            "%s: attention_k_eq_v: false unsupported (full layers' own V)",
                            c->path);
    if (shared || per_layer)
        return hm_error_set(c->err, HM_ERR_UNSUPPORTED, "%s: %s: %lld unsupported (must be 0)",
                            c->path,
                            shared ? "num_kv_shared_layers" : "hidden_size_per_layer_input",
                            (long long)(shared ? shared : per_layer));
    /* layer_types: sliding layers then one full, with period swa_period (llama.cpp's pattern) */
    json_t *lt = json_object_get(c->root, "layer_types");
    if (!json_is_array(lt) || json_array_size(lt) != (size_t)p->n_layer)
        return hm_error_set(c->err, HM_ERR_FORMAT,
                            "%s: layer_types: must be an array of num_hidden_layers (%lld) strings",
                            c->path, (long long)p->n_layer);
    p->swa_period = 0;
    for (size_t i = 0; i < json_array_size(lt) && !p->swa_period; i++) {
        const char *k = json_string_value(json_array_get(lt, i));
        if (k && !strcmp(k, "full_attention")) p->swa_period = (int64_t)i + 1;
    }
    if (!p->swa_period)
        return hm_error_set(c->err, HM_ERR_UNSUPPORTED, "%s: layer_types: no full_attention layer",
                            c->path);
    for (size_t i = 0; i < json_array_size(lt); i++) {
        const char *k = json_string_value(json_array_get(lt, i));
        const char *want = forge_layer_swa(p, (int)i) ? "sliding_attention" : "full_attention";
        if (!k || strcmp(k, want))
            return hm_error_set(c->err, HM_ERR_UNSUPPORTED,
                                "%s: layer_types[%zu]: %s unsupported (the pattern of period "
                                "%lld: %s)",
                                c->path, i, k ? k : "not a string", (long long)p->swa_period, want);
    }
    /* rope_parameters: {full_attention: {rope_theta, partial_rotary_factor}, sliding_attention:
     * {rope_theta}}; n_rot = int(global_head_dim x partial_rotary_factor) */
    json_t *rp = rope_parameters(c);
    json_t *full = rp ? json_object_get(rp, "full_attention") : NULL,
           *swa = rp ? json_object_get(rp, "sliding_attention") : NULL;
    if (!json_is_object(full) || !json_is_object(swa))
        return hm_error_set(c->err, HM_ERR_NOT_FOUND,
                            "%s: rope_parameters: missing its full_attention and "
                            "sliding_attention objects",
                            c->path);
    char fpath[4400], spath[4400];
    snprintf(fpath, sizeof(fpath), "%s: rope_parameters.full_attention", c->path);
    snprintf(spath, sizeof(spath), "%s: rope_parameters.sliding_attention", c->path);
    cfg fc = {fpath, full, c->err}, sc = {spath, swa, c->err};
    double prf = 1.0;
    st = get_num(&sc, "rope_theta", true, 0, &p->rope_base);
    if (st == HM_OK) st = get_num(&fc, "rope_theta", true, 0, &p->rope_base_full);
    if (st == HM_OK) st = get_num(&fc, "partial_rotary_factor", false, 1.0, &prf);
    p->n_rot = (int64_t)((double)p->head_dim_full * prf);
    return st;
}

static hm_status read_fields(const cfg *c, forge_preset *p) {
    hm_status st = HM_OK;
    const forge_arch a = p->arch;
#define INT(key, req, dflt, dst)                                                                   \
    do {                                                                                           \
        if (st == HM_OK) st = get_int(c, key, req, dflt, dst);                                     \
    } while (0)
#define NUM(key, req, dflt, dst)                                                                   \
    do {                                                                                           \
        if (st == HM_OK) st = get_num(c, key, req, dflt, dst);                                     \
    } while (0)
    INT("vocab_size", true, 0, &p->n_vocab);
    INT("hidden_size", true, 0, &p->n_embd);
    INT("num_hidden_layers", true, 0, &p->n_layer);
    INT("num_attention_heads", true, 0, &p->n_head);
    if (st != HM_OK) return st;
    if (p->n_head == 0)
        return hm_error_set(c->err, HM_ERR_FORMAT, "%s: num_attention_heads: must not be 0",
                            c->path);
    INT("num_key_value_heads", false, p->n_head, &p->n_head_kv);
    INT("head_dim", false, p->n_embd / p->n_head, &p->head_dim);
    INT("max_position_embeddings", true, 0, &p->n_ctx);
    NUM("rms_norm_eps", true, 0, &p->rms_eps);
    if (json_object_get(c->root, "rope_theta") || !rope_parameters(c)) {
        NUM("rope_theta", false, 10000.0, &p->rope_base);
    } else if (st == HM_OK) {
        cfg sub = {c->path, rope_parameters(c), c->err};
        st = get_num(&sub, "rope_theta", false, 10000.0, &p->rope_base);
    }
    if (a != FORGE_ARCH_QWEN35MOE) INT("intermediate_size", true, 0, &p->n_ff); /* 35: none */
    if (a == FORGE_ARCH_GEMMA4) {
        if (st == HM_OK)
            st = get_int_alt(c, "top_k_experts", "num_experts_per_tok", &p->n_expert_used);
    } else {
        INT("num_experts_per_tok", true, 0, &p->n_expert_used);
    }
    switch (a) {
    case FORGE_ARCH_GEMMA4:
        if (st == HM_OK) st = read_gemma4(c, p);
        break;
    case FORGE_ARCH_QWEN3NEXT:
    case FORGE_ARCH_QWEN35MOE:
        if (st == HM_OK) st = get_int_alt(c, "num_experts", "num_local_experts", &p->n_expert);
        INT("moe_intermediate_size", true, 0, &p->n_ff_exp);
        INT("shared_expert_intermediate_size", true, 0, &p->n_ff_shexp);
        if (st == HM_OK) st = read_hybrid(c, p);
        break;
    case FORGE_ARCH_QWEN3MOE:
    case FORGE_ARCH_QWEN2MOE:
        if (st == HM_OK) st = get_int_alt(c, "num_experts", "num_local_experts", &p->n_expert);
        INT("moe_intermediate_size", true, 0, &p->n_ff_exp);
        if (a == FORGE_ARCH_QWEN2MOE)
            INT("shared_expert_intermediate_size", true, 0, &p->n_ff_shexp);
        break;
    case FORGE_ARCH_OLMOE:
        if (st == HM_OK) st = get_int_alt(c, "num_experts", "num_local_experts", &p->n_expert);
        break;
    case FORGE_ARCH_LLAMA:
        INT("num_local_experts", true, 0, &p->n_expert);
        break;
    case FORGE_ARCH_GPTOSS: {
        INT("num_local_experts", true, 0, &p->n_expert);
        p->n_ff_exp = p->n_ff;
        INT("sliding_window", true, 0, &p->sliding_window);
        json_t *rs = json_object_get(c->root, "rope_scaling");
        if (!json_is_object(rs) && rope_parameters(c) &&
            json_object_get(rope_parameters(c), "factor"))
            rs = rope_parameters(c);
        if (st == HM_OK && json_is_object(rs)) {
            cfg sub = {c->path, rs, c->err};
            st = get_num(&sub, "factor", true, 0, &p->yarn_factor);
            if (st == HM_OK)
                st = get_int(&sub, "original_max_position_embeddings", true, 0, &p->yarn_orig_ctx);
        } else if (st == HM_OK) {
            st = hm_error_set(c->err, HM_ERR_NOT_FOUND,
                              "%s: rope_scaling: missing (gpt-oss uses yarn)", c->path);
        }
        break;
    }
    default:
        break;
    }
#undef INT
#undef NUM
    return st;
}

hm_status convert_config_read(const char *dir, forge_preset *p, hm_error *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return hm_error_set(err, HM_ERR_NOT_FOUND,
                            "%s: missing (not a HuggingFace checkpoint folder?)", path);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return hm_error_set(err, HM_ERR_FORMAT, "%s: malformed JSON: %s (line %d, column %d)", path,
                            je.text, je.line, je.column);
    memset(p, 0, sizeof(*p));
    cfg c = {path, root, err};
    hm_status st = json_is_object(root)
                       ? find_arch(&c, &p->arch)
                       : hm_error_set(err, HM_ERR_FORMAT, "%s: not a JSON object", path);
    /* a multimodal checkpoint (Qwen3_5MoeForConditionalGeneration,
     * Gemma4ForConditionalGeneration): the text model's fields */
    json_t *tc = st == HM_OK ? json_object_get(root, "text_config") : NULL;
    char tpath[4200];
    if (json_is_object(tc) && (p->arch == FORGE_ARCH_QWEN35MOE || p->arch == FORGE_ARCH_GEMMA4)) {
        snprintf(tpath, sizeof(tpath), "%s: text_config", path);
        c.path = tpath;
        c.root = tc;
    }
    if (st == HM_OK) st = read_fields(&c, p);
    json_decref(root);
    if (st == HM_OK) {
        p->name = "convert";
        p->special_base = 0; /* used only by forge's tokenizer builder */
        st = forge_preset_check(p, err);
        if (st != HM_OK) {
            char why[HM_ERROR_MSG_MAX];
            snprintf(why, sizeof(why), "%s", err ? err->msg : "");
            st = hm_error_set(err, st, "%s: %s", path, why);
        }
    }
    return st;
}
