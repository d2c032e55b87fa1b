/* test_tracer.c - the expert usage tracer (src/moe/tracer.h): flag and environment parsing,
 * exact counts on hand-made routing results (single-token and batch paths, skipped and
 * out-of-range ids), exact totals from concurrent recorders, name logging lines, the sorted
 * summary, the JSON and CSV texts (compared whole), saving by extension, tensor-name parsing. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "moe/tracer.h"

static char *slurp(FILE *f) {
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    return s;
}

static void test_config_flags(void) {
    moe_tracer_config c;
    moe_tracer_config_init(&c);
    HM_CHECK(!moe_tracer_config_enabled(&c) && !moe_tracer_config_counts(&c));
    char *argv[] = {"run", "-m", "x.gguf", "--expert-trace-stats", "--expert-trace-names",
                    "--expert-trace-per-layer", "--expert-trace-output", "out.json",
                    "--expert-trace-output=o2.csv", "--expert-trace-bogus", "--expert-trace-output",
                    NULL};
    int argc = 11;
    hm_error err = {0};
    HM_CHECK(moe_tracer_config_parse_arg(&c, argc, argv, 1, &err) == 0);
    HM_CHECK(moe_tracer_config_parse_arg(&c, argc, argv, 2, &err) == 0);
    HM_CHECK(moe_tracer_config_parse_arg(&c, argc, argv, 3, &err) == 1 && c.stats);
    HM_CHECK(moe_tracer_config_counts(&c));
    HM_CHECK(moe_tracer_config_parse_arg(&c, argc, argv, 4, &err) == 1 && c.names);
    HM_CHECK(moe_tracer_config_parse_arg(&c, argc, argv, 5, &err) == 1 && c.per_layer);
    HM_CHECK(moe_tracer_config_parse_arg(&c, argc, argv, 6, &err) == 2 && c.output &&
             !strcmp(c.output, "out.json"));
    HM_CHECK(moe_tracer_config_parse_arg(&c, argc, argv, 8, &err) == 1 &&
             !strcmp(c.output, "o2.csv"));
    HM_CHECK(moe_tracer_config_parse_arg(&c, argc, argv, 9, &err) == -1 &&
             err.status == HM_ERR_ARG && strstr(err.msg, "--expert-trace-bogus"));
    HM_CHECK(moe_tracer_config_parse_arg(&c, argc, argv, 10, &err) == -1 &&
             strstr(err.msg, "needs a FILE"));
    char *eq[] = {"run", "--expert-trace-output=", NULL};
    HM_CHECK(moe_tracer_config_parse_arg(&c, 2, eq, 1, &err) == -1);
    /* names alone: enabled, but no counting */
    moe_tracer_config_init(&c);
    c.names = true;
    HM_CHECK(moe_tracer_config_enabled(&c) && !moe_tracer_config_counts(&c));
    /* an output file alone counts */
    moe_tracer_config_init(&c);
    c.output = "x.json";
    HM_CHECK(moe_tracer_config_enabled(&c) && moe_tracer_config_counts(&c));
    HM_CHECK(strstr(moe_tracer_flags_help(), "--expert-trace-output FILE") != NULL);
}

static void test_config_extract(void) {
    moe_tracer_config c;
    moe_tracer_config_init(&c);
    hm_error err = {0};
    char *argv[] = {"learn", "-m", "m.gguf", "--expert-trace-stats", "-f", "p.txt",
                    "--expert-trace-output", "o.json", "-o", "l.json", NULL};
    int argc = 10;
    HM_CHECK(moe_tracer_config_extract(&c, &argc, argv, &err) == HM_OK);
    HM_CHECK(argc == 7 && c.stats && c.output && !strcmp(c.output, "o.json"));
    const char *want[] = {"learn", "-m", "m.gguf", "-f", "p.txt", "-o", "l.json"};
    for (int i = 0; i < 7; i++) HM_CHECK(!strcmp(argv[i], want[i]));
    HM_CHECK(argv[7] == NULL);
    char *bad[] = {"learn", "--expert-trace-output", NULL};
    argc = 2;
    HM_CHECK(moe_tracer_config_extract(&c, &argc, bad, &err) == HM_ERR_ARG);
}

