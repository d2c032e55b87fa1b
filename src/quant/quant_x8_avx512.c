/* quant_x8_avx512.c - the AVX-512 kernel of quant_x8.h: 8 repacked q4_K rows against one q8_K
 * activation row (layout in quant_x8.c). CMake gives this file the AVX-512 F/BW/VL/DQ/VNNI
 * flags; the kernel adds VBMI (vpermt2b, the scale transpose) by a target attribute (GCC and
 * clang). The caller checks the CPU (quant_x8_fast).
 *
 * Per block of the 8 rows: each (chunk j, part m) register of quants gives two vpdpbusd, low
 * nibbles against 8 bytes of sub-block 2j's activation and high nibbles against 2j + 1's (each
 * a 64-bit broadcast), into 32-bit lanes 2r + h that stay below 2^15; vpdpwssd then scales them
 * by the row's sub-block scale (as the int16 pair (sc, 0): the lane's low half is its whole
 * value), so lanes 2r and 2r + 1 sum to row r's s. t is the rows' mins against
 * bsums[2j] + bsums[2j + 1] by pmaddwd.
 * The float part is the reference's per row, with the rows in the 8 lanes of a register:
 * acc[b % 32] = fma(d * da, s, acc), then fma(-(dmin * da), t, acc); then the halving tree
 * across the 32 registers.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/quant_simd_k4.h"

int quant_x8_avx512_built(void);
void quant_x8_dot_q4_K_avx512(int64_t nb, const void *group, const void *act, float out[8]);
void quant_x8_dot_q6_K_avx512(int64_t nb, const void *group, const void *act, float out[8]);

int quant_x8_avx512_built(void) { return 1; }

#ifndef X8_PF
#define X8_PF 4096 /* bytes of the weight stream prefetched ahead (build flag for A/B) */
#endif
#ifndef X8_PF_HINT
#define X8_PF_HINT _MM_HINT_T0 /* build flag for A/B */
#endif
enum { X8_GROUP_BLOCK = 1152 };

/* [sc0-7 | mn0-7] (bytes) of one row's 12 scale bytes. s + 12 .. s + 15 are read and ignored
 * (the next row's scales, or the quants that follow the last row's). */
static inline __m128i x8_scale_bytes(const uint8_t *s) {
    return _mm256_castsi256_si128(simd_k4_scale_bytes(s));
}

/* sub-block j's scale of rows 0-7, each twice (lanes 2r and 2r + 1) */
#define X8_R8(j) j, j, 16 + j, 16 + j, 32 + j, 32 + j, 48 + j, 48 + j, 64 + j, 64 + j, 80 + j, \
                 80 + j, 96 + j, 96 + j, 112 + j, 112 + j
#define X8_M8(r) 16 * r + 8, 16 * r + 9, 16 * r + 10, 16 * r + 11, 16 * r + 12, 16 * r + 13, \
                 16 * r + 14, 16 * r + 15
static const uint8_t k_isc[2][64] __attribute__((aligned(64))) = {
    {X8_R8(0), X8_R8(1), X8_R8(2), X8_R8(3)}, {X8_R8(4), X8_R8(5), X8_R8(6), X8_R8(7)}};
static const uint8_t k_imn[64] __attribute__((aligned(64))) = {
    X8_M8(0), X8_M8(1), X8_M8(2), X8_M8(3), X8_M8(4), X8_M8(5), X8_M8(6), X8_M8(7)};

