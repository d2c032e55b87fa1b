/* hot_update.c - the hot cache's updater (hot_update.h). */
#include "moe/hot_update.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    double s;
    int e;
} ranked;

static int by_score_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->e > y->e) - (x->e < y->e);
}

static int by_score_asc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return (x->e > y->e) - (x->e < y->e);
}

typedef struct {
    hot_exchange x;
    int rank;
} pair;

static int by_gain(const void *a, const void *b) {
    const pair *p = a, *q = b;
    if (p->x.gain != q->x.gain) return p->x.gain > q->x.gain ? -1 : 1;
    if (p->x.layer != q->x.layer) return p->x.layer < q->x.layer ? -1 : 1;
    return (p->rank > q->rank) - (p->rank < q->rank);
}

static int by_layer_out(const void *a, const void *b) {
    const hot_exchange *p = a, *q = b;
    if (p->layer != q->layer) return p->layer < q->layer ? -1 : 1;
    return (p->out > q->out) - (p->out < q->out);
}

/* Whether a candidate counted ci times stands out from a victim counted co times (hot_update.h:
 * ci - co > z sqrt(ci + co)). */
static bool stands_out(uint64_t ci, uint64_t co, double z) {
    return ci > co && (double)(ci - co) > z * sqrt((double)(ci + co));
}

/* The pairs of one layer that gain, appended to ps from *np. counts: NULL, or the layer's. */
static void layer_pairs(int il, int NE, const uint8_t *hot, const double *score,
                        const uint64_t *counts, ranked *cand, ranked *vict, pair *ps, int *np) {
    int nc = 0, nv = 0;
    for (int e = 0; e < NE; e++) {
        const double s = score[(size_t)il * (size_t)NE + (size_t)e];
        if (hot[(size_t)il * (size_t)NE + (size_t)e]) vict[nv++] = (ranked){s, e};
        else if (s > 0) cand[nc++] = (ranked){s, e};
    }
    qsort(cand, (size_t)nc, sizeof(*cand), by_score_desc);
    qsort(vict, (size_t)nv, sizeof(*vict), by_score_asc);
    const double z = sqrt(2.0 * log(NE > 2 ? (double)NE : 2.0));
    for (int k = 0; k < nc && k < nv && cand[k].s > vict[k].s; k++) {
        if (counts && !stands_out(counts[cand[k].e], counts[vict[k].e], z)) break;
        ps[(*np)++] = (pair){{il, vict[k].e, cand[k].e, cand[k].s - vict[k].s}, k};
    }
}

hm_status hot_update_plan(int n_layer, int n_expert, const uint8_t *hot, const double *score,
                          const uint64_t *counts, uint64_t hot_hits, uint64_t cold_hits,
                          double rate, hot_exchange *out, int room, int *n_out,
                          hot_update_stats *st, hm_error *err) {
    *n_out = 0;
    if (!(rate >= 0 && rate <= 1))
        return hm_error_set(err, HM_ERR_ARG, "--moe-hot-cache-update-rate %g: must be in [0, 1]",
                            rate);
    if (n_layer < 0 || n_expert < 0)
        return hm_error_set(err, HM_ERR_ARG, "hot cache update: %d layers x %d experts", n_layer,
                            n_expert);
    int n_hot = 0;
    for (size_t i = 0; i < (size_t)n_layer * (size_t)n_expert; i++) n_hot += hot[i] != 0;
    *st = (hot_update_stats){.active = rate > 0 && n_hot > 0, .update_rate = rate,
                             .hot_slots = hot_hits, .cold_slots = cold_hits,
                             .max_exchange = (int)floor(rate * (double)n_hot)};
    const uint64_t all = hot_hits + cold_hits;
    st->hit_rate = all ? (double)hot_hits / (double)all : 0.0;
    if (!st->active) return HM_OK;
    ranked *cand = malloc(sizeof(*cand) * ((size_t)n_expert + 1));
    ranked *vict = malloc(sizeof(*vict) * ((size_t)n_expert + 1));
    pair *ps = malloc(sizeof(*ps) * ((size_t)n_hot + 1));
    if (!cand || !vict || !ps) {
        free(cand), free(vict), free(ps);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache update)");
    }
    int np = 0;
    for (int il = 0; il < n_layer; il++)
        layer_pairs(il, n_expert, hot, score,
                    counts ? counts + (size_t)il * (size_t)n_expert : NULL, cand, vict, ps, &np);
    qsort(ps, (size_t)np, sizeof(*ps), by_gain);
    st->candidates = np;
    int take = np < st->max_exchange ? np : st->max_exchange;
    if (take > room) take = room > 0 ? room : 0;
    for (int i = 0; i < take; i++) out[i] = ps[i].x;
    qsort(out, (size_t)take, sizeof(*out), by_layer_out);
    for (int i = 0; i < take; i++)
        st->layers_changed += i == 0 || out[i].layer != out[i - 1].layer;
    st->exchanged = take;
    *n_out = take;
    free(cand), free(vict), free(ps);
    return HM_OK;
}

int hot_update_format(const hot_update_stats *st, char *buf, int n) {
    return snprintf(buf, (size_t)(n > 0 ? n : 0),
                    "hot cache update: active %d, update_rate %.3f, hit_rate %.4f, hot_slots %llu, "
                    "cold_slots %llu, candidates %d, max_exchange %d, exchanged %d, "
                    "layers_changed %d", st->active ? 1 : 0, st->update_rate, st->hit_rate,
                    (unsigned long long)st->hot_slots, (unsigned long long)st->cold_slots,
                    st->candidates, st->max_exchange, st->exchanged, st->layers_changed);
}
