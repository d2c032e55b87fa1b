/* test_context_archs_gpu.c - the newer architectures (the hybrids tiny-qwen3next and
 * tiny-qwen35moe, and tiny-gemma4moe, also with its gate and up fused; f32 weights, f32 KV
 * cache) on GPU contexts against the CPU engine; no GPU: skipped. A prompt of 7 tokens, then 8
 * greedy steps one token per call: on the GPU, all layers there and with every expert in RAM
 * (--cpu-moe), the same greedy tokens as the CPU and logits within 1e-4 of their standard
 * deviation; the tiered placement's decode steps the bytes of the full GPU's (where an expert
 * runs changes no bit); a reset context gives the same bytes again (recurrent states zeroed);
 * two sequences in one context (hm_decode_seqs: a prompt beside single tokens) give each
 * sequence's bytes alone; a hybrid's truncation is refused (a recurrent state is not rewound),
 * gemma4's allowed. The hybrids again with a prompt of 100 tokens in one ubatch (the GPU's
 * chunked delta rule): tokens and logits against the CPU. Host checks: none. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "context_test_util.h"
#include "harness.h"
#include "model/model.h"
#include "runtime/context.h"

#define N_PROMPT 7
#define N_TOK 15
#define N_CTX 64

typedef enum { ON_CPU, ON_GPU, TIERED } where;

static hm_context *open_ctx_at(const hm_model *m, where w, int n_seq, int n_ctx, int n_batch) {
    hm_context_params p = hm_context_default_params();
    p.n_ctx = n_ctx;
    p.n_threads = 2;
    p.n_gpu_layers = w == ON_CPU ? 0 : 99;
    p.cpu_moe = w == TIERED;
    p.n_seq = n_seq;
    p.n_batch = n_batch;
    p.type_k = p.type_v = HM_TYPE_F32;
    hm_context *c = NULL;
    hm_error err;
    const hm_status st = hm_context_init(m, &p, &c, &err);
    HM_CHECK_MSG(st == HM_OK, "placement %d, %d sequences: %s", (int)w, n_seq, err.msg);
    return st == HM_OK ? c : NULL;
}

static hm_context *open_ctx(const hm_model *m, where w, int n_seq) {
    return open_ctx_at(m, w, n_seq, N_CTX, 8);
}

/* The prompt in one call, then greedy steps: logits [N_TOK][V] (rows N_PROMPT-1 ..), tokens. */
static bool run(hm_context *c, const int32_t *prompt, int64_t V, float *lo, int32_t *toks) {
    return ctu_greedy(c, prompt, N_PROMPT, N_TOK, V, lo, toks);
}

static double rel_diff(const float *a, const float *b, int64_t n) {
    double s = 0, s2 = 0, d = 0;
    for (int64_t i = 0; i < n; i++) {
        s += a[i];
        s2 += (double)a[i] * a[i];
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    }
    const double var = s2 / (double)n - (s / (double)n) * (s / (double)n);
    return d / sqrt(var > 0 ? var : 1);
}

