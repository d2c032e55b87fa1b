/* runtime_internal.h - the context's struct (context.c, context_seqs.c) and what the generator
 * (generate.c) needs of the context beyond its public API. runtime/ sources only. */
#ifndef HM_RUNTIME_INTERNAL_H
#define HM_RUNTIME_INTERNAL_H

#include <stdbool.h>

#include "cpu_engine/cpu_engine.h"
#include "cuda/cuda_engine.h"
#include "moe/placement.h"
#include "runtime/context.h"
#include "runtime/fetch_setup.h"
#include "runtime/tiered.h"

struct hm_context {
    const hm_model *m;
    hm_context_params p;
    int n_past;          /* positions held (sequence 0) */
    int *seq_past;       /* [n_seq] positions each sequence holds; [0] unused (n_past) */
    int *seq_add;        /* [n_seq] hm_decode_seqs's scratch: tokens per sequence in a batch */
    int32_t *seq_pos;    /* [n_batch] hm_decode_seqs's scratch: each token's position */
    cpu_engine *cpu;     /* the CPU path, or NULL */
    cuda_engine *gpu;    /* the GPU path, or NULL */
    hm_tiered *tiered;   /* the CPU side of the GPU engine's host layers (tiered plan), or NULL */
    int split;           /* a split plan: the GPU's first layer k (cpu runs [0, k)); 0: none */
    float *rows;         /* split: [n_ubatch][n_embd] hidden rows from the CPU's last layer */
    moe_observer obs;    /* routing observer (no function set: none) */
    bool gpu_counting;   /* the GPU engine counts routes on the device for obs */
    uint64_t *hits;      /* [n_layer][n_expert] device counts read back (GPU path) */
    uint64_t *calls, *tokens; /* [n_layer] */
    char *override_tensor;    /* the context's copy of p.override_tensor */
    char *hot_cache;          /* the context's copy of p.moe_hot_cache */
    moe_placement plan;       /* the placement plan (zeroed when none was asked for) */
    char *report;             /* its report, or NULL */
    fetch_setup fetch;        /* prompt ubatches' fetched experts (tiered plans) */
    uint64_t staging;         /* bytes of one staging buffer the plan reserved (0: none) */
    int tiered_threads;       /* the CPU side's threads: -t, or 0 (hm_tiered's default) */
};

/* The cache length after the GPU's own decode loop advanced it (steps it ran and kept). */
void runtime_context_set_past(hm_context *c, int n_past);

/* After a failed step of a tiered context (st, err: the engine's): adds the CPU side's reason to
 * err, resets the hand-off and, for a failure the reset cures (HM_ERR_STATE: the CPU side's
 * fault, an abort, the GPU's wait timing out), counts a retry, logs it (what: the step) and
 * returns true: the caller redoes the step once. False for any other context or failure. */
bool runtime_context_tiered_recover(hm_context *c, hm_status st, const char *what,
                                    hm_error *err);

#endif
