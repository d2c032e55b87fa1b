/* ops_attn.c - the per-layer KV cache ring and attention over it.
 *
 * DESIGN: the cache is a ring of n_slots position rows (position p in slot p % n_slots, its
 * position recorded in slot_pos so that reads can be checked). Attention first checks that the
 * ring can hold everything this batch reads, stores the new rows, checks that every position
 * it will read is present, then runs work items (token, kv head, chunk of that kv head's query
 * heads) as an item job of the pool (tp_run_items). An item computes all scores of its query heads over a
 * contiguous slot run at a time (ops_attn_qk_avx2: a register tile of 4 heads x 2 K rows, so
 * each K piece is loaded and converted once for several heads of the GQA group), then the
 * softmax per head, then the V sum (ops_attn_pv_avx2: 4 heads x 16 dims of accumulators,
 * each V piece converted once). The scalar loops attn_qk_ref/attn_pv_ref do the same
 * operations per element in the same order (bit-identical; used without AVX2/FMA/F16C or a
 * head_dim that is not a multiple of 16). Everything an output element depends on is
 * computed by one thread in a fixed order, so the result does not depend on the thread count
 * or on which thread took which item. Cache types: f32 (rows read in place), f16, bf16 (both
 * converted exactly), q8_0; a row is stored with quant_quantize_row (f16/bf16: round to nearest
 * even). cpu_attention is three steps — plan (checks, items),
 * begin (store, positions present), the item stage — that a caller may also run apart, as a
 * stage of its own staged job (tp_run_stages).
 */
#include "cpu/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "cpu/ops_internal.h"
#include "cpu/ops_math.h"
#include "quant/fp16.h"
#include "quant/qtypes.h"
#include "quant/quant.h"

#define ATTN_TILE_ROWS 64 /* K or V rows per kernel call (a contiguous slot run) */
#define ATTN_ALIGN 64

/* Scalar scores with the same per-element order as ops_attn_qk_avx2 (cpu/ops.h's dot8):
 * out[i * os + r] = dot8(K_r, q_i). krow: [hd] scratch. */
static void attn_qk_ref(uint32_t ktype, const uint8_t *k, size_t ks, int nr, const float *q,
                        int nh, float *out, size_t os, int hd, float *krow) {
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = k + (size_t)r * ks;
        const float *kr = (const float *)row;
        if (ktype != HM_TYPE_F32) {
            quant_dequantize_row(ktype, row, krow, hd);
            kr = krow;
        }
        for (int i = 0; i < nh; i++) {
            const float *qi = q + (size_t)i * hd;
            float acc[8] = {0};
            for (int d = 0; d < hd; d++) acc[d % 8] = fmaf(kr[d], qi[d], acc[d % 8]);
            for (int l = 0; l < 4; l++) acc[l] = acc[l] + acc[l + 4];
            for (int l = 0; l < 2; l++) acc[l] = acc[l] + acc[l + 2];
            out[(size_t)i * os + r] = acc[0] + acc[1];
        }
    }
}

/* Scalar P.V with the same per-element order as ops_attn_pv_avx2: for each row r in order,
 * acc[i][d] = acc[i][d] + p[i * p_stride + r] * v_r[d] (v_r dequantised exactly as
 * quant_dequantize_row does). vrow: [hd] scratch. */
static void attn_pv_ref(uint32_t vtype, const uint8_t *v, size_t v_stride, int nr, const float *p,
                        size_t p_stride, int nh, float *acc, int hd, float *vrow) {
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = v + (size_t)r * v_stride;
        const float *vr = (const float *)row;
        if (vtype != HM_TYPE_F32) {
            quant_dequantize_row(vtype, row, vrow, hd);
            vr = vrow;
        }
        for (int i = 0; i < nh; i++) {
            const float e = p[(size_t)i * p_stride + r];
            float *ai = acc + (size_t)i * hd;
            for (int d = 0; d < hd; d++) ai[d] = ai[d] + e * vr[d];
        }
    }
}


/* ---------------------------------------------------------------- cache */

