/* bench_host_pcie.c - can host memory feed the CPU's reads and PCIe host->device copies at the
 * same time (their sum), or do they share one bandwidth?
 *
 *   bench_host_pcie [-t THREADS] [--read-mib M] [--copy-mib M] [--ms MS] [--reps R] [--json]
 *
 * DESIGN: two separate anonymous buffers, each touched page by page before anything is timed:
 * the read buffer (default 4096 MiB, first touched by the reader thread that reads each slice)
 * and the copy buffer (default 2048 MiB, registered as pinned with cuda_host_register: read-only
 * and mapped, as the engine registers the model's mapping). Three phases, each MS milliseconds
 * (default 1500):
 *   reads alone   THREADS threads (default: the CPUs this process may use) each sum their own
 *                 slice of the read buffer, 1 MiB at a time, over and over, with plain wide
 *                 loads (AVX-512 or AVX2 when the CPU has them, as bench_matvec's plain loop);
 *   copies alone  the main thread keeps 64 MiB cudaMemcpyAsync chunks of the copy buffer
 *                 in flight (two streams, two chunks queued on each) into device buffers;
 *   both at once  both started together, both stopped after MS.
 * GB/s are 1e9 bytes per second of wall time (a side's clock runs from its start to the end of
 * its last read or copy). The phases alternate R times (default 3: a shared host's bandwidth
 * drifts); each phase reports the repetition with the best sum. The device is put in blocking
 * sync, so the waiting main thread leaves its CPU to the readers. Prints one line per phase
 * (read, copy and sum GB/s) and a verdict: the sum at once over the larger figure alone, and the
 * share of its figure alone each side kept at once; "they add up" when both kept >= 90%, "one
 * shared bandwidth" when the sum at once is <= 1.1 x max(alone), else "partly shared". --json:
 * the same as one JSON object. Built only with CUDA; without a device it says "no CUDA device"
 * and exits with 2, as for a bad flag.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include <cuda_runtime_api.h>

#include "base/cpu.h"
#include "cuda/cuda_host.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { BLOCK = 1 << 20, CHUNK = 64 << 20, STREAMS = 2, DEPTH = 2 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef uint64_t (*read_fn)(const uint8_t *p, size_t n); /* n: a multiple of 256 */

static uint64_t read_u64(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)(const void *)p;
    uint64_t a0 = 0, a1 = 0;
    for (size_t i = 0; i < n / 8; i += 2) a0 += q[i], a1 += q[i + 1];
    return a0 + a1;
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
    for (size_t i = 0; i < n; i += 64) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
    }
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)(void *)t, _mm256_add_epi64(a0, a1));
    return t[0] + t[1] + t[2] + t[3];
}
__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0;
    for (size_t i = 0; i < n; i += 128) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 64)));
    }
    uint64_t t[8], s = 0; /* not _mm512_reduce_add_epi64: its signed adds overflow (UBSan) */
    _mm512_storeu_si512((void *)t, _mm512_add_epi64(a0, a1));
    for (int i = 0; i < 8; i++) s += t[i];
    return s;
}
#endif

typedef struct {
    pthread_barrier_t start; /* the readers and the main thread */
    atomic_int stop;
    read_fn read;
} read_shared;

typedef struct {
    _Alignas(64) read_shared *sh;
    uint8_t *p; /* this thread's slice: n bytes, a multiple of BLOCK */
    size_t n;
    int fill; /* 1: touch the slice and return */
    uint64_t bytes, sum;
} reader;

static void *reader_main(void *arg) {
    reader *r = arg;
    if (r->fill) {
        memset(r->p, 0x11, r->n);
        return NULL;
    }
    pthread_barrier_wait(&r->sh->start);
    for (size_t off = 0; !atomic_load_explicit(&r->sh->stop, memory_order_relaxed);) {
        r->sum += r->sh->read(r->p + off, BLOCK);
        r->bytes += BLOCK;
        off = off + BLOCK < r->n ? off + BLOCK : 0;
    }
    return NULL;
}

typedef struct {
    const uint8_t *src;
    size_t n;
    void *dst[STREAMS];
    cudaStream_t st[STREAMS];
    cudaEvent_t ev[STREAMS][DEPTH];
} copier;

static int cu(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "bench_host_pcie: %s: %s\n", what, cudaGetErrorString(e));
    return -1;
}

