/* offload.c - the offload cost model (offload.h): per-expert decisions for one ubatch of a host
 * layer, their text for HOTMOE_SCHED_DEBUG, and where each expert's bytes are in the model.
 *
 * DESIGN: offload_decide is the whole policy and has no state beyond the plan's arrays, so the
 * same inputs give the same decisions on every call (the lanes' outputs are the same bytes
 * anyway, moe_exec.h: the policy changes speed, never results). Floating point is used only to
 * compare predicted times; the visiting order is a total order (ratio, then id).
 */
#include "moe/offload.h"

#include "base/text.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_why[OFFLOAD_WHY_COUNT] = {
    "unused", "no GPU", "threshold", "below threshold", "gain", "no gain", "staging full",
};

const char *offload_why_str(offload_why w) {
    return (unsigned)w < OFFLOAD_WHY_COUNT ? k_why[w] : "?";
}

hm_status offload_plan_init(offload_plan *p, int n_expert, hm_error *err) {
    memset(p, 0, sizeof(*p));
    if (n_expert < 1 || n_expert > (1 << 20))
        return hm_error_set(err, HM_ERR_ARG, "offload_plan_init: %d experts", n_expert);
    p->n_expert = n_expert;
    p->gpu = calloc((size_t)n_expert, 1);
    p->why = calloc((size_t)n_expert, 1);
    p->items = calloc((size_t)n_expert, sizeof(*p->items));
    if (!p->gpu || !p->why || !p->items) {
        offload_plan_free(p);
        return hm_error_set(err, HM_ERR_NOMEM, "offload_plan_init: out of memory (%d experts)",
                            n_expert);
    }
    return HM_OK;
}

void offload_plan_free(offload_plan *p) {
    if (!p) return;
    free(p->gpu);
    free(p->why);
    free(p->items);
    memset(p, 0, sizeof(*p));
}

double offload_cpu_s(const offload_rates *r, const offload_expert *x) {
    return (double)x->bytes * (r->cpu_fixed_s_per_byte + (double)x->n_tok * r->cpu_tok_s_per_byte);
}

double offload_gpu_s(const offload_rates *r, const offload_expert *x) {
    if (!(r->h2d_bytes_per_s > 0)) return INFINITY;
    return (x->copied ? 0.0 : (double)x->bytes / r->h2d_bytes_per_s) + r->gpu_fixed_s +
           (double)x->n_tok * r->gpu_tok_s;
}

static bool rate_ok(double v) { return isfinite(v) && v >= 0; }

