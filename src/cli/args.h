/* args.h - the command-line flags shared by the inference commands (run, chat, bench, perplexity,
 * logits, learn, ...), with llama.cpp's names, meanings and defaults.
 *
 * DESIGN: one parser for every command. A command says which groups of common flags it accepts
 * (CLI_ARGS_* mask) and may pass a table of its own extra flags (cli_arg_spec), which take
 * precedence over a common flag of the same name (bench's -p is a token count, not a prompt).
 * Each flag may be given as `-x VALUE` or `--long=VALUE`. Values are checked strictly (an int
 * flag given "12abc" is an error) and ranges are checked after parsing. An unknown flag, a
 * missing value or a bad value is one line on stderr "hotmoe CMD: ..." and status 2.
 *
 *   static const cli_args_def def = {"chat", "-m MODEL [options]", NULL,
 *                                    CLI_ARGS_MODEL | CLI_ARGS_SAMPLING, extra, n_extra};
 *   cli_common_args a;
 *   int rc = cli_args_parse(&def, argc, argv, &a);
 *   if (rc != CLI_ARGS_CONTINUE) return rc;   (0 after --help, 2 after a usage error)
 */
#ifndef HM_CLI_ARGS_H
#define HM_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Groups of common flags a command accepts. */
enum {
    CLI_ARGS_MODEL = 1u << 0,    /* -m/--model */
    CLI_ARGS_PROMPT = 1u << 1,   /* -p/--prompt, -n/--n-predict */
    CLI_ARGS_CONTEXT = 1u << 2,  /* -c/--ctx-size, -b/--batch-size, -ub/--ubatch-size,
                                    -ctk/--cache-type-k, -ctv/--cache-type-v, -rtr/--repack,
                                    the placement: -ngl/--n-gpu-layers, -cmoe/--cpu-moe,
                                    -ncmoe/--n-cpu-moe, -ot/--override-tensor, --vram-budget,
                                    -mg/--main-gpu, --gpu-strict */
    CLI_ARGS_THREADS = 1u << 3,  /* -t/--threads */
    CLI_ARGS_SAMPLING = 1u << 4, /* --temp --top-k --top-p --min-p --repeat-penalty
                                    --repeat-last-n --presence-penalty --frequency-penalty
                                    -s/--seed */
    CLI_ARGS_FILE = 1u << 5,     /* -f/--file */
    CLI_ARGS_GEN = 1u << 6,      /* what generated text does: --ignore-eos, -r/--reverse-prompt,
                                    -sp/--special, -e/--escape, --no-escape, --keep */
    CLI_ARGS_ALL = 0x7f,
};

/* Most values one repeatable flag (-ot) collects. */
#define CLI_LIST_MAX 64

/* The values of a repeatable flag, in command-line order (pointers into argv). */
typedef struct {
    const char *v[CLI_LIST_MAX];
    int n;
} cli_str_list;

/* Values of the common flags; cli_args_parse starts from cli_args_defaults(). */
typedef struct {
    const char *model;        /* -m (NULL: not given) */
    const char *prompt;       /* -p (NULL: not given) */
    const char *file;         /* -f (NULL: not given) */
    int n_predict;            /* -n: tokens to generate, -1 = until end of generation (-1) */
    int n_ctx;                /* -c: 0 = from the model (0) */
    int n_seq;                /* serve -np: sequences decoded together (0: one); -c is split
                                 between them, as llama-server splits it between its slots */
    int n_batch;              /* -b (2048) */
    int n_ubatch;             /* -ub (512) */
    int n_threads;            /* -t: 0 = number of online CPUs (0) */
    const char *cache_type_k; /* -ctk: "f32", "f16", "bf16" or "q8_0" ("f16") */
    const char *cache_type_v; /* -ctv ("f16") */
    int n_gpu_layers;         /* -ngl: layers on the GPU as llama.cpp counts them (0, CPU);
                                 > n_layer = all of them (docs/PLACEMENT.md) */
    bool cpu_moe;             /* --cpu-moe: every routed expert stays in RAM */
    int n_cpu_moe;            /* --n-cpu-moe N: the routed experts of layers [0, N) stay in RAM */
    cli_str_list override_tensor; /* -ot REGEX=DEVICE[,...], each flag in order */
    int vram_budget_mib;      /* --vram-budget MiB: cap on hotmoe's VRAM (0: not given) */
    int moe_offload_threshold; /* --moe-offload-threshold N (0: the cost model) */
    int main_gpu;             /* -mg: CUDA device index (0) */
    bool gpu_strict;          /* --gpu-strict: refuse instead of a tiered or CPU fallback */
    bool repack;              /* -rtr/--repack: hm_model_params.repack */
    float temp;               /* --temp (0.8); 0 = greedy */
    int top_k;                /* --top-k (40); 0 = off */
    float top_p;              /* --top-p (0.95); 1 = off */
    float min_p;              /* --min-p (0.05); 0 = off */
    float repeat_penalty;     /* --repeat-penalty (1.0 = off) */
    int repeat_last_n;        /* --repeat-last-n (64); 0 = off, -1 = context size */
    float presence_penalty;   /* --presence-penalty (0) */
    float frequency_penalty;  /* --frequency-penalty (0) */
    uint64_t seed;            /* -s/--seed; llama.cpp's default 0xFFFFFFFF means "random" */
    bool seed_given;
    bool given_n_predict;     /* -n was on the command line */
    bool given_vram_budget;   /* --vram-budget was on the command line */
    const char *moe_hot_cache;          /* --moe-hot-cache FILE: a learn or perf file (NULL) */
    int moe_hot_cache_max_mib;          /* --moe-hot-cache-max-mib: -1 auto (default) or > 0 */
    int moe_hot_cache_reserve_mib;      /* --moe-hot-cache-reserve-mib (1024) */
    const char *moe_hot_cache_weighting; /* --moe-hot-cache-weighting ("flat") */
    float moe_hot_cache_layer_curve;    /* --moe-hot-cache-layer-curve (0.5) */
    const char *moe_hot_cache_policy;   /* --moe-hot-cache-policy ("static") */
    float moe_hot_cache_update_rate;    /* --moe-hot-cache-update-rate (0) */
    int moe_hot_cache_update_interval;  /* --moe-hot-cache-update-interval (256) */
    const char *moe_layer_perf;         /* --moe-layer-perf off|update|full ("off") */
    const char *moe_layer_perf_out;     /* --moe-layer-perf-out FILE (implies full), or NULL */
    const char *routing_profile;        /* bench's --moe-routing-profile FILE (set by bench, not a
                                           common flag), or NULL */
    /* llama.cpp's flags (MODEL group: -v, --no-mmap, --mlock, --override-kv; CONTEXT: -fa;
     * THREADS: -tb; GEN: the rest) */
    bool verbose;             /* -v/--verbose: debug log lines */
    bool no_mmap;             /* --no-mmap: said to be ignored (the file is always mapped) */
    bool mlock;               /* --mlock: keep the mapped model in RAM (mlock) */
    cli_str_list override_kv; /* --override-kv: refused (model metadata is not overridden) */
    const char *flash_attn;   /* -fa/--flash-attn on|off|auto (NULL: not given) */
    int n_threads_batch;      /* -tb/--threads-batch (0: not given; prompts use -t) */
    bool ignore_eos;          /* --ignore-eos: an end-of-generation token does not stop */
    cli_str_list reverse_prompt; /* -r/--reverse-prompt TEXT: generation stops after it */
    bool special;             /* -sp/--special: special tokens' text is printed */
    bool escape;              /* -e/--escape (default on): \n \t \' \" \\ in -p, -r, -sys */
    bool no_escape;           /* --no-escape */
    int keep;                 /* --keep N: prompt tokens kept when the context shifts (chat) */
} cli_common_args;

