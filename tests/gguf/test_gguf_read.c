/* test_gguf_read.c - the reader's validation: each malformed image is refused with one line that
 * names the field (and, where checked, its byte offset); a small valid file truncated at every
 * byte position fails cleanly (run under ASan, each image sits in a buffer of exactly its size,
 * so any read past the end is caught). */
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf_image.h"
#include "harness.h"
#include "quant/qtypes.h"

/* Opens a copy of the image in a buffer of exactly its size (*copy: free after gguf_close). */
static hm_status open_exact(const uint8_t *b, size_t n, gguf_ctx **c, hm_error *err, void **copy) {
    *copy = malloc(n ? n : 1);
    if (n) memcpy(*copy, b, n);
    return gguf_open_mem(*copy, n, c, err);
}

/* Expects the image to be refused with a message containing every given substring. */
static void expect_fail_(gimg *g, const char *const *subs, int line) {
    gguf_ctx *c = NULL;
    hm_error err = {0};
    void *copy;
    hm_status st = open_exact(g->b, g->n, &c, &err, &copy);
    gguf_close(c);
    free(copy);
    if (st == HM_OK) {
        fprintf(stderr, "line %d: image accepted, expected failure\n", line);
        HM_CHECK(st != HM_OK);
        return;
    }
    HM_CHECK_MSG(!strncmp(err.msg, "gguf: ", 6), "line %d: %s", line, err.msg);
    HM_CHECK_MSG(!strchr(err.msg, '\n'), "line %d: multi-line message", line);
    for (int i = 0; subs[i]; i++)
        HM_CHECK_MSG(strstr(err.msg, subs[i]) != NULL, "line %d: '%s' not in: %s", line, subs[i],
                     err.msg);
}
#define EXPECT_FAIL(g, ...)                                                                \
    do {                                                                                   \
        const char *subs_[] = {__VA_ARGS__, NULL};                                         \
        expect_fail_(g, subs_, __LINE__);                                                  \
    } while (0)

/* A valid image: one u32 key, tensor "t" f32 [8] at offset 0. */
static void valid_image(gimg *g, uint32_t version) {
    gi_header(g, version, 1, 1);
    gi_kv_u32(g, "k", 7);
    int64_t ne[1] = {8};
    gi_tensor(g, "t", 1, ne, HM_TYPE_F32, 0);
    gi_pad(g, 32);
    gi_zeros(g, 32);
}

static void test_valid_v2_v3(void) {
    for (uint32_t v = 2; v <= 3; v++) {
        gimg g = {0};
        valid_image(&g, v);
        gguf_ctx *c;
        hm_error err;
        HM_CHECK_MSG(gguf_open_mem(g.b, g.n, &c, &err) == HM_OK, "%s", err.msg);
        HM_CHECK(gguf_version(c) == v && gguf_tensor_count(c) == 1 && gguf_kv_count(c) == 1);
        HM_CHECK(gguf_data_offset(c) == 96 && gguf_tensor_at(c, 0)->size == 32);
        gguf_close(c);
        gi_free(&g);
    }
}

static void test_bad_magic_and_version(void) {
    gimg g = {0};
    gi_bytes(&g, "GGML", 4);
    gi_zeros(&g, 40);
    EXPECT_FAIL(&g, "not a GGUF file", "magic", "byte 0");
    gi_free(&g);
    gi_bytes(&g, "GG", 2);
    EXPECT_FAIL(&g, "magic");
    gi_free(&g);
    EXPECT_FAIL(&g, "magic"); /* empty image */
    valid_image(&g, 1);
    EXPECT_FAIL(&g, "version 1", "byte 4");
    gi_free(&g);
    valid_image(&g, 4);
    EXPECT_FAIL(&g, "version 4", "byte 4");
    gi_free(&g);
    valid_image(&g, 0x03000000u);
    EXPECT_FAIL(&g, "big-endian");
    gi_free(&g);
}

