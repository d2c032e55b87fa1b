/* test_routing_stats.c - the routing statistics accumulator and the routing profile file
 * (src/moe/routing_stats.h, docs/ROUTING.md): hand-made routing sequences whose figures are
 * derived by hand in the comments; a random routing history checked against naive reference
 * implementations (an explicit LRU cache per size, a scan of the previous rows per distance);
 * the same figures whatever the call chunking; JSON round trips (every field, byte-identical
 * re-write); partial profiles (the published Qwen3-30B-A3B file); a table of malformed files,
 * each refused with a message naming the origin and the field. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "harness.h"
#include "moe/routing_stats.h"

static moe_routing_stats *new_stats(int nl, int ne, int nu) {
    moe_routing_stats *s = NULL;
    hm_error err;
    if (moe_routing_stats_init(&s, nl, ne, nu, &err) != HM_OK) {
        fprintf(stderr, "init: %s\n", err.msg);
        return NULL;
    }
    return s;
}

static bool profile_of(const moe_routing_stats *s, moe_routing_profile *p) {
    hm_error err;
    if (moe_routing_stats_profile(s, "test", p, &err) != HM_OK) {
        fprintf(stderr, "profile: %s\n", err.msg);
        return false;
    }
    return true;
}

/* The profile's JSON text (malloc'd), or NULL. */
static char *json_of(const moe_routing_profile *p, bool pretty) {
    hm_json j;
    hm_json_init_buf(&j, pretty);
    moe_routing_profile_write_json(p, &j);
    hm_error err;
    char *out = NULL;
    if (hm_json_finish(&j, &err) == HM_OK) out = strdup(hm_json_data(&j, NULL));
    else fprintf(stderr, "json: %s\n", err.msg);
    hm_json_free(&j);
    return out;
}

static bool near(double a, double b) { return fabs(a - b) < 1e-12; }

/* Every token selects {3, 5} (8 experts, 2 used, one sequence of 10 tokens).
 *   hits: 3 -> 10, 5 -> 10; selections 20.
 *   top 10 % of 8 experts = ceil(0.8) = 1 expert: 10/20 = 0.5; top 25 % = 2 experts: 1.0;
 *   top 50 % = 4 experts: 1.0.
 *   experts for 50 %: need ceil(10) = 10 -> 1; 90 %: need 18 -> 2; 99 %: need ceil(19.8) = 20 -> 2.
 *   repeat at distance 1: tokens 1..9 are considered (9 x 2 = 18 selections), all repeat -> 1.0;
 *   <= 4: tokens 4..9 (12 selections) -> 1.0; <= 8: tokens 8, 9 (4 selections) -> 1.0.
 *   LRU (capacities for 8 experts: 10 % -> 1, 20 % -> 2, 30 % -> 3, 40 % -> 4, 50 % -> 4,
 *   60 % -> 5, 70 % -> 6, 80 % -> 7, 90 % -> 8): with C = 1 the token's two experts evict each
 *   other, so every access misses (0/20); with C >= 2 = n_used everything but the first two
 *   accesses hits: 18/20 = 0.9. */
static void test_repeat_every_token(void) {
    moe_routing_stats *s = new_stats(1, 8, 2);
    HM_REQUIRE(s);
    int32_t ids[20];
    for (int t = 0; t < 10; t++) ids[2 * t] = 3, ids[2 * t + 1] = 5;
    moe_routing_stats_begin_sequence(s);
    moe_routing_stats_record(s, 0, 10, 2, ids, NULL);
    moe_routing_profile p;
    HM_REQUIRE(profile_of(s, &p));
    const moe_routing_layer *y = &p.layers[0];
    HM_CHECK(p.tokens == 10 && p.sequences == 1 && p.rejected == 0);
    HM_CHECK(y->tokens == 10 && y->selections == 20 && y->hits[3] == 10 && y->hits[5] == 10);
    HM_CHECK(near(y->f.top_share[0], 0.5) && near(y->f.top_share[1], 1) && near(y->f.top_share[2], 1));
    HM_CHECK(y->f.experts_for[0] == 1 && y->f.experts_for[1] == 2 && y->f.experts_for[2] == 2);
    HM_CHECK(y->repeat_considered[0] == 18 && y->repeat_hits[0] == 18);
    HM_CHECK(y->repeat_considered[1] == 12 && y->repeat_hits[1] == 12);
    HM_CHECK(y->repeat_considered[2] == 4 && y->repeat_hits[2] == 4);
    HM_CHECK(y->f.repeat[0] == 1 && y->f.repeat[1] == 1 && y->f.repeat[2] == 1);
    HM_CHECK(y->lru_hits[0] == 0 && y->f.lru_hit[0] == 0);
    for (int c = 1; c < MOE_ROUTING_N_LRU; c++)
        HM_CHECK_MSG(y->lru_hits[c] == 18 && near(y->f.lru_hit[c], 0.9), "cache %d: %llu", c,
                     (unsigned long long)y->lru_hits[c]);
    HM_CHECK(isnan(y->f.w_top_share[0]) && !y->weight_mass); /* no weights given */
    /* one layer: the average is the layer's figures */
    HM_CHECK(near(p.avg.lru_hit[3], 0.9) && p.avg.experts_for[1] == 2 && p.avg.top_share[0] == 0.5);
    moe_routing_profile_free(&p);
    moe_routing_stats_free(s);
}

