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
 * - Per activation row, the blocks' d and sum are copied once into contiguous arrays (pre_d,
 *   pre_s: one vector load per group instead of 8 scalar ones), shared by the tile's weight rows.
 * - A partial last group runs on zero-padded copies of its blocks; its lanes are blended in.
 * The tile prepares each activation row once and runs all its weight rows over it (the caller
 * keeps the tile's weight rows small enough to stay in cache across its activation rows).
 */
#ifndef HM_QUANT_SIMD_Q32_H
#define HM_QUANT_SIMD_Q32_H

#include "quant/quant_simd_common.h"


enum { SIMD_Q32_SEG = 512, SIMD_Q32_RB = 8 };

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
    *lo = _mm256_or_si256(*lo, _mm256_and_si256(simd_bits32((const uint8_t *)&l), b4));
    *hi = _mm256_or_si256(*hi, _mm256_and_si256(simd_bits32((const uint8_t *)&h), b4));
}

#define SIMD_Y(p) ((const block_q8_32 *)(const void *)(p))

/* ---- per-type integer kernels: pair (blocks x0, x1 with activations y0, y1) or single ---- */

/* ap: the pair's activations as prepared by simd_q32_pre: [lo16 | lo16], [hi16 | hi16] */
#define SIMD_PAIR_FN(NAME, TYPE, BODY)                                                         \
    SIMD_INLINE __m256i NAME(const uint8_t *w0, const uint8_t *w1, const uint8_t *ap) {        \
        const TYPE *x0 = (const TYPE *)(const void *)w0, *x1 = (const TYPE *)(const void *)w1; \
        __m256i alo = _mm256_loadu_si256((const __m256i *)ap);                                 \
        __m256i ahi = _mm256_loadu_si256((const __m256i *)(ap + 32));                          \
        __m256i ulo, uhi;                                                                      \
        BODY                                                                                   \
    }

SIMD_PAIR_FN(simd_pair_q4_0, block_q4_0, {
    simd_pair_nibbles(x0->qs, x1->qs, &ulo, &uhi);
    return simd_dot2_u8(ulo, alo, uhi, ahi);
})
SIMD_PAIR_FN(simd_pair_q4_1, block_q4_1, {
    simd_pair_nibbles(x0->qs, x1->qs, &ulo, &uhi);
    return simd_dot2_u8(ulo, alo, uhi, ahi);
})
SIMD_PAIR_FN(simd_pair_q5_0, block_q5_0, {
    simd_pair_nibbles(x0->qs, x1->qs, &ulo, &uhi);
    simd_pair_qh(x0->qh, x1->qh, &ulo, &uhi);
    return simd_dot2_u8(ulo, alo, uhi, ahi);
})
SIMD_PAIR_FN(simd_pair_q5_1, block_q5_1, {
    simd_pair_nibbles(x0->qs, x1->qs, &ulo, &uhi);
    simd_pair_qh(x0->qh, x1->qh, &ulo, &uhi);
    return simd_dot2_u8(ulo, alo, uhi, ahi);
})
static const int8_t simd_kv_mxfp4_u[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
SIMD_PAIR_FN(simd_pair_mxfp4, block_mxfp4, {
    simd_pair_lut(x0->qs, x1->qs, simd_kv_mxfp4_u, &ulo, &uhi);
    return simd_dot2_u8(ulo, alo, uhi, ahi);
})
#if SIMD_VNNI
/* kvalues_iq4nl + 127 as unsigned bytes */
static const uint8_t simd_kv_iq4nl_u[16] = {0, 23, 44, 62, 78, 92, 105, 117, 128, 140, 152, 165, 180, 196, 216, 240};
SIMD_PAIR_FN(simd_pair_iq4_nl, block_iq4_nl, {
    simd_pair_lut(x0->qs, x1->qs, simd_kv_iq4nl_u, &ulo, &uhi);
    return simd_dot2_u8(ulo, alo, uhi, ahi);
})
#define SIMD_OFF_IQ4NL 127
#else
SIMD_PAIR_FN(simd_pair_iq4_nl, block_iq4_nl, {
    simd_pair_lut(x0->qs, x1->qs, hm_kvalues_iq4nl, &ulo, &uhi);
    return _mm256_add_epi32(simd_dot_s8(ulo, alo), simd_dot_s8(uhi, ahi));
})
#define SIMD_OFF_IQ4NL 0
#endif

/* q8_0: one block per register */
SIMD_INLINE __m256i simd_single_q8_0(const uint8_t *w, const uint8_t *a) {
    __m256i wv = _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)(const void *)w)->qs);
    __m256i av = _mm256_loadu_si256((const __m256i *)SIMD_Y(a)->qs);
