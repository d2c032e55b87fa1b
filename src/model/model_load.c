/* model_load.c - hyper-parameters from GGUF metadata and tensors bound to layers.
 *
 * DESIGN: keys are read as llama.cpp reads them (`{arch}.embedding_length`, ...; head_count_kv
 * defaults to head_count, key_length to n_embd / n_head, rope.dimension_count to key_length,
 * rope.freq_base to 10000). Each tensor is looked up by its llama.cpp name and checked for shape
 * and type before anything runs, so a broken file is one clear line at load and never a crash
 * in the forward pass. Matrices stay in the mapping in whatever supported type they have; small
 * vectors (norms, biases, sinks) of a type other than f32 are converted once into an owned f32
 * array (a few KB; weights proper are never copied).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/cpu.h"
#include "model/model_internal.h"
#include "quant/qtypes.h"

hm_model_params hm_model_default_params(void) {
    hm_model_params p = {.check_ram = true, .f32_weights = false, .repack = false};
    return p;
}

/* ---- metadata ---- */

/* Index of key "ARCH.SUFFIX" in *idx (-1 when absent and not required); its name in key. */
static hm_status find_arch_key(const gguf_ctx *g, const char *arch, const char *suffix,
                               bool required, char key[160], int64_t *idx, hm_error *err) {
    snprintf(key, 160, "%s.%s", arch, suffix);
    *idx = gguf_find_key(g, key);
    if (*idx < 0 && required)
        return hm_error_set(err, HM_ERR_NOT_FOUND, "missing metadata key %s", key);
    return HM_OK;
}

static hm_status get_i(const gguf_ctx *g, const char *arch, const char *suffix, int64_t def,
                       bool required, int64_t *out, hm_error *err) {
    char key[160];
    int64_t i;
    hm_status st = find_arch_key(g, arch, suffix, required, key, &i, err);
    if (st != HM_OK || i < 0) {
        *out = def;
        return st;
    }
    return gguf_kv_int(g, i, out, err);
}

static hm_status get_f(const gguf_ctx *g, const char *arch, const char *suffix, double def,
                       bool required, float *out, hm_error *err) {
    char key[160];
    int64_t i;
    double d = def;
    hm_status st = find_arch_key(g, arch, suffix, required, key, &i, err);
    if (st == HM_OK && i >= 0) st = gguf_kv_float(g, i, &d, err);
    *out = (float)d;
    return st;
}

/* The delta net's shapes (hybrid architectures), as llama.cpp's qwen3next loader reads them:
 * ssm.conv_kernel, ssm.state_size (head_k), ssm.group_count (k heads), ssm.time_step_rank
 * (v heads), ssm.inner_size (v heads x head_v), full_attention_interval (default 4). */
static hm_status read_hparams_ssm(hm_model *m, hm_error *err) {
    const gguf_ctx *g = m->g;
    const char *a = m->desc->name;
    hm_hparams *hp = &m->hp;
    int64_t inner = 0;
    hm_status st = get_i(g, a, "ssm.conv_kernel", 0, true, &hp->ssm_conv_kernel, err);
    if (st == HM_OK) st = get_i(g, a, "ssm.state_size", 0, true, &hp->ssm_head_k, err);
    if (st == HM_OK) st = get_i(g, a, "ssm.group_count", 0, true, &hp->ssm_n_k_heads, err);
    if (st == HM_OK) st = get_i(g, a, "ssm.time_step_rank", 0, true, &hp->ssm_n_v_heads, err);
    if (st == HM_OK) st = get_i(g, a, "ssm.inner_size", 0, true, &inner, err);
    if (st == HM_OK)
        st = get_i(g, a, "full_attention_interval", 4, false, &hp->full_attn_interval, err);
    if (st != HM_OK) return st;
    const int64_t nk = hp->ssm_n_k_heads, nv = hp->ssm_n_v_heads;
    if (hp->ssm_conv_kernel < 1 || hp->ssm_conv_kernel > 64 || hp->ssm_head_k <= 0 ||
        hp->ssm_head_k > 4096 || nk <= 0 || nv <= 0 || nv % nk != 0 || inner <= 0 ||
        inner % nv != 0 || inner / nv > 4096 || hp->full_attn_interval < 1)
        return hm_error_set(err, HM_ERR_RANGE, "%s: bad ssm.conv_kernel/state_size/group_count/"
                            "time_step_rank/inner_size/full_attention_interval (%lld/%lld/%lld/"
                            "%lld/%lld/%lld): value heads must be a multiple of the key heads "
                            "and inner_size of the value heads", a,
                            (long long)hp->ssm_conv_kernel, (long long)hp->ssm_head_k,
                            (long long)nk, (long long)nv, (long long)inner,
                            (long long)hp->full_attn_interval);
    hp->ssm_head_v = inner / nv;
    return HM_OK;
}

/* qwen35moe (hm_arch_desc.rope_sections), as llama.cpp's loader reads them:
 * nextn_predict_layers (default 0; the MTP blocks are the last of block_count, so n_layer is
 * block_count minus them) and rope.dimension_sections (required, up to 4 integers). */
