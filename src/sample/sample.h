/* sample.h - choosing the next token from a row of logits: greedy, temperature, top-k, top-p,
 * min-p, repeat/presence/frequency penalties, seeded.
 *
 * DESIGN: the chain follows llama.cpp's default order (common_sampler): penalties -> top-k ->
 * top-p -> min-p -> temperature -> draw. Everything is defined in docs/SAMPLING.md precisely
 * enough for a GPU version to pick the same token from the same logits: the random number of
 * draw number `step` is a pure function sample_uniform(seed, step) (splitmix64 keyed by seed
 * and step, 24 bits -> float in [0,1)), the candidates are ordered by (logit desc, id asc), and
 * the pick is the first candidate whose running (float, that order) sum of hm_expf(l - max)
 * exceeds u * total. A sampler state holds the penalty history (last penalty_last_n accepted
 * tokens), the draw counter and scratch sized for the vocabulary; no allocation per token.
 */
#ifndef HM_SAMPLE_SAMPLE_H
#define HM_SAMPLE_SAMPLE_H

#include <stdint.h>

#include "base/status.h"

typedef struct {
    float temperature;       /* <= 0: greedy (argmax after penalties; lower id on ties) */
    int32_t top_k;           /* <= 0 or >= n_vocab: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    int32_t penalty_last_n;  /* history length for penalties (llama.cpp: 64); 0: off */
    uint64_t seed;
} sample_params;

/* llama.cpp's defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off,
 * penalty_last_n 64, seed 0. */
sample_params sample_params_default(void);

typedef struct sample_state sample_state;

/* HM_OK when p and n_vocab make a sampler (numbers where numbers are needed, a finite repeat
 * penalty > 0, finite presence/frequency penalties small enough that a penalty stays finite,
 * penalty_last_n >= 0, n_vocab > 0), else HM_ERR_ARG naming the problem. sample_init and the
 * device sampler check with it, so a penalised logit is never NaN. */
hm_status sample_params_check(const sample_params *p, int32_t n_vocab, hm_error *err);

hm_status sample_init(const sample_params *p, int32_t n_vocab, sample_state **s, hm_error *err);
void sample_free(sample_state *s);
/* Forgets the history and restarts the draw counter at 0. */
void sample_reset(sample_state *s);
/* Adds a token to the penalty history (prompt tokens and generated tokens alike). */
void sample_accept(sample_state *s, int32_t token);

/* Picks a token from logits [n_vocab] (not modified). Every call that draws a random number
 * (temperature > 0) advances the draw counter by one. Fails (HM_ERR_ARG) if a logit is NaN. */
hm_status sample_token(sample_state *s, const float *logits, int32_t *token, hm_error *err);

/* ---- the shared definitions (docs/SAMPLING.md), exposed for tests and other back ends ---- */

/* splitmix64 finaliser of seed + (step + 1) * 0x9E3779B97F4A7C15. */
uint64_t sample_rng_u64(uint64_t seed, uint64_t step);
/* (float)(sample_rng_u64(seed, step) >> 40) * 2^-24, in [0, 1). */
float sample_uniform(uint64_t seed, uint64_t step);

#endif
