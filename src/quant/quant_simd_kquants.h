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

#include <stddef.h>

#include "quant/quant_simd_k4.h"
#include "quant/quant_simd_lanes.h"

/* acc + pmaddwd(p16, s16) */
SIMD_INLINE __m256i simd_madd_acc(__m256i acc, __m256i p16, __m256i s16) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, p16, s16);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, s16));
#endif
}

/* ggml's get_scale_min_k4 for all 8 sub-blocks at once, in vector registers (no scalar
 * unpacking, no GPR->vector moves). s: the 12 scale bytes; 16 bytes are read (the block goes on).
 * Stores sc2[j] = sc[j] in both int16 halves and returns mn[j] in both int16 of 32-bit lane j.
 * sc2 is then re-read by broadcast loads (see simd_sc2_publish): building the 8 broadcasts in
 * registers costs 8 cross-lane shuffles on port 5 per block, which made q4_K compute-bound. */
SIMD_INLINE __m256i simd_k4_scales(const uint8_t *s, int32_t sc2[8]) {
    const __m256i r = simd_k4_scale_bytes(s); /* [sc0-3 | sc4-7 | mn0-3 | mn4-7] per lane */
    /* lane 0 takes sub-blocks 0-3, lane 1 sub-blocks 4-7: bytes [x, 0, x, 0] per dword */
    const __m256i isc = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                         4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
    _mm256_storeu_si256((__m256i *)sc2, _mm256_shuffle_epi8(r, isc));
    const __m256i imn = _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1,
                                         12, -1, 12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1);
    return _mm256_shuffle_epi8(r, imn);
}

/* Makes the compiler treat sc2 as changed memory, so that its uses stay broadcast loads
 * (vpbroadcastd m32: a load port only) instead of register shuffles. */
#define simd_sc2_publish(sc2) __asm__("" : "+m"(sc2))

/* ---- q4_K / q5_K: 4 chunks of 64 elements; chunk j's 32 bytes hold sub-block 2j in the low
 * nibbles and 2j+1 in the high ones; q5_K's bit 4 of element l of sub-block k is bit k of qh[l] */
typedef struct {
    __m256i u[8];   /* sub-block k's 32 unsigned quants */
    __m256i m2;     /* mn[j] in both int16 of 32-bit lane j */
    int32_t sc2[8]; /* sc[j] in both int16 halves */
} simd_st_k45;

SIMD_INLINE void simd_unpack_k45(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                                 simd_st_k45 *st) {
    st->m2 = simd_k4_scales(scales, st->sc2);
    simd_sc2_publish(st->sc2);
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
#if SIMD_VNNI /* AVX-512BW/VL: vptestmb gives the bits as a mask; bit 4 is clear, so add = or */
            lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(hv, b0), lo, h16);
            hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(hv, b1), hi, h16);
#else
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, b0), b0), h16));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, b1), b1), h16));
#endif
        }
        st->u[2 * j] = lo;
        st->u[2 * j + 1] = hi;
    }
}

SIMD_INLINE void simd_unpack_q4_K(const uint8_t *wp, simd_st_k45 *st) {
    const block_q4_K *x = (const block_q4_K *)(const void *)wp;
    simd_unpack_k45(x->scales, x->qs, NULL, st);
}

SIMD_INLINE void simd_unpack_q5_K(const uint8_t *wp, simd_st_k45 *st) {
    const block_q5_K *x = (const block_q5_K *)(const void *)wp;
    simd_unpack_k45(x->scales, x->qs, x->qh, st);
}

/* s = sum_j sc[j] * sum q*a; t = sum_j mn[j] * (bsums[2j] + bsums[2j+1]) */
SIMD_INLINE void simd_dot_k45(const simd_st_k45 *st, const uint8_t *ap, __m256i *ps, __m256i *pt) {
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
}

/* ---- q6_K: two halves of 128; in half n, ql + 64n, qh + 32n, scales + 8n: elements l, 32+l,
 * 64+l, 96+l (l < 32) take ql[l] low, ql[l+32] low, ql[l] high, ql[l+32] high and bits 0-1,
 * 2-3, 4-5, 6-7 of qh[l]; 16 sub-blocks of 16; s = sum_j sc[j] * sum (q - 32) * a ---- */
