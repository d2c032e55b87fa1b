/* ops_rope.c - rotary position embedding: llama.cpp's "norm" and "neox" orderings, linear
 * scaling and YaRN.
 *
 * DESIGN: for each token the cos/sin of its n_dims/2 angles are computed once (in double, see
 * ops.h for the formulas; rounded to float at the end) into a small stack table and applied to
 * every head of the token (or taken from a table cpu_rope_table filled once per batch, which a
 * forward pass reuses for q and k of every layer; the neox rotation then goes 8 pairs at a time
 * in ops_elem_avx2.c on AVX2 CPUs, same operations). Tokens are split across the pool; a token's rows depend only on its
 * position, so any split gives the same bits. YaRN follows llama.cpp's rope_yarn (ramp on the
 * pair index between the correction dims, mix of interpolated and extrapolated angles, mscale
 * 1 + 0.1 ln(factor)) which equals transformers' _compute_yarn_parameters when the correction
 * dims are floored/ceiled (rope_scaling.truncate, default true); gpt-oss sets truncate = false
 * and transformers then uses the unrounded dims: yarn_truncate selects that.
 */
#include "cpu/ops.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "base/cpu.h"
#include "cpu/ops_internal.h"

#define ROPE_MAX_PAIRS 512

cpu_rope_params cpu_rope_default(cpu_rope_mode mode, int n_dims, float freq_base) {
    cpu_rope_params p = {0};
    p.mode = mode;
    p.n_dims = n_dims;
    p.freq_base = freq_base;
    p.freq_scale = 1.0f;
    p.ext_factor = 0.0f;
    p.attn_factor = 1.0f;
    p.n_ctx_orig = 0;
    p.beta_fast = 32.0f;
    p.beta_slow = 1.0f;
    p.yarn_truncate = 1;
    return p;
}

static double yarn_corr_dim(int n_dims, int n_ctx_orig, double beta, double base) {
    return n_dims * log((double)n_ctx_orig / (beta * 2.0 * M_PI)) / (2.0 * log(base));
}

typedef struct {
    float *x;
    int64_t n_tok;
    int n_head, head_dim;
    const int32_t *pos;
    cpu_rope_params p;
    double mscale;
    const double *inv;   /* [n_pairs] freq_base^(-2i/n_dims) */
    const double *mix;   /* [n_pairs] YaRN ramp * ext_factor (0 without YaRN) */
    const float *table;  /* [n_tok][n_pairs][2] precomputed cos/sin, or NULL */
    float *table_out;    /* [n_tok][n_pairs][2] where to write each token's cos/sin, or NULL */
} rope_job;

/* theta = freq_scale * theta_extrap * (1 - mix) + theta_extrap * mix (mix = 0: plain). */
static void rope_angles(const rope_job *j, int32_t pos, float *cs /* [n_pairs][2] */) {
    const cpu_rope_params *p = &j->p;
    const int n_pairs = p->n_dims / 2;
    for (int i = 0; i < n_pairs; i++) {
        double theta_extrap = (double)pos * j->inv[i];
        double theta = (double)p->freq_scale * theta_extrap;
        if (p->ext_factor != 0.0f) theta = theta * (1.0 - j->mix[i]) + theta_extrap * j->mix[i];
        cs[2 * i] = (float)(cos(theta) * j->mscale);
        cs[2 * i + 1] = (float)(sin(theta) * j->mscale);
    }
}

/* Rotates the n_head heads of one token with its cos/sin table cs [n_pairs][2]. */
static void rope_rotate(float *xt, int n_head, int head_dim, int n_pairs, int neox,
                        const float *cs) {
    if (neox && hm_cpu_has_avx2()) { /* the same operations, 8 pairs at a time */
        ops_rope_neox_avx2(xt, n_head, head_dim, n_pairs, cs);
        return;
    }
    for (int h = 0; h < n_head; h++) {
        float *x = xt + (int64_t)h * head_dim;
        if (neox) {
            float *xa = x, *xb = x + n_pairs;
            for (int i = 0; i < n_pairs; i++) {
                const float c = cs[2 * i], s = cs[2 * i + 1], x0 = xa[i], x1 = xb[i];
                xa[i] = x0 * c - x1 * s;
                xb[i] = x0 * s + x1 * c;
            }
        } else {
            for (int i = 0; i < n_pairs; i++) {
                const float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[2 * i], x1 = x[2 * i + 1];
                x[2 * i] = x0 * c - x1 * s;
                x[2 * i + 1] = x0 * s + x1 * c;
            }
        }
    }
}

