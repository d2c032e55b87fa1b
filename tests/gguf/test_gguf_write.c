/* test_gguf_write.c - the writer: every value type, string arrays and arrays of arrays, tensors
 * streamed in odd-size chunks, read back identical; the layout (alignment of the data section
 * and of each tensor, trailing padding) is the one llama.cpp writes; misuse is refused. */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "harness.h"
#include "quant/qtypes.h"

static void tmp_path(char *buf, size_t cap, const char *name) {
    const char *d = getenv("HOTMOE_TMP");
    snprintf(buf, cap, "%s/%s", d && *d ? d : "/tmp", name);
}

static bool str_eq(gguf_str s, const char *c) { return s.len == strlen(c) && !memcmp(s.data, c, s.len); }

typedef struct {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
} tdecl;

static const tdecl k_tensors[] = {
    {"odd.f32", HM_TYPE_F32, 1, {7, 1, 1, 1}},              /* 28 bytes: padded to 32 */
    {"blk.0.ffn_up_exps.weight", HM_TYPE_Q4_0, 3, {64, 3, 2, 1}},
    {"q8", HM_TYPE_Q8_0, 2, {32, 5, 1, 1}},                 /* 170 bytes */
    {"four_d", HM_TYPE_F16, 4, {5, 1, 3, 2}},
    {"mx", HM_TYPE_MXFP4, 2, {32, 1, 1, 1}},                /* 17 bytes */
};
#define N_T (sizeof(k_tensors) / sizeof(k_tensors[0]))

static uint8_t pattern(size_t t, uint64_t i) { return (uint8_t)(t * 31 + i * 7 + (i >> 8)); }

static uint64_t tbytes(const tdecl *t) {
    uint64_t b = hm_row_size(t->type, t->ne[0]);
    for (int d = 1; d < 4; d++) b *= (uint64_t)t->ne[d];
    return b;
}

/* Writes the test file with the given alignment (0: default) in chunks of `chunk` bytes
 * (tensor data concatenated, so chunks straddle tensor boundaries). */
