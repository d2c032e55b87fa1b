/* test_learn_file.c - the learn-file reader (src/moe/learn_file.h): files the tracer writes read
 * back with the same counts (several shapes, a dense layer, skipped and rejected slots, times,
 * seed 000's keys, pretty and compact text); optional perf fields and unknown keys accepted;
 * and a table of malformed files (each a one-place edit of a valid one), every one refused with
 * its status and a message naming the origin and the field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "harness.h"
#include "moe/learn_file.h"
#include "moe/tracer.h"

static const char *tmp_path(char *buf, size_t n, const char *name) {
    const char *tmp = getenv("HOTMOE_TMP");
    snprintf(buf, n, "%s/%s", tmp && *tmp ? tmp : "/tmp", name);
    return buf;
}

/* A tracer of shape nl x ne (nu used) with a pseudo-random routing history; layer `dense` (if
 * >= 0) is never recorded. */
static moe_tracer *random_trace(int nl, int ne, int nu, int dense, bool per_layer, unsigned long long seed) {
    moe_tracer_config c;
    moe_tracer_config_init(&c);
    c.stats = true;
    c.per_layer = per_layer;
    moe_tracer *t = NULL;
    hm_error err;
    if (moe_tracer_init(&t, &c, nl, ne, nu, &err) != HM_OK) return NULL;
    int32_t ids[64 * 8];
    for (int call = 0; call < 40; call++) {
        int layer = (int)(hm_t_rnd(&seed) % (unsigned)nl);
        if (layer == dense) continue;
        int n_tok = 1 + (int)(hm_t_rnd(&seed) % 64);
        for (int i = 0; i < n_tok * nu; i++) {
            unsigned r = hm_t_rnd(&seed) % 100;
            ids[i] = r < 3 ? -1 : r < 5 ? ne + 1 : (int32_t)(hm_t_rnd(&seed) % (unsigned)ne); /* skipped, rejected */
        }
        moe_tracer_record(t, layer, ids, n_tok, nu);
        if (call % 3 == 0) moe_tracer_add_time_ns(t, layer, 1000 + hm_t_rnd(&seed) % 100000);
        if (call % 10 == 0) moe_tracer_add_prompt(t);
    }
    return t;
}

static bool same_counts(const moe_tracer *t, const moe_learn *l, int nu) {
    bool ok = l->n_layer == moe_tracer_n_layer(t) && l->n_expert == moe_tracer_n_expert(t) &&
              l->n_expert_used == nu && l->prompts == moe_tracer_prompts(t) &&
              l->total_tokens == moe_tracer_total_tokens(t) && l->rejected == moe_tracer_rejected(t);
    for (int e = 0; ok && e < l->n_expert; e++) ok = l->experts[e] == moe_tracer_expert_total(t, e);
    for (int i = 0; ok && i < l->n_layer; i++) {
        const moe_learn_layer *y = &l->layers[i];
        uint64_t ns = moe_tracer_time_ns(t, i);
        ok = y->calls == moe_tracer_calls(t, i) && y->tokens == moe_tracer_tokens(t, i) &&
             y->has_moe_time == (ns != 0) && y->moe_time_us == (double)ns / 1000.0 && !y->has_branch_counts;
        for (int e = 0; ok && e < l->n_expert; e++) ok = y->experts[e] == moe_tracer_hits(t, i, e);
    }
    return ok;
}

