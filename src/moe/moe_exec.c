/* moe_exec.c - the expert executor (moe_exec.h): the CPU lane's expert FFN and the split of a
 * job's slots between lanes.
 *
 * DESIGN: the CPU lane is y[t][s] = down(act(gate(x[t]), up(x[t]))) of expert ids[t][s], with
 * the expert biases, computed by cpu/matmul.h's grouped products: for a few tokens gate/up,
 * activation and down are one pool job (cpu_moe_ffn, which may also sum the slots), otherwise
 * the gate/up pair and the down product are a job each. A job whose experts are not all on the
 * CPU lane is run once per lane that has slots in it, each time with the other lanes' slots
 * masked (id -1) in a copy of the ids: each slot is written by exactly one lane.
 *
 * Scratch (nt = n_tok_max, K = n_expert_used, F = n_ff_exp):
 *   eg, eu [nt][K][F]  gate (then activation) and up outputs of the CPU lane
 *   ids    [nt][K]     one lane's view of the ids
 *   mm     the grouped products' scratch for the largest call
 */
#include "moe/moe_exec.h"

#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

/* Elementwise ops of up to this many elements run on the calling thread (a pool job costs more). */
enum { EXEC_INLINE_ELEMS = 65536 };

struct moe_exec {
    const hm_model *m;
    tp_pool *pool;
    const quant_kernels *kern;
    int64_t n_tok_max;
    int n_layer, n_expert, K;
    float *eg, *eu;          /* [nt][K][F] */
    int32_t *ids;            /* [nt][K] */
    void *mm;                /* mm_size bytes */
    size_t mm_size;
    size_t ffn_size;         /* the one-job FFN's scratch for up to MOE_FEW_TOK tokens */
    uint8_t *lane;           /* [n_layer][n_expert] */
    int64_t n_off_cpu;       /* experts not on the CPU lane */
    moe_lane_fn fn[MOE_LANE_MAX];
    void *impl[MOE_LANE_MAX];
};

static tp_pool *op_pool(tp_pool *pool, int64_t elems) {
    return elems <= EXEC_INLINE_ELEMS ? NULL : pool;
}

/* Largest scratch of the CPU lane's products for up to nt tokens; *ffn: of the one-job FFN. */
static size_t exec_scratch_max(const hm_model *m, int64_t nt, size_t *ffn) {
    const hm_hparams *hp = hm_model_hparams(m);
    size_t mx = 0;
    *ffn = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const hm_layer *L = hm_model_layer(m, il);
        if (!L->gate_exps.data) continue;
        const int64_t nf = nt < MOE_FEW_TOK ? nt : MOE_FEW_TOK;
        cpu_moe_args g = {.wtype = L->gate_exps.type, .n_expert = hp->n_expert,
                          .n_rows = L->gate_exps.ne[1], .k = L->gate_exps.ne[0], .n_tok = nf,
                          .n_used = (int)hp->n_expert_used};
        cpu_moe_args dn = {.wtype = L->down_exps.type, .n_expert = hp->n_expert,
                           .n_rows = L->down_exps.ne[1], .k = L->down_exps.ne[0],
                           .x_per_slot = 1, .n_tok = nf, .n_used = (int)hp->n_expert_used};
        size_t s = cpu_moe_ffn_scratch_size(&g, &dn);
        if (s > mx) mx = s;
        if (s > *ffn) *ffn = s;
        const hm_tensor *ex[] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int i = 0; i < 3; i++) {
            cpu_moe_args a = {.wtype = ex[i]->type, .w = ex[i]->data, .n_expert = hp->n_expert,
                              .n_rows = ex[i]->ne[1], .k = ex[i]->ne[0], .x_per_slot = i == 2,
                              .n_tok = nt, .n_used = (int)hp->n_expert_used};
            s = cpu_moe_scratch_size(&a);
            if (s > mx) mx = s;
        }
    }
    return mx;
}

