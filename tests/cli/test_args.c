/* test_args.c - the shared flag parser (src/cli/args.c, compiled into this test: the CLI's
 * sources are not part of the library). Defaults are llama.cpp's; every value form and error
 * path is exercised; errors go to stderr (redirected to /dev/null here) and give status 2. */
#include <stdio.h>
#include <stdlib.h>

#include "../../src/cli/args.c"
#include "harness.h"

static int parse(const cli_args_def *def, cli_common_args *a, int argc, char **argv) {
    FILE *saved = stderr;
    FILE *null = fopen("/dev/null", "w");
    if (null) stderr = null;
    int rc = cli_args_parse(def, argc, argv, a);
    if (null) {
        stderr = saved;
        fclose(null);
    }
    return rc;
}

#define ARGV(...) ((char *[]){"cmd", __VA_ARGS__})
#define NARG(...) ((int)(sizeof((char *[]){"cmd", __VA_ARGS__}) / sizeof(char *)))
#define PARSE(def, a, ...) parse(def, a, NARG(__VA_ARGS__), ARGV(__VA_ARGS__))

static const cli_args_def k_all = {"t", NULL, NULL, CLI_ARGS_ALL, NULL, 0};

static void test_defaults(void) {
    cli_common_args a;
    char *argv[] = {"cmd"};
    HM_CHECK(parse(&k_all, &a, 1, argv) == CLI_ARGS_CONTINUE);
    HM_CHECK(a.n_predict == -1 && a.n_ctx == 0 && a.n_batch == 2048 && a.n_ubatch == 512);
    HM_CHECK(a.temp == 0.8f && a.top_k == 40 && a.top_p == 0.95f && a.min_p == 0.05f);
    HM_CHECK(a.repeat_penalty == 1.0f && a.repeat_last_n == 64 && a.seed == CLI_SEED_RANDOM);
    HM_CHECK(!a.seed_given && !a.model && !strcmp(a.cache_type_k, "f16"));
}

static void test_values(void) {
    cli_common_args a;
    HM_CHECK(PARSE(&k_all, &a, "-m", "x.gguf", "-p", "hi", "-n", "7", "-c", "256", "-b", "64",
                   "-ub", "16", "-t", "3", "--temp", "0", "--top-k", "5", "--top-p=0.5",
                   "--min-p", "0.1", "--repeat-penalty", "1.1", "--presence-penalty", "0.5",
                   "--frequency-penalty", "-0.5", "-s", "42", "-ctk", "q8_0",
                   "--cache-type-v=q8_0") == CLI_ARGS_CONTINUE);
    HM_CHECK(!strcmp(a.model, "x.gguf") && !strcmp(a.prompt, "hi") && !a.file);
    HM_CHECK(a.n_predict == 7 && a.n_ctx == 256 && a.n_batch == 64 && a.n_ubatch == 16);
    HM_CHECK(a.n_threads == 3 && a.temp == 0.0f && a.top_k == 5 && a.top_p == 0.5f);
    HM_CHECK(a.min_p == 0.1f && a.repeat_penalty == 1.1f && a.presence_penalty == 0.5f);
    HM_CHECK(a.frequency_penalty == -0.5f && a.seed == 42 && a.seed_given && a.given_n_predict);
    HM_CHECK(!strcmp(a.cache_type_k, "q8_0") && !strcmp(a.cache_type_v, "q8_0"));
    HM_CHECK(cli_args_cache_type("q8_0") == HM_TYPE_Q8_0 && cli_args_cache_type("q4_0") == -1);
    HM_CHECK(PARSE(&k_all, &a, "--seed", "-1") == CLI_ARGS_CONTINUE && a.seed == CLI_SEED_RANDOM);
    HM_CHECK(PARSE(&k_all, &a, "--model=m", "--n-predict=3") == CLI_ARGS_CONTINUE &&
             !strcmp(a.model, "m") && a.n_predict == 3);
    HM_CHECK(PARSE(&k_all, &a, "-f", "t.txt") == CLI_ARGS_CONTINUE && !strcmp(a.file, "t.txt") &&
             !a.prompt);
}

/* Nothing given is dropped silently: -m, -p or -f twice, and -p with -f, are usage errors
 * (their text: tests/cli/errors.sh). Other flags keep llama.cpp's "the last one counts". */
