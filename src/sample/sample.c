/* sample.c - the sampler chain of sample.h; the exact definition is docs/SAMPLING.md.
 *
 * DESIGN: a working copy of the logits only when penalties apply; they touch only the tokens in the
 * history (counted in a zeroed per-vocabulary array that is zeroed again afterwards); top-k
 * keeps a sorted insertion buffer when k is small and otherwise radix-sorts every candidate
 * (stable, 3 x 11 bits; qsort below 4096 tokens); all orders are the total order (logit desc, id asc), so no step
 * depends on the sort algorithm.
 * The random number of draw `step` is sample_uniform(seed, step); greedy sampling draws none.
 */
#include "sample/sample.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops_math.h"

#define SAMPLE_TOPK_INSERT_MAX 256
#define SAMPLE_RADIX_MIN 4096 /* fewer candidates: qsort (the radix histograms cost more) */

typedef struct cand_pair { float l; int32_t id; } cand_pair;

struct sample_state {
    sample_params p;
    int32_t n_vocab;
    int32_t *hist;      /* [penalty_last_n] ring of accepted tokens */
    int32_t hist_len;   /* tokens in the ring (<= penalty_last_n) */
    int32_t hist_head;  /* next write index */
    uint64_t step;      /* draws so far */
    float *logit;       /* [n_vocab] working logits */
    struct cand_pair *cand; /* [n_vocab] candidates (logit, id) in (logit desc, id asc) order */
    struct cand_pair *tmp;  /* [n_vocab] radix sort buffer */
    int32_t *count;     /* [n_vocab] history counts, all zero between calls */
};

sample_params sample_params_default(void) {
    sample_params p;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.penalty_last_n = 64;
    p.seed = 0;
    return p;
}

uint64_t sample_rng_u64(uint64_t seed, uint64_t step) {
    uint64_t z = seed + (step + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float sample_uniform(uint64_t seed, uint64_t step) {
    return (float)(sample_rng_u64(seed, step) >> 40) * 0x1.0p-24f;
}

void sample_free(sample_state *s) {
    if (!s) return;
    free(s->hist);
    free(s->logit);
    free(s->cand);
    free(s->tmp);
    free(s->count);
    free(s);
}

hm_status sample_params_check(const sample_params *p, int32_t n_vocab, hm_error *err) {
    if (n_vocab <= 0) return hm_error_set(err, HM_ERR_ARG, "sampler: vocabulary size %d", n_vocab);
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p))
        return hm_error_set(err, HM_ERR_ARG, "sampler: temperature, top-p and min-p must be numbers");
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty) ||
        !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return hm_error_set(err, HM_ERR_ARG,
                            "sampler: repeat penalty must be finite and > 0 (got %g), "
                            "presence/frequency finite", (double)p->repeat_penalty);
    if (p->penalty_last_n < 0)
        return hm_error_set(err, HM_ERR_ARG,
                            "sampler: penalty_last_n %d < 0 (resolve -1 to the context size first)",
                            p->penalty_last_n);
    const double worst = (double)p->penalty_last_n * fabs((double)p->frequency_penalty) +
                         fabs((double)p->presence_penalty);
    if (worst > 1e37)
        return hm_error_set(err, HM_ERR_ARG,
                            "sampler: penalty_last_n * |frequency| + |presence| = %g is too large "
                            "(a penalty could become infinite)", worst);
    return HM_OK;
}

