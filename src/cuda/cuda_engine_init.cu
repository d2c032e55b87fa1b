/* cuda_engine_init.cu - the engine's memory: admission control, the weight upload, the KV cache,
 * the scratch buffers (the host API that runs steps: cuda_engine_api.cu).
 *
 * DESIGN: cuda_engine_plan walks every tensor the forward pass reads (a macro list of the layer
 * fields, so the plan, the upload and the type checks cannot disagree) and sums three sizes:
 * weights (one arena, each tensor 256-byte aligned), KV (f16/f32 K and V rows, n_ctx positions per
 * layer) and scratch (the CPU context's buffers for n_ubatch tokens plus quantised activations,
 * GEMM scratch and the logits rows). Init compares the sum with cudaMemGetInfo before
 * allocating anything and says by how many MiB it is short. The upload copies each tensor from
 * the mapped file into one of two pinned staging buffers (16 MiB) and enqueues the
 * host-to-device copy; the other buffer is filled meanwhile (an event per buffer orders reuse).
 * The expert tensors of a layer (LAYER_EXPERTS) follow the residency map: an arena of n_slots
 * experts each, expert e's bytes copied to its slot (runs of consecutive slots in one piece, so
 * the identity map uploads each tensor as one piece, as before), and the map's slot array goes
 * to the device as the expert->slot table the router reads (cuda_engine.h). An engine with
 * layer_begin k > 0 plans, uploads and gives KV to layers [k, n_layer) and the output only (no
 * token embeddings); its input rows come from the host through a pinned buffer allocated at
 * the first cuda_engine_decode_rows.
 *
 * Module loading: CUDA loads kernels lazily by default, and the first launch of a kernel loads
 * its module under the context's lock after the GPU's queue drains. In the tiered step a kernel
 * spins on the GPU until the CPU answers, and for prompt batches the CPU's answer needs CUDA
 * calls (the copies of fetched experts): a first launch enqueued behind the spinning kernel then
 * holds the lock the copies wait for, and neither side moves (the step times out). So the
 * library asks for eager loading before the first CUDA call of the process (a constructor, run
 * at program start), unless CUDA_MODULE_LOADING is already set; the cost is the loading of every
 * kernel at the first CUDA call.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "base/log.h"
#include "cuda/cuda_attn.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_engine_internal.h"
#include "cuda/cuda_gemm.h"
#include "cuda/cuda_quant.h"
#include "quant/qtypes.h"
}

/* see DESIGN, "Module loading" */
__attribute__((constructor)) static void cuda_module_loading_eager(void) {
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}

#define LAYER_VECTORS(X)                                                                         \
    X(attn_norm) X(bq) X(bk) X(bv) X(bo) X(q_norm) X(k_norm) X(sinks) X(ffn_norm) X(router_b)   \
    X(ssm_conv1d) X(ssm_dt) X(ssm_a) X(ssm_norm) X(attn_post_norm) X(ffn_post_norm1)            \
    X(ffn_pre_norm2) X(ffn_post_norm2) X(ffn_post_norm) X(router_scale) X(down_exps_scale)      \
    X(out_scale)
#define LAYER_MATRICES(X)                                                                        \
    X(wq) X(wk) X(wv) X(wo) X(router) X(sh_gate) X(sh_up) X(sh_down) X(sh_gate_inp)             \
    X(ssm_qkv) X(ssm_gate) X(ssm_ba) X(ssm_beta) X(ssm_alpha) X(ssm_out) X(ffn_gate) X(ffn_up)  \
    X(ffn_down)
/* per-expert tensors, stored by device slot; V: a vector per expert (read as f32) */
#define LAYER_EXPERTS(X, V)                                                                      \
    X(gate_exps) X(up_exps) X(down_exps) V(gate_exps_b) V(up_exps_b) V(down_exps_b)

static const size_t k_align = 256;
static const size_t k_stage_bytes = 16u << 20;

static size_t align_up(size_t n) { return (n + k_align - 1) & ~(k_align - 1); }

size_t cuda_tensor_bytes(const hm_tensor *t) {
    if (!t->data) return 0;
    return hm_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] ? t->ne[1] : 1) *
           (size_t)(t->ne[2] ? t->ne[2] : 1) * (size_t)(t->ne[3] ? t->ne[3] : 1);
}

/* A vector read as f32 by the element-wise kernels. */
static hm_status check_vector(const hm_tensor *t, hm_error *err) {
    if (t->data && t->type != HM_TYPE_F32)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "GPU: tensor %s has type %s (the GPU "
                            "engine reads vectors as f32)", t->name, hm_type_name(t->type));
    return HM_OK;
}

/* A matrix read by the matvec / GEMM kernels (or get_rows for the embeddings). */
static hm_status check_matrix(const hm_tensor *t, hm_error *err) {
    if (t->data && cuda_act_row_bytes(t->type, t->ne[0]) == 0)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "GPU: no kernel for type %s (tensor %s)",
                            hm_type_name(t->type), t->name);
    return HM_OK;
}

/* The output matrix is the token embeddings (gemma4, tied files) and those are on the device:
 * one copy serves both. */
