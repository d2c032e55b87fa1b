/* qwen3next_ref.h - a straightforward double-precision Qwen3-Next / Qwen3.5-MoE forward pass
 * over an f32 GGUF (its tensors and keys read by name from the file), written from the models'
 * definitions (llama.cpp's qwen3next / qwen35moe graphs and converter, transformers'
 * modeling_qwen3_next.py / modeling_qwen3_5_moe.py; docs/HYBRID.md), not from the engine's code:
 * the check of tests/cpu_engine/test_qwen3next.c and test_qwen35moe.c.
 *
 * qwen35moe: b and a from ssm_beta / ssm_alpha per value head, value head h reading key head
 * h % k heads (the converter's tiled order; qwen3next: h / (v heads / k heads), b and a from
 * ssm_ba's per-key-head groups); its rope is ggml's interleaved multi-section rope written out
 * (pair i takes the position of its section, sections interleaved t, h, w; a text token is at
 * (p, p, p, 0)); the nextn_predict_layers blocks after the decoder layers are not run.
 *
 * Per token, in order: x = embedding; per layer xn = rmsnorm(x) * attn_norm (the GGUF holds the
 * zero-centred norms' 1 + w); a gated delta-net layer or a gated full-attention layer; x += out;
 * xn = rmsnorm(x) * post_attention_norm; softmax router, top-k (lowest id on ties), weights
 * renormalised; x += sum_k w_k expert_k(xn) + sigmoid(shexp_gate . xn) shared(xn); logits =
 * output . (rmsnorm(x) * output_norm). Everything in double; exp/log from libm.
 */
#ifndef HM_TESTS_QWEN3NEXT_REF_H
#define HM_TESTS_QWEN3NEXT_REF_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

typedef struct {
    const gguf_ctx *g;
    char arch[32];
    bool q35;        /* qwen35moe */
    bool tiled;      /* value head h reads key head h % k heads (qwen35moe; a test may clear it) */
    int64_t sec[4];  /* qwen35moe: rope.dimension_sections */
    int64_t E, V, L, nh, nkv, hd, nrot, X, K, F, S;
    int64_t conv_k, nk, nv, dk, dv, kd, vd, cd;
    double eps, theta;
    double *conv, *ssm; /* [L][conv_k-1][cd], [L][nv][dk][dv] */
    double *kc, *vc;    /* [L][n_ctx][nkv][hd] */
    int n_ctx;
    int pos;
} qref;

static const float *qref_t(const qref *r, int il, const char *suffix) {
    char name[96];
    if (il >= 0) snprintf(name, sizeof(name), "blk.%d.%s", il, suffix);
    else snprintf(name, sizeof(name), "%s", suffix);
    const gguf_tensor *t = gguf_find_tensor(r->g, name);
    if (!t || t->type != 0 /* f32 */) {
        fprintf(stderr, "qref: tensor %s missing or not f32\n", name);
        abort();
    }
    return (const float *)t->data;
}

/* the integer key ARCH.suffix (def when absent and def >= 0) */
static int64_t qref_u(const qref *r, const char *suffix, int64_t def) {
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", r->arch, suffix);
    int64_t i = gguf_find_key(r->g, key), v = 0;
    hm_error err;
    if (i < 0 && def >= 0) return def;
    if (i < 0 || gguf_kv_int(r->g, i, &v, &err) != HM_OK) {
        fprintf(stderr, "qref: key %s\n", key);
        abort();
    }
    return v;
}

static double qref_f(const qref *r, const char *suffix) {
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", r->arch, suffix);
    double d = 0;
    hm_error err;
    if (gguf_kv_float(r->g, gguf_find_key(r->g, key), &d, &err) != HM_OK) abort();
    return d;
}

