/* gpu_lane.h - a GPU engine as a lane of a CPU context's expert executor.
 *
 *   cuda_engine *g; cuda_engine_init(m, &gp, &g, &err);     (the model's experts on the device)
 *   moe_exec *x = hm_context_exec(ctx);
 *   moe_exec_set_lane_fn(x, 1, runtime_gpu_lane, g, &err);
 *   moe_exec_set_lane(x, layer, expert, 1, &err);            (that expert now runs on the GPU)
 *
 * Each call is synchronous (cuda_engine_experts); the slots' outputs are the CPU's bytes, so
 * the logits do not change with the placement.
 */
#ifndef HM_RUNTIME_GPU_LANE_H
#define HM_RUNTIME_GPU_LANE_H

#include "moe/moe_exec.h"

/* moe_lane_fn; impl: the cuda_engine. */
hm_status runtime_gpu_lane(void *impl, const hm_model *m, const moe_job *job, hm_error *err);

#endif
