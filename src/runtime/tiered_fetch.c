/* tiered_fetch.c - the fetched-expert path of the CPU side (tiered.h, cuda/cuda_fetch.h): a prompt
 * ubatch's request at a host layer, served by copying some used experts to the GPU while the CPU
 * computes the others.
 *
 * DESIGN: per request, the cost model (moe/offload.h) decides from the tokens routed to each
 * expert; the GPU's experts are copied through the copy lane into staging buffer L & 1 (expert
 * j of the GPU's list at slot j), the CPU computes the rest meanwhile, the worker waits for that
 * buffer's copies and writes fslot. A failed copy is no fault: the lane is drained and the CPU
 * computes those experts too (copy_fallback).
 * Copies ahead: right after layer L's copies are enqueued, as many experts of the next host
 * layer L2 as L ran on the GPU (in a ubatch of >= AHEAD_MIN_TOK tokens per expert on average
 * nearly every expert is used, and the next layer uses about as many) are copied into buffer
 * L2 & 1, in id order, leaving out those the hot cache holds, so that the lane works through
 * L's GPU time and L2's attention instead of waiting for L2's request; at L2 the cost model
 * counts those experts' copies as done (copied) and the new ones go after them. The choice
 * depends on the ubatch's routing and the cache's map only, never on a clock, so a placement's
 * prompt output stays the same bytes from run to run. Buffer L2 & 1 is free when L's request
 * arrives: the GPU posted it after every kernel of the layers before L had run. Only when
 * L2 & 1 differs from L & 1 (the buffer L's experts are in) and the copies are direct (from the
 * registered mapping: a staged copy would hold the worker).
 */
#include "runtime/tiered_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "runtime/calibrate.h"

#define AHEAD_MIN_TOK 8 /* tokens per expert on average for copies ahead */

/* Experts x0 .. x0 + r - 1 of layer L into slots slot0 .. slot0 + r - 1: one strided run per
 * part, row j the part of expert x0 + j, when a part's experts lie back to back in the file (a
 * tensor's experts do), else one run per expert. Checked against the staging layout; appended
 * to t->runs from index nr; the new count, or -1 (e set) on a mismatch. */
static int add_runs(hm_tiered *t, int L, int x0, int r, int slot0, int nr, hm_error *e) {
    const cuda_fetch_layout *lay = &t->lay[L];
    offload_range a[OFFLOAD_MAX_RANGES], z[OFFLOAD_MAX_RANGES];
    const int np = offload_expert_ranges(t->m, L, x0, a);
    const int nz = offload_expert_ranges(t->m, L, x0 + r - 1, z);
    if (np != lay->n_parts || nz != np) {
        hm_error_set(e, HM_ERR_STATE, "fetched experts: layer %d expert %d has %d parts, the "
                     "staging layout %d", L, np != lay->n_parts ? x0 : x0 + r - 1,
                     np != lay->n_parts ? np : nz, lay->n_parts);
        return -1;
    }
    for (int i = 0; i < np; i++) {
        const size_t pb = lay->part_bytes[i];
        if (a[i].n != pb || z[i].n != pb) {
            hm_error_set(e, HM_ERR_STATE, "fetched experts: layer %d expert %d part %d is %zu "
                         "bytes, the staging layout says %zu", L, a[i].n != pb ? x0 : x0 + r - 1,
                         i, a[i].n != pb ? a[i].n : z[i].n, pb);
            return -1;
        }
        if ((const char *)z[i].p != (const char *)a[i].p + (size_t)(r - 1) * pb) {
            for (int j = 0; j < r && nr >= 0; j++) /* not back to back: one run each */
                nr = add_runs(t, L, x0 + j, 1, slot0 + j, nr, e);
            return nr;
        }
    }
    for (int i = 0; i < np; i++)
        t->runs[nr++] = (cuda_host_rows){.p = a[i].p, .n = lay->part_bytes[i], .rows = (size_t)r,
                                         .spitch = lay->part_bytes[i], .dpitch = lay->slot_bytes,
                                         .off = (size_t)slot0 * lay->slot_bytes +
                                                lay->part_off[i]};
    return nr;
}

/* Enqueues the copies of experts xs[0..n) of layer L into slots first .. first + n - 1 of its
 * buffer: each run of consecutive ids is one strided copy per part (cuda_copy_lane_copy_rows). */
