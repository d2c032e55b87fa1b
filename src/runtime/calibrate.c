/* calibrate.c - measuring the rates of the offload cost model at start (calibrate.h): host read
 * bandwidth, the CPU's expert products per weight type, host->device bandwidth through a copy
 * lane; the cache decision; the rates of a layer; the report lines.
 *
 * DESIGN: every measurement runs the code the real path runs (the pool's item jobs over the
 * mapped expert bytes, cpu_moe_matmul on the model's own expert tensors, the copy lane) and
 * keeps the best of a few repetitions after an untimed one (first touch of the pages, the
 * driver's set-up): the best is the machine's rate, the others are noise from a shared host.
 * Each measurement stops after a small time budget, so the whole calibration takes a few tens
 * of milliseconds on the GPU machine and well under a second on a large model.
 */
#include "runtime/calibrate.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/text.h"
#include "cpu/matmul.h"
#include "cuda/cuda_host.h"
#include "quant/qtypes.h"
#include "runtime/calibrate_internal.h"

static const size_t k_read_max = 128u << 20; /* bytes of one host read pass */
static const size_t k_read_item = 4u << 20;  /* bytes per pool item */
static const size_t k_h2d_max = 128u << 20;  /* bytes of one timed copy */
static const double k_budget_s = 0.012;      /* timed repetitions of one measurement */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- (b) host read bandwidth ---- */

typedef struct {
    offload_range *items; /* [n] pieces of at most k_read_item bytes */
    int64_t n;
    uint64_t *sink; /* [nth] sums, so the reads are not optimised away */
} read_job;

static uint64_t read_sum(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    const size_t m = n / 8;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t i = 0;
    for (; i + 4 <= m; i += 4) {
        a0 += q[i];
        a1 += q[i + 1];
        a2 += q[i + 2];
        a3 += q[i + 3];
    }
    for (; i < m; i++) a0 += q[i];
    return a0 ^ a1 ^ a2 ^ a3;
}

static void read_item(void *ctx, int64_t item, int ith) {
    read_job *j = ctx;
    j->sink[ith] += read_sum(j->items[item].p, j->items[item].n);
}

/* up to k_read_max bytes of the expert matrices, layer by layer, cut into pool items */
static hm_status read_items(const hm_model *m, read_job *j, uint64_t *total, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(m);
    int64_t cap = 64;
    j->items = malloc(sizeof(*j->items) * (size_t)cap);
    j->n = 0;
    *total = 0;
    for (int il = 0; il < hp->n_layer && *total < k_read_max && j->items; il++) {
        const hm_layer *L = hm_model_layer(m, il);
        const hm_tensor *ts[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int i = 0; i < 3 && *total < k_read_max; i++) {
            if (!ts[i]->data) continue;
            size_t n = ts[i]->row_size * (size_t)ts[i]->ne[1] * (size_t)ts[i]->ne[2];
            if (n > k_read_max - *total) n = (size_t)(k_read_max - *total);
            const uint8_t *p = ts[i]->data;
            for (size_t o = 0; o < n; o += k_read_item) {
                if (j->n == cap) {
                    cap *= 2;
                    offload_range *g = realloc(j->items, sizeof(*g) * (size_t)cap);
                    if (!g) {
                        free(j->items);
                        j->items = NULL;
                        break;
                    }
                    j->items = g;
                }
                j->items[j->n].p = p + o;
                j->items[j->n].n = n - o < k_read_item ? n - o : k_read_item;
                j->n++;
            }
            if (!j->items) break;
            *total += n;
        }
    }
    if (!j->items) return hm_error_set(err, HM_ERR_NOMEM, "calibration: out of memory");
    return HM_OK;
}

static hm_status measure_read(const hm_model *m, tp_pool *pool, calib_result *c, hm_error *err) {
    read_job j = {0};
    uint64_t total = 0;
    hm_status st = read_items(m, &j, &total, err);
    if (st != HM_OK) return st;
    const int nth = pool ? tp_size(pool) : 1;
    j.sink = calloc((size_t)nth, sizeof(*j.sink));
    if (!j.sink) {
        free(j.items);
        return hm_error_set(err, HM_ERR_NOMEM, "calibration: out of memory");
    }
    double best = 0, spent = 0;
    for (int pass = 0; total > 0 && pass < 12 && (pass < 4 || spent < k_budget_s); pass++) {
        const double t0 = now_s();
        tp_run_items(pool, read_item, &j, j.n);
        const double dt = now_s() - t0;
        if (pass == 0) continue; /* pages in, untimed */
        spent += dt;
        if (dt > 0 && (double)total / dt > best) best = (double)total / dt;
    }
    volatile uint64_t keep = 0;
    for (int i = 0; i < nth; i++) keep += j.sink[i];
    (void)keep;
    free(j.sink);
    free(j.items);
    c->host_read_bytes = total;
    c->host_read_bps = best > 0 ? best : CALIB_DEFAULT_HOST_READ;
    return HM_OK;
}

