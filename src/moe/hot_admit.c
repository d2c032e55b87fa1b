/* hot_admit.c - the hot cache's online admission (hot_admit.h). */
#include "moe/hot_admit.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_names[HOT_POLICY_COUNT] = {"static", "lru", "lfru"};

struct hot_admit {
    int n_layer, n_expert;
    hot_admit_cfg c;
    uint64_t step;       /* steps ended */
    uint8_t *hot;        /* [n_layer][n_expert] */
    uint32_t *uses;      /* [n_layer][n_expert] this step */
    uint64_t *last;      /* [n_layer][n_expert] step + 1 of the last use (0: never) */
    double *freq;        /* [n_layer][n_expert] decayed uses */
    int32_t *miss;       /* [n_expert] scratch: this layer's missed experts */
    uint64_t *adm_step;  /* [n_layer][n_expert] step + 1 of an admission not judged yet, or 0 */
    uint32_t *adm_hits;  /* [n_layer][n_expert] its hits since */
    int32_t *adm_victim; /* [n_layer][n_expert] the expert it evicted */
    uint32_t *out_uses;  /* [n_layer][n_expert] uses since the expert was last evicted */
    double *useful;      /* [n_layer] running share of useful admissions */
    uint64_t *probe;     /* [n_layer] the step a paused layer may admit again */
    uint64_t hits, misses, admitted, paused;
};

hm_status hot_policy_parse(const char *s, hot_policy *out, hm_error *err) {
    for (int i = 0; s && i < HOT_POLICY_COUNT; i++)
        if (!strcmp(s, k_names[i])) {
            *out = (hot_policy)i;
            return HM_OK;
        }
    return hm_error_set(err, HM_ERR_ARG, "unknown hot-cache policy '%s' (known: %s)", s ? s : "",
                        HOT_POLICY_NAMES);
}

const char *hot_policy_name(hot_policy p) {
    return p >= 0 && p < HOT_POLICY_COUNT ? k_names[p] : "?";
}

hot_admit_cfg hot_admit_default(void) {
    return (hot_admit_cfg){.policy = HOT_POLICY_STATIC, .max_per_step = 1, .decay = 0.9,
                           .min_useful = 0.5};
}

void hot_admit_free(hot_admit *a) {
    if (!a) return;
    free(a->hot);
    free(a->uses);
    free(a->last);
    free(a->freq);
    free(a->miss);
    free(a->adm_step);
    free(a->adm_hits);
    free(a->adm_victim);
    free(a->out_uses);
    free(a->useful);
    free(a->probe);
    free(a);
}

hm_status hot_admit_init(int n_layer, int n_expert, const uint8_t *hot, const hot_admit_cfg *c,
                         hot_admit **out, hm_error *err) {
    *out = NULL;
    if (!c || c->policy < 0 || c->policy >= HOT_POLICY_COUNT || c->max_per_step < 1 ||
        !(c->decay > 0 && c->decay <= 1) || !(c->min_useful >= 0 && c->min_useful <= 1) ||
        n_layer < 1 || n_expert < 1)
        return hm_error_set(err, HM_ERR_ARG, "hot cache admission: policy, K >= 1, decay in "
                            "(0, 1], min_useful in [0, 1] and a model shape are needed (K %d, "
                            "decay %g, min_useful %g, %d x %d)", c ? c->max_per_step : 0,
                            c ? c->decay : 0.0, c ? c->min_useful : 0.0, n_layer, n_expert);
    hot_admit *a = calloc(1, sizeof(*a));
    const size_t n = (size_t)n_layer * (size_t)n_expert;
    if (a) {
        a->hot = malloc(n);
        a->uses = calloc(n, sizeof(*a->uses));
        a->last = calloc(n, sizeof(*a->last));
        a->freq = calloc(n, sizeof(*a->freq));
        a->miss = malloc(sizeof(*a->miss) * (size_t)n_expert);
        a->adm_step = calloc(n, sizeof(*a->adm_step));
        a->adm_hits = calloc(n, sizeof(*a->adm_hits));
        a->adm_victim = calloc(n, sizeof(*a->adm_victim));
        a->out_uses = calloc(n, sizeof(*a->out_uses));
        a->useful = malloc(sizeof(*a->useful) * (size_t)n_layer);
        a->probe = calloc((size_t)n_layer, sizeof(*a->probe));
    }
    if (!a || !a->hot || !a->uses || !a->last || !a->freq || !a->miss || !a->adm_step ||
        !a->adm_hits || !a->adm_victim || !a->out_uses || !a->useful || !a->probe) {
        hot_admit_free(a);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache admission)");
    }
    a->n_layer = n_layer;
    a->n_expert = n_expert;
    a->c = *c;
    memcpy(a->hot, hot, n);
    /* just below the threshold: probes first, one useful probe opens the layer (0.8 x 0.98
     * min + 0.2 >= min for any min <= 1); no guard (min 0): open */
    for (int il = 0; il < n_layer; il++) a->useful[il] = c->min_useful > 0 ? 0.98 * c->min_useful : 1.0;
    *out = a;
    return HM_OK;
}

void hot_admit_observe(hot_admit *a, int il, const int32_t *ids, int n) {
    if (!a || il < 0 || il >= a->n_layer) return;
    const size_t row = (size_t)il * (size_t)a->n_expert;
    for (int i = 0; i < n; i++) {
        const int32_t e = ids[i];
        if (e < 0 || e >= a->n_expert) continue;
        a->uses[row + (size_t)e]++;
        if (a->hot[row + (size_t)e]) {
            a->hits++;
            if (a->adm_step[row + (size_t)e]) a->adm_hits[row + (size_t)e]++;
        } else {
            a->misses++;
            a->out_uses[row + (size_t)e]++;
        }
    }
}

