/* forge_gguf.c - writes a forged model as GGUF: metadata keys llama.cpp reads for the arch,
 * the tokenizer, then every tensor streamed in chunks of rows.
 *
 * DESIGN: keys follow convert_hf_to_gguf (general.*, {arch}.*, tokenizer.*), with the types
 * it uses (u32 counts, f32 epsilons and frequencies). Tensor data is produced chunk by chunk:
 * each chunk's rows are split across the thread pool (every row is a pure function of the
 * seed, so the split does not matter), then appended with gguf_writer_write. Memory is one
 * chunk buffer (<= 32 MiB) plus one row of floats per thread, whatever the model size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/threadpool.h"
#include "forge/forge.h"
#include "gguf/gguf.h"
#include "quant/fp16.h"
#include "quant/qtypes.h"
#include "quant/quant.h"

#define CHUNK_BYTES ((size_t)32 << 20)

static hm_status set_arch_keys(gguf_writer *w, const forge_preset *p) {
    const char *a = forge_arch_name(p->arch);
    char k[128];
    hm_status st = HM_OK;
#define U32(suffix, v) do { snprintf(k, sizeof(k), "%s.%s", a, suffix); if (st == HM_OK) st = gguf_writer_set_u32(w, k, (uint32_t)(v)); } while (0)
#define F32(suffix, v) do { snprintf(k, sizeof(k), "%s.%s", a, suffix); if (st == HM_OK) st = gguf_writer_set_f32(w, k, (float)(v)); } while (0)
#define STR(suffix, v) do { snprintf(k, sizeof(k), "%s.%s", a, suffix); if (st == HM_OK) st = gguf_writer_set_str(w, k, v); } while (0)
    U32("vocab_size", p->n_vocab);
    U32("context_length", p->n_ctx);
    U32("embedding_length", p->n_embd);
    U32("block_count", p->n_layer + p->n_nextn); /* qwen35moe: its MTP blocks appended */
    if (p->n_ff > 0) U32("feed_forward_length", p->n_ff); /* qwen35moe's config has none */
    U32("attention.head_count", p->n_head);
    const bool gemma = p->arch == FORGE_ARCH_GEMMA4;
    if (gemma) { /* convert_hf_to_gguf's Gemma4Model: kv heads per layer, the full layers' sizes */
        uint32_t kv[1024];
        for (int il = 0; il < (int)p->n_layer; il++)
            kv[il] = (uint32_t)(forge_layer_swa(p, il) ? p->n_head_kv : p->n_head_kv_full);
        snprintf(k, sizeof(k), "%s.attention.head_count_kv", a);
        if (st == HM_OK) st = gguf_writer_set_arr(w, k, GGUF_VT_UINT32, kv, (uint64_t)p->n_layer);
    } else {
        U32("attention.head_count_kv", p->n_head_kv);
    }
    U32("attention.key_length", gemma ? p->head_dim_full : p->head_dim);
    U32("attention.value_length", gemma ? p->head_dim_full : p->head_dim);
    F32("rope.freq_base", gemma ? p->rope_base_full : p->rope_base);
    /* gemma4: the whole global head, rope_freqs leaving the unrotated pairs still */
    U32("rope.dimension_count", gemma ? p->head_dim_full : forge_preset_n_rot(p));
    F32("attention.layer_norm_rms_epsilon", p->rms_eps);
    U32("expert_count", p->n_expert);
    U32("expert_used_count", p->n_expert_used);
    const bool next = forge_arch_hybrid(p->arch);
    if (p->arch == FORGE_ARCH_QWEN3MOE || p->arch == FORGE_ARCH_QWEN2MOE || p->arch == FORGE_ARCH_GPTOSS || next ||
        gemma)
        U32("expert_feed_forward_length", p->n_ff_exp);
    if (p->arch == FORGE_ARCH_QWEN2MOE || next) U32("expert_shared_feed_forward_length", p->n_ff_shexp);
    if (next) { /* convert_hf_to_gguf's Qwen3NextModel */
        U32("ssm.conv_kernel", p->ssm_conv_kernel);
        U32("ssm.state_size", p->ssm_head_k);
        U32("ssm.group_count", p->ssm_n_k_heads);
        U32("ssm.time_step_rank", p->ssm_n_v_heads);
        U32("ssm.inner_size", p->ssm_n_v_heads * p->ssm_head_v);
        U32("full_attention_interval", 4);
    }
    if (p->arch == FORGE_ARCH_QWEN35MOE) { /* Qwen3_5MoeTextModel: _Qwen35MRopeMixin, MTP */
        int32_t sec[4];
        for (int i = 0; i < 4; i++) sec[i] = (int32_t)p->rope_sections[i];
        snprintf(k, sizeof(k), "%s.rope.dimension_sections", a);
        if (st == HM_OK) st = gguf_writer_set_arr(w, k, GGUF_VT_INT32, sec, 4);
        if (p->n_nextn > 0) U32("nextn_predict_layers", p->n_nextn);
    }
    if (gemma) {
        bool swa[1024];
        for (int il = 0; il < (int)p->n_layer; il++) swa[il] = forge_layer_swa(p, il);
        F32("rope.freq_base_swa", p->rope_base);
        U32("attention.sliding_window", p->sliding_window);
        F32("final_logit_softcapping", p->softcap);
        U32("attention.shared_kv_layers", 0);
        U32("embedding_length_per_layer_input", 0);
        snprintf(k, sizeof(k), "%s.attention.sliding_window_pattern", a);
        if (st == HM_OK) st = gguf_writer_set_arr(w, k, GGUF_VT_BOOL, swa, (uint64_t)p->n_layer);
        U32("attention.key_length_swa", p->head_dim);
        U32("attention.value_length_swa", p->head_dim);
        U32("rope.dimension_count_swa", p->head_dim);
    }
    if (p->arch == FORGE_ARCH_GPTOSS) {
        U32("attention.sliding_window", p->sliding_window);
        STR("rope.scaling.type", "yarn");
        F32("rope.scaling.factor", p->yarn_factor);
        U32("rope.scaling.original_context_length", p->yarn_orig_ctx);
    }