static hm_status kv_check_type(uint32_t t, int head_dim, const char *which, hm_error *err) {
    if (t != HM_TYPE_F32 && t != HM_TYPE_F16 && t != HM_TYPE_BF16 && t != HM_TYPE_Q8_0)
        return hm_error_set(err, HM_ERR_UNSUPPORTED,
                            "KV cache: %s type %s not supported (f32, f16, bf16 or q8_0)", which,
                            hm_type_name(t));
    if (t == HM_TYPE_Q8_0 && head_dim % 32)
        return hm_error_set(err, HM_ERR_UNSUPPORTED,
                            "KV cache: q8_0 %s needs head_dim %% 32 == 0 (head_dim %d)", which,
                            head_dim);
    return HM_OK;
}

int64_t cpu_kv_slots_needed(int64_t window, int64_t n_batch) {
    if (window <= 0) return -1;
    return window + (n_batch > 1 ? n_batch : 1) - 1;
}

hm_status cpu_kv_init(cpu_kv_layer *kv, uint32_t type_k, uint32_t type_v, int n_head_kv,
                      int head_dim, int64_t n_slots, hm_error *err) {
    memset(kv, 0, sizeof(*kv));
    if (n_head_kv <= 0 || head_dim <= 0 || n_slots <= 0)
        return hm_error_set(err, HM_ERR_ARG, "KV cache: bad shape (%d kv heads, head_dim %d, %lld slots)",
                            n_head_kv, head_dim, (long long)n_slots);
    hm_status st = kv_check_type(type_k, head_dim, "K", err);
    if (st == HM_OK) st = kv_check_type(type_v, head_dim, "V", err);
    if (st != HM_OK) return st;
    int64_t row = (int64_t)n_head_kv * head_dim;
    kv->type_k = type_k;
    kv->type_v = type_v;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->n_slots = n_slots;
    kv->k_row_size = hm_row_size(type_k, row);
    kv->v_row_size = hm_row_size(type_v, row);
    if ((uint64_t)n_slots > SIZE_MAX / (kv->k_row_size + kv->v_row_size + 8))
        return hm_error_set(err, HM_ERR_NOMEM, "KV cache: %lld slots overflow", (long long)n_slots);
    kv->k = calloc((size_t)n_slots, kv->k_row_size);
    kv->v = calloc((size_t)n_slots, kv->v_row_size);
    kv->slot_pos = malloc((size_t)n_slots * sizeof(int64_t));
    if (!kv->k || !kv->v || !kv->slot_pos) {
        size_t need = (size_t)n_slots * (kv->k_row_size + kv->v_row_size + 8);
        cpu_kv_free(kv);
        return hm_error_set(err, HM_ERR_NOMEM, "KV cache: cannot allocate %zu bytes", need);
    }
    cpu_kv_clear(kv);
    return HM_OK;
}

void cpu_kv_free(cpu_kv_layer *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv->slot_pos);
    memset(kv, 0, sizeof(*kv));
}

void cpu_kv_clear(cpu_kv_layer *kv) {
    for (int64_t s = 0; s < kv->n_slots; s++) kv->slot_pos[s] = -1;
}

typedef struct {
    cpu_kv_layer *kv;
    int64_t pos0, n_tok;
    const float *k, *v;
    _Atomic int64_t fail_tok; /* lowest token whose row could not be stored, or INT64_MAX */
} store_job;

static void store_worker(void *ctx, int ith, int nth) {
    store_job *j = ctx;
    cpu_kv_layer *kv = j->kv;
    const int64_t row = (int64_t)kv->n_head_kv * kv->head_dim;
    int64_t t0, t1;
    ops_split(j->n_tok, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        int64_t p = j->pos0 + t, s = p % kv->n_slots;
        uint8_t *kd = (uint8_t *)kv->k + (size_t)s * kv->k_row_size;
        uint8_t *vd = (uint8_t *)kv->v + (size_t)s * kv->v_row_size;
        if (quant_quantize_row(kv->type_k, j->k + t * row, kd, row) != HM_OK ||
            quant_quantize_row(kv->type_v, j->v + t * row, vd, row) != HM_OK) {
            int64_t cur = atomic_load(&j->fail_tok);
            while (t < cur && !atomic_compare_exchange_weak(&j->fail_tok, &cur, t)) {
            }
            kv->slot_pos[s] = -1;
            continue;
        }
        kv->slot_pos[s] = p;
    }
}

