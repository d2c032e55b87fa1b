/* cuda_ops.cu - device elementwise ops, RMS norm, MoE bias/combine, routers and RoPE
 * (cuda_ops.h).
 *
 * DESIGN: one small kernel per op, launched on the caller's stream; elementwise kernels use a
 * grid-stride loop with one thread per element and the op as a template parameter (one body,
 * no per-op copies). Every float operation is the _rn intrinsic of the CPU's operation
 * (docs/OPS.md), exp/sigmoid/silu come from cuda_math.cuh (hm_expf's recipe), so each output
 * has the CPU's bits. Reductions keep the CPU's order: the RMS norm's 32 double chains are
 * the 32 lanes of a warp, combined by the CPU's halving tree (cm_rms_scale), the
 * router's softmax sum is one sequential chain per token; only max (exact in any order) is a
 * tree. Top-k is a rank computation (rank of e = experts ordered before it by (score desc,
 * id asc)), which equals the CPU's insertion list.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_launch.cuh"

extern "C" {
#include "cuda/cuda_ops.h"
}
#include "cuda/cuda_math.cuh"
#include "cuda/cuda_rope.cuh"
#include "cuda/cuda_router.cuh"

#define OPS_THREADS 256
#define OPS_MAX_BLOCKS 4096
#define ROUTER_MAX_EXPERTS 4096

static hm_status ops_launched(const char *kernel, hm_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "CUDA kernel %s: %s", kernel, cudaGetErrorString(e));
    return HM_OK;
}

static unsigned ops_blocks(int64_t n) {
    int64_t b = (n + OPS_THREADS - 1) / OPS_THREADS;
    if (b > OPS_MAX_BLOCKS) b = OPS_MAX_BLOCKS;
    if (b < 1) b = 1;
    return (unsigned)b;
}

/* ------------------------------------------------------------------ elementwise */

/* EW_GLU's kind: cpu/ops.h's CPU_GLU_* (cm_glu) */
enum { EW_ADD, EW_SCALE, EW_SILU, EW_SIGMOID, EW_GLU, EW_SOFTCAP };

template <int OP>
__global__ void ew_kernel(const float *a, const float *b, float *y, int64_t n, float s, float t,
                          int kind) {
    cu_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float r;
        if (OP == EW_ADD) r = __fadd_rn(a[i], b[i]);
        else if (OP == EW_SCALE) r = __fmul_rn(a[i], s);
        else if (OP == EW_SILU) r = cm_siluf(a[i]);
        else if (OP == EW_SIGMOID) r = cm_sigmoidf(a[i]);
        else if (OP == EW_GLU) r = cm_glu(kind, a[i], b[i], s, t);
        else r = __fmul_rn(s, tanhf(__fdiv_rn(a[i], s)));
        y[i] = r;
    }
}

template <int OP>
static hm_status ew_launch(const char *name, const float *a, const float *b, float *y, int64_t n,
                           float s, float t, void *stream, hm_error *err, int kind = 0) {
    if (n < 0) return hm_error_set(err, HM_ERR_ARG, "%s: negative length %lld", name, (long long)n);
    if (n == 0) return HM_OK;
    cu_launch(ew_kernel<OP>, ops_blocks(n), OPS_THREADS, 0, (cudaStream_t)stream, a, b, y, n, s, t,
              kind);
    return ops_launched(name, err);
}

extern "C" hm_status cuda_add(const float *a, const float *b, float *y, int64_t n, void *stream,
                              hm_error *err) {
    return ew_launch<EW_ADD>("cuda_add", a, b, y, n, 0, 0, stream, err);
}

extern "C" hm_status cuda_scale(const float *a, float s, float *y, int64_t n, void *stream,
                                hm_error *err) {
    return ew_launch<EW_SCALE>("cuda_scale", a, NULL, y, n, s, 0, stream, err);
}