/* 4 experts, 1 used. Sequence A selects 0,1,0,1,0; sequence B (after begin_sequence) 0,0.
 *   distance 1: A's tokens 1..4 are considered, each previous token chose the other expert:
 *   0 hits of 4; B's token 1 repeats B's token 0: 1 of 1 (B's token 0 is not considered: the
 *   history does not cross the sequence start). Total 1/5 = 0.2.
 *   <= 4: only A's token 4 (expert 0, last seen 2 tokens before): 1/1. <= 8: nothing
 *   considered -> unknown (NAN).
 *   LRU (capacities for 4: 10 %, 20 % -> 1; 30..50 % -> 2; 60, 70 % -> 3; 80, 90 % -> 4),
 *   caches are not reset at a sequence start: accesses 0 (miss), 1 (miss), 0, 1, 0 (stack
 *   distance 1 each), 0, 0 (distance 0). C = 1: 2 hits of 7; C >= 2: 5 of 7.
 *   hits 0 -> 5, 1 -> 2: top 10 % (1 expert) 5/7, top 25 % (1) 5/7, top 50 % (2) 1.0;
 *   experts for 50 %: need 4 -> 1; 90 %: need ceil(6.3) = 7 -> 2; 99 %: 7 -> 2. */
static void test_sequences_reset_history(void) {
    moe_routing_stats *s = new_stats(1, 4, 1);
    HM_REQUIRE(s);
    const int32_t a[5] = {0, 1, 0, 1, 0}, b[2] = {0, 0};
    moe_routing_stats_begin_sequence(s);
    moe_routing_stats_record(s, 0, 3, 1, a, NULL); /* A in two calls */
    moe_routing_stats_record(s, 0, 2, 1, a + 3, NULL);
    moe_routing_stats_begin_sequence(s);
    moe_routing_stats_record(s, 0, 2, 1, b, NULL);
    moe_routing_profile p;
    HM_REQUIRE(profile_of(s, &p));
    const moe_routing_layer *y = &p.layers[0];
    HM_CHECK(p.sequences == 2 && p.tokens == 7 && y->selections == 7);
    HM_CHECK(y->repeat_hits[0] == 1 && y->repeat_considered[0] == 5 && near(y->f.repeat[0], 0.2));
    HM_CHECK(y->repeat_hits[1] == 1 && y->repeat_considered[1] == 1 && y->f.repeat[1] == 1);
    HM_CHECK(y->repeat_considered[2] == 0 && isnan(y->f.repeat[2]));
    const uint64_t want_lru[9] = {2, 2, 5, 5, 5, 5, 5, 5, 5};
    for (int c = 0; c < 9; c++)
        HM_CHECK_MSG(y->lru_hits[c] == want_lru[c], "cache %d%%: %llu hits", moe_routing_lru_pct[c],
                     (unsigned long long)y->lru_hits[c]);
    HM_CHECK(near(y->f.top_share[0], 5.0 / 7) && near(y->f.top_share[1], 5.0 / 7) &&
             y->f.top_share[2] == 1);
    HM_CHECK(y->f.experts_for[0] == 1 && y->f.experts_for[1] == 2 && y->f.experts_for[2] == 2);
    HM_CHECK(isnan(p.avg.repeat[2]) && near(p.avg.repeat[0], 0.2));
    moe_routing_profile_free(&p);
    moe_routing_stats_free(s);
}

/* 10 experts, 3 used: tokens {0,1,2}, {3,0,1}, {2,3,4}, in slot order.
 *   LRU recency list after token 0: [2,1,0]. Token 1: 3 misses -> [3,2,1,0]; 0 is at place 3
 *   (hit iff C >= 4) -> [0,3,2,1]; 1 at place 3 -> [1,0,3,2]. Token 2: 2 at place 3 ->
 *   [2,1,0,3]; 3 at place 3 -> [3,2,1,0]; 4 misses. So C = 1, 2, 3 (10..30 %): 0 of 9;
 *   C >= 4 (40 % and up): 4 of 9. A cache smaller than the working set of two tokens thrashes.
 *   distance 1: token 1 (0 and 1 were in token 0: 2 of 3), token 2 (only 3: 1 of 3) -> 3/6. */
