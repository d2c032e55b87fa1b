/* test_slots.c - continuous batching (runtime/slots.h) on CPU contexts of several sequences: three
 * slots started at different steps, sampling at temperature 0.8 with their own seeds, give token
 * for token what a generator (runtime/generate.h) on a one-sequence context gives for the same
 * prompt and seed; a slot stopped and started again with another prompt too, and with a prompt
 * that continues its cache (reused, the same tokens); on a hybrid model (a recurrent state) the
 * same, and a prompt that leaves the cache early read again from the state's checkpoint. Also: a batch
 * smaller than the prompts (prompts read in chunks beside the others' tokens), the room left,
 * argument errors, the sequence count's bounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "harness.h"
#include "runtime/generate.h"
#include "runtime/slots.h"

#define N_GEN 20
#define N_CTX 64

static hm_model *g_model;
static const char *g_preset = "tiny-qwen3moe"; /* the model every test uses (set, then reload) */

static hm_model *model(void) {
    char path[512];
    hm_error err;
    if (!g_model && (!ft_forged("slots", g_preset, FORGE_MIX_Q8_0, path, sizeof(path)) ||
                     hm_model_load(path, NULL, &g_model, &err) != HM_OK))
        g_model = NULL;
    return g_model;
}

static hm_context *ctx_of(int n_seq, int n_batch) {
    hm_context_params p = hm_context_default_params();
    p.n_ctx = N_CTX;
    p.n_batch = n_batch;
    p.n_ubatch = 8;
    p.n_threads = 2;
    p.n_seq = n_seq;
    hm_context *c = NULL;
    hm_error err;
    const hm_status st = hm_context_init(model(), &p, &c, &err);
    HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
    return c;
}

static sample_params sp_of(uint64_t seed) {
    sample_params sp = sample_params_default();
    sp.temperature = 0.8f;
    sp.seed = seed;
    return sp;
}

static void prompt_of(int32_t *ids, int n, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((x >> 33) % 900);
    }
}

/* The generator's tokens for a prompt and seed on a fresh one-sequence context. */
static void reference(const int32_t *prompt, int n, uint64_t seed, int32_t *toks) {
    hm_context *c = ctx_of(1, 32);
    HM_REQUIRE(c);
    hm_gen *g = NULL;
    hm_error err;
    const sample_params sp = sp_of(seed);
    HM_REQUIRE(hm_gen_init(c, &sp, NULL, &g, &err) == HM_OK);
    HM_REQUIRE(hm_gen_prompt(g, prompt, n, &err) == HM_OK);
    for (int i = 0; i < N_GEN; i++) HM_REQUIRE(hm_gen_next(g, &toks[i], &err) == HM_OK);
    hm_gen_free(g);
    hm_context_free(c);
}

