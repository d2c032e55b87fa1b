/* cuda_engine_forward.cu - the forward pass on the GPU, enqueued on the engine's stream.
 *
 * DESIGN: the same sequence as cpu_engine_forward.c (embed; per layer x += attn(norm(x)) and
 * x += moe(norm(x)); final norm; output), each CPU call replaced by its device twin:
 * cpu_matmul -> cuda_quantize_act + cuda_matvec (bytes equal for every n_tok), cpu_rmsnorm ->
 * cuda_rmsnorm, cpu_rope -> cuda_rope_qk (cos/sin table computed by the CPU rope at init),
 * cpu_attention -> cuda_kv_store + cuda_attention, cpu_router -> cuda_router, the expert FFN ->
 * cuda_moe_gate_up (fused gate/up/bias/activation) + cuda_moe_matvec (down), cpu_moe_combine ->
 * cuda_moe_combine, the shared expert -> products + cuda_swiglu + cuda_shexp_combine.
 * Larger steps use the tensor-core GEMMs of cuda_gemm.h (f16 inputs: close to, not equal to,
 * the CPU) where the shape allows: experts above CUDA_ENGINE_MOE_GEMM_MIN_TOK tokens, dense
 * products above CUDA_ENGINE_GEMM_MIN_TOK (a server's batched decode steps stay on the matvec
 * kernels).
 * Decode steps (n_tok <= CUDA_ENGINE_MATVEC_MAX_TOK) use the fused kernels of cuda_fused.h
 * (same bytes as the sequences they replace): the residual add
 * (or the MoE combine, with a shared expert's term) is deferred into the next norm (fwd_defer),
 * the norm quantises the next product's activations, products of one input and one type are
 * one launch (linears: q/k/v, a recurrent layer's inputs, the shared expert's gate/up), and q/k
 * norm, RoPE and the KV store are one launch.
 * Experts follow the residency map: the router writes each selected expert's device slot
 * (e->dslot, from the layer's expert->slot table) next to its id, and every expert product and
 * bias add indexes the layer's expert arenas (n_slots experts) with the slots; the combine and
 * the gating weights stay with the ids. With routing counts on, the same router launch adds to
 * the layer's device counters (no launch of its own).
 * An engine with layer_begin > 0 (a partial -ngl) starts from input rows already in e->x and
 * runs its layers only. A gemma4 model's layers are cuda_engine_gemma4.cu's (one call a layer,
 * nothing deferred); the recurrent layers of the hybrids cuda_engine_hybrid.cu's.
 * Nothing here synchronises, allocates or copies to the host; positions come from e->d_pos.
 */
#include <cuda_runtime.h>
#include <string.h>

#include "cuda/cuda_launch.cuh"

extern "C" {
#include "cuda/cuda_attn.h"
#include "cuda/cuda_engine_internal.h"
#include "cuda/cuda_fused.h"
#include "cuda/cuda_gemm.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_quant.h"
#include "quant/qtypes.h"
}

#define S(e) ((cudaStream_t)(e)->stream)

static hm_status launched(const char *what, hm_error *err) {
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: %s: %s", what, cudaGetErrorString(ce));
    return HM_OK;
}

/* positions of the step's tokens; d_seq (host layers only, else NULL): the step's sequence
 * number of the hand-off += 1 */
__global__ void k_positions(const int32_t *d_pos, int32_t *positions, int n, uint32_t *d_seq) {
    cu_pdl_enter();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) positions[t] = *d_pos + t;
    if (d_seq && t == 0) *d_seq += 1u;
}

__global__ void k_advance(int32_t *d_pos, int n) {
    cu_pdl_enter(); *d_pos += n; }

/* Whether the product of w with n tokens goes to the tensor cores: above min_tok tokens
 * (CUDA_ENGINE_GEMM_MIN_TOK for dense products, CUDA_ENGINE_MOE_GEMM_MIN_TOK for experts). f32
 * weights never do: the GEMM rounds its inputs to f16, and whoever keeps f32 weights asked for
 * f32 arithmetic (the f32 goldens' bar); their prompts run through the f32 matvec kernels. */
static bool gemm_for(const cuda_engine *e, const cuda_tensor *w, int64_t n, int64_t min_tok) {
    return e->use_gemm && n > min_tok && w->type != HM_TYPE_F32 && cuda_gemm_supported(w->type) &&
           w->ne[0] % 32 == 0;
}
static bool use_gemm(const cuda_engine *e, const cuda_tensor *w, int64_t n) {
    return gemm_for(e, w, n, CUDA_ENGINE_GEMM_MIN_TOK);
}
static bool use_gemm_moe(const cuda_engine *e, const cuda_tensor *w, int64_t n) {
    return gemm_for(e, w, n, CUDA_ENGINE_MOE_GEMM_MIN_TOK);
}

/* Decode-sized steps (the matvec path) use the fused kernels. */
static bool fused_step(int64_t n) { return n <= CUDA_ENGINE_MATVEC_MAX_TOK; }

/* The router's logits and top-k in one launch (cuda_fused_router): f32 router rows. */
static bool fused_router_ok(const cuda_engine *e, const cuda_layer *L) {
    return L->router.type == HM_TYPE_F32 &&
           L->router.ne[1] == e->hp.n_expert && e->hp.n_expert <= CUDA_FUSED_ROUTER_MAX;
}

/* Decode: the MoE block's norm runs in front of the fused router and its residual add in the
 * o product's epilogue, so the step has no launch of its own for them. */
