/* gguf_read.c - opening and validating a GGUF image (versions 2 and 3, little endian).
 *
 * DESIGN: one forward pass over the image with a bounds-checked cursor parses the header, every
 * key/value (recursing into nested arrays, at most GGUF_MAX_NESTING deep) and the tensor table;
 * every read first checks that its bytes exist, and every count is checked against the bytes
 * that remain before anything is allocated for it, so memory stays proportional to the
 * metadata. Keys and names go into a growing arena, array nodes and string pointers into two
 * growing pools; all are addressed by index while parsing and turned into pointers once at the
 * end. Then whole-file checks run: duplicate keys and names (by sorting), `general.alignment`,
 * and the tensors' data ranges (aligned, inside the file, not overlapping). Every failure is
 * one line "gguf: <item>: <problem> at byte <offset>".
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf_internal.h"
#include "quant/qtypes.h"

/* Minimal encoded sizes, used to reject impossible counts before allocating. */
#define MIN_KV_BYTES 13     /* key length (8) + type (4) + smallest value (1) */
#define MIN_TENSOR_BYTES 32 /* name length (8) + n_dims (4) + ne[0] (8) + type (4) + offset (8) */
#define MIN_ARR_BYTES 12    /* element type (4) + count (8) */

typedef struct {
    gguf_ctx *c;
    const uint8_t *b; /* [size] */
    uint64_t size;
    uint64_t pos;
    hm_error *err;
    char what[160]; /* item being parsed: "header", "key 3 'general.name'", "tensor 7 'x'" */
    size_t arena_len, arena_cap;
} parser;

/* Copies a file string for a message: printable ASCII only, at most 64 characters. */
static void msg_name(char *dst, size_t cap, const uint8_t *s, uint64_t len) {
    size_t o = 0;
    for (uint64_t i = 0; i < len && o + 4 < cap; i++) {
        if (i == 64) {
            memcpy(dst + o, "...", 3);
            o += 3;
            break;
        }
        dst[o++] = (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\'') ? (char)s[i] : '?';
    }
    dst[o] = '\0';
}

