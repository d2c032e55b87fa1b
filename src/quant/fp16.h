/* fp16.h - exact conversions between float and the 16-bit formats of GGUF (IEEE half, bfloat16)
 * and the E8M0 scale of MXFP4. Plain C so that the scalar reference, the SIMD kernels and the
 * tests agree on every bit; SIMD code may use F16C/AVX-512 instructions, which round the same
 * way (to nearest, ties to even). */
#ifndef HM_QUANT_FP16_H
#define HM_QUANT_FP16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t hm_fp16;
typedef uint16_t hm_bf16;

static inline float hm_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t hm_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float hm_fp16_to_f32(hm_fp16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    /* inf, or NaN made quiet with its payload kept (as F16C's vcvtph2ps and ggml do) */
    if (exp == 0x1f) return hm_bits_to_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0));
    if (exp == 0) {
        if (man == 0) return hm_bits_to_f32(sign);
        /* subnormal half: man * 2^-24, exact in float */
        float f = (float)man * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    return hm_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

/* Round to nearest, ties to even; overflow gives inf; NaN stays NaN. */
static inline hm_fp16 hm_f32_to_fp16(float f) {
    uint32_t x = hm_f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (hm_fp16)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (hm_fp16)(sign | 0x7c00); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                  /* result is subnormal or zero */
        /* value * 2^24 rounded to an integer, ties to even */
        float v = hm_bits_to_f32(ax) * 16777216.0f;
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1))) m++;
        return (hm_fp16)(sign | m);
    }
    uint32_t r = ax + 0x0fffu + ((ax >> 13) & 1); /* round mantissa to 10 bits */
    return (hm_fp16)(sign | ((r - 0x38000000u) >> 13));
}

static inline float hm_bf16_to_f32(hm_bf16 h) { return hm_bits_to_f32((uint32_t)h << 16); }

static inline hm_bf16 hm_f32_to_bf16(float f) {
    uint32_t x = hm_f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (hm_bf16)((x >> 16) | 0x40); /* quiet NaN */
    return (hm_bf16)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* MXFP4's E8M0 scale e stands for 2^(e-127); hotmoe (like ggml) stores the 4-bit values
 * doubled as integers, so the block scale used in arithmetic is half of that: 2^(e-128),
 * exact in float (a subnormal for e < 2). */
static inline float hm_e8m0_half_to_f32(uint8_t e) {
    uint32_t bits = e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23);
    return hm_bits_to_f32(bits);
}

#endif
