/* calibrate_internal.h - what calibrate.c (measuring) and calibrate_cache.c (keys and the cache
 * file) share. runtime/calibrate*.c only. */
#ifndef HM_RUNTIME_CALIBRATE_INTERNAL_H
#define HM_RUNTIME_CALIBRATE_INTERNAL_H

#include "runtime/calibrate.h"

/* The distinct weight types of the model's expert matrices (gate, up, down of every layer), in
 * order of first appearance; returns their number (at most max). */
int calib_model_types(const hm_model *m, uint32_t *types, int max);
/* The layer and matrix (0 gate, 1 up, 2 down) where type first appears; false if nowhere. */
bool calib_type_tensor(const hm_model *m, uint32_t type, const hm_tensor **t);
/* Sets t->fixed_s_per_byte and t->tok_s_per_byte from its measurement (bytes, batch, t1, tb):
 * the line through (1, t1) and (batch, tb), per byte; the per-token slope kept above a
 * thousandth of t1 per byte (timing noise can make tb <= t1 on tiny products), the fixed part
 * >= 0. */
void calib_type_derive(calib_type *t);

#endif
