/* ops.h - CPU operators of the forward pass other than the weight products (cpu/matmul.h):
 * RMS norms, RoPE (normal, neox, YaRN, frequency factors), attention over a KV cache (GQA,
 * causal, sliding window, sinks, f32/f16/q8_0 cache), activations (SiLU, SwiGLU, gpt-oss's
 * clamped SwiGLU, GELU-tanh gated, sigmoid),
 * MoE routers (softmax->top-k, top-k->softmax) and the per-slot expert combine.
 *
 * DESIGN: plain functions over caller-owned f32 buffers; shapes are given in each comment as
 * [outer]...[inner], all contiguous, row-major. Every output element is computed by exactly one
 * thread with a fixed, documented reduction order, so results are bit-identical whatever the
 * thread count (pool NULL = single thread). Float arithmetic is single IEEE operations without
 * contraction (-ffp-contract=off), so a GPU version can reproduce the elementwise ops bit for bit
 * using __fmul_rn/__fadd_rn/__fdiv_rn and the exp of ops_math.h. Reductions:
 *   - sums of squares (rmsnorm) accumulate (double)x*x in double, 32 partial sums (element
 *     i into sum i mod 32, in increasing i), combined by the halving tree c[l] += c[l + w]
 *     for w = 16, 8, 4, 2, 1 (a GPU warp's lanes and shuffle tree);
 *   - attention scores are dot8(k, q): the cached K row dequantised exactly to f32 (f16
 *     widened, q8_0 as (float)q * d), q in f32; 8 lanes, acc[l] = fmaf(k[i], q[i], acc[l])
 *     for i ascending with l = i mod 8 (acc starting at +0), then acc[l] += acc[l + 4] (l < 4),
 *     acc[l] += acc[l + 2] (l < 2), result acc[0] + acc[1]; the softmax-weighted sum of V is,
 *     per output element, acc = acc + p_q * v_q (mul, then add) in position order from +0;
 *   - softmax subtracts the maximum, exponentiates with hm_expf (ops_math.h) and sums in index
 *     (router) or position (attention) order, sink last.
 * In-place use (y == x) is allowed for every elementwise op, norm and rope.
 */
#ifndef HM_CPU_OPS_H
#define HM_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/threadpool.h"

/* ------------------------------------------------------------------ norms and elementwise */

/* y[r][i] = (x[r][i] * s_r) * w[i], s_r = 1 / sqrtf((float)(sum_i (double)x[r][i]^2 / n) + eps)
 * (the sum in double as described at the top, divided by n in double, rounded to float, then eps
 * added in float; w == NULL means no weight). x, y: [n_rows][n]; w: [n].
 *   - the usual norm: n_rows = n_tok, n = n_embd;
 *   - qwen3 q/k norm over each head: x = q [n_tok][n_head][head_dim], n_rows = n_tok*n_head,
 *     n = head_dim, w = [head_dim];
 *   - olmoe q/k norm over the whole projection: n_rows = n_tok, n = n_head*head_dim. */
void cpu_rmsnorm(tp_pool *pool, const float *x, const float *w, float *y, int64_t n_rows,
                 int64_t n, float eps);

/* y[i] = a[i] + b[i]; a, b, y: [n]. */
void cpu_add(tp_pool *pool, const float *a, const float *b, float *y, int64_t n);
/* y[i] = a[i] * b[i]; a, b, y: [n]. */
void cpu_mul(tp_pool *pool, const float *a, const float *b, float *y, int64_t n);
/* y[i] = a[i] * s; a, y: [n]. */
void cpu_scale(tp_pool *pool, const float *a, float s, float *y, int64_t n);
/* Bias broadcast over rows: x[r][i] += b[i]; x: [n_rows][n]; b: [n]. */
void cpu_add_bias(tp_pool *pool, float *x, const float *b, int64_t n_rows, int64_t n);
/* Per-expert bias of a grouped expert product: y[t][s][i] += bias[ids[t][s]][i] for slots with
 * ids[t][s] >= 0 (ids < n_expert is the caller's promise, as checked by cpu_moe_matmul).
 * y: [n_tok][n_used][n]; bias: [n_expert][n]; ids: [n_tok][n_used]. */
void cpu_moe_add_bias(tp_pool *pool, float *y, const float *bias, const int32_t *ids,
                      int64_t n_tok, int n_used, int64_t n);
