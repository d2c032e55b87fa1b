/* routing_profile.c - the routing profile reader (routing_stats.h, docs/ROUTING.md).
 *
 * DESIGN: jansson parses the text (duplicate keys and trailing bytes refused); one walk over
 * the tree checks each field and stops at the first violation with one line naming the origin
 * and the field ("p.json: layers[2].repeat.4: must be a number in [0, 1] or null, not a
 * string"). A profile may be partial (figures from a paper): only the format, version, source,
 * shape and the "average" object are required, every figure may be absent or null (NAN in
 * memory), "layers" may be absent. Keys inside a figure map must be one of its points (a "40"
 * in top_share is refused: it would be silently ignored otherwise). Arrays are allocated only
 * after their length has been checked against n_expert / n_layer.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_read.h"
#include "moe/routing_stats.h"

#define RP_MAX_LAYERS 4096
#define RP_MAX_EXPERTS 65536

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

/* An optional top-level count into *out (-1 when absent). */
static hm_status get_opt_count(const hm_json_reader *r, const json_t *root, const char *key,
                               int64_t *out) {
    uint64_t v;
    bool present;
    hm_status st = hm_json_get_count(r, root, key, "", &v, &present);
    if (st != HM_OK) return st;
    if (present && v > (uint64_t)INT64_MAX) return hm_json_fail(r, HM_ERR_FORMAT, key, "too large");
    *out = present ? (int64_t)v : -1;
    return HM_OK;
}

static hm_status get_string(const hm_json_reader *r, const json_t *obj, const char *key,
                            const char *where, bool required, char **out) {
    char field[192];
    hm_json_field(field, sizeof(field), where, key);
    const json_t *v = json_object_get(obj, key);
    if (!v) return required ? hm_json_fail(r, HM_ERR_FORMAT, field, "missing") : HM_OK;
    if (!json_is_string(v))
        return hm_json_fail(r, HM_ERR_FORMAT, field, "must be a string, not %s",
                            hm_json_type_name(v));
    if (!(*out = strdup(json_string_value(v))))
        return hm_json_fail(r, HM_ERR_NOMEM, field, "out of memory");
    return HM_OK;
}

/* One figure map {"<pt>": number or null}: keys must be among pts; values in [lo, hi]. */
static hm_status get_map(const hm_json_reader *r, const json_t *obj, const char *key,
                         const char *where, const int *pts, int n, double lo, double hi,
                         double *out) {
    char field[192];
    hm_json_field(field, sizeof(field), where, key);
    for (int i = 0; i < n; i++) out[i] = NAN;
    const json_t *m = json_object_get(obj, key);
    if (!m || json_is_null(m)) return HM_OK;
    if (!json_is_object(m))
        return hm_json_fail(r, HM_ERR_FORMAT, field, "must be an object, not %s",
                            hm_json_type_name(m));
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)m, k, v) {
        char kf[256];
        snprintf(kf, sizeof(kf), "%s.%.40s", field, k);
        int i = 0;
        while (i < n) {
            char name[16];
            snprintf(name, sizeof(name), "%d", pts[i]);
            if (!strcmp(name, k)) break;
            i++;
        }
        if (i == n) {
            char list[96] = "";
            for (int t = 0; t < n; t++)
                snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s\"%d\"",
                         t ? ", " : "", pts[t]);
            return hm_json_fail(r, HM_ERR_FORMAT, kf, "unknown point (the keys are %s)", list);
        }
        if (json_is_null(v)) continue;
        if (!json_is_number(v))
            return hm_json_fail(r, HM_ERR_FORMAT, kf,
                                "must be a number in [%g, %g] or null, not %s", lo, hi,
                                hm_json_type_name(v));
        const double d = json_number_value(v);
        if (!(d >= lo && d <= hi))
            return hm_json_fail(r, HM_ERR_FORMAT, kf, "%g is outside [%g, %g]", d, lo, hi);
        out[i] = d;
    }
    return HM_OK;
}

