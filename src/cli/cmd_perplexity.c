/* cmd_perplexity.c - `hotmoe perplexity -m MODEL -f FILE [-c 512] [-b N] [--chunks N]`:
 * perplexity of a text, computed as llama.cpp's llama-perplexity computes it.
 *
 * DESIGN (llama-perplexity's method, so figures compare): the whole file is tokenised once
 * (BOS first when the vocabulary adds one); it is cut into n_chunk = n_tokens / n_ctx chunks of
 * n_ctx tokens (the rest is dropped; at least 2 * n_ctx tokens are required, as llama.cpp
 * requires). Each chunk is evaluated from an empty KV cache, in batches of at most -b tokens,
 * with its first token replaced by BOS when the vocabulary adds BOS. Only the second half of
 * each chunk is scored — the tokens at positions first+1 .. n_ctx-1 with first = n_ctx / 2,
 * each predicted from the logits of the previous position — so every scored token sees at
 * least n_ctx/2 tokens of context. -log p = -(l_tok - max - log(sum exp(l - max))) with the sum
 * in double; PPL = exp(mean); the error is llama.cpp's: sqrt(var / (N - 1)) * PPL with var =
 * mean(nll^2) - mean(nll)^2. A running "[i]ppl," line is printed per chunk, then
 * "Final estimate: PPL = X +/- Y".
 * --score-all scores every token of a chunk after its first (first = 0) and needs only n_ctx
 * tokens: with -c equal to the text's token count this is the plain causal-LM perplexity of the
 * whole text in one context, which is what the HuggingFace reference goldens hold.
 * Nothing to score is an error, never "PPL = nan" with status 0: a context that scores no token
 * (-c below 3, or below 2 with --score-all), --chunks below 1 (-1, the default, is every chunk,
 * as in llama.cpp), a text shorter than one evaluation (the error names the file and both token
 * counts), and a result that is not a finite number.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_tracer.h"
#include "cli/commands.h"
#include "cli/engine.h"

/* The smallest context that scores a token: positions first .. n_ctx - 2 are scored, first =
 * n_ctx / 2 (0 with --score-all). */
static int min_ctx(bool score_all) { return score_all ? 2 : 3; }

/* -log softmax(logits)[tok] with llama.cpp's arithmetic (float max, double sum of expf). */
static double nll_of(const float *logits, int n_vocab, int32_t tok) {
    float max = logits[0];
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += expf(logits[i] - max);
    return -((double)(logits[tok] - max) - log(sum));
}

