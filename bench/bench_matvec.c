/* bench_matvec.c - how close the CPU matvec comes to the host's memory read bandwidth.
 *
 *   bench_matvec [-t|--threads N] [--mib M] [--reps R] [--batch B] [--types q4_K,q8_0,...] [--json]
 *                [--split S]  (the matrix as S consecutive products: per-job overhead)
 *                [--k K]  (row length, a multiple of the type's block: short expert rows)
 *                [--file PATH] [--huge]
 *
 * 1. Read bandwidth: all N threads sum an M MiB buffer (16-byte loads, four independent
 *    accumulators, software prefetch 4 KiB ahead into L1, or 8 KiB ahead into L2 only, or both
 *    2 KiB ahead into L1 and 12 KiB into L2 like the x8 kernels: without prefetch a core cannot
 *    keep enough misses in flight and the "ceiling" is below what the matvec reaches), as
 *    contiguous per-thread slices and as dynamically taken 256 KiB chunks (cpu_matmul's
 *    pattern); the best of the six and of R runs: the STREAM-like ceiling a matvec can reach.
 *    Measured again at the end (a shared host's bandwidth drifts; compare the two).
 * 2. For each weight type: a weight matrix of about M MiB (rows of k = 2880, or 2048 for the
 *    256-element types; far larger than the caches) multiplied by one token with cpu_matmul on the
 *    same pool, best of R: GB/s of weights streamed and the ratio to the read bandwidth measured
 *    alternately with it (read, matvec, read, matvec, ...: a shared host's bandwidth drifts). With --batch B, also
 *    batches 2..B (GB/s of weights, i.e. each weight byte counted once per call).
 * Prints a markdown table (or JSON with --json) and the kernel table used (HOTMOE_ISA caps it).
 * Weights are valid blocks (quantised random rows, repeated): values do not change the speed.
 * With --file PATH the weights are written to PATH and the matvec reads them through a read-only
 * shared mmap of it (page cache, as a model's weights are read), while the read ceiling stays on
 * anonymous memory: the difference shows what the mapping costs. With --x8 a matrix of a type
 * quant_x8 supports (q4_K, q6_K, q8_0, mxfp4) is also repacked by eights (quant_x8.h) and
 * multiplied that way, as the engine's decode does with --repack (one more table row, its own
 * alternated read figure). With --huge the buffer (read test and weights) is 2 MiB-aligned and
 * madvise(MADV_HUGEPAGE)d: what 4 KiB pages cost.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/threadpool.h"
#include "cpu/matmul.h"
#include "quant/quant.h"
#include "quant/quant_x8.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#include <immintrin.h>
#include <xmmintrin.h>
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { READ_CHUNK = 256 << 10, READ_MODES = 6 };

typedef struct {
    const uint8_t *buf;
    size_t size;
    int chunked; /* 0: thread i reads slice i; 1: 256 KiB chunks from an atomic counter */
    int pf;      /* prefetch kind: 0 L1 (read_range_t0), 1 L2 only (t2), 2 both (2l), 3 none
                    (read_range_plain: recorded, not part of the best) */
    atomic_size_t next;
    uint64_t sums[256];
} read_job;

/* Sums n bytes at p in 16-byte loads, prefetching 4 KiB ahead into L1 (hint T0, as the kernels
 * do) or 8 KiB ahead into L2 only (T2): the read test takes the faster, so that no way of
 * streaming the kernels could use beats the ceiling they are judged against. */
#if defined(__x86_64__)
#define READ_RANGE(NAME, HINT, DIST, DIST2)                                                       \
    static uint64_t NAME(const uint8_t *p, size_t n) {                                             \
        __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;                               \
        size_t i = 0;                                                                              \
        for (; i + 64 <= n; i += 64) {                                                             \
            _mm_prefetch((const char *)(p + i + (DIST)), HINT);                                    \
            if (DIST2) _mm_prefetch((const char *)(p + i + (DIST2)), _MM_HINT_T2);                 \
            a0 = _mm_add_epi64(a0, _mm_load_si128((const __m128i *)(const void *)(p + i)));        \
            a1 = _mm_add_epi64(a1, _mm_load_si128((const __m128i *)(const void *)(p + i + 16)));   \
            a2 = _mm_add_epi64(a2, _mm_load_si128((const __m128i *)(const void *)(p + i + 32)));   \
            a3 = _mm_add_epi64(a3, _mm_load_si128((const __m128i *)(const void *)(p + i + 48)));   \
        }                                                                                          \
        __m128i a = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));                   \
        uint64_t t[2];                                                                             \
        _mm_storeu_si128((__m128i *)(void *)t, a);                                                 \
        uint64_t s = t[0] + t[1];                                                                  \
        for (; i < n; i++) s += p[i];                                                              \
        return s;                                                                                  \
    }
