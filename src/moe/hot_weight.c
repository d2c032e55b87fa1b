/* hot_weight.c - the hot cache's weighting modes (hot_weight.h; definitions in
 * docs/HOT_CACHE.md). */
#include "moe/hot_weight.h"

#include <math.h>
#include <string.h>

static const char *const k_names[HOT_WEIGHT_COUNT] = {"flat", "pressure", "smooth_pressure",
                                                      "time", "balanced"};

hot_weight_cfg hot_weight_default(void) {
    return (hot_weight_cfg){.mode = HOT_WEIGHT_FLAT, .layer_curve = 0.5};
}

hm_status hot_weighting_parse(const char *s, hot_weighting *out, hm_error *err) {
    for (int i = 0; s && i < HOT_WEIGHT_COUNT; i++)
        if (!strcmp(s, k_names[i])) {
            *out = (hot_weighting)i;
            return HM_OK;
        }
    return hm_error_set(err, HM_ERR_ARG, "unknown hot-cache weighting '%s' (known: %s)",
                        s ? s : "", HOT_WEIGHT_NAMES);
}

const char *hot_weighting_name(hot_weighting w) {
    return w >= 0 && w < HOT_WEIGHT_COUNT ? k_names[w] : "?";
}

static uint64_t layer_hits(const moe_learn_layer *ly, int n_expert) {
    uint64_t h = 0;
    for (int e = 0; e < n_expert; e++) h += ly->experts[e];
    return h;
}

/* The raw layer weights of the mode (before normalising), into w[]; info filled. */
static void raw_weights(const moe_learn *l, hot_weighting mode, double *w,
                        hot_weight_info *info) {
    info->timed = info->split = true;
    for (int il = 0; il < l->n_layer; il++) {
        const moe_learn_layer *ly = &l->layers[il];
        if (layer_hits(ly, l->n_expert) == 0) continue;
        info->timed = info->timed && ly->has_moe_time && ly->calls > 0;
        info->split = info->split && ly->has_branch_counts;
    }
    for (int il = 0; il < l->n_layer; il++) {
        const moe_learn_layer *ly = &l->layers[il];
        const uint64_t h = layer_hits(ly, l->n_expert);
        w[il] = 0;
        if (h == 0) continue;
        const double time = info->timed ? ly->moe_time_us / (double)ly->calls : 1.0;
        double miss = 1.0;
        if (info->split) {
            uint64_t cold = 0;
            for (int e = 0; e < l->n_expert; e++) cold += ly->cold_experts[e];
            miss = (double)cold / (double)h;
        }
        switch (mode) {
        case HOT_WEIGHT_TIME: w[il] = time; break;
        case HOT_WEIGHT_PRESSURE: w[il] = miss * time; break;
        case HOT_WEIGHT_SMOOTH_PRESSURE: w[il] = sqrt(miss * time); break;
        default: w[il] = 1.0; break;
        }
    }
}

hm_status hot_weight_score(const moe_learn *l, const hot_weight_cfg *c, double *score,
                           double *layer_w, hot_weight_info *info, hm_error *err) {
    if (!c || c->mode < 0 || c->mode >= HOT_WEIGHT_COUNT)
        return hm_error_set(err, HM_ERR_ARG, "hot-cache weighting: mode out of range");
    if (!(c->layer_curve >= 0) || !isfinite(c->layer_curve))
        return hm_error_set(err, HM_ERR_ARG, "--moe-hot-cache-layer-curve %g: must be a finite "
                            "number >= 0", c->layer_curve);
    hot_weight_info tmp;
    if (!info) info = &tmp;
    const int NL = l->n_layer, NE = l->n_expert;
    raw_weights(l, c->mode, layer_w, info);
    double sum = 0, sum_h = 0;
    int n = 0;
    for (int il = 0; il < NL; il++) {
        const uint64_t h = layer_hits(&l->layers[il], NE);
        if (h == 0) continue;
        sum += layer_w[il];
        sum_h += (double)h;
        n++;
    }
    const double mean = n > 0 ? sum / n : 1.0, mean_h = n > 0 ? sum_h / n : 1.0;
    for (int il = 0; il < NL; il++) {
        const moe_learn_layer *ly = &l->layers[il];
        const uint64_t h = layer_hits(ly, NE);
        /* a layer whose weight is 0 (no misses, or no time) keeps a tiny weight: its experts
         * still rank among themselves */
        double w = h == 0 ? 0.0 : mean > 0 ? layer_w[il] / mean : 1.0;
        if (h > 0 && w <= 0) w = 1e-9;
        layer_w[il] = h == 0 ? 0.0 : pow(w, c->layer_curve);
        const double scale = c->mode == HOT_WEIGHT_BALANCED && h > 0 ? mean_h / (double)h : 1.0;
        for (int e = 0; e < NE; e++)
            score[(size_t)il * (size_t)NE + (size_t)e] =
                (double)ly->experts[e] * scale * layer_w[il];
    }
    return HM_OK;
}
