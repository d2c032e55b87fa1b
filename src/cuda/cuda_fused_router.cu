/* cuda_fused_router.cu - the MoE router's logits product and its top-k selection in one
 * launch (cuda_fused_router of cuda_fused.h).
 *
 * DESIGN: a thread-block cluster (sm_90) of FR_CLUSTER blocks per tile of NT <= 8 tokens. The
 * cluster's FR_CLUSTER * FR_WARPS warps share the expert rows (a warp per row, fr_dot: the
 * f32 arithmetic of row_dot in cuda_quant_internal.cuh with deeper load prefetch, so the
 * logits are cuda_matvec's bytes) and write the logits to global memory; after a fence and
 * the cluster barrier, block r of the cluster selects for token t0 + r with router_kernel's
 * procedure (rt_select, cuda_router.cuh). Same bytes as cuda_matvec + cuda_router.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>

#include "cuda/cuda_quant_internal.cuh"
#include "cuda/cuda_router.cuh"

extern "C" {
#include "cuda/cuda_fused.h"
}

namespace cg = cooperative_groups;

#define FR_CLUSTER 8 /* = the largest token tile */
#define FR_THREADS 512
#define FR_WARPS (FR_THREADS / 32)

/* row_dot<cb_f32, NT>'s arithmetic (lane l: fma over e = l, l + 32, ... in increasing order,
 * then the __shfl_down tree 16..1; out valid in lane 0) with U elements per lane loaded before
 * they are used, so a warp keeps U loads of its row in flight instead of row_dot's 4. */
template <int NT>
static __device__ __forceinline__ void fr_dot(const float *w, int64_t k, const float *const *x,
                                              float *out) {
    constexpr int U = NT == 1 ? 32 : NT == 2 ? 16 : 8; /* a k = 2048 row in two rounds */
    const int lane = threadIdx.x & 31;
    float fin[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) fin[i] = 0.0f;
    int64_t e = lane;
    for (; e + 32 * (U - 1) < k; e += 32 * U) { /* whole chunks: U loads, then U fmas */
        float wv[U], xv[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++) {
            wv[u] = __ldg(w + e + 32 * u);
#pragma unroll
            for (int i = 0; i < NT; i++) xv[u][i] = __ldg(x[i] + e + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int i = 0; i < NT; i++) fin[i] = __fmaf_rn(wv[u], xv[u][i], fin[i]);
    }
    for (; e < k; e += 32) { /* the rest, same order */
        const float wv = __ldg(w + e);
#pragma unroll
        for (int i = 0; i < NT; i++) fin[i] = __fmaf_rn(wv, __ldg(x[i] + e), fin[i]);
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2)
#pragma unroll
        for (int i = 0; i < NT; i++) fin[i] = __fadd_rn(fin[i], __shfl_down_sync(CQ_FULL, fin[i], off));
#pragma unroll
    for (int i = 0; i < NT; i++) out[i] = fin[i];
}

template <int NT>
__global__ void __cluster_dims__(FR_CLUSTER, 1, 1) __launch_bounds__(FR_THREADS)
k_fused_router(const float *w, int n_expert, int64_t k, const float *x, int64_t n_tok,
               const float *bias, int n_used, int mode, int renorm, float *logits,
               int32_t *ids_out, float *w_out) {
    __shared__ float sc[CUDA_FUSED_ROUTER_MAX];
    __shared__ float red[FR_WARPS];
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank();
    const int64_t t0 = (int64_t)(blockIdx.x / FR_CLUSTER) * NT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const float *a[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) a[i] = x + min(t0 + i, n_tok - 1) * k;
    for (int r = rank * FR_WARPS + warp; r < n_expert; r += FR_CLUSTER * FR_WARPS) {
        float out[NT];
        fr_dot<NT>(w + (int64_t)r * k, k, a, out);
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < NT; i++)
                if (t0 + i < n_tok) logits[(t0 + i) * n_expert + r] = out[i];
    }
    __threadfence();
    cl.sync();
    const int64_t t = t0 + rank;
    if (rank >= NT || t >= n_tok) return; /* block-uniform */
    const float *l = logits + t * n_expert;
    int32_t *ids = ids_out + t * n_used;
    float *wo = w_out + t * n_used;
    for (int e = threadIdx.x; e < n_expert; e += FR_THREADS) { /* other blocks' rows: L2 */
        const float v = __ldcg(l + e);
        sc[e] = bias ? __fadd_rn(v, bias[e]) : v;
    }
    __syncthreads();
    rt_select(sc, red, n_expert, n_used, mode, renorm, ids, wo);
}

extern "C" hm_status cuda_fused_router(const float *w, int64_t n_expert, int64_t k,
                                       const float *x, int64_t n_tok, const float *bias,
                                       int n_used, cpu_gate_mode mode, int renorm, float *logits,
                                       int32_t *d_ids, float *d_weights, void *stream,
                                       hm_error *err) {
    if (n_expert < 1 || n_expert > CUDA_FUSED_ROUTER_MAX || n_used < 1 || n_used > n_expert ||
        k < 1 || k > INT32_MAX)
        return hm_error_set(err, HM_ERR_ARG,
                            "cuda_fused_router: need 1 <= k (%d) <= n_expert (%lld) <= %d, "
                            "row length %lld",
                            n_used, (long long)n_expert, CUDA_FUSED_ROUTER_MAX, (long long)k);
    if (mode != CPU_GATE_SOFTMAX_TOPK && mode != CPU_GATE_TOPK_SOFTMAX)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: unknown gating mode %d",
                            (int)mode);
    if (n_tok < 0 || n_tok / 8 > 65535)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: %lld tokens", (long long)n_tok);
    if (n_tok == 0) return HM_OK;
    if (!w || !x || !logits || !d_ids || !d_weights)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: NULL pointer");
    const int nt = cq_tile(n_tok);
    const unsigned grid = (unsigned)((n_tok + nt - 1) / nt) * FR_CLUSTER;
    const cudaStream_t st = (cudaStream_t)stream;
    const int ne = (int)n_expert, md = (int)mode;
    switch (nt) {
    case 1: k_fused_router<1><<<grid, FR_THREADS, 0, st>>>(w, ne, k, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights); break;
    case 2: k_fused_router<2><<<grid, FR_THREADS, 0, st>>>(w, ne, k, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights); break;
    case 4: k_fused_router<4><<<grid, FR_THREADS, 0, st>>>(w, ne, k, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights); break;
    default: k_fused_router<8><<<grid, FR_THREADS, 0, st>>>(w, ne, k, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights); break;
    }
    return cq_launched(err, "k_fused_router");
}