extern "C" hm_status cuda_silu(const float *x, float *y, int64_t n, void *stream, hm_error *err) {
    return ew_launch<EW_SILU>("cuda_silu", x, NULL, y, n, 0, 0, stream, err);
}

extern "C" hm_status cuda_sigmoid(const float *x, float *y, int64_t n, void *stream,
                                  hm_error *err) {
    return ew_launch<EW_SIGMOID>("cuda_sigmoid", x, NULL, y, n, 0, 0, stream, err);
}

extern "C" hm_status cuda_swiglu(const float *gate, const float *up, float *out, int64_t n,
                                 void *stream, hm_error *err) {
    return ew_launch<EW_GLU>("cuda_swiglu", gate, up, out, n, 0, 0, stream, err, CPU_GLU_SILU);
}

extern "C" hm_status cuda_swiglu_oai(const float *gate, const float *up, float *out, int64_t n,
                                     float alpha, float limit, void *stream, hm_error *err) {
    return ew_launch<EW_GLU>("cuda_swiglu_oai", gate, up, out, n, alpha, limit, stream, err,
                             CPU_GLU_OAI);
}

extern "C" hm_status cuda_glu_act(int kind, const float *gate, const float *up, float *out,
                                  int64_t n, void *stream, hm_error *err) {
    if (kind != CPU_GLU_SILU && kind != CPU_GLU_OAI && kind != CPU_GLU_GELU)
        return hm_error_set(err, HM_ERR_ARG, "cuda_glu_act: unknown activation %d", kind);
    return ew_launch<EW_GLU>("cuda_glu_act", gate, up, out, n, 1.702f, 7.0f, stream, err, kind);
}

extern "C" hm_status cuda_softcap(float *x, float cap, int64_t n, void *stream, hm_error *err) {
    if (!(cap > 0.0f)) return hm_error_set(err, HM_ERR_ARG, "cuda_softcap: cap %g", (double)cap);
    return ew_launch<EW_SOFTCAP>("cuda_softcap", x, NULL, x, n, cap, 0, stream, err);
}

/* ------------------------------------------------------------------ row ops */

/* x[r][i] += b[i] */
__global__ void add_bias_kernel(float *x, const float *b, int64_t n_rows, int64_t n) {
    cu_pdl_enter();
    const int64_t total = n_rows * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], b[i % n]);
}

extern "C" hm_status cuda_add_bias(float *x, const float *b, int64_t n_rows, int64_t n,
                                   void *stream, hm_error *err) {
    if (n_rows < 0 || n < 0) return hm_error_set(err, HM_ERR_ARG, "cuda_add_bias: negative shape");
    if (n_rows == 0 || n == 0) return HM_OK;
    cu_launch(add_bias_kernel, ops_blocks(n_rows * n), OPS_THREADS, 0, (cudaStream_t)stream, x, b,
              n_rows, n);
    return ops_launched("add_bias_kernel", err);
}

/* y[row][i] += bias[ids[row]][i], row = t * n_used + s; ids outside [0, n_expert) skipped */
__global__ void moe_add_bias_kernel(float *y, const float *bias, const int32_t *ids,
                                    int64_t n_rows, int64_t n, int n_expert) {
    cu_pdl_enter();
    const int64_t total = n_rows * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int32_t e = ids[i / n];
        if (e < 0 || e >= n_expert) continue;
        y[i] = __fadd_rn(y[i], bias[(int64_t)e * n + i % n]);
    }
}

extern "C" hm_status cuda_moe_add_bias(float *y, const float *bias, const int32_t *d_ids,
                                       int64_t n_tok, int n_used, int64_t n, int n_expert,
                                       void *stream, hm_error *err) {
    if (n_tok < 0 || n_used < 0 || n < 0 || n_expert < 1 || !d_ids)
        return hm_error_set(err, HM_ERR_ARG, "cuda_moe_add_bias: bad shape or missing ids");
    const int64_t rows = n_tok * n_used;
    if (rows == 0 || n == 0) return HM_OK;
    cu_launch(moe_add_bias_kernel, ops_blocks(rows * n), OPS_THREADS, 0, (cudaStream_t)stream,
        y, bias, d_ids, rows, n, n_expert);
    return ops_launched("moe_add_bias_kernel", err);
}

