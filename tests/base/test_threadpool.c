/* test_threadpool.c - the pool runs every job on all threads exactly once, returns only when
 * all are done, survives idle periods (workers asleep on the futex), and tp_barrier separates
 * phases: after a barrier every thread sees every other thread's writes of the previous phase.
 * Item jobs run every item exactly once, interleave with classic jobs, and return only when all
 * items are done even when a worker is slow (oversubscribed pool). Staged jobs run each stage's
 * items after every item and the `then` of the stages before them (whose plain writes they
 * see), each `then` once after its stage's items, empty stages included. A thread that holds an
 * item of a stage not yet open calls the stage's prefetch with that item (and only then), whose
 * gate reports the stage open once it is. Under contention (more pool threads than CPUs, and
 * busy loops beside them) staged jobs with item flags (hm_spin_until) and barrier jobs finish
 * quickly and give the single thread's results. hm_cpu_count_allowed follows the affinity mask.
 * The active count: a thread whose (forged) run delay is high makes it drop within a bounded
 * time, a one-window burst does not, no delay keeps every thread active over many windows, and
 * it climbs back once the delay stops; pinned to one CPU beside a busy loop (the real schedstat
 * reading) it drops too; the staged jobs' results never change.
 */
#define _GNU_SOURCE /* sched_setaffinity, CPU_* */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/spin.h"
#include "base/threadpool.h"
#include "harness.h"

typedef struct {
    int nth_seen[64];
    long runs[64];
    atomic_int calls;
} count_ctx;

static void count_fn(void *ctx, int ith, int nth) {
    count_ctx *c = ctx;
    c->nth_seen[ith] = nth;
    c->runs[ith]++;
    atomic_fetch_add(&c->calls, 1);
}

static void test_many_jobs(void) {
    for (int n = 1; n <= 4; n++) {
        tp_pool *p = NULL;
        hm_error err;
        HM_REQUIRE(tp_init(n, &p, &err) == HM_OK);
        HM_CHECK(tp_size(p) == n);
        count_ctx c = {0};
        atomic_init(&c.calls, 0);
        const int jobs = 3000;
        for (int i = 0; i < jobs; i++) {
            tp_run(p, count_fn, &c);
            /* tp_run returned: every thread's call of this job has finished */
            HM_REQUIRE(atomic_load(&c.calls) == (i + 1) * n);
            if (i % 1000 == 999) usleep(20000); /* let the workers fall asleep */
        }
        for (int t = 0; t < n; t++) {
            HM_CHECK(c.runs[t] == jobs);
            HM_CHECK(c.nth_seen[t] == n);
        }
        tp_free(p);
    }
}

enum { BAR_ROUNDS = 500, BAR_MAX = 8 };
typedef struct {
    tp_pool *pool;
    int val[BAR_MAX];
    atomic_int errors;
} bar_ctx;

static void bar_fn(void *ctx, int ith, int nth) {
    bar_ctx *b = ctx;
    for (int r = 1; r <= BAR_ROUNDS; r++) {
        b->val[ith] = r; /* plain writes: the barrier must order them */
        tp_barrier(b->pool);
        for (int t = 0; t < nth; t++)
            if (b->val[t] != r) atomic_fetch_add(&b->errors, 1);
        tp_barrier(b->pool);
    }
}

static void test_barrier(void) {
    for (int n = 1; n <= 3; n++) {
        tp_pool *p = NULL;
        HM_REQUIRE(tp_init(n, &p, NULL) == HM_OK);
        bar_ctx b = {.pool = p};
        atomic_init(&b.errors, 0);
        for (int rep = 0; rep < 4; rep++) tp_run(p, bar_fn, &b);
        HM_CHECK_MSG(atomic_load(&b.errors) == 0, "n=%d: %d stale reads", n, atomic_load(&b.errors));
        tp_free(p);
    }
}

