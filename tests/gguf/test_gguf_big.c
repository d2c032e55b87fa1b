/* test_gguf_big.c - 64-bit sizes and offsets: a sparse file (no disk used for the hole) whose
 * first tensor is 5 GiB, so the second tensor's offset is past 4 GiB; both open with the
 * right offsets, sizes and data pointers, and the bytes written at the far end are read back. */
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf_image.h"
#include "harness.h"
#include "quant/qtypes.h"

#define BIG_BYTES (5ull << 30)

static void test_tensor_past_4gib(void) {
    char path[512];
    const char *d = getenv("HOTMOE_TMP");
    snprintf(path, sizeof(path), "%s/gguf_big_sparse.gguf", d && *d ? d : "/tmp");
    gimg g = {0};
    gi_header(&g, 3, 2, 1);
    gi_str(&g, "general.architecture");
    gi_u32(&g, GGUF_VT_STRING);
    gi_str(&g, "sparse");
    int64_t ne_big[2] = {1ll << 28, 5}; /* f32: 5 GiB */
    int64_t ne_small[1] = {8};
    gi_tensor(&g, "big", 2, ne_big, HM_TYPE_F32, 0);
    gi_tensor(&g, "after", 1, ne_small, HM_TYPE_F32, BIG_BYTES);
    gi_pad(&g, 32);
    uint64_t data_offset = g.n;
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
    HM_REQUIRE(fd >= 0);
    HM_CHECK(write(fd, g.b, g.n) == (ssize_t)g.n);
    gi_free(&g);
    HM_CHECK(ftruncate(fd, (off_t)(data_offset + BIG_BYTES + 32)) == 0);
    float tail[8];
    for (int i = 0; i < 8; i++) tail[i] = 0.25f * (float)i - 1.0f;
    HM_CHECK(pwrite(fd, tail, sizeof(tail), (off_t)(data_offset + BIG_BYTES)) == sizeof(tail));
    close(fd);

    gguf_ctx *c;
    hm_error err;
    hm_status st = gguf_open(path, &c, &err);
    HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
    if (st == HM_OK) {
        HM_CHECK(gguf_file_size(c) == data_offset + BIG_BYTES + 32);
        HM_CHECK(gguf_data_offset(c) == data_offset);
        const gguf_tensor *big = gguf_find_tensor(c, "big"), *after = gguf_find_tensor(c, "after");
        HM_REQUIRE(big && after);
        HM_CHECK(big->size == BIG_BYTES && big->offset == 0);
        HM_CHECK(big->ne[0] == 1ll << 28 && big->ne[1] == 5 && big->n_dims == 2);
        HM_CHECK(after->offset == BIG_BYTES && after->size == 32);
        HM_CHECK((const uint8_t *)after->data - (const uint8_t *)big->data == (ptrdiff_t)BIG_BYTES);
        HM_CHECK(!memcmp(after->data, tail, sizeof(tail)));
        gguf_close(c);
    }
    /* one byte short: the far tensor no longer fits, and the message says where */
    HM_CHECK(truncate(path, (off_t)(data_offset + BIG_BYTES + 31)) == 0);
    HM_CHECK(gguf_open(path, &c, &err) == HM_ERR_FORMAT);
    HM_CHECK_MSG(strstr(err.msg, "tensor 1 'after': data [offset 5368709120, size 32] extends past "
                        "end of file") != NULL, "%s", err.msg);
    unlink(path);
}

HM_TEST_MAIN(test_tensor_past_4gib)
