/* learn_file.c - the learn-file reader (see learn_file.h and docs/LEARN.md).
 *
 * DESIGN: one pass over jansson's tree. Every check goes through hm_json_fail(), which writes
 * "ORIGIN: FIELD: problem" and returns the status, so a check is one line at its call site and
 * the first violation ends the read. Field names are built as the walk descends
 * ("layers[3].experts[7]"). Sums of counts are checked for overflow before they are compared.
 */
#include "moe/learn_file.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_read.h"
#include "moe/tracer_internal.h" /* MOE_TRACER_MAX_LAYERS, MOE_TRACER_MAX_EXPERTS */

/* obj[key], optional: a finite number >= 0 (integer or real). */
static hm_status get_time(const hm_json_reader *r, const json_t *obj, const char *key,
                          const char *where, double *out, bool *present) {
    char field[160];
    snprintf(field, sizeof(field), "%s.%s", where, key);
    const json_t *v = json_object_get(obj, key);
    *out = 0;
    *present = v != NULL;
    if (!v) return HM_OK;
    if (!json_is_number(v))
        return hm_json_fail(r, HM_ERR_FORMAT, field, "must be a number, not %s",
                            hm_json_type_name(v));
    double d = json_number_value(v);
    if (!(d >= 0) || !isfinite(d))
        return hm_json_fail(r, HM_ERR_FORMAT, field, "must not be negative (%g)", d);
    *out = d;
    return HM_OK;
}

/* obj[key] as an array of exactly n counts into a new *out (NULL if absent and optional). */
static hm_status get_counts(const hm_json_reader *r, const json_t *obj, const char *key,
                            const char *where, size_t n, uint64_t **out, bool *present) {
    char field[160];
    snprintf(field, sizeof(field), "%s%s%s", where, *where ? "." : "", key);
    const json_t *a = json_object_get(obj, key);
    *out = NULL;
    if (present) *present = a != NULL;
    if (!a) return present ? HM_OK : hm_json_fail(r, HM_ERR_FORMAT, field, "missing");
    if (!json_is_array(a))
        return hm_json_fail(r, HM_ERR_FORMAT, field, "must be an array, not %s",
                            hm_json_type_name(a));
    if (json_array_size(a) != n)
        return hm_json_fail(r, HM_ERR_FORMAT, field, "has %zu entries, n_expert is %zu",
                            json_array_size(a), n);
    uint64_t *v = calloc(n, sizeof(*v));
    if (!v) return hm_json_fail(r, HM_ERR_NOMEM, field, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char ef[192];
        snprintf(ef, sizeof(ef), "%s[%zu]", field, i);
        hm_status st = hm_json_as_count(r, json_array_get(a, i), ef, &v[i]);
        if (st != HM_OK) {
            free(v);
            return st;
        }
    }
    *out = v;
    return HM_OK;
}

/* A shape field: an integer in [lo, hi]. */
static hm_status get_dim(const hm_json_reader *r, const json_t *root, const char *key, int lo,
                         int hi, int *out) {
    uint64_t v;
    hm_status st = hm_json_get_count(r, root, key, "", &v, NULL);
    if (st != HM_OK) return st;
    if (v < (uint64_t)lo || v > (uint64_t)hi)
        return hm_json_fail(r, HM_ERR_FORMAT, key, "%" PRIu64 " is outside [%d, %d]", v, lo, hi);
    *out = (int)v;
    return HM_OK;
}

static hm_status get_model(const hm_json_reader *r, const json_t *root, moe_learn *out) {
    const json_t *m = json_object_get(root, "model");
    if (!m) return HM_OK;
    if (!json_is_object(m))
        return hm_json_fail(r, HM_ERR_FORMAT, "model", "must be an object, not %s",
                            hm_json_type_name(m));
    static const char *const keys[3] = {"arch", "name", "file"};
    char **dst[3] = {&out->arch, &out->name, &out->file};
    for (int i = 0; i < 3; i++) {
        const json_t *v = json_object_get(m, keys[i]);
        if (!v) continue;
        char field[32];
        snprintf(field, sizeof(field), "model.%s", keys[i]);
        if (!json_is_string(v))
            return hm_json_fail(r, HM_ERR_FORMAT, field, "must be a string, not %s",
                                hm_json_type_name(v));
        if (!(*dst[i] = strdup(json_string_value(v))))
            return hm_json_fail(r, HM_ERR_NOMEM, field, "out of memory");
    }
    return HM_OK;
}

/* The perf fields (docs/LEARN.md) that are checked but not kept. */
static const char *const perf_times[] = {
    "routing_time_us", "worklist_time_us", "matmul_time_us", "branch_time_us",
    "gather_scatter_time_us", "merge_time_us", "parallel_wall_time_us",
    "parallel_join_wait_time_us", "parallel_hot_lane_time_us", "parallel_cold_lane_time_us",
    "fetch_wait_time_us", "postfetch_wait_time_us"};