typedef struct {
    __m256i u[8];   /* 32 unsigned 6-bit quants (elements 32k..32k+31) */
    __m256i sv[8];  /* the two int16 sub-block scales of those 32 */
    __m256i sc16;   /* the 16 scales as int16 */
} simd_st_q6;

SIMD_INLINE void simd_unpack_q6_K(const uint8_t *wp, simd_st_q6 *st) {
    const block_q6_K *x = (const block_q6_K *)(const void *)wp;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    _Pragma("GCC unroll 2")
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = x->ql + 64 * n;
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
    }
    st->sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    /* sv[j] = [scales[2j] x 8 | scales[2j+1] x 8] (int16): with AVX-512 one vpermw each,
     * else from scalars */
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 8; j++) {
#if SIMD_VNNI
        const __m256i ix = _mm256_set_m128i(_mm_set1_epi16((short)(2 * j + 1)), _mm_set1_epi16((short)(2 * j)));
        st->sv[j] = _mm256_permutexvar_epi16(ix, st->sc16);
#else
        st->sv[j] = _mm256_set_m128i(_mm_set1_epi16(x->scales[2 * j + 1]), _mm_set1_epi16(x->scales[2 * j]));
#endif
    }
}

/* the -32 is folded in: s = sum sc[j] * (sum q*a) - 32 * sum sc[j] * bsums[j] (exact) */
SIMD_INLINE void simd_dot_q6_K(const simd_st_q6 *st, const uint8_t *ap, __m256i *ps, __m256i *pt) {
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
    (void)pt;
}

/* ---- iq4_xs: 8 sub-blocks of 32 in q4_0 nibble order, 16 bytes each; scale ls - 32 with ls
 * from 4 bits of scales_l and 2 of scales_h; products by the sign trick ---- */
typedef struct {
    __m256i aw[8]; /* |w| of sub-block ib */
    __m256i sw[8]; /* w (its signs) */
    int32_t ls2[8]; /* ls - 32 in both int16 halves */
} simd_st_iq4xs;

SIMD_INLINE void simd_unpack_iq4_xs(const uint8_t *wp, simd_st_iq4xs *st) {
    const block_iq4_xs *x = (const block_iq4_xs *)(const void *)wp;
    uint16_t sh;
    uint32_t sl;
    memcpy(&sh, &x->scales_h, 2);
    memcpy(&sl, x->scales_l, 4);
    /* byte ib of ls8: ls of sub-block ib = nibble ib of scales_l | bits 2ib..2ib+1 of scales_h << 4 */
    const uint64_t ls8 = _pdep_u64(sl, 0x0f0f0f0f0f0f0f0fULL) | _pdep_u64(sh, 0x3030303030303030ULL);
    __m256i l32 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)ls8)), _mm256_set1_epi32(32));
    l32 = _mm256_or_si256(_mm256_and_si256(l32, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(l32, 16));
    _mm256_storeu_si256((__m256i *)st->ls2, l32); /* ls - 32 in both int16 halves */
    simd_sc2_publish(st->ls2);
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib++) {
        __m256i w = simd_lut_nibbles32(x->qs + 16 * ib, hm_kvalues_iq4nl);
        st->sw[ib] = w;
        st->aw[ib] = _mm256_sign_epi8(w, w);
    }
}

SIMD_INLINE void simd_dot_iq4_xs(const simd_st_iq4xs *st, const uint8_t *ap, __m256i *ps,
                                 __m256i *pt) {
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
    (void)pt;
}

/* ---- float factors of 8 lanes (SCALE8 of quant_simd_lanes.h) ----
 * q4_K/q5_K/iq4_xs start with their fp16 d (q4_K/q5_K: then dmin), q6_K ends with it; q8_K
 * starts with its float d. Lane i reads the weight block at byte offset wix[i] of w and the
 * activation block at aix[i] of a (8 consecutive blocks of a row, or 4 blocks of 2 rows); masked
 * gathers read only the lanes set in mask (full: all 8), each within its block. */