static hm_status get_figures(const hm_json_reader *r, const json_t *obj, const char *where, int E,
                             moe_routing_figures *f) {
    hm_status st;
    if ((st = get_map(r, obj, "top_share", where, moe_routing_top_pct, MOE_ROUTING_N_TOP, 0, 1,
                      f->top_share)) != HM_OK ||
        (st = get_map(r, obj, "experts_for_share", where, moe_routing_mass_pct,
                      MOE_ROUTING_N_MASS, 1, E, f->experts_for)) != HM_OK ||
        (st = get_map(r, obj, "weight_top_share", where, moe_routing_top_pct, MOE_ROUTING_N_TOP,
                      0, 1, f->w_top_share)) != HM_OK ||
        (st = get_map(r, obj, "weight_experts_for_share", where, moe_routing_mass_pct,
                      MOE_ROUTING_N_MASS, 1, E, f->w_experts_for)) != HM_OK ||
        (st = get_map(r, obj, "repeat", where, moe_routing_dist, MOE_ROUTING_N_DIST, 0, 1,
                      f->repeat)) != HM_OK ||
        (st = get_map(r, obj, "lru_hit", where, moe_routing_lru_pct, MOE_ROUTING_N_LRU, 0, 1,
                      f->lru_hit)) != HM_OK)
        return st;
    return HM_OK;
}

