/* runtime_internal.h - what the generator (generate.c) needs of the context beyond its public
 * API. runtime/ sources only. */
#ifndef HM_RUNTIME_INTERNAL_H
#define HM_RUNTIME_INTERNAL_H

#include <stdbool.h>

#include "runtime/context.h"

/* The cache length after the GPU's own decode loop advanced it (steps it ran and kept). */
void runtime_context_set_past(hm_context *c, int n_past);

/* After a failed step of a tiered context (st, err: the engine's): adds the CPU side's reason to
 * err, resets the hand-off and, for a failure the reset cures (HM_ERR_STATE: the CPU side's
 * fault, an abort, the GPU's wait timing out), counts a retry, logs it (what: the step) and
 * returns true: the caller redoes the step once. False for any other context or failure. */
bool runtime_context_tiered_recover(hm_context *c, hm_status st, const char *what,
                                    hm_error *err);

#endif
