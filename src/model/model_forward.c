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
 * out); the weighted sum over the slots happens here, in slot order (cpu_moe_combine).
 *
 * Buffers (nu = n_ubatch, n = tokens in this ubatch; shapes in model_internal.h):
 *   x [n][n_embd] residual; xn [n][n_embd] normed; q/k/v projections; attn [n][n_head*hd];
 *   proj [n][n_embd] block output; router [n][n_expert]; ids/gw [n][n_used];
 *   eg/eu [n][n_used][n_ff_exp]; ey [n][n_used][n_embd]; sg/su [n][n_ff_shexp]; sgate [n].
 */
#include <string.h>

#include "cpu/matmul.h"
#include "model/model_internal.h"
#include "moe/tracer.h"

/* Norms, rope, elementwise ops and the router of up to this many elements run on the calling
 * thread: for a decode step a pool job (wake every thread, join them) costs more than the op,
 * and the results do not depend on the thread count. */
enum { FWD_INLINE_ELEMS = 65536 };

/* Up to this many tokens the expert FFN is one pool job (cpu_moe_ffn), above it two. */
enum { FWD_FFN_ONE_JOB = 4 };

static tp_pool *op_pool(const hm_context *c, int64_t elems) {
    return elems <= FWD_INLINE_ELEMS ? NULL : c->pool;
}

/* y[n][rows of w] = x[n][w->ne[0]] . w (+ bias b when given). */
static hm_status linear(hm_context *c, const hm_tensor *w, const hm_tensor *b, const float *x,
                        int64_t n, float *y, hm_error *err) {
    size_t need = cpu_matmul_scratch_size(w->type, w->ne[0], n);
    bool fits = need <= c->mm_scratch_size;
    hm_status st = cpu_matmul(c->pool, c->kern, w->type, w->data, w->ne[1], w->ne[0], x, n, y,
                              fits ? c->mm_scratch : NULL, fits ? c->mm_scratch_size : 0, err);
    if (st == HM_OK && b && b->data) cpu_add_bias(op_pool(c, n * w->ne[1]), y, b->data, n, w->ne[1]);
    return st;
}

/* q, k and v of one input: one pool job (activations quantised once) when the three weight
 * types share an activation format, else three products. */
static hm_status linear_qkv(hm_context *c, const hm_layer *L, const float *x, int64_t n,
                            hm_error *err) {
    const hm_tensor *w[3] = {&L->wq, &L->wk, &L->wv}, *b[3] = {&L->bq, &L->bk, &L->bv};
    float *y[3] = {c->q, c->k, c->v};
    bool same = true;
    for (int i = 1; i < 3; i++)
        same = same && w[i]->ne[0] == w[0]->ne[0] &&
               quant_act_for(w[i]->type) == quant_act_for(w[0]->type);
    if (!same) {
        hm_status st = HM_OK;
        for (int i = 0; i < 3 && st == HM_OK; i++) st = linear(c, w[i], b[i], x, n, y[i], err);
        return st;
    }
    cpu_matmul_mat mats[3];
    for (int i = 0; i < 3; i++)
        mats[i] = (cpu_matmul_mat){.wtype = w[i]->type, .w = w[i]->data, .n_rows = w[i]->ne[1],
                                   .y = y[i]};
    size_t need = cpu_matmul_scratch_size(w[0]->type, w[0]->ne[0], n);
    bool fits = need <= c->mm_scratch_size;
    hm_status st = cpu_matmul_multi(c->pool, c->kern, 3, mats, w[0]->ne[0], x, n,
                                    fits ? c->mm_scratch : NULL, fits ? c->mm_scratch_size : 0,
                                    err);
    for (int i = 0; i < 3 && st == HM_OK; i++)
        if (b[i]->data) cpu_add_bias(op_pool(c, n * w[i]->ne[1]), y[i], b[i]->data, n, w[i]->ne[1]);
    return st;
}

static hm_status moe_matmul(hm_context *c, const cpu_moe_args *a, hm_error *err) {
    size_t need = cpu_moe_scratch_size(a);
    bool fits = need <= c->mm_scratch_size;
    return cpu_moe_matmul(c->pool, c->kern, a, fits ? c->mm_scratch : NULL,
                          fits ? c->mm_scratch_size : 0, err);
}

/* Rows [r0, r1) of slot p of the gate/up products: expert biases, then the activation into eg
 * (run inside the fused gate/up job; elementwise, so the same values as whole-buffer ops). */
typedef struct {
    const hm_layer *L;
    const int32_t *ids;
    float *eg, *eu;
    int64_t F;
    bool oai;
    int simd; /* cpu_act_simd(), read once per layer */
} moe_post_ctx;