hm_status sample_init(const sample_params *p, int32_t n_vocab, sample_state **out, hm_error *err) {
    *out = NULL;
    hm_status st = sample_params_check(p, n_vocab, err);
    if (st != HM_OK) return st;
    sample_state *s = calloc(1, sizeof(*s));
    if (!s) return hm_error_set(err, HM_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    size_t n = (size_t)n_vocab;
    s->hist = malloc((size_t)(p->penalty_last_n > 0 ? p->penalty_last_n : 1) * sizeof(int32_t));
    s->logit = malloc(n * sizeof(float));
    s->cand = malloc(n * sizeof(*s->cand));
    s->tmp = malloc(n * sizeof(*s->tmp));
    s->count = calloc(n, sizeof(int32_t));
    if (!s->hist || !s->logit || !s->cand || !s->tmp || !s->count) {
        sample_free(s);
        return hm_error_set(err, HM_ERR_NOMEM, "sampler: cannot allocate scratch for %d tokens", n_vocab);
    }
    *out = s;
    return HM_OK;
}

void sample_reset(sample_state *s) {
    s->hist_len = 0;
    s->hist_head = 0;
    s->step = 0;
}

void sample_accept(sample_state *s, int32_t token) {
    if (s->p.penalty_last_n <= 0 || token < 0 || token >= s->n_vocab) return;
    s->hist[s->hist_head] = token;
    s->hist_head = (s->hist_head + 1) % s->p.penalty_last_n;
    if (s->hist_len < s->p.penalty_last_n) s->hist_len++;
}

/* whether apply_penalties changes anything */
static bool penalties_on(const sample_state *s) {
    const sample_params *p = &s->p;
    return s->hist_len > 0 &&
           (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f);
}

/* llama.cpp's penalties: for a token seen c > 0 times in the history,
 * l = l <= 0 ? l * repeat : l / repeat; l = l - (c * freq + presence). */
static void apply_penalties(sample_state *s, float *l) {
    const sample_params *p = &s->p;
    if (!penalties_on(s)) return;
    for (int32_t i = 0; i < s->hist_len; i++) s->count[s->hist[i]]++;
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[i];
        int32_t c = s->count[t];
        if (c == 0) continue; /* already applied */
        float v = l[t];
        v = v <= 0.0f ? v * p->repeat_penalty : v / p->repeat_penalty;
        v = v - ((float)c * p->frequency_penalty + p->presence_penalty);
        l[t] = v;
        s->count[t] = 0;
    }
}

/* (logit desc, id asc) */
static int before(float la, int32_t a, float lb, int32_t b) { return la > lb || (la == lb && a < b); }

static int cand_cmp(const void *pa, const void *pb) {
    const cand_pair *a = pa, *b = pb;
    if (before(a->l, a->id, b->l, b->id)) return -1;
    if (before(b->l, b->id, a->l, a->id)) return 1;
    return 0;
}

