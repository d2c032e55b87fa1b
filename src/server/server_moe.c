/* server_moe.c - seed 001's live endpoints on the inference thread (server_internal.h:
 * srv_moe_run): GET /moe-layer-perf (the mode and the layer counters in the learn schema, which
 * --moe-hot-cache and `hotmoe plan` read), POST /moe-layer-perf {"mode": ...} (full turns the
 * counters on, update and off turn them off; the hot cache's controller keeps its own window),
 * GET /moe-hot-cache (per cache layer the experts holding a VRAM slot now), and the routing
 * counts of every generation the server ran (GET /moe-routing, any placement: the context's
 * observer, reported per routing result on the CPU and per generation on a GPU). The counters and
 * the slots are the inference thread's, so it answers between generations. A context without
 * a tiered placement (no layer whose experts the CPU serves) has no counters: GET says so with
 * mode off, POST full answers 409.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "runtime/tiered.h"
#include "server/server_internal.h"

static const char *mode_name(hm_layer_perf m) {
    return m == HM_LAYER_PERF_FULL ? "full" : m == HM_LAYER_PERF_UPDATE ? "update" : "off";
}

int srv_parse_mode(const char *body, size_t len, char *mode, size_t cap) {
    json_t *o = json_loadb(body, len, 0, NULL);
    const char *m = json_string_value(json_object_get(o, "mode"));
    const bool ok = m && (!strcmp(m, "full") || !strcmp(m, "update") || !strcmp(m, "off")) &&
                    strlen(m) < cap;
    if (ok) snprintf(mode, cap, "%s", m);
    json_decref(o);
    return ok ? 0 : -1;
}

/* The job's whole response: the JSON in j (finished here), or an error. */
static void answer(srv_job *j, hm_json *js, int status) {
    hm_error err;
    if (hm_json_finish(js, &err) == HM_OK) {
        size_t n = 0;
        const char *t = hm_json_data(js, &n);
        srv_job_put(j, t, n, true, status);
    } else {
        char *e = oai_error(err.msg, "server_error", 500);
        srv_job_put(j, e ? e : "{}", e ? strlen(e) : 2, true, 500);
        free(e);
    }
    hm_json_free(js);
}

static void answer_error(srv_job *j, int status, const char *msg) {
    char *e = oai_error(msg, status >= 500 ? "server_error" : "invalid_request_error", status);
    srv_job_put(j, e ? e : "{}", e ? strlen(e) : 2, true, status);
    free(e);
}

static void perf_get(hm_server *s, srv_job *j) {
    hm_tiered *t = hm_context_tiered(s->m.ctx);
    const hm_layer_perf mode = hm_tiered_perf_mode(t);
    hm_json js;
    hm_json_init_buf(&js, false);
    hm_json_obj_begin(&js);
    hm_json_kstr(&js, "mode", mode_name(mode));
    hm_json_key(&js, "perf");
    hm_error err = {0};
    if (mode == HM_LAYER_PERF_FULL) {
        const hm_arch_desc *d = hm_model_arch(hm_context_model(s->m.ctx));
        if (hm_tiered_perf_json(t, &js, d ? d->name : NULL, s->model_id, &err) != HM_OK) {
            hm_json_free(&js);
            answer_error(j, 500, err.msg);
            return;
        }
    } else {
        hm_json_null(&js);
    }
    if (!t)
        hm_json_kstr(&js, "note", "no layer's experts are served by the CPU side of a tiered "
                     "placement here: nothing to count");
    hm_json_obj_end(&js);
    answer(j, &js, 200);
}

