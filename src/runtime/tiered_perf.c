/* tiered_perf.c - the live per-layer counters of the layers the CPU side serves (seed 001's MoE
 * layer perf, --moe-layer-perf full): calls, tokens, every expert's selections split into hot
 * (the GPU ran it from its cache slot) and cold (the CPU computed or fetched it), the lanes'
 * times, the copies of the fetched path and of post-fetch; written in the learn schema
 * (docs/LEARN.md) so that a perf file feeds the next plan (hotmoe plan, --moe-hot-cache).
 *
 * DESIGN: only the worker writes the counters (before answering a request: its ids stay put
 * until then; the time after computing), so they are plain integers; hm_tiered_perf_json reads
 * them with the worker parked. Off costs one pointer test per request.
 * The lanes' times come from the GPU's clock in the layer's flags (cuda/cuda_handoff.h; the
 * waits write theirs only while ctl.stamps is set, i.e. while the counters are on): the
 * request posted (t0), the wait begun, the hot lane's kernels being done (t1), the answer seen
 * (t2). Step s's arrive after its answer, so they are taken at the layer's next request, and the
 * last step's when the counters are read: hot lane t1 - t0, join wait t2 - t1, wall t2 - t0; the
 * cold lane is the CPU's time on the request (its own clock). A layer shows the GPU's times only
 * when every call it counted has them (a reset or a fault can lose some: then they are left
 * out, "not measured").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "moe/learn_file.h"
#include "runtime/tiered_internal.h"

#define STAMP_MAX_NS 600000000000ull /* a request's times span at most this (else not taken) */

typedef struct {
    uint64_t experts, bytes, wait_ns, fallbacks;
} perf_copies; /* one path's copies: the fetched path's (prompts) or post-fetch's (decode) */

typedef struct {
    uint64_t calls, tokens, cpu_ns;
    uint32_t seen_seq;    /* the step of the last request counted (0: none) */
    uint32_t stamped_seq; /* the last step whose GPU times were taken */
    uint64_t stamped, hot_ns, wait_ns, wall_ns; /* calls with GPU times, their sums */
    uint64_t fallback_calls;                    /* requests with a copy fallen back */
    perf_copies fetch, pf;
} perf_layer;

struct tiered_perf {
    perf_layer *ly;          /* [n_layer] */
    uint64_t *hits, *cold;   /* [n_layer][n_expert] */
};

static void perf_free(tiered_perf *p) {
    if (!p) return;
    free(p->ly);
    free(p->hits);
    free(p->cold);
    free(p);
}

void tiered_perf_free(hm_tiered *t) {
    if (t->perf) __atomic_store_n(&t->v.ctl->stamps, 0u, __ATOMIC_RELEASE);
    perf_free(t->perf);
    t->perf = NULL;
}

hm_status hm_tiered_perf_enable(hm_tiered *t, hm_error *err) {
    if (!t) return hm_error_set(err, HM_ERR_ARG, "layer perf: no CPU side");
    if (t->perf) return HM_OK;
    const size_t NL = (size_t)t->v.n_layer, n = NL * (size_t)t->v.n_expert;
    tiered_perf *p = calloc(1, sizeof(*p));
    if (p) {
        p->ly = calloc(NL, sizeof(*p->ly));
        p->hits = calloc(n, sizeof(*p->hits));
        p->cold = calloc(n, sizeof(*p->cold));
    }
    if (!p || !p->ly || !p->hits || !p->cold) {
        perf_free(p);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (layer perf)");
    }
    tiered_pause(t);
    t->perf = p;
    __atomic_store_n(&t->v.ctl->stamps, 1u, __ATOMIC_RELEASE); /* the GPU's waits time themselves */
    tiered_resume(t);
    return HM_OK;
}

/* The GPU's times of layer L's last counted request, if they have arrived and are sane. */
static void take_stamps(hm_tiered *t, int L) {
    perf_layer *y = &t->perf->ly[L];
    const cuda_handoff_flags *f = &t->v.flags[L];
    const uint32_t ss = __atomic_load_n(&f->stamp_seq, __ATOMIC_ACQUIRE);
    if (ss == 0 || ss != y->seen_seq || ss == y->stamped_seq) return;
    const uint64_t t0 = __atomic_load_n(&f->t_post[ss & 1], __ATOMIC_RELAXED);
    const uint64_t t1 = __atomic_load_n(&f->t_wait, __ATOMIC_RELAXED);
    const uint64_t t2 = __atomic_load_n(&f->t_seen, __ATOMIC_RELAXED);
    y->stamped_seq = ss;
    if (t0 == 0 || t1 < t0 || t2 < t1 || t2 - t0 > STAMP_MAX_NS) return;
    y->stamped++;
    y->hot_ns += t1 - t0;
    y->wait_ns += t2 - t1;
    y->wall_ns += t2 - t0;
}

