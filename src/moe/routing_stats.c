/* routing_stats.c - the routing statistics accumulator, the figures computed from it, and the
 * routing profile's JSON writer and table (routing_stats.h, docs/ROUTING.md). The reader is in
 * routing_profile.c.
 *
 * DESIGN: see routing_stats.h. Counts are exact integers; the figures are ratios of them,
 * computed once at the end, so the same routing gives the same file bit for bit. The skew
 * figures rank experts by their counts (ties: any order gives the same prefix sums). "Experts
 * for q % of the mass" compares integers (prefix >= ceil(q * total / 100)), never rounded
 * doubles; only the gating-weight variant compares doubles.
 */
#include "moe/routing_stats.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define RS_MAX_LAYERS 4096
#define RS_MAX_EXPERTS 65536

const int moe_routing_top_pct[MOE_ROUTING_N_TOP] = {10, 25, 50};
const int moe_routing_mass_pct[MOE_ROUTING_N_MASS] = {50, 90, 99};
const int moe_routing_dist[MOE_ROUTING_N_DIST] = {1, 4, 8};
const int moe_routing_lru_pct[MOE_ROUTING_N_LRU] = {10, 20, 30, 40, 50, 60, 70, 80, 90};

int moe_routing_pct_experts(int pct, int n_expert) {
    int64_t k = ((int64_t)pct * n_expert + 99) / 100;
    if (k < 1) k = 1;
    if (k > n_expert) k = n_expert;
    return (int)k;
}

/* moe_routing_figures is a block of doubles; the average walks it as one array. */
#define RS_N_FIG (sizeof(moe_routing_figures) / sizeof(double))
_Static_assert(sizeof(moe_routing_figures) ==
                   sizeof(double) * (2 * MOE_ROUTING_N_TOP + 2 * MOE_ROUTING_N_MASS +
                                     MOE_ROUTING_N_DIST + MOE_ROUTING_N_LRU),
               "moe_routing_figures must be doubles only");

void moe_routing_figures_unknown(moe_routing_figures *f) {
    double *v = (double *)f;
    for (size_t i = 0; i < RS_N_FIG; i++) v[i] = NAN;
}

/* ---- the accumulator ---- */

typedef struct {
    uint64_t tokens, selections, seqs;
    uint64_t *hits;     /* [n_expert] */
    double *wmass;      /* [n_expert] gating weights summed */
    bool no_weights;    /* a call came without weights */
    int64_t pos;        /* tokens recorded in this layer = the next token's position */
    int64_t seq_start;  /* position of the current sequence's first token */
    uint64_t epoch;     /* the accumulator's epoch when that sequence began */
    int64_t *last_seen; /* [n_expert] position of the last token that selected e, -1: none */
    int32_t *recent;    /* [n_expert] experts by recency, most recent first (n_recent of them) */
    int n_recent;
    uint64_t rep_hits[MOE_ROUTING_N_DIST], rep_cons[MOE_ROUTING_N_DIST];
    uint64_t lru_hits[MOE_ROUTING_N_LRU];
} rs_layer;

struct moe_routing_stats {
    int n_layer, n_expert, n_used;
    int lru_cap[MOE_ROUTING_N_LRU]; /* experts each LRU cache holds */
    uint64_t epoch;                 /* begin_sequence calls */
    _Atomic uint64_t rejected;      /* layers may record from different threads */
    rs_layer *layers;               /* [n_layer] */
};

