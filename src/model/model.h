/* model.h - Mixture-of-Experts language models from GGUF files and their CPU forward pass.
 *
 * DESIGN: hm_model_load maps the file (gguf_open; weights are never copied), reads the
 * hyper-parameters from `{arch}.*` metadata with llama.cpp's key names and defaults, and binds
 * every tensor of every layer by its llama.cpp name, checking shapes and that quant/ computes
 * its type. What differs between architectures is data, not code: one hm_arch_desc per
 * architecture (a row of a constant table) holds flags — q/k norm kind, biases, sinks,
 * sliding-window pattern, rope kind and scaling, gating kind, shared expert, expert biases,
 * swiglu kind — and the single forward pass (model_forward.c) reads them.
 *
 * hm_context holds everything that changes while a sequence is processed: the KV cache (f16 or
 * q8_0 rows, n_ctx positions; sliding-window layers keep a ring of window + n_ubatch rows), the
 * scratch buffers (allocated once at init, sized for n_ubatch tokens), the thread pool. A prompt
 * is processed in ubatches of at most n_ubatch tokens; every output element is computed by the
 * same per-row code whatever the ubatch size or thread count, so a batch and the same tokens one
 * at a time give bit-identical logits (tested).
 *
 * The expert FFN is behind a small interface (hm_moe_exec below): routing result in, per-slot
 * outputs out; the forward pass sums the per-slot outputs weighted, in slot order, so a later
 * tier may compute some experts on a GPU without changing a bit of the result.
 *
 * hm_context_params.n_gpu_layers > 0 runs the whole forward pass on a GPU instead
 * (cuda/cuda_engine.h): decode-sized steps give the CPU's bytes except attention's summation
 * order; prompt ubatches use tensor-core GEMMs (f16 inputs). See hm_context_gpu.
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
} hm_arch_desc;

/* Descriptor for an architecture string; NULL when unsupported. */
const hm_arch_desc *hm_arch_find(const char *name, size_t len);
const hm_arch_desc *hm_arch_get(hm_arch arch);
/* "qwen3moe, llama, olmoe, gpt-oss, qwen2moe" (for error messages). */
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
                        for the CPU's products of a few tokens: hm_model_params.repack */
} hm_tensor;

