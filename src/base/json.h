/* json.h - JSON output through jansson: a sequential builder (objects, arrays, strings,
 * integers, doubles, bools, null) whose result goes to a FILE*, a memory buffer or a file.
 *
 * DESIGN: jansson does the JSON itself (the value tree, string escaping, number formatting,
 * indentation); this builder only lets callers emit values in document order, as they come,
 * instead of assembling and checking a tree at every call site. It keeps a stack of open
 * containers and the pending key; each value is created with jansson and attached to the
 * container on top. Calls never fail individually: the first problem (misuse, a duplicate key,
 * out of memory, a write error) is remembered, later calls do nothing, and hm_json_finish
 * reports it and writes the text. What jansson cannot do on its own is done here:
 *   - strings that are not valid UTF-8 (GGUF strings may be anything) are repaired first:
 *     each invalid byte becomes U+FFFD (jansson refuses invalid UTF-8); NUL bytes are kept
 *     (written as \u0000);
 *   - NaN and infinities (not JSON; jansson refuses them) become null;
 *   - jansson's integers are signed 64-bit, so an unsigned value above INT64_MAX is written as
 *     a JSON real (its nearest double); every count hotmoe writes is far below that.
 * Numbers: integers print as integers; reals print as jansson does (17 significant digits,
 * which read back to the same double, and always with a '.' or an exponent: 3.0, 1e-07).
 * Pretty output is two-space indented with one value per line; compact output has no spaces.
 *
 *   hm_json j; hm_json_init_buf(&j, true);
 *   hm_json_obj_begin(&j); hm_json_key(&j, "n"); hm_json_int(&j, 3); hm_json_obj_end(&j);
 *   if (hm_json_finish(&j, &err) == HM_OK) puts(hm_json_data(&j, NULL));
 *   hm_json_free(&j);
 */
#ifndef HM_BASE_JSON_H
#define HM_BASE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

#define HM_JSON_MAX_DEPTH 64

struct json_t; /* jansson's value (jansson.h is needed only by json.c and by readers) */

typedef struct {
    FILE *f;                                   /* output file, or NULL for the buffer */
    bool pretty;                               /* newlines and two-space indentation */
    struct json_t *root;                       /* the document being built */
    struct json_t *open[HM_JSON_MAX_DEPTH];    /* open containers, innermost last (borrowed) */
    int depth;
    char *key;                                 /* the pending key (owned), or NULL */
    char *text;                                /* buffer mode: the text, after hm_json_finish */
    size_t len;
    hm_status status;                          /* first failure */
    char why[128];                             /* its description */
} hm_json;

void hm_json_init_buf(hm_json *j, bool pretty);
void hm_json_init_file(hm_json *j, FILE *f, bool pretty);
void hm_json_free(hm_json *j); /* frees the tree and the text; does not close the file */

void hm_json_obj_begin(hm_json *j);
void hm_json_obj_end(hm_json *j);
void hm_json_arr_begin(hm_json *j);
void hm_json_arr_end(hm_json *j);
void hm_json_key(hm_json *j, const char *key); /* a key given twice in one object is an error */

void hm_json_str(hm_json *j, const char *s);            /* NULL writes null */
void hm_json_strn(hm_json *j, const char *s, size_t n); /* may contain NUL bytes */
void hm_json_int(hm_json *j, int64_t v);
void hm_json_uint(hm_json *j, uint64_t v);
void hm_json_double(hm_json *j, double v);
void hm_json_float(hm_json *j, float v); /* the shortest decimal that reads back as this float,
                                          * written as a double (reads back to that decimal) */
void hm_json_bool(hm_json *j, bool v);
void hm_json_null(hm_json *j);

/* key + value in one call */
void hm_json_kstr(hm_json *j, const char *key, const char *s); /* s NULL writes null */
void hm_json_kint(hm_json *j, const char *key, int64_t v);
void hm_json_kuint(hm_json *j, const char *key, uint64_t v);
void hm_json_kdouble(hm_json *j, const char *key, double v);
void hm_json_kbool(hm_json *j, const char *key, bool v);
void hm_json_knull(hm_json *j, const char *key);

/* Checks that exactly one complete value was written and nothing failed, then writes the text:
 * to the file (flushed; no trailing newline) or into the buffer (hm_json_data). */
hm_status hm_json_finish(hm_json *j, hm_error *err);

/* The buffer's text after hm_json_finish (NUL-terminated; "" before, or in file mode); *len gets
 * its length if non-NULL. */
const char *hm_json_data(const hm_json *j, size_t *len);

/* Buffer mode: hm_json_finish, then the text and a newline written to path (created or
 * truncated); errors name the path. Frees nothing. */
hm_status hm_json_write_file(hm_json *j, const char *path, hm_error *err);

/* The whole of the file at path in a malloc'd buffer (*buf, *len bytes; the caller frees it),
 * for readers that parse the text themselves (and name their origin in errors). Errors name the
 * path: HM_ERR_IO (cannot open or read), HM_ERR_NOMEM. */
hm_status hm_file_read_all(const char *path, char **buf, size_t *len, hm_error *err);

#endif
