/* fuzz_learn.c - libFuzzer target for the learn-file reader: any bytes must be either read or
 * refused with a message naming the origin, never crash, leak or read out of bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe/learn_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moe_learn l;
    hm_error err;
    hm_status st = moe_learn_parse((const char *)data, size, "fuzz", &l, &err);
    if (st != HM_OK && strncmp(err.msg, "fuzz", 4) != 0) abort(); /* every message names it */
    if (st == HM_OK) {
        /* what the reader promises: arrays of the stated sizes with consistent sums */
        uint64_t max_tokens = 0;
        for (int i = 0; i < l.n_layer; i++) {
            uint64_t sum = 0;
            for (int e = 0; e < l.n_expert; e++) sum += l.layers[i].experts[e];
            if (sum != l.layers[i].expert_hits_total) abort();
            if (l.layers[i].tokens > max_tokens) max_tokens = l.layers[i].tokens;
        }
        if (max_tokens != l.total_tokens || l.n_expert_used > l.n_expert) abort();
    }
    moe_learn_free(&l);
    return 0;
}