static void test_lru_within_token_order(void) {
    moe_routing_stats *s = new_stats(1, 10, 3);
    HM_REQUIRE(s);
    const int32_t ids[9] = {0, 1, 2, 3, 0, 1, 2, 3, 4};
    moe_routing_stats_record(s, 0, 3, 3, ids, NULL); /* no begin_sequence: one implicit sequence */
    moe_routing_profile p;
    HM_REQUIRE(profile_of(s, &p));
    const moe_routing_layer *y = &p.layers[0];
    for (int c = 0; c < 9; c++)
        HM_CHECK_MSG(y->lru_hits[c] == (c < 3 ? 0u : 4u), "cache %d%%: %llu", moe_routing_lru_pct[c],
                     (unsigned long long)y->lru_hits[c]);
    HM_CHECK(y->repeat_hits[0] == 3 && y->repeat_considered[0] == 6 && near(y->f.repeat[0], 0.5));
    HM_CHECK(p.sequences == 1);
    moe_routing_profile_free(&p);
    moe_routing_stats_free(s);
}

/* Skipped slots (-1) are not selections; an id >= n_expert and a layer out of range are counted
 * as rejected (1 + 2 here) and change nothing else. */
static void test_skipped_and_rejected(void) {
    moe_routing_stats *s = new_stats(2, 4, 2);
    HM_REQUIRE(s);
    const int32_t ids[4] = {0, -1, 5, 1}, bad[2] = {0, 1};
    moe_routing_stats_record(s, 0, 2, 2, ids, NULL);
    moe_routing_stats_record(s, 7, 1, 2, bad, NULL);
    moe_routing_stats_record(s, -1, 1, 2, bad, NULL);
    moe_routing_stats_record(NULL, 0, 1, 2, bad, NULL); /* harmless */
    HM_CHECK(moe_routing_stats_rejected(s) == 5);
    HM_CHECK(moe_routing_stats_tokens(s, 0) == 2 && moe_routing_stats_tokens(s, 1) == 0 &&
             moe_routing_stats_tokens(s, 9) == 0);
    moe_routing_profile p;
    HM_REQUIRE(profile_of(s, &p));
    HM_CHECK(p.layers[0].selections == 2 && p.layers[0].hits[0] == 1 && p.layers[0].hits[1] == 1);
    HM_CHECK(p.rejected == 5 && p.tokens == 2);
    /* layer 1 was never recorded: no figures, and it is left out of the average */
    HM_CHECK(p.layers[1].selections == 0 && isnan(p.layers[1].f.top_share[0]));
    HM_CHECK(near(p.avg.top_share[0], p.layers[0].f.top_share[0]));
    moe_routing_profile_free(&p);
    moe_routing_stats_free(s);
    hm_error err;
    HM_CHECK(moe_routing_stats_init(&s, 0, 4, 2, &err) == HM_ERR_ARG && !s);
    HM_CHECK(moe_routing_stats_init(&s, 2, 4, 5, &err) == HM_ERR_ARG && !s);
}

/* Gating weights: layer 0 sees 4 tokens {0: 0.75, 1: 0.25}: weight mass 3.0 and 1.0 (exact in
 * binary), so the top expert holds 0.75 of the weight (0.5 of the counts); experts for 50 %:
 * 3.0 >= 2.0 -> 1; 90 %: 3.0 < 3.6 -> 2. Layer 1 is recorded without weights: its weight
 * figures are unknown and the average of the weight figures is layer 0's. Layer 1's counts
 * differ (expert 2 three times, 3 once: top share 0.75), so the count average is (0.5 + 0.75) / 2. */
static void test_weights_and_average(void) {
    moe_routing_stats *s = new_stats(3, 4, 2);
    HM_REQUIRE(s);
    int32_t ids[8], ids1[8];
    float w[8];
    for (int t = 0; t < 4; t++) {
        ids[2 * t] = 0, ids[2 * t + 1] = 1, w[2 * t] = 0.75f, w[2 * t + 1] = 0.25f;
        ids1[2 * t] = t < 3 ? 2 : 3, ids1[2 * t + 1] = -1;
    }
    moe_routing_stats_record(s, 0, 4, 2, ids, w);
    moe_routing_stats_record(s, 1, 4, 2, ids1, NULL);
    moe_routing_profile p;
    HM_REQUIRE(profile_of(s, &p));
    const moe_routing_layer *y = &p.layers[0];
    HM_REQUIRE(y->weight_mass);
    HM_CHECK(y->weight_mass[0] == 3.0 && y->weight_mass[1] == 1.0 && y->weight_mass[2] == 0);
    HM_CHECK(y->f.w_top_share[0] == 0.75 && y->f.top_share[0] == 0.5);
    HM_CHECK(y->f.w_experts_for[0] == 1 && y->f.w_experts_for[1] == 2);
    HM_CHECK(!p.layers[1].weight_mass && isnan(p.layers[1].f.w_top_share[0]));
    HM_CHECK(p.layers[1].f.top_share[0] == 0.75);
    HM_CHECK(p.avg.w_top_share[0] == 0.75 && near(p.avg.top_share[0], 0.625));
    HM_CHECK(p.avg.experts_for[2] == 2 && near(p.avg.experts_for[0], 1)); /* both layers: 1 */
    moe_routing_profile_free(&p);
    moe_routing_stats_free(s);
}

