/* cuda_rope.cuh - RoPE shared by cuda_ops.cu (cuda_rope_qk) and cuda_fused.cu (the fused q/k
 * norm + RoPE + KV store): the per-launch constants, computed on the host in double exactly as
 * cpu_rope does, and the rotation of one pair on the device. Not a public header. */
#ifndef HM_CUDA_CUDA_ROPE_CUH
#define HM_CUDA_CUDA_ROPE_CUH

#include <math.h>
#include <string.h>

extern "C" {
#include "base/status.h"
#include "cpu/ops.h"
}

#define CR_MAX_PAIRS 512

/* Passed by value: 8 KiB of kernel parameters, allowed on sm_70+ with CUDA >= 12.1. */
typedef struct {
    int n_pairs, neox, yarn;
    double freq_scale, mscale;
    const float *table; /* [n_table][n_pairs][2] (cos, sin from cpu_rope) or NULL */
    int64_t n_table;
    double inv[CR_MAX_PAIRS]; /* freq_base^(-2i/n_dims) */
    double mix[CR_MAX_PAIRS]; /* YaRN ramp * ext_factor */
} cr_consts;

static inline double cr_corr_dim(int n_dims, int n_ctx_orig, double beta, double base) {
    return n_dims * log((double)n_ctx_orig / (beta * 2.0 * M_PI)) / (2.0 * log(base));
}

/* cpu_rope's argument checks and constants; who names the caller in messages. The table is
 * left NULL (callers set it). */
static inline hm_status cr_prepare(const char *who, const cpu_rope_params *p, int head_dim,
                                   cr_consts *rc, hm_error *err) {
    if (!p || (p->mode != CPU_ROPE_NORM && p->mode != CPU_ROPE_NEOX))
        return hm_error_set(err, HM_ERR_ARG, "%s: unknown rope mode", who);
    if (p->n_dims <= 0 || p->n_dims % 2 || p->n_dims > head_dim || p->n_dims > 2 * CR_MAX_PAIRS)
        return hm_error_set(err, HM_ERR_ARG, "%s: n_dims %d must be even and in [2, %d]", who,
                            p->n_dims, head_dim < 2 * CR_MAX_PAIRS ? head_dim : 2 * CR_MAX_PAIRS);
    if (!(p->freq_base > 0.0f) || !(p->freq_scale > 0.0f))
        return hm_error_set(err, HM_ERR_ARG, "%s: freq_base %g and freq_scale %g must be > 0",
                            who, (double)p->freq_base, (double)p->freq_scale);
    memset(rc, 0, sizeof(*rc));
    rc->n_pairs = p->n_dims / 2;
    rc->neox = p->mode == CPU_ROPE_NEOX;
    rc->yarn = p->ext_factor != 0.0f;
    rc->freq_scale = (double)p->freq_scale;
    rc->mscale = p->attn_factor;
    double lo = 0.0, hi = 0.0;
    if (rc->yarn) {
        if (p->n_ctx_orig <= 0 || !(p->beta_fast > 0.0f) || !(p->beta_slow > 0.0f))
            return hm_error_set(err, HM_ERR_ARG, "%s: YaRN needs n_ctx_orig > 0 and positive betas",
                                who);
        lo = cr_corr_dim(p->n_dims, p->n_ctx_orig, p->beta_fast, p->freq_base);
        hi = cr_corr_dim(p->n_dims, p->n_ctx_orig, p->beta_slow, p->freq_base);
        if (p->yarn_truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        lo = fmax(0.0, lo);
        hi = fmin((double)(p->n_dims - 1), hi);
        rc->mscale = (double)p->attn_factor * (1.0 + 0.1 * log(1.0 / (double)p->freq_scale));
    }
    for (int i = 0; i < rc->n_pairs; i++) {
        rc->inv[i] = pow((double)p->freq_base, -2.0 * i / p->n_dims);
        double y = ((double)i - lo) / fmax(0.001, hi - lo);
        rc->mix[i] = (1.0 - fmin(1.0, fmax(0.0, y))) * p->ext_factor;
    }
    return HM_OK;
}

/* cos and sin of pair i at position p: from the table when it covers p, else computed in
 * double with the CPU's operations. */
static __device__ __forceinline__ void cr_cos_sin(const cr_consts &rc, int32_t p, int i, float &c,
                                                  float &s) {
    if (rc.table && p >= 0 && p < rc.n_table) {
        const float *cs = rc.table + ((int64_t)p * rc.n_pairs + i) * 2;
        c = cs[0];
        s = cs[1];
    } else {
        const double theta_extrap = __dmul_rn((double)p, rc.inv[i]);
        double theta = __dmul_rn(rc.freq_scale, theta_extrap);
        if (rc.yarn)
            theta = __dadd_rn(__dmul_rn(theta, __dsub_rn(1.0, rc.mix[i])),
                              __dmul_rn(theta_extrap, rc.mix[i]));
        c = __double2float_rn(__dmul_rn(cos(theta), rc.mscale));
        s = __double2float_rn(__dmul_rn(sin(theta), rc.mscale));
    }
}

/* Rotates pair i of one head x by (c, s) = cr_cos_sin(rc, p, i) */
static __device__ __forceinline__ void cr_apply(const cr_consts &rc, int i, float c, float s,
                                                float *x) {
    const int i0 = rc.neox ? i : 2 * i, i1 = rc.neox ? i + rc.n_pairs : 2 * i + 1;
    const float x0 = x[i0], x1 = x[i1];
    x[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    x[i1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

/* Rotates pair i of one head x at position p */
static __device__ __forceinline__ void cr_rotate(const cr_consts &rc, int32_t p, int i, float *x) {
    float c, s;
    cr_cos_sin(rc, p, i, c, s);
    cr_apply(rc, i, c, s, x);
}

#endif