/* Weighted sum of the slots, in slot order: out[t][i] = ((0 + w[t][0]*y[t][0][i]) +
 * w[t][1]*y[t][1][i]) + ... (each product and sum one float rounding; slots with ids[t][s] < 0
 * are skipped; ids NULL = none skipped). y: [n_tok][n_used][n]; w: [n_tok][n_used];
 * out: [n_tok][n]. out must not alias y. */
void cpu_moe_combine(tp_pool *pool, const float *y, const float *w, const int32_t *ids,
                     int64_t n_tok, int n_used, int64_t n, float *out);
/* Elements [r0, r1) of one token's cpu_moe_combine, its bytes: y [n_used][n] of that token,
 * w and ids [n_used] (ids NULL = none skipped), out [n]. */
void cpu_moe_combine_rows(const float *y, const float *w, const int32_t *ids, int n_used,
                          int64_t n, int64_t r0, int64_t r1, float *out);

/* ------------------------------------------------------------------ activations */
/* silu(x) = x / (1 + hm_expf(-x)); sigmoid(x) = 1 / (1 + hm_expf(-x)) (ops_math.h). */

/* y[i] = silu(x[i]); x, y: [n]. */
void cpu_silu(tp_pool *pool, const float *x, float *y, int64_t n);
/* y[i] = sigmoid(x[i]); x, y: [n]. */
void cpu_sigmoid(tp_pool *pool, const float *x, float *y, int64_t n);
/* out[i] = silu(gate[i]) * up[i]; gate, up, out: [n] (e.g. [n_tok][n_used][n_ff]). out may
 * alias gate or up. */
void cpu_swiglu(tp_pool *pool, const float *gate, const float *up, float *out, int64_t n);
/* gpt-oss (transformers GptOssExperts): g = min(gate, limit); u = clamp(up, -limit, limit);
 * out = (g * sigmoid(g * alpha)) * (u + 1). alpha = 1.702, limit = 7 for gpt-oss. Shapes as
 * cpu_swiglu. */
void cpu_swiglu_oai(tp_pool *pool, const float *gate, const float *up, float *out, int64_t n,
                    float alpha, float limit);
/* Gemma's gated GELU (tanh approximation, transformers' gelu_pytorch_tanh, ggml's gelu):
 * out[i] = hm_geluf(gate[i]) * up[i] (ops_math.h: g * sigmoid(2u), the GPU's bits). Shapes as
 * cpu_swiglu. */
void cpu_geglu(tp_pool *pool, const float *gate, const float *up, float *out, int64_t n);
/* The gated activations of an expert FFN (cpu_swiglu_slice's kind). */
enum { CPU_GLU_SILU = 0, CPU_GLU_OAI = 1, CPU_GLU_GELU = 2 };
/* Whether the activations above may take their SIMD path (hm_cpu_has_avx2: it executes cpuid,
 * which costs microseconds in a VM, so callers of many small slices read it once). */
int cpu_act_simd(void);
/* cpu_swiglu (kind CPU_GLU_SILU), cpu_swiglu_oai (CPU_GLU_OAI, alpha, limit) or cpu_geglu
 * (CPU_GLU_GELU) on the calling thread, with the SIMD choice simd = cpu_act_simd() made by the
 * caller: for small slices inside a pool job. Same values as the pooled forms. */
void cpu_swiglu_slice(const float *gate, const float *up, float *out, int64_t n, int kind,
                      float alpha, float limit, int simd);

/* ------------------------------------------------------------------ RoPE */

typedef enum {
    CPU_ROPE_NORM = 0, /* llama.cpp "norm" (llama, mixtral): rotates pairs (2i, 2i+1) */
    CPU_ROPE_NEOX = 2, /* llama.cpp "neox" (qwen*, olmoe, gpt-oss): rotates (i, i + n_dims/2) */
} cpu_rope_mode;

/* Which YaRN variant: the ramp between the correction dimensions of llama.cpp's
 * ggml_rope_yarn_corr_dims floors/ceils them (transformers: rope_scaling.truncate = true, the
 * default); gpt-oss's config says truncate = false (transformers then uses them unrounded). */
typedef struct {
    cpu_rope_mode mode;
    int n_dims;           /* rotated dimensions (rope.dimension_count), even, <= head_dim */
    float freq_base;      /* rope.freq_base (theta) */
    float freq_scale;     /* 1 / rope.scaling.factor; 1 = no scaling */
    /* YaRN (ext_factor != 0 enables it, as llama.cpp; ext_factor = 1 for gpt-oss): */
    float ext_factor;     /* ramp mix factor; 0 = plain (linear if freq_scale != 1) */
    float attn_factor;    /* extra multiplier of cos/sin; 1 normally */
    int n_ctx_orig;       /* rope.scaling.original_context_length */
    float beta_fast;      /* 32 */
    float beta_slow;      /* 1 */
    int yarn_truncate;    /* 1: floor/ceil the correction dims (llama.cpp); 0: gpt-oss/HF */
    const float *freq_factors; /* [n_dims / 2] or NULL: pair i's theta_extrap divided by
                                  freq_factors[i] (llama.cpp's rope_freqs; gemma4's proportional
                                  rope: 1 on the rotated pairs, 1e30 on the others) */
} cpu_rope_params;