static void test_huge_counts(void) {
    gimg g = {0};
    gi_header(&g, 3, 1ull << 60, 0);
    gi_zeros(&g, 64);
    EXPECT_FAIL(&g, "tensor count", "byte 8");
    gi_free(&g);
    gi_header(&g, 3, 0, UINT64_MAX);
    gi_zeros(&g, 64);
    EXPECT_FAIL(&g, "key/value count", "byte 16");
    gi_free(&g);
    /* array length impossible for the bytes left */
    gi_header(&g, 3, 0, 1);
    gi_str(&g, "arr");
    gi_u32(&g, GGUF_VT_ARRAY);
    gi_u32(&g, GGUF_VT_UINT32);
    gi_u64(&g, 1ull << 40);
    gi_zeros(&g, 16);
    EXPECT_FAIL(&g, "key 0 'arr'", "array length 1099511627776", "byte 43");
    gi_free(&g);
}

static void test_strings_past_end(void) {
    gimg g = {0};
    gi_header(&g, 3, 0, 1);
    gi_u64(&g, 1000); /* key length */
    gi_bytes(&g, "abc", 3);
    gi_zeros(&g, 16);
    EXPECT_FAIL(&g, "key 0", "key length 1000", "byte 24", "extends past end");
    gi_free(&g);
    gi_header(&g, 3, 0, 1);
    gi_str(&g, "s");
    gi_u32(&g, GGUF_VT_STRING);
    gi_u64(&g, UINT64_MAX);
    gi_zeros(&g, 8);
    EXPECT_FAIL(&g, "key 0 's'", "string length", "byte 37");
    gi_free(&g);
    /* a string inside a string array */
    gi_header(&g, 3, 0, 1);
    gi_str(&g, "toks");
    gi_u32(&g, GGUF_VT_ARRAY);
    gi_u32(&g, GGUF_VT_STRING);
    gi_u64(&g, 2);
    gi_str(&g, "ok");
    gi_u64(&g, 99);
    gi_bytes(&g, "x", 1);
    EXPECT_FAIL(&g, "key 0 'toks'", "array string length 99");
    gi_free(&g);
}

static void test_bad_values(void) {
    gimg g = {0};
    gi_header(&g, 3, 0, 1);
    gi_str(&g, "b");
    gi_u32(&g, GGUF_VT_BOOL);
    gi_u8(&g, 2);
    EXPECT_FAIL(&g, "key 0 'b'", "bool value 2", "byte 37");
    gi_free(&g);
    gi_header(&g, 3, 0, 1);
    gi_str(&g, "t");
    gi_u32(&g, 13);
    gi_zeros(&g, 8);
    EXPECT_FAIL(&g, "key 0 't'", "unknown value type 13", "byte 33");
    gi_free(&g);
    gi_header(&g, 3, 0, 1);
    gi_str(&g, "a");
    gi_u32(&g, GGUF_VT_ARRAY);
    gi_u32(&g, 77);
    gi_u64(&g, 0);
    EXPECT_FAIL(&g, "unknown array element type 77");
    gi_free(&g);
    /* arrays of arrays nested 20 deep */
    gi_header(&g, 3, 0, 1);
    gi_str(&g, "deep");
    gi_u32(&g, GGUF_VT_ARRAY);
    for (int i = 0; i < 20; i++) {
        gi_u32(&g, GGUF_VT_ARRAY);
        gi_u64(&g, 1);
    }
    gi_u32(&g, GGUF_VT_UINT8);
    gi_u64(&g, 0);
    EXPECT_FAIL(&g, "key 0 'deep'", "nested deeper than 16");
    gi_free(&g);
    /* a key with a NUL byte */
    gi_header(&g, 3, 0, 1);
    gi_u64(&g, 3);
    gi_bytes(&g, "a\0b", 3);
    gi_u32(&g, GGUF_VT_UINT8);
    gi_u8(&g, 0);
    EXPECT_FAIL(&g, "key 0", "NUL");
    gi_free(&g);
}

