/* test_cuda_tiered.c - the tiered decode step: MoE layers whose experts stay in host memory
 * (host layers) computed by the CPU side (runtime/tiered.h) through the engine's hand-off in
 * mapped pinned memory (cuda/cuda_handoff.h), while the GPU runs everything else.
 *
 * Host checks (any machine): without CUDA the engine entry points refuse and hm_tiered_init
 * says why.
 * With a GPU, for every tiny preset x f32/q8_0/q4_k_m (and mxfp4 for gpt-oss), and the newer
 * architectures (qwen3next, qwen35moe, gemma4) in q8_0, host layers =
 * every MoE layer, then the odd ones, then mixed layers (every MoE layer with its even experts
 * in device slots and its odd ones in host memory: the GPU computes the hot slots while the CPU
 * computes the cold ones, the hot cache's lanes), against the all-GPU engine on the same model
 * (n_ubatch 8: every step, prompt ubatches included, on the matvec kernels, whose bytes are the
 * CPU's):
 *  - host loop (cuda_engine_decode): a 21-token prompt (all logits, ubatches of 8, 8, 5), then
 *    N_GEN greedy single steps: the logits of every position byte-identical; the CPU side
 *    answered exactly n_host requests per ubatch, with no fault; the layer perf counted every
 *    request of every host layer with the hand-off kernels' clock (wall = hot lane + join wait);
 *  - the autonomous decode loop (cuda_decode: one captured graph per step, lookahead 4) from
 *    the same prompt: the N_GEN greedy tokens equal the all-GPU loop's and the host loop's,
 *    the device logits after the last step byte-identical, and 0 host synchronisations between
 *    the first and the last token;
 *  - f32 again with n_ubatch 32 (the prompt as one ubatch of 21 tokens through the hand-off).
 * Failures (tiny-qwen3moe q8_0 and tiny-gpt-oss q4_k_m, everything under alarm(): a hang fails):
 *  - an engine with host layers and no CPU side refuses steps (cuda_engine_decode and
 *    cuda_decode_init) with HM_ERR_STATE;
 *  - the CPU side fails a request mid-run (test hook): that cuda_engine_decode call returns
 *    HM_ERR_STATE naming the abort, hm_tiered_check names the hook, the next call is refused
 *    cleanly, and after hm_tiered_reset the whole run again equals the all-GPU engine;
 *  - the same inside the autonomous loop: a token wait reports the fault, and after a reset
 *    the loop gives the reference tokens again;
 *  - the CPU side stops answering without abort (test hook): the GPU's wait times out by
 *    itself (timeout set to 300 ms), the call reports the timeout, reset recovers;
 *  - a second CPU side cannot attach; hm_tiered_free detaches: steps are refused again.
 * The hot cache's exchanges (tiny-qwen3moe q8_0, tiny-gpt-oss q4_k_m, mixed layers): every MoE
 * layer's hot expert 0 gives its slot to cold expert 1 in the middle of a greedy run, the table
 * polled before each step: every position's logits equal the all-GPU engine's, and expert 1
 * ends in expert 0's old slot; exchanges that make no sense are refused.
 */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../forge/forge_test_util.h"
#include "base/json.h"
#include "cuda/cuda_decode.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_engine.h"
#include "cuda/cuda_engine_internal.h"
#include "cuda/cuda_handoff.h"
#include "cuda_test_util.h"
#include "harness.h"
#include "model/residency.h"
#include "quant/qtypes.h"
#include "runtime/tiered.h"
#include "sample/sample.h"

#define N_PROMPT 21
#define N_GEN 64
#define N_POS (N_PROMPT + N_GEN)
#define N_CTX 128
#define DEPTH 4

static cuda_engine_params eng_params(const hm_residency *res, int n_ubatch) {
    cuda_engine_params p;
    memset(&p, 0, sizeof(p));
    p.device = 0;
    p.n_ctx = N_CTX;
    p.n_ubatch = n_ubatch;
    p.type_k = p.type_v = HM_TYPE_F16;
    p.res = res;
    return p;
}