static void test_round_trip(void) {
    static const struct { int nl, ne, nu, dense; bool per_layer; } shapes[] = {
        {2, 3, 1, -1, false}, {4, 8, 2, 0, true}, {6, 128, 8, 3, false}, {1, 1, 1, -1, true}};
    char p[512];
    tmp_path(p, sizeof(p), "learn_round_trip.json");
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int nu = shapes[s].nu;
        moe_tracer *t = random_trace(shapes[s].nl, shapes[s].ne, nu, shapes[s].dense, shapes[s].per_layer, 7 + s);
        HM_REQUIRE(t);
        hm_error err;
        HM_CHECK(moe_tracer_set_model_info(t, "qwen3moe", "Tiny \"Q\"", "m \xc3\xa9.gguf", &err) == HM_OK);
        HM_REQUIRE(moe_tracer_save(t, p, &err) == HM_OK);
        moe_learn l;
        hm_status st = moe_learn_load(p, &l, &err);
        HM_CHECK_MSG(st == HM_OK, "shape %zu: %s", s, err.msg);
        if (st == HM_OK) {
            HM_CHECK_MSG(same_counts(t, &l, nu), "shape %zu", s);
            HM_CHECK(l.arch && !strcmp(l.arch, "qwen3moe") && l.name && !strcmp(l.name, "Tiny \"Q\"") && l.file &&
                     !strcmp(l.file, "m \xc3\xa9.gguf"));
            if (shapes[s].dense >= 0) HM_CHECK(l.layers[shapes[s].dense].calls == 0);
        }
        moe_learn_free(&l);
        moe_learn_free(&l); /* twice is harmless */
        /* the compact text reads the same */
        hm_json j;
        hm_json_init_buf(&j, false);
        moe_tracer_write_json(t, &j);
        HM_REQUIRE(hm_json_finish(&j, &err) == HM_OK);
        size_t len;
        const char *text = hm_json_data(&j, &len);
        st = moe_learn_parse(text, len, "mem", &l, &err);
        HM_CHECK_MSG(st == HM_OK && same_counts(t, &l, nu), "shape %zu: %s", s, err.msg);
        moe_learn_free(&l);
        hm_json_free(&j);
        moe_tracer_free(t);
    }
    remove(p);
}

/* the tracer's JSON of test_tracer's small trace, with a time on layer 0 */
static const char k_valid[] =
    "{\"format\":\"hotmoe-expert-usage\",\"version\":1,"
    "\"model\":{\"arch\":\"olmoe\",\"file\":\"m.gguf\"},"
    "\"n_layer\":2,\"n_expert\":3,\"n_expert_used\":1,\"prompts\":1,\"total_tokens\":5,"
    "\"rejected\":0,\"experts\":[1,3,3],\"layers\":["
    "{\"layer\":0,\"calls\":1,\"tokens\":5,\"expert_hits_total\":5,\"moe_time_us\":1.5,"
    "\"experts\":[1,1,3]},"
    "{\"layer\":1,\"calls\":1,\"tokens\":2,\"expert_hits_total\":2,\"experts\":[0,2,0]}],"
    "\"expert_activations\":{\"0\":1,\"1\":3,\"2\":3}}";

/* k_valid with its first occurrence of `from` replaced by `to` (NULL from: cut to `cut` bytes) */
static char *edit(const char *from, const char *to, size_t cut) {
    size_t n = strlen(k_valid);
    char *s = malloc(n + strlen(to ? to : "") + 1);
    if (!s) return NULL;
    if (!from) {
        memcpy(s, k_valid, cut);
        s[cut] = 0;
        return s;
    }
    const char *at = strstr(k_valid, from);
    if (!at) {
        free(s);
        return NULL;
    }
    size_t pre = (size_t)(at - k_valid);
    memcpy(s, k_valid, pre);
    strcpy(s + pre, to);
    strcat(s, at + strlen(from));
    return s;
}

