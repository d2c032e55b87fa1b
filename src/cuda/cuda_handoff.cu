/* cuda_handoff.cu - the GPU side of the tiered step's hand-off (protocol: cuda_handoff.h).
 *
 * DESIGN: three small kernels per host layer, all in stream order and all reading the step's
 * sequence number from device memory (so a captured step replays with a new number each time):
 *   ho_post_kernel   one block: the FFN-normed rows, ids and gating weights into the mapped
 *                    area, the message header, every thread's __threadfence_system(), a barrier,
 *                    then thread 0 stores ready = seq (volatile) and fences again;
 *   ho_wait_kernel   one thread: volatile loads of done, abort and %globaltimer until done ==
 *                    seq, abort != 0 or the timeout; a failed wait records the fault (first one
 *                    wins) and, on timeout, sets abort itself so that later waits end at once;
 *                    then, while ctl.stamps is set, its start and end times on the clock into
 *                    the layer's flags (the post kernel stored the request's; cuda_handoff.h);
 *   ho_take_kernel   the CPU's per-slot outputs y into e->ey with cache-volatile loads (ld.cv:
 *                    never a stale line), float4 when the row length allows.
 * The merge that follows (the combine kernels of the forward pass) is the all-GPU path's, so
 * the step's bytes are the all-GPU engine's whenever the CPU's slot outputs equal the device's
 * (decode-sized steps: the matvec kernels give the CPU's bytes).
 * The host side (reset, check, attach, view) reads and writes the control block through its host
 * address with volatile accesses and fences.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_launch.cuh"

extern "C" {
#include "base/log.h"
#include "cuda/cuda_engine_internal.h"
}

#define HO_TIMEOUT_MS_DEFAULT 20000u

static hm_status launched(const char *what, hm_error *err) {
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: %s: %s", what, cudaGetErrorString(ce));
    return HM_OK;
}

static __device__ __forceinline__ uint64_t ho_clock_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* xn [n_tok][n_embd], ids and gw [n_tok][n_used] (device) -> the mapped area; then ready. */
__global__ void ho_post_kernel(const uint32_t *d_seq, int layer, int n_tok, int n_used,
                               int n_embd, const float *xn, const int32_t *ids, const float *gw,
                               const int32_t *dslot, cuda_handoff_msg *msg, int32_t *h_ids,
                               float *h_gw, float *h_x, cuda_handoff_flags *flags,
                               uint32_t fetch) {
    cu_pdl_enter();
    const uint32_t seq = *d_seq;
    const int64_t nx = (int64_t)n_tok * n_embd, ns = (int64_t)n_tok * n_used;
    if ((nx & 3) == 0) {
        const float4 *s = (const float4 *)xn;
        float4 *d = (float4 *)h_x;
        for (int64_t i = threadIdx.x; i < nx / 4; i += blockDim.x) d[i] = s[i];
    } else {
        for (int64_t i = threadIdx.x; i < nx; i += blockDim.x) h_x[i] = xn[i];
    }
    for (int64_t i = threadIdx.x; i < ns; i += blockDim.x) {
        /* a mixed layer: a hot slot (computed here) posted as -2 - id: seen, not computed */
        h_ids[i] = dslot && dslot[i] >= 0 ? -2 - ids[i] : ids[i];
        h_gw[i] = gw[i];
    }
    if (threadIdx.x == 0) {
        volatile cuda_handoff_msg *m = msg;
        m->seq = seq;
        m->layer = (uint32_t)layer;
        m->n_tok = (uint32_t)n_tok;
        m->n_used = (uint32_t)n_used;
        m->fetch = fetch;
        flags[layer].t_post[seq & 1] = ho_clock_ns(); /* published with the rest, by ready */
    }
    __threadfence_system(); /* this thread's stores reach the host before ... */
    __syncthreads();        /* ... thread 0, after every thread's fence, publishes them */
    if (threadIdx.x == 0) {
        volatile cuda_handoff_flags *f = flags + layer;
        f->ready = seq;
        __threadfence_system();
    }
}

__global__ void ho_wait_kernel(const uint32_t *d_seq, int layer, cuda_handoff_flags *flags,
                               cuda_handoff_ctl *ctl) {
    cu_pdl_enter();
    const uint32_t seq = *d_seq;
    volatile cuda_handoff_flags *f = flags + layer;
    volatile cuda_handoff_ctl *c = ctl;
    const uint64_t limit = c->timeout_ns;
    const uint32_t stamps = c->stamps; /* the same line: no extra round trip */
    const uint64_t t0 = ho_clock_ns();
    uint32_t kind = 0;
    for (;;) {
        if (f->done == seq) break;
        if (c->abort != 0) {
            kind = CUDA_HANDOFF_FAULT_ABORT;
            break;
        }
        if (limit && ho_clock_ns() - t0 > limit) {
            c->abort = CUDA_HANDOFF_ABORT_GPU;
            kind = CUDA_HANDOFF_FAULT_TIMEOUT;
            break;
        }
        __nanosleep(128);
    }
    if (kind && c->fault == 0) {
        c->fault_layer = (uint32_t)layer;
        c->fault_seq = seq;
        __threadfence_system();
        c->fault = kind;
    }
    if (stamps) { /* read by the CPU after the next request's ready, or between steps */
        f->t_wait = t0;
        f->t_seen = ho_clock_ns();
        f->stamp_seq = seq;
    }
    __threadfence_system();
}

