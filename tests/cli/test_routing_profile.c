/* test_routing_profile.c - `hotmoe learn --routing-profile` as a user runs it, on forged tiny
 * models (tiny-qwen3moe: 4 layers of 16 experts, 4 used; tiny-olmoe: 2 layers of 8, 2 used):
 *   - the profile parses with moe_routing_profile_load; its tokens equal the tokens learn says
 *     it ran; every layer has selections = tokens x n_used, hits summing to them and equal to
 *     the learn file's per-layer expert hits (the tracer counted the same routing); sequences =
 *     prompts; the distance-1 denominator is (tokens - sequences) x n_used (every token but a
 *     sequence's first); rates in [0, 1], LRU hit rates non-decreasing in the cache size;
 *   - the learn file is the same bytes with and without --routing-profile;
 *   - the same profile for 1 and 2 threads;
 *   - --corpus (documents separated by "<|endoftext|>", windows of -c tokens) with --max-tokens:
 *     exactly that many tokens, one sequence per window, windows never longer than -c;
 *   - the table on stderr; usage errors exit 2, bad input 1, with one line naming the cause.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"
#include "moe/learn_file.h"
#include "moe/routing_stats.h"

static char g_err[1 << 16];

/* Runs cmd with stderr into g_err; returns the exit status (-1 when it did not exit). */
static int run(const char *cmd) {
    const char *tmp = getenv("HOTMOE_TMP");
    char full[4096], pe[512];
    snprintf(pe, sizeof(pe), "%s/rp.err", tmp);
    snprintf(full, sizeof(full), "%s >/dev/null 2>%s", cmd, pe);
    int st = system(full);
    g_err[0] = 0;
    FILE *f = fopen(pe, "rb");
    if (f) {
        size_t n = fread(g_err, 1, sizeof(g_err) - 1, f);
        g_err[n] = 0;
        fclose(f);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *c = malloc(n + 1);
    if (c) memcpy(c, buf, n + 1);
    return c;
}

/* "hotmoe learn: N prompts, T tokens, ..." (or "windows") from g_err. */
static bool learn_counts(long *n_seq, long *n_tok) {
    const char *p = strstr(g_err, "hotmoe learn: ");
    while (p) {
        char kind[16];
        if (sscanf(p, "hotmoe learn: %ld %15s %ld tokens", n_seq, kind, n_tok) == 3) return true;
        p = strstr(p + 1, "hotmoe learn: ");
    }
    return false;
}

static bool in01(double v) { return v >= 0 && v <= 1; }

/* The checks every profile of a run of n_tok tokens in n_seq sequences must pass. */
static void check_profile(const moe_routing_profile *p, const char *tag, long n_seq, long n_tok,
                          int n_layer, int n_expert, int n_used) {
    HM_CHECK_MSG(p->measured && p->version == 1 && p->n_layer == n_layer &&
                     p->n_expert == n_expert && p->n_expert_used == n_used,
                 "%s: header", tag);
    HM_CHECK_MSG(p->tokens == n_tok && p->sequences == n_seq && p->rejected == 0,
                 "%s: tokens %lld (learn: %ld), sequences %lld (learn: %ld)", tag,
                 (long long)p->tokens, n_tok, (long long)p->sequences, n_seq);
    if (!p->layers) {
        HM_CHECK_MSG(false, "%s: no layers", tag);
        return;
    }
    for (int l = 0; l < p->n_layer; l++) {
        const moe_routing_layer *y = &p->layers[l];
        uint64_t sum = 0;
        for (int e = 0; y->hits && e < n_expert; e++) sum += y->hits[e];
        HM_CHECK_MSG(y->tokens == (uint64_t)n_tok && y->selections == (uint64_t)n_tok * n_used &&
                         y->hits && sum == y->selections,
                     "%s: layer %d: %llu tokens, %llu selections, hits sum %llu", tag, l,
                     (unsigned long long)y->tokens, (unsigned long long)y->selections,
                     (unsigned long long)sum);
        HM_CHECK_MSG(y->has_repeat_counts &&
                         y->repeat_considered[0] == (uint64_t)(n_tok - n_seq) * n_used,
                     "%s: layer %d: distance-1 denominator %llu, want (%ld - %ld) x %d", tag, l,
                     (unsigned long long)y->repeat_considered[0], n_tok, n_seq, n_used);
        HM_CHECK_MSG(y->weight_mass != NULL && !isnan(y->f.w_top_share[0]),
                     "%s: layer %d: the CPU path gives gating weights", tag, l);
        for (int i = 0; i < MOE_ROUTING_N_TOP; i++) HM_CHECK(in01(y->f.top_share[i]));
        for (int i = 1; i < MOE_ROUTING_N_TOP; i++)
            HM_CHECK(y->f.top_share[i] >= y->f.top_share[i - 1]);
        HM_CHECK(y->f.experts_for[0] >= 1 && y->f.experts_for[2] <= n_expert &&
                 y->f.experts_for[0] <= y->f.experts_for[1]);
        HM_CHECK(in01(y->f.repeat[0]) && y->f.repeat[0] <= 1);
        for (int c = 0; c < MOE_ROUTING_N_LRU; c++) {
            HM_CHECK(in01(y->f.lru_hit[c]));
            if (c) HM_CHECK_MSG(y->lru_hits[c] >= y->lru_hits[c - 1], "%s: layer %d LRU", tag, l);
        }
    }
    HM_CHECK_MSG(!isnan(p->avg.top_share[0]) && !isnan(p->avg.repeat[0]) &&
                     !isnan(p->avg.lru_hit[8]),
                 "%s: averages known", tag);
}

static const char k_prompts[] =
    "The ferry left the north bank at seven in the morning.\n"
    "\n"
    "Most of the passengers were regulars, and most of them read.\n"
    "A market opened in the square at eight; the stalls sold bread, fish and lamps.\n";

static void test_learn_profile(void) {
    const char *bin = getenv("HOTMOE_BIN"), *tmp = getenv("HOTMOE_TMP");
    HM_REQUIRE(bin && tmp);
    const struct {
        const char *preset;
        int nl, ne, nu;
    } models[] = {{"tiny-qwen3moe", 4, 16, 4}, {"tiny-olmoe", 2, 8, 2}};
    char model[512], prompts[512], learn_a[512], learn_b[512], prof1[512], prof2[512];
    char cmd[4096];
    snprintf(prompts, sizeof(prompts), "%s/rp-prompts.txt", tmp);
    FILE *f = fopen(prompts, "w");
    HM_REQUIRE(f);
    fputs(k_prompts, f);
    fclose(f);
    for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); m++) {
        snprintf(model, sizeof(model), "%s/rp-%s.gguf", tmp, models[m].preset);
        snprintf(learn_a, sizeof(learn_a), "%s/rp-learn-a.json", tmp);
        snprintf(learn_b, sizeof(learn_b), "%s/rp-learn-b.json", tmp);
        snprintf(prof1, sizeof(prof1), "%s/rp-prof1.json", tmp);
        snprintf(prof2, sizeof(prof2), "%s/rp-prof2.json", tmp);
        snprintf(cmd, sizeof(cmd), "%s forge --preset %s --type q8_0 --no-hf -q -o %s", bin,
                 models[m].preset, model);
        HM_REQUIRE(system(cmd) == 0);

        snprintf(cmd, sizeof(cmd), "%s learn -m %s -f %s -n 6 -t 1 -o %s --routing-profile %s",
                 bin, model, prompts, learn_a, prof1);
        HM_CHECK_MSG(run(cmd) == 0, "%s: %s", models[m].preset, g_err);
        long n_seq = 0, n_tok = 0;
        HM_CHECK(learn_counts(&n_seq, &n_tok) && n_seq == 3 && n_tok > 3 * 6);
        HM_CHECK(strstr(g_err, "routing profile: ") && strstr(g_err, "\n  avg "));
        moe_routing_profile p;
        hm_error err;
        HM_REQUIRE(moe_routing_profile_load(prof1, &p, &err) == HM_OK);
        check_profile(&p, models[m].preset, n_seq, n_tok, models[m].nl, models[m].ne, models[m].nu);
        HM_CHECK(p.arch && p.file && !strcmp(p.file, model) && strstr(p.source, "-f "));
        /* the tracer saw the same routing */
        moe_learn lf;
        HM_REQUIRE(moe_learn_load(learn_a, &lf, &err) == HM_OK);
        for (int l = 0; p.layers && l < lf.n_layer; l++)
            HM_CHECK_MSG(lf.layers[l].tokens == p.layers[l].tokens &&
                             !memcmp(lf.layers[l].experts, p.layers[l].hits,
                                     sizeof(uint64_t) * (size_t)lf.n_expert),
                         "%s: layer %d: learn file and profile disagree", models[m].preset, l);
        moe_learn_free(&lf);
        moe_routing_profile_free(&p);

        /* the learn file does not change with the profile on; the profile not with threads */
        snprintf(cmd, sizeof(cmd), "%s learn -m %s -f %s -n 6 -t 1 -o %s", bin, model, prompts,
                 learn_b);
        HM_CHECK(run(cmd) == 0);
        char *a = slurp(learn_a), *b = slurp(learn_b);
        HM_CHECK(a && b && !strcmp(a, b));
        free(a);
        free(b);
        snprintf(cmd, sizeof(cmd), "%s learn -m %s -f %s -n 6 -t 2 --routing-profile %s", bin,
                 model, prompts, prof2);
        HM_CHECK(run(cmd) == 0);
        a = slurp(prof1);
        b = slurp(prof2);
        HM_CHECK_MSG(a && b && !strcmp(a, b), "%s: profiles differ between 1 and 2 threads",
                     models[m].preset);
        free(a);
        free(b);
        remove(model);
    }
}