static void test_duplicates(void) {
    gimg g = {0};
    gi_header(&g, 3, 0, 3);
    gi_kv_u32(&g, "x", 1);
    gi_kv_u32(&g, "y", 1);
    gi_kv_u32(&g, "x", 2);
    EXPECT_FAIL(&g, "key 2 'x'", "duplicate of key 0", "byte 58");
    gi_free(&g);
    int64_t ne[1] = {8};
    gi_header(&g, 3, 2, 0);
    gi_tensor(&g, "w", 1, ne, HM_TYPE_F32, 0);
    gi_tensor(&g, "w", 1, ne, HM_TYPE_F32, 32);
    gi_pad(&g, 32);
    gi_zeros(&g, 64);
    EXPECT_FAIL(&g, "tensor 1 'w'", "duplicate of tensor 0");
    gi_free(&g);
}

static void test_alignment_key(void) {
    int64_t ne[1] = {8};
    gimg g = {0};
    gi_header(&g, 3, 1, 1);
    gi_kv_u32(&g, "general.alignment", 48);
    gi_tensor(&g, "t", 1, ne, HM_TYPE_F32, 0);
    gi_zeros(&g, 200);
    EXPECT_FAIL(&g, "general.alignment", "alignment 48", "power of two", "byte 53");
    gi_free(&g);
    gi_header(&g, 3, 0, 1);
    gi_kv_u32(&g, "general.alignment", 0);
    EXPECT_FAIL(&g, "alignment 0");
    gi_free(&g);
    gi_header(&g, 3, 0, 1);
    gi_str(&g, "general.alignment");
    gi_u32(&g, GGUF_VT_UINT64);
    gi_u64(&g, 64);
    EXPECT_FAIL(&g, "general.alignment", "type u64", "expected u32");
    gi_free(&g);
    /* a valid non-default alignment moves the data section */
    gi_header(&g, 3, 1, 1);
    gi_kv_u32(&g, "general.alignment", 256);
    gi_tensor(&g, "t", 1, ne, HM_TYPE_F32, 0);
    gi_pad(&g, 256);
    gi_zeros(&g, 32);
    gguf_ctx *c;
    hm_error err;
    HM_CHECK_MSG(gguf_open_mem(g.b, g.n, &c, &err) == HM_OK, "%s", err.msg);
    HM_CHECK(gguf_alignment(c) == 256 && gguf_data_offset(c) == 256);
    HM_CHECK(gguf_tensor_at(c, 0)->data == g.b + 256);
    gguf_close(c);
    gi_free(&g);
}

static void one_tensor(gimg *g, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t offset,
                       size_t data_bytes) {
    gi_header(g, 3, 1, 0);
    gi_tensor(g, "blk.0.ffn_up_exps.weight", n_dims, ne, type, offset);
    gi_pad(g, 32);
    gi_zeros(g, data_bytes);
}

