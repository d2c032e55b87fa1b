/* threadpool.c - spin-then-sleep worker pool (see threadpool.h).
 *
 * DESIGN: one job slot (fn, ctx) published by an atomic generation counter `gen`. A worker that
 * has run generation g waits for gen != g. Every wait of the pool is spin.h's: spin with pause
 * for a time budget (base/tune.h: idle workers longer than waits inside a job, both short when
 * the pool has more threads than the process has CPUs; the pool's items' hm_spin_until gets the
 * pool's through a thread-local), then sleep on the word's futex. Each waited-on word (gen,
 * done, bar_phase, open) has its hm_waiters beside it in its cache line, and whoever changes the
 * word stores it seq_cst and calls hm_wake, which makes a system call only when someone sleeps
 * there. So a quiet run spins as before, and with more runnable threads than cores a waiting
 * thread gives its core up within the budget instead of holding it until the scheduler's time
 * slice ends (or, yielding, handing it to a busy program for a whole slice). Each worker counts itself into `done`
 * when fn returns (the last one wakes the caller); the caller, after its own share, waits for
 * done == nth - 1. The barrier is sense-reversing: a phase counter read before arriving, the last
 * arriver resets the count and advances (and wakes) the phase.
 *
 * Item jobs: `items` packs (job sequence 20 bits | next item 22 bits | item count 22 bits) in
 * one 64-bit word, so a claim (fetch_add of 1 to next; it got an item if the old next < count)
 * can only succeed for the job the word describes; a worker that wakes late sees a finished or
 * newer word and claims nothing of a job it has not read. A fetch_add never fails, so the threads
 * of a job's start take their first items in one cache-line transfer each (a CAS loop retries
 * once per competing thread). Each call of tp_items_work ends with one failed claim, at most
 * two per thread and word, so next stays below count + 2 * 1024 < 2^22 for counts of at most
 * TP_ITEM_MAX = 2^21. Once its claim succeeded the job cannot complete before the
 * item does, so reading the job's fields after the claim is safe (they are written before the
 * word is published); after counting its item done a thread reads none of them again.
 *
 * Stages: an item job is a list of stages whose items are numbered consecutively (end[s]: one
 * past stage s's last item). Items complete in stage order — an item of stage s waits until
 * `open` >= s, i.e. stages 0..s-1 are closed — and a thread adds its finished items of a stage
 * to `items_done` at once, before it waits at another stage or leaves; so the add that makes
 * `items_done` equal end[s] counts the last items of stage s. Its thread runs the stage's `then`
 * (and those of empty stages after it), then stores `open` and wakes the threads asleep at it.
 * The caller waits for `open` == n_stages. A plain item job is one stage without `then`. A
 * thread whose claim is of a stage not yet open calls that stage's prefetch with the item before
 * it waits, so the memory stream of the next stage starts during the gate (its tail items and
 * the `then` steps).
 */
#define _GNU_SOURCE /* sched_getcpu, for the trace */
#include "base/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/log.h"
#include "base/spin.h"
#include "base/tune.h"

typedef struct {
    tp_pool *pool;
    int ith;
    pthread_t thread;
} tp_worker;

/* A thread's run-delay sampler (the adaptive active count): its /proc schedstat file, when it
 * read it last and the run delay it read then. One cache line per thread. */
typedef struct {
    _Alignas(64) int fd; /* -1: not open yet, -2: unreadable */
    int init;
    pthread_t owner;     /* thread 0: the caller, which may change between jobs */
    int64_t t, delay;
} tp_sampler;

/* The caller's state of the adaptive active count (see tp_adapt). */
typedef struct {
    int on;
    int hot, cool, probing, before_probe;
    int64_t t0, d0;            /* the window's start and the delay total then */
    int64_t probe_every, next_probe;
    long long ups, downs;
    int min_active;
    double waited;             /* seconds of run delay seen in all */
} tp_adapt_state;

