/* quant_ref_deq.c - quant_dequantize_row: the value of every element of every supported type.
 *
 * DESIGN: one small function per block format, each a transcription of ggml's dequantize_row_*
 * (ggml-quants.c) with the float expressions in the same order and association, so that with
 * -ffp-contract=off the results are bit-identical to ggml's reference path. A table indexed by
 * type id picks the function; types without one (and unknown ids) are HM_ERR_UNSUPPORTED.
 * `src` must be aligned as the type's block struct (GGUF data always is).
 */
#include <string.h>

#include "quant/quant.h"
#include "quant/quant_ref_internal.h"

/* Dequantises nb consecutive blocks (or elements, for float types) of x into y. */
typedef void (*deq_fn)(const void *x, float *y, int64_t nb);

static void deq_f32(const void *vx, float *y, int64_t nb) {
    memcpy(y, vx, (size_t)nb * sizeof(float));
}

static void deq_f16(const void *vx, float *y, int64_t nb) {
    const hm_fp16 *x = vx;
    for (int64_t i = 0; i < nb; i++) y[i] = hm_fp16_to_f32(x[i]);
}

static void deq_bf16(const void *vx, float *y, int64_t nb) {
    const hm_bf16 *x = vx;
    for (int64_t i = 0; i < nb; i++) y[i] = hm_bf16_to_f32(x[i]);
}

/* q4_0: y = (q - 8) * d; low nibble of qs[j] is element j, high nibble element j + 16 */
static void deq_q4_0(const void *vx, float *y, int64_t nb) {
    const block_q4_0 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = hm_fp16_to_f32(x[i].d);
        for (int j = 0; j < 16; j++) {
            const int x0 = (x[i].qs[j] & 0x0F) - 8;
            const int x1 = (x[i].qs[j] >> 4) - 8;
            y[j] = (float)x0 * d;
            y[j + 16] = (float)x1 * d;
        }
    }
}

/* q4_1: y = q * d + m */
static void deq_q4_1(const void *vx, float *y, int64_t nb) {
    const block_q4_1 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = hm_fp16_to_f32(x[i].d);
        const float m = hm_fp16_to_f32(x[i].m);
        for (int j = 0; j < 16; j++) {
            const int x0 = x[i].qs[j] & 0x0F;
            const int x1 = x[i].qs[j] >> 4;
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        }
    }
}

/* bit 4 of element j (0..31) of a q5_0 / q5_1 block is bit j of the little-endian qh */
static inline uint32_t q5_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) |
           ((uint32_t)qh[3] << 24);
}

/* q5_0: y = (q - 16) * d */
static void deq_q5_0(const void *vx, float *y, int64_t nb) {
    const block_q5_0 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = hm_fp16_to_f32(x[i].d);
        const uint32_t qh = q5_qh(x[i].qh);
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) << 4) & 0x10;
            const int h1 = (int)(qh >> (j + 12)) & 0x10;
            const int x0 = ((x[i].qs[j] & 0x0F) | h0) - 16;
            const int x1 = ((x[i].qs[j] >> 4) | h1) - 16;
            y[j] = (float)x0 * d;
            y[j + 16] = (float)x1 * d;
        }
    }
}

/* q5_1: y = q * d + m */
static void deq_q5_1(const void *vx, float *y, int64_t nb) {
    const block_q5_1 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = hm_fp16_to_f32(x[i].d);
        const float m = hm_fp16_to_f32(x[i].m);
        const uint32_t qh = q5_qh(x[i].qh);
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) << 4) & 0x10;
            const int h1 = (int)(qh >> (j + 12)) & 0x10;
            const int x0 = (x[i].qs[j] & 0x0F) | h0;
            const int x1 = (x[i].qs[j] >> 4) | h1;
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        }
    }
}

/* q8_0: y = q * d */
static void deq_q8_0(const void *vx, float *y, int64_t nb) {
    const block_q8_0 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = hm_fp16_to_f32(x[i].d);
        for (int j = 0; j < 32; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

/* mxfp4: y = kvalues_mxfp4[q] * 2^(e-128) */
static void deq_mxfp4(const void *vx, float *y, int64_t nb) {
    const block_mxfp4 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = hm_e8m0_half_to_f32(x[i].e);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)hm_kvalues_mxfp4[x[i].qs[j] & 0x0F] * d;
            y[j + 16] = (float)hm_kvalues_mxfp4[x[i].qs[j] >> 4] * d;
        }
    }
}

