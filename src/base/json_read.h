/* json_read.h - the checks every JSON file reader shares (learn files, routing profiles): one
 * line per violation, "ORIGIN: FIELD: problem", returning its status.
 *
 * DESIGN: a reader walks jansson's tree and stops at the first violation; fields are named as
 * the walk descends ("layers[3].experts[7]"). Needs jansson.h (readers parse with jansson).
 */
#ifndef HM_BASE_JSON_READ_H
#define HM_BASE_JSON_READ_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    const char *origin; /* the file's name in messages */
    hm_error *err;
} hm_json_reader;

/* text as one JSON value (duplicate keys refused) into *root (json_decref it); invalid JSON is
 * HM_ERR_FORMAT "ORIGIN:LINE:COLUMN: not valid JSON: ...". */
hm_status hm_json_parse(const hm_json_reader *r, const char *text, size_t len, json_t **root);
/* Sets r->err to "ORIGIN: FIELD: message" and returns st. */
__attribute__((format(printf, 4, 5)))
hm_status hm_json_fail(const hm_json_reader *r, hm_status st, const char *field, const char *fmt,
                       ...);
/* "an object", "an array", "a string", ..., "null": for "must be X, not Y". */
const char *hm_json_type_name(const json_t *v);
/* where.key (key alone when where is ""). */
void hm_json_field(char *buf, size_t n, const char *where, const char *key);
/* A count: a JSON integer >= 0. */
hm_status hm_json_as_count(const hm_json_reader *r, const json_t *v, const char *field,
                           uint64_t *out);
/* obj[key] as a count; required unless present is non-NULL (then *present says). */
hm_status hm_json_get_count(const hm_json_reader *r, const json_t *obj, const char *key,
                            const char *where, uint64_t *out, bool *present);

#endif
