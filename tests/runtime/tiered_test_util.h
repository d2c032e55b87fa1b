/* tiered_test_util.h - the tiered tests' fake GPU: ordinary host memory standing in for the
 * hand-off's mapped memory (cuda/cuda_handoff.h), the test thread playing the GPU (it writes a
 * request, stores ready = seq with release, waits for done == seq or abort), and the CPU lane
 * run directly as the reference for the answers. */
#ifndef HM_TESTS_TIERED_UTIL_H
#define HM_TESTS_TIERED_UTIL_H

#ifndef TIERED_TEST_TAG
#error "define TIERED_TEST_TAG (the forged files' tag) before including tiered_test_util.h"
#endif

#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../forge/forge_test_util.h"
#include "harness.h"
#include "moe/moe_exec.h"
#include "runtime/tiered.h"

#define NT_MAX 8

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const hm_model *m;
    void *mem;
    cuda_handoff_view v;
    int32_t host[64];
    uint32_t seq;       /* the "GPU"'s step number */
    moe_exec *ref;      /* the reference: the CPU lane run directly */
    float *y_ref;
    unsigned long long rng;
} fake_gpu;

static inline bool fake_init(fake_gpu *g, const hm_model *m, bool odd_only) {
    memset(g, 0, sizeof(*g));
    const hm_hparams *hp = hm_model_hparams(m);
    g->m = m;
    g->rng = 0x9e3779b97f4a7c15ull;
    int n = 0;
    for (int il = 0; il < hp->n_layer && n < 64; il++)
        if (hm_model_layer(m, il)->gate_exps.data && (!odd_only || il % 2 == 1)) g->host[n++] = il;
    if (n == 0) return false;
    const int E = (int)hp->n_embd, K = (int)hp->n_expert_used;
    size_t bytes = cuda_handoff_bytes((int)hp->n_layer, E, K, NT_MAX, (int)hp->n_ff_exp);
    g->mem = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    g->y_ref = malloc(sizeof(float) * NT_MAX * (size_t)K * (size_t)E);
    hm_error err;
    if (!g->mem || !g->y_ref || moe_exec_init(m, NULL, NT_MAX, &g->ref, &err) != HM_OK) return false;
    memset(g->mem, 0, bytes);
    cuda_handoff_layout(g->mem, (int)hp->n_layer, E, K, NT_MAX, (int)hp->n_ff_exp, hp->n_expert,
                        g->host, n, &g->v);
    return true;
}

static inline void fake_free(fake_gpu *g) {
    moe_exec_free(g->ref);
    free(g->mem);
    free(g->y_ref);
}

/* Writes a request's data: n tokens of random rows and distinct random experts (the last id
 * replaced by bad_id when not 0). */
static inline void fill_request(fake_gpu *g, int n, int bad_id) {
    const cuda_handoff_view *v = &g->v;
    const int E = v->n_embd, K = v->n_used, NE = (int)v->n_expert;
    for (int i = 0; i < n * E; i++) v->x[i] = (float)((int)(hm_t_rnd(&g->rng) % 2001) - 1000) * 1e-3f;
    for (int t = 0; t < n; t++)
        for (int s = 0; s < K; s++) {
            int id;
            bool dup;
            do { /* distinct per token, as the router's top-k */
                id = (int)(hm_t_rnd(&g->rng) % (unsigned)NE);
                dup = false;
                for (int q = 0; q < s; q++) dup = dup || v->ids[t * K + q] == id;
            } while (dup);
            v->ids[t * K + s] = id;
            v->gw[t * K + s] = 1.0f / (float)K;
        }
    if (bad_id) v->ids[n * K - 1] = bad_id;
}

/* The message (layer and n_tok as given, to forge bad ones) and ready = seq for layer L. */
static inline void publish(fake_gpu *g, int L, uint32_t seq, uint32_t msg_layer, uint32_t msg_tok) {
    const cuda_handoff_view *v = &g->v;
    v->msg->seq = seq;
    v->msg->layer = msg_layer;
    v->msg->n_tok = msg_tok;
    v->msg->n_used = (uint32_t)v->n_used;
    __atomic_store_n(&v->flags[L].ready, seq, __ATOMIC_RELEASE);
}

/* A request for layer L with the next step number. */
static inline uint32_t post(fake_gpu *g, int L, int n, uint32_t msg_layer, uint32_t msg_tok,
                     int bad_id) {
    fill_request(g, n, bad_id);
    publish(g, L, ++g->seq, msg_layer, msg_tok);
    return g->seq;
}

/* 1: done == seq; 0: abort set (and not done); -1: neither within limit_s. */
static inline int wait_answer(fake_gpu *g, int L, uint32_t seq, double limit_s) {
    const double t0 = now_s();
    for (;;) {
        if (__atomic_load_n(&g->v.flags[L].done, __ATOMIC_ACQUIRE) == seq) return 1;
        if (__atomic_load_n(&g->v.ctl->abort, __ATOMIC_ACQUIRE) != 0) return 0;
        if (now_s() - t0 > limit_s) return -1;
        sched_yield();
    }
}

/* The answer of the last request (layer L, n tokens) against the CPU lane run directly. */
static inline bool answer_ok(fake_gpu *g, int L, int n) {
    const cuda_handoff_view *v = &g->v;
    const size_t ny = (size_t)n * (size_t)v->n_used * (size_t)v->n_embd;
    const moe_job job = {.layer = L, .n_tok = n, .n_used = v->n_used, .x = v->x, .ids = v->ids,
                         .weights = v->gw, .y = g->y_ref};
    bool summed;
    hm_error err;
    if (moe_exec_run(g->ref, &job, NULL, &summed, &err) != HM_OK) return false;
    const size_t E = (size_t)v->n_embd;
    for (size_t p = 0; p < ny / E; p++) /* slots posted < 0 are not computed: not compared */
        if (v->ids[p] >= 0 && memcmp(g->y_ref + p * E, v->y + p * E, E * sizeof(float)))
            return false;
    return true;
}

/* One normal request on host layer index j: answered, and right. */
static inline bool round_trip(fake_gpu *g, int j, int n) {
    const int L = g->v.host_layers[j];
    uint32_t s = post(g, L, n, (uint32_t)L, (uint32_t)n, 0);
    return wait_answer(g, L, s, 30.0) == 1 && answer_ok(g, L, n);
}

/* preset+mix forged under HOTMOE_TMP with the test's own tag (TIERED_TEST_TAG: test programs
 * run in parallel, and one must not rewrite a file another has mapped) and loaded. */
static inline hm_model *load(const char *preset, forge_mix mix) {
    char path[512];
    if (!ft_forged(TIERED_TEST_TAG, preset, mix, path, sizeof(path))) return NULL;
    hm_model *m = NULL;
    hm_error err;
    if (hm_model_load(path, NULL, &m, &err) != HM_OK) {
        fprintf(stderr, "%s: %s\n", preset, err.msg);
        return NULL;
    }
    return m;
}

/* A fake GPU over m's layers (odd: every other layer on the host) and a CPU side (2 threads)
 * serving it; NULL when either cannot start. */
static inline hm_tiered *start(const hm_model *m, fake_gpu *g, bool odd) {
    if (!fake_init(g, m, odd)) return NULL;
    hm_tiered_params tp = hm_tiered_default_params();
    tp.n_threads = 2;
    hm_tiered *t = NULL;
    hm_error err;
    if (hm_tiered_init_view(m, &g->v, &tp, &t, &err) != HM_OK) {
        fprintf(stderr, "tiered init: %s\n", err.msg);
        return NULL;
    }
    return t;
}

#endif
