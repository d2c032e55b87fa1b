/* route_setup.c - the routing table of --moe-routing-profile (route_setup.h). */
#include "runtime/route_setup.h"

#include <stdlib.h>

#include "base/log.h"
#include "moe/route_synth.h"
#include "moe/routing_stats.h"

hm_status route_setup_open(const hm_model *m, const hm_context_params *p, cuda_engine *gpu,
                           hm_error *err) {
    if (!gpu)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "--moe-routing-profile: the routing table "
                            "replaces the GPU engine's routers: it needs a GPU context (-ngl)");
    moe_routing_profile prof;
    hm_status st = moe_routing_profile_load(p->routing_profile, &prof, err);
    if (st != HM_OK) return st;
    const hm_hparams *hp = hm_model_hparams(m);
    const int NL = (int)hp->n_layer, K = (int)hp->n_expert_used;
    route_synth *rs = NULL;
    st = route_synth_init(&prof, NL, (int)hp->n_expert, K, p->routing_seed, &rs, err);
    const size_t n = (size_t)p->n_ctx * (size_t)NL * (size_t)K;
    int32_t *table = st == HM_OK ? calloc(n ? n : 1, sizeof(int32_t)) : NULL;
    if (st == HM_OK && !table) st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (route table)");
    if (st == HM_OK) {
        route_synth_begin(rs);
        for (int pos = 0; pos < p->n_ctx; pos++)
            for (int il = 0; il < NL; il++)
                if (hm_model_layer(m, il)->gate_exps.data)
                    route_synth_next(rs, il, table + ((size_t)pos * NL + il) * K, NULL);
        st = cuda_engine_route_table(gpu, table, p->n_ctx, err);
    }
    if (st == HM_OK)
        HM_LOGI("routing: drawn from %s (synthetic: Zipf z %.3f, reuse %.3f; not the model's "
                "routers)", p->routing_profile, route_synth_skew(rs), route_synth_reuse(rs));
    free(table);
    route_synth_free(rs);
    moe_routing_profile_free(&prof);
    return st;
}
