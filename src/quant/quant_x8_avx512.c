/* quant_x8_avx512.c - the AVX-512 kernels of quant_x8.h: 8 repacked q4_K or q6_K rows against
 * one q8_K activation row, or 8 mxfp4 or q8_0 rows against a q8_32 one (layouts in quant_x8.c). CMake
 * gives this file the AVX-512 F/BW/VL/DQ/VNNI flags; the kernels add VBMI (vpermb, vpermt2b, vpmultishiftqb) by a target attribute (GCC and
 * clang). The caller checks the CPU (quant_x8_fast).
 *
 * q4_K, per block of the 8 rows: the 64 scales and 64 mins come out of quant_x8.c's sm as bytes
 * in five whole-register steps (nibbles masked, top bits placed by vpmultishiftqb). Each
 * (chunk j, part m) register of quants gives two vpdpbusd: low nibbles against 8 bytes of
 * sub-block 2j's activation, high nibbles (masked in place, so 16 times their value, exact)
 * against 2j + 1's (each a 64-bit broadcast from memory), into 32-bit lanes 2r + h below 2^15
 * (2^19 for the high ones, shifted back by 4). vpackssdw then makes int16 pairs of one row and
 * sub-block, and one vpdpwssd per chunk scales them by their (sc, sc) pairs (vpermb from the
 * scale bytes); rows are summed out of lanes 4L + c at the end. t is the mins against
 * bsums[2jj] + bsums[2jj + 1] by pmaddwd. All of it exact integers, so the same s and t as the
 * reference. The float part is the reference's per row, with the rows in the 8 lanes of a
 * register: acc[b % 32] = fma(d * da, s, acc), then fma(-(dmin * da), t, acc); then the halving
 * tree across the 32 registers.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "base/tune.h"
#include "quant/blocks.h"

int quant_x8_avx512_built(void);
/* quant_x8.h's kernel for n activation rows (act + t * astride), out[t * 8 + r], per type */
#define X8_DOT_DECL(T) \
    void quant_x8_dot_##T##_avx512(int64_t nb, const void *group, const void *act, size_t astride, \
                                   int n, float *out);
X8_DOT_DECL(q4_K)
X8_DOT_DECL(q6_K)
X8_DOT_DECL(mxfp4)
X8_DOT_DECL(q8_0)

int quant_x8_avx512_built(void) { return 1; }

/* The weight stream is prefetched at two distances (base/tune.h): HM_TUNE_X8_PF_L1 bytes ahead
 * into L1 and HM_TUNE_X8_PF_L2 bytes ahead into L2 only. A core alone cannot keep enough misses
 * in flight through its L1 fill buffers; the L2-only requests add more, further ahead. On the
 * 16-core host (bench/RESULTS.md, two-distance prefetch in the x8 kernels) 2 KiB + 12 KiB
 * streamed q4_K 8% faster than 4 KiB into L1 alone, and decode was faster in 11 of 12 alternated
 * pairs (~9% on average). */
/* The n bytes of the weight stream HM_TUNE_X8_PF_L1 and HM_TUNE_X8_PF_L2 bytes after g. */
#define X8_PREFETCH(g, n)                                                                      \
    for (int o_ = 0; o_ < (int)(n); o_ += 64) {                                                \
        _mm_prefetch((const char *)(g) + HM_TUNE_X8_PF_L1 + o_, _MM_HINT_T0);                  \
        _mm_prefetch((const char *)(g) + HM_TUNE_X8_PF_L2 + o_, _MM_HINT_T2);                  \
    }
enum { X8_GROUP_BLOCK = 1152 };

/* Keeps a loaded register a register: GCC otherwise folds the load into each of its uses and
 * reads the same 64 bytes twice (a load-port slot each, and the ports are this kernel's limit). */
#define X8_IN_REG(x) __asm__("" : "+v"(x))

/* The reference's halving tree over acc[32] (docs/ARITHMETIC.md) where only acc[0, na) can be
 * nonzero: na, the power of two that covers the blocks (at most 32). Short rows (k = 768: three
 * blocks) then skip the zero-init and the adds of 28 of the 32 accumulators. */
static inline __attribute__((always_inline)) int x8_acc_used(int64_t nb) {
    int na = 1;
    while (na < 32 && na < nb) na *= 2;
    return na;
}