static void test_valid_extras(void) {
    moe_learn l;
    hm_error err;
    HM_REQUIRE(moe_learn_parse(k_valid, strlen(k_valid), "v.json", &l, &err) == HM_OK);
    HM_CHECK(l.n_layer == 2 && l.n_expert == 3 && l.layers[0].has_moe_time && l.layers[0].moe_time_us == 1.5 &&
             !l.layers[1].has_moe_time && l.layers[1].experts[1] == 2 && !l.name);
    moe_learn_free(&l);
    /* a perf snapshot: the hot/cold split kept, the other perf fields and unknown keys accepted */
    char *s = edit("\"experts\":[1,1,3]}",
                   "\"experts\":[1,1,3],\"hot_experts\":[1,0,2],\"cold_experts\":[0,1,1],\"hot_slots_total\":3,"
                   "\"cold_slots_total\":2,\"matmul_time_us\":3,\"parallel_join_wait_time_us\":0.25,"
                   "\"parallel_launches\":1,\"parallel_fallbacks\":0,\"future_field\":[{}]}",
                   0);
    HM_REQUIRE(s);
    hm_status st = moe_learn_parse(s, strlen(s), "perf.json", &l, &err);
    HM_CHECK_MSG(st == HM_OK, "%s", err.msg);
    if (st == HM_OK)
        HM_CHECK(l.layers[0].has_branch_counts && l.layers[0].hot_experts[2] == 2 && l.layers[0].cold_experts[1] == 1 &&
                 !l.layers[1].has_branch_counts && !l.layers[1].hot_experts);
    moe_learn_free(&l);
    free(s);
    /* hot_experts alone: no split */
    s = edit("\"experts\":[1,1,3]}", "\"experts\":[1,1,3],\"hot_experts\":[1,1,3]}", 0);
    HM_REQUIRE(s);
    st = moe_learn_parse(s, strlen(s), "perf.json", &l, &err);
    HM_CHECK(st == HM_OK && !l.layers[0].has_branch_counts && !l.layers[0].hot_experts);
    moe_learn_free(&l);
    free(s);
}

typedef struct {
    const char *what, *from, *to; /* from NULL: k_valid cut to `cut` bytes (or `to` whole if set) */
    size_t cut;
    hm_status st;
    const char *msg; /* expected part of the message, after "bad.json" */
} bad_case;

