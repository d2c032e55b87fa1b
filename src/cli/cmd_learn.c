/* cmd_learn.c - `hotmoe learn -m MODEL -f PROMPTS -o learn.json`: runs every line of PROMPTS
 * (or the documents of a corpus) through the model with the expert usage tracer attached and
 * writes the learn file (per-layer calls and per-expert hits; schema in docs/LEARN.md) that the
 * hot-cache planner reads, and/or a routing profile (--routing-profile FILE: skew, temporal
 * locality and LRU hit rates per layer; docs/ROUTING.md).
 *
 * DESIGN: the input is a list of sequences, each run from an empty KV cache (so sequences do
 * not see each other), then optionally continued greedily for -n tokens (decode steps route
 * too, and a learn run should see both kinds). With -f each non-empty line is one sequence,
 * tokenised with the vocabulary's BOS rule and its special tokens parsed; a line longer than
 * the context is cut to fit, with a note. With --corpus FILE the text is documents separated by
 * lines "<|endoftext|>" (the training corpus format, docs/TRAINED_MODEL.md); each document is
 * tokenised as plain text and cut into windows of the context size minus -n, each window a
 * sequence of its own. --max-tokens N stops after N input tokens (the last sequence cut).
 * The tracer flags (--expert-trace-*, LLAMA_EXPERT_TRACE_*) work here as in `run`;
 * -o always wins over --expert-trace-output.
 *
 * The routing profile needs every token's expert ids in token order, which the routing
 * observer gives per call on the CPU path; the GPU path only counts hits per expert on the
 * device, so --routing-profile refuses to run there. One observer feeds both the tracer and
 * the routing statistics; each sequence starts a new one for the statistics' history.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine.h"
#include "gguf/gguf.h"
#include "moe/routing_stats.h"
#include "moe/tracer.h"

#define CMD "learn"
#define DOC_SEPARATOR "<|endoftext|>"

typedef struct {
    cli_engine *e;
    hm_gen *gen;
    moe_tracer *tr;
    moe_routing_stats *rs; /* NULL without --routing-profile */
    int n_gen;
    long long budget;      /* input tokens still allowed (--max-tokens), < 0: no limit */
    long long n_tok;       /* tokens run: input and generated */
    unsigned long long syncs;
    int n_seq;
} learn_run;

/* The observer when the routing statistics are on: both consumers see every routing result. */
static void learn_route(void *user, int layer, int64_t n_tok, int n_used, const int32_t *ids,
                        const float *weights) {
    learn_run *r = user;
    moe_tracer_record(r->tr, layer, ids, n_tok, n_used);
    moe_routing_stats_record(r->rs, layer, n_tok, n_used, ids, weights);
}

static void learn_counts(void *user, int layer, uint64_t calls, uint64_t tokens,
                         const uint64_t *hits) {
    learn_run *r = user;
    moe_tracer_add_counts(r->tr, layer, calls, tokens, hits);
}

/* Tokens of the next sequence after --max-tokens: n, or fewer; 0 when the budget is spent. */
static int take(learn_run *r, int n) {
    if (r->budget < 0) return n;
    if (n > r->budget) n = (int)r->budget;
    r->budget -= n;
    return n;
}

/* One sequence from an empty cache, then up to n_gen greedy tokens through the generator (on a
 * GPU context its autonomous loop: no host synchronisation per token; the routing is counted on
 * the device and reported when the generation ends). `what` names it in messages. */