/* iq4_nl: y = d * kvalues_iq4nl[q] */
static void deq_iq4_nl(const void *vx, float *y, int64_t nb) {
    const block_iq4_nl *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = hm_fp16_to_f32(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)hm_kvalues_iq4nl[x[i].qs[j] & 0x0F];
            y[j + 16] = d * (float)hm_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

/* q4_K: four 64-element groups; qs[32g + l] holds element 64g + l (low nibble, sub-block 2g)
 * and 64g + 32 + l (high nibble, sub-block 2g + 1). y = (d * sc) * q - (dmin * m). */
static void deq_q4_K(const void *vx, float *y, int64_t nb) {
    const block_q4_K *x = vx;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q = x[i].qs;
        const float d = hm_fp16_to_f32(x[i].d);
        const float dmin = hm_fp16_to_f32(x[i].dmin);
        for (int g = 0; g < 4; g++, q += 32) {
            uint8_t sc, m;
            quant_k4_scale_min(2 * g, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            quant_k4_scale_min(2 * g + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

/* q5_K: as q4_K with a fifth bit: bit 2g of qh[l] for element 64g + l, bit 2g+1 for
 * element 64g + 32 + l. */
static void deq_q5_K(const void *vx, float *y, int64_t nb) {
    const block_q5_K *x = vx;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = hm_fp16_to_f32(x[i].d);
        const float dmin = hm_fp16_to_f32(x[i].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int g = 0; g < 4; g++, ql += 32, u1 = (uint8_t)(u1 << 2), u2 = (uint8_t)(u2 << 2)) {
            uint8_t sc, m;
            quant_k4_scale_min(2 * g, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            quant_k4_scale_min(2 * g + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

/* q6_K: two 128-element halves; in half h, for l < 32: ql[64h + l] low/high nibble are the low
 * 4 bits of elements 128h + l / 128h + 64 + l, ql[64h + 32 + l] those of 128h + 32 + l /
 * 128h + 96 + l; qh[32h + l] bits 0-1, 2-3, 4-5, 6-7 are the high 2 bits of elements
 * 128h + l, +32, +64, +96. Sub-block of 16 s has scale scales[s]. y = d * scale * (q - 32). */
static void deq_q6_K(const void *vx, float *y, int64_t nb) {
    const block_q6_K *x = vx;
    for (int64_t i = 0; i < nb; i++) {
        const float d = hm_fp16_to_f32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

/* q8_K: y = d * q */
static void deq_q8_K(const void *vx, float *y, int64_t nb) {
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < nb; i++, y += HM_QK_K)
        for (int j = 0; j < HM_QK_K; j++) y[j] = x[i].d * (float)x[i].qs[j];
}

/* iq4_xs: sub-block ib of 32 uses qs[16ib .. 16ib+15] in q4_0's nibble order;
 * y = (d * (ls - 32)) * kvalues_iq4nl[q] */
static void deq_iq4_xs(const void *vx, float *y, int64_t nb) {
    const block_iq4_xs *x = vx;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *qs = x[i].qs;
        const float d = hm_fp16_to_f32(x[i].d);
        for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
            const int ls = quant_iq4xs_ls(x[i].scales_l, x[i].scales_h, ib);
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)hm_kvalues_iq4nl[qs[j] & 0xf];
                y[j + 16] = dl * (float)hm_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

static const deq_fn k_deq[HM_TYPE_COUNT] = {
    [HM_TYPE_F32] = deq_f32,       [HM_TYPE_F16] = deq_f16,   [HM_TYPE_BF16] = deq_bf16,
    [HM_TYPE_Q4_0] = deq_q4_0,     [HM_TYPE_Q4_1] = deq_q4_1, [HM_TYPE_Q5_0] = deq_q5_0,
    [HM_TYPE_Q5_1] = deq_q5_1,     [HM_TYPE_Q8_0] = deq_q8_0, [HM_TYPE_MXFP4] = deq_mxfp4,
    [HM_TYPE_IQ4_NL] = deq_iq4_nl, [HM_TYPE_Q4_K] = deq_q4_K, [HM_TYPE_Q5_K] = deq_q5_K,
    [HM_TYPE_Q6_K] = deq_q6_K,     [HM_TYPE_Q8_K] = deq_q8_K, [HM_TYPE_IQ4_XS] = deq_iq4_xs,
};

hm_status quant_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const hm_type_info *ti = hm_type_get(type);
    if (!ti || !k_deq[type]) return HM_ERR_UNSUPPORTED;
    if (n < 0 || n % ti->block_size) return HM_ERR_ARG;
    if (n == 0) return HM_OK;
    if (!src || !dst) return HM_ERR_ARG;
    k_deq[type](src, dst, n / ti->block_size);
    return HM_OK;
}
