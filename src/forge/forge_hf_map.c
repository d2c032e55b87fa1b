/* forge_hf_map.c - which transformers tensor each GGUF tensor becomes: names of the modeling
 * classes (Qwen3Moe, Mixtral, Olmoe, GptOss, Qwen2Moe, Qwen3Next, Qwen3_5Moe, Gemma4) and the layout
 * changes that
 * convert_hf_to_gguf applies, inverted (see forge_hf_op in forge.h).
 *
 * DESIGN: a list of HF tensors, each naming its GGUF source(s) and operation; the HF writer
 * evaluates it. Per-expert checkpoints (model.layers.L.mlp.experts.E.gate_proj.weight, Mixtral's
 * block_sparse_moe.experts.E.w1/w2/w3) are the form these models are published in; gpt-oss
 * uses its fused gate_up_proj with interleaved gate/up columns (transformers' GptOssExperts).
 * qwen35moe's MTP blocks (GGUF layers >= n_layer) are planned only when asked (forge_hf_opts):
 * as the published Qwen3.5 checkpoints hold them, mtp.layers.B.* (per-expert experts) and the
 * shared mtp.fc / mtp.pre_fc_norm_* / mtp.norm; transformers ignores mtp.* on load.
 * `hotmoe convert` reads the same plan backwards (src/convert/convert_gguf.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forge/forge.h"

typedef struct {
    forge_hf_tensor *h;
    int n, cap;
    bool oom;
    const forge_preset *p;
    bool mtp; /* qwen35moe: the MTP blocks as mtp.* */
} plan;

static forge_hf_tensor *push(plan *pl) {
    if (pl->oom) return NULL;
    if (pl->n == pl->cap) {
        int nc = pl->cap ? pl->cap * 2 : 256;
        forge_hf_tensor *nh = realloc(pl->h, (size_t)nc * sizeof(*nh));
        if (!nh) { pl->oom = true; return NULL; }
        pl->h = nh;
        pl->cap = nc;
    }
    forge_hf_tensor *h = &pl->h[pl->n++];
    memset(h, 0, sizeof(*h));
    return h;
}

static void copy_shape(forge_hf_tensor *h, const forge_tensor *t) {
    h->n_dims = (int)t->n_dims;
    for (int d = 0; d < h->n_dims; d++) h->shape[d] = t->ne[h->n_dims - 1 - d];
}

static int find(const forge_tensor_list *l, int layer, const char *suffix) {
    char name[FORGE_NAME_MAX];
    if (layer >= 0) snprintf(name, sizeof(name), "blk.%d.%s", layer, suffix);
    else snprintf(name, sizeof(name), "%s", suffix);
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return i;
    return -1;
}

/* suffix of a GGUF name after "blk.N." */
static const char *suffix_of(const forge_tensor *t) {
    const char *s = t->name;
    if (t->layer < 0) return s;
    s = strchr(s, '.');
    s = s ? strchr(s + 1, '.') : NULL;
    return s ? s + 1 : t->name;
}

/* the HF name of a layer tensor: model.layers.L.suffix, or for qwen35moe's MTP block B
 * (layer n_layer + B) mtp.layers.B.suffix, as the published checkpoints name it */
static void layer_name(const plan *pl, forge_hf_tensor *h, int layer, const char *suffix) {
    if (layer >= pl->p->n_layer)
        snprintf(h->name, sizeof(h->name), "mtp.layers.%d.%s", layer - (int)pl->p->n_layer, suffix);
    else
        snprintf(h->name, sizeof(h->name), "model.layers.%d.%s", layer, suffix);
}

typedef struct {
    const char *gguf, *hf;
} name_map;

static const name_map k_attn_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"}, {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.weight", "self_attn.k_proj.weight"}, {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.weight", "self_attn.v_proj.weight"}, {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"}, {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"}, {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"attn_sinks.weight", "self_attn.sinks"},
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},
};