static int learn_seq(learn_run *r, const int32_t *ids, int n, const char *what) {
    hm_error err = {0};
    cli_engine *e = r->e;
    hm_context_reset(e->ctx);
    moe_routing_stats_begin_sequence(r->rs);
    if (hm_gen_reset_sampler(r->gen, &err) != HM_OK ||
        hm_gen_prompt(r->gen, ids, n, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s: %s\n", what, err.msg);
        return 1;
    }
    r->n_tok += n;
    for (int s = 0; s < r->n_gen && hm_gen_room(r->gen) > 0; s++) {
        int32_t tok;
        if (hm_gen_next(r->gen, &tok, &err) != HM_OK) {
            fprintf(stderr, "hotmoe " CMD ": %s, generated token %d: %s\n", what, s, err.msg);
            return 1;
        }
        r->n_tok++;
        if (tok_is_eog(e->vocab, tok)) break;
    }
    if (hm_gen_end(r->gen, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s: %s\n", what, err.msg);
        return 1;
    }
    hm_gen_audit au;
    hm_gen_audit_get(r->gen, &au);
    r->syncs += au.host_syncs; /* between the generation's first and last token */
    moe_tracer_add_prompt(r->tr);
    r->n_seq++;
    return 0;
}

/* Room for input tokens in one sequence: the context minus the generated tokens, at least 1. */
static int seq_room(const learn_run *r) {
    int room = hm_context_n_ctx(r->e->ctx) - r->n_gen;
    return room < 1 ? 1 : room;
}

/* -f: each non-empty line is one sequence. */
static int learn_lines(learn_run *r, const char *path, char *text, size_t len) {
    hm_error err = {0};
    tok_ids ids = {0};
    int line = 0, rc = 0;
    const int room = seq_room(r);
    for (char *p = text; p < text + len && r->budget != 0;) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p));
        char *end = nl ? nl : text + len;
        const char *ls = p; /* the line is [ls, ls + n) */
        p = end + 1;
        line++;
        size_t n = (size_t)(end - ls);
        if (n && ls[n - 1] == '\r') n--;
        int blank = 1;
        for (size_t i = 0; i < n; i++)
            if (ls[i] != ' ' && ls[i] != '\t') blank = 0;
        if (blank) continue;
        ids.n = 0;
        if (tok_encode(r->e->vocab, ls, n, TOK_ENCODE_ADD_SPECIAL | TOK_ENCODE_PARSE_SPECIAL, &ids,
                       &err) != HM_OK) {
            fprintf(stderr, "hotmoe " CMD ": %s line %d: %s\n", path, line, err.msg);
            rc = 1;
            break;
        }
        if (!ids.n) continue;
        int k = (int)ids.n;
        if (k > room) {
            fprintf(stderr, "hotmoe " CMD ": note: line %d has %d tokens, cut to %d (context %d, "
                            "-n %d)\n", line, k, room, hm_context_n_ctx(r->e->ctx), r->n_gen);
            k = room;
        }
        k = take(r, k);
        char what[32];
        snprintf(what, sizeof(what), "line %d", line);
        if (k && (rc = learn_seq(r, ids.ids, k, what)) != 0) break;
    }
    tok_ids_free(&ids);
    return rc;
}

/* --corpus: documents separated by lines "<|endoftext|>", each cut into windows. */
static int learn_corpus(learn_run *r, const char *path, const char *text, size_t len) {
    hm_error err = {0};
    tok_ids ids = {0};
    int doc = 0, rc = 0;
    const int room = seq_room(r);
    const char *d0 = text; /* start of the current document */
    for (const char *p = text; p <= text + len && r->budget != 0 && !rc;) {
        const char *nl = p < text + len ? memchr(p, '\n', (size_t)(text + len - p)) : NULL;
        const char *end = nl ? nl : text + len;
        const char *e = end;
        while (e > p && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) e--;
        const bool sep = (size_t)(e - p) == strlen(DOC_SEPARATOR) &&
                         !memcmp(p, DOC_SEPARATOR, strlen(DOC_SEPARATOR));
        const bool last = end == text + len;
        if (sep || last) {
            const char *d1 = sep ? p : text + len; /* the document is [d0, d1) */
            bool blank = true;
            for (const char *q = d0; q < d1 && blank; q++)
                blank = *q == ' ' || *q == '\t' || *q == '\n' || *q == '\r';
            if (!blank) {
                doc++;
                ids.n = 0;
                if (tok_encode(r->e->vocab, d0, (size_t)(d1 - d0),
                               TOK_ENCODE_ADD_SPECIAL | TOK_ENCODE_REPLACE_INVALID, &ids,
                               &err) != HM_OK) {
                    fprintf(stderr, "hotmoe " CMD ": %s document %d: %s\n", path, doc, err.msg);
                    rc = 1;
                    break;
                }
                for (size_t off = 0, w = 1; off < ids.n && r->budget != 0 && !rc; w++) {
                    int k = ids.n - off < (size_t)room ? (int)(ids.n - off) : room;
                    const int32_t *start = ids.ids + off;
                    off += k;
                    k = take(r, k);
                    char what[64];
                    snprintf(what, sizeof(what), "document %d, window %zu", doc, w);
                    if (k) rc = learn_seq(r, start, k, what);
                }
            }
            d0 = last ? text + len : end + 1;
        }
        if (last) break;
        p = end + 1;
    }
    tok_ids_free(&ids);
    return rc;
}