static hm_status fail(parser *p, hm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static hm_status fail(parser *p, hm_status st, const char *fmt, ...) {
    char body[HM_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof(body), fmt, ap);
    va_end(ap);
    return hm_error_set(p->err, st, "gguf: %s: %s", p->what, body);
}

/* Checks that n bytes of `field` exist at the cursor. */
static hm_status need(parser *p, uint64_t n, const char *field) {
    if (n <= p->size - p->pos) return HM_OK;
    return fail(p, HM_ERR_FORMAT, "%s (%" PRIu64 " bytes) at byte %" PRIu64
                " extends past end of file (size %" PRIu64 ")", field, n, p->pos, p->size);
}

static hm_status get_u32(parser *p, const char *field, uint32_t *out) {
    hm_status st = need(p, 4, field);
    if (st) return st;
    *out = gguf_ld_u32(p->b + p->pos);
    p->pos += 4;
    return HM_OK;
}

static hm_status get_u64(parser *p, const char *field, uint64_t *out) {
    hm_status st = need(p, 8, field);
    if (st) return st;
    *out = gguf_ld_u64(p->b + p->pos);
    p->pos += 8;
    return HM_OK;
}

/* Reads a length-prefixed string; *s points into the image. */
static hm_status get_str(parser *p, const char *field, const uint8_t **s, uint64_t *len) {
    char f[64];
    snprintf(f, sizeof(f), "%s length", field);
    hm_status st = get_u64(p, f, len);
    if (st) return st;
    if (*len > p->size - p->pos)
        return fail(p, HM_ERR_FORMAT, "%s length %" PRIu64 " at byte %" PRIu64
                    " extends past end of file (size %" PRIu64 ")", field, *len, p->pos - 8, p->size);
    *s = p->b + p->pos;
    p->pos += *len;
    return HM_OK;
}

/* Copies a key or name into the arena (NUL-terminated); *off is its arena offset. */
static hm_status arena_add(parser *p, const uint8_t *s, uint64_t len, uint64_t at, const char *field,
                           size_t *off) {
    if (memchr(s, 0, len))
        return fail(p, HM_ERR_FORMAT, "%s at byte %" PRIu64 " contains a NUL byte", field, at);
    if (p->arena_len + len + 1 > p->arena_cap) {
        size_t cap = p->arena_cap ? p->arena_cap * 2 : 4096;
        while (cap < p->arena_len + len + 1) cap *= 2;
        char *a = realloc(p->c->arena, cap);
        if (!a) return fail(p, HM_ERR_NOMEM, "arena of %zu bytes", cap);
        p->c->arena = a;
        p->arena_cap = cap;
    }
    memcpy(p->c->arena + p->arena_len, s, len);
    p->c->arena[p->arena_len + len] = '\0';
    *off = p->arena_len;
    p->arena_len += len + 1;
    return HM_OK;
}

/* Grows a pool (elements of `esz` bytes) so that n more fit; returns the first new index. */
static hm_status pool_reserve(parser *p, void **pool, uint64_t *len, uint64_t *cap, size_t esz,
                              uint64_t n, uint64_t *first) {
    if (n > *cap - *len) {
        uint64_t c = *cap ? *cap * 2 : 64;
        if (c < *len + n) c = *len + n;
        void *q = realloc(*pool, (size_t)c * esz);
        if (!q) return fail(p, HM_ERR_NOMEM, "array index of %" PRIu64 " entries", c);
        *pool = q;
        *cap = c;
    }
    *first = *len;
    *len += n;
    return HM_OK;
}

static hm_status parse_array(parser *p, uint64_t node, int depth);

/* Parses (skips over, validating) one value of type t at the cursor. *node gets the array's node
 * index for arrays. */
static hm_status parse_value(parser *p, gguf_vtype t, int64_t *node) {
    *node = -1;
    uint64_t sz = gguf_vtype_size(t);
    if (sz) {
        hm_status st = need(p, sz, gguf_vtype_name(t));
        if (st) return st;
        if (t == GGUF_VT_BOOL && p->b[p->pos] > 1)
            return fail(p, HM_ERR_FORMAT, "bool value %u at byte %" PRIu64 " is not 0 or 1",
                        p->b[p->pos], p->pos);
        p->pos += sz;
        return HM_OK;
    }
    if (t == GGUF_VT_STRING) {
        const uint8_t *s;
        uint64_t len;
        return get_str(p, "string", &s, &len);
    }
    uint64_t first;
    hm_status st = pool_reserve(p, (void **)&p->c->nodes, &p->c->n_nodes, &p->c->cap_nodes,
                                sizeof(gguf_arr_node), 1, &first);
    if (st) return st;
    *node = (int64_t)first;
    return parse_array(p, first, 0);
}

/* Parses an array body (element type, count, elements) into node `node`. */
static hm_status parse_array(parser *p, uint64_t node, int depth) {
    uint64_t at = p->pos;
    if (depth >= GGUF_MAX_NESTING)
        return fail(p, HM_ERR_FORMAT, "arrays nested deeper than %d at byte %" PRIu64,
                    GGUF_MAX_NESTING, at);
    uint32_t et;
    uint64_t n;
    hm_status st = get_u32(p, "array element type", &et);
    if (st) return st;
    if (et >= GGUF_VT_COUNT)
        return fail(p, HM_ERR_FORMAT, "unknown array element type %u at byte %" PRIu64, et, at);
    st = get_u64(p, "array length", &n);
    if (st) return st;
    uint64_t esz = gguf_vtype_size((gguf_vtype)et);
    uint64_t min = esz ? esz : et == GGUF_VT_STRING ? 8 : MIN_ARR_BYTES;
    if (n > (p->size - p->pos) / min)
        return fail(p, HM_ERR_FORMAT, "array length %" PRIu64 " at byte %" PRIu64
                    " needs at least %" PRIu64 " bytes per element but only %" PRIu64
                    " bytes remain", n, p->pos - 8, min, p->size - p->pos);
    gguf_arr_node nd = {.type = (gguf_vtype)et, .n = n, .data = p->b + p->pos};
    if (esz) {
        if (et == GGUF_VT_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (p->b[p->pos + i] > 1)
                    return fail(p, HM_ERR_FORMAT, "bool element %" PRIu64 " = %u at byte %" PRIu64
                                " is not 0 or 1", i, p->b[p->pos + i], p->pos + i);
        p->pos += n * esz;
    } else if (et == GGUF_VT_STRING) {
        st = pool_reserve(p, (void **)&p->c->strs, &p->c->n_strs, &p->c->cap_strs,
                          sizeof(*p->c->strs), n, &nd.first);
        if (st) return st;
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *s;
            uint64_t len;
            p->c->strs[nd.first + i] = p->b + p->pos;
            st = get_str(p, "array string", &s, &len);
            if (st) return st;
        }
    } else {
        st = pool_reserve(p, (void **)&p->c->nodes, &p->c->n_nodes, &p->c->cap_nodes,
                          sizeof(gguf_arr_node), n, &nd.first);
        if (st) return st;
        for (uint64_t i = 0; i < n; i++) {
            st = parse_array(p, nd.first + i, depth + 1);
            if (st) return st;
        }
    }
    p->c->nodes[node] = nd;
    return HM_OK;
}

static hm_status parse_header(parser *p, uint64_t *n_tensors, uint64_t *n_kv) {
    snprintf(p->what, sizeof(p->what), "header");
    if (p->size < 4 || memcmp(p->b, GGUF_MAGIC, 4) != 0) {
        char m[8];
        msg_name(m, sizeof(m), p->b, p->size < 4 ? p->size : 4);
        return fail(p, HM_ERR_FORMAT, "not a GGUF file: magic '%s' at byte 0, expected 'GGUF'", m);
    }
    p->pos = 4;
    uint32_t v;
    hm_status st = get_u32(p, "version", &v);
    if (st) return st;
    p->c->version = v;
    if (v == 1)
        return fail(p, HM_ERR_UNSUPPORTED, "version 1 at byte 4 is not supported (only 2 and 3; "
                    "convert the file again with a current llama.cpp)");
    if (v != 2 && v != 3) {
        if ((v & 0xffff) == 0 && (v >> 24) >= 2 && (v >> 24) <= 3)
            return fail(p, HM_ERR_UNSUPPORTED, "big-endian file (version %u at byte 4) is not "
                        "supported", v >> 24);
        return fail(p, HM_ERR_UNSUPPORTED, "unknown version %u at byte 4 (supported: 2, 3)", v);
    }
    if ((st = get_u64(p, "tensor count", n_tensors)) || (st = get_u64(p, "key/value count", n_kv)))
        return st;
    uint64_t rest = p->size - p->pos;
    if (*n_tensors > rest / MIN_TENSOR_BYTES)
        return fail(p, HM_ERR_FORMAT, "tensor count %" PRIu64 " at byte 8 is impossible for a "
                    "file of %" PRIu64 " bytes", *n_tensors, p->size);
    if (*n_kv > rest / MIN_KV_BYTES || *n_kv * MIN_KV_BYTES > rest - *n_tensors * MIN_TENSOR_BYTES)
        return fail(p, HM_ERR_FORMAT, "key/value count %" PRIu64 " at byte 16 is impossible "
                    "for a file of %" PRIu64 " bytes (with %" PRIu64 " tensors)", *n_kv, p->size,
                    *n_tensors);
    return HM_OK;
}

static hm_status parse_kv(parser *p, int64_t i, size_t *key_off) {
    snprintf(p->what, sizeof(p->what), "key %" PRId64, i);
    const uint8_t *k;
    uint64_t klen, at = p->pos;
    hm_status st = get_str(p, "key", &k, &klen);
    if (st) return st;
    if ((st = arena_add(p, k, klen, at, "key", key_off))) return st;
    char nm[80];
    msg_name(nm, sizeof(nm), k, klen);
    snprintf(p->what, sizeof(p->what), "key %" PRId64 " '%s'", i, nm);
    uint32_t t;
    at = p->pos;
    if ((st = get_u32(p, "value type", &t))) return st;
    if (t >= GGUF_VT_COUNT)
        return fail(p, HM_ERR_FORMAT, "unknown value type %u at byte %" PRIu64, t, at);
    gguf_kv_entry *e = &p->c->kvs[i];
    e->type = (gguf_vtype)t;
    e->val = p->b + p->pos;
    return parse_value(p, e->type, &e->node);
}

static hm_status parse_tensor_info(parser *p, int64_t i, size_t *name_off, uint64_t *off_at) {
    snprintf(p->what, sizeof(p->what), "tensor %" PRId64, i);
    gguf_tensor *t = &p->c->tensors[i];
    const uint8_t *s;
    uint64_t len, at = p->pos;
    hm_status st = get_str(p, "name", &s, &len);
    if (st) return st;
    if ((st = arena_add(p, s, len, at, "name", name_off))) return st;
    char nm[80];
    msg_name(nm, sizeof(nm), s, len);
    snprintf(p->what, sizeof(p->what), "tensor %" PRId64 " '%s'", i, nm);
    at = p->pos;
    if ((st = get_u32(p, "n_dims", &t->n_dims))) return st;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return fail(p, HM_ERR_FORMAT, "n_dims %u at byte %" PRIu64 " is outside 1..%d", t->n_dims,
                    at, GGUF_MAX_DIMS);
    int64_t elems = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        at = p->pos;
        if ((st = get_u64(p, "ne", &v))) return st;
        t->ne[d] = (int64_t)v;
        if (t->ne[d] < 0)
            return fail(p, HM_ERR_FORMAT, "ne[%u] = %" PRId64 " at byte %" PRIu64 " is negative",
                        d, t->ne[d], at);
        if (__builtin_mul_overflow(elems, t->ne[d], &elems))
            return fail(p, HM_ERR_FORMAT, "element count overflows int64 at ne[%u] = %" PRId64
                        " (byte %" PRIu64 ")", d, t->ne[d], at);
    }
    at = p->pos;
    if ((st = get_u32(p, "type", &t->type))) return st;
    const hm_type_info *ti = hm_type_get(t->type);
    if (!ti)
        return fail(p, HM_ERR_UNSUPPORTED, "unknown type %u in tensor '%s' at byte %" PRIu64,
                    t->type, nm, at);
    if (t->ne[0] % ti->block_size)
        return fail(p, HM_ERR_FORMAT, "ne[0] = %" PRId64 " is not a multiple of the block size %d "
                    "of type %s (type at byte %" PRIu64 ")", t->ne[0], ti->block_size, ti->name, at);
    uint64_t bytes = (uint64_t)(t->ne[0] / ti->block_size);
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        if (__builtin_mul_overflow(bytes, d ? (uint64_t)t->ne[d] : (uint64_t)ti->type_size, &bytes))
            return fail(p, HM_ERR_FORMAT, "size in bytes overflows 64 bits (type at byte %" PRIu64
                        ")", at);
    t->size = bytes;
    *off_at = p->pos;
    return get_u64(p, "offset", &t->offset);
}

