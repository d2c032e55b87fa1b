/* tiered.h - the CPU side of the tiered decode step: the experts of the GPU engine's host layers
 * (MoE layers whose experts all stay in host RAM, in the mapped file) computed by CPU threads
 * while the GPU runs everything else, through the engine's hand-off (cuda/cuda_handoff.h).
 *
 * DESIGN: one worker thread serves the engine's requests, layer after layer and step after step:
 * it waits for a host layer's ready flag (spins with a pause, then yields, then naps when the
 * engine has been idle for a while), checks the request (sequence number, layer, token and
 * slot counts, expert ids), computes every selected expert's FFN for every token with the
 * expert executor's CPU lane (moe/moe_exec.h: the CPU kernels, whose bytes equal the GPU's
 * matvec kernels', so the step's result is the all-GPU engine's to the bit for decode-sized
 * steps) on a pool whose thread 0 is the worker, writes the per-slot outputs and sets the done
 * flag (release). Nothing on either side waits for the other's host thread: the GPU's graph
 * replays need no host synchronisation per token.
 *
 * A copy of fetched experts that fails (a prompt ubatch's) is no fault: the CPU computes those
 * experts in the same step, counted (copy_fallbacks) and logged.
 * Failure never deadlocks: when the CPU side fails (a malformed request, an FFN error) it counts
 * and logs the fault, keeps its message (hm_tiered_check) and sets the hand-off's abort word,
 * which ends the GPU's wait at once; the engine then reports the fault for the steps concerned
 * and refuses new ones until hm_tiered_reset. When the CPU side does not answer at all, the
 * GPU's wait ends after timeout_ms by itself. hm_tiered_free aborts a wait in flight before it
 * stops the worker.
 *
 * How the context runs a tiered placement (runtime/context.c):
 *
 *   cuda_engine_params ep = {..., .res = &placement_residency};   some layers without slots
 *   cuda_engine_init(m, &ep, &gpu, err);
 *   if (cuda_engine_host_layers(gpu) > 0) {                        cuda/cuda_handoff.h
 *       hm_tiered_params tp = hm_tiered_default_params();
 *       tp.n_threads = n_threads;                                  (-t; 0: CPUs - 1)
 *       hm_tiered_init(m, gpu, &tp, &tiered, err);                 owned by the context
 *   }
 *   ... hm_decode -> cuda_engine_decode, generation -> cuda_decode: unchanged ...
 *   on an error of a step: hm_tiered_check(tiered, &e2) has the CPU side's reason (if it was
 *   the CPU side); hm_tiered_reset(tiered, err) makes the engine usable again (the cache rows
 *   of the failed steps are garbage: decode them again)
 *   hm_context_free: hm_tiered_free(tiered) BEFORE cuda_engine_free(gpu).
 *
 * The model must stay loaded while the object lives (the worker reads its expert weights).
 */
#ifndef HM_RUNTIME_TIERED_H
#define HM_RUNTIME_TIERED_H

#include <stdbool.h>
#include <stdint.h>

#include "base/json.h"
#include "base/status.h"
#include "base/threadpool.h"
#include "cuda/cuda_handoff.h"
#include "model/model.h"
#include "moe/hot_admit.h"
#include "moe/hot_update.h"
#include "moe/hot_weight.h"
#include "moe/learn_file.h"
#include "moe/offload.h"
#include "runtime/context.h"

typedef struct hm_tiered hm_tiered;

typedef struct {
    int n_threads;       /* threads computing the experts: the worker + n_threads - 1 pool
                            threads, when pool is NULL (>= 1; 0: one less than the CPUs this
                            process may use, so that the thread driving the GPU keeps a core) */
    tp_pool *pool;       /* borrowed pool (the worker becomes its caller thread: nobody else
                            may run jobs on it while the object lives), or NULL */
    uint32_t timeout_ms; /* the GPU's wait for one answer gives up after this long (0: default,
                            20000; the environment's HOTMOE_TIERED_TIMEOUT_MS replaces it) */
    /* for tests of the failure paths (0: never) */
    uint64_t fail_after;  /* the request after this many fails as if the expert FFN had */
    uint64_t stall_after; /* the worker stops answering after this many (no abort: the GPU's
                             timeout has to end the wait) */
    uint64_t copy_fail_from; /* copies of fetched experts from this one on (1: the first) fail
                                once started, as if the lane had reported an error */
} hm_tiered_params;

