/* tiered_perf.c - the live per-layer counters of the layers the CPU side serves (seed 001's MoE
 * layer perf, --moe-layer-perf full): calls, tokens, every expert's selections split into hot
 * (the GPU ran it from its cache slot) and cold (the CPU computed or fetched it), and the CPU's
 * time on the layer's requests; written in the learn schema (docs/LEARN.md) so that a perf file
 * feeds the next plan (hotmoe plan, --moe-hot-cache).
 *
 * DESIGN: only the worker writes the counters (before answering a request: its ids stay put
 * until then; the time after computing), so they are plain integers; hm_tiered_perf_write reads
 * them between steps. Off costs one pointer test per request.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "moe/learn_file.h"
#include "runtime/tiered_internal.h"

struct tiered_perf {
    uint64_t *calls, *tokens, *time_ns; /* [n_layer] */
    uint64_t *hits, *cold;              /* [n_layer][n_expert] */
    uint64_t requests;
};

static void perf_free(tiered_perf *p) {
    if (!p) return;
    free(p->calls);
    free(p->tokens);
    free(p->time_ns);
    free(p->hits);
    free(p->cold);
    free(p);
}

void tiered_perf_free(hm_tiered *t) {
    perf_free(t->perf);
    t->perf = NULL;
}

hm_status hm_tiered_perf_enable(hm_tiered *t, hm_error *err) {
    if (!t) return hm_error_set(err, HM_ERR_ARG, "layer perf: no CPU side");
    if (t->perf) return HM_OK;
    const size_t NL = (size_t)t->v.n_layer, n = NL * (size_t)t->v.n_expert;
    tiered_perf *p = calloc(1, sizeof(*p));
    if (p) {
        p->calls = calloc(NL, sizeof(*p->calls));
        p->tokens = calloc(NL, sizeof(*p->tokens));
        p->time_ns = calloc(NL, sizeof(*p->time_ns));
        p->hits = calloc(n, sizeof(*p->hits));
        p->cold = calloc(n, sizeof(*p->cold));
    }
    if (!p || !p->calls || !p->tokens || !p->time_ns || !p->hits || !p->cold) {
        perf_free(p);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (layer perf)");
    }
    tiered_pause(t);
    t->perf = p;
    tiered_resume(t);
    return HM_OK;
}

void tiered_perf_observe(hm_tiered *t, int L, const cuda_handoff_msg *m) {
    tiered_perf *p = t->perf;
    if (!p) return;
    const int NE = (int)t->v.n_expert, n = (int)m->n_tok * t->v.n_used;
    const size_t row = (size_t)L * (size_t)NE;
    p->calls[L]++;
    p->tokens[L] += m->n_tok;
    p->requests++;
    for (int i = 0; i < n; i++) {
        const int32_t id = t->v.ids[i], e = cuda_handoff_expert(id);
        if (e < 0 || e >= NE) continue;
        p->hits[row + (size_t)e]++;
        if (id >= 0) p->cold[row + (size_t)e]++;
    }
}

void tiered_perf_time(hm_tiered *t, int L, int64_t ns) {
    if (t->perf && ns > 0) t->perf->time_ns[L] += (uint64_t)ns;
}

static void put_array(hm_json *j, const char *key, const uint64_t *v, int n, const uint64_t *sub) {
    hm_json_key(j, key);
    hm_json_arr_begin(j);
    for (int e = 0; e < n; e++) hm_json_uint(j, sub ? v[e] - sub[e] : v[e]);
    hm_json_arr_end(j);
}

hm_status hm_tiered_perf_disable(hm_tiered *t) {
    if (!t) return HM_OK;
    tiered_pause(t);
    tiered_perf_free(t);
    tiered_resume(t);
    return HM_OK;
}

hm_status hm_tiered_perf_json(hm_tiered *t, hm_json *j, const char *arch, const char *name,
                              hm_error *err) {
    const tiered_perf *p = t ? t->perf : NULL;
    if (!p) return hm_error_set(err, HM_ERR_STATE, "layer perf: not enabled (--moe-layer-perf full)");
    const int NL = t->v.n_layer, NE = (int)t->v.n_expert;
    uint64_t *tot = calloc((size_t)NE, sizeof(*tot)), max_tok = 0;
    if (!tot) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (layer perf)");
    for (int il = 0; il < NL; il++) {
        for (int e = 0; e < NE; e++) tot[e] += p->hits[(size_t)il * (size_t)NE + (size_t)e];
        if (p->tokens[il] > max_tok) max_tok = p->tokens[il];
    }
    hm_json_obj_begin(j);
    hm_json_kstr(j, "format", MOE_LEARN_FORMAT);
    hm_json_kint(j, "version", MOE_LEARN_VERSION);
    if (arch || name) {
        hm_json_key(j, "model");
        hm_json_obj_begin(j);
        if (arch) hm_json_kstr(j, "arch", arch);
        if (name) hm_json_kstr(j, "name", name);
        hm_json_obj_end(j);
    }
    hm_json_kint(j, "n_layer", NL);
    hm_json_kint(j, "n_expert", NE);
    hm_json_kint(j, "n_expert_used", t->v.n_used);
    hm_json_kuint(j, "prompts", 0);
    hm_json_kuint(j, "total_tokens", max_tok);
    hm_json_kuint(j, "rejected", 0);
    put_array(j, "experts", tot, NE, NULL);
    hm_json_key(j, "layers");
    hm_json_arr_begin(j);
    for (int il = 0; il < NL; il++) {
        const uint64_t *h = p->hits + (size_t)il * (size_t)NE, *c = p->cold + (size_t)il * NE;
        uint64_t sum = 0;
        for (int e = 0; e < NE; e++) sum += h[e];
        hm_json_obj_begin(j);
        hm_json_kint(j, "layer", il);
        hm_json_kuint(j, "calls", p->calls[il]);
        hm_json_kuint(j, "tokens", p->tokens[il]);
        hm_json_kuint(j, "expert_hits_total", sum);
        if (p->calls[il]) hm_json_kdouble(j, "moe_time_us", (double)p->time_ns[il] / 1000.0);
        put_array(j, "experts", h, NE, NULL);
        if (p->calls[il]) {
            put_array(j, "hot_experts", h, NE, c);
            put_array(j, "cold_experts", c, NE, NULL);
        }
        hm_json_obj_end(j);
    }
    hm_json_arr_end(j);
    hm_json_obj_end(j);
    free(tot);
    return HM_OK;
}

hm_status hm_tiered_perf_write(hm_tiered *t, const char *path, const char *arch,
                               const char *name, hm_error *err) {
    if (!t || !t->perf)
        return hm_error_set(err, HM_ERR_STATE, "layer perf: not enabled (--moe-layer-perf full)");
    FILE *f = fopen(path, "w");
    if (!f) return hm_error_set(err, HM_ERR_IO, "layer perf: cannot write '%s'", path);
    hm_json j;
    hm_json_init_file(&j, f, true);
    hm_status st = hm_tiered_perf_json(t, &j, arch, name, err);
    if (st == HM_OK) st = hm_json_finish(&j, err);
    hm_json_free(&j);
    if (fclose(f) != 0 && st == HM_OK)
        st = hm_error_set(err, HM_ERR_IO, "layer perf: writing '%s' failed", path);
    return st;
}

hm_layer_perf hm_tiered_perf_mode(const hm_tiered *t) {
    return !t ? HM_LAYER_PERF_OFF : t->perf ? HM_LAYER_PERF_FULL
                                  : t->hot ? HM_LAYER_PERF_UPDATE : HM_LAYER_PERF_OFF;
}
