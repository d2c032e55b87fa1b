/* route_setup.h - --moe-routing-profile for benchmarks: the GPU engine's routers' choice
 * replaced by a routing table drawn from a published profile (docs/ROUTING.md).
 *
 * DESIGN: the profile (moe/routing_stats.h) seeds moe/route_synth.h, which draws K ids for
 * every position of the context and every MoE layer, once at init; the GPU engine takes the
 * table (cuda_engine_route_table) and its kernel after each router writes the position's ids.
 * Refused without a GPU engine: a benchmark must not report the model's own routing under the
 * profile's name.
 */
#ifndef HM_RUNTIME_ROUTE_SETUP_H
#define HM_RUNTIME_ROUTE_SETUP_H

#include "base/status.h"
#include "cuda/cuda_engine.h"
#include "model/model.h"
#include "runtime/context.h"

/* Draws the table for p->n_ctx positions from p->routing_profile (seed p->routing_seed) and
 * hands it to gpu. HM_ERR_UNSUPPORTED when gpu is NULL; the profile's and the engine's errors. */
hm_status route_setup_open(const hm_model *m, const hm_context_params *p, cuda_engine *gpu,
                           hm_error *err);

#endif
