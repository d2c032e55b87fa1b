/* Device enumeration: never an error on a machine without a GPU (the program then reports
 * itself skipped: the device checks did not run); with HOTMOE_EXPECT_GPU=1 (set on the GPU
 * machine) a CUDA build must find a device with memory and a compute capability. */
#include <stdlib.h>

#include "cuda/cuda_device.h"
#include "cuda_test_util.h"
#include "harness.h"

static void test_query(void) {
    cuda_device_info devs[8];
    int n = -1;
    hm_error err;
    hm_error_clear(&err);
    HM_CHECK_MSG(cuda_device_query(devs, 8, &n, &err) == HM_OK, "%s", err.msg);
    HM_CHECK(n >= 0 && n <= 8);
    if (!cuda_compiled()) HM_CHECK(n == 0);
    for (int i = 0; i < n; i++) {
        HM_CHECK(devs[i].total_bytes > 0);
        HM_CHECK(devs[i].free_bytes <= devs[i].total_bytes);
        HM_CHECK(devs[i].cc_major >= 5);
        HM_CHECK(devs[i].name[0] != '\0');
    }
    const char *expect = getenv("HOTMOE_EXPECT_GPU");
    if (expect && expect[0] == '1') {
        HM_CHECK_MSG(cuda_compiled(), "HOTMOE_EXPECT_GPU=1 but the build has no CUDA");
        HM_CHECK_MSG(n >= 1, "HOTMOE_EXPECT_GPU=1 but no device was found");
    }
}

TU_TEST_MAIN(test_query)