static void test_conflicts(void) {
    cli_common_args a;
    HM_CHECK(PARSE(&k_all, &a, "-m", "a.gguf", "-m", "b.gguf") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "--model=a.gguf", "-m", "a.gguf") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-p", "one", "--prompt", "two") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-f", "a.txt", "-f", "b.txt") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-p", "hi", "-f", "t.txt") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "--file=t.txt", "-p", "hi") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-n", "1", "-n", "2") == CLI_ARGS_CONTINUE && a.n_predict == 2);
    /* a command's own -p (bench's token count) is not the prompt */
    int n_prompt = 0;
    const cli_arg_spec extra[] = {{"-p", NULL, CLI_ARG_INT, &n_prompt, "N", "tokens"}};
    const cli_args_def def = {"t", NULL, NULL, CLI_ARGS_MODEL | CLI_ARGS_FILE, extra, 1};
    HM_CHECK(PARSE(&def, &a, "-p", "8", "-f", "t.txt") == CLI_ARGS_CONTINUE && n_prompt == 8);
}

static void test_errors(void) {
    cli_common_args a;
    HM_CHECK(PARSE(&k_all, &a, "--bogus") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "stray") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-n") == CLI_ARGS_USAGE);          /* missing value */
    HM_CHECK(PARSE(&k_all, &a, "-n", "12abc") == CLI_ARGS_USAGE); /* not all consumed */
    HM_CHECK(PARSE(&k_all, &a, "-n", "") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-c", "99999999999") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "--temp", "nan") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "--temp", "-1") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "--top-p", "0") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "--min-p", "2") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-n", "-2") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-b", "0") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-t", "-1") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-ctk", "q4_0") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "-s", "+3") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&k_all, &a, "--repeat-penalty", "0") == CLI_ARGS_USAGE);
    /* a group the command does not take is an unknown flag */
    const cli_args_def model_only = {"t", NULL, NULL, CLI_ARGS_MODEL, NULL, 0};
    HM_CHECK(PARSE(&model_only, &a, "--temp", "1") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&model_only, &a, "-f", "x") == CLI_ARGS_USAGE);
}

static void test_extra(void) {
    int n = 0;
    bool flag = false;
    const char *name = NULL;
    float x = 0;
    uint64_t big = 0;
    const cli_arg_spec extra[] = {
        {"-n", "--n-gen", CLI_ARG_INT, &n, "N", "overrides the common -n"},
        {"--flag", NULL, CLI_ARG_BOOL, &flag, NULL, "a switch"},
        {"-o", "--output", CLI_ARG_STR, &name, "F", "a string"},
        {"--x", NULL, CLI_ARG_FLOAT, &x, "X", "a float"},
        {"--big", NULL, CLI_ARG_U64, &big, "N", "a u64"},
    };
    const cli_args_def def = {"t", NULL, NULL, CLI_ARGS_PROMPT, extra, 5};
    cli_common_args a;
    HM_CHECK(PARSE(&def, &a, "-n", "128", "--flag", "--output=o.json", "--x", "2.5", "--big",
                   "18446744073709551615") == CLI_ARGS_CONTINUE);
    HM_CHECK(n == 128 && a.n_predict == -1 && !a.given_n_predict); /* the command's own -n */
    HM_CHECK(flag && !strcmp(name, "o.json") && x == 2.5f && big == UINT64_MAX);
    HM_CHECK(PARSE(&def, &a, "--flag=1") == CLI_ARGS_USAGE); /* a switch takes no value */
    HM_CHECK(PARSE(&def, &a, "--big", "18446744073709551616") == CLI_ARGS_USAGE);
    /* -h prints help on stdout and asks the command to exit 0 */
    FILE *saved = stdout, *null = fopen("/dev/null", "w");
    HM_REQUIRE(null);
    stdout = null;
    int rc = PARSE(&def, &a, "--flag", "-h");
    stdout = saved;
    fclose(null);
    HM_CHECK(rc == CLI_ARGS_HELP);
}