/* qwen3next's own tensors (Qwen3NextGatedDeltaNet's, and the zero-centred norms, which HF
 * stores as w - 1); false for the ones named as the other architectures name them. */
static const name_map k_next_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"attn_qkv.weight", "linear_attn.in_proj_qkvz.weight"},
    {"ssm_ba.weight", "linear_attn.in_proj_ba.weight"},
    {"ssm_conv1d.weight", "linear_attn.conv1d.weight"},
    {"ssm_dt.bias", "linear_attn.dt_bias"},
    {"ssm_a", "linear_attn.A_log"},
    {"ssm_norm.weight", "linear_attn.norm.weight"},
    {"ssm_out.weight", "linear_attn.out_proj.weight"},
};

static bool layer_tensor_next(plan *pl, const forge_preset *p, const forge_tensor_list *l, int i) {
    const forge_tensor *t = &l->t[i];
    const char *suf = suffix_of(t);
    if (!strcmp(suf, "attn_gate.weight")) return true; /* folded into in_proj_qkvz */
    for (size_t k = 0; k < sizeof(k_next_names) / sizeof(k_next_names[0]); k++) {
        if (strcmp(suf, k_next_names[k].gguf)) continue;
        forge_hf_tensor *h = push(pl);
        if (!h) return true;
        layer_name(pl, h, t->layer, k_next_names[k].hf);
        h->op = FH_COPY;
        h->src = i;
        copy_shape(h, t);
        if (t->role == FR_NORM || t->role == FR_QK_NORM) h->op = FH_MINUS1;
        if (t->role == FR_SSM_A) h->op = FH_A_LOG;
        if (t->role == FR_SSM_CONV) { /* nn.Conv1d weight [channels, 1, K] */
            h->n_dims = 3;
            h->shape[0] = t->ne[1];
            h->shape[1] = 1;
            h->shape[2] = t->ne[0];
        }
        if (t->role == FR_SSM_QKV) {
            const int64_t r = p->ssm_n_v_heads / p->ssm_n_k_heads;
            h->op = FH_QKVZ;
            h->src2 = find(l, t->layer, "attn_gate.weight");
            h->n_heads = p->ssm_n_k_heads;
            h->grp_qk = p->ssm_head_k;
            h->grp_vz = r * p->ssm_head_v;
            h->shape[0] = 2 * p->ssm_n_k_heads * p->ssm_head_k + 2 * p->ssm_n_v_heads * p->ssm_head_v;
        }
        return true;
    }
    return false;
}

/* qwen35moe's own tensors (Qwen3_5MoeGatedDeltaNet's separate projections, whose value heads
 * the converter reorders to the tiled order; the zero-centred norms; the experts as the
 * model's fused 3-D parameters); false for the ones named as qwen3next names them. The
 * next-token-prediction blocks (layers >= n_layer) are left out: Qwen3_5MoeForCausalLM ignores
 * them (mtp.*), and the twin is what transformers reads. */
static const name_map k_q35_names[] = {
    {"attn_qkv.weight", "linear_attn.in_proj_qkv.weight"},
    {"attn_gate.weight", "linear_attn.in_proj_z.weight"},
    {"ssm_beta.weight", "linear_attn.in_proj_b.weight"},
    {"ssm_alpha.weight", "linear_attn.in_proj_a.weight"},
    {"ssm_conv1d.weight", "linear_attn.conv1d.weight"},
    {"ssm_dt.bias", "linear_attn.dt_bias"},
    {"ssm_a", "linear_attn.A_log"},
    {"ssm_out.weight", "linear_attn.out_proj.weight"},
    {"ffn_gate_exps.weight", "mlp.experts.gate_up_proj"},
    {"ffn_down_exps.weight", "mlp.experts.down_proj"},
};

/* the MTP block's own tensors (convert_hf_to_gguf's _Qwen35MtpMixin, inverted): shared by
 * every MTP block in the checkpoint, norms zero-centred */
