/* gguf.h - reading and writing GGUF files (versions 2 and 3) as llama.cpp does.
 *
 * DESIGN: the reader maps the file and validates all of it at open — header, every key/value
 * (all value types, arrays of strings, nested arrays), the tensor table, alignment, that every
 * tensor's bytes lie inside the file and match its type and shape — so that nothing read later
 * can go out of bounds. Keys and tensor names are copied once, NUL-terminated, into one arena;
 * tensor data is never copied (pointers into the mapping). Any failure is one message naming the
 * field and its byte offset.
 *
 * The writer streams: keys and tensor infos are declared first (held in memory), then the header
 * is written, then each tensor's bytes in declaration order, in chunks of any size, so a 20 GB
 * model is written with bounded memory.
 */
#ifndef HM_GGUF_GGUF_H
#define HM_GGUF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

typedef enum {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
    GGUF_VT_COUNT
} gguf_vtype;

const char *gguf_vtype_name(gguf_vtype t);

/* A string inside the file: not NUL-terminated. */
typedef struct {
    const char *data;
    uint64_t len;
} gguf_str;

/* An array value. Elements are read with the gguf_arr_* accessors (O(1) each). */
typedef struct {
    gguf_vtype type; /* element type */
    uint64_t n;      /* element count */
    const void *impl;
} gguf_arr;

typedef struct {
    const char *name; /* NUL-terminated */
    uint32_t type;    /* ggml type id (see quant/qtypes.h); may be one hotmoe cannot compute */
    uint32_t n_dims;  /* 1..GGUF_MAX_DIMS */
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous dimension; unused dims are 1 */
    uint64_t offset;  /* from the start of the data section */
    uint64_t size;    /* bytes */
    const void *data; /* in the mapping */
} gguf_tensor;

typedef struct gguf_ctx gguf_ctx;

/* ---- reader ---- */

/* Opens and validates a file (read-only mmap). */
hm_status gguf_open(const char *path, gguf_ctx **out, hm_error *err);
/* Validates a file image already in memory (not copied; must outlive the context). */
hm_status gguf_open_mem(const void *data, size_t size, gguf_ctx **out, hm_error *err);
void gguf_close(gguf_ctx *ctx);

uint32_t gguf_version(const gguf_ctx *ctx);
uint32_t gguf_alignment(const gguf_ctx *ctx);
uint64_t gguf_file_size(const gguf_ctx *ctx);
uint64_t gguf_data_offset(const gguf_ctx *ctx); /* byte offset of the data section */
/* Whether [p, p + n) lies in the file's own read-only shared mapping (gguf_open): pages of it
 * that are dropped (madvise MADV_DONTNEED) come back from the file when read again. False for
 * gguf_open_mem images, whose pages are the caller's. */
bool gguf_in_file_map(const gguf_ctx *ctx, const void *p, size_t n);
/* Locks the file's mapping in RAM (mlock: every page read now); HM_ERR_IO with the system's
 * reason when refused (RLIMIT_MEMLOCK). Nothing to do for an image in memory. */
hm_status gguf_lock(const gguf_ctx *ctx, hm_error *err);

int64_t gguf_kv_count(const gguf_ctx *ctx);
const char *gguf_kv_key(const gguf_ctx *ctx, int64_t i);
gguf_vtype gguf_kv_type(const gguf_ctx *ctx, int64_t i);
int64_t gguf_find_key(const gguf_ctx *ctx, const char *key); /* -1 if absent */

/* Typed reads by key index. Integers of any width convert when the value fits (else
 * HM_ERR_RANGE); floats accept f32/f64; a wrong kind is HM_ERR_FORMAT naming the key. */
hm_status gguf_kv_int(const gguf_ctx *ctx, int64_t i, int64_t *out, hm_error *err);
hm_status gguf_kv_uint(const gguf_ctx *ctx, int64_t i, uint64_t *out, hm_error *err);
hm_status gguf_kv_float(const gguf_ctx *ctx, int64_t i, double *out, hm_error *err);
hm_status gguf_kv_bool(const gguf_ctx *ctx, int64_t i, bool *out, hm_error *err);
hm_status gguf_kv_str(const gguf_ctx *ctx, int64_t i, gguf_str *out, hm_error *err);
hm_status gguf_kv_arr(const gguf_ctx *ctx, int64_t i, gguf_arr *out, hm_error *err);

