/* cmd_forge.c - `hotmoe forge`: write a GGUF model (and its HuggingFace copy) of a real MoE
 * architecture with synthetic weights. See docs/FORGE.md. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "forge/forge.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: hotmoe forge --preset NAME [options]\n"
            "       hotmoe forge --list\n\n"
            "Writes a GGUF model of a real MoE architecture with synthetic, seeded weights, exactly\n"
            "as llama.cpp loads it, plus (optionally) the same weights as a HuggingFace directory.\n\n"
            "options:\n"
            "  --preset NAME        model to forge (see --list)\n"
            "  --type MIX           f32 | f16 | q8_0 | q4_k_m | mxfp4 (default q4_k_m)\n"
            "  -o, --out PATH       GGUF path (default NAME-MIX.gguf)\n"
            "  --hf DIR             write the HF copy to DIR (default: PATH minus .gguf plus -hf\n"
            "                       for tiny presets, none for big ones)\n"
            "  --no-hf              no HF copy\n"
            "  --fuse-gate-up       experts' gate and up in one ffn_gate_up_exps, as llama.cpp's\n"
            "                       --fuse-gate-up-exps (gemma4, qwen3next, qwen35moe)\n"
            "  --seed N             weights seed (default 42)\n"
            "  --skew zipf:S        plant a Zipf(S) expert popularity in every router (default none)\n"
            "  --direct auto|on|off quantised blocks straight from the RNG instead of quantising\n"
            "                       floats (auto: on above 2e9 parameters)\n"
            "  --threads N          worker threads (default: online CPUs)\n"
            "  --n-layer N --n-expert N --n-expert-used N --n-vocab N --n-ctx N\n"
            "                       override the preset's hyper-parameters\n"
            "  --simulate N,N,...   print the simulated hit rate of a cache holding the N most\n"
            "                       popular experts per layer (Gaussian inputs), write nothing\n"
            "  --sim-samples N      hidden states per layer for --simulate (default 2000)\n"
            "  --list               list presets with parameter counts and sizes per mix\n"
            "  -q, --quiet          no progress or summary\n");
}

static int fail_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "hotmoe forge: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (try 'hotmoe forge --help')\n");
    return 2;
}

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static int list_presets(void) {
    printf("%-20s %-9s %8s %8s %6s", "preset", "arch", "params", "experts", "top-k");
    for (int m = 0; m < FORGE_MIX_COUNT; m++) printf(" %9s", forge_mix_name((forge_mix)m));
    printf("\n");
    for (int i = 0; i < forge_preset_count(); i++) {
        const forge_preset *p = forge_preset_at(i);
        int64_t np = 0;
        printf("%-20s %-9s", p->name, forge_arch_name(p->arch));
        uint64_t sizes[FORGE_MIX_COUNT] = {0};
        for (int m = 0; m < FORGE_MIX_COUNT; m++) {
            forge_tensor_list l;
            hm_error err;
            if (forge_tensors_build(p, (forge_mix)m, &l, &err) != HM_OK) {
                fprintf(stderr, "hotmoe forge: %s\n", err.msg);
                return 1;
            }
            forge_tensors_totals(&l, &np, &sizes[m]);
            forge_tensors_free(&l);
        }
        if (np >= 1000000000) printf(" %7.2fB", (double)np / 1e9);
        else printf(" %7.2fM", (double)np / 1e6);
        printf(" %8lld %6lld", (long long)p->n_expert, (long long)p->n_expert_used);
        for (int m = 0; m < FORGE_MIX_COUNT; m++) {
            double gib = (double)sizes[m] / 1073741824.0;
            if (gib >= 0.1) printf(" %7.2fGi", gib);
            else printf(" %7.2fMi", (double)sizes[m] / 1048576.0);
        }
        printf("\n");
    }
    printf("(sizes: tensor data; the tokenizer adds a few MiB to the big presets)\n");
    return 0;
}

static int simulate(const forge_preset *p, const forge_gen *g, const char *spec, int64_t samples) {
    int ns[32], n = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t v;
        if (n == 32 || !parse_i64(tok, 1, p->n_expert, &v))
            return fail_usage("--simulate wants cache sizes 1..n_expert separated by commas, got '%s'", spec);
        ns[n++] = (int)v;
    }
    if (!n) return fail_usage("--simulate wants cache sizes, got '%s'", spec);
    double hit[32];
    hm_error err;
    if (forge_sim_hits(p, g, (int)samples, ns, n, hit, &err) != HM_OK) {
        fprintf(stderr, "hotmoe forge: %s\n", err.msg);
        return 1;
    }
    printf("%s skew %.2f (%lld experts, top-%lld, %lld Gaussian samples per layer)\n", p->name, g->skew_s,
           (long long)p->n_expert, (long long)p->n_expert_used, (long long)samples);
    for (int j = 0; j < n; j++) printf("  top %3d experts/layer: hit rate %.4f\n", ns[j], hit[j]);
    return 0;
}

int cmd_forge(int argc, char **argv) {
    const char *preset_name = NULL, *mix_name = "q4_k_m", *out = NULL, *hf = NULL, *sim = NULL;
    const char *direct = "auto";
    bool no_hf = false, quiet = false, list = false, fuse = false;
    int64_t seed = 42, threads = sysconf(_SC_NPROCESSORS_ONLN), sim_samples = 2000;
    double skew = 0;
    struct { const char *flag; int64_t val; bool set; int64_t lo, hi; } ov[] = {
        {"--n-layer", 0, false, 1, 1024}, {"--n-expert", 0, false, 2, 1024},
        {"--n-expert-used", 0, false, 1, 1024}, {"--n-vocab", 0, false, 600, 1000000},
        {"--n-ctx", 0, false, 1, 1 << 24},
    };
    const int n_ov = (int)(sizeof(ov) / sizeof(ov[0]));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VAL() do { if (!val) return fail_usage("%s needs a value", a); i++; } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--list")) list = true;
        else if (!strcmp(a, "--preset")) { NEED_VAL(); preset_name = val; }
        else if (!strcmp(a, "--type")) { NEED_VAL(); mix_name = val; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) { NEED_VAL(); out = val; }
        else if (!strcmp(a, "--hf")) { NEED_VAL(); hf = val; }
        else if (!strcmp(a, "--no-hf")) no_hf = true;
        else if (!strcmp(a, "--fuse-gate-up")) fuse = true;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) quiet = true;
        else if (!strcmp(a, "--direct")) { NEED_VAL(); direct = val; }
        else if (!strcmp(a, "--simulate")) { NEED_VAL(); sim = val; }
        else if (!strcmp(a, "--seed")) {
            NEED_VAL();
            if (!parse_i64(val, 0, INT64_MAX, &seed)) return fail_usage("--seed wants a non-negative integer, got '%s'", val);
        } else if (!strcmp(a, "--threads")) {
            NEED_VAL();
            if (!parse_i64(val, 1, 64, &threads)) return fail_usage("--threads wants 1..64, got '%s'", val);
        } else if (!strcmp(a, "--sim-samples")) {
            NEED_VAL();
            if (!parse_i64(val, 1, 10000000, &sim_samples)) return fail_usage("--sim-samples wants 1..10000000, got '%s'", val);
        } else if (!strcmp(a, "--skew")) {
            NEED_VAL();
            char *end;
            if (strncmp(val, "zipf:", 5) != 0) return fail_usage("--skew wants zipf:S, got '%s'", val);
            errno = 0;
            skew = strtod(val + 5, &end);
            if (errno || *end || end == val + 5 || !(skew >= 0 && skew <= 16))
                return fail_usage("--skew wants zipf:S with S in 0..16, got '%s'", val);
        } else {
            int k = 0;
            for (; k < n_ov; k++)
                if (!strcmp(a, ov[k].flag)) break;
            if (k == n_ov) return fail_usage("unknown option '%s'", a);
            NEED_VAL();
            if (!parse_i64(val, ov[k].lo, ov[k].hi, &ov[k].val)) {
                fprintf(stderr, "hotmoe forge: %s wants an integer in %lld..%lld, got '%s'\n", a,
                        (long long)ov[k].lo, (long long)ov[k].hi, val);
                return 2;
            }
            ov[k].set = true;
        }
#undef NEED_VAL
    }
    if (list) return list_presets();
    if (!preset_name) return fail_usage("%s", "--preset NAME is required");
    const forge_preset *base = forge_preset_find(preset_name);
    if (!base) return fail_usage("unknown preset '%s' (see --list)", preset_name);
    int mix = forge_mix_from_name(mix_name);
    if (mix < 0) return fail_usage("unknown type mix '%s' (f32, f16, q8_0, q4_k_m, mxfp4)", mix_name);
    if (strcmp(direct, "auto") && strcmp(direct, "on") && strcmp(direct, "off"))
        return fail_usage("--direct wants auto, on or off, got '%s'", direct);

    forge_preset p = *base;
    if (ov[0].set) p.n_layer = ov[0].val;
    if (ov[1].set) p.n_expert = ov[1].val;
    if (ov[2].set) p.n_expert_used = ov[2].val;
    if (ov[3].set) {
        int64_t tail = base->n_vocab - base->special_base;
        p.n_vocab = ov[3].val;
        p.special_base = p.arch == FORGE_ARCH_LLAMA ? 0 : p.n_vocab - tail;
        if (p.special_base < 0) p.special_base = 0;
    }
    if (ov[4].set) p.n_ctx = ov[4].val;
    if (fuse && !forge_arch_fused_gate_up(p.arch))
        return fail_usage("--fuse-gate-up: llama.cpp reads fused gate/up experts for gemma4, "
                          "qwen3next and qwen35moe, not %s", forge_arch_name(p.arch));
    hm_error err;
    if (forge_preset_check(&p, &err) != HM_OK) {
        fprintf(stderr, "hotmoe forge: %s\n", err.msg);
        return 2;
    }

    forge_tensor_list l;
    if (forge_tensors_build(&p, (forge_mix)mix, &l, &err) != HM_OK) {
        fprintf(stderr, "hotmoe forge: %s\n", err.msg);
        return 1;
    }
    int64_t n_params = 0;
    forge_tensors_totals(&l, &n_params, NULL);
    forge_tensors_free(&l);

    forge_job job = {.preset = &p, .mix = (forge_mix)mix, .n_threads = (int)threads};
    job.gen.seed = (uint64_t)seed;
    job.gen.skew_s = skew;
    job.fuse_gate_up = fuse;
    job.gen.direct = !strcmp(direct, "on") || (!strcmp(direct, "auto") && n_params > 2000000000LL);
    if (sim) return simulate(&p, &job.gen, sim, sim_samples);

    char out_buf[4096], hf_buf[4096];
    if (!out) {
        snprintf(out_buf, sizeof(out_buf), "%s-%s.gguf", p.name, forge_mix_name((forge_mix)mix));
        out = out_buf;
    }
    if (!hf && !no_hf && p.tiny) {
        size_t n = strlen(out);
        if (n > 5 && !strcmp(out + n - 5, ".gguf")) n -= 5;
        snprintf(hf_buf, sizeof(hf_buf), "%.*s-hf", (int)n, out);
        hf = hf_buf;
    }
    if (no_hf) hf = NULL;
    job.out_path = out;
    job.hf_dir = hf;
    job.progress = !quiet && isatty(STDERR_FILENO);

    forge_result res;
    if (forge_write_gguf(&job, &res, &err) != HM_OK) {
        fprintf(stderr, "hotmoe forge: %s\n", err.msg);
        return 1;
    }
    if (!quiet)
        fprintf(stderr, "hotmoe forge: wrote %s: %s (%s) %s, %d tensors, %.3fB params, %.3f GiB in %.1f s (%.2f GB/s)%s\n",
                out, p.name, forge_arch_name(p.arch), forge_mix_name((forge_mix)mix), res.n_tensors,
                (double)res.n_params / 1e9, (double)res.bytes / 1073741824.0, res.seconds,
                res.seconds > 0 ? (double)res.bytes / res.seconds / 1e9 : 0.0,
                job.gen.direct ? ", direct blocks" : "");
    if (hf) {
        double t0 = forge_now();
        if (forge_write_hf(&job, &err) != HM_OK) {
            fprintf(stderr, "hotmoe forge: %s\n", err.msg);
            return 1;
        }
        if (!quiet) fprintf(stderr, "hotmoe forge: wrote HF copy %s in %.1f s\n", hf, forge_now() - t0);
    }
    return 0;
}
