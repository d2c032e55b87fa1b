/* spin.c - the spin-then-futex waits of spin.h. */
#include "base/spin.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

hm_waiters hm_spin_waiters;
_Thread_local int64_t hm_spin_wait_ns = HM_TUNE_SPIN_WAIT_NS;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* *a (read with order mo into *cur) is ready: >= x, or != x with ne */
static inline bool ready(atomic_int *a, int x, bool ne, int *cur, memory_order mo) {
    *cur = atomic_load_explicit(a, mo);
    return ne ? *cur != x : *cur >= x;
}

static void wait_word(atomic_int *a, int x, bool ne, hm_waiters *w, int64_t spin_ns,
                      int64_t max_sleep_ns) {
    int cur;
    int64_t end = 0;
    for (unsigned i = 1; !ready(a, x, ne, &cur, memory_order_acquire); i++) {
        HM_SPIN_RELAX();
        if (i % HM_TUNE_SPIN_CLOCK_EVERY) continue;
        const int64_t t = now_ns();
        if (!end) end = t + spin_ns;
        else if (t >= end) break;
    }
    while (!ready(a, x, ne, &cur, memory_order_acquire)) {
        atomic_fetch_add(&w->sleepers, 1); /* seq_cst: pairs with the waker's store + load */
        if (!ready(a, x, ne, &cur, memory_order_seq_cst)) {
            atomic_fetch_add_explicit(&w->sleeps, 1, memory_order_relaxed);
            const struct timespec ts = {.tv_sec = max_sleep_ns / 1000000000,
                                        .tv_nsec = max_sleep_ns % 1000000000};
            /* returns at once if *a != cur; spurious returns are re-checked */
            syscall(SYS_futex, (int *)a, FUTEX_WAIT_PRIVATE, cur, max_sleep_ns > 0 ? &ts : NULL,
                    NULL, 0);
        }
        atomic_fetch_sub(&w->sleepers, 1);
    }
}

void hm_wait_ge(atomic_int *a, int v, hm_waiters *w, int64_t spin_ns, int64_t max_sleep_ns) {
    wait_word(a, v, false, w, spin_ns, max_sleep_ns);
}

void hm_wait_ne(atomic_int *a, int old, hm_waiters *w, int64_t spin_ns, int64_t max_sleep_ns) {
    wait_word(a, old, true, w, spin_ns, max_sleep_ns);
}

void hm_futex_wake_all(atomic_int *a) {
    syscall(SYS_futex, (int *)a, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}
