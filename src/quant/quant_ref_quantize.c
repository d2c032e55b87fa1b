/* quant_ref_quantize.c - quant_quantize_row: floats -> blocks of every supported type, for
 * `forge` and the tests.
 *
 * DESIGN: unlike dequantisation and the dot product, quantisation is not part of the canonical
 * arithmetic: any encoder whose blocks decode close to the input is valid, so these aim for
 * low error at high speed (forge quantises billions of weights):
 *  - q8_0 q4_0 q4_1 q5_0 q5_1: ggml's reference quantisers (scale from the block max / range).
 *  - q4_K q5_K: per 32-element sub-block a (scale, min) fit: min/max start, then up to three
 *    rounds of "assign quants, least-squares (scale, min) for them" (unit weights; about 3%
 *    lower error than min/max alone, ~3% above ggml's 20-candidate search at several times its
 *    speed); the sub-block scales/mins are then quantised to 6 bits against the super-block
 *    d/dmin (fp16) and the elements re-quantised with the scales actually stored.
 *  - q6_K: per 16-element sub-block a least-squares symmetric scale over a few candidates,
 *    8-bit sub-block scales against the super-block d, then re-quantisation.
 *  - iq4_nl iq4_xs: the best least-squares scale among candidates that map the block's extreme
 *    to either end of the non-linear grid; iq4_xs quantises the sub-block scales to 6 bits.
 *  - mxfp4: E8M0 exponent chosen so the block max fits in ±6 (and one finer candidate that may
 *    clip, kept if its error is lower), elements to the nearest grid value.
 *  - f16 bf16: round to nearest even. q8_K: the activation quantiser (ARITHMETIC.md §1).
 */
#include <math.h>
#include <string.h>

#include "quant/quant.h"
#include "quant/quant_ref_internal.h"

/* ---- 32-element blocks (ggml's reference quantisers) ---- */

/* the value with the largest magnitude (signed) and that magnitude */
static inline float block_absmax(const float *x, int n, float *signed_max) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), mx = x[j];
    *signed_max = mx;
    return amax;
}

static void qz_q8_0(const float *x, void *vy, int64_t nb) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float mx;
        const float amax = block_absmax(x, 32, &mx);
        const float d = amax / 127.0f, id = quant_safe_inv(d);
        y[i].d = hm_f32_to_fp16(d);
        for (int j = 0; j < 32; j++)
            y[i].qs[j] = (int8_t)quant_clampi((int)roundf(x[j] * id), -127, 127); /* ggml: ties away */
    }
}

static void qz_q4_0(const float *x, void *vy, int64_t nb) {
    block_q4_0 *y = vy;
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float mx;
        block_absmax(x, 32, &mx);
        const float d = mx / -8.0f, id = quant_safe_inv(d);
        y[i].d = hm_f32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            const int q0 = quant_clampi((int)(x[j] * id + 8.5f), 0, 15);
            const int q1 = quant_clampi((int)(x[j + 16] * id + 8.5f), 0, 15);
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void qz_q5_0(const float *x, void *vy, int64_t nb) {
    block_q5_0 *y = vy;
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float mx;
        block_absmax(x, 32, &mx);
        const float d = mx / -16.0f, id = quant_safe_inv(d);
        y[i].d = hm_f32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const int q0 = quant_clampi((int)(x[j] * id + 16.5f), 0, 31);
            const int q1 = quant_clampi((int)(x[j + 16] * id + 16.5f), 0, 31);
            y[i].qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        for (int k = 0; k < 4; k++) y[i].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

/* q4_1 / q5_1: x = q * d + m with m the block min; nmax = 15 or 31 */
static void qz_qx_1(const float *x, int nmax, hm_fp16 *dd, hm_fp16 *mm, uint8_t *qs, uint8_t *qh) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) mn = x[j] < mn ? x[j] : mn, mx = x[j] > mx ? x[j] : mx;
    const float d = (mx - mn) / (float)nmax, id = quant_safe_inv(d);
    *dd = hm_f32_to_fp16(d);
    *mm = hm_f32_to_fp16(mn);
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        const int q0 = quant_clampi((int)((x[j] - mn) * id + 0.5f), 0, nmax);
        const int q1 = quant_clampi((int)((x[j + 16] - mn) * id + 0.5f), 0, nmax);
        qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
        h |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
    }
    if (qh)
        for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

