/* ops_internal.h - helpers shared by the ops_*.c files (not part of the public API). */
#ifndef HM_CPU_OPS_INTERNAL_H
#define HM_CPU_OPS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"

/* Thread ith's share [*i0, *i1) of n items split into nth near-equal contiguous ranges. */
static inline void ops_split(int64_t n, int ith, int nth, int64_t *i0, int64_t *i1) {
    *i0 = n * ith / nth;
    *i1 = n * (ith + 1) / nth;
}

/* Runs fn on the pool when the work is worth waking it (work >= min_work), else on the
 * caller alone (ith 0 of 1). Which threads run an item never changes its result. */
static inline void ops_run(tp_pool *pool, tp_fn fn, void *ctx, int64_t work, int64_t min_work) {
    if (!pool || tp_size(pool) == 1 || work < min_work) fn(ctx, 0, 1);
    else tp_run(pool, fn, ctx);
}

/* cpu_delta_rule after its decay (ops_delta_avx2.c; call only when the CPU has AVX2, dv % 8 ==
 * 0): the same state and output bytes; kv [dv] scratch. */
void ops_delta_rule_avx2(float *S, const float *q, const float *k, const float *v, float decay,
                         float beta, int64_t dk, int64_t dv, float *o, float *kv);

/* Attention P.V (ops_attn_avx2.c; call only when the CPU has AVX2+F16C, hd % 16 == 0):
 * for r in [0, nr) in order, for i < nh, d < hd: acc[i*hd + d] = acc[i*hd + d] +
 * p[i*p_stride + r] * V_r[d], V_r = row r of v (vtype f32/f16/q8_0, rows v_stride bytes apart). */
/* Attention scores (ops_attn_avx2.c; AVX2+FMA+F16C, hd % 8 == 0): out[i*out_stride + r] =
 * dot8(K_r, q_i) for r < nr, i < nh; q: [nh][hd] f32; dot8 as cpu/ops.h defines it. */
void ops_attn_qk_avx2(uint32_t ktype, const uint8_t *k, size_t k_stride, int nr, const float *q,
                      int nh, float *out, size_t out_stride, int hd);
void ops_attn_pv_avx2(uint32_t vtype, const uint8_t *v, size_t v_stride, int nr, const float *p,
                      size_t p_stride, int nh, float *acc, int hd);

/* x[i] = hm_expf(x[i] - m) for i < n, bit-identical to the scalar (ops_attn_avx2.c; AVX2). */
void ops_exp_sub_avx2(float *x, int64_t n, float m);

/* Activations on [0, n) with ops_elem.c's exact operations (ops_elem_avx2.c; AVX2 only):
 * op OPS_ACT_SILU / SIGMOID (a), SWIGLU (gate a, up b), SWIGLU_OAI (a, b, alpha, limit),
 * GEGLU (gate a, up b). */
enum { OPS_ACT_SILU, OPS_ACT_SIGMOID, OPS_ACT_SWIGLU, OPS_ACT_SWIGLU_OAI, OPS_ACT_GEGLU };
void ops_act_avx2(int op, const float *a, const float *b, float *y, int64_t n, float alpha,
                  float limit);

/* ops_elem.c's rmsnorm of one row (32 double chains, the tree, then (x * s) * w) and slot
 * combine of one token (out[i] = ((0 + w[0]*ys[0][i]) + w[1]*ys[1][i]) + ..., i < n, slots with
 * ids[s] < 0 skipped, ids NULL = none; slot s's row at ys + s * stride), with the same
 * operations vectorised across elements: bit-identical (ops_elem_avx2.c; AVX2 only). */
void ops_rmsnorm_row_avx2(const float *x, const float *w, float *y, int64_t n, float eps);
void ops_combine_row_avx2(const float *ys, size_t stride, const float *w, const int32_t *ids,
                          int n_used, int64_t n, float *out);

/* ops_rope.c's neox rotation of n_head heads of one token with cs [n_pairs][2] (c, s), n_pairs
 * <= 512: xa[i] = x0 * c - x1 * s, xb[i] = x0 * s + x1 * c, vectorised over i (bit-identical;
 * ops_elem_avx2.c; AVX2 only). */
void ops_rope_neox_avx2(float *xt, int n_head, int head_dim, int n_pairs, const float *cs);

/* y[i] = a[i] + b[i], a[i] * b[i] or a[i] * s for i < n, one float operation each, 8 at a time
 * (ops_elem_avx2.c; AVX2 only). y may be a (in place), not otherwise overlap a or b. */
enum { OPS_ARITH_ADD, OPS_ARITH_MUL, OPS_ARITH_SCALE };
void ops_arith_avx2(int op, const float *a, const float *b, float s, float *y, int64_t n);

#endif
