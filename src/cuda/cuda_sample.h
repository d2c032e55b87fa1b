/* cuda_sample.h - the device sampler: picks, from a row of device logits, exactly the token
 * sample_token (src/sample/sample.c, docs/SAMPLING.md) picks from the same logits, parameters,
 * history and draw number. Plain C; implemented in cuda_sample.cu, stubbed in cuda_none.c
 * (HM_ERR_UNSUPPORTED "built without CUDA").
 *
 * DESIGN: the sampler's state lives in device memory: the penalty history (a ring of the last
 * penalty_last_n accepted tokens, its head and length) and the draw counter. cuda_sampler_sample
 * only enqueues kernels on the stream: it reads the logits and the state on the device, writes
 * the chosen id to a device int32, appends it to the history and advances the counter (when it
 * draws), with no host synchronisation, allocation or copy, so it can be captured into a CUDA
 * graph once and replayed for every decode step. Unlike sample_token it accepts the token it
 * picks into the history itself (the CPU caller calls sample_accept after sample_token).
 * A NaN logit (sample_token: HM_ERR_ARG) makes the device token -1 and leaves the state alone.
 * Paths (chosen at init from the parameters): greedy = one argmax kernel; 0 < top_k small =
 * per-block sorted top-k + one block that merges and runs the chain; otherwise a stable device
 * radix sort of all logits + one block that runs the chain over the live prefix (the
 * exactness argument for stopping early is in cuda_sample.cu).
 */
#ifndef HM_CUDA_CUDA_SAMPLE_H
#define HM_CUDA_CUDA_SAMPLE_H

#include <stdint.h>

#include "base/status.h"
#include "sample/sample.h"

typedef struct cuda_sampler cuda_sampler;

/* Candidates whose term argument x (l - max, or l/T - max/T) is below this have hm_expf(x) <
 * 2^-26 and cannot change a running sum of the chain (proof in cuda_sample.cu; the bound on
 * hm_expf is checked for every float by tests/cuda/test_cuda_sample.c). */
#define CUDA_SAMPLER_TAIL_X -18.5f

/* Allocates the device state and scratch for n_vocab tokens (on the current device) and
 * enqueues its reset on stream (a cudaStream_t; NULL = legacy default stream). Parameters are
 * checked as sample_init checks them, plus: repeat_penalty finite and
 * penalty_last_n * |frequency_penalty| + |presence_penalty| finite (HM_ERR_ARG otherwise: with
 * those a penalty could turn a number into NaN). */
hm_status cuda_sampler_init(const sample_params *p, int32_t n_vocab, void *stream,
                            cuda_sampler **out, hm_error *err);
void cuda_sampler_free(cuda_sampler *s);

/* History empty, draw counter 0. Enqueued on stream (capturable). */
hm_status cuda_sampler_reset(cuda_sampler *s, void *stream, hm_error *err);
/* Appends tokens[0..n) (oldest first) to the history, as sample_accept does one by one (ids
 * outside the vocabulary are skipped). Enqueued; the tokens travel as kernel arguments, so the
 * host array may be reused as soon as this returns. Host->device only, no synchronisation. */
hm_status cuda_sampler_accept_host(cuda_sampler *s, const int32_t *tokens, int n, void *stream,
                                   hm_error *err);
/* Sets the draw counter (the number of draws already made). Enqueued. */
hm_status cuda_sampler_set_draws(cuda_sampler *s, uint64_t n_draws, void *stream, hm_error *err);

/* Enqueues one pick: d_logits [n_vocab] f32 device (not modified) -> *d_token (device int32),
 * history += token, draw counter += 1 when temperature > 0. Never synchronises. */
hm_status cuda_sampler_sample(cuda_sampler *s, const float *d_logits, int32_t *d_token,
                              void *stream, hm_error *err);

/* ---- synchronous helpers (tests, tools; never inside the decode loop) ---- */

/* Copies logits [n_vocab] from host memory to the sampler's own device buffer, samples, waits
 * and returns the token; HM_ERR_ARG ("logit is NaN") when the device answered -1. */
hm_status cuda_sampler_sample_host(cuda_sampler *s, const float *logits, int32_t *token,
                                   void *stream, hm_error *err);
/* Waits for stream, then reads the draw counter and the history length. */
hm_status cuda_sampler_read_state(cuda_sampler *s, void *stream, uint64_t *n_draws,
                                  int32_t *hist_len, hm_error *err);

#endif
