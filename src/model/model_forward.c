/* model_forward.c - the forward pass of every supported architecture, one ubatch at a time.
 *
 * DESIGN: one function reads like the model (llama2.c style): embed, then per layer an
 * attention block and an MoE block, each `x = x + f(norm(x))`, then the final norm and the
 * output matrix. Where architectures differ the layer's descriptor (hm_arch_desc) decides:
 * biases, q/k norms, rope kind and YaRN, sinks and the sliding window, gating, swiglu kind,
 * expert biases and the shared expert. Every step works on whole rows with the kernels of
 * cpu/matmul.h and cpu/ops.h, which compute each output element the same way whatever the
 * number of tokens or threads — so a prompt batch and the same tokens one by one give
 * bit-identical logits.
 *
 * The expert FFN goes through ctx->moe_exec (routing result in, unweighted per-slot outputs
 * out); the weighted sum over the slots happens here, in slot order (cpu_moe_combine) — or,
 * with the default executor at decode, inside the expert job (cpu_moe_sum: the same bytes).
 *
 * Decode (up to FWD_FEW_TOK tokens) pays for every pool job (wake the threads, wait for the
 * slowest) more than for most of its ops, so a layer is two jobs: the front of the layer — q/k/v,
 * attention, wo and the router product — is one staged job (tp_run_stages), and the expert FFN
 * is one (cpu_moe_ffn); a one-token step with the default expert executor is one job for all
 * layers (model_token.c, from the same steps: model_steps.h). In the front job the small steps
 * run where their data is: each q/k head is an item (bias, norm, rope; a k head also stores K
 * and V; for one token it runs on the q/k/v item that completes its rows, and the attention
 * items are items of the q/k/v stage too, each started once its heads are done), each attention
 * item quantises the output heads it wrote for wo; what needs a whole
 * row (the residual add and the FFN norm, a whole-projection q/k norm) runs on the thread that
 * finishes the stage before. A thread waiting for the next stage prefetches the weight (or KV)
 * rows of the item it holds. All paths call the same step functions and kernels, so they give
 * the same bytes.
 *
 * Buffers (nu = n_ubatch, n = tokens in this ubatch; shapes in model_internal.h):
 *   x [n][n_embd] residual; xn [n][n_embd] normed; q/k/v projections; attn [n][n_head*hd];
 *   proj [n][n_embd] block output; router [n][n_expert]; ids/gw [n][n_used];
 *   eg/eu [n][n_used][n_ff_exp]; ey [n][n_used][n_embd]; sg/su [n][n_ff_shexp]; sgate [n].
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#ifndef MODEL_ATTN_IN_QKV
#define MODEL_ATTN_IN_QKV 1 /* build flag for A/B: 0 = attention as a stage of its own */
#endif

#include "base/spin.h"
#include "cpu/matmul.h"
#include "model/model_internal.h"
#include "model/model_steps.h"
#include "moe/tracer.h"

/* Norms, rope, elementwise ops and the router of up to this many elements run on the calling
 * thread: for a decode step a pool job (wake every thread, join them) costs more than the op,
 * and the results do not depend on the thread count. */
enum { FWD_INLINE_ELEMS = 65536 };

/* Up to this many tokens a layer is two pool jobs (the staged front, the one-job expert FFN). */
enum { FWD_FEW_TOK = 4 };

/* pool for an op of elems elements: NULL (the calling thread) when small or inside a job. */
static tp_pool *op_pool(tp_pool *pool, int64_t elems) {
    return elems <= FWD_INLINE_ELEMS ? NULL : pool;
}

static void add_bias(tp_pool *pool, const hm_tensor *b, float *y, int64_t n, int64_t rows) {
    if (b && b->data) cpu_add_bias(op_pool(pool, n * rows), y, b->data, n, rows);
}

static bool mm_fits(const hm_context *c, const hm_tensor *w, int64_t n) {
    return cpu_matmul_scratch_size(w->type, w->ne[0], n) <= c->mm_scratch_size;
}

/* y[n][rows of w] = x[n][w->ne[0]] . w (+ bias b when given). */
static hm_status linear(hm_context *c, const hm_tensor *w, const hm_tensor *b, const float *x,
                        int64_t n, float *y, hm_error *err) {
    size_t need = cpu_matmul_scratch_size(w->type, w->ne[0], n);
    bool fits = need <= c->mm_scratch_size;
    const cpu_matmul_mat mat = {.wtype = w->type, .w = w->data, .n_rows = w->ne[1], .y = y,
                                .x8 = w->x8};
    hm_status st = cpu_matmul_multi(c->pool, c->kern, 1, &mat, w->ne[0], x, n,
                                    fits ? c->mm_scratch : NULL, fits ? c->mm_scratch_size : 0,
                                    err);
    if (st == HM_OK) add_bias(c->pool, b, y, n, w->ne[1]);
    return st;
}

/* The q, k and v products of one layer: mats [3] (outputs c->q, c->k, c->v); true when they
 * share their input length and activation format (one product of three matrices). */