static void test_bad_args(void) {
    tp_pool *p = (tp_pool *)1;
    hm_error err;
    HM_CHECK(tp_init(0, &p, &err) == HM_ERR_ARG);
    HM_CHECK(p == NULL);
    HM_CHECK(strstr(err.msg, "thread count") != NULL);
    tp_free(NULL);
    count_ctx c = {0};
    tp_run(NULL, count_fn, &c); /* no pool: runs on the caller */
    HM_CHECK(c.runs[0] == 1 && c.nth_seen[0] == 1);
}

typedef struct {
    atomic_int *hits; /* [n_items] */
    atomic_int bad_ith;
    int nth;
} item_ctx;

static void item_fn(void *ctx, int64_t item, int ith) {
    item_ctx *c = ctx;
    if (ith < 0 || ith >= c->nth) atomic_fetch_add(&c->bad_ith, 1);
    if (item % 7 == 0) usleep(1); /* uneven items */
    atomic_fetch_add(&c->hits[item], 1);
}

static void test_items(void) {
    enum { MAX_ITEMS = 1000 };
    static atomic_int hits[MAX_ITEMS];
    /* 1..4 threads and an oversubscribed pool of 24 (threads get descheduled mid-job) */
    const int sizes[] = {1, 2, 4, 24};
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        tp_pool *p = NULL;
        hm_error err;
        HM_REQUIRE(tp_init(sizes[si], &p, &err) == HM_OK);
        item_ctx c = {.hits = hits, .nth = sizes[si]};
        int bad = 0;
        for (int rep = 0; rep < 200; rep++) {
            int64_t n = 1 + (rep * 37) % MAX_ITEMS;
            for (int64_t i = 0; i < MAX_ITEMS; i++) atomic_store(&hits[i], 0);
            tp_run_items(p, item_fn, &c, n);
            /* returned: every item ran exactly once, none beyond n */
            for (int64_t i = 0; i < MAX_ITEMS; i++)
                bad += atomic_load(&hits[i]) != (i < n ? 1 : 0);
            if (rep % 3 == 0) { /* a classic job in between */
                count_ctx cc = {0};
                tp_run(p, count_fn, &cc);
                bad += atomic_load(&cc.calls) != sizes[si];
            }
            if (rep == 100) usleep(20000); /* workers fall asleep, then wake for items */
        }
        HM_CHECK(bad == 0);
        HM_CHECK(atomic_load(&c.bad_ith) == 0);
        tp_run_items(p, item_fn, &c, 0); /* nothing to do */
        tp_free(p);
    }
    item_ctx c = {.hits = hits, .nth = 1};
    for (int64_t i = 0; i < 5; i++) atomic_store(&hits[i], 0);
    tp_run_items(NULL, item_fn, &c, 5); /* no pool: the caller runs them */
    HM_CHECK(atomic_load(&hits[0]) == 1 && atomic_load(&hits[4]) == 1);
}

enum { ST_N = 5, ST_MAX_ITEMS = 40 };
typedef struct {
    int64_t n[ST_N];               /* items of each stage (some 0) */
    int val[ST_N][ST_MAX_ITEMS];   /* plain writes: item i of stage s writes the round */
    int then_val[ST_N];            /* plain write of stage s's then */
    atomic_int runs[ST_N][ST_MAX_ITEMS], then_calls[ST_N], errors;
    int round;
} stage_shared;

typedef struct {
    stage_shared *sh;
    int s;
} stage_ctx;

/* Every item and `then` of the stages before s has run (and written this round). */
static int stage_before_ok(const stage_shared *sh, int s) {
    for (int b = 0; b < s; b++) {
        if (sh->then_val[b] != sh->round) return 0;
        for (int64_t i = 0; i < sh->n[b]; i++)
            if (sh->val[b][i] != sh->round) return 0;
    }
    return 1;
}

static void stage_item(void *ctx, int64_t item, int ith) {
    (void)ith;
    stage_ctx *c = ctx;
    stage_shared *sh = c->sh;
    if (!stage_before_ok(sh, c->s)) atomic_fetch_add(&sh->errors, 1);
    if (item % 5 == 0) usleep(1);
    sh->val[c->s][item] = sh->round;
    atomic_fetch_add(&sh->runs[c->s][item], 1);
}

