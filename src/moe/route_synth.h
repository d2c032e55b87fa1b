/* route_synth.h - synthetic routing drawn from a routing profile (docs/ROUTING.md), for
 * benchmarks of forged models whose own routers route almost uniformly: --moe-routing-profile
 * (bench only, labelled in every report) replaces the routers' choices with these.
 *
 * DESIGN: two parameters per model, fitted to the profile's average figures at init:
 *   - skew: expert popularity follows a Zipf law, p(rank r) ~ 1 / (r + 1)^z, over a permutation
 *     of the experts that differs per layer; z is fitted (bisection) so that the generated
 *     routing's share of the top 25 % of the experts equals the profile's top_share.25, or, when
 *     that is unknown, so that the experts needed for 90 % of the selections equal its
 *     experts_for_share.90 (0 = uniform when neither is known);
 *   - locality: each of a token's n_used slots reuses, with probability q, one of the previous
 *     token's experts (in the same layer and sequence, not yet chosen), else draws from the
 *     popularity law (rejecting experts already chosen); q is fitted so that the generated
 *     repeat-at-distance-1 rate equals the profile's repeat.1 (0 when unknown).
 * The fits measure the generator itself (moe/routing_stats.h over a few thousand tokens), so
 * sampling without replacement and the reuse are accounted for. Every draw comes from a
 * splitmix64 stream per layer seeded from (seed, layer): the same seed gives the same routing.
 * Gating weights are 1 / n_used. The figures it was not fitted to (LRU hit rates, longer
 * distances) follow from the model and are what they are: a benchmark reports them measured.
 */
#ifndef HM_MOE_ROUTE_SYNTH_H
#define HM_MOE_ROUTE_SYNTH_H

#include <stdint.h>

#include "base/status.h"
#include "moe/routing_stats.h"

typedef struct route_synth route_synth;

/* A generator for a model of n_layer x n_expert experts, n_used per token, fitted to p's
 * average figures (p NULL: uniform, no locality). HM_ERR_ARG for bad shapes or a profile whose
 * n_expert_used exceeds n_expert. */
hm_status route_synth_init(const moe_routing_profile *p, int n_layer, int n_expert, int n_used,
                           uint64_t seed, route_synth **out, hm_error *err);
void route_synth_free(route_synth *s);

/* A new sequence: no token before it to reuse experts from. */
void route_synth_begin(route_synth *s);
/* The next token's selection in layer il: ids [n_used] distinct, weights [n_used] (may be
 * NULL). */
void route_synth_next(route_synth *s, int il, int32_t *ids, float *weights);

/* The fitted parameters: the Zipf exponent z and the reuse probability q. */
double route_synth_skew(const route_synth *s);
double route_synth_reuse(const route_synth *s);

#endif