hm_status moe_routing_stats_init(moe_routing_stats **out, int n_layer, int n_expert, int n_used,
                                 hm_error *err) {
    *out = NULL;
    if (n_layer < 1 || n_layer > RS_MAX_LAYERS || n_expert < 1 || n_expert > RS_MAX_EXPERTS ||
        n_used < 1 || n_used > n_expert)
        return hm_error_set(err, HM_ERR_ARG, "routing statistics: bad shape (%d layers, %d "
                            "experts, %d used)", n_layer, n_expert, n_used);
    moe_routing_stats *s = calloc(1, sizeof(*s));
    if (!s || !(s->layers = calloc((size_t)n_layer, sizeof(rs_layer)))) {
        free(s);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (routing statistics)");
    }
    s->n_layer = n_layer;
    s->n_expert = n_expert;
    s->n_used = n_used;
    atomic_init(&s->rejected, 0);
    for (int c = 0; c < MOE_ROUTING_N_LRU; c++)
        s->lru_cap[c] = moe_routing_pct_experts(moe_routing_lru_pct[c], n_expert);
    const size_t E = (size_t)n_expert;
    for (int l = 0; l < n_layer; l++) {
        rs_layer *L = &s->layers[l];
        L->hits = calloc(E, sizeof(uint64_t));
        L->wmass = calloc(E, sizeof(double));
        L->last_seen = malloc(E * sizeof(int64_t));
        L->recent = malloc(E * sizeof(int32_t));
        if (!L->hits || !L->wmass || !L->last_seen || !L->recent) {
            moe_routing_stats_free(s);
            return hm_error_set(err, HM_ERR_NOMEM, "out of memory (routing statistics)");
        }
        for (size_t e = 0; e < E; e++) L->last_seen[e] = -1;
    }
    *out = s;
    return HM_OK;
}

void moe_routing_stats_free(moe_routing_stats *s) {
    if (!s) return;
    for (int l = 0; s->layers && l < s->n_layer; l++) {
        free(s->layers[l].hits);
        free(s->layers[l].wmass);
        free(s->layers[l].last_seen);
        free(s->layers[l].recent);
    }
    free(s->layers);
    free(s);
}

void moe_routing_stats_begin_sequence(moe_routing_stats *s) {
    if (s) s->epoch++;
}

/* One access of expert e to layer L's LRU caches: its stack distance is its place in the
 * recency list (distinct experts used since its last access); a cache of C experts hits iff
 * that is < C. Then e moves to the front. */
static void lru_access(const moe_routing_stats *s, rs_layer *L, int32_t e) {
    int i = 0;
    while (i < L->n_recent && L->recent[i] != e) i++;
    if (i < L->n_recent) {
        for (int c = 0; c < MOE_ROUTING_N_LRU; c++)
            if (i < s->lru_cap[c]) L->lru_hits[c]++;
    } else {
        L->n_recent++; /* a first access: a miss for every size */
    }
    memmove(L->recent + 1, L->recent, (size_t)i * sizeof(int32_t));
    L->recent[0] = e;
}

void moe_routing_stats_record(moe_routing_stats *s, int layer, int64_t n_tok, int n_used,
                              const int32_t *ids, const float *weights) {
    if (!s || n_tok <= 0 || n_used <= 0 || !ids) return;
    if (layer < 0 || layer >= s->n_layer) {
        uint64_t n = 0;
        for (int64_t i = 0; i < n_tok * n_used; i++) n += ids[i] >= 0;
        atomic_fetch_add_explicit(&s->rejected, n, memory_order_relaxed);
        return;
    }
    rs_layer *L = &s->layers[layer];
    if (L->seqs == 0 || L->epoch != s->epoch) { /* the first token of a sequence */
        L->seq_start = L->pos;
        L->epoch = s->epoch;
        L->seqs++;
    }
    if (!weights) L->no_weights = true;
    uint64_t rejected = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        const int32_t *row = ids + t * n_used;
        const int64_t p = L->pos - L->seq_start; /* position in the sequence */
        uint64_t valid = 0;
        for (int k = 0; k < n_used; k++) {
            const int32_t e = row[k];
            if (e < 0) continue;
            if (e >= s->n_expert) {
                rejected++;
                continue;
            }
            valid++;
            L->hits[e]++;
            if (weights) L->wmass[e] += (double)weights[t * n_used + k];
            const int64_t ls = L->last_seen[e]; /* before this token's own selections */
            for (int d = 0; d < MOE_ROUTING_N_DIST; d++)
                if (p >= moe_routing_dist[d] && ls >= L->seq_start &&
                    L->pos - ls <= moe_routing_dist[d])
                    L->rep_hits[d]++;
            lru_access(s, L, e);
        }
        for (int d = 0; d < MOE_ROUTING_N_DIST; d++)
            if (p >= moe_routing_dist[d]) L->rep_cons[d] += valid;
        for (int k = 0; k < n_used; k++)
            if (row[k] >= 0 && row[k] < s->n_expert) L->last_seen[row[k]] = L->pos;
        L->selections += valid;
        L->tokens++;
        L->pos++;
    }
    if (rejected) atomic_fetch_add_explicit(&s->rejected, rejected, memory_order_relaxed);
}

