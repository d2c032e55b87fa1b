/* forge.h - `hotmoe forge`: writes GGUF models of real MoE architectures exactly as llama.cpp's
 * loader expects them (names, shapes, metadata keys, tokenizer), plus the same weights as a
 * HuggingFace directory (config.json, model.safetensors, tokenizer.json) for reference runs.
 *
 * DESIGN: a model is a preset (hyper-parameters of a real or tiny model of one architecture)
 * plus a type mix. forge_tensors_build turns the pair into the tensor list llama.cpp wants,
 * each tensor with its ggml type chosen as llama.cpp's converter/quantiser would choose it.
 * Every element is a pure function of (seed, tensor name, element index) — a counter-based RNG —
 * so the bytes never depend on threads or chunking. The GGUF is streamed tensor by tensor in
 * chunks of rows (bounded memory); the HF copy is made afterwards by re-opening the GGUF and
 * dequantising each tensor, so it holds exactly the values llama.cpp will compute with.
 * Files: forge_presets.c (presets, overrides), forge_tensors.c (tensor lists, type mixes,
 * HF names), forge_weights.c (RNG, rows, direct blocks), forge_vocab*.c (tokenizers, chat
 * templates), forge_gguf.c (GGUF writer), forge_hf*.c (HF writer, JSON by base/json.h), forge_sim.c
 * (router skew simulation), forge_progress.c.
 */
#ifndef HM_FORGE_FORGE_H
#define HM_FORGE_FORGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum {
    FORGE_ARCH_QWEN3MOE = 0, /* "qwen3moe"  Qwen3MoeForCausalLM */
    FORGE_ARCH_LLAMA,        /* "llama" with experts: MixtralForCausalLM */
    FORGE_ARCH_OLMOE,        /* "olmoe"     OlmoeForCausalLM */
    FORGE_ARCH_GPTOSS,       /* "gpt-oss"   GptOssForCausalLM */
    FORGE_ARCH_QWEN2MOE,     /* "qwen2moe"  Qwen2MoeForCausalLM */
    FORGE_ARCH_QWEN3NEXT,    /* "qwen3next" Qwen3NextForCausalLM (hybrid: docs/HYBRID.md) */
    FORGE_ARCH_QWEN35MOE,    /* "qwen35moe" Qwen3_5MoeForCausalLM (hybrid: docs/HYBRID.md) */
    FORGE_ARCH_GEMMA4,       /* "gemma4"    Gemma4ForCausalLM, the MoE variant (docs/GEMMA4.md) */
    FORGE_ARCH_COUNT
} forge_arch;

typedef enum {
    FORGE_MIX_F32 = 0,
    FORGE_MIX_F16,
    FORGE_MIX_Q8_0,
    FORGE_MIX_Q4_K_M,
    FORGE_MIX_MXFP4,
    FORGE_MIX_COUNT
} forge_mix;

