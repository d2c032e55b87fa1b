/* model.h - a Mixture-of-Experts language model from a GGUF file: its description.
 *
 * DESIGN: hm_model_load maps the file (gguf_open; weights are never copied), reads the
 * hyper-parameters from `{arch}.*` metadata with llama.cpp's key names and defaults, and binds
 * every tensor of every layer by its llama.cpp name, checking shapes and that quant/ computes
 * its type. What differs between architectures is data, not code: one hm_arch_desc per
 * architecture (a row of a constant table) holds flags — q/k norm kind, biases, sinks,
 * sliding-window pattern, rope kind and scaling, gating kind, shared expert, expert biases,
 * swiglu kind — and the engines' single forward passes (cpu_engine/, cuda/) read them.
 *
 * A model is read-only once loaded: the engines that run it (the CPU engine, the GPU engine) and
 * the runtime that chooses between them (runtime/context.h) hold everything that changes.
 */
#ifndef HM_MODEL_MODEL_H
#define HM_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cpu/ops.h"
#include "gguf/gguf.h"

/* ---- architectures ---- */

typedef enum {
    HM_ARCH_QWEN3MOE = 0, /* "qwen3moe" */
    HM_ARCH_LLAMA,        /* "llama" with experts (Mixtral) */
    HM_ARCH_OLMOE,        /* "olmoe" */
    HM_ARCH_GPTOSS,       /* "gpt-oss" */
    HM_ARCH_QWEN2MOE,     /* "qwen2moe" */
    HM_ARCH_QWEN3NEXT,    /* "qwen3next": gated delta-net layers + gated full attention */
    HM_ARCH_QWEN35MOE,    /* "qwen35moe": Qwen3.5-MoE, qwen3next's layers with its differences */
    HM_ARCH_GEMMA4,       /* "gemma4": Gemma 4's MoE model (docs/GEMMA4.md) */
    HM_ARCH_COUNT
} hm_arch;

typedef enum {
    HM_QKNORM_NONE = 0,
    HM_QKNORM_HEAD, /* RMS norm of each head, weight {head_dim} (qwen3moe) */
    HM_QKNORM_FULL, /* RMS norm over the whole projection, weight {n_head * head_dim} (olmoe) */
} hm_qknorm_kind;

typedef enum {
    HM_ROPE_NORM = 0, /* llama.cpp "normal": rotate pairs (2i, 2i+1) (llama/mixtral GGUF rows are
                         permuted by the converter so this equals HF's rotate_half) */
    HM_ROPE_NEOX,     /* rotate pairs (i, i + n_rot/2) */
} hm_rope_kind;

typedef enum {
    HM_GATING_SOFTMAX_TOPK_NORM = 0, /* softmax over all experts, top-k, renormalise (qwen3moe,
                                        mixtral) */
    HM_GATING_SOFTMAX_TOPK,          /* softmax over all experts, top-k (olmoe, qwen2moe) */
    HM_GATING_TOPK_SOFTMAX,          /* top-k of the logits (+bias), softmax over the k (gpt-oss) */
} hm_gating_kind;

typedef enum {
    HM_SWIGLU_SILU = 0, /* silu(gate) * up */
    HM_SWIGLU_OAI,      /* gpt-oss: g = min(gate, 7); u = clamp(up, -7, 7);
                           g * sigmoid(1.702 g) * (u + 1) */
    HM_SWIGLU_GELU,     /* gemma4: gelu_tanh(gate) * up (cpu_geglu) */
} hm_swiglu_kind;

