/* test_cuda_route_counts.c - the GPU engine's routing counts (cuda_engine_route_counts_enable /
 * _read, cuda/cuda_engine.h) against the CPU path's routing observer (runtime/context.h,
 * -ngl 0: one route call per layer and forward call, with the ids).
 *
 * With a GPU:
 *  - exact, at position 0: tokens decoded one at a time, each at position 0, where a GPU step
 *    gives the CPU's bytes (no attention mixing; docs/GPU.md), so the router selects exactly
 *    the CPU's experts: hits, calls and tokens per layer equal the CPU observer's, through the
 *    host API (cuda_engine_decode) and through the captured decode step (cuda_decode graph,
 *    cuda_decode_begin(0) before each launch), on tiny qwen3moe / mixtral / olmoe / qwen2moe in
 *    f32 and q4_k_m;
 *  - a prompt + k tokens (the prompt through the host API, in ubatches of 8 — the decode
 *    kernels, fused router — and of 32 — one 21-token call, matvec + router kernel —, then k
 *    greedy steps of the graph with lookahead; the CPU teacher-forced with the GPU's tokens):
 *    calls and tokens equal the CPU's exactly; hits too on tiny-mixtral f32. Past position 0 the
 *    GPU's attention sums in another order than the CPU's (last bits), which could flip a
 *    near-tie routing choice; f32 weights keep those differences at rounding level, and
 *    mixtral's 8 experts / top-2 on 2 layers leave few decisions to flip. A mismatch prints
 *    how many (layer, expert) hits differ;
 *  - counting changes nothing: logits of a prompt and steps are byte-identical with counting
 *    on and off, the graph's tokens and kernel node count too (no extra launch);
 *  - switching: counts read while on are the steps' counts; off, the next steps (the graph
 *    recaptured) count nothing; on again, they count again; each read is one host sync;
 *    reading before any enable is HM_ERR_STATE.
 * The counting inside both router kernels (hits = the histogram of the ids, one call of n_tok
 * tokens per launch) is checked on random logits by test_cuda_fused (test_router). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cuda/cuda_decode.h"
#include "cuda/cuda_engine.h"
#include "cuda_test_util.h"
#include "harness.h"
#include "model/model.h"
#include "quant/qtypes.h"
#include "runtime/context.h"
#include "sample/sample.h"

#define N_PROMPT 21
#define N_CTX 128
#define DEPTH 4

typedef struct {
    int n_layer, n_expert;
    uint64_t *hits, *calls, *tokens;
} counts;

static void counts_init(counts *c, const hm_model *m) {
    const hm_hparams *hp = hm_model_hparams(m);
    c->n_layer = (int)hp->n_layer;
    c->n_expert = (int)hp->n_expert;
    c->hits = calloc((size_t)c->n_layer * (size_t)c->n_expert, sizeof(uint64_t));
    c->calls = calloc((size_t)c->n_layer, sizeof(uint64_t));
    c->tokens = calloc((size_t)c->n_layer, sizeof(uint64_t));
    if (!c->hits || !c->calls || !c->tokens) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
}

static void counts_zero(counts *c) {
    memset(c->hits, 0, sizeof(uint64_t) * (size_t)c->n_layer * (size_t)c->n_expert);
    memset(c->calls, 0, sizeof(uint64_t) * (size_t)c->n_layer);
    memset(c->tokens, 0, sizeof(uint64_t) * (size_t)c->n_layer);
}

static void counts_free(counts *c) {
    free(c->hits), free(c->calls), free(c->tokens);
}

/* the CPU observer: what moe_tracer_record counts */
static void cpu_route(void *user, int layer, int64_t n_tok, int n_used, const int32_t *ids,
                      const float *weights) {
    (void)weights;
    counts *c = user;
    c->calls[layer]++;
    c->tokens[layer] += (uint64_t)n_tok;
    for (int64_t i = 0; i < n_tok * n_used; i++)
        if (ids[i] >= 0 && ids[i] < c->n_expert) c->hits[(size_t)layer * c->n_expert + ids[i]]++;
}

