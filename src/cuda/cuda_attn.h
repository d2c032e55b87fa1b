/* cuda_attn.h - the device KV cache and attention over it (decode and prompt batches).
 *
 * DESIGN: the device cache of one layer is two plain arrays (K and V) [n_ctx][n_head_kv][head_dim]
 * of f16 bits (the default) or of f32 (-ctk f32 -ctv f32: the values exactly as computed, the
 * CPU's f32 cache); position p lives in row p (no ring: sliding-window layers
 * also keep n_ctx rows, the window only masks). Nothing tracks which rows are filled: the
 * engine stores a batch's rows (cuda_kv_store) before its attention, so every row a token can
 * see has been written. Positions come from device memory (d_pos [n_tok]), so one captured
 * graph serves every decode step.
 *
 * Attention is flash-attention style: a block takes a tile of query rows (tokens
 * x query heads of one kv head, GQA broadcast h / (n_head / n_head_kv)), walks the visible K/V
 * rows in tiles of 32 positions held in shared memory as f32, with an online softmax (running
 * max and denominator, rescaled per tile); one-token decode (head_dim 64, 128 or 256) has its
 * own kernel whose warps own 32-position chunks for all heads of a kv group, and batches of more than one token with
 * head_dim 64 or 128 run the same tiling on tensor cores (cuda_attn_mma.cu). Decode-sized
 * batches also split the visible range across blocks (flash-decoding): the host fixes the most splits from n_ctx and
 * n_tok, the kernel uses one part per 32 visible positions up to that (read from d_pos), and
 * the last part to finish merges the partial (max, sum, acc) triples with the sinks (a
 * counter per tile in the scratch). Masking: token t at position
 * p = d_pos[t] sees q with p - window < q <= p (window <= 0: all q <= p), like cpu_attention.
 * gpt-oss sinks join the maximum and the denominator. Scores are (q.k) * scale.
 *
 * Numerics: not bit-identical to cpu_attention (different summation order: per-split online
 * softmax, single-accumulator dot products); tests/cuda/test_cuda_attn.c measures
 * max |gpu - cpu| / std(cpu output) per call and requires it <= 1e-4 (it prints the worst
 * value per case).
 *
 * Cache types: K and V both f16 or both f32 (a mixed pair, bf16 and q8_0 give
 * HM_ERR_UNSUPPORTED with a message, and the engine falls back to the CPU). One kernel of each
 * kind serves both types (a template on the element type: only the loads and the store's
 * conversion differ, the arithmetic is the same f32 code), except the tensor-core prompt kernel,
 * which takes f16 rows as its mma operands: with an f32 cache prompt batches run attn_kernel
 * (CUDA cores, f32 K/V: no rounding of the cache at all). The f16 path is unchanged by this.
 */
#ifndef HM_CUDA_CUDA_ATTN_H
#define HM_CUDA_CUDA_ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>


