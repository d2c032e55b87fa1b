/* test_cuda_host.c - pinned registration of a read-only file mapping and the copy lane
 * (cuda/cuda_host.h). Everywhere: the packing arithmetic, and that a build without CUDA refuses
 * cleanly. With a GPU: a 64 MiB temporary file mapped read-only and registered (unaligned
 * range); experts' bytes copied through the lane, directly from the registration and through
 * pinned staging, compared byte for byte after a device round trip; the double-buffer protocol
 * under a slow consumer (a host function holds the consumer's stream: a copy into a buffer the
 * consumer has not released would change what it reads); argument errors; the bandwidth of both
 * paths printed; and calib_run measuring host->device through a lane over a forged model. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda_host.h"
#include "cuda_test_util.h"
#include "harness.h"
#include "../forge/forge_test_util.h"
#include "moe/offload.h"
#include "runtime/calibrate.h"

static void test_bytes(void) {
    const cuda_host_range r[4] = {{"a", 1}, {"b", 256}, {"c", 0}, {"d", 257}};
    HM_CHECK(cuda_copy_lane_bytes(r, 4) == 256 + 256 + 0 + 512);
    HM_CHECK(cuda_copy_lane_bytes(r, 0) == 0);
}

/* Without a device (or CUDA) every entry point refuses with a message, nothing crashes. */
static void test_refusals(void) {
    if (tu_gpu_count() > 0) return;
    hm_error err;
    cuda_host_reg *reg = (cuda_host_reg *)1;
    static const char buf[64];
    HM_CHECK(cuda_host_register(buf, sizeof(buf), &reg, &err) != HM_OK && reg == NULL);
    HM_CHECK(err.msg[0] != '\0');
    cuda_copy_lane *l = (cuda_copy_lane *)1;
    HM_CHECK(cuda_copy_lane_init(0, 1 << 20, NULL, &l, &err) != HM_OK && l == NULL);
    HM_CHECK(!cuda_host_reg_covers(NULL, buf, 1));
    cuda_host_unregister(NULL);
    cuda_copy_lane_free(NULL);
}

#ifdef HOTMOE_HAVE_CUDA
#include <cuda_runtime_api.h>

enum { FILE_BYTES = 64 << 20 };

typedef struct {
    char path[512];
    int fd;
    uint8_t *map; /* PROT_READ, MAP_SHARED */
} mapped_file;

static uint8_t pattern(size_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static int map_file(mapped_file *f) {
    char name[64];
    snprintf(name, sizeof(name), "cuda-host-%ld.bin", (long)getpid());
    ft_path(f->path, sizeof(f->path), name);
    FILE *w = fopen(f->path, "wb");
    if (!w) return 0;
    uint8_t *chunk = malloc(1 << 20);
    for (size_t o = 0; o < FILE_BYTES && chunk; o += 1 << 20) {
        for (size_t i = 0; i < (1 << 20); i++) chunk[i] = pattern(o + i);
        fwrite(chunk, 1, 1 << 20, w);
    }
    free(chunk);
    fclose(w);
    f->fd = open(f->path, O_RDONLY);
    if (f->fd < 0) return 0;
    f->map = mmap(NULL, FILE_BYTES, PROT_READ, MAP_SHARED, f->fd, 0);
    return f->map != MAP_FAILED;
}

static void unmap_file(mapped_file *f) {
    munmap(f->map, FILE_BYTES);
    close(f->fd);
    unlink(f->path);
}

/* Copies src into buffer b, reads the buffer back through stream s, compares each range. */
static void copy_and_check(cuda_copy_lane *l, int b, const cuda_host_range *src, int n,
                           cudaStream_t s, const char *what) {
    size_t off[16];
    hm_error err;
    HM_REQUIRE(n <= 16);
    HM_REQUIRE(cuda_copy_lane_copy(l, b, 40 + b, src, n, off, &err) == HM_OK);
    HM_CHECK(cuda_copy_lane_layer(l, b) == 40 + b);
    HM_REQUIRE(cuda_copy_lane_wait(l, b, s, &err) == HM_OK);
    const size_t total = cuda_copy_lane_bytes(src, n);
    uint8_t *back = malloc(total ? total : 1);
    HM_REQUIRE(back);
    HM_REQUIRE(cudaMemcpyAsync(back, cuda_copy_lane_buf(l, b), total, cudaMemcpyDeviceToHost, s) ==
               cudaSuccess);
    HM_REQUIRE(cuda_copy_lane_release(l, b, s, &err) == HM_OK);
    HM_REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        HM_CHECK_MSG(off[i] == o && off[i] % CUDA_COPY_LANE_ALIGN == 0, "%s: range %d at %zu",
                     what, i, off[i]);
        const int64_t d = tu_diff_at(back + off[i], src[i].p, src[i].n);
        HM_CHECK_MSG(d < 0, "%s: range %d (%zu bytes) differs at byte %lld", what, i, src[i].n,
                     (long long)d);
        o += (src[i].n + CUDA_COPY_LANE_ALIGN - 1) / CUDA_COPY_LANE_ALIGN * CUDA_COPY_LANE_ALIGN;
    }
    free(back);
}

