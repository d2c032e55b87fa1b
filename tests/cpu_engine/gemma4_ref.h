/* gemma4_ref.h - a straightforward double-precision Gemma 4 MoE forward pass over an f32 GGUF
 * (its tensors and keys read by name from the file), written from the model's definition
 * (transformers' modeling_gemma4.py Gemma4TextModel, llama.cpp's gemma4 graph and converter;
 * docs/GEMMA4.md), not from the engine's code: the check of tests/cpu_engine/test_gemma4.c.
 *
 * Per token, in order: x = embedding * sqrt(n_embd); per layer (sliding or full by
 * sliding_window_pattern, each kind with its kv heads, head size, rope base and dims):
 *   h = rms(x) * attn_norm; q = rms_head(Wq h) * q_norm, k = rms_head(Wk h) * k_norm,
 *   v = rms_head(Wv h) (a full layer: rms_head(Wk h), K's product before its norm), no weight;
 *   NEOX rope (pairs (i, i + dims/2), angle pos * base^(-2i/dims) / rope_freqs[i] on full
 *   layers); scores q.k (scale 1), softmax over the positions a token sees (sliding: the last
 *   `window` ones, itself included); x += rms(Wo attn) * post_attention_norm;
 *   a = x: dense = rms(down(gelu_tanh(gate u) * up u)) * post_ffw_norm_1, u = rms(a) * ffn_norm;
 *   router = softmax(W_r (rms(a) * ffn_gate_inp.scale / sqrt(n_embd))), top-k (lowest id on
 *   ties), renormalised, times ffn_down_exps.scale; experts on rms(a) * pre_ffw_norm_2, their
 *   weighted sum s; x = (a + rms(dense + rms(s) * post_ffw_norm_2) * post_ffw_norm) *
 *   layer_output_scale; logits = cap tanh((token_embd . (rms(x) * output_norm)) / cap).
 * rms(v) = v / sqrt(mean(v^2) + eps). Everything in double; tanh/exp/sqrt from libm.
 * window_off: a test's switch that lets sliding layers see every position (the window's effect).
 */
#ifndef HM_TESTS_GEMMA4_REF_H
#define HM_TESTS_GEMMA4_REF_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

typedef struct {
    const gguf_ctx *g;
    int64_t E, V, L, nh, X, K, F, D, W;
    int64_t hd[2], nkv[2], nrot[2]; /* [0] full layers, [1] sliding ones */
    double base[2];
    double eps, cap;
    bool swa[64];
    bool window_off;
    double *kc, *vc; /* [L][n_ctx][max nkv * hd] */
    int64_t kvw;     /* max nkv * hd */
    int n_ctx, pos;
} gref;

static const float *gref_t(const gref *r, int il, const char *suffix) {
    char name[96];
    if (il >= 0) snprintf(name, sizeof(name), "blk.%d.%s", il, suffix);
    else snprintf(name, sizeof(name), "%s", suffix);
    const gguf_tensor *t = gguf_find_tensor(r->g, name);
    if (!t || t->type != 0 /* f32 */) {
        fprintf(stderr, "gref: tensor %s missing or not f32\n", name);
        abort();
    }
    return (const float *)t->data;
}

static int64_t gref_i(const gref *r, const char *suffix) {
    char key[96];
    snprintf(key, sizeof(key), "gemma4.%s", suffix);
    int64_t v = 0;
    hm_error err;
    if (gguf_kv_int(r->g, gguf_find_key(r->g, key), &v, &err) != HM_OK) {
        fprintf(stderr, "gref: key %s\n", key);
        abort();
    }
    return v;
}

static double gref_f(const gref *r, const char *suffix) {
    char key[96];
    snprintf(key, sizeof(key), "gemma4.%s", suffix);
    double d = 0;
    hm_error err;
    if (gguf_kv_float(r->g, gguf_find_key(r->g, key), &d, &err) != HM_OK) {
        fprintf(stderr, "gref: key %s\n", key);
        abort();
    }
    return d;
}

