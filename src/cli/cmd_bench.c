/* cmd_bench.c - `hotmoe bench -m MODEL [-p 512] [-n 128] [-r 5] [-t T] [-o md|json]`: prompt
 * processing and text generation speed, reported like llama-bench.
 *
 * DESIGN: as llama-bench does: one warm-up run (the prompt test once, a short generation),
 * then per repetition the KV cache is emptied and timed from scratch. ppN feeds N tokens in
 * batches of -b (logits of the last only); tgN decodes N tokens one at a time starting from an
 * empty cache through the generation API (runtime/generate.h) as `run` does: one pseudo-random
 * token as the prompt, then N - 1 greedy tokens and hm_gen_end (N forward passes in all; on a
 * GPU context the autonomous decode graph, so the figure includes device sampling and the
 * token ring). Prompt tokens are pseudo-random ids (LCG seeded with 42) so runs are repeatable.
 * Audit (GPU contexts, or --audit): one more generation of 1024 tokens (fewer if -c is
 * smaller) records host synchronisations per token, graph nodes per token and the coefficient
 * of variation of the token intervals (seed 004 section 15); JSON tg rows carry them. The
 * figure is tokens per second of each repetition; the row gives their mean ± sample standard
 * deviation. Sizes as llama-bench prints them: bytes of all tensors (MiB below 1 GiB, else GiB)
 * and element count (M below 1e9, else B). Placement flags as llama-bench takes them: -ngl,
 * -ncmoe/--n-cpu-moe and -ot with its overrides separated by ';' (one set per run: llama-bench's
 * ',' between sets is refused), plus hotmoe's --cpu-moe and --vram-budget; the table adds the
 * columns llama-bench would (ngl on the GPU or when given, n_cpu_moe, ot) and cpu_moe, and the
 * JSON rows carry n_gpu_layers, n_cpu_moe, tensor_buft_overrides, cpu_moe and vram_budget_mib.
 * --moe-offload-threshold N adds an offl_th column (and moe_offload_threshold in JSON).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "cli/cli_tracer.h"
#include "cli/commands.h"
#include "cli/engine.h"
#include "cli/bench_out.h"
#include "quant/qtypes.h"

static uint32_t lcg_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

#define BENCH_AUDIT_TOKENS 1024
#define BENCH_LIST_MAX 16

/* One test: ppN, tgN, ppN+tgM, at a depth of D tokens already in the cache. */
typedef struct {
    int n_prompt, n_gen, depth;
} bench_test;

/* A flag's values: each occurrence, its comma-separated items. */
typedef struct {
    const char *flag, *alt;
    int v[BENCH_LIST_MAX];
    int n;
} int_list;

/* Empties the cache, fills `depth` tokens (not timed), then times the test: n_prompt tokens
 * in batches, and a generation of n_gen tokens through the generation API (one forward pass for
 * its first token, n_gen - 1 for the others; the GPU's limit is n_gen - 1 steps, so it never
 * runs ahead). *dt: the seconds of the prompt and the generation. */
static hm_status run_test(cli_engine *e, hm_gen *g, const bench_test *t, int32_t *toks,
                          float *logits, uint64_t *rng, double *dt, hm_error *err) {
    hm_context_reset(e->ctx);
    hm_status st = HM_OK;
    for (int pass = 0; pass < 2 && !st; pass++) { /* the depth, then the prompt */
        const int n = pass ? t->n_prompt : t->depth;
        if (pass) *dt = cli_now();
        if (n <= 0) continue;
        for (int i = 0; i < n; i++) toks[i] = (int32_t)(lcg_next(rng) % (uint32_t)e->n_vocab);
        st = cli_engine_eval(e, toks, n, logits, NULL, err);
    }
    if (!st && t->n_gen > 0) {
        int32_t tok = (int32_t)(lcg_next(rng) % (uint32_t)e->n_vocab);
        hm_gen_set_max(g, t->n_gen - 1);
        st = hm_gen_prompt(g, &tok, 1, err);
        for (int i = 0; i < t->n_gen - 1 && !st; i++) st = hm_gen_next(g, &tok, err);
        if (!st) st = hm_gen_end(g, err);
    }
    *dt = cli_now() - *dt;
    return st;
}

