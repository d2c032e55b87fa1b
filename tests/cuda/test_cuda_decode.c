/* test_cuda_decode.c - the generation API (runtime/generate.h) and its GPU-autonomous loop
 * (cuda/cuda_decode.h), on tiny forged models of every architecture (f32 mix: the GPU's decode
 * logits are then within 2e-3 of the logits' std of the CPU's, test_cuda_engine; quantised
 * mixes re-quantise activations, which amplifies attention's last-bit differences).
 *
 * Always (the CPU backend is the reference):
 *  - hm_gen on a CPU context gives exactly the tokens of the old loop (hm_decode + sample_token
 *    + sample_accept), greedy and seeded sampling with penalties, N_GEN tokens;
 *  - hm_gen_end after k tokens leaves n_past = prompt + k, and continuing gives the tokens of
 *    the uninterrupted run (sampled); a second prompt after hm_gen_end continues like one long prompt;
 *  - context full: hm_gen_room counts down, the token after the last position is HM_ERR_RANGE;
 *    n_max stops with HM_ERR_STATE; no prompt / a context moved behind the generator's back:
 *    HM_ERR_STATE.
 * With a GPU (context with n_gpu_layers = 99, gpu_strict), for every preset:
 *  - autonomous tokens == the host loop on the same engine (hm_decode + the host's
 *    sample_token on the same logits bytes: identity is exact), greedy and sampled;
 *  - greedy: autonomous tokens == the CPU context's tokens (the forged models are decisive, so
 *    attention's rounding differences do not flip an argmax). Sampled: the first position
 *    where the CPU context's tokens differ is printed (a draw may fall between the two
 *    backends' slightly different cumulative sums; the exact check is the one above);
 *  - two autonomous runs identical; hm_gen_end after k tokens (the GPU has run up to lookahead
 *    steps ahead) then continuing == uninterrupted, also with lookahead 1 and 64;
 *  - audit: 0 host synchronisations between the first and the last token (steady state),
 *    graph nodes > 0, the host loop's count is one per token;
 *  - context full on the device path (run-ahead never passes n_ctx).
 * Without a GPU: cuda_decode_init fails cleanly (message), a context asked for the GPU without
 * strict runs on the CPU and the generator says so; "no CUDA device: GPU checks not run"; with
 * HOTMOE_EXPECT_GPU=1 that is a failure. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cuda/cuda_decode.h"
#include "cuda/cuda_device.h"
#include "harness.h"
#include "cuda_test_util.h"
#include "runtime/generate.h"
#include "runtime/context.h"
#include "sample/sample.h"

#define N_PROMPT 21 /* > 2 x tiny-gpt-oss's window of 8 */
#define N_GEN 64
#define N_CTX 256

static const char *k_presets[] = {"tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe", "tiny-gpt-oss",
                                  "tiny-qwen2moe"};
#define N_PRESETS (int)(sizeof(k_presets) / sizeof(k_presets[0]))

/* forges each preset once per run (f32) to HOTMOE_TMP/cudadec-<preset>-f32.gguf */
static hm_model *load_preset(const char *preset) {
    static bool done[N_PRESETS];
    int pi = 0;
    while (pi < N_PRESETS && strcmp(k_presets[pi], preset)) pi++;
    if (pi == N_PRESETS) return NULL;
    char tag[128], path[512], name[160];
    snprintf(tag, sizeof(tag), "cudadec-%s-f32", preset);
    if (!done[pi] && ft_forge(forge_preset_find(preset), FORGE_MIX_F32, 42, tag, false, 2, path,
                              sizeof(path), NULL, 0) != HM_OK)
        return NULL;
    done[pi] = true;
    snprintf(name, sizeof(name), "%s.gguf", tag);
    ft_path(path, sizeof(path), name);
    hm_model *m = NULL;
    hm_error err;
    if (hm_model_load(path, NULL, &m, &err) != HM_OK) {
        fprintf(stderr, "%s: %s\n", preset, err.msg);
        return NULL;
    }
    return m;
}

