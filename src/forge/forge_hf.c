/* forge_hf.c - the HuggingFace copy of a forged model: model.safetensors (f32), config.json,
 * generation_config.json; the tokenizer files are written by forge_hf_tok.c.
 *
 * DESIGN: the HF copy is made from the GGUF just written: it is re-opened with gguf_open and
 * every tensor is dequantised with quant_dequantize_row, then rearranged into transformers'
 * names and layouts (forge_hf_map.c). So the HF weights are exactly the values llama.cpp (and
 * hotmoe) compute with, and a reference run in transformers computes the same function.
 * safetensors: 8-byte little-endian header length, a JSON header (dtype, shape, data_offsets,
 * padded with spaces to a multiple of 8), then the raw little-endian data in header order.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json.h"
#include "forge/forge.h"
#include "forge/forge_hf_internal.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

static hm_status deq_rows(const gguf_tensor *gt, int64_t row0, int64_t nrows, float *dst) {
    const size_t rs = hm_row_size(gt->type, gt->ne[0]);
    const uint8_t *src = (const uint8_t *)gt->data + (size_t)row0 * rs;
    for (int64_t r = 0; r < nrows; r++) {
        hm_status st = quant_dequantize_row(gt->type, src + (size_t)r * rs, dst + r * gt->ne[0], gt->ne[0]);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

static int64_t rows_of(const gguf_tensor *gt) { return gt->ne[1] * gt->ne[2] * gt->ne[3]; }

/* Evaluates one HF tensor into dst (forge_hf_nelem(h) floats). */
static hm_status hf_fill(const forge_hf_tensor *h, const gguf_tensor *const *src, float *dst, hm_error *err) {
    const bool two = h->op == FH_GATE_UP || h->op == FH_GATE_UP_B || h->op == FH_QKVZ ||
                     h->op == FH_CAT_GU;
    const gguf_tensor *a = src[h->src], *b = two ? src[h->src2] : NULL;
    hm_status st = HM_OK;
    float *tmp = NULL, *tmp2 = NULL;
    switch (h->op) {
    case FH_COPY: st = deq_rows(a, 0, rows_of(a), dst); break;
    case FH_SLICE: st = deq_rows(a, h->expert * a->ne[1], a->ne[1], dst); break;
    case FH_UNPERMUTE: {
        const int64_t n = a->ne[0], R = a->ne[1], D = R / h->n_heads;
        tmp = malloc((size_t)(n * R) * sizeof(float));
        if (!tmp) break;
        st = deq_rows(a, 0, R, tmp);
        for (int64_t hh = 0; hh < h->n_heads; hh++)
            for (int64_t i = 0; i < D / 2; i++)
                for (int64_t j = 0; j < 2; j++)
                    memcpy(dst + (hh * D + j * (D / 2) + i) * n, tmp + (hh * D + 2 * i + j) * n, (size_t)n * sizeof(float));
        break;
    }
    case FH_GATE_UP: {
        const int64_t E = a->ne[0], F = a->ne[1], X = a->ne[2];
        tmp = malloc((size_t)(E * F) * sizeof(float));
        tmp2 = malloc((size_t)(E * F) * sizeof(float));
        if (!tmp || !tmp2) break;
        for (int64_t e = 0; e < X && st == HM_OK; e++) {
            st = deq_rows(a, e * F, F, tmp);
            if (st == HM_OK) st = deq_rows(b, e * F, F, tmp2);
            float *o = dst + e * E * 2 * F;
            for (int64_t f = 0; f < F; f++)
                for (int64_t c = 0; c < E; c++) {
                    o[c * 2 * F + 2 * f] = tmp[f * E + c];
                    o[c * 2 * F + 2 * f + 1] = tmp2[f * E + c];
                }
        }
        break;
    }
    case FH_GATE_UP_B: {
        const int64_t F = a->ne[0], X = a->ne[1];
        tmp = malloc((size_t)(F * X) * sizeof(float));
        tmp2 = malloc((size_t)(F * X) * sizeof(float));
        if (!tmp || !tmp2) break;
        st = deq_rows(a, 0, X, tmp);
        if (st == HM_OK) st = deq_rows(b, 0, X, tmp2);
        for (int64_t e = 0; e < X; e++)
            for (int64_t f = 0; f < F; f++) {
                dst[e * 2 * F + 2 * f] = tmp[e * F + f];
                dst[e * 2 * F + 2 * f + 1] = tmp2[e * F + f];
            }
        break;
    }
    case FH_MINUS1: /* qwen3next's zero-centred norms: HF holds w - 1 (exact near 1) */
    case FH_A_LOG: { /* A_log = ln(-ssm_a) */
        const int64_t n = a->ne[0] * rows_of(a);
        st = deq_rows(a, 0, rows_of(a), dst);
        for (int64_t i = 0; i < n && st == HM_OK; i++)
            dst[i] = h->op == FH_MINUS1 ? dst[i] - 1.0f : (float)log(-(double)dst[i]);
        break;
    }
    case FH_QKVZ: { /* per key head g: [q_g, k_g, v_g, z_g] from attn_qkv [q | k | v], attn_gate */
        const int64_t E = a->ne[0], G = h->n_heads, dk = h->grp_qk, dv = h->grp_vz;
        tmp = malloc((size_t)(E * a->ne[1]) * sizeof(float));
        tmp2 = malloc((size_t)(E * b->ne[1]) * sizeof(float));
        if (!tmp || !tmp2) break;
        st = deq_rows(a, 0, a->ne[1], tmp);
        if (st == HM_OK) st = deq_rows(b, 0, b->ne[1], tmp2);
        const size_t rb = (size_t)E * sizeof(float);
        for (int64_t g = 0; g < G && st == HM_OK; g++) {
            float *o = dst + g * (2 * dk + 2 * dv) * E;
            memcpy(o, tmp + g * dk * E, (size_t)dk * rb);
            memcpy(o + dk * E, tmp + (G * dk + g * dk) * E, (size_t)dk * rb);
            memcpy(o + 2 * dk * E, tmp + (2 * G * dk + g * dv) * E, (size_t)dv * rb);
            memcpy(o + (2 * dk + dv) * E, tmp2 + g * dv * E, (size_t)dv * rb);
        }
        break;
    }
    case FH_VROWS: /* qwen35moe: value heads from llama.cpp's tiled order to the grouped one */
    case FH_VCOLS:
    case FH_VCOLS_ALOG: {
        const int64_t n = a->ne[0], R = rows_of(a), hd = h->v_hd, nh = h->v_nk * h->v_r;
        tmp = malloc((size_t)(n * R) * sizeof(float));
        if (!tmp) break;
        st = deq_rows(a, 0, R, tmp);
        memcpy(dst, tmp, (size_t)(n * R) * sizeof(float));
        for (int64_t hi = 0; hi < nh; hi++) { /* HF head g r + jj <- GGUF head jj nk + g */
            const int64_t gi = (hi % h->v_r) * h->v_nk + hi / h->v_r;
            if (h->op == FH_VROWS)
                memcpy(dst + (h->v_off + hi * hd) * n, tmp + (h->v_off + gi * hd) * n,
                       (size_t)(hd * n) * sizeof(float));
            else
                for (int64_t r = 0; r < R; r++)
                    memcpy(dst + r * n + h->v_off + hi * hd, tmp + r * n + h->v_off + gi * hd,
                           (size_t)hd * sizeof(float));
        }
        if (h->op == FH_VCOLS_ALOG)
            for (int64_t i = 0; i < n * R; i++) dst[i] = (float)log(-(double)dst[i]);
        break;
    }
    case FH_CAT_GU: { /* per expert: its gate rows, then its up rows */
        const int64_t E = a->ne[0], F = a->ne[1], X = a->ne[2];
        tmp = tmp2 = NULL;
        for (int64_t e = 0; e < X && st == HM_OK; e++) {
            st = deq_rows(a, e * F, F, dst + e * 2 * F * E);
            if (st == HM_OK) st = deq_rows(b, e * F, F, dst + (e * 2 + 1) * F * E);
        }
        break;
    }
    case FH_DOWN_T: {
        const int64_t F = a->ne[0], E = a->ne[1], X = a->ne[2];
        tmp = malloc((size_t)(F * E) * sizeof(float));
        if (!tmp) break;
        for (int64_t e = 0; e < X && st == HM_OK; e++) {
            st = deq_rows(a, e * E, E, tmp);
            float *o = dst + e * F * E;
            for (int64_t c = 0; c < E; c++)
                for (int64_t f = 0; f < F; f++) o[f * E + c] = tmp[c * F + f];
        }
        break;
    }
    }
    bool oom = h->op != FH_COPY && h->op != FH_SLICE && h->op != FH_MINUS1 && h->op != FH_A_LOG &&
               h->op != FH_CAT_GU && (!tmp || (two && !tmp2));
    free(tmp);
    free(tmp2);
    if (oom) return hm_error_set(err, HM_ERR_NOMEM, "out of memory converting %s", h->name);
    if (st != HM_OK) return hm_error_set(err, st, "cannot dequantise the source of %s", h->name);
    return HM_OK;
}

