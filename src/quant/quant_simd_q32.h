/* quant_simd_q32.h - internal: dot tiles of the 32-element types (q8_0 q4_0 q5_0 q4_1 q5_1
 * iq4_nl mxfp4) against q8_32 activations. Included by quant_avx2.c / quant_avx512.c.
 *
 * DESIGN: the integer work of a group of 8 consecutive blocks ends as one __m256i of 8 exact
 * block sums; the float work is then one vector step per group (ARITHMETIC.md, as in
 * quant_simd_common.h): acc = fma(dw * da, (float)s, acc) [; acc = fma(m * da, (float)sum_a, acc)].
 * - Weights are turned into UNSIGNED bytes u = w + OFF (q4_0: q, OFF 8; mxfp4: table + 12; with
 *   VNNI also q8_0: w ^ 0x80, OFF 128, and iq4_nl: table + 127) so one vpdpbusd (or pmaddubsw,
 *   where no int16 pair can saturate) does the products; s = sum(u * a) - OFF * sum_a is exact.
 *   Without VNNI, q8_0 and iq4_nl use the sign trick instead (|w| * sign(a, w)).
 * - Nibble types load two blocks per register: [block i half | block i+4 half], so a register
 *   of partials carries 4 for each of two blocks and three phaddd give the 8 sums in order.
 * - Per activation row, the blocks' d and OFF*sum are copied once into contiguous arrays and
 *   the quants into the register layout (pairs or plain 32 bytes): one vector load per group,
 *   shared by all the tile's weight rows.
 * - Weights of a group are unpacked once (8 registers U) and dotted with up to SIMD_Q32_TC
 *   activation rows: batches reuse the unpacking, the matvec (nc = 1) is the same code.
 * - A partial last group (k = 2880: 90 blocks end in 2) is read in place where the type has a
 *   reader for the first cnt blocks (q8_0: plain and masked-gather loads; mxfp4 with VBMI:
 *   masked zmm loads), else from a zero-padded copy (a store-forwarding stall: that tail cost
 *   as much as 3 full groups); the prepared activations are zero-padded, the group's lanes are
 *   blended in. It is prefetched like full groups.
 * - The matvec (one activation row) runs a row function, 4 groups per step (the accumulator
 *   registers stay registers). q8_0 and mxfp4 with VBMI take rows by pairs when their last
 *   group has at most 4 blocks (k = 2880: 2): that group of both rows is one pass (row 0's blocks in
 *   lanes 0-3, row 1's in 4-7, the same per-lane operations), then both trees together.
 * Rows of more than SIMD_Q32_SEG blocks go in segments, one activation row at a time.
 */
#ifndef HM_QUANT_SIMD_Q32_H
#define HM_QUANT_SIMD_Q32_H

#include "quant/quant_simd_common.h"


enum { SIMD_Q32_SEG = 256, SIMD_Q32_RB = 8, SIMD_Q32_TC = 4 };

/* sum u*a over both halves; u <= 31 (or <= 24 for pmaddubsw pairs), so no int16 saturation */
SIMD_INLINE __m256i simd_dot2_u8(__m256i ulo, __m256i alo, __m256i uhi, __m256i ahi) {
#if SIMD_VNNI
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ulo, alo), uhi, ahi);
#else
    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(ulo, alo), _mm256_maddubs_epi16(uhi, ahi));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

