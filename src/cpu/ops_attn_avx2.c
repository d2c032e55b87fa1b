/* ops_attn_avx2.c - F16C row conversion for the attention's V rows (exact, like the scalar
 * hm_fp16_to_f32; chosen at run time when the CPU has AVX2 and F16C). */
#include <immintrin.h>
#include <stdint.h>

#include "cpu/ops_internal.h"
#include "quant/fp16.h"

void ops_f16_to_f32_avx2(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = hm_fp16_to_f32(src[i]);
}
