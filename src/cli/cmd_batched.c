/* cmd_batched.c - `hotmoe batched-bench`: several sequences decoded together (continuous
 * batching, runtime/context.h: hm_decode_seqs), timed like llama-batched-bench: for each
 * combination of -npp (prompt tokens per sequence), -ntg (generated tokens per sequence) and -npl
 * (sequences), the prompts of all sequences, then -ntg steps of one token per sequence.
 *
 * DESIGN: one context with as many sequences as the largest -npl, -c split between them (by
 * default each gets the longest npp + ntg);
 * a test clears the sequences it uses. Prompts are seeded pseudo-random ids read in batches of -b
 * tokens (whole sequences' prompts in order); a step's token for a sequence is the argmax of its
 * previous row. A warm-up (one sequence, up to 32 prompt tokens and one step) runs first, untimed. Columns as
 * llama-batched-bench: PP, TG, B, N_KV (B x (PP + TG)), T_PP and S_PP (B x PP / T_PP), T_TG and
 * S_TG (B x TG / T_TG), T and S (N_KV / T).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "cli/engine.h"

#define CMD "batched-bench"
#define MAX_LIST 16

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* "N[,N...]" of positive ints into v (at most MAX_LIST); the count, or -1. */
static int parse_list(const char *s, int *v) {
    int n = 0;
    while (s && *s && n < MAX_LIST) {
        char *end;
        const long x = strtol(s, &end, 10);
        if (end == s || x < 1 || x > 1 << 20 || (*end && *end != ',')) return -1;
        v[n++] = (int)x;
        s = *end ? end + 1 : end;
    }
    return s && *s ? -1 : n;
}

static int32_t argmax(const float *row, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[b]) b = i;
    return b;
}

typedef struct {
    hm_context *ctx;
    int n_vocab, n_batch;
    int32_t *tok, *seq; /* [n_batch] */
    uint8_t *want;      /* [n_batch] */
    float *logits;      /* [max npl][n_vocab] */
    int32_t *next;      /* [max npl] each sequence's next token */
} runner;

/* B sequences: npp prompt tokens each (batches of n_batch), then ntg steps of B tokens; the two
 * times in tp, tg. */
static hm_status run_test(runner *r, int npp, int ntg, int B, uint64_t *rng, double *tp,
                          double *tg, hm_error *err) {
    hm_status st = HM_OK;
    for (int s = 0; s < B && st == HM_OK; s++) st = hm_context_seq_clear(r->ctx, s, err);
    double t0 = now_s();
    int m = 0;
    for (int s = 0; s < B && st == HM_OK; s++)
        for (int i = 0; i < npp && st == HM_OK; i++) {
            *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
            r->tok[m] = (int32_t)((*rng >> 33) % (uint64_t)r->n_vocab);
            r->seq[m] = s;
            r->want[m++] = i == npp - 1;
            if (m == r->n_batch || (s == B - 1 && i == npp - 1)) {
                st = hm_decode_seqs(r->ctx, r->tok, r->seq, m, r->want, r->logits, err);
                for (int k = 0, w = 0; st == HM_OK && k < m; k++) /* each prompt's last row */
                    if (r->want[k]) r->next[r->seq[k]] = argmax(r->logits + (size_t)w++ * r->n_vocab,
                                                                 r->n_vocab);
                m = 0;
            }
        }
    *tp = now_s() - t0;
    t0 = now_s();
    for (int step = 0; step < ntg && st == HM_OK; step++) {
        for (int s = 0; s < B; s++) r->tok[s] = r->next[s], r->seq[s] = s, r->want[s] = 1;
        st = hm_decode_seqs(r->ctx, r->tok, r->seq, B, r->want, r->logits, err);
        for (int s = 0; st == HM_OK && s < B; s++)
            r->next[s] = argmax(r->logits + (size_t)s * r->n_vocab, r->n_vocab);
    }
    *tg = now_s() - t0;
    return st;
}