#if SIMD_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_xor_si256(wv, _mm256_set1_epi8((char)0x80)), av);
#else
    return simd_dot_s8(wv, av);
#endif
}
#define SIMD_OFF_Q8_0 (SIMD_VNNI ? 128 : 0)

/* ---- weight scales of 8 consecutive blocks ---- */

/* 4 bytes at w + i*wsz + off for i < 8 (one vpgatherdd; every block type has >= 4 bytes there) */
SIMD_INLINE __m256i simd_gather8(const uint8_t *w, size_t wsz, size_t off) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm256_set1_epi32((int)wsz));
    return _mm256_i32gather_epi32((const int *)(const void *)(w + off), idx, 1);
}

SIMD_INLINE __m256 simd_scales_fp16(const uint8_t *w, size_t wsz, size_t off) {
    __m256i v = _mm256_and_si256(simd_gather8(w, wsz, off), _mm256_set1_epi32(0xffff));
    v = _mm256_packus_epi32(v, v); /* [h0..h3 h0..h3 | h4..h7 h4..h7] */
    v = _mm256_permute4x64_epi64(v, 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(v));
}

/* E8M0 halved: 2^(e-128), i.e. bits (e-1) << 23 for e >= 2, 0x00200000 << e below */
SIMD_INLINE __m256 simd_scales_e8m0(const uint8_t *w, size_t wsz, size_t off) {
    __m256i ev = _mm256_and_si256(simd_gather8(w, wsz, off), _mm256_set1_epi32(0xff));
    __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(ev, _mm256_set1_epi32(1)), 23);
    __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), ev);
    __m256i ge2 = _mm256_cmpgt_epi32(ev, _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(small, big, ge2));
}

/* ---- group of 8 blocks -> new accumulator register ---- */

/* PAIRED: INT(w0, w1, ap) on blocks (i, i+4) with the prepared activation pairs at apg; else
 * INT(w, a) per block. OFF: weight offset (ps then holds OFF * sum_a); with HAS_M, the min at
 * byte MOFF of each block multiplies ps (= sum_a). SCALE(w, wsz, DOFF): the 8 block scales. */
#define SIMD_Q32_GROUP(NAME, WSZ, PAIRED, INT, OFF, SCALE, DOFF, HAS_M, MOFF)                 \
    SIMD_INLINE __m256 NAME(const uint8_t *w, const uint8_t *a, const uint8_t *apg,            \
                            const float *pd, const int32_t *ps, __m256 acc) {                  \
        const size_t asz = sizeof(block_q8_32);                                                \
        __m256i s;                                                                             \
        if (PAIRED) {                                                                          \
            __m256i v[4];                                                                      \
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) v[p] =                         \
                SIMD_PAIR_CALL(INT, w + p * (WSZ), w + (p + 4) * (WSZ), apg + 64 * p);         \
            s = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3])); \
        } else {                                                                               \
            __m256i v[8];                                                                      \
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) v[i] =                         \
                SIMD_SINGLE_CALL(INT, w + i * (WSZ), a + i * asz);                             \
            s = simd_hsum8x8(v);                                                               \
        }                                                                                      \
        (void)a; (void)apg;                                                                    \
        __m256i sa = _mm256_loadu_si256((const __m256i *)ps);                                  \
        if (OFF) s = _mm256_sub_epi32(s, sa);                                                  \
        __m256 da = _mm256_loadu_ps(pd);                                                       \
        acc = _mm256_fmadd_ps(_mm256_mul_ps(SCALE(w, (WSZ), (DOFF)), da), _mm256_cvtepi32_ps(s), acc); \
        if (HAS_M)                                                                             \
            acc = _mm256_fmadd_ps(_mm256_mul_ps(simd_scales_fp16(w, (WSZ), (MOFF)), da),       \
                                  _mm256_cvtepi32_ps(sa), acc);                                \
        return acc;                                                                            \
    }
/* the unused branch of SIMD_Q32_GROUP must still compile: route calls by arity */
#define SIMD_PAIR_CALL(INT, w0, w1, ap) INT##_pair(w0, w1, ap)
#define SIMD_SINGLE_CALL(INT, w, a) INT##_single(w, a)

/* Arity adapters: every INT has both forms; the unused one is never called. */
#define SIMD_PAIR_ONLY(INT)                                                                    \
    SIMD_INLINE __m256i INT##_pair(const uint8_t *w0, const uint8_t *w1, const uint8_t *ap) {  \
        return INT(w0, w1, ap);                                                                \
    }                                                                                          \
    SIMD_INLINE __m256i INT##_single(const uint8_t *w, const uint8_t *a) {                     \
        (void)w; (void)a; return _mm256_setzero_si256();                                       \
    }
