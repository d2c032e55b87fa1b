/* quant_simd_lanes.h - internal: the block-per-lane dot product driver and the block kernels of
 * the 32-element types (q8_0 q4_0 q5_0 iq4_nl mxfp4 q4_1 q5_1). Included by quant_avx2.c and
 * quant_avx512.c after quant_simd_common.h.
 *
 * DESIGN: a block kernel BLK(w, a, &ps, &pt, &d1, &d2) gives, for one weight block and its
 * activation block, the integer partials ps (and pt for a second term) and the float factors
 * d1 = d*da (and d2, e.g. m*da or -(dmin*da)). SIMD_LANE_ROW(BLK, ...) runs a row: groups of 8
 * blocks, simd_hsum8x8 of the partials, then acc = fma(d1, (float)s, acc) [; fma(d2, (float)t)]
 * on the accumulator register that holds lanes b%32. SIMD_LANE_TILE wraps a row into the
 * quant_dot_tile_fn: for each weight row r and activation row c one row dot (row r stays in L1
 * while c varies). The 32-element types differ only in how 32 weights are unpacked into bytes.
 */
#ifndef HM_QUANT_SIMD_LANES_H
#define HM_QUANT_SIMD_LANES_H

#include "quant/quant_simd_common.h"

/* One group of CNT (1..8) blocks starting at block B0; FULL is 1 when CNT == 8. */
#define SIMD_LANE_GROUP(BLK, HAS_T, WSZ, ASZ, w, a, B0, CNT, FULL, acc)                       \
    do {                                                                                       \
        __m256i ps_[8], pt_[8];                                                                \
        float d1_[8], d2_[8];                                                                  \
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
        for (; b + 8 <= nb; b += 8) SIMD_LANE_GROUP(BLK, HAS_T, WSZ, ASZ, w, a, b, 8, 1, acc); \
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

/* ---- 32-element blocks: unpack 32 weights, dot with the q8_32 activation ---- */

/* signed weights: s = sum w[i] * a[i]; d1 = d * da */
#define SIMD_S8_BLOCK(NAME, TYPE, UNPACK, SCALE)                                               \
    SIMD_INLINE void NAME(const uint8_t *wp, const uint8_t *ap, __m256i *ps, __m256i *pt,      \
                          float *d1, float *d2) {                                              \
        const TYPE *x = (const TYPE *)(const void *)wp;                                        \
        const block_q8_32 *y = (const block_q8_32 *)(const void *)ap;                          \
        __m256i wv = UNPACK(x);                                                                \
        *ps = simd_dot_s8(wv, _mm256_loadu_si256((const __m256i *)y->qs));                     \
        *d1 = (SCALE(x)) * simd_f32(&y->d);                                                    \
        (void)pt; (void)d2;                                                                    \
    }

/* unsigned weights with a min: s = sum q[i] * a[i], t = sum_a; d1 = d * da, d2 = m * da */
#define SIMD_U8M_BLOCK(NAME, TYPE, UNPACK)                                                     \
    SIMD_INLINE void NAME(const uint8_t *wp, const uint8_t *ap, __m256i *ps, __m256i *pt,      \
                          float *d1, float *d2) {                                              \
        const TYPE *x = (const TYPE *)(const void *)wp;                                        \
        const block_q8_32 *y = (const block_q8_32 *)(const void *)ap;                          \
        *ps = simd_dot_u8(UNPACK(x), _mm256_loadu_si256((const __m256i *)y->qs));              \
        *pt = _mm256_setr_epi32(simd_i32(&y->sum), 0, 0, 0, 0, 0, 0, 0);                       \
        float da = simd_f32(&y->d);                                                            \
        *d1 = simd_fp16(&x->d) * da;                                                           \
        *d2 = simd_fp16(&x->m) * da;                                                           \
    }

SIMD_INLINE __m256i simd_unpack_q8_0(const block_q8_0 *x) {
    return _mm256_loadu_si256((const __m256i *)x->qs);
}
SIMD_INLINE __m256i simd_unpack_q4_0(const block_q4_0 *x) {
    return _mm256_sub_epi8(simd_nibbles32(x->qs), _mm256_set1_epi8(8));
}
SIMD_INLINE __m256i simd_unpack_q5u(const uint8_t *qs, const uint8_t *qh) {
    __m256i hb = _mm256_and_si256(simd_bits32(qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(simd_nibbles32(qs), hb);
}
SIMD_INLINE __m256i simd_unpack_q5_0(const block_q5_0 *x) {
    return _mm256_sub_epi8(simd_unpack_q5u(x->qs, x->qh), _mm256_set1_epi8(16));
}
SIMD_INLINE __m256i simd_unpack_iq4_nl(const block_iq4_nl *x) {
    return simd_lut16(simd_nibbles32(x->qs), hm_kvalues_iq4nl);
}
SIMD_INLINE __m256i simd_unpack_mxfp4(const block_mxfp4 *x) {
    return simd_lut16(simd_nibbles32(x->qs), hm_kvalues_mxfp4);
}
SIMD_INLINE __m256i simd_unpack_q4_1(const block_q4_1 *x) { return simd_nibbles32(x->qs); }
SIMD_INLINE __m256i simd_unpack_q5_1(const block_q5_1 *x) {
    return simd_unpack_q5u(x->qs, x->qh);
}

#define SIMD_SCALE_FP16(x) simd_fp16(&(x)->d)
#define SIMD_SCALE_E8M0(x) hm_e8m0_half_to_f32((x)->e)

SIMD_S8_BLOCK(simd_blk_q8_0, block_q8_0, simd_unpack_q8_0, SIMD_SCALE_FP16)
SIMD_S8_BLOCK(simd_blk_q4_0, block_q4_0, simd_unpack_q4_0, SIMD_SCALE_FP16)
SIMD_S8_BLOCK(simd_blk_q5_0, block_q5_0, simd_unpack_q5_0, SIMD_SCALE_FP16)
SIMD_S8_BLOCK(simd_blk_iq4_nl, block_iq4_nl, simd_unpack_iq4_nl, SIMD_SCALE_FP16)
SIMD_S8_BLOCK(simd_blk_mxfp4, block_mxfp4, simd_unpack_mxfp4, SIMD_SCALE_E8M0)
SIMD_U8M_BLOCK(simd_blk_q4_1, block_q4_1, simd_unpack_q4_1)
SIMD_U8M_BLOCK(simd_blk_q5_1, block_q5_1, simd_unpack_q5_1)

#define SIMD_Q8A sizeof(block_q8_32)
SIMD_LANE_TILE(simd_dot_q8_0, simd_blk_q8_0, 0, sizeof(block_q8_0), SIMD_Q8A, 32)
SIMD_LANE_TILE(simd_dot_q4_0, simd_blk_q4_0, 0, sizeof(block_q4_0), SIMD_Q8A, 32)
SIMD_LANE_TILE(simd_dot_q5_0, simd_blk_q5_0, 0, sizeof(block_q5_0), SIMD_Q8A, 32)
SIMD_LANE_TILE(simd_dot_iq4_nl, simd_blk_iq4_nl, 0, sizeof(block_iq4_nl), SIMD_Q8A, 32)
SIMD_LANE_TILE(simd_dot_mxfp4, simd_blk_mxfp4, 0, sizeof(block_mxfp4), SIMD_Q8A, 32)
SIMD_LANE_TILE(simd_dot_q4_1, simd_blk_q4_1, 1, sizeof(block_q4_1), SIMD_Q8A, 32)
SIMD_LANE_TILE(simd_dot_q5_1, simd_blk_q5_1, 1, sizeof(block_q5_1), SIMD_Q8A, 32)

#endif