/* What one architecture's layer looks like; a row of a constant table (model_arch.c). */
typedef struct {
    hm_arch arch;
    const char *name;         /* general.architecture */
    hm_qknorm_kind qk_norm;
    bool bias_qkv;            /* attn_{q,k,v}.bias */
    bool bias_o;              /* attn_output.bias */
    bool sinks;               /* attn_sinks {n_head} */
    int swa_period;           /* 0: no sliding window; 2: layers with il % 2 == 0 are sliding */
    hm_rope_kind rope;
    bool rope_yarn;           /* rope.scaling.type = yarn keys are read */
    bool yarn_truncate;       /* floor/ceil YaRN's correction dims (llama.cpp); gpt-oss's HF config
                                 says truncate = false, and HF is the reference */
    bool post_attn_norm_name; /* the ffn norm is called post_attention_norm (gpt-oss) */
    hm_gating_kind gating;
    bool router_bias;         /* ffn_gate_inp.bias */
    bool expert_bias;         /* ffn_{gate,up,down}_exps.bias */
    bool shared_expert;       /* ffn_{gate,up,down}_shexp + sigmoid gate ffn_gate_inp_shexp */
    hm_swiglu_kind swiglu;
    bool ff_exp_key;          /* expert width from expert_feed_forward_length (else
                                 feed_forward_length) */
    bool hybrid;              /* gated delta-net (linear attention) layers, with a full-attention
                                 layer every full_attention_interval-th (qwen3next: ssm.* keys,
                                 docs/HYBRID.md) */
    bool attn_gate;           /* attn_q holds per head [query | output gate]: the attention's
                                 output is multiplied by sigmoid(gate) before attn_output */
    bool ssm_ab_split;        /* the delta net's b and a from ssm_beta and ssm_alpha {n_embd, v
                                 heads} (qwen35moe) instead of ssm_ba's per-key-head groups */
    bool ssm_v_tiled;         /* the value heads are in llama.cpp's tiled order: value head h
                                 reads key head h % k heads (its converter reorders Qwen3.5's
                                 grouped heads, where it is h / (v heads / k heads)) */
    bool rope_sections;       /* rope.dimension_sections (multi-section rope) and
                                 nextn_predict_layers are read (qwen35moe; docs/HYBRID.md) */
    bool gemma4;              /* Gemma 4 (docs/GEMMA4.md): sliding and full layers by
                                 sliding_window_pattern with their own head size, kv heads (K as V
                                 on full layers) and rope; a dense GELU MLP beside the experts,
                                 each with its norms; router input scale, per-expert scales, a
                                 layer scalar, tied output, soft-capped logits */
    bool fused_gate_up;       /* the experts' gate and up may come fused in ffn_gate_up_exps
                                 (llama.cpp's create_tensor_gate_up_exps: gemma4, qwen3next,
                                 qwen35moe); read as two strided views (hm_tensor.expert_stride) */
} hm_arch_desc;

/* Descriptor for an architecture string; NULL when unsupported. */
const hm_arch_desc *hm_arch_find(const char *name, size_t len);
const hm_arch_desc *hm_arch_get(hm_arch arch);
/* "qwen3moe, llama, olmoe, gpt-oss, qwen2moe, qwen3next, qwen35moe" (for error messages). */
const char *hm_arch_supported_list(void);

/* ---- hyper-parameters ---- */

typedef struct {
    int64_t n_vocab, n_embd, n_layer;
    int64_t n_head, n_head_kv;
    int64_t head_dim_k, head_dim_v; /* attention.key_length / value_length */
    int64_t n_rot;                  /* rope.dimension_count */
    int64_t n_expert, n_expert_used;
    int64_t n_ff_exp;               /* expert FFN width */
    int64_t n_ff_shexp;             /* shared expert width (0 if none) */
    int64_t n_ctx_train;            /* context_length */
    float rms_eps;
    float rope_base;                /* rope.freq_base */
    /* rope scaling (YaRN); freq_scale = 1 / factor, 1 when unscaled */
    float rope_freq_scale;
    int64_t rope_orig_ctx;          /* rope.scaling.original_context_length */
    float yarn_ext_factor;          /* 1 with YaRN, 0 otherwise */
    float yarn_attn_factor;         /* 1 */
    float yarn_beta_fast, yarn_beta_slow; /* 32, 1 (llama.cpp defaults) */
    bool yarn_truncate;             /* from the descriptor */
    int64_t sliding_window;         /* 0 = none */
    /* hybrid architectures (hm_arch_desc.hybrid), 0 otherwise: the delta net's shapes */
    int64_t ssm_conv_kernel;        /* ssm.conv_kernel: width K of the causal convolution */
    int64_t ssm_head_k;             /* ssm.state_size: key (and query) size of a head */
    int64_t ssm_n_k_heads;          /* ssm.group_count: query/key heads */
    int64_t ssm_n_v_heads;          /* ssm.time_step_rank: value heads (a multiple of k heads) */
    int64_t ssm_head_v;             /* ssm.inner_size / value heads */
    int64_t full_attn_interval;     /* full_attention_interval (4): layer i is full attention
                                       when (i + 1) % interval == 0, else linear */
    /* qwen35moe (hm_arch_desc.rope_sections), 0 otherwise */
    int64_t rope_sections[4];       /* rope.dimension_sections: rotary pairs per position
                                       component (time, height, width, -); a text token has the
                                       same position in each, so the rope is NEOX's on n_rot */
    int64_t n_nextn;                /* nextn_predict_layers: multi-token-prediction blocks after
                                       the decoder layers (block_count = n_layer + n_nextn);
                                       loaded (checked), never run */
    /* gemma4 (hm_arch_desc.gemma4), 0 otherwise; head_dim_k, n_head_kv, n_rot and rope_base
     * above are the full-attention layers' (key_length, ..., rope.freq_base) */
    int64_t head_dim_swa;           /* attention.key_length_swa (= value_length_swa) */
    int64_t n_head_kv_swa;          /* head_count_kv of the sliding layers (an array per layer) */
    int64_t n_rot_swa;              /* rope.dimension_count_swa */
    float rope_base_swa;            /* rope.freq_base_swa */
    int64_t n_ff;                   /* feed_forward_length: the dense MLP beside the experts */
    float logit_softcap;            /* final_logit_softcapping (0: none) */
} hm_hparams;

