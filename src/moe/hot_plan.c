/* hot_plan.c - the hot cache's planner and budget (hot_plan.h; docs/HOT_CACHE.md). */
#include "moe/hot_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/text.h"
#include "moe/offload.h"

/* plan_cost's machine: a RAM layer's fixed CPU-side cost per token (the hand-off and the pool's
 * wake-up) and the host read bandwidth the CPU's experts see, both about the H200 machine's
 * (bench/RESULTS.md); only their ratio to each other matters to the choice */
#define HOT_PLAN_LAYER_S 20e-6
#define HOT_PLAN_HOST_BPS 100e9

typedef struct {
    double key;   /* score per byte */
    double score;
    int layer, expert;
} candidate;

/* decreasing key, decreasing score, increasing layer, increasing expert: a total order */
static int cand_cmp(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return (x->expert > y->expert) - (x->expert < y->expert);
}

void hot_plan_free(hot_plan *p) {
    if (!p) return;
    free(p->expert_bytes);
    free(p->hot);
    free(p->n_hot);
    free(p->hit_rate);
    free(p->layer_w);
    free(p->score);
    memset(p, 0, sizeof(*p));
}

uint64_t hot_plan_auto_budget(uint64_t vram_budget, uint64_t placement_bytes,
                              uint64_t reserve_bytes) {
    const uint64_t need = placement_bytes + reserve_bytes;
    return vram_budget > need ? vram_budget - need : 0;
}

static hm_status check_model(const hm_model *m, const moe_learn *l, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(m);
    if (l->n_layer != hp->n_layer || l->n_expert != hp->n_expert)
        return hm_error_set(err, HM_ERR_FORMAT, "hot cache: the learn file is for a model of %d "
                            "layers x %d experts, this one has %lld x %lld%s%s", l->n_layer,
                            l->n_expert, (long long)hp->n_layer, (long long)hp->n_expert,
                            l->name ? "; it names " : "", l->name ? l->name : "");
    if (hp->n_expert < 1)
        return hm_error_set(err, HM_ERR_ARG, "hot cache: the model has no routed experts");
    return HM_OK;
}

static hm_status alloc_plan(hot_plan *p, int nl, int ne, hm_error *err) {
    p->n_layer = nl;
    p->n_expert = ne;
    const size_t n = (size_t)nl * (size_t)ne;
    p->expert_bytes = calloc((size_t)nl, sizeof(*p->expert_bytes));
    p->hot = calloc(n, 1);
    p->n_hot = calloc((size_t)nl, sizeof(*p->n_hot));
    p->hit_rate = calloc((size_t)nl, sizeof(*p->hit_rate));
    p->layer_w = calloc((size_t)nl, sizeof(*p->layer_w));
    p->score = calloc(n, sizeof(*p->score));
    if (!p->expert_bytes || !p->hot || !p->n_hot || !p->hit_rate || !p->layer_w || !p->score)
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot-cache plan)");
    return HM_OK;
}

/* Refuses a budget that cannot hold one expert of every eligible layer. */
static hm_status check_budget(const hot_plan *p, hm_error *err) {
    uint64_t one_each = 0, largest = 0;
    for (int il = 0; il < p->n_layer; il++) {
        one_each += p->expert_bytes[il];
        if (p->expert_bytes[il] > largest) largest = p->expert_bytes[il];
    }
    if (p->n_eligible > 0 && p->budget_bytes < one_each)
        return hm_error_set(err, HM_ERR_RANGE, "hot cache: a budget of %.1f MiB holds less than "
                            "one expert of each of the %d layers whose experts are in RAM "
                            "(%.1f MiB; one expert is up to %.2f MiB): no cache",
                            (double)p->budget_bytes / 1048576.0, p->n_eligible,
                            (double)one_each / 1048576.0, (double)largest / 1048576.0);
    return HM_OK;
}

/* Packs the plan: every expert of the layers marked whole (whole: NULL for none), then the
 * candidates of the other layers in order while they fit; the hit figures follow. */