static void test_tensor_info(void) {
    gimg g = {0};
    int64_t ne[5] = {32, 2, 2, 2, 2};
    /* name (8 + 24 bytes) follows the 24-byte header: n_dims at 56, ne at 60, type at 60+8*n */
    one_tensor(&g, 5, ne, HM_TYPE_F32, 0, 1024);
    EXPECT_FAIL(&g, "tensor 0 'blk.0.ffn_up_exps.weight'", "n_dims 5", "byte 56");
    gi_free(&g);
    one_tensor(&g, 0, ne, HM_TYPE_F32, 0, 1024);
    EXPECT_FAIL(&g, "n_dims 0");
    gi_free(&g);
    one_tensor(&g, 2, ne, 4, 0, 1024);
    EXPECT_FAIL(&g, "unknown type 4 in tensor 'blk.0.ffn_up_exps.weight'", "byte 76");
    gi_free(&g);
    one_tensor(&g, 2, ne, 1000, 0, 1024);
    EXPECT_FAIL(&g, "unknown type 1000");
    gi_free(&g);
    int64_t odd[2] = {33, 2};
    one_tensor(&g, 2, odd, HM_TYPE_Q4_0, 0, 1024);
    EXPECT_FAIL(&g, "ne[0] = 33", "block size 32", "q4_0");
    gi_free(&g);
    int64_t neg[2] = {32, -1};
    one_tensor(&g, 2, neg, HM_TYPE_F32, 0, 1024);
    EXPECT_FAIL(&g, "ne[1] = -1", "negative", "byte 68");
    gi_free(&g);
    int64_t big[3] = {1ll << 40, 1ll << 20, 1ll << 10};
    one_tensor(&g, 3, big, HM_TYPE_F32, 0, 1024);
    EXPECT_FAIL(&g, "overflows int64", "ne[2]", "byte 76");
    gi_free(&g);
    /* ne = 0 is accepted, as llama.cpp does: an empty tensor */
    int64_t zero[2] = {32, 0};
    one_tensor(&g, 2, zero, HM_TYPE_Q8_0, 0, 0);
    gguf_ctx *c;
    hm_error err;
    HM_CHECK_MSG(gguf_open_mem(g.b, g.n, &c, &err) == HM_OK, "%s", err.msg);
    if (c) {
        HM_CHECK(gguf_tensor_at(c, 0)->size == 0 && gguf_tensor_at(c, 0)->ne[1] == 0);
        gguf_close(c);
    }
    gi_free(&g);
    int64_t bytes_ovf[2] = {1ll << 62, 1}; /* elements fit, f32 bytes do not */
    one_tensor(&g, 2, bytes_ovf, HM_TYPE_F32, 0, 1024);
    EXPECT_FAIL(&g, "size in bytes overflows");
    gi_free(&g);
}

static void test_tensor_data_ranges(void) {
    gimg g = {0};
    int64_t ne[1] = {8}; /* f32: 32 bytes; info ends at 24+8+24+4+8+4+8 = 80, data at 96 */
    one_tensor(&g, 1, ne, HM_TYPE_F32, 8, 64);
    EXPECT_FAIL(&g, "data offset 8", "byte 72", "not a multiple of the alignment 32");
    gi_free(&g);
    one_tensor(&g, 1, ne, HM_TYPE_F32, 0, 31);
    EXPECT_FAIL(&g, "tensor 0 'blk.0.ffn_up_exps.weight'",
                "data [offset 0, size 32] extends past end of file (size 127", "at byte 72");
    gi_free(&g);
    one_tensor(&g, 1, ne, HM_TYPE_F32, UINT64_MAX - 31, 64);
    EXPECT_FAIL(&g, "extends past end of file");
    gi_free(&g);
    /* overlapping tensors */
    int64_t ne2[1] = {16};
    gi_header(&g, 3, 2, 0);
    gi_tensor(&g, "a", 1, ne2, HM_TYPE_F32, 0);
    gi_tensor(&g, "b", 1, ne, HM_TYPE_F32, 32);
    gi_pad(&g, 32);
    gi_zeros(&g, 96);
    EXPECT_FAIL(&g, "tensor 1 'b'", "overlaps tensor 0 'a'");
    gi_free(&g);
    /* tensors out of file order are fine when they do not overlap */
    gi_header(&g, 3, 2, 0);
    gi_tensor(&g, "a", 1, ne, HM_TYPE_F32, 32);
    gi_tensor(&g, "b", 1, ne, HM_TYPE_F32, 0);
    gi_pad(&g, 32);
    gi_zeros(&g, 64);
    gguf_ctx *c;
    hm_error err;
    HM_CHECK_MSG(gguf_open_mem(g.b, g.n, &c, &err) == HM_OK, "%s", err.msg);
    if (c) {
        HM_CHECK(gguf_find_tensor(c, "a")->offset == 32);
        gguf_close(c);
    }
    gi_free(&g);
}