static hm_status read_hparams_sections(hm_model *m, hm_error *err) {
    const char *a = m->desc->name;
    hm_hparams *hp = &m->hp;
    hm_status st = get_i(m->g, a, "nextn_predict_layers", 0, false, &hp->n_nextn, err);
    if (st != HM_OK) return st;
    if (hp->n_nextn < 0 || hp->n_nextn >= hp->n_layer)
        return hm_error_set(err, HM_ERR_RANGE, "%s.nextn_predict_layers %lld must be below "
                            "block_count %lld", a, (long long)hp->n_nextn, (long long)hp->n_layer);
    hp->n_layer -= hp->n_nextn;
    char key[160];
    snprintf(key, sizeof(key), "%s.rope.dimension_sections", a);
    gguf_arr arr;
    st = gguf_get_arr(m->g, key, &arr, err);
    if (st != HM_OK) return st;
    int64_t sum = 0;
    bool ok = arr.n >= 1 && arr.n <= 4;
    for (uint64_t i = 0; ok && i < arr.n; i++) {
        hp->rope_sections[i] = gguf_arr_int(&arr, i);
        ok = hp->rope_sections[i] >= 0 && hp->rope_sections[i] <= 4096;
        sum += hp->rope_sections[i];
    }
    if (!ok || sum <= 0)
        return hm_error_set(err, HM_ERR_RANGE, "%s: 1 to 4 sections of 0..4096 rotary pairs, "
                            "not all 0, expected", key);
    return HM_OK;
}

/* A key llama.cpp reads with get_key_or_arr: one integer, or an array of n_layer; *a and *b
 * take the value of the sliding layers (swa[il]) and of the full ones, which must each agree. */
static hm_status get_per_kind(const hm_model *m, const char *suffix, const bool *swa,
                              int64_t *v_swa, int64_t *v_full, hm_error *err) {
    char key[160];
    int64_t i;
    hm_status st = find_arch_key(m->g, m->desc->name, suffix, true, key, &i, err);
    if (st != HM_OK) return st;
    gguf_arr arr;
    if (gguf_kv_int(m->g, i, v_swa, NULL) == HM_OK) {
        *v_full = *v_swa;
        return HM_OK;
    }
    if ((st = gguf_get_arr(m->g, key, &arr, err)) != HM_OK) return st;
    if ((int64_t)arr.n != m->hp.n_layer)
        return hm_error_set(err, HM_ERR_FORMAT, "%s: %llu values for %lld layers", key,
                            (unsigned long long)arr.n, (long long)m->hp.n_layer);
    *v_swa = *v_full = -1;
    for (uint64_t l = 0; l < arr.n; l++) {
        int64_t v = gguf_arr_int(&arr, l), *dst = swa[l] ? v_swa : v_full;
        if (*dst >= 0 && *dst != v)
            return hm_error_set(err, HM_ERR_UNSUPPORTED, "%s: layer %llu has %lld, another layer "
                                "of its kind %lld (one value per layer kind is supported)", key,
                                (unsigned long long)l, (long long)v, (long long)*dst);
        *dst = v;
    }
    if (*v_swa < 0) *v_swa = *v_full;
    if (*v_full < 0) *v_full = *v_swa;
    return HM_OK;
}

/* gemma4 (llama.cpp's gemma4 load_arch_hparams): attention.sliding_window_pattern (a bool per
 * layer, true = sliding; into m->layers' swa), attention.sliding_window, head_count_kv per layer
 * kind, the _swa sizes and rope base, feed_forward_length (the dense MLP),
 * final_logit_softcapping; per-layer embeddings and shared KV layers (the small Gemma 4 models)
 * are refused. The generic keys were read before (key_length and rope.* are the full layers'). */
static hm_status read_hparams_gemma4(hm_model *m, bool *swa, hm_error *err) {
    const char *a = m->desc->name;
    hm_hparams *hp = &m->hp;
    char key[160];
    snprintf(key, sizeof(key), "%s.attention.sliding_window_pattern", a);
    gguf_arr arr;
    hm_status st = gguf_get_arr(m->g, key, &arr, err);
    if (st != HM_OK) return st;
    if ((int64_t)arr.n != hp->n_layer)
        return hm_error_set(err, HM_ERR_FORMAT, "%s: %llu values for %lld layers", key,
                            (unsigned long long)arr.n, (long long)hp->n_layer);
    for (uint64_t l = 0; l < arr.n; l++) swa[l] = gguf_arr_int(&arr, l) != 0;
    int64_t shared = 0, ple = 0, vl_swa = 0;
    st = get_per_kind(m, "attention.head_count_kv", swa, &hp->n_head_kv_swa, &hp->n_head_kv, err);
    if (st == HM_OK) st = get_i(m->g, a, "attention.sliding_window", 0, true, &hp->sliding_window, err);
    if (st == HM_OK) st = get_i(m->g, a, "attention.key_length_swa", 0, true, &hp->head_dim_swa, err);
    if (st == HM_OK) st = get_i(m->g, a, "attention.value_length_swa", 0, true, &vl_swa, err);
    if (st == HM_OK)
        st = get_i(m->g, a, "rope.dimension_count_swa", hp->head_dim_swa, false, &hp->n_rot_swa, err);
    if (st == HM_OK) st = get_f(m->g, a, "rope.freq_base_swa", hp->rope_base, false, &hp->rope_base_swa, err);
    if (st == HM_OK) st = get_i(m->g, a, "feed_forward_length", 0, true, &hp->n_ff, err);
    if (st == HM_OK) st = get_f(m->g, a, "final_logit_softcapping", 0.0, false, &hp->logit_softcap, err);
    if (st == HM_OK) st = get_i(m->g, a, "attention.shared_kv_layers", 0, false, &shared, err);
    if (st == HM_OK) st = get_i(m->g, a, "embedding_length_per_layer_input", 0, false, &ple, err);
    if (st != HM_OK) return st;
    if (shared != 0 || ple != 0)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "%s: shared KV layers (%lld) and per-layer "
                            "embeddings (%lld) of the small Gemma 4 models are not supported "
                            "(the MoE model has neither)", a, (long long)shared, (long long)ple);
    if (hp->n_head_kv_swa <= 0 || hp->n_head % hp->n_head_kv_swa != 0 || hp->head_dim_swa <= 0 ||
        hp->head_dim_swa > 4096 || vl_swa != hp->head_dim_swa || hp->n_rot_swa <= 0 ||
        hp->n_rot_swa % 2 || hp->n_rot_swa > hp->head_dim_swa || hp->sliding_window <= 0 ||
        hp->n_ff <= 0 || !(hp->rope_base_swa > 0.0f) || !(hp->logit_softcap >= 0.0f))
        return hm_error_set(err, HM_ERR_RANGE, "%s: bad sliding layers' head_count_kv/key_length"
                            "/value_length/rope dimension (%lld/%lld/%lld/%lld), sliding_window "
                            "%lld, feed_forward_length %lld, rope.freq_base_swa or "
                            "final_logit_softcapping", a, (long long)hp->n_head_kv_swa,
                            (long long)hp->head_dim_swa, (long long)vl_swa,
                            (long long)hp->n_rot_swa, (long long)hp->sliding_window,
                            (long long)hp->n_ff);
    return HM_OK;
}

