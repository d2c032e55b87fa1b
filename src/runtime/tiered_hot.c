/* tiered_hot.c - the hot cache's controller on the CPU side (tiered.h: hm_tiered_set_hot): the
 * worker sees every selection of the mixed layers (the GPU posts the hot ones as -2 - id,
 * cuda/cuda_handoff.h), so it drives online admission and the periodic updates without a host
 * synchronisation or a device read.
 *
 * DESIGN: before answering a request the worker counts its selections (tiered_hot_observe): the
 * admission state (moe/hot_admit.h) and the update window (hits and cold hits per expert, calls
 * per layer, tokens at the first served layer). The answer to the step's last host layer ends
 * the step (off the critical path: the GPU still has the output and the next step's first
 * layers to run), and so does, if that answer never came, the next step's first request: the
 * admissions it decides are queued. After answering (tiered_hot_after), the queued
 * exchanges are handed to the engine (the exchange callback: in a context
 * cuda_engine_hot_request, which the engine's own thread applies before its next step, where
 * it also publishes the completed copies) — the GPU is already on its next layer by then — and
 * at a step's end, when the window holds update_interval tokens, the updater
 * (moe/hot_update.h) scores the window with the weighting (moe/hot_weight.h) and queues its
 * exchanges the same way, logging the seed's statistics line. An exchange the callback refuses
 * (a full queue) is taken back in the controller's map and counted; one the engine refuses when
 * it applies it (its victim's copy still pending, say) is counted there
 * (cuda_engine_hot_counts), the controller's map then differing from the engine's until the
 * experts concerned are exchanged again. Only the worker calls the callback.
 */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "moe/hot_update.h"
#include "moe/hot_weight.h"
#include "moe/learn_file.h"
#include "runtime/tiered_internal.h"

#define HOT_QUEUE 256 /* exchanges decided, not yet handed to the engine */

struct tiered_hot {
    hm_tiered_hot_cfg c;
    hot_admit *adm;
    hm_tiered_exchange_fn ex;
    void *user;
    int n_layer, n_expert, first_layer, last_layer;
    uint32_t seq;
    bool have_seq;
    uint64_t *win_hits, *win_cold; /* [n_layer][n_expert] */
    uint64_t *win_calls;           /* [n_layer] */
    uint64_t win_tokens;
    int32_t *dec;                  /* [n_tok_max * n_used] decoded ids */
    hot_exchange q[HOT_QUEUE];
    int n_q;
    /* the update's scratch */
    double *score, *layer_w;
    moe_learn_layer *ly;
    uint64_t *hot_w;               /* [n_layer][n_expert] window hits served hot */
};

static void hot_free(tiered_hot *h) {
    if (!h) return;
    hot_admit_free(h->adm);
    free(h->win_hits);
    free(h->win_cold);
    free(h->win_calls);
    free(h->dec);
    free(h->score);
    free(h->layer_w);
    free(h->ly);
    free(h->hot_w);
    free(h);
}

void tiered_hot_free(hm_tiered *t) {
    hot_free(t->hot);
    t->hot = NULL;
    free(t->hot_fixed);
    t->hot_fixed = NULL;
}

hm_status hm_tiered_set_hot(hm_tiered *t, const hm_tiered_hot_cfg *c, const uint8_t *hot,
                            hm_tiered_exchange_fn ex, void *user, hm_error *err) {
    if (!t || !c || !hot || !ex)
        return hm_error_set(err, HM_ERR_ARG, "hot cache controller: missing arguments");
    if (!(c->update_rate >= 0 && c->update_rate <= 1) || c->update_interval < 1)
        return hm_error_set(err, HM_ERR_ARG, "--moe-hot-cache-update-rate %g must be in [0, 1] "
                            "and --moe-hot-cache-update-interval %lld >= 1", c->update_rate,
                            (long long)c->update_interval);
    const int NL = t->v.n_layer, NE = (int)t->v.n_expert;
    const size_t n = (size_t)NL * (size_t)NE;
    tiered_hot *h = calloc(1, sizeof(*h));
    hm_status st = h ? HM_OK : hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache)");
    hot_admit_cfg ac = hot_admit_default(); /* its guard: admissions must pay */
    ac.policy = c->policy, ac.max_per_step = c->admit_per_step, ac.decay = c->decay;
    if (st == HM_OK) st = hot_admit_init(NL, NE, hot, &ac, &h->adm, err);
    if (st == HM_OK) {
        h->win_hits = calloc(n, sizeof(*h->win_hits));
        h->win_cold = calloc(n, sizeof(*h->win_cold));
        h->hot_w = calloc(n, sizeof(*h->hot_w));
        h->win_calls = calloc((size_t)NL, sizeof(*h->win_calls));
        h->dec = malloc(sizeof(*h->dec) * (size_t)t->v.n_tok_max * (size_t)t->v.n_used);
        h->score = malloc(sizeof(*h->score) * n);
        h->layer_w = malloc(sizeof(*h->layer_w) * (size_t)NL);
        h->ly = calloc((size_t)NL, sizeof(*h->ly));
        if (!h->win_hits || !h->win_cold || !h->hot_w || !h->win_calls || !h->dec ||
            !h->score || !h->layer_w || !h->ly)
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache)");
    }
    if (st != HM_OK) {
        hot_free(h);
        return st;
    }
    h->c = *c;
    h->ex = ex;
    h->user = user;
    h->n_layer = NL;
    h->n_expert = NE;
    h->first_layer = t->host_layers[0];
    h->last_layer = t->host_layers[t->v.n_host - 1];
    tiered_pause(t);
    hot_free(t->hot);
    t->hot = h;
    tiered_resume(t);
    return HM_OK;
}

