/* cuda_engine_hybrid.cu - the layers of the hybrid architectures (Qwen3-Next, Qwen3.5-MoE) in
 * the GPU engine: a recurrent layer's block and the gated attention's two element-wise steps
 * (docs/HYBRID.md; the CPU's twin is cpu_engine_hybrid.c).
 *
 * DESIGN: a recurrent layer replaces the attention block: x += the deferred residual, xn =
 * rmsnorm(x) * attn_norm, the products q | k | v (ssm_qkv), z (ssm_gate) and b, a (ssm_ba, or
 * ssm_beta and ssm_alpha; on decode steps xn quantised once and the products of one type in one
 * launch), the delta net on each sequence's state (cuda_delta.h, the step's runs
 * in e->d_runs), ssm_out, the residual (deferred on decode steps, as the attention's). Its
 * states live where its KV cache would (cuda_layer.rs, zeroed at init and by
 * cuda_engine_seq_reset); nothing here rewinds them (the context refuses a truncation). The
 * gated attention is the ordinary attention block with attn_q's rows [query | gate] per head
 * split into e->q and e->hy_gate before the q/k norms, and attn *= sigmoid(gate) before wo. The
 * runs: one sequence's step is one run of all its tokens, written by a kernel (so a captured
 * decode graph replays it); a step of several sequences uploads its runs (not captured).
 */
#include <cuda_runtime.h>
#include <string.h>

extern "C" {
#include "cuda/cuda_delta.h"
#include "cuda/cuda_engine_internal.h"
}
#include "cuda/cuda_check.cuh"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_math.cuh"

namespace {

__global__ void k_runs_single(int32_t *runs, int n) {
    cu_pdl_enter();
    if (threadIdx.x == 0) runs[0] = 0, runs[1] = n, runs[2] = 0;
}

/* src [n][nh][q (hd) | gate (hd)] -> q [n][nh][hd], gate [n][nh][hd] */
__global__ void k_gate_split(const float *src, float *q, float *gate, int64_t n_rows, int hd) {
    cu_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * hd) return;
    const int64_t r = i / hd, d = i % hd;
    q[i] = src[r * 2 * hd + d];
    gate[i] = src[r * 2 * hd + hd + d];
}

/* attn *= sigmoid(gate) (cpu_sigmoid, then cpu_mul) */
__global__ void k_gate_apply(float *attn, const float *gate, int64_t n) {
    cu_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) attn[i] = __fmul_rn(attn[i], cm_sigmoidf(gate[i]));
}

} // namespace

extern "C" cuda_hybrid_dims cuda_hybrid_dims_of(const hm_arch_desc *desc, const hm_hparams *hp) {
    cuda_hybrid_dims d;
    memset(&d, 0, sizeof(d));
    if (!desc->hybrid) return d;
    const int64_t kd = hp->ssm_n_k_heads * hp->ssm_head_k;
    d.nv = hp->ssm_n_v_heads;
    d.vd = d.nv * hp->ssm_head_v;
    d.cd = 2 * kd + d.vd;
    d.nq = desc->attn_gate ? hp->n_head * hp->head_dim_k : 0;
    d.rs_floats = (hp->ssm_conv_kernel - 1) * d.cd + d.nv * hp->ssm_head_k * hp->ssm_head_v;
    return d;
}

extern "C" hm_status cuda_engine_runs_single(cuda_engine *e, int n, hm_error *err) {
    cu_launch(k_runs_single, 1, 32, 0, (cudaStream_t)e->stream, e->d_runs, n);
    return cu_launched("k_runs_single", err);
}

extern "C" hm_status cuda_engine_gate_split(cuda_engine *e, int n, hm_error *err) {
    const int hd = (int)e->hp.head_dim_k;
    const int64_t rows = (int64_t)n * e->hp.n_head, tot = rows * hd;
    cu_launch(k_gate_split, (unsigned)((tot + 255) / 256), 256, 0, (cudaStream_t)e->stream,
              (const float *)e->hy_o, e->q, e->hy_gate, rows, hd);
    return cu_launched("k_gate_split", err);
}

