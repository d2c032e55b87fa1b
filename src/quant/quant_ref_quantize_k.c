/* quant_ref_quantize_k.c - quantisers of the K-quant weight types q4_K, q5_K, q6_K (see the
 * DESIGN paragraph of quant_ref_quantize.c for the methods; this file only holds the K-quants).
 *
 * Sub-block fits use unit weights (they minimise the plain squared error) and compute each
 * round's error in closed form from the sums of the least-squares fit, so a round costs one
 * pass over the sub-block.
 */
#include <math.h>
#include <string.h>

#include "quant/quant.h"
#include "quant/quant_ref_internal.h"

/* refinement rounds after the min/max start (each: assign L, then least-squares fit); part of
 * the quantiser's output: forged q*_K models, and so the golden logits, depend on it */
enum { K_REFINE = 3 };

/* Fits x[0..n) (n a multiple of 4) ≈ scale * L - moff with L in 0..nmax and moff >= 0 (the
 * offset is the sub-block min clipped to <= 0, as in ggml). Starts from the min/max quantiser,
 * then alternates: assign L for the current (scale, offset), least-squares (scale, offset) for
 * that L; keeps the fit of lowest error. Returns scale (>= 0), sets *moff. */
static float fit_scale_min(const float *x, int n, int nmax, float *moff) {
    float mn = x[0], mx = x[0], psx[4] = {0.0f, 0.0f, 0.0f, 0.0f},
          psx2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < n; j += 4)
        for (int k = 0; k < 4; k++) {
            const float v = x[j + k];
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
            psx[k] += v;
            psx2[k] += v * v;
        }
    const float sx = (psx[0] + psx[1]) + (psx[2] + psx[3]);
    const float sx2 = (psx2[0] + psx2[1]) + (psx2[2] + psx2[3]);
    if (mn > 0.0f) mn = 0.0f;
    if (!(mx - mn > 1e-30f)) {
        *moff = -mn;
        return 0.0f;
    }
    float best_err = INFINITY, best_scale = (mx - mn) / (float)nmax, best_min = mn;
    const float fn = (float)n;
    float iscale = (float)nmax / (mx - mn), off = mn;
    for (int round = 0; round <= K_REFINE; round++) {
        /* integer sums are exact; Σ l·x in 4 partial sums to break the dependency chain */
        int isl = 0, isl2 = 0;
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int j = 0; j < n; j += 4)
            for (int k = 0; k < 4; k++) {
                const int l = quant_clampi(quant_nearest_int(iscale * (x[j + k] - off)), 0, nmax);
                isl += l;
                isl2 += l * l;
                p[k] += (float)l * x[j + k];
            }
        const float sl = (float)isl, sl2 = (float)isl2, sxl = (p[0] + p[1]) + (p[2] + p[3]);
        const float D = fn * sl2 - sl * sl;
        if (!(D > 0.0f)) break;
        float s = (fn * sxl - sx * sl) / D, m = (sl2 * sx - sl * sxl) / D;
        if (m > 0.0f) {
            m = 0.0f;
            s = sxl / sl2;
        }
        if (!(s > 0.0f)) break;
        const float err =
            sx2 + s * s * sl2 + fn * m * m - 2.0f * s * sxl - 2.0f * m * sx + 2.0f * s * m * sl;
        if (err < best_err) {
            best_err = err;
            best_scale = s;
            best_min = m;
        } else {
            break; /* no improvement: the alternation has converged */
        }
        iscale = 1.0f / best_scale;
        off = best_min;
    }
    *moff = -best_min;
    return best_scale;
}

/* Shared by q4_K and q5_K: fits the 8 sub-blocks, stores d, dmin and the packed 6-bit scales,
 * and writes the element values L[0..256) (0..nmax) quantised with the stored scales. */