static void test_register_and_copy(void) {
    if (!tu_have_gpu()) return;
    mapped_file f;
    HM_REQUIRE(map_file(&f));
    hm_error err;
    cuda_host_reg *reg = NULL;
    const size_t lo = 100, n = FILE_BYTES - 300;
    const hm_status st = cuda_host_register(f.map + lo, n, &reg, &err);
    HM_CHECK_MSG(st == HM_OK, "registration of the read-only mapping failed: %s", err.msg);
    if (st == HM_OK) {
        const void *base;
        size_t len;
        double secs;
        cuda_host_reg_range(reg, &base, &len, &secs);
        printf("registered %.1f MiB in %.4f s (%.3f s/GiB)\n", len / 1048576.0, secs,
               secs * 1073741824.0 / (double)len);
        HM_CHECK((uintptr_t)base % 4096 == 0 && (const uint8_t *)base <= f.map + lo);
        HM_CHECK((const uint8_t *)base + len >= f.map + lo + n);
        HM_CHECK(cuda_host_reg_covers(reg, f.map + lo, n));
        HM_CHECK(cuda_host_reg_covers(reg, f.map + 4096, 1));
        HM_CHECK(!cuda_host_reg_covers(reg, (const uint8_t *)base + len, 1));
        HM_CHECK(!cuda_host_reg_covers(reg, (const uint8_t *)base - 1, 2));
        HM_CHECK(cuda_host_reg_device_ptr(reg, f.map + lo) != NULL);
    }
    cuda_copy_lane *l = NULL;
    HM_REQUIRE(cuda_copy_lane_init(0, 32 << 20, reg, &l, &err) == HM_OK);
    HM_CHECK(cuda_copy_lane_cap(l) == (32u << 20) && cuda_copy_lane_layer(l, 1) == -1);
    cudaStream_t s;
    HM_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);

    /* "experts" at odd offsets and sizes, one empty, one not registered (9 MiB: two chunks) */
    uint8_t *heap = malloc(9 << 20);
    HM_REQUIRE(heap);
    for (size_t i = 0; i < (9u << 20); i++) heap[i] = (uint8_t)(pattern(i) ^ 0x5a);
    const cuda_host_range src[6] = {
        {f.map + 1000, 3 << 20}, {f.map + 12345, 1}, {f.map + 20000, 0},
        {f.map + (40 << 20) + 7, 777777}, {heap, 9 << 20}, {f.map + lo, 5000}};
    copy_and_check(l, 0, src, 6, s, "mixed");
    cuda_copy_lane_stats stt;
    cuda_copy_lane_get_stats(l, &stt);
    const uint64_t direct = (3u << 20) + 1 + 777777 + 5000;
    if (reg) {
        HM_CHECK_MSG(stt.bytes_direct == direct, "direct %llu", (unsigned long long)stt.bytes_direct);
        HM_CHECK(stt.bytes_staged == (9u << 20));
        HM_CHECK(cuda_copy_lane_direct(l, f.map + lo, 10) && !cuda_copy_lane_direct(l, heap, 10));
    } else {
        HM_CHECK(stt.bytes_staged == direct + (9u << 20));
    }
    HM_CHECK(stt.copies == 1 && stt.ranges == 5);

    /* strided runs into buffer 1: back to back and spaced rows of the mapping (their ten rows
     * one cudaMemcpyBatchAsync), and spaced rows of the heap (staged row by row), interleaved
     * in the buffer */
    const cuda_host_rows rows[3] = {
        {.p = f.map + 3000, .n = 1000, .rows = 5, .spitch = 1000, .dpitch = 4096, .off = 0},
        {.p = f.map + 70001, .n = 700, .rows = 5, .spitch = 1500, .dpitch = 4096, .off = 1024},
        {.p = heap, .n = (2 << 20) + 5, .rows = 3, .spitch = 3 << 20, .dpitch = (2 << 20) + 256,
         .off = 8 << 20}};
    HM_REQUIRE(cuda_copy_lane_copy_rows(l, 1, 77, rows, 3, &err) == HM_OK);
    HM_CHECK(cuda_copy_lane_layer(l, 1) == 77);
    HM_REQUIRE(cuda_copy_lane_wait(l, 1, s, &err) == HM_OK);
    const size_t span = (8u << 20) + 3 * ((2u << 20) + 256);
    uint8_t *back = malloc(span);
    HM_REQUIRE(back);
    HM_REQUIRE(cudaMemcpyAsync(back, cuda_copy_lane_buf(l, 1), span, cudaMemcpyDeviceToHost, s) ==
               cudaSuccess);
    HM_REQUIRE(cuda_copy_lane_release(l, 1, s, &err) == HM_OK);
    HM_REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    for (int i = 0; i < 3; i++)
        for (size_t k = 0; k < rows[i].rows; k++) {
            const int64_t d = tu_diff_at(back + rows[i].off + k * rows[i].dpitch,
                                         (const uint8_t *)rows[i].p + k * rows[i].spitch,
                                         rows[i].n);
            HM_CHECK_MSG(d < 0, "rows: run %d row %zu differs at byte %lld", i, k, (long long)d);
        }
    free(back);
    cuda_copy_lane_stats st2;
    cuda_copy_lane_get_stats(l, &st2);
    HM_CHECK(st2.copies == 2 && st2.ranges == 5 + 13);
    if (reg) HM_CHECK(st2.bytes_direct == direct + 5000 + 3500);
    const bool batch = reg && CUDART_VERSION >= 12080; /* cudaMemcpyBatchAsync: CUDA 12.8 */
    HM_CHECK_MSG(st2.batches == (batch ? 1u : 0u), "batches %llu", (unsigned long long)st2.batches);
    const cuda_host_rows past = {.p = f.map, .n = 1 << 20, .rows = 33, .spitch = 1 << 20,
                                 .dpitch = 1 << 20, .off = 0};
    HM_CHECK(cuda_copy_lane_copy_rows(l, 1, 0, &past, 1, &err) == HM_ERR_RANGE);
    const cuda_host_rows narrow = {.p = f.map, .n = 100, .rows = 2, .spitch = 100, .dpitch = 50,
                                   .off = 0};
    HM_CHECK(cuda_copy_lane_copy_rows(l, 1, 0, &narrow, 1, &err) == HM_ERR_RANGE);
    HM_CHECK(cuda_copy_lane_copy_rows(l, 2, 0, rows, 1, &err) == HM_ERR_ARG);

    /* errors: too many bytes, bad buffer, NULL range */
    const cuda_host_range big = {f.map, (32u << 20) + 1};
    HM_CHECK(cuda_copy_lane_copy(l, 1, 0, &big, 1, NULL, &err) == HM_ERR_RANGE);
    HM_CHECK(cuda_copy_lane_copy(l, 2, 0, src, 1, NULL, &err) == HM_ERR_ARG);
    const cuda_host_range nul = {NULL, 5};
    HM_CHECK(cuda_copy_lane_copy(l, 0, 0, &nul, 1, NULL, &err) == HM_ERR_ARG);
    HM_CHECK(cuda_copy_lane_wait(l, -1, s, &err) == HM_ERR_ARG);

    cudaStreamDestroy(s);
    cuda_copy_lane_free(l);
    free(heap);
    cuda_host_unregister(reg);
    unmap_file(&f);
}