/* [q4_0-order nibbles of block x0 (16 bytes at q0) | of x1]: element halves lo and hi */
SIMD_INLINE void simd_pair_nibbles(const uint8_t *q0, const uint8_t *q1, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i w = _mm256_loadu2_m128i((const __m128i *)q1, (const __m128i *)q0);
    *lo = _mm256_and_si256(w, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
}

/* Pair nibbles looked up in a 16-entry byte table: with AVX-512 VBMI one vpermb per half (it
 * ignores the index bits above 4, so no masking), else mask + pshufb. */
SIMD_INLINE void simd_pair_lut(const uint8_t *q0, const uint8_t *q1, const void *table, __m256i *lo,
                               __m256i *hi) {
#if SIMD_VBMI
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    __m256i w = _mm256_loadu2_m128i((const __m128i *)q1, (const __m128i *)q0);
    *lo = _mm256_permutexvar_epi8(w, t);
    *hi = _mm256_permutexvar_epi8(_mm256_srli_epi16(w, 4), t);
#else
    simd_pair_nibbles(q0, q1, lo, hi);
    *lo = simd_lut16(*lo, (const int8_t *)table);
    *hi = simd_lut16(*hi, (const int8_t *)table);
#endif
}

/* q5 high bits of a pair: lo gets bits 0..15 of h0 then of h1, hi bits 16..31 of each */
SIMD_INLINE void simd_pair_qh(const uint8_t *h0p, const uint8_t *h1p, __m256i *lo, __m256i *hi) {
    uint32_t h0, h1;
    memcpy(&h0, h0p, 4);
    memcpy(&h1, h1p, 4);
    uint32_t l = (h0 & 0xffffu) | (h1 << 16), h = (h0 >> 16) | (h1 & 0xffff0000u);
    const __m256i b4 = _mm256_set1_epi8(0x10);
#if SIMD_VNNI /* AVX-512BW/VL: the bits are a byte mask (kmovd + one masked add) */
    *lo = _mm256_mask_add_epi8(*lo, (__mmask32)l, *lo, b4); /* bit 4 is clear: add = or */
    *hi = _mm256_mask_add_epi8(*hi, (__mmask32)h, *hi, b4);
#else
    *lo = _mm256_or_si256(*lo, _mm256_and_si256(simd_bits32((const uint8_t *)&l), b4));
    *hi = _mm256_or_si256(*hi, _mm256_and_si256(simd_bits32((const uint8_t *)&h), b4));
#endif
}

#define SIMD_Y(p) ((const block_q8_32 *)(const void *)(p))

/* ---- per-type unpacking of a group of 8 weight blocks into U[8] ----
 * paired types: U[2p], U[2p+1] = lo and hi halves of blocks (p, p+4); single (q8_0): U[i] = block i */

#define SIMD_UNPACK_PAIRS(NAME, TYPE, PAIR_BODY)                                               \
    SIMD_INLINE void NAME(const uint8_t *w, __m256i U[8]) {                                    \
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {                                  \
            const TYPE *x0 = (const TYPE *)(const void *)(w + p * sizeof(TYPE));               \
            const TYPE *x1 = (const TYPE *)(const void *)(w + (p + 4) * sizeof(TYPE));         \
            __m256i lo, hi;                                                                    \
            PAIR_BODY;                                                                         \
            U[2 * p] = lo;                                                                     \
            U[2 * p + 1] = hi;                                                                 \
        }                                                                                      \
    }

SIMD_UNPACK_PAIRS(simd_unpack_q4_0, block_q4_0, simd_pair_nibbles(x0->qs, x1->qs, &lo, &hi))
SIMD_UNPACK_PAIRS(simd_unpack_q4_1, block_q4_1, simd_pair_nibbles(x0->qs, x1->qs, &lo, &hi))
SIMD_UNPACK_PAIRS(simd_unpack_q5_0, block_q5_0,
                  simd_pair_nibbles(x0->qs, x1->qs, &lo, &hi);
                  simd_pair_qh(x0->qh, x1->qh, &lo, &hi))
SIMD_UNPACK_PAIRS(simd_unpack_q5_1, block_q5_1,
                  simd_pair_nibbles(x0->qs, x1->qs, &lo, &hi);
                  simd_pair_qh(x0->qh, x1->qh, &lo, &hi))
static const int8_t simd_kv_mxfp4_u[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
SIMD_UNPACK_PAIRS(simd_unpack_mxfp4, block_mxfp4, simd_pair_lut(x0->qs, x1->qs, simd_kv_mxfp4_u, &lo, &hi))
#if SIMD_VNNI
/* kvalues_iq4nl + 127 as unsigned bytes */
static const uint8_t simd_kv_iq4nl_u[16] = {0, 23, 44, 62, 78, 92, 105, 117, 128, 140, 152, 165, 180, 196, 216, 240};
SIMD_UNPACK_PAIRS(simd_unpack_iq4_nl, block_iq4_nl, simd_pair_lut(x0->qs, x1->qs, simd_kv_iq4nl_u, &lo, &hi))
#define SIMD_OFF_IQ4NL 127
#define SIMD_SGN_IQ4NL 0
#else
SIMD_UNPACK_PAIRS(simd_unpack_iq4_nl, block_iq4_nl, simd_pair_lut(x0->qs, x1->qs, hm_kvalues_iq4nl, &lo, &hi))
#define SIMD_OFF_IQ4NL 0
#define SIMD_SGN_IQ4NL 1
#endif

/* the first cnt (1..8) blocks of a group; with cnt < 8 (a partial last group) the others'
 * registers are what a zero block gives (their lanes are blended away): no copy of the tail,
 * no read past it */
SIMD_INLINE void simd_unpack_q8_0_n(const uint8_t *w, int cnt, __m256i U[8]) {
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        U[i] = i < cnt ? _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)(const void *)(w + i * sizeof(block_q8_0)))->qs)
                       : _mm256_setzero_si256();
#if SIMD_VNNI
        U[i] = _mm256_xor_si256(U[i], _mm256_set1_epi8((char)0x80));
#endif
    }
}
SIMD_INLINE void simd_unpack_q8_0(const uint8_t *w, __m256i U[8]) { simd_unpack_q8_0_n(w, 8, U); }
#define SIMD_OFF_Q8_0 (SIMD_VNNI ? 128 : 0)
#define SIMD_SGN_Q8_0 (!SIMD_VNNI)


/* ---- weight scales of 8 consecutive blocks ---- */

/* 4 bytes at w + i*wsz + off for i < 8 (one vpgatherdd; every block type has >= 4 bytes there) */
SIMD_INLINE __m256i simd_gather8(const uint8_t *w, size_t wsz, size_t off) {
    return _mm256_i32gather_epi32((const int *)(const void *)(w + off), simd_ix8(wsz), 1);
}

/* simd_gather8 of the first cnt lanes only (the others 0) */
SIMD_INLINE __m256i simd_gather8_n(const uint8_t *w, size_t wsz, size_t off, int cnt) {
    return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(const void *)(w + off), simd_ix8(wsz),
                                       _mm256_castps_si256(simd_lane_mask(cnt)), 1);
}

SIMD_INLINE __m256 simd_fp16x8(__m256i g) {
    __m256i v = _mm256_and_si256(g, _mm256_set1_epi32(0xffff));
    v = _mm256_packus_epi32(v, v); /* [h0..h3 h0..h3 | h4..h7 h4..h7] */
    v = _mm256_permute4x64_epi64(v, 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(v));
}
SIMD_INLINE __m256 simd_scales_fp16_n(const uint8_t *w, size_t wsz, size_t off, int cnt) {
    return simd_fp16x8(simd_gather8_n(w, wsz, off, cnt));
}

