/* cuda_decode.cu - the GPU-autonomous decode loop (see cuda_decode.h for the design).
 *
 * Ring slot protocol: the commit kernel (one thread) writes the token, then
 * __threadfence_system(), then the sequence number step + 1, through volatile stores into
 * mapped pinned host memory. The host spins on the sequence number with a volatile load, then
 * an acquire fence, then reads the token. A slot is rewritten only by the step `depth` later,
 * which the host launches after it has read the slot (cuda_decode_wait before
 * cuda_decode_launch, enforced by generate.c's launch window).
 *
 * Tiered engines (host layers, cuda_handoff.h): the step graph holds the hand-off kernels, which
 * wait for the CPU side on the device, so the loop itself does not change. A launch is refused
 * while the hand-off is aborted; a token is delivered only if no hand-off fault is recorded
 * (a fault in step k's forward pass is written before step k + 1 commits its token, the first
 * token sampled from the garbage, so the host sees it when it reads that token).
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_launch.cuh"

extern "C" {
#include "cuda/cuda_decode.h"
#include "cuda/cuda_engine_internal.h"
#include "cuda/cuda_sample.h"
}

typedef struct {
    int32_t token;
    uint32_t seq; /* global step number + 1 of the token in this slot (0: never written) */
} ring_slot;

struct cuda_decode {
    cuda_engine *e;
    cuda_sampler *smp;
    int depth;
    ring_slot *ring_h;  /* [depth] pinned, mapped host memory */
    ring_slot *ring_d;  /* the same memory's device address */
    int32_t *d_scal;    /* device: [0] the step's token, [1] redo token, [2] step number */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    uint32_t count_epoch; /* the engine's count_epoch when the graph was captured */
    uint64_t launched;
    uint64_t nodes, kernels;
    uint64_t queries;
};

static hm_status cuda_fail(hm_error *err, cudaError_t e, const char *what) {
    return hm_error_set(err, HM_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

static hm_status launch_check(hm_error *err, const char *kernel) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? HM_OK : cuda_fail(err, e, kernel);
}

/* ---- kernels ---- */

__global__ void decode_commit_kernel(int32_t *d_token, uint32_t *d_step, ring_slot *ring,
                                     int depth) {
    cu_pdl_enter();
    uint32_t s = *d_step;
    volatile ring_slot *r = ring + (s % (uint32_t)depth);
    int32_t t = *d_token;
    r->token = t; /* -1: the sampler saw a NaN logit; the host reports it */
    if (t < 0) *d_token = 0; /* the forward pass must not read row -1 of the embeddings */
    __threadfence_system();
    r->seq = s + 1u;
    *d_step = s + 1u;
}

__global__ void decode_set_kernel(int32_t *p, int32_t v) {
    cu_pdl_enter(); *p = v; }

static hm_status set_scalar(cudaStream_t s, int32_t *p, int32_t v, hm_error *err) {
    cu_launch(decode_set_kernel, 1, 1, 0, s, p, v);
    return launch_check(err, "decode_set_kernel");
}

/* ---- init / free ---- */

extern "C" void cuda_decode_free(cuda_decode *d) {
    if (!d) return;
    if (d->exec) cudaGraphExecDestroy(d->exec);
    if (d->graph) cudaGraphDestroy(d->graph);
    if (d->ring_h) cudaFreeHost(d->ring_h);
    if (d->d_scal) cudaFree(d->d_scal);
    cuda_sampler_free(d->smp);
    free(d);
}

/* Captures sample -> commit -> engine step on the engine's stream. Relaxed mode: launchers may
 * call cudaFuncSetAttribute (shared memory size) while capturing; the attribute stays set for
 * the replays, and nothing else runs on this thread meanwhile. */
static hm_status capture_step(cuda_decode *d, hm_error *err) {
    cuda_engine *e = d->e;
    cudaStream_t s = (cudaStream_t)e->stream;
    d->count_epoch = e->count_epoch; /* the routing counts on or off, as now */
    d->nodes = d->kernels = 0;
    cudaError_t ce = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    if (ce != cudaSuccess) return cuda_fail(err, ce, "cudaStreamBeginCapture");
    hm_status st = cuda_sampler_sample(d->smp, e->d_logits, &d->d_scal[0], s, err);
    if (st == HM_OK) {
        cu_launch(decode_commit_kernel, 1, 1, 0, s, &d->d_scal[0], (uint32_t *)&d->d_scal[2],
                  d->ring_d, d->depth);
        st = launch_check(err, "decode_commit_kernel");
    }
    if (st == HM_OK) st = cuda_engine_enqueue_step(e, &d->d_scal[0], 1, err);
    cudaGraph_t g = NULL;
    ce = cudaStreamEndCapture(s, &g); /* always ends the capture, also after an error */
    if (st != HM_OK) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        return st;
    }
    if (ce != cudaSuccess) return cuda_fail(err, ce, "cudaStreamEndCapture (decode step)");
    d->graph = g;
    ce = cudaGraphInstantiate(&d->exec, g, 0);
    if (ce != cudaSuccess) return cuda_fail(err, ce, "cudaGraphInstantiate (decode step)");
    size_t n = 0;
    ce = cudaGraphGetNodes(g, NULL, &n);
    if (ce != cudaSuccess) return cuda_fail(err, ce, "cudaGraphGetNodes");
    d->nodes = n;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(sizeof(cudaGraphNode_t) * (n ? n : 1));
    if (!nodes) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (graph nodes)");
    ce = cudaGraphGetNodes(g, nodes, &n);
    for (size_t i = 0; ce == cudaSuccess && i < n; i++) {
        cudaGraphNodeType t;
        if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeKernel)
            d->kernels++;
    }
    free(nodes);
    if (ce != cudaSuccess) return cuda_fail(err, ce, "cudaGraphGetNodes");
    ce = cudaGraphUpload(d->exec, s);
    return ce == cudaSuccess ? HM_OK : cuda_fail(err, ce, "cudaGraphUpload");
}