hm_status moe_exec_init(const hm_model *m, tp_pool *pool, int64_t n_tok_max, moe_exec **out,
                        hm_error *err) {
    *out = NULL;
    const hm_hparams *hp = hm_model_hparams(m);
    if (n_tok_max < 1)
        return hm_error_set(err, HM_ERR_ARG, "expert executor: n_tok_max %lld must be >= 1",
                            (long long)n_tok_max);
    moe_exec *x = calloc(1, sizeof(*x));
    if (!x) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (expert executor)");
    x->m = m;
    x->pool = pool;
    x->kern = quant_kernels_best();
    x->n_tok_max = n_tok_max;
    x->n_layer = (int)hp->n_layer;
    x->n_expert = (int)hp->n_expert;
    x->K = (int)hp->n_expert_used;
    const size_t slots = (size_t)n_tok_max * (size_t)(x->K > 0 ? x->K : 1);
    const size_t acts = slots * (size_t)(hp->n_ff_exp > 0 ? hp->n_ff_exp : 1);
    x->eg = malloc(acts * sizeof(float));
    x->eu = malloc(acts * sizeof(float));
    x->ids = malloc(slots * sizeof(int32_t));
    x->mm_size = exec_scratch_max(m, n_tok_max, &x->ffn_size);
    x->mm = malloc(x->mm_size ? x->mm_size : 1);
    x->lane = calloc((size_t)x->n_layer * (size_t)(x->n_expert > 0 ? x->n_expert : 1), 1);
    if (!x->eg || !x->eu || !x->ids || !x->mm || !x->lane) {
        moe_exec_free(x);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (expert executor scratch)");
    }
    *out = x;
    return HM_OK;
}

void moe_exec_free(moe_exec *x) {
    if (!x) return;
    free(x->eg);
    free(x->eu);
    free(x->ids);
    free(x->mm);
    free(x->lane);
    free(x);
}

hm_status moe_exec_set_lane_fn(moe_exec *x, int lane, moe_lane_fn fn, void *impl, hm_error *err) {
    if (lane <= MOE_LANE_CPU || lane >= MOE_LANE_MAX)
        return hm_error_set(err, HM_ERR_ARG, "expert executor: lane %d (1..%d)", lane,
                            MOE_LANE_MAX - 1);
    x->fn[lane] = fn;
    x->impl[lane] = impl;
    if (!fn) /* its experts go back to the CPU */
        for (int64_t i = 0; i < (int64_t)x->n_layer * x->n_expert; i++)
            if (x->lane[i] == lane) {
                x->lane[i] = MOE_LANE_CPU;
                x->n_off_cpu--;
            }
    return HM_OK;
}

hm_status moe_exec_set_lane(moe_exec *x, int il, int e, int lane, hm_error *err) {
    if (il < 0 || il >= x->n_layer || e < 0 || e >= x->n_expert)
        return hm_error_set(err, HM_ERR_RANGE, "expert executor: no expert %d in layer %d", e, il);
    if (lane < 0 || lane >= MOE_LANE_MAX || (lane != MOE_LANE_CPU && !x->fn[lane]))
        return hm_error_set(err, HM_ERR_ARG, "expert executor: lane %d is not installed", lane);
    uint8_t *l = &x->lane[(size_t)il * (size_t)x->n_expert + (size_t)e];
    x->n_off_cpu += (lane != MOE_LANE_CPU) - (*l != MOE_LANE_CPU);
    *l = (uint8_t)lane;
    return HM_OK;
}

int moe_exec_lane(const moe_exec *x, int il, int e) {
    if (il < 0 || il >= x->n_layer || e < 0 || e >= x->n_expert) return -1;
    return x->lane[(size_t)il * (size_t)x->n_expert + (size_t)e];
}

bool moe_exec_all_cpu(const moe_exec *x) { return x->n_off_cpu == 0; }

size_t moe_exec_ffn_scratch_size(const moe_exec *x) { return x->ffn_size; }

/* ---- the CPU lane ---- */

void moe_exec_post(void *ctx, int64_t p, int64_t r0, int64_t r1) {
    const moe_post_ctx *pc = ctx;
    float *g = pc->eg + p * pc->F + r0, *u = pc->eu + p * pc->F + r0;
    const int64_t n = r1 - r0;
    if (pc->L->gate_exps_b.data) {
        const int32_t zero = 0;
        const int64_t off = (int64_t)pc->ids[p] * pc->F + r0;
        cpu_moe_add_bias(NULL, g, (const float *)pc->L->gate_exps_b.data + off, &zero, 1, 1, n);
        cpu_moe_add_bias(NULL, u, (const float *)pc->L->up_exps_b.data + off, &zero, 1, 1, n);
    }
    cpu_swiglu_slice(g, u, g, n, pc->act, 1.702f, 7.0f, pc->simd);
}