SIMD_INLINE __m256 simd_scales_fp16(const uint8_t *w, size_t wsz, size_t off) {
    return simd_fp16x8(simd_gather8(w, wsz, off));
}

/* E8M0 halved: 2^(e-128), i.e. bits (e-1) << 23 for e >= 2, 0x00200000 << e below. With
 * AVX-512 the exponent e-128 itself is returned (SIMD_E8M0_POW2) and simd_q32_finish forms
 * d*da as vscalefps(da, e-128): da * 2^(e-128) rounded once, the same bits as the product. */
#if SIMD_VNNI
#define SIMD_E8M0_POW2 1
SIMD_INLINE __m256 simd_scales_e8m0(const uint8_t *w, size_t wsz, size_t off) {
    __m256i ev = _mm256_and_si256(simd_gather8(w, wsz, off), _mm256_set1_epi32(0xff));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(ev, _mm256_set1_epi32(128)));
}
#else
#define SIMD_E8M0_POW2 0
SIMD_INLINE __m256 simd_scales_e8m0(const uint8_t *w, size_t wsz, size_t off) {
    __m256i ev = _mm256_and_si256(simd_gather8(w, wsz, off), _mm256_set1_epi32(0xff));
    __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(ev, _mm256_set1_epi32(1)), 23);
    __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), ev);
    __m256i ge2 = _mm256_cmpgt_epi32(ev, _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(small, big, ge2));
}
#endif


/* ---- one group against one prepared activation row ---- */

/* the 8 block sums of sum(U * a) (before the offset); ap: the group's prepared activations */
SIMD_INLINE __m256i simd_q32_isum(const __m256i U[8], const uint8_t *ap, int paired, int sgn) {
    if (paired) {
        __m256i v[4];
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            __m256i alo = _mm256_loadu_si256((const __m256i *)(ap + 64 * p));
            __m256i ahi = _mm256_loadu_si256((const __m256i *)(ap + 64 * p + 32));
            v[p] = sgn ? _mm256_add_epi32(simd_dot_s8(U[2 * p], alo), simd_dot_s8(U[2 * p + 1], ahi))
                       : simd_dot2_u8(U[2 * p], alo, U[2 * p + 1], ahi);
        }
        return _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    }
    __m256i v[8];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(ap + 32 * i));
        v[i] = sgn ? simd_dot_s8(U[i], a) : simd_dot_u8(U[i], a);
    }
    return simd_hsum8x8(v);
}

/* the float step: acc = fma(dw * da, (float)(s - OFF*sum_a), acc) [; fma(m * da, (float)sum_a)];
 * pow2: dw holds log2 of the scale (see simd_scales_e8m0) */
SIMD_INLINE __m256 simd_q32_finish_v(__m256i s, __m256 da, __m256i sa, __m256 dw, __m256 dm, int off,
                                     int has_m, int pow2, __m256 acc) {
    if (off) s = _mm256_sub_epi32(s, sa);
#if SIMD_VNNI
    __m256 dd = pow2 ? _mm256_scalef_ps(da, dw) : _mm256_mul_ps(dw, da);
#else
    (void)pow2;
    __m256 dd = _mm256_mul_ps(dw, da);
#endif
    acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), acc);
    if (has_m) acc = _mm256_fmadd_ps(_mm256_mul_ps(dm, da), _mm256_cvtepi32_ps(sa), acc);
    return acc;
}
/* simd_q32_finish_v with the 8 blocks' pd and ps loaded */
SIMD_INLINE __m256 simd_q32_finish(__m256i s, const float *pd, const int32_t *ps, __m256 dw,
                                   __m256 dm, int off, int has_m, int pow2, __m256 acc) {
    return simd_q32_finish_v(s, _mm256_loadu_ps(pd), _mm256_loadu_si256((const __m256i *)ps), dw, dm, off,
                             has_m, pow2, acc);
}

/* a row pair's tail: the 4 blocks' pd and ps at p, once for each row's half of the lanes */
SIMD_INLINE __m256 simd_pair_da(const float *p) { return _mm256_broadcast_ps((const __m128 *)(const void *)p); }
SIMD_INLINE __m256i simd_pair_sa(const int32_t *p) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p));
}

/* q8_0's last cnt (1..4) blocks at b of two rows (w0, w0 + ws) in one pass: lanes 0-3 row 0,
 * 4-7 row 1, as simd_mxfp4_pair_tail (c: the two rows' accumulator lanes side by side); the
 * same per-lane operations as a group of one row (simd_q32_isum, simd_q32_finish). */
SIMD_INLINE __m256 simd_q8_0_pair_tail(const uint8_t *w0, size_t ws, int64_t b, int cnt, const float *pd,
                                       const int32_t *ps, const uint8_t *ap, __m256 c) {
    const size_t wsz = sizeof(block_q8_0);
    const uint8_t *t0 = w0 + (size_t)b * wsz;
    simd_prefetch_w(t0, (size_t)cnt * wsz);
    simd_prefetch_w(t0 + ws, (size_t)cnt * wsz);
    __m256i v[8];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        __m256i u = (i & 3) < cnt ? _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)(const void *)(
                                        t0 + (size_t)(i >> 2) * ws + (size_t)(i & 3) * wsz))->qs)
                                  : _mm256_setzero_si256();
#if SIMD_VNNI
        u = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
