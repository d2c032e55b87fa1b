/* ops_elem.c - RMS norm, elementwise arithmetic, activations, expert bias and slot combine.
 *
 * DESIGN: every op is a loop over independent elements (or rows, for the norm) split into
 * contiguous ranges across the pool; no element depends on how the range was split, so the
 * result is the same for any thread count. Elementwise ops share one job type (an op code and
 * up to two inputs) so the threading code exists once; the switch sits outside the loops so
 * each loop is a plain vectorisable body; the activations (which need exp), the RMS norm's
 * rows and the slot combine go through the AVX2 kernels of ops_elem_avx2.c where the CPU has
 * AVX2 (bit-identical to the scalar loops; a decode step runs them on the calling thread while
 * the pool waits, so their speed counts at every thread count). Small inputs run on the
 * calling thread.
 */
#include "cpu/ops.h"

#include <math.h>

#include "base/cpu.h"
#include "cpu/ops_internal.h"
#include "cpu/ops_math.h"

/* Below this many elements an elementwise op runs on the caller alone. */
#define EW_MIN_PARALLEL 32768
#define EW_MIN_PARALLEL_EXP 4096

typedef enum {
    EW_ADD, EW_MUL, EW_SCALE, EW_SILU, EW_SIGMOID, EW_SWIGLU, EW_SWIGLU_OAI, EW_GEGLU
} ew_op;

typedef struct {
    ew_op op;
    const float *a, *b; /* [n] inputs (b unused by unary ops) */
    float *y;           /* [n] output */
    int64_t n;
    float s, t;         /* scale; or alpha, limit */
    int simd;           /* activations through ops_act_avx2 (bit-identical) */
} ew_job;

static void ew_range(const ew_job *j, int64_t i0, int64_t i1) {
    const float *a = j->a, *b = j->b;
    float *y = j->y;
    if (j->simd && j->op <= EW_SCALE) { /* a plain loop does not vectorise at -O2 (aliasing) */
        ops_arith_avx2(j->op == EW_ADD ? OPS_ARITH_ADD : j->op == EW_MUL ? OPS_ARITH_MUL : OPS_ARITH_SCALE,
                       a + i0, b ? b + i0 : NULL, j->s, y + i0, i1 - i0);
        return;
    }
    if (j->simd && j->op >= EW_SILU) {
        static const int act[] = {[EW_SILU] = OPS_ACT_SILU, [EW_SIGMOID] = OPS_ACT_SIGMOID,
                                  [EW_SWIGLU] = OPS_ACT_SWIGLU, [EW_SWIGLU_OAI] = OPS_ACT_SWIGLU_OAI,
                                  [EW_GEGLU] = OPS_ACT_GEGLU};
        ops_act_avx2(act[j->op], a + i0, b ? b + i0 : NULL, y + i0, i1 - i0, j->s, j->t);
        return;
    }
    switch (j->op) {
    case EW_ADD:
        for (int64_t i = i0; i < i1; i++) y[i] = a[i] + b[i];
        break;
    case EW_MUL:
        for (int64_t i = i0; i < i1; i++) y[i] = a[i] * b[i];
        break;
    case EW_SCALE:
        for (int64_t i = i0; i < i1; i++) y[i] = a[i] * j->s;
        break;
    case EW_SILU:
        for (int64_t i = i0; i < i1; i++) y[i] = hm_siluf(a[i]);
        break;
    case EW_SIGMOID:
        for (int64_t i = i0; i < i1; i++) y[i] = hm_sigmoidf(a[i]);
        break;
    case EW_SWIGLU:
        for (int64_t i = i0; i < i1; i++) y[i] = hm_siluf(a[i]) * b[i];
        break;
    case EW_SWIGLU_OAI: {
        const float alpha = j->s, limit = j->t;
        for (int64_t i = i0; i < i1; i++) {
            float g = a[i] > limit ? limit : a[i];           /* clamp(max=limit); NaN stays */
            float u = b[i] > limit ? limit : (b[i] < -limit ? -limit : b[i]);
            y[i] = (g * hm_sigmoidf(g * alpha)) * (u + 1.0f);
        }
        break;
    }
    case EW_GEGLU:
        for (int64_t i = i0; i < i1; i++) {
            const float g = a[i];
            y[i] = hm_geluf(g) * b[i];
        }
        break;
    }
}