static void stage_then(void *ctx) {
    stage_ctx *c = ctx;
    stage_shared *sh = c->sh;
    if (!stage_before_ok(sh, c->s)) atomic_fetch_add(&sh->errors, 1);
    for (int64_t i = 0; i < sh->n[c->s]; i++)
        if (sh->val[c->s][i] != sh->round) atomic_fetch_add(&sh->errors, 1);
    sh->then_val[c->s] = sh->round;
    atomic_fetch_add(&sh->then_calls[c->s], 1);
}

static void test_stages(void) {
    static stage_shared sh;
    stage_ctx ctx[ST_N];
    const int sizes[] = {1, 2, 3, 24};
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        tp_pool *p = NULL;
        HM_REQUIRE(tp_init(sizes[si], &p, NULL) == HM_OK);
        int bad = 0;
        for (int rep = 0; rep < 300; rep++) {
            sh.round = rep + 1;
            tp_stage st[ST_N];
            for (int s = 0; s < ST_N; s++) {
                /* every third stage (rotating) is empty: at the start, middle and end */
                sh.n[s] = (s + rep) % 3 == 0 ? 0 : 1 + (rep * 7 + s * 13) % ST_MAX_ITEMS;
                ctx[s] = (stage_ctx){.sh = &sh, .s = s};
                st[s] = (tp_stage){.fn = stage_item, .ctx = &ctx[s], .n_items = sh.n[s],
                                   .then = (rep + s) % 4 == 3 ? NULL : stage_then,
                                   .then_ctx = &ctx[s]};
                if (!st[s].then) sh.then_val[s] = sh.round; /* nothing to wait for */
                atomic_store(&sh.then_calls[s], 0);
                for (int i = 0; i < ST_MAX_ITEMS; i++) atomic_store(&sh.runs[s][i], 0);
            }
            tp_run_stages(p, st, ST_N);
            /* returned: every item once, every `then` once, the last one included */
            for (int s = 0; s < ST_N; s++) {
                bad += atomic_load(&sh.then_calls[s]) != (st[s].then ? 1 : 0);
                for (int i = 0; i < ST_MAX_ITEMS; i++)
                    bad += atomic_load(&sh.runs[s][i]) != (i < sh.n[s] ? 1 : 0);
            }
            if (rep % 5 == 0) tp_run_items(p, stage_item, &ctx[0], 0); /* mixed with item jobs */
            if (rep == 150) usleep(20000);
        }
        HM_CHECK_MSG(bad == 0, "%d threads: %d wrong counts", sizes[si], bad);
        HM_CHECK_MSG(atomic_load(&sh.errors) == 0, "%d threads: %d stage order errors", sizes[si],
                     atomic_load(&sh.errors));
        tp_free(p);
    }
}

enum { PF_ITEMS = 6 };
typedef struct {
    atomic_int prefetched[2][PF_ITEMS]; /* prefetch calls per stage and item */
    atomic_int bad;
    atomic_int saw_open; /* stage 1 prefetches that saw their gate open */
} pf_ctx;

/* Stage 0's only item holds its stage closed until a thread has prefetched an item of stage 1
 * (bounded: 2 s), so with two or more threads a prefetch must happen. */
static void pf_item0(void *ctx, int64_t item, int ith) {
    (void)ith;
    pf_ctx *c = ctx;
    if (item != 0) atomic_fetch_add(&c->bad, 1);
    for (int ms = 0; ms < 2000; ms++) {
        for (int i = 0; i < PF_ITEMS; i++)
            if (atomic_load(&c->prefetched[1][i])) return;
        usleep(1000);
    }
}

static void pf_item1(void *ctx, int64_t item, int ith) {
    (void)ctx, (void)item, (void)ith;
}

static void pf_prefetch0(void *ctx, int64_t item, const tp_gate *gate) {
    (void)gate;
    pf_ctx *c = ctx;
    atomic_fetch_add(&c->prefetched[0][item >= 0 && item < PF_ITEMS ? item : 0], 1);
}