/* The tree's stages above na/2 add only +0.0f (sums of untouched zeros) to acc[0, na): once is
 * the same as several (it turns a -0.0f into +0.0f), so one + 0.0f, then the stages from na/2. */
static inline __attribute__((always_inline)) __m256 x8_acc_tree(__m256 *acc, int na) {
    if (na < 32)
        for (int i = 0; i < na; i++) acc[i] = _mm256_add_ps(acc[i], _mm256_setzero_ps());
    for (int st = na / 2; st >= 1; st /= 2)
        for (int i = 0; i < st; i++) acc[i] = _mm256_add_ps(acc[i], acc[i + st]);
    return acc[0];
}

/* Byte indexes into the decoded scales (value 8 jj + r: sub-block jj, row r) for chunk j's
 * vpdpwssd: dword lane 4L + c holds (sc, sc) as int16 of row 2L + (c & 1), sub-block
 * 2j + (c >> 1) (bytes 0 and 2; the odd bytes are zeroed by the mask). */
#define X8_SCL(j, L) 8 * (2 * j) + 2 * L, 0, 8 * (2 * j) + 2 * L, 0, \
                     8 * (2 * j) + 2 * L + 1, 0, 8 * (2 * j) + 2 * L + 1, 0, \
                     8 * (2 * j + 1) + 2 * L, 0, 8 * (2 * j + 1) + 2 * L, 0, \
                     8 * (2 * j + 1) + 2 * L + 1, 0, 8 * (2 * j + 1) + 2 * L + 1, 0
#define X8_SCJ(j) {X8_SCL(j, 0), X8_SCL(j, 1), X8_SCL(j, 2), X8_SCL(j, 3)}
static const uint8_t k_isc[4][64] __attribute__((aligned(64))) = {X8_SCJ(0), X8_SCJ(1), X8_SCJ(2),
                                                                   X8_SCJ(3)};
/* vpmultishiftqb offsets: byte k of a qword takes bits 2k - 4 .. 2k + 3 (mod 64), so the top two
 * bits of value 8w + k (bits 2k, 2k + 1 of word w, zero-extended to qword w) land at bits 4-5 */
#define X8_MS 60, 62, 0, 2, 4, 6, 8, 10
static const uint8_t k_ms[64] __attribute__((aligned(64))) = {X8_MS, X8_MS, X8_MS, X8_MS,
                                                              X8_MS, X8_MS, X8_MS, X8_MS};

/* The q4_K kernel for NT (1..4) activation rows at act + t * astride: each weight register is
 * loaded, masked and its scales decoded once for all of them; out[t * 8 + r]. */
