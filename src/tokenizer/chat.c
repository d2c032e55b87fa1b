/* chat.c - chat template families: recognising a Jinja template (see chat.h).
 *
 * DESIGN: detection looks for substrings that only one family's templates contain, most specific
 * first, and refuses what it does not know rather than guessing: a template this file does not
 * recognise is an error naming the --chat-template override. The few literals that differ
 * between models of one family are read from the template text itself (ChatML's default system
 * prompt from a Jinja string literal, unescaped; forge's shortened harmony preamble as raw
 * template text, which Jinja emits verbatim, with constant expressions {{ '\\n' }} inlined), so the formatter in chat_render.c reproduces the
 * template's output for these models without a Jinja interpreter.
 */
#include "tokenizer/chat.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const char *const k_names[CHAT_FAMILY_COUNT] = {"chatml", "harmony", "mistral",
                                                       "mistral-legacy", "tulu"};

const char *chat_family_name(chat_family f) {
    return (unsigned)f < CHAT_FAMILY_COUNT ? k_names[f] : "?";
}

const char *chat_family_names(void) { return "chatml, harmony, mistral, mistral-legacy, tulu"; }

void chat_template_free(chat_template *t) {
    if (!t) return;
    free(t->default_system);
    free(t->harmony_preamble);
    free(t->harmony_dev_prefix);
    free(t->harmony_dev_suffix);
    free(t->harmony_effort);
    memset(t, 0, sizeof(*t));
}

hm_status chat_template_from_name(const char *name, chat_template *out, hm_error *err) {
    memset(out, 0, sizeof(*out));
    for (int f = 0; f < CHAT_FAMILY_COUNT; f++)
        if (name && !strcmp(name, k_names[f])) {
            out->family = (chat_family)f;
            return HM_OK;
        }
    return hm_error_set(err, HM_ERR_ARG, "unknown chat template '%s' (known: %s)",
                        name ? name : "", chat_family_names());
}

/* ---- small helpers over a (ptr, len) text ---- */

static const char *find_n(const char *s, size_t len, const char *needle) {
    size_t n = strlen(needle);
    if (n == 0 || n > len) return NULL;
    for (size_t i = 0; i + n <= len; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, n)) return s + i;
    return NULL;
}

static bool has(const char *s, size_t len, const char *needle) {
    return find_n(s, len, needle) != NULL;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Unescapes a Jinja (Python) string literal body: \n \t \r \\ \' \" ; NULL on another escape. */
static char *unescape_literal(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') {
            d[o++] = s[i];
            continue;
        }
        if (++i == n) break;
        switch (s[i]) {
        case 'n': d[o++] = '\n'; break;
        case 't': d[o++] = '\t'; break;
        case 'r': d[o++] = '\r'; break;
        case '\\': case '\'': case '"': d[o++] = s[i]; break;
        default: free(d); return NULL;
        }
    }
    d[o] = 0;
    return d;
}

/* ChatML: the default system prompt a template emits when messages[0] is not a system message,
 * i.e. a string literal '<|im_start|>system\n...<|im_end|>\n' whose body is constant (no quote,
 * no expression). Qwen1.5: "You are a helpful assistant", Qwen2: "... assistant.", Qwen2.5: "You
 * are Qwen, created by Alibaba Cloud. You are a helpful assistant." */
static hm_status chatml_default_system(const char *t, size_t len, chat_template *out,
                                       hm_error *err) {
    static const char head[] = "<|im_start|>system\\n";
    const char *p = t, *end = t + len;
    while ((p = find_n(p, (size_t)(end - p), head)) != NULL) {
        const char *body = p + strlen(head);
        const char *close = find_n(body, (size_t)(end - body), "<|im_end|>");
        if (!close) break;
        bool literal = body < close && body[0] != '\'' && body[0] != '"';
        for (const char *q = body; q < close && literal; q++)
            if (*q == '\'' || *q == '"' || *q == '{' || *q == '}' || *q == '+') literal = false;
        /* the body must be followed by the rest of the same literal: <|im_end|>\n' */
        if (literal && !strncmp(close, "<|im_end|>\\n", 12) && (size_t)(end - close) > 12 &&
            (close[12] == '\'' || close[12] == '"')) {
            out->default_system = unescape_literal(body, (size_t)(close - body));
            if (!out->default_system)
                return hm_error_set(err, HM_ERR_UNSUPPORTED,
                                    "chat template: default system prompt has an escape this "
                                    "reader does not know");
            return HM_OK;
        }
        p = body;
    }
    return HM_OK;
}