/* out[t][i] = ((0 + w[t][0] * y[t][0][i]) + w[t][1] * y[t][1][i]) + ... in slot order */
__global__ void moe_combine_kernel(const float *y, const float *w, const int32_t *ids,
                                   int64_t n_tok, int n_used, int64_t n, float *out) {
    cu_pdl_enter();
    const int64_t total = n_tok * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / n, d = i % n;
        float acc = 0.0f;
        for (int s = 0; s < n_used; s++) {
            const int64_t ts = t * n_used + s;
            if (ids && ids[ts] < 0) continue;
            acc = __fadd_rn(acc, __fmul_rn(w[ts], y[ts * n + d]));
        }
        out[i] = acc;
    }
}

extern "C" hm_status cuda_moe_combine(const float *y, const float *w, const int32_t *d_ids,
                                      int64_t n_tok, int n_used, int64_t n, float *out,
                                      void *stream, hm_error *err) {
    if (n_tok < 0 || n_used < 0 || n < 0)
        return hm_error_set(err, HM_ERR_ARG, "cuda_moe_combine: negative shape");
    if (n_tok == 0 || n == 0) return HM_OK;
    cu_launch(moe_combine_kernel, ops_blocks(n_tok * n), OPS_THREADS, 0, (cudaStream_t)stream,
        y, w, d_ids, n_tok, n_used, n, out);
    return ops_launched("moe_combine_kernel", err);
}

/* out[t][i] = out[t][i] + sh[t][i] * sigmoid(gate[t]) */
__global__ void shexp_combine_kernel(float *out, const float *sh, const float *gate,
                                     int64_t n_tok, int64_t n) {
    cu_pdl_enter();
    const int64_t total = n_tok * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = cm_sigmoidf(gate[i / n]);
        out[i] = __fadd_rn(out[i], __fmul_rn(sh[i], g));
    }
}

extern "C" hm_status cuda_shexp_combine(float *out, const float *sh, const float *gate,
                                        int64_t n_tok, int64_t n, void *stream, hm_error *err) {
    if (n_tok < 0 || n < 0)
        return hm_error_set(err, HM_ERR_ARG, "cuda_shexp_combine: negative shape");
    if (n_tok == 0 || n == 0) return HM_OK;
    cu_launch(shexp_combine_kernel, ops_blocks(n_tok * n), OPS_THREADS, 0, (cudaStream_t)stream,
        out, sh, gate, n_tok, n);
    return ops_launched("shexp_combine_kernel", err);
}

/* One block per row: warp 0 computes the scale (cm_rms_scale), then every thread scales its
 * elements. */
__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, int64_t n, float eps) {
    cu_pdl_enter();
    const int64_t r = blockIdx.x;
    const float *xr = x + r * n;
    float *yr = y + r * n;
    const float s = cm_rms_scale_block(xr, n, eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = __fmul_rn(xr[i], s);
        yr[i] = w ? __fmul_rn(v, w[i]) : v;
    }
}

extern "C" hm_status cuda_rmsnorm(const float *x, const float *w, float *y, int64_t n_rows,
                                  int64_t n, float eps, void *stream, hm_error *err) {
    if (n_rows < 0 || n < 0 || n_rows > 0x7fffffff)
        return hm_error_set(err, HM_ERR_ARG, "cuda_rmsnorm: bad shape (%lld rows of %lld)",
                            (long long)n_rows, (long long)n);
    if (n_rows == 0 || n == 0) return HM_OK;
    cu_launch(rmsnorm_kernel, (unsigned)n_rows, OPS_THREADS, 0, (cudaStream_t)stream, x, w, y, n,
              eps);
    return ops_launched("rmsnorm_kernel", err);
}