READ_RANGE(read_range_t0, _MM_HINT_T0, 4096, 0)
READ_RANGE(read_range_t2, _MM_HINT_T2, 8192, 0)
READ_RANGE(read_range_2l, _MM_HINT_T0, 2048, 12288)

/* Sums n bytes at p in 32-byte loads without software prefetch: ../shared/BENCHMARKS.md's "plain
 * AVX2 read loop" (recorded beside the ceiling, not part of it). */
__attribute__((target("avx2"))) static uint64_t read_range_plain(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
    }
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)(void *)t, _mm256_add_epi64(a0, a1));
    uint64_t s = t[0] + t[1] + t[2] + t[3];
    for (; i < n; i++) s += p[i];
    return s;
}
#else
static uint64_t read_range_t0(const uint8_t *p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += p[i];
    return s;
}
#define read_range_t2 read_range_t0
#define read_range_2l read_range_t0
#define read_range_plain read_range_t0
#endif

static void read_fn(void *ctx, int ith, int nth) {
    read_job *j = ctx;
    uint64_t (*read_range)(const uint8_t *, size_t) =
        j->pf == 3 ? read_range_plain : j->pf == 2 ? read_range_2l
        : j->pf == 1 ? read_range_t2 : read_range_t0;
    uint64_t s = 0;
    if (j->chunked) {
        for (;;) {
            size_t o = atomic_fetch_add(&j->next, (size_t)READ_CHUNK);
            if (o >= j->size) break;
            s += read_range(j->buf + o, j->size - o < READ_CHUNK ? j->size - o : READ_CHUNK);
        }
    } else {
        size_t per = j->size / (size_t)nth / 64 * 64;
        size_t n = ith == nth - 1 ? j->size - per * (size_t)ith : per;
        s = read_range(j->buf + per * (size_t)ith, n);
    }
    j->sums[ith & 255] = s;
}

typedef struct {
    uint8_t *buf;
    size_t size;
    const uint8_t *pattern;
    size_t pattern_size;
} fill_job;

/* first touch by the threads that will read it (NUMA placement), then a repeated pattern */
static void fill_fn(void *ctx, int ith, int nth) {
    fill_job *j = ctx;
    size_t per = j->size / (size_t)nth / 4096 * 4096;
    size_t b = per * (size_t)ith, e = ith == nth - 1 ? j->size : b + per;
    for (size_t o = b; o < e;) {
        size_t ofs = o % j->pattern_size, n = j->pattern_size - ofs;
        if (n > e - o) n = e - o;
        memcpy(j->buf + o, j->pattern + ofs, n);
        o += n;
    }
}

/* best-of-reps seconds of one all-thread read of the buffer, each rep trying both schedules
 * (contiguous slices per thread, and dynamic 256 KiB chunks like cpu_matmul's row chunks) and
 * both prefetch kinds */
static double read_best(tp_pool *pool, read_job *rj, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        for (int mode = 0; mode < READ_MODES; mode++) {
            rj->chunked = mode & 1;
            rj->pf = mode >> 1;
            atomic_store(&rj->next, 0);
            double t0 = now_s();
            tp_run(pool, read_fn, rj);
            double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
    }
    return best;
}

/* Writes n bytes of src to path and maps the file read-only; NULL (with a message) on failure. */
static const uint8_t *map_copy(const char *path, const uint8_t *src, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(src, 1, n, fp) != n || fclose(fp) != 0) {
        fprintf(stderr, "bench_matvec: cannot write %s\n", path);
        return NULL;
    }
    int fd = open(path, O_RDONLY);
    void *m = fd < 0 ? MAP_FAILED : mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (m == MAP_FAILED) {
        fprintf(stderr, "bench_matvec: cannot map %s\n", path);
        return NULL;
    }
    return m;
}