static bool qkv_mats(hm_context *c, const hm_layer *L, cpu_matmul_mat *mats) {
    const hm_tensor *w[3] = {&L->wq, &L->wk, &L->wv};
    float *y[3] = {c->q, c->k, c->v};
    bool same = true;
    for (int i = 0; i < 3; i++) {
        mats[i] = (cpu_matmul_mat){.wtype = w[i]->type, .w = w[i]->data, .n_rows = w[i]->ne[1],
                                   .y = y[i], .x8 = w[i]->x8};
        same = same && w[i]->ne[0] == w[0]->ne[0] &&
               quant_act_for(w[i]->type) == quant_act_for(w[0]->type);
    }
    return same;
}

/* q, k and v of one input, without biases: one pool job (activations quantised once) when the
 * three weight types share an activation format, else three products. */
static hm_status linear_qkv(hm_context *c, const hm_layer *L, const float *x, int64_t n,
                            hm_error *err) {
    cpu_matmul_mat mats[3];
    if (!qkv_mats(c, L, mats)) {
        const hm_tensor *w[3] = {&L->wq, &L->wk, &L->wv};
        hm_status st = HM_OK;
        for (int i = 0; i < 3 && st == HM_OK; i++) st = linear(c, w[i], NULL, x, n, mats[i].y, err);
        return st;
    }
    bool fits = mm_fits(c, &L->wq, n);
    return cpu_matmul_multi(c->pool, c->kern, 3, mats, L->wq.ne[0], x, n,
                            fits ? c->mm_scratch : NULL, fits ? c->mm_scratch_size : 0, err);
}

/* After the q/k/v products: their biases, the q/k norms and rope (pool NULL inside a job). */
static hm_status qkv_finish(hm_context *c, const hm_layer *L, int n, tp_pool *pool,
                            hm_error *err) {
    const hm_hparams *hp = &c->m->hp;
    const int nh = (int)hp->n_head, nkv = (int)hp->n_head_kv, hd = (int)hp->head_dim_k;
    tp_pool *pq = op_pool(pool, (int64_t)n * nh * hd);
    add_bias(pool, &L->bq, c->q, n, L->wq.ne[1]);
    add_bias(pool, &L->bk, c->k, n, L->wk.ne[1]);
    add_bias(pool, &L->bv, c->v, n, L->wv.ne[1]);
    if (c->m->desc->qk_norm == HM_QKNORM_HEAD) { /* each head of q [n][nh][hd], k [n][nkv][hd] */
        cpu_rmsnorm(pq, c->q, L->q_norm.data, c->q, (int64_t)n * nh, hd, hp->rms_eps);
        cpu_rmsnorm(pq, c->k, L->k_norm.data, c->k, (int64_t)n * nkv, hd, hp->rms_eps);
    } else if (c->m->desc->qk_norm == HM_QKNORM_FULL) { /* the whole projection of each token */
        cpu_rmsnorm(pq, c->q, L->q_norm.data, c->q, n, (int64_t)nh * hd, hp->rms_eps);
        cpu_rmsnorm(pq, c->k, L->k_norm.data, c->k, n, (int64_t)nkv * hd, hp->rms_eps);
    }
    const cpu_rope_params rp = hm_model_rope_params(c->m);
    hm_status st = cpu_rope_with_table(pq, c->q, n, nh, hd, c->rope_cs, &rp, err);
    if (st == HM_OK) st = cpu_rope_with_table(pq, c->k, n, nkv, hd, c->rope_cs, &rp, err);
    return st;
}

static cpu_attn_args attn_args(const hm_context *c, int il, int n) {
    const hm_hparams *hp = &c->m->hp;
    const hm_layer *L = &c->m->layers[il];
    return (cpu_attn_args){.n_head = (int)hp->n_head, .n_tok = n, .pos0 = c->pos[0],
                           .window = L->swa ? hp->sliding_window : 0, .scale = 0.0f,
                           .sinks = L->sinks.data, .q = c->q, .k_new = c->k, .v_new = c->v,
                           .out = c->attn};
}

/* After the wo product: its bias, the residual add x += proj and the FFN norm of x into xn
 * (pool NULL inside a job). */
static void wo_finish(hm_context *c, const hm_layer *L, int n, tp_pool *pool) {
    const hm_hparams *hp = &c->m->hp;
    tp_pool *pe = op_pool(pool, n * hp->n_embd);
    add_bias(pool, &L->bo, c->proj, n, L->wo.ne[1]);
    cpu_add(pe, c->x, c->proj, c->x, (int64_t)n * hp->n_embd);
    cpu_rmsnorm(pe, c->x, L->ffn_norm.data, c->xn, n, hp->n_embd, hp->rms_eps);
}

static hm_status moe_matmul(hm_context *c, const cpu_moe_args *a, hm_error *err) {
    size_t need = cpu_moe_scratch_size(a);
    bool fits = need <= c->mm_scratch_size;
    return cpu_moe_matmul(c->pool, c->kern, a, fits ? c->mm_scratch : NULL,
                          fits ? c->mm_scratch_size : 0, err);
}

/* Rows [r0, r1) of slot p of the gate/up products: expert biases, then the activation into eg
 * (run inside the fused gate/up job; elementwise, so the same values as whole-buffer ops). */
