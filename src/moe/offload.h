/* offload.h - the offload cost model of seed 003: for one ubatch of a layer whose experts live in
 * host RAM, which used experts are copied to the GPU and computed there, and which the CPU
 * computes.
 *
 * DESIGN: two lanes run at once: the CPU lane computes its experts with the whole pool, the copy
 * lane sends the other experts' bytes over PCIe and the GPU multiplies them (copies double-
 * buffered across layers, cuda/cuda_host.h). The model predicts each lane's time from the
 * calibrated rates (runtime/calibrate.h):
 *
 *   cpu(e) = bytes(e) * (cpu_fixed_s_per_byte + n_tok(e) * cpu_tok_s_per_byte)
 *   gpu(e) = bytes(e) / h2d_bytes_per_s + gpu_fixed_s + n_tok(e) * gpu_tok_s
 *   (no copy term for an expert already copied)
 *
 * (an expert on the CPU streams its weights once and then pays per token; on the GPU its copy
 * dominates and the product is nearly free) and picks the split that makes the slower lane
 * fastest: starting from every used expert on the CPU, the experts are visited in decreasing
 * order of cpu(e) / gpu(e) (ties: lower id first) and each is moved to the GPU when that lowers
 * max(CPU lane, GPU lane), skipped otherwise, and skipped when the staging buffer (cap_bytes) has
 * no room. A greedy by benefit, deterministic, O(E log E): the experts that gain most from the
 * GPU (most tokens, for one layer's experts of equal size) go first, until the copy lane has as
 * much work as the CPU lane.
 *
 * --moe-offload-threshold N (opts.threshold >= 1) replaces the model with seed 003's rule: a
 * ubatch of at least N tokens sends every used expert to the GPU (as far as the staging buffer
 * holds them), a smaller one keeps all of them on the CPU. Experts no token was routed to are
 * never copied. Every decision carries its cause (offload_why) for HOTMOE_SCHED_DEBUG=1
 * (offload_plan_format). Pure C: no CUDA, no threads; the caller owns the plan's arrays.
 */
#ifndef HM_MOE_OFFLOAD_H
#define HM_MOE_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"

/* Why an expert went where it went. */
typedef enum {
    OFFLOAD_WHY_UNUSED = 0,   /* no token routed to it: not computed, not copied */
    OFFLOAD_WHY_NO_GPU,       /* CPU: no copy path (no GPU, or h2d rate 0) */
    OFFLOAD_WHY_THRESHOLD_GE, /* GPU: ubatch tokens >= --moe-offload-threshold */
    OFFLOAD_WHY_THRESHOLD_LT, /* CPU: ubatch tokens < --moe-offload-threshold */
    OFFLOAD_WHY_GAIN,         /* GPU: moving it lowered the slower lane's time */
    OFFLOAD_WHY_NO_GAIN,      /* CPU: moving it would not have lowered it */
    OFFLOAD_WHY_CAP,          /* CPU: the staging buffer had no room left for its bytes */
    OFFLOAD_WHY_COUNT
} offload_why;

/* "unused", "no GPU", "threshold", "below threshold", "gain", "no gain", "staging full" */
const char *offload_why_str(offload_why w);

/* The calibrated rates of one layer (calib_layer_rates fills them). All >= 0 and finite. */
typedef struct {
    double h2d_bytes_per_s;      /* host->device copy rate; 0: no GPU path */
    double gpu_fixed_s;          /* per expert on the GPU besides its copy (launches) */
    double gpu_tok_s;            /* per token of an expert on the GPU */
    double cpu_fixed_s_per_byte; /* CPU seconds per weight byte, whatever the tokens */
    double cpu_tok_s_per_byte;   /* CPU seconds per weight byte per token */
} offload_rates;

