/* tracer.c - expert usage tracer: counters, configuration, name logging (see tracer.h).
 *
 * DESIGN: counters are C11 atomics updated with relaxed fetch_add, so concurrent recorders
 * never lock. One record call adds a layer's whole routing result: for a batch, the ids are
 * first histogrammed into a stack array and each used expert's counter is bumped once (one
 * atomic per used expert instead of one per slot); for a single token the slots go straight to
 * the counters. Export and summary live in tracer_export.c.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe/tracer_internal.h"

/* ---- configuration ---- */

void moe_tracer_config_init(moe_tracer_config *c) { memset(c, 0, sizeof(*c)); }

static hm_status env_switch(const char *name, bool *dst, hm_error *err) {
    const char *v = getenv(name);
    if (!v || !*v) return HM_OK;
    if (!strcmp(v, "0")) *dst = false;
    else if (!strcmp(v, "1")) *dst = true;
    else return hm_error_set(err, HM_ERR_ARG, "%s must be 0 or 1, not '%s'", name, v);
    return HM_OK;
}

hm_status moe_tracer_config_from_env(moe_tracer_config *c, hm_error *err) {
    hm_status st;
    if ((st = env_switch("LLAMA_EXPERT_TRACE_STATS", &c->stats, err)) != HM_OK) return st;
    if ((st = env_switch("LLAMA_EXPERT_TRACE_NAMES", &c->names, err)) != HM_OK) return st;
    if ((st = env_switch("LLAMA_EXPERT_TRACE_PER_LAYER", &c->per_layer, err)) != HM_OK) return st;
    const char *out = getenv("LLAMA_EXPERT_TRACE_OUTPUT");
    if (out && *out) c->output = out;
    return HM_OK;
}

int moe_tracer_config_parse_arg(moe_tracer_config *c, int argc, char **argv, int i,
                                hm_error *err) {
    static const char k_out[] = "--expert-trace-output";
    const char *a = argv[i];
    if (strncmp(a, "--expert-trace-", 15) != 0) return 0;
    if (!strcmp(a, "--expert-trace-stats")) c->stats = true;
    else if (!strcmp(a, "--expert-trace-names")) c->names = true;
    else if (!strcmp(a, "--expert-trace-per-layer")) c->per_layer = true;
    else if (!strcmp(a, k_out)) {
        if (i + 1 >= argc || !argv[i + 1][0]) {
            hm_error_set(err, HM_ERR_ARG, "%s needs a FILE", k_out);
            return -1;
        }
        c->output = argv[i + 1];
        return 2;
    } else if (!strncmp(a, k_out, sizeof(k_out) - 1) && a[sizeof(k_out) - 1] == '=') {
        if (!a[sizeof(k_out)]) {
            hm_error_set(err, HM_ERR_ARG, "%s needs a FILE", k_out);
            return -1;
        }
        c->output = a + sizeof(k_out);
    } else {
        hm_error_set(err, HM_ERR_ARG,
                     "unknown flag '%s' (tracer flags: --expert-trace-stats, "
                     "--expert-trace-names, --expert-trace-per-layer, --expert-trace-output FILE)",
                     a);
        return -1;
    }
    return 1;
}

hm_status moe_tracer_config_extract(moe_tracer_config *c, int *argc, char **argv, hm_error *err) {
    int n = *argc, out = 1;
    for (int i = 1; i < n; i++) {
        int used = moe_tracer_config_parse_arg(c, n, argv, i, err);
        if (used < 0) return HM_ERR_ARG;
        if (used > 0) {
            i += used - 1;
            continue;
        }
        argv[out++] = argv[i];
    }
    if (n > 0) argv[out] = NULL;
    *argc = n > 0 ? out : n;
    return HM_OK;
}

bool moe_tracer_config_counts(const moe_tracer_config *c) {
    return c->stats || c->per_layer || c->output != NULL;
}

bool moe_tracer_config_enabled(const moe_tracer_config *c) {
    return moe_tracer_config_counts(c) || c->names;
}

const char *moe_tracer_flags_help(void) {
    return "  --expert-trace-stats       count expert activations; summary on stderr at the end\n"
           "                             (env LLAMA_EXPERT_TRACE_STATS=1)\n"
           "  --expert-trace-names       log each used expert's tensor names (slow; debugging)\n"
           "                             (env LLAMA_EXPERT_TRACE_NAMES=1)\n"
           "  --expert-trace-per-layer   per-layer tables in the summary\n"
           "                             (env LLAMA_EXPERT_TRACE_PER_LAYER=1)\n"
           "  --expert-trace-output FILE write the counts to FILE (.csv: CSV, else JSON)\n"
           "                             (env LLAMA_EXPERT_TRACE_OUTPUT=FILE)\n";
}

