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
 * Decode (up to MODEL_FEW_TOK tokens) pays for every pool job (wake the threads, wait for the
 * slowest) more than for most of its ops, so a layer is two jobs: the front of the layer — q/k/v,
 * attention, wo and the router product — is one staged job (tp_run_stages), and the expert FFN
 * is one (cpu_moe_ffn); a one-token step with the default expert executor is one job for all
 * layers (model_token.c, from the same steps: model_steps.h; the front job is model_front.c's).
 * All paths call the same step functions and kernels, so they give the same bytes.
 *
 * Buffers (nu = n_ubatch, n = tokens in this ubatch; shapes in model_internal.h):
 *   x [n][n_embd] residual; xn [n][n_embd] normed; q/k/v projections; attn [n][n_head*hd];
 *   proj [n][n_embd] block output; router [n][n_expert]; ids/gw [n][n_used];
 *   eg/eu [n][n_used][n_ff_exp]; ey [n][n_used][n_embd]; sg/su [n][n_ff_shexp]; sgate [n].
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "base/spin.h"
#include "cpu/matmul.h"
#include "model/model_internal.h"
#include "model/model_steps.h"
#include "moe/tracer.h"

/* Norms, rope, elementwise ops and the router of up to this many elements run on the calling
 * thread: for a decode step a pool job (wake every thread, join them) costs more than the op,
 * and the results do not depend on the thread count. */
enum { FWD_INLINE_ELEMS = 65536 };

/* pool for an op of elems elements: NULL (the calling thread) when small or inside a job. */
static tp_pool *op_pool(tp_pool *pool, int64_t elems) {
    return elems <= FWD_INLINE_ELEMS ? NULL : pool;
}

static void add_bias(tp_pool *pool, const hm_tensor *b, float *y, int64_t n, int64_t rows) {
    if (b && b->data) cpu_add_bias(op_pool(pool, n * rows), y, b->data, n, rows);
}

bool model_mm_fits(const hm_context *c, const hm_tensor *w, int64_t n) {
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
bool model_qkv_mats(hm_context *c, const hm_layer *L, cpu_matmul_mat *mats) {
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
    if (!model_qkv_mats(c, L, mats)) {
        const hm_tensor *w[3] = {&L->wq, &L->wk, &L->wv};
        hm_status st = HM_OK;
        for (int i = 0; i < 3 && st == HM_OK; i++) st = linear(c, w[i], NULL, x, n, mats[i].y, err);
        return st;
    }
    bool fits = model_mm_fits(c, &L->wq, n);
    return cpu_matmul_multi(c->pool, c->kern, 3, mats, L->wq.ne[0], x, n,
                            fits ? c->mm_scratch : NULL, fits ? c->mm_scratch_size : 0, err);
}

/* After the q/k/v products: their biases, the q/k norms and rope (pool NULL inside a job). */
hm_status model_qkv_finish(hm_context *c, const hm_layer *L, int n, tp_pool *pool,
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

cpu_attn_args model_attn_args(const hm_context *c, int il, int n) {
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
    if (pair && n <= MODEL_FEW_TOK) {
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
    if (st == HM_OK) st = model_qkv_finish(c, L, n, c->pool, err);
    if (st != HM_OK) return st;
    cpu_attn_args a = model_attn_args(c, il, n);
    size_t need = cpu_attention_scratch_size(&c->kv[il], &a, tp_size(c->pool));
    bool fits = need <= c->attn_scratch_size;
    st = cpu_attention(c->pool, &c->kv[il], &a, fits ? c->attn_scratch : NULL,
                       fits ? c->attn_scratch_size : 0, err);
    if (st == HM_OK) st = linear(c, &L->wo, NULL, c->attn, n, c->proj, err);
    return st;
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
