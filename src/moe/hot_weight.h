/* hot_weight.h - the hot cache's weighting (seed 001): observed expert use (a learn file or a
 * perf snapshot, moe/learn_file.h) becomes one score per (layer, expert); the planner
 * (moe/hot_plan.h) packs the best-scored experts into the VRAM budget.
 *
 * DESIGN: score[l][e] = hits[l][e] * w_l^curve, where hits are the observed selections of
 * expert e in layer l (every layer makes n_expert_used selections per token, so raw hits of
 * different layers compare) and w_l a layer weight that the mode derives from the layer's
 * observations, normalised to mean 1 over the layers with hits:
 *
 *   flat             w_l = 1: every selection counts the same
 *   time             w_l ~ moe_time_us / calls (a slow layer's misses cost more)
 *   pressure         w_l ~ miss_l * time_l: the time its cold selections cost, miss_l the share
 *                    of selections that went cold (1 without a hot/cold split: no cache yet)
 *   smooth_pressure  w_l ~ sqrt(pressure weight): the same order, outliers damped
 *   balanced         w_l = 1, and hits are replaced by their share of the layer's selections
 *                    times the mean selections per layer: every layer's traffic weighs the same
 *
 * A file without timings (a learn run) gives time_l = 1 everywhere, so time, pressure and
 * smooth_pressure fall back to the miss share or to flat, said in the result. The layer curve
 * (>= 0, default 0.5) is how strongly w_l applies: 0 ignores it, 1 applies it fully, more
 * sharpens it. docs/HOT_CACHE.md gives the same with an example. Pure C, no allocation but the
 * caller's arrays.
 */
#ifndef HM_MOE_HOT_WEIGHT_H
#define HM_MOE_HOT_WEIGHT_H

#include <stdbool.h>

#include "base/status.h"
#include "moe/learn_file.h"

typedef enum {
    HOT_WEIGHT_FLAT = 0,
    HOT_WEIGHT_PRESSURE,
    HOT_WEIGHT_SMOOTH_PRESSURE,
    HOT_WEIGHT_TIME,
    HOT_WEIGHT_BALANCED,
    HOT_WEIGHT_COUNT
} hot_weighting;

#define HOT_WEIGHT_NAMES "flat, pressure, smooth_pressure, time, balanced"

typedef struct {
    hot_weighting mode;  /* --moe-hot-cache-weighting (default flat) */
    double layer_curve;  /* --moe-hot-cache-layer-curve (>= 0, default 0.5) */
} hot_weight_cfg;

hot_weight_cfg hot_weight_default(void);

/* "flat" ... "balanced" -> *out; HM_ERR_ARG naming the known names otherwise. */
hm_status hot_weighting_parse(const char *s, hot_weighting *out, hm_error *err);
const char *hot_weighting_name(hot_weighting w);

typedef struct {
    bool timed;          /* every layer with hits had calls and moe_time_us */
    bool split;          /* every layer with hits had a hot/cold split */
} hot_weight_info;

/* Scores of learn file l: score[l * n_expert + e] and layer_w[l] (w_l^curve; 0 for a layer
 * without hits). HM_ERR_ARG for a negative or non-finite curve or a mode out of range. */
hm_status hot_weight_score(const moe_learn *l, const hot_weight_cfg *c, double *score,
                           double *layer_w, hot_weight_info *info, hm_error *err);

#endif
