/* cuda_router.cuh - the router's selection on one token, run by a whole block: the procedure of
 * cpu_router with its bits (docs/OPS.md), shared by router_kernel (cuda_ops.cu) and
 * k_fused_router (cuda_fused_router.cu).
 *
 * DESIGN: the scores (logit + bias) sit in shared memory. Softmax-then-top-k: the max by
 * warp trees and a per-warp array (exact in any order), exp in place, thread 0's sequential
 * sum in expert order, then the divisions. Every thread ranks its experts by (score desc, id
 * asc, NaN last), counting all others (no early exit, so the loads pipeline), and writes slot
 * rank < k. Thread 0 finishes: renormalisation (softmax-then-top-k) or the softmax over the k
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
        if (threadIdx.x == 0) {
            float sum = 0.0f;
            for (int e = 0; e < n_expert; e++) sum = __fadd_rn(sum, sc[e]);
            s_sum = sum;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) sc[e] = __fdiv_rn(sc[e], s_sum);
        __syncthreads();
    }
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
