/* gguf_image.h - builds GGUF images byte by byte in memory, for tests that need files the writer
 * refuses to produce (malformed headers, bad offsets, old versions). Test-only, header-only. */
#ifndef HM_TESTS_GGUF_IMAGE_H
#define HM_TESTS_GGUF_IMAGE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *b; /* [n] */
    size_t n, cap;
} gimg;

static inline void gi_bytes(gimg *g, const void *p, size_t n) {
    if (g->n + n > g->cap) {
        g->cap = (g->n + n) * 2 + 64;
        g->b = realloc(g->b, g->cap);
        if (!g->b) abort();
    }
    memcpy(g->b + g->n, p, n);
    g->n += n;
}
static inline void gi_u8(gimg *g, uint8_t v) { gi_bytes(g, &v, 1); }
static inline void gi_u32(gimg *g, uint32_t v) {
    uint8_t b[4];
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
    gi_bytes(g, b, 4);
}
static inline void gi_u64(gimg *g, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    gi_bytes(g, b, 8);
}
static inline void gi_str(gimg *g, const char *s) {
    gi_u64(g, strlen(s));
    gi_bytes(g, s, strlen(s));
}
static inline void gi_header(gimg *g, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gi_bytes(g, "GGUF", 4);
    gi_u32(g, version);
    gi_u64(g, n_tensors);
    gi_u64(g, n_kv);
}
static inline void gi_kv_u32(gimg *g, const char *key, uint32_t v) {
    gi_str(g, key);
    gi_u32(g, 4 /* GGUF_VT_UINT32 */);
    gi_u32(g, v);
}
static inline void gi_tensor(gimg *g, const char *name, uint32_t n_dims, const int64_t *ne,
                             uint32_t type, uint64_t offset) {
    gi_str(g, name);
    gi_u32(g, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) gi_u64(g, (uint64_t)ne[d]);
    gi_u32(g, type);
    gi_u64(g, offset);
}
static inline void gi_pad(gimg *g, size_t align) {
    while (g->n % align) gi_u8(g, 0);
}
static inline void gi_zeros(gimg *g, size_t n) {
    for (size_t i = 0; i < n; i++) gi_u8(g, 0);
}
static inline void gi_free(gimg *g) {
    free(g->b);
    g->b = NULL;
    g->n = g->cap = 0;
}

#endif
