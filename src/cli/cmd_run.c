/* cmd_run.c - `hotmoe run -m MODEL -p PROMPT -n N [options]`: one prompt, text streamed to
 * stdout as it is generated, then prompt and generation speeds (tok/s) on stderr, like
 * llama.cpp's llama-cli/llama-simple. Stops after -n tokens (-1: until an end-of-generation
 * token or a full context). Tokens come from the generation API (runtime/generate.h): on a GPU
 * context (-ngl) from the autonomous decode graph, else decode + sample per token; --audit
 * prints what the loop cost the host (seed 004 section 15). The expert usage tracer flags (--expert-trace-*, moe/tracer.h) are
 * taken out of argv before the common parser sees the rest.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/engine.h"
#include "cli/cli_tracer.h"
#include "tokenizer/chat.h"

#define CMD "run"

static void put_text(const char *s, size_t n) {
    if (n) fwrite(s, 1, n, stdout);
    fflush(stdout);
}

/* -cnv: llama-cli's conversation mode is `hotmoe chat`, with -p as the system prompt. */
static int run_conversation(int argc, char **argv) {
    char **v = calloc((size_t)argc + 1, sizeof(*v));
    if (!v) {
        fprintf(stderr, "hotmoe " CMD ": out of memory\n");
        return 1;
    }
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-cnv") || !strcmp(argv[i], "--conversation")) continue;
        if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt")) v[n++] = "-sys";
        else if (!strncmp(argv[i], "--prompt=", 9)) {
            v[n++] = "-sys";
            v[n++] = argv[i] + 9;
        } else v[n++] = argv[i];
    }
    v[0] = "chat";
    const int rc = cmd_chat(n, v);
    free(v);
    return rc;
}

/* The prompt as the chat template's one user message with the generation prompt (malloc'd). */
static char *templated(const cli_engine *e, const char *name, const char *prompt,
                       hm_error *err) {
    chat_template t;
    if (chat_template_for_model(hm_model_gguf(e->model), name, &t, err) != HM_OK) return NULL;
    const chat_render_opts o = chat_render_opts_for(e->vocab);
    const chat_message m[] = {{"user", prompt}};
    char *out = NULL;
    hm_status st = chat_render(&t, m, 1, &o, &out, NULL, err);
    chat_template_free(&t);
    return st == HM_OK ? out : NULL;
}

