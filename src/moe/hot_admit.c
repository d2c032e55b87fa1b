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
    uint64_t hits, misses, admitted;
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
    return (hot_admit_cfg){.policy = HOT_POLICY_STATIC, .max_per_step = 1, .decay = 0.9};
}

void hot_admit_free(hot_admit *a) {
    if (!a) return;
    free(a->hot);
    free(a->uses);
    free(a->last);
    free(a->freq);
    free(a->miss);
    free(a);
}

hm_status hot_admit_init(int n_layer, int n_expert, const uint8_t *hot, const hot_admit_cfg *c,
                         hot_admit **out, hm_error *err) {
    *out = NULL;
    if (!c || c->policy < 0 || c->policy >= HOT_POLICY_COUNT || c->max_per_step < 1 ||
        !(c->decay > 0 && c->decay <= 1) || n_layer < 1 || n_expert < 1)
        return hm_error_set(err, HM_ERR_ARG, "hot cache admission: policy, K >= 1, decay in "
                            "(0, 1] and a model shape are needed (K %d, decay %g, %d x %d)",
                            c ? c->max_per_step : 0, c ? c->decay : 0.0, n_layer, n_expert);
    hot_admit *a = calloc(1, sizeof(*a));
    const size_t n = (size_t)n_layer * (size_t)n_expert;
    if (a) {
        a->hot = malloc(n);
        a->uses = calloc(n, sizeof(*a->uses));
        a->last = calloc(n, sizeof(*a->last));
        a->freq = calloc(n, sizeof(*a->freq));
        a->miss = malloc(sizeof(*a->miss) * (size_t)n_expert);
    }
    if (!a || !a->hot || !a->uses || !a->last || !a->freq || !a->miss) {
        hot_admit_free(a);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache admission)");
    }
    a->n_layer = n_layer;
    a->n_expert = n_expert;
    a->c = *c;
    memcpy(a->hot, hot, n);
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
        if (a->hot[row + (size_t)e]) a->hits++;
        else a->misses++;
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
        if (a->c.policy != HOT_POLICY_STATIC && nm > 0) {
            sort_misses(a, r, nm);
            for (int k = 0; k < nm && k < a->c.max_per_step && n_out < cap; k++) {
                const int in = a->miss[k], v = victim(a, r);
                if (v < 0) break;
                if (a->c.policy == HOT_POLICY_LFRU && !(a->freq[r + in] > a->freq[r + v])) break;
                a->hot[r + v] = 0;
                a->hot[r + in] = 1;
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
}

void hot_admit_counts(const hot_admit *a, uint64_t *hits, uint64_t *misses, uint64_t *admitted) {
    *hits = a->hits;
    *misses = a->misses;
    *admitted = a->admitted;
}
