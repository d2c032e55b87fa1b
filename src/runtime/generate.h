/* generate.h - token generation on a context: the next token, one call at a time, on the CPU
 * or, when the context runs on a GPU, from a decode loop the GPU drives by itself.
 *
 * DESIGN: a generator (hm_gen) owns the sampler state (penalty history, draw counter) and the
 * logits the next token is drawn from. hm_gen_prompt runs tokens at the end of the cache and
 * adds them to the history; hm_gen_next hands out the next token; hm_gen_end finishes a
 * generation so that the cache holds exactly prompt + the tokens the caller took.
 *
 *  - CPU (a context without a GPU engine, host_loop, or a split context whose first layers run
 *    on the CPU: hm_context_split_layer): hm_gen_next decodes the token it handed
 *    out last (if any) and samples the next one with sample_token: today's loop, the same bits.
 *    The last token taken is decoded by hm_gen_end (hm_gen_free alone skips that decode).
 *  - GPU (cuda_decode.h): one decode step — sample from the device logits into a device token,
 *    commit that token into a slot of a pinned, mapped ring, run the forward pass for it at the
 *    device position, advance the position — is captured once as a CUDA graph and replayed.
 *    The host keeps up to `lookahead` steps enqueued and reads the tokens by polling the ring:
 *    no stream synchronisation and no device->host copy per token. Because the GPU runs ahead,
 *    hm_gen_end waits once for the steps in flight, then rewinds what the caller did not take:
 *    the cache length, the sampler's history and draw counter (restored from the host's
 *    mirror), and the device logits (the last taken token is run again at its position; the
 *    forward pass is deterministic, so the logits are the same bytes).
 *
 * Either way the same seed picks the same tokens from the same logits (the device sampler is
 * the CPU sampler's definition, docs/SAMPLING.md). Every token taken is accepted into the
 * penalty history, end-of-generation tokens included.
 *
 *   hm_gen *g; hm_gen_init(ctx, &sp, NULL, &g, &err);
 *   hm_gen_prompt(g, ids, n, &err);
 *   while (...) { hm_gen_next(g, &tok, &err); if (stop(tok)) break; ... }
 *   hm_gen_end(g, &err);            (cache: prompt + tokens taken; hm_gen_next continues)
 *   hm_gen_free(g);
 */
#ifndef HM_RUNTIME_GENERATE_H
#define HM_RUNTIME_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "runtime/context.h"
#include "sample/sample.h"

typedef struct hm_gen hm_gen;

typedef struct {
    int lookahead;    /* GPU: decode steps enqueued ahead of the caller (ring depth), 1..64
                         (default 8) */
    int n_max;        /* most tokens one generation takes (from a start to hm_gen_end or
                         hm_gen_prompt); bounds how far the GPU runs ahead. -1: until the
                         context is full (default) */
    bool host_loop;   /* GPU context: decode with hm_decode and sample on the host (the
                         reference loop) instead of the autonomous graph (default false) */
    int audit_tokens; /* record the arrival time of the first audit_tokens tokens of each
                         generation (hm_gen_audit; 0 = off, the default) */
} hm_gen_params;

hm_gen_params hm_gen_default_params(void);

/* A generator on ctx (not owned; one generator per context at a time). On a GPU context the
 * device sampler is created and the decode step captured here (graph freeze before decode).
 * gp NULL = defaults. Errors: bad sampler parameters (HM_ERR_ARG), CUDA errors. */
hm_status hm_gen_init(hm_context *ctx, const sample_params *sp, const hm_gen_params *gp,
                      hm_gen **out, hm_error *err);
void hm_gen_free(hm_gen *g);

/* Runs tokens[0..n) at the end of the cache (pieces of at most n_batch), accepts them into the
 * penalty history and keeps the last one's logits for the next token. Ends a generation in
 * flight first (hm_gen_end). n >= 1. */
hm_status hm_gen_prompt(hm_gen *g, const int32_t *tokens, int n, hm_error *err);

/* The next token. Needs logits (a prompt before, or a previous generation's last token).
 * HM_ERR_RANGE "context full" when no position is left for another token (hm_gen_room). */
hm_status hm_gen_next(hm_gen *g, int32_t *token, hm_error *err);

/* Tokens hm_gen_next may still hand out before the context is full (the caller's limit n_max
 * aside). */
int hm_gen_room(const hm_gen *g);

/* Ends the generation: waits for steps in flight, discards the tokens generated past the last
 * one taken, and leaves hm_context_n_past == prompt + tokens taken, the sampler and the logits
 * as if generation had stopped exactly there (the next hm_gen_next continues with the token an
 * uninterrupted run would give). No-op when nothing is in flight. Call it before touching the
 * context (hm_decode, hm_context_truncate). */
hm_status hm_gen_end(hm_gen *g, hm_error *err);

/* Changes n_max (hm_gen_params) from the next generation on. */
void hm_gen_set_max(hm_gen *g, int n_max);

/* Forgets the penalty history and restarts the draw counter (a new conversation); ends a
 * generation in flight. */
hm_status hm_gen_reset_sampler(hm_gen *g, hm_error *err);

/* ---- audit (seed 004 section 15) ---- */

typedef struct {
    bool gpu;               /* tokens came from the autonomous device loop */
    int n_tokens;           /* tokens taken in the last generation */
    int n_timed;            /* arrival times recorded (<= audit_tokens) */
    uint64_t host_syncs;    /* host synchronisations (stream syncs, device->host copies) between
                               the first and the last token taken: 0 when autonomous */
    uint64_t host_syncs_end;/* those of starting and ending the generation (the prompt's logits,
                               the wait in hm_gen_end) */
    uint64_t graph_nodes;   /* nodes of the captured decode-step graph (0: CPU) */
    uint64_t kernel_nodes;  /* of which kernels */
    uint64_t stream_queries;/* cudaStreamQuery calls while waiting for tokens (non-blocking
                               liveness checks when a token takes over 1 ms) */
    uint64_t steps;         /* decode steps run for this generation (GPU: includes run-ahead) */
    double first_s, last_s; /* arrival of the first / last timed token, seconds, monotonic */
    double tg_mean_s;       /* mean interval between consecutive timed tokens */
    double tg_cv;           /* coefficient of variation (sd / mean) of those intervals */
} hm_gen_audit;

/* Figures of the current or last generation. */
void hm_gen_audit_get(const hm_gen *g, hm_gen_audit *a);
/* Arrival times (seconds, monotonic) of the timed tokens of the last generation: [n_timed]. */
const double *hm_gen_arrivals(const hm_gen *g, int *n);

/* true when tokens come from the autonomous GPU loop. */
bool hm_gen_on_gpu(const hm_gen *g);

#endif