struct tp_pool {
    int n;
    _Atomic int64_t spin_idle_ns; /* spin budgets (tp_init; idle: tp_set_idle_spin too) */
    int64_t spin_wait_ns;
    bool spin_fixed;              /* oversubscribed or HOTMOE_POOL_SPIN_US: budgets stay */
    tp_fn fn;
    void *ctx;
    /* each waited-on word with its sleepers, in a cache line of its own */
    _Alignas(64) atomic_int gen; /* odd: an item job; wraps */
    hm_waiters gen_w;
    atomic_bool stop;
    _Alignas(64) atomic_int done;
    hm_waiters done_w;
    _Alignas(64) atomic_int bar_count;
    _Alignas(64) atomic_int bar_phase;
    hm_waiters bar_w;
    _Alignas(64) _Atomic uint64_t items; /* seq << 44 | next << 22 | count (item jobs) */
    _Alignas(64) atomic_llong items_done;
    _Alignas(64) atomic_int open;        /* stages closed: items done and `then` returned */
    hm_waiters open_w;
    const tp_stage *stages;
    int n_stages;
    int64_t end[TP_MAX_STAGES]; /* one past the last item of stage s, in the word's numbering */
    int64_t ibase; /* item index of the word's item 0 (jobs of more than TP_ITEM_MAX items) */
    uint64_t iseq;
    /* the active count: item jobs run on threads [0, nact); the others sleep on `park` */
    _Alignas(64) atomic_int nact;
    _Alignas(64) atomic_int park; /* changes when a parked worker must look again */
    hm_waiters park_w;
    _Alignas(64) atomic_llong delay; /* run delay (ns) the active threads reported */
    tp_sampler *smp;                 /* [n], or NULL when the count is fixed */
    int64_t (*delay_fn)(void *ctx, int ith); /* tp_set_delay_source, else NULL: schedstat */
    void *delay_ctx;
    tp_adapt_state ad;
    tp_worker *workers; /* [n - 1], worker i has ith = i + 1 */
    struct tp_prof *prof; /* HOTMOE_POOL_PROF=1, else NULL */
    struct tp_trace *trace; /* HOTMOE_POOL_TRACE=FILE, else NULL */
    int n_started;
};

enum { TP_ITEM_BITS = 22 };
#define TP_ITEM_MASK ((1ull << TP_ITEM_BITS) - 1)
#define TP_ITEM_MAX ((int64_t)1 << 21) /* items of one word (jobs of more go by parts) */

struct tp_gate {
    const atomic_int *open;
    int stage;
};

bool tp_gate_open(const tp_gate *gate) {
    return atomic_load_explicit(gate->open, memory_order_relaxed) >= gate->stage;
}

/* Inside a job: returns once p->open >= s. */
static void tp_wait_open(tp_pool *p, int s) {
    hm_wait_ge(&p->open, s, &p->open_w, p->spin_wait_ns, 0);
}

/* ---- the profile (HOTMOE_POOL_PROF=1): where a caller's time goes, job by job. Per job kind
 * (first stage's function and the number of stages, in order of first use): calls, mean wall
 * time, items and the time from the job's start at which each stage closed; and the time the
 * caller spent between jobs. Logged (info) by tp_free. Only item jobs are timed. */
enum { TP_PROF_KINDS = 16 };
typedef struct {
    tp_item_fn fn;
    int n_stages;
    long long calls;
    double t, items, close[TP_MAX_STAGES], then[TP_MAX_STAGES]; /* then: its `then` steps' time */
} tp_prof_kind;

struct tp_prof {
    tp_prof_kind kinds[TP_PROF_KINDS];
    double first, last, t0; /* first job's start, last job's end, this job's start */
    int cur;                /* kind of the running job */
};

static double tp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void tp_prof_log(const tp_pool *p) {
    const struct tp_prof *f = p->prof;
    double in = 0.0;
    for (int i = 0; i < TP_PROF_KINDS && f->kinds[i].calls; i++) {
        const tp_prof_kind *k = &f->kinds[i];
        char buf[32 * TP_MAX_STAGES]; /* every stage (a decode step's job has hundreds) */
        int o = 0;
        for (int s = 0; s < k->n_stages && o < (int)sizeof(buf) - 32; s++)
            o += snprintf(buf + o, sizeof(buf) - (size_t)o, " %.1f (then %.1f)",
                          1e6 * k->close[s] / (double)k->calls, 1e6 * k->then[s] / (double)k->calls);
        HM_LOGI("pool profile: job kind %d (%d stages): %lld calls, %.1f us each, %.0f items, "
                "stages closed at (us):%s", i, k->n_stages, k->calls, 1e6 * k->t / (double)k->calls,
                k->items / (double)k->calls, buf);
        in += k->t;
    }
    HM_LOGI("pool profile: %.3f s from the first job's start to the last's end, %.3f s in jobs, "
            "%.3f s between them", f->last - f->first, in, f->last - f->first - in);
    /* one line, so that bench/device_contention.sh (PROF=1) shows the active count too */
    char act[192];
    if (!p->ad.on)
        snprintf(act, sizeof(act), "fixed at %d (HOTMOE_POOL_ADAPT=0 or one thread)", p->n);
    else if (p->smp[0].fd == -2 && !p->delay_fn)
        snprintf(act, sizeof(act), "fixed at %d (no /proc/thread-self/schedstat)", p->n);
    else
        snprintf(act, sizeof(act), "%lld changes (%lld down, %lld up), final %d of %d, lowest %d, "
                 "%.3f s run delay", p->ad.ups + p->ad.downs, p->ad.downs, p->ad.ups,
                 atomic_load(&p->nact), p->n, p->ad.min_active, p->ad.waited);
    HM_LOGI("pool profile: futex sleeps: %lld awaiting jobs, %lld at gates and job ends, %lld at "
            "barriers, %lld on item flags (all pools); active threads: %s",
            (long long)atomic_load(&p->gen_w.sleeps),
            (long long)(atomic_load(&p->open_w.sleeps) + atomic_load(&p->done_w.sleeps)),
            (long long)atomic_load(&p->bar_w.sleeps),
            (long long)atomic_load(&hm_spin_waiters.sleeps), act);
}

