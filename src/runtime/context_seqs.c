/* context_seqs.c - several sequences in one context (context.h: hm_decode_seqs), the engine
 * under the server's slots (runtime/slots.h).
 *
 * DESIGN: each sequence has its own cache of n_ctx positions in the engine (the CPU engine's
 * n_seq caches) and its own length here; sequence 0 is the one the single-sequence API uses, so
 * hm_decode and hm_decode_seqs can be mixed. A batch is checked whole (ids, sequences, room)
 * before anything runs, then cut into ubatches of n_ubatch tokens; each token gets its
 * sequence's next position. The CPU engine computes every row as a single-sequence call does,
 * so which other sequences share a batch changes no byte (cpu_engine_forward_seqs); the GPU
 * engine (full or tiered) runs the step as one forward with an attention per sequence
 * (cuda_engine_decode_seqs). A split placement (a partial -ngl) runs one sequence only.
 */
#include <string.h>

#include "runtime/runtime_internal.h"

static int *past_of(hm_context *c, int seq) { return seq == 0 ? &c->n_past : &c->seq_past[seq]; }

int hm_context_n_seq(const hm_context *c) { return c->p.n_seq; }

int hm_context_seq_n_past(const hm_context *c, int seq) {
    if (seq < 0 || seq >= c->p.n_seq) return -1;
    return seq == 0 ? c->n_past : c->seq_past[seq];
}

hm_status hm_context_seq_clear(hm_context *c, int seq, hm_error *err) {
    if (seq < 0 || seq >= c->p.n_seq)
        return hm_error_set(err, HM_ERR_ARG, "sequence %d of %d", seq, c->p.n_seq);
    if (seq == 0) {
        hm_context_reset(c);
        return HM_OK;
    }
    if (c->cpu) cpu_engine_seq_reset(c->cpu, seq);
    if (c->gpu) {
        hm_status st = cuda_engine_seq_reset(c->gpu, seq, err);
        if (st != HM_OK) return st;
    }
    c->seq_past[seq] = 0;
    return HM_OK;
}

hm_status hm_context_seq_truncate(hm_context *c, int seq, int n_keep, hm_error *err) {
    if (seq < 0 || seq >= c->p.n_seq)
        return hm_error_set(err, HM_ERR_ARG, "sequence %d of %d", seq, c->p.n_seq);
    if (seq == 0) return hm_context_truncate(c, n_keep, err);
    if (n_keep < 0 || n_keep > c->seq_past[seq])
        return hm_error_set(err, HM_ERR_ARG, "sequence %d: cannot keep %d positions of %d", seq,
                            n_keep, c->seq_past[seq]);
    if (c->cpu) { /* the GPU keeps every position of every layer */
        hm_status st = cpu_engine_seq_truncate_check(c->cpu, seq, n_keep, err);
        if (st != HM_OK) return st;
    }
    if (c->gpu && hm_model_arch(c->m)->hybrid && n_keep != c->seq_past[seq])
        return hm_error_set(err, HM_ERR_STATE, "%s: sequence %d's recurrent state is not rewound",
                            hm_model_arch(c->m)->name, seq);
    c->seq_past[seq] = n_keep;
    return HM_OK;
}

hm_status hm_context_seq_rewind(hm_context *c, int seq, int n_keep, int *kept, hm_error *err) {
    *kept = n_keep;
    hm_status st = hm_context_seq_truncate(c, seq, n_keep, err);
    if (st != HM_ERR_STATE || !c->cpu || c->gpu) return st;
    int at = 0; /* the CPU engine's recurrent state: back to its checkpoint */
    if (cpu_engine_seq_restore(c->cpu, seq, n_keep, &at, NULL) != HM_OK) return st;
    st = hm_context_seq_truncate(c, seq, at, err); /* the KV caches cut to the checkpoint */
    if (st == HM_OK) *kept = at;
    return st;
}

