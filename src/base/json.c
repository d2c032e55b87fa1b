/* json.c - the JSON builder over jansson (see json.h). */
#include "base/json.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void json_fail(hm_json *j, hm_status st, const char *why) {
    if (j->status) return;
    j->status = st;
    snprintf(j->why, sizeof(j->why), "%s", why);
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
    json_decref(j->root);
    free(j->key);
    free(j->text);
    j->root = NULL;
    j->key = j->text = NULL;
    j->depth = 0;
    j->len = 0;
}

/* ---- strings: jansson takes valid UTF-8 only ---- */

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

/* s[0..n) as valid UTF-8: NULL if it already is (use s), else a malloc'd copy with each invalid
 * byte replaced by U+FFFD (EF BF BD), NUL-terminated, its length in *out_n. *oom on failure. */
static char *utf8_repair(const char *s, size_t n, size_t *out_n, bool *oom) {
    const unsigned char *u = (const unsigned char *)s;
    size_t bad = 0;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_len(u + i, n - i);
        if (!l) bad++, l = 1;
        i += l;
    }
    *oom = false;
    if (!bad) return NULL;
    char *r = malloc(n + 2 * bad + 1); /* each bad byte grows by 2 */
    if (!r) {
        *oom = true;
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_len(u + i, n - i);
        if (l) {
            memcpy(r + o, s + i, l);
            o += l;
            i += l;
        } else {
            memcpy(r + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    r[o] = '\0';
    *out_n = o;
    return r;
}

static json_t *make_string(const char *s, size_t n) {
    size_t rn = 0;
    bool oom;
    char *r = utf8_repair(s, n, &rn, &oom);
    if (oom) return NULL;
    json_t *v = r ? json_stringn_nocheck(r, rn) : json_stringn_nocheck(s, n);
    free(r);
    return v;
}

/* ---- the tree ---- */

/* Attaches v (a new reference, stolen; NULL = out of memory) where the document expects the next
 * value. False (v released) on failure. */
static bool attach(hm_json *j, json_t *v) {
    if (j->status) {
        json_decref(v);
        return false;
    }
    if (!v) {
        json_fail(j, HM_ERR_NOMEM, "out of memory");
        return false;
    }
    if (j->depth == 0) {
        if (j->root) {
            json_decref(v);
            json_fail(j, HM_ERR_STATE, "a second top-level value");
            return false;
        }
        j->root = v;
        return true;
    }
    json_t *top = j->open[j->depth - 1];
    if (json_is_object(top)) {
        if (!j->key) {
            json_decref(v);
            json_fail(j, HM_ERR_STATE, "a value in an object without a key");
            return false;
        }
        int rc = json_object_set_new_nocheck(top, j->key, v);
        free(j->key);
        j->key = NULL;
        if (rc) json_fail(j, HM_ERR_NOMEM, "out of memory");
        return !rc;
    }
    if (json_array_append_new(top, v)) {
        json_fail(j, HM_ERR_NOMEM, "out of memory");
        return false;
    }
    return true;
}

static void open_container(hm_json *j, json_t *c) {
    if (!j->status && j->depth == HM_JSON_MAX_DEPTH) {
        json_decref(c);
        json_fail(j, HM_ERR_STATE, "nesting deeper than HM_JSON_MAX_DEPTH");
        return;
    }
    if (attach(j, c)) j->open[j->depth++] = c; /* borrowed: its parent (or root) owns it */
}

static void close_container(hm_json *j, bool obj) {
    if (j->status) return;
    if (j->depth == 0 || json_is_object(j->open[j->depth - 1]) != obj || j->key) {
        json_fail(j, HM_ERR_STATE, obj ? "unbalanced hm_json_obj_end" : "unbalanced hm_json_arr_end");
        return;
    }
    j->depth--;
}

void hm_json_obj_begin(hm_json *j) { open_container(j, json_object()); }
void hm_json_obj_end(hm_json *j) { close_container(j, true); }
void hm_json_arr_begin(hm_json *j) { open_container(j, json_array()); }
void hm_json_arr_end(hm_json *j) { close_container(j, false); }

void hm_json_key(hm_json *j, const char *key) {
    if (j->status) return;
    if (j->depth == 0 || !json_is_object(j->open[j->depth - 1]) || j->key) {
        json_fail(j, HM_ERR_STATE, "a key outside an object or where a value was expected");
        return;
    }
    size_t n = strlen(key), rn = 0;
    bool oom;
    char *r = utf8_repair(key, n, &rn, &oom);
    if (!r && !oom) r = strdup(key);
    if (!r) {
        json_fail(j, HM_ERR_NOMEM, "out of memory");
        return;
    }
    if (json_object_get(j->open[j->depth - 1], r)) {
        char why[sizeof(j->why)];
        snprintf(why, sizeof(why), "key \"%.80s\" given twice in one object", r);
        free(r);
        json_fail(j, HM_ERR_STATE, why);
        return;
    }
    j->key = r;
}

void hm_json_strn(hm_json *j, const char *s, size_t n) {
    if (!j->status) attach(j, make_string(s, n));
}

void hm_json_str(hm_json *j, const char *s) {
    if (!s) hm_json_null(j);
    else hm_json_strn(j, s, strlen(s));
}

void hm_json_int(hm_json *j, int64_t v) {
    if (!j->status) attach(j, json_integer((json_int_t)v));
}

void hm_json_uint(hm_json *j, uint64_t v) {
    if (j->status) return;
    attach(j, v <= (uint64_t)INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v));
}

void hm_json_double(hm_json *j, double v) {
    if (!j->status) attach(j, isfinite(v) ? json_real(v) : json_null());
}

void hm_json_float(hm_json *j, float v) {
    if (j->status) return;
    if (!isfinite(v)) {
        attach(j, json_null());
        return;
    }
    char b[40];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(b, sizeof(b), "%.*g", prec, (double)v);
        if (strtof(b, NULL) == v) break;
    }
    attach(j, json_real(strtod(b, NULL)));
}