/* the job kind of stages, its slot claimed on first use (the last slot collects the rest) */
static int tp_prof_begin(tp_pool *p, const tp_stage *stages, int n) {
    struct tp_prof *f = p->prof;
    int k = 0;
    while (k < TP_PROF_KINDS - 1 && f->kinds[k].calls &&
           (f->kinds[k].fn != stages[0].fn || f->kinds[k].n_stages != n))
        k++;
    f->kinds[k].fn = stages[0].fn;
    f->kinds[k].n_stages = n;
    f->t0 = tp_now();
    if (f->first == 0.0) f->first = f->t0;
    f->cur = k;
    return k;
}

static void tp_prof_end(tp_pool *p, int k, const tp_stage *stages, int n) {
    struct tp_prof *f = p->prof;
    f->last = tp_now();
    f->kinds[k].calls++;
    f->kinds[k].t += f->last - f->t0;
    for (int s = 0; s < n; s++) f->kinds[k].items += (double)stages[s].n_items;
    f->cur = -1;
}

/* ---- the trace (HOTMOE_POOL_TRACE=FILE): every item of item jobs number SKIP to SKIP + JOBS - 1
 * (HOTMOE_POOL_TRACE_SKIP, default 2000; HOTMOE_POOL_TRACE_JOBS, default 300), written by tp_free
 * as CSV, one line per item: job, stages of the job, thread, stage, item, the times in us from
 * the job's start at which the thread claimed it, found its stage open and finished it, and the
 * vCPU it finished on (which vCPUs stream slower: bench/pool_trace.py --layers). Rows of
 * thread -1 describe the job: per stage (item -1) its `then` step's start and end and the
 * close (claim, open, end columns); per job (stage -1) its start in us from the first traced
 * job's start, the publication and the end. Each thread writes its own rows (the stage rows:
 * the closing threads, one after another). */
enum { TP_TRACE_CAP = 1 << 16 };
typedef struct {
    int32_t job, n_stages, ith, stage, item, cpu;
    float claim, open, end;
} tp_trace_rec;

struct tp_trace {
    char path[512];
    long long skip, jobs, job; /* job: index of the running item job */
    double t0, first;          /* this job's start, the first traced job's start */
    int on;                    /* the running job is traced */
    int nth;
    int *n;                    /* [threads + 1] records of thread i (the last: job rows) */
    tp_trace_rec *rec;         /* [threads + 1][TP_TRACE_CAP] */
};

static struct tp_trace *tp_trace_new(int nth) {
    const char *path = getenv("HOTMOE_POOL_TRACE");
    if (!path || !*path) return NULL;
    struct tp_trace *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->nth = nth;
    t->n = calloc((size_t)nth + 1, sizeof(int));
    t->rec = calloc(((size_t)nth + 1) * TP_TRACE_CAP, sizeof(tp_trace_rec));
    if (!t->n || !t->rec) {
        free(t->n);
        free(t->rec);
        free(t);
        return NULL;
    }
    snprintf(t->path, sizeof(t->path), "%s", path);
    const char *sk = getenv("HOTMOE_POOL_TRACE_SKIP"), *jb = getenv("HOTMOE_POOL_TRACE_JOBS");
    t->skip = sk ? atoll(sk) : 2000;
    t->jobs = jb ? atoll(jb) : 300;
    t->job = -1;
    return t;
}