hm_status cpu_kv_store_head(cpu_kv_layer *kv, int64_t pos, int h, const float *k, const float *v) {
    const int64_t s = pos % kv->n_slots;
    uint8_t *kd = (uint8_t *)kv->k + (size_t)s * kv->k_row_size;
    uint8_t *vd = (uint8_t *)kv->v + (size_t)s * kv->v_row_size;
    hm_status st = quant_quantize_row(kv->type_k, k, kd + hm_row_size(kv->type_k, kv->head_dim) * (size_t)h,
                                      kv->head_dim);
    if (st == HM_OK)
        st = quant_quantize_row(kv->type_v, v, vd + hm_row_size(kv->type_v, kv->head_dim) * (size_t)h,
                                kv->head_dim);
    return st;
}

void cpu_kv_mark(cpu_kv_layer *kv, int64_t pos0, int64_t n_tok) {
    for (int64_t p = pos0; p < pos0 + n_tok; p++) kv->slot_pos[p % kv->n_slots] = p;
}

hm_status cpu_kv_store(tp_pool *pool, cpu_kv_layer *kv, int64_t pos0, int64_t n_tok,
                       const float *k, const float *v, hm_error *err) {
    if (pos0 < 0 || n_tok < 0 || !k || !v)
        return hm_error_set(err, HM_ERR_ARG, "KV store: bad arguments (pos %lld, %lld tokens)",
                            (long long)pos0, (long long)n_tok);
    if (n_tok > kv->n_slots)
        return hm_error_set(err, HM_ERR_STATE, "KV store: %lld tokens exceed the %lld slots",
                            (long long)n_tok, (long long)kv->n_slots);
    store_job j = {.kv = kv, .pos0 = pos0, .n_tok = n_tok, .k = k, .v = v};
    atomic_init(&j.fail_tok, INT64_MAX);
    ops_run(pool, store_worker, &j, n_tok * kv->n_head_kv * kv->head_dim, 32768);
    int64_t bad = atomic_load(&j.fail_tok);
    if (bad != INT64_MAX)
        return hm_error_set(err, HM_ERR_RANGE,
                            "KV store: K or V of position %lld is not finite (q8_0 cache)",
                            (long long)(pos0 + bad));
    return HM_OK;
}

/* ---------------------------------------------------------------- attention */

typedef cpu_attn_job attn_job; /* simd: AVX2+FMA+F16C and head_dim % 16 == 0 */

/* Scratch of one thread, in floats: scores [n_rep][max_nv], acc [n_rep][hd], row [hd]. */
static size_t attn_per_thread(int n_rep, int64_t max_nv, int hd) {
    size_t f = (size_t)n_rep * (size_t)max_nv + (size_t)n_rep * hd + (size_t)hd;
    size_t b = f * sizeof(float);
    return (b + ATTN_ALIGN - 1) / ATTN_ALIGN * ATTN_ALIGN;
}

static int64_t attn_max_nv(const cpu_kv_layer *kv, const cpu_attn_args *a) {
    int64_t m = kv->n_slots;
    if (a->window > 0 && a->window < m) m = a->window;
    return m;
}

/* Item `item` is token t's query heads [h0, h1) of KV head g, over positions [q0, p]. */
typedef struct {
    int64_t t, p, q0;
    int g, h0, h1;
} attn_span;

static attn_span attn_item_span(const attn_job *j, int64_t item) {
    const cpu_attn_args *a = j->a;
    const int64_t per_tok = (int64_t)j->kv->n_head_kv * j->n_sub;
    attn_span sp = {.t = item / per_tok};
    const int64_t rem = item % per_tok;
    const int sub = (int)(rem % j->n_sub);
    sp.g = (int)(rem / j->n_sub);
    sp.h0 = sp.g * j->n_rep + sub * j->rep_per_sub;
    sp.h1 = sp.h0 + j->rep_per_sub;
    if (sp.h1 > (sp.g + 1) * j->n_rep) sp.h1 = (sp.g + 1) * j->n_rep;
    sp.p = a->pos0 + sp.t;
    sp.q0 = a->window > 0 && sp.p - a->window + 1 > 0 ? sp.p - a->window + 1 : 0;
    return sp;
}

