/* hybrid_tests.h - the tests that qwen3next and qwen35moe share on the CPU engine, each test
 * file defining HYBRID_PRESET (the tiny preset's name) and HYBRID_TAG (a file-name prefix)
 * before including this (static functions, one test program each):
 *   - a prompt gives the same bytes as its tokens one by one, as ubatches of 5, with 1 or 2
 *     threads and again after a reset; the recurrence takes effect;
 *   - the logits match the double-precision reference (qwen3next_ref.h) within 1e-4 x their
 *     standard deviation, the same argmax at every position;
 *   - two sequences interleaved in one engine give each sequence's bytes alone; a rewind of a
 *     recurrent state is refused, a reset sequence starts again;
 *   - a rewind returns to the checkpoint a prompt left, and the tokens after it give their
 *     bytes again;
 * and the helpers: load_tiny, load_broken (the preset written with one tensor dropped or one
 * row more, then loaded), engine, run. */
#ifndef HM_TESTS_HYBRID_TESTS_H
#define HM_TESTS_HYBRID_TESTS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cpu_engine/cpu_engine.h"
#include "engine_test_util.h"
#include "harness.h"
#include "model/model.h"
#include "qwen3next_ref.h"
#include "quant/qtypes.h"
#include "runtime/context.h"

#define N_PROMPT 24
#define N_CTX 64

static const forge_preset *preset(void) { return forge_preset_find(HYBRID_PRESET); }

/* the tiny preset in f32 (NULL on failure) */
static hm_model *load_tiny(char *path, size_t cap) {
    hm_model *m = NULL;
    hm_error err;
    if (ft_forge(preset(), FORGE_MIX_F32, 42, HYBRID_TAG "-f32", false, 2, path, cap, NULL, 0) != HM_OK ||
        hm_model_load(path, NULL, &m, &err) != HM_OK)
        return NULL;
    return m;
}

/* the tiny preset written with tensor `name` dropped (reshape 0) or with one more row */
static hm_status load_broken(const char *name, bool reshape, hm_error *err) {
    const forge_preset *p = preset();
    forge_tensor_list l = {0};
    forge_vocab v = {0};
    hm_status st = forge_tensors_build(p, FORGE_MIX_F32, &l, err);
    if (st == HM_OK) st = forge_vocab_build(p, &v, err);
    for (int i = 0; st == HM_OK && i < l.n; i++) {
        if (strcmp(l.t[i].name, name)) continue;
        if (reshape) l.t[i].ne[1]++;
        else l.t[i] = l.t[--l.n];
        break;
    }
    return ft_write_load(p, &v, &l, HYBRID_TAG "-broken.gguf", 1, st, err);
}

static void test_prompt_identity(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    const size_t sz = sizeof(float) * N_PROMPT * (size_t)V;
    int32_t ids[N_PROMPT];
    ce_t_ids(ids, N_PROMPT, 5);
    float *a = malloc(sz), *b = malloc(sz);
    HM_REQUIRE(a && b);
    const int chunks[][2] = {{1, 2}, {5, 2}, {N_PROMPT, 1}, {1, 1}}; /* ubatch, threads */
    const int bad = ce_t_prompt_identity(m, N_CTX, ids, N_PROMPT, V, chunks, 4, a, b);
    HM_CHECK_MSG(bad == 0, "%d runs (a reset, call sizes, threads) give other bytes than the "
                 "prompt", bad);
    /* the recurrence took effect: the last token's logits depend on the earlier ones */
    int32_t ids2[N_PROMPT];
    memcpy(ids2, ids, sizeof(ids));
    ids2[0] = ids[0] == 100 ? 101 : 100;
    cpu_engine *e = ce_t_engine(m, N_CTX, N_PROMPT, 2, 1);
    HM_REQUIRE(e && ce_t_run(e, ids2, N_PROMPT, N_PROMPT, b, V));
    HM_CHECK(memcmp(a + (N_PROMPT - 1) * V, b + (N_PROMPT - 1) * V, sizeof(float) * (size_t)V));
    cpu_engine_free(e);
    free(a);
    free(b);
    hm_model_free(m);
}

static void test_reference(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    int32_t ids[N_PROMPT];
    ce_t_ids(ids, N_PROMPT, 9);
    float *lo = malloc(sizeof(float) * N_PROMPT * (size_t)V);
    double *ref = malloc(sizeof(double) * N_PROMPT * (size_t)V);
    HM_REQUIRE(lo && ref);
    cpu_engine *e = ce_t_engine(m, N_CTX, 8, 2, 1);
    HM_REQUIRE(e && ce_t_run(e, ids, N_PROMPT, 8, lo, V));
    cpu_engine_free(e);
    qref r;
    HM_REQUIRE(qref_init(&r, hm_model_gguf(m), N_CTX));
    for (int t = 0; t < N_PROMPT; t++) qref_step(&r, ids[t], ref + (size_t)t * (size_t)V);
    qref_free(&r);
    const ce_t_cmp c = ce_t_compare(lo, ref, N_PROMPT, V);
    printf(HYBRID_PRESET " vs double reference: max|diff| %.3g, std %.3g, ratio %.3g, argmax "
           "diffs %d\n", c.max_diff, c.sd, c.max_diff / c.sd, c.argmax_diff);
    HM_CHECK(c.sd > 0.1);
    HM_CHECK_MSG(c.max_diff <= 1e-4 * c.sd, "max|diff| %.3g > 1e-4 x std %.3g", c.max_diff, c.sd);
    HM_CHECK(c.argmax_diff == 0);
    free(lo);
    free(ref);
    hm_model_free(m);
}

