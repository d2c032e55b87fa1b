/* spin.h - waiting for another thread's store: spin briefly, then sleep on a futex (C only:
 * stdatomic; Linux).
 *
 * DESIGN: a wait reads the 32-bit word until it is ready, with pause between reads, for up to a
 * time budget (base/tune.h: longer than the waits of a quiet run, short against a time slice);
 * then it sleeps on the word's futex, counted in an hm_waiters. The thread that changes the word
 * calls hm_wake after its (seq_cst) store, which makes the futex_wake system call only when that
 * count is not zero: the quiet path costs one read of a shared line. The sleeper's increment and
 * the waker's store are both seq_cst and FUTEX_WAIT compares the word in the kernel, so either
 * the waker sees the sleeper or the sleeper's FUTEX_WAIT sees the new value: no lost wake-up.
 * Sleeping matters when runnable threads outnumber cores (other programs, or more threads than
 * CPUs): a spinning thread holds the core that the thread it waits for may need, a sleeping one
 * leaves it idle, and the scheduler runs (or moves) that thread there.
 *
 * hm_spin_until / hm_spin_set: an item of a pool job waiting on another item's flag. Their
 * sleepers are counted in one process-wide hm_waiters; the sleep is bounded (tune.h) so that a
 * flag stored by a plain atomic store, which wakes no one, is still seen.
 */
#ifndef HM_BASE_SPIN_H
#define HM_BASE_SPIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/tune.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HM_SPIN_RELAX() _mm_pause()
#else
#define HM_SPIN_RELAX() ((void)0)
#endif

/* Threads asleep (or about to be) on a word's futex, and how often one went to sleep. */
typedef struct {
    atomic_int sleepers;
    atomic_llong sleeps; /* for profiles: a quiet run should not sleep inside its jobs */
} hm_waiters;

/* Returns once *a >= v (acquire): spins for up to spin_ns, then sleeps on a's futex (each sleep
 * at most max_sleep_ns, 0: unbounded) until a thread that raised *a calls hm_wake(a, w). */
void hm_wait_ge(atomic_int *a, int v, hm_waiters *w, int64_t spin_ns, int64_t max_sleep_ns);
/* Returns once *a != old (acquire); otherwise as hm_wait_ge. */
void hm_wait_ne(atomic_int *a, int old, hm_waiters *w, int64_t spin_ns, int64_t max_sleep_ns);

void hm_futex_wake_all(atomic_int *a);
/* After a seq_cst store to (or read-modify-write of) *a: wakes the threads asleep on it, if
 * any may be. */
static inline void hm_wake(atomic_int *a, hm_waiters *w) {
    if (atomic_load(&w->sleepers) > 0) hm_futex_wake_all(a);
}

/* The waiters of hm_spin_until, all flags of the process. */
extern hm_waiters hm_spin_waiters;
/* hm_spin_until's spin budget on this thread (HM_TUNE_SPIN_WAIT_NS unless a pool that runs
 * items on it set its own: base/threadpool.c). */
extern _Thread_local int64_t hm_spin_wait_ns;

/* Returns once *a >= v (acquire). */
static inline void hm_spin_until(atomic_int *a, int v) {
    if (atomic_load_explicit(a, memory_order_acquire) >= v) return;
    hm_wait_ge(a, v, &hm_spin_waiters, hm_spin_wait_ns, HM_TUNE_FLAG_SLEEP_NS);
}

/* Stores v into a flag that hm_spin_until may wait on and wakes its sleepers (release and
 * more: seq_cst). */
static inline void hm_spin_set(atomic_int *a, int v) {
    atomic_store(a, v);
    hm_wake(a, &hm_spin_waiters);
}

#endif
