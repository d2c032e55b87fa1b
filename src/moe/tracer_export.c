/* tracer_export.c - the tracer's summary, JSON (docs/LEARN.md schema) and CSV output.
 *
 * DESIGN: every output reads the counters through the public readers (atomic loads), so an
 * export taken while other threads still record sees a consistent-enough snapshot (each counter
 * is exact for the record calls that finished before it was read). Sorting for the summary uses
 * a stable order: count descending, then expert id ascending.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "moe/tracer_internal.h"

typedef struct {
    int id;
    uint64_t n;
} id_count;

static int cmp_id_count(const void *a, const void *b) {
    const id_count *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static void print_sorted(FILE *f, id_count *v, int n, uint64_t total, const char *indent) {
    qsort(v, (size_t)n, sizeof(*v), cmp_id_count);
    for (int i = 0; i < n; i++) {
        if (!v[i].n) continue;
        fprintf(f, "%sExpert %3d: %8llu activations (%.2f%%)\n", indent, v[i].id,
                (unsigned long long)v[i].n, total ? 100.0 * (double)v[i].n / (double)total : 0.0);
    }
}

void moe_tracer_print_summary(const moe_tracer *t, FILE *f) {
    if (!t || !f) return;
    id_count *v = malloc(sizeof(*v) * (size_t)t->n_expert);
    if (!v) return;
    uint64_t total = 0;
    for (int e = 0; e < t->n_expert; e++) {
        v[e] = (id_count){e, moe_tracer_expert_total(t, e)};
        total += v[e].n;
    }
    fprintf(f, "\n=== Expert Usage Statistics ===\n");
    fprintf(f, "Total tokens processed: %llu\n", (unsigned long long)moe_tracer_total_tokens(t));
    fprintf(f, "Expert activations (all layers): %llu\n", (unsigned long long)total);
    if (moe_tracer_rejected(t))
        fprintf(f, "Rejected ids (out of range): %llu\n",
                (unsigned long long)moe_tracer_rejected(t));
    fprintf(f, "\nExpert activation counts:\n");
    print_sorted(f, v, t->n_expert, total, "  ");
    if (t->per_layer) {
        fprintf(f, "\nPer-layer breakdown:\n");
        for (int l = 0; l < t->n_layer; l++) {
            uint64_t calls = moe_tracer_calls(t, l), lt = 0;
            if (!calls) continue;
            for (int e = 0; e < t->n_expert; e++) {
                v[e] = (id_count){e, moe_tracer_hits(t, l, e)};
                lt += v[e].n;
            }
            fprintf(f, "  Layer %d: %llu calls, %llu tokens\n", l, (unsigned long long)calls,
                    (unsigned long long)moe_tracer_tokens(t, l));
            print_sorted(f, v, t->n_expert, lt, "    ");
        }
    }
    free(v);
}

/* Seed 000's map of counts: {"<id>": hits, ...}, ids ascending, experts with hits only. */
static void write_id_counts(const moe_tracer *t, hm_json *j, int layer) {
    char id[16];
    hm_json_obj_begin(j);
    for (int e = 0; e < t->n_expert; e++) {
        uint64_t n = layer < 0 ? moe_tracer_expert_total(t, e) : moe_tracer_hits(t, layer, e);
        if (!n) continue;
        snprintf(id, sizeof(id), "%d", e);
        hm_json_kuint(j, id, n);
    }
    hm_json_obj_end(j);
}

