/* engine.h - what the inference commands (chat, bench, perplexity) share: opening a model, its
 * vocabulary, a context (placed by -ngl, --cpu-moe, --n-cpu-moe, -ot, --vram-budget) and a generator (runtime/generate.h: sampler +
 * decode loop) from the common flags, and feeding a token list through hm_decode in pieces of
 * at most n_batch tokens.
 *
 * DESIGN: CLI-only glue; errors are printed here as one line "hotmoe CMD: ..." so the commands
 * stay short. Nothing here is needed by the library.
 */
#ifndef HM_CLI_ENGINE_H
#define HM_CLI_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "cli/args.h"
#include "runtime/generate.h"
#include "runtime/context.h"
#include "sample/sample.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *cmd;
    hm_model *model;
    tok_vocab *vocab;   /* NULL when not asked for */
    hm_context *ctx;
    hm_gen *gen;        /* NULL when not asked for (CLI_ENGINE_SAMPLER) */
    sample_params sp;   /* the sampling flags (seed resolved) */
    int n_vocab;
    int n_batch;
    int n_threads;
    uint64_t seed;      /* the seed used (random when -s was not given) */
    const char *perf_out; /* --moe-layer-perf-out: written by cli_engine_close */
} cli_engine;

/* CLI_ENGINE_SAMPLER: a generator with the sampling flags; CLI_ENGINE_AUDIT: it records token
 * arrival times (--audit); CLI_ENGINE_HOST_LOOP: on a GPU context, the host loop (hm_decode +
 * host sampler per token) instead of the autonomous graph. */
enum {
    CLI_ENGINE_VOCAB = 1u << 0,
    CLI_ENGINE_SAMPLER = 1u << 1,
    CLI_ENGINE_AUDIT = 1u << 2,
    CLI_ENGINE_HOST_LOOP = 1u << 3,
};

/* Loads the model named by -m (required) and creates a context with the placement flags
 * (n_ctx_default > 0 replaces -c when -c was not given). Prints the error and returns 2 for a
 * bad placement value the context refused (-ot, -mg: a usage error), 1 on any other failure,
 * 0 on success. */
int cli_engine_open(cli_engine *e, const char *cmd, const cli_common_args *a, unsigned what,
                    int n_ctx_default);
void cli_engine_close(cli_engine *e);

/* Decodes ids at the current end of the cache, in pieces of at most n_batch. logits_last
 * [n_vocab] gets the last token's logits (may be NULL); logits_all [n][n_vocab] every
 * position's (may be NULL). Returns the status (error in err). */
hm_status cli_engine_eval(cli_engine *e, const int32_t *ids, int n, float *logits_last,
                          float *logits_all, hm_error *err);

/* "CUDA" when the context runs on the GPU, else "CPU" (bench's backend column). */
const char *cli_engine_backend(const cli_engine *e);

/* Prints the generator's audit (seed 004 section 15) as one line on stderr:
 * "audit: backend ..., N tokens, host syncs/token X, graph nodes/token N (K kernels), tg mean
 * M ms, cv C". */
void cli_engine_print_audit(const cli_engine *e, const hm_gen *g);
/* One line of a tiered context's CPU-side counters (runtime/tiered.h) on stderr; nothing for
 * any other context. */
void cli_engine_print_tiered(const cli_engine *e);

/* Seconds from a monotonic clock. */
double cli_now(void);

/* Reads a whole file into a malloc'd NUL-terminated buffer; prints the error, NULL on failure. */
char *cli_read_file(const char *cmd, const char *path, size_t *len);

#endif
