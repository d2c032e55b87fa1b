/* gguf_internal.h - the reader's context, shared by gguf_read.c (parsing, validation) and
 * gguf_value.c (accessors). Not for use outside src/gguf/.
 *
 * DESIGN: everything the accessors return points either into the file image (values, tensor
 * data) or into four allocations made at open: the key/value table, the tensor table, one arena
 * of NUL-terminated keys and tensor names, and two pools for arrays (array nodes; pointers to
 * each string of a string array). A nested array's elements are consecutive nodes, so every
 * element access is O(1).
 */
#ifndef HM_GGUF_INTERNAL_H
#define HM_GGUF_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "gguf/gguf.h"

/* Arrays of arrays deeper than this are refused (bounds the parser's recursion). */
#define GGUF_MAX_NESTING 16

typedef struct gguf_arr_node {
    gguf_vtype type;      /* element type */
    uint64_t n;           /* element count */
    const uint8_t *data;  /* first element in the image */
    uint64_t first;       /* while parsing: index of element 0 in the string or node pool */
    const uint8_t *const *strs;        /* strings: [n] pointers to each length prefix */
    const struct gguf_arr_node *kids;  /* arrays: [n] nodes */
} gguf_arr_node;

typedef struct {
    const char *key;     /* in the arena */
    gguf_vtype type;
    const uint8_t *val;  /* value in the image */
    int64_t node;        /* arrays: index into nodes; else -1 */
} gguf_kv_entry;

struct gguf_ctx {
    const uint8_t *base; /* [size] file image */
    uint64_t size;
    void *map;           /* owned mapping (gguf_open) or NULL */
    size_t map_size;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    gguf_kv_entry *kvs;      /* [n_kv] in file order */
    int64_t *kv_sorted;      /* [n_kv] indices sorted by key */
    int64_t n_tensors;
    gguf_tensor *tensors;    /* [n_tensors] in file order */
    int64_t *tensor_sorted;  /* [n_tensors] indices sorted by name */
    char *arena;             /* keys and names, NUL-terminated */
    gguf_arr_node *nodes;    /* [n_nodes] */
    uint64_t n_nodes, cap_nodes;
    const uint8_t **strs;    /* [n_strs] */
    uint64_t n_strs, cap_strs;
};

/* Little-endian loads from the image (any alignment). */
static inline uint16_t gguf_ld_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t gguf_ld_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t gguf_ld_u64(const uint8_t *p) {
    return (uint64_t)gguf_ld_u32(p) | ((uint64_t)gguf_ld_u32(p + 4) << 32);
}

/* Size in bytes of a fixed-size value type; 0 for string, array and invalid types. */
static inline uint64_t gguf_vtype_size(gguf_vtype t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

#endif