hm_tiered_params hm_tiered_default_params(void);

/* Starts the CPU side of gpu's host layers: attaches to the engine, resets its hand-off (one
 * synchronisation) and starts the worker. HM_ERR_STATE when the engine has no host layer or
 * another CPU side is attached, HM_ERR_NOMEM / HM_ERR_ARG as usual. */
struct cuda_engine;
hm_status hm_tiered_init(const hm_model *m, struct cuda_engine *gpu, const hm_tiered_params *p,
                         hm_tiered **out, hm_error *err);
/* The same on a hand-off area the caller owns (no engine): ordinary memory standing in for the
 * mapped memory in tests, with the caller playing the GPU. v is copied; its memory must outlive
 * the object. */
hm_status hm_tiered_init_view(const hm_model *m, const cuda_handoff_view *v,
                              const hm_tiered_params *p, hm_tiered **out, hm_error *err);
/* Sets abort (a GPU wait in flight ends), stops and joins the worker, detaches from the engine.
 * NULL is allowed. */
void hm_tiered_free(hm_tiered *t);

/* Stops serving and releases the GPU (abort word): the steps in flight and all later ones fail
 * until hm_tiered_reset. why goes into the fault message. */
void hm_tiered_abort(hm_tiered *t, const char *why);
/* After a fault or an abort: makes sure nothing waits (abort), pauses the worker, waits for the
 * engine's stream, clears the hand-off (abort, fault, pending requests) and the CPU side's fault,
 * and serves again. Call it between steps (no hm_decode or generation running). */
hm_status hm_tiered_reset(hm_tiered *t, hm_error *err);
/* HM_OK, or the CPU side's first fault since the last reset (HM_ERR_STATE with its reason). */
hm_status hm_tiered_check(hm_tiered *t, hm_error *err);

/* The fetched-expert path of prompt ubatches (cuda/cuda_fetch.h): for a request the GPU posts
 * with msg.fetch, the worker decides per used expert (moe/offload.h) which ones the GPU runs,
 * copies their bytes through the lane into staging buffer L & 1 at the engine's layout, computes
 * the others, waits for the copies (a host-side sync of the lane), writes the hand-off's fslot
 * table and answers. Requests without msg.fetch (decode steps) are served as before. */
struct cuda_copy_lane;
typedef struct {
    struct cuda_copy_lane *lane; /* borrowed; the worker is its only user from now on; NULL: no
                                    copy path (every expert on the CPU, cause "no GPU") */
    const offload_rates *rates;  /* [n_layer] the calibrated rates (calib_layer_rates), copied;
                                    NULL: the CALIB_DEFAULT_* rates */
    int64_t threshold;           /* --moe-offload-threshold N (>= 1), 0: the cost model */
    bool debug;                  /* HOTMOE_SCHED_DEBUG=1: log every decision (offload_plan_format) */
} hm_tiered_offload;
/* Configures the path (the worker paused meanwhile; call it before the first step). The
 * staging layouts come from the engine (cuda_engine_fetch_layout), so cuda_engine_fetch_set
 * comes first; on a caller-owned view every layer has none (no expert can go to the GPU).
 * HM_ERR_ARG for a negative threshold or a negative or non-finite rate. */
hm_status hm_tiered_set_offload(hm_tiered *t, const hm_tiered_offload *o, hm_error *err);
/* The hot cache's controller (runtime/tiered_hot.c): with mixed layers the worker sees every
 * selection (hot ones posted as -2 - id) and drives online admission (policy lru or lfru, at
 * most admit_per_step per layer per step) and, every update_interval tokens, the updater
 * (update_rate of the hot slots at most; 0: none), handing each exchange to ex (in a context:
 * cuda_engine_hot_request, applied by the engine's thread between steps, which also publishes
 * the completed copies) after answering a request. hot [n_layer][n_expert]: the cache as the
 * engine holds it. Only the worker calls ex. HM_ERR_ARG for a rate outside [0, 1] or an interval < 1. */
