/* cuda_attn_mma.cu - attention of prompt batches (more than one query token) on tensor cores.
 *
 * DESIGN: the block and split plan of attn_kernel (cuda_attn.cu): a block takes up to 64 query
 * rows (tokens x query heads of one kv head) and walks its visible positions [k_begin, k_end)
 * in tiles of AM_BK = 64. 4 warps own 16 rows each. Per tile, K and V rows are copied from the
 * f16 cache into shared memory by cp.async (V's copy overlaps the scores), then per warp:
 *   S = Q K^T by mma.sync m16n8k16 (f16 inputs, f32 accumulation), 16 x 64 scores;
 *   mask (causal, window, part range) and the online softmax per row (running max m and
 *   denominator l, rows spread over a lane quad: xor shuffles 1, 2);
 *   O += P V by mma.sync, P taken from the score registers (the accumulator layout of two
 *   n-tiles is the A-operand layout of one k-step), V through ldmatrix.trans.
 * Precision: K and V are f16 in the cache, so they enter the products exactly. Q (scaled
 * by 1/sqrt(head_dim) first) and P are f32 values: each is split into f16 hi + lo (lo = the
 * f16 of the remainder) and both halves multiply, so products keep ~22 bits and sums are
 * f32: the result is as close to cpu_attention as the CUDA-core kernel's (the same 1e-4
 * relative bound of the tests holds), at twice the minimal tensor work, which is far from the
 * limit here. Every order is fixed: same bytes on every run.
 * Splits, the partial layout and the merge are attn_kernel's (cuda_attn_internal.cuh).
 * f16 caches only: cuda_attention sends prompts over an f32 cache to attn_kernel.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "cuda/cuda_attn.h"
}
#include "cuda/cuda_attn_internal.cuh"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_math.cuh"

#define AM_ROWS 64 /* query rows per block: 4 warps x 16 */
#define AM_BK 64   /* positions per K/V tile */

template <int HD> struct am_cfg {
    static const int PITCH = HD + 8; /* halves per shared row: 16-byte pad, conflict-free ldmatrix */
    static const int NT = HD / 8;    /* n-tiles of a warp's 16 x HD output */
    static const size_t SMEM = (size_t)(2 * AM_ROWS + 2 * AM_BK) * PITCH * 2 + 2 * AM_ROWS * sizeof(int);
};

/* four 8x8 f16 matrices from shared memory (lanes 8i..8i+7 give matrix i's row addresses) */
static __device__ __forceinline__ void am_ldsm(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(cu_smem_addr(p)));
}

static __device__ __forceinline__ void am_ldsm_t(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(cu_smem_addr(p)));
}

/* c[16x8] += a[16x16] b[16x8] */
static __device__ __forceinline__ void am_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* (x, y) as f16 pairs hi and lo = f16(remainder), x in the low half */
static __device__ __forceinline__ void am_split(float x, float y, uint32_t &hi, uint32_t &lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(__fsub_rn(x, hf.x), __fsub_rn(y, hf.y));
    hi = *(const uint32_t *)&h;
    lo = *(const uint32_t *)&l;
}

/* K (or V) rows [k0, k0 + AM_BK) of kv head g to s[AM_BK][PITCH]; rows >= k_end are zeros */
template <int HD>
static __device__ __forceinline__ void am_load_tile(uint16_t *s, const uint16_t *cache, int k0, int k_end,
                                                    int row_stride, int g) {
    typedef am_cfg<HD> C;
    for (int c = threadIdx.x; c < AM_BK * HD / 8; c += ATT_THREADS) {
        const int pk = c / (HD / 8), d0 = (c % (HD / 8)) * 8, p = k0 + pk;
        const bool ok = p < k_end;
        cu_cp16z(s + pk * C::PITCH + d0, cache + (size_t)(ok ? p : k0) * row_stride + (size_t)g * HD + d0, ok);
    }
    cu_cp_commit();
}

