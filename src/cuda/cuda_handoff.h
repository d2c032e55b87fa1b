/* cuda_handoff.h - the hand-off of the tiered decode step: the memory through which the GPU
 * engine gives the CPU the routed rows of a host layer (a MoE layer whose experts stay in host
 * RAM) and takes back the per-slot expert outputs, with no host synchronisation. Plain C
 * (includable from C and CUDA); implemented in cuda_handoff.cu, stubbed in cuda_none.c.
 *
 * DESIGN: one allocation of mapped, portable pinned host memory (cudaHostAlloc), made at engine
 * init when the residency map leaves every expert of some MoE layer without a device slot. It
 * holds a control block, one pair of flags per layer (each on its own 64-byte line), one message
 * header and one data area (rows for n_ubatch tokens) shared by the host layers: the GPU waits
 * for the CPU's answer at every host layer before it moves on, so at most one layer is in flight.
 *
 * A step of the engine (cuda_engine_enqueue_forward) first adds 1 to a sequence number kept in
 * device memory (so a captured graph replays with a new number every time); at a host layer,
 * after the router:
 *   GPU  post:  msg = {seq, layer, n_tok, n_used}; ids, gw [n_tok][n_used]; x [n_tok][n_embd]
 *               (the FFN-normed rows, f32); __threadfence_system(); flags[layer].ready = seq
 *   CPU         sees ready != done (acquire), checks msg, computes y [n_tok][n_used][n_embd]
 *               (slot outputs, unweighted, expert biases included), then flags[layer].done = seq
 *               (release)
 *   GPU  wait:  one thread spins (volatile loads) until done == seq, or ctl.abort != 0, or
 *               ctl.timeout_ns has passed (then it sets ctl.abort = 2 itself); either of the
 *               last two records a fault in ctl (the first one wins) and ends the wait
 *   GPU  take:  y is copied into the engine's per-slot outputs, which the merge sums in slot
 *               order as for experts computed on the device (the same bytes).
 * After a fault every wait of the engine ends at once (abort stays set), the steps' results
 * are garbage, and the host API reports the fault; cuda_engine_handoff_reset (the stream idle)
 * clears it. The CPU side (runtime/tiered.h) serves the requests; the engine refuses to run
 * steps while no CPU side is attached.
 */
#ifndef HM_CUDA_CUDA_HANDOFF_H
#define HM_CUDA_CUDA_HANDOFF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    CUDA_HANDOFF_PF_TOK = 8,        /* post-fetch serves decode requests of at most this many
                                       tokens (h holds their activations) */
    CUDA_HANDOFF_FAULT_ABORT = 1,   /* a wait ended because ctl.abort was set (by the host) */
    CUDA_HANDOFF_FAULT_TIMEOUT = 2, /* a wait ended because the CPU did not answer in time */
    CUDA_HANDOFF_ABORT_HOST = 1,    /* ctl.abort values: set by the host (CPU side, caller) */
    CUDA_HANDOFF_ABORT_GPU = 2      /* set by the GPU after a timeout */
};

/* Written by both sides; fields on separate 64-byte lines by direction. */
typedef struct {
    uint32_t abort;       /* host (or GPU on timeout) -> GPU: != 0: every wait ends at once */
    uint32_t pad0[15];
    uint32_t fault;       /* GPU -> host: 0, or CUDA_HANDOFF_FAULT_* of the first failed wait */
    uint32_t fault_layer; /* ... its layer */
    uint32_t fault_seq;   /* ... its step's sequence number */
    uint32_t pad1[13];
    uint64_t timeout_ns;  /* host -> GPU: a wait gives up after this long (0: never) */
    uint32_t stamps;      /* host -> GPU: != 0: each wait writes its times into the flags */
    uint32_t pad2a;
    uint64_t pad2[6];
} cuda_handoff_ctl;