__attribute__((target("avx512vbmi"))) static inline __attribute__((always_inline)) void
x8_q4_K_rows(int64_t nb, const void *group, const uint8_t *act, size_t astride, const int NT,
             float *out) {
    __m256 acc[4][32];
    const int na = x8_acc_used(nb);
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < na; i++) acc[t][i] = _mm256_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f), mf0 = _mm512_set1_epi8((char)0xf0);
    const __m512i m30 = _mm512_set1_epi8(0x30), ms = _mm512_load_si512(k_ms);
    const __m512i rows = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i iba = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i ibb = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = (const uint8_t *)group + (size_t)b * X8_GROUP_BLOCK;
        const block_q8_K *a[4];
        for (int t = 0; t < NT; t++) a[t] = (const block_q8_K *)(const void *)(act + (size_t)t * astride) + b;
        const uint8_t *qs = g + 32 + 96;
        X8_PREFETCH(g, X8_GROUP_BLOCK)
        /* the 64 scales SC and 64 mins MN as bytes (quant_x8.c's sm) */
        const __m512i nib = _mm512_loadu_si512(g + 32);
        const __m512i hs = _mm512_multishift_epi64_epi8(
            ms, _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)(g + 32 + 64))));
        const __m512i hm = _mm512_multishift_epi64_epi8(
            ms, _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)(g + 32 + 80))));
        const __m512i SC = _mm512_ternarylogic_epi32(_mm512_and_si512(nib, m4), hs, m30, 0xf8);
        const __m512i MN = _mm512_ternarylogic_epi32(
            _mm512_and_si512(_mm512_srli_epi16(nib, 4), m4), hm, m30, 0xf8); /* A | (B & C) */
        /* chunk j: lo and hi (lanes 2r + h of row r, |x| < 2^15) packed to int16 pairs of one
         * row and sub-block, times that scale pair: sacc lane 4L + c, see X8_SCL */
        __m512i sacc[4];
        for (int t = 0; t < NT; t++) sacc[t] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) {
            __m512i lo[4], hi[4];
            for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4")
            for (int m = 0; m < 4; m++) {
                __m512i q = _mm512_loadu_si512(qs + 256 * j + 64 * m);
                X8_IN_REG(q);
                const __m512i ql = _mm512_and_si512(q, m4), qh = _mm512_and_si512(q, mf0);
                _Pragma("GCC unroll 4")
                for (int t = 0; t < NT; t++) {
                    /* elements 8m.. of sub-blocks 2j and 2j + 1, each broadcast from memory */
                    const __m512i a0 = _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(a[t]->qs + 64 * j + 8 * m)));
                    const __m512i a1 = _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(a[t]->qs + 64 * j + 32 + 8 * m)));
                    lo[t] = _mm512_dpbusd_epi32(lo[t], ql, a0);
                    hi[t] = _mm512_dpbusd_epi32(hi[t], qh, a1); /* 16 x, exact */
                }
            }
            const __m512i scp = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull,
                                                              _mm512_load_si512(k_isc[j]), SC);
            _Pragma("GCC unroll 4")
            for (int t = 0; t < NT; t++)
                sacc[t] = _mm512_dpwssd_epi32(sacc[t], _mm512_packs_epi32(lo[t], _mm512_srai_epi32(hi[t], 4)), scp);
        }
        const __m512i mlo = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(MN));
        const __m512i mhi = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(MN, 1));
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g));
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16)));
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) {
            /* row 2L + c: lanes 4L + c and 4L + c + 2 */
            const __m256i s = _mm512_castsi512_si256(_mm512_permutexvar_epi32(
                rows, _mm512_add_epi32(sacc[t], _mm512_shuffle_epi32(sacc[t], _MM_PERM_BADC))));
            /* t: min value 16 q + 2 r + e (sub-block 2q + e) against bs2[2q + e] = bsums[4q + 2e] +
             * bsums[4q + 2e + 1], by pmaddwd: lanes 8q + r of ta (q < 2) and tb (q >= 2) */
            const __m256i bsum = _mm256_loadu_si256((const __m256i *)a[t]->bsums);
            const __m512i bs2 = _mm512_castsi256_si512(_mm256_castsi128_si256(
                _mm256_cvtepi32_epi16(_mm256_madd_epi16(bsum, _mm256_set1_epi16(1)))));
            const __m512i tt = _mm512_add_epi32(_mm512_madd_epi16(mlo, _mm512_permutexvar_epi32(iba, bs2)),
                                                _mm512_madd_epi16(mhi, _mm512_permutexvar_epi32(ibb, bs2)));
            const __m256i tm = _mm256_add_epi32(_mm512_castsi512_si256(tt), _mm512_extracti64x4_epi64(tt, 1));
            const __m256 vda = _mm256_set1_ps(a[t]->d);
            const __m256 d1 = _mm256_mul_ps(dw, vda);
            const __m256 d2 = _mm256_xor_ps(_mm256_mul_ps(dm, vda), _mm256_set1_ps(-0.0f));
            __m256 *ac = &acc[t][b % 32];
            *ac = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(s), *ac);
            *ac = _mm256_fmadd_ps(d2, _mm256_cvtepi32_ps(tm), *ac);
        }
    }
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(out + 8 * t, x8_acc_tree(acc[t], na));
}