/* ---- weights ---- */

/* A tensor the forward pass reads: where its bytes are and how to read them. data points into
 * the mapped file today; a later issue may add other homes without changing the forward pass's
 * view of it. Absent optional tensors have data == NULL. */
typedef struct {
    const char *name;
    uint32_t type;  /* ggml type id */
    int64_t ne[4];  /* ggml order: ne[0] contiguous */
    const void *data;
    size_t row_size; /* bytes of one row of ne[0] elements */
    const void *x8;  /* NULL, or the same rows repacked by eights (quant_x8.h) in owned memory,
                        for the CPU's products of a few tokens: hm_model_params.repack; always
                        contiguous (expert e at e * ne[1] * row_size) */
    size_t expert_stride; /* a 3-D tensor's bytes from expert e's rows in data to e + 1's; 0:
                             contiguous (ne[1] * row_size). Non-zero for gate_exps and up_exps
                             viewed in a fused ffn_gate_up_exps (hm_model_fused_gate_up) */
} hm_tensor;

typedef struct {
    bool swa;                       /* sliding-window layer */
    bool recurrent;                 /* a gated delta-net layer (hybrid architectures): the ssm_*
                                       tensors below instead of wq..wo, q/k norms */
    hm_tensor attn_norm;            /* {n_embd} */
    hm_tensor wq, wk, wv, wo;       /* {n_embd, n_head*hd_k} {n_embd, n_kv*hd_k} {n_embd,
                                       n_kv*hd_v} {n_head*hd_v, n_embd} */
    hm_tensor bq, bk, bv, bo;       /* biases (optional per arch) */
    hm_tensor q_norm, k_norm;       /* {hd_k} or {n_head*hd_k} / {n_kv*hd_k} */
    hm_tensor sinks;                /* {n_head} */
    hm_tensor ffn_norm;             /* {n_embd} (post_attention_norm for gpt-oss) */
    hm_tensor router, router_b;     /* {n_embd, n_expert}, {n_expert} */
    hm_tensor gate_exps, up_exps;   /* {n_embd, n_ff_exp, n_expert} */
    hm_tensor down_exps;            /* {n_ff_exp, n_embd, n_expert} */
    hm_tensor gate_exps_b, up_exps_b; /* {n_ff_exp, n_expert} */
    hm_tensor down_exps_b;          /* {n_embd, n_expert} */
    hm_tensor sh_gate, sh_up;       /* {n_embd, n_ff_shexp} */
    hm_tensor sh_down;              /* {n_ff_shexp, n_embd} */
    hm_tensor sh_gate_inp;          /* {n_embd} (ggml: {n_embd, 1}) */
    /* a recurrent layer (kd = k heads x head_k, vd = v heads x head_v, conv_dim = 2 kd + vd):
     * ssm_qkv and ssm_gate (llama.cpp's attn_qkv, attn_gate), or instead the older fused ssm_in
     * whose rows are per k head [q, k, v (r heads), z (r heads)], r = v heads / k heads */
    hm_tensor ssm_qkv;              /* {n_embd, conv_dim}: q of every head | k | v */
    hm_tensor ssm_gate;             /* {n_embd, vd}: z, the output norm's gate */
    hm_tensor ssm_in;               /* {n_embd, 2 kd + 2 vd} (older files) */
    hm_tensor ssm_ba;               /* {n_embd, 2 v heads}: per k head [b (r), a (r)] */
    hm_tensor ssm_beta, ssm_alpha;  /* {n_embd, v heads} instead of ssm_ba (ssm_ab_split) */
    hm_tensor ssm_conv1d;           /* {K, conv_dim} f32 */
    hm_tensor ssm_dt;               /* {v heads} added to a (ssm_dt.bias) */
    hm_tensor ssm_a;                /* {v heads} -exp(A_log): the decay rate */
    hm_tensor ssm_norm;             /* {head_v} the gated output norm (plain RMS) */
    hm_tensor ssm_out;              /* {vd, n_embd} */
    /* gemma4 (hd = head_dim_swa or head_dim_k by layer kind; a full layer has no wv: V is K) */
    hm_tensor attn_post_norm;       /* {n_embd} post_attention_norm: on the attention's output */
    hm_tensor ffn_gate, ffn_up;     /* {n_embd, n_ff} the dense MLP (GELU-tanh gated) */
    hm_tensor ffn_down;             /* {n_ff, n_embd} */
    hm_tensor ffn_post_norm1;       /* {n_embd} post_ffw_norm_1: on the dense MLP's output */
    hm_tensor ffn_pre_norm2;        /* {n_embd} pre_ffw_norm_2: the experts' input norm */
    hm_tensor ffn_post_norm2;       /* {n_embd} post_ffw_norm_2: on the experts' sum */
    hm_tensor ffn_post_norm;        /* {n_embd} post_ffw_norm: on dense + experts */
    hm_tensor router_scale;         /* {n_embd} ffn_gate_inp.scale: the router's input scale */
    hm_tensor down_exps_scale;      /* {n_expert} ffn_down_exps.scale: per-expert output scale */
    hm_tensor out_scale;            /* {1} layer_output_scale: the layer's output scalar */
} hm_layer;