static hm_status read_hparams(hm_model *m, hm_error *err) {
    const gguf_ctx *g = m->g;
    const char *a = m->desc->name;
    hm_hparams *hp = &m->hp;
    hm_status st = HM_OK;
#define GI(sfx, def, req, dst) \
    do { if (st == HM_OK) st = get_i(g, a, sfx, def, req, dst, err); } while (0)
#define GF(sfx, def, req, dst) \
    do { if (st == HM_OK) st = get_f(g, a, sfx, def, req, dst, err); } while (0)
    GI("embedding_length", 0, true, &hp->n_embd);
    GI("block_count", 0, true, &hp->n_layer);
    GI("context_length", 0, true, &hp->n_ctx_train);
    GI("attention.head_count", 0, true, &hp->n_head);
    if (st != HM_OK) return st;
    if (hp->n_head <= 0 || hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_layer > 4096)
        return hm_error_set(err, HM_ERR_RANGE, "%s: bad embedding_length/block_count/head_count"
                            " (%lld/%lld/%lld)", a, (long long)hp->n_embd,
                            (long long)hp->n_layer, (long long)hp->n_head);
    if (m->desc->rope_sections && (st = read_hparams_sections(m, err)) != HM_OK) return st;
    if (!m->desc->gemma4) /* gemma4: per layer kind (read_hparams_gemma4) */
        GI("attention.head_count_kv", hp->n_head, false, &hp->n_head_kv);
    else
        hp->n_head_kv = hp->n_head;
    GI("attention.key_length", hp->n_embd / hp->n_head, false, &hp->head_dim_k);
    GI("attention.value_length", hp->head_dim_k, false, &hp->head_dim_v);
    GI("rope.dimension_count", hp->head_dim_k, false, &hp->n_rot);
    GI("expert_count", 0, true, &hp->n_expert);
    GI("expert_used_count", 0, true, &hp->n_expert_used);
    if (m->desc->ff_exp_key) GI("expert_feed_forward_length", 0, true, &hp->n_ff_exp);
    else GI("feed_forward_length", 0, true, &hp->n_ff_exp);
    hp->n_ff_shexp = 0;
    if (m->desc->shared_expert) GI("expert_shared_feed_forward_length", 0, true, &hp->n_ff_shexp);
    GF("attention.layer_norm_rms_epsilon", 0, true, &hp->rms_eps);
    GF("rope.freq_base", 10000.0, false, &hp->rope_base);
    hp->rope_freq_scale = 1.0f;
    hp->rope_orig_ctx = hp->n_ctx_train;
    hp->yarn_ext_factor = 0.0f;
    hp->yarn_attn_factor = 1.0f;
    hp->yarn_beta_fast = 32.0f;
    hp->yarn_beta_slow = 1.0f;
    hp->yarn_truncate = m->desc->yarn_truncate;
    hp->sliding_window = 0;
    if (st != HM_OK) return st;
    if (m->desc->swa_period > 0) GI("attention.sliding_window", 0, true, &hp->sliding_window);
    /* rope scaling: only YaRN (what gpt-oss uses) and none/linear are understood */
    char key[160];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", a);
    int64_t ki = gguf_find_key(g, key);
    if (st == HM_OK && ki >= 0) {
        gguf_str s;
        st = gguf_kv_str(g, ki, &s, err);
        if (st != HM_OK) return st;
        float factor = 1.0f;
        GF("rope.scaling.factor", 1.0, false, &factor);
        if (st != HM_OK) return st;
        if (s.len == 4 && !memcmp(s.data, "yarn", 4)) {
            if (!(factor >= 1.0f))
                return hm_error_set(err, HM_ERR_RANGE, "%s.rope.scaling.factor %g must be >= 1",
                                    a, (double)factor);
            hp->rope_freq_scale = 1.0f / factor;
            hp->yarn_ext_factor = 1.0f;
            GI("rope.scaling.original_context_length", hp->n_ctx_train, false, &hp->rope_orig_ctx);
            GF("rope.scaling.yarn_beta_fast", 32.0, false, &hp->yarn_beta_fast);
            GF("rope.scaling.yarn_beta_slow", 1.0, false, &hp->yarn_beta_slow);
        } else if (s.len == 6 && !memcmp(s.data, "linear", 6)) {
            if (!(factor > 0.0f))
                return hm_error_set(err, HM_ERR_RANGE, "%s.rope.scaling.factor %g must be > 0",
                                    a, (double)factor);
            hp->rope_freq_scale = 1.0f / factor;
        } else if (!(s.len == 4 && !memcmp(s.data, "none", 4))) {
            return hm_error_set(err, HM_ERR_UNSUPPORTED, "unsupported %s '%.*s' (supported: "
                                "none, linear, yarn)", key, (int)s.len, s.data);
        }
    }
#undef GI
#undef GF
    if (st != HM_OK) return st;
    if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0)
        return hm_error_set(err, HM_ERR_RANGE, "%s: head_count %lld is not a multiple of "
                            "head_count_kv %lld", a, (long long)hp->n_head,
                            (long long)hp->n_head_kv);
    if (hp->head_dim_k != hp->head_dim_v)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "%s: key_length %lld != value_length %lld "
                            "is not supported", a, (long long)hp->head_dim_k,
                            (long long)hp->head_dim_v);
    if (hp->head_dim_k <= 0 || hp->head_dim_v <= 0 || hp->n_rot <= 0 ||
        hp->n_rot > hp->head_dim_k || hp->n_rot % 2)
        return hm_error_set(err, HM_ERR_RANGE, "%s: bad key_length/value_length/rope dimension "
                            "(%lld/%lld/%lld)", a, (long long)hp->head_dim_k,
                            (long long)hp->head_dim_v, (long long)hp->n_rot);
    if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert ||
        hp->n_expert > 65536)
        return hm_error_set(err, HM_ERR_RANGE, "%s: expert_used_count %lld / expert_count %lld "
                            "(an MoE model needs 1 <= used <= count)", a,
                            (long long)hp->n_expert_used, (long long)hp->n_expert);
    if (hp->n_ff_exp <= 0 || hp->n_ctx_train <= 0 || !(hp->rms_eps > 0.0f) ||
        !(hp->rope_base > 0.0f) || hp->sliding_window < 0 ||
        (m->desc->shared_expert && hp->n_ff_shexp <= 0))
        return hm_error_set(err, HM_ERR_RANGE, "%s: bad feed-forward width, context length, "
                            "rms epsilon, rope base or sliding window", a);
    if (m->desc->swa_period > 0 && hp->sliding_window == 0)
        return hm_error_set(err, HM_ERR_RANGE, "%s.attention.sliding_window must be > 0", a);
    if (m->desc->gemma4) {
        bool *swa = calloc((size_t)hp->n_layer, sizeof(bool));
        if (!swa) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
        st = read_hparams_gemma4(m, swa, err);
        m->swa = swa; /* into the layers by bind_all */
        if (st == HM_OK && (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0))
            st = hm_error_set(err, HM_ERR_RANGE, "%s: head_count %lld is not a multiple of the "
                              "full layers' head_count_kv %lld", a, (long long)hp->n_head,
                              (long long)hp->n_head_kv);
        return st;
    }
    return m->desc->hybrid ? read_hparams_ssm(m, err) : HM_OK;
}