/* n activation rows by tiles of 4 and the rest, through a kernel template ROWS(..., NT, ...) */
#define X8_ROWS_BY4(ROWS, nb, group, act, astride, n, out, ...)                                 \
    do {                                                                                         \
        const uint8_t *a_ = (const uint8_t *)(act);                                              \
        int n_ = (n);                                                                            \
        float *o_ = (out);                                                                       \
        for (; n_ >= 4; n_ -= 4, a_ += 4 * (astride), o_ += 32)                                  \
            ROWS(nb, group, a_, astride, 4, __VA_ARGS__ o_);                                     \
        if (n_ == 3) ROWS(nb, group, a_, astride, 3, __VA_ARGS__ o_);                            \
        else if (n_ == 2) ROWS(nb, group, a_, astride, 2, __VA_ARGS__ o_);                       \
        else if (n_ == 1) ROWS(nb, group, a_, astride, 1, __VA_ARGS__ o_);                       \
    } while (0)

__attribute__((target("avx512vbmi")))
void quant_x8_dot_q4_K_avx512(int64_t nb, const void *group, const void *act, size_t astride,
                              int n, float *out) {
    X8_ROWS_BY4(x8_q4_K_rows, nb, group, act, astride, n, out, );
}

/* ---- q6_K: per (half n, part m) three registers (quant_x8.c's planes) give the 6-bit quants
 * of the four quarters g of 8 bytes per row; each quarter's vpdpbusd against its 8 activation bytes
 * gives lanes below 2^15 (4 x 63 x 127). Quarters (0, 1) and (2, 3) are packed to int16 pairs
 * of one row and sub-block (vpackssdw, exact) and one vpdpwssd scales a pair of quarters by
 * their sub-blocks' int8 scales (8n + 2g + m / 2), as in q4_K: half the scaling instructions
 * of one vpdpwssd per quarter, and eight scale registers instead of sixteen. The -32 of every
 * quant is folded in as 32 x sum_j sc[j] x bsums[j] (the same exact integer as the
 * reference's sum). The loops are unrolled by pragma: GCC 12 otherwise keeps the quarter loop
 * and spills the quants to the stack (bench_dot --x8 q6_K, Zen 5: 36 GB/s before, 45 with the
 * unrolling, 57 packed, 64 with the planes). ---- */

/* Scale pairs of the packed sums: register (n, mh, p) holds, in dword lane 4L + c, sub-block
 * j = 8n + mh + 4p + 2 (c >> 1)'s scale of row 2L + (c & 1), in all four bytes (an arithmetic
 * shift by 8 then makes it the int16 pair (sc, sc)) */
#define X8_S6B(j, r) 16 * (r) + (j), 16 * (r) + (j), 16 * (r) + (j), 16 * (r) + (j)
#define X8_S6L(j, L) X8_S6B(j, 2 * (L)), X8_S6B(j, 2 * (L) + 1), X8_S6B((j) + 2, 2 * (L)), \
                     X8_S6B((j) + 2, 2 * (L) + 1)
#define X8_S6R(j) {X8_S6L(j, 0), X8_S6L(j, 1), X8_S6L(j, 2), X8_S6L(j, 3)}
static const uint8_t k_is6[8][64] __attribute__((aligned(64))) = {
    X8_S6R(0), X8_S6R(4), X8_S6R(1), X8_S6R(5), X8_S6R(8), X8_S6R(12), X8_S6R(9), X8_S6R(13)};

