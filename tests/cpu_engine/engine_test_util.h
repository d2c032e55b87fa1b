/* engine_test_util.h - helpers of the CPU engine's architecture tests: seeded token ids, an
 * engine with an f32 KV cache, a run of ids in calls of a given size. Header-only. */
#ifndef HM_TESTS_ENGINE_TEST_UTIL_H
#define HM_TESTS_ENGINE_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

/* Two sequences of nt tokens (ids[s] from seeds 21 and 22) run alone (alone [2][nt][V], calls
 * of 4) and then interleaved one token each per call on a two-sequence engine, returned (NULL
 * on failure); *bad counts the interleaved rows whose bytes differ from their sequence alone.
 * got: [2][V] scratch. */
static inline cpu_engine *ce_t_two_sequences(const hm_model *m, int n_ctx, int nt, int64_t V,
                                             int32_t *ids, float *alone, float *got, int *bad) {
    ce_t_ids(ids, nt, 21);
    ce_t_ids(ids + nt, nt, 22);
    *bad = 0;
    for (int s = 0; s < 2; s++) {
        cpu_engine *e = ce_t_engine(m, n_ctx, 4, 2, 1);
        const bool ok = e && ce_t_run(e, ids + s * nt, nt, 4, alone + (size_t)s * nt * (size_t)V, V);
        cpu_engine_free(e);
        if (!ok) return NULL;
    }
    cpu_engine *e = ce_t_engine(m, n_ctx, 4, 2, 2);
    hm_error err;
    for (int t = 0; e && t < nt; t++) { /* one token of each sequence per call, order alternating */
        const int first = t % 2;
        const int32_t tok[2] = {ids[first * nt + t], ids[(1 - first) * nt + t]};
        const int32_t sq[2] = {first, 1 - first}, pos[2] = {t, t};
        const uint8_t want[2] = {1, 1};
        if (cpu_engine_forward_seqs(e, tok, 2, sq, pos, want, got, &err) != HM_OK) {
            fprintf(stderr, "two sequences: %s\n", err.msg);
            cpu_engine_free(e);
            return NULL;
        }
        for (int k = 0; k < 2; k++)
            *bad += memcmp(got + (size_t)k * (size_t)V,
                           alone + ((size_t)sq[k] * (size_t)nt + (size_t)t) * (size_t)V,
                           sizeof(float) * (size_t)V) != 0;
    }
    return e;
}

#endif
