/* cuda_attn.h - the device KV cache and attention over it (decode and prompt batches).
 *
 * DESIGN: the device cache of one layer is two plain arrays of f16 bits (K and V)
 * [n_ctx][n_head_kv][head_dim]; position p lives in row p (no ring: sliding-window layers
 * also keep n_ctx rows, the window only masks). Nothing tracks which rows are filled: the
 * engine stores a batch's rows (cuda_kv_store) before its attention, so every row a token can
 * see has been written. Positions come from device memory (d_pos [n_tok]), so one captured
 * graph serves every decode step.
 *
 * Attention is flash-attention style: a block takes a tile of query rows (tokens
 * x query heads of one kv head, GQA broadcast h / (n_head / n_head_kv)), walks the visible K/V
 * rows in tiles of 32 positions held in shared memory as f32, with an online softmax (running
 * max and denominator, rescaled per tile); one-token decode has its own kernel whose warps
 * own 32-position chunks for all heads of a kv group, and batches of more than one token with
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
 * Only f16 caches exist on the GPU (HM_TYPE_F16); q8_0 or f32 types give HM_ERR_UNSUPPORTED
 * with a message, and the engine falls back to the CPU.
 */
#ifndef HM_CUDA_CUDA_ATTN_H
#define HM_CUDA_CUDA_ATTN_H

#include <stddef.h>
#include <stdint.h>


#ifdef __cplusplus
extern "C" {
#endif

#include "base/status.h"

/* Checks that a KV cache of these types/shape can live on the GPU: type_k == type_v ==
 * HM_TYPE_F16, head_dim % 8 == 0 and <= 256, n_head_kv >= 1. HM_ERR_UNSUPPORTED names the type
 * ("q8_0 KV cache is not supported on the GPU (f16 only)") or the head_dim. */
hm_status cuda_kv_check(uint32_t type_k, uint32_t type_v, int n_head_kv, int head_dim,
                        hm_error *err);

/* Bytes of one layer's K (or V) array: n_ctx * n_head_kv * head_dim * 2. */
size_t cuda_kv_bytes(int64_t n_ctx, int n_head_kv, int head_dim);

/* Stores token t's k/v rows (f32 [n_tok][n_head_kv][head_dim], device) at row d_pos[t] of
 * k_cache/v_cache (f16 bits [n_ctx][n_head_kv][head_dim]), converted round-to-nearest-even
 * (the bytes cpu_kv_store writes for an f16 cache). A position outside [0, n_ctx) is not
 * stored (no device error path). */
hm_status cuda_kv_store(uint16_t *k_cache, uint16_t *v_cache, int64_t n_ctx, int n_head_kv,
                        int head_dim, const float *k, const float *v, int64_t n_tok,
                        const int32_t *d_pos, void *stream, hm_error *err);

typedef struct {
    int n_head, n_head_kv, head_dim;
    int64_t n_ctx;           /* rows of the cache */
    int64_t n_tok;           /* query tokens (a capture-time constant) */
    int64_t window;          /* > 0: sliding window; <= 0: full causal */
    float scale;             /* 0 = 1/sqrtf(head_dim) */
    const float *d_sinks;    /* [n_head] device, or NULL */
    const int32_t *d_pos;    /* [n_tok] device positions of the query tokens */
    const float *q;          /* [n_tok][n_head][head_dim] f32 device (roped) */
    const uint16_t *k_cache; /* [n_ctx][n_head_kv][head_dim] f16 bits */
    const uint16_t *v_cache; /* [n_ctx][n_head_kv][head_dim] f16 bits */
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
 * HM_ERR_ARG: bad shapes, n_head % n_head_kv, missing scratch; HM_ERR_UNSUPPORTED: head_dim;
 * HM_ERR_CUDA: launch failure (kernel named). */
hm_status cuda_attention(const cuda_attn_args *a, void *stream, hm_error *err);

#ifdef __cplusplus
}
#endif

#endif