static hm_status copy_experts(hm_tiered *t, int L, const int32_t *xs, int n, int first,
                              hm_error *e) {
    const cuda_fetch_layout *lay = &t->lay[L];
    if (first + n > lay->n_slots)
        return hm_error_set(e, HM_ERR_STATE, "fetched experts: layer %d: slots %d + %d, the "
                            "buffer holds %d", L, first, n, lay->n_slots);
    int nr = 0;
    for (int k = 0; k < n && nr >= 0;) {
        int r = 1;
        while (k + r < n && xs[k + r] == xs[k] + r) r++;
        nr = add_runs(t, L, xs[k], r, first + k, nr, e);
        k += r;
    }
    if (nr < 0) return HM_ERR_STATE;
    return cuda_copy_lane_copy_rows(t->off.lane, cuda_fetch_buffer(L), L, t->runs, nr, e);
}

/* A failed copy (why): the layer's fetched experts run on the CPU in this step after all. Waits
 * for whatever the lane still has in flight (copies ahead included, which are dropped), counts
 * and logs; returns the experts now fetched (none). */
static int copy_fallback(hm_tiered *t, int L, int n_fetch, const hm_error *why) {
    cuda_copy_lane_sync(t->off.lane, NULL);
    t->ahead_layer = -1;
    const unsigned long long n = atomic_fetch_add(&t->copy_fallbacks, 1) + 1;
    HM_LOGW("tiered step: layer %d: the copy of %d fetched expert%s failed (%s); the CPU computes "
            "them in this step (%llu such fallback%s so far)", L, n_fetch, n_fetch == 1 ? "" : "s",
            why->msg, n, n == 1 ? "" : "s");
    return 0;
}

/* The CPU lane on the request's slots: those of experts the plan did not send to the GPU, or
 * (fetched) those it did. */
static hm_status run_cpu_slots(hm_tiered *t, int L, int64_t n_tok, bool fetched, hm_error *e) {
    const cuda_handoff_view *v = &t->v;
    const int K = v->n_used, NE = (int)v->n_expert;
    bool any = false;
    for (int64_t i = 0; i < n_tok * K; i++) {
        const int32_t id = v->ids[i];
        const bool on = id >= 0 && id < NE && t->plan.gpu[id] == fetched;
        t->ids_cpu[i] = on ? id : -1;
        any = any || on;
    }
    if (!any) return HM_OK;
    const moe_job job = {.layer = L, .n_tok = n_tok, .n_used = K, .x = v->x, .ids = t->ids_cpu,
                         .weights = v->gw, .y = v->y};
    bool summed = false;
    return moe_exec_run(t->exec, &job, NULL, &summed, e);
}

/* Copies ahead for the host layer after index j, while layer L (= host_layers[j]) computes: as
 * many of its experts as L ran on the GPU, the hot cache's left out. */
static void copy_ahead(hm_tiered *t, int j, int64_t n_tok) {
    const int L = t->host_layers[j];
    if (j + 1 >= t->v.n_host || t->off.lane == NULL) return;
    const int L2 = t->host_layers[j + 1], NE = (int)t->v.n_expert;
    const cuda_fetch_layout *l2 = &t->lay[L2];
    if ((L2 & 1) == (L & 1) || !l2->eligible || l2->n_slots < 1 ||
        n_tok * t->v.n_used < (int64_t)AHEAD_MIN_TOK * NE)
        return;
    int m = t->plan.n_gpu < l2->n_slots ? t->plan.n_gpu : l2->n_slots;
    if (m < 1) return;
    const uint8_t *hot = tiered_hot_map(t); /* [n_layer][n_expert] or NULL */
    int n = 0;
    for (int x = 0; x < NE && n < m; x++)
        if (!hot || !hot[(size_t)L2 * (size_t)NE + (size_t)x]) t->ahead_ids[n++] = x;
    if (n < 1) return;
    offload_range rr[OFFLOAD_MAX_RANGES];
    if (offload_expert_ranges(t->m, L2, t->ahead_ids[0], rr) < 1 ||
        !cuda_copy_lane_direct(t->off.lane, rr[0].p, rr[0].n))
        return;
    hm_error e;
    hm_error_clear(&e);
    if (copy_experts(t, L2, t->ahead_ids, n, 0, &e) != HM_OK) {
        HM_LOGW("tiered step: copying layer %d's experts ahead failed (%s)", L2, e.msg);
        return;
    }
    for (int x = 0; x < NE; x++) t->ahead_slot[x] = -1;
    for (int k = 0; k < n; k++) t->ahead_slot[t->ahead_ids[k]] = k;
    t->ahead_layer = L2;
    t->ahead_n = n;
    atomic_fetch_add(&t->ahead_experts, (unsigned long long)n);
    atomic_fetch_add(&t->fetched_bytes, (unsigned long long)n * l2->slot_bytes);
    tiered_perf_copies(t, L2, &(tiered_perf_copy){.bytes = (uint64_t)n * l2->slot_bytes});
    if (t->off.debug) HM_LOGI("sched layer %d: %d experts of layer %d copied ahead", L, n, L2);
}