typedef struct {
    hot_policy policy;       /* --moe-hot-cache-policy (static) */
    int admit_per_step;      /* K (1) */
    double decay;            /* lfru's decay per step (0.9) */
    double update_rate;      /* --moe-hot-cache-update-rate (0) */
    int64_t update_interval; /* --moe-hot-cache-update-interval tokens (256) */
    hot_weight_cfg weight;   /* the weighting the updater scores the window with */
} hm_tiered_hot_cfg;
typedef hm_status (*hm_tiered_exchange_fn)(void *user, int il, int out, int in, hm_error *err);
hm_status hm_tiered_set_hot(hm_tiered *t, const hm_tiered_hot_cfg *c, const uint8_t *hot,
                            hm_tiered_exchange_fn ex, void *user, hm_error *err);

/* A hot cache without controller (static, no updates): its map hot [n_layer][n_expert] (1: the
 * engine holds the expert in a slot), copied, so that the copies ahead of prompt ubatches leave
 * those experts out. HM_ERR_ARG without a map. */
hm_status hm_tiered_set_hot_map(hm_tiered *t, const uint8_t *hot, hm_error *err);

/* A manual apply of the hot cache (seed 001's POST /moe-hot-cache): scores l (a learn or perf
 * file of this model) with the controller's weighting and exchanges slots for the better-scored
 * experts with the full budget (rate 1), between steps (the worker paused). *st: the seed's
 * update statistics. HM_ERR_STATE without a controller, HM_ERR_ARG for a file of another shape. */
hm_status hm_tiered_hot_apply(hm_tiered *t, const moe_learn *l, hot_update_stats *st,
                              hm_error *err);
/* An update now from the window so far (the server's update after each request), when the
 * controller has an update rate > 0; nothing otherwise. Between steps. */
hm_status hm_tiered_hot_update_now(hm_tiered *t);

/* Post-fetch at decode requests (seed 000; runtime/tiered_postfetch.c): with on, a decode
 * request of at most CUDA_HANDOFF_PF_TOK tokens at a layer the engine takes post-fetch for
 * (cuda_engine_postfetch_layer) is decided by moe/postfetch.h (c, r): the chosen cold experts'
 * down rows are copied through the copy lane into the layer's staging buffer while the CPU
 * computes the other experts and the chosen ones' gate, up and activation (into the hand-off's
 * h); then (block_on_miss) it waits for the copies, or (not) computes the down products itself
 * of those still in flight; fslot names each post-fetched slot's scratch slot. A failed copy:
 * the CPU computes those experts, counted. Needs the offload lane (hm_tiered_set_offload) and
 * the engine's post-fetch on (cuda_engine_postfetch_set); off: every request as before.
 * HM_ERR_ARG for rates pf_decide refuses (not finite, read or copy rate 0, concurrency < 1). */
typedef struct pf_config pf_config;
typedef struct pf_rates pf_rates;
hm_status hm_tiered_set_postfetch(hm_tiered *t, bool on, const pf_config *c, const pf_rates *r,
                                  hm_error *err);

/* The live layer perf counters (seed 001's --moe-layer-perf full; runtime/tiered_perf.c): per
 * layer the CPU side serves, calls, tokens, each expert's selections split hot (its cache slot
 * on the GPU) and cold (the CPU's, computed or fetched), the lanes' times (the GPU's clock from
 * the hand-off kernels, the CPU's own) and the copies of the fetched path and of post-fetch.
 * hm_tiered_perf_write writes them in the learn schema (docs/LEARN.md), which --moe-hot-cache
 * and `hotmoe plan` read. Call these between steps. */
