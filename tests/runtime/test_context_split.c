/* test_context_split.c - a partial -ngl on a GPU: the split context (runtime/context.h: layers
 * [0, s) on the CPU engine, layers [s, n_layer) and the output on the GPU engine, s = n_layer +
 * 1 - ngl) against the CPU-only context, for every tiny preset x f32 / q8_0 / q4_k_m and every
 * -ngl 1..n_layer, with and without --cpu-moe (the GPU part's experts then in RAM: host layers
 * of the tiered step):
 *  - the context is split where -ngl says (hm_context_split_layer) and has a GPU engine;
 *  - a 21-token prompt (one ubatch, all logits) then the CPU's 32 greedy tokens one per call
 *    (teacher forced): logits within test_cuda_engine's tolerances of the CPU's (relative to the
 *    CPU logits' standard deviation: 2e-3 for f32 weights, 0.5 for quantised ones);
 *  - f32: the argmax at every step is the CPU's, so greedy decoding gives the CPU's tokens;
 *  - deterministic: a second run on the same context (reset) gives the same logits bytes;
 *  - hm_gen on a split context takes the per-token host path (hm_gen_on_gpu false) and, greedy,
 *    gives the CPU context's tokens for f32 weights.
 * Without a GPU the split plan is a report only and the CPU runs the model: the program reports
 * itself skipped (exit 77; a failure under HOTMOE_EXPECT_GPU=1). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda/cuda_test_util.h"
#include "../forge/forge_test_util.h"
#include "harness.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/generate.h"
#include "sample/sample.h"

#define N_PROMPT 21 /* > 2 x tiny-gpt-oss's window of 8 */
#define N_GEN 32
#define N_ROWS (N_PROMPT + N_GEN)
#define N_CTX 128
#define TOL_F32 2e-3 /* test_cuda_engine.c's PROMPT_TOL_F32 and DECODE_TOL_F32 */
#define TOL_QUANT 0.5

static void prompt_ids(int32_t *ids, int n, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((x >> 33) % 957);
    }
}

static int argmax(const float *v, int64_t n) {
    int b = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = (int)i;
    return b;
}

static double stdev(const float *v, int64_t n) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        ss += (double)v[i] * v[i];
    }
    const double m = s / (double)n;
    return sqrt(ss / (double)n - m * m);
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = fabs((double)a[i] - b[i]);
        d = x > d ? x : d;
    }
    return d;
}

static hm_context_params ctx_params(int ngl, bool cpu_moe) {
    hm_context_params p = hm_context_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 2;
    p.n_gpu_layers = ngl;
    p.cpu_moe = cpu_moe;
    return p;
}

/* The prompt (all logits) then seq[N_PROMPT..] one per call: lo [N_ROWS][V]. */
static bool run_forced(hm_context *c, const int32_t *seq, int64_t V, float *lo) {
    hm_error err;
    hm_context_reset(c);
    if (hm_decode(c, seq, N_PROMPT, 0, lo, HM_LOGITS_ALL, &err) != HM_OK) {
        fprintf(stderr, "prompt: %s\n", err.msg);
        return false;
    }
    for (int p = N_PROMPT; p < N_ROWS; p++)
        if (hm_decode(c, seq + p, 1, p, lo + (size_t)p * (size_t)V, HM_LOGITS_LAST, &err) !=
            HM_OK) {
            fprintf(stderr, "step %d: %s\n", p, err.msg);
            return false;
        }
    return true;
}

/* Greedy tokens from hm_gen after the prompt: out [N_GEN]; *on_gpu: the generator's path. */
static bool run_gen(hm_context *c, const int32_t *prompt, int32_t *out, bool *on_gpu) {
    sample_params sp = sample_params_default();
    sp.temperature = 0.0f;
    sp.penalty_last_n = 0;
    hm_gen_params gp = hm_gen_default_params();
    hm_gen *g = NULL;
    hm_error err;
    hm_context_reset(c);
    if (hm_gen_init(c, &sp, &gp, &g, &err) != HM_OK) {
        fprintf(stderr, "hm_gen_init: %s\n", err.msg);
        return false;
    }
    *on_gpu = hm_gen_on_gpu(g);
    bool ok = hm_gen_prompt(g, prompt, N_PROMPT, &err) == HM_OK;
    for (int i = 0; ok && i < N_GEN; i++) ok = hm_gen_next(g, &out[i], &err) == HM_OK;
    ok = ok && hm_gen_end(g, &err) == HM_OK;
    if (!ok) fprintf(stderr, "generation: %s\n", err.msg);
    hm_gen_free(g);
    return ok;
}

