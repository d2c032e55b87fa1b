/* bench_out.h - `hotmoe bench`'s rows in llama-bench's formats (cli/ only): md (a table, its
 * header before the first row), csv (a header line, then a line per row), json (one array) and
 * jsonl (an object per line); each row is printed when its test is done.
 *
 * DESIGN: the caller describes each row's engine (bench_env: the model, its backend, threads,
 * the placement) and result (bench_row); the md columns beyond llama-bench's defaults (ngl,
 * n_cpu_moe, cpu_moe, n_ubatch, offl_th, ot) are chosen once, at the first row, from what the
 * sweep varies or sets (bench_cols). JSON keys are llama-bench's, plus hotmoe's placement keys.
 */
#ifndef HM_CLI_BENCH_OUT_H
#define HM_CLI_BENCH_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/json.h"
#include "runtime/generate.h"

typedef struct {
    char name[48];   /* "pp512", "tg128", "pp512+tg128", "... @ d512" */
    int n_prompt, n_gen, depth;
    double *ts;      /* [reps] tokens/s */
    double *ns;      /* [reps] nanoseconds */
    int reps;
} bench_row;

/* The engine a row ran on. */
typedef struct {
    const char *model_file, *desc; /* path; "olmoe 1.18 M q8_0" */
    uint64_t size, params;
    const char *backend;
    int n_threads, n_batch, n_ubatch;
    const char *type_k, *type_v;
    int n_gpu_layers, n_cpu_moe, vram_budget_mib, offload_threshold;
    bool cpu_moe;
    const char *ot;                 /* -ot as given, or NULL */
    const char *routing;            /* --moe-routing-profile, or NULL */
    const hm_gen_audit *audit;      /* tg rows' audit (json), or NULL */
} bench_env;

/* md columns besides model, size, params, backend, threads, test and t/s. */
typedef struct {
    bool ngl, n_cpu_moe, cpu_moe, n_ubatch, offl_th, ot;
    int ot_width;
} bench_cols;

typedef enum { BENCH_MD = 0, BENCH_CSV, BENCH_JSON, BENCH_JSONL } bench_fmt;

typedef struct {
    bench_fmt fmt;
    bench_cols cols;
    int n_rows;
    hm_json j; /* json: the array */
} bench_out;

/* "md", "csv", "json", "jsonl" -> *f; false for another name. */
bool bench_fmt_parse(const char *name, bench_fmt *f);
void bench_out_init(bench_out *o, bench_fmt fmt, const bench_cols *cols);
/* Prints one row (and, before the first, the header). */
void bench_out_row(bench_out *o, const bench_env *env, const bench_row *row);
/* Closes the output (json: the array); HM_OK, or the JSON writer's error. */
hm_status bench_out_end(bench_out *o, hm_error *err);

void bench_mean_sd(const double *v, int n, double *mean, double *sd);
/* An element count as llama-bench prints it: "1.18 M" below 1e9, else "30.53 B". */
void bench_fmt_params(char *b, size_t n, uint64_t p);

#endif
