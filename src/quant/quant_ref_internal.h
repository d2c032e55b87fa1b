/* quant_ref_internal.h - internal helpers shared by the scalar reference files (and usable by the
 * SIMD files): ggml's 6-bit scale unpacking and the per-type block walk.
 *
 * Nothing here is part of the public contract (quant.h is). */
#ifndef HM_QUANT_QUANT_REF_INTERNAL_H
#define HM_QUANT_QUANT_REF_INTERNAL_H

#include <stdint.h>
#include <string.h>

/* ggml's get_scale_min_k4: scale and min of sub-block j (0..7) of a q4_K / q5_K block.
 * scales[0..3] low 6 bits: sc[0..3]; scales[4..7] low 6 bits: mn[0..3];
 * scales[8..11]: low nibble sc[4..7] low bits, high nibble mn[4..7] low bits; the top two bits
 * of scales[0..3] are sc[4..7] bits 4-5 and those of scales[4..7] are mn[4..7] bits 4-5. */
static inline void quant_k4_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *mn = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
        *mn = (uint8_t)((scales[j + 4] >> 4) | ((scales[j - 0] >> 6) << 4));
    }
}

/* iq4_xs: the 6-bit scale ls (0..63) of sub-block ib (0..7); the value used is ls - 32. */
static inline int quant_iq4xs_ls(const uint8_t *scales_l, uint16_t scales_h, int ib) {
    return ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
}

/* Nearest integer (ties to even) for |v| < 2^22, the magic-number way (no libm call). */
static inline int quant_nearest_int(float v) {
    float f = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &f, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* 1/d, or 0 where d is 0 or so small that 1/d overflows */
static inline float quant_safe_inv(float d) {
    const float r = d != 0.0f ? 1.0f / d : 0.0f;
    return r - r == 0.0f ? r : 0.0f;
}

static inline int quant_clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* One block's product of a quantised type into its lane accumulator *acc (docs/ARITHMETIC.md
 * §2: the integer sums, then the fmaf update; quant_ref_dot.c). */
void quant_ref_dot_block(uint32_t wtype, const void *w, const void *act, float *acc);

/* K-quant quantisers (quant_ref_quantize_k.c): nb super-blocks of 256 floats -> y. */
void quant_ref_qz_q4_K(const float *x, void *y, int64_t nb);
void quant_ref_qz_q5_K(const float *x, void *y, int64_t nb);
void quant_ref_qz_q6_K(const float *x, void *y, int64_t nb);

#endif
