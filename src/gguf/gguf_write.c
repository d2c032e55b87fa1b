/* gguf_write.c - the streaming GGUF writer (version 3, little endian), laid out exactly as
 * llama.cpp's gguf_write and gguf-py write: header, key/values, tensor infos, zero padding to
 * the alignment, then each tensor's bytes followed by zero padding to the alignment, so every
 * tensor offset (relative to the data section) is a multiple of the alignment.
 *
 * DESIGN: key/values are encoded into one growing byte buffer as they are set (arrays of
 * arrays patch their element count when closed); tensor infos are kept in a table; nothing of
 * the tensor data is held, so memory is bounded by the metadata. Calls that are merely wrong
 * (repeated key, bad shape) fail without harming the writer; an I/O failure makes every later
 * call fail, and gguf_writer_close removes the incomplete file.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf_internal.h"
#include "quant/qtypes.h"

#define GGUF_MAX_NAME 64 /* llama.cpp refuses tensor names of 64 bytes or more */

typedef struct {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t size, offset; /* bytes; offset from the data section start */
} wtensor;

enum { W_DECLARE, W_DATA, W_FAILED };

struct gguf_writer {
    FILE *f;
    char *path;
    char *iobuf;
    hm_error err;
    int state;
    uint32_t alignment;
    uint8_t *kv; /* [kv_len] encoded key/values */
    size_t kv_len, kv_cap;
    char **keys; /* [n_kv] top-level keys, for duplicate checks */
    uint64_t n_kv, cap_keys;
    int depth;                              /* open arrays of arrays */
    size_t count_at[GGUF_MAX_NESTING];      /* kv offset of each open array's count */
    uint64_t count[GGUF_MAX_NESTING];       /* elements so far */
    wtensor *tensors; /* [n_tensors] */
    int64_t n_tensors, cap_tensors;
    uint64_t data_size; /* padded bytes of all tensors */
    int64_t cur;        /* tensor being written */
    uint64_t cur_done;  /* its bytes written so far */
    uint64_t pos;       /* bytes written to the file */
};