/* table == NULL: each token's angles computed here; else table [n_tok][n_pairs][2]. */
static void rope_worker(void *ctx, int ith, int nth) {
    const rope_job *j = ctx;
    float cs[2 * ROPE_MAX_PAIRS];
    const int n_pairs = j->p.n_dims / 2;
    int64_t t0, t1;
    ops_split(j->n_tok, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const float *ct = cs;
        if (j->table) ct = j->table + t * 2 * n_pairs;
        else rope_angles(j, j->pos[t], cs);
        if (j->x)
            rope_rotate(j->x + t * j->n_head * j->head_dim, j->n_head, j->head_dim, n_pairs,
                        j->p.mode == CPU_ROPE_NEOX, ct);
        if (j->table_out) memcpy(j->table_out + t * 2 * n_pairs, ct, sizeof(float) * 2 * n_pairs);
    }
}

/* Checks p and, when angles, fills j's constants (inv, mix, mscale); j->x, table, table_out
 * are left to the caller. */
static hm_status rope_prepare(rope_job *j, double *inv, double *mix, int64_t n_tok, int n_head,
                              int head_dim, const int32_t *pos, const cpu_rope_params *p,
                              bool angles, hm_error *err) {
    if (!p || (p->mode != CPU_ROPE_NORM && p->mode != CPU_ROPE_NEOX))
        return hm_error_set(err, HM_ERR_ARG, "rope: unknown mode");
    if (p->n_dims <= 0 || p->n_dims % 2 || p->n_dims > head_dim || p->n_dims > 2 * ROPE_MAX_PAIRS)
        return hm_error_set(err, HM_ERR_ARG, "rope: n_dims %d must be even and in [2, %d]",
                            p->n_dims, head_dim < 2 * ROPE_MAX_PAIRS ? head_dim : 2 * ROPE_MAX_PAIRS);
    if (!(p->freq_base > 0.0f) || !(p->freq_scale > 0.0f))
        return hm_error_set(err, HM_ERR_ARG, "rope: freq_base %g and freq_scale %g must be > 0",
                            (double)p->freq_base, (double)p->freq_scale);
    if (n_tok < 0 || n_head < 0) return hm_error_set(err, HM_ERR_ARG, "rope: negative shape");
    *j = (rope_job){NULL, n_tok, n_head, head_dim, pos, *p, p->attn_factor, inv, mix, NULL, NULL};
    if (!angles) return HM_OK;
    double lo = 0.0, hi = 0.0;
    if (p->ext_factor != 0.0f) {
        if (p->n_ctx_orig <= 0 || !(p->beta_fast > 0.0f) || !(p->beta_slow > 0.0f))
            return hm_error_set(err, HM_ERR_ARG,
                                "rope: YaRN needs n_ctx_orig > 0 and positive betas");
        lo = yarn_corr_dim(p->n_dims, p->n_ctx_orig, p->beta_fast, p->freq_base);
        hi = yarn_corr_dim(p->n_dims, p->n_ctx_orig, p->beta_slow, p->freq_base);
        if (p->yarn_truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        lo = fmax(0.0, lo);
        hi = fmin((double)(p->n_dims - 1), hi);
        j->mscale = (double)p->attn_factor * (1.0 + 0.1 * log(1.0 / (double)p->freq_scale));
    }
    for (int i = 0; i < p->n_dims / 2; i++) {
        inv[i] = pow((double)p->freq_base, -2.0 * i / p->n_dims);
        if (p->freq_factors) inv[i] /= (double)p->freq_factors[i];
        double y = ((double)i - lo) / fmax(0.001, hi - lo);
        mix[i] = (1.0 - fmin(1.0, fmax(0.0, y))) * p->ext_factor;
    }
    return HM_OK;
}

/* One rope job: rotate x (if given) with the angles of pos, or with table (then no angle is
 * computed and only p's checks run), and/or write each token's cos/sin to table_out. */
static hm_status rope_run(tp_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim,
                          const int32_t *pos, const float *table, float *table_out,
                          const cpu_rope_params *p, hm_error *err) {
    double inv[ROPE_MAX_PAIRS], mix[ROPE_MAX_PAIRS];
    rope_job j;
    hm_status st = rope_prepare(&j, inv, mix, n_tok, n_head, head_dim, pos, p, !table, err);
    if (st != HM_OK || n_tok == 0 || n_head == 0) return st;
    j.x = x;
    j.table = table;
    j.table_out = table_out;
    ops_run(x ? pool : NULL, rope_worker, &j, n_tok * n_head * p->n_dims, 16384);
    return HM_OK;
}

hm_status cpu_rope(tp_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim,
                   const int32_t *pos, const cpu_rope_params *p, hm_error *err) {
    return rope_run(pool, x, n_tok, n_head, head_dim, pos, NULL, NULL, p, err);
}

hm_status cpu_rope_table(const cpu_rope_params *p, int head_dim, const int32_t *pos,
                         int64_t n_tok, float *cs, hm_error *err) {
    return rope_run(NULL, NULL, n_tok, 1, head_dim, pos, NULL, cs, p, err);
}

hm_status cpu_rope_with_table(tp_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim,
                              const float *cs, const cpu_rope_params *p, hm_error *err) {
    return rope_run(pool, x, n_tok, n_head, head_dim, NULL, cs, NULL, p, err);
}
