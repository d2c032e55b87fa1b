/* cuda_blocks.cuh - device decoding of every weight block type of src/quant: scales, element
 * values (dequantisation bit-identical to quant_dequantize_row) and the per-block INTEGER dot
 * with a q8_32 / q8_K activation block that docs/ARITHMETIC.md's float update consumes.
 *
 * DESIGN: one traits struct per type (cb_q4_0, ..., cb_iq4_xs; cb_f32/cb_f16/cb_bf16 for the
 * float types), all with the same members, so kernels are templates over the traits:
 *   BS, TS           elements and bytes per block
 *   ACT              activation format (QUANT_ACT_F32 / _Q8_32 / _Q8_K), ABS its block bytes
 *   G                lanes that share one block's integer work (BS / G elements each)
 *   UPD              float update kind: CB_UPD_SYM  acc = fma(d*da, s, acc)
 *                                       CB_UPD_AFF  ... then acc = fma(m*da, t, acc)
 *                                       CB_UPD_KMIN ... then acc = fma(-(m*da), t, acc)
 *   deq(b, j)        value of element j of the block at b, exactly as quant_dequantize_row
 *   scale(b, d, m)   the block's float scale d and second factor m (min / dmin), exact
 *   part<NT>(b, p, a, aoff, s, t)
 *                    integer partial sums of part p (0..G-1) of the block at b with the
 *                    activation blocks at a[i] + aoff, i < NT: s[i] += the part's share of the
 *                    spec's s, t[i] += its share of t (q4_1/q5_1: t = the activation block's
 *                    sum, added by part 0; q4_K/q5_K: t = Σ mn[j]·(bsums[2j]+bsums[2j+1])).
 *                    Integer sums are exact, so summing the G parts in any order gives the
 *                    spec's s and t.
 * Block pointers need only the alignment of the block struct (2 bytes for most types, 1 for
 * mxfp4); activation blocks are 4-byte aligned. fp16 / bf16 / e8m0 conversions are bit
 * operations (NaN payloads kept as hm_fp16_to_f32 does). 4-bit grids are looked up with
 * __byte_perm on constant words (no memory lookups).
 * Header-only; include from .cu files (helpers G, E use deq / scale too).
 */
#ifndef HM_CUDA_CUDA_BLOCKS_CUH
#define HM_CUDA_CUDA_BLOCKS_CUH

#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "quant/blocks.h"
#include "quant/quant.h"
}

/* ---------------------------------------------------------------- conversions and loads */

static __device__ __forceinline__ float cb_fp16_slow(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (ex == 0x1f)
        return __uint_as_float(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u));
    if (ex == 0) {
        if (man == 0) return __uint_as_float(sign);
        const float f = __fmul_rn((float)man, 5.9604644775390625e-08f); /* exact */
        return sign ? -f : f;
    }
    return __uint_as_float(sign | ((ex + 112u) << 23) | (man << 13));
}

/* exact for every half; the hardware conversion is exact except that it does not keep NaN
 * payloads the way hm_fp16_to_f32 does, so NaNs take the bit path */
static __device__ __forceinline__ float cb_fp16(uint16_t h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) return cb_fp16_slow(h);
    return __half2float(__ushort_as_half(h));
}

static __device__ __forceinline__ float cb_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* MXFP4 block scale 2^(e-128) (hm_e8m0_half_to_f32) */
static __device__ __forceinline__ float cb_e8m0_half(uint8_t e) {
    return __uint_as_float(e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23));
}

static __device__ __forceinline__ uint32_t cb_u16(const uint8_t *p) { return *(const uint16_t *)p; }
static __device__ __forceinline__ float cb_h(const uint8_t *p) { return cb_fp16(*(const uint16_t *)p); }
/* little-endian u32 from a 4-, 2- or 1-byte aligned address */
static __device__ __forceinline__ uint32_t cb_ld4(const uint8_t *p) { return *(const uint32_t *)p; }
static __device__ __forceinline__ uint32_t cb_ld2(const uint8_t *p) {
    return cb_u16(p) | (cb_u16(p + 2) << 16);
}
/* (1-byte aligned: the two aligned words holding the bytes, funnel-shifted; the second word is
 * read only when the bytes straddle it, so no byte past p + 3's word is touched) */
static __device__ __forceinline__ uint32_t cb_ld1(const uint8_t *p) {
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const unsigned sh = 8u * (unsigned)((uintptr_t)p & 3);
    return sh ? __funnelshift_r(a[0], a[1], sh) : a[0];
}
static __device__ __forceinline__ int cb_a4(const uint8_t *p) { return *(const int *)p; }

