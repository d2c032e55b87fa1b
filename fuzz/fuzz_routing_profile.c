/* fuzz_routing_profile.c - libFuzzer target for the routing profile reader
 * (src/moe/routing_stats.h, docs/ROUTING.md): any bytes must be either read or refused with a
 * message naming the origin, never crash, leak or read out of bounds; a profile that is read
 * keeps the reader's promises, and writing it and reading that back gives the same figures.
 * Seeds (fuzz/routing_profile/corpus): the published Qwen3-30B-A3B partial profile, a measured
 * profile of tiny-olmoe (compact), the same with a dense layer (pretty). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "moe/routing_stats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moe_routing_profile p;
    hm_error err;
    hm_status st = moe_routing_profile_parse((const char *)data, size, "fuzz", &p, &err);
    if (st != HM_OK && strncmp(err.msg, "fuzz", 4) != 0) abort(); /* every message names it */
    if (st != HM_OK) return 0;
    if (p.n_expert_used > p.n_expert || !p.source) abort();
    for (int l = 0; p.layers && l < p.n_layer; l++) {
        const moe_routing_layer *y = &p.layers[l];
        uint64_t sum = 0;
        for (int e = 0; y->hits && e < p.n_expert; e++) sum += y->hits[e];
        if (y->hits && sum != y->selections) abort();
        if (y->selections > y->tokens * (uint64_t)p.n_expert_used) abort();
    }
    /* round trip */
    hm_json j;
    hm_json_init_buf(&j, false);
    moe_routing_profile_write_json(&p, &j);
    if (hm_json_finish(&j, &err) != HM_OK) abort();
    size_t len;
    const char *text = hm_json_data(&j, &len);
    moe_routing_profile q;
    if (moe_routing_profile_parse(text, len, "again", &q, &err) != HM_OK) abort();
    const double *a = (const double *)&p.avg, *b = (const double *)&q.avg;
    for (size_t i = 0; i < sizeof(p.avg) / sizeof(double); i++)
        if (!same(a[i], b[i])) abort();
    moe_routing_profile_free(&q);
    hm_json_free(&j);
    moe_routing_profile_free(&p);
    return 0;
}