int cmd_batched(int argc, char **argv) {
    const char *npp_s = "128", *ntg_s = "128", *npl_s = "1,2,4,8,16";
    const cli_arg_spec extra[] = {
        {"-npp", NULL, CLI_ARG_STR, &npp_s, "N[,...]", "prompt tokens per sequence (default: 128)"},
        {"-ntg", NULL, CLI_ARG_STR, &ntg_s, "N[,...]",
         "generated tokens per sequence (default: 128)"},
        {"-npl", NULL, CLI_ARG_STR, &npl_s, "N[,...]",
         "sequences decoded together (default: 1,2,4,8,16)"},
    };
    const cli_args_def def = {CMD, "-m MODEL [-npp N,...] [-ntg N,...] [-npl N,...] [options]",
                              "Several sequences decoded together (continuous batching), as "
                              "llama-batched-bench: every combination of -npp, -ntg and -npl, "
                              "one row each: prompt and generation times and tokens/s summed "
                              "over the sequences.",
                              CLI_ARGS_MODEL | CLI_ARGS_CONTEXT | CLI_ARGS_THREADS, extra,
                              sizeof(extra) / sizeof(extra[0])};
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    int npp[MAX_LIST], ntg[MAX_LIST], npl[MAX_LIST];
    const int n_pp = parse_list(npp_s, npp), n_tg = parse_list(ntg_s, ntg),
              n_pl = parse_list(npl_s, npl);
    if (n_pp < 1 || n_tg < 1 || n_pl < 1) {
        fprintf(stderr, "hotmoe " CMD ": -npp, -ntg and -npl take comma lists of positive "
                "numbers (at most %d each)\n", MAX_LIST);
        return 2;
    }
    int max_pl = 1, max_len = 1;
    for (int i = 0; i < n_pl; i++) max_pl = npl[i] > max_pl ? npl[i] : max_pl;
    for (int i = 0; i < n_pp; i++)
        for (int j = 0; j < n_tg; j++)
            max_len = npp[i] + ntg[j] > max_len ? npp[i] + ntg[j] : max_len;
    /* -c is every sequence's together (llama-batched-bench's KV size); by default each gets the
     * longest test (16 at least: the engine's smallest share) */
    if (a.n_ctx <= 0) a.n_ctx = (max_len < 16 ? 16 : max_len) * max_pl;
    a.n_seq = max_pl;
    cli_engine e;
    rc = cli_engine_open(&e, CMD, &a, 0, 0);
    if (rc) return rc;
    runner r = {.ctx = e.ctx, .n_vocab = e.n_vocab, .n_batch = hm_context_n_batch(e.ctx)};
    r.tok = malloc(sizeof(int32_t) * (size_t)r.n_batch);
    r.seq = malloc(sizeof(int32_t) * (size_t)r.n_batch);
    r.want = malloc((size_t)r.n_batch);
    r.logits = malloc(sizeof(float) * (size_t)(r.n_batch > max_pl ? r.n_batch : max_pl) *
                      (size_t)r.n_vocab);
    r.next = calloc((size_t)max_pl, sizeof(int32_t));
    hm_error err = {0};
    hm_status st = r.tok && r.seq && r.want && r.logits && r.next
                       ? HM_OK
                       : hm_error_set(&err, HM_ERR_NOMEM, "out of memory");
    if (st == HM_OK && max_len > hm_context_n_ctx(e.ctx))
        st = hm_error_set(&err, HM_ERR_ARG, "a sequence of %d tokens does not fit %d positions "
                          "(-c is split between %d sequences)", max_len,
                          hm_context_n_ctx(e.ctx), max_pl);
    if (st == HM_OK && max_pl > r.n_batch)
        st = hm_error_set(&err, HM_ERR_ARG, "-npl %d is larger than the batch (-b %d)", max_pl,
                          r.n_batch);
    uint64_t rng = 42;
    double tp, tg;
    if (st == HM_OK) /* warm-up: fits, as the first test does */
        st = run_test(&r, npp[0] < 32 ? npp[0] : 32, 1, 1, &rng, &tp, &tg, &err);
    if (st == HM_OK)
        printf("|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |"
               "      T s |    S t/s |\n|-------|--------|------|--------|----------|----------|"
               "----------|----------|----------|----------|\n");
    for (int i = 0; i < n_pp && st == HM_OK; i++)
        for (int j = 0; j < n_tg && st == HM_OK; j++)
            for (int k = 0; k < n_pl && st == HM_OK; k++) {
                const int B = npl[k];
                st = run_test(&r, npp[i], ntg[j], B, &rng, &tp, &tg, &err);
                if (st != HM_OK) break;
                const int n_kv = B * (npp[i] + ntg[j]);
                printf("| %5d | %6d | %4d | %6d | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |\n",
                       npp[i], ntg[j], B, n_kv, tp, B * npp[i] / tp, tg, B * ntg[j] / tg, tp + tg,
                       n_kv / (tp + tg));
                fflush(stdout);
            }
    if (st != HM_OK) fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
    free(r.tok);
    free(r.seq);
    free(r.want);
    free(r.logits);
    free(r.next);
    cli_engine_close(&e);
    return st == HM_OK ? 0 : 1;
}