/* Every prefix of a valid file written by the writer (nested arrays, string arrays, several
 * tensors) fails cleanly, except prefixes that only drop trailing padding. */
static void test_truncated_everywhere(void) {
    char path[512];
    const char *d = getenv("HOTMOE_TMP");
    snprintf(path, sizeof(path), "%s/gguf_trunc.gguf", d && *d ? d : "/tmp");
    gguf_writer *w;
    hm_error err;
    HM_REQUIRE(gguf_writer_open(path, &w, &err) == HM_OK);
    const char *strs[] = {"a", "bc", ""};
    uint16_t u16s[3] = {1, 2, 3};
    gguf_writer_set_str(w, "general.architecture", "x");
    gguf_writer_set_arr_str(w, "tok", strs, 3);
    gguf_writer_begin_arr_arr(w, "nest");
    gguf_writer_set_arr(w, NULL, GGUF_VT_UINT16, u16s, 3);
    gguf_writer_set_arr_str(w, NULL, strs, 2);
    gguf_writer_end_arr_arr(w);
    gguf_writer_set_f64(w, "f", 2.0);
    int64_t ne1[1] = {4}, ne2[2] = {32, 2};
    gguf_writer_add_tensor(w, "t0", HM_TYPE_F32, 1, ne1);
    gguf_writer_add_tensor(w, "t1", HM_TYPE_Q8_0, 2, ne2);
    HM_REQUIRE(gguf_writer_begin_data(w) == HM_OK);
    uint8_t data[16 + 68];
    memset(data, 0x5a, sizeof(data));
    gguf_writer_write(w, data, sizeof(data));
    HM_REQUIRE(gguf_writer_close(w, &err) == HM_OK);
    FILE *f = fopen(path, "rb");
    HM_REQUIRE(f);
    uint8_t img[4096];
    size_t n = fread(img, 1, sizeof(img), f);
    fclose(f);
    unlink(path);
    gguf_ctx *c;
    HM_REQUIRE(gguf_open_mem(img, n, &c, &err) == HM_OK);
    const gguf_tensor *t1 = gguf_find_tensor(c, "t1");
    size_t data_end = (size_t)(gguf_data_offset(c) + t1->offset + t1->size);
    gguf_close(c);
    int bad = 0;
    for (size_t len = 0; len < n; len++) {
        c = NULL;
        void *copy;
        hm_status st = open_exact(img, len, &c, &err, &copy);
        bool should_fail = len < data_end;
        if (should_fail != (st != HM_OK) || (st && strncmp(err.msg, "gguf: ", 6))) {
            if (bad++ < 5) fprintf(stderr, "len %zu: status %d %s\n", len, st, err.msg);
        }
        gguf_close(c);
        free(copy);
    }
    HM_CHECK_MSG(bad == 0, "%d truncations misjudged", bad);
}

static void test_open_errors(void) {
    gguf_ctx *c;
    hm_error err;
    HM_CHECK(gguf_open("/nonexistent/x.gguf", &c, &err) == HM_ERR_NOT_FOUND && c == NULL);
    HM_CHECK(strstr(err.msg, "cannot open") != NULL);
    HM_CHECK(gguf_open("/", &c, &err) == HM_ERR_IO && strstr(err.msg, "not a regular file"));
    char path[512];
    const char *d = getenv("HOTMOE_TMP");
    snprintf(path, sizeof(path), "%s/gguf_empty.gguf", d && *d ? d : "/tmp");
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    HM_REQUIRE(fd >= 0);
    close(fd);
    HM_CHECK(gguf_open(path, &c, &err) == HM_ERR_FORMAT && strstr(err.msg, "empty"));
    unlink(path);
}

HM_TEST_MAIN(test_valid_v2_v3, test_bad_magic_and_version, test_huge_counts, test_strings_past_end,
             test_bad_values, test_duplicates, test_alignment_key, test_tensor_info,
             test_tensor_data_ranges, test_truncated_everywhere, test_open_errors)