#undef U32
#undef F32
#undef STR
    return st;
}

static hm_status set_tokenizer_keys(gguf_writer *w, const forge_vocab *v) {
    hm_status st = gguf_writer_set_str(w, "tokenizer.ggml.model", v->spm ? "llama" : "gpt2");
    if (st == HM_OK) st = gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre);
    if (st == HM_OK) st = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, (uint64_t)v->n);
    if (st == HM_OK && v->spm) st = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, v->scores, (uint64_t)v->n);
    if (st == HM_OK) st = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v->types, (uint64_t)v->n);
    if (st == HM_OK && !v->spm)
        st = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, (uint64_t)v->n_merges);
    if (st == HM_OK && v->bos >= 0) st = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (st == HM_OK && v->eos >= 0) st = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    if (st == HM_OK && v->unk >= 0) st = gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk);
    if (st == HM_OK && v->pad >= 0) st = gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad);
    if (st == HM_OK) st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    if (st == HM_OK && v->spm) st = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    if (st == HM_OK && v->chat_template)
        st = gguf_writer_set_str(w, "tokenizer.chat_template", v->chat_template);
    return st;
}

typedef struct {
    forge_rows_fn fn;
    void *ctx;
    const forge_tensor *t;
    int64_t r0, nr;
    size_t row_size;
    uint8_t *dst;
    float *scratch; /* [nth][max_ne0] */
    int64_t max_ne0;
    hm_status st[64];
} chunk_job;

static void chunk_worker(void *ctx, int ith, int nth) {
    chunk_job *j = ctx;
    int64_t a = j->nr * ith / nth, b = j->nr * (ith + 1) / nth;
    j->st[ith] = HM_OK;
    if (b > a)
        j->st[ith] = j->fn(j->ctx, j->t, j->r0 + a, b - a, j->dst + (size_t)a * j->row_size,
                           j->scratch + (size_t)ith * (size_t)j->max_ne0);
}

/* Every tensor of l, in order, from fn into w, in chunks of at most 32 MiB spread over pool's
 * threads, with a progress bar on a terminal. */
