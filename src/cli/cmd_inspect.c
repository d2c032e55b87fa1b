/* cmd_inspect.c - `hotmoe inspect FILE [--json] [--tensors]`: describes any GGUF file, whatever
 * its architecture: header, metadata (long arrays summarised), tensor totals per category,
 * bytes per routed expert per layer, and the memory each placement tier needs.
 *
 * DESIGN: one pass classifies every tensor by its name (llama.cpp's naming: token_embd, attn_*,
 * ffn_gate_inp, *_exps, *_shexp, ffn_*, *_norm*, output*) and sums bytes per category; the
 * routed-expert tensors (*_exps) are grouped by layer (blk.N) with their expert count taken from
 * their last dimension. The summary is printed as text here or as JSON by inspect_json.c.
 * Tiers: "everything on GPU" needs all tensor bytes in VRAM; "experts in RAM" keeps the routed
 * experts in host RAM and everything else (shared experts included) in VRAM.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/inspect.h"
#include "quant/qtypes.h"

#define ARR_SHOW_ALL 8   /* arrays up to this long are shown whole in text mode */
#define ARR_SHOW_FIRST 4 /* longer ones: this many elements, then "..." */
#define STR_SHOW 60      /* bytes of a string shown in text mode */

static const char *const k_cat_names[INSPECT_CAT_COUNT] = {
    "embeddings", "attention", "router", "experts", "shared_experts",
    "dense_ffn", "norms", "output", "other"};

const char *inspect_category_name(inspect_category c) { return k_cat_names[c]; }

/* "blk.12.ffn_up_exps.weight" -> 12 and *rest = "ffn_up_exps.weight"; -1 if not a layer tensor. */
static int64_t layer_of(const char *name, const char **rest) {
    *rest = name;
    if (strncmp(name, "blk.", 4) || !isdigit((unsigned char)name[4])) return -1;
    int64_t l = 0;
    const char *p = name + 4;
    while (isdigit((unsigned char)*p)) {
        if (l > 100000000) return -1;
        l = l * 10 + (*p++ - '0');
    }
    if (*p != '.') return -1;
    *rest = p + 1;
    return l;
}

static inspect_category classify(const char *name) {
    const char *n;
    layer_of(name, &n);
    if (!strcmp(name, "output") || !strncmp(name, "output.", 7) || !strncmp(name, "output_norm", 11))
        return INSPECT_OUTPUT;
    if (!strncmp(n, "token_embd", 10)) return INSPECT_EMBEDDINGS;
    if (strstr(n, "_shexp")) return INSPECT_SHARED_EXPERTS; /* ffn_gate_inp_shexp too */
    if (!strncmp(n, "ffn_gate_inp", 12) || strstr(n, "exp_probs_b")) return INSPECT_ROUTER;
    if (strstr(n, "_exps")) return INSPECT_EXPERTS;
    if (strstr(n, "_norm")) return INSPECT_NORMS;
    if (!strncmp(n, "attn_", 5)) return INSPECT_ATTENTION;
    if (!strncmp(n, "ffn_", 4)) return INSPECT_DENSE_FFN;
    return INSPECT_OTHER;
}

typedef struct {
    int64_t layer, n_expert;
    uint64_t bytes_per_expert;
} exp_item;

static int cmp_exp(const void *a, const void *b) {
    int64_t x = ((const exp_item *)a)->layer, y = ((const exp_item *)b)->layer;
    return (x > y) - (x < y);
}

