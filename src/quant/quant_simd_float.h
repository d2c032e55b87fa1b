/* quant_simd_float.h - internal: f32/f16/bf16 weight rows dotted with f32 activations, and the
 * kernel table shared by quant_avx2.c and quant_avx512.c.
 *
 * DESIGN: element i goes to lane i%32, so 32 consecutive elements are exactly the four
 * accumulator registers: acc.a[j] = fma(w[i+8j..], x[i+8j..], acc.a[j]). f16 converts exactly
 * with F16C, bf16 by a 16-bit shift. A partial last group is loaded from zero-padded copies and
 * merged by a lane blend, so lanes past the end are never updated.
 */
#ifndef HM_QUANT_SIMD_FLOAT_H
#define HM_QUANT_SIMD_FLOAT_H

#include "quant/quant_simd_kquants.h"
#include "quant/quant_simd_q32.h"

SIMD_INLINE __m256 simd_load8_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)(const void *)p); }
SIMD_INLINE __m256 simd_load8_f16(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
SIMD_INLINE __m256 simd_load8_bf16(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

#define SIMD_FLOAT_TILE(NAME, LOAD8, ESZ)                                                      \
    static float NAME(int64_t n, const uint8_t *w, const float *x) {                           \
        simd_acc acc;                                                                          \
        simd_acc_zero(&acc);                                                                   \
        int64_t i = 0;                                                                         \
        for (; i + 32 <= n; i += 32) {                                                         \
            simd_prefetch_w(w + i * (ESZ), 32 * (ESZ));                                        \
            for (int j = 0; j < 4; j++)                                                        \
                acc.a[j] = _mm256_fmadd_ps(LOAD8(w + (i + 8 * j) * (ESZ)),                     \
                                           _mm256_loadu_ps(x + i + 8 * j), acc.a[j]);          \
        }                                                                                      \
        for (int j = 0; i + 8 * j < n; j++) {                                                  \
            int64_t e0 = i + 8 * j;                                                            \
            int cnt = n - e0 >= 8 ? 8 : (int)(n - e0);                                         \
            uint8_t wb[8 * (ESZ)];                                                             \
            float xb[8];                                                                       \
            memset(wb, 0, sizeof(wb));                                                         \
            memset(xb, 0, sizeof(xb));                                                         \
            memcpy(wb, w + e0 * (ESZ), (size_t)cnt * (ESZ));                                   \
            memcpy(xb, x + e0, (size_t)cnt * sizeof(float));                                   \
            __m256 r = _mm256_fmadd_ps(LOAD8(wb), _mm256_loadu_ps(xb), acc.a[j]);              \
            acc.a[j] = _mm256_blendv_ps(acc.a[j], r, simd_lane_mask(cnt));                     \
        }                                                                                      \
        return simd_tree(&acc);                                                                \
    }                                                                                          \
    static void NAME##_tile(int64_t n, const void *w, size_t w_stride, int nr, const void *act, \
                            size_t act_stride, int nc, float *out, size_t out_stride) {        \
        for (int r = 0; r < nr; r++) {                                                         \
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_stride;                     \
            for (int c = 0; c < nc; c++)                                                       \
                out[(size_t)c * out_stride + (size_t)r] = NAME(                                \
                    n, wr, (const float *)(const void *)((const uint8_t *)act + (size_t)c * act_stride)); \
        }                                                                                      \
    }

SIMD_FLOAT_TILE(simd_dot_f32, simd_load8_f32, 4)
SIMD_FLOAT_TILE(simd_dot_f16, simd_load8_f16, 2)
SIMD_FLOAT_TILE(simd_dot_bf16, simd_load8_bf16, 2)

/* The table of one ISA (all types vectorised; none falls back to the reference). */
#define SIMD_KERNEL_TABLE(VAR, ISA, NAME)                                                      \
    static const quant_kernels VAR = {                                                         \
        .isa = ISA,                                                                            \
        .name = NAME,                                                                          \
        .dot = {                                                                               \
            [HM_TYPE_F32] = simd_dot_f32_tile,                                                 \
            [HM_TYPE_F16] = simd_dot_f16_tile,                                                 \
            [HM_TYPE_BF16] = simd_dot_bf16_tile,                                               \
            [HM_TYPE_Q4_0] = simd_dot_q4_0_tile,                                               \
            [HM_TYPE_Q4_1] = simd_dot_q4_1_tile,                                               \
            [HM_TYPE_Q5_0] = simd_dot_q5_0_tile,                                               \
            [HM_TYPE_Q5_1] = simd_dot_q5_1_tile,                                               \
            [HM_TYPE_Q8_0] = simd_dot_q8_0_tile,                                               \
            [HM_TYPE_IQ4_NL] = simd_dot_iq4_nl_tile,                                           \
            [HM_TYPE_MXFP4] = simd_dot_mxfp4_tile,                                             \
            [HM_TYPE_Q4_K] = simd_dot_q4_K_tile,                                               \
            [HM_TYPE_Q5_K] = simd_dot_q5_K_tile,                                               \
            [HM_TYPE_Q6_K] = simd_dot_q6_K_tile,                                               \
            [HM_TYPE_IQ4_XS] = simd_dot_iq4_xs_tile,                                           \
        },                                                                                     \
        .act = {                                                                               \
            [QUANT_ACT_F32] = simd_act_f32,                                                    \
            [QUANT_ACT_Q8_32] = simd_act_q8_32,                                                \
            [QUANT_ACT_Q8_K] = simd_act_q8_K,                                                  \
        },                                                                                     \
    };

#endif