static bool norm_in_router(const cuda_engine *e, const cuda_layer *L, int64_t n) {
    return fused_step(n) && fused_router_ok(e, L) && !use_gemm(e, &L->wo, n) &&
           L->wo.ne[1] == e->hp.n_embd && L->ffn_norm.d &&
           cuda_fused_router_norm_ok(e->hp.n_embd, n, L->gate_exps.type);
}

/* Whether weight type t reads rows of k f32 activations (float weights): x itself, unquantised. */
static bool f32_acts(uint32_t t, int64_t k) { return cuda_act_row_bytes(t, k) == 4 * (size_t)k; }

/* Activation rows of x [n][k] for weight type t in e->act (or x itself for float weights). */
static hm_status quantize(cuda_engine *e, uint32_t t, const float *x, int64_t k, int64_t n,
                          const void **act, hm_error *err) {
    if (f32_acts(t, k)) {
        *act = x;
        return HM_OK;
    }
    *act = e->act;
    return cuda_quantize_act(t, x, k, n, e->act, e->stream, err);
}

/* y[n][rows of w] = x[n][w->ne[0]] . w (+ b). act: x already quantised for w's type, or NULL. */
static hm_status linear(cuda_engine *e, const cuda_tensor *w, const cuda_tensor *b,
                        const float *x, int64_t n, float *y, const void *act, hm_error *err) {
    hm_status st;
    if (use_gemm(e, w, n)) {
        st = cuda_gemm(w->type, w->d, w->ne[1], w->ne[0], x, n, y, e->gemm_scratch,
                       e->gemm_scratch_bytes, e->stream, err);
    } else {
        st = act ? HM_OK : quantize(e, w->type, x, w->ne[0], n, &act, err);
        if (st == HM_OK && b && b->d && fused_step(n)) {
            const cuda_multi_mat m = {w->d, w->ne[1], (const float *)b->d, y, 0};
            return cuda_matvec_multi(w->type, w->ne[0], act, n, &m, 1, e->stream, err);
        }
        if (st == HM_OK) st = cuda_matvec(w->type, w->d, w->ne[1], w->ne[0], act, n, y, e->stream,
                                          err);
    }
    if (st == HM_OK && b && b->d) st = cuda_add_bias(y, (const float *)b->d, n, w->ne[1],
                                                     e->stream, err);
    return st;
}

/* Applies a deferred residual with the unfused launchers. */
static hm_status defer_flush(cuda_engine *e, int n, fwd_defer *d, hm_error *err) {
    const int64_t E = e->hp.n_embd;
    const int K = (int)e->hp.n_expert_used;
    hm_status st = HM_OK;
    if (d->combine) {
        if (d->ey_bias)
            st = cuda_moe_add_bias(e->ey, d->ey_bias, e->dslot, n, K, E, (int)d->n_slots,
                                   e->stream, err);
        if (st == HM_OK)
            st = cuda_moe_combine(e->ey, e->gw, e->ids, n, K, E, e->proj, e->stream, err);
        if (st == HM_OK && d->sh)
            st = cuda_shexp_combine(e->proj, d->sh, e->sgate, n, E, e->stream, err);
        if (st == HM_OK) st = cuda_add(e->x, e->proj, e->x, (int64_t)n * E, e->stream, err);
    } else if (d->add) {
        st = cuda_add(e->x, d->add, e->x, (int64_t)n * E, e->stream, err);
    }
    memset(d, 0, sizeof(*d));
    return st;
}

/* x += the deferred residual; then (norm != NULL) xn = rmsnorm(x) * norm and (act != NULL)
 * *act = xn's activation rows for weight type wtype (xn itself for float types). Decode steps:
 * one cuda_fused_norm_quant launch; otherwise the unfused launchers. */
static hm_status norm_step(cuda_engine *e, int n, fwd_defer *d, const cuda_tensor *norm,
                           uint32_t wtype, const void **act, hm_error *err) {
    const int64_t E = e->hp.n_embd;
    const size_t arow = act ? cuda_act_row_bytes(wtype, E) : 0;
    if (fused_step(n) && E <= CUDA_FUSED_NORM_MAX && (!act || arow)) {
        const bool f32 = f32_acts(wtype, E);
        cuda_fused_norm_args a;
        memset(&a, 0, sizeof(a));
        a.x = e->x;
        a.add = d->add;
        if (d->combine) {
            a.ey = e->ey;
            a.gw = e->gw;
            a.ids = e->ids;
            a.n_used = (int)e->hp.n_expert_used;
            a.ey_bias = d->ey_bias;
            a.bias_ids = e->dslot;
            a.n_expert = (int)d->n_slots;
            a.sh = d->sh;
            a.sgate = d->sh ? e->sgate : NULL;
        }
        a.norm_w = norm ? (const float *)norm->d : NULL;
        a.eps = e->hp.rms_eps;
        a.xn = norm ? e->xn : NULL;
        a.wtype = wtype;
        a.act = norm && act && !f32 ? e->act : NULL;
        a.n_tok = n;
        a.n = E;
        a.d_sync = e->norm_sync;
        memset(d, 0, sizeof(*d));
        hm_status st = cuda_fused_norm_quant(&a, e->stream, err);
        if (st == HM_OK && norm && act) *act = f32 ? (const void *)e->xn : e->act;
        return st;
    }
    hm_status st = defer_flush(e, n, d, err);
    if (st == HM_OK && norm)
        st = cuda_rmsnorm(e->x, (const float *)norm->d, e->xn, n, E, e->hp.rms_eps, e->stream,
                          err);
    if (st == HM_OK && norm && act) st = quantize(e, wtype, e->xn, E, n, act, err);
    return st;
}

/* Whether the norm in front of the products w[0..nw) of one input (linears) quantises that input
 * for w[0]'s type: linears reads it on decode steps (its first group) and on other steps when
 * every w[i] shares w[0]'s format; never for a GEMM. */
