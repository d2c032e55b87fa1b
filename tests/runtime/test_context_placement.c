/* test_context_placement.c - the placement flags through hm_context_init (runtime/context.h) on
 * a forged tiny-qwen3moe (q8_0, 4 layers of 16 experts): what the context does with -ngl,
 * --cpu-moe, --n-cpu-moe, -ot and --vram-budget when there is no GPU (the plan is made and kept,
 * one warning line says the GPU placement is ignored, the logits are the CPU's to the byte,
 * --gpu-strict refuses), the planner's errors reaching the caller, and the report the context
 * keeps for a plan of each kind. The planner's own rules and byte sums are test_placement.c's;
 * the GPU side (a plan run on the device, the budget, the refusals) is
 * test_context_placement_gpu.c's.
 *
 * On a machine with a GPU the checks that need its absence say so and are not run (the GPU
 * program covers that machine); everything else runs everywhere. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda/cuda_test_util.h"
#include "../forge/forge_test_util.h"
#include "base/log.h"
#include "harness.h"
#include "model/model.h"
#include "runtime/context.h"

#define N_CTX 64
#define N_TOK 6

static hm_model *g_model; /* loaded once */

static hm_model *model(void) {
    if (g_model) return g_model;
    char path[512];
    if (!ft_forged("ctxplace", "tiny-qwen3moe", FORGE_MIX_Q8_0, path, sizeof(path))) return NULL;
    hm_error err;
    if (hm_model_load(path, NULL, &g_model, &err) != HM_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.msg);
        g_model = NULL;
    }
    return g_model;
}

static hm_context_params base_params(void) {
    hm_context_params p = hm_context_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 2;
    return p;
}

/* A placement as the CLI would pass it. */
typedef struct {
    const char *name;
    int ngl;
    bool cpu_moe;
    int n_cpu_moe;
    const char *ot;
    int budget_mib;
    bool strict;
} flags;

static hm_context_params with(const flags *f) {
    hm_context_params p = base_params();
    p.n_gpu_layers = f->ngl;
    p.cpu_moe = f->cpu_moe;
    p.n_cpu_moe = f->n_cpu_moe;
    p.override_tensor = f->ot;
    p.vram_budget = (uint64_t)f->budget_mib << 20;
    p.gpu_strict = f->strict;
    return p;
}

/* hm_context_init with stderr (the log) kept in *log (malloc'd, may be empty). */
static hm_status init_logged(const hm_context_params *p, hm_context **ctx, hm_error *err,
                             char **log) {
    hm_t_log l;
    hm_t_log_begin(&l);
    hm_status st = hm_context_init(model(), p, ctx, err);
    *log = hm_t_log_end(&l);
    return st;
}

static int count_lines_with(const char *text, const char *needle) {
    int n = 0;
    for (const char *s = text; s && *s;) {
        const char *nl = strchr(s, '\n');
        const size_t len = nl ? (size_t)(nl - s) : strlen(s);
        char line[2048];
        snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) ? len : sizeof(line) - 1), s);
        n += strstr(line, needle) != NULL;
        s += len + (nl ? 1 : 0);
    }
    return n;
}

/* Logits [N_TOK][n_vocab] of a fixed prompt, or NULL. */
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

static bool no_gpu(const char *what) {
    if (tu_gpu_count() == 0) return true;
    printf("  (a GPU is present: %s is test_context_placement_gpu.c's)\n", what);
    return false;
}

/* Without placement flags: no plan, no report, the CPU. */
static void test_no_flags_no_plan(void) {
    HM_REQUIRE(model());
    const hm_context_params p = base_params();
    hm_context *ctx = NULL;
    hm_error err;
    char *log = NULL;
    HM_REQUIRE(init_logged(&p, &ctx, &err, &log) == HM_OK);
    HM_CHECK(hm_context_placement_report(ctx) == NULL);
    HM_CHECK(hm_context_gpu(ctx) == NULL);
    HM_CHECK_MSG(!strstr(log, "placement"), "%s", log);
    free(log);
    hm_context_free(ctx);
}

/* No GPU: every placement is accepted, the plan is kept, one warning line names the flags
 * when the plan wanted the device (none when it did not), and the logits are the plain CPU
 * context's, byte for byte. */