/* ---- (c) the CPU's expert products ---- */

static hm_status best_time(tp_pool *pool, const cpu_moe_args *a, void *scratch, size_t ss,
                           double *best, hm_error *err) {
    *best = INFINITY;
    double spent = 0;
    for (int rep = 0; rep < 200 && (rep < 4 || spent < k_budget_s); rep++) {
        const double t0 = now_s();
        hm_status st = cpu_moe_matmul(pool, NULL, a, scratch, ss, err);
        const double dt = now_s() - t0;
        if (st != HM_OK) return st;
        if (rep == 0) continue; /* warm: pages, caches, the pool's threads */
        spent += dt;
        if (dt < *best) *best = dt;
    }
    if (!(*best > 0)) *best = 1e-9; /* a clock too coarse for a tiny product */
    return HM_OK;
}

static hm_status measure_type(const hm_model *m, tp_pool *pool, uint32_t type, calib_type *out,
                              hm_error *err) {
    const hm_tensor *t = NULL;
    if (!calib_type_tensor(m, type, &t))
        return hm_error_set(err, HM_ERR_ARG, "calibration: no expert tensor of type %s",
                            hm_type_name(type));
    const hm_hparams *hp = hm_model_hparams(m);
    const int64_t k = t->ne[0], rows = t->ne[1], E = t->ne[2], B = CALIB_BATCH;
    int K = (int)hp->n_expert_used;
    if (K > E) K = (int)E;
    if (K < 1) K = 1;
    float *x = malloc(sizeof(float) * (size_t)(B * k));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(B * K));
    float *y = malloc(sizeof(float) * (size_t)(B * K * rows));
    if (!x || !ids || !y) {
        free(x);
        free(ids);
        free(y);
        return hm_error_set(err, HM_ERR_NOMEM, "calibration: out of memory");
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < B * k; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) * 0x1p-23 - 1.0);
    }
    for (int64_t i = 0; i < B * K; i++) ids[i] = (int32_t)(i % K);
    cpu_moe_args a = {.wtype = t->type, .w = t->data, .n_expert = E, .n_rows = rows, .k = k,
                      .x = x, .x_per_slot = 0, .ids = ids, .n_tok = B, .n_used = K, .y = y,
                      .x8 = t->x8, .xq = NULL, .w_stride = t->expert_stride};
    size_t ss = cpu_moe_scratch_size(&a);
    a.n_tok = 1;
    const size_t ss1 = cpu_moe_scratch_size(&a);
    if (ss1 > ss) ss = ss1;
    void *scratch = malloc(ss ? ss : 1);
    hm_status st = scratch ? HM_OK : hm_error_set(err, HM_ERR_NOMEM, "calibration: out of memory");
    memset(out, 0, sizeof(*out));
    out->wtype = t->type;
    out->n_expert = K;
    out->batch = (int)B;
    out->bytes = (uint64_t)K * (uint64_t)rows * t->row_size;
    if (st == HM_OK) st = best_time(pool, &a, scratch, ss, &out->t1_s, err);
    a.n_tok = B;
    if (st == HM_OK) st = best_time(pool, &a, scratch, ss, &out->tb_s, err);
    if (st == HM_OK) calib_type_derive(out);
    free(scratch);
    free(x);
    free(ids);
    free(y);
    return st;
}

/* ---- (a) host->device ---- */

static void h2d_source_now(const hm_model *m, struct cuda_copy_lane *lane, char *buf, size_t n) {
    const void *p;
    size_t len;
    if (!lane || !offload_expert_span(m, &p, &len)) {
        snprintf(buf, n, "%s", "");
        return;
    }
    if (len > k_h2d_max) len = k_h2d_max;
    if (len > cuda_copy_lane_cap(lane)) len = cuda_copy_lane_cap(lane);
    snprintf(buf, n, "%s", cuda_copy_lane_direct(lane, p, len) ? "registered" : "staged");
}