typedef struct {
    int64_t threshold;  /* --moe-offload-threshold N: >= 1 replaces the cost model; 0: the model */
    uint64_t cap_bytes; /* room left in the staging buffer (0: none, only experts already copied
                           may run on the GPU; OFFLOAD_NO_CAP: no limit) */
} offload_opts;
#define OFFLOAD_NO_CAP UINT64_MAX

/* One expert of the layer in this ubatch. */
typedef struct {
    int32_t n_tok;  /* tokens routed to it (>= 0) */
    uint64_t bytes; /* what its copy moves / occupies in a staging buffer (offload_expert_size);
                       the CPU's cost is per byte of it too */
    bool copied;    /* already in the staging buffer (copied ahead): on the GPU it costs no copy
                       and takes no room (cap_bytes) */
} offload_expert;

typedef struct {
    double key;
    int32_t id;
} offload_item;

/* The decisions for one ubatch of one layer. */
typedef struct {
    int n_expert;
    uint8_t *gpu;        /* [n_expert] 1: copy it and compute it on the GPU */
    uint8_t *why;        /* [n_expert] offload_why */
    offload_item *items; /* [n_expert] scratch (the visiting order) */
    int64_t n_tok;       /* the ubatch's tokens */
    int64_t threshold;   /* opts.threshold of the decision */
    int n_used, n_gpu;
    uint64_t gpu_bytes;  /* bytes to copy */
    double cpu_s, gpu_s; /* the predicted lanes */
    double all_cpu_s;    /* every used expert on the CPU */
} offload_plan;

hm_status offload_plan_init(offload_plan *p, int n_expert, hm_error *err);
void offload_plan_free(offload_plan *p); /* zeroed or NULL: fine */

/* Decides every expert of ex[0..p->n_expert) for a ubatch of n_tok tokens. HM_ERR_ARG for a
 * negative or non-finite rate, a negative token count or n_tok < 0. */
hm_status offload_decide(offload_plan *p, int64_t n_tok, const offload_expert *ex,
                         const offload_rates *r, const offload_opts *o, hm_error *err);

/* Predicted time of expert x on each lane. */
double offload_cpu_s(const offload_rates *r, const offload_expert *x);
double offload_gpu_s(const offload_rates *r, const offload_expert *x);

/* The plan as text for HOTMOE_SCHED_DEBUG=1: one line for the layer (ubatch tokens, rule, lanes,
 * bytes), then one line per (lane, cause) listing its experts as id:tokens. Returns the length
 * the text needs (as snprintf; buf may be NULL when n is 0). */
size_t offload_plan_format(const offload_plan *p, int layer, const offload_expert *ex,
                           char *buf, size_t n);
/* HOTMOE_SCHED_DEBUG=1 in the environment (read at each call; callers read it once). */
bool offload_debug_env(void);

/* counts[e] (e < n_expert, zeroed first) = number of (token, slot) pairs of ids [n_tok][n_used]
 * routed to e; ids < 0 or >= n_expert are skipped. */
void offload_count_tokens(const int32_t *ids, int64_t n_tok, int n_used, int n_expert,
                          int32_t *counts);

/* ---- the experts' bytes in the model ---- */

enum { OFFLOAD_MAX_RANGES = 6 }; /* gate, up, down and their biases */

typedef struct {
    const void *p;
    size_t n;
} offload_range;

/* The host ranges of expert e of layer il (gate, up, down rows; then the biases present), in
 * that order; returns their number (0: the layer has no experts, or e is out of range). */
int offload_expert_ranges(const hm_model *m, int il, int e, offload_range *out);
/* Bytes of one expert of layer il with each range rounded up to align (1: exact; the copy lane's
 * CUDA_COPY_LANE_ALIGN: what it occupies in a staging buffer). 0 for a layer without experts. */
uint64_t offload_expert_size(const hm_model *m, int il, size_t align);
/* The smallest range covering every expert tensor of every layer (what to register as pinned);
 * false when the model has no experts. */
bool offload_expert_span(const hm_model *m, const void **p, size_t *n);

#endif
