/* cuda_quant_internal.cuh - shared by cuda_quant.cu and cuda_quant_moe.cu: the warp row dot
 * (docs/ARITHMETIC.md on a warp) and the launchers' host-side checks. Not a public header. */
#ifndef HM_CUDA_CUDA_QUANT_INTERNAL_CUH
#define HM_CUDA_CUDA_QUANT_INTERNAL_CUH

#include <cuda_runtime.h>

#include "cuda/cuda_blocks.cuh"
#include "cuda/cuda_math.cuh"

extern "C" {
#include "cuda/cuda_quant.h"
#include "quant/qtypes.h"
}

#define CQ_FULL 0xffffffffu
#define CQ_WARPS 4 /* warps (rows in flight) per CTA */

/* ---------------------------------------------------------------- one row, NT tokens */

/* out[i] (valid in lane 0) = dot(row w of k elements, activation row a[i]), i < NT */
template <class T, int NT>
static __device__ __forceinline__ void row_dot(const uint8_t *w, int64_t k, const uint8_t *const *a, float *out) {
    const int lane = threadIdx.x & 31;
    float fin[NT];
    if constexpr (T::UPD == CB_UPD_FLOAT) {
#pragma unroll
        for (int i = 0; i < NT; i++) fin[i] = 0.0f;
#pragma unroll 4
        for (int64_t e = lane; e < k; e += 32) {
            const float wv = T::deq(w, (int)e);
#pragma unroll
            for (int i = 0; i < NT; i++) fin[i] = __fmaf_rn(wv, ((const float *)a[i])[e], fin[i]);
        }
    } else {
        constexpr int G = T::G, BPI = 32 / G;
        const int g = lane / G, p = lane % G;
        const int nb = (int)(k / T::BS);
        float acc[G][NT];
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
            for (int i = 0; i < NT; i++) acc[gi][i] = 0.0f;
        for (int b0 = 0; b0 < nb; b0 += 32) {
#pragma unroll
            for (int gi = 0; gi < G; gi++) {
                if (b0 + gi * BPI >= nb) break; /* uniform over the warp */
                const int b = b0 + gi * BPI + g;
                const bool ok = b < nb;
                const uint8_t *wb = w + (size_t)b * T::TS;
                const size_t aoff = (size_t)b * T::ABS;
                int s[NT], t[NT];
#pragma unroll
                for (int i = 0; i < NT; i++) s[i] = t[i] = 0;
                if (ok) T::template part<NT>(wb, p, a, aoff, s, t);
#pragma unroll
                for (int off = G / 2; off >= 1; off /= 2)
#pragma unroll
                    for (int i = 0; i < NT; i++) {
                        s[i] += __shfl_xor_sync(CQ_FULL, s[i], off);
                        if (T::UPD != CB_UPD_SYM) t[i] += __shfl_xor_sync(CQ_FULL, t[i], off);
                    }
                if (ok && p == 0) {
                    float d, m;
                    T::scale(wb, &d, &m);
#pragma unroll
                    for (int i = 0; i < NT; i++)
                        acc[gi][i] = cb_update<T>(acc[gi][i], d, m, *(const float *)(a[i] + aoff), s[i], t[i]);
                }
            }
        }
        /* spec lane l = gi*BPI + g lives in physical lane g*G, slot gi */
        const int src = (lane % BPI) * G, slot = lane / BPI;
#pragma unroll
        for (int i = 0; i < NT; i++) fin[i] = 0.0f;
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
            for (int i = 0; i < NT; i++) {
                const float v = __shfl_sync(CQ_FULL, acc[gi][i], src);
                if (slot == gi) fin[i] = v;
            }
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2)
#pragma unroll
        for (int i = 0; i < NT; i++) fin[i] = __fadd_rn(fin[i], __shfl_down_sync(CQ_FULL, fin[i], off));
#pragma unroll
    for (int i = 0; i < NT; i++) out[i] = fin[i];
}

/* ---------------------------------------------------------------- host helpers */

static inline hm_status cq_launched(hm_error *err, const char *kernel) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "%s: %s", kernel, cudaGetErrorString(e));
    return HM_OK;
}

static inline hm_status cq_unsupported(hm_error *err, const char *fn, uint32_t wtype) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "%s: unsupported weight type %s", fn, hm_type_name(wtype));
}

/* k must be a positive multiple of the type's block */
static inline hm_status cq_check_k(hm_error *err, const char *fn, uint32_t wtype, int64_t k) {
    const hm_type_info *ti = hm_type_get(wtype);
    if (!ti || !ti->supported || quant_act_for(wtype) == QUANT_ACT_COUNT) return cq_unsupported(err, fn, wtype);
    if (k <= 0 || k % ti->block_size || k > INT32_MAX)
        return hm_error_set(err, HM_ERR_ARG, "%s: k = %lld is not a positive multiple of %s's block (%d)", fn,
                            (long long)k, hm_type_name(wtype), ti->block_size);
    return HM_OK;
}

static inline int cq_tile(int64_t n_tok) { return n_tok <= 1 ? 1 : n_tok <= 2 ? 2 : n_tok <= 4 ? 4 : 8; }


#endif
