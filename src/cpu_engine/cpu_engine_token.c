/* cpu_engine_token.c - a decode step of one token as one pool job.
 *
 * DESIGN: a decode layer as two pool jobs (cpu_engine_forward.c) leaves the threads idle twice per
 * layer while the caller alone routes the token, plans the expert job, norms the residual and
 * quantises the next product's input (~10 µs per gap on the 16-core host, 1 ms a token). Here
 * every layer's stages are planned before the step and chained into one staged job (the pool
 * runs up to TP_MAX_STAGES): per layer the front's stages (q/k/v with attention, wo, router),
 * then the expert FFN as one more stage, then the output matrix after the last layer. The
 * serial steps become `then` steps on the thread that finishes a stage: after the router, the
 * routing and the expert job's plan (whose item count is known in advance: one token's K experts
 * are distinct); after the FFN, the next layer's attention bookkeeping (or the output norm).
 * The norms of the residual row are no serial steps: each thread norms it itself at its first
 * q/k/v item and at its router item (ce_front_thr), and the router items quantise the FFN's
 * input. Meanwhile the other threads hold their first item of the next stage and prefetch its
 * rows (the pool's gate prefetch), so the memory stream keeps going across what used to be job
 * boundaries. The expert FFN's items are known only once the router's `then` has planned the
 * expert job: that step publishes the plan (`planned`) first, and a thread waiting at the FFN's
 * gate prefetches its item from then on. The steps and kernels are cpu_engine_forward.c's and
 * cpu_engine_front.c's, so the bytes are.
 * A failed `then` step records its error in its layer; the next layer's steps see it and skip.
 * An engine with a layer range (cpu_engine.h) plans its layers only (L[i] is layer l0 + i); the
 * output matrix follows only when the range ends with the model's last layer.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/spin.h"
#include "cpu_engine/cpu_engine_steps.h"

typedef struct token_job token_job;

typedef struct {
    ce_front f;
    cpu_moe_args gate, up, down;
    moe_post_ctx pc;
    cpu_moe_sum sum;
    cpu_moe_ffn_job *ffn; /* cpu_moe_ffn_job_size() bytes */
    int64_t ffn_items;    /* the FFN stage's items, fixed before the routing */
    tp_item_fn ffn_fn;    /* the expert job's item function */
    token_job *t;
    int il;
    atomic_uint planned;  /* the token (token_job.serial) whose expert job is planned */
} token_layer;

struct token_job {
    cpu_engine *c;
    int l0;          /* the engine's first layer: L[i] is layer l0 + i */
    int n_layer;     /* layers of the engine's range */
    token_layer *L;  /* [n_layer] */
    uint8_t *ffn_mem; /* [n_layer] expert jobs */
    size_t ffn_size;
    tp_stage *stages; /* [n_layer * (CE_FRONT_STAGES + 1) + 1] */
    int *attn_at;     /* [n_layer] index of each layer's attention stage in stages */
    int n_planned;    /* stages of the layers once planned (0: not yet) */
    cpu_matmul_job out;
    float *logits; /* or NULL */
    unsigned serial; /* this decode step's number (the layers' `planned`) */
    ce_thr thr;   /* per-thread norms */
};

void ce_token_free(cpu_engine *c) {
    token_job *t = c->tok;
    if (!t) return;
    free(t->L);
    free(t->ffn_mem);
    free(t->stages);
    free(t->attn_at);
    free(t->thr.buf);
    free(t->thr.xq);
    free(t);
    c->tok = NULL;
}

static token_job *token_alloc(cpu_engine *c) {
    if (c->tok) return c->tok;
    const int nl = c->p.layer_end - c->p.layer_begin;
    token_job *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->c = c;
    t->l0 = c->p.layer_begin;
    t->n_layer = nl;
    t->ffn_size = (cpu_moe_ffn_job_size() + 63) / 64 * 64;
    t->L = calloc((size_t)nl, sizeof(token_layer));
    t->ffn_mem = aligned_alloc(64, t->ffn_size * (size_t)nl);
    t->stages = calloc((size_t)nl * (CE_FRONT_STAGES + 1) + 1, sizeof(tp_stage));
    t->attn_at = calloc((size_t)nl, sizeof(int));
    t->thr.stride = ce_thr_stride(c);
    t->thr.buf = aligned_alloc(64, t->thr.stride * (size_t)tp_size(c->pool));
    t->thr.xq = aligned_alloc(64, t->thr.stride); /* any activation row of n_embd fits */
    c->tok = t;
    if (!t->L || !t->ffn_mem || !t->stages || !t->attn_at || !t->thr.buf || !t->thr.xq) {
        ce_token_free(c);
        return NULL;
    }
    memset(t->ffn_mem, 0, t->ffn_size * (size_t)nl);
    memset(t->thr.buf, 0, t->thr.stride * (size_t)tp_size(c->pool)); /* tag 0: no row */
    for (int il = 0; il < nl; il++) {
        t->L[il].ffn = (cpu_moe_ffn_job *)(void *)(t->ffn_mem + (size_t)il * t->ffn_size);
        t->L[il].t = t;
        t->L[il].il = t->l0 + il;
    }
    return t;
}