/* (layer, expert) entries whose hits differ, and whether calls and tokens agree */
static int hits_differ(const counts *a, const counts *b) {
    int n = 0;
    for (size_t i = 0; i < (size_t)a->n_layer * (size_t)a->n_expert; i++)
        n += a->hits[i] != b->hits[i];
    return n;
}
static bool calls_equal(const counts *a, const counts *b) {
    for (int l = 0; l < a->n_layer; l++)
        if (a->calls[l] != b->calls[l] || a->tokens[l] != b->tokens[l]) return false;
    return true;
}
static bool all_zero(const counts *a) {
    for (size_t i = 0; i < (size_t)a->n_layer * (size_t)a->n_expert; i++)
        if (a->hits[i]) return false;
    for (int l = 0; l < a->n_layer; l++)
        if (a->calls[l] || a->tokens[l]) return false;
    return true;
}

static void prompt_ids(int32_t *ids, int n, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < n; i++) ids[i] = 3 + (int32_t)(tu_next(&x) % 957);
}

static hm_context *cpu_context(const hm_model *m, int n_ubatch, counts *c) {
    hm_context_params cp = hm_context_default_params();
    cp.n_ctx = N_CTX;
    cp.n_ubatch = n_ubatch;
    cp.n_threads = 2;
    cp.n_gpu_layers = 0;
    hm_context *ctx = NULL;
    hm_error err;
    if (hm_context_init(m, &cp, &ctx, &err) != HM_OK) {
        HM_CHECK_MSG(0, "CPU context: %s", err.msg);
        return NULL;
    }
    const moe_observer o = {.route = cpu_route, .user = c};
    HM_CHECK_MSG(hm_context_set_observer(ctx, &o, &err) == HM_OK, "%s", err.msg);
    return ctx;
}

static cuda_engine *gpu_engine(const hm_model *m, int n_ubatch) {
    cuda_engine_params p;
    memset(&p, 0, sizeof(p));
    p.n_ctx = N_CTX;
    p.n_ubatch = n_ubatch;
    p.type_k = p.type_v = HM_TYPE_F16;
    cuda_engine *e = NULL;
    hm_error err;
    HM_CHECK_MSG(cuda_engine_init(m, &p, &e, &err) == HM_OK, "GPU engine: %s", err.msg);
    return e;
}

static cuda_decode *greedy_loop(cuda_engine *e) {
    sample_params sp = sample_params_default();
    sp.temperature = 0.0f;
    sp.penalty_last_n = 0;
    cuda_decode *d = NULL;
    hm_error err;
    HM_CHECK_MSG(cuda_decode_init(e, &sp, DEPTH, &d, &err) == HM_OK, "decode loop: %s", err.msg);
    return d;
}

/* k graph steps. at_zero: each at position 0 (begin(0), launch, wait); else from pos0 on, up to
 * DEPTH steps in flight. Step i's token (sampled from the previous logits) goes to out[i]. */
static bool graph_steps(cuda_decode *d, bool at_zero, int pos0, int k, int32_t *out) {
    hm_error err;
    hm_status st = at_zero ? HM_OK : cuda_decode_begin(d, pos0, &err);
    const uint64_t base = cuda_decode_launched(d);
    int launched = 0, got = 0;
    while (st == HM_OK && got < k) {
        while (st == HM_OK && launched < k && launched - got < (at_zero ? 1 : DEPTH)) {
            if (at_zero) st = cuda_decode_begin(d, 0, &err);
            if (st == HM_OK) st = cuda_decode_launch(d, &err);
            launched++;
        }
        if (st == HM_OK) st = cuda_decode_wait(d, base + (uint64_t)got, &out[got], &err);
        got++;
    }
    if (st == HM_OK) st = cuda_decode_finish(d, &err);
    HM_CHECK_MSG(st == HM_OK, "graph steps: %s", err.msg);
    for (int i = 0; st == HM_OK && i < k; i++)
        if (out[i] < 0) st = HM_ERR_RANGE;
    return st == HM_OK;
}

static bool read_counts(cuda_engine *e, counts *c) {
    hm_error err;
    counts_zero(c);
    const uint64_t s0 = cuda_engine_host_syncs(e);
    hm_status st = cuda_engine_route_counts_read(e, c->hits, c->calls, c->tokens, &err);
    HM_CHECK_MSG(st == HM_OK, "read: %s", err.msg);
    HM_CHECK_MSG(cuda_engine_host_syncs(e) == s0 + 1, "a read is one host sync (%llu -> %llu)",
                 (unsigned long long)s0, (unsigned long long)cuda_engine_host_syncs(e));
    return st == HM_OK;
}

/* ---- exact at position 0: host API and graph ---- */

