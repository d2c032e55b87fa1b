/* cuda_route_table.cu - routing taken from a table instead of the routers (cuda_engine.h:
 * cuda_engine_route_table): benchmarks of forged models with realistic routing
 * (--moe-routing-profile, moe/route_synth.h).
 *
 * DESIGN: the table [n_pos][n_layer][n_used] lives in device memory; after a MoE layer's router,
 * one thread per (token, slot) reads the row of the token's position (e->d_positions, so the
 * captured decode graph replays it at every position), writes the id, the weight 1 / n_used and
 * the device slot (the layer's slot table), and counts the id when routing counts are on (the
 * router itself then counts nothing). Positions outside the table keep the router's choice.
 */
#include <cuda_runtime.h>
#include <stdlib.h>

#include "cuda/cuda_launch.cuh"

extern "C" {
#include "cuda/cuda_engine_internal.h"
}

__global__ void route_table_kernel(const int32_t *table, int n_pos, int n_layer, int il, int K,
                                   const int32_t *positions, int n_tok, int32_t *ids, float *gw,
                                   const int32_t *slot_of, int32_t *dslot, uint32_t *hits,
                                   uint64_t *stat) {
    cu_pdl_enter();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_tok * K) return;
    const int pos = positions[i / K];
    if (pos >= 0 && pos < n_pos) {
        const int32_t id = table[((size_t)pos * (size_t)n_layer + (size_t)il) * (size_t)K + i % K];
        ids[i] = id;
        gw[i] = 1.0f / (float)K;
        dslot[i] = slot_of[id];
    }
    if (hits) atomicAdd(&hits[ids[i]], 1u);
    if (stat && i == 0) {
        atomicAdd((unsigned long long *)stat, 1ull);
        atomicAdd((unsigned long long *)(stat + 1), (unsigned long long)n_tok);
    }
}

hm_status cuda_route_table_enqueue(cuda_engine *e, int il, int n, hm_error *err) {
    const int K = (int)e->hp.n_expert_used;
    uint32_t *hits = e->counting ? e->d_hits + (size_t)il * (size_t)e->hp.n_expert : NULL;
    uint64_t *stat = e->counting ? e->d_stat + 2 * (size_t)il : NULL;
    cu_launch(route_table_kernel, (unsigned)((n * K + 127) / 128), 128, 0,
              (cudaStream_t)e->stream, (const int32_t *)e->d_route_table, e->route_table_pos,
              (int)e->hp.n_layer, il, K, (const int32_t *)e->d_positions, n, e->ids, e->gw,
              e->layers[il].slot_of, e->dslot, hits, stat);
    cudaError_t ce = cudaGetLastError();
    return ce == cudaSuccess ? HM_OK
                             : hm_error_set(err, HM_ERR_CUDA, "GPU: route table: %s",
                                            cudaGetErrorString(ce));
}

extern "C" hm_status cuda_engine_route_table(cuda_engine *e, const int32_t *table, int n_pos,
                                             hm_error *err) {
    cudaSetDevice(e->p.device);
    if (!table || n_pos <= 0) {
        cudaStreamSynchronize((cudaStream_t)e->stream); /* no step reads the old table now */
        e->n_host_syncs++;
        cudaFree(e->d_route_table);
        e->d_route_table = NULL;
        e->route_table_pos = 0;
        e->count_epoch++; /* a captured decode step recaptures without the kernel */
        return HM_OK;
    }
    const int NL = (int)e->hp.n_layer, K = (int)e->hp.n_expert_used, NE = (int)e->hp.n_expert;
    const size_t n = (size_t)n_pos * (size_t)NL * (size_t)K;
    for (size_t i = 0; i < n; i++)
        if (table[i] < 0 || table[i] >= NE)
            return hm_error_set(err, HM_ERR_ARG, "route table: id %d at entry %zu (the model has "
                                "%d experts)", table[i], i, NE);
    cudaStreamSynchronize((cudaStream_t)e->stream);
    e->n_host_syncs++;
    cudaFree(e->d_route_table);
    e->d_route_table = NULL;
    cudaError_t ce = cudaMalloc((void **)&e->d_route_table, n * sizeof(int32_t));
    if (ce == cudaSuccess)
        ce = cudaMemcpy(e->d_route_table, table, n * sizeof(int32_t), cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) {
        cudaFree(e->d_route_table);
        e->d_route_table = NULL;
        return hm_error_set(err, HM_ERR_CUDA, "route table (%zu MiB): %s",
                            (n * sizeof(int32_t)) >> 20, cudaGetErrorString(ce));
    }
    e->route_table_pos = n_pos;
    e->count_epoch++; /* a captured decode step recaptures with the kernel */
    return HM_OK;
}
