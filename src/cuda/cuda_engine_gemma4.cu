/* cuda_engine_gemma4.cu - a layer of Gemma 4's MoE model (gemma4, docs/GEMMA4.md) in the GPU
 * engine; the CPU's twin is cpu_engine_gemma4.c, whose header gives the layer's formulas.
 *
 * DESIGN: one function per layer, called by the forward pass instead of its attention and MoE
 * blocks, written with the engine's unfused launchers (norms, products, rope, the KV store and
 * attention, the router, the expert FFN of any placement, the combine) in the CPU's order, so
 * each step reads as the CPU's does; residuals are added at once (nothing deferred). The layer
 * kinds differ only in data: the layer's kv heads and head size (cuda_layer.n_kv, hd), its rope
 * table (sliding: e->d_rope_swa), its window; a full layer without attn_v takes V from K's
 * product before K's norm. The experts' output scales multiply the gating weights (by expert
 * id), so every lane's slot outputs stay plain expert outputs and the merge is the usual one.
 * Decode steps pay the unfused launches (about twice the fused path's): speed is left to do.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

extern "C" {
#include "cuda/cuda_attn.h"
#include "cuda/cuda_engine_internal.h"
#include "cuda/cuda_ops.h"
}
#include "cuda/cuda_check.cuh"
#include "cuda/cuda_launch.cuh"

namespace {

/* the router's input: xn[t][i] = (xn[t][i] * scale[i]) * inv (cpu_mul, then cpu_scale) */
__global__ void k_router_in(float *xn, const float *scale, float inv, int64_t n_rows, int64_t n) {
    cu_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_rows * n) xn[i] = __fmul_rn(__fmul_rn(xn[i], scale[i % n]), inv);
}

/* gw[i] *= expert_scale[ids[i]] */
__global__ void k_expert_scale(float *gw, const int32_t *ids, const float *expert_scale,
                               int64_t n, int n_expert) {
    cu_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && ids[i] >= 0 && ids[i] < n_expert) gw[i] = __fmul_rn(gw[i], expert_scale[ids[i]]);
}

/* x[i] *= *s (the layer's output scalar, a device float) */
__global__ void k_scale_dev(float *x, const float *s, int64_t n) {
    cu_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], *s);
}

unsigned blocks_of(int64_t n) { return (unsigned)((n + 255) / 256); }

} // namespace

#define S(e) ((cudaStream_t)(e)->stream)
#define F(t) ((const float *)(t).d)

extern "C" hm_status cuda_engine_gemma4_embed(cuda_engine *e, int n, hm_error *err) {
    const int64_t E = e->hp.n_embd; /* transformers: the scale in the weights' dtype (f32) */
    return cuda_scale(e->x, (float)sqrt((double)E), e->x, (int64_t)n * E, e->stream, err);
}

extern "C" hm_status cuda_engine_softcap(cuda_engine *e, int n_rows, hm_error *err) {
    const float cap = e->hp.logit_softcap;
    if (!(cap > 0.0f)) return HM_OK;
    return cuda_softcap(e->d_logits, cap, (int64_t)n_rows * e->hp.n_vocab, e->stream, err);
}

/* x += rms(attention of the layer's kind) * post_attention_norm */
static hm_status attention(cuda_engine *e, const cuda_layer *L, int n, hm_error *err) {
    const hm_hparams *hp = &e->hp;
    const int64_t E = hp->n_embd, nh = hp->n_head, nkv = L->n_kv, hd = L->hd;
    const float eps = hp->rms_eps;
    hm_status st = cuda_rmsnorm(e->x, F(L->attn_norm), e->xn, n, E, eps, e->stream, err);
    const cuda_tensor *w[3] = {&L->wq, &L->wk, &L->wv};
    float *const y[3] = {e->q, e->k, e->v}; /* [n][nh][hd], [n][nkv][hd], [n][nkv][hd] */
    if (st == HM_OK) st = cuda_engine_linears(e, L->wv.d ? 3 : 2, w, y, e->xn, NULL, n, err);
    if (st != HM_OK) return st;
    /* v = rms_head(v), or on a full layer rms_head of K's product (before K's own norm) */
    st = cuda_rmsnorm(L->wv.d ? e->v : e->k, NULL, e->v, n * nkv, hd, eps, e->stream, err);
    if (st == HM_OK) st = cuda_rmsnorm(e->q, F(L->q_norm), e->q, n * nh, hd, eps, e->stream, err);
    if (st == HM_OK) st = cuda_rmsnorm(e->k, F(L->k_norm), e->k, n * nkv, hd, eps, e->stream, err);
    cuda_rope_args ra;
    memset(&ra, 0, sizeof(ra));
    ra.p = L->swa ? hm_model_rope_params_swa(e->m) : hm_model_rope_params(e->m);
    ra.d_table = L->swa ? e->d_rope_swa : e->d_rope; /* the CPU's rotations, freq factors too */
    ra.n_table = e->p.n_ctx;
    if (st == HM_OK)
        st = cuda_rope_qk(e->q, (int)nh, e->k, (int)nkv, n, (int)hd, e->d_positions, &ra,
                          e->stream, err);
    if (st == HM_OK && e->n_runs > 0) {
        st = cuda_engine_attn_runs(e, L, err); /* several sequences: per run's cache */
    } else if (st == HM_OK) {
        st = cuda_kv_store(e->p.type_k, L->k_cache, L->v_cache, e->p.n_ctx, (int)nkv, (int)hd,
                           e->k, e->v, n, e->d_positions, e->stream, err);
        if (st == HM_OK)
            st = cuda_engine_attn(e, L, n, e->d_positions, e->q, L->k_cache, L->v_cache, e->attn,
                                  err);
    }
    if (st == HM_OK) st = cuda_engine_linear(e, &L->wo, e->attn, n, e->proj, err);
    if (st == HM_OK)
        st = cuda_rmsnorm(e->proj, F(L->attn_post_norm), e->proj, n, E, eps, e->stream, err);
    if (st == HM_OK) st = cuda_add(e->x, e->proj, e->x, (int64_t)n * E, e->stream, err);
    return st;
}