static void exact_at_zero(const char *preset, forge_mix mix) {
    char path[512];
    HM_REQUIRE(ft_forged("cudacount", preset, mix, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    enum { N_HOST = 12, N_GRAPH = 12 };
    counts ref, got;
    counts_init(&ref, m);
    counts_init(&got, m);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t toks[N_HOST], gt[N_GRAPH];
    prompt_ids(toks, N_HOST, 3);
    hm_context *cpu = cpu_context(m, 8, &ref);
    cuda_engine *e = gpu_engine(m, 8);
    HM_REQUIRE(logits && cpu && e);
    hm_error_clear(&err);
    HM_CHECK(cuda_engine_route_counts_read(e, got.hits, got.calls, got.tokens, &err) ==
             HM_ERR_STATE); /* never enabled */
    HM_REQUIRE(cuda_engine_route_counts_enable(e, true, &err) == HM_OK);
    /* host API: N_HOST tokens, each alone at position 0 */
    for (int i = 0; i < N_HOST; i++) {
        HM_REQUIRE(hm_decode(cpu, &toks[i], 1, 0, logits, HM_LOGITS_LAST, &err) == HM_OK);
        HM_REQUIRE(cuda_engine_decode(e, &toks[i], 1, 0, logits, HM_LOGITS_LAST, &err) == HM_OK);
    }
    HM_REQUIRE(read_counts(e, &got));
    HM_CHECK_MSG(calls_equal(&ref, &got) && got.calls[0] == N_HOST,
                 "%s %s host API: calls/tokens differ from the CPU's", preset,
                 forge_mix_name(mix));
    int dh = hits_differ(&ref, &got);
    HM_CHECK_MSG(dh == 0, "%s %s host API: %d (layer, expert) hits differ from the CPU's", preset,
                 forge_mix_name(mix), dh);
    /* the graph: each step samples from the last logits (position 0) and forwards at 0 */
    counts_zero(&ref);
    cuda_decode *d = greedy_loop(e);
    HM_REQUIRE(d);
    if (graph_steps(d, true, 0, N_GRAPH, gt)) {
        for (int i = 0; i < N_GRAPH; i++)
            HM_CHECK(hm_decode(cpu, &gt[i], 1, 0, logits, HM_LOGITS_LAST, &err) == HM_OK);
        HM_REQUIRE(read_counts(e, &got));
        HM_CHECK_MSG(calls_equal(&ref, &got) && got.calls[0] == N_GRAPH,
                     "%s %s graph: calls/tokens differ from the CPU's (%llu calls)", preset,
                     forge_mix_name(mix), (unsigned long long)got.calls[0]);
        dh = hits_differ(&ref, &got);
        HM_CHECK_MSG(dh == 0, "%s %s graph: %d (layer, expert) hits differ from the CPU's",
                     preset, forge_mix_name(mix), dh);
        printf("%-14s %-7s position 0: host API and graph counts equal the CPU's: %s\n", preset,
               forge_mix_name(mix), dh == 0 ? "yes" : "NO");
    }
    cuda_decode_free(d);
    cuda_engine_free(e);
    hm_context_free(cpu);
    counts_free(&ref);
    counts_free(&got);
    free(logits);
    hm_model_free(m);
}

/* ---- a prompt + k tokens ---- */

static void prompt_and_steps(const char *preset, forge_mix mix, int n_ubatch, bool exact_hits) {
    char path[512];
    HM_REQUIRE(ft_forged("cudacount", preset, mix, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    const int n_used = (int)hm_model_hparams(m)->n_expert_used;
    enum { K = 24 };
    counts ref, got;
    counts_init(&ref, m);
    counts_init(&got, m);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t prompt[N_PROMPT], gt[K];
    prompt_ids(prompt, N_PROMPT, 17);
    hm_context *cpu = cpu_context(m, n_ubatch, &ref);
    cuda_engine *e = gpu_engine(m, n_ubatch);
    HM_REQUIRE(logits && cpu && e);
    HM_REQUIRE(cuda_engine_route_counts_enable(e, true, &err) == HM_OK);
    cuda_decode *d = greedy_loop(e); /* captured with the counters */
    HM_REQUIRE(d);
    HM_REQUIRE(cuda_engine_decode(e, prompt, N_PROMPT, 0, logits, HM_LOGITS_LAST, &err) == HM_OK);
    if (graph_steps(d, false, N_PROMPT, K, gt)) {
        HM_CHECK(hm_decode(cpu, prompt, N_PROMPT, 0, logits, HM_LOGITS_LAST, &err) == HM_OK);
        for (int i = 0; i < K; i++)
            HM_CHECK(hm_decode(cpu, &gt[i], 1, N_PROMPT + i, logits, HM_LOGITS_LAST, &err) ==
                     HM_OK);
        HM_REQUIRE(read_counts(e, &got));
        const uint64_t calls = (uint64_t)((N_PROMPT + n_ubatch - 1) / n_ubatch + K);
        HM_CHECK_MSG(calls_equal(&ref, &got) && got.calls[0] == calls &&
                         got.tokens[0] == N_PROMPT + K,
                     "%s %s ub %d: calls %llu tokens %llu (CPU %llu, %llu; expected %llu, %d)",
                     preset, forge_mix_name(mix), n_ubatch, (unsigned long long)got.calls[0],
                     (unsigned long long)got.tokens[0], (unsigned long long)ref.calls[0],
                     (unsigned long long)ref.tokens[0], (unsigned long long)calls, N_PROMPT + K);
        for (int l = 0; l < got.n_layer; l++) {
            uint64_t sum = 0;
            for (int x = 0; x < got.n_expert; x++) sum += got.hits[(size_t)l * got.n_expert + x];
            HM_CHECK_MSG(sum == got.tokens[l] * (uint64_t)n_used, "layer %d: %llu hits for %llu "
                         "tokens x %d", l, (unsigned long long)sum,
                         (unsigned long long)got.tokens[l], n_used);
        }
        const int dh = hits_differ(&ref, &got);
        if (exact_hits)
            HM_CHECK_MSG(dh == 0, "%s %s ub %d: %d (layer, expert) hits differ from the CPU's "
                         "(a near-tie routing choice flipped past position 0?)", preset,
                         forge_mix_name(mix), n_ubatch, dh);
        printf("%-14s %-7s ub %2d prompt %d + %d steps: calls/tokens %s, hits %s\n", preset,
               forge_mix_name(mix), n_ubatch, N_PROMPT, K,
               calls_equal(&ref, &got) ? "equal" : "DIFFER", dh ? "differ" : "equal");
    }
    cuda_decode_free(d);
    cuda_engine_free(e);
    hm_context_free(cpu);
    counts_free(&ref);
    counts_free(&got);
    free(logits);
    hm_model_free(m);
}

/* ---- counting changes nothing; switching it ---- */

/* prompt (all logits) + 4 single steps through the host API, then K graph steps; logits out,
 * graph tokens out, kernel nodes of the step graph */
static bool run_once(const hm_model *m, bool count, float *logits, int32_t *gt, int k,
                     uint64_t *kernels) {
    const int64_t V = hm_model_hparams(m)->n_vocab;
    int32_t seq[N_PROMPT + 4];
    prompt_ids(seq, N_PROMPT + 4, 29);
    cuda_engine *e = gpu_engine(m, 32);
    if (!e) return false;
    hm_error err;
    hm_status st = count ? cuda_engine_route_counts_enable(e, true, &err) : HM_OK;
    if (st == HM_OK) st = cuda_engine_decode(e, seq, N_PROMPT, 0, logits, HM_LOGITS_ALL, &err);
    for (int i = 0; st == HM_OK && i < 4; i++)
        st = cuda_engine_decode(e, seq + N_PROMPT + i, 1, N_PROMPT + i,
                                logits + (size_t)(N_PROMPT + i) * (size_t)V, HM_LOGITS_LAST,
                                &err);
    HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
    cuda_decode *d = st == HM_OK ? greedy_loop(e) : NULL;
    bool ok = d && graph_steps(d, false, N_PROMPT + 4, k, gt);
    if (d) {
        cuda_decode_stats s;
        cuda_decode_get_stats(d, &s);
        *kernels = s.kernel_nodes;
    }
    cuda_decode_free(d);
    cuda_engine_free(e);
    return ok;
}

static void test_counting_changes_nothing(void) {
    if (!tu_have_gpu()) return;
    char path[512];
    HM_REQUIRE(ft_forged("cudacount", "tiny-qwen3moe", FORGE_MIX_Q4_K_M, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    enum { K = 16 };
    const size_t n = (size_t)(N_PROMPT + 4) * (size_t)V;
    float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float));
    int32_t ta[K], tb[K];
    uint64_t ka = 0, kb = 0;
    HM_REQUIRE(a && b);
    HM_REQUIRE(run_once(m, false, a, ta, K, &ka) && run_once(m, true, b, tb, K, &kb));
    HM_CHECK_MSG(!memcmp(a, b, n * sizeof(float)), "logits differ with counting on");
    HM_CHECK_MSG(!memcmp(ta, tb, sizeof(ta)), "graph tokens differ with counting on");
    HM_CHECK_MSG(ka == kb && ka > 0, "kernel nodes of the step graph: %llu off, %llu on",
                 (unsigned long long)ka, (unsigned long long)kb);
    printf("counting on: logits and graph tokens byte-identical, %llu kernel nodes either way\n",
           (unsigned long long)kb);
    free(a), free(b);
    hm_model_free(m);
}

static void test_switching(void) {
    if (!tu_have_gpu()) return;
    char path[512];
    HM_REQUIRE(ft_forged("cudacount", "tiny-mixtral", FORGE_MIX_Q8_0, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    counts got;
    counts_init(&got, m);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t prompt[N_PROMPT], gt[8];
    prompt_ids(prompt, N_PROMPT, 41);
    cuda_engine *e = gpu_engine(m, 32);
    HM_REQUIRE(logits && e);
    cuda_decode *d = greedy_loop(e); /* captured with counting off */
    HM_REQUIRE(d);
    HM_REQUIRE(cuda_engine_decode(e, prompt, N_PROMPT, 0, logits, HM_LOGITS_LAST, &err) == HM_OK);
    int pos = N_PROMPT;
    /* on after the capture: the graph is captured again and counts */
    HM_REQUIRE(cuda_engine_route_counts_enable(e, true, &err) == HM_OK);
    HM_REQUIRE(cuda_engine_route_counts_enable(e, true, &err) == HM_OK); /* no change */
    HM_REQUIRE(graph_steps(d, false, pos, 8, gt));
    pos += 8;
    HM_REQUIRE(read_counts(e, &got));
    HM_CHECK_MSG(got.calls[0] == 8 && got.tokens[0] == 8, "on: %llu calls, %llu tokens",
                 (unsigned long long)got.calls[0], (unsigned long long)got.tokens[0]);
    HM_REQUIRE(read_counts(e, &got)); /* read zeroes */
    HM_CHECK_MSG(all_zero(&got), "a second read is not zero");
    /* off: nothing counted, by the graph (captured again) or the host API */
    HM_REQUIRE(cuda_engine_route_counts_enable(e, false, &err) == HM_OK);
    HM_REQUIRE(graph_steps(d, false, pos, 8, gt));
    pos += 8;
    HM_REQUIRE(cuda_engine_decode(e, &gt[7], 1, pos, logits, HM_LOGITS_LAST, &err) == HM_OK);
    pos += 1;
    HM_REQUIRE(read_counts(e, &got)); /* still readable while off */
    HM_CHECK_MSG(all_zero(&got), "off: something was counted (%llu calls)",
                 (unsigned long long)got.calls[0]);
    /* on again */
    HM_REQUIRE(cuda_engine_route_counts_enable(e, true, &err) == HM_OK);
    HM_REQUIRE(graph_steps(d, false, pos, 5, gt));
    HM_REQUIRE(read_counts(e, &got));
    HM_CHECK_MSG(got.calls[0] == 5 && got.tokens[0] == 5 && got.calls[got.n_layer - 1] == 5,
                 "on again: %llu calls", (unsigned long long)got.calls[0]);
    printf("route counts: on/off/on with the graph captured again each time\n");
    cuda_decode_free(d);
    cuda_engine_free(e);
    counts_free(&got);
    free(logits);
    hm_model_free(m);
}

static void test_exact_at_zero(void) {
    if (!tu_have_gpu()) return;
    static const char *presets[] = {"tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe",
                                    "tiny-qwen2moe"};
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        exact_at_zero(presets[i], FORGE_MIX_F32);
        exact_at_zero(presets[i], FORGE_MIX_Q4_K_M);
    }
}

static void test_prompt_and_steps(void) {
    if (!tu_have_gpu()) return;
    prompt_and_steps("tiny-mixtral", FORGE_MIX_F32, 8, true);
    prompt_and_steps("tiny-mixtral", FORGE_MIX_F32, 32, true);
    prompt_and_steps("tiny-qwen3moe", FORGE_MIX_F32, 32, false);
}

TU_TEST_MAIN(test_exact_at_zero, test_prompt_and_steps, test_counting_changes_nothing,
             test_switching)
