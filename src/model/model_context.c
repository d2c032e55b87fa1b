/* model_context.c - the per-sequence state: KV cache, scratch buffers, thread pool; hm_decode.
 *
 * DESIGN: everything a forward pass writes is allocated here once, sized for n_ubatch tokens,
 * so hm_decode allocates nothing (the matmul/attention scratch sizes are computed for the
 * largest call; a call that would need more falls back to the kernel's own allocation rather
 * than failing). hm_decode checks its arguments, rewinds the cache if pos < n_past, and runs
 * the tokens in ubatches of at most n_ubatch. Full-attention layers keep n_ctx positions;
 * sliding-window layers a ring of window + n_ubatch - 1 (cpu_kv_slots_needed).
 *
 * With n_gpu_layers > 0 the context creates a GPU engine (cuda/cuda_engine.h: weights, KV cache
 * and scratch on the device) instead of the CPU cache and scratch, and hm_decode runs there. If
 * the engine cannot be created, gpu_strict makes hm_context_init fail with its reason; otherwise
 * one warning line names the reason and the CPU path is set up as usual.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "cpu/matmul.h"
#include "cuda/cuda_engine.h"
#include "base/cpu.h"
#include "model/model_internal.h"
#include "model/model_steps.h"
#include "moe/tracer.h"
#include "quant/qtypes.h"

hm_context_params hm_context_default_params(void) {
    hm_context_params p = {.n_ctx = 0, .n_batch = 2048, .n_ubatch = 512, .n_threads = 0,
                           .type_k = HM_TYPE_F16, .type_v = HM_TYPE_F16, .check_ram = true,
                           .n_gpu_layers = 0, .main_gpu = 0, .gpu_strict = false};
    return p;
}

/* Fills in defaults and clamps; returns HM_ERR_ARG on nonsense. */
static hm_status resolve_params(const hm_model *m, const hm_context_params *in,
                                hm_context_params *p, hm_error *err) {
    *p = in ? *in : hm_context_default_params();
    if (p->n_ctx < 0 || p->n_batch < 0 || p->n_ubatch < 0 || p->n_threads < 0)
        return hm_error_set(err, HM_ERR_ARG, "context sizes and thread count must be >= 0");
    if (p->n_gpu_layers < 0 || p->main_gpu < 0)
        return hm_error_set(err, HM_ERR_ARG, "-ngl and -mg must be >= 0");
    if (p->n_ctx == 0) p->n_ctx = (int)(m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096);
    if (p->n_batch == 0) p->n_batch = 2048;
    if (p->n_ubatch == 0) p->n_ubatch = 512;
    if (p->n_batch > p->n_ctx) p->n_batch = p->n_ctx;
    if (p->n_ubatch > p->n_batch) p->n_ubatch = p->n_batch;
    if (p->n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        p->n_threads = n > 0 ? (int)(n > 1024 ? 1024 : n) : 1;
    }
    if (p->n_ctx > (1 << 24))
        return hm_error_set(err, HM_ERR_RANGE, "context size %d is too large (max %d)", p->n_ctx,
                            1 << 24);
    if (p->n_threads > 1024)
        return hm_error_set(err, HM_ERR_RANGE, "thread count %d is too large (max 1024)",
                            p->n_threads);
    for (int i = 0; i < 2; i++) {
        uint32_t t = i ? p->type_v : p->type_k;
        if (t != HM_TYPE_F16 && t != HM_TYPE_Q8_0 && t != HM_TYPE_F32 && t != HM_TYPE_BF16)
            return hm_error_set(err, HM_ERR_UNSUPPORTED, "unsupported KV cache type %s (use f32,"
                                " f16, bf16 or q8_0)", hm_type_name(t));
        if (t == HM_TYPE_Q8_0 && m->hp.head_dim_k % 32)
            return hm_error_set(err, HM_ERR_UNSUPPORTED, "q8_0 KV cache needs a head size that "
                                "is a multiple of 32 (this model: %lld)",
                                (long long)m->hp.head_dim_k);
    }
    return HM_OK;
}

