/* ops_attn.c - the per-layer KV cache ring and attention over it.
 *
 * DESIGN: the cache is a ring of n_slots position rows (position p in slot p % n_slots, its
 * position recorded in slot_pos so that reads can be checked). Attention first checks that the
 * ring can hold everything this batch reads, stores the new rows, checks that every position
 * it will read is present, then runs work items (token, kv head, chunk of that kv head's query
 * heads) taken from an atomic counter. An item computes, for each of its query heads, all
 * scores with the kernel table's dot tile (K rows of a contiguous slot run as the "weight"
 * rows, the item's query heads as activation rows: K is read once for all heads of a GQA
 * group), then the softmax and the V sum in position order with V rows converted once per
 * item. Everything an output element depends on is computed by one thread in a fixed order,
 * so the result does not depend on the thread count or on which thread took which item.
 */
#include "cpu/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops_internal.h"
#include "cpu/ops_math.h"
#include "quant/fp16.h"
#include "quant/qtypes.h"

#define ATTN_TILE_ROWS 64 /* K rows per dot-tile call */
#define ATTN_ALIGN 64

static void f16_row_to_f32(const uint16_t *src, float *dst, int64_t n, int f16c) {
    if (f16c) {
        ops_f16_to_f32_avx2(src, dst, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = hm_fp16_to_f32(src[i]);
}

static int cpu_has_f16c(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

/* ---------------------------------------------------------------- cache */

static hm_status kv_check_type(uint32_t t, int head_dim, const char *which, hm_error *err) {
    if (t != HM_TYPE_F32 && t != HM_TYPE_F16 && t != HM_TYPE_Q8_0)
        return hm_error_set(err, HM_ERR_UNSUPPORTED,
                            "KV cache: %s type %u not supported (f32, f16 or q8_0)", which, t);
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

typedef struct {
    cpu_kv_layer *kv;
    const cpu_attn_args *a;
    quant_dot_tile_fn dot_k;
    quant_act_fn act_k;   /* q8_0 K: quantiser of q rows; NULL: q used as f32 */
    size_t qact_size;     /* bytes of one query head's activation row */
    int n_rep, n_sub, rep_per_sub;
    int64_t n_items, max_nv;
    float scale;
    int f16c;
    uint8_t *scratch;
    size_t per_thread;
    _Atomic int64_t next;
} attn_job;

/* Scratch of one thread, in floats unless said: scores [n_rep][max_nv], acc [n_rep][hd],
 * vrow [hd], then qact [n_rep] rows of qact_size bytes. */
static size_t attn_per_thread(int n_rep, int64_t max_nv, int hd, size_t qact_size) {
    size_t f = (size_t)n_rep * (size_t)max_nv + (size_t)n_rep * hd + (size_t)hd;
    size_t b = f * sizeof(float) + (size_t)n_rep * qact_size;
    return (b + ATTN_ALIGN - 1) / ATTN_ALIGN * ATTN_ALIGN;
}

static int64_t attn_max_nv(const cpu_kv_layer *kv, const cpu_attn_args *a) {
    int64_t m = kv->n_slots;
    if (a->window > 0 && a->window < m) m = a->window;
    return m;
}

static void attn_item(attn_job *j, int64_t item, uint8_t *scr) {
    const cpu_attn_args *a = j->a;
    const cpu_kv_layer *kv = j->kv;
    const int hd = kv->head_dim;
    const int64_t t = item / ((int64_t)kv->n_head_kv * j->n_sub);
    const int64_t rem = item % ((int64_t)kv->n_head_kv * j->n_sub);
    const int g = (int)(rem / j->n_sub), sub = (int)(rem % j->n_sub);
    const int h0 = g * j->n_rep + sub * j->rep_per_sub;
    int h1 = h0 + j->rep_per_sub;
    if (h1 > (g + 1) * j->n_rep) h1 = (g + 1) * j->n_rep;
    const int nh = h1 - h0;
    if (nh <= 0) return;
    const int64_t p = a->pos0 + t;
    const int64_t q0 = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
    const int64_t nv = p - q0 + 1;

    float *scores = (float *)scr;                       /* [nh][nv] */
    float *acc = scores + (size_t)j->n_rep * j->max_nv; /* [nh][hd] */
    float *vrow = acc + (size_t)j->n_rep * hd;          /* [hd] */
    uint8_t *qact = (uint8_t *)(vrow + hd);             /* [nh] act rows */

    const float *qf = a->q + (t * a->n_head + h0) * hd;
    const void *act = qf;
    size_t act_stride = (size_t)hd * sizeof(float);
    if (j->act_k) {
        for (int i = 0; i < nh; i++) j->act_k(qf + (size_t)i * hd, qact + i * j->qact_size, hd);
        act = qact;
        act_stride = j->qact_size;
    }

    /* scores: runs of contiguous slots, ATTN_TILE_ROWS K rows per tile call */
    const size_t khead = hm_row_size(kv->type_k, hd) * (size_t)g;
    for (int64_t q = q0; q <= p;) {
        int64_t s = q % kv->n_slots;
        int64_t run = p - q + 1;
        if (run > kv->n_slots - s) run = kv->n_slots - s;
        if (run > ATTN_TILE_ROWS) run = ATTN_TILE_ROWS;
        const uint8_t *kr = (const uint8_t *)kv->k + (size_t)s * kv->k_row_size + khead;
        j->dot_k(hd, kr, kv->k_row_size, (int)run, act, act_stride, nh, scores + (q - q0),
                 (size_t)nv);
        q += run;
    }

    /* softmax per head (rep_per_sub <= 64, see attn_split) */
    float den[64];
    for (int i = 0; i < nh; i++) {
        float *sc = scores + (size_t)i * nv;
        const int h = h0 + i;
        float m = -INFINITY;
        for (int64_t q = 0; q < nv; q++) {
            sc[q] = sc[q] * j->scale;
            if (sc[q] > m) m = sc[q];
        }
        const float sink = a->sinks ? a->sinks[h] : 0.0f;
        if (a->sinks && sink > m) m = sink;
        float sum = 0.0f;
        for (int64_t q = 0; q < nv; q++) {
            sc[q] = hm_expf(sc[q] - m);
            sum = sum + sc[q];
        }
        if (a->sinks) sum = sum + hm_expf(sink - m);
        den[i] = sum;
        float *ai = acc + (size_t)i * hd;
        for (int d = 0; d < hd; d++) ai[d] = 0.0f;
    }

    const size_t vhead = hm_row_size(kv->type_v, hd) * (size_t)g;
    for (int64_t q = q0; q <= p; q++) {
        int64_t s = q % kv->n_slots;
        const uint8_t *vr = (const uint8_t *)kv->v + (size_t)s * kv->v_row_size + vhead;
        const float *v;
        if (kv->type_v == HM_TYPE_F32) v = (const float *)vr;
        else {
            if (kv->type_v == HM_TYPE_F16) f16_row_to_f32((const uint16_t *)vr, vrow, hd, j->f16c);
            else quant_dequantize_row(kv->type_v, vr, vrow, hd);
            v = vrow;
        }
        for (int i = 0; i < nh; i++) {
            const float e = scores[(size_t)i * nv + (q - q0)];
            float *ai = acc + (size_t)i * hd;
            for (int d = 0; d < hd; d++) ai[d] = ai[d] + e * v[d];
        }
    }
    for (int i = 0; i < nh; i++) {
        float *o = a->out + (t * a->n_head + h0 + i) * hd;
        const float *ai = acc + (size_t)i * hd;
        for (int d = 0; d < hd; d++) o[d] = ai[d] / den[i];
    }
}

static void attn_worker(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    uint8_t *scr = j->scratch + (size_t)ith * j->per_thread;
    for (;;) {
        int64_t it = atomic_fetch_add(&j->next, 1);
        if (it >= j->n_items) break;
        attn_item(j, it, scr);
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
    size_t qact = kv->type_k == HM_TYPE_Q8_0 ? quant_act_row_size(QUANT_ACT_Q8_32, kv->head_dim) : 0;
    return (size_t)nth * attn_per_thread(n_rep, attn_max_nv(kv, a), kv->head_dim, qact);
}

hm_status cpu_attention(tp_pool *pool, cpu_kv_layer *kv, const cpu_attn_args *a, void *scratch,
                        size_t scratch_size, hm_error *err) {
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
    if (a->n_tok == 0) return HM_OK;

    /* every position this batch reads must fit the ring together with the new rows */
    const int64_t last = a->pos0 + a->n_tok - 1;
    const int64_t first = a->window > 0 && a->pos0 - a->window + 1 > 0 ? a->pos0 - a->window + 1 : 0;
    if (last - first + 1 > kv->n_slots)
        return hm_error_set(err, HM_ERR_STATE,
                            "attention: positions %lld..%lld do not fit the KV cache's %lld slots%s",
                            (long long)first, (long long)last, (long long)kv->n_slots,
                            a->window > 0 ? " (window ring too small for this batch)" : "");
    if (a->k_new) {
        st = cpu_kv_store(pool, kv, a->pos0, a->n_tok, a->k_new, a->v_new, err);
        if (st != HM_OK) return st;
    }
    for (int64_t q = first; q <= last; q++)
        if (kv->slot_pos[q % kv->n_slots] != q)
            return hm_error_set(err, HM_ERR_STATE, "attention: position %lld is not in the KV cache",
                                (long long)q);

    const quant_kernels *kern = a->kern ? a->kern : quant_kernels_best();
    attn_job j = {.kv = kv, .a = a};
    j.dot_k = kern->dot[kv->type_k];
    if (kv->type_k == HM_TYPE_Q8_0) {
        j.act_k = kern->act[QUANT_ACT_Q8_32];
        j.qact_size = quant_act_row_size(QUANT_ACT_Q8_32, kv->head_dim);
    }
    if (!j.dot_k || (kv->type_k == HM_TYPE_Q8_0 && !j.act_k))
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "attention: no dot kernel for the K type");
    const int nth = pool ? tp_size(pool) : 1;
    j.n_rep = a->n_head / kv->n_head_kv;
    attn_split(kv, a, nth, &j.n_sub, &j.rep_per_sub);
    j.n_items = a->n_tok * kv->n_head_kv * j.n_sub;
    j.max_nv = attn_max_nv(kv, a);
    j.scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)kv->head_dim);
    j.f16c = kv->type_v == HM_TYPE_F16 && cpu_has_f16c();
    j.per_thread = attn_per_thread(j.n_rep, j.max_nv, kv->head_dim, j.qact_size);
    atomic_init(&j.next, 0);

    size_t need = j.per_thread * (size_t)nth;
    void *own = NULL;
    if (scratch) {
        if (scratch_size < need)
            return hm_error_set(err, HM_ERR_ARG, "attention: scratch %zu bytes, need %zu",
                                scratch_size, need);
        j.scratch = scratch;
    } else {
        own = aligned_alloc(ATTN_ALIGN, need);
        if (!own) return hm_error_set(err, HM_ERR_NOMEM, "attention: cannot allocate %zu bytes", need);
        j.scratch = own;
    }
    int64_t work = a->n_tok * a->n_head * (last - first + 1) * kv->head_dim;
    ops_run(pool, attn_worker, &j, work, 65536);
    free(own);
    return HM_OK;
}
