/* bench_cuda_matvec.c - how close the GPU decode products come to the device's memory bandwidth.
 *
 *   bench_cuda_matvec [--reps R] [--types q4_K,q8_0,...] [--ntok N] [--json]
 *
 * 1. Ceiling: device-to-device cudaMemcpy of a 1 GiB buffer, best of R; reported as bytes moved
 *    (read + write) per second, the usual figure for HBM bandwidth.
 * 2. For each weight type, with n_tok activation rows (default 1, i.e. decode):
 *    - matvec 4096 x 4096 (k = 4096): cuda_matvec, cycling over enough copies of the matrix
 *      (>= 512 MiB in all) that no call finds its weights in the 50 MiB L2;
 *    - MoE down 2048 x 768 (rows x k), 128 experts, 8 selected per token: cuda_moe_matvec with
 *      a different random id set for every call (selected bytes only are counted);
 *    - MoE gate+up 768 x 2048, 128 experts, 8 selected: cuda_moe_gate_up (both matrices
 *      counted).
 *    Each case is captured in a CUDA graph of 32 calls (as the decode loop replays it) and the
 *    graph is replayed R times; GB/s = weight bytes read per call / time per call (activation
 *    quantisation not included: it is a separate, small kernel). ratio = GB/s / copy GB/s.
 * Weights are valid blocks (a few quantised random rows, repeated): values do not change speed.
 * Prints a markdown table (or JSON with --json). A build without CUDA prints "built without CUDA".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_device.h"
#include "cuda/cuda_quant.h"
#include "quant/quant.h"

#ifndef HOTMOE_HAVE_CUDA
int main(void) {
    printf("bench_cuda_matvec: built without CUDA\n");
    return 0;
}
#else
#include <cuda_runtime_api.h>

#include "bench_cuda_util.h"

#define CALLS 32 /* calls per captured graph */

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* device buffer of `rows` rows of type t, k elements: 16 quantised random rows repeated */
static void *dev_weights(uint32_t t, int64_t rows, int64_t k) {
    const size_t rs = hm_row_size(t, k);
    const int pat = 16;
    uint8_t *h = malloc(rs * pat);
    float *f = malloc((size_t)k * sizeof(float));
    for (int r = 0; r < pat; r++) {
        for (int64_t i = 0; i < k; i++) f[i] = (float)((double)(rnd() >> 11) * 0x1p-52 * 2.0 - 1.0);
        if (quant_quantize_row(t, f, h + (size_t)r * rs, k) != HM_OK) exit(1);
    }
    uint8_t *d;
    CK(cudaMalloc((void **)&d, rs * (size_t)rows));
    for (int64_t r = 0; r < rows; r += pat) {
        const int64_t n = rows - r < pat ? rows - r : pat;
        CK(cudaMemcpy(d + (size_t)r * rs, h, rs * (size_t)n, cudaMemcpyHostToDevice));
    }
    free(h);
    free(f);
    return d;
}

typedef enum { CASE_MATVEC, CASE_MOE_DOWN, CASE_MOE_GATE_UP } bench_case;
static const char *const k_case_name[] = {"matvec 4096x4096", "moe down 2048x768 (8/128)",
                                          "moe gate+up 768x2048 (8/128)"};