template <int HD>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_mma_kernel(const attn_plan P, const float *q, const uint16_t *kc, const uint16_t *vc,
                    const int32_t *pos, const float *sinks, float *out, void *scratch) {
    cu_pdl_enter();
    typedef am_cfg<HD> C;
    extern __shared__ __align__(16) uint16_t am_smem[];
    uint16_t *Qh = am_smem;                /* [AM_ROWS][PITCH] f16 hi of q * scale */
    uint16_t *Ql = Qh + AM_ROWS * C::PITCH; /* [AM_ROWS][PITCH] f16 lo */
    uint16_t *Ks = Ql + AM_ROWS * C::PITCH; /* [AM_BK][PITCH] */
    uint16_t *Vs = Ks + AM_BK * C::PITCH;   /* [AM_BK][PITCH] */
    int *rlo = (int *)(Vs + AM_BK * C::PITCH); /* [AM_ROWS] first visible position */
    int *rhi = rlo + AM_ROWS;                  /* [AM_ROWS] last visible position */
    __shared__ int s_range[3];                 /* begin, end (exclusive), parts */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, t4 = lane & 3;
    const int64_t t0 = (int64_t)blockIdx.x * P.nt;
    const int g = blockIdx.y / P.n_hchunk;
    const int hq0 = g * P.n_rep + (blockIdx.y % P.n_hchunk) * P.hb; /* first query head */
    const int hq_end = (g + 1) * P.n_rep;

    attn_row_ranges(P, pos, t0, hq0, hq_end, AM_ROWS, rlo, rhi);
    for (int i = threadIdx.x; i < AM_ROWS * HD / 2; i += ATT_THREADS) {
        const int r = i / (HD / 2), d = 2 * (i % (HD / 2));
        const int64_t t = t0 + r / P.hb;
        const int h = hq0 + r % P.hb;
        float2 x = make_float2(0.0f, 0.0f);
        if (r < P.rows && t < P.n_tok && h < hq_end) x = *(const float2 *)(q + (t * P.n_head + h) * HD + d);
        uint32_t hi, lo;
        am_split(__fmul_rn(x.x, P.scale), __fmul_rn(x.y, P.scale), hi, lo);
        *(uint32_t *)(Qh + r * C::PITCH + d) = hi;
        *(uint32_t *)(Ql + r * C::PITCH + d) = lo;
    }
    __syncthreads();
    attn_part_range(P, rlo, rhi, s_range);
    __syncthreads();
    const int k_begin = s_range[0], k_end = s_range[1], n_part = s_range[2];
    if ((int)blockIdx.z >= n_part) return; /* block-uniform */

    const int r0 = warp * 16 + gq; /* this thread's rows r0 and r0 + 8 */
    const int lo0 = rlo[r0], hi0 = rhi[r0], lo1 = rlo[r0 + 8], hi1 = rhi[r0 + 8];
    const int row_stride = P.n_kv * HD; /* halves per cache row */
    float o[C::NT][4];                  /* rows (r0: [0], [1]; r0 + 8: [2], [3]), dims 8n + 2 t4 + {0, 1} */
#pragma unroll
    for (int n = 0; n < C::NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int k0 = k_begin; k0 < k_end; k0 += AM_BK) {
        __syncthreads(); /* the previous tile is used up */
        am_load_tile<HD>(Ks, kc, k0, k_end, row_stride, g);
        am_load_tile<HD>(Vs, vc, k0, k_end, row_stride, g);
        cu_cp_wait<1>();
        __syncthreads();

        /* scores: sc[j] = positions k0 + 8 j + 2 t4 + {0, 1} of rows r0 ([0], [1]), r0 + 8 */
        float sc[AM_BK / 8][4];
#pragma unroll
        for (int j = 0; j < AM_BK / 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            uint32_t ah[4], al[4];
            const int ao = (warp * 16 + (lane & 15)) * C::PITCH + ks * 16 + (lane >> 4) * 8;
            am_ldsm(ah, Qh + ao);
            am_ldsm(al, Ql + ao);
#pragma unroll
            for (int np = 0; np < AM_BK / 16; np++) {
                uint32_t b[4];
                am_ldsm(b, Ks + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * C::PITCH + ks * 16 +
                               ((lane >> 3) & 1) * 8);
                am_mma(sc[2 * np], ah, b[0], b[1]);
                am_mma(sc[2 * np], al, b[0], b[1]);
                am_mma(sc[2 * np + 1], ah, b[2], b[3]);
                am_mma(sc[2 * np + 1], al, b[2], b[3]);
            }
        }
        /* mask, online softmax per row (i = 0: r0, 1: r0 + 8) */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int lo = i ? lo1 : lo0, hi = i ? hi1 : hi0;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < AM_BK / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int p = k0 + 8 * j + 2 * t4 + e;
                    const float v = p < k_end && p >= lo && p <= hi ? sc[j][2 * i + e] : -INFINITY;
                    sc[j][2 * i + e] = v;
                    mx = fmaxf(mx, v);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m[i], mx);
            const float alpha = m[i] == -INFINITY ? 0.0f : cm_expf(__fsub_rn(m[i], mn));
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < AM_BK / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float v = sc[j][2 * i + e];
                    const float pv = v == -INFINITY ? 0.0f : cm_expf(__fsub_rn(v, mn));
                    sc[j][2 * i + e] = pv;
                    sum = __fadd_rn(sum, pv);
                }
            sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
            sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
            l[i] = __fadd_rn(__fmul_rn(l[i], alpha), sum);
            m[i] = mn;
#pragma unroll
            for (int n = 0; n < C::NT; n++) {
                o[n][2 * i] = __fmul_rn(o[n][2 * i], alpha);
                o[n][2 * i + 1] = __fmul_rn(o[n][2 * i + 1], alpha);
            }
        }
        cu_cp_wait<0>();
        __syncthreads(); /* V has landed */
        /* O += P V: k-step kk covers positions 16 kk .. 16 kk + 15 (score tiles 2 kk, 2 kk + 1) */
