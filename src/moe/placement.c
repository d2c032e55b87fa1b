/* placement.c - the placement planner (placement.h).
 *
 * DESIGN: the planner lists the model's tensors once (name, layer, kind, bytes), parses and
 * compiles the -ot overrides once, then assigns tiers with one pure pass (assign_tiers) over
 * that list for a given (n_gpu_layers, cpu_moe) pair and sums the tiers (sum_tiers). The
 * automatic tiered choice is that pass repeated with more layers' experts in RAM (--n-cpu-moe
 * 1, 2, ... then --cpu-moe), then with --cpu-moe and decreasing -ngl, until the sums fit: the list is small (a few dozen tensors per layer), so trying every -ngl costs
 * nothing worth caching. The residency map and the per-layer attention flags are derived from
 * the final tiers, never decided separately, so they cannot disagree with them.
 */
#include "moe/placement.h"

#include <regex.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the model's tensors ---- */

typedef struct {
    size_t offset; /* in hm_layer */
    moe_tensor_kind kind;
} layer_field;

#define F(f, k) {offsetof(hm_layer, f), k}
static const layer_field k_layer_fields[] = {
    F(attn_norm, MOE_TENSOR_ATTN),  F(wq, MOE_TENSOR_ATTN),     F(wk, MOE_TENSOR_ATTN),
    F(wv, MOE_TENSOR_ATTN),         F(wo, MOE_TENSOR_ATTN),     F(bq, MOE_TENSOR_ATTN),
    F(bk, MOE_TENSOR_ATTN),         F(bv, MOE_TENSOR_ATTN),     F(bo, MOE_TENSOR_ATTN),
    F(q_norm, MOE_TENSOR_ATTN),     F(k_norm, MOE_TENSOR_ATTN), F(sinks, MOE_TENSOR_ATTN),
    F(ffn_norm, MOE_TENSOR_LAYER),  F(router, MOE_TENSOR_LAYER), F(router_b, MOE_TENSOR_LAYER),
    F(gate_exps, MOE_TENSOR_EXPERTS), F(up_exps, MOE_TENSOR_EXPERTS),
    F(down_exps, MOE_TENSOR_EXPERTS), F(gate_exps_b, MOE_TENSOR_EXPERTS),
    F(up_exps_b, MOE_TENSOR_EXPERTS), F(down_exps_b, MOE_TENSOR_EXPERTS),
    F(sh_gate, MOE_TENSOR_LAYER),   F(sh_up, MOE_TENSOR_LAYER), F(sh_down, MOE_TENSOR_LAYER),
    F(sh_gate_inp, MOE_TENSOR_LAYER),
};
#undef F
enum { N_LAYER_FIELDS = (int)(sizeof(k_layer_fields) / sizeof(k_layer_fields[0])) };

static uint64_t tensor_bytes(const hm_tensor *t) {
    if (!t->data) return 0;
    uint64_t rows = 1;
    for (int d = 1; d < 4; d++) rows *= (uint64_t)(t->ne[d] ? t->ne[d] : 1);
    return (uint64_t)t->row_size * rows;
}

static void add_tensor(moe_placement *p, const hm_tensor *t, int layer, moe_tensor_kind kind) {
    if (!t->data) return; /* absent optional tensor */
    moe_placement_tensor *x = &p->tensors[p->n_tensor++];
    x->name = t->name;
    x->layer = layer;
    x->kind = kind;
    x->bytes = tensor_bytes(t);
    x->tier = MOE_TIER_HOST;
    x->why = MOE_WHY_NGL;
    x->override_index = -1;
}

static hm_status list_tensors(const hm_model *m, moe_placement *p, hm_error *err) {
    const int n_layer = (int)hm_model_hparams(m)->n_layer;
    p->tensors = calloc((size_t)(3 + n_layer * N_LAYER_FIELDS), sizeof(*p->tensors));
    if (!p->tensors) return hm_error_set(err, HM_ERR_NOMEM, "placement: out of memory");
    add_tensor(p, hm_model_tok_embd(m), -1, MOE_TENSOR_INPUT);
    add_tensor(p, hm_model_output_norm(m), -1, MOE_TENSOR_OUTPUT);
    add_tensor(p, hm_model_output(m), -1, MOE_TENSOR_OUTPUT);
    for (int il = 0; il < n_layer; il++) {
        const char *L = (const char *)hm_model_layer(m, il);
        for (int f = 0; f < N_LAYER_FIELDS; f++)
            add_tensor(p, (const hm_tensor *)(L + k_layer_fields[f].offset), il,
                       k_layer_fields[f].kind);
    }
    return HM_OK;
}