static hm_status wfail(gguf_writer *w, hm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static hm_status wfail(gguf_writer *w, hm_status st, const char *fmt, ...) {
    char body[HM_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof(body), fmt, ap);
    va_end(ap);
    return hm_error_set(&w->err, st, "gguf writer: %s", body);
}

static hm_status put(gguf_writer *w, const void *p, size_t n) {
    if (!n) return HM_OK;
    if (n > w->kv_cap - w->kv_len) {
        size_t cap = w->kv_cap ? w->kv_cap * 2 : 1024;
        while (cap - w->kv_len < n) cap *= 2;
        uint8_t *q = realloc(w->kv, cap);
        if (!q) return wfail(w, HM_ERR_NOMEM, "metadata buffer of %zu bytes", cap);
        w->kv = q;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return HM_OK;
}

static void enc_u32(uint8_t *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void enc_u64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

static hm_status put_u32(gguf_writer *w, uint32_t v) {
    uint8_t b[4];
    enc_u32(b, v);
    return put(w, b, 4);
}
static hm_status put_u64(gguf_writer *w, uint64_t v) {
    uint8_t b[8];
    enc_u64(b, v);
    return put(w, b, 8);
}
static hm_status put_str(gguf_writer *w, const char *s) {
    size_t n = strlen(s);
    hm_status st = put_u64(w, n);
    return st ? st : put(w, s, n);
}

/* Starts a value: with a key, a new top-level key/value of type t; without, the next element
 * of the innermost open array of arrays (t must then be GGUF_VT_ARRAY). */
static hm_status begin_value(gguf_writer *w, const char *key, gguf_vtype t) {
    if (w->state == W_FAILED) return w->err.status;
    if (w->state != W_DECLARE)
        return wfail(w, HM_ERR_STATE, "key/values must be set before gguf_writer_begin_data");
    if (!key) {
        if (!w->depth || t != GGUF_VT_ARRAY)
            return wfail(w, HM_ERR_ARG, "a NULL key is only allowed for an array element of an "
                         "open array of arrays");
        w->count[w->depth - 1]++;
        return HM_OK;
    }
    if (w->depth)
        return wfail(w, HM_ERR_STATE, "key '%s' set while an array of arrays is open", key);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return wfail(w, HM_ERR_ARG, "repeated key '%s'", key);
    if (!strcmp(key, "general.alignment") && t != GGUF_VT_UINT32)
        return wfail(w, HM_ERR_ARG, "general.alignment must be u32, not %s", gguf_vtype_name(t));
    if (w->n_kv == w->cap_keys) {
        uint64_t cap = w->cap_keys ? w->cap_keys * 2 : 32;
        char **k = realloc(w->keys, cap * sizeof(*k));
        if (!k) return wfail(w, HM_ERR_NOMEM, "key table");
        w->keys = k;
        w->cap_keys = cap;
    }
    char *dup = strdup(key);
    if (!dup) return wfail(w, HM_ERR_NOMEM, "key '%s'", key);
    size_t mark = w->kv_len;
    hm_status st = put_str(w, key);
    if (!st) st = put_u32(w, (uint32_t)t);
    if (st) {
        w->kv_len = mark;
        free(dup);
        return st;
    }
    w->keys[w->n_kv++] = dup;
    return HM_OK;
}

static hm_status set_scalar(gguf_writer *w, const char *key, gguf_vtype t, const void *le, size_t n) {
    hm_status st = begin_value(w, key, t);
    return st ? st : put(w, le, n);
}

#define GGUF_SETTER(fn, T, VT, ENC_T)                                                       \
    hm_status fn(gguf_writer *w, const char *key, T v) {                                    \
        uint8_t b[8];                                                                       \
        ENC_T u;                                                                            \
        memcpy(&u, &v, sizeof(u));                                                          \
        for (size_t i = 0; i < sizeof(u); i++) b[i] = (uint8_t)((uint64_t)u >> (8 * i));   \
        return set_scalar(w, key, VT, b, sizeof(u));                                        \
    }
GGUF_SETTER(gguf_writer_set_u8, uint8_t, GGUF_VT_UINT8, uint8_t)
GGUF_SETTER(gguf_writer_set_i8, int8_t, GGUF_VT_INT8, uint8_t)
GGUF_SETTER(gguf_writer_set_u16, uint16_t, GGUF_VT_UINT16, uint16_t)
GGUF_SETTER(gguf_writer_set_i16, int16_t, GGUF_VT_INT16, uint16_t)
GGUF_SETTER(gguf_writer_set_i32, int32_t, GGUF_VT_INT32, uint32_t)
GGUF_SETTER(gguf_writer_set_u64, uint64_t, GGUF_VT_UINT64, uint64_t)
GGUF_SETTER(gguf_writer_set_i64, int64_t, GGUF_VT_INT64, uint64_t)
GGUF_SETTER(gguf_writer_set_f32, float, GGUF_VT_FLOAT32, uint32_t)
GGUF_SETTER(gguf_writer_set_f64, double, GGUF_VT_FLOAT64, uint64_t)

hm_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) {
    if (key && !strcmp(key, "general.alignment") && (v == 0 || (v & (v - 1))))
        return wfail(w, HM_ERR_ARG, "general.alignment %u is not a non-zero power of two", v);
    uint8_t b[4];
    enc_u32(b, v);
    hm_status st = set_scalar(w, key, GGUF_VT_UINT32, b, 4);
    if (!st && key && !strcmp(key, "general.alignment")) w->alignment = v;
    return st;
}

hm_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, GGUF_VT_BOOL, &b, 1);
}

hm_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) {
    hm_status st = begin_value(w, key, GGUF_VT_STRING);
    return st ? st : put_str(w, v);
}

hm_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type,
                              const void *data, uint64_t n) {
    uint64_t sz = gguf_vtype_size(elem_type);
    if (!sz) return wfail(w, HM_ERR_ARG, "array '%s': element type %s is not fixed-size",
                          key ? key : "(element)", gguf_vtype_name(elem_type));
    if (n > SIZE_MAX / sz) return wfail(w, HM_ERR_ARG, "array length %" PRIu64 " too large", n);
    hm_status st = begin_value(w, key, GGUF_VT_ARRAY);
    if (!st) st = put_u32(w, (uint32_t)elem_type);
    if (!st) st = put_u64(w, n);
    if (st) return st;
    /* Elements are stored little endian; the host is too (x86-64, aarch64). */
    if (elem_type == GGUF_VT_BOOL) {
        for (uint64_t i = 0; i < n && !st; i++) {
            uint8_t b = ((const uint8_t *)data)[i] ? 1 : 0;
            st = put(w, &b, 1);
        }
        return st;
    }
    return put(w, data, (size_t)(n * sz));
}

hm_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                                  uint64_t n) {
    hm_status st = begin_value(w, key, GGUF_VT_ARRAY);
    if (!st) st = put_u32(w, GGUF_VT_STRING);
    if (!st) st = put_u64(w, n);
    for (uint64_t i = 0; i < n && !st; i++) st = put_str(w, strs[i] ? strs[i] : "");
    return st;
}