typedef struct {
    const char *name;       /* preset name, e.g. "qwen3-30b-a3b" */
    const char *model_name; /* general.name */
    forge_arch arch;
    bool tiny;              /* test preset: HF copy on by default */
    int64_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim;
    int64_t n_ff;           /* feed_forward_length (llama/olmoe: the expert width) */
    int64_t n_ff_exp;       /* expert_feed_forward_length (0 where the arch uses n_ff) */
    int64_t n_ff_shexp;     /* qwen2moe shared expert width */
    int64_t n_expert, n_expert_used;
    int64_t n_ctx;
    double rms_eps, rope_base;
    int64_t sliding_window;            /* gpt-oss */
    double yarn_factor;                /* gpt-oss: rope scaling */
    int64_t yarn_orig_ctx;
    int64_t special_base;              /* id of the first special token */
    int64_t n_merges_max;              /* cap on learned BPE merges / SPM pieces */
    int64_t n_rot;                     /* rope.dimension_count (0: head_dim); qwen3next: head_dim
                                          x partial_rotary_factor */
    /* the hybrids' gated delta net (qwen3next, qwen35moe; 0 elsewhere); a full-attention layer
     * every 4th */
    int64_t ssm_conv_kernel;           /* linear_conv_kernel_dim */
    int64_t ssm_n_k_heads, ssm_n_v_heads; /* linear_num_key_heads / _value_heads */
    int64_t ssm_head_k, ssm_head_v;    /* linear_key_head_dim / _value_head_dim */
    /* qwen35moe: rope.dimension_sections (mrope_section + a 0), and the multi-token-prediction
     * blocks appended after the n_layer decoder layers (mtp_num_hidden_layers: block_count is
     * n_layer + n_nextn, nextn_predict_layers n_nextn) */
    int64_t rope_sections[4];
    int64_t n_nextn;
    /* gemma4 (0 elsewhere): head_dim, n_head_kv and rope_base are the sliding layers' (llama.cpp's
     * key_length_swa, the head_count_kv of a sliding layer, rope.freq_base_swa ... are written
     * from them); a full-attention layer (il + 1) % swa_period == 0 has heads of head_dim_full
     * (global_head_dim), n_head_kv_full key/value heads (num_global_key_value_heads; its K is
     * also its V: attention_k_eq_v, no attn_v) and the proportional rope of theta rope_base_full
     * on n_rot of them (global_head_dim x partial_rotary_factor); n_ff is the dense MLP beside
     * the experts (intermediate_size); logits are soft-capped at softcap */
    int64_t head_dim_full, n_head_kv_full, swa_period;
    double rope_base_full, softcap;
} forge_preset;

/* ---- presets (forge_presets.c) ---- */
int forge_preset_count(void);
const forge_preset *forge_preset_at(int i);
const forge_preset *forge_preset_find(const char *name); /* NULL if unknown */
const char *forge_arch_name(forge_arch a);     /* GGUF general.architecture */
const char *forge_mix_name(forge_mix m);       /* "q4_k_m" ... */
int forge_mix_from_name(const char *name);     /* -1 if unknown */
uint32_t forge_mix_file_type(forge_mix m);     /* general.file_type (llama_ftype) */
/* Checks a (possibly overridden) preset for consistency; one line in err on failure. */
hm_status forge_preset_check(const forge_preset *p, hm_error *err);
/* Expert FFN width as llama.cpp reads it for this arch. */
int64_t forge_preset_ff_exp(const forge_preset *p);
/* The hybrid architectures (gated delta-net layers): qwen3next, qwen35moe. */
bool forge_arch_hybrid(forge_arch a);
/* A hybrid's layer il is a gated delta-net layer (il < n_layer, (il + 1) % 4 != 0); false
 * elsewhere (qwen35moe's next-token-prediction blocks, il >= n_layer, are full attention). */
bool forge_layer_recurrent(const forge_preset *p, int il);
/* The rotated dimensions (n_rot, else head_dim). */
int64_t forge_preset_n_rot(const forge_preset *p);
/* Architectures whose layers differ by kind (the hybrids, gemma4's sliding and full layers):
 * their layouts are tested by tests/cpu_engine/test_<arch>.c (convert takes them all). */
bool forge_arch_own_layout(forge_arch a);
/* llama.cpp reads fused gate/up experts (ffn_gate_up_exps) for a: gemma4, qwen3next, qwen35moe. */
bool forge_arch_fused_gate_up(forge_arch a);
/* gemma4's layer il is a sliding-window layer ((il + 1) % swa_period != 0); false elsewhere. */
bool forge_layer_swa(const forge_preset *p, int il);

/* ---- tensors (forge_tensors.c) ---- */
typedef enum {
    FR_EMBD, FR_OUTPUT, FR_NORM, FR_QK_NORM, FR_ATTN_Q, FR_ATTN_K, FR_ATTN_V, FR_ATTN_O,
    FR_BIAS, FR_SINKS, FR_ROUTER, FR_ROUTER_BIAS, FR_EXP_GATE, FR_EXP_UP, FR_EXP_DOWN,
    FR_EXP_BIAS, FR_SH_GATE, FR_SH_UP, FR_SH_DOWN, FR_SH_GATE_INP,
    FR_SSM_QKV, FR_SSM_GATE, FR_SSM_BA, FR_SSM_CONV, FR_SSM_DT, FR_SSM_A, FR_SSM_NORM, FR_SSM_OUT,
    FR_SSM_BETA, FR_SSM_ALPHA, FR_NEXTN_EH,
    FR_SCALE,      /* gemma4's router scale, per-expert scales, layer scalar: around 1 */
    FR_ROPE_FREQS  /* gemma4's rope_freqs: n_rot / 2 ones, then 1e30 (unrotated pairs) */
} forge_role;