uint64_t moe_routing_stats_tokens(const moe_routing_stats *s, int layer) {
    return s && layer >= 0 && layer < s->n_layer ? s->layers[layer].tokens : 0;
}

uint64_t moe_routing_stats_rejected(const moe_routing_stats *s) {
    return s ? atomic_load_explicit(&((moe_routing_stats *)s)->rejected, memory_order_relaxed)
             : 0;
}

/* ---- figures ---- */

static int cmp_u64_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

static int cmp_f64_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* Skew of counts: share of the top groups and experts needed for each mass point. sorted is
 * scratch [E]. */
static void skew_counts(const uint64_t *hits, int E, uint64_t total, uint64_t *sorted,
                        double *top_share, double *experts_for) {
    memcpy(sorted, hits, (size_t)E * sizeof(uint64_t));
    qsort(sorted, (size_t)E, sizeof(uint64_t), cmp_u64_desc);
    for (int i = 0; i < MOE_ROUTING_N_TOP; i++) {
        int k = moe_routing_pct_experts(moe_routing_top_pct[i], E);
        uint64_t sum = 0;
        for (int j = 0; j < k; j++) sum += sorted[j];
        top_share[i] = (double)sum / (double)total;
    }
    for (int i = 0; i < MOE_ROUTING_N_MASS; i++) {
        const uint64_t q = (uint64_t)moe_routing_mass_pct[i];
        const uint64_t need = total / 100 * q + (total % 100 * q + 99) / 100; /* ceil(q*total/100) */
        uint64_t sum = 0;
        int k = 0;
        while (k < E && sum < need) sum += sorted[k++];
        experts_for[i] = k;
    }
}

/* The same for the gating-weight mass. */
static void skew_weights(const double *w, int E, double *sorted, double *top_share,
                         double *experts_for) {
    memcpy(sorted, w, (size_t)E * sizeof(double));
    qsort(sorted, (size_t)E, sizeof(double), cmp_f64_desc);
    double total = 0;
    for (int j = 0; j < E; j++) total += sorted[j];
    if (!(total > 0) || !isfinite(total)) return; /* left unknown */
    for (int i = 0; i < MOE_ROUTING_N_TOP; i++) {
        int k = moe_routing_pct_experts(moe_routing_top_pct[i], E);
        double sum = 0;
        for (int j = 0; j < k; j++) sum += sorted[j];
        top_share[i] = sum / total;
    }
    for (int i = 0; i < MOE_ROUTING_N_MASS; i++) {
        const double need = total * moe_routing_mass_pct[i] / 100.0;
        double sum = 0;
        int k = 0;
        while (k < E && sum < need) sum += sorted[k++];
        experts_for[i] = k;
    }
}

static hm_status dup_str(char **dst, const char *s, hm_error *err) {
    char *c = strdup(s ? s : "");
    if (!c) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (routing profile)");
    free(*dst);
    *dst = c;
    return HM_OK;
}

/* p->avg = mean of each figure over the layers with selections where it is known. */
static void average_figures(moe_routing_profile *p) {
    moe_routing_figures_unknown(&p->avg);
    double *avg = (double *)&p->avg;
    for (size_t i = 0; i < RS_N_FIG; i++) {
        double sum = 0;
        int n = 0;
        for (int l = 0; l < p->n_layer; l++) {
            const double v = ((const double *)&p->layers[l].f)[i];
            if (p->layers[l].selections && !isnan(v)) {
                sum += v;
                n++;
            }
        }
        if (n) avg[i] = sum / n;
    }
}