static void pack(hot_plan *p, const moe_learn *l, const candidate *c, size_t nc,
                 const bool *whole) {
    const int NL = p->n_layer, NE = p->n_expert;
    memset(p->hot, 0, (size_t)NL * (size_t)NE);
    memset(p->n_hot, 0, sizeof(*p->n_hot) * (size_t)NL);
    p->used_bytes = p->hits_hot = 0;
    p->n_whole = 0;
    for (int il = 0; whole && il < NL; il++) {
        if (!whole[il]) continue;
        memset(p->hot + (size_t)il * (size_t)NE, 1, (size_t)NE);
        p->n_hot[il] = NE;
        p->used_bytes += (uint64_t)NE * p->expert_bytes[il];
    }
    for (size_t i = 0; i < nc; i++) {
        const uint64_t b = p->expert_bytes[c[i].layer];
        if ((whole && whole[c[i].layer]) || p->used_bytes + b > p->budget_bytes) continue;
        p->used_bytes += b;
        p->hot[(size_t)c[i].layer * (size_t)NE + (size_t)c[i].expert] = 1;
        p->n_hot[c[i].layer]++;
    }
    for (int il = 0; il < NL; il++) {
        uint64_t h = 0, hh = 0;
        for (int e = 0; e < NE; e++) {
            h += l->layers[il].experts[e];
            if (p->hot[(size_t)il * (size_t)NE + (size_t)e]) hh += l->layers[il].experts[e];
        }
        p->hits_hot += p->expert_bytes[il] > 0 ? hh : 0;
        p->n_whole += p->expert_bytes[il] > 0 && p->n_hot[il] == NE;
        p->hit_rate[il] = h > 0 ? (double)hh / (double)h : 0.0;
    }
}

/* The expected CPU-side time per token of the packed plan: per RAM layer that is not whole, its
 * fixed cost when a token has a cold selection there (1 - hit^K: the selections taken as
 * independent) plus its expected cold selections' bytes at the host bandwidth. A layer's expected
 * hit share comes from its counts shrunk towards their mean by the share of their spread that
 * counting noise explains (counts of a uniform router vary like a Poisson variable, variance =
 * mean): a few hundred tokens of uniform routing look skewed, and a cache chosen from them would
 * be expected to hit more than it will. */
static double plan_cost(const hot_plan *p, const moe_learn *l) {
    const int NL = p->n_layer, NE = p->n_expert;
    const double K = l->n_expert_used > 0 ? l->n_expert_used : 1;
    double t = 0;
    for (int il = 0; il < NL; il++) {
        if (p->expert_bytes[il] == 0 || p->n_hot[il] == NE) continue;
        const uint64_t *n = l->layers[il].experts;
        double sum = 0, var = 0;
        for (int e = 0; e < NE; e++) sum += (double)n[e];
        const double mean = sum / NE;
        for (int e = 0; e < NE; e++) var += ((double)n[e] - mean) * ((double)n[e] - mean);
        var = NE > 1 ? var / (NE - 1) : 0;
        const double keep = var > mean && var > 0 ? 1.0 - mean / var : 0.0;
        double hot = 0;
        for (int e = 0; e < NE; e++)
            if (p->hot[(size_t)il * (size_t)NE + (size_t)e]) hot += mean + keep * ((double)n[e] - mean);
        const double hit = sum > 0 ? hot / sum : (double)p->n_hot[il] / NE;
        t += (1.0 - pow(hit, K)) * HOT_PLAN_LAYER_S +
             K * (1.0 - hit) * (double)p->expert_bytes[il] / HOT_PLAN_HOST_BPS;
    }
    return t;
}

/* Whole layers where they pay: the candidates packed alone, then with the k layers nearest to
 * whole in that packing (most experts chosen; ties: lower layer) made whole for k = 1, 2, ...
 * while they fit; the cheapest by plan_cost is kept (ties: fewer whole layers). A whole layer
 * is a GPU layer (no hand-off, no CPU work); spreading the same bytes over every layer hits more
 * when routing is skewed. */
static hm_status choose_whole(hot_plan *p, const moe_learn *l, const candidate *c, size_t nc,
                              hm_error *err) {
    const int NL = p->n_layer, NE = p->n_expert;
    pack(p, l, c, nc, NULL);
    p->cost_spread_s = p->cost_s = plan_cost(p, l);
    int *order = malloc(sizeof(int) * (size_t)NL + 1);
    bool *whole = calloc((size_t)NL + 1, sizeof(bool));
    if (!order || !whole) {
        free(order);
        free(whole);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot-cache plan)");
    }
    int n = 0;
    for (int il = 0; il < NL; il++)
        if (p->expert_bytes[il] > 0) order[n++] = il;
    for (int i = 1; i < n; i++) /* insertion sort: most chosen first, then lower layer */
        for (int j = i; j > 0 && p->n_hot[order[j]] > p->n_hot[order[j - 1]]; j--) {
            const int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    int best = 0;
    uint64_t need = 0;
    for (int k = 1; k <= n; k++) {
        need += (uint64_t)NE * p->expert_bytes[order[k - 1]];
        if (need > p->budget_bytes) break;
        whole[order[k - 1]] = true;
        pack(p, l, c, nc, whole);
        const double t = plan_cost(p, l);
        if (t < p->cost_s) {
            p->cost_s = t;
            best = k;
        }
    }
    memset(whole, 0, (size_t)NL);
    for (int k = 0; k < best; k++) whole[order[k]] = true;
    pack(p, l, c, nc, best ? whole : NULL);
    free(order);
    free(whole);
    return HM_OK;
}