/* Keeps DEPTH chunks queued on each stream for ms milliseconds; *gbs: 1e9 bytes copied per s. */
static int copy_run(copier *c, double ms, double *gbs) {
    double bytes = 0;
    size_t off = 0;
    const double t0 = now_s();
    for (int k = 0;; k++) {
        const int s = k % STREAMS, slot = k / STREAMS % DEPTH;
        if (k >= STREAMS * DEPTH && cu(cudaEventSynchronize(c->ev[s][slot]), "event sync"))
            return -1;
        if (now_s() - t0 >= ms * 1e-3) break;
        const size_t n = c->n - off < CHUNK ? c->n - off : CHUNK;
        if (cu(cudaMemcpyAsync(c->dst[s], c->src + off, n, cudaMemcpyHostToDevice, c->st[s]),
               "cudaMemcpyAsync") ||
            cu(cudaEventRecord(c->ev[s][slot], c->st[s]), "cudaEventRecord"))
            return -1;
        bytes += (double)n;
        off = off + n < c->n ? off + n : 0;
    }
    for (int s = 0; s < STREAMS; s++)
        if (cu(cudaStreamSynchronize(c->st[s]), "cudaStreamSynchronize")) return -1;
    *gbs = bytes / (now_s() - t0) / 1e9;
    return 0;
}

/* One phase: reads (rd), copies (cp) or both; rg/cg get the GB/s (0 for a side not run). */
static int phase(reader *rs, int nt, copier *c, long ms, int rd, int cp, double *rg, double *cg) {
    read_shared *sh = rs[0].sh;
    pthread_t th[nt];
    int started = 0, rc = 0;
    *rg = *cg = 0;
    atomic_store(&sh->stop, 0);
    for (; rd && started < nt; started++) {
        rs[started].bytes = 0;
        if (pthread_create(&th[started], NULL, reader_main, &rs[started])) break;
    }
    if (rd && started < nt) { /* the barrier would never open: stop here */
        fprintf(stderr, "bench_host_pcie: pthread_create failed after %d threads\n", started);
        return -1;
    }
    if (rd) pthread_barrier_wait(&sh->start);
    const double t0 = now_s();
    const struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = ms % 1000 * 1000000L};
    if (cp) rc = copy_run(c, (double)ms, cg);
    else nanosleep(&ts, NULL);
    atomic_store(&sh->stop, 1);
    double bytes = 0;
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL), bytes += (double)rs[i].bytes;
    if (rd) *rg = bytes / (now_s() - t0) / 1e9;
    return rc;
}

static int arg_long(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "bench_host_pcie: %s needs an integer in [%ld, %ld], got %s%s%s\n", flag,
                lo, hi, v ? "'" : "nothing", v ? v : "", v ? "'" : "");
        return -1;
    }
    *out = x;
    return 0;
}