void model_moe_post(void *ctx, int64_t p, int64_t r0, int64_t r1) {
    const model_moe_post_ctx *pc = ctx;
    float *g = pc->eg + p * pc->F + r0, *u = pc->eu + p * pc->F + r0;
    const int64_t n = r1 - r0;
    if (pc->L->gate_exps_b.data) {
        const int32_t zero = 0;
        const int64_t off = (int64_t)pc->ids[p] * pc->F + r0;
        cpu_moe_add_bias(NULL, g, (const float *)pc->L->gate_exps_b.data + off, &zero, 1, 1, n);
        cpu_moe_add_bias(NULL, u, (const float *)pc->L->up_exps_b.data + off, &zero, 1, 1, n);
    }
    cpu_swiglu_slice(g, u, g, n, pc->oai, 1.702f, 7.0f, pc->simd);
}

bool model_moe_args(hm_context *c, int il, const int32_t *ids, int64_t n, int K, const float *x,
                    float *y, cpu_moe_args *a, cpu_moe_args *b, cpu_moe_args *d,
                    model_moe_post_ctx *pc) {
    const hm_model *m = c->m;
    const hm_hparams *hp = &m->hp;
    const hm_layer *L = &m->layers[il];
    const int64_t F = hp->n_ff_exp, E = hp->n_embd;
    *a = (cpu_moe_args){.n_expert = hp->n_expert, .ids = ids, .n_tok = n, .n_used = K};
    /* gate and up: every slot of token t reads x[t] */
    a->wtype = L->gate_exps.type, a->w = L->gate_exps.data, a->n_rows = F, a->k = E;
    a->x = x, a->x_per_slot = 0, a->y = c->eg, a->x8 = L->gate_exps.x8;
    *b = *a;
    b->wtype = L->up_exps.type, b->w = L->up_exps.data, b->y = c->eu, b->x8 = L->up_exps.x8;
    *d = *a; /* down: slot s of token t reads its own activation eg[t][s] */
    d->wtype = L->down_exps.type, d->w = L->down_exps.data, d->n_rows = E, d->k = F;
    d->x8 = L->down_exps.x8;
    d->x = c->eg, d->x_per_slot = 1, d->y = y;
    *pc = (model_moe_post_ctx){.L = L, .ids = ids, .eg = c->eg, .eu = c->eu, .F = F,
                               .oai = m->desc->swiglu == HM_SWIGLU_OAI, .simd = cpu_act_simd()};
    return quant_act_for(a->wtype) == quant_act_for(b->wtype) &&
           (!L->gate_exps_b.data || L->up_exps_b.data);
}

/* The CPU expert FFN: y[t][s] = down(act(gate(x[t]), up(x[t]))) of expert ids[t][s]. */
/* hm_moe_exec_cpu; with sum (one-job decode path only) the slots' weighted sum too, and
 * *summed = true when it was done (else the caller combines job->y). */
static hm_status moe_exec_cpu(hm_context *c, const hm_model *m, const hm_moe_job *job,
                              const cpu_moe_sum *sum, bool *summed, hm_error *err) {
    const hm_layer *L = &m->layers[job->layer];
    const int64_t n = job->n_tok;
    const int K = job->n_used;
    cpu_moe_args a, b, d;
    model_moe_post_ctx pc;
    const bool pair = model_moe_args(c, job->layer, job->ids, n, K, job->x, job->y, &a, &b, &d,
                                     &pc);
    const bool oai = pc.oai;
    const int64_t F = a.n_rows, E = d.n_rows;
    hm_status st;
    if (pair && n <= FWD_FEW_TOK) {
        /* decode: gate/up, activation and down in one pool job */
        size_t need = cpu_moe_ffn_scratch_size(&a, &d);
        bool fits = need <= c->mm_scratch_size;
        cpu_moe_sum sb;
        if (sum) {
            sb = *sum;
            sb.bias = L->down_exps_b.data;
            *summed = true;
        }
        st = cpu_moe_ffn(c->pool, c->kern, &a, &b, model_moe_post, &pc, &d, sum ? &sb : NULL,
                         fits ? c->mm_scratch : NULL, fits ? c->mm_scratch_size : 0, err);
        if (st == HM_OK && L->down_exps_b.data && !sum)
            cpu_moe_add_bias(op_pool(c->pool, n * K * E), job->y, L->down_exps_b.data, job->ids, n, K,
                             E);
        return st;
    }
    if (pair) {
        /* one job: gate and up rows of each chunk, then their biases and activation */
        size_t need = cpu_moe_scratch_size(&a);
        bool fits = need <= c->mm_scratch_size;
        st = cpu_moe_matmul_pair(c->pool, c->kern, &a, &b, model_moe_post, &pc,
                                 fits ? c->mm_scratch : NULL, fits ? c->mm_scratch_size : 0, err);
        if (st != HM_OK) return st;
    } else {
        st = moe_matmul(c, &a, err);
        if (st == HM_OK) st = moe_matmul(c, &b, err);
        if (st != HM_OK) return st;
        if (L->gate_exps_b.data) {
            cpu_moe_add_bias(c->pool, c->eg, L->gate_exps_b.data, job->ids, n, K, F);
            cpu_moe_add_bias(c->pool, c->eu, L->up_exps_b.data, job->ids, n, K, F);
        }
        if (oai) cpu_swiglu_oai(c->pool, c->eg, c->eu, c->eg, n * K * F, 1.702f, 7.0f);
        else cpu_swiglu(c->pool, c->eg, c->eu, c->eg, n * K * F);
    }
    st = moe_matmul(c, &d, err);
    if (st == HM_OK && L->down_exps_b.data)
        cpu_moe_add_bias(op_pool(c->pool, n * K * E), job->y, L->down_exps_b.data, job->ids, n, K, E);
    return st;
}