#endif
        const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(ap + 32 * (b + (i & 3))));
        v[i] = SIMD_SGN_Q8_0 ? simd_dot_s8(u, a) : simd_dot_u8(u, a);
    }
    __m256i s = simd_hsum8x8(v);
    const __m256 m1 = simd_lane_mask(cnt), m = _mm256_permute2f128_ps(m1, m1, 0x00);
    const __m256 dw = simd_fp16x8(_mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(const void *)t0,
                                                              simd_ix44(wsz, ws),
                                                              _mm256_castps_si256(m), 1));
    const __m256 r = simd_q32_finish_v(s, simd_pair_da(pd + b), simd_pair_sa(ps + b), dw, _mm256_setzero_ps(),
                                       SIMD_OFF_Q8_0, 0, 0, c);
    return _mm256_blendv_ps(c, r, m);
}

/* ---- activation preparation ---- */

/* For n activation blocks at a: pd = d, ps = mult * sum, ap = the quants in register layout:
 * paired (1): per group of 8, for p < 4, 64 bytes [lo16 of block p | lo16 of block p+4]
 * [hi16 of p | hi16 of p+4]; quads (2, the zmm layout of simd_unpack_mxfp4_z): per group, for
 * h < 2, [lo16 of blocks 4h..4h+3][hi16 of blocks 4h..4h+3]; single: the 32 quants of each block. Zero-padded to a multiple
 * of 8 blocks. */
static void simd_q32_pre(const uint8_t *a, int64_t n, int32_t mult, int paired, float *pd,
                         int32_t *ps, uint8_t *ap) {
    const int64_t n8 = (n + 7) & ~(int64_t)7;
    for (int64_t j = 0; j < n8; j++) {
        const block_q8_32 *y = (const block_q8_32 *)(const void *)(a + (size_t)j * sizeof(block_q8_32));
        uint8_t *d = paired == 2 ? ap + (size_t)(j & ~(int64_t)7) * 32 + 128 * ((j >> 2) & 1) + 16 * (j & 3)
                     : paired ? ap + (size_t)(j & ~(int64_t)7) * 32 + 64 * (j & 3) + 16 * ((j >> 2) & 1)
                              : ap + (size_t)j * 32;
        const size_t hi = paired == 2 ? 64 : paired ? 32 : 16;
        if (j < n) {
            memcpy(&pd[j], &y->d, 4);
            int32_t sum;
            memcpy(&sum, &y->sum, 4);
            ps[j] = sum * mult;
            memcpy(d, y->qs, 16);
            memcpy(d + hi, y->qs + 16, 16);
        } else {
            pd[j] = 0.0f;
            ps[j] = 0;
            memset(d, 0, 16);
            memset(d + hi, 0, 16);
        }
    }
}

#if SIMD_VBMI
/* ---- mxfp4 with 512-bit VBMI: a group of 8 blocks (136 bytes) is read by 4 overlapping zmm
 * loads; one vpermt2b per 4 blocks packs their 64 quant bytes, vpermb on a 4x replicated table
 * decodes both nibble halves (it reads the low 6 index bits; the replication makes bits 4-5
 * irrelevant), and one vpermt2b takes the 8 scale bytes. U[2h] / U[2h+1]: elements 0-15 /
 * 16-31 of blocks 4h..4h+3, 16 bytes per block (activations in the "quads" layout).
 * z0..z3: the group's 64-byte loads at w, w + 64, w + 68 and w + 72. */
SIMD_INLINE void simd_unpack_mxfp4_q(__m512i z0, __m512i z1, __m512i z2, __m512i z3, __m512i U[4]) {
    const __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)simd_kv_mxfp4_u));
    /* blocks 0-3: quants at 17i+1+k of z0|z1; blocks 4-7: at 17i+1+k (i = 0..3) of w + 68 */
    const __m512i ix = _mm512_set_epi8(
        67, 66, 65, 64, 63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52,
        50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38, 37, 36, 35,
        33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18,
        16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
    /* z2|z3 as a 128-byte table: byte x < 64 is w[68 + x], byte x >= 64 is w[8 + x]; blocks
     * 4-6 come from z2 (x = 17i + 1 + k), block 7 (w[120..136)) from z3 (x = 112..127) */
    const __m512i ix2 = _mm512_set_epi8(
        127, 126, 125, 124, 123, 122, 121, 120, 119, 118, 117, 116, 115, 114, 113, 112,
        50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38, 37, 36, 35,
        33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18,
        16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
    const __m512i q03 = _mm512_permutex2var_epi8(z0, ix, z1);
    const __m512i q47 = _mm512_permutex2var_epi8(z2, ix2, z3);
    U[0] = _mm512_permutexvar_epi8(q03, t);
    U[1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q03, 4), t);
    U[2] = _mm512_permutexvar_epi8(q47, t);
    U[3] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q47, 4), t);
}

/* the group of 8 blocks at w */
SIMD_INLINE void simd_unpack_mxfp4_z(const uint8_t *w, __m512i U[4]) {
    simd_unpack_mxfp4_q(_mm512_loadu_si512((const void *)w), _mm512_loadu_si512((const void *)(w + 64)),
                        _mm512_loadu_si512((const void *)(w + 68)), _mm512_loadu_si512((const void *)(w + 72)), U);
}

/* 64-byte load at w + o of which only the bytes before w + len are read (the rest 0) */
SIMD_INLINE __m512i simd_load_below(const uint8_t *w, size_t o, size_t len) {
    const __mmask64 m = len <= o ? 0 : len - o >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (len - o)) - 1;
    return _mm512_maskz_loadu_epi8(m, (const void *)(w + o));
}

/* simd_unpack_mxfp4_z of the first cnt (1..7) blocks, read by masked loads (no copy, nothing
 * read past the tail); the other blocks decode as zero blocks (blended away) */