/* All experts on the device (slot = id), then, per MoE layer il: mode 0 every expert moved to
 * host memory, 1 the same for the odd layers only, 2 (a mixed layer, the hot cache's shape) the
 * odd experts moved to host memory and the even ones kept in slots 0, 1, ... (slot = id / 2).
 * Returns the number of layers the CPU side serves. */
static int host_map(const hm_model *m, int mode, hm_residency *r) {
    const hm_hparams *hp = hm_model_hparams(m);
    hm_error err;
    if (hm_residency_init_device(r, (int)hp->n_layer, (int)hp->n_expert, &err) != HM_OK) return 0;
    int n = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        if (!hm_model_layer(m, il)->gate_exps.data || (mode == 1 && il % 2 == 0)) continue;
        int ns = 0;
        for (int e = 0; e < hp->n_expert; e++) {
            const size_t i = hm_residency_at(r, il, e);
            const bool hot = mode == 2 && e % 2 == 0;
            r->slot[i] = hot ? ns++ : -1;
            r->home[i] = hot ? HM_HOME_HOST | HM_HOME_DEVICE : HM_HOME_HOST;
        }
        r->n_slots[il] = ns;
        n++;
    }
    return n;
}

static void prompt_ids(int32_t *ids) {
    uint64_t x = 7;
    for (int i = 0; i < N_PROMPT; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((x >> 33) % 900);
    }
}

static int32_t argmax(const float *v, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return (int32_t)b;
}

/* The host loop: prompt (all logits) then N_GEN greedy steps (last logits each).
 * logits [N_POS][V], toks [N_GEN]. Returns the first failing status. */
static hm_status host_loop(cuda_engine *e, int64_t V, float *logits, int32_t *toks,
                           hm_error *err) {
    int32_t prompt[N_PROMPT];
    prompt_ids(prompt);
    hm_status st = cuda_engine_decode(e, prompt, N_PROMPT, 0, logits, HM_LOGITS_ALL, err);
    for (int i = 0; i < N_GEN && st == HM_OK; i++) {
        toks[i] = argmax(logits + (size_t)(N_PROMPT - 1 + i) * (size_t)V, V);
        st = cuda_engine_decode(e, &toks[i], 1, N_PROMPT + i,
                                logits + (size_t)(N_PROMPT + i) * (size_t)V, HM_LOGITS_LAST, err);
    }
    return st;
}

/* The autonomous loop from the same prompt: N_GEN tokens, the device logits after the last
 * step (last [V]) and the host syncs between the first and the last token. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double g_ms_per_token; /* of the last auto_loop: first launch to last token (printed) */

static hm_status auto_loop(cuda_engine *e, int64_t V, int32_t *toks, float *last,
                           uint64_t *syncs, hm_error *err) {
    int32_t prompt[N_PROMPT];
    prompt_ids(prompt);
    float *lg = malloc(sizeof(float) * (size_t)V);
    if (!lg) return hm_error_set(err, HM_ERR_NOMEM, "logits");
    sample_params sp = sample_params_default();
    sp.temperature = 0.0f;
    sp.penalty_last_n = 0;
    cuda_decode *d = NULL;
    /* the host loop's recurrent state (hybrid layers) is cleared as a context does at position 0 */
    hm_status st = cuda_engine_seq_reset(e, 0, err);
    if (st == HM_OK) st = cuda_decode_init(e, &sp, DEPTH, &d, err);
    if (st == HM_OK) st = cuda_engine_decode(e, prompt, N_PROMPT, 0, lg, HM_LOGITS_LAST, err);
    if (st == HM_OK) st = cuda_decode_accept(d, prompt, N_PROMPT, err);
    if (st == HM_OK) st = cuda_decode_begin(d, N_PROMPT, err);
    const uint64_t step0 = d ? cuda_decode_launched(d) : 0;
    uint64_t launched = 0, s_first = 0, s_last = 0;
    const double t0 = now_s();
    for (int i = 0; i < N_GEN && st == HM_OK; i++) {
        /* the last step's forward is the one whose logits are compared: N_GEN launches */
        while (st == HM_OK && launched < (uint64_t)N_GEN && launched < (uint64_t)(i + DEPTH)) {
            st = cuda_decode_launch(d, err);
            launched++;
        }
        if (st == HM_OK) st = cuda_decode_wait(d, step0 + (uint64_t)i, &toks[i], err);
        if (i == 0) s_first = cuda_engine_host_syncs(e);
        s_last = cuda_engine_host_syncs(e);
    }
    *syncs = s_last - s_first;
    g_ms_per_token = (now_s() - t0) * 1e3 / N_GEN;
    if (d) {
        hm_error e2;
        hm_status sf = cuda_decode_finish(d, &e2);
        if (st == HM_OK && sf != HM_OK) {
            st = sf;
            *err = e2;
        }
    }
#ifdef HOTMOE_HAVE_CUDA
    if (st == HM_OK && cudaMemcpy(last, e->d_logits, sizeof(float) * (size_t)V,
                                  cudaMemcpyDeviceToHost) != cudaSuccess)
        st = hm_error_set(err, HM_ERR_CUDA, "logits copy");
#else
    (void)last;
#endif
    cuda_decode_free(d);
    free(lg);
    return st;
}

