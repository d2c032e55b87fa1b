/* test_threadpool.c - the pool runs every job on all threads exactly once, returns only when
 * all are done, survives idle periods (workers asleep on the futex), and tp_barrier separates
 * phases: after a barrier every thread sees every other thread's writes of the previous phase.
 * Item jobs run every item exactly once, interleave with classic jobs, and return only when all
 * items are done even when a worker is slow (oversubscribed pool). Staged jobs run each stage's
 * items after every item and the `then` of the stages before them (whose plain writes they
 * see), each `then` once after its stage's items, empty stages included. A thread that holds an
 * item of a stage not yet open calls the stage's prefetch with that item (and only then), whose
 * gate reports the stage open once it is. */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

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

HM_TEST_MAIN(test_many_jobs, test_barrier, test_bad_args, test_items, test_stages,
             test_stage_prefetch)
