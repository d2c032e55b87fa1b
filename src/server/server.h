/* server.h - `hotmoe serve`: an OpenAI-compatible HTTP server over one context (libmicrohttpd;
 * JSON by jansson through server/oai.h).
 *
 * DESIGN: HTTP threads (one per connection) only parse, queue and stream; one inference thread
 * owns the context and serves the queued requests in arrival order: one at a time, or, when
 * the context has several sequences (serve -np N), up to N at once in slots decoded together
 * (continuous batching, server_slots.c). It renders the prompt (the chat template for chat),
 * decodes from an empty cache (a slot: from what its cache already holds of the prompt),
 * samples with the request's parameters and seed, and hands each piece of
 * text to the request, whose connection streams it as SSE `data:` chunks or sends the whole
 * response at the end. A client that disconnects marks its request cancelled: the inference
 * thread stops at the next token. A full queue answers 503. Routes: GET /health, GET /v1/models,
 * POST /v1/completions, POST /v1/chat/completions; unknown paths 404, a wrong method 405, a
 * body over body_max 413, malformed JSON or fields 400, a missing or wrong API key 401 — errors
 * in OpenAI's JSON shape. hm_server_stop stops accepting, lets the queued requests finish
 * within drain_ms, then cancels the rest and closes.
 */
#ifndef HM_SERVER_SERVER_H
#define HM_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "runtime/context.h"
#include "sample/sample.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *host;     /* address to bind ("127.0.0.1") */
    int port;             /* 0: any free port (hm_server_port says which) */
    const char *api_key;  /* NULL: none required */
    int queue_max;        /* requests waiting at most (>= 1) */
    size_t body_max;      /* bytes of a request body at most */
} hm_server_params;

/* What the inference thread runs (borrowed; must outlive the server). */
typedef struct {
    hm_context *ctx;
    const tok_vocab *vocab;
    const chat_template *tmpl; /* NULL: /v1/chat/completions answers 400 */
    const char *model_name;    /* the id /v1/models lists */
    sample_params defaults;    /* a request's sampling where it gives none */
    bool seed_random;          /* a request without a seed draws one (else defaults.seed) */
} hm_server_model;

typedef struct hm_server hm_server;

hm_server_params hm_server_default_params(void);
/* Binds, starts the inference thread and the HTTP threads. HM_ERR_IO when the address cannot
 * be bound; HM_ERR_UNSUPPORTED in a build without libmicrohttpd. */
hm_status hm_server_start(const hm_server_params *p, const hm_server_model *m, hm_server **out,
                          hm_error *err);
int hm_server_port(const hm_server *s);
/* Stops accepting, waits up to drain_ms for the requests in flight, cancels the rest, joins
 * every thread, frees. NULL is allowed. */
void hm_server_stop(hm_server *s, int drain_ms);

typedef struct {
    uint64_t requests, completed, errors, cancelled, rejected; /* rejected: queue full */
    uint64_t prompt_tokens, completion_tokens;
} hm_server_stats;
void hm_server_get_stats(const hm_server *s, hm_server_stats *out);

#endif