bool moe_exec_cpu_args(moe_exec *x, int il, const int32_t *ids, int64_t n, int K,
                       const float *xin, float *y, cpu_moe_args *a, cpu_moe_args *b,
                       cpu_moe_args *d, moe_post_ctx *pc) {
    const hm_model *m = x->m;
    const hm_hparams *hp = hm_model_hparams(m);
    const hm_layer *L = hm_model_layer(m, il);
    const int64_t F = hp->n_ff_exp, E = hp->n_embd;
    *a = (cpu_moe_args){.n_expert = hp->n_expert, .ids = ids, .n_tok = n, .n_used = K};
    /* gate and up: every slot of token t reads xin[t] */
    a->wtype = L->gate_exps.type, a->w = L->gate_exps.data, a->n_rows = F, a->k = E;
    a->x = xin, a->x_per_slot = 0, a->y = x->eg, a->x8 = L->gate_exps.x8;
    a->w_stride = L->gate_exps.expert_stride; /* views of a fused ffn_gate_up_exps */
    *b = *a;
    b->wtype = L->up_exps.type, b->w = L->up_exps.data, b->y = x->eu, b->x8 = L->up_exps.x8;
    b->w_stride = L->up_exps.expert_stride;
    *d = *a; /* down: slot s of token t reads its own activation eg[t][s] */
    d->wtype = L->down_exps.type, d->w = L->down_exps.data, d->n_rows = E, d->k = F;
    d->x8 = L->down_exps.x8, d->w_stride = L->down_exps.expert_stride;
    d->x = x->eg, d->x_per_slot = 1, d->y = y;
    *pc = (moe_post_ctx){.L = L, .ids = ids, .eg = x->eg, .eu = x->eu, .F = F,
                         .act = hm_model_arch(m)->swiglu == HM_SWIGLU_OAI    ? CPU_GLU_OAI
                                : hm_model_arch(m)->swiglu == HM_SWIGLU_GELU ? CPU_GLU_GELU
                                                                             : CPU_GLU_SILU,
                         .simd = cpu_act_simd()};
    return quant_act_for(a->wtype) == quant_act_for(b->wtype) &&
           (!L->gate_exps_b.data || L->up_exps_b.data);
}

static hm_status cpu_product(moe_exec *x, const cpu_moe_args *a, hm_error *err) {
    bool fits = cpu_moe_scratch_size(a) <= x->mm_size;
    return cpu_moe_matmul(x->pool, x->kern, a, fits ? x->mm : NULL, fits ? x->mm_size : 0, err);
}

/* Gate and up products of the slots of ids, their biases and the activation into x->eg
 * [n][K][F] (a, b, pc from moe_exec_cpu_args; pair: one paired product). */
static hm_status gate_up(moe_exec *x, const hm_layer *L, bool pair, const cpu_moe_args *a,
                         const cpu_moe_args *b, moe_post_ctx *pc, const int32_t *ids, int64_t n,
                         int K, hm_error *err) {
    const int64_t F = a->n_rows;
    if (pair) { /* one job: gate and up rows of each chunk, then their biases and activation */
        bool fits = cpu_moe_scratch_size(a) <= x->mm_size;
        return cpu_moe_matmul_pair(x->pool, x->kern, a, b, moe_exec_post, pc,
                                   fits ? x->mm : NULL, fits ? x->mm_size : 0, err);
    }
    hm_status st = cpu_product(x, a, err);
    if (st == HM_OK) st = cpu_product(x, b, err);
    if (st != HM_OK) return st;
    if (L->gate_exps_b.data) {
        cpu_moe_add_bias(x->pool, x->eg, L->gate_exps_b.data, ids, n, K, F);
        cpu_moe_add_bias(x->pool, x->eu, L->up_exps_b.data, ids, n, K, F);
    }
    if (pc->act == CPU_GLU_OAI)
        cpu_swiglu_oai(x->pool, x->eg, x->eu, x->eg, n * K * F, 1.702f, 7.0f);
    else if (pc->act == CPU_GLU_GELU) cpu_geglu(x->pool, x->eg, x->eu, x->eg, n * K * F);
    else cpu_swiglu(x->pool, x->eg, x->eu, x->eg, n * K * F);
    return HM_OK;
}

/* The CPU lane on the slots of ids (others skipped); with sum the slots' weighted sum too, and
 * *summed = true when it was done. */
