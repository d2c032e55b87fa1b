/* ops_elem_avx2.c - AVX2 activations (SiLU, sigmoid, SwiGLU, gpt-oss SwiGLU, GeGLU), the RMS
 * norm of a row and the slot combine of a token, with exactly the scalar operations of ops_elem.c /
 * ops_math.h (hm_expf8, then IEEE add and divide; the norm's double chains lane by lane), so
 * the results are bit-identical; chosen at run time on CPUs with AVX2. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "cpu/ops_internal.h"
#include "cpu/ops_math.h"
#include "cpu/ops_math_avx2.h"

/* 1 / (1 + hm_expf(-x)) */
static inline __m256 sigmoid8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = hm_expf8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)));
    return _mm256_div_ps(one, _mm256_add_ps(one, e));
}

/* x / (1 + hm_expf(-x)) */
static inline __m256 silu8(__m256 x) {
    const __m256 e = hm_expf8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* hm_geluf: g / (1 + hm_expf(-2u)), u = 0.7978845608 (g + ((0.044715 g) g) g) */
static inline __m256 gelu8(__m256 g) {
    const __m256 c = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), g), g), g);
    const __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608f), _mm256_add_ps(g, c));
    const __m256 e = hm_expf8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u));
    return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static float act1(int op, float a, float b, float alpha, float limit) {
    switch (op) {
    case OPS_ACT_SILU: return hm_siluf(a);
    case OPS_ACT_SIGMOID: return hm_sigmoidf(a);
    case OPS_ACT_SWIGLU: return hm_siluf(a) * b;
    case OPS_ACT_GEGLU: return hm_geluf(a) * b;
    default: {
        float g = a > limit ? limit : a;
        float u = b > limit ? limit : (b < -limit ? -limit : b);
        return (g * hm_sigmoidf(g * alpha)) * (u + 1.0f);
    }
    }
}

void ops_act_avx2(int op, const float *a, const float *b, float *y, int64_t n, float alpha,
                  float limit) {
    int64_t i = 0;
    switch (op) {
    case OPS_ACT_SILU:
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, silu8(_mm256_loadu_ps(a + i)));
        break;
    case OPS_ACT_SIGMOID:
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, sigmoid8(_mm256_loadu_ps(a + i)));
        break;
    case OPS_ACT_SWIGLU:
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(a + i)), _mm256_loadu_ps(b + i)));
        break;
    case OPS_ACT_GEGLU:
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(gelu8(_mm256_loadu_ps(a + i)), _mm256_loadu_ps(b + i)));
        break;
    default: {
        const __m256 lim = _mm256_set1_ps(limit), nlim = _mm256_set1_ps(-limit);
        const __m256 al = _mm256_set1_ps(alpha), one = _mm256_set1_ps(1.0f);
        for (; i + 8 <= n; i += 8) {
            __m256 g = _mm256_loadu_ps(a + i), u = _mm256_loadu_ps(b + i);
            g = _mm256_blendv_ps(g, lim, _mm256_cmp_ps(g, lim, _CMP_GT_OQ));
            u = _mm256_blendv_ps(_mm256_blendv_ps(u, nlim, _mm256_cmp_ps(u, nlim, _CMP_LT_OQ)), lim,
                                 _mm256_cmp_ps(u, lim, _CMP_GT_OQ));
            const __m256 s = sigmoid8(_mm256_mul_ps(g, al));
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(g, s), _mm256_add_ps(u, one)));
        }
        break;
    }
    }
    for (; i < n; i++) y[i] = act1(op, a[i], b ? b[i] : 0.0f, alpha, limit);
}