static hm_status stream_tensors(gguf_writer *w, const char *out_path, const forge_tensor_list *l,
                                forge_rows_fn fn, void *ctx, tp_pool *pool, const char *label,
                                bool progress, hm_error *err) {
    const int nth = pool ? tp_size(pool) : 1;
    int64_t max_ne0 = 0;
    uint64_t total = 0;
    for (int i = 0; i < l->n; i++) {
        if (l->t[i].ne[0] > max_ne0) max_ne0 = l->t[i].ne[0];
        total += forge_tensor_bytes(&l->t[i]);
    }
    uint8_t *buf = malloc(CHUNK_BYTES);
    float *scratch = malloc((size_t)nth * (size_t)max_ne0 * sizeof(float));
    hm_status st = HM_OK;
    if (!buf || !scratch || nth > 64)
        st = hm_error_set(err, HM_ERR_NOMEM, "out of memory for the write buffers");
    forge_progress pr;
    forge_progress_begin(&pr, label, total, progress);
    for (int i = 0; i < l->n && st == HM_OK; i++) {
        const forge_tensor *t = &l->t[i];
        const size_t rs = hm_row_size(t->type, t->ne[0]);
        const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        int64_t per = (int64_t)(CHUNK_BYTES / rs);
        if (per < 1) per = 1;
        for (int64_t r0 = 0; r0 < rows && st == HM_OK; r0 += per) {
            chunk_job cj = {.fn = fn, .ctx = ctx, .t = t, .r0 = r0,
                            .nr = rows - r0 < per ? rows - r0 : per, .row_size = rs, .dst = buf,
                            .scratch = scratch, .max_ne0 = max_ne0};
            tp_run(pool, chunk_worker, &cj);
            for (int k = 0; k < nth && st == HM_OK; k++)
                if (cj.st[k] != HM_OK)
                    st = hm_error_set(err, cj.st[k], "cannot make tensor %s as %s", t->name,
                                      hm_type_name(t->type));
            if (st == HM_OK && (st = gguf_writer_write(w, buf, (size_t)cj.nr * rs)) != HM_OK)
                hm_error_set(err, st, "%s: %s", out_path, gguf_writer_errmsg(w));
            forge_progress_add(&pr, (uint64_t)cj.nr * rs);
        }
    }
    forge_progress_end(&pr);
    free(buf);
    free(scratch);
    return st;
}

hm_status forge_encode_row(uint32_t type, const float *f, void *out, int64_t n) {
    if (type == HM_TYPE_F32) {
        memcpy(out, f, (size_t)n * sizeof(float));
        return HM_OK;
    }
    if (type == HM_TYPE_F16) {
        hm_fp16 *h = out;
        for (int64_t i = 0; i < n; i++) h[i] = hm_f32_to_fp16(f[i]);
        return HM_OK;
    }
    return quant_quantize_row(type, f, out, n);
}

static hm_status write_metadata(gguf_writer *w, const forge_preset *p, forge_mix mix,
                                const forge_vocab *v, const forge_tensor_list *l,
                                const char *source_note) {
    hm_status st = gguf_writer_set_str(w, "general.architecture", forge_arch_name(p->arch));
    if (st == HM_OK) st = gguf_writer_set_str(w, "general.type", "model");
    if (st == HM_OK) st = gguf_writer_set_str(w, "general.name", p->model_name);
    if (st == HM_OK) st = gguf_writer_set_u32(w, "general.file_type", forge_mix_file_type(mix));
    if (st == HM_OK) st = gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (st == HM_OK && source_note)
        st = gguf_writer_set_str(w, "general.source.forge", source_note);
    if (st == HM_OK) st = set_arch_keys(w, p);
    if (st == HM_OK) st = set_tokenizer_keys(w, v);
    for (int i = 0; st == HM_OK && i < l->n; i++)
        st = gguf_writer_add_tensor(w, l->t[i].name, l->t[i].type, l->t[i].n_dims, l->t[i].ne);
    return st;
}

hm_status forge_gguf_write(const char *out_path, const forge_preset *p, forge_mix mix,
                           const forge_vocab *v, const forge_tensor_list *l, forge_rows_fn fn,
                           void *ctx, tp_pool *pool, const char *label, bool progress,
                           const char *source_note, uint64_t *bytes, hm_error *err) {
    gguf_writer *w = NULL;
    hm_status st = gguf_writer_open(out_path, &w, err);
    if (st != HM_OK) return st;
    st = write_metadata(w, p, mix, v, l, source_note);
    if (st == HM_OK) st = gguf_writer_begin_data(w);
    if (st != HM_OK) hm_error_set(err, st, "%s: %s", out_path, gguf_writer_errmsg(w));
    if (st == HM_OK) st = stream_tensors(w, out_path, l, fn, ctx, pool, label, progress, err);
    if (st == HM_OK) {
        st = gguf_writer_close(w, err);
    } else {
        hm_error ignored;
        gguf_writer_close(w, &ignored);
    }
    if (st != HM_OK) {
        unlink(out_path);
        return st;
    }
    FILE *f = fopen(out_path, "rb");
    if (f && bytes) {
        fseeko(f, 0, SEEK_END);
        *bytes = (uint64_t)ftello(f);
    }
    if (f) fclose(f);
    return HM_OK;
}

typedef struct {
    const forge_gen *g;
    const forge_preset *p;
    const forge_tensor *src; /* forge_job.fuse_gate_up: [2 * layers] each layer's gate and up */
} gen_ctx;