/* ---- a random history against naive references ---- */

enum { RN_L = 2, RN_E = 16, RN_K = 3, RN_T = 300 };

typedef struct {
    int32_t ids[RN_T][RN_K];
    int seq_of[RN_T]; /* sequence index of each token */
} rn_hist;

static void rn_make(rn_hist *h, unsigned long long seed) {
    int seq = 0;
    for (int t = 0; t < RN_T; t++) {
        if (t && hm_t_rnd(&seed) % 37 == 0) seq++;
        h->seq_of[t] = seq;
        for (int k = 0; k < RN_K; k++) {
            int32_t e;
            bool dup;
            do { /* distinct per token, as a top-k gives; skewed towards low ids */
                unsigned r = hm_t_rnd(&seed) % 100;
                e = r < 50 ? (int32_t)(hm_t_rnd(&seed) % 4) : (int32_t)(hm_t_rnd(&seed) % RN_E);
                dup = false;
                for (int j = 0; j < k; j++) dup |= h->ids[t][j] == e;
            } while (dup);
            h->ids[t][k] = e;
        }
    }
}

/* Feeds the history to s for every layer (layer l gets the ids shifted by l mod E), in calls of
 * `chunk` tokens (0: random sizes), cut at sequence starts. */
static void rn_feed(moe_routing_stats *s, const rn_hist *h, int chunk, unsigned long long seed) {
    int32_t buf[RN_T * RN_K];
    for (int t0 = 0; t0 < RN_T;) {
        if (t0 == 0 || h->seq_of[t0] != h->seq_of[t0 - 1]) moe_routing_stats_begin_sequence(s);
        int n = chunk ? chunk : 1 + (int)(hm_t_rnd(&seed) % 9);
        int t1 = t0;
        while (t1 < RN_T && t1 - t0 < n && h->seq_of[t1] == h->seq_of[t0]) t1++;
        for (int l = 0; l < RN_L; l++) {
            for (int t = t0; t < t1; t++)
                for (int k = 0; k < RN_K; k++) buf[(t - t0) * RN_K + k] = (h->ids[t][k] + l) % RN_E;
            moe_routing_stats_record(s, l, t1 - t0, RN_K, buf, NULL);
        }
        t0 = t1;
    }
}

/* A plain LRU cache of C experts: hit if cached (refresh), else insert, evicting the entry with
 * the oldest use. Returns hits over the history's accesses of layer 0. */
static uint64_t ref_lru(const rn_hist *h, int C) {
    int32_t cache[RN_E];
    long used[RN_E];
    int n = 0;
    long clock = 0;
    uint64_t hits = 0;
    for (int t = 0; t < RN_T; t++)
        for (int k = 0; k < RN_K; k++) {
            int32_t e = h->ids[t][k];
            int i = 0;
            while (i < n && cache[i] != e) i++;
            clock++;
            if (i < n) {
                hits++;
                used[i] = clock;
                continue;
            }
            if (n < C) {
                cache[n] = e;
                used[n++] = clock;
                continue;
            }
            int old = 0;
            for (int j = 1; j < n; j++)
                if (used[j] < used[old]) old = j;
            cache[old] = e;
            used[old] = clock;
        }
    return hits;
}

/* Repeat counts by scanning the previous d rows of the same sequence (layer 0). */
static void ref_repeat(const rn_hist *h, int d, uint64_t *hits, uint64_t *considered) {
    *hits = *considered = 0;
    for (int t = 0; t < RN_T; t++) {
        int p = 0; /* position in its sequence */
        while (p < t && h->seq_of[t - p - 1] == h->seq_of[t]) p++;
        if (p < d) continue;
        for (int k = 0; k < RN_K; k++) {
            (*considered)++;
            bool found = false;
            for (int back = 1; back <= d && !found; back++)
                for (int j = 0; j < RN_K; j++) found |= h->ids[t - back][j] == h->ids[t][k];
            *hits += found;
        }
    }
}