/* ---- -ot overrides ---- */

typedef struct {
    regex_t *re; /* [n_override] compiled patterns */
    int n;
} compiled_overrides;

static void overrides_free(compiled_overrides *c) {
    for (int i = 0; i < c->n; i++) regfree(&c->re[i]);
    free(c->re);
    c->re = NULL;
    c->n = 0;
}

static hm_status parse_device(const char *item, const char *dev, moe_tier *tier, hm_error *err) {
    if (strcmp(dev, "CPU") == 0) *tier = MOE_TIER_HOST;
    else if (strcmp(dev, "CUDA0") == 0) *tier = MOE_TIER_DEVICE;
    else
        return hm_error_set(err, HM_ERR_ARG, "-ot '%s': unknown device '%s' (known: CPU, CUDA0)",
                            item, dev);
    return HM_OK;
}

/* Parses and compiles one "REGEX=DEVICE" item (text owned by o) into o and re. */
static hm_status parse_override(moe_placement_override *o, regex_t *re, hm_error *err) {
    char *eq = strchr(o->text, '=');
    if (!eq)
        return hm_error_set(err, HM_ERR_ARG, "-ot '%s': expected REGEX=DEVICE", o->text);
    const size_t n = (size_t)(eq - o->text);
    if (n == 0) return hm_error_set(err, HM_ERR_ARG, "-ot '%s': empty regex", o->text);
    hm_status st = parse_device(o->text, eq + 1, &o->tier, err);
    if (st != HM_OK) return st;
    o->pattern = malloc(n + 1);
    if (!o->pattern) return hm_error_set(err, HM_ERR_NOMEM, "placement: out of memory");
    memcpy(o->pattern, o->text, n);
    o->pattern[n] = 0;
    const int rc = regcomp(re, o->pattern, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char why[160];
        regerror(rc, re, why, sizeof(why));
        return hm_error_set(err, HM_ERR_ARG, "-ot '%s': bad regex '%s': %s", o->text, o->pattern,
                            why);
    }
    return HM_OK;
}

static int count_items(const char *s) {
    int n = 1;
    for (; *s; s++) n += *s == ',';
    return n;
}

/* Splits spec at commas (as llama.cpp does) into p->overrides and c. */
static hm_status parse_overrides(const char *spec, moe_placement *p, compiled_overrides *c,
                                 hm_error *err) {
    if (!spec || !*spec) return HM_OK;
    const int n = count_items(spec);
    p->overrides = calloc((size_t)n, sizeof(*p->overrides));
    c->re = calloc((size_t)n, sizeof(*c->re));
    if (!p->overrides || !c->re) return hm_error_set(err, HM_ERR_NOMEM, "placement: out of memory");
    const char *s = spec;
    for (int i = 0; i < n; i++) {
        const char *end = strchr(s, ',');
        const size_t len = end ? (size_t)(end - s) : strlen(s);
        moe_placement_override *o = &p->overrides[i];
        o->text = malloc(len + 1);
        if (!o->text) return hm_error_set(err, HM_ERR_NOMEM, "placement: out of memory");
        memcpy(o->text, s, len);
        o->text[len] = 0;
        p->n_override = i + 1;
        hm_status st = parse_override(o, &c->re[i], err);
        if (o->pattern && st == HM_OK) c->n = i + 1; /* compiled: regfree later */
        if (st != HM_OK) return st;
        s = end ? end + 1 : s + len;
    }
    return HM_OK;
}

/* The first override matching name, or -1. */
static int first_override(const compiled_overrides *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (regexec(&c->re[i], name, 0, NULL, 0) == 0) return i;
    return -1;
}

/* ---- tiers ---- */

/* -ngl as current llama.cpp: units [0, n_layer] (n_layer = the output layer) are on the device
 * from max(n_layer + 1 - ngl, 0) on. */
static bool unit_on_device(int unit, int n_layer, int ngl) {
    const int start = n_layer + 1 - ngl;
    return unit >= (start > 0 ? start : 0);
}