typedef struct {
    const char *s;
    uint64_t v;
    int64_t i;
} sort_item;

static int cmp_str(const void *a, const void *b) {
    return strcmp(((const sort_item *)a)->s, ((const sort_item *)b)->s);
}

static int cmp_off(const void *a, const void *b) {
    uint64_t x = ((const sort_item *)a)->v, y = ((const sort_item *)b)->v;
    if (x != y) return x < y ? -1 : 1;
    int64_t i = ((const sort_item *)a)->i, j = ((const sort_item *)b)->i;
    return (i > j) - (i < j);
}

/* Sorts names, fills `sorted` and reports the first duplicate. */
static hm_status sort_names(parser *p, sort_item *tmp, int64_t n, int64_t *sorted, const char *kind,
                            const uint64_t *at) {
    qsort(tmp, (size_t)n, sizeof(*tmp), cmp_str);
    for (int64_t k = 0; k < n; k++) {
        sorted[k] = tmp[k].i;
        if (k && !strcmp(tmp[k].s, tmp[k - 1].s)) {
            int64_t a = tmp[k - 1].i < tmp[k].i ? tmp[k - 1].i : tmp[k].i;
            int64_t b = tmp[k - 1].i < tmp[k].i ? tmp[k].i : tmp[k - 1].i;
            char nm[80];
            msg_name(nm, sizeof(nm), (const uint8_t *)tmp[k].s, strlen(tmp[k].s));
            snprintf(p->what, sizeof(p->what), "%s %" PRId64 " '%s'", kind, b, nm);
            return fail(p, HM_ERR_FORMAT, "duplicate of %s %" PRId64 " at byte %" PRIu64, kind, a,
                        at[b]);
        }
    }
    return HM_OK;
}