typedef struct hm_model hm_model;

typedef struct {
    bool check_ram;   /* refuse a model whose weights exceed physical RAM (default true) */
    bool f32_weights; /* reference mode (default false): dequantise every matrix once into an
                         owned f32 copy, so products use f32 activations instead of the
                         weight type's quantised activations (docs/ARITHMETIC.md). Costs 4 bytes
                         per weight; isolates the forward pass from activation quantisation
                         when comparing with a float reference. */
    bool repack;      /* (default false) also hold every q4_K matrix the CPU multiplies
                         repacked by eights (quant_x8.h): faster CPU decode on AVX-512 VNNI+VBMI
                         CPUs, the same bits; costs those matrices' size again in RAM (the
                         mapped originals stay for prompt batches and the GPU) */
} hm_model_params;

hm_model_params hm_model_default_params(void);

/* Opens path (mmap), reads hyper-parameters and binds tensors. Errors: unsupported architecture
 * ("unsupported architecture 'X' (supported: ...)"), missing key or tensor (named), wrong shape
 * (named, with both shapes), "unsupported type T in tensor NAME", too large for RAM (says how
 * much is needed). params NULL = defaults. */
hm_status hm_model_load(const char *path, const hm_model_params *params, hm_model **out,
                        hm_error *err);
/* Same on an already opened file; the model takes ownership of g (closes it in free, also on
 * failure). */
hm_status hm_model_load_gguf(gguf_ctx *g, const hm_model_params *params, hm_model **out,
                             hm_error *err);
void hm_model_free(hm_model *m);

const hm_arch_desc *hm_model_arch(const hm_model *m);
const hm_hparams *hm_model_hparams(const hm_model *m);
const hm_layer *hm_model_layer(const hm_model *m, int il);
const gguf_ctx *hm_model_gguf(const hm_model *m); /* for the tokenizer and inspect */
/* The tensors outside the layers (for engines that copy the weights elsewhere, e.g. the GPU). */
const hm_tensor *hm_model_tok_embd(const hm_model *m);    /* {n_embd, n_vocab} */
const hm_tensor *hm_model_output_norm(const hm_model *m); /* {n_embd} f32 */
const hm_tensor *hm_model_output(const hm_model *m);      /* {n_embd, n_vocab} (gemma4: token_embd) */
/* gemma4: rope_freqs {head_dim_k / 2} f32, the full layers' frequency factors (1 on the rotated
 * pairs, 1e30 on the others: the proportional rope); data NULL elsewhere. */
const hm_tensor *hm_model_rope_freqs(const hm_model *m);
uint64_t hm_model_weight_bytes(const hm_model *m); /* tensor data bytes */
/* Some layer's gate_exps/up_exps are views of a fused ffn_gate_up_exps (expert_stride != 0):
 * the CPU engine reads them; the GPU upload and expert fetches do not (refused). */
bool hm_model_fused_gate_up(const hm_model *m);
/* The RoPE of every layer (kind, dimensions, base, YaRN; gemma4: its full-attention layers', with
 * rope_freqs as the frequency factors) as cpu_rope takes it. */
cpu_rope_params hm_model_rope_params(const hm_model *m);
/* gemma4's sliding layers' RoPE (NEOX on rope.dimension_count_swa, rope.freq_base_swa); for the
 * other architectures hm_model_rope_params. */
cpu_rope_params hm_model_rope_params_swa(const hm_model *m);
/* Layer il's KV heads and head size (K and V rows are [n_head_kv][head_dim]): head_dim_k and
 * n_head_kv, or for a gemma4 sliding layer head_dim_swa and n_head_kv_swa. */
void hm_model_layer_kv(const hm_model *m, int il, int64_t *n_head_kv, int64_t *head_dim);

/* What a forward pass returns (both engines and hm_decode). */
typedef enum {
    HM_LOGITS_NONE = 0, /* logits may be NULL */
    HM_LOGITS_LAST,     /* logits: [n_vocab] of the last token */
    HM_LOGITS_ALL,      /* logits: [n_tok][n_vocab] */
} hm_logits_mode;

#endif