static bool output_tied(const hm_model *m, const cuda_engine_params *p) {
    return p->layer_begin == 0 && hm_model_output(m)->data == hm_model_tok_embd(m)->data;
}

/* The largest kv heads x head size of any layer kind, and the largest head size. */
static void kv_widths(const hm_model *m, int64_t *kv_w, int64_t *hd_max) {
    const hm_hparams *hp = hm_model_hparams(m);
    *kv_w = 0;
    *hd_max = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        int64_t nkv, hd;
        hm_model_layer_kv(m, il, &nkv, &hd);
        if (nkv * hd > *kv_w) *kv_w = nkv * hd;
        if (hd > *hd_max) *hd_max = hd;
    }
}

/* Whether layer il of m is a host layer under p's map: one of the engine's layers (il >=
 * layer_begin) that has experts, none of which has a device slot (they are computed by the CPU
 * through the hand-off, cuda_handoff.h). */
static bool host_layer(const hm_model *m, const cuda_engine_params *p, int il) {
    const hm_residency *r = p->res;
    if (!r || il < p->layer_begin || !hm_model_layer(m, il)->gate_exps.data) return false;
    return hm_residency_n_device(r, il) == 0;
}

/* Some of the layer's experts have a device slot, not all (cuda_layer.mixed). */
static bool mixed_layer(const hm_model *m, const cuda_engine_params *p, int il) {
    const hm_residency *r = p->res;
    if (!r || il < p->layer_begin || !hm_model_layer(m, il)->gate_exps.data) return false;
    const int nd = hm_residency_n_device(r, il);
    return nd > 0 && nd < r->n_expert;
}

/* Scratch: the buffers of cuda_engine_internal.h in one arena; sets the pointers when base is
 * given, returns the bytes. */