void tiered_hot_observe(hm_tiered *t, int L, const cuda_handoff_msg *m) {
    tiered_hot *h = t->hot;
    if (!h) return;
    if (h->have_seq && m->seq != h->seq && h->c.policy != HOT_POLICY_STATIC)
        h->n_q += hot_admit_step(h->adm, h->q + h->n_q, HOT_QUEUE - h->n_q);
    h->seq = m->seq;
    h->have_seq = true;
    const int n = (int)m->n_tok * t->v.n_used, NE = h->n_expert;
    const size_t row = (size_t)L * (size_t)NE;
    for (int i = 0; i < n; i++) {
        const int32_t id = t->v.ids[i], e = cuda_handoff_expert(id);
        h->dec[i] = e;
        if (e < 0 || e >= NE) continue;
        h->win_hits[row + (size_t)e]++;
        if (id >= 0) h->win_cold[row + (size_t)e]++;
    }
    hot_admit_observe(h->adm, L, h->dec, n);
    h->win_calls[L]++;
    if (L == h->first_layer) h->win_tokens += m->n_tok;
    uint64_t hits, misses, admitted; /* before the answer, for readers on other threads */
    hot_admit_counts(h->adm, &hits, &misses, &admitted);
    atomic_store(&t->hot_hits, hits);
    atomic_store(&t->hot_misses, misses);
    atomic_store(&t->hot_admitted, admitted);
}

/* Plans the exchanges a scoring asks for at rate against the current map, applies them to the
 * map and queues them (the worker's, or the worker paused). counts: the window's selections
 * behind the scores (a pair must stand out from chance: hot_update.h), or NULL. */
static hm_status queue_plan(hm_tiered *t, tiered_hot *h, const double *score,
                            const uint64_t *counts, double rate, uint64_t hot_hits,
                            uint64_t cold_hits, hot_update_stats *st, hm_error *err) {
    int n = 0;
    hm_status s = hot_update_plan(h->n_layer, h->n_expert, hot_admit_map(h->adm), score, counts,
                                  hot_hits, cold_hits, rate, h->q + h->n_q, HOT_QUEUE - h->n_q,
                                  &n, st, err);
    if (s != HM_OK) return s;
    for (int i = 0; i < n; i++) {
        const hot_exchange *x = &h->q[h->n_q + i];
        hot_admit_apply(h->adm, x->layer, x->out, x->in);
    }
    h->n_q += n;
    atomic_fetch_add(&t->hot_updates, 1);
    return HM_OK;
}

/* Hands the queued exchanges to the engine; one it refuses is taken back in the map. */
static void hand_over(hm_tiered *t, tiered_hot *h) {
    for (int i = 0; i < h->n_q; i++) {
        const hot_exchange *x = &h->q[i];
        hm_error e;
        if (h->ex(h->user, x->layer, x->out, x->in, &e) == HM_OK) {
            atomic_fetch_add(&t->hot_exchanged, 1);
        } else { /* taken back: the engine keeps its slots as they are */
            hot_admit_apply(h->adm, x->layer, x->in, x->out);
            atomic_fetch_add(&t->hot_refused, 1);
            HM_LOGD("hot cache: exchange in layer %d (%d -> %d) refused: %s", x->layer, x->out,
                    x->in, e.msg);
        }
    }
    h->n_q = 0;
}

