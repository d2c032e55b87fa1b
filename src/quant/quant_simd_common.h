/* quant_simd_common.h - internal: building blocks of the x86 SIMD kernels. quant_avx2.c,
 * quant_avx512.c and quant_vbmi_avx512.c include quant_simd_float.h, which pulls in (in this
 * order) common, lanes, kquants and q32, and so compile the same source with different ISA
 * flags. Everything here is static.
 *
 * DESIGN (how the SIMD code keeps the bits of docs/ARITHMETIC.md):
 * - integer work is free-form: a block's int32 sum is produced as a __m256i of 8 partial sums
 *   (any split is exact), and simd_hsum8x8 turns the partials of 8 consecutive blocks into one
 *   __m256i whose lane i is block i's exact sum;
 * - float work is exactly the reference's: lane i of accumulator register (b/8)%4 is the
 *   reference's acc[b%32]; each block's update is one vector fmadd of (d*da) and (float)s, done
 *   with the same single roundings (_mm256_mul_ps, _mm256_cvtepi32_ps, _mm256_fmadd_ps);
 *   lanes past the end of a row are left untouched by a blend, never fed zeros;
 * - simd_tree performs the halving tree 16, 8, 4, 2, 1 on the 32 lanes in the reference order.
 * ISA differences are compile-time switches: SIMD_VNNI (vpdpbusd / vpdpwssd instead of
 * pmaddubsw + pmaddwd, which also lets q8_0 and iq4_nl use unsigned offset weights) and
 * SIMD_VBMI (vpermb table lookups). Kernels keep 256-bit vectors on every ISA, except mxfp4
 * with VBMI (quant_simd_q32.h: 512-bit packing, lookup and vpdpbusd; its float part stays 256-bit).
 * Weight streams are prefetched HM_TUNE_SIMD_PF_DIST bytes ahead (base/tune.h): without it a
 * core cannot keep enough misses in flight, and a 16-core matvec of 4-bit types stayed near 0.65
 * of read bandwidth.
 */
#ifndef HM_QUANT_SIMD_COMMON_H
#define HM_QUANT_SIMD_COMMON_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "base/tune.h"
#include "quant/blocks.h"
#include "quant/quant.h"

#define SIMD_INLINE static inline __attribute__((always_inline))

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SIMD_VNNI 1
#else
#define SIMD_VNNI 0
#endif
/* quant_vbmi_avx512.c enables VBMI (vpermb) for the 4-bit table lookups */
#if SIMD_VNNI && defined(__AVX512VBMI__)
#define SIMD_VBMI 1
#else
#define SIMD_VBMI 0
#endif

/* Software prefetch of the weight stream into L1, HM_TUNE_SIMD_PF_DIST bytes ahead of the bytes
 * [p, p + len) about to be read (one prefetch per cache line; past the end of the data it is
 * harmless). L2-only hints (T1, T2) were no faster, NTA clearly slower (bench/RESULTS.md). */
/* The same at lead bytes ahead. */
SIMD_INLINE void simd_prefetch_at(const uint8_t *p, size_t lead, size_t len) {
    for (size_t o = 0; o < len; o += 64) _mm_prefetch((const char *)(p + lead + o), _MM_HINT_T0);
}

SIMD_INLINE void simd_prefetch_w(const uint8_t *p, size_t len) {
    simd_prefetch_at(p, HM_TUNE_SIMD_PF_DIST, len);
}

/* The 32 accumulator lanes: a[j] holds lanes 8j..8j+7. */
typedef struct { __m256 a[4]; } simd_acc;

SIMD_INLINE void simd_acc_zero(simd_acc *acc) {
    for (int j = 0; j < 4; j++) acc->a[j] = _mm256_setzero_ps();
}

/* acc[0..32) -> acc[0] by the fixed tree: s = 16, 8, 4, 2, 1; acc[i] += acc[i + s]. */
SIMD_INLINE float simd_tree(const simd_acc *acc) {
    __m256 v0 = _mm256_add_ps(acc->a[0], acc->a[2]);           /* s = 16 */
    __m256 v1 = _mm256_add_ps(acc->a[1], acc->a[3]);
    __m256 v = _mm256_add_ps(v0, v1);                           /* s = 8 */
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* s = 4 */
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));                     /* s = 2 */
    q = _mm_add_ss(q, _mm_movehdup_ps(q));                      /* s = 1 */
    return _mm_cvtss_f32(q);
}