static bool act_wanted(const cuda_engine *e, const cuda_tensor *const *w, int nw, int n) {
    if (use_gemm(e, w[0], n)) return false;
    for (int i = 1; i < nw && !fused_step(n); i++)
        if (quant_act_for(w[i]->type) != quant_act_for(w[0]->type)) return false;
    return true;
}

hm_status cuda_engine_norm_in(cuda_engine *e, int n, fwd_defer *d, const cuda_tensor *norm,
                              const cuda_tensor *const *w, int nw, const void **act,
                              hm_error *err) {
    *act = NULL;
    return norm_step(e, n, d, norm, w[0]->type, act_wanted(e, w, nw, n) ? act : NULL, err);
}

hm_status cuda_engine_linear(cuda_engine *e, const cuda_tensor *w, const float *x, int n,
                             float *y, hm_error *err) {
    return linear(e, w, NULL, x, n, y, NULL, err);
}

hm_status cuda_engine_matvec(cuda_engine *e, const cuda_tensor *w, const float *x, int n, float *y,
                             hm_error *err) {
    const void *act = NULL;
    hm_status st = quantize(e, w->type, x, w->ne[0], n, &act, err);
    return st == HM_OK ? cuda_matvec(w->type, w->d, w->ne[1], w->ne[0], act, n, y, e->stream, err)
                       : st;
}

hm_status cuda_engine_residual(cuda_engine *e, int n, fwd_defer *d, hm_error *err) {
    if (fused_step(n)) {
        d->add = e->proj; /* x += proj in the MoE block's norm */
        return HM_OK;
    }
    return cuda_add(e->x, e->proj, e->x, (int64_t)n * e->hp.n_embd, e->stream, err);
}

/* y[i] = x . w[i] (+ b[i]) for i < nw, every w[i] reading the same x [n][k]. Decode steps: x is
 * quantised once per activation format (act: x's rows for w[0]'s type already, or NULL) and the
 * matrices of one type run in one launch (cuda_matvec_multi); w[0]'s format goes first and a
 * format's matrices all run before the next format's quantisation reuses e->act. Other steps:
 * linear() one by one. The same bytes either way. */
static hm_status linears(cuda_engine *e, int nw, const cuda_tensor *const *w,
                         const cuda_tensor *const *b, float *const *y, const float *x,
                         const void *act, int n, hm_error *err) {
    if (nw < 1 || nw > CUDA_MULTI_MAX)
        return hm_error_set(err, HM_ERR_ARG, "GPU: %d products of one input (1..%d)", nw,
                            CUDA_MULTI_MAX);
    bool multi = fused_step(n), one_fmt = true;
    for (int i = 0; i < nw; i++) {
        multi = multi && !use_gemm(e, w[i], n) && w[i]->ne[0] == w[0]->ne[0];
        one_fmt = one_fmt && quant_act_for(w[i]->type) == quant_act_for(w[0]->type);
    }
    hm_status st = HM_OK;
    if (!multi) {
        for (int i = 0; i < nw && st == HM_OK; i++)
            st = linear(e, w[i], b ? b[i] : NULL, x, n, y[i], one_fmt ? act : NULL, err);
        return st;
    }
    bool done[CUDA_MULTI_MAX] = {false};
    for (int i = 0; i < nw && st == HM_OK; i++) {
        if (done[i]) continue;
        const quant_act f = quant_act_for(w[i]->type);
        const void *a = i == 0 ? act : NULL; /* w[0]'s format: the first group */
        if (!a) st = quantize(e, w[i]->type, x, w[i]->ne[0], n, &a, err);
        for (int j = i; j < nw && st == HM_OK; j++) { /* every type of format f */
            if (done[j] || quant_act_for(w[j]->type) != f) continue;
            cuda_multi_mat m[CUDA_MULTI_MAX];
            int nm = 0;
            for (int t = j; t < nw; t++) {
                if (done[t] || w[t]->type != w[j]->type) continue;
                m[nm++] = (cuda_multi_mat){w[t]->d, w[t]->ne[1],
                                           b && b[t] ? (const float *)b[t]->d : NULL, y[t], 0};
                done[t] = true;
            }
            st = cuda_matvec_multi(w[j]->type, w[j]->ne[0], a, n, m, nm, e->stream, err);
        }
    }
    return st;
}

hm_status cuda_engine_linears(cuda_engine *e, int nw, const cuda_tensor *const *w,
                              float *const *y, const float *x, const void *act, int n,
                              hm_error *err) {
    return linears(e, nw, w, NULL, y, x, act, n, err);
}

cuda_attn_args cuda_engine_attn_args(const cuda_engine *e, const cuda_layer *L, int n_tok,
                                     const int32_t *d_pos, const float *q, const void *kc,
                                     const void *vc, float *out) {
    const hm_hparams *hp = &e->hp;
    cuda_attn_args a;
    memset(&a, 0, sizeof(a));
    a.n_head = (int)hp->n_head;
    a.n_head_kv = L->n_kv;
    a.head_dim = L->hd;
    a.n_ctx = e->p.n_ctx;
    a.n_tok = n_tok;
    a.window = L->swa ? hp->sliding_window : 0;
    a.scale = e->desc->gemma4 ? 1.0f : 0.0f; /* 0: 1 / sqrt(head_dim) */
    a.d_sinks = (const float *)L->sinks.d;
    a.d_pos = d_pos;
    a.q = q;
    a.k_cache = kc;
    a.v_cache = vc;
    a.kv_f32 = e->p.type_k == HM_TYPE_F32; /* else f16 (cuda_kv_check) */
    a.out = out;
    a.scratch = e->attn_scratch;
    return a;
}

