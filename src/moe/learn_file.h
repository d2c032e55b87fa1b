/* learn_file.h - reads a learn file (docs/LEARN.md: the tracer's JSON, `hotmoe learn`'s output,
 * the live perf snapshots of the same schema) back into memory, checking everything the schema
 * says.
 *
 * DESIGN: jansson parses the text (duplicate keys and trailing bytes refused); this reader then
 * walks the tree once, field by field, and refuses the file at the first violation with one
 * line that names the file and the field ("learn.json: layers[3].experts[7]: must be a
 * non-negative integer, not a string"). Counts must be JSON integers (1.0 is not a count) in
 * [0, 2^63); arrays must have exactly n_expert / n_layer entries, and every allocation is made
 * after the array it holds has been measured, so a malformed file can neither crash the reader
 * nor make it allocate more than its own size warrants. The cross-field rules of docs/LEARN.md
 * are checked too (layer index order, per-layer sums, totals, hot + cold = experts). Optional
 * perf fields are type-checked; only moe_time_us and the hot/cold split are kept.
 *
 *   moe_learn l;
 *   if (moe_learn_load("learn.json", &l, &err) != HM_OK) { puts(err.msg); ... }
 *   ... l.layers[3].experts[7] ...
 *   moe_learn_free(&l);
 */
#ifndef HM_MOE_LEARN_FILE_H
#define HM_MOE_LEARN_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define MOE_LEARN_FORMAT "hotmoe-expert-usage"
#define MOE_LEARN_VERSION 1

typedef struct {
    uint64_t calls;             /* times the layer's MoE block ran (0: no information) */
    uint64_t tokens;            /* tokens through the block */
    uint64_t expert_hits_total; /* = the sum of experts[] */
    uint64_t *experts;          /* [n_expert] hits per expert id (the raw observation) */
    bool has_moe_time;          /* moe_time_us was present */
    double moe_time_us;         /* wall time of the block summed over calls (0 if absent) */
    bool has_branch_counts;     /* hot_experts and cold_experts both present */
    uint64_t *hot_experts;      /* [n_expert] when has_branch_counts, else NULL */
    uint64_t *cold_experts;     /* experts[e] = hot_experts[e] + cold_experts[e] */
} moe_learn_layer;

typedef struct {
    int n_layer, n_expert, n_expert_used;
    uint64_t prompts;         /* prompts (requests) processed */
    uint64_t total_tokens;    /* = the largest layers[l].tokens */
    uint64_t rejected;        /* routing slots out of range when recorded */
    uint64_t *experts;        /* [n_expert] hits summed over layers */
    moe_learn_layer *layers;  /* [n_layer], in layer order */
    char *arch, *name, *file; /* the optional "model" object's strings, or NULL */
} moe_learn;

/* Reads and checks the learn file at path into *out (zeroed first; on failure *out holds
 * nothing to free, though moe_learn_free is harmless). HM_ERR_IO if it cannot be read,
 * HM_ERR_FORMAT for bad JSON or any schema violation, HM_ERR_UNSUPPORTED for a newer version,
 * HM_ERR_NOMEM; err names path and field. */
hm_status moe_learn_load(const char *path, moe_learn *out, hm_error *err);

/* The same from text[0..len) in memory; origin names it in messages (e.g. the path). */
hm_status moe_learn_parse(const char *text, size_t len, const char *origin, moe_learn *out,
                          hm_error *err);

void moe_learn_free(moe_learn *l); /* frees the arrays and strings; NULL is fine */

#endif