/* Strips Jinja whitespace control around an expression: trailing whitespace of text before
 * "{{-" and leading whitespace after "-}}". */
static size_t rtrim_ws(const char *s, size_t n) {
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    return n;
}

/* forge's shortened harmony template: "<|start|>system<|message|>BODY<|end|>" as raw template
 * text, BODY holding one expression {{ reasoning_effort | default('X') }}; developer messages as
 * "<|start|>developer<|message|>PREFIX{{ message['content'] }}SUFFIX<|end|>". */
static hm_status harmony_forge(const char *t, size_t len, chat_template *out, hm_error *err) {
    const char *end = t + len;
    static const char sys[] = "<|start|>system<|message|>";
    const char *b = find_n(t, len, sys);
    b += strlen(sys);
    const char *e = find_n(b, (size_t)(end - b), "<|end|>");
    const char *x = find_n(b, (size_t)(end - b), "{{");
    const char *xe = x ? find_n(x, (size_t)(end - x), "}}") : NULL;
    if (!e || !x || !xe || xe > e || !find_n(x, (size_t)(xe - x), "reasoning_effort"))
        goto bad;
    /* the default effort: default('X') */
    const char *d = find_n(x, (size_t)(xe - x), "default(");
    if (d) {
        d += 8;
        char q = *d;
        const char *dq = (q == '\'' || q == '"') ? memchr(d + 1, q, (size_t)(xe - d - 1)) : NULL;
        if (!dq) goto bad;
        out->harmony_effort = dup_n(d + 1, (size_t)(dq - d - 1));
    } else {
        out->harmony_effort = dup_n("medium", 6);
    }
    size_t pre = (size_t)(x - b);
    if (x[2] == '-') pre = rtrim_ws(b, pre);
    const char *post = xe + 2;
    if (xe[-1] == '-')
        while (post < e && (*post == ' ' || *post == '\n' || *post == '\t' || *post == '\r'))
            post++;
    if (find_n(post, (size_t)(e - post), "{") || find_n(b, pre, "{")) goto bad;
    /* preamble = text before, "{reasoning}", text after */
    size_t n_post = (size_t)(e - post);
    out->harmony_preamble = malloc(pre + 11 + n_post + 1);
    if (!out->harmony_preamble || !out->harmony_effort) goto nomem;
    memcpy(out->harmony_preamble, b, pre);
    memcpy(out->harmony_preamble + pre, "{reasoning}", 11);
    memcpy(out->harmony_preamble + pre + 11, post, n_post);
    out->harmony_preamble[pre + 11 + n_post] = 0;

    static const char dev[] = "<|start|>developer<|message|>";
    const char *db = find_n(t, len, dev);
    if (!db) goto bad;
    db += strlen(dev);
    const char *dx = find_n(db, (size_t)(end - db), "{{");
    const char *dxe = dx ? find_n(dx, (size_t)(end - dx), "}}") : NULL;
    const char *de = dxe ? find_n(dxe, (size_t)(end - dxe), "<|end|>") : NULL;
    if (!de || !find_n(dx, (size_t)(dxe - dx), "content") || find_n(db, (size_t)(dx - db), "{") ||
        find_n(dxe + 2, (size_t)(de - dxe - 2), "{") || dx[2] == '-' || dxe[-1] == '-')
        goto bad;
    out->harmony_dev_prefix = dup_n(db, (size_t)(dx - db));
    out->harmony_dev_suffix = dup_n(dxe + 2, (size_t)(de - dxe - 2));
    if (!out->harmony_dev_prefix || !out->harmony_dev_suffix) goto nomem;
    return HM_OK;
bad:
    chat_template_free(out);
    return hm_error_set(err, HM_ERR_UNSUPPORTED,
                        "unrecognised harmony chat template layout; pass --chat-template harmony "
                        "to use OpenAI's gpt-oss format");
nomem:
    chat_template_free(out);
    return hm_error_set(err, HM_ERR_NOMEM, "out of memory reading the chat template");
}

