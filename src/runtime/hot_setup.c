/* hot_setup.c - the hot cache of a tiered context and its controller (hot_setup.h). */
#include "runtime/hot_setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "moe/hot_plan.h"
#include "moe/learn_file.h"

#define MIB (1ull << 20)

/* Appends text to *report (NULL report: nothing); false when out of memory. */
static bool report_put(char **report, const char *text) {
    if (!report) return true;
    const size_t a = *report ? strlen(*report) : 0, b = strlen(text);
    char *r = realloc(*report, a + b + 1);
    if (!r) return false;
    memcpy(r + a, text, b + 1);
    *report = r;
    return true;
}

/* No cache, for this reason: logged and reported. */
static hm_status without(char **report, const char *why, hm_error *err) {
    if (!strncmp(why, "hot cache: ", 11)) why += 11; /* the planner's messages say it already */
    HM_LOGW("hot cache: %s; running without it", why);
    char line[HM_ERROR_MSG_MAX + 64];
    snprintf(line, sizeof(line), "hot cache: none (%s)\n", why);
    return report_put(report, line) ? HM_OK
                                    : hm_error_set(err, HM_ERR_NOMEM, "out of memory (report)");
}

/* The chosen experts into the residency map: slots 0, 1, ... of each layer in id order. */
static void apply_slots(const hot_plan *hp, moe_placement *plan) {
    hm_residency *r = &plan->res;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->n_hot[il] == 0) continue;
        int ns = 0;
        for (int e = 0; e < hp->n_expert; e++) {
            const size_t i = hm_residency_at(r, il, e);
            if (!hp->hot[(size_t)il * (size_t)hp->n_expert + (size_t)e]) continue;
            r->slot[i] = ns++;
            r->home[i] |= HM_HOME_DEVICE;
        }
        r->n_slots[il] = ns;
    }
    plan->device_weights += hp->used_bytes;
    plan->device_total += hp->used_bytes;
    plan->fits = plan->device_total <= plan->budget;
}

void hot_setup_undo_free(hot_setup_undo *u) {
    hm_residency_free(&u->res);
    memset(u, 0, sizeof(*u));
}

/* dst's arrays := src's (the same dimensions). */
static void map_copy(hm_residency *dst, const hm_residency *src) {
    const size_t n = (size_t)src->n_layer * (size_t)src->n_expert;
    memcpy(dst->home, src->home, n);
    memcpy(dst->slot, src->slot, n * sizeof(*dst->slot));
    memcpy(dst->n_slots, src->n_slots, (size_t)src->n_layer * sizeof(*dst->n_slots));
}

/* The plan's map and figures into u; false when out of memory. */
static bool undo_keep(const moe_placement *plan, hot_setup_undo *u) {
    hm_error e;
    if (hm_residency_init_host(&u->res, plan->res.n_layer, plan->res.n_expert, &e) != HM_OK)
        return false;
    map_copy(&u->res, &plan->res);
    u->device_weights = plan->device_weights;
    u->device_total = plan->device_total;
    u->fits = plan->fits;
    return true;
}

void hot_setup_revert(moe_placement *plan, hot_setup_undo *u, const char *why, char **report) {
    if (u->added) {
        char line[HM_ERROR_MSG_MAX + 64];
        snprintf(line, sizeof(line), "the GPU cannot start with it: %s", why);
        hm_error e;
        without(report, line, &e); /* out of memory: the report lacks the line */
        map_copy(&plan->res, &u->res);
        plan->device_weights = u->device_weights;
        plan->device_total = u->device_total;
        plan->fits = u->fits;
    }
    hot_setup_undo_free(u);
}

