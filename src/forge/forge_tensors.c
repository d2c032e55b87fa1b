/* forge_tensors.c - the tensor list of each architecture as llama.cpp's loader requires it
 * (src/models/<arch>.cpp load_arch_tensors: names, ggml shapes) and the ggml type of each
 * tensor under a type mix.
 *
 * DESIGN: one builder appends tensors in the converter's order (token_embd, blk.0 ... blk.N-1,
 * output_norm, output). Types follow llama.cpp: convert_hf_to_gguf keeps 1-D tensors and the
 * router (ffn_gate_inp) in f32; llama-quant.cpp's llama_tensor_get_type picks the Q4_K_M types
 * (Q6_K output; Q6_K attn_v / ffn_down on use_more_bits layers; Q8_0 attn_v/attn_k and Q5_K
 * attn_output when n_expert == 8) and falls back (q4_K->q5_0, q5_K->q5_1, q6_K->q8_0) when a
 * row is not a multiple of 256. MXFP4_MOE puts 3-D expert tensors in mxfp4, the rest in q8_0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forge/forge.h"
#include "quant/qtypes.h"

typedef struct {
    forge_tensor_list *l;
    int cap;
    bool oom;
} builder;

static forge_tensor *add(builder *b, forge_role role, int layer, const char *fmt_suffix,
                         uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2) {
    if (b->oom) return NULL;
    if (b->l->n == b->cap) {
        int nc = b->cap ? b->cap * 2 : 64;
        forge_tensor *nt = realloc(b->l->t, (size_t)nc * sizeof(*nt));
        if (!nt) { b->oom = true; return NULL; }
        b->l->t = nt;
        b->cap = nc;
    }
    forge_tensor *t = &b->l->t[b->l->n++];
    memset(t, 0, sizeof(*t));
    if (layer >= 0) snprintf(t->name, sizeof(t->name), "blk.%d.%s", layer, fmt_suffix);
    else snprintf(t->name, sizeof(t->name), "%s", fmt_suffix);
    t->role = role;
    t->layer = layer;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->ne[2] = n_dims > 2 ? ne2 : 1;
    t->ne[3] = 1;
    return t;
}

#define T1(role, suf, a) add(b, role, il, suf, 1, a, 1, 1)
#define T2(role, suf, a, c) add(b, role, il, suf, 2, a, c, 1)
#define T3(role, suf, a, c, d) add(b, role, il, suf, 3, a, c, d)

/* A qwen3next layer (llama.cpp's qwen3next loader: a gated delta-net layer's attn_qkv,
 * attn_gate, ssm_*, or a full-attention layer's attn_q of twice the query width, per-head q/k
 * norms; then post_attention_norm, the router, the experts and the gated shared expert). */