void tiered_perf_observe(hm_tiered *t, int L, const cuda_handoff_msg *m) {
    tiered_perf *p = t->perf;
    if (!p) return;
    take_stamps(t, L); /* the previous request's, before this one's are on their way */
    const int NE = (int)t->v.n_expert, n = (int)m->n_tok * t->v.n_used;
    const size_t row = (size_t)L * (size_t)NE;
    perf_layer *y = &p->ly[L];
    y->calls++;
    y->tokens += m->n_tok;
    y->seen_seq = m->seq;
    for (int i = 0; i < n; i++) {
        const int32_t id = t->v.ids[i], e = cuda_handoff_expert(id);
        if (e < 0 || e >= NE) continue;
        p->hits[row + (size_t)e]++;
        if (id >= 0) p->cold[row + (size_t)e]++;
    }
}

void tiered_perf_time(hm_tiered *t, int L, int64_t ns) {
    if (t->perf && ns > 0) t->perf->ly[L].cpu_ns += (uint64_t)ns;
}

void tiered_perf_copies(hm_tiered *t, int L, const tiered_perf_copy *c) {
    if (!t->perf) return;
    perf_layer *y = &t->perf->ly[L];
    perf_copies *k = c->postfetch ? &y->pf : &y->fetch;
    k->experts += c->experts;
    k->bytes += c->bytes;
    k->wait_ns += c->wait_ns > 0 ? (uint64_t)c->wait_ns : 0;
    k->fallbacks += c->fallbacks;
    y->fallback_calls += c->fallbacks > 0;
}

static void put_array(hm_json *j, const char *key, const uint64_t *v, int n, const uint64_t *sub) {
    hm_json_key(j, key);
    hm_json_arr_begin(j);
    for (int e = 0; e < n; e++) hm_json_uint(j, sub ? v[e] - sub[e] : v[e]);
    hm_json_arr_end(j);
}

hm_status hm_tiered_perf_disable(hm_tiered *t) {
    if (!t) return HM_OK;
    tiered_pause(t);
    tiered_perf_free(t);
    tiered_resume(t);
    return HM_OK;
}

static double us(uint64_t ns) { return (double)ns / 1000.0; }

/* A path's copies as prefix_experts, _bytes, _wait_time_us, _fallbacks (docs/LEARN.md). */
static void put_copies(hm_json *j, const char *prefix, const perf_copies *k) {
    char key[48];
    snprintf(key, sizeof(key), "%s_experts", prefix);
    hm_json_kuint(j, key, k->experts);
    snprintf(key, sizeof(key), "%s_bytes", prefix);
    hm_json_kuint(j, key, k->bytes);
    snprintf(key, sizeof(key), "%s_wait_time_us", prefix);
    hm_json_kdouble(j, key, us(k->wait_ns));
    snprintf(key, sizeof(key), "%s_fallbacks", prefix);
    hm_json_kuint(j, key, k->fallbacks);
}

/* One layer's object; h, c: its hits and cold hits [n_expert]. */
static void put_layer(hm_json *j, int il, const perf_layer *y, const uint64_t *h,
                      const uint64_t *c, int NE) {
    uint64_t sum = 0, cold = 0;
    for (int e = 0; e < NE; e++) sum += h[e], cold += c[e];
    const bool gpu_times = y->calls > 0 && y->stamped == y->calls;
    hm_json_obj_begin(j);
    hm_json_kint(j, "layer", il);
    hm_json_kuint(j, "calls", y->calls);
    hm_json_kuint(j, "tokens", y->tokens);
    hm_json_kuint(j, "expert_hits_total", sum);
    if (y->calls) hm_json_kdouble(j, "moe_time_us", us(gpu_times ? y->wall_ns : y->cpu_ns));
    put_array(j, "experts", h, NE, NULL);
    if (y->calls) {
        put_array(j, "hot_experts", h, NE, c);
        put_array(j, "cold_experts", c, NE, NULL);
        hm_json_kuint(j, "hot_slots_total", sum - cold);
        hm_json_kuint(j, "cold_slots_total", cold);
        hm_json_kuint(j, "parallel_launches", y->calls);
        hm_json_kuint(j, "parallel_fallbacks", y->fallback_calls);
        hm_json_kdouble(j, "parallel_cold_lane_time_us", us(y->cpu_ns));
        if (gpu_times) {
            hm_json_kdouble(j, "parallel_wall_time_us", us(y->wall_ns));
            hm_json_kdouble(j, "parallel_hot_lane_time_us", us(y->hot_ns));
            hm_json_kdouble(j, "parallel_join_wait_time_us", us(y->wait_ns));
        }
        put_copies(j, "fetch", &y->fetch);
        put_copies(j, "postfetch", &y->pf);
    }
    hm_json_obj_end(j);
}

