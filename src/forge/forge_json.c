/* forge_json.c - see forge_json.h. Strings are escaped per RFC 8259 (quote, backslash and
 * control characters; other UTF-8 passes through); doubles print in the shortest form that
 * reads back to the same value. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forge/forge_json.h"

void fj_init(fj *j, bool pretty) {
    memset(j, 0, sizeof(*j));
    j->pretty = pretty;
}

void fj_free(fj *j) {
    free(j->buf);
    j->buf = NULL;
    j->len = j->cap = 0;
}

void fj_raw(fj *j, const char *s, size_t n) {
    if (j->oom) return;
    if (j->len + n + 1 > j->cap) {
        size_t nc = j->cap ? j->cap : 4096;
        while (j->len + n + 1 > nc) nc *= 2;
        char *nb = realloc(j->buf, nc);
        if (!nb) { j->oom = true; return; }
        j->buf = nb;
        j->cap = nc;
    }
    memcpy(j->buf + j->len, s, n);
    j->len += n;
    j->buf[j->len] = 0;
}

static void put(fj *j, const char *s) { fj_raw(j, s, strlen(s)); }

static void newline(fj *j) {
    if (!j->pretty) return;
    put(j, "\n");
    for (int i = 0; i < j->depth; i++) put(j, "  ");
}

/* separator before a value or key at the current depth */
static void before_item(fj *j) {
    if (j->after_key) { j->after_key = false; return; }
    if (j->depth == 0) return;
    if (!j->first[j->depth]) put(j, j->is_obj[j->depth] || !j->pretty ? "," : ", ");
    j->first[j->depth] = false;
    if (j->is_obj[j->depth]) newline(j);
}

static void open(fj *j, const char *c, bool obj) {
    before_item(j);
    put(j, c);
    if (j->depth + 1 >= FJ_MAX_DEPTH) { j->oom = true; return; }
    j->depth++;
    j->first[j->depth] = true;
    j->is_obj[j->depth] = obj;
}

static void close_(fj *j, const char *c) {
    bool empty = j->first[j->depth], obj = j->is_obj[j->depth];
    j->depth--;
    if (obj && !empty) newline(j);
    put(j, c);
}

void fj_obj_begin(fj *j) { open(j, "{", true); }
void fj_obj_end(fj *j) { close_(j, "}"); }
void fj_arr_begin(fj *j) { open(j, "[", false); }
void fj_arr_end(fj *j) { close_(j, "]"); }

static void put_escaped(fj *j, const char *s) {
    put(j, "\"");
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        const char *esc = NULL;
        char u[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20) { snprintf(u, sizeof(u), "\\u%04x", c); esc = u; }
        if (esc) {
            fj_raw(j, run, (size_t)(s - run));
            put(j, esc);
            run = s + 1;
        }
    }
    fj_raw(j, run, (size_t)(s - run));
    put(j, "\"");
}

void fj_key(fj *j, const char *k) {
    before_item(j);
    put_escaped(j, k);
    put(j, j->pretty ? ": " : ":");
    j->after_key = true;
}

void fj_str(fj *j, const char *s) {
    if (!s) { fj_null(j); return; }
    before_item(j);
    put_escaped(j, s);
}

void fj_int(fj *j, long long v) {
    char b[32];
    before_item(j);
    snprintf(b, sizeof(b), "%lld", v);
    put(j, b);
}

void fj_num(fj *j, double v) {
    char b[40];
    before_item(j);
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(b, sizeof(b), "%.*g", prec, v);
        if (strtod(b, NULL) == v) break;
    }
    /* keep floats recognisable as floats (1.0, not 1) */
    if (!strpbrk(b, ".eEn")) strncat(b, ".0", sizeof(b) - strlen(b) - 1);
    put(j, b);
}

void fj_bool(fj *j, bool v) { before_item(j); put(j, v ? "true" : "false"); }
void fj_null(fj *j) { before_item(j); put(j, "null"); }

void fj_kstr(fj *j, const char *k, const char *s) { fj_key(j, k); fj_str(j, s); }
void fj_kint(fj *j, const char *k, long long v) { fj_key(j, k); fj_int(j, v); }
void fj_knum(fj *j, const char *k, double v) { fj_key(j, k); fj_num(j, v); }
void fj_kbool(fj *j, const char *k, bool v) { fj_key(j, k); fj_bool(j, v); }
void fj_knull(fj *j, const char *k) { fj_key(j, k); fj_null(j); }

hm_status fj_write_file(fj *j, const char *path, hm_error *err) {
    if (j->oom) return hm_error_set(err, HM_ERR_NOMEM, "out of memory writing %s", path);
    FILE *f = fopen(path, "wb");
    if (!f) return hm_error_set(err, HM_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    bool ok = fwrite(j->buf, 1, j->len, f) == j->len && fputc('\n', f) != EOF;
    if (fclose(f) != 0) ok = false;
    if (!ok) return hm_error_set(err, HM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return HM_OK;
}