SIMD_INLINE __m256i simd_kgather(const uint8_t *p, __m256i ix, __m256 mask, int full) {
    if (full) return _mm256_i32gather_epi32((const int *)(const void *)p, ix, 1);
    return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(const void *)p, ix,
                                       _mm256_castps_si256(mask), 1);
}

/* d1 = d * da, d2 = -(dmin * da) */
SIMD_INLINE void simd_scale8_k45(const uint8_t *w, __m256i wix, const uint8_t *a, __m256i aix,
                                 __m256 mask, int full, __m256 *d1, __m256 *d2) {
    const __m256i dd = simd_kgather(w, wix, mask, full); /* d | dmin << 16 */
    const __m256 da = _mm256_castsi256_ps(simd_kgather(a, aix, mask, full));
    const __m256i lo = _mm256_and_si256(dd, _mm256_set1_epi32(0xffff));
    const __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, _mm256_srli_epi32(dd, 16)), 0xd8);
    /* pk: [d0..d3 d4..d7 | dmin0..3 dmin4..7] */
    const __m256 d = _mm256_cvtph_ps(_mm256_castsi256_si128(pk));
    const __m256 dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(pk, 1));
    *d1 = _mm256_mul_ps(d, da);
    *d2 = _mm256_xor_ps(_mm256_mul_ps(dmin, da), _mm256_set1_ps(-0.0f));
}

/* d1 = d * da; d is the fp16 at byte off (HI = 0) or off + 2 (HI = 1) of each block */
SIMD_INLINE void simd_scale8_d16(const uint8_t *w, __m256i wix, size_t off, int hi, const uint8_t *a,
                                 __m256i aix, __m256 mask, int full, __m256 *d1, __m256 *d2) {
    __m256i dd = simd_kgather(w + off, wix, mask, full);
    dd = hi ? _mm256_srli_epi32(dd, 16) : _mm256_and_si256(dd, _mm256_set1_epi32(0xffff));
    const __m256 da = _mm256_castsi256_ps(simd_kgather(a, aix, mask, full));
    dd = _mm256_permute4x64_epi64(_mm256_packus_epi32(dd, dd), 0x08);
    *d1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(dd)), da);
    *d2 = _mm256_setzero_ps();
}

#define SIMD_QKA sizeof(block_q8_K)
#define simd_scale8_q4_K(w, wix, a, aix, mask, full, d1, d2) simd_scale8_k45(w, wix, a, aix, mask, full, d1, d2)
#define simd_scale8_q5_K(w, wix, a, aix, mask, full, d1, d2) simd_scale8_k45(w, wix, a, aix, mask, full, d1, d2)
#define simd_scale8_q6_K(w, wix, a, aix, mask, full, d1, d2) \
    simd_scale8_d16(w, wix, offsetof(block_q6_K, d) - 2, 1, a, aix, mask, full, d1, d2)
#define simd_scale8_iq4_xs(w, wix, a, aix, mask, full, d1, d2) \
    simd_scale8_d16(w, wix, 0, 0, a, aix, mask, full, d1, d2)
SIMD_LANE_TILE(simd_dot_q4_K, simd_st_k45, simd_unpack_q4_K, simd_dot_k45, simd_scale8_q4_K, 1, sizeof(block_q4_K), SIMD_QKA, 256)
SIMD_LANE_TILE(simd_dot_q5_K, simd_st_k45, simd_unpack_q5_K, simd_dot_k45, simd_scale8_q5_K, 1, sizeof(block_q5_K), SIMD_QKA, 256)
SIMD_LANE_TILE(simd_dot_q6_K, simd_st_q6, simd_unpack_q6_K, simd_dot_q6_K, simd_scale8_q6_K, 0, sizeof(block_q6_K), SIMD_QKA, 256)
SIMD_LANE_TILE(simd_dot_iq4_xs, simd_st_iq4xs, simd_unpack_iq4_xs, simd_dot_iq4_xs, simd_scale8_iq4_xs, 0, sizeof(block_iq4_xs), SIMD_QKA, 256)

#endif