/* ids, gw (times the experts' output scales) and the device slots from the residual rows */
static hm_status route(cuda_engine *e, const cuda_layer *L, int il, int n, hm_error *err) {
    const hm_hparams *hp = &e->hp;
    const int64_t E = hp->n_embd, X = hp->n_expert;
    const int K = (int)hp->n_expert_used;
    hm_status st = cuda_rmsnorm(e->x, NULL, e->xn, n, E, hp->rms_eps, e->stream, err);
    if (st != HM_OK) return st;
    cu_launch(k_router_in, blocks_of((int64_t)n * E), 256, 0, S(e), e->xn, F(L->router_scale),
              (float)(1.0 / sqrt((double)E)), (int64_t)n, E);
    st = cu_launched("gemma4 router input", err);
    if (st == HM_OK)
        st = cuda_engine_matvec(e, &L->router, e->xn, n, e->router, err); /* [n][X] */
    cuda_route_out ro;
    memset(&ro, 0, sizeof(ro));
    ro.slot_of = L->slot_of;
    ro.dslot = e->dslot;
    if (e->counting && !e->d_route_table) {
        ro.hits = e->d_hits + (size_t)il * (size_t)X;
        ro.stat = e->d_stat + 2 * (size_t)il;
    }
    if (st == HM_OK)
        st = cuda_router(e->router, NULL, n, (int)X, K, CPU_GATE_SOFTMAX_TOPK, 1, e->ids, e->gw,
                         &ro, e->stream, err);
    if (st == HM_OK && e->d_route_table) st = cuda_route_table_enqueue(e, il, n, err);
    if (st != HM_OK) return st;
    cu_launch(k_expert_scale, blocks_of((int64_t)n * K), 256, 0, S(e), e->gw, e->ids,
              F(L->down_exps_scale), (int64_t)n * K, (int)X);
    return cu_launched("gemma4 expert scales", err);
}

extern "C" hm_status cuda_engine_gemma4_layer(cuda_engine *e, int il, int n, hm_error *err) {
    const hm_hparams *hp = &e->hp;
    const cuda_layer *L = &e->layers[il];
    const int64_t E = hp->n_embd, FF = hp->n_ff;
    const int K = (int)hp->n_expert_used;
    const float eps = hp->rms_eps;
    hm_status st = attention(e, L, n, err);
    if (st == HM_OK) st = route(e, L, il, n, err);
    /* experts on rms(x) * pre_ffw_norm_2 (any lane), their weighted sum in slot order into
     * proj, then its norm */
    if (st == HM_OK)
        st = cuda_rmsnorm(e->x, F(L->ffn_pre_norm2), e->xn, n, E, eps, e->stream, err);
    if (st == HM_OK) st = cuda_engine_experts_step(e, il, n, err);
    if (st == HM_OK)
        st = cuda_moe_combine(e->ey, e->gw, e->ids, n, K, E, e->proj, e->stream, err);
    if (st == HM_OK)
        st = cuda_rmsnorm(e->proj, F(L->ffn_post_norm2), e->proj, n, E, eps, e->stream, err);
    /* the dense MLP into ey's first n rows (the slots are summed already) */
    float *dense = e->ey; /* [n][E] */
    if (st == HM_OK) st = cuda_rmsnorm(e->x, F(L->ffn_norm), e->xn, n, E, eps, e->stream, err);
    const cuda_tensor *gu[2] = {&L->ffn_gate, &L->ffn_up};
    float *const gy[2] = {e->sg, e->su}; /* [n][FF] each */
    if (st == HM_OK) st = cuda_engine_linears(e, 2, gu, gy, e->xn, NULL, n, err);
    if (st == HM_OK)
        st = cuda_glu_act(CPU_GLU_GELU, e->sg, e->su, e->sg, (int64_t)n * FF, e->stream, err);
    if (st == HM_OK) st = cuda_engine_linear(e, &L->ffn_down, e->sg, n, dense, err);
    if (st == HM_OK)
        st = cuda_rmsnorm(dense, F(L->ffn_post_norm1), dense, n, E, eps, e->stream, err);
    /* x = (x + rms(dense + experts) * post_ffw_norm) * the layer's scalar */
    if (st == HM_OK) st = cuda_add(dense, e->proj, e->proj, (int64_t)n * E, e->stream, err);
    if (st == HM_OK)
        st = cuda_rmsnorm(e->proj, F(L->ffn_post_norm), e->proj, n, E, eps, e->stream, err);
    if (st == HM_OK) st = cuda_add(e->x, e->proj, e->x, (int64_t)n * E, e->stream, err);
    if (st != HM_OK) return st;
    cu_launch(k_scale_dev, blocks_of((int64_t)n * E), 256, 0, S(e), e->x, F(L->out_scale),
              (int64_t)n * E);
    return cu_launched("gemma4 layer scalar", err);
}