static bool qref_init(qref *r, const gguf_ctx *g, int n_ctx) {
    memset(r, 0, sizeof(*r));
    r->g = g;
    gguf_str a;
    hm_error err;
    if (gguf_get_str(g, "general.architecture", &a, &err) != HM_OK || a.len >= sizeof(r->arch))
        return false;
    memcpy(r->arch, a.data, (size_t)a.len);
    r->q35 = r->tiled = !strcmp(r->arch, "qwen35moe");
    r->E = qref_u(r, "embedding_length", -1);
    r->L = qref_u(r, "block_count", -1) - qref_u(r, "nextn_predict_layers", 0);
    r->nh = qref_u(r, "attention.head_count", -1);
    r->nkv = qref_u(r, "attention.head_count_kv", -1);
    r->hd = qref_u(r, "attention.key_length", -1);
    r->nrot = qref_u(r, "rope.dimension_count", -1);
    r->X = qref_u(r, "expert_count", -1);
    r->K = qref_u(r, "expert_used_count", -1);
    r->F = qref_u(r, "expert_feed_forward_length", -1);
    r->S = qref_u(r, "expert_shared_feed_forward_length", -1);
    r->conv_k = qref_u(r, "ssm.conv_kernel", -1);
    r->dk = qref_u(r, "ssm.state_size", -1);
    r->nk = qref_u(r, "ssm.group_count", -1);
    r->nv = qref_u(r, "ssm.time_step_rank", -1);
    r->vd = qref_u(r, "ssm.inner_size", -1);
    r->dv = r->vd / r->nv;
    r->kd = r->nk * r->dk;
    r->cd = 2 * r->kd + r->vd;
    r->V = gguf_find_tensor(g, "token_embd.weight")->ne[1];
    r->eps = qref_f(r, "attention.layer_norm_rms_epsilon");
    r->theta = qref_f(r, "rope.freq_base");
    if (r->q35) {
        char key[96];
        gguf_arr arr;
        snprintf(key, sizeof(key), "%s.rope.dimension_sections", r->arch);
        if (gguf_get_arr(g, key, &arr, &err) != HM_OK || arr.n > 4) return false;
        for (uint64_t i = 0; i < arr.n; i++) r->sec[i] = gguf_arr_int(&arr, i);
    }
    r->n_ctx = n_ctx;
    r->conv = calloc((size_t)(r->L * (r->conv_k - 1) * r->cd), sizeof(double));
    r->ssm = calloc((size_t)(r->L * r->nv * r->dk * r->dv), sizeof(double));
    r->kc = calloc((size_t)(r->L * n_ctx * r->nkv * r->hd), sizeof(double));
    r->vc = calloc((size_t)(r->L * n_ctx * r->nkv * r->hd), sizeof(double));
    return r->conv && r->ssm && r->kc && r->vc;
}

static void qref_free(qref *r) {
    free(r->conv);
    free(r->ssm);
    free(r->kc);
    free(r->vc);
}

/* y[o] = sum_i W[o][i] x[i]; W row-major [n_out][n_in] (ggml ne {n_in, n_out}) */
static void qref_mv(const float *W, const double *x, int64_t n_in, int64_t n_out, double *y) {
    for (int64_t o = 0; o < n_out; o++) {
        double s = 0;
        for (int64_t i = 0; i < n_in; i++) s += (double)W[o * n_in + i] * x[i];
        y[o] = s;
    }
}

static void qref_rms(const double *x, const float *w, int64_t n, double eps, double *y) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * s * (w ? (double)w[i] : 1.0);
}

static double qref_sig(double x) { return 1.0 / (1.0 + exp(-x)); }
static double qref_silu(double x) { return x * qref_sig(x); }

