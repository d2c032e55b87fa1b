/* context_test_util.h - helpers shared by the context tests: a greedy run of one sequence. */
#ifndef HM_TESTS_CONTEXT_UTIL_H
#define HM_TESTS_CONTEXT_UTIL_H

#include <string.h>

#include "../cuda/cuda_test_util.h"
#include "harness.h"
#include "runtime/context.h"

/* c reset, prompt [plen] in one call, then greedy steps one token per call up to n_tok
 * tokens: logits rows plen-1 .. n_tok-1 of lo [n_tok][V] filled, toks [n_tok] the prompt and
 * the greedy tokens. false (a failed check said why) on an error. */
static inline bool ctu_greedy(hm_context *c, const int32_t *prompt, int plen, int n_tok,
                              int64_t V, float *lo, int32_t *toks) {
    hm_error err;
    hm_context_reset(c);
    if (hm_decode(c, prompt, plen, 0, lo + (size_t)(plen - 1) * (size_t)V, HM_LOGITS_LAST,
                  &err) != HM_OK) {
        HM_CHECK_MSG(false, "prompt: %s", err.msg);
        return false;
    }
    memmove(toks, prompt, sizeof(int32_t) * (size_t)plen);
    for (int t = plen; t < n_tok; t++) {
        toks[t] = tu_argmax(lo + (size_t)(t - 1) * (size_t)V, V);
        if (hm_decode(c, &toks[t], 1, t, lo + (size_t)t * (size_t)V, HM_LOGITS_LAST, &err) !=
            HM_OK) {
            HM_CHECK_MSG(false, "step %d: %s", t, err.msg);
            return false;
        }
    }
    return true;
}

#endif