static hm_status check_alignment(parser *p) {
    gguf_ctx *c = p->c;
    c->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(c, "general.alignment");
    if (i < 0) return HM_OK;
    const gguf_kv_entry *e = &c->kvs[i];
    uint64_t at = (uint64_t)(e->val - c->base);
    snprintf(p->what, sizeof(p->what), "key %" PRId64 " 'general.alignment'", i);
    if (e->type != GGUF_VT_UINT32)
        return fail(p, HM_ERR_FORMAT, "has type %s at byte %" PRIu64 ", expected u32",
                    gguf_vtype_name(e->type), at - 4);
    uint32_t a = gguf_ld_u32(e->val);
    if (a == 0 || (a & (a - 1)))
        return fail(p, HM_ERR_FORMAT, "alignment %u at byte %" PRIu64
                    " is not a non-zero power of two", a, at);
    c->alignment = a;
    return HM_OK;
}

/* Data ranges: aligned, inside the file, not overlapping. off_at: [n_tensors] byte offsets of
 * the offset fields. */
static hm_status check_data(parser *p, const uint64_t *off_at, sort_item *tmp) {
    gguf_ctx *c = p->c;
    uint64_t a = c->alignment, end_info = p->pos;
    if (end_info > UINT64_MAX - (a - 1))
        return hm_error_set(p->err, HM_ERR_FORMAT, "gguf: data section offset overflows");
    c->data_offset = (end_info + a - 1) / a * a;
    uint64_t avail = c->size > c->data_offset ? c->size - c->data_offset : 0;
    for (int64_t i = 0; i < c->n_tensors; i++) {
        gguf_tensor *t = &c->tensors[i];
        char nm[80];
        msg_name(nm, sizeof(nm), (const uint8_t *)t->name, strlen(t->name));
        snprintf(p->what, sizeof(p->what), "tensor %" PRId64 " '%s'", i, nm);
        if (t->offset % a)
            return fail(p, HM_ERR_FORMAT, "data offset %" PRIu64 " at byte %" PRIu64
                        " is not a multiple of the alignment %" PRIu64, t->offset, off_at[i], a);
        if (t->offset > avail || t->size > avail - t->offset)
            return fail(p, HM_ERR_FORMAT, "data [offset %" PRIu64 ", size %" PRIu64 "] extends "
                        "past end of file (size %" PRIu64 ", data section at byte %" PRIu64
                        ") at byte %" PRIu64, t->offset, t->size, c->size, c->data_offset,
                        off_at[i]);
        uint64_t pos = c->data_offset + t->offset; /* <= size unless the tensor is empty */
        t->data = c->base + (pos < c->size ? pos : c->size);
        tmp[i] = (sort_item){.v = t->offset, .i = i};
    }
    qsort(tmp, (size_t)c->n_tensors, sizeof(*tmp), cmp_off);
    int64_t prev = -1;
    for (int64_t k = 0; k < c->n_tensors; k++) {
        const gguf_tensor *t = &c->tensors[tmp[k].i];
        if (!t->size) continue;
        if (prev >= 0) {
            const gguf_tensor *q = &c->tensors[prev];
            if (q->offset + q->size > t->offset) {
                char nm[80], nq[80];
                msg_name(nm, sizeof(nm), (const uint8_t *)t->name, strlen(t->name));
                msg_name(nq, sizeof(nq), (const uint8_t *)q->name, strlen(q->name));
                snprintf(p->what, sizeof(p->what), "tensor %" PRId64 " '%s'", tmp[k].i, nm);
                return fail(p, HM_ERR_FORMAT, "data [offset %" PRIu64 ", size %" PRIu64 "] at byte "
                            "%" PRIu64 " overlaps tensor %" PRId64 " '%s' [offset %" PRIu64
                            ", size %" PRIu64 "]", t->offset, t->size, off_at[tmp[k].i], prev, nq,
                            q->offset, q->size);
            }
        }
        prev = tmp[k].i;
    }
    return HM_OK;
}