static uint64_t model_params(const hm_model *m) {
    const gguf_ctx *g = hm_model_gguf(m);
    uint64_t n = 0;
    for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        uint64_t k = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) k *= (uint64_t)t->ne[d];
        n += k;
    }
    return n;
}

static const char *main_type(const hm_model *m) {
    const gguf_ctx *g = hm_model_gguf(m);
    uint64_t bytes[64] = {0};
    uint32_t best = 0;
    for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (t->type < 64) bytes[t->type] += t->size;
    }
    for (uint32_t k = 0; k < 64; k++)
        if (bytes[k] > bytes[best]) best = k;
    return hm_type_name(best);
}


/* Takes the list flags out of argv (the rest goes to the common parser): "-t 8,16" and
 * "-t 8 -t 16" alike. 0, or 2 after a usage line. */
static int take_lists(int *argc, char **argv, int_list *ls, int n_ls, cli_str_list *models,
                      int_list *pg) {
    int w = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *eq = a[0] == '-' && a[1] == '-' ? strchr(a, '=') : NULL;
        const size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        int_list *l = NULL;
        bool is_m = false, is_pg = false;
        for (int k = 0; k < n_ls && !l; k++)
            if ((strlen(ls[k].flag) == nl && !strncmp(a, ls[k].flag, nl)) ||
                (ls[k].alt && strlen(ls[k].alt) == nl && !strncmp(a, ls[k].alt, nl)))
                l = &ls[k];
        is_m = !l && ((nl == 2 && !strncmp(a, "-m", 2)) || (nl == 7 && !strncmp(a, "--model", 7)));
        is_pg = !l && !is_m && nl == 3 && !strncmp(a, "-pg", 3);
        if (!l && !is_m && !is_pg) {
            argv[w++] = argv[i];
            continue;
        }
        char *v = eq ? (char *)eq + 1 : i + 1 < *argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "hotmoe bench: flag '%.*s' needs a value\n", (int)nl, a);
            return 2;
        }
        int got = 0;
        for (char *item = v, *next; item; item = next) {
            next = strchr(item, ',');
            if (next) *next++ = 0;
            if (is_m) {
                if (models->n >= CLI_LIST_MAX) return fprintf(stderr, "hotmoe bench: too many -m\n"), 2;
                models->v[models->n++] = item;
                continue;
            }
            int_list *d = is_pg ? pg : l;
            char *end = NULL;
            const long x = strtol(item, &end, 10);
            if (!*item || *end || x < 0 || x > 1 << 24 || d->n >= BENCH_LIST_MAX) {
                fprintf(stderr, "hotmoe bench: %.*s: '%s' is not a count >= 0 (at most %d values)\n",
                        (int)nl, a, item, BENCH_LIST_MAX);
                return 2;
            }
            d->v[d->n++] = (int)x;
            got++;
        }
        if (is_pg && got != 2) {
            fprintf(stderr, "hotmoe bench: -pg takes PP,TG (two counts), got '%s'\n", v);
            return 2;
        }
    }
    *argc = w;
    return 0;
}

/* The tests of one engine, llama-bench's order: each depth, the pp tests, tg, then pp+tg. */
static int make_tests(const int_list *P, const int_list *N, const int_list *PG, const int_list *D,
                      bench_test *t, int cap) {
    int n = 0;
    for (int d = 0; d < D->n; d++) {
        for (int i = 0; i < P->n && n < cap; i++)
            if (P->v[i] > 0) t[n++] = (bench_test){P->v[i], 0, D->v[d]};
        for (int i = 0; i < N->n && n < cap; i++)
            if (N->v[i] > 0) t[n++] = (bench_test){0, N->v[i], D->v[d]};
        for (int i = 0; i + 1 < PG->n && n < cap; i += 2)
            t[n++] = (bench_test){PG->v[i], PG->v[i + 1], D->v[d]};
    }
    return n;
}

