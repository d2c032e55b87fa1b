/* spin.h - waiting inside a pool job for a flag or counter another thread sets (C only:
 * stdatomic). Short waits spin with pause; after TP-style 256 rounds the thread yields, since
 * with more threads than cores the thread that will set it may need this core. */
#ifndef HM_BASE_SPIN_H
#define HM_BASE_SPIN_H

#include <sched.h>
#include <stdatomic.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HM_SPIN_RELAX() _mm_pause()
#else
#define HM_SPIN_RELAX() ((void)0)
#endif

/* Returns once *a >= v (acquire). */
static inline void hm_spin_until(atomic_int *a, int v) {
    for (int spins = 0; atomic_load_explicit(a, memory_order_acquire) < v;) {
        if (++spins < 256) HM_SPIN_RELAX();
        else sched_yield();
    }
}

#endif