#define FORGE_NAME_MAX 64
/* Tiny presets are shaped like trained models in how decisive they are (a model of random
 * weights is near-flat: router and output top-1/top-2 margins down to 4e-5, so the rounding of
 * quantised activations flips expert choices and argmaxes). Their token embeddings have std
 * FORGE_TINY_EMBD_STD (the residual stream is dominated by the exact embedding, the layers add
 * O(1)), and output row j also holds the embedding of one token (a fixed permutation), scaled so
 * that token's logit gains about FORGE_TINY_SUCC when it is the current token: every token has one
 * strongly preferred successor, as a trained model's bigram statistics give. forge_weights.c. */
#define FORGE_TINY_EMBD_STD 4.0f
#define FORGE_TINY_SUCC 6.0f

typedef struct {
    char name[FORGE_NAME_MAX]; /* GGUF name */
    forge_role role;
    int layer;                 /* -1 for global tensors */
    uint32_t n_dims;
    int64_t ne[4];             /* ggml order: ne[0] contiguous */
    uint32_t type;             /* ggml type in the GGUF */
    float mean, std;           /* distribution of the generated values */
} forge_tensor;

typedef struct {
    forge_tensor *t;
    int n;
} forge_tensor_list;

hm_status forge_tensors_build(const forge_preset *p, forge_mix mix, forge_tensor_list *out,
                              hm_error *err);
void forge_tensors_free(forge_tensor_list *l);
int64_t forge_tensor_nelem(const forge_tensor *t);
uint64_t forge_tensor_bytes(const forge_tensor *t);
/* Total parameters and data bytes of a list. */
void forge_tensors_totals(const forge_tensor_list *l, int64_t *n_params, uint64_t *n_bytes);

/* ---- weights (forge_weights.c) ---- */
typedef struct {
    uint64_t seed;
    double skew_s;  /* Zipf exponent of the planted expert popularity (0: none) */
    bool direct;    /* generate quantised blocks directly from the RNG (no float rounding) */
} forge_gen;

/* 64-bit key of a tensor name (FNV-1a), mixed with the seed. */
uint64_t forge_tensor_key(uint64_t seed, const char *name);
/* Value of element i of a tensor (float path). */
void forge_gen_floats(const forge_gen *g, const forge_preset *p, const forge_tensor *t,
                      int64_t first, int64_t n, float *dst);
/* Router scale of expert e in layer l (1 without skew). */
float forge_router_scale(const forge_gen *g, const forge_preset *p, int layer, int64_t e);
/* Fills rows [r0, r0+nr) of tensor t (rows of ne[0] elements) into dst in its ggml type;
 * scratch holds ne[0] floats. */
hm_status forge_gen_rows(const forge_gen *g, const forge_preset *p, const forge_tensor *t,
                         int64_t r0, int64_t nr, void *dst, float *scratch);

/* ---- tokenizer (forge_vocab.c) ---- */
enum { FORGE_TT_NORMAL = 1, FORGE_TT_UNKNOWN = 2, FORGE_TT_CONTROL = 3, FORGE_TT_USER = 4,
       FORGE_TT_UNUSED = 5, FORGE_TT_BYTE = 6 };