static int64_t layer_slots(const hm_model *m, const hm_context_params *p, int il) {
    if (m->layers[il].swa) {
        int64_t s = cpu_kv_slots_needed(m->hp.sliding_window, p->n_ubatch);
        if (s > 0 && s < p->n_ctx) return s;
    }
    return p->n_ctx;
}

/* Bytes of the scratch floats (see model_internal.h for each buffer's shape). */
static uint64_t scratch_floats(const hm_model *m, const hm_context_params *p) {
    const hm_hparams *hp = &m->hp;
    uint64_t nu = (uint64_t)p->n_ubatch, E = (uint64_t)hp->n_embd, K = (uint64_t)hp->n_expert_used;
    uint64_t nq = (uint64_t)(hp->n_head * hp->head_dim_k);
    uint64_t nk = (uint64_t)(hp->n_head_kv * hp->head_dim_k);
    return nu * (3 * E + 2 * nq + 2 * nk + (uint64_t)hp->n_expert + K + 2 * K * hp->n_ff_exp +
                 K * E + 2 * (uint64_t)hp->n_ff_shexp + 1);
}

uint64_t hm_context_bytes(const hm_model *m, const hm_context_params *params) {
    hm_context_params p;
    if (resolve_params(m, params, &p, NULL) != HM_OK) return 0;
    uint64_t kv = 0;
    for (int il = 0; il < m->hp.n_layer; il++)
        kv += (uint64_t)layer_slots(m, &p, il) *
              (hm_row_size(p.type_k, m->hp.n_head_kv * m->hp.head_dim_k) +
               hm_row_size(p.type_v, m->hp.n_head_kv * m->hp.head_dim_v));
    return kv + scratch_floats(m, &p) * sizeof(float);
}

/* Largest matmul / moe scratch any call of a ubatch needs. */
static size_t mm_scratch_max(const hm_model *m, int64_t nu) {
    const hm_hparams *hp = &m->hp;
    size_t mx = cpu_matmul_scratch_size(m->output.type, hp->n_embd, nu);
    for (int il = 0; il < hp->n_layer; il++) {
        const hm_layer *L = &m->layers[il];
        const hm_tensor *mats[] = {&L->wq, &L->wk, &L->wv, &L->router, &L->sh_gate, &L->sh_up,
                                   &L->sh_gate_inp};
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++) {
            if (!mats[i]->data) continue;
            size_t s = cpu_matmul_scratch_size(mats[i]->type, mats[i]->ne[0], nu);
            if (s > mx) mx = s;
        }
        size_t s = cpu_matmul_scratch_size(L->wo.type, L->wo.ne[0], nu);
        if (s > mx) mx = s;
        if (L->sh_down.data) {
            s = cpu_matmul_scratch_size(L->sh_down.type, L->sh_down.ne[0], nu);
            if (s > mx) mx = s;
        }
        const hm_tensor *ex[] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        { /* the one-job expert FFN of decode-sized batches (model_forward.c: up to 4 tokens) */
            const int64_t nf = nu < 4 ? nu : 4;
            cpu_moe_args g = {.wtype = L->gate_exps.type, .n_expert = hp->n_expert,
                              .n_rows = L->gate_exps.ne[1], .k = L->gate_exps.ne[0],
                              .n_tok = nf, .n_used = (int)hp->n_expert_used};
            cpu_moe_args dn = {.wtype = L->down_exps.type, .n_expert = hp->n_expert,
                               .n_rows = L->down_exps.ne[1], .k = L->down_exps.ne[0],
                               .x_per_slot = 1, .n_tok = nf, .n_used = (int)hp->n_expert_used};
            s = cpu_moe_ffn_scratch_size(&g, &dn);
            if (s > mx) mx = s;
        }
        for (int i = 0; i < 3; i++) {
            cpu_moe_args a = {.wtype = ex[i]->type, .w = ex[i]->data, .n_expert = hp->n_expert,
                              .n_rows = ex[i]->ne[1], .k = ex[i]->ne[0], .x_per_slot = i == 2,
                              .n_tok = nu, .n_used = (int)hp->n_expert_used};
            s = cpu_moe_scratch_size(&a);
            if (s > mx) mx = s;
        }
    }
    return mx;
}