/* After the router stage: the token's routing, then the expert job's plan and inputs. */
static void token_route(void *ctx) {
    token_layer *tl = ctx;
    ce_front *f = &tl->f;
    if (f->st != HM_OK) return;
    cpu_engine *c = f->c;
    const hm_hparams *hp = c->hp;
    const hm_arch_desc *d = c->desc;
    const int K = (int)hp->n_expert_used;
    const cpu_gate_mode gm = d->gating == HM_GATING_TOPK_SOFTMAX ? CPU_GATE_TOPK_SOFTMAX
                                                                 : CPU_GATE_SOFTMAX_TOPK;
    f->st = cpu_router(NULL, c->router, f->L->router_b.data, 1, (int)hp->n_expert, K, gm,
                       d->gating == HM_GATING_SOFTMAX_TOPK_NORM, c->ids, c->gw, &f->err);
    if (f->st != HM_OK) return;
    f->st = cpu_moe_ffn_job_init(tl->ffn, c->kern, &tl->gate, &tl->up, moe_exec_post, &tl->pc,
                                 &tl->down, &tl->sum, c->mm_scratch, c->mm_scratch_size,
                                 tp_size(c->pool), &f->err);
    if (f->st == HM_OK && cpu_moe_ffn_job_n_items(tl->ffn) != tl->ffn_items)
        f->st = hm_error_set(&f->err, HM_ERR_STATE, "decode: layer %d's expert job has %lld "
                             "items, %lld were planned (repeated expert ids?)", tl->il,
                             (long long)cpu_moe_ffn_job_n_items(tl->ffn), (long long)tl->ffn_items);
    if (f->st != HM_OK) return;
    atomic_store_explicit(&tl->planned, tl->t->serial, memory_order_release);
    if (c->obs.route) c->obs.route(c->obs.user, tl->il, 1, K, c->ids, c->gw);
    cpu_moe_ffn_job_inputs(tl->ffn, NULL);
}

/* At the FFN's gate: once this token's expert job is planned, item it's weight rows until the
 * gate opens. */
static void token_ffn_prefetch(void *ctx, int64_t it, const tp_gate *gate) {
    token_layer *tl = ctx;
    const unsigned want = tl->t->serial;
    /* spins at most the pool's wait budget (hm_spin_wait_ns), then gives up prefetching: the
     * thread then waits at the gate, which sleeps (a plan that comes late, e.g. its thread
     * descheduled, must not hold a core) */
    int64_t end = 0;
    for (unsigned i = 1; atomic_load_explicit(&tl->planned, memory_order_acquire) != want; i++) {
        if (tp_gate_open(gate)) return; /* a failed `then` plans nothing */
        HM_SPIN_RELAX();
        if (i % HM_TUNE_SPIN_CLOCK_EVERY) continue;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        const int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        if (!end) end = t + hm_spin_wait_ns;
        else if (t >= end) return;
    }
    cpu_moe_ffn_job_prefetch(tl->ffn, it, gate);
}

static void token_ffn_item(void *ctx, int64_t it, int ith) {
    token_layer *tl = ctx;
    if (tl->f.st == HM_OK) tl->ffn_fn(tl->ffn, it, ith);
}

/* After the FFN stage: the next layer's input (its attention norm, quantised for q/k/v) or the
 * output matrix's; a failure is handed on to the next layer. */
static void token_after_ffn(void *ctx) {
    token_layer *tl = ctx;
    token_job *t = tl->t;
    if (tl->il + 1 < t->l0 + t->n_layer) {
        token_layer *nx = &t->L[tl->il + 1 - t->l0];
        if (tl->f.st != HM_OK) {
            nx->f.st = tl->f.st;
            nx->f.err = tl->f.err;
        } else {
            ce_front_pre(&nx->f);
        }
        return;
    }
    if (tl->f.st != HM_OK || !t->logits) return;
    cpu_engine *c = t->c;
    const hm_model *m = c->m;
    cpu_rmsnorm(NULL, c->x, hm_model_output_norm(m)->data, c->xn, 1, c->hp->n_embd, c->hp->rms_eps);
    cpu_matmul_job_quantize(&t->out, c->xn);
}