static void perf_set(hm_server *s, srv_job *j) {
    hm_tiered *t = hm_context_tiered(s->m.ctx);
    hm_error err = {0};
    if (!t && j->perf_mode != HM_LAYER_PERF_OFF) {
        answer_error(j, 409, "layer perf counts the layers the CPU side of a tiered placement "
                     "serves; this server runs none (start it with experts in RAM on a GPU)");
        return;
    }
    hm_status st = j->perf_mode == HM_LAYER_PERF_FULL ? hm_tiered_perf_enable(t, &err)
                                                      : hm_tiered_perf_disable(t);
    if (st != HM_OK) {
        answer_error(j, 500, err.msg);
        return;
    }
    hm_json js;
    hm_json_init_buf(&js, false);
    hm_json_obj_begin(&js);
    hm_json_kstr(&js, "mode", mode_name(t ? hm_tiered_perf_mode(t) : HM_LAYER_PERF_OFF));
    hm_json_obj_end(&js);
    answer(j, &js, 200);
}

static void cache_get(hm_server *s, srv_job *j) {
    const hm_hparams *hp = hm_model_hparams(hm_context_model(s->m.ctx));
    uint8_t *hot = calloc((size_t)hp->n_expert + 1, 1);
    if (!hot) {
        answer_error(j, 500, "out of memory");
        return;
    }
    hm_json js;
    hm_json_init_buf(&js, false);
    hm_json_obj_begin(&js);
    hm_json_key(&js, "layers");
    hm_json_arr_begin(&js);
    int64_t total = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const int n = hm_context_hot_layer(s->m.ctx, il, hot);
        if (n == 0) continue;
        total += n;
        hm_json_obj_begin(&js);
        hm_json_kint(&js, "layer", il);
        hm_json_key(&js, "hot_experts");
        hm_json_arr_begin(&js);
        for (int x = 0; x < hp->n_expert; x++)
            if (hot[x]) hm_json_int(&js, x);
        hm_json_arr_end(&js);
        hm_json_obj_end(&js);
    }
    hm_json_arr_end(&js);
    hm_json_kint(&js, "hot_experts_total", total);
    hm_json_kint(&js, "n_expert", hp->n_expert);
    hm_json_obj_end(&js);
    free(hot);
    answer(j, &js, 200);
}

/* POST /moe-hot-cache: the posted file applied with the full exchange budget. */
static void cache_apply(hm_server *s, srv_job *j) {
    hm_tiered *t = hm_context_tiered(s->m.ctx);
    hm_error err = {0};
    hot_update_stats st;
    const hm_status rs = t ? hm_tiered_hot_apply(t, &j->learn, &st, &err)
                           : hm_error_set(&err, HM_ERR_STATE, "hot cache: this server keeps no "
                                          "expert in RAM beside a GPU");
    if (rs != HM_OK) {
        answer_error(j, rs == HM_ERR_ARG ? 400 : 409, err.msg);
        return;
    }
    hm_json js;
    hm_json_init_buf(&js, false);
    hm_json_obj_begin(&js);
    hm_json_kbool(&js, "active", st.active);
    hm_json_kdouble(&js, "update_rate", st.update_rate);
    hm_json_kdouble(&js, "hit_rate", st.hit_rate);
    hm_json_kuint(&js, "hot_slots", st.hot_slots);
    hm_json_kuint(&js, "cold_slots", st.cold_slots);
    hm_json_kint(&js, "candidates", st.candidates);
    hm_json_kint(&js, "max_exchange", st.max_exchange);
    hm_json_kint(&js, "exchanged", st.exchanged);
    hm_json_kint(&js, "layers_changed", st.layers_changed);
    hm_json_obj_end(&js);
    answer(j, &js, 200);
}

void srv_moe_run(hm_server *s, srv_job *j) {
    switch (j->kind) {
    case SRV_PERF_GET: perf_get(s, j); break;
    case SRV_PERF_SET: perf_set(s, j); break;
    case SRV_CACHE_GET: cache_get(s, j); break;
    case SRV_CACHE_APPLY: cache_apply(s, j); break;
    default: answer_error(j, 500, "unknown control request"); break;
    }
}