hm_status hm_tiered_perf_enable(hm_tiered *t, hm_error *err);
/* The counters summed over the layers: what `hotmoe run` and `bench` print at exit. */
typedef struct {
    int layers;                /* layers with calls */
    uint64_t calls, timed;     /* requests, and those with the GPU's times */
    double wall_us, hot_us, wait_us, cold_us; /* sums (wall, hot, wait: over the timed calls) */
    uint64_t fetch_experts, fetch_bytes, pf_experts, fallbacks;
    double fetch_wait_us;
} hm_tiered_perf_sum;
hm_status hm_tiered_perf_summary(hm_tiered *t, hm_tiered_perf_sum *s, hm_error *err);
hm_status hm_tiered_perf_write(hm_tiered *t, const char *path, const char *arch,
                               const char *name, hm_error *err);
/* The same counters as one JSON object into j (the learn schema). */
hm_status hm_tiered_perf_json(hm_tiered *t, hm_json *j, const char *arch,
                              const char *name, hm_error *err);
/* Counters off (freed); the hot cache's own window stays. */
hm_status hm_tiered_perf_disable(hm_tiered *t);
/* full (counters on), update (a hot cache controller keeps its window), off. */
hm_layer_perf hm_tiered_perf_mode(const hm_tiered *t);

/* The pool the worker computes with: others may run jobs on it only before the first step
 * (the calibration at init: runtime/calibrate.h, whose CPU figures must be this pool's). */
tp_pool *hm_tiered_pool(hm_tiered *t);

typedef struct {
    uint64_t requests; /* layer requests answered */
    uint64_t tokens;   /* tokens of those requests */
    uint64_t faults;   /* requests that failed (malformed, FFN error, injected) */
    uint64_t aborts;   /* times the abort word was set by this side (faults, abort, free) */
    uint64_t resets;   /* hm_tiered_reset calls */
    double busy_s;     /* time spent computing answers */
    uint64_t fetch_requests; /* requests posted with msg.fetch (prompt ubatches) */
    uint64_t gpu_experts;    /* experts of those the GPU ran from a fetched copy */
    uint64_t cpu_experts;    /* used experts of those the CPU computed */
    uint64_t fetched_bytes;  /* bytes copied into the staging buffers */
    double copy_wait_s;      /* time the worker waited for copies after its own experts */
    double copy_enqueue_s;   /* time it spent enqueueing copies (its layer's and ahead) */
    uint64_t copies;         /* layers whose fetched experts were copied (or tried) */
    uint64_t copy_fallbacks; /* of those, copies that failed: the CPU computed those experts */
    uint64_t retries;        /* failed steps redone by the context (hm_tiered_count_retry) */
    uint64_t ahead_experts;  /* experts of a next layer copied ahead (runtime/tiered_fetch.c) */
    uint64_t ahead_used;     /* of those, experts the GPU then ran */
    uint64_t hot_hits, hot_misses; /* selections of mixed layers served hot / cold */
    uint64_t hot_admitted;   /* admissions decided (lru, lfru) */
    uint64_t hot_updates;    /* updates run */
    uint64_t hot_exchanged;  /* exchanges handed to the engine (admissions and updates) */
    uint64_t hot_refused;    /* exchanges the engine refused (taken back) */
    uint64_t pf_requests;    /* decode requests with post-fetched experts */
    uint64_t pf_experts;     /* experts whose down product the GPU ran from a copy */
    uint64_t pf_bytes;       /* down bytes copied for them */
    uint64_t pf_fallbacks;   /* experts chosen whose copy failed or was late: the CPU's */
    double pf_wait_s;        /* time the worker waited for those copies */
    double pf_copy_s;        /* their copies' time at the calibrated rate (the overlap's base) */
} hm_tiered_stats;
void hm_tiered_get_stats(hm_tiered *t, hm_tiered_stats *s);
/* Threads computing the experts (the pool's size). */
int hm_tiered_n_threads(const hm_tiered *t);
/* Counts a failed step that the caller redoes after hm_tiered_reset (runtime/context.c). */
void hm_tiered_count_retry(hm_tiered *t);
/* Test hooks of hm_tiered_params set on a running object (counted from now on; 0: never). */
void hm_tiered_set_test_hooks(hm_tiered *t, uint64_t fail_after, uint64_t stall_after,
                              uint64_t copy_fail_from);

#endif