__attribute__((target("avx512vbmi")))
void quant_x8_dot_q4_K_avx512(int64_t nb, const void *group, const void *act, float out[8]) {
    __m256 acc[32];
    for (int i = 0; i < 32; i++) acc[i] = _mm256_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i isc0 = _mm512_load_si512(k_isc[0]), isc1 = _mm512_load_si512(k_isc[1]);
    const __m512i imn = _mm512_load_si512(k_imn);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = (const uint8_t *)group + (size_t)b * X8_GROUP_BLOCK;
        const block_q8_K *a = (const block_q8_K *)act + b;
        const uint8_t *qs = g + 32 + 96;
        /* the weight stream X8_PF bytes ahead: a core alone does not keep enough misses in
         * flight (as for the dot tiles, quant_simd_common.h) */
        for (int o = 0; o < X8_GROUP_BLOCK; o += 64) _mm_prefetch((const char *)g + X8_PF + o, X8_PF_HINT);
        /* the rows' scale bytes: 16 per row (sc0-7 mn0-7), rows 0-3 in T0 and 4-7 in T1; then
         * sub-block jj's scales as dwords (sc, 0) in lanes 2r and 2r + 1, and the mins as [r][j]
         * bytes */
        /* built in registers: a store and a wider reload here cannot be forwarded, and would
         * hold the scales (and the block's sums) until the loads before them retire, tying the
         * arithmetic to the weights' memory latency */
        const __m512i T0 = _mm512_inserti32x4(
            _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(x8_scale_bytes(g + 32)),
                                                  x8_scale_bytes(g + 44), 1),
                               x8_scale_bytes(g + 56), 2),
            x8_scale_bytes(g + 68), 3);
        const __m512i T1 = _mm512_inserti32x4(
            _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(x8_scale_bytes(g + 80)),
                                                  x8_scale_bytes(g + 92), 1),
                               x8_scale_bytes(g + 104), 2),
            x8_scale_bytes(g + 116), 3);
        const __m512i SCa = _mm512_permutex2var_epi8(T0, isc0, T1);
        const __m512i SCb = _mm512_permutex2var_epi8(T0, isc1, T1);
        const __m512i MN = _mm512_permutex2var_epi8(T0, imn, T1);
        __m512i sc[8];
        sc[0] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(SCa, 0));
        sc[1] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(SCa, 1));
        sc[2] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(SCa, 2));
        sc[3] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(SCa, 3));
        sc[4] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(SCb, 0));
        sc[5] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(SCb, 1));
        sc[6] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(SCb, 2));
        sc[7] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(SCb, 3));
        __m512i sacc = _mm512_setzero_si512();
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) {
            __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
            _Pragma("GCC unroll 4")
            for (int m = 0; m < 4; m++) {
                const __m512i q = _mm512_loadu_si512(qs + 256 * j + 64 * m);
                int64_t a0, a1; /* elements 8m.. of sub-blocks 2j and 2j + 1 */
                memcpy(&a0, a->qs + 64 * j + 8 * m, 8);
                memcpy(&a1, a->qs + 64 * j + 32 + 8 * m, 8);
                lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(q, m4), _mm512_set1_epi64(a0));
                hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4),
                                         _mm512_set1_epi64(a1));
            }
            sacc = _mm512_dpwssd_epi32(sacc, lo, sc[2 * j]);
            sacc = _mm512_dpwssd_epi32(sacc, hi, sc[2 * j + 1]);
        }
        /* row r: lanes 2r + 2r + 1 */
        const __m256i s = _mm512_cvtepi64_epi32(_mm512_add_epi32(sacc, _mm512_srli_epi64(sacc, 32)));
        /* t: row r's mins . bs2 as pmaddwd pairs (rows 0-3 in pa, 4-7 in pb, one 128-bit lane
         * per row), summed within the lane; bs2[j] = bsums[2j] + bsums[2j + 1] */
        const __m256i bsum = _mm256_loadu_si256((const __m256i *)a->bsums);
        const __m256i bs32 = _mm256_madd_epi16(bsum, _mm256_set1_epi16(1));
        const __m512i bs = _mm512_broadcast_i32x4(_mm256_cvtepi32_epi16(bs32));
        const __m512i pa = _mm512_madd_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(MN)), bs);
        const __m512i pb = _mm512_madd_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(MN, 1)), bs);
        __m512i h = _mm512_add_epi32(_mm512_unpacklo_epi32(pa, pb), _mm512_unpackhi_epi32(pa, pb));
        h = _mm512_add_epi32(h, _mm512_shuffle_epi32(h, 0x4e)); /* lane r: [t_r, t_r+4, ..] */
        const __m256i t = _mm512_castsi512_si256(_mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), h));
        const __m256 vda = _mm256_set1_ps(a->d);
        const __m256 d1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g)), vda);
        const __m256 d2 = _mm256_xor_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16))), vda),
                                        _mm256_set1_ps(-0.0f));
        __m256 *ac = &acc[b % 32];
        *ac = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(s), *ac);
        *ac = _mm256_fmadd_ps(d2, _mm256_cvtepi32_ps(t), *ac);
    }
    for (int st = 16; st >= 1; st /= 2)
        for (int i = 0; i < st; i++) acc[i] = _mm256_add_ps(acc[i], acc[i + st]);
    _mm256_storeu_ps(out, acc[0]);
}

/* ---- q6_K: per (half n, part m) three registers (ql a, ql b, qh) give the 6-bit quants of the
 * four quarters g of 8 bytes per row; each quarter's vpdpbusd against its 8 activation bytes
 * gives lanes below 2^15 (4 x 63 x 127), scaled at once by sub-block 8n + 2g + m / 2's int8
 * scale (as the int16 pair (sc, 0)); the -32 of every quant is folded in as
 * 32 x sum_j sc[j] x bsums[j] (the same exact integer as the reference's sum). ---- */

/* sub-block j's scale of rows 0-7, each twice, from the 128 scale bytes ([r][16]) */
#define X8_S6(j) j, j, 16 + j, 16 + j, 32 + j, 32 + j, 48 + j, 48 + j, 64 + j, 64 + j, 80 + j, \
                 80 + j, 96 + j, 96 + j, 112 + j, 112 + j