hm_status moe_routing_stats_profile(const moe_routing_stats *s, const char *source,
                                    moe_routing_profile *out, hm_error *err) {
    memset(out, 0, sizeof(*out));
    const int E = s->n_expert;
    out->version = MOE_ROUTING_VERSION;
    out->measured = true;
    out->n_layer = s->n_layer;
    out->n_expert = E;
    out->n_expert_used = s->n_used;
    out->rejected = (int64_t)moe_routing_stats_rejected(s);
    uint64_t *su = malloc((size_t)E * sizeof(uint64_t));
    double *sd = malloc((size_t)E * sizeof(double));
    out->layers = calloc((size_t)s->n_layer, sizeof(moe_routing_layer));
    hm_status st = dup_str(&out->source, source, err);
    if (st == HM_OK && (!su || !sd || !out->layers))
        st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (routing profile)");
    uint64_t max_tok = 0, max_seq = 0;
    for (int l = 0; st == HM_OK && l < s->n_layer; l++) {
        const rs_layer *L = &s->layers[l];
        moe_routing_layer *y = &out->layers[l];
        moe_routing_figures_unknown(&y->f);
        y->tokens = L->tokens;
        y->selections = L->selections;
        if (L->tokens > max_tok) max_tok = L->tokens;
        if (L->seqs > max_seq) max_seq = L->seqs;
        y->hits = malloc((size_t)E * sizeof(uint64_t));
        if (!y->hits) {
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (routing profile)");
            break;
        }
        memcpy(y->hits, L->hits, (size_t)E * sizeof(uint64_t));
        y->has_repeat_counts = y->has_lru_counts = true;
        memcpy(y->repeat_hits, L->rep_hits, sizeof(y->repeat_hits));
        memcpy(y->repeat_considered, L->rep_cons, sizeof(y->repeat_considered));
        memcpy(y->lru_hits, L->lru_hits, sizeof(y->lru_hits));
        if (!L->selections) continue; /* a dense layer, or never reached: no figures */
        skew_counts(L->hits, E, L->selections, su, y->f.top_share, y->f.experts_for);
        if (!L->no_weights) {
            if (!(y->weight_mass = malloc((size_t)E * sizeof(double)))) {
                st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (routing profile)");
                break;
            }
            memcpy(y->weight_mass, L->wmass, (size_t)E * sizeof(double));
            skew_weights(L->wmass, E, sd, y->f.w_top_share, y->f.w_experts_for);
        }
        for (int d = 0; d < MOE_ROUTING_N_DIST; d++)
            if (L->rep_cons[d]) y->f.repeat[d] = (double)L->rep_hits[d] / (double)L->rep_cons[d];
        for (int c = 0; c < MOE_ROUTING_N_LRU; c++)
            y->f.lru_hit[c] = (double)L->lru_hits[c] / (double)L->selections;
    }
    free(su);
    free(sd);
    if (st != HM_OK) {
        moe_routing_profile_free(out);
        return st;
    }
    out->tokens = (int64_t)max_tok;
    out->sequences = (int64_t)max_seq;
    average_figures(out);
    return HM_OK;
}

/* ---- the profile: model, notes, free ---- */

hm_status moe_routing_profile_set_model(moe_routing_profile *p, const char *arch,
                                        const char *name, const char *file, hm_error *err) {
    hm_status st = HM_OK;
    if (arch) st = dup_str(&p->arch, arch, err);
    if (st == HM_OK && name) st = dup_str(&p->name, name, err);
    if (st == HM_OK && file) st = dup_str(&p->file, file, err);
    return st;
}

hm_status moe_routing_profile_add_note(moe_routing_profile *p, const char *note, hm_error *err) {
    char **n = realloc(p->notes, (size_t)(p->n_notes + 1) * sizeof(char *));
    if (!n) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (routing profile)");
    p->notes = n;
    if (!(n[p->n_notes] = strdup(note ? note : "")))
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (routing profile)");
    p->n_notes++;
    return HM_OK;
}

void moe_routing_profile_free(moe_routing_profile *p) {
    if (!p) return;
    for (int l = 0; p->layers && l < p->n_layer; l++) {
        free(p->layers[l].hits);
        free(p->layers[l].weight_mass);
    }
    free(p->layers);
    for (int i = 0; i < p->n_notes; i++) free(p->notes[i]);
    free(p->notes);
    free(p->source);
    free(p->arch);
    free(p->name);
    free(p->file);
    memset(p, 0, sizeof(*p));
}

/* ---- JSON ---- */

static bool any_known(const double *v, int n) {
    for (int i = 0; i < n; i++)
        if (!isnan(v[i])) return true;
    return false;
}

/* {"<pt>": value, ...}; NAN -> null; with experts (expert counts, averages of them) integral
 * values are written as integers. Left out when every value is unknown. */
