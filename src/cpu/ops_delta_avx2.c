/* ops_delta_avx2.c - cpu_delta_rule's passes over a value head's state on AVX2, eight columns at
 * a time with the scalar loops' operations in their order (a multiply, then an add or subtract,
 * no FMA), so the state and the output get the scalar loops' bits; chosen at run time. */
#include <immintrin.h>
#include <stdint.h>

#include "cpu/ops_internal.h"

void ops_delta_rule_avx2(float *S, const float *q, const float *k, const float *v, float decay,
                         float beta, int64_t dk, int64_t dv, float *o, float *kv) {
    const __m256 dc = _mm256_set1_ps(decay), bt = _mm256_set1_ps(beta);
    for (int64_t j = 0; j < dv; j += 8) _mm256_storeu_ps(kv + j, _mm256_setzero_ps());
    for (int64_t i = 0; i < dk; i++) { /* S *= decay; kv += S^T k, row by row */
        float *row = S + i * dv;
        const __m256 ki = _mm256_set1_ps(k[i]);
        for (int64_t j = 0; j < dv; j += 8) {
            const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row + j), dc);
            _mm256_storeu_ps(row + j, r);
            _mm256_storeu_ps(kv + j, _mm256_add_ps(_mm256_loadu_ps(kv + j), _mm256_mul_ps(r, ki)));
        }
    }
    for (int64_t j = 0; j < dv; j += 8) { /* the delta: (v - kv) beta */
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(v + j), _mm256_loadu_ps(kv + j));
        _mm256_storeu_ps(kv + j, _mm256_mul_ps(d, bt));
        _mm256_storeu_ps(o + j, _mm256_setzero_ps());
    }
    for (int64_t i = 0; i < dk; i++) { /* S += k d^T; o += S^T q */
        float *row = S + i * dv;
        const __m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q[i]);
        for (int64_t j = 0; j < dv; j += 8) {
            const __m256 r =
                _mm256_add_ps(_mm256_loadu_ps(row + j), _mm256_mul_ps(ki, _mm256_loadu_ps(kv + j)));
            _mm256_storeu_ps(row + j, r);
            _mm256_storeu_ps(o + j, _mm256_add_ps(_mm256_loadu_ps(o + j), _mm256_mul_ps(r, qi)));
        }
    }
}