/* Same, by key name; HM_ERR_NOT_FOUND names the key when absent. */
hm_status gguf_get_int(const gguf_ctx *ctx, const char *key, int64_t *out, hm_error *err);
hm_status gguf_get_uint(const gguf_ctx *ctx, const char *key, uint64_t *out, hm_error *err);
hm_status gguf_get_float(const gguf_ctx *ctx, const char *key, double *out, hm_error *err);
hm_status gguf_get_bool(const gguf_ctx *ctx, const char *key, bool *out, hm_error *err);
hm_status gguf_get_str(const gguf_ctx *ctx, const char *key, gguf_str *out, hm_error *err);
hm_status gguf_get_arr(const gguf_ctx *ctx, const char *key, gguf_arr *out, hm_error *err);

/* Array elements (i < arr->n; the element type must match the accessor's kind). */
int64_t gguf_arr_int(const gguf_arr *arr, uint64_t i);   /* any integer or bool type */
double gguf_arr_float(const gguf_arr *arr, uint64_t i);  /* f32/f64 */
gguf_str gguf_arr_str(const gguf_arr *arr, uint64_t i);  /* strings */
gguf_arr gguf_arr_arr(const gguf_arr *arr, uint64_t i);  /* nested arrays */

int64_t gguf_tensor_count(const gguf_ctx *ctx);
const gguf_tensor *gguf_tensor_at(const gguf_ctx *ctx, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_ctx *ctx, const char *name); /* NULL if absent */

/* ---- writer ---- */

typedef struct gguf_writer gguf_writer;

/* Creates path (truncating). Version 3, alignment GGUF_DEFAULT_ALIGNMENT unless
 * gguf_writer_set_u32(w, "general.alignment", a) is called before gguf_writer_begin_data. */
hm_status gguf_writer_open(const char *path, gguf_writer **out, hm_error *err);

/* Key/values, in the order they will appear. A repeated key is HM_ERR_ARG. */
hm_status gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
hm_status gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v);
hm_status gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
hm_status gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
hm_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
hm_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
hm_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
hm_status gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
hm_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
hm_status gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
hm_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
hm_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* Arrays of fixed-size elements (type < GGUF_VT_STRING or UINT64/INT64/FLOAT64). */
hm_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type,
                              const void *data, uint64_t n);
hm_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                                  uint64_t n);
/* Arrays of arrays: begin_arr_arr(w, key) opens one under key; each element is then added with
 * gguf_writer_set_arr, gguf_writer_set_arr_str or gguf_writer_begin_arr_arr called with key
 * NULL (inner arrays may differ in element type); end_arr_arr closes the innermost one. Nothing
 * else may be set while one is open. Note: llama.cpp's C reader refuses arrays of arrays (gguf-py
 * and hotmoe read them), so model files meant for llama.cpp must not contain any. */
hm_status gguf_writer_begin_arr_arr(gguf_writer *w, const char *key);
hm_status gguf_writer_end_arr_arr(gguf_writer *w);

/* Declares a tensor; its data follows later, in declaration order. */
hm_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const int64_t *ne);
/* Writes header, key/values and tensor infos; after it only tensor data may be written. */
hm_status gguf_writer_begin_data(gguf_writer *w);
/* Appends n bytes of the current tensor's data (any chunking); moves to the next tensor when one
 * is complete, padding to the alignment. Writing more than declared is HM_ERR_ARG. */
hm_status gguf_writer_write(gguf_writer *w, const void *data, size_t n);
/* Checks every tensor was written in full, flushes and closes; frees w in any case. */
hm_status gguf_writer_close(gguf_writer *w, hm_error *err);
/* Message of the last failed call on w. */
const char *gguf_writer_errmsg(const gguf_writer *w);

#endif