static void assign_one(moe_placement_tensor *t, const compiled_overrides *c, int n_layer,
                       int ngl, bool cpu_moe, int n_cpu_moe) {
    const int ov = first_override(c, t->name);
    t->override_index = ov;
    if (ov >= 0) {
        t->why = MOE_WHY_OVERRIDE;
        return; /* tier set by the caller, which knows the overrides' tiers */
    }
    if (t->kind == MOE_TENSOR_EXPERTS && (cpu_moe || t->layer < n_cpu_moe)) {
        t->tier = MOE_TIER_HOST;
        t->why = cpu_moe ? MOE_WHY_CPU_MOE : MOE_WHY_N_CPU_MOE;
        return;
    }
    t->why = MOE_WHY_NGL;
    bool dev;
    if (t->kind == MOE_TENSOR_INPUT) dev = ngl > n_layer; /* only with everything */
    else if (t->kind == MOE_TENSOR_OUTPUT) dev = unit_on_device(n_layer, n_layer, ngl);
    else dev = unit_on_device(t->layer, n_layer, ngl);
    t->tier = dev ? MOE_TIER_DEVICE : MOE_TIER_HOST;
}

static void assign_tiers(moe_placement *p, const compiled_overrides *c, int ngl, bool cpu_moe,
                         int n_cpu_moe) {
    for (int i = 0; i < p->n_override; i++) p->overrides[i].n_tensors = 0, p->overrides[i].bytes = 0;
    for (int i = 0; i < p->n_tensor; i++) {
        moe_placement_tensor *t = &p->tensors[i];
        assign_one(t, c, p->n_layer, ngl, cpu_moe, n_cpu_moe);
        if (t->override_index >= 0) {
            moe_placement_override *o = &p->overrides[t->override_index];
            t->tier = o->tier;
            o->n_tensors++;
            o->bytes += t->bytes;
        }
    }
    p->n_gpu_layers = ngl;
    p->cpu_moe = cpu_moe;
}

/* attn_device from the tiers: a layer's attention is on the device when all of it is. */
static void derive_attention(moe_placement *p) {
    for (int il = 0; il < p->n_layer; il++) p->attn_device[il] = true;
    for (int i = 0; i < p->n_tensor; i++) {
        const moe_placement_tensor *t = &p->tensors[i];
        if (t->kind == MOE_TENSOR_ATTN && t->tier != MOE_TIER_DEVICE)
            p->attn_device[t->layer] = false;
    }
}

static void sum_tiers(moe_placement *p, const moe_placement_options *o) {
    p->device_weights = p->device_kv = p->device_scratch = 0;
    p->host_experts = p->host_other = 0;
    derive_attention(p);
    for (int i = 0; i < p->n_tensor; i++) {
        const moe_placement_tensor *t = &p->tensors[i];
        if (t->tier == MOE_TIER_DEVICE) p->device_weights += t->bytes;
        else if (t->kind == MOE_TENSOR_EXPERTS) p->host_experts += t->bytes;
        else p->host_other += t->bytes;
    }
    for (int il = 0; il < p->n_layer; il++)
        if (p->attn_device[il]) p->device_kv += o->kv_bytes_per_layer;
    if (p->device_weights > 0 || p->device_kv > 0) p->device_scratch = o->scratch_bytes;
    p->device_total = p->device_weights + p->device_kv + p->device_scratch;
    p->fits = p->device_total <= p->budget;
}

/* The residency map from the tiers: a layer's experts get slots when all its routed expert
 * tensors are on the device. */
static hm_status derive_residency(const hm_model *m, moe_placement *p, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(m);
    hm_status st = hm_residency_init_host(&p->res, (int)hp->n_layer, (int)hp->n_expert, err);
    if (st != HM_OK) return st;
    bool *dev = malloc((size_t)p->n_layer * sizeof(bool));
    if (!dev) return hm_error_set(err, HM_ERR_NOMEM, "placement: out of memory");
    for (int il = 0; il < p->n_layer; il++) dev[il] = true;
    for (int i = 0; i < p->n_tensor; i++) {
        const moe_placement_tensor *t = &p->tensors[i];
        if (t->kind == MOE_TENSOR_EXPERTS && t->tier != MOE_TIER_DEVICE) dev[t->layer] = false;
    }
    for (int il = 0; il < p->n_layer; il++) {
        if (!dev[il]) continue;
        p->res.n_slots[il] = p->res.n_expert;
        for (int e = 0; e < p->res.n_expert; e++) {
            p->res.home[hm_residency_at(&p->res, il, e)] = HM_HOME_HOST | HM_HOME_DEVICE;
            p->res.slot[hm_residency_at(&p->res, il, e)] = e;
        }
    }
    free(dev);
    return hm_residency_check(&p->res, err);
}

