/* bench_dot.c - one core's compute speed of the kernel tables' dot tiles, with the weights in
 * cache: the rate at which a core could stream weights if memory were free. A matvec on many
 * cores reaches the host's read bandwidth only when this rate is well above each core's share
 * of it (bench_matvec measures that share).
 *
 *   bench_dot [--types q4_K,q6_K,...] [--kib K] [--k N] [--nc C] [--ms M] [--isa ref|avx2|avx512]
 *             [-t T] [--x8]
 *
 * Per type: a weight matrix of about K KiB (default 256: inside L2) with rows of N elements
 * (default 2048, or 2880 for 32-element types; a multiple of the type's block), multiplied by C
 * activation rows (default 1) with the table's dot tile, 16 rows per call as cpu_matmul does,
 * repeated for M milliseconds (default 200) after one warm-up pass; best of 5. Prints GB/s of
 * weights, ns per weight block and, for C > 1, GB/s counting each weight byte once per call.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/threadpool.h"
#include "quant/quant.h"
#include "quant/quant_x8.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint32_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}

static float rng_float(uint64_t *s) { return (float)rng_next(s) / 2147483648.0f - 1.0f; }

/* one thread's data: weights (or their x8 repacking), activation rows, outputs */
typedef struct {
    const quant_kernels *kt;
    uint32_t type;
    int64_t k, rows;
    size_t wrow, arow;
    int nc;
    uint8_t *w, *act;
    float *out;
    quant_x8_dot_fn x8; /* --x8: w holds rows / 8 groups */
    long passes;        /* for the threaded runs */
} dot_ctx;

static void one_pass(const dot_ctx *d) {
    if (d->x8) {
        for (int64_t g = 0; g < d->rows / 8; g++)
            d->x8(d->k, d->w + (size_t)g * 8 * d->wrow, d->act, d->arow, d->nc,
                  d->out + 8 * (size_t)g * (size_t)d->nc);
        return;
    }
    const quant_dot_tile_fn dot = d->kt->dot[d->type];
    for (int64_t r = 0; r < d->rows; r += 16) {
        const int nr = d->rows - r < 16 ? (int)(d->rows - r) : 16;
        dot(d->k, d->w + (size_t)r * d->wrow, d->wrow, nr, d->act, d->arow, d->nc, d->out + r,
            (size_t)d->rows);
    }
}

/* seconds per pass over all rows, best of 5 runs of about ms milliseconds */
static double time_passes(const dot_ctx *d, double ms) {
    double best = 1e30;
    for (int run = 0; run < 6; run++) {
        long passes = 0;
        const double t0 = now();
        double t = t0;
        do {
            one_pass(d);
            passes++;
            t = now();
        } while (t - t0 < ms * 1e-3 && run > 0);
        if (run > 0 && (t - t0) / (double)passes < best) best = (t - t0) / (double)passes;
    }
    return best;
}

static void thread_passes(void *ctx, int ith, int nth) {
    (void)nth;
    const dot_ctx *d = (const dot_ctx *)ctx + ith;
    for (long p = 0; p < d->passes; p++) one_pass(d);
}