/* ------------------------------------------------------------------ router */

/* One block per token: the scores into shared memory, then rt_select (cuda_router.cuh). The
 * expert->slot table is never written by a kernel: asked from L2 before the wait. */
__global__ void router_kernel(const float *logits, const float *bias, int n_expert, int k,
                              int mode, int renorm, int32_t *ids_out, float *w_out,
                              cuda_route_out o) {
    if (o.dslot && (int)threadIdx.x * 32 < n_expert) cu_prefetch_l2(o.slot_of + threadIdx.x * 32);
    cu_pdl_enter();
    __shared__ float sc[ROUTER_MAX_EXPERTS];
    __shared__ float red[OPS_THREADS / 32];
    const int64_t t = blockIdx.x;
    const float *l = logits + t * n_expert;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x)
        sc[e] = bias ? __fadd_rn(l[e], bias[e]) : l[e];
    __syncthreads();
    rt_select(sc, red, n_expert, k, mode, renorm, ids_out + t * k, w_out + t * k,
              o.dslot ? o.dslot + t * k : NULL, o.slot_of, o.hits);
    if (o.stat && t == 0 && threadIdx.x == 0) { /* the launch: one call of gridDim.x tokens */
        atomicAdd((unsigned long long *)o.stat, 1ull);
        atomicAdd((unsigned long long *)o.stat + 1, (unsigned long long)gridDim.x);
    }
}

extern "C" hm_status cuda_router(const float *logits, const float *bias, int64_t n_tok,
                                 int n_expert, int k, cpu_gate_mode mode, int renorm,
                                 int32_t *d_ids, float *d_weights, const cuda_route_out *out,
                                 void *stream, hm_error *err) {
    if (n_expert < 1 || n_expert > ROUTER_MAX_EXPERTS || k < 1 || k > n_expert)
        return hm_error_set(err, HM_ERR_ARG, "cuda_router: need 1 <= k (%d) <= n_expert (%d) <= %d",
                            k, n_expert, ROUTER_MAX_EXPERTS);
    if (mode != CPU_GATE_SOFTMAX_TOPK && mode != CPU_GATE_TOPK_SOFTMAX)
        return hm_error_set(err, HM_ERR_ARG, "cuda_router: unknown gating mode %d", (int)mode);
    if (n_tok < 0 || n_tok > 0x7fffffff)
        return hm_error_set(err, HM_ERR_ARG, "cuda_router: bad token count %lld", (long long)n_tok);
    cuda_route_out o;
    memset(&o, 0, sizeof(o));
    if (out) o = *out;
    if (!o.slot_of != !o.dslot || !o.hits != !o.stat)
        return hm_error_set(err, HM_ERR_ARG,
                            "cuda_router: slot_of and dslot come together, hits and stat too");
    if (n_tok == 0) return HM_OK;
    cu_launch(router_kernel, (unsigned)n_tok, OPS_THREADS, 0, (cudaStream_t)stream,
        logits, bias, n_expert, k, (int)mode, renorm, d_ids, d_weights, o);
    return ops_launched("router_kernel", err);
}

/* ------------------------------------------------------------------ RoPE */


/* grid (n_tok, n_head + n_head_kv); threads over pairs */
__global__ void rope_kernel(float *q, int n_head, float *k, int n_head_kv, int head_dim,
                            const int32_t *pos, const cr_consts rc) {
    cu_pdl_enter();
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    float *x = h < n_head ? q + (t * n_head + h) * head_dim
                          : k + (t * n_head_kv + (h - n_head)) * head_dim;
    const int32_t p = pos[t];
    for (int i = threadIdx.x; i < rc.n_pairs; i += blockDim.x) cr_rotate(rc, p, i, x);
}