/* ---- options, budget, the automatic choice ---- */

moe_placement_options moe_placement_default_options(void) {
    moe_placement_options o;
    memset(&o, 0, sizeof(o));
    return o;
}

static uint64_t effective_budget(const moe_placement_options *o) {
    if (o->vram_budget == 0) return o->vram_free;
    if (o->vram_free > 0 && o->vram_free < o->vram_budget) return o->vram_free;
    return o->vram_budget;
}

/* Only -ngl N with N > n_layer: the case in which the planner may choose a tier. */
static bool whole_model_only(const moe_placement_options *o, int n_layer) {
    return o->n_gpu_layers > n_layer && !o->cpu_moe && o->n_cpu_moe == 0 &&
           (!o->overrides || !*o->overrides);
}

static void fmt_bytes(uint64_t b, char buf[48]) {
    if (b >= (1ull << 30)) snprintf(buf, 48, "%.2f GiB", (double)b / 1073741824.0);
    else if (b >= (1ull << 20)) snprintf(buf, 48, "%.1f MiB", (double)b / 1048576.0);
    else snprintf(buf, 48, "%.1f KiB", (double)b / 1024.0);
}

static hm_status refuse(const moe_placement *p, const char *what, hm_error *err) {
    char need[48], w[48], k[48], s[48], bud[48];
    fmt_bytes(p->device_total, need);
    fmt_bytes(p->device_weights, w);
    fmt_bytes(p->device_kv, k);
    fmt_bytes(p->device_scratch, s);
    fmt_bytes(p->budget, bud);
    return hm_error_set(err, HM_ERR_NOMEM, "placement: %s needs %llu bytes of VRAM (%s: weights "
                        "%s + KV %s + scratch %s), the budget is %llu bytes (%s); --gpu-strict "
                        "refuses a tiered placement", what, (unsigned long long)p->device_total,
                        need, w, k, s, (unsigned long long)p->budget, bud);
}

/* The whole model did not fit: the experts of the fewest first layers in RAM that fits with
 * the staging of a tiered plan counted (--n-cpu-moe K, up to K = n_layer: --cpu-moe); else
 * --cpu-moe without it (the staging gets what is left), then with the most GPU layers that fits
 * (-ngl 0 always does: nothing on the device). */
static void choose_tier(moe_placement *p, const compiled_overrides *c,
                        const moe_placement_options *o) {
    moe_placement_options t = *o;
    t.scratch_bytes += o->tier_scratch_bytes;
    for (int k = 1; k <= p->n_layer; k++) {
        const bool all = k == p->n_layer;
        assign_tiers(p, c, o->n_gpu_layers, all, all ? 0 : k);
        sum_tiers(p, &t);
        if (p->fits) {
            p->choice = all ? MOE_PLAN_AUTO_CPU_MOE : MOE_PLAN_AUTO_N_CPU_MOE;
            p->n_cpu_moe = all ? 0 : k;
            p->tier_scratch = true;
            return;
        }
    }
    p->choice = MOE_PLAN_AUTO_CPU_MOE;
    for (int ngl = o->n_gpu_layers; ngl >= 0; ngl = ngl > p->n_layer ? p->n_layer : ngl - 1) {
        assign_tiers(p, c, ngl, true, 0);
        sum_tiers(p, o);
        if (p->fits) return;
        p->choice = MOE_PLAN_AUTO_FEWER_LAYERS;
    }
}

static hm_status check_options(const moe_placement_options *o, hm_error *err) {
    if (!o) return hm_error_set(err, HM_ERR_ARG, "placement: no options");
    if (o->n_gpu_layers < 0)
        return hm_error_set(err, HM_ERR_ARG, "placement: -ngl %d: must be >= 0", o->n_gpu_layers);
    if (o->n_cpu_moe < 0)
        return hm_error_set(err, HM_ERR_ARG, "placement: --n-cpu-moe %d: must be >= 0",
                            o->n_cpu_moe);
    return HM_OK;
}

static hm_status plan_tiers(const hm_model *m, const moe_placement_options *o,
                            const compiled_overrides *c, moe_placement *p, hm_error *err) {
    assign_tiers(p, c, o->n_gpu_layers, o->cpu_moe, o->n_cpu_moe);
    sum_tiers(p, o);
    p->asked_device_total = p->device_total;
    if (!p->fits && o->gpu_strict)
        return refuse(p, whole_model_only(o, p->n_layer) ? "the whole model" : "this placement",
                      err);
    if (!p->fits && whole_model_only(o, p->n_layer)) choose_tier(p, c, o);
    return derive_residency(m, p, err);
}

