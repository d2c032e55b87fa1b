/* runtime_internal.h - what the generator (generate.c) needs of the context beyond its public
 * API. runtime/ sources only. */
#ifndef HM_RUNTIME_INTERNAL_H
#define HM_RUNTIME_INTERNAL_H

#include "runtime/context.h"

/* The cache length after the GPU's own decode loop advanced it (steps it ran and kept). */
void runtime_context_set_past(hm_context *c, int n_past);

#endif