static void build_layer_qwen3next(builder *b, const forge_preset *p, int il) {
    const int64_t E = p->n_embd, nq = p->n_head * p->head_dim, nkv = p->n_head_kv * p->head_dim;
    const int64_t X = p->n_expert, F = p->n_ff_exp, S = p->n_ff_shexp;
    const int64_t kd = p->ssm_n_k_heads * p->ssm_head_k, vd = p->ssm_n_v_heads * p->ssm_head_v;
    T1(FR_NORM, "attn_norm.weight", E);
    if (forge_layer_recurrent(p, il)) {
        T2(FR_SSM_QKV, "attn_qkv.weight", E, 2 * kd + vd);
        T2(FR_SSM_GATE, "attn_gate.weight", E, vd);
        if (p->arch == FORGE_ARCH_QWEN35MOE) { /* separate b and a (value heads tiled) */
            T2(FR_SSM_BETA, "ssm_beta.weight", E, p->ssm_n_v_heads);
            T2(FR_SSM_ALPHA, "ssm_alpha.weight", E, p->ssm_n_v_heads);
        } else {
            T2(FR_SSM_BA, "ssm_ba.weight", E, 2 * p->ssm_n_v_heads);
        }
        T2(FR_SSM_CONV, "ssm_conv1d.weight", p->ssm_conv_kernel, 2 * kd + vd);
        T1(FR_SSM_DT, "ssm_dt.bias", p->ssm_n_v_heads);
        T1(FR_SSM_A, "ssm_a", p->ssm_n_v_heads);
        T1(FR_SSM_NORM, "ssm_norm.weight", p->ssm_head_v);
        T2(FR_SSM_OUT, "ssm_out.weight", vd, E);
    } else {
        T2(FR_ATTN_Q, "attn_q.weight", E, 2 * nq);
        T2(FR_ATTN_K, "attn_k.weight", E, nkv);
        T2(FR_ATTN_V, "attn_v.weight", E, nkv);
        T2(FR_ATTN_O, "attn_output.weight", nq, E);
        T1(FR_QK_NORM, "attn_q_norm.weight", p->head_dim);
        T1(FR_QK_NORM, "attn_k_norm.weight", p->head_dim);
    }
    T1(FR_NORM, "post_attention_norm.weight", E);
    T2(FR_ROUTER, "ffn_gate_inp.weight", E, X);
    T3(FR_EXP_GATE, "ffn_gate_exps.weight", E, F, X);
    T3(FR_EXP_UP, "ffn_up_exps.weight", E, F, X);
    T3(FR_EXP_DOWN, "ffn_down_exps.weight", F, E, X);
    T1(FR_SH_GATE_INP, "ffn_gate_inp_shexp.weight", E);
    T2(FR_SH_GATE, "ffn_gate_shexp.weight", E, S);
    T2(FR_SH_UP, "ffn_up_shexp.weight", E, S);
    T2(FR_SH_DOWN, "ffn_down_shexp.weight", S, E);
    if (il >= p->n_layer) { /* qwen35moe's MTP block: llama.cpp's nextn tensors */
        T2(FR_NEXTN_EH, "nextn.eh_proj.weight", 2 * E, E);
        T1(FR_NORM, "nextn.enorm.weight", E);
        T1(FR_NORM, "nextn.hnorm.weight", E);
        T1(FR_NORM, "nextn.shared_head_norm.weight", E);
    }
}

/* A gemma4 layer (llama.cpp's gemma4 loader, every layer an MoE layer as in Gemma 4 26B-A4B):
 * per layer kind the head size and kv heads; a full layer has no attn_v (its K is its V); the
 * dense MLP (ffn_gate/up/down) with its norms beside the router (with its input scale) and the
 * experts (with their per-expert output scales); the layer's output scalar. */
static void build_layer_gemma4(builder *b, const forge_preset *p, int il) {
    const bool swa = forge_layer_swa(p, il);
    const int64_t E = p->n_embd, hd = swa ? p->head_dim : p->head_dim_full;
    const int64_t nq = p->n_head * hd, nkv = (swa ? p->n_head_kv : p->n_head_kv_full) * hd;
    const int64_t X = p->n_expert, F = p->n_ff_exp, D = p->n_ff;
    T1(FR_NORM, "attn_norm.weight", E);
    T2(FR_ATTN_Q, "attn_q.weight", E, nq);
    T2(FR_ATTN_K, "attn_k.weight", E, nkv);
    if (swa) T2(FR_ATTN_V, "attn_v.weight", E, nkv);
    T2(FR_ATTN_O, "attn_output.weight", nq, E);
    T1(FR_QK_NORM, "attn_q_norm.weight", hd);
    T1(FR_QK_NORM, "attn_k_norm.weight", hd);
    T1(FR_NORM, "post_attention_norm.weight", E);
    T1(FR_SCALE, "layer_output_scale.weight", 1);
    T1(FR_NORM, "ffn_norm.weight", E);
    T2(FR_SH_GATE, "ffn_gate.weight", E, D);
    T2(FR_SH_UP, "ffn_up.weight", E, D);
    T2(FR_SH_DOWN, "ffn_down.weight", D, E);
    T1(FR_NORM, "post_ffw_norm.weight", E);
    T2(FR_ROUTER, "ffn_gate_inp.weight", E, X);
    T1(FR_SCALE, "ffn_gate_inp.scale", E);
    T1(FR_NORM, "pre_ffw_norm_2.weight", E);
    T1(FR_NORM, "post_ffw_norm_1.weight", E);
    T1(FR_NORM, "post_ffw_norm_2.weight", E);
    T3(FR_EXP_GATE, "ffn_gate_exps.weight", E, F, X);
    T3(FR_EXP_UP, "ffn_up_exps.weight", E, F, X);
    T3(FR_EXP_DOWN, "ffn_down_exps.weight", F, E, X);
    T1(FR_SCALE, "ffn_down_exps.scale", X);
}

