/* test_context_placement_gpu.c - the placement flags through hm_context_init on a GPU, with a
 * forged tiny-qwen3moe (q8_0, 4 layers of 16 experts): the whole model on the device (report,
 * the same logits with and without a --vram-budget that holds it), the engine's own budget check
 * (cuda_engine_params.vram_budget: refused one byte short, admitted at the exact need), a whole
 * model that does not fit the budget (the automatic tiered plan, run and reported; --gpu-strict
 * refuses), explicit tiered plans (--cpu-moe, --n-cpu-moe, -ot),
 * an explicit plan that does not fit (HM_ERR_NOMEM naming the budget), a partial -ngl (split
 * between the engines) and the plans that cannot run yet (attention of a later layer on the
 * host while an earlier one's is on the device; a non-expert tensor on the host). Without a
 * GPU the program reports itself skipped (exit 77; a failure under HOTMOE_EXPECT_GPU=1).
 *
 * Tiered plans (every attention on the GPU, routed experts of some layers in RAM: --cpu-moe,
 * --n-cpu-moe, -ot on expert tensors, and the automatic choice) run on the GPU engine with the
 * tiered runtime's CPU side (runtime/tiered.h); decoded one token per call (decode-sized steps,
 * whose expert products are the same bytes on both sides) their logits equal the whole-model
 * engine's, byte for byte. A hot cache the engine cannot start with is dropped, said. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda/cuda_test_util.h"
#include "../forge/forge_test_util.h"
#include "cuda/cuda_engine.h"
#include "harness.h"
#include "learn_test_util.h"
#include "model/model.h"
#include "runtime/context.h"

#define N_CTX 64
#define N_TOK 6
#define MIB (1ull << 20)

static hm_model *g_model;

static hm_model *model(void) {
    if (g_model) return g_model;
    char path[512];
    if (!ft_forged("ctxplace-gpu", "tiny-qwen3moe", FORGE_MIX_Q8_0, path, sizeof(path)))
        return NULL;
    hm_error err;
    if (hm_model_load(path, NULL, &g_model, &err) != HM_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.msg);
        g_model = NULL;
    }
    return g_model;
}

static hm_context_params params(int ngl, int n_ctx) {
    hm_context_params p = hm_context_default_params();
    p.n_ctx = n_ctx;
    p.n_threads = 2;
    p.n_gpu_layers = ngl;
    return p;
}

/* The GPU engine's sizes for the context's resolved parameters (n_ubatch = min(512, n_ctx)). */
static bool engine_sizes(int n_ctx, uint64_t *wb, uint64_t *kvb, uint64_t *sb) {
    cuda_engine_params ep;
    memset(&ep, 0, sizeof(ep));
    ep.n_ctx = n_ctx;
    ep.n_ubatch = n_ctx < 512 ? n_ctx : 512;
    ep.type_k = ep.type_v = HM_TYPE_F16;
    hm_error err;
    hm_status st = cuda_engine_plan(model(), &ep, wb, kvb, sb, &err);
    if (st != HM_OK) fprintf(stderr, "cuda_engine_plan: %s\n", err.msg);
    return st == HM_OK;
}

static uint64_t tensor_bytes(const hm_tensor *t) {
    if (!t->data) return 0;
    uint64_t rows = 1;
    for (int d = 1; d < 4; d++) rows *= (uint64_t)(t->ne[d] ? t->ne[d] : 1);
    return (uint64_t)t->row_size * rows;
}

/* Bytes of every routed expert tensor (what --cpu-moe keeps in RAM). */
static uint64_t expert_bytes(void) {
    const hm_hparams *hp = hm_model_hparams(model());
    uint64_t n = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const hm_layer *L = hm_model_layer(model(), il);
        n += tensor_bytes(&L->gate_exps) + tensor_bytes(&L->up_exps) +
             tensor_bytes(&L->down_exps) + tensor_bytes(&L->gate_exps_b) +
             tensor_bytes(&L->up_exps_b) + tensor_bytes(&L->down_exps_b);
    }
    return n;
}

static hm_status init_logged(const hm_context_params *p, hm_context **ctx, hm_error *err,
                             char **log) {
    hm_t_log l;
    hm_t_log_begin(&l);
    hm_status st = hm_context_init(model(), p, ctx, err);
    *log = hm_t_log_end(&l);
    return st;
}

