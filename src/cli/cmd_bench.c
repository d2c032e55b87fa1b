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
#include "quant/qtypes.h"

typedef struct {
    const char *name; /* "pp512" */
    int n_prompt, n_gen;
    double *ts;       /* [reps] tokens/s */
    double *ns;       /* [reps] nanoseconds */
    int reps;
} bench_row;

static uint32_t lcg_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

#define BENCH_AUDIT_TOKENS 1024

typedef struct {
    bool on;
    int n_tokens;            /* tokens of the audit generation */
    hm_gen_audit a;
} bench_audit;

static hm_status run_test(cli_engine *e, hm_gen *g, int n_prompt, int n_gen, int32_t *toks,
                          float *logits, uint64_t *rng, hm_error *err) {
    hm_context_reset(e->ctx);
    if (n_prompt > 0) {
        for (int i = 0; i < n_prompt; i++) toks[i] = (int32_t)(lcg_next(rng) % (uint32_t)e->n_vocab);
        hm_status st = cli_engine_eval(e, toks, n_prompt, logits, NULL, err);
        if (st) return st;
    }
    if (n_gen <= 0) return HM_OK;
    /* one forward pass for the prompt token, n_gen - 1 for the generated ones (the last one by
     * hm_gen_end on the CPU; the GPU's limit is n_gen - 1 steps, so it never runs ahead) */
    int32_t t = (int32_t)(lcg_next(rng) % (uint32_t)e->n_vocab);
    hm_gen_set_max(g, n_gen - 1);
    hm_status st = hm_gen_prompt(g, &t, 1, err);
    for (int i = 0; i < n_gen - 1 && !st; i++) st = hm_gen_next(g, &t, err);
    if (!st) st = hm_gen_end(g, err);
    return st;
}