/* ---- tensors ---- */

typedef struct {
    hm_model *m;
    float *owned_next; /* next free float in m->owned */
    float *owned_end;
    bool f32_weights;  /* hm_model_params.f32_weights */
} binder;

static void shape_str(char *buf, size_t n, const int64_t *ne, int nd) {
    size_t o = (size_t)snprintf(buf, n, "{");
    for (int d = 0; d < nd && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)ne[d]);
    if (o < n) snprintf(buf + o, n - o, "}");
}

/* Binds tensor `name` (with "%d" replaced by the layer) of shape ne[0..nd) (trailing 1s are
 * allowed). is_vec: a small vector the forward pass reads as f32 (converted if needed). */
static hm_status bind(binder *b, hm_tensor *out, const char *fmt, int il, int nd,
                      const int64_t *ne, bool required, bool is_vec, hm_error *err) {
    char name[96];
    snprintf(name, sizeof(name), fmt, il);
    memset(out, 0, sizeof(*out));
    const gguf_tensor *t = gguf_find_tensor(b->m->g, name);
    if (!t) {
        if (!required) return HM_OK;
        return hm_error_set(err, HM_ERR_NOT_FOUND, "missing tensor %s", name);
    }
    bool ok = true;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        int64_t want = d < nd ? ne[d] : 1;
        if (t->ne[d] != want) ok = false;
    }
    if (!ok) {
        char want[96], got[96];
        shape_str(want, sizeof(want), ne, nd);
        shape_str(got, sizeof(got), t->ne, (int)t->n_dims);
        return hm_error_set(err, HM_ERR_FORMAT, "tensor %s has shape %s, expected %s", t->name,
                            got, want);
    }
    const hm_type_info *ti = hm_type_get(t->type);
    if (!ti || !ti->supported || quant_act_for(t->type) == QUANT_ACT_COUNT)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "unsupported type %s in tensor %s",
                            hm_type_name(t->type), t->name);
    out->name = t->name;
    out->type = t->type;
    for (int d = 0; d < 4; d++) out->ne[d] = t->ne[d];
    out->data = t->data;
    out->row_size = hm_row_size(t->type, t->ne[0]);
    if (out->row_size == 0)
        return hm_error_set(err, HM_ERR_FORMAT, "tensor %s: row of %lld elements does not fit "
                            "type %s blocks", t->name, (long long)t->ne[0], hm_type_name(t->type));
    if (!is_vec && b->f32_weights && t->type != HM_TYPE_F32) {
        int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        float *copy = malloc((size_t)n * sizeof(float));
        if (!copy)
            return hm_error_set(err, HM_ERR_NOMEM, "out of memory for an f32 copy of %s",
                                t->name);
        b->m->f32_copies[b->m->n_f32_copies++] = copy;
        for (int64_t r = 0; r < n / t->ne[0]; r++)
            quant_dequantize_row(t->type, (const char *)t->data + (size_t)r * out->row_size,
                                 copy + r * t->ne[0], t->ne[0]);
        out->data = copy;
        out->type = HM_TYPE_F32;
        out->row_size = (size_t)t->ne[0] * sizeof(float);
    }
    if (is_vec && t->type != HM_TYPE_F32) {
        int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        if (b->owned_next + n > b->owned_end)
            return hm_error_set(err, HM_ERR_STATE, "internal: vector arena too small");
        for (int64_t r = 0; r < n / t->ne[0]; r++)
            quant_dequantize_row(t->type, (const char *)t->data + (size_t)r * out->row_size,
                                 b->owned_next + r * t->ne[0], t->ne[0]);
        out->data = b->owned_next;
        out->type = HM_TYPE_F32;
        out->row_size = (size_t)t->ne[0] * sizeof(float);
        b->owned_next += n;
    }
    b->m->weight_bytes += t->size;
    return HM_OK;
}