/* One gated delta-net layer on xn [E] into out [E]. */
static void qref_linear(qref *r, int il, const double *xn, double *out) {
    const int64_t K = r->conv_k, cd = r->cd, dk = r->dk, dv = r->dv, rr = r->nv / r->nk;
    double *qkv = malloc(sizeof(double) * (size_t)(cd + r->vd + 2 * r->nv + cd + r->vd));
    double *z = qkv + cd, *ba = z + r->vd, *y = ba + 2 * r->nv, *o = y + cd;
    qref_mv(qref_t(r, il, "attn_qkv.weight"), xn, r->E, cd, qkv);
    qref_mv(qref_t(r, il, "attn_gate.weight"), xn, r->E, r->vd, z);
    if (r->q35) { /* ba: b [nv] then a [nv] */
        qref_mv(qref_t(r, il, "ssm_beta.weight"), xn, r->E, r->nv, ba);
        qref_mv(qref_t(r, il, "ssm_alpha.weight"), xn, r->E, r->nv, ba + r->nv);
    } else {
        qref_mv(qref_t(r, il, "ssm_ba.weight"), xn, r->E, 2 * r->nv, ba);
    }
    const float *w = qref_t(r, il, "ssm_conv1d.weight"); /* [cd][K] */
    double *st = r->conv + il * (K - 1) * cd;           /* [K-1][cd], oldest first */
    for (int64_t c = 0; c < cd; c++) {
        double s = (double)w[c * K + K - 1] * qkv[c];
        for (int64_t j = 0; j < K - 1; j++) s += (double)w[c * K + j] * st[j * cd + c];
        y[c] = qref_silu(s);
    }
    for (int64_t j = 0; j + 1 < K - 1; j++) memcpy(st + j * cd, st + (j + 1) * cd, sizeof(double) * (size_t)cd);
    if (K > 1) memcpy(st + (K - 2) * cd, qkv, sizeof(double) * (size_t)cd);
    for (int64_t h = 0; h < 2 * r->nk; h++) { /* L2 norms of the q and k heads (llama.cpp's eps) */
        double ss = 0, *v = y + h * dk;
        for (int64_t i = 0; i < dk; i++) ss += v[i] * v[i];
        const double n = sqrt(ss) > r->eps ? sqrt(ss) : r->eps;
        for (int64_t i = 0; i < dk; i++) v[i] = v[i] / n * (h < r->nk ? 1.0 / sqrt((double)dk) : 1.0);
    }
    const float *dt = qref_t(r, il, "ssm_dt.bias"), *A = qref_t(r, il, "ssm_a");
    for (int64_t h = 0; h < r->nv; h++) {
        const int64_t g = r->tiled ? h % r->nk : h / rr, j = h % rr;
        const double b = r->q35 ? ba[h] : ba[g * 2 * rr + j];
        const double a = r->q35 ? ba[r->nv + h] : ba[g * 2 * rr + rr + j];
        const double beta = qref_sig(b), ap = a + (double)dt[h];
        const double gl = (ap > 20 ? ap : log1p(exp(ap))) * (double)A[h];
        const double *q = y + g * dk, *k = y + r->kd + g * dk, *v = y + 2 * r->kd + h * dv;
        double *S = r->ssm + (il * r->nv + h) * dk * dv; /* [dk][dv] */
        for (int64_t i = 0; i < dk * dv; i++) S[i] *= exp(gl);
        for (int64_t c = 0; c < dv; c++) {
            double kv = 0;
            for (int64_t i = 0; i < dk; i++) kv += S[i * dv + c] * k[i];
            const double d = (v[c] - kv) * beta;
            for (int64_t i = 0; i < dk; i++) S[i * dv + c] += k[i] * d;
        }
        for (int64_t c = 0; c < dv; c++) {
            double s = 0;
            for (int64_t i = 0; i < dk; i++) s += S[i * dv + c] * q[i];
            o[h * dv + c] = s;
        }
        qref_rms(o + h * dv, qref_t(r, il, "ssm_norm.weight"), dv, r->eps, o + h * dv);
        for (int64_t c = 0; c < dv; c++) o[h * dv + c] *= qref_silu(z[h * dv + c]);
    }
    qref_mv(qref_t(r, il, "ssm_out.weight"), o, r->vd, r->E, out);
    free(qkv);
}

/* The position pair i of a qwen35moe head rotates by: ggml's interleaved multi-section rope
 * (sector s = i mod the sections' sum takes height when s % 3 == 1 and s < 3 sec[1], width when
 * s % 3 == 2 and s < 3 sec[2], time when s % 3 == 0 and s < 3 sec[0], else the 4th component),
 * a text token's components being (p, p, p, 0). */
