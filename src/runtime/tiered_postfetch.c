/* tiered_postfetch.c - post-fetch at decode requests, the CPU side (tiered.h:
 * hm_tiered_set_postfetch; the GPU side: cuda/cuda_postfetch.cu; the decision: moe/postfetch.h).
 *
 * DESIGN: a decode request (msg.fetch 0, n_tok <= CUDA_HANDOFF_PF_TOK) at a layer the engine
 * takes post-fetch for is served in five steps:
 *   1. every slot's fslot = -1 (the GPU reads all of them at such a layer);
 *   2. the distinct cold experts of the request (ids >= 0; hot slots are posted < -1) go through
 *      pf_decide with their gate+up and down bytes; none chosen: the request as usual;
 *   3. the chosen experts' down rows are copied (cuda_copy_lane_copy_rows, one run each) into
 *      the layer's staging buffer, expert k of the choice at k * down bytes (its scratch slot);
 *   4. the CPU lane computes the other experts' slots (moe_exec_run, chosen slots masked) and the
 *      chosen ones' gate, up and activation into the hand-off's h (moe_exec_gate_up);
 *   5. block_on_miss: it waits for the copies; otherwise, copies still in flight leave those
 *      experts' down products to the CPU (the full FFN, as without post-fetch). Then fslot of
 *      each chosen slot = its scratch slot.
 * A copy that fails (or is late, without block_on_miss) costs nothing but time: the CPU computes
 * those slots and fslot stays -1; counted as fallbacks. Where an expert's down product ran
 * changes no bit (cuda_postfetch.cu). The copy into buffer il & 1 is safe for the same reason
 * as the prompt path's (cuda_fetch.h): the request of layer il was posted after every kernel
 * that read the buffer before.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "moe/postfetch.h"
#include "runtime/tiered_internal.h"

struct tiered_pf {
    pf_config c;
    pf_rates r;
    pf_expert *ex;       /* [n_tok_max * n_used] the request's distinct cold experts */
    int32_t *xs;         /* [same] their ids */
    uint8_t *gpu, *why;  /* [same] pf_decide's answer */
    int32_t *slot_of;    /* [n_expert] scratch slot of a chosen expert, else -1 */
    int32_t *ids_cpu;    /* [CUDA_HANDOFF_PF_TOK][n_used] the CPU's slots (others -1) */
    int32_t *ids_pf;     /* [same] the post-fetched slots (others -1) */
    cuda_host_rows *runs;
};

void tiered_pf_free(hm_tiered *t) {
    tiered_pf *p = t->pf;
    if (!p) return;
    free(p->ex);
    free(p->xs);
    free(p->gpu);
    free(p->why);
    free(p->slot_of);
    free(p->ids_cpu);
    free(p->ids_pf);
    free(p->runs);
    free(p);
    t->pf = NULL;
}

hm_status hm_tiered_set_postfetch(hm_tiered *t, bool on, const pf_config *c, const pf_rates *r,
                                  hm_error *err) {
    if (!t || (on && (!c || !r)))
        return hm_error_set(err, HM_ERR_ARG, "post-fetch: missing arguments");
    pf_decision d0;
    if (on && pf_decide(c, r, NULL, 0, NULL, NULL, &d0, err) != HM_OK) /* the rates' check */
        return HM_ERR_ARG;
    tiered_pf *p = NULL;
    if (on) {
        const size_t n = (size_t)CUDA_HANDOFF_PF_TOK * (size_t)t->v.n_used;
        p = calloc(1, sizeof(*p));
        if (p) {
            p->c = *c;
            p->r = *r;
            p->ex = calloc(n, sizeof(*p->ex));
            p->xs = calloc(n, sizeof(*p->xs));
            p->gpu = calloc(n, 1);
            p->why = calloc(n, 1);
            p->slot_of = malloc(sizeof(*p->slot_of) * (size_t)t->v.n_expert);
            p->ids_cpu = calloc(n, sizeof(*p->ids_cpu));
            p->ids_pf = calloc(n, sizeof(*p->ids_pf));
            p->runs = calloc(n, sizeof(*p->runs));
        }
        if (!p || !p->ex || !p->xs || !p->gpu || !p->why || !p->slot_of || !p->ids_cpu ||
            !p->ids_pf || !p->runs) {
            tiered_pf *q = t->pf;
            t->pf = p;
            tiered_pf_free(t);
            t->pf = q;
            return hm_error_set(err, HM_ERR_NOMEM, "out of memory (post-fetch)");
        }
        for (int64_t x = 0; x < t->v.n_expert; x++) p->slot_of[x] = -1;
    }
    tiered_pause(t);
    tiered_pf_free(t);
    t->pf = p;
    tiered_resume(t);
    return HM_OK;
}

