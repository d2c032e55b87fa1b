/* chat_render.c - the fixed formatter of each chat template family (see chat.h).
 *
 * DESIGN: each family is one function that appends to a growing string exactly what its Jinja
 * template emits, statement by statement; the comments quote the template lines they follow.
 * The Jinja's raise_exception calls become HM_ERR_ARG with the template's own message. Python
 * string methods the Qwen3 template uses (split, strip('\n'), lstrip, rstrip) are reproduced
 * with their exact semantics (strip only '\n').
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/chat.h"

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* Appends NUL-terminated strings until NULL. */
static void sb_cat(sbuf *b, ...) {
    va_list ap;
    va_start(ap, b);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;) sb_put(b, s, strlen(s));
    va_end(ap);
}

chat_render_opts chat_render_default_opts(void) {
    chat_render_opts o;
    memset(&o, 0, sizeof(o));
    o.add_generation_prompt = true;
    o.enable_thinking = -1;
    return o;
}

static bool is_role(const chat_message *m, const char *r) { return !strcmp(m->role, r); }

/* ---- chatml ---- */

/* Python s.lstrip('\n') / s.rstrip('\n') on (p, n). */
static void lstrip_nl(const char **p, size_t *n) {
    while (*n && **p == '\n') (*p)++, (*n)--;
}
static void rstrip_nl(const char *p, size_t *n) {
    while (*n && p[*n - 1] == '\n') (*n)--;
}

