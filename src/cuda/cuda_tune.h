/* cuda_tune.h - the CUDA kernels' tuning constants that A/B runs on the GPU machine decided
 * (bench/device_ab.sh, figures in bench/RESULTS.md). Plain C; one place, no build-time
 * overrides: to try another value, change it here in a branch and compare the two builds.
 *
 * Only values that are pure tuning live here (any value gives the same bytes); shapes that the
 * arithmetic or a kernel's correctness depends on stay beside their kernel.
 */
#ifndef HM_CUDA_CUDA_TUNE_H
#define HM_CUDA_CUDA_TUNE_H

/* The one-token expert kernels (cuda_quant_moe.cuh): rows per warp. Gate/up: one row pair
 * (gate and up row r) per warp, +1.0% on gpt-oss against two and level on qwen3; down: two
 * plain rows per warp with their loads in flight together (one: level; four: -5% on qwen3,
 * fewer and longer CTAs). */
#define CUDA_TUNE_MOE_GU_ROWS 1
#define CUDA_TUNE_MOE_DOWN_ROWS 2
/* ... and rows per warp of the batched instance (a tile of up to 8 pairs of one expert). */
#define CUDA_TUNE_MOE_ROWS_PER_WARP 2

/* The fused router (cuda_fused_router.cu): expert rows (warps) per block. 2 was 6% slower on
 * qwen3, 8 level with 4. */
#define CUDA_TUNE_FR_WARPS 4

#endif