static void test_interleaved(void) {
    HM_REQUIRE(model());
    enum { NS = 3, NJ = 4 }; /* 3 slots, 4 jobs: the fourth reuses slot 1 */
    const int plen[NJ] = {11, 5, 19, 7}, start_step[NJ] = {0, 2, 3, -1}, slot_of[NJ] = {0, 1, 2, 1};
    int32_t prompt[NJ][32], want[NJ][N_GEN], got[NJ][N_GEN];
    for (int j = 0; j < NJ; j++) {
        prompt_of(prompt[j], plen[j], 1000 + (uint64_t)j);
        reference(prompt[j], plen[j], 40 + (uint64_t)j, want[j]);
    }
    /* a batch of 8: the 19-token prompt is read in chunks beside the other slots' tokens */
    hm_context *c = ctx_of(NS, 8);
    HM_REQUIRE(c);
    hm_slots *s = NULL;
    hm_error err;
    HM_REQUIRE(hm_slots_init(c, &s, &err) == HM_OK);
    HM_CHECK(hm_slots_count(s) == NS);
    int n_got[NJ] = {0}, job_in[NS] = {-1, -1, -1}, started = 0, steps = 0;
    bool done[NJ] = {false};
    while (!done[0] || !done[1] || !done[2] || !done[3]) {
        HM_REQUIRE(steps < 200);
        for (int j = 0; j < NJ; j++) { /* arrivals: by step, the fourth when slot 1 frees */
            const int k = slot_of[j];
            const bool due = start_step[j] >= 0 ? steps == start_step[j] : done[1] && job_in[k] < 0;
            if (!due || done[j] || job_in[k] == j || n_got[j] > 0) continue;
            if (job_in[k] >= 0) continue;
            const sample_params sp = sp_of(40 + (uint64_t)j);
            HM_REQUIRE(hm_slots_start(s, k, prompt[j], plen[j], &sp, &err) == HM_OK);
            job_in[k] = j;
            started++;
        }
        int32_t out[NS];
        const hm_status st = hm_slots_step(s, out, &err);
        HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
        HM_REQUIRE(st == HM_OK);
        steps++;
        for (int k = 0; k < NS; k++) {
            const int j = job_in[k];
            if (j < 0 || out[k] < 0) continue;
            got[j][n_got[j]++] = out[k];
            if (n_got[j] == N_GEN) {
                hm_slots_stop(s, k);
                HM_CHECK(!hm_slots_active(s, k));
                job_in[k] = -1;
                done[j] = true;
            }
        }
    }
    HM_CHECK(started == NJ);
    for (int j = 0; j < NJ; j++)
        HM_CHECK_MSG(!memcmp(got[j], want[j], sizeof(want[j])), "job %d (slot %d): the tokens "
                     "differ from the generator's alone", j, slot_of[j]);
    int32_t out[NS];
    HM_CHECK(hm_slots_step(s, out, &err) == HM_ERR_STATE); /* nothing active */
    const sample_params sp = sp_of(1);
    HM_CHECK(hm_slots_start(s, NS, prompt[0], 3, &sp, &err) == HM_ERR_ARG);
    HM_CHECK(hm_slots_start(s, 0, prompt[0], 0, &sp, &err) == HM_ERR_ARG);
    int32_t big[N_CTX];
    prompt_of(big, N_CTX, 9);
    HM_CHECK(hm_slots_start(s, 0, big, N_CTX, &sp, &err) == HM_ERR_ARG);
    /* room: a prompt of n_ctx - 3 tokens leaves 3 tokens to hand out */
    HM_REQUIRE(hm_slots_start(s, 0, big, N_CTX - 3, &sp, &err) == HM_OK);
    HM_CHECK(hm_slots_room(s, 0) == 3);
    int n = 0;
    for (int i = 0; i < 20 && hm_slots_room(s, 0) > 0; i++) {
        HM_REQUIRE(hm_slots_step(s, out, &err) == HM_OK);
        n += out[0] >= 0;
    }
    HM_CHECK_MSG(n == 3 && hm_slots_room(s, 0) == 0, "%d tokens, room %d", n, hm_slots_room(s, 0));
    hm_slots_free(s);
    hm_context_free(c);
}

/* A chat that goes on: a second request whose prompt is the first's prompt and reply plus a new
 * turn picks that slot, finds those 18 tokens in its cache (not read again: fewer steps' worth
 * of tokens), and gives the generator's tokens for the whole prompt on a fresh context. */
static void test_reuse(void) {
    HM_REQUIRE(model());
    hm_context *c = ctx_of(2, 32);
    HM_REQUIRE(c);
    hm_slots *s = NULL;
    hm_error err;
    HM_REQUIRE(hm_slots_init(c, &s, &err) == HM_OK);
    int32_t a[10], b[21], want[N_GEN], got[N_GEN], out[2];
    prompt_of(a, 10, 77);
    const sample_params sp = sp_of(5);
    HM_REQUIRE(hm_slots_start(s, 1, a, 10, &sp, &err) == HM_OK); /* the first request: slot 1 */
    int n = 0;
    while (n < 8) {
        HM_REQUIRE(hm_slots_step(s, out, &err) == HM_OK);
        if (out[1] >= 0) b[10 + n++] = out[1];
    }
    hm_slots_stop(s, 1); /* the 8th token was handed out, not run: 17 tokens cached */
    memcpy(b, a, sizeof(a));
    prompt_of(b + 18, 3, 78);
    HM_CHECK(hm_slots_pick(s, b, 21) == 1);
    HM_REQUIRE(hm_slots_start(s, 1, b, 21, &sp, &err) == HM_OK);
    HM_CHECK_MSG(hm_slots_cached(s, 1) == 17, "cached %d", hm_slots_cached(s, 1));
    for (n = 0; n < N_GEN;) {
        HM_REQUIRE(hm_slots_step(s, out, &err) == HM_OK);
        if (out[1] >= 0) got[n++] = out[1];
    }
    reference(b, 21, 5, want);
    HM_CHECK_MSG(!memcmp(got, want, sizeof(want)), "a continued chat: the tokens differ from the "
                 "generator's on the whole prompt");
    /* forgotten (cache_prompt false): the whole prompt read again, the same tokens */
    hm_slots_stop(s, 1);
    hm_slots_forget(s, 1);
    HM_REQUIRE(hm_slots_start(s, 1, b, 21, &sp, &err) == HM_OK);
    HM_CHECK(hm_slots_cached(s, 1) == 0);
    for (n = 0; n < N_GEN;) {
        HM_REQUIRE(hm_slots_step(s, out, &err) == HM_OK);
        if (out[1] >= 0) got[n++] = out[1];
    }
    HM_CHECK(!memcmp(got, want, sizeof(want)));
    hm_slots_free(s);
    hm_context_free(c);
}

