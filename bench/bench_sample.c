/* bench_sample.c - the host's cost of picking a token: sample_token on random logits of a
 * model-sized vocabulary, greedy (temperature 0, no penalties: what bench and tg128 do) and the
 * default chain (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05). Prints microseconds per
 * call, best of 7 runs of 200 calls.
 * Usage: bench_sample [n_vocab] (default 151936, qwen3's; gpt-oss has 201088). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sample/sample.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double per_call_us(sample_state *s, const float *l) {
    double best = 1e9;
    int32_t t = 0;
    for (int rep = 0; rep < 7; rep++) {
        const double t0 = now();
        for (int k = 0; k < 200; k++)
            if (sample_token(s, l, &t, NULL) != HM_OK) return -1.0;
        const double dt = (now() - t0) / 200;
        best = dt < best ? dt : best;
    }
    return best * 1e6;
}

int main(int argc, char **argv) {
    const int32_t n = argc > 1 ? atoi(argv[1]) : 151936;
    if (n < 1) {
        fprintf(stderr, "bench_sample: vocabulary size %d\n", n);
        return 2;
    }
    float *l = malloc(sizeof(float) * (size_t)n);
    if (!l) return 1;
    uint64_t r = 7;
    for (int32_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((r >> 40) % 100000) * 1e-3f - 50.0f;
    }
    sample_params greedy = sample_params_default(), chain = sample_params_default();
    greedy.temperature = 0.0f;
    greedy.penalty_last_n = 0;
    sample_state *sg = NULL, *sc = NULL;
    if (sample_init(&greedy, n, &sg, NULL) != HM_OK || sample_init(&chain, n, &sc, NULL) != HM_OK) {
        fprintf(stderr, "bench_sample: cannot set up the samplers\n");
        return 1;
    }
    printf("vocabulary %d: greedy %.1f us, default chain %.1f us per token\n", n,
           per_call_us(sg, l), per_call_us(sc, l));
    sample_free(sg);
    sample_free(sc);
    free(l);
    return 0;
}