static hm_context *mkctx(const hm_model *m, int n_ctx, bool gpu) {
    hm_context_params cp = hm_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_ubatch = 32;
    cp.n_threads = 1;
    if (gpu) {
        cp.n_gpu_layers = 99;
        cp.gpu_strict = true;
    }
    hm_context *c = NULL;
    hm_error err;
    if (hm_context_init(m, &cp, &c, &err) != HM_OK) fprintf(stderr, "context: %s\n", err.msg);
    return c;
}

static void prompt_ids(int32_t *ids, int n, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((x >> 33) % 957);
    }
}

static sample_params greedy_params(void) {
    sample_params p = sample_params_default();
    p.temperature = 0.0f;
    p.penalty_last_n = 0;
    return p;
}

/* seeded sampling through the whole chain, penalties over a short history */
static sample_params sampled_params(void) {
    sample_params p = sample_params_default();
    p.temperature = 1.3f;
    p.top_k = 60;
    p.top_p = 0.97f;
    p.min_p = 0.01f;
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.2f;
    p.penalty_last_n = 24;
    p.seed = 1234567;
    return p;
}

/* The loop the commands ran before the generation API: n tokens from an empty cache. */
static bool old_loop(hm_context *c, const int32_t *prompt, int np, const sample_params *sp, int n,
                     int32_t *out) {
    const int64_t V = hm_model_hparams(hm_context_model(c))->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V);
    sample_state *s = NULL;
    hm_error err;
    bool ok = logits && sample_init(sp, (int32_t)V, &s, &err) == HM_OK;
    hm_context_reset(c);
    ok = ok && hm_decode(c, prompt, np, 0, logits, HM_LOGITS_LAST, &err) == HM_OK;
    for (int i = 0; ok && i < np; i++) sample_accept(s, prompt[i]);
    for (int i = 0; ok && i < n; i++) {
        ok = sample_token(s, logits, &out[i], &err) == HM_OK;
        if (!ok) break;
        sample_accept(s, out[i]);
        if (i + 1 < n)
            ok = hm_decode(c, &out[i], 1, hm_context_n_past(c), logits, HM_LOGITS_LAST, &err) ==
                 HM_OK;
    }
    if (!ok) fprintf(stderr, "old loop: %s\n", err.msg);
    sample_free(s);
    free(logits);
    return ok;
}

/* n tokens through hm_gen from an empty cache; hm_gen_end after `stop` tokens (0: never before
 * the end), checking n_past there and at the end. */
static bool gen_run(hm_context *c, const sample_params *sp, const hm_gen_params *gp,
                    const int32_t *prompt, int np, int n, int stop, int32_t *out,
                    hm_gen_audit *au) {
    hm_gen *g = NULL;
    hm_error err;
    hm_context_reset(c);
    if (hm_gen_init(c, sp, gp, &g, &err) != HM_OK) {
        fprintf(stderr, "hm_gen_init: %s\n", err.msg);
        return false;
    }
    bool ok = hm_gen_prompt(g, prompt, np, &err) == HM_OK;
    for (int i = 0; ok && i < n; i++) {
        if (stop > 0 && i == stop) {
            ok = hm_gen_end(g, &err) == HM_OK;
            HM_CHECK_MSG(!ok || hm_context_n_past(c) == np + stop, "n_past %d after %d + %d",
                         hm_context_n_past(c), np, stop);
        }
        ok = ok && hm_gen_next(g, &out[i], &err) == HM_OK;
    }
    if (au && ok) hm_gen_audit_get(g, au);
    ok = ok && hm_gen_end(g, &err) == HM_OK;
    if (!ok) fprintf(stderr, "generation: %s\n", err.msg);
    HM_CHECK_MSG(!ok || hm_context_n_past(c) == np + n, "n_past %d after %d + %d",
                 hm_context_n_past(c), np, n);
    hm_gen_free(g);
    return ok;
}

static int first_diff(const int32_t *a, const int32_t *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return -1;
}