/* One layer's flags: ready written by the GPU, done by the CPU; both hold sequence numbers.
 * The GPU's line also carries its clock (%globaltimer, ns) around each request, for the layer
 * perf's lane times (runtime/tiered_perf.c): the post kernel stores t_post[seq & 1] before
 * ready; while ctl.stamps is set (the perf counters on), the wait kernel, once its wait ends,
 * t_wait (its start: the hot lane's kernels, which run between the two in stream order, are
 * done) and t_seen (the answer seen), then stamp_seq = seq. The CPU reads step s's times at the
 * layer's next request (the post of step s + 1 wrote the other t_post) or between steps. */
typedef struct {
    uint32_t ready;
    uint32_t stamp_seq;     /* the step whose t_wait, t_seen these are (0: none yet) */
    uint64_t t_post[2];     /* [seq & 1] the request posted */
    uint64_t t_wait, t_seen; /* the wait began, the answer seen */
    uint32_t pad0[6];
    uint32_t done;
    uint32_t pad1[15];
} cuda_handoff_flags;
#ifdef __cplusplus
static_assert(sizeof(cuda_handoff_flags) == 128, "two 64-byte lines, one per writer");
#else
_Static_assert(sizeof(cuda_handoff_flags) == 128, "two 64-byte lines, one per writer");
#endif

/* The request in the data area, written by the GPU before ready. */
typedef struct {
    uint32_t seq, layer, n_tok, n_used;
    uint32_t fetch; /* 1: the GPU runs the fetched-expert path for this request (prompt
                     * ubatches, cuda_fetch.h): the CPU writes fslot and may leave slots to it */
    uint32_t pad[11];
} cuda_handoff_msg;

/* The memory as one side addresses it (the engine keeps a host and a device view). */
typedef struct {
    int n_layer, n_host;      /* the model's layers; host layers among them */
    int n_embd, n_used;       /* row length; slots per token */
    int n_tok_max;            /* tokens of the largest request (the engine's n_ubatch) */
    int64_t n_expert;         /* experts per layer (ids are below it) */
    const int32_t *host_layers; /* [n_host] ascending layer indices (host memory) */
    cuda_handoff_ctl *ctl;
    cuda_handoff_flags *flags; /* [n_layer] (used for host layers only) */
    cuda_handoff_msg *msg;
    int32_t *ids; /* [n_tok_max][n_used] selected experts, slot order; in a mixed layer a slot
                   * the GPU computes itself (hot) is posted as -2 - id: the CPU side counts it
                   * and computes only the ids >= 0 */
    float *gw;    /* [n_tok_max][n_used] gating weights */
    float *x;     /* [n_tok_max][n_embd] FFN-normed input rows */
    float *y;     /* [n_tok_max][n_used][n_embd] per-slot outputs (CPU -> GPU) */
    int32_t *fslot; /* [n_tok_max][n_used] (requests with fetch) the staging slot of the
                     * fetched expert the GPU computes this slot with, or -1: y holds the CPU's
                     * output (CPU -> GPU, written before done); a decode request of an engine
                     * with post-fetch on: the scratch slot of the expert whose down product
                     * the GPU runs from h, or -1 (the CPU side writes every slot) */
    int n_ff;       /* the experts' hidden size */
    float *h;       /* [CUDA_HANDOFF_PF_TOK][n_used][n_ff] post-fetch: the activations (gate,
                     * up, biases, act) of the slots whose fslot >= 0 (CPU -> GPU) */
} cuda_handoff_view;

/* A posted id's expert: id itself, or for a hot slot (-2 - id) the id; -1 (no expert) stays. */
static inline int32_t cuda_handoff_expert(int32_t posted) {
    return posted <= -2 ? -2 - posted : posted;
}

static inline size_t cuda_handoff_align_(size_t n) { return (n + 63) & ~(size_t)63; }