static void build_layer(builder *b, const forge_preset *p, int il) {
    if (p->arch == FORGE_ARCH_GEMMA4) {
        build_layer_gemma4(b, p, il);
        return;
    }
    if (forge_arch_hybrid(p->arch)) {
        build_layer_qwen3next(b, p, il);
        return;
    }
    const int64_t E = p->n_embd, nq = p->n_head * p->head_dim, nkv = p->n_head_kv * p->head_dim;
    const int64_t X = p->n_expert, F = forge_preset_ff_exp(p);
    const forge_arch a = p->arch;
    const bool qkv_bias = a == FORGE_ARCH_GPTOSS || a == FORGE_ARCH_QWEN2MOE;

    T1(FR_NORM, "attn_norm.weight", E);
    T2(FR_ATTN_Q, "attn_q.weight", E, nq);
    if (qkv_bias) T1(FR_BIAS, "attn_q.bias", nq);
    T2(FR_ATTN_K, "attn_k.weight", E, nkv);
    if (qkv_bias) T1(FR_BIAS, "attn_k.bias", nkv);
    T2(FR_ATTN_V, "attn_v.weight", E, nkv);
    if (qkv_bias) T1(FR_BIAS, "attn_v.bias", nkv);
    T2(FR_ATTN_O, "attn_output.weight", nq, E);
    if (a == FORGE_ARCH_GPTOSS) {
        T1(FR_BIAS, "attn_output.bias", E);
        T1(FR_SINKS, "attn_sinks.weight", p->n_head);
    }
    if (a == FORGE_ARCH_QWEN3MOE) { /* per-head RMS norms */
        T1(FR_QK_NORM, "attn_q_norm.weight", p->head_dim);
        T1(FR_QK_NORM, "attn_k_norm.weight", p->head_dim);
    } else if (a == FORGE_ARCH_OLMOE) { /* over the full projection width */
        T1(FR_QK_NORM, "attn_q_norm.weight", nq);
        T1(FR_QK_NORM, "attn_k_norm.weight", nkv);
    }
    T1(FR_NORM, a == FORGE_ARCH_GPTOSS ? "post_attention_norm.weight" : "ffn_norm.weight", E);
    T2(FR_ROUTER, "ffn_gate_inp.weight", E, X);
    if (a == FORGE_ARCH_GPTOSS) T1(FR_ROUTER_BIAS, "ffn_gate_inp.bias", X);
    T3(FR_EXP_GATE, "ffn_gate_exps.weight", E, F, X);
    if (a == FORGE_ARCH_GPTOSS) T2(FR_EXP_BIAS, "ffn_gate_exps.bias", F, X);
    T3(FR_EXP_UP, "ffn_up_exps.weight", E, F, X);
    if (a == FORGE_ARCH_GPTOSS) T2(FR_EXP_BIAS, "ffn_up_exps.bias", F, X);
    T3(FR_EXP_DOWN, "ffn_down_exps.weight", F, E, X);
    if (a == FORGE_ARCH_GPTOSS) T2(FR_EXP_BIAS, "ffn_down_exps.bias", E, X);
    if (a == FORGE_ARCH_QWEN2MOE) {
        const int64_t S = p->n_ff_shexp;
        T1(FR_SH_GATE_INP, "ffn_gate_inp_shexp.weight", E);
        T2(FR_SH_GATE, "ffn_gate_shexp.weight", E, S);
        T2(FR_SH_UP, "ffn_up_shexp.weight", E, S);
        T2(FR_SH_DOWN, "ffn_down_shexp.weight", S, E);
    }
}