/* Creates the GPU engine for ngl > 0. Failure: gpu_strict -> the engine's error; otherwise one
 * log line and the CPU path (HM_OK with c->gpu NULL). */
static hm_status gpu_open(hm_context *c, hm_error *err) {
    const hm_hparams *hp = &c->m->hp;
    if (c->p.n_gpu_layers < hp->n_layer + 1)
        HM_LOGW("-ngl %d: partial GPU placement is not implemented yet (next issue); placing "
                "the whole model (%lld layers + output) on the GPU", c->p.n_gpu_layers,
                (long long)hp->n_layer);
    cuda_engine_params ep = {.device = c->p.main_gpu, .n_ctx = c->p.n_ctx,
                             .n_ubatch = c->p.n_ubatch, .type_k = c->p.type_k,
                             .type_v = c->p.type_v};
    hm_error e2 = {0};
    hm_status st = cuda_engine_init(c->m, &ep, &c->gpu, &e2);
    if (st == HM_OK) {
        HM_LOGI("GPU: %s", cuda_engine_describe(c->gpu));
        return HM_OK;
    }
    c->gpu = NULL;
    if (c->p.gpu_strict)
        return hm_error_set(err, st, "GPU required (--gpu-strict) but unavailable: %s", e2.msg);
    HM_LOGW("GPU unavailable (%s); running on the CPU", e2.msg);
    return HM_OK;
}

hm_status hm_context_init(const hm_model *m, const hm_context_params *params, hm_context **out,
                          hm_error *err) {
    *out = NULL;
    hm_context_params p;
    hm_status st = resolve_params(m, params, &p, err);
    if (st != HM_OK) return st;
    const hm_hparams *hp = &m->hp;
    hm_context *c = calloc(1, sizeof(*c));
    if (!c) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (context)");
    c->m = m;
    c->p = p;
    c->kern = quant_kernels_best();
    c->moe_exec = hm_moe_exec_cpu;
    c->moe_impl = c;
    if (p.n_gpu_layers > 0) {
        st = gpu_open(c, err);
        if (st != HM_OK) {
            free(c);
            return st;
        }
    }
    /* RAM for the weights (mapped) and, on the CPU path, the KV cache and buffers; a context
     * on the GPU keeps those in VRAM (its admission control checked them) */
    if (p.check_ram) {
        const uint64_t ctx_bytes = c->gpu ? 0 : hm_context_bytes(m, &p);
        uint64_t need = hm_model_weight_bytes(m) + ctx_bytes, ram = hm_ram_bytes();
        if (ram && need > ram) {
            char b1[32], b2[32], b3[32], b4[32];
            hm_context_free(c);
            return hm_error_set(err, HM_ERR_NOMEM, "model needs %s of RAM (weights %s + KV cache "
                                "and buffers %s for -c %d) but this machine has %s",
                                hm_bytes_str(need, b1), hm_bytes_str(hm_model_weight_bytes(m), b2),
                                hm_bytes_str(ctx_bytes, b3), p.n_ctx,
                                hm_bytes_str(ram, b4));
        }
    }
    st = tp_init(p.n_threads, &c->pool, err);
    if (c->gpu) { /* the GPU holds the KV cache and the scratch */
        if (st != HM_OK) {
            hm_context_free(c);
            return st;
        }
        *out = c;
        return HM_OK;
    }
    c->kv = calloc((size_t)hp->n_layer, sizeof(cpu_kv_layer));
    if (st == HM_OK && !c->kv) st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (KV cache)");
    for (int il = 0; il < hp->n_layer && st == HM_OK; il++)
        st = cpu_kv_init(&c->kv[il], p.type_k, p.type_v, (int)hp->n_head_kv, (int)hp->head_dim_k,
                         layer_slots(m, &p, il), err);
    if (st != HM_OK) {
        hm_context_free(c);
        return st;
    }
    const int64_t nu = p.n_ubatch, E = hp->n_embd, K = hp->n_expert_used;
    const int64_t nq = hp->n_head * hp->head_dim_k, nk = hp->n_head_kv * hp->head_dim_k;
    bool ok = true;
#define ALLOC(ptr, count)                                                                        \
    do {                                                                                         \
        size_t n_ = (size_t)(count);                                                             \
        (ptr) = n_ ? malloc(n_ * sizeof(*(ptr))) : NULL;                                         \
        if (n_ && !(ptr)) ok = false;                                                            \
    } while (0)
    ALLOC(c->x, nu * E);
    ALLOC(c->xn, nu * E);
    ALLOC(c->q, nu * nq);
    ALLOC(c->k, nu * nk);
    ALLOC(c->v, nu * nk);
    ALLOC(c->attn, nu * nq);
    ALLOC(c->proj, nu * E);
    ALLOC(c->pos, nu);
    ALLOC(c->rope_cs, nu * (hp->n_rot > 0 ? hp->n_rot : 1));
    ALLOC(c->router, nu * hp->n_expert);
    ALLOC(c->ids, nu * K);
    ALLOC(c->gw, nu * K);
    ALLOC(c->eg, nu * K * hp->n_ff_exp);
    ALLOC(c->eu, nu * K * hp->n_ff_exp);
    ALLOC(c->ey, nu * K * E);
    ALLOC(c->sg, nu * hp->n_ff_shexp);
    ALLOC(c->su, nu * hp->n_ff_shexp);
    ALLOC(c->sgate, nu);
#undef ALLOC
    c->mm_scratch_size = mm_scratch_max(m, nu);
    c->mm_scratch = malloc(c->mm_scratch_size ? c->mm_scratch_size : 1);
    /* attention scratch for the largest call: a full ubatch at the end of the context */
    cpu_attn_args a = {.n_head = (int)hp->n_head, .n_tok = nu, .pos0 = p.n_ctx - nu};
    c->attn_scratch_size = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        a.window = m->layers[il].swa ? hp->sliding_window : 0;
        size_t s = cpu_attention_scratch_size(&c->kv[il], &a, tp_size(c->pool));
        if (s > c->attn_scratch_size) c->attn_scratch_size = s;
    }
    c->attn_scratch = malloc(c->attn_scratch_size ? c->attn_scratch_size : 1);
    if (!ok || !c->mm_scratch || !c->attn_scratch) {
        hm_context_free(c);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (context buffers)");
    }
    *out = c;
    return HM_OK;
}

