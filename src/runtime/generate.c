/* generate.c - the generation API of generate.h: a CPU loop (hm_decode + sample_token per
 * token) and the GPU-autonomous loop (cuda_decode.h) behind one interface.
 *
 * DESIGN: a generation is the span from the first hm_gen_next after a prompt (or after
 * hm_gen_end) to the next hm_gen_end / hm_gen_prompt. pos0 is the cache length at its start,
 * taken the tokens handed out; every taken token ends up at position pos0 + i of the cache.
 *  - CPU: the token handed out last is "pending" (not yet in the cache); the next hm_gen_next or
 *    hm_gen_end decodes it. So a caller that stops after n tokens pays n - 1 decodes, as the old
 *    loops did.
 *  - GPU: steps are launched up to `lookahead` ahead of the caller, never beyond the
 *    generation's limit (n_max, room in the cache). The host keeps a mirror of the sampler
 *    state (history ring of the last penalty_last_n accepted tokens, draw count) so that
 *    hm_gen_end can put the device sampler back where the caller stopped.
 * The generator checks that nobody else moved the cache between its calls (expect_past).
 */
#include "runtime/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_decode.h"
#include "cuda/cuda_engine.h"
#include "runtime/runtime_internal.h"

#define GEN_MAX_LOOKAHEAD CUDA_DECODE_MAX_DEPTH

struct hm_gen {
    hm_context *ctx;
    hm_gen_params p;
    sample_params sp;
    int32_t n_vocab;
    bool gpu;           /* autonomous device loop */
    cuda_engine *eng;   /* the context's engine (also in host_loop mode), or NULL */

    /* CPU loop */
    sample_state *smp;
    float *logits;      /* [n_vocab] logits of the last token in the cache (CPU loop; on the GPU
                           only the prompt's, unused) */
    bool pending;       /* CPU: pending_tok taken but not yet decoded */
    int32_t pending_tok;

    /* both */
    bool have_logits;   /* there are logits to draw the next token from */
    int expect_past;    /* hm_context_n_past the generator left (-1: not yet) */
    bool active;        /* a generation is running */
    int pos0;           /* cache length at its start */
    int taken;          /* tokens handed out in it */
    int limit;          /* most tokens it may hand out */
    int32_t last_tok;   /* the token at position n_past - 1 (GPU redo) */

    /* GPU loop */
    cuda_decode *dec;
    uint64_t step0;     /* global step number of the generation's first step */
    int launched;       /* steps launched in this generation */
    int32_t *hist;      /* [hist_cap] mirror of the device history ring */
    int hist_cap, hist_len, hist_head;
    uint64_t draws;     /* mirror of the draw counter after the taken tokens */

    /* audit */
    double *arrive;     /* [audit_tokens] */
    int n_timed;
    uint64_t syncs_begin, syncs_first, syncs_last, syncs_after;
    uint64_t queries_begin; /* cuda_decode's stream query count at the start */
    uint64_t queries_end;
    uint64_t steps;
};

