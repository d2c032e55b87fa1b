/* oai.c - OpenAI-style request parsing and response texts (oai.h). */
#include "server/oai.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static hm_status bad(hm_error *err, const char *field, const char *what) {
    return hm_error_set(err, HM_ERR_ARG, "'%s' %s", field, what);
}

static char *dup_str(const char *s) {
    const size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

/* obj[key] as a number in [lo, hi] into *out (absent: unchanged). */
static hm_status get_num(json_t *obj, const char *key, double lo, double hi, double *out,
                         hm_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return HM_OK;
    if (!json_is_number(v)) return bad(err, key, "must be a number");
    const double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        char b[96];
        snprintf(b, sizeof(b), "must be in [%g, %g], got %g", lo, hi, x);
        return bad(err, key, b);
    }
    *out = x;
    return HM_OK;
}

/* An optional boolean field (absent or null: def). */
static hm_status get_bool(json_t *o, const char *key, bool def, bool *out, hm_error *err) {
    json_t *v = json_object_get(o, key);
    *out = def;
    if (!v || json_is_null(v)) return HM_OK;
    if (!json_is_boolean(v)) return bad(err, key, "must be a boolean");
    *out = json_is_true(v);
    return HM_OK;
}

static hm_status get_sampling(json_t *o, oai_request *r, hm_error *err) {
    double t = r->sp.temperature, tp = r->sp.top_p, mp = r->sp.min_p, tk = r->sp.top_k;
    double pp = r->sp.presence_penalty, fp = r->sp.frequency_penalty, mt = r->max_tokens;
    double seed = -1;
    hm_status st = get_num(o, "temperature", 0, 2, &t, err);
    if (!st) st = get_num(o, "top_p", 1e-6, 1, &tp, err);
    if (!st) st = get_num(o, "min_p", 0, 1, &mp, err);
    if (!st) st = get_num(o, "top_k", 0, 1 << 20, &tk, err);
    if (!st) st = get_num(o, "presence_penalty", -2, 2, &pp, err);
    if (!st) st = get_num(o, "frequency_penalty", -2, 2, &fp, err);
    if (!st) st = get_num(o, "seed", -1, 18446744073709549568.0, &seed, err);
    if (!st) st = get_num(o, "max_tokens", 1, 1 << 24, &mt, err);
    if (!st) st = get_num(o, "max_completion_tokens", 1, 1 << 24, &mt, err);
    if (st) return st;
    if (tk != floor(tk) || mt != floor(mt) || (seed >= 0 && seed != floor(seed)))
        return bad(err, "top_k/max_tokens/seed", "must be integers");
    json_t *n = json_object_get(o, "n");
    if (n && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1))
        return bad(err, "n", "must be 1 (one choice per request)");
    r->sp.temperature = (float)t, r->sp.top_p = (float)tp, r->sp.min_p = (float)mp;
    r->sp.top_k = (int32_t)tk, r->sp.presence_penalty = (float)pp;
    r->sp.frequency_penalty = (float)fp, r->max_tokens = (int)mt;
    if (seed >= 0) r->sp.seed = (uint64_t)seed, r->seed_given = true;
    return HM_OK;
}

static hm_status get_stop(json_t *o, oai_request *r, hm_error *err) {
    json_t *s = json_object_get(o, "stop");
    if (!s || json_is_null(s)) return HM_OK;
    const size_t n = json_is_array(s) ? json_array_size(s) : 1;
    if (n > OAI_STOP_MAX) return bad(err, "stop", "may hold at most 4 strings");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_array(s) ? json_array_get(s, i) : s;
        if (!json_is_string(v)) return bad(err, "stop", "must be a string or an array of them");
        if (json_string_length(v) == 0) continue;
        if (!(r->stop[r->n_stop] = dup_str(json_string_value(v))))
            return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
        r->n_stop++;
    }
    return HM_OK;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts. */
static hm_status content_text(json_t *c, char **out, hm_error *err) {
    if (json_is_string(c)) return (*out = dup_str(json_string_value(c))) ? HM_OK
                                   : hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    if (!json_is_array(c)) return bad(err, "messages[].content", "must be a string or text parts");
    size_t len = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        json_t *p = json_array_get(c, i), *t = json_object_get(p, "text");
        const char *type = json_string_value(json_object_get(p, "type"));
        if (!json_is_string(t) || !type || strcmp(type, "text"))
            return bad(err, "messages[].content", "parts must be {\"type\": \"text\", ...}");
        len += json_string_length(t);
    }
    char *s = malloc(len + 1);
    if (!s) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    size_t o = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        json_t *t = json_object_get(json_array_get(c, i), "text");
        memcpy(s + o, json_string_value(t), json_string_length(t));
        o += json_string_length(t);
    }
    s[o] = 0;
    *out = s;
    return HM_OK;
}

