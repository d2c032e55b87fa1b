/* args.c - the shared flag parser (see args.h).
 *
 * DESIGN: the common flags are a constant table (name, alternative spelling, group, kind, offset
 * into cli_common_args, help); a command's extra flags are a second table with pointers. Lookup
 * tries the command's table first, so a command may redefine a common name. Numbers go through
 * strtol/strtof/strtoull and must consume the whole value; ranges of the common flags are
 * checked once after parsing so the error names the flag. -m, -p and -f given twice, and -p
 * with -f, are errors: no value is dropped silently. -ot is the one repeatable flag (kind
 * LIST): each value is kept, in order, and cli_args_overrides joins them with ',' as llama.cpp
 * adds its -ot flags up; what a value means is the planner's to check (moe/placement.h), with
 * the model loaded, so its messages name the item.
 */
#include "cli/args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "moe/hot_admit.h"
#include "moe/hot_weight.h"
#include "quant/qtypes.h"

typedef struct {
    const char *name, *alt;
    unsigned group;
    cli_arg_kind kind;
    size_t off;
    const char *meta, *help;
} common_spec;

#define OFF(f) offsetof(cli_common_args, f)

static const common_spec k_common[] = {
    {"-m", "--model", CLI_ARGS_MODEL, CLI_ARG_STR, OFF(model), "FNAME", "model path (GGUF)"},
    {"-p", "--prompt", CLI_ARGS_PROMPT, CLI_ARG_STR, OFF(prompt), "TEXT", "prompt"},
    {"-f", "--file", CLI_ARGS_FILE, CLI_ARG_STR, OFF(file), "FNAME", "read the text from a file"},
    {"-n", "--n-predict", CLI_ARGS_PROMPT, CLI_ARG_INT, OFF(n_predict), "N",
     "tokens to predict (default: -1, until end of generation)"},
    {"-c", "--ctx-size", CLI_ARGS_CONTEXT, CLI_ARG_INT, OFF(n_ctx), "N",
     "context size (default: 0, from the model, at most 4096)"},
    {"-b", "--batch-size", CLI_ARGS_CONTEXT, CLI_ARG_INT, OFF(n_batch), "N",
     "logical batch size (default: 2048)"},
    {"-ub", "--ubatch-size", CLI_ARGS_CONTEXT, CLI_ARG_INT, OFF(n_ubatch), "N",
     "physical batch size (default: 512)"},
    {"-ctk", "--cache-type-k", CLI_ARGS_CONTEXT, CLI_ARG_STR, OFF(cache_type_k), "TYPE",
     "KV cache type for K: " CLI_CACHE_TYPES " (default: f16; the GPU: f16 or f32, K and V alike)"},
    {"-ctv", "--cache-type-v", CLI_ARGS_CONTEXT, CLI_ARG_STR, OFF(cache_type_v), "TYPE",
     "KV cache type for V: " CLI_CACHE_TYPES " (default: f16; the GPU: f16 or f32, K and V alike)"},
    {"-ngl", "--n-gpu-layers", CLI_ARGS_CONTEXT, CLI_ARG_INT, OFF(n_gpu_layers), "N",
     "layers on the GPU, counted as llama.cpp does: the output layer first, then the last "
     "layers; N > layers = the whole model (default: 0, CPU only). A whole model that does not "
     "fit keeps its routed experts in RAM (and, if needed, fewer layers on the GPU)"},
    {"-cmoe", "--cpu-moe", CLI_ARGS_CONTEXT, CLI_ARG_BOOL, OFF(cpu_moe), NULL,
     "keep every routed expert (ffn_*_exps) in RAM"},
    {"-ncmoe", "--n-cpu-moe", CLI_ARGS_CONTEXT, CLI_ARG_INT, OFF(n_cpu_moe), "N",
     "keep the routed experts of the first N layers in RAM (default: 0)"},
    {"-ot", "--override-tensor", CLI_ARGS_CONTEXT, CLI_ARG_LIST, OFF(override_tensor),
     "REGEX=DEV,...", "put the tensors whose name matches REGEX (POSIX extended, searched) on "
     "DEV: CPU or CUDA0; repeatable, the first match wins, before --cpu-moe and -ngl"},
    {"--vram-budget", NULL, CLI_ARGS_CONTEXT, CLI_ARG_INT, OFF(vram_budget_mib), "MiB",
     "most VRAM hotmoe may allocate: weights, KV cache, buffers (not the CUDA context) "
     "(default: the free VRAM)"},
    {"--moe-offload-threshold", NULL, CLI_ARGS_CONTEXT, CLI_ARG_INT, OFF(moe_offload_threshold),
     "N", "with routed experts in RAM on a GPU: prompt ubatches of >= N tokens run every expert "
     "they use on the GPU from a copy, smaller ones on the CPU (default: 0, the calibrated cost "
     "model decides per expert; decode steps stay on the CPU)"},
    {"--moe-hot-cache", NULL, CLI_ARGS_CONTEXT, CLI_ARG_STR, OFF(moe_hot_cache), "FILE",
     "with routed experts in RAM on a GPU: keep the experts a learn or perf file scores best in "
     "VRAM (the hot cache, docs/HOT_CACHE.md; default: none)"},
    {"--moe-hot-cache-max-mib", NULL, CLI_ARGS_CONTEXT, CLI_ARG_INT, OFF(moe_hot_cache_max_mib),
     "N", "hot cache size in MiB; -1: the VRAM the placement leaves, minus the reserve "
     "(default: -1)"},
    {"--moe-hot-cache-reserve-mib", NULL, CLI_ARGS_CONTEXT, CLI_ARG_INT,
     OFF(moe_hot_cache_reserve_mib), "N", "VRAM the automatic size leaves free (default: 1024)"},
    {"--moe-hot-cache-weighting", NULL, CLI_ARGS_CONTEXT, CLI_ARG_STR,
     OFF(moe_hot_cache_weighting), "W",
     "how observed use becomes scores: flat, pressure, smooth_pressure, time, balanced "
     "(default: flat)"},
    {"--moe-hot-cache-layer-curve", NULL, CLI_ARGS_CONTEXT, CLI_ARG_FLOAT,
     OFF(moe_hot_cache_layer_curve), "X", "how strongly the layer weights apply, >= 0 "
     "(default: 0.5)"},
    {"--moe-hot-cache-policy", NULL, CLI_ARGS_CONTEXT, CLI_ARG_STR, OFF(moe_hot_cache_policy),
     "P", "static (the plan and the updates only), lru or lfru (a miss may take a slot after "
     "its step) (default: static)"},
    {"--moe-hot-cache-update-rate", NULL, CLI_ARGS_CONTEXT, CLI_ARG_FLOAT,
     OFF(moe_hot_cache_update_rate), "R", "share of the hot slots an update may exchange for "
     "better-scored experts, in [0, 1] (default: 0, no updates)"},
    {"--moe-hot-cache-update-interval", NULL, CLI_ARGS_CONTEXT, CLI_ARG_INT,
     OFF(moe_hot_cache_update_interval), "N", "tokens between updates (default: 256)"},
    {"--moe-layer-perf", NULL, CLI_ARGS_CONTEXT, CLI_ARG_STR, OFF(moe_layer_perf), "MODE",
     "live MoE layer counters of the layers the CPU serves: off, update (what the updates "
     "need), full (default: off)"},
    {"--moe-layer-perf-out", NULL, CLI_ARGS_CONTEXT, CLI_ARG_STR, OFF(moe_layer_perf_out),
     "FILE", "write the full counters at exit in the learn schema (a perf file for "
     "--moe-hot-cache; implies --moe-layer-perf full)"},
    {"-mg", "--main-gpu", CLI_ARGS_CONTEXT, CLI_ARG_INT, OFF(main_gpu), "INDEX",
     "CUDA device for the model (default: 0)"},
    {"--gpu-strict", NULL, CLI_ARGS_CONTEXT, CLI_ARG_BOOL, OFF(gpu_strict), NULL,
     "fail when the GPU cannot take the model whole instead of keeping experts in RAM or "
     "running on the CPU"},
    {"-rtr", "--repack", CLI_ARGS_CONTEXT, CLI_ARG_BOOL, OFF(repack), NULL,
     "also hold the q4_K matrices repacked by eights: faster CPU decode on AVX-512 "
     "VNNI+VBMI CPUs, the same results, their size again in RAM"},
    {"-t", "--threads", CLI_ARGS_THREADS, CLI_ARG_INT, OFF(n_threads), "N",
     "threads (default: 0, all online CPUs)"},
    {"--temp", NULL, CLI_ARGS_SAMPLING, CLI_ARG_FLOAT, OFF(temp), "N",
     "temperature (default: 0.8; 0 = greedy)"},
    {"--top-k", NULL, CLI_ARGS_SAMPLING, CLI_ARG_INT, OFF(top_k), "N",
     "top-k sampling (default: 40, 0 = off)"},
    {"--top-p", NULL, CLI_ARGS_SAMPLING, CLI_ARG_FLOAT, OFF(top_p), "N",
     "top-p sampling (default: 0.95, 1.0 = off)"},
    {"--min-p", NULL, CLI_ARGS_SAMPLING, CLI_ARG_FLOAT, OFF(min_p), "N",
     "min-p sampling (default: 0.05, 0.0 = off)"},
    {"--repeat-penalty", NULL, CLI_ARGS_SAMPLING, CLI_ARG_FLOAT, OFF(repeat_penalty), "N",
     "penalise repeated tokens (default: 1.0, 1.0 = off)"},
    {"--repeat-last-n", NULL, CLI_ARGS_SAMPLING, CLI_ARG_INT, OFF(repeat_last_n), "N",
     "last N tokens penalised (default: 64, 0 = off, -1 = context size)"},
    {"--presence-penalty", NULL, CLI_ARGS_SAMPLING, CLI_ARG_FLOAT, OFF(presence_penalty), "N",
     "presence penalty (default: 0.0, off)"},
    {"--frequency-penalty", NULL, CLI_ARGS_SAMPLING, CLI_ARG_FLOAT, OFF(frequency_penalty), "N",
     "frequency penalty (default: 0.0, off)"},
    {"-s", "--seed", CLI_ARGS_SAMPLING, CLI_ARG_U64, OFF(seed), "SEED",
     "RNG seed (default: -1, random)"},
    {"-v", "--verbose", CLI_ARGS_MODEL, CLI_ARG_BOOL, OFF(verbose), NULL,
     "print debug log lines (as HOTMOE_LOG=debug)"},
    {"--mlock", NULL, CLI_ARGS_MODEL, CLI_ARG_BOOL, OFF(mlock), NULL,
     "keep the mapped model in RAM (mlock; a warning when the limit refuses it)"},
    {"--no-mmap", NULL, CLI_ARGS_MODEL, CLI_ARG_BOOL, OFF(no_mmap), NULL,
     "accepted for llama.cpp's command lines; hotmoe always maps the file (says so)"},
    {"--override-kv", NULL, CLI_ARGS_MODEL, CLI_ARG_LIST, OFF(override_kv), "KEY=TYPE:VALUE",
     "refused: hotmoe does not override model metadata"},
    {"-fa", "--flash-attn", CLI_ARGS_CONTEXT, CLI_ARG_STR, OFF(flash_attn), "on|off|auto",
     "accepted for llama.cpp's command lines: hotmoe's attention is always fused (off says so)"},
    {"-tb", "--threads-batch", CLI_ARGS_THREADS, CLI_ARG_INT, OFF(n_threads_batch), "N",
     "threads for prompts; hotmoe's prompts use the -t threads (a different N says so)"},
    {"--ignore-eos", NULL, CLI_ARGS_GEN, CLI_ARG_BOOL, OFF(ignore_eos), NULL,
     "an end-of-generation token does not stop the generation (it is not shown)"},
    {"-r", "--reverse-prompt", CLI_ARGS_GEN, CLI_ARG_LIST, OFF(reverse_prompt), "TEXT",
     "stop generating once the output ends with TEXT (repeatable)"},
    {"-sp", "--special", CLI_ARGS_GEN, CLI_ARG_BOOL, OFF(special), NULL,
     "print special tokens' text"},
    {"-e", "--escape", CLI_ARGS_GEN, CLI_ARG_BOOL, OFF(escape), NULL,
     "process escapes (\\n \\r \\t \\' \\\" \\\\ \\xHH) in -p, -r and -sys (default: on)"},
    {"--no-escape", NULL, CLI_ARGS_GEN, CLI_ARG_BOOL, OFF(no_escape), NULL,
     "take -p, -r and -sys literally"},
    {"--keep", NULL, CLI_ARGS_GEN, CLI_ARG_INT, OFF(keep), "N",
     "chat: tokens of the start kept when the conversation outgrows -c (-1: all of the system "
     "prompt; default: -1)"},
};
#define N_COMMON (sizeof(k_common) / sizeof(k_common[0]))