static void test_sequences(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    enum { NT = 10 };
    int32_t ids[2][NT];
    float *alone = malloc(sizeof(float) * 2 * NT * (size_t)V), *got = malloc(sizeof(float) * 2 * (size_t)V);
    HM_REQUIRE(alone && got);
    int bad = 0;
    cpu_engine *e = ce_t_two_sequences(m, N_CTX, NT, V, &ids[0][0], alone, got, &bad);
    HM_REQUIRE(e);
    hm_error err;
    HM_CHECK_MSG(bad == 0, "%d rows differ from their sequence alone", bad);
    /* a recurrent state is not rewound: cutting back is refused, keeping everything is not */
    HM_CHECK(cpu_engine_seq_truncate_check(e, 1, NT - 2, &err) == HM_ERR_STATE &&
             strstr(err.msg, "recurrent"));
    HM_CHECK(cpu_engine_seq_truncate_check(e, 1, NT, &err) == HM_OK);
    const int32_t tok0 = ids[1][0], sq1 = 1, p3 = 3;
    HM_CHECK(cpu_engine_forward_seqs(e, &tok0, 1, &sq1, &p3, NULL, NULL, &err) == HM_ERR_STATE);
    /* a reset sequence starts again: its first tokens give the bytes they gave alone */
    cpu_engine_seq_reset(e, 1);
    HM_CHECK(cpu_engine_seq_truncate_check(e, 1, 0, &err) == HM_OK);
    for (int t = 0; t < 3; t++) {
        const int32_t pos = t;
        const uint8_t want = 1;
        HM_REQUIRE(cpu_engine_forward_seqs(e, &ids[1][t], 1, &sq1, &pos, &want, got, &err) ==
                   HM_OK);
        HM_CHECK(!memcmp(got, alone + ((size_t)NT + (size_t)t) * (size_t)V,
                         sizeof(float) * (size_t)V));
    }
    cpu_engine_free(e);
    free(alone);
    free(got);
    hm_model_free(m);
}

/* A rewind returns to the checkpoint a prompt left (cpu_engine_seq_restore): a prompt of 6
 * tokens in one call, then 4 tokens one by one; back to at most 8 tokens restores the state of
 * 6, and the 4 tokens again give their bytes; before the checkpoint, or after a reset, there is
 * none to return to. */
static void test_rewind(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    enum { NT = 10, NP = 6 };
    int32_t ids[NT];
    ce_t_ids(ids, NT, 31);
    float *lo = malloc(sizeof(float) * NT * (size_t)V), *got = malloc(sizeof(float) * (size_t)V);
    cpu_engine *e = ce_t_engine(m, N_CTX, 8, 2, 1);
    HM_REQUIRE(lo && got && e);
    hm_error err;
    HM_REQUIRE(cpu_engine_decode(e, ids, NP, 0, lo, HM_LOGITS_ALL, &err) == HM_OK);
    for (int t = NP; t < NT; t++)
        HM_REQUIRE(cpu_engine_decode(e, ids + t, 1, t, lo + (size_t)t * (size_t)V, HM_LOGITS_LAST,
                                     &err) == HM_OK);
    int at = -1;
    HM_CHECK(cpu_engine_seq_restore(e, 0, NP - 1, &at, &err) == HM_ERR_STATE && at == -1);
    HM_CHECK(cpu_engine_seq_restore(e, 0, 8, &at, &err) == HM_OK && at == NP);
    HM_CHECK(cpu_engine_seq_truncate_check(e, 0, NP, &err) == HM_OK);
    int bad = 0;
    for (int t = NP; t < NT; t++) {
        HM_REQUIRE(cpu_engine_decode(e, ids + t, 1, t, got, HM_LOGITS_LAST, &err) == HM_OK);
        bad += memcmp(got, lo + (size_t)t * (size_t)V, sizeof(float) * (size_t)V) != 0;
    }
    HM_CHECK_MSG(bad == 0, "%d rows after the rewind differ from the first pass", bad);
    cpu_engine_seq_reset(e, 0);
    HM_CHECK(cpu_engine_seq_restore(e, 0, NT, &at, &err) == HM_ERR_STATE);
    cpu_engine_free(e);
    free(lo);
    free(got);
    hm_model_free(m);
}

#endif