hm_status cuda_engine_attn(cuda_engine *e, const cuda_layer *L, int n_tok, const int32_t *d_pos,
                           const float *q, const void *kc, const void *vc, float *out,
                           hm_error *err) {
    cuda_attn_args a = cuda_engine_attn_args(e, L, n_tok, d_pos, q, kc, vc, out);
    if (!cuda_attention_scratch_size(&a)) a.scratch = NULL;
    return cuda_attention(&a, e->stream, err);
}

static hm_status attention_block(cuda_engine *e, int il, int n, fwd_defer *dfr, hm_error *err) {
    const hm_hparams *hp = &e->hp;
    const cuda_layer *L = &e->layers[il];
    const int nh = (int)hp->n_head, nkv = L->n_kv, hd = L->hd;
    const int64_t E = hp->n_embd;
    if (L->recurrent) return cuda_engine_delta_block(e, il, n, dfr, err);
    const bool gated = e->desc->attn_gate; /* attn_q's rows per head: [query | gate] */

    const bool fz = fused_step(n);
    /* q, k, v from xn, quantised by the norm's launch where linears reads it */
    const cuda_tensor *w[3] = {&L->wq, &L->wk, &L->wv}, *b[3] = {&L->bq, &L->bk, &L->bv};
    float *y[3] = {gated ? e->hy_o : e->q, e->k, e->v};
    const void *act = NULL;
    hm_status st = norm_step(e, n, dfr, &L->attn_norm, L->wq.type,
                             act_wanted(e, w, 3, n) ? &act : NULL, err);
    if (st == HM_OK) st = linears(e, 3, w, b, y, e->xn, act, n, err);
    if (st == HM_OK && gated) st = cuda_engine_gate_split(e, n, err);
    if (st != HM_OK) return st;
    cuda_rope_args ra;
    memset(&ra, 0, sizeof(ra));
    ra.p = hm_model_rope_params(e->m);
    ra.d_table = e->d_rope;
    ra.n_table = e->p.n_ctx;
    const bool f32kv = e->p.type_k == HM_TYPE_F32; /* else f16 (cuda_kv_check) */
    /* the fused kernel stores f16 caches only */
    const bool fqk = fz && e->desc->qk_norm != HM_QKNORM_FULL && hd <= 256 && !f32kv &&
                     e->n_runs == 0; /* several sequences: the store per run, below */
    if (fqk) { /* q/k norm, RoPE and the KV store in one launch */
        cuda_fused_qk_args qa;
        memset(&qa, 0, sizeof(qa));
        qa.q = e->q;
        qa.k = e->k;
        qa.v = e->v;
        qa.n_head = nh;
        qa.n_head_kv = nkv;
        qa.head_dim = hd;
        qa.n_tok = n;
        qa.qk_norm = e->desc->qk_norm == HM_QKNORM_HEAD;
        qa.q_norm = (const float *)L->q_norm.d;
        qa.k_norm = (const float *)L->k_norm.d;
        qa.eps = hp->rms_eps;
        qa.d_pos = e->d_positions;
        qa.rope = ra;
        qa.k_cache = (uint16_t *)L->k_cache;
        qa.v_cache = (uint16_t *)L->v_cache;
        qa.n_ctx = e->p.n_ctx;
        st = cuda_fused_qk_rope_store(&qa, e->stream, err);
    } else if (e->desc->qk_norm == HM_QKNORM_HEAD) {
        st = cuda_rmsnorm(e->q, (const float *)L->q_norm.d, e->q, (int64_t)n * nh, hd,
                          hp->rms_eps, e->stream, err);
        if (st == HM_OK)
            st = cuda_rmsnorm(e->k, (const float *)L->k_norm.d, e->k, (int64_t)n * nkv, hd,
                              hp->rms_eps, e->stream, err);
    } else if (e->desc->qk_norm == HM_QKNORM_FULL) {
        st = cuda_rmsnorm(e->q, (const float *)L->q_norm.d, e->q, n, (int64_t)nh * hd,
                          hp->rms_eps, e->stream, err);
        if (st == HM_OK)
            st = cuda_rmsnorm(e->k, (const float *)L->k_norm.d, e->k, n, (int64_t)nkv * hd,
                              hp->rms_eps, e->stream, err);
    }
    if (st == HM_OK && !fqk) {
        st = cuda_rope_qk(e->q, nh, e->k, nkv, n, hd, e->d_positions, &ra, e->stream, err);
        if (st == HM_OK && e->n_runs == 0)
            st = cuda_kv_store(e->p.type_k, L->k_cache, L->v_cache, e->p.n_ctx, nkv, hd, e->k,
                               e->v, n, e->d_positions, e->stream, err);
    }
    if (st != HM_OK) return st;
    st = e->n_runs > 0 ? cuda_engine_attn_runs(e, L, err)
                       : cuda_engine_attn(e, L, n, e->d_positions, e->q, L->k_cache, L->v_cache,
                                          e->attn, err);
    if (st == HM_OK && gated) st = cuda_engine_gate_apply(e, n, err); /* attn *= sigmoid(gate) */
    if (st == HM_OK && norm_in_router(e, L, n)) { /* x += attn . wo (+ bo), in the epilogue */
        const void *act = NULL;
        st = quantize(e, L->wo.type, e->attn, L->wo.ne[0], n, &act, err);
        const cuda_multi_mat m = {L->wo.d, L->wo.ne[1], (const float *)L->bo.d, e->x, 1};
        return st == HM_OK ? cuda_matvec_multi(L->wo.type, L->wo.ne[0], act, n, &m, 1, e->stream, err)
                           : st;
    }
    if (st == HM_OK) st = linear(e, &L->wo, &L->bo, e->attn, n, e->proj, NULL, err);
    if (st != HM_OK) return st;
    if (fz) {
        dfr->add = e->proj; /* x += proj in the MoE block's norm */
        return HM_OK;
    }
    return cuda_add(e->x, e->proj, e->x, (int64_t)n * E, e->stream, err);
}