static void CUDART_CB slow_host(void *arg) {
    (void)arg;
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* Layers 0..11 through the two buffers: the consumer (its stream held 5 ms by a host function
 * before it reads each buffer) copies buffer b to out[layer] and releases b; the lane copies
 * layer L + 2 into the same buffer right after enqueuing layer L + 1, so only the release keeps
 * it from overwriting what the consumer has not read yet. Every out[layer] must be its layer's
 * bytes. */
static void test_double_buffer(void) {
    if (!tu_have_gpu()) return;
    mapped_file f;
    HM_REQUIRE(map_file(&f));
    hm_error err;
    cuda_host_reg *reg = NULL;
    if (cuda_host_register(f.map, FILE_BYTES, &reg, &err) != HM_OK)
        printf("registration failed (%s): staged copies\n", err.msg);
    enum { NL = 12, PER = 3 << 20 };
    cuda_copy_lane *l = NULL;
    HM_REQUIRE(cuda_copy_lane_init(0, PER, reg, &l, &err) == HM_OK);
    cudaStream_t s;
    HM_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    void *out = tu_dev(NULL, (size_t)NL * PER);
    HM_REQUIRE(out);
    for (int L = 0; L < NL; L++) {
        const int b = L & 1;
        const cuda_host_range r = {f.map + (size_t)L * (5 << 20) + 3 * L, PER};
        HM_REQUIRE(cuda_copy_lane_copy(l, b, L, &r, 1, NULL, &err) == HM_OK);
        HM_REQUIRE(cuda_copy_lane_wait(l, b, s, &err) == HM_OK);
        HM_REQUIRE(cudaLaunchHostFunc(s, slow_host, NULL) == cudaSuccess);
        HM_REQUIRE(cudaMemcpyAsync((char *)out + (size_t)L * PER, cuda_copy_lane_buf(l, b), PER,
                                   cudaMemcpyDeviceToDevice, s) == cudaSuccess);
        HM_REQUIRE(cuda_copy_lane_release(l, b, s, &err) == HM_OK);
    }
    HM_REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    uint8_t *back = malloc((size_t)NL * PER);
    HM_REQUIRE(back && tu_get(back, out, (size_t)NL * PER));
    for (int L = 0; L < NL; L++) {
        const int64_t d = tu_diff_at(back + (size_t)L * PER, f.map + (size_t)L * (5 << 20) + 3 * L, PER);
        HM_CHECK_MSG(d < 0, "layer %d differs at byte %lld", L, (long long)d);
    }
    free(back);
    cudaFree(out);
    cudaStreamDestroy(s);
    cuda_copy_lane_free(l);
    cuda_host_unregister(reg);
    unmap_file(&f);
}

/* Bandwidth from the registered mapping and through staging (printed; the registered path is
 * expected near the link's speed, ~55 GB/s on the H100/H200 machines' PCIe Gen5). */
static void test_measure(void) {
    if (!tu_have_gpu()) return;
    mapped_file f;
    HM_REQUIRE(map_file(&f));
    hm_error err;
    cuda_host_reg *reg = NULL;
    const hm_status st = cuda_host_register(f.map, FILE_BYTES, &reg, &err);
    HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
    cuda_copy_lane *direct = NULL, *staged = NULL;
    HM_REQUIRE(cuda_copy_lane_init(0, FILE_BYTES, reg, &direct, &err) == HM_OK);
    HM_REQUIRE(cuda_copy_lane_init(0, FILE_BYTES, NULL, &staged, &err) == HM_OK);
    double bd = 0, bs = 0;
    HM_REQUIRE(cuda_copy_lane_measure(direct, f.map, FILE_BYTES, 5, &bd, &err) == HM_OK);
    HM_REQUIRE(cuda_copy_lane_measure(staged, f.map, FILE_BYTES, 3, &bs, &err) == HM_OK);
    printf("host->device, 64 MiB: registered mapping %.1f GB/s, pinned staging %.1f GB/s\n",
           bd / 1e9, bs / 1e9);
    HM_CHECK(bd > 1e9 && bs > 1e8);
    HM_CHECK(cuda_copy_lane_measure(direct, f.map, FILE_BYTES + 1, 1, &bd, &err) == HM_ERR_ARG);
    cuda_copy_lane_free(direct);
    cuda_copy_lane_free(staged);
    cuda_host_unregister(reg);
    unmap_file(&f);
}

/* calib_run with a lane over a forged model's registered expert span: host->device measured
 * from the registration, the cache keeps it, and a staged lane is another source (measured). */
static void test_calibrate_lane(void) {
    if (!tu_have_gpu()) return;
    char path[512], dir[512];
    HM_REQUIRE(ft_forged("cuda-host", "tiny-qwen3moe", FORGE_MIX_Q4_K_M, path, sizeof(path)));
    ft_path(dir, sizeof(dir), "cuda-host-calib");
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const void *span;
    size_t n;
    HM_REQUIRE(offload_expert_span(m, &span, &n));
    cuda_host_reg *reg = NULL;
    HM_CHECK_MSG(cuda_host_register(span, n, &reg, &err) == HM_OK, "%s", err.msg);
    cuda_copy_lane *l = NULL;
    HM_REQUIRE(cuda_copy_lane_init(0, 8 << 20, reg, &l, &err) == HM_OK);
    calib_params p = {.model = m, .lane = l, .device = 0, .cache_dir = dir, .mode = "force"};
    calib_result c;
    HM_REQUIRE(calib_run(&p, &c, &err) == HM_OK);
    char buf[4096];
    calib_format(&c, buf, sizeof(buf));
    printf("%s", buf);
    HM_CHECK(c.source == CALIB_MEASURED && c.h2d_bps > 1e8);
    HM_CHECK(!strcmp(c.h2d_source, reg ? "registered" : "staged"));
    HM_CHECK(strstr(c.machine_key, "gpu=none") == NULL);
    p.mode = "1";
    HM_REQUIRE(calib_run(&p, &c, &err) == HM_OK);
    HM_CHECK(c.source == CALIB_CACHED && c.h2d_bps > 1e8);
    cuda_copy_lane *l2 = NULL;
    HM_REQUIRE(cuda_copy_lane_init(0, 8 << 20, NULL, &l2, &err) == HM_OK);
    p.lane = l2;
    HM_REQUIRE(calib_run(&p, &c, &err) == HM_OK);
    HM_CHECK(!strcmp(c.h2d_source, "staged"));
    HM_CHECK(c.source == (reg ? CALIB_MEASURED : CALIB_CACHED));
    offload_rates r;
    calib_layer_rates(&c, m, 0, &r);
    HM_CHECK(r.h2d_bytes_per_s == c.h2d_bps);
    cuda_copy_lane_free(l2);
    cuda_copy_lane_free(l);
    cuda_host_unregister(reg);
    hm_model_free(m);
}
#else
static void test_register_and_copy(void) { tu_have_gpu(); }
static void test_double_buffer(void) {}
static void test_measure(void) {}
static void test_calibrate_lane(void) {}
#endif

TU_TEST_MAIN(test_bytes, test_refusals, test_register_and_copy, test_double_buffer, test_measure,
             test_calibrate_lane)