void hm_context_free(hm_context *c) {
    if (!c) return;
    cuda_engine_free(c->gpu);
    if (c->kv)
        for (int il = 0; il < c->m->hp.n_layer; il++) cpu_kv_free(&c->kv[il]);
    free(c->kv);
    tp_free(c->pool);
    model_token_free(c);
    void *bufs[] = {c->x,      c->xn,     c->q,  c->k,         c->v,   c->attn, c->proj,
                    c->pos,    c->rope_cs, c->router, c->ids, c->gw, c->eg,   c->eu,
                    c->ey,     c->sg,      c->su, c->sgate,     c->mm_scratch, c->attn_scratch};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
    free(c);
}

int hm_context_n_past(const hm_context *c) { return c->n_past; }
int hm_context_n_ctx(const hm_context *c) { return c->p.n_ctx; }
const hm_model *hm_context_model(const hm_context *c) { return c->m; }
int hm_context_n_threads(const hm_context *c) { return tp_size(c->pool); }
struct cuda_engine *hm_context_gpu(const hm_context *c) { return c->gpu; }
const hm_tensor *hm_model_tok_embd(const hm_model *m) { return &m->tok_embd; }
const hm_tensor *hm_model_output_norm(const hm_model *m) { return &m->output_norm; }
const hm_tensor *hm_model_output(const hm_model *m) { return &m->output; }

void hm_context_reset(hm_context *c) {
    /* the GPU cache is overwritten from the position a decode starts at: nothing to clear */
    if (c->kv)
        for (int il = 0; il < c->m->hp.n_layer; il++) cpu_kv_clear(&c->kv[il]);
    c->n_past = 0;
}

