/* cuda_fused_router.cu - the MoE router's logits product and its top-k selection in one
 * launch (cuda_fused_router of cuda_fused.h).
 *
 * DESIGN: the logits are a small product (qwen3: 128 rows of 8 KiB) that only streams at
 * bandwidth when many SMs keep loads in flight, so a tile of NT <= 8 tokens gets
 * ceil(n_expert / FR_WARPS) blocks of FR_WARPS warps, a warp per expert row (fr_dot: the f32
 * arithmetic of row_dot in cuda_quant_internal.cuh with deeper load prefetch, so the logits are
 * cuda_matvec's bytes). Each block writes its logits, fences and counts itself done on the
 * tile's counter; the last block to arrive selects for the tile's tokens one after the other
 * with router_kernel's procedure (rt_select, cuda_router.cuh) and rezeroes the counter for the
 * next launch. Same bytes as cuda_matvec + cuda_router.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_quant_internal.cuh"
#include "cuda/cuda_router.cuh"

extern "C" {
#include "cuda/cuda_fused.h"
}

#define FR_WARPS 4 /* expert rows per block */
#define FR_THREADS (FR_WARPS * 32)

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
__global__ void __launch_bounds__(FR_THREADS)
k_fused_router(const float *w, int n_expert, int64_t k, const float *x, int64_t n_tok,
               const float *bias, int n_used, int mode, int renorm, float *logits,
               int32_t *ids_out, float *w_out, int *sync) {
    cu_pdl_enter();
    __shared__ float sc[CUDA_FUSED_ROUTER_MAX];
    __shared__ float red[FR_WARPS];
    __shared__ int s_last;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const float *a[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) a[i] = x + min(t0 + i, n_tok - 1) * k;
    const int r = blockIdx.x * FR_WARPS + warp;
    if (r < n_expert) {
        float out[NT];
        fr_dot<NT>(w + (int64_t)r * k, k, a, out);
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < NT; i++)
                if (t0 + i < n_tok) logits[(t0 + i) * n_expert + r] = out[i];
    }
    __threadfence(); /* this block's logits before its count */
    __syncthreads();
    if (threadIdx.x == 0) {
        s_last = atomicAdd(&sync[blockIdx.y], 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!s_last) return; /* block-uniform */
    __threadfence(); /* the other blocks' logits after their counts */
    for (int i = 0; i < NT && t0 + i < n_tok; i++) {
        const int64_t t = t0 + i;
        const float *l = logits + t * n_expert;
        for (int e = threadIdx.x; e < n_expert; e += FR_THREADS) { /* other blocks' rows: L2 */
            const float v = __ldcg(l + e);
            sc[e] = bias ? __fadd_rn(v, bias[e]) : v;
        }
        __syncthreads();
        rt_select(sc, red, n_expert, n_used, mode, renorm, ids_out + t * n_used, w_out + t * n_used);
        __syncthreads(); /* sc and the slots are reused by the next token */
    }
    if (threadIdx.x == 0) sync[blockIdx.y] = 0;
}

extern "C" hm_status cuda_fused_router(const float *w, int64_t n_expert, int64_t k,
                                       const float *x, int64_t n_tok, const float *bias,
                                       int n_used, cpu_gate_mode mode, int renorm, float *logits,
                                       int32_t *d_ids, float *d_weights, int *d_sync,
                                       void *stream, hm_error *err) {
    if (n_expert < 1 || n_expert > CUDA_FUSED_ROUTER_MAX || n_used < 1 || n_used > n_expert ||
        k < 1 || k > INT32_MAX)
        return hm_error_set(err, HM_ERR_ARG,
                            "cuda_fused_router: need 1 <= k (%d) <= n_expert (%lld) <= %d, "
                            "row length %lld",
                            n_used, (long long)n_expert, CUDA_FUSED_ROUTER_MAX, (long long)k);
    if (mode != CPU_GATE_SOFTMAX_TOPK && mode != CPU_GATE_TOPK_SOFTMAX)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: unknown gating mode %d",
                            (int)mode);
    if (n_tok < 0 || n_tok / 8 >= 65535)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: %lld tokens", (long long)n_tok);
    if (n_tok == 0) return HM_OK;
    if (!w || !x || !logits || !d_ids || !d_weights || !d_sync)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: NULL pointer");
    const int nt = cq_tile(n_tok);
    const dim3 grid((unsigned)((n_expert + FR_WARPS - 1) / FR_WARPS), (unsigned)((n_tok + nt - 1) / nt));
    const cudaStream_t st = (cudaStream_t)stream;
    const int ne = (int)n_expert, md = (int)mode;
    switch (nt) {
    case 1: cu_launch(k_fused_router<1>, grid, FR_THREADS, 0, st, w, ne, k, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights, d_sync); break;
    case 2: cu_launch(k_fused_router<2>, grid, FR_THREADS, 0, st, w, ne, k, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights, d_sync); break;
    case 4: cu_launch(k_fused_router<4>, grid, FR_THREADS, 0, st, w, ne, k, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights, d_sync); break;
    default: cu_launch(k_fused_router<8>, grid, FR_THREADS, 0, st, w, ne, k, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights, d_sync); break;
    }
    return cq_launched(err, "k_fused_router");
}
