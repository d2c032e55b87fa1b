/* gpu_lane.c - runtime_gpu_lane (gpu_lane.h). */
#include "runtime/gpu_lane.h"

#include "cuda/cuda_engine.h"

hm_status runtime_gpu_lane(void *impl, const hm_model *m, const moe_job *job, hm_error *err) {
    (void)m;
    if (job->n_tok > INT32_MAX)
        return hm_error_set(err, HM_ERR_RANGE, "GPU lane: %lld tokens", (long long)job->n_tok);
    return cuda_engine_experts(impl, job->layer, (int)job->n_tok, job->x, job->ids, job->y, err);
}