/* One activation row (q6_K has no multi-row form: its one-row kernel lost 2-5% to it) */
__attribute__((target("avx512vbmi"))) static void x8_q6_K_row(int64_t nb, const void *group,
                                                             const void *act, float out[8]) {
    __m256 acc[32];
    const int na = x8_acc_used(nb);
    for (int i = 0; i < na; i++) acc[i] = _mm256_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3f = _mm512_set1_epi8(0x3f), m3 = _mm512_set1_epi8(3);
    const __m512i rows = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    enum { G6 = 1680 };
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = (const uint8_t *)group + (size_t)b * G6;
        const block_q8_K *a = (const block_q8_K *)act + b;
        X8_PREFETCH(g, G6)
        const uint8_t *qb = g + 16 + 128;
        const __m512i S0 = _mm512_loadu_si512(g + 16), S1 = _mm512_loadu_si512(g + 80);
        __m512i sc[8]; /* (n, mh, p) as k_is6: int16 pairs (sc, sc) */
        _Pragma("GCC unroll 8")
        for (int i = 0; i < 8; i++)
            sc[i] = _mm512_srai_epi16(_mm512_permutex2var_epi8(S0, _mm512_load_si512(k_is6[i]), S1), 8);
        __m512i sq[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        _Pragma("GCC unroll 2")
        for (int n = 0; n < 2; n++) {
            _Pragma("GCC unroll 4")
            for (int m = 0; m < 4; m++) {
                const uint8_t *pb = qb + 768 * n + 192 * m;
                __m512i b0 = _mm512_loadu_si512(pb), b1 = _mm512_loadu_si512(pb + 64);
                __m512i b2 = _mm512_loadu_si512(pb + 128);
                X8_IN_REG(b0);
                X8_IN_REG(b1);
                X8_IN_REG(b2);
                __m512i q[4];
                q[0] = _mm512_and_si512(b0, m3f);
                q[1] = _mm512_and_si512(b1, m3f);
                q[2] = _mm512_and_si512(b2, m3f);
                /* quarter 3: bits 0-1 from b0's top pair, 2-3 from b1's (0xe4: C ? A : B), 4-5
                 * from b2's (cleared below them first, so the shift brings in no other bits) */
                const __m512i w = _mm512_ternarylogic_epi32(_mm512_srli_epi16(b0, 6),
                                                            _mm512_srli_epi16(b1, 4), m3, 0xe4);
                q[3] = _mm512_ternarylogic_epi32(w, _mm512_srli_epi16(_mm512_andnot_si512(m3f, b2), 2),
                                                 m4, 0xe4);
                __m512i v[4];
                _Pragma("GCC unroll 4")
                for (int q4 = 0; q4 < 4; q4++) {
                    int64_t av;
                    memcpy(&av, a->qs + 128 * n + 32 * q4 + 8 * m, 8);
                    v[q4] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[q4], _mm512_set1_epi64(av));
                }
                /* quarters (0, 1) and (2, 3): |v| <= 4 x 63 x 127 < 2^15, packed exactly */
                _Pragma("GCC unroll 2")
                for (int p = 0; p < 2; p++)
                    sq[p] = _mm512_dpwssd_epi32(sq[p], _mm512_packs_epi32(v[2 * p], v[2 * p + 1]),
                                                sc[4 * n + 2 * (m / 2) + p]);
            }
        }
        const __m512i sacc = _mm512_add_epi32(sq[0], sq[1]);
        /* row 2L + c: lanes 4L + c and 4L + c + 2 */
        __m256i s = _mm512_castsi512_si256(_mm512_permutexvar_epi32(
            rows, _mm512_add_epi32(sacc, _mm512_shuffle_epi32(sacc, _MM_PERM_BADC))));
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
    _mm256_storeu_ps(out, x8_acc_tree(acc, na));
}

/* ---- mxfp4 and q8_0: two blocks per step (quant_x8.c's pairs), the 8 rows of block b in lanes
 * 0-7 and of b + 1 in lanes 8-15. A block's quant registers give u * a sums by vpdpbusd against
 * 8 activation bytes each, with unsigned u: mxfp4 u = kvalues_mxfp4 + 12 by one vpermb per
 * nibble half (on the 16-entry table replicated 4x, so the index bits above the nibble do not
 * matter), q8_0 u = q ^ 0x80 = q + 128. The row's two dword lanes are summed, then s = sum u*a -
 * OFF * sum_a (one vpdpwssd of the int16 sum by -OFF). d * da: mxfp4 vscalefps(da, e - 128),
 * da * 2^(e - 128) rounded once, the reference's product; q8_0 an ordinary multiply. The 32
 * accumulators are 16 registers of two (lanes 0-7: acc[2j], 8-15: acc[2j + 1]), so the tree's
 * steps above 1 are whole-register adds. ---- */
static const uint8_t k_mx_u[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* 8 activation bytes at p as a 64-bit broadcast */
static inline __m512i x8_bcast8(const int8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return _mm512_set1_epi64(v);
}

/* A block's unsigned quant registers U[0..NU) ([m][r][8] parts; mxfp4 U = low halves of parts
 * 0, 1, then high halves: elements 0-7, 8-15, 16-23, 24-31 like q8_0's four parts). */
__attribute__((target("avx512vbmi"))) static inline __attribute__((always_inline)) void
x8_q32_unpack(const uint8_t *q, int MX, __m512i t, __m512i U[4]) {
    if (MX) {
        __m512i q0 = _mm512_loadu_si512(q), q1 = _mm512_loadu_si512(q + 64);
        X8_IN_REG(q0);
        X8_IN_REG(q1);
        U[0] = _mm512_permutexvar_epi8(q0, t);
        U[1] = _mm512_permutexvar_epi8(q1, t);
        U[2] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q0, 4), t);
        U[3] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q1, 4), t);
        return;
    }
    const __m512i sgn = _mm512_set1_epi8((char)0x80);
    _Pragma("GCC unroll 4")
    for (int m = 0; m < 4; m++) U[m] = _mm512_xor_si512(_mm512_loadu_si512(q + 64 * m), sgn);
}