/* Product i of the expert FFN over the slots e->dslot [n_tok][K]: 0 gate and 1 up (xn ->
 * eg, eu [n_tok][K][F]), 2 down (eg -> ey [n_tok][K][E]); w holds n_slots experts' matrices
 * w_stride bytes apart (0: packed). */
hm_status cuda_experts_gemm(cuda_engine *e, int i, uint32_t wtype, const void *w, size_t w_stride,
                            int n_slots, int n_tok, hm_error *err) {
    const int64_t F = e->hp.n_ff_exp, E = e->hp.n_embd;
    float *y[3] = {e->eg, e->eu, e->ey};
    cuda_gemm_moe_args g;
    memset(&g, 0, sizeof(g));
    g.wtype = wtype;
    g.w = w;
    g.w_stride = w_stride;
    g.n_expert = n_slots;
    g.n_rows = i == 2 ? E : F;
    g.k = i == 2 ? F : E;
    g.x = i == 2 ? e->eg : e->xn;
    g.x_per_slot = i == 2;
    g.ids = e->dslot;
    g.n_tok = n_tok;
    g.n_used = (int)e->hp.n_expert_used;
    g.y = y[i];
    return cuda_gemm_moe(&g, e->gemm_scratch, e->gemm_scratch_bytes, e->stream, err);
}

/* The expert FFN: ey[t][s] = down(act(gate(xn[t]), up(xn[t]))) of expert ids[t][s], whose
 * weights and biases are slot dslot[t][s] of the layer's arenas (NS of them); a slot < 0 is
 * skipped. matvec_only: never the tensor-core GEMMs (the CPU's bytes for any n). */
static hm_status experts(cuda_engine *e, const cuda_layer *L, int n, const void *xact,
                         bool defer_down_bias, bool matvec_only, hm_error *err) {
    const hm_hparams *hp = &e->hp;
    const int64_t F = hp->n_ff_exp, E = hp->n_embd;
    const int K = (int)hp->n_expert_used, NS = (int)L->n_slots;
    const int glu = cuda_engine_glu(e);
    hm_status st = HM_OK;
    if (!matvec_only && use_gemm_moe(e, &L->gate_exps, n) && use_gemm_moe(e, &L->up_exps, n) &&
        use_gemm_moe(e, &L->down_exps, n) && NS <= CUDA_GEMM_MAX_EXPERTS) {
        const cuda_tensor *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int i = 0; i < 3 && st == HM_OK; i++) {
            if (i == 2) { /* biases and the activation before the down product */
                if (L->gate_exps_b.d) {
                    st = cuda_moe_add_bias(e->eg, (const float *)L->gate_exps_b.d, e->dslot, n,
                                           K, F, NS, e->stream, err);
                    if (st == HM_OK)
                        st = cuda_moe_add_bias(e->eu, (const float *)L->up_exps_b.d, e->dslot,
                                               n, K, F, NS, e->stream, err);
                }
                if (st == HM_OK)
                    st = cuda_glu_act(glu, e->eg, e->eu, e->eg, (int64_t)n * K * F, e->stream, err);
                if (st != HM_OK) return st;
            }
            st = cuda_experts_gemm(e, i, w[i]->type, w[i]->d, 0, NS, n, err);
        }
    } else {
        /* gate and up fused: every slot of token t reads xn[t] */
        cuda_moe_gate_up_args g;
        memset(&g, 0, sizeof(g));
        g.gate.wtype = L->gate_exps.type;
        g.gate.w = L->gate_exps.d;
        g.gate.n_expert = NS;
        g.gate.n_rows = F;
        g.gate.k = E;
        g.gate.x_per_slot = 0;
        g.gate.ids = e->dslot;
        g.gate.n_tok = n;
        g.gate.n_used = K;
        g.up_wtype = L->up_exps.type;
        g.up_w = L->up_exps.d;
        g.gate_b = (const float *)L->gate_exps_b.d;
        g.up_b = (const float *)L->up_exps_b.d;
        g.glu = (cuda_glu)glu;
        g.alpha = 1.702f;
        g.limit = 7.0f;
        g.out = e->eg;
        if (xact) g.gate.act = xact; /* quantised by the norm kernel */
        else st = quantize(e, g.gate.wtype, e->xn, E, n, &g.gate.act, err);
        if (st != HM_OK) return st;
        if (quant_act_for(g.gate.wtype) == quant_act_for(g.up_wtype) &&
            (!g.gate_b || g.up_b)) {
            st = cuda_moe_gate_up(&g, e->stream, err);
        } else { /* separate products, then biases and the activation */
            cuda_moe_args a = g.gate;
            a.y = e->eg;
            st = cuda_moe_matvec(&a, e->stream, err);
            if (st == HM_OK) st = quantize(e, g.up_wtype, e->xn, E, n, &a.act, err);
            a.wtype = g.up_wtype;
            a.w = g.up_w;
            a.y = e->eu;
            if (st == HM_OK) st = cuda_moe_matvec(&a, e->stream, err);
            if (st == HM_OK && g.gate_b)
                st = cuda_moe_add_bias(e->eg, g.gate_b, e->dslot, n, K, F, NS, e->stream, err);
            if (st == HM_OK && g.up_b)
                st = cuda_moe_add_bias(e->eu, g.up_b, e->dslot, n, K, F, NS, e->stream, err);
            if (st == HM_OK)
                st = cuda_glu_act(glu, e->eg, e->eu, e->eg, (int64_t)n * K * F, e->stream, err);
        }
        if (st != HM_OK) return st;
        /* down: slot s of token t reads its own activation eg[t][s] */
        cuda_moe_args d;
        memset(&d, 0, sizeof(d));
        d.wtype = L->down_exps.type;
        d.w = L->down_exps.d;
        d.n_expert = NS;
        d.n_rows = E;
        d.k = F;
        d.x_per_slot = 1;
        d.ids = e->dslot;
        d.n_tok = n;
        d.n_used = K;
        d.y = e->ey;
        st = quantize(e, d.wtype, e->eg, F, (int64_t)n * K, &d.act, err);
        if (st == HM_OK) st = cuda_moe_matvec(&d, e->stream, err);
    }
    if (st == HM_OK && L->down_exps_b.d && !defer_down_bias)
        st = cuda_moe_add_bias(e->ey, (const float *)L->down_exps_b.d, e->dslot, n, K, E, NS,
                               e->stream, err);
    return st;
}