static double qref_mrope_pos(const qref *r, int64_t i, int p) {
    const int64_t tot = r->sec[0] + r->sec[1] + r->sec[2] + r->sec[3], s = i % tot;
    const int comp = s % 3 == 1 && s < 3 * r->sec[1]   ? 1
                     : s % 3 == 2 && s < 3 * r->sec[2] ? 2
                     : s % 3 == 0 && s < 3 * r->sec[0] ? 0
                                                       : 3;
    const int pos[4] = {p, p, p, 0};
    return pos[comp];
}

/* NEOX rope of the first nrot dims of one head at position p (qwen35moe: per pair, its
 * section's position). */
static void qref_rope(const qref *r, double *v, int p) {
    const int64_t half = r->nrot / 2;
    for (int64_t i = 0; i < half; i++) {
        const double pp = r->q35 ? qref_mrope_pos(r, i, p) : p;
        const double th = pp * pow(r->theta, -2.0 * (double)i / (double)r->nrot);
        const double a = v[i], b = v[i + half];
        v[i] = a * cos(th) - b * sin(th);
        v[i + half] = a * sin(th) + b * cos(th);
    }
}

/* One gated full-attention layer on xn [E] at position r->pos into out [E]. */
static void qref_attn(qref *r, int il, const double *xn, double *out) {
    const int64_t hd = r->hd, nh = r->nh, nkv = r->nkv, p = r->pos;
    double *qg = malloc(sizeof(double) * (size_t)(2 * nh * hd + 2 * nkv * hd + nh * hd + r->n_ctx));
    double *k = qg + 2 * nh * hd, *v = k + nkv * hd, *att = v + nkv * hd, *sc = att + nh * hd;
    qref_mv(qref_t(r, il, "attn_q.weight"), xn, r->E, 2 * nh * hd, qg);
    qref_mv(qref_t(r, il, "attn_k.weight"), xn, r->E, nkv * hd, k);
    qref_mv(qref_t(r, il, "attn_v.weight"), xn, r->E, nkv * hd, v);
    for (int64_t g = 0; g < nkv; g++) {
        qref_rms(k + g * hd, qref_t(r, il, "attn_k_norm.weight"), hd, r->eps, k + g * hd);
        qref_rope(r, k + g * hd, (int)p);
    }
    double *kc = r->kc + ((int64_t)il * r->n_ctx + p) * nkv * hd, *vc = r->vc + ((int64_t)il * r->n_ctx + p) * nkv * hd;
    memcpy(kc, k, sizeof(double) * (size_t)(nkv * hd));
    memcpy(vc, v, sizeof(double) * (size_t)(nkv * hd));
    for (int64_t h = 0; h < nh; h++) {
        double *q = qg + h * 2 * hd, *gate = q + hd;
        qref_rms(q, qref_t(r, il, "attn_q_norm.weight"), hd, r->eps, q);
        qref_rope(r, q, (int)p);
        const int64_t g = h / (nh / nkv);
        double mx = -INFINITY, den = 0;
        for (int64_t t = 0; t <= p; t++) {
            const double *kt = r->kc + ((int64_t)il * r->n_ctx + t) * nkv * hd + g * hd;
            double s = 0;
            for (int64_t i = 0; i < hd; i++) s += q[i] * kt[i];
            sc[t] = s / sqrt((double)hd);
            if (sc[t] > mx) mx = sc[t];
        }
        for (int64_t t = 0; t <= p; t++) den += (sc[t] = exp(sc[t] - mx));
        for (int64_t i = 0; i < hd; i++) {
            double s = 0;
            for (int64_t t = 0; t <= p; t++)
                s += sc[t] * r->vc[((int64_t)il * r->n_ctx + t) * nkv * hd + g * hd + i];
            att[h * hd + i] = s / den * qref_sig(gate[i]);
        }
    }
    qref_mv(qref_t(r, il, "attn_output.weight"), att, nh * hd, r->E, out);
    free(qg);
}