/* Fills the common defaults: mode, n_dims, freq_base given; freq_scale 1, ext_factor 0,
 * attn_factor 1, beta_fast 32, beta_slow 1, yarn_truncate 1. */
cpu_rope_params cpu_rope_default(cpu_rope_mode mode, int n_dims, float freq_base);

/* Rotates x in place: x: [n_tok][n_head][head_dim], token t at position pos[t] (pos: [n_tok]).
 * Dimensions >= n_dims are left alone. Angles are computed in double:
 *   theta_extrap(i) = pos * freq_base^(-2i/n_dims) (/ freq_factors[i] when given), i = pair
 *   index in [0, n_dims/2);
 *   without YaRN theta = freq_scale * theta_extrap, mscale = attn_factor;
 *   with YaRN (ext_factor != 0): ramp(i) = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1),
 *     lo/hi = correction dims for beta_fast/beta_slow
 *     (n_dims * ln(n_ctx_orig / (beta * 2 pi)) / (2 ln freq_base), floored/ceiled if
 *     yarn_truncate, clamped to [0, n_dims - 1]), mix = ramp * ext_factor,
 *     theta = theta_interp * (1 - mix) + theta_extrap * mix,
 *     mscale = attn_factor * (1 + 0.1 ln(1 / freq_scale));
 *   c = (float)(cos(theta) * mscale), s = (float)(sin(theta) * mscale) (double, then rounded);
 *   (x0, x1) -> (x0*c - x1*s, x0*s + x1*c) in float.
 * This is llama.cpp's rope_yarn and transformers' _compute_yarn_parameters (which agree: the
 * transformers attention_factor default 0.1 ln(factor) + 1 equals llama.cpp's mscale), with
 * transformers' truncate switch. Fails (HM_ERR_ARG) on odd or too large n_dims. */
hm_status cpu_rope(tp_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim,
                   const int32_t *pos, const cpu_rope_params *p, hm_error *err);

/* cpu_rope in two steps, for a forward pass that rotates q and k of every layer at the same
 * positions: cpu_rope_table writes each token's c, s (cs: [n_tok][n_dims / 2][2]) once, and
 * cpu_rope_with_table rotates with them. Same bits as cpu_rope; same argument checks. */
hm_status cpu_rope_table(const cpu_rope_params *p, int head_dim, const int32_t *pos,
                         int64_t n_tok, float *cs, hm_error *err);
hm_status cpu_rope_with_table(tp_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim,
                              const float *cs, const cpu_rope_params *p, hm_error *err);

/* ------------------------------------------------------------------ KV cache and attention */

/* One layer's K and V cache, a ring of n_slots rows: position p lives in slot p % n_slots.
 * A full-attention layer uses n_slots = n_ctx; a sliding-window layer (window W, batches of at
 * most n_batch tokens) may use n_slots = cpu_kv_slots_needed(W, n_batch) and never holds more.
 * Row layout: one row per position, [n_head_kv][head_dim] elements of type_k / type_v
 * (HM_TYPE_F32, HM_TYPE_F16, HM_TYPE_BF16 or HM_TYPE_Q8_0; q8_0 needs head_dim % 32 == 0,
 * blocks never cross heads). slot_pos[s] is the position stored in slot s, -1 when empty:
 * attention checks that every position it reads is present (HM_ERR_STATE otherwise), so a
 * rewind that lost positions of a window ring is an error rather than garbage. The struct is a
 * view: cpu_kv_init allocates the buffers, but a caller may point k/v/slot_pos at memory of its
 * own. */
typedef struct {
    uint32_t type_k, type_v;
    int n_head_kv, head_dim;
    int64_t n_slots;
    size_t k_row_size, v_row_size; /* bytes per position row */
    void *k;                        /* [n_slots] rows of k_row_size bytes */
    void *v;                        /* [n_slots] rows of v_row_size bytes */
    int64_t *slot_pos;              /* [n_slots] */
} cpu_kv_layer;