/* Bytes of a hand-off area for these sizes (all >= 1). */
static inline size_t cuda_handoff_bytes(int n_layer, int n_embd, int n_used, int n_tok_max,
                                        int n_ff) {
    const size_t nt = (size_t)n_tok_max, k = (size_t)n_used, e = (size_t)n_embd;
    return cuda_handoff_align_(sizeof(float) * CUDA_HANDOFF_PF_TOK * k * (size_t)n_ff) +
           cuda_handoff_align_(sizeof(cuda_handoff_ctl)) +
           cuda_handoff_align_(sizeof(cuda_handoff_flags) * (size_t)n_layer) +
           cuda_handoff_align_(sizeof(cuda_handoff_msg)) +
           cuda_handoff_align_(sizeof(int32_t) * nt * k) +
           cuda_handoff_align_(sizeof(float) * nt * k) + cuda_handoff_align_(sizeof(float) * nt * e) +
           cuda_handoff_align_(sizeof(float) * nt * k * e) +
           cuda_handoff_align_(sizeof(int32_t) * nt * k);
}

/* The view of such an area at base (64-byte aligned: the engine's mapped allocation, or ordinary
 * memory in a test); host_layers is kept as given (not copied). The caller zeroes the memory. */
static inline void cuda_handoff_layout(void *base, int n_layer, int n_embd, int n_used,
                                       int n_tok_max, int n_ff, int64_t n_expert,
                                       const int32_t *host_layers, int n_host,
                                       cuda_handoff_view *v) {
    const size_t nt = (size_t)n_tok_max, k = (size_t)n_used, e = (size_t)n_embd;
    char *p = (char *)base;
    v->n_layer = n_layer;
    v->n_host = n_host;
    v->n_embd = n_embd;
    v->n_used = n_used;
    v->n_tok_max = n_tok_max;
    v->n_expert = n_expert;
    v->host_layers = host_layers;
    v->ctl = (cuda_handoff_ctl *)p;
    p += cuda_handoff_align_(sizeof(cuda_handoff_ctl));
    v->flags = (cuda_handoff_flags *)p;
    p += cuda_handoff_align_(sizeof(cuda_handoff_flags) * (size_t)n_layer);
    v->msg = (cuda_handoff_msg *)p;
    p += cuda_handoff_align_(sizeof(cuda_handoff_msg));
    v->ids = (int32_t *)p;
    p += cuda_handoff_align_(sizeof(int32_t) * nt * k);
    v->gw = (float *)p;
    p += cuda_handoff_align_(sizeof(float) * nt * k);
    v->x = (float *)p;
    p += cuda_handoff_align_(sizeof(float) * nt * e);
    v->y = (float *)p;
    p += cuda_handoff_align_(sizeof(float) * nt * k * e);
    v->fslot = (int32_t *)p;
    p += cuda_handoff_align_(sizeof(int32_t) * nt * k);
    v->n_ff = n_ff;
    v->h = (float *)p;
}

struct cuda_engine;
/* Host layers of the engine (0: none, the hand-off is not used). */
int cuda_engine_host_layers(const struct cuda_engine *e);
/* The host view of the engine's hand-off memory. HM_ERR_STATE when it has no host layer. */
hm_status cuda_engine_handoff_view(struct cuda_engine *e, cuda_handoff_view *v, hm_error *err);
/* A CPU side serves the requests (on) or no longer does (off). Steps are refused (HM_ERR_STATE)
 * while none is attached; attaching a second one is HM_ERR_STATE. */
hm_status cuda_engine_handoff_attach(struct cuda_engine *e, bool on, hm_error *err);
/* Sets ctl.abort (so no wait in flight can last), waits for the engine's stream (one counted
 * host synchronisation), then clears abort and the fault and marks every request answered
 * (done = ready). The CPU side must not be serving meanwhile (runtime/tiered.h pauses it). */
hm_status cuda_engine_handoff_reset(struct cuda_engine *e, hm_error *err);
/* HM_OK, or the error that the hand-off's fault describes (layer, step, abort or timeout);
 * HM_OK for an engine without host layers. A host read of the mapped control block: call it
 * after the steps concerned have completed (a synchronisation, or a token read behind them). */
hm_status cuda_engine_handoff_check(const struct cuda_engine *e, hm_error *err);

#ifdef __cplusplus
}
#endif

#endif