static hm_status run_cpu(moe_exec *x, const moe_job *job, const int32_t *ids,
                         const cpu_moe_sum *sum, bool *summed, hm_error *err) {
    const hm_layer *L = hm_model_layer(x->m, job->layer);
    const int64_t n = job->n_tok;
    const int K = job->n_used;
    cpu_moe_args a, b, d;
    moe_post_ctx pc;
    const bool pair = moe_exec_cpu_args(x, job->layer, ids, n, K, job->x, job->y, &a, &b, &d,
                                        &pc);
    const int64_t E = d.n_rows;
    hm_status st;
    if (pair && n <= MOE_FEW_TOK) { /* decode: gate/up, activation and down in one pool job */
        bool fits = cpu_moe_ffn_scratch_size(&a, &d) <= x->mm_size;
        cpu_moe_sum sb;
        if (sum) {
            sb = *sum;
            sb.bias = L->down_exps_b.data;
            *summed = true;
        }
        st = cpu_moe_ffn(x->pool, x->kern, &a, &b, moe_exec_post, &pc, &d, sum ? &sb : NULL,
                         fits ? x->mm : NULL, fits ? x->mm_size : 0, err);
        if (st == HM_OK && L->down_exps_b.data && !sum)
            cpu_moe_add_bias(op_pool(x->pool, n * K * E), job->y, L->down_exps_b.data, ids, n, K,
                             E);
        return st;
    }
    st = gate_up(x, L, pair, &a, &b, &pc, ids, n, K, err);
    if (st == HM_OK) st = cpu_product(x, &d, err);
    if (st == HM_OK && L->down_exps_b.data)
        cpu_moe_add_bias(op_pool(x->pool, n * K * E), job->y, L->down_exps_b.data, ids, n, K, E);
    return st;
}

/* HM_ERR_ARG when job does not fit the executor's plan. */
static hm_status check_job(const moe_exec *x, const moe_job *job, hm_error *err) {
    if (job->n_tok > x->n_tok_max || job->n_used != x->K || job->layer < 0 ||
        job->layer >= x->n_layer)
        return hm_error_set(err, HM_ERR_ARG, "expert executor: job of %lld tokens x %d slots "
                            "in layer %d exceeds its plan (%lld x %d, %d layers)",
                            (long long)job->n_tok, job->n_used, job->layer,
                            (long long)x->n_tok_max, x->K, x->n_layer);
    return HM_OK;
}

hm_status moe_exec_gate_up(moe_exec *x, const moe_job *job, float *h, hm_error *err) {
    hm_status st = check_job(x, job, err);
    if (st != HM_OK) return st;
    const int64_t n = job->n_tok;
    const int K = job->n_used;
    cpu_moe_args a, b, d;
    moe_post_ctx pc;
    const bool pair = moe_exec_cpu_args(x, job->layer, job->ids, n, K, job->x, job->y, &a, &b,
                                        &d, &pc);
    const int64_t F = a.n_rows;
    st = gate_up(x, hm_model_layer(x->m, job->layer), pair, &a, &b, &pc, job->ids, n, K, err);
    for (int64_t i = 0; st == HM_OK && i < n * K; i++)
        if (job->ids[i] >= 0)
            memcpy(h + i * F, x->eg + i * F, sizeof(float) * (size_t)F);
    return st;
}

/* Writes into x->ids the job's ids of the slots on lane (others -1); the count of such slots. */
static int64_t lane_ids(moe_exec *x, const moe_job *job, int lane) {
    const int64_t ns = job->n_tok * job->n_used;
    const uint8_t *row = x->lane + (size_t)job->layer * (size_t)x->n_expert;
    int64_t cnt = 0;
    for (int64_t i = 0; i < ns; i++) {
        int32_t id = job->ids[i];
        bool on = id >= 0 && id < x->n_expert && row[id] == lane;
        x->ids[i] = on ? id : -1;
        cnt += on;
    }
    return cnt;
}

hm_status moe_exec_run(moe_exec *x, const moe_job *job, const cpu_moe_sum *sum, bool *summed,
                       hm_error *err) {
    *summed = false;
    hm_status st0 = check_job(x, job, err);
    if (st0 != HM_OK) return st0;
    if (x->n_off_cpu == 0) return run_cpu(x, job, job->ids, sum, summed, err);
    for (int lane = 0; lane < MOE_LANE_MAX; lane++) {
        if (lane != MOE_LANE_CPU && !x->fn[lane]) continue;
        if (lane_ids(x, job, lane) == 0) continue;
        hm_status st;
        if (lane == MOE_LANE_CPU) {
            st = run_cpu(x, job, x->ids, NULL, summed, err);
        } else {
            moe_job sub = *job;
            sub.ids = x->ids;
            st = x->fn[lane](x->impl[lane], x->m, &sub, err);
        }
        if (st != HM_OK) return st;
    }
    return HM_OK;
}