static bool gref_init(gref *r, const gguf_ctx *g, int n_ctx) {
    memset(r, 0, sizeof(*r));
    r->g = g;
    hm_error err;
    r->E = gref_i(r, "embedding_length");
    r->L = gref_i(r, "block_count");
    r->nh = gref_i(r, "attention.head_count");
    r->X = gref_i(r, "expert_count");
    r->K = gref_i(r, "expert_used_count");
    r->F = gref_i(r, "expert_feed_forward_length");
    r->D = gref_i(r, "feed_forward_length");
    r->W = gref_i(r, "attention.sliding_window");
    r->hd[0] = gref_i(r, "attention.key_length");
    r->hd[1] = gref_i(r, "attention.key_length_swa");
    r->nrot[0] = gref_i(r, "rope.dimension_count");
    r->nrot[1] = gref_i(r, "rope.dimension_count_swa");
    r->base[0] = gref_f(r, "rope.freq_base");
    r->base[1] = gref_f(r, "rope.freq_base_swa");
    r->eps = gref_f(r, "attention.layer_norm_rms_epsilon");
    r->cap = gref_f(r, "final_logit_softcapping");
    r->V = gguf_find_tensor(g, "token_embd.weight")->ne[1];
    if (r->L > 64) return false;
    gguf_arr pat, kv;
    if (gguf_get_arr(g, "gemma4.attention.sliding_window_pattern", &pat, &err) != HM_OK ||
        gguf_get_arr(g, "gemma4.attention.head_count_kv", &kv, &err) != HM_OK ||
        (int64_t)pat.n != r->L || (int64_t)kv.n != r->L)
        return false;
    for (int64_t il = 0; il < r->L; il++) {
        r->swa[il] = gguf_arr_int(&pat, (uint64_t)il) != 0;
        r->nkv[r->swa[il]] = gguf_arr_int(&kv, (uint64_t)il);
    }
    for (int k = 0; k < 2; k++)
        if (r->nkv[k] * r->hd[k] > r->kvw) r->kvw = r->nkv[k] * r->hd[k];
    r->n_ctx = n_ctx;
    r->kc = calloc((size_t)(r->L * n_ctx * r->kvw), sizeof(double));
    r->vc = calloc((size_t)(r->L * n_ctx * r->kvw), sizeof(double));
    return r->kc && r->vc;
}

static void gref_free(gref *r) {
    free(r->kc);
    free(r->vc);
}

/* y[n] = x[n] / sqrt(mean(x^2) + eps) * w (w NULL: none); in place allowed */
static void gref_rms(const gref *r, const double *x, const float *w, double *y, int64_t n) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / (double)n + r->eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * s * (w ? (double)w[i] : 1.0);
}

/* y[rows] = W x, W stored ggml-style {cols, rows}: row o at w + o * cols */
static void gref_mv(const float *w, const double *x, int64_t cols, int64_t rows, double *y) {
    for (int64_t o = 0; o < rows; o++) {
        double s = 0;
        for (int64_t i = 0; i < cols; i++) s += (double)w[o * cols + i] * x[i];
        y[o] = s;
    }
}

