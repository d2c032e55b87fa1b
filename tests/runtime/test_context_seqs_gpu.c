/* test_context_seqs_gpu.c - several sequences on GPU contexts (hm_decode_seqs through
 * cuda_engine_decode_seqs: continuous batching on the GPU), no GPU: skipped. For tiny-qwen3moe
 * (q8_0) and tiny-gpt-oss (mxfp4: sliding window, sinks), all on the GPU and tiered
 * (--cpu-moe): three sequences interleaved in steps of at most 8 tokens (a whole prompt of one
 * beside single tokens of the others, rotating order) against each sequence alone on a
 * one-sequence context of the same placement (its prompt in one call, then one token per call):
 * the same greedy tokens and the same logits, byte for byte (decode-sized steps take the same
 * kernels per row whatever the batch; the per-run attention has the arguments of a one-sequence
 * step of that run); the slots (runtime/slots.h) on such a context too; -np with a split
 * placement refused. Host checks: none. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "context_test_util.h"
#include "harness.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/generate.h"
#include "runtime/slots.h"

#define N_SEQ 3
#define N_TOK 10
#define N_CTX 64

static hm_context *open_ctx(const hm_model *m, bool tiered, int n_seq) {
    hm_context_params p = hm_context_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 2;
    p.n_gpu_layers = 99;
    p.cpu_moe = tiered;
    p.n_seq = n_seq;
    p.n_batch = 8; /* steps of at most 8 tokens: the decode kernels for every row */
    hm_context *c = NULL;
    hm_error err;
    const hm_status st = hm_context_init(m, &p, &c, &err);
    HM_CHECK_MSG(st == HM_OK && hm_context_gpu(c) && !hm_context_tiered(c) == !tiered,
                 "%s, %d sequences: %s", tiered ? "tiered" : "all on the GPU", n_seq,
                 st == HM_OK ? "not the placement asked" : err.msg);
    return st == HM_OK ? c : NULL;
}

