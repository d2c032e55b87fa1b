/* test_context_tiered_decode.c - where an expert runs changes no bit of a decode step: for every
 * tiny preset (qwen3moe, mixtral, olmoe, gpt-oss, qwen2moe) and weight mix (f32, q8_0, q4_k_m;
 * mxfp4 for gpt-oss), and the newer architectures' (qwen3next, qwen35moe, gemma4) in q8_0 (no
 * partial cache: their experts are under a MiB in all), the placements that keep attention on the GPU — all on the GPU (-ngl 99),
 * --cpu-moe, --n-cpu-moe K for K = 1 .. n_layer, -ot sending the odd layers' experts to the
 * CPU, and --cpu-moe with a hot cache (--moe-hot-cache from a learn file written here, hits
 * falling with the expert id, sized for about a third and for all but one of each layer's
 * experts: mixed layers, the GPU running the hot slots and the CPU the cold ones; on the first
 * size also the lru and lfru policies and updates every 8 tokens, static and lru, so slots
 * change hands mid-generation; and a cache of every expert, which leaves no CPU side) — give,
 * through hm_context_init with those flags:
 *  - host loop: an 8-token prompt decoded one token per call, then N_GEN greedy single-token
 *    steps; the logits of every step byte-identical to the all-GPU context's;
 *  - the GPU-autonomous generation loop (runtime/generate.h) from the same prompt: N_GEN greedy
 *    tokens equal to the all-GPU context's, and to the host loop's.
 * Prompt batches are left out on purpose: they are deterministic per placement and within the
 * GPU-vs-CPU tolerance (test_cuda_fetch.c), not the same bytes. Without a GPU the program
 * reports itself skipped (exit 77; a failure under HOTMOE_EXPECT_GPU=1).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cuda/cuda_test_util.h"
#include "../forge/forge_test_util.h"
#include "harness.h"
#include "learn_test_util.h"
#include "model/model.h"
#include "moe/hot_plan.h"
#include "moe/learn_file.h"
#include "moe/offload.h"
#include "runtime/context.h"
#include "runtime/generate.h"
#include "runtime/tiered.h"

#define N_PROMPT 8
#define N_GEN 256
#define N_CTX 320

typedef struct {
    char name[80];
    bool cpu_moe;
    int n_cpu_moe;
    char ot[160];
    const char *hot;  /* --moe-hot-cache FILE or NULL */
    int64_t hot_mib;  /* --moe-hot-cache-max-mib */
    hot_policy policy;     /* --moe-hot-cache-policy */
    double update_rate;    /* --moe-hot-cache-update-rate (0: none) */
    bool whole;            /* the cache holds every expert: no CPU side */
    bool pf;               /* HOTMOE_POSTFETCH_FORCE=1: every cold expert's down on the GPU */
} placement;

static int argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int)b;
}

static hm_context *open_ctx(const hm_model *m, const placement *pl) {
    hm_context_params p = hm_context_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 2;
    p.n_gpu_layers = 99;
    p.gpu_strict = !pl; /* the reference: the whole model, or fail */
    if (pl) {
        p.cpu_moe = pl->cpu_moe;
        p.n_cpu_moe = pl->n_cpu_moe;
        p.override_tensor = pl->ot[0] ? pl->ot : NULL;
        p.moe_hot_cache = pl->hot;
        if (pl->hot) p.moe_hot_cache_max_mib = pl->hot_mib;
        p.moe_hot_cache_policy = pl->policy;
        p.moe_hot_cache_update_rate = pl->update_rate;
        p.moe_hot_cache_update_interval = 8; /* updates every 8 tokens: many in one generation */
    }
    hm_context *c = NULL;
    hm_error err;
    if (pl && pl->pf) setenv("HOTMOE_POSTFETCH_FORCE", "1", 1);
    hm_status st = hm_context_init(m, &p, &c, &err);
    unsetenv("HOTMOE_POSTFETCH_FORCE");
    HM_CHECK_MSG(st == HM_OK && hm_context_gpu(c), "%s: %s", pl ? pl->name : "all on the GPU",
                 st == HM_OK ? "no GPU engine" : err.msg);
    if (st == HM_OK && pl)
        HM_CHECK_MSG(!hm_context_tiered(c) == pl->whole, "%s: %s", pl->name,
                     pl->whole ? "a CPU side, with every expert in the cache" : "not tiered");
    return st == HM_OK ? c : NULL;
}

