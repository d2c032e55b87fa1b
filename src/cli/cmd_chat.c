/* cmd_chat.c - `hotmoe chat -m MODEL [-sys TEXT] [-n N] [--chat-template NAME] [sampling]`:
 * an interactive terminal chat. Lines typed on stdin are user turns (a line ending in '\' goes
 * on to the next line); replies stream as they are generated; Ctrl-D or /exit quits.
 *
 * DESIGN: the prompt is always the whole conversation rendered by the model's chat template
 * (tokenizer/chat.h) with the generation prompt, exactly as transformers' apply_chat_template
 * would give it, tokenised with special tokens parsed. The KV cache holds the tokens of the
 * previous turn (prompt + generated reply); each turn only the tokens after the longest common
 * prefix of the cached and the new token list are processed (hm_context_seq_rewind drops a
 * diverging tail, e.g. when the template rewrites history: Qwen3 drops <think> blocks, harmony
 * drops the analysis channel; a recurrent state goes back to the end of the previous prompt). So with templates that keep history as generated, only the new
 * user turn is processed. A reply ends at the template's end-of-turn tokens
 * (chat_stop_texts, else the vocabulary's end-of-generation set), after -n tokens, or when the
 * context is full. Tokens come from the generation API (runtime/generate.h; on a GPU context the
 * autonomous decode graph); hm_gen_end after each reply leaves exactly the prompt and the
 * tokens taken (the end-of-turn token included) in the cache, and they are what `cached`
 * lists. For harmony only the final channel is shown (and text before any channel).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"

#include "cli/cli_tracer.h"
#include "cli/commands.h"
#include "cli/engine.h"
#include "cli/line_input.h"
#include "tokenizer/chat.h"

typedef struct {
    chat_message *m;
    size_t n, cap;
} msg_list;

static bool msgs_push(msg_list *l, const char *role, const char *content, size_t len) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        chat_message *m = realloc(l->m, cap * sizeof(*m));
        if (!m) return false;
        l->m = m;
        l->cap = cap;
    }
    char *c = malloc(len + 1);
    if (!c) return false;
    memcpy(c, content, len);
    c[len] = 0;
    l->m[l->n].role = role;
    l->m[l->n].content = c;
    l->n++;
    return true;
}

static void msgs_pop(msg_list *l) {
    if (l->n) free((char *)l->m[--l->n].content);
}

/* Removes message i (the later ones move up). */
static void msgs_remove(msg_list *l, size_t i) {
    if (i >= l->n) return;
    free((char *)l->m[i].content);
    memmove(l->m + i, l->m + i + 1, sizeof(*l->m) * (l->n - i - 1));
    l->n--;
}

static void msgs_free(msg_list *l) {
    while (l->n) msgs_pop(l);
    free(l->m);
}

/* One user turn (cli/line_input.h: a terminal edits lines, with history): lines ending in '\'
 * continue. false at end of input (or a Ctrl-C at the prompt). */
static bool read_turn(char **turn, size_t *turn_len) {
    size_t n = 0;
    char *t = NULL;
    for (;;) {
        size_t k = 0;
        char *line = cli_line_read(t ? "... " : "> ", &k);
        if (!line) {
            if (!t) return false;
            break;
        }
        bool more = k && line[k - 1] == '\\';
        if (more) k--;
        char *nt = realloc(t, n + k + 2);
        if (!nt) {
            free(line);
            free(t);
            return false;
        }
        t = nt;
        memcpy(t + n, line, k);
        free(line);
        n += k;
        if (!more) break;
        t[n++] = '\n';
    }
    t[n] = 0;
    cli_line_history(t);
    *turn = t;
    *turn_len = n;
    return true;
}

typedef struct {
    cli_engine *e;
    const chat_template *tmpl;
    chat_render_opts ropts;
    int32_t stop_ids[8];
    int n_stop;
    tok_ids cached; /* tokens in the KV cache */
    bool verbose;
    bool special;                 /* -sp: special tokens' text shown */
    const cli_str_list *reverse;  /* -r: a reply stops once its text ends with one */
    int n_predict;                /* most tokens per reply (-1: no limit) */
} chat_state;

