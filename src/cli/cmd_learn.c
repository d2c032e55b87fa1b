/* cmd_learn.c - `hotmoe learn -m MODEL -f PROMPTS -o learn.json`: runs every line of PROMPTS
 * through the model with the expert usage tracer attached and writes the learn file (per-layer
 * calls and per-expert hits; schema in docs/LEARN.md) that the hot-cache planner reads.
 *
 * DESIGN: each non-empty line is one prompt, tokenised with the vocabulary's BOS rule and its
 * special tokens parsed, run from an empty KV cache (so prompts do not see each other), then
 * optionally continued greedily for -n tokens (decode steps route too, and a learn run should
 * see both kinds). A line longer than the context is cut to fit, with a note. The tracer
 * flags (--expert-trace-*, LLAMA_EXPERT_TRACE_*) work here as in `run`: --expert-trace-stats
 * prints the summary; -o always wins over --expert-trace-output.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine.h"
#include "moe/tracer.h"

#define CMD "learn"

/* One prompt from an empty cache, then up to n_gen greedy tokens through the generator (on a
 * GPU context its autonomous loop: no host synchronisation per token; the routing is counted on
 * the device and reported when the generation ends). */
static int learn_one(cli_engine *e, hm_gen *gen, tok_ids *ids, int line, int n_gen,
                     long long *n_tok, unsigned long long *syncs) {
    hm_error err = {0};
    int n_ctx = hm_context_n_ctx(e->ctx);
    int room = n_ctx - n_gen;
    if (room < 1) room = 1;
    int n = (int)ids->n;
    if (n > room) {
        fprintf(stderr, "hotmoe " CMD ": note: line %d has %d tokens, cut to %d (context %d, -n %d)\n",
                line, n, room, n_ctx, n_gen);
        n = room;
    }
    hm_context_reset(e->ctx);
    if (hm_gen_reset_sampler(gen, &err) != HM_OK || hm_gen_prompt(gen, ids->ids, n, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": line %d: %s\n", line, err.msg);
        return 1;
    }
    *n_tok += n;
    for (int s = 0; s < n_gen && hm_gen_room(gen) > 0; s++) {
        int32_t tok;
        if (hm_gen_next(gen, &tok, &err) != HM_OK) {
            fprintf(stderr, "hotmoe " CMD ": line %d, generated token %d: %s\n", line, s, err.msg);
            return 1;
        }
        (*n_tok)++;
        if (tok_is_eog(e->vocab, tok)) break;
    }
    if (hm_gen_end(gen, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": line %d: %s\n", line, err.msg);
        return 1;
    }
    hm_gen_audit a;
    hm_gen_audit_get(gen, &a);
    *syncs += a.host_syncs; /* between the generation's first and last token */
    return 0;
}

