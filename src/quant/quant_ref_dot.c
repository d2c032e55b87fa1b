/* quant_ref_dot.c - the scalar reference of docs/ARITHMETIC.md: activation quantisation
 * (quant_act_quantize_ref) and the canonical weight-row · activation-row dot (quant_dot_ref).
 *
 * DESIGN: this file is the executable form of the spec, written for clarity, not speed. Each
 * weight block type has one function that computes the block's integer sums exactly (int32)
 * and applies the block's float update(s) to its accumulator lane with fmaf, in the order the
 * spec's table gives. quant_dot_ref walks the blocks, feeding block b into lane b % 32, and
 * combines the 32 lanes with the fixed halving tree. Every SIMD and CUDA kernel is tested
 * against these bits. The file is compiled with -ffp-contract=off: every `*` and `+` on floats
 * below is one IEEE operation; fused operations are only the explicit fmaf calls.
 */
#include <math.h>
#include <string.h>

#include "quant/quant.h"
#include "quant/quant_ref_internal.h"

/* ---- activation quantisation (ARITHMETIC.md §1) ---- */

/* q[0..B) of one block of B finite values, returns d. Round-half-even is rintf in the default
 * rounding mode. x*id is NaN only for x = 0 with id = +inf (amax < 127/FLT_MAX): q = 0. */
static float act_block_quantize(const float *x, int B, int8_t *q) {
    float amax = 0.0f;
    for (int i = 0; i < B; i++) {
        const float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < B; i++) {
        const float v = rintf(x[i] * id);
        int qi;
        if (v != v)
            qi = 0;
        else if (v > 127.0f)
            qi = 127;
        else if (v < -127.0f)
            qi = -127;
        else
            qi = (int)v;
        q[i] = (int8_t)qi;
    }
    return d;
}

void quant_act_quantize_ref(quant_act act, const float *x, void *dst, int64_t n) {
    if (n <= 0) return;
    if (act == QUANT_ACT_F32) {
        memcpy(dst, x, (size_t)n * sizeof(float));
    } else if (act == QUANT_ACT_Q8_32) {
        block_q8_32 *y = dst;
        for (int64_t b = 0; b < n / 32; b++, x += 32) {
            y[b].d = act_block_quantize(x, 32, y[b].qs);
            int32_t s = 0;
            for (int i = 0; i < 32; i++) s += y[b].qs[i];
            y[b].sum = s;
        }
    } else if (act == QUANT_ACT_Q8_K) {
        block_q8_K *y = dst;
        for (int64_t b = 0; b < n / HM_QK_K; b++, x += HM_QK_K) {
            y[b].d = act_block_quantize(x, HM_QK_K, y[b].qs);
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int i = 0; i < 16; i++) s += y[b].qs[16 * j + i];
                y[b].bsums[j] = (int16_t)s;
            }
        }
    }
}

/* ---- per-block contributions (ARITHMETIC.md §2) ---- */

/* Updates *acc with the contribution of weight block w and activation block a. */
typedef void (*dot_block_fn)(const void *w, const void *a, float *acc);

/* element j (0..31) of a block stored in q4_0's nibble order */
static inline int nib32(const uint8_t *qs, int j) {
    return j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
}

/* 5-bit value of element j of a q5_0 / q5_1 block */
static inline int q5_value(const uint8_t *qs, const uint8_t qh[4], int j) {
    const uint32_t h = (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) |
                       ((uint32_t)qh[3] << 24);
    return nib32(qs, j) | (int)(((h >> j) & 1) << 4);
}

/* the update shared by the symmetric 32-blocks: acc = fmaf(d·da, (float)s, acc) */
static inline void upd_sym(float d, const block_q8_32 *a, int32_t s, float *acc) {
    *acc = fmaf(d * a->d, (float)s, *acc);
}

static void dot_q8_0(const void *vw, const void *va, float *acc) {
    const block_q8_0 *w = vw;
    const block_q8_32 *a = va;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += w->qs[j] * a->qs[j];
    upd_sym(hm_fp16_to_f32(w->d), a, s, acc);
}