void hm_json_bool(hm_json *j, bool v) {
    if (!j->status) attach(j, json_boolean(v));
}

void hm_json_null(hm_json *j) {
    if (!j->status) attach(j, json_null());
}

void hm_json_kstr(hm_json *j, const char *key, const char *s) { hm_json_key(j, key); hm_json_str(j, s); }
void hm_json_kint(hm_json *j, const char *key, int64_t v) { hm_json_key(j, key); hm_json_int(j, v); }
void hm_json_kuint(hm_json *j, const char *key, uint64_t v) { hm_json_key(j, key); hm_json_uint(j, v); }
void hm_json_kdouble(hm_json *j, const char *key, double v) { hm_json_key(j, key); hm_json_double(j, v); }
void hm_json_kbool(hm_json *j, const char *key, bool v) { hm_json_key(j, key); hm_json_bool(j, v); }
void hm_json_knull(hm_json *j, const char *key) { hm_json_key(j, key); hm_json_null(j); }

/* ---- output ---- */

hm_status hm_json_finish(hm_json *j, hm_error *err) {
    if (!j->status && (j->depth || !j->root))
        json_fail(j, HM_ERR_STATE, j->depth ? "unclosed object or array" : "no value written");
    if (!j->status) {
        size_t flags = JSON_ENCODE_ANY | (j->pretty ? JSON_INDENT(2) : JSON_COMPACT);
        if (j->f) {
            errno = 0;
            if (json_dumpf(j->root, j->f, flags) != 0 || fflush(j->f) != 0)
                json_fail(j, HM_ERR_IO, errno ? strerror(errno) : "write error");
        } else {
            free(j->text);
            j->text = json_dumps(j->root, flags);
            if (!j->text) json_fail(j, HM_ERR_NOMEM, "out of memory");
            else j->len = strlen(j->text);
        }
    }
    if (j->status) return hm_error_set(err, j->status, "json: %s", j->why);
    return HM_OK;
}

const char *hm_json_data(const hm_json *j, size_t *len) {
    if (len) *len = j->text ? j->len : 0;
    return j->text ? j->text : "";
}

hm_status hm_json_write_file(hm_json *j, const char *path, hm_error *err) {
    if (j->f) return hm_error_set(err, HM_ERR_STATE, "json: hm_json_write_file needs buffer mode");
    hm_status st = hm_json_finish(j, err);
    if (st != HM_OK) return st;
    FILE *f = fopen(path, "wb");
    if (!f) return hm_error_set(err, HM_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    bool ok = fwrite(j->text, 1, j->len, f) == j->len && fputc('\n', f) != EOF;
    if (fclose(f) != 0) ok = false;
    if (!ok) return hm_error_set(err, HM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return HM_OK;
}

hm_status hm_file_read_all(const char *path, char **buf, size_t *len, hm_error *err) {
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return hm_error_set(err, HM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    char *b = NULL;
    size_t n = 0, cap = 0;
    hm_status st = HM_OK;
    for (;;) {
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 65536;
            char *nb = nc > cap ? realloc(b, nc) : NULL;
            if (!nb) {
                st = hm_error_set(err, HM_ERR_NOMEM, "%s: out of memory reading it", path);
                break;
            }
            b = nb;
            cap = nc;
        }
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) st = hm_error_set(err, HM_ERR_IO, "cannot read %s: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (st != HM_OK) {
        free(b);
        return st;
    }
    *buf = b;
    *len = n;
    return HM_OK;
}