hm_gen_params hm_gen_default_params(void) {
    hm_gen_params p = {.lookahead = 8, .n_max = -1, .host_loop = false, .audit_tokens = 0};
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t host_syncs(const hm_gen *g) {
    return g->eng ? cuda_engine_host_syncs(g->eng) : 0;
}

static uint64_t dec_queries(const hm_gen *g) {
    if (!g->dec) return 0;
    cuda_decode_stats s;
    cuda_decode_get_stats(g->dec, &s);
    return s.queries;
}

static void hist_push(hm_gen *g, const int32_t *t, int n) {
    if (g->hist_cap == 0) return;
    for (int i = 0; i < n; i++) {
        g->hist[g->hist_head] = t[i];
        g->hist_head = (g->hist_head + 1) % g->hist_cap;
        if (g->hist_len < g->hist_cap) g->hist_len++;
    }
}

/* The mirror history, oldest first, into out [hist_len]. */
static void hist_linear(const hm_gen *g, int32_t *out) {
    int start = (g->hist_head - g->hist_len + g->hist_cap) % (g->hist_cap ? g->hist_cap : 1);
    for (int i = 0; i < g->hist_len; i++) out[i] = g->hist[(start + i) % g->hist_cap];
}

void hm_gen_free(hm_gen *g) {
    if (!g) return;
    if (g->gpu && g->active) { /* steps may still write the cache: wait, keep what was taken */
        cuda_decode_finish(g->dec, NULL);
        runtime_context_set_past(g->ctx, g->pos0 + g->taken);
    }
    cuda_decode_free(g->dec);
    sample_free(g->smp);
    free(g->logits);
    free(g->hist);
    free(g->arrive);
    free(g);
}

hm_status hm_gen_init(hm_context *ctx, const sample_params *sp, const hm_gen_params *gp,
                      hm_gen **out, hm_error *err) {
    *out = NULL;
    hm_gen_params p = gp ? *gp : hm_gen_default_params();
    if (p.lookahead < 1 || p.lookahead > GEN_MAX_LOOKAHEAD)
        return hm_error_set(err, HM_ERR_ARG, "generation: lookahead %d (1..%d)", p.lookahead,
                            GEN_MAX_LOOKAHEAD);
    if (p.n_max < -1 || p.audit_tokens < 0)
        return hm_error_set(err, HM_ERR_ARG, "generation: n_max must be >= -1 and audit_tokens "
                            ">= 0");
    if (sp->penalty_last_n < 0)
        return hm_error_set(err, HM_ERR_ARG, "generation: penalty_last_n must be >= 0");
    hm_gen *g = calloc(1, sizeof(*g));
    if (!g) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (generator)");
    g->ctx = ctx;
    g->p = p;
    g->sp = *sp;
    g->n_vocab = (int32_t)hm_model_hparams(hm_context_model(ctx))->n_vocab;
    g->eng = hm_context_gpu(ctx);
    /* a split context's first layers run on the CPU: the per-token host path */
    g->gpu = g->eng && !p.host_loop && hm_context_split_layer(ctx) == 0;
    g->expect_past = -1;
    hm_status st = HM_OK;
    if (p.audit_tokens > 0) {
        g->arrive = malloc(sizeof(double) * (size_t)p.audit_tokens);
        if (!g->arrive) st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (audit)");
    }
    if (st == HM_OK && !g->gpu) {
        st = sample_init(sp, g->n_vocab, &g->smp, err);
        if (st == HM_OK && !(g->logits = malloc(sizeof(float) * (size_t)g->n_vocab)))
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (logits)");
    } else if (st == HM_OK) {
        g->hist_cap = sp->penalty_last_n; /* as the device ring: accepted tokens (prompts
                                             included) may outnumber the context */
        if (g->hist_cap > 0 && !(g->hist = malloc(sizeof(int32_t) * (size_t)g->hist_cap)))
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (history)");
        /* the float logits of a prompt come back through hm_decode (host API) */
        if (st == HM_OK && !(g->logits = malloc(sizeof(float) * (size_t)g->n_vocab)))
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (logits)");
        if (st == HM_OK) st = cuda_decode_init(g->eng, sp, p.lookahead, &g->dec, err);
    }
    if (st != HM_OK) {
        hm_gen_free(g);
        return st;
    }
    *out = g;
    return HM_OK;
}

bool hm_gen_on_gpu(const hm_gen *g) { return g->gpu; }

void hm_gen_set_max(hm_gen *g, int n_max) { g->p.n_max = n_max < -1 ? -1 : n_max; }

static hm_status check_ctx(const hm_gen *g, hm_error *err) {
    if (g->expect_past >= 0 && hm_context_n_past(g->ctx) != g->expect_past)
        return hm_error_set(err, HM_ERR_STATE, "generation: the context changed outside the "
                            "generator (%d positions, expected %d); run a prompt first",
                            hm_context_n_past(g->ctx), g->expect_past);
    return HM_OK;
}

/* ---- ending a generation ---- */

static hm_status end_cpu(hm_gen *g, hm_error *err) {
    if (g->pending) {
        int pos = hm_context_n_past(g->ctx);
        hm_status st = hm_decode(g->ctx, &g->pending_tok, 1, pos, g->logits, HM_LOGITS_LAST, err);
        if (st != HM_OK) return st;
        g->pending = false;
        g->have_logits = true;
        g->steps++;
    }
    return HM_OK;
}

/* The device's sampler and logits back where the caller stopped (pos0 + taken positions kept):
 * the history and draw count of the tokens taken, and the last one's step run again — or, when
 * no token was taken yet (from_prompt), the prompt's logits as the host received them. */
static hm_status gpu_rewind(hm_gen *g, bool from_prompt, hm_error *err) {
    int32_t *h = NULL;
    if (g->hist_len > 0 && !(h = malloc(sizeof(int32_t) * (size_t)g->hist_len)))
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (history)");
    if (h) hist_linear(g, h);
    hm_status st = cuda_decode_sampler_set(g->dec, h, g->hist_len, g->draws, err);
    free(h);
    if (st != HM_OK) return st;
    if (from_prompt) return cuda_decode_set_logits(g->dec, g->logits, err);
    return cuda_decode_redo(g->dec, g->last_tok, hm_context_n_past(g->ctx) - 1, err);
}

static hm_status end_gpu(hm_gen *g, hm_error *err) {
    hm_status st = cuda_decode_finish(g->dec, err);
    if (st != HM_OK) return st;
    runtime_context_set_past(g->ctx, g->pos0 + g->taken);
    st = hm_context_flush_routes(g->ctx, err); /* the generation's routing, counted on the GPU */
    if (st != HM_OK) return st;
    if (g->launched > g->taken) /* the device ran ahead */
        return gpu_rewind(g, g->taken == 0 && g->have_logits, err);
    return HM_OK;
}

hm_status hm_gen_end(hm_gen *g, hm_error *err) {
    if (!g->active) return HM_OK;
    hm_status st = g->gpu ? end_gpu(g, err) : end_cpu(g, err);
    if (st != HM_OK) return st;
    g->active = false;
    g->syncs_after = host_syncs(g);
    g->queries_end = dec_queries(g);
    g->expect_past = hm_context_n_past(g->ctx);
    return HM_OK;
}

/* ---- prompt ---- */

hm_status hm_gen_prompt(hm_gen *g, const int32_t *tokens, int n, hm_error *err) {
    if (n < 1 || !tokens)
        return hm_error_set(err, HM_ERR_ARG, "generation: a prompt needs at least one token");
    hm_status st = hm_gen_end(g, err);
    if (st != HM_OK) return st;
    g->have_logits = false;
    const int n_batch = hm_context_n_batch(g->ctx);
    for (int done = 0; done < n;) {
        int k = n - done < n_batch ? n - done : n_batch;
        bool last = done + k == n;
        st = hm_decode(g->ctx, tokens + done, k, hm_context_n_past(g->ctx), last ? g->logits : NULL,
                       last ? HM_LOGITS_LAST : HM_LOGITS_NONE, err);
        if (st != HM_OK) {
            g->expect_past = -1;
            return st;
        }
        done += k;
    }
    if (g->gpu) {
        hist_push(g, tokens, n);
        st = cuda_decode_accept(g->dec, tokens, n, err);
        if (st != HM_OK) return st;
    } else {
        for (int i = 0; i < n; i++) sample_accept(g->smp, tokens[i]);
    }
    g->last_tok = tokens[n - 1];
    g->have_logits = true;
    g->expect_past = hm_context_n_past(g->ctx);
    return HM_OK;
}

/* ---- the next token ---- */

int hm_gen_room(const hm_gen *g) {
    int used = g->active ? g->pos0 + g->taken : hm_context_n_past(g->ctx) + (g->pending ? 1 : 0);
    int room = hm_context_n_ctx(g->ctx) - used;
    return room > 0 ? room : 0;
}

static void start(hm_gen *g) {
    g->active = true;
    g->pos0 = hm_context_n_past(g->ctx);
    g->taken = 0;
    g->launched = 0;
    int room = hm_context_n_ctx(g->ctx) - g->pos0;
    g->limit = g->p.n_max >= 0 && g->p.n_max < room ? g->p.n_max : room;
    if (g->limit < 0) g->limit = 0;
    g->n_timed = 0;
    g->steps = 0;
    g->syncs_begin = g->syncs_first = g->syncs_last = g->syncs_after = host_syncs(g);
    g->queries_begin = g->queries_end = dec_queries(g);
}

static hm_status limit_error(const hm_gen *g, hm_error *err) {
    if (g->pos0 + g->taken >= hm_context_n_ctx(g->ctx))
        return hm_error_set(err, HM_ERR_RANGE, "context full (%d tokens)",
                            hm_context_n_ctx(g->ctx));
    return hm_error_set(err, HM_ERR_STATE, "generation: the limit of %d tokens is reached",
                        g->p.n_max);
}

static void took(hm_gen *g, int32_t tok) {
    if (g->taken == 0) g->syncs_first = host_syncs(g);
    g->syncs_last = host_syncs(g);
    g->taken++;
    if (g->arrive && g->n_timed < g->p.audit_tokens) g->arrive[g->n_timed++] = now_s();
}

static hm_status next_cpu(hm_gen *g, int32_t *token, hm_error *err) {
    if (!g->active) {
        hm_status st = check_ctx(g, err);
        if (st != HM_OK) return st;
        if (!g->have_logits)
            return hm_error_set(err, HM_ERR_STATE, "generation: no logits to sample from (run a "
                                "prompt first)");
        start(g);
    }
    if (g->taken >= g->limit) return limit_error(g, err);
    if (g->pending) {
        int pos = hm_context_n_past(g->ctx);
        hm_status st = hm_decode(g->ctx, &g->pending_tok, 1, pos, g->logits, HM_LOGITS_LAST, err);
        if (st != HM_OK) return st;
        g->pending = false;
        g->steps++;
    }
    int32_t t;
    hm_status st = sample_token(g->smp, g->logits, &t, err);
    if (st != HM_OK) return st;
    sample_accept(g->smp, t);
    g->pending = true;
    g->pending_tok = t;
    g->last_tok = t;
    took(g, t);
    *token = t;
    return HM_OK;
}

static hm_status launch_more(hm_gen *g, hm_error *err) {
    while (g->launched < g->limit && g->launched < g->taken + g->p.lookahead) {
        hm_status st = cuda_decode_launch(g->dec, err);
        if (st != HM_OK) return st;
        g->launched++;
        g->steps++;
    }
    return HM_OK;
}

/* A tiered step of the loop failed (st): the hand-off reset (runtime_context_tiered_recover),
 * the device put back after the tokens taken, and the loop started again from there with the
 * same step numbering (step0 + taken is the next step). false: not recoverable, err says why. */
static bool gpu_recover(hm_gen *g, hm_status st, hm_error *err) {
    cuda_decode_finish(g->dec, NULL); /* the steps in flight end (their waits were aborted) */
    char what[80];
    snprintf(what, sizeof(what), "the generation step of token %d", g->taken);
    if (!runtime_context_tiered_recover(g->ctx, st, what, err)) return false;
    runtime_context_set_past(g->ctx, g->pos0 + g->taken);
    hm_error e2;
    hm_status s2 = gpu_rewind(g, g->taken == 0 && g->have_logits, &e2);
    if (s2 == HM_OK) s2 = cuda_decode_begin(g->dec, g->pos0 + g->taken, &e2);
    if (s2 == HM_OK) {
        g->step0 = cuda_decode_launched(g->dec) - (uint64_t)g->taken;
        g->launched = g->taken;
        s2 = launch_more(g, &e2);
    }
    if (s2 != HM_OK && err) *err = e2;
    return s2 == HM_OK;
}

static hm_status next_gpu(hm_gen *g, int32_t *token, hm_error *err) {
    hm_status st;
    if (!g->active) {
        st = check_ctx(g, err);
        if (st != HM_OK) return st;
        if (!g->have_logits)
            return hm_error_set(err, HM_ERR_STATE, "generation: no logits to sample from (run a "
                                "prompt first)");
        start(g);
        if (g->limit == 0) {
            g->active = false;
            return limit_error(g, err);
        }
        st = cuda_decode_begin(g->dec, g->pos0, err);
        if (st == HM_OK) {
            g->step0 = cuda_decode_launched(g->dec);
            st = launch_more(g, err);
        }
        if (st != HM_OK) return st;
    }
    if (g->taken >= g->limit) return limit_error(g, err);
    int32_t t;
    st = cuda_decode_wait(g->dec, g->step0 + (uint64_t)g->taken, &t, err);
    if (st != HM_OK && gpu_recover(g, st, err))
        st = cuda_decode_wait(g->dec, g->step0 + (uint64_t)g->taken, &t, err);
    if (st != HM_OK) return st;
    if (t < 0 || t >= g->n_vocab) /* the device sampler's answer to a NaN logit */
        return hm_error_set(err, HM_ERR_ARG, "generation: a logit is NaN (step %d)", g->taken);
    hist_push(g, &t, 1);
    if (g->sp.temperature > 0.0f) g->draws++;
    g->last_tok = t;
    took(g, t);
    *token = t;
    return launch_more(g, err);
}

hm_status hm_gen_next(hm_gen *g, int32_t *token, hm_error *err) {
    return g->gpu ? next_gpu(g, token, err) : next_cpu(g, token, err);
}

hm_status hm_gen_reset_sampler(hm_gen *g, hm_error *err) {
    hm_status st = hm_gen_end(g, err);
    if (st != HM_OK) return st;
    if (!g->gpu) {
        sample_reset(g->smp);
        return HM_OK;
    }
    g->hist_len = g->hist_head = 0;
    g->draws = 0;
    return cuda_decode_sampler_set(g->dec, NULL, 0, 0, err);
}

/* ---- audit ---- */

void hm_gen_audit_get(const hm_gen *g, hm_gen_audit *a) {
    memset(a, 0, sizeof(*a));
    a->gpu = g->gpu;
    a->n_tokens = g->taken;
    a->n_timed = g->n_timed;
    a->host_syncs = g->syncs_last - g->syncs_first;
    uint64_t end = g->active ? host_syncs(g) : g->syncs_after;
    a->host_syncs_end = (end - g->syncs_begin) - a->host_syncs;
    a->steps = g->steps;
    if (g->dec) {
        cuda_decode_stats s;
        cuda_decode_get_stats(g->dec, &s);
        a->graph_nodes = s.graph_nodes;
        a->kernel_nodes = s.kernel_nodes;
        a->stream_queries = (g->active ? s.queries : g->queries_end) - g->queries_begin;
    }
    if (g->n_timed > 0) {
        a->first_s = g->arrive[0];
        a->last_s = g->arrive[g->n_timed - 1];
    }
    int n = g->n_timed - 1; /* intervals */
    if (n >= 1) {
        double s = 0, s2 = 0;
        for (int i = 0; i < n; i++) s += g->arrive[i + 1] - g->arrive[i];
        double mean = s / n;
        for (int i = 0; i < n; i++) {
            double d = g->arrive[i + 1] - g->arrive[i] - mean;
            s2 += d * d;
        }
        a->tg_mean_s = mean;
        a->tg_cv = n > 1 && mean > 0 ? sqrt(s2 / (n - 1)) / mean : 0;
    }
}

const double *hm_gen_arrivals(const hm_gen *g, int *n) {
    *n = g->n_timed;
    return g->arrive;
}