extern "C" hm_status cuda_rope_qk(float *q, int n_head, float *k, int n_head_kv, int64_t n_tok,
                                  int head_dim, const int32_t *d_pos, const cuda_rope_args *a,
                                  void *stream, hm_error *err) {
    if (!a) return hm_error_set(err, HM_ERR_ARG, "cuda_rope: missing arguments");
    cr_consts rc;
    hm_status st = cr_prepare("cuda_rope", &a->p, head_dim, &rc, err);
    if (st != HM_OK) return st;
    if (n_tok < 0 || n_head < 0 || n_head_kv < 0 || n_tok > 0x7fffffff ||
        n_head + (k ? n_head_kv : 0) > 65535)
        return hm_error_set(err, HM_ERR_ARG, "cuda_rope: bad shape (%lld tokens, %d + %d heads)",
                            (long long)n_tok, n_head, n_head_kv);
    const int nh = n_head + (k ? n_head_kv : 0);
    if (n_tok == 0 || nh == 0) return HM_OK;
    if (a->d_table && a->n_table > 0) {
        rc.table = a->d_table;
        rc.n_table = a->n_table;
    }
    const int threads = rc.n_pairs < 128 ? ((rc.n_pairs + 31) / 32) * 32 : 128;
    cu_launch(rope_kernel, dim3((unsigned)n_tok, (unsigned)nh), threads, 0, (cudaStream_t)stream,
        q, n_head, k, n_head_kv, head_dim, d_pos, rc);
    return ops_launched("rope_kernel", err);
}

/* The CPU's own cos/sin: cpu_rope on rows of unit pairs (x0 = 1, x1 = 0) gives exactly
 * x0' = 1*c - 0*s = c and x1' = 1*s + 0*c = s (c is never zero; s is +0 only at angle 0). */
extern "C" hm_status cuda_rope_table_fill(const cpu_rope_params *p, int64_t n_pos, float *table,
                                          hm_error *err) {
    if (!p || !table || n_pos < 0 || n_pos > 0x7fffffff)
        return hm_error_set(err, HM_ERR_ARG, "cuda_rope_table_fill: bad arguments");
    const int nd = p->n_dims, np = nd / 2;
    const int64_t CHUNK = 1024;
    int32_t *pos = (int32_t *)malloc(CHUNK * sizeof(int32_t));
    float *row = (float *)malloc((size_t)(nd > 0 ? nd : 1) * sizeof(float));
    if (!pos || !row) {
        free(pos);
        free(row);
        return hm_error_set(err, HM_ERR_NOMEM, "cuda_rope_table_fill: out of memory");
    }
    hm_status st = HM_OK;
    for (int64_t p0 = 0; p0 < n_pos && st == HM_OK; p0 += CHUNK) {
        const int64_t cnt = n_pos - p0 < CHUNK ? n_pos - p0 : CHUNK;
        float *x = table + p0 * nd; /* [cnt][nd]: the table rows, used as the rope input */
        for (int64_t t = 0; t < cnt; t++) {
            pos[t] = (int32_t)(p0 + t);
            for (int i = 0; i < np; i++) {
                const int i0 = p->mode == CPU_ROPE_NEOX ? i : 2 * i;
                const int i1 = p->mode == CPU_ROPE_NEOX ? i + np : 2 * i + 1;
                x[t * nd + i0] = 1.0f;
                x[t * nd + i1] = 0.0f;
            }
        }
        st = cpu_rope(NULL, x, cnt, 1, nd, pos, p, err);
        if (st != HM_OK || p->mode != CPU_ROPE_NEOX) continue;
        for (int64_t t = 0; t < cnt; t++) { /* neox rows (c..., s...) -> (c, s) pairs */
            memcpy(row, x + t * nd, (size_t)nd * sizeof(float));
            for (int i = 0; i < np; i++) {
                x[t * nd + 2 * i] = row[i];
                x[t * nd + 2 * i + 1] = row[np + i];
            }
        }
    }
    free(pos);
    free(row);
    return st;
}