/* Records the call, then waits (bounded: 2 s) for the gate to report the stage open, as a
 * prefetch loop stops once it does. */
static void pf_prefetch1(void *ctx, int64_t item, const tp_gate *gate) {
    pf_ctx *c = ctx;
    if (item < 0 || item >= PF_ITEMS) atomic_fetch_add(&c->bad, 1);
    else atomic_fetch_add(&c->prefetched[1][item], 1);
    for (int ms = 0; ms < 2000; ms++) {
        if (tp_gate_open(gate)) {
            atomic_fetch_add(&c->saw_open, 1);
            return;
        }
        usleep(1000);
    }
}

static void test_stage_prefetch(void) {
    for (int n = 2; n <= 4; n++) {
        tp_pool *p = NULL;
        HM_REQUIRE(tp_init(n, &p, NULL) == HM_OK);
        static pf_ctx c;
        memset(&c, 0, sizeof(c));
        const tp_stage st[2] = {
            {.fn = pf_item0, .ctx = &c, .n_items = 1, .prefetch = pf_prefetch0},
            {.fn = pf_item1, .ctx = &c, .n_items = PF_ITEMS, .prefetch = pf_prefetch1}};
        tp_run_stages(p, st, 2);
        int got = 0, twice = 0;
        for (int i = 0; i < PF_ITEMS; i++) {
            got += atomic_load(&c.prefetched[1][i]) > 0;
            twice += atomic_load(&c.prefetched[1][i]) > 1;
        }
        HM_CHECK_MSG(got > 0, "%d threads: no item of the closed stage was prefetched", n);
        HM_CHECK_MSG(twice == 0, "%d threads: an item prefetched twice", n);
        HM_CHECK_MSG(atomic_load(&c.prefetched[0][0]) == 0, "%d threads: an open stage prefetched", n);
        HM_CHECK_MSG(atomic_load(&c.bad) == 0, "%d threads: prefetch of a wrong item", n);
        HM_CHECK_MSG(atomic_load(&c.saw_open) == got, "%d threads: %d of %d prefetches saw "
                     "their gate open", n, atomic_load(&c.saw_open), got);
        tp_free(p);
    }
}

/* ---- contention: a staged job of CT_STAGES stages of CT_ITEMS items; each item's value depends
 * on the stage before (an item of it and its `then` sum); in the last stage an odd item waits on
 * the flag of the even item before it (set by hm_spin_set or by a plain store, which wakes no
 * one) and mixes its value in. Every 4th job a classic job with barriers. */
enum { CT_STAGES = 3, CT_ITEMS = 48, CT_JOBS = 200, CT_MAX_THREADS = 64 };
typedef struct {
    uint64_t v[CT_STAGES][CT_ITEMS], then_sum[CT_STAGES];
    atomic_int flag[CT_ITEMS];
    uint64_t bar_val[CT_MAX_THREADS], bar_sum[CT_MAX_THREADS];
    tp_pool *pool;
    int job;
} ct_shared;

typedef struct {
    ct_shared *sh;
    int s;
} ct_ctx;

static uint64_t ct_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static void ct_item(void *ctx, int64_t i, int ith) {
    (void)ith;
    const ct_ctx *c = ctx;
    ct_shared *sh = c->sh;
    const int s = c->s;
    uint64_t x = ct_mix((uint64_t)sh->job << 32 | (uint64_t)s << 16 | (uint64_t)i);
    if (s > 0) x ^= sh->v[s - 1][(i * 7 + 3) % CT_ITEMS] + sh->then_sum[s - 1];
    for (int r = 0; r < 300; r++) x = ct_mix(x + (uint64_t)r); /* a few microseconds */
    if (s == CT_STAGES - 1 && i % 2 == 1) {
        hm_spin_until(&sh->flag[i - 1], sh->job + 1);
        x ^= sh->v[s][i - 1];
    }
    sh->v[s][i] = x;
    if (s == CT_STAGES - 1 && i % 2 == 0) {
        if (i % 4 == 0) hm_spin_set(&sh->flag[i], sh->job + 1);
        else atomic_store(&sh->flag[i], sh->job + 1);
    }
}