/* Lane mask for the first n (0..8) lanes. */
SIMD_INLINE __m256 simd_lane_mask(int n) {
    static const int32_t k_mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(k_mask + 8 - n)));
}

/* Byte offsets of lane i: i * stride (8 consecutive blocks of one row), and
 * (i & 3) * stride + (i >> 2) * rstride (4 blocks of each of two rows rstride bytes apart). */
SIMD_INLINE __m256i simd_ix8(size_t stride) {
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)stride));
}
SIMD_INLINE __m256i simd_ix44(size_t stride, size_t rstride) {
    return _mm256_add_epi32(_mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3), _mm256_set1_epi32((int)stride)),
                            _mm256_mullo_epi32(_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_set1_epi32((int)rstride)));
}

/* simd_tree of two rows at once, out[0] and out[1]: the s = 16 and 8 steps per row, then the
 * two rows' 8 lanes side by side (row 0 in lanes 0-3, row 1 in 4-7) for s = 4, 2, 1. */
SIMD_INLINE __m256 simd_tree2_s4(const simd_acc *r0, const simd_acc *r1) {
    const __m256 v0 = _mm256_add_ps(_mm256_add_ps(r0->a[0], r0->a[2]), _mm256_add_ps(r0->a[1], r0->a[3]));
    const __m256 v1 = _mm256_add_ps(_mm256_add_ps(r1->a[0], r1->a[2]), _mm256_add_ps(r1->a[1], r1->a[3]));
    return _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20), _mm256_permute2f128_ps(v0, v1, 0x31));
}
/* q: after s = 4 (lanes 0-3 row 0, 4-7 row 1); the s = 2 and 1 steps and the two results. */
SIMD_INLINE void simd_tree2_tail(__m256 q, float *out) {
    q = _mm256_add_ps(q, _mm256_permute_ps(q, 0x4e));  /* s = 2: lane i += lane i + 2 */
    q = _mm256_add_ps(q, _mm256_movehdup_ps(q));       /* s = 1: lane 0 += lane 1 */
    out[0] = _mm256_cvtss_f32(q);
    out[1] = _mm_cvtss_f32(_mm256_extractf128_ps(q, 1));
}

/* v[i] holds 8 int32 partials of block i; returns the 8 block sums (lane i = sum of v[i]). */
SIMD_INLINE __m256i simd_hsum8x8(const __m256i v[8]) {
    __m256i h01 = _mm256_hadd_epi32(v[0], v[1]);
    __m256i h23 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i h45 = _mm256_hadd_epi32(v[4], v[5]);
    __m256i h67 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i h0123 = _mm256_hadd_epi32(h01, h23); /* lo128: s0..s3 (low halves), hi128: high halves */
    __m256i h4567 = _mm256_hadd_epi32(h45, h67);
    __m256i lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    __m256i hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
    return _mm256_add_epi32(lo, hi);
}

/* Sum of 8 int32 lanes (exact). */
SIMD_INLINE int32_t simd_hsum_i32(__m256i v) {
    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4e));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xb1));
    return _mm_cvtsi128_si32(q);
}

/* Partial sums (8 x int32) of u[i] * s[i] for 32 unsigned bytes u and 32 signed bytes s.
 * Without VNNI: pmaddubsw then pmaddwd; the int16 stage cannot saturate for our ranges
 * (|u| <= 128, |s| <= 127: 2 * 128 * 127 < 32767). */
SIMD_INLINE __m256i simd_dot_u8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* Partial sums of w[i] * a[i] for signed bytes w (-128..127) and a (-127..127). */
SIMD_INLINE __m256i simd_dot_s8(__m256i w, __m256i a) {
    return simd_dot_u8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

/* 16 packed nibbles (q4_0 order: byte j = element j low, element j+16 high), unmasked: the
 * low half holds the bytes, the high half the bytes shifted right by 4 (per 64-bit lane). */
SIMD_INLINE __m256i simd_nibbles32_raw(const uint8_t *qs) {
    __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4));
}

/* ... -> 32 bytes 0..15 in element order. */
SIMD_INLINE __m256i simd_nibbles32(const uint8_t *qs) {
    return _mm256_and_si256(simd_nibbles32_raw(qs), _mm256_set1_epi8(0x0f));
}