extern "C" hm_status cuda_decode_init(cuda_engine *e, const sample_params *sp, int depth,
                                      cuda_decode **out, hm_error *err) {
    *out = NULL;
    if (!e) return hm_error_set(err, HM_ERR_ARG, "cuda_decode_init: no engine");
    if (e->p.layer_begin > 0) /* its first layers run on the CPU: the host API only */
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "cuda_decode_init: the engine starts at "
                            "layer %d (a partial -ngl): the autonomous loop needs the whole "
                            "model on the GPU", e->p.layer_begin);
    if (depth < 1 || depth > CUDA_DECODE_MAX_DEPTH)
        return hm_error_set(err, HM_ERR_ARG, "cuda_decode_init: depth %d (1..%d)", depth,
                            CUDA_DECODE_MAX_DEPTH);
    cudaError_t dev = cudaSetDevice(e->p.device);
    if (dev != cudaSuccess) return cuda_fail(err, dev, "cuda_decode_init: cudaSetDevice");
    cuda_decode *d = (cuda_decode *)calloc(1, sizeof(*d));
    if (!d) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (decode loop)");
    d->e = e;
    d->depth = depth;
    cudaStream_t s = (cudaStream_t)e->stream;
    hm_status st = cuda_sampler_init(sp, (int32_t)e->hp.n_vocab, e->stream, &d->smp, err);
    cudaError_t ce = cudaSuccess;
    if (st == HM_OK) {
        ce = cudaHostAlloc((void **)&d->ring_h, sizeof(ring_slot) * (size_t)depth,
                           cudaHostAllocMapped);
        if (ce != cudaSuccess) {
            d->ring_h = NULL;
            st = cuda_fail(err, ce, "cudaHostAlloc (token ring)");
        }
    }
    if (st == HM_OK) {
        memset(d->ring_h, 0, sizeof(ring_slot) * (size_t)depth);
        ce = cudaHostGetDevicePointer((void **)&d->ring_d, d->ring_h, 0);
        if (ce != cudaSuccess) st = cuda_fail(err, ce, "cudaHostGetDevicePointer (token ring)");
    }
    if (st == HM_OK) {
        ce = cudaMalloc((void **)&d->d_scal, 4 * sizeof(int32_t));
        if (ce != cudaSuccess) {
            d->d_scal = NULL;
            st = cuda_fail(err, ce, "cudaMalloc (decode scalars)");
        }
    }
    if (st == HM_OK) {
        ce = cudaMemsetAsync(d->d_scal, 0, 4 * sizeof(int32_t), s);
        if (ce != cudaSuccess) st = cuda_fail(err, ce, "cudaMemsetAsync (decode scalars)");
    }
    if (st == HM_OK) st = capture_step(d, err);
    if (st != HM_OK) {
        cuda_decode_free(d);
        return st;
    }
    *out = d;
    return HM_OK;
}

/* ---- sampler state ---- */

extern "C" hm_status cuda_decode_sampler_set(cuda_decode *d, const int32_t *hist, int n_hist,
                                             uint64_t n_draws, hm_error *err) {
    hm_status st = cuda_sampler_reset(d->smp, d->e->stream, err);
    if (st == HM_OK && n_hist > 0)
        st = cuda_sampler_accept_host(d->smp, hist, n_hist, d->e->stream, err);
    if (st == HM_OK && n_draws > 0)
        st = cuda_sampler_set_draws(d->smp, n_draws, d->e->stream, err);
    return st;
}

extern "C" hm_status cuda_decode_accept(cuda_decode *d, const int32_t *tokens, int n,
                                        hm_error *err) {
    return n > 0 ? cuda_sampler_accept_host(d->smp, tokens, n, d->e->stream, err) : HM_OK;
}

/* ---- the loop ---- */

extern "C" hm_status cuda_decode_begin(cuda_decode *d, int pos, hm_error *err) {
    return set_scalar((cudaStream_t)d->e->stream, d->e->d_pos, pos, err);
}