/* A recurrent state cannot be cut (docs/HYBRID.md): on tiny-qwen3next a request that continues
 * exactly what its slot holds reuses it, one that leaves it earlier goes back to the checkpoint
 * its first prompt left (10 tokens) and reads the rest again; both give the generator's tokens
 * on the whole prompt. */
static void test_reuse_hybrid(void) {
    hm_model_free(g_model);
    g_model = NULL;
    g_preset = "tiny-qwen3next";
    HM_REQUIRE(model());
    hm_context *c = ctx_of(2, 32);
    HM_REQUIRE(c);
    hm_slots *s = NULL;
    hm_error err;
    HM_REQUIRE(hm_slots_init(c, &s, &err) == HM_OK);
    int32_t a[10], b[21], want[N_GEN], got[N_GEN], out[2];
    prompt_of(a, 10, 91);
    const sample_params sp = sp_of(7);
    for (int pass = 0; pass < 2; pass++) { /* 0: continues the 17 cached; 1: leaves at 12 */
        HM_REQUIRE(hm_slots_start(s, 0, a, 10, &sp, &err) == HM_OK);
        int n = 0;
        while (n < 8) {
            HM_REQUIRE(hm_slots_step(s, out, &err) == HM_OK);
            if (out[0] >= 0) b[10 + n++] = out[0];
        }
        hm_slots_stop(s, 0);
        memcpy(b, a, sizeof(a));
        prompt_of(b + 18, 3, 92);
        if (pass == 1) b[12] ^= 1;
        HM_REQUIRE(hm_slots_start(s, 0, b, 21, &sp, &err) == HM_OK);
        HM_CHECK_MSG(hm_slots_cached(s, 0) == (pass ? 10 : 17), "pass %d: cached %d", pass,
                     hm_slots_cached(s, 0)); /* 10: the checkpoint at the first prompt's end */
        for (n = 0; n < N_GEN;) {
            HM_REQUIRE(hm_slots_step(s, out, &err) == HM_OK);
            if (out[0] >= 0) got[n++] = out[0];
        }
        reference(b, 21, 7, want);
        HM_CHECK_MSG(!memcmp(got, want, sizeof(want)), "hybrid pass %d: the tokens differ from "
                     "the generator's on the whole prompt", pass);
        hm_slots_stop(s, 0);
    }
    hm_slots_free(s);
    hm_context_free(c);
    hm_model_free(g_model);
    g_model = NULL;
    g_preset = "tiny-qwen3moe";
}

static void test_bounds(void) {
    HM_REQUIRE(model());
    hm_context_params p = hm_context_default_params();
    p.n_ctx = N_CTX;
    p.n_seq = 300;
    hm_context *c = NULL;
    hm_error err;
    HM_CHECK(hm_context_init(model(), &p, &c, &err) == HM_ERR_ARG && !c);
    c = ctx_of(2, 16);
    HM_REQUIRE(c);
    HM_CHECK(hm_context_n_seq(c) == 2 && hm_context_seq_n_past(c, 1) == 0 &&
             hm_context_seq_n_past(c, 2) == -1);
    int32_t t[2] = {5, 6}, sq[2] = {1, 2};
    HM_CHECK(hm_decode_seqs(c, t, sq, 2, NULL, NULL, &err) == HM_ERR_ARG);
    sq[1] = 1;
    HM_CHECK(hm_decode_seqs(c, t, sq, 2, NULL, NULL, &err) == HM_OK &&
             hm_context_seq_n_past(c, 1) == 2 && hm_context_n_past(c) == 0);
    HM_CHECK(hm_context_seq_clear(c, 1, &err) == HM_OK && hm_context_seq_n_past(c, 1) == 0);
    hm_context_free(c);
}

static void test_cleanup(void) {
    hm_model_free(g_model);
    g_model = NULL;
}

HM_TEST_MAIN(test_interleaved, test_reuse, test_reuse_hybrid, test_bounds, test_cleanup)