static const char *memstr(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}
static const char *memrstr(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

/* Qwen3's assistant message:
 *   if '</think>' in content:
 *     reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
 *     content = content.split('</think>')[-1].lstrip('\n')
 *   if loop.index0 > ns.last_query_index and (loop.last or reasoning):
 *     '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n'
 *       + content.lstrip('\n')
 *   else '<|im_start|>assistant\n' + content
 *   '<|im_end|>\n' */
static void qwen3_assistant(sbuf *b, const chat_message *m, bool after_query, bool last) {
    const char *c = m->content;
    size_t cn = strlen(c);
    const char *r = "";
    size_t rn = 0;
    const char *close = memstr(c, cn, "</think>");
    if (close) {
        /* split('</think>')[0] = text before the first '</think>' */
        r = c;
        rn = (size_t)(close - c);
        rstrip_nl(r, &rn);
        const char *open = memrstr(r, rn, "<think>");
        if (open) {
            rn -= (size_t)(open + 7 - r);
            r = open + 7;
        }
        lstrip_nl(&r, &rn);
        /* split('</think>')[-1] = text after the last '</think>' */
        const char *lastc = memrstr(c, cn, "</think>");
        cn -= (size_t)(lastc + 8 - c);
        c = lastc + 8;
        lstrip_nl(&c, &cn);
    }
    sb_cat(b, "<|im_start|>", m->role, "\n", NULL);
    if (after_query && (last || rn)) {
        const char *rs = r;
        size_t rsn = rn;
        lstrip_nl(&rs, &rsn);
        rstrip_nl(rs, &rsn);
        sb_cat(b, "<think>\n", NULL);
        sb_put(b, rs, rsn);
        sb_cat(b, "\n</think>\n\n", NULL);
        lstrip_nl(&c, &cn);
    }
    sb_put(b, c, cn);
    sb_cat(b, "<|im_end|>\n", NULL);
}

static hm_status render_chatml(const chat_template *t, const chat_message *msgs, size_t n,
                               const chat_render_opts *o, sbuf *b, hm_error *err) {
    /* '<|im_start|>system\n<default><|im_end|>\n' when messages[0] is not a system message */
    if (t->default_system && !is_role(&msgs[0], "system"))
        sb_cat(b, "<|im_start|>system\n", t->default_system, "<|im_end|>\n", NULL);
    /* Qwen3: ns.last_query_index = index of the last user message that is not a
     * <tool_response>, else len - 1 */
    size_t last_query = n - 1;
    for (size_t i = n; i-- > 0;) {
        const char *c = msgs[i].content;
        size_t cn = strlen(c);
        bool tool_resp = cn >= 31 && !strncmp(c, "<tool_response>", 15) &&
                         !strcmp(c + cn - 16, "</tool_response>");
        if (is_role(&msgs[i], "user") && !tool_resp) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (t->qwen3_think && is_role(&msgs[i], "assistant")) {
            qwen3_assistant(b, &msgs[i], i > last_query, i + 1 == n);
            continue;
        }
        /* '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' */
        sb_cat(b, "<|im_start|>", msgs[i].role, "\n", msgs[i].content, "<|im_end|>\n", NULL);
    }
    if (o->add_generation_prompt) {
        sb_cat(b, "<|im_start|>assistant\n", NULL);
        /* {%- if enable_thinking is defined and enable_thinking is false %} */
        if (t->enable_thinking && o->enable_thinking == 0) sb_cat(b, "<think>\n\n</think>\n\n", NULL);
    }
    (void)err;
    return HM_OK;
}

/* ---- harmony ---- */

static hm_status render_harmony_openai(const chat_message *msgs, size_t n,
                                       const chat_render_opts *o, sbuf *b, hm_error *err) {
    char date[32];
    if (o->date) {
        snprintf(date, sizeof(date), "%s", o->date);
    } else {
        /* strftime_now("%Y-%m-%d"): the local date */
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(date, sizeof(date), "%Y-%m-%d", &tm);
    }
    sb_cat(b, "<|start|>system<|message|>",
           o->model_identity ? o->model_identity
                             : "You are ChatGPT, a large language model trained by OpenAI.",
           "\nKnowledge cutoff: 2024-06\nCurrent date: ", date, "\n\nReasoning: ",
           o->reasoning_effort ? o->reasoning_effort : "medium",
           "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every "
           "message.<|end|>",
           NULL);
    /* messages[0] developer or system -> developer message; rendered when non-empty */
    size_t first = 0;
    if (is_role(&msgs[0], "developer") || is_role(&msgs[0], "system")) {
        first = 1;
        if (msgs[0].content[0])
            sb_cat(b, "<|start|>developer<|message|># Instructions\n\n", msgs[0].content,
                   "\n\n<|end|>", NULL);
    }
    for (size_t i = first; i < n; i++) {
        const chat_message *m = &msgs[i];
        if (is_role(m, "assistant")) {
            if (strstr(m->content, "<|channel|>analysis<|message|>") ||
                strstr(m->content, "<|channel|>final<|message|>"))
                return hm_error_set(err, HM_ERR_ARG,
                                    "You have passed a message containing <|channel|> tags in the "
                                    "content field.");
            bool ret = i + 1 == n && !o->add_generation_prompt;
            sb_cat(b, "<|start|>assistant<|channel|>final<|message|>", m->content,
                   ret ? "<|return|>" : "<|end|>", NULL);
        } else if (is_role(m, "user")) {
            sb_cat(b, "<|start|>user<|message|>", m->content, "<|end|>", NULL);
        } else if (is_role(m, "tool")) {
            return hm_error_set(err, HM_ERR_ARG,
                                "Message has tool role, but there was no previous assistant "
                                "message with a tool call!");
        }
        /* later system/developer messages: the template renders nothing for them */
    }
    if (o->add_generation_prompt) sb_cat(b, "<|start|>assistant", NULL);
    return HM_OK;
}

static hm_status render_harmony_forge(const chat_template *t, const chat_message *msgs, size_t n,
                                      const chat_render_opts *o, sbuf *b) {
    const char *effort = o->reasoning_effort ? o->reasoning_effort : t->harmony_effort;
    const char *slot = strstr(t->harmony_preamble, "{reasoning}");
    sb_cat(b, "<|start|>system<|message|>", NULL);
    sb_put(b, t->harmony_preamble, (size_t)(slot - t->harmony_preamble));
    sb_cat(b, effort, slot + 11, "<|end|>", NULL);
    for (size_t i = 0; i < n; i++) {
        const chat_message *m = &msgs[i];
        if (is_role(m, "system") || is_role(m, "developer")) {
            sb_cat(b, "<|start|>developer<|message|>", t->harmony_dev_prefix, m->content,
                   t->harmony_dev_suffix, "<|end|>", NULL);
        } else if (is_role(m, "assistant")) {
            bool ret = i + 1 == n && !o->add_generation_prompt;
            sb_cat(b, "<|start|>assistant<|channel|>final<|message|>", m->content,
                   ret ? "<|return|>" : "<|end|>", NULL);
        } else {
            sb_cat(b, "<|start|>", m->role, "<|message|>", m->content, "<|end|>", NULL);
        }
    }
    if (o->add_generation_prompt) sb_cat(b, "<|start|>assistant", NULL);
    return HM_OK;
}

/* ---- mistral ---- */

static hm_status render_mistral(bool legacy, const chat_message *msgs, size_t n,
                                const chat_render_opts *o, sbuf *b, hm_error *err) {
    const char *eos = o->eos_token ? o->eos_token : "";
    const char *sys = NULL;
    size_t first = 0;
    if (!legacy && is_role(&msgs[0], "system")) {
        sys = msgs[0].content;
        first = 1;
    }
    sb_cat(b, o->bos_token ? o->bos_token : "", NULL);
    for (size_t i = first; i < n; i++) {
        const chat_message *m = &msgs[i];
        bool even = (i - first) % 2 == 0;
        if (is_role(m, "user") != even)
            return hm_error_set(err, HM_ERR_ARG, "%s",
                                legacy ? "Conversation roles must alternate "
                                         "user/assistant/user/assistant/..."
                                       : "After the optional system message, conversation roles "
                                         "must alternate user/assistant/user/assistant/...");
        if (is_role(m, "user")) {
            if (legacy)
                sb_cat(b, "[INST] ", m->content, " [/INST]", NULL);
            else if (i == first && sys)
                sb_cat(b, " [INST] ", sys, "\n\n", m->content, " [/INST]", NULL);
            else
                sb_cat(b, " [INST] ", m->content, " [/INST]", NULL);
        } else if (is_role(m, "assistant")) {
            sb_cat(b, legacy ? "" : " ", m->content, eos, NULL);
        } else {
            return hm_error_set(err, HM_ERR_ARG, "%s",
                                legacy ? "Only user and assistant roles are supported!"
                                       : "Only user and assistant roles are supported, with the "
                                         "exception of an initial optional system message!");
        }
    }
    return HM_OK; /* these templates have no generation prompt */
}

/* ---- tulu (OLMoE-Instruct) ---- */

static hm_status render_tulu(const chat_message *msgs, size_t n, const chat_render_opts *o,
                             sbuf *b) {
    const char *eos = o->eos_token ? o->eos_token : "";
    sb_cat(b, o->bos_token ? o->bos_token : "", NULL);
    for (size_t i = 0; i < n; i++) {
        const chat_message *m = &msgs[i];
        bool last = i + 1 == n;
        if (is_role(m, "system"))
            sb_cat(b, "<|system|>\n", m->content, "\n", NULL);
        else if (is_role(m, "user"))
            sb_cat(b, "<|user|>\n", m->content, "\n", NULL);
        else if (is_role(m, "assistant"))
            sb_cat(b, "<|assistant|>\n", m->content, eos, last ? "" : "\n", NULL);
        if (last && o->add_generation_prompt) sb_cat(b, "<|assistant|>\n", NULL);
    }
    return HM_OK;
}

bool chat_reasoning_effort_valid(const char *effort) {
    return effort && (!strcmp(effort, "low") || !strcmp(effort, "medium") || !strcmp(effort, "high"));
}

hm_status chat_render(const chat_template *t, const chat_message *msgs, size_t n,
                      const chat_render_opts *opts, char **out, size_t *out_len, hm_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    chat_render_opts def = chat_render_default_opts();
    const chat_render_opts *o = opts ? opts : &def;
    if (n == 0) return hm_error_set(err, HM_ERR_ARG, "chat: no messages to render");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0])
            return hm_error_set(err, HM_ERR_ARG, "chat: message %zu has no role or content", i);
    if (t->family == CHAT_HARMONY && o->reasoning_effort &&
        !chat_reasoning_effort_valid(o->reasoning_effort))
        return hm_error_set(err, HM_ERR_ARG,
                            "chat: reasoning effort '%s' is not one of " CHAT_REASONING_EFFORTS,
                            o->reasoning_effort);
    sbuf b = {0};
    hm_status st = HM_OK;
    switch (t->family) {
    case CHAT_CHATML: st = render_chatml(t, msgs, n, o, &b, err); break;
    case CHAT_HARMONY:
        st = t->harmony_preamble ? render_harmony_forge(t, msgs, n, o, &b)
                                 : render_harmony_openai(msgs, n, o, &b, err);
        break;
    case CHAT_MISTRAL: st = render_mistral(false, msgs, n, o, &b, err); break;
    case CHAT_MISTRAL_LEGACY: st = render_mistral(true, msgs, n, o, &b, err); break;
    case CHAT_TULU: st = render_tulu(msgs, n, o, &b); break;
    default: st = hm_error_set(err, HM_ERR_ARG, "chat: unknown template family %d", t->family);
    }
    if (!st && b.oom) st = hm_error_set(err, HM_ERR_NOMEM, "chat: out of memory rendering");
    if (st) {
        free(b.p);
        return st;
    }
    if (!b.p) sb_put(&b, "", 0);
    if (b.oom) return hm_error_set(err, HM_ERR_NOMEM, "chat: out of memory rendering");
    *out = b.p;
    if (out_len) *out_len = b.n;
    return HM_OK;
}