/* 4 bytes each 0..15 -> 4 signed bytes table[v] (16-entry int8 table packed in 4 words) */
template <uint32_t T0, uint32_t T1, uint32_t T2, uint32_t T3>
static __device__ __forceinline__ int cb_lut16(uint32_t v) {
    const uint32_t sel = (v & 0xFu) | ((v >> 4) & 0xF0u) | ((v >> 8) & 0xF00u) | ((v >> 12) & 0xF000u);
    const uint32_t lo = __byte_perm(T0, T1, sel & 0x7777u), hi = __byte_perm(T2, T3, sel & 0x7777u);
    const uint32_t m = ((v >> 3) & 0x01010101u) * 0xFFu;
    return (int)((lo & ~m) | (hi & m));
}
#define CB_W4(a, b, c, d) \
    ((uint32_t)(uint8_t)(a) | ((uint32_t)(uint8_t)(b) << 8) | ((uint32_t)(uint8_t)(c) << 16) | ((uint32_t)(uint8_t)(d) << 24))
/* hm_kvalues_iq4nl and hm_kvalues_mxfp4 of blocks.h */
#define CB_IQ4NL_LUT CB_W4(-127, -104, -83, -65), CB_W4(-49, -35, -22, -10), CB_W4(1, 13, 25, 38), CB_W4(53, 69, 89, 113)
#define CB_MXFP4_LUT CB_W4(0, 1, 2, 3), CB_W4(4, 6, 8, 12), CB_W4(0, -1, -2, -3), CB_W4(-4, -6, -8, -12)
static __device__ __forceinline__ int cb_iq4nl_val(int q) {
    return (int)(int8_t)(cb_lut16<CB_IQ4NL_LUT>((uint32_t)q) & 0xFF);
}
static __device__ __forceinline__ int cb_mxfp4_val(int q) {
    return (int)(int8_t)(cb_lut16<CB_MXFP4_LUT>((uint32_t)q) & 0xFF);
}

/* ggml's get_scale_min_k4 (quant_k4_scale_min) */
static __device__ __forceinline__ void cb_k4_scale_min(int j, const uint8_t *sc, int *s, int *m) {
    if (j < 4) {
        *s = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

/* bits b, b+1, b+2, b+3 of h -> bit 4 of bytes 0..3 */
static __device__ __forceinline__ uint32_t cb_bits_to_b4(uint32_t h, int b) {
    h >>= b;
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

static constexpr int CB_UPD_SYM = 0, CB_UPD_AFF = 1, CB_UPD_KMIN = 2, CB_UPD_FLOAT = 3;
static constexpr int CB_A32 = (int)sizeof(block_q8_32), CB_AK = (int)sizeof(block_q8_K);

/* offsets inside activation blocks */
#define CB_A32_QS 8   /* block_q8_32: d, sum, qs[32] */
#define CB_A32_SUM 4
#define CB_AK_QS 4    /* block_q8_K: d, qs[256], bsums[16] */
#define CB_AK_BS 260

/* ---------------------------------------------------------------- float types */

struct cb_f32 {
    static constexpr int BS = 1, TS = 4, ACT = QUANT_ACT_F32, ABS = 4, G = 1, UPD = CB_UPD_FLOAT;
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) { return ((const float *)b)[j]; }
};
struct cb_f16 {
    static constexpr int BS = 1, TS = 2, ACT = QUANT_ACT_F32, ABS = 4, G = 1, UPD = CB_UPD_FLOAT;
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) { return cb_h(b + 2 * j); }
};
struct cb_bf16 {
    static constexpr int BS = 1, TS = 2, ACT = QUANT_ACT_F32, ABS = 4, G = 1, UPD = CB_UPD_FLOAT;
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) { return cb_bf16_to_f32(cb_u16(b + 2 * j)); }
};

/* ---------------------------------------------------------------- 32-element blocks
 * G = 4: part p covers elements 4p..4p+3 and 16+4p..16+4p+3 (q4_0 nibble order; q8_0: 8p..8p+7). */

#define CB_Q32_ENUM(ts, upd) static constexpr int BS = 32, TS = ts, ACT = QUANT_ACT_Q8_32, ABS = CB_A32, G = 4, UPD = upd

