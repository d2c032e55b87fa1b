/* fuzz_gguf.c - fuzz target for the GGUF reader. Any input must either be refused with one
 * "gguf: ..." line, or open, after which every key, array element (nested and strings included)
 * and every byte of every tensor's data that the API exposes is read, and lookups by name find
 * what iteration found. A broken invariant traps, so libFuzzer (and the replay test) report it. */
#include <stdint.h>
#include <string.h>

#include "gguf/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_ASSERT(c)                                                                       \
    do {                                                                                   \
        if (!(c)) __builtin_trap();                                                        \
    } while (0)

static uint64_t touch(const void *p, uint64_t n) {
    const volatile uint8_t *b = p;
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++) s += b[i];
    return s;
}

static uint64_t walk_arr(const gguf_arr *a, int depth) {
    uint64_t s = 0;
    FZ_ASSERT(depth < 64);
    for (uint64_t i = 0; i < a->n; i++) {
        switch (a->type) {
        case GGUF_VT_FLOAT32:
        case GGUF_VT_FLOAT64: {
            double d = gguf_arr_float(a, i);
            s += touch(&d, sizeof(d));
        } break;
        case GGUF_VT_STRING: {
            gguf_str str = gguf_arr_str(a, i);
            s += touch(str.data, str.len);
        } break;
        case GGUF_VT_ARRAY: {
            gguf_arr inner = gguf_arr_arr(a, i);
            s += walk_arr(&inner, depth + 1);
        } break;
        default: s += (uint64_t)gguf_arr_int(a, i); break;
        }
    }
    /* out-of-range reads are defined (zero / empty) */
    s += (uint64_t)gguf_arr_int(a, a->n) + gguf_arr_str(a, a->n).len + gguf_arr_arr(a, a->n).n;
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_ctx *c = NULL;
    hm_error err = {0};
    if (gguf_open_mem(data, size, &c, &err) != HM_OK) {
        FZ_ASSERT(c == NULL);
        FZ_ASSERT(!strncmp(err.msg, "gguf: ", 6) && !strchr(err.msg, '\n'));
        return 0;
    }
    uint64_t s = 0;
    uint32_t a = gguf_alignment(c);
    FZ_ASSERT(a && !(a & (a - 1)));
    FZ_ASSERT(gguf_data_offset(c) % a == 0);
    for (int64_t i = 0; i < gguf_kv_count(c); i++) {
        const char *key = gguf_kv_key(c, i);
        FZ_ASSERT(key && gguf_find_key(c, key) == i);
        s += strlen(key);
        int64_t iv;
        uint64_t uv;
        double dv;
        bool bv;
        gguf_str sv;
        gguf_arr av;
        if (gguf_kv_int(c, i, &iv, &err) == HM_OK) s += (uint64_t)iv;
        if (gguf_kv_uint(c, i, &uv, &err) == HM_OK) s += uv;
        if (gguf_kv_float(c, i, &dv, &err) == HM_OK) s += touch(&dv, sizeof(dv));
        if (gguf_kv_bool(c, i, &bv, &err) == HM_OK) s += bv;
        if (gguf_kv_str(c, i, &sv, &err) == HM_OK) s += touch(sv.data, sv.len);
        if (gguf_kv_arr(c, i, &av, &err) == HM_OK) {
            FZ_ASSERT(gguf_kv_type(c, i) == GGUF_VT_ARRAY);
            s += walk_arr(&av, 0);
        }
    }
    for (int64_t i = 0; i < gguf_tensor_count(c); i++) {
        const gguf_tensor *t = gguf_tensor_at(c, i);
        FZ_ASSERT(t && gguf_find_tensor(c, t->name) == t);
        FZ_ASSERT(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS && t->offset % a == 0);
        FZ_ASSERT(gguf_data_offset(c) + t->offset + t->size <= gguf_file_size(c) || t->size == 0);
        s += touch(t->data, t->size);
    }
    FZ_ASSERT(gguf_tensor_at(c, gguf_tensor_count(c)) == NULL && gguf_kv_key(c, -1) == NULL);
    gguf_close(c);
    volatile uint64_t sink = s; /* keeps the reads */
    (void)sink;
    return 0;
}