static hm_status get_messages(json_t *o, oai_request *r, hm_error *err) {
    json_t *m = json_object_get(o, "messages");
    if (!json_is_array(m) || json_array_size(m) == 0)
        return bad(err, "messages", "must be a non-empty array");
    if (json_array_size(m) > OAI_MSG_MAX) return bad(err, "messages", "holds too many messages");
    r->msgs = calloc(json_array_size(m), sizeof(*r->msgs));
    if (!r->msgs) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    static const char *roles[] = {"system", "developer", "user", "assistant"};
    for (size_t i = 0; i < json_array_size(m); i++) {
        json_t *e = json_array_get(m, i), *role = json_object_get(e, "role");
        const char *rs = json_is_string(role) ? json_string_value(role) : "";
        const char *known = NULL;
        for (int k = 0; k < 4 && !known; k++)
            if (!strcmp(rs, roles[k])) known = roles[k];
        if (!known) return bad(err, "messages[].role", "must be system, developer, user or assistant");
        char *text = NULL;
        hm_status st = content_text(json_object_get(e, "content"), &text, err);
        if (st) return st;
        r->msgs[r->n_msgs].role = known;
        r->msgs[r->n_msgs++].content = text;
    }
    return HM_OK;
}

hm_status oai_parse(const char *body, size_t len, bool chat, const sample_params *defaults,
                    oai_request *out, hm_error *err) {
    memset(out, 0, sizeof(*out));
    out->chat = chat;
    out->max_tokens = -1;
    out->sp = *defaults;
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return hm_error_set(err, HM_ERR_FORMAT, "the body is not valid JSON (line %d, column "
                                "%d): %s", je.line, je.column, je.text);
    hm_status st = json_is_object(o) ? HM_OK : bad(err, "body", "must be a JSON object");
    if (!st) st = get_sampling(o, out, err);
    if (!st) st = get_stop(o, out, err);
    if (!st) {
        json_t *so = json_object_get(o, "stream_options");
        out->include_usage = json_is_true(json_object_get(so, "include_usage"));
        st = get_bool(o, "stream", false, &out->stream, err);
        if (!st) st = get_bool(o, "cache_prompt", true, &out->cache_prompt, err);
        if (!st) st = get_bool(o, "ignore_eos", false, &out->ignore_eos, err);
    }
    if (!st && (json_object_get(o, "tools") || json_object_get(o, "functions")))
        st = bad(err, "tools", "are not supported");
    if (!st && chat) {
        st = get_messages(o, out, err);
    } else if (!st) {
        json_t *p = json_object_get(o, "prompt");
        if (!json_is_string(p)) st = bad(err, "prompt", "must be a string");
        else if (!(out->prompt = dup_str(json_string_value(p))))
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    }
    json_decref(o);
    if (st) oai_request_free(out);
    return st;
}

void oai_request_free(oai_request *r) {
    free(r->prompt);
    for (int i = 0; i < r->n_msgs; i++) free((char *)r->msgs[i].content);
    free(r->msgs);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof(*r));
}

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

static json_t *head(const oai_meta *m, bool chunk) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", m->id, "object",
                     m->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                             : "text_completion",
                     "created", (json_int_t)m->created, "model", m->model);
}

static json_t *usage(int p, int c) {
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", p, "completion_tokens", c,
                     "total_tokens", p + c);
}

char *oai_response(const oai_meta *m, const char *text, size_t len, const char *finish,
                   int prompt_tokens, int completion_tokens) {
    json_t *o = head(m, false), *ch;
    if (m->chat)
        ch = json_pack("{s:i, s:{s:s, s:s%}, s:s}", "index", 0, "message", "role", "assistant",
                       "content", text, len, "finish_reason", finish);
    else
        ch = json_pack("{s:i, s:s%, s:s}", "index", 0, "text", text, len, "finish_reason", finish);
    if (!o || !ch || json_object_set_new(o, "choices", json_pack("[o]", ch)) ||
        json_object_set_new(o, "usage", usage(prompt_tokens, completion_tokens))) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

static char *sse(char *json) {
    if (!json) return NULL;
    const size_t n = strlen(json);
    char *s = malloc(n + 9);
    if (s) {
        memcpy(s, "data: ", 6);
        memcpy(s + 6, json, n);
        memcpy(s + 6 + n, "\n\n", 3);
    }
    free(json);
    return s;
}

char *oai_chunk(const oai_meta *m, const char *text, size_t len, const char *finish) {
    json_t *o = head(m, true), *ch;
    json_t *fin = finish ? json_string(finish) : json_null();
    if (m->chat && m->first)
        ch = json_pack("{s:i, s:{s:s, s:s%}, s:o}", "index", 0, "delta", "role", "assistant",
                       "content", text, len, "finish_reason", fin);
    else if (m->chat)
        ch = json_pack("{s:i, s:{s:s%}, s:o}", "index", 0, "delta", "content", text, len,
                       "finish_reason", fin);
    else
        ch = json_pack("{s:i, s:s%, s:o}", "index", 0, "text", text, len, "finish_reason", fin);
    if (!o || !ch || json_object_set_new(o, "choices", json_pack("[o]", ch))) {
        json_decref(o);
        return NULL;
    }
    return sse(dump(o));
}

char *oai_usage_chunk(const oai_meta *m, int prompt_tokens, int completion_tokens) {
    json_t *o = head(m, true);
    if (!o || json_object_set_new(o, "choices", json_array()) ||
        json_object_set_new(o, "usage", usage(prompt_tokens, completion_tokens))) {
        json_decref(o);
        return NULL;
    }
    return sse(dump(o));
}

char *oai_error(const char *message, const char *type, int code) {
    return dump(json_pack("{s:{s:s, s:s, s:i}}", "error", "message", message, "type", type,
                          "code", code));
}