static hm_status write_file(const char *path, uint32_t align, size_t chunk) {
    gguf_writer *w;
    hm_error err;
    hm_status st = gguf_writer_open(path, &w, &err);
    if (st) return st;
    HM_CHECK(gguf_writer_set_str(w, "general.architecture", "testarch") == HM_OK);
    if (align) HM_CHECK(gguf_writer_set_u32(w, "general.alignment", align) == HM_OK);
    HM_CHECK(gguf_writer_set_u8(w, "v.u8", 200) == HM_OK);
    HM_CHECK(gguf_writer_set_i8(w, "v.i8", -100) == HM_OK);
    HM_CHECK(gguf_writer_set_u16(w, "v.u16", 60000) == HM_OK);
    HM_CHECK(gguf_writer_set_i16(w, "v.i16", -30000) == HM_OK);
    HM_CHECK(gguf_writer_set_u32(w, "v.u32", 4000000000u) == HM_OK);
    HM_CHECK(gguf_writer_set_i32(w, "v.i32", -2000000000) == HM_OK);
    HM_CHECK(gguf_writer_set_u64(w, "v.u64", UINT64_MAX) == HM_OK);
    HM_CHECK(gguf_writer_set_i64(w, "v.i64", INT64_MIN) == HM_OK);
    HM_CHECK(gguf_writer_set_f32(w, "v.f32", 1.5f) == HM_OK);
    HM_CHECK(gguf_writer_set_f64(w, "v.f64", -0.125) == HM_OK);
    HM_CHECK(gguf_writer_set_bool(w, "v.bool", true) == HM_OK);
    HM_CHECK(gguf_writer_set_str(w, "v.empty", "") == HM_OK);
    int32_t ai[5] = {1, -2, 3, -4, 5};
    float af[3] = {0.5f, -1.0f, 3.25f};
    double ad[2] = {1e300, -2.5};
    bool ab[4] = {true, false, false, true};
    uint64_t au[2] = {0, UINT64_MAX};
    HM_CHECK(gguf_writer_set_arr(w, "a.i32", GGUF_VT_INT32, ai, 5) == HM_OK);
    HM_CHECK(gguf_writer_set_arr(w, "a.f32", GGUF_VT_FLOAT32, af, 3) == HM_OK);
    HM_CHECK(gguf_writer_set_arr(w, "a.f64", GGUF_VT_FLOAT64, ad, 2) == HM_OK);
    HM_CHECK(gguf_writer_set_arr(w, "a.bool", GGUF_VT_BOOL, ab, 4) == HM_OK);
    HM_CHECK(gguf_writer_set_arr(w, "a.u64", GGUF_VT_UINT64, au, 2) == HM_OK);
    HM_CHECK(gguf_writer_set_arr(w, "a.empty", GGUF_VT_UINT8, NULL, 0) == HM_OK);
    const char *strs[] = {"hello", "", "wörld", "<|endoftext|>"};
    HM_CHECK(gguf_writer_set_arr_str(w, "a.str", strs, 4) == HM_OK);
    /* [[1,-2,3,-4,5], ["hello",""], [[0.5], []]] */
    HM_CHECK(gguf_writer_begin_arr_arr(w, "a.nested") == HM_OK);
    HM_CHECK(gguf_writer_set_arr(w, NULL, GGUF_VT_INT32, ai, 5) == HM_OK);
    HM_CHECK(gguf_writer_set_arr_str(w, NULL, strs, 2) == HM_OK);
    HM_CHECK(gguf_writer_begin_arr_arr(w, NULL) == HM_OK);
    HM_CHECK(gguf_writer_set_arr(w, NULL, GGUF_VT_FLOAT32, af, 1) == HM_OK);
    HM_CHECK(gguf_writer_set_arr(w, NULL, GGUF_VT_INT8, NULL, 0) == HM_OK);
    HM_CHECK(gguf_writer_set_u8(w, "not.now", 1) == HM_ERR_STATE); /* nested still open */
    HM_CHECK(gguf_writer_end_arr_arr(w) == HM_OK);
    HM_CHECK(gguf_writer_end_arr_arr(w) == HM_OK);
    HM_CHECK(gguf_writer_end_arr_arr(w) == HM_ERR_STATE);
    HM_CHECK(gguf_writer_set_u32(w, "v.u8", 1) == HM_ERR_ARG); /* repeated key */
    HM_CHECK(strstr(gguf_writer_errmsg(w), "v.u8") != NULL);
    for (size_t t = 0; t < N_T; t++)
        HM_CHECK(gguf_writer_add_tensor(w, k_tensors[t].name, k_tensors[t].type, k_tensors[t].n_dims,
                                        k_tensors[t].ne) == HM_OK);
    HM_CHECK(gguf_writer_begin_data(w) == HM_OK);
    HM_CHECK(gguf_writer_set_u8(w, "late", 1) == HM_ERR_STATE);
    /* all tensor bytes concatenated, written in chunks */
    uint8_t buf[64];
    size_t fill = 0;
    for (size_t t = 0; t < N_T; t++) {
        uint64_t n = tbytes(&k_tensors[t]);
        for (uint64_t i = 0; i < n; i++) {
            buf[fill++] = pattern(t, i);
            if (fill == chunk) {
                HM_CHECK(gguf_writer_write(w, buf, fill) == HM_OK);
                fill = 0;
            }
        }
    }
    HM_CHECK(gguf_writer_write(w, buf, fill) == HM_OK);
    HM_CHECK(gguf_writer_write(w, buf, 1) == HM_ERR_ARG); /* past the end */
    return gguf_writer_close(w, &err);
}