/* Fills s (s->ctx set); returns 0 or 1 when out of memory. */
static int summarize(inspect_summary *s) {
    int64_t n = gguf_tensor_count(s->ctx);
    s->cat = calloc((size_t)(n ? n : 1), sizeof(*s->cat));
    exp_item *items = calloc((size_t)(n ? n : 1), sizeof(*items));
    s->layers = calloc((size_t)(n ? n : 1), sizeof(*s->layers));
    if (!s->cat || !items || !s->layers) {
        free(items);
        return 1;
    }
    int64_t n_items = 0;
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(s->ctx, i);
        inspect_category c = classify(t->name);
        s->cat[i] = c;
        s->cat_bytes[c] += t->size;
        s->cat_tensors[c]++;
        s->total_bytes += t->size;
        const char *rest;
        int64_t l = layer_of(t->name, &rest), e = t->ne[t->n_dims - 1];
        if (c == INSPECT_EXPERTS && l >= 0 && e > 0)
            items[n_items++] = (exp_item){l, e, t->size / (uint64_t)e};
    }
    qsort(items, (size_t)n_items, sizeof(*items), cmp_exp);
    s->uniform = true;
    for (int64_t k = 0; k < n_items; k++) {
        inspect_layer *L = s->n_layers ? &s->layers[s->n_layers - 1] : NULL;
        if (!L || L->layer != items[k].layer) {
            L = &s->layers[s->n_layers++];
            *L = (inspect_layer){items[k].layer, items[k].n_expert, 0};
        } else if (L->n_expert != items[k].n_expert) {
            L->n_expert = 0;
        }
        L->bytes_per_expert += items[k].bytes_per_expert;
    }
    for (int64_t k = 1; k < s->n_layers; k++)
        if (s->layers[k].n_expert != s->layers[0].n_expert ||
            s->layers[k].bytes_per_expert != s->layers[0].bytes_per_expert)
            s->uniform = false;
    free(items);
    return 0;
}

/* ---- text output ---- */

typedef struct {
    char b[1024];
    size_t n;
    bool full;
} line;