static float *run_logits(hm_context *ctx) {
    const int64_t V = hm_model_hparams(model())->n_vocab;
    float *lo = malloc(sizeof(float) * (size_t)(V * N_TOK));
    const int32_t ids[N_TOK] = {5, 6, 7, 8, 40, 3};
    hm_error err;
    if (!lo || hm_decode(ctx, ids, N_TOK, 0, lo, HM_LOGITS_ALL, &err) != HM_OK) {
        if (lo) fprintf(stderr, "decode: %s\n", err.msg);
        free(lo);
        return NULL;
    }
    return lo;
}

/* Logits [N_TOK][n_vocab] of the prompt decoded one token per call, or NULL. */
static float *run_steps(hm_context *ctx) {
    const int64_t V = hm_model_hparams(model())->n_vocab;
    float *lo = malloc(sizeof(float) * (size_t)(V * N_TOK));
    const int32_t ids[N_TOK] = {5, 6, 7, 8, 40, 3};
    hm_error err;
    for (int i = 0; lo && i < N_TOK; i++)
        if (hm_decode(ctx, ids + i, 1, i, lo + (size_t)i * (size_t)V, HM_LOGITS_LAST, &err) !=
            HM_OK) {
            fprintf(stderr, "decode %d: %s\n", i, err.msg);
            free(lo);
            return NULL;
        }
    return lo;
}

/* The whole model's step-by-step logits on the GPU (the reference of the tiered plans). */
static float *full_gpu_steps(void) {
    hm_context_params p = params(99, N_CTX);
    hm_context *ctx = NULL;
    hm_error err;
    if (hm_context_init(model(), &p, &ctx, &err) != HM_OK) {
        fprintf(stderr, "-ngl 99: %s\n", err.msg);
        return NULL;
    }
    float *lo = hm_context_gpu(ctx) ? run_steps(ctx) : NULL;
    hm_context_free(ctx);
    return lo;
}

static size_t logits_bytes(void) {
    return sizeof(float) * (size_t)(hm_model_hparams(model())->n_vocab * N_TOK);
}

/* -ngl 99: the GPU engine, the report logged once; a --vram-budget that holds the model changes
 * nothing (same engine, same logits). */
static void test_full_gpu(void) {
    if (!tu_have_gpu()) return;
    HM_REQUIRE(model());
    hm_context_params p = params(99, N_CTX);
    hm_context *ctx = NULL;
    hm_error err;
    char *log = NULL;
    HM_REQUIRE(init_logged(&p, &ctx, &err, &log) == HM_OK);
    HM_CHECK(hm_context_gpu(ctx) != NULL);
    const char *r = hm_context_placement_report(ctx);
    HM_CHECK(r && strstr(r, "placement: as asked (-ngl 99)\n") && strstr(r, ": fits\n"));
    HM_CHECK(r && strstr(r, "routed experts: device slots in layers 0-3; host only in layers "
                            "none"));
    HM_CHECK_MSG(strstr(log, "hotmoe info: placement: as asked (-ngl 99)"), "%s", log);
    HM_CHECK_MSG(!strstr(log, "running on the CPU"), "%s", log);
    float *a = run_logits(ctx);
    hm_context_free(ctx);
    free(log);
    p.vram_budget = 1024 * MIB;
    ctx = NULL;
    HM_REQUIRE(hm_context_init(model(), &p, &ctx, &err) == HM_OK);
    HM_CHECK(hm_context_gpu(ctx) != NULL);
    r = hm_context_placement_report(ctx);
    HM_CHECK(r && strstr(r, "budget 1.00 GiB: fits"));
    float *b = run_logits(ctx);
    hm_context_free(ctx);
    const size_t n = sizeof(float) * (size_t)(hm_model_hparams(model())->n_vocab * N_TOK);
    HM_CHECK(a && b && memcmp(a, b, n) == 0);
    free(a);
    free(b);
}

/* cuda_engine_params.vram_budget: one byte short of weights + KV + buffers is refused, naming
 * the budget; the exact need is admitted. */
