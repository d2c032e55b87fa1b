/* tiered.c - the CPU side of the tiered decode step (tiered.h; the protocol: cuda/cuda_handoff.h).
 *
 * DESIGN: one worker thread, which is also thread 0 of the pool the expert products run on. Its
 * loop: if a reset asked it to pause, it acknowledges and naps until released; if the hand-off's
 * abort word is set (or the test hook stalled it) it serves nothing; otherwise it scans the host
 * layers' flags, starting at the layer it served last (the GPU asks in layer order), for one
 * whose ready differs from its done (acquire load), and serves it: checks the message against
 * the flag (sequence number, layer, 1 <= n_tok <= n_tok_max, n_used, expert ids in [-1,
 * n_expert)), runs the executor's CPU lane on the rows (moe_exec_run: y [n_tok][n_used][n_embd],
 * unweighted, expert biases included; skipped slots left alone, as the merge skips them), then
 * stores done = ready (release). With nothing to do it waits in three steps: spins with a pause
 * for TIERED_SPIN_NS, then yields its core until TIERED_YIELD_NS of idleness, then naps
 * (TIERED_NAP_NS, TIERED_NAP_LONG_NS after a second): a decode step's layers follow each other
 * within microseconds, an idle engine costs almost nothing.
 * A failed copy of a prompt ubatch's fetched experts is not a fault: the worker waits for the
 * lane to drain and computes those experts itself (copy_fallback), counted and logged.
 * Faults (a malformed request, an FFN error, an injected failure) are counted, logged, the first
 * one's message kept for hm_tiered_check, and the abort word is set (seq_cst) so that the GPU's
 * wait ends at once; the worker then serves nothing until hm_tiered_reset, which sets abort
 * itself first (a wait in flight must end before the engine's stream can drain), pauses the
 * worker, has the engine (or, for a caller-owned view, this file) clear the hand-off, and
 * releases the worker. Fields the worker owns (served count, hooks, stalled) are touched by
 * reset only while the worker is paused.
 */
#include "runtime/tiered.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/cpu.h"
#include "base/log.h"
#include "base/spin.h"
#include "cuda/cuda_fetch.h"
#include "cuda/cuda_host.h"
#include "moe/moe_exec.h"
#include "runtime/calibrate.h"

#define TIERED_SPIN_NS 50000ll          /* spin with a pause this long, then yield */
#define TIERED_YIELD_NS 20000000ll      /* yield until idle this long, then nap */
#define TIERED_NAP_NS 50000l            /* a nap until idle for a second */
#define TIERED_NAP_LONG_NS 1000000l     /* a nap after that */
#define TIERED_TIMEOUT_MS_DEFAULT 20000u

