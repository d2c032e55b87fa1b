/* test_hot_plan.c - the hot cache's planner and budget (moe/hot_plan.h) on a forged
 * tiny-qwen3moe (q8_0) and hand-made observations: a learn file of another model is refused,
 * a budget below one expert per RAM layer is refused with both figures, the chosen experts are
 * the best by score per byte within the budget (ties: lower layer, lower id), only eligible
 * layers get slots, experts never selected never do (unless their layer is made whole), whole
 * layers where the expected-time model says they pay, hit rates, the text, the auto budget. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "harness.h"
#include "model/model.h"
#include "moe/hot_plan.h"
#include "moe/offload.h"

static hm_model *g_model;

static hm_model *model(void) {
    if (g_model) return g_model;
    char path[512];
    hm_error err;
    if (!ft_forged("hotplan", "tiny-qwen3moe", FORGE_MIX_Q8_0, path, sizeof(path)) ||
        hm_model_load(path, NULL, &g_model, &err) != HM_OK)
        g_model = NULL;
    return g_model;
}

/* hits[l][e] = (n_expert - e) * (l + 1) for e < n_expert - 2, 0 for the last two experts. */
typedef struct {
    uint64_t *hits;
    moe_learn_layer *ly;
    moe_learn l;
} obs;

static void make(obs *o, int nl, int ne) {
    o->hits = calloc((size_t)nl * (size_t)ne, sizeof(uint64_t));
    o->ly = calloc((size_t)nl, sizeof(*o->ly));
    HM_REQUIRE(o->hits && o->ly);
    for (int il = 0; il < nl; il++) {
        for (int e = 0; e < ne - 2; e++)
            o->hits[(size_t)il * (size_t)ne + (size_t)e] = (uint64_t)(ne - e) * (uint64_t)(il + 1);
        o->ly[il] = (moe_learn_layer){.calls = 1, .experts = o->hits + (size_t)il * (size_t)ne};
    }
    o->l = (moe_learn){.n_layer = nl, .n_expert = ne, .n_expert_used = 1, .layers = o->ly};
}

static void drop(obs *o) {
    free(o->hits);
    free(o->ly);
}

static void test_refusals(void) {
    HM_REQUIRE(model());
    const hm_hparams *hp = hm_model_hparams(model());
    const int NL = (int)hp->n_layer, NE = (int)hp->n_expert;
    obs o;
    make(&o, NL + 1, NE);
    hot_plan p;
    hm_error err;
    HM_CHECK(hot_plan_make(model(), &o.l, NULL, NULL, 1ull << 30, &p, &err) == HM_ERR_FORMAT);
    char want[96];
    snprintf(want, sizeof(want), "%d layers x %d experts, this one has %d x %d", NL + 1, NE, NL,
             NE);
    HM_CHECK_MSG(strstr(err.msg, want), "%s", err.msg);
    drop(&o);
    make(&o, NL, NE);
    const uint64_t B = offload_expert_size(model(), 0, 1);
    HM_REQUIRE(B > 0);
    HM_CHECK(hot_plan_make(model(), &o.l, NULL, NULL, (uint64_t)NL * B - 1, &p, &err) ==
             HM_ERR_RANGE);
    HM_CHECK_MSG(strstr(err.msg, "holds less than one expert of each of the") &&
                     strstr(err.msg, "no cache"),
                 "%s", err.msg);
    hot_weight_cfg c = hot_weight_default();
    c.layer_curve = -1;
    HM_CHECK(hot_plan_make(model(), &o.l, &c, NULL, 1ull << 30, &p, &err) == HM_ERR_ARG);
    drop(&o);
}

