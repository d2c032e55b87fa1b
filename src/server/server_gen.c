/* server_gen.c - one request on the inference thread (server_internal.h: srv_gen_run): the
 * prompt (rendered with the chat template for chat), tokens, a generation from an empty cache
 * with the request's sampling and seed, its text handed to the request as it comes.
 *
 * DESIGN: the stop rules, in order: the token budget (max_tokens: "length"), a full context
 * ("length"), an end-of-turn token (the template's stop texts, else the vocabulary's
 * end-of-generation set: "stop"), a stop string (the text is cut before it: "stop"), a cancelled
 * request (the client left). A harmony chat (gpt-oss) returns its final channel's text only
 * (tokenizer/chat.h: chat_harmony). A stream holds back the last (longest stop string - 1) bytes until
 * it knows they do not start a stop string. Decoding starts from an empty cache every time, so
 * one request gives the bytes `hotmoe run` gives for the same prompt, sampling and seed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/generate.h"
#include "server/server_internal.h"

typedef struct {
    char *b;
    size_t n, cap;
} text_buf;

static bool text_add(text_buf *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        size_t cap = (t->n + n + 1) * 2;
        char *b = realloc(t->b, cap);
        if (!b) return false;
        t->b = b, t->cap = cap;
    }
    memcpy(t->b + t->n, s, n);
    t->n += n;
    t->b[t->n] = 0;
    return true;
}

/* The first stop string in t at or after `from` (its offset), or -1. */
static long find_stop(const oai_request *r, const text_buf *t, size_t from) {
    long best = -1;
    for (int i = 0; i < r->n_stop; i++) {
        const size_t m = strlen(r->stop[i]);
        for (size_t p = from; p + m <= t->n; p++)
            if (!memcmp(t->b + p, r->stop[i], m)) {
                if (best < 0 || (long)p < best) best = (long)p;
                break;
            }
    }
    return best;
}

/* Ends the job with an error (a whole response: that status; a stream: an error event). */
static void finish_error(hm_server *s, srv_job *j, int status, const char *msg) {
    atomic_fetch_add(&s->st_errors, 1);
    char *e = oai_error(msg, status >= 500 ? "server_error" : "invalid_request_error", status);
    if (j->req.stream) {
        if (e) {
            srv_job_put(j, "data: ", 6, false, 0);
            srv_job_put(j, e, strlen(e), false, 0);
            srv_job_put(j, "\n\n", 2, false, 0);
        }
        srv_job_put(j, "data: [DONE]\n\n", 14, true, 200);
    } else {
        srv_job_put(j, e ? e : "{}", e ? strlen(e) : 2, true, status);
    }
    free(e);
}

/* The prompt's tokens: a chat rendered by the template (BOS as the vocabulary adds it, unless
 * the template wrote it), a completion's prompt with the vocabulary's special tokens. */
static hm_status prompt_tokens(const hm_server *s, const oai_request *r, tok_ids *ids,
                               hm_error *err) {
    const tok_vocab *v = s->m.vocab;
    if (!r->chat)
        return tok_encode(v, r->prompt, strlen(r->prompt),
                          TOK_ENCODE_ADD_SPECIAL | TOK_ENCODE_PARSE_SPECIAL, ids, err);
    const chat_render_opts o = chat_render_opts_for(v);
    char *text = NULL;
    size_t len = 0;
    hm_status st = chat_render(s->m.tmpl, r->msgs, (size_t)r->n_msgs, &o, &text, &len, err);
    if (st == HM_OK) st = chat_tokenize(v, text, len, ids, err);
    free(text);
    return st;
}

/* A stream's chunk of text [from, to) of t. false: cancelled (or out of memory). */
static bool emit(srv_job *j, const oai_meta *m, const text_buf *t, size_t from, size_t to) {
    if (to <= from) return true;
    char *c = oai_chunk(m, t->b + from, to - from, NULL);
    const bool ok = c && srv_job_put(j, c, strlen(c), false, 0);
    free(c);
    return ok;
}