static size_t layout_scratch(const hm_model *m, const cuda_engine_params *p, cuda_engine *e,
                             char *base) {
    const hm_hparams *hp = hm_model_hparams(m);
    const int64_t nu = p->n_ubatch, E = hp->n_embd, K = hp->n_expert_used, F = hp->n_ff_exp;
    int64_t kv_w, hd_max; /* K and V heads alike (cuda_engine_plan) */
    kv_widths(m, &kv_w, &hd_max);
    const int64_t nq = hp->n_head * hd_max, nk = kv_w, nv = kv_w, nqv = nq;
    const bool g4 = hm_model_arch(m)->gemma4;
    const int64_t nsf = g4 ? hp->n_ff : hp->n_ff_shexp; /* sg, su: the dense MLP's, or the shared
                                                          * expert's */
    const int64_t n_logit = nu < 64 ? nu : 64;
    const cuda_hybrid_dims hy = cuda_hybrid_dims_of(hm_model_arch(m), hp);
    const bool hsh = hm_model_arch(m)->shared_expert; /* its output waits for the next norm */
    /* quantised activations: the largest [rows][k] input of any product */
    size_t act = 0, gemm = 0;
    const hm_tensor *out = hm_model_output(m);
    act = cuda_act_row_bytes(out->type, E) * (size_t)n_logit;
    gemm = cuda_gemm_scratch_size(E, n_logit);
    for (int il = 0; il < hp->n_layer; il++) {
        const hm_layer *L = hm_model_layer(m, il);
        const hm_tensor *dense[] = {&L->wq,      &L->wk,       &L->wv,        &L->wo,
                                    &L->router,  &L->sh_gate,  &L->sh_up,     &L->sh_down,
                                    &L->sh_gate_inp, &L->ssm_qkv, &L->ssm_gate, &L->ssm_ba,
                                    &L->ssm_beta, &L->ssm_alpha, &L->ssm_out, &L->ffn_gate,
                                    &L->ffn_up,  &L->ffn_down};
        for (size_t i = 0; i < sizeof(dense) / sizeof(dense[0]); i++) {
            if (!dense[i]->data) continue;
            size_t a = cuda_act_row_bytes(dense[i]->type, dense[i]->ne[0]) * (size_t)nu;
            size_t g = cuda_gemm_scratch_size(dense[i]->ne[0], nu);
            act = a > act ? a : act;
            gemm = g > gemm ? g : gemm;
        }
        const hm_tensor *ex[] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int i = 0; i < 3; i++) {
            size_t a = cuda_act_row_bytes(ex[i]->type, ex[i]->ne[0]) * (size_t)(nu * (i == 2 ? K : 1));
            cuda_gemm_moe_args ga;
            memset(&ga, 0, sizeof(ga));
            ga.k = ex[i]->ne[0];
            ga.n_tok = nu;
            ga.n_used = (int)K;
            ga.n_expert = hp->n_expert;
            ga.x_per_slot = i == 2;
            size_t g = cuda_gemm_moe_scratch_size(&ga);
            act = a > act ? a : act;
            gemm = g > gemm ? g : gemm;
        }
    }
    size_t attn = 0;
    for (int kind = 0; kind < (g4 ? 2 : 1); kind++) { /* the full layers', gemma4's sliding */
        cuda_attn_args aa;
        memset(&aa, 0, sizeof(aa));
        aa.n_head = (int)hp->n_head;
        aa.n_head_kv = (int)(kind ? hp->n_head_kv_swa : hp->n_head_kv);
        aa.head_dim = (int)(kind ? hp->head_dim_swa : hp->head_dim_k);
        aa.n_ctx = p->n_ctx;
        for (int64_t t = 1; t <= nu; t++) {
            aa.n_tok = t;
            size_t a = cuda_attention_scratch_size(&aa);
            if (p->n_seq > 1) { /* t sequences' tokens at once (cuda_attention_runs) */
                const size_t r = cuda_attention_runs_scratch_size(&aa);
                a = r > a ? r : a;
            }
            attn = a > attn ? a : attn;
        }
    }
    struct {
        void **ptr;
        size_t bytes;
    } bufs[] = {
        {e ? (void **)&e->x : NULL, sizeof(float) * (size_t)(nu * E)},
        {e ? (void **)&e->xn : NULL, sizeof(float) * (size_t)(nu * E)},
        {e ? (void **)&e->q : NULL, sizeof(float) * (size_t)(nu * nq)},
        {e ? (void **)&e->k : NULL, sizeof(float) * (size_t)(nu * nk)},
        {e ? (void **)&e->v : NULL, sizeof(float) * (size_t)(nu * nv)},
        {e ? (void **)&e->attn : NULL, sizeof(float) * (size_t)(nu * nqv)},
        {e ? (void **)&e->proj : NULL, sizeof(float) * (size_t)(nu * E)},
        {e ? (void **)&e->router : NULL, sizeof(float) * (size_t)(nu * hp->n_expert)},
        {e ? (void **)&e->ids : NULL, sizeof(int32_t) * (size_t)(nu * K)},
        {e ? (void **)&e->dslot : NULL, sizeof(int32_t) * (size_t)(nu * K)},
        {e ? (void **)&e->gw : NULL, sizeof(float) * (size_t)(nu * K)},
        {e ? (void **)&e->eg : NULL, sizeof(float) * (size_t)(nu * K * F)},
        {e ? (void **)&e->eu : NULL, sizeof(float) * (size_t)(nu * K * F)},
        {e ? (void **)&e->ey : NULL, sizeof(float) * (size_t)(nu * K * E)},
        {e ? (void **)&e->sg : NULL, sizeof(float) * (size_t)(nu * nsf)},
        {e ? (void **)&e->su : NULL, sizeof(float) * (size_t)(nu * nsf)},
        {e ? (void **)&e->sgate : NULL, sizeof(float) * (size_t)nu},
        {e ? (void **)&e->act : NULL, act},
        {e ? (void **)&e->gemm_scratch : NULL, gemm},
        {e ? (void **)&e->attn_scratch : NULL, attn},
        {e ? (void **)&e->norm_sync : NULL, sizeof(int) * 2 * (size_t)nu},
        {e ? (void **)&e->router_sync : NULL, sizeof(int) * (size_t)(nu / 8 + 1)},
        {e ? (void **)&e->d_rope : NULL, sizeof(float) * (size_t)(p->n_ctx * (hp->n_rot / 2) * 2)},
        {e ? (void **)&e->d_rope_swa : NULL,
         g4 ? sizeof(float) * (size_t)(p->n_ctx * (hp->n_rot_swa / 2) * 2) : 0},
        {e ? (void **)&e->d_pos : NULL, sizeof(int32_t)},
        {e ? (void **)&e->d_seq : NULL, sizeof(uint32_t)},
        {e ? (void **)&e->hsh : NULL, hsh ? sizeof(float) * (size_t)(nu * E) : 0},
        {e ? (void **)&e->d_positions : NULL, sizeof(int32_t) * (size_t)nu},
        {e ? (void **)&e->d_base : NULL, sizeof(int32_t) * (size_t)nu},
        {e ? (void **)&e->d_tokens : NULL, sizeof(int32_t) * (size_t)nu},
        {e ? (void **)&e->d_slot_of : NULL,
         sizeof(int32_t) * (size_t)(hp->n_layer * hp->n_expert)},
        {e ? (void **)&e->d_logits : NULL, sizeof(float) * (size_t)(n_logit * hp->n_vocab)},
        {e ? (void **)&e->hy_qkv : NULL, sizeof(float) * (size_t)(nu * hy.cd)},
        {e ? (void **)&e->hy_z : NULL, sizeof(float) * (size_t)(nu * hy.vd)},
        {e ? (void **)&e->hy_ba : NULL, sizeof(float) * (size_t)(nu * 2 * hy.nv)},
        {e ? (void **)&e->hy_o : NULL,
         sizeof(float) * (size_t)(nu * (hy.vd > 2 * hy.nq ? hy.vd : 2 * hy.nq))},
        {e ? (void **)&e->hy_gate : NULL, sizeof(float) * (size_t)(nu * hy.nq)},
        {e ? (void **)&e->d_runs : NULL, hy.cd ? sizeof(int32_t) * 3 * (size_t)nu : 0},
    };
    size_t off = 0;
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        if (base && bufs[i].ptr) *bufs[i].ptr = bufs[i].bytes ? base + off : NULL;
        off += align_up(bufs[i].bytes ? bufs[i].bytes : 1);
    }
    if (e) {
        e->act_bytes = act;
        e->gemm_scratch_bytes = gemm;
        e->attn_scratch_bytes = attn;
        e->n_logit_rows = (int)n_logit;
    }
    return off;
}

