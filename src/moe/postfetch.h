/* postfetch.h - post-fetch (seed 000) at a decode step's cold experts: which experts' down
 * projection (D) goes to the GPU over PCIe while the CPU computes their gate and up products,
 * and the variables that govern it. Pure C: the decision and the configuration; the tiered
 * runtime copies and the GPU engine multiplies.
 *
 * DESIGN: the variables keep the seed's names and defaults: LLAMA_POSTFETCH_ENABLE (1: the cost
 * model may post-fetch), _FORCE_CPU (0; 1: never), _BLOCK_ON_MISS (1: the GPU waits for a D
 * copy; 0: a copy not done in time leaves D to the CPU), _MAX_TRANSFERS (8: experts per layer
 * and step), _SCRATCHPAD_MB (0: the staging buffer of the layer, sized from the model's largest
 * layer; N: at most N MiB of D's per layer and step), _USE_DEDICATED_STREAMS (1; the copies
 * always run on the copy lane's own stream, 0 changes nothing and is said at start), _DEBUG (0;
 * 1: the [PF] lines); HOTMOE_POSTFETCH_FORCE=1 sends every cold expert's D over PCIe (up to
 * MAX_TRANSFERS and the scratchpad), for measurement. A value that is not a number, or out of range,
 * is refused naming the variable.
 * The cost model: with post-fetch set S, the CPU reads every cold expert's gate and up rows and
 * the D rows of the others, the copy lane moves S's D rows, and both draw on one host memory:
 *   T(S) = max(cpu_bytes(S) / read, copy_bytes(S) / h2d, (cpu_bytes(S) + copy_bytes(S)) /
 *              (concurrency * read)) + |S| * gpu_d_s
 * where concurrency is how much more host memory delivers to reads and copies at once than to
 * reads alone (bench_host_pcie: 1.08 on the GPU machine; 1.0, the default, means one shared
 * bandwidth, where moving a D's bytes to the link saves nothing). Experts are added to S by
 * decreasing D bytes while T falls, at most max_transfers and scratchpad_mb MiB (a D that does
 * not fit is skipped, smaller ones still tried). Deterministic.
 */
#ifndef HM_MOE_POSTFETCH_H
#define HM_MOE_POSTFETCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct pf_config {
    bool enable;            /* LLAMA_POSTFETCH_ENABLE (1) */
    bool force_cpu;         /* LLAMA_POSTFETCH_FORCE_CPU (0) */
    bool block_on_miss;     /* LLAMA_POSTFETCH_BLOCK_ON_MISS (1) */
    int max_transfers;      /* LLAMA_POSTFETCH_MAX_TRANSFERS (8), >= 1 */
    int scratchpad_mb;      /* LLAMA_POSTFETCH_SCRATCHPAD_MB (0: from the largest layer), >= 0 */
    bool dedicated_streams; /* LLAMA_POSTFETCH_USE_DEDICATED_STREAMS (1) */
    bool debug;             /* LLAMA_POSTFETCH_DEBUG (0) */
    bool force_gpu;         /* HOTMOE_POSTFETCH_FORCE (0): every cold D over PCIe */
} pf_config;

pf_config pf_config_default(void);
/* The defaults, then the environment's variables (unset or empty: the default). HM_ERR_ARG
 * naming the variable for a value that is not an integer, or out of range (flags 0 or 1,
 * MAX_TRANSFERS >= 1, SCRATCHPAD_MB >= 0). */
hm_status pf_config_from_env(pf_config *c, hm_error *err);

typedef struct pf_rates {
    double read_bytes_per_s;  /* the CPU's expert read rate */
    double h2d_bytes_per_s;   /* the copy lane's rate */
    double concurrency;       /* >= 1: host memory's reads and copies at once / reads alone */
    double gpu_d_s;           /* the GPU's time for one D product (launch included) */
} pf_rates;

/* One cold expert of the step. */
typedef struct {
    uint64_t gate_up_bytes; /* its gate and up rows */
    uint64_t down_bytes;    /* its D rows */
} pf_expert;

typedef enum {
    PF_WHY_CPU = 0,      /* D stays on the CPU: no gain (or post-fetch off) */
    PF_WHY_GAIN,         /* D over PCIe: T fell */
    PF_WHY_FORCED,       /* HOTMOE_POSTFETCH_FORCE */
    PF_WHY_CAP,          /* would gain, but MAX_TRANSFERS or the scratchpad was reached */
} pf_why;

typedef struct {
    int n_gpu;              /* experts whose D goes over PCIe */
    double t_cpu_only_s;    /* T(empty set) */
    double t_s;             /* T(S) */
    uint64_t copy_bytes;
} pf_decision;

/* Decides for ex[0..n): gpu[i] = 1 when expert i's D goes over PCIe, why[i] the cause (both
 * [n], caller's). HM_ERR_ARG for negative or non-finite rates or a concurrency < 1. */
hm_status pf_decide(const pf_config *c, const pf_rates *r, const pf_expert *ex, int n,
                    uint8_t *gpu, uint8_t *why, pf_decision *d, hm_error *err);

/* The seed's debug line for a layer: "[PF] layer L: N cold experts, K D over PCIe (X MiB),
 * T a -> b ms". Returns the length snprintf would need. */
size_t pf_format(const pf_decision *d, int layer, int n, char *buf, size_t cap);

#endif