SIMD_INLINE void simd_unpack_mxfp4_zn(const uint8_t *w, int cnt, __m512i U[4]) {
    const size_t len = (size_t)cnt * sizeof(block_mxfp4);
    simd_unpack_mxfp4_q(simd_load_below(w, 0, len), simd_load_below(w, 64, len), simd_load_below(w, 68, len),
                        simd_load_below(w, 72, len), U);
}

/* e - 128 as floats (see simd_scales_e8m0) of the bytes at ix (lanes 0-7, byte indices into
 * the 128-byte table z0|z1) */
SIMD_INLINE __m256 simd_e8m0_z(__m512i z0, __m512i z1, __m512i ix) {
    /* byte 4i <- e_i, other bytes zeroed */
    const __m512i e = _mm512_maskz_permutex2var_epi8(0x1111111111111111ULL, z0, ix, z1);
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm512_castsi512_si256(e), _mm256_set1_epi32(128)));
}
#define SIMD_E8M0_IX _mm512_setr_epi32(0, 17, 34, 51, 68, 85, 102, 119, 0, 0, 0, 0, 0, 0, 0, 0)

/* e - 128 of the 8 blocks as floats (see simd_scales_e8m0); e of block i is byte 17i */
SIMD_INLINE __m256 simd_scales_e8m0_z(const uint8_t *w, size_t wsz, size_t off) {
    (void)wsz; (void)off;
    return simd_e8m0_z(_mm512_loadu_si512((const void *)w), _mm512_loadu_si512((const void *)(w + 64)), SIMD_E8M0_IX);
}

/* the 8 block sums of sum(U[i] * a[i]), activations in the quads layout */
SIMD_INLINE __m256i simd_isum_z4(const __m512i U[4], __m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    const __m512i s03 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), U[0], a0), U[1], a1);
    const __m512i s47 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), U[2], a2), U[3], a3);
    /* lanes 4i..4i+3 of s03|s47 (32 lanes) belong to block i */
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i p = _mm512_add_epi32(_mm512_permutex2var_epi32(s03, ie, s47),
                                       _mm512_permutex2var_epi32(s03, io, s47)); /* block i: 2i, 2i+1 */
    return _mm512_castsi512_si256(_mm512_add_epi32(_mm512_permutexvar_epi32(ie, p), _mm512_permutexvar_epi32(io, p)));
}
/* the 8 block sums of sum(U * a), ap in the quads layout */
SIMD_INLINE __m256i simd_q32_isum_z(const __m512i U[4], const uint8_t *ap, int paired, int sgn) {
    (void)paired; (void)sgn;
    return simd_isum_z4(U, _mm512_loadu_si512((const void *)ap), _mm512_loadu_si512((const void *)(ap + 64)),
                        _mm512_loadu_si512((const void *)(ap + 128)), _mm512_loadu_si512((const void *)(ap + 192)));
}
/* simd_scales_e8m0_z of the first cnt blocks (masked loads; the other lanes are blended away) */
SIMD_INLINE __m256 simd_scales_e8m0_zn(const uint8_t *w, size_t wsz, size_t off, int cnt) {
    (void)wsz; (void)off;
    const size_t len = (size_t)cnt * sizeof(block_mxfp4);
    return simd_e8m0_z(simd_load_below(w, 0, len), simd_load_below(w, 64, len), SIMD_E8M0_IX);
}
/* The last cnt (1..4) blocks at b of two rows (w0 and w0 + ws) in one pass: row 0's blocks in
 * lanes 0..cnt-1, row 1's in lanes 4..4+cnt-1 (simd_unpack_mxfp4_z's blocks 0-3 and 4-7, read
 * by masked loads from the two rows). c holds the two rows' accumulator lanes side by side
 * (lanes 0-3: row 0's register (b/8)%4 lanes 0-3, 4-7: row 1's); each of them gets exactly the
 * update SIMD_Q32_GROUP1 gives it, the others keep theirs. pd, ps, ap: the prepared row. */