/* The shared expert's output of xn into sh [n][E] and its gate logit into e->sgate (xn's
 * activation rows quantised again: the routed experts' down product has reused e->act). */
static hm_status shared_expert(cuda_engine *e, const cuda_layer *L, int n, float *sh,
                               hm_error *err) {
    const int64_t Sf = e->hp.n_ff_shexp;
    const cuda_tensor *w[3] = {&L->sh_gate, &L->sh_up, &L->sh_gate_inp};
    float *const y[3] = {e->sg, e->su, e->sgate};
    hm_status st = linears(e, L->sh_gate_inp.d ? 3 : 2, w, NULL, y, e->xn, NULL, n, err);
    if (st == HM_OK && fused_step(n) && !f32_acts(L->sh_down.type, Sf) &&
        !use_gemm(e, &L->sh_down, n)) { /* SwiGLU inside the down input's quantisation */
        st = cuda_quantize_act_glu(L->sh_down.type, e->sg, e->su, Sf, n, e->act, e->stream, err);
        return st == HM_OK ? linear(e, &L->sh_down, NULL, e->sg, n, sh, e->act, err) : st;
    }
    if (st == HM_OK) st = cuda_swiglu(e->sg, e->su, e->sg, n * Sf, e->stream, err);
    if (st == HM_OK) st = linear(e, &L->sh_down, NULL, e->sg, n, sh, NULL, err);
    return st;
}

/* A host layer's experts (cuda_handoff.h): the request to the CPU, the shared expert (if any)
 * into e->hsh while the CPU works, the wait, the CPU's slot outputs (expert biases included)
 * into e->ey; a prompt ubatch with staging buffers also runs the experts the CPU side fetched
 * (cuda_fetch.h) on the GPU. */
static hm_status host_experts(cuda_engine *e, const cuda_layer *L, int il, int n,
                              hm_error *err) {
    const bool fetch = cuda_fetch_active(e, il, n);
    hm_status st = cuda_handoff_enqueue_post(e, il, n, fetch, false, err);
    if (st == HM_OK && e->desc->shared_expert) st = shared_expert(e, L, n, e->hsh, err);
    if (st == HM_OK) st = cuda_handoff_enqueue_wait(e, il, err);
    if (st == HM_OK)
        st = fetch ? cuda_fetch_enqueue_experts(e, il, n, err)
                   : cuda_handoff_enqueue_take(e, n, false, err);
    if (st == HM_OK && !fetch && cuda_postfetch_active(e, il, n))
        st = cuda_postfetch_enqueue(e, il, n, err);
    return st;
}

/* A mixed layer's experts (the hot cache): the request names the cold slots (no device slot),
 * the GPU computes the hot ones meanwhile (its kernels skip slots < 0; down bias included, so
 * the merge adds none), then the wait and the CPU's cold slots into e->ey — in a prompt ubatch
 * with staging buffers also the cold experts the CPU side fetched (cuda_fetch.h), the hot slots
 * left alone; every slot of ey is then one lane's output and the merge sums them in order. */
static hm_status mixed_experts(cuda_engine *e, const cuda_layer *L, int il, int n,
                               const void *xact, hm_error *err) {
    const bool fetch = cuda_fetch_active(e, il, n); /* a prompt ubatch: cold experts fetched */
    hm_status st = cuda_handoff_enqueue_post(e, il, n, fetch, true, err);
    if (st == HM_OK) st = experts(e, L, n, xact, false, false, err);
    if (st == HM_OK) st = cuda_handoff_enqueue_wait(e, il, err);
    if (st == HM_OK)
        st = fetch ? cuda_fetch_enqueue_experts(e, il, n, err)
                   : cuda_handoff_enqueue_take(e, n, true, err);
    if (st == HM_OK && !fetch && cuda_postfetch_active(e, il, n))
        st = cuda_postfetch_enqueue(e, il, n, err);
    return st;
}