static void attn_item(attn_job *j, int64_t item, uint8_t *scr) {
    const cpu_attn_args *a = j->a;
    const cpu_kv_layer *kv = j->kv;
    const int hd = kv->head_dim;
    const attn_span sp = attn_item_span(j, item);
    const int64_t t = sp.t, p = sp.p, q0 = sp.q0;
    const int g = sp.g, h0 = sp.h0, nh = sp.h1 - sp.h0;
    if (nh <= 0) return;
    const int64_t nv = p - q0 + 1;

    float *scores = (float *)scr;                       /* [nh][nv] */
    float *acc = scores + (size_t)j->n_rep * j->max_nv; /* [nh][hd] */
    float *vrow = acc + (size_t)j->n_rep * hd;          /* [hd] K or V row (scalar path) */
    const float *qf = a->q + (t * a->n_head + h0) * hd; /* [nh][hd] */

    /* scores: runs of contiguous slots, at most ATTN_TILE_ROWS K rows per kernel call */
    const size_t khead = hm_row_size(kv->type_k, hd) * (size_t)g;
    for (int64_t q = q0; q <= p;) {
        int64_t s = q % kv->n_slots;
        int64_t run = p - q + 1;
        if (run > kv->n_slots - s) run = kv->n_slots - s;
        if (run > ATTN_TILE_ROWS) run = ATTN_TILE_ROWS;
        const uint8_t *kr = (const uint8_t *)kv->k + (size_t)s * kv->k_row_size + khead;
        if (j->simd)
            ops_attn_qk_avx2(kv->type_k, kr, kv->k_row_size, (int)run, qf, nh, scores + (q - q0),
                             (size_t)nv, hd);
        else
            attn_qk_ref(kv->type_k, kr, kv->k_row_size, (int)run, qf, nh, scores + (q - q0),
                        (size_t)nv, hd, vrow);
        q += run;
    }

    /* softmax per head (rep_per_sub <= 64, see attn_split) */
    float den[64];
    for (int i = 0; i < nh; i++) {
        float *sc = scores + (size_t)i * nv;
        const int h = h0 + i;
        float m = -INFINITY;
        for (int64_t q = 0; q < nv; q++) sc[q] = sc[q] * j->scale;
        for (int64_t q = 0; q < nv; q++) m = sc[q] > m ? sc[q] : m;
        const float sink = a->sinks ? a->sinks[h] : 0.0f;
        if (a->sinks && sink > m) m = sink;
        if (j->simd) ops_exp_sub_avx2(sc, nv, m);
        else
            for (int64_t q = 0; q < nv; q++) sc[q] = hm_expf(sc[q] - m);
        float sum = 0.0f;
        for (int64_t q = 0; q < nv; q++) sum = sum + sc[q];
        if (a->sinks) sum = sum + hm_expf(sink - m);
        den[i] = sum;
        float *ai = acc + (size_t)i * hd;
        for (int d = 0; d < hd; d++) ai[d] = 0.0f;
    }

    const size_t vhead = hm_row_size(kv->type_v, hd) * (size_t)g;
    for (int64_t q = q0; q <= p;) {
        int64_t s = q % kv->n_slots;
        int64_t run = p - q + 1;
        if (run > kv->n_slots - s) run = kv->n_slots - s;
        if (run > ATTN_TILE_ROWS) run = ATTN_TILE_ROWS;
        const uint8_t *vr = (const uint8_t *)kv->v + (size_t)s * kv->v_row_size + vhead;
        if (j->simd)
            ops_attn_pv_avx2(kv->type_v, vr, kv->v_row_size, (int)run, scores + (q - q0),
                             (size_t)nv, nh, acc, hd);
        else
            attn_pv_ref(kv->type_v, vr, kv->v_row_size, (int)run, scores + (q - q0), (size_t)nv, nh,
                        acc, hd, vrow);
        q += run;
    }
    for (int i = 0; i < nh; i++) {
        float *o = a->out + (t * a->n_head + h0 + i) * hd;
        const float *ai = acc + (size_t)i * hd;
        for (int d = 0; d < hd; d++) o[d] = ai[d] / den[i];
    }
    if (j->on_out) j->on_out(j->on_out_ctx, t, h0, h0 + nh);
}