static void moe_post_gate_up(void *ctx, int64_t p, int64_t r0, int64_t r1) {
    const moe_post_ctx *pc = ctx;
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

/* The CPU expert FFN: y[t][s] = down(act(gate(x[t]), up(x[t]))) of expert ids[t][s]. */
hm_status hm_moe_exec_cpu(void *impl, const hm_model *m, const hm_moe_job *job,
                             hm_error *err) {
    hm_context *c = impl;
    const hm_hparams *hp = &m->hp;
    const hm_layer *L = &m->layers[job->layer];
    const int64_t n = job->n_tok, F = hp->n_ff_exp, E = hp->n_embd;
    const int K = job->n_used;
    cpu_moe_args a = {.n_expert = hp->n_expert, .ids = job->ids, .n_tok = n, .n_used = K};
    /* gate and up: every slot of token t reads x[t] */
    a.wtype = L->gate_exps.type, a.w = L->gate_exps.data, a.n_rows = F, a.k = E;
    a.x = job->x, a.x_per_slot = 0, a.y = c->eg;
    cpu_moe_args b = a;
    b.wtype = L->up_exps.type, b.w = L->up_exps.data, b.y = c->eu;
    const bool oai = m->desc->swiglu == HM_SWIGLU_OAI;
    cpu_moe_args d = a; /* down: slot s of token t reads its own activation eg[t][s] */
    d.wtype = L->down_exps.type, d.w = L->down_exps.data, d.n_rows = E, d.k = F;
    d.x = c->eg, d.x_per_slot = 1, d.y = job->y;
    hm_status st;
    const bool pair = quant_act_for(a.wtype) == quant_act_for(b.wtype) &&
                      (!L->gate_exps_b.data || L->up_exps_b.data);
    moe_post_ctx pc = {.L = L, .ids = job->ids, .eg = c->eg, .eu = c->eu, .F = F, .oai = oai,
                        .simd = cpu_act_simd()};
    if (pair && n <= FWD_FFN_ONE_JOB) {
        /* decode: gate/up, activation and down in one pool job */
        size_t need = cpu_moe_ffn_scratch_size(&a, &d);
        bool fits = need <= c->mm_scratch_size;
        st = cpu_moe_ffn(c->pool, c->kern, &a, &b, moe_post_gate_up, &pc, &d,
                         fits ? c->mm_scratch : NULL, fits ? c->mm_scratch_size : 0, err);
        if (st == HM_OK && L->down_exps_b.data)
            cpu_moe_add_bias(op_pool(c, n * K * E), job->y, L->down_exps_b.data, job->ids, n, K,
                             E);
        return st;
    }
    if (pair) {
        /* one job: gate and up rows of each chunk, then their biases and activation */
        size_t need = cpu_moe_scratch_size(&a);
        bool fits = need <= c->mm_scratch_size;
        st = cpu_moe_matmul_pair(c->pool, c->kern, &a, &b, moe_post_gate_up, &pc,
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
        cpu_moe_add_bias(op_pool(c, n * K * E), job->y, L->down_exps_b.data, job->ids, n, K, E);
    return st;
}

static hm_status attention_block(hm_context *c, int il, int n, hm_error *err) {
    const hm_model *m = c->m;
    const hm_hparams *hp = &m->hp;
    const hm_arch_desc *d = m->desc;
    const hm_layer *L = &m->layers[il];
    const int nh = (int)hp->n_head, nkv = (int)hp->n_head_kv, hd = (int)hp->head_dim_k;
    tp_pool *pe = op_pool(c, n * hp->n_embd), *pq = op_pool(c, (int64_t)n * nh * hd);

    cpu_rmsnorm(pe, c->x, L->attn_norm.data, c->xn, n, hp->n_embd, hp->rms_eps);
    hm_status st = linear_qkv(c, L, c->xn, n, err);
    if (st != HM_OK) return st;
    if (d->qk_norm == HM_QKNORM_HEAD) { /* each head of q [n][nh][hd], k [n][nkv][hd] */
        cpu_rmsnorm(pq, c->q, L->q_norm.data, c->q, (int64_t)n * nh, hd, hp->rms_eps);
        cpu_rmsnorm(pq, c->k, L->k_norm.data, c->k, (int64_t)n * nkv, hd, hp->rms_eps);
    } else if (d->qk_norm == HM_QKNORM_FULL) { /* the whole projection of each token */
        cpu_rmsnorm(pq, c->q, L->q_norm.data, c->q, n, (int64_t)nh * hd, hp->rms_eps);
        cpu_rmsnorm(pq, c->k, L->k_norm.data, c->k, n, (int64_t)nkv * hd, hp->rms_eps);
    }
    const cpu_rope_params rp = hm_model_rope_params(m);
    st = cpu_rope_with_table(pq, c->q, n, nh, hd, c->rope_cs, &rp, err);
    if (st == HM_OK) st = cpu_rope_with_table(pq, c->k, n, nkv, hd, c->rope_cs, &rp, err);
    if (st != HM_OK) return st;

    cpu_attn_args a = {.n_head = nh, .n_tok = n, .pos0 = c->pos[0],
                       .window = L->swa ? hp->sliding_window : 0, .scale = 0.0f,
                       .sinks = L->sinks.data, .q = c->q, .k_new = c->k, .v_new = c->v,
                       .out = c->attn};
    size_t need = cpu_attention_scratch_size(&c->kv[il], &a, tp_size(c->pool));
    bool fits = need <= c->attn_scratch_size;
    st = cpu_attention(c->pool, &c->kv[il], &a, fits ? c->attn_scratch : NULL,
                       fits ? c->attn_scratch_size : 0, err);
    if (st == HM_OK) st = linear(c, &L->wo, &L->bo, c->attn, n, c->proj, err);
    if (st == HM_OK) cpu_add(pe, c->x, c->proj, c->x, (int64_t)n * hp->n_embd);
    return st;
}

static hm_status moe_block(hm_context *c, int il, int n, hm_error *err) {
    const hm_model *m = c->m;
    const hm_hparams *hp = &m->hp;
    const hm_arch_desc *d = m->desc;
    const hm_layer *L = &m->layers[il];
    const int K = (int)hp->n_expert_used;
    const int64_t E = hp->n_embd;
    tp_pool *pe = op_pool(c, n * E);

    cpu_rmsnorm(pe, c->x, L->ffn_norm.data, c->xn, n, E, hp->rms_eps);
    /* routing: logits -> top-k ids and weights (slot order = descending score) */
    hm_status st = linear(c, &L->router, NULL, c->xn, n, c->router, err);
    if (st != HM_OK) return st;
    cpu_gate_mode gm = d->gating == HM_GATING_TOPK_SOFTMAX ? CPU_GATE_TOPK_SOFTMAX
                                                           : CPU_GATE_SOFTMAX_TOPK;
    st = cpu_router(op_pool(c, n * hp->n_expert * 8), c->router, L->router_b.data, n, (int)hp->n_expert, K, gm,
                    d->gating == HM_GATING_SOFTMAX_TOPK_NORM, c->ids, c->gw, err);
    if (st != HM_OK) return st;
    if (c->tracer) moe_tracer_record(c->tracer, il, c->ids, n, K);
    if (c->route_hook) c->route_hook(c->route_user, il, n, K, c->ids, c->gw);

    /* experts: per-slot outputs, then their weighted sum in slot order */
    hm_moe_job job = {.layer = il, .n_tok = n, .n_used = K, .x = c->xn, .ids = c->ids,
                      .weights = c->gw, .y = c->ey};
    st = c->moe_exec(c->moe_impl, m, &job, err);
    if (st != HM_OK) return st;
    cpu_moe_combine(op_pool(c, n * K * E), c->ey, c->gw, c->ids, n, K, E, c->proj);

    if (d->shared_expert) { /* proj += sigmoid(xn . gate_inp) * down(silu(gate xn) * up xn) */
        const int64_t S = hp->n_ff_shexp;
        st = linear(c, &L->sh_gate, NULL, c->xn, n, c->sg, err);
        if (st == HM_OK) st = linear(c, &L->sh_up, NULL, c->xn, n, c->su, err);
        if (st != HM_OK) return st;
        cpu_swiglu(op_pool(c, n * S), c->sg, c->su, c->sg, n * S);
        float *sh = c->ey; /* [n][E]: the per-slot outputs are consumed already */
        st = linear(c, &L->sh_down, NULL, c->sg, n, sh, err);
        if (st == HM_OK) st = linear(c, &L->sh_gate_inp, NULL, c->xn, n, c->sgate, err);
        if (st != HM_OK) return st;
        cpu_sigmoid(NULL, c->sgate, c->sgate, n);
        for (int t = 0; t < n; t++) cpu_scale(NULL, sh + t * E, c->sgate[t], sh + t * E, E);
        cpu_add(pe, c->proj, sh, c->proj, n * E);
    }
    cpu_add(pe, c->x, c->proj, c->x, n * E);
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
    for (int il = 0; il < hp->n_layer && st == HM_OK; il++) {
        st = attention_block(c, il, n, err);
        if (st == HM_OK) st = moe_block(c, il, n, err);
    }
    if (st != HM_OK || mode == HM_LOGITS_NONE) return st;

    /* output: final norm and logits, for every token or only the last */
    int first = mode == HM_LOGITS_ALL ? 0 : n - 1;
    int cnt = n - first;
    cpu_rmsnorm(op_pool(c, cnt * E), c->x + first * E, m->output_norm.data, c->xn, cnt, E, hp->rms_eps);
    return linear(c, &m->output, NULL, c->xn, cnt, logits, err);
}