/* A recurrent layer's tensors (hm_layer's ssm_*): llama.cpp's attn_qkv + attn_gate, or the
 * older fused ssm_in; the missing one is named with the other as the alternative. */
static hm_status bind_ssm(binder *b, hm_layer *L, int il, hm_error *err) {
    const hm_hparams *hp = &b->m->hp;
    const int64_t E = hp->n_embd, nv = hp->ssm_n_v_heads, K = hp->ssm_conv_kernel;
    const int64_t kd = hp->ssm_n_k_heads * hp->ssm_head_k, vd = nv * hp->ssm_head_v;
    const int64_t cd = 2 * kd + vd;
    hm_status st = HM_OK;
#define S(dst, name, req, vec, ...)                                                           \
    do {                                                                                      \
        const int64_t ne_[] = {__VA_ARGS__};                                                  \
        if (st == HM_OK)                                                                      \
            st = bind(b, dst, name, il, (int)(sizeof(ne_) / sizeof(ne_[0])), ne_, req, vec,   \
                      err);                                                                   \
    } while (0)
    S(&L->ssm_qkv, "blk.%d.attn_qkv.weight", false, false, E, cd);
    if (L->ssm_qkv.data) {
        S(&L->ssm_gate, "blk.%d.attn_gate.weight", true, false, E, vd);
    } else {
        S(&L->ssm_in, "blk.%d.ssm_in.weight", false, false, E, cd + vd);
        if (st == HM_OK && !L->ssm_in.data)
            return hm_error_set(err, HM_ERR_NOT_FOUND, "missing tensor blk.%d.attn_qkv.weight "
                                "(or the older fused blk.%d.ssm_in.weight)", il, il);
    }
    if (b->m->desc->ssm_ab_split) {
        S(&L->ssm_beta, "blk.%d.ssm_beta.weight", true, false, E, nv);
        S(&L->ssm_alpha, "blk.%d.ssm_alpha.weight", true, false, E, nv);
    } else {
        S(&L->ssm_ba, "blk.%d.ssm_ba.weight", true, false, E, 2 * nv);
    }
    S(&L->ssm_conv1d, "blk.%d.ssm_conv1d.weight", true, true, K, cd);
    S(&L->ssm_dt, "blk.%d.ssm_dt.bias", true, true, nv);
    S(&L->ssm_a, "blk.%d.ssm_a", true, true, nv);
    S(&L->ssm_norm, "blk.%d.ssm_norm.weight", true, true, hp->ssm_head_v);
    S(&L->ssm_out, "blk.%d.ssm_out.weight", true, false, vd, E);
#undef S
    return st;
}

/* The experts' gate and up of layer il (gate_exps, up_exps {E, F, X}): two tensors, or where the
 * architecture allows it (hm_arch_desc.fused_gate_up) llama.cpp's ffn_gate_up_exps {E, 2 F, X}:
 * per expert F gate rows, then F up rows (its build_moe_ffn views the fused product's first
 * n_ff rows as gate, the next as up). That one is bound once and presented as two views of its
 * bytes with an expert stride of 2 F rows: no copy. A file with both forms is refused. */
