/* threadpool.h - a fixed pool of threads that run one job at a time on all of them.
 *
 * DESIGN: tp_run(pool, fn, ctx) calls fn(ctx, ith, nth) on every thread of the pool — the caller
 * is thread 0, the pool's own workers are 1..nth-1 — and returns when all calls have returned.
 * Every wait (workers for the next job, the caller for the job's end, tp_barrier(), the stage
 * gates) spins briefly and then sleeps on a futex (base/spin.h; budgets in base/tune.h): jobs
 * of a decode step follow each other within microseconds, so a quiet run keeps spinning, while
 * an idle pool costs no CPU and, with more runnable threads than cores, a waiting thread gives
 * its core to the thread it waits for instead of holding it. Item jobs (tp_run_items) hand out
 * items through one atomic word and finish when the items are done, not when every thread has
 * checked in: on a shared machine a descheduled thread then costs a few microseconds instead of
 * a whole time slice. The pool holds no global state; several
 * pools may coexist. tp_run must not be called concurrently on one pool, nor from inside a job.
 */
#ifndef HM_BASE_THREADPOOL_H
#define HM_BASE_THREADPOOL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

typedef struct tp_pool tp_pool;

/* fn runs once on each thread; ith in [0, nth). */
typedef void (*tp_fn)(void *ctx, int ith, int nth);

/* Creates a pool of n threads in all (n - 1 workers plus the caller); 1 <= n <= 1024. With the
 * environment variable HOTMOE_POOL_PROF=1 the pool times its item jobs and tp_free logs (info)
 * per job kind the calls, the mean time, items, stage close times (and their `then` steps' time),
 * the caller's time between jobs (where a decode step's CPU time goes), and how often threads
 * slept at each kind of wait (a quiet run should sleep only between jobs, if at all). The spin
 * budgets (base/tune.h; short when n exceeds the CPUs the process may use) can be replaced for
 * tuning runs by HOTMOE_POOL_SPIN_US=WAIT[,IDLE] (microseconds; IDLE defaults to WAIT). */
hm_status tp_init(int n, tp_pool **pool, hm_error *err);
/* Replaces the idle workers' spin budget (waiting for the next job) with ns, for a pool whose
 * jobs come in bursts with longer gaps than a decode step's (runtime/tiered.c); kept short when
 * the pool has more threads than CPUs, and HOTMOE_POOL_SPIN_US still wins. Call it before the
 * first job. */
void tp_set_idle_spin(tp_pool *pool, int64_t ns);
/* Stops and joins the workers; NULL is allowed. */
void tp_free(tp_pool *pool);
/* Number of threads (nth of every job). */
int tp_size(const tp_pool *pool);

/* The active count: item jobs (tp_run_items, tp_run_stages) run on threads [0, tp_active());
 * the others sleep and claim nothing (classic jobs, tp_run, still run on all). It starts at
 * tp_size() and follows contention: each active thread reads its run delay (time runnable but
 * kept off a CPU, /proc/thread-self/schedstat) at most every HM_TUNE_POOL_SAMPLE_NS; when the
 * threads together were kept waiting for more than half a thread's time over windows in a row,
 * the count drops (by the waiting threads' number); while below tp_size() it probes one more now
 * and then and keeps it if no waiting follows (constants: base/tune.h). Items never depend on
 * the thread that runs them, so results do not change. HOTMOE_POOL_ADAPT=0 keeps all threads
 * active (A/B runs); HOTMOE_POOL_PROF=1 logs the changes. A NULL pool: 1. */
int tp_active(const tp_pool *pool);
/* For tests: replaces the run-delay reading with fn(ctx, ith) (cumulative ns of thread ith,
 * called on that thread; < 0: no reading). Call before the pool's first item job. */
void tp_set_delay_source(tp_pool *pool, int64_t (*fn)(void *ctx, int ith), void *ctx);
/* Runs fn on all threads of the pool and waits for them. A NULL pool runs fn(ctx, 0, 1). */
void tp_run(tp_pool *pool, tp_fn fn, void *ctx);
/* Inside a job: returns once all nth threads have called it (same number of times each). */
void tp_barrier(tp_pool *pool);

/* An item job: fn(ctx, item, ith) runs once for every item in [0, n_items), on whichever
 * threads claim it first (ith identifies the thread, e.g. for per-thread scratch). tp_run_items
 * returns when every item has completed — it does not wait for threads that claimed nothing, so
 * a worker the OS has descheduled delays the job only if it holds an item. Items must not call
 * tp_barrier. A NULL pool runs every item on the caller, in order. */
typedef void (*tp_item_fn)(void *ctx, int64_t item, int ith);
void tp_run_items(tp_pool *pool, tp_item_fn fn, void *ctx, int64_t n_items);

/* The gate a stage's prefetch runs at: it stops prefetching once the gate is open, so that a
 * thread that reached the gate late starts its item (whose kernel prefetches the rest as it
 * goes) instead of first loading all of it. */
typedef struct tp_gate tp_gate;
bool tp_gate_open(const tp_gate *gate);

/* A staged item job: dependent steps in one job instead of one job each (a decode layer's
 * products and the small serial steps between them). Stage s's items start only once every item
 * of the stages before it has completed and their `then` steps have run; `then` (may be NULL)
 * runs once, on the thread that completed the stage's last item (on the caller for a stage of
 * no items at the start), while the other threads wait at the next stage's first items. The
 * items of all stages share one counter, claimed in order, so a thread waiting at a stage holds
 * no earlier item. tp_run_stages returns once the last stage's `then` has returned. A NULL pool
 * runs everything on the caller, in order. Neither items nor `then` may call tp_run*. */
typedef struct {
    tp_item_fn fn;           /* items [0, n_items) as in tp_run_items; NULL if n_items == 0 */
    void *ctx;
    int64_t n_items;
    void (*then)(void *then_ctx);
    void *then_ctx;
    /* may be NULL: called with an item of this stage by a thread that claimed it before the
     * stage opened, before it waits at the gate: e.g. the item's weight rows prefetched into the
     * core's cache while the stages before it finish (the thread will run that item first),
     * in order, until tp_gate_open(gate) */
    void (*prefetch)(void *ctx, int64_t item, const tp_gate *gate);
} tp_stage;
enum { TP_MAX_STAGES = 1024 }; /* e.g. a decode step's every layer in one job */
void tp_run_stages(tp_pool *pool, const tp_stage *stages, int n_stages);

#endif