static hm_status measure_h2d(const hm_model *m, struct cuda_copy_lane *lane, calib_result *c,
                             hm_error *err) {
    const void *p;
    size_t len;
    c->h2d_bps = 0;
    c->h2d_source[0] = '\0';
    if (!lane || !offload_expert_span(m, &p, &len)) return HM_OK;
    if (len > k_h2d_max) len = k_h2d_max;
    if (len > cuda_copy_lane_cap(lane)) len = cuda_copy_lane_cap(lane);
    hm_status st = cuda_copy_lane_measure(lane, p, len, 3, &c->h2d_bps, err);
    if (st != HM_OK) return st;
    h2d_source_now(m, lane, c->h2d_source, sizeof(c->h2d_source));
    if (!(c->h2d_bps > 0)) c->h2d_bps = 1; /* measured, but too fast for the clock: not 0 */
    return HM_OK;
}

/* ---- the run ---- */

void calib_defaults(const hm_model *m, bool have_lane, calib_result *c) {
    c->source = CALIB_OFF;
    c->host_read_bps = CALIB_DEFAULT_HOST_READ;
    c->host_read_bytes = 0;
    c->h2d_bps = have_lane ? CALIB_DEFAULT_H2D : 0;
    c->h2d_source[0] = '\0';
    c->seconds = 0;
    uint32_t types[CALIB_MAX_TYPES];
    c->n_types = calib_model_types(m, types, CALIB_MAX_TYPES);
    for (int i = 0; i < c->n_types; i++) {
        calib_type *t = &c->types[i];
        memset(t, 0, sizeof(*t));
        t->wtype = types[i];
        t->fixed_s_per_byte = CALIB_DEFAULT_CPU_FIXED;
        t->tok_s_per_byte = CALIB_DEFAULT_CPU_TOK;
    }
}

static void note(calib_result *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(calib_result *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->note, sizeof(c->note), fmt, ap);
    va_end(ap);
    HM_LOGW("calibration: %s", c->note);
}

hm_status calib_run(const calib_params *p, calib_result *out, hm_error *err) {
    if (!p || !p->model || !out)
        return hm_error_set(err, HM_ERR_ARG, "calib_run: missing params, model or result");
    memset(out, 0, sizeof(*out));
    const hm_model *m = p->model;
    out->n_threads = p->pool ? tp_size(p->pool) : 1;
    calib_machine_key(p->device, out->n_threads, out->machine_key, sizeof(out->machine_key));
    calib_model_key(m, out->model_key, sizeof(out->model_key));
    const char *mode = p->mode ? p->mode : getenv("HOTMOE_CALIBRATE");
    if (!mode) mode = "";
    calib_defaults(m, p->lane != NULL, out);
    if (!strcmp(mode, "0")) return HM_OK;
    const bool force = !strcmp(mode, "force");
    if (!force && strcmp(mode, "1") && *mode)
        note(out, "HOTMOE_CALIBRATE=%.32s is not 0, 1 or force: taken as 1", mode);

    char src[16];
    h2d_source_now(m, p->lane, src, sizeof(src));
    hm_error e2;
    char path[512];
    const bool have_path = calib_cache_path(p->cache_dir, out->machine_key, out->model_key, path,
                                            sizeof(path), &e2) == HM_OK;
    if (!have_path) note(out, "not cached: %s", e2.msg);
    if (have_path && !force) {
        calib_result c;
        hm_status st = calib_cache_read(path, m, out->machine_key, out->model_key, src, &c, &e2);
        if (st == HM_OK) {
            c.n_threads = out->n_threads;
            memcpy(c.note, out->note, sizeof(c.note));
            *out = c;
            return HM_OK;
        }
        if (st == HM_ERR_FORMAT || st == HM_ERR_IO)
            note(out, "cache unreadable, measured again: %s", e2.msg);
        /* HM_ERR_NOT_FOUND: first run; HM_ERR_STATE: other keys or copy source: measure */
    }

    const double t0 = now_s();
    hm_status st = measure_read(m, p->pool, out, err);
    uint32_t types[CALIB_MAX_TYPES];
    const int nt = calib_model_types(m, types, CALIB_MAX_TYPES);
    for (int i = 0; i < nt && st == HM_OK; i++)
        st = measure_type(m, p->pool, types[i], &out->types[i], err);
    if (st == HM_OK) st = measure_h2d(m, p->lane, out, err);
    if (st != HM_OK) {
        calib_defaults(m, p->lane != NULL, out);
        return st;
    }
    out->n_types = nt;
    out->seconds = now_s() - t0;
    out->source = CALIB_MEASURED;
    if (have_path) {
        if (calib_cache_write(out, path, &e2) == HM_OK)
            snprintf(out->cache_path, sizeof(out->cache_path), "%s", path);
        else
            note(out, "not cached: %s", e2.msg);
    }
    return HM_OK;
}