/* Logits [N_PROMPT + N_GEN][V] of single-token calls: the prompt's, then greedy steps. */
static bool host_loop(hm_context *c, const int32_t *prompt, int64_t V, float *lo) {
    hm_error err;
    hm_context_reset(c);
    int32_t tok = prompt[0];
    for (int i = 0; i < N_PROMPT + N_GEN; i++) {
        if (i < N_PROMPT) tok = prompt[i];
        float *row = lo + (size_t)i * (size_t)V;
        hm_status st = hm_decode(c, &tok, 1, i, row, HM_LOGITS_LAST, &err);
        HM_CHECK_MSG(st == HM_OK, "step %d: %s", i, err.msg);
        if (st != HM_OK) return false;
        tok = argmax(row, V);
    }
    return true;
}

static bool auto_loop(hm_context *c, const int32_t *prompt, int32_t *toks) {
    hm_error err;
    hm_context_reset(c);
    sample_params sp = sample_params_default();
    sp.temperature = 0.0f;
    hm_gen *g = NULL;
    hm_status st = hm_gen_init(c, &sp, NULL, &g, &err);
    if (st == HM_OK) st = hm_gen_prompt(g, prompt, N_PROMPT, &err);
    for (int i = 0; st == HM_OK && i < N_GEN; i++) st = hm_gen_next(g, &toks[i], &err);
    if (st == HM_OK) st = hm_gen_end(g, &err);
    HM_CHECK_MSG(st == HM_OK, "generation: %s", err.msg);
    hm_gen_free(g);
    return st == HM_OK;
}