static void qz_q4_1(const float *x, void *vy, int64_t nb) {
    block_q4_1 *y = vy;
    for (int64_t i = 0; i < nb; i++, x += 32) qz_qx_1(x, 15, &y[i].d, &y[i].m, y[i].qs, NULL);
}

static void qz_q5_1(const float *x, void *vy, int64_t nb) {
    block_q5_1 *y = vy;
    for (int64_t i = 0; i < nb; i++, x += 32) qz_qx_1(x, 31, &y[i].d, &y[i].m, y[i].qs, y[i].qh);
}

/* ---- non-linear grids ---- */

/* index of the iq4_nl grid value nearest to v: the number of midpoints between consecutive
 * grid values (kvalues_iq4nl[j] + kvalues_iq4nl[j+1]) / 2 that lie below v, found by a
 * branch-free binary search over the 15 midpoints (ties go to the lower value) */
static inline int iq4_index(float v) {
    static const float mid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                  7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};
    int i = (v > mid[7]) << 3;
    i += (v > mid[i + 3]) << 2;
    i += (v > mid[i + 1]) << 1;
    i += v > mid[i];
    return i;
}

/* Best least-squares scale of n values on the iq4_nl grid (x ≈ scale * kvalues[L]); candidates
 * map the extreme value to the grid's negative end (-127) or positive end (113), ±ntry. */
static float iq4_fit(const float *x, int n, int ntry) {
    float mx;
    const float amax = block_absmax(x, n, &mx);
    if (amax < 1e-30f) return 0.0f;
    float best_d = 0.0f, best = -1.0f;
    for (int end = 0; end < 2; end++) {
        const float target = end ? 113.0f : -127.0f, dir = end ? -1.0f : 1.0f;
        for (int t = -ntry; t <= ntry; t++) {
            const float id = (target + dir * (float)t) / mx;
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int j = 0; j < n; j++) {
                const float q = (float)hm_kvalues_iq4nl[iq4_index(x[j] * id)];
                sumqx += q * x[j];
                sumq2 += q * q;
            }
            /* least-squares d = sumqx/sumq2 reduces the error by sumqx^2/sumq2 */
            if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
                best_d = sumqx / sumq2;
                best = best_d * sumqx;
            }
        }
    }
    return best_d;
}

static void iq4_assign(const float *x, int n, float d, uint8_t *L) {
    const float id = quant_safe_inv(d);
    for (int j = 0; j < n; j++) L[j] = (uint8_t)(d != 0.0f ? iq4_index(x[j] * id) : 8);
}

