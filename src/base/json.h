/* json.h - a small streaming JSON writer (objects, arrays, strings, integers, doubles, bools,
 * null) into a growing memory buffer or a FILE*.
 *
 * DESIGN: the writer keeps only a stack of open containers (to place commas and check that keys
 * appear exactly where an object expects them); values go straight to the output. Strings are
 * escaped as RFC 8259 requires and are always valid UTF-8 on output: invalid bytes in the input
 * become U+FFFD. Doubles print in the shortest form that reads back to the same value; NaN and
 * infinities (not JSON) print as null. Calls never fail individually: the first problem (misuse,
 * out of memory, write error) is remembered, later calls do nothing, and hm_json_finish reports
 * it.
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

typedef struct {
    FILE *f;                 /* output file, or NULL for the buffer */
    char *buf;               /* [len + 1] NUL-terminated output (buffer mode) */
    size_t len, cap;
    bool pretty;             /* newlines and two-space indentation */
    int depth;
    char kind[HM_JSON_MAX_DEPTH];  /* '{' or '[' per open container */
    bool empty[HM_JSON_MAX_DEPTH]; /* nothing written in it yet */
    bool want_value;         /* a key was written; its value comes next */
    bool done;               /* a complete top-level value was written */
    hm_status status;        /* first failure */
    char why[128];           /* its description */
} hm_json;

void hm_json_init_buf(hm_json *j, bool pretty);
void hm_json_init_file(hm_json *j, FILE *f, bool pretty);
void hm_json_free(hm_json *j); /* frees the buffer; does not close the file */

void hm_json_obj_begin(hm_json *j);
void hm_json_obj_end(hm_json *j);
void hm_json_arr_begin(hm_json *j);
void hm_json_arr_end(hm_json *j);
void hm_json_key(hm_json *j, const char *key);

void hm_json_str(hm_json *j, const char *s);
void hm_json_strn(hm_json *j, const char *s, size_t n); /* may contain NUL bytes */
void hm_json_int(hm_json *j, int64_t v);
void hm_json_uint(hm_json *j, uint64_t v);
void hm_json_double(hm_json *j, double v);
void hm_json_float(hm_json *j, float v); /* shortest form that reads back as this float */
void hm_json_bool(hm_json *j, bool v);
void hm_json_null(hm_json *j);

/* Checks that exactly one complete value was written and nothing failed; flushes the file. */
hm_status hm_json_finish(hm_json *j, hm_error *err);

/* The buffer's text (NUL-terminated; "" in file mode); *len gets its length if non-NULL. */
const char *hm_json_data(const hm_json *j, size_t *len);

#endif