int cmd_run(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-cnv") || !strcmp(argv[i], "--conversation"))
            return run_conversation(argc, argv);
    bool no_display_prompt = false, audit = false, host_loop = false, cnv = false;
    const char *tmpl_name = NULL;
    const cli_arg_spec extra[] = {
        {"-cnv", "--conversation", CLI_ARG_BOOL, &cnv, NULL,
         "conversation mode: runs `hotmoe chat` with -p as the system prompt"},
        {"--chat-template", NULL, CLI_ARG_STR, &tmpl_name, "NAME",
         "wrap the prompt as one user message in this chat template (chatml, harmony, mistral, "
         "mistral-legacy, tulu; \"model\": the model's own), with the generation prompt"},
        {"--no-display-prompt", NULL, CLI_ARG_BOOL, &no_display_prompt, NULL,
         "do not echo the prompt before the generated text"},
        {"--audit", NULL, CLI_ARG_BOOL, &audit, NULL,
         "print the decode audit: host syncs and graph nodes per token, token interval cv"},
        {"--host-loop", NULL, CLI_ARG_BOOL, &host_loop, NULL,
         "GPU: decode and sample token by token from the host instead of the autonomous graph"},
    };
    const cli_args_def def = {CMD, "-m MODEL -p PROMPT -n N [options]",
                              "Generates text from one prompt, streaming it, and reports prompt "
                              "and generation speeds. Expert usage tracer: --expert-trace-stats, "
                              "--expert-trace-names, --expert-trace-per-layer, "
                              "--expert-trace-output FILE (or LLAMA_EXPERT_TRACE_*).",
                              CLI_ARGS_ALL, extra, sizeof(extra) / sizeof(extra[0])};
    /* tracer flags out, the rest to the common parser */
    hm_error err = {0};
    moe_tracer_config tc;
    if (cli_tracer_args(CMD, &tc, &argc, argv)) return 2;
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    if (!a.prompt && !a.file) {
        fprintf(stderr, "hotmoe " CMD ": no prompt given (-p TEXT or -f FILE)\n");
        return 2;
    }
    cli_engine e;
    unsigned what = CLI_ENGINE_VOCAB | CLI_ENGINE_SAMPLER | (audit ? CLI_ENGINE_AUDIT : 0u) |
                    (host_loop ? CLI_ENGINE_HOST_LOOP : 0u);
    rc = cli_engine_open(&e, CMD, &a, what, 0);
    if (rc) return rc;
    int ret = 1;
    moe_tracer *tr = NULL;
    if (cli_tracer_attach(&e, &tc, a.model, &tr)) {
        cli_engine_close(&e);
        return 1;
    }
    if (tr) moe_tracer_add_prompt(tr);
    tok_ids ids = {0};
    tok_stream ts;
    tok_stream_init(&ts, e.vocab,
                    TOK_DECODE_REPLACE_INVALID | (a.special ? TOK_DECODE_SPECIAL : 0u));
    char *out = NULL, *wrapped = NULL; /* the generated text so far (for -r); the templated
                                          prompt */
    size_t out_n = 0, out_cap = 0;
    size_t len = 0;
    char *text = a.prompt ? NULL : cli_read_file(CMD, a.file, &len);
    if (!a.prompt && !text) goto done;
    if (a.escape) { /* llama.cpp's default: escapes in -p and -r */
        if (a.prompt) cli_args_unescape((char *)a.prompt);
        for (int i = 0; i < a.reverse_prompt.n; i++) cli_args_unescape((char *)a.reverse_prompt.v[i]);
    }
    if (a.keep >= 0)
        fprintf(stderr, "hotmoe " CMD ": --keep applies to chat's context shift; run stops at a "
                "full context\n");
    const char *prompt = a.prompt ? a.prompt : text;
    if (tmpl_name) {
        wrapped = templated(&e, strcmp(tmpl_name, "model") ? tmpl_name : NULL, prompt, &err);
        if (!wrapped) {
            fprintf(stderr, "hotmoe " CMD ": --chat-template: %s\n", err.msg);
            goto done;
        }
        prompt = wrapped;
    }
    len = strlen(prompt);
    if (tok_encode(e.vocab, prompt, len, TOK_ENCODE_ADD_SPECIAL | TOK_ENCODE_PARSE_SPECIAL, &ids,
                   &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    const int n_ctx = hm_context_n_ctx(e.ctx);
    if (ids.n == 0) {
        fprintf(stderr, "hotmoe " CMD ": the prompt has no tokens\n");
        goto done;
    }
    if ((int64_t)ids.n >= n_ctx) {
        fprintf(stderr, "hotmoe " CMD ": the prompt has %zu tokens; the context holds %d (-c)\n",
                ids.n, n_ctx);
        goto done;
    }
    if (!no_display_prompt) put_text(prompt, len);

    double t0 = cli_now();
    hm_gen_set_max(e.gen, a.n_predict);
    if (hm_gen_prompt(e.gen, ids.ids, (int)ids.n, &err) != HM_OK) {
        fprintf(stderr, "\nhotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    double t_prompt = cli_now() - t0;

    /* generation: until -n tokens, an end-of-generation token or a full context; the
     * generator is freed without hm_gen_end (nothing uses the cache afterwards) */
    int n_gen = 0, n_taken = 0; /* tokens shown; tokens taken (incl. an end token) */
    bool stop_ctx = false;
    t0 = cli_now();
    while (a.n_predict < 0 || n_gen < a.n_predict) {
        if (hm_gen_room(e.gen) == 0) {
            stop_ctx = true;
            break;
        }
        int32_t tok;
        if (hm_gen_next(e.gen, &tok, &err) != HM_OK) {
            fprintf(stderr, "\nhotmoe " CMD ": %s\n", err.msg);
            goto done;
        }
        n_taken++;
        if (tok_is_eog(e.vocab, tok) && !a.ignore_eos) break;
        const char *piece;
        size_t plen;
        if (tok_stream_push(&ts, tok, &piece, &plen, &err) != HM_OK) {
            fprintf(stderr, "\nhotmoe " CMD ": %s\n", err.msg);
            goto done;
        }
        put_text(piece, plen);
        n_gen++;
        if (a.reverse_prompt.n > 0 && plen > 0) {
            if (out_n + plen + 1 > out_cap) {
                size_t c = (out_n + plen + 1) * 2;
                char *o = realloc(out, c);
                if (!o) {
                    fprintf(stderr, "\nhotmoe " CMD ": out of memory\n");
                    goto done;
                }
                out = o, out_cap = c;
            }
            memcpy(out + out_n, piece, plen);
            out_n += plen;
            if (cli_args_ends_with(&a.reverse_prompt, out, out_n)) break;
        }
    }
    double t_gen = cli_now() - t0;
    const char *rest;
    size_t rlen;
    tok_stream_flush(&ts, &rest, &rlen);
    put_text(rest, rlen);
    fputc('\n', stdout);
    fflush(stdout);
    if (stop_ctx) fprintf(stderr, "hotmoe " CMD ": context full (%d tokens)\n", n_ctx);
    hm_gen_audit au;
    hm_gen_audit_get(e.gen, &au);
    /* the first token needs no decode: n_taken - 1 decodes in t_gen (the GPU may have run a
     * few steps ahead; those are in "steps") */
    int n_dec = n_taken > 1 ? n_taken - 1 : 0;
    fprintf(stderr, "prompt:     %5zu tokens in %8.3f s = %9.2f tok/s\n", ids.n, t_prompt,
            t_prompt > 0 ? (double)ids.n / t_prompt : 0.0);
    fprintf(stderr, "generation: %5d tokens in %8.3f s = %9.2f tok/s (%llu decode steps; %s; "
                    "threads %d)\n",
            n_gen, t_gen, t_gen > 0 && n_dec > 0 ? (double)n_dec / t_gen : 0.0,
            (unsigned long long)au.steps, au.gpu ? "GPU autonomous" : cli_engine_backend(&e),
            e.n_threads);
    if (audit) cli_engine_print_audit(&e, e.gen);
    cli_engine_print_tiered(&e);
    ret = 0;
    if (cli_tracer_finish(&e, tr)) ret = 1;
    tr = NULL;
done:
    cli_tracer_finish(&e, tr);
    free(out);
    free(wrapped);
    free(text);
    tok_stream_free(&ts);
    tok_ids_free(&ids);
    cli_engine_close(&e);
    return ret;
}