/* seconds per call (best of reps graph replays) and bytes read per call; 0 on failure */
static double run_case(bench_case c, uint32_t t, int ntok, int reps, double *bytes) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    hm_error err;
    hm_error_clear(&err);
    const int64_t n_exp = 128, n_used = 8;
    int64_t rows, k;
    if (c == CASE_MATVEC) rows = 4096, k = 4096;
    else if (c == CASE_MOE_DOWN) rows = 2048, k = 768;
    else rows = 768, k = 2048;
    const size_t rs = hm_row_size(t, k);
    void *w[64] = {0}, *w2 = NULL;
    int ncopies = 1;
    if (c == CASE_MATVEC) {
        const size_t mat = rs * (size_t)rows;
        ncopies = (int)(((size_t)512 << 20) / mat) + 1;
        if (ncopies > 64) ncopies = 64;
        for (int i = 0; i < ncopies; i++) w[i] = dev_weights(t, rows, k);
    } else {
        w[0] = dev_weights(t, n_exp * rows, k);
        if (c == CASE_MOE_GATE_UP) w2 = dev_weights(t, n_exp * rows, k);
    }
    /* activations: x_per_slot for down (ntok * n_used rows), else ntok rows */
    const int64_t nx = c == CASE_MOE_DOWN ? ntok * n_used : ntok;
    float *dx, *dy;
    void *dact;
    CK(cudaMalloc((void **)&dx, (size_t)(nx * k) * 4));
    CK(cudaMemset(dx, 0, (size_t)(nx * k) * 4));
    CK(cudaMalloc(&dact, cuda_act_row_bytes(t, k) * (size_t)nx + 4 * (size_t)(nx * k)));
    CK(cudaMalloc((void **)&dy, (size_t)(ntok * n_used * rows) * 4));
    if (cuda_quantize_act(t, dx, k, nx, dact, st, &err) != HM_OK) {
        fprintf(stderr, "bench_cuda_matvec: %s\n", err.msg);
        return 0;
    }
    /* CALLS id sets of ntok x n_used distinct experts each */
    int32_t *ids = malloc(sizeof(int32_t) * CALLS * ntok * n_used), *dids;
    for (int i = 0; i < CALLS * ntok; i++)
        for (int s = 0; s < n_used; s++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(rnd() % n_exp);
                dup = 0;
                for (int q = 0; q < s; q++) dup |= ids[i * n_used + q] == e;
            } while (dup);
            ids[i * n_used + s] = e;
        }
    CK(cudaMalloc((void **)&dids, sizeof(int32_t) * CALLS * ntok * n_used));
    CK(cudaMemcpy(dids, ids, sizeof(int32_t) * CALLS * ntok * n_used, cudaMemcpyHostToDevice));
    /* bytes: distinct experts selected per call (averaged over the CALLS sets) */
    double sel = 0;
    for (int call = 0; call < CALLS; call++) {
        char seen[128] = {0};
        for (int i = 0; i < ntok * n_used; i++) seen[ids[call * ntok * n_used + i]] = 1;
        for (int e = 0; e < 128; e++) sel += seen[e];
    }
    sel /= CALLS;
    *bytes = c == CASE_MATVEC ? (double)rs * (double)rows
           : (double)rs * (double)rows * sel * (c == CASE_MOE_GATE_UP ? 2.0 : 1.0);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    hm_status s = HM_OK;
    for (int call = 0; call < CALLS && s == HM_OK; call++) {
        const int32_t *cid = dids + (size_t)call * ntok * n_used;
        if (c == CASE_MATVEC) {
            s = cuda_matvec(t, w[call % ncopies], rows, k, dact, ntok, dy, st, &err);
        } else if (c == CASE_MOE_DOWN) {
            cuda_moe_args a = {.wtype = t, .w = w[0], .n_expert = n_exp, .n_rows = rows, .k = k,
                               .act = dact, .x_per_slot = 1, .ids = cid, .n_tok = ntok,
                               .n_used = (int)n_used, .y = dy};
            s = cuda_moe_matvec(&a, st, &err);
        } else {
            cuda_moe_gate_up_args a = {
                .gate = {.wtype = t, .w = w[0], .n_expert = n_exp, .n_rows = rows, .k = k,
                         .act = dact, .x_per_slot = 0, .ids = cid, .n_tok = ntok, .n_used = (int)n_used},
                .up_wtype = t, .up_w = w2, .glu = CUDA_GLU_SWIGLU, .out = dy};
            s = cuda_moe_gate_up(&a, st, &err);
        }
    }
    CK(cudaStreamEndCapture(st, &graph));
    if (s != HM_OK) {
        fprintf(stderr, "bench_cuda_matvec: %s\n", err.msg);
        return 0;
    }
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const double best = bench_graph_best_s(exec, st, reps) / CALLS;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    for (int i = 0; i < ncopies; i++) cudaFree(w[i]);
    cudaFree(w2);
    cudaFree(dx);
    cudaFree(dact);
    cudaFree(dy);
    cudaFree(dids);
    free(ids);
    cudaStreamDestroy(st);
    return best;
}

int main(int argc, char **argv) {
    int reps = 10, json = 0, ntok = 1;
    const char *types = "f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,q4_K,q5_K,q6_K,mxfp4,iq4_nl,iq4_xs";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--types") && i + 1 < argc) types = argv[++i];
        else if (!strcmp(a, "--ntok") && i + 1 < argc) ntok = atoi(argv[++i]);
        else if (!strcmp(a, "--json")) json = 1;
        else {
            fprintf(stderr, "usage: %s [--reps R] [--types a,b] [--ntok N] [--json]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || ntok < 1 || ntok > 64) {
        fprintf(stderr, "bench_cuda_matvec: bad argument (reps >= 1, 1 <= ntok <= 64)\n");
        return 2;
    }
    cuda_device_info dev[1];
    int ndev = 0;
    hm_error err;
    hm_error_clear(&err);
    if (cuda_device_query(dev, 1, &ndev, &err) != HM_OK || ndev < 1) {
        fprintf(stderr, "bench_cuda_matvec: no CUDA device%s%s\n", err.msg[0] ? ": " : "", err.msg);
        return 1;
    }
    const double copy = bench_copy_gbs(reps);
    if (json)
        printf("{\"device\": \"%s\", \"ntok\": %d, \"copy_gbs\": %.1f, \"cases\": [", dev[0].name, ntok, copy);
    else {
        printf("device: %s, n_tok %d, best of %d replays of a %d-call graph\n", dev[0].name, ntok, reps, CALLS);
        printf("device-to-device cudaMemcpy: %.1f GB/s (read + write bytes)\n\n", copy);
        printf("| case | type | MB read/call | us/call | GB/s | ratio to copy |\n| --- | --- | --- | --- | --- | --- |\n");
    }
    char list[512];
    snprintf(list, sizeof(list), "%s", types);
    int first = 1;
    for (int c = 0; c < 3; c++) {
        char buf[512];
        memcpy(buf, list, sizeof(buf));
        for (char *save = NULL, *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
            const int t = hm_type_from_name(name);
            if (t < 0 || cuda_act_row_bytes((uint32_t)t, 768) == 0) {
                fprintf(stderr, "bench_cuda_matvec: skipping unsupported type '%s'\n", name);
                continue;
            }
            double bytes = 0;
            const double sec = run_case((bench_case)c, (uint32_t)t, ntok, reps, &bytes);
            if (sec <= 0) return 1;
            const double gbs = bytes / sec / 1e9;
            if (json)
                printf("%s{\"case\": \"%s\", \"type\": \"%s\", \"bytes\": %.0f, \"us\": %.2f, \"gbs\": %.1f, \"ratio\": %.3f}",
                       first ? "" : ", ", k_case_name[c], name, bytes, sec * 1e6, gbs, gbs / copy);
            else
                printf("| %s | %s | %.2f | %.2f | %.1f | %.2f |\n", k_case_name[c], name, bytes / 1e6, sec * 1e6,
                       gbs, gbs / copy);
            fflush(stdout);
            first = 0;
        }
    }
    if (json) printf("]}\n");
    return 0;
}
#endif
