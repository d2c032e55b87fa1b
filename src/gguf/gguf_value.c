/* gguf_value.c - the reader's accessors: header fields, key/values by index or name, array
 * elements, tensors. Everything here reads data the open already validated, so no access can
 * leave the image; lookups by name are binary searches over the sorted indices built at open.
 * Array element accessors called with an index out of range or the wrong kind return 0 / an
 * empty value (they have no error channel).
 */
#include <inttypes.h>
#include <string.h>

#include "gguf/gguf_internal.h"

const char *gguf_vtype_name(gguf_vtype t) {
    static const char *const names[GGUF_VT_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < GGUF_VT_COUNT ? names[t] : "invalid";
}

uint32_t gguf_version(const gguf_ctx *c) { return c->version; }
uint32_t gguf_alignment(const gguf_ctx *c) { return c->alignment; }
uint64_t gguf_file_size(const gguf_ctx *c) { return c->size; }
uint64_t gguf_data_offset(const gguf_ctx *c) { return c->data_offset; }
int64_t gguf_kv_count(const gguf_ctx *c) { return c->n_kv; }
int64_t gguf_tensor_count(const gguf_ctx *c) { return c->n_tensors; }

const char *gguf_kv_key(const gguf_ctx *c, int64_t i) {
    return i >= 0 && i < c->n_kv ? c->kvs[i].key : NULL;
}

gguf_vtype gguf_kv_type(const gguf_ctx *c, int64_t i) {
    return i >= 0 && i < c->n_kv ? c->kvs[i].type : GGUF_VT_COUNT;
}

int64_t gguf_find_key(const gguf_ctx *c, const char *key) {
    int64_t lo = 0, hi = c->n_kv;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int r = strcmp(c->kvs[c->kv_sorted[mid]].key, key);
        if (r == 0) return c->kv_sorted[mid];
        if (r < 0) lo = mid + 1; else hi = mid;
    }
    return -1;
}

const gguf_tensor *gguf_tensor_at(const gguf_ctx *c, int64_t i) {
    return i >= 0 && i < c->n_tensors ? &c->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_ctx *c, const char *name) {
    int64_t lo = 0, hi = c->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const gguf_tensor *t = &c->tensors[c->tensor_sorted[mid]];
        int r = strcmp(t->name, name);
        if (r == 0) return t;
        if (r < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

/* Integer value at p of type t: signed types set *s, unsigned (and bool) set *u; returns
 * 1 signed, 2 unsigned, 0 not an integer. */
static int load_int(gguf_vtype t, const uint8_t *p, int64_t *s, uint64_t *u) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_BOOL: *u = p[0]; return 2;
    case GGUF_VT_INT8: *s = (int8_t)p[0]; return 1;
    case GGUF_VT_UINT16: *u = gguf_ld_u16(p); return 2;
    case GGUF_VT_INT16: *s = (int16_t)gguf_ld_u16(p); return 1;
    case GGUF_VT_UINT32: *u = gguf_ld_u32(p); return 2;
    case GGUF_VT_INT32: *s = (int32_t)gguf_ld_u32(p); return 1;
    case GGUF_VT_UINT64: *u = gguf_ld_u64(p); return 2;
    case GGUF_VT_INT64: *s = (int64_t)gguf_ld_u64(p); return 1;
    default: return 0;
    }
}

