/* cuda_quant_internal.cuh - shared by cuda_quant.cu and cuda_quant_moe.cu: the warp row dot
 * (docs/ARITHMETIC.md on a warp) and the launchers' host-side checks. Not a public header. */
#ifndef HM_CUDA_CUDA_QUANT_INTERNAL_CUH
#define HM_CUDA_CUDA_QUANT_INTERNAL_CUH

#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/cuda_blocks.cuh"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_math.cuh"

extern "C" {
#include "cuda/cuda_quant.h"
#include "quant/qtypes.h"
}

#define CQ_FULL 0xffffffffu
#define CQ_WARPS 4 /* warps (rows in flight) per CTA */
#define CQ_STAGE_MAX (24 * 1024) /* shared bytes of a CTA's staged-row slots */

/* ---------------------------------------------------------------- staged rows */

/* Copies the row at w (row_bytes) into a warp's shared slot by cp.async (issued, not waited
 * for: cq_stage_wait), lane-strided 16-byte pieces from the 16-byte boundary below w (a slot is
 * row_bytes + 32 rounded up to 16); returns the row's image, at w's address mod 16 so every
 * access keeps its alignment. */
static __device__ __forceinline__ const uint8_t *cq_stage_row(uint8_t *slot, const uint8_t *w, size_t row_bytes) {
    const uintptr_t a = (uintptr_t)w, a0 = a & ~(uintptr_t)15;
    const int n16 = (int)((a + row_bytes - a0 + 15) / 16);
    for (int c = threadIdx.x & 31; c < n16; c += 32)
        cu_cp16(slot + 16 * c, (const void *)(a0 + 16 * (uintptr_t)c));
    return slot + (a - a0);
}

/* waits for this thread's cq_stage_row copies, then makes the warp's visible to all its lanes */
static __device__ __forceinline__ void cq_stage_wait() {
    cu_cp_wait_all();
    __syncwarp();
}

/* Bytes of a shared slot for one staged row, and whether rows of an array at w of `total`
 * bytes can be staged (the 16-byte pieces around a row stay inside the array) */
static inline size_t cq_stage_slot(size_t row_bytes) { return (row_bytes + 32 + 15) / 16 * 16; }
static inline bool cq_stage_ok(const void *w, size_t total) { return (uintptr_t)w % 16 == 0 && total % 16 == 0; }

/* Types whose one-token rows are staged: all but mxfp4, measured slower staged (H100,
 * bench_cuda_matvec: expert down 8.78 -> 9.27 us, gate+up 12.97 -> 13.39, matvec 4096^2 9.27 ->
 * 9.60; against q6_K expert down 13.74 -> 9.16, q8_0 gate+up 20.0 -> 17.0, q8_0 matvec 13.2 ->
 * 10.5, bench/RESULTS.md) */
template <class T> static constexpr bool cq_stages() { return !std::is_same<T, cb_mxfp4>::value; }

/* ---------------------------------------------------------------- NR rows, NT tokens */

/* out[r][i] (valid in lane 0) = dot(row w[r] of k elements, activation row a[i]), r < NR,
 * i < NT. The NR rows are independent (each has its own spec lanes and tree); a warp issues the
 * loads of all NR rows' blocks of a step together, so it keeps NR times the bytes in flight. */