/* ---- CPU: the reference backend ---- */

static void test_cpu_equals_old_loop(void) {
    int32_t prompt[N_PROMPT], a[N_GEN], b[N_GEN], d[N_GEN];
    prompt_ids(prompt, N_PROMPT, 11);
    for (int pi = 0; pi < N_PRESETS; pi++) {
        hm_model *m = load_preset(k_presets[pi]);
        HM_REQUIRE(m);
        hm_context *c = mkctx(m, N_CTX, false);
        HM_REQUIRE(c);
        for (int k = 0; k < 2; k++) {
            sample_params sp = k ? sampled_params() : greedy_params();
            const char *what = k ? "sampled" : "greedy";
            HM_CHECK(old_loop(c, prompt, N_PROMPT, &sp, N_GEN, a));
            HM_CHECK(gen_run(c, &sp, NULL, prompt, N_PROMPT, N_GEN, 0, b, NULL));
            HM_CHECK_MSG(first_diff(a, b, N_GEN) < 0, "%s %s: hm_gen differs from the old loop "
                         "at token %d", k_presets[pi], what, first_diff(a, b, N_GEN));
            if (k == 1) { /* stop after 17 tokens, end, continue (penalties and draws too) */
                HM_CHECK(gen_run(c, &sp, NULL, prompt, N_PROMPT, N_GEN, 17, d, NULL));
                HM_CHECK_MSG(first_diff(a, d, N_GEN) < 0, "%s %s: end + continue differs at %d",
                             k_presets[pi], what, first_diff(a, d, N_GEN));
            }
            if (k == 0) { /* greedy text is not constant (the forged models have successors) */
                int distinct = 0;
                for (int i = 1; i < N_GEN; i++) distinct += a[i] != a[0];
                HM_CHECK_MSG(distinct > 0, "%s: constant output", k_presets[pi]);
            }
        }
        hm_context_free(c);
        hm_model_free(m);
    }
}

/* A prompt, generation, hm_gen_end, a second prompt and generation == the same as one prompt
 * (first prompt + taken tokens + second prompt) with the old loop. */
static void test_cpu_second_prompt(void) {
    hm_model *m = load_preset("tiny-qwen3moe");
    HM_REQUIRE(m);
    hm_context *c = mkctx(m, N_CTX, false);
    HM_REQUIRE(c);
    sample_params sp = sampled_params();
    int32_t p1[N_PROMPT], p2[7], all[N_PROMPT + 10 + 7], t1[10], t2[20], ref[20];
    prompt_ids(p1, N_PROMPT, 3);
    prompt_ids(p2, 7, 4);
    hm_gen *g = NULL;
    hm_error err;
    HM_REQUIRE(hm_gen_init(c, &sp, NULL, &g, &err) == HM_OK);
    bool ok = hm_gen_prompt(g, p1, N_PROMPT, &err) == HM_OK;
    for (int i = 0; ok && i < 10; i++) ok = hm_gen_next(g, &t1[i], &err) == HM_OK;
    ok = ok && hm_gen_end(g, &err) == HM_OK && hm_gen_prompt(g, p2, 7, &err) == HM_OK;
    for (int i = 0; ok && i < 20; i++) ok = hm_gen_next(g, &t2[i], &err) == HM_OK;
    HM_CHECK_MSG(ok, "%s", err.msg);
    hm_gen_free(g);
    /* reference: one sampler over the same history; the draw counter continues (10 draws) */
    memcpy(all, p1, sizeof(p1));
    memcpy(all + N_PROMPT, t1, sizeof(t1));
    memcpy(all + N_PROMPT + 10, p2, sizeof(p2));
    const int64_t V = hm_model_hparams(m)->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V);
    sample_state *s = NULL;
    HM_REQUIRE(logits && sample_init(&sp, (int32_t)V, &s, &err) == HM_OK);
    for (int i = 0; i < N_PROMPT; i++) sample_accept(s, p1[i]);
    for (int i = 0; i < 10; i++) { /* replay the first generation's draws */
        int32_t t;
        hm_context_reset(c);
        HM_CHECK(hm_decode(c, all, N_PROMPT + i, 0, logits, HM_LOGITS_LAST, &err) == HM_OK);
        HM_CHECK(sample_token(s, logits, &t, &err) == HM_OK);
        HM_CHECK(t == t1[i]);
        sample_accept(s, t);
    }
    for (int i = 0; i < 7; i++) sample_accept(s, p2[i]);
    hm_context_reset(c);
    HM_CHECK(hm_decode(c, all, N_PROMPT + 17, 0, logits, HM_LOGITS_LAST, &err) == HM_OK);
    for (int i = 0; i < 20; i++) {
        HM_CHECK(sample_token(s, logits, &ref[i], &err) == HM_OK);
        sample_accept(s, ref[i]);
        HM_CHECK(hm_decode(c, &ref[i], 1, hm_context_n_past(c), logits, HM_LOGITS_LAST, &err) ==
                 HM_OK);
    }
    HM_CHECK_MSG(first_diff(ref, t2, 20) < 0, "second prompt: differs at %d",
                 first_diff(ref, t2, 20));
    sample_free(s);
    free(logits);
    hm_context_free(c);
    hm_model_free(m);
}

