/* cli_tracer.h - the expert usage tracer flags (--expert-trace-stats, --expert-trace-names,
 * --expert-trace-per-layer, --expert-trace-output FILE, or the LLAMA_EXPERT_TRACE_* variables;
 * moe/tracer.h) for every command that runs a model: run, chat, bench, perplexity, learn.
 *
 * DESIGN: CLI glue in three steps around a command's own work: take the flags out of argv
 * before the common parser sees them, attach a tracer to the opened context, finish it (summary
 * and output file) at the end. Errors are printed as "hotmoe CMD: ..." here. The tracer reads
 * the routing result on the host, so it needs the CPU path: with a model on the GPU the attach
 * step refuses with a clear message instead of failing at the first token.
 */
#ifndef HM_CLI_CLI_TRACER_H
#define HM_CLI_CLI_TRACER_H

#include "cli/engine.h"
#include "moe/tracer.h"

/* Reads LLAMA_EXPERT_TRACE_* and removes the --expert-trace-* flags from argv (argc updated).
 * Returns 0, or 2 after printing the error (bad value, unknown variable value). */
int cli_tracer_args(const char *cmd, moe_tracer_config *tc, int *argc, char **argv);

/* When tc enables tracing: creates the tracer for e's model and attaches it to e->ctx (*out;
 * NULL when tracing is off). Returns 0, or 1 after printing the error. */
int cli_tracer_attach(cli_engine *e, const moe_tracer_config *tc, const char *model_path,
                      moe_tracer **out);

/* Detaches, prints the summary / writes the file as configured, frees; tr NULL does nothing.
 * Returns 0, or 1 after printing the error. */
int cli_tracer_finish(cli_engine *e, moe_tracer *tr);

#endif