/* The residency map against the model: its shape, its consistency, and, for every layer of the
 * engine that has experts, either a device slot for each expert or none at all (a host layer; a
 * layer split between host and device is not supported yet). */
static hm_status check_residency(const hm_model *m, const cuda_engine_params *p, hm_error *err) {
    const hm_residency *r = p->res;
    if (!r) return HM_OK;
    const hm_hparams *hp = hm_model_hparams(m);
    if (r->n_layer != hp->n_layer || r->n_expert != hp->n_expert)
        return hm_error_set(err, HM_ERR_ARG, "expert residency: a map of %d layers x %d experts "
                            "for a model of %lld x %lld", r->n_layer, r->n_expert,
                            (long long)hp->n_layer, (long long)hp->n_expert);
    return hm_residency_check(r, err); /* mixed layers: hot slots here, cold ones on the CPU */
}

extern "C" hm_status cuda_engine_plan(const hm_model *m, const cuda_engine_params *p,
                                      uint64_t *weights, uint64_t *kv, uint64_t *scratch,
                                      hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(m);
    if (p->n_ctx <= 0 || p->n_ubatch <= 0)
        return hm_error_set(err, HM_ERR_ARG, "GPU: n_ctx and n_ubatch must be > 0");
    if (p->layer_begin < 0 || p->layer_begin > hp->n_layer)
        return hm_error_set(err, HM_ERR_ARG, "GPU: first layer %d of a model of %lld layers",
                            p->layer_begin, (long long)hp->n_layer);
    const bool embd = p->layer_begin == 0; /* token ids in: the embeddings on the device */
    if (hp->head_dim_k != hp->head_dim_v)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "GPU: key and value head sizes differ "
                            "(%lld, %lld)", (long long)hp->head_dim_k, (long long)hp->head_dim_v);
    hm_status st = cuda_kv_check(p->type_k, p->type_v, (int)hp->n_head_kv, (int)hp->head_dim_k,
                                 err);
    if (st == HM_OK && hm_model_arch(m)->gemma4) /* the sliding layers' kind */
        st = cuda_kv_check(p->type_k, p->type_v, (int)hp->n_head_kv_swa, (int)hp->head_dim_swa,
                           err);
    if (st != HM_OK) return st;
    st = check_residency(m, p, err);
    if (st == HM_OK && embd) st = check_matrix(hm_model_tok_embd(m), err);
    if (st == HM_OK) st = check_matrix(hm_model_output(m), err);
    if (st == HM_OK) st = check_vector(hm_model_output_norm(m), err);
    uint64_t w = (embd ? align_up(cuda_tensor_bytes(hm_model_tok_embd(m))) : 0) +
                 (output_tied(m, p) ? 0 : align_up(cuda_tensor_bytes(hm_model_output(m)))) +
                 align_up(cuda_tensor_bytes(hm_model_output_norm(m)));
    for (int il = p->layer_begin; il < hp->n_layer && st == HM_OK; il++) {
        const hm_layer *L = hm_model_layer(m, il);
        const bool host = host_layer(m, p, il);
        const int64_t ns = host ? 0 : p->res ? p->res->n_slots[il] : hp->n_expert;
        if (L->recurrent && !L->ssm_qkv.data)
            st = hm_error_set(err, HM_ERR_UNSUPPORTED, "GPU: layer %d's delta net has the older "
                              "fused ssm_in (the GPU engine reads attn_qkv and attn_gate)", il);
#define CHECK_V(f)                                                                               \
    if (st == HM_OK) st = check_vector(&L->f, err);                                            \
    w += align_up(cuda_tensor_bytes(&L->f));
#define CHECK_M(f)                                                                               \
    if (st == HM_OK) st = check_matrix(&L->f, err);                                            \
    w += align_up(cuda_tensor_bytes(&L->f));
/* a host layer's experts are read by the CPU only: no GPU kernel needed, no device bytes */
#define CHECK_XV(f)                                                                              \
    if (st == HM_OK && !host) st = check_vector(&L->f, err);                                   \
    w += align_up(cuda_tensor_bytes(&L->f) / (size_t)hp->n_expert * (size_t)ns);
#define CHECK_XM(f)                                                                              \
    if (st == HM_OK && !host) st = check_matrix(&L->f, err);                                   \
    w += align_up(cuda_tensor_bytes(&L->f) / (size_t)hp->n_expert * (size_t)ns);
        LAYER_VECTORS(CHECK_V)
        LAYER_MATRICES(CHECK_M)
        LAYER_EXPERTS(CHECK_XM, CHECK_XV)
#undef CHECK_V
#undef CHECK_M
#undef CHECK_XV
#undef CHECK_XM
    }
    if (st != HM_OK) return st;
    uint64_t k = 0;
    const uint64_t rows = (uint64_t)p->n_ctx * (uint64_t)(p->n_seq > 1 ? p->n_seq : 1);
    const cuda_hybrid_dims hy = cuda_hybrid_dims_of(hm_model_arch(m), hp);
    const uint64_t n_seq = (uint64_t)(p->n_seq > 1 ? p->n_seq : 1);
    for (int il = p->layer_begin; il < hp->n_layer; il++) {
        int64_t nkv, hd;
        hm_model_layer_kv(m, il, &nkv, &hd);
        k += hm_model_layer(m, il)->recurrent
                 ? align_up(sizeof(float) * (size_t)hy.rs_floats * n_seq)
                 : align_up(cuda_kv_bytes(p->type_k, 1, (int)nkv, (int)hd) * rows) +
                       align_up(cuda_kv_bytes(p->type_v, 1, (int)nkv, (int)hd) * rows);
    }
    if (weights) *weights = w;
    if (kv) *kv = k;
    if (scratch) *scratch = layout_scratch(m, p, NULL, NULL);
    return HM_OK;
}

