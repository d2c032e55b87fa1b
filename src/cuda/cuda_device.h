/* cuda_device.h - which CUDA devices this process can use and how much memory they have.
 * Plain C; implemented in cuda_device.cu when the build has CUDA, and in cuda_none.c (which
 * reports zero devices) when it does not. */
#ifndef HM_CUDA_CUDA_DEVICE_H
#define HM_CUDA_CUDA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    char name[256];
    int cc_major, cc_minor; /* compute capability */
    uint64_t total_bytes;   /* device memory */
    uint64_t free_bytes;    /* free now, as the driver reports it */
    int sm_count;
} cuda_device_info;

/* Fills up to max entries and sets *n to the number of usable devices. A build without CUDA, or
 * a machine without a driver or GPU, gives *n = 0 and HM_OK: that is not an error, the CPU path
 * runs. Errors are for a driver that is present but fails. */
hm_status cuda_device_query(cuda_device_info *out, int max, int *n, hm_error *err);

/* 1 when the library was compiled with CUDA kernels, else 0. */
int cuda_compiled(void);

#endif
