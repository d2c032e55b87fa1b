/* placement.h - the placement planner: which tensors of a model live in VRAM and which in RAM.
 *
 * DESIGN: moe_placement_plan turns llama.cpp's placement flags (-ngl, --cpu-moe, --n-cpu-moe,
 * -ot) and a VRAM budget into data: one tier (host or device) per tensor of the model, where
 * each layer's attention runs (its KV cache follows it), the residency map of the routed
 * experts (model/residency.h) and the byte totals per tier. It is pure planning: no CUDA, no
 * allocation on a device, no engine; the caller gives the free VRAM and what the GPU engine
 * needs besides weights (KV bytes per GPU layer, scratch) as numbers. Execution of a tiered
 * plan is a later step; nothing reads a plan yet except its report.
 *
 * Each tensor's tier is decided by the first rule that applies, in this order:
 *   1. -ot overrides, in the order given: the first REGEX (POSIX extended, searched anywhere in
 *      the GGUF tensor name, as llama.cpp's std::regex_search) that matches names the tier;
 *   2. --cpu-moe (every layer) and --n-cpu-moe N (layers [0, N)): routed expert tensors
 *      (blk.L.ffn_{gate,up,down}_exps.{weight,bias}) go to the host, as llama.cpp's
 *      overrides "\.ffn_(up|down|gate)_exps" and "blk\.L\.ffn_(up|down|gate)_exps";
 *   3. -ngl N as current llama.cpp counts it (docs/PLACEMENT.md): the output layer
 *      (output.weight, output_norm.weight) and the repeating layers form n_layer + 1 units
 *      [0, n_layer], the output being unit n_layer; units >= max(n_layer + 1 - N, 0) are on the
 *      device, so N >= 1 puts the output on the device, then the last N - 1 layers; N > n_layer
 *      puts everything there. token_embd.weight is on the device only when everything is
 *      (llama.cpp keeps it on the host always; hotmoe's full-GPU engine reads it on the device
 *      for its autonomous decode).
 * A layer's attention (attn_norm, q/k/v/o and their biases and norms, sinks) runs on the
 * device when all its attention tensors are there; the KV bytes of such layers count as
 * device memory. A layer's routed experts have device slots (slot = expert id) when all its
 * routed expert tensors are on the device; otherwise they are host-only (home HM_HOME_HOST
 * always: the mapped file stays their home).
 *
 * Fitting: device total = device weights + device KV + scratch (scratch only when anything is
 * on the device); the budget is vram_budget, or vram_free when vram_budget is 0 (and never more
 * than vram_free when that is known). When the options are only -ngl with N > n_layer (the
 * whole model) and it does not fit, the planner picks a tiered plan instead: first every routed
 * expert in RAM (--cpu-moe), then, if that is still too big, fewer GPU layers (N from n_layer
 * down to 0), and the plan's choice and report say so. With gpu_strict it refuses instead
 * (HM_ERR_NOMEM naming what is needed and the budget), and so it does for any plan that does
 * not fit; without gpu_strict an explicit plan that does not fit is returned with fits false.
 *
 *   moe_placement_options o = moe_placement_default_options();
 *   o.n_gpu_layers = 99; o.vram_free = free_bytes; o.kv_bytes_per_layer = kv; o.scratch_bytes = s;
 *   moe_placement p;
 *   if (moe_placement_plan(model, &o, &p, &err) != HM_OK) { puts(err.msg); ... }
 *   char *text = moe_placement_report(&p); ... free(text);
 *   moe_placement_free(&p);
 */
#ifndef HM_MOE_PLACEMENT_H
#define HM_MOE_PLACEMENT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"
#include "model/residency.h"

typedef enum { MOE_TIER_HOST = 0, MOE_TIER_DEVICE = 1 } moe_tier;

/* What a tensor is, for grouping and for the rules above. */
typedef enum {
    MOE_TENSOR_INPUT = 0, /* token_embd.weight */
    MOE_TENSOR_OUTPUT,    /* output.weight, output_norm.weight */
    MOE_TENSOR_ATTN,      /* a layer's attention tensors */
    MOE_TENSOR_EXPERTS,   /* a layer's routed expert tensors (and their biases) */
    MOE_TENSOR_LAYER,     /* the rest of a layer: ffn norm, router, shared expert */
} moe_tensor_kind;

/* Which rule decided a tensor's tier. */
typedef enum {
    MOE_WHY_NGL = 0,   /* -ngl (the tensor's layer or the output unit) */
    MOE_WHY_OVERRIDE,  /* an -ot override (override index in moe_placement_tensor) */
    MOE_WHY_CPU_MOE,   /* --cpu-moe */
    MOE_WHY_N_CPU_MOE, /* --n-cpu-moe */
} moe_why;