int cmd_perplexity(int argc, char **argv) {
    int n_chunks = -1;
    bool score_all = false;
    const cli_arg_spec extra[] = {
        {"--chunks", NULL, CLI_ARG_INT, &n_chunks, "N", "evaluate at most N chunks, N >= 1 "
                                                        "(default: -1, all)"},
        {"--score-all", NULL, CLI_ARG_BOOL, &score_all, NULL,
         "score every token after a chunk's first, not only the second half (needs n_ctx "
         "tokens, not 2 n_ctx)"},
    };
    const cli_args_def def = {"perplexity", "-m MODEL -f FILE [-c N] [-b N] [options]",
                              "Perplexity of a text as llama-perplexity computes it: chunks of -c "
                              "tokens (default 512), the second half of each scored. Expert usage "
                              "tracer: --expert-trace-stats, --expert-trace-names, "
                              "--expert-trace-per-layer, --expert-trace-output FILE (or "
                              "LLAMA_EXPERT_TRACE_*).",
                              CLI_ARGS_MODEL | CLI_ARGS_FILE | CLI_ARGS_CONTEXT | CLI_ARGS_THREADS,
                              extra, sizeof(extra) / sizeof(extra[0])};
    moe_tracer_config tc;
    if (cli_tracer_args("perplexity", &tc, &argc, argv)) return 2;
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    if (!a.file) {
        fprintf(stderr, "hotmoe perplexity: no text given (-f FILE)\n");
        return 2;
    }
    if (n_chunks != -1 && n_chunks < 1) {
        fprintf(stderr, "hotmoe perplexity: --chunks must be >= 1 (or -1 for every chunk), got "
                        "%d\n",
                n_chunks);
        return 2;
    }
    if (a.n_ctx > 0 && a.n_ctx < min_ctx(score_all)) {
        fprintf(stderr, "hotmoe perplexity: -c %d scores no token: the context must be at least "
                        "%d%s\n",
                a.n_ctx, min_ctx(score_all),
                score_all ? " (--score-all scores positions 1 .. c-1)"
                          : " (the second half of each chunk is scored; --score-all: at least 2)");
        return 2;
    }
    size_t text_len = 0;
    char *text = cli_read_file("perplexity", a.file, &text_len);
    if (!text) return 1;
    cli_engine e;
    rc = cli_engine_open(&e, "perplexity", &a, CLI_ENGINE_VOCAB, 512);
    if (rc) {
        free(text);
        return rc;
    }
    int n_ctx = hm_context_n_ctx(e.ctx);
    hm_error err = {0};
    if (n_ctx < min_ctx(score_all)) { /* -c 0: the default context, which the model may cap */
        fprintf(stderr, "hotmoe perplexity: a context of %d tokens scores no token (at least %d "
                        "needed)\n",
                n_ctx, min_ctx(score_all));
        cli_engine_close(&e);
        free(text);
        return 1;
    }
    tok_ids toks = {0};
    float *logits = NULL;
    int status = 1;
    moe_tracer *tr = NULL;
    if (cli_tracer_attach(&e, &tc, a.model, &tr)) goto done;
    if (tr) moe_tracer_add_prompt(tr);
    double t0 = cli_now();
    if (tok_encode(e.vocab, text, text_len, TOK_ENCODE_ADD_SPECIAL, &toks, &err) != HM_OK) {
        fprintf(stderr, "hotmoe perplexity: %s: %s\n", a.file, err.msg);
        goto done;
    }
    fprintf(stderr, "hotmoe perplexity: tokenized %zu bytes into %zu tokens in %.2f s\n", text_len,
            toks.n, cli_now() - t0);
    size_t need = (score_all ? 1 : 2) * (size_t)n_ctx;
    if (toks.n < need) {
        fprintf(stderr,
                "hotmoe perplexity: %s has %zu tokens; at least %zu are needed to evaluate "
                "perplexity with a context of %d (%s; lower -c%s)\n",
                a.file, toks.n, need, n_ctx,
                score_all ? "--score-all: one context" : "two contexts",
                score_all ? "" : " or use --score-all");
        goto done;
    }
    int n_chunk = (int)(toks.n / (size_t)n_ctx);
    if (n_chunks >= 0 && n_chunks < n_chunk) n_chunk = n_chunks;
    const int first = score_all ? 0 : n_ctx / 2;
    const bool add_bos = tok_add_bos(e.vocab) && tok_bos(e.vocab) >= 0;
    logits = malloc(sizeof(float) * (size_t)n_ctx * (size_t)e.n_vocab);
    if (!logits) {
        fprintf(stderr, "hotmoe perplexity: out of memory for %d x %d logits\n", n_ctx, e.n_vocab);
        goto done;
    }
    fprintf(stderr, "hotmoe perplexity: %d chunks of %d tokens, batch %d, %d threads\n", n_chunk,
            n_ctx, e.n_batch, e.n_threads);
    double nll = 0, nll2 = 0;
    long count = 0;
    double t_start = cli_now();
    for (int c = 0; c < n_chunk; c++) {
        int32_t *chunk = toks.ids + (size_t)c * (size_t)n_ctx;
        int32_t saved = chunk[0];
        if (add_bos) chunk[0] = tok_bos(e.vocab);
        hm_context_reset(e.ctx);
        hm_status st = cli_engine_eval(&e, chunk, n_ctx, NULL, logits, &err);
        chunk[0] = saved;
        if (st) {
            fprintf(stderr, "hotmoe perplexity: chunk %d: %s\n", c, err.msg);
            goto done;
        }
        for (int j = first; j < n_ctx - 1; j++) {
            double v = nll_of(logits + (size_t)j * (size_t)e.n_vocab, e.n_vocab, chunk[j + 1]);
            nll += v;
            nll2 += v * v;
            count++;
        }
        if (c == 0) {
            double dt = cli_now() - t_start;
            fprintf(stderr, "hotmoe perplexity: %.2f seconds per chunk, ETA %.1f s\n", dt,
                    dt * (n_chunk - 1));
        }
        printf("[%d]%.4f,", c + 1, exp(nll / (double)count));
        fflush(stdout);
    }
    printf("\n");
    if (count == 0) { /* excluded above; never a nan estimate with status 0 */
        fprintf(stderr, "hotmoe perplexity: no token was scored\n");
        goto done;
    }
    double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
    double ppl = exp(mean);
    if (!isfinite(ppl)) {
        fprintf(stderr, "hotmoe perplexity: the perplexity is %f, not a finite number (mean "
                        "NLL %f over %ld tokens)\n",
                ppl, mean, count);
        goto done;
    }
    if (var > 0 && count > 1)
        printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, sqrt(var / (double)(count - 1)) * ppl);
    else
        printf("Final estimate: PPL = %.4f\n", ppl);
    fprintf(stderr, "hotmoe perplexity: %ld tokens scored in %.2f s\n", count, cli_now() - t_start);
    status = 0;
done:
    if (cli_tracer_finish(&e, tr)) status = 1;
    free(logits);
    tok_ids_free(&toks);
    cli_engine_close(&e);
    free(text);
    return status;
}