static void tp_trace_add(struct tp_trace *t, int ith, int stage, int64_t item, double claim,
                         double open, double end, int n_stages) {
    if (t->n[ith] >= TP_TRACE_CAP) return;
    t->rec[(size_t)ith * TP_TRACE_CAP + (size_t)t->n[ith]++] = (tp_trace_rec){
        .job = (int32_t)t->job, .n_stages = n_stages, .ith = ith, .stage = stage,
        .item = (int32_t)item, .cpu = sched_getcpu(), .claim = (float)(1e6 * (claim - t->t0)),
        .open = (float)(1e6 * (open - t->t0)), .end = (float)(1e6 * (end - t->t0))};
}

static void tp_trace_write(const struct tp_trace *t, int nth) {
    FILE *f = fopen(t->path, "w");
    if (!f) {
        HM_LOGW("pool trace: cannot write %s", t->path);
        return;
    }
    fprintf(f, "job,n_stages,ith,stage,item,claim_us,open_us,end_us,cpu\n");
    for (int i = 0; i <= nth; i++)
        for (int r = 0; r < t->n[i]; r++) {
            const tp_trace_rec *e = &t->rec[(size_t)i * TP_TRACE_CAP + (size_t)r];
            fprintf(f, "%d,%d,%d,%d,%d,%.3f,%.3f,%.3f,%d\n", e->job, e->n_stages,
                    i == nth ? -1 : e->ith, e->stage, e->item, e->claim, e->open, e->end, e->cpu);
        }
    fclose(f);
    HM_LOGI("pool trace: %s written", t->path);
}

/* ---- the adaptive active count. A pool thread that shares a core with another program is
 * descheduled for whole time slices while it holds an item, and every stage then waits for it;
 * fewer threads than cores avoid that. Each active thread reads its run delay (the time it was
 * runnable but not running: /proc/thread-self/schedstat's second field) at most every
 * HM_TUNE_POOL_SAMPLE_NS, when it leaves an item job, and adds the increase to `delay`. After
 * each item job the caller, once a window of HM_TUNE_POOL_WINDOW_NS has passed, divides the
 * window's delay by its length: the threads kept waiting on average ("excess"). On a quiet
 * machine it is ~0 (a kernel thread's microseconds); with L busy programs beside n threads on n
 * cores it is about n * L / (n + L). After HM_TUNE_POOL_SHRINK_WINDOWS windows in a row with
 * excess >= HM_TUNE_POOL_EXCESS, the active count drops by round(excess) (at least 1). While it is
 * below n, it probes one more every probe period (HM_TUNE_POOL_PROBE_NS, doubled after each
 * failed probe up to HM_TUNE_POOL_PROBE_MAX_NS): a probe whose first window shows excess goes
 * back to the count before it, one that stays quiet for HM_TUNE_POOL_PROBE_WINDOWS windows is
 * kept. Which threads run an item job never changes its results: items are claimed from one
 * counter and do not depend on the thread. */

static int64_t tp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* this thread's run delay in ns, or -1 */
static int64_t tp_read_delay(tp_sampler *s) {
    if (s->fd == -1) {
        s->fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (s->fd < 0) s->fd = -2;
    }
    if (s->fd < 0) return -1;
    char buf[96];
    const ssize_t k = pread(s->fd, buf, sizeof(buf) - 1, 0);
    if (k <= 0) return -1;
    buf[k] = 0;
    char *e = NULL;
    strtoull(buf, &e, 10); /* time on the CPU */
    if (!e || *e != ' ') return -1;
    return (int64_t)strtoull(e + 1, NULL, 10); /* time runnable, waiting for a CPU */
}

/* Thread ith leaves an item job: adds its run delay since its last sample, if due. */
static void tp_sample(tp_pool *p, int ith) {
    if (!p->smp) return;
    tp_sampler *s = &p->smp[ith];
    const int64_t t = tp_now_ns();
    if (s->init && t - s->t < HM_TUNE_POOL_SAMPLE_NS) return;
    if (ith == 0 && s->init && !pthread_equal(s->owner, pthread_self())) { /* another caller */
        if (s->fd >= 0) close(s->fd);
        s->fd = -1;
        s->init = 0;
    }
    const int64_t d = p->delay_fn ? p->delay_fn(p->delay_ctx, ith) : tp_read_delay(s);
    if (d < 0) return;
    if (s->init && d > s->delay)
        atomic_fetch_add_explicit(&p->delay, d - s->delay, memory_order_relaxed);
    s->init = 1;
    s->owner = pthread_self();
    s->t = t;
    s->delay = d;
}