static void test_random_vs_reference(void) {
    static rn_hist h;
    rn_make(&h, 0x5eed1234ull);
    char *texts[3] = {NULL, NULL, NULL};
    const int chunks[3] = {1, RN_T, 0};
    for (int r = 0; r < 3; r++) {
        moe_routing_stats *s = new_stats(RN_L, RN_E, RN_K);
        HM_REQUIRE(s);
        rn_feed(s, &h, chunks[r], 99);
        moe_routing_profile p;
        HM_REQUIRE(profile_of(s, &p));
        const moe_routing_layer *y = &p.layers[0];
        for (int c = 0; c < MOE_ROUTING_N_LRU; c++) {
            int C = moe_routing_pct_experts(moe_routing_lru_pct[c], RN_E);
            uint64_t want = ref_lru(&h, C);
            HM_CHECK_MSG(y->lru_hits[c] == want, "chunk %d, LRU of %d: %llu hits, reference %llu",
                         chunks[r], C, (unsigned long long)y->lru_hits[c], (unsigned long long)want);
        }
        for (int d = 0; d < MOE_ROUTING_N_DIST; d++) {
            uint64_t wh, wc;
            ref_repeat(&h, moe_routing_dist[d], &wh, &wc);
            HM_CHECK_MSG(y->repeat_hits[d] == wh && y->repeat_considered[d] == wc,
                         "distance %d: %llu/%llu, reference %llu/%llu", moe_routing_dist[d],
                         (unsigned long long)y->repeat_hits[d],
                         (unsigned long long)y->repeat_considered[d], (unsigned long long)wh,
                         (unsigned long long)wc);
        }
        /* the shifted copy in layer 1 has the same locality (a relabelling of experts) */
        HM_CHECK(!memcmp(p.layers[1].lru_hits, y->lru_hits, sizeof(y->lru_hits)) &&
                 !memcmp(p.layers[1].repeat_hits, y->repeat_hits, sizeof(y->repeat_hits)));
        HM_CHECK(y->selections == RN_T * RN_K && p.tokens == RN_T);
        /* figures are monotone in the cache size and the window */
        for (int c = 1; c < MOE_ROUTING_N_LRU; c++) HM_CHECK(y->f.lru_hit[c] >= y->f.lru_hit[c - 1]);
        HM_CHECK(y->f.lru_hit[0] > 0 && y->f.lru_hit[8] < 1 && y->f.repeat[0] > 0);
        texts[r] = json_of(&p, true);
        HM_CHECK(texts[r] != NULL);
        moe_routing_profile_free(&p);
        moe_routing_stats_free(s);
    }
    /* the call chunking changes nothing */
    HM_CHECK(texts[0] && texts[1] && !strcmp(texts[0], texts[1]));
    HM_CHECK(texts[0] && texts[2] && !strcmp(texts[0], texts[2]));
    for (int r = 0; r < 3; r++) free(texts[r]);
}

/* ---- files ---- */

static bool same_figures(const moe_routing_figures *a, const moe_routing_figures *b) {
    const double *x = (const double *)a, *y = (const double *)b;
    for (size_t i = 0; i < sizeof(*a) / sizeof(double); i++)
        if (!(x[i] == y[i] || (isnan(x[i]) && isnan(y[i])))) return false;
    return true;
}

/* A measured profile (weights on one layer, a dense layer, notes, model) written and read back:
 * every field equal, and writing the read profile gives the same bytes; also through a file. */
