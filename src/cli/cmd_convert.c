/* cmd_convert.c - `hotmoe convert DIR -o OUT.gguf --type T`: a HuggingFace checkpoint folder to
 * GGUF. See docs/CONVERT.md. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "convert/convert.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: hotmoe convert DIR -o OUT.gguf [--type MIX] [options]\n\n"
        "Converts a HuggingFace checkpoint folder (config.json, model.safetensors or shards with\n"
        "model.safetensors.index.json, tokenizer.json, tokenizer_config.json) to a GGUF file laid\n"
        "out as llama.cpp's convert_hf_to_gguf.py and `hotmoe forge` write it.\n"
        "Architectures: %s.\n"
        "safetensors dtypes: F32, F16, BF16, F64.\n\n"
        "options:\n"
        "  -o, --out PATH    GGUF to write (required)\n"
        "  --type MIX        f32 | f16 | q8_0 | q4_k_m | mxfp4 (default f16); per-tensor types as\n"
        "                    `hotmoe forge --type` (llama.cpp's choices: norms/biases/routers f32, "
        "...)\n"
        "  --name NAME       general.name (default: the folder's name)\n"
        "  --threads N       encoding threads (default: online CPUs)\n"
        "  -q, --quiet       no progress or summary\n",
        convert_supported_archs());
}

static int fail_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "hotmoe convert: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (try 'hotmoe convert --help')\n");
    return 2;
}

int cmd_convert(int argc, char **argv) {
    convert_job job = {.mix = FORGE_MIX_F16};
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const bool has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--out")) {
            if (!has_val) return fail_usage("%s needs a path", a);
            job.out_path = argv[++i];
        } else if (!strcmp(a, "--type")) {
            if (!has_val) return fail_usage("%s needs a value", a);
            int m = forge_mix_from_name(argv[++i]);
            if (m < 0)
                return fail_usage("unknown --type '%s' (f32, f16, q8_0, q4_k_m, mxfp4)", argv[i]);
            job.mix = (forge_mix)m;
        } else if (!strcmp(a, "--name")) {
            if (!has_val) return fail_usage("%s needs a value", a);
            job.name = argv[++i];
        } else if (!strcmp(a, "--threads")) {
            if (!has_val) return fail_usage("%s needs a value", a);
            char *end;
            errno = 0;
            long n = strtol(argv[++i], &end, 10);
            if (errno || *end || n < 1 || n > 64)
                return fail_usage("--threads '%s': expected 1..64", argv[i]);
            job.n_threads = (int)n;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
        } else if (a[0] == '-' && a[1]) {
            return fail_usage("unknown option '%s'", a);
        } else if (!job.hf_dir) {
            job.hf_dir = a;
        } else {
            return fail_usage("unexpected argument '%s'", a);
        }
    }
    if (!job.hf_dir) return fail_usage("%s", "missing the checkpoint folder DIR");
    if (!job.out_path) return fail_usage("%s", "missing -o OUT.gguf");
    job.progress = !quiet && isatty(STDERR_FILENO);
    convert_result res;
    hm_error err;
    if (convert_run(&job, &res, &err) != HM_OK) {
        fprintf(stderr, "hotmoe convert: %s\n", err.msg);
        return 1;
    }
    if (!quiet && res.note[0]) fprintf(stderr, "hotmoe convert: %s\n", res.note);
    if (!quiet)
        fprintf(stderr,
                "hotmoe convert: wrote %s (%s, %s, %d tensors, %.2fM params, %.1f MiB) in %.1f s\n",
                job.out_path, res.arch, forge_mix_name(job.mix), res.n_tensors,
                (double)res.n_params / 1e6, (double)res.bytes / 1048576.0, res.seconds);
    return 0;
}