/* The window as a perf observation, scored, then the updater's exchanges queued. */
static void update(hm_tiered *t, tiered_hot *h) {
    const int NL = h->n_layer, NE = h->n_expert;
    uint64_t hot_hits = 0, cold_hits = 0;
    for (int il = 0; il < NL; il++) {
        const size_t row = (size_t)il * (size_t)NE;
        for (int e = 0; e < NE; e++) {
            h->hot_w[row + e] = h->win_hits[row + e] - h->win_cold[row + e];
            hot_hits += h->hot_w[row + e];
            cold_hits += h->win_cold[row + e];
        }
        h->ly[il] = (moe_learn_layer){.calls = h->win_calls[il], .tokens = h->win_tokens,
                                      .experts = h->win_hits + row, .has_branch_counts = true,
                                      .hot_experts = h->hot_w + row,
                                      .cold_experts = h->win_cold + row};
    }
    const moe_learn l = {.n_layer = NL, .n_expert = NE, .n_expert_used = t->v.n_used,
                         .layers = h->ly};
    hm_error e;
    hot_update_stats s;
    if (hot_weight_score(&l, &h->c.weight, h->score, h->layer_w, NULL, &e) == HM_OK &&
        queue_plan(t, h, h->score, h->win_hits, h->c.update_rate, hot_hits, cold_hits, &s,
                   &e) == HM_OK) {
        char line[320];
        hot_update_format(&s, line, sizeof(line));
        HM_LOGI("%s", line);
    } else {
        HM_LOGW("hot cache update: %s", e.msg);
    }
    memset(h->win_hits, 0, sizeof(*h->win_hits) * (size_t)NL * (size_t)NE);
    memset(h->win_cold, 0, sizeof(*h->win_cold) * (size_t)NL * (size_t)NE);
    memset(h->win_calls, 0, sizeof(*h->win_calls) * (size_t)NL);
    h->win_tokens = 0;
}

hm_status hm_tiered_hot_apply(hm_tiered *t, const moe_learn *l, hot_update_stats *st,
                              hm_error *err) {
    tiered_hot *h = t ? t->hot : NULL;
    if (!h)
        return hm_error_set(err, HM_ERR_STATE, "hot cache: no controller (a cache with a policy "
                            "other than static, or an update rate > 0)");
    if (l->n_layer != h->n_layer || l->n_expert != h->n_expert)
        return hm_error_set(err, HM_ERR_ARG, "hot cache: the file has %d layers x %d experts, "
                            "the model %d x %d", l->n_layer, l->n_expert, h->n_layer, h->n_expert);
    tiered_pause(t);
    hm_status s = hot_weight_score(l, &h->c.weight, h->score, h->layer_w, NULL, err);
    if (s == HM_OK) s = queue_plan(t, h, h->score, NULL, 1.0, 0, 0, st, err);
    if (s == HM_OK) hand_over(t, h);
    tiered_resume(t);
    return s;
}

hm_status hm_tiered_hot_update_now(hm_tiered *t) {
    tiered_hot *h = t ? t->hot : NULL;
    if (!h || h->c.update_rate <= 0) return HM_OK;
    tiered_pause(t);
    if (h->win_tokens > 0) update(t, h);
    hand_over(t, h);
    tiered_resume(t);
    return HM_OK;
}

void tiered_hot_after(hm_tiered *t, int L) {
    tiered_hot *h = t->hot;
    if (!h) return;
    if (L == h->last_layer && h->have_seq && h->c.policy != HOT_POLICY_STATIC) {
        /* the step's last request answered: its admissions now, while the GPU finishes the
         * step, instead of in front of the next step's first request */
        h->n_q += hot_admit_step(h->adm, h->q + h->n_q, HOT_QUEUE - h->n_q);
        h->have_seq = false;
    }
    if (L == h->last_layer && h->c.update_rate > 0 &&
        h->win_tokens >= (uint64_t)h->c.update_interval)
        update(t, h); /* at a step's end too */
    hand_over(t, h);
}

void tiered_hot_counts(const hm_tiered *t, uint64_t *hits, uint64_t *misses, uint64_t *admitted) {
    *hits = atomic_load(&t->hot_hits);
    *misses = atomic_load(&t->hot_misses);
    *admitted = atomic_load(&t->hot_admitted);
}

const uint8_t *tiered_hot_map(const hm_tiered *t) {
    return t->hot ? hot_admit_map(t->hot->adm) : t->hot_fixed;
}

hm_status hm_tiered_set_hot_map(hm_tiered *t, const uint8_t *hot, hm_error *err) {
    if (!t || !hot) return hm_error_set(err, HM_ERR_ARG, "hot cache map: missing arguments");
    const size_t n = (size_t)t->v.n_layer * (size_t)t->v.n_expert;
    uint8_t *m = malloc(n ? n : 1);
    if (!m) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (hot cache map)");
    memcpy(m, hot, n);
    tiered_pause(t);
    free(t->hot_fixed);
    t->hot_fixed = m;
    tiered_resume(t);
    return HM_OK;
}