static void test_json_round_trip(void) {
    static rn_hist h;
    rn_make(&h, 77);
    moe_routing_stats *s = new_stats(3, RN_E, RN_K);
    HM_REQUIRE(s);
    rn_feed(s, &h, 0, 5); /* layers 0 and 1; layer 2 stays empty (dense) */
    float w[RN_K] = {0.5f, 0.3f, 0.2f};
    moe_routing_stats_record(s, 1, 1, RN_K, h.ids[0], w); /* layer 1: one call with weights ... */
    moe_routing_profile p, q;
    HM_REQUIRE(profile_of(s, &p));
    hm_error err;
    HM_CHECK(moe_routing_profile_set_model(&p, "qwen3moe", "tiny", "m.gguf", &err) == HM_OK);
    HM_CHECK(moe_routing_profile_add_note(&p, "a note with \"quotes\"", &err) == HM_OK);
    HM_CHECK(!p.layers[1].weight_mass); /* ... but not all of them: weights unknown */
    for (int pretty = 0; pretty < 2; pretty++) {
        char *text = json_of(&p, pretty);
        HM_REQUIRE(text);
        HM_REQUIRE(moe_routing_profile_parse(text, strlen(text), "rt", &q, &err) == HM_OK);
        HM_CHECK(q.version == 1 && q.measured && !strcmp(q.source, "test") && q.n_notes == 1 &&
                 !strcmp(q.notes[0], "a note with \"quotes\""));
        HM_CHECK(!strcmp(q.arch, "qwen3moe") && !strcmp(q.name, "tiny") && !strcmp(q.file, "m.gguf"));
        HM_CHECK(q.n_layer == 3 && q.n_expert == RN_E && q.n_expert_used == RN_K);
        HM_CHECK(q.tokens == p.tokens && q.sequences == p.sequences && q.rejected == 0);
        HM_CHECK(same_figures(&q.avg, &p.avg));
        HM_REQUIRE(q.layers);
        for (int l = 0; l < 3; l++) {
            const moe_routing_layer *a = &p.layers[l], *b = &q.layers[l];
            HM_CHECK_MSG(a->tokens == b->tokens && a->selections == b->selections &&
                             !memcmp(a->hits, b->hits, RN_E * sizeof(uint64_t)) &&
                             !memcmp(a->repeat_hits, b->repeat_hits, sizeof(a->repeat_hits)) &&
                             !memcmp(a->repeat_considered, b->repeat_considered,
                                     sizeof(a->repeat_considered)) &&
                             !memcmp(a->lru_hits, b->lru_hits, sizeof(a->lru_hits)) &&
                             b->has_lru_counts && b->has_repeat_counts && !b->weight_mass &&
                             same_figures(&a->f, &b->f),
                         "layer %d", l);
        }
        char *again = json_of(&q, pretty);
        HM_CHECK(again && !strcmp(text, again));
        free(again);
        free(text);
        moe_routing_profile_free(&q);
    }
    char path[512];
    const char *tmp = getenv("HOTMOE_TMP");
    snprintf(path, sizeof(path), "%s/routing_rt.json", tmp && *tmp ? tmp : "/tmp");
    HM_CHECK(moe_routing_profile_save(&p, path, &err) == HM_OK);
    HM_CHECK(moe_routing_profile_load(path, &q, &err) == HM_OK && same_figures(&q.avg, &p.avg));
    moe_routing_profile_free(&q);
    remove(path);
    HM_CHECK(moe_routing_profile_load(path, &q, &err) == HM_ERR_IO && strstr(err.msg, path));
    HM_CHECK(moe_routing_profile_save(&p, "/nonexistent-dir/p.json", &err) != HM_OK &&
             strstr(err.msg, "/nonexistent-dir/p.json"));
    moe_routing_profile_free(&p);
    moe_routing_stats_free(s);

    /* weights on every call of a layer are written and read back */
    s = new_stats(1, 4, 2);
    HM_REQUIRE(s);
    const int32_t ids[4] = {0, 1, 2, 0};
    const float ww[4] = {0.625f, 0.375f, 0.5f, 0.5f};
    moe_routing_stats_record(s, 0, 2, 2, ids, ww);
    HM_REQUIRE(profile_of(s, &p));
    char *text = json_of(&p, true);
    HM_REQUIRE(text);
    HM_CHECK(moe_routing_profile_parse(text, strlen(text), "w", &q, &err) == HM_OK);
    HM_CHECK(q.layers && q.layers[0].weight_mass && q.layers[0].weight_mass[0] == 1.125 &&
             q.layers[0].weight_mass[2] == 0.5 && q.layers[0].f.w_top_share[0] == 1.125 / 2);
    free(text);
    moe_routing_profile_free(&q);
    moe_routing_profile_free(&p);
    moe_routing_stats_free(s);
}

/* The published Qwen3-30B-A3B profile (bench/profiles/) is a partial profile: it loads, the
 * three published figures are there, everything else is unknown, there are no layers. */
static void test_published_profile(void) {
    moe_routing_profile p;
    hm_error err;
    HM_REQUIRE(moe_routing_profile_load("bench/profiles/qwen3-30b-a3b-published.json", &p, &err) ==
               HM_OK);
    HM_CHECK(!p.measured && strstr(p.source, "not measured by hotmoe"));
    HM_CHECK(p.n_layer == 48 && p.n_expert == 128 && p.n_expert_used == 8 && !p.layers);
    HM_CHECK(p.tokens == -1 && p.sequences == -1);
    HM_CHECK(p.avg.experts_for[1] == 65 && p.avg.repeat[0] == 0.45 && p.avg.lru_hit[3] == 0.925);
    HM_CHECK(isnan(p.avg.experts_for[0]) && isnan(p.avg.repeat[1]) && isnan(p.avg.lru_hit[0]) &&
             isnan(p.avg.top_share[0]) && isnan(p.avg.w_top_share[0]));
    HM_CHECK(!strcmp(p.arch, "qwen3moe") && p.n_notes >= 1);
    /* a partial profile writes back as a partial profile */
    char *text = json_of(&p, true);
    moe_routing_profile q;
    HM_CHECK(text && moe_routing_profile_parse(text, strlen(text), "pub", &q, &err) == HM_OK &&
             same_figures(&q.avg, &p.avg) && !q.layers);
    free(text);
    moe_routing_profile_free(&q);
    moe_routing_profile_free(&p);
}