hm_status hm_moe_exec_cpu(void *impl, const hm_model *m, const hm_moe_job *job,
                             hm_error *err) {
    bool summed = false;
    return moe_exec_cpu(impl, m, job, NULL, &summed, err);
}

/* Attention norm, q/k/v, attention and the wo product into proj (its bias and the residual:
 * wo_finish). */
static hm_status attention_block(hm_context *c, int il, int n, hm_error *err) {
    const hm_hparams *hp = &c->m->hp;
    const hm_layer *L = &c->m->layers[il];
    tp_pool *pe = op_pool(c->pool, n * hp->n_embd);

    cpu_rmsnorm(pe, c->x, L->attn_norm.data, c->xn, n, hp->n_embd, hp->rms_eps);
    hm_status st = linear_qkv(c, L, c->xn, n, err);
    if (st == HM_OK) st = qkv_finish(c, L, n, c->pool, err);
    if (st != HM_OK) return st;
    cpu_attn_args a = attn_args(c, il, n);
    size_t need = cpu_attention_scratch_size(&c->kv[il], &a, tp_size(c->pool));
    bool fits = need <= c->attn_scratch_size;
    st = cpu_attention(c->pool, &c->kv[il], &a, fits ? c->attn_scratch : NULL,
                       fits ? c->attn_scratch_size : 0, err);
    if (st == HM_OK) st = linear(c, &L->wo, NULL, c->attn, n, c->proj, err);
    return st;
}

static void front_after_qkv(void *ctx) {
    model_front *f = ctx;
    f->st = qkv_finish(f->c, f->L, f->n, NULL, &f->err);
    if (f->st == HM_OK) f->st = cpu_attention_begin(NULL, &f->attn, &f->err);
}

/* Item i of the heads stage (q/k norms per head or none): one head of one token — q heads
 * first, then k heads — its bias, norm and rope: qkv_finish's steps on that head's row, which
 * they treat row by row, so the same bytes. A k head's item also adds the v bias to v head hh
 * and stores both into the KV cache (cpu_kv_store_head: cpu_kv_store's bytes). */
static void front_head_item(void *ctx, int64_t i, int ith) {
    (void)ith;
    model_front *f = ctx;
    const hm_context *c = f->c;
    const hm_layer *L = f->L;
    const hm_hparams *hp = &c->m->hp;
    const int nh = (int)hp->n_head, nkv = (int)hp->n_head_kv, hd = (int)hp->head_dim_k;
    const int64_t t = i / (nh + nkv);
    const int h = (int)(i % (nh + nkv));
    const bool is_q = h < nh;
    const int hh = is_q ? h : h - nh;
    float *row = (is_q ? c->q + t * nh * hd : c->k + t * nkv * hd) + (int64_t)hh * hd;
    const hm_tensor *b = is_q ? &L->bq : &L->bk, *w = is_q ? &L->q_norm : &L->k_norm;
    if (b->data) cpu_add_bias(NULL, row, (const float *)b->data + (int64_t)hh * hd, 1, hd);
    if (c->m->desc->qk_norm == HM_QKNORM_HEAD) cpu_rmsnorm(NULL, row, w->data, row, 1, hd, hp->rms_eps);
    if (cpu_rope_with_table(NULL, row, 1, 1, hd, c->rope_cs + t * f->rp.n_dims, &f->rp, NULL) != HM_OK)
        atomic_store(&f->head_fail, 1);
    if (is_q) return;
    const int hv = (int)hp->head_dim_v;
    float *vrow = c->v + (t * nkv + hh) * hv;
    if (L->bv.data) cpu_add_bias(NULL, vrow, (const float *)L->bv.data + (int64_t)hh * hv, 1, hv);
    if (cpu_kv_store_head(f->attn.kv, c->pos[t], hh, row, vrow) != HM_OK)
        atomic_fetch_or(&f->kv_fail, 1 << t);
}

/* A q/k/v item's rows [r0, r1) of matrix mi (heads_in_qkv): counted to their heads; the item
 * that completes a head runs that head's step at once, on rows still in its cache. A q head
 * needs its head_dim rows of q, a k head its rows of k and of v (its item stores both). */