template <class T, int NT, int NR>
static __device__ __forceinline__ void rows_dot(const uint8_t *const *w, int64_t k, const uint8_t *const *a,
                                                float (*out)[NT]) {
    const int lane = threadIdx.x & 31;
    float fin[NR][NT];
    if constexpr (T::UPD == CB_UPD_FLOAT) {
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int i = 0; i < NT; i++) fin[r][i] = 0.0f;
#pragma unroll 4
        for (int64_t e = lane; e < k; e += 32) {
#pragma unroll
            for (int r = 0; r < NR; r++) {
                const float wv = T::deq(w[r], (int)e);
#pragma unroll
                for (int i = 0; i < NT; i++) fin[r][i] = __fmaf_rn(wv, ((const float *)a[i])[e], fin[r][i]);
            }
        }
    } else {
        constexpr int G = T::G, BPI = 32 / G;
        const int g = lane / G, p = lane % G;
        const int nb = (int)(k / T::BS);
        float acc[NR][G][NT];
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int gi = 0; gi < G; gi++)
#pragma unroll
                for (int i = 0; i < NT; i++) acc[r][gi][i] = 0.0f;
        /* A round of 32 blocks is G steps; steps run in chunks of GC whose loads (weights,
         * scales, activations) are issued together before any shuffle, so a warp keeps GC x NR
         * block loads in flight. Blocks past the end are clamped to the last block (valid
         * memory) and their update is skipped; a group's G lanes share the block, so the skip
         * is uniform within the group. 256-element (K-quant, iq4_xs) blocks take GC = 2 for one
         * row and one token (a k = 2048 row in one chunk), else 1: their parts already load
         * several words per lane (batching 8 was slower on the H100: bench/RESULTS.md,
         * "256-element blocks unbatched"). */
        constexpr int GQ = 8 / (NT * NR) > 0 ? 8 / (NT * NR) : 1;
        constexpr int GC = T::BS == 256 ? (NT * NR == 1 ? 2 : 1) : GQ < G ? GQ : G;
        for (int b0 = 0; b0 < nb; b0 += 32) {
#pragma unroll
            for (int gc = 0; gc < G; gc += GC) {
                if (b0 + gc * BPI >= nb) break; /* uniform over the warp */
                int s[GC][NR][NT], t[GC][NR][NT];
                float d[GC][NR], m[GC][NR], da[GC][NT];
#pragma unroll
                for (int j = 0; j < GC; j++) {
                    const int b = min(b0 + (gc + j) * BPI + g, nb - 1);
                    const size_t aoff = (size_t)b * T::ABS;
#pragma unroll
                    for (int i = 0; i < NT; i++) da[j][i] = *(const float *)(a[i] + aoff);
#pragma unroll
                    for (int r = 0; r < NR; r++) {
                        const uint8_t *wb = w[r] + (size_t)b * T::TS;
                        T::scale(wb, &d[j][r], &m[j][r]);
#pragma unroll
                        for (int i = 0; i < NT; i++) s[j][r][i] = t[j][r][i] = 0;
                        T::template part<NT>(wb, p, a, aoff, s[j][r], t[j][r]);
                    }
                }
#pragma unroll
                for (int j = 0; j < GC; j++)
#pragma unroll
                    for (int r = 0; r < NR; r++) {
#pragma unroll
                        for (int off = G / 2; off >= 1; off /= 2)
#pragma unroll
                            for (int i = 0; i < NT; i++) {
                                s[j][r][i] += __shfl_xor_sync(CQ_FULL, s[j][r][i], off);
                                if (T::UPD != CB_UPD_SYM) t[j][r][i] += __shfl_xor_sync(CQ_FULL, t[j][r][i], off);
                            }
                        if (b0 + (gc + j) * BPI + g < nb && p == 0)
#pragma unroll
                            for (int i = 0; i < NT; i++)
                                acc[r][gc + j][i] =
                                    cb_update<T>(acc[r][gc + j][i], d[j][r], m[j][r], da[j][i], s[j][r][i], t[j][r][i]);
                    }
            }
        }
        /* spec lane l = gi*BPI + g lives in physical lane g*G, slot gi */
        const int src = (lane % BPI) * G, slot = lane / BPI;
#pragma unroll
        for (int r = 0; r < NR; r++) {
#pragma unroll
            for (int i = 0; i < NT; i++) fin[r][i] = 0.0f;
#pragma unroll
            for (int gi = 0; gi < G; gi++)
#pragma unroll
                for (int i = 0; i < NT; i++) {
                    const float v = __shfl_sync(CQ_FULL, acc[r][gi][i], src);
                    if (slot == gi) fin[r][i] = v;
                }
        }
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2)
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int i = 0; i < NT; i++) fin[r][i] = __fadd_rn(fin[r][i], __shfl_down_sync(CQ_FULL, fin[r][i], off));
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int i = 0; i < NT; i++) out[r][i] = fin[r][i];
}