void cli_args_defaults(cli_common_args *a) {
    memset(a, 0, sizeof(*a));
    a->n_predict = -1;
    a->n_ctx = 0;
    a->n_batch = 2048;
    a->n_ubatch = 512;
    a->n_threads = 0;
    a->cache_type_k = "f16";
    a->cache_type_v = "f16";
    a->temp = 0.8f;
    a->top_k = 40;
    a->top_p = 0.95f;
    a->min_p = 0.05f;
    a->repeat_penalty = 1.0f;
    a->repeat_last_n = 64;
    a->seed = CLI_SEED_RANDOM;
    a->moe_hot_cache_max_mib = -1;
    a->moe_hot_cache_reserve_mib = 1024;
    a->moe_hot_cache_weighting = "flat";
    a->moe_hot_cache_layer_curve = 0.5f;
    a->moe_hot_cache_policy = "static";
    a->moe_hot_cache_update_rate = 0.0f;
    a->moe_hot_cache_update_interval = 256;
    a->moe_layer_perf = "off";
    a->escape = true;
    a->keep = -1;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The character escape "\\c" stands for, or 0 when it is not one of llama.cpp's. */
static char escaped(char c) {
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\'': return '\'';
    case '"': return '"';
    case '\\': return '\\';
    default: return 0;
    }
}