static void check_model(const char *preset, const char *path) {
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const bool hybrid = hm_model_arch(m)->hybrid;
    const int64_t V = hm_model_hparams(m)->n_vocab;
    const size_t rows = (size_t)N_TOK * (size_t)V;
    int32_t prompt[N_PROMPT], tk[3][N_TOK];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = 3 + 29 * i;
    float *lo[3];
    for (int w = 0; w < 3; w++) HM_REQUIRE((lo[w] = calloc(rows, sizeof(float))));
    for (int w = 0; w < 3; w++) {
        hm_context *c = open_ctx(m, (where)w, 1);
        HM_REQUIRE(c);
        HM_REQUIRE(run(c, prompt, V, lo[w], tk[w]));
        if (w == ON_GPU) { /* reset: the same bytes again; a truncation refused */
            float *again = calloc(rows, sizeof(float));
            int32_t t2[N_TOK];
            HM_REQUIRE(again && run(c, prompt, V, again, t2));
            HM_CHECK_MSG(!memcmp(again + (size_t)(N_PROMPT - 1) * V, lo[w] + (size_t)(N_PROMPT - 1) * V,
                                 sizeof(float) * (size_t)(N_TOK - N_PROMPT + 1) * (size_t)V),
                         "%s: a reset context gives other bytes (its states not zeroed?)", preset);
            HM_CHECK(hm_context_truncate(c, 3, &err) == (hybrid ? HM_ERR_STATE : HM_OK));
            free(again);
        }
        hm_context_free(c);
    }
    for (int w = ON_GPU; w <= TIERED; w++) {
        HM_CHECK_MSG(!memcmp(tk[w], tk[ON_CPU], sizeof(tk[0])), "%s placement %d: greedy tokens "
                     "differ from the CPU's", preset, w);
        for (int t = N_PROMPT - 1; t < N_TOK; t++) {
            const double d = rel_diff(lo[ON_CPU] + (size_t)t * V, lo[w] + (size_t)t * V, V);
            HM_CHECK_MSG(d <= 1e-4, "%s placement %d row %d: max|diff| / std %.3g", preset, w, t, d);
        }
    }
    HM_CHECK_MSG(!memcmp(lo[TIERED] + (size_t)N_PROMPT * V, lo[ON_GPU] + (size_t)N_PROMPT * V,
                         sizeof(float) * (size_t)(N_TOK - N_PROMPT) * (size_t)V),
                 "%s: the tiered decode steps differ from the full GPU's bytes", preset);

    /* two sequences: seq 1's prompt beside seq 0's single tokens, then both one by one */
    hm_context *c = open_ctx(m, ON_GPU, 2);
    HM_REQUIRE(c);
    int32_t p1[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) p1[i] = 7 + 13 * i;
    float *alone1 = calloc(rows, sizeof(float)), *got = calloc(8 * (size_t)V, sizeof(float));
    int32_t tk1[N_TOK];
    HM_REQUIRE(alone1 && got);
    {
        hm_context *c1 = open_ctx(m, ON_GPU, 1);
        HM_REQUIRE(c1 && run(c1, p1, V, alone1, tk1));
        hm_context_free(c1);
    }
    int bad = 0;
    int32_t tok[8], sq[8];
    uint8_t want[8];
    /* step 0: seq 0's prompt alone (7 tokens) */
    for (int i = 0; i < N_PROMPT; i++) tok[i] = prompt[i], sq[i] = 0, want[i] = i == N_PROMPT - 1;
    HM_REQUIRE(hm_decode_seqs(c, tok, sq, N_PROMPT, want, got, &err) == HM_OK);
    bad += memcmp(got, lo[ON_GPU] + (size_t)(N_PROMPT - 1) * V, sizeof(float) * (size_t)V) != 0;
    /* step 1: seq 0's next token and seq 1's whole prompt (8 tokens) */
    tok[0] = tk[ON_GPU][N_PROMPT], sq[0] = 0, want[0] = 1;
    for (int i = 0; i < N_PROMPT; i++) tok[1 + i] = p1[i], sq[1 + i] = 1, want[1 + i] = i == N_PROMPT - 1;
    HM_REQUIRE(hm_decode_seqs(c, tok, sq, 8, want, got, &err) == HM_OK);
    bad += memcmp(got, lo[ON_GPU] + (size_t)N_PROMPT * V, sizeof(float) * (size_t)V) != 0;
    bad += memcmp(got + V, alone1 + (size_t)(N_PROMPT - 1) * V, sizeof(float) * (size_t)V) != 0;
    /* then both one token per step */
    for (int t = 1; t < N_TOK - N_PROMPT; t++) {
        tok[0] = tk[ON_GPU][N_PROMPT + t], sq[0] = 0;
        tok[1] = tk1[N_PROMPT + t - 1], sq[1] = 1;
        want[0] = want[1] = 1;
        HM_REQUIRE(hm_decode_seqs(c, tok, sq, 2, want, got, &err) == HM_OK);
        bad += memcmp(got, lo[ON_GPU] + (size_t)(N_PROMPT + t) * V, sizeof(float) * (size_t)V) != 0;
        bad += memcmp(got + V, alone1 + (size_t)(N_PROMPT - 1 + t) * V, sizeof(float) * (size_t)V) != 0;
    }
    HM_CHECK_MSG(bad == 0, "%s: %d rows of two sequences differ from each sequence alone", preset, bad);
    /* a hybrid sequence's tokens split in the batch: refused (one run per state) */
    tok[0] = 1, sq[0] = 0, tok[1] = 2, sq[1] = 1, tok[2] = 3, sq[2] = 0;
    if (hybrid) HM_CHECK(hm_decode_seqs(c, tok, sq, 3, NULL, NULL, &err) == HM_ERR_ARG);
    hm_context_free(c);
    free(alone1), free(got);
    for (int w = 0; w < 3; w++) free(lo[w]);
    hm_model_free(m);
}

