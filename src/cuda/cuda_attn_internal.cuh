/* cuda_attn_internal.cuh - what the attention kernels of cuda_attn.cu and cuda_attn_mma.cu
 * share: the launch plan, the split scratch layout, and the merge of split parts.
 */
#ifndef HM_CUDA_CUDA_ATTN_INTERNAL_CUH
#define HM_CUDA_CUDA_ATTN_INTERNAL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "cuda/cuda_attn.h"
}
#include "cuda/cuda_math.cuh"

#define ATT_THREADS 128
#define ATT_WARPS 4
#define ATT_BK 32                /* positions per K/V tile */
#define ATT_TARGET_BLOCKS 264    /* decode: split until about this many blocks (2 per SM) */
#define ATT_MIN_SPLIT_LEN 128    /* ... but no split shorter than this at full context */
#define ATT_MAX_SPLITS 64
#define ATT_VG 16                /* decode kernel: V rows whose loads are issued together */

typedef struct {
    int n_head, n_kv, hd, n_rep;
    int hb, n_hchunk; /* query heads per block, chunks of a group */
    int nt, rows;     /* tokens per block, rows = nt * hb */
    int n_split;
    int64_t n_ctx, n_tok, window;
    float scale;
} attn_plan;

/* Scratch: ATT_TARGET_BLOCKS tile counters (ints, at a fixed place for every batch shape: a
 * batch is split only when it has fewer than ATT_TARGET_BLOCKS / 2 tiles), then the partials
 * [n_tok][n_head][n_split][hd + 2] (m, l, acc). */
#define ATT_COUNTER_BYTES (ATT_TARGET_BLOCKS * sizeof(int))
static inline size_t attn_part_floats(const attn_plan &P) {
    return (size_t)P.n_tok * P.n_head * P.n_split * (size_t)(P.hd + 2);
}

static inline hm_status attn_launched(const char *kernel, hm_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "CUDA kernel %s: %s", kernel, cudaGetErrorString(e));
    return HM_OK;
}

/* The visible positions [rlo[r], rhi[r]] of the block's query rows r < n (row r: token
 * t0 + r / hb, head hq0 + r % hb; rows past P.rows, the batch or the group: empty, lo > hi),
 * written by the block's threads. */
static __device__ __forceinline__ void attn_row_ranges(const attn_plan &P, const int32_t *pos, int64_t t0, int hq0,
                                                       int hq_end, int n, int *rlo, int *rhi) {
    for (int r = threadIdx.x; r < n; r += ATT_THREADS) {
        const int64_t t = t0 + r / P.hb;
        const int h = hq0 + r % P.hb;
        int lo = 1, hi = 0; /* empty */
        if (r < P.rows && t < P.n_tok && h < hq_end) {
            int64_t p = pos[t];
            if (p > P.n_ctx - 1) p = P.n_ctx - 1;
            if (p >= 0) {
                hi = (int)p;
                lo = P.window > 0 && p - P.window + 1 > 0 ? (int)(p - P.window + 1) : 0;
            }
        }
        rlo[r] = lo;
        rhi[r] = hi;
    }
}

/* Thread 0, after the ranges are visible: part blockIdx.z of S_eff parts of [lo, hi], the
 * union of the rows' ranges (at least a tile of ATT_BK positions per part), as s_range =
 * (begin, end exclusive, S_eff). */
static __device__ __forceinline__ void attn_part_range(const attn_plan &P, const int *rlo, const int *rhi,
                                                       int *s_range) {
    if (threadIdx.x != 0) return;
    int lo = 0x7fffffff, hi = -1;
    for (int r = 0; r < P.rows; r++)
        if (rlo[r] <= rhi[r]) {
            lo = rlo[r] < lo ? rlo[r] : lo;
            hi = rhi[r] > hi ? rhi[r] : hi;
        }
    if (hi < 0) lo = 0;
    const int64_t len = (int64_t)hi - lo + 1, s = blockIdx.z;
    int64_t se = (len + ATT_BK - 1) / ATT_BK;
    se = se < 1 ? 1 : se > P.n_split ? P.n_split : se;
    s_range[0] = (int)(lo + len * s / se);
    s_range[1] = (int)(lo + len * (s + 1) / se);
    s_range[2] = (int)se;
}