/* Slots a ring needs so that a batch of n_batch tokens can be stored before attention while
 * every token still sees its last `window` positions: window + n_batch - 1. window <= 0 means
 * full attention (returns -1: use n_ctx). */
int64_t cpu_kv_slots_needed(int64_t window, int64_t n_batch);
/* Allocates the buffers (zeroed, all slots empty). */
hm_status cpu_kv_init(cpu_kv_layer *kv, uint32_t type_k, uint32_t type_v, int n_head_kv,
                      int head_dim, int64_t n_slots, hm_error *err);
void cpu_kv_free(cpu_kv_layer *kv);
/* Marks every slot empty (a new sequence). */
void cpu_kv_clear(cpu_kv_layer *kv);
/* Stores rows for positions pos0..pos0+n_tok-1: k, v: [n_tok][n_head_kv][head_dim] f32
 * (converted to the cache types: f32 copied, f16 and bf16 round to nearest even, q8_0 as
 * quant_quantize_row). */
hm_status cpu_kv_store(tp_pool *pool, cpu_kv_layer *kv, int64_t pos0, int64_t n_tok,
                       const float *k, const float *v, hm_error *err);
/* cpu_kv_store by parts, e.g. from the items that computed them: kv head h of position pos
 * (k, v: [head_dim] f32) into its slot, the bytes cpu_kv_store writes there (no block crosses
 * a head); HM_ERR_RANGE (q8_0 cache, a value not finite) leaves the slot unmarked. Once every
 * head of positions pos0..pos0+n_tok-1 is stored, cpu_kv_mark records them in slot_pos. */
hm_status cpu_kv_store_head(cpu_kv_layer *kv, int64_t pos, int h, const float *k, const float *v);
void cpu_kv_mark(cpu_kv_layer *kv, int64_t pos0, int64_t n_tok);

typedef struct {
    int n_head;            /* query heads; n_head % kv->n_head_kv == 0; q head h reads kv head
                              h / (n_head / n_head_kv) (ggml broadcast, transformers repeat_kv) */
    int64_t n_tok;         /* new tokens, at positions pos0 .. pos0 + n_tok - 1 */
    int64_t pos0;
    int64_t window;        /* > 0: token at p sees positions q with p - window < q <= p
                              (llama.cpp LLAMA_SWA_TYPE_STANDARD, transformers sliding_window);
                              <= 0: all q <= p */
    float scale;           /* score = (q.k) * scale; 0 means 1/sqrtf(head_dim) */
    const float *sinks;    /* [n_head] or NULL: gpt-oss's learned logit per head, joins the
                              softmax's max and denominator but has no value row */
    const float *q;        /* [n_tok][n_head][head_dim] f32 (roped) */
    const float *k_new;    /* [n_tok][n_head_kv][head_dim] f32 (roped) or NULL if already stored */
    const float *v_new;    /* [n_tok][n_head_kv][head_dim] f32 or NULL (with k_new) */
    float *out;            /* [n_tok][n_head][head_dim] f32 */
    int no_simd;           /* 1: scalar loops even where AVX2 exists (tests; the result is
                              bit-identical either way) */
} cpu_attn_args;

/* Bytes of scratch cpu_attention needs with nth threads. */
size_t cpu_attention_scratch_size(const cpu_kv_layer *kv, const cpu_attn_args *a, int nth);

/* Stores k_new/v_new (if given) at pos0.., then for every (token t, head h), p = pos0 + t:
 *   s_q = dot(K[q][kvh], q[t][h]) * scale for visible q (ascending position order; dot as
 *         described at the top of this file),
 *   m = max(s_q..., sink_h), e_q = hm_expf(s_q - m), den = (sum_q e_q) + hm_expf(sink_h - m),
 *   out[t][h] = (sum_q e_q * dequant V[q][kvh]) / den   (sums in position order; the V sum is
 *   elementwise acc = acc + e_q * v, then each element divided by den).
 * Work items are (token, head) pairs split across the pool. Errors: bad shapes (HM_ERR_ARG),
 * a window ring too small for this batch or a needed position not in the cache
 * (HM_ERR_STATE). scratch NULL = allocate. */
hm_status cpu_attention(tp_pool *pool, cpu_kv_layer *kv, const cpu_attn_args *a, void *scratch,
                        size_t scratch_size, hm_error *err);