static hm_status bind_gate_up(binder *b, hm_layer *L, int il, int64_t E, int64_t F, int64_t X,
                              hm_error *err) {
    char fused[96], gate[96], up[96];
    snprintf(fused, sizeof(fused), "blk.%d.ffn_gate_up_exps.weight", il);
    snprintf(gate, sizeof(gate), "blk.%d.ffn_gate_exps.weight", il);
    snprintf(up, sizeof(up), "blk.%d.ffn_up_exps.weight", il);
    const bool has_fused = gguf_find_tensor(b->m->g, fused) != NULL;
    if (has_fused && (gguf_find_tensor(b->m->g, gate) || gguf_find_tensor(b->m->g, up)))
        return hm_error_set(err, HM_ERR_FORMAT, "tensor %s: the file holds both the fused "
                            "gate/up experts and %s", fused,
                            gguf_find_tensor(b->m->g, gate) ? gate : up);
    if (has_fused && !b->m->desc->fused_gate_up)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "tensor %s: llama.cpp's %s reads separate "
                            "gate and up experts only; convert without --fuse-gate-up-exps",
                            fused, b->m->desc->name);
    if (!has_fused && b->m->desc->fused_gate_up && !gguf_find_tensor(b->m->g, gate))
        return hm_error_set(err, HM_ERR_NOT_FOUND, "missing tensor %s (or the fused %s)", gate,
                            fused);
    const int64_t ne2[] = {E, F, X}, ne3[] = {E, 2 * F, X};
    if (!has_fused) {
        hm_status st = bind(b, &L->gate_exps, "blk.%d.ffn_gate_exps.weight", il, 3, ne2, true,
                            false, err);
        if (st == HM_OK)
            st = bind(b, &L->up_exps, "blk.%d.ffn_up_exps.weight", il, 3, ne2, true, false, err);
        return st;
    }
    hm_tensor t;
    hm_status st = bind(b, &t, "blk.%d.ffn_gate_up_exps.weight", il, 3, ne3, true, false, err);
    if (st != HM_OK) return st;
    t.ne[1] = F;
    t.expert_stride = 2 * (size_t)F * t.row_size;
    L->gate_exps = L->up_exps = t;
    L->up_exps.data = (const char *)t.data + (size_t)F * t.row_size;
    return HM_OK;
}

/* A gemma4 layer (llama.cpp's gemma4 load_arch_tensors for an MoE layer): the attention of its
 * kind (a full layer's attn_v absent: V is K; an attn_v there is refused, as its rows would be
 * unused), the dense MLP and the experts with their norms and scales. */
static hm_status bind_gemma4(binder *b, hm_layer *L, int il, hm_error *err) {
    const hm_hparams *hp = &b->m->hp;
    const int64_t E = hp->n_embd, hd = L->swa ? hp->head_dim_swa : hp->head_dim_k;
    const int64_t nq = hp->n_head * hd, nkv = (L->swa ? hp->n_head_kv_swa : hp->n_head_kv) * hd;
    const int64_t D = hp->n_ff, F = hp->n_ff_exp, X = hp->n_expert;
    hm_status st = HM_OK;
#define G(dst, name, vec, ...)                                                                \
    do {                                                                                      \
        const int64_t ne_[] = {__VA_ARGS__};                                                  \
        if (st == HM_OK)                                                                      \
            st = bind(b, dst, name, il, (int)(sizeof(ne_) / sizeof(ne_[0])), ne_, true, vec,  \
                      err);                                                                   \
    } while (0)
    G(&L->wq, "blk.%d.attn_q.weight", false, E, nq);
    G(&L->wk, "blk.%d.attn_k.weight", false, E, nkv);
    if (L->swa) G(&L->wv, "blk.%d.attn_v.weight", false, E, nkv);
    char name[96];
    snprintf(name, sizeof(name), "blk.%d.attn_v.weight", il);
    if (st == HM_OK && !L->swa && gguf_find_tensor(b->m->g, name))
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "tensor %s: a full-attention gemma4 layer "
                            "with its own V (attention_k_eq_v false) is not supported", name);
    G(&L->wo, "blk.%d.attn_output.weight", false, nq, E);
    G(&L->q_norm, "blk.%d.attn_q_norm.weight", true, hd);
    G(&L->k_norm, "blk.%d.attn_k_norm.weight", true, hd);
    G(&L->attn_post_norm, "blk.%d.post_attention_norm.weight", true, E);
    G(&L->out_scale, "blk.%d.layer_output_scale.weight", true, 1);
    G(&L->ffn_norm, "blk.%d.ffn_norm.weight", true, E);
    G(&L->ffn_gate, "blk.%d.ffn_gate.weight", false, E, D);
    G(&L->ffn_up, "blk.%d.ffn_up.weight", false, E, D);
    G(&L->ffn_down, "blk.%d.ffn_down.weight", false, D, E);
    G(&L->ffn_post_norm, "blk.%d.post_ffw_norm.weight", true, E);
    G(&L->router, "blk.%d.ffn_gate_inp.weight", false, E, X);
    G(&L->router_scale, "blk.%d.ffn_gate_inp.scale", true, E);
    G(&L->ffn_pre_norm2, "blk.%d.pre_ffw_norm_2.weight", true, E);
    G(&L->ffn_post_norm1, "blk.%d.post_ffw_norm_1.weight", true, E);
    G(&L->ffn_post_norm2, "blk.%d.post_ffw_norm_2.weight", true, E);
    if (st == HM_OK) st = bind_gate_up(b, L, il, E, F, X, err);
    G(&L->down_exps, "blk.%d.ffn_down_exps.weight", false, F, E, X);
    G(&L->down_exps_scale, "blk.%d.ffn_down_exps.scale", true, X);
#undef G
    return st;
}

