/* test_cuda_faults.c - a tiered context (-ngl 99 --cpu-moe) survives its failure paths with the
 * bytes of a run without failures (runtime/tiered.h's test hooks, set on the context's CPU side):
 *  - copies of fetched experts that fail (every one from the first, hook copy_fail_from): the
 *    CPU computes those experts in the same step; the prompt's logits (all rows) and the greedy
 *    continuation equal, to the bit, those of a context whose rule keeps every expert on the
 *    CPU (a huge --moe-offload-threshold); copy_fallbacks == copies > 0;
 *  - a CPU-side fault (fail_after) and a CPU side that stops answering (stall_after, with a
 *    300 ms GPU wait timeout) during single-token decode calls: the context resets the
 *    hand-off and redoes the step once; every step's logits equal the run without failure,
 *    retries == 1 per failure;
 *  - the same inside the GPU-autonomous generation loop (runtime/generate.h), greedy and
 *    sampled (temperature 0.8, seed 42), and greedy with the fault at the first generation step
 *    (the loop restarts from the prompt's logits): the tokens equal the run without failure.
 * Presets tiny-qwen3moe q8_0 and tiny-gpt-oss q4_k_m (expert biases, OAI activation). Without a
 * GPU the program reports itself skipped (exit 77; a failure under HOTMOE_EXPECT_GPU=1).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../forge/forge_test_util.h"
#include "cuda_test_util.h"
#include "harness.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/generate.h"
#include "runtime/tiered.h"

#define N_CTX 256
#define N_PROMPT 40
#define N_STEP 12
#define N_GEN 40
#define HUGE_THRESHOLD ((int64_t)1 << 40)

static hm_context *open_ctx(const hm_model *m, int64_t threshold) {
    hm_context_params p = hm_context_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 2;
    p.n_gpu_layers = 99;
    p.cpu_moe = true;
    p.moe_offload_threshold = threshold;
    hm_context *c = NULL;
    hm_error err;
    hm_status st = hm_context_init(m, &p, &c, &err);
    HM_CHECK_MSG(st == HM_OK && hm_context_tiered(c), "init (threshold %lld): %s",
                 (long long)threshold, st == HM_OK ? "no tiered CPU side" : err.msg);
    if (st == HM_OK && !hm_context_tiered(c)) {
        hm_context_free(c);
        return NULL;
    }
    return st == HM_OK ? c : NULL;
}

static int argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int)b;
}

/* The prompt's logits [N_PROMPT][V], then N_STEP greedy single-token calls' logits [N_STEP][V]
 * into out [(N_PROMPT + N_STEP) * V]. */
static bool run_decode(hm_context *c, const int32_t *prompt, int64_t V, float *out) {
    hm_error err;
    hm_context_reset(c);
    hm_status st = hm_decode(c, prompt, N_PROMPT, 0, out, HM_LOGITS_ALL, &err);
    HM_CHECK_MSG(st == HM_OK, "prompt: %s", err.msg);
    for (int i = 0; st == HM_OK && i < N_STEP; i++) {
        const float *prev = out + (size_t)(N_PROMPT - 1 + i) * (size_t)V;
        int32_t tok = argmax(prev, V);
        st = hm_decode(c, &tok, 1, N_PROMPT + i, out + (size_t)(N_PROMPT + i) * (size_t)V,
                       HM_LOGITS_LAST, &err);
        HM_CHECK_MSG(st == HM_OK, "step %d: %s", i, err.msg);
    }
    return st == HM_OK;
}

/* N_GEN tokens of the autonomous loop after the prompt. */
static bool run_gen(hm_context *c, const int32_t *prompt, float temp, int32_t *toks) {
    hm_error err;
    hm_context_reset(c);
    sample_params sp = sample_params_default();
    sp.temperature = temp;
    sp.seed = 42;
    hm_gen *g = NULL;
    hm_status st = hm_gen_init(c, &sp, NULL, &g, &err);
    HM_CHECK_MSG(st == HM_OK, "gen init: %s", err.msg);
    if (st != HM_OK) return false;
    HM_CHECK(hm_gen_on_gpu(g));
    st = hm_gen_prompt(g, prompt, N_PROMPT, &err);
    for (int i = 0; st == HM_OK && i < N_GEN; i++) st = hm_gen_next(g, &toks[i], &err);
    if (st == HM_OK) st = hm_gen_end(g, &err);
    HM_CHECK_MSG(st == HM_OK, "generation (temperature %.1f): %s", temp, err.msg);
    hm_gen_free(g);
    return st == HM_OK;
}

