/* tracer.h - expert usage tracer (seed 000, "Task 0"): per-layer per-expert activation counts,
 * calls and tokens per layer, optional MoE time per layer, optional expert tensor-name logging,
 * a summary sorted by use, and JSON (the learn-file schema, docs/LEARN.md) and CSV export.
 *
 * DESIGN: the model's forward pass holds a `moe_tracer *` that is NULL when tracing is off, so
 * the only cost then is one pointer test per MoE layer call. When on, moe_tracer_record adds the
 * routing result of one layer call ([n_tok][n_used] expert ids) to counters that are C11 atomics
 * (relaxed increments; [n_layer][n_expert] of them), so any number of threads may record at once
 * without a lock and no thread ever waits; readers (summary, export) see the counts of every
 * record call that returned before they started. Name logging (a debugging aid, slow by nature)
 * takes a mutex so the lines of one call stay together. The tracer never changes what the model
 * computes: outputs are bit-identical with and without it.
 *
 * Configuration (seed 000 names; a command-line flag overrides its environment variable):
 *   --expert-trace-stats        LLAMA_EXPERT_TRACE_STATS=0|1      count activations
 *   --expert-trace-names        LLAMA_EXPERT_TRACE_NAMES=0|1      log expert tensor names
 *   --expert-trace-per-layer    LLAMA_EXPERT_TRACE_PER_LAYER=0|1  per-layer breakdown in the
 *                                                                 printed summary
 *   --expert-trace-output FILE  LLAMA_EXPERT_TRACE_OUTPUT=FILE    write the statistics at the end
 *                                 (CSV if FILE ends in ".csv", else JSON); implies counting.
 * Counting is always per layer internally (the learn file needs it); --expert-trace-per-layer
 * only adds the per-layer tables to the printed summary.
 *
 * Usage in a CLI command:
 *   moe_tracer_config tc; moe_tracer_config_init(&tc);
 *   if (moe_tracer_config_from_env(&tc, &err) != HM_OK) ...;
 *   for (i = 1; i < argc; i++) { int n = moe_tracer_config_parse_arg(&tc, argc, argv, i, &err);
 *       if (n < 0) usage error; if (n > 0) { i += n - 1; continue; } ... other flags ... }
 *   moe_tracer *tr = NULL;
 *   if (moe_tracer_config_enabled(&tc)) moe_tracer_init(&tr, &tc, n_layer, n_expert, n_used, &err);
 *   ... forward passes call moe_tracer_record(tr, layer, ids, n_tok, n_used) ...
 *   moe_tracer_finish(tr, &err);  // summary (to the log) + output file, as configured
 *   moe_tracer_free(tr);
 */
#ifndef HM_MOE_TRACER_H
#define HM_MOE_TRACER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/json.h"
#include "base/status.h"

typedef struct {
    bool stats;         /* count activations */
    bool names;         /* log expert tensor names as experts are used */
    bool per_layer;     /* per-layer tables in the printed summary */
    const char *output; /* statistics file written by moe_tracer_finish, or NULL. Borrowed:
                         * points into argv or the environment, which outlive the tracer. */
} moe_tracer_config;

/* All off. */
void moe_tracer_config_init(moe_tracer_config *c);

/* Reads LLAMA_EXPERT_TRACE_{STATS,NAMES,PER_LAYER,OUTPUT}. The three switches accept "0" or "1"
 * (unset or empty = leave as is); anything else fails with HM_ERR_ARG naming the variable. */
hm_status moe_tracer_config_from_env(moe_tracer_config *c, hm_error *err);

/* If argv[i] is one of the --expert-trace-* flags, applies it and returns how many argv entries
 * it used (1, or 2 for --expert-trace-output FILE; "--expert-trace-output=FILE" is 1). Returns 0
 * if argv[i] is not a tracer flag, -1 (err set, HM_ERR_ARG) if it is one but malformed. */
int moe_tracer_config_parse_arg(moe_tracer_config *c, int argc, char **argv, int i,
                                hm_error *err);

/* Applies every --expert-trace-* flag of argv[1..*argc) and removes it from argv (in place,
 * order kept, argv[*argc] stays NULL), leaving the other arguments for the command's own parser.
 * HM_ERR_ARG (err names the flag) on a malformed tracer flag. */
hm_status moe_tracer_config_extract(moe_tracer_config *c, int *argc, char **argv, hm_error *err);

/* True if anything is switched on (then a tracer should be created). */
bool moe_tracer_config_enabled(const moe_tracer_config *c);

/* True if the configuration counts activations (stats, per_layer or an output file). */
bool moe_tracer_config_counts(const moe_tracer_config *c);

/* Help lines for the four flags, for a command's usage text (ends in '\n'). */
const char *moe_tracer_flags_help(void);

typedef struct moe_tracer moe_tracer;

/* Creates a tracer for n_layer layers of n_expert experts, n_used selected per token. Layers
 * without experts (dense layers) are simply never recorded. */
hm_status moe_tracer_init(moe_tracer **out, const moe_tracer_config *c, int n_layer, int n_expert,
                          int n_used, hm_error *err);