static void dot_q4_0(const void *vw, const void *va, float *acc) {
    const block_q4_0 *w = vw;
    const block_q8_32 *a = va;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (nib32(w->qs, j) - 8) * a->qs[j];
    upd_sym(hm_fp16_to_f32(w->d), a, s, acc);
}

static void dot_q5_0(const void *vw, const void *va, float *acc) {
    const block_q5_0 *w = vw;
    const block_q8_32 *a = va;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (q5_value(w->qs, w->qh, j) - 16) * a->qs[j];
    upd_sym(hm_fp16_to_f32(w->d), a, s, acc);
}

static void dot_iq4_nl(const void *vw, const void *va, float *acc) {
    const block_iq4_nl *w = vw;
    const block_q8_32 *a = va;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += hm_kvalues_iq4nl[nib32(w->qs, j)] * a->qs[j];
    upd_sym(hm_fp16_to_f32(w->d), a, s, acc);
}

static void dot_mxfp4(const void *vw, const void *va, float *acc) {
    const block_mxfp4 *w = vw;
    const block_q8_32 *a = va;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += hm_kvalues_mxfp4[nib32(w->qs, j)] * a->qs[j];
    upd_sym(hm_e8m0_half_to_f32(w->e), a, s, acc);
}

static void dot_q4_1(const void *vw, const void *va, float *acc) {
    const block_q4_1 *w = vw;
    const block_q8_32 *a = va;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += nib32(w->qs, j) * a->qs[j];
    *acc = fmaf(hm_fp16_to_f32(w->d) * a->d, (float)s, *acc);
    *acc = fmaf(hm_fp16_to_f32(w->m) * a->d, (float)a->sum, *acc);
}

static void dot_q5_1(const void *vw, const void *va, float *acc) {
    const block_q5_1 *w = vw;
    const block_q8_32 *a = va;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += q5_value(w->qs, w->qh, j) * a->qs[j];
    *acc = fmaf(hm_fp16_to_f32(w->d) * a->d, (float)s, *acc);
    *acc = fmaf(hm_fp16_to_f32(w->m) * a->d, (float)a->sum, *acc);
}

/* q4_K / q5_K: element 32j + l of sub-block j: 4 low bits from qs[32(j/2) + l] (low nibble for
 * even j, high for odd j), bit 4 (q5_K) is bit j of qh[l]. */
static void dot_k4(const block_q4_K *w4, const block_q5_K *w5, const block_q8_K *a, float *acc) {
    const uint8_t *scales = w4 ? w4->scales : w5->scales;
    const uint8_t *qs = w4 ? w4->qs : w5->qs;
    int32_t s = 0, t = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        quant_k4_scale_min(j, scales, &sc, &mn);
        int32_t sj = 0;
        for (int l = 0; l < 32; l++) {
            const uint8_t byte = qs[32 * (j / 2) + l];
            int q = (j & 1) ? (byte >> 4) : (byte & 0xF);
            if (w5) q |= ((w5->qh[l] >> j) & 1) << 4;
            sj += q * a->qs[32 * j + l];
        }
        s += sc * sj;
        t += mn * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
    const uint16_t d = w4 ? w4->d : w5->d, dmin = w4 ? w4->dmin : w5->dmin;
    *acc = fmaf(hm_fp16_to_f32(d) * a->d, (float)s, *acc);
    *acc = fmaf(-(hm_fp16_to_f32(dmin) * a->d), (float)t, *acc);
}

static void dot_q4_K(const void *vw, const void *va, float *acc) { dot_k4(vw, NULL, va, acc); }

static void dot_q5_K(const void *vw, const void *va, float *acc) { dot_k4(NULL, vw, va, acc); }

/* q6_K: 6-bit value of element e (0..255); layout as in quant_ref_deq.c */
static inline int q6_value(const block_q6_K *w, int e) {
    const int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const uint8_t lo = w->ql[64 * h + 32 * (quarter & 1) + l];
    const int low = (quarter & 2) ? (lo >> 4) : (lo & 0xF);
    const int high = (w->qh[32 * h + l] >> (2 * quarter)) & 3;
    return low | (high << 4);
}