/* general.name of the model's GGUF, malloc'd, or NULL. */
static char *model_name(const hm_model *m) {
    const gguf_ctx *g = hm_model_gguf(m);
    gguf_str s;
    if (!g || gguf_get_str(g, "general.name", &s, NULL) != HM_OK || s.len > 4096) return NULL;
    char *c = malloc((size_t)s.len + 1);
    if (c) {
        memcpy(c, s.data, (size_t)s.len);
        c[s.len] = 0;
    }
    return c;
}

/* Computes, writes and prints the routing profile. */
static int write_profile(learn_run *r, const cli_common_args *a, const char *input,
                         const char *corpus, const char *source, long long max_tokens,
                         const char *path) {
    hm_error err = {0};
    char desc[1024];
    if (!source) {
        snprintf(desc, sizeof(desc), "measured by hotmoe learn: %s %s, %s of at most %d tokens "
                 "(-c %d, -n %d)%s", corpus ? "--corpus" : "-f", input,
                 corpus ? "windows" : "lines", seq_room(r), hm_context_n_ctx(r->e->ctx), r->n_gen,
                 max_tokens > 0 ? ", --max-tokens" : "");
        if (max_tokens > 0)
            snprintf(desc + strlen(desc), sizeof(desc) - strlen(desc), " %lld", max_tokens);
        source = desc;
    }
    moe_routing_profile p;
    char *name = model_name(r->e->model);
    hm_status st = moe_routing_stats_profile(r->rs, source, &p, &err);
    if (st == HM_OK)
        st = moe_routing_profile_set_model(&p, hm_model_arch(r->e->model)->name, name, a->model,
                                           &err);
    if (st == HM_OK) st = moe_routing_profile_save(&p, path, &err);
    free(name);
    if (st != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        moe_routing_profile_free(&p);
        return 1;
    }
    moe_routing_profile_print(&p, stderr);
    moe_routing_profile_free(&p);
    return 0;
}

