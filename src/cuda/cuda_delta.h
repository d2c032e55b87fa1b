/* cuda_delta.h - the gated delta net of the hybrid architectures (Qwen3-Next, Qwen3.5-MoE) on
 * the GPU: the device twin of the recurrent block between its input products and ssm_out in
 * cpu_engine_hybrid.c (docs/HYBRID.md).
 *
 * DESIGN: one launcher, three kernels, each token of a sequence after the one before it (the
 * CPU engine's order, for a prompt as for a decode step): the causal convolution + SiLU (a
 * thread per channel walks its run's tokens with the K-1 taps in registers), the q/k L2 norms
 * and q's 1/sqrt(dk) (a warp per head), and the delta rule with its gated RMS norm (a block per
 * value head and run, thread j holding column j of the head's [dk][dv] state in registers).
 * The operations are cpu/ops.h's, in their order, as IEEE single _rn intrinsics (the CPU
 * compiles with -ffp-contract=off), exp by cuda_math.cuh's twin of hm_expf: the same bytes as
 * the CPU engine's, except where softplus's double log1p/exp round differently (CUDA's double
 * functions against libm's). Runs: tokens of several sequences in one call, each run a span of
 * consecutive tokens of one sequence with its own state. Enqueue only: no allocation, no sync.
 * A run of CUDA_DELTA_CHUNK_MIN tokens or more (a prompt's) takes the chunked form of the delta
 * rule instead (cuda_delta.cu: chunks of 64 tokens, or 32 where the device's shared memory per
 * block is small; a block per head and 32 state columns), the same recurrence summed in another
 * order: within tolerance of the CPU's bytes, not equal to them nor to the same tokens one per
 * call. Decode steps and short runs keep the token-by-token kernel and its bytes.
 */
#ifndef HM_CUDA_CUDA_DELTA_H
#define HM_CUDA_CUDA_DELTA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/status.h"

typedef struct {
    int32_t t0, len, seq; /* tokens t0 .. t0 + len - 1 of the call, in order, of sequence seq */
} cuda_delta_run;

/* runs of at least this many tokens take the chunked form */
#define CUDA_DELTA_CHUNK_MIN 64

typedef struct {
    int nk, nv, dk, dv; /* key heads, value heads (a multiple of nk), their sizes; dk in {16, 32,
                           64, 128, 256}, dv <= 256 */
    int conv_k;         /* K, the convolution's width (2..8) */
    int v_tiled;        /* value head h reads key head h % nk (qwen35moe); else h / (nv / nk) */
    int ab_split;       /* b and a: [n_tok][nv] each, the a rows after all b rows (ssm_beta,
                           ssm_alpha); else per token and key head [b (r), a (r)] (ssm_ba) */
    float eps;          /* rms_eps: the q/k L2 norms' and the gated norm's */
    int64_t n_tok;
    int n_runs;
    int max_run;                  /* the longest run's length, as the host knows it (0: n_tok):
                                     below CUDA_DELTA_CHUNK_MIN no chunked launch at all */
    const cuda_delta_run *d_runs; /* [n_runs], device; together they cover the n_tok tokens */
    const float *conv_w;          /* [cd][K] (ssm_conv1d), cd = 2 nk dk + nv dv */
    const float *dt, *a;          /* [nv] each (ssm_dt, ssm_a) */
    const float *norm_w;          /* [dv] (ssm_norm) */
    float *state;                 /* sequence s at state + s * state_stride: the convolution's
                                     [K-1][cd] (oldest tap first), then [nv][dk][dv] */
    int64_t state_stride;         /* floats */
    float *qkv;                   /* [n_tok][cd]: in xn . ssm_qkv, out the convolution's output
                                     after SiLU, q and k L2-normed, q times 1/sqrt(dk) */
    const float *z;               /* [n_tok][nv dv] (xn . ssm_gate) */
    const float *ba;              /* see ab_split */
    float *out;                   /* [n_tok][nv dv]: rmsnorm(o) * norm_w * silu(z), per head */
} cuda_delta_args;

/* The recurrent block of one hybrid layer for a->n_tok tokens: states advanced. HM_ERR_ARG for
 * bad shapes or missing buffers, HM_ERR_CUDA (kernel named) for a failed launch. */
hm_status cuda_delta_net(const cuda_delta_args *a, void *stream, hm_error *err);

#ifdef __cplusplus
}
#endif

#endif
