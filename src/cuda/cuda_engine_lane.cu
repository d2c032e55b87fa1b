/* cuda_engine_lane.cu - the GPU engine as a lane of the expert executor: given slots of one
 * layer, computed on the device from host rows.
 *
 * DESIGN: a CPU forward pass hands over one layer's FFN input rows and the ids of the slots
 * this lane runs (moe/moe_exec.h); the engine looks up each expert's device slot in its
 * expert->slot table, uploads rows and slots, runs the expert FFN with the matvec kernels
 * (the CPU's bytes for every weight type, whatever the token count) and copies back the rows
 * of its slots only (slots from the table's host copy). Synchronous: one stream synchronisation
 * per call, counted in the audit.
 * The asynchronous hand-off of the tiered step (mapped flags, no host wait) builds on it.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cuda/cuda_engine_internal.h"
}

static hm_status cuda_ok(cudaError_t ce, const char *what, hm_error *err) {
    if (ce == cudaSuccess) return HM_OK;
    return hm_error_set(err, HM_ERR_CUDA, "GPU lane: %s: %s", what, cudaGetErrorString(ce));
}

extern "C" hm_status cuda_engine_experts(cuda_engine *e, int il, int n_tok, const float *x,
                                         const int32_t *ids, float *y, hm_error *err) {
    const hm_hparams *hp = &e->hp;
    if (il < 0 || il >= hp->n_layer || !e->layers[il].gate_exps.d)
        return hm_error_set(err, HM_ERR_ARG, "GPU lane: layer %d has no experts", il);
    if (n_tok < 1 || n_tok > e->p.n_ubatch)
        return hm_error_set(err, HM_ERR_ARG, "GPU lane: %d tokens (1..%d)", n_tok,
                            e->p.n_ubatch);
    const int K = (int)hp->n_expert_used, NE = (int)hp->n_expert;
    const int64_t E = hp->n_embd, ns = (int64_t)n_tok * K;
    const int32_t *slot_of = e->h_slot_of + (size_t)il * (size_t)NE;
    int32_t *ds = (int32_t *)malloc(sizeof(int32_t) * (size_t)ns);
    float *out = (float *)malloc(sizeof(float) * (size_t)(ns * E));
    hm_status st = ds && out ? HM_OK
                                         : hm_error_set(err, HM_ERR_NOMEM, "out of memory (GPU lane)");
    cudaStream_t s = (cudaStream_t)e->stream;
    for (int64_t i = 0; i < ns && st == HM_OK; i++) {
        const int32_t id = ids[i];
        ds[i] = id >= 0 && id < NE ? slot_of[id] : -1;
        if (id >= NE || (id >= 0 && ds[i] < 0))
            st = hm_error_set(err, HM_ERR_STATE, "GPU lane: layer %d expert %d has no device "
                              "slot", il, id);
    }
    if (st == HM_OK)
        st = cuda_ok(cudaMemcpyAsync(e->xn, x, sizeof(float) * (size_t)(n_tok * E),
                                     cudaMemcpyHostToDevice, s), "input rows", err);
    if (st == HM_OK)
        st = cuda_ok(cudaMemcpyAsync(e->dslot, ds, sizeof(int32_t) * (size_t)ns,
                                     cudaMemcpyHostToDevice, s), "slots", err);
    if (st == HM_OK) st = cuda_engine_enqueue_experts(e, il, n_tok, err);
    if (st == HM_OK)
        st = cuda_ok(cudaMemcpyAsync(out, e->ey, sizeof(float) * (size_t)(ns * E),
                                     cudaMemcpyDeviceToHost, s), "outputs", err);
    if (st == HM_OK) {
        st = cuda_ok(cudaStreamSynchronize(s), "expert FFN", err);
        e->n_host_syncs++;
    }
    for (int64_t i = 0; i < ns && st == HM_OK; i++) /* this lane's rows only */
        if (ds[i] >= 0) memcpy(y + i * E, out + i * E, sizeof(float) * (size_t)E);
    free(ds);
    free(out);
    return st;
}