/* integer dot of 4 low-element bytes and 4 high-element bytes of part p with each activation */
template <int NT>
static __device__ __forceinline__ void cb_q32_dot(int lo, int hi, const uint8_t *const *a, size_t aoff,
                                                  int p, int *s) {
#pragma unroll
    for (int i = 0; i < NT; i++) {
        const uint8_t *q = a[i] + aoff + CB_A32_QS;
        s[i] = __dp4a(lo, cb_a4(q + 4 * p), __dp4a(hi, cb_a4(q + 16 + 4 * p), s[i]));
    }
}
/* t[i] += the activation block's sum (part 0 only) */
template <int NT>
static __device__ __forceinline__ void cb_q32_sum(const uint8_t *const *a, size_t aoff, int p, int *t) {
    if (p == 0)
#pragma unroll
        for (int i = 0; i < NT; i++) t[i] += cb_a4(a[i] + aoff + CB_A32_SUM);
}

struct cb_q8_0 {
    CB_Q32_ENUM(34, CB_UPD_SYM);
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        return __fmul_rn((float)(int8_t)b[2 + j], cb_h(b));
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_h(b); *m = 0.0f; }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        const int w0 = (int)cb_ld2(b + 2 + 8 * p), w1 = (int)cb_ld2(b + 6 + 8 * p);
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const uint8_t *q = a[i] + aoff + CB_A32_QS + 8 * p;
            s[i] = __dp4a(w0, cb_a4(q), __dp4a(w1, cb_a4(q + 4), s[i]));
        }
    }
};

struct cb_q4_0 {
    CB_Q32_ENUM(18, CB_UPD_SYM);
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
        return __fmul_rn((float)(q - 8), cb_h(b));
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_h(b); *m = 0.0f; }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        const uint32_t v = cb_ld2(b + 2 + 4 * p);
        const int lo = (int)__vsub4(v & 0x0F0F0F0Fu, 0x08080808u);
        const int hi = (int)__vsub4((v >> 4) & 0x0F0F0F0Fu, 0x08080808u);
        cb_q32_dot<NT>(lo, hi, a, aoff, p, s);
    }
};

struct cb_q4_1 {
    CB_Q32_ENUM(20, CB_UPD_AFF);
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        const int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
        return __fadd_rn(__fmul_rn((float)q, cb_h(b)), cb_h(b + 2));
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_h(b); *m = cb_h(b + 2); }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        const uint32_t v = cb_ld4(b + 4 + 4 * p);
        cb_q32_dot<NT>((int)(v & 0x0F0F0F0Fu), (int)((v >> 4) & 0x0F0F0F0Fu), a, aoff, p, s);
        cb_q32_sum<NT>(a, aoff, p, t);
    }
};

struct cb_q5_0 {
    CB_Q32_ENUM(22, CB_UPD_SYM);
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        const uint32_t qh = cb_ld2(b + 2);
        const int q = (j < 16 ? (b[6 + j] & 0xF) : (b[6 + j - 16] >> 4)) | (int)(((qh >> j) & 1u) << 4);
        return __fmul_rn((float)(q - 16), cb_h(b));
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_h(b); *m = 0.0f; }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        const uint32_t qh = cb_ld2(b + 2), v = cb_ld2(b + 6 + 4 * p);
        const int lo = (int)__vsub4((v & 0x0F0F0F0Fu) | cb_bits_to_b4(qh, 4 * p), 0x10101010u);
        const int hi = (int)__vsub4(((v >> 4) & 0x0F0F0F0Fu) | cb_bits_to_b4(qh, 16 + 4 * p), 0x10101010u);
        cb_q32_dot<NT>(lo, hi, a, aoff, p, s);
    }
};

struct cb_q5_1 {
    CB_Q32_ENUM(24, CB_UPD_AFF);
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        const uint32_t qh = cb_ld4(b + 4);
        const int q = (j < 16 ? (b[8 + j] & 0xF) : (b[8 + j - 16] >> 4)) | (int)(((qh >> j) & 1u) << 4);
        return __fadd_rn(__fmul_rn((float)q, cb_h(b)), cb_h(b + 2));
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_h(b); *m = cb_h(b + 2); }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        const uint32_t qh = cb_ld4(b + 4), v = cb_ld4(b + 8 + 4 * p);
        const int lo = (int)((v & 0x0F0F0F0Fu) | cb_bits_to_b4(qh, 4 * p));
        const int hi = (int)(((v >> 4) & 0x0F0F0F0Fu) | cb_bits_to_b4(qh, 16 + 4 * p));
        cb_q32_dot<NT>(lo, hi, a, aoff, p, s);
        cb_q32_sum<NT>(a, aoff, p, t);
    }
};