/* cpu_attention in steps, as one stage of a caller's staged pool job (tp_run_stages):
 * cpu_attention_plan checks the arguments and the ring as cpu_attention does and plans the items
 * for a pool of nth threads (scratch required, cpu_attention_scratch_size(kv, a, nth) bytes);
 * cpu_attention_begin stores k_new/v_new and checks that every position read is cached (on the
 * calling thread when pool is NULL, e.g. in the previous stage's `then`); cpu_attention_stage
 * is the stage whose items compute out. *a must live until the stage has run. Results are those
 * of cpu_attention. The job's fields are private to ops_attn.c. */
typedef struct {
    cpu_kv_layer *kv;
    const cpu_attn_args *a;
    int n_rep, n_sub, rep_per_sub;
    int64_t n_items, max_nv, first, last; /* first..last: positions read */
    float scale;
    int simd;                             /* ops_attn_{qk,pv}_avx2 */
    uint8_t *scratch;
    size_t per_thread;
    /* may be set after cpu_attention_plan: called by the item that wrote out's heads [h0, h1)
     * of token t, right after (e.g. to quantise them for the next product on that core) */
    void (*on_out)(void *ctx, int64_t t, int h0, int h1);
    void *on_out_ctx;
} cpu_attn_job;
hm_status cpu_attention_plan(cpu_attn_job *j, cpu_kv_layer *kv, const cpu_attn_args *a, int nth,
                             void *scratch, size_t scratch_size, hm_error *err);
hm_status cpu_attention_begin(tp_pool *pool, cpu_attn_job *j, hm_error *err);
tp_stage cpu_attention_stage(cpu_attn_job *j);
/* Which token t, KV head g and query heads [h0, h1) item `item` of the stage computes (a caller
 * that runs the items as soon as those heads are ready). */
void cpu_attention_item_heads(const cpu_attn_job *j, int64_t item, int64_t *t, int *g, int *h0,
                              int *h1);

/* ------------------------------------------------ linear attention (ops_delta.c) */

/* The delta-net layers of the hybrid architectures (Qwen3-Next, Qwen3.5), one token at a
 * time, for prompts as for decode steps (the same bytes either way). */

/* A causal depthwise convolution of width K over C channels, one token: y[c] = sum over j < K-1
 * of w[c][j] * state[j][c] (oldest first), plus w[c][K-1] * x[c]; then the state drops its
 * oldest row and appends x. state [K-1][C], w [C][K] (llama.cpp's ssm_conv1d rows), x, y [C]. */
void cpu_conv1d_causal(float *state, const float *w, const float *x, float *y, int64_t C, int K);
/* x /= max(|x|, eps) (the delta rule's q and k per head). */
void cpu_l2_norm(float *x, int64_t n, float eps);
/* The gated delta rule for one value head and one token, in place on its state S [dk][dv]:
 *   S = S * exp(g);  d = (v - S^T k) * beta;  S = S + k d^T;  o = S^T q
 * (q, k [dk] already L2-normalised, q scaled by 1/sqrt(dk); v, o [dv]; g <= 0 the log decay;
 * beta in (0, 1)). Sums in index order; scratch [dv]. simd = cpu_act_simd() (read once by the
 * caller): AVX2 columns where dv % 8 == 0, the same bytes. */
void cpu_delta_rule(float *S, const float *q, const float *k, const float *v, float g, float beta,
                    int64_t dk, int64_t dv, float *o, float *scratch, int simd);

/* ------------------------------------------------------------------ routers */

typedef enum {
    CPU_GATE_SOFTMAX_TOPK = 0, /* probs = softmax(logits + bias) over all experts, top-k by prob;
                                  weights = the k probs, divided by their sum if renorm
                                  (qwen3moe/mixtral: renorm; olmoe/qwen2moe: norm_topk_prob) */
    CPU_GATE_TOPK_SOFTMAX = 1, /* top-k of (logits + bias), weights = softmax over those k
                                  (gpt-oss) */
} cpu_gate_mode;

/* logits: [n_tok][n_expert]; bias: [n_expert] or NULL (added to the logits; selects and
 * weighs, as gpt-oss's router bias); ids: [n_tok][k] int32; weights: [n_tok][k] f32. Slots are
 * ordered by descending score; equal scores: lower expert id first. Softmax: max subtracted,
 * hm_expf, sum in expert-id order (TOPK_SOFTMAX: in slot order), each value divided by the sum;
 * renorm: sum of the k weights in slot order, each divided by it. Fails (HM_ERR_ARG) unless
 * 1 <= k <= n_expert. */
hm_status cpu_router(tp_pool *pool, const float *logits, const float *bias, int64_t n_tok,
                     int n_expert, int k, cpu_gate_mode mode, int renorm, int32_t *ids,
                     float *weights, hm_error *err);

#endif