hm_status hot_plan_make(const hm_model *m, const moe_learn *l, const hot_weight_cfg *cfg,
                        const bool *eligible, uint64_t budget_bytes, hot_plan *out,
                        hm_error *err) {
    memset(out, 0, sizeof(*out));
    hm_status st = check_model(m, l, err);
    if (st != HM_OK) return st;
    const int NL = l->n_layer, NE = l->n_expert;
    hot_plan *p = out;
    p->cfg = cfg ? *cfg : hot_weight_default();
    p->budget_bytes = budget_bytes;
    st = alloc_plan(p, NL, NE, err);
    if (st == HM_OK) st = hot_weight_score(l, &p->cfg, p->score, p->layer_w, &p->info, err);
    for (int il = 0; st == HM_OK && il < NL; il++) {
        if ((eligible && !eligible[il]) || !hm_model_layer(m, il)->gate_exps.data) continue;
        p->expert_bytes[il] = offload_expert_size(m, il, 1);
        p->n_eligible += p->expert_bytes[il] > 0;
        for (int e = 0; e < NE; e++) p->hits_total += l->layers[il].experts[e];
    }
    if (st == HM_OK) st = check_budget(p, err);
    candidate *c = NULL;
    if (st == HM_OK && !(c = malloc(sizeof(*c) * (size_t)NL * (size_t)NE + 1)))
        st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot-cache candidates)");
    if (st != HM_OK) {
        hot_plan_free(p);
        return st;
    }
    size_t nc = 0;
    for (int il = 0; il < NL; il++)
        for (int e = 0; p->expert_bytes[il] > 0 && e < NE; e++) {
            const double sc = p->score[(size_t)il * (size_t)NE + (size_t)e];
            if (sc > 0)
                c[nc++] = (candidate){sc / (double)p->expert_bytes[il], sc, il, e};
        }
    qsort(c, nc, sizeof(*c), cand_cmp);
    st = choose_whole(p, l, c, nc, err);
    free(c);
    if (st != HM_OK) hot_plan_free(p);
    return st;
}

/* "0-3, 7, 9-10" of the chosen experts of layer il into t. */
static void put_ids(hm_text *t, const hot_plan *p, int il) {
    const uint8_t *h = p->hot + (size_t)il * (size_t)p->n_expert;
    bool any = false;
    for (int e = 0; e < p->n_expert; e++) {
        if (!h[e]) continue;
        int j = e;
        while (j + 1 < p->n_expert && h[j + 1]) j++;
        hm_text_put(t, any ? ", " : "");
        if (j > e) hm_text_put(t, "%d-%d", e, j);
        else hm_text_put(t, "%d", e);
        any = true;
        e = j;
    }
    if (!any) hm_text_put(t, "none");
}

char *hot_plan_format(const hot_plan *p) {
    hm_text t = {NULL, 0, 0};
    for (int pass = 0; pass < 2; pass++) { /* measure, then write */
        t.len = 0;
        hm_text_put(&t, "hot cache plan: weighting %s, layer curve %g%s%s; budget %.1f MiB, "
                    "used %.1f MiB; expected hit rate %.1f %% of the selections in %d RAM "
                    "layer%s\n", hot_weighting_name(p->cfg.mode), p->cfg.layer_curve,
                    p->info.timed ? "" : " (no timings in the file)",
                    p->info.split ? "" : " (no hot/cold split in the file)",
                    (double)p->budget_bytes / 1048576.0, (double)p->used_bytes / 1048576.0,
                    p->hits_total ? 100.0 * (double)p->hits_hot / (double)p->hits_total : 0.0,
                    p->n_eligible, p->n_eligible == 1 ? "" : "s");
        hm_text_put(&t, "  whole layers: %d (expected CPU side %.1f us per token; %.1f us with "
                    "none)\n", p->n_whole, p->cost_s * 1e6, p->cost_spread_s * 1e6);
        for (int il = 0; il < p->n_layer; il++) {
            if (p->expert_bytes[il] == 0) continue;
            hm_text_put(&t, "  layer %3d: %3d of %d experts, %8.1f MiB, hit rate %5.1f %%, "
                        "weight %.3f: ", il, p->n_hot[il], p->n_expert,
                        (double)p->n_hot[il] * (double)p->expert_bytes[il] / 1048576.0,
                        100.0 * p->hit_rate[il], p->layer_w[il]);
            put_ids(&t, p, il);
            hm_text_put(&t, p->n_hot[il] == p->n_expert ? " (whole: a GPU layer)\n" : "\n");
        }
        if (pass == 0) {
            t.cap = t.len + 1;
            if (!(t.buf = malloc(t.cap))) return NULL;
        }
    }
    return t.buf;
}
