/* engine_test_util.h - helpers of the CPU engine's architecture tests: seeded token ids, an
 * engine with an f32 KV cache, a run of ids in calls of a given size, a prompt's bytes across
 * call sizes and thread counts, logits against a double reference. Header-only. */
#ifndef HM_TESTS_ENGINE_TEST_UTIL_H
#define HM_TESTS_ENGINE_TEST_UTIL_H

#include <math.h>
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

/* ids [n] as one prompt call (2 threads) into a [n][V]; then again after a reset, and in calls
 * of chunks[k][0] tokens on chunks[k][1] threads, each into b [n][V]: the runs whose bytes differ
 * from a (each named on stderr), or -1 when an engine failed. */
static inline int ce_t_prompt_identity(const hm_model *m, int n_ctx, const int32_t *ids, int n,
                                       int64_t V, const int (*chunks)[2], int n_chunks, float *a,
                                       float *b) {
    const size_t sz = sizeof(float) * (size_t)n * (size_t)V;
    cpu_engine *e = ce_t_engine(m, n_ctx, n, 2, 1);
    if (!e || !ce_t_run(e, ids, n, n, a, V)) return cpu_engine_free(e), -1;
    cpu_engine_reset(e);
    int bad = 0;
    if (!ce_t_run(e, ids, n, n, b, V)) return cpu_engine_free(e), -1;
    if (memcmp(a, b, sz)) bad++, fprintf(stderr, "after a reset the prompt gives other bytes\n");
    cpu_engine_free(e);
    for (int k = 0; k < n_chunks; k++) {
        e = ce_t_engine(m, n_ctx, chunks[k][0], chunks[k][1], 1);
        memset(b, 0, sz);
        if (!e || !ce_t_run(e, ids, n, chunks[k][0], b, V)) return cpu_engine_free(e), -1;
        if (memcmp(a, b, sz))
            bad++, fprintf(stderr, "ubatch %d, %d threads: other bytes than the prompt\n",
                           chunks[k][0], chunks[k][1]);
        cpu_engine_free(e);
    }
    return bad;
}

/* The engine's logits lo [n][V] against a reference's ref [n][V]: the largest |difference|, the
 * reference's standard deviation over all rows, the rows whose argmax differ. */
typedef struct {
    double max_diff, sd;
    int argmax_diff;
} ce_t_cmp;

static inline ce_t_cmp ce_t_compare(const float *lo, const double *ref, int n, int64_t V) {
    ce_t_cmp c = {0};
    double mean = 0, var = 0;
    const size_t nn = (size_t)n * (size_t)V;
    for (size_t i = 0; i < nn; i++) mean += ref[i];
    mean /= (double)nn;
    for (size_t i = 0; i < nn; i++) var += (ref[i] - mean) * (ref[i] - mean);
    c.sd = sqrt(var / (double)nn);
    for (int t = 0; t < n; t++) {
        int64_t ia = 0, ib = 0;
        for (int64_t j = 0; j < V; j++) {
            const size_t i = (size_t)t * (size_t)V + (size_t)j;
            const double d = fabs((double)lo[i] - ref[i]);
            if (!(d <= c.max_diff)) c.max_diff = d;
            if (lo[i] > lo[(size_t)t * (size_t)V + (size_t)ia]) ia = j;
            if (ref[i] > ref[(size_t)t * (size_t)V + (size_t)ib]) ib = j;
        }
        c.argmax_diff += ia != ib;
    }
    return c;
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