typedef struct {
    float *logits;  /* [N_POS][V] host loop */
    int32_t toks[N_GEN], atoks[N_GEN];
    float *last;    /* [V] device logits after the autonomous loop */
} run_out;

static bool out_alloc(run_out *o, int64_t V) {
    memset(o, 0, sizeof(*o));
    o->logits = malloc(sizeof(float) * (size_t)N_POS * (size_t)V);
    o->last = malloc(sizeof(float) * (size_t)V);
    return o->logits && o->last;
}

static void out_free(run_out *o) {
    free(o->logits);
    free(o->last);
}

/* The layer perf after the host loop (the stream idle): every layer the CPU served has calls
 * requests, each with the GPU's times from the hand-off kernels' clock: wall = hot lane + join
 * wait (the wall and the CPU's time > 0: the clock ticks coarsely); the other layers none. */
static void check_perf(hm_tiered *t, uint64_t calls, int n_host, const char *what) {
    hm_json j;
    hm_json_init_buf(&j, false);
    hm_error err;
    json_t *root = NULL;
    if (hm_tiered_perf_json(t, &j, NULL, NULL, &err) == HM_OK &&
        hm_json_finish(&j, &err) == HM_OK) {
        size_t len = 0;
        const char *txt = hm_json_data(&j, &len);
        root = json_loadb(txt, len, 0, NULL);
    }
    hm_json_free(&j);
    HM_CHECK_MSG(root != NULL, "%s: layer perf: %s", what, err.msg);
    if (!root) return;
    const json_t *layers = json_object_get(root, "layers");
    int served = 0;
    for (size_t i = 0; i < json_array_size(layers); i++) {
        const json_t *ly = json_array_get(layers, i);
        const json_int_t c = json_integer_value(json_object_get(ly, "calls"));
        if (c == 0) continue;
        served++;
        const double w = json_number_value(json_object_get(ly, "parallel_wall_time_us"));
        const double h = json_number_value(json_object_get(ly, "parallel_hot_lane_time_us"));
        const double q = json_number_value(json_object_get(ly, "parallel_join_wait_time_us"));
        const double cl = json_number_value(json_object_get(ly, "parallel_cold_lane_time_us"));
        HM_CHECK_MSG((uint64_t)c == calls && w > 0 && h >= 0 && q >= 0 && cl > 0 &&
                         fabs(h + q - w) <= 1e-3 * w,
                     "%s: layer %zu: calls %lld (%llu), wall %g, hot %g, wait %g, cold %g us",
                     what, i, (long long)c, (unsigned long long)calls, w, h, q, cl);
        if (i == 1) printf("%s: layer 1 per call: wall %.1f us (hot lane %.1f, join wait %.1f), "
                           "cold lane %.1f\n", what, w / (double)c, h / (double)c,
                           q / (double)c, cl / (double)c);
    }
    HM_CHECK_MSG(served == n_host, "%s: %d layers with calls (%d host layers)", what, served,
                 n_host);
    json_decref(root);
}