void cpu_attention_item_heads(const attn_job *j, int64_t item, int64_t *t, int *g, int *h0, int *h1) {
    const attn_span sp = attn_item_span(j, item);
    *t = sp.t;
    *g = sp.g;
    *h0 = sp.h0;
    *h1 = sp.h1;
}

static void attn_item_fn(void *ctx, int64_t it, int ith) {
    attn_job *j = ctx;
    attn_item(j, it, j->scratch + (size_t)ith * j->per_thread);
}

/* The K and V rows of item it's KV head at the cached positions before its token into the
 * calling core's L2 (prefetcht1), while the thread waits for the stage (the new rows are being
 * stored then). */
static void attn_item_prefetch(void *ctx, int64_t it, const tp_gate *gate) {
    const attn_job *j = ctx;
    const cpu_kv_layer *kv = j->kv;
    const attn_span sp = attn_item_span(j, it);
    if (sp.h1 <= sp.h0) return;
    const size_t kb = hm_row_size(kv->type_k, kv->head_dim), vb = hm_row_size(kv->type_v, kv->head_dim);
    for (int64_t q = sp.q0; q < sp.p && !tp_gate_open(gate); q++) {
        const int64_t s = q % kv->n_slots;
        const uint8_t *kr = (const uint8_t *)kv->k + (size_t)s * kv->k_row_size + kb * (size_t)sp.g;
        const uint8_t *vr = (const uint8_t *)kv->v + (size_t)s * kv->v_row_size + vb * (size_t)sp.g;
        for (size_t o = 0; o < kb; o += 64) __builtin_prefetch(kr + o, 0, 2);
        for (size_t o = 0; o < vb; o += 64) __builtin_prefetch(vr + o, 0, 2);
    }
}

/* Query heads per item: enough items for the threads, at most 64 heads each. */
static void attn_split(const cpu_kv_layer *kv, const cpu_attn_args *a, int nth, int *n_sub,
                       int *rep_per_sub) {
    int n_rep = a->n_head / kv->n_head_kv;
    int64_t base = a->n_tok * kv->n_head_kv;
    int sub = 1;
    if (base < nth) sub = (int)((nth + base - 1) / base);
    if (sub > n_rep) sub = n_rep;
    if ((n_rep + sub - 1) / sub > 64) sub = (n_rep + 63) / 64;
    *rep_per_sub = (n_rep + sub - 1) / sub;
    *n_sub = (n_rep + *rep_per_sub - 1) / *rep_per_sub;
}

size_t cpu_attention_scratch_size(const cpu_kv_layer *kv, const cpu_attn_args *a, int nth) {
    if (nth < 1) nth = 1;
    if (!kv || !a || kv->n_head_kv <= 0 || a->n_head < kv->n_head_kv) return 0;
    int n_rep = a->n_head / kv->n_head_kv;
    return (size_t)nth * attn_per_thread(n_rep, attn_max_nv(kv, a), kv->head_dim);
}