#ifdef __cplusplus
extern "C" {
#endif

#include "base/status.h"

/* Checks that a KV cache of these types/shape can live on the GPU: type_k == type_v, both
 * HM_TYPE_F16 or both HM_TYPE_F32; head_dim % 8 == 0 and <= 512, n_head_kv >= 1.
 * HM_ERR_UNSUPPORTED names the type ("q8_0 KV cache (K) is not supported on the GPU (f16 or
 * f32)"), the mixed pair ("f32 K with f16 V: the GPU needs one type for K and V") or the
 * head_dim. */
hm_status cuda_kv_check(uint32_t type_k, uint32_t type_v, int n_head_kv, int head_dim,
                        hm_error *err);

/* Bytes of one layer's K (or V) array of this type: n_ctx * n_head_kv * head_dim * (2 for
 * HM_TYPE_F16, 4 for HM_TYPE_F32); 0 for any other type or a non-positive size. */
size_t cuda_kv_bytes(uint32_t type, int64_t n_ctx, int n_head_kv, int head_dim);

/* Stores token t's k/v rows (f32 [n_tok][n_head_kv][head_dim], device) at row d_pos[t] of
 * k_cache/v_cache ([n_ctx][n_head_kv][head_dim] of `type`): HM_TYPE_F16 converted
 * round-to-nearest-even (f16 bits), HM_TYPE_F32 copied; the bytes cpu_kv_store writes for a
 * cache of that type. A position outside [0, n_ctx) is not stored (no device error path).
 * HM_ERR_ARG: bad shape, missing positions; HM_ERR_UNSUPPORTED: another type. */
hm_status cuda_kv_store(uint32_t type, void *k_cache, void *v_cache, int64_t n_ctx,
                        int n_head_kv, int head_dim, const float *k, const float *v,
                        int64_t n_tok, const int32_t *d_pos, void *stream, hm_error *err);

/* cuda_kv_store into caches of several sequences, each of n_ctx rows: token t's rows at row
 * d_base[t] + d_pos[t] (d_base: device, the first row of t's sequence); a position outside
 * [0, n_ctx) is not stored. The bytes cuda_kv_store writes into that sequence's rows. */
hm_status cuda_kv_store_seqs(uint32_t type, void *k_cache, void *v_cache, int64_t n_ctx,
                             int n_head_kv, int head_dim, const float *k, const float *v,
                             int64_t n_tok, const int32_t *d_pos, const int32_t *d_base,
                             void *stream, hm_error *err);

typedef struct {
    int n_head, n_head_kv, head_dim;
    int64_t n_ctx;           /* rows of the cache */
    int64_t n_tok;           /* query tokens (a capture-time constant) */
    int64_t window;          /* > 0: sliding window; <= 0: full causal */
    float scale;             /* 0 = 1/sqrtf(head_dim) */
    const float *d_sinks;    /* [n_head] device, or NULL */
    const int32_t *d_pos;    /* [n_tok] device positions of the query tokens */
    const float *q;          /* [n_tok][n_head][head_dim] f32 device (roped) */
    const void *k_cache;     /* [n_ctx][n_head_kv][head_dim] f16 bits, or f32 (kv_f32) */
    const void *v_cache;     /* [n_ctx][n_head_kv][head_dim] as k_cache */
    int kv_f32;              /* 1: both caches hold f32 (HM_TYPE_F32); 0: f16 bits (a flag, not
                                a type, so that zeroed arguments keep meaning f16:
                                HM_TYPE_F32 is 0) */
    float *out;              /* [n_tok][n_head][head_dim] f32 device */
    void *scratch;           /* cuda_attention_scratch_size bytes of device memory (or NULL
                                when that size is 0), zeroed once before the first call (its
                                tile counters are left at zero by every call) */
} cuda_attn_args;

/* Device scratch cuda_attention needs for these shapes (0 when the batch is not split: batches
 * that already give >= 132 blocks, e.g. 512 tokens of 32 heads / 4 kv heads). Depends on
 * n_head, n_head_kv, head_dim, n_ctx and n_tok only. */
size_t cuda_attention_scratch_size(const cuda_attn_args *a);

/* Enqueues attention for n_tok query tokens against the cache (their own rows must already be
 * stored). Positions >= n_ctx are clamped to n_ctx - 1 for reading, a negative position
 * gives unspecified output rows (no device error path). k_cache/v_cache must be 16-byte
 * aligned (rows are read as 16-byte vectors; head_dim % 8 == 0 keeps every row aligned).
 * kv_f32: the same kernels read f32 rows; prompt batches take the CUDA-core kernel, never the
 * tensor cores (f16 operands).
 * HM_ERR_ARG: bad shapes, n_head % n_head_kv, missing scratch; HM_ERR_UNSUPPORTED: head_dim;
 * HM_ERR_CUDA: launch failure (kernel named). */
hm_status cuda_attention(const cuda_attn_args *a, void *stream, hm_error *err);

/* a->n_tok tokens of different sequences, one query each, in as few launches as the tile
 * counters allow: token t (q and out row t, position d_pos[t]) reads the a->n_ctx rows of its
 * sequence, which start at row d_base[t] (device) of k_cache/v_cache. Each output row is the
 * bytes cuda_attention gives for that token alone (n_tok 1) with the caches starting at that
 * row. Only the one-token kernel's shapes (cuda_attention_runs_fit, else
 * HM_ERR_UNSUPPORTED); scratch: cuda_attention_runs_scratch_size bytes, zeroed once. */
bool cuda_attention_runs_fit(const cuda_attn_args *a);
size_t cuda_attention_runs_scratch_size(const cuda_attn_args *a);
hm_status cuda_attention_runs(const cuda_attn_args *a, const int32_t *d_base, void *stream,
                              hm_error *err);

#ifdef __cplusplus
}
#endif

#endif
