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
 * next launch. Same bytes as cuda_matvec + cuda_router. The selection also writes the
 * selected experts' device slots and adds to the routing counters when asked
 * (cuda_route_out); the expert->slot table is asked from L2 before the wait.
 * With the norm in front (decode: the MoE block's rmsnorm, whose residual add the o product's
 * epilogue did), every block normalises the whole x row it staged itself (a row is 8-12 KiB,
 * read from L2, where a launch of its own and its grid-wide barrier cost microseconds), and
 * the blocks share writing xn and the experts' activation rows.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_quant_internal.cuh"
#include "cuda/cuda_math.cuh"
#include "cuda/cuda_router.cuh"
#include "cuda/cuda_tune.h"

extern "C" {
#include "cuda/cuda_fused.h"
#include "quant/qtypes.h"
#include "quant/quant.h"
}

#define FR_WARPS CUDA_TUNE_FR_WARPS /* expert rows per block */
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

/* the kernel's arguments (cuda_fused_router_args, checked; act_b: 0 (no act), 32 or 256) */
typedef struct {
    cuda_fused_router_args a;
    int ch;      /* floats of a staged chunk */
    int act_b;   /* activation block (32: q8_32, 256: q8_K) or 0 */
    size_t act_bytes;
} fr_k;

/* NORM: the norm in front. The tile's x rows are staged whole, warp i % FR_WARPS computes token
 * i's scale (cm_rms_scale), then xs = (x * scale) * norm_w in place (fm_output's operations);
 * block 0 writes xn, and the activation blocks are spread over the tile's warps (cq_quant_warp:
 * cq_quant_block's bytes). */
template <int NT>
static __device__ __forceinline__ void fr_norm(const fr_k &K, float *xs, const float *wn, int64_t t0) {
    const cuda_fused_router_args &A = K.a;
    __shared__ float s_scale[NT];
    const int warp = threadIdx.x / 32, ch = K.ch;
    const int64_t k = A.k;
    for (int i = warp; i < NT; i += FR_WARPS) {
        const float r = cm_rms_scale(xs + i * ch, k, A.eps);
        if ((threadIdx.x & 31) == 0) s_scale[i] = r;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < NT; i++)
        for (int64_t e = threadIdx.x; e < k; e += FR_THREADS) {
            const float sv = __fmul_rn(xs[i * ch + e], s_scale[i]);
            xs[i * ch + e] = A.norm_w ? __fmul_rn(sv, wn[e]) : sv;
        }
    __syncthreads();
    const int nt = (int)min((int64_t)NT, A.n_tok - t0);
    if (blockIdx.x == 0)
        for (int i = 0; i < nt; i++)
            for (int64_t e = threadIdx.x; e < k; e += FR_THREADS) A.xn[(t0 + i) * k + e] = xs[i * ch + e];
    if (!K.act_b) return;
    const int64_t nb = k / K.act_b, units = nt * nb;
    for (int64_t u = (int64_t)blockIdx.x * FR_WARPS + warp; u < units; u += (int64_t)gridDim.x * FR_WARPS) {
        const int i = (int)(u / nb);
        const int64_t b = u % nb;
        uint8_t *blk = (uint8_t *)A.act + (size_t)(t0 + i) * K.act_bytes +
                       (size_t)b * (K.act_b == 32 ? CB_A32 : CB_AK);
        if (K.act_b == 32) cq_quant_warp<32>(xs + i * ch + b * 32, blk);
        else cq_quant_warp<256>(xs + i * ch + b * 256, blk);
    }
}

/* smem: ws [FR_WARPS][ch] the warps' row chunks, xs [NT][ch] the tokens' chunks, then (NORM)
 * wn [ch] the norm weights */