static void test_name(const bench_test *t, char *b, size_t n) {
    int o = 0;
    if (t->n_prompt > 0) o += snprintf(b + o, n - (size_t)o, "pp%d", t->n_prompt);
    if (t->n_gen > 0) o += snprintf(b + o, n - (size_t)o, "%stg%d", o ? "+" : "", t->n_gen);
    if (t->depth > 0) snprintf(b + o, n - (size_t)o, " @ d%d", t->depth);
}

typedef struct {
    bool audit, host_loop;
    int reps;
    const char *routing, *ot;
} bench_opts;

/* One engine's tests (a's model, threads and placement), each row printed when done. */
static int bench_engine(cli_common_args *a, const bench_opts *bo, const bench_test *tests,
                        int n_tests, const moe_tracer_config *tc, bench_out *out) {
    int need = 1;
    for (int k = 0; k < n_tests; k++) {
        const int len = tests[k].depth + tests[k].n_prompt + tests[k].n_gen;
        if (len > need) need = len;
    }
    bool any_tg = false;
    for (int k = 0; k < n_tests; k++) any_tg = any_tg || tests[k].n_gen > 0;
    int n_ctx_default = need < 512 ? 512 : need;
    if ((a->n_gpu_layers > 0 || bo->audit) && n_ctx_default < BENCH_AUDIT_TOKENS + 1)
        n_ctx_default = BENCH_AUDIT_TOKENS + 1;
    cli_engine e;
    int rc = cli_engine_open(&e, "bench", a, 0, n_ctx_default);
    if (rc) return rc;
    moe_tracer *tr = NULL;
    if (cli_tracer_attach(&e, tc, a->model, &tr)) {
        cli_engine_close(&e);
        return 1;
    }
    if (tr) moe_tracer_add_prompt(tr);
    if (hm_context_n_ctx(e.ctx) < need) {
        fprintf(stderr, "hotmoe bench: context %d is smaller than the test (%d tokens); raise -c\n",
                hm_context_n_ctx(e.ctx), need);
        cli_tracer_finish(&e, tr);
        cli_engine_close(&e);
        return 1;
    }
    if (!out->cols.ngl) out->cols.ngl = out->n_rows == 0 && hm_context_gpu(e.ctx) != NULL;
    char desc[96], pbuf[32];
    const uint64_t params = model_params(e.model);
    bench_fmt_params(pbuf, sizeof(pbuf), params);
    snprintf(desc, sizeof(desc), "%s %s %s", hm_model_arch(e.model)->name, pbuf,
             main_type(e.model));
    int most = 1;
    for (int k = 0; k < n_tests; k++) {
        if (tests[k].n_prompt > most) most = tests[k].n_prompt;
        if (tests[k].depth > most) most = tests[k].depth;
    }
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)most);
    float *logits = malloc(sizeof(float) * (size_t)e.n_vocab);
    double *ts = calloc((size_t)bo->reps, sizeof(double));
    double *ns = calloc((size_t)bo->reps, sizeof(double));
    hm_error err = {0};
    hm_status st = toks && logits && ts && ns ? HM_OK
                                              : hm_error_set(&err, HM_ERR_NOMEM, "out of memory");
    /* the generator: greedy, no penalties (tokens need no sampling flags, as llama-bench) */
    const int n_audit = hm_context_n_ctx(e.ctx) - 1 < BENCH_AUDIT_TOKENS
                            ? hm_context_n_ctx(e.ctx) - 1 : BENCH_AUDIT_TOKENS;
    const bool audit = any_tg && (bo->audit || hm_context_gpu(e.ctx)) && n_audit >= 2;
    hm_gen *gen = NULL;
    if (!st && any_tg) {
        sample_params sp = sample_params_default();
        sp.temperature = 0.0f;
        sp.penalty_last_n = 0;
        hm_gen_params gp = hm_gen_default_params();
        gp.host_loop = bo->host_loop;
        gp.audit_tokens = audit ? n_audit : 0;
        st = hm_gen_init(e.ctx, &sp, &gp, &gen, &err);
    }
    uint64_t rng = 42;
    double dt = 0;
    /* warm-up: the first prompt test once, a short generation */
    for (int k = 0; k < n_tests && !st; k++)
        if (tests[k].n_prompt > 0) {
            const bench_test w = {tests[k].n_prompt, 0, 0};
            st = run_test(&e, gen, &w, toks, logits, &rng, &dt, &err);
            break;
        }
    if (!st && any_tg) {
        const bench_test w = {0, 16, 0};
        st = run_test(&e, gen, &w, toks, logits, &rng, &dt, &err);
    }
    hm_gen_audit au;
    bool have_au = false;
    if (!st && audit) { /* a generation of n_audit tokens: the audit the tg rows carry */
        const bench_test w = {0, n_audit + 1, 0};
        st = run_test(&e, gen, &w, toks, logits, &rng, &dt, &err);
        if (!st) {
            hm_gen_audit_get(gen, &au);
            have_au = true;
            if (bo->audit) cli_engine_print_audit(&e, gen);
        }
    }
    const bench_env env = {.model_file = a->model, .desc = desc, .size = hm_model_weight_bytes(e.model),
                           .params = params, .backend = cli_engine_backend(&e),
                           .n_threads = e.n_threads, .n_batch = a->n_batch,
                           .n_ubatch = a->n_ubatch, .type_k = a->cache_type_k,
                           .type_v = a->cache_type_v, .n_gpu_layers = a->n_gpu_layers,
                           .n_cpu_moe = a->n_cpu_moe, .vram_budget_mib = a->vram_budget_mib,
                           .offload_threshold = a->moe_offload_threshold, .cpu_moe = a->cpu_moe,
                           .ot = bo->ot, .routing = bo->routing, .audit = have_au ? &au : NULL};
    for (int k = 0; k < n_tests && !st; k++) {
        bench_row row = {.n_prompt = tests[k].n_prompt, .n_gen = tests[k].n_gen,
                         .depth = tests[k].depth, .ts = ts, .ns = ns, .reps = bo->reps};
        test_name(&tests[k], row.name, sizeof(row.name));
        for (int i = 0; i < bo->reps && !st; i++) {
            st = run_test(&e, gen, &tests[k], toks, logits, &rng, &dt, &err);
            ns[i] = dt * 1e9;
            ts[i] = (double)(row.n_prompt + row.n_gen) / (dt > 0 ? dt : 1e-9);
        }
        if (!st) bench_out_row(out, &env, &row);
    }
    hm_gen_free(gen);
    if (!st) cli_engine_print_tiered(&e); /* the whole run's CPU-side counters (stderr) */
    if (st) fprintf(stderr, "hotmoe bench: %s\n", err.msg);
    free(toks);
    free(logits);
    free(ts);
    free(ns);
    const int tr_rc = cli_tracer_finish(&e, tr);
    cli_engine_close(&e);
    return st || tr_rc ? 1 : 0;
}