static void lp(line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lp(line *l, const char *fmt, ...) {
    if (l->full) return;
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(l->b + l->n, sizeof(l->b) - l->n, fmt, ap);
    va_end(ap);
    if (r < 0 || (size_t)r >= sizeof(l->b) - l->n - 8) {
        l->n = sizeof(l->b) - 8;
        memcpy(l->b + l->n, " ...", 5);
        l->n += 4;
        l->full = true;
    } else {
        l->n += (size_t)r;
    }
}

/* A quoted, escaped, possibly shortened string. */
static void lp_str(line *l, const char *s, uint64_t len) {
    lp(l, "\"");
    uint64_t shown = len < STR_SHOW ? len : STR_SHOW;
    for (uint64_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') lp(l, "\\%c", c);
        else if (c == '\n') lp(l, "\\n");
        else if (c == '\t') lp(l, "\\t");
        else if (c < 0x20 || c == 0x7f) lp(l, "\\x%02x", c);
        else lp(l, "%c", c);
    }
    lp(l, "\"");
    if (len > shown) lp(l, "... (%" PRIu64 " bytes)", len);
}

static void lp_arr(line *l, const gguf_arr *a, int depth);

static void lp_elem(line *l, const gguf_arr *a, uint64_t i, int depth) {
    switch (a->type) {
    case GGUF_VT_FLOAT32: case GGUF_VT_FLOAT64: lp(l, "%.9g", gguf_arr_float(a, i)); break;
    case GGUF_VT_STRING: {
        gguf_str s = gguf_arr_str(a, i);
        lp_str(l, s.data, s.len);
    } break;
    case GGUF_VT_ARRAY: {
        gguf_arr in = gguf_arr_arr(a, i);
        lp_arr(l, &in, depth + 1);
    } break;
    case GGUF_VT_BOOL: lp(l, "%s", gguf_arr_int(a, i) ? "true" : "false"); break;
    case GGUF_VT_UINT64: lp(l, "%" PRIu64, (uint64_t)gguf_arr_int(a, i)); break;
    default: lp(l, "%" PRId64, gguf_arr_int(a, i)); break;
    }
}

static void lp_arr(line *l, const gguf_arr *a, int depth) {
    uint64_t show = a->n;
    if (a->n > ARR_SHOW_ALL || depth > 2) {
        if (a->type == GGUF_VT_STRING || a->type == GGUF_VT_ARRAY)
            lp(l, "[%" PRIu64 " %ss]", a->n, gguf_vtype_name(a->type));
        else
            lp(l, "[%" PRIu64 " %s values]", a->n, gguf_vtype_name(a->type));
        show = depth > 2 ? 0 : ARR_SHOW_FIRST;
        if (show) lp(l, " ");
    }
    if (!show) return;
    lp(l, "[");
    for (uint64_t i = 0; i < show && !l->full; i++) lp_elem(l, a, i, depth), lp(l, i + 1 < a->n ? ", " : "");
    lp(l, show < a->n ? "...]" : "]");
}

static void print_kv(const gguf_ctx *c, int64_t i) {
    line l = {.n = 0};
    gguf_vtype t = gguf_kv_type(c, i);
    int64_t iv;
    uint64_t uv;
    double dv;
    bool bv;
    gguf_str sv;
    gguf_arr av;
    if (t == GGUF_VT_STRING && gguf_kv_str(c, i, &sv, NULL) == HM_OK) lp_str(&l, sv.data, sv.len);
    else if (t == GGUF_VT_ARRAY && gguf_kv_arr(c, i, &av, NULL) == HM_OK) lp_arr(&l, &av, 0);
    else if (t == GGUF_VT_BOOL && gguf_kv_bool(c, i, &bv, NULL) == HM_OK) lp(&l, "%s", bv ? "true" : "false");
    else if (gguf_kv_float(c, i, &dv, NULL) == HM_OK) lp(&l, "%.9g", dv);
    else if (t == GGUF_VT_UINT64 && gguf_kv_uint(c, i, &uv, NULL) == HM_OK) lp(&l, "%" PRIu64, uv);
    else if (gguf_kv_int(c, i, &iv, NULL) == HM_OK) lp(&l, "%" PRId64, iv);
    char type[24];
    if (t == GGUF_VT_ARRAY && gguf_kv_arr(c, i, &av, NULL) == HM_OK)
        snprintf(type, sizeof(type), "arr[%s]", gguf_vtype_name(av.type));
    else
        snprintf(type, sizeof(type), "%s", gguf_vtype_name(t));
    printf("  %-44s %-11s %s\n", gguf_kv_key(c, i), type, l.b);
}

static const char *human(uint64_t b, char *buf, size_t cap) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (b < 1024) {
        snprintf(buf, cap, "%" PRIu64 " B", b);
        return buf;
    }
    double v = (double)b / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 3) v /= 1024.0, u++;
    snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

