/* bench_cuda_util.h - what the GPU benches share. Header-only (each bench is its own program);
 * include after cuda_runtime_api.h (and stdio.h, stdlib.h). The functions return 0 when a CUDA
 * call fails; CK(call) ends the bench with the call and CUDA's message. */
#ifndef HM_BENCH_CUDA_UTIL_H
#define HM_BENCH_CUDA_UTIL_H

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s: %s: %s\n", __FILE__, #call, cudaGetErrorString(e_));     \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

/* The ceiling: device-to-device cudaMemcpy of a 1 GiB buffer, best of reps (after one warm-up),
 * as bytes moved (read + write) per second, the usual HBM figure. */
static inline double bench_copy_gbs(int reps) {
    const size_t n = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess ||
        cudaMemset(a, 1, n) != cudaSuccess || cudaEventCreate(&e0) != cudaSuccess ||
        cudaEventCreate(&e1) != cudaSuccess)
        reps = -1;
    for (int r = 0; r < reps + 1; r++) {
        float ms = 0;
        if (cudaEventRecord(e0, 0) != cudaSuccess ||
            cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0) != cudaSuccess ||
            cudaEventRecord(e1, 0) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
            best = 0;
            break;
        }
        const double gbs = 2.0 * (double)n / (ms * 1e-3) / 1e9;
        if (r > 0 && gbs > best) best = gbs;
    }
    cudaFree(a);
    cudaFree(b);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return best;
}

/* Seconds of one replay of exec on st: the best of reps, after one warm-up replay. */
static inline double bench_graph_best_s(cudaGraphExec_t exec, cudaStream_t st, int reps) {
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) reps = -1;
    for (int r = 0; r < reps + 1; r++) {
        float ms = 0;
        if (cudaEventRecord(e0, st) != cudaSuccess || cudaGraphLaunch(exec, st) != cudaSuccess ||
            cudaEventRecord(e1, st) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
            best = 0;
            break;
        }
        if (r > 0 && (best == 0 || ms * 1e-3 < best)) best = ms * 1e-3;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return best;
}

#endif