int cmd_bench(int argc, char **argv) {
    int_list lists[] = {{"-p", "--n-prompt", {512}, 1},  {"-n", "--n-gen", {128}, 1},
                        {"-t", "--threads", {0}, 1},     {"-ngl", "--n-gpu-layers", {0}, 1},
                        {"-ub", "--ubatch-size", {512}, 1}, {"-ncmoe", "--n-cpu-moe", {0}, 1},
                        {"-d", "--n-depth", {0}, 1}};
    enum { L_P, L_N, L_T, L_NGL, L_UB, L_NCMOE, L_D, N_L };
    int_list given[N_L], pg = {"-pg", NULL, {0}, 0};
    for (int k = 0; k < N_L; k++) given[k] = (int_list){lists[k].flag, lists[k].alt, {0}, 0};
    cli_str_list models = {{0}, 0};
    int reps = 5;
    bool audit = false, host_loop = false;
    const char *output = "md", *routing = NULL, *dummy = NULL;
    cli_str_list ot = {{0}, 0};
    const cli_arg_spec extra[] = {
        {"-m", "--model", CLI_ARG_STR, &dummy, "FNAME[,...]", "model paths (repeatable)"},
        {"-p", "--n-prompt", CLI_ARG_STR, &dummy, "N[,...]",
         "prompt tokens of the pp tests (default: 512; 0 = none)"},
        {"-n", "--n-gen", CLI_ARG_STR, &dummy, "N[,...]",
         "generated tokens of the tg tests (default: 128; 0 = none)"},
        {"-pg", NULL, CLI_ARG_STR, &dummy, "PP,TG", "a test of PP prompt tokens then TG generated "
         "ones, timed together (repeatable)"},
        {"-d", "--n-depth", CLI_ARG_STR, &dummy, "N[,...]",
         "tokens already in the cache before each test, not timed (default: 0)"},
        {"-t", "--threads", CLI_ARG_STR, &dummy, "N[,...]", "threads (default: 0, all CPUs)"},
        {"-ngl", "--n-gpu-layers", CLI_ARG_STR, &dummy, "N[,...]", "layers on the GPU, as run"},
        {"-ub", "--ubatch-size", CLI_ARG_STR, &dummy, "N[,...]", "physical batch size (default: 512)"},
        {"-ncmoe", "--n-cpu-moe", CLI_ARG_STR, &dummy, "N[,...]",
         "routed experts of the first N layers in RAM (default: 0)"},
        {"-r", "--repetitions", CLI_ARG_INT, &reps, "N", "repetitions of each test (default: 5)"},
        {"-o", "--output", CLI_ARG_STR, &output, "FORMAT", "md, csv, json or jsonl (default: md)"},
        {"-ot", "--override-tensor", CLI_ARG_LIST, &ot, "REGEX=DEV;...",
         "as llama-bench: overrides separated by ';' (DEV: CPU or CUDA0), the first match "
         "wins; one set per run (llama-bench's ',' between sets is not taken)"},
        {"--audit", NULL, CLI_ARG_BOOL, &audit, NULL,
         "also on the CPU: a 1024-token generation measuring host syncs and graph nodes per "
         "token and the token interval cv (always on with a GPU; printed on stderr)"},
        {"--host-loop", NULL, CLI_ARG_BOOL, &host_loop, NULL,
         "GPU: decode and sample token by token from the host instead of the autonomous graph"},
        {"--moe-routing-profile", NULL, CLI_ARG_STR, &routing, "FILE",
         "GPU: route by a table drawn from this routing profile (docs/ROUTING.md) instead of "
         "the model's routers, for forged models (said above the table and in the JSON)"},
    };
    const cli_args_def def = {"bench", "-m MODEL [options]",
                              "Prompt processing (ppN) and generation (tgN) speed in tokens/s, "
                              "mean ± sd over repetitions (like llama-bench): -m, -p, -n, -d, "
                              "-t, -ngl, -ub and -ncmoe take comma lists (every combination "
                              "runs, each row printed when done). Expert usage tracer (one "
                              "engine): --expert-trace-stats, --expert-trace-names, "
                              "--expert-trace-per-layer, --expert-trace-output FILE (or "
                              "LLAMA_EXPERT_TRACE_*).",
                              CLI_ARGS_MODEL | CLI_ARGS_CONTEXT | CLI_ARGS_THREADS, extra,
                              sizeof(extra) / sizeof(extra[0])};
    moe_tracer_config tc;
    if (cli_tracer_args("bench", &tc, &argc, argv)) return 2;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            cli_args_usage(stdout, &def);
            return 0;
        }
    if (take_lists(&argc, argv, given, N_L, &models, &pg)) return 2;
    for (int k = 0; k < N_L; k++)
        if (given[k].n) lists[k] = given[k];
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    if (models.n == 0) {
        fprintf(stderr, "hotmoe bench: no model given (-m FILE)\n");
        return 1;
    }
    bench_test tests[4 * BENCH_LIST_MAX * BENCH_LIST_MAX];
    const int n_tests = make_tests(&lists[L_P], &lists[L_N], &pg, &lists[L_D], tests,
                                   (int)(sizeof(tests) / sizeof(tests[0])));
    if (n_tests == 0) {
        fprintf(stderr, "hotmoe bench: no test: -p and -n are all 0 and no -pg\n");
        return 2;
    }
    if (reps < 1) {
        fprintf(stderr, "hotmoe bench: -r must be >= 1\n");
        return 2;
    }
    bench_fmt fmt;
    if (!bench_fmt_parse(output, &fmt)) {
        fprintf(stderr, "hotmoe bench: unknown output format '%s' (md, csv, json, jsonl)\n",
                output);
        return 2;
    }
    const int n_engines = models.n * lists[L_T].n * lists[L_NGL].n * lists[L_UB].n *
                          lists[L_NCMOE].n;
    if (n_engines > 1 && moe_tracer_config_enabled(&tc)) {
        fprintf(stderr, "hotmoe bench: the expert tracer takes one engine (no comma lists)\n");
        return 2;
    }
    /* -ot as llama-bench: ';' between overrides; the context takes them ','-separated */
    char *ot_ctx = NULL;
    if (ot.n > 1 || (ot.n == 1 && strchr(ot.v[0], ','))) {
        fprintf(stderr, "hotmoe bench: -ot: one set of overrides per run: separate overrides "
                        "with ';' (llama-bench's ',' or a second -ot starts another set, which "
                        "hotmoe bench does not run)\n");
        return 2;
    }
    if (ot.n == 1) {
        ot_ctx = strdup(ot.v[0]);
        if (!ot_ctx) {
            fprintf(stderr, "hotmoe bench: out of memory\n");
            return 1;
        }
        for (char *c = ot_ctx; *c; c++)
            if (*c == ';') *c = ',';
        a.override_tensor.v[0] = ot_ctx;
        a.override_tensor.n = 1;
    }
    a.routing_profile = routing;
    bench_cols cols = {.ngl = given[L_NGL].n > 0, .cpu_moe = a.cpu_moe,
                       .offl_th = a.moe_offload_threshold > 0, .ot = ot.n > 0,
                       .ot_width = ot.n ? (int)strlen(ot.v[0]) : 0};
    for (int k = 0; k < lists[L_NCMOE].n; k++) cols.n_cpu_moe |= lists[L_NCMOE].v[k] > 0;
    cols.n_ubatch = lists[L_UB].n > 1 || lists[L_UB].v[0] != 512;
    bench_out out;
    bench_out_init(&out, fmt, &cols);
    if (fmt == BENCH_MD && routing)
        printf("routing: synthetic, drawn from %s (--moe-routing-profile), not the model's "
               "routers\n", routing);
    const bench_opts bo = {.audit = audit, .host_loop = host_loop, .reps = reps,
                           .routing = routing, .ot = ot.n ? ot.v[0] : NULL};
    int status = 0;
    for (int mi = 0; mi < models.n && !status; mi++)
        for (int ti = 0; ti < lists[L_T].n && !status; ti++)
            for (int gi = 0; gi < lists[L_NGL].n && !status; gi++)
                for (int ui = 0; ui < lists[L_UB].n && !status; ui++)
                    for (int ci = 0; ci < lists[L_NCMOE].n && !status; ci++) {
                        a.model = models.v[mi];
                        a.n_threads = lists[L_T].v[ti];
                        a.n_gpu_layers = lists[L_NGL].v[gi];
                        a.n_ubatch = lists[L_UB].v[ui];
                        a.n_cpu_moe = lists[L_NCMOE].v[ci];
                        status = bench_engine(&a, &bo, tests, n_tests, &tc, &out);
                    }
    hm_error err = {0};
    if (bench_out_end(&out, &err) != HM_OK && !status) status = 1;
    free(ot_ctx);
    return status;
}