int cmd_learn(int argc, char **argv) {
    const char *out = NULL, *profile = NULL, *corpus = NULL, *source = NULL;
    int n_gen = 0, max_tokens = 0;
    const cli_arg_spec extra[] = {
        {"-o", "--output", CLI_ARG_STR, &out, "FILE", "learn file to write (JSON, docs/LEARN.md)"},
        {"-n", "--n-predict", CLI_ARG_INT, &n_gen, "N",
         "greedy tokens generated after each prompt (default 0: prompts only)"},
        {"--routing-profile", NULL, CLI_ARG_STR, &profile, "FILE",
         "routing profile to write (JSON, docs/ROUTING.md): skew, temporal locality and LRU "
         "hit rates per layer; CPU path only"},
        {"--corpus", NULL, CLI_ARG_STR, &corpus, "FILE",
         "input instead of -f: documents separated by lines \"" DOC_SEPARATOR "\", each cut "
         "into windows of the context size (-c) minus -n, each window from an empty cache"},
        {"--max-tokens", NULL, CLI_ARG_INT, &max_tokens, "N",
         "stop after N input tokens (default 0: all)"},
        {"--profile-source", NULL, CLI_ARG_STR, &source, "TEXT",
         "the routing profile's \"source\" (default: the input and the flags)"},
    };
    const cli_args_def def = {
        CMD, "-m MODEL (-f PROMPTS | --corpus FILE) (-o FILE | --routing-profile FILE) [options]",
        "Runs each non-empty line of PROMPTS (or each window of each document of a corpus) "
        "through the model (fresh context each) with the expert usage tracer attached and "
        "writes the per-layer, per-expert counts as a learn file, and/or the routing "
        "statistics as a routing profile. Tracer flags: --expert-trace-stats (summary on "
        "stderr), --expert-trace-per-layer, --expert-trace-names (or LLAMA_EXPERT_TRACE_*).",
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
    if (!a.model || (!a.file && !corpus) || (!out && !profile)) {
        fprintf(stderr, "hotmoe " CMD ": %s is required%s (usage: hotmoe " CMD
                        " -m MODEL -f PROMPTS -o FILE)\n",
                !a.model ? "-m MODEL" : (!a.file && !corpus) ? "-f PROMPTS" : "-o FILE",
                !a.model ? "" : (!a.file && !corpus) ? " (or --corpus FILE)"
                                                     : " (or --routing-profile FILE)");
        return 2;
    }
    if (a.file && corpus) {
        fprintf(stderr, "hotmoe " CMD ": -f and --corpus are two kinds of input: give one\n");
        return 2;
    }
    if (n_gen < 0) {
        fprintf(stderr, "hotmoe " CMD ": -n must be >= 0, not %d\n", n_gen);
        return 2;
    }
    if (max_tokens < 0) {
        fprintf(stderr, "hotmoe " CMD ": --max-tokens must be >= 0, not %d\n", max_tokens);
        return 2;
    }
    if (out) tc.output = out;
    const char *input = corpus ? corpus : a.file;
    size_t len = 0;
    char *text = cli_read_file(CMD, input, &len);
    if (!text) return 1;
    cli_engine e;
    rc = cli_engine_open(&e, CMD, &a, CLI_ENGINE_VOCAB, 0);
    if (rc) {
        free(text);
        return rc;
    }
    int ret = 1;
    learn_run r = {.e = &e, .n_gen = n_gen, .budget = max_tokens > 0 ? max_tokens : -1};
    const hm_hparams *hp = hm_model_hparams(e.model);
    sample_params sp = sample_params_default();
    sp.temperature = 0.0f; /* greedy */
    hm_gen_params gp = hm_gen_default_params();
    gp.n_max = n_gen;
    if (profile && hm_context_gpu(e.ctx)) { /* the GPU engine reports counts only */
        fprintf(stderr, "hotmoe " CMD ": --routing-profile needs every token's expert ids on the "
                        "host (the CPU path); on the GPU the routing is only counted per expert: "
                        "run it without -ngl\n");
        goto done;
    }
    if (hm_gen_init(e.ctx, &sp, &gp, &r.gen, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    if (moe_tracer_init(&r.tr, &tc, (int)hp->n_layer, (int)hp->n_expert, (int)hp->n_expert_used,
                        &err) != HM_OK ||
        moe_tracer_set_model_info(r.tr, hm_model_arch(e.model)->name, NULL, a.model, &err) !=
            HM_OK ||
        (profile && moe_routing_stats_init(&r.rs, (int)hp->n_layer, (int)hp->n_expert,
                                           (int)hp->n_expert_used, &err) != HM_OK)) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    const moe_observer obs = {.route = learn_route, .counts = learn_counts, .user = &r};
    if ((r.rs ? hm_context_set_observer(e.ctx, &obs, &err)
              : hm_context_set_tracer(e.ctx, r.tr, &err)) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    double t0 = cli_now();
    if (corpus ? learn_corpus(&r, input, text, len) : learn_lines(&r, input, text, len)) goto done;
    if (!r.n_seq) {
        fprintf(stderr, "hotmoe " CMD ": %s has no %s\n", input,
                corpus ? "documents (only blank text and separators)"
                       : "prompts (no non-empty line)");
        goto done;
    }
    if (hm_context_set_observer(e.ctx, NULL, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    if (moe_tracer_finish(r.tr, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    if (profile && write_profile(&r, &a, input, corpus, source, max_tokens, profile)) goto done;
    fprintf(stderr, "hotmoe " CMD ": %s, host syncs between generated tokens: %llu\n",
            cli_engine_backend(&e), r.syncs);
    fprintf(stderr, "hotmoe " CMD ": %d %s, %lld tokens, %.2f s -> %s%s%s\n", r.n_seq,
            corpus ? "windows" : "prompts", r.n_tok, cli_now() - t0, out ? out : profile,
            out && profile ? ", " : "", out && profile ? profile : "");
    ret = 0;
done:
    hm_gen_free(r.gen);
    if (e.ctx) hm_context_set_observer(e.ctx, NULL, NULL);
    moe_tracer_free(r.tr);
    moe_routing_stats_free(r.rs);
    free(text);
    cli_engine_close(&e);
    return ret;
}