/* Whether text[0..n) ends with one of the values of l (the -r texts); empty values never match. */
bool cli_args_ends_with(const cli_str_list *l, const char *text, size_t n);

/* Processes llama.cpp's escapes in s, in place: \n \r \t \' \" \\ and \xHH; any other
 * backslash stays as it is. */
void cli_args_unescape(char *s);

#define CLI_SEED_RANDOM 0xFFFFFFFFull

void cli_args_defaults(cli_common_args *a);

/* A command's own flag. dest points to a variable of the kind's type:
 * STR const char *, INT int, FLOAT float, U64 uint64_t, BOOL bool (no value; sets true),
 * LIST cli_str_list (repeatable: each value appended, at most CLI_LIST_MAX). */
typedef enum {
    CLI_ARG_STR,
    CLI_ARG_INT,
    CLI_ARG_FLOAT,
    CLI_ARG_U64,
    CLI_ARG_BOOL,
    CLI_ARG_LIST
} cli_arg_kind;

typedef struct {
    const char *name;  /* "-r" or "--reps" */
    const char *alt;   /* second spelling or NULL */
    cli_arg_kind kind;
    void *dest;
    const char *meta;  /* value placeholder in help ("N"), NULL for BOOL */
    const char *help;
} cli_arg_spec;

/* What a command accepts and how its help reads. */
typedef struct {
    const char *cmd;            /* "chat" */
    const char *synopsis;       /* "-m MODEL [-sys TEXT] [options]" */
    const char *description;    /* printed under the usage line (may be NULL) */
    unsigned groups;            /* CLI_ARGS_* */
    const cli_arg_spec *extra;  /* the command's own flags (may be NULL) */
    size_t n_extra;
} cli_args_def;

enum { CLI_ARGS_CONTINUE = -1, CLI_ARGS_HELP = 0, CLI_ARGS_USAGE = 2 };

/* Parses argv[1..argc) (argv[0] is the command name); positional arguments are refused.
 * Returns CLI_ARGS_CONTINUE when the command should run, CLI_ARGS_HELP after printing help on
 * stdout (-h/--help), CLI_ARGS_USAGE after printing one error line on stderr. */
int cli_args_parse(const cli_args_def *def, int argc, char **argv, cli_common_args *out);

/* Prints "usage: hotmoe CMD SYNOPSIS", the description and every accepted flag with its
 * default. */
void cli_args_usage(FILE *f, const cli_args_def *def);


/* The KV cache types -ctk/-ctv accept, llama.cpp's names (the GPU engine takes only f16). */
#define CLI_CACHE_TYPES "f32, f16, bf16, q8_0"

/* "f32"/"f16"/"bf16"/"q8_0" -> ggml type id; -1 for anything else. */
int cli_args_cache_type(const char *name);

/* The -ot values joined with ',' (llama.cpp: each flag's value is a comma list, and the
 * flags add up), malloc'd; NULL when -ot was not given or out of memory (*oom set). */
char *cli_args_overrides(const cli_common_args *a, bool *oom);

/* True when any placement flag beyond -mg was given (-ngl > 0, --cpu-moe, --n-cpu-moe, -ot,
 * --vram-budget, --gpu-strict). */
bool cli_args_placement_given(const cli_common_args *a);

#endif
