/* server.c - the HTTP side of `hotmoe serve` (server.h): routes, the request queue, streaming.
 * The inference thread's work on one request is in server_gen.c. */
#include "server/server_internal.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "runtime/tiered.h"

hm_server_params hm_server_default_params(void) {
    return (hm_server_params){.host = "127.0.0.1", .port = 8080, .api_key = NULL,
                              .queue_max = 64, .body_max = 1u << 20};
}

/* ---- jobs ---- */

static srv_job *job_new(hm_server *s) {
    srv_job *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2; /* the connection and the inference thread */
    j->created = (int64_t)time(NULL);
    snprintf(j->id, sizeof(j->id), "%s-%llu", "cmpl",
             (unsigned long long)atomic_fetch_add(&s->next_id, 1) + 1);
    return j;
}

void srv_job_unref(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    const int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    oai_request_free(&j->req);
    moe_learn_free(&j->learn);
    free(j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* A job the inference thread never got (refused before the queue): the connection's alone. */
static void job_drop(srv_job *j) {
    j->refs = 1;
    srv_job_unref(j);
}

bool srv_job_put(srv_job *j, const char *text, size_t n, bool done, int status) {
    pthread_mutex_lock(&j->mu);
    bool ok = true;
    if (n > 0) {
        if (j->len + n > j->cap) {
            size_t cap = (j->len + n) * 2 + 256;
            char *o = realloc(j->out, cap);
            if (o) j->out = o, j->cap = cap;
            else ok = false;
        }
        if (ok) {
            memcpy(j->out + j->len, text, n);
            j->len += n;
        }
    }
    if (done) {
        j->done = true;
        j->status = status;
    }
    const bool cancelled = j->cancelled;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return ok && !cancelled;
}

/* ---- the queue ---- */

static bool enqueue(hm_server *s, srv_job *j) {
    pthread_mutex_lock(&s->mu);
    const bool ok = !s->draining && s->n_queued < s->p.queue_max;
    if (ok) {
        s->queue[(s->q_head + s->n_queued) % s->p.queue_max] = j;
        s->n_queued++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Whether a manual apply of the hot cache waits in the queue (the automatic update then waits). */
static bool apply_queued(hm_server *s) {
    pthread_mutex_lock(&s->mu);
    bool any = false;
    for (int i = 0; i < s->n_queued && !any; i++)
        any = s->queue[(s->q_head + i) % s->p.queue_max]->kind == SRV_CACHE_APPLY;
    pthread_mutex_unlock(&s->mu);
    return any;
}

void srv_after_request(hm_server *s) {
    if (!apply_queued(s)) /* seed 001: an update per request, unless a manual apply waits */
        hm_tiered_hot_update_now(hm_context_tiered(s->m.ctx));
}

srv_job *srv_queue_take(hm_server *s) {
    if (s->n_queued == 0) return NULL;
    srv_job *j = s->queue[s->q_head];
    if (j->kind != SRV_GENERATE && s->slots_busy > 0) return NULL;
    s->q_head = (s->q_head + 1) % s->p.queue_max;
    s->n_queued--;
    if (s->stop) { /* what is left when stopping: cancelled */
        pthread_mutex_lock(&j->mu);
        j->cancelled = true;
        pthread_mutex_unlock(&j->mu);
    }
    return j;
}

static void *worker_main(void *arg) {
    hm_server *s = arg;
    if (hm_context_n_seq(s->m.ctx) > 1 && srv_slots_loop(s)) return NULL;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->n_queued == 0 && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (s->n_queued == 0) { /* stop, nothing left */
            pthread_mutex_unlock(&s->mu);
            break;
        }
        srv_job *j = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->p.queue_max;
        s->n_queued--;
        s->busy = true;
        const bool stopping = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stopping) {
            pthread_mutex_lock(&j->mu);
            j->cancelled = true;
            pthread_mutex_unlock(&j->mu);
        }
        if (j->kind == SRV_GENERATE) srv_gen_run(s, j);
        else srv_moe_run(s, j);
        if (j->kind == SRV_GENERATE) srv_after_request(s);
        srv_job_unref(j);
        pthread_mutex_lock(&s->mu);
        s->busy = false;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---- HTTP ---- */

typedef struct {
    char *body;
    size_t len, cap;
    bool too_big;
} srv_conn;

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned code, char *text,
                                 const char *type) {
    if (!text) {
        static char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                            "\"code\":500}}";
        struct MHD_Response *r = MHD_create_response_from_buffer(strlen(oom), oom,
                                                                 MHD_RESPMEM_PERSISTENT);
        enum MHD_Result q = MHD_queue_response(c, 500, r);
        MHD_destroy_response(r);
        return q;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text,
                                                             MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result q = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return q;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *type,
                                  const char *msg) {
    return send_text(c, code, oai_error(msg, type, (int)code), "application/json");
}

/* SSE: blocks until the inference thread has more, or ends. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_job *j = cls;
    pthread_mutex_lock(&j->mu);
    while (j->sent == j->len && !j->done) pthread_cond_wait(&j->cv, &j->mu);
    ssize_t n;
    if (j->sent < j->len) {
        const size_t k = j->len - j->sent < max ? j->len - j->sent : max;
        memcpy(buf, j->out + j->sent, k);
        j->sent += k;
        n = (ssize_t)k;
    } else {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

/* The stream's response is gone (done, or the client left): the request is cancelled. */
static void stream_free(void *cls) {
    srv_job *j = cls;
    pthread_mutex_lock(&j->mu);
    if (!j->done) j->cancelled = true;
    pthread_mutex_unlock(&j->mu);
    srv_job_unref(j);
}

/* A whole response: waits for the inference thread to finish the job, sends what it wrote. */
static enum MHD_Result send_when_done(struct MHD_Connection *c, srv_job *j) {
    pthread_mutex_lock(&j->mu);
    while (!j->done) pthread_cond_wait(&j->cv, &j->mu);
    char *text = malloc(j->len + 1);
    if (text) {
        memcpy(text, j->out, j->len);
        text[j->len] = 0;
    }
    const unsigned code = (unsigned)j->status;
    pthread_mutex_unlock(&j->mu);
    srv_job_unref(j);
    return send_text(c, code, text, "application/json");
}

static enum MHD_Result post_generate(hm_server *s, struct MHD_Connection *c, srv_conn *cn,
                                     bool chat) {
    if (chat && !s->m.tmpl)
        return send_error(c, 400, "invalid_request_error",
                          "this model has no chat template; use /v1/completions");
    srv_job *j = job_new(s);
    if (!j) return send_error(c, 500, "server_error", "out of memory");
    hm_error err = {0};
    if (oai_parse(cn->body ? cn->body : "", cn->len, chat, &s->m.defaults, &j->req, &err) !=
        HM_OK) {
        job_drop(j);
        return send_error(c, 400, "invalid_request_error", err.msg);
    }
    atomic_fetch_add(&s->st_requests, 1);
    const bool stream = j->req.stream;
    if (!enqueue(s, j)) {
        job_drop(j);
        atomic_fetch_add(&s->st_rejected, 1);
        return send_error(c, 503, "server_error", "the server is busy (queue full) or stopping");
    }
    if (stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j,
                                              stream_free);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result q = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return q;
    }
    return send_when_done(c, j);
}

/* GET /metrics: Prometheus text format. */
static char *metrics_text(hm_server *s) {
    hm_server_stats st;
    hm_server_get_stats(s, &st);
    pthread_mutex_lock(&s->mu);
    const int queued = s->n_queued, busy = s->slots_busy > 0 ? s->slots_busy : s->busy ? 1 : 0;
    pthread_mutex_unlock(&s->mu);
    uint64_t vram = 0, pinned = 0;
    hm_context_memory(s->m.ctx, &vram, &pinned);
    hm_tiered_stats ts = {0};
    if (hm_context_tiered(s->m.ctx)) hm_tiered_get_stats(hm_context_tiered(s->m.ctx), &ts);
    const double dec_s = 1e-9 * (double)atomic_load(&s->st_decode_ns);
    const double tps = dec_s > 0 ? (double)atomic_load(&s->st_decode_tokens) / dec_s : 0.0;
    const size_t cap = 4096;
    char *t = malloc(cap);
    if (!t) return NULL;
    int o = snprintf(t, cap,
             "# HELP hotmoe_decode_tokens_per_second Tokens per second of the generations so far "
             "(their decode time).\n# TYPE hotmoe_decode_tokens_per_second gauge\n"
             "hotmoe_decode_tokens_per_second %.3f\n"
             "# HELP hotmoe_hot_cache_hits_total Selections of a cached expert (served from VRAM).\n"
             "# TYPE hotmoe_hot_cache_hits_total counter\nhotmoe_hot_cache_hits_total %llu\n"
             "# HELP hotmoe_hot_cache_misses_total Selections of an expert outside the cache.\n"
             "# TYPE hotmoe_hot_cache_misses_total counter\nhotmoe_hot_cache_misses_total %llu\n"
             "# HELP hotmoe_vram_bytes VRAM the placement holds (weights, KV, buffers, cache).\n"
             "# TYPE hotmoe_vram_bytes gauge\nhotmoe_vram_bytes %llu\n"
             "# HELP hotmoe_pinned_bytes Host memory registered as pinned (the experts' mapping).\n"
             "# TYPE hotmoe_pinned_bytes gauge\nhotmoe_pinned_bytes %llu\n"
             "# HELP hotmoe_slots Requests decoded at once (-np).\n"
             "# TYPE hotmoe_slots gauge\nhotmoe_slots %d\n"
             "# HELP hotmoe_batch_steps_total Batched forward steps of the slots (-np > 1).\n"
             "# TYPE hotmoe_batch_steps_total counter\nhotmoe_batch_steps_total %llu\n"
             "# HELP hotmoe_batch_tokens_total Tokens those steps computed (their mean batch: "
             "tokens / steps).\n# TYPE hotmoe_batch_tokens_total counter\n"
             "hotmoe_batch_tokens_total %llu\n"
             "# HELP hotmoe_prompt_tokens_cached_total Prompt tokens a slot's cache already "
             "held (not read again).\n# TYPE hotmoe_prompt_tokens_cached_total counter\n"
             "hotmoe_prompt_tokens_cached_total %llu\n",
             tps, (unsigned long long)ts.hot_hits, (unsigned long long)ts.hot_misses,
             (unsigned long long)vram, (unsigned long long)pinned, hm_context_n_seq(s->m.ctx),
             (unsigned long long)atomic_load(&s->st_batch_steps),
             (unsigned long long)atomic_load(&s->st_batch_tokens),
             (unsigned long long)atomic_load(&s->st_cached_tokens));
    if (o < 0 || (size_t)o >= cap) o = 0;
    snprintf(t + o, cap - (size_t)o,
             "# HELP hotmoe_requests_total Generation requests accepted.\n"
             "# TYPE hotmoe_requests_total counter\nhotmoe_requests_total %llu\n"
             "# HELP hotmoe_requests_completed_total Requests answered in full.\n"
             "# TYPE hotmoe_requests_completed_total counter\nhotmoe_requests_completed_total %llu\n"
             "# HELP hotmoe_requests_errors_total Requests that ended with an error.\n"
             "# TYPE hotmoe_requests_errors_total counter\nhotmoe_requests_errors_total %llu\n"
             "# HELP hotmoe_requests_cancelled_total Requests whose client left.\n"
             "# TYPE hotmoe_requests_cancelled_total counter\nhotmoe_requests_cancelled_total %llu\n"
             "# HELP hotmoe_requests_rejected_total Requests refused with 503 (queue full).\n"
             "# TYPE hotmoe_requests_rejected_total counter\nhotmoe_requests_rejected_total %llu\n"
             "# HELP hotmoe_prompt_tokens_total Prompt tokens processed.\n"
             "# TYPE hotmoe_prompt_tokens_total counter\nhotmoe_prompt_tokens_total %llu\n"
             "# HELP hotmoe_completion_tokens_total Tokens generated.\n"
             "# TYPE hotmoe_completion_tokens_total counter\nhotmoe_completion_tokens_total %llu\n"
             "# HELP hotmoe_queue_depth Requests waiting.\n"
             "# TYPE hotmoe_queue_depth gauge\nhotmoe_queue_depth %d\n"
             "# HELP hotmoe_slots_busy Requests being decoded.\n"
             "# TYPE hotmoe_slots_busy gauge\nhotmoe_slots_busy %d\n",
             (unsigned long long)st.requests, (unsigned long long)st.completed,
             (unsigned long long)st.errors, (unsigned long long)st.cancelled,
             (unsigned long long)st.rejected, (unsigned long long)st.prompt_tokens,
             (unsigned long long)st.completion_tokens, queued, busy);
    return t;
}

/* GET or POST /moe-layer-perf, GET /moe-hot-cache: handled by the inference thread between
 * generations (the counters and slots are its own). */
static enum MHD_Result moe_route(hm_server *s, struct MHD_Connection *c, srv_conn *cn,
                                 srv_kind kind) {
    srv_job *j = job_new(s);
    if (!j) return send_error(c, 500, "server_error", "out of memory");
    j->kind = kind;
    if (kind == SRV_CACHE_APPLY) {
        hm_error err = {0};
        if (moe_learn_parse(cn->body ? cn->body : "", cn->len, "the posted plan", &j->learn,
                            &err) != HM_OK) {
            job_drop(j);
            return send_error(c, 400, "invalid_request_error", err.msg);
        }
    }
    if (kind == SRV_PERF_SET) {
        char mode[16] = "";
        if (!cn->body || srv_parse_mode(cn->body, cn->len, mode, sizeof(mode)) != 0) {
            job_drop(j);
            return send_error(c, 400, "invalid_request_error",
                              "the body must be {\"mode\": \"full\" | \"update\" | \"off\"}");
        }
        j->perf_mode = !strcmp(mode, "full") ? HM_LAYER_PERF_FULL
                       : !strcmp(mode, "update") ? HM_LAYER_PERF_UPDATE : HM_LAYER_PERF_OFF;
    }
    if (!enqueue(s, j)) {
        job_drop(j);
        return send_error(c, 503, "server_error", "the server is busy (queue full) or stopping");
    }
    return send_when_done(c, j);
}

static bool authorised(const hm_server *s, struct MHD_Connection *c) {
    if (!s->p.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, s->p.api_key);
}

static enum MHD_Result route(hm_server *s, struct MHD_Connection *c, const char *url,
                             const char *method, srv_conn *cn) {
    const bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    const bool health = !strcmp(url, "/health"), models = !strcmp(url, "/v1/models");
    const bool metrics = !strcmp(url, "/metrics");
    const bool perf = !strcmp(url, "/moe-layer-perf"), cache = !strcmp(url, "/moe-hot-cache");
    const bool routes = !strcmp(url, "/moe-routing"), page = !strcmp(url, "/");
    const bool compl = !strcmp(url, "/v1/completions");
    const bool chat = !strcmp(url, "/v1/chat/completions");
    if (!health && !models && !metrics && !compl && !chat && !perf && !cache && !routes && !page)
        return send_error(c, 404, "invalid_request_error", "unknown route");
    if (((health || models || metrics || routes || page) && !get) ||
        ((compl || chat) && !post) || ((perf || cache) && !get && !post))
        return send_error(c, 405, "invalid_request_error", "method not allowed on this route");
    if (health) return send_text(c, 200, strdup("{\"status\":\"ok\"}"), "application/json");
    if (metrics) return send_text(c, 200, metrics_text(s), "text/plain; version=0.0.4");
    if (page) return send_text(c, 200, strdup(srv_dashboard_html), "text/html; charset=utf-8");
    if (!authorised(s, c))
        return send_error(c, 401, "invalid_request_error", "a valid API key is required "
                          "(Authorization: Bearer KEY)");
    if (models) {
        char *t = NULL;
        const size_t n = strlen(s->m.model_name) + 128;
        if ((t = malloc(n)))
            snprintf(t, n, "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\","
                     "\"created\":%lld,\"owned_by\":\"hotmoe\"}]}", s->model_id,
                     (long long)s->started);
        return send_text(c, 200, t, "application/json");
    }
    if (cn->too_big)
        return send_error(c, 413, "invalid_request_error", "the request body is too large");
    if (routes) return send_text(c, 200, srv_routes_json(s), "application/json");
    if (perf) return moe_route(s, c, cn, get ? SRV_PERF_GET : SRV_PERF_SET);
    if (cache) return moe_route(s, c, cn, get ? SRV_CACHE_GET : SRV_CACHE_APPLY);
    return post_generate(s, c, cn, chat);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    hm_server *s = cls;
    srv_conn *cn = *con_cls;
    if (!cn) { /* the headers: a state for the body */
        if (!(cn = calloc(1, sizeof(*cn)))) return MHD_NO;
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!cn->too_big && cn->len + *upload_size > s->p.body_max) {
            cn->too_big = true;
        } else if (!cn->too_big) {
            if (cn->len + *upload_size + 1 > cn->cap) {
                size_t cap = (cn->len + *upload_size) * 2 + 1;
                if (cap > s->p.body_max + 1) cap = s->p.body_max + 1;
                char *b = realloc(cn->body, cap);
                if (!b) return MHD_NO;
                cn->body = b, cn->cap = cap;
            }
            memcpy(cn->body + cn->len, upload, *upload_size);
            cn->len += *upload_size;
            cn->body[cn->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return route(s, c, url, method, cn);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    srv_conn *cn = *con_cls;
    if (cn) {
        free(cn->body);
        free(cn);
        *con_cls = NULL;
    }
}

hm_status hm_server_start(const hm_server_params *p, const hm_server_model *m, hm_server **out,
                          hm_error *err) {
    *out = NULL;
    if (!p || !m || !m->ctx || !m->vocab || !m->model_name || p->queue_max < 1 ||
        p->port < 0 || p->port > 65535)
        return hm_error_set(err, HM_ERR_ARG, "server: bad parameters");
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)p->port);
    if (inet_pton(AF_INET, p->host, &addr.sin_addr) != 1)
        return hm_error_set(err, HM_ERR_ARG, "server: --host '%s' is not an IPv4 address",
                            p->host);
    hm_server *s = calloc(1, sizeof(*s));
    if (!s || !(s->queue = calloc((size_t)p->queue_max, sizeof(*s->queue)))) {
        free(s);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (server)");
    }
    s->p = *p;
    s->m = *m;
    s->started = (int64_t)time(NULL);
    snprintf(s->model_id, sizeof(s->model_id), "%s", m->model_name);
    for (char *q = s->model_id; *q; q++)
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20) *q = '_';
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    hm_status rst = srv_routes_init(s, err);
    if (rst != HM_OK) {
        srv_routes_free(s);
        free(s->queue);
        free(s);
        return rst;
    }
    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
        srv_routes_free(s);
        free(s->queue);
        free(s);
        return hm_error_set(err, HM_ERR_STATE, "server: cannot start the inference thread");
    }
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD,
                            (uint16_t)p->port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)600, MHD_OPTION_END);
    if (!s->d) {
        hm_server_stop(s, 0);
        return hm_error_set(err, HM_ERR_IO, "server: cannot listen on %s:%d (in use, or not an "
                            "address of this machine)", p->host, p->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : p->port;
    *out = s;
    return HM_OK;
}

int hm_server_port(const hm_server *s) { return s ? s->port : 0; }

void hm_server_stop(hm_server *s, int drain_ms) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->draining = true; /* new requests: 503 */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += drain_ms / 1000;
    until.tv_nsec += (long)(drain_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    while ((s->n_queued > 0 || s->busy) &&
           pthread_cond_timedwait(&s->cv, &s->mu, &until) == 0) {
    }
    s->stop = true; /* what is left: cancelled (the inference thread ends each at once) */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->worker, NULL);
    if (s->d) MHD_stop_daemon(s->d);
    srv_routes_free(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->queue);
    free(s);
}

void hm_server_get_stats(const hm_server *s, hm_server_stats *o) {
    memset(o, 0, sizeof(*o));
    if (!s) return;
    o->requests = atomic_load(&s->st_requests);
    o->completed = atomic_load(&s->st_completed);
    o->errors = atomic_load(&s->st_errors);
    o->cancelled = atomic_load(&s->st_cancelled);
    o->rejected = atomic_load(&s->st_rejected);
    o->prompt_tokens = atomic_load(&s->st_prompt_tokens);
    o->completion_tokens = atomic_load(&s->st_completion_tokens);
}
