/* cuda_fused.h - fused decode kernels: each one launch does the work of a fixed sequence of the
 * cuda_ops.h / cuda_quant.h / cuda_attn.h launchers, with the SAME output bytes.
 *
 * DESIGN: the decode step (n_tok <= 8) is one CUDA graph replay of ~25 small kernels per
 * layer, so the per-node cost dominates; these launchers merge neighbours of that sequence.
 * Each function states the unfused sequence it replaces; every float operation is the same
 * _rn intrinsic in the same order as there (reductions keep their chains and trees), so the
 * outputs are byte-identical (tests/cuda/test_cuda_fused.c compares each against the unfused
 * sequence on random inputs). Launchers only enqueue on `stream` (no sync, no allocation, no
 * copy to the host: graph-capturable); positions and expert ids are read from device memory.
 * Returns HM_ERR_ARG / HM_ERR_UNSUPPORTED for host-side argument problems, HM_ERR_CUDA naming
 * the kernel when a launch fails. Device pointers are plain pointers; stream is a
 * cudaStream_t. Called from .cu files and CUDA-build tests only (no stubs in cuda_none.c).
 */
#ifndef HM_CUDA_CUDA_FUSED_H
#define HM_CUDA_CUDA_FUSED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/status.h"
#include "cuda/cuda_ops.h"

/* Rows up to this length fit cuda_fused_norm_quant's shared-memory row (44 KiB). */
#define CUDA_FUSED_NORM_MAX 11264

/* ------------------------------------------------------------ residual + rmsnorm + quantise */

typedef struct {
    float *x;           /* [n_tok][n] residual stream (written only when add or ey is set) */
    const float *add;   /* [n_tok][n] or NULL: first x = x + add (cuda_add(x, add, x)) */
    const float *ey;    /* [n_tok][n_used][n] or NULL: first x = x + combine, where combine =
                         * cuda_moe_combine(ey, gw, ids) (add must be NULL then) */
    const float *gw;    /* [n_tok][n_used] gating weights (with ey) */
    const int32_t *ids; /* [n_tok][n_used] or NULL (with ey; slots with id < 0 skipped) */
    int n_used;
    const float *ey_bias; /* [n_expert][n] or NULL (with ey and ids): each slot's row is first
                           * ey + ey_bias[b] with b = bias_ids[t][s], or ids[t][s] when bias_ids
                           * is NULL (cuda_moe_add_bias(ey, ey_bias, bias_ids or ids, ...), which
                           * leaves slots with b outside [0, n_expert) as they are); ey itself
                           * is not written */
    const int32_t *bias_ids; /* [n_tok][n_used] or NULL: the row of each slot's bias (the engine:
                              * the device slots, its biases are stored by slot) */
    int n_expert;       /* rows of ey_bias */
    const float *sh;    /* [n_tok][n] or NULL (with ey): a shared expert's output, added to the
                         * combine as cuda_shexp_combine(combine, sh, sgate) does before x + it */
    const float *sgate; /* [n_tok] its gate logits (with sh) */
    const float *norm_w; /* [n] or NULL (cuda_rmsnorm's w) */
    float eps;
    float *xn;     /* [n_tok][n] = cuda_rmsnorm(x, norm_w), or NULL: no norm, no quantisation */
    uint32_t wtype; /* the weight type the activation rows are for */
    void *act;     /* [n_tok] rows of cuda_act_row_bytes(wtype, n) = cuda_quantize_act(wtype, xn),
                    * or NULL; nothing is written for float types (use xn itself) */
    int64_t n_tok, n; /* 1 <= n <= CUDA_FUSED_NORM_MAX */
    int *d_sync;   /* 2 * n_tok ints of device memory zeroed once before the first call (left
                    * consistent by every call): the row barrier of the blocks of one row */
} cuda_fused_norm_args;

/* = [(ey_bias) cuda_moe_add_bias(ey, ey_bias, bias_ids or ids, n_tok, n_used, n, n_expert);
 *    cuda_moe_combine(ey, gw, ids) -> tmp; cuda_add(x, tmp, x)] or [cuda_add(x, add, x)];
 *   cuda_rmsnorm(x, norm_w, xn, n_tok, n, eps); cuda_quantize_act(wtype, xn, n, n_tok, act)
 * in one launch (one block per 256 elements of a row; several launches past 264 blocks). Bytes
 * of x, xn and act equal the sequence's. */
hm_status cuda_fused_norm_quant(const cuda_fused_norm_args *a, void *stream, hm_error *err);

/* ------------------------------------------------------------ several products, one launch */

#define CUDA_MULTI_MAX 4

typedef struct {
    const void *w;     /* [n_rows] rows of k elements of the shared wtype */
    int64_t n_rows;
    const float *bias; /* [n_rows] or NULL */
    float *y;          /* [n_tok][n_rows] */
    int accumulate;    /* 1: y = y + the product (cuda_add(y, product, y) after the bias) */
} cuda_multi_mat;