template <int NT, bool NORM>
__global__ void __launch_bounds__(FR_THREADS) k_fused_router(const fr_k K) {
    const cuda_fused_router_args &A = K.a;
    extern __shared__ float fr_smem[];
    __shared__ float sc[CUDA_FUSED_ROUTER_MAX];
    __shared__ float red[FR_WARPS];
    __shared__ int s_last;
    const int64_t t0 = (int64_t)blockIdx.y * NT, k = A.k, n_tok = A.n_tok;
    const int n_expert = (int)A.n_expert, ch = K.ch;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int r = blockIdx.x * FR_WARPS + warp;
    const bool row = r < n_expert; /* warp-uniform */
    float *ws = fr_smem + warp * ch, *xs = fr_smem + FR_WARPS * ch, *wn = xs + NT * ch;
    const float *wr = A.w + (int64_t)(row ? r : 0) * k;
    const bool vec = k % 4 == 0 && ch % 4 == 0 && ((uintptr_t)A.w & 15) == 0 &&
                     ((uintptr_t)A.x & 15) == 0 && (!NORM || ((uintptr_t)A.norm_w & 15) == 0);
    int n0 = (int)(k < ch ? k : ch);
    if (row) fr_stage(ws, wr, n0, lane, 32, vec); /* weights: before the wait */
    if (NORM && A.norm_w) fr_stage(wn, A.norm_w, (int)k, threadIdx.x, FR_THREADS, vec);
    if (A.out.dslot && blockIdx.x == 0 && (int)threadIdx.x * 32 < n_expert) /* for the selection */
        cu_prefetch_l2(A.out.slot_of + threadIdx.x * 32);
    cu_pdl_enter();
    float fin[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) fin[i] = 0.0f;
    for (int64_t c0 = 0; c0 < k; c0 += ch) { /* NORM: one chunk */
        const int n = (int)(k - c0 < ch ? k - c0 : ch);
        if (c0 > 0 && row) fr_stage(ws, wr + c0, n, lane, 32, vec);
#pragma unroll
        for (int i = 0; i < NT; i++)
            fr_stage(xs + i * ch, A.x + min(t0 + i, n_tok - 1) * k + c0, n, threadIdx.x, FR_THREADS,
                     vec);
        cu_cp_wait_all();
        __syncthreads();
        if (NORM) fr_norm<NT>(K, xs, wn, t0);
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
            if (t0 + i < n_tok) A.logits[(t0 + i) * n_expert + r] = fin[i];
    __threadfence(); /* this block's logits (and xn, act) before its count */
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&A.d_sync[blockIdx.y], 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!s_last) return; /* block-uniform */
    __threadfence(); /* the other blocks' logits after their counts */
    for (int i = 0; i < NT && t0 + i < n_tok; i++) {
        const int64_t t = t0 + i;
        const float *l = A.logits + t * n_expert;
        for (int e = threadIdx.x; e < n_expert; e += FR_THREADS) { /* other blocks' rows: L2 */
            const float v = __ldcg(l + e);
            sc[e] = A.bias ? __fadd_rn(v, A.bias[e]) : v;
        }
        __syncthreads();
        rt_select(sc, red, n_expert, A.n_used, A.mode, A.renorm, A.d_ids + t * A.n_used,
                  A.d_weights + t * A.n_used, A.out.dslot ? A.out.dslot + t * A.n_used : NULL,
                  A.out.slot_of, A.out.hits);
        __syncthreads(); /* sc and the slots are reused by the next token */
    }
    if (A.out.stat && blockIdx.y == 0 && threadIdx.x == 0) { /* the launch: one call */
        atomicAdd((unsigned long long *)A.out.stat, 1ull);
        atomicAdd((unsigned long long *)A.out.stat + 1, (unsigned long long)n_tok);
    }
    if (threadIdx.x == 0) A.d_sync[blockIdx.y] = 0;
}

/* the chunk: the whole row when it fits, else the most 128-element pieces that fit */
static int64_t fr_chunk(int64_t k, int nt, bool norm) {
    int64_t ch = FR_SMEM_MAX / ((FR_WARPS + nt + (norm ? 1 : 0)) * (int64_t)sizeof(float)) / 128 * 128;
    if (k <= ch) ch = (k + 3) / 4 * 4;
    return ch;
}