void ops_rmsnorm_row_avx2(const float *x, const float *w, float *y, int64_t n, float eps) {
    /* chain l = element index mod 32: register 2g holds chains 8g..8g+3, 2g+1 8g+4..8g+7 */
    __m256d c[8];
    for (int j = 0; j < 8; j++) c[j] = _mm256_setzero_pd();
    int64_t k = 0;
    for (; k + 32 <= n; k += 32)
        for (int g = 0; g < 4; g++) {
            const __m256 v = _mm256_loadu_ps(x + k + 8 * g);
            const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
            const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
            c[2 * g] = _mm256_add_pd(c[2 * g], _mm256_mul_pd(lo, lo));
            c[2 * g + 1] = _mm256_add_pd(c[2 * g + 1], _mm256_mul_pd(hi, hi));
        }
    double sum;
    if (k == n) { /* the tree in registers: s = 16, 8, 4 whole registers, then 2 and 1 */
        for (int j = 0; j < 4; j++) c[j] = _mm256_add_pd(c[j], c[j + 4]);
        for (int j = 0; j < 2; j++) c[j] = _mm256_add_pd(c[j], c[j + 2]);
        c[0] = _mm256_add_pd(c[0], c[1]);
        const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(c[0]), _mm256_extractf128_pd(c[0], 1));
        sum = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    } else {
        double cc[32];
        for (int j = 0; j < 8; j++) _mm256_storeu_pd(cc + 4 * j, c[j]);
        for (int l = 0; k < n; k++, l++) cc[l] += (double)x[k] * (double)x[k];
        for (int w2 = 16; w2 >= 1; w2 /= 2)
            for (int l = 0; l < w2; l++) cc[l] += cc[l + w2];
        sum = cc[0];
    }
    const float mean = (float)(sum / (double)n);
    const float s = 1.0f / sqrtf(mean + eps);
    const __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    if (w) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs),
                                                  _mm256_loadu_ps(w + i)));
        for (; i < n; i++) y[i] = (x[i] * s) * w[i];
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
        for (; i < n; i++) y[i] = x[i] * s;
    }
}

void ops_combine_row_avx2(const float *ys, size_t stride, const float *w, const int32_t *ids,
                          int n_used, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int s = 0; s < n_used; s++) {
            if (ids && ids[s] < 0) continue;
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(w[s]),
                                                   _mm256_loadu_ps(ys + (size_t)s * stride + (size_t)i)));
        }
        _mm256_storeu_ps(out + i, acc);
    }
    for (; i < n; i++) {
        float acc = 0.0f;
        for (int s = 0; s < n_used; s++) {
            if (ids && ids[s] < 0) continue;
            acc = acc + w[s] * ys[(size_t)s * stride + (size_t)i];
        }
        out[i] = acc;
    }
}

void ops_rope_neox_avx2(float *xt, int n_head, int head_dim, int n_pairs, const float *cs) {
    /* c[i], s[i] of the [n_pairs][2] table, split once for every head */
    float c[512], s[512];
    for (int i = 0; i < n_pairs; i++) {
        c[i] = cs[2 * i];
        s[i] = cs[2 * i + 1];
    }
    for (int h = 0; h < n_head; h++) {
        float *xa = xt + (int64_t)h * head_dim, *xb = xa + n_pairs;
        int i = 0;
        for (; i + 8 <= n_pairs; i += 8) {
            const __m256 x0 = _mm256_loadu_ps(xa + i), x1 = _mm256_loadu_ps(xb + i);
            const __m256 vc = _mm256_loadu_ps(c + i), vs = _mm256_loadu_ps(s + i);
            _mm256_storeu_ps(xa + i, _mm256_sub_ps(_mm256_mul_ps(x0, vc), _mm256_mul_ps(x1, vs)));
            _mm256_storeu_ps(xb + i, _mm256_add_ps(_mm256_mul_ps(x0, vs), _mm256_mul_ps(x1, vc)));
        }
        for (; i < n_pairs; i++) {
            const float x0 = xa[i], x1 = xb[i];
            xa[i] = x0 * c[i] - x1 * s[i];
            xb[i] = x0 * s[i] + x1 * c[i];
        }
    }
}

void ops_arith_avx2(int op, const float *a, const float *b, float s, float *y, int64_t n) {
    int64_t i = 0;
    const __m256 vs = _mm256_set1_ps(s);
    switch (op) {
    case OPS_ARITH_ADD:
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
        for (; i < n; i++) y[i] = a[i] + b[i];
        break;
    case OPS_ARITH_MUL:
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
        for (; i < n; i++) y[i] = a[i] * b[i];
        break;
    default:
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), vs));
        for (; i < n; i++) y[i] = a[i] * s;
        break;
    }
}
