/* bench_dot.c - one core's compute speed of the kernel tables' dot tiles, with the weights in
 * cache: the rate at which a core could stream weights if memory were free. A matvec on many
 * cores reaches the host's read bandwidth only when this rate is well above each core's share
 * of it (bench_matvec measures that share).
 *
 *   bench_dot [--types q4_K,q6_K,...] [--kib K] [--k N] [--nc C] [--ms M] [--isa ref|avx2|avx512]
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

#include "quant/quant.h"

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

/* seconds per pass over all rows, best of 5 runs of about ms milliseconds */
static double time_passes(const quant_kernels *kt, uint32_t type, int64_t k, int64_t rows,
                          const uint8_t *w, size_t wrow, const uint8_t *act, size_t arow, int nc,
                          float *out, double ms) {
    const quant_dot_tile_fn dot = kt->dot[type];
    double best = 1e30;
    for (int run = 0; run < 6; run++) {
        long passes = 0;
        const double t0 = now();
        double t = t0;
        do {
            for (int64_t r = 0; r < rows; r += 16) {
                const int nr = rows - r < 16 ? (int)(rows - r) : 16;
                dot(k, w + (size_t)r * wrow, wrow, nr, act, arow, nc, out + r, (size_t)rows);
            }
            passes++;
            t = now();
        } while (t - t0 < ms * 1e-3 && run > 0);
        if (run > 0 && (t - t0) / (double)passes < best) best = (t - t0) / (double)passes;
    }
    return best;
}

int main(int argc, char **argv) {
    const char *types = "q4_0,q8_0,mxfp4,q4_K,q5_K,q6_K,iq4_xs";
    int64_t kib = 256, kopt = 0;
    int nc = 1;
    double ms = 200.0;
    const quant_kernels *kt = quant_kernels_best();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--types") && v) types = argv[++i];
        else if (!strcmp(a, "--kib") && v) kib = atoll(argv[++i]);
        else if (!strcmp(a, "--k") && v) kopt = atoll(argv[++i]);
        else if (!strcmp(a, "--nc") && v) nc = atoi(argv[++i]);
        else if (!strcmp(a, "--ms") && v) ms = atof(argv[++i]);
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
                    "[--isa ref|avx2|avx512]\n", argv[0]);
            return 2;
        }
    }
    if (kib < 1 || nc < 1 || nc > 64 || ms <= 0.0 || kopt < 0) {
        fprintf(stderr, "bench_dot: bad argument (kib >= 1, 1 <= nc <= 64, ms > 0)\n");
        return 2;
    }
    printf("kernel table: %s, one thread, %lld KiB of weights, %d activation row(s)\n\n", kt->name,
           (long long)kib, nc);
    printf("| type | k | rows | GB/s | ns per block |\n| --- | --- | --- | --- | --- |\n");
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
        if (rows < 1) rows = 1;
        const quant_act at = quant_act_for(type);
        const size_t arow = quant_act_row_size(at, k);
        uint8_t *w = malloc(wrow * (size_t)rows), *act = malloc(arow * (size_t)nc);
        float *x = malloc(sizeof(float) * (size_t)k), *out = malloc(sizeof(float) * (size_t)(rows * nc));
        if (!w || !act || !x || !out) {
            fprintf(stderr, "bench_dot: out of memory\n");
            return 1;
        }
        uint64_t seed = 42;
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < k; i++) x[i] = rng_float(&seed);
            if (quant_quantize_row(type, x, w + (size_t)r * wrow, k) != HM_OK) {
                fprintf(stderr, "bench_dot: cannot quantise %s\n", tok);
                return 1;
            }
        }
        for (int c = 0; c < nc; c++) {
            for (int64_t i = 0; i < k; i++) x[i] = rng_float(&seed);
            kt->act[at](x, act + (size_t)c * arow, k);
        }
        const double s = time_passes(kt, type, k, rows, w, wrow, act, arow, nc, out, ms);
        const double bytes = (double)wrow * (double)rows, blocks = (double)(k / bs) * (double)rows;
        printf("| %s | %lld | %lld | %.2f | %.2f |\n", tok, (long long)k, (long long)rows,
               bytes / s * 1e-9, s / blocks * 1e9);
        free(w);
        free(act);
        free(x);
        free(out);
    }
    return 0;
}