static hm_status bind_all(hm_model *m, bool f32_weights, hm_error *err) {
    const hm_hparams *hp = &m->hp;
    const hm_arch_desc *d = m->desc;
    /* room for every small vector as f32 (upper bound per layer) */
    const int64_t nq_ = hp->n_head * hp->head_dim_k, nk_ = hp->n_head_kv * hp->head_dim_k,
                  nv_ = hp->n_head_kv * hp->head_dim_v;
    int64_t per_layer = 2 * hp->n_embd + hp->n_head * hp->head_dim_k * 2 +
                        hp->n_head_kv * (hp->head_dim_k + hp->head_dim_v) + hp->n_embd +
                        hp->n_head + hp->n_expert + hp->n_expert * (2 * hp->n_ff_exp + hp->n_embd) +
                        hp->n_embd + 2 * hp->head_dim_k + nq_ + nk_ + nv_;
    if (d->hybrid) /* ssm_dt, ssm_a, ssm_norm, ssm_conv1d */
        per_layer += 2 * hp->ssm_n_v_heads + hp->ssm_head_v +
                     hp->ssm_conv_kernel * (2 * hp->ssm_n_k_heads * hp->ssm_head_k +
                                            hp->ssm_n_v_heads * hp->ssm_head_v);
    int64_t total = per_layer * hp->n_layer + hp->n_embd;
    m->owned = malloc((size_t)total * sizeof(float));
    if (!m->owned) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (vectors)");
    binder b = {m, m->owned, m->owned + total, f32_weights};
    if (f32_weights) {
        m->f32_copies = calloc((size_t)gguf_tensor_count(m->g) + 1, sizeof(void *));
        if (!m->f32_copies) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    }
    m->layers = calloc((size_t)hp->n_layer, sizeof(hm_layer));
    if (!m->layers) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (layers)");

    const int64_t E = hp->n_embd, V = 0, nq = hp->n_head * hp->head_dim_k,
                  nk = hp->n_head_kv * hp->head_dim_k, nv = hp->n_head_kv * hp->head_dim_v,
                  no = hp->n_head * hp->head_dim_v, F = hp->n_ff_exp, X = hp->n_expert,
                  S = hp->n_ff_shexp;
    (void)V;
    hm_status st = HM_OK;
#define B(dst, name, req, vec, ...)                                                           \
    do {                                                                                      \
        const int64_t ne_[] = {__VA_ARGS__};                                                  \
        if (st == HM_OK)                                                                      \
            st = bind(&b, dst, name, il, (int)(sizeof(ne_) / sizeof(ne_[0])), ne_, req, vec,  \
                      err);                                                                   \
    } while (0)
    int il = 0;
    /* token_embd gives n_vocab */
    const gguf_tensor *te = gguf_find_tensor(m->g, "token_embd.weight");
    if (!te) return hm_error_set(err, HM_ERR_NOT_FOUND, "missing tensor token_embd.weight");
    m->hp.n_vocab = te->ne[1];
    const int64_t NV = m->hp.n_vocab;
    B(&m->tok_embd, "token_embd.weight", true, false, E, NV);
    B(&m->output_norm, "output_norm.weight", true, true, E);
    B(&m->output, "output.weight", !d->gemma4, false, E, NV);
    if (st == HM_OK && d->gemma4) {
        if (!m->output.data) m->output = m->tok_embd; /* tied, as llama.cpp duplicates it */
        B(&m->rope_freqs, "rope_freqs.weight", true, true, hp->head_dim_k / 2);
    }
    for (il = 0; il < hp->n_layer && st == HM_OK; il++) {
        hm_layer *L = &m->layers[il];
        L->swa = d->gemma4 ? m->swa[il] : d->swa_period > 0 && il % d->swa_period == 0;
        L->recurrent = d->hybrid && (il + 1) % hp->full_attn_interval != 0;
        B(&L->attn_norm, "blk.%d.attn_norm.weight", true, true, E);
        if (d->gemma4) {
            if (st == HM_OK) st = bind_gemma4(&b, L, il, err);
            continue;
        }
        if (L->recurrent && st == HM_OK) st = bind_ssm(&b, L, il, err);
        if (!L->recurrent) {
            B(&L->wq, "blk.%d.attn_q.weight", true, false, E, d->attn_gate ? 2 * nq : nq);
            B(&L->wk, "blk.%d.attn_k.weight", true, false, E, nk);
            B(&L->wv, "blk.%d.attn_v.weight", true, false, E, nv);
            B(&L->wo, "blk.%d.attn_output.weight", true, false, no, E);
            if (d->bias_qkv) {
                B(&L->bq, "blk.%d.attn_q.bias", true, true, nq);
                B(&L->bk, "blk.%d.attn_k.bias", true, true, nk);
                B(&L->bv, "blk.%d.attn_v.bias", true, true, nv);
            }
            if (d->bias_o) B(&L->bo, "blk.%d.attn_output.bias", true, true, E);
            if (d->qk_norm == HM_QKNORM_HEAD) {
                B(&L->q_norm, "blk.%d.attn_q_norm.weight", true, true, hp->head_dim_k);
                B(&L->k_norm, "blk.%d.attn_k_norm.weight", true, true, hp->head_dim_k);
            } else if (d->qk_norm == HM_QKNORM_FULL) {
                B(&L->q_norm, "blk.%d.attn_q_norm.weight", true, true, nq);
                B(&L->k_norm, "blk.%d.attn_k_norm.weight", true, true, nk);
            }
            if (d->sinks) B(&L->sinks, "blk.%d.attn_sinks.weight", true, true, hp->n_head);
        }
        if (d->post_attn_norm_name)
            B(&L->ffn_norm, "blk.%d.post_attention_norm.weight", true, true, E);
        else
            B(&L->ffn_norm, "blk.%d.ffn_norm.weight", true, true, E);
        B(&L->router, "blk.%d.ffn_gate_inp.weight", true, false, E, X);
        if (d->router_bias) B(&L->router_b, "blk.%d.ffn_gate_inp.bias", true, true, X);
        if (st == HM_OK) st = bind_gate_up(&b, L, il, E, F, X, err);
        B(&L->down_exps, "blk.%d.ffn_down_exps.weight", true, false, F, E, X);
        if (d->expert_bias) {
            B(&L->gate_exps_b, "blk.%d.ffn_gate_exps.bias", true, true, F, X);
            B(&L->up_exps_b, "blk.%d.ffn_up_exps.bias", true, true, F, X);
            B(&L->down_exps_b, "blk.%d.ffn_down_exps.bias", true, true, E, X);
        }
        if (d->shared_expert) {
            B(&L->sh_gate, "blk.%d.ffn_gate_shexp.weight", true, false, E, S);
            B(&L->sh_up, "blk.%d.ffn_up_shexp.weight", true, false, E, S);
            B(&L->sh_down, "blk.%d.ffn_down_shexp.weight", true, false, S, E);
            B(&L->sh_gate_inp, "blk.%d.ffn_gate_inp_shexp.weight", true, true, E);
        }
    }
    /* qwen35moe's MTP blocks: their nextn tensors are checked and mapped, never run */
    b.f32_weights = false;
    for (il = (int)hp->n_layer; il < hp->n_layer + hp->n_nextn && st == HM_OK; il++) {
        hm_tensor eh, en, hn;
        B(&eh, "blk.%d.nextn.eh_proj.weight", true, false, 2 * E, E);
        B(&en, "blk.%d.nextn.enorm.weight", true, false, E);
        B(&hn, "blk.%d.nextn.hnorm.weight", true, false, E);
    }
#undef B
    return st;
}