static void test_config_env(void) {
    moe_tracer_config c;
    hm_error err = {0};
    moe_tracer_config_init(&c);
    setenv("LLAMA_EXPERT_TRACE_STATS", "1", 1);
    setenv("LLAMA_EXPERT_TRACE_NAMES", "0", 1);
    setenv("LLAMA_EXPERT_TRACE_PER_LAYER", "1", 1);
    setenv("LLAMA_EXPERT_TRACE_OUTPUT", "env.json", 1);
    HM_CHECK(moe_tracer_config_from_env(&c, &err) == HM_OK);
    HM_CHECK(c.stats && !c.names && c.per_layer && c.output && !strcmp(c.output, "env.json"));
    /* a flag given after the environment was read wins */
    char *argv[] = {"run", "--expert-trace-output", "flag.json", NULL};
    HM_CHECK(moe_tracer_config_parse_arg(&c, 3, argv, 1, &err) == 2 &&
             !strcmp(c.output, "flag.json"));
    setenv("LLAMA_EXPERT_TRACE_NAMES", "yes", 1);
    HM_CHECK(moe_tracer_config_from_env(&c, &err) == HM_ERR_ARG &&
             strstr(err.msg, "LLAMA_EXPERT_TRACE_NAMES"));
    setenv("LLAMA_EXPERT_TRACE_NAMES", "", 1); /* empty = unset */
    setenv("LLAMA_EXPERT_TRACE_STATS", "0", 1);
    HM_CHECK(moe_tracer_config_from_env(&c, &err) == HM_OK && !c.stats);
    unsetenv("LLAMA_EXPERT_TRACE_STATS");
    unsetenv("LLAMA_EXPERT_TRACE_NAMES");
    unsetenv("LLAMA_EXPERT_TRACE_PER_LAYER");
    unsetenv("LLAMA_EXPERT_TRACE_OUTPUT");
}

static moe_tracer *make(int nl, int ne, int nu, bool stats, bool names, bool per_layer) {
    moe_tracer_config c;
    moe_tracer_config_init(&c);
    c.stats = stats;
    c.names = names;
    c.per_layer = per_layer;
    moe_tracer *t = NULL;
    hm_error err;
    if (moe_tracer_init(&t, &c, nl, ne, nu, &err) != HM_OK) return NULL;
    return t;
}