static void check_model(const char *preset, forge_mix mix) {
    char path[512];
    HM_REQUIRE(ft_forged("ctxtier", preset, mix, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(m);
    const int64_t V = hp->n_vocab;
    const int L = (int)hp->n_layer;
    const size_t nb = sizeof(float) * (size_t)(N_PROMPT + N_GEN) * (size_t)V;
    float *ref = malloc(nb), *got = malloc(nb);
    HM_REQUIRE(ref && got);
    int32_t prompt[N_PROMPT], ref_tok[N_GEN], tok[N_GEN];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(3 + (i * 7919) % (V - 3));
    hm_context *c = open_ctx(m, NULL);
    bool ok = c && host_loop(c, prompt, V, ref) && auto_loop(c, prompt, ref_tok);
    hm_context_free(c);
    for (int i = 0; ok && i < N_GEN; i++)
        HM_CHECK_MSG(ref_tok[i] == argmax(ref + (size_t)(N_PROMPT - 1 + i) * (size_t)V, V),
                     "%s %s: the all-GPU loops differ at token %d", preset,
                     forge_mix_name(mix), i);
    bool down_b = false;
    for (int il = 0; il < L; il++) down_b = down_b || hm_model_layer(m, il)->down_exps_b.data;
    placement pls[72];
    memset(pls, 0, sizeof(pls));
    int n = 0;
    snprintf(pls[n].name, sizeof(pls[n].name), "--cpu-moe");
    pls[n].cpu_moe = true, n++;
    for (int k = 1; k <= L && n < 60; k++, n++) {
        snprintf(pls[n].name, sizeof(pls[n].name), "--n-cpu-moe %d", k);
        pls[n].n_cpu_moe = k;
    }
    char learn[600];
    snprintf(learn, sizeof(learn), "%s.learn.json", path);
    const bool have_learn = write_learn(m, learn);
    HM_CHECK_MSG(have_learn, "%s: cannot write %s", preset, learn);
    /* cache sizes in MiB: about a third of the experts' bytes, and all but one expert per MoE
     * layer, rounded down (an expert's bytes: offload_expert_size, which differs between the
     * layers of a mix) */
    uint64_t one_each = 0;
    for (int il = 0; il < L; il++)
        if (hm_model_layer(m, il)->gate_exps.data) one_each += offload_expert_size(m, il, 1);
    const uint64_t all = one_each * (uint64_t)hp->n_expert, MiB = 1u << 20;
    const int64_t mib[2] = {(int64_t)((all * 3 / 10 + MiB - 1) / MiB),
                            (int64_t)((all - one_each) / MiB)};
    /* the policies and the updates on the first partial size: admissions and exchanges land
     * between the steps of one generation */
    static const struct { hot_policy pol; double rate; const char *what; } kinds[] = {
        {HOT_POLICY_STATIC, 0.0, "static"}, {HOT_POLICY_LRU, 0.0, "lru"},
        {HOT_POLICY_LFRU, 0.0, "lfru"}, {HOT_POLICY_STATIC, 0.5, "static + updates"},
        {HOT_POLICY_LRU, 0.25, "lru + updates"}};
    bool first_size = true;
    for (int k = 0; have_learn && k < 2; k++) {
        if (mib[k] < 1 || (uint64_t)mib[k] * MiB < one_each || (uint64_t)mib[k] * MiB >= all)
            continue;
        for (size_t q = 0; q < (first_size ? sizeof(kinds) / sizeof(kinds[0]) : 1); q++, n++) {
            snprintf(pls[n].name, sizeof(pls[n].name), "--cpu-moe + hot cache %lld MiB, %s",
                     (long long)mib[k], kinds[q].what);
            pls[n].cpu_moe = true;
            pls[n].hot = learn;
            pls[n].hot_mib = mib[k];
            pls[n].policy = kinds[q].pol;
            pls[n].update_rate = kinds[q].rate;
        }
        first_size = false;
    }
    if (have_learn) { /* every expert fits: the GPU alone, from the cache's slots */
        snprintf(pls[n].name, sizeof(pls[n].name), "--cpu-moe + hot cache of every expert");
        pls[n].cpu_moe = true;
        pls[n].hot = learn;
        pls[n].hot_mib = (int64_t)(all / MiB) + 2;
        pls[n].whole = true;
        n++;
    }
    /* post-fetch forced: the cold experts' down products on the GPU from copies of their rows,
     * with the CPU's activations; alone and beside the hot cache's mixed layers */
    snprintf(pls[n].name, sizeof(pls[n].name), "--cpu-moe, post-fetch forced");
    pls[n].cpu_moe = true, pls[n].pf = true, n++;
    if (have_learn && mib[0] >= 1 && (uint64_t)mib[0] * MiB >= one_each &&
        (uint64_t)mib[0] * MiB < all) {
        snprintf(pls[n].name, sizeof(pls[n].name), "--cpu-moe + hot cache %lld MiB, post-fetch "
                 "forced", (long long)mib[0]);
        pls[n].cpu_moe = true, pls[n].pf = true, pls[n].hot = learn, pls[n].hot_mib = mib[0];
        n++;
    }
    snprintf(pls[n].name, sizeof(pls[n].name), "-ot odd layers' experts");
    size_t o = (size_t)snprintf(pls[n].ot, sizeof(pls[n].ot), "blk\\.(");
    for (int il = 1; il < L && o < sizeof(pls[n].ot) - 40; il += 2)
        o += (size_t)snprintf(pls[n].ot + o, sizeof(pls[n].ot) - o, "%s%d", il > 1 ? "|" : "", il);
    snprintf(pls[n].ot + o, sizeof(pls[n].ot) - o, ")\\.ffn_(gate|up|down)_exps=CPU");
    n++;
    for (int i = 0; ok && i < n; i++) {
        c = open_ctx(m, &pls[i]);
        if (!c) continue;
        if (host_loop(c, prompt, V, got)) {
            int first = -1;
            for (int r = 0; r < N_PROMPT + N_GEN && first < 0; r++)
                if (memcmp(ref + (size_t)r * (size_t)V, got + (size_t)r * (size_t)V,
                           sizeof(float) * (size_t)V))
                    first = r;
            HM_CHECK_MSG(first < 0, "%s %s %s: logits of step %d differ from the all-GPU "
                         "context's", preset, forge_mix_name(mix), pls[i].name, first);
        }
        if (auto_loop(c, prompt, tok))
            HM_CHECK_MSG(!memcmp(ref_tok, tok, sizeof(tok)), "%s %s %s: the generation's tokens "
                         "differ from the all-GPU context's", preset, forge_mix_name(mix),
                         pls[i].name);
        if (!pls[i].whole) {
            hm_tiered_stats s;
            hm_tiered_get_stats(hm_context_tiered(c), &s);
            HM_CHECK_MSG(s.faults == 0 && s.retries == 0 && s.requests > 0, "%s %s %s: %llu "
                         "requests, %llu faults", preset, forge_mix_name(mix), pls[i].name,
                         (unsigned long long)s.requests, (unsigned long long)s.faults);
            HM_CHECK_MSG(pls[i].update_rate <= 0 || s.hot_updates > 0, "%s %s %s: no update "
                         "in %d tokens", preset, forge_mix_name(mix), pls[i].name, N_GEN);
            if (pls[i].update_rate > 0) /* updates exchange only what stands out from chance */
                printf("%-14s %-7s %s: %llu updates, %llu slots exchanged\n", preset,
                       forge_mix_name(mix), pls[i].name, (unsigned long long)s.hot_updates,
                       (unsigned long long)s.hot_exchanged);
            /* forced post-fetch runs where the layers have no down biases (gpt-oss has) */
            HM_CHECK_MSG(!pls[i].pf || down_b || (s.pf_experts > 0 && s.pf_fallbacks == 0),
                         "%s %s %s: %llu down products post-fetched, %llu fallbacks", preset,
                         forge_mix_name(mix), pls[i].name, (unsigned long long)s.pf_experts,
                         (unsigned long long)s.pf_fallbacks);
            if (pls[i].pf)
                printf("%-14s %-7s %s: %llu down products post-fetched in %llu requests\n",
                       preset, forge_mix_name(mix), pls[i].name,
                       (unsigned long long)s.pf_experts, (unsigned long long)s.pf_requests);
        }
        hm_context_free(c);
    }
    printf("%-14s %-7s %d placements x (%d host-loop steps, %d generated tokens): %s\n", preset,
           forge_mix_name(mix), n, N_PROMPT + N_GEN, N_GEN, ok ? "checked" : "no reference");
    free(ref);
    free(got);
    hm_model_free(m);
}

/* Host check (any machine): the learn file the GPU checks write is one the reader and the
 * planner accept, for a model of each preset shape. */
static void test_learn_file(void) {
    static const char *presets[] = {"tiny-qwen3moe", "tiny-gpt-oss"};
    for (int i = 0; i < 2; i++) {
        char path[512], learn[600];
        HM_REQUIRE(ft_forged("ctxtier", presets[i], FORGE_MIX_Q8_0, path, sizeof(path)));
        hm_model *m = NULL;
        hm_error err;
        HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
        snprintf(learn, sizeof(learn), "%s.host.learn.json", path);
        HM_CHECK(write_learn(m, learn));
        moe_learn l;
        HM_CHECK_MSG(moe_learn_load(learn, &l, &err) == HM_OK, "%s", err.msg);
        hot_plan p;
        HM_CHECK_MSG(hot_plan_make(m, &l, NULL, NULL, 1ull << 30, &p, &err) == HM_OK, "%s",
                     err.msg);
        HM_CHECK(p.n_eligible > 0 && p.hits_hot == p.hits_total);
        hot_plan_free(&p);
        moe_learn_free(&l);
        hm_model_free(m);
    }
}

static void test_placements_same_bytes(void) {
    if (!tu_have_gpu()) return;
    alarm(1800); /* a hang is a failure */
    setenv("HOTMOE_CALIBRATE", "0", 1);
    static const char *presets[] = {"tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe",
                                    "tiny-gpt-oss", "tiny-qwen2moe"};
    static const forge_mix mixes[] = {FORGE_MIX_F32, FORGE_MIX_Q8_0, FORGE_MIX_Q4_K_M,
                                      FORGE_MIX_MXFP4};
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
        for (size_t j = 0; j < sizeof(mixes) / sizeof(mixes[0]); j++) {
            if (mixes[j] == FORGE_MIX_MXFP4 && strcmp(presets[i], "tiny-gpt-oss")) continue;
            check_model(presets[i], mixes[j]);
        }
    /* the newer architectures (the hybrids' recurrent layers, gemma4's dense MLP beside the
     * experts), one mix each; their tiny experts (under 1 MiB in all) leave the cache only its
     * whole size here (sizes are MiB), their mixed layers are test_cuda_tiered's */
    static const char *newer[] = {"tiny-qwen3next", "tiny-qwen35moe", "tiny-gemma4moe"};
    for (size_t i = 0; i < sizeof(newer) / sizeof(newer[0]); i++)
        check_model(newer[i], FORGE_MIX_Q8_0);
    alarm(0);
}

TU_TEST_MAIN(test_learn_file, test_placements_same_bytes)