bool cli_args_ends_with(const cli_str_list *l, const char *text, size_t n) {
    for (int i = 0; i < l->n; i++) {
        const size_t m = strlen(l->v[i]);
        if (m && m <= n && !memcmp(text + n - m, l->v[i], m)) return true;
    }
    return false;
}

void cli_args_unescape(char *s) {
    char *w = s;
    for (const char *r = s; *r; r++) {
        const char e = *r == '\\' ? escaped(r[1]) : 0;
        if (e) {
            *w++ = e;
            r++;
        } else if (*r == '\\' && r[1] == 'x' && hexval(r[2]) >= 0 && hexval(r[3]) >= 0) {
            *w++ = (char)(hexval(r[2]) * 16 + hexval(r[3]));
            r += 3;
        } else {
            *w++ = *r;
        }
    }
    *w = 0;
}

int cli_args_cache_type(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "f32")) return HM_TYPE_F32;
    if (!strcmp(name, "f16")) return HM_TYPE_F16;
    if (!strcmp(name, "bf16")) return HM_TYPE_BF16;
    if (!strcmp(name, "q8_0")) return HM_TYPE_Q8_0;
    return -1;
}

/* Stores the text value v into dest of the given kind; 0 on success. */
static int store_value(cli_arg_kind kind, void *dest, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (kind) {
    case CLI_ARG_STR: *(const char **)dest = v; return 0;
    case CLI_ARG_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < INT_MIN || x > INT_MAX) return -1;
        *(int *)dest = (int)x;
        return 0;
    }
    case CLI_ARG_FLOAT: {
        float x = strtof(v, &end);
        if (!*v || *end || errno || !isfinite(x)) return -1;
        *(float *)dest = x;
        return 0;
    }
    case CLI_ARG_U64: {
        /* -1 is llama.cpp's "random seed" */
        if (!strcmp(v, "-1")) {
            *(uint64_t *)dest = CLI_SEED_RANDOM;
            return 0;
        }
        if (*v == '-' || *v == '+') return -1;
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno) return -1;
        *(uint64_t *)dest = (uint64_t)x;
        return 0;
    }
    case CLI_ARG_BOOL: *(bool *)dest = true; return 0;
    case CLI_ARG_LIST: {
        cli_str_list *l = dest;
        if (l->n >= CLI_LIST_MAX) return -1;
        l->v[l->n++] = v;
        return 0;
    }
    }
    return -1;
}