static void check_file(const char *path, uint32_t align) {
    gguf_ctx *c;
    hm_error err = {0};
    hm_status st = gguf_open(path, &c, &err);
    HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
    if (st) return;
    HM_CHECK(gguf_version(c) == 3);
    HM_CHECK(gguf_alignment(c) == align);
    HM_CHECK(gguf_data_offset(c) % align == 0);
    int64_t iv;
    uint64_t uv;
    double dv;
    bool bv;
    gguf_str sv;
    gguf_arr av;
    HM_CHECK(gguf_get_str(c, "general.architecture", &sv, &err) == HM_OK && str_eq(sv, "testarch"));
    HM_CHECK(gguf_get_int(c, "v.u8", &iv, &err) == HM_OK && iv == 200);
    HM_CHECK(gguf_get_int(c, "v.i8", &iv, &err) == HM_OK && iv == -100);
    HM_CHECK(gguf_get_int(c, "v.u16", &iv, &err) == HM_OK && iv == 60000);
    HM_CHECK(gguf_get_int(c, "v.i16", &iv, &err) == HM_OK && iv == -30000);
    HM_CHECK(gguf_get_uint(c, "v.u32", &uv, &err) == HM_OK && uv == 4000000000u);
    HM_CHECK(gguf_get_int(c, "v.i32", &iv, &err) == HM_OK && iv == -2000000000);
    HM_CHECK(gguf_get_uint(c, "v.u64", &uv, &err) == HM_OK && uv == UINT64_MAX);
    HM_CHECK(gguf_get_int(c, "v.u64", &iv, &err) == HM_ERR_RANGE && strstr(err.msg, "v.u64"));
    HM_CHECK(gguf_get_int(c, "v.i64", &iv, &err) == HM_OK && iv == INT64_MIN);
    HM_CHECK(gguf_get_uint(c, "v.i8", &uv, &err) == HM_ERR_RANGE);
    HM_CHECK(gguf_get_float(c, "v.f32", &dv, &err) == HM_OK && dv == 1.5);
    HM_CHECK(gguf_get_float(c, "v.f64", &dv, &err) == HM_OK && dv == -0.125);
    HM_CHECK(gguf_get_bool(c, "v.bool", &bv, &err) == HM_OK && bv);
    HM_CHECK(gguf_get_str(c, "v.empty", &sv, &err) == HM_OK && sv.len == 0);
    HM_CHECK(gguf_get_int(c, "v.f32", &iv, &err) == HM_ERR_FORMAT && strstr(err.msg, "v.f32"));
    HM_CHECK(gguf_get_int(c, "nope", &iv, &err) == HM_ERR_NOT_FOUND && strstr(err.msg, "nope"));
    HM_CHECK(gguf_find_key(c, "general.alignment") == (align == GGUF_DEFAULT_ALIGNMENT ? -1 : 1));
    HM_CHECK(gguf_get_arr(c, "a.i32", &av, &err) == HM_OK && av.type == GGUF_VT_INT32 && av.n == 5);
    HM_CHECK(gguf_arr_int(&av, 1) == -2 && gguf_arr_int(&av, 4) == 5);
    HM_CHECK(gguf_get_arr(c, "a.f32", &av, &err) == HM_OK && av.n == 3 && gguf_arr_float(&av, 2) == 3.25);
    HM_CHECK(gguf_get_arr(c, "a.f64", &av, &err) == HM_OK && gguf_arr_float(&av, 0) == 1e300);
    HM_CHECK(gguf_get_arr(c, "a.bool", &av, &err) == HM_OK && av.type == GGUF_VT_BOOL &&
             gguf_arr_int(&av, 0) == 1 && gguf_arr_int(&av, 1) == 0 && gguf_arr_int(&av, 3) == 1);
    HM_CHECK(gguf_get_arr(c, "a.u64", &av, &err) == HM_OK && (uint64_t)gguf_arr_int(&av, 1) == UINT64_MAX);
    HM_CHECK(gguf_get_arr(c, "a.empty", &av, &err) == HM_OK && av.n == 0 && av.type == GGUF_VT_UINT8);
    HM_CHECK(gguf_get_arr(c, "a.str", &av, &err) == HM_OK && av.type == GGUF_VT_STRING && av.n == 4);
    HM_CHECK(str_eq(gguf_arr_str(&av, 0), "hello") && gguf_arr_str(&av, 1).len == 0);
    HM_CHECK(str_eq(gguf_arr_str(&av, 2), "wörld") && str_eq(gguf_arr_str(&av, 3), "<|endoftext|>"));
    HM_CHECK(gguf_get_arr(c, "a.nested", &av, &err) == HM_OK && av.type == GGUF_VT_ARRAY && av.n == 3);
    gguf_arr a0 = gguf_arr_arr(&av, 0), a1 = gguf_arr_arr(&av, 1), a2 = gguf_arr_arr(&av, 2);
    HM_CHECK(a0.type == GGUF_VT_INT32 && a0.n == 5 && gguf_arr_int(&a0, 3) == -4);
    HM_CHECK(a1.type == GGUF_VT_STRING && a1.n == 2 && str_eq(gguf_arr_str(&a1, 0), "hello"));
    HM_CHECK(a2.type == GGUF_VT_ARRAY && a2.n == 2);
    gguf_arr a20 = gguf_arr_arr(&a2, 0), a21 = gguf_arr_arr(&a2, 1);
    HM_CHECK(a20.type == GGUF_VT_FLOAT32 && a20.n == 1 && gguf_arr_float(&a20, 0) == 0.5);
    HM_CHECK(a21.type == GGUF_VT_INT8 && a21.n == 0);
    /* tensors: file order, offsets aligned and consecutive (as llama.cpp requires), data intact */
    HM_REQUIRE(gguf_tensor_count(c) == (int64_t)N_T);
    uint64_t expect_off = 0;
    for (size_t t = 0; t < N_T; t++) {
        const gguf_tensor *g = gguf_tensor_at(c, (int64_t)t);
        const tdecl *d = &k_tensors[t];
        HM_CHECK(!strcmp(g->name, d->name) && g->type == d->type && g->n_dims == d->n_dims);
        HM_CHECK(!memcmp(g->ne, d->ne, sizeof(g->ne)));
        HM_CHECK(g->size == tbytes(d));
        HM_CHECK_MSG(g->offset == expect_off, "tensor %zu offset %llu expected %llu", t,
                     (unsigned long long)g->offset, (unsigned long long)expect_off);
        HM_CHECK(gguf_find_tensor(c, d->name) == g);
        const uint8_t *p = g->data;
        uint64_t bad = 0;
        for (uint64_t i = 0; i < g->size; i++) bad += p[i] != pattern(t, i);
        HM_CHECK_MSG(bad == 0, "tensor %s: %llu bytes differ", d->name, (unsigned long long)bad);
        expect_off += (g->size + align - 1) / align * align;
    }
    HM_CHECK(gguf_find_tensor(c, "absent") == NULL);
    /* the file ends padded after the last tensor, as llama.cpp writes it */
    HM_CHECK(gguf_file_size(c) == gguf_data_offset(c) + expect_off);
    gguf_close(c);
}