/* Key whose ascending unsigned order is the (logit desc) order; -0 counts as +0. */
static uint32_t desc_key(float l) {
    uint32_t u;
    l = l + 0.0f;
    memcpy(&u, &l, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

/* Stable LSD radix sort of n pairs by desc_key (3 passes of 11 bits); input in id order, so
 * equal logits stay in id order: the result is the (logit desc, id asc) order. */
static void radix_sort(cand_pair *a, cand_pair *tmp, int32_t n) {
    uint32_t cnt[2048];
    for (int pass = 0; pass < 3; pass++) {
        const int sh = 11 * pass;
        memset(cnt, 0, sizeof(cnt));
        for (int32_t i = 0; i < n; i++) cnt[(desc_key(a[i].l) >> sh) & 2047]++;
        uint32_t sum = 0;
        for (int b = 0; b < 2048; b++) {
            uint32_t c = cnt[b];
            cnt[b] = sum;
            sum += c;
        }
        for (int32_t i = 0; i < n; i++) tmp[cnt[(desc_key(a[i].l) >> sh) & 2047]++] = a[i];
        cand_pair *t = a;
        a = tmp;
        tmp = t;
    }
    /* after an odd number of passes the sorted data is in the other buffer */
    memcpy(tmp, a, (size_t)n * sizeof(cand_pair));
}

/* Fills s->cand with the k best tokens of l (all if k is off) in order; returns the count. */
static int32_t select_top(sample_state *s, const float *l, int32_t k) {
    const int32_t n = s->n_vocab;
    cand_pair *c = s->cand;
    if (k > 0 && k <= SAMPLE_TOPK_INSERT_MAX && k < n) {
        int32_t cnt = 0;
        float thr = -INFINITY; /* c[k - 1].l once the buffer is full */
        for (int32_t t = 0; t < n; t++) {
            float v = l[t];
            /* every id in a full buffer is below t, so t goes before c[k - 1] only on a larger
             * logit: before(v, t, c[k - 1].l, c[k - 1].id) == v > thr */
            if (cnt == k && !(v > thr)) continue;
            int32_t i = cnt < k ? cnt++ : k - 1;
            while (i > 0 && before(v, t, c[i - 1].l, c[i - 1].id)) {
                c[i] = c[i - 1];
                i--;
            }
            c[i].l = v;
            c[i].id = t;
            if (cnt == k) thr = c[k - 1].l;
        }
        return cnt;
    }
    for (int32_t t = 0; t < n; t++) {
        c[t].l = l[t];
        c[t].id = t;
    }
    if (n >= SAMPLE_RADIX_MIN) radix_sort(c, s->tmp, n);
    else qsort(c, (size_t)n, sizeof(cand_pair), cand_cmp); /* a total order: same result */
    return k > 0 && k < n ? k : n;
}

/* Greedy: the first maximum of l (the first t with l[t] > every earlier logit and >= every
 * later one, -0 and +0 equal), in two passes without a chain from element to element: eight
 * running maxima, then the first index equal to their maximum. False on a NaN, which
 * sample_token reports with its index. */
static bool greedy_first_max(const float *l, int32_t n, int32_t *token) {
    float m[8];
    int nan = 0;
    for (int i = 0; i < 8; i++) m[i] = -INFINITY;
    int32_t t = 0;
    for (; t + 8 <= n; t += 8)
        for (int i = 0; i < 8; i++) {
            const float v = l[t + i];
            nan |= v != v;
            m[i] = v > m[i] ? v : m[i];
        }
    for (; t < n; t++) {
        const float v = l[t];
        nan |= v != v;
        m[0] = v > m[0] ? v : m[0];
    }
    if (nan) return false;
    float mx = m[0];
    for (int i = 1; i < 8; i++) mx = m[i] > mx ? m[i] : mx;
    *token = 0;
    for (t = 0; t < n; t++)
        if (l[t] == mx) {
            *token = t;
            break;
        }
    return true;
}

hm_status sample_token(sample_state *s, const float *logits, int32_t *token, hm_error *err) {
    const sample_params *p = &s->p;
    const int32_t n = s->n_vocab;
    const bool pen = penalties_on(s);
    if (p->temperature <= 0.0f && !pen && greedy_first_max(logits, n, token)) return HM_OK;
    int nan = 0;
    for (int32_t t = 0; t < n; t++) nan |= logits[t] != logits[t];
    if (nan)
        for (int32_t t = 0; t < n; t++)
            if (isnan(logits[t])) return hm_error_set(err, HM_ERR_ARG, "sampler: logit of token %d is NaN", t);
    const float *l = logits; /* the working copy only when penalties change it */
    if (pen) {
        memcpy(s->logit, logits, sizeof(float) * (size_t)n);
        apply_penalties(s, s->logit);
        l = s->logit;
    }

    /* greedy after penalties: finite penalties keep every logit a number */
    if (p->temperature <= 0.0f && greedy_first_max(l, n, token)) return HM_OK;

    int32_t nc = select_top(s, l, p->top_k);
    cand_pair *c = s->cand;

    if (p->top_p < 1.0f && nc > 1) { /* smallest prefix whose probability reaches top_p */
        float total = 0.0f;
        for (int32_t i = 0; i < nc; i++) total = total + hm_expf(c[i].l - c[0].l);
        float cum = 0.0f;
        for (int32_t i = 0; i < nc; i++) {
            cum = cum + hm_expf(c[i].l - c[0].l) / total;
            if (cum >= p->top_p) {
                nc = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f && nc > 1) { /* keep logits >= max + ln(min_p) */
        const float thr = c[0].l + logf(p->min_p);
        int32_t keep = 1;
        while (keep < nc && c[keep].l >= thr) keep++;
        nc = keep;
    }
    for (int32_t i = 0; i < nc; i++) c[i].l = c[i].l / p->temperature;

    float total = 0.0f;
    for (int32_t i = 0; i < nc; i++) total = total + hm_expf(c[i].l - c[0].l);
    const float target = sample_uniform(p->seed, s->step) * total;
    s->step++;
    float cum = 0.0f;
    int32_t pick = nc - 1;
    for (int32_t i = 0; i < nc; i++) {
        cum = cum + hm_expf(c[i].l - c[0].l);
        if (cum > target) {
            pick = i;
            break;
        }
    }
    *token = c[pick].id;
    return HM_OK;
}
