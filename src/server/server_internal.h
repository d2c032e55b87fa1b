/* server_internal.h - the server's object and its requests, shared by server.c (HTTP, the
 * queue) and server_gen.c (the inference thread's work on one request). server/ only. */
#ifndef HM_SERVER_SERVER_INTERNAL_H
#define HM_SERVER_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "moe/learn_file.h"
#include "server/oai.h"
#include "server/server.h"

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
    atomic_ullong next_id;
    atomic_ullong st_requests, st_completed, st_errors, st_cancelled, st_rejected;
    atomic_ullong st_prompt_tokens, st_completion_tokens;
    atomic_ullong st_decode_ns, st_decode_tokens; /* generations' decode time and tokens */
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