static void test_flags_ignored_without_gpu(void) {
    HM_REQUIRE(model());
    if (!no_gpu("running these placements")) return;
    const hm_context_params p0 = base_params();
    hm_context *ctx = NULL;
    hm_error err;
    HM_REQUIRE(hm_context_init(model(), &p0, &ctx, &err) == HM_OK);
    float *ref = run_logits(ctx);
    hm_context_free(ctx);
    HM_REQUIRE(ref);
    const size_t bytes = sizeof(float) * (size_t)(hm_model_hparams(model())->n_vocab * N_TOK);
    static const flags cases[] = {
        {"-ngl 99", 99, false, 0, NULL, 0, false},
        {"-ngl 99 --cpu-moe", 99, true, 0, NULL, 0, false},
        {"-ngl 2 --n-cpu-moe 1", 2, false, 1, NULL, 0, false},
        {"-ngl 99 -ot", 99, false, 0, "blk\\.0\\.ffn_(up|down|gate)_exps=CPU", 64, false},
        {"-ngl 0 -ot", 0, false, 0, "blk\\.1\\.attn_q\\.weight=CUDA0", 0, false},
        {"-ngl 0 --cpu-moe", 0, true, 0, NULL, 0, false},
        {"-ngl 0 --vram-budget 512", 0, false, 0, NULL, 512, false},
        {"-ngl 0 --cpu-moe --gpu-strict", 0, true, 0, NULL, 0, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const flags *f = &cases[i];
        const hm_context_params p = with(f);
        char *log = NULL;
        ctx = NULL;
        hm_status st = init_logged(&p, &ctx, &err, &log);
        HM_CHECK_MSG(st == HM_OK, "%s: %s", f->name, err.msg);
        if (st != HM_OK) {
            free(log);
            continue;
        }
        HM_CHECK_MSG(hm_context_gpu(ctx) == NULL, "%s", f->name);
        HM_CHECK_MSG(hm_context_placement_report(ctx) != NULL, "%s: no report", f->name);
        /* the GPU was wanted unless -ngl 0 without a CUDA0 override */
        const bool wanted = f->ngl > 0 || (f->ot && strstr(f->ot, "CUDA0"));
        const int n_warn = count_lines_with(log, "is ignored; running on the CPU only");
        HM_CHECK_MSG(n_warn == (wanted ? 1 : 0), "%s: %d warning lines:\n%s", f->name, n_warn,
                     log);
        if (wanted) {
            char expect[160];
            snprintf(expect, sizeof(expect), "the GPU placement (-ngl %d", f->ngl);
            HM_CHECK_MSG(strstr(log, expect), "%s: %s", f->name, log);
            HM_CHECK_MSG(strstr(log, "GPU unavailable (built without CUDA)") ||
                             strstr(log, "GPU unavailable (no CUDA device)"),
                         "%s: %s", f->name, log);
            if (f->cpu_moe) HM_CHECK_MSG(strstr(log, "--cpu-moe"), "%s", log);
            if (f->ot) HM_CHECK_MSG(strstr(log, f->ot), "%s", log);
        }
        /* the report is not printed at the default level: the GPU runs none of it */
        if (hm_log_get_level() < HM_LOG_DEBUG)
            HM_CHECK_MSG(!strstr(log, "placement: as asked") &&
                             !strstr(log, "placement: tiered"),
                         "%s: %s", f->name, log);
        float *lo = run_logits(ctx);
        HM_CHECK_MSG(lo && memcmp(lo, ref, bytes) == 0, "%s: logits differ from the plain CPU "
                     "context's", f->name);
        free(lo);
        free(log);
        hm_context_free(ctx);
    }
    free(ref);
}

/* No GPU and --gpu-strict with a plan that wants the device: refused, naming the reason. */
static void test_strict_refuses_without_gpu(void) {
    HM_REQUIRE(model());
    if (!no_gpu("--gpu-strict's refusal")) return;
    static const flags cases[] = {
        {"-ngl 99 --gpu-strict", 99, false, 0, NULL, 0, true},
        {"-ngl 99 --cpu-moe --gpu-strict", 99, true, 0, NULL, 0, true},
        {"-ngl 1 --gpu-strict", 1, false, 0, NULL, 0, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const hm_context_params p = with(&cases[i]);
        hm_context *ctx = NULL;
        hm_error err;
        char *log = NULL;
        hm_status st = init_logged(&p, &ctx, &err, &log);
        HM_CHECK_MSG(st == HM_ERR_UNSUPPORTED && ctx == NULL, "%s: %d", cases[i].name, st);
        HM_CHECK_MSG(strstr(err.msg, "GPU required (--gpu-strict) but unavailable") &&
                         (strstr(err.msg, "built without CUDA") ||
                          strstr(err.msg, "no CUDA device")),
                     "%s: %s", cases[i].name, err.msg);
        HM_CHECK_MSG(!strstr(log, "running on the CPU"), "%s: %s", cases[i].name, log);
        free(log);
        hm_context_free(ctx);
    }
}

/* The planner's errors reach the caller as they are, GPU or not (the plan comes first). */
static void test_planner_errors(void) {
    HM_REQUIRE(model());
    static const struct {
        flags f;
        const char *msg;
    } cases[] = {
        {{"bad device", 99, false, 0, "x=GPU", 0, false},
         "-ot 'x=GPU': unknown device 'GPU' (known: CPU, CUDA0)"},
        {{"bad regex", 99, false, 0, "blk\\.(1=CPU", 0, false}, "-ot 'blk\\.(1=CPU': bad regex"},
        {{"no =", 0, true, 0, "a=CPU,blk", 0, false}, "-ot 'blk': expected REGEX=DEVICE"},
        {{"empty regex", 99, false, 0, "=CPU", 0, true}, "-ot '=CPU': empty regex"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const hm_context_params p = with(&cases[i].f);
        hm_context *ctx = NULL;
        hm_error err;
        hm_status st = hm_context_init(model(), &p, &ctx, &err);
        HM_CHECK_MSG(st == HM_ERR_ARG && ctx == NULL, "%s: %d", cases[i].f.name, st);
        HM_CHECK_MSG(strstr(err.msg, cases[i].msg), "%s: %s", cases[i].f.name, err.msg);
        hm_context_free(ctx);
    }
    hm_context_params p = base_params();
    p.n_cpu_moe = -1;
    hm_context *ctx = NULL;
    hm_error err;
    HM_CHECK(hm_context_init(model(), &p, &ctx, &err) == HM_ERR_ARG && ctx == NULL);
    HM_CHECK_MSG(strstr(err.msg, "--n-cpu-moe"), "%s", err.msg);
}

/* The report the context keeps: the tiers of each kind of plan (on this model: 4 layers, the
 * experts of a layer are 3 tensors gate/up/down). */
static void test_report_tiers(void) {
    HM_REQUIRE(model());
    if (!no_gpu("the report of plans it would run")) return;
    static const struct {
        flags f;
        const char *want[4];
    } cases[] = {
        {{"--cpu-moe", 99, true, 0, NULL, 1024, false},
         {"placement: as asked (-ngl 99 --cpu-moe)\n",
          "  attention + KV cache: device in layers 0-3; host in layers none ",
          "  routed experts: device slots in layers none; host only in layers 0-3 (--cpu-moe)",
          "budget 1.00 GiB: fits"}},
        {{"--n-cpu-moe 3", 99, false, 3, NULL, 1024, false},
         {"placement: as asked (-ngl 99 --n-cpu-moe 3)\n",
          "  routed experts: device slots in layers 3; host only in layers 0-2 (--n-cpu-moe and "
          "-ngl)",
          "token_embd.weight device, output_norm.weight device, output.weight device", NULL}},
        {{"-ot", 99, false, 0, "blk\\.(1|2)\\.ffn_(up|down|gate)_exps=CPU", 1024, false},
         {"placement: as asked (-ngl 99 -ot, 1 override)\n",
          "  routed experts: device slots in layers 0, 3; host only in layers 1-2 (-ngl, -ot)",
          "  -ot 'blk\\.(1|2)\\.ffn_(up|down|gate)_exps=CPU': 6 tensors (",
          ") on the host\n"}},
        {{"-ngl 2", 2, false, 0, NULL, 1024, false},
         {"placement: as asked (-ngl 2)\n",
          "  attention + KV cache: device in layers 3; host in layers 0-2 (-ngl 2 counts",
          "token_embd.weight host, output_norm.weight device, output.weight device",
          "  routed experts: device slots in layers 3; host only in layers 0-2 (-ngl)"}},
        {{"-ngl 99 --vram-budget 1", 99, false, 0, NULL, 1, false},
         {"placement: tiered, chosen automatically: the whole model needs ",
          "the budget is 1.0 MiB; every routed expert moved to RAM", NULL, NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const hm_context_params p = with(&cases[i].f);
        hm_context *ctx = NULL;
        hm_error err;
        char *log = NULL;
        hm_status st = init_logged(&p, &ctx, &err, &log);
        free(log);
        HM_CHECK_MSG(st == HM_OK, "%s: %s", cases[i].f.name, err.msg);
        if (st != HM_OK) continue;
        const char *r = hm_context_placement_report(ctx);
        HM_CHECK_MSG(r, "%s: no report", cases[i].f.name);
        for (int k = 0; r && k < 4 && cases[i].want[k]; k++)
            HM_CHECK_MSG(strstr(r, cases[i].want[k]), "%s: report lacks '%s':\n%s",
                         cases[i].f.name, cases[i].want[k], r);
        hm_context_free(ctx);
    }
}

static void test_free_model(void) {
    hm_model_free(g_model);
    g_model = NULL;
}

HM_TEST_MAIN(test_no_flags_no_plan, test_flags_ignored_without_gpu,
             test_strict_refuses_without_gpu, test_planner_errors, test_report_tiers,
             test_free_model)