/* --x8: the same matrix repacked by eights (quant_x8.h), multiplied by cpu_matmul_multi with
 * the copy (cpu_matmul_mat.x8): the engine's decode path */
static uint32_t g_rng = 12345;
static float rndf(void) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)(g_rng >> 8) / 8388608.0f - 1.0f;
}

int main(int argc, char **argv) {
    int threads = 1, reps = 5, max_batch = 1, json = 0;
    const char *file = NULL; /* weights through an mmap of this file instead of anonymous memory */
    int huge = 0;            /* --huge: anonymous memory on transparent huge pages */
    int x8 = 0;              /* --x8: also the repacked product (quant_x8.h) */
    size_t mib = 1024;
    long split = 1;
    long k_opt = 0; /* --k: row length instead of 2048 / 2880 */
    const char *types = "q4_K,q8_0,mxfp4,q6_K,q5_K,iq4_xs,q4_0,q4_1,q5_0,q5_1,iq4_nl,f16,bf16,f32";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--mib") && v) mib = (size_t)atol(argv[++i]);
        else if (!strcmp(a, "--split") && v) split = atol(argv[++i]);
        else if (!strcmp(a, "--k") && v) k_opt = atol(argv[++i]);
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && v) max_batch = atoi(argv[++i]);
        else if (!strcmp(a, "--types") && v) types = argv[++i];
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--file") && v) file = argv[++i];
        else if (!strcmp(a, "--huge")) huge = 1;
        else if (!strcmp(a, "--x8")) x8 = 1;
        else {
            fprintf(stderr, "usage: %s [-t N] [--mib M] [--reps R] [--batch B] [--types a,b] [--json] [--file PATH] [--huge] [--x8] [--split S] [--k K]\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1 || reps < 1 || mib < 16 || max_batch < 1 || max_batch > 64 || split < 1 ||
        split > 100000) {
        fprintf(stderr, "bench_matvec: bad argument (threads >= 1, reps >= 1, mib >= 16, 1 <= batch <= 64, 1 <= split <= 100000)\n");
        return 2;
    }
    tp_pool *pool = NULL;
    hm_error err;
    if (tp_init(threads, &pool, &err) != HM_OK) {
        fprintf(stderr, "bench_matvec: %s\n", err.msg);
        return 1;
    }
    const quant_kernels *kern = quant_kernels_best();
    size_t size = mib << 20;
    /* --huge: the buffer (read test and weights) on 2 MiB pages where the kernel allows */
    size = huge ? (size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1) : size;
    uint8_t *buf = aligned_alloc(huge ? 2u << 20 : 4096, size);
    if (buf && huge && madvise(buf, size, MADV_HUGEPAGE) != 0)
        fprintf(stderr, "bench_matvec: madvise(MADV_HUGEPAGE) refused: 4 KiB pages\n");
    if (!buf) {
        fprintf(stderr, "bench_matvec: cannot allocate %zu MiB\n", mib);
        return 1;
    }

    /* 1. read bandwidth */
    static const uint8_t zero_pattern[4096];
    fill_job fj = {buf, size, zero_pattern, sizeof(zero_pattern)};
    tp_run(pool, fill_fn, &fj);
    read_job rj = {.buf = buf, .size = size};
    atomic_init(&rj.next, 0);
    const double read_gbs = (double)size / read_best(pool, &rj, reps) / 1e9;

    if (json) printf("{\"isa\": \"%s\", \"threads\": %d, \"mib\": %zu, \"read_gbs\": %.2f, \"types\": [",
                     kern->name, threads, mib, read_gbs);
    else {
        printf("kernel table: %s, threads: %d, buffer: %zu MiB, best of %d\n", kern->name, threads, mib, reps);
        if (file) printf("weights: read-only mmap of %s\n", file);
        if (huge) {
            char line[256];
            FILE *sm = fopen("/proc/self/smaps_rollup", "r");
            while (sm && fgets(line, sizeof(line), sm))
                if (!strncmp(line, "AnonHugePages:", 14)) printf("buffer: huge pages asked for; %s", line);
            if (sm) fclose(sm);
        }
        printf("host read bandwidth at the start: %.2f GB/s (", read_gbs);
        static const char *const mname[READ_MODES] = {
            "L1 prefetch, slices", "L1 prefetch, chunks", "L2 prefetch, slices",
            "L2 prefetch, chunks", "L1+L2 prefetch, slices", "L1+L2 prefetch, chunks"};
        for (int mode = 0; mode < READ_MODES; mode++) { /* each way alone, for the record */
            rj.chunked = mode & 1;
            rj.pf = mode >> 1;
            double bt = 1e30;
            for (int r = 0; r < reps; r++) {
                atomic_store(&rj.next, 0);
                double t0 = now_s();
                tp_run(pool, read_fn, &rj);
                if (now_s() - t0 < bt) bt = now_s() - t0;
            }
            printf("%s%s %.2f", mode ? ", " : "", mname[mode], (double)size / bt / 1e9);
        }
        printf(")\n");
        rj.chunked = 0; /* BENCHMARKS.md's plain loop, for the record */
        rj.pf = 3;
        double bt = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = now_s();
            tp_run(pool, read_fn, &rj);
            if (now_s() - t0 < bt) bt = now_s() - t0;
        }
        printf("plain AVX2 read loop (no prefetch, slices; not part of the ceiling): %.2f GB/s\n",
               (double)size / bt / 1e9);
        printf("ratio = batch-1 matvec GB/s / read GB/s, each the best of %d runs taken alternately\n\n", reps);
        printf("| type | k | rows | GB/s (batch 1) | read GB/s | ratio |");
        for (int b = 2; b <= max_batch; b++) printf(" b=%d GB/s |", b);
        printf("\n| --- | --- | --- | --- | --- | --- |");
        for (int b = 2; b <= max_batch; b++) printf(" --- |");
        printf("\n");
    }

    char list[512];
    snprintf(list, sizeof(list), "%s", types);
    int first = 1;
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        int t = hm_type_from_name(name);
        if (t < 0 || quant_act_for((uint32_t)t) == QUANT_ACT_COUNT || !kern->dot[t]) {
            fprintf(stderr, "bench_matvec: skipping unsupported type '%s'\n", name);
            continue;
        }
        const int bs = hm_type_get((uint32_t)t)->block_size;
        const int64_t k = k_opt > 0 ? k_opt : bs == 256 ? 2048 : 2880;
        if (k % bs) {
            fprintf(stderr, "bench_matvec: --k %ld is not a multiple of %s's block (%d), skipped\n",
                    k_opt, name, bs);
            continue;
        }
        const size_t rs = hm_row_size((uint32_t)t, k);
        const int64_t rows = (int64_t)(size / rs);
        /* pattern: 64 quantised random rows */
        const int prow = 64;
        uint8_t *pat = malloc(rs * prow);
        float *f = malloc(sizeof(float) * (size_t)k * (size_t)max_batch);
        for (int r = 0; r < prow; r++) {
            for (int64_t i = 0; i < k; i++) f[i] = rndf();
            if (quant_quantize_row((uint32_t)t, f, pat + (size_t)r * rs, k) != HM_OK) memset(pat + (size_t)r * rs, 0, rs);
        }
        fill_job fw = {buf, (size_t)rows * rs, pat, rs * prow};
        tp_run(pool, fill_fn, &fw);
        const uint8_t *w = buf;
        if (file && !(w = map_copy(file, buf, (size_t)rows * rs))) return 1;
        for (int64_t i = 0; i < k * max_batch; i++) f[i] = rndf();
        float *y = malloc(sizeof(float) * (size_t)rows * (size_t)max_batch);
        size_t ss = cpu_matmul_scratch_size((uint32_t)t, k, max_batch);
        void *scratch = malloc(ss);
        double gbs[65], read_t = 1e30;
        for (int b = 1; b <= max_batch; b++) {
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                /* batch 1 alternates with the read test: both see the same host conditions */
                if (b == 1) {
                    double rt = read_best(pool, &rj, 1);
                    if (rt < read_t) read_t = rt;
                }
                double t0 = now_s();
                /* --split S: S consecutive products of rows/S rows (a decode step's many
                 * layer-sized matrices, each its own pool job) */
                const int64_t per = rows / split;
                for (int64_t sp = 0; sp < split; sp++) {
                    const int64_t r0 = sp * per, nr = sp == split - 1 ? rows - r0 : per;
                    if (cpu_matmul(pool, kern, (uint32_t)t, (const uint8_t *)w + (size_t)r0 * rs, nr, k,
                                   f, b, y, scratch, ss, &err) != HM_OK) {
                        fprintf(stderr, "bench_matvec: %s\n", err.msg);
                        return 1;
                    }
                }
                double dt = now_s() - t0;
                if (dt < best) best = dt;
            }
            gbs[b] = (double)rows * (double)rs / best / 1e9;
        }
        const double read_here = (double)size / read_t / 1e9;
        if (json) {
            printf("%s{\"type\": \"%s\", \"k\": %lld, \"rows\": %lld, \"gbs\": %.2f, \"read_gbs\": %.2f, \"ratio\": %.3f, \"batch_gbs\": [",
                   first ? "" : ", ", name, (long long)k, (long long)rows, gbs[1], read_here, gbs[1] / read_here);
            for (int b = 1; b <= max_batch; b++) printf("%s%.2f", b > 1 ? ", " : "", gbs[b]);
            printf("]}");
        } else {
            printf("| %s | %lld | %lld | %.2f | %.2f | %.2f |", hm_type_name((uint32_t)t), (long long)k,
                   (long long)rows, gbs[1], read_here, gbs[1] / read_here);
            for (int b = 2; b <= max_batch; b++) printf(" %.2f |", gbs[b]);
            printf("\n");
        }
        if (x8 && !json && quant_x8_supported((uint32_t)t) && max_batch == 1 && split == 1) {
            const int64_t groups = rows / 8;
            const size_t gs = quant_x8_group_size((uint32_t)t, k);
            uint8_t *packed = aligned_alloc(64, (gs * (size_t)groups + 63) / 64 * 64);
            const size_t ass = cpu_matmul_scratch_size((uint32_t)t, k, 1);
            void *act = malloc(ass);
            if (!packed || !act ||
                quant_x8_repack_rows((uint32_t)t, k, w, rs, 8 * groups, packed, pool, NULL) != HM_OK) {
                fprintf(stderr, "bench_matvec: out of memory for --x8\n");
                return 1;
            }
            const cpu_matmul_mat mm = {.wtype = (uint32_t)t, .w = w, .n_rows = 8 * groups, .y = y,
                                       .x8 = packed};
            double best = 1e30, rt_best = 1e30;
            for (int r = 0; r < reps; r++) {
                double rt = read_best(pool, &rj, 1);
                if (rt < rt_best) rt_best = rt;
                double t0 = now_s();
                cpu_matmul_multi(pool, kern, 1, &mm, k, f, 1, act, ass, NULL);
                double dt = now_s() - t0;
                if (dt < best) best = dt;
            }
            const double g8 = (double)groups * (double)gs / best / 1e9, rd = (double)size / rt_best / 1e9;
            printf("| %s x8%s | %lld | %lld | %.2f | %.2f | %.2f |\n", hm_type_name((uint32_t)t),
                   quant_x8_fast() ? "" : " (reference path)", (long long)k, (long long)(8 * groups),
                   g8, rd, g8 / rd);
            free(packed);
            free(act);
        }
        fflush(stdout);
        first = 0;
        if (w != buf) munmap((void *)w, (size_t)rows * rs);
        free(pat);
        free(f);
        free(y);
        free(scratch);
    }
    /* the read bandwidth again, after the types: a shared host's bandwidth drifts */
    const double read_after = (double)size / read_best(pool, &rj, reps) / 1e9;
    if (json) printf("], \"read_gbs_after\": %.2f}\n", read_after);
    else printf("\nhost read bandwidth at the end: %.2f GB/s\n", read_after);
    free(buf);
    tp_free(pool);
    return 0;
}