static const char *kind_what(cli_arg_kind k) {
    switch (k) {
    case CLI_ARG_INT: return "an integer";
    case CLI_ARG_FLOAT: return "a finite number";
    case CLI_ARG_U64: return "a non-negative integer or -1";
    default: return "a value";
    }
}

/* Range checks of the common flags that were accepted; returns an error text or NULL. */
static const char *check_ranges(const cli_common_args *a, unsigned groups, char *buf, size_t cap) {
    if (groups & CLI_ARGS_PROMPT && a->n_predict < -1) return "-n must be >= -1";
    if (groups & CLI_ARGS_CONTEXT) {
        if (a->n_ctx < 0) return "-c must be >= 0";
        if (a->n_batch < 1) return "-b must be >= 1";
        if (a->n_ubatch < 1) return "-ub must be >= 1";
        if (a->n_gpu_layers < 0) return "-ngl must be >= 0";
        if (a->n_cpu_moe < 0) return "--n-cpu-moe must be >= 0";
        if (a->moe_offload_threshold < 0) return "--moe-offload-threshold must be >= 0";
        if (a->given_vram_budget && a->vram_budget_mib < 1)
            return "--vram-budget must be >= 1 (MiB)";
        for (int i = 0; i < a->override_tensor.n; i++)
            if (!a->override_tensor.v[i][0]) return "-ot needs REGEX=DEVICE, got ''";
        if (a->main_gpu < 0) return "-mg must be >= 0";
        if (a->moe_hot_cache_max_mib < -1 || a->moe_hot_cache_max_mib == 0)
            return "--moe-hot-cache-max-mib must be -1 (auto) or > 0";
        if (a->moe_hot_cache_reserve_mib < 0) return "--moe-hot-cache-reserve-mib must be >= 0";
        if (!(a->moe_hot_cache_layer_curve >= 0.0f) || a->moe_hot_cache_layer_curve > 1e30f)
            return "--moe-hot-cache-layer-curve must be a finite number >= 0";
        if (!(a->moe_hot_cache_update_rate >= 0.0f && a->moe_hot_cache_update_rate <= 1.0f))
            return "--moe-hot-cache-update-rate must be in [0, 1]";
        if (a->moe_hot_cache_update_interval < 1)
            return "--moe-hot-cache-update-interval must be >= 1";
        if (strcmp(a->moe_layer_perf, "off") && strcmp(a->moe_layer_perf, "update") &&
            strcmp(a->moe_layer_perf, "full")) {
            snprintf(buf, cap, "--moe-layer-perf: unknown mode '%.40s' (known: off, update, "
                     "full)", a->moe_layer_perf);
            return buf;
        }
        hot_policy pol;
        if (hot_policy_parse(a->moe_hot_cache_policy, &pol, NULL) != HM_OK) {
            snprintf(buf, cap, "--moe-hot-cache-policy: unknown policy '%.40s' (known: "
                     HOT_POLICY_NAMES ")", a->moe_hot_cache_policy);
            return buf;
        }
        hot_weighting w;
        if (hot_weighting_parse(a->moe_hot_cache_weighting, &w, NULL) != HM_OK) {
            snprintf(buf, cap, "--moe-hot-cache-weighting: unknown weighting '%.40s' (known: "
                     HOT_WEIGHT_NAMES ")", a->moe_hot_cache_weighting);
            return buf;
        }
        if (cli_args_cache_type(a->cache_type_k) < 0) {
            snprintf(buf, cap,
                     "-ctk: unsupported KV cache type '%s' (supported: " CLI_CACHE_TYPES ")",
                     a->cache_type_k);
            return buf;
        }
        if (cli_args_cache_type(a->cache_type_v) < 0) {
            snprintf(buf, cap,
                     "-ctv: unsupported KV cache type '%s' (supported: " CLI_CACHE_TYPES ")",
                     a->cache_type_v);
            return buf;
        }
    }
    if (groups & CLI_ARGS_THREADS && (a->n_threads < 0 || a->n_threads > 1024))
        return "-t must be between 0 and 1024";
    if (groups & CLI_ARGS_THREADS && (a->n_threads_batch < 0 || a->n_threads_batch > 1024))
        return "-tb must be between 0 and 1024";
    if (groups & CLI_ARGS_GEN && a->keep < -1) return "--keep must be >= -1";
    if (groups & CLI_ARGS_CONTEXT && a->flash_attn && strcmp(a->flash_attn, "on") &&
        strcmp(a->flash_attn, "off") && strcmp(a->flash_attn, "auto") &&
        strcmp(a->flash_attn, "1") && strcmp(a->flash_attn, "0")) {
        snprintf(buf, cap, "-fa: '%.40s' is not on, off or auto", a->flash_attn);
        return buf;
    }
    if (groups & CLI_ARGS_SAMPLING) {
        if (a->temp < 0) return "--temp must be >= 0";
        if (a->top_k < 0) return "--top-k must be >= 0";
        if (!(a->top_p > 0 && a->top_p <= 1)) return "--top-p must be in (0, 1]";
        if (!(a->min_p >= 0 && a->min_p <= 1)) return "--min-p must be in [0, 1]";
        if (a->repeat_penalty <= 0) return "--repeat-penalty must be > 0";
        if (a->repeat_last_n < -1) return "--repeat-last-n must be >= -1";
    }
    return NULL;
}