/* Ctrl-C: set by the handler, read and cleared by the reply loop (it stops the reply); at the
 * prompt it ends the session, as Ctrl-D. The one global of the CLI: a signal handler's flag. */
static volatile sig_atomic_t g_interrupt;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupt = 1;
}

static void install_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a read at the prompt returns EINTR */
    sigaction(SIGINT, &sa, NULL);
}

static bool is_stop(const chat_state *s, int32_t t) {
    if (s->n_stop == 0) return tok_is_eog(s->e->vocab, t);
    for (int i = 0; i < s->n_stop; i++)
        if (s->stop_ids[i] == t) return true;
    return false;
}

/* Renders the conversation, finds what the cache already holds, processes the rest. */
static hm_status process_prompt(chat_state *s, const msg_list *msgs, int *n_new, int *n_reused,
                                hm_error *err) {
    char *text = NULL;
    size_t len = 0;
    hm_status st = chat_render(s->tmpl, msgs->m, msgs->n, &s->ropts, &text, &len, err);
    if (st) return st;
    if (s->verbose) fprintf(stderr, "[prompt]\n%s\n[/prompt]\n", text);
    tok_ids toks = {0};
    st = chat_tokenize(s->e->vocab, text, len, &toks, err);
    free(text);
    if (st) {
        tok_ids_free(&toks);
        return st;
    }
    int n_ctx = hm_context_n_ctx(s->e->ctx);
    /* room for a reply: -n, or a quarter of the context (at most half) */
    size_t room = s->n_predict > 0 ? (size_t)s->n_predict : (size_t)n_ctx / 4;
    if (room > (size_t)n_ctx / 2) room = (size_t)n_ctx / 2;
    if (toks.n + room >= (size_t)n_ctx) {
        hm_error_set(err, HM_ERR_RANGE,
                     "the conversation (%zu tokens) and a reply (%zu) no longer fit the context "
                     "of %d tokens (raise -c)", toks.n, room, n_ctx);
        tok_ids_free(&toks);
        return HM_ERR_RANGE;
    }
    size_t keep = 0, n_past = (size_t)hm_context_n_past(s->e->ctx);
    while (keep < toks.n && keep < s->cached.n && keep < n_past &&
           toks.ids[keep] == s->cached.ids[keep])
        keep++;
    if (keep == toks.n) keep--; /* at least one token to get logits from */
    int kept = (int)keep; /* a recurrent state goes back to its checkpoint, at or before keep */
    if (keep < n_past && hm_context_seq_rewind(s->e->ctx, 0, (int)keep, &kept, NULL) != HM_OK) {
        hm_context_reset(s->e->ctx); /* sliding-window ring cannot rewind that far */
        kept = 0;
    }
    keep = (size_t)kept;
    st = hm_gen_prompt(s->e->gen, toks.ids + keep, (int)(toks.n - keep), err);
    *n_new = (int)(toks.n - keep);
    *n_reused = (int)keep;
    tok_ids_free(&s->cached);
    s->cached = toks;
    return st;
}

/* Copies text with every ill-formed UTF-8 subpart replaced by U+FFFD (as Rust's
 * from_utf8_lossy and Python's errors="replace" do for HF's decode), so that a reply the model
 * produced byte by byte can be rendered into the next prompt. */