static void test_roundtrip_default_alignment(void) {
    char path[512];
    tmp_path(path, sizeof(path), "gguf_rt_a32.gguf");
    HM_REQUIRE(write_file(path, 0, 13) == HM_OK);
    check_file(path, 32);
    unlink(path);
}

static void test_roundtrip_alignment_64_chunk_1(void) {
    char path[512];
    tmp_path(path, sizeof(path), "gguf_rt_a64.gguf");
    HM_REQUIRE(write_file(path, 64, 1) == HM_OK);
    check_file(path, 64);
    unlink(path);
}

static void test_roundtrip_alignment_4096_big_chunks(void) {
    char path[512];
    tmp_path(path, sizeof(path), "gguf_rt_a4096.gguf");
    HM_REQUIRE(write_file(path, 4096, 64) == HM_OK);
    check_file(path, 4096);
    unlink(path);
}

static void test_writer_misuse(void) {
    char path[512];
    tmp_path(path, sizeof(path), "gguf_misuse.gguf");
    gguf_writer *w;
    hm_error err;
    HM_REQUIRE(gguf_writer_open(path, &w, &err) == HM_OK);
    HM_CHECK(gguf_writer_set_u32(w, "general.alignment", 48) == HM_ERR_ARG);
    HM_CHECK(gguf_writer_set_u64(w, "general.alignment", 64) == HM_ERR_ARG);
    HM_CHECK(gguf_writer_set_str(w, NULL, "x") == HM_ERR_ARG);
    int64_t ne[2] = {33, 2};
    HM_CHECK(gguf_writer_add_tensor(w, "bad", HM_TYPE_Q4_0, 2, ne) == HM_ERR_ARG);
    HM_CHECK(strstr(gguf_writer_errmsg(w), "bad") != NULL);
    HM_CHECK(gguf_writer_add_tensor(w, "t", 3333, 2, ne) == HM_ERR_ARG);
    HM_CHECK(gguf_writer_add_tensor(w, "t", HM_TYPE_F32, 5, ne) == HM_ERR_ARG);
    HM_CHECK(gguf_writer_add_tensor(w, "t", HM_TYPE_F32, 2, ne) == HM_OK);
    HM_CHECK(gguf_writer_add_tensor(w, "t", HM_TYPE_F32, 2, ne) == HM_ERR_ARG);
    HM_CHECK(gguf_writer_write(w, "x", 1) == HM_ERR_STATE);
    HM_CHECK(gguf_writer_begin_data(w) == HM_OK);
    HM_CHECK(gguf_writer_write(w, "abc", 3) == HM_OK);
    /* closing with 3 of 264 bytes written fails and removes the file */
    HM_CHECK(gguf_writer_close(w, &err) == HM_ERR_STATE);
    HM_CHECK(strstr(err.msg, "3 of 264 bytes") != NULL);
    struct stat sb;
    HM_CHECK(stat(path, &sb) != 0);
    HM_CHECK(gguf_writer_open("/nonexistent-dir/x.gguf", &w, &err) == HM_ERR_IO);
}