hm_status cpu_attention_plan(attn_job *j, cpu_kv_layer *kv, const cpu_attn_args *a, int nth,
                             void *scratch, size_t scratch_size, hm_error *err) {
    memset(j, 0, sizeof(*j));
    if (!kv || !a || !a->q || !a->out)
        return hm_error_set(err, HM_ERR_ARG, "attention: missing arguments");
    if (a->n_head <= 0 || kv->n_head_kv <= 0 || a->n_head % kv->n_head_kv)
        return hm_error_set(err, HM_ERR_ARG, "attention: %d heads not a multiple of %d kv heads",
                            a->n_head, kv->n_head_kv);
    if (a->n_tok < 0 || a->pos0 < 0 || (a->k_new && !a->v_new) || (!a->k_new && a->v_new))
        return hm_error_set(err, HM_ERR_ARG, "attention: bad batch (pos %lld, %lld tokens)",
                            (long long)a->pos0, (long long)a->n_tok);
    hm_status st = kv_check_type(kv->type_k, kv->head_dim, "K", err);
    if (st == HM_OK) st = kv_check_type(kv->type_v, kv->head_dim, "V", err);
    if (st != HM_OK) return st;
    j->kv = kv;
    j->a = a;
    if (a->n_tok == 0) return HM_OK;

    /* every position this batch reads must fit the ring together with the new rows */
    j->last = a->pos0 + a->n_tok - 1;
    j->first = a->window > 0 && a->pos0 - a->window + 1 > 0 ? a->pos0 - a->window + 1 : 0;
    if (j->last - j->first + 1 > kv->n_slots)
        return hm_error_set(err, HM_ERR_STATE,
                            "attention: positions %lld..%lld do not fit the KV cache's %lld slots%s",
                            (long long)j->first, (long long)j->last, (long long)kv->n_slots,
                            a->window > 0 ? " (window ring too small for this batch)" : "");
    j->n_rep = a->n_head / kv->n_head_kv;
    attn_split(kv, a, nth, &j->n_sub, &j->rep_per_sub);
    j->max_nv = attn_max_nv(kv, a);
    j->scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)kv->head_dim);
    j->simd = kv->head_dim % 16 == 0 && !a->no_simd && hm_cpu_has_avx2();
    j->per_thread = attn_per_thread(j->n_rep, j->max_nv, kv->head_dim);
    size_t need = j->per_thread * (size_t)nth;
    if (!scratch || scratch_size < need)
        return hm_error_set(err, HM_ERR_ARG, "attention: scratch %zu bytes, need %zu",
                            scratch_size, need);
    j->scratch = scratch;
    j->n_items = a->n_tok * kv->n_head_kv * j->n_sub;
    return HM_OK;
}

hm_status cpu_attention_begin(tp_pool *pool, attn_job *j, hm_error *err) {
    const cpu_attn_args *a = j->a;
    cpu_kv_layer *kv = j->kv;
    if (a->n_tok == 0) return HM_OK;
    if (a->k_new) {
        hm_status st = cpu_kv_store(pool, kv, a->pos0, a->n_tok, a->k_new, a->v_new, err);
        if (st != HM_OK) return st;
    }
    for (int64_t q = j->first; q <= j->last; q++)
        if (kv->slot_pos[q % kv->n_slots] != q)
            return hm_error_set(err, HM_ERR_STATE, "attention: position %lld is not in the KV cache",
                                (long long)q);
    return HM_OK;
}

tp_stage cpu_attention_stage(attn_job *j) {
    return (tp_stage){.fn = attn_item_fn, .ctx = j, .n_items = j->n_items,
                      .prefetch = attn_item_prefetch};
}

hm_status cpu_attention(tp_pool *pool, cpu_kv_layer *kv, const cpu_attn_args *a, void *scratch,
                        size_t scratch_size, hm_error *err) {
    const int nth = pool ? tp_size(pool) : 1;
    void *own = NULL;
    if (!scratch) {
        scratch_size = cpu_attention_scratch_size(kv, a, nth);
        if (scratch_size) {
            scratch = own = aligned_alloc(ATTN_ALIGN, scratch_size);
            if (!own)
                return hm_error_set(err, HM_ERR_NOMEM, "attention: cannot allocate %zu bytes",
                                    scratch_size);
        }
    }
    attn_job j;
    hm_status st = cpu_attention_plan(&j, kv, a, nth, scratch, scratch_size, err);
    if (st == HM_OK) st = cpu_attention_begin(pool, &j, err);
    if (st == HM_OK && j.n_items > 0) {
        int64_t work = a->n_tok * a->n_head * (j.last - j.first + 1) * kv->head_dim;
        tp_run_items(work >= 65536 ? pool : NULL, attn_item_fn, &j, j.n_items);
    }
    free(own);
    return st;
}