static char *utf8_lossy(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(3 * n + 1);
    if (!d) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t need = c < 0x80 ? 0 : (c >= 0xC2 && c <= 0xDF) ? 1 : (c >= 0xE0 && c <= 0xEF) ? 2
                                                           : (c >= 0xF0 && c <= 0xF4) ? 3 : 99;
        size_t k = 1;
        if (need != 99) {
            for (; k <= need && i + k < n; k++) {
                unsigned char x = (unsigned char)s[i + k];
                unsigned char lo = 0x80, hi = 0xBF;
                if (k == 1 && c == 0xE0) lo = 0xA0;
                if (k == 1 && c == 0xED) hi = 0x9F;
                if (k == 1 && c == 0xF0) lo = 0x90;
                if (k == 1 && c == 0xF4) hi = 0x8F;
                if (x < lo || x > hi) break;
            }
        }
        if (need != 99 && k == need + 1) {
            memcpy(d + o, s + i, k);
            o += k;
        } else {
            memcpy(d + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
        i += k;
    }
    d[o] = 0;
    return d;
}

/* harmony: the text after the last "<|channel|>final<|message|>" (else after the last
 * "<|message|>", else all), without control tokens. */
static const char *harmony_final(const char *text) {
    const char *p = NULL, *q = text;
    while ((q = strstr(q, "<|channel|>final<|message|>")) != NULL) p = q += 27;
    if (p) return p;
    q = text;
    while ((q = strstr(q, "<|message|>")) != NULL) p = q += 11;
    return p ? p : text;
}

/* Generates one reply; stores its text (as the next assistant message) in *reply. */
static hm_status generate(chat_state *s, int n_predict, char **reply, int *n_gen, hm_error *err) {
    cli_engine *e = s->e;
    bool harmony = s->tmpl->family == CHAT_HARMONY;
    tok_stream ts;
    tok_stream_init(&ts, e->vocab,
                    TOK_DECODE_REPLACE_INVALID | (s->special ? TOK_DECODE_SPECIAL : 0u));
    tok_ids gen = {0};
    char *shown = NULL; /* the reply's text so far, for -r */
    size_t shown_n = 0, shown_cap = 0;
    g_interrupt = 0;
    hm_status st = HM_OK;
    int n_ctx = hm_context_n_ctx(e->ctx);
    chat_harmony hv; /* harmony: only the final channel is shown */
    chat_harmony_init(&hv, s->tmpl, e->vocab);
    while (n_predict < 0 || (int)gen.n < n_predict) {
        if (g_interrupt) { /* Ctrl-C: the reply ends here, the session goes on */
            g_interrupt = 0;
            fprintf(stderr, "\n[stopped]");
            break;
        }
        if (hm_gen_room(e->gen) == 0) {
            fprintf(stderr, "\n[context full: %d tokens]\n", n_ctx);
            break;
        }
        int32_t t;
        st = hm_gen_next(e->gen, &t, err);
        if (st) break;
        /* every token taken is in the cache after hm_gen_end, the end-of-turn token too */
        if (s->cached.n == s->cached.cap) {
            size_t cap = s->cached.cap ? s->cached.cap * 2 : 64;
            int32_t *ids = realloc(s->cached.ids, cap * sizeof(int32_t));
            if (!ids) {
                st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
                break;
            }
            s->cached.ids = ids;
            s->cached.cap = cap;
        }
        s->cached.ids[s->cached.n++] = t;
        if (is_stop(s, t)) break;
        chat_harmony_token(&hv, t);
        const char *piece;
        size_t plen;
        st = tok_stream_push(&ts, t, &piece, &plen, err);
        if (st) break;
        const bool in_final = chat_harmony_piece(&hv, piece, plen);
        if (in_final && plen) {
            fwrite(piece, 1, plen, stdout);
            fflush(stdout);
        }
        bool reversed = false;
        if (s->reverse->n > 0 && plen) {
            if (shown_n + plen > shown_cap) {
                size_t cap = (shown_n + plen) * 2;
                char *m = realloc(shown, cap);
                if (!m) {
                    st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
                    break;
                }
                shown = m, shown_cap = cap;
            }
            memcpy(shown + shown_n, piece, plen);
            shown_n += plen;
            reversed = cli_args_ends_with(s->reverse, shown, shown_n);
        }
        if (gen.n == gen.cap) {
            size_t cap = gen.cap ? gen.cap * 2 : 64;
            int32_t *ids = realloc(gen.ids, cap * sizeof(int32_t));
            if (!ids) {
                st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
                break;
            }
            gen.ids = ids;
            gen.cap = cap;
        }
        gen.ids[gen.n++] = t;
        if (reversed) break;
    }
    free(shown);
    /* the cache holds the prompt and every token taken; a GPU that ran ahead is rewound */
    hm_status end_st = hm_gen_end(e->gen, err);
    if (!st) st = end_st;
    const char *rest;
    size_t rlen;
    tok_stream_flush(&ts, &rest, &rlen);
    if (hv.in_final && rlen) fwrite(rest, 1, rlen, stdout);
    printf("\n");
    fflush(stdout);
    tok_stream_free(&ts);
    *n_gen = (int)gen.n;
    if (!st) {
        char *text = NULL;
        size_t len = 0;
        st = tok_decode(e->vocab, gen.ids, gen.n, harmony ? TOK_DECODE_SPECIAL : 0, &text, &len,
                        err);
        if (!st) {
            const char *c = harmony ? harmony_final(text) : text;
            /* mistral's template writes ' ' + content; SentencePiece gave us the space */
            if (s->tmpl->family == CHAT_MISTRAL && c[0] == ' ') c++;
            *reply = utf8_lossy(c);
            if (!*reply) st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
            free(text);
        }
    }
    tok_ids_free(&gen);
    return st;
}

/* /save FILE: the conversation as OpenAI-style JSON messages. */
static void save_messages(const msg_list *msgs, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "hotmoe chat: /save: cannot write %s: %s\n", path, strerror(errno));
        return;
    }
    hm_json j;
    hm_json_init_file(&j, f, true);
    hm_json_obj_begin(&j);
    hm_json_key(&j, "messages");
    hm_json_arr_begin(&j);
    for (size_t i = 0; i < msgs->n; i++) {
        hm_json_obj_begin(&j);
        hm_json_kstr(&j, "role", msgs->m[i].role);
        hm_json_kstr(&j, "content", msgs->m[i].content);
        hm_json_obj_end(&j);
    }
    hm_json_arr_end(&j);
    hm_json_obj_end(&j);
    hm_error err;
    const bool ok = hm_json_finish(&j, &err) == HM_OK;
    hm_json_free(&j);
    if (fclose(f) != 0 || !ok)
        fprintf(stderr, "hotmoe chat: /save: writing %s failed\n", path);
    else
        fprintf(stderr, "[saved %zu messages to %s]\n", msgs->n, path);
}