/* Edit distance of a[0..na) and b (insertions, deletions, substitutions), at most 63 each. */
static int edit_distance(const char *a, size_t na, const char *b) {
    const size_t nb = strlen(b);
    if (na > 63 || nb > 63) return 99;
    int row[64];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            const int up = row[j];
            const int sub = diag + (a[i - 1] != b[j - 1]);
            const int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
            row[j] = sub < best ? sub : best;
            diag = up;
        }
    }
    return row[nb];
}

/* Whether one of a[0..na) and b (a flag) starts the other, at least 5 characters long (a long
 * flag cut short, or one with a word added: --revers, --temperature). */
static bool prefix_pair(const char *a, size_t na, const char *b) {
    const size_t nb = strlen(b), m = na < nb ? na : nb;
    return m >= 5 && !strncmp(a, b, m);
}

/* The accepted flag nearest to arg[0..n): the only one it shares a long start with, else the
 * nearest by edit distance when near enough (a typo), else NULL. */
static const char *nearest_flag(const cli_args_def *def, const char *arg, size_t n) {
    const char *best = NULL, *pre = NULL;
    int bd = 99, n_pre = 0;
    for (size_t k = 0; k < def->n_extra + N_COMMON; k++) {
        const char *names[2];
        if (k < def->n_extra) {
            names[0] = def->extra[k].name, names[1] = def->extra[k].alt;
        } else {
            const common_spec *c = &k_common[k - def->n_extra];
            if (!(def->groups & c->group)) continue;
            names[0] = c->name, names[1] = c->alt;
        }
        for (int q = 0; q < 2; q++) {
            if (!names[q]) continue;
            const int d = edit_distance(arg, n, names[q]);
            if (d < bd) bd = d, best = names[q];
            if (prefix_pair(arg, n, names[q]) && pre != names[q]) pre = names[q], n_pre++;
        }
    }
    if (n_pre == 1) return pre;
    const int limit = n <= 4 ? 1 : n <= 10 ? 2 : 3;
    return bd <= limit ? best : NULL;
}

