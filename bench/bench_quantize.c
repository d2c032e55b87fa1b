/* bench_quantize.c - single-threaded speed of the reference quantisers and dequantisers.
 *
 *   bench_quantize [--mel M] [--types q4_K,q8_0,...]
 *
 * For each type: quant_quantize_row and quant_dequantize_row over M million N(0,1) floats
 * (default 4), best of 3, timed with the thread's CPU clock (so other load on the machine does
 * not count), reported as million elements per second, with the relative RMS error. This is the
 * rate `forge` quantises at per thread.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/quant.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const uint32_t k_types[] = {HM_TYPE_F16,   HM_TYPE_BF16, HM_TYPE_Q8_0,   HM_TYPE_Q4_0,
                                   HM_TYPE_Q4_1,  HM_TYPE_Q5_0, HM_TYPE_Q5_1,   HM_TYPE_Q4_K,
                                   HM_TYPE_Q5_K,  HM_TYPE_Q6_K, HM_TYPE_IQ4_NL, HM_TYPE_IQ4_XS,
                                   HM_TYPE_MXFP4, HM_TYPE_Q8_K};

int main(int argc, char **argv) {
    double mel = 4.0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mel") && i + 1 < argc)
            mel = atof(argv[++i]);
        else if (!strcmp(argv[i], "--types") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_quantize [--mel M] [--types q4_K,q8_0,...]\n");
            return 2;
        }
    }
    const int64_t n = ((int64_t)(mel * 1e6) + 255) / 256 * 256;
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    void *q = malloc((size_t)n * sizeof(float));
    if (!x || !y || !q || n <= 0) {
        fprintf(stderr, "bench_quantize: out of memory\n");
        return 1;
    }
    uint64_t s = 42;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const double u1 = ((double)(s >> 32) + 0.5) / 4294967296.0;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const double u2 = ((double)(s >> 32) + 0.5) / 4294967296.0;
        x[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
    printf("| type | quantise Mel/s | dequantise Mel/s | rel. RMS error |\n| --- | --- | --- | --- "
           "|\n");
    for (size_t k = 0; k < sizeof(k_types) / sizeof(k_types[0]); k++) {
        const uint32_t t = k_types[k];
        if (only && !strstr(only, hm_type_name(t))) continue;
        double tq = 1e30, td = 1e30;
        for (int r = 0; r < 3; r++) {
            double t0 = cpu_s();
            if (quant_quantize_row(t, x, q, n) != HM_OK) return 1;
            double t1 = cpu_s();
            if (quant_dequantize_row(t, q, y, n) != HM_OK) return 1;
            double t2 = cpu_s();
            tq = t1 - t0 < tq ? t1 - t0 : tq;
            td = t2 - t1 < td ? t2 - t1 : td;
        }
        double e = 0, xx = 0;
        for (int64_t i = 0; i < n; i++) {
            e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            xx += (double)x[i] * x[i];
        }
        printf("| %s | %.1f | %.1f | %.5f |\n", hm_type_name(t), (double)n / tq / 1e6,
               (double)n / td / 1e6, sqrt(e / xx));
    }
    free(x), free(y), free(q);
    return 0;
}
