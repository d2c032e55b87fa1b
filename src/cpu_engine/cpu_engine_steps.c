/* cpu_engine_steps.c - the steps of a layer that the forward pass (cpu_engine_forward.c) and the
 * staged front (cpu_engine_front.c) share: products with their scratch, q/k/v and what follows
 * them, the attention's arguments. */
#include "cpu_engine/cpu_engine_steps.h"

tp_pool *ce_op_pool(tp_pool *pool, int64_t elems) {
    return elems <= CE_INLINE_ELEMS ? NULL : pool;
}

void ce_add_bias(tp_pool *pool, const hm_tensor *b, float *y, int64_t n, int64_t rows) {
    if (b && b->data) cpu_add_bias(ce_op_pool(pool, n * rows), y, b->data, n, rows);
}

bool ce_mm_fits(const cpu_engine *c, const hm_tensor *w, int64_t n) {
    return cpu_matmul_scratch_size(w->type, w->ne[0], n) <= c->mm_scratch_size;
}

hm_status ce_linear(cpu_engine *c, const hm_tensor *w, const hm_tensor *b, const float *x,
                        int64_t n, float *y, hm_error *err) {
    size_t need = cpu_matmul_scratch_size(w->type, w->ne[0], n);
    bool fits = need <= c->mm_scratch_size;
    const cpu_matmul_mat mat = {.wtype = w->type, .w = w->data, .n_rows = w->ne[1], .y = y,
                                .x8 = w->x8};
    hm_status st = cpu_matmul_multi(c->pool, c->kern, 1, &mat, w->ne[0], x, n,
                                    fits ? c->mm_scratch : NULL, fits ? c->mm_scratch_size : 0,
                                    err);
    if (st == HM_OK) ce_add_bias(c->pool, b, y, n, w->ne[1]);
    return st;
}

hm_status ce_linear_multi(cpu_engine *c, int n_mat, const hm_tensor *const *w, float *const *y,
                          const float *x, int64_t n, hm_error *err) {
    cpu_matmul_mat mats[CPU_MATMUL_MAX_MULTI];
    bool same = n_mat <= CPU_MATMUL_MAX_MULTI;
    for (int i = 0; i < n_mat && same; i++) {
        mats[i] = (cpu_matmul_mat){.wtype = w[i]->type, .w = w[i]->data, .n_rows = w[i]->ne[1],
                                   .y = y[i], .x8 = w[i]->x8};
        same = w[i]->ne[0] == w[0]->ne[0] &&
               quant_act_for(w[i]->type) == quant_act_for(w[0]->type);
    }
    if (!same) {
        hm_status st = HM_OK;
        for (int i = 0; i < n_mat && st == HM_OK; i++)
            st = ce_linear(c, w[i], NULL, x, n, y[i], err);
        return st;
    }
    const bool fits = ce_mm_fits(c, w[0], n);
    return cpu_matmul_multi(c->pool, c->kern, n_mat, mats, w[0]->ne[0], x, n,
                            fits ? c->mm_scratch : NULL, fits ? c->mm_scratch_size : 0, err);
}

/* The q, k and v products of one layer: mats [3] (outputs c->q, c->k, c->v); true when they
 * share their input length and activation format (one product of three matrices). */
