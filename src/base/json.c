/* json.c - the streaming JSON writer (see json.h). */
#include "base/json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void json_fail(hm_json *j, hm_status st, const char *why) {
    if (j->status) return;
    j->status = st;
    snprintf(j->why, sizeof(j->why), "%s", why);
}

static void emit(hm_json *j, const char *s, size_t n) {
    if (j->status || !n) return;
    if (j->f) {
        if (fwrite(s, 1, n, j->f) != n) json_fail(j, HM_ERR_IO, strerror(errno));
        return;
    }
    if (n >= j->cap - j->len) {
        size_t cap = j->cap ? j->cap : 256;
        while (n >= cap - j->len) cap *= 2;
        char *b = realloc(j->buf, cap);
        if (!b) {
            json_fail(j, HM_ERR_NOMEM, "output buffer");
            return;
        }
        j->buf = b;
        j->cap = cap;
    }
    memcpy(j->buf + j->len, s, n);
    j->len += n;
    j->buf[j->len] = '\0';
}

static void emit_s(hm_json *j, const char *s) { emit(j, s, strlen(s)); }

static void newline(hm_json *j) {
    if (!j->pretty) return;
    emit(j, "\n", 1);
    for (int i = 0; i < j->depth; i++) emit(j, "  ", 2);
}

/* Everything that starts a value: a comma if needed, the position check, the indentation. */
static bool value_start(hm_json *j) {
    if (j->status) return false;
    if (j->depth == 0) {
        if (j->done) {
            json_fail(j, HM_ERR_STATE, "a second top-level value");
            return false;
        }
        return true;
    }
    if (j->kind[j->depth - 1] == '{') {
        if (!j->want_value) {
            json_fail(j, HM_ERR_STATE, "a value in an object without a key");
            return false;
        }
        j->want_value = false;
        return true;
    }
    if (!j->empty[j->depth - 1]) emit(j, ",", 1);
    j->empty[j->depth - 1] = false;
    newline(j);
    return true;
}

static void value_end(hm_json *j) {
    if (j->depth == 0) j->done = true;
}

void hm_json_init_buf(hm_json *j, bool pretty) {
    memset(j, 0, sizeof(*j));
    j->pretty = pretty;
}

void hm_json_init_file(hm_json *j, FILE *f, bool pretty) {
    hm_json_init_buf(j, pretty);
    j->f = f;
}

void hm_json_free(hm_json *j) {
    free(j->buf);
    j->buf = NULL;
    j->len = j->cap = 0;
}

static void open_container(hm_json *j, char kind) {
    if (!value_start(j)) return;
    if (j->depth == HM_JSON_MAX_DEPTH) {
        json_fail(j, HM_ERR_STATE, "nesting deeper than HM_JSON_MAX_DEPTH");
        return;
    }
    emit(j, kind == '{' ? "{" : "[", 1);
    j->kind[j->depth] = kind;
    j->empty[j->depth] = true;
    j->depth++;
}

static void close_container(hm_json *j, char kind) {
    if (j->status) return;
    if (j->depth == 0 || j->kind[j->depth - 1] != kind || j->want_value) {
        json_fail(j, HM_ERR_STATE, kind == '{' ? "unbalanced hm_json_obj_end" : "unbalanced hm_json_arr_end");
        return;
    }
    j->depth--;
    if (!j->empty[j->depth]) newline(j);
    emit(j, kind == '{' ? "}" : "]", 1);
    value_end(j);
}

void hm_json_obj_begin(hm_json *j) { open_container(j, '{'); }
void hm_json_obj_end(hm_json *j) { close_container(j, '{'); }
void hm_json_arr_begin(hm_json *j) { open_container(j, '['); }
void hm_json_arr_end(hm_json *j) { close_container(j, '['); }

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
    else return 0;
    if (len > n) return 0;
    unsigned cp = c & (0x3f >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

static void emit_string(hm_json *j, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    emit(j, "\"", 1);
    size_t run = 0; /* start of the pending run of bytes that need no escaping */
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        const char *esc = NULL;
        char tmp[8];
        size_t len = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            snprintf(tmp, sizeof(tmp), "\\u%04x", c);
            esc = tmp;
        } else if (c >= 0x80 && !(len = utf8_len(u + i, n - i))) {
            esc = "\\ufffd";
            len = 1;
        }
        if (esc) {
            emit(j, s + run, i - run);
            emit_s(j, esc);
            run = i + len;
        }
        i += len;
    }
    emit(j, s + run, n - run);
    emit(j, "\"", 1);
}

void hm_json_key(hm_json *j, const char *key) {
    if (j->status) return;
    if (j->depth == 0 || j->kind[j->depth - 1] != '{' || j->want_value) {
        json_fail(j, HM_ERR_STATE, "a key outside an object or where a value was expected");
        return;
    }
    if (!j->empty[j->depth - 1]) emit(j, ",", 1);
    j->empty[j->depth - 1] = false;
    newline(j);
    emit_string(j, key, strlen(key));
    emit(j, j->pretty ? ": " : ":", j->pretty ? 2 : 1);
    j->want_value = true;
}

void hm_json_strn(hm_json *j, const char *s, size_t n) {
    if (!value_start(j)) return;
    emit_string(j, s, n);
    value_end(j);
}

void hm_json_str(hm_json *j, const char *s) { hm_json_strn(j, s, strlen(s)); }

static void emit_raw_value(hm_json *j, const char *text) {
    if (!value_start(j)) return;
    emit_s(j, text);
    value_end(j);
}

void hm_json_int(hm_json *j, int64_t v) {
    char b[32];
    snprintf(b, sizeof(b), "%" PRId64, v);
    emit_raw_value(j, b);
}

void hm_json_uint(hm_json *j, uint64_t v) {
    char b[32];
    snprintf(b, sizeof(b), "%" PRIu64, v);
    emit_raw_value(j, b);
}

void hm_json_double(hm_json *j, double v) {
    if (!isfinite(v)) {
        emit_raw_value(j, "null");
        return;
    }
    char b[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(b, sizeof(b), "%.*g", prec, v);
        if (strtod(b, NULL) == v) break;
    }
    emit_raw_value(j, b);
}

void hm_json_float(hm_json *j, float v) {
    if (!isfinite(v)) {
        emit_raw_value(j, "null");
        return;
    }
    char b[40];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(b, sizeof(b), "%.*g", prec, (double)v);
        if (strtof(b, NULL) == v) break;
    }
    emit_raw_value(j, b);
}

void hm_json_bool(hm_json *j, bool v) { emit_raw_value(j, v ? "true" : "false"); }
void hm_json_null(hm_json *j) { emit_raw_value(j, "null"); }

hm_status hm_json_finish(hm_json *j, hm_error *err) {
    if (!j->status && (j->depth || !j->done))
        json_fail(j, HM_ERR_STATE, j->depth ? "unclosed object or array" : "no value written");
    if (!j->status && j->f && fflush(j->f) != 0) json_fail(j, HM_ERR_IO, strerror(errno));
    if (j->status) return hm_error_set(err, j->status, "json: %s", j->why);
    return HM_OK;
}

const char *hm_json_data(const hm_json *j, size_t *len) {
    if (len) *len = j->buf ? j->len : 0;
    return j->buf ? j->buf : "";
}