/* decreasing key, then increasing id: a total order */
static int item_cmp(const void *a, const void *b) {
    const offload_item *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static double max2(double a, double b) { return a > b ? a : b; }

/* Whether the staging buffer has room for x after the plan's copies so far. */
static bool room(const offload_plan *p, const offload_opts *o, const offload_expert *x) {
    return x->copied || (x->bytes <= o->cap_bytes && p->gpu_bytes <= o->cap_bytes - x->bytes);
}

hm_status offload_decide(offload_plan *p, int64_t n_tok, const offload_expert *ex,
                         const offload_rates *r, const offload_opts *o, hm_error *err) {
    if (!p->gpu || !ex || !r || !o)
        return hm_error_set(err, HM_ERR_ARG, "offload_decide: missing plan, experts or rates");
    if (n_tok < 0 || o->threshold < 0)
        return hm_error_set(err, HM_ERR_ARG, "offload_decide: %lld tokens, threshold %lld",
                            (long long)n_tok, (long long)o->threshold);
    if (!rate_ok(r->h2d_bytes_per_s) || !rate_ok(r->gpu_fixed_s) || !rate_ok(r->gpu_tok_s) ||
        !rate_ok(r->cpu_fixed_s_per_byte) || !rate_ok(r->cpu_tok_s_per_byte))
        return hm_error_set(err, HM_ERR_ARG, "offload_decide: rates must be finite and >= 0 "
                            "(h2d %g B/s, gpu %g s + %g s/tok, cpu %g + %g s/tok per byte)",
                            r->h2d_bytes_per_s, r->gpu_fixed_s, r->gpu_tok_s,
                            r->cpu_fixed_s_per_byte, r->cpu_tok_s_per_byte);
    const int E = p->n_expert;
    for (int e = 0; e < E; e++)
        if (ex[e].n_tok < 0)
            return hm_error_set(err, HM_ERR_ARG, "offload_decide: expert %d has %d tokens", e,
                                (int)ex[e].n_tok);
    const bool have_gpu = r->h2d_bytes_per_s > 0;
    p->n_tok = n_tok;
    p->threshold = o->threshold;
    p->n_used = p->n_gpu = 0;
    p->gpu_bytes = 0;
    double C = 0, G = 0;
    int n_items = 0;
    for (int e = 0; e < E; e++) {
        p->gpu[e] = 0;
        p->why[e] = OFFLOAD_WHY_UNUSED;
        if (ex[e].n_tok == 0) continue;
        p->n_used++;
        C += offload_cpu_s(r, &ex[e]);
        if (!have_gpu) {
            p->why[e] = OFFLOAD_WHY_NO_GPU;
        } else if (o->threshold >= 1) {
            p->why[e] = n_tok >= o->threshold ? OFFLOAD_WHY_THRESHOLD_GE
                                              : OFFLOAD_WHY_THRESHOLD_LT;
        } else {
            const double g = offload_gpu_s(r, &ex[e]), c = offload_cpu_s(r, &ex[e]);
            p->items[n_items].key = g > 0 ? c / g : INFINITY;
            p->items[n_items].id = e;
            n_items++;
        }
    }
    p->all_cpu_s = C;
    if (have_gpu && o->threshold >= 1) {
        /* seed 003: the whole ubatch's used experts go one way; in id order while they fit */
        for (int e = 0; e < E; e++) {
            if (p->why[e] != OFFLOAD_WHY_THRESHOLD_GE) continue;
            if (!room(p, o, &ex[e])) {
                p->why[e] = OFFLOAD_WHY_CAP;
                continue;
            }
            p->gpu[e] = 1;
            p->n_gpu++;
            p->gpu_bytes += ex[e].copied ? 0 : ex[e].bytes;
            C -= offload_cpu_s(r, &ex[e]);
            G += offload_gpu_s(r, &ex[e]);
        }
    } else if (n_items > 0) {
        qsort(p->items, (size_t)n_items, sizeof(*p->items), item_cmp);
        for (int i = 0; i < n_items; i++) {
            const int e = p->items[i].id;
            if (!room(p, o, &ex[e])) {
                p->why[e] = OFFLOAD_WHY_CAP;
                continue;
            }
            const double c2 = C - offload_cpu_s(r, &ex[e]), g2 = G + offload_gpu_s(r, &ex[e]);
            if (max2(c2 > 0 ? c2 : 0, g2) < max2(C, G)) {
                p->gpu[e] = 1;
                p->why[e] = OFFLOAD_WHY_GAIN;
                p->n_gpu++;
                p->gpu_bytes += ex[e].copied ? 0 : ex[e].bytes;
                C = c2 > 0 ? c2 : 0;
                G = g2;
            } else {
                p->why[e] = OFFLOAD_WHY_NO_GAIN;
            }
        }
    }
    p->cpu_s = C > 0 ? C : 0;
    p->gpu_s = G;
    return HM_OK;
}

/* ---- text ---- */


size_t offload_plan_format(const offload_plan *p, int layer, const offload_expert *ex,
                           char *buf, size_t n) {
    hm_text t = {buf, n, 0};
    if (buf && n) buf[0] = '\0';
    if (p->threshold >= 1)
        hm_text_put(&t, "sched layer %d: ubatch %lld tok, --moe-offload-threshold %lld", layer,
            (long long)p->n_tok, (long long)p->threshold);
    else
        hm_text_put(&t, "sched layer %d: ubatch %lld tok, cost model", layer, (long long)p->n_tok);
    hm_text_put(&t, ": %d/%d experts used, %d GPU (%.2f MiB, lane %.3f ms), %d CPU (lane %.3f ms); "
            "all on CPU %.3f ms\n",
        p->n_used, p->n_expert, p->n_gpu, (double)p->gpu_bytes / (1024.0 * 1024.0),
        p->gpu_s * 1e3, p->n_used - p->n_gpu, p->cpu_s * 1e3, p->all_cpu_s * 1e3);
    for (int lane = 1; lane >= 0; lane--)
        for (int w = 1; w < OFFLOAD_WHY_COUNT; w++) {
            int cnt = 0;
            for (int e = 0; e < p->n_expert; e++)
                if (p->why[e] == w && p->gpu[e] == lane && ex[e].n_tok > 0) {
                    if (cnt++ == 0) hm_text_put(&t, "  %s %s:", lane ? "GPU" : "CPU",
                                        offload_why_str((offload_why)w));
                    hm_text_put(&t, " %d:%d", e, (int)ex[e].n_tok);
                }
            if (cnt) hm_text_put(&t, "\n");
        }
    return t.len;
}

bool offload_debug_env(void) {
    const char *v = getenv("HOTMOE_SCHED_DEBUG");
    return v && v[0] == '1' && v[1] == '\0';
}

void offload_count_tokens(const int32_t *ids, int64_t n_tok, int n_used, int n_expert,
                          int32_t *counts) {
    memset(counts, 0, sizeof(*counts) * (size_t)(n_expert > 0 ? n_expert : 0));
    for (int64_t i = 0; i < n_tok * n_used; i++)
        if (ids[i] >= 0 && ids[i] < n_expert) counts[ids[i]]++;
}

/* ---- the experts' bytes ---- */

/* tensor t's share of one expert: a matrix's rows of that expert, or a bias's row */
static size_t expert_stride(const hm_tensor *t, bool matrix) {
    return matrix ? t->row_size * (size_t)t->ne[1] : t->row_size;
}

/* where expert e's share starts: a view of a fused ffn_gate_up_exps has its experts
 * expert_stride apart */
static const uint8_t *expert_at(const hm_tensor *t, bool matrix, int e) {
    const size_t s = t->expert_stride ? t->expert_stride : expert_stride(t, matrix);
    return (const uint8_t *)t->data + (size_t)e * s;
}

typedef struct {
    const hm_tensor *t;
    bool matrix;
} expert_part;

static int expert_parts(const hm_layer *L, expert_part out[OFFLOAD_MAX_RANGES]) {
    if (!L->gate_exps.data || !L->up_exps.data || !L->down_exps.data) return 0;
    int n = 0;
    out[n++] = (expert_part){&L->gate_exps, true};
    out[n++] = (expert_part){&L->up_exps, true};
    out[n++] = (expert_part){&L->down_exps, true};
    if (L->gate_exps_b.data) out[n++] = (expert_part){&L->gate_exps_b, false};
    if (L->up_exps_b.data) out[n++] = (expert_part){&L->up_exps_b, false};
    if (L->down_exps_b.data) out[n++] = (expert_part){&L->down_exps_b, false};
    return n;
}

int offload_expert_ranges(const hm_model *m, int il, int e, offload_range *out) {
    const hm_hparams *hp = hm_model_hparams(m);
    if (il < 0 || il >= hp->n_layer || e < 0 || e >= hp->n_expert) return 0;
    expert_part parts[OFFLOAD_MAX_RANGES];
    const int n = expert_parts(hm_model_layer(m, il), parts);
    for (int i = 0; i < n; i++) {
        out[i].p = expert_at(parts[i].t, parts[i].matrix, e);
        out[i].n = expert_stride(parts[i].t, parts[i].matrix);
    }
    return n;
}

uint64_t offload_expert_size(const hm_model *m, int il, size_t align) {
    const hm_hparams *hp = hm_model_hparams(m);
    if (il < 0 || il >= hp->n_layer) return 0;
    if (align == 0) align = 1;
    expert_part parts[OFFLOAD_MAX_RANGES];
    const int n = expert_parts(hm_model_layer(m, il), parts);
    uint64_t b = 0;
    for (int i = 0; i < n; i++) {
        const size_t s = expert_stride(parts[i].t, parts[i].matrix);
        b += (s + align - 1) / align * align;
    }
    return b;
}

bool offload_expert_span(const hm_model *m, const void **p, size_t *n) {
    const hm_hparams *hp = hm_model_hparams(m);
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        expert_part parts[OFFLOAD_MAX_RANGES];
        const int k = expert_parts(hm_model_layer(m, il), parts);
        for (int i = 0; i < k; i++) {
            const uintptr_t a = (uintptr_t)parts[i].t->data;
            const uintptr_t b = (uintptr_t)expert_at(parts[i].t, parts[i].matrix,
                                                     (int)hp->n_expert - 1) +
                                expert_stride(parts[i].t, parts[i].matrix);
            if (a < lo) lo = a;
            if (b > hi) hi = b;
        }
    }
    *p = hi > lo ? (const void *)lo : NULL;
    *n = hi > lo ? (size_t)(hi - lo) : 0;
    return hi > lo;
}