static void k4_super_block(const float *x, int nmax, hm_fp16 *d, hm_fp16 *dmin, uint8_t scales[12],
                           uint8_t L[HM_QK_K]) {
    float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 8; j++) {
        sc[j] = fit_scale_min(x + 32 * j, 32, nmax, &mn[j]);
        max_sc = sc[j] > max_sc ? sc[j] : max_sc;
        max_mn = mn[j] > max_mn ? mn[j] : max_mn;
    }
    const float inv_sc = max_sc > 0.0f ? 63.0f / max_sc : 0.0f;
    const float inv_mn = max_mn > 0.0f ? 63.0f / max_mn : 0.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)quant_clampi(quant_nearest_int(inv_sc * sc[j]), 0, 63);
        lm[j] = (uint8_t)quant_clampi(quant_nearest_int(inv_mn * mn[j]), 0, 63);
    }
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            scales[j] = ls[j];
            scales[j + 4] = lm[j];
        } else {
            scales[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            scales[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            scales[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    *d = hm_f32_to_fp16(max_sc / 63.0f);
    *dmin = hm_f32_to_fp16(max_mn / 63.0f);
    const float df = hm_fp16_to_f32(*d), dminf = hm_fp16_to_f32(*dmin);
    for (int j = 0; j < 8; j++) {
        const float dq = df * (float)ls[j], dm = dminf * (float)lm[j];
        const float idq = quant_safe_inv(dq);
        for (int l = 0; l < 32; l++)
            L[32 * j + l] =
                (uint8_t)quant_clampi(quant_nearest_int((x[32 * j + l] + dm) * idq), 0, nmax);
    }
}

void quant_ref_qz_q4_K(const float *x, void *vy, int64_t nb) {
    block_q4_K *y = vy;
    uint8_t L[HM_QK_K];
    for (int64_t i = 0; i < nb; i++, x += HM_QK_K) {
        k4_super_block(x, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        /* group g: qs[32g + l] = element 64g + l (low nibble) | element 64g + 32 + l (high) */
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * g + l] = (uint8_t)(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
    }
}

void quant_ref_qz_q5_K(const float *x, void *vy, int64_t nb) {
    block_q5_K *y = vy;
    uint8_t L[HM_QK_K];
    for (int64_t i = 0; i < nb; i++, x += HM_QK_K) {
        k4_super_block(x, 31, &y[i].d, &y[i].dmin, y[i].scales, L);
        memset(y[i].qh, 0, sizeof(y[i].qh));
        /* as q4_K for the low 4 bits; bit 4 of the element of sub-block j is bit j of qh[l] */
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                const int a = L[64 * g + l], b = L[64 * g + 32 + l];
                y[i].qs[32 * g + l] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
                y[i].qh[l] |= (uint8_t)(((a >> 4) << (2 * g)) | ((b >> 4) << (2 * g + 1)));
            }
    }
}

/* Best least-squares symmetric scale for x[0..n) ≈ scale * l, l in -nmax..nmax-1. */
static float fit_scale_sym(const float *x, int n, int nmax) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), mx = x[j];
    if (amax < 1e-30f) return 0.0f;
    float best_lx = 0.0f, best_l2 = 1.0f, best = 0.0f;
    for (int is = -4; is <= 4; is++) {
        const float iscale = -((float)nmax + 0.25f * (float)is) / mx;
        float slx = 0.0f, sl2 = 0.0f;
        for (int j = 0; j < n; j++) {
            const float l = (float)quant_clampi(quant_nearest_int(iscale * x[j]), -nmax, nmax - 1);
            slx += l * x[j];
            sl2 += l * l;
        }
        /* the fitted scale slx/sl2 lowers the squared error by slx^2/sl2: keep the largest */
        if (sl2 > 0.0f && slx * slx * best_l2 > best_lx * best_lx * sl2) {
            best_lx = slx;
            best_l2 = sl2;
            best = slx / sl2;
        }
    }
    return best;
}

void quant_ref_qz_q6_K(const float *x, void *vy, int64_t nb) {
    block_q6_K *y = vy;
    uint8_t L[HM_QK_K];
    for (int64_t i = 0; i < nb; i++, x += HM_QK_K) {
        float s[16], amax = 0.0f, smax = 0.0f;
        for (int j = 0; j < 16; j++) {
            s[j] = fit_scale_sym(x + 16 * j, 16, 32);
            if (fabsf(s[j]) > amax) amax = fabsf(s[j]), smax = s[j];
        }
        const float iscale = amax > 0.0f ? -128.0f / smax : 0.0f;
        y[i].d = hm_f32_to_fp16(amax > 0.0f ? 1.0f / iscale : 0.0f);
        const float df = hm_fp16_to_f32(y[i].d);
        for (int j = 0; j < 16; j++) {
            y[i].scales[j] = (int8_t)quant_clampi(quant_nearest_int(iscale * s[j]), -128, 127);
            const float idd = quant_safe_inv(df * (float)y[i].scales[j]);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] =
                    (uint8_t)(quant_clampi(quant_nearest_int(x[16 * j + l] * idd), -32, 31) + 32);
        }
        /* half h: ql[64h + l] = element 128h + l | 128h + 64 + l << 4, ql[64h + 32 + l] =
         * 128h + 32 + l | 128h + 96 + l << 4, qh[32h + l] = the four high 2-bit pairs */
        for (int h = 0; h < 2; h++) {
            const uint8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                y[i].ql[64 * h + l] = (uint8_t)((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
                y[i].ql[64 * h + 32 + l] =
                    (uint8_t)((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
                y[i].qh[32 * h + l] =
                    (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                              ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}
