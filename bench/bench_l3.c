/* bench_l3.c - can part of a decode token's weights stay in the host's last-level cache?
 *
 *   bench_l3 [-t N] [--total MiB] [--hot MiB,MiB,...] [--tokens T]
 *
 * A decode token streams every weight it uses once (about 1.9 GB for qwen3-30b-a3b q4_k_m), far
 * more than any cache, so with plain loads nothing survives from one token to the next. If the
 * bulk is streamed so that it does not displace cached lines (prefetchnta, or clflushopt once a
 * line is used), a "hot" part read with plain loads might stay in the last-level cache. This
 * emulates tokens: each reads the hot part (the first H MiB of the buffer) and then the cold rest
 * with all threads, T times; it prints the mean of tokens 2..T as GB/s of the whole buffer, and
 * the hot part's own GB/s, for three ways of streaming the cold part:
 *   plain - prefetch 4 KiB ahead with hint T0, as the kernels do;
 *   nta   - prefetchnta 4 KiB ahead;
 *   flush - as plain, then clflushopt of each line once summed.
 * First it prints the read speed of buffers of H MiB read again and again (the cache's size and
 * speed as the threads see them).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/threadpool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { MODE_PLAIN, MODE_NTA, MODE_FLUSH, MODE_COUNT };
static const char *const mode_name[MODE_COUNT] = {"plain", "nta", "flush"};

typedef struct {
    const uint8_t *buf;
    size_t size;
    int mode;
    uint64_t sums[256];
} range_job;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__x86_64__)
__attribute__((target("clflushopt")))
static uint64_t sum_range(const uint8_t *p, size_t n, int mode) {
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 64 <= n; i += 64) {
        if (mode == MODE_NTA) _mm_prefetch((const char *)(p + i + 4096), _MM_HINT_NTA);
        else _mm_prefetch((const char *)(p + i + 4096), _MM_HINT_T0);
        a0 = _mm_add_epi64(a0, _mm_load_si128((const __m128i *)(const void *)(p + i)));
        a1 = _mm_add_epi64(a1, _mm_load_si128((const __m128i *)(const void *)(p + i + 16)));
        a2 = _mm_add_epi64(a2, _mm_load_si128((const __m128i *)(const void *)(p + i + 32)));
        a3 = _mm_add_epi64(a3, _mm_load_si128((const __m128i *)(const void *)(p + i + 48)));
        if (mode == MODE_FLUSH) _mm_clflushopt((void *)(uintptr_t)(p + i));
    }
    __m128i a = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
    uint64_t t[2];
    _mm_storeu_si128((__m128i *)(void *)t, a);
    return t[0] + t[1];
}
#else
static uint64_t sum_range(const uint8_t *p, size_t n, int mode) {
    (void)mode;
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += p[i];
    return s;
}
#endif

static void range_fn(void *ctx, int ith, int nth) {
    range_job *j = ctx;
    size_t per = j->size / (size_t)nth / 64 * 64;
    size_t n = ith == nth - 1 ? j->size - per * (size_t)ith : per;
    j->sums[ith & 255] = sum_range(j->buf + per * (size_t)ith, n, j->mode);
}

static double run_range(tp_pool *pool, const uint8_t *buf, size_t size, int mode) {
    range_job j = {.buf = buf, .size = size, .mode = mode};
    double t0 = now_s();
    if (size) tp_run(pool, range_fn, &j);
    return now_s() - t0;
}

int main(int argc, char **argv) {
    int threads = 1, tokens = 8;
    size_t total_mib = 1830;
    const char *hot_list = "0,64,128,192,256";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--total") && v) total_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(a, "--hot") && v) hot_list = argv[++i];
        else if (!strcmp(a, "--tokens") && v) tokens = atoi(argv[++i]);
        else {
            fprintf(stderr, "bench_l3: unknown argument '%s'\n", a);
            return 2;
        }
    }
    if (threads < 1 || tokens < 2 || total_mib < 64) {
        fprintf(stderr, "bench_l3: bad argument (threads >= 1, tokens >= 2, total >= 64 MiB)\n");
        return 2;
    }
    tp_pool *pool = NULL;
    hm_error err = {0};
    if (tp_init(threads, &pool, &err) != HM_OK) {
        fprintf(stderr, "bench_l3: %s\n", err.msg);
        return 1;
    }
    const size_t total = total_mib << 20;
    uint8_t *buf = aligned_alloc(1 << 21, total);
    if (!buf) {
        fprintf(stderr, "bench_l3: cannot allocate %zu MiB\n", total_mib);
        return 1;
    }
    for (size_t i = 0; i < total; i += 4096) memset(buf + i, (int)(i >> 12), 4096);

    printf("threads %d, buffer %zu MiB, %d tokens (mean of 2..%d)\n\n", threads, total_mib, tokens, tokens);
    printf("| buffer MiB read again and again | GB/s |\n| ---: | ---: |\n");
    static const size_t sizes[] = {16, 32, 64, 128, 192, 256, 384, 512};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0] && sizes[s] <= total_mib; s++) {
        double best = 1e30;
        for (int r = 0; r < 10; r++) {
            double dt = run_range(pool, buf, sizes[s] << 20, MODE_PLAIN);
            if (r > 0 && dt < best) best = dt;
        }
        printf("| %zu | %.2f |\n", sizes[s], (double)(sizes[s] << 20) / best / 1e9);
    }

    printf("\n| hot MiB | cold stream | GB/s of the whole token | hot part GB/s |\n| ---: | --- | ---: | ---: |\n");
    for (const char *h = hot_list; *h;) {
        size_t hot = (size_t)strtoul(h, NULL, 10) << 20;
        while (*h && *h != ',') h++;
        if (*h == ',') h++;
        if (hot >= total) continue;
        for (int mode = 0; mode < MODE_COUNT; mode++) {
            double t_all = 0, t_hot = 0;
            for (int t = 0; t < tokens; t++) {
                double th = run_range(pool, buf, hot, MODE_PLAIN);
                double tc = run_range(pool, buf + hot, total - hot, mode);
                if (t > 0) t_all += th + tc, t_hot += th;
            }
            const double n = tokens - 1;
            printf("| %zu | %s | %.2f | %.2f |\n", hot >> 20, mode_name[mode], (double)total / (t_all / n) / 1e9,
                   hot ? (double)hot / (t_hot / n) / 1e9 : 0.0);
        }
    }
    free(buf);
    tp_free(pool);
    return 0;
}