static void front_qkv_rows(void *ctx, int mi, int64_t r0, int64_t r1) {
    model_front *f = ctx;
    const hm_hparams *hp = &f->c->m->hp;
    const int64_t hd = hp->head_dim_k, nh = hp->n_head;
    for (int64_t h = r0 / hd; h * hd < r1; h++) {
        const int64_t lo = h * hd > r0 ? h * hd : r0, hi = (h + 1) * hd < r1 ? (h + 1) * hd : r1;
        const int64_t head = mi == 0 ? h : nh + h, need = mi == 0 ? hd : 2 * hd;
        if (atomic_fetch_add_explicit(&f->head_rows[head], (int)(hi - lo), memory_order_acq_rel) +
                (hi - lo) == need) {
            front_head_item(f, head, 0);
            atomic_store_explicit(&f->head_done[head], 1, memory_order_release);
        }
    }
}

/* After the heads stage: the stored positions marked (a failed token's slot emptied, as
 * cpu_kv_store does), then attention's check that it reads only cached positions. */
static void front_heads_failed(model_front *f) {
    const int fail = atomic_load(&f->kv_fail);
    cpu_kv_layer *kv = f->attn.kv;
    for (int t = 0; t < f->n; t++)
        if (fail >> t & 1) kv->slot_pos[f->c->pos[t] % kv->n_slots] = -1;
    if (atomic_load(&f->head_fail))
        f->st = hm_error_set(&f->err, HM_ERR_ARG, "rope: arguments refused for %s",
                             f->c->m->desc->name);
    else if (fail)
        f->st = hm_error_set(&f->err, HM_ERR_RANGE,
                             "KV store: K or V of position %d is not finite (q8_0 cache)",
                             f->c->pos[__builtin_ctz((unsigned)fail)]);
}

static void front_after_heads(void *ctx) {
    model_front *f = ctx;
    cpu_kv_mark(f->attn.kv, f->c->pos[0], f->n);
    front_heads_failed(f);
    if (f->st == HM_OK) f->st = cpu_attention_begin(NULL, &f->attn, &f->err);
}

/* ---- attention inside the q/k/v stage (attn_in_qkv): the stage's items are the q/k/v items,
 * then the attention items; an attention item waits for its q heads and KV head (their rows'
 * items were all claimed before it: one counter, claimed in order, so they complete) and runs
 * while the last q/k/v items finish, instead of after a gate. Positions are marked and checked
 * before the stage (model_front_pre); a failed K/V store empties its slot after it, as above
 * (the layer's error then stops the step). */
static void front_wait_head(model_front *f, int h) {
    hm_spin_until(&f->head_done[h], 1);
}

static void front_qkv_attn_item(void *ctx, int64_t it, int ith) {
    model_front *f = ctx;
    if (it < f->qkv_stage.n_items) {
        f->qkv_stage.fn(f->qkv_stage.ctx, it, ith);
        return;
    }
    it -= f->qkv_stage.n_items;
    int64_t t;
    int g, h0, h1;
    cpu_attention_item_heads(&f->attn, it, &t, &g, &h0, &h1);
    front_wait_head(f, (int)f->c->m->hp.n_head + g);
    for (int h = h0; h < h1; h++) front_wait_head(f, h);
    f->attn_stage.fn(f->attn_stage.ctx, it, ith);
}

static void front_qkv_attn_prefetch(void *ctx, int64_t it, const tp_gate *gate) {
    model_front *f = ctx;
    if (it < f->qkv_stage.n_items) f->qkv_stage.prefetch(f->qkv_stage.ctx, it, gate);
    else if (f->attn_stage.prefetch)
        f->attn_stage.prefetch(f->attn_stage.ctx, it - f->qkv_stage.n_items, gate);
}

static void front_after_qkv_attn(void *ctx) {
    model_front *f = ctx;
    front_heads_failed(f);
    if (f->st == HM_OK && !f->out_by_item) cpu_matmul_job_quantize(&f->wo, f->c->attn);
}

static tp_stage front_qkv_attn_stage(model_front *f) {
    return (tp_stage){.fn = front_qkv_attn_item, .ctx = f,
                      .n_items = f->qkv_stage.n_items + f->attn_stage.n_items,
                      .then = front_after_qkv_attn, .then_ctx = f,
                      .prefetch = front_qkv_attn_prefetch};
}

static void front_after_attn(void *ctx) {
    model_front *f = ctx;
    if (f->st == HM_OK) cpu_matmul_job_quantize(&f->wo, f->c->attn);
}

/* An attention item's output heads, quantised for wo by the core that wrote them. */
static void front_attn_out(void *ctx, int64_t t, int h0, int h1) {
    model_front *f = ctx;
    const int64_t hd = f->c->m->hp.head_dim_v;
    cpu_matmul_job_quantize_part(&f->wo, f->c->attn, t, h0 * hd, (h1 - h0) * hd);
}

/* A wo item's rows [r0, r1): wo_finish's bias and residual add there, by the core that wrote
 * them (elementwise, so the same bytes); the FFN norm stays for the stage's `then`. */
static void front_wo_rows(void *ctx, int mi, int64_t r0, int64_t r1) {
    (void)mi;
    model_front *f = ctx;
    const hm_context *c = f->c;
    const int64_t E = c->m->hp.n_embd;
    for (int t = 0; t < f->n; t++) {
        float *p = c->proj + t * E + r0, *x = c->x + t * E + r0;
        if (f->L->bo.data) cpu_add_bias(NULL, p, (const float *)f->L->bo.data + r0, 1, r1 - r0);
        cpu_add(NULL, x, p, x, r1 - r0);
    }
}

