/* quant_simd_kquants.h - internal: block kernels of the 256-element types (q4_K q5_K q6_K
 * iq4_xs) against q8_K activations, for the lane driver of quant_simd_lanes.h: UNPACK decodes
 * a weight block into registers once, DOT uses them for each activation row of the tile.
 *
 * DESIGN: sub-block products are formed in int16 with pmaddubsw (unsigned weight byte x signed
 * activation byte; the largest pair sum, 2*127*127 for iq4_xs via the sign trick, fits int16) and
 * scaled into int32 partials with pmaddwd by the sub-block scale (vpdpwssd with VNNI). Minimum and
 * offset terms use the activation's bsums: q4_K/q5_K t = sum mn[j]*(bsums[2j]+bsums[2j+1]); q6_K's
 * "-32" is folded in as s = sum sc[j]*(sum q*a) - 32*sum sc[j]*bsums[j] (both exact integers).
 */
#ifndef HM_QUANT_SIMD_KQUANTS_H
#define HM_QUANT_SIMD_KQUANTS_H

#include "quant/quant_simd_lanes.h"

/* acc + pmaddwd(p16, s16) */
SIMD_INLINE __m256i simd_madd_acc(__m256i acc, __m256i p16, __m256i s16) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, p16, s16);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, s16));
#endif
}

/* ggml's get_scale_min_k4 for all 8 sub-blocks at once (ggml's utmp trick): sc2[j] holds sc[j]
 * in both int16 halves (a pmaddwd operand by one broadcast load); returns mn[j] in both int16
 * of 32-bit lane j. The words are assembled in registers (no store-to-load forwarding stall). */
SIMD_INLINE __m256i simd_k4_scales(const uint8_t *s, int32_t sc2[8]) {
    const uint32_t km1 = 0x3f3f3f3fu, km2 = 0x0f0f0f0fu, km3 = 0x03030303u;
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    const uint32_t m47 = ((u2 >> 4) & km2) | (((u1 >> 6) & km3) << 4);
    const uint32_t sc47 = (u2 & km2) | (((u0 >> 6) & km3) << 4);
    __m128i v = _mm_setr_epi32((int)(u0 & km1), (int)sc47, (int)(u1 & km1), (int)m47);
    /* bytes: sc[0..8), mn[0..8) */
    __m128i sc16 = _mm_cvtepu8_epi16(v);
    _mm_storeu_si128((__m128i *)sc2, _mm_unpacklo_epi16(sc16, sc16));
    _mm_storeu_si128((__m128i *)(sc2 + 4), _mm_unpackhi_epi16(sc16, sc16));
    __m128i mn16 = _mm_cvtepu8_epi16(_mm_srli_si128(v, 8));
    return _mm256_set_m128i(_mm_unpackhi_epi16(mn16, mn16), _mm_unpacklo_epi16(mn16, mn16));
}

/* ---- q4_K / q5_K: 4 chunks of 64 elements; chunk j's 32 bytes hold sub-block 2j in the low
 * nibbles and 2j+1 in the high ones; q5_K's bit 4 of element l of sub-block k is bit k of qh[l] */
typedef struct {
    __m256i u[8];   /* sub-block k's 32 unsigned quants */
    __m256i m2;     /* mn[j] in both int16 of 32-bit lane j */
    int32_t sc2[8]; /* sc[j] in both int16 halves */
    float d, dmin;
} simd_st_k45;

SIMD_INLINE void simd_unpack_k45(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                                 simd_st_k45 *st) {
    st->m2 = simd_k4_scales(scales, st->sc2);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i hv = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    _Pragma("GCC unroll 4")
    for (int j = 0; j < 4; j++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        __m256i lo = _mm256_and_si256(q, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh) {
            const __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * j)));
            const __m256i b1 = _mm256_set1_epi8((char)(1 << (2 * j + 1)));
            const __m256i h16 = _mm256_set1_epi8(0x10);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, b0), b0), h16));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, b1), b1), h16));
        }
        st->u[2 * j] = lo;
        st->u[2 * j + 1] = hi;
    }
}