/* Called by every block of a split tile after its partials are written: true in the block that
 * arrived last (which resets the counter for the next launch). */
static __device__ __forceinline__ bool attn_arrive_last(int *cnt, int n_part) {
    __shared__ int s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        s_last = atomicAdd(cnt, 1) == n_part - 1;
        if (s_last) *cnt = 0;
    }
    __syncthreads();
    if (s_last) __threadfence();
    return s_last;
}

/* One warp: out[0..hd) of query row (t, h) from its n_part (<= 64) partials pp[s][hd + 2] and the
 * sink, in a fixed order (max and denominator by xor trees over s = lane, lane + 32; the
 * accumulators by increasing s). */
template <int DPL>
static __device__ __forceinline__ void attn_merge_row(const float *pp, int n_part, int hd,
                                                      const float *sink, float *o) {
    const int lane = threadIdx.x & 31;
    float ms[2], f[2], den = 0.0f;
    float M = sink ? *sink : -INFINITY;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int sp = lane + 32 * u;
        ms[u] = sp < n_part ? __ldcg(pp + sp * (hd + 2)) : -INFINITY;
        M = fmaxf(M, ms[u]);
    }
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int sp = lane + 32 * u;
        f[u] = ms[u] == -INFINITY ? 0.0f : cm_expf(__fsub_rn(ms[u], M));
        if (f[u] != 0.0f) den = __fmaf_rn(__ldcg(pp + sp * (hd + 2) + 1), f[u], den);
    }
    for (int off = 16; off > 0; off >>= 1) den = __fadd_rn(den, __shfl_xor_sync(0xffffffffu, den, off));
    if (sink) den = __fadd_rn(den, cm_expf(__fsub_rn(*sink, M)));
    float a[DPL];
#pragma unroll
    for (int dd = 0; dd < DPL; dd++) a[dd] = 0.0f;
    /* MG parts at a time, their loads issued together (one L2 round trip per group, not per
     * part); a part with weight 0 is skipped (its accumulator is not read) */
    constexpr int MG = DPL >= 8 ? 2 : DPL >= 4 ? 4 : 8;
    for (int s0 = 0; s0 < n_part; s0 += MG) {
        float v[MG][DPL], fs[MG];
#pragma unroll
        for (int u = 0; u < MG; u++) {
            const int sp = s0 + u;
            fs[u] = __shfl_sync(0xffffffffu, sp < 32 ? f[0] : f[1], sp & 31);
#pragma unroll
            for (int dd = 0; dd < DPL; dd++) {
                const int d = lane + 32 * dd;
                v[u][dd] = sp < n_part && fs[u] != 0.0f && d < hd ? __ldcg(pp + sp * (hd + 2) + 2 + d) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < MG; u++) {
            if (s0 + u >= n_part || fs[u] == 0.0f) continue; /* warp-uniform */
#pragma unroll
            for (int dd = 0; dd < DPL; dd++) a[dd] = __fmaf_rn(v[u][dd], fs[u], a[dd]);
        }
    }
#pragma unroll
    for (int dd = 0; dd < DPL; dd++) {
        const int d = lane + 32 * dd;
        if (d < hd) o[d] = __fdiv_rn(a[dd], den);
    }
}

/* prompt batches on tensor cores (cuda_attn_mma.cu): true when it took the plan's shape */
bool attn_mma_fits(const attn_plan *P);
hm_status attn_mma(const attn_plan *P, const cuda_attn_args *a, cudaStream_t s, hm_error *err);

#endif
