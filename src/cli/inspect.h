/* inspect.h - what `hotmoe inspect` computes about a GGUF file, shared by its text output
 * (cmd_inspect.c) and its JSON output (inspect_json.c). */
#ifndef HM_CLI_INSPECT_H
#define HM_CLI_INSPECT_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/gguf.h"

typedef enum {
    INSPECT_EMBEDDINGS,
    INSPECT_ATTENTION,
    INSPECT_ROUTER,
    INSPECT_EXPERTS,
    INSPECT_SHARED_EXPERTS,
    INSPECT_DENSE_FFN,
    INSPECT_NORMS,
    INSPECT_OUTPUT,
    INSPECT_OTHER,
    INSPECT_CAT_COUNT
} inspect_category;

typedef struct {
    int64_t layer;               /* blk.N */
    int64_t n_expert;            /* last dimension of its *_exps tensors (0: they disagree) */
    uint64_t bytes_per_expert;   /* sum over its *_exps tensors of bytes / n_expert */
} inspect_layer;

typedef struct {
    const gguf_ctx *ctx;
    inspect_category *cat;        /* [n_tensors] */
    uint64_t cat_bytes[INSPECT_CAT_COUNT];
    int64_t cat_tensors[INSPECT_CAT_COUNT];
    uint64_t total_bytes;         /* all tensors */
    inspect_layer *layers;        /* [n_layers] MoE layers, ascending */
    int64_t n_layers;
    bool uniform;                 /* every MoE layer has the same n_expert and bytes per expert */
} inspect_summary;

const char *inspect_category_name(inspect_category c);

/* Prints the whole report as JSON on stdout; returns 0, or 1 on a write error. */
int inspect_print_json(const char *path, const inspect_summary *s);

#endif
