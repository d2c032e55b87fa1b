/* cpu_engine_internal.h - the CPU engine's struct, shared by the cpu_engine/ sources only. */
#ifndef HM_CPU_ENGINE_INTERNAL_H
#define HM_CPU_ENGINE_INTERNAL_H

#include "base/threadpool.h"
#include "cpu/ops.h"
#include "cpu_engine/cpu_engine.h"
#include "quant/quant.h"

struct cpu_engine {
    const hm_model *m;
    const hm_hparams *hp;     /* the model's */
    const hm_arch_desc *desc; /* the model's */
    cpu_engine_params p;
    tp_pool *pool;
    const quant_kernels *kern;
    cpu_kv_layer *kv_all;  /* [n_seq][n_layer]: each sequence's cache; sliding-window layers
                              hold a ring */
    cpu_kv_layer *kv;      /* [n_layer] the caches single-sequence steps use: sequence 0's
                              (kv_all), or for a batch of one sequence that sequence's */
    int n_seq;
    const int32_t *tok_seq; /* [n] each token's sequence in a cpu_engine_forward_seqs call, else
                               NULL (every token in sequence 0) */

    /* scratch, sized for n_ubatch tokens (nu) */
    float *x;        /* [nu][n_embd] residual stream */
    float *xn;       /* [nu][n_embd] normed input of a sub-block */
    float *q;        /* [nu][n_head * hd_k] (gemma4: the layer kind's head size; sized for
                        the widest kind, as k, v and attn) */
    float *k;        /* [nu][n_head_kv * hd_k] */
    float *v;        /* [nu][n_head_kv * hd_v] */
    float *attn;     /* [nu][n_head * hd_v] attention output (before wo) */
    float *proj;     /* [nu][n_embd] output of wo / of the MoE block */
    int32_t *pos;    /* [nu] positions of the ubatch's tokens */
    float *rope_cs;  /* [nu][n_rot / 2][2] cos, sin of each token's angles (every layer's rope;
                        gemma4: the full layers', then the sliding ones' [nu][n_rot_swa / 2][2]) */
    void *attn_scratch;   /* cpu_attention scratch */
    size_t attn_scratch_size;
    float *router;   /* [nu][n_expert] router logits */
    int32_t *ids;    /* [nu][n_used] selected experts */
    float *gw;       /* [nu][n_used] gating weights */
    float *ey;       /* [nu][n_used][n_embd] per-slot expert outputs */
    float *sg;       /* [nu][n_ff_shexp] shared expert gate, then activation (gemma4: the
                        dense MLP's, [nu][n_ff]) */
    float *su;       /* [nu][n_ff_shexp] shared expert up (gemma4: [nu][n_ff]) */
    float *sgate;    /* [nu] shared expert sigmoid gate logit */
    void *mm_scratch;     /* cpu_matmul / cpu_moe_ffn job scratch */
    size_t mm_scratch_size;

    /* hybrid architectures (hm_arch_desc.hybrid; all NULL otherwise): every sequence's
     * recurrent state beside its KV cache, and the delta net's scratch (cpu_engine_hybrid.c).
     * cd = conv_dim = 2 kd + vd, kd = k heads x head_k, vd = v heads x head_v. */
    float *rs;          /* [n_seq][rs_floats]: for each recurrent layer of the range, its
                           convolution state [K-1][cd] then its delta state [v heads][head_k]
                           [head_v] */
    size_t rs_floats;   /* floats of one sequence's state */
    size_t *rs_off;     /* [n_layer] offset of layer il's state in a sequence's (recurrent
                           layers; 0 for the others) */
    int64_t *rs_pos;    /* [n_seq] tokens each sequence's state has absorbed */
    float *ck;          /* [n_seq][rs_floats]: each sequence's state after its last call of
                           several tokens (a prompt), the point a rewind returns to */
    int64_t *ck_pos;    /* [n_seq] the tokens that checkpoint had absorbed; -1: none */
    int64_t *rs_next;   /* [n_seq] ce_hybrid_positions' count for a call of several sequences */
    int cur_seq;        /* the sequence of a single-sequence call (cpu_engine_forward) */
    float *hy_in;       /* [nu][max(cd + vd, 2 n_head hd)]: the q/k/v (or fused ssm_in) product,
                           then the convolution's output [nu][cd]; a full-attention layer's
                           query-and-gate product */
    float *hy_z;        /* [nu][vd] the output gate z */
    float *hy_ba;       /* [nu][2 v heads] b and a per k head; or (ssm_beta, ssm_alpha) b
                           [n][v heads] then a [n][v heads] */
    float *hy_o;        /* [nu][max(vd, n_head hd)] the delta rule's normed and gated output; a
                           full-attention layer's gate */
    float *hy_tmp;      /* [cd + vd + threads * 2 head_v]: one row, then per-thread scratch */

    moe_exec *exec;       /* the expert FFN (its own scratch: gate/up activations) */
    moe_observer obs;     /* routing observer (obs.route NULL: none) */
    struct token_job *tok; /* cpu_engine_token.c's plan of a one-job decode step, or NULL */
};

#endif