static void test_malformed(void) {
    /* a minimal valid profile, edited one place at a time */
#define HEAD "{\"format\":\"hotmoe-routing-profile\",\"version\":1,\"source\":\"x\","
#define SHAPE "\"n_layer\":2,\"n_expert\":8,\"n_expert_used\":2,"
#define L0 "{\"layer\":0,\"tokens\":2,\"selections\":4,\"hits\":[1,1,1,1,0,0,0,0]}"
#define L1 "{\"layer\":1,\"tokens\":0,\"selections\":0}"
    static const struct {
        const char *text;
        hm_status st;
        const char *msg;
    } cases[] = {
        {HEAD SHAPE "\"average\":{}}", HM_OK, NULL},
        {HEAD SHAPE "\"average\":{},\"layers\":[" L0 "," L1 "],\"tokens\":2}", HM_OK, NULL},
        {"not json", HM_ERR_FORMAT, "not valid JSON"},
        {HEAD SHAPE "\"average\":{}} x", HM_ERR_FORMAT, "not valid JSON"},
        {HEAD SHAPE "\"average\":{},\"n_layer\":2}", HM_ERR_FORMAT, "not valid JSON"},
        {"[1]", HM_ERR_FORMAT, "(top): must be an object, not an array"},
        {"{\"version\":1}", HM_ERR_FORMAT, "format: missing"},
        {"{\"format\":\"hotmoe-expert-usage\",\"version\":1}", HM_ERR_FORMAT,
         "format: must be \"hotmoe-routing-profile\", not \"hotmoe-expert-usage\""},
        {"{\"format\":\"hotmoe-routing-profile\",\"version\":2}", HM_ERR_UNSUPPORTED,
         "version: 2 is newer"},
        {"{\"format\":\"hotmoe-routing-profile\",\"version\":\"1\"}", HM_ERR_FORMAT,
         "version: must be a non-negative integer, not a string"},
        {"{\"format\":\"hotmoe-routing-profile\",\"version\":1," SHAPE "\"average\":{}}",
         HM_ERR_FORMAT, "source: missing"},
        {HEAD "\"measured\":\"yes\"," SHAPE "\"average\":{}}", HM_ERR_FORMAT,
         "measured: must be true or false, not a string"},
        {HEAD "\"notes\":[1]," SHAPE "\"average\":{}}", HM_ERR_FORMAT,
         "notes[0]: must be a string, not an integer"},
        {HEAD "\"model\":{\"arch\":3}," SHAPE "\"average\":{}}", HM_ERR_FORMAT,
         "model.arch: must be a string"},
        {HEAD "\"n_layer\":2,\"n_expert\":0,\"n_expert_used\":1,\"average\":{}}", HM_ERR_FORMAT,
         "n_expert: 0 is outside [1, 65536]"},
        {HEAD "\"n_layer\":2,\"n_expert\":8,\"n_expert_used\":9,\"average\":{}}", HM_ERR_FORMAT,
         "n_expert_used: 9 is outside [1, 8]"},
        {HEAD "\"n_expert\":8,\"n_expert_used\":2,\"average\":{}}", HM_ERR_FORMAT,
         "n_layer: missing"},
        {HEAD SHAPE "\"tokens\":-3,\"average\":{}}", HM_ERR_FORMAT, "tokens: must not be negative"},
        {HEAD SHAPE "\"lru_capacity\":{\"10\":1,\"20\":2,\"30\":3,\"40\":3,\"50\":4,\"60\":5,"
                    "\"70\":6,\"80\":7,\"90\":8},\"average\":{}}",
         HM_ERR_FORMAT, "lru_capacity.40: 3 experts, but 40% of 8 is 4"},
        {HEAD SHAPE "\"top_experts\":{\"10\":1},\"average\":{}}", HM_ERR_FORMAT,
         "top_experts: has 1 entries, not 3"},
        {HEAD SHAPE "\"layers\":[]}", HM_ERR_FORMAT, "average: missing"},
        {HEAD SHAPE "\"average\":[]}", HM_ERR_FORMAT, "average: must be an object, not an array"},
        {HEAD SHAPE "\"average\":{\"repeat\":{\"1\":\"x\"}}}", HM_ERR_FORMAT,
         "average.repeat.1: must be a number in [0, 1] or null, not a string"},
        {HEAD SHAPE "\"average\":{\"repeat\":{\"2\":0.5}}}", HM_ERR_FORMAT,
         "average.repeat.2: unknown point (the keys are \"1\", \"4\", \"8\")"},
        {HEAD SHAPE "\"average\":{\"top_share\":{\"10\":1.5}}}", HM_ERR_FORMAT,
         "average.top_share.10: 1.5 is outside [0, 1]"},
        {HEAD SHAPE "\"average\":{\"experts_for_share\":{\"90\":0}}}", HM_ERR_FORMAT,
         "average.experts_for_share.90: 0 is outside [1, 8]"},
        {HEAD SHAPE "\"average\":{\"lru_hit\":3}}", HM_ERR_FORMAT,
         "average.lru_hit: must be an object, not an integer"},
        {HEAD SHAPE "\"average\":{},\"layers\":{}}", HM_ERR_FORMAT,
         "layers: must be an array, not an object"},
        {HEAD SHAPE "\"average\":{},\"layers\":[" L0 "]}", HM_ERR_FORMAT,
         "layers: has 1 entries, n_layer is 2"},
        {HEAD SHAPE "\"average\":{},\"layers\":[" L1 "," L0 "]}", HM_ERR_FORMAT,
         "layers[0]: has \"layer\": 1; layers must be in order"},
        {HEAD SHAPE "\"average\":{},\"layers\":[{\"layer\":0,\"tokens\":2}," L1 "]}", HM_ERR_FORMAT,
         "layers[0].selections: missing"},
        {HEAD SHAPE "\"average\":{},\"layers\":[{\"layer\":0,\"tokens\":1,\"selections\":3}," L1 "]}",
         HM_ERR_FORMAT, "layers[0]: 3 selections for 1 tokens of 2 experts each"},
        {HEAD SHAPE "\"average\":{},\"layers\":[{\"layer\":0,\"tokens\":2,\"selections\":4,"
                    "\"hits\":[1,1,1,1]}," L1 "]}",
         HM_ERR_FORMAT, "layers[0].hits: has 4 entries, n_expert is 8"},
        {HEAD SHAPE "\"average\":{},\"layers\":[{\"layer\":0,\"tokens\":2,\"selections\":4,"
                    "\"hits\":[1,1,1,0,0,0,0,0]}," L1 "]}",
         HM_ERR_FORMAT, "layers[0].hits: sum to 3, not selections (4)"},
        {HEAD SHAPE "\"average\":{},\"layers\":[{\"layer\":0,\"tokens\":2,\"selections\":4,"
                    "\"hits\":[1,1,1,1.0,0,0,0,0]}," L1 "]}",
         HM_ERR_FORMAT, "layers[0].hits[3]: must be a non-negative integer, not a real number"},
        {HEAD SHAPE "\"average\":{},\"layers\":[{\"layer\":0,\"tokens\":2,\"selections\":4,"
                    "\"weight_mass\":[1,1,1,-1,0,0,0,0]}," L1 "]}",
         HM_ERR_FORMAT, "layers[0].weight_mass[3]: must be a number >= 0, not negative"},
        {HEAD SHAPE "\"average\":{},\"layers\":[{\"layer\":0,\"tokens\":2,\"selections\":4,"
                    "\"repeat_hits\":{\"1\":1,\"4\":0,\"8\":0}}," L1 "]}",
         HM_ERR_FORMAT, "layers[0]: has repeat_hits without repeat_considered"},
        {HEAD SHAPE "\"average\":{},\"layers\":[{\"layer\":0,\"tokens\":2,\"selections\":4,"
                    "\"repeat_hits\":{\"1\":3,\"4\":0,\"8\":0},"
                    "\"repeat_considered\":{\"1\":2,\"4\":0,\"8\":0}}," L1 "]}",
         HM_ERR_FORMAT, "layers[0]: repeat_hits.1 (3) > repeat_considered.1 (2)"},
        {HEAD SHAPE "\"average\":{},\"layers\":[{\"layer\":0,\"tokens\":2,\"selections\":4,"
                    "\"lru_hits\":{\"10\":1,\"20\":0,\"30\":0,\"40\":0,\"50\":0,\"60\":0,\"70\":0,"
                    "\"80\":0,\"90\":0}}," L1 "]}",
         HM_ERR_FORMAT, "layers[0]: lru_hits.20 (0) is above selections or below a smaller"},
        {HEAD SHAPE "\"average\":{},\"layers\":[" L0 "," L1 "],\"tokens\":3}", HM_ERR_FORMAT,
         "tokens: 3 is not the largest layer's tokens (2)"},
        {HEAD SHAPE "\"average\":{},\"layers\":[{\"layer\":0,\"tokens\":2,\"selections\":4,"
                    "\"repeat\":{\"1\":null,\"4\":2}}," L1 "]}",
         HM_ERR_FORMAT, "layers[0].repeat.4: 2 is outside [0, 1]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        moe_routing_profile p;
        hm_error err = {0};
        hm_status st = moe_routing_profile_parse(cases[i].text, strlen(cases[i].text), "bad.json",
                                                 &p, &err);
        HM_CHECK_MSG(st == cases[i].st, "case %zu: status %d, want %d (%s)", i, (int)st,
                     (int)cases[i].st, err.msg);
        if (cases[i].msg)
            HM_CHECK_MSG(strstr(err.msg, cases[i].msg) && !strncmp(err.msg, "bad.json", 8),
                         "case %zu: message \"%s\", want \"%s\"", i, err.msg, cases[i].msg);
        if (st == HM_OK) moe_routing_profile_free(&p);
        else HM_CHECK(!p.layers && !p.source && !p.notes); /* nothing left to free */
    }
}

HM_TEST_MAIN(test_repeat_every_token, test_sequences_reset_history, test_lru_within_token_order,
             test_skipped_and_rejected, test_weights_and_average, test_random_vs_reference,
             test_json_round_trip, test_published_profile, test_malformed)
