/* cuda_router.cuh - the router's selection on one token, run by a whole block: the procedure of
 * cpu_router with its bits (docs/OPS.md), shared by router_kernel (cuda_ops.cu) and
 * k_fused_router (cuda_fused_router.cu).
 *
 * DESIGN: the scores (logit + bias) sit in shared memory. Softmax-then-top-k: the max by
 * warp trees and a per-warp array (exact in any order), exp in place, thread 0's sequential
 * sum in expert order, then the divisions. Every thread ranks its experts by (score desc, id
 * asc, NaN last), counting all others (no early exit, so the loads pipeline), and writes slot
 * rank < k; with more experts than threads, k rounds of a block-wide maximum pick the same
 * slots (rt_rounds). Thread 0 finishes: renormalisation (softmax-then-top-k) or the softmax over the k
 * (top-k-then-softmax), both in slot order. Header-only.
 */
#ifndef HM_CUDA_CUDA_ROUTER_CUH
#define HM_CUDA_CUDA_ROUTER_CUH

#include <math.h>

#include "cuda/cuda_math.cuh"

extern "C" {
#include "cpu/ops.h"
}

/* a (id ia) sorts before b (id ib): higher score first, equal scores lower id first; a NaN
 * sorts after every number (the order stays total, so ranks are distinct) */
static __device__ __forceinline__ bool rt_before(float a, int ia, float b, int ib) {
    const bool an = a != a, bn = b != b;
    if (an || bn) return an && bn ? ia < ib : bn;
    if (a != b) return a > b;
    return ia < ib;
}

/* rt_before as one 64-bit order, larger first: the score's bits made monotonic (-0 as +0, NaN
 * below every number) above the id's complement (equal scores: lower id first). */
static __device__ __forceinline__ unsigned long long rt_key(float v, int id) {
    uint32_t hi = 0;
    if (v == v) {
        const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
        hi = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    }
    return ((unsigned long long)hi << 32) | (unsigned long long)(0xffffffffu - (uint32_t)id);
}

/* The top k of sc [n_expert] in k rounds of a block-wide maximum of rt_key (thread t holds
 * experts t, t + blockDim.x, ... : at most 32, so n_expert <= 32 blockDim.x); slot r gets
 * round r's winner, which is rank r of the ranking below. Many experts a thread (qwen3next's 512
 * on 128 threads) cost k short rounds instead of n_expert comparisons per expert. */
static __device__ __forceinline__ void rt_rounds(const float *sc, int n_expert, int k,
                                                 int32_t *ids, float *w, int32_t *dslot,
                                                 const int32_t *slot_of, uint32_t *hits) {
    __shared__ unsigned long long s_best[32];
    const int bd = (int)blockDim.x, nw = (bd + 31) >> 5, lane = threadIdx.x & 31;
    uint32_t taken = 0;
    for (int r = 0; r < k; r++) {
        unsigned long long best = 0;
        int bj = -1;
        for (int j = 0, e = threadIdx.x; e < n_expert; j++, e += bd) {
            if ((taken >> j) & 1u) continue;
            const unsigned long long key = rt_key(sc[e], e);
            if (key > best) best = key, bj = j;
        }
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long v = __shfl_xor_sync(0xffffffffu, best, o);
            best = v > best ? v : best;
        }
        if (lane == 0) s_best[threadIdx.x >> 5] = best;
        __syncthreads();
        unsigned long long m = 0;
        for (int i = 0; i < nw; i++) m = s_best[i] > m ? s_best[i] : m;
        const int id = (int)(0xffffffffu - (uint32_t)m);
        if (bj >= 0 && (int)threadIdx.x + bj * bd == id) taken |= 1u << bj;
        if (threadIdx.x == 0) {
            ids[r] = id;
            w[r] = sc[id];
            if (dslot) dslot[r] = slot_of[id];
            if (hits) atomicAdd(hits + id, 1u);
        }
        __syncthreads(); /* s_best is written again by the next round */
    }
}

/* sc: [n_expert] scores in shared memory (overwritten); red: [blockDim.x / 32] shared floats;
 * ids, w: [k] the token's slots; dslot (NULL: none): [k] the selected experts' device slots,
 * slot_of[id]; hits (NULL: none): [n_expert] += 1 per selected expert (cuda_route_out). Every
 * thread of the block calls it. */
static __device__ __forceinline__ void rt_select(float *sc, float *red, int n_expert, int k,
                                                 int mode, int renorm, int32_t *ids, float *w,
                                                 int32_t *dslot, const int32_t *slot_of,
                                                 uint32_t *hits) {
    __shared__ float s_sum;
    if (mode == CPU_GATE_SOFTMAX_TOPK) {
        float m = -INFINITY;
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) m = sc[e] > m ? sc[e] : m;
        for (int o = 16; o > 0; o >>= 1) {
            const float v = __shfl_down_sync(0xffffffffu, m, o);
            m = v > m ? v : m;
        }
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
        __syncthreads();
        m = -INFINITY;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = red[i] > m ? red[i] : m;
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) sc[e] = cm_expf(__fsub_rn(sc[e], m));
        __syncthreads();
        if (threadIdx.x == 0) { /* loads a group ahead of the adds: 512 experts wait on adds only */
            float sum = 0.0f;
            for (int e0 = 0; e0 < n_expert; e0 += 16) {
                float v[16];
#pragma unroll
                for (int j = 0; j < 16; j++) v[j] = e0 + j < n_expert ? sc[e0 + j] : 0.0f;
#pragma unroll
                for (int j = 0; j < 16; j++)
                    if (e0 + j < n_expert) sum = __fadd_rn(sum, v[j]);
            }
            s_sum = sum;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) sc[e] = __fdiv_rn(sc[e], s_sum);
        __syncthreads();
    }
    if (n_expert > (int)blockDim.x)
        rt_rounds(sc, n_expert, k, ids, w, dslot, slot_of, hits);
    else
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
            const float v = sc[e];
            int rank = 0;
#pragma unroll 8
            for (int o = 0; o < n_expert; o++) rank += rt_before(sc[o], o, v, e);
            if (rank < k) {
                ids[rank] = e;
                w[rank] = v;
                if (dslot) dslot[rank] = slot_of[e];
                if (hits) atomicAdd(hits + e, 1u);
            }
        }
    __syncthreads();
    if (threadIdx.x != 0) return;
    if (mode == CPU_GATE_SOFTMAX_TOPK) {
        if (renorm) {
            float s = 0.0f;
            for (int i = 0; i < k; i++) s = __fadd_rn(s, w[i]);
            for (int i = 0; i < k; i++) w[i] = __fdiv_rn(w[i], s);
        }
    } else {
        const float m = w[0];
        float sum = 0.0f;
        for (int i = 0; i < k; i++) {
            w[i] = cm_expf(__fsub_rn(w[i], m));
            sum = __fadd_rn(sum, w[i]);
        }
        for (int i = 0; i < k; i++) w[i] = __fdiv_rn(w[i], sum);
    }
}

#endif