static void test_engine_budget(void) {
    if (!tu_have_gpu()) return;
    HM_REQUIRE(model());
    uint64_t wb = 0, kvb = 0, sb = 0;
    HM_REQUIRE(engine_sizes(N_CTX, &wb, &kvb, &sb));
    cuda_engine_params ep;
    memset(&ep, 0, sizeof(ep));
    ep.n_ctx = N_CTX;
    ep.n_ubatch = N_CTX;
    ep.type_k = ep.type_v = HM_TYPE_F16;
    ep.vram_budget = wb + kvb + sb - 1;
    cuda_engine *e = NULL;
    hm_error err;
    HM_CHECK(cuda_engine_init(model(), &ep, &e, &err) == HM_ERR_NOMEM && e == NULL);
    HM_CHECK_MSG(strstr(err.msg, "more than --vram-budget"), "%s", err.msg);
    ep.vram_budget = wb + kvb + sb;
    HM_CHECK_MSG(cuda_engine_init(model(), &ep, &e, &err) == HM_OK, "%s", err.msg);
    cuda_engine_free(e);
}

/* ctx's step-by-step logits are the whole model's on the GPU, byte for byte. */
static void check_full_gpu_bytes(hm_context *ctx) {
    float *ref = full_gpu_steps(), *lo = run_steps(ctx);
    HM_CHECK(ref && lo && memcmp(ref, lo, logits_bytes()) == 0);
    free(ref);
    free(lo);
}

/* A whole model that does not fit the budget but fits with its experts in RAM: the automatic
 * tiered plan (reported); --gpu-strict refuses it with the numbers. */
static void test_auto_tiered(void) {
    if (!tu_have_gpu()) return;
    HM_REQUIRE(model());
    uint64_t wb = 0, kvb = 0, sb = 0;
    HM_REQUIRE(engine_sizes(N_CTX, &wb, &kvb, &sb));
    const uint64_t ex = expert_bytes(), n_layer = (uint64_t)hm_model_hparams(model())->n_layer;
    /* the --cpu-moe plan: every weight but the experts, KV (rounded up per layer), scratch
     * with the engine's alignment; one MiB over it, and the whole model is more */
    const uint64_t tiered_need = wb - ex + kvb + n_layer + sb;
    const uint64_t budget_mib = tiered_need / MIB + 2;
    HM_REQUIRE(wb + kvb + sb > budget_mib * MIB);
    hm_context_params p = params(99, N_CTX);
    p.vram_budget = budget_mib * MIB;
    hm_context *ctx = NULL;
    hm_error err;
    char *log = NULL;
    hm_status st = init_logged(&p, &ctx, &err, &log);
    HM_CHECK_MSG(strstr(log, "placement: tiered, chosen automatically") &&
                     strstr(log, "every routed expert moved to RAM (as --cpu-moe)") &&
                     strstr(log, "plan: -ngl 99 --cpu-moe"),
                 "%s", log);
    HM_CHECK_MSG(st == HM_OK && hm_context_gpu(ctx) != NULL, "%d: %s", st, err.msg);
    HM_CHECK_MSG(strstr(log, "the routed experts of 4 layers in RAM"), "%s", log);
    if (st == HM_OK) check_full_gpu_bytes(ctx);
    hm_context_free(ctx);
    free(log);
    p.gpu_strict = true;
    ctx = NULL;
    HM_CHECK(hm_context_init(model(), &p, &ctx, &err) == HM_ERR_NOMEM && ctx == NULL);
    HM_CHECK_MSG(strstr(err.msg, "the whole model needs") &&
                     strstr(err.msg, "--gpu-strict refuses a tiered placement"),
                 "%s", err.msg);

    /* a budget a little short of the whole model: only the first layers' experts go to RAM
     * (as --n-cpu-moe K), the rest keep their device slots; the logits are the whole model's */
    p = params(99, N_CTX);
    p.vram_budget = (wb + kvb + sb) / MIB * MIB - MIB;
    ctx = NULL;
    log = NULL;
    st = init_logged(&p, &ctx, &err, &log);
    HM_CHECK_MSG(st == HM_OK && strstr(log, "placement: tiered, chosen automatically") &&
                     strstr(log, "moved to RAM (as --n-cpu-moe ") &&
                     strstr(log, "plan: -ngl 99 --n-cpu-moe "),
                 "%s", log);
    if (st == HM_OK) check_full_gpu_bytes(ctx);
    hm_context_free(ctx);
    free(log);
}