hm_status moe_placement_plan(const hm_model *m, const moe_placement_options *o,
                             moe_placement *out, hm_error *err) {
    if (!out) return hm_error_set(err, HM_ERR_ARG, "placement: no output");
    memset(out, 0, sizeof(*out));
    if (!m) return hm_error_set(err, HM_ERR_ARG, "placement: no model");
    hm_status st = check_options(o, err);
    if (st != HM_OK) return st;
    moe_placement *p = out;
    p->n_layer = (int)hm_model_hparams(m)->n_layer;
    p->n_cpu_moe = o->n_cpu_moe;
    p->gpu_strict = o->gpu_strict;
    p->budget = effective_budget(o);
    p->attn_device = calloc((size_t)p->n_layer, sizeof(bool));
    if (!p->attn_device) st = hm_error_set(err, HM_ERR_NOMEM, "placement: out of memory");
    compiled_overrides c = {NULL, 0};
    if (st == HM_OK) st = list_tensors(m, p, err);
    if (st == HM_OK) st = parse_overrides(o->overrides, p, &c, err);
    if (st == HM_OK) st = plan_tiers(m, o, &c, p, err);
    overrides_free(&c);
    if (st != HM_OK) moe_placement_free(p);
    return st;
}

void moe_placement_free(moe_placement *p) {
    if (!p) return;
    for (int i = 0; i < p->n_override; i++) {
        free(p->overrides[i].text);
        free(p->overrides[i].pattern);
    }
    free(p->overrides);
    free(p->tensors);
    free(p->attn_device);
    hm_residency_free(&p->res);
    memset(p, 0, sizeof(*p));
}

/* ---- the report ---- */

/* Writes the layers il with flag[il] == want as ranges "0-3, 5"; "none" when there are none. */
static void put_ranges(FILE *f, const bool *flag, int n, bool want) {
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (flag[i] != want) continue;
        int j = i;
        while (j + 1 < n && flag[j + 1] == want) j++;
        if (any) fputs(", ", f);
        if (j > i) fprintf(f, "%d-%d", i, j);
        else fprintf(f, "%d", i);
        any = true;
        i = j;
    }
    if (!any) fputs("none", f);
}

static const char *tier_name(moe_tier t) { return t == MOE_TIER_DEVICE ? "device" : "host"; }

static void put_header(FILE *f, const moe_placement *p) {
    char a[48], b[48];
    if (p->choice == MOE_PLAN_AS_ASKED) {
        fprintf(f, "placement: as asked (-ngl %d%s", p->n_gpu_layers, p->cpu_moe ? " --cpu-moe" : "");
        if (p->n_cpu_moe > 0) fprintf(f, " --n-cpu-moe %d", p->n_cpu_moe);
        if (p->n_override > 0) fprintf(f, " -ot, %d override%s", p->n_override,
                                       p->n_override > 1 ? "s" : "");
        fprintf(f, ")\n");
        return;
    }
    fmt_bytes(p->asked_device_total, a);
    fmt_bytes(p->budget, b);
    fprintf(f, "placement: tiered, chosen automatically: the whole model needs %s of VRAM, the "
            "budget is %s; ", a, b);
    if (p->choice == MOE_PLAN_AUTO_N_CPU_MOE) {
        fprintf(f, "the routed experts of the first %d of %d layers moved to RAM (as "
                "--n-cpu-moe %d)\n  plan: -ngl %d --n-cpu-moe %d\n", p->n_cpu_moe, p->n_layer,
                p->n_cpu_moe, p->n_gpu_layers, p->n_cpu_moe);
        return;
    }
    fprintf(f, "%s\n", p->choice == MOE_PLAN_AUTO_CPU_MOE
                           ? "every routed expert moved to RAM (as --cpu-moe)"
                           : "every routed expert moved to RAM and fewer layers on the GPU");
    fprintf(f, "  plan: -ngl %d --cpu-moe%s\n", p->n_gpu_layers,
            p->n_gpu_layers == 0 ? " (nothing fits on the GPU: the CPU runs it)" : "");
}