struct hm_tiered {
    const hm_model *m;
    struct cuda_engine *gpu; /* NULL: a view its caller owns (tests) */
    cuda_handoff_view v;
    int32_t *host_layers;    /* [v.n_host] copy of the view's list */
    hm_tiered_params p;
    tp_pool *pool;
    bool own_pool;
    moe_exec *exec;
    pthread_t th;
    bool started;
    bool attached;           /* this object is the engine's CPU side */
    atomic_int stop, pause_req, paused;
    /* the worker's own */
    int cursor;              /* index into host_layers of the last request served */
    uint64_t served;         /* requests taken (the test hooks count them) */
    bool stalled;            /* stall_after reached: serves nothing until reset */
    /* counters */
    atomic_ullong requests, tokens, faults, aborts, resets, busy_ns;
    /* the first fault since the last reset */
    pthread_mutex_t mu;
    bool has_fault;
    hm_error fault;
    /* the fetched-expert path (hm_tiered_set_offload; arrays allocated at init) */
    hm_tiered_offload off;       /* off.rates points at rates */
    offload_rates *rates;        /* [n_layer] */
    cuda_fetch_layout *lay;      /* [n_layer] staging layouts (the engine's) */
    offload_plan plan;           /* [n_expert] decisions of the request being served */
    offload_expert *ex;          /* [n_expert] tokens and staging bytes */
    int32_t *counts;             /* [n_expert] */
    int32_t *fslot_of;           /* [n_expert] staging slot of a fetched expert, else -1 */
    int32_t *ids_cpu;            /* [n_tok_max][n_used] ids with fetched slots masked (-1) */
    cuda_host_range *ranges;     /* [n_expert * CUDA_FETCH_MAX_PARTS] the copies */
    size_t *offs;                /* [n_expert * CUDA_FETCH_MAX_PARTS] where the lane put them */
    char *dbg;                   /* HOTMOE_SCHED_DEBUG text */
    size_t dbg_cap;
    atomic_ullong fetch_requests, gpu_experts, cpu_experts, fetched_bytes, copy_wait_ns;
    atomic_ullong copies, copy_fallbacks, retries;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void nap(long ns) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

static uint32_t load_acq(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

/* Sets the abort word (the GPU's waits end); counted when it was clear. */
static void set_abort(hm_tiered *t, bool count) {
    uint32_t old = __atomic_exchange_n(&t->v.ctl->abort, (uint32_t)CUDA_HANDOFF_ABORT_HOST,
                                       __ATOMIC_SEQ_CST);
    if (count && old == 0) atomic_fetch_add(&t->aborts, 1);
}

/* Keeps the first fault's message, counts it (fault: a failed request), logs it. */
static void record(hm_tiered *t, const hm_error *e, bool fault) {
    pthread_mutex_lock(&t->mu);
    if (!t->has_fault) {
        t->fault = *e;
        t->has_fault = true;
    }
    pthread_mutex_unlock(&t->mu);
    if (fault) atomic_fetch_add(&t->faults, 1);
    HM_LOGE("tiered step: %s", e->msg);
}

/* Starts the copies of the n_fetch experts whose n_rng ranges serve_fetch gathered into staging
 * buffer L & 1 and checks that the lane put them where the engine's layout expects. */
static hm_status copy_start(hm_tiered *t, int L, const cuda_fetch_layout *lay, int n_fetch,
                            int n_rng, hm_error *e) {
    atomic_fetch_add(&t->copies, 1);
    hm_status st = cuda_copy_lane_copy(t->off.lane, cuda_fetch_buffer(L), L, t->ranges, n_rng,
                                       t->offs, e);
    for (int j = 0; st == HM_OK && j < n_fetch; j++)
        for (int i = 0; st == HM_OK && i < lay->n_parts; i++) {
            const size_t want = (size_t)j * lay->slot_bytes + lay->part_off[i];
            if (t->offs[j * lay->n_parts + i] != want)
                st = hm_error_set(e, HM_ERR_STATE, "fetched experts: the copy lane put part %d "
                                  "of slot %d at %zu, the layout expects %zu", i, j,
                                  t->offs[j * lay->n_parts + i], want);
        }
    return st;
}

/* A failed copy (why): the layer's fetched experts run on the CPU in this step after all. Waits
 * for whatever the lane still has in flight, counts and logs; returns the experts now fetched
 * (none). */
static int copy_fallback(hm_tiered *t, int L, int n_fetch, const hm_error *why) {
    cuda_copy_lane_sync(t->off.lane, NULL);
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

/* A request with msg.fetch (a prompt ubatch, cuda/cuda_fetch.h): decide, start the copies of the
 * GPU's experts, compute the CPU's, wait for the copies, write fslot. The caller answers. */
static hm_status serve_fetch(hm_tiered *t, int L, const cuda_handoff_msg *m, hm_error *e) {
    const cuda_handoff_view *v = &t->v;
    const int K = v->n_used, NE = (int)v->n_expert;
    const int64_t n_pairs = (int64_t)m->n_tok * K;
    const cuda_fetch_layout *lay = &t->lay[L];
    atomic_fetch_add(&t->fetch_requests, 1);
    offload_count_tokens(v->ids, m->n_tok, K, NE, t->counts);
    for (int x = 0; x < NE; x++)
        t->ex[x] = (offload_expert){.n_tok = t->counts[x], .bytes = lay->slot_bytes};
    offload_rates r = t->rates[L];
    const bool can = t->off.lane && lay->eligible && lay->n_slots > 0;
    if (!can) r.h2d_bytes_per_s = 0; /* every expert on the CPU: "no GPU" */
    const offload_opts o = {.threshold = t->off.threshold,
                            .cap_bytes = (uint64_t)lay->n_slots * lay->slot_bytes};
    hm_status st = offload_decide(&t->plan, m->n_tok, t->ex, &r, &o, e);
    if (st != HM_OK) return st;
    if (t->off.debug) {
        offload_plan_format(&t->plan, L, t->ex, t->dbg, t->dbg_cap);
        size_t n = strlen(t->dbg);
        if (n && t->dbg[n - 1] == '\n') t->dbg[n - 1] = 0;
        HM_LOGI("%s", t->dbg);
    }
    /* the GPU's experts in id order: staging slot j, parts at the engine's offsets */
    int n_fetch = 0, n_rng = 0;
    for (int x = 0; x < NE; x++) {
        t->fslot_of[x] = -1;
        if (!t->plan.gpu[x]) continue;
        offload_range rr[OFFLOAD_MAX_RANGES];
        const int np = offload_expert_ranges(t->m, L, x, rr);
        if (np != lay->n_parts || n_fetch >= lay->n_slots)
            return hm_error_set(e, HM_ERR_STATE, "fetched experts: layer %d expert %d has %d "
                                "parts, the staging layout %d (slot %d of %d)", L, x, np,
                                lay->n_parts, n_fetch, lay->n_slots);
        for (int i = 0; i < np; i++) {
            if (rr[i].n != lay->part_bytes[i])
                return hm_error_set(e, HM_ERR_STATE, "fetched experts: layer %d expert %d part "
                                    "%d is %zu bytes, the staging layout says %zu", L, x, i,
                                    rr[i].n, lay->part_bytes[i]);
            t->ranges[n_rng++] = (cuda_host_range){rr[i].p, rr[i].n};
        }
        t->fslot_of[x] = n_fetch++;
    }
    bool copied = false; /* copies in flight */
    if (n_fetch > 0) {
        hm_error ce;
        hm_error_clear(&ce);
        if (copy_start(t, L, lay, n_fetch, n_rng, &ce) == HM_OK) copied = true;
        else n_fetch = copy_fallback(t, L, n_fetch, &ce);
    }
    /* the CPU's slots meanwhile (all of them after a failed start) */
    st = run_cpu_slots(t, L, m->n_tok, false, e);
    if (st == HM_OK && n_fetch == 0) st = run_cpu_slots(t, L, m->n_tok, true, e);
    if (copied) {
        const int64_t t0 = now_ns();
        hm_error ce;
        hm_error_clear(&ce);
        hm_status cs = cuda_copy_lane_sync(t->off.lane, &ce);
        atomic_fetch_add(&t->copy_wait_ns, (unsigned long long)(now_ns() - t0));
        const uint64_t nc = atomic_load(&t->copies);
        if (cs == HM_OK && t->p.copy_fail_from && nc >= t->p.copy_fail_from)
            cs = hm_error_set(&ce, HM_ERR_STATE, "test hook: copy %llu fails",
                              (unsigned long long)nc);
        if (cs != HM_OK) { /* the fetched experts on the CPU after all */
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
    atomic_fetch_add(&t->fetched_bytes, (unsigned long long)n_fetch * lay->slot_bytes);
    return HM_OK;
}

/* The request of host layer index j: checked, computed, answered; or a fault (abort). */
static void serve(hm_tiered *t, int j) {
    const cuda_handoff_view *v = &t->v;
    const int L = t->host_layers[j];
    cuda_handoff_flags *f = &v->flags[L];
    const uint32_t r = load_acq(&f->ready);
    t->served++;
    if (t->p.stall_after && t->served > t->p.stall_after) {
        t->p.stall_after = 0; /* one shot */
        t->stalled = true;
        HM_LOGW("tiered step: test hook: no answer from request %llu on (layer %d)",
                (unsigned long long)t->served, L);
        return;
    }
    const cuda_handoff_msg m = *v->msg; /* after the acquire of ready */
    const int K = v->n_used;
    hm_error e;
    hm_error_clear(&e);
    hm_status st = HM_OK;
    if (m.seq != r || m.layer != (uint32_t)L || m.n_tok < 1 || m.n_tok > (uint32_t)v->n_tok_max ||
        m.n_used != (uint32_t)K)
        st = hm_error_set(&e, HM_ERR_FORMAT, "malformed request on layer %d's flag (step %u): the "
                          "message says step %u, layer %u, %u tokens x %u slots (at most %d x "
                          "%d)", L, r, m.seq, m.layer, m.n_tok, m.n_used, v->n_tok_max, K);
    for (int64_t i = 0; st == HM_OK && i < (int64_t)m.n_tok * K; i++)
        if (v->ids[i] < -1 || v->ids[i] >= v->n_expert)
            st = hm_error_set(&e, HM_ERR_FORMAT, "request of layer %d step %u: expert id %d at "
                              "token %lld slot %lld (the layer has %lld experts)", L, r,
                              v->ids[i], (long long)(i / K), (long long)(i % K),
                              (long long)v->n_expert);
    if (st == HM_OK && t->p.fail_after && t->served > t->p.fail_after) {
        t->p.fail_after = 0; /* one shot */
        st = hm_error_set(&e, HM_ERR_STATE, "test hook: request %llu (layer %d step %u) fails",
                          (unsigned long long)t->served, L, r);
    }
    if (st == HM_OK) {
        const int64_t t0 = now_ns();
        if (m.fetch) {
            st = serve_fetch(t, L, &m, &e);
        } else {
            const moe_job job = {.layer = L, .n_tok = m.n_tok, .n_used = K, .x = v->x,
                                 .ids = v->ids, .weights = v->gw, .y = v->y};
            bool summed = false;
            st = moe_exec_run(t->exec, &job, NULL, &summed, &e);
        }
        atomic_fetch_add(&t->busy_ns, (unsigned long long)(now_ns() - t0));
    }
    if (st != HM_OK) {
        record(t, &e, true);
        set_abort(t, true);
        return;
    }
    /* counted before the answer: once the GPU has it, the caller may read the counters */
    atomic_fetch_add(&t->requests, 1);
    atomic_fetch_add(&t->tokens, m.n_tok);
    __atomic_store_n(&f->done, r, __ATOMIC_RELEASE);
}

/* Index into host_layers of a layer with a request not answered yet, or -1. */
static int find_pending(hm_tiered *t) {
    const int n = t->v.n_host;
    for (int k = 0; k < n; k++) {
        const int j = (t->cursor + k) % n;
        const cuda_handoff_flags *f = &t->v.flags[t->host_layers[j]];
        if (load_acq(&f->ready) != __atomic_load_n(&f->done, __ATOMIC_RELAXED)) {
            t->cursor = j;
            return j;
        }
    }
    return -1;
}

/* One step of waiting with nothing to do; *idle0: when the idleness began (0: not idle). */
static void idle_step(int64_t *idle0, unsigned *spins) {
    if (*idle0 == 0) {
        *idle0 = now_ns();
        *spins = 0;
    }
    if ((++*spins & 63u) != 0) { /* the clock every 64 pauses */
        HM_SPIN_RELAX();
        return;
    }
    const int64_t idle = now_ns() - *idle0;
    if (idle < TIERED_SPIN_NS) HM_SPIN_RELAX();
    else if (idle < TIERED_YIELD_NS) sched_yield();
    else nap(idle < 1000000000ll ? TIERED_NAP_NS : TIERED_NAP_LONG_NS);
}

static void *worker_main(void *arg) {
    hm_tiered *t = arg;
    int64_t idle0 = 0;
    unsigned spins = 0;
    while (!atomic_load(&t->stop)) {
        if (atomic_load(&t->pause_req)) {
            atomic_store(&t->paused, 1);
            while (atomic_load(&t->pause_req) && !atomic_load(&t->stop)) nap(TIERED_NAP_NS);
            atomic_store(&t->paused, 0);
            idle0 = 0;
            continue;
        }
        int j = -1;
        if (!t->stalled && load_acq(&t->v.ctl->abort) == 0) j = find_pending(t);
        if (j < 0) {
            idle_step(&idle0, &spins);
            continue;
        }
        idle0 = 0;
        serve(t, j);
    }
    return NULL;
}

/* The hand-off as after a reset: no abort, no fault, every request answered. The GPU (or the
 * test playing it) must not be posting. */
static void view_clear(const cuda_handoff_view *v) {
    for (int i = 0; i < v->n_host; i++) {
        cuda_handoff_flags *f = &v->flags[v->host_layers[i]];
        __atomic_store_n(&f->done, load_acq(&f->ready), __ATOMIC_SEQ_CST);
    }
    v->ctl->fault = 0;
    v->ctl->fault_layer = 0;
    v->ctl->fault_seq = 0;
    __atomic_store_n(&v->ctl->abort, 0u, __ATOMIC_SEQ_CST);
}

hm_tiered_params hm_tiered_default_params(void) {
    hm_tiered_params p;
    memset(&p, 0, sizeof(p));
    return p;
}

static hm_status check_view(const hm_model *m, const cuda_handoff_view *v, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(m);
    if (!v->ctl || !v->flags || !v->msg || !v->ids || !v->gw || !v->x || !v->y ||
        !v->host_layers || v->n_host < 1 || v->n_tok_max < 1)
        return hm_error_set(err, HM_ERR_ARG, "tiered: an empty hand-off (%d host layers, %d "
                            "tokens)", v->n_host, v->n_tok_max);
    if (v->n_layer != hp->n_layer || v->n_embd != hp->n_embd || v->n_used != hp->n_expert_used ||
        v->n_expert != hp->n_expert)
        return hm_error_set(err, HM_ERR_ARG, "tiered: a hand-off for %d layers, rows of %d, %d "
                            "of %lld experts, for a model of %lld layers, %lld, %lld of %lld",
                            v->n_layer, v->n_embd, v->n_used, (long long)v->n_expert,
                            (long long)hp->n_layer, (long long)hp->n_embd,
                            (long long)hp->n_expert_used, (long long)hp->n_expert);
    for (int i = 0; i < v->n_host; i++) {
        const int L = v->host_layers[i];
        if (L < 0 || L >= v->n_layer || (i > 0 && L <= v->host_layers[i - 1]) ||
            !hm_model_layer(m, L)->gate_exps.data)
            return hm_error_set(err, HM_ERR_ARG, "tiered: host layer %d (entry %d) is not an "
                                "ascending MoE layer of the model", L, i);
    }
    return HM_OK;
}

/* The fetched path's arrays; rates the defaults, no lane, no layouts (every expert on the CPU)
 * until hm_tiered_set_offload. */
static hm_status offload_alloc(hm_tiered *t, hm_error *err) {
    const int nl = t->v.n_layer, ne = (int)t->v.n_expert;
    const size_t nr = (size_t)ne * CUDA_FETCH_MAX_PARTS;
    t->dbg_cap = 256 + (size_t)ne * 24;
    t->rates = calloc((size_t)nl, sizeof(*t->rates));
    t->lay = calloc((size_t)nl, sizeof(*t->lay));
    t->ex = calloc((size_t)ne, sizeof(*t->ex));
    t->counts = calloc((size_t)ne, sizeof(*t->counts));
    t->fslot_of = calloc((size_t)ne, sizeof(*t->fslot_of));
    t->ids_cpu = calloc((size_t)t->v.n_tok_max * (size_t)t->v.n_used, sizeof(*t->ids_cpu));
    t->ranges = calloc(nr, sizeof(*t->ranges));
    t->offs = calloc(nr, sizeof(*t->offs));
    t->dbg = calloc(t->dbg_cap, 1);
    if (!t->rates || !t->lay || !t->ex || !t->counts || !t->fslot_of || !t->ids_cpu ||
        !t->ranges || !t->offs || !t->dbg)
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (tiered: fetched experts)");
    hm_status st = offload_plan_init(&t->plan, ne, err);
    if (st != HM_OK) return st;
    calib_result c;
    calib_defaults(t->m, false, &c);
    for (int il = 0; il < nl; il++) calib_layer_rates(&c, t->m, il, &t->rates[il]);
    t->off.rates = t->rates;
    return HM_OK;
}

static void offload_release(hm_tiered *t) {
    offload_plan_free(&t->plan);
    free(t->rates);
    free(t->lay);
    free(t->ex);
    free(t->counts);
    free(t->fslot_of);
    free(t->ids_cpu);
    free(t->ranges);
    free(t->offs);
    free(t->dbg);
}

static hm_status init_common(const hm_model *m, struct cuda_engine *gpu,
                             const cuda_handoff_view *v, const hm_tiered_params *p,
                             hm_tiered **out, hm_error *err) {
    *out = NULL;
    hm_status st = check_view(m, v, err);
    if (st != HM_OK) return st;
    if (p && !p->pool && (p->n_threads < 0 || p->n_threads > 1024))
        return hm_error_set(err, HM_ERR_ARG, "tiered: %d threads (0..1024)", p->n_threads);
    hm_tiered *t = calloc(1, sizeof(*t));
    if (!t) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (tiered)");
    t->m = m;
    t->gpu = gpu;
    t->v = *v;
    t->p = p ? *p : hm_tiered_default_params();
    pthread_mutex_init(&t->mu, NULL);
    t->host_layers = malloc(sizeof(int32_t) * (size_t)v->n_host);
    if (!t->host_layers) {
        hm_tiered_free(t);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (tiered)");
    }
    memcpy(t->host_layers, v->host_layers, sizeof(int32_t) * (size_t)v->n_host);
    t->v.host_layers = t->host_layers;
    if (t->p.pool) {
        t->pool = t->p.pool;
    } else {
        int n = t->p.n_threads;
        if (n == 0) n = hm_cpu_count_allowed() > 1 ? hm_cpu_count_allowed() - 1 : 1;
        st = tp_init(n, &t->pool, err);
        if (st != HM_OK) {
            hm_tiered_free(t);
            return st;
        }
        t->own_pool = true;
    }
    st = moe_exec_init(m, t->pool, v->n_tok_max, &t->exec, err);
    if (st == HM_OK) st = offload_alloc(t, err);
    if (st != HM_OK) {
        hm_tiered_free(t);
        return st;
    }
    uint64_t ms = t->p.timeout_ms ? t->p.timeout_ms : TIERED_TIMEOUT_MS_DEFAULT;
    const char *env = getenv("HOTMOE_TIERED_TIMEOUT_MS");
    if (env && *env) {
        char *end = NULL;
        unsigned long long x = strtoull(env, &end, 10);
        if (end && !*end) ms = x;
    }
    /* the engine's one CPU side; then a clean hand-off: the engine's reset waits for its stream
     * (nothing waits: abort first) */
    if (gpu) {
        st = cuda_engine_handoff_attach(gpu, true, err);
        t->attached = st == HM_OK;
        if (st == HM_OK) st = cuda_engine_handoff_reset(gpu, err);
        if (st != HM_OK) {
            hm_tiered_free(t);
            return st;
        }
    }
    if (!gpu) view_clear(&t->v);
    t->v.ctl->timeout_ns = ms * 1000000ull;
    if (pthread_create(&t->th, NULL, worker_main, t) != 0) {
        hm_tiered_free(t);
        return hm_error_set(err, HM_ERR_NOMEM, "tiered: cannot start the worker thread");
    }
    t->started = true;
    HM_LOGI("tiered: the CPU computes the experts of %d layer%s (%d threads, GPU wait timeout "
            "%llu ms)", v->n_host, v->n_host == 1 ? "" : "s", tp_size(t->pool),
            (unsigned long long)ms);
    *out = t;
    return HM_OK;
}

hm_status hm_tiered_init(const hm_model *m, struct cuda_engine *gpu, const hm_tiered_params *p,
                         hm_tiered **out, hm_error *err) {
    *out = NULL;
    if (!m || !gpu) return hm_error_set(err, HM_ERR_ARG, "tiered: no model or no engine");
    cuda_handoff_view v;
    hm_status st = cuda_engine_handoff_view(gpu, &v, err);
    if (st != HM_OK) return st;
    return init_common(m, gpu, &v, p, out, err);
}

hm_status hm_tiered_init_view(const hm_model *m, const cuda_handoff_view *v,
                              const hm_tiered_params *p, hm_tiered **out, hm_error *err) {
    *out = NULL;
    if (!m || !v) return hm_error_set(err, HM_ERR_ARG, "tiered: no model or no hand-off");
    return init_common(m, NULL, v, p, out, err);
}

void hm_tiered_free(hm_tiered *t) {
    if (!t) return;
    if (t->started) {
        set_abort(t, true); /* a GPU wait in flight ends now */
        atomic_store(&t->stop, 1);
        pthread_join(t->th, NULL);
    }
    if (t->attached) cuda_engine_handoff_attach(t->gpu, false, NULL);
    moe_exec_free(t->exec);
    offload_release(t);
    if (t->own_pool) tp_free(t->pool);
    free(t->host_layers);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

void hm_tiered_abort(hm_tiered *t, const char *why) {
    if (!t) return;
    hm_error e;
    hm_error_set(&e, HM_ERR_STATE, "aborted by the caller (%s)", why ? why : "no reason given");
    record(t, &e, false);
    set_abort(t, true);
}

hm_status hm_tiered_reset(hm_tiered *t, hm_error *err) {
    if (!t) return hm_error_set(err, HM_ERR_ARG, "tiered: no object");
    set_abort(t, false); /* no GPU wait may last while the engine's stream drains */
    atomic_store(&t->pause_req, 1);
    while (t->started && !atomic_load(&t->paused)) nap(TIERED_NAP_NS);
    hm_status st = t->gpu ? cuda_engine_handoff_reset(t->gpu, err) : HM_OK;
    if (!t->gpu) view_clear(&t->v);
    t->stalled = false; /* the worker is paused: its fields are ours */
    t->cursor = 0;
    pthread_mutex_lock(&t->mu);
    t->has_fault = false;
    hm_error_clear(&t->fault);
    pthread_mutex_unlock(&t->mu);
    atomic_fetch_add(&t->resets, 1);
    atomic_store(&t->pause_req, 0);
    return st;
}

static bool rate_ok(double x) { return x >= 0 && x < 1e300; }

hm_status hm_tiered_set_offload(hm_tiered *t, const hm_tiered_offload *o, hm_error *err) {
    if (!t || !o) return hm_error_set(err, HM_ERR_ARG, "tiered: no object or no offload setup");
    if (o->threshold < 0)
        return hm_error_set(err, HM_ERR_ARG, "--moe-offload-threshold %lld (>= 0; 0: the cost "
                            "model)", (long long)o->threshold);
    const int nl = t->v.n_layer;
    for (int il = 0; o->rates && il < nl; il++) {
        const offload_rates *r = &o->rates[il];
        if (!rate_ok(r->h2d_bytes_per_s) || !rate_ok(r->gpu_fixed_s) || !rate_ok(r->gpu_tok_s) ||
            !rate_ok(r->cpu_fixed_s_per_byte) || !rate_ok(r->cpu_tok_s_per_byte))
            return hm_error_set(err, HM_ERR_ARG, "tiered: layer %d's offload rates are not "
                                "finite and >= 0", il);
    }
    atomic_store(&t->pause_req, 1); /* the worker's fields: ours while it is paused */
    while (t->started && !atomic_load(&t->paused)) nap(TIERED_NAP_NS);
    t->off = *o;
    if (o->rates) memcpy(t->rates, o->rates, sizeof(*t->rates) * (size_t)nl);
    t->off.rates = t->rates;
    for (int il = 0; il < nl; il++) {
        if (t->gpu) cuda_engine_fetch_layout(t->gpu, il, &t->lay[il]);
        else memset(&t->lay[il], 0, sizeof(t->lay[il]));
    }
    atomic_store(&t->pause_req, 0);
    return HM_OK;
}

tp_pool *hm_tiered_pool(hm_tiered *t) { return t ? t->pool : NULL; }

hm_status hm_tiered_check(hm_tiered *t, hm_error *err) {
    if (!t) return HM_OK;
    pthread_mutex_lock(&t->mu);
    hm_status st = HM_OK;
    if (t->has_fault)
        st = hm_error_set(err, HM_ERR_STATE, "tiered step: the CPU side failed: %s",
                          t->fault.msg);
    pthread_mutex_unlock(&t->mu);
    return st;
}

void hm_tiered_get_stats(hm_tiered *t, hm_tiered_stats *s) {
    memset(s, 0, sizeof(*s));
    if (!t) return;
    s->requests = atomic_load(&t->requests);
    s->tokens = atomic_load(&t->tokens);
    s->faults = atomic_load(&t->faults);
    s->aborts = atomic_load(&t->aborts);
    s->resets = atomic_load(&t->resets);
    s->busy_s = (double)atomic_load(&t->busy_ns) * 1e-9;
    s->fetch_requests = atomic_load(&t->fetch_requests);
    s->gpu_experts = atomic_load(&t->gpu_experts);
    s->cpu_experts = atomic_load(&t->cpu_experts);
    s->fetched_bytes = atomic_load(&t->fetched_bytes);
    s->copy_wait_s = (double)atomic_load(&t->copy_wait_ns) * 1e-9;
    s->copies = atomic_load(&t->copies);
    s->copy_fallbacks = atomic_load(&t->copy_fallbacks);
    s->retries = atomic_load(&t->retries);
}

void hm_tiered_count_retry(hm_tiered *t) {
    if (t) atomic_fetch_add(&t->retries, 1);
}

void hm_tiered_set_test_hooks(hm_tiered *t, uint64_t fail_after, uint64_t stall_after,
                              uint64_t copy_fail_from) {
    if (!t) return;
    atomic_store(&t->pause_req, 1); /* the worker's fields: ours while it is paused */
    while (t->started && !atomic_load(&t->paused)) nap(TIERED_NAP_NS);
    t->served = 0;
    t->p.fail_after = fail_after;
    t->p.stall_after = stall_after;
    t->p.copy_fail_from = copy_fail_from ? atomic_load(&t->copies) + copy_fail_from : 0;
    atomic_store(&t->pause_req, 0);
}