/* Whether expert x ranks before y among the misses of row r. */
static int miss_before(const hot_admit *a, size_t r, int x, int y) {
    if (a->c.policy == HOT_POLICY_LFRU) {
        if (a->freq[r + x] != a->freq[r + y]) return a->freq[r + x] > a->freq[r + y];
    } else if (a->uses[r + x] != a->uses[r + y]) {
        return a->uses[r + x] > a->uses[r + y];
    }
    return x < y;
}

/* The victim of row r: a hot expert the step did not use, the policy's worst; -1 if none. */
static int victim(const hot_admit *a, size_t r) {
    int v = -1;
    for (int e = 0; e < a->n_expert; e++) {
        if (!a->hot[r + e] || a->uses[r + e]) continue;
        if (v < 0) {
            v = e;
            continue;
        }
        const bool worse = a->c.policy == HOT_POLICY_LFRU ? a->freq[r + e] < a->freq[r + v]
                                                          : a->last[r + e] < a->last[r + v];
        if (worse) v = e;
    }
    return v;
}

static void sort_misses(const hot_admit *a, size_t r, int n) {
    for (int i = 1; i < n; i++) { /* insertion sort: a step misses few experts */
        const int x = a->miss[i];
        int j = i - 1;
        while (j >= 0 && miss_before(a, r, x, a->miss[j])) {
            a->miss[j + 1] = a->miss[j];
            j--;
        }
        a->miss[j + 1] = x;
    }
}

/* Judges the admission of expert i (row-major index, if one is pending): useful when it got at
 * least two hits more than the expert it evicted was used meanwhile (what the slot would have
 * served without the exchange). */
static void judge(hot_admit *a, int il, size_t i) {
    if (!a->adm_step[i]) return;
    const size_t v = (size_t)il * (size_t)a->n_expert + (size_t)a->adm_victim[i];
    const double u = a->adm_hits[i] >= a->out_uses[v] + 2 ? 1.0 : 0.0;
    a->useful[il] = 0.8 * a->useful[il] + 0.2 * u;
    a->adm_step[i] = 0;
    a->adm_hits[i] = 0;
}

/* Whether layer il may admit in this step: its admissions pay, or its probe is due. */
static bool may_admit(hot_admit *a, int il) {
    if (a->useful[il] >= a->c.min_useful) return true;
    if (a->step < a->probe[il]) return false;
    a->probe[il] = a->step + HOT_ADMIT_WINDOW;
    return true;
}

int hot_admit_step(hot_admit *a, hot_exchange *out, int cap) {
    int n_out = 0;
    a->step++;
    for (int il = 0; il < a->n_layer; il++) {
        const size_t r = (size_t)il * (size_t)a->n_expert;
        int nm = 0;
        for (int e = 0; e < a->n_expert; e++) {
            a->freq[r + e] = a->freq[r + e] * a->c.decay + (double)a->uses[r + e];
            if (a->uses[r + e]) {
                a->last[r + e] = a->step;
                if (!a->hot[r + e]) a->miss[nm++] = e;
            }
        }
        for (int e = 0; e < a->n_expert; e++) /* admissions old enough to judge */
            if (a->adm_step[r + e] && a->step >= a->adm_step[r + e] + HOT_ADMIT_WINDOW)
                judge(a, il, r + (size_t)e);
        if (a->c.policy != HOT_POLICY_STATIC && nm > 0) {
            sort_misses(a, r, nm);
            const bool open = may_admit(a, il);
            const int kmax = open && a->useful[il] >= a->c.min_useful ? a->c.max_per_step : 1;
            for (int k = 0; k < nm && k < kmax && n_out < cap; k++) {
                const int in = a->miss[k], v = victim(a, r);
                if (v < 0) break;
                if (a->c.policy == HOT_POLICY_LFRU && !(a->freq[r + in] > a->freq[r + v])) break;
                if (!open) {
                    a->paused++;
                    break;
                }
                judge(a, il, r + (size_t)v); /* evicted: judged on what it got */
                a->hot[r + v] = 0;
                a->hot[r + in] = 1;
                a->adm_step[r + in] = a->step;
                a->adm_hits[r + in] = 0;
                a->adm_victim[r + in] = v;
                a->out_uses[r + v] = 0;
                out[n_out++] = (hot_exchange){il, v, in, 0.0};
                a->admitted++;
            }
        }
        memset(a->uses + r, 0, sizeof(*a->uses) * (size_t)a->n_expert);
    }
    return n_out;
}

const uint8_t *hot_admit_map(const hot_admit *a) { return a->hot; }

void hot_admit_apply(hot_admit *a, int il, int out, int in) {
    if (il < 0 || il >= a->n_layer || out < 0 || out >= a->n_expert || in < 0 ||
        in >= a->n_expert)
        return;
    const size_t r = (size_t)il * (size_t)a->n_expert;
    a->hot[r + (size_t)out] = 0;
    a->hot[r + (size_t)in] = 1;
    a->adm_step[r + (size_t)out] = a->adm_hits[r + (size_t)out] = 0; /* not this object's */
}

uint64_t hot_admit_paused(const hot_admit *a) { return a->paused; }

void hot_admit_counts(const hot_admit *a, uint64_t *hits, uint64_t *misses, uint64_t *admitted) {
    *hits = a->hits;
    *misses = a->misses;
    *admitted = a->admitted;
}