static void write_map(hm_json *j, const char *key, const int *pts, const double *v, int n,
                      bool experts) {
    if (!any_known(v, n)) return;
    hm_json_key(j, key);
    hm_json_obj_begin(j);
    for (int i = 0; i < n; i++) {
        char k[16];
        snprintf(k, sizeof(k), "%d", pts[i]);
        if (isnan(v[i])) hm_json_knull(j, k);
        else if (experts && v[i] == floor(v[i]) && fabs(v[i]) < 9007199254740992.0)
            hm_json_kint(j, k, (int64_t)v[i]);
        else hm_json_kdouble(j, k, v[i]);
    }
    hm_json_obj_end(j);
}

static void write_count_map(hm_json *j, const char *key, const int *pts, const uint64_t *v, int n) {
    hm_json_key(j, key);
    hm_json_obj_begin(j);
    for (int i = 0; i < n; i++) {
        char k[16];
        snprintf(k, sizeof(k), "%d", pts[i]);
        hm_json_kuint(j, k, v[i]);
    }
    hm_json_obj_end(j);
}

static void write_pct_experts(hm_json *j, const char *key, const int *pts, int n, int E) {
    hm_json_key(j, key);
    hm_json_obj_begin(j);
    for (int i = 0; i < n; i++) {
        char k[16];
        snprintf(k, sizeof(k), "%d", pts[i]);
        hm_json_kint(j, k, moe_routing_pct_experts(pts[i], E));
    }
    hm_json_obj_end(j);
}

static void write_figures(hm_json *j, const moe_routing_figures *f) {
    write_map(j, "top_share", moe_routing_top_pct, f->top_share, MOE_ROUTING_N_TOP, false);
    write_map(j, "experts_for_share", moe_routing_mass_pct, f->experts_for, MOE_ROUTING_N_MASS,
              true);
    write_map(j, "weight_top_share", moe_routing_top_pct, f->w_top_share, MOE_ROUTING_N_TOP,
              false);
    write_map(j, "weight_experts_for_share", moe_routing_mass_pct, f->w_experts_for,
              MOE_ROUTING_N_MASS, true);
    write_map(j, "repeat", moe_routing_dist, f->repeat, MOE_ROUTING_N_DIST, false);
    write_map(j, "lru_hit", moe_routing_lru_pct, f->lru_hit, MOE_ROUTING_N_LRU, false);
}

void moe_routing_profile_write_json(const moe_routing_profile *p, hm_json *j) {
    hm_json_obj_begin(j);
    hm_json_kstr(j, "format", MOE_ROUTING_FORMAT);
    hm_json_kint(j, "version", MOE_ROUTING_VERSION);
    hm_json_kstr(j, "source", p->source ? p->source : "");
    hm_json_kbool(j, "measured", p->measured);
    if (p->n_notes) {
        hm_json_key(j, "notes");
        hm_json_arr_begin(j);
        for (int i = 0; i < p->n_notes; i++) hm_json_str(j, p->notes[i]);
        hm_json_arr_end(j);
    }
    if (p->arch || p->name || p->file) {
        hm_json_key(j, "model");
        hm_json_obj_begin(j);
        if (p->arch) hm_json_kstr(j, "arch", p->arch);
        if (p->name) hm_json_kstr(j, "name", p->name);
        if (p->file) hm_json_kstr(j, "file", p->file);
        hm_json_obj_end(j);
    }
    hm_json_kint(j, "n_layer", p->n_layer);
    hm_json_kint(j, "n_expert", p->n_expert);
    hm_json_kint(j, "n_expert_used", p->n_expert_used);
    if (p->tokens >= 0) hm_json_kint(j, "tokens", p->tokens);
    if (p->sequences >= 0) hm_json_kint(j, "sequences", p->sequences);
    if (p->rejected >= 0) hm_json_kint(j, "rejected", p->rejected);
    write_pct_experts(j, "top_experts", moe_routing_top_pct, MOE_ROUTING_N_TOP, p->n_expert);
    write_pct_experts(j, "lru_capacity", moe_routing_lru_pct, MOE_ROUTING_N_LRU, p->n_expert);
    hm_json_key(j, "average");
    hm_json_obj_begin(j);
    write_figures(j, &p->avg);
    hm_json_obj_end(j);
    if (p->layers) {
        hm_json_key(j, "layers");
        hm_json_arr_begin(j);
        for (int l = 0; l < p->n_layer; l++) {
            const moe_routing_layer *y = &p->layers[l];
            hm_json_obj_begin(j);
            hm_json_kint(j, "layer", l);
            hm_json_kuint(j, "tokens", y->tokens);
            hm_json_kuint(j, "selections", y->selections);
            if (y->hits) {
                hm_json_key(j, "hits");
                hm_json_arr_begin(j);
                for (int e = 0; e < p->n_expert; e++) hm_json_uint(j, y->hits[e]);
                hm_json_arr_end(j);
            }
            if (y->weight_mass) {
                hm_json_key(j, "weight_mass");
                hm_json_arr_begin(j);
                for (int e = 0; e < p->n_expert; e++) hm_json_double(j, y->weight_mass[e]);
                hm_json_arr_end(j);
            }
            if (y->has_repeat_counts) {
                write_count_map(j, "repeat_hits", moe_routing_dist, y->repeat_hits,
                                MOE_ROUTING_N_DIST);
                write_count_map(j, "repeat_considered", moe_routing_dist, y->repeat_considered,
                                MOE_ROUTING_N_DIST);
            }
            if (y->has_lru_counts)
                write_count_map(j, "lru_hits", moe_routing_lru_pct, y->lru_hits,
                                MOE_ROUTING_N_LRU);
            write_figures(j, &y->f);
            hm_json_obj_end(j);
        }
        hm_json_arr_end(j);
    }
    hm_json_obj_end(j);
}