static void dot_q6_K(const void *vw, const void *va, float *acc) {
    const block_q6_K *w = vw;
    const block_q8_K *a = va;
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        int32_t sj = 0;
        for (int i = 16 * j; i < 16 * j + 16; i++) sj += (q6_value(w, i) - 32) * a->qs[i];
        s += w->scales[j] * sj;
    }
    *acc = fmaf(hm_fp16_to_f32(w->d) * a->d, (float)s, *acc);
}

static void dot_iq4_xs(const void *vw, const void *va, float *acc) {
    const block_iq4_xs *w = vw;
    const block_q8_K *a = va;
    int32_t s = 0;
    for (int j = 0; j < 8; j++) {
        int32_t sj = 0;
        for (int l = 0; l < 32; l++)
            sj += hm_kvalues_iq4nl[nib32(w->qs + 16 * j, l)] * a->qs[32 * j + l];
        s += (quant_iq4xs_ls(w->scales_l, w->scales_h, j) - 32) * sj;
    }
    *acc = fmaf(hm_fp16_to_f32(w->d) * a->d, (float)s, *acc);
}

static const dot_block_fn k_dot_block[HM_TYPE_COUNT] = {
    [HM_TYPE_Q4_0] = dot_q4_0,     [HM_TYPE_Q4_1] = dot_q4_1,     [HM_TYPE_Q5_0] = dot_q5_0,
    [HM_TYPE_Q5_1] = dot_q5_1,     [HM_TYPE_Q8_0] = dot_q8_0,     [HM_TYPE_MXFP4] = dot_mxfp4,
    [HM_TYPE_IQ4_NL] = dot_iq4_nl, [HM_TYPE_Q4_K] = dot_q4_K,     [HM_TYPE_Q5_K] = dot_q5_K,
    [HM_TYPE_Q6_K] = dot_q6_K,     [HM_TYPE_IQ4_XS] = dot_iq4_xs,
};

void quant_ref_dot_block(uint32_t wtype, const void *w, const void *act, float *acc) {
    k_dot_block[wtype](w, act, acc);
}

/* ---- combining the lanes (ARITHMETIC.md §3) ---- */

static float lanes_combine(float acc[32]) {
    for (int s = 16; s >= 1; s /= 2)
        for (int i = 0; i < s; i++) acc[i] = acc[i] + acc[i + s];
    return acc[0];
}

/* element i of a float-type row, converted exactly */
static inline float float_weight(uint32_t wtype, const void *w, int64_t i) {
    if (wtype == HM_TYPE_F32) return ((const float *)w)[i];
    if (wtype == HM_TYPE_F16) return hm_fp16_to_f32(((const hm_fp16 *)w)[i]);
    return hm_bf16_to_f32(((const hm_bf16 *)w)[i]);
}

float quant_dot_ref(uint32_t wtype, int64_t n, const void *w, const void *act) {
    const quant_act at = quant_act_for(wtype);
    if (at == QUANT_ACT_COUNT || n < 0) return NAN;
    float acc[32];
    for (int l = 0; l < 32; l++) acc[l] = 0.0f;
    if (at == QUANT_ACT_F32) {
        const float *x = act;
        for (int64_t i = 0; i < n; i++)
            acc[i % 32] = fmaf(float_weight(wtype, w, i), x[i], acc[i % 32]);
        return lanes_combine(acc);
    }
    const hm_type_info *ti = hm_type_get(wtype);
    const size_t abytes = at == QUANT_ACT_Q8_32 ? sizeof(block_q8_32) : sizeof(block_q8_K);
    const int64_t nb = n / ti->block_size;
    const char *wb = w, *ab = act;
    for (int64_t b = 0; b < nb; b++)
        k_dot_block[wtype](wb + (size_t)b * (size_t)ti->type_size, ab + (size_t)b * abytes,
                           &acc[b % 32]);
    return lanes_combine(acc);
}