/* How the plan came about. */
typedef enum {
    MOE_PLAN_AS_ASKED = 0,   /* the options as given */
    MOE_PLAN_AUTO_N_CPU_MOE, /* -ngl N > n_layer did not fit: the experts of the fewest first
                                layers in RAM that fits (as --n-cpu-moe K, K < n_layer) */
    MOE_PLAN_AUTO_CPU_MOE,   /* ... only every routed expert in RAM fits (as --cpu-moe) */
    MOE_PLAN_AUTO_FEWER_LAYERS, /* ... and still too big: --cpu-moe with fewer GPU layers */
} moe_plan_choice;

typedef struct {
    int n_gpu_layers;            /* -ngl N (>= 0; 0 = everything on the host) */
    bool cpu_moe;                /* --cpu-moe */
    int n_cpu_moe;               /* --n-cpu-moe N (>= 0) */
    const char *overrides;       /* -ot "REGEX=DEVICE[,REGEX=DEVICE...]" (DEVICE: CPU or
                                    CUDA0), or NULL */
    uint64_t vram_budget;        /* bytes the plan may use on the device; 0 = vram_free */
    uint64_t vram_free;          /* free device memory as the caller measured it (0: unknown) */
    uint64_t kv_bytes_per_layer; /* device KV bytes of one layer whose attention is there */
    uint64_t scratch_bytes;      /* device buffers of the engine besides weights and KV */
    uint64_t tier_scratch_bytes; /* more buffers a plan with experts in RAM needs (the fetched
                                    experts' staging): added to scratch_bytes by the automatic
                                    choices (the caller adds it itself when it asks for one) */
    bool gpu_strict;             /* --gpu-strict: refuse rather than plan a tier that fits */
} moe_placement_options;

typedef struct {
    const char *name;     /* GGUF name (points into the model) */
    int layer;            /* -1 for token_embd, output, output_norm */
    moe_tensor_kind kind;
    uint64_t bytes;       /* the tensor's data bytes as the engines read them */
    moe_tier tier;
    moe_why why;
    int override_index;   /* index into moe_placement.overrides when why is MOE_WHY_OVERRIDE,
                             else -1 */
} moe_placement_tensor;

typedef struct {
    char *text;           /* "REGEX=DEVICE" as given */
    char *pattern;        /* REGEX */
    moe_tier tier;
    int n_tensors;        /* tensors this override decided (first match) */
    uint64_t bytes;       /* their bytes */
} moe_placement_override;

typedef struct {
    int n_tensor;
    moe_placement_tensor *tensors; /* [n_tensor]: token_embd, output_norm, output, then every
                                      layer's tensors in layer order */
    int n_layer;
    bool *attn_device;             /* [n_layer] the layer's attention runs on the device */
    hm_residency res;              /* the routed experts: HM_HOME_HOST everywhere, plus a device
                                      slot (= expert id) in layers whose experts are on it */
    int n_override;
    moe_placement_override *overrides;

    moe_plan_choice choice;
    int n_gpu_layers;              /* the -ngl the plan uses (the asked one unless automatic) */
    bool cpu_moe;                  /* every routed expert sent to the host (asked or automatic) */
    int n_cpu_moe;                 /* as asked, or the automatic choice's K */
    bool tier_scratch;             /* the automatic choice counted tier_scratch_bytes in
                                      device_scratch (the caller allocates that staging) */
    bool gpu_strict;

    uint64_t device_weights;       /* bytes of the tensors on the device */
    uint64_t device_kv;            /* kv_bytes_per_layer x layers with attention on it */
    uint64_t device_scratch;       /* scratch_bytes when anything is on the device, else 0 */
    uint64_t device_total;         /* the three above */
    uint64_t host_experts;         /* bytes of routed expert tensors on the host */
    uint64_t host_other;           /* bytes of every other tensor on the host */
    uint64_t budget;               /* device bytes allowed */
    bool fits;                     /* device_total <= budget */
    uint64_t asked_device_total;   /* device_total of the options as given (differs when the
                                      choice is automatic) */
} moe_placement;

moe_placement_options moe_placement_default_options(void);

/* Plans the placement of m under o into *out (zeroed first; on failure nothing to free,
 * though moe_placement_free is harmless). Errors: HM_ERR_ARG for a negative n_gpu_layers or
 * n_cpu_moe and for a bad -ot ("-ot 'X': ..." naming the item: no '=', empty regex, a regex
 * regcomp refuses with its message, an unknown device with the known ones); HM_ERR_NOMEM under
 * gpu_strict when the plan does not fit ("... needs N bytes of VRAM (weights + KV + scratch),
 * the budget is B bytes ..."), or when memory runs out. */
hm_status moe_placement_plan(const hm_model *m, const moe_placement_options *o,
                             moe_placement *out, hm_error *err);
void moe_placement_free(moe_placement *p);

/* The plan as one block of text (malloc'd; NULL when out of memory): bytes per tier and the
 * budget, how the plan came about, then what lives where grouped by layer ranges, with the
 * rule that put it there. */
char *moe_placement_report(const moe_placement *p);

#endif
