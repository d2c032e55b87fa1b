/* slots.c - continuous batching over the sequences of one context (slots.h). */
#include "runtime/slots.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    bool active;
    int32_t *prompt; /* [n_prompt] */
    int n_prompt, fed; /* prompt tokens in the cache */
    bool pending;      /* tok handed out, not yet in the cache */
    int32_t tok;
    sample_state *smp;
    int32_t *hist;     /* [n_ctx] the tokens in the slot's cache, kept after a stop */
    int n_hist;
    int cached;        /* prompt tokens the last start found in the cache */
} slot;

struct hm_slots {
    hm_context *ctx;
    int n, n_batch;
    int64_t n_vocab;
    slot *sl;           /* [n] */
    int32_t *tokens, *seq; /* [n_batch] the step's batch */
    uint8_t *want;      /* [n_batch] */
    int *row_slot;      /* [n] slot of each logits row */
    float *logits;      /* [n][n_vocab] */
    int last_batch;
};

hm_status hm_slots_init(hm_context *ctx, hm_slots **out, hm_error *err) {
    *out = NULL;
    hm_slots *s = calloc(1, sizeof(*s));
    if (!s) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (slots)");
    s->ctx = ctx;
    s->n = hm_context_n_seq(ctx);
    s->n_batch = hm_context_n_batch(ctx);
    s->n_vocab = hm_model_hparams(hm_context_model(ctx))->n_vocab;
    s->sl = calloc((size_t)s->n, sizeof(*s->sl));
    s->tokens = malloc(sizeof(int32_t) * (size_t)s->n_batch);
    s->seq = malloc(sizeof(int32_t) * (size_t)s->n_batch);
    s->want = malloc((size_t)s->n_batch);
    s->row_slot = malloc(sizeof(int) * (size_t)s->n);
    s->logits = malloc(sizeof(float) * (size_t)s->n * (size_t)s->n_vocab);
    bool ok = s->sl && s->tokens && s->seq && s->want && s->row_slot && s->logits;
    for (int k = 0; ok && k < s->n; k++)
        ok = (s->sl[k].hist = malloc(sizeof(int32_t) * (size_t)hm_context_n_ctx(ctx))) != NULL;
    if (!ok) {
        hm_slots_free(s);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (slots)");
    }
    *out = s;
    return HM_OK;
}

void hm_slots_stop(hm_slots *s, int k) {
    if (!s || k < 0 || k >= s->n) return;
    slot *q = &s->sl[k];
    free(q->prompt);
    sample_free(q->smp);
    q->prompt = NULL, q->smp = NULL, q->active = false, q->pending = false;
    q->n_prompt = q->fed = 0;
}

void hm_slots_free(hm_slots *s) {
    if (!s) return;
    for (int k = 0; s->sl && k < s->n; k++) {
        hm_slots_stop(s, k);
        free(s->sl[k].hist);
    }
    free(s->sl);
    free(s->tokens);
    free(s->seq);
    free(s->want);
    free(s->row_slot);
    free(s->logits);
    free(s);
}

int hm_slots_count(const hm_slots *s) { return s->n; }

bool hm_slots_active(const hm_slots *s, int k) { return k >= 0 && k < s->n && s->sl[k].active; }

int hm_slots_room(const hm_slots *s, int k) {
    if (!hm_slots_active(s, k)) return 0;
    const slot *q = &s->sl[k];
    const int used = q->fed < q->n_prompt ? q->n_prompt
                                          : hm_context_seq_n_past(s->ctx, k) + (q->pending ? 1 : 0);
    const int room = hm_context_n_ctx(s->ctx) - used;
    return room > 0 ? room : 0;
}

/* Tokens at the start of prompt[0..n) that slot k's cache holds, at most n - 1 (the last
 * prompt token is run for its logits); 0 when the engine's bytes could differ (a GPU: a prompt
 * recomputed in one batch and the same tokens cached by earlier steps take other kernels). */
static int common_prefix(const hm_slots *s, int k, const int32_t *prompt, int n) {
    if (hm_context_gpu(s->ctx)) return 0;
    const slot *q = &s->sl[k];
    int p = 0;
    while (p < q->n_hist && p < n - 1 && q->hist[p] == prompt[p]) p++;
    return p;
}

int hm_slots_pick(const hm_slots *s, const int32_t *prompt, int n) {
    int best = -1, best_p = -1;
    for (int k = 0; k < s->n; k++) {
        if (s->sl[k].active) continue;
        const int p = common_prefix(s, k, prompt, n);
        if (p > best_p) best = k, best_p = p;
    }
    return best;
}