template <int NT>
static void fr_launch(dim3 grid, fr_k K, cudaStream_t st) {
    const bool norm = K.a.norm_w != NULL;
    K.ch = (int)fr_chunk(K.a.k, NT, norm);
    const size_t smem = (size_t)(FR_WARPS + NT + (norm ? 1 : 0)) * (size_t)K.ch * sizeof(float);
    void (*kern)(const fr_k) = norm ? k_fused_router<NT, true> : k_fused_router<NT, false>;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
        cudaSuccess)
        return; /* the error stays for the launch check */
    cu_launch(kern, grid, FR_THREADS, smem, st, K);
}

extern "C" bool cuda_fused_router_norm_ok(int64_t k, int64_t n_tok, uint32_t wtype) {
    const quant_act at = quant_act_for(wtype);
    const int b = at == QUANT_ACT_Q8_32 ? 32 : at == QUANT_ACT_Q8_K ? 256 : 0;
    const bool fmt = at == QUANT_ACT_F32 || (b && k % b == 0);
    return fmt && k >= 1 && n_tok >= 1 && k <= fr_chunk(k, cq_tile(n_tok), true);
}

extern "C" hm_status cuda_fused_router(const cuda_fused_router_args *a, void *stream,
                                       hm_error *err) {
    if (!a) return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: missing arguments");
    const int64_t n_expert = a->n_expert, k = a->k, n_tok = a->n_tok;
    const int n_used = a->n_used;
    if (n_expert < 1 || n_expert > CUDA_FUSED_ROUTER_MAX || n_used < 1 || n_used > n_expert ||
        k < 1 || k > INT32_MAX)
        return hm_error_set(err, HM_ERR_ARG,
                            "cuda_fused_router: need 1 <= k (%d) <= n_expert (%lld) <= %d, "
                            "row length %lld",
                            n_used, (long long)n_expert, CUDA_FUSED_ROUTER_MAX, (long long)k);
    if (a->mode != CPU_GATE_SOFTMAX_TOPK && a->mode != CPU_GATE_TOPK_SOFTMAX)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: unknown gating mode %d",
                            (int)a->mode);
    if (n_tok < 0 || n_tok / 8 >= 65535)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: %lld tokens", (long long)n_tok);
    if (n_tok == 0) return HM_OK;
    if (!a->w || !a->x || !a->logits || !a->d_ids || !a->d_weights || !a->d_sync)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: NULL pointer");
    if (!a->out.slot_of != !a->out.dslot || !a->out.hits != !a->out.stat)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: slot_of and dslot come "
                            "together, hits and stat too");
    fr_k K;
    memset(&K, 0, sizeof(K));
    K.a = *a;
    if (a->norm_w) {
        if (!cuda_fused_router_norm_ok(k, n_tok, a->wtype))
            return hm_error_set(err, HM_ERR_ARG,
                                "cuda_fused_router: the norm in front needs rows of %lld (%lld "
                                "tokens) in shared memory and %s activations in whole blocks",
                                (long long)k, (long long)n_tok, hm_type_name(a->wtype));
        if (!a->xn) return hm_error_set(err, HM_ERR_ARG, "cuda_fused_router: norm without xn");
        const quant_act at = quant_act_for(a->wtype);
        K.act_b = !a->act || at == QUANT_ACT_F32 ? 0 : at == QUANT_ACT_Q8_32 ? 32 : 256;
        K.act_bytes = K.act_b ? quant_act_row_size(at, k) : 0;
    }
    const int nt = cq_tile(n_tok);
    const dim3 grid((unsigned)((n_expert + FR_WARPS - 1) / FR_WARPS), (unsigned)((n_tok + nt - 1) / nt));
    const cudaStream_t st = (cudaStream_t)stream;
    switch (nt) {
    case 1: fr_launch<1>(grid, K, st); break;
    case 2: fr_launch<2>(grid, K, st); break;
    case 4: fr_launch<4>(grid, K, st); break;
    default: fr_launch<8>(grid, K, st); break;
    }
    return cq_launched(err, "k_fused_router");
}
