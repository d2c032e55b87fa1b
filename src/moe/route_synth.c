/* route_synth.c - synthetic routing drawn from a routing profile (route_synth.h). */
#include "moe/route_synth.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define FIT_TOKENS 3000 /* tokens one fitting measurement generates */
#define FIT_ITERS 24

struct route_synth {
    int n_layer, n_expert, n_used;
    double z, q;
    double *cdf;       /* [n_expert] cumulative popularity by rank */
    int32_t *perm;     /* [n_layer][n_expert] rank -> expert */
    int32_t *prev;     /* [n_layer][n_used] the previous token's experts */
    int *n_prev;       /* [n_layer] */
    uint64_t *rng;     /* [n_layer] */
    uint8_t *chosen;   /* [n_expert] scratch */
};

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *x) { return (double)(splitmix(x) >> 11) * 0x1.0p-53; }

static void set_skew(route_synth *s, double z) {
    s->z = z;
    double c = 0;
    for (int r = 0; r < s->n_expert; r++) s->cdf[r] = (c += pow((double)(r + 1), -z));
    for (int r = 0; r < s->n_expert; r++) s->cdf[r] /= c;
}

/* The rank whose cumulative popularity first reaches u. */
static int draw_rank(const route_synth *s, double u) {
    int lo = 0, hi = s->n_expert - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (s->cdf[mid] >= u) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

void route_synth_next(route_synth *s, int il, int32_t *ids, float *weights) {
    const int K = s->n_used, NE = s->n_expert;
    uint64_t *x = &s->rng[il];
    const int32_t *perm = s->perm + (size_t)il * (size_t)NE;
    int32_t *prev = s->prev + (size_t)il * (size_t)K;
    memset(s->chosen, 0, (size_t)NE);
    for (int k = 0; k < K; k++) {
        int32_t e = -1;
        if (s->n_prev[il] > 0 && uniform01(x) < s->q) { /* reuse one of the previous token's */
            int free_n = 0;
            for (int i = 0; i < s->n_prev[il]; i++) free_n += !s->chosen[prev[i]];
            if (free_n > 0) {
                int pick = (int)(splitmix(x) % (uint64_t)free_n);
                for (int i = 0; i < s->n_prev[il] && e < 0; i++)
                    if (!s->chosen[prev[i]] && pick-- == 0) e = prev[i];
            }
        }
        for (int tries = 0; e < 0 && tries < 64; tries++) {
            const int32_t c = perm[draw_rank(s, uniform01(x))];
            if (!s->chosen[c]) e = c;
        }
        for (int r = 0; e < 0 && r < NE; r++) /* everything drawn was taken: the most popular free */
            if (!s->chosen[perm[r]]) e = perm[r];
        s->chosen[e] = 1;
        ids[k] = e;
        if (weights) weights[k] = 1.0f / (float)K;
    }
    memcpy(prev, ids, sizeof(*ids) * (size_t)K);
    s->n_prev[il] = K;
}

void route_synth_begin(route_synth *s) { memset(s->n_prev, 0, sizeof(*s->n_prev) * (size_t)s->n_layer); }

double route_synth_skew(const route_synth *s) { return s->z; }
double route_synth_reuse(const route_synth *s) { return s->q; }

void route_synth_free(route_synth *s) {
    if (!s) return;
    free(s->cdf);
    free(s->perm);
    free(s->prev);
    free(s->n_prev);
    free(s->rng);
    free(s->chosen);
    free(s);
}

static hm_status alloc_synth(int nl, int ne, int k, uint64_t seed, route_synth **out,
                             hm_error *err) {
    route_synth *s = calloc(1, sizeof(*s));
    if (s) {
        s->n_layer = nl, s->n_expert = ne, s->n_used = k;
        s->cdf = malloc(sizeof(*s->cdf) * (size_t)ne);
        s->perm = malloc(sizeof(*s->perm) * (size_t)nl * (size_t)ne);
        s->prev = malloc(sizeof(*s->prev) * (size_t)nl * (size_t)k);
        s->n_prev = calloc((size_t)nl, sizeof(*s->n_prev));
        s->rng = malloc(sizeof(*s->rng) * (size_t)nl);
        s->chosen = malloc((size_t)ne);
    }
    if (!s || !s->cdf || !s->perm || !s->prev || !s->n_prev || !s->rng || !s->chosen) {
        route_synth_free(s);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (synthetic routing)");
    }
    for (int il = 0; il < nl; il++) { /* a Fisher-Yates permutation per layer */
        uint64_t x = seed ^ (0xa0761d6478bd642full * (uint64_t)(il + 1));
        int32_t *p = s->perm + (size_t)il * (size_t)ne;
        for (int e = 0; e < ne; e++) p[e] = e;
        for (int e = ne - 1; e > 0; e--) {
            const int j = (int)(splitmix(&x) % (uint64_t)(e + 1));
            const int32_t t = p[e];
            p[e] = p[j];
            p[j] = t;
        }
        s->rng[il] = splitmix(&x);
    }
    set_skew(s, 0.0);
    *out = s;
    return HM_OK;
}

/* The figures of one layer of s generating FIT_TOKENS tokens (the generator's own state is
 * used and left changed: fits run on a scratch generator). */
static hm_status measure(route_synth *s, moe_routing_figures *f, hm_error *err) {
    moe_routing_stats *rs = NULL;
    hm_status st = moe_routing_stats_init(&rs, 1, s->n_expert, s->n_used, err);
    if (st != HM_OK) return st;
    int32_t ids[256];
    route_synth_begin(s);
    for (int t = 0; t < FIT_TOKENS; t++) {
        route_synth_next(s, 0, ids, NULL);
        moe_routing_stats_record(rs, 0, 1, s->n_used, ids, NULL);
    }
    moe_routing_profile p;
    st = moe_routing_stats_profile(rs, "fit", &p, err);
    if (st == HM_OK) *f = p.avg;
    moe_routing_profile_free(&p);
    moe_routing_stats_free(rs);
    return st;
}

/* Bisection of the skew: figure f(z) (top share: grows with z; experts for 90 %: falls). */
static hm_status fit_skew(route_synth *s, double target, bool top, hm_error *err) {
    double lo = 0.0, hi = 4.0;
    for (int i = 0; i < FIT_ITERS; i++) {
        const double z = 0.5 * (lo + hi);
        set_skew(s, z);
        moe_routing_figures f;
        hm_status st = measure(s, &f, err);
        if (st != HM_OK) return st;
        const double v = top ? f.top_share[1] : f.experts_for[1];
        if ((top && v < target) || (!top && v > target)) lo = z;
        else hi = z;
    }
    set_skew(s, 0.5 * (lo + hi));
    return HM_OK;
}

static hm_status fit_reuse(route_synth *s, double target, hm_error *err) {
    double lo = 0.0, hi = 1.0;
    for (int i = 0; i < FIT_ITERS; i++) {
        s->q = 0.5 * (lo + hi);
        moe_routing_figures f;
        hm_status st = measure(s, &f, err);
        if (st != HM_OK) return st;
        if (f.repeat[0] < target) lo = s->q;
        else hi = s->q;
    }
    s->q = 0.5 * (lo + hi);
    return HM_OK;
}

hm_status route_synth_init(const moe_routing_profile *p, int n_layer, int n_expert, int n_used,
                           uint64_t seed, route_synth **out, hm_error *err) {
    *out = NULL;
    if (n_layer < 1 || n_expert < 1 || n_used < 1 || n_used > n_expert || n_used > 256)
        return hm_error_set(err, HM_ERR_ARG, "synthetic routing: %d layers, %d of %d experts",
                            n_layer, n_used, n_expert);
    route_synth *fit = NULL, *s = NULL;
    hm_status st = alloc_synth(1, n_expert, n_used, seed ^ 0x5eedull, &fit, err);
    if (st == HM_OK && p) {
        const moe_routing_figures *f = &p->avg;
        if (!isnan(f->top_share[1])) st = fit_skew(fit, f->top_share[1], true, err);
        else if (!isnan(f->experts_for[1])) st = fit_skew(fit, f->experts_for[1], false, err);
        if (st == HM_OK && !isnan(f->repeat[0])) st = fit_reuse(fit, f->repeat[0], err);
    }
    if (st == HM_OK) st = alloc_synth(n_layer, n_expert, n_used, seed, &s, err);
    if (st == HM_OK) {
        set_skew(s, fit->z);
        s->q = fit->q;
        *out = s;
    }
    route_synth_free(fit);
    return st;
}