SIMD_INLINE __m256 simd_mxfp4_pair_tail(const uint8_t *w0, size_t ws, int64_t b, int cnt, const float *pd,
                                        const int32_t *ps, const uint8_t *ap, __m256 c) {
    const size_t len = (size_t)cnt * sizeof(block_mxfp4);
    const uint8_t *t0 = w0 + (size_t)b * sizeof(block_mxfp4), *t1 = t0 + ws;
    simd_prefetch_w(t0, len);
    simd_prefetch_w(t1, len);
    /* as simd_unpack_mxfp4_z with w = t0 for blocks 0-3 and w + 68 = t1 for blocks 4-7 */
    const __m512i z0 = simd_load_below(t0, 0, len), z2 = simd_load_below(t1, 0, len);
    __m512i U[4];
    simd_unpack_mxfp4_q(z0, simd_load_below(t0, 64, len), z2, simd_load_below(t1, 4, len), U);
    /* both rows against blocks b..b+3 of the activations (quads layout: lo16 x4, hi16 x4) */
    const uint8_t *a = ap + 32 * b;
    const __m512i alo = _mm512_loadu_si512((const void *)a), ahi = _mm512_loadu_si512((const void *)(a + 64));
    const __m256i sum = simd_isum_z4(U, alo, ahi, alo, ahi);
    /* e of row 0's blocks at bytes 17i of z0, of row 1's at bytes 17i of z2 */
    const __m256 dw = simd_e8m0_z(z0, z2, _mm512_setr_epi32(0, 17, 34, 51, 64, 81, 98, 115, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m256 r = simd_q32_finish_v(sum, simd_pair_da(pd + b), simd_pair_sa(ps + b), dw, _mm256_setzero_ps(), 1,
                                       0, SIMD_E8M0_POW2, c);
    const __m256 m1 = simd_lane_mask(cnt);
    return _mm256_blendv_ps(c, r, _mm256_permute2f128_ps(m1, m1, 0x00));
}
#define SIMD_Q32_PAIR_MXFP4(w0, ws, b, cnt, pd, ps, ap, c) simd_mxfp4_pair_tail(w0, ws, b, cnt, pd, ps, ap, c)
#endif

/* ---- tile ---- */

/* One weight row segment ws of sn blocks against tcn prepared activation rows (pd[t], ps[t],
 * ap[t]) into acc[t]; lanes of a block start at a multiple of 32 blocks. */
/* The group of cnt blocks at wg (full: cnt == 8) into U and its scales dw: a full group
 * prefetched, a partial one read in place (NTAIL: UNPACKN/SCALEN of cnt blocks) or through the
 * zero-padded copy wb (wg then points at wb). */
#define SIMD_Q32_LOADGROUP(WSZ, UNPACK, SCALE, NTAIL, UNPACKN, SCALEN, wg, cnt, full, wb, U, dw)   \
    do {                                                                                       \
        if (full) {                                                                            \
            simd_prefetch_w(wg, 8 * (WSZ));                                                    \
            UNPACK(wg, U);                                                                     \
            dw = SCALE(wg, (WSZ), 0);                                                          \
        } else if (NTAIL) {                                                                    \
            simd_prefetch_w(wg, (size_t)(cnt) * (WSZ));                                        \
            UNPACKN(wg, (cnt), U);                                                             \
            dw = SCALEN(wg, (WSZ), 0, (cnt));                                                  \
        } else {                                                                               \
            memset(wb, 0, sizeof(wb));                                                         \
            memcpy(wb, wg, (size_t)(cnt) * (WSZ));                                             \
            wg = wb;                                                                           \
            UNPACK(wg, U);                                                                     \
            dw = SCALE(wg, (WSZ), 0);                                                          \
        }                                                                                      \
    } while (0)

#define SIMD_Q32_ROWSEG(WSZ, UDECL, UNPACK, ISUM, PAIRED, SGN, OFF, SCALE, HAS_M, POW2, NTAIL, UNPACKN, SCALEN, ws, sn, tcn, pd, ps, ap, acc) \
    do {                                                                                       \
        int64_t b = 0;                                                                         \
        for (; b < (sn); b += 8) {                                                             \
            const int cnt = (sn) - b < 8 ? (int)((sn) - b) : 8;                                \
            const uint8_t *wg = (ws) + (size_t)b * (WSZ);                                      \
            uint8_t wb[8 * (WSZ)];                                                             \
            UDECL;                                                                             \
            __m256 dw;                                                                         \
            SIMD_Q32_LOADGROUP(WSZ, UNPACK, SCALE, NTAIL, UNPACKN, SCALEN, wg, cnt, cnt == 8, wb, U, dw); \
            const __m256 dm = (HAS_M) ? simd_scales_fp16(wg, (WSZ), 2) : _mm256_setzero_ps();   \
            const int l = (int)((b >> 3) & 3);                                                 \
            for (int t = 0; t < (tcn); t++) {                                                  \
                __m256i s = ISUM(U, (ap)[t] + 32 * b, (PAIRED), (SGN));                        \
                __m256 rv_ = simd_q32_finish(s, (pd)[t] + b, (ps)[t] + b, dw, dm, (OFF), (HAS_M), (POW2), \
                                           (acc)[t].a[l]);                                     \
                (acc)[t].a[l] = cnt == 8 ? rv_ : _mm256_blendv_ps((acc)[t].a[l], rv_, simd_lane_mask(cnt)); \
            }                                                                                  \
        }                                                                                      \
    } while (0)

/* One group of CNT blocks at b of row wr against one prepared activation row into the
 * accumulator register A (lanes b%32..): the matvec path, unrolled by the caller so that A is a
 * register (FULL: CNT == 8 at compile time). Same operations as SIMD_Q32_ROWSEG. */
#define SIMD_Q32_GROUP1(WSZ, UDECL, UNPACK, ISUM, PAIRED, SGN, OFF, SCALE, HAS_M, POW2, NTAIL, UNPACKN, SCALEN, wr, b, CNT, FULL, pd, ps, ap, A) \
    do {                                                                                       \
        const uint8_t *wg = (wr) + (size_t)(b) * (WSZ);                                        \
        uint8_t wb[8 * (WSZ)];                                                                 \
        UDECL;                                                                                 \
        __m256 dw;                                                                             \
        SIMD_Q32_LOADGROUP(WSZ, UNPACK, SCALE, NTAIL, UNPACKN, SCALEN, wg, CNT, FULL, wb, U, dw); \
        const __m256 dm = (HAS_M) ? simd_scales_fp16(wg, (WSZ), 2) : _mm256_setzero_ps();       \
        __m256i s_ = ISUM(U, (ap) + 32 * (b), (PAIRED), (SGN));                                \
        __m256 rv_ = simd_q32_finish(s_, (pd) + (b), (ps) + (b), dw, dm, (OFF), (HAS_M), (POW2), (A)); \
        (A) = (FULL) ? rv_ : _mm256_blendv_ps((A), rv_, simd_lane_mask(CNT));                  \
    } while (0)

#define SIMD_Q32_TILE(NAME, WSZ, UDECL, UNPACK, ISUM, PAIRED, SGN, OFF, SCALE, HAS_M, POW2, NTAIL, UNPACKN, SCALEN, PAIR, PAIRT) \
    /* one row of nb blocks against one prepared activation row: 4 groups per step, so each  \
     * accumulator register is fixed and stays in a register */                               \
    SIMD_INLINE void NAME##_groups(const uint8_t *wr, int64_t nb, int tail, const float *pd,   \
                                   const int32_t *ps, const uint8_t *ap, simd_acc *accp) {     \
        simd_acc acc = *accp;                                                                  \
        int64_t b = 0;                                                                         \
        for (; b + 32 <= nb; b += 32) {                                                        \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)                                \
                SIMD_Q32_GROUP1(WSZ, UDECL, UNPACK, ISUM, PAIRED, SGN, OFF, SCALE, HAS_M, POW2, NTAIL, UNPACKN, SCALEN, \
                                wr, b + 8 * j, 8, 1, pd, ps, ap, acc.a[j]);                    \
        }                                                                                      \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                  \
            if (b + 8 <= nb) {                                                                 \
                SIMD_Q32_GROUP1(WSZ, UDECL, UNPACK, ISUM, PAIRED, SGN, OFF, SCALE, HAS_M, POW2, NTAIL, UNPACKN, SCALEN, \
                                wr, b, 8, 1, pd, ps, ap, acc.a[j]);                            \
                b += 8;                                                                        \
            } else {                                                                           \
                if (b < nb && tail)                                                            \
                    SIMD_Q32_GROUP1(WSZ, UDECL, UNPACK, ISUM, PAIRED, SGN, OFF, SCALE, HAS_M, POW2, NTAIL, UNPACKN, SCALEN, \
                                    wr, b, (int)(nb - b), 0, pd, ps, ap, acc.a[j]);            \
                break;                                                                         \
            }                                                                                  \
        }                                                                                      \
        *accp = acc;                                                                           \
    }                                                                                          \
    static float NAME##_row1(const uint8_t *wr, int64_t nb, const float *pd, const int32_t *ps, \
                             const uint8_t *ap) {                                               \
        simd_acc acc;                                                                          \
        simd_acc_zero(&acc);                                                                   \
        NAME##_groups(wr, nb, 1, pd, ps, ap, &acc);                                            \
        return simd_tree(&acc);                                                                \
    }                                                                                          \
    /* two rows whose last group has <= 4 blocks: that group of both in one pass (PAIRT), then \
     * both trees together (simd_tree2_*: the same additions as simd_tree) */                  \
    static void NAME##_row2(const uint8_t *w0, size_t ws, int64_t nb, const float *pd,         \
                            const int32_t *ps, const uint8_t *ap, float *out) {                \
        simd_acc acc0, acc1;                                                                   \
        simd_acc_zero(&acc0);                                                                  \
        simd_acc_zero(&acc1);                                                                  \
        NAME##_groups(w0, nb, 0, pd, ps, ap, &acc0);                                           \
        NAME##_groups(w0 + ws, nb, 0, pd, ps, ap, &acc1);                                      \
        const int64_t b = nb & ~(int64_t)7;                                                    \
        const int l = (int)((b >> 3) & 3);                                                     \
        __m256 c = _mm256_permute2f128_ps(acc0.a[l], acc1.a[l], 0x20);                         \
        c = PAIRT(w0, ws, b, (int)(nb - b), pd, ps, ap, c);                                    \
        acc0.a[l] = _mm256_blend_ps(acc0.a[l], c, 0x0f);                                       \
        acc1.a[l] = _mm256_blend_ps(acc1.a[l], _mm256_permute2f128_ps(c, c, 0x11), 0x0f);      \
        simd_tree2_tail(simd_tree2_s4(&acc0, &acc1), out);                                     \
    }                                                                                          \
    static void NAME##_tile(int64_t n, const void *w, size_t w_stride, int nr, const void *act, \
                            size_t act_stride, int nc, float *out, size_t out_stride) {        \
        enum { TC = SIMD_Q32_TC, SEG = SIMD_Q32_SEG };                                         \
        const int64_t nb = n / 32;                                                             \
        const int32_t mult = (OFF) ? (OFF) : 1;                                                \
        float pd[TC][SEG];                                                                     \
        int32_t ps[TC][SEG];                                                                   \
        _Alignas(32) uint8_t ap[TC][SEG * 32];                                                 \
        const uint8_t *wp = (const uint8_t *)w, *xp = (const uint8_t *)act;                    \
        if (nb <= SEG) { /* tokens in groups of TC; all rows over each group */                \
            for (int c0 = 0; c0 < nc; c0 += TC) {                                              \
                const int tcn = nc - c0 < TC ? nc - c0 : TC;                                   \
                for (int t = 0; t < tcn; t++)                                                  \
                    simd_q32_pre(xp + (size_t)(c0 + t) * act_stride, nb, mult, (PAIRED), pd[t], \
                                 ps[t], ap[t]);                                                \
                if (tcn == 1) { /* the matvec */                                               \
                    int r = 0;                                                                 \
                    if ((PAIR) && (nb & 7) != 0 && (nb & 7) <= 4) /* a short tail: row pairs */ \
                        for (; r + 2 <= nr; r += 2)                                            \
                            NAME##_row2(wp + (size_t)r * w_stride, w_stride, nb, pd[0], ps[0], ap[0], \
                                        out + (size_t)c0 * out_stride + (size_t)r);            \
                    for (; r < nr; r++)                                                        \
                        out[(size_t)c0 * out_stride + (size_t)r] =                             \
                            NAME##_row1(wp + (size_t)r * w_stride, nb, pd[0], ps[0], ap[0]);   \
                    continue;                                                                  \
                }                                                                              \
                for (int r = 0; r < nr; r++) {                                                 \
                    simd_acc acc[TC];                                                          \
                    for (int t = 0; t < tcn; t++) simd_acc_zero(&acc[t]);                      \
                    SIMD_Q32_ROWSEG(WSZ, UDECL, UNPACK, ISUM, PAIRED, SGN, OFF, SCALE, HAS_M, POW2, NTAIL, UNPACKN, SCALEN, \
                                    wp + (size_t)r * w_stride, nb, tcn, pd, ps, ap, acc);      \
                    for (int t = 0; t < tcn; t++)                                              \
                        out[(size_t)(c0 + t) * out_stride + (size_t)r] = simd_tree(&acc[t]);   \
                }                                                                              \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        /* long rows: segments of SEG blocks, one token and SIMD_Q32_RB rows at a time */      \
        for (int r0 = 0; r0 < nr; r0 += SIMD_Q32_RB) {                                         \
            const int nrr = nr - r0 < SIMD_Q32_RB ? nr - r0 : SIMD_Q32_RB;                     \
            for (int c = 0; c < nc; c++) {                                                     \
                simd_acc acc[SIMD_Q32_RB];                                                     \
                for (int rr = 0; rr < nrr; rr++) simd_acc_zero(&acc[rr]);                      \
                for (int64_t s0 = 0; s0 < nb; s0 += SEG) {                                     \
                    const int64_t sn = nb - s0 < SEG ? nb - s0 : SEG;                          \
                    simd_q32_pre(xp + (size_t)c * act_stride + (size_t)s0 * sizeof(block_q8_32), \
                                 sn, mult, (PAIRED), pd[0], ps[0], ap[0]);                     \
                    for (int rr = 0; rr < nrr; rr++)                                           \
                        SIMD_Q32_ROWSEG(WSZ, UDECL, UNPACK, ISUM, PAIRED, SGN, OFF, SCALE, HAS_M, POW2, NTAIL, UNPACKN, SCALEN, \
                                        wp + (size_t)(r0 + rr) * w_stride + (size_t)s0 * (WSZ), \
                                        sn, 1, pd, ps, ap, (&acc[rr]));                        \
                }                                                                              \
                for (int rr = 0; rr < nrr; rr++)                                               \
                    out[(size_t)c * out_stride + (size_t)(r0 + rr)] = simd_tree(&acc[rr]);     \
            }                                                                                  \
        }                                                                                      \
    }

/* types without a partial-group reader (NTAIL 0) take the zero-padded copy */
#define SIMD_Q32_NO_UNPACKN(w, cnt, U) ((void)(w), (void)(cnt))
#define SIMD_Q32_NO_SCALEN(w, wsz, off, cnt) ((void)(w), (void)(cnt), _mm256_setzero_ps())
#define SIMD_Q32_NO_PAIRT(w0, ws, b, cnt, pd, ps, ap, c) ((void)(w0), (void)(b), (c))
#define SIMD_Q32_TYPE(T, TYPE, PAIRED, SGN, OFF, SCALE, HAS_M, POW2)                           \
    SIMD_Q32_TILE(simd_dot_##T, sizeof(TYPE), __m256i U[8], simd_unpack_##T, simd_q32_isum, PAIRED, SGN, \
                  OFF, SCALE, HAS_M, POW2, 0, SIMD_Q32_NO_UNPACKN, SIMD_Q32_NO_SCALEN, 0, SIMD_Q32_NO_PAIRT)

SIMD_Q32_TILE(simd_dot_q8_0, sizeof(block_q8_0), __m256i U[8], simd_unpack_q8_0, simd_q32_isum, 0, SIMD_SGN_Q8_0,
              SIMD_OFF_Q8_0, simd_scales_fp16, 0, 0, 1, simd_unpack_q8_0_n, simd_scales_fp16_n, 1, simd_q8_0_pair_tail)
SIMD_Q32_TYPE(q4_0, block_q4_0, 1, 0, 8, simd_scales_fp16, 0, 0)
SIMD_Q32_TYPE(q5_0, block_q5_0, 1, 0, 16, simd_scales_fp16, 0, 0)
SIMD_Q32_TYPE(q4_1, block_q4_1, 1, 0, 0, simd_scales_fp16, 1, 0)
SIMD_Q32_TYPE(q5_1, block_q5_1, 1, 0, 0, simd_scales_fp16, 1, 0)
#if SIMD_VBMI
SIMD_Q32_TILE(simd_dot_mxfp4, sizeof(block_mxfp4), __m512i U[4], simd_unpack_mxfp4_z, simd_q32_isum_z, 2, 0,
              12, simd_scales_e8m0_z, 0, SIMD_E8M0_POW2, 1, simd_unpack_mxfp4_zn, simd_scales_e8m0_zn, 1,
              SIMD_Q32_PAIR_MXFP4)
#else
SIMD_Q32_TYPE(mxfp4, block_mxfp4, 1, 0, 12, simd_scales_e8m0, 0, SIMD_E8M0_POW2)
#endif
SIMD_Q32_TYPE(iq4_nl, block_iq4_nl, 1, SIMD_SGN_IQ4NL, SIMD_OFF_IQ4NL, simd_scales_fp16, 0, 0)

#endif