hm_status hm_tiered_perf_json(hm_tiered *t, hm_json *j, const char *arch, const char *name,
                              hm_error *err) {
    tiered_perf *p = t ? t->perf : NULL;
    if (!p) return hm_error_set(err, HM_ERR_STATE, "layer perf: not enabled (--moe-layer-perf full)");
    const int NL = t->v.n_layer, NE = (int)t->v.n_expert;
    uint64_t *tot = calloc((size_t)NE, sizeof(*tot)), max_tok = 0;
    if (!tot) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (layer perf)");
    tiered_pause(t); /* between steps: the last requests' GPU times are in */
    for (int il = 0; il < NL; il++) {
        if (p->ly[il].calls) take_stamps(t, il);
        for (int e = 0; e < NE; e++) tot[e] += p->hits[(size_t)il * (size_t)NE + (size_t)e];
        if (p->ly[il].tokens > max_tok) max_tok = p->ly[il].tokens;
    }
    hm_json_obj_begin(j);
    hm_json_kstr(j, "format", MOE_LEARN_FORMAT);
    hm_json_kint(j, "version", MOE_LEARN_VERSION);
    if (arch || name) {
        hm_json_key(j, "model");
        hm_json_obj_begin(j);
        if (arch) hm_json_kstr(j, "arch", arch);
        if (name) hm_json_kstr(j, "name", name);
        hm_json_obj_end(j);
    }
    hm_json_kint(j, "n_layer", NL);
    hm_json_kint(j, "n_expert", NE);
    hm_json_kint(j, "n_expert_used", t->v.n_used);
    hm_json_kuint(j, "prompts", 0);
    hm_json_kuint(j, "total_tokens", max_tok);
    hm_json_kuint(j, "rejected", 0);
    put_array(j, "experts", tot, NE, NULL);
    hm_json_key(j, "layers");
    hm_json_arr_begin(j);
    for (int il = 0; il < NL; il++)
        put_layer(j, il, &p->ly[il], p->hits + (size_t)il * (size_t)NE,
                  p->cold + (size_t)il * (size_t)NE, NE);
    hm_json_arr_end(j);
    hm_json_obj_end(j);
    tiered_resume(t);
    free(tot);
    return HM_OK;
}

hm_status hm_tiered_perf_summary(hm_tiered *t, hm_tiered_perf_sum *s, hm_error *err) {
    memset(s, 0, sizeof(*s));
    tiered_perf *p = t ? t->perf : NULL;
    if (!p)
        return hm_error_set(err, HM_ERR_STATE, "layer perf: not enabled (--moe-layer-perf full)");
    tiered_pause(t);
    for (int il = 0; il < t->v.n_layer; il++) {
        perf_layer *y = &p->ly[il];
        if (!y->calls) continue;
        take_stamps(t, il);
        s->layers++;
        s->calls += y->calls;
        s->timed += y->stamped;
        s->wall_us += us(y->wall_ns);
        s->hot_us += us(y->hot_ns);
        s->wait_us += us(y->wait_ns);
        s->cold_us += us(y->cpu_ns);
        s->fetch_experts += y->fetch.experts;
        s->fetch_bytes += y->fetch.bytes;
        s->fetch_wait_us += us(y->fetch.wait_ns);
        s->pf_experts += y->pf.experts;
        s->fallbacks += y->fetch.fallbacks + y->pf.fallbacks;
    }
    tiered_resume(t);
    return HM_OK;
}

hm_status hm_tiered_perf_write(hm_tiered *t, const char *path, const char *arch,
                               const char *name, hm_error *err) {
    if (!t || !t->perf)
        return hm_error_set(err, HM_ERR_STATE, "layer perf: not enabled (--moe-layer-perf full)");
    FILE *f = fopen(path, "w");
    if (!f) return hm_error_set(err, HM_ERR_IO, "layer perf: cannot write '%s'", path);
    hm_json j;
    hm_json_init_file(&j, f, true);
    hm_status st = hm_tiered_perf_json(t, &j, arch, name, err);
    if (st == HM_OK) st = hm_json_finish(&j, err);
    hm_json_free(&j);
    if (fclose(f) != 0 && st == HM_OK)
        st = hm_error_set(err, HM_ERR_IO, "layer perf: writing '%s' failed", path);
    return st;
}

hm_layer_perf hm_tiered_perf_mode(const hm_tiered *t) {
    return !t ? HM_LAYER_PERF_OFF : t->perf ? HM_LAYER_PERF_FULL
                                  : t->hot ? HM_LAYER_PERF_UPDATE : HM_LAYER_PERF_OFF;
}
