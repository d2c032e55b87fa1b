/* cuda_engine_internal.h - the engine struct and the enqueue-only entry points, for the engine's
 * own .cu files and for the autonomous decode loop (cuda_decode.cu). Plain C (no CUDA types:
 * a stream is void *, device pointers are plain pointers), includable from C and CUDA.
 *
 * One decode step for E2's graph:
 *     cuda_engine_enqueue_step(e, d_token, 1, err);   reads *d_token, *e->d_pos;
 *                                                      e->d_logits[0][n_vocab] = logits;
 *                                                      *e->d_pos += 1
 * No host synchronisation, allocation or device->host copy happens inside any enqueue function;
 * every scalar that changes per step (token ids, the position) is read from device memory, so
 * one capture replays for every step. n_tok is a capture-time constant.
 */
#ifndef HM_CUDA_CUDA_ENGINE_INTERNAL_H
#define HM_CUDA_CUDA_ENGINE_INTERNAL_H

#ifdef __cplusplus
extern "C" {
#endif

#include "cuda/cuda_attn.h"
#include "cuda/cuda_engine.h"
#include "cuda/cuda_fetch.h"
#include "cuda/cuda_handoff.h"

/* A tensor in the device arena (same meaning as hm_tensor; d == NULL when absent). */
typedef struct {
    const char *name; /* the model's name (host string owned by the model) */
    uint32_t type;
    int64_t ne[4];
    size_t row_size;
    const void *d; /* device pointer */
} cuda_tensor;

typedef struct {
    bool swa;
    int n_kv, hd; /* the layer's kv heads and head size (hm_model_layer_kv: gemma4's kinds) */
    cuda_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, q_norm, k_norm, sinks, ffn_norm;
    cuda_tensor router, router_b, gate_exps, up_exps, down_exps, gate_exps_b, up_exps_b,
        down_exps_b, sh_gate, sh_up, sh_down, sh_gate_inp;
    /* The expert tensors (gate/up/down_exps and their biases) hold n_slots experts each (their
     * ne stay the model's, n_expert): expert e's bytes at d + slot_of[e] * (bytes of one
     * expert), its device slot (residency map). slot_of: device [n_expert], this layer's row
     * of cuda_engine.d_slot_of. */
    int64_t n_slots;
    const int32_t *slot_of;
    /* a host layer: every expert stays in host memory (no slot, n_slots 0, no expert bytes on
     * the device); the CPU computes them through the hand-off (cuda_handoff.h) */
    bool host;
    /* a mixed layer (the hot cache): some experts have a device slot (hot), the others stay in
     * host memory (cold); the GPU runs the hot slots while the CPU computes the cold ones
     * through the hand-off, and the merge sums the slots in order */
    bool mixed;
    /* device KV cache of this layer: [n_ctx][n_head_kv * head_dim] (K and V) of p.type_k: f16
     * bits or f32; every layer holds n_ctx positions, the sliding window only masks */
    void *k_cache, *v_cache;
    /* a gated delta-net layer (hybrid architectures, cuda_engine_hybrid.cu): no KV cache; the
     * sequences' recurrent states rs [n_seq][rs_floats] (cuda_delta.h's layout) */
    bool recurrent;
    cuda_tensor ssm_qkv, ssm_gate, ssm_ba, ssm_beta, ssm_alpha, ssm_out, ssm_conv1d, ssm_dt, ssm_a,
        ssm_norm;
    float *rs;
    int64_t rs_floats;
    /* gemma4 (cuda_engine_gemma4.cu): the norms around its blocks, the dense MLP beside the
     * experts, the router's input scale, the experts' output scales (by expert id), the
     * layer's output scalar (a device float) */
    cuda_tensor attn_post_norm, ffn_gate, ffn_up, ffn_down, ffn_post_norm1, ffn_pre_norm2,
        ffn_post_norm2, ffn_post_norm, router_scale, down_exps_scale, out_scale;
} cuda_layer;

/* Steps of up to this many tokens are decode-sized: the fused kernels, bytes equal to the
 * CPU's; a tiered step of more fetches experts (cuda_fetch.h). */
#define CUDA_ENGINE_MATVEC_MAX_TOK 8
/* Expert products take the grouped GEMM (cuda_gemm.h) above this many tokens, the grouped
 * matvec kernel up to it: 16 sequences' decode step of q3 (ten pairs or fewer per expert) ran at
 * 398.71 t/s on the matvec kernel against 341.28 on the GEMM (batched-bench, H200, 2026-11-28);
 * larger steps not measured. */
#define CUDA_ENGINE_MOE_GEMM_MIN_TOK 16
/* Dense products (attention, shared expert, output) take the GEMM above this many tokens: at
 * 16 tokens its 64-token tiles left most SMs idle (the wo product: 185 us against the matvec's
 * 32 us, ncu on the H200, 2026-11-28), so the continuous batching of a server stays on the
 * matvec kernels. */
#define CUDA_ENGINE_GEMM_MIN_TOK 64

struct cuda_engine {
    const hm_model *m;
    const hm_arch_desc *desc;
    hm_hparams hp;
    cuda_engine_params p;
    char info[256];      /* cuda_engine_describe */
    void *stream;        /* cudaStream_t, created by the engine (non-blocking) */

    /* weights: one device arena */
    void *arena;
    uint64_t bytes_weights, bytes_kv, bytes_scratch;
    cuda_tensor tok_embd;    /* {n_embd, n_vocab} */
    cuda_tensor output_norm; /* {n_embd} f32 */
    cuda_tensor output;      /* {n_embd, n_vocab} */
    cuda_layer *layers;      /* [n_layer], host array of device pointers */
    void *kv_arena;          /* all layers' K and V */

    /* device scratch, nu = n_ubatch, n = tokens of the step (shapes as cpu_engine_internal.h) */
    void *scratch_arena;
    float *x;        /* [nu][n_embd] residual stream */
    float *xn;       /* [nu][n_embd] normed input of a sub-block */
    float *q;        /* [nu][n_head * hd_k] */
    float *k;        /* [nu][n_head_kv * hd_k] */
    float *v;        /* [nu][n_head_kv * hd_v] */
    float *attn;     /* [nu][n_head * hd_v] attention output before wo */
    float *proj;     /* [nu][n_embd] output of wo / of the MoE block */
    float *router;   /* [nu][n_expert] router logits */
    int32_t *ids;    /* [nu][n_used] selected experts (slot order) */
    int32_t *dslot;  /* [nu][n_used] the device slot of each selected expert (the router writes
                      * slot_of[ids]): what the expert kernels index the arenas with */
    float *gw;       /* [nu][n_used] gating weights */
    float *eg;       /* [nu][n_used][n_ff_exp] expert activation (fused gate/up output) */
    float *eu;       /* [nu][n_used][n_ff_exp] expert up (unfused path) */
    float *ey;       /* [nu][n_used][n_embd] per-slot expert outputs */
    float *sg;       /* [nu][n_ff_shexp] shared expert gate, then activation (gemma4: [nu][n_ff],
                      * the dense MLP's) */
    float *su;       /* [nu][n_ff_shexp] shared expert up (gemma4: [nu][n_ff]) */
    float *sgate;    /* [nu] shared expert sigmoid gate logit */
    void *act;       /* quantised activations: act_bytes, largest [nu][n_used] rows of any product */
    size_t act_bytes;
    void *gemm_scratch; /* cuda_gemm / cuda_gemm_moe scratch */
    size_t gemm_scratch_bytes;
    void *attn_scratch; /* cuda_attention scratch (largest over n_tok <= nu) */
    int *norm_sync;     /* [2 * nu] cuda_fused_norm_args.d_sync (zeroed with the arena) */
    int *router_sync;   /* [nu / 8 + 1] cuda_fused_router's d_sync (zeroed with the arena) */
    size_t attn_scratch_bytes;
    float *d_rope;      /* [n_ctx][n_rot/2][2] cos/sin table (cuda_rope_table_fill) */
    float *d_rope_swa;  /* gemma4's sliding layers' table [n_ctx][n_rot_swa/2][2], else NULL */
    int32_t *d_pos;       /* device scalar: position of the next step's first token */
    int32_t *d_positions; /* [nu] positions of the step's tokens (d_pos + t) */
    int32_t *d_base;      /* [nu] a step of several sequences: each token's first cache row */
    int32_t *d_tokens;    /* [nu] token ids uploaded by cuda_engine_decode */
    int32_t *d_slot_of;   /* [n_layer][n_expert] the expert->slot table (residency map) */
    int32_t *h_slot_of;   /* [n_layer][n_expert] its host copy (the expert lane's look-ups) */
    float *d_logits;      /* [n_logit_rows][n_vocab] */
    int n_logit_rows;     /* rows of d_logits (ALL mode is copied out in pieces of this) */

    /* hybrid architectures (cuda_engine_hybrid.cu), NULL otherwise */
    float *hy_qkv;  /* [nu][conv_dim] the delta net's q | k | v, then the convolution's output */
    float *hy_z;    /* [nu][v heads * head_v] the output gate's input */
    float *hy_ba;   /* [nu][2 * v heads] b and a */
    float *hy_o;    /* [nu][v heads * head_v] the gated heads' output; the gated attention's
                     * [nu][n_head][query | gate] rows ([nu][2 * nq]) */
    float *hy_gate; /* [nu][nq] the gated attention's gate */
    int32_t *d_runs; /* [nu][3] the step's runs (cuda_delta_run) */
    int32_t *h_runs; /* [nu][3] pinned: a step of several sequences' runs, uploaded */

    /* several sequences (cuda_engine_decode_seqs): the step's runs of consecutive tokens of
     * one sequence, read while the step is enqueued (n_runs 0: one sequence, the others) */
    int n_runs;
    int run_max;                     /* the longest of those runs */
    int *run_t0, *run_len, *run_seq; /* [nu] (host) */

    /* pinned host memory */
    int32_t *h_tokens; /* [nu] */
    int32_t *h_positions; /* [2][nu] the positions of a cuda_engine_decode_seqs step, then
                           * each token's first cache row (sequence * n_ctx: d_base) */
    int32_t *h_pos;    /* [1] */
    float *h_logits;   /* [n_logit_rows][n_vocab] */
    float *h_rows;     /* [nu][n_embd] input rows of cuda_engine_decode_rows (allocated by its
                        * first call) */

    bool use_gemm;           /* prompt ubatches on tensor cores (cuda_gemm.h) */
    uint64_t n_host_syncs;   /* every cuda_engine_sync (audit) */

    /* routing counts (cuda_engine_route_counts_*): device counters, allocated on first enable */
    void *count_arena;       /* d_stat, then d_hits */
    uint64_t *d_stat;        /* [n_layer][2] calls, tokens */
    uint32_t *d_hits;        /* [n_layer][n_expert] */
    void *h_count;           /* pinned host copy of count_arena (route_counts_read) */
    size_t count_bytes;
    bool counting;           /* the forward pass hands the counters to the router */
    uint32_t count_epoch;    /* += 1 at every switch: cuda_decode recaptures its step graph */

    /* the tiered step (cuda_handoff.h, cuda_handoff.cu): n_host 0 and the rest NULL without
     * host layers */
    int n_host;              /* layers the CPU side serves: host and mixed layers */
    int32_t *host_layers;    /* [n_host] their indices, ascending (host array) */
    void *ho_mem;            /* the mapped pinned allocation (host address) */
    size_t ho_bytes;
    cuda_handoff_view ho_h;  /* the hand-off, host addresses */
    cuda_handoff_view ho_d;  /* the same memory, device addresses */
    bool ho_attached;        /* a CPU side serves the requests (steps are refused without) */
    uint32_t *d_seq;         /* device scalar (scratch): the step's sequence number, += 1 at the
                              * start of every forward step */
    float *hsh;              /* [nu][n_embd] the shared expert's output, kept for the next norm
                              * (a host layer's computed while the CPU works); NULL without one */

    /* the hot cache's exchanges (cuda_hot.cu): a side stream, the exchanges whose copies are in
     * flight and the event that orders a copy after the steps enqueued before it */
    void *hot_stream;
    struct cuda_hot_pending *hot_pending; /* [CUDA_HOT_PENDING] */
    int n_hot_pending;
    struct cuda_hot_queue *hot_q; /* requests from another thread (cuda_engine_hot_request) */

    /* routing from a table (cuda_engine_route_table, cuda_ops.cu): [n_pos][n_layer][n_used] */
    int32_t *d_route_table;
    int route_table_pos;

    /* prompt ubatches' fetched experts at host layers (cuda_fetch.h, cuda_fetch.cu) */
    void *fetch_buf[2];         /* device staging buffers (the copy lane's; not owned) */
    size_t fetch_cap;           /* bytes of each; 0: the path is off */
    cuda_fetch_layout *fetch;   /* [n_layer] per layer (NULL until cuda_engine_fetch_set) */
    /* post-fetch at decode steps (cuda_fetch.h: cuda_engine_postfetch_set, cuda_postfetch.cu) */
    bool pf_on;
    int32_t *d_pfslot;          /* [CUDA_HANDOFF_PF_TOK][n_used] the scratch slot of each slot */
};

/* Product i (0 gate, 1 up, 2 down) of the expert FFN over e->dslot for n_tok tokens, weights
 * of n_slots experts w_stride bytes apart (0: packed) (cuda_engine_forward.cu). */
hm_status cuda_experts_gemm(cuda_engine *e, int i, uint32_t wtype, const void *w, size_t w_stride,
                            int n_slots, int n_tok, hm_error *err);
/* Bytes of a tensor's data (all of its dimensions); 0 when absent (cuda_engine_init.cu). */
size_t cuda_tensor_bytes(const hm_tensor *t);

/* After layer il's router: the route table's choice for the step's n tokens (cuda_route_table.cu). */
hm_status cuda_route_table_enqueue(cuda_engine *e, int il, int n, hm_error *err);
/* Frees the exchanges' stream and events (cuda_hot.cu); the engine's stream idle. */
void cuda_hot_free(cuda_engine *e);
/* The queue of requested exchanges, allocated when the engine has mixed layers. */
hm_status cuda_hot_init(cuda_engine *e, hm_error *err);
/* The engine's own thread, between steps (cuda_engine_decode, cuda_decode_launch): applies the
 * requested exchanges and publishes completed copies. */
void cuda_hot_service(cuda_engine *e);

/* Embedding + every layer for d_tokens[0..n_tok) (device memory) at positions *d_pos + t;
 * K/V stored into the cache; leaves the final residual in e->x [n_tok][n_embd]. Does not move
 * *d_pos. n_tok <= n_ubatch. d_tokens NULL: e->x already holds the input rows of layer
 * p.layer_begin (enqueued before); an engine with layer_begin > 0 takes only that. */
hm_status cuda_engine_enqueue_forward(cuda_engine *e, const int32_t *d_tokens, int n_tok,
                                      hm_error *err);
/* Final norm and output matrix for rows row0..row0+n_rows-1 of e->x into d_logits[0..n_rows).
 * n_rows <= n_logit_rows. */
hm_status cuda_engine_enqueue_logits(cuda_engine *e, int row0, int n_rows, hm_error *err);
/* *d_pos += n (one tiny kernel). */
hm_status cuda_engine_enqueue_advance(cuda_engine *e, int n, hm_error *err);
/* The expert FFN of layer il for n_tok tokens (one lane of the expert executor): inputs e->xn
 * [n_tok][n_embd] and e->dslot [n_tok][n_used] (device slots, < 0: skipped), per-slot outputs
 * into e->ey; matvec kernels only (the CPU's bytes), expert biases included. */
hm_status cuda_engine_enqueue_experts(cuda_engine *e, int il, int n_tok, hm_error *err);
/* forward + logits of the last token (d_logits[0]) + advance by n_tok. */
hm_status cuda_engine_enqueue_step(cuda_engine *e, const int32_t *d_tokens, int n_tok,
                                   hm_error *err);
/* The tiered step (cuda_handoff.cu). Allocates the hand-off for the engine's host layers (the
 * layers' host flags and e->n_host set): mapped pinned memory, zeroed, timeout 20 s until the
 * CPU side sets its own (hm_tiered_init). Nothing when n_host is 0. */
hm_status cuda_handoff_init(cuda_engine *e, hm_error *err);
/* Sets abort (a wait in flight ends), frees the memory; the stream must be idle or about to be. */
void cuda_handoff_free(cuda_engine *e);
/* Layer il's request for n_tok tokens from e->xn, e->ids, e->gw (post, one block), the wait for
 * the CPU's answer (one thread) and the answer copied into e->ey (take). cold_only (a mixed
 * layer): the request names only the slots without a device slot (e->dslot < 0; the others
 * posted as -1) and the take copies only those. */
hm_status cuda_handoff_enqueue_post(cuda_engine *e, int il, int n_tok, bool fetch, bool cold_only,
                                    hm_error *err);
hm_status cuda_handoff_enqueue_wait(cuda_engine *e, int il, hm_error *err);
hm_status cuda_handoff_enqueue_take(cuda_engine *e, int n_tok, bool cold_only, hm_error *err);
/* Whether layer il's decode request of n_tok tokens runs post-fetched down products
 * (cuda_postfetch.cu), and those products after the take: the slots of fslot >= 0. */
bool cuda_postfetch_active(const cuda_engine *e, int il, int n_tok);
hm_status cuda_postfetch_enqueue(cuda_engine *e, int il, int n_tok, hm_error *err);
/* Whether layer il's request for n_tok tokens takes the fetched-expert path (cuda_fetch.h). */
bool cuda_fetch_active(const cuda_engine *e, int il, int n_tok);
/* After the wait of such a request: the fetched experts' products on the staging buffer and the
 * CPU's slots from the hand-off, into e->ey (expert biases included). */
hm_status cuda_fetch_enqueue_experts(cuda_engine *e, int il, int n_tok, hm_error *err);
/* HM_ERR_STATE when the hand-off's abort word is set (a fault not yet reset): host API entries
 * refuse to start steps then. */
hm_status cuda_handoff_ready(const cuda_engine *e, hm_error *err);

/* Host: *d_pos = pos (through pinned memory, enqueued). */
hm_status cuda_engine_set_pos(cuda_engine *e, int pos, hm_error *err);
/* The one place the engine waits for its stream (counted in n_host_syncs). */
hm_status cuda_engine_sync(cuda_engine *e, hm_error *err);
/* Copies rows [0, n) of d_logits to dst through the pinned buffer (synchronises). */
hm_status cuda_engine_logits_to_host(cuda_engine *e, int n, float *dst, hm_error *err);
/* Layer L's attention for n_tok query tokens (q [n_tok][n_head][hd], positions d_pos) over the
 * caches kc/vc ([n_ctx] rows, their rows already stored) into out. */
hm_status cuda_engine_attn(cuda_engine *e, const cuda_layer *L, int n_tok, const int32_t *d_pos,
                           const float *q, const void *kc, const void *vc, float *out,
                           hm_error *err);
/* The shapes of a hybrid architecture's buffers (all 0 for the others): conv_dim (cd), the value
 * width (vd), v heads (nv), the gated attention's query width (nq), a layer's recurrent state
 * per sequence (rs_floats: (K-1) cd + nv head_k head_v). */
typedef struct {
    int64_t cd, vd, nv, nq, rs_floats;
} cuda_hybrid_dims;
cuda_hybrid_dims cuda_hybrid_dims_of(const hm_arch_desc *desc, const hm_hparams *hp);

/* A residual the decode path defers into the next norm kernel: x += add, or (combine) x += the
 * MoE combine of (ey [+ the down bias], gw, ids) [+ the shared expert's sh * sigmoid(sgate)]. */
typedef struct {
    const float *add;
    bool combine;
    const float *ey_bias; /* with combine: the down bias not yet added to ey, or NULL */
    int64_t n_slots;      /* ... stored by device slot (e->dslot): rows of ey_bias */
    const float *sh;      /* with combine: the shared expert's output [n][E] (e->hsh), or NULL */
} fwd_defer;

/* cuda_engine_forward.cu's steps for cuda_engine_hybrid.cu and cuda_engine_gemma4.cu: x += the
 * deferred residual and xn = rmsnorm(x) * norm, with *act = xn's activation rows for w[0]'s type
 * where cuda_engine_linears of w[0..nw) will read them (made by the norm's launch on decode
 * steps), else NULL; y = x . w for n rows;
 * y[i] = x . w[i] for nw <= 4 matrices reading one x (act: x's rows for w[0]'s type, or NULL;
 * decode steps quantise once per format and run each type's matrices in one launch);
 * x += proj now, or deferred (decode steps). */
hm_status cuda_engine_norm_in(cuda_engine *e, int n, fwd_defer *d, const cuda_tensor *norm,
                              const cuda_tensor *const *w, int nw, const void **act,
                              hm_error *err);
hm_status cuda_engine_linear(cuda_engine *e, const cuda_tensor *w, const float *x, int n,
                             float *y, hm_error *err);
hm_status cuda_engine_linears(cuda_engine *e, int nw, const cuda_tensor *const *w,
                              float *const *y, const float *x, const void *act, int n,
                              hm_error *err);
/* y = x . w on the matvec kernels whatever n (the CPU's bytes: a router's logits) */
hm_status cuda_engine_matvec(cuda_engine *e, const cuda_tensor *w, const float *x, int n, float *y,
                             hm_error *err);
hm_status cuda_engine_residual(cuda_engine *e, int n, fwd_defer *d, hm_error *err);
/* cuda_engine_hybrid.cu: a recurrent layer's block (norm, products, the delta net, ssm_out,
 * the residual); the gated attention's split of attn_q's rows into e->q and e->hy_gate, and
 * attn *= sigmoid(gate); the step's runs into e->d_runs (one sequence: one run of n tokens). */
hm_status cuda_engine_delta_block(cuda_engine *e, int il, int n, fwd_defer *d, hm_error *err);
hm_status cuda_engine_gate_split(cuda_engine *e, int n, hm_error *err);
hm_status cuda_engine_gate_apply(cuda_engine *e, int n, hm_error *err);
hm_status cuda_engine_runs_single(cuda_engine *e, int n, hm_error *err);
/* cuda_engine_gemma4.cu: the input rows' scale sqrt(n_embd) after the embedding; one whole
 * layer (attention, routing, experts, dense MLP, norms, the layer scalar), residuals not
 * deferred; the logits' soft-capping of n rows. */
hm_status cuda_engine_gemma4_embed(cuda_engine *e, int n, hm_error *err);
hm_status cuda_engine_gemma4_layer(cuda_engine *e, int il, int n, hm_error *err);
hm_status cuda_engine_softcap(cuda_engine *e, int n_rows, hm_error *err);
/* The expert FFN of layer L on the GPU for the step's n tokens (xn, e->dslot -> e->ey; the
 * forward's experts(): matvec or GEMM by size, the activation of the architecture) and the
 * experts of a host or mixed layer (the hand-off; the CPU's slots into e->ey). */
hm_status cuda_engine_experts_step(cuda_engine *e, int il, int n, hm_error *err);
/* The architecture's expert activation as cpu/ops.h's CPU_GLU_* (for cuda_glu_act and
 * cuda_moe_gate_up). */
int cuda_engine_glu(const cuda_engine *e);

/* The attention arguments of layer L for those (scratch: the engine's). */
cuda_attn_args cuda_engine_attn_args(const cuda_engine *e, const cuda_layer *L, int n_tok,
                                     const int32_t *d_pos, const float *q, const void *kc,
                                     const void *vc, float *out);
/* A step of several sequences (e->n_runs > 0), layer L: q and k roped at e->d_positions already;
 * per run, its k/v rows stored in its sequence's cache and its attention into e->attn
 * (cuda_engine_seqs.cu). */
hm_status cuda_engine_attn_runs(cuda_engine *e, const cuda_layer *L, hm_error *err);

#ifdef __cplusplus
}
#endif

#endif
