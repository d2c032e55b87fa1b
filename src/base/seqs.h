/* seqs.h - the rule every engine checks in a batch of several sequences (continuous batching):
 * token t belongs to sequence seq[t] at position pos[t]; a sequence's tokens come in order at
 * consecutive positions. */
#ifndef HM_BASE_SEQS_H
#define HM_BASE_SEQS_H

#include <stdint.h>

#include "base/status.h"

/* HM_OK when every seq[t] < n_seq, pos[t] < n_ctx and each sequence's positions follow one
 * another; else HM_ERR_ARG naming the token (who: the engine, for the message). *n_want: the
 * tokens with want[t] != 0 (want NULL: 0). */
hm_status hm_seqs_check(const int32_t *seq, const int32_t *pos, const uint8_t *want, int n,
                        int n_seq, int n_ctx, const char *who, int *n_want, hm_error *err);

#endif