/* dword lanes 2r, 2r + 1: row r's two halves of sum u * a, U against activation block a */
static inline __m512i x8_q32_dot(const __m512i U[4], const block_q8_32 *a) {
    __m512i v = _mm512_dpbusd_epi32(_mm512_setzero_si512(), U[0], x8_bcast8(a->qs));
    v = _mm512_dpbusd_epi32(v, U[1], x8_bcast8(a->qs + 8));
    v = _mm512_dpbusd_epi32(v, U[2], x8_bcast8(a->qs + 16));
    return _mm512_dpbusd_epi32(v, U[3], x8_bcast8(a->qs + 24));
}

/* [row sums of block b | of block b + 1] from their lanes 2r, 2r + 1, minus off * sum_a */
static inline __m512i x8_pair_isum(__m512i v0, __m512i v1, const block_q8_32 *a, int off) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i s = _mm512_add_epi32(_mm512_permutex2var_epi32(v0, ie, v1),
                                       _mm512_permutex2var_epi32(v0, io, v1));
    const __m512i sa = _mm512_inserti64x4(_mm512_set1_epi32(a[0].sum), _mm256_set1_epi32(a[1].sum), 1);
    /* |sum_a| <= 32 * 127: an int16, times the int16 pair (-off, 0) */
    return _mm512_dpwssd_epi32(s, sa, _mm512_set1_epi32(-off & 0xffff));
}

/* one block's row sums (lanes 2r, 2r + 1 of v) minus off * sum_a, as 8 lanes */
static inline __m256i x8_one_isum(__m512i v, const block_q8_32 *a, int off) {
    const __m256i s = _mm512_cvtepi64_epi32(_mm512_add_epi32(v, _mm512_srli_epi64(v, 32)));
    return _mm256_sub_epi32(s, _mm256_set1_epi32(off * a->sum));
}

/* the two blocks' da in lanes 0-7 and 8-15 */
static inline __m512 x8_pair_da(const block_q8_32 *a) {
    return _mm512_insertf32x8(_mm512_set1_ps(a[0].d), _mm256_set1_ps(a[1].d), 1);
}

/* acc[j] (pairs) += the odd last block's update in lanes 0-7 (its index is even) */
static inline void x8_acc_low(__m512 *ac, __m256 dd, __m256i s) {
    const __m256 lo = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), _mm512_castps512_ps256(*ac));
    *ac = _mm512_insertf32x8(*ac, lo, 0);
}

/* x8_acc_tree on pairs: one + 0.0f for the stages above na / 2, whole-register steps down to
 * 2, then acc[0] + acc[1] across the halves */
static inline void x8_pair_tree(__m512 *acc, int na, float out[8]) {
    if (na < 32)
        for (int i = 0; i < (na + 1) / 2; i++) acc[i] = _mm512_add_ps(acc[i], _mm512_setzero_ps());
    for (int st = na / 4; st >= 1; st /= 2)
        for (int i = 0; i < st; i++) acc[i] = _mm512_add_ps(acc[i], acc[i + st]);
    __m256 r = _mm512_castps512_ps256(acc[0]);
    if (na >= 2) r = _mm256_add_ps(r, _mm512_extractf32x8_ps(acc[0], 1));
    _mm256_storeu_ps(out, r);
}

/* The mxfp4 (MX) or q8_0 kernel for NT (1..4) activation rows at act + t * astride: each weight
 * block is unpacked once for all of them; out[t * 8 + r]. Group strides: a pair of blocks is
 * 272 (mxfp4) or 544 (q8_0) bytes, scales first (1 or 2 bytes per row and block). */