static double gref_gelu(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* NEOX rope of one head x[hd] at position p, kind k (full layers: rope_freqs' factors) */
static void gref_rope(const gref *r, int k, double *x, int p) {
    const int64_t nd = r->nrot[k], half = nd / 2;
    const float *ff = k == 0 ? gref_t(r, -1, "rope_freqs.weight") : NULL;
    for (int64_t i = 0; i < half; i++) {
        const double th = p * pow(r->base[k], -2.0 * (double)i / (double)nd) / (ff ? ff[i] : 1.0);
        const double c = cos(th), s = sin(th), a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = a * s + b * c;
    }
}

/* one token at position r->pos: its logits [V] */
static void gref_step(gref *r, int32_t tok, double *logits) {
    const int64_t E = r->E, p = r->pos;
    const int64_t mq = r->nh * (r->hd[0] > r->hd[1] ? r->hd[0] : r->hd[1]);
    const int64_t big = E > r->D ? E : r->D;
    double *x = calloc((size_t)E, sizeof(double)), *h = calloc((size_t)big, sizeof(double));
    double *q = calloc((size_t)mq, sizeof(double));
    double *o = calloc((size_t)(mq > E ? mq : E), sizeof(double));
    double *t1 = calloc((size_t)big, sizeof(double)), *t2 = calloc((size_t)big, sizeof(double));
    double *dense = calloc((size_t)E, sizeof(double)), *ex = calloc((size_t)E, sizeof(double));
    double *sc = calloc((size_t)(r->n_ctx + 1), sizeof(double));
    double *pr = calloc((size_t)r->X, sizeof(double));
    if (!x || !h || !q || !o || !t1 || !t2 || !dense || !ex || !sc || !pr) abort();
    const float *emb = gref_t(r, -1, "token_embd.weight");
    for (int64_t i = 0; i < E; i++) x[i] = (double)emb[tok * E + i] * sqrt((double)E);
    for (int il = 0; il < r->L; il++) {
        const int k = r->swa[il];
        const int64_t hd = r->hd[k], nkv = r->nkv[k], rep = r->nh / nkv;
        double *kr = r->kc + ((int64_t)il * r->n_ctx + p) * r->kvw;
        double *vr = r->vc + ((int64_t)il * r->n_ctx + p) * r->kvw;
        gref_rms(r, x, gref_t(r, il, "attn_norm.weight"), h, E);
        gref_mv(gref_t(r, il, "attn_q.weight"), h, E, r->nh * hd, q);
        gref_mv(gref_t(r, il, "attn_k.weight"), h, E, nkv * hd, kr);
        if (k) gref_mv(gref_t(r, il, "attn_v.weight"), h, E, nkv * hd, vr);
        else memcpy(vr, kr, sizeof(double) * (size_t)(nkv * hd));
        for (int64_t hh = 0; hh < r->nh; hh++) {
            gref_rms(r, q + hh * hd, gref_t(r, il, "attn_q_norm.weight"), q + hh * hd, hd);
            gref_rope(r, k, q + hh * hd, (int)p);
        }
        for (int64_t g = 0; g < nkv; g++) {
            gref_rms(r, kr + g * hd, gref_t(r, il, "attn_k_norm.weight"), kr + g * hd, hd);
            gref_rope(r, k, kr + g * hd, (int)p);
            gref_rms(r, vr + g * hd, NULL, vr + g * hd, hd);
        }
        const int64_t first = k && !r->window_off && p - r->W + 1 > 0 ? p - r->W + 1 : 0;
        for (int64_t hh = 0; hh < r->nh; hh++) {
            const int64_t g = hh / rep;
            double m = -INFINITY, den = 0;
            for (int64_t j = first; j <= p; j++) {
                const double *kj = r->kc + ((int64_t)il * r->n_ctx + j) * r->kvw + g * hd;
                double s = 0;
                for (int64_t i = 0; i < hd; i++) s += q[hh * hd + i] * kj[i];
                sc[j] = s;
                if (s > m) m = s;
            }
            for (int64_t j = first; j <= p; j++) den += (sc[j] = exp(sc[j] - m));
            for (int64_t i = 0; i < hd; i++) {
                double acc = 0;
                for (int64_t j = first; j <= p; j++)
                    acc += sc[j] * r->vc[((int64_t)il * r->n_ctx + j) * r->kvw + g * hd + i];
                o[hh * hd + i] = acc / den;
            }
        }
        gref_mv(gref_t(r, il, "attn_output.weight"), o, r->nh * hd, E, t1);
        gref_rms(r, t1, gref_t(r, il, "post_attention_norm.weight"), t1, E);
        for (int64_t i = 0; i < E; i++) x[i] += t1[i];
        /* dense MLP */
        gref_rms(r, x, gref_t(r, il, "ffn_norm.weight"), h, E);
        gref_mv(gref_t(r, il, "ffn_gate.weight"), h, E, r->D, t1);
        gref_mv(gref_t(r, il, "ffn_up.weight"), h, E, r->D, t2);
        for (int64_t i = 0; i < r->D; i++) t1[i] = gref_gelu(t1[i]) * t2[i];
        gref_mv(gref_t(r, il, "ffn_down.weight"), t1, r->D, E, dense);
        gref_rms(r, dense, gref_t(r, il, "post_ffw_norm_1.weight"), dense, E);
        /* router */
        gref_rms(r, x, NULL, h, E);
        const float *rsc = gref_t(r, il, "ffn_gate_inp.scale");
        for (int64_t i = 0; i < E; i++) h[i] = h[i] * rsc[i] / sqrt((double)E);
        gref_mv(gref_t(r, il, "ffn_gate_inp.weight"), h, E, r->X, pr);
        double m = -INFINITY, den = 0;
        for (int64_t e = 0; e < r->X; e++) m = pr[e] > m ? pr[e] : m;
        for (int64_t e = 0; e < r->X; e++) den += (pr[e] = exp(pr[e] - m));
        for (int64_t e = 0; e < r->X; e++) pr[e] /= den;
        int64_t sel[64];
        double wsum = 0;
        bool used[256] = {false};
        for (int64_t s = 0; s < r->K; s++) {
            int64_t b = -1;
            for (int64_t e = 0; e < r->X; e++)
                if (!used[e] && (b < 0 || pr[e] > pr[b])) b = e;
            used[b] = true;
            sel[s] = b;
            wsum += pr[b];
        }
        /* experts */
        gref_rms(r, x, gref_t(r, il, "pre_ffw_norm_2.weight"), h, E);
        memset(ex, 0, sizeof(double) * (size_t)E);
        const float *es = gref_t(r, il, "ffn_down_exps.scale");
        for (int64_t s = 0; s < r->K; s++) {
            const int64_t e = sel[s];
            const double w = pr[e] / wsum * es[e];
            gref_mv(gref_t(r, il, "ffn_gate_exps.weight") + e * r->F * E, h, E, r->F, t1);
            gref_mv(gref_t(r, il, "ffn_up_exps.weight") + e * r->F * E, h, E, r->F, t2);
            for (int64_t i = 0; i < r->F; i++) t1[i] = gref_gelu(t1[i]) * t2[i];
            gref_mv(gref_t(r, il, "ffn_down_exps.weight") + e * E * r->F, t1, r->F, E, o);
            for (int64_t i = 0; i < E; i++) ex[i] += w * o[i];
        }
        gref_rms(r, ex, gref_t(r, il, "post_ffw_norm_2.weight"), ex, E);
        for (int64_t i = 0; i < E; i++) dense[i] += ex[i];
        gref_rms(r, dense, gref_t(r, il, "post_ffw_norm.weight"), dense, E);
        const double ls = gref_t(r, il, "layer_output_scale.weight")[0];
        for (int64_t i = 0; i < E; i++) x[i] = (x[i] + dense[i]) * ls;
    }
    gref_rms(r, x, gref_t(r, -1, "output_norm.weight"), h, E);
    gref_mv(emb, h, E, r->V, logits);
    for (int64_t i = 0; i < r->V && r->cap > 0; i++) logits[i] = r->cap * tanh(logits[i] / r->cap);
    r->pos++;
    free(x), free(h), free(q), free(o), free(t1), free(t2), free(dense), free(ex), free(sc);
    free(pr);
}

#endif