static void test_counts(void) {
    hm_error err;
    moe_tracer *t = NULL;
    moe_tracer_config c;
    moe_tracer_config_init(&c);
    HM_CHECK(moe_tracer_init(&t, &c, 0, 8, 2, &err) == HM_ERR_ARG && !t);
    HM_CHECK(moe_tracer_init(&t, &c, 2, 8, 9, &err) == HM_ERR_ARG && !t);
    t = make(3, 8, 2, true, false, false);
    HM_REQUIRE(t);
    /* one token (direct path) */
    const int32_t one[2] = {5, 1};
    moe_tracer_record(t, 0, one, 1, 2);
    /* a batch of 40 tokens (histogram path): token i picks (i % 8, (i * 3 + 1) % 8) */
    int32_t ids[80];
    uint64_t want[8] = {0};
    want[5]++, want[1]++;
    for (int i = 0; i < 40; i++) {
        ids[2 * i] = i % 8;
        ids[2 * i + 1] = (i * 3 + 1) % 8;
        want[i % 8]++, want[(i * 3 + 1) % 8]++;
    }
    ids[7] = -1;                      /* skipped slot: not counted, not rejected */
    want[(3 * 3 + 1) % 8]--;
    ids[9] = 8;                       /* out of range: rejected */
    want[(4 * 3 + 1) % 8]--;
    moe_tracer_record(t, 0, ids, 40, 2);
    for (int e = 0; e < 8; e++) HM_CHECK_MSG(moe_tracer_hits(t, 0, e) == want[e], "e%d", e);
    HM_CHECK(moe_tracer_calls(t, 0) == 2 && moe_tracer_tokens(t, 0) == 41);
    HM_CHECK(moe_tracer_rejected(t) == 1);
    /* a bad layer: every slot rejected, nothing else touched */
    moe_tracer_record(t, 3, one, 1, 2);
    moe_tracer_record(t, -1, one, 1, 2);
    HM_CHECK(moe_tracer_rejected(t) == 5 && moe_tracer_calls(t, 1) == 0);
    /* layer 2, direct path with an out-of-range id */
    const int32_t two[4] = {7, 7, 3, 99};
    moe_tracer_record(t, 2, two, 2, 2);
    HM_CHECK(moe_tracer_hits(t, 2, 7) == 2 && moe_tracer_hits(t, 2, 3) == 1);
    HM_CHECK(moe_tracer_rejected(t) == 6);
    HM_CHECK(moe_tracer_expert_total(t, 7) == want[7] + 2);
    HM_CHECK(moe_tracer_total_tokens(t) == 41);
    HM_CHECK(moe_tracer_hits(t, 9, 0) == 0 && moe_tracer_hits(t, 0, 8) == 0);
    moe_tracer_add_time_ns(t, 1, 2500);
    moe_tracer_add_time_ns(t, 7, 2500); /* ignored */
    HM_CHECK(moe_tracer_time_ns(t, 1) == 2500);
    moe_tracer_add_prompt(t);
    HM_CHECK(moe_tracer_prompts(t) == 1);
    moe_tracer_reset(t);
    HM_CHECK(moe_tracer_hits(t, 0, 0) == 0 && moe_tracer_calls(t, 0) == 0 &&
             moe_tracer_rejected(t) == 0 && moe_tracer_time_ns(t, 1) == 0 &&
             moe_tracer_prompts(t) == 0);
    moe_tracer_free(t);
    /* NULL tracer: every call is a no-op */
    moe_tracer_record(NULL, 0, one, 1, 2);
    moe_tracer_add_time_ns(NULL, 0, 1);
    moe_tracer_add_prompt(NULL);
    HM_CHECK(moe_tracer_hits(NULL, 0, 0) == 0 && moe_tracer_finish(NULL, &err) == HM_OK);
    moe_tracer_free(NULL);
    /* names only: no counting */
    t = make(1, 4, 1, false, true, false);
    HM_REQUIRE(t);
    FILE *f = tmpfile();
    HM_REQUIRE(f);
    moe_tracer_set_log(t, f);
    moe_tracer_record(t, 0, one + 1, 1, 1);
    HM_CHECK(moe_tracer_hits(t, 0, 1) == 0 && moe_tracer_calls(t, 0) == 0);
    fclose(f);
    moe_tracer_free(t);
}

typedef struct {
    moe_tracer *t;
    int seed;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    int32_t ids[64 * 4];
    for (int rep = 0; rep < 2000; rep++) {
        int n = rep % 2 ? 64 : 3; /* both paths */
        for (int i = 0; i < n * 4; i++) ids[i] = (i + w->seed + rep) % 16;
        moe_tracer_record(w->t, rep % 4, ids, n, 4);
    }
    return NULL;
}

static void test_threads(void) {
    moe_tracer *t = make(4, 16, 4, true, false, false);
    HM_REQUIRE(t);
    enum { NT = 4 };
    pthread_t th[NT];
    worker_arg a[NT];
    for (int i = 0; i < NT; i++) {
        a[i] = (worker_arg){t, i * 5};
        HM_REQUIRE(pthread_create(&th[i], NULL, worker, &a[i]) == 0);
    }
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
    /* the same counts, computed single-threaded into a second tracer */
    moe_tracer *u = make(4, 16, 4, true, false, false);
    HM_REQUIRE(u);
    for (int i = 0; i < NT; i++) {
        a[i].t = u;
        worker(&a[i]);
    }
    uint64_t total = 0;
    for (int l = 0; l < 4; l++) {
        HM_CHECK(moe_tracer_calls(t, l) == moe_tracer_calls(u, l));
        HM_CHECK(moe_tracer_calls(t, l) == NT * 500);
        HM_CHECK(moe_tracer_tokens(t, l) == moe_tracer_tokens(u, l));
        for (int e = 0; e < 16; e++) {
            HM_CHECK(moe_tracer_hits(t, l, e) == moe_tracer_hits(u, l, e));
            total += moe_tracer_hits(t, l, e);
        }
    }
    HM_CHECK(total == (uint64_t)NT * 1000 * (64 + 3) * 4);
    moe_tracer_free(t);
    moe_tracer_free(u);
}