/* Both loops on an engine of map res (NULL: all-GPU); with a CPU side when it has host layers. */
static bool run_all(const hm_model *m, const hm_residency *res, int n_ubatch, run_out *o,
                    uint64_t *syncs, hm_tiered_stats *ts, const char *what) {
    const int64_t V = hm_model_hparams(m)->n_vocab;
    cuda_engine_params p = eng_params(res, n_ubatch);
    cuda_engine *e = NULL;
    hm_tiered *t = NULL;
    hm_error err;
    hm_error_clear(&err);
    hm_status st = cuda_engine_init(m, &p, &e, &err);
    if (st == HM_OK && cuda_engine_host_layers(e) > 0) {
        hm_tiered_params tp = hm_tiered_default_params();
        tp.n_threads = 2;
        st = hm_tiered_init(m, e, &tp, &t, &err);
        if (st == HM_OK) st = hm_tiered_perf_enable(t, &err);
    }
    if (st == HM_OK) st = host_loop(e, V, o->logits, o->toks, &err);
    if (st == HM_OK && ts) hm_tiered_get_stats(t, ts);
    if (st == HM_OK && t)
        check_perf(t, (N_PROMPT + (uint64_t)n_ubatch - 1) / (uint64_t)n_ubatch + N_GEN,
                   cuda_engine_host_layers(e), what);
    if (st == HM_OK) st = auto_loop(e, V, o->atoks, o->last, syncs, &err);
    HM_CHECK_MSG(st == HM_OK, "%s: %s", what, err.msg);
    hm_tiered_free(t);
    cuda_engine_free(e);
    return st == HM_OK;
}

static int first_diff_row(const float *a, const float *b, int rows, int64_t V) {
    for (int r = 0; r < rows; r++)
        if (memcmp(a + (size_t)r * (size_t)V, b + (size_t)r * (size_t)V, sizeof(float) * (size_t)V))
            return r;
    return -1;
}