/* ---- rates and report ---- */

static const calib_type *find_type(const calib_result *c, uint32_t wtype) {
    for (int i = 0; i < c->n_types; i++)
        if (c->types[i].wtype == wtype) return &c->types[i];
    return NULL;
}

void calib_layer_rates(const calib_result *c, const hm_model *m, int il, offload_rates *r) {
    memset(r, 0, sizeof(*r));
    r->h2d_bytes_per_s = c->h2d_bps;
    r->gpu_fixed_s = CALIB_GPU_FIXED_S;
    r->cpu_fixed_s_per_byte = CALIB_DEFAULT_CPU_FIXED;
    r->cpu_tok_s_per_byte = CALIB_DEFAULT_CPU_TOK;
    const hm_hparams *hp = hm_model_hparams(m);
    if (il < 0 || il >= hp->n_layer) return;
    const hm_layer *L = hm_model_layer(m, il);
    const hm_tensor *ts[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
    double bytes = 0, fixed = 0, tok = 0;
    for (int i = 0; i < 3; i++) {
        if (!ts[i]->data) continue;
        const double b = (double)ts[i]->row_size * (double)ts[i]->ne[1];
        const calib_type *t = find_type(c, ts[i]->type);
        bytes += b;
        fixed += b * (t ? t->fixed_s_per_byte : CALIB_DEFAULT_CPU_FIXED);
        tok += b * (t ? t->tok_s_per_byte : CALIB_DEFAULT_CPU_TOK);
    }
    if (bytes > 0) {
        r->cpu_fixed_s_per_byte = fixed / bytes;
        r->cpu_tok_s_per_byte = tok / bytes;
    }
    r->gpu_tok_s = (double)offload_expert_size(m, il, 1) / CALIB_GPU_BYTE_TOK_PER_S;
}


size_t calib_format(const calib_result *c, char *buf, size_t n) {
    hm_text t = {buf, n, 0};
    if (buf && n) buf[0] = '\0';
    const double MiB = 1024.0 * 1024.0;
    switch (c->source) {
    case CALIB_OFF:
        hm_text_put(&t, "calibration: off (HOTMOE_CALIBRATE=0): rough defaults\n");
        break;
    case CALIB_CACHED:
        hm_text_put(&t, "calibration: cached (%s)\n", c->cache_path);
        break;
    case CALIB_MEASURED:
        hm_text_put(&t, "calibration: measured in %.3f s%s%s%s\n", c->seconds,
            c->cache_path[0] ? " (cached in " : "", c->cache_path,
            c->cache_path[0] ? ")" : "");
        break;
    }
    hm_text_put(&t, "  machine: %s\n", c->machine_key);
    if (c->host_read_bytes)
        hm_text_put(&t, "  host read: %.1f GB/s (%.1f MiB of expert weights, %d threads)\n",
            c->host_read_bps / 1e9, (double)c->host_read_bytes / MiB, c->n_threads);
    else
        hm_text_put(&t, "  host read: %.1f GB/s (default)\n", c->host_read_bps / 1e9);
    if (c->h2d_bps > 0)
        hm_text_put(&t, "  host->device: %.1f GB/s (%s)\n", c->h2d_bps / 1e9,
            !strcmp(c->h2d_source, "registered") ? "from the registered mapping"
            : !strcmp(c->h2d_source, "staged")   ? "through pinned staging"
                                                 : "default");
    else
        hm_text_put(&t, "  host->device: none (no GPU copy lane)\n");
    for (int i = 0; i < c->n_types; i++) {
        const calib_type *ty = &c->types[i];
        if (ty->n_expert > 0 && ty->bytes > 0) {
            const double per = (double)ty->bytes / ty->n_expert;
            hm_text_put(&t, "  CPU experts %s: %.3f ms at 1 token, %.3f ms at %d tokens per expert "
                    "matrix of %.2f MiB (%.1f GB/s of weights at 1 token)\n",
                hm_type_name(ty->wtype), ty->t1_s * 1e3 / ty->n_expert,
                ty->tb_s * 1e3 / ty->n_expert, ty->batch, per / MiB,
                (double)ty->bytes / ty->t1_s / 1e9);
        } else {
            hm_text_put(&t, "  CPU experts %s: default %.1f GB/s of weights + %.1f GB/s per token\n",
                hm_type_name(ty->wtype), 1e-9 / ty->fixed_s_per_byte,
                1e-9 / ty->tok_s_per_byte);
        }
    }
    if (c->note[0]) hm_text_put(&t, "  note: %s\n", c->note);
    return t.len;
}