#pragma unroll
        for (int kk = 0; kk < AM_BK / 16; kk++) {
            uint32_t ph[4], pl[4];
            am_split(sc[2 * kk][0], sc[2 * kk][1], ph[0], pl[0]);
            am_split(sc[2 * kk][2], sc[2 * kk][3], ph[1], pl[1]);
            am_split(sc[2 * kk + 1][0], sc[2 * kk + 1][1], ph[2], pl[2]);
            am_split(sc[2 * kk + 1][2], sc[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
            for (int np = 0; np < HD / 16; np++) {
                uint32_t b[4];
                am_ldsm_t(b, Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * C::PITCH + np * 16 +
                                 (lane >> 4) * 8);
                am_mma(o[2 * np], ph, b[0], b[1]);
                am_mma(o[2 * np], pl, b[0], b[1]);
                am_mma(o[2 * np + 1], ph, b[2], b[3]);
                am_mma(o[2 * np + 1], pl, b[2], b[3]);
            }
        }
    }

    /* write: the output row (one part) or the partial (m, l, acc) */
    float *part = (float *)((char *)scratch + ATT_COUNTER_BYTES);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = r0 + 8 * i;
        if (r >= P.rows || rlo[r] > rhi[r]) continue;
        const int64_t t = t0 + r / P.hb;
        const int h = hq0 + r % P.hb;
        if (n_part == 1) {
            float f = 1.0f, den = l[i];
            if (sinks) {
                const float sk = sinks[h], mf = fmaxf(m[i], sk);
                f = cm_expf(__fsub_rn(m[i], mf));
                den = __fadd_rn(__fmul_rn(l[i], f), cm_expf(__fsub_rn(sk, mf)));
            }
            float *orow = out + (t * P.n_head + h) * HD;
#pragma unroll
            for (int n = 0; n < C::NT; n++) {
                const float a0 = sinks ? __fmul_rn(o[n][2 * i], f) : o[n][2 * i];
                const float a1 = sinks ? __fmul_rn(o[n][2 * i + 1], f) : o[n][2 * i + 1];
                *(float2 *)(orow + 8 * n + 2 * t4) = make_float2(__fdiv_rn(a0, den), __fdiv_rn(a1, den));
            }
        } else {
            float *pp = part + ((t * P.n_head + h) * P.n_split + blockIdx.z) * (size_t)(HD + 2);
            if (t4 == 0) {
                pp[0] = m[i];
                pp[1] = l[i];
            }
#pragma unroll
            for (int n = 0; n < C::NT; n++) {
                pp[2 + 8 * n + 2 * t4] = o[n][2 * i];
                pp[3 + 8 * n + 2 * t4] = o[n][2 * i + 1];
            }
        }
    }
    if (n_part == 1) return;
    /* the last part of this tile to finish merges all parts */
    if (!attn_arrive_last((int *)scratch + blockIdx.x * gridDim.y + blockIdx.y, n_part)) return;
    for (int r = warp; r < P.rows; r += ATT_WARPS) {
        if (rlo[r] > rhi[r]) continue;
        const int64_t t = t0 + r / P.hb;
        const int h = hq0 + r % P.hb;
        attn_merge_row<HD / 32>(part + (t * P.n_head + h) * P.n_split * (size_t)(HD + 2), n_part, HD,
                                sinks ? sinks + h : NULL, out + (t * P.n_head + h) * HD);
    }
}

template <int HD>
static hm_status attn_mma_launch(const attn_plan *P, const cuda_attn_args *a, cudaStream_t s, hm_error *err) {
    const size_t smem = am_cfg<HD>::SMEM;
    cudaError_t e = cudaFuncSetAttribute(attn_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "cuda_attention: shared memory %zu bytes: %s", smem,
                            cudaGetErrorString(e));
    const dim3 grid((unsigned)((P->n_tok + P->nt - 1) / P->nt), (unsigned)(P->n_kv * P->n_hchunk),
                    (unsigned)P->n_split);
    cu_launch(attn_mma_kernel<HD>, grid, ATT_THREADS, smem, s, *P, a->q, (const uint16_t *)a->k_cache,
              (const uint16_t *)a->v_cache, a->d_pos, a->d_sinks, a->out, a->scratch);
    return attn_launched("attn_mma_kernel", err);
}

bool attn_mma_fits(const attn_plan *P) {
    return P->n_tok > 1 && P->rows <= AM_ROWS && (P->hd == 64 || P->hd == 128);
}

hm_status attn_mma(const attn_plan *P, const cuda_attn_args *a, cudaStream_t s, hm_error *err) {
    if (P->hd == 64) return attn_mma_launch<64>(P, a, s, err);
    return attn_mma_launch<128>(P, a, s, err);
}