static void test_corpus_windows(void) {
    const char *bin = getenv("HOTMOE_BIN"), *tmp = getenv("HOTMOE_TMP");
    HM_REQUIRE(bin && tmp);
    char model[512], corpus[512], prof[512], cmd[4096];
    snprintf(model, sizeof(model), "%s/rp-corpus.gguf", tmp);
    snprintf(corpus, sizeof(corpus), "%s/rp-corpus.txt", tmp);
    snprintf(prof, sizeof(prof), "%s/rp-corpus.json", tmp);
    snprintf(cmd, sizeof(cmd), "%s forge --preset tiny-olmoe --type q8_0 --no-hf -q -o %s", bin,
             model);
    HM_REQUIRE(system(cmd) == 0);
    FILE *f = fopen(corpus, "w");
    HM_REQUIRE(f);
    /* four documents (one blank between separators is skipped), the last without a separator */
    fputs("The ferry left the north bank at seven in the morning. Most of the passengers were\n"
          "regulars; they read, or slept, or watched the water go by.\n"
          "<|endoftext|>\n"
          "A market opened in the square at eight.\n"
          "<|endoftext|>\r\n"
          "   \n"
          "<|endoftext|>\n"
          "Lamps, bread, fish, rope, nails and paper were sold there every day but Sunday, and\n"
          "the town's clock struck each hour over the noise of the stalls.\n"
          "<|endoftext|>\n"
          "Short.",
          f);
    fclose(f);
    /* all of it, windows of 16 tokens */
    snprintf(cmd, sizeof(cmd), "%s learn -m %s --corpus %s -c 16 -t 1 --routing-profile %s", bin,
             model, corpus, prof);
    HM_CHECK_MSG(run(cmd) == 0, "%s", g_err);
    long n_win = 0, n_tok = 0;
    HM_CHECK(learn_counts(&n_win, &n_tok) && strstr(g_err, " windows, "));
    HM_CHECK_MSG(n_win >= 4 && n_tok <= 16 * n_win && n_tok > 16 * (n_win - 4),
                 "%ld windows of at most 16 tokens for %ld tokens in 4 documents", n_win, n_tok);
    moe_routing_profile p;
    hm_error err;
    HM_REQUIRE(moe_routing_profile_load(prof, &p, &err) == HM_OK);
    check_profile(&p, "corpus", n_win, n_tok, 2, 8, 2);
    HM_CHECK(strstr(p.source, "--corpus") != NULL);
    moe_routing_profile_free(&p);
    const long all = n_tok;
    /* --max-tokens: exactly that many */
    snprintf(cmd, sizeof(cmd),
             "%s learn -m %s --corpus %s -c 16 -t 1 --max-tokens 37 --routing-profile %s "
             "--profile-source 'tiny test corpus'",
             bin, model, corpus, prof);
    HM_CHECK_MSG(run(cmd) == 0, "%s", g_err);
    HM_CHECK(learn_counts(&n_win, &n_tok) && n_tok == 37 && n_win >= 3 && all > 37);
    HM_REQUIRE(moe_routing_profile_load(prof, &p, &err) == HM_OK);
    check_profile(&p, "corpus --max-tokens", n_win, 37, 2, 8, 2);
    HM_CHECK(!strcmp(p.source, "tiny test corpus"));
    moe_routing_profile_free(&p);
    remove(model);
}