static void check_model(const char *preset, forge_mix mix) {
    char path[512];
    HM_REQUIRE(ft_forged("faults", preset, mix, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    const size_t nb = sizeof(float) * (size_t)(N_PROMPT + N_STEP) * (size_t)V;
    float *ref = malloc(nb), *got = malloc(nb);
    HM_REQUIRE(ref && got);
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(3 + (i * 7919) % (V - 3));
    const char *name = forge_mix_name(mix);

    /* failed copies: the experts on the CPU, as a context that never fetches */
    hm_context *cpu = open_ctx(m, HUGE_THRESHOLD), *t = open_ctx(m, 1);
    if (cpu && t && run_decode(cpu, prompt, V, ref)) {
        hm_tiered_set_test_hooks(hm_context_tiered(t), 0, 0, 1);
        if (run_decode(t, prompt, V, got))
            HM_CHECK_MSG(!memcmp(ref, got, nb), "%s %s: failed copies: logits differ from the "
                         "CPU's", preset, name);
        hm_tiered_stats s;
        hm_tiered_get_stats(hm_context_tiered(t), &s);
        printf("%s %s: copies %llu, fallbacks %llu, GPU experts %llu\n", preset, name,
               (unsigned long long)s.copies, (unsigned long long)s.copy_fallbacks,
               (unsigned long long)s.gpu_experts);
        HM_CHECK(s.copies > 0 && s.copy_fallbacks == s.copies && s.gpu_experts == 0);
    }
    hm_context_free(cpu);
    hm_context_free(t);

    /* a fault and a stall of the CPU side: the step redone */
    setenv("HOTMOE_TIERED_TIMEOUT_MS", "300", 1);
    t = open_ctx(m, 0);
    unsetenv("HOTMOE_TIERED_TIMEOUT_MS");
    hm_tiered *tc = t ? hm_context_tiered(t) : NULL;
    if (t && run_decode(t, prompt, V, ref)) {
        hm_tiered_stats s0, s;
        hm_tiered_get_stats(tc, &s0);
        const uint64_t per_run = s0.requests; /* requests of one run_decode */
        const uint64_t at[2][2] = {{per_run - 3, 0}, {0, per_run - 5}}; /* fail, stall */
        for (int k = 0; k < 2; k++) {
            hm_tiered_set_test_hooks(tc, at[k][0], at[k][1], 0);
            if (run_decode(t, prompt, V, got))
                HM_CHECK_MSG(!memcmp(ref, got, nb), "%s %s: %s: logits differ", preset, name,
                             k ? "stall" : "fault");
            hm_tiered_get_stats(tc, &s);
            HM_CHECK_MSG(s.retries == (uint64_t)k + 1, "%s %s: %llu retries", preset, name,
                         (unsigned long long)s.retries);
        }
        /* the autonomous loop: greedy and sampled with a fault mid-generation, and greedy with
         * the fault at the first generation step (restarted from the prompt's logits) */
        hm_error e3;
        hm_context_reset(t);
        hm_tiered_get_stats(tc, &s0);
        float *lo = malloc(sizeof(float) * (size_t)V);
        HM_REQUIRE(lo);
        HM_REQUIRE(hm_decode(t, prompt, N_PROMPT, 0, lo, HM_LOGITS_LAST, &e3) == HM_OK);
        free(lo);
        hm_tiered_get_stats(tc, &s);
        const uint64_t prompt_requests = s.requests - s0.requests; /* one per host layer */
        for (int k = 0; k < 3; k++) {
            const float temp = k == 1 ? 0.8f : 0.0f;
            int32_t want[N_GEN], have[N_GEN];
            hm_tiered_set_test_hooks(tc, 0, 0, 0);
            if (!run_gen(t, prompt, temp, want)) continue;
            hm_tiered_get_stats(tc, &s0);
            const uint64_t when = k == 2 ? prompt_requests : (s0.requests - s.requests) / 2;
            hm_tiered_set_test_hooks(tc, when, 0, 0);
            if (run_gen(t, prompt, temp, have))
                HM_CHECK_MSG(!memcmp(want, have, sizeof(want)), "%s %s: generation "
                             "(temperature %.1f%s) after a fault differs", preset, name, temp,
                             k == 2 ? ", first step" : "");
            hm_tiered_stats s2;
            hm_tiered_get_stats(tc, &s2);
            HM_CHECK_MSG(s2.retries == s0.retries + 1, "%s %s: generation: %llu retries", preset,
                         name, (unsigned long long)(s2.retries - s0.retries));
            hm_tiered_get_stats(tc, &s);
        }
    }
    hm_context_free(t);
    free(ref);
    free(got);
    hm_model_free(m);
}

static void test_faults(void) {
    if (!tu_have_gpu()) return;
    alarm(900); /* a hang is a failure */
    setenv("HOTMOE_CALIBRATE", "0", 1);
    check_model("tiny-qwen3moe", FORGE_MIX_Q8_0);
    check_model("tiny-gpt-oss", FORGE_MIX_Q4_K_M);
    alarm(0);
}

TU_TEST_MAIN(test_faults)
