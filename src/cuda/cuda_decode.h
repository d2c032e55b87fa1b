/* cuda_decode.h - the GPU-autonomous decode loop: one captured CUDA graph per decode step,
 * replayed; tokens come back through a pinned, mapped ring the host polls. Plain C;
 * implemented in cuda_decode.cu, stubbed in cuda_none.c (HM_ERR_UNSUPPORTED). Used by
 * runtime/generate.c (the generation API); see runtime/generate.h for the contract.
 *
 * DESIGN: the step graph, captured once at init on the engine's stream, is
 *     cuda_sampler_sample(d_logits -> d_token)          draw counter and history on the device
 *     commit: ring[step % depth] = {token, step + 1}    mapped host memory; token, fence, seq
 *             d_step += 1
 *     cuda_engine_enqueue_step(d_token)                 forward at *d_pos, d_logits, *d_pos += 1
 * Every value that changes per step (token, position, draw counter, ring slot) lives in device
 * memory, so the same graph replays for every token at every context length. The host
 * launches a step only after it has read the token of the step `depth` before it (that slot is
 * free), so the ring is never overrun; it reads a token when the slot's sequence number equals
 * the global step number + 1 (stale slots hold smaller numbers). While it waits it spins; if a
 * token takes long it asks cudaStreamQuery (not a synchronisation) whether the stream died or
 * went idle without delivering. The only synchronisations are cuda_decode_finish (counted by
 * the engine, once per generation) and the engine's own host API.
 * The graph holds what the step was when captured, the engine's routing counts on or off
 * included (cuda_engine_route_counts_enable: the router kernels get the counters or not); when
 * they were switched since, cuda_decode_launch captures the step again first (the old graph is
 * freed once its launches in flight have completed).
 */
#ifndef HM_CUDA_CUDA_DECODE_H
#define HM_CUDA_CUDA_DECODE_H

#include <stdint.h>

#include "base/status.h"
#include "cuda/cuda_engine.h"
#include "sample/sample.h"

typedef struct cuda_decode cuda_decode;

#define CUDA_DECODE_MAX_DEPTH 64

/* Creates the device sampler (params sp), the ring (depth slots, 1..CUDA_DECODE_MAX_DEPTH),
 * the device scalars, and captures + instantiates the step graph. */
hm_status cuda_decode_init(cuda_engine *e, const sample_params *sp, int depth, cuda_decode **out,
                           hm_error *err);
void cuda_decode_free(cuda_decode *d);

/* Sets the device sampler's state: history = hist[0..n_hist) (oldest first; the sampler keeps
 * the last penalty_last_n), draw counter = n_draws. Enqueued (host->device only). */
hm_status cuda_decode_sampler_set(cuda_decode *d, const int32_t *hist, int n_hist,
                                  uint64_t n_draws, hm_error *err);
/* Appends tokens to the device sampler's history (prompt tokens). Enqueued. */
hm_status cuda_decode_accept(cuda_decode *d, const int32_t *tokens, int n, hm_error *err);

/* Starts a generation whose first step forwards its token at cache position pos: *d_pos = pos.
 * The device logits must be those of position pos - 1. Enqueued. */
hm_status cuda_decode_begin(cuda_decode *d, int pos, hm_error *err);
/* Enqueues the next step (one graph launch; first a new capture when the engine's routing
 * counts were switched since the last one). */
hm_status cuda_decode_launch(cuda_decode *d, hm_error *err);
/* Steps launched since init (global step numbers are 0..launched-1). */
uint64_t cuda_decode_launched(const cuda_decode *d);
/* Waits for the token of global step `step` (launched, and at most depth - 1 steps before the
 * newest launch) by polling the ring. */
hm_status cuda_decode_wait(cuda_decode *d, uint64_t step, int32_t *token, hm_error *err);
/* Waits until every launched step has finished (one counted engine synchronisation). */
hm_status cuda_decode_finish(cuda_decode *d, hm_error *err);
/* Runs token at position pos again (a forward step from host memory, without sampling): the
 * device logits become those of pos, the cache row pos is rewritten with the same values.
 * Enqueued; leaves *d_pos = pos + 1. */
hm_status cuda_decode_redo(cuda_decode *d, int32_t token, int pos, hm_error *err);
/* Sets the device logits (the first row) to logits[0..n_vocab) from host memory: a generation
 * that must start again from a prompt's logits, which no single-token step reproduces (the
 * prompt's last ubatch may have run on the GEMMs). The copy is done when this returns. */
hm_status cuda_decode_set_logits(cuda_decode *d, const float *logits, hm_error *err);

typedef struct {
    uint64_t graph_nodes;  /* nodes of the step graph */
    uint64_t kernel_nodes; /* of which kernel launches */
    uint64_t launches;     /* graph launches since init */
    uint64_t queries;      /* cudaStreamQuery calls of cuda_decode_wait (a token that took over
                              1 ms; a query does not wait) */
} cuda_decode_stats;

void cuda_decode_get_stats(const cuda_decode *d, cuda_decode_stats *s);
/* The engine's count of host synchronisations (cuda_engine_sync). */
uint64_t cuda_decode_host_syncs(const cuda_decode *d);

#endif