/* Copy of t with every constant expression {{ 'LITERAL' }} (either quote, no whitespace control)
 * replaced by its unescaped text: the form in which templates write newlines ({{ '\\n' }}),
 * since raw template text would keep a backslash-n verbatim. NULL when out of memory. */
static char *inline_literals(const char *t, size_t len, size_t *out_len) {
    char *d = malloc(len + 1);
    if (!d) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i + 2;
        if (i + 2 < len && t[i] == '{' && t[i + 1] == '{') {
            while (j < len && t[j] == ' ') j++;
            char q = j < len ? t[j] : 0;
            size_t b = j + 1, e = b;
            while ((q == '\'' || q == '"') && e < len && t[e] != q) e += t[e] == '\\' ? 2 : 1;
            size_t k = e + 1;
            while (k < len && t[k] == ' ') k++;
            if ((q == '\'' || q == '"') && e < len && k + 1 < len && t[k] == '}' && t[k + 1] == '}') {
                char *lit = unescape_literal(t + b, e - b);
                if (lit) {
                    size_t n = strlen(lit); /* never longer than its escaped form */
                    memcpy(d + o, lit, n);
                    o += n;
                    free(lit);
                    i = k + 2;
                    continue;
                }
            }
        }
        d[o++] = t[i++];
    }
    d[o] = 0;
    *out_len = o;
    return d;
}

hm_status chat_template_detect(const char *t, size_t len, chat_template *out, hm_error *err) {
    memset(out, 0, sizeof(*out));
    if (has(t, len, "<|start|>") && has(t, len, "<|message|>")) {
        out->family = CHAT_HARMONY;
        /* OpenAI's template builds the system message in a macro (with the current date) */
        if (has(t, len, "build_system_message") || has(t, len, "strftime_now")) return HM_OK;
        if (has(t, len, "<|start|>system<|message|>") && has(t, len, "reasoning_effort")) {
            size_t n;
            char *flat = inline_literals(t, len, &n);
            if (!flat) return hm_error_set(err, HM_ERR_NOMEM, "out of memory reading the chat template");
            hm_status st = harmony_forge(flat, n, out, err);
            free(flat);
            return st;
        }
    } else if (has(t, len, "<|im_start|>") && has(t, len, "<|im_end|>")) {
        out->family = CHAT_CHATML;
        out->qwen3_think = has(t, len, "</think>") && has(t, len, "reasoning_content");
        out->enable_thinking = has(t, len, "enable_thinking");
        return chatml_default_system(t, len, out, err);
    } else if (has(t, len, "[INST]")) {
        if (has(t, len, "' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]'") &&
            has(t, len, "' ' + message['content'] + eos_token")) {
            out->family = CHAT_MISTRAL;
            return HM_OK;
        }
        if (has(t, len, "'[INST] ' + message['content'] + ' [/INST]'") &&
            has(t, len, "message['content'] + eos_token") && !has(t, len, "system")) {
            out->family = CHAT_MISTRAL_LEGACY;
            return HM_OK;
        }
        return hm_error_set(err, HM_ERR_UNSUPPORTED,
                            "unrecognised [INST] chat template (not Mixtral-Instruct's); pass "
                            "--chat-template mistral or mistral-legacy");
    } else if (has(t, len, "<|user|>") && has(t, len, "<|assistant|>") &&
               has(t, len, "<|system|>")) {
        out->family = CHAT_TULU;
        return HM_OK;
    }
    chat_template_free(out);
    return hm_error_set(err, HM_ERR_UNSUPPORTED,
                        "unrecognised chat template (%zu bytes); pass --chat-template NAME, one "
                        "of %s",
                        len, chat_family_names());
}