static const char *const perf_counts[] = {
    "hot_slots_total", "cold_slots_total", "parallel_launches", "parallel_fallbacks",
    "fetch_experts", "fetch_bytes", "fetch_fallbacks", "postfetch_experts", "postfetch_bytes",
    "postfetch_fallbacks"};

static hm_status get_layer(const hm_json_reader *r, const json_t *lo, size_t l, const moe_learn *f,
                           moe_learn_layer *ly) {
    char where[32];
    snprintf(where, sizeof(where), "layers[%zu]", l);
    if (!json_is_object(lo))
        return hm_json_fail(r, HM_ERR_FORMAT, where, "must be an object, not %s",
                            hm_json_type_name(lo));
    hm_status st;
    uint64_t idx;
    if ((st = hm_json_get_count(r, lo, "layer", where, &idx, NULL)) != HM_OK) return st;
    if (idx != l)
        return hm_json_fail(r, HM_ERR_FORMAT, where,
                            "has \"layer\": %" PRIu64 "; layers must be in order", idx);
    if ((st = hm_json_get_count(r, lo, "calls", where, &ly->calls, NULL)) != HM_OK ||
        (st = hm_json_get_count(r, lo, "tokens", where, &ly->tokens, NULL)) != HM_OK ||
        (st = hm_json_get_count(r, lo, "expert_hits_total", where, &ly->expert_hits_total, NULL)) !=
            HM_OK ||
        (st = get_counts(r, lo, "experts", where, (size_t)f->n_expert, &ly->experts, NULL)) !=
            HM_OK ||
        (st = get_time(r, lo, "moe_time_us", where, &ly->moe_time_us, &ly->has_moe_time)) != HM_OK)
        return st;
    uint64_t sum = 0;
    for (int e = 0; e < f->n_expert; e++) {
        if (ly->experts[e] > UINT64_MAX - sum)
            return hm_json_fail(r, HM_ERR_FORMAT, where, "experts sum past 2^64");
        sum += ly->experts[e];
    }
    if (sum != ly->expert_hits_total)
        return hm_json_fail(r, HM_ERR_FORMAT, where,
                            "expert_hits_total %" PRIu64 " is not the sum of experts (%" PRIu64 ")",
                            ly->expert_hits_total, sum);
    uint64_t used = (uint64_t)f->n_expert_used; /* at most tokens x n_expert_used slots */
    if (ly->tokens <= UINT64_MAX / used && sum > ly->tokens * used)
        return hm_json_fail(r, HM_ERR_FORMAT, where,
                            "%" PRIu64 " hits for %" PRIu64 " tokens of %d experts each", sum,
                            ly->tokens, f->n_expert_used);
    if (!ly->calls && (ly->tokens || sum))
        return hm_json_fail(r, HM_ERR_FORMAT, where, "calls is 0 but tokens or hits are not");
    bool has_hot, has_cold;
    if ((st = get_counts(r, lo, "hot_experts", where, (size_t)f->n_expert, &ly->hot_experts, &has_hot)) != HM_OK ||
        (st = get_counts(r, lo, "cold_experts", where, (size_t)f->n_expert, &ly->cold_experts, &has_cold)) != HM_OK)
        return st;
    ly->has_branch_counts = has_hot && has_cold;
    if (!ly->has_branch_counts) { /* one without the other carries no split */
        free(ly->hot_experts);
        free(ly->cold_experts);
        ly->hot_experts = ly->cold_experts = NULL;
    }
    for (int e = 0; ly->has_branch_counts && e < f->n_expert; e++) {
        uint64_t h = ly->hot_experts[e], c = ly->cold_experts[e];
        if (h > UINT64_MAX - c || h + c != ly->experts[e])
            return hm_json_fail(r, HM_ERR_FORMAT, where,
                                "hot_experts[%d] + cold_experts[%d] is not experts[%d]", e, e, e);
    }
    for (size_t i = 0; i < sizeof(perf_times) / sizeof(perf_times[0]); i++) {
        double d;
        bool p;
        if ((st = get_time(r, lo, perf_times[i], where, &d, &p)) != HM_OK) return st;
    }
    for (size_t i = 0; i < sizeof(perf_counts) / sizeof(perf_counts[0]); i++) {
        uint64_t v;
        bool p;
        if ((st = hm_json_get_count(r, lo, perf_counts[i], where, &v, &p)) != HM_OK) return st;
    }
    return HM_OK;
}