static const uint8_t k_is6[4][64] __attribute__((aligned(64))) = {
    {X8_S6(0), X8_S6(1), X8_S6(2), X8_S6(3)}, {X8_S6(4), X8_S6(5), X8_S6(6), X8_S6(7)},
    {X8_S6(8), X8_S6(9), X8_S6(10), X8_S6(11)}, {X8_S6(12), X8_S6(13), X8_S6(14), X8_S6(15)}};

__attribute__((target("avx512vbmi")))
void quant_x8_dot_q6_K_avx512(int64_t nb, const void *group, const void *act, float out[8]) {
    __m256 acc[32];
    for (int i = 0; i < 32; i++) acc[i] = _mm256_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i word = _mm512_set1_epi32(0xffff);
    enum { G6 = 1680 };
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = (const uint8_t *)group + (size_t)b * G6;
        const block_q8_K *a = (const block_q8_K *)act + b;
        for (int o = 0; o < G6; o += 64) _mm_prefetch((const char *)g + X8_PF + o, X8_PF_HINT);
        const uint8_t *ql = g + 16 + 128, *qh = ql + 1024;
        const __m512i S0 = _mm512_loadu_si512(g + 16), S1 = _mm512_loadu_si512(g + 80);
        __m512i sc[16]; /* dwords (sc, 0): the int8 scale sign-extended to 16 bits */
        for (int q = 0; q < 4; q++) {
            const __m512i t = _mm512_permutex2var_epi8(S0, _mm512_load_si512(k_is6[q]), S1);
            sc[4 * q] = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm512_castsi512_si128(t)), word);
            sc[4 * q + 1] = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(t, 1)), word);
            sc[4 * q + 2] = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(t, 2)), word);
            sc[4 * q + 3] = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(t, 3)), word);
        }
        __m512i sacc = _mm512_setzero_si512();
        _Pragma("GCC unroll 2")
        for (int n = 0; n < 2; n++) {
            _Pragma("GCC unroll 4")
            for (int m = 0; m < 4; m++) {
                const __m512i la = _mm512_loadu_si512(ql + 512 * n + 128 * m);
                const __m512i lb = _mm512_loadu_si512(ql + 512 * n + 128 * m + 64);
                const __m512i h = _mm512_loadu_si512(qh + 256 * n + 64 * m);
                __m512i q[4];
                q[0] = _mm512_or_si512(_mm512_and_si512(la, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
                q[1] = _mm512_or_si512(_mm512_and_si512(lb, m4), _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
                q[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(la, 4), m4), _mm512_and_si512(h, m30));
                q[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lb, 4), m4),
                                       _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
                for (int q4 = 0; q4 < 4; q4++) {
                    int64_t av;
                    memcpy(&av, a->qs + 128 * n + 32 * q4 + 8 * m, 8);
                    const __m512i v = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[q4], _mm512_set1_epi64(av));
                    sacc = _mm512_dpwssd_epi32(sacc, v, sc[8 * n + 2 * q4 + m / 2]);
                }
            }
        }
        __m256i s = _mm512_cvtepi64_epi32(_mm512_add_epi32(sacc, _mm512_srli_epi64(sacc, 32)));
        /* off_r = sum_j sc[r][j] * bsums[j]: the scales as int16 [r][16] against the bsums */
        const __m512i bs = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)a->bsums));
        const __m512i p01 = _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm512_castsi512_si256(S0)), bs);
        const __m512i p23 = _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(S0, 1)), bs);
        const __m512i p45 = _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm512_castsi512_si256(S1)), bs);
        const __m512i p67 = _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(S1, 1)), bs);
        /* each pXY: rows X and Y, 8 dwords each (256-bit halves); sum the 8 of every row, in
         * registers (stored and reloaded wider, they would wait for the weight loads) */
        const __m512i pr[4] = {p01, p23, p45, p67};
        __m128i rr[4]; /* low 64 bits: rows 2i, 2i + 1 */
        for (int i = 0; i < 4; i++) {
            const __m256i lo = _mm512_castsi512_si256(pr[i]), hi = _mm512_extracti64x4_epi64(pr[i], 1);
            __m128i x = _mm_add_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
            __m128i y = _mm_add_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
            x = _mm_hadd_epi32(x, y); /* x0+x1 x2+x3 y0+y1 y2+y3 */
            rr[i] = _mm_hadd_epi32(x, x);
        }
        const __m256i off = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_unpacklo_epi64(rr[0], rr[1])), _mm_unpacklo_epi64(rr[2], rr[3]), 1);
        s = _mm256_sub_epi32(s, _mm256_slli_epi32(off, 5));
        const __m256 d1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g)),
                                        _mm256_set1_ps(a->d));
        __m256 *ac = &acc[b % 32];
        *ac = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(s), *ac);
    }
    for (int st = 16; st >= 1; st /= 2)
        for (int i = 0; i < st; i++) acc[i] = _mm256_add_ps(acc[i], acc[i + st]);
    _mm256_storeu_ps(out, acc[0]);
}