void srv_gen_run(hm_server *s, srv_job *j) {
    const oai_request *r = &j->req;
    char id[64];
    snprintf(id, sizeof(id), "%s%s", r->chat ? "chat" : "", j->id);
    const oai_meta meta = {.id = id, .model = s->model_id, .created = j->created, .chat = r->chat};
    pthread_mutex_lock(&j->mu);
    const bool gone = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    if (gone) {
        atomic_fetch_add(&s->st_cancelled, 1);
        srv_job_put(j, NULL, 0, true, 503);
        return;
    }
    hm_error err = {0};
    tok_ids ids = {0};
    if (prompt_tokens(s, r, &ids, &err) != HM_OK) {
        finish_error(s, j, 400, err.msg);
        tok_ids_free(&ids);
        return;
    }
    const int n_ctx = hm_context_n_ctx(s->m.ctx);
    if (ids.n == 0 || (int64_t)ids.n >= n_ctx) {
        char msg[128];
        snprintf(msg, sizeof(msg), "the prompt has %zu tokens; the context holds %d", ids.n,
                 n_ctx);
        finish_error(s, j, 400, ids.n ? msg : "the prompt has no tokens");
        tok_ids_free(&ids);
        return;
    }
    hm_context_reset(s->m.ctx);
    sample_params sp = r->sp;
    if (!r->seed_given && s->m.seed_random) { /* as llama-server: a fresh seed per request */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        sp.seed = (uint64_t)now.tv_sec * 1000000007ull ^ (uint64_t)now.tv_nsec;
    }
    hm_gen *g = NULL;
    if (hm_gen_init(s->m.ctx, &sp, NULL, &g, &err) != HM_OK) {
        finish_error(s, j, 400, err.msg);
        tok_ids_free(&ids);
        return;
    }
    hm_gen_set_max(g, r->max_tokens);
    int32_t stops[8];
    const int n_stops = r->chat && s->m.tmpl ? chat_stop_ids(s->m.tmpl, s->m.vocab, stops, 8) : 0;
    size_t hold = 0; /* bytes a stream keeps back: the longest stop string - 1 */
    for (int i = 0; i < r->n_stop; i++)
        if (strlen(r->stop[i]) > hold + 1) hold = strlen(r->stop[i]) - 1;
    tok_stream ts;
    tok_stream_init(&ts, s->m.vocab, TOK_DECODE_REPLACE_INVALID);
    chat_harmony hv; /* a harmony chat (gpt-oss): the final channel's text only */
    chat_harmony_init(&hv, r->chat ? s->m.tmpl : NULL, s->m.vocab);
    text_buf t = {0};
    size_t emitted = 0;
    int n_gen = 0;
    const char *finish = "stop";
    bool alive = true, cut = false;
    hm_status st = hm_gen_prompt(g, ids.ids, (int)ids.n, &err);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!st && alive) {
        if (r->max_tokens >= 0 && n_gen >= r->max_tokens) {
            finish = "length";
            break;
        }
        if (hm_gen_room(g) == 0) {
            finish = "length";
            break;
        }
        int32_t tok;
        if ((st = hm_gen_next(g, &tok, &err))) break;
        bool end = n_stops == 0 ? tok_is_eog(s->m.vocab, tok) : false;
        for (int i = 0; i < n_stops; i++) end = end || tok == stops[i];
        if (end) break;
        n_gen++;
        chat_harmony_token(&hv, tok);
        const char *piece;
        size_t plen;
        if ((st = tok_stream_push(&ts, tok, &piece, &plen, &err))) break;
        if (!chat_harmony_piece(&hv, piece, plen)) continue;
        const size_t before = t.n;
        if (!text_add(&t, piece, plen)) {
            st = hm_error_set(&err, HM_ERR_NOMEM, "out of memory");
            break;
        }
        const long at = find_stop(r, &t, before > hold ? before - hold : 0);
        if (at >= 0) {
            t.n = (size_t)at;
            cut = true;
            break;
        }
        if (r->stream && t.n > emitted + hold) {
            alive = emit(j, &meta, &t, emitted, t.n - hold);
            emitted = t.n - hold;
        }
        pthread_mutex_lock(&j->mu);
        alive = alive && !j->cancelled;
        pthread_mutex_unlock(&j->mu);
    }
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    atomic_fetch_add(&s->st_decode_ns, (unsigned long long)((t1.tv_sec - t0.tv_sec) * 1000000000ll +
                                                            (t1.tv_nsec - t0.tv_nsec)));
    atomic_fetch_add(&s->st_decode_tokens, (unsigned long long)n_gen);
    const char *rest;
    size_t rlen;
    tok_stream_flush(&ts, &rest, &rlen);
    if (!st && !cut && rlen && hv.in_final) text_add(&t, rest, rlen);
    hm_gen_free(g);
    hm_error e2;
    hm_context_flush_routes(s->m.ctx, &e2); /* a GPU's routing counts of this generation */
    tok_stream_free(&ts);
    atomic_fetch_add(&s->st_prompt_tokens, ids.n);
    atomic_fetch_add(&s->st_completion_tokens, (unsigned long long)n_gen);
    if (st) {
        finish_error(s, j, 500, err.msg);
    } else if (!alive) {
        atomic_fetch_add(&s->st_cancelled, 1);
        srv_job_put(j, NULL, 0, true, 499);
    } else if (r->stream) {
        bool ok = emit(j, &meta, &t, emitted, t.n);
        char *fin = oai_chunk(&meta, "", 0, finish);
        char *use = r->include_usage ? oai_usage_chunk(&meta, (int)ids.n, n_gen) : NULL;
        if (ok && fin) srv_job_put(j, fin, strlen(fin), false, 0);
        if (ok && use) srv_job_put(j, use, strlen(use), false, 0);
        srv_job_put(j, "data: [DONE]\n\n", 14, true, 200);
        free(fin);
        free(use);
        atomic_fetch_add(&s->st_completed, 1);
    } else {
        char *resp = oai_response(&meta, t.b ? t.b : "", t.n, finish, (int)ids.n, n_gen);
        if (resp) srv_job_put(j, resp, strlen(resp), true, 200);
        else finish_error(s, j, 500, "out of memory");
        free(resp);
        atomic_fetch_add(&s->st_completed, 1);
    }
    free(t.b);
    tok_ids_free(&ids);
}