struct cb_mxfp4 {
    CB_Q32_ENUM(17, CB_UPD_SYM);
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        const int q = j < 16 ? (b[1 + j] & 0xF) : (b[1 + j - 16] >> 4);
        return __fmul_rn((float)cb_mxfp4_val(q), cb_e8m0_half(b[0]));
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_e8m0_half(b[0]); *m = 0.0f; }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        const uint32_t v = cb_ld1(b + 1 + 4 * p);
        cb_q32_dot<NT>(cb_lut16<CB_MXFP4_LUT>(v & 0x0F0F0F0Fu), cb_lut16<CB_MXFP4_LUT>((v >> 4) & 0x0F0F0F0Fu),
                       a, aoff, p, s);
    }
};

struct cb_iq4_nl {
    CB_Q32_ENUM(18, CB_UPD_SYM);
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
        return __fmul_rn(cb_h(b), (float)cb_iq4nl_val(q));
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_h(b); *m = 0.0f; }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        const uint32_t v = cb_ld2(b + 2 + 4 * p);
        cb_q32_dot<NT>(cb_lut16<CB_IQ4NL_LUT>(v & 0x0F0F0F0Fu), cb_lut16<CB_IQ4NL_LUT>((v >> 4) & 0x0F0F0F0Fu),
                       a, aoff, p, s);
    }
};

/* ---------------------------------------------------------------- 256-element super-blocks
 * G = 8 parts of 32 elements each. */

#define CB_QK_ENUM(ts, upd) static constexpr int BS = 256, TS = ts, ACT = QUANT_ACT_Q8_K, ABS = CB_AK, G = 8, UPD = upd

/* Σ over 16 consecutive elements: 4 weight words w[] with activation bytes at q */
static __device__ __forceinline__ int cb_dot16(const int *w, const uint8_t *q) {
    int s = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) s = __dp4a(w[k], cb_a4(q + 4 * k), s);
    return s;
}

/* q4_K / q5_K: part p = bytes qs[16p .. 16p+16): chunk c = p/2 of 64 elements, offset
 * l0 = 16(p&1); low nibbles are elements 64c + l0 + i (sub-block 2c), high nibbles
 * 64c + 32 + l0 + i (sub-block 2c+1). The part also adds mn[p]·(bsums[2p]+bsums[2p+1]) to t. */
template <int NT, bool Q5>
static __device__ __forceinline__ void cb_k45_part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                   int *s, int *t) {
    const uint8_t *qs = b + (Q5 ? 48 : 16) + 16 * p;
    const int c = p >> 1, l0 = 16 * (p & 1);
    int lo[4], hi[4];
    uint32_t q16[4]; /* the part's 16 bytes: one 16-byte load where aligned (rows staged or read
                      * from a 16-aligned array; 144- and 176-byte blocks keep it) */
    if (((uintptr_t)qs & 15) == 0) {
        const uint4 v4 = *(const uint4 *)qs;
        q16[0] = v4.x, q16[1] = v4.y, q16[2] = v4.z, q16[3] = v4.w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) q16[k] = cb_ld4(qs + 4 * k);
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t v = q16[k];
        uint32_t l = v & 0x0F0F0F0Fu, h = (v >> 4) & 0x0F0F0F0Fu;
        if (Q5) {
            const uint32_t qh = cb_ld4(b + 16 + l0 + 4 * k);
            l |= ((qh >> (2 * c)) & 0x01010101u) << 4;
            h |= ((qh >> (2 * c + 1)) & 0x01010101u) << 4;
        }
        lo[k] = (int)l;
        hi[k] = (int)h;
    }
    int sc0, mn0, sc1, mn1, scp, mnp;
    cb_k4_scale_min(2 * c, b + 4, &sc0, &mn0);
    cb_k4_scale_min(2 * c + 1, b + 4, &sc1, &mn1);
    cb_k4_scale_min(p, b + 4, &scp, &mnp);
#pragma unroll
    for (int i = 0; i < NT; i++) {
        const uint8_t *q = a[i] + aoff + CB_AK_QS + 64 * c + l0;
        s[i] += sc0 * cb_dot16(lo, q) + sc1 * cb_dot16(hi, q + 32);
        const uint32_t bs = (uint32_t)cb_a4(a[i] + aoff + CB_AK_BS + 4 * p);
        t[i] += mnp * ((int)(int16_t)(bs & 0xFFFFu) + (int)(int16_t)(bs >> 16));
    }
}