hm_status hm_context_truncate(hm_context *c, int n_keep, hm_error *err) {
    if (n_keep < 0 || n_keep > c->n_past)
        return hm_error_set(err, HM_ERR_ARG, "cannot keep %d positions of %d", n_keep, c->n_past);
    if (n_keep == 0) {
        hm_context_reset(c);
        return HM_OK;
    }
    /* a sliding-window ring must still hold the window before n_keep (the GPU keeps every
     * position of every layer) */
    int64_t W = c->m->hp.sliding_window;
    for (int il = 0; il < c->m->hp.n_layer && c->kv; il++) {
        const cpu_kv_layer *kv = &c->kv[il];
        if (!c->m->layers[il].swa || kv->n_slots >= c->p.n_ctx) continue;
        for (int64_t q = n_keep - W + 1 > 0 ? n_keep - W + 1 : 0; q < n_keep; q++)
            if (kv->slot_pos[q % kv->n_slots] != q)
                return hm_error_set(err, HM_ERR_STATE, "cannot rewind to position %d: the "
                                    "sliding-window cache of layer %d no longer holds position "
                                    "%lld", n_keep, il, (long long)q);
    }
    c->n_past = n_keep;
    return HM_OK;
}

void hm_context_set_route_hook(hm_context *c, hm_route_hook_fn fn, void *user) {
    c->route_hook = fn;
    c->route_user = user;
}

void hm_context_set_moe_exec(hm_context *c, hm_moe_exec_fn fn, void *impl) {
    c->moe_exec = fn ? fn : hm_moe_exec_cpu;
    c->moe_impl = fn ? impl : c;
}

void hm_context_set_tracer(hm_context *c, struct moe_tracer *t) { c->tracer = t; }

hm_status hm_decode(hm_context *c, const int32_t *tokens, int n_tok, int pos, float *logits,
                    hm_logits_mode mode, hm_error *err) {
    const hm_hparams *hp = &c->m->hp;
    if (n_tok <= 0 || !tokens)
        return hm_error_set(err, HM_ERR_ARG, "nothing to decode (%d tokens)", n_tok);
    if (mode != HM_LOGITS_NONE && !logits)
        return hm_error_set(err, HM_ERR_ARG, "logits requested but no buffer given");
    if (n_tok > c->p.n_batch)
        return hm_error_set(err, HM_ERR_ARG, "%d tokens in one call exceed the batch size %d "
                            "(-b)", n_tok, c->p.n_batch);
    if (pos < 0 || pos > c->n_past)
        return hm_error_set(err, HM_ERR_ARG, "position %d is past the %d positions in the cache",
                            pos, c->n_past);
    if ((int64_t)pos + n_tok > c->p.n_ctx)
        return hm_error_set(err, HM_ERR_RANGE, "%d tokens at position %d do not fit the context "
                            "size %d (-c)", n_tok, pos, c->p.n_ctx);
    for (int i = 0; i < n_tok; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return hm_error_set(err, HM_ERR_RANGE, "token id %d at index %d is outside the "
                                "vocabulary (%lld tokens)", tokens[i], i, (long long)hp->n_vocab);
    if (pos < c->n_past) {
        hm_status st = hm_context_truncate(c, pos, err);
        if (st != HM_OK) return st;
    }
    if (c->gpu) {
        if (c->route_hook || c->tracer || c->moe_exec != hm_moe_exec_cpu)
            return hm_error_set(err, HM_ERR_UNSUPPORTED, "route hooks, the expert tracer and "
                                "custom expert executors run on the CPU path only (use -ngl 0)");
        hm_status st = cuda_engine_decode(c->gpu, tokens, n_tok, pos, logits, mode, err);
        if (st != HM_OK) return st;
        c->n_past = pos + n_tok;
        return HM_OK;
    }
    for (int done = 0; done < n_tok;) {
        int n = n_tok - done < c->p.n_ubatch ? n_tok - done : c->p.n_ubatch;
        bool last = done + n == n_tok;
        hm_logits_mode um = mode == HM_LOGITS_ALL ? HM_LOGITS_ALL
                            : (mode == HM_LOGITS_LAST && last) ? HM_LOGITS_LAST : HM_LOGITS_NONE;
        float *lo = mode == HM_LOGITS_ALL ? logits + (size_t)done * (size_t)hp->n_vocab : logits;
        hm_status st = model_forward_ubatch(c, tokens + done, n, pos + done, lo, um, err);
        if (st != HM_OK) return st;
        c->n_past = pos + done + n;
        done += n;
    }
    return HM_OK;
}