/* What the flags hotmoe accepts from llama.cpp but does not follow mean here: a line each on
 * stderr; -v applied. false (after an error line) for one it refuses. */
static bool llama_flags(const cli_args_def *def, const cli_common_args *a) {
    if (a->override_kv.n > 0) {
        fprintf(stderr, "hotmoe %s: --override-kv: hotmoe does not override model metadata (the "
                "file's keys decide the model's shape and tokenizer); convert or edit the file "
                "instead\n", def->cmd);
        return false;
    }
    if (a->verbose) hm_log_set_level(HM_LOG_DEBUG);
    if (a->no_mmap)
        fprintf(stderr, "hotmoe %s: --no-mmap: hotmoe always maps the model file (pages are "
                "read once and shared); ignored\n", def->cmd);
    if (a->flash_attn && (!strcmp(a->flash_attn, "off") || !strcmp(a->flash_attn, "0")))
        fprintf(stderr, "hotmoe %s: -fa off: hotmoe's attention is always computed fused; "
                "ignored\n", def->cmd);
    if (a->n_threads_batch > 0 && a->n_threads_batch != a->n_threads)
        fprintf(stderr, "hotmoe %s: -tb %d: prompts use the -t threads too; ignored\n",
                def->cmd, a->n_threads_batch);
    return true;
}

