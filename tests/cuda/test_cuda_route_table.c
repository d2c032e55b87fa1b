/* test_cuda_route_table.c - routing from a table instead of the routers (cuda_engine_route_table,
 * --moe-routing-profile's engine side) on a forged tiny-qwen3moe (q8_0) and tiny-gpt-oss (q4_k_m):
 *  - with the routing counts on, a 12-token prompt decoded one token per call counts exactly the
 *    table's ids (per layer and expert), calls and tokens;
 *  - the same table gives the same logits twice (byte-identical); removing it (NULL) gives the
 *    routers' logits back, which differ from the table's;
 *  - ids outside the model's experts are refused.
 * Without a GPU the program reports itself skipped (exit 77; a failure under
 * HOTMOE_EXPECT_GPU=1). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cuda/cuda_engine.h"
#include "cuda_test_util.h"
#include "harness.h"
#include "model/model.h"
#include "quant/qtypes.h"

#define N_TOK 12
#define N_CTX 64

static bool decode_all(cuda_engine *e, int64_t V, float *lo, hm_error *err) {
    for (int i = 0; i < N_TOK; i++) {
        const int32_t tok = 5 + i * 3;
        if (cuda_engine_decode(e, &tok, 1, i, lo + (size_t)i * (size_t)V, HM_LOGITS_LAST, err) !=
            HM_OK)
            return false;
    }
    return true;
}

static void check_model(const char *preset, forge_mix mix) {
    char path[512];
    HM_REQUIRE(ft_forged("routetable", preset, mix, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(m);
    const int NL = (int)hp->n_layer, NE = (int)hp->n_expert, K = (int)hp->n_expert_used;
    const int64_t V = hp->n_vocab;
    cuda_engine_params p;
    memset(&p, 0, sizeof(p));
    p.n_ctx = N_CTX;
    p.n_ubatch = 8;
    p.type_k = p.type_v = HM_TYPE_F16;
    cuda_engine *e = NULL;
    HM_REQUIRE(cuda_engine_init(m, &p, &e, &err) == HM_OK);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)N_CTX * (size_t)NL * (size_t)K);
    uint64_t *want = calloc((size_t)NL * (size_t)NE, sizeof(uint64_t));
    uint64_t *hits = calloc((size_t)NL * (size_t)NE, sizeof(uint64_t));
    uint64_t *calls = calloc((size_t)NL, sizeof(uint64_t)), *toks = calloc((size_t)NL, 8);
    float *a = malloc(sizeof(float) * (size_t)N_TOK * (size_t)V);
    float *b = malloc(sizeof(float) * (size_t)N_TOK * (size_t)V);
    float *r = malloc(sizeof(float) * (size_t)N_TOK * (size_t)V);
    HM_REQUIRE(table && want && hits && calls && toks && a && b && r);
    for (int pos = 0; pos < N_CTX; pos++)
        for (int il = 0; il < NL; il++)
            for (int s = 0; s < K; s++) { /* distinct in a token: offsets of NE / K apart */
                const int id = (pos * 3 + s * (NE / K) + il) % NE;
                table[((size_t)pos * NL + il) * K + s] = id;
                if (pos < N_TOK && hm_model_layer(m, il)->gate_exps.data)
                    want[(size_t)il * NE + (size_t)id]++;
            }
    HM_CHECK(decode_all(e, V, r, &err)); /* the routers' logits */
    HM_REQUIRE(cuda_engine_route_table(e, table, N_CTX, &err) == HM_OK);
    HM_REQUIRE(cuda_engine_route_counts_enable(e, true, &err) == HM_OK);
    HM_CHECK_MSG(decode_all(e, V, a, &err), "%s", err.msg);
    HM_REQUIRE(cuda_engine_route_counts_read(e, hits, calls, toks, &err) == HM_OK);
    HM_CHECK_MSG(!memcmp(hits, want, sizeof(uint64_t) * (size_t)NL * (size_t)NE),
                 "%s %s: the counts are not the table's", preset, forge_mix_name(mix));
    for (int il = 0; il < NL; il++)
        if (hm_model_layer(m, il)->gate_exps.data)
            HM_CHECK(calls[il] == N_TOK && toks[il] == N_TOK);
    HM_CHECK(decode_all(e, V, b, &err));
    HM_CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)N_TOK * (size_t)V),
                 "%s %s: the same table, other logits", preset, forge_mix_name(mix));
    HM_CHECK(memcmp(a, r, sizeof(float) * (size_t)N_TOK * (size_t)V) != 0);
    HM_REQUIRE(cuda_engine_route_table(e, NULL, 0, &err) == HM_OK);
    HM_CHECK(decode_all(e, V, b, &err));
    HM_CHECK_MSG(!memcmp(r, b, sizeof(float) * (size_t)N_TOK * (size_t)V),
                 "%s %s: without the table, not the routers' logits", preset,
                 forge_mix_name(mix));
    table[7] = NE;
    HM_CHECK(cuda_engine_route_table(e, table, N_CTX, &err) == HM_ERR_ARG &&
             strstr(err.msg, "route table: id"));
    cuda_engine_free(e);
    free(table), free(want), free(hits), free(calls), free(toks), free(a), free(b), free(r);
    hm_model_free(m);
}

static void test_route_table(void) {
    if (!tu_have_gpu()) return;
    check_model("tiny-qwen3moe", FORGE_MIX_Q8_0);
    check_model("tiny-gpt-oss", FORGE_MIX_Q4_K_M);
}

TU_TEST_MAIN(test_route_table)
