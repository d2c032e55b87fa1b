/* convert_gguf.c - `hotmoe convert`'s driver: checks the checkpoint against the layout forge
 * defines, then writes the GGUF metadata and streams every tensor.
 *
 * DESIGN: forge_tensors_build (names, shapes, types of the mix) and forge_hf_plan (which HF
 * tensor each GGUF tensor comes from, and how) are the single definition of the layout; this
 * file only inverts the plan's operations, row by row:
 *   COPY       GGUF row r = HF flat row r
 *   SLICE      row r of a stacked expert tensor = row r % ne1 of expert r / ne1's HF tensor
 *   UNPERMUTE  GGUF row h*D + 2i + j = HF row h*D + j*D/2 + i (convert_hf_to_gguf's permute)
 *   GATE_UP    gate (up) [e][f][c] = gate_up_proj[e][c][2f (+1)]; GATE_UP_B likewise for biases
 *   DOWN_T     down [e][c][f] = down_proj[e][f][c]
 *   MINUS1     the hybrids' zero-centred norms: w = HF + 1 (exact: Sterbenz, w near 1)
 *   A_LOG      ssm_a = -exp(A_log)
 *   QKVZ       qwen3next: attn_qkv's q/k/v rows and attn_gate's z rows from in_proj_qkvz's
 *              per-key-head groups [q_g, k_g, v_g, z_g]
 *   VROWS      qwen35moe: GGUF value head jj v_nk + g (tiled) = HF head g v_r + jj (grouped),
 *              rows; VCOLS(_ALOG) the same on the elements of each row (then -exp)
 *   CAT_GU     qwen35moe, gemma4: gate (up) rows of expert e = gate_up_proj[e] rows [0, F)
 *              ([F, 2F))
 * gemma4's rope_freqs has no HF tensor (transformers computes the proportional rope): it is
 * made from the config as convert_hf_to_gguf's Gemma4Model writes it, 1 on the n_rot / 2
 * rotated pairs and 1e30 on the others.
 * Names: a "model.X" the checkpoint lacks is looked up as "model.language_model.X" (the
 * published multimodal Qwen3.5 and Gemma 4 layouts). qwen35moe's MTP blocks are converted when
 * the checkpoint has mtp.* tensors, else left out (nextn_predict_layers 0) with a note in the
 * result.
 * Every HF tensor of the plan is resolved (present, same shape, readable dtype) before the
 * output is created, so bad input fails without writing. Rows are converted to f32 from the
 * mapped file, encoded by forge's own encoder (forge_encode_row) and written by forge's own
 * writer (forge_gguf_write: forge's metadata without general.source.forge, then chunks of at
 * most 32 MiB across a thread pool), so memory stays bounded and a forged f32 twin gives
 * forge's bytes for every mix.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/threadpool.h"
#include "convert/convert_internal.h"
#include "gguf/gguf.h"
#include "quant/fp16.h"
#include "quant/qtypes.h"
#include "quant/quant.h"


/* ---- sources ---- */

typedef struct {
    forge_hf_op op;
    const forge_hf_tensor *h; /* the plan's entry: the operation's sizes */
    int off;              /* two-source ops: 0 the first GGUF tensor (gate, attn_qkv), 1 the
                             second (up, attn_gate) */
    const st_tensor *t;   /* the HF tensor (all ops but SLICE) */
    const st_tensor **ex; /* SLICE: [n_expert] */
    int64_t rope_pairs;   /* gemma4's rope_freqs (no HF tensor): the pairs that are 1, else -1 */
} source;

