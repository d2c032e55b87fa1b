/* bench_pool.c - fixed cost of the thread pool's jobs, as a decode layer pays it: the front of a
 * layer (q/k/v, attention, wo, router) as four item jobs with a short serial step on the caller
 * between them, against the same work as one staged job (tp_run_stages). Items and steps are
 * busy loops of a given length, so the difference is the cost of three job ends and starts.
 * Usage: bench_pool [threads] [item_ns] [step_ns]. Prints microseconds per layer front (best of
 * 5 runs of 2000 layers) and the empty-job cost. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/threadpool.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void spin_ns(double ns) {
    const double end = now() + ns * 1e-9;
    while (now() < end) {
    }
}

typedef struct {
    double item_ns, step_ns;
} work;

static void item_fn(void *ctx, int64_t item, int ith) {
    (void)item;
    (void)ith;
    spin_ns(((const work *)ctx)->item_ns);
}

static void step_fn(void *ctx) { spin_ns(((const work *)ctx)->step_ns); }

enum { STAGES = 4, LAYERS = 2000 };

static double per_layer_us(tp_pool *pool, work *w, int64_t items, int staged) {
    double best = 1e30;
    for (int run = 0; run < 5; run++) {
        const double t0 = now();
        for (int l = 0; l < LAYERS; l++) {
            if (staged) {
                tp_stage st[STAGES];
                for (int s = 0; s < STAGES; s++)
                    st[s] = (tp_stage){.fn = item_fn, .ctx = w, .n_items = items,
                                       .then = s < STAGES - 1 ? step_fn : NULL, .then_ctx = w};
                tp_run_stages(pool, st, STAGES);
            } else {
                for (int s = 0; s < STAGES; s++) {
                    tp_run_items(pool, item_fn, w, items);
                    if (s < STAGES - 1) step_fn(w);
                }
            }
        }
        const double us = (now() - t0) / LAYERS * 1e6;
        if (us < best) best = us;
    }
    return best;
}

int main(int argc, char **argv) {
    const int nth = argc > 1 ? atoi(argv[1]) : 2;
    work w = {.item_ns = argc > 2 ? atof(argv[2]) : 2000, .step_ns = argc > 3 ? atof(argv[3]) : 1000};
    tp_pool *pool = NULL;
    if (tp_init(nth, &pool, NULL) != HM_OK) return 1;
    const int64_t items = (int64_t)nth * 8; /* matmul's chunks: 8 per thread */
    const double ideal = (STAGES * items * w.item_ns / nth + (STAGES - 1) * w.step_ns) * 1e-3;
    const double jobs = per_layer_us(pool, &w, items, 0), staged = per_layer_us(pool, &w, items, 1);
    printf("threads %d, %lld items of %.0f ns per stage, steps of %.0f ns: ideal %.1f us\n", nth,
           (long long)items, w.item_ns, w.step_ns, ideal);
    printf("4 item jobs + steps on the caller: %.1f us per layer front\n", jobs);
    printf("1 staged job (tp_run_stages):      %.1f us per layer front\n", staged);
    work empty = {0, 0};
    printf("empty item job: %.2f us\n", per_layer_us(pool, &empty, items, 0) / STAGES);
    tp_free(pool);
    return 0;
}