#define SIMD_SINGLE_ONLY(INT)                                                                  \
    SIMD_INLINE __m256i INT##_pair(const uint8_t *w0, const uint8_t *w1, const uint8_t *ap) {  \
        (void)w0; (void)w1; (void)ap; return _mm256_setzero_si256();                           \
    }                                                                                          \
    SIMD_INLINE __m256i INT##_single(const uint8_t *w, const uint8_t *a) { return INT(w, a); }

/* ---- tile ---- */

/* For n activation blocks: pd = d, ps = mult * sum (zero-padded to a multiple of 8); with
 * apair, the pair layout of each group of 8: for p < 4, 64 bytes [lo16 of block p | lo16 of
 * block p+4] [hi16 of p | hi16 of p+4] (blocks past n are zero). */
static void simd_q32_pre(const uint8_t *a, int64_t n, int32_t mult, float *pd, int32_t *ps,
                         uint8_t *apair) {
    int64_t j = 0;
    for (; j < n; j++) {
        const block_q8_32 *y = SIMD_Y(a + (size_t)j * sizeof(block_q8_32));
        memcpy(&pd[j], &y->d, 4);
        int32_t sum;
        memcpy(&sum, &y->sum, 4);
        ps[j] = sum * mult;
    }
    for (; j & 7; j++) {
        pd[j] = 0.0f;
        ps[j] = 0;
    }
    if (!apair) return;
    for (int64_t g = 0; g < n; g += 8) {
        uint8_t *dst = apair + (size_t)g * 32;
        for (int p = 0; p < 8; p++) {
            uint8_t *d = dst + 64 * (p & 3) + 16 * (p >> 2);
            if (g + p < n) {
                const int8_t *q = SIMD_Y(a + (size_t)(g + p) * sizeof(block_q8_32))->qs;
                memcpy(d, q, 16);
                memcpy(d + 32, q + 16, 16);
            } else {
                memset(d, 0, 16);
                memset(d + 32, 0, 16);
            }
        }
    }
}

/* Row segment: sn blocks of weights ws against activations as (prepared pd/ps/apair) into acc. */
#define SIMD_Q32_ROWSEG(GROUP, WSZ, ws, as, sn, pd, ps, apair, acc)                            \
    do {                                                                                       \
        int64_t b = 0;                                                                         \
        for (; b + 8 <= (sn); b += 8) {                                                        \
            simd_prefetch_w((ws) + (size_t)b * (WSZ), 8 * (WSZ));                              \
            __m256 *ap = &(acc).a[(b >> 3) & 3];                                               \
            *ap = GROUP((ws) + (size_t)b * (WSZ), (as) + (size_t)b * sizeof(block_q8_32),      \
                        (apair) + 32 * b, (pd) + b, (ps) + b, *ap);                            \
        }                                                                                      \
        if (b < (sn)) {                                                                        \
            const int cnt = (int)((sn) - b);                                                   \
            uint8_t wb[8 * (WSZ)], ab[8 * sizeof(block_q8_32)];                                \
            memset(wb, 0, sizeof(wb));                                                         \
            memset(ab, 0, sizeof(ab));                                                         \
            memcpy(wb, (ws) + (size_t)b * (WSZ), (size_t)cnt * (WSZ));                         \
            memcpy(ab, (as) + (size_t)b * sizeof(block_q8_32), (size_t)cnt * sizeof(block_q8_32)); \
            __m256 *ap = &(acc).a[(b >> 3) & 3];                                               \
            __m256 rv = GROUP(wb, ab, (apair) + 32 * b, (pd) + b, (ps) + b, *ap);              \
            *ap = _mm256_blendv_ps(*ap, rv, simd_lane_mask(cnt));                              \
        }                                                                                      \
    } while (0)

/* Rows of up to SIMD_Q32_SEG blocks (k <= 16384): activation c is prepared once and all nr
 * weight rows pass over it. Longer rows go in segments, SIMD_Q32_RB rows at a time. */