#define CUDA_TRY(call, what)                                                                     \
    do {                                                                                         \
        cudaError_t ce_ = (call);                                                                \
        if (ce_ != cudaSuccess) {                                                                \
            st = hm_error_set(err, HM_ERR_CUDA, "GPU: %s: %s", what, cudaGetErrorString(ce_));  \
            goto fail;                                                                           \
        }                                                                                        \
    } while (0)

/* Copies host tensors into the arena through two pinned staging buffers. */
typedef struct {
    char *stage[2];
    cudaEvent_t done[2];
    int cur;
    size_t used;
    cudaStream_t s;
    char *arena;
    size_t off;
} uploader;

/* Copies n bytes from host src to device d (enqueued; src may be reused once this returns). */
static hm_status upload_bytes(uploader *u, char *d, const char *src, size_t n, const char *name,
                              hm_error *err) {
    for (size_t done = 0; done < n;) {
        if (u->used == k_stage_bytes) { /* switch buffers: wait until the other one is free */
            u->cur ^= 1;
            u->used = 0;
            cudaError_t ce = cudaEventSynchronize(u->done[u->cur]);
            if (ce != cudaSuccess)
                return hm_error_set(err, HM_ERR_CUDA, "GPU: upload: %s", cudaGetErrorString(ce));
        }
        size_t c = n - done < k_stage_bytes - u->used ? n - done : k_stage_bytes - u->used;
        char *buf = u->stage[u->cur] + u->used;
        memcpy(buf, src + done, c);
        cudaError_t ce = cudaMemcpyAsync(d + done, buf, c, cudaMemcpyHostToDevice, u->s);
        if (ce == cudaSuccess) ce = cudaEventRecord(u->done[u->cur], u->s);
        if (ce != cudaSuccess)
            return hm_error_set(err, HM_ERR_CUDA, "GPU: upload of %s: %s", name,
                                cudaGetErrorString(ce));
        u->used += c;
        done += c;
    }
    return HM_OK;
}

static void tensor_meta(const hm_tensor *t, cuda_tensor *dst) {
    dst->name = t->name;
    dst->type = t->type;
    memcpy(dst->ne, t->ne, sizeof(dst->ne));
    dst->row_size = t->row_size;
    dst->d = NULL;
}

static hm_status upload_tensor(uploader *u, const hm_tensor *t, cuda_tensor *dst, hm_error *err) {
    tensor_meta(t, dst);
    const size_t n = cuda_tensor_bytes(t);
    if (!n) return HM_OK;
    char *d = u->arena + u->off;
    dst->d = d;
    u->off += align_up(n);
    return upload_bytes(u, d, (const char *)t->data, n, t->name, err);
}

/* An expert tensor of n_expert experts into an arena of n_slots: expert e's bytes to slot
 * slot[e] (none when < 0); experts in consecutive slots go in one piece. */
static hm_status upload_experts(uploader *u, const hm_tensor *t, cuda_tensor *dst,
                                int64_t n_expert, const int32_t *slot, int64_t n_slots,
                                hm_error *err) {
    tensor_meta(t, dst);
    const size_t n = cuda_tensor_bytes(t);
    if (!n) return HM_OK;
    const size_t stride = n / (size_t)n_expert;
    /* a view of a fused ffn_gate_up_exps: each expert's rows expert_stride apart in the file,
     * packed here (one piece per expert) */
    const size_t src_stride = t->expert_stride ? t->expert_stride : stride;
    char *d = u->arena + u->off;
    dst->d = d;
    u->off += align_up(stride * (size_t)n_slots);
    const char *src = (const char *)t->data;
    hm_status st = HM_OK;
    for (int64_t ie = 0; ie < n_expert && st == HM_OK;) {
        int64_t run = 1;
        if (slot[ie] >= 0) {
            while (src_stride == stride && ie + run < n_expert && slot[ie + run] == slot[ie] + run)
                run++;
            st = upload_bytes(u, d + (size_t)slot[ie] * stride, src + (size_t)ie * src_stride,
                              (size_t)run * stride, t->name, err);
        }
        ie += run;
    }
    return st;
}