/* After the wo stage: the FFN norm of the whole residual row, the router's activations. */
static void front_after_wo(void *ctx) {
    model_front *f = ctx;
    if (f->st != HM_OK) return;
    const hm_hparams *hp = &f->c->m->hp;
    cpu_rmsnorm(NULL, f->c->x, f->L->ffn_norm.data, f->c->xn, f->n, hp->n_embd, hp->rms_eps);
    cpu_matmul_job_quantize(&f->router, f->c->xn);
}

static tp_stage stage_then(tp_stage s, void (*then)(void *), void *ctx) {
    s.then = then;
    s.then_ctx = ctx;
    return s;
}

int model_front_plan(hm_context *c, int il, int n, model_front *fp, tp_stage *stages,
                     hm_status *st, hm_error *err) {
    *fp = (model_front){.c = c, .L = &c->m->layers[il], .n = n,
                        .rp = hm_model_rope_params(c->m), .st = HM_OK};
    model_front *f = fp;
    atomic_init(&f->head_fail, 0);
    atomic_init(&f->kv_fail, 0);
    *st = HM_OK;
    const hm_layer *L = f->L;
    const int nth = tp_size(c->pool);
    const hm_hparams *hp = &c->m->hp;
    cpu_matmul_mat q[3];
    f->aa = attn_args(c, il, n);
    /* with per-head (or no) q/k norms, the heads are items of a stage of their own, which also
     * store K and V (so attention stores nothing) */
    const bool by_head = c->m->desc->qk_norm != HM_QKNORM_FULL &&
                         hp->head_dim_k == hp->head_dim_v && c->kv[il].head_dim == hp->head_dim_k;
    if (by_head) f->aa.k_new = f->aa.v_new = NULL;
    if (n > FWD_FEW_TOK || !qkv_mats(c, L, q) || !mm_fits(c, &L->wq, n) ||
        !mm_fits(c, &L->wo, n) || !mm_fits(c, &L->router, n) ||
        cpu_attention_scratch_size(&c->kv[il], &f->aa, nth) > c->attn_scratch_size)
        return 0;
    const cpu_matmul_mat o = {.wtype = L->wo.type, .w = L->wo.data, .n_rows = L->wo.ne[1],
                              .y = c->proj, .x8 = L->wo.x8};
    const cpu_matmul_mat r = {.wtype = L->router.type, .w = L->router.data,
                              .n_rows = L->router.ne[1], .y = c->router};
    void *ms = c->mm_scratch; /* every product's activations in turn */
    const size_t mss = c->mm_scratch_size;
    /* wo's activations after q/k/v's where they fit, so that attention items may write them
     * while q/k/v items still read theirs (attn_in_qkv) */
    size_t wo_at = (cpu_matmul_scratch_size(q[0].wtype, L->wq.ne[0], n) + 63) / 64 * 64;
    if (wo_at + cpu_matmul_scratch_size(L->wo.type, L->wo.ne[0], n) > mss) wo_at = 0;
    *st = cpu_matmul_job_init(&f->qkv, c->kern, 3, q, L->wq.ne[0], n, nth, ms, mss, err);
    if (*st == HM_OK) *st = cpu_matmul_job_init(&f->wo, c->kern, 1, &o, L->wo.ne[0], n, nth,
                                                (uint8_t *)ms + wo_at, mss - wo_at, err);
    if (*st == HM_OK) *st = cpu_matmul_job_init(&f->router, c->kern, 1, &r, L->router.ne[0], n,
                                                nth, ms, mss, err);
    if (*st == HM_OK) *st = cpu_attention_plan(&f->attn, &c->kv[il], &f->aa, nth, c->attn_scratch,
                                               c->attn_scratch_size, err);
    if (*st != HM_OK) return 0;
    /* attention items quantise their own output heads for wo when those are whole blocks */
    const int64_t hdv = hp->head_dim_v;
    const bool out_by_item = cpu_matmul_job_part_ok(&f->wo, 0, f->attn.rep_per_sub * hdv) &&
                             cpu_matmul_job_part_ok(&f->wo, 0, f->attn.n_rep * hdv);
    f->by_head = by_head;
    f->heads_in_qkv = by_head && n == 1 && hp->n_head + hp->n_head_kv <= MODEL_MAX_HEADS;
    f->attn_in_qkv = f->heads_in_qkv && MODEL_ATTN_IN_QKV && wo_at > 0;
    for (int64_t h = 0; f->heads_in_qkv && h < hp->n_head + hp->n_head_kv; h++) {
        atomic_init(&f->head_rows[h], 0);
        atomic_init(&f->head_done[h], 0);
    }
    if (f->heads_in_qkv) {
        f->qkv.on_rows = front_qkv_rows;
        f->qkv.on_rows_ctx = f;
    }
    f->out_by_item = out_by_item;
    if (out_by_item) {
        f->attn.on_out = front_attn_out;
        f->attn.on_out_ctx = f;
    }
    const int64_t n_heads = f->heads_in_qkv ? 0 : (int64_t)n * (hp->n_head + hp->n_head_kv);
    const tp_stage heads = {.fn = n_heads ? front_head_item : NULL, .ctx = f, .n_items = n_heads,
                            .then = front_after_heads, .then_ctx = f};
    const tp_stage qkv = cpu_matmul_job_stage(&f->qkv), attn = cpu_attention_stage(&f->attn);
    f->wo.on_rows = front_wo_rows; /* wo_finish's bias and residual add in the wo items */
    f->wo.on_rows_ctx = f;
    int ns = 0;
    if (f->attn_in_qkv) {
        f->qkv_stage = qkv;
        f->attn_stage = attn;
        f->attn_at = ns;
        stages[ns++] = front_qkv_attn_stage(f);
    } else {
        stages[ns++] = by_head ? qkv : stage_then(qkv, front_after_qkv, f);
        if (by_head) stages[ns++] = heads;
        f->attn_at = ns;
        stages[ns++] = out_by_item ? attn : stage_then(attn, front_after_attn, f);
    }
    stages[ns++] = stage_then(cpu_matmul_job_stage(&f->wo), front_after_wo, f);
    stages[ns++] = cpu_matmul_job_stage(&f->router);
    return ns;
}

