/* routing_stats.h - routing statistics of a model on some text (skew, temporal locality, LRU
 * hit rates per layer) and the routing profile file that holds them (docs/ROUTING.md).
 *
 * DESIGN: an accumulator (moe_routing_stats) is fed every MoE layer call's routing result in
 * token order, the same [n_tok][n_used] ids (and gating weights) the routing observer sees
 * (moe_exec.h). Per layer it keeps counts only, each updated in O(1) or O(n_expert) per
 * selection, so nothing grows with the text:
 *   - hits and gating-weight mass per expert (the skew figures are computed from them at the end);
 *   - last_seen[e], the layer-local position of the last token that selected e, and the position
 *     where the current sequence began: a selection at position p "repeats at distance <= d"
 *     when last_seen[e] >= start and p - last_seen[e] <= d (the previous tokens' selections are
 *     all that is needed, and the most recent one decides);
 *   - a recency list of the experts seen (most recent first): an access's place in it is its LRU
 *     stack distance (distinct experts used since), and an LRU cache of C experts hits exactly
 *     when that distance is < C (LRU is a stack algorithm), so one list gives the hit counts of
 *     all nine cache sizes at once.
 * Layers have disjoint state, so calls for different layers may come from different threads;
 * calls for one layer must be in token order and not concurrent (the CPU engine calls its
 * observer layer by layer, in order). moe_routing_stats_begin_sequence marks a sequence start
 * (a fresh context): temporal locality never looks across it; the LRU caches do (a cache
 * outlives a request), starting empty at the first token of the run.
 *
 * moe_routing_stats_profile turns the counts into a moe_routing_profile (figures per layer and
 * averaged over layers); the profile is written as JSON through jansson (base/json.h) and read
 * back, checked field by field, by moe_routing_profile_load/parse, which also accepts partial
 * profiles (figures from elsewhere: any figure may be absent or null, which reads as NAN).
 *
 *   moe_routing_stats *rs; moe_routing_stats_init(&rs, n_layer, n_expert, n_used, &err);
 *   for each sequence: moe_routing_stats_begin_sequence(rs); ... forward passes call
 *       moe_routing_stats_record(rs, layer, n_tok, n_used, ids, weights) ...
 *   moe_routing_profile p; moe_routing_stats_profile(rs, "what was measured", &p, &err);
 *   moe_routing_profile_save(&p, "profile.json", &err); moe_routing_profile_print(&p, stderr);
 *   moe_routing_profile_free(&p); moe_routing_stats_free(rs);
 */
#ifndef HM_MOE_ROUTING_STATS_H
#define HM_MOE_ROUTING_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/json.h"
#include "base/status.h"

#define MOE_ROUTING_FORMAT "hotmoe-routing-profile"
#define MOE_ROUTING_VERSION 1

/* The points each figure is given at (their JSON keys are these numbers as decimal strings). */
enum {
    MOE_ROUTING_N_TOP = 3,  /* top 10, 25, 50 % of the experts */
    MOE_ROUTING_N_MASS = 3, /* 50, 90, 99 % of the routing mass */
    MOE_ROUTING_N_DIST = 3, /* distance 1, <= 4, <= 8 tokens */
    MOE_ROUTING_N_LRU = 9,  /* LRU caches of 10, 20, ..., 90 % of the experts */
};
extern const int moe_routing_top_pct[MOE_ROUTING_N_TOP];   /* 10, 25, 50 */
extern const int moe_routing_mass_pct[MOE_ROUTING_N_MASS]; /* 50, 90, 99 */
extern const int moe_routing_dist[MOE_ROUTING_N_DIST];     /* 1, 4, 8 */
extern const int moe_routing_lru_pct[MOE_ROUTING_N_LRU];   /* 10, 20, ..., 90 */

/* Experts that pct % of n_expert means (top-share groups, LRU capacities): ceil(pct * n / 100),
 * at least 1. */
int moe_routing_pct_experts(int pct, int n_expert);

/* The figures of one layer, or their mean over the layers that have selections. NAN = not
 * known (no data, or absent/null in a profile file). Shares and rates are fractions in [0, 1]. */
typedef struct {
    double top_share[MOE_ROUTING_N_TOP];     /* selections held by the top 10/25/50 % experts */
    double experts_for[MOE_ROUTING_N_MASS];  /* fewest experts holding 50/90/99 % of them */
    double w_top_share[MOE_ROUTING_N_TOP];   /* the same for the gating-weight mass */
    double w_experts_for[MOE_ROUTING_N_MASS];
    double repeat[MOE_ROUTING_N_DIST];       /* P(a selected expert was selected by a token at
                                              * distance 1 / <= 4 / <= 8 of the same sequence) */
    double lru_hit[MOE_ROUTING_N_LRU];       /* LRU hit rate of caches of 10..90 % of experts */
} moe_routing_figures;

void moe_routing_figures_unknown(moe_routing_figures *f); /* every entry NAN */

