/* test_cpu_engine_seqs.c - several sequences in one ubatch (cpu_engine_forward_seqs, continuous
 * batching): for every tiny preset in q8_0, three sequences whose prompts and decode steps are
 * interleaved in mixed ubatches (a prompt chunk of one beside single tokens of the others, in
 * varying order) give, token for token, the logits one engine of one sequence gives for each
 * sequence alone, byte for byte; a sequence reset and reused too. Also the argument errors: a
 * sequence out of range, positions out of order, logits without a buffer. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cpu_engine/cpu_engine.h"
#include "harness.h"
#include "model/model.h"

#define N_SEQ 3
#define N_TOK 12 /* tokens per sequence: a prompt, then one per step */
#define N_CTX 32

static const char *k_presets[] = {"tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe", "tiny-gpt-oss",
                                  "tiny-qwen2moe"};

static void ids_of(int32_t *ids, int n, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((x >> 33) % 957);
    }
}

/* Sequence s alone, one engine of one sequence: logits of every token [N_TOK][V] (its prompt of
 * plen[s] tokens in one call, then one token per call). */
static bool alone(const hm_model *m, const int32_t *ids, int plen, float *lo) {
    const int64_t V = hm_model_hparams(m)->n_vocab;
    cpu_engine_params p = {.n_ctx = N_CTX, .n_ubatch = 8, .n_threads = 2, .type_k = HM_TYPE_F16,
                           .type_v = HM_TYPE_F16};
    cpu_engine *e = NULL;
    hm_error err;
    if (cpu_engine_init(m, &p, &e, &err) != HM_OK) return false;
    bool ok = cpu_engine_decode(e, ids, plen, 0, lo, HM_LOGITS_ALL, &err) == HM_OK;
    for (int t = plen; ok && t < N_TOK; t++)
        ok = cpu_engine_decode(e, ids + t, 1, t, lo + (size_t)t * (size_t)V, HM_LOGITS_LAST,
                               &err) == HM_OK;
    cpu_engine_free(e);
    return ok;
}

static void check_preset(const char *preset) {
    char path[512];
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(ft_forged("seqs", preset, FORGE_MIX_Q8_0, path, sizeof(path)));
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    int32_t ids[N_SEQ][N_TOK];
    const int plen[N_SEQ] = {5, 3, 7};
    float *ref = malloc(sizeof(float) * (size_t)N_SEQ * N_TOK * (size_t)V);
    float *got = malloc(sizeof(float) * (size_t)16 * (size_t)V);
    HM_REQUIRE(ref && got);
    for (int s = 0; s < N_SEQ; s++) {
        ids_of(ids[s], N_TOK, 77 + (uint64_t)s);
        HM_REQUIRE(alone(m, ids[s], plen[s], ref + (size_t)s * N_TOK * (size_t)V));
    }
    cpu_engine_params p = {.n_ctx = N_CTX, .n_ubatch = 16, .n_threads = 2, .type_k = HM_TYPE_F16,
                           .type_v = HM_TYPE_F16, .n_seq = N_SEQ}; /* 7 + 1 + 1 tokens at most */
    cpu_engine *e = NULL;
    HM_REQUIRE(cpu_engine_init(m, &p, &e, &err) == HM_OK);
    for (int round = 0; round < 2; round++) {
        /* the sequences start at steps 0, 1 and 3; each step takes each started sequence's whole
         * prompt or its next token, rotating which sequence comes first */
        int next[N_SEQ] = {0, 0, 0};
        const int start[N_SEQ] = {0, 1, 3};
        int mismatches = 0, rows = 0;
        for (int step = 0; step < 16; step++) {
            int32_t tok[16], sq[16], pos[16];
            uint8_t want[16];
            int src_s[16], src_t[16], n = 0, nw = 0;
            for (int k = 0; k < N_SEQ; k++) {
                const int s = (k + step) % N_SEQ;
                if (step < start[s] || next[s] >= N_TOK) continue;
                const int cnt = next[s] == 0 ? plen[s] : 1;
                for (int i = 0; i < cnt; i++, n++) {
                    tok[n] = ids[s][next[s] + i], sq[n] = s, pos[n] = next[s] + i;
                    want[n] = (uint8_t)(i == cnt - 1 || (s == 1 && step % 2 == 0));
                    if (want[n]) src_s[nw] = s, src_t[nw++] = next[s] + i;
                }
                next[s] += cnt;
            }
            if (n == 0) continue;
            HM_REQUIRE(cpu_engine_forward_seqs(e, tok, n, sq, pos, want, got, &err) == HM_OK);
            for (int w = 0; w < nw; w++, rows++)
                mismatches += memcmp(got + (size_t)w * (size_t)V,
                                     ref + ((size_t)src_s[w] * N_TOK + (size_t)src_t[w]) * (size_t)V,
                                     sizeof(float) * (size_t)V) != 0;
        }
        /* every sequence's prompt's last token and every token after it */
        const int n_rows = N_SEQ * (N_TOK + 1) - plen[0] - plen[1] - plen[2];
        HM_CHECK_MSG(mismatches == 0 && rows >= n_rows, "%s round %d: %d of %d rows "
                     "differ from the sequence alone", preset, round, mismatches, rows);
        for (int s = 0; s < N_SEQ; s++) cpu_engine_seq_reset(e, s); /* reused: the same bytes */
    }
    /* argument errors */
    int32_t tok[2] = {ids[0][0], ids[0][1]}, sq[2] = {0, 0}, pos[2] = {0, 2};
    uint8_t want[2] = {1, 1};
    HM_CHECK(cpu_engine_forward_seqs(e, tok, 2, sq, pos, want, got, &err) == HM_ERR_ARG);
    sq[1] = N_SEQ, pos[1] = 1;
    HM_CHECK(cpu_engine_forward_seqs(e, tok, 2, sq, pos, want, got, &err) == HM_ERR_ARG);
    sq[1] = 0;
    HM_CHECK(cpu_engine_forward_seqs(e, tok, 2, sq, pos, want, NULL, &err) == HM_ERR_ARG);
    cpu_engine_free(e);
    free(ref);
    free(got);
    hm_model_free(m);
}

static void test_presets(void) {
    for (size_t i = 0; i < sizeof(k_presets) / sizeof(k_presets[0]); i++)
        check_preset(k_presets[i]);
}

HM_TEST_MAIN(test_presets)