hm_status tiered_fetch_alloc(hm_tiered *t, hm_error *err) {
    const int nl = t->v.n_layer, ne = (int)t->v.n_expert;
    const size_t nr = (size_t)ne * CUDA_FETCH_MAX_PARTS;
    t->dbg_cap = 256 + (size_t)ne * 24;
    t->rates = calloc((size_t)nl, sizeof(*t->rates));
    t->lay = calloc((size_t)nl, sizeof(*t->lay));
    t->ex = calloc((size_t)ne, sizeof(*t->ex));
    t->counts = calloc((size_t)ne, sizeof(*t->counts));
    t->fslot_of = calloc((size_t)ne, sizeof(*t->fslot_of));
    t->ahead_ids = calloc((size_t)ne, sizeof(*t->ahead_ids));
    t->ahead_slot = calloc((size_t)ne, sizeof(*t->ahead_slot));
    t->ids_cpu = calloc((size_t)t->v.n_tok_max * (size_t)t->v.n_used, sizeof(*t->ids_cpu));
    t->runs = calloc(nr, sizeof(*t->runs));
    t->dbg = calloc(t->dbg_cap, 1);
    if (!t->rates || !t->lay || !t->ex || !t->counts || !t->fslot_of || !t->ahead_ids || !t->ahead_slot ||
        !t->ids_cpu ||
        !t->runs || !t->dbg)
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (tiered: fetched experts)");
    hm_status st = offload_plan_init(&t->plan, ne, err);
    if (st != HM_OK) return st;
    calib_result c;
    calib_defaults(t->m, false, &c);
    for (int il = 0; il < nl; il++) calib_layer_rates(&c, t->m, il, &t->rates[il]);
    t->off.rates = t->rates;
    t->ahead_layer = -1;
    return HM_OK;
}

void tiered_fetch_release(hm_tiered *t) {
    offload_plan_free(&t->plan);
    free(t->rates);
    free(t->lay);
    free(t->ex);
    free(t->counts);
    free(t->fslot_of);
    free(t->ahead_ids);
    free(t->ahead_slot);
    free(t->ids_cpu);
    free(t->runs);
    free(t->dbg);
}

static void debug_plan(hm_tiered *t, int L, int ahead) {
    offload_plan_format(&t->plan, L, t->ex, t->dbg, t->dbg_cap);
    size_t n = strlen(t->dbg);
    if (n && t->dbg[n - 1] == '\n') t->dbg[n - 1] = 0;
    if (ahead) HM_LOGI("%s\n  copied ahead: %d experts (no copy above)", t->dbg, ahead);
    else HM_LOGI("%s", t->dbg);
}