static hm_status moe_block(cuda_engine *e, int il, int n, fwd_defer *dfr, hm_error *err) {
    const hm_hparams *hp = &e->hp;
    const hm_arch_desc *d = e->desc;
    const cuda_layer *L = &e->layers[il];
    const int K = (int)hp->n_expert_used;
    const int64_t E = hp->n_embd;

    const bool fz = fused_step(n);
    /* the router always through the matvec kernels: its logits are the CPU's bytes, so the
     * discrete expert choice does not move with the GEMM's f16 rounding (a small product).
     * Decode: the norm kernel quantises for the experts' gate when the router reads f32 rows
     * or the same format (xact), else for the router. */
    const quant_act rfmt = quant_act_for(L->router.type);
    const void *ract = NULL, *xact = NULL;
    cpu_gate_mode gm = d->gating == HM_GATING_TOPK_SOFTMAX ? CPU_GATE_TOPK_SOFTMAX
                                                           : CPU_GATE_SOFTMAX_TOPK;
    const int renorm = d->gating == HM_GATING_SOFTMAX_TOPK_NORM;
    cuda_route_out ro; /* besides ids and weights: the device slots, the routing counts */
    memset(&ro, 0, sizeof(ro));
    ro.slot_of = L->slot_of;
    ro.dslot = e->dslot;
    if (e->counting && !e->d_route_table) { /* a route table counts its own ids */
        ro.hits = e->d_hits + (size_t)il * (size_t)hp->n_expert;
        ro.stat = e->d_stat + 2 * (size_t)il;
    }
    hm_status st = HM_OK;
    const bool in_router = norm_in_router(e, L, n);
    if (in_router) {
        ract = e->x; /* the router normalises it (the o product added the residual) */
        xact = f32_acts(L->gate_exps.type, E) ? (const void *)e->xn : e->act;
    } else if (fz && (rfmt == QUANT_ACT_F32 || rfmt == quant_act_for(L->gate_exps.type))) {
        st = norm_step(e, n, dfr, &L->ffn_norm, L->gate_exps.type, &xact, err);
        ract = rfmt == QUANT_ACT_F32 ? (const void *)e->xn : xact;
    } else {
        st = norm_step(e, n, dfr, &L->ffn_norm, L->router.type, &ract, err);
    }
    if (st == HM_OK && fz && fused_router_ok(e, L)) {
        /* logits and top-k in one launch (f32 router: ract is xn, or x with the norm in front) */
        cuda_fused_router_args ra;
        memset(&ra, 0, sizeof(ra));
        ra.w = (const float *)L->router.d;
        ra.n_expert = hp->n_expert;
        ra.k = E;
        ra.x = (const float *)ract;
        ra.n_tok = n;
        ra.bias = (const float *)L->router_b.d;
        ra.n_used = K;
        ra.mode = gm;
        ra.renorm = renorm;
        ra.logits = e->router;
        ra.d_ids = e->ids;
        ra.d_weights = e->gw;
        ra.d_sync = e->router_sync;
        ra.out = ro;
        if (in_router) {
            ra.norm_w = (const float *)L->ffn_norm.d;
            ra.eps = hp->rms_eps;
            ra.xn = e->xn;
            ra.wtype = L->gate_exps.type;
            ra.act = e->act; /* not written for float types */
        }
        st = cuda_fused_router(&ra, e->stream, err);
    } else {
        if (st == HM_OK)
            st = cuda_matvec(L->router.type, L->router.d, L->router.ne[1], E, ract, n,
                             e->router, e->stream, err);
        if (st == HM_OK)
            st = cuda_router(e->router, (const float *)L->router_b.d, n, (int)hp->n_expert, K,
                             gm, renorm, e->ids, e->gw, &ro, e->stream, err);
    }
    if (st == HM_OK && e->d_route_table) st = cuda_route_table_enqueue(e, il, n, err);
    /* decode: the combine (and down bias, and the shared expert's term) go into the next norm */
    const bool defer = fz;
    if (st == HM_OK)
        st = L->host    ? host_experts(e, L, il, n, err)
             : L->mixed ? mixed_experts(e, L, il, n, xact, err)
                        : experts(e, L, n, xact, defer, false, err);
    if (st != HM_OK) return st;
    if (defer) { /* the CPU's slot outputs include the down bias already */
        if (d->shared_expert && !L->host) st = shared_expert(e, L, n, e->hsh, err);
        dfr->combine = true;
        dfr->ey_bias = L->host || L->mixed ? NULL : (const float *)L->down_exps_b.d;
        dfr->n_slots = L->n_slots;
        dfr->sh = d->shared_expert ? e->hsh : NULL;
        return st;
    }
    st = cuda_moe_combine(e->ey, e->gw, e->ids, n, K, E, e->proj, e->stream, err);
    if (st == HM_OK && d->shared_expert) {
        float *sh = L->host ? e->hsh : e->ey; /* ey [n][E]: the slot outputs are consumed */
        if (!L->host) st = shared_expert(e, L, n, sh, err);
        if (st == HM_OK) st = cuda_shexp_combine(e->proj, sh, e->sgate, n, E, e->stream, err);
    }
    if (st == HM_OK && fz) {
        dfr->add = e->proj;
        return HM_OK;
    }
    if (st == HM_OK) st = cuda_add(e->x, e->proj, e->x, n * E, e->stream, err);
    return st;
}

extern "C" int cuda_engine_glu(const cuda_engine *e) {
    return e->desc->swiglu == HM_SWIGLU_OAI    ? CPU_GLU_OAI
           : e->desc->swiglu == HM_SWIGLU_GELU ? CPU_GLU_GELU
                                               : CPU_GLU_SILU;
}

extern "C" hm_status cuda_engine_experts_step(cuda_engine *e, int il, int n, hm_error *err) {
    const cuda_layer *L = &e->layers[il];
    return L->host    ? host_experts(e, L, il, n, err)
           : L->mixed ? mixed_experts(e, L, il, n, NULL, err)
                      : experts(e, L, n, NULL, false, false, err);
}

