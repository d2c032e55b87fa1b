/* server_gen.c - one request on the inference thread (server_internal.h): the prompt (rendered
 * with the chat template for chat), tokens, a generation from an empty cache with the request's
 * sampling and seed, its text handed to the request as it comes. srv_run_* hold a request
 * between its tokens, so that one loop (srv_gen_run: the generator, any context) or several
 * requests at once (server_slots.c) can draw them.
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

static bool text_add(srv_run *r, const char *s, size_t n) {
    if (r->text_n + n + 1 > r->text_cap) {
        size_t cap = (r->text_n + n + 1) * 2;
        char *b = realloc(r->text, cap);
        if (!b) return false;
        r->text = b, r->text_cap = cap;
    }
    memcpy(r->text + r->text_n, s, n);
    r->text_n += n;
    r->text[r->text_n] = 0;
    return true;
}

/* The first stop string in the text at or after `from` (its offset), or -1. */
static long find_stop(const oai_request *q, const srv_run *r, size_t from) {
    long best = -1;
    for (int i = 0; i < q->n_stop; i++) {
        const size_t m = strlen(q->stop[i]);
        for (size_t p = from; p + m <= r->text_n; p++)
            if (!memcmp(r->text + p, q->stop[i], m)) {
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

/* The response's identity (built when needed: a run holds no pointer into itself, so it may be
 * copied). */
static oai_meta run_meta(const srv_run *r) {
    return (oai_meta){.id = r->id, .model = r->model, .created = r->j->created,
                      .chat = r->j->req.chat, .first = !r->streamed};
}

/* A stream's chunk of the text [from, to), also an empty one when `always`. false: cancelled
 * (or out of memory). */
static bool emit(srv_run *r, size_t from, size_t to, bool always) {
    if (to <= from && !always) return true;
    const oai_meta m = run_meta(r);
    char *c = oai_chunk(&m, r->text ? r->text + from : "", to - from, NULL);
    const bool ok = c && srv_job_put(r->j, c, strlen(c), false, 0);
    r->streamed = r->streamed || ok;
    free(c);
    return ok;
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000ll + t.tv_nsec;
}

bool srv_run_begin(hm_server *s, srv_job *j, srv_run *r) {
    memset(r, 0, sizeof(*r));
    const oai_request *q = &j->req;
    r->j = j;
    snprintf(r->id, sizeof(r->id), "%s%s", q->chat ? "chat" : "", j->id);
    r->model = s->model_id;
    pthread_mutex_lock(&j->mu);
    const bool gone = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    if (gone) {
        atomic_fetch_add(&s->st_cancelled, 1);
        srv_job_put(j, NULL, 0, true, 503);
        return false;
    }
    hm_error err = {0};
    if (prompt_tokens(s, q, &r->ids, &err) != HM_OK) {
        finish_error(s, j, 400, err.msg);
        tok_ids_free(&r->ids);
        return false;
    }
    const int n_ctx = hm_context_n_ctx(s->m.ctx);
    if (r->ids.n == 0 || (int64_t)r->ids.n >= n_ctx) {
        char msg[128];
        snprintf(msg, sizeof(msg), "the prompt has %zu tokens; the context holds %d", r->ids.n,
                 n_ctx);
        finish_error(s, j, 400, r->ids.n ? msg : "the prompt has no tokens");
        tok_ids_free(&r->ids);
        return false;
    }
    r->sp = q->sp;
    if (!q->seed_given && s->m.seed_random) { /* as llama-server: a fresh seed per request */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        r->sp.seed = (uint64_t)now.tv_sec * 1000000007ull ^ (uint64_t)now.tv_nsec;
    }
    r->n_stops = q->chat && s->m.tmpl ? chat_stop_ids(s->m.tmpl, s->m.vocab, r->stops, 8) : 0;
    for (int i = 0; i < q->n_stop; i++)
        if (strlen(q->stop[i]) > r->hold + 1) r->hold = strlen(q->stop[i]) - 1;
    tok_stream_init(&r->ts, s->m.vocab, TOK_DECODE_REPLACE_INVALID);
    chat_harmony_init(&r->hv, q->chat ? s->m.tmpl : NULL, s->m.vocab); /* harmony: final only */
    r->finish = "stop";
    r->alive = true;
    r->t0_ns = now_ns();
    return true;
}

bool srv_run_full(srv_run *r, int room) {
    if ((r->j->req.max_tokens >= 0 && r->n_gen >= r->j->req.max_tokens) || room == 0) {
        r->finish = "length";
        return true;
    }
    return false;
}

bool srv_run_token(hm_server *s, srv_run *r, int32_t tok, hm_status *st, hm_error *err) {
    const oai_request *q = &r->j->req;
    bool end = r->n_stops == 0 ? tok_is_eog(s->m.vocab, tok) : false;
    for (int i = 0; i < r->n_stops; i++) end = end || tok == r->stops[i];
    end = end && !q->ignore_eos;
    if (end) return false;
    r->n_gen++;
    chat_harmony_token(&r->hv, tok);
    const char *piece;
    size_t plen;
    bool sent = false;
    if ((*st = tok_stream_push(&r->ts, tok, &piece, &plen, err))) return false;
    if (chat_harmony_piece(&r->hv, piece, plen)) {
        const size_t before = r->text_n;
        if (!text_add(r, piece, plen)) {
            *st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
            return false;
        }
        const long at = find_stop(q, r, before > r->hold ? before - r->hold : 0);
        if (at >= 0) {
            r->text_n = (size_t)at;
            r->cut = true;
            return false;
        }
        if (q->stream && r->text_n > r->emitted + r->hold) {
            r->alive = emit(r, r->emitted, r->text_n - r->hold, false);
            r->emitted = r->text_n - r->hold;
            sent = true;
        }
    }
    /* A token whose text is held back (part of a character, a stop string's possible start, no
     * text at all) still gets a chunk, with empty text, as llama-server sends one: a client sees
     * every token come, and one that has left is noticed at the next token. */
    if (q->stream && !sent) r->alive = emit(r, r->emitted, r->emitted, true);
    pthread_mutex_lock(&r->j->mu);
    r->alive = r->alive && !r->j->cancelled;
    pthread_mutex_unlock(&r->j->mu);
    return r->alive;
}

void srv_run_end(hm_server *s, srv_run *r, hm_status st, const hm_error *err) {
    srv_job *j = r->j;
    const oai_request *q = &j->req;
    atomic_fetch_add(&s->st_decode_ns, (unsigned long long)(now_ns() - r->t0_ns));
    atomic_fetch_add(&s->st_decode_tokens, (unsigned long long)r->n_gen);
    const char *rest;
    size_t rlen;
    tok_stream_flush(&r->ts, &rest, &rlen);
    if (!st && !r->cut && rlen && r->hv.in_final) text_add(r, rest, rlen);
    tok_stream_free(&r->ts);
    atomic_fetch_add(&s->st_prompt_tokens, r->ids.n);
    atomic_fetch_add(&s->st_completion_tokens, (unsigned long long)r->n_gen);
    if (st) {
        finish_error(s, j, r->err_status ? r->err_status : 500,
                     err ? err->msg : "generation failed");
    } else if (!r->alive) {
        atomic_fetch_add(&s->st_cancelled, 1);
        srv_job_put(j, NULL, 0, true, 499);
    } else if (q->stream) {
        bool ok = emit(r, r->emitted, r->text_n, false);
        const oai_meta m = run_meta(r);
        char *fin = oai_chunk(&m, "", 0, r->finish);
        char *use = q->include_usage ? oai_usage_chunk(&m, (int)r->ids.n, r->n_gen) : NULL;
        if (ok && fin) srv_job_put(j, fin, strlen(fin), false, 0);
        if (ok && use) srv_job_put(j, use, strlen(use), false, 0);
        srv_job_put(j, "data: [DONE]\n\n", 14, true, 200);
        free(fin);
        free(use);
        atomic_fetch_add(&s->st_completed, 1);
    } else {
        const oai_meta m = run_meta(r);
        char *resp = oai_response(&m, r->text ? r->text : "", r->text_n, r->finish,
                                  (int)r->ids.n, r->n_gen);
        if (resp) {
            srv_job_put(j, resp, strlen(resp), true, 200);
            atomic_fetch_add(&s->st_completed, 1);
        } else {
            finish_error(s, j, 500, "out of memory");
        }
        free(resp);
    }
    free(r->text);
    tok_ids_free(&r->ids);
    memset(r, 0, sizeof(*r));
}

void srv_gen_run(hm_server *s, srv_job *j) {
    srv_run r;
    if (!srv_run_begin(s, j, &r)) return;
    hm_error err = {0};
    hm_context_reset(s->m.ctx);
    hm_gen *g = NULL;
    if (hm_gen_init(s->m.ctx, &r.sp, NULL, &g, &err) != HM_OK) {
        r.err_status = 400; /* the request's sampling */
        srv_run_end(s, &r, HM_ERR_ARG, &err);
        return;
    }
    hm_gen_set_max(g, j->req.max_tokens);
    hm_status st = hm_gen_prompt(g, r.ids.ids, (int)r.ids.n, &err);
    r.t0_ns = now_ns();
    while (!st && !srv_run_full(&r, hm_gen_room(g))) {
        int32_t tok;
        if ((st = hm_gen_next(g, &tok, &err)) || !srv_run_token(s, &r, tok, &st, &err)) break;
    }
    hm_gen_free(g);
    hm_error e2;
    hm_context_flush_routes(s->m.ctx, &e2); /* a GPU's routing counts of this generation */
    srv_run_end(s, &r, st, &err);
}
