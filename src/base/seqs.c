/* seqs.c - the batch rule of several sequences (seqs.h). */
#include "base/seqs.h"

#include <stddef.h>

hm_status hm_seqs_check(const int32_t *seq, const int32_t *pos, const uint8_t *want, int n,
                        int n_seq, int n_ctx, const char *who, int *n_want, hm_error *err) {
    *n_want = 0;
    for (int t = 0; t < n; t++) {
        if (seq[t] < 0 || seq[t] >= n_seq || pos[t] < 0 || pos[t] >= n_ctx)
            return hm_error_set(err, HM_ERR_ARG, "%s: token %d: sequence %d, position %d (%d "
                                "sequences of %d positions)", who, t, seq[t], pos[t], n_seq,
                                n_ctx);
        for (int u = t - 1; u >= 0; u--) /* the sequence's previous token in this batch */
            if (seq[u] == seq[t]) {
                if (pos[t] != pos[u] + 1)
                    return hm_error_set(err, HM_ERR_ARG, "%s: sequence %d: position %d after %d "
                                        "in one batch", who, seq[t], pos[t], pos[u]);
                break;
            }
        *n_want += want && want[t];
    }
    return HM_OK;
}
