/* bench_topo.c - what the host's vCPUs share: memory speed per vCPU, and which pairs share a core.
 *
 *   bench_topo [--ms N] [--mib N] [--pairs 0|1]
 *
 * A VM's 16 vCPUs may be 16 cores, or 8 cores with two hardware threads each, or sit on two dies
 * with the memory nearer to one; lscpu inside the VM says none of it. The decode traces show some
 * threads streaming ~30% slower than others, steadily. This measures, with every thread pinned:
 *   1. each vCPU alone: read GB/s of a private buffer (--mib, prefetched 2 KiB into L1 and 12 KiB
 *      into L2 as the x8 kernels do) and load-to-load latency (a random pointer chase over the
 *      same buffer);
 *   2. every vCPU at once: each one's read GB/s over --ms of streaming its own buffer;
 *   3. (--pairs 1) a compute loop in L1 (int8 dot products, no memory traffic) on vCPU i alone and
 *      with vCPU j running the same loop: i's speed with j over alone. Two hardware threads of one
 *      core share its ports: ~0.5-0.6; separate cores: ~1.0 (less the all-core clock drop).
 * Buffers are touched first by their own pinned thread.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { MAX_CPU = 256 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static uint64_t read_range(const uint8_t *p, size_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        _mm_prefetch((const char *)(p + i + 2048), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + 2048 + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + 12288), _MM_HINT_T1);
        _mm_prefetch((const char *)(p + i + 12288 + 64), _MM_HINT_T1);
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 64)));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(a0, a1));
}

/* ~n * 64 int8 multiply-adds in four dependent chains over 2 KiB (in L1) */
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static int32_t compute_loop(const uint8_t *p, long n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    const __m512i w = _mm512_set1_epi8(3);
    for (long i = 0; i < n; i += 4) {
        const uint8_t *q = p + (size_t)(i & 31) * 64;
        a0 = _mm512_dpbusd_epi32(a0, _mm512_load_si512((const void *)q), w);
        a1 = _mm512_dpbusd_epi32(a1, _mm512_load_si512((const void *)(q + 64)), w);
        a2 = _mm512_dpbusd_epi32(a2, _mm512_load_si512((const void *)(q + 128)), w);
        a3 = _mm512_dpbusd_epi32(a3, _mm512_load_si512((const void *)(q + 192)), w);
    }
    return _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
}
#else
static uint64_t read_range(const uint8_t *p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i += 64) s += p[i];
    return s;
}
static int32_t compute_loop(const uint8_t *p, long n) {
    int32_t s = 0;
    for (long i = 0; i < n; i++) s += p[i & 2047] * 3;
    return s;
}
#endif

typedef struct {
    int cpu;
    size_t size;
    uint8_t *buf;
    int what; /* 0 touch, 1 stream for ms, 2 chase, 3 compute for ms */
    double ms, rate;
    atomic_int *go;
    volatile uint64_t sink;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    if (pin(w->cpu) != 0) {
        w->rate = -1.0;
        return NULL;
    }
    if (w->what == 0) {
        if (!w->buf) w->buf = aligned_alloc(4096, w->size);
        if (w->buf) memset(w->buf, 1, w->size);
        return NULL;
    }
    while (atomic_load(w->go) == 0) {
    }
    const double t0 = now_s();
    double t = t0;
    uint64_t bytes = 0, s = 0;
    if (w->what == 1) {
        while ((t = now_s()) - t0 < w->ms * 1e-3) {
            s += read_range(w->buf, w->size);
            bytes += w->size;
        }
        w->rate = (double)bytes / (t - t0) * 1e-9;
    } else if (w->what == 2) { /* the buffer holds a random cycle of 64-byte-spaced offsets */
        size_t i = 0;
        const long steps = 2000000;
        for (long k = 0; k < steps; k++) i = *(const size_t *)(const void *)(w->buf + i);
        s = i;
        w->rate = (now_s() - t0) * 1e9 / (double)steps; /* ns per load */
    } else {
        long n = 0;
        while ((t = now_s()) - t0 < w->ms * 1e-3) {
            s += (uint64_t)compute_loop(w->buf, 1 << 16);
            n += 1 << 16;
        }
        w->rate = (double)n * 64.0 / (t - t0) * 1e-9; /* G multiply-adds/s */
    }
    w->sink = s;
    return NULL;
}