/* ---- lifecycle ---- */

static char *dup_str(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

hm_status moe_tracer_init(moe_tracer **out, const moe_tracer_config *c, int n_layer, int n_expert,
                          int n_used, hm_error *err) {
    *out = NULL;
    if (n_layer <= 0 || n_layer > MOE_TRACER_MAX_LAYERS || n_expert <= 0 ||
        n_expert > MOE_TRACER_MAX_EXPERTS || n_used <= 0 || n_used > n_expert)
        return hm_error_set(err, HM_ERR_ARG,
                            "tracer: bad shape (%d layers, %d experts, %d used per token)",
                            n_layer, n_expert, n_used);
    moe_tracer *t = calloc(1, sizeof(*t));
    if (!t) return hm_error_set(err, HM_ERR_NOMEM, "tracer: out of memory");
    t->n_layer = n_layer;
    t->n_expert = n_expert;
    t->n_used = n_used;
    t->counting = moe_tracer_config_counts(c);
    t->names = c->names;
    t->per_layer = c->per_layer;
    t->stats = c->stats;
    t->log = stderr;
    size_t nl = (size_t)n_layer, ne = (size_t)n_expert;
    t->hits = calloc(nl * ne, sizeof(*t->hits));
    t->calls = calloc(nl, sizeof(*t->calls));
    t->tokens = calloc(nl, sizeof(*t->tokens));
    t->time_ns = calloc(nl, sizeof(*t->time_ns));
    t->tnames = calloc(nl, sizeof(*t->tnames));
    t->output = dup_str(c->output);
    if (!t->hits || !t->calls || !t->tokens || !t->time_ns || !t->tnames ||
        (c->output && !t->output) || pthread_mutex_init(&t->log_mu, NULL) != 0) {
        t->mu_ok = false;
        moe_tracer_free(t);
        return hm_error_set(err, HM_ERR_NOMEM, "tracer: out of memory");
    }
    t->mu_ok = true;
    for (int l = 0; l < n_layer; l++) {
        static const char *const k_proj[3] = {"gate", "up", "down"};
        for (int p = 0; p < 3; p++)
            snprintf(t->tnames[l].name[p], MOE_TRACER_NAME_MAX, "blk.%d.ffn_%s_exps.weight", l,
                     k_proj[p]);
        t->tnames[l].n = 3;
    }
    moe_tracer_reset(t);
    *out = t;
    return HM_OK;
}

void moe_tracer_free(moe_tracer *t) {
    if (!t) return;
    if (t->mu_ok) pthread_mutex_destroy(&t->log_mu);
    free(t->hits);
    free(t->calls);
    free(t->tokens);
    free(t->time_ns);
    free(t->tnames);
    free(t->output);
    free(t->arch);
    free(t->name);
    free(t->file);
    free(t);
}

hm_status moe_tracer_set_tensor_names(moe_tracer *t, int layer, const char *const *names,
                                      int n_names, hm_error *err) {
    if (!t || layer < 0 || layer >= t->n_layer || n_names < 0 || n_names > MOE_TRACER_NAMES)
        return hm_error_set(err, HM_ERR_ARG, "tracer: bad layer %d or name count %d", layer,
                            n_names);
    for (int i = 0; i < n_names; i++) {
        if (!names[i] || strlen(names[i]) >= MOE_TRACER_NAME_MAX)
            return hm_error_set(err, HM_ERR_ARG, "tracer: tensor name %d of layer %d missing or "
                                "longer than %d bytes", i, layer, MOE_TRACER_NAME_MAX - 1);
    }
    for (int i = 0; i < n_names; i++) snprintf(t->tnames[layer].name[i], MOE_TRACER_NAME_MAX,
                                               "%s", names[i]);
    t->tnames[layer].n = n_names;
    return HM_OK;
}

void moe_tracer_set_log(moe_tracer *t, FILE *f) {
    if (t) t->log = f ? f : stderr;
}

hm_status moe_tracer_set_model_info(moe_tracer *t, const char *arch, const char *name,
                                    const char *file, hm_error *err) {
    if (!t) return hm_error_set(err, HM_ERR_ARG, "tracer: NULL");
    char *a = dup_str(arch), *n = dup_str(name), *f = dup_str(file);
    if ((arch && !a) || (name && !n) || (file && !f)) {
        free(a);
        free(n);
        free(f);
        return hm_error_set(err, HM_ERR_NOMEM, "tracer: out of memory");
    }
    free(t->arch);
    free(t->name);
    free(t->file);
    t->arch = a;
    t->name = n;
    t->file = f;
    return HM_OK;
}

/* ---- recording ---- */

#define RELAXED memory_order_relaxed

/* One name line per used expert of layer (cnt [n_expert] tokens each), ascending ids. */
static void log_counts(moe_tracer *t, int layer, const uint64_t *cnt) {
    pthread_mutex_lock(&t->log_mu);
    for (int e = 0; e < t->n_expert; e++) {
        if (!cnt[e]) continue;
        for (int p = 0; p < t->tnames[layer].n; p++)
            fprintf(t->log, "[EXPERT-TRACE] Layer %d, Expert %d (%llu tokens): %s[%d]\n", layer,
                    e, (unsigned long long)cnt[e], t->tnames[layer].name[p], e);
    }
    fflush(t->log);
    pthread_mutex_unlock(&t->log_mu);
}

static void log_names(moe_tracer *t, int layer, const int32_t *ids, int64_t n_tok, int n_used) {
    /* tokens per expert of this call */
    uint64_t *cnt = calloc((size_t)t->n_expert, sizeof(*cnt));
    if (!cnt) return;
    for (int64_t i = 0; i < n_tok * n_used; i++)
        if (ids[i] >= 0 && ids[i] < t->n_expert) cnt[ids[i]]++;
    log_counts(t, layer, cnt);
    free(cnt);
}

void moe_tracer_record(moe_tracer *t, int layer, const int32_t *ids, int64_t n_tok, int n_used) {
    if (!t || n_tok <= 0 || n_used <= 0) return;
    if (layer < 0 || layer >= t->n_layer || !ids) {
        atomic_fetch_add_explicit(&t->rejected, (uint64_t)(n_tok * n_used), RELAXED);
        return;
    }
    if (t->counting) {
        const int E = t->n_expert;
        _Atomic uint64_t *h = t->hits + (size_t)layer * (size_t)E;
        const int64_t n = n_tok * n_used;
        uint64_t bad = 0;
        atomic_fetch_add_explicit(&t->calls[layer], 1, RELAXED);
        atomic_fetch_add_explicit(&t->tokens[layer], (uint64_t)n_tok, RELAXED);
        if (n <= 32 || E > MOE_TRACER_HIST_MAX || n > (int64_t)UINT32_MAX) { /* few slots: straight to the counters */
            for (int64_t i = 0; i < n; i++) {
                int32_t e = ids[i];
                if (e >= 0 && e < E) atomic_fetch_add_explicit(&h[e], 1, RELAXED);
                else if (e >= E) bad++;
            }
        } else { /* a batch: histogram first, one atomic per used expert */
            uint32_t hist[MOE_TRACER_HIST_MAX];
            memset(hist, 0, sizeof(uint32_t) * (size_t)E);
            for (int64_t i = 0; i < n; i++) {
                int32_t e = ids[i];
                if (e >= 0 && e < E) hist[e]++;
                else if (e >= E) bad++;
            }
            for (int e = 0; e < E; e++)
                if (hist[e]) atomic_fetch_add_explicit(&h[e], hist[e], RELAXED);
        }
        if (bad) atomic_fetch_add_explicit(&t->rejected, bad, RELAXED);
    }
    if (t->names) log_names(t, layer, ids, n_tok, n_used);
}

void moe_tracer_add_counts(moe_tracer *t, int layer, uint64_t calls, uint64_t tokens,
                           const uint64_t *hits) {
    if (!t || !hits) return;
    if (layer < 0 || layer >= t->n_layer) {
        uint64_t all = 0;
        for (int e = 0; e < t->n_expert; e++) all += hits[e];
        atomic_fetch_add_explicit(&t->rejected, all, RELAXED);
        return;
    }
    if (t->counting) {
        _Atomic uint64_t *h = t->hits + (size_t)layer * (size_t)t->n_expert;
        atomic_fetch_add_explicit(&t->calls[layer], calls, RELAXED);
        atomic_fetch_add_explicit(&t->tokens[layer], tokens, RELAXED);
        for (int e = 0; e < t->n_expert; e++)
            if (hits[e]) atomic_fetch_add_explicit(&h[e], hits[e], RELAXED);
    }
    if (t->names) log_counts(t, layer, hits);
}

void moe_tracer_add_time_ns(moe_tracer *t, int layer, uint64_t ns) {
    if (!t) return;
    if (layer >= 0 && layer < t->n_layer) atomic_fetch_add_explicit(&t->time_ns[layer], ns, RELAXED);
}

void moe_tracer_add_prompt(moe_tracer *t) {
    if (t) atomic_fetch_add_explicit(&t->prompts, 1, RELAXED);
}

void moe_tracer_reset(moe_tracer *t) {
    if (!t) return;
    size_t nl = (size_t)t->n_layer, ne = (size_t)t->n_expert;
    for (size_t i = 0; i < nl * ne; i++) atomic_store_explicit(&t->hits[i], 0, RELAXED);
    for (size_t l = 0; l < nl; l++) {
        atomic_store_explicit(&t->calls[l], 0, RELAXED);
        atomic_store_explicit(&t->tokens[l], 0, RELAXED);
        atomic_store_explicit(&t->time_ns[l], 0, RELAXED);
    }
    atomic_store_explicit(&t->rejected, 0, RELAXED);
    atomic_store_explicit(&t->prompts, 0, RELAXED);
}

/* ---- readers ---- */

int moe_tracer_n_layer(const moe_tracer *t) { return t ? t->n_layer : 0; }
int moe_tracer_n_expert(const moe_tracer *t) { return t ? t->n_expert : 0; }

/* atomic_load on a const object is not allowed before C17; the cast is harmless (no store). */
#define LOAD(p) atomic_load_explicit((_Atomic uint64_t *)(p), memory_order_acquire)

uint64_t moe_tracer_hits(const moe_tracer *t, int layer, int expert) {
    if (!t || layer < 0 || layer >= t->n_layer || expert < 0 || expert >= t->n_expert) return 0;
    return LOAD(&t->hits[(size_t)layer * (size_t)t->n_expert + (size_t)expert]);
}

uint64_t moe_tracer_expert_total(const moe_tracer *t, int expert) {
    uint64_t s = 0;
    for (int l = 0; t && l < t->n_layer; l++) s += moe_tracer_hits(t, l, expert);
    return s;
}

uint64_t moe_tracer_calls(const moe_tracer *t, int layer) {
    return t && layer >= 0 && layer < t->n_layer ? LOAD(&t->calls[layer]) : 0;
}

uint64_t moe_tracer_tokens(const moe_tracer *t, int layer) {
    return t && layer >= 0 && layer < t->n_layer ? LOAD(&t->tokens[layer]) : 0;
}

uint64_t moe_tracer_time_ns(const moe_tracer *t, int layer) {
    return t && layer >= 0 && layer < t->n_layer ? LOAD(&t->time_ns[layer]) : 0;
}

uint64_t moe_tracer_total_tokens(const moe_tracer *t) {
    uint64_t m = 0;
    for (int l = 0; t && l < t->n_layer; l++) {
        uint64_t v = moe_tracer_tokens(t, l);
        if (v > m) m = v;
    }
    return m;
}

uint64_t moe_tracer_rejected(const moe_tracer *t) { return t ? LOAD(&t->rejected) : 0; }

uint64_t moe_tracer_prompts(const moe_tracer *t) { return t ? LOAD(&t->prompts) : 0; }

/* ---- tensor names ---- */

static bool parse_uint(const char **p, int *out) {
    const char *s = *p;
    long v = 0;
    if (*s < '0' || *s > '9') return false;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (*s++ - '0');
        if (v > 1000000000L) return false;
    }
    *out = (int)v;
    *p = s;
    return true;
}

bool moe_tracer_parse_tensor_name(const char *name, int *layer, int *expert, const char **proj) {
    static const char *const k_proj[] = {"gate_up", "gate", "up", "down"};
    const char *s = name;
    int l, e = -1;
    if (!s || strncmp(s, "blk.", 4) != 0) return false;
    s += 4;
    if (!parse_uint(&s, &l) || strncmp(s, ".ffn_", 5) != 0) return false;
    s += 5;
    const char *pr = NULL;
    for (size_t i = 0; i < sizeof(k_proj) / sizeof(k_proj[0]); i++) {
        size_t n = strlen(k_proj[i]);
        if (!strncmp(s, k_proj[i], n) && !strncmp(s + n, "_exps.", 6)) {
            pr = k_proj[i];
            s += n + 6;
            break;
        }
    }
    if (!pr) return false;
    if (*s >= '0' && *s <= '9') {
        if (!parse_uint(&s, &e) || *s++ != '.') return false;
    }
    if (strcmp(s, "weight") != 0) return false;
    if (layer) *layer = l;
    if (expert) *expert = e;
    if (proj) *proj = pr;
    return true;
}