/* Explicit tiered plans: the GPU engine with the CPU side serving the host layers; the report
 * and the start line say which; the logits are the whole-model engine's, byte for byte. */
static void test_tiered_explicit(void) {
    if (!tu_have_gpu()) return;
    HM_REQUIRE(model());
    float *ref = full_gpu_steps();
    HM_REQUIRE(ref);
    static const struct {
        const char *name;
        bool cpu_moe;
        int n_cpu_moe;
        const char *ot;
        const char *experts; /* the report's line */
        int n_host;
    } cases[] = {
        {"--cpu-moe", true, 0, NULL, "device slots in layers none; host only in layers 0-3", 4},
        {"--n-cpu-moe 2", false, 2, NULL, "device slots in layers 2-3; host only in layers 0-1",
         2},
        {"-ot", false, 0, "blk\\.(1|3)\\.ffn_(up|down|gate)_exps=CPU",
         "device slots in layers 0, 2; host only in layers 1, 3", 2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        hm_context_params p = params(99, N_CTX);
        p.cpu_moe = cases[i].cpu_moe;
        p.n_cpu_moe = cases[i].n_cpu_moe;
        p.override_tensor = cases[i].ot;
        hm_context *ctx = NULL;
        hm_error err;
        char *log = NULL;
        hm_status st = init_logged(&p, &ctx, &err, &log);
        HM_CHECK_MSG(st == HM_OK && hm_context_gpu(ctx) != NULL, "%s: %s", cases[i].name,
                     err.msg);
        const char *r = ctx ? hm_context_placement_report(ctx) : NULL;
        HM_CHECK_MSG(r && strstr(r, cases[i].experts), "%s: %s", cases[i].name, r ? r : "");
        char want[96];
        snprintf(want, sizeof(want), "the routed experts of %d layers in RAM", cases[i].n_host);
        HM_CHECK_MSG(strstr(log, want), "%s: %s", cases[i].name, log);
        if (st == HM_OK) {
            float *lo = run_steps(ctx);
            HM_CHECK_MSG(lo && memcmp(ref, lo, logits_bytes()) == 0,
                         "%s: logits differ from the whole model's on the GPU", cases[i].name);
            free(lo);
        }
        free(log);
        hm_context_free(ctx);
    }
    free(ref);
}

/* A hot cache the engine cannot start with (--moe-hot-cache-max-mib far above what the
 * --vram-budget leaves: every expert planned into VRAM, the engine refuses the budget): the
 * context starts without it, said in the log and the report, no layer holds a cache, and the
 * --cpu-moe plan's logits are the whole model's. */
static void test_hot_cache_no_room(void) {
    if (!tu_have_gpu()) return;
    HM_REQUIRE(model());
    uint64_t wb = 0, kvb = 0, sb = 0;
    HM_REQUIRE(engine_sizes(N_CTX, &wb, &kvb, &sb));
    char learn[600];
    ft_path(learn, sizeof(learn), "ctxplace-gpu.learn.json");
    HM_REQUIRE(write_learn(model(), learn));
    hm_context_params p = params(99, N_CTX);
    p.cpu_moe = true;
    p.vram_budget = (wb + kvb + sb) / MIB * MIB - MIB; /* the whole model does not fit */
    p.moe_hot_cache = learn;
    p.moe_hot_cache_max_mib = 100000;
    hm_context *ctx = NULL;
    hm_error err;
    char *log = NULL;
    hm_status st = init_logged(&p, &ctx, &err, &log);
    HM_CHECK_MSG(st == HM_OK && hm_context_gpu(ctx) != NULL, "%d: %s", st, err.msg);
    HM_CHECK_MSG(strstr(log, "hot cache: the GPU cannot start with it") &&
                     strstr(log, "more than --vram-budget") &&
                     strstr(log, "the routed experts of 4 layers in RAM"),
                 "%s", log);
    const char *r = ctx ? hm_context_placement_report(ctx) : NULL;
    HM_CHECK_MSG(r && strstr(r, "hot cache: none (the GPU cannot start with it"), "%s",
                 r ? r : "");
    if (st == HM_OK) {
        const int NL = (int)hm_model_hparams(model())->n_layer;
        uint8_t hot[256];
        for (int il = 0; il < NL; il++) HM_CHECK(hm_context_hot_layer(ctx, il, hot) == 0);
        check_full_gpu_bytes(ctx);
    }
    free(log);
    hm_context_free(ctx);
    remove(learn);
}

/* Explicit options that do not fit are not changed: HM_ERR_NOMEM naming the flags and the
 * budget. */
static void test_explicit_not_fitting(void) {
    if (!tu_have_gpu()) return;
    HM_REQUIRE(model());
    const int n_ctx = 1024; /* KV large enough that the --cpu-moe plan needs > 2 MiB */
    uint64_t wb = 0, kvb = 0, sb = 0;
    HM_REQUIRE(engine_sizes(n_ctx, &wb, &kvb, &sb));
    HM_REQUIRE(wb - expert_bytes() + kvb + sb > 2 * MIB);
    hm_context_params p = params(99, n_ctx);
    p.cpu_moe = true;
    p.vram_budget = 1 * MIB;
    hm_context *ctx = NULL;
    hm_error err;
    char *log = NULL;
    HM_CHECK(init_logged(&p, &ctx, &err, &log) == HM_ERR_NOMEM && ctx == NULL);
    HM_CHECK_MSG(strstr(err.msg, "placement -ngl 99 --cpu-moe --vram-budget 1 needs") &&
                     strstr(err.msg, "the budget is 1.0 MiB (--vram-budget)"),
                 "%s", err.msg);
    HM_CHECK_MSG(strstr(log, "does NOT fit"), "%s", log);
    free(log);
}

/* Plans with the attention of some layers on the host other than as the first layers wholly
 * there (a partial -ngl runs), or a non-expert tensor there, do not run yet:
 * HM_ERR_UNSUPPORTED naming what to use; the report was logged. */
static void test_mixed_refused(void) {
    if (!tu_have_gpu()) return;
    HM_REQUIRE(model());
    /* the attention of layer 1 alone on the host: not the first layers wholly on the host (a
     * partial -ngl, which runs: test_context_split.c) */
    hm_context_params p = params(99, N_CTX);
    p.override_tensor = "blk\\.1\\.attn_q\\.weight=CPU";
    hm_context *ctx = NULL;
    hm_error err;
    char *log = NULL;
    HM_CHECK(init_logged(&p, &ctx, &err, &log) == HM_ERR_UNSUPPORTED && ctx == NULL);
    HM_CHECK_MSG(strstr(err.msg, "the attention of layers 1 would run on the host") &&
                     strstr(err.msg, "-ngl 99 --cpu-moe") && strstr(err.msg, "-ngl 0"),
                 "%s", err.msg);
    HM_CHECK_MSG(strstr(log, "placement: as asked (-ngl 99"), "%s", log);
    free(log);
    /* -ngl 2 runs split: layers 0-2 on the CPU, layer 3 and the output on the GPU */
    p = params(2, N_CTX);
    HM_CHECK_MSG(init_logged(&p, &ctx, &err, &log) == HM_OK && ctx &&
                     hm_context_split_layer(ctx) == 3 && hm_context_gpu(ctx),
                 "%s", err.msg);
    HM_CHECK_MSG(strstr(log, "layers 0-2 on the CPU"), "%s", log);
    hm_context_free(ctx);
    ctx = NULL;
    free(log);
    p = params(99, N_CTX);
    p.override_tensor = "^output\\.weight=CPU";
    HM_CHECK(init_logged(&p, &ctx, &err, &log) == HM_ERR_UNSUPPORTED && ctx == NULL);
    HM_CHECK_MSG(strstr(err.msg, "output.weight would stay on the host"), "%s", err.msg);
    free(log);
}

static void test_free_model(void) {
    hm_model_free(g_model);
    g_model = NULL;
}

TU_TEST_MAIN(test_full_gpu, test_engine_budget, test_auto_tiered, test_tiered_explicit,
             test_hot_cache_no_room, test_explicit_not_fitting, test_mixed_refused,
             test_free_model)
