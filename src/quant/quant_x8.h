/* quant_x8.h - weight rows repacked by eights for a faster one-token product (CPU decode).
 *
 * DESIGN: the dot tiles of quant.h read a row's blocks one after another, so every block pays
 * its scale decoding, its horizontal sums and its float update alone, and a core computes a
 * q4_K matvec slower than memory delivers it (bench_dot, bench_matvec). Repacked, block b of 8
 * consecutive rows lies together (their fp16 factors, their scale bytes, and their quants
 * interleaved 4 bytes per row), so one 512-bit instruction works on the same elements of all 8
 * rows: the per-row sums land in 8 lanes and the float part is vertical, with no horizontal sum.
 * The arithmetic is docs/ARITHMETIC.md's, unchanged: exact integer partials per block, then
 * fmaf(d*da, s, acc[b % 32]) and fmaf(-(dmin*da), t, acc[b % 32]) and the halving tree, per
 * row — so results are bit-identical to quant_dot_ref on the original rows. The activation row
 * is the usual one (q8_K for q4_K): the interleave makes 8 of its bytes one 64-bit broadcast.
 *
 * Types: q4_K, q6_K (q8_K activations), mxfp4, q8_0 (q8_32). The AVX-512 kernels
 * (quant_x8_avx512.c) need F/BW/VL/DQ/VNNI and VBMI; elsewhere the reference path reads the
 * group directly (slow, same bits).
 *
 * Used by the CPU engine with -rtr/--repack (model_repack.c: a repacked copy of every q4_K,
 * q6_K, q8_0 and mxfp4 matrix; cpu_matmul_mat.x8 and cpu_moe_args.x8 take it for products of a few
 * tokens). Measured in bench/RESULTS.md (2026-11-23, from 8145156 on).
 */
#ifndef HM_QUANT_QUANT_X8_H
#define HM_QUANT_QUANT_X8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/threadpool.h"
#include "quant/quant.h"

enum { QUANT_X8_ROWS = 8 };

/* Whether wtype has a repacked form. */
bool quant_x8_supported(uint32_t wtype);
/* Whether quant_x8_dot runs the fast kernel on this CPU (else the reference). */
bool quant_x8_fast(void);
/* Bytes of 8 repacked rows of k elements (8 rows' bytes: repacking moves bytes, adds none);
 * 0 if unsupported or k is not a multiple of the block. */
size_t quant_x8_group_size(uint32_t wtype, int64_t k);
/* 8 rows (row r at rows + r * row_stride, k elements of wtype) into group. */
hm_status quant_x8_repack(uint32_t wtype, int64_t k, const void *rows, size_t row_stride,
                          void *group, hm_error *err);
/* A whole matrix: n_rows rows (a multiple of 8) into n_rows / 8 consecutive groups at dst,
 * shared out on pool (NULL: the calling thread). */
hm_status quant_x8_repack_rows(uint32_t wtype, int64_t k, const void *rows, size_t row_stride,
                               int64_t n_rows, void *dst, tp_pool *pool, hm_error *err);
/* The 8 rows back (for tests and the reference path). */
void quant_x8_unpack(uint32_t wtype, int64_t k, const void *group, void *rows, size_t row_stride);

/* out[t * 8 + r] = dot(row r of group, activation row t) for the 8 rows and n activation rows
 * (act + t * act_stride, k elements each in wtype's format, quant_act_for), each bit-identical
 * to quant_dot_ref. The q4_K, q8_0 and mxfp4 kernels load and decode each weight block once for
 * up to 4 activation rows (a prompt batch's products); q6_K's takes the rows one after another.
 * quant_x8_dot_get gives the kernel for wtype once per product (the fast one when
 * quant_x8_fast(), else the reference path; NULL if unsupported). */
typedef void (*quant_x8_dot_fn)(int64_t k, const void *group, const void *act, size_t act_stride,
                                int n, float *out);
quant_x8_dot_fn quant_x8_dot_get(uint32_t wtype);
/* The same for a given kernel table (the fast kernel when kern is the AVX-512 table and the CPU
 * has VBMI): no lookup of the environment, for callers that pick per product. */
quant_x8_dot_fn quant_x8_dot_for(uint32_t wtype, const quant_kernels *kern);

#endif