static int cmp_desc(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

static void test_choice(void) {
    HM_REQUIRE(model());
    const hm_hparams *hp = hm_model_hparams(model());
    const int NL = (int)hp->n_layer, NE = (int)hp->n_expert;
    const uint64_t B = offload_expert_size(model(), 0, 1);
    for (int il = 1; il < NL; il++) HM_REQUIRE(offload_expert_size(model(), il, 1) == B);
    obs o;
    make(&o, NL, NE);
    hot_plan p;
    hm_error err;
    /* room for NL + 2 experts: the NL + 2 best hits (all sizes equal, flat weighting) */
    const int k = NL + 2;
    HM_REQUIRE(hot_plan_make(model(), &o.l, NULL, NULL, (uint64_t)k * B + B / 2, &p, &err) ==
               HM_OK);
    HM_CHECK(p.used_bytes == (uint64_t)k * B && p.n_eligible == NL);
    double *sorted = malloc(sizeof(double) * (size_t)NL * (size_t)NE);
    HM_REQUIRE(sorted);
    for (int i = 0; i < NL * NE; i++) sorted[i] = (double)o.hits[i];
    qsort(sorted, (size_t)NL * (size_t)NE, sizeof(double), cmp_desc);
    int n = 0;
    uint64_t hot_hits = 0, all_hits = 0;
    for (int i = 0; i < NL * NE; i++) {
        all_hits += o.hits[i];
        if (p.hot[i]) {
            n++;
            hot_hits += o.hits[i];
            HM_CHECK_MSG((double)o.hits[i] >= sorted[k - 1], "chose %d (hits %llu) below the "
                         "%d-th best %g", i, (unsigned long long)o.hits[i], k, sorted[k - 1]);
        }
    }
    HM_CHECK(n == k && p.hits_hot == hot_hits && p.hits_total == all_hits);
    for (int il = 0; il < NL; il++) {
        uint64_t h = 0, hh = 0;
        for (int e = 0; e < NE; e++) {
            h += o.hits[(size_t)il * (size_t)NE + (size_t)e];
            if (p.hot[(size_t)il * (size_t)NE + (size_t)e]) hh += o.hits[(size_t)il * NE + e];
        }
        HM_CHECK(p.hit_rate[il] == (double)hh / (double)h);
    }
    char *t = hot_plan_format(&p);
    HM_REQUIRE(t);
    printf("%s", t);
    HM_CHECK(strstr(t, "hot cache plan: weighting flat, layer curve 0.5") &&
             strstr(t, "  layer   0: ") && strstr(t, "(no timings in the file)"));
    free(t);
    hot_plan_free(&p);
    free(sorted);

    /* everything fits: whole layers (GPU layers, no CPU side), the never-selected two included */
    HM_REQUIRE(hot_plan_make(model(), &o.l, NULL, NULL, 1ull << 40, &p, &err) == HM_OK);
    for (int il = 0; il < NL; il++) HM_CHECK(p.n_hot[il] == NE && p.hit_rate[il] == 1.0);
    HM_CHECK(p.n_whole == NL && p.cost_s == 0 && p.cost_spread_s > 0);
    hot_plan_free(&p);

    /* eligible layers only (0 and the last) */
    bool *el = calloc((size_t)NL, sizeof(bool));
    HM_REQUIRE(el);
    el[0] = el[NL - 1] = true;
    HM_REQUIRE(hot_plan_make(model(), &o.l, NULL, el, 1ull << 40, &p, &err) == HM_OK);
    HM_CHECK(p.n_eligible == 2);
    for (int il = 1; il < NL - 1; il++) HM_CHECK(p.n_hot[il] == 0 && p.expert_bytes[il] == 0);
    HM_CHECK(p.n_hot[0] == NE && p.n_hot[NL - 1] == NE && p.n_whole == 2);
    hot_plan_free(&p);
    free(el);

    /* ties: equal hits everywhere, room for 3: layer 0's experts 0, 1, 2 */
    for (int i = 0; i < NL * NE; i++) o.hits[i] = 5;
    HM_REQUIRE(hot_plan_make(model(), &o.l, NULL, NULL, (uint64_t)NL * B + 0, &p, &err) ==
               HM_OK);
    for (int e = 0; e < NE; e++) HM_CHECK(p.hot[e] == (e < NL));
    hot_plan_free(&p);
    drop(&o);
}

/* Whole layers where they pay: counts that differ by less than counting noise (uniform routing)
 * make a layer whole rather than spread the same bytes; strongly skewed counts with many
 * selections per token keep the spread plan. Budget: one layer's experts + 2. */
static void test_whole(void) {
    HM_REQUIRE(model());
    const hm_hparams *hp = hm_model_hparams(model());
    const int NL = (int)hp->n_layer, NE = (int)hp->n_expert;
    const uint64_t B = offload_expert_size(model(), 0, 1);
    obs o;
    make(&o, NL, NE);
    hot_plan p;
    hm_error err;
    for (int il = 0; il < NL; il++) /* 51 for experts 0-3, 50 for the others */
        for (int e = 0; e < NE; e++) o.hits[(size_t)il * NE + e] = 50 + (e < 4);
    o.l.n_expert_used = 4;
    HM_REQUIRE(hot_plan_make(model(), &o.l, NULL, NULL, (uint64_t)(NE + 2) * B, &p, &err) ==
               HM_OK);
    HM_CHECK_MSG(p.n_whole == 1 && p.n_hot[0] == NE && p.cost_s < p.cost_spread_s,
                 "%d whole, layer 0 has %d, %.1f us against %.1f us spread", p.n_whole, p.n_hot[0],
                 p.cost_s * 1e6, p.cost_spread_s * 1e6);
    char *t = hot_plan_format(&p);
    HM_CHECK(t && strstr(t, "whole layers: 1") && strstr(t, "(whole: a GPU layer)"));
    free(t);
    hot_plan_free(&p);
    for (int il = 0; il < NL; il++) /* experts 0-3 take nearly every selection */
        for (int e = 0; e < NE; e++) o.hits[(size_t)il * NE + e] = e < 4 ? 10000 : 1;
    o.l.n_expert_used = 64;
    HM_REQUIRE(hot_plan_make(model(), &o.l, NULL, NULL, (uint64_t)(NE + 2) * B, &p, &err) ==
               HM_OK);
    HM_CHECK(p.n_whole == 0 && p.cost_s == p.cost_spread_s);
    for (int il = 0; il < NL; il++)
        for (int e = 0; e < 4; e++) HM_CHECK(p.hot[(size_t)il * NE + e]);
    hot_plan_free(&p);
    drop(&o);
}

static void test_auto_budget(void) {
    const uint64_t G = 1ull << 30, M = 1ull << 20;
    HM_CHECK(hot_plan_auto_budget(16 * G, 3 * G, 1024 * M) == 12 * G);
    HM_CHECK(hot_plan_auto_budget(4 * G, 3 * G, 1024 * M) == 0);
    HM_CHECK(hot_plan_auto_budget(4 * G, 5 * G, 0) == 0);
}

static void test_cleanup(void) {
    hm_model_free(g_model);
    g_model = NULL;
}

HM_TEST_MAIN(test_refusals, test_choice, test_whole, test_auto_budget, test_cleanup)