static hm_status parse_image(gguf_ctx *c, hm_error *err) {
    parser p = {.c = c, .b = c->base, .size = c->size, .err = err};
    uint64_t n_tensors, n_kv;
    hm_status st = parse_header(&p, &n_tensors, &n_kv);
    if (st) return st;
    c->n_kv = (int64_t)n_kv;
    c->n_tensors = (int64_t)n_tensors;
    size_t nmax = n_kv > n_tensors ? n_kv : n_tensors;
    c->kvs = calloc(n_kv ? n_kv : 1, sizeof(*c->kvs));
    c->kv_sorted = calloc(n_kv ? n_kv : 1, sizeof(*c->kv_sorted));
    c->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(*c->tensors));
    c->tensor_sorted = calloc(n_tensors ? n_tensors : 1, sizeof(*c->tensor_sorted));
    size_t *name_off = calloc(nmax ? nmax : 1, sizeof(size_t));
    uint64_t *at = calloc(nmax ? nmax : 1, sizeof(uint64_t));
    sort_item *tmp = calloc(nmax ? nmax : 1, sizeof(sort_item));
    size_t *key_off = calloc(n_kv ? n_kv : 1, sizeof(size_t));
    if (!c->kvs || !c->kv_sorted || !c->tensors || !c->tensor_sorted || !name_off || !at || !tmp ||
        !key_off) {
        st = hm_error_set(err, HM_ERR_NOMEM, "gguf: tables for %" PRIu64 " keys and %" PRIu64
                          " tensors", n_kv, n_tensors);
        goto out;
    }
    for (int64_t i = 0; i < c->n_kv; i++) {
        at[i] = p.pos;
        if ((st = parse_kv(&p, i, &name_off[i]))) goto out;
    }
    for (int64_t i = 0; i < c->n_kv; i++) {
        key_off[i] = name_off[i];
        c->kvs[i].key = c->arena + name_off[i];
        tmp[i] = (sort_item){.s = c->kvs[i].key, .i = i};
    }
    if ((st = sort_names(&p, tmp, c->n_kv, c->kv_sorted, "key", at))) goto out;
    for (uint64_t k = 0; k < c->n_nodes; k++) {
        gguf_arr_node *nd = &c->nodes[k];
        if (nd->type == GGUF_VT_STRING) nd->strs = c->strs + nd->first;
        if (nd->type == GGUF_VT_ARRAY) nd->kids = c->nodes + nd->first;
    }
    if ((st = check_alignment(&p))) goto out;
    uint64_t *off_at = calloc(n_tensors ? n_tensors : 1, sizeof(uint64_t));
    if (!off_at) {
        st = hm_error_set(err, HM_ERR_NOMEM, "gguf: table for %" PRIu64 " tensors", n_tensors);
        goto out;
    }
    for (int64_t i = 0; i < c->n_tensors && !st; i++) {
        at[i] = p.pos;
        st = parse_tensor_info(&p, i, &name_off[i], &off_at[i]);
    }
    if (!st) {
        /* Tensor names may have grown (moved) the arena: point the keys into it anew. */
        for (int64_t i = 0; i < c->n_kv; i++) c->kvs[i].key = c->arena + key_off[i];
        for (int64_t i = 0; i < c->n_tensors; i++) {
            c->tensors[i].name = c->arena + name_off[i];
            tmp[i] = (sort_item){.s = c->tensors[i].name, .i = i};
        }
        st = sort_names(&p, tmp, c->n_tensors, c->tensor_sorted, "tensor", at);
    }
    if (!st) st = check_data(&p, off_at, tmp);
    free(off_at);