/* n items of y into ey; dslot (a mixed layer, else NULL): only the rows (row_items items, one
 * slot each) of slots without a device slot */
template <typename T>
__global__ void ho_take_kernel(const T *y, T *ey, int64_t n, const int32_t *dslot,
                               int64_t row_items) {
    cu_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        if (!dslot || dslot[i / row_items] < 0) ey[i] = __ldcv(y + i);
}

/* ---- enqueue (no host synchronisation) ---- */

extern "C" hm_status cuda_handoff_enqueue_post(cuda_engine *e, int il, int n_tok, bool fetch,
                                               bool cold_only, hm_error *err) {
    const cuda_handoff_view *v = &e->ho_d;
    if (!e->ho_mem || n_tok < 1 || n_tok > v->n_tok_max)
        return hm_error_set(err, HM_ERR_STATE, "GPU: hand-off of layer %d for %d tokens (area for "
                            "%d)", il, n_tok, e->ho_mem ? v->n_tok_max : 0);
    cu_launch(ho_post_kernel, 1, 512, 0, (cudaStream_t)e->stream, (const uint32_t *)e->d_seq, il,
              n_tok, (int)e->hp.n_expert_used, (int)e->hp.n_embd, (const float *)e->xn,
              (const int32_t *)e->ids, (const float *)e->gw,
              cold_only ? (const int32_t *)e->dslot : (const int32_t *)NULL, v->msg, v->ids,
              v->gw, v->x, v->flags, (uint32_t)(fetch ? 1 : 0));
    return launched("hand-off post", err);
}

extern "C" hm_status cuda_handoff_enqueue_wait(cuda_engine *e, int il, hm_error *err) {
    cu_launch(ho_wait_kernel, 1, 1, 0, (cudaStream_t)e->stream, (const uint32_t *)e->d_seq, il,
              e->ho_d.flags, e->ho_d.ctl);
    return launched("hand-off wait", err);
}

extern "C" hm_status cuda_handoff_enqueue_take(cuda_engine *e, int n_tok, bool cold_only,
                                               hm_error *err) {
    const int64_t n = (int64_t)n_tok * e->hp.n_expert_used * e->hp.n_embd;
    const bool v4 = (e->hp.n_embd & 3) == 0; /* whole rows of float4 */
    const int32_t *ds = cold_only ? (const int32_t *)e->dslot : (const int32_t *)NULL;
    const int64_t row = v4 ? e->hp.n_embd / 4 : e->hp.n_embd;
    const int64_t items = v4 ? n / 4 : n;
    int64_t blocks = (items + 255) / 256;
    if (blocks > 1024) blocks = 1024;
    if (blocks < 1) blocks = 1;
    cudaStream_t s = (cudaStream_t)e->stream;
    if (v4)
        cu_launch(ho_take_kernel<float4>, (unsigned)blocks, 256, 0, s,
                  (const float4 *)e->ho_d.y, (float4 *)e->ey, items, ds, row);
    else
        cu_launch(ho_take_kernel<float>, (unsigned)blocks, 256, 0, s, (const float *)e->ho_d.y,
                  e->ey, items, ds, row);
    return launched("hand-off take", err);
}

/* ---- init / free ---- */