/* An optional map of counts {"<pt>": count}, all points required when present. */
static hm_status get_count_map(const hm_json_reader *r, const json_t *obj, const char *key,
                               const char *where, const int *pts, int n, uint64_t *out,
                               bool *present) {
    char field[192];
    hm_json_field(field, sizeof(field), where, key);
    const json_t *m = json_object_get(obj, key);
    *present = m != NULL;
    if (!m) return HM_OK;
    if (!json_is_object(m))
        return hm_json_fail(r, HM_ERR_FORMAT, field, "must be an object, not %s",
                            hm_json_type_name(m));
    if (json_object_size(m) != (size_t)n)
        return hm_json_fail(r, HM_ERR_FORMAT, field, "has %zu entries, not %d", json_object_size(m),
                            n);
    for (int i = 0; i < n; i++) {
        char k[16];
        snprintf(k, sizeof(k), "%d", pts[i]);
        hm_status st = hm_json_get_count(r, m, k, field, &out[i], NULL);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

/* "top_experts" / "lru_capacity": informative; when present they must match the rule. */
static hm_status check_pct_experts(const hm_json_reader *r, const json_t *root, const char *key,
                                   const int *pts, int n, int E) {
    uint64_t v[MOE_ROUTING_N_LRU];
    bool present;
    hm_status st = get_count_map(r, root, key, "", pts, n, v, &present);
    if (st != HM_OK || !present) return st;
    for (int i = 0; i < n; i++)
        if (v[i] != (uint64_t)moe_routing_pct_experts(pts[i], E)) {
            char field[64];
            snprintf(field, sizeof(field), "%s.%d", key, pts[i]);
            return hm_json_fail(r, HM_ERR_FORMAT, field,
                                "%" PRIu64 " experts, but %d%% of %d is %d "
                                "(ceil)",
                                v[i], pts[i], E, moe_routing_pct_experts(pts[i], E));
        }
    return HM_OK;
}

static hm_status get_layer(const hm_json_reader *r, const json_t *lo, int l,
                           const moe_routing_profile *p, moe_routing_layer *y) {
    char where[32];
    snprintf(where, sizeof(where), "layers[%d]", l);
    moe_routing_figures_unknown(&y->f);
    if (!json_is_object(lo))
        return hm_json_fail(r, HM_ERR_FORMAT, where, "must be an object, not %s",
                            hm_json_type_name(lo));
    const size_t E = (size_t)p->n_expert;
    uint64_t idx;
    hm_status st;
    if ((st = hm_json_get_count(r, lo, "layer", where, &idx, NULL)) != HM_OK) return st;
    if (idx != (uint64_t)l)
        return hm_json_fail(r, HM_ERR_FORMAT, where,
                            "has \"layer\": %" PRIu64 "; layers must be in order", idx);
    if ((st = hm_json_get_count(r, lo, "tokens", where, &y->tokens, NULL)) != HM_OK ||
        (st = hm_json_get_count(r, lo, "selections", where, &y->selections, NULL)) != HM_OK)
        return st;
    const uint64_t used = (uint64_t)p->n_expert_used;
    if (y->tokens > UINT64_MAX / used || y->selections > y->tokens * used)
        return hm_json_fail(r, HM_ERR_FORMAT, where,
                            "%" PRIu64 " selections for %" PRIu64 " tokens of %d experts each",
                            y->selections, y->tokens, p->n_expert_used);
    const json_t *h = json_object_get(lo, "hits");
    if (h) {
        char field[64];
        snprintf(field, sizeof(field), "%s.hits", where);
        if (!json_is_array(h))
            return hm_json_fail(r, HM_ERR_FORMAT, field, "must be an array, not %s",
                                hm_json_type_name(h));
        if (json_array_size(h) != E)
            return hm_json_fail(r, HM_ERR_FORMAT, field, "has %zu entries, n_expert is %zu",
                                json_array_size(h), E);
        if (!(y->hits = calloc(E, sizeof(uint64_t))))
            return hm_json_fail(r, HM_ERR_NOMEM, field, "out of memory");
        uint64_t sum = 0;
        for (size_t e = 0; e < E; e++) {
            char ef[96];
            snprintf(ef, sizeof(ef), "%s[%zu]", field, e);
            if ((st = hm_json_as_count(r, json_array_get(h, e), ef, &y->hits[e])) != HM_OK)
                return st;
            if (y->hits[e] > y->selections - sum)
                return hm_json_fail(r, HM_ERR_FORMAT, field, "sums past selections (%" PRIu64 ")",
                                    y->selections);
            sum += y->hits[e];
        }
        if (sum != y->selections)
            return hm_json_fail(r, HM_ERR_FORMAT, field,
                                "sum to %" PRIu64 ", not selections (%" PRIu64 ")", sum,
                                y->selections);
    }
    const json_t *w = json_object_get(lo, "weight_mass");
    if (w) {
        char field[64];
        snprintf(field, sizeof(field), "%s.weight_mass", where);
        if (!json_is_array(w))
            return hm_json_fail(r, HM_ERR_FORMAT, field, "must be an array, not %s",
                                hm_json_type_name(w));
        if (json_array_size(w) != E)
            return hm_json_fail(r, HM_ERR_FORMAT, field, "has %zu entries, n_expert is %zu",
                                json_array_size(w), E);
        if (!(y->weight_mass = calloc(E, sizeof(double))))
            return hm_json_fail(r, HM_ERR_NOMEM, field, "out of memory");
        for (size_t e = 0; e < E; e++) {
            const json_t *v = json_array_get(w, e);
            double d = json_is_number(v) ? json_number_value(v) : -1;
            if (!(d >= 0) || !isfinite(d)) {
                char ef[96];
                snprintf(ef, sizeof(ef), "%s[%zu]", field, e);
                return hm_json_fail(r, HM_ERR_FORMAT, ef, "must be a number >= 0, not %s",
                                    json_is_number(v) ? "negative" : hm_json_type_name(v));
            }
            y->weight_mass[e] = d;
        }
    }
    bool has_rh, has_rc;
    if ((st = get_count_map(r, lo, "repeat_hits", where, moe_routing_dist, MOE_ROUTING_N_DIST,
                            y->repeat_hits, &has_rh)) != HM_OK ||
        (st = get_count_map(r, lo, "repeat_considered", where, moe_routing_dist,
                            MOE_ROUTING_N_DIST, y->repeat_considered, &has_rc)) != HM_OK ||
        (st = get_count_map(r, lo, "lru_hits", where, moe_routing_lru_pct, MOE_ROUTING_N_LRU,
                            y->lru_hits, &y->has_lru_counts)) != HM_OK)
        return st;
    if (has_rh != has_rc)
        return hm_json_fail(r, HM_ERR_FORMAT, where, "has %s without %s",
                            has_rh ? "repeat_hits" : "repeat_considered",
                            has_rh ? "repeat_considered" : "repeat_hits");
    y->has_repeat_counts = has_rh;
    for (int d = 0; has_rh && d < MOE_ROUTING_N_DIST; d++)
        if (y->repeat_hits[d] > y->repeat_considered[d] || y->repeat_considered[d] > y->selections)
            return hm_json_fail(r, HM_ERR_FORMAT, where,
                                "repeat_hits.%d (%" PRIu64 ") > "
                                "repeat_considered.%d (%" PRIu64 ") or that > selections",
                                moe_routing_dist[d], y->repeat_hits[d], moe_routing_dist[d],
                                y->repeat_considered[d]);
    for (int c = 0; y->has_lru_counts && c < MOE_ROUTING_N_LRU; c++)
        if (y->lru_hits[c] > y->selections || (c && y->lru_hits[c] < y->lru_hits[c - 1]))
            return hm_json_fail(r, HM_ERR_FORMAT, where,
                                "lru_hits.%d (%" PRIu64 ") is above selections "
                                "or below a smaller cache's",
                                moe_routing_lru_pct[c], y->lru_hits[c]);
    return get_figures(r, lo, where, p->n_expert, &y->f);
}

static hm_status read_root(const hm_json_reader *r, const json_t *root, moe_routing_profile *out) {
    if (!json_is_object(root))
        return hm_json_fail(r, HM_ERR_FORMAT, "(top)", "must be an object, not %s",
                            hm_json_type_name(root));
    const json_t *fmt = json_object_get(root, "format");
    if (!fmt) return hm_json_fail(r, HM_ERR_FORMAT, "format", "missing (not a routing profile)");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), MOE_ROUTING_FORMAT))
        return hm_json_fail(r, HM_ERR_FORMAT, "format", "must be \"%s\"%s%.60s%s",
                            MOE_ROUTING_FORMAT, json_is_string(fmt) ? ", not \"" : "",
                            json_is_string(fmt) ? json_string_value(fmt) : "",
                            json_is_string(fmt) ? "\"" : "");
    uint64_t version;
    hm_status st = hm_json_get_count(r, root, "version", "", &version, NULL);
    if (st != HM_OK) return st;
    if (version > MOE_ROUTING_VERSION)
        return hm_json_fail(r, HM_ERR_UNSUPPORTED, "version",
                            "%" PRIu64 " is newer than this reader (%d)", version,
                            MOE_ROUTING_VERSION);
    if (version < 1)
        return hm_json_fail(r, HM_ERR_FORMAT, "version", "must be %d, not 0", MOE_ROUTING_VERSION);
    out->version = (int)version;
    if ((st = get_string(r, root, "source", "", true, &out->source)) != HM_OK) return st;
    const json_t *meas = json_object_get(root, "measured");
    if (meas && !json_is_boolean(meas))
        return hm_json_fail(r, HM_ERR_FORMAT, "measured", "must be true or false, not %s",
                            hm_json_type_name(meas));
    out->measured = meas && json_is_true(meas);
    const json_t *notes = json_object_get(root, "notes");
    if (notes) {
        if (!json_is_array(notes))
            return hm_json_fail(r, HM_ERR_FORMAT, "notes", "must be an array of strings, not %s",
                                hm_json_type_name(notes));
        size_t n = json_array_size(notes);
        if (n && !(out->notes = calloc(n, sizeof(char *))))
            return hm_json_fail(r, HM_ERR_NOMEM, "notes", "out of memory");
        for (size_t i = 0; i < n; i++) {
            const json_t *v = json_array_get(notes, i);
            char field[32];
            snprintf(field, sizeof(field), "notes[%zu]", i);
            if (!json_is_string(v))
                return hm_json_fail(r, HM_ERR_FORMAT, field, "must be a string, not %s",
                                    hm_json_type_name(v));
            if (!(out->notes[i] = strdup(json_string_value(v))))
                return hm_json_fail(r, HM_ERR_NOMEM, field, "out of memory");
            out->n_notes++;
        }
    }
    const json_t *m = json_object_get(root, "model");
    if (m) {
        if (!json_is_object(m))
            return hm_json_fail(r, HM_ERR_FORMAT, "model", "must be an object, not %s",
                                hm_json_type_name(m));
        if ((st = get_string(r, m, "arch", "model", false, &out->arch)) != HM_OK ||
            (st = get_string(r, m, "name", "model", false, &out->name)) != HM_OK ||
            (st = get_string(r, m, "file", "model", false, &out->file)) != HM_OK)
            return st;
    }
    if ((st = get_dim(r, root, "n_layer", 1, RP_MAX_LAYERS, &out->n_layer)) != HM_OK ||
        (st = get_dim(r, root, "n_expert", 1, RP_MAX_EXPERTS, &out->n_expert)) != HM_OK ||
        (st = get_dim(r, root, "n_expert_used", 1, out->n_expert, &out->n_expert_used)) != HM_OK ||
        (st = get_opt_count(r, root, "tokens", &out->tokens)) != HM_OK ||
        (st = get_opt_count(r, root, "sequences", &out->sequences)) != HM_OK ||
        (st = get_opt_count(r, root, "rejected", &out->rejected)) != HM_OK ||
        (st = check_pct_experts(r, root, "top_experts", moe_routing_top_pct, MOE_ROUTING_N_TOP,
                                out->n_expert)) != HM_OK ||
        (st = check_pct_experts(r, root, "lru_capacity", moe_routing_lru_pct, MOE_ROUTING_N_LRU,
                                out->n_expert)) != HM_OK)
        return st;
    const json_t *avg = json_object_get(root, "average");
    if (!avg) return hm_json_fail(r, HM_ERR_FORMAT, "average", "missing");
    if (!json_is_object(avg))
        return hm_json_fail(r, HM_ERR_FORMAT, "average", "must be an object, not %s",
                            hm_json_type_name(avg));
    if ((st = get_figures(r, avg, "average", out->n_expert, &out->avg)) != HM_OK) return st;
    const json_t *layers = json_object_get(root, "layers");
    if (!layers) return HM_OK;
    if (!json_is_array(layers))
        return hm_json_fail(r, HM_ERR_FORMAT, "layers", "must be an array, not %s",
                            hm_json_type_name(layers));
    if (json_array_size(layers) != (size_t)out->n_layer)
        return hm_json_fail(r, HM_ERR_FORMAT, "layers", "has %zu entries, n_layer is %d",
                            json_array_size(layers), out->n_layer);
    if (!(out->layers = calloc((size_t)out->n_layer, sizeof(moe_routing_layer))))
        return hm_json_fail(r, HM_ERR_NOMEM, "layers", "out of memory");
    uint64_t max_tok = 0;
    for (int l = 0; l < out->n_layer; l++) {
        if ((st = get_layer(r, json_array_get(layers, (size_t)l), l, out, &out->layers[l])) !=
            HM_OK)
            return st;
        if (out->layers[l].tokens > max_tok) max_tok = out->layers[l].tokens;
    }
    if (out->tokens >= 0 && (uint64_t)out->tokens != max_tok)
        return hm_json_fail(r, HM_ERR_FORMAT, "tokens",
                            "%" PRId64 " is not the largest layer's tokens (%" PRIu64 ")",
                            out->tokens, max_tok);
    return HM_OK;
}

hm_status moe_routing_profile_parse(const char *text, size_t len, const char *origin,
                                    moe_routing_profile *out, hm_error *err) {
    memset(out, 0, sizeof(*out));
    out->tokens = out->sequences = out->rejected = -1;
    moe_routing_figures_unknown(&out->avg);
    hm_json_reader r = {origin ? origin : "(routing profile)", err};
    json_t *root;
    hm_status st = hm_json_parse(&r, text, len, &root);
    if (st != HM_OK) return st;
    st = read_root(&r, root, out);
    json_decref(root);
    if (st != HM_OK) moe_routing_profile_free(out);
    return st;
}

hm_status moe_routing_profile_load(const char *path, moe_routing_profile *out, hm_error *err) {
    memset(out, 0, sizeof(*out));
    char *buf;
    size_t len;
    hm_status st = hm_file_read_all(path, &buf, &len, err);
    if (st == HM_OK) st = moe_routing_profile_parse(buf, len, path, out, err);
    free(buf);
    return st;
}
