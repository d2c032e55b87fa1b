/* bench_out.c - bench's output formats (bench_out.h). */
#include "cli/bench_out.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void bench_mean_sd(const double *v, int n, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = n ? s / n : 0;
    for (int i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(s2 / (n - 1)) : 0;
}

bool bench_fmt_parse(const char *name, bench_fmt *f) {
    static const char *names[] = {"md", "csv", "json", "jsonl"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i])) {
            *f = (bench_fmt)i;
            return true;
        }
    return false;
}

void bench_out_init(bench_out *o, bench_fmt fmt, const bench_cols *cols) {
    memset(o, 0, sizeof(*o));
    o->fmt = fmt;
    o->cols = *cols;
    if (o->cols.ot_width < 10) o->cols.ot_width = 10;
}

static void fmt_size(char *b, size_t n, uint64_t bytes) {
    if (bytes < (1ull << 30)) snprintf(b, n, "%.2f MiB", (double)bytes / (1 << 20));
    else snprintf(b, n, "%.2f GiB", (double)bytes / (1ull << 30));
}

void bench_fmt_params(char *b, size_t n, uint64_t p) {
    if (p < 1000000000ull) snprintf(b, n, "%.2f M", (double)p / 1e6);
    else snprintf(b, n, "%.2f B", (double)p / 1e9);
}

static void md_header(const bench_cols *c) {
    printf("| %-30s | %10s | %10s | %-10s |", "model", "size", "params", "backend");
    if (c->ngl) printf(" %3s |", "ngl");
    if (c->n_cpu_moe) printf(" %9s |", "n_cpu_moe");
    if (c->cpu_moe) printf(" %7s |", "cpu_moe");
    printf(" %7s |", "threads");
    if (c->n_ubatch) printf(" %8s |", "n_ubatch");
    if (c->offl_th) printf(" %7s |", "offl_th");
    if (c->ot) printf(" %-*s |", c->ot_width, "ot");
    printf(" %13s | %20s |\n", "test", "t/s");
    printf("| ------------------------------ | ---------: | ---------: | ---------- |");
    if (c->ngl) printf(" --: |");
    if (c->n_cpu_moe) printf(" --------: |");
    if (c->cpu_moe) printf(" ------: |");
    printf(" ------: |");
    if (c->n_ubatch) printf(" -------: |");
    if (c->offl_th) printf(" ------: |");
    if (c->ot) {
        putchar(' ');
        for (int i = 0; i < c->ot_width; i++) putchar('-');
        printf(" |");
    }
    printf(" ------------: | -------------------: |\n");
}

static void md_row(const bench_cols *c, const bench_env *e, const bench_row *r) {
    char s[32], p[32], ts[48];
    fmt_size(s, sizeof(s), e->size);
    bench_fmt_params(p, sizeof(p), e->params);
    double mean, sd;
    bench_mean_sd(r->ts, r->reps, &mean, &sd);
    snprintf(ts, sizeof(ts), "%.2f ± %.2f", mean, sd);
    printf("| %-30s | %10s | %10s | %-10s |", e->desc, s, p, e->backend);
    if (c->ngl) printf(" %3d |", e->n_gpu_layers);
    if (c->n_cpu_moe) printf(" %9d |", e->n_cpu_moe);
    if (c->cpu_moe) printf(" %7d |", e->cpu_moe ? 1 : 0);
    printf(" %7d |", e->n_threads);
    if (c->n_ubatch) printf(" %8d |", e->n_ubatch);
    if (c->offl_th) printf(" %7d |", e->offload_threshold);
    if (c->ot) printf(" %-*s |", c->ot_width, e->ot ? e->ot : "none");
    /* "±" is two bytes wide in UTF-8 but one column: pad by one more */
    printf(" %13s | %21s |\n", r->name, ts);
}

/* A CSV field: quoted when it holds a comma, a quote or a line break. */
static void csv_field(const char *s, bool last) {
    if (strpbrk(s, ",\"\n\r")) {
        putchar('"');
        for (const char *q = s; *q; q++) {
            if (*q == '"') putchar('"');
            putchar(*q);
        }
        putchar('"');
    } else {
        fputs(s, stdout);
    }
    putchar(last ? '\n' : ',');
}

static const char *const k_csv_cols[] = {
    "model_filename", "model_type", "model_size", "model_n_params", "backends", "n_batch",
    "n_ubatch", "n_threads", "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "cpu_moe",
    "tensor_buft_overrides", "test", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns",
    "avg_ts", "stddev_ts"};
#define N_CSV (sizeof(k_csv_cols) / sizeof(k_csv_cols[0]))

static void csv_row(const bench_env *e, const bench_row *r) {
    double ts, tsd, ns, nsd;
    bench_mean_sd(r->ts, r->reps, &ts, &tsd);
    bench_mean_sd(r->ns, r->reps, &ns, &nsd);
    char v[N_CSV][64];
    snprintf(v[2], 64, "%llu", (unsigned long long)e->size);
    snprintf(v[3], 64, "%llu", (unsigned long long)e->params);
    snprintf(v[5], 64, "%d", e->n_batch);
    snprintf(v[6], 64, "%d", e->n_ubatch);
    snprintf(v[7], 64, "%d", e->n_threads);
    snprintf(v[10], 64, "%d", e->n_gpu_layers);
    snprintf(v[11], 64, "%d", e->n_cpu_moe);
    snprintf(v[12], 64, "%d", e->cpu_moe ? 1 : 0);
    snprintf(v[15], 64, "%d", r->n_prompt);
    snprintf(v[16], 64, "%d", r->n_gen);
    snprintf(v[17], 64, "%d", r->depth);
    snprintf(v[18], 64, "%llu", (unsigned long long)llround(ns));
    snprintf(v[19], 64, "%llu", (unsigned long long)llround(nsd));
    snprintf(v[20], 64, "%.6f", ts);
    snprintf(v[21], 64, "%.6f", tsd);
    const char *f[N_CSV];
    for (size_t i = 0; i < N_CSV; i++) f[i] = v[i];
    f[0] = e->model_file, f[1] = e->desc, f[4] = e->backend, f[8] = e->type_k;
    f[9] = e->type_v, f[13] = e->ot ? e->ot : "none", f[14] = r->name;
    for (size_t i = 0; i < N_CSV; i++) csv_field(f[i], i + 1 == N_CSV);
}