extern "C" hm_status cuda_engine_gate_apply(cuda_engine *e, int n, hm_error *err) {
    const int64_t tot = (int64_t)n * e->hp.n_head * e->hp.head_dim_v;
    cu_launch(k_gate_apply, (unsigned)((tot + 255) / 256), 256, 0, (cudaStream_t)e->stream, e->attn,
              (const float *)e->hy_gate, tot);
    return cu_launched("k_gate_apply", err);
}

extern "C" hm_status cuda_engine_delta_block(cuda_engine *e, int il, int n, fwd_defer *d,
                                             hm_error *err) {
    const hm_hparams *hp = &e->hp;
    const cuda_layer *L = &e->layers[il];
    const bool split = L->ssm_beta.d != NULL;
    /* q | k | v, z, and b, a from xn: quantised by the norm's launch, one launch per type */
    const cuda_tensor *w[4] = {&L->ssm_qkv, &L->ssm_gate, split ? &L->ssm_beta : &L->ssm_ba,
                               &L->ssm_alpha};
    float *const y[4] = {e->hy_qkv, e->hy_z, e->hy_ba, e->hy_ba + (int64_t)n * hp->ssm_n_v_heads};
    const int nw = split ? 4 : 3;
    const void *act = NULL;
    hm_status st = cuda_engine_norm_in(e, n, d, &L->attn_norm, w, nw, &act, err);
    if (st == HM_OK) st = cuda_engine_linears(e, nw, w, y, e->xn, act, n, err);
    if (st != HM_OK) return st;
    cuda_delta_args a;
    memset(&a, 0, sizeof(a));
    a.nk = (int)hp->ssm_n_k_heads;
    a.nv = (int)hp->ssm_n_v_heads;
    a.dk = (int)hp->ssm_head_k;
    a.dv = (int)hp->ssm_head_v;
    a.conv_k = (int)hp->ssm_conv_kernel;
    a.v_tiled = e->desc->ssm_v_tiled;
    a.ab_split = split;
    a.eps = hp->rms_eps;
    a.n_tok = n;
    a.n_runs = e->n_runs > 0 ? e->n_runs : 1;
    a.max_run = e->n_runs > 0 ? e->run_max : 0; /* 0: one sequence, a run of n */
    a.d_runs = (const cuda_delta_run *)e->d_runs;
    a.conv_w = (const float *)L->ssm_conv1d.d;
    a.dt = (const float *)L->ssm_dt.d;
    a.a = (const float *)L->ssm_a.d;
    a.norm_w = (const float *)L->ssm_norm.d;
    a.state = L->rs;
    a.state_stride = L->rs_floats;
    a.qkv = e->hy_qkv;
    a.z = e->hy_z;
    a.ba = e->hy_ba;
    a.out = e->hy_o;
    st = cuda_delta_net(&a, e->stream, err);
    if (st == HM_OK) st = cuda_engine_linear(e, &L->ssm_out, e->hy_o, n, e->proj, err);
    return st == HM_OK ? cuda_engine_residual(e, n, d, err) : st;
}

extern "C" hm_status cuda_engine_seq_reset(cuda_engine *e, int seq, hm_error *err) {
    if (seq < 0 || seq >= (e->p.n_seq > 1 ? e->p.n_seq : 1))
        return hm_error_set(err, HM_ERR_ARG, "GPU: sequence %d of %d", seq, e->p.n_seq);
    for (int il = e->p.layer_begin; il < e->hp.n_layer; il++) {
        const cuda_layer *L = &e->layers[il];
        if (!L->rs) continue;
        const cudaError_t ce = cudaMemsetAsync(L->rs + (size_t)seq * (size_t)L->rs_floats, 0,
                                               sizeof(float) * (size_t)L->rs_floats,
                                               (cudaStream_t)e->stream);
        if (ce != cudaSuccess)
            return hm_error_set(err, HM_ERR_CUDA, "GPU: recurrent state reset: %s",
                                cudaGetErrorString(ce));
    }
    return HM_OK;
}