static void shape_str(char *buf, size_t cap, int n, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < n && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static hm_status resolve(const char *dir, const st_set *s, const forge_hf_tensor *h,
                         const st_tensor **out, hm_error *err) {
    char want[96], got[96];
    shape_str(want, sizeof(want), h->n_dims, h->shape);
    const st_tensor *t = convert_st_find(s, h->name);
    if (!t && !strncmp(h->name, "model.", 6)) { /* a multimodal checkpoint's text model */
        char alt[128];
        snprintf(alt, sizeof(alt), "model.language_model.%s", h->name + 6);
        t = convert_st_find(s, alt);
    }
    if (!t)
        return hm_error_set(err, HM_ERR_NOT_FOUND, "%s: missing tensor %s (expected shape %s)", dir,
                            h->name, want);
    bool same = t->n_dims == h->n_dims;
    for (int d = 0; same && d < h->n_dims; d++) same = t->shape[d] == h->shape[d];
    if (!same) {
        shape_str(got, sizeof(got), t->n_dims, t->shape);
        return hm_error_set(err, HM_ERR_FORMAT,
                            "%s: tensor %s has shape %s, config.json implies %s",
                            s->files[t->file].path, h->name, got, want);
    }
    if (t->dtype == ST_OTHER)
        return hm_error_set(err, HM_ERR_UNSUPPORTED,
                            "%s: tensor %s has dtype %s; supported: F32, F16, BF16, F64",
                            s->files[t->file].path, h->name, t->dtype_name);
    *out = t;
    return HM_OK;
}

static hm_status build_sources(const char *dir, const st_set *s, const forge_preset *p,
                               const forge_tensor_list *l, const forge_hf_tensor *hs, int nh,
                               source *src, hm_error *err) {
    for (int i = 0; i < l->n; i++)
        src[i].rope_pairs = l->t[i].role == FR_ROPE_FREQS ? forge_preset_n_rot(p) / 2 : -1;
    for (int k = 0; k < nh; k++) {
        const forge_hf_tensor *h = &hs[k];
        const st_tensor *t = NULL;
        hm_status st = resolve(dir, s, h, &t, err);
        if (st != HM_OK) return st;
        for (int which = 0; which < 2; which++) {
            const bool two = h->op == FH_GATE_UP || h->op == FH_GATE_UP_B || h->op == FH_QKVZ ||
                             h->op == FH_CAT_GU;
            int i = which ? (two ? h->src2 : -1) : h->src;
            if (i < 0) continue;
            source *c = &src[i];
            c->op = h->op;
            c->h = h;
            c->off = which;
            if (h->op == FH_SLICE) {
                if (!c->ex && !(c->ex = calloc((size_t)l->t[i].ne[2], sizeof(*c->ex))))
                    return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
                c->ex[h->expert] = t;
            } else {
                c->t = t;
            }
        }
    }
    for (int i = 0; i < l->n; i++)
        if (!src[i].t && !src[i].ex && src[i].rope_pairs < 0)
            return hm_error_set(err, HM_ERR_STATE, "no HF source planned for GGUF tensor %s",
                                l->t[i].name);
    return HM_OK;
}

/* ssm_a = -exp(A_log) (convert_hf_to_gguf's Qwen3NextModel), in double rounded once */
static float minus_exp(float a_log) { return (float)-exp((double)a_log); }

/* VROWS / VCOLS*: GGUF value head gi (llama.cpp's tiled order, gi = jj v_nk + g) is HF head
 * g v_r + jj (transformers' grouped order) */
static int64_t v_head(const forge_hf_tensor *h, int64_t gi) {
    return gi % h->v_nk * h->v_r + gi / h->v_nk;
}

/* f32 values of row r of GGUF tensor t (ne[0] floats) */
static void fill_row(const forge_tensor *t, const source *c, int64_t r, float *dst) {
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1];
    if (c->rope_pairs >= 0) { /* gemma4's rope_freqs: one row */
        for (int64_t i = 0; i < ne0; i++) dst[i] = i < c->rope_pairs ? 1.0f : 1e30f;
        return;
    }
    switch (c->op) {
    case FH_COPY:
        convert_st_read(c->t, r * ne0, ne0, dst);
        break;
    case FH_SLICE:
        convert_st_read(c->ex[r / ne1], (r % ne1) * ne0, ne0, dst);
        break;
    case FH_UNPERMUTE: {
        const int64_t D = ne1 / c->h->n_heads, h = r / D, k = r % D;
        convert_st_read(c->t, (h * D + (k % 2) * (D / 2) + k / 2) * ne0, ne0, dst);
        break;
    }
    case FH_GATE_UP: {
        const int64_t e = r / ne1, f = r % ne1;
        convert_st_gather(c->t, e * ne0 * 2 * ne1 + 2 * f + c->off, 2 * ne1, ne0, dst);
        break;
    }
    case FH_GATE_UP_B:
        convert_st_gather(c->t, r * 2 * ne0 + c->off, 2, ne0, dst);
        break;
    case FH_DOWN_T: {
        const int64_t e = r / ne1, ch = r % ne1;
        convert_st_gather(c->t, e * ne0 * ne1 + ch, ne1, ne0, dst);
        break;
    }
    case FH_MINUS1:
        convert_st_read(c->t, r * ne0, ne0, dst);
        for (int64_t i = 0; i < ne0; i++) dst[i] += 1.0f;
        break;
    case FH_A_LOG:
        convert_st_read(c->t, r * ne0, ne0, dst);
        for (int64_t i = 0; i < ne0; i++) dst[i] = minus_exp(dst[i]);
        break;
    case FH_QKVZ: {
        const forge_hf_tensor *h = c->h;
        const int64_t G = h->n_heads, dk = h->grp_qk, dv = h->grp_vz, S = 2 * dk + 2 * dv;
        int64_t hr; /* the in_proj_qkvz row */
        if (c->off) hr = r / dv * S + 2 * dk + dv + r % dv; /* attn_gate: z */
        else if (r < 2 * G * dk) hr = r % (G * dk) / dk * S + (r < G * dk ? 0 : dk) + r % dk;
        else hr = (r - 2 * G * dk) / dv * S + 2 * dk + (r - 2 * G * dk) % dv;
        convert_st_read(c->t, hr * ne0, ne0, dst);
        break;
    }
    case FH_VROWS: {
        const forge_hf_tensor *h = c->h;
        int64_t hr = r, rr = r - h->v_off;
        if (rr >= 0 && rr < h->v_nk * h->v_r * h->v_hd)
            hr = h->v_off + v_head(h, rr / h->v_hd) * h->v_hd + rr % h->v_hd;
        convert_st_read(c->t, hr * ne0, ne0, dst);
        break;
    }
    case FH_VCOLS:
    case FH_VCOLS_ALOG: {
        const forge_hf_tensor *h = c->h;
        const int64_t nh = h->v_nk * h->v_r, end = h->v_off + nh * h->v_hd;
        if (h->v_off > 0) convert_st_read(c->t, r * ne0, h->v_off, dst);
        for (int64_t gi = 0; gi < nh; gi++)
            convert_st_read(c->t, r * ne0 + h->v_off + v_head(h, gi) * h->v_hd, h->v_hd,
                            dst + h->v_off + gi * h->v_hd);
        if (end < ne0) convert_st_read(c->t, r * ne0 + end, ne0 - end, dst + end);
        if (c->op == FH_VCOLS_ALOG)
            for (int64_t i = 0; i < ne0; i++) dst[i] = minus_exp(dst[i]);
        break;
    }
    case FH_CAT_GU: { /* gate_up_proj [X, 2F, E]: expert e's gate rows, then its up rows */
        const int64_t e = r / ne1, f = r % ne1;
        convert_st_read(c->t, (e * 2 * ne1 + c->off * ne1 + f) * ne0, ne0, dst);
        break;
    }
    }
}