static const name_map k_mtp_names[] = {
    {"nextn.eh_proj.weight", "mtp.fc.weight"},
    {"nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight"},
    {"nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight"},
    {"nextn.shared_head_norm.weight", "mtp.norm.weight"},
};

static bool layer_tensor_q35(plan *pl, const forge_preset *p, const forge_tensor_list *l, int i) {
    const forge_tensor *t = &l->t[i];
    const char *suf = suffix_of(t);
    if (t->layer >= p->n_layer) { /* an MTP block: left out, or its layers as the decoder's */
        if (!pl->mtp) return true;
        for (size_t k = 0; k < sizeof(k_mtp_names) / sizeof(k_mtp_names[0]); k++) {
            if (strcmp(suf, k_mtp_names[k].gguf)) continue;
            forge_hf_tensor *h = push(pl);
            if (!h) return true;
            snprintf(h->name, sizeof(h->name), "%s", k_mtp_names[k].hf);
            h->op = t->role == FR_NORM ? FH_MINUS1 : FH_COPY;
            h->src = i;
            copy_shape(h, t);
            return true;
        }
        return false; /* attention, norms, router, per-expert experts, shared expert */
    }
    if (!strcmp(suf, "ffn_up_exps.weight")) return true;
    const int64_t nk = p->ssm_n_k_heads, r = p->ssm_n_v_heads / p->ssm_n_k_heads;
    const int64_t kd2 = 2 * nk * p->ssm_head_k, dv = p->ssm_head_v;
    for (size_t k = 0; k < sizeof(k_q35_names) / sizeof(k_q35_names[0]); k++) {
        if (strcmp(suf, k_q35_names[k].gguf)) continue;
        forge_hf_tensor *h = push(pl);
        if (!h) return true;
        snprintf(h->name, sizeof(h->name), "model.layers.%d.%s", t->layer, k_q35_names[k].hf);
        h->src = i;
        copy_shape(h, t);
        h->v_nk = nk, h->v_r = r, h->v_hd = dv, h->v_off = 0;
        switch (t->role) {
        case FR_SSM_QKV: h->op = FH_VROWS, h->v_off = kd2; break; /* only the v rows */
        case FR_SSM_GATE: h->op = FH_VROWS; break;
        case FR_SSM_BETA:
        case FR_SSM_ALPHA: h->op = FH_VROWS, h->v_hd = 1; break;
        case FR_SSM_DT: h->op = FH_VCOLS, h->v_hd = 1; break;
        case FR_SSM_A: h->op = FH_VCOLS_ALOG, h->v_hd = 1; break;
        case FR_SSM_OUT: h->op = FH_VCOLS; break;
        case FR_SSM_CONV: /* nn.Conv1d weight [channels, 1, K]; channels of v reordered */
            h->op = FH_VROWS, h->v_off = kd2;
            h->n_dims = 3;
            h->shape[0] = t->ne[1];
            h->shape[1] = 1;
            h->shape[2] = t->ne[0];
            break;
        case FR_EXP_GATE: /* [X, 2F, E]: gate rows then up rows per expert */
            h->op = FH_CAT_GU;
            h->src2 = find(l, t->layer, "ffn_up_exps.weight");
            h->shape[1] = 2 * t->ne[1];
            break;
        default: h->op = FH_COPY; break; /* ffn_down_exps: [X, E, F] as stored */
        }
        return true;
    }
    return false;
}

/* gemma4's tensors as Gemma4TextDecoderLayer names them (norms stored as they are: Gemma 4's
 * RMS norm multiplies by w, and convert_hf_to_gguf's Gemma4Model adds nothing); the experts as
 * the model's fused 3-D parameters. */
static const name_map k_gemma4_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
    {"pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight"},
    {"post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight"},
    {"post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "router.proj.weight"},
    {"ffn_gate_inp.scale", "router.scale"},
    {"ffn_down_exps.scale", "router.per_expert_scale"},
    {"layer_output_scale.weight", "layer_scalar"},
    {"ffn_gate_exps.weight", "experts.gate_up_proj"},
    {"ffn_down_exps.weight", "experts.down_proj"},
};

