/* server_internal.h - the server's object and its requests, shared by server.c (HTTP, the
 * queue), server_gen.c (the inference thread's work on one request) and server_slots.c (several
 * requests at once in the context's sequences). server/ only. */
#ifndef HM_SERVER_SERVER_INTERNAL_H
#define HM_SERVER_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "moe/learn_file.h"
#include "server/oai.h"
#include "server/server.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

struct MHD_Daemon;

/* What a request asks the inference thread: a generation, or a look at (or a change of) the
 * MoE counters and the hot cache between generations. */
typedef enum { SRV_GENERATE = 0, SRV_PERF_GET, SRV_PERF_SET, SRV_CACHE_GET, SRV_CACHE_APPLY } srv_kind;

/* One request: written by the inference thread (out, done), read by its connection. */
typedef struct {
    srv_kind kind;
    hm_layer_perf perf_mode; /* SRV_PERF_SET */
    moe_learn learn;         /* SRV_CACHE_APPLY: the plan or perf file posted */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;              /* the connection and the inference thread */
    oai_request req;
    char id[48];
    int64_t created;
    char *out;             /* the response so far: SSE chunks, or the whole JSON at the end */
    size_t len, cap, sent; /* sent: bytes a stream has handed to the connection */
    bool done, cancelled;
    int status;            /* HTTP status of a whole response */
} srv_job;

struct hm_server {
    hm_server_params p;
    hm_server_model m;
    char model_id[256];
    int64_t started;
    int port;
    struct MHD_Daemon *d;
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job **queue; /* [p.queue_max] ring */
    int q_head, n_queued;
    bool busy, draining, stop;
    int slots_busy;  /* generations running in slots (-np > 1) */
    atomic_ullong next_id;
    atomic_ullong st_requests, st_completed, st_errors, st_cancelled, st_rejected;
    atomic_ullong st_prompt_tokens, st_completion_tokens;
    atomic_ullong st_decode_ns, st_decode_tokens; /* generations' decode time and tokens */
    atomic_ullong st_batch_steps, st_batch_tokens; /* the slots' batched steps and their tokens */
    atomic_ullong st_cached_tokens; /* prompt tokens the slots found in their caches */
    /* routing counts of every generation (the context's observer, server_moe.c) */
    int n_layer, n_expert;
    atomic_ullong *route_hits;           /* [n_layer][n_expert] */
    atomic_ullong *route_calls, *route_tokens; /* [n_layer] */
};

/* Appends n bytes to the job's output; with done, the end (status for a whole response).
 * false when the job was cancelled (or out of memory): the generation stops. */
bool srv_job_put(srv_job *j, const char *text, size_t n, bool done, int status);
void srv_job_unref(srv_job *j);
/* The inference thread: the whole request, always ending with done. */
void srv_gen_run(hm_server *s, srv_job *j);

/* One generation's state between its tokens (server_gen.c), whichever loop draws them. */
typedef struct {
    srv_job *j;
    char id[64];
    const char *model;    /* the server's model id */
    tok_ids ids;          /* the prompt */
    sample_params sp;     /* the request's, its seed drawn when it gives none */
    int32_t stops[8];     /* end-of-turn tokens of the template */
    int n_stops;
    size_t hold;          /* bytes a stream keeps back: the longest stop string - 1 */
    tok_stream ts;
    chat_harmony hv;
    char *text;           /* the answer so far (text_n bytes, capacity text_cap) */
    size_t text_n, text_cap, emitted;
    int n_gen;
    const char *finish;
    bool alive, cut;
    bool streamed;        /* a chunk with a choice went out (the role rides on the first) */
    int err_status;       /* the HTTP status of a failure (500 unless set) */
    int64_t t0_ns;        /* the first token's start (decode time) */
} srv_run;

/* The request's prompt and sampling; false when the job is already answered (cancelled, a bad
 * prompt: its error sent) and r holds nothing. */
bool srv_run_begin(hm_server *s, srv_job *j, srv_run *r);
/* Whether the generation stops before another token: the token budget or no room left
 * ("length"). */
bool srv_run_full(srv_run *r, int room);
/* Takes one token; false when the generation ends with it (end of turn, a stop string, the
 * client gone) or *st was set (err). */
bool srv_run_token(hm_server *s, srv_run *r, int32_t tok, hm_status *st, hm_error *err);
/* Answers the request (st != HM_OK: the error in err) and frees r's state. */
void srv_run_end(hm_server *s, srv_run *r, hm_status st, const hm_error *err);

/* After a generation: the hot cache's automatic update (seed 001), unless a manual apply waits
 * in the queue. Inference thread. */
void srv_after_request(hm_server *s);
/* With s->mu held: the queue's next job for the inference thread, or NULL (none, or a job
 * other than a generation while slots are busy: it waits at the head until they are idle).
 * Taken after stop: marked cancelled. */
srv_job *srv_queue_take(hm_server *s);

/* The inference thread's loop when the context has several sequences (-np): until stop; false
 * when it could not start (out of memory: nothing taken, the caller runs one at a time). */
bool srv_slots_loop(hm_server *s);
/* The same for SRV_PERF_* and SRV_CACHE_GET (server_moe.c). */
void srv_moe_run(hm_server *s, srv_job *j);
/* The routing observer feeding s->route_* (installed at start; HM_OK or its error). */
hm_status srv_routes_init(hm_server *s, hm_error *err);
void srv_routes_free(hm_server *s);
/* GET /moe-routing's JSON (malloc'd), read by an HTTP thread (the counters are atomic). */
char *srv_routes_json(const hm_server *s);
/* GET /: the dashboard's page (static). */
extern const char srv_dashboard_html[];
/* {"mode": "full" | "update" | "off"} -> mode; 0, or -1 for anything else. */
int srv_parse_mode(const char *body, size_t len, char *mode, size_t cap);

#endif