static void check_one(const char *preset, forge_mix mix, bool tiered) {
    char path[512];
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(ft_forged("seqsgpu", preset, mix, path, sizeof(path)));
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    const int plen[N_SEQ] = {4, 2, 5};
    int32_t toks[N_SEQ][N_TOK], got[N_SEQ][N_TOK];
    float *ref = calloc((size_t)N_SEQ * N_TOK * (size_t)V, sizeof(float));
    float *rows = calloc((size_t)8 * (size_t)V, sizeof(float));
    HM_REQUIRE(ref && rows);
    hm_context *c1 = open_ctx(m, tiered, 1);
    HM_REQUIRE(c1);
    for (int s = 0; s < N_SEQ; s++) {
        for (int i = 0; i < plen[s]; i++) toks[s][i] = 5 + 37 * s + 11 * i;
        HM_REQUIRE(ctu_greedy(c1, toks[s], plen[s], N_TOK, V,
                              ref + (size_t)s * N_TOK * (size_t)V, toks[s]));
    }
    hm_context_free(c1);
    hm_context *c = open_ctx(m, tiered, N_SEQ);
    HM_REQUIRE(c);
    int next[N_SEQ] = {0, 0, 0};
    const int start[N_SEQ] = {0, 1, 3};
    int bad_tok = 0, bad_bytes = 0, rows_n = 0;
    double max_diff = 0, max_ref = 0;
    for (int step = 0; step < 16; step++) {
        int32_t tok[8], sq[8];
        uint8_t want[8];
        int src[8], n = 0, nw = 0;
        for (int k = 0; k < N_SEQ; k++) {
            const int s = (k + step) % N_SEQ;
            if (step < start[s] || next[s] >= N_TOK) continue;
            const int cnt = next[s] == 0 ? plen[s] : 1;
            for (int i = 0; i < cnt; i++, n++) {
                tok[n] = next[s] + i < plen[s] ? toks[s][next[s] + i] : got[s][next[s] + i];
                sq[n] = s;
                want[n] = i == cnt - 1;
                if (want[n]) src[nw++] = s;
            }
            next[s] += cnt;
        }
        if (n == 0) continue;
        HM_REQUIRE(n <= 8);
        const hm_status st = hm_decode_seqs(c, tok, sq, n, want, rows, &err);
        HM_CHECK_MSG(st == HM_OK, "%s step %d: %s", preset, step, err.msg);
        if (st != HM_OK) break;
        for (int w = 0; w < nw; w++, rows_n++) {
            const int s = src[w], t = next[s] - 1; /* the row of sequence s's token t */
            const float *a = rows + (size_t)w * (size_t)V;
            const float *b = ref + ((size_t)s * N_TOK + (size_t)t) * (size_t)V;
            bad_bytes += memcmp(a, b, sizeof(float) * (size_t)V) != 0;
            for (int64_t i = 0; i < V; i++) {
                const double d = fabs((double)a[i] - (double)b[i]);
                if (d > max_diff) max_diff = d;
                if (fabs((double)b[i]) > max_ref) max_ref = fabs((double)b[i]);
            }
            if (t + 1 < N_TOK) {
                got[s][t + 1] = tu_argmax(a, V);
                bad_tok += got[s][t + 1] != toks[s][t + 1];
            }
        }
    }
    for (int s = 0; s < N_SEQ; s++)
        for (int i = 0; i < plen[s]; i++) got[s][i] = toks[s][i];
    printf("%s %s: %d rows, %d differ in bytes (max |diff| %.3g of max |logit| %.3g), %d tokens "
           "differ\n", preset, tiered ? "tiered" : "full GPU", rows_n, bad_bytes, max_diff,
           max_ref, bad_tok);
    HM_CHECK_MSG(bad_tok == 0 && bad_bytes == 0 && rows_n == N_SEQ * (N_TOK + 1) - 11,
                 "%s %s: %d rows (want %d), %d differ in bytes (max |diff| %.3g), %d tokens "
                 "differ", preset, tiered ? "tiered" : "full GPU", rows_n,
                 N_SEQ * (N_TOK + 1) - 11, bad_bytes, max_diff, bad_tok);
    /* the slots on this context: greedy, the same tokens as alone */
    hm_slots *sl = NULL;
    HM_REQUIRE(hm_slots_init(c, &sl, &err) == HM_OK);
    sample_params sp = sample_params_default();
    sp.temperature = 0;
    int n_got[N_SEQ] = {0}, mism = 0;
    for (int step = 0; step < 32; step++) {
        int32_t out[N_SEQ];
        if (step < N_SEQ) /* slot s starts before step s: no prompt is cut into pieces */
            HM_REQUIRE(hm_slots_start(sl, step, toks[step], plen[step], &sp, &err) == HM_OK);
        bool any = false;
        for (int s = 0; s < N_SEQ; s++) any = any || hm_slots_active(sl, s);
        if (!any) break;
        HM_REQUIRE(hm_slots_step(sl, out, &err) == HM_OK);
        for (int s = 0; s < N_SEQ; s++) {
            if (out[s] < 0) continue;
            mism += out[s] != toks[s][plen[s] + n_got[s]];
            if (plen[s] + ++n_got[s] == N_TOK) hm_slots_stop(sl, s);
        }
    }
    HM_CHECK_MSG(mism == 0 && n_got[0] == N_TOK - plen[0] && n_got[2] == N_TOK - plen[2],
                 "%s %s slots: %d tokens differ", preset, tiered ? "tiered" : "full GPU", mism);
    hm_slots_free(sl);
    hm_context_free(c);
    free(ref);
    free(rows);
    hm_model_free(m);
}

static void test_seqs(void) {
    if (!tu_have_gpu()) return;
    setenv("HOTMOE_CALIBRATE", "0", 1);
    for (int tiered = 0; tiered < 2; tiered++) {
        check_one("tiny-qwen3moe", FORGE_MIX_Q8_0, tiered);
        check_one("tiny-gpt-oss", FORGE_MIX_MXFP4, tiered);
    }
    /* a split placement (a partial -ngl) runs one sequence */
    char path[512];
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(ft_forged("seqsgpu", "tiny-qwen3moe", FORGE_MIX_Q8_0, path, sizeof(path)));
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    hm_context_params p = hm_context_default_params();
    p.n_ctx = N_CTX;
    p.n_gpu_layers = 2;
    p.n_seq = 2;
    hm_context *c = NULL;
    HM_CHECK(hm_context_init(m, &p, &c, &err) == HM_ERR_UNSUPPORTED && !c &&
             strstr(err.msg, "-np 2"));
    hm_model_free(m);
}

TU_TEST_MAIN(test_seqs)