extern "C" hm_status cuda_handoff_init(cuda_engine *e, hm_error *err) {
    if (e->n_host == 0) return HM_OK;
    const int nl = (int)e->hp.n_layer, E = (int)e->hp.n_embd, K = (int)e->hp.n_expert_used;
    const int nt = e->p.n_ubatch;
    e->host_layers = (int32_t *)malloc(sizeof(int32_t) * (size_t)e->n_host);
    if (!e->host_layers) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (hand-off)");
    int k = 0;
    for (int il = 0; il < nl; il++)
        if (e->layers[il].host || e->layers[il].mixed) e->host_layers[k++] = il;
    const int F = (int)e->hp.n_ff_exp;
    const size_t bytes = cuda_handoff_bytes(nl, E, K, nt, F);
    void *h = NULL, *d = NULL;
    cudaError_t ce = cudaHostAlloc(&h, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (ce != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: %.1f MiB of mapped pinned memory for the "
                            "hand-off of %d host layers: %s", (double)bytes / 1048576.0,
                            e->n_host, cudaGetErrorString(ce));
    e->ho_mem = h;
    e->ho_bytes = bytes;
    memset(h, 0, bytes);
    ce = cudaHostGetDevicePointer(&d, h, 0);
    if (ce != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: hand-off: cudaHostGetDevicePointer: %s",
                            cudaGetErrorString(ce));
    cuda_handoff_layout(h, nl, E, K, nt, F, e->hp.n_expert, e->host_layers, e->n_host, &e->ho_h);
    cuda_handoff_layout(d, nl, E, K, nt, F, e->hp.n_expert, e->host_layers, e->n_host, &e->ho_d);
    e->ho_h.ctl->timeout_ns = HO_TIMEOUT_MS_DEFAULT * 1000000ull; /* the CPU side sets its own */
    return HM_OK;
}

extern "C" void cuda_handoff_free(cuda_engine *e) {
    if (e->ho_attached)
        HM_LOGW("GPU engine freed while a CPU side is attached to its hand-off (free the "
                "tiered object first: its worker reads this memory)");
    if (e->ho_mem) {
        volatile cuda_handoff_ctl *c = e->ho_h.ctl;
        c->abort = CUDA_HANDOFF_ABORT_HOST;
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (e->stream) cudaStreamSynchronize((cudaStream_t)e->stream);
        cudaFreeHost(e->ho_mem);
    }
    free(e->host_layers);
    free(e->fetch); /* the fetched path's layouts (cuda_fetch.cu) */
    if (e->d_pfslot) cudaFree(e->d_pfslot); /* post-fetch's table (cuda_postfetch.cu) */
    e->d_pfslot = NULL;
    e->pf_on = false;
    e->ho_mem = NULL;
    e->host_layers = NULL;
    e->fetch = NULL;
    e->fetch_cap = 0;
}

/* ---- the host API (cuda_handoff.h) ---- */

extern "C" int cuda_engine_host_layers(const cuda_engine *e) { return e ? e->n_host : 0; }

extern "C" hm_status cuda_engine_handoff_view(cuda_engine *e, cuda_handoff_view *v,
                                              hm_error *err) {
    if (!e || !e->ho_mem)
        return hm_error_set(err, HM_ERR_STATE, "hand-off: the engine has no host layer");
    *v = e->ho_h;
    return HM_OK;
}

extern "C" hm_status cuda_engine_handoff_attach(cuda_engine *e, bool on, hm_error *err) {
    if (!e || !e->ho_mem)
        return hm_error_set(err, HM_ERR_STATE, "hand-off: the engine has no host layer");
    if (on && e->ho_attached)
        return hm_error_set(err, HM_ERR_STATE, "hand-off: a CPU side is attached already");
    e->ho_attached = on;
    return HM_OK;
}

extern "C" hm_status cuda_engine_handoff_reset(cuda_engine *e, hm_error *err) {
    if (!e || !e->ho_mem) return HM_OK;
    volatile cuda_handoff_ctl *c = e->ho_h.ctl;
    c->abort = CUDA_HANDOFF_ABORT_HOST; /* no wait can last while the stream drains */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (cudaSetDevice(e->p.device) != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: cannot select device %d", e->p.device);
    hm_status st = cuda_engine_sync(e, err);
    if (st != HM_OK) return st;
    for (int i = 0; i < e->n_host; i++) {
        volatile cuda_handoff_flags *f = e->ho_h.flags + e->host_layers[i];
        f->done = f->ready;
    }
    c->fault = 0;
    c->fault_layer = 0;
    c->fault_seq = 0;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    c->abort = 0;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return HM_OK;
}

extern "C" hm_status cuda_engine_handoff_check(const cuda_engine *e, hm_error *err) {
    if (!e || !e->ho_mem) return HM_OK;
    volatile const cuda_handoff_ctl *c = e->ho_h.ctl;
    const uint32_t kind = c->fault;
    if (kind == 0) return HM_OK;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    const double ms = (double)c->timeout_ns * 1e-6;
    if (kind == CUDA_HANDOFF_FAULT_TIMEOUT)
        return hm_error_set(err, HM_ERR_STATE, "tiered step: the CPU did not answer layer %u of "
                            "step %u within %.0f ms (the GPU stopped waiting; reset the CPU "
                            "side: hm_tiered_reset)", c->fault_layer, c->fault_seq, ms);
    return hm_error_set(err, HM_ERR_STATE, "tiered step: the CPU side aborted layer %u of step "
                        "%u (hm_tiered_check says why; hm_tiered_reset serves again)",
                        c->fault_layer, c->fault_seq);
}

extern "C" hm_status cuda_handoff_ready(const cuda_engine *e, hm_error *err) {
    if (!e->ho_mem) return HM_OK;
    if (!e->ho_attached)
        return hm_error_set(err, HM_ERR_STATE, "GPU: %d layer%s keep their experts in host memory "
                            "and no CPU side serves them (runtime/tiered.h)", e->n_host,
                            e->n_host == 1 ? "" : "s");
    volatile const cuda_handoff_ctl *c = e->ho_h.ctl;
    if (c->abort != 0) {
        hm_status st = cuda_engine_handoff_check(e, err);
        if (st != HM_OK) return st;
        return hm_error_set(err, HM_ERR_STATE, "tiered step: the CPU side stopped serving "
                            "(aborted; hm_tiered_reset serves again)");
    }
    return HM_OK;
}
