/* cuda_route_counts.cu - the routing counters (cuda_engine.h: cuda_engine_route_counts_enable
 * and _read): per layer the calls and tokens, per layer and expert the hits, added on the device
 * by the router (or the route table) while counting is on and read once a call or a generation
 * ends, so the decode loop has no host synchronisation per token.
 */
#include <cuda_runtime.h>

extern "C" {
#include "cuda/cuda_engine_internal.h"
}

extern "C" hm_status cuda_engine_route_counts_enable(cuda_engine *e, bool on, hm_error *err) {
    if (!e) return hm_error_set(err, HM_ERR_ARG, "route counts: no engine");
    if (on == e->counting) return HM_OK;
    if (cudaSetDevice(e->p.device) != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: cannot select device %d", e->p.device);
    if (on && !e->count_arena) { /* [n_layer][2] u64 calls/tokens, then [n_layer][n_expert] u32 */
        const size_t nl = (size_t)e->hp.n_layer, ne = (size_t)e->hp.n_expert;
        const size_t bytes = sizeof(uint64_t) * 2 * nl + sizeof(uint32_t) * nl * ne;
        void *d = NULL, *h = NULL;
        cudaError_t ce = cudaMalloc(&d, bytes);
        if (ce == cudaSuccess) ce = cudaMallocHost(&h, bytes);
        if (ce != cudaSuccess) {
            cudaFree(d);
            return hm_error_set(err, HM_ERR_CUDA, "GPU: route counters (%zu bytes): %s", bytes,
                                cudaGetErrorString(ce));
        }
        e->count_arena = d;
        e->h_count = h;
        e->count_bytes = bytes;
        e->d_stat = (uint64_t *)d;
        e->d_hits = (uint32_t *)(e->d_stat + 2 * nl);
    }
    if (on) { /* in stream order: steps enqueued before do not count */
        cudaError_t ce = cudaMemsetAsync(e->count_arena, 0, e->count_bytes,
                                         (cudaStream_t)e->stream);
        if (ce != cudaSuccess)
            return hm_error_set(err, HM_ERR_CUDA, "GPU: route counters: %s",
                                cudaGetErrorString(ce));
    }
    e->counting = on;
    e->count_epoch++;
    return HM_OK;
}

extern "C" hm_status cuda_engine_route_counts_read(cuda_engine *e, uint64_t *hits,
                                                   uint64_t *calls, uint64_t *tokens,
                                                   hm_error *err) {
    if (!e || !hits) return hm_error_set(err, HM_ERR_ARG, "route counts: no engine or no hits");
    if (!e->count_arena)
        return hm_error_set(err, HM_ERR_STATE, "route counts: counting was never enabled");
    if (cudaSetDevice(e->p.device) != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: cannot select device %d", e->p.device);
    cudaStream_t s = (cudaStream_t)e->stream;
    cudaError_t ce = cudaMemcpyAsync(e->h_count, e->count_arena, e->count_bytes,
                                     cudaMemcpyDeviceToHost, s);
    if (ce == cudaSuccess) ce = cudaMemsetAsync(e->count_arena, 0, e->count_bytes, s);
    if (ce != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: route counters: %s", cudaGetErrorString(ce));
    hm_status st = cuda_engine_sync(e, err);
    if (st != HM_OK) return st;
    const size_t nl = (size_t)e->hp.n_layer, ne = (size_t)e->hp.n_expert;
    const uint64_t *stat = (const uint64_t *)e->h_count;
    const uint32_t *h = (const uint32_t *)(stat + 2 * nl);
    for (size_t il = 0; il < nl; il++) {
        if (calls) calls[il] += stat[2 * il];
        if (tokens) tokens[il] += stat[2 * il + 1];
    }
    for (size_t i = 0; i < nl * ne; i++) hits[i] += h[i];
    return HM_OK;
}