typedef struct {
    bool spm;               /* "llama" SentencePiece model; else "gpt2" byte-level BPE */
    const char *pre;        /* tokenizer.ggml.pre */
    int64_t n;              /* tokens */
    char **tokens;          /* [n] UTF-8 */
    int32_t *types;         /* [n] */
    float *scores;          /* [n] (spm) */
    int64_t n_merges;
    char **merges;          /* [n_merges] "a b" (bpe, and the equivalent merges for spm) */
    int64_t bos, eos, pad, unk; /* -1 when absent */
    bool add_bos;
    const char *chat_template;
    const char *bos_str, *eos_str, *pad_str, *unk_str;
} forge_vocab;

hm_status forge_vocab_build(const forge_preset *p, forge_vocab *v, hm_error *err);
void forge_vocab_free(forge_vocab *v);
/* GPT-2's byte-to-unicode map: UTF-8 of the code point standing for byte b (<= 3 bytes + NUL). */
void forge_byte_to_unicode(uint8_t b, char out[4]);

/* ---- writing ---- */
typedef struct {
    const forge_preset *preset;
    forge_mix mix;
    forge_gen gen;
    const char *out_path;   /* GGUF */
    const char *hf_dir;     /* NULL: no HF copy */
    bool hf_mtp;            /* qwen35moe: the HF copy holds the MTP block as mtp.* (one block) */
    bool fuse_gate_up;      /* the GGUF holds each layer's experts' gate and up fused in
                               ffn_gate_up_exps {n_embd, 2 n_ff_exp, n_expert} (per expert the gate
                               rows, then the up rows: llama.cpp's convert --fuse-gate-up-exps),
                               the same values; only where llama.cpp takes it
                               (forge_arch_fused_gate_up) */
    int n_threads;
    bool progress;          /* draw a progress bar on stderr */
} forge_job;

typedef struct {
    uint64_t bytes;         /* GGUF file size */
    int64_t n_params;
    int n_tensors;
    double seconds;
    double hf_seconds;
} forge_result;

hm_status forge_write_gguf(const forge_job *job, forge_result *res, hm_error *err);
/* Rows [r0, r0 + nr) of tensor t encoded in t->type into dst (row after row); scratch holds
 * t->ne[0] floats. Called from several threads at once, on disjoint rows. */
typedef hm_status (*forge_rows_fn)(void *ctx, const forge_tensor *t, int64_t r0, int64_t nr,
                                   void *dst, float *scratch);
/* Writes out_path: the metadata of preset p in mix (general.*, the {arch}.* hyper-parameters,
 * the tokenizer keys of v: llama.cpp's names and order; source_note, or NULL, as
 * general.source.forge), the tensor table of l, then every tensor's rows from fn, in chunks of
 * at most 32 MiB over pool's threads (NULL: the calling thread), with a progress bar labelled
 * label on a terminal. On failure the file is removed and err names it or the tensor; *bytes
 * (may be NULL): the file's size. Shared by forge and convert. */
struct tp_pool;
hm_status forge_gguf_write(const char *out_path, const forge_preset *p, forge_mix mix,
                           const forge_vocab *v, const forge_tensor_list *l, forge_rows_fn fn,
                           void *ctx, struct tp_pool *pool, const char *label, bool progress,
                           const char *source_note, uint64_t *bytes, hm_error *err);
/* n floats f as one row of type (f32 copied, f16 rounded, else quant_quantize_row) into out. */
hm_status forge_encode_row(uint32_t type, const float *f, void *out, int64_t n);
hm_status forge_write_hf(const forge_job *job, hm_error *err);

