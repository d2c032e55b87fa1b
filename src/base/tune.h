/* tune.h - CPU backend tuning constants.
 *
 * DESIGN: the numbers that benchmarks chose (or that trade speed against something), as plain
 * macros in one place, each with what it trades and where it is used; a constant changes here,
 * nowhere else. No build-time switches: an A/B experiment edits a value here on its own branch.
 */
#ifndef HM_BASE_TUNE_H
#define HM_BASE_TUNE_H

/* ---- matrix products (cpu/matmul.c, quant/quant_simd_common.h, quant/quant_x8_avx512.c) ---- */

/* Work items per thread of a product cut into equal chunks (mm_chunk_rows: the expert
 * products; the FFN's down items are cut from it). Fewer items: fewer cold stream starts; more:
 * a late or slow thread holds up the end of a stage less. 4 and 6 were no faster than 8 on the
 * 16-core host (bench/RESULTS.md, two-distance prefetch in the x8 kernels). */
#define HM_TUNE_MM_ITEMS_PER_THREAD 8
/* The dot tiles (quant_simd_*.h) prefetch the weight stream this many bytes ahead into L1:
 * without it a core cannot keep enough misses in flight (a 16-core matvec of 4-bit types stayed
 * near 0.65 of read bandwidth); 8 KiB gave no consistent gain. */
#define HM_TUNE_SIMD_PF_DIST 4096
/* The repacked-row kernels (quant_x8_avx512.c) prefetch the weight stream at two distances:
 * this many bytes ahead into L1, and HM_TUNE_X8_PF_L2 bytes ahead into L2 only (more misses in
 * flight than the L1 fill buffers allow). 2 KiB + 12 KiB streamed q4_K 8% faster than 4 KiB into
 * L1 alone on the 16-core host; 16 and 24 KiB for the second were no better. */
#define HM_TUNE_X8_PF_L1 2048
#define HM_TUNE_X8_PF_L2 12288

#endif