/* For each i < n_mat: cuda_matvec(wtype, m[i].w, m[i].n_rows, k, act, n_tok, m[i].y), then
 * (bias) cuda_add_bias(m[i].y, m[i].bias, n_tok, m[i].n_rows), all in one launch; every matrix
 * has the same type and k and reads the same activation rows (cuda_quantize_act of wtype). */
hm_status cuda_matvec_multi(uint32_t wtype, int64_t k, const void *act, int64_t n_tok,
                            const cuda_multi_mat *m, int n_mat, void *stream, hm_error *err);

/* ------------------------------------------------------------ q/k norm + RoPE + KV store */

typedef struct {
    float *q;          /* [n_tok][n_head][head_dim] (normed and roped in place) */
    float *k;          /* [n_tok][n_head_kv][head_dim] (normed and roped in place) */
    const float *v;    /* [n_tok][n_head_kv][head_dim] */
    int n_head, n_head_kv, head_dim; /* head_dim <= 256 */
    int64_t n_tok;
    int qk_norm;       /* 1: per-head rmsnorm of q and k first (HM_QKNORM_HEAD) */
    const float *q_norm, *k_norm; /* [head_dim] or NULL (the rmsnorm weights) */
    float eps;
    const int32_t *d_pos; /* [n_tok] device positions */
    cuda_rope_args rope;
    uint16_t *k_cache, *v_cache; /* f16 bits [n_ctx][n_head_kv][head_dim] */
    int64_t n_ctx;
} cuda_fused_qk_args;

/* = (qk_norm) cuda_rmsnorm(q, q_norm, q, n_tok * n_head, head_dim, eps) and the same for k;
 *   cuda_rope_qk(q, n_head, k, n_head_kv, n_tok, head_dim, d_pos, &rope);
 *   cuda_kv_store(HM_TYPE_F16, k_cache, v_cache, n_ctx, n_head_kv, head_dim, k, v, n_tok, d_pos)
 * in one launch (one block per token and head). Same bytes in q, k and the caches. f16 caches
 * only (an f32 cache takes the separate kernels). */
hm_status cuda_fused_qk_rope_store(const cuda_fused_qk_args *a, void *stream, hm_error *err);

/* ------------------------------------------------------------ router logits + top-k */

#define CUDA_FUSED_ROUTER_MAX 4096

typedef struct {
    const float *w;      /* [n_expert][k] f32 router rows */
    int64_t n_expert, k;
    const float *x;      /* [n_tok][k]: the router's input, or (norm_w) the residual stream */
    int64_t n_tok;
    const float *bias;   /* [n_expert] or NULL */
    int n_used;
    cpu_gate_mode mode;
    int renorm;
    float *logits;       /* [n_tok][n_expert] (written, scratch) */
    int32_t *d_ids;      /* [n_tok][n_used] */
    float *d_weights;    /* [n_tok][n_used] */
    int *d_sync;         /* [(n_tok + 7) / 8] counters, zero before the call and after it */
    cuda_route_out out;  /* optional extra outputs of the selection (cuda_ops.h) */
    /* The norm in front (norm_w != NULL): the router reads xn = cuda_rmsnorm(x, norm_w, eps),
     * which is also written to xn, and act = cuda_quantize_act(wtype, xn) (NULL, or a float
     * wtype: not written). Needs k * (4 + n_tok + 1) floats to fit the kernel's shared memory
     * (cuda_fused_router_norm_ok). */
    const float *norm_w;
    float eps;
    float *xn;           /* [n_tok][k] */
    uint32_t wtype;
    void *act;           /* [n_tok] rows of cuda_act_row_bytes(wtype, k) */
} cuda_fused_router_args;

/* = (norm_w) cuda_rmsnorm(x, norm_w, xn, n_tok, k, eps); cuda_quantize_act(wtype, xn, k, n_tok,
 *   act);
 *   cuda_matvec(HM_TYPE_F32, w, n_expert, k, x or xn, n_tok, logits);
 *   cuda_router(logits, bias, n_tok, n_expert, n_used, mode, renorm, d_ids, d_weights, &out)
 * in one launch: blocks of 4 warps per tile of <= 8 tokens compute the logits (a warp per
 * expert row, as cuda_matvec); the tile's last block to finish selects for its tokens.
 * 1 <= n_used <= n_expert <= CUDA_FUSED_ROUTER_MAX. Same bytes as the launches it replaces. */
hm_status cuda_fused_router(const cuda_fused_router_args *a, void *stream, hm_error *err);

/* Whether cuda_fused_router can take the norm in front for rows of k and n_tok tokens. */
bool cuda_fused_router_norm_ok(int64_t k, int64_t n_tok, uint32_t wtype);

#ifdef __cplusplus
}
#endif

#endif