/* Like PARSE, keeping the one error line (stderr) in msg. */
static int parse_msg(const cli_args_def *def, cli_common_args *a, char *msg, size_t cap, int argc,
                     char **argv) {
    hm_t_log l;
    hm_t_log_begin(&l);
    int rc = cli_args_parse(def, argc, argv, a);
    char *buf = hm_t_log_end(&l);
    snprintf(msg, cap, "%s", buf ? buf : "");
    free(buf);
    return rc;
}
#define PARSE_MSG(def, a, msg, ...)                                                           \
    parse_msg(def, a, msg, sizeof(msg), NARG(__VA_ARGS__), ARGV(__VA_ARGS__))

/* The placement flags: -ngl, -cmoe/--cpu-moe, -ncmoe/--n-cpu-moe, -ot/--override-tensor
 * (repeatable; cli_args_overrides joins the values with ','), --vram-budget. */
static void test_placement_flags(void) {
    cli_common_args a;
    char *argv[] = {"cmd"};
    HM_CHECK(parse(&k_all, &a, 1, argv) == CLI_ARGS_CONTINUE);
    HM_CHECK(a.n_gpu_layers == 0 && !a.cpu_moe && a.n_cpu_moe == 0 && a.override_tensor.n == 0);
    HM_CHECK(a.vram_budget_mib == 0 && !a.given_vram_budget && !a.gpu_strict);
    HM_CHECK(!cli_args_placement_given(&a) && cli_args_overrides(&a, NULL) == NULL);

    HM_CHECK(PARSE(&k_all, &a, "-ngl", "3", "--cpu-moe", "--n-cpu-moe", "2", "-ot",
                   "blk\\.1\\.ffn_up_exps=CPU", "--override-tensor=a=CUDA0,b=CPU",
                   "--vram-budget", "8192", "--gpu-strict") == CLI_ARGS_CONTINUE);
    HM_CHECK(a.n_gpu_layers == 3 && a.cpu_moe && a.n_cpu_moe == 2 && a.gpu_strict);
    HM_CHECK(a.vram_budget_mib == 8192 && a.given_vram_budget);
    HM_REQUIRE(a.override_tensor.n == 2);
    HM_CHECK(!strcmp(a.override_tensor.v[0], "blk\\.1\\.ffn_up_exps=CPU"));
    HM_CHECK(!strcmp(a.override_tensor.v[1], "a=CUDA0,b=CPU")); /* the first '=' splits */
    bool oom = true;
    char *ot = cli_args_overrides(&a, &oom);
    HM_CHECK(!oom && ot && !strcmp(ot, "blk\\.1\\.ffn_up_exps=CPU,a=CUDA0,b=CPU"));
    free(ot);
    HM_CHECK(cli_args_placement_given(&a));
    /* llama.cpp's short spellings, and any -ngl (partial counts) */
    HM_CHECK(PARSE(&k_all, &a, "-cmoe", "-ncmoe", "7", "-ngl", "1") == CLI_ARGS_CONTINUE);
    HM_CHECK(a.cpu_moe && a.n_cpu_moe == 7 && a.n_gpu_layers == 1);
    HM_CHECK(PARSE(&k_all, &a, "--n-gpu-layers=999") == CLI_ARGS_CONTINUE &&
             a.n_gpu_layers == 999 && cli_args_placement_given(&a));
    HM_CHECK(PARSE(&k_all, &a, "--n-cpu-moe=0") == CLI_ARGS_CONTINUE &&
             !cli_args_placement_given(&a));
    HM_CHECK(PARSE(&k_all, &a, "--vram-budget", "1") == CLI_ARGS_CONTINUE &&
             cli_args_placement_given(&a));

    /* errors: one line naming the flag, status 2 */
    char msg[256];
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "-ngl", "-1") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "-ngl must be >= 0"), "%s", msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "-ngl", "all") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "'-ngl' needs an integer, got 'all'"), "%s", msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "--n-cpu-moe", "-2") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "--n-cpu-moe must be >= 0"), "%s", msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "-ncmoe", "2x") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "'-ncmoe' needs an integer, got '2x'"), "%s", msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "--vram-budget", "0") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "--vram-budget must be >= 1 (MiB)"), "%s", msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "--vram-budget", "-5") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "--vram-budget must be >= 1"), "%s", msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "--vram-budget", "8GiB") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "needs an integer, got '8GiB'"), "%s", msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "-ot") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "flag '-ot' needs a value"), "%s", msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "-ot", "") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "-ot needs REGEX=DEVICE"), "%s", msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "--cpu-moe=1") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "takes no value"), "%s", msg);
    /* -ot at most CLI_LIST_MAX times */
    char *many[2 * CLI_LIST_MAX + 3];
    many[0] = "cmd";
    for (int i = 0; i <= CLI_LIST_MAX; i++) {
        many[1 + 2 * i] = "-ot";
        many[2 + 2 * i] = "x=CPU";
    }
    HM_CHECK(parse(&k_all, &a, 2 * CLI_LIST_MAX + 1, many) == CLI_ARGS_CONTINUE &&
             a.override_tensor.n == CLI_LIST_MAX);
    HM_CHECK(parse_msg(&k_all, &a, msg, sizeof(msg), 2 * CLI_LIST_MAX + 3, many) ==
             CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "given more than 64 times"), "%s", msg);
    /* the placement flags belong to the context group */
    const cli_args_def no_ctx = {"t", NULL, NULL, CLI_ARGS_MODEL | CLI_ARGS_SAMPLING, NULL, 0};
    HM_CHECK(PARSE(&no_ctx, &a, "--cpu-moe") == CLI_ARGS_USAGE);
    HM_CHECK(PARSE(&no_ctx, &a, "-ot", "x=CPU") == CLI_ARGS_USAGE);
}

