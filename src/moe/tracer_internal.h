/* tracer_internal.h - the tracer's state, shared by tracer.c and tracer_export.c. */
#ifndef HM_MOE_TRACER_INTERNAL_H
#define HM_MOE_TRACER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "moe/tracer.h"

#define MOE_TRACER_MAX_LAYERS 4096
#define MOE_TRACER_MAX_EXPERTS 65536
#define MOE_TRACER_HIST_MAX 1024 /* experts histogrammed on the stack per record call */
#define MOE_TRACER_NAMES 4
#define MOE_TRACER_NAME_MAX 96

typedef struct {
    char name[MOE_TRACER_NAMES][MOE_TRACER_NAME_MAX];
    int n;
} moe_tracer_names;

struct moe_tracer {
    int n_layer, n_expert, n_used;
    bool counting, names, per_layer, stats;
    _Atomic uint64_t *hits;    /* [n_layer][n_expert] */
    _Atomic uint64_t *calls;   /* [n_layer] */
    _Atomic uint64_t *tokens;  /* [n_layer] */
    _Atomic uint64_t *time_ns; /* [n_layer] */
    _Atomic uint64_t rejected, prompts;
    moe_tracer_names *tnames;  /* [n_layer] */
    char *output;              /* owned copy of the configured output path, or NULL */
    char *arch, *name, *file;  /* model info, or NULL */
    FILE *log;
    pthread_mutex_t log_mu;
    bool mu_ok;
};

#endif