/* room, context full, n_max, no prompt, a context moved behind the generator's back */
static void check_limits(hm_context *c, const char *what) {
    sample_params sp = greedy_params();
    int32_t prompt[10], t = 0;
    prompt_ids(prompt, 10, 5);
    hm_gen *g = NULL;
    hm_error err;
    hm_context_reset(c);
    HM_REQUIRE(hm_gen_init(c, &sp, NULL, &g, &err) == HM_OK);
    HM_CHECK_MSG(hm_gen_next(g, &t, &err) == HM_ERR_STATE, "%s: next without a prompt", what);
    HM_REQUIRE(hm_gen_prompt(g, prompt, 10, &err) == HM_OK);
    const int n_ctx = hm_context_n_ctx(c);
    HM_CHECK(hm_gen_room(g) == n_ctx - 10);
    int got = 0;
    while (hm_gen_room(g) > 0 && hm_gen_next(g, &t, &err) == HM_OK) got++;
    HM_CHECK_MSG(got == n_ctx - 10, "%s: %d tokens before full (%d)", what, got, n_ctx - 10);
    HM_CHECK(hm_gen_room(g) == 0);
    hm_status st = hm_gen_next(g, &t, &err);
    HM_CHECK_MSG(st == HM_ERR_RANGE && strstr(err.msg, "context full"), "%s: %d %s", what, st,
                 err.msg);
    HM_CHECK(hm_gen_end(g, &err) == HM_OK);
    HM_CHECK(hm_context_n_past(c) == n_ctx);
    /* n_max */
    hm_context_reset(c);
    hm_gen_set_max(g, 3);
    HM_REQUIRE(hm_gen_prompt(g, prompt, 10, &err) == HM_OK);
    for (int i = 0; i < 3; i++) HM_CHECK(hm_gen_next(g, &t, &err) == HM_OK);
    HM_CHECK_MSG(hm_gen_next(g, &t, &err) == HM_ERR_STATE, "%s: past n_max", what);
    HM_CHECK(hm_gen_end(g, &err) == HM_OK);
    HM_CHECK(hm_context_n_past(c) == 13);
    /* someone else decodes: the generator refuses to draw from stale logits */
    HM_CHECK(hm_decode(c, &t, 1, 13, NULL, HM_LOGITS_NONE, &err) == HM_OK);
    HM_CHECK_MSG(hm_gen_next(g, &t, &err) == HM_ERR_STATE && strstr(err.msg, "outside"),
                 "%s: stale logits: %s", what, err.msg);
    hm_gen_free(g);
}

static void test_cpu_limits(void) {
    hm_model *m = load_preset("tiny-olmoe");
    HM_REQUIRE(m);
    hm_context *c = mkctx(m, 40, false);
    HM_REQUIRE(c);
    check_limits(c, "cpu");
    hm_context_free(c);
    hm_model_free(m);
}