out:
    free(key_off);
    free(name_off);
    free(at);
    free(tmp);
    return st;
}

hm_status gguf_open_mem(const void *data, size_t size, gguf_ctx **out, hm_error *err) {
    *out = NULL;
    if (!data && size) return hm_error_set(err, HM_ERR_ARG, "gguf: NULL image of %zu bytes", size);
    gguf_ctx *c = calloc(1, sizeof(*c));
    if (!c) return hm_error_set(err, HM_ERR_NOMEM, "gguf: context");
    c->base = data ? data : (const uint8_t *)"";
    c->size = size;
    hm_status st = parse_image(c, err);
    if (st) {
        gguf_close(c);
        return st;
    }
    *out = c;
    return HM_OK;
}

hm_status gguf_open(const char *path, gguf_ctx **out, hm_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hm_error_set(err, errno == ENOENT ? HM_ERR_NOT_FOUND : HM_ERR_IO,
                                    "gguf: cannot open: %s", strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return hm_error_set(err, HM_ERR_IO, "gguf: cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return hm_error_set(err, HM_ERR_IO, "gguf: not a regular file");
    }
    if (sb.st_size == 0) {
        close(fd);
        return hm_error_set(err, HM_ERR_FORMAT, "gguf: header: not a GGUF file: the file is empty");
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return hm_error_set(err, HM_ERR_IO, "gguf: file too large to map");
    }
    size_t sz = (size_t)sb.st_size;
    void *m = mmap(NULL, sz, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return hm_error_set(err, HM_ERR_IO, "gguf: cannot map %zu bytes: %s", sz,
                                             strerror(e));
    gguf_ctx *c = NULL;
    hm_status st = gguf_open_mem(m, sz, &c, err);
    if (st) {
        munmap(m, sz);
        return st;
    }
    c->map = m;
    c->map_size = sz;
    *out = c;
    return HM_OK;
}

bool gguf_in_file_map(const gguf_ctx *c, const void *p, size_t n) {
    const uintptr_t a = (uintptr_t)c->map, q = (uintptr_t)p;
    return c->map && q >= a && n <= c->map_size && q - a <= c->map_size - n;
}

hm_status gguf_lock(const gguf_ctx *c, hm_error *err) {
    if (!c->map) return HM_OK; /* an image in the caller's memory */
    if (mlock(c->map, c->map_size) != 0)
        return hm_error_set(err, HM_ERR_IO, "mlock of %.1f MiB: %s (the limit: ulimit -l)",
                            (double)c->map_size / 1048576.0, strerror(errno));
    return HM_OK;
}

void gguf_close(gguf_ctx *c) {
    if (!c) return;
    if (c->map) munmap(c->map, c->map_size);
    free(c->kvs);
    free(c->kv_sorted);
    free(c->tensors);
    free(c->tensor_sorted);
    free(c->arena);
    free(c->nodes);
    free(c->strs);
    free(c);
}