int model_front_replan(model_front *f, int il, tp_stage *attn, hm_status *st, hm_error *err) {
    hm_context *c = f->c;
    const int nth = tp_size(c->pool);
    f->st = HM_OK;
    atomic_store(&f->head_fail, 0);
    atomic_store(&f->kv_fail, 0);
    for (int64_t h = 0; f->heads_in_qkv && h < c->m->hp.n_head + c->m->hp.n_head_kv; h++) {
        atomic_store_explicit(&f->head_rows[h], 0, memory_order_relaxed);
        atomic_store_explicit(&f->head_done[h], 0, memory_order_relaxed);
    }
    f->aa = attn_args(c, il, f->n);
    if (f->by_head) f->aa.k_new = f->aa.v_new = NULL;
    *st = HM_OK;
    if (cpu_attention_scratch_size(&c->kv[il], &f->aa, nth) > c->attn_scratch_size) return 0;
    *st = cpu_attention_plan(&f->attn, &c->kv[il], &f->aa, nth, c->attn_scratch,
                             c->attn_scratch_size, err);
    if (*st != HM_OK) return 1;
    const int64_t hdv = c->m->hp.head_dim_v;
    f->out_by_item = cpu_matmul_job_part_ok(&f->wo, 0, f->attn.rep_per_sub * hdv) &&
                     cpu_matmul_job_part_ok(&f->wo, 0, f->attn.n_rep * hdv);
    if (f->out_by_item) {
        f->attn.on_out = front_attn_out;
        f->attn.on_out_ctx = f;
    }
    if (f->attn_in_qkv) {
        f->attn_stage = cpu_attention_stage(&f->attn);
        *attn = front_qkv_attn_stage(f);
        return 1;
    }
    *attn = f->out_by_item ? cpu_attention_stage(&f->attn)
                           : stage_then(cpu_attention_stage(&f->attn), front_after_attn, f);
    return 1;
}

void model_front_pre(model_front *f) {
    const hm_context *c = f->c;
    const hm_hparams *hp = &c->m->hp;
    cpu_rmsnorm(NULL, c->x, f->L->attn_norm.data, c->xn, f->n, hp->n_embd, hp->rms_eps);
    cpu_matmul_job_quantize(&f->qkv, c->xn);
    if (f->attn_in_qkv && f->st == HM_OK) { /* front_after_heads' steps before the stage */
        cpu_kv_mark(f->attn.kv, c->pos[0], f->n);
        f->st = cpu_attention_begin(NULL, &f->attn, &f->err);
    }
}

/* attention_block, ffn_norm and the router product of a decode step in one pool job; false
 * (nothing done) when a product cannot take part (q/k/v not one product, scratch too small). */
static bool layer_front_staged(hm_context *c, int il, int n, hm_status *st, hm_error *err) {
    model_front f;
    tp_stage stages[MODEL_FRONT_STAGES];
    const int ns = model_front_plan(c, il, n, &f, stages, st, err);
    if (*st != HM_OK) return true;
    if (ns == 0) return false;
    model_front_pre(&f);
    tp_run_stages(c->pool, stages, ns);
    *st = f.st;
    if (f.st != HM_OK && err) *err = f.err;
    return true;
}

/* Attention block, FFN norm and router logits of layer il: c->xn, c->router. */
static hm_status layer_front(hm_context *c, int il, int n, hm_error *err) {
    hm_status st = HM_OK;
    if (layer_front_staged(c, il, n, &st, err)) return st;
    const hm_layer *L = &c->m->layers[il];
    st = attention_block(c, il, n, err);
    if (st != HM_OK) return st;
    wo_finish(c, L, n, c->pool);
    return linear(c, &L->router, NULL, c->xn, n, c->router, err);
}