/* The whole batch's checks: ids, sequences, order of wanted rows, room in every sequence. */
static hm_status check_seqs(hm_context *c, const int32_t *tokens, const int32_t *seq, int n,
                            const uint8_t *want, const float *logits, hm_error *err) {
    const int64_t V = hm_model_hparams(c->m)->n_vocab;
    if (c->split > 0 || (!c->cpu && !c->gpu))
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "several sequences in one batch need one "
                            "engine for the whole model (not a split placement)");
    if (n <= 0 || !tokens || !seq)
        return hm_error_set(err, HM_ERR_ARG, "nothing to decode (%d tokens)", n);
    if (n > c->p.n_batch)
        return hm_error_set(err, HM_ERR_ARG, "%d tokens in one call exceed the batch size %d "
                            "(-b)", n, c->p.n_batch);
    int *add = c->seq_add;
    memset(add, 0, sizeof(int) * (size_t)c->p.n_seq);
    hm_status st = HM_OK;
    bool any_want = false;
    for (int i = 0; i < n && st == HM_OK; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            st = hm_error_set(err, HM_ERR_RANGE, "token id %d at index %d is outside the "
                              "vocabulary (%lld tokens)", tokens[i], i, (long long)V);
        else if (seq[i] < 0 || seq[i] >= c->p.n_seq)
            st = hm_error_set(err, HM_ERR_ARG, "token %d: sequence %d of %d", i, seq[i],
                              c->p.n_seq);
        else
            add[seq[i]]++;
        any_want = any_want || (want && want[i]);
    }
    for (int s = 0; s < c->p.n_seq && st == HM_OK; s++)
        if (*past_of(c, s) + add[s] > c->p.n_ctx)
            st = hm_error_set(err, HM_ERR_RANGE, "sequence %d: %d tokens after %d positions do "
                              "not fit the context size %d", s, add[s], *past_of(c, s),
                              c->p.n_ctx);
    if (st == HM_OK && any_want && !logits)
        st = hm_error_set(err, HM_ERR_ARG, "logits requested but no buffer given");
    return st;
}

/* One ubatch on the context's engine; a tiered step that failed is redone once after the
 * hand-off's reset (as hm_decode does). */
static hm_status ubatch(hm_context *c, const int32_t *tokens, int n, const int32_t *seq,
                        const int32_t *pos, const uint8_t *want, float *logits, hm_error *err) {
    if (!c->gpu) return cpu_engine_forward_seqs(c->cpu, tokens, n, seq, pos, want, logits, err);
    for (int attempt = 0;; attempt++) {
        hm_status st = cuda_engine_decode_seqs(c->gpu, tokens, n, seq, pos, want, logits, err);
        if (st == HM_OK || attempt == 1 ||
            !runtime_context_tiered_recover(c, st, "a step of several sequences", err))
            return st;
    }
}

hm_status hm_decode_seqs(hm_context *c, const int32_t *tokens, const int32_t *seq, int n,
                         const uint8_t *want, float *logits, hm_error *err) {
    hm_status st = check_seqs(c, tokens, seq, n, want, logits, err);
    if (st != HM_OK) return st;
    const int64_t V = hm_model_hparams(c->m)->n_vocab;
    int32_t *pos = c->seq_pos; /* [n <= n_batch] */
    for (int i = 0; i < n; i++) pos[i] = (*past_of(c, seq[i]))++;
    size_t rows = 0;
    for (int done = 0; done < n && st == HM_OK;) {
        const int k = n - done < c->p.n_ubatch ? n - done : c->p.n_ubatch;
        st = ubatch(c, tokens + done, k, seq + done, pos + done, want ? want + done : NULL,
                    logits ? logits + rows * (size_t)V : NULL, err);
        for (int i = done; want && i < done + k; i++) rows += want[i] != 0;
        done += k;
    }
    if (st != HM_OK) /* the positions of this batch are not kept */
        for (int i = n - 1; i >= 0; i--) *past_of(c, seq[i]) = pos[i];
    if (st == HM_OK && c->gpu) st = hm_context_flush_routes(c, err); /* the device's counts */
    return st;
}