static const bad_case k_bad[] = {
    {"wrong format", "\"hotmoe-expert-usage\"", "\"hotmoe-usage\"", 0, HM_ERR_FORMAT,
     ": format: must be \"hotmoe-expert-usage\", not \"hotmoe-usage\""},
    {"format not a string", "\"hotmoe-expert-usage\"", "7", 0, HM_ERR_FORMAT, ": format: must be"},
    {"no format", "\"format\":\"hotmoe-expert-usage\",", "", 0, HM_ERR_FORMAT, ": format: missing"},
    {"version 2", "\"version\":1", "\"version\":2", 0, HM_ERR_UNSUPPORTED, ": version: 2 is newer than this reader (1)"},
    {"version 0", "\"version\":1", "\"version\":0", 0, HM_ERR_FORMAT, ": version: must be 1, not 0"},
    {"version as a string", "\"version\":1", "\"version\":\"1\"", 0, HM_ERR_FORMAT,
     ": version: must be a non-negative integer, not a string"},
    {"layer experts too short", "[1,1,3]", "[1,1]", 0, HM_ERR_FORMAT,
     ": layers[0].experts: has 2 entries, n_expert is 3"},
    {"totals too long", "[1,3,3]", "[1,3,3,0]", 0, HM_ERR_FORMAT, ": experts: has 4 entries, n_expert is 3"},
    {"layers too few", ",{\"layer\":1,\"calls\":1,\"tokens\":2,\"expert_hits_total\":2,\"experts\":[0,2,0]}", "", 0,
     HM_ERR_FORMAT, ": layers: has 1 entries, n_layer is 2"},
    {"string where int", "\"calls\":1", "\"calls\":\"1\"", 0, HM_ERR_FORMAT,
     ": layers[0].calls: must be a non-negative integer, not a string"},
    {"real where int", "\"tokens\":5", "\"tokens\":5.0", 0, HM_ERR_FORMAT,
     ": layers[0].tokens: must be a non-negative integer, not a real number"},
    {"null in an array", "[0,2,0]", "[0,null,0]", 0, HM_ERR_FORMAT,
     ": layers[1].experts[1]: must be a non-negative integer, not null"},
    {"truncated JSON", NULL, NULL, 100, HM_ERR_FORMAT, ":1:100: not valid JSON"},
    {"empty file", NULL, NULL, 0, HM_ERR_FORMAT, ": not valid JSON"},
    {"trailing bytes", "}}", "}} x", 0, HM_ERR_FORMAT, ": not valid JSON: end of file expected"},
    {"too big integer", "\"prompts\":1", "\"prompts\":18446744073709551616", 0, HM_ERR_FORMAT,
     ": not valid JSON: too big integer"},
    {"duplicate key", "\"prompts\":1", "\"prompts\":1,\"prompts\":1", 0, HM_ERR_FORMAT,
     ": not valid JSON: duplicate object key"},
    {"top-level array", NULL, "[1]", 0, HM_ERR_FORMAT, ": (top): must be an object, not an array"},
    {"missing prompts", "\"prompts\":1,", "", 0, HM_ERR_FORMAT, ": prompts: missing"},
    {"missing rejected", "\"rejected\":0,", "", 0, HM_ERR_FORMAT, ": rejected: missing"},
    {"missing layers", ",\"layers\":", ",\"layerz\":", 0, HM_ERR_FORMAT, ": layers: missing"},
    {"missing layer field", "\"expert_hits_total\":5,", "", 0, HM_ERR_FORMAT, ": layers[0].expert_hits_total: missing"},
    {"negative count", "\"rejected\":0", "\"rejected\":-1", 0, HM_ERR_FORMAT, ": rejected: must not be negative (-1)"},
    {"negative hits", "[0,2,0]", "[0,2,-2]", 0, HM_ERR_FORMAT, ": layers[1].experts[2]: must not be negative (-2)"},
    {"negative time", "\"moe_time_us\":1.5", "\"moe_time_us\":-1.5", 0, HM_ERR_FORMAT,
     ": layers[0].moe_time_us: must not be negative"},
    {"time as a string", "\"moe_time_us\":1.5", "\"moe_time_us\":\"1.5\"", 0, HM_ERR_FORMAT,
     ": layers[0].moe_time_us: must be a number, not a string"},
    {"perf time as bool", "\"moe_time_us\":1.5", "\"merge_time_us\":true", 0, HM_ERR_FORMAT,
     ": layers[0].merge_time_us: must be a number, not true"},
    {"perf count negative", "\"moe_time_us\":1.5", "\"parallel_launches\":-3", 0, HM_ERR_FORMAT,
     ": layers[0].parallel_launches: must not be negative (-3)"},
    {"n_layer 0", "\"n_layer\":2", "\"n_layer\":0", 0, HM_ERR_FORMAT, ": n_layer: 0 is outside [1, 4096]"},
    {"n_expert_used above n_expert", "\"n_expert_used\":1", "\"n_expert_used\":4", 0, HM_ERR_FORMAT,
     ": n_expert_used: 4 is outside [1, 3]"},
    {"model not an object", "{\"arch\":\"olmoe\",\"file\":\"m.gguf\"}", "\"olmoe\"", 0, HM_ERR_FORMAT,
     ": model: must be an object, not a string"},
    {"model.arch not a string", "\"arch\":\"olmoe\"", "\"arch\":1", 0, HM_ERR_FORMAT,
     ": model.arch: must be a string, not an integer"},
    {"layer not an object", "{\"layer\":1,\"calls\":1,\"tokens\":2,\"expert_hits_total\":2,\"experts\":[0,2,0]}", "[]",
     0, HM_ERR_FORMAT, ": layers[1]: must be an object, not an array"},
    {"layers out of order", "\"layer\":1", "\"layer\":0", 0, HM_ERR_FORMAT,
     ": layers[1]: has \"layer\": 0; layers must be in order"},
    {"hits total not the sum", "\"expert_hits_total\":5", "\"expert_hits_total\":6", 0, HM_ERR_FORMAT,
     ": layers[0]: expert_hits_total 6 is not the sum of experts (5)"},
    {"more hits than slots", "\"tokens\":2,\"expert_hits_total\":2", "\"tokens\":1,\"expert_hits_total\":2", 0,
     HM_ERR_FORMAT, ": layers[1]: 2 hits for 1 tokens of 1 experts each"},
    {"tokens without calls", "\"calls\":1,\"tokens\":2", "\"calls\":0,\"tokens\":2", 0, HM_ERR_FORMAT,
     ": layers[1]: calls is 0 but tokens or hits are not"},
    {"total_tokens not the max", "\"total_tokens\":5", "\"total_tokens\":7", 0, HM_ERR_FORMAT,
     ": total_tokens: 7 is not the largest layer's tokens (5)"},
    {"expert total not the sum", "[1,3,3]", "[1,3,4]", 0, HM_ERR_FORMAT,
     ": experts[2]: 4 is not the sum over layers (3)"},
    {"hot + cold not experts", "\"experts\":[0,2,0]}", "\"experts\":[0,2,0],\"hot_experts\":[0,1,0],\"cold_experts\":[0,0,0]}",
     0, HM_ERR_FORMAT, ": layers[1]: hot_experts[1] + cold_experts[1] is not experts[1]"},
    {"cold_experts too long", "\"experts\":[0,2,0]}", "\"experts\":[0,2,0],\"cold_experts\":[0,0,0,0]}", 0,
     HM_ERR_FORMAT, ": layers[1].cold_experts: has 4 entries, n_expert is 3"},
};