/* Every tensor; slot_of [n_layer][n_expert]: the experts' device slots (host copy). */
static hm_status upload_all(cuda_engine *e, cudaStream_t s, const int32_t *slot_of,
                            hm_error *err) {
    hm_status st = HM_OK;
    uploader u;
    memset(&u, 0, sizeof(u));
    u.s = s;
    u.arena = (char *)e->arena;
    const hm_model *m = e->m;
    for (int i = 0; i < 2 && st == HM_OK; i++) {
        if (cudaMallocHost((void **)&u.stage[i], k_stage_bytes) != cudaSuccess ||
            cudaEventCreateWithFlags(&u.done[i], cudaEventDisableTiming) != cudaSuccess)
            st = hm_error_set(err, HM_ERR_CUDA, "GPU: cannot allocate %zu MiB of pinned memory "
                              "for the upload", k_stage_bytes >> 20);
    }
    if (st == HM_OK && e->p.layer_begin == 0)
        st = upload_tensor(&u, hm_model_tok_embd(m), &e->tok_embd, err);
    if (st == HM_OK && output_tied(m, &e->p)) e->output = e->tok_embd;
    else if (st == HM_OK) st = upload_tensor(&u, hm_model_output(m), &e->output, err);
    if (st == HM_OK) st = upload_tensor(&u, hm_model_output_norm(m), &e->output_norm, err);
    for (int il = e->p.layer_begin; il < e->hp.n_layer && st == HM_OK; il++) {
        const hm_layer *L = hm_model_layer(m, il);
        cuda_layer *D = &e->layers[il];
        const int32_t *slot = slot_of + (size_t)il * (size_t)e->hp.n_expert;
        D->swa = L->swa;
        D->recurrent = L->recurrent;
#define UP(f)                                                                                    \
    if (st == HM_OK) st = upload_tensor(&u, &L->f, &D->f, err);
#define UPX(f)                                                                                   \
    if (st == HM_OK) st = upload_experts(&u, &L->f, &D->f, e->hp.n_expert, slot, D->n_slots, err);
        LAYER_VECTORS(UP)
        LAYER_MATRICES(UP)
        LAYER_EXPERTS(UPX, UPX)
#undef UP
#undef UPX
    }
    cudaError_t ce = cudaStreamSynchronize(s);
    if (st == HM_OK && ce != cudaSuccess)
        st = hm_error_set(err, HM_ERR_CUDA, "GPU: upload: %s", cudaGetErrorString(ce));
    for (int i = 0; i < 2; i++) {
        if (u.stage[i]) cudaFreeHost(u.stage[i]);
        if (u.done[i]) cudaEventDestroy(u.done[i]);
    }
    return st;
}

/* cos/sin of every position 0..n_ctx-1 into d (NULL: none), computed by the CPU's rope
 * (bit-identical rotations). */
static hm_status rope_table_upload(const cuda_engine *e, const cpu_rope_params *rp, float *d,
                                   hm_error *err) {
    size_t bytes = sizeof(float) * (size_t)e->p.n_ctx * (size_t)(rp->n_dims / 2) * 2;
    if (!bytes || !d) return HM_OK;
    float *t = (float *)malloc(bytes);
    if (!t) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (rope table)");
    hm_status st = cuda_rope_table_fill(rp, e->p.n_ctx, t, err);
    if (st == HM_OK) {
        cudaError_t ce = cudaMemcpy(d, t, bytes, cudaMemcpyHostToDevice);
        if (ce != cudaSuccess)
            st = hm_error_set(err, HM_ERR_CUDA, "GPU: rope table: %s", cudaGetErrorString(ce));
    }
    free(t);
    return st;
}

static double mib(uint64_t b) { return (double)b / 1048576.0; }