struct cb_q4_K {
    CB_QK_ENUM(144, CB_UPD_KMIN);
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        const int g = j / 64, hiq = (j / 32) & 1, l = j % 32;
        int sc, mn;
        cb_k4_scale_min(2 * g + hiq, b + 4, &sc, &mn);
        const uint8_t byte = b[16 + 32 * g + l];
        const int q = hiq ? (byte >> 4) : (byte & 0xF);
        const float d1 = __fmul_rn(cb_h(b), (float)sc), m1 = __fmul_rn(cb_h(b + 2), (float)mn);
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_h(b); *m = cb_h(b + 2); }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        cb_k45_part<NT, false>(b, p, a, aoff, s, t);
    }
};

struct cb_q5_K {
    CB_QK_ENUM(176, CB_UPD_KMIN);
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        const int g = j / 64, hiq = (j / 32) & 1, l = j % 32;
        int sc, mn;
        cb_k4_scale_min(2 * g + hiq, b + 4, &sc, &mn);
        const uint8_t byte = b[48 + 32 * g + l];
        const int q = (hiq ? (byte >> 4) : (byte & 0xF)) + ((b[16 + l] >> (2 * g + hiq)) & 1 ? 16 : 0);
        const float d1 = __fmul_rn(cb_h(b), (float)sc), m1 = __fmul_rn(cb_h(b + 2), (float)mn);
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_h(b); *m = cb_h(b + 2); }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        cb_k45_part<NT, true>(b, p, a, aoff, s, t);
    }
};

/* q6_K: ql[128] qh[64] scales[16] d. Part p: half h = p/4, l0 = 8(p%4): elements 128h + 32q + l0
 * + i (q = 0..3, i < 8), sub-block 8h + 2q + (p%4)/2. */
struct cb_q6_K {
    CB_QK_ENUM(210, CB_UPD_SYM);
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        const int h = j / 128, r = j % 128, qq = r / 32, l = r % 32;
        const uint8_t lo = b[64 * h + 32 * (qq & 1) + l];
        const int q = (int)(int8_t)(((qq & 2) ? (lo >> 4) : (lo & 0xF)) | (((b[128 + 32 * h + l] >> (2 * qq)) & 3) << 4)) - 32;
        const int sc = (int8_t)b[192 + 8 * h + l / 16 + 2 * qq];
        return __fmul_rn(__fmul_rn(cb_h(b + 208), (float)sc), (float)q);
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_h(b + 208); *m = 0.0f; }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        const int h = p >> 2, l0 = 8 * (p & 3);
        int w[4][2]; /* quarter q, word k */
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const uint32_t A = cb_ld2(b + 64 * h + l0 + 4 * k), B = cb_ld2(b + 64 * h + 32 + l0 + 4 * k);
            const uint32_t Q = cb_ld2(b + 128 + 32 * h + l0 + 4 * k);
            w[0][k] = (int)__vsub4((A & 0x0F0F0F0Fu) | ((Q & 0x03030303u) << 4), 0x20202020u);
            w[1][k] = (int)__vsub4((B & 0x0F0F0F0Fu) | (((Q >> 2) & 0x03030303u) << 4), 0x20202020u);
            w[2][k] = (int)__vsub4(((A >> 4) & 0x0F0F0F0Fu) | (((Q >> 4) & 0x03030303u) << 4), 0x20202020u);
            w[3][k] = (int)__vsub4(((B >> 4) & 0x0F0F0F0Fu) | (((Q >> 6) & 0x03030303u) << 4), 0x20202020u);
        }
        int sc[4];
#pragma unroll
        for (int q = 0; q < 4; q++) sc[q] = (int8_t)b[192 + 8 * h + 2 * q + ((p & 3) >> 1)];
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const uint8_t *qa = a[i] + aoff + CB_AK_QS + 128 * h + l0;
#pragma unroll
            for (int q = 0; q < 4; q++)
                s[i] += sc[q] * __dp4a(w[q][0], cb_a4(qa + 32 * q), __dp4a(w[q][1], cb_a4(qa + 32 * q + 4), 0));
        }
    }
};

/* iq4_xs: d, scales_h (u16), scales_l[4], qs[128]; part p = sub-block p: qs[16p .. 16p+16) in
 * q4_0's nibble order, scale ls - 32. */