typedef struct {
    bool swa;                       /* sliding-window layer */
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
const hm_tensor *hm_model_output(const hm_model *m);      /* {n_embd, n_vocab} */
uint64_t hm_model_weight_bytes(const hm_model *m); /* tensor data bytes */
/* The RoPE of every layer (kind, dimensions, base, YaRN) as cpu_rope takes it. */
cpu_rope_params hm_model_rope_params(const hm_model *m);

/* ---- the expert FFN interface ---- */

/* One layer's routing result and the place for the per-slot outputs. */
typedef struct {
    int layer;
    int64_t n_tok;
    int n_used;
    const float *x;        /* [n_tok][n_embd] ffn-normed input */
    const int32_t *ids;    /* [n_tok][n_used] selected experts, slot order */
    const float *weights;  /* [n_tok][n_used] gating weights (informative; y is unweighted) */
    float *y;              /* [n_tok][n_used][n_embd] out: expert(ids[t][s])(x[t]), unweighted,
                              expert biases included */
} hm_moe_job;

/* Computes every slot of a job. The default (CPU, cpu_moe_matmul) is used when a context has
 * none set; hm_context_set_moe_exec installs another (e.g. a GPU/CPU split). */
typedef hm_status (*hm_moe_exec_fn)(void *impl, const hm_model *m, const hm_moe_job *job,
                                    hm_error *err);

/* The default: every slot on the CPU (cpu_moe_matmul, expert biases, swiglu). impl must be the
 * hm_context the job comes from (its scratch is used). Slots whose id is < 0 are skipped and
 * their rows of y left alone, so an executor may run a subset of the slots here and the rest
 * elsewhere; each slot's output does not depend on which other slots ran. */
hm_status hm_moe_exec_cpu(void *impl, const hm_model *m, const hm_moe_job *job, hm_error *err);

/* Called with each layer's routing result when set (tracer, learn). NULL costs nothing. */
typedef void (*hm_route_hook_fn)(void *user, int layer, int64_t n_tok, int n_used,
                                 const int32_t *ids, const float *weights);

/* ---- context: KV cache, scratch, threads ---- */

typedef struct hm_context hm_context;

typedef struct {
    int n_ctx;        /* KV positions (-c); 0 = min(n_ctx_train, 4096) */
    int n_batch;      /* -b: largest n_tok one hm_decode call accepts (default 2048) */
    int n_ubatch;     /* -ub: tokens computed together (default 512) */
    int n_threads;    /* -t; 0 = number of online CPUs */
    uint32_t type_k;  /* KV cache types: HM_TYPE_F16 (default) or HM_TYPE_Q8_0 */
    uint32_t type_v;
    bool check_ram;   /* refuse when weights + cache + scratch exceed physical RAM (default true) */
    int n_gpu_layers; /* -ngl: 0 = CPU (default); > 0 = the whole model on the GPU (partial
                         placement is not implemented: 0 < ngl < n_layer + 1 also places all of
                         it and says so in the log) */
    int main_gpu;     /* -mg: CUDA device index (default 0) */
    bool gpu_strict;  /* --gpu-strict: when the GPU cannot take the model, hm_context_init fails
                         with the reason (admission control) instead of running on the CPU */
} hm_context_params;

hm_context_params hm_context_default_params(void);

hm_status hm_context_init(const hm_model *m, const hm_context_params *params, hm_context **out,
                          hm_error *err);
void hm_context_free(hm_context *ctx);

/* Bytes hm_context_init would allocate (KV cache + scratch) for these params. */
uint64_t hm_context_bytes(const hm_model *m, const hm_context_params *params);

typedef enum {
    HM_LOGITS_NONE = 0, /* logits may be NULL */
    HM_LOGITS_LAST,     /* logits: [n_vocab] of the last token */
    HM_LOGITS_ALL,      /* logits: [n_tok][n_vocab] */
} hm_logits_mode;

/* Runs tokens[0..n_tok) at positions pos..pos+n_tok-1 and appends them to the KV cache.
 * pos must be <= hm_context_n_past(ctx) (a smaller pos truncates first, as
 * hm_context_truncate); pos + n_tok must be <= n_ctx; n_tok <= n_batch. Token ids are checked
 * against n_vocab. */
hm_status hm_decode(hm_context *ctx, const int32_t *tokens, int n_tok, int pos, float *logits,
                    hm_logits_mode mode, hm_error *err);

int hm_context_n_past(const hm_context *ctx);
int hm_context_n_ctx(const hm_context *ctx);
/* Empties the KV cache. */
void hm_context_reset(hm_context *ctx);
/* Keeps positions [0, n_keep). Sliding-window layers keep a ring, so truncating further back
 * than n_ubatch positions before n_past is HM_ERR_STATE when the model has them. */
hm_status hm_context_truncate(hm_context *ctx, int n_keep, hm_error *err);

void hm_context_set_route_hook(hm_context *ctx, hm_route_hook_fn fn, void *user);
/* fn NULL restores the CPU default. */
void hm_context_set_moe_exec(hm_context *ctx, hm_moe_exec_fn fn, void *impl);
/* Expert usage tracer (moe/tracer.h): moe_tracer_record is called with each layer's routing
 * result; NULL (the default) costs one pointer test per layer. Not owned. */
struct moe_tracer;
void hm_context_set_tracer(hm_context *ctx, struct moe_tracer *t);
int hm_context_n_threads(const hm_context *ctx);
const hm_model *hm_context_model(const hm_context *ctx);

/* The GPU engine running this context (cuda/cuda_engine.h), or NULL on the CPU path. When it is
 * set, hm_decode runs on the GPU: the route hook, the tracer and a custom expert executor are
 * CPU-path features (hm_decode returns HM_ERR_UNSUPPORTED while one is set). */
struct cuda_engine;
struct cuda_engine *hm_context_gpu(const hm_context *ctx);

#endif