static void tp_set_active(tp_pool *p, int k, int64_t t) {
    const int old = atomic_load_explicit(&p->nact, memory_order_relaxed);
    if (k == old) return;
    if (k > old) p->ad.ups++;
    else p->ad.downs++;
    if (k < p->ad.min_active) p->ad.min_active = k;
    atomic_store(&p->nact, k); /* seq_cst: pairs with a parked worker's reads (tp_park) */
    if (k > old) {
        atomic_fetch_add(&p->park, 1);
        hm_wake(&p->park, &p->park_w);
    }
    p->ad.hot = p->ad.cool = 0;
    p->ad.t0 = t;
    p->ad.d0 = atomic_load_explicit(&p->delay, memory_order_relaxed);
}

/* The caller, after an item job: one step of the active count's control (see above). */
static void tp_adapt(tp_pool *p) {
    tp_adapt_state *a = &p->ad;
    const int64_t t = tp_now_ns();
    const int64_t dall = atomic_load_explicit(&p->delay, memory_order_relaxed);
    if (a->t0 == 0) {
        a->t0 = t;
        a->d0 = dall;
        return;
    }
    const int64_t dt = t - a->t0;
    if (dt < HM_TUNE_POOL_WINDOW_NS) return;
    const int64_t d = dall - a->d0;
    a->t0 = t;
    a->d0 = dall;
    a->waited += 1e-9 * (double)d;
    const double excess = (double)d / (double)dt;
    const int nact = atomic_load_explicit(&p->nact, memory_order_relaxed);
    if (excess >= HM_TUNE_POOL_EXCESS) {
        a->cool = 0;
        if (++a->hot < (a->probing ? 1 : HM_TUNE_POOL_SHRINK_WINDOWS) || nact <= 1) return;
        int k = (int)(excess + 0.5);
        if (k < 1) k = 1;
        if (a->probing) { /* back to the probe's start (quiet before), and probe less often */
            k = nact - a->before_probe;
            a->probe_every = 2 * a->probe_every < HM_TUNE_POOL_PROBE_MAX_NS
                                 ? 2 * a->probe_every : HM_TUNE_POOL_PROBE_MAX_NS;
        }
        a->probing = 0;
        tp_set_active(p, nact - k > 1 ? nact - k : 1, t);
        a->next_probe = t + a->probe_every;
        return;
    }
    a->hot = 0;
    if (a->probing) {
        if (++a->cool >= HM_TUNE_POOL_PROBE_WINDOWS) { /* kept */
            a->probing = 0;
            a->probe_every = HM_TUNE_POOL_PROBE_NS;
            a->next_probe = t + a->probe_every;
        }
    } else if (nact < p->n && t >= a->next_probe) {
        a->before_probe = nact;
        tp_set_active(p, nact + 1, t);
        a->probing = 1;
    }
}

/* A worker outside the active count, between jobs (it has run generation `seen`): sleeps until
 * it is active again, a classic job (all threads) is published or the pool stops. */
static void tp_park(tp_pool *p, int ith, int seen) {
    for (;;) {
        const int pk = atomic_load(&p->park); /* seq_cst, before the reads it guards */
        if (ith < atomic_load(&p->nact)) return;
        const int g = atomic_load(&p->gen);
        if (g != seen && !((unsigned)g & 1u)) return;
        hm_wait_ne(&p->park, pk, &p->park_w, 0, 0);
    }
}

int tp_active(const tp_pool *p) { return p ? atomic_load(&p->nact) : 1; }

void tp_set_delay_source(tp_pool *p, int64_t (*fn)(void *ctx, int ith), void *ctx) {
    if (!p) return;
    p->delay_fn = fn;
    p->delay_ctx = ctx;
}

/* Stages up to s are complete with d items done: runs the `then` of s and of the empty stages
 * after it, then opens the next stage. */
