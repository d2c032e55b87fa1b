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
 * A request of a prompt ubatch (msg.fetch) is served by tiered_fetch.c: some experts copied to
 * the GPU, the others computed here; a failed copy there is not a fault.
 * Faults (a malformed request, an FFN error, an injected failure) are counted, logged, the first
 * one's message kept for hm_tiered_check, and the abort word is set (seq_cst) so that the GPU's
 * wait ends at once; the worker then serves nothing until hm_tiered_reset, which sets abort
 * itself first (a wait in flight must end before the engine's stream can drain), pauses the
 * worker, has the engine (or, for a caller-owned view, this file) clear the hand-off, and
 * releases the worker. Fields the worker owns (served count, hooks, stalled) are touched by
 * reset only while the worker is paused.
 */
#include "runtime/tiered.h"
#include "runtime/tiered_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/cpu.h"
#include "base/log.h"
#include "base/spin.h"
#include "base/tune.h"

#define TIERED_SPIN_NS HM_TUNE_SPIN_IDLE_NS /* spin with a pause this long, then yield: as the
                                           pool's idle workers, longer than a layer's GPU part */
#define TIERED_YIELD_NS 20000000ll      /* yield until idle this long, then nap */
#define TIERED_NAP_NS 50000l            /* a nap until idle for a second */
#define TIERED_NAP_LONG_NS 1000000l     /* a nap after that */
#define TIERED_TIMEOUT_MS_DEFAULT 20000u


int64_t tiered_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void nap(long ns) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

void tiered_pause(hm_tiered *t) {
    atomic_store(&t->pause_req, 1);
    while (t->started && !atomic_load(&t->paused)) nap(TIERED_NAP_NS);
}

void tiered_resume(hm_tiered *t) { atomic_store(&t->pause_req, 0); }

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
        if (v->ids[i] >= v->n_expert || (v->ids[i] < -1 && -2 - v->ids[i] >= v->n_expert))
            st = hm_error_set(&e, HM_ERR_FORMAT, "request of layer %d step %u: expert id %d at "
                              "token %lld slot %lld (the layer has %lld experts)", L, r,
                              v->ids[i], (long long)(i / K), (long long)(i % K),
                              (long long)v->n_expert);
    if (st == HM_OK && t->p.fail_after && t->served > t->p.fail_after) {
        t->p.fail_after = 0; /* one shot */
        st = hm_error_set(&e, HM_ERR_STATE, "test hook: request %llu (layer %d step %u) fails",
                          (unsigned long long)t->served, L, r);
    }
    if (st == HM_OK) { /* before the answer: the ids stay put until then */
        tiered_hot_observe(t, L, &m);
        tiered_perf_observe(t, L, &m);
    }
    if (st == HM_OK) {
        const int64_t t0 = tiered_now_ns();
        if (m.fetch) {
            st = tiered_serve_fetch(t, j, &m, &e);
        } else if (tiered_pf_wants(t, L, m.n_tok)) {
            st = tiered_serve_postfetch(t, j, &m, &e);
        } else {
            const moe_job job = {.layer = L, .n_tok = m.n_tok, .n_used = K, .x = v->x,
                                 .ids = v->ids, .weights = v->gw, .y = v->y};
            bool summed = false;
            st = moe_exec_run(t->exec, &job, NULL, &summed, &e);
        }
        const int64_t dt = tiered_now_ns() - t0;
        atomic_fetch_add(&t->busy_ns, (unsigned long long)dt);
        tiered_perf_time(t, L, dt);
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
    tiered_hot_after(t, L); /* the GPU goes on meanwhile */
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
        *idle0 = tiered_now_ns();
        *spins = 0;
    }
    if ((++*spins & 63u) != 0) { /* the clock every 64 pauses */
        HM_SPIN_RELAX();
        return;
    }
    const int64_t idle = tiered_now_ns() - *idle0;
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
        tp_set_idle_spin(t->pool, HM_TUNE_SPIN_IDLE_TIERED_NS);
        t->own_pool = true;
    }
    st = moe_exec_init(m, t->pool, v->n_tok_max, &t->exec, err);
    if (st == HM_OK) st = tiered_fetch_alloc(t, err);
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
        else HM_LOGW("HOTMOE_TIERED_TIMEOUT_MS=%s is not a number of milliseconds; using %llu",
                     env, (unsigned long long)ms);
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
    tiered_hot_free(t);
    tiered_perf_free(t);
    tiered_pf_free(t);
    moe_exec_free(t->exec);
    tiered_fetch_release(t);
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
    tiered_pause(t);
    hm_status st = t->gpu ? cuda_engine_handoff_reset(t->gpu, err) : HM_OK;
    if (!t->gpu) view_clear(&t->v);
    t->stalled = false; /* the worker is paused: its fields are ours */
    t->ahead_layer = -1;
    t->cursor = 0;
    pthread_mutex_lock(&t->mu);
    t->has_fault = false;
    hm_error_clear(&t->fault);
    pthread_mutex_unlock(&t->mu);
    atomic_fetch_add(&t->resets, 1);
    tiered_resume(t);
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
    tiered_pause(t);
    t->off = *o;
    if (o->rates) memcpy(t->rates, o->rates, sizeof(*t->rates) * (size_t)nl);
    t->off.rates = t->rates;
    for (int il = 0; il < nl; il++) {
        if (t->gpu) cuda_engine_fetch_layout(t->gpu, il, &t->lay[il]);
        else memset(&t->lay[il], 0, sizeof(t->lay[il]));
    }
    tiered_resume(t);
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

int hm_tiered_n_threads(const hm_tiered *t) { return t ? tp_size(t->pool) : 0; }

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
    s->copy_enqueue_s = (double)atomic_load(&t->copy_enqueue_ns) * 1e-9;
    s->copies = atomic_load(&t->copies);
    s->copy_fallbacks = atomic_load(&t->copy_fallbacks);
    s->retries = atomic_load(&t->retries);
    s->ahead_experts = atomic_load(&t->ahead_experts);
    s->ahead_used = atomic_load(&t->ahead_used);
    tiered_hot_counts(t, &s->hot_hits, &s->hot_misses, &s->hot_admitted);
    s->hot_updates = atomic_load(&t->hot_updates);
    s->hot_exchanged = atomic_load(&t->hot_exchanged);
    s->hot_refused = atomic_load(&t->hot_refused);
    s->pf_requests = atomic_load(&t->pf_requests);
    s->pf_experts = atomic_load(&t->pf_experts);
    s->pf_bytes = atomic_load(&t->pf_bytes);
    s->pf_fallbacks = atomic_load(&t->pf_fallbacks);
    s->pf_wait_s = 1e-9 * (double)atomic_load(&t->pf_wait_ns);
    s->pf_copy_s = 1e-9 * (double)atomic_load(&t->pf_copy_ns);
}

void hm_tiered_count_retry(hm_tiered *t) {
    if (t) atomic_fetch_add(&t->retries, 1);
}

void hm_tiered_set_test_hooks(hm_tiered *t, uint64_t fail_after, uint64_t stall_after,
                              uint64_t copy_fail_from) {
    if (!t) return;
    tiered_pause(t);
    t->served = 0;
    t->p.fail_after = fail_after;
    t->p.stall_after = stall_after;
    t->p.copy_fail_from = copy_fail_from ? atomic_load(&t->copies) + copy_fail_from : 0;
    tiered_resume(t);
}