static void check_model(const char *preset, forge_mix mix, int n_ubatch) {
    char path[512];
    HM_REQUIRE(ft_forged("cudatier", preset, mix, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    run_out ref, got;
    HM_REQUIRE(out_alloc(&ref, V) && out_alloc(&got, V));
    uint64_t syncs = 0;
    char what[160];
    snprintf(what, sizeof(what), "%s %s ub%d all-GPU", preset, forge_mix_name(mix), n_ubatch);
    HM_REQUIRE(run_all(m, NULL, n_ubatch, &ref, &syncs, NULL, what));
    const double ms_gpu = g_ms_per_token;
    HM_CHECK_MSG(!memcmp(ref.toks, ref.atoks, sizeof(ref.toks)), "%s: autonomous tokens differ "
                 "from the host loop's", what);
    static const char *const modes[3] = {"all MoE", "odd", "mixed: even experts hot"};
    for (int mode = 0; mode < 3; mode++) {
        hm_residency r;
        const int nh = host_map(m, mode, &r);
        HM_REQUIRE(nh > 0);
        snprintf(what, sizeof(what), "%s %s ub%d, %d host layers (%s)", preset,
                 forge_mix_name(mix), n_ubatch, nh, modes[mode]);
        hm_tiered_stats ts;
        memset(&ts, 0, sizeof(ts));
        if (run_all(m, &r, n_ubatch, &got, &syncs, &ts, what)) {
            const int d = first_diff_row(ref.logits, got.logits, N_POS, V);
            HM_CHECK_MSG(d < 0, "%s: logits of position %d differ from the all-GPU engine's", what,
                         d);
            HM_CHECK_MSG(!memcmp(ref.atoks, got.atoks, sizeof(ref.atoks)), "%s: autonomous "
                         "tokens differ", what);
            HM_CHECK_MSG(!memcmp(ref.last, got.last, sizeof(float) * (size_t)V), "%s: device "
                         "logits after the loop differ", what);
            HM_CHECK_MSG(!memcmp(ref.logits + (size_t)(N_POS - 1) * (size_t)V, got.last,
                                 sizeof(float) * (size_t)V), "%s: the loop's last logits differ "
                         "from the host loop's", what);
            HM_CHECK_MSG(syncs == 0, "%s: %llu host syncs between the first and the last token",
                         what, (unsigned long long)syncs);
            /* information only: the hand-off's cost per token (nh round trips) */
            printf("%s: autonomous loop %.3f ms/token (all-GPU %.3f)\n", what, g_ms_per_token,
                   ms_gpu);
            const uint64_t ub = (N_PROMPT + n_ubatch - 1) / n_ubatch;
            HM_CHECK_MSG(ts.requests == (ub + N_GEN) * (uint64_t)nh &&
                             ts.tokens == (N_PROMPT + N_GEN) * (uint64_t)nh && ts.faults == 0,
                         "%s: %llu requests, %llu tokens, %llu faults", what,
                         (unsigned long long)ts.requests, (unsigned long long)ts.tokens,
                         (unsigned long long)ts.faults);
        }
        hm_residency_free(&r);
    }
    out_free(&ref);
    out_free(&got);
    hm_model_free(m);
}

static void test_tiered_equals_gpu(void) {
    if (!tu_have_gpu()) {
        if (!cuda_compiled()) {
            hm_error err;
            cuda_handoff_view v;
            HM_CHECK(cuda_engine_handoff_view(NULL, &v, &err) == HM_ERR_UNSUPPORTED);
            HM_CHECK(cuda_engine_host_layers(NULL) == 0);
        }
        return;
    }
    alarm(1500); /* a hang is a failure, not a stuck run */
    const char *presets[] = {"tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe", "tiny-gpt-oss",
                             "tiny-qwen2moe"};
    const forge_mix mixes[] = {FORGE_MIX_F32, FORGE_MIX_Q8_0, FORGE_MIX_Q4_K_M, FORGE_MIX_MXFP4};
    for (int p = 0; p < 5; p++) {
        for (int k = 0; k < 4; k++) {
            if (mixes[k] == FORGE_MIX_MXFP4 && strcmp(presets[p], "tiny-gpt-oss")) continue;
            check_model(presets[p], mixes[k], 8);
        }
        check_model(presets[p], FORGE_MIX_F32, 32); /* a 21-token request */
    }
    /* the newer architectures: the hybrids' recurrent layers and gemma4's dense MLP beside the
     * experts, around the same hand-off and mixed layers */
    const char *newer[] = {"tiny-qwen3next", "tiny-qwen35moe", "tiny-gemma4moe"};
    for (int p = 0; p < 3; p++) check_model(newer[p], FORGE_MIX_Q8_0, 8);
    alarm(0);
}

/* ---- failures ---- */

static void check_faults(const char *preset, forge_mix mix) {
    char path[512];
    HM_REQUIRE(ft_forged("cudatier", preset, mix, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    run_out ref, got;
    HM_REQUIRE(out_alloc(&ref, V) && out_alloc(&got, V));
    uint64_t syncs = 0;
    HM_REQUIRE(run_all(m, NULL, 8, &ref, &syncs, NULL, preset));
    hm_residency r;
    const int nh = host_map(m, 0, &r);
    HM_REQUIRE(nh > 0);
    cuda_engine_params p = eng_params(&r, 8);
    cuda_engine *e = NULL;
    HM_REQUIRE(cuda_engine_init(m, &p, &e, &err) == HM_OK);
    HM_CHECK(cuda_engine_host_layers(e) == nh);
    HM_CHECK_MSG(strstr(cuda_engine_describe(e), "host memory"), "%s", cuda_engine_describe(e));

    /* no CPU side: refused */
    int32_t tok = 5;
    float *lg = malloc(sizeof(float) * (size_t)V);
    HM_REQUIRE(lg);
    HM_CHECK(cuda_engine_decode(e, &tok, 1, 0, lg, HM_LOGITS_LAST, &err) == HM_ERR_STATE &&
             strstr(err.msg, "no CPU side"));
    cuda_decode *d = NULL;
    sample_params sp = sample_params_default();
    sp.temperature = 0.0f;
    HM_CHECK(cuda_decode_init(e, &sp, DEPTH, &d, &err) == HM_ERR_STATE && !d);

    /* the CPU side fails the request after 5 steps' worth: the call reports it */
    hm_tiered_params tp = hm_tiered_default_params();
    tp.n_threads = 2;
    tp.fail_after = (uint64_t)nh * 5 + 1;
    hm_tiered *t = NULL, *t2 = NULL;
    HM_REQUIRE(hm_tiered_init(m, e, &tp, &t, &err) == HM_OK);
    HM_CHECK(hm_tiered_init(m, e, &tp, &t2, &err) == HM_ERR_STATE && !t2); /* one CPU side */
    double t0 = now_s();
    HM_CHECK(host_loop(e, V, got.logits, got.toks, &err) == HM_ERR_STATE &&
             strstr(err.msg, "aborted"));
    HM_CHECK(now_s() - t0 < 10.0);
    HM_CHECK(hm_tiered_check(t, &err) == HM_ERR_STATE && strstr(err.msg, "test hook"));
    HM_CHECK(cuda_engine_decode(e, &tok, 1, 0, lg, HM_LOGITS_LAST, &err) == HM_ERR_STATE);
    HM_CHECK(hm_tiered_reset(t, &err) == HM_OK && hm_tiered_check(t, &err) == HM_OK);
    HM_CHECK(host_loop(e, V, got.logits, got.toks, &err) == HM_OK &&
             first_diff_row(ref.logits, got.logits, N_POS, V) < 0);
    hm_tiered_free(t);

    /* the same inside the autonomous loop (the prompt's 3 ubatches, then 10 steps) */
    tp.fail_after = (uint64_t)nh * 13 + 1;
    HM_REQUIRE(hm_tiered_init(m, e, &tp, &t, &err) == HM_OK);
    t0 = now_s();
    HM_CHECK(auto_loop(e, V, got.atoks, got.last, &syncs, &err) == HM_ERR_STATE &&
             strstr(err.msg, "aborted"));
    HM_CHECK(now_s() - t0 < 10.0);
    HM_CHECK(hm_tiered_reset(t, &err) == HM_OK);
    HM_CHECK(auto_loop(e, V, got.atoks, got.last, &syncs, &err) == HM_OK &&
             !memcmp(ref.atoks, got.atoks, sizeof(ref.atoks)) && syncs == 0);
    hm_tiered_free(t);

    /* no answer at all: the GPU's own timeout ends the wait */
    tp.fail_after = 0;
    tp.stall_after = (uint64_t)nh * 4 + 1;
    HM_REQUIRE(hm_tiered_init(m, e, &tp, &t, &err) == HM_OK);
    cuda_handoff_view v;
    HM_REQUIRE(cuda_engine_handoff_view(e, &v, &err) == HM_OK);
    v.ctl->timeout_ns = 300ull * 1000000ull;
    t0 = now_s();
    HM_CHECK(host_loop(e, V, got.logits, got.toks, &err) == HM_ERR_STATE &&
             strstr(err.msg, "did not answer"));
    HM_CHECK(now_s() - t0 < 10.0);
    HM_CHECK(hm_tiered_reset(t, &err) == HM_OK);
    HM_CHECK(host_loop(e, V, got.logits, got.toks, &err) == HM_OK &&
             first_diff_row(ref.logits, got.logits, N_POS, V) < 0);
    hm_tiered_stats s;
    hm_tiered_get_stats(t, &s);
    HM_CHECK(s.faults == 0 && s.resets == 1);
    hm_tiered_free(t);

    /* detached again */
    HM_CHECK(cuda_engine_decode(e, &tok, 1, 0, lg, HM_LOGITS_LAST, &err) == HM_ERR_STATE);
    free(lg);
    cuda_engine_free(e);
    hm_residency_free(&r);
    out_free(&ref);
    out_free(&got);
    hm_model_free(m);
}

static void test_faults(void) {
    if (!tu_have_gpu()) return;
    alarm(900); /* a hang is a failure, not a stuck run */
    check_faults("tiny-qwen3moe", FORGE_MIX_Q8_0);
    check_faults("tiny-gpt-oss", FORGE_MIX_Q4_K_M);
    alarm(0);
}

/* ---- the hot cache's exchanges ---- */

/* Mixed layers (even experts hot): at step 4 every MoE layer's expert 0 gives its slot to expert
 * 1 (cold); the table is polled before every step. The logits of every position equal the
 * all-GPU engine's, and once the copies are published expert 1 holds expert 0's old slot. */
static void check_exchanges(const char *preset, forge_mix mix) {
    char path[512];
    HM_REQUIRE(ft_forged("cudatier", preset, mix, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(m);
    const int64_t V = hp->n_vocab;
    run_out ref;
    HM_REQUIRE(out_alloc(&ref, V));
    uint64_t syncs = 0;
    HM_REQUIRE(run_all(m, NULL, 8, &ref, &syncs, NULL, "exchanges: all-GPU"));
    hm_residency r;
    HM_REQUIRE(host_map(m, 2, &r) > 0);
    cuda_engine_params p = eng_params(&r, 8);
    cuda_engine *e = NULL;
    hm_tiered *t = NULL;
    HM_REQUIRE(cuda_engine_init(m, &p, &e, &err) == HM_OK);
    hm_tiered_params tp = hm_tiered_default_params();
    tp.n_threads = 2;
    HM_REQUIRE(hm_tiered_init(m, e, &tp, &t, &err) == HM_OK);
    int moe_layer = -1;
    for (int il = 0; il < hp->n_layer && moe_layer < 0; il++)
        if (hm_model_layer(m, il)->gate_exps.data) moe_layer = il;
    /* refusals: expert 1 has no slot to give, expert 2 has one already */
    HM_CHECK(cuda_engine_hot_exchange(e, moe_layer, 1, 3, &err) == HM_ERR_ARG);
    HM_CHECK(cuda_engine_hot_exchange(e, moe_layer, 0, 2, &err) == HM_ERR_ARG);
    const int slot0 = cuda_engine_slot(e, moe_layer, 0);
    float *lo = malloc(sizeof(float) * (size_t)N_POS * (size_t)V);
    HM_REQUIRE(lo);
    int32_t prompt[N_PROMPT];
    prompt_ids(prompt);
    hm_status st = cuda_engine_decode(e, prompt, N_PROMPT, 0, lo, HM_LOGITS_ALL, &err);
    int left = -1;
    for (int i = 0; i < N_GEN && st == HM_OK; i++) {
        if (i == 4)
            for (int il = 0; il < hp->n_layer && st == HM_OK; il++)
                if (hm_model_layer(m, il)->gate_exps.data)
                    st = cuda_engine_hot_exchange(e, il, 0, 1, &err);
        left = cuda_engine_hot_poll(e, &err);
        if (left < 0) st = HM_ERR_CUDA;
        const int32_t tok = argmax(lo + (size_t)(N_PROMPT - 1 + i) * (size_t)V, V);
        if (st == HM_OK)
            st = cuda_engine_decode(e, &tok, 1, N_PROMPT + i,
                                    lo + (size_t)(N_PROMPT + i) * (size_t)V, HM_LOGITS_LAST, &err);
    }
    HM_CHECK_MSG(st == HM_OK, "%s %s: exchanges: %s", preset, forge_mix_name(mix), err.msg);
    const int d = first_diff_row(ref.logits, lo, N_POS, V);
    HM_CHECK_MSG(d < 0, "%s %s: exchanges: logits of position %d differ from the all-GPU "
                 "engine's", preset, forge_mix_name(mix), d);
    HM_CHECK_MSG(left == 0 && cuda_engine_slot(e, moe_layer, 1) == slot0 &&
                     cuda_engine_slot(e, moe_layer, 0) == -1,
                 "%s %s: after the exchanges: %d pending, expert 1 slot %d (want %d), expert 0 "
                 "slot %d", preset, forge_mix_name(mix), left, cuda_engine_slot(e, moe_layer, 1),
                 slot0, cuda_engine_slot(e, moe_layer, 0));
    free(lo);
    hm_tiered_free(t);
    cuda_engine_free(e);
    hm_residency_free(&r);
    out_free(&ref);
    hm_model_free(m);
}

static void test_exchanges(void) {
    if (!tu_have_gpu()) return;
    alarm(600);
    check_exchanges("tiny-qwen3moe", FORGE_MIX_Q8_0);
    check_exchanges("tiny-gpt-oss", FORGE_MIX_Q4_K_M); /* expert biases */
    alarm(0);
}

TU_TEST_MAIN(test_tiered_equals_gpu, test_faults, test_exchanges)