static hm_status gen_rows(void *ctx, const forge_tensor *t, int64_t r0, int64_t nr, void *dst,
                          float *scratch) {
    const gen_ctx *c = ctx;
    if (!c->src || t->role != FR_EXP_GATE || t->layer < 0)
        return forge_gen_rows(c->g, c->p, t, r0, nr, dst, scratch);
    /* fused row r: expert r / 2F, then gate row r % 2F, or up row r % 2F - F */
    const forge_tensor *gate = &c->src[2 * t->layer], *up = gate + 1;
    const int64_t F = gate->ne[1];
    const size_t rb = hm_row_size(t->type, t->ne[0]);
    hm_status st = HM_OK;
    for (int64_t r = r0; r < r0 + nr && st == HM_OK;) {
        const int64_t e = r / (2 * F), j = r % (2 * F), half = j < F ? F - j : 2 * F - j;
        const int64_t n = half < r0 + nr - r ? half : r0 + nr - r;
        st = forge_gen_rows(c->g, c->p, j < F ? gate : up, e * F + (j < F ? j : j - F), n,
                            (char *)dst + (size_t)(r - r0) * rb, scratch);
        r += n;
    }
    return st;
}

/* forge_job.fuse_gate_up: each layer's ffn_gate_exps becomes ffn_gate_up_exps {E, 2F, X} in its
 * place and ffn_up_exps goes; the two are kept in *src (by layer) for gen_rows. */
static hm_status fuse_gate_up(const forge_preset *p, forge_tensor_list *l, forge_tensor **src,
                              hm_error *err) {
    if (!forge_arch_fused_gate_up(p->arch))
        return hm_error_set(err, HM_ERR_ARG, "fused gate/up experts: llama.cpp takes them for "
                            "gemma4, qwen3next and qwen35moe, not %s", forge_arch_name(p->arch));
    int n_layers = 0;
    for (int i = 0; i < l->n; i++)
        if (l->t[i].layer + 1 > n_layers) n_layers = l->t[i].layer + 1;
    *src = calloc((size_t)(2 * n_layers + 1), sizeof(**src));
    if (!*src) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < l->n; i++)
        if (l->t[i].role == FR_EXP_GATE || l->t[i].role == FR_EXP_UP)
            (*src)[2 * l->t[i].layer + (l->t[i].role == FR_EXP_UP)] = l->t[i];
    int n = 0;
    for (int i = 0; i < l->n; i++) {
        forge_tensor t = l->t[i];
        if (t.role == FR_EXP_UP) continue;
        if (t.role == FR_EXP_GATE) {
            const forge_tensor *up = &(*src)[2 * t.layer + 1];
            if (up->type != t.type || up->ne[1] != t.ne[1])
                return hm_error_set(err, HM_ERR_ARG, "tensor %s: gate and up differ in type or "
                                    "shape, cannot be fused", t.name);
            snprintf(t.name, sizeof(t.name), "blk.%d.ffn_gate_up_exps.weight", t.layer);
            t.ne[1] *= 2;
        }
        l->t[n++] = t;
    }
    l->n = n;
    return HM_OK;
}

hm_status forge_write_gguf(const forge_job *job, forge_result *res, hm_error *err) {
    const forge_preset *p = job->preset;
    forge_tensor_list l = {0};
    forge_vocab v = {0};
    tp_pool *pool = NULL;
    forge_tensor *src = NULL;
    double t0 = forge_now();
    memset(res, 0, sizeof(*res));

    hm_status st = forge_tensors_build(p, job->mix, &l, err);
    if (st != HM_OK) return st;
    st = forge_vocab_build(p, &v, err);
    if (st != HM_OK) { forge_tensors_free(&l); return st; }

    int nth = job->n_threads < 1 ? 1 : job->n_threads > 64 ? 64 : job->n_threads;
    if (nth > 1 && (st = tp_init(nth, &pool, err)) != HM_OK) goto done;

    if (job->fuse_gate_up && (st = fuse_gate_up(p, &l, &src, err)) != HM_OK) goto done;
    const gen_ctx gc = {.g = &job->gen, .p = p, .src = src};
    st = forge_gguf_write(job->out_path, p, job->mix, &v, &l, gen_rows, (void *)&gc, pool,
                          "forge", job->progress,
                          "hotmoe forge: synthetic weights, not a trained model", &res->bytes,
                          err);
    if (st == HM_OK) {
        forge_tensors_totals(&l, &res->n_params, NULL);
        res->n_tensors = l.n;
    }
done:
    free(src);
    res->seconds = forge_now() - t0;
    tp_free(pool);
    forge_vocab_free(&v);
    forge_tensors_free(&l);
    return st;
}
