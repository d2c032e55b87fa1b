/* calibrate.h - the machine's rates the offload cost model needs, measured at start and cached
 * per machine and model: host->device copy bandwidth, host read bandwidth, and the CPU's expert
 * throughput per weight type of the model.
 *
 * DESIGN: calib_run measures, in well under a second,
 *   (a) host->device bandwidth through the caller's copy lane (cuda/cuda_host.h) from the
 *       experts' bytes: from the registered mapping when the lane has it ("registered"),
 *       otherwise through its pinned staging ("staged"); only with a lane (a GPU build with a
 *       device);
 *   (b) host read bandwidth: the pool streams up to 256 MiB of the experts' bytes in the mapping
 *       (one untimed pass pages them in, the best of the timed passes counts);
 *   (c) for each weight type of the model's expert matrices, the CPU's grouped expert product
 *       (cpu_moe_matmul, the kernels the CPU lane runs, with the model's repacked rows when it
 *       has them) of n_expert_used experts of one layer, for 1 token and for CALIB_BATCH tokens
 *       routed to all of them, on the caller's pool. A product of n tokens is then modelled as
 *       bytes * (fixed + n * tok) seconds (streaming the weights once, then per token).
 * The result is written as JSON to $XDG_CACHE_HOME/hotmoe (or ~/.cache/hotmoe)/calib-<hash>.json,
 * keyed by a machine key (CPU model name, CPUs allowed, pool threads, GPU name) and a model key
 * (file size and a hash of the tensor table and the expert tensors' in-memory types: not the
 * path, so a copied or renamed file hits the cache), and read back on the next start when both
 * keys and the copy source match. A cache file that cannot be parsed, or whose keys or numbers
 * do not hold, is re-measured with a warning (logged and kept in the result's note), never an
 * error. HOTMOE_CALIBRATE=0 measures nothing and uses rough defaults (CALIB_DEFAULT_*);
 * HOTMOE_CALIBRATE=force re-measures and rewrites the cache.
 *
 * How a tiered context uses it (at init, before the first decode, while the pool is idle):
 *   cuda_host_register(span) -> cuda_copy_lane_init(dev, cap, reg) -> calib_run({model, pool,
 *   lane, dev}) -> calib_format into the placement report -> per host layer calib_layer_rates ->
 *   offload_decide per ubatch (moe/offload.h).
 */
#ifndef HM_RUNTIME_CALIBRATE_H
#define HM_RUNTIME_CALIBRATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/threadpool.h"
#include "model/model.h"
#include "moe/offload.h"

struct cuda_copy_lane;

enum {
    CALIB_MAX_TYPES = 8, /* distinct expert weight types of one model */
    CALIB_BATCH = 32,    /* tokens of the batch measurement */
    CALIB_VERSION = 1,   /* of the cache file */
};

/* Rough rates used when calibration is off (HOTMOE_CALIBRATE=0) or a part was not measured. */
#define CALIB_DEFAULT_HOST_READ 20e9 /* bytes/s */
#define CALIB_DEFAULT_H2D 20e9       /* bytes/s, with a copy lane */
#define CALIB_DEFAULT_CPU_FIXED (1.0 / 20e9) /* s per weight byte */
#define CALIB_DEFAULT_CPU_TOK (1.0 / 50e9)   /* s per weight byte per token */
/* Not measured: the GPU's side of an expert (offload_rates.gpu_fixed_s, gpu_tok_s). A fixed cost
 * per expert (launches), and the product at 2e13 weight bytes x tokens per second (a q4_K byte
 * holds two weights: ~80 TFLOP/s, what a tensor-core grouped GEMM reaches on an H100). */
#define CALIB_GPU_FIXED_S 5e-6
#define CALIB_GPU_BYTE_TOK_PER_S 2e13

typedef enum {
    CALIB_OFF = 0,  /* HOTMOE_CALIBRATE=0: defaults */
    CALIB_MEASURED, /* measured now */
    CALIB_CACHED,   /* read from the cache file */
} calib_source;