/* ---- HF layout (forge_hf_map.c) ---- */
/* How one transformers tensor is made from GGUF tensors (all values dequantised to f32):
 *   COPY       same element order (HF [out, in] == ggml ne {in, out})
 *   SLICE      expert e of a 3-D tensor: rows [e*ne1, (e+1)*ne1)
 *   UNPERMUTE  llama q/k: convert_hf_to_gguf interleaved rope pairs; HF row h*D + j*D/2 + i is
 *              GGUF row h*D + 2i + j (D = head_dim, j in {0,1})
 *   GATE_UP    gpt-oss gate_up_proj [X, E, 2F]: [e][c][2f] = gate[e][f][c], [e][c][2f+1] = up[e][f][c]
 *   GATE_UP_B  gpt-oss gate_up_proj_bias [X, 2F]: [e][2f] = gate_b[e][f], [e][2f+1] = up_b[e][f]
 *   DOWN_T     gpt-oss down_proj [X, F, E]: [e][f][c] = down[e][c][f]
 *   MINUS1     qwen3next's zero-centred RMS norms: HF stores w - 1 (its norm multiplies by 1 + w;
 *              convert_hf_to_gguf adds the 1)
 *   A_LOG      qwen3next A_log = ln(-ssm_a) (the converter writes ssm_a = -exp(A_log))
 *   QKVZ       qwen3next in_proj_qkvz from attn_qkv (src) and attn_gate (src2): per key head g
 *              (n_heads of them) rows [q_g (grp_qk), k_g (grp_qk), v_g (grp_vz), z_g (grp_vz)],
 *              the converter's regrouping inverted
 *   VROWS      qwen35moe: the value heads of rows [v_off, v_off + v_nk v_r v_hd) back from
 *              llama.cpp's tiled order (GGUF head jj v_nk + g) to transformers' grouped order
 *              (HF head g v_r + jj), v_hd rows per head; the other rows copied
 *   VCOLS      the same on the elements [v_off, ...) of every row (out_proj's columns, dt_bias)
 *   VCOLS_ALOG VCOLS, then A_log = ln(-x)
 *   CAT_GU     qwen35moe gate_up_proj [X, 2F, E]: expert e's gate rows (src) then its up rows
 *              (src2) */
typedef enum {
    FH_COPY, FH_SLICE, FH_UNPERMUTE, FH_GATE_UP, FH_GATE_UP_B, FH_DOWN_T, FH_MINUS1, FH_A_LOG,
    FH_QKVZ, FH_VROWS, FH_VCOLS, FH_VCOLS_ALOG, FH_CAT_GU
} forge_hf_op;

typedef struct {
    char name[96];
    int n_dims;
    int64_t shape[3];  /* HF (PyTorch) order */
    forge_hf_op op;
    int src, src2;     /* tensor list indices (src2: the up tensor for GATE_UP*) */
    int64_t expert;    /* SLICE */
    int64_t n_heads;   /* UNPERMUTE, QKVZ */
    int64_t grp_qk, grp_vz; /* QKVZ: rows of q (and of k), of v (and of z) per key head */
    int64_t v_nk, v_r, v_hd, v_off; /* VROWS, VCOLS*: key heads, value heads per key head, rows
                                       (or elements) per head, first row (element) */
} forge_hf_tensor;

typedef struct {
    bool mtp; /* qwen35moe: plan the MTP blocks too (mtp.*: what the published checkpoints hold;
                 without it they are left out, as transformers saves the model) */
} forge_hf_opts;

hm_status forge_hf_plan(const forge_preset *p, const forge_tensor_list *l, forge_hf_tensor **out,
                        int *n_out, hm_error *err);
/* forge_hf_plan with options (o NULL: the defaults) */
hm_status forge_hf_plan_opts(const forge_preset *p, const forge_tensor_list *l, const forge_hf_opts *o,
                             forge_hf_tensor **out, int *n_out, hm_error *err);
int64_t forge_hf_nelem(const forge_hf_tensor *h);

/* ---- router skew simulation (forge_sim.c) ---- */
/* Routes n_samples unit-Gaussian hidden states through the forged router of every layer and
 * returns in hit[j] the fraction of top-k selections that fall on the cache_n[j] most popular
 * experts of their layer (averaged over layers). */
hm_status forge_sim_hits(const forge_preset *p, const forge_gen *g, int n_samples,
                         const int *cache_n, int n_cache, double *hit, hm_error *err);

/* ---- progress (forge_progress.c) ---- */
typedef struct {
    bool tty;
    uint64_t total, done;
    double t0, last_draw;
    const char *label;
} forge_progress;

double forge_now(void);
void forge_progress_begin(forge_progress *pr, const char *label, uint64_t total, bool tty);
void forge_progress_add(forge_progress *pr, uint64_t n);
void forge_progress_end(forge_progress *pr);

#endif