/* ---- types ---- */

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static uint32_t fallback(const forge_tensor *t, uint32_t type) {
    const hm_type_info *ti = hm_type_get(type);
    if (t->ne[0] % ti->block_size == 0) return type;
    uint32_t r = type;
    switch (type) {
    case HM_TYPE_Q4_K: r = HM_TYPE_Q5_0; break;
    case HM_TYPE_Q5_K: r = HM_TYPE_Q5_1; break;
    case HM_TYPE_Q6_K: r = HM_TYPE_Q8_0; break;
    case HM_TYPE_IQ4_XS: r = HM_TYPE_IQ4_NL; break;
    default: r = HM_TYPE_F16; break;
    }
    if (t->ne[0] % hm_type_get(r)->block_size != 0) r = HM_TYPE_F16;
    return r;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* The attn_v tensors before layer il and in all (llama.cpp's i_attention_wv, n_attention_wv:
 * qwen3next's every 4th layer, gemma4's sliding layers have one). */
static int attn_v_index(const forge_preset *p, int il, int *n) {
    int before = 0, all = 0;
    for (int l = 0; l < (int)p->n_layer; l++) {
        bool has = forge_arch_hybrid(p->arch) ? !forge_layer_recurrent(p, l)
                   : p->arch == FORGE_ARCH_GEMMA4 ? forge_layer_swa(p, l) : true;
        all += has;
        before += has && l < il;
    }
    *n = all;
    return before;
}

/* Mirrors llama_tensor_get_type_impl for LLAMA_FTYPE_MOSTLY_Q4_K_M (has_tied_embeddings: only
 * gemma4, whose token_embd then takes output's type; i_attention_wv counts the layers with an
 * attn_v before this one because llama.cpp visits tensors sorted by layer). */
static uint32_t q4_k_m_type(const forge_preset *p, const forge_tensor *t) {
    const char *n = t->name;
    const int nl = (int)p->n_layer;
    uint32_t ty = HM_TYPE_Q4_K;
    const bool tied = p->arch == FORGE_ARCH_GEMMA4;
    if (!strcmp(n, "output.weight") || (tied && !strcmp(n, "token_embd.weight"))) {
        ty = t->ne[0] % HM_QK_K != 0 ? HM_TYPE_Q8_0 : HM_TYPE_Q6_K;
    } else if (!strcmp(n, "token_embd.weight")) {
        /* default type */
    } else if (strstr(n, "attn_v.weight")) {
        /* counted over the layers that have one (qwen3next: every 4th; gemma4: sliding) */
        int nv = 0;
        const int iv = attn_v_index(p, t->layer, &nv);
        if (use_more_bits(iv, nv)) ty = HM_TYPE_Q6_K;
        if (p->n_expert == 8) ty = HM_TYPE_Q8_0;
    } else if (strstr(n, "attn_k.weight")) {
        if (p->n_expert == 8) ty = HM_TYPE_Q8_0;
    } else if (strstr(n, "attn_qkv.weight")) {
        ty = HM_TYPE_Q5_K; /* llama.cpp's fused-qkv rule for Q4_K_M */
    } else if (strstr(n, "attn_q.weight")) {
        /* unchanged for Q4_K_M */
    } else if (strstr(n, "ffn_down")) {
        if (use_more_bits(t->layer, nl)) ty = HM_TYPE_Q6_K;
    } else if (strstr(n, "attn_output.weight")) {
        if (p->n_expert == 8) ty = HM_TYPE_Q5_K;
    }
    return fallback(t, ty);
}

static uint32_t tensor_type(const forge_preset *p, forge_mix mix, const forge_tensor *t) {
    /* tensors llama.cpp never quantises: 1-D, biases, norms, routers */
    if (t->n_dims < 2 || !ends_with(t->name, "weight") || strstr(t->name, "_norm.weight") ||
        strstr(t->name, "ffn_gate_inp.weight") || strstr(t->name, "ssm_conv1d.weight"))
        return HM_TYPE_F32;
    switch (mix) {
    case FORGE_MIX_F32: return HM_TYPE_F32;
    case FORGE_MIX_F16: return HM_TYPE_F16;
    case FORGE_MIX_Q8_0: return fallback(t, HM_TYPE_Q8_0);
    case FORGE_MIX_MXFP4:
        /* (gemma4's tied token_embd is 2-D: q8_0, as output would be) */
        if (!strcmp(t->name, "output.weight")) return fallback(t, HM_TYPE_Q8_0);
        return fallback(t, t->ne[2] > 1 ? HM_TYPE_MXFP4 : HM_TYPE_Q8_0);
    case FORGE_MIX_Q4_K_M: return q4_k_m_type(p, t);
    default: return HM_TYPE_F32;
    }
}

static void set_distribution(const forge_preset *p, forge_tensor *t) {
    t->mean = 0.0f;
    switch (t->role) {
    case FR_EMBD: /* gemma4: tied output, soft-capped logits: logits of std ~2 */
        t->std = p->arch == FORGE_ARCH_GEMMA4 ? (float)(2.0 / sqrt((double)p->n_embd))
                 : p->tiny ? FORGE_TINY_EMBD_STD : 1.0f;
        break;
    case FR_SCALE: t->mean = 1.0f; t->std = 0.1f; break;
    case FR_ROPE_FREQS: t->mean = 1.0f; t->std = 0.0f; break; /* values: forge_gen_floats */
    case FR_NORM:
    case FR_QK_NORM: t->mean = 1.0f; t->std = 0.1f; break;
    case FR_BIAS:
    case FR_EXP_BIAS: t->std = 0.02f; break;
    case FR_SINKS: t->std = 0.5f; break;
    case FR_ROUTER_BIAS: t->std = 0.1f; break;
    case FR_SH_GATE_INP:
    case FR_ROUTER: t->std = (float)(1.0 / sqrt((double)p->n_embd)); break;
    case FR_SSM_NORM: t->mean = 1.0f; t->std = 0.1f; break;
    case FR_SSM_DT: t->std = 0.5f; break;
    case FR_SSM_A: t->mean = -1.0f; t->std = 0.25f; break; /* -exp(A_log) in [-1.9, -0.13] */
    default: t->std = (float)(1.0 / sqrt((double)t->ne[0])); break; /* linear: 1/sqrt(fan_in) */
    }
}

hm_status forge_tensors_build(const forge_preset *p, forge_mix mix, forge_tensor_list *out,
                              hm_error *err) {
    hm_status st = forge_preset_check(p, err);
    if (st != HM_OK) return st;
    if ((unsigned)mix >= FORGE_MIX_COUNT) return hm_error_set(err, HM_ERR_ARG, "unknown type mix");
    memset(out, 0, sizeof(*out));
    builder bb = {.l = out}, *b = &bb;
    int il = -1;
    T2(FR_EMBD, "token_embd.weight", p->n_embd, p->n_vocab);
    /* gemma4: the full layers' proportional rope as freq factors on n_rot = global head_dim */
    if (p->arch == FORGE_ARCH_GEMMA4) T1(FR_ROPE_FREQS, "rope_freqs.weight", p->head_dim_full / 2);
    for (il = 0; il < (int)(p->n_layer + p->n_nextn); il++) build_layer(b, p, il);
    il = -1;
    T1(FR_NORM, "output_norm.weight", p->n_embd);
    if (p->arch != FORGE_ARCH_GEMMA4) /* gemma4's output is token_embd (tied) */
        T2(FR_OUTPUT, "output.weight", p->n_embd, p->n_vocab);
    if (bb.oom) {
        forge_tensors_free(out);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory building the tensor list");
    }
    for (int i = 0; i < out->n; i++) {
        out->t[i].type = tensor_type(p, mix, &out->t[i]);
        set_distribution(p, &out->t[i]);
    }
    return HM_OK;
}

void forge_tensors_free(forge_tensor_list *l) {
    if (!l) return;
    free(l->t);
    l->t = NULL;
    l->n = 0;
}

int64_t forge_tensor_nelem(const forge_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

uint64_t forge_tensor_bytes(const forge_tensor *t) {
    return (uint64_t)hm_row_size(t->type, t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}

void forge_tensors_totals(const forge_tensor_list *l, int64_t *n_params, uint64_t *n_bytes) {
    int64_t np = 0;
    uint64_t nb = 0;
    for (int i = 0; i < l->n; i++) {
        np += forge_tensor_nelem(&l->t[i]);
        nb += (forge_tensor_bytes(&l->t[i]) + 31) / 32 * 32;
    }
    if (n_params) *n_params = np;
    if (n_bytes) *n_bytes = nb;
}