static void test_names_log(void) {
    moe_tracer *t = make(2, 8, 2, true, true, false);
    HM_REQUIRE(t);
    FILE *f = tmpfile();
    HM_REQUIRE(f);
    moe_tracer_set_log(t, f);
    const int32_t ids[4] = {3, 6, 3, 1}; /* 2 tokens: expert 3 twice */
    moe_tracer_record(t, 1, ids, 2, 2);
    char *s = slurp(f);
    HM_REQUIRE(s);
    HM_CHECK(!strcmp(s, "[EXPERT-TRACE] Layer 1, Expert 1 (1 tokens): blk.1.ffn_gate_exps.weight[1]\n"
                        "[EXPERT-TRACE] Layer 1, Expert 1 (1 tokens): blk.1.ffn_up_exps.weight[1]\n"
                        "[EXPERT-TRACE] Layer 1, Expert 1 (1 tokens): blk.1.ffn_down_exps.weight[1]\n"
                        "[EXPERT-TRACE] Layer 1, Expert 3 (2 tokens): blk.1.ffn_gate_exps.weight[3]\n"
                        "[EXPERT-TRACE] Layer 1, Expert 3 (2 tokens): blk.1.ffn_up_exps.weight[3]\n"
                        "[EXPERT-TRACE] Layer 1, Expert 3 (2 tokens): blk.1.ffn_down_exps.weight[3]\n"
                        "[EXPERT-TRACE] Layer 1, Expert 6 (1 tokens): blk.1.ffn_gate_exps.weight[6]\n"
                        "[EXPERT-TRACE] Layer 1, Expert 6 (1 tokens): blk.1.ffn_up_exps.weight[6]\n"
                        "[EXPERT-TRACE] Layer 1, Expert 6 (1 tokens): blk.1.ffn_down_exps.weight[6]\n"));
    free(s);
    fclose(f);
    /* custom names (gpt-oss style fused gate_up) */
    hm_error err;
    const char *nm[2] = {"blk.0.ffn_gate_up_exps.weight", "blk.0.ffn_down_exps.weight"};
    HM_CHECK(moe_tracer_set_tensor_names(t, 0, nm, 2, &err) == HM_OK);
    HM_CHECK(moe_tracer_set_tensor_names(t, 2, nm, 2, &err) == HM_ERR_ARG);
    HM_CHECK(moe_tracer_set_tensor_names(t, 0, nm, 5, &err) == HM_ERR_ARG);
    f = tmpfile();
    HM_REQUIRE(f);
    moe_tracer_set_log(t, f);
    moe_tracer_record(t, 0, ids, 1, 1);
    s = slurp(f);
    HM_CHECK(s && !strcmp(s, "[EXPERT-TRACE] Layer 0, Expert 3 (1 tokens): "
                             "blk.0.ffn_gate_up_exps.weight[3]\n[EXPERT-TRACE] Layer 0, Expert 3 "
                             "(1 tokens): blk.0.ffn_down_exps.weight[3]\n"));
    free(s);
    fclose(f);
    moe_tracer_free(t);
}

/* layer 0: experts 2 (3 hits), 0 (1), 1 (1); layer 1: expert 1 (2 hits) */
static moe_tracer *small_trace(bool per_layer) {
    moe_tracer *t = make(2, 3, 1, true, false, per_layer);
    if (!t) return NULL;
    const int32_t a[5] = {2, 0, 2, 1, 2}, b[2] = {1, 1};
    moe_tracer_record(t, 0, a, 5, 1);
    moe_tracer_record(t, 1, b, 2, 1);
    moe_tracer_add_prompt(t);
    return t;
}