static void test_bad_params(void) {
    hm_model *m = load_preset("tiny-olmoe");
    HM_REQUIRE(m);
    hm_context *c = mkctx(m, 40, false);
    HM_REQUIRE(c);
    sample_params sp = greedy_params();
    hm_gen_params gp = hm_gen_default_params();
    hm_gen *g = NULL;
    hm_error err;
    gp.lookahead = 0;
    HM_CHECK(hm_gen_init(c, &sp, &gp, &g, &err) == HM_ERR_ARG && !g && err.msg[0]);
    gp.lookahead = 8;
    sp.penalty_last_n = -1;
    HM_CHECK(hm_gen_init(c, &sp, &gp, &g, &err) == HM_ERR_ARG && !g);
    sp = greedy_params();
    HM_REQUIRE(hm_gen_init(c, &sp, &gp, &g, &err) == HM_OK);
    int32_t t = 5;
    HM_CHECK(hm_gen_prompt(g, &t, 0, &err) == HM_ERR_ARG);
    HM_CHECK(!hm_gen_on_gpu(g));
    hm_gen_free(g);
    hm_context_free(c);
    hm_model_free(m);
}

/* ---- GPU ---- */

static void no_gpu_checks(void) {
    hm_error err;
    hm_error_clear(&err);
    cuda_decode *d = (cuda_decode *)1;
    sample_params sp = greedy_params();
    hm_status st = cuda_decode_init(NULL, &sp, 8, &d, &err);
    HM_CHECK(st != HM_OK && d == NULL && err.msg[0]);
    if (!cuda_compiled())
        HM_CHECK_MSG(st == HM_ERR_UNSUPPORTED && strstr(err.msg, "without CUDA"), "%s", err.msg);
    /* a context asked for the GPU without --gpu-strict runs on the CPU; so does its generator */
    hm_model *m = load_preset("tiny-olmoe");
    HM_REQUIRE(m);
    hm_context_params cp = hm_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 1;
    cp.n_gpu_layers = 99;
    hm_context *c = NULL;
    HM_CHECK(hm_context_init(m, &cp, &c, &err) == HM_OK);
    if (c) {
        HM_CHECK(hm_context_gpu(c) == NULL);
        hm_gen *g = NULL;
        HM_CHECK(hm_gen_init(c, &sp, NULL, &g, &err) == HM_OK);
        if (g) HM_CHECK(!hm_gen_on_gpu(g));
        hm_gen_free(g);
        hm_context_free(c);
    }
    cp.gpu_strict = true;
    c = NULL;
    HM_CHECK(hm_context_init(m, &cp, &c, &err) != HM_OK && c == NULL && err.msg[0]);
    hm_model_free(m);
    printf("no CUDA device: GPU checks not run\n");
    HM_CHECK_MSG(!tu_expect_gpu(), "HOTMOE_EXPECT_GPU=1 but no CUDA device");
}