/* --moe-offload-threshold N: 0 (the cost model) by default, any N >= 0, not a placement flag
 * (it changes how a tiered plan runs, not the plan), refused below 0 or without a number, and
 * only in context commands. */
static void test_offload_threshold(void) {
    cli_common_args a;
    char *argv[] = {"cmd"};
    HM_CHECK(parse(&k_all, &a, 1, argv) == CLI_ARGS_CONTINUE && a.moe_offload_threshold == 0);
    HM_CHECK(PARSE(&k_all, &a, "--moe-offload-threshold", "32") == CLI_ARGS_CONTINUE &&
             a.moe_offload_threshold == 32 && !cli_args_placement_given(&a));
    HM_CHECK(PARSE(&k_all, &a, "--moe-offload-threshold=1", "--cpu-moe") == CLI_ARGS_CONTINUE &&
             a.moe_offload_threshold == 1 && a.cpu_moe);
    HM_CHECK(PARSE(&k_all, &a, "--moe-offload-threshold", "0") == CLI_ARGS_CONTINUE &&
             a.moe_offload_threshold == 0);
    char msg[256];
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "--moe-offload-threshold", "-1") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "--moe-offload-threshold must be >= 0"), "%s", msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "--moe-offload-threshold", "many") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "'--moe-offload-threshold' needs an integer, got 'many'"), "%s",
                 msg);
    HM_CHECK(PARSE_MSG(&k_all, &a, msg, "--moe-offload-threshold") == CLI_ARGS_USAGE);
    HM_CHECK_MSG(strstr(msg, "needs a value"), "%s", msg);
    const cli_args_def no_ctx = {"t", NULL, NULL, CLI_ARGS_MODEL | CLI_ARGS_SAMPLING, NULL, 0};
    HM_CHECK(PARSE(&no_ctx, &a, "--moe-offload-threshold", "4") == CLI_ARGS_USAGE);
}

/* --help of a context command lists every placement flag with its spellings. */
static void test_placement_help(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    HM_REQUIRE(f);
    cli_args_usage(f, &k_all);
    fclose(f);
    HM_REQUIRE(buf);
    const char *want[] = {"-ngl, --n-gpu-layers N", "-cmoe, --cpu-moe", "-ncmoe, --n-cpu-moe N",
                          "-ot, --override-tensor REGEX=DEV,...", "--vram-budget MiB",
                          "-mg, --main-gpu INDEX", "--gpu-strict",
                          "--moe-offload-threshold N"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        HM_CHECK_MSG(strstr(buf, want[i]), "help lacks '%s'", want[i]);
    free(buf);
}

HM_TEST_MAIN(test_defaults, test_values, test_conflicts, test_errors, test_extra,
             test_placement_flags, test_offload_threshold, test_placement_help)
