/* slots.h - several generations at once on one context (continuous batching; the server's -np):
 * slot k is sequence k of the context (hm_context_params.n_seq) with its own sampler.
 *
 * DESIGN: a step is one hm_decode_seqs call over every active slot: first each generating
 * slot's last token (handed out by the previous step, not yet in its cache), then prompt chunks
 * of the slots still reading their prompt, in slot order, within the batch size (-b). Every slot
 * whose prompt ends in this step or that generates gets its next token, sampled from its own row
 * with its own sampler (sample.h): the CPU generator's order of operations (prompt tokens
 * accepted, sample, accept), so a slot gives the tokens `hotmoe run` gives for its prompt,
 * sampling and seed, whatever the other slots do (the engine's rows do not depend on the batch:
 * hm_decode_seqs).
 *
 *   hm_slots *s; hm_slots_init(ctx, &s, &err);
 *   hm_slots_start(s, k, prompt, n, &sp, &err);
 *   while (any active) { hm_slots_step(s, out, &err); ... out[k] >= 0: slot k's token;
 *                        hm_slots_stop(s, k) when it is done }
 *   hm_slots_free(s);
 */
#ifndef HM_RUNTIME_SLOTS_H
#define HM_RUNTIME_SLOTS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "runtime/context.h"
#include "sample/sample.h"

typedef struct hm_slots hm_slots;

/* hm_context_n_seq(ctx) slots on ctx (not owned). */
hm_status hm_slots_init(hm_context *ctx, hm_slots **out, hm_error *err);
void hm_slots_free(hm_slots *s);
int hm_slots_count(const hm_slots *s);

/* Starts slot k (stopping what it ran) on prompt[0..n) (copied, n >= 1, at most the context's
 * n_ctx - 1 tokens), read by the next steps, with a sampler of sp. The slot's cache keeps the
 * longest start of the prompt it already holds (the previous request's prompt and reply: a chat
 * that goes on), on the CPU engine only, where that gives the same bytes; the rest is read. */
hm_status hm_slots_start(hm_slots *s, int k, const int32_t *prompt, int n, const sample_params *sp,
                         hm_error *err);
/* Slot k's cache is not reused by its next start (llama-server's cache_prompt false): the
 * prompt is read whole. */
void hm_slots_forget(hm_slots *s, int k);
/* Frees slot k (its cache stays for the next start to reuse). */
void hm_slots_stop(hm_slots *s, int k);
/* The free slot whose cache holds the longest start of prompt[0..n) (ties: the lowest), or -1
 * when every slot is busy. */
int hm_slots_pick(const hm_slots *s, const int32_t *prompt, int n);
/* The prompt tokens slot k's last start found in its cache. */
int hm_slots_cached(const hm_slots *s, int k);
bool hm_slots_active(const hm_slots *s, int k);
/* Tokens slot k may still hand out before its sequence is full (as hm_gen_room). */
int hm_slots_room(const hm_slots *s, int k);

/* One batched forward for the active slots; out[k] (hm_slots_count entries) = the token slot k
 * got in this step, or -1 (not active, still reading its prompt, or full). A slot with no room
 * left gets no token: the caller stops it. HM_ERR_STATE when no slot is active. */
hm_status hm_slots_step(hm_slots *s, int32_t *out, hm_error *err);
/* Tokens the last step computed (prompt chunks and generated tokens together). */
int hm_slots_last_batch(const hm_slots *s);

#endif
