/* hot_plan.c - the hot cache's planner and budget (hot_plan.h; docs/HOT_CACHE.md). */
#include "moe/hot_plan.h"

#include <stdlib.h>
#include <string.h>

#include "base/text.h"
#include "moe/offload.h"

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
            const double s = p->score[(size_t)il * (size_t)NE + (size_t)e];
            if (s > 0)
                c[nc++] = (candidate){s / (double)p->expert_bytes[il], s, il, e};
        }
    qsort(c, nc, sizeof(*c), cand_cmp);
    for (size_t i = 0; i < nc; i++) {
        const uint64_t b = p->expert_bytes[c[i].layer];
        if (p->used_bytes + b > p->budget_bytes) continue;
        p->used_bytes += b;
        p->hot[(size_t)c[i].layer * (size_t)NE + (size_t)c[i].expert] = 1;
        p->n_hot[c[i].layer]++;
        p->hits_hot += l->layers[c[i].layer].experts[c[i].expert];
    }
    free(c);
    for (int il = 0; il < NL; il++) {
        uint64_t h = 0, hh = 0;
        for (int e = 0; e < NE; e++) {
            h += l->layers[il].experts[e];
            if (p->hot[(size_t)il * (size_t)NE + (size_t)e]) hh += l->layers[il].experts[e];
        }
        p->hit_rate[il] = h > 0 ? (double)hh / (double)h : 0.0;
    }
    return HM_OK;
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
        for (int il = 0; il < p->n_layer; il++) {
            if (p->expert_bytes[il] == 0) continue;
            hm_text_put(&t, "  layer %3d: %3d of %d experts, %8.1f MiB, hit rate %5.1f %%, "
                        "weight %.3f: ", il, p->n_hot[il], p->n_expert,
                        (double)p->n_hot[il] * (double)p->expert_bytes[il] / 1048576.0,
                        100.0 * p->hit_rate[il], p->layer_w[il]);
            put_ids(&t, p, il);
            hm_text_put(&t, "\n");
        }
        if (pass == 0) {
            t.cap = t.len + 1;
            if (!(t.buf = malloc(t.cap))) return NULL;
        }
    }
    return t.buf;
}