static void tp_stages_close(tp_pool *p, int s, int64_t d) {
    const int n = p->n_stages;
    struct tp_trace *tr = p->trace && p->trace->on ? p->trace : NULL;
    for (; s < n && p->end[s] == d; s++) {
        const double t = (p->prof && p->prof->cur >= 0) || tr ? tp_now() : 0.0;
        if (p->stages[s].then) p->stages[s].then(p->stages[s].then_ctx);
        if (tr) {
            const double e = tp_now();
            tp_trace_add(tr, tr->nth, s, -1, t, e, e, n);
        }
        if (p->prof && p->prof->cur >= 0) { /* the closing thread's writes, read after the job */
            const double now = tp_now();
            p->prof->kinds[p->prof->cur].close[s] += now - p->prof->t0;
            p->prof->kinds[p->prof->cur].then[s] += now - t;
        }
    }
    atomic_store(&p->open, s); /* seq_cst: pairs with a sleeper's count (spin.h) */
    hm_wake(&p->open, &p->open_w);
}

/* Counts k finished items of stage s (end: p->end[s], read while they were uncounted, since the
 * job may complete as soon as they are counted). */
static void tp_items_done(tp_pool *p, int s, int64_t end, int64_t k) {
    if (k > 0 && atomic_fetch_add_explicit(&p->items_done, k, memory_order_acq_rel) + k == end)
        tp_stages_close(p, s, end);
}

/* Claims and runs items of the job in `items` until none is left. A thread counts its finished
 * items of one stage together (one atomic add instead of one per item), before its next claim
 * turns out to be of another stage or none. */
static void tp_items_work(tp_pool *p, int ith) {
    int ds = 0;                  /* stage of the uncounted items */
    int64_t dn = 0, dend = 0;    /* how many, end of their stage */
    for (;;) {
        const uint64_t v = atomic_fetch_add_explicit(&p->items, 1ull << TP_ITEM_BITS,
                                                     memory_order_acq_rel);
        const uint64_t next = (v >> TP_ITEM_BITS) & TP_ITEM_MASK, count = v & TP_ITEM_MASK;
        if (next >= count) break;
        int s = ds; /* a thread's claims only increase */
        while ((int64_t)next >= p->end[s]) s++;
        if (s != ds) { /* before waiting at stage s: the gate may wait for these items */
            tp_items_done(p, ds, dend, dn);
            dn = 0;
        }
        const tp_stage *st = &p->stages[s];
        const int64_t first = s > 0 ? p->end[s - 1] : 0;
        struct tp_trace *tr = p->trace && p->trace->on ? p->trace : NULL;
        const double tc = tr ? tp_now() : 0.0;
        if (s > 0) {
            if (st->prefetch && atomic_load_explicit(&p->open, memory_order_acquire) < s) {
                const tp_gate gate = {.open = &p->open, .stage = s};
                st->prefetch(st->ctx, p->ibase + (int64_t)next - first, &gate);
            }
            tp_wait_open(p, s);
        }
        ds = s;
        dend = p->end[s];
        const double to = tr ? tp_now() : 0.0;
        st->fn(st->ctx, p->ibase + (int64_t)next - first, ith);
        if (tr) tp_trace_add(tr, ith, s, (int64_t)next - first, tc, to, tp_now(), p->n_stages);
        dn++;
    }
    tp_sample(p, ith); /* before its last count: the job's end includes it */
    tp_items_done(p, ds, dend, dn);
}

static void *tp_worker_main(void *arg) {
    tp_worker *wk = arg;
    tp_pool *p = wk->pool;
    hm_spin_wait_ns = p->spin_wait_ns; /* this thread's items' hm_spin_until */
    int seen = 0;
    for (;;) {
        if (wk->ith >= atomic_load_explicit(&p->nact, memory_order_relaxed))
            tp_park(p, wk->ith, seen);
        hm_wait_ne(&p->gen, seen, &p->gen_w,
                   atomic_load_explicit(&p->spin_idle_ns, memory_order_relaxed), 0);
        const int g = atomic_load_explicit(&p->gen, memory_order_acquire);
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        if ((unsigned)g & 1u) { /* odd generations are item jobs: the active threads' */
            if (wk->ith < atomic_load_explicit(&p->nact, memory_order_relaxed))
                tp_items_work(p, wk->ith);
            continue;
        }
        p->fn(p->ctx, wk->ith, p->n);
        /* seq_cst (pairs with the caller's sleep); the last one wakes the caller */
        if (atomic_fetch_add(&p->done, 1) + 1 == p->n - 1) hm_wake(&p->done, &p->done_w);
    }
    if (p->smp && p->smp[wk->ith].fd >= 0) close(p->smp[wk->ith].fd);
    return NULL;
}