struct cb_iq4_xs {
    CB_QK_ENUM(136, CB_UPD_SYM);
    static __device__ __forceinline__ int ls(const uint8_t *b, int ib) {
        return ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (int)(((cb_u16(b + 2) >> (2 * ib)) & 3u) << 4);
    }
    static __device__ __forceinline__ float deq(const uint8_t *b, int j) {
        const int ib = j / 32, l = j % 32;
        const int q = l < 16 ? (b[8 + 16 * ib + l] & 0xF) : (b[8 + 16 * ib + l - 16] >> 4);
        const float dl = __fmul_rn(cb_h(b), (float)(ls(b, ib) - 32));
        return __fmul_rn(dl, (float)cb_iq4nl_val(q));
    }
    static __device__ __forceinline__ void scale(const uint8_t *b, float *d, float *m) { *d = cb_h(b); *m = 0.0f; }
    template <int NT>
    static __device__ __forceinline__ void part(const uint8_t *b, int p, const uint8_t *const *a, size_t aoff,
                                                int *s, int *t) {
        int lo[4], hi[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t v = cb_ld4(b + 8 + 16 * p + 4 * k);
            lo[k] = cb_lut16<CB_IQ4NL_LUT>(v & 0x0F0F0F0Fu);
            hi[k] = cb_lut16<CB_IQ4NL_LUT>((v >> 4) & 0x0F0F0F0Fu);
        }
        const int sc = ls(b, p) - 32;
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const uint8_t *q = a[i] + aoff + CB_AK_QS + 32 * p;
            s[i] += sc * (cb_dot16(lo, q) + cb_dot16(hi, q + 16));
        }
    }
};

/* ---------------------------------------------------------------- the float update */

/* acc of the block (d, m scales, da the activation block's d) after its integer sums s, t */
template <class T>
static __device__ __forceinline__ float cb_update(float acc, float d, float m, float da, int s, int t) {
    acc = __fmaf_rn(__fmul_rn(d, da), (float)s, acc);
    if (T::UPD == CB_UPD_AFF) acc = __fmaf_rn(__fmul_rn(m, da), (float)t, acc);
    if (T::UPD == CB_UPD_KMIN) acc = __fmaf_rn(-__fmul_rn(m, da), (float)t, acc);
    return acc;
}

/* dequantise one block (BS elements) at b into y */
template <class T>
static __device__ __forceinline__ void cb_deq_block(const uint8_t *b, float *y) {
    for (int j = 0; j < T::BS; j++) y[j] = T::deq(b, j);
}

/* Calls F::template run<T>(args...) for the traits of wtype; returns false for an unsupported
 * type. Host-side dispatch helper for launchers. */
#define CB_DISPATCH(wtype, F, ...)                                                       \
    ([&]() -> bool {                                                                     \
        switch (wtype) {                                                                 \
        case HM_TYPE_F32: F<cb_f32>(__VA_ARGS__); return true;                           \
        case HM_TYPE_F16: F<cb_f16>(__VA_ARGS__); return true;                           \
        case HM_TYPE_BF16: F<cb_bf16>(__VA_ARGS__); return true;                         \
        case HM_TYPE_Q8_0: F<cb_q8_0>(__VA_ARGS__); return true;                         \
        case HM_TYPE_Q4_0: F<cb_q4_0>(__VA_ARGS__); return true;                         \
        case HM_TYPE_Q4_1: F<cb_q4_1>(__VA_ARGS__); return true;                         \
        case HM_TYPE_Q5_0: F<cb_q5_0>(__VA_ARGS__); return true;                         \
        case HM_TYPE_Q5_1: F<cb_q5_1>(__VA_ARGS__); return true;                         \
        case HM_TYPE_MXFP4: F<cb_mxfp4>(__VA_ARGS__); return true;                       \
        case HM_TYPE_IQ4_NL: F<cb_iq4_nl>(__VA_ARGS__); return true;                     \
        case HM_TYPE_Q4_K: F<cb_q4_K>(__VA_ARGS__); return true;                         \
        case HM_TYPE_Q5_K: F<cb_q5_K>(__VA_ARGS__); return true;                         \
        case HM_TYPE_Q6_K: F<cb_q6_K>(__VA_ARGS__); return true;                         \
        case HM_TYPE_IQ4_XS: F<cb_iq4_xs>(__VA_ARGS__); return true;                     \
        default: return false;                                                           \
        }                                                                                \
    }())

#endif