static bool name_is(const char *arg, size_t len, const char *name) {
    return name && strlen(name) == len && !memcmp(arg, name, len);
}

int cli_args_parse(const cli_args_def *def, int argc, char **argv, cli_common_args *out) {
    cli_args_defaults(out);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            cli_args_usage(stdout, def);
            return CLI_ARGS_HELP;
        }
        if (arg[0] != '-' || !arg[1]) {
            fprintf(stderr, "hotmoe %s: unexpected argument '%s' (see hotmoe %s --help)\n",
                    def->cmd, arg, def->cmd);
            return CLI_ARGS_USAGE;
        }
        /* --name=value */
        const char *eq = arg[1] == '-' ? strchr(arg, '=') : NULL;
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        cli_arg_kind kind = CLI_ARG_BOOL;
        void *dest = NULL;
        bool found = false;
        for (size_t k = 0; k < def->n_extra && !found; k++) {
            const cli_arg_spec *s = &def->extra[k];
            if (name_is(arg, nlen, s->name) || name_is(arg, nlen, s->alt)) {
                kind = s->kind;
                dest = s->dest;
                found = true;
            }
        }
        for (size_t k = 0; k < N_COMMON && !found; k++) {
            const common_spec *s = &k_common[k];
            if (!(def->groups & s->group)) continue;
            if (name_is(arg, nlen, s->name) || name_is(arg, nlen, s->alt)) {
                kind = s->kind;
                dest = (char *)out + s->off;
                found = true;
                /* one model, one prompt, one file: a second one is not silently taken */
                if ((s->off == OFF(model) || s->off == OFF(prompt) || s->off == OFF(file)) &&
                    *(const char **)dest) {
                    fprintf(stderr, "hotmoe %s: %s given twice; give it once\n", def->cmd,
                            s->name);
                    return CLI_ARGS_USAGE;
                }
                if (s->off == OFF(seed)) out->seed_given = true;
                if (s->off == OFF(n_predict)) out->given_n_predict = true;
                if (s->off == OFF(vram_budget_mib)) out->given_vram_budget = true;
            }
        }
        if (!found) {
            const char *near = nearest_flag(def, arg, nlen);
            if (near)
                fprintf(stderr, "hotmoe %s: unknown flag '%.*s'; did you mean '%s'? (see hotmoe "
                        "%s --help)\n", def->cmd, (int)nlen, arg, near, def->cmd);
            else
                fprintf(stderr, "hotmoe %s: unknown flag '%.*s' (see hotmoe %s --help)\n",
                        def->cmd, (int)nlen, arg, def->cmd);
            return CLI_ARGS_USAGE;
        }
        const char *val = NULL;
        if (kind == CLI_ARG_BOOL) {
            if (eq) {
                fprintf(stderr, "hotmoe %s: flag '%.*s' takes no value\n", def->cmd, (int)nlen,
                        arg);
                return CLI_ARGS_USAGE;
            }
        } else if (eq) {
            val = eq + 1;
        } else if (dest == (char *)out + OFF(flash_attn) &&
                   (i + 1 >= argc || argv[i + 1][0] == '-')) {
            val = "on"; /* llama.cpp's older boolean -fa */
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            fprintf(stderr, "hotmoe %s: flag '%s' needs a value\n", def->cmd, arg);
            return CLI_ARGS_USAGE;
        }
        if (store_value(kind, dest, val)) {
            if (kind == CLI_ARG_LIST)
                fprintf(stderr, "hotmoe %s: flag '%.*s' given more than %d times\n", def->cmd,
                        (int)nlen, arg, CLI_LIST_MAX);
            else
                fprintf(stderr, "hotmoe %s: flag '%.*s' needs %s, got '%s'\n", def->cmd,
                        (int)nlen, arg, kind_what(kind), val);
            return CLI_ARGS_USAGE;
        }
    }
    if (out->prompt && out->file) {
        fprintf(stderr, "hotmoe %s: -p and -f both given; use one\n", def->cmd);
        return CLI_ARGS_USAGE;
    }
    char buf[160];
    const char *bad = check_ranges(out, def->groups, buf, sizeof(buf));
    if (bad) {
        fprintf(stderr, "hotmoe %s: %s\n", def->cmd, bad);
        return CLI_ARGS_USAGE;
    }
    if (out->no_escape) out->escape = false;
    return llama_flags(def, out) ? CLI_ARGS_CONTINUE : CLI_ARGS_USAGE;
}

