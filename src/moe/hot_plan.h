/* hot_plan.h - the hot cache's planner and budget (seed 001): which experts of the layers whose
 * experts live in RAM get a VRAM slot, within a byte budget.
 *
 * DESIGN: the candidates are the (layer, expert) pairs of the eligible layers (those the
 * placement leaves in RAM) with a score > 0 (moe/hot_weight.h); each costs the expert's whole
 * bytes in its layer (gate, up and down rows, biases: offload_expert_size, every quant layout).
 * They are taken by decreasing score per byte (ties: higher score, lower layer, lower expert id)
 * while they fit; one that does not fit is skipped and smaller ones are still tried. A budget
 * that cannot hold one expert of every eligible layer is refused: the caller runs without a
 * cache and says why. The plan keeps per layer the chosen experts, their bytes and the expected
 * hit rate (the chosen experts' share of the layer's observed selections), and overall.
 * Whole layers where they pay: the same budget may instead make some RAM layers whole (every
 * expert, so the GPU runs the layer alone), when an expected-time model says that is cheaper
 * than spreading (hot_plan.c: choose_whole; with uniform routing it is). The
 * auto budget (--moe-hot-cache-max-mib -1) is what the placement leaves of the VRAM budget
 * minus the reserve (hot_plan_auto_budget). Pure C.
 *
 *   hot_plan p;
 *   hot_plan_make(model, learn, &cfg, eligible, budget_bytes, &p, &err);
 *   ... p.hot[l * p.n_expert + e], p.n_hot[l], p.hit_rate[l] ...
 *   hot_plan_free(&p);
 */
#ifndef HM_MOE_HOT_PLAN_H
#define HM_MOE_HOT_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"
#include "moe/hot_weight.h"
#include "moe/learn_file.h"

typedef struct {
    int n_layer, n_expert;
    hot_weight_cfg cfg;
    hot_weight_info info;
    uint64_t budget_bytes, used_bytes;
    uint64_t *expert_bytes;  /* [n_layer] one expert of the layer (0: not eligible) */
    uint8_t *hot;            /* [n_layer][n_expert] 1: gets a VRAM slot */
    int *n_hot;              /* [n_layer] */
    double *hit_rate;        /* [n_layer] chosen share of the layer's observed selections */
    double *layer_w;         /* [n_layer] the weighting's w_l^curve */
    double *score;           /* [n_layer][n_expert] */
    int n_eligible;          /* eligible layers */
    int n_whole;             /* eligible layers given every expert (GPU layers, no CPU side) */
    double cost_s, cost_spread_s; /* expected CPU-side s/token: the plan, no whole layer */
    uint64_t hits_total, hits_hot; /* observed selections of the eligible layers, chosen ones */
} hot_plan;

/* Plans for model m from learn file l: eligible[l] (NULL: every MoE layer) marks the layers
 * whose experts live in RAM. HM_ERR_FORMAT when the file is for another model (layer or
 * expert counts differ); HM_ERR_RANGE when the budget cannot hold one expert of every eligible
 * layer (the message names both); HM_ERR_ARG for a bad weighting config; HM_ERR_NOMEM. */
hm_status hot_plan_make(const hm_model *m, const moe_learn *l, const hot_weight_cfg *cfg,
                        const bool *eligible, uint64_t budget_bytes, hot_plan *out,
                        hm_error *err);
void hot_plan_free(hot_plan *p);

/* --moe-hot-cache-max-mib -1: the VRAM budget minus what the placement needs there (weights, KV,
 * buffers) minus the reserve, or 0 when nothing is left. */
uint64_t hot_plan_auto_budget(uint64_t vram_budget, uint64_t placement_bytes,
                              uint64_t reserve_bytes);

/* The plan as text (`hotmoe plan`): a header (weighting, curve, budget, used, expected hit rate)
 * and one line per eligible layer (experts chosen, bytes, expected hit rate, layer weight, the
 * chosen ids as ranges). malloc'd; NULL when out of memory. */
char *hot_plan_format(const hot_plan *p);

#endif