int main(int argc, char **argv) {
    long nt = hm_cpu_count_allowed(), read_mib = 4096, copy_mib = 2048, ms = 1500, reps = 3;
    int json = 0, bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-t") || !strcmp(a, "--threads")) bad = arg_long(a, v, 1, 1024, &nt), i++;
        else if (!strcmp(a, "--read-mib")) bad = arg_long(a, v, 1, 1L << 24, &read_mib), i++;
        else if (!strcmp(a, "--copy-mib")) bad = arg_long(a, v, 1, 1L << 24, &copy_mib), i++;
        else if (!strcmp(a, "--ms")) bad = arg_long(a, v, 1, 3600000, &ms), i++;
        else if (!strcmp(a, "--reps")) bad = arg_long(a, v, 1, 1000, &reps), i++;
        else if (!strcmp(a, "--json")) json = 1;
        else fprintf(stderr, "bench_host_pcie: unknown argument '%s'\n", a), bad = 1;
    }
    if (!bad && read_mib < nt)
        fprintf(stderr, "bench_host_pcie: --read-mib %ld gives %ld threads less than 1 MiB each\n",
                read_mib, nt), bad = 1;
    if (bad) {
        fprintf(stderr, "usage: %s [-t THREADS] [--read-mib M] [--copy-mib M] [--ms MS] [--reps R] "
                        "[--json]\n", argv[0]);
        return 2;
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "bench_host_pcie: no CUDA device (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return 2;
    }
    struct cudaDeviceProp prop;
    if (cu(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync), "cudaSetDeviceFlags") ||
        cu(cudaSetDevice(0), "cudaSetDevice") ||
        cu(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties"))
        return 1;

    const size_t slice = (size_t)read_mib / (size_t)nt * BLOCK;
    const size_t rbytes = (size_t)read_mib << 20, cbytes = (size_t)copy_mib << 20;
    uint8_t *rbuf = mmap(NULL, rbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *cbuf = mmap(NULL, cbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (rbuf == MAP_FAILED || cbuf == MAP_FAILED) {
        fprintf(stderr, "bench_host_pcie: cannot map %ld + %ld MiB\n", read_mib, copy_mib);
        return 1;
    }
    read_shared sh = {.read = read_u64};
    const char *isa = "scalar";
#if defined(__x86_64__)
    if (hm_cpu_has_avx512()) sh.read = read_avx512, isa = "avx512";
    else if (hm_cpu_has_avx2()) sh.read = read_avx2, isa = "avx2";
#endif
    pthread_barrier_init(&sh.start, NULL, (unsigned)nt + 1);
    reader *rs = aligned_alloc(64, (size_t)nt * sizeof(*rs)); /* one cache line each at least */
    if (!rs) return 1;
    pthread_t th[nt];
    int nfill = 0;
    for (long i = 0; i < nt; i++) { /* first touch by the threads that read it */
        rs[i] = (reader){.sh = &sh, .p = rbuf + slice * (size_t)i, .n = slice, .fill = 1};
        if (pthread_create(&th[nfill], NULL, reader_main, &rs[i]) == 0) nfill++;
        else reader_main(&rs[i]);
    }
    for (int i = 0; i < nfill; i++) pthread_join(th[i], NULL);
    for (long i = 0; i < nt; i++) rs[i].fill = 0;
    memset(cbuf, 0x5a, cbytes);

    cuda_host_reg *reg = NULL;
    hm_error err;
    hm_error_clear(&err);
    if (cuda_host_register(cbuf, cbytes, &reg, &err) != HM_OK) {
        fprintf(stderr, "bench_host_pcie: %s\n", err.msg);
        return 1;
    }
    copier c = {.src = cbuf, .n = cbytes};
    for (int s = 0; s < STREAMS; s++) {
        if (cu(cudaMalloc(&c.dst[s], CHUNK), "cudaMalloc") ||
            cu(cudaStreamCreateWithFlags(&c.st[s], cudaStreamNonBlocking), "cudaStreamCreate"))
            return 1;
        for (int d = 0; d < DEPTH; d++)
            if (cu(cudaEventCreateWithFlags(&c.ev[s][d], cudaEventDisableTiming | cudaEventBlockingSync),
                   "cudaEventCreate"))
                return 1;
    }

    static const char *const names[3] = {"reads alone", "copies alone", "both at once"};
    double best[3][2] = {{0}};
    for (long r = 0; r < reps; r++)
        for (int p = 0; p < 3; p++) {
            double rg, cg;
            if (phase(rs, (int)nt, &c, ms, p != 1, p != 0, &rg, &cg)) return 1;
            if (rg + cg > best[p][0] + best[p][1]) best[p][0] = rg, best[p][1] = cg;
        }
    const double alone = best[0][0] > best[1][1] ? best[0][0] : best[1][1];
    const double sum_ratio = alone > 0 ? (best[2][0] + best[2][1]) / alone : 0;
    const double rshare = best[0][0] > 0 ? best[2][0] / best[0][0] : 0;
    const double cshare = best[1][1] > 0 ? best[2][1] / best[1][1] : 0;
    const char *verdict = rshare >= 0.9 && cshare >= 0.9 ? "they add up"
                          : sum_ratio <= 1.1             ? "one shared bandwidth"
                                                         : "partly shared";
    uint64_t chk = 0;
    for (long i = 0; i < nt; i++) chk += rs[i].sum;
    if (json) {
        printf("{\"device\":\"%s\",\"threads\":%ld,\"isa\":\"%s\",\"read_mib\":%ld,"
               "\"copy_mib\":%ld,\"chunk_mib\":%d,\"streams\":%d,\"ms\":%ld,\"reps\":%ld,"
               "\"phases\":{", prop.name, nt, isa, read_mib, copy_mib, CHUNK >> 20, STREAMS, ms, reps);
        for (int p = 0; p < 3; p++)
            printf("%s\"%s\":{\"read_gbs\":%.3f,\"copy_gbs\":%.3f,\"sum_gbs\":%.3f}", p ? "," : "",
                   p == 0 ? "read" : p == 1 ? "copy" : "both", best[p][0], best[p][1],
                   best[p][0] + best[p][1]);
        printf("},\"sum_over_max_alone\":%.4f,\"read_share\":%.4f,\"copy_share\":%.4f,"
               "\"verdict\":\"%s\",\"checksum\":%llu}\n",
               sum_ratio, rshare, cshare, verdict, (unsigned long long)chk);
    } else {
        printf("bench_host_pcie: %s, %ld threads (%s), read %ld MiB, copy %ld MiB pinned in %d MiB "
               "chunks on %d streams, %ld ms x %ld reps (best sum), checksum %llx\n",
               prop.name, nt, isa, read_mib, copy_mib, CHUNK >> 20, STREAMS, ms, reps,
               (unsigned long long)chk);
        for (int p = 0; p < 3; p++)
            printf("%-13s read %7.2f GB/s  copy %7.2f GB/s  sum %7.2f GB/s\n", names[p],
                   best[p][0], best[p][1], best[p][0] + best[p][1]);
        printf("verdict: sum at once / max(alone) = %.2f; reads kept %.0f%% and copies %.0f%% of "
               "their figure alone: %s\n", sum_ratio, 100 * rshare, 100 * cshare, verdict);
    }
    cuda_host_unregister(reg); /* the buffers, streams and events go with the process */
    pthread_barrier_destroy(&sh.start);
    free(rs);
    return 0;
}