/* A line starting with '/': true when it was a command (done), false to send it as text. */
static bool chat_command(chat_state *s, msg_list *msgs, bool has_system, const char *line) {
    if (!strcmp(line, "/help")) {
        fprintf(stderr, "commands: /help this list; /clear forget the conversation (the system "
                "prompt stays); /save FILE write it as JSON messages; /exit quit. Ctrl-C stops "
                "a reply; a line ending in \\ continues on the next.\n");
        return true;
    }
    if (!strcmp(line, "/clear")) {
        while (msgs->n > (has_system ? 1u : 0u)) msgs_pop(msgs);
        hm_context_reset(s->e->ctx);
        s->cached.n = 0;
        fprintf(stderr, "[conversation cleared]\n");
        return true;
    }
    if (!strncmp(line, "/save", 5) && (line[5] == ' ' || !line[5])) {
        const char *path = line + 5;
        while (*path == ' ') path++;
        if (!*path) fprintf(stderr, "hotmoe chat: /save needs a file name\n");
        else save_messages(msgs, path);
        return true;
    }
    return false;
}


int cmd_chat(int argc, char **argv) {
    const char *system = NULL, *tmpl_name = NULL, *effort = NULL;
    int n_predict = -1;
    bool verbose = false, no_think = false;
    const cli_arg_spec extra[] = {
        {"-sys", "--system-prompt", CLI_ARG_STR, &system, "TEXT", "system prompt"},
        {"-n", "--n-predict", CLI_ARG_INT, &n_predict, "N",
         "most tokens per reply (default: -1, until the end of the turn)"},
        {"--chat-template", NULL, CLI_ARG_STR, &tmpl_name, "NAME",
         "chatml, harmony, mistral, mistral-legacy or tulu instead of the model's template"},
        {"--reasoning-effort", NULL, CLI_ARG_STR, &effort, "LEVEL",
         "harmony: low, medium or high (default: the template's)"},
        {"--no-think", NULL, CLI_ARG_BOOL, &no_think, NULL,
         "chatml templates with enable_thinking: render enable_thinking=false"},
        {"-v", "--verbose", CLI_ARG_BOOL, &verbose, NULL,
         "print each rendered prompt and per-turn token counts and speeds on stderr"},
    };
    const cli_args_def def = {"chat", "-m MODEL [-sys TEXT] [options]",
                              "Interactive chat: type a message and Enter (end a line with \\ to "
                              "continue it); Ctrl-C stops a reply, Ctrl-D, Ctrl-C at the prompt "
                              "or /exit quits; /help lists the commands. When the conversation "
                              "outgrows -c, its oldest turns after the system prompt are "
                              "dropped. Expert usage tracer: "
                              "--expert-trace-stats, --expert-trace-names, "
                              "--expert-trace-per-layer, --expert-trace-output FILE (or "
                              "LLAMA_EXPERT_TRACE_*).",
                              CLI_ARGS_MODEL | CLI_ARGS_CONTEXT | CLI_ARGS_THREADS |
                                  CLI_ARGS_SAMPLING | CLI_ARGS_GEN,
                              extra, sizeof(extra) / sizeof(extra[0])};
    moe_tracer_config tc;
    if (cli_tracer_args("chat", &tc, &argc, argv)) return 2;
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    if (n_predict < -1) {
        fprintf(stderr, "hotmoe chat: -n must be >= -1\n");
        return 2;
    }
    if (effort && !chat_reasoning_effort_valid(effort)) {
        fprintf(stderr, "hotmoe chat: --reasoning-effort '%s' is not one of " CHAT_REASONING_EFFORTS
                        "\n",
                effort);
        return 2;
    }
    cli_engine e;
    rc = cli_engine_open(&e, "chat", &a, CLI_ENGINE_VOCAB | CLI_ENGINE_SAMPLER, 0);
    if (rc) return rc;
    hm_error err = {0};
    chat_template tmpl;
    if (chat_template_for_model(hm_model_gguf(e.model), tmpl_name, &tmpl, &err) != HM_OK) {
        fprintf(stderr, "hotmoe chat: %s\n", err.msg);
        cli_engine_close(&e);
        return tmpl_name ? 2 : 1;
    }
    chat_state s = {0};
    s.e = &e;
    s.tmpl = &tmpl;
    s.verbose = verbose;
    s.special = a.special;
    s.reverse = &a.reverse_prompt;
    s.n_predict = n_predict;
    if (a.escape) {
        if (system) cli_args_unescape((char *)system);
        for (int i = 0; i < a.reverse_prompt.n; i++) cli_args_unescape((char *)a.reverse_prompt.v[i]);
    }
    if (a.ignore_eos)
        fprintf(stderr, "hotmoe chat: a reply ends at the template's end-of-turn token; "
                "--ignore-eos is ignored\n");
    s.ropts = chat_render_opts_for(e.vocab);
    s.ropts.reasoning_effort = effort;
    if (no_think) s.ropts.enable_thinking = 0;
    const char *const *stops = chat_stop_texts(&tmpl);
    s.n_stop = chat_stop_ids(&tmpl, e.vocab, s.stop_ids, 8);
    if (stops && s.n_stop == 0) {
        fprintf(stderr, "hotmoe chat: the vocabulary has none of the %s end-of-turn tokens\n",
                chat_family_name(tmpl.family));
        chat_template_free(&tmpl);
        cli_engine_close(&e);
        return 1;
    }
    if (system) { /* a template that refuses a system prompt: say so now, not every turn */
        chat_message probe[] = {{"system", system}, {"user", "x"}};
        char *text = NULL;
        if (chat_render(&tmpl, probe, 2, &s.ropts, &text, NULL, &err) != HM_OK) {
            fprintf(stderr, "hotmoe chat: the %s chat template refuses a system prompt (%s); "
                            "try --chat-template %s\n",
                    chat_family_name(tmpl.family), err.msg,
                    tmpl.family == CHAT_MISTRAL_LEGACY ? "mistral" : "NAME");
            chat_template_free(&tmpl);
            cli_engine_close(&e);
            return 2;
        }
        free(text);
    }
    msg_list msgs = {0};
    int status = 0;
    moe_tracer *tr = NULL;
    if (cli_tracer_attach(&e, &tc, a.model, &tr)) status = 1;
    hm_gen_set_max(e.gen, n_predict);
    if (system && !msgs_push(&msgs, "system", system, strlen(system))) {
        fprintf(stderr, "hotmoe chat: out of memory\n");
        status = 1;
    }
    bool tty = isatty(STDIN_FILENO);
    if (verbose)
        fprintf(stderr, "hotmoe chat: template %s, context %d, seed %llu\n",
                chat_family_name(tmpl.family), hm_context_n_ctx(e.ctx),
                (unsigned long long)e.seed);
    install_sigint();
    for (int turn = 1; status == 0; turn++) {
        char *user = NULL;
        size_t ulen = 0;
        if (!read_turn(&user, &ulen)) {
            if (tty) printf("\n"); /* Ctrl-D: leave the shell prompt on a line of its own */
            break;
        }
        if (!strcmp(user, "/exit")) {
            free(user);
            break;
        }
        if (user[0] == '/' && chat_command(&s, &msgs, system != NULL, user)) {
            free(user);
            turn--;
            continue;
        }
        if (ulen == 0) {
            free(user);
            turn--;
            continue;
        }
        if (tr) moe_tracer_add_prompt(tr); /* each user turn is one prompt */
        bool ok = msgs_push(&msgs, "user", user, ulen);
        free(user);
        if (!ok) {
            fprintf(stderr, "hotmoe chat: out of memory\n");
            status = 1;
            break;
        }
        int n_new = 0, n_reused = 0, n_gen = 0;
        double t0 = cli_now();
        hm_status st = process_prompt(&s, &msgs, &n_new, &n_reused, &err);
        /* context shift: the oldest turns after the system prompt go (--keep 0: it too) */
        const size_t first = system && a.keep != 0 ? 1 : 0;
        int dropped = 0;
        while (st == HM_ERR_RANGE && msgs.n >= first + 3) { /* a user + assistant pair */
            msgs_remove(&msgs, first);
            msgs_remove(&msgs, first);
            dropped += 2;
            st = process_prompt(&s, &msgs, &n_new, &n_reused, &err);
        }
        if (dropped) fprintf(stderr, "[context shift: the oldest %d message%s dropped]\n",
                             dropped, dropped == 1 ? "" : "s");
        if (st == HM_ERR_RANGE) { /* this message alone does not fit: the session goes on */
            fprintf(stderr, "hotmoe chat: %s\n", err.msg);
            msgs_pop(&msgs);
            turn--;
            continue;
        }
        if (st == HM_ERR_ARG || st == HM_ERR_FORMAT) { /* template refused it, bad UTF-8 */
            fprintf(stderr, "hotmoe chat: %s\n", err.msg);
            msgs_pop(&msgs);
            turn--;
            continue;
        }
        if (st) {
            fprintf(stderr, "hotmoe chat: %s\n", err.msg);
            status = 1;
            break;
        }
        double t1 = cli_now();
        char *reply = NULL;
        st = generate(&s, n_predict, &reply, &n_gen, &err);
        double t2 = cli_now();
        if (st) {
            fprintf(stderr, "hotmoe chat: %s\n", err.msg);
            status = 1;
            break;
        }
        ok = msgs_push(&msgs, "assistant", reply, strlen(reply));
        free(reply);
        if (!ok) {
            fprintf(stderr, "hotmoe chat: out of memory\n");
            status = 1;
            break;
        }
        if (verbose)
            fprintf(stderr,
                    "[turn %d: prompt %d new tokens (%d reused from the cache) %.1f t/s, "
                    "generated %d tokens %.1f t/s]\n",
                    turn, n_new, n_reused, n_new / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_gen,
                    n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9));
    }
    msgs_free(&msgs);
    tok_ids_free(&s.cached);
    chat_template_free(&tmpl);
    if (cli_tracer_finish(&e, tr)) status = 1;
    cli_engine_close(&e);
    return status;
}