SIMD_INLINE void simd_unpack_q4_K(const uint8_t *wp, simd_st_k45 *st) {
    const block_q4_K *x = (const block_q4_K *)(const void *)wp;
    simd_unpack_k45(x->scales, x->qs, NULL, st);
    st->d = simd_fp16(&x->d);
    st->dmin = simd_fp16(&x->dmin);
}

SIMD_INLINE void simd_unpack_q5_K(const uint8_t *wp, simd_st_k45 *st) {
    const block_q5_K *x = (const block_q5_K *)(const void *)wp;
    simd_unpack_k45(x->scales, x->qs, x->qh, st);
    st->d = simd_fp16(&x->d);
    st->dmin = simd_fp16(&x->dmin);
}

/* s = sum_j sc[j] * sum q*a; t = sum_j mn[j] * (bsums[2j] + bsums[2j+1]) */
SIMD_INLINE void simd_dot_k45(const simd_st_k45 *st, const uint8_t *ap, __m256i *ps, __m256i *pt,
                              float *d1, float *d2) {
    const block_q8_K *y = (const block_q8_K *)(const void *)ap;
    __m256i acc[4]; /* four short chains instead of one long one */
    _Pragma("GCC unroll 4")
    for (int j = 0; j < 4; j++) {
        __m256i p0 = _mm256_maddubs_epi16(st->u[2 * j], _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j)));
        __m256i p1 = _mm256_maddubs_epi16(st->u[2 * j + 1], _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j + 32)));
        acc[j] = _mm256_madd_epi16(p0, _mm256_set1_epi32(st->sc2[2 * j]));
        acc[j] = simd_madd_acc(acc[j], p1, _mm256_set1_epi32(st->sc2[2 * j + 1]));
    }
    *ps = _mm256_add_epi32(_mm256_add_epi32(acc[0], acc[1]), _mm256_add_epi32(acc[2], acc[3]));
    *pt = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), st->m2);
    const float da = simd_f32(&y->d);
    *d1 = st->d * da;
    *d2 = -(st->dmin * da);
}

/* ---- q6_K: two halves of 128; in half n, ql + 64n, qh + 32n, scales + 8n: elements l, 32+l,
 * 64+l, 96+l (l < 32) take ql[l] low, ql[l+32] low, ql[l] high, ql[l+32] high and bits 0-1,
 * 2-3, 4-5, 6-7 of qh[l]; 16 sub-blocks of 16; s = sum_j sc[j] * sum (q - 32) * a ---- */
typedef struct {
    __m256i u[8];   /* 32 unsigned 6-bit quants (elements 32k..32k+31) */
    __m256i sv[8];  /* the two int16 sub-block scales of those 32 */
    __m256i sc16;   /* the 16 scales as int16 */
    float d;
} simd_st_q6;

SIMD_INLINE void simd_unpack_q6_K(const uint8_t *wp, simd_st_q6 *st) {
    const block_q6_K *x = (const block_q6_K *)(const void *)wp;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    _Pragma("GCC unroll 2")
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = x->ql + 64 * n;
        const int8_t *sc = x->scales + 8 * n;
        __m256i la = _mm256_loadu_si256((const __m256i *)ql);
        __m256i lb = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i hv = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * n));
        __m256i *q = st->u + 4 * n;
        q[0] = _mm256_or_si256(_mm256_and_si256(la, m4),
                               _mm256_slli_epi16(_mm256_and_si256(hv, _mm256_set1_epi8(0x03)), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(lb, m4),
                               _mm256_slli_epi16(_mm256_and_si256(hv, _mm256_set1_epi8(0x0c)), 2));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), m4),
                               _mm256_and_si256(hv, _mm256_set1_epi8(0x30)));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), m4),
                               _mm256_srli_epi16(_mm256_and_si256(hv, _mm256_set1_epi8((char)0xc0)), 2));
        for (int k = 0; k < 4; k++)
            st->sv[4 * n + k] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
    }
    st->sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    st->d = simd_fp16(&x->d);
}

