/* server_moe.c - seed 001's live endpoints on the inference thread (server_internal.h:
 * srv_moe_run): GET /moe-layer-perf (the mode and the layer counters in the learn schema, which
 * --moe-hot-cache and `hotmoe plan` read), POST /moe-layer-perf {"mode": ...} (full turns the
 * counters on, update and off turn them off; the hot cache's controller keeps its own window),
 * GET /moe-hot-cache (per cache layer the experts holding a VRAM slot now). The counters and
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

void srv_moe_run(hm_server *s, srv_job *j) {
    switch (j->kind) {
    case SRV_PERF_GET: perf_get(s, j); break;
    case SRV_PERF_SET: perf_set(s, j); break;
    case SRV_CACHE_GET: cache_get(s, j); break;
    default: answer_error(j, 500, "unknown control request"); break;
    }
}
