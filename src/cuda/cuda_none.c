/* cuda_none.c - the CUDA device API for builds without CUDA: no devices, the CPU path runs. */
#include "cuda/cuda_device.h"

int cuda_compiled(void) { return 0; }

hm_status cuda_device_query(cuda_device_info *out, int max, int *n, hm_error *err) {
    (void)out;
    (void)max;
    (void)err;
    *n = 0;
    return HM_OK;
}