void hm_slots_forget(hm_slots *s, int k) {
    if (k >= 0 && k < s->n && !s->sl[k].active) s->sl[k].n_hist = 0;
}

int hm_slots_cached(const hm_slots *s, int k) {
    return k >= 0 && k < s->n ? s->sl[k].cached : 0;
}

hm_status hm_slots_start(hm_slots *s, int k, const int32_t *prompt, int n, const sample_params *sp,
                         hm_error *err) {
    if (k < 0 || k >= s->n) return hm_error_set(err, HM_ERR_ARG, "slot %d of %d", k, s->n);
    if (n < 1 || !prompt || n >= hm_context_n_ctx(s->ctx))
        return hm_error_set(err, HM_ERR_ARG, "slot %d: a prompt of %d tokens (1 to %d)", k, n,
                            hm_context_n_ctx(s->ctx) - 1);
    hm_slots_stop(s, k);
    slot *q = &s->sl[k];
    int p = common_prefix(s, k, prompt, n); /* reused: those positions stay in the cache */
    hm_status st = p > 0 ? hm_context_seq_rewind(s->ctx, k, p, &p, err) : HM_ERR_STATE;
    if (st != HM_OK) { /* a recurrent state with no checkpoint that early: read it all again */
        p = 0;
        st = hm_context_seq_clear(s->ctx, k, err);
    }
    if (st != HM_OK) return st;
    q->n_hist = p;
    q->cached = p;
    if (!(q->prompt = malloc(sizeof(int32_t) * (size_t)n)))
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (slot prompt)");
    memcpy(q->prompt, prompt, sizeof(int32_t) * (size_t)n);
    st = sample_init(sp, (int32_t)s->n_vocab, &q->smp, err);
    if (st != HM_OK) {
        hm_slots_stop(s, k);
        return st;
    }
    for (int i = 0; i < n; i++) sample_accept(q->smp, prompt[i]);
    q->n_prompt = n;
    q->fed = p;
    q->active = true;
    return HM_OK;
}

/* Appends slot k's part of the step to the batch: its pending token, or its next prompt chunk
 * within the room left (m tokens in the batch so far); the new count. */
static int add_slot(hm_slots *s, int k, int m, bool prompts) {
    slot *q = &s->sl[k];
    if (!q->active) return m;
    if (!prompts && q->fed == q->n_prompt && q->pending &&
        hm_context_seq_n_past(s->ctx, k) < hm_context_n_ctx(s->ctx) && m < s->n_batch) {
        s->tokens[m] = q->tok, s->seq[m] = k, s->want[m] = 1;
        return m + 1;
    }
    if (prompts && q->fed < q->n_prompt) {
        int c = q->n_prompt - q->fed;
        if (c > s->n_batch - m) c = s->n_batch - m;
        for (int i = 0; i < c; i++) {
            s->tokens[m + i] = q->prompt[q->fed + i], s->seq[m + i] = k;
            s->want[m + i] = q->fed + i == q->n_prompt - 1;
        }
        return m + c;
    }
    return m;
}

hm_status hm_slots_step(hm_slots *s, int32_t *out, hm_error *err) {
    int m = 0;
    for (int k = 0; k < s->n; k++) out[k] = -1;
    for (int k = 0; k < s->n; k++) m = add_slot(s, k, m, false);
    for (int k = 0; k < s->n; k++) m = add_slot(s, k, m, true);
    if (m == 0)
        return hm_error_set(err, HM_ERR_STATE, "slots: no active slot has work (all idle or "
                            "full)");
    hm_status st = hm_decode_seqs(s->ctx, s->tokens, s->seq, m, s->want, s->logits, err);
    if (st != HM_OK) return st;
    s->last_batch = m;
    int rows = 0;
    for (int i = 0; i < m; i++) { /* what went into the caches */
        slot *q = &s->sl[s->seq[i]];
        if (q->fed < q->n_prompt) q->fed++;
        else q->pending = false;
        q->hist[q->n_hist++] = s->tokens[i];
        if (s->want[i]) s->row_slot[rows++] = s->seq[i];
    }
    for (int r = 0; r < rows; r++) {
        const int k = s->row_slot[r];
        slot *q = &s->sl[k];
        if (hm_slots_room(s, k) == 0) continue;
        st = sample_token(q->smp, s->logits + (size_t)r * (size_t)s->n_vocab, &q->tok, err);
        if (st != HM_OK) return st;
        sample_accept(q->smp, q->tok);
        q->pending = true;
        out[k] = q->tok;
    }
    return HM_OK;
}

int hm_slots_last_batch(const hm_slots *s) { return s->last_batch; }