static void json_row(hm_json *j, const bench_env *e, const bench_row *r) {
    double ts, tsd, ns, nsd;
    bench_mean_sd(r->ts, r->reps, &ts, &tsd);
    bench_mean_sd(r->ns, r->reps, &ns, &nsd);
    hm_json_obj_begin(j);
    hm_json_kstr(j, "model_filename", e->model_file);
    hm_json_kstr(j, "model_type", e->desc);
    hm_json_kuint(j, "model_size", e->size);
    hm_json_kuint(j, "model_n_params", e->params);
    hm_json_kstr(j, "backends", e->backend);
    hm_json_kint(j, "n_batch", e->n_batch);
    hm_json_kint(j, "n_ubatch", e->n_ubatch);
    hm_json_kint(j, "n_threads", e->n_threads);
    hm_json_kstr(j, "type_k", e->type_k);
    hm_json_kstr(j, "type_v", e->type_v);
    hm_json_kint(j, "n_gpu_layers", e->n_gpu_layers);
    hm_json_kint(j, "n_cpu_moe", e->n_cpu_moe);
    hm_json_kstr(j, "tensor_buft_overrides", e->ot ? e->ot : "none");
    hm_json_kbool(j, "cpu_moe", e->cpu_moe);
    hm_json_kint(j, "vram_budget_mib", e->vram_budget_mib);
    hm_json_kstr(j, "routing_profile", e->routing);
    hm_json_kint(j, "moe_offload_threshold", e->offload_threshold);
    hm_json_kstr(j, "test", r->name);
    hm_json_kint(j, "n_prompt", r->n_prompt);
    hm_json_kint(j, "n_gen", r->n_gen);
    hm_json_kint(j, "n_depth", r->depth);
    hm_json_kuint(j, "avg_ns", (uint64_t)llround(ns));
    hm_json_kuint(j, "stddev_ns", (uint64_t)llround(nsd));
    hm_json_kdouble(j, "avg_ts", ts);
    hm_json_kdouble(j, "stddev_ts", tsd);
    hm_json_key(j, "samples_ns");
    hm_json_arr_begin(j);
    for (int i = 0; i < r->reps; i++) hm_json_uint(j, (uint64_t)llround(r->ns[i]));
    hm_json_arr_end(j);
    hm_json_key(j, "samples_ts");
    hm_json_arr_begin(j);
    for (int i = 0; i < r->reps; i++) hm_json_double(j, r->ts[i]);
    hm_json_arr_end(j);
    const hm_gen_audit *x = e->audit;
    if (x && r->n_gen > 0) {
        const int gaps = x->n_tokens > 1 ? x->n_tokens - 1 : 1;
        hm_json_kstr(j, "decode_loop", x->gpu ? "gpu-graph" : "host");
        hm_json_kint(j, "audit_tokens", x->n_tokens);
        hm_json_kdouble(j, "host_syncs_per_token", (double)x->host_syncs / gaps);
        hm_json_kuint(j, "host_syncs_start_end", x->host_syncs_end);
        hm_json_kuint(j, "graph_nodes_per_token", x->graph_nodes);
        hm_json_kuint(j, "graph_kernels_per_token", x->kernel_nodes);
        hm_json_kuint(j, "stream_queries", x->stream_queries);
        hm_json_kdouble(j, "tg_cv", x->tg_cv);
        hm_json_kdouble(j, "audit_ts", x->tg_mean_s > 0 ? 1.0 / x->tg_mean_s : 0.0);
    }
    hm_json_obj_end(j);
}

/* One JSON object printed now (pretty inside the json array, one line for jsonl). */
static void json_print(bench_out *o, const bench_env *e, const bench_row *r) {
    hm_json j;
    hm_json_init_buf(&j, o->fmt == BENCH_JSON);
    json_row(&j, e, r);
    hm_error err;
    if (hm_json_finish(&j, &err) == HM_OK) {
        if (o->fmt == BENCH_JSON) fputs(o->n_rows ? ",\n" : "[\n", stdout);
        fputs(hm_json_data(&j, NULL), stdout);
        if (o->fmt == BENCH_JSONL) putchar('\n');
    }
    hm_json_free(&j);
}

void bench_out_row(bench_out *o, const bench_env *e, const bench_row *r) {
    switch (o->fmt) {
    case BENCH_MD:
        if (o->n_rows == 0) md_header(&o->cols);
        md_row(&o->cols, e, r);
        break;
    case BENCH_CSV:
        if (o->n_rows == 0)
            for (size_t i = 0; i < N_CSV; i++) csv_field(k_csv_cols[i], i + 1 == N_CSV);
        csv_row(e, r);
        break;
    case BENCH_JSON:
    case BENCH_JSONL: json_print(o, e, r); break;
    }
    o->n_rows++;
    fflush(stdout);
}

hm_status bench_out_end(bench_out *o, hm_error *err) {
    (void)err;
    if (o->fmt == BENCH_JSON) fputs(o->n_rows ? "\n]\n" : "[]\n", stdout);
    fflush(stdout);
    return HM_OK;
}