int cmd_learn(int argc, char **argv) {
    const char *out = NULL;
    int n_gen = 0;
    const cli_arg_spec extra[] = {
        {"-o", "--output", CLI_ARG_STR, &out, "FILE", "learn file to write (JSON, docs/LEARN.md)"},
        {"-n", "--n-predict", CLI_ARG_INT, &n_gen, "N",
         "greedy tokens generated after each prompt (default 0: prompts only)"},
    };
    const cli_args_def def = {
        CMD, "-m MODEL -f PROMPTS -o FILE [options]",
        "Runs each non-empty line of PROMPTS through the model (fresh context each) with the "
        "expert usage tracer attached and writes the per-layer, per-expert counts as a learn "
        "file. Tracer flags: --expert-trace-stats (summary on stderr), --expert-trace-per-layer, "
        "--expert-trace-names (or LLAMA_EXPERT_TRACE_*).",
        CLI_ARGS_MODEL | CLI_ARGS_FILE | CLI_ARGS_CONTEXT | CLI_ARGS_THREADS, extra,
        sizeof(extra) / sizeof(extra[0])};
    hm_error err = {0};
    moe_tracer_config tc;
    moe_tracer_config_init(&tc);
    if (moe_tracer_config_from_env(&tc, &err) != HM_OK ||
        moe_tracer_config_extract(&tc, &argc, argv, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        return 2;
    }
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    if (!a.model || !a.file || !out) {
        fprintf(stderr, "hotmoe " CMD ": %s is required (usage: hotmoe " CMD
                        " -m MODEL -f PROMPTS -o FILE)\n",
                !a.model ? "-m MODEL" : !a.file ? "-f PROMPTS" : "-o FILE");
        return 2;
    }
    if (n_gen < 0) {
        fprintf(stderr, "hotmoe " CMD ": -n must be >= 0, not %d\n", n_gen);
        return 2;
    }
    tc.output = out;
    size_t len = 0;
    char *text = cli_read_file(CMD, a.file, &len);
    if (!text) return 1;
    cli_engine e;
    rc = cli_engine_open(&e, CMD, &a, CLI_ENGINE_VOCAB, 0);
    if (rc) {
        free(text);
        return rc;
    }
    int ret = 1;
    moe_tracer *tr = NULL;
    tok_ids ids = {0};
    hm_gen *gen = NULL;
    const hm_hparams *hp = hm_model_hparams(e.model);
    sample_params sp = sample_params_default();
    sp.temperature = 0.0f; /* greedy */
    hm_gen_params gp = hm_gen_default_params();
    gp.n_max = n_gen;
    if (hm_gen_init(e.ctx, &sp, &gp, &gen, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    if (moe_tracer_init(&tr, &tc, (int)hp->n_layer, (int)hp->n_expert, (int)hp->n_expert_used,
                        &err) != HM_OK ||
        moe_tracer_set_model_info(tr, hm_model_arch(e.model)->name, NULL, a.model, &err) !=
            HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    if (hm_context_set_tracer(e.ctx, tr, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    long long n_tok = 0;
    unsigned long long syncs = 0;
    int n_prompts = 0, line = 0;
    double t0 = cli_now();
    for (char *p = text; p < text + len;) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p));
        char *end = nl ? nl : text + len;
        line++;
        size_t n = (size_t)(end - p);
        if (n && p[n - 1] == '\r') n--;
        int blank = 1;
        for (size_t i = 0; i < n; i++)
            if (p[i] != ' ' && p[i] != '\t') blank = 0;
        if (!blank) {
            ids.n = 0;
            if (tok_encode(e.vocab, p, n, TOK_ENCODE_ADD_SPECIAL | TOK_ENCODE_PARSE_SPECIAL, &ids,
                           &err) != HM_OK) {
                fprintf(stderr, "hotmoe " CMD ": %s line %d: %s\n", a.file, line, err.msg);
                goto done;
            }
            if (ids.n) {
                if (learn_one(&e, gen, &ids, line, n_gen, &n_tok, &syncs)) goto done;
                moe_tracer_add_prompt(tr);
                n_prompts++;
            }
        }
        p = end + 1;
    }
    if (!n_prompts) {
        fprintf(stderr, "hotmoe " CMD ": %s has no prompts (no non-empty line)\n", a.file);
        goto done;
    }
    if (hm_context_set_tracer(e.ctx, NULL, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    if (moe_tracer_finish(tr, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    fprintf(stderr, "hotmoe " CMD ": %s, host syncs between generated tokens: %llu\n",
            cli_engine_backend(&e), syncs);
    fprintf(stderr, "hotmoe " CMD ": %d prompts, %lld tokens, %.2f s -> %s\n", n_prompts, n_tok,
            cli_now() - t0, out);
    ret = 0;
done:
    hm_gen_free(gen);
    if (e.ctx) hm_context_set_tracer(e.ctx, NULL, NULL);
    moe_tracer_free(tr);
    tok_ids_free(&ids);
    free(text);
    cli_engine_close(&e);
    return ret;
}