/* The engine decides: where it runs post-fetched products it reads every slot's fslot. */
bool tiered_pf_wants(const hm_tiered *t, int L, int64_t n_tok) {
    return t->gpu && n_tok <= CUDA_HANDOFF_PF_TOK && cuda_engine_postfetch_layer(t->gpu, L, NULL);
}

/* The CPU computes the chosen experts' slots after all (a failed or late copy). */
static hm_status pf_cpu_all(hm_tiered *t, tiered_pf *p, int L, int64_t n_tok, int n_chosen,
                            hm_error *e) {
    const cuda_handoff_view *v = &t->v;
    atomic_fetch_add(&t->pf_fallbacks, (unsigned long long)n_chosen);
    tiered_perf_copies(t, L, &(tiered_perf_copy){.postfetch = true,
                                                 .fallbacks = (uint64_t)n_chosen});
    const moe_job job = {.layer = L, .n_tok = n_tok, .n_used = v->n_used, .x = v->x,
                         .ids = p->ids_pf, .weights = v->gw, .y = v->y};
    bool summed = false;
    return moe_exec_run(t->exec, &job, NULL, &summed, e);
}

hm_status tiered_serve_postfetch(hm_tiered *t, int j, const cuda_handoff_msg *m, hm_error *e) {
    tiered_pf *p = t->pf;
    const cuda_handoff_view *v = &t->v;
    const int L = t->host_layers[j], K = v->n_used;
    const int64_t n_tok = m->n_tok, ns = n_tok * K;
    for (int64_t i = 0; i < ns; i++) v->fslot[i] = -1;
    size_t db = 0;
    cuda_engine_postfetch_layer(t->gpu, L, &db);
    bool summed = false;
    if (!p || !t->off.lane) { /* no decision or no lane here: every slot the CPU's */
        const moe_job job = {.layer = L, .n_tok = n_tok, .n_used = K, .x = v->x, .ids = v->ids,
                             .weights = v->gw, .y = v->y};
        return moe_exec_run(t->exec, &job, NULL, &summed, e);
    }
    /* 2. the distinct cold experts, their bytes, the decision */
    int nd = 0;
    for (int64_t i = 0; i < ns; i++) {
        const int32_t x = v->ids[i];
        if (x < 0 || x >= v->n_expert || p->slot_of[x] != -1) continue;
        offload_range rr[OFFLOAD_MAX_RANGES];
        if (offload_expert_ranges(t->m, L, x, rr) < 3 || rr[2].n != db) continue;
        p->slot_of[x] = -2; /* seen */
        p->xs[nd] = x;
        p->ex[nd++] = (pf_expert){.gate_up_bytes = rr[0].n + rr[1].n, .down_bytes = rr[2].n};
    }
    pf_decision d;
    hm_status st = pf_decide(&p->c, &p->r, p->ex, nd, p->gpu, p->why, &d, e);
    int nc = 0;
    for (int k = 0; k < nd; k++) p->slot_of[p->xs[k]] = st == HM_OK && p->gpu[k] ? nc++ : -1;
    if (p->c.debug && st == HM_OK) {
        char line[256];
        pf_format(&d, L, nd, line, sizeof(line));
        HM_LOGI("%s", line);
    }
    if (st != HM_OK || nc == 0) { /* (rates the set-up checked: no error expected) */
        if (st != HM_OK) HM_LOGD("post-fetch: layer %d: %s", L, e->msg);
        for (int k = 0; k < nd; k++) p->slot_of[p->xs[k]] = -1;
        const moe_job job = {.layer = L, .n_tok = n_tok, .n_used = K, .x = v->x, .ids = v->ids,
                             .weights = v->gw, .y = v->y};
        return moe_exec_run(t->exec, &job, NULL, &summed, e);
    }
    /* 3. the chosen down rows into their scratch slots */
    int nr = 0;
    for (int k = 0; k < nd; k++) {
        const int s = p->slot_of[p->xs[k]];
        if (s < 0) continue;
        offload_range rr[OFFLOAD_MAX_RANGES];
        offload_expert_ranges(t->m, L, p->xs[k], rr);
        p->runs[nr++] = (cuda_host_rows){.p = rr[2].p, .n = db, .rows = 1, .spitch = db,
                                         .dpitch = db, .off = (size_t)s * db};
    }
    bool any_cpu = false;
    for (int64_t i = 0; i < ns; i++) {
        const int32_t x = v->ids[i];
        const bool pf = x >= 0 && x < v->n_expert && p->slot_of[x] >= 0;
        p->ids_pf[i] = pf ? x : -1;
        p->ids_cpu[i] = pf ? -1 : x;
        any_cpu = any_cpu || (!pf && x >= 0);
    }
    hm_error ce;
    hm_error_clear(&ce);
    const int buf = cuda_fetch_buffer(L);
    bool copied = cuda_copy_lane_copy_rows(t->off.lane, buf, L, p->runs, nr, &ce) == HM_OK;
    if (!copied) HM_LOGW("post-fetch: layer %d: the copy of %d down matrices failed (%s); the "
                         "CPU computes them", L, nc, ce.msg);
    /* 4. the CPU's slots, then the chosen ones' activations (or all of them after a failure) */
    const moe_job cpu = {.layer = L, .n_tok = n_tok, .n_used = K, .x = v->x, .ids = p->ids_cpu,
                         .weights = v->gw, .y = v->y};
    st = any_cpu ? moe_exec_run(t->exec, &cpu, NULL, &summed, e) : HM_OK;
    if (st == HM_OK && copied) {
        const moe_job pj = {.layer = L, .n_tok = n_tok, .n_used = K, .x = v->x,
                            .ids = p->ids_pf, .weights = v->gw, .y = v->y};
        st = moe_exec_gate_up(t->exec, &pj, v->h, e);
    }
    /* 5. the copies landed, or the CPU's down products */
    int64_t pf_wait = 0;
    if (st == HM_OK && copied) {
        const int64_t t0 = tiered_now_ns();
        bool done = false;
        if (p->c.block_on_miss) {
            copied = cuda_copy_lane_sync_buf(t->off.lane, buf, &ce) == HM_OK;
            done = copied;
        } else {
            copied = cuda_copy_lane_query_buf(t->off.lane, buf, &done, &ce) == HM_OK;
        }
        pf_wait = tiered_now_ns() - t0;
        atomic_fetch_add(&t->pf_wait_ns, (unsigned long long)pf_wait);
        if (!copied) HM_LOGW("post-fetch: layer %d: waiting for the copies failed (%s); the CPU "
                             "computes those experts", L, ce.msg);
        copied = copied && done;
    }
    if (st == HM_OK && !copied) st = pf_cpu_all(t, p, L, n_tok, nc, e);
    if (st == HM_OK && copied) {
        for (int64_t i = 0; i < ns; i++)
            if (p->ids_pf[i] >= 0) v->fslot[i] = p->slot_of[p->ids_pf[i]];
        atomic_fetch_add(&t->pf_requests, 1);
        atomic_fetch_add(&t->pf_experts, (unsigned long long)nc);
        atomic_fetch_add(&t->pf_bytes, (unsigned long long)nc * db);
        tiered_perf_copies(t, L, &(tiered_perf_copy){.postfetch = true, .experts = (uint64_t)nc,
                                                     .bytes = (uint64_t)nc * db,
                                                     .wait_ns = pf_wait});
        if (p->r.h2d_bytes_per_s > 0)
            atomic_fetch_add(&t->pf_copy_ns, (unsigned long long)(1e9 * (double)nc *
                                                                  (double)db /
                                                                  p->r.h2d_bytes_per_s));
    }
    for (int k = 0; k < nd; k++) p->slot_of[p->xs[k]] = -1;
    return st;
}