hm_status gguf_writer_begin_arr_arr(gguf_writer *w, const char *key) {
    if (w->depth >= GGUF_MAX_NESTING - 1)
        return wfail(w, HM_ERR_ARG, "arrays nested deeper than %d", GGUF_MAX_NESTING);
    hm_status st = begin_value(w, key, GGUF_VT_ARRAY);
    if (!st) st = put_u32(w, GGUF_VT_ARRAY);
    if (st) return st;
    w->count_at[w->depth] = w->kv_len;
    w->count[w->depth] = 0;
    st = put_u64(w, 0);
    if (!st) w->depth++;
    return st;
}

hm_status gguf_writer_end_arr_arr(gguf_writer *w) {
    if (w->state == W_FAILED) return w->err.status;
    if (!w->depth) return wfail(w, HM_ERR_STATE, "no array of arrays is open");
    w->depth--;
    enc_u64(w->kv + w->count_at[w->depth], w->count[w->depth]);
    return HM_OK;
}

hm_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const int64_t *ne) {
    if (w->state == W_FAILED) return w->err.status;
    if (w->state != W_DECLARE)
        return wfail(w, HM_ERR_STATE, "tensor '%s' declared after gguf_writer_begin_data", name);
    size_t len = strlen(name);
    if (len == 0 || len >= GGUF_MAX_NAME)
        return wfail(w, HM_ERR_ARG, "tensor name '%s' must have 1..%d bytes", name, GGUF_MAX_NAME - 1);
    const hm_type_info *ti = hm_type_get(type);
    if (!ti) return wfail(w, HM_ERR_ARG, "tensor '%s': unknown type %u", name, type);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return wfail(w, HM_ERR_ARG, "tensor '%s': n_dims %u outside 1..%d", name, n_dims, GGUF_MAX_DIMS);
    wtensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1)
            return wfail(w, HM_ERR_ARG, "tensor '%s': ne[%u] = %" PRId64 " < 1", name, d, ne[d]);
        t.ne[d] = ne[d];
    }
    if (t.ne[0] % ti->block_size)
        return wfail(w, HM_ERR_ARG, "tensor '%s': ne[0] = %" PRId64 " is not a multiple of %d (%s)",
                     name, t.ne[0], ti->block_size, ti->name);
    uint64_t bytes = (uint64_t)(t.ne[0] / ti->block_size);
    int64_t elems = t.ne[0];
    if (__builtin_mul_overflow(bytes, (uint64_t)ti->type_size, &bytes))
        return wfail(w, HM_ERR_ARG, "tensor '%s': size overflows", name);
    for (int d = 1; d < GGUF_MAX_DIMS; d++)
        if (__builtin_mul_overflow(bytes, (uint64_t)t.ne[d], &bytes) ||
            __builtin_mul_overflow(elems, t.ne[d], &elems))
            return wfail(w, HM_ERR_ARG, "tensor '%s': size overflows", name);
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name)) return wfail(w, HM_ERR_ARG, "repeated tensor '%s'", name);
    if (w->n_tensors == w->cap_tensors) {
        int64_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        wtensor *q = realloc(w->tensors, (size_t)cap * sizeof(*q));
        if (!q) return wfail(w, HM_ERR_NOMEM, "tensor table");
        w->tensors = q;
        w->cap_tensors = cap;
    }
    if (!(t.name = strdup(name))) return wfail(w, HM_ERR_NOMEM, "tensor name");
    t.size = bytes;
    /* offsets are assigned at begin_data, once the alignment is final */
    w->tensors[w->n_tensors++] = t;
    return HM_OK;
}

static hm_status out(gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->f) != n) {
        w->state = W_FAILED;
        return wfail(w, HM_ERR_IO, "write to %s failed at byte %" PRIu64 ": %s", w->path, w->pos,
                     strerror(errno));
    }
    w->pos += n;
    return HM_OK;
}

static hm_status out_pad(gguf_writer *w) {
    static const uint8_t zeros[4096];
    hm_status st = HM_OK;
    while (!st && w->pos % w->alignment) {
        uint64_t n = w->alignment - w->pos % w->alignment;
        st = out(w, zeros, n < sizeof(zeros) ? (size_t)n : sizeof(zeros));
    }
    return st;
}

/* Moves past finished tensors, padding after each. */
static hm_status advance(gguf_writer *w) {
    hm_status st = HM_OK;
    while (!st && w->cur < w->n_tensors && w->cur_done == w->tensors[w->cur].size) {
        st = out_pad(w);
        w->cur++;
        w->cur_done = 0;
    }
    return st;
}

