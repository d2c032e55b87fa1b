/* json_read.c - the checks JSON file readers share (json_read.h). */
#include "base/json_read.h"

#include <stdarg.h>
#include <stdio.h>

hm_status hm_json_parse(const hm_json_reader *r, const char *text, size_t len, json_t **root) {
    json_error_t je;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!*root)
        return hm_error_set(r->err, HM_ERR_FORMAT, "%s:%d:%d: not valid JSON: %s", r->origin,
                            je.line, je.column, je.text);
    return HM_OK;
}

hm_status hm_json_fail(const hm_json_reader *r, hm_status st, const char *field, const char *fmt,
                       ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return hm_error_set(r->err, st, "%s: %s: %s", r->origin, field, msg);
}

const char *hm_json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

void hm_json_field(char *buf, size_t n, const char *where, const char *key) {
    snprintf(buf, n, "%s%s%s", where, *where ? "." : "", key);
}

hm_status hm_json_as_count(const hm_json_reader *r, const json_t *v, const char *field,
                           uint64_t *out) {
    if (!json_is_integer(v))
        return hm_json_fail(r, HM_ERR_FORMAT, field, "must be a non-negative integer, not %s",
                            hm_json_type_name(v));
    json_int_t i = json_integer_value(v);
    if (i < 0)
        return hm_json_fail(r, HM_ERR_FORMAT, field,
                            "must not be negative (%" JSON_INTEGER_FORMAT ")", i);
    *out = (uint64_t)i;
    return HM_OK;
}

hm_status hm_json_get_count(const hm_json_reader *r, const json_t *obj, const char *key,
                            const char *where, uint64_t *out, bool *present) {
    char field[192];
    hm_json_field(field, sizeof(field), where, key);
    const json_t *v = json_object_get(obj, key);
    *out = 0;
    if (present) *present = v != NULL;
    if (!v) return present ? HM_OK : hm_json_fail(r, HM_ERR_FORMAT, field, "missing");
    return hm_json_as_count(r, v, field, out);
}