bool ce_qkv_mats(cpu_engine *c, const hm_layer *L, cpu_matmul_mat *mats) {
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

/* After the q/k/v products: their biases, the q/k norms and rope (pool NULL inside a job). */
hm_status ce_qkv_finish(cpu_engine *c, const hm_layer *L, int n, tp_pool *pool,
                            hm_error *err) {
    const hm_hparams *hp = c->hp;
    const int nh = (int)hp->n_head, nkv = (int)hp->n_head_kv, hd = (int)hp->head_dim_k;
    tp_pool *pq = ce_op_pool(pool, (int64_t)n * nh * hd);
    ce_add_bias(pool, &L->bq, c->q, n, L->wq.ne[1]);
    ce_add_bias(pool, &L->bk, c->k, n, L->wk.ne[1]);
    ce_add_bias(pool, &L->bv, c->v, n, L->wv.ne[1]);
    if (c->desc->qk_norm == HM_QKNORM_HEAD) { /* each head of q [n][nh][hd], k [n][nkv][hd] */
        cpu_rmsnorm(pq, c->q, L->q_norm.data, c->q, (int64_t)n * nh, hd, hp->rms_eps);
        cpu_rmsnorm(pq, c->k, L->k_norm.data, c->k, (int64_t)n * nkv, hd, hp->rms_eps);
    } else if (c->desc->qk_norm == HM_QKNORM_FULL) { /* the whole projection of each token */
        cpu_rmsnorm(pq, c->q, L->q_norm.data, c->q, n, (int64_t)nh * hd, hp->rms_eps);
        cpu_rmsnorm(pq, c->k, L->k_norm.data, c->k, n, (int64_t)nkv * hd, hp->rms_eps);
    }
    const cpu_rope_params rp = hm_model_rope_params(c->m);
    hm_status st = cpu_rope_with_table(pq, c->q, n, nh, hd, c->rope_cs, &rp, err);
    if (st == HM_OK) st = cpu_rope_with_table(pq, c->k, n, nkv, hd, c->rope_cs, &rp, err);
    return st;
}

cpu_attn_args ce_attn_args(const cpu_engine *c, int il, int n) {
    const hm_hparams *hp = c->hp;
    const hm_layer *L = hm_model_layer(c->m, il);
    /* gemma4's scores are unscaled (its q/k norms stand in for 1/sqrt(head size)) */
    return (cpu_attn_args){.n_head = (int)hp->n_head, .n_tok = n, .pos0 = c->pos[0],
                           .window = L->swa ? hp->sliding_window : 0,
                           .scale = c->desc->gemma4 ? 1.0f : 0.0f,
                           .sinks = L->sinks.data, .q = c->q, .k_new = c->k, .v_new = c->v,
                           .out = c->attn};
}

hm_status ce_attend(cpu_engine *c, int il, int n, hm_error *err) {
    const hm_hparams *hp = c->hp;
    hm_status st = HM_OK;
    /* one attention per run of tokens of one sequence at consecutive positions (all of them
     * outside cpu_engine_forward_seqs) */
    /* the rows' widths: the layer's cache's (gemma4's layer kinds have their own) */
    const cpu_kv_layer *k0 = &c->kv_all[il];
    const int64_t nq = hp->n_head * k0->head_dim, nk = (int64_t)k0->n_head_kv * k0->head_dim;
    const int64_t nv = nk, no = nq;
    for (int t0 = 0, t1; t0 < n && st == HM_OK; t0 = t1) {
        const int sq = c->tok_seq ? c->tok_seq[t0] : 0;
        for (t1 = t0 + 1; t1 < n && (c->tok_seq ? c->tok_seq[t1] : 0) == sq &&
                          c->pos[t1] == c->pos[t1 - 1] + 1;)
            t1++;
        cpu_kv_layer *kv = c->tok_seq
                               ? &c->kv_all[(size_t)sq * (size_t)hp->n_layer + (size_t)il]
                               : &c->kv[il];
        cpu_attn_args a = ce_attn_args(c, il, t1 - t0);
        a.pos0 = c->pos[t0];
        a.q = c->q + t0 * nq, a.k_new = c->k + t0 * nk, a.v_new = c->v + t0 * nv;
        a.out = c->attn + t0 * no;
        size_t need = cpu_attention_scratch_size(kv, &a, tp_size(c->pool));
        bool fits = need <= c->attn_scratch_size;
        st = cpu_attention(c->pool, kv, &a, fits ? c->attn_scratch : NULL,
                           fits ? c->attn_scratch_size : 0, err);
    }
    return st;
}