static void print_flag(FILE *f, const char *name, const char *alt, const char *meta,
                       const char *help) {
    char left[64];
    snprintf(left, sizeof(left), "%s%s%s%s%s", name, alt ? ", " : "", alt ? alt : "",
             meta ? " " : "", meta ? meta : "");
    fprintf(f, "  %-28s %s\n", left, help ? help : "");
}

void cli_args_usage(FILE *f, const cli_args_def *def) {
    fprintf(f, "usage: hotmoe %s %s\n", def->cmd, def->synopsis ? def->synopsis : "[options]");
    if (def->description) fprintf(f, "\n%s\n", def->description);
    fprintf(f, "\noptions:\n");
    for (size_t k = 0; k < def->n_extra; k++)
        print_flag(f, def->extra[k].name, def->extra[k].alt, def->extra[k].meta,
                   def->extra[k].help);
    for (size_t k = 0; k < N_COMMON; k++) {
        const common_spec *s = &k_common[k];
        if (!(def->groups & s->group)) continue;
        bool shadowed = false;
        for (size_t e = 0; e < def->n_extra; e++)
            if (!strcmp(def->extra[e].name, s->name)) shadowed = true;
        if (!shadowed) print_flag(f, s->name, s->alt, s->meta, s->help);
    }
    print_flag(f, "-h", "--help", NULL, "show this help");
}

char *cli_args_overrides(const cli_common_args *a, bool *oom) {
    if (oom) *oom = false;
    const cli_str_list *l = &a->override_tensor;
    if (l->n == 0) return NULL;
    size_t len = 1;
    for (int i = 0; i < l->n; i++) len += strlen(l->v[i]) + 1;
    char *s = malloc(len), *w = s;
    if (!s) {
        if (oom) *oom = true;
        return NULL;
    }
    for (int i = 0; i < l->n; i++) {
        const size_t n = strlen(l->v[i]);
        if (i) *w++ = ',';
        memcpy(w, l->v[i], n);
        w += n;
    }
    *w = 0;
    return s;
}

bool cli_args_placement_given(const cli_common_args *a) {
    return a->n_gpu_layers > 0 || a->cpu_moe || a->n_cpu_moe > 0 || a->override_tensor.n > 0 ||
           a->given_vram_budget || a->gpu_strict;
}