static void check_model(const char *preset, forge_mix mix) {
    char path[512];
    HM_REQUIRE(ft_forged("ctxsplit", preset, mix, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(m);
    const int nl = (int)hp->n_layer;
    const int64_t V = hp->n_vocab;
    const bool f32 = mix == FORGE_MIX_F32;
    const size_t sz = (size_t)N_ROWS * (size_t)V;
    float *lc = malloc(sz * sizeof(float)), *lg = malloc(sz * sizeof(float));
    float *lg2 = malloc(sz * sizeof(float));
    int32_t seq[N_ROWS], gen[N_GEN];
    HM_REQUIRE(lc && lg && lg2);
    prompt_ids(seq, N_PROMPT, 7);

    /* the reference: the CPU-only context, greedy */
    hm_context_params pc = ctx_params(0, false);
    hm_context *cpu = NULL;
    HM_REQUIRE(hm_context_init(m, &pc, &cpu, &err) == HM_OK);
    HM_REQUIRE(hm_decode(cpu, seq, N_PROMPT, 0, lc, HM_LOGITS_ALL, &err) == HM_OK);
    for (int p = N_PROMPT; p < N_ROWS; p++) {
        seq[p] = argmax(lc + (size_t)(p - 1) * (size_t)V, V);
        HM_REQUIRE(hm_decode(cpu, seq + p, 1, p, lc + (size_t)p * (size_t)V, HM_LOGITS_LAST,
                             &err) == HM_OK);
    }
    const double sd = stdev(lc, (int64_t)sz);

    for (int cm = 0; cm < 2; cm++)
        for (int ngl = 1; ngl <= nl; ngl++) {
            hm_context_params p = ctx_params(ngl, cm == 1);
            hm_context *c = NULL;
            hm_status st = hm_context_init(m, &p, &c, &err);
            HM_CHECK_MSG(st == HM_OK, "%s %s -ngl %d%s: %s", preset, forge_mix_name(mix), ngl,
                         cm ? " --cpu-moe" : "", err.msg);
            if (st != HM_OK) continue;
            HM_CHECK_MSG(hm_context_split_layer(c) == nl + 1 - ngl && hm_context_gpu(c),
                         "-ngl %d: split at %d", ngl, hm_context_split_layer(c));
            memset(lg, 0, sz * sizeof(float));
            memset(lg2, 0xff, sz * sizeof(float));
            const bool ok = run_forced(c, seq, V, lg) && run_forced(c, seq, V, lg2);
            HM_CHECK_MSG(ok, "%s %s -ngl %d%s: decode failed", preset, forge_mix_name(mix), ngl,
                         cm ? " --cpu-moe" : "");
            if (ok) {
                const size_t np = (size_t)N_PROMPT * (size_t)V;
                const double prompt_rel = max_diff(lc, lg, (int64_t)np) / sd;
                const double decode_rel = max_diff(lc + np, lg + np, (int64_t)(sz - np)) / sd;
                int agree = 0, agree_gen = 0; /* rows N_PROMPT-1.. choose the greedy tokens */
                for (int r = 0; r < N_ROWS; r++) {
                    const bool a = argmax(lc + (size_t)r * (size_t)V, V) ==
                                   argmax(lg + (size_t)r * (size_t)V, V);
                    agree += a;
                    agree_gen += a && r >= N_PROMPT - 1 && r < N_ROWS - 1;
                }
                const bool same = !memcmp(lg, lg2, sz * sizeof(float));
                printf("%-14s %-7s -ngl %d%-10s split %d  prompt_rel %9.3g  decode_rel %9.3g  "
                       "argmax %2d/%d  deterministic %s\n", preset, forge_mix_name(mix), ngl,
                       cm ? " --cpu-moe" : "", hm_context_split_layer(c), prompt_rel, decode_rel,
                       agree, N_ROWS, same ? "yes" : "NO");
                const double tol = f32 ? TOL_F32 : TOL_QUANT;
                HM_CHECK_MSG(prompt_rel <= tol && decode_rel <= tol,
                             "%s %s -ngl %d: logits off by %g / %g std", preset,
                             forge_mix_name(mix), ngl, prompt_rel, decode_rel);
                HM_CHECK_MSG(same, "%s %s -ngl %d: two runs differ", preset, forge_mix_name(mix),
                             ngl);
                if (f32)
                    HM_CHECK_MSG(agree_gen == N_GEN, "%s f32 -ngl %d%s: the greedy choice "
                                 "agrees at %d of %d steps", preset, ngl, cm ? " --cpu-moe" : "",
                                 agree_gen, N_GEN);
            }
            /* generation on a split context: the host path, the CPU's greedy tokens (f32) */
            if (cm == 0 && (ngl == 1 || ngl == nl)) {
                bool on_gpu = true;
                HM_CHECK(run_gen(c, seq, gen, &on_gpu));
                HM_CHECK_MSG(!on_gpu, "-ngl %d: the autonomous loop on a split context", ngl);
                if (f32)
                    HM_CHECK_MSG(!memcmp(gen, seq + N_PROMPT, sizeof(gen)), "%s f32 -ngl %d: "
                                 "generated tokens differ from the CPU's", preset, ngl);
            }
            hm_context_free(c);
        }
    hm_context_free(cpu);
    free(lc);
    free(lg);
    free(lg2);
    hm_model_free(m);
}

static void test_split_matches_cpu(void) {
    if (!tu_have_gpu()) return;
    static const char *presets[] = {"tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe",
                                    "tiny-gpt-oss", "tiny-qwen2moe"};
    static const forge_mix mixes[] = {FORGE_MIX_F32, FORGE_MIX_Q8_0, FORGE_MIX_Q4_K_M};
    for (size_t pi = 0; pi < sizeof(presets) / sizeof(presets[0]); pi++)
        for (size_t mi = 0; mi < sizeof(mixes) / sizeof(mixes[0]); mi++)
            check_model(presets[pi], mixes[mi]);
}

TU_TEST_MAIN(test_split_matches_cpu)