hm_status chat_template_for_model(const gguf_ctx *g, const char *override_name,
                                  chat_template *out, hm_error *err) {
    if (override_name) return chat_template_from_name(override_name, out, err);
    memset(out, 0, sizeof(*out));
    gguf_str s;
    if (gguf_find_key(g, "tokenizer.chat_template") < 0)
        return hm_error_set(err, HM_ERR_NOT_FOUND,
                            "the model has no tokenizer.chat_template; pass --chat-template NAME "
                            "(one of %s)",
                            chat_family_names());
    hm_status st = gguf_get_str(g, "tokenizer.chat_template", &s, err);
    if (st) return st;
    return chat_template_detect(s.data, (size_t)s.len, out, err);
}

const char *const *chat_stop_texts(const chat_template *t) {
    static const char *const k_harmony_stop[] = {"<|return|>", "<|call|>", "<|endoftext|>", NULL};
    return t->family == CHAT_HARMONY ? k_harmony_stop : NULL;
}

void chat_harmony_init(chat_harmony *h, const chat_template *t, const tok_vocab *v) {
    memset(h, 0, sizeof(*h));
    h->on = t && t->family == CHAT_HARMONY;
    h->in_final = true;
    h->id_channel = tok_token_find(v, "<|channel|>", 11);
    h->id_message = tok_token_find(v, "<|message|>", 11);
    h->id_start = tok_token_find(v, "<|start|>", 9);
    h->id_end = tok_token_find(v, "<|end|>", 7);
}

void chat_harmony_token(chat_harmony *h, int32_t t) {
    if (!h->on) return;
    if (t == h->id_channel) {
        h->want_channel = true;
        h->chan_n = 0;
        h->in_final = false;
    } else if (t == h->id_message) {
        if (h->want_channel) h->in_final = h->chan_n >= 5 && !memcmp(h->chan, "final", 5);
        h->want_channel = false;
    } else if (t == h->id_start || t == h->id_end) {
        h->in_final = h->want_channel = false;
    }
}

bool chat_harmony_piece(chat_harmony *h, const char *piece, size_t len) {
    if (!h->on) return true;
    if (h->want_channel)
        for (size_t i = 0; i < len && h->chan_n < sizeof(h->chan); i++) h->chan[h->chan_n++] = piece[i];
    return h->in_final;
}

chat_render_opts chat_render_opts_for(const tok_vocab *v) {
    chat_render_opts o = chat_render_default_opts();
    o.bos_token = tok_bos(v) >= 0 ? tok_token_text(v, tok_bos(v)) : "";
    o.eos_token = tok_eos(v) >= 0 ? tok_token_text(v, tok_eos(v)) : "";
    return o;
}

hm_status chat_tokenize(const tok_vocab *v, const char *text, size_t len,
                        tok_ids *out, hm_error *err) {
    if (tok_add_bos(v) && tok_bos(v) >= 0) {
        const char *bos = tok_token_text(v, tok_bos(v));
        if (!bos || strncmp(text, bos, strlen(bos))) {
            if (out->n == out->cap) {
                const size_t cap = out->cap ? out->cap * 2 : 16;
                int32_t *ids = realloc(out->ids, sizeof(int32_t) * cap);
                if (!ids) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
                out->ids = ids;
                out->cap = cap;
            }
            out->ids[out->n++] = tok_bos(v);
        }
    }
    return tok_encode(v, text, len, TOK_ENCODE_PARSE_SPECIAL, out, err);
}

int chat_stop_ids(const chat_template *t, const tok_vocab *v, int32_t *ids, int cap) {
    const char *const *texts = t ? chat_stop_texts(t) : NULL;
    int n = 0;
    for (int i = 0; texts && texts[i] && n < cap; i++) {
        const int32_t id = tok_token_find(v, texts[i], strlen(texts[i]));
        if (id >= 0) ids[n++] = id;
    }
    return n;
}