static double load_float(gguf_vtype t, const uint8_t *p) {
    if (t == GGUF_VT_FLOAT32) {
        uint32_t b = gguf_ld_u32(p);
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    uint64_t b = gguf_ld_u64(p);
    double d;
    memcpy(&d, &b, 8);
    return d;
}

static hm_status wrong_kind(const gguf_ctx *c, int64_t i, const char *want, hm_error *err) {
    return hm_error_set(err, HM_ERR_FORMAT, "gguf: key '%s' has type %s, expected %s",
                        c->kvs[i].key, gguf_vtype_name(c->kvs[i].type), want);
}

static hm_status bad_index(int64_t i, hm_error *err) {
    return hm_error_set(err, HM_ERR_ARG, "gguf: key index %" PRId64 " out of range", i);
}

hm_status gguf_kv_int(const gguf_ctx *c, int64_t i, int64_t *out, hm_error *err) {
    if (i < 0 || i >= c->n_kv) return bad_index(i, err);
    int64_t s = 0;
    uint64_t u = 0;
    int k = c->kvs[i].type == GGUF_VT_BOOL ? 0 : load_int(c->kvs[i].type, c->kvs[i].val, &s, &u);
    if (!k) return wrong_kind(c, i, "an integer", err);
    if (k == 2 && u > INT64_MAX)
        return hm_error_set(err, HM_ERR_RANGE, "gguf: key '%s' value %" PRIu64
                            " does not fit a signed 64-bit integer", c->kvs[i].key, u);
    *out = k == 1 ? s : (int64_t)u;
    return HM_OK;
}

hm_status gguf_kv_uint(const gguf_ctx *c, int64_t i, uint64_t *out, hm_error *err) {
    if (i < 0 || i >= c->n_kv) return bad_index(i, err);
    int64_t s = 0;
    uint64_t u = 0;
    int k = c->kvs[i].type == GGUF_VT_BOOL ? 0 : load_int(c->kvs[i].type, c->kvs[i].val, &s, &u);
    if (!k) return wrong_kind(c, i, "an integer", err);
    if (k == 1 && s < 0)
        return hm_error_set(err, HM_ERR_RANGE, "gguf: key '%s' value %" PRId64 " is negative",
                            c->kvs[i].key, s);
    *out = k == 1 ? (uint64_t)s : u;
    return HM_OK;
}

hm_status gguf_kv_float(const gguf_ctx *c, int64_t i, double *out, hm_error *err) {
    if (i < 0 || i >= c->n_kv) return bad_index(i, err);
    gguf_vtype t = c->kvs[i].type;
    if (t != GGUF_VT_FLOAT32 && t != GGUF_VT_FLOAT64) return wrong_kind(c, i, "f32 or f64", err);
    *out = load_float(t, c->kvs[i].val);
    return HM_OK;
}

hm_status gguf_kv_bool(const gguf_ctx *c, int64_t i, bool *out, hm_error *err) {
    if (i < 0 || i >= c->n_kv) return bad_index(i, err);
    if (c->kvs[i].type != GGUF_VT_BOOL) return wrong_kind(c, i, "bool", err);
    *out = c->kvs[i].val[0] != 0;
    return HM_OK;
}

hm_status gguf_kv_str(const gguf_ctx *c, int64_t i, gguf_str *out, hm_error *err) {
    if (i < 0 || i >= c->n_kv) return bad_index(i, err);
    if (c->kvs[i].type != GGUF_VT_STRING) return wrong_kind(c, i, "string", err);
    out->len = gguf_ld_u64(c->kvs[i].val);
    out->data = (const char *)c->kvs[i].val + 8;
    return HM_OK;
}

static gguf_arr arr_of(const gguf_arr_node *nd) {
    return (gguf_arr){.type = nd->type, .n = nd->n, .impl = nd};
}

hm_status gguf_kv_arr(const gguf_ctx *c, int64_t i, gguf_arr *out, hm_error *err) {
    if (i < 0 || i >= c->n_kv) return bad_index(i, err);
    if (c->kvs[i].type != GGUF_VT_ARRAY) return wrong_kind(c, i, "array", err);
    *out = arr_of(&c->nodes[c->kvs[i].node]);
    return HM_OK;
}

static hm_status not_found(const char *key, hm_error *err) {
    return hm_error_set(err, HM_ERR_NOT_FOUND, "gguf: key '%s' not found", key);
}

#define GGUF_GET_BY_NAME(fn, kvfn, T)                                                      \
    hm_status fn(const gguf_ctx *c, const char *key, T *out, hm_error *err) {              \
        int64_t i = gguf_find_key(c, key);                                                 \
        return i < 0 ? not_found(key, err) : kvfn(c, i, out, err);                         \
    }
GGUF_GET_BY_NAME(gguf_get_int, gguf_kv_int, int64_t)
GGUF_GET_BY_NAME(gguf_get_uint, gguf_kv_uint, uint64_t)
GGUF_GET_BY_NAME(gguf_get_float, gguf_kv_float, double)
GGUF_GET_BY_NAME(gguf_get_bool, gguf_kv_bool, bool)
GGUF_GET_BY_NAME(gguf_get_str, gguf_kv_str, gguf_str)
GGUF_GET_BY_NAME(gguf_get_arr, gguf_kv_arr, gguf_arr)

int64_t gguf_arr_int(const gguf_arr *arr, uint64_t i) {
    const gguf_arr_node *nd = arr->impl;
    uint64_t sz = gguf_vtype_size(nd->type);
    int64_t s = 0;
    uint64_t u = 0;
    if (i >= nd->n || !sz) return 0;
    int k = load_int(nd->type, nd->data + i * sz, &s, &u);
    return k == 1 ? s : k == 2 ? (int64_t)u : 0;
}

double gguf_arr_float(const gguf_arr *arr, uint64_t i) {
    const gguf_arr_node *nd = arr->impl;
    if (i >= nd->n || (nd->type != GGUF_VT_FLOAT32 && nd->type != GGUF_VT_FLOAT64)) return 0.0;
    return load_float(nd->type, nd->data + i * gguf_vtype_size(nd->type));
}

gguf_str gguf_arr_str(const gguf_arr *arr, uint64_t i) {
    const gguf_arr_node *nd = arr->impl;
    if (i >= nd->n || nd->type != GGUF_VT_STRING) return (gguf_str){"", 0};
    const uint8_t *p = nd->strs[i];
    return (gguf_str){.data = (const char *)p + 8, .len = gguf_ld_u64(p)};
}

gguf_arr gguf_arr_arr(const gguf_arr *arr, uint64_t i) {
    const gguf_arr_node *nd = arr->impl;
    static const gguf_arr_node empty = {.type = GGUF_VT_UINT8};
    if (i >= nd->n || nd->type != GGUF_VT_ARRAY) return arr_of(&empty);
    return arr_of(&nd->kids[i]);
}