static void ct_then(void *ctx) {
    const ct_ctx *c = ctx;
    uint64_t sum = 0;
    for (int i = 0; i < CT_ITEMS; i++) sum += c->sh->v[c->s][i];
    c->sh->then_sum[c->s] = sum;
}

/* each thread: write, barrier, sum everyone's, barrier; 4 rounds */
static void ct_bar_fn(void *ctx, int ith, int nth) {
    ct_shared *sh = ctx;
    for (int r = 0; r < 4; r++) {
        sh->bar_val[ith] = ct_mix((uint64_t)sh->job * 131 + (uint64_t)r * 7 + (uint64_t)ith);
        tp_barrier(sh->pool);
        uint64_t sum = 0;
        for (int t = 0; t < nth; t++) sum += sh->bar_val[t];
        sh->bar_sum[ith] = sum;
        tp_barrier(sh->pool);
    }
}

/* Runs the CT_JOBS jobs on pool (NULL: the caller alone); returns a checksum of every value. */
static uint64_t ct_run(tp_pool *pool, ct_shared *sh) {
    memset(sh, 0, sizeof(*sh));
    sh->pool = pool;
    ct_ctx ctx[CT_STAGES];
    tp_stage st[CT_STAGES];
    for (int s = 0; s < CT_STAGES; s++) {
        ctx[s] = (ct_ctx){.sh = sh, .s = s};
        st[s] = (tp_stage){.fn = ct_item, .ctx = &ctx[s], .n_items = CT_ITEMS, .then = ct_then,
                           .then_ctx = &ctx[s]};
    }
    uint64_t h = 0;
    for (int j = 0; j < CT_JOBS; j++) {
        sh->job = j;
        tp_run_stages(pool, st, CT_STAGES);
        for (int s = 0; s < CT_STAGES; s++)
            for (int i = 0; i < CT_ITEMS; i++) h = ct_mix(h ^ sh->v[s][i]);
        if (j % 4 == 3) {
            tp_run(pool, ct_bar_fn, sh);
            /* every thread saw the same sum: that of the threads' values of the last round */
            for (int t = 1; t < tp_size(pool); t++)
                if (sh->bar_sum[t] != sh->bar_sum[0]) h ^= 1; /* breaks the comparison */
            h = ct_mix(h ^ (uint64_t)j);
        }
    }
    return h;
}

static atomic_int ct_stop;
static void *ct_busy(void *arg) {
    (void)arg;
    while (!atomic_load_explicit(&ct_stop, memory_order_relaxed)) {
    }
    return NULL;
}

static double ct_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ct_run on a pool of n threads beside 2 busy loops: the seconds it took; *ok: the results are
 * want's */
static double ct_busy_run(int n, ct_shared *sh, uint64_t want, int *ok) {
    tp_pool *p = NULL;
    *ok = 0;
    if (tp_init(n, &p, NULL) != HM_OK) return 0.0;
    *ok = ct_run(p, sh) == want; /* quiet */
    atomic_store(&ct_stop, 0);
    pthread_t busy[2];
    int started = 0;
    for (int b = 0; b < 2; b++) started += pthread_create(&busy[b], NULL, ct_busy, NULL) == 0;
    const double t0 = ct_now();
    *ok = *ok && ct_run(p, sh) == want && started == 2;
    const double t = ct_now() - t0;
    atomic_store(&ct_stop, 1);
    for (int b = 0; b < started; b++) pthread_join(busy[b], NULL);
    tp_free(p);
    return t;
}