static void shape_str(const gguf_tensor *t, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < t->n_dims && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRId64, d ? ", " : "", t->ne[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static void print_text(const char *path, const inspect_summary *s, bool tensors) {
    const gguf_ctx *c = s->ctx;
    char h1[32], h2[32];
    printf("%s\n", path);
    printf("  GGUF version %u, alignment %u, %" PRIu64 " bytes (%s), tensor data at byte %" PRIu64 "\n",
           gguf_version(c), gguf_alignment(c), gguf_file_size(c), human(gguf_file_size(c), h1, 32),
           gguf_data_offset(c));
    printf("\nmetadata: %" PRId64 " keys\n", gguf_kv_count(c));
    for (int64_t i = 0; i < gguf_kv_count(c); i++) print_kv(c, i);
    printf("\ntensors: %" PRId64 ", %" PRIu64 " bytes (%s)\n", gguf_tensor_count(c), s->total_bytes,
           human(s->total_bytes, h1, 32));
    printf("  %-16s %8s %16s %12s\n", "category", "tensors", "bytes", "");
    for (int k = 0; k < INSPECT_CAT_COUNT; k++)
        if (s->cat_tensors[k])
            printf("  %-16s %8" PRId64 " %16" PRIu64 " %12s\n", k_cat_names[k], s->cat_tensors[k],
                   s->cat_bytes[k], human(s->cat_bytes[k], h1, 32));
    if (!s->n_layers) {
        printf("\nrouted experts: none (no *_exps tensors)\n");
    } else if (s->uniform) {
        printf("\nrouted experts: %" PRId64 " layers (blk.%" PRId64 " .. blk.%" PRId64 ") x %" PRId64
               " experts, %" PRIu64 " bytes (%s) per expert per layer\n", s->n_layers,
               s->layers[0].layer, s->layers[s->n_layers - 1].layer, s->layers[0].n_expert,
               s->layers[0].bytes_per_expert, human(s->layers[0].bytes_per_expert, h1, 32));
    } else {
        printf("\nrouted experts: %" PRId64 " layers, bytes per expert per layer:\n", s->n_layers);
        for (int64_t k = 0; k < s->n_layers; k++)
            printf("  blk.%-6" PRId64 " %6" PRId64 " experts x %" PRIu64 " bytes (%s)%s\n",
                   s->layers[k].layer, s->layers[k].n_expert, s->layers[k].bytes_per_expert,
                   human(s->layers[k].bytes_per_expert, h1, 32),
                   s->layers[k].n_expert ? "" : " (expert counts differ between its tensors)");
    }
    uint64_t routed = s->cat_bytes[INSPECT_EXPERTS];
    printf("\nplacement (memory needed for the weights):\n");
    printf("  everything on GPU   VRAM %s\n", human(s->total_bytes, h1, 32));
    printf("  experts in RAM      VRAM %s + host RAM %s (routed experts; shared experts stay on "
           "the GPU)\n", human(s->total_bytes - routed, h1, 32), human(routed, h2, 32));
    if (!tensors) return;
    printf("\n  %-48s %-8s %-26s %14s  %s\n", "tensor", "type", "shape", "bytes", "category");
    for (int64_t i = 0; i < gguf_tensor_count(c); i++) {
        const gguf_tensor *t = gguf_tensor_at(c, i);
        char shape[128];
        shape_str(t, shape, sizeof(shape));
        printf("  %-48s %-8s %-26s %14" PRIu64 "  %s\n", t->name, hm_type_name(t->type), shape,
               t->size, k_cat_names[s->cat[i]]);
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: hotmoe inspect FILE [--json] [--tensors]\n\n"
               "Describes any GGUF file: header, metadata, tensor bytes per category (embeddings,\n"
               "attention, router, experts, shared experts, dense FFN, norms, output, other),\n"
               "bytes per routed expert per layer, and the memory each placement tier needs.\n\n"
               "  --json      machine-readable output (always lists every tensor)\n"
               "  --tensors   list every tensor: name, type, shape, bytes, category\n"
               "  --help      this text\n");
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    bool json = false, tensors = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--tensors")) {
            tensors = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "hotmoe inspect: unknown option '%s' (try 'hotmoe inspect --help')\n", argv[i]);
            return 2;
        } else if (path) {
            fprintf(stderr, "hotmoe inspect: one file at a time ('%s' and '%s' given)\n", path, argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "hotmoe inspect: no file given (usage: hotmoe inspect FILE [--json] [--tensors])\n");
        return 2;
    }
    gguf_ctx *c;
    hm_error err;
    if (gguf_open(path, &c, &err) != HM_OK) {
        fprintf(stderr, "hotmoe inspect: %s: %s\n", path, err.msg);
        return 1;
    }
    inspect_summary s = {.ctx = c};
    int rc = summarize(&s);
    if (rc) {
        fprintf(stderr, "hotmoe inspect: %s: out of memory\n", path);
    } else if (json) {
        rc = inspect_print_json(path, &s);
    } else {
        print_text(path, &s, tensors);
        rc = fflush(stdout) != 0 || ferror(stdout);
        if (rc) fprintf(stderr, "hotmoe inspect: writing the report failed\n");
    }
    free(s.cat);
    free(s.layers);
    gguf_close(c);
    return rc;
}