static void test_summary(void) {
    moe_tracer *t = small_trace(true);
    HM_REQUIRE(t);
    FILE *f = tmpfile();
    HM_REQUIRE(f);
    moe_tracer_print_summary(t, f);
    char *s = slurp(f);
    HM_REQUIRE(s);
    /* totals: expert 1 = 3, expert 2 = 3, expert 0 = 1; ties by lower id */
    HM_CHECK(!strcmp(s, "\n=== Expert Usage Statistics ===\n"
                        "Total tokens processed: 5\n"
                        "Expert activations (all layers): 7\n"
                        "\nExpert activation counts:\n"
                        "  Expert   1:        3 activations (42.86%)\n"
                        "  Expert   2:        3 activations (42.86%)\n"
                        "  Expert   0:        1 activations (14.29%)\n"
                        "\nPer-layer breakdown:\n"
                        "  Layer 0: 1 calls, 5 tokens\n"
                        "    Expert   2:        3 activations (60.00%)\n"
                        "    Expert   0:        1 activations (20.00%)\n"
                        "    Expert   1:        1 activations (20.00%)\n"
                        "  Layer 1: 1 calls, 2 tokens\n"
                        "    Expert   1:        2 activations (100.00%)\n"));
    free(s);
    fclose(f);
    moe_tracer_free(t);
}

static void test_json_csv(void) {
    moe_tracer *t = small_trace(false);
    HM_REQUIRE(t);
    hm_error err;
    HM_CHECK(moe_tracer_set_model_info(t, "olmoe", NULL, "m.gguf", &err) == HM_OK);
    moe_tracer_add_time_ns(t, 0, 1500);
    hm_json j;
    hm_json_init_buf(&j, false);
    moe_tracer_write_json(t, &j);
    HM_REQUIRE(hm_json_finish(&j, &err) == HM_OK);
    const char *want =
        "{\"format\":\"hotmoe-expert-usage\",\"version\":1,"
        "\"model\":{\"arch\":\"olmoe\",\"file\":\"m.gguf\"},"
        "\"n_layer\":2,\"n_expert\":3,\"n_expert_used\":1,\"prompts\":1,\"total_tokens\":5,"
        "\"rejected\":0,\"experts\":[1,3,3],\"layers\":["
        "{\"layer\":0,\"calls\":1,\"tokens\":5,\"expert_hits_total\":5,\"moe_time_us\":1.5,"
        "\"experts\":[1,1,3]},"
        "{\"layer\":1,\"calls\":1,\"tokens\":2,\"expert_hits_total\":2,\"experts\":[0,2,0]}],"
        "\"expert_activations\":{\"0\":1,\"1\":3,\"2\":3}}";
    HM_CHECK_MSG(!strcmp(hm_json_data(&j, NULL), want), "%s", hm_json_data(&j, NULL));
    hm_json_free(&j);

    /* with per_layer, seed 000's per_layer map too: layers with calls, experts with hits */
    moe_tracer *tp = small_trace(true);
    HM_REQUIRE(tp);
    hm_json_init_buf(&j, false);
    moe_tracer_write_json(tp, &j);
    HM_REQUIRE(hm_json_finish(&j, &err) == HM_OK);
    const char *tail = "\"expert_activations\":{\"0\":1,\"1\":3,\"2\":3},"
                       "\"per_layer\":{\"0\":{\"0\":1,\"1\":1,\"2\":3},\"1\":{\"1\":2}}}";
    const char *got = hm_json_data(&j, NULL);
    HM_CHECK_MSG(strlen(got) > strlen(tail) && !strcmp(got + strlen(got) - strlen(tail), tail), "%s", got);
    hm_json_free(&j);
    moe_tracer_free(tp);

    FILE *f = tmpfile();
    HM_REQUIRE(f);
    HM_CHECK(moe_tracer_write_csv(t, f, &err) == HM_OK);
    char *s = slurp(f);
    HM_CHECK(s && !strcmp(s, "layer,expert,hits,calls,tokens\n0,0,1,1,5\n0,1,1,1,5\n0,2,3,1,5\n"
                             "1,0,0,1,2\n1,1,2,1,2\n1,2,0,1,2\n"));
    free(s);
    fclose(f);

    /* save picks the format by extension */
    char p[512];
    const char *tmp = getenv("HOTMOE_TMP");
    snprintf(p, sizeof(p), "%s/tracer_test.CSV", tmp && *tmp ? tmp : "/tmp");
    HM_CHECK(moe_tracer_save(t, p, &err) == HM_OK);
    f = fopen(p, "rb");
    HM_REQUIRE(f);
    char line[64] = {0};
    HM_CHECK(fgets(line, sizeof(line), f) && !strcmp(line, "layer,expert,hits,calls,tokens\n"));
    fclose(f);
    remove(p);
    snprintf(p, sizeof(p), "%s/tracer_test.json", tmp && *tmp ? tmp : "/tmp");
    HM_CHECK(moe_tracer_save(t, p, &err) == HM_OK);
    f = fopen(p, "rb");
    HM_REQUIRE(f);
    HM_CHECK(fgets(line, sizeof(line), f) && line[0] == '{');
    fclose(f);
    remove(p);
    HM_CHECK(moe_tracer_save(t, "/nonexistent-dir/x.json", &err) == HM_ERR_IO &&
             strstr(err.msg, "/nonexistent-dir/x.json"));
    moe_tracer_free(t);
}