#define SIMD_Q32_TILE(NAME, GROUP, WSZ, PAIRED, MULT)                                          \
    static void NAME##_tile(int64_t n, const void *w, size_t w_stride, int nr, const void *act, \
                            size_t act_stride, int nc, float *out, size_t out_stride) {        \
        const int64_t nb = n / 32;                                                             \
        float pd[SIMD_Q32_SEG];                                                                \
        int32_t ps[SIMD_Q32_SEG];                                                              \
        _Alignas(32) uint8_t apair[(PAIRED) ? SIMD_Q32_SEG * 32 : 32];                         \
        uint8_t *apx = (PAIRED) ? apair : NULL;                                                \
        if (nb <= SIMD_Q32_SEG) {                                                              \
            for (int c = 0; c < nc; c++) {                                                     \
                const uint8_t *ac = (const uint8_t *)act + (size_t)c * act_stride;             \
                simd_q32_pre(ac, nb, (MULT), pd, ps, apx);                                     \
                for (int r = 0; r < nr; r++) {                                                 \
                    simd_acc acc;                                                              \
                    simd_acc_zero(&acc);                                                       \
                    SIMD_Q32_ROWSEG(GROUP, WSZ, (const uint8_t *)w + (size_t)r * w_stride, ac, \
                                    nb, pd, ps, apair, acc);                                   \
                    out[(size_t)c * out_stride + (size_t)r] = simd_tree(&acc);                 \
                }                                                                              \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        for (int r0 = 0; r0 < nr; r0 += SIMD_Q32_RB) {                                         \
            const int nrr = nr - r0 < SIMD_Q32_RB ? nr - r0 : SIMD_Q32_RB;                     \
            for (int c = 0; c < nc; c++) {                                                     \
                const uint8_t *ac = (const uint8_t *)act + (size_t)c * act_stride;             \
                simd_acc acc[SIMD_Q32_RB];                                                     \
                for (int rr = 0; rr < nrr; rr++) simd_acc_zero(&acc[rr]);                     \
                for (int64_t s0 = 0; s0 < nb; s0 += SIMD_Q32_SEG) {                            \
                    const int64_t sn = nb - s0 < SIMD_Q32_SEG ? nb - s0 : SIMD_Q32_SEG;        \
                    const uint8_t *as = ac + (size_t)s0 * sizeof(block_q8_32);                 \
                    simd_q32_pre(as, sn, (MULT), pd, ps, apx);                                 \
                    for (int rr = 0; rr < nrr; rr++)                                           \
                        SIMD_Q32_ROWSEG(GROUP, WSZ,                                            \
                                        (const uint8_t *)w + (size_t)(r0 + rr) * w_stride +    \
                                            (size_t)s0 * (WSZ),                                \
                                        as, sn, pd, ps, apair, acc[rr]);                       \
                }                                                                              \
                for (int rr = 0; rr < nrr; rr++)                                               \
                    out[(size_t)c * out_stride + (size_t)(r0 + rr)] = simd_tree(&acc[rr]);     \
            }                                                                                  \
        }                                                                                      \
    }

#define SIMD_Q32_TYPE(T, TYPE, INT, PAIRED, OFF, SCALE, HAS_M)                                 \
    SIMD_Q32_GROUP(simd_group_##T, sizeof(TYPE), PAIRED, INT, OFF, SCALE, 0, HAS_M, 2)         \
    SIMD_Q32_TILE(simd_dot_##T, simd_group_##T, sizeof(TYPE), PAIRED, (OFF) ? (OFF) : 1)

SIMD_PAIR_ONLY(simd_pair_q4_0)
SIMD_PAIR_ONLY(simd_pair_q4_1)
SIMD_PAIR_ONLY(simd_pair_q5_0)
SIMD_PAIR_ONLY(simd_pair_q5_1)
SIMD_PAIR_ONLY(simd_pair_mxfp4)
SIMD_PAIR_ONLY(simd_pair_iq4_nl)
SIMD_SINGLE_ONLY(simd_single_q8_0)

SIMD_Q32_TYPE(q8_0, block_q8_0, simd_single_q8_0, 0, SIMD_OFF_Q8_0, simd_scales_fp16, 0)
SIMD_Q32_TYPE(q4_0, block_q4_0, simd_pair_q4_0, 1, 8, simd_scales_fp16, 0)
SIMD_Q32_TYPE(q5_0, block_q5_0, simd_pair_q5_0, 1, 16, simd_scales_fp16, 0)
SIMD_Q32_TYPE(q4_1, block_q4_1, simd_pair_q4_1, 1, 0, simd_scales_fp16, 1)
SIMD_Q32_TYPE(q5_1, block_q5_1, simd_pair_q5_1, 1, 0, simd_scales_fp16, 1)
SIMD_Q32_TYPE(mxfp4, block_mxfp4, simd_pair_mxfp4, 1, 12, simd_scales_e8m0, 0)
SIMD_Q32_TYPE(iq4_nl, block_iq4_nl, simd_pair_iq4_nl, 1, SIMD_OFF_IQ4NL, simd_scales_fp16, 0)

#endif