/* the -32 is folded in: s = sum sc[j] * (sum q*a) - 32 * sum sc[j] * bsums[j] (exact) */
SIMD_INLINE void simd_dot_q6_K(const simd_st_q6 *st, const uint8_t *ap, __m256i *ps, __m256i *pt,
                               float *d1, float *d2) {
    const block_q8_K *y = (const block_q8_K *)(const void *)ap;
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; k++) {
        __m256i p0 = _mm256_maddubs_epi16(st->u[k], _mm256_loadu_si256((const __m256i *)(y->qs + 32 * k)));
        __m256i p1 = _mm256_maddubs_epi16(st->u[4 + k], _mm256_loadu_si256((const __m256i *)(y->qs + 128 + 32 * k)));
        acc0 = simd_madd_acc(acc0, p0, st->sv[k]);
        acc1 = simd_madd_acc(acc1, p1, st->sv[4 + k]);
    }
    __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), st->sc16);
    *ps = _mm256_sub_epi32(_mm256_add_epi32(acc0, acc1), _mm256_slli_epi32(off, 5));
    *d1 = st->d * simd_f32(&y->d);
    (void)pt; (void)d2;
}

/* ---- iq4_xs: 8 sub-blocks of 32 in q4_0 nibble order, 16 bytes each; scale ls - 32 with ls
 * from 4 bits of scales_l and 2 of scales_h; products by the sign trick ---- */
typedef struct {
    __m256i aw[8]; /* |w| of sub-block ib */
    __m256i sw[8]; /* w (its signs) */
    int32_t ls2[8]; /* ls - 32 in both int16 halves */
    float d;
} simd_st_iq4xs;

SIMD_INLINE void simd_unpack_iq4_xs(const uint8_t *wp, simd_st_iq4xs *st) {
    const block_iq4_xs *x = (const block_iq4_xs *)(const void *)wp;
    uint16_t sh;
    memcpy(&sh, &x->scales_h, 2);
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib++) {
        int ls = ((x->scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((sh >> (2 * ib)) & 3) << 4);
        st->ls2[ib] = (int32_t)((uint32_t)(uint16_t)(ls - 32) * 0x10001u);
        __m256i w = simd_lut_nibbles32(x->qs + 16 * ib, hm_kvalues_iq4nl);
        st->sw[ib] = w;
        st->aw[ib] = _mm256_sign_epi8(w, w);
    }
    st->d = simd_fp16(&x->d);
}

SIMD_INLINE void simd_dot_iq4_xs(const simd_st_iq4xs *st, const uint8_t *ap, __m256i *ps,
                                 __m256i *pt, float *d1, float *d2) {
    const block_q8_K *y = (const block_q8_K *)(const void *)ap;
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    _Pragma("GCC unroll 4")
    for (int ib = 0; ib < 8; ib += 2) {
        __m256i a0 = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * ib));
        __m256i a1 = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * ib + 32));
        __m256i p0 = _mm256_maddubs_epi16(st->aw[ib], _mm256_sign_epi8(a0, st->sw[ib]));
        __m256i p1 = _mm256_maddubs_epi16(st->aw[ib + 1], _mm256_sign_epi8(a1, st->sw[ib + 1]));
        acc0 = simd_madd_acc(acc0, p0, _mm256_set1_epi32(st->ls2[ib]));
        acc1 = simd_madd_acc(acc1, p1, _mm256_set1_epi32(st->ls2[ib + 1]));
    }
    *ps = _mm256_add_epi32(acc0, acc1);
    *d1 = st->d * simd_f32(&y->d);
    (void)pt; (void)d2;
}

#define SIMD_QKA sizeof(block_q8_K)
SIMD_LANE_TILE(simd_dot_q4_K, simd_st_k45, simd_unpack_q4_K, simd_dot_k45, 1, sizeof(block_q4_K), SIMD_QKA, 256)
SIMD_LANE_TILE(simd_dot_q5_K, simd_st_k45, simd_unpack_q5_K, simd_dot_k45, 1, sizeof(block_q5_K), SIMD_QKA, 256)
SIMD_LANE_TILE(simd_dot_q6_K, simd_st_q6, simd_unpack_q6_K, simd_dot_q6_K, 0, sizeof(block_q6_K), SIMD_QKA, 256)
SIMD_LANE_TILE(simd_dot_iq4_xs, simd_st_iq4xs, simd_unpack_iq4_xs, simd_dot_iq4_xs, 0, sizeof(block_iq4_xs), SIMD_QKA, 256)

#endif
