/* cuda_hot.cu - the hot cache's slot exchanges (cuda_engine.h: cuda_engine_hot_exchange, _poll).
 *
 * DESIGN: an exchange in mixed layer il gives hot expert out's device slot s to cold expert in.
 * On the engine's stream, between the steps already enqueued and the next: a one-thread kernel
 * sets slot_of[il][out] = -1 and an event is recorded; the side stream waits for that event
 * (every step that could read slot s with out's bytes has finished), copies in's six parts
 * (gate, up and down rows, the biases present) from the model's host memory into slot s of
 * each arena (asynchronous from registered memory; a pageable source is staged by the driver)
 * and records `copied`. cuda_engine_hot_poll asks each pending exchange's event without
 * waiting; for a completed one it enqueues slot_of[il][in] = s on the engine's stream (between
 * steps again) and updates the host table. Meanwhile both experts are cold: the CPU side
 * computes whichever of them a step selects (the post kernel asks for every slot whose table
 * entry is -1). No allocation, no shape change, no host wait.
 * Another thread (the CPU side's controller) asks through a single-producer queue; the engine's
 * own thread drains it before each step (cuda_hot_service), so every call on the engine's stream
 * stays on one thread and none lands inside a graph capture.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_launch.cuh"

extern "C" {
#include "cuda/cuda_engine_internal.h"
#include "base/log.h"
#include "quant/qtypes.h"
}

typedef struct cuda_hot_queue cuda_hot_queue;

struct cuda_hot_pending {
    int layer, in, slot;
    cudaEvent_t copied;
};

/* Single producer (the worker), single consumer (the engine's thread): head written by the
 * producer, tail by the consumer. */
struct cuda_hot_queue {
    int32_t req[CUDA_HOT_PENDING][3]; /* layer, out, in */
    unsigned head, tail;
    unsigned long long applied, refused;
};

static hm_status hot_fail(hm_error *err, cudaError_t ce, const char *what) {
    return hm_error_set(err, HM_ERR_CUDA, "hot cache exchange: %s: %s", what,
                        cudaGetErrorString(ce));
}

__global__ void hot_set_kernel(int32_t *slot_of, int32_t value) {
    cu_pdl_enter();
    *slot_of = value;
}

static hm_status lazy_init(cuda_engine *e, hm_error *err) {
    if (e->hot_pending) return HM_OK;
    e->hot_pending = (cuda_hot_pending *)calloc(CUDA_HOT_PENDING, sizeof(cuda_hot_pending));
    if (!e->hot_pending) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache)");
    cudaStream_t s = NULL;
    cudaError_t ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (ce != cudaSuccess) return hot_fail(err, ce, "stream");
    e->hot_stream = s;
    return HM_OK;
}

static bool pending_in(const cuda_engine *e, int il, int x) {
    for (int i = 0; i < e->n_hot_pending; i++)
        if (e->hot_pending[i].layer == il && e->hot_pending[i].in == x) return true;
    return false;
}

/* The copies of expert `in`'s parts of layer il into slot s, on the side stream. */
static hm_status copy_expert(cuda_engine *e, int il, int in, int s, hm_error *err) {
    const hm_layer *L = hm_model_layer(e->m, il);
    const cuda_layer *D = &e->layers[il];
    const hm_tensor *src[6] = {&L->gate_exps, &L->up_exps, &L->down_exps,
                               &L->gate_exps_b, &L->up_exps_b, &L->down_exps_b};
    const cuda_tensor *dst[6] = {&D->gate_exps, &D->up_exps, &D->down_exps,
                                 &D->gate_exps_b, &D->up_exps_b, &D->down_exps_b};
    const int64_t NE = e->hp.n_expert;
    for (int i = 0; i < 6; i++) {
        const size_t n = cuda_tensor_bytes(src[i]);
        if (!n || !dst[i]->d) continue;
        const size_t stride = n / (size_t)NE; /* in the file: expert_stride (a fused gate/up) */
        const size_t from = src[i]->expert_stride ? src[i]->expert_stride : stride;
        cudaError_t ce = cudaMemcpyAsync((char *)dst[i]->d + (size_t)s * stride,
                                         (const char *)src[i]->data + (size_t)in * from, stride,
                                         cudaMemcpyHostToDevice, (cudaStream_t)e->hot_stream);
        if (ce != cudaSuccess) return hot_fail(err, ce, "copy");
    }
    return HM_OK;
}

extern "C" hm_status cuda_engine_hot_exchange(cuda_engine *e, int il, int out, int in,
                                              hm_error *err) {
    const int NE = (int)e->hp.n_expert;
    if (il < 0 || il >= e->hp.n_layer || !e->layers[il].mixed)
        return hm_error_set(err, HM_ERR_ARG, "hot cache exchange: layer %d is not a mixed layer",
                            il);
    int32_t *h = e->h_slot_of + (size_t)il * (size_t)NE;
    if (out < 0 || out >= NE || in < 0 || in >= NE || h[out] < 0 || h[in] >= 0 ||
        pending_in(e, il, in))
        return hm_error_set(err, HM_ERR_ARG, "hot cache exchange: layer %d: expert %d must hold "
                            "a slot and expert %d none (slots %d and %d)", il, out, in,
                            out >= 0 && out < NE ? h[out] : -2, in >= 0 && in < NE ? h[in] : -2);
    hm_status st = lazy_init(e, err);
    if (st != HM_OK) return st;
    if (e->n_hot_pending >= CUDA_HOT_PENDING)
        return hm_error_set(err, HM_ERR_STATE, "hot cache exchange: %d exchanges in flight",
                            e->n_hot_pending);
    cudaSetDevice(e->p.device);
    cudaStream_t s = (cudaStream_t)e->stream, hs = (cudaStream_t)e->hot_stream;
    const int slot = h[out];
    cuda_hot_pending *p = &e->hot_pending[e->n_hot_pending];
    cudaEvent_t freed = NULL;
    cudaError_t ce = cudaEventCreateWithFlags(&freed, cudaEventDisableTiming);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&p->copied, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        if (freed) cudaEventDestroy(freed);
        return hot_fail(err, ce, "events");
    }
    cu_launch(hot_set_kernel, 1, 1, 0, s, (int32_t *)e->d_slot_of + (size_t)il * NE + out,
              (int32_t)-1);
    ce = cudaGetLastError();
    if (ce == cudaSuccess) ce = cudaEventRecord(freed, s);
    if (ce == cudaSuccess) ce = cudaStreamWaitEvent(hs, freed, 0);
    st = ce == cudaSuccess ? copy_expert(e, il, in, slot, err) : hot_fail(err, ce, "ordering");
    if (st == HM_OK && (ce = cudaEventRecord(p->copied, hs)) != cudaSuccess)
        st = hot_fail(err, ce, "record");
    cudaEventDestroy(freed); /* released once recorded work completes */
    if (st != HM_OK) {
        cudaEventDestroy(p->copied);
        return st;
    }
    h[out] = -1;
    p->layer = il;
    p->in = in;
    p->slot = slot;
    e->n_hot_pending++;
    return HM_OK;
}