void moe_tracer_free(moe_tracer *t); /* NULL is fine */

/* Optional: names that name logging prints for layer `layer`'s expert tensors (e.g.
 * "blk.3.ffn_gate_exps.weight"; up to 4, copied). Default: blk.L.ffn_{gate,up,down}_exps.weight.
 * Logged lines read "[EXPERT-TRACE] Layer L, Expert E (T tokens): NAME[E]". */
hm_status moe_tracer_set_tensor_names(moe_tracer *t, int layer, const char *const *names,
                                      int n_names, hm_error *err);

/* Where name logging and moe_tracer_finish's summary go (default stderr). */
void moe_tracer_set_log(moe_tracer *t, FILE *f);

/* Optional model description written into the JSON ("model" object); strings are copied. */
hm_status moe_tracer_set_model_info(moe_tracer *t, const char *arch, const char *name,
                                    const char *file, hm_error *err);

/* Records one call of layer `layer`'s MoE block on n_tok tokens: ids is [n_tok][n_used]
 * (row stride n_used); an id < 0 is a skipped slot. Adds 1 to the layer's calls, n_tok to its
 * tokens and 1 to each (layer, id) hit. Thread-safe; t == NULL does nothing. Ids outside
 * [0, n_expert) and layers outside [0, n_layer) are counted in `rejected` instead (never a
 * crash, never a write out of bounds). */
void moe_tracer_record(moe_tracer *t, int layer, const int32_t *ids, int64_t n_tok, int n_used);

/* Adds counts accumulated elsewhere (a GPU engine's device counters): calls and tokens of the
 * layer and hits [n_expert] of each expert, as if the record calls behind them had been made;
 * with name logging, one line per used expert (the tokens of the whole span, not of one call).
 * A layer out of range counts every hit as rejected. Thread-safe; t == NULL does nothing. */
void moe_tracer_add_counts(moe_tracer *t, int layer, uint64_t calls, uint64_t tokens,
                           const uint64_t *hits);
/* Adds the wall time of one MoE block call of `layer`, in nanoseconds (optional; goes to the
 * learn file's moe_time_us). Thread-safe; t == NULL does nothing. */
void moe_tracer_add_time_ns(moe_tracer *t, int layer, uint64_t ns);

/* Counts one processed prompt or request (the learn file's "prompts"). t == NULL: nothing. */
void moe_tracer_add_prompt(moe_tracer *t);

/* Zeroes every counter (not the configuration or names). Not concurrent with record. */
void moe_tracer_reset(moe_tracer *t);

/* Readers. Out-of-range arguments give 0. */
int moe_tracer_n_layer(const moe_tracer *t);
int moe_tracer_n_expert(const moe_tracer *t);
uint64_t moe_tracer_hits(const moe_tracer *t, int layer, int expert);
uint64_t moe_tracer_expert_total(const moe_tracer *t, int expert); /* summed over layers */
uint64_t moe_tracer_calls(const moe_tracer *t, int layer);
uint64_t moe_tracer_tokens(const moe_tracer *t, int layer);
uint64_t moe_tracer_total_tokens(const moe_tracer *t); /* max over layers of tokens */
uint64_t moe_tracer_rejected(const moe_tracer *t);
uint64_t moe_tracer_time_ns(const moe_tracer *t, int layer);
uint64_t moe_tracer_prompts(const moe_tracer *t);

/* Writes the summary (seed 000's "=== Expert Usage Statistics ===": experts sorted by total use,
 * descending, ties by lower id; with per_layer also each layer's experts sorted the same way). */
void moe_tracer_print_summary(const moe_tracer *t, FILE *f);

/* Writes the statistics as one JSON object in the learn-file schema (docs/LEARN.md) into j,
 * with seed 000's keys beside it: expert_activations ({"<id>": hits} of experts with hits) and,
 * when per_layer is on, per_layer ({"<layer>": {"<id>": hits}} of layers with calls). */
void moe_tracer_write_json(const moe_tracer *t, hm_json *j);

/* CSV: header "layer,expert,hits,calls,tokens", then one row for every (layer, expert) pair of
 * each layer with calls > 0; layers ascending, experts ascending within a layer. */
hm_status moe_tracer_write_csv(const moe_tracer *t, FILE *f, hm_error *err);

/* Saves to path: CSV if it ends in ".csv" (case-insensitive), else JSON. */
hm_status moe_tracer_save(const moe_tracer *t, const char *path, hm_error *err);

/* End of run: prints the summary to the log if stats or per_layer is on, saves the output file
 * if one is configured (and says so on the log). t == NULL: nothing, HM_OK. */
hm_status moe_tracer_finish(moe_tracer *t, hm_error *err);

/* Parses an expert tensor name: llama.cpp's per-expert form "blk.L.ffn_{gate,up,down}_exps.E.weight"
 * (expert E) or GGUF's stacked "blk.L.ffn_{gate,up,down,gate_up}_exps.weight" (*expert = -1).
 * *proj gets "gate", "up", "down" or "gate_up" (static strings). False if not an expert tensor. */
bool moe_tracer_parse_tensor_name(const char *name, int *layer, int *expert, const char **proj);

#endif