static void test_contention(void) {
    static ct_shared sh;
    const uint64_t want = ct_run(NULL, &sh);
    tp_pool *one = NULL;
    HM_REQUIRE(tp_init(1, &one, NULL) == HM_OK);
    HM_CHECK(ct_run(one, &sh) == want);
    tp_free(one);
    /* as many threads as CPUs (the pool's long spins), and more (short spins), each beside two
     * busy loops (on a loaded 2-CPU box: 0.1-0.3 s each; 0.7-1.2 and 2-3 s with the spinning and
     * yielding waits before) */
    const int allowed = hm_cpu_count_allowed();
    const int over = allowed + 2 > 8 ? (allowed + 2 < CT_MAX_THREADS ? allowed + 2 : CT_MAX_THREADS)
                                     : 8;
    const int sizes[2] = {allowed < CT_MAX_THREADS ? allowed : CT_MAX_THREADS, over};
    for (int k = 0; k < 2; k++) {
        int ok;
        const double t = ct_busy_run(sizes[k], &sh, want, &ok);
        HM_CHECK_MSG(ok, "%d threads beside 2 busy loops: results differ from one thread's",
                     sizes[k]);
        HM_CHECK_MSG(t < 10.0, "%d threads on %d CPUs beside 2 busy loops: %d jobs took %.2f s",
                     sizes[k], allowed, CT_JOBS, t);
        printf("contention: %d threads on %d CPUs beside 2 busy loops: %d jobs in %.3f s\n",
               sizes[k], allowed, CT_JOBS, t);
    }
}

typedef struct {
    int one, two_warned, restored;
    char msg[128];
} aff_result;

/* In a thread of its own: pinned to one of its CPUs, it may use one. */
static void *aff_thread(void *arg) {
    aff_result *r = arg;
    cpu_set_t old, one;
    if (sched_getaffinity(0, sizeof(old), &old) != 0) return NULL;
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &old)) cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return NULL;
    r->one = hm_cpu_count_allowed();
    char buf[128];
    const char *w = hm_cpu_threads_warning(2, buf, sizeof(buf));
    r->two_warned = w != NULL;
    snprintf(r->msg, sizeof(r->msg), "%s", w ? w : "");
    r->restored = sched_setaffinity(0, sizeof(old), &old) == 0;
    return NULL;
}

static void test_cpu_count(void) {
    const int n = hm_cpu_count_allowed();
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    HM_CHECK_MSG(n >= 1 && n <= online, "%d allowed of %ld online", n, online);
    char buf[128];
    HM_CHECK(hm_cpu_threads_warning(n, buf, sizeof(buf)) == NULL);
    HM_CHECK(hm_cpu_threads_warning(1, buf, sizeof(buf)) == NULL);
    const char *w = hm_cpu_threads_warning(n + 4, buf, sizeof(buf));
    HM_CHECK(w == buf && strstr(w, "exceeds") != NULL);
    aff_result r = {0};
    pthread_t th;
    HM_REQUIRE(pthread_create(&th, NULL, aff_thread, &r) == 0);
    pthread_join(th, NULL);
    HM_CHECK_MSG(r.one == 1, "pinned to one CPU: %d allowed", r.one);
    HM_CHECK(r.two_warned && strcmp(r.msg, "-t 2 exceeds the 1 CPU this process may use; threads "
                                           "will share cores") == 0);
    HM_CHECK(r.restored);
    HM_CHECK(hm_cpu_count_allowed() == n); /* this thread's mask is its own */
}

/* ---- the active count ---- */
enum { AD_ITEMS = 24, AD_THREADS = 4 };
typedef struct {
    double frac[AD_THREADS]; /* forged run delay: this share of the wall time since t0 */
    int64_t burst_ns;        /* added once to thread 1's reading, then cleared */
    int64_t t0, base[AD_THREADS], extra;
    atomic_int lock;
} ad_src;

static int64_t ad_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t ad_delay(void *ctx, int ith) {
    ad_src *a = ctx;
    while (atomic_exchange(&a->lock, 1)) {
    }
    const int64_t t = ad_now();
    /* cumulative: what it read last plus frac of the time since */
    static _Thread_local int64_t last_t;
    if (last_t == 0 || last_t < a->t0) last_t = t;
    a->base[ith] += (int64_t)(a->frac[ith] * (double)(t - last_t));
    last_t = t;
    if (ith == 1 && a->burst_ns) {
        a->extra += a->burst_ns;
        a->burst_ns = 0;
    }
    const int64_t v = a->base[ith] + (ith == 1 ? a->extra : 0);
    atomic_store(&a->lock, 0);
    return v;
}

