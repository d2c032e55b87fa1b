/* quant_simd_lanes.h - internal: the block-per-lane dot product driver used by the 256-element
 * types (quant_simd_kquants.h). Included by quant_avx2.c and quant_avx512.c after
 * quant_simd_common.h.
 *
 * DESIGN: a block kernel BLK(w, a, &ps, &pt, &d1, &d2) gives, for one weight block and its
 * activation block, the integer partials ps (and pt for a second term) and the float factors
 * d1 = d*da (and d2, e.g. m*da or -(dmin*da)). SIMD_LANE_ROW(BLK, ...) runs a row: groups of 8
 * blocks, simd_hsum8x8 of the partials, then acc = fma(d1, (float)s, acc) [; fma(d2, (float)t)]
 * on the accumulator register that holds lanes b%32. SIMD_LANE_TILE wraps a row into the
 * quant_dot_tile_fn: for each weight row r and activation row c one row dot (row r stays in L1
 * while c varies).
 */
#ifndef HM_QUANT_SIMD_LANES_H
#define HM_QUANT_SIMD_LANES_H

#include "quant/quant_simd_common.h"

/* One group of CNT (1..8) blocks starting at block B0; FULL is 1 when CNT == 8. */
#define SIMD_LANE_GROUP(BLK, HAS_T, WSZ, ASZ, w, a, B0, CNT, FULL, acc)                       \
    do {                                                                                       \
        __m256i ps_[8], pt_[8];                                                                \
        float d1_[8], d2_[8];                                                                  \
        _Pragma("GCC unroll 8")                                                                \
        for (int i_ = 0; i_ < 8; i_++) {                                                       \
            if (FULL || i_ < (CNT)) {                                                          \
                BLK((w) + ((B0) + i_) * (WSZ), (a) + ((B0) + i_) * (ASZ), &ps_[i_], &pt_[i_],  \
                    &d1_[i_], &d2_[i_]);                                                       \
            } else {                                                                           \
                ps_[i_] = pt_[i_] = _mm256_setzero_si256();                                    \
                d1_[i_] = d2_[i_] = 0.0f;                                                      \
            }                                                                                  \
        }                                                                                      \
        __m256 *ac_ = &(acc).a[((B0) >> 3) & 3];                                               \
        __m256 r_ = _mm256_fmadd_ps(_mm256_loadu_ps(d1_), _mm256_cvtepi32_ps(simd_hsum8x8(ps_)), \
                                    *ac_);                                                     \
        if (HAS_T)                                                                             \
            r_ = _mm256_fmadd_ps(_mm256_loadu_ps(d2_), _mm256_cvtepi32_ps(simd_hsum8x8(pt_)), r_); \
        *ac_ = (FULL) ? r_ : _mm256_blendv_ps(*ac_, r_, simd_lane_mask(CNT));                  \
    } while (0)

/* Defines `static float NAME(int64_t nb, const uint8_t *w, const uint8_t *a)`: one row dot of
 * nb blocks, and `static void NAME_tile(...)`: the quant_dot_tile_fn. */
#define SIMD_LANE_TILE(NAME, BLK, HAS_T, WSZ, ASZ, BS)                                         \
    static float NAME(int64_t nb, const uint8_t *w, const uint8_t *a) {                        \
        simd_acc acc;                                                                          \
        simd_acc_zero(&acc);                                                                   \
        int64_t b = 0;                                                                         \
        for (; b + 8 <= nb; b += 8) {                                                          \
            simd_prefetch_w(w + b * (WSZ), 8 * (WSZ));                                         \
            SIMD_LANE_GROUP(BLK, HAS_T, WSZ, ASZ, w, a, b, 8, 1, acc);                         \
        }                                                                                      \
        if (b < nb) SIMD_LANE_GROUP(BLK, HAS_T, WSZ, ASZ, w, a, b, (int)(nb - b), 0, acc);     \
        return simd_tree(&acc);                                                                \
    }                                                                                          \
    static void NAME##_tile(int64_t n, const void *w, size_t w_stride, int nr, const void *act, \
                            size_t act_stride, int nc, float *out, size_t out_stride) {        \
        const int64_t nb = n / (BS);                                                           \
        for (int r = 0; r < nr; r++) {                                                         \
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_stride;                     \
            for (int c = 0; c < nc; c++)                                                       \
                out[(size_t)c * out_stride + (size_t)r] =                                      \
                    NAME(nb, wr, (const uint8_t *)act + (size_t)c * act_stride);               \
        }                                                                                      \
    }

#endif
