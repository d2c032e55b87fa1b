/* ops_internal.h - helpers shared by the ops_*.c files (not part of the public API). */
#ifndef HM_CPU_OPS_INTERNAL_H
#define HM_CPU_OPS_INTERNAL_H

#include <stdint.h>

#include "base/threadpool.h"

/* Thread ith's share [*i0, *i1) of n items split into nth near-equal contiguous ranges. */
static inline void ops_split(int64_t n, int ith, int nth, int64_t *i0, int64_t *i1) {
    *i0 = n * ith / nth;
    *i1 = n * (ith + 1) / nth;
}

/* Runs fn on the pool when the work is worth waking it (work >= min_work), else on the
 * caller alone (ith 0 of 1). Which threads run an item never changes its result. */
static inline void ops_run(tp_pool *pool, tp_fn fn, void *ctx, int64_t work, int64_t min_work) {
    if (!pool || tp_size(pool) == 1 || work < min_work) fn(ctx, 0, 1);
    else tp_run(pool, fn, ctx);
}

/* f16 -> f32 of a row (exact); F16C (ops_attn_avx2.c): call only when the CPU has AVX2+F16C. */
void ops_f16_to_f32_avx2(const uint16_t *src, float *dst, int64_t n);

#endif