static void gpu_preset(const char *preset) {
    hm_model *m = load_preset(preset);
    HM_REQUIRE(m);
    hm_context *cc = mkctx(m, N_CTX, false), *gc = mkctx(m, N_CTX, true);
    HM_REQUIRE(cc && gc);
    HM_REQUIRE(hm_context_gpu(gc) != NULL);
    int32_t prompt[N_PROMPT], cpu[N_GEN], host[N_GEN], a[N_GEN], b[N_GEN];
    prompt_ids(prompt, N_PROMPT, 11);
    hm_gen_params gp = hm_gen_default_params(), hp = gp;
    hp.host_loop = true;
    hp.audit_tokens = N_GEN;
    gp.audit_tokens = N_GEN;
    for (int k = 0; k < 2; k++) {
        sample_params sp = k ? sampled_params() : greedy_params();
        const char *what = k ? "sampled" : "greedy";
        hm_gen_audit au, hau;
        HM_CHECK(gen_run(cc, &sp, NULL, prompt, N_PROMPT, N_GEN, 0, cpu, NULL));
        HM_CHECK(gen_run(gc, &sp, &hp, prompt, N_PROMPT, N_GEN, 0, host, &hau));
        HM_CHECK(gen_run(gc, &sp, &gp, prompt, N_PROMPT, N_GEN, 0, a, &au));
        HM_CHECK_MSG(first_diff(a, host, N_GEN) < 0, "%s %s: graph != host loop at token %d",
                     preset, what, first_diff(a, host, N_GEN));
        if (k == 0)
            HM_CHECK_MSG(first_diff(a, cpu, N_GEN) < 0, "%s greedy: GPU != CPU at token %d",
                         preset, first_diff(a, cpu, N_GEN));
        else
            printf("%s sampled: GPU and CPU contexts agree on %d of %d tokens (first "
                   "difference at %d)\n", preset,
                   first_diff(a, cpu, N_GEN) < 0 ? N_GEN : first_diff(a, cpu, N_GEN), N_GEN,
                   first_diff(a, cpu, N_GEN));
        HM_CHECK(gen_run(gc, &sp, &gp, prompt, N_PROMPT, N_GEN, 0, b, NULL));
        HM_CHECK_MSG(first_diff(a, b, N_GEN) < 0, "%s %s: two GPU runs differ at %d", preset,
                     what, first_diff(a, b, N_GEN));
        /* audit: autonomous = no host sync between the first and the last token */
        HM_CHECK(au.gpu && !hau.gpu);
        HM_CHECK(au.n_tokens == N_GEN && au.n_timed == N_GEN);
        HM_CHECK_MSG(au.host_syncs == 0, "%s: %llu host syncs in the loop", preset,
                     (unsigned long long)au.host_syncs);
        HM_CHECK(au.graph_nodes > 0 && au.kernel_nodes > 0 && au.kernel_nodes <= au.graph_nodes);
        HM_CHECK_MSG(hau.host_syncs >= (uint64_t)(N_GEN - 1), "%s: host loop %llu syncs", preset,
                     (unsigned long long)hau.host_syncs);
        if (k == 0)
            printf("%s: graph %llu nodes (%llu kernels) per token, tg %.1f us/token cv %.3f "
                   "(host loop %.1f us/token)\n",
                   preset, (unsigned long long)au.graph_nodes,
                   (unsigned long long)au.kernel_nodes, au.tg_mean_s * 1e6, au.tg_cv,
                   hau.tg_mean_s * 1e6);
        /* stop after k tokens while the GPU runs ahead, end, continue; lookahead 1, 8, 64 */
        const int depths[] = {1, 8, 64}, stops[] = {1, 17, 40};
        for (int di = 0; di < 3; di++) {
            hm_gen_params dp = gp;
            dp.lookahead = depths[di];
            HM_CHECK(gen_run(gc, &sp, &dp, prompt, N_PROMPT, N_GEN, stops[di], b, NULL));
            HM_CHECK_MSG(first_diff(a, b, N_GEN) < 0, "%s %s: lookahead %d, end after %d + "
                         "continue differs at %d", preset, what, depths[di], stops[di],
                         first_diff(a, b, N_GEN));
        }
    }
    hm_context_free(cc);
    hm_context_free(gc);
    hm_model_free(m);
}

static void test_gpu(void) {
    if (tu_gpu_count() == 0) {
        no_gpu_checks();
        return;
    }
    for (int pi = 0; pi < N_PRESETS; pi++) gpu_preset(k_presets[pi]);
    hm_model *m = load_preset("tiny-olmoe");
    HM_REQUIRE(m);
    hm_context *c = mkctx(m, 40, true);
    HM_REQUIRE(c);
    check_limits(c, "gpu");
    hm_context_free(c);
    hm_model_free(m);
}

TU_TEST_MAIN(test_cpu_equals_old_loop, test_cpu_second_prompt, test_cpu_limits, test_bad_params,
             test_gpu)
