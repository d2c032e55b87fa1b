/* bench_cuda_phases.c - what the shape of a one-token decode layer costs on the GPU, apart from
 * its arithmetic: a layer of dependent phases that stream weights (src/cuda/cuda_phases.h), run
 * as one kernel per phase (today's decode graph), as one persistent kernel with a grid barrier
 * between phases, the same prefetching each block's next slice into L2 before it waits, and as
 * one stream per layer (no phases: the ceiling).
 *
 *   bench_cuda_phases [--model qwen3|gpt-oss] [--blocks N] [--reps R]
 *
 * The phases are a decode layer's reads (KiB, bench/RESULTS.md's trace of the forged models):
 * qwen3-30b-a3b q4_k_m, 48 layers: norm 8, q/k/v 6,200, q/k norm 20, attention 300 (a context
 * of ~100), quantisation 16, o 4,700, router 1,000, gate/up 14,200, quantisation 8, down 8,700;
 * gpt-oss-20b mxfp4, 24 layers: norm 12, q/k/v 15,700, q/k norm 12, attention 100, quantisation
 * 16, o 12,500, router 370, gate/up 35,000, quantisation 12, down 17,600 (each rounded up to
 * whole 4 KiB pages). Every run is one CUDA graph replayed R times (best); prints µs per layer,
 * GB/s and the ratio to a device-to-device copy (read + write bytes) measured first.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_device.h"
#include "cuda/cuda_phases.h"

#ifndef HOTMOE_HAVE_CUDA
int main(void) {
    printf("bench_cuda_phases: built without CUDA\n");
    return 0;
}
#else
#include <cuda_runtime_api.h>

#include "bench_cuda_util.h"

/* best seconds of one run of every layer (a graph replayed reps times) */
static double time_mode(cuda_phases_mode mode, const cuda_phases_args *a, int reps) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaMemset(a->scratch, 0, cuda_phases_scratch_words() * sizeof(uint32_t)));
    hm_error err;
    hm_error_clear(&err);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    const hm_status s = cuda_phases_run(mode, a, st, &err);
    CK(cudaStreamEndCapture(st, &g));
    if (s != HM_OK) {
        fprintf(stderr, "bench_cuda_phases: %s\n", err.msg);
        exit(1);
    }
    CK(cudaGraphInstantiate(&ge, g, 0));
    const double best = bench_graph_best_s(ge, st, reps);
    if (best == 0) {
        fprintf(stderr, "bench_cuda_phases: a replay failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        exit(1);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(st));
    return best;
}

int main(int argc, char **argv) {
    const char *model = "qwen3";
    int reps = 10, blocks = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) blocks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cuda_phases [--model qwen3|gpt-oss] [--blocks N] [--reps R]\n");
            return 2;
        }
    }
    static const double kib_q3[] = {8, 6200, 20, 300, 16, 4700, 1000, 14200, 8, 8700};
    static const double kib_goss[] = {12, 15700, 12, 100, 16, 12500, 370, 35000, 12, 17600};
    const bool q3 = !strcmp(model, "qwen3");
    if (!q3 && strcmp(model, "gpt-oss")) {
        fprintf(stderr, "bench_cuda_phases: unknown model '%s' (qwen3, gpt-oss)\n", model);
        return 2;
    }
    int n_dev = 0;
    cuda_device_info info;
    hm_error err;
    if (cuda_device_query(&info, 1, &n_dev, &err) != HM_OK || n_dev == 0) {
        printf("bench_cuda_phases: no CUDA device\n");
        return 0;
    }
    cuda_phases_args a = {.n_phase = 10, .n_layer = q3 ? 48 : 24};
    size_t layer = 0;
    for (int p = 0; p < a.n_phase; p++) {
        const double kib = q3 ? kib_q3[p] : kib_goss[p];
        a.bytes[p] = ((size_t)(kib * 1024) + 4095) / 4096 * 4096;
        layer += a.bytes[p];
    }
    const int max = cuda_phases_max_blocks();
    if (blocks > max) {
        fprintf(stderr, "bench_cuda_phases: --blocks %d: at most %d blocks fit at once\n", blocks, max);
        return 2;
    }
    a.blocks = blocks > 0 ? blocks : (info.sm_count * 4 < max ? info.sm_count * 4 : max);
    uint8_t *w;
    CK(cudaMalloc((void **)&w, layer * (size_t)a.n_layer));
    CK(cudaMemset(w, 0x5a, layer * (size_t)a.n_layer));
    a.w = w;
    CK(cudaMalloc((void **)&a.scratch, cuda_phases_scratch_words() * sizeof(uint32_t)));
    const double copy = bench_copy_gbs(reps);
    printf("device: %s (%d SMs), %s layer: %d phases, %.2f MB, %d layers; copy %.1f GB/s; "
           "persistent: %d blocks (%d fit); best of %d\n\n",
           info.name, info.sm_count, model, a.n_phase, (double)layer / 1e6, a.n_layer, copy,
           a.blocks, max, reps);
    printf("| mode | us per layer | GB/s | ratio to copy |\n| --- | ---: | ---: | ---: |\n");
    static const char *const names[] = {"one kernel per phase (PDL)", "persistent, grid barrier",
                                        "persistent, barrier + L2 prefetch of the next slice",
                                        "one stream per layer (no phases)"};
    for (int m = 0; m < 4; m++) {
        const double t = time_mode((cuda_phases_mode)m, &a, reps) / a.n_layer;
        const double gbs = (double)layer / t / 1e9;
        printf("| %s | %.2f | %.1f | %.3f |\n", names[m], t * 1e6, gbs, gbs / copy);
    }
    CK(cudaFree(w));
    CK(cudaFree(a.scratch));
    return 0;
}
#endif