extern "C" hm_status cuda_engine_enqueue_experts(cuda_engine *e, int il, int n_tok,
                                                 hm_error *err) {
    if (e->layers[il].host)
        return hm_error_set(err, HM_ERR_STATE, "GPU: layer %d keeps its experts in host memory",
                            il);
    hm_status st = experts(e, &e->layers[il], n_tok, NULL, false, true, err);
    return st == HM_OK ? launched("expert FFN", err) : st;
}

extern "C" hm_status cuda_engine_enqueue_forward(cuda_engine *e, const int32_t *d_tokens,
                                                 int n_tok, hm_error *err) {
    if (n_tok <= 0 || n_tok > e->p.n_ubatch)
        return hm_error_set(err, HM_ERR_ARG, "GPU: %d tokens in one step (1..%d)", n_tok,
                            e->p.n_ubatch);
    if (d_tokens && e->p.layer_begin > 0)
        return hm_error_set(err, HM_ERR_STATE, "GPU: the engine starts at layer %d: its input "
                            "is hidden rows, not token ids", e->p.layer_begin);
    hm_status st0 = cuda_handoff_ready(e, err); /* host layers need a CPU side attached */
    if (st0 != HM_OK) return st0;
    cu_launch(k_positions, (n_tok + 127) / 128, 128, 0, S(e), e->d_pos, e->d_positions, n_tok,
              e->n_host ? e->d_seq : (uint32_t *)NULL);
    hm_status st = launched("k_positions", err);
    if (st == HM_OK && e->desc->hybrid && e->n_runs == 0) st = cuda_engine_runs_single(e, n_tok, err);
    if (st == HM_OK && e->n_runs > 0 && /* several sequences: their own positions */
        cudaMemcpyAsync(e->d_positions, e->h_positions, sizeof(int32_t) * (size_t)n_tok,
                        cudaMemcpyHostToDevice, S(e)) != cudaSuccess)
        st = hm_error_set(err, HM_ERR_CUDA, "GPU: positions upload: %s",
                          cudaGetErrorString(cudaGetLastError()));
    if (st == HM_OK && d_tokens) /* else: the input rows are in e->x */
        st = cuda_get_rows(e->tok_embd.type, e->tok_embd.d, e->tok_embd.row_size, d_tokens, n_tok,
                           e->hp.n_embd, e->x, e->stream, err);
    const bool g4 = e->desc->gemma4;
    if (st == HM_OK && d_tokens && g4) st = cuda_engine_gemma4_embed(e, n_tok, err);
    fwd_defer dfr;
    memset(&dfr, 0, sizeof(dfr));
    for (int il = e->p.layer_begin; il < e->hp.n_layer && st == HM_OK; il++) {
        if (g4) {
            st = cuda_engine_gemma4_layer(e, il, n_tok, err);
            continue;
        }
        st = attention_block(e, il, n_tok, &dfr, err);
        if (st == HM_OK) st = moe_block(e, il, n_tok, &dfr, err);
    }
    if (st == HM_OK) st = norm_step(e, n_tok, &dfr, NULL, 0, NULL, err); /* the last residual */
    return st;
}

extern "C" hm_status cuda_engine_enqueue_logits(cuda_engine *e, int row0, int n_rows,
                                                hm_error *err) {
    if (row0 < 0 || n_rows <= 0 || n_rows > e->n_logit_rows || row0 + n_rows > e->p.n_ubatch)
        return hm_error_set(err, HM_ERR_ARG, "GPU: logits rows %d..%d", row0, row0 + n_rows);
    const int64_t E = e->hp.n_embd;
    const size_t arow = cuda_act_row_bytes(e->output.type, E);
    if (fused_step(n_rows) && E <= CUDA_FUSED_NORM_MAX && arow &&
        !use_gemm(e, &e->output, n_rows)) { /* norm + quantisation in one launch */
        cuda_fused_norm_args a;
        memset(&a, 0, sizeof(a));
        a.x = e->x + (int64_t)row0 * E;
        a.norm_w = (const float *)e->output_norm.d;
        a.eps = e->hp.rms_eps;
        a.xn = e->xn;
        a.wtype = e->output.type;
        const bool f32 = f32_acts(e->output.type, E);
        a.act = f32 ? NULL : e->act;
        a.n_tok = n_rows;
        a.n = E;
        a.d_sync = e->norm_sync;
        hm_status st = cuda_fused_norm_quant(&a, e->stream, err);
        if (st == HM_OK)
            st = linear(e, &e->output, NULL, e->xn, n_rows, e->d_logits,
                        f32 ? (const void *)e->xn : (const void *)e->act, err);
        return st == HM_OK ? cuda_engine_softcap(e, n_rows, err) : st;
    }
    hm_status st = cuda_rmsnorm(e->x + (int64_t)row0 * E, (const float *)e->output_norm.d, e->xn,
                                n_rows, E, e->hp.rms_eps, e->stream, err);
    if (st == HM_OK) st = linear(e, &e->output, NULL, e->xn, n_rows, e->d_logits, NULL, err);
    return st == HM_OK ? cuda_engine_softcap(e, n_rows, err) : st;
}

extern "C" hm_status cuda_engine_enqueue_advance(cuda_engine *e, int n, hm_error *err) {
    cu_launch(k_advance, 1, 1, 0, S(e), e->d_pos, n);
    return launched("k_advance", err);
}

extern "C" hm_status cuda_engine_enqueue_step(cuda_engine *e, const int32_t *d_tokens, int n_tok,
                                              hm_error *err) {
    hm_status st = cuda_engine_enqueue_forward(e, d_tokens, n_tok, err);
    if (st == HM_OK) st = cuda_engine_enqueue_logits(e, n_tok - 1, 1, err);
    if (st == HM_OK) st = cuda_engine_enqueue_advance(e, n_tok, err);
    return st;
}
