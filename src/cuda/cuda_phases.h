/* cuda_phases.h - a probe of the one-token decode step's shape, for bench_cuda_phases: what a
 * layer of dependent phases costs as one kernel per phase (today's graph) and as one persistent
 * kernel whose blocks wait at a grid barrier between phases, with and without prefetching the
 * next phase's bytes into L2 while they wait.
 *
 * A "layer" is n_phase phases; phase p reads bytes[p] bytes of weights (its own region of w,
 * spread over the blocks it runs on) and depends on the phase before it (its blocks read a word
 * that phase wrote). The bytes are only summed: the probe measures data movement and
 * synchronisation, not arithmetic. Not used by the engine. */
#ifndef HM_CUDA_CUDA_PHASES_H
#define HM_CUDA_CUDA_PHASES_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

enum { CUDA_PHASES_MAX = 16 };

typedef enum {
    CUDA_PHASES_KERNELS = 0,    /* one kernel per phase (PDL), as the decode graph runs */
    CUDA_PHASES_PERSISTENT,     /* one kernel for all layers, a grid barrier between phases */
    CUDA_PHASES_PREFETCH,       /* the same, each block prefetching its next slice before it waits */
    CUDA_PHASES_STREAM,         /* every layer's bytes as one phase: the streaming ceiling */
} cuda_phases_mode;

typedef struct {
    const uint8_t *w;               /* device: n_layer regions of layer_bytes (the phases' bytes, in order) */
    size_t bytes[CUDA_PHASES_MAX];  /* per phase, multiples of 4096 */
    int n_phase, n_layer;
    int blocks;                     /* persistent modes: resident blocks (all must fit at once) */
    uint32_t *scratch;              /* device, cuda_phases_scratch_words() words */
} cuda_phases_args;

size_t cuda_phases_scratch_words(void);
/* Enqueues one run of every layer on stream (capturable in a graph); HM_ERR_CUDA on a launch
 * error. The persistent modes need scratch zeroed before the first run (the barrier's state
 * returns to zero after each run). */
hm_status cuda_phases_run(cuda_phases_mode mode, const cuda_phases_args *a, void *stream,
                          hm_error *err);
/* Blocks of the persistent kernel that fit on the device at once (0 on error). */
int cuda_phases_max_blocks(void);

#endif