static hm_status read_root(const hm_json_reader *r, const json_t *root, moe_learn *out) {
    if (!json_is_object(root))
        return hm_json_fail(r, HM_ERR_FORMAT, "(top)", "must be an object, not %s",
                            hm_json_type_name(root));
    const json_t *fmt = json_object_get(root, "format");
    if (!fmt) return hm_json_fail(r, HM_ERR_FORMAT, "format", "missing (not a learn file)");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), MOE_LEARN_FORMAT))
        return hm_json_fail(r, HM_ERR_FORMAT, "format", "must be \"%s\"%s%.60s%s", MOE_LEARN_FORMAT,
                            json_is_string(fmt) ? ", not \"" : "",
                            json_is_string(fmt) ? json_string_value(fmt) : "",
                            json_is_string(fmt) ? "\"" : "");
    uint64_t version;
    hm_status st = hm_json_get_count(r, root, "version", "", &version, NULL);
    if (st != HM_OK) return st;
    if (version > MOE_LEARN_VERSION)
        return hm_json_fail(r, HM_ERR_UNSUPPORTED, "version",
                            "%" PRIu64 " is newer than this reader (%d)", version,
                            MOE_LEARN_VERSION);
    if (version < 1)
        return hm_json_fail(r, HM_ERR_FORMAT, "version", "must be %d, not 0", MOE_LEARN_VERSION);
    if ((st = get_model(r, root, out)) != HM_OK ||
        (st = get_dim(r, root, "n_layer", 1, MOE_TRACER_MAX_LAYERS, &out->n_layer)) != HM_OK ||
        (st = get_dim(r, root, "n_expert", 1, MOE_TRACER_MAX_EXPERTS, &out->n_expert)) != HM_OK ||
        (st = get_dim(r, root, "n_expert_used", 1, out->n_expert, &out->n_expert_used)) != HM_OK ||
        (st = hm_json_get_count(r, root, "prompts", "", &out->prompts, NULL)) != HM_OK ||
        (st = hm_json_get_count(r, root, "total_tokens", "", &out->total_tokens, NULL)) != HM_OK ||
        (st = hm_json_get_count(r, root, "rejected", "", &out->rejected, NULL)) != HM_OK ||
        (st = get_counts(r, root, "experts", "", (size_t)out->n_expert, &out->experts, NULL)) !=
            HM_OK)
        return st;
    const json_t *layers = json_object_get(root, "layers");
    if (!layers) return hm_json_fail(r, HM_ERR_FORMAT, "layers", "missing");
    if (!json_is_array(layers))
        return hm_json_fail(r, HM_ERR_FORMAT, "layers", "must be an array, not %s",
                            hm_json_type_name(layers));
    if (json_array_size(layers) != (size_t)out->n_layer)
        return hm_json_fail(r, HM_ERR_FORMAT, "layers", "has %zu entries, n_layer is %d",
                            json_array_size(layers), out->n_layer);
    if (!(out->layers = calloc((size_t)out->n_layer, sizeof(*out->layers))))
        return hm_json_fail(r, HM_ERR_NOMEM, "layers", "out of memory");
    uint64_t max_tokens = 0;
    for (int l = 0; l < out->n_layer; l++) {
        moe_learn_layer *ly = &out->layers[l];
        if ((st = get_layer(r, json_array_get(layers, (size_t)l), (size_t)l, out, ly)) != HM_OK) return st;
        if (ly->tokens > max_tokens) max_tokens = ly->tokens;
    }
    if (out->total_tokens != max_tokens)
        return hm_json_fail(r, HM_ERR_FORMAT, "total_tokens",
                            "%" PRIu64 " is not the largest layer's tokens (%" PRIu64 ")",
                            out->total_tokens, max_tokens);
    for (int e = 0; e < out->n_expert; e++) {
        uint64_t sum = 0;
        for (int l = 0; l < out->n_layer; l++) {
            uint64_t h = out->layers[l].experts[e];
            if (h > UINT64_MAX - sum)
                return hm_json_fail(r, HM_ERR_FORMAT, "experts", "sums past 2^64");
            sum += h;
        }
        if (sum != out->experts[e]) {
            char field[32];
            snprintf(field, sizeof(field), "experts[%d]", e);
            return hm_json_fail(r, HM_ERR_FORMAT, field,
                                "%" PRIu64 " is not the sum over layers (%" PRIu64 ")",
                                out->experts[e], sum);
        }
    }
    return HM_OK;
}

hm_status moe_learn_parse(const char *text, size_t len, const char *origin, moe_learn *out,
                          hm_error *err) {
    memset(out, 0, sizeof(*out));
    hm_json_reader r = {origin ? origin : "(learn file)", err};
    json_t *root;
    hm_status st = hm_json_parse(&r, text, len, &root);
    if (st != HM_OK) return st;
    st = read_root(&r, root, out);
    json_decref(root);
    if (st != HM_OK) moe_learn_free(out);
    return st;
}

hm_status moe_learn_load(const char *path, moe_learn *out, hm_error *err) {
    memset(out, 0, sizeof(*out));
    char *buf;
    size_t len;
    hm_status st = hm_file_read_all(path, &buf, &len, err);
    if (st == HM_OK) st = moe_learn_parse(buf, len, path, out, err);
    free(buf);
    return st;
}

void moe_learn_free(moe_learn *l) {
    if (!l) return;
    for (int i = 0; l->layers && i < l->n_layer; i++) {
        free(l->layers[i].experts);
        free(l->layers[i].hot_experts);
        free(l->layers[i].cold_experts);
    }
    free(l->layers);
    free(l->experts);
    free(l->arch);
    free(l->name);
    free(l->file);
    memset(l, 0, sizeof(*l));
}