/* Advances gen to the next value of the wanted parity (odd: item job, even: classic job). */
static void tp_publish(tp_pool *p, unsigned parity) {
    const unsigned g = (unsigned)atomic_load_explicit(&p->gen, memory_order_relaxed);
    atomic_fetch_add(&p->gen, ((g + 1u) & 1u) == parity ? 1 : 2); /* seq_cst (spin.h) */
    hm_wake(&p->gen, &p->gen_w);
    if (parity == 0) { /* a classic job (or the stop) needs the parked workers too */
        atomic_fetch_add(&p->park, 1);
        hm_wake(&p->park, &p->park_w);
    }
}

hm_status tp_init(int n, tp_pool **pool, hm_error *err) {
    *pool = NULL;
    if (n < 1 || n > 1024) return hm_error_set(err, HM_ERR_ARG, "thread count %d outside 1..1024", n);
    tp_pool *p = aligned_alloc(64, (sizeof(tp_pool) + 63) / 64 * 64);
    if (!p) return hm_error_set(err, HM_ERR_NOMEM, "thread pool: out of memory");
    memset(p, 0, sizeof(*p));
    p->n = n;
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->done, 0);
    atomic_init(&p->bar_count, 0);
    atomic_init(&p->bar_phase, 0);
    atomic_init(&p->items_done, 0);
    atomic_init(&p->open, 0);
    atomic_init(&p->nact, n);
    atomic_init(&p->park, 0);
    atomic_init(&p->delay, 0);
    p->ad.min_active = n;
    p->ad.probe_every = HM_TUNE_POOL_PROBE_NS;
    const char *ae = getenv("HOTMOE_POOL_ADAPT"); /* 0: all threads always (A/B runs) */
    p->ad.on = n > 1 && !(ae && *ae && atoi(ae) == 0);
    if (p->ad.on) {
        p->smp = aligned_alloc(64, (size_t)n * sizeof(tp_sampler));
        if (!p->smp) {
            free(p);
            return hm_error_set(err, HM_ERR_NOMEM, "thread pool: out of memory");
        }
        for (int i = 0; i < n; i++) p->smp[i] = (tp_sampler){.fd = -1};
    }
    p->spin_idle_ns = HM_TUNE_SPIN_IDLE_NS;
    p->spin_wait_ns = HM_TUNE_SPIN_WAIT_NS;
    if (n > hm_cpu_count_allowed()) {
        p->spin_idle_ns = p->spin_wait_ns = HM_TUNE_SPIN_OVERSUB_NS;
        p->spin_fixed = true;
    }
    const char *se = getenv("HOTMOE_POOL_SPIN_US"); /* "WAIT[,IDLE]", for tuning runs */
    if (se && *se) {
        char *end = NULL;
        p->spin_wait_ns = (int64_t)(1000 * strtod(se, &end));
        p->spin_idle_ns = end && *end == ',' ? (int64_t)(1000 * strtod(end + 1, NULL))
                                             : p->spin_wait_ns;
        p->spin_fixed = true;
    }
    const char *pe = getenv("HOTMOE_POOL_PROF");
    if (pe && atoi(pe) > 0) {
        p->prof = calloc(1, sizeof(*p->prof));
        if (!p->prof) {
            free(p->smp);
            free(p);
            return hm_error_set(err, HM_ERR_NOMEM, "thread pool: out of memory");
        }
        p->prof->cur = -1;
    }
    if (n > 1) {
        p->workers = calloc((size_t)(n - 1), sizeof(tp_worker));
        if (!p->workers) {
            free(p->prof);
            free(p->smp);
            free(p);
            return hm_error_set(err, HM_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    p->trace = tp_trace_new(n);
    for (int i = 0; i < n - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i + 1;
        int rc = pthread_create(&p->workers[i].thread, NULL, tp_worker_main, &p->workers[i]);
        if (rc != 0) {
            tp_free(p);
            return hm_error_set(err, HM_ERR_STATE, "thread pool: cannot start thread %d of %d: %s",
                                i + 1, n, strerror(rc));
        }
        p->n_started++;
    }
    *pool = p;
    return HM_OK;
}

void tp_free(tp_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    tp_publish(p, 0);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].thread, NULL);
    if (p->prof) tp_prof_log(p);
    free(p->prof);
    if (p->smp) {
        if (p->smp[0].fd >= 0) close(p->smp[0].fd);
        free(p->smp);
    }
    if (p->trace) {
        tp_trace_write(p->trace, p->n);
        free(p->trace->n);
        free(p->trace->rec);
        free(p->trace);
    }
    free(p->workers);
    free(p);
}

