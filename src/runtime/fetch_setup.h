/* fetch_setup.h - what a tiered context sets up at init so that prompt ubatches run the RAM
 * experts they use on the GPU (seed 003, docs/OFFLOAD.md): the pinned registration of the
 * experts' bytes, the copy lane and its staging buffers, the calibration, the engine's staging
 * layouts and the CPU side's decision rule.
 *
 * DESIGN: fetch_setup_open runs once, after hm_tiered_init and before the first step:
 *   offload_expert_span -> cuda_host_register (on failure the reason is logged and the lane
 *   stages) -> cuda_copy_lane_init(device, cap, reg) (cap 0 or a failure: no lane, every expert
 *   on the CPU) -> calib_run on the tiered worker's pool (cached per machine and model) ->
 *   calib_format appended to the placement report -> calib_layer_rates per layer ->
 *   cuda_engine_fetch_set(engine, the lane's buffers) -> hm_tiered_set_offload(rates,
 *   threshold, HOTMOE_SCHED_DEBUG). Only running out of memory is an error: a piece that cannot
 *   start leaves the experts to the CPU, said in the log and the report.
 * fetch_setup_close undoes it in reverse order: the engine's path off, the lane (waits for its
 * copies), the registration. The tiered object must be freed before (its worker uses the lane).
 */
#ifndef HM_RUNTIME_FETCH_SETUP_H
#define HM_RUNTIME_FETCH_SETUP_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"
#include "runtime/tiered.h"

struct cuda_engine;
struct cuda_host_reg;
struct cuda_copy_lane;

typedef struct {
    struct cuda_host_reg *reg;
    struct cuda_copy_lane *lane;
    size_t cap;      /* bytes of each of the lane's two staging buffers (0: no lane) */
    int n_eligible;  /* host layers whose prompt ubatches may run experts on the GPU */
} fetch_setup;

/* Bytes of a staging buffer holding every expert of the largest MoE layer (each part 256-byte
 * aligned, as the copy lane packs them); 0 for a model without experts. */
uint64_t fetch_setup_full_cap(const hm_model *m);
/* The size of each staging buffer for a model whose full cap is full: at most an eighth of the
 * VRAM the context may use (budget when it is set and below free, as on a card of that size;
 * else free), but at least FETCH_STAGING_MIN (a small model's layer whole even on a tiny
 * budget), and never more than full. */
#define FETCH_STAGING_MIN (64ull << 20)
uint64_t fetch_setup_staging(uint64_t full, uint64_t free, uint64_t budget);

/* See DESIGN. s is zeroed first. *report (malloc'd text, may be NULL) gets the calibration's
 * and the path's lines appended. HM_ERR_NOMEM only. */
hm_status fetch_setup_open(fetch_setup *s, const hm_model *m, struct cuda_engine *gpu,
                           hm_tiered *t, int device, size_t cap, int64_t threshold,
                           char **report, hm_error *err);
/* See DESIGN; a zeroed s is fine. */
void fetch_setup_close(fetch_setup *s, struct cuda_engine *gpu);

#endif
