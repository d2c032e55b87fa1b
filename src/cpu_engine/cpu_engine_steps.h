/* cpu_engine_steps.h - the steps of a layer, shared by cpu_engine_forward.c (a decode layer as two
 * pool jobs), cpu_engine_front.c (the staged front of a layer) and cpu_engine_token.c (a whole
 * decode step as one pool job). Files depend on each other in one direction only:
 * steps <- front <- token <- forward. cpu_engine/ sources only. */
#ifndef HM_CPU_ENGINE_STEPS_H
#define HM_CPU_ENGINE_STEPS_H

#include <stdatomic.h>

#include "cpu/matmul.h"
#include "cpu_engine/cpu_engine_internal.h"

/* Up to MOE_FEW_TOK tokens (moe/moe_exec.h) a layer is two pool jobs (the staged front, the
 * one-job expert FFN). */

/* cpu_engine_steps.c: norms, rope, elementwise ops and the router of up to this many elements run
 * on the calling thread (for a decode step a pool job costs more than the op; results do not
 * depend on the thread count): ce_op_pool gives NULL then, else pool. */
enum { CE_INLINE_ELEMS = 65536 };
tp_pool *ce_op_pool(tp_pool *pool, int64_t elems);
/* y[n][rows] += b (when b has data). */
void ce_add_bias(tp_pool *pool, const hm_tensor *b, float *y, int64_t n, int64_t rows);
/* y[n][rows of w] = x[n][w->ne[0]] . w (+ bias b when given). */
hm_status ce_linear(cpu_engine *c, const hm_tensor *w, const hm_tensor *b, const float *x,
                    int64_t n, float *y, hm_error *err);
/* y[i] = x . w[i] for n_mat (<= CPU_MATMUL_MAX_MULTI) matrices of one input, without biases: one
 * pool job (the activations quantised once) when they share k and an activation format, else
 * one product each; the bytes of ce_linear either way. */
hm_status ce_linear_multi(cpu_engine *c, int n_mat, const hm_tensor *const *w, float *const *y,
                          const float *x, int64_t n, hm_error *err);
/* The product of n rows by w fits the engine's scratch. */
bool ce_mm_fits(const cpu_engine *c, const hm_tensor *w, int64_t n);
/* The q, k and v products of one layer: mats [3] (outputs c->q, c->k, c->v); true when they
 * share their input length and activation format (one product of three matrices). */
bool ce_qkv_mats(cpu_engine *c, const hm_layer *L, cpu_matmul_mat *mats);
/* After the q/k/v products: their biases, the q/k norms and rope (pool NULL inside a job). */
hm_status ce_qkv_finish(cpu_engine *c, const hm_layer *L, int n, tp_pool *pool,
                           hm_error *err);
cpu_attn_args ce_attn_args(const cpu_engine *c, int il, int n);
/* Attention of layer il over c->q, c->k, c->v (roped) into c->attn, one call per run of tokens
 * of one sequence at consecutive positions (K and V appended to that sequence's cache). */
hm_status ce_attend(cpu_engine *c, int il, int n, hm_error *err);

/* cpu_engine_hybrid.c: the front of a layer of a hybrid architecture (hm_arch_desc.hybrid):
 * the attention norm, the gated delta net (a recurrent layer, on each token's sequence state)
 * or the gated full attention, the residual, the FFN norm into c->xn and the router logits. */
hm_status ce_hybrid_front(cpu_engine *c, int il, int n, hm_error *err);
/* The sequence of token t of the current call. */
int ce_tok_seq(const cpu_engine *c, int t);
/* A call's tokens continue their sequences' recurrent states: token t (of sequence seq[t], or
 * c->cur_seq for every token when seq is NULL) must be at the position its state has reached
 * (tokens of one sequence in order); HM_ERR_STATE otherwise (a state cannot be rewound). */
hm_status ce_hybrid_positions(cpu_engine *c, const int32_t *seq, const int32_t *pos, int n,
                              hm_error *err);
/* After a successful call: each sequence's state has absorbed its tokens. */
void ce_hybrid_advance(cpu_engine *c, const int32_t *seq, int n);
/* The checkpoint of sequence seq's recurrent state: a copy of it now (cpu_engine_seq_restore). */
void ce_hybrid_checkpoint(cpu_engine *c, int seq);

/* cpu_engine_gemma4.c: gemma4 (hm_arch_desc.gemma4). ce_gemma4_begin before the layers of a
 * call of n tokens at c->pos: the embedding rows in c->x times sqrt(n_embd) (embed: the call
 * starts from token ids) and both layer kinds' rope tables in c->rope_cs. ce_gemma4_layer: the
 * whole of layer il (attention block, dense MLP and experts, their norms, the layer scalar) on
 * c->x. */
hm_status ce_gemma4_begin(cpu_engine *c, int n, bool embed, hm_error *err);
hm_status ce_gemma4_layer(cpu_engine *c, int il, int n, hm_error *err);