void moe_tracer_write_json(const moe_tracer *t, hm_json *j) {
    if (!t) {
        hm_json_null(j);
        return;
    }
    hm_json_obj_begin(j);
    hm_json_kstr(j, "format", "hotmoe-expert-usage");
    hm_json_kint(j, "version", 1);
    if (t->arch || t->name || t->file) {
        hm_json_key(j, "model");
        hm_json_obj_begin(j);
        if (t->arch) hm_json_kstr(j, "arch", t->arch);
        if (t->name) hm_json_kstr(j, "name", t->name);
        if (t->file) hm_json_kstr(j, "file", t->file);
        hm_json_obj_end(j);
    }
    hm_json_kint(j, "n_layer", t->n_layer);
    hm_json_kint(j, "n_expert", t->n_expert);
    hm_json_kint(j, "n_expert_used", t->n_used);
    hm_json_kuint(j, "prompts", moe_tracer_prompts(t));
    hm_json_kuint(j, "total_tokens", moe_tracer_total_tokens(t));
    hm_json_kuint(j, "rejected", moe_tracer_rejected(t));
    hm_json_key(j, "experts");
    hm_json_arr_begin(j);
    for (int e = 0; e < t->n_expert; e++) hm_json_uint(j, moe_tracer_expert_total(t, e));
    hm_json_arr_end(j);
    hm_json_key(j, "layers");
    hm_json_arr_begin(j);
    for (int l = 0; l < t->n_layer; l++) {
        uint64_t tot = 0;
        for (int e = 0; e < t->n_expert; e++) tot += moe_tracer_hits(t, l, e);
        hm_json_obj_begin(j);
        hm_json_kint(j, "layer", l);
        hm_json_kuint(j, "calls", moe_tracer_calls(t, l));
        hm_json_kuint(j, "tokens", moe_tracer_tokens(t, l));
        hm_json_kuint(j, "expert_hits_total", tot);
        uint64_t ns = moe_tracer_time_ns(t, l);
        if (ns) hm_json_kdouble(j, "moe_time_us", (double)ns / 1000.0);
        hm_json_key(j, "experts");
        hm_json_arr_begin(j);
        for (int e = 0; e < t->n_expert; e++) hm_json_uint(j, moe_tracer_hits(t, l, e));
        hm_json_arr_end(j);
        hm_json_obj_end(j);
    }
    hm_json_arr_end(j);
    /* seed 000's keys (beside total_tokens above): the same counts as maps keyed by id */
    hm_json_key(j, "expert_activations");
    write_id_counts(t, j, -1);
    if (t->per_layer) {
        char id[16];
        hm_json_key(j, "per_layer");
        hm_json_obj_begin(j);
        for (int l = 0; l < t->n_layer; l++) {
            if (!moe_tracer_calls(t, l)) continue;
            snprintf(id, sizeof(id), "%d", l);
            hm_json_key(j, id);
            write_id_counts(t, j, l);
        }
        hm_json_obj_end(j);
    }
    hm_json_obj_end(j);
}

hm_status moe_tracer_write_csv(const moe_tracer *t, FILE *f, hm_error *err) {
    if (!t || !f) return hm_error_set(err, HM_ERR_ARG, "tracer: NULL");
    fprintf(f, "layer,expert,hits,calls,tokens\n");
    for (int l = 0; l < t->n_layer; l++) {
        uint64_t calls = moe_tracer_calls(t, l), tok = moe_tracer_tokens(t, l);
        if (!calls) continue;
        for (int e = 0; e < t->n_expert; e++)
            fprintf(f, "%d,%d,%llu,%llu,%llu\n", l, e, (unsigned long long)moe_tracer_hits(t, l, e),
                    (unsigned long long)calls, (unsigned long long)tok);
    }
    if (ferror(f)) return hm_error_set(err, HM_ERR_IO, "tracer: write error");
    return HM_OK;
}

static bool ends_with_csv(const char *p) {
    size_t n = strlen(p);
    if (n < 4) return false;
    return p[n - 4] == '.' && tolower((unsigned char)p[n - 3]) == 'c' &&
           tolower((unsigned char)p[n - 2]) == 's' && tolower((unsigned char)p[n - 1]) == 'v';
}

hm_status moe_tracer_save(const moe_tracer *t, const char *path, hm_error *err) {
    if (!t || !path) return hm_error_set(err, HM_ERR_ARG, "tracer: NULL");
    FILE *f = fopen(path, "wb");
    if (!f) return hm_error_set(err, HM_ERR_IO, "cannot write %s", path);
    hm_status st;
    if (ends_with_csv(path)) {
        st = moe_tracer_write_csv(t, f, err);
    } else {
        hm_json j;
        hm_json_init_file(&j, f, true);
        moe_tracer_write_json(t, &j);
        st = hm_json_finish(&j, err);
        hm_json_free(&j);
        if (st == HM_OK) fputc('\n', f);
    }
    if (fclose(f) != 0 && st == HM_OK) st = hm_error_set(err, HM_ERR_IO, "cannot write %s", path);
    return st;
}

hm_status moe_tracer_finish(moe_tracer *t, hm_error *err) {
    if (!t) return HM_OK;
    if (t->counting && (t->stats || t->per_layer)) moe_tracer_print_summary(t, t->log);
    if (t->output) {
        hm_status st = moe_tracer_save(t, t->output, err);
        if (st != HM_OK) return st;
        fprintf(t->log, "[EXPERT-TRACE] Statistics exported to %s\n", t->output);
    }
    return HM_OK;
}
