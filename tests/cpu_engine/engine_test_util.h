/* engine_test_util.h - helpers of the CPU engine's architecture tests: seeded token ids, an
 * engine with an f32 KV cache, a run of ids in calls of a given size. Header-only. */
#ifndef HM_TESTS_ENGINE_TEST_UTIL_H
#define HM_TESTS_ENGINE_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cpu_engine/cpu_engine.h"
#include "quant/qtypes.h"

/* n token ids from seed, in [3, 960) */
static inline void ce_t_ids(int32_t *ids, int n, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((x >> 33) % 957);
    }
}

/* a CPU engine over m with an f32 KV cache (NULL on failure, the reason on stderr) */
static inline cpu_engine *ce_t_engine(const hm_model *m, int n_ctx, int ub, int nth, int n_seq) {
    cpu_engine_params p = {.n_ctx = n_ctx, .n_ubatch = ub, .n_threads = nth,
                           .type_k = HM_TYPE_F32, .type_v = HM_TYPE_F32, .n_seq = n_seq};
    cpu_engine *e = NULL;
    hm_error err;
    if (cpu_engine_init(m, &p, &e, &err) != HM_OK) fprintf(stderr, "engine: %s\n", err.msg);
    return e;
}

/* logits [n][V] of ids through e from position 0 in calls of at most `chunk` tokens */
static inline bool ce_t_run(cpu_engine *e, const int32_t *ids, int n, int chunk, float *lo,
                            int64_t V) {
    hm_error err;
    for (int t = 0; t < n; t += chunk) {
        const int k = n - t < chunk ? n - t : chunk;
        if (cpu_engine_decode(e, ids + t, k, t, lo + (size_t)t * (size_t)V, HM_LOGITS_ALL,
                              &err) != HM_OK) {
            fprintf(stderr, "decode: %s\n", err.msg);
            return false;
        }
    }
    return true;
}

#endif