typedef struct {
    int64_t v1[AD_ITEMS], v2[AD_ITEMS];
    int sleep_us;
} ad_job;

static void ad_item1(void *ctx, int64_t i, int ith) {
    (void)ith;
    ad_job *j = ctx;
    if (j->sleep_us) usleep((useconds_t)j->sleep_us);
    j->v1[i] = (i + 1) * 2654435761ll % 1000003;
}

static void ad_item2(void *ctx, int64_t i, int ith) {
    (void)ith;
    ad_job *j = ctx;
    j->v2[i] = j->v1[i] * 3 + j->v1[(i + 1) % AD_ITEMS]; /* reads stage 0's results */
}

/* one staged job; returns whether its results are the serial ones */
static bool ad_run(tp_pool *p, ad_job *j) {
    memset(j->v1, 0, sizeof(j->v1));
    memset(j->v2, 0, sizeof(j->v2));
    const tp_stage st[2] = {{.fn = ad_item1, .ctx = j, .n_items = AD_ITEMS},
                            {.fn = ad_item2, .ctx = j, .n_items = AD_ITEMS}};
    tp_run_stages(p, st, 2);
    for (int64_t i = 0; i < AD_ITEMS; i++) {
        const int64_t a = (i + 1) * 2654435761ll % 1000003,
                      b = ((i + 1) % AD_ITEMS + 1) * 2654435761ll % 1000003;
        if (j->v1[i] != a || j->v2[i] != a * 3 + b) return false;
    }
    return true;
}

/* runs jobs for up to max_s seconds or until stop(active) holds; returns the seconds taken, or
 * -1 when it never held; *bad counts jobs whose results differ */
static double ad_until(tp_pool *p, ad_job *j, double max_s, int want, bool below, int *bad,
                       int *lowest) {
    const int64_t t0 = ad_now();
    for (;;) {
        *bad += !ad_run(p, j);
        const int a = tp_active(p);
        if (a < *lowest) *lowest = a;
        const double t = 1e-9 * (double)(ad_now() - t0);
        if (below ? a < want : a == want) return t;
        if (t > max_s) return -1.0;
    }
}

static void test_adapt_forged(void) {
    tp_pool *p = NULL;
    HM_REQUIRE(tp_init(AD_THREADS, &p, NULL) == HM_OK);
    static ad_src src;
    memset(&src, 0, sizeof(src));
    src.t0 = ad_now();
    tp_set_delay_source(p, ad_delay, &src);
    ad_job j = {.sleep_us = 100};
    int bad = 0, lowest = AD_THREADS;
    /* no delay, and once a 30 ms burst (one window's worth): every thread stays active over
     * 1.2 s (>= 20 windows) */
    const int64_t t0 = ad_now();
    int jobs = 0;
    while (ad_now() - t0 < 1200000000ll) {
        bad += !ad_run(p, &j);
        if (++jobs == 200) src.burst_ns = 30000000;
        if (tp_active(p) < lowest) lowest = tp_active(p);
    }
    HM_CHECK_MSG(lowest == AD_THREADS, "quiet: active count fell to %d of %d", lowest, AD_THREADS);
    HM_CHECK(bad == 0);
    /* two threads kept waiting 90% of the time (as beside busy programs): drops within 1 s
     * (two 50 ms windows, then probes) and results stay the same */
    src.frac[2] = src.frac[3] = 0.9;
    const double down = ad_until(p, &j, 3.0, AD_THREADS, true, &bad, &lowest);
    HM_CHECK_MSG(down >= 0 && down < 1.0, "slow threads: active count still %d after %.2f s",
                 tp_active(p), down);
    /* and keeps below the size over the next second (probes go back) */
    ad_until(p, &j, 1.0, -1, true, &bad, &lowest);
    HM_CHECK_MSG(tp_active(p) < AD_THREADS, "slow threads: active count back at %d",
                 tp_active(p));
    /* quiet again: back to every thread (probes every 0.25-4 s) */
    src.frac[2] = src.frac[3] = 0.0;
    const double up = ad_until(p, &j, 12.0, AD_THREADS, false, &bad, &lowest);
    HM_CHECK_MSG(up >= 0, "quiet again: active count still %d", tp_active(p));
    HM_CHECK_MSG(bad == 0, "%d jobs' results differed", bad);
    printf("active count (forged delay): down in %.3f s, lowest %d, back up in %.3f s\n", down,
           lowest, up);
    /* a classic job reaches the parked threads too */
    count_ctx cc = {0};
    tp_run(p, count_fn, &cc);
    HM_CHECK(atomic_load(&cc.calls) == AD_THREADS);
    tp_free(p);
}