static hm_status write_safetensors(const char *path, const forge_hf_tensor *hs, int n,
                                   const gguf_tensor *const *src, hm_error *err) {
    hm_json j;
    hm_json_init_buf(&j, false);
    hm_json_obj_begin(&j);
    hm_json_key(&j, "__metadata__");
    hm_json_obj_begin(&j);
    hm_json_kstr(&j, "format", "pt");
    hm_json_obj_end(&j);
    uint64_t off = 0;
    int64_t max_n = 0;
    for (int i = 0; i < n; i++) {
        int64_t ne = forge_hf_nelem(&hs[i]);
        if (ne > max_n) max_n = ne;
        hm_json_key(&j, hs[i].name);
        hm_json_obj_begin(&j);
        hm_json_kstr(&j, "dtype", "F32");
        hm_json_key(&j, "shape");
        hm_json_arr_begin(&j);
        for (int d = 0; d < hs[i].n_dims; d++) hm_json_int(&j, hs[i].shape[d]);
        hm_json_arr_end(&j);
        hm_json_key(&j, "data_offsets");
        hm_json_arr_begin(&j);
        hm_json_int(&j, (long long)off);
        off += (uint64_t)ne * 4;
        hm_json_int(&j, (long long)off);
        hm_json_arr_end(&j);
        hm_json_obj_end(&j);
    }
    hm_json_obj_end(&j);
    hm_status st = hm_json_finish(&j, err);
    if (st != HM_OK) { hm_json_free(&j); return st; }
    size_t hlen;
    const char *hdr = hm_json_data(&j, &hlen);
    static const char spaces[8] = "       ";
    size_t pad = (8 - hlen % 8) % 8; /* the header is padded with spaces to a multiple of 8 */
    float *buf = malloc((size_t)max_n * sizeof(float));
    FILE *f = fopen(path, "wb");
    if (!buf) st = hm_error_set(err, HM_ERR_NOMEM, "out of memory for a %lld-element tensor", (long long)max_n);
    else if (!f) st = hm_error_set(err, HM_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    if (st == HM_OK) {
        uint8_t len[8];
        for (int k = 0; k < 8; k++) len[k] = (uint8_t)((uint64_t)(hlen + pad) >> (8 * k));
        if (fwrite(len, 1, 8, f) != 8 || fwrite(hdr, 1, hlen, f) != hlen || fwrite(spaces, 1, pad, f) != pad)
            st = hm_error_set(err, HM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    for (int i = 0; i < n && st == HM_OK; i++) {
        int64_t ne = forge_hf_nelem(&hs[i]);
        st = hf_fill(&hs[i], src, buf, err);
        if (st == HM_OK && fwrite(buf, sizeof(float), (size_t)ne, f) != (size_t)ne)
            st = hm_error_set(err, HM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    if (f && fclose(f) != 0 && st == HM_OK) st = hm_error_set(err, HM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    if (st != HM_OK && f) remove(path);
    free(buf);
    hm_json_free(&j);
    return st;
}

/* ---- config.json ---- */

static void config_common(hm_json *j, const forge_preset *p, const forge_vocab *v) {
    hm_json_kint(j, "vocab_size", p->n_vocab);
    hm_json_kint(j, "hidden_size", p->n_embd);
    hm_json_kint(j, "num_hidden_layers", p->n_layer);
    hm_json_kint(j, "num_attention_heads", p->n_head);
    hm_json_kint(j, "num_key_value_heads", p->n_head_kv);
    hm_json_kint(j, "head_dim", p->head_dim);
    hm_json_kint(j, "max_position_embeddings", p->n_ctx);
    hm_json_kdouble(j, "rms_norm_eps", p->rms_eps);
    hm_json_kdouble(j, "rope_theta", p->rope_base);
    hm_json_kstr(j, "hidden_act", "silu");
    hm_json_kdouble(j, "initializer_range", 0.02);
    hm_json_kbool(j, "tie_word_embeddings", false);
    hm_json_kbool(j, "use_cache", true);
    hm_json_kdouble(j, "attention_dropout", 0.0);
    hm_json_kbool(j, "output_router_logits", false);
    if (v->bos >= 0) hm_json_kint(j, "bos_token_id", v->bos); else hm_json_knull(j, "bos_token_id");
    hm_json_kint(j, "eos_token_id", v->eos);
    if (v->pad >= 0) hm_json_kint(j, "pad_token_id", v->pad);
    hm_json_kstr(j, "torch_dtype", "float32");
}

/* gemma4: Gemma4TextConfig's keys (google/gemma-4-26B-A4B's text_config, flat, as
 * AutoModelForCausalLM maps model_type gemma4_text to Gemma4ForCausalLM) */
static void config_json_gemma4(hm_json *j, const forge_preset *p, const forge_vocab *v) {
    hm_json_obj_begin(j);
    hm_json_key(j, "architectures");
    hm_json_arr_begin(j);
    hm_json_str(j, "Gemma4ForCausalLM");
    hm_json_arr_end(j);
    hm_json_kstr(j, "model_type", "gemma4_text");
    hm_json_kint(j, "vocab_size", p->n_vocab);
    hm_json_kint(j, "hidden_size", p->n_embd);
    hm_json_kint(j, "intermediate_size", p->n_ff);
    hm_json_kint(j, "num_hidden_layers", p->n_layer);
    hm_json_kint(j, "num_attention_heads", p->n_head);
    hm_json_kint(j, "num_key_value_heads", p->n_head_kv);
    hm_json_kint(j, "num_global_key_value_heads", p->n_head_kv_full);
    hm_json_kint(j, "head_dim", p->head_dim);
    hm_json_kint(j, "global_head_dim", p->head_dim_full);
    hm_json_kstr(j, "hidden_activation", "gelu_pytorch_tanh");
    hm_json_kint(j, "max_position_embeddings", p->n_ctx);
    hm_json_kdouble(j, "rms_norm_eps", p->rms_eps);
    hm_json_kbool(j, "tie_word_embeddings", true);
    hm_json_kbool(j, "attention_bias", false);
    hm_json_kdouble(j, "attention_dropout", 0.0);
    hm_json_kint(j, "sliding_window", p->sliding_window);
    hm_json_key(j, "layer_types");
    hm_json_arr_begin(j);
    for (int l = 0; l < (int)p->n_layer; l++)
        hm_json_str(j, forge_layer_swa(p, l) ? "sliding_attention" : "full_attention");
    hm_json_arr_end(j);
    hm_json_key(j, "rope_parameters");
    hm_json_obj_begin(j);
    hm_json_key(j, "full_attention");
    hm_json_obj_begin(j);
    hm_json_kstr(j, "rope_type", "proportional");
    hm_json_kdouble(j, "partial_rotary_factor", (double)forge_preset_n_rot(p) / (double)p->head_dim_full);
    hm_json_kdouble(j, "rope_theta", p->rope_base_full);
    hm_json_obj_end(j);
    hm_json_key(j, "sliding_attention");
    hm_json_obj_begin(j);
    hm_json_kstr(j, "rope_type", "default");
    hm_json_kdouble(j, "rope_theta", p->rope_base);
    hm_json_obj_end(j);
    hm_json_obj_end(j);
    hm_json_kdouble(j, "final_logit_softcapping", p->softcap);
    hm_json_kbool(j, "attention_k_eq_v", true);
    hm_json_kint(j, "num_kv_shared_layers", 0);
    hm_json_kint(j, "hidden_size_per_layer_input", 0);
    hm_json_kint(j, "vocab_size_per_layer_input", p->n_vocab);
    hm_json_kbool(j, "use_double_wide_mlp", false);
    hm_json_kbool(j, "enable_moe_block", true);
    hm_json_kint(j, "num_experts", p->n_expert);
    hm_json_kint(j, "top_k_experts", p->n_expert_used);
    hm_json_kint(j, "moe_intermediate_size", p->n_ff_exp);
    hm_json_kbool(j, "use_cache", true);
    hm_json_kdouble(j, "initializer_range", 0.02);
    if (v->bos >= 0) hm_json_kint(j, "bos_token_id", v->bos);
    hm_json_kint(j, "eos_token_id", v->eos);
    if (v->pad >= 0) hm_json_kint(j, "pad_token_id", v->pad);
    hm_json_kstr(j, "torch_dtype", "float32");
    hm_json_obj_end(j);
}

/* The delta net's shape keys of the hybrids' configs (Qwen3NextConfig, Qwen3_5MoeTextConfig). */
static void put_linear_keys(hm_json *j, const forge_preset *p) {
    hm_json_kint(j, "linear_conv_kernel_dim", p->ssm_conv_kernel);
    hm_json_kint(j, "linear_key_head_dim", p->ssm_head_k);
    hm_json_kint(j, "linear_value_head_dim", p->ssm_head_v);
    hm_json_kint(j, "linear_num_key_heads", p->ssm_n_k_heads);
    hm_json_kint(j, "linear_num_value_heads", p->ssm_n_v_heads);
}

static void config_json(hm_json *j, const forge_preset *p, const forge_vocab *v) {
    if (p->arch == FORGE_ARCH_GEMMA4) {
        config_json_gemma4(j, p, v);
        return;
    }
    static const char *const cls[FORGE_ARCH_COUNT] = {"Qwen3MoeForCausalLM", "MixtralForCausalLM",
                                                      "OlmoeForCausalLM", "GptOssForCausalLM",
                                                      "Qwen2MoeForCausalLM", "Qwen3NextForCausalLM",
                                                      "Qwen3_5MoeForCausalLM", "Gemma4ForCausalLM"};
    /* qwen35moe: the text model's own config (Qwen3_5MoeTextConfig), flat, as
     * AutoModelForCausalLM maps it to Qwen3_5MoeForCausalLM; the published checkpoints nest it
     * as text_config of a Qwen3_5MoeConfig beside the vision tower */
    static const char *const type[FORGE_ARCH_COUNT] = {"qwen3_moe", "mixtral", "olmoe", "gpt_oss", "qwen2_moe",
                                                       "qwen3_next", "qwen3_5_moe_text", "gemma4_text"};
    hm_json_obj_begin(j);
    hm_json_key(j, "architectures");
    hm_json_arr_begin(j);
    hm_json_str(j, cls[p->arch]);
    hm_json_arr_end(j);
    hm_json_kstr(j, "model_type", type[p->arch]);
    config_common(j, p, v);
    switch (p->arch) {
    case FORGE_ARCH_QWEN3MOE:
    case FORGE_ARCH_QWEN2MOE:
        hm_json_kint(j, "intermediate_size", p->n_ff);
        hm_json_kint(j, "moe_intermediate_size", p->n_ff_exp);
        if (p->arch == FORGE_ARCH_QWEN2MOE) hm_json_kint(j, "shared_expert_intermediate_size", p->n_ff_shexp);
        hm_json_kint(j, "num_experts", p->n_expert);
        hm_json_kint(j, "num_experts_per_tok", p->n_expert_used);
        hm_json_kbool(j, "norm_topk_prob", p->arch == FORGE_ARCH_QWEN3MOE);
        hm_json_kint(j, "decoder_sparse_step", 1);
        hm_json_key(j, "mlp_only_layers");
        hm_json_arr_begin(j);
        hm_json_arr_end(j);
        hm_json_kbool(j, "use_sliding_window", false);
        hm_json_knull(j, "sliding_window");
        hm_json_kint(j, "max_window_layers", p->n_layer);
        if (p->arch == FORGE_ARCH_QWEN3MOE) hm_json_kbool(j, "attention_bias", false);
        else hm_json_kbool(j, "qkv_bias", true); /* Qwen2Moe: q/k/v biases, none on o_proj */
        hm_json_knull(j, "rope_scaling");
        hm_json_kdouble(j, "router_aux_loss_coef", 0.001);
        break;
    case FORGE_ARCH_LLAMA:
        hm_json_kint(j, "intermediate_size", p->n_ff);
        hm_json_kint(j, "num_local_experts", p->n_expert);
        hm_json_kint(j, "num_experts_per_tok", p->n_expert_used);
        hm_json_knull(j, "sliding_window");
        hm_json_kdouble(j, "router_aux_loss_coef", 0.02);
        hm_json_kdouble(j, "router_jitter_noise", 0.0);
        break;
    case FORGE_ARCH_OLMOE:
        hm_json_kint(j, "intermediate_size", p->n_ff);
        hm_json_kint(j, "num_experts", p->n_expert);
        hm_json_kint(j, "num_experts_per_tok", p->n_expert_used);
        hm_json_kbool(j, "norm_topk_prob", false);
        hm_json_knull(j, "clip_qkv");
        hm_json_kbool(j, "attention_bias", false);
        hm_json_knull(j, "rope_scaling");
        hm_json_kdouble(j, "router_aux_loss_coef", 0.01);
        break;
    case FORGE_ARCH_GPTOSS:
        hm_json_kint(j, "intermediate_size", p->n_ff_exp);
        hm_json_kint(j, "num_local_experts", p->n_expert);
        hm_json_kint(j, "num_experts_per_tok", p->n_expert_used);
        hm_json_kint(j, "experts_per_token", p->n_expert_used);
        hm_json_kint(j, "sliding_window", p->sliding_window);
        hm_json_key(j, "layer_types");
        hm_json_arr_begin(j);
        for (int64_t l = 0; l < p->n_layer; l++) hm_json_str(j, l % 2 == 0 ? "sliding_attention" : "full_attention");
        hm_json_arr_end(j);
        hm_json_key(j, "rope_scaling");
        hm_json_obj_begin(j);
        hm_json_kstr(j, "rope_type", "yarn");
        hm_json_kdouble(j, "factor", p->yarn_factor);
        hm_json_kdouble(j, "beta_fast", 32.0);
        hm_json_kdouble(j, "beta_slow", 1.0);
        hm_json_kbool(j, "truncate", false);
        hm_json_kint(j, "original_max_position_embeddings", p->yarn_orig_ctx);
        hm_json_obj_end(j);
        hm_json_kbool(j, "attention_bias", true);
        hm_json_kdouble(j, "swiglu_limit", 7.0);
        hm_json_kdouble(j, "router_aux_loss_coef", 0.9);
        break;
    case FORGE_ARCH_QWEN3NEXT: /* the keys of Qwen3-Next-80B-A3B-Instruct's config.json */
        hm_json_kint(j, "intermediate_size", p->n_ff);
        hm_json_kint(j, "moe_intermediate_size", p->n_ff_exp);
        hm_json_kint(j, "shared_expert_intermediate_size", p->n_ff_shexp);
        hm_json_kint(j, "num_experts", p->n_expert);
        hm_json_kint(j, "num_experts_per_tok", p->n_expert_used);
        hm_json_kbool(j, "norm_topk_prob", true);
        hm_json_kint(j, "decoder_sparse_step", 1);
        hm_json_key(j, "mlp_only_layers");
        hm_json_arr_begin(j);
        hm_json_arr_end(j);
        hm_json_kint(j, "full_attention_interval", 4);
        hm_json_kdouble(j, "partial_rotary_factor",
                        (double)forge_preset_n_rot(p) / (double)p->head_dim);
        put_linear_keys(j, p);
        hm_json_kbool(j, "attention_bias", false);
        hm_json_kbool(j, "use_sliding_window", false);
        hm_json_knull(j, "rope_scaling");
        hm_json_kdouble(j, "router_aux_loss_coef", 0.001);
        break;
    case FORGE_ARCH_QWEN35MOE: /* Qwen3.5-35B-A3B's text_config keys (no intermediate_size,
                                  norm_topk_prob, decoder_sparse_step: the class deletes them) */
        hm_json_kint(j, "moe_intermediate_size", p->n_ff_exp);
        hm_json_kint(j, "shared_expert_intermediate_size", p->n_ff_shexp);
        hm_json_kint(j, "num_experts", p->n_expert);
        hm_json_kint(j, "num_experts_per_tok", p->n_expert_used);
        hm_json_key(j, "layer_types");
        hm_json_arr_begin(j);
        for (int l = 0; l < (int)p->n_layer; l++)
            hm_json_str(j, forge_layer_recurrent(p, l) ? "linear_attention" : "full_attention");
        hm_json_arr_end(j);
        hm_json_kint(j, "full_attention_interval", 4);
        hm_json_kdouble(j, "partial_rotary_factor",
                        (double)forge_preset_n_rot(p) / (double)p->head_dim);
        hm_json_key(j, "rope_parameters");
        hm_json_obj_begin(j);
        hm_json_kstr(j, "rope_type", "default");
        hm_json_kdouble(j, "rope_theta", p->rope_base);
        hm_json_kdouble(j, "partial_rotary_factor",
                        (double)forge_preset_n_rot(p) / (double)p->head_dim);
        hm_json_key(j, "mrope_section");
        hm_json_arr_begin(j);
        for (int k = 0; k < 3; k++) hm_json_int(j, p->rope_sections[k]);
        hm_json_arr_end(j);
        hm_json_kbool(j, "mrope_interleaved", true);
        hm_json_obj_end(j);
        put_linear_keys(j, p);
        hm_json_kbool(j, "attention_bias", false);
        hm_json_kdouble(j, "router_aux_loss_coef", 0.001);
        /* the published config's count, whether or not the weights hold mtp.* */
        hm_json_kint(j, "mtp_num_hidden_layers", p->n_nextn);
        break;
    default: break;
    }
    hm_json_obj_end(j);
}

static hm_status write_json(const char *dir, const char *name, hm_json *j, hm_error *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    hm_status st = hm_json_write_file(j, path, err);
    hm_json_free(j);
    return st;
}

hm_status forge_write_hf(const forge_job *job, hm_error *err) {
    const forge_preset *p = job->preset;
    if (mkdir(job->hf_dir, 0777) != 0 && errno != EEXIST)
        return hm_error_set(err, HM_ERR_IO, "cannot create directory %s: %s", job->hf_dir, strerror(errno));
    forge_tensor_list l = {0};
    forge_vocab v = {0};
    forge_hf_tensor *hs = NULL;
    const gguf_tensor **src = NULL;
    gguf_ctx *g = NULL;
    int nh = 0;
    hm_status st = forge_tensors_build(p, job->mix, &l, err);
    if (st == HM_OK) st = forge_vocab_build(p, &v, err);
    const forge_hf_opts ho = {.mtp = job->hf_mtp};
    if (job->hf_mtp && p->arch == FORGE_ARCH_QWEN35MOE && p->n_nextn > 1)
        st = hm_error_set(err, HM_ERR_ARG, "%s: the HF copy's mtp.* holds one MTP block, not %lld",
                          p->name, (long long)p->n_nextn);
    if (st == HM_OK) st = forge_hf_plan_opts(p, &l, &ho, &hs, &nh, err);
    if (st == HM_OK) st = gguf_open(job->out_path, &g, err);
    if (st == HM_OK && !(src = calloc((size_t)l.n, sizeof(*src))))
        st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    for (int i = 0; st == HM_OK && i < l.n; i++) {
        src[i] = gguf_find_tensor(g, l.t[i].name);
        if (!src[i] || src[i]->type != l.t[i].type || src[i]->ne[0] != l.t[i].ne[0] ||
            src[i]->ne[1] != l.t[i].ne[1] || src[i]->ne[2] != l.t[i].ne[2])
            st = hm_error_set(err, HM_ERR_FORMAT, "%s: tensor %s is missing or differs from the forged layout",
                              job->out_path, l.t[i].name);
    }
    char path[4096];
    if (st == HM_OK) {
        snprintf(path, sizeof(path), "%s/model.safetensors", job->hf_dir);
        st = write_safetensors(path, hs, nh, src, err);
    }
    hm_json j;
    if (st == HM_OK) { hm_json_init_buf(&j, true); config_json(&j, p, &v); st = write_json(job->hf_dir, "config.json", &j, err); }
    if (st == HM_OK) {
        hm_json_init_buf(&j, true);
        hm_json_obj_begin(&j);
        if (v.bos >= 0) hm_json_kint(&j, "bos_token_id", v.bos);
        hm_json_kint(&j, "eos_token_id", v.eos);
        if (v.pad >= 0) hm_json_kint(&j, "pad_token_id", v.pad);
        hm_json_kbool(&j, "do_sample", false);
        hm_json_obj_end(&j);
        st = write_json(job->hf_dir, "generation_config.json", &j, err);
    }
    if (st == HM_OK) st = forge_hf_write_tokenizer(job->hf_dir, p, &v, err);
    gguf_close(g);
    free(src);
    free(hs);
    forge_vocab_free(&v);
    forge_tensors_free(&l);
    return st;
}