/* Runs ws[0..n) at once (each on its cpu) and waits for them. */
static void run_all(worker *ws, int n) {
    atomic_int go = 0;
    pthread_t th[MAX_CPU];
    for (int i = 0; i < n; i++) {
        ws[i].go = &go;
        pthread_create(&th[i], NULL, worker_main, &ws[i]);
    }
    atomic_store(&go, 1);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void make_chase(uint8_t *buf, size_t size) {
    const size_t n = size / 64;
    size_t *perm = malloc(n * sizeof(size_t));
    if (!perm) return;
    for (size_t i = 0; i < n; i++) perm[i] = i;
    uint64_t r = 88172645463325252ull;
    for (size_t i = n - 1; i > 0; i--) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const size_t j = r % (i + 1), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (size_t i = 0; i < n; i++) *(size_t *)(void *)(buf + perm[i] * 64) = perm[(i + 1) % n] * 64;
    free(perm);
}

int main(int argc, char **argv) {
    double ms = 300.0;
    size_t mib = 256;
    int pairs = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ms") && i + 1 < argc) ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) pairs = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_topo [--ms N] [--mib N] [--pairs 0|1]\n");
            return 2;
        }
    }
    cpu_set_t all;
    if (sched_getaffinity(0, sizeof(all), &all) != 0) return 1;
    int cpus[MAX_CPU], n = 0;
    for (int c = 0; c < MAX_CPU && n < MAX_CPU; c++)
        if (CPU_ISSET(c, &all)) cpus[n++] = c;
    static worker ws[MAX_CPU];
    for (int i = 0; i < n; i++) { /* each buffer touched by its own pinned thread */
        ws[i] = (worker){.cpu = cpus[i], .size = mib << 20, .what = 0};
        run_all(&ws[i], 1);
        if (!ws[i].buf) {
            fprintf(stderr, "bench_topo: out of memory (%zu MiB per vCPU)\n", mib);
            return 1;
        }
    }
    printf("vCPUs %d, %zu MiB each, %.0f ms per measurement\n\n", n, mib, ms);
    printf("| vCPU | read alone GB/s | latency alone ns | read, all at once GB/s |\n");
    printf("| ---: | ---: | ---: | ---: |\n");
    double alone[MAX_CPU], lat[MAX_CPU];
    for (int i = 0; i < n; i++) {
        ws[i].what = 1;
        ws[i].ms = ms;
        run_all(&ws[i], 1);
        alone[i] = ws[i].rate;
    }
    for (int i = 0; i < n; i++) ws[i].what = 1;
    run_all(ws, n);
    double sum = 0.0;
    double together[MAX_CPU];
    for (int i = 0; i < n; i++) sum += together[i] = ws[i].rate;
    for (int i = 0; i < n; i++) { /* chase last: it overwrites the buffers */
        make_chase(ws[i].buf, ws[i].size);
        ws[i].what = 2;
        run_all(&ws[i], 1);
        lat[i] = ws[i].rate;
    }
    for (int i = 0; i < n; i++)
        printf("| %d | %.2f | %.1f | %.2f |\n", cpus[i], alone[i], lat[i], together[i]);
    printf("all at once: %.2f GB/s\n", sum);
    if (!pairs) return 0;
    printf("\ncompute in L1: vCPU i's speed with vCPU j busy too, over i alone (row i, column j)\n");
    double solo[MAX_CPU];
    for (int i = 0; i < n; i++) {
        ws[i].what = 3;
        ws[i].ms = ms / 4;
        run_all(&ws[i], 1);
        solo[i] = ws[i].rate;
    }
    printf("alone (G multiply-adds/s):");
    for (int i = 0; i < n; i++) printf(" %.1f", solo[i]);
    printf("\n|  |");
    for (int j = 0; j < n; j++) printf(" %d |", cpus[j]);
    printf("\n| --- |");
    for (int j = 0; j < n; j++) printf(" ---: |");
    printf("\n");
    for (int i = 0; i < n; i++) {
        printf("| %d |", cpus[i]);
        for (int j = 0; j < n; j++) {
            if (j == i) {
                printf(" - |");
                continue;
            }
            worker two[2] = {ws[i], ws[j]};
            run_all(two, 2);
            printf(" %.2f |", two[0].rate / solo[i]);
        }
        printf("\n");
    }
    return 0;
}