static void pack_nibbles32(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

static void qz_iq4_nl(const float *x, void *vy, int64_t nb) {
    block_iq4_nl *y = vy;
    uint8_t L[32];
    for (int64_t i = 0; i < nb; i++, x += 32) {
        y[i].d = hm_f32_to_fp16(iq4_fit(x, 32, 3));
        iq4_assign(x, 32, hm_fp16_to_f32(y[i].d), L);
        pack_nibbles32(L, y[i].qs);
    }
}

static void qz_iq4_xs(const float *x, void *vy, int64_t nb) {
    block_iq4_xs *y = vy;
    uint8_t L[32];
    for (int64_t i = 0; i < nb; i++, x += HM_QK_K) {
        float s[8], smax = 0.0f, amax = 0.0f;
        for (int ib = 0; ib < 8; ib++) {
            s[ib] = iq4_fit(x + 32 * ib, 32, 3);
            if (fabsf(s[ib]) > amax) amax = fabsf(s[ib]), smax = s[ib];
        }
        const float d = -smax / 32.0f, id = quant_safe_inv(d);
        y[i].d = hm_f32_to_fp16(d);
        const float d16 = hm_fp16_to_f32(y[i].d);
        y[i].scales_h = 0;
        memset(y[i].scales_l, 0, sizeof(y[i].scales_l));
        for (int ib = 0; ib < 8; ib++) {
            const int l = quant_clampi(quant_nearest_int(id * s[ib]), -32, 31);
            const int ls = l + 32;
            y[i].scales_l[ib / 2] |= (uint8_t)((ls & 0xF) << (4 * (ib % 2)));
            y[i].scales_h |= (uint16_t)((ls >> 4) << (2 * ib));
            iq4_assign(x + 32 * ib, 32, d16 * (float)l, L);
            pack_nibbles32(L, y[i].qs + 16 * ib);
        }
    }
}

/* index (0..7) of the positive mxfp4 grid {0,1,2,3,4,6,8,12} nearest to v >= 0 */
static inline int mxfp4_index(float v) {
    static const float mid[7] = {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f};
    int k = 0;
    for (int t = 0; t < 7; t++) k += v > mid[t];
    return k;
}

/* squared error of the block with exponent e; writes the 4-bit codes into L */
static float mxfp4_encode(const float *x, int e, uint8_t *L) {
    const float d = hm_e8m0_half_to_f32((uint8_t)e);
    float err = 0.0f;
    for (int j = 0; j < 32; j++) {
        const int k = mxfp4_index(fabsf(x[j]) / d);
        L[j] = (uint8_t)(k | (x[j] < 0.0f && k ? 8 : 0));
        const float r = (float)hm_kvalues_mxfp4[L[j]] * d - x[j];
        err += r * r;
    }
    return err;
}

static void qz_mxfp4(const float *x, void *vy, int64_t nb) {
    block_mxfp4 *y = vy;
    uint8_t L[32], L2[32];
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float mx;
        const float amax = block_absmax(x, 32, &mx);
        int e = 0;
        if (amax > 0.0f) {
            /* smallest e with amax <= 6 * 2^(e-127) = 12 * 2^(e-128) */
            int k;
            frexpf(amax / 6.0f, &k);
            e = quant_clampi(k + 127, 0, 254);
            while (e > 0 && amax <= 12.0f * hm_e8m0_half_to_f32((uint8_t)(e - 1))) e--;
            while (e < 254 && amax > 12.0f * hm_e8m0_half_to_f32((uint8_t)e)) e++;
        }
        float err = mxfp4_encode(x, e, L);
        if (e > 0 && mxfp4_encode(x, e - 1, L2) < err) {
            e--;
            memcpy(L, L2, sizeof(L));
        }
        y[i].e = (uint8_t)e;
        pack_nibbles32(L, y[i].qs);
    }
}

/* ---- float types ---- */

static void qz_f32(const float *x, void *vy, int64_t n) {
    memcpy(vy, x, (size_t)n * sizeof(float));
}

static void qz_f16(const float *x, void *vy, int64_t n) {
    hm_fp16 *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = hm_f32_to_fp16(x[i]);
}

static void qz_bf16(const float *x, void *vy, int64_t n) {
    hm_bf16 *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = hm_f32_to_bf16(x[i]);
}

static void qz_q8_K(const float *x, void *vy, int64_t nb) {
    quant_act_quantize_ref(QUANT_ACT_Q8_K, x, vy, nb * HM_QK_K);
}

/* Quantises nb blocks (or elements, for float types). */
typedef void (*qz_fn)(const float *x, void *y, int64_t nb);

static const qz_fn k_qz[HM_TYPE_COUNT] = {
    [HM_TYPE_F32] = qz_f32,
    [HM_TYPE_F16] = qz_f16,
    [HM_TYPE_BF16] = qz_bf16,
    [HM_TYPE_Q4_0] = qz_q4_0,
    [HM_TYPE_Q4_1] = qz_q4_1,
    [HM_TYPE_Q5_0] = qz_q5_0,
    [HM_TYPE_Q5_1] = qz_q5_1,
    [HM_TYPE_Q8_0] = qz_q8_0,
    [HM_TYPE_MXFP4] = qz_mxfp4,
    [HM_TYPE_IQ4_NL] = qz_iq4_nl,
    [HM_TYPE_Q4_K] = quant_ref_qz_q4_K,
    [HM_TYPE_Q5_K] = quant_ref_qz_q5_K,
    [HM_TYPE_Q6_K] = quant_ref_qz_q6_K,
    [HM_TYPE_Q8_K] = qz_q8_K,
    [HM_TYPE_IQ4_XS] = qz_iq4_xs,
};

hm_status quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    const hm_type_info *ti = hm_type_get(type);
    if (!ti || !k_qz[type]) return HM_ERR_UNSUPPORTED;
    if (n < 0 || n % ti->block_size) return HM_ERR_ARG;
    if (n == 0) return HM_OK;
    if (!src || !dst) return HM_ERR_ARG;
    if (ti->block_size > 1) /* a NaN or inf would poison a whole block's scale */
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(src[i])) return HM_ERR_RANGE;
    k_qz[type](src, dst, n / ti->block_size);
    return HM_OK;
}
