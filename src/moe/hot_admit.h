/* hot_admit.h - the hot cache's online admission (--moe-hot-cache-policy static|lru|lfru):
 * after each decode step, misses may take a slot from a hot expert, at most K per layer per
 * step; the expert -> slot table changes only between steps.
 *
 * DESIGN: the object keeps, per (layer, expert), whether it is hot, the last step that used it
 * and a decayed use frequency. hot_admit_observe counts a layer's routing of the step (hits and
 * misses); hot_admit_step ends the step: every frequency is multiplied by `decay` and the step's
 * uses added, then per layer the step's misses are ranked (lru: uses this step, then lower id;
 * lfru: frequency, then lower id) and the first K are admitted, each in place of the victim the
 * policy picks among the hot experts the step did not use (lru: the least recently used; lfru:
 * the lowest frequency; ties: lower id) — under lfru only when the newcomer's frequency is
 * higher. `static` never admits: the plan and the updater alone change the cache. The caller
 * copies each admitted expert into its victim's slot (an asynchronous copy; the CPU computed
 * the miss this time) and switches the table before the next step. Pure C.
 * Admissions must pay: a copy costs host memory bandwidth about as much as the CPU's own read
 * of the expert, so an admission is useful when the expert is hit at least twice more while
 * hot than the expert it evicted is used meanwhile (what that slot would have served).
 * Each admission is judged when it is evicted or HOT_ADMIT_WINDOW steps later; per layer a
 * running share of useful admissions (weight 0.2 per judgement) below min_useful pauses the
 * layer's admissions, one probe admission every HOT_ADMIT_WINDOW steps keeping the share
 * current. The share starts just below min_useful: a layer begins with probes and one useful
 * probe opens it (starting open, every layer admitted once a step until its first judgement,
 * some 32 steps of copies that could not pay under uniform routing). Uniform routing thus never
 * floods; routing with temporal locality opens after one window and keeps admitting.
 */
#ifndef HM_MOE_HOT_ADMIT_H
#define HM_MOE_HOT_ADMIT_H

#include <stdint.h>

#include "base/status.h"
#include "moe/hot_update.h"

typedef enum { HOT_POLICY_STATIC = 0, HOT_POLICY_LRU, HOT_POLICY_LFRU, HOT_POLICY_COUNT } hot_policy;

#define HOT_POLICY_NAMES "static, lru, lfru"

hm_status hot_policy_parse(const char *s, hot_policy *out, hm_error *err);
const char *hot_policy_name(hot_policy p);

typedef struct {
    hot_policy policy;
    int max_per_step; /* K: admissions per layer per step (>= 1) */
    double decay;     /* lfru: frequencies x decay each step, in (0, 1] (default 0.9) */
    double min_useful; /* a layer's share of useful admissions below which it pauses, [0, 1]
                          (default 0.5; 0: never) */
} hot_admit_cfg;

#define HOT_ADMIT_WINDOW 32 /* steps after which an admission is judged; a paused layer's probe */

hot_admit_cfg hot_admit_default(void);

typedef struct hot_admit hot_admit;

/* hot [n_layer][n_expert]: the initial cache (the plan), copied. */
hm_status hot_admit_init(int n_layer, int n_expert, const uint8_t *hot, const hot_admit_cfg *c,
                         hot_admit **out, hm_error *err);
void hot_admit_free(hot_admit *a);

/* The step's routing of layer il: ids[0..n) (n = tokens x n_used; ids outside [0, n_expert)
 * are skipped). */
void hot_admit_observe(hot_admit *a, int il, const int32_t *ids, int n);
/* Ends the step: the admissions into out[0..cap) (layer, out = victim, in = newcomer), sorted
 * by layer; returns their number. The object's hot map already has them. */
int hot_admit_step(hot_admit *a, hot_exchange *out, int cap);

const uint8_t *hot_admit_map(const hot_admit *a); /* [n_layer][n_expert] */
/* An exchange decided elsewhere (the updater), or one taken back: out leaves, in enters. */
void hot_admit_apply(hot_admit *a, int il, int out, int in);
void hot_admit_counts(const hot_admit *a, uint64_t *hits, uint64_t *misses, uint64_t *admitted);
/* Admissions a paused layer left out (misses that would have been admitted). */
uint64_t hot_admit_paused(const hot_admit *a);

#endif