typedef struct {
    uint64_t tokens;      /* tokens recorded */
    uint64_t selections;  /* selected slots with an id in [0, n_expert) */
    uint64_t *hits;       /* [n_expert] selections per expert, or NULL (not in the file) */
    double *weight_mass;  /* [n_expert] gating weights summed per expert, or NULL (unknown) */
    bool has_repeat_counts;
    uint64_t repeat_hits[MOE_ROUTING_N_DIST];       /* selections that repeated within d */
    uint64_t repeat_considered[MOE_ROUTING_N_DIST]; /* selections of tokens with >= d earlier
                                                     * tokens in their sequence */
    bool has_lru_counts;
    uint64_t lru_hits[MOE_ROUTING_N_LRU];           /* LRU hits; the accesses are selections */
    moe_routing_figures f;
} moe_routing_layer;

typedef struct {
    int version;
    char *source;                  /* what was measured or where the figures come from */
    bool measured;                 /* true: measured by hotmoe; false: figures from elsewhere */
    char *arch, *name, *file;      /* the optional "model" object's strings, or NULL */
    char **notes;                  /* [n_notes] free text, or NULL */
    int n_notes;
    int n_layer, n_expert, n_expert_used;
    int64_t tokens;                /* tokens counted (the largest layer's), -1 = not given */
    int64_t sequences;             /* sequences (fresh contexts), -1 = not given */
    int64_t rejected;              /* slots with an id >= n_expert or a bad layer, -1 = not given */
    moe_routing_figures avg;       /* mean over the layers with selections */
    moe_routing_layer *layers;     /* [n_layer], or NULL when the profile has no per-layer part */
} moe_routing_profile;

/* ---- the accumulator ---- */

typedef struct moe_routing_stats moe_routing_stats;

/* n_layer in [1, 4096], n_expert in [1, 65536], n_used in [1, n_expert]. */
hm_status moe_routing_stats_init(moe_routing_stats **out, int n_layer, int n_expert, int n_used,
                                 hm_error *err);
void moe_routing_stats_free(moe_routing_stats *s); /* NULL is fine */

/* The next tokens begin a new sequence (document, window, request): temporal locality does not
 * look back across this point. Not concurrent with record. */
void moe_routing_stats_begin_sequence(moe_routing_stats *s);

/* One layer call on n_tok tokens in order: ids [n_tok][n_used] (row stride n_used; < 0: a
 * skipped slot, not counted), weights [n_tok][n_used] or NULL (then the layer's weight mass
 * becomes unknown). A layer outside [0, n_layer) or an id >= n_expert is counted as rejected
 * (the id is then skipped), never a crash. s == NULL does nothing. */
void moe_routing_stats_record(moe_routing_stats *s, int layer, int64_t n_tok, int n_used,
                              const int32_t *ids, const float *weights);

uint64_t moe_routing_stats_tokens(const moe_routing_stats *s, int layer); /* 0 if out of range */
uint64_t moe_routing_stats_rejected(const moe_routing_stats *s);

/* Computes every figure of every layer and their averages into *out (zeroed first; free with
 * moe_routing_profile_free). source is copied (NULL: ""); measured is set true. */
hm_status moe_routing_stats_profile(const moe_routing_stats *s, const char *source,
                                    moe_routing_profile *out, hm_error *err);

/* ---- the profile ---- */

/* Sets the model description (strings copied; NULL leaves a field as is). */
hm_status moe_routing_profile_set_model(moe_routing_profile *p, const char *arch,
                                        const char *name, const char *file, hm_error *err);
/* Appends a note (copied). */
hm_status moe_routing_profile_add_note(moe_routing_profile *p, const char *note, hm_error *err);

/* Writes p as one JSON object (docs/ROUTING.md) into j: unknown figures are written as null,
 * absent parts (no layers, no hits, no weights, tokens -1) are left out. */
void moe_routing_profile_write_json(const moe_routing_profile *p, hm_json *j);
/* The same into the file at path (created or truncated); errors name the path. */
hm_status moe_routing_profile_save(const moe_routing_profile *p, const char *path, hm_error *err);

/* Reads and checks a profile (docs/ROUTING.md's rules) into *out (zeroed first; on failure it
 * holds nothing to free). HM_ERR_IO if it cannot be read, HM_ERR_FORMAT for bad JSON or a
 * schema violation, HM_ERR_UNSUPPORTED for a newer version, HM_ERR_NOMEM; err names the file
 * and the field ("p.json: average.repeat.1: must be a number in [0, 1] or null, not a string"). */
hm_status moe_routing_profile_load(const char *path, moe_routing_profile *out, hm_error *err);
/* The same from text[0..len); origin names it in messages. */
hm_status moe_routing_profile_parse(const char *text, size_t len, const char *origin,
                                    moe_routing_profile *out, hm_error *err);

void moe_routing_profile_free(moe_routing_profile *p); /* NULL is fine */

/* A short table: one line per layer with selections, then the averages (percentages). */
void moe_routing_profile_print(const moe_routing_profile *p, FILE *f);

#endif