static void test_metadata_only_file(void) {
    char path[512];
    tmp_path(path, sizeof(path), "gguf_meta_only.gguf");
    gguf_writer *w;
    hm_error err;
    HM_REQUIRE(gguf_writer_open(path, &w, &err) == HM_OK);
    HM_CHECK(gguf_writer_set_str(w, "general.name", "x") == HM_OK);
    HM_CHECK(gguf_writer_close(w, &err) == HM_OK); /* begin_data is implied */
    gguf_ctx *c;
    HM_REQUIRE(gguf_open(path, &c, &err) == HM_OK);
    HM_CHECK(gguf_tensor_count(c) == 0 && gguf_kv_count(c) == 1);
    HM_CHECK(!strcmp(gguf_kv_key(c, 0), "general.name") && gguf_kv_type(c, 0) == GGUF_VT_STRING);
    gguf_close(c);
    unlink(path);
}

/* Many tensor names grow the reader's name arena past its first allocation; keys read before
 * the tensor table must still be right (a big model's file once showed empty keys). */
static void test_many_tensors_keys_stay_valid(void) {
    char path[512];
    tmp_path(path, sizeof(path), "gguf_many_tensors.gguf");
    gguf_writer *w;
    hm_error err;
    HM_REQUIRE(gguf_writer_open(path, &w, &err) == HM_OK);
    HM_CHECK(gguf_writer_set_str(w, "general.architecture", "qwen3moe") == HM_OK);
    HM_CHECK(gguf_writer_set_u32(w, "qwen3moe.block_count", 48) == HM_OK);
    enum { N = 600 };
    const int64_t ne[1] = {8};
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof(name), "blk.%d.ffn_gate_exps_with_a_long_name.weight", i);
        HM_CHECK(gguf_writer_add_tensor(w, name, HM_TYPE_F32, 1, ne) == HM_OK);
    }
    HM_REQUIRE(gguf_writer_begin_data(w) == HM_OK);
    float zeros[8] = {0};
    for (int i = 0; i < N; i++) HM_CHECK(gguf_writer_write(w, zeros, sizeof(zeros)) == HM_OK);
    HM_REQUIRE(gguf_writer_close(w, &err) == HM_OK);
    gguf_ctx *c;
    HM_REQUIRE(gguf_open(path, &c, &err) == HM_OK);
    HM_CHECK(!strcmp(gguf_kv_key(c, 0), "general.architecture"));
    HM_CHECK(!strcmp(gguf_kv_key(c, 1), "qwen3moe.block_count"));
    gguf_str arch = {0};
    HM_CHECK(gguf_get_str(c, "general.architecture", &arch, &err) == HM_OK && str_eq(arch, "qwen3moe"));
    HM_CHECK(gguf_find_tensor(c, "blk.599.ffn_gate_exps_with_a_long_name.weight") != NULL);
    gguf_close(c);
    unlink(path);
}

HM_TEST_MAIN(test_roundtrip_default_alignment, test_roundtrip_alignment_64_chunk_1,
             test_roundtrip_alignment_4096_big_chunks, test_writer_misuse, test_metadata_only_file,
             test_many_tensors_keys_stay_valid)