static void test_malformed(void) {
    for (size_t i = 0; i < sizeof(k_bad) / sizeof(k_bad[0]); i++) {
        const bad_case *c = &k_bad[i];
        char *s = !c->from && c->to ? strdup(c->to) : edit(c->from, c->to, c->cut);
        HM_CHECK_MSG(s, "%s: the edit does not apply", c->what);
        if (!s) continue;
        moe_learn l;
        hm_error err;
        memset(&err, 0, sizeof(err));
        hm_status st = moe_learn_parse(s, strlen(s), "bad.json", &l, &err);
        HM_CHECK_MSG(st == c->st && !strncmp(err.msg, "bad.json", 8) && strstr(err.msg, c->msg),
                     "%s: status %d, '%s' (want %d, '...%s...')", c->what, st, err.msg, c->st, c->msg);
        HM_CHECK_MSG(!l.layers && !l.experts && !l.arch, "%s: left something allocated", c->what);
        free(s);
    }
}

/* moe_learn_load names the file; a missing file is an I/O error; every prefix of a valid file
 * and every single-byte change of it is either refused cleanly or read. */
static void test_load_errors(void) {
    char p[512];
    tmp_path(p, sizeof(p), "learn_bad_version.json");
    char *s = edit("\"version\":1", "\"version\":2", 0);
    HM_REQUIRE(s);
    FILE *f = fopen(p, "wb");
    HM_REQUIRE(f);
    fputs(s, f);
    fclose(f);
    free(s);
    moe_learn l;
    hm_error err;
    HM_CHECK(moe_learn_load(p, &l, &err) == HM_ERR_UNSUPPORTED && !strncmp(err.msg, p, strlen(p)) &&
             strstr(err.msg, ": version: 2 is newer"));
    remove(p);
    HM_CHECK(moe_learn_load(p, &l, &err) == HM_ERR_IO && strstr(err.msg, p));
    size_t n = strlen(k_valid);
    int ok = 0;
    for (size_t cut = 0; cut < n; cut++) {
        if (moe_learn_parse(k_valid, cut, "cut", &l, &err) == HM_OK) ok++;
        moe_learn_free(&l);
    }
    HM_CHECK(ok == 0);
    char *m = malloc(n);
    HM_REQUIRE(m);
    static const char subst[] = "0-9\"{}[],:.ex ";
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof(subst) - 1; k++) {
            memcpy(m, k_valid, n);
            m[i] = subst[k];
            hm_status st = moe_learn_parse(m, n, "mut", &l, &err);
            HM_CHECK(st == HM_OK || !strncmp(err.msg, "mut", 3));
            moe_learn_free(&l);
        }
    }
    free(m);
}

HM_TEST_MAIN(test_round_trip, test_valid_extras, test_malformed, test_load_errors)
