/* ops_math_avx2.h - hm_expf on 8 lanes (AVX2), the same operations as the scalar definition in
 * cpu/ops_math.h, so every lane gives hm_expf's bits. Include only from *_avx2.c files. */
#ifndef HM_CPU_OPS_MATH_AVX2_H
#define HM_CPU_OPS_MATH_AVX2_H

#include <immintrin.h>

static inline __m256 hm_expf8(__m256 v) {
    __m256 t = _mm256_add_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269502f)), _mm256_set1_ps(12582912.0f));
    const __m256 nf = _mm256_sub_ps(t, _mm256_set1_ps(12582912.0f));
    __m256 r = _mm256_sub_ps(v, _mm256_mul_ps(nf, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(nf, _mm256_set1_ps(-2.12194440e-4f)));
    const __m256 z = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, z), r), _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvttps_epi32(nf);
    const __m256i n1 = _mm256_srai_epi32(_mm256_add_epi32(ni, _mm256_srli_epi32(ni, 31)), 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
    /* out of range: +inf above, +0 below, NaN stays */
    y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()),
                         _mm256_cmp_ps(v, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(),
                         _mm256_cmp_ps(v, _mm256_set1_ps(-103.972084045410156f), _CMP_LT_OQ));
    return _mm256_blendv_ps(y, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

#endif