hm_status hot_setup_apply(const hm_model *m, const hm_context_params *p, moe_placement *plan,
                          char **report, hot_setup_undo *undo, hm_error *err) {
    if (undo) memset(undo, 0, sizeof(*undo));
    const int NL = (int)hm_model_hparams(m)->n_layer;
    bool *el = calloc((size_t)NL, sizeof(bool));
    if (!el) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache)");
    int n_el = 0;
    for (int il = 0; il < NL; il++) {
        el[il] = hm_model_layer(m, il)->gate_exps.data && plan->res.n_slots[il] == 0 &&
                 plan->attn_device[il];
        n_el += el[il];
    }
    hm_status st = HM_OK;
    moe_learn l;
    hm_error e2 = {0};
    if (n_el == 0) {
        free(el);
        return without(report, "no layer of this placement keeps its experts in RAM with its "
                       "attention on the GPU", err);
    }
    if (moe_learn_load(p->moe_hot_cache, &l, &e2) != HM_OK) {
        free(el);
        return without(report, e2.msg, err);
    }
    const uint64_t budget =
        p->moe_hot_cache_max_mib > 0
            ? (uint64_t)p->moe_hot_cache_max_mib * MIB
            : hot_plan_auto_budget(plan->budget, plan->device_total,
                                   (uint64_t)p->moe_hot_cache_reserve_mib * MIB);
    hot_plan hp;
    if (hot_plan_make(m, &l, &p->moe_hot_cache_weight, el, budget, &hp, &e2) != HM_OK) {
        st = e2.status == HM_ERR_NOMEM ? hm_error_set(err, HM_ERR_NOMEM, "%s", e2.msg)
                                       : without(report, e2.msg, err);
    } else if (undo && !undo_keep(plan, undo)) {
        hot_setup_undo_free(undo);
        st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache)");
        hot_plan_free(&hp);
    } else {
        if (undo) undo->added = true;
        apply_slots(&hp, plan);
        char *text = hot_plan_format(&hp);
        int n_hot = 0;
        for (int il = 0; il < NL; il++) n_hot += hp.n_hot[il];
        HM_LOGI("hot cache: %d experts in VRAM (%.1f of %.1f MiB), expected hit rate %.1f %%",
                n_hot, (double)hp.used_bytes / MIB, (double)budget / MIB,
                hp.hits_total ? 100.0 * (double)hp.hits_hot / (double)hp.hits_total : 0.0);
        if (!text || !report_put(report, text))
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (report)");
        free(text);
        hot_plan_free(&hp);
    }
    moe_learn_free(&l);
    free(el);
    return st;
}

/* The controller runs on the CPU side's worker: it asks, the engine's thread applies between
 * steps. */
static hm_status engine_hot_exchange(void *user, int il, int out, int in, hm_error *err) {
    return cuda_engine_hot_request((cuda_engine *)user, il, out, in, err);
}

hm_status hot_setup_control(const hm_model *m, const hm_context_params *p, const hm_residency *res,
                            cuda_engine *gpu, hm_tiered *tiered, hm_error *err) {
    if (!p->moe_hot_cache) return HM_OK;
    const bool fixed = p->moe_hot_cache_policy == HOT_POLICY_STATIC &&
                       p->moe_hot_cache_update_rate <= 0; /* no controller: its map only */
    const hm_hparams *hp = hm_model_hparams(m);
    const size_t n = (size_t)hp->n_layer * (size_t)hp->n_expert;
    uint8_t *hot = calloc(n ? n : 1, 1);
    if (!hot) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache)");
    int n_hot = 0;
    for (int il = 0; il < hp->n_layer; il++)
        for (int x = 0; x < hp->n_expert; x++) {
            hot[(size_t)il * (size_t)hp->n_expert + (size_t)x] =
                cuda_engine_slot(gpu, il, x) >= 0 && res->n_slots[il] < hp->n_expert;
            n_hot += hot[(size_t)il * (size_t)hp->n_expert + (size_t)x];
        }
    hm_status st = HM_OK;
    if (n_hot > 0 && fixed) {
        st = hm_tiered_set_hot_map(tiered, hot, err);
    } else if (n_hot > 0) {
        const hm_tiered_hot_cfg hc = {.policy = p->moe_hot_cache_policy, .admit_per_step = 1,
                                      .decay = 0.9, .update_rate = p->moe_hot_cache_update_rate,
                                      .update_interval = p->moe_hot_cache_update_interval,
                                      .weight = p->moe_hot_cache_weight};
        st = hm_tiered_set_hot(tiered, &hc, hot, engine_hot_exchange, gpu, err);
        if (st == HM_OK)
            HM_LOGI("hot cache: policy %s, update rate %g every %lld tokens",
                    hot_policy_name(hc.policy), hc.update_rate, (long long)hc.update_interval);
    }
    free(hot);
    return st;
}

int hm_context_hot_layer(const hm_context *c, int il, uint8_t *hot) {
    struct cuda_engine *gpu = hm_context_gpu(c);
    const hm_hparams *hp = hm_model_hparams(hm_context_model(c));
    if (!gpu || !hm_context_tiered(c) || il < 0 || il >= hp->n_layer) return 0;
    int n = 0;
    for (int x = 0; x < hp->n_expert; x++) {
        hot[x] = cuda_engine_slot(gpu, il, x) >= 0;
        n += hot[x];
    }
    return n < hp->n_expert ? n : 0; /* a layer whose experts are all resident is no cache */
}
