/* cuda_fused_router.cu - the MoE router's logits product and its top-k selection in one
 * launch (cuda_fused_router of cuda_fused.h).
 *
 * DESIGN: the logits are a small product (qwen3: 128 rows of 8 KiB) that is all latency: it
 * streams at bandwidth only when many SMs keep many loads in flight. A tile of NT <= 8 tokens
 * gets ceil(n_expert / FR_WARPS) blocks of FR_WARPS warps, a warp per expert row. The rows go
 * to shared memory in chunks by cp.async (no registers held, so a chunk's loads are all in
 * flight at once), and the first chunk of weights is requested before the kernel waits for its
 * predecessor (cu_pdl_wait: weights are never written by a kernel); the activations follow.
 * The warp's arithmetic is row_dot<cb_f32, NT>'s (cuda_quant_internal.cuh: lane l fmas
 * e = l, l + 32, ... in increasing order, then the shuffle tree), so the logits are
 * cuda_matvec's bytes. Each block writes its logits, fences and counts itself done on the
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

#ifndef FR_WARPS
#define FR_WARPS 4 /* expert rows per block */
#endif
#define FR_THREADS (FR_WARPS * 32)

#define FR_SMEM_MAX (160 * 1024) /* dynamic shared memory for the staged chunks */

/* Elements [c0, c0 + n) of a row (src) to dst[0, n), by the `nt` threads numbered `id`, 16
 * bytes at a time when vec (row and chunk 16-byte aligned, n % 4 == 0), else 4. */
static __device__ __forceinline__ void fr_stage(float *dst, const float *src, int n, int id, int nt,
                                                bool vec) {
    if (vec)
        for (int j = 4 * id; j < n; j += 4 * nt) cu_cp16(dst + j, src + j);
    else
        for (int j = id; j < n; j += nt) cu_cp4(dst + j, src + j);
}

/* smem: ws [FR_WARPS][ch] the warps' row chunks, then xs [NT][ch] the tokens' chunks */
template <int NT>
__global__ void __launch_bounds__(FR_THREADS)
k_fused_router(const float *w, int n_expert, int64_t k, int ch, const float *x, int64_t n_tok,
               const float *bias, int n_used, int mode, int renorm, float *logits,
               int32_t *ids_out, float *w_out, int *sync) {
    extern __shared__ float fr_smem[];
    __shared__ float sc[CUDA_FUSED_ROUTER_MAX];
    __shared__ float red[FR_WARPS];
    __shared__ int s_last;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int r = blockIdx.x * FR_WARPS + warp;
    const bool row = r < n_expert; /* warp-uniform */
    float *ws = fr_smem + warp * ch, *xs = fr_smem + FR_WARPS * ch;
    const float *wr = w + (int64_t)(row ? r : 0) * k;
    const bool vec =
        k % 4 == 0 && ch % 4 == 0 && ((uintptr_t)w & 15) == 0 && ((uintptr_t)x & 15) == 0;
    int n0 = (int)(k < ch ? k : ch);
    if (row) fr_stage(ws, wr, n0, lane, 32, vec); /* weights: before the wait */
    cu_pdl_enter();
    float fin[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) fin[i] = 0.0f;
    for (int64_t c0 = 0; c0 < k; c0 += ch) {
        const int n = (int)(k - c0 < ch ? k - c0 : ch);
        if (c0 > 0 && row) fr_stage(ws, wr + c0, n, lane, 32, vec);
#pragma unroll
        for (int i = 0; i < NT; i++)
            fr_stage(xs + i * ch, x + min(t0 + i, n_tok - 1) * k + c0, n, threadIdx.x, FR_THREADS,
                     vec);
        cu_cp_wait_all();
        __syncthreads();
        if (row)
            for (int e = lane; e < n; e += 32) {
                const float wv = ws[e];
#pragma unroll
                for (int i = 0; i < NT; i++) fin[i] = __fmaf_rn(wv, xs[i * ch + e], fin[i]);
            }
        __syncthreads(); /* before the next chunk overwrites the stage */
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2)
#pragma unroll
        for (int i = 0; i < NT; i++) fin[i] = __fadd_rn(fin[i], __shfl_down_sync(CQ_FULL, fin[i], off));
    if (row && lane == 0)
#pragma unroll
        for (int i = 0; i < NT; i++)
            if (t0 + i < n_tok) logits[(t0 + i) * n_expert + r] = fin[i];
    __threadfence(); /* this block's logits before its count */
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&sync[blockIdx.y], 1) == (int)gridDim.x - 1;
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

template <int NT>
static void fr_launch(dim3 grid, int64_t k, cudaStream_t st, const float *w, int ne, const float *x,
                      int64_t n_tok, const float *bias, int n_used, int md, int renorm, float *logits,
                      int32_t *d_ids, float *d_weights, int *d_sync) {
    /* the chunk: the whole row when it fits, else the most 128-element pieces that fit */
    int64_t ch = FR_SMEM_MAX / ((FR_WARPS + NT) * (int64_t)sizeof(float)) / 128 * 128;
    if (k <= ch) ch = (k + 3) / 4 * 4;
    const size_t smem = (size_t)(FR_WARPS + NT) * (size_t)ch * sizeof(float);
    if (cudaFuncSetAttribute(k_fused_router<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem) != cudaSuccess)
        return; /* the error stays for the launch check */
    cu_launch(k_fused_router<NT>, grid, FR_THREADS, smem, st, w, ne, k, (int)ch, x, n_tok, bias,
              n_used, md, renorm, logits, d_ids, d_weights, d_sync);
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
    case 1: fr_launch<1>(grid, k, st, w, ne, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights, d_sync); break;
    case 2: fr_launch<2>(grid, k, st, w, ne, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights, d_sync); break;
    case 4: fr_launch<4>(grid, k, st, w, ne, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights, d_sync); break;
    default: fr_launch<8>(grid, k, st, w, ne, x, n_tok, bias, n_used, md, renorm, logits, d_ids, d_weights, d_sync); break;
    }
    return cq_launched(err, "k_fused_router");
}
