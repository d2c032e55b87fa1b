/* matmul_internal.h - what matmul.c (dense products) and matmul_moe.c (grouped expert
 * products) share: work-item sizes, the kernel call over a chunk of rows, the repacked path. */
#ifndef HM_CPU_MATMUL_INTERNAL_H
#define HM_CPU_MATMUL_INTERNAL_H

#include "base/tune.h"
#include "cpu/matmul.h"

enum { MM_MAX_CHUNK = 256 }; /* rows of a work item at most */
enum { MM_NR = 16, MM_TOK_TILE = 16, MM_ROW_ALIGN = QUANT_X8_ROWS };

/* A repacked copy (quant_x8.h) serves every product of its matrix, batches too (the multi-row
 * kernels, MM_TOK_TILE activation rows at a time). An expert's gate and up products go row group
 * by row group together (their two streams advancing at once) for at most this many pairs (a
 * few tokens); more go product by product. */
enum { MM_X8_PAIR_MAX = 4 };

/* Activations of at most this many elements are quantised by the calling thread before the
 * job starts (a decode step's one row, or its n_used expert rows): cheaper than the barrier
 * that a parallel quantisation phase needs. */
enum { MM_INLINE_ACT = 16384 };

typedef cpu_matmul_kern mm_kern;

/* The kernels of one weight type and row length; fails on an unsupported type or length. */
hm_status mm_kern_init(const quant_kernels *kern, uint32_t wtype, int64_t k, mm_kern *mk,
                       hm_error *err);
/* kern, or the best table when NULL. */
const quant_kernels *mm_default_kern(const quant_kernels *kern);
/* Rows [r0, r1) of w against nc activation rows: out[c * ostride + (r - r0)]. */
void mm_rows(const mm_kern *mk, const uint8_t *w, int64_t r0, int64_t r1, const uint8_t *act,
             int64_t nc, float *out, size_t ostride);
/* The same from the repacked copy x8 of w (r0, r1 whole groups of 8), with quant_x8's kernel:
 * activation row c at act + c * astride, its outputs at out + (slots ? slots[c] : c) * ostride,
 * indexed by the absolute row r. */
void mm_rows_x8(quant_x8_dot_fn x8dot, const mm_kern *mk, const uint8_t *x8, int64_t r0,
                int64_t r1, const uint8_t *act, size_t astride, int64_t nc, float *out,
                size_t ostride, const int32_t *slots);
/* quant_x8's kernel for a product over n_rows rows of wtype with a repacked copy x8, or NULL
 * when the dot tiles serve (no copy, rows not in groups of 8). */
quant_x8_dot_fn mm_x8_pick(const quant_kernels *kern, const void *x8, uint32_t wtype, int64_t n_rows);
/* Rows of a work item when total_rows are shared by nth threads, HM_TUNE_MM_ITEMS_PER_THREAD
 * items each. */
int64_t mm_chunk_rows(int64_t total_rows, int nth);
/* bytes at w into the calling core's L2 (prefetcht1), in order, until the gate opens (a stage's
 * gate prefetch); false when it opened first. */
bool mm_prefetch_until(const uint8_t *w, size_t bytes, const tp_gate *gate);

#endif
