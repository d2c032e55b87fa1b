/* learn_test_util.h - a learn file (docs/LEARN.md) for a model, written by the tests that need a
 * hot cache (tests/runtime/test_context_tiered_decode.c, tests/cuda/test_cuda_fetch.c). */
#ifndef HM_TESTS_LEARN_TEST_UTIL_H
#define HM_TESTS_LEARN_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"

/* A learn file for m at path: in every MoE layer expert e of n is hit n - e times, over as many
 * tokens as those hits need (hits <= tokens x n_used). */
static inline bool write_learn(const hm_model *m, const char *path) {
    const hm_hparams *hp = hm_model_hparams(m);
    const int L = (int)hp->n_layer, NE = (int)hp->n_expert, K = (int)hp->n_expert_used;
    FILE *f = fopen(path, "w");
    if (!f) return false;
    uint64_t h = 0;
    for (int e = 0; e < NE; e++) h += (uint64_t)(NE - e);
    const uint64_t tokens = (h + (uint64_t)K - 1) / (uint64_t)K;
    fprintf(f, "{\"format\":\"hotmoe-expert-usage\",\"version\":1,\"n_layer\":%d,"
               "\"n_expert\":%d,\"n_expert_used\":%d,\"prompts\":1,\"total_tokens\":%llu,"
               "\"rejected\":0,\"experts\":[", L, NE, K, (unsigned long long)tokens);
    int n_moe = 0;
    for (int il = 0; il < L; il++) n_moe += hm_model_layer(m, il)->gate_exps.data != NULL;
    for (int e = 0; e < NE; e++) fprintf(f, "%s%d", e ? "," : "", (NE - e) * n_moe);
    fprintf(f, "],\"layers\":[");
    for (int il = 0; il < L; il++) {
        const bool moe = hm_model_layer(m, il)->gate_exps.data != NULL;
        fprintf(f, "%s{\"layer\":%d,\"calls\":%d,\"tokens\":%llu,\"expert_hits_total\":%llu,"
                   "\"experts\":[", il ? "," : "", il, moe ? 1 : 0,
                (unsigned long long)(moe ? tokens : 0), (unsigned long long)(moe ? h : 0));
        for (int e = 0; e < NE; e++) fprintf(f, "%s%d", e ? "," : "", moe ? NE - e : 0);
        fprintf(f, "]}");
    }
    fprintf(f, "]}\n");
    return fclose(f) == 0;
}

#endif
