/* ops_elem_avx2.c - AVX2 activations (SiLU, sigmoid, SwiGLU, gpt-oss SwiGLU) with exactly the
 * scalar operations of ops_elem.c / ops_math.h (hm_expf8, then IEEE add and divide), so the
 * results are bit-identical; chosen at run time on CPUs with AVX2. */
#include <immintrin.h>
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

static float act1(int op, float a, float b, float alpha, float limit) {
    switch (op) {
    case OPS_ACT_SILU: return hm_siluf(a);
    case OPS_ACT_SIGMOID: return hm_sigmoidf(a);
    case OPS_ACT_SWIGLU: return hm_siluf(a) * b;
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
