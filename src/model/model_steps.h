/* model_steps.h - the staged steps of a decode layer, shared by model_forward.c (a layer as two
 * pool jobs) and model_token.c (a whole decode step as one pool job). model/ sources only. */
#ifndef HM_MODEL_STEPS_H
#define HM_MODEL_STEPS_H

#include <stdatomic.h>

#include "cpu/matmul.h"
#include "model/model_internal.h"

/* Up to this many tokens a layer is two pool jobs (the staged front, the one-job expert FFN). */
enum { MODEL_FEW_TOK = 4 };

/* model_forward.c's steps that the front (model_front.c) shares. */
bool model_mm_fits(const hm_context *c, const hm_tensor *w, int64_t n);
/* The q, k and v products of one layer: mats [3] (outputs c->q, c->k, c->v); true when they
 * share their input length and activation format (one product of three matrices). */
bool model_qkv_mats(hm_context *c, const hm_layer *L, cpu_matmul_mat *mats);
/* After the q/k/v products: their biases, the q/k norms and rope (pool NULL inside a job). */
hm_status model_qkv_finish(hm_context *c, const hm_layer *L, int n, tp_pool *pool,
                           hm_error *err);
cpu_attn_args model_attn_args(const hm_context *c, int il, int n);

/* The front of a decode layer as one staged job: the stages are the products (q/k/v, the
 * heads, attention, wo, router; for one token q/k/v, heads and attention are one stage:
 * attn_in_qkv), each `then` the steps between it and the next. */
enum { MODEL_FRONT_STAGES = 5, MODEL_MAX_HEADS = 256 };
typedef struct {
    hm_context *c;
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
    atomic_int head_rows[MODEL_MAX_HEADS]; /* [n_head + n_head_kv] rows done (heads_in_qkv) */
    bool attn_in_qkv;     /* heads_in_qkv and each attention item an item of the q/k/v stage too,
                             run once its q heads and KV head are done (no stage of its own) */
    atomic_int head_done[MODEL_MAX_HEADS]; /* [n_head + n_head_kv] 1 once the head's step ran */
    tp_stage qkv_stage, attn_stage; /* the two parts of that merged stage */
    int attn_at;          /* index of the attention (or merged) stage among the front's stages */
    bool out_by_item;     /* attention items quantise their output heads for wo */
    int q_mi;             /* q's index among the q/k/v job's matrices (k, v, q for one token) */
    /* per-thread norms (model_front_thr) */
    int il;
    uint64_t epoch;       /* this layer's plans: the per-thread rows' tags */
    const struct model_thr *thr; /* NULL: the norms run as `then` steps */
    tp_stage router_stage; /* the router product's own stage (router items wrap it) */
    quant_act_fn ffn_act;  /* the FFN input's activation format: its function and block */
    quant_act ffn_atype;
    int64_t ffn_blk;
} model_front;

/* Per-thread norms of a one-token front (model_token.c): instead of one thread norming the
 * residual row (and quantising it) while the others wait, each thread norms it itself at its
 * first q/k/v item (the attention norm) and at its router item (the FFN norm), into its own
 * slot, and uses that row: the same function on the same row, so the same bytes, and no serial
 * step between the FFN and the next q/k/v, nor between wo and the router. The router items
 * also quantise the FFN's input, block by block (item i the blocks i, i + N, ...), into xq. */
typedef struct model_thr {
    uint8_t *buf;  /* [threads][stride]: a tag (u64), then the normed row [n_embd] (f32), then its
                      activation row for q/k/v and for the router, each 64-byte aligned */
    size_t stride; /* model_thr_stride() */
    uint8_t *xq;   /* the FFN's input row in its activation format (cpu_moe_args.xq) */
} model_thr;
size_t model_thr_stride(const hm_context *c);
/* Makes a planned one-token front (its stages as model_front_plan wrote them, ns of them) use
 * thr with the FFN's gate product of weight type ffn_wtype; false (nothing changed) when it
 * cannot. */
bool model_front_thr(model_front *f, const model_thr *thr, tp_stage *stages, int ns,
                     uint32_t ffn_wtype);

/* Plans layer il's front for n tokens into *f (which must stay where it is until the stages
 * have run) and writes its stages (at most MODEL_FRONT_STAGES); returns their number, or 0 when
 * the layer cannot be one job (nothing done) or planning failed (*st says). The stages start
 * from c->xn quantised for q/k/v: model_front_pre (the attention norm of c->x, then that). The
 * last stage leaves the router logits in c->router and the FFN's input in c->xn. */
int model_front_plan(hm_context *c, int il, int n, model_front *f, tp_stage *stages,
                     hm_status *st, hm_error *err);
void model_front_pre(model_front *f);
/* For the next token of a planned front (the same layer, n and thread count): the attention's
 * plan again (it depends on the position) and the failure flags cleared; *attn is the attention
 * stage to run. Returns 0 when the front can no longer be one job (attention scratch too small
 * for this context length: nothing done), 1 when done or planning failed (*st says). */
int model_front_replan(model_front *f, int il, tp_stage *attn, hm_status *st, hm_error *err);

/* The expert FFN's three products for layer il (ids [n][K], input x [n][n_embd], per-slot
 * outputs y [n][K][n_embd]) and the gate/up post step's context; true when gate and up can be
 * one paired product (cpu_moe_matmul_pair, cpu_moe_ffn). */
typedef struct {
    const hm_layer *L;
    const int32_t *ids;
    float *eg, *eu;
    int64_t F;
    bool oai;
    int simd; /* cpu_act_simd(), read once per layer */
} model_moe_post_ctx;
bool model_moe_args(hm_context *c, int il, const int32_t *ids, int64_t n, int K, const float *x,
                    float *y, cpu_moe_args *gate, cpu_moe_args *up, cpu_moe_args *down,
                    model_moe_post_ctx *pc);
/* cpu_moe_post_fn: rows [r0, r1) of slot p: expert biases, then the activation into eg. */
void model_moe_post(void *ctx, int64_t p, int64_t r0, int64_t r1);

/* model_token.c: a decode step of one token as one pool job (every layer's stages and the output
 * matrix), when the model and context allow it (the default CPU expert executor, no routing
 * hook, no shared expert, every layer's front stageable); *done false otherwise (nothing done).
 * c->x holds the token's embedding and c->rope_cs its angles; logits [n_vocab] (NULL: none). */
hm_status model_token_forward(hm_context *c, float *logits, bool *done, hm_error *err);
void model_token_free(hm_context *c);

#endif