extern "C" int cuda_engine_hot_poll(cuda_engine *e, hm_error *err) {
    const int NE = (int)e->hp.n_expert;
    cudaStream_t s = (cudaStream_t)e->stream;
    int k = 0;
    for (int i = 0; i < e->n_hot_pending; i++) {
        cuda_hot_pending *p = &e->hot_pending[i];
        cudaError_t ce = cudaEventQuery(p->copied);
        if (ce == cudaErrorNotReady) {
            e->hot_pending[k++] = *p;
            continue;
        }
        if (ce != cudaSuccess) {
            hot_fail(err, ce, "copy");
            return -1;
        }
        cu_launch(hot_set_kernel, 1, 1, 0, s,
                  (int32_t *)e->d_slot_of + (size_t)p->layer * NE + p->in, (int32_t)p->slot);
        ce = cudaGetLastError();
        if (ce != cudaSuccess) {
            hot_fail(err, ce, "table");
            return -1;
        }
        e->h_slot_of[(size_t)p->layer * NE + p->in] = p->slot;
        cudaEventDestroy(p->copied);
    }
    e->n_hot_pending = k;
    return k;
}

extern "C" int cuda_engine_slot(const cuda_engine *e, int il, int x) {
    if (!e || il < 0 || il >= e->hp.n_layer || x < 0 || x >= e->hp.n_expert) return -1;
    return e->h_slot_of[(size_t)il * (size_t)e->hp.n_expert + (size_t)x];
}

void cuda_hot_free(cuda_engine *e) {
    if (e->hot_stream) cudaStreamSynchronize((cudaStream_t)e->hot_stream);
    for (int i = 0; i < e->n_hot_pending; i++) cudaEventDestroy(e->hot_pending[i].copied);
    if (e->hot_stream) cudaStreamDestroy((cudaStream_t)e->hot_stream);
    free(e->hot_pending);
    free(e->hot_q);
    e->hot_q = NULL;
    e->hot_pending = NULL;
    e->hot_stream = NULL;
    e->n_hot_pending = 0;
}

hm_status cuda_hot_init(cuda_engine *e, hm_error *err) {
    bool mixed = false;
    for (int il = 0; il < e->hp.n_layer; il++) mixed = mixed || e->layers[il].mixed;
    if (!mixed || e->hot_q) return HM_OK;
    e->hot_q = (cuda_hot_queue *)calloc(1, sizeof(cuda_hot_queue));
    return e->hot_q ? HM_OK : hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache)");
}

extern "C" hm_status cuda_engine_hot_request(cuda_engine *e, int il, int out, int in,
                                             hm_error *err) {
    cuda_hot_queue *q = e ? e->hot_q : NULL;
    if (!q) return hm_error_set(err, HM_ERR_UNSUPPORTED, "hot cache exchange: no mixed layer");
    const unsigned h = __atomic_load_n(&q->head, __ATOMIC_RELAXED);
    if (h - __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE) >= CUDA_HOT_PENDING)
        return hm_error_set(err, HM_ERR_STATE, "hot cache exchange: %d requests wait already",
                            CUDA_HOT_PENDING);
    int32_t *r = q->req[h % CUDA_HOT_PENDING];
    r[0] = il, r[1] = out, r[2] = in;
    __atomic_store_n(&q->head, h + 1, __ATOMIC_RELEASE);
    return HM_OK;
}

void cuda_hot_service(cuda_engine *e) {
    cuda_hot_queue *q = e->hot_q;
    if (!q) return;
    const unsigned h = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
    unsigned t = q->tail;
    for (; t != h; t++) {
        const int32_t *r = q->req[t % CUDA_HOT_PENDING];
        hm_error err;
        if (cuda_engine_hot_exchange(e, r[0], r[1], r[2], &err) == HM_OK) {
            q->applied++;
        } else {
            q->refused++;
            HM_LOGD("%s", err.msg);
        }
    }
    __atomic_store_n(&q->tail, t, __ATOMIC_RELEASE);
    if (e->n_hot_pending > 0) {
        hm_error err;
        if (cuda_engine_hot_poll(e, &err) < 0) HM_LOGW("%s", err.msg);
    }
}

extern "C" void cuda_engine_hot_counts(const cuda_engine *e, uint64_t *applied,
                                       uint64_t *refused) {
    *applied = e && e->hot_q ? e->hot_q->applied : 0;
    *refused = e && e->hot_q ? e->hot_q->refused : 0;
}