static void mean_sd(const double *v, int n, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = n ? s / n : 0;
    for (int i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(s2 / (n - 1)) : 0;
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

/* The weight type holding most bytes ("Q4_K", "MXFP4", ...), as the model description. */
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

static void fmt_size(char *b, size_t n, uint64_t bytes) {
    if (bytes < (1ull << 30)) snprintf(b, n, "%.2f MiB", (double)bytes / (1 << 20));
    else snprintf(b, n, "%.2f GiB", (double)bytes / (1ull << 30));
}

static void fmt_params(char *b, size_t n, uint64_t p) {
    if (p < 1000000000ull) snprintf(b, n, "%.2f M", (double)p / 1e6);
    else snprintf(b, n, "%.2f B", (double)p / 1e9);
}

/* The placement as bench reports it: llama-bench's columns where it has them. */
typedef struct {
    bool ngl;              /* show the ngl column: on the GPU, or -ngl given */
    int n_gpu_layers;
    bool cpu_moe;          /* --cpu-moe (a column when on) */
    int n_cpu_moe;         /* a column when > 0 */
    const char *ot;        /* -ot as given ("a=CPU;b=CPU"), NULL: none (no column) */
    int vram_budget_mib;   /* 0: not given */
    int offload_threshold; /* --moe-offload-threshold (a column when > 0) */
} bench_place;

static void print_md(const cli_engine *e, const bench_place *pl, const char *desc,
                     uint64_t size, uint64_t params, const bench_row *rows, int n_rows) {
    char s[32], p[32];
    fmt_size(s, sizeof(s), size);
    fmt_params(p, sizeof(p), params);
    const int ot_w = pl->ot && strlen(pl->ot) > 10 ? (int)strlen(pl->ot) : 10;
    printf("| %-30s | %10s | %10s | %-10s |", "model", "size", "params", "backend");
    if (pl->ngl) printf(" %3s |", "ngl");
    if (pl->n_cpu_moe > 0) printf(" %9s |", "n_cpu_moe");
    if (pl->cpu_moe) printf(" %7s |", "cpu_moe");
    printf(" %7s |", "threads");
    if (pl->offload_threshold > 0) printf(" %7s |", "offl_th");
    if (pl->ot) printf(" %-*s |", ot_w, "ot");
    printf(" %13s | %20s |\n", "test", "t/s");
    printf("| ------------------------------ | ---------: | ---------: | ---------- |");
    if (pl->ngl) printf(" --: |");
    if (pl->n_cpu_moe > 0) printf(" --------: |");
    if (pl->cpu_moe) printf(" ------: |");
    printf(" ------: |");
    if (pl->offload_threshold > 0) printf(" ------: |");
    if (pl->ot) {
        putchar(' ');
        for (int i = 0; i < ot_w; i++) putchar('-');
        printf(" |");
    }
    printf(" ------------: | -------------------: |\n");
    for (int r = 0; r < n_rows; r++) {
        double mean, sd;
        mean_sd(rows[r].ts, rows[r].reps, &mean, &sd);
        char ts[48];
        snprintf(ts, sizeof(ts), "%.2f ± %.2f", mean, sd);
        printf("| %-30s | %10s | %10s | %-10s |", desc, s, p, cli_engine_backend(e));
        if (pl->ngl) printf(" %3d |", pl->n_gpu_layers);
        if (pl->n_cpu_moe > 0) printf(" %9d |", pl->n_cpu_moe);
        if (pl->cpu_moe) printf(" %7d |", 1);
        printf(" %7d |", e->n_threads);
        if (pl->offload_threshold > 0) printf(" %7d |", pl->offload_threshold);
        if (pl->ot) printf(" %-*s |", ot_w, pl->ot);
        /* "±" is two bytes wide in UTF-8 but one column: pad by one more */
        printf(" %13s | %21s |\n", rows[r].name, ts);
    }
}

static hm_status print_json(const cli_engine *e, const cli_common_args *a,
                            const bench_place *pl, const char *desc,
                            uint64_t size, uint64_t params, const bench_row *rows, int n_rows,
                            const bench_audit *au) {
    hm_json j;
    hm_json_init_file(&j, stdout, true);
    hm_json_arr_begin(&j);
    for (int r = 0; r < n_rows; r++) {
        const bench_row *row = &rows[r];
        double ts_mean, ts_sd, ns_mean, ns_sd;
        mean_sd(row->ts, row->reps, &ts_mean, &ts_sd);
        mean_sd(row->ns, row->reps, &ns_mean, &ns_sd);
        hm_json_obj_begin(&j);
        hm_json_key(&j, "model_filename"); hm_json_str(&j, a->model);
        hm_json_key(&j, "model_type"); hm_json_str(&j, desc);
        hm_json_key(&j, "model_size"); hm_json_uint(&j, size);
        hm_json_key(&j, "model_n_params"); hm_json_uint(&j, params);
        hm_json_key(&j, "backends"); hm_json_str(&j, cli_engine_backend(e));
        hm_json_key(&j, "n_batch"); hm_json_int(&j, a->n_batch);
        hm_json_key(&j, "n_ubatch"); hm_json_int(&j, a->n_ubatch);
        hm_json_key(&j, "n_threads"); hm_json_int(&j, e->n_threads);
        hm_json_key(&j, "type_k"); hm_json_str(&j, a->cache_type_k);
        hm_json_key(&j, "type_v"); hm_json_str(&j, a->cache_type_v);
        hm_json_key(&j, "n_gpu_layers"); hm_json_int(&j, pl->n_gpu_layers);
        hm_json_key(&j, "n_cpu_moe"); hm_json_int(&j, pl->n_cpu_moe);
        hm_json_key(&j, "tensor_buft_overrides"); hm_json_str(&j, pl->ot ? pl->ot : "none");
        hm_json_key(&j, "cpu_moe"); hm_json_bool(&j, pl->cpu_moe);
        hm_json_key(&j, "vram_budget_mib"); hm_json_int(&j, pl->vram_budget_mib);
        hm_json_key(&j, "routing_profile"); hm_json_str(&j, a->routing_profile);
        hm_json_key(&j, "moe_offload_threshold"); hm_json_int(&j, pl->offload_threshold);
        hm_json_key(&j, "test"); hm_json_str(&j, row->name);
        hm_json_key(&j, "n_prompt"); hm_json_int(&j, row->n_prompt);
        hm_json_key(&j, "n_gen"); hm_json_int(&j, row->n_gen);
        hm_json_key(&j, "avg_ns"); hm_json_uint(&j, (uint64_t)llround(ns_mean));
        hm_json_key(&j, "stddev_ns"); hm_json_uint(&j, (uint64_t)llround(ns_sd));
        hm_json_key(&j, "avg_ts"); hm_json_double(&j, ts_mean);
        hm_json_key(&j, "stddev_ts"); hm_json_double(&j, ts_sd);
        hm_json_key(&j, "samples_ns");
        hm_json_arr_begin(&j);
        for (int i = 0; i < row->reps; i++) hm_json_uint(&j, (uint64_t)llround(row->ns[i]));
        hm_json_arr_end(&j);
        hm_json_key(&j, "samples_ts");
        hm_json_arr_begin(&j);
        for (int i = 0; i < row->reps; i++) hm_json_double(&j, row->ts[i]);
        hm_json_arr_end(&j);
        if (au->on && row->n_gen > 0) {
            const hm_gen_audit *x = &au->a;
            int gaps = x->n_tokens > 1 ? x->n_tokens - 1 : 1;
            hm_json_key(&j, "decode_loop"); hm_json_str(&j, x->gpu ? "gpu-graph" : "host");
            hm_json_key(&j, "audit_tokens"); hm_json_int(&j, x->n_tokens);
            hm_json_key(&j, "host_syncs_per_token");
            hm_json_double(&j, (double)x->host_syncs / gaps);
            hm_json_key(&j, "host_syncs_start_end"); hm_json_uint(&j, x->host_syncs_end);
            hm_json_key(&j, "graph_nodes_per_token"); hm_json_uint(&j, x->graph_nodes);
            hm_json_key(&j, "graph_kernels_per_token"); hm_json_uint(&j, x->kernel_nodes);
            hm_json_key(&j, "stream_queries"); hm_json_uint(&j, x->stream_queries);
            hm_json_key(&j, "tg_cv"); hm_json_double(&j, x->tg_cv);
            hm_json_key(&j, "audit_ts");
            hm_json_double(&j, x->tg_mean_s > 0 ? 1.0 / x->tg_mean_s : 0.0);
        }
        hm_json_obj_end(&j);
    }
    hm_json_arr_end(&j);
    hm_error err = {0};
    hm_status st = hm_json_finish(&j, &err);
    printf("\n");
    hm_json_free(&j);
    return st;
}

int cmd_bench(int argc, char **argv) {
    int n_prompt = 512, n_gen = 128, reps = 5;
    bool audit = false, host_loop = false;
    const char *output = "md", *routing = NULL;
    cli_str_list ot = {{0}, 0};
    const cli_arg_spec extra[] = {
        {"-p", "--n-prompt", CLI_ARG_INT, &n_prompt, "N", "prompt tokens of the pp test (default: "
                                                          "512; 0 = skip)"},
        {"-n", "--n-gen", CLI_ARG_INT, &n_gen, "N", "generated tokens of the tg test (default: "
                                                    "128; 0 = skip)"},
        {"-r", "--repetitions", CLI_ARG_INT, &reps, "N", "repetitions of each test (default: 5)"},
        {"-o", "--output", CLI_ARG_STR, &output, "FORMAT", "md or json (default: md)"},
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
                              "mean ± sd over repetitions (like llama-bench). Expert usage "
                              "tracer: --expert-trace-stats, --expert-trace-names, "
                              "--expert-trace-per-layer, --expert-trace-output FILE (or "
                              "LLAMA_EXPERT_TRACE_*).",
                              CLI_ARGS_MODEL | CLI_ARGS_CONTEXT | CLI_ARGS_THREADS, extra,
                              sizeof(extra) / sizeof(extra[0])};
    moe_tracer_config tc;
    if (cli_tracer_args("bench", &tc, &argc, argv)) return 2;
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    if (n_prompt < 0 || n_gen < 0 || (n_prompt == 0 && n_gen == 0)) {
        fprintf(stderr, "hotmoe bench: -p and -n must be >= 0 and not both 0\n");
        return 2;
    }
    if (reps < 1) {
        fprintf(stderr, "hotmoe bench: -r must be >= 1\n");
        return 2;
    }
    if (strcmp(output, "md") && strcmp(output, "json")) {
        fprintf(stderr, "hotmoe bench: unknown output format '%s' (md, json)\n", output);
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
    bench_place pl = {.ngl = false, .n_gpu_layers = a.n_gpu_layers, .cpu_moe = a.cpu_moe,
                            .n_cpu_moe = a.n_cpu_moe, .ot = ot.n ? ot.v[0] : NULL,
                            .vram_budget_mib = a.vram_budget_mib,
                            .offload_threshold = a.moe_offload_threshold};
    /* the context must hold the longest test */
    int need = n_prompt > n_gen ? n_prompt : n_gen;
    int n_ctx_default = need < 512 ? 512 : need;
    if ((a.n_gpu_layers > 0 || audit) && n_ctx_default < BENCH_AUDIT_TOKENS + 1)
        n_ctx_default = BENCH_AUDIT_TOKENS + 1;
    a.routing_profile = routing;
    cli_engine e;
    rc = cli_engine_open(&e, "bench", &a, 0, n_ctx_default);
    free(ot_ctx); /* the context has its own copy */
    a.override_tensor.n = 0;
    if (rc) return rc;
    pl.ngl = hm_context_gpu(e.ctx) != NULL || a.n_gpu_layers > 0;
    moe_tracer *tr = NULL;
    if (cli_tracer_attach(&e, &tc, a.model, &tr)) {
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
    char desc[96];
    uint64_t params = model_params(e.model), size = hm_model_weight_bytes(e.model);
    char pbuf[32];
    fmt_params(pbuf, sizeof(pbuf), params);
    snprintf(desc, sizeof(desc), "%s %s %s", hm_model_arch(e.model)->name, pbuf, main_type(e.model));

    bench_row rows[2];
    int n_rows = 0;
    char names[2][24];
    if (n_prompt > 0) {
        snprintf(names[n_rows], sizeof(names[0]), "pp%d", n_prompt);
        rows[n_rows] = (bench_row){names[n_rows], n_prompt, 0, NULL, NULL, reps};
        n_rows++;
    }
    if (n_gen > 0) {
        snprintf(names[n_rows], sizeof(names[0]), "tg%d", n_gen);
        rows[n_rows] = (bench_row){names[n_rows], 0, n_gen, NULL, NULL, reps};
        n_rows++;
    }
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n_prompt > 0 ? n_prompt : 1));
    float *logits = malloc(sizeof(float) * (size_t)e.n_vocab);
    bool ok = toks && logits;
    for (int r = 0; r < n_rows && ok; r++) {
        rows[r].ts = calloc((size_t)reps, sizeof(double));
        rows[r].ns = calloc((size_t)reps, sizeof(double));
        ok = rows[r].ts && rows[r].ns;
    }
    hm_error err = {0};
    hm_status st = ok ? HM_OK : hm_error_set(&err, HM_ERR_NOMEM, "out of memory");
    /* the generator: greedy, no penalties (tokens need no sampling flags, as llama-bench) */
    bench_audit au = {0};
    au.on = n_gen > 0 && (audit || hm_context_gpu(e.ctx));
    au.n_tokens = hm_context_n_ctx(e.ctx) - 1 < BENCH_AUDIT_TOKENS ? hm_context_n_ctx(e.ctx) - 1
                                                                    : BENCH_AUDIT_TOKENS;
    hm_gen *gen = NULL;
    if (!st && n_gen > 0) {
        sample_params sp = sample_params_default();
        sp.temperature = 0.0f;
        sp.penalty_last_n = 0;
        hm_gen_params gp = hm_gen_default_params();
        gp.host_loop = host_loop;
        gp.audit_tokens = au.on ? au.n_tokens : 0;
        st = hm_gen_init(e.ctx, &sp, &gp, &gen, &err);
    }
    uint64_t rng = 42;
    /* warm-up: the prompt test once, a short generation */
    if (!st && n_prompt > 0) st = run_test(&e, gen, n_prompt, 0, toks, logits, &rng, &err);
    if (!st && n_gen > 0)
        st = run_test(&e, gen, 0, n_gen < 16 ? n_gen : 16, toks, logits, &rng, &err);
    for (int r = 0; r < n_rows && !st; r++) {
        for (int i = 0; i < reps && !st; i++) {
            double t0 = cli_now();
            st = run_test(&e, gen, rows[r].n_prompt, rows[r].n_gen, toks, logits, &rng, &err);
            double dt = cli_now() - t0;
            rows[r].ns[i] = dt * 1e9;
            rows[r].ts[i] = (double)(rows[r].n_prompt + rows[r].n_gen) / (dt > 0 ? dt : 1e-9);
        }
    }
    if (!st && au.on && au.n_tokens >= 2) { /* the audit generation: prompt + n_tokens */
        au.on = false;
        st = run_test(&e, gen, 0, au.n_tokens + 1, toks, logits, &rng, &err);
        if (!st) {
            hm_gen_audit_get(gen, &au.a);
            au.on = true;
            if (audit) cli_engine_print_audit(&e, gen);
        }
    } else {
        au.on = false;
    }
    if (!st) {
        if (!strcmp(output, "md") && routing)
            printf("routing: synthetic, drawn from %s (--moe-routing-profile), not the model's "
                   "routers\n", routing);
        if (!strcmp(output, "md")) print_md(&e, &pl, desc, size, params, rows, n_rows);
        else st = print_json(&e, &a, &pl, desc, size, params, rows, n_rows, &au);
    }
    hm_gen_free(gen);
    if (st) fprintf(stderr, "hotmoe bench: %s\n", err.msg[0] ? err.msg : "JSON output failed");
    for (int r = 0; r < n_rows; r++) {
        free(rows[r].ts);
        free(rows[r].ns);
    }
    free(toks);
    free(logits);
    int tr_rc = cli_tracer_finish(&e, tr);
    cli_engine_close(&e);
    return st || tr_rc ? 1 : 0;
}
