/* context.c - hm_context: which engine runs a model, and hm_decode on top of it.
 *
 * DESIGN: the context resolves the user's parameters once (defaults, clamps, the KV types each
 * engine takes), then creates exactly one engine: the GPU engine when n_gpu_layers > 0 and it
 * can be had (otherwise the reason is logged, or returned under gpu_strict), else the CPU
 * engine. hm_decode validates its arguments for both (token ids, positions, sizes), keeps the
 * cache length (n_past) and runs the tokens: on the CPU in ubatches of at most n_ubatch, on the
 * GPU in one call (the engine splits). Routing reaches the observer per call on the CPU; on the
 * GPU the device counts are read after each hm_decode call and when a generation ends
 * (hm_context_flush_routes), never per token.
 */
#include "runtime/context.h"
#include "runtime/runtime_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/log.h"
#include "cpu_engine/cpu_engine.h"
#include "cuda/cuda_engine.h"
#include "moe/tracer.h"
#include "quant/qtypes.h"

struct hm_context {
    const hm_model *m;
    hm_context_params p;
    int n_past;          /* positions held */
    cpu_engine *cpu;     /* the CPU path, or NULL */
    cuda_engine *gpu;    /* the GPU path, or NULL */
    moe_observer obs;    /* routing observer (no function set: none) */
    bool gpu_counting;   /* the GPU engine counts routes on the device for obs */
    uint64_t *hits;      /* [n_layer][n_expert] device counts read back (GPU path) */
    uint64_t *calls, *tokens; /* [n_layer] */
};

hm_context_params hm_context_default_params(void) {
    hm_context_params p = {.n_ctx = 0, .n_batch = 2048, .n_ubatch = 512, .n_threads = 0,
                           .type_k = HM_TYPE_F16, .type_v = HM_TYPE_F16, .check_ram = true,
                           .n_gpu_layers = 0, .main_gpu = 0, .gpu_strict = false};
    return p;
}