static void layer_tensor_gemma4(plan *pl, const forge_tensor_list *l, int i) {
    const forge_tensor *t = &l->t[i];
    const char *suf = suffix_of(t);
    for (size_t k = 0; k < sizeof(k_gemma4_names) / sizeof(k_gemma4_names[0]); k++) {
        if (strcmp(suf, k_gemma4_names[k].gguf)) continue;
        forge_hf_tensor *h = push(pl);
        if (!h) return;
        snprintf(h->name, sizeof(h->name), "model.layers.%d.%s", t->layer, k_gemma4_names[k].hf);
        h->op = FH_COPY;
        h->src = i;
        copy_shape(h, t);
        if (t->role == FR_EXP_GATE) { /* [X, 2F, E]: gate rows then up rows per expert */
            h->op = FH_CAT_GU;
            h->src2 = find(l, t->layer, "ffn_up_exps.weight");
            h->shape[1] = 2 * t->ne[1];
        }
        return;
    }
    /* ffn_up_exps.weight: folded into gate_up_proj */
}

static void layer_tensor(plan *pl, const forge_preset *p, const forge_tensor_list *l, int i) {
    const forge_tensor *t = &l->t[i];
    const char *suf = suffix_of(t);
    const int L = t->layer;
    const bool mixtral = p->arch == FORGE_ARCH_LLAMA, oss = p->arch == FORGE_ARCH_GPTOSS;
    forge_hf_tensor *h;
    if (p->arch == FORGE_ARCH_GEMMA4) {
        layer_tensor_gemma4(pl, l, i);
        return;
    }
    if (p->arch == FORGE_ARCH_QWEN35MOE && layer_tensor_q35(pl, p, l, i)) return;
    if (forge_arch_hybrid(p->arch) && layer_tensor_next(pl, p, l, i)) return;
    for (size_t k = 0; k < sizeof(k_attn_names) / sizeof(k_attn_names[0]); k++) {
        if (strcmp(suf, k_attn_names[k].gguf)) continue;
        if (!(h = push(pl))) return;
        layer_name(pl, h, L, k_attn_names[k].hf);
        h->op = FH_COPY;
        h->src = i;
        copy_shape(h, t);
        if (t->role == FR_SH_GATE_INP) { h->n_dims = 2; h->shape[0] = 1; h->shape[1] = t->ne[0]; }
        if (mixtral && (t->role == FR_ATTN_Q || t->role == FR_ATTN_K)) {
            h->op = FH_UNPERMUTE;
            h->n_heads = t->role == FR_ATTN_Q ? p->n_head : p->n_head_kv;
        }
        return;
    }
    if (!strcmp(suf, "ffn_gate_inp.weight") || !strcmp(suf, "ffn_gate_inp.bias")) {
        if (!(h = push(pl))) return;
        const bool bias = t->role == FR_ROUTER_BIAS;
        char sfx[40];
        snprintf(sfx, sizeof(sfx), "%s.%s",
                 oss ? "mlp.router" : mixtral ? "block_sparse_moe.gate" : "mlp.gate", bias ? "bias" : "weight");
        layer_name(pl, h, L, sfx);
        h->op = FH_COPY;
        h->src = i;
        copy_shape(h, t);
        return;
    }
    if (oss) {
        const int64_t X = p->n_expert, F = p->n_ff_exp, E = p->n_embd;
        if (t->role == FR_EXP_GATE || (t->role == FR_EXP_BIAS && !strcmp(suf, "ffn_gate_exps.bias"))) {
            const bool bias = t->role == FR_EXP_BIAS;
            if (!(h = push(pl))) return;
            snprintf(h->name, sizeof(h->name), "model.layers.%d.mlp.experts.gate_up_proj%s", L, bias ? "_bias" : "");
            h->op = bias ? FH_GATE_UP_B : FH_GATE_UP;
            h->src = i;
            h->src2 = find(l, L, bias ? "ffn_up_exps.bias" : "ffn_up_exps.weight");
            h->n_dims = bias ? 2 : 3;
            if (bias) { h->shape[0] = X; h->shape[1] = 2 * F; }
            else { h->shape[0] = X; h->shape[1] = E; h->shape[2] = 2 * F; }
        } else if (t->role == FR_EXP_DOWN) {
            if (!(h = push(pl))) return;
            snprintf(h->name, sizeof(h->name), "model.layers.%d.mlp.experts.down_proj", L);
            h->op = FH_DOWN_T;
            h->src = i;
            h->n_dims = 3; h->shape[0] = X; h->shape[1] = F; h->shape[2] = E;
        } else if (t->role == FR_EXP_BIAS && !strcmp(suf, "ffn_down_exps.bias")) {
            if (!(h = push(pl))) return;
            snprintf(h->name, sizeof(h->name), "model.layers.%d.mlp.experts.down_proj_bias", L);
            h->op = FH_COPY;
            h->src = i;
            copy_shape(h, t);
        }
        return; /* up tensors are folded into gate_up_proj */
    }
    if (t->role == FR_EXP_GATE || t->role == FR_EXP_UP || t->role == FR_EXP_DOWN) {
        static const char *const qn[3] = {"gate_proj", "up_proj", "down_proj"};
        static const char *const mn[3] = {"w1", "w3", "w2"};
        int k = t->role == FR_EXP_GATE ? 0 : t->role == FR_EXP_UP ? 1 : 2;
        for (int64_t e = 0; e < t->ne[2]; e++) {
            if (!(h = push(pl))) return;
            char sfx[64];
            if (mixtral)
                snprintf(sfx, sizeof(sfx), "block_sparse_moe.experts.%d.%s.weight", (int)e, mn[k]);
            else
                snprintf(sfx, sizeof(sfx), "mlp.experts.%d.%s.weight", (int)e, qn[k]);
            layer_name(pl, h, L, sfx);
            h->op = FH_SLICE;
            h->src = i;
            h->expert = e;
            h->n_dims = 2;
            h->shape[0] = t->ne[1];
            h->shape[1] = t->ne[0];
        }
    }
}