hm_status tiered_serve_fetch(hm_tiered *t, int j, const cuda_handoff_msg *m, hm_error *e) {
    const cuda_handoff_view *v = &t->v;
    const int L = t->host_layers[j];
    const int K = v->n_used, NE = (int)v->n_expert;
    const int64_t n_pairs = (int64_t)m->n_tok * K;
    const cuda_fetch_layout *lay = &t->lay[L];
    const int ahead = t->ahead_layer == L ? t->ahead_n : 0; /* slots 0 .. ahead-1, ahead_slot */
    t->ahead_layer = -1;
    atomic_fetch_add(&t->fetch_requests, 1);
    offload_count_tokens(v->ids, m->n_tok, K, NE, t->counts);
    for (int x = 0; x < NE; x++)
        t->ex[x] = (offload_expert){.n_tok = t->counts[x], .bytes = lay->slot_bytes,
                                    .copied = ahead > 0 && t->ahead_slot[x] >= 0};
    offload_rates r = t->rates[L];
    const bool can = t->off.lane && lay->eligible && lay->n_slots > 0;
    if (!can) r.h2d_bytes_per_s = 0; /* every expert on the CPU: "no GPU" */
    const offload_opts o = {.threshold = t->off.threshold,
                            .cap_bytes = (uint64_t)(lay->n_slots - ahead) * lay->slot_bytes};
    hm_status st = offload_decide(&t->plan, m->n_tok, t->ex, &r, &o, e);
    if (st != HM_OK) return st;
    if (t->off.debug) debug_plan(t, L, ahead);
    /* the GPU's experts: those copied ahead in their slots, the others after them in id order */
    int n_fetch = 0, n_new = 0, used_ahead = 0;
    for (int x = 0; x < NE; x++) {
        t->fslot_of[x] = -1;
        if (!t->plan.gpu[x]) continue;
        n_fetch++;
        if (ahead > 0 && t->ahead_slot[x] >= 0) {
            t->fslot_of[x] = t->ahead_slot[x];
            used_ahead++;
        } else {
            t->fslot_of[x] = ahead + n_new;
            t->ahead_ids[n_new++] = x;
        }
    }
    atomic_fetch_add(&t->ahead_used, (unsigned long long)used_ahead);
    bool copied = false; /* this layer's copies in flight */
    tiered_perf_copy pc = {0}; /* what they did, for the layer perf */
    const int64_t tq = tiered_now_ns();
    if (n_fetch > 0) {
        hm_error ce;
        hm_error_clear(&ce);
        atomic_fetch_add(&t->copies, 1);
        if (n_new == 0 || copy_experts(t, L, t->ahead_ids, n_new, ahead, &ce) == HM_OK) {
            copied = true;
        } else {
            pc.fallbacks = (uint64_t)n_fetch;
            n_fetch = copy_fallback(t, L, n_fetch, &ce);
        }
    }
    if (copied) copy_ahead(t, j, m->n_tok);
    atomic_fetch_add(&t->copy_enqueue_ns, (unsigned long long)(tiered_now_ns() - tq));
    /* the CPU's slots meanwhile (all of them after a failed start) */
    st = run_cpu_slots(t, L, m->n_tok, false, e);
    if (st == HM_OK && n_fetch == 0) st = run_cpu_slots(t, L, m->n_tok, true, e);
    if (copied) {
        const int64_t t0 = tiered_now_ns();
        hm_error ce;
        hm_error_clear(&ce);
        hm_status cs = cuda_copy_lane_sync_buf(t->off.lane, cuda_fetch_buffer(L), &ce);
        pc.wait_ns = tiered_now_ns() - t0;
        atomic_fetch_add(&t->copy_wait_ns, (unsigned long long)pc.wait_ns);
        const uint64_t nc = atomic_load(&t->copies);
        if (cs == HM_OK && t->p.copy_fail_from && nc >= t->p.copy_fail_from)
            cs = hm_error_set(&ce, HM_ERR_STATE, "test hook: copy %llu fails",
                              (unsigned long long)nc);
        if (cs != HM_OK) { /* the fetched experts on the CPU after all */
            pc.fallbacks = (uint64_t)n_fetch;
            n_fetch = copy_fallback(t, L, n_fetch, &ce);
            if (st == HM_OK) st = run_cpu_slots(t, L, m->n_tok, true, e);
        }
    }
    if (st != HM_OK) return st;
    for (int x = 0; n_fetch == 0 && x < NE; x++) t->fslot_of[x] = -1;
    for (int64_t i = 0; i < n_pairs; i++) {
        const int32_t id = v->ids[i];
        v->fslot[i] = id >= 0 && id < NE ? t->fslot_of[id] : -1;
    }
    const int n_gpu = n_fetch > 0 ? t->plan.n_gpu : 0;
    atomic_fetch_add(&t->gpu_experts, (unsigned long long)n_gpu);
    atomic_fetch_add(&t->cpu_experts, (unsigned long long)(t->plan.n_used - n_gpu));
    atomic_fetch_add(&t->fetched_bytes, (unsigned long long)(n_fetch > 0 ? n_new : 0) *
                                            lay->slot_bytes);
    pc.experts = (uint64_t)n_gpu;
    pc.bytes = (uint64_t)(n_fetch > 0 ? n_new : 0) * lay->slot_bytes;
    tiered_perf_copies(t, L, &pc);
    return HM_OK;
}