/* HOTMOE_POOL_ADAPT=0 (read at tp_init): the same slow threads, and every thread stays active */
static void test_adapt_off(void) {
    setenv("HOTMOE_POOL_ADAPT", "0", 1);
    tp_pool *p = NULL;
    hm_status st = tp_init(AD_THREADS, &p, NULL);
    unsetenv("HOTMOE_POOL_ADAPT");
    HM_REQUIRE(st == HM_OK);
    static ad_src src;
    memset(&src, 0, sizeof(src));
    src.t0 = ad_now();
    src.frac[2] = src.frac[3] = 0.9;
    tp_set_delay_source(p, ad_delay, &src);
    ad_job j = {.sleep_us = 100};
    int bad = 0, lowest = AD_THREADS;
    HM_CHECK(ad_until(p, &j, 0.5, -1, true, &bad, &lowest) < 0); /* never below the size */
    HM_CHECK_MSG(lowest == AD_THREADS && bad == 0, "ADAPT=0: active count %d, %d bad jobs",
                 lowest, bad);
    tp_free(p);
}

static atomic_int ad_spin_stop;
static void *ad_spin(void *arg) {
    (void)arg;
    while (!atomic_load_explicit(&ad_spin_stop, memory_order_relaxed)) {
    }
    return NULL;
}

typedef struct {
    int ok, lowest, bad, ran;
    double t;
} ad_real;

/* In a thread pinned to one CPU: a pool of 3 beside a busy loop on that CPU (real run delay). */
static void *ad_real_thread(void *arg) {
    ad_real *r = arg;
    cpu_set_t old, one;
    if (sched_getaffinity(0, sizeof(old), &old) != 0) return NULL;
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &old)) cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return NULL;
    tp_pool *p = NULL;
    if (tp_init(3, &p, NULL) != HM_OK) return NULL;
    atomic_store(&ad_spin_stop, 0);
    pthread_t busy;
    const int started = pthread_create(&busy, NULL, ad_spin, NULL) == 0;
    ad_job j = {.sleep_us = 0};
    r->lowest = 3;
    r->t = ad_until(p, &j, 5.0, 3, true, &r->bad, &r->lowest);
    atomic_store(&ad_spin_stop, 1);
    if (started) pthread_join(busy, NULL);
    tp_free(p);
    r->ran = started;
    return NULL;
}

static void test_adapt_real(void) {
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) {
        printf("active count (real): no /proc/thread-self/schedstat, skipped\n");
        return;
    }
    fclose(f);
    ad_real r = {0};
    pthread_t th;
    HM_REQUIRE(pthread_create(&th, NULL, ad_real_thread, &r) == 0);
    pthread_join(th, NULL);
    HM_REQUIRE(r.ran);
    HM_CHECK_MSG(r.t >= 0, "3 threads and a busy loop on one CPU: active count stayed 3 for 5 s");
    HM_CHECK(r.bad == 0);
    printf("active count (3 threads + a busy loop on one CPU): below 3 after %.3f s\n", r.t);
}

HM_TEST_MAIN(test_many_jobs, test_barrier, test_bad_args, test_items, test_stages,
             test_stage_prefetch, test_contention, test_cpu_count, test_adapt_forged,
             test_adapt_off, test_adapt_real)