/* The MoE block on xn [E] into out [E]. */
static void qref_moe(const qref *r, int il, const double *xn, double *out) {
    const int64_t E = r->E, X = r->X, F = r->F, S = r->S;
    double *lg = malloc(sizeof(double) * (size_t)(X + 3 * (F > S ? F : S) + E));
    double *a = lg + X, *b = a + (F > S ? F : S), *hbuf = b + (F > S ? F : S), *y = hbuf + (F > S ? F : S);
    qref_mv(qref_t(r, il, "ffn_gate_inp.weight"), xn, E, X, lg);
    double mx = -INFINITY, den = 0;
    for (int64_t e = 0; e < X; e++) mx = lg[e] > mx ? lg[e] : mx;
    for (int64_t e = 0; e < X; e++) den += (lg[e] = exp(lg[e] - mx));
    for (int64_t e = 0; e < X; e++) lg[e] /= den;
    int64_t ids[64];
    double wsum = 0;
    bool used[1024] = {false};
    for (int64_t k = 0; k < r->K; k++) {
        int64_t best = -1;
        for (int64_t e = 0; e < X; e++)
            if (!used[e] && (best < 0 || lg[e] > lg[best])) best = e;
        used[best] = true;
        ids[k] = best;
        wsum += lg[best];
    }
    memset(out, 0, sizeof(double) * (size_t)E);
    const float *G = qref_t(r, il, "ffn_gate_exps.weight"), *U = qref_t(r, il, "ffn_up_exps.weight");
    const float *D = qref_t(r, il, "ffn_down_exps.weight");
    for (int64_t k = 0; k < r->K; k++) {
        const int64_t e = ids[k];
        qref_mv(G + e * F * E, xn, E, F, a);
        qref_mv(U + e * F * E, xn, E, F, b);
        for (int64_t f = 0; f < F; f++) hbuf[f] = qref_silu(a[f]) * b[f];
        qref_mv(D + e * E * F, hbuf, F, E, y);
        for (int64_t c = 0; c < E; c++) out[c] += lg[e] / wsum * y[c];
    }
    qref_mv(qref_t(r, il, "ffn_gate_shexp.weight"), xn, E, S, a);
    qref_mv(qref_t(r, il, "ffn_up_shexp.weight"), xn, E, S, b);
    for (int64_t f = 0; f < S; f++) hbuf[f] = qref_silu(a[f]) * b[f];
    qref_mv(qref_t(r, il, "ffn_down_shexp.weight"), hbuf, S, E, y);
    double sg = 0;
    qref_mv(qref_t(r, il, "ffn_gate_inp_shexp.weight"), xn, E, 1, &sg);
    for (int64_t c = 0; c < E; c++) out[c] += qref_sig(sg) * y[c];
    free(lg);
}

/* The next token (position r->pos) into logits [V]. */
static void qref_step(qref *r, int32_t tok, double *logits) {
    const int64_t E = r->E;
    double *x = malloc(sizeof(double) * (size_t)(3 * E));
    double *xn = x + E, *o = xn + E;
    const float *emb = qref_t(r, -1, "token_embd.weight");
    for (int64_t c = 0; c < E; c++) x[c] = emb[(int64_t)tok * E + c];
    for (int il = 0; il < r->L; il++) {
        qref_rms(x, qref_t(r, il, "attn_norm.weight"), E, r->eps, xn);
        if ((il + 1) % 4 != 0) qref_linear(r, il, xn, o);
        else qref_attn(r, il, xn, o);
        for (int64_t c = 0; c < E; c++) x[c] += o[c];
        qref_rms(x, qref_t(r, il, "post_attention_norm.weight"), E, r->eps, xn);
        qref_moe(r, il, xn, o);
        for (int64_t c = 0; c < E; c++) x[c] += o[c];
    }
    qref_rms(x, qref_t(r, -1, "output_norm.weight"), E, r->eps, xn);
    qref_mv(qref_t(r, -1, "output.weight"), xn, E, r->V, logits);
    r->pos++;
    free(x);
}

#endif