/* forge_rows_fn: rows [r0, r0 + nr) of t from its HF source (ctx: the sources, [l->n]). */
typedef struct {
    const forge_tensor_list *l;
    const source *src;
} rows_ctx;

static hm_status convert_rows(void *ctx, const forge_tensor *t, int64_t r0, int64_t nr,
                              void *dst, float *scratch) {
    const rows_ctx *c = ctx;
    const source *sc = &c->src[t - c->l->t];
    const size_t rs = hm_row_size(t->type, t->ne[0]);
    for (int64_t r = 0; r < nr; r++) {
        fill_row(t, sc, r0 + r, scratch);
        hm_status st =
            forge_encode_row(t->type, scratch, (uint8_t *)dst + (size_t)r * rs, t->ne[0]);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

hm_status convert_run(const convert_job *job, convert_result *res, hm_error *err) {
    memset(res, 0, sizeof(*res));
    const double t0 = forge_now();
    forge_preset p;
    forge_vocab v = {0};
    st_set s = {0};
    forge_tensor_list l = {0};
    forge_hf_tensor *hs = NULL;
    source *src = NULL;
    tp_pool *pool = NULL;
    int nh = 0;
    char name[256];

    hm_status st = convert_config_read(job->hf_dir, &p, err);
    if (st != HM_OK) return st;
    if (job->name) {
        p.model_name = job->name;
    } else { /* the folder's base name, as convert_hf_to_gguf names a model without metadata */
        size_t n = strlen(job->hf_dir);
        while (n > 1 && job->hf_dir[n - 1] == '/') n--;
        size_t b = n;
        while (b > 0 && job->hf_dir[b - 1] != '/') b--;
        snprintf(name, sizeof(name), "%.*s", (int)(n - b), job->hf_dir + b);
        p.model_name = name;
    }
    if ((st = convert_vocab_read(job->hf_dir, &p, &v, err)) != HM_OK) return st;
    if ((st = convert_st_open(job->hf_dir, &s, err)) != HM_OK) goto done;
    forge_hf_opts ho = {0};
    if (p.arch == FORGE_ARCH_QWEN35MOE && p.n_nextn > 0) {
        /* the MTP blocks: converted when the checkpoint holds them (mtp.*, as published), else
         * left out (a checkpoint saved by transformers drops them), as convert_hf_to_gguf's
         * --no-mtp writes it */
        for (int i = 0; i < s.n && !ho.mtp; i++) ho.mtp = !strncmp(s.t[i].name, "mtp.", 4);
        if (!ho.mtp) {
            snprintf(res->note, sizeof(res->note),
                     "no mtp.* tensors: the GGUF has no MTP block (config.json's "
                     "mtp_num_hidden_layers %lld left out)",
                     (long long)p.n_nextn);
            p.n_nextn = 0;
        }
    }
    if ((st = forge_tensors_build(&p, job->mix, &l, err)) != HM_OK) goto done;
    if ((st = forge_hf_plan_opts(&p, &l, &ho, &hs, &nh, err)) != HM_OK) goto done;
    if (!(src = calloc((size_t)l.n, sizeof(*src)))) {
        st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = build_sources(job->hf_dir, &s, &p, &l, hs, nh, src, err)) != HM_OK) goto done;

    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int nth = job->n_threads > 0 ? job->n_threads : nc > 0 ? (int)nc : 1;
    if (nth > 64) nth = 64;
    if (nth > 1 && (st = tp_init(nth, &pool, err)) != HM_OK) goto done;
    const rows_ctx rc = {.l = &l, .src = src};
    st = forge_gguf_write(job->out_path, &p, job->mix, &v, &l, convert_rows, (void *)&rc, pool,
                          "convert", job->progress, NULL, &res->bytes, err);
    if (st == HM_OK) {
        res->arch = forge_arch_name(p.arch);
        res->n_tensors = l.n;
        forge_tensors_totals(&l, &res->n_params, NULL);
    }
done:
    res->seconds = forge_now() - t0;
    tp_free(pool);
    if (src)
        for (int i = 0; i < l.n; i++) free(src[i].ex);
    free(src);
    free(hs);
    forge_tensors_free(&l);
    convert_st_close(&s);
    convert_vocab_free(&v);
    return st;
}