/* out[i] (valid in lane 0) = dot(row w of k elements, activation row a[i]), i < NT */
template <class T, int NT>
static __device__ __forceinline__ void row_dot(const uint8_t *w, int64_t k, const uint8_t *const *a, float *out) {
    rows_dot<T, NT, 1>(&w, k, a, (float(*)[NT])out);
}

/* ---------------------------------------------------------------- activation quantisation */

/* cuda_quantize_act's rounding of v * id to a signed byte */
static __device__ __forceinline__ int cq_q8(float v, float id) {
    const float r = rintf(__fmul_rn(v, id));
    return r != r ? 0 : r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r;
}

/* cuda_quantize_act's bytes for one activation block at blk: B = 32, a whole warp (lane j holds
 * element j); B = 256, a whole 256-thread CTA (thread j holds element j; wmax: 8 floats of
 * shared memory). in: this thread's element exists (the same over each warp). */
template <int B>
static __device__ __forceinline__ void cq_quant_block(float v, bool in, uint8_t *blk, float *wmax) {
    const int j = threadIdx.x & (B - 1), lane = threadIdx.x & 31;
    float amax = in ? fabsf(v) : 0.0f;
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(CQ_FULL, amax, off));
    if (B == 256) {
        if (lane == 0) wmax[threadIdx.x >> 5] = amax;
        __syncthreads();
        amax = wmax[0];
#pragma unroll
        for (int i = 1; i < 8; i++) amax = fmaxf(amax, wmax[i]);
    }
    if (!in) return;
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const int q = cq_q8(v, id);
    int sum = q;
    if (B == 32) {
#pragma unroll
        for (int off = 16; off >= 1; off /= 2) sum += __shfl_xor_sync(CQ_FULL, sum, off);
        blk[CB_A32_QS + j] = (uint8_t)(int8_t)q;
        if (j == 0) {
            *(float *)blk = d;
            *(int32_t *)(blk + CB_A32_SUM) = sum;
        }
    } else {
#pragma unroll
        for (int off = 8; off >= 1; off /= 2) sum += __shfl_xor_sync(CQ_FULL, sum, off);
        blk[CB_AK_QS + j] = (uint8_t)(int8_t)q;
        if (j % 16 == 0) *(int16_t *)(blk + CB_AK_BS + 2 * (j / 16)) = (int16_t)sum;
        if (j == 0) *(float *)blk = d;
    }
}

/* The same bytes as cq_quant_block<B> for the B elements v[0, B) (any memory), by one warp:
 * lane l holds elements l + 32 j. The max, the integer sums and the per-element rounding do not
 * depend on which thread holds an element. */
template <int B>
static __device__ __forceinline__ void cq_quant_warp(const float *v, uint8_t *blk) {
    constexpr int PL = B / 32;
    const int lane = threadIdx.x & 31;
    float x[PL];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < PL; j++) {
        x[j] = v[lane + 32 * j];
        amax = fmaxf(amax, fabsf(x[j]));
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(CQ_FULL, amax, off));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
#pragma unroll
    for (int j = 0; j < PL; j++) {
        const int q = cq_q8(x[j], id);
        int sum = q;
        const int lo = B == 32 ? 16 : 8; /* q8_32: the block's sum; q8_K: sums of 16 */
#pragma unroll
        for (int off = lo; off >= 1; off /= 2) sum += __shfl_xor_sync(CQ_FULL, sum, off);
        if (B == 32) {
            blk[CB_A32_QS + lane] = (uint8_t)(int8_t)q;
            if (lane == 0) *(int32_t *)(blk + CB_A32_SUM) = sum;
        } else {
            blk[CB_AK_QS + lane + 32 * j] = (uint8_t)(int8_t)q;
            if (lane % 16 == 0) *(int16_t *)(blk + CB_AK_BS + 2 * ((lane + 32 * j) / 16)) = (int16_t)sum;
        }
    }
    if (lane == 0) *(float *)blk = d;
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