hm_status hm_model_load_gguf(gguf_ctx *g, const hm_model_params *params, hm_model **out,
                             hm_error *err) {
    *out = NULL;
    hm_model_params p = params ? *params : hm_model_default_params();
    hm_model *m = calloc(1, sizeof(*m));
    if (!m) {
        gguf_close(g);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    }
    m->g = g;
    gguf_str arch;
    hm_status st = gguf_get_str(g, "general.architecture", &arch, err);
    if (st == HM_OK) {
        m->desc = hm_arch_find(arch.data, (size_t)arch.len);
        if (!m->desc)
            st = hm_error_set(err, HM_ERR_UNSUPPORTED, "unsupported architecture '%.*s' "
                              "(supported: %s)", (int)(arch.len > 64 ? 64 : arch.len), arch.data,
                              hm_arch_supported_list());
    }
    if (st == HM_OK) st = read_hparams(m, err);
    if (st == HM_OK) st = bind_all(m, p.f32_weights, err);
    uint64_t x8_extra = 0; /* RAM the repacking needs beyond the weights */
    const uint64_t x8_bytes = st == HM_OK && p.repack ? model_repack_bytes(m, &x8_extra) : 0;
    if (st == HM_OK && p.check_ram) {
        uint64_t ram = hm_ram_bytes();
        if (ram && m->weight_bytes + x8_extra > ram) {
            char b1[32], b2[32];
            st = hm_error_set(err, HM_ERR_NOMEM, "model needs %s of RAM for its weights%s but "
                              "this machine has %s", hm_bytes_str(m->weight_bytes + x8_extra, b1),
                              x8_bytes ? " and repacking them (--repack)" : "",
                              hm_bytes_str(ram, b2));
        }
    }
    if (st == HM_OK && x8_bytes) st = model_repack(m, err);
    if (st != HM_OK) {
        hm_model_free(m);
        return st;
    }
    *out = m;
    return HM_OK;
}

hm_status hm_model_load(const char *path, const hm_model_params *params, hm_model **out,
                        hm_error *err) {
    *out = NULL;
    gguf_ctx *g = NULL;
    hm_status st = gguf_open(path, &g, err);
    if (st != HM_OK) return st;
    return hm_model_load_gguf(g, params, out, err);
}

void hm_model_free(hm_model *m) {
    if (!m) return;
    gguf_close(m->g);
    free(m->layers);
    free(m->swa);
    free(m->owned);
    for (int i = 0; i < m->n_f32_copies; i++) free(m->f32_copies[i]);
    free(m->f32_copies);
    model_repack_free(m);
    free(m);
}

const hm_arch_desc *hm_model_arch(const hm_model *m) { return m->desc; }
const hm_hparams *hm_model_hparams(const hm_model *m) { return &m->hp; }
const hm_layer *hm_model_layer(const hm_model *m, int il) {
    return il >= 0 && il < m->hp.n_layer ? &m->layers[il] : NULL;
}
const gguf_ctx *hm_model_gguf(const hm_model *m) { return m->g; }
uint64_t hm_model_weight_bytes(const hm_model *m) { return m->weight_bytes; }
bool hm_model_fused_gate_up(const hm_model *m) {
    for (int il = 0; il < m->hp.n_layer; il++)
        if (m->layers[il].gate_exps.expert_stride) return true;
    return false;
}

const hm_tensor *hm_model_tok_embd(const hm_model *m) { return &m->tok_embd; }
const hm_tensor *hm_model_output_norm(const hm_model *m) { return &m->output_norm; }
const hm_tensor *hm_model_output(const hm_model *m) { return &m->output; }
const hm_tensor *hm_model_rope_freqs(const hm_model *m) { return &m->rope_freqs; }
