/* residency.c - the residency map (residency.h). */
#include "model/residency.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static hm_status alloc_map(hm_residency *r, int n_layer, int n_expert, hm_error *err) {
    memset(r, 0, sizeof(*r));
    if (n_layer < 1 || n_expert < 1 || (int64_t)n_layer * n_expert > INT32_MAX)
        return hm_error_set(err, HM_ERR_ARG, "residency: bad size (%d layers of %d experts)",
                            n_layer, n_expert);
    const size_t n = (size_t)n_layer * (size_t)n_expert;
    r->n_layer = n_layer;
    r->n_expert = n_expert;
    r->home = malloc(n);
    r->slot = malloc(n * sizeof(int32_t));
    r->n_slots = malloc((size_t)n_layer * sizeof(int32_t));
    if (!r->home || !r->slot || !r->n_slots) {
        hm_residency_free(r);
        return hm_error_set(err, HM_ERR_NOMEM, "residency: out of memory (%d layers of %d "
                            "experts)", n_layer, n_expert);
    }
    return HM_OK;
}

hm_status hm_residency_init_host(hm_residency *r, int n_layer, int n_expert, hm_error *err) {
    hm_status st = alloc_map(r, n_layer, n_expert, err);
    if (st != HM_OK) return st;
    const size_t n = (size_t)n_layer * (size_t)n_expert;
    memset(r->home, HM_HOME_HOST, n);
    for (size_t i = 0; i < n; i++) r->slot[i] = -1;
    for (int l = 0; l < n_layer; l++) r->n_slots[l] = 0;
    return HM_OK;
}

hm_status hm_residency_init_device(hm_residency *r, int n_layer, int n_expert, hm_error *err) {
    hm_status st = alloc_map(r, n_layer, n_expert, err);
    if (st != HM_OK) return st;
    for (int l = 0; l < n_layer; l++) {
        r->n_slots[l] = n_expert;
        for (int e = 0; e < n_expert; e++) {
            r->home[hm_residency_at(r, l, e)] = HM_HOME_HOST | HM_HOME_DEVICE;
            r->slot[hm_residency_at(r, l, e)] = e;
        }
    }
    return HM_OK;
}

void hm_residency_free(hm_residency *r) {
    if (!r) return;
    free(r->home);
    free(r->slot);
    free(r->n_slots);
    memset(r, 0, sizeof(*r));
}

hm_status hm_residency_check(const hm_residency *r, hm_error *err) {
    if (!r) return hm_error_set(err, HM_ERR_ARG, "residency: no map");
    if (r->n_layer < 1 || r->n_expert < 1 || !r->home || !r->slot || !r->n_slots)
        return hm_error_set(err, HM_ERR_ARG, "residency: bad map (%d layers of %d experts%s)",
                            r->n_layer, r->n_expert,
                            !r->home || !r->slot || !r->n_slots ? ", arrays missing" : "");
    bool *used = calloc((size_t)r->n_expert, sizeof(bool));
    if (!used) return hm_error_set(err, HM_ERR_NOMEM, "residency: out of memory");
    hm_status st = HM_OK;
    for (int l = 0; l < r->n_layer && st == HM_OK; l++) {
        const int32_t ns = r->n_slots[l];
        if (ns < 0 || ns > r->n_expert) {
            st = hm_error_set(err, HM_ERR_ARG, "residency: layer %d holds %d device slots "
                              "(0..%d)", l, (int)ns, r->n_expert);
            break;
        }
        memset(used, 0, (size_t)r->n_expert * sizeof(bool));
        for (int e = 0; e < r->n_expert; e++) {
            const uint8_t h = r->home[hm_residency_at(r, l, e)];
            const int32_t s = r->slot[hm_residency_at(r, l, e)];
            const char *bad = NULL;
            if (h == 0) bad = "lives nowhere (home 0)";
            else if (h & ~(HM_HOME_HOST | HM_HOME_DEVICE)) bad = "has unknown home bits";
            else if (s < -1 || s >= ns) bad = "has a slot outside the layer's slots";
            else if ((h & HM_HOME_DEVICE) && s < 0) bad = "is on the device without a slot";
            else if (!(h & HM_HOME_DEVICE) && s >= 0) bad = "has a slot but no device home";
            else if (s >= 0 && used[s]) bad = "shares its slot with another expert";
            if (bad) {
                st = hm_error_set(err, HM_ERR_ARG, "residency: layer %d expert %d %s (home %u, "
                                  "slot %d of %d)", l, e, bad, (unsigned)h, (int)s, (int)ns);
                break;
            }
            if (s >= 0) used[s] = true;
        }
    }
    free(used);
    return st;
}

int hm_residency_n_device(const hm_residency *r, int layer) {
    if (!r || !r->slot || layer < 0 || layer >= r->n_layer) return 0;
    int n = 0;
    for (int e = 0; e < r->n_expert; e++) n += r->slot[hm_residency_at(r, layer, e)] >= 0;
    return n;
}
