/* quant_simd_k4.h - internal: ggml's get_scale_min_k4 for all 8 sub-blocks of a q4_K / q5_K
 * block at once, in vector registers. Shared by the dot tiles (quant_simd_kquants.h) and the
 * repacked kernel (quant_x8_avx512.c); AVX2 suffices. */
#ifndef HM_QUANT_SIMD_K4_H
#define HM_QUANT_SIMD_K4_H

#include <immintrin.h>
#include <stdint.h>

/* s: the 12 scale bytes; 16 bytes are read (the block goes on). Returns
 * r = [sc0-3 | sc4-7 | mn0-3 | mn4-7] (bytes) in each 128-bit lane. */
static inline __attribute__((always_inline)) __m256i simd_k4_scale_bytes(const uint8_t *s) {
    /* both 128-bit lanes: dwords u0, u1, u2 (and 4 bytes past the scales) */
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)s));
    /* sc0-3 = u0 & 3f, sc4-7 = (u2 & 0f) | ((u0 >> 6) & 3) << 4,
     * mn0-3 = u1 & 3f, mn4-7 = ((u2 >> 4) & 0f) | ((u1 >> 6) & 3) << 4 */
    __m256i p = _mm256_shuffle_epi32(v, 0x98); /* u0 u2 u1 u2 */
    __m256i q = _mm256_shuffle_epi32(v, 0x50); /* u0 u0 u1 u1 */
    p = _mm256_and_si256(_mm256_srlv_epi32(p, _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4)),
                         _mm256_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f,
                                           0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    q = _mm256_and_si256(_mm256_srli_epi32(q, 2),
                         _mm256_setr_epi32(0, 0x30303030, 0, 0x30303030, 0, 0x30303030, 0, 0x30303030));
    return _mm256_or_si256(p, q);
}

#endif