/* The engine's routing counts were switched since the capture: a new step graph. The old one
 * may still run (steps in flight): cudaGraphExecDestroy frees it once it has completed. */
static hm_status recapture(cuda_decode *d, hm_error *err) {
    cudaGraphExec_t old_exec = d->exec;
    cudaGraph_t old_graph = d->graph;
    d->exec = NULL;
    d->graph = NULL;
    hm_status st = capture_step(d, err);
    if (old_exec) cudaGraphExecDestroy(old_exec);
    if (old_graph) cudaGraphDestroy(old_graph);
    return st;
}

extern "C" hm_status cuda_decode_launch(cuda_decode *d, hm_error *err) {
    hm_status st0 = cuda_handoff_ready(d->e, err); /* a tiered engine's CPU side serving */
    if (st0 != HM_OK) return st0;
    cuda_hot_service(d->e); /* the hot cache's exchanges asked for: between steps */
    if (d->count_epoch != d->e->count_epoch || !d->exec) {
        hm_status st = recapture(d, err);
        if (st != HM_OK) return st;
    }
    cudaError_t ce = cudaGraphLaunch(d->exec, (cudaStream_t)d->e->stream);
    if (ce != cudaSuccess) return cuda_fail(err, ce, "cudaGraphLaunch (decode step)");
    d->launched++;
    return HM_OK;
}

extern "C" uint64_t cuda_decode_launched(const cuda_decode *d) { return d->launched; }

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define DECODE_STALL_S 60.0 /* no token for this long while the stream is busy: give up */

extern "C" hm_status cuda_decode_wait(cuda_decode *d, uint64_t step, int32_t *token,
                                      hm_error *err) {
    if (step >= d->launched || d->launched - step > (uint64_t)d->depth)
        return hm_error_set(err, HM_ERR_STATE, "cuda_decode_wait: step %llu is not in the ring "
                            "(%llu launched, depth %d)", (unsigned long long)step,
                            (unsigned long long)d->launched, d->depth);
    volatile ring_slot *r = d->ring_h + step % (uint64_t)d->depth;
    const uint32_t want = (uint32_t)(step + 1);
    double t_check = 0, t_start = 0;
    for (unsigned spins = 0; r->seq != want; spins++) {
        if ((spins & 1023u) != 1023u) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        /* slow path, about every 1024 spins: is the stream still working on it? */
        double t = mono_s();
        if (t_start == 0) t_start = t_check = t;
        if (t - t_check < 1e-3) continue;
        t_check = t;
        cudaError_t q = cudaStreamQuery((cudaStream_t)d->e->stream);
        d->queries++;
        if (q == cudaErrorNotReady) {
            if (t - t_start > DECODE_STALL_S)
                return hm_error_set(err, HM_ERR_CUDA, "decode step %llu delivered no token in "
                                    "%.0f s", (unsigned long long)step, DECODE_STALL_S);
            continue;
        }
        if (q != cudaSuccess) return cuda_fail(err, q, "decode step");
        if (r->seq == want) break; /* idle: the token must be there now */
        return hm_error_set(err, HM_ERR_CUDA, "decode step %llu finished without delivering "
                            "its token", (unsigned long long)step);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    *token = r->token;
    return cuda_engine_handoff_check(d->e, err); /* sampled from a failed tiered step? */
}

extern "C" hm_status cuda_decode_finish(cuda_decode *d, hm_error *err) {
    hm_status st = cuda_engine_sync(d->e, err);
    return st == HM_OK ? cuda_engine_handoff_check(d->e, err) : st;
}

extern "C" hm_status cuda_decode_redo(cuda_decode *d, int32_t token, int pos, hm_error *err) {
    cudaStream_t s = (cudaStream_t)d->e->stream;
    hm_status st = set_scalar(s, &d->d_scal[1], token, err);
    if (st == HM_OK) st = set_scalar(s, d->e->d_pos, pos, err);
    if (st == HM_OK) st = cuda_engine_enqueue_step(d->e, &d->d_scal[1], 1, err);
    return st;
}

extern "C" hm_status cuda_decode_set_logits(cuda_decode *d, const float *logits,
                                           hm_error *err) {
    cudaStream_t s = (cudaStream_t)d->e->stream;
    cudaError_t ce = cudaMemcpyAsync(d->e->d_logits, logits, sizeof(float) * (size_t)d->e->hp.n_vocab,
                                     cudaMemcpyHostToDevice, s);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(s);
    if (ce == cudaSuccess) d->e->n_host_syncs++;
    return ce == cudaSuccess ? HM_OK : cuda_fail(err, ce, "decode: setting the logits");
}

extern "C" void cuda_decode_get_stats(const cuda_decode *d, cuda_decode_stats *s) {
    s->graph_nodes = d->nodes;
    s->kernel_nodes = d->kernels;
    s->launches = d->launched;
    s->queries = d->queries;
}

extern "C" uint64_t cuda_decode_host_syncs(const cuda_decode *d) { return d->e->n_host_syncs; }