/* Fills in defaults and clamps; returns HM_ERR_ARG on nonsense. */
static hm_status resolve_params(const hm_model *m, const hm_context_params *in,
                                hm_context_params *p, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(m);
    *p = in ? *in : hm_context_default_params();
    if (p->n_ctx < 0 || p->n_batch < 0 || p->n_ubatch < 0 || p->n_threads < 0)
        return hm_error_set(err, HM_ERR_ARG, "context sizes and thread count must be >= 0");
    if (p->n_gpu_layers < 0 || p->main_gpu < 0)
        return hm_error_set(err, HM_ERR_ARG, "-ngl and -mg must be >= 0");
    if (p->n_ctx == 0) p->n_ctx = (int)(hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    if (p->n_batch == 0) p->n_batch = 2048;
    if (p->n_ubatch == 0) p->n_ubatch = 512;
    if (p->n_batch > p->n_ctx) p->n_batch = p->n_ctx;
    if (p->n_ubatch > p->n_batch) p->n_ubatch = p->n_batch;
    if (p->n_threads == 0) p->n_threads = hm_cpu_count_allowed();
    if (p->n_ctx > (1 << 24))
        return hm_error_set(err, HM_ERR_RANGE, "context size %d is too large (max %d)", p->n_ctx,
                            1 << 24);
    if (p->n_threads > 1024)
        return hm_error_set(err, HM_ERR_RANGE, "thread count %d is too large (max 1024)",
                            p->n_threads);
    for (int i = 0; i < 2; i++) {
        uint32_t t = i ? p->type_v : p->type_k;
        if (t != HM_TYPE_F16 && t != HM_TYPE_Q8_0 && t != HM_TYPE_F32 && t != HM_TYPE_BF16)
            return hm_error_set(err, HM_ERR_UNSUPPORTED, "unsupported KV cache type %s (use f32,"
                                " f16, bf16 or q8_0)", hm_type_name(t));
        if (t == HM_TYPE_Q8_0 && hp->head_dim_k % 32)
            return hm_error_set(err, HM_ERR_UNSUPPORTED, "q8_0 KV cache needs a head size that "
                                "is a multiple of 32 (this model: %lld)",
                                (long long)hp->head_dim_k);
    }
    return HM_OK;
}

static cpu_engine_params cpu_params(const hm_context_params *p) {
    return (cpu_engine_params){.n_ctx = p->n_ctx, .n_ubatch = p->n_ubatch,
                               .n_threads = p->n_threads, .type_k = p->type_k,
                               .type_v = p->type_v};
}

uint64_t hm_context_bytes(const hm_model *m, const hm_context_params *params) {
    hm_context_params p;
    if (resolve_params(m, params, &p, NULL) != HM_OK) return 0;
    const cpu_engine_params cp = cpu_params(&p);
    return cpu_engine_bytes(m, &cp);
}

/* Creates the GPU engine for ngl > 0. Failure: gpu_strict -> the engine's error; otherwise one
 * log line and the CPU path (HM_OK with c->gpu NULL). */
static hm_status gpu_open(hm_context *c, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(c->m);
    if (c->p.n_gpu_layers < hp->n_layer + 1)
        HM_LOGW("-ngl %d: partial GPU placement is not implemented yet; placing the whole model "
                "(%lld layers + output) on the GPU", c->p.n_gpu_layers, (long long)hp->n_layer);
    cuda_engine_params ep = {.device = c->p.main_gpu, .n_ctx = c->p.n_ctx,
                             .n_ubatch = c->p.n_ubatch, .type_k = c->p.type_k,
                             .type_v = c->p.type_v};
    hm_error e2 = {0};
    hm_status st = cuda_engine_init(c->m, &ep, &c->gpu, &e2);
    if (st == HM_OK) {
        HM_LOGI("GPU: %s", cuda_engine_describe(c->gpu));
        return HM_OK;
    }
    c->gpu = NULL;
    if (c->p.gpu_strict)
        return hm_error_set(err, st, "GPU required (--gpu-strict) but unavailable: %s", e2.msg);
    HM_LOGW("GPU unavailable (%s); running on the CPU", e2.msg);
    return HM_OK;
}

/* RAM for the weights (mapped) and, on the CPU path, the KV cache and buffers; a context on the
 * GPU keeps those in VRAM (its admission control checked them). */
static hm_status check_ram(const hm_context *c, hm_error *err) {
    const uint64_t ctx_bytes = c->gpu ? 0 : hm_context_bytes(c->m, &c->p);
    const uint64_t need = hm_model_weight_bytes(c->m) + ctx_bytes, ram = hm_ram_bytes();
    if (!ram || need <= ram) return HM_OK;
    char b1[32], b2[32], b3[32], b4[32];
    return hm_error_set(err, HM_ERR_NOMEM, "model needs %s of RAM (weights %s + KV cache and "
                        "buffers %s for -c %d) but this machine has %s", hm_bytes_str(need, b1),
                        hm_bytes_str(hm_model_weight_bytes(c->m), b2),
                        hm_bytes_str(ctx_bytes, b3), c->p.n_ctx, hm_bytes_str(ram, b4));
}

hm_status hm_context_init(const hm_model *m, const hm_context_params *params, hm_context **out,
                          hm_error *err) {
    *out = NULL;
    hm_context_params p;
    hm_status st = resolve_params(m, params, &p, err);
    if (st != HM_OK) return st;
    hm_context *c = calloc(1, sizeof(*c));
    if (!c) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (context)");
    c->m = m;
    c->p = p;
    if (p.n_gpu_layers > 0) st = gpu_open(c, err);
    if (st == HM_OK && p.check_ram) st = check_ram(c, err);
    if (st == HM_OK && !c->gpu) {
        char buf[160];
        const char *w = hm_cpu_threads_warning(p.n_threads, buf, sizeof(buf));
        if (w) HM_LOGW("%s", w);
        const cpu_engine_params cp = cpu_params(&p);
        st = cpu_engine_init(m, &cp, &c->cpu, err);
    }
    if (st != HM_OK) {
        hm_context_free(c);
        return st;
    }
    *out = c;
    return HM_OK;
}

void hm_context_free(hm_context *c) {
    if (!c) return;
    cuda_engine_free(c->gpu);
    cpu_engine_free(c->cpu);
    free(c->hits);
    free(c->calls);
    free(c->tokens);
    free(c);
}

int hm_context_n_past(const hm_context *c) { return c->n_past; }
int hm_context_n_ctx(const hm_context *c) { return c->p.n_ctx; }
int hm_context_n_batch(const hm_context *c) { return c->p.n_batch; }
const hm_model *hm_context_model(const hm_context *c) { return c->m; }
int hm_context_n_threads(const hm_context *c) {
    return c->cpu ? cpu_engine_n_threads(c->cpu) : c->p.n_threads;
}
struct cuda_engine *hm_context_gpu(const hm_context *c) { return c->gpu; }
moe_exec *hm_context_exec(hm_context *c) { return c->cpu ? cpu_engine_exec(c->cpu) : NULL; }

void hm_context_reset(hm_context *c) {
    /* the GPU cache is overwritten from the position a decode starts at: nothing to clear */
    if (c->cpu) cpu_engine_reset(c->cpu);
    c->n_past = 0;
}

hm_status hm_context_truncate(hm_context *c, int n_keep, hm_error *err) {
    if (n_keep < 0 || n_keep > c->n_past)
        return hm_error_set(err, HM_ERR_ARG, "cannot keep %d positions of %d", n_keep, c->n_past);
    if (n_keep == 0) {
        hm_context_reset(c);
        return HM_OK;
    }
    if (c->cpu) { /* the GPU keeps every position of every layer */
        hm_status st = cpu_engine_truncate_check(c->cpu, n_keep, err);
        if (st != HM_OK) return st;
    }
    c->n_past = n_keep;
    return HM_OK;
}

/* ---- routing observer ---- */

hm_status hm_context_set_observer(hm_context *c, const moe_observer *o, hm_error *err) {
    c->obs = o ? *o : (moe_observer){0};
    if (c->cpu) {
        cpu_engine_set_observer(c->cpu, o);
        return HM_OK;
    }
    const bool want = o && o->counts;
    if (want && !c->hits) {
        const hm_hparams *hp = hm_model_hparams(c->m);
        const size_t nl = (size_t)hp->n_layer, ne = (size_t)(hp->n_expert > 0 ? hp->n_expert : 1);
        c->hits = calloc(nl * ne, sizeof(uint64_t));
        c->calls = calloc(nl, sizeof(uint64_t));
        c->tokens = calloc(nl, sizeof(uint64_t));
        if (!c->hits || !c->calls || !c->tokens)
            return hm_error_set(err, HM_ERR_NOMEM, "out of memory (route counts)");
    }
    if (want == c->gpu_counting) return HM_OK;
    hm_status st = cuda_engine_route_counts_enable(c->gpu, want, err);
    if (st == HM_OK) c->gpu_counting = want;
    return st;
}

static void tracer_route(void *user, int layer, int64_t n_tok, int n_used, const int32_t *ids,
                         const float *weights) {
    (void)weights;
    moe_tracer_record(user, layer, ids, n_tok, n_used);
}

static void tracer_counts(void *user, int layer, uint64_t calls, uint64_t tokens,
                          const uint64_t *hits) {
    moe_tracer_add_counts(user, layer, calls, tokens, hits);
}

hm_status hm_context_set_tracer(hm_context *c, struct moe_tracer *t, hm_error *err) {
    if (!t) return hm_context_set_observer(c, NULL, err);
    const moe_observer o = {.route = tracer_route, .counts = tracer_counts, .user = t};
    return hm_context_set_observer(c, &o, err);
}

hm_status hm_context_flush_routes(hm_context *c, hm_error *err) {
    if (!c->gpu || !c->gpu_counting) return HM_OK;
    const hm_hparams *hp = hm_model_hparams(c->m);
    const size_t nl = (size_t)hp->n_layer, ne = (size_t)hp->n_expert;
    memset(c->hits, 0, nl * ne * sizeof(uint64_t));
    memset(c->calls, 0, nl * sizeof(uint64_t));
    memset(c->tokens, 0, nl * sizeof(uint64_t));
    hm_status st = cuda_engine_route_counts_read(c->gpu, c->hits, c->calls, c->tokens, err);
    if (st != HM_OK) return st;
    for (size_t il = 0; il < nl; il++)
        if (c->calls[il]) c->obs.counts(c->obs.user, (int)il, c->calls[il], c->tokens[il],
                                        c->hits + il * ne);
    return HM_OK;
}

/* ---- decode ---- */

static hm_status check_decode(const hm_context *c, const int32_t *tokens, int n_tok, int pos,
                              const float *logits, hm_logits_mode mode, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(c->m);
    if (n_tok <= 0 || !tokens)
        return hm_error_set(err, HM_ERR_ARG, "nothing to decode (%d tokens)", n_tok);
    if (mode != HM_LOGITS_NONE && !logits)
        return hm_error_set(err, HM_ERR_ARG, "logits requested but no buffer given");
    if (n_tok > c->p.n_batch)
        return hm_error_set(err, HM_ERR_ARG, "%d tokens in one call exceed the batch size %d "
                            "(-b)", n_tok, c->p.n_batch);
    if (pos < 0 || pos > c->n_past)
        return hm_error_set(err, HM_ERR_ARG, "position %d is past the %d positions in the cache",
                            pos, c->n_past);
    if ((int64_t)pos + n_tok > c->p.n_ctx)
        return hm_error_set(err, HM_ERR_RANGE, "%d tokens at position %d do not fit the context "
                            "size %d (-c)", n_tok, pos, c->p.n_ctx);
    for (int i = 0; i < n_tok; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return hm_error_set(err, HM_ERR_RANGE, "token id %d at index %d is outside the "
                                "vocabulary (%lld tokens)", tokens[i], i, (long long)hp->n_vocab);
    if (c->gpu && c->obs.route && !c->obs.counts)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "this routing observer needs every routing "
                            "result on the host: it runs on the CPU path only (use -ngl 0)");
    return HM_OK;
}

hm_status hm_decode(hm_context *c, const int32_t *tokens, int n_tok, int pos, float *logits,
                    hm_logits_mode mode, hm_error *err) {
    hm_status st = check_decode(c, tokens, n_tok, pos, logits, mode, err);
    if (st == HM_OK && pos < c->n_past) st = hm_context_truncate(c, pos, err);
    if (st != HM_OK) return st;
    if (c->gpu) {
        st = cuda_engine_decode(c->gpu, tokens, n_tok, pos, logits, mode, err);
        if (st != HM_OK) return st;
        c->n_past = pos + n_tok;
        return hm_context_flush_routes(c, err);
    }
    const int64_t V = hm_model_hparams(c->m)->n_vocab;
    for (int done = 0; done < n_tok;) {
        int n = n_tok - done < c->p.n_ubatch ? n_tok - done : c->p.n_ubatch;
        bool last = done + n == n_tok;
        hm_logits_mode um = mode == HM_LOGITS_ALL ? HM_LOGITS_ALL
                            : (mode == HM_LOGITS_LAST && last) ? HM_LOGITS_LAST : HM_LOGITS_NONE;
        float *lo = mode == HM_LOGITS_ALL ? logits + (size_t)done * (size_t)V : logits;
        st = cpu_engine_decode(c->cpu, tokens + done, n, pos + done, lo, um, err);
        if (st != HM_OK) return st;
        c->n_past = pos + done + n;
        done += n;
    }
    return HM_OK;
}

void runtime_context_set_past(hm_context *c, int n_past) { c->n_past = n_past; }