/* One weight type's CPU measurement. */
typedef struct {
    uint32_t wtype;  /* ggml type id */
    uint64_t bytes;  /* weight bytes of the measured product (n_expert experts' matrices) */
    int n_expert;    /* experts in the product (the model's n_expert_used) */
    int batch;       /* tokens of the batch measurement */
    double t1_s;     /* best time of the product for 1 token */
    double tb_s;     /* ... for `batch` tokens routed to every one of the experts */
    double fixed_s_per_byte, tok_s_per_byte; /* derived: t(n) = bytes * (fixed + n * tok) */
} calib_type;

typedef struct {
    calib_source source;
    char machine_key[384];
    char model_key[96];
    char cache_path[512]; /* "" when there is no cache */
    int n_threads;
    double host_read_bps;     /* bytes/s */
    uint64_t host_read_bytes; /* bytes one timed pass read */
    double h2d_bps;           /* bytes/s; 0: no copy lane */
    char h2d_source[16];      /* "registered", "staged", or "" (not measured) */
    int n_types;
    calib_type types[CALIB_MAX_TYPES];
    double seconds; /* spent measuring now (0 when cached or off) */
    char note[256]; /* a warning for the report ("" when none): corrupt cache, cache not written */
} calib_result;

typedef struct {
    const hm_model *model;
    tp_pool *pool;               /* the pool the CPU lane runs on (NULL: one thread) */
    struct cuda_copy_lane *lane; /* NULL: no host->device measurement */
    int device;                  /* CUDA device for the machine key; -1: none */
    const char *cache_dir;       /* NULL: $XDG_CACHE_HOME/hotmoe, else $HOME/.cache/hotmoe */
    const char *mode;            /* NULL: $HOTMOE_CALIBRATE. "0": off; "force": measure and
                                    rewrite; "1" or "": use the cache when it holds */
} calib_params;

/* Fills out (never leaves it unset). Errors only for bad arguments (HM_ERR_ARG) and failures of
 * the measurements themselves (a CUDA error of the lane, out of memory): out then holds the
 * defaults (CALIB_OFF), which a caller may run with. Cache problems are warnings (logged, and
 * in out->note), never errors. */
hm_status calib_run(const calib_params *p, calib_result *out, hm_error *err);

/* The defaults of CALIB_OFF for this model and lane presence. */
void calib_defaults(const hm_model *m, bool have_lane, calib_result *out);

/* The rates of layer il's experts: the CPU's per-byte rates blended over its gate, up and down
 * matrices by their bytes (each from its type's measurement, CALIB_DEFAULT_CPU_* for a type not
 * measured), h2d_bps, and the GPU constants above for an expert of this layer. */
void calib_layer_rates(const calib_result *c, const hm_model *m, int il, offload_rates *out);

/* Lines for the placement report (each ends with '\n'); returns the length the text needs (as
 * snprintf). */
size_t calib_format(const calib_result *c, char *buf, size_t n);

/* ---- keys and the cache file (exposed for tests) ---- */

/* "cpu=<model name>;cpus=<allowed>;threads=<n>;gpu=<name or none>" */
void calib_machine_key(int device, int n_threads, char *buf, size_t n);
/* "size=<file bytes>;layout=<16 hex digits>" */
void calib_model_key(const hm_model *m, char *buf, size_t n);
/* dir/calib-<16 hex digits of the keys' hash>.json; dir NULL: the default directory. Fails
 * (HM_ERR_NOT_FOUND) when neither XDG_CACHE_HOME nor HOME is set, HM_ERR_RANGE when too long. */
hm_status calib_cache_path(const char *dir, const char *machine_key, const char *model_key,
                           char *buf, size_t n, hm_error *err);
/* Reads path into out if it holds a valid calibration for these keys whose types cover the
 * model's expert types: HM_OK; HM_ERR_NOT_FOUND when the file is absent; HM_ERR_FORMAT (the
 * problem named) when it is corrupt or its numbers are not positive and finite; HM_ERR_STATE
 * when it is valid but for other keys, another copy source or other types. */
hm_status calib_cache_read(const char *path, const hm_model *m, const char *machine_key,
                           const char *model_key, const char *h2d_source, calib_result *out,
                           hm_error *err);
/* Writes c as JSON (creating the directory; through a temporary file and a rename). */
hm_status calib_cache_write(const calib_result *c, const char *path, hm_error *err);

#endif