int main(int argc, char **argv) {
    const char *types = "q4_0,q8_0,mxfp4,q4_K,q5_K,q6_K,iq4_xs";
    int64_t kib = 256, kopt = 0;
    int nc = 1, nthr = 1, x8 = 0;
    double ms = 200.0;
    const quant_kernels *kt = quant_kernels_best();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--types") && v) types = argv[++i];
        else if (!strcmp(a, "--kib") && v) kib = atoll(argv[++i]);
        else if (!strcmp(a, "--k") && v) kopt = atoll(argv[++i]);
        else if (!strcmp(a, "--nc") && v) nc = atoi(argv[++i]);
        else if (!strcmp(a, "--ms") && v) ms = atof(argv[++i]);
        else if (!strcmp(a, "-t") && v) nthr = atoi(argv[++i]);
        else if (!strcmp(a, "--x8")) x8 = 1;
        else if (!strcmp(a, "--isa") && v) {
            i++;
            const quant_isa isa = !strcmp(v, "ref") ? QUANT_ISA_REF
                                  : !strcmp(v, "avx2") ? QUANT_ISA_AVX2
                                  : !strcmp(v, "avx512") ? QUANT_ISA_AVX512 : QUANT_ISA_COUNT;
            kt = isa == QUANT_ISA_COUNT ? NULL : quant_kernels_get(isa);
            if (!kt) {
                fprintf(stderr, "bench_dot: kernel table %s unknown or not runnable here\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [--types a,b] [--kib K] [--k N] [--nc C] [--ms M] "
                    "[--isa ref|avx2|avx512] [-t T] [--x8]\n", argv[0]);
            return 2;
        }
    }
    if (kib < 1 || nc < 1 || nc > 64 || ms <= 0.0 || kopt < 0 || nthr < 1 || nthr > 1024) {
        fprintf(stderr, "bench_dot: bad argument (kib >= 1, 1 <= nc <= 64, ms > 0, 1 <= t <= 1024)\n");
        return 2;
    }
    tp_pool *pool = NULL;
    hm_error err;
    if (nthr > 1 && tp_init(nthr, &pool, &err) != HM_OK) {
        fprintf(stderr, "bench_dot: %s\n", err.msg);
        return 1;
    }
    printf("kernel table: %s%s, %d thread(s) (each its own copy), %lld KiB of weights, %d "
           "activation row(s)\n\n", kt->name, x8 ? " (x8: rows repacked by eights)" : "", nthr,
           (long long)kib, nc);
    printf("| type | k | rows | GB/s (all threads) | ns per block (one thread) |\n"
           "| --- | --- | --- | --- | --- |\n");
    char list[256];
    snprintf(list, sizeof(list), "%s", types);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        const int ti = hm_type_from_name(tok);
        const uint32_t type = ti < 0 ? HM_TYPE_COUNT : (uint32_t)ti;
        if (type >= HM_TYPE_COUNT || !kt->dot[type]) {
            fprintf(stderr, "bench_dot: type %s unknown or without a kernel\n", tok);
            return 2;
        }
        const int64_t bs = hm_type_get(type)->block_size;
        const int64_t k = kopt ? kopt : (bs == 256 ? 2048 : 2880);
        if (k % bs) {
            fprintf(stderr, "bench_dot: k = %lld is not a multiple of %s's block (%lld)\n",
                    (long long)k, tok, (long long)bs);
            return 2;
        }
        const size_t wrow = hm_row_size(type, k);
        int64_t rows = kib * 1024 / (int64_t)wrow;
        const bool rep = x8 && quant_x8_supported(type);
        if (rep) rows = rows / 8 * 8;
        if (rows < (rep ? 8 : 1)) rows = rep ? 8 : 1;
        const quant_act at = quant_act_for(type);
        const size_t arow = quant_act_row_size(at, k);
        dot_ctx *ds = calloc((size_t)nthr, sizeof(dot_ctx));
        float *x = malloc(sizeof(float) * (size_t)k);
        if (!ds || !x) {
            fprintf(stderr, "bench_dot: out of memory\n");
            return 1;
        }
        for (int th = 0; th < nthr; th++) {
            dot_ctx *d = &ds[th];
            *d = (dot_ctx){.kt = kt, .type = type, .k = k, .rows = rows, .wrow = wrow, .arow = arow,
                           .nc = nc, .x8 = rep ? quant_x8_dot_for(type, kt) : NULL};
            d->w = malloc(wrow * (size_t)rows);
            d->act = malloc(arow * (size_t)nc);
            d->out = malloc(sizeof(float) * (size_t)(rows * nc));
            if (!d->w || !d->act || !d->out) {
                fprintf(stderr, "bench_dot: out of memory\n");
                return 1;
            }
            uint64_t seed = 42;
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t i = 0; i < k; i++) x[i] = rng_float(&seed);
                if (quant_quantize_row(type, x, d->w + (size_t)r * wrow, k) != HM_OK) {
                    fprintf(stderr, "bench_dot: cannot quantise %s\n", tok);
                    return 1;
                }
            }
            if (rep) { /* in place, group by group */
                uint8_t *tmp = malloc(8 * wrow);
                for (int64_t g = 0; g < rows / 8; g++) {
                    memcpy(tmp, d->w + (size_t)g * 8 * wrow, 8 * wrow);
                    if (quant_x8_repack(type, k, tmp, wrow, d->w + (size_t)g * 8 * wrow, &err) != HM_OK) {
                        fprintf(stderr, "bench_dot: %s\n", err.msg);
                        return 1;
                    }
                }
                free(tmp);
            }
            for (int c = 0; c < nc; c++) {
                for (int64_t i = 0; i < k; i++) x[i] = rng_float(&seed);
                kt->act[at](x, d->act + (size_t)c * arow, k);
            }
        }
        const double s = time_passes(&ds[0], ms);
        const double bytes = (double)wrow * (double)rows, blocks = (double)(k / bs) * (double)rows;
        double gbs = bytes / s * 1e-9;
        if (nthr > 1) { /* every thread the passes one thread does in about ms, best of 3 */
            const long passes = (long)(ms * 1e-3 / s) + 1;
            double best = 1e30;
            for (int th = 0; th < nthr; th++) ds[th].passes = passes;
            for (int run = 0; run < 4; run++) {
                const double t0 = now();
                tp_run(pool, thread_passes, ds);
                const double t = now() - t0;
                if (run > 0 && t < best) best = t;
            }
            gbs = bytes * (double)passes * (double)nthr / best * 1e-9;
        }
        printf("| %s%s | %lld | %lld | %.2f | %.2f |\n", tok, rep ? " x8" : "", (long long)k,
               (long long)rows, gbs, s / blocks * 1e9);
        for (int th = 0; th < nthr; th++) {
            free(ds[th].w);
            free(ds[th].act);
            free(ds[th].out);
        }
        free(ds);
        free(x);
    }
    tp_free(pool);
    return 0;
}