static void obs_route(void *user, int layer, int64_t n_tok, int n_used, const int32_t *ids,
                      const float *weights) {
    (void)weights;
    hm_server *s = user;
    if (layer < 0 || layer >= s->n_layer) return;
    atomic_fetch_add(&s->route_calls[layer], 1);
    atomic_fetch_add(&s->route_tokens[layer], (unsigned long long)n_tok);
    for (int64_t i = 0; i < n_tok * n_used; i++)
        if (ids[i] >= 0 && ids[i] < s->n_expert)
            atomic_fetch_add(&s->route_hits[(size_t)layer * (size_t)s->n_expert + (size_t)ids[i]], 1);
}

static void obs_counts(void *user, int layer, uint64_t calls, uint64_t tokens,
                       const uint64_t *hits) {
    hm_server *s = user;
    if (layer < 0 || layer >= s->n_layer) return;
    atomic_fetch_add(&s->route_calls[layer], calls);
    atomic_fetch_add(&s->route_tokens[layer], tokens);
    for (int e = 0; e < s->n_expert; e++)
        atomic_fetch_add(&s->route_hits[(size_t)layer * (size_t)s->n_expert + (size_t)e], hits[e]);
}

hm_status srv_routes_init(hm_server *s, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(hm_context_model(s->m.ctx));
    s->n_layer = (int)hp->n_layer;
    s->n_expert = (int)(hp->n_expert > 0 ? hp->n_expert : 0);
    if (s->n_expert == 0) return HM_OK; /* a dense model: nothing routes */
    s->route_hits = calloc((size_t)s->n_layer * (size_t)s->n_expert, sizeof(*s->route_hits));
    s->route_calls = calloc((size_t)s->n_layer, sizeof(*s->route_calls));
    s->route_tokens = calloc((size_t)s->n_layer, sizeof(*s->route_tokens));
    if (!s->route_hits || !s->route_calls || !s->route_tokens)
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (routing counts)");
    const moe_observer o = {.route = obs_route, .counts = obs_counts, .user = s};
    return hm_context_set_observer(s->m.ctx, &o, err);
}

void srv_routes_free(hm_server *s) {
    if (s->route_hits) hm_context_set_observer(s->m.ctx, NULL, NULL);
    free(s->route_hits);
    free(s->route_calls);
    free(s->route_tokens);
    s->route_hits = NULL;
}

char *srv_routes_json(const hm_server *s) {
    hm_json js;
    hm_json_init_buf(&js, false);
    hm_json_obj_begin(&js);
    hm_json_kint(&js, "n_layer", s->n_layer);
    hm_json_kint(&js, "n_expert", s->n_expert);
    hm_json_key(&js, "layers");
    hm_json_arr_begin(&js);
    for (int il = 0; s->route_hits && il < s->n_layer; il++) {
        const uint64_t calls = atomic_load(&s->route_calls[il]);
        if (!calls) continue;
        hm_json_obj_begin(&js);
        hm_json_kint(&js, "layer", il);
        hm_json_kuint(&js, "calls", calls);
        hm_json_kuint(&js, "tokens", atomic_load(&s->route_tokens[il]));
        hm_json_key(&js, "experts");
        hm_json_arr_begin(&js);
        for (int e = 0; e < s->n_expert; e++)
            hm_json_uint(&js, atomic_load(&s->route_hits[(size_t)il * (size_t)s->n_expert + (size_t)e]));
        hm_json_arr_end(&js);
        hm_json_obj_end(&js);
    }
    hm_json_arr_end(&js);
    hm_json_obj_end(&js);
    hm_error err;
    char *out = NULL;
    if (hm_json_finish(&js, &err) == HM_OK) {
        size_t n = 0;
        const char *t = hm_json_data(&js, &n);
        if ((out = malloc(n + 1))) {
            memcpy(out, t, n);
            out[n] = 0;
        }
    }
    hm_json_free(&js);
    return out;
}
