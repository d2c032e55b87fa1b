/* tiered_internal.h - the CPU side's object (tiered.h), shared by its two files: tiered.c (the
 * worker, the hand-off's requests, init, reset, counters) and tiered_fetch.c (the fetched-expert
 * path of prompt ubatches). runtime/ sources only. */
#ifndef HM_RUNTIME_TIERED_INTERNAL_H
#define HM_RUNTIME_TIERED_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cuda/cuda_fetch.h"
#include "cuda/cuda_host.h"
#include "moe/moe_exec.h"
#include "moe/offload.h"
#include "runtime/tiered.h"

struct hm_tiered {
    const hm_model *m;
    struct cuda_engine *gpu; /* NULL: a view its caller owns (tests) */
    cuda_handoff_view v;
    int32_t *host_layers;    /* [v.n_host] copy of the view's list */
    hm_tiered_params p;
    tp_pool *pool;
    bool own_pool;
    moe_exec *exec;
    pthread_t th;
    bool started;
    bool attached;           /* this object is the engine's CPU side */
    atomic_int stop, pause_req, paused;
    /* the worker's own */
    int cursor;              /* index into host_layers of the last request served */
    uint64_t served;         /* requests taken (the test hooks count them) */
    bool stalled;            /* stall_after reached: serves nothing until reset */
    /* counters */
    atomic_ullong requests, tokens, faults, aborts, resets, busy_ns;
    /* the first fault since the last reset */
    pthread_mutex_t mu;
    bool has_fault;
    hm_error fault;
    /* the fetched-expert path (hm_tiered_set_offload; arrays allocated at init) */
    hm_tiered_offload off;       /* off.rates points at rates */
    offload_rates *rates;        /* [n_layer] */
    cuda_fetch_layout *lay;      /* [n_layer] staging layouts (the engine's) */
    offload_plan plan;           /* [n_expert] decisions of the request being served */
    offload_expert *ex;          /* [n_expert] tokens and staging bytes */
    int32_t *counts;             /* [n_expert] */
    int32_t *fslot_of;           /* [n_expert] staging slot of a fetched expert, else -1 */
    int32_t *ahead_ids;          /* [n_expert] the experts of one copy (scratch) */
    int32_t *ids_cpu;            /* [n_tok_max][n_used] ids with fetched slots masked (-1) */
    cuda_host_rows *runs;        /* [n_expert * CUDA_FETCH_MAX_PARTS] the copies: one strided
                                    run per part of each run of consecutive expert ids */
    char *dbg;                   /* HOTMOE_SCHED_DEBUG text */
    size_t dbg_cap;
    /* experts of the next host layer copied ahead while this one computes (tiered_fetch.c):
     * that layer, and ahead_n of its experts in slots 0 .. ahead_n - 1 of its buffer */
    int ahead_layer;             /* -1: none */
    int ahead_n;
    int32_t *ahead_slot;         /* [n_expert] slot of an expert copied ahead, else -1 */
    atomic_ullong fetch_requests, gpu_experts, cpu_experts, fetched_bytes, copy_wait_ns,
        copy_enqueue_ns;
    atomic_ullong copies, copy_fallbacks, retries, ahead_experts, ahead_used;
    /* the hot cache's controller (tiered_hot.c), or NULL */
    struct tiered_hot *hot;
    uint8_t *hot_fixed; /* [n_layer][n_expert] a cache without controller (1: in a slot), or NULL */
    /* the live layer perf counters (tiered_perf.c), or NULL (off) */
    struct tiered_perf *perf;
    atomic_ullong hot_updates, hot_exchanged, hot_refused;
    atomic_ullong hot_hits, hot_misses, hot_admitted; /* the controller's counts, published by
                                                         the worker after each request */
    /* post-fetch at decode requests (tiered_postfetch.c), or NULL (off) */
    struct tiered_pf *pf;
    atomic_ullong pf_requests, pf_experts, pf_bytes, pf_fallbacks, pf_wait_ns, pf_copy_ns;
};

typedef struct tiered_hot tiered_hot;
typedef struct tiered_pf tiered_pf;

/* Post-fetch (tiered_postfetch.c): whether it serves this decode request, then the request
 * served (the caller answers); freed with the object. */
bool tiered_pf_wants(const hm_tiered *t, int L, int64_t n_tok);
hm_status tiered_serve_postfetch(hm_tiered *t, int j, const cuda_handoff_msg *m, hm_error *e);
void tiered_pf_free(hm_tiered *t);
typedef struct tiered_perf tiered_perf;

/* The layer perf counters: a request counted before the answer (and the GPU's times of the
 * layer's previous request taken), its CPU time after computing. */
void tiered_perf_observe(hm_tiered *t, int L, const cuda_handoff_msg *m);
void tiered_perf_time(hm_tiered *t, int L, int64_t ns);
/* What a request's copies did: the fetched path's experts (prompts) or post-fetch's down
 * products (decode steps). */
typedef struct {
    bool postfetch;
    uint64_t experts;   /* run on the GPU from a copy */
    uint64_t bytes;     /* copied for the layer (copies ahead of it included) */
    int64_t wait_ns;    /* the worker's wait for the copies */
    uint64_t fallbacks; /* experts meant for the GPU that the CPU computed (failed, late copy) */
} tiered_perf_copy;
void tiered_perf_copies(hm_tiered *t, int L, const tiered_perf_copy *c);
void tiered_perf_free(hm_tiered *t);

/* The worker parked between requests (returns once it is, at once when it never started): its
 * fields are the caller's until tiered_resume. */
void tiered_pause(hm_tiered *t);
void tiered_resume(hm_tiered *t);
/* The hot cache's controller: a request's selections counted before the answer, the exchanges
 * handed over after it; its counters; freed with the object (the worker stopped). */
void tiered_hot_observe(hm_tiered *t, int L, const cuda_handoff_msg *m);
void tiered_hot_after(hm_tiered *t, int L);
/* The controller's counts as the worker last published them (any thread). */
void tiered_hot_counts(const hm_tiered *t, uint64_t *hits, uint64_t *misses, uint64_t *admitted);
/* The hot cache's map [n_layer][n_expert] (1: in a slot; the controller's as of its last
 * decision, else the fixed one), or NULL without a hot cache. */
const uint8_t *tiered_hot_map(const hm_tiered *t);
void tiered_hot_free(hm_tiered *t);

int64_t tiered_now_ns(void);

/* The fetched path's arrays (rates the defaults, no lane, no layouts: every expert on the CPU
 * until hm_tiered_set_offload) and their release. */
hm_status tiered_fetch_alloc(hm_tiered *t, hm_error *err);
void tiered_fetch_release(hm_tiered *t);

/* A request of host layer index j posted with msg.fetch: decide, copy the GPU's experts, compute
 * the CPU's, wait for the copies, write fslot. The caller answers. */
hm_status tiered_serve_fetch(hm_tiered *t, int j, const cuda_handoff_msg *m, hm_error *e);

#endif