static void test_finish(void) {
    moe_tracer_config c;
    moe_tracer_config_init(&c);
    char p[512];
    const char *tmp = getenv("HOTMOE_TMP");
    snprintf(p, sizeof(p), "%s/tracer_finish.json", tmp && *tmp ? tmp : "/tmp");
    c.output = p; /* counting without the printed summary */
    moe_tracer *t = NULL;
    hm_error err;
    HM_REQUIRE(moe_tracer_init(&t, &c, 1, 2, 1, &err) == HM_OK);
    FILE *f = tmpfile();
    HM_REQUIRE(f);
    moe_tracer_set_log(t, f);
    const int32_t id = 1;
    moe_tracer_record(t, 0, &id, 1, 1);
    HM_CHECK(moe_tracer_hits(t, 0, 1) == 1);
    HM_CHECK(moe_tracer_finish(t, &err) == HM_OK);
    char *s = slurp(f);
    HM_CHECK(s && strstr(s, "exported to") && !strstr(s, "=== Expert Usage"));
    free(s);
    fclose(f);
    FILE *o = fopen(p, "rb");
    HM_CHECK(o != NULL);
    if (o) fclose(o);
    remove(p);
    moe_tracer_free(t);
}

static void test_parse_name(void) {
    int l = -2, e = -2;
    const char *pr = NULL;
    HM_CHECK(moe_tracer_parse_tensor_name("blk.5.ffn_gate_exps.3.weight", &l, &e, &pr) &&
             l == 5 && e == 3 && !strcmp(pr, "gate"));
    HM_CHECK(moe_tracer_parse_tensor_name("blk.12.ffn_down_exps.weight", &l, &e, &pr) &&
             l == 12 && e == -1 && !strcmp(pr, "down"));
    HM_CHECK(moe_tracer_parse_tensor_name("blk.0.ffn_gate_up_exps.weight", &l, &e, &pr) &&
             !strcmp(pr, "gate_up"));
    HM_CHECK(moe_tracer_parse_tensor_name("blk.1.ffn_up_exps.7.weight", &l, &e, &pr) && e == 7 &&
             !strcmp(pr, "up"));
    HM_CHECK(!moe_tracer_parse_tensor_name("blk.1.ffn_up.weight", &l, &e, &pr));
    HM_CHECK(!moe_tracer_parse_tensor_name("blk.1.ffn_up_shexp.weight", &l, &e, &pr));
    HM_CHECK(!moe_tracer_parse_tensor_name("blk.1.ffn_up_exps.bias", &l, &e, &pr));
    HM_CHECK(!moe_tracer_parse_tensor_name("blk.x.ffn_up_exps.weight", &l, &e, &pr));
    HM_CHECK(!moe_tracer_parse_tensor_name("blk.1.ffn_up_exps.3.weightX", &l, &e, &pr));
    HM_CHECK(!moe_tracer_parse_tensor_name("token_embd.weight", &l, &e, &pr));
    HM_CHECK(!moe_tracer_parse_tensor_name(NULL, &l, &e, &pr));
}

HM_TEST_MAIN(test_config_flags, test_config_extract, test_config_env, test_counts, test_threads, test_names_log,
             test_summary, test_json_csv, test_finish, test_parse_name)