/* Whether this context's decode steps can be one job at all (model and executor). */
static bool token_possible(const cpu_engine *c) {
    return c->pool && tp_size(c->pool) > 1 && moe_exec_all_cpu(c->exec) &&
           !c->desc->shared_expert && c->hp->n_expert_used > 0 &&
           (c->p.layer_end - c->p.layer_begin) * (CE_FRONT_STAGES + 1) + 1 <= TP_MAX_STAGES;
}

/* Plans every layer's stages into t (once per context: the products, the expert job's size and
 * the `then` steps do not change from token to token); false when a layer cannot take part. */
static bool token_plan(token_job *t, hm_status *st, hm_error *err) {
    cpu_engine *c = t->c;
    const hm_model *m = c->m;
    const int K = (int)c->hp->n_expert_used, nth = tp_size(c->pool);
    int ns = 0;
    for (int i = 0; i < t->n_layer; i++) {
        token_layer *tl = &t->L[i];
        const int il = tl->il;
        const int nf = ce_front_plan(c, il, 1, &tl->f, t->stages + ns, st, err);
        if (*st != HM_OK || nf == 0) return false;
        t->attn_at[i] = ns + tl->f.attn_at;
        t->stages[ns + nf - 1].then = token_route; /* the router's stage */
        t->stages[ns + nf - 1].then_ctx = tl;
        if (!moe_exec_cpu_args(c->exec, il, c->ids, 1, K, c->xn, c->ey, &tl->gate, &tl->up,
                               &tl->down,
                            &tl->pc) ||
            cpu_moe_ffn_scratch_size(&tl->gate, &tl->down) > c->mm_scratch_size)
            return false;
        if (ce_front_thr(&tl->f, &t->thr, t->stages + ns, nf, tl->gate.wtype))
            tl->gate.xq = tl->up.xq = t->thr.xq; /* quantised by the router items */
        ns += nf;
        tl->sum = (cpu_moe_sum){.w = c->gw, .bias = hm_model_layer(m, il)->down_exps_b.data,
                                .out = c->proj, .residual = c->x};
        tl->ffn_items = cpu_moe_ffn_job_items(&tl->gate, &tl->up, &tl->down, K, nth);
        tl->ffn_fn = cpu_moe_ffn_job_stage(tl->ffn).fn;
        t->stages[ns++] = (tp_stage){.fn = token_ffn_item, .ctx = tl, .n_items = tl->ffn_items,
                                     .then = token_after_ffn, .then_ctx = tl,
                                     .prefetch = token_ffn_prefetch};
    }
    t->n_planned = ns;
    return true;
}

hm_status ce_token_forward(cpu_engine *c, float *logits, bool *done, hm_error *err) {
    *done = false;
    if (!token_possible(c)) return HM_OK;
    token_job *t = token_alloc(c);
    if (!t) return HM_OK; /* out of memory for the plan: the two-job path needs none */
    hm_status st = HM_OK;
    if (t->n_planned == 0) {
        if (!token_plan(t, &st, err)) return st;
    } else { /* this token's attention plans and cleared flags */
        for (int i = 0; i < t->n_layer; i++)
            if (!ce_front_replan(&t->L[i].f, t->L[i].il, &t->stages[t->attn_at[i]], &st, err) ||
                st != HM_OK)
                return st;
    }
    int ns = t->n_planned;
    t->logits = logits;
    t->serial++;
    if (logits) {
        const hm_tensor *o = hm_model_output(c->m);
        const cpu_matmul_mat mat = {.wtype = o->type, .w = o->data, .n_rows = o->ne[1],
                                    .y = logits, .x8 = o->x8};
        if (cpu_matmul_scratch_size(o->type, o->ne[0], 1) > c->mm_scratch_size ||
            cpu_matmul_job_init(&t->out, c->kern, 1, &mat, o->ne[0], 1, tp_size(c->pool),
                                c->mm_scratch, c->mm_scratch_size, NULL) != HM_OK)
            return HM_OK;
        t->stages[ns++] = cpu_matmul_job_stage(&t->out);
    }
    *done = true;
    ce_front_pre(&t->L[0].f);
    tp_run_stages(c->pool, t->stages, ns);
    const ce_front *last = &t->L[t->n_layer - 1].f;
    if (last->st != HM_OK && err) *err = last->err;
    return last->st;
}
