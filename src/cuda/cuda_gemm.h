/* cuda_gemm.h - prompt-sized (many-token) products of quantised weights with f32 activations on
 * the GPU's tensor cores, and the grouped Mixture-of-Experts variant with device-resident ids.
 *
 * DESIGN: y[t][r] = x[t] . W[r] for n_tok tokens at once. The f32 activations are converted to
 * f16 once per call into caller-provided scratch; each thread block then dequantises a tile of
 * weight rows into shared memory as f16 (quant_dequantize_row's float value, rounded to nearest
 * f16) and multiplies on the tensor cores with f32 accumulation (wmma 16x16x16). This is NOT the
 * canonical dot of docs/ARITHMETIC.md and is not bit-identical to cpu_matmul: it is for prompt
 * processing (n_tok > 8) where throughput matters; decode sizes use cuda_matvec (cuda_quant.h).
 * Tolerance (asserted by tests/cuda/test_cuda_gemm.c): |y - y_exact| <= 2e-3 * sum_i |w_i x_i|
 * per output (f16 rounding of both inputs: <= 2 * 2^-11 relative per product, plus f32
 * accumulation), and within k * 2^-24 of the same sum over the f16-rounded inputs.
 *
 * The grouped product sorts the (token, slot) pairs by expert ON THE DEVICE (count, prefix sum,
 * scatter: one small kernel, no host round trip) into a tile table, then one launch runs every
 * selected expert's tiles; the grid is sized for the worst case (cuda_gemm_moe_max_tiles) and
 * unused tiles exit at once, so the whole call is capturable into a CUDA graph. An id < 0 or
 * >= n_expert skips its slot (its y rows are not written): the device has no error path.
 *
 * Limits: k must be a positive multiple of 32 (and of the type's block size); w, x and scratch
 * must be 16-byte aligned (cudaMalloc and GGUF's 32-byte data alignment are); values beyond
 * f16's range (|v| > 65504) in activations or dequantised weights become infinities.
 * Launchers never synchronise, allocate or copy to the host; pointers are device pointers;
 * stream is a cudaStream_t (NULL: the default stream).
 */
#ifndef HM_CUDA_CUDA_GEMM_H
#define HM_CUDA_CUDA_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "quant/qtypes.h"

/* Tile geometry (host-side planning needs it). */
enum {
    CUDA_GEMM_TILE_TOK = 64,  /* tokens (or expert pairs) per thread block */
    CUDA_GEMM_TILE_ROWS = 64, /* weight rows per thread block */
    CUDA_GEMM_MAX_EXPERTS = 4096,
};

/* 1 if cuda_gemm handles the weight type (the 14 weight types of src/quant; not q8_K), else 0. */
static inline int cuda_gemm_supported(uint32_t wtype) {
    switch (wtype) {
    case HM_TYPE_F32: case HM_TYPE_F16: case HM_TYPE_BF16: case HM_TYPE_Q4_0:
    case HM_TYPE_Q4_1: case HM_TYPE_Q5_0: case HM_TYPE_Q5_1: case HM_TYPE_Q8_0:
    case HM_TYPE_MXFP4: case HM_TYPE_IQ4_NL: case HM_TYPE_Q4_K: case HM_TYPE_Q5_K:
    case HM_TYPE_Q6_K: case HM_TYPE_IQ4_XS: return 1;
    default: return 0;
    }
}

static inline size_t cuda_gemm_align_(size_t n) { return (n + 255) & ~(size_t)255; }

/* Bytes of scratch cuda_gemm needs: the f16 copy of x, [n_tok][k]. */
static inline size_t cuda_gemm_scratch_size(int64_t k, int64_t n_tok) {
    if (k <= 0 || n_tok <= 0) return 0;
    return cuda_gemm_align_((size_t)k * (size_t)n_tok * 2);
}

/* y[t][r] = sum_i W[r][i] * x[t][i] for r < n_rows, t < n_tok.
 *   w: [n_rows] rows of k elements of wtype (row size hm_row_size(wtype, k)), device;
 *   x: [n_tok][k] f32, device; y: [n_tok][n_rows] f32, device;
 *   scratch: device, >= cuda_gemm_scratch_size(k, n_tok) bytes.
 * HM_ERR_UNSUPPORTED for a type it lacks, HM_ERR_ARG for bad sizes or NULL pointers,
 * HM_ERR_CUDA (naming the kernel) when a launch fails. */
hm_status cuda_gemm(uint32_t wtype, const void *w, int64_t n_rows, int64_t k, const float *x,
                    int64_t n_tok, float *y, void *scratch, size_t scratch_size, void *stream,
                    hm_error *err);

/* Grouped expert product; fields as cpu_moe_args (src/cpu/matmul.h), all pointers on the
 * device. As for cuda_moe_args, ids index w: the engine passes device slots and n_slots. */
typedef struct {
    uint32_t wtype;
    const void *w;      /* [n_expert][n_rows] rows of k elements, contiguous */
    int64_t n_expert, n_rows, k;
    const float *x;     /* x_per_slot ? [n_tok][n_used][k] : [n_tok][k] */
    int x_per_slot;     /* 0: all slots of a token share x[t] (gate/up); 1: own input (down) */
    const int32_t *ids; /* [n_tok][n_used] selected experts; id < 0 or >= n_expert: skipped */
    int64_t n_tok;
    int n_used;
    float *y;           /* [n_tok][n_used][n_rows]; rows of skipped slots are not written */
    size_t w_stride;    /* bytes from one expert's matrix to the next (a multiple of 16); 0: the
                         * matrix's own bytes (n_rows rows, contiguous) */
} cuda_gemm_moe_args;

/* Upper bound on the number of (expert, token tile) tiles of a grouped product: each expert's
 * pairs fill whole tiles but one. */
static inline int64_t cuda_gemm_moe_max_tiles(int64_t n_pairs, int64_t n_expert) {
    if (n_pairs <= 0) return 0;
    return n_pairs / CUDA_GEMM_TILE_TOK + (n_expert < n_pairs ? n_expert : n_pairs);
}

/* Scratch of cuda_gemm_moe: f16 inputs [rows of x][k], the pairs sorted by expert [n_pairs],
 * the tile table (expert, first sorted pair, pair count) [max_tiles] x 3, the tile count. */
static inline size_t cuda_gemm_moe_scratch_size(const cuda_gemm_moe_args *a) {
    if (!a || a->k <= 0 || a->n_tok <= 0 || a->n_used <= 0) return 0;
    int64_t n_pairs = a->n_tok * a->n_used;
    int64_t x_rows = a->x_per_slot ? n_pairs : a->n_tok;
    int64_t tiles = cuda_gemm_moe_max_tiles(n_pairs, a->n_expert);
    return cuda_gemm_align_((size_t)x_rows * (size_t)a->k * 2) +
           cuda_gemm_align_((size_t)n_pairs * 4) + 3 * cuda_gemm_align_((size_t)tiles * 4) +
           cuda_gemm_align_(4);
}

/* y[t][s][r] = sum_i W[ids[t][s]][r][i] * x(t, s)[i]. n_expert must be <= CUDA_GEMM_MAX_EXPERTS.
 * Errors as cuda_gemm. */
hm_status cuda_gemm_moe(const cuda_gemm_moe_args *a, void *scratch, size_t scratch_size,
                        void *stream, hm_error *err);

#endif