extern "C" hm_status cuda_engine_init(const hm_model *m, const cuda_engine_params *p,
                                      cuda_engine **out, hm_error *err) {
    *out = NULL;
    uint64_t wb = 0, kvb = 0, sb = 0;
    hm_status st = cuda_engine_plan(m, p, &wb, &kvb, &sb, err);
    if (st != HM_OK) return st;
    cuda_device_info info[16];
    int n_dev = 0;
    st = cuda_device_query(info, 16, &n_dev, err);
    if (st != HM_OK) return st;
    if (n_dev == 0) return hm_error_set(err, HM_ERR_UNSUPPORTED, "no CUDA device");
    if (p->device < 0 || p->device >= n_dev)
        return hm_error_set(err, HM_ERR_ARG, "GPU: device %d does not exist (-mg; %d device%s)",
                            p->device, n_dev, n_dev == 1 ? "" : "s");
    if (p->vram_budget > 0 && wb + kvb + sb > p->vram_budget)
        return hm_error_set(err, HM_ERR_NOMEM, "GPU: need %.0f MiB (weights %.0f + KV cache %.0f "
                            "+ buffers %.0f), more than --vram-budget %.0f MiB", mib(wb + kvb + sb),
                            mib(wb), mib(kvb), mib(sb), mib(p->vram_budget));
    cuda_engine *e = NULL;
    cudaStream_t s = NULL;
    double upload_s = 0;
    int32_t *slot_of = NULL; /* host copy of the expert->slot table (kept: e->h_slot_of) */
    if (cudaSetDevice(p->device) != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: cannot select device %d", p->device);
    {
        size_t free_b = 0, total_b = 0;
        cudaError_t ce = cudaMemGetInfo(&free_b, &total_b);
        if (ce != cudaSuccess)
            return hm_error_set(err, HM_ERR_CUDA, "GPU: cudaMemGetInfo: %s",
                                cudaGetErrorString(ce));
        /* HOTMOE_GPU_FREE_MIB pretends the device has that much free (tests of admission) */
        const char *lim = getenv("HOTMOE_GPU_FREE_MIB");
        if (lim && *lim) {
            uint64_t l = strtoull(lim, NULL, 10) << 20;
            if (l < free_b) free_b = (size_t)l;
        }
        /* headroom for the CUDA context's own allocations and graphs */
        const uint64_t reserve = 256ull << 20;
        uint64_t need = wb + kvb + sb + reserve;
        if (need > free_b)
            return hm_error_set(err, HM_ERR_NOMEM, "GPU: not enough device memory on %s "
                                "(device %d): need %.0f MiB (weights %.0f + KV cache %.0f for -c "
                                "%d + buffers %.0f + reserve %.0f), %.0f MiB free: short by %.0f "
                                "MiB", info[p->device].name, p->device, mib(need), mib(wb),
                                mib(kvb), p->n_ctx, mib(sb), mib(reserve), mib(free_b),
                                mib(need - free_b));
    }
    e = (cuda_engine *)calloc(1, sizeof(*e));
    if (!e) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (GPU engine)");
    e->m = m;
    e->desc = hm_model_arch(m);
    e->hp = *hm_model_hparams(m);
    e->p = *p;
    e->bytes_weights = wb;
    e->bytes_kv = kvb;
    e->bytes_scratch = sb;
    e->use_gemm = getenv("HOTMOE_GPU_NO_GEMM") == NULL;
    e->layers = (cuda_layer *)calloc((size_t)e->hp.n_layer, sizeof(cuda_layer));
    if (!e->layers) {
        free(e);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (GPU engine)");
    }
    CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    e->stream = s;
    CUDA_TRY(cudaMalloc(&e->arena, wb ? wb : 1), "weights arena");
    CUDA_TRY(cudaMalloc(&e->kv_arena, kvb ? kvb : 1), "KV cache");
    CUDA_TRY(cudaMalloc(&e->scratch_arena, sb ? sb : 1), "scratch");
    CUDA_TRY(cudaMemsetAsync(e->kv_arena, 0, kvb, s), "KV cache");
    CUDA_TRY(cudaMemsetAsync(e->scratch_arena, 0, sb, s), "scratch"); /* attention, norm sync */
    layout_scratch(m, p, e, (char *)e->scratch_arena);
    {
        char *kvp = (char *)e->kv_arena;
        const size_t rows = (size_t)p->n_ctx * (size_t)(p->n_seq > 1 ? p->n_seq : 1);
        const cuda_hybrid_dims hy = cuda_hybrid_dims_of(e->desc, &e->hp);
        const size_t n_seq = (size_t)(p->n_seq > 1 ? p->n_seq : 1);
        for (int il = 0; il < e->hp.n_layer; il++) { /* [n_seq][n_ctx] rows */
            cuda_layer *D = &e->layers[il];
            int64_t nkv, hd;
            hm_model_layer_kv(m, il, &nkv, &hd);
            D->n_kv = (int)nkv;
            D->hd = (int)hd;
            if (il < p->layer_begin) continue;
            const size_t row_k = cuda_kv_bytes(p->type_k, 1, D->n_kv, D->hd);
            const size_t row_v = cuda_kv_bytes(p->type_v, 1, D->n_kv, D->hd);
            if (hm_model_layer(m, il)->recurrent) { /* [n_seq] recurrent states, zeroed */
                D->rs = (float *)kvp;
                D->rs_floats = hy.rs_floats;
                kvp += align_up(sizeof(float) * (size_t)hy.rs_floats * n_seq);
                continue;
            }
            D->k_cache = kvp;
            kvp += align_up(row_k * rows);
            D->v_cache = kvp;
            kvp += align_up(row_v * rows);
        }
    }
    CUDA_TRY(cudaMallocHost((void **)&e->h_tokens, sizeof(int32_t) * (size_t)p->n_ubatch),
             "pinned buffers");
    CUDA_TRY(cudaMallocHost((void **)&e->h_pos, sizeof(int32_t)), "pinned buffers");
    CUDA_TRY(cudaMallocHost((void **)&e->h_positions, sizeof(int32_t) * 2 * (size_t)p->n_ubatch),
             "pinned buffers");
    e->run_t0 = (int *)malloc(sizeof(int) * 3 * (size_t)p->n_ubatch);
    if (!e->run_t0) {
        st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (GPU engine runs)");
        goto fail;
    }
    e->run_len = e->run_t0 + p->n_ubatch;
    e->run_seq = e->run_len + p->n_ubatch;
    if (e->desc->hybrid)
        CUDA_TRY(cudaMallocHost((void **)&e->h_runs, sizeof(int32_t) * 3 * (size_t)p->n_ubatch),
                 "pinned buffers");
    CUDA_TRY(cudaMallocHost((void **)&e->h_logits,
                            sizeof(float) * (size_t)e->n_logit_rows * (size_t)e->hp.n_vocab),
             "pinned buffers");
    {
        const size_t nt = (size_t)e->hp.n_layer * (size_t)e->hp.n_expert;
        slot_of = (int32_t *)malloc(sizeof(int32_t) * (nt ? nt : 1));
        if (!slot_of) {
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (GPU engine)");
            goto fail;
        }
        for (size_t i = 0; i < nt; i++)
            slot_of[i] = p->res ? p->res->slot[i] : (int32_t)(i % (size_t)e->hp.n_expert);
        for (int il = 0; il < e->hp.n_layer; il++) {
            cuda_layer *D = &e->layers[il];
            D->host = host_layer(m, p, il);
            D->mixed = mixed_layer(m, p, il);
            D->n_slots = D->host || il < p->layer_begin ? 0
                         : p->res ? p->res->n_slots[il] : e->hp.n_expert;
            D->slot_of = e->d_slot_of + (size_t)il * (size_t)e->hp.n_expert;
            e->n_host += D->host || D->mixed;
        }
        /* on the engine's stream: after the scratch arena's memset (the upload waits for it) */
        CUDA_TRY(cudaMemcpyAsync(e->d_slot_of, slot_of, sizeof(int32_t) * nt,
                                 cudaMemcpyHostToDevice, s), "expert slot table");
    }
    {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        st = upload_all(e, s, slot_of, err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        upload_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    if (st != HM_OK) goto fail;
    {
        const cpu_rope_params full = hm_model_rope_params(m), swa = hm_model_rope_params_swa(m);
        st = rope_table_upload(e, &full, e->d_rope, err);
        if (st == HM_OK) st = rope_table_upload(e, &swa, e->d_rope_swa, err);
    }
    if (st == HM_OK) st = cuda_handoff_init(e, err);
    if (st == HM_OK) st = cuda_hot_init(e, err);
    if (st != HM_OK) goto fail;
    {
        int w = snprintf(e->info, sizeof(e->info), "%s (device %d): %.0f MiB weights (uploaded in "
                         "%.2f s, %.1f GB/s) + %.0f MiB KV + %.0f MiB buffers",
                         info[p->device].name, p->device, mib(wb), upload_s,
                         upload_s > 0 ? (double)wb / upload_s * 1e-9 : 0.0, mib(kvb), mib(sb));
        if (p->layer_begin > 0 && w > 0 && (size_t)w < sizeof(e->info)) {
            if (p->layer_begin < e->hp.n_layer)
                w += snprintf(e->info + w, sizeof(e->info) - (size_t)w, "; layers %d-%lld and "
                              "the output (layers 0-%d on the CPU)", p->layer_begin,
                              (long long)e->hp.n_layer - 1, p->layer_begin - 1);
            else
                w += snprintf(e->info + w, sizeof(e->info) - (size_t)w, "; the output layer "
                              "alone (every layer on the CPU)");
        }
        if (e->n_host && w > 0 && (size_t)w < sizeof(e->info))
            snprintf(e->info + w, sizeof(e->info) - (size_t)w, "; experts of %d layer%s in host "
                     "memory, computed by the CPU (%.1f MiB hand-off)", e->n_host,
                     e->n_host == 1 ? "" : "s", mib(e->ho_bytes));
    }
    e->h_slot_of = slot_of;
    *out = e;
    return HM_OK;
fail:
    free(slot_of);
    cuda_engine_free(e);
    return st;
}

extern "C" void cuda_engine_free(cuda_engine *e) {
    if (!e) return;
    cudaSetDevice(e->p.device);
    cuda_handoff_free(e); /* ends a wait in flight first, or the synchronisation could last */
    if (e->stream) cudaStreamSynchronize((cudaStream_t)e->stream);
    cuda_hot_free(e);
    cudaFree(e->d_route_table);
    cudaFree(e->arena);
    cudaFree(e->kv_arena);
    cudaFree(e->scratch_arena);
    cudaFree(e->count_arena);
    if (e->h_count) cudaFreeHost(e->h_count);
    if (e->h_tokens) cudaFreeHost(e->h_tokens);
    if (e->h_pos) cudaFreeHost(e->h_pos);
    if (e->h_positions) cudaFreeHost(e->h_positions);
    if (e->h_runs) cudaFreeHost(e->h_runs);
    free(e->run_t0);
    if (e->h_logits) cudaFreeHost(e->h_logits);
    if (e->h_rows) cudaFreeHost(e->h_rows);
    if (e->stream) cudaStreamDestroy((cudaStream_t)e->stream);
    free(e->layers);
    free(e->h_slot_of);
    free(e);
}
