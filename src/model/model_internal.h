/* model_internal.h - the model and context structs, shared by the model/ sources only. */
#ifndef HM_MODEL_INTERNAL_H
#define HM_MODEL_INTERNAL_H

#include "base/threadpool.h"
#include "cpu/ops.h"
#include "model/model.h"
#include "quant/quant.h"

struct hm_model {
    gguf_ctx *g;
    const hm_arch_desc *desc;
    hm_hparams hp;
    hm_tensor tok_embd;    /* {n_embd, n_vocab} any supported type */
    hm_tensor output_norm; /* {n_embd} f32 */
    hm_tensor output;      /* {n_embd, n_vocab} */
    hm_layer *layers;      /* [n_layer] */
    float *owned;          /* small vectors converted to f32 at load (norms, biases of other
                              types); hm_tensor.data points into it */
    uint64_t weight_bytes;
    void **f32_copies;     /* [n_f32_copies] matrices dequantised by params.f32_weights */
    int n_f32_copies;
    struct model_x8_copy *x8_copies; /* [n_x8_copies] repacked matrices (params.repack) */
    int n_x8_copies;
};

/* model_repack.c: params.repack's copies. The bytes they will take (0: none wanted or the CPU
 * lacks the kernels) and in *extra the RAM that repacking needs beyond the weights (the largest
 * matrix, whose copy exists before the file's pages of it are released, plus every copy whose
 * source is not the file's mapping); then the copies themselves (hm_tensor.x8 of each), and
 * their release. */
uint64_t model_repack_bytes(const hm_model *m, uint64_t *extra);
hm_status model_repack(hm_model *m, hm_error *err);
void model_repack_free(hm_model *m);

struct hm_context {
    const hm_model *m;
    hm_context_params p;
    tp_pool *pool;
    const quant_kernels *kern;
    cpu_kv_layer *kv;      /* [n_layer]; sliding-window layers hold a ring */
    int n_past;            /* positions held */

    /* scratch, sized for n_ubatch tokens (nu) */
    float *x;        /* [nu][n_embd] residual stream */
    float *xn;       /* [nu][n_embd] normed input of a sub-block */
    float *q;        /* [nu][n_head * hd_k] */
    float *k;        /* [nu][n_head_kv * hd_k] */
    float *v;        /* [nu][n_head_kv * hd_v] */
    float *attn;     /* [nu][n_head * hd_v] attention output (before wo) */
    float *proj;     /* [nu][n_embd] output of wo / of the MoE block */
    int32_t *pos;    /* [nu] positions of the ubatch's tokens */
    float *rope_cs;  /* [nu][n_rot / 2][2] cos, sin of each token's angles (every layer's rope) */
    void *attn_scratch;   /* cpu_attention scratch */
    size_t attn_scratch_size;
    float *router;   /* [nu][n_expert] router logits */
    int32_t *ids;    /* [nu][n_used] selected experts */
    float *gw;       /* [nu][n_used] gating weights */
    float *eg;       /* [nu][n_used][n_ff_exp] expert gate, then activation */
    float *eu;       /* [nu][n_used][n_ff_exp] expert up */
    float *ey;       /* [nu][n_used][n_embd] per-slot expert outputs */
    float *sg;       /* [nu][n_ff_shexp] shared expert gate, then activation */
    float *su;       /* [nu][n_ff_shexp] shared expert up */
    float *sgate;    /* [nu] shared expert sigmoid gate logit */
    void *mm_scratch;     /* cpu_matmul / cpu_moe_matmul scratch */
    size_t mm_scratch_size;

    hm_route_hook_fn route_hook;
    void *route_user;
    hm_moe_exec_fn moe_exec;
    void *moe_impl;
    struct moe_tracer *tracer; /* or NULL */
    struct cuda_engine *gpu;   /* the whole model on the GPU (hm_decode runs there), or NULL;
                                  when set, kv and the CPU scratch above are not allocated */
    struct token_job *tok;     /* model_token.c's plan of a one-job decode step, or NULL */
};

/* One ubatch: tokens at pos..pos+n-1 (n <= n_ubatch); logits rows for out_first.. into out. */
hm_status model_forward_ubatch(hm_context *ctx, const int32_t *tokens, int n, int pos,
                               float *logits, hm_logits_mode mode, hm_error *err);

#endif