static void ew_worker(void *ctx, int ith, int nth) {
    const ew_job *j = ctx;
    int64_t i0, i1;
    ops_split(j->n, ith, nth, &i0, &i1);
    ew_range(j, i0, i1);
}

static void ew_run(tp_pool *pool, ew_job *j) {
    if (j->n <= 0) return;
    j->simd = hm_cpu_has_avx2();
    int64_t min = j->op >= EW_SILU ? EW_MIN_PARALLEL_EXP : EW_MIN_PARALLEL;
    ops_run(pool, ew_worker, j, j->n, min);
}

int cpu_act_simd(void) { return hm_cpu_has_avx2(); }

void cpu_swiglu_slice(const float *gate, const float *up, float *out, int64_t n, int kind,
                      float alpha, float limit, int simd) {
    const int oai = kind == CPU_GLU_OAI;
    ew_job j = {kind == CPU_GLU_GELU ? EW_GEGLU : oai ? EW_SWIGLU_OAI : EW_SWIGLU, gate, up, out,
                n, oai ? alpha : 0, oai ? limit : 0, simd != 0};
    if (n > 0) ew_range(&j, 0, n);
}

void cpu_add(tp_pool *pool, const float *a, const float *b, float *y, int64_t n) {
    ew_job j = {EW_ADD, a, b, y, n, 0, 0, 0};
    ew_run(pool, &j);
}

void cpu_mul(tp_pool *pool, const float *a, const float *b, float *y, int64_t n) {
    ew_job j = {EW_MUL, a, b, y, n, 0, 0, 0};
    ew_run(pool, &j);
}

void cpu_scale(tp_pool *pool, const float *a, float s, float *y, int64_t n) {
    ew_job j = {EW_SCALE, a, NULL, y, n, s, 0, 0};
    ew_run(pool, &j);
}

void cpu_silu(tp_pool *pool, const float *x, float *y, int64_t n) {
    ew_job j = {EW_SILU, x, NULL, y, n, 0, 0, 0};
    ew_run(pool, &j);
}

void cpu_sigmoid(tp_pool *pool, const float *x, float *y, int64_t n) {
    ew_job j = {EW_SIGMOID, x, NULL, y, n, 0, 0, 0};
    ew_run(pool, &j);
}

void cpu_swiglu(tp_pool *pool, const float *gate, const float *up, float *out, int64_t n) {
    ew_job j = {EW_SWIGLU, gate, up, out, n, 0, 0, 0};
    ew_run(pool, &j);
}

void cpu_geglu(tp_pool *pool, const float *gate, const float *up, float *out, int64_t n) {
    ew_job j = {EW_GEGLU, gate, up, out, n, 0, 0, 0};
    ew_run(pool, &j);
}

void cpu_swiglu_oai(tp_pool *pool, const float *gate, const float *up, float *out, int64_t n,
                    float alpha, float limit) {
    ew_job j = {EW_SWIGLU_OAI, gate, up, out, n, alpha, limit, 0};
    ew_run(pool, &j);
}

/* ---------------------------------------------------------------- row ops */

typedef enum { ROW_RMSNORM, ROW_BIAS, ROW_MOE_BIAS, ROW_COMBINE } row_op;

typedef struct {
    row_op op;
    const float *x;        /* rmsnorm input [n_rows][n]; combine: y [n_tok][n_used][n] */
    const float *w;        /* rmsnorm weight [n]; bias [n] or [n_expert][n]; combine weights */
    float *y;              /* output rows [n_rows][n] */
    const int32_t *ids;    /* [n_tok][n_used] (moe ops) */
    int64_t n_rows, n;
    int n_used;
    float eps;
    int simd;              /* rmsnorm, combine: ops_elem_avx2.c's rows (bit-identical) */
} row_job;

/* 32 double chains (element i into chain i mod 32) so that a GPU warp runs them as its lanes;
 * (double)x * x is exact, so only the adds round */
static void rmsnorm_row(const float *x, const float *w, float *y, int64_t n, float eps) {
    double c[32] = {0.0};
    int64_t k = 0;
    for (; k + 32 <= n; k += 32)
        for (int l = 0; l < 32; l++) c[l] += (double)x[k + l] * (double)x[k + l];
    for (int l = 0; k < n; k++, l++) c[l] += (double)x[k] * (double)x[k];
    for (int w2 = 16; w2 >= 1; w2 /= 2)
        for (int l = 0; l < w2; l++) c[l] += c[l + w2];
    float mean = (float)(c[0] / (double)n);
    float s = 1.0f / sqrtf(mean + eps);
    if (w)
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] * s) * w[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * s;
}