/* 32 bits (little-endian) -> 32 bytes, 0xff where the bit is set. */
SIMD_INLINE __m256i simd_bits32(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    __m256i v = _mm256_set1_epi32((int)x);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    v = _mm256_shuffle_epi8(v, shuf);
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi8(-1));
}

/* 32 nibbles of a block looked up in a 16-entry table (vpermb ignores the unmasked high bits). */
SIMD_INLINE __m256i simd_lut_nibbles32(const uint8_t *qs, const int8_t table[16]) {
#if SIMD_VBMI
    __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    return _mm256_permutexvar_epi8(simd_nibbles32_raw(qs), t);
#else
    __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    return _mm256_shuffle_epi8(t, simd_nibbles32(qs));
#endif
}

/* Table lookup of 32 indices 0..15 in a 16-entry int8 table. */
SIMD_INLINE __m256i simd_lut16(__m256i idx, const int8_t table[16]) {
    __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    return _mm256_shuffle_epi8(t, idx);
}

SIMD_INLINE float simd_fp16(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

SIMD_INLINE float simd_f32(const void *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

SIMD_INLINE int32_t simd_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- activation quantisation (docs/ARITHMETIC.md section 1) ---- */

/* Quantises 32 floats with scale id into int8 at q (round half even under the default MXCSR,
 * clamped to +-127; NaN, i.e. 0 * inf when id = +inf, gives 0); g[0], g[1] get the int32
 * partials of the first and last 16 quants (q8_K's sums). Clamping the float before rounding
 * is the same as after: the bounds are integers. */
SIMD_INLINE void simd_quant32_k(const float *x, float id, int8_t *q, __m256i g[2]) {
    const __m256 vid = _mm256_set1_ps(id);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i i[4];
    for (int j = 0; j < 4; j++) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), vid);
        v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN -> +0 */
        v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
        i[j] = _mm256_cvtps_epi32(v);
    }
    g[0] = _mm256_add_epi32(i[0], i[1]);
    g[1] = _mm256_add_epi32(i[2], i[3]);
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
}

/* simd_quant32_k's quants, returning the int32 partial sums of all 32 */
SIMD_INLINE __m256i simd_quant32(const float *x, float id, int8_t *q) {
    __m256i g[2];
    simd_quant32_k(x, id, q, g);
    return _mm256_add_epi32(g[0], g[1]);
}

/* max |x[i]| over n (multiple of 8) floats (exact in any order: the inputs are finite). */
SIMD_INLINE float simd_amax(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    int i = 0;
    if (n % 32 == 0) { /* four independent chains instead of one long one */
        __m256 m1 = m, m2 = m, m3 = m;
        for (; i < n; i += 32) {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
            m1 = _mm256_max_ps(m1, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i + 8)));
            m2 = _mm256_max_ps(m2, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i + 16)));
            m3 = _mm256_max_ps(m3, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i + 24)));
        }
        m = _mm256_max_ps(_mm256_max_ps(m, m1), _mm256_max_ps(m2, m3));
    }
    for (; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

static void simd_act_q8_32(const float *x, void *dst, int64_t n) {
    block_q8_32 *y = dst;
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = simd_amax(xb, 32);
        float d = amax / 127.0f;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        __m256i s = simd_quant32(xb, id, y[b].qs);
        y[b].d = d;
        y[b].sum = simd_hsum_i32(s);
    }
}

static void simd_act_q8_K(const float *x, void *dst, int64_t n) {
    block_q8_K *y = dst;
    for (int64_t b = 0; b < n / 256; b++) {
        const float *xb = x + 256 * b;
        float amax = simd_amax(xb, 256);
        float d = amax / 127.0f;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        __m256i g[16]; /* g[i]: 8 int32 partials of qs[16i .. 16i+15] */
        for (int j = 0; j < 8; j++) simd_quant32_k(xb + 32 * j, id, y[b].qs + 32 * j, &g[2 * j]);
        y[b].d = d;
        /* bsums[i] = sum of qs[16i .. 16i+15] (|bsums| <= 16 * 127: packs does not saturate) */
        const __m256i lo = simd_hsum8x8(g), hi = simd_hsum8x8(g + 8);
        _mm256_storeu_si256((__m256i *)y[b].bsums,
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xd8));
    }
}

static void simd_act_f32(const float *x, void *dst, int64_t n) {
    memmove(dst, x, (size_t)n * sizeof(float));
}

#endif