__attribute__((target("avx512vbmi"))) static inline __attribute__((always_inline)) void
x8_q32_rows(int64_t nb, const void *group, const uint8_t *act, size_t astride, const int NT,
            const int MX, float *out) {
    __m512 acc[4][16]; /* acc[t][j]: the reference's acc[2j] (lanes 0-7) and acc[2j + 1] (8-15) */
    const int na = x8_acc_used(nb);
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < (na + 1) / 2; i++) acc[t][i] = _mm512_setzero_ps();
    const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)k_mx_u));
    const int off = MX ? 12 : 128;
    const size_t pair = MX ? 272 : 544, sc8 = MX ? 8 : 16, qb8 = MX ? 128 : 256;
    const uint8_t *g = (const uint8_t *)group;
    const block_q8_32 *a[4];
    for (int t = 0; t < NT; t++) a[t] = (const block_q8_32 *)(const void *)(act + (size_t)t * astride);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, g += pair) {
        X8_PREFETCH(g, pair)
        /* one row: each block's products right after its unpacking; several: both blocks
         * unpacked first (fewer live registers than every row's partial sums) */
        __m512i U0[4], U1[4], v0 = _mm512_setzero_si512(), v1 = v0;
        x8_q32_unpack(g + 2 * sc8, MX, tab, U0);
        if (NT == 1) v0 = x8_q32_dot(U0, a[0] + b);
        x8_q32_unpack(g + 2 * sc8 + qb8, MX, tab, U1);
        if (NT == 1) v1 = x8_q32_dot(U1, a[0] + b + 1);
        __m512 dw; /* mxfp4: e - 128 as floats (vscalefps); q8_0: d */
        if (MX)
            dw = _mm512_cvtepi32_ps(_mm512_sub_epi32(
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)g)), _mm512_set1_epi32(128)));
        else
            dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)g));
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) {
            const __m512i s = NT == 1 ? x8_pair_isum(v0, v1, a[0] + b, off)
                                      : x8_pair_isum(x8_q32_dot(U0, a[t] + b),
                                                     x8_q32_dot(U1, a[t] + b + 1), a[t] + b, off);
            const __m512 da = x8_pair_da(a[t] + b);
            const __m512 dd = MX ? _mm512_scalef_ps(da, dw) : _mm512_mul_ps(dw, da);
            __m512 *ac = &acc[t][(b % 32) / 2];
            *ac = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s), *ac);
        }
    }
    if (b < nb) { /* the odd last block: lanes 0-7 of its register (b is even) */
        __m512i U[4];
        x8_q32_unpack(g + sc8, MX, tab, U);
        __m256 dw;
        if (MX)
            dw = _mm256_cvtepi32_ps(_mm256_sub_epi32(
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)g)), _mm256_set1_epi32(128)));
        else
            dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)g));
        for (int t = 0; t < NT; t++) {
            const __m256i s = x8_one_isum(x8_q32_dot(U, a[t] + b), a[t] + b, off);
            const __m256 da = _mm256_set1_ps(a[t][b].d);
            x8_acc_low(&acc[t][(b % 32) / 2], MX ? _mm256_scalef_ps(da, dw) : _mm256_mul_ps(dw, da), s);
        }
    }
    for (int t = 0; t < NT; t++) x8_pair_tree(acc[t], na, out + 8 * t);
}

#define X8_Q32_ENTRY(T, MX)                                                                       \
    __attribute__((target("avx512vbmi")))                                                        \
    void quant_x8_dot_##T##_avx512(int64_t nb, const void *group, const void *act, size_t astride, \
                                   int n, float *out) {                                          \
        X8_ROWS_BY4(x8_q32_rows, nb, group, act, astride, n, out, MX,);                          \
    }
X8_Q32_ENTRY(mxfp4, 1)
X8_Q32_ENTRY(q8_0, 0)

/* q6_K: one activation row after another (each group of 8 rows stays in L1 across them) */
void quant_x8_dot_q6_K_avx512(int64_t nb, const void *group, const void *act, size_t astride,
                              int n, float *out) {
    for (int t = 0; t < n; t++)
        x8_q6_K_row(nb, group, (const uint8_t *)act + (size_t)t * astride, out + 8 * t);
}