static void row_range(const row_job *j, int64_t r0, int64_t r1) {
    const int64_t n = j->n;
    for (int64_t r = r0; r < r1; r++) {
        float *y = j->y + r * n;
        switch (j->op) {
        case ROW_RMSNORM:
            if (j->simd) ops_rmsnorm_row_avx2(j->x + r * n, j->w, y, n, j->eps);
            else rmsnorm_row(j->x + r * n, j->w, y, n, j->eps);
            break;
        case ROW_BIAS:
            for (int64_t i = 0; i < n; i++) y[i] = y[i] + j->w[i];
            break;
        case ROW_MOE_BIAS: {
            int32_t e = j->ids[r];
            if (e < 0) break;
            const float *b = j->w + (int64_t)e * n;
            for (int64_t i = 0; i < n; i++) y[i] = y[i] + b[i];
            break;
        }
        case ROW_COMBINE: { /* row r = token r */
            if (j->simd) {
                ops_combine_row_avx2(j->x + r * j->n_used * n, (size_t)n, j->w + r * j->n_used,
                                     j->ids ? j->ids + r * j->n_used : NULL, j->n_used, n, y);
                break;
            }
            for (int64_t i = 0; i < n; i++) y[i] = 0.0f;
            for (int s = 0; s < j->n_used; s++) {
                int64_t ts = r * j->n_used + s;
                if (j->ids && j->ids[ts] < 0) continue;
                const float ws = j->w[ts];
                const float *ys = j->x + ts * n;
                for (int64_t i = 0; i < n; i++) y[i] = y[i] + ws * ys[i];
            }
            break;
        }
        }
    }
}

static void row_worker(void *ctx, int ith, int nth) {
    const row_job *j = ctx;
    int64_t r0, r1;
    ops_split(j->n_rows, ith, nth, &r0, &r1);
    row_range(j, r0, r1);
}

static void row_run(tp_pool *pool, row_job *j, int64_t work) {
    if (j->n_rows <= 0 || j->n <= 0) return;
    ops_run(pool, row_worker, j, j->n_rows > 1 ? work : 0, EW_MIN_PARALLEL);
}

void cpu_rmsnorm(tp_pool *pool, const float *x, const float *w, float *y, int64_t n_rows,
                 int64_t n, float eps) {
    row_job j = {ROW_RMSNORM, x, w, y, NULL, n_rows, n, 0, eps, hm_cpu_has_avx2()};
    row_run(pool, &j, n_rows * n);
}

void cpu_add_bias(tp_pool *pool, float *x, const float *b, int64_t n_rows, int64_t n) {
    row_job j = {ROW_BIAS, NULL, b, x, NULL, n_rows, n, 0, 0, 0};
    row_run(pool, &j, n_rows * n);
}

void cpu_moe_add_bias(tp_pool *pool, float *y, const float *bias, const int32_t *ids,
                      int64_t n_tok, int n_used, int64_t n) {
    row_job j = {ROW_MOE_BIAS, NULL, bias, y, ids, n_tok * n_used, n, 0, 0, 0};
    row_run(pool, &j, n_tok * n_used * n);
}

void cpu_moe_combine_rows(const float *y, const float *w, const int32_t *ids, int n_used,
                          int64_t n, int64_t r0, int64_t r1, float *out) {
    if (r1 <= r0) return;
    if (hm_cpu_has_avx2()) {
        ops_combine_row_avx2(y + r0, (size_t)n, w, ids, n_used, r1 - r0, out + r0);
        return;
    }
    for (int64_t i = r0; i < r1; i++) out[i] = 0.0f;
    for (int s = 0; s < n_used; s++) {
        if (ids && ids[s] < 0) continue;
        const float ws = w[s];
        const float *ys = y + (int64_t)s * n;
        for (int64_t i = r0; i < r1; i++) out[i] = out[i] + ws * ys[i];
    }
}

void cpu_moe_combine(tp_pool *pool, const float *y, const float *w, const int32_t *ids,
                     int64_t n_tok, int n_used, int64_t n, float *out) {
    row_job j = {ROW_COMBINE, y, w, out, ids, n_tok, n, n_used, 0, hm_cpu_has_avx2()};
    row_run(pool, &j, n_tok * n_used * n);
}