/* A hybrid's prompt of LONG_PROMPT tokens in one ubatch: on the GPU its delta rule takes the
 * chunked form (cuda_delta.h); on the GPU and tiered, the same greedy tokens as the CPU and
 * logits within 1e-4 of their standard deviation. (No byte check between the two: a prompt
 * this long takes the GEMMs, and the tiered one computes some experts on the CPU.) */
#define LONG_PROMPT 100
#define LONG_STEPS 4
static void check_long_prompt(const char *preset, const char *path) {
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    const int nt = LONG_PROMPT + LONG_STEPS;
    int32_t prompt[LONG_PROMPT], tk[3][LONG_PROMPT + LONG_STEPS];
    for (int i = 0; i < LONG_PROMPT; i++) prompt[i] = 3 + (29 * i) % (int)(V - 3);
    float *lo[3];
    for (int w = 0; w < 3; w++) HM_REQUIRE((lo[w] = calloc((size_t)nt * (size_t)V, sizeof(float))));
    for (int w = 0; w < 3; w++) {
        hm_context *c = open_ctx_at(m, (where)w, 1, 256, 128);
        HM_REQUIRE(c && ctu_greedy(c, prompt, LONG_PROMPT, nt, V, lo[w], tk[w]));
        hm_context_free(c);
    }
    for (int w = ON_GPU; w <= TIERED; w++) {
        HM_CHECK_MSG(!memcmp(tk[w], tk[ON_CPU], sizeof(tk[0])), "%s, %d-token prompt, placement "
                     "%d: greedy tokens differ from the CPU's", preset, LONG_PROMPT, w);
        for (int t = LONG_PROMPT - 1; t < nt; t++) {
            const double d = rel_diff(lo[ON_CPU] + (size_t)t * V, lo[w] + (size_t)t * V, V);
            HM_CHECK_MSG(d <= 1e-4, "%s, %d-token prompt, placement %d row %d: max|diff| / std "
                         "%.3g", preset, LONG_PROMPT, w, t, d);
        }
    }
    for (int w = 0; w < 3; w++) free(lo[w]);
    hm_model_free(m);
}

static void check_preset(const char *preset) {
    char path[512];
    HM_REQUIRE(ft_forged("archsgpu", preset, FORGE_MIX_F32, path, sizeof(path)));
    check_model(preset, path);
    if (strstr(preset, "qwen3")) check_long_prompt(preset, path);
}

static void test_hybrid(void) {
    if (!tu_have_gpu()) return;
    setenv("HOTMOE_CALIBRATE", "0", 1);
    check_preset("tiny-qwen3next");
    check_preset("tiny-qwen35moe");
}

static void test_gemma4(void) {
    if (!tu_have_gpu()) return;
    setenv("HOTMOE_CALIBRATE", "0", 1);
    check_preset("tiny-gemma4moe");
}

/* gate and up fused (forge --fuse-gate-up): uploaded and fetched per expert */
static void test_fused(void) {
    if (!tu_have_gpu()) return;
    setenv("HOTMOE_CALIBRATE", "0", 1);
    char path[512];
    HM_REQUIRE(ft_forged_fused("archsgpu", "tiny-gemma4moe", FORGE_MIX_F32, path, sizeof(path)));
    check_model("tiny-gemma4moe (fused)", path);
}

TU_TEST_MAIN(test_hybrid, test_gemma4, test_fused)