hm_status gguf_writer_begin_data(gguf_writer *w) {
    if (w->state == W_FAILED) return w->err.status;
    if (w->state != W_DECLARE) return wfail(w, HM_ERR_STATE, "gguf_writer_begin_data called twice");
    if (w->depth) return wfail(w, HM_ERR_STATE, "an array of arrays is still open");
    uint64_t a = w->alignment, off = 0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        wtensor *t = &w->tensors[i];
        t->offset = off;
        uint64_t padded = (t->size + a - 1) / a * a;
        if (padded < t->size || off + padded < off)
            return wfail(w, HM_ERR_ARG, "data section exceeds 64 bits at tensor '%s'", t->name);
        off += padded;
    }
    w->data_size = off;
    w->state = W_DATA;
    uint8_t h[24];
    memcpy(h, GGUF_MAGIC, 4);
    enc_u32(h + 4, 3);
    enc_u64(h + 8, (uint64_t)w->n_tensors);
    enc_u64(h + 16, w->n_kv);
    hm_status st = out(w, h, sizeof(h));
    if (!st) st = out(w, w->kv, w->kv_len);
    for (int64_t i = 0; i < w->n_tensors && !st; i++) {
        const wtensor *t = &w->tensors[i];
        uint8_t b[8 + GGUF_MAX_NAME + 4 + 8 * GGUF_MAX_DIMS + 4 + 8];
        size_t len = strlen(t->name), o = 0;
        enc_u64(b, len);
        memcpy(b + 8, t->name, len);
        o = 8 + len;
        enc_u32(b + o, t->n_dims);
        o += 4;
        for (uint32_t d = 0; d < t->n_dims; d++, o += 8) enc_u64(b + o, (uint64_t)t->ne[d]);
        enc_u32(b + o, t->type);
        enc_u64(b + o + 4, t->offset);
        st = out(w, b, o + 12);
    }
    if (!st) st = out_pad(w);
    w->cur = 0;
    w->cur_done = 0;
    return st;
}

hm_status gguf_writer_write(gguf_writer *w, const void *data, size_t n) {
    if (w->state == W_FAILED) return w->err.status;
    if (w->state != W_DATA) return wfail(w, HM_ERR_STATE, "tensor data written before begin_data");
    const uint8_t *p = data;
    while (n) {
        if (w->cur >= w->n_tensors)
            return wfail(w, HM_ERR_ARG, "%zu bytes written past the last tensor's data", n);
        const wtensor *t = &w->tensors[w->cur];
        uint64_t left = t->size - w->cur_done;
        size_t take = n < left ? n : (size_t)left;
        hm_status st = out(w, p, take);
        if (st) return st;
        w->cur_done += take;
        p += take;
        n -= take;
        if ((st = advance(w))) return st;
    }
    return HM_OK;
}

static void writer_free(gguf_writer *w) {
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (int64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->keys);
    free(w->tensors);
    free(w->kv);
    free(w->path);
    free(w->iobuf);
    free(w);
}

hm_status gguf_writer_close(gguf_writer *w, hm_error *err) {
    if (!w) return HM_OK;
    hm_status st = w->state == W_FAILED ? w->err.status : HM_OK;
    if (!st && w->state == W_DECLARE) st = gguf_writer_begin_data(w);
    if (!st && w->cur < w->n_tensors) {
        const wtensor *t = &w->tensors[w->cur];
        st = wfail(w, HM_ERR_STATE, "tensor %" PRId64 " '%s': %" PRIu64 " of %" PRIu64
                   " bytes written", w->cur, t->name, w->cur_done, t->size);
    }
    if (fclose(w->f) != 0 && !st)
        st = wfail(w, HM_ERR_IO, "closing %s failed: %s", w->path, strerror(errno));
    if (st) {
        unlink(w->path);
        hm_error_set(err, st, "%s", w->err.msg);
    }
    writer_free(w);
    return st;
}

const char *gguf_writer_errmsg(const gguf_writer *w) { return w->err.msg; }

hm_status gguf_writer_open(const char *path, gguf_writer **outw, hm_error *err) {
    *outw = NULL;
    gguf_writer *w = calloc(1, sizeof(*w));
    if (!w) return hm_error_set(err, HM_ERR_NOMEM, "gguf writer: context");
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    w->path = strdup(path);
    w->iobuf = malloc(1 << 20);
    if (!w->path || !w->iobuf) {
        writer_free(w);
        return hm_error_set(err, HM_ERR_NOMEM, "gguf writer: buffers");
    }
    w->f = fopen(path, "wb");
    if (!w->f) {
        int e = errno;
        writer_free(w);
        return hm_error_set(err, HM_ERR_IO, "gguf writer: cannot create %s: %s", path, strerror(e));
    }
    setvbuf(w->f, w->iobuf, _IOFBF, 1 << 20);
    *outw = w;
    return HM_OK;
}