int tp_size(const tp_pool *p) { return p ? p->n : 1; }

void tp_set_idle_spin(tp_pool *p, int64_t ns) {
    if (p && !p->spin_fixed && ns >= 0)
        atomic_store_explicit(&p->spin_idle_ns, ns, memory_order_relaxed);
}

void tp_run(tp_pool *p, tp_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    tp_publish(p, 0);
    hm_spin_wait_ns = p->spin_wait_ns;
    fn(ctx, 0, p->n);
    hm_wait_ge(&p->done, p->n - 1, &p->done_w, p->spin_wait_ns, 0);
}

/* One item job of n stages (at most TP_ITEM_MAX items in all) on a pool of n > 1 threads;
 * fn of stage s gets ibase + its item index. */
static void tp_items_job(tp_pool *p, const tp_stage *stages, int n, int64_t ibase) {
    const int pk = p->prof ? tp_prof_begin(p, stages, n) : -1;
    struct tp_trace *tr = p->trace;
    double tpub = 0.0;
    if (tr) {
        tr->job++;
        tr->on = tr->job >= tr->skip && tr->job < tr->skip + tr->jobs;
        if (tr->on) {
            tr->t0 = tp_now();
            if (tr->first == 0.0) tr->first = tr->t0;
        }
    }
    int64_t total = 0;
    for (int s = 0; s < n; s++) p->end[s] = total += stages[s].n_items;
    p->stages = stages;
    p->n_stages = n;
    p->ibase = ibase;
    atomic_store_explicit(&p->items_done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->open, 0, memory_order_relaxed);
    tp_stages_close(p, 0, 0); /* the `then` of empty stages at the start */
    if (total > 0) {
        p->iseq = (p->iseq + 1) & ((1ull << (64 - 2 * TP_ITEM_BITS)) - 1);
        atomic_store_explicit(&p->items, p->iseq << (2 * TP_ITEM_BITS) | (uint64_t)total,
                              memory_order_release);
        if (tr && tr->on) tpub = tp_now();
        tp_publish(p, 1);
        hm_spin_wait_ns = p->spin_wait_ns; /* the caller's items' hm_spin_until */
        tp_items_work(p, 0);
        tp_wait_open(p, n);
        if (p->ad.on) tp_adapt(p);
    }
    if (pk >= 0) tp_prof_end(p, pk, stages, n);
    if (tr && tr->on) {
        /* the job's row: its start from the first traced job's (tp_trace_add subtracts t0) */
        tp_trace_add(tr, tr->nth, -1, -1, tr->t0 + (tr->t0 - tr->first), tpub, tp_now(), n);
        tr->on = 0;
    }
}

void tp_run_items(tp_pool *p, tp_item_fn fn, void *ctx, int64_t n_items) {
    if (n_items <= 0) return;
    if (!p || p->n == 1 || n_items == 1) {
        for (int64_t i = 0; i < n_items; i++) fn(ctx, i, 0);
        return;
    }
    for (int64_t base = 0; base < n_items; base += TP_ITEM_MAX) {
        const tp_stage st = {.fn = fn, .ctx = ctx,
                             .n_items = n_items - base < TP_ITEM_MAX ? n_items - base
                                                                     : TP_ITEM_MAX};
        tp_items_job(p, &st, 1, base);
    }
}

void tp_run_stages(tp_pool *p, const tp_stage *stages, int n_stages) {
    int64_t total = 0;
    for (int s = 0; s < n_stages; s++) total += stages[s].n_items;
    if (p && p->n > 1 && n_stages <= TP_MAX_STAGES && total <= TP_ITEM_MAX) {
        tp_items_job(p, stages, n_stages, 0);
        return;
    }
    for (int s = 0; s < n_stages; s++) { /* one thread, or stage by stage */
        tp_run_items(p, stages[s].fn, stages[s].ctx, stages[s].n_items);
        if (stages[s].then) stages[s].then(stages[s].then_ctx);
    }
}

void tp_barrier(tp_pool *p) {
    if (!p || p->n == 1) return;
    const int phase = atomic_load_explicit(&p->bar_phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->bar_count, 1, memory_order_acq_rel) == p->n - 1) {
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add(&p->bar_phase, 1); /* seq_cst (spin.h) */
        hm_wake(&p->bar_phase, &p->bar_w);
        return;
    }
    hm_wait_ne(&p->bar_phase, phase, &p->bar_w, p->spin_wait_ns, 0);
}