/* The front of a decode layer as one staged job: the stages are the products (q/k/v, the
 * heads, attention, wo, router; for one token q/k/v, heads and attention are one stage:
 * attn_in_qkv), each `then` the steps between it and the next. */
enum { CE_FRONT_STAGES = 5, CE_MAX_HEADS = 256 };
typedef struct {
    cpu_engine *c;
    const hm_layer *L;
    int n;
    cpu_attn_args aa;
    cpu_attn_job attn;
    cpu_matmul_job qkv, wo, router;
    cpu_rope_params rp;
    atomic_int head_fail; /* a heads-stage item's rope refused its arguments */
    atomic_int kv_fail;   /* bit t: token t's K or V could not be stored */
    hm_status st;         /* of the `then` steps; a failed step skips the later ones */
    hm_error err;
    bool by_head;         /* q/k heads as items of a stage of their own (which stores K, V) */
    bool heads_in_qkv;    /* one token: each head's item runs in the q/k/v stage, on the thread
                             that completes its rows (a k head: its k and v rows); the heads
                             stage keeps only its `then` */
    atomic_int head_rows[CE_MAX_HEADS]; /* [n_head + n_head_kv] rows done (heads_in_qkv) */
    bool attn_in_qkv;     /* heads_in_qkv and each attention item an item of the q/k/v stage too,
                             run once its q heads and KV head are done (no stage of its own) */
    atomic_int head_done[CE_MAX_HEADS]; /* [n_head + n_head_kv] 1 once the head's step ran */
    tp_stage qkv_stage, attn_stage; /* the two parts of that merged stage */
    int attn_at;          /* index of the attention (or merged) stage among the front's stages */
    bool out_by_item;     /* attention items quantise their output heads for wo */
    int q_mi;             /* q's index among the q/k/v job's matrices (k, v, q for one token) */
    /* per-thread norms (ce_front_thr) */
    int il;
    uint64_t epoch;       /* this layer's plans: the per-thread rows' tags */
    const struct ce_thr *thr; /* NULL: the norms run as `then` steps */
    tp_stage router_stage; /* the router product's own stage (router items wrap it) */
    quant_act_fn ffn_act;  /* the FFN input's activation format: its function and block */
    quant_act ffn_atype;
    int64_t ffn_blk;
} ce_front;

/* Per-thread norms of a one-token front (cpu_engine_token.c): instead of one thread norming the
 * residual row (and quantising it) while the others wait, each thread norms it itself at its
 * first q/k/v item (the attention norm) and at its router item (the FFN norm), into its own
 * slot, and uses that row: the same function on the same row, so the same bytes, and no serial
 * step between the FFN and the next q/k/v, nor between wo and the router. The router items
 * also quantise the FFN's input, block by block (item i the blocks i, i + N, ...), into xq. */
typedef struct ce_thr {
    uint8_t *buf;  /* [threads][stride]: a tag (u64), then the normed row [n_embd] (f32), then its
                      activation row for q/k/v and for the router, each 64-byte aligned */
    size_t stride; /* ce_thr_stride() */
    uint8_t *xq;   /* the FFN's input row in its activation format (cpu_moe_args.xq) */
} ce_thr;
size_t ce_thr_stride(const cpu_engine *c);
/* Makes a planned one-token front (its stages as ce_front_plan wrote them, ns of them) use
 * thr with the FFN's gate product of weight type ffn_wtype; false (nothing changed) when it
 * cannot. */
bool ce_front_thr(ce_front *f, const ce_thr *thr, tp_stage *stages, int ns,
                     uint32_t ffn_wtype);

/* Plans layer il's front for n tokens into *f (which must stay where it is until the stages
 * have run) and writes its stages (at most CE_FRONT_STAGES); returns their number, or 0 when
 * the layer cannot be one job (nothing done) or planning failed (*st says). The stages start
 * from c->xn quantised for q/k/v: ce_front_pre (the attention norm of c->x, then that). The
 * last stage leaves the router logits in c->router and the FFN's input in c->xn. */
int ce_front_plan(cpu_engine *c, int il, int n, ce_front *f, tp_stage *stages,
                     hm_status *st, hm_error *err);
void ce_front_pre(ce_front *f);
/* For the next token of a planned front (the same layer, n and thread count): the attention's
 * plan again (it depends on the position) and the failure flags cleared; *attn is the attention
 * stage to run. Returns 0 when the front can no longer be one job (attention scratch too small
 * for this context length: nothing done), 1 when done or planning failed (*st says). */
int ce_front_replan(ce_front *f, int il, tp_stage *attn, hm_status *st, hm_error *err);

/* cpu_engine_token.c: a decode step of one token as one pool job (every layer's stages and the
 * output matrix), when the model and context allow it (every expert on the executor's CPU lane,
 * no shared expert, every layer's front stageable); *done false otherwise (nothing done).
 * c->x holds the token's embedding and c->rope_cs its angles; logits [n_vocab] (NULL: none). */
hm_status ce_token_forward(cpu_engine *c, float *logits, bool *done, hm_error *err);
void ce_token_free(cpu_engine *c);

#endif