/* Routing from the logits in c->router, the experts, their weighted sum, the shared expert. */
static hm_status moe_block(hm_context *c, int il, int n, hm_error *err) {
    const hm_model *m = c->m;
    const hm_hparams *hp = &m->hp;
    const hm_arch_desc *d = m->desc;
    const hm_layer *L = &m->layers[il];
    const int K = (int)hp->n_expert_used;
    const int64_t E = hp->n_embd;
    tp_pool *pe = op_pool(c->pool, n * E);

    /* routing: logits -> top-k ids and weights (slot order = descending score) */
    cpu_gate_mode gm = d->gating == HM_GATING_TOPK_SOFTMAX ? CPU_GATE_TOPK_SOFTMAX
                                                           : CPU_GATE_SOFTMAX_TOPK;
    hm_status st = cpu_router(op_pool(c->pool, n * hp->n_expert * 8), c->router, L->router_b.data,
                              n, (int)hp->n_expert, K, gm,
                              d->gating == HM_GATING_SOFTMAX_TOPK_NORM, c->ids, c->gw, err);
    if (st != HM_OK) return st;
    if (c->tracer) moe_tracer_record(c->tracer, il, c->ids, n, K);
    if (c->route_hook) c->route_hook(c->route_user, il, n, K, c->ids, c->gw);

    /* experts: per-slot outputs, then their weighted sum in slot order (with the default
     * executor at decode, inside the expert job, with the residual add when no shared expert
     * follows) */
    hm_moe_job job = {.layer = il, .n_tok = n, .n_used = K, .x = c->xn, .ids = c->ids,
                      .weights = c->gw, .y = c->ey};
    bool summed = false;
    if (c->moe_exec == hm_moe_exec_cpu) {
        const cpu_moe_sum sum = {.w = c->gw, .out = c->proj,
                                 .residual = d->shared_expert ? NULL : c->x};
        st = moe_exec_cpu(c, m, &job, &sum, &summed, err);
    } else {
        st = c->moe_exec(c->moe_impl, m, &job, err);
    }
    if (st != HM_OK) return st;
    if (!summed) cpu_moe_combine(op_pool(c->pool, n * K * E), c->ey, c->gw, c->ids, n, K, E, c->proj);

    if (d->shared_expert) { /* proj += sigmoid(xn . gate_inp) * down(silu(gate xn) * up xn) */
        const int64_t S = hp->n_ff_shexp;
        st = linear(c, &L->sh_gate, NULL, c->xn, n, c->sg, err);
        if (st == HM_OK) st = linear(c, &L->sh_up, NULL, c->xn, n, c->su, err);
        if (st != HM_OK) return st;
        cpu_swiglu(op_pool(c->pool, n * S), c->sg, c->su, c->sg, n * S);
        float *sh = c->ey; /* [n][E]: the per-slot outputs are consumed already */
        st = linear(c, &L->sh_down, NULL, c->sg, n, sh, err);
        if (st == HM_OK) st = linear(c, &L->sh_gate_inp, NULL, c->xn, n, c->sgate, err);
        if (st != HM_OK) return st;
        cpu_sigmoid(NULL, c->sgate, c->sgate, n);
        for (int t = 0; t < n; t++) cpu_scale(NULL, sh + t * E, c->sgate[t], sh + t * E, E);
        cpu_add(pe, c->proj, sh, c->proj, n * E);
    }
    if (!summed || d->shared_expert) cpu_add(pe, c->x, c->proj, c->x, n * E);
    return HM_OK;
}

hm_status model_forward_ubatch(hm_context *c, const int32_t *tokens, int n, int pos,
                               float *logits, hm_logits_mode mode, hm_error *err) {
    const hm_model *m = c->m;
    const hm_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd;
    hm_status st = HM_OK;

    /* embed: row tokens[t] of token_embd, dequantised */
    for (int t = 0; t < n; t++) {
        c->pos[t] = pos + t;
        st = quant_dequantize_row(m->tok_embd.type,
                                  (const char *)m->tok_embd.data +
                                      (size_t)tokens[t] * m->tok_embd.row_size,
                                  c->x + t * E, E);
        if (st != HM_OK)
            return hm_error_set(err, st, "cannot read row %d of %s", tokens[t], m->tok_embd.name);
    }
    /* every layer rotates q and k at these positions: their cos/sin once */
    const cpu_rope_params rp = hm_model_rope_params(m);
    st = cpu_rope_table(&rp, (int)hp->head_dim_k, c->pos, n, c->rope_cs, err);
    if (st == HM_OK && n == 1) { /* decode: one pool job for the whole step when it can be */
        bool done = false;
        st = model_token_forward(c, mode == HM_LOGITS_NONE ? NULL : logits, &done, err);
        if (done || st != HM_OK) return st;
    }
    for (int il = 0; il < hp->n_layer && st == HM_OK; il++) {
        st = layer_front(c, il, n, err);
        if (st == HM_OK) st = moe_block(c, il, n, err);
    }
    if (st != HM_OK || mode == HM_LOGITS_NONE) return st;

    /* output: final norm and logits, for every token or only the last */
    int first = mode == HM_LOGITS_ALL ? 0 : n - 1;
    int cnt = n - first;
    cpu_rmsnorm(op_pool(c->pool, cnt * E), c->x + first * E, m->output_norm.data, c->xn, cnt, E, hp->rms_eps);
    return linear(c, &m->output, NULL, c->xn, cnt, logits, err);
}
