/* server_slots.c - the inference thread with several sequences (-np N > 1): continuous batching
 * of the requests in flight (runtime/slots.h).
 *
 * DESIGN: one loop: take queued requests into free slots (each into the slot whose cache holds
 * the longest start of its prompt: a chat that goes on reads only its new turn; a look at or a
 * change of the MoE state waits at the head of the queue until no slot is busy), end the slots
 * whose request is
 * done before another token (its budget, a full sequence, the client gone), run one batched step
 * for the rest, and hand each slot's token to its request (srv_run_token: the same stop rules
 * and streaming as one request alone). A request gives the bytes it gives alone: each slot has
 * its own sequence and sampler, and the engine's rows do not depend on the batch. When stopping,
 * the slots still running are cancelled.
 */
#include <stdlib.h>

#include "base/log.h"
#include "runtime/slots.h"
#include "server/server_internal.h"

typedef struct {
    hm_server *s;
    hm_slots *sl;
    srv_run *run; /* [n] */
    bool *used;   /* [n] */
    int n;
} slots_state;

static void set_busy(hm_server *s, int delta) {
    pthread_mutex_lock(&s->mu);
    s->slots_busy += delta;
    s->busy = s->slots_busy > 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Answers slot k's request and frees the slot. */
static void end_slot(slots_state *x, int k, hm_status st, const hm_error *err) {
    srv_job *j = x->run[k].j;
    srv_run_end(x->s, &x->run[k], st, err);
    hm_slots_stop(x->sl, k);
    srv_job_unref(j);
    srv_after_request(x->s);
    x->used[k] = false;
    set_busy(x->s, -1);
}

/* A queued generation into the free slot whose cache holds the longest start of its prompt
 * (answered at once instead when cancelled or its prompt is bad). */
static void start_slot(slots_state *x, srv_job *j) {
    srv_run r;
    if (!srv_run_begin(x->s, j, &r)) {
        srv_job_unref(j);
        return;
    }
    const int k = hm_slots_pick(x->sl, r.ids.ids, (int)r.ids.n); /* a slot is free: checked */
    if (!j->req.cache_prompt) hm_slots_forget(x->sl, k);
    x->run[k] = r;
    x->used[k] = true;
    set_busy(x->s, 1);
    hm_error err = {0};
    srv_run *q = &x->run[k];
    if (hm_slots_start(x->sl, k, q->ids.ids, (int)q->ids.n, &q->sp, &err) != HM_OK) {
        q->err_status = 400;
        end_slot(x, k, HM_ERR_ARG, &err);
        return;
    }
    atomic_fetch_add(&x->s->st_cached_tokens, (unsigned long long)hm_slots_cached(x->sl, k));
}

/* Takes what the queue holds for the free slots; false when stopping with nothing left. */
static bool take_jobs(slots_state *x) {
    hm_server *s = x->s;
    bool any_free = false;
    for (int k = 0; k < x->n; k++) any_free = any_free || !x->used[k];
    pthread_mutex_lock(&s->mu);
    while (s->slots_busy == 0 && s->n_queued == 0 && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    if (s->slots_busy == 0 && s->n_queued == 0) { /* stop, nothing left */
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    while (any_free) {
        srv_job *j = srv_queue_take(s);
        if (!j) break;
        pthread_mutex_unlock(&s->mu);
        if (j->kind != SRV_GENERATE) {
            srv_moe_run(s, j);
            srv_job_unref(j);
        } else {
            start_slot(x, j);
        }
        any_free = false;
        for (int k = 0; k < x->n; k++) any_free = any_free || !x->used[k];
        pthread_mutex_lock(&s->mu);
    }
    const bool stopping = s->stop;
    pthread_mutex_unlock(&s->mu);
    for (int k = 0; stopping && k < x->n; k++)
        if (x->used[k]) {
            pthread_mutex_lock(&x->run[k].j->mu);
            x->run[k].j->cancelled = true;
            pthread_mutex_unlock(&x->run[k].j->mu);
        }
    return true;
}

/* One step: slots that are done end, the others get a token each. */
static void step(slots_state *x, int32_t *out) {
    hm_error err = {0};
    int active = 0;
    for (int k = 0; k < x->n; k++) {
        if (!x->used[k]) continue;
        srv_run *r = &x->run[k];
        pthread_mutex_lock(&r->j->mu);
        r->alive = r->alive && !r->j->cancelled;
        pthread_mutex_unlock(&r->j->mu);
        if (!r->alive || srv_run_full(r, hm_slots_room(x->sl, k))) end_slot(x, k, HM_OK, NULL);
        else active++;
    }
    if (active == 0) return;
    hm_status st = hm_slots_step(x->sl, out, &err);
    if (st == HM_OK) {
        atomic_fetch_add(&x->s->st_batch_steps, 1);
        atomic_fetch_add(&x->s->st_batch_tokens, (unsigned long long)hm_slots_last_batch(x->sl));
    }
    for (int k = 0; k < x->n; k++) {
        if (!x->used[k]) continue;
        if (st != HM_OK) {
            end_slot(x, k, st, &err);
            continue;
        }
        hm_status ts = HM_OK;
        if (out[k] >= 0 && !srv_run_token(x->s, &x->run[k], out[k], &ts, &err))
            end_slot(x, k, ts, &err);
    }
}

bool srv_slots_loop(hm_server *s) {
    slots_state x = {.s = s};
    hm_error err = {0};
    if (hm_slots_init(s->m.ctx, &x.sl, &err) != HM_OK) {
        HM_LOGE("serve: the slots cannot start (%s); one request at a time", err.msg);
        return false;
    }
    x.n = hm_slots_count(x.sl);
    x.run = calloc((size_t)x.n, sizeof(*x.run));
    x.used = calloc((size_t)x.n, sizeof(*x.used));
    int32_t *out = calloc((size_t)x.n, sizeof(int32_t));
    const bool ok = x.run && x.used && out;
    if (!ok) HM_LOGE("serve: out of memory (slots); one request at a time");
    while (ok && take_jobs(&x)) step(&x, out);
    free(out);
    free(x.used);
    free(x.run);
    hm_slots_free(x.sl);
    return ok;
}