static void put_totals(FILE *f, const moe_placement *p) {
    char t[48], w[48], k[48], s[48], b[48], he[48], ho[48], h[48];
    fmt_bytes(p->device_total, t);
    fmt_bytes(p->device_weights, w);
    fmt_bytes(p->device_kv, k);
    fmt_bytes(p->device_scratch, s);
    fmt_bytes(p->budget, b);
    fmt_bytes(p->host_experts, he);
    fmt_bytes(p->host_other, ho);
    fmt_bytes(p->host_experts + p->host_other, h);
    fprintf(f, "  device (VRAM): %s = weights %s + KV %s + scratch %s; budget %s: %s\n", t, w, k,
            s, b, p->fits ? "fits" : "does NOT fit");
    fprintf(f, "  host (RAM, the mapped file): %s = routed experts %s + other weights %s\n", h, he,
            ho);
}

/* Why the host-side routed experts are there, as one phrase. */
static const char *experts_why(const moe_placement *p) {
    if (p->choice != MOE_PLAN_AS_ASKED) return "automatic tiering";
    if (p->cpu_moe) return "--cpu-moe";
    if (p->n_cpu_moe > 0) return "--n-cpu-moe and -ngl";
    return "-ngl";
}

static void put_layers(FILE *f, const moe_placement *p, bool *tmp) {
    fprintf(f, "  attention + KV cache: device in layers ");
    put_ranges(f, p->attn_device, p->n_layer, true);
    fprintf(f, "; host in layers ");
    put_ranges(f, p->attn_device, p->n_layer, false);
    fprintf(f, " (-ngl %d counts the output layer first, then the last layers)\n",
            p->n_gpu_layers);
    for (int il = 0; il < p->n_layer; il++) tmp[il] = p->res.n_slots[il] > 0;
    fprintf(f, "  routed experts: device slots in layers ");
    put_ranges(f, tmp, p->n_layer, true);
    fprintf(f, "; host only in layers ");
    put_ranges(f, tmp, p->n_layer, false);
    fprintf(f, " (%s%s)\n", experts_why(p), p->n_override > 0 ? ", -ot" : "");
}

static void put_globals(FILE *f, const moe_placement *p) {
    for (int i = 0; i < p->n_tensor; i++) {
        const moe_placement_tensor *t = &p->tensors[i];
        if (t->layer >= 0) break;
        fprintf(f, "%s %s %s", i == 0 ? "  outside the layers:" : ",", t->name,
                tier_name(t->tier));
    }
    fprintf(f, "\n");
}

/* Layers whose tensors of one kind are split between the tiers (by -ot). */
static void put_splits(FILE *f, const moe_placement *p) {
    for (int il = 0; il < p->n_layer; il++) {
        int n_dev[MOE_TENSOR_LAYER + 1] = {0}, n_all[MOE_TENSOR_LAYER + 1] = {0};
        for (int i = 0; i < p->n_tensor; i++) {
            const moe_placement_tensor *t = &p->tensors[i];
            if (t->layer != il) continue;
            n_all[t->kind]++;
            n_dev[t->kind] += t->tier == MOE_TIER_DEVICE;
        }
        if (n_dev[MOE_TENSOR_ATTN] > 0 && n_dev[MOE_TENSOR_ATTN] < n_all[MOE_TENSOR_ATTN])
            fprintf(f, "  layer %d: attention tensors split between tiers: it runs on the host\n",
                    il);
        if (n_dev[MOE_TENSOR_EXPERTS] > 0 && n_dev[MOE_TENSOR_EXPERTS] < n_all[MOE_TENSOR_EXPERTS])
            fprintf(f, "  layer %d: routed expert tensors split between tiers: the experts run "
                    "from the host\n", il);
    }
}

static void put_overrides(FILE *f, const moe_placement *p) {
    for (int i = 0; i < p->n_override; i++) {
        const moe_placement_override *o = &p->overrides[i];
        char b[48];
        fmt_bytes(o->bytes, b);
        fprintf(f, "  -ot '%s': %d tensor%s (%s) on the %s\n", o->text, o->n_tensors,
                o->n_tensors == 1 ? "" : "s", b, tier_name(o->tier));
    }
}

char *moe_placement_report(const moe_placement *p) {
    if (!p || !p->tensors) return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    bool *tmp = calloc((size_t)(p->n_layer > 0 ? p->n_layer : 1), sizeof(bool));
    if (!f || !tmp) {
        if (f) fclose(f);
        free(buf);
        free(tmp);
        return NULL;
    }
    put_header(f, p);
    put_totals(f, p);
    put_layers(f, p, tmp);
    put_globals(f, p);
    put_overrides(f, p);
    put_splits(f, p);
    free(tmp);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