/* Copies fmt into out with {E}, {P}, {T} replaced by e, p, t. */
static void expand(char *out, size_t n, const char *fmt, const char *e, const char *p,
                   const char *t) {
    size_t o = 0;
    for (const char *c = fmt; *c && o + 1 < n; c++) {
        const char *rep = NULL;
        if (c[0] == '{' && c[1] && c[2] == '}')
            rep = c[1] == 'E' ? e : c[1] == 'P' ? p : c[1] == 'T' ? t : NULL;
        if (rep) {
            o += (size_t)snprintf(out + o, n - o, "%s", rep);
            if (o >= n) o = n - 1;
            c += 2;
        } else {
            out[o++] = *c;
        }
    }
    out[o] = 0;
}

static void test_errors(void) {
    const char *bin = getenv("HOTMOE_BIN"), *tmp = getenv("HOTMOE_TMP");
    HM_REQUIRE(bin && tmp);
    char model[512], cmd[4096], empty[512], prompts[512];
    snprintf(model, sizeof(model), "%s/rp-err.gguf", tmp);
    snprintf(empty, sizeof(empty), "%s/rp-empty.txt", tmp);
    snprintf(prompts, sizeof(prompts), "%s/rp-prompts.txt", tmp);
    snprintf(cmd, sizeof(cmd), "%s forge --preset tiny-olmoe --type q8_0 --no-hf -q -o %s", bin,
             model);
    HM_REQUIRE(system(cmd) == 0);
    FILE *f = fopen(empty, "w");
    HM_REQUIRE(f);
    fputs("\n<|endoftext|>\n  \n<|endoftext|>\n", f);
    fclose(f);
    f = fopen(prompts, "w");
    HM_REQUIRE(f);
    fputs(k_prompts, f);
    fclose(f);
    const struct {
        const char *args;
        int rc;
        const char *msg;
    } cases[] = {
        {"-f {P} --corpus {P} --routing-profile {T}/x.json", 2, "-f and --corpus"},
        {"-f {P}", 2, "-o FILE is required (or --routing-profile FILE)"},
        {"--routing-profile {T}/x.json", 2, "-f PROMPTS is required (or --corpus FILE)"},
        {"-f {P} --routing-profile {T}/x.json --max-tokens -1", 2, "--max-tokens must be >= 0"},
        {"--corpus {E} --routing-profile {T}/x.json", 1, "has no documents"},
        {"-f {P} --routing-profile /nonexistent-dir/x.json", 1, "/nonexistent-dir/x.json"},
        {"--corpus {T}/none.txt --routing-profile {T}/x.json", 1, "none.txt"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char args[1024];
        expand(args, sizeof(args), cases[i].args, empty, prompts, tmp);
        snprintf(cmd, sizeof(cmd), "%s learn -m %s -t 1 %s", bin, model, args);
        int rc = run(cmd);
        HM_CHECK_MSG(rc == cases[i].rc && strstr(g_err, cases[i].msg),
                     "case %zu (%s): exit %d, want %d; stderr: %s", i, cases[i].args, rc,
                     cases[i].rc, g_err);
        const char *nl = strchr(g_err, '\n');
        HM_CHECK_MSG(nl && !nl[1], "case %zu: one line on stderr: %s", i, g_err);
    }
    /* -ngl 99: on a GPU the engine only counts hits, so the profile is refused (exit 1, the
     * reason named); without one the model falls back to the CPU and the profile is written */
    char prof[512];
    snprintf(prof, sizeof(prof), "%s/rp-gpu.json", tmp);
    remove(prof);
    snprintf(cmd, sizeof(cmd), "%s learn -m %s -t 1 -f %s -ngl 99 --routing-profile %s", bin, model,
             prompts, prof);
    int rc = run(cmd);
    FILE *pf = fopen(prof, "rb");
    const bool written = pf != NULL;
    if (pf) fclose(pf);
    if (rc == 0)
        HM_CHECK_MSG(strstr(g_err, "hotmoe learn: CPU,") && written,
                     "-ngl 99 ran without refusing, so it must have run on the CPU: %s", g_err);
    else
        HM_CHECK_MSG(rc == 1 && strstr(g_err, "--routing-profile needs every token's expert ids") &&
                         !written,
                     "-ngl 99 on a GPU: exit %d, %s", rc, g_err);
    printf("       (-ngl 99: %s)\n", rc == 0 ? "no GPU, ran on the CPU" : "GPU, refused");
    remove(prof);
    remove(model);
}

HM_TEST_MAIN(test_learn_profile, test_corpus_windows, test_errors)