hm_status forge_hf_plan(const forge_preset *p, const forge_tensor_list *l, forge_hf_tensor **out,
                        int *n_out, hm_error *err) {
    return forge_hf_plan_opts(p, l, NULL, out, n_out, err);
}

hm_status forge_hf_plan_opts(const forge_preset *p, const forge_tensor_list *l,
                             const forge_hf_opts *o, forge_hf_tensor **out, int *n_out,
                             hm_error *err) {
    plan pl = {.p = p, .mtp = o && o->mtp && p->arch == FORGE_ARCH_QWEN35MOE};
    for (int i = 0; i < l->n; i++) {
        const forge_tensor *t = &l->t[i];
        if (t->layer >= 0) { layer_tensor(&pl, p, l, i); continue; }
        if (t->role == FR_ROPE_FREQS) continue; /* gemma4: computed by transformers' rope */
        forge_hf_tensor *h = push(&pl);
        if (!h) break;
        const char *hn = !strcmp(t->name, "token_embd.weight") ? "model.embed_tokens.weight"
                         : !strcmp(t->name, "output_norm.weight") ? "model.norm.weight"
                                                                  : "lm_head.weight";
        snprintf(h->name, sizeof(h->name), "%s", hn);
        h->op = forge_arch_hybrid(p->arch) && t->role == FR_NORM ? FH_MINUS1 : FH_COPY;
        h->src = i;
        copy_shape(h, t);
    }
    if (pl.oom) {
        free(pl.h);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory planning the HF tensors");
    }
    *out = pl.h;
    *n_out = pl.n;
    return HM_OK;
}

int64_t forge_hf_nelem(const forge_hf_tensor *h) {
    int64_t n = 1;
    for (int d = 0; d < h->n_dims; d++) n *= h->shape[d];
    return n;
}