hm_status moe_routing_profile_save(const moe_routing_profile *p, const char *path,
                                   hm_error *err) {
    hm_json j;
    hm_json_init_buf(&j, true);
    moe_routing_profile_write_json(p, &j);
    hm_status st = hm_json_write_file(&j, path, err);
    hm_json_free(&j);
    return st;
}

/* ---- table ---- */

static void print_pct(FILE *f, double v, int w) {
    if (isnan(v)) fprintf(f, " %*s", w, "-");
    else fprintf(f, " %*.1f", w, 100.0 * v);
}

static void print_row(FILE *f, const char *label, const moe_routing_figures *g) {
    fprintf(f, "%5s", label);
    for (int i = 0; i < MOE_ROUTING_N_TOP; i++) print_pct(f, g->top_share[i], 6);
    for (int i = 0; i < MOE_ROUTING_N_MASS; i++) {
        if (isnan(g->experts_for[i])) fprintf(f, " %5s", "-");
        else if (g->experts_for[i] == floor(g->experts_for[i]))
            fprintf(f, " %5.0f", g->experts_for[i]);
        else fprintf(f, " %5.1f", g->experts_for[i]);
    }
    for (int i = 0; i < MOE_ROUTING_N_DIST; i++) print_pct(f, g->repeat[i], 6);
    fputs(" |", f);
    for (int i = 0; i < MOE_ROUTING_N_LRU; i++) print_pct(f, g->lru_hit[i], 5);
    fputc('\n', f);
}

void moe_routing_profile_print(const moe_routing_profile *p, FILE *f) {
    fprintf(f, "routing profile: %d layers, %d experts, %d used", p->n_layer, p->n_expert,
            p->n_expert_used);
    if (p->tokens >= 0) fprintf(f, ", %lld tokens", (long long)p->tokens);
    if (p->sequences >= 0) fprintf(f, " in %lld sequences", (long long)p->sequences);
    fputc('\n', f);
    fprintf(f, "shares and rates in %%; n50/n90/n99: experts holding that %% of the selections; "
               "LRU: hit rate of a cache of 10..90%% of the experts\n");
    fprintf(f, "%5s %6s %6s %6s %5s %5s %5s %6s %6s %6s |", "layer", "top10", "top25", "top50",
            "n50", "n90", "n99", "rep1", "rep<=4", "rep<=8");
    for (int c = 0; c < MOE_ROUTING_N_LRU; c++) {
        char h[16];
        snprintf(h, sizeof(h), "L%d", moe_routing_lru_pct[c]);
        fprintf(f, " %5s", h);
    }
    fputc('\n', f);
    for (int l = 0; p->layers && l < p->n_layer; l++) {
        if (!p->layers[l].selections) continue;
        char label[16];
        snprintf(label, sizeof(label), "%d", l);
        print_row(f, label, &p->layers[l].f);
    }
    print_row(f, "avg", &p->avg);
}
