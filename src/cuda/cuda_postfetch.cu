/* cuda_postfetch.cu - post-fetch at decode steps (seed 000), the GPU side: the down product of
 * the cold experts whose down rows the CPU side copied over PCIe (cuda_fetch.h:
 * cuda_engine_postfetch_set, runtime/tiered_postfetch.c).
 *
 * DESIGN: at a host or mixed layer of a decode-sized request (n_tok <= CUDA_HANDOFF_PF_TOK),
 * with post-fetch on, after the hand-off's take the step runs
 *   pf_table_kernel   fslot (mapped; cache-volatile loads) -> d_pfslot, ids outside
 *                     [0, n_tok * n_used) -> -1;
 *   pf_rows_kernel    h (mapped) -> e->eg, the activations of those slots;
 *   cuda_quantize_act + cuda_moe_matvec   the down product over the staging buffer il & 1,
 *                     scratch slot k at k * (the down matrix's bytes per expert), slots < 0
 *                     skipped: the kernels the GPU's own decode runs for a resident expert's
 *                     down product, on the activation the CPU computed with the same bytes, so
 *                     the slot's output in e->ey is the bytes the CPU would have produced.
 * The take wrote the CPU's y into every cold slot first; the product overwrites the post-fetched
 * ones. Layers with down biases are not eligible (the CPU computes their down). The kernels are
 * part of the captured step only while post-fetch is on, so an engine without it runs the same
 * graph as before.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_launch.cuh"

extern "C" {
#include "cuda/cuda_engine_internal.h"
#include "cuda/cuda_quant.h"
}

static hm_status launched(const char *what, hm_error *err) {
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: post-fetch %s: %s", what,
                            cudaGetErrorString(ce));
    return HM_OK;
}

__global__ void pf_table_kernel(const int32_t *fslot, int32_t *pfslot, int n, int n_slots) {
    cu_pdl_enter();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int s = __ldcv(fslot + i);
        pfslot[i] = s >= 0 && s < n_slots ? s : -1;
    }
}

__global__ void pf_rows_kernel(const float *h, float *eg, int64_t n) {
    cu_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        eg[i] = __ldcv(h + i);
}

/* Bytes of one expert's down rows in layer il (0: no down matrix). */
static size_t down_bytes(const cuda_engine *e, int il) {
    const hm_tensor *d = &hm_model_layer(e->m, il)->down_exps;
    return d->data ? cuda_tensor_bytes(d) / (size_t)e->hp.n_expert : 0;
}

extern "C" bool cuda_engine_postfetch_layer(const cuda_engine *e, int il, size_t *bytes) {
    if (bytes) *bytes = 0;
    if (!e || il < 0 || il >= e->hp.n_layer || !e->pf_on) return false;
    const cuda_layer *L = &e->layers[il];
    const size_t db = down_bytes(e, il);
    size_t slots = (size_t)CUDA_HANDOFF_PF_TOK * (size_t)e->hp.n_expert_used; /* distinct */
    if (slots > (size_t)e->hp.n_expert) slots = (size_t)e->hp.n_expert;
    if (!(L->host || L->mixed) || L->down_exps_b.d || hm_model_layer(e->m, il)->down_exps_b.data ||
        db == 0 || slots * db > e->fetch_cap)
        return false;
    if (bytes) *bytes = db;
    return true;
}

extern "C" hm_status cuda_engine_postfetch_set(cuda_engine *e, bool on, hm_error *err) {
    if (!e || e->n_host == 0)
        return hm_error_set(err, HM_ERR_STATE, "post-fetch: the engine has no host layer");
    if (on && e->fetch_cap == 0)
        return hm_error_set(err, HM_ERR_STATE, "post-fetch: no staging buffers (the copy lane "
                            "is off)");
    if (on && !e->d_pfslot) {
        cudaSetDevice(e->p.device);
        const size_t n = (size_t)CUDA_HANDOFF_PF_TOK * (size_t)e->hp.n_expert_used;
        cudaError_t ce = cudaMalloc((void **)&e->d_pfslot, sizeof(int32_t) * n);
        if (ce != cudaSuccess)
            return hm_error_set(err, HM_ERR_CUDA, "post-fetch: %zu bytes of slot table: %s",
                                sizeof(int32_t) * n, cudaGetErrorString(ce));
    }
    e->pf_on = on;
    e->count_epoch++; /* a captured decode step is captured again, with or without it */
    return HM_OK;
}

bool cuda_postfetch_active(const cuda_engine *e, int il, int n_tok) {
    return e->pf_on && n_tok <= CUDA_HANDOFF_PF_TOK && cuda_engine_postfetch_layer(e, il, NULL);
}

hm_status cuda_postfetch_enqueue(cuda_engine *e, int il, int n_tok, hm_error *err) {
    if (!cuda_engine_postfetch_layer(e, il, NULL)) return HM_OK;
    const int K = (int)e->hp.n_expert_used, n = n_tok * K;
    const int ns = n < (int)e->hp.n_expert ? n : (int)e->hp.n_expert; /* scratch slots */
    const int64_t F = e->hp.n_ff_exp, E = e->hp.n_embd;
    cudaStream_t s = (cudaStream_t)e->stream;
    cu_launch(pf_table_kernel, 1, 256, 0, s, (const int32_t *)e->ho_d.fslot, e->d_pfslot, n, ns);
    hm_status st = launched("slot table", err);
    if (st != HM_OK) return st;
    const int64_t nh = (int64_t)n * F;
    int64_t blocks = (nh + 255) / 256;
    if (blocks > 1024) blocks = 1024;
    cu_launch(pf_rows_kernel, (unsigned)blocks, 256, 0, s, (const float *)e->ho_d.h, e->eg, nh);
    st = launched("activations", err);
    if (st != HM_OK) return st;
    const hm_layer *L = hm_model_layer(e->m, il);
    cuda_moe_args d;
    memset(&d, 0, sizeof(d));
    d.wtype = L->down_exps.type;
    d.w = e->fetch_buf[cuda_fetch_buffer(il)];
    d.n_expert = ns;
    d.n_rows = E;
    d.k = F;
    d.x_per_slot = 1;
    d.ids = e->d_pfslot;
    d.n_tok = n_tok;
    d.n_used = K;
    d.y = e->ey;
    if (cuda_act_row_bytes(d.wtype, F) == 4 * (size_t)F) {
        d.act = e->eg;
    } else {
        d.act = e->act;
        st = cuda_quantize_act(d.wtype, e->eg, F, n, e->act, e->stream, err);
    }
    return st == HM_OK ? cuda_moe_matvec(&d, e->stream, err) : st;
}
