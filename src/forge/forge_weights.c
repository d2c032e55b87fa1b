/* forge_weights.c - the values of every forged tensor.
 *
 * DESIGN: counter-based randomness. Element i of tensor T is a pure function of
 * (seed, FNV-1a(T's name), i) through splitmix64, so any row can be produced by any thread in
 * any order and the file's bytes never depend on threads or chunk sizes. A near-Gaussian value
 * is the Irwin-Hall sum of the four 16-bit fields of one 64-bit draw (no libm, bit-exact
 * everywhere). Linear weights get std 1/sqrt(fan_in) so activations stay O(1); norms are 1 +/- 0.1.
 * Tiny presets get the decisive structure described at FORGE_TINY_* (forge.h): embeddings of std
 * 4 and output rows that add a copy of one token's embedding (still a pure function per element).
 *
 * Expert skew (--skew zipf:S): in each layer the experts get a popularity rank (a permutation
 * drawn from the seed and the layer); router row e is scaled by (rank+1)^(-S/2) and, where the
 * arch has a router bias (gpt-oss), the bias is shifted by -S/2 * ln(rank+1). Larger logit spread
 * and bias make top-k pick the low ranks more often; docs/FORGE.md gives the measured effect.
 *
 * Direct mode (big presets): quantised tensors are generated as random blocks — uniform random
 * quants with scales chosen so the values have the tensor's std and zero mean — instead of
 * quantising floats; orders of magnitude faster, same file layout.
 */
#include <math.h>
#include <string.h>

#include "forge/forge.h"
#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/quant.h"

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t draw(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * 0x9e3779b97f4a7c15ULL); }

/* Irwin-Hall(4) of 16-bit uniforms, standardised: mean 0, variance 1, range +/-3.46 */
static inline float gauss(uint64_t key, uint64_t i) {
    uint64_t r = draw(key, i);
    uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) +
                 (uint32_t)((r >> 32) & 0xffff) + (uint32_t)(r >> 48);
    return ((float)s - 131070.0f) * (1.0f / 37837.22f);
}

uint64_t forge_tensor_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = (h ^ *c) * 0x100000001b3ULL;
    return mix64(h ^ mix64(seed + 0x5851f42d4c957f2dULL));
}

/* rank of expert e in layer l: position of e in a seed-and-layer-keyed permutation */
static int64_t expert_rank(uint64_t seed, int layer, int64_t n_expert, int64_t e) {
    int64_t perm[1024];
    if (n_expert > 1024) return e;
    for (int64_t i = 0; i < n_expert; i++) perm[i] = i;
    uint64_t key = mix64(seed ^ (0x7f4a7c159e3779b9ULL * (uint64_t)(layer + 1)));
    for (int64_t i = n_expert - 1; i > 0; i--) {
        int64_t j = (int64_t)(draw(key, (uint64_t)i) % (uint64_t)(i + 1));
        int64_t tmp = perm[i]; perm[i] = perm[j]; perm[j] = tmp;
    }
    for (int64_t r = 0; r < n_expert; r++)
        if (perm[r] == e) return r;
    return e;
}

float forge_router_scale(const forge_gen *g, const forge_preset *p, int layer, int64_t e) {
    if (g->skew_s <= 0) return 1.0f;
    int64_t r = expert_rank(g->seed, layer, p->n_expert, e);
    return (float)pow((double)(r + 1), -0.5 * g->skew_s);
}

static float router_bias_shift(const forge_gen *g, const forge_preset *p, int layer, int64_t e) {
    if (g->skew_s <= 0) return 0.0f;
    int64_t r = expert_rank(g->seed, layer, p->n_expert, e);
    return (float)(-0.5 * g->skew_s * log((double)(r + 1)));
}

/* the token whose embedding output row j copies: a fixed odd-multiplier permutation of
 * [0, n_vocab) when n_vocab is a power of two (otherwise a many-to-one map, still fixed) */
static int64_t tiny_successor_src(int64_t j, int64_t n_vocab) {
    return (int64_t)(((uint64_t)j * 0x2545u + 0x3c1u) % (uint64_t)n_vocab);
}

void forge_gen_floats(const forge_gen *g, const forge_preset *p, const forge_tensor *t,
                      int64_t first, int64_t n, float *dst) {
    const uint64_t key = forge_tensor_key(g->seed, t->name);
    for (int64_t i = 0; i < n; i++) dst[i] = t->mean + t->std * gauss(key, (uint64_t)(first + i));
    if (t->role == FR_ROPE_FREQS) /* convert_hf_to_gguf's Gemma4Model: 1 on the rotated pairs,
                                     1e30 (theta / 1e30: no rotation) on the others */
        for (int64_t i = 0; i < n; i++) dst[i] = first + i < forge_preset_n_rot(p) / 2 ? 1.0f : 1e30f;
    if (t->role == FR_SSM_A) /* a value a converter writes: -exp of an f32 A_log, so the HF
                                twin's A_log = ln(-a) converts back to these bytes */
        for (int64_t i = 0; i < n; i++) dst[i] = (float)-exp((double)(float)log(-(double)dst[i]));
    if (t->role == FR_OUTPUT && p->tiny) {
        /* tiny presets: output row j also holds FORGE_TINY_SUCC / n_embd x the unit-std
         * embedding values of token src(j), so while the current token is src(j) (hidden state
         * ~ its embedding, rms ~1) token j's logit gains ~FORGE_TINY_SUCC */
        const uint64_t ekey = forge_tensor_key(g->seed, "token_embd.weight");
        const int64_t E = t->ne[0];
        const float amp = t->std * FORGE_TINY_SUCC / (float)sqrt((double)E);
        for (int64_t i = 0; i < n; i++) {
            int64_t j = (first + i) / E, c = (first + i) % E;
            uint64_t src = (uint64_t)tiny_successor_src(j, p->n_vocab);
            dst[i] += amp * gauss(ekey, src * (uint64_t)E + (uint64_t)c);
        }
    }
    if (t->role == FR_ROUTER && g->skew_s > 0) {
        for (int64_t i = 0; i < n;) {
            int64_t e = (first + i) / t->ne[0], end = (e + 1) * t->ne[0] - first;
            if (end > n) end = n;
            float s = forge_router_scale(g, p, t->layer, e);
            for (; i < end; i++) dst[i] *= s;
        }
    } else if (t->role == FR_ROUTER_BIAS && g->skew_s > 0) {
        for (int64_t i = 0; i < n; i++) dst[i] += router_bias_shift(g, p, t->layer, first + i);
    }
}

/* ---- direct blocks ---- */

typedef struct {
    uint64_t key, ctr;
    uint64_t buf;
    int left;
} byte_stream;

static inline uint8_t next_byte(byte_stream *s) {
    if (!s->left) { s->buf = draw(s->key, s->ctr++); s->left = 8; }
    uint8_t b = (uint8_t)s->buf;
    s->buf >>= 8;
    s->left--;
    return b;
}

static void fill_bytes(byte_stream *s, uint8_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = next_byte(s);
}

/* packs 8 six-bit scales and mins as ggml's get_scale_min_k4 reads them */
static void pack_scale_min_k4(uint8_t q[12], const uint8_t sc[8], const uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

/* One row of random blocks; returns false for types without a direct generator. The rms of
 * a uniform integer on [0, 2^b) around its mean is sqrt((4^b - 1) / 12). */
static bool direct_row(uint32_t type, float std, uint64_t key, int64_t row, int64_t n, void *dst) {
    byte_stream s = {.key = key ^ 0xd1b54a32d192ed03ULL, .ctr = (uint64_t)row * (uint64_t)(n / 8 + 64)};
    const int64_t nb32 = n / 32, nbk = n / HM_QK_K;
    switch (type) {
    case HM_TYPE_Q8_0: {
        block_q8_0 *b = dst;
        hm_fp16 d = hm_f32_to_fp16(std / 73.9f);
        for (int64_t i = 0; i < nb32; i++) {
            b[i].d = d;
            for (int j = 0; j < 32; j++) {
                int8_t q = (int8_t)next_byte(&s);
                b[i].qs[j] = q == -128 ? -127 : q;
            }
        }
        return true;
    }
    case HM_TYPE_Q4_0: {
        block_q4_0 *b = dst;
        hm_fp16 d = hm_f32_to_fp16(std / 4.61f);
        for (int64_t i = 0; i < nb32; i++) { b[i].d = d; fill_bytes(&s, b[i].qs, 16); }
        return true;
    }
    case HM_TYPE_Q5_0: {
        block_q5_0 *b = dst;
        hm_fp16 d = hm_f32_to_fp16(std / 9.23f);
        for (int64_t i = 0; i < nb32; i++) {
            b[i].d = d;
            fill_bytes(&s, b[i].qh, 4);
            fill_bytes(&s, b[i].qs, 16);
        }
        return true;
    }
    case HM_TYPE_Q5_1: {
        block_q5_1 *b = dst;
        float d = std / 9.23f;
        hm_fp16 dh = hm_f32_to_fp16(d), mh = hm_f32_to_fp16(-15.5f * hm_fp16_to_f32(dh));
        for (int64_t i = 0; i < nb32; i++) {
            b[i].d = dh;
            b[i].m = mh;
            fill_bytes(&s, b[i].qh, 4);
            fill_bytes(&s, b[i].qs, 16);
        }
        return true;
    }
    case HM_TYPE_MXFP4: {
        /* power-of-two scales: blocks use 2^lo or 2^(lo+1), mixed so the variance is std^2 */
        block_mxfp4 *b = dst;
        double lo = floor(log2(std / 5.85)), vlo = pow(2.0, 2 * lo) * 5.85 * 5.85;
        double p_hi = ((double)std * std - vlo) / (3.0 * vlo);
        int e = 128 + (int)lo;
        if (e < 1) e = 1;
        if (e > 253) e = 253;
        for (int64_t i = 0; i < nb32; i++) {
            b[i].e = (uint8_t)(e + ((double)next_byte(&s) + 0.5 < p_hi * 256.0));
            fill_bytes(&s, b[i].qs, 16);
        }
        return true;
    }
    case HM_TYPE_Q4_K:
    case HM_TYPE_Q5_K: {
        const bool five = type == HM_TYPE_Q5_K;
        const float qrms = five ? 9.23f : 4.61f, qmean = five ? 15.5f : 7.5f;
        uint8_t sc[8], m[8], packed[12];
        for (int j = 0; j < 8; j++) sc[j] = m[j] = 63;
        pack_scale_min_k4(packed, sc, m);
        float d = std / (63.0f * qrms);
        hm_fp16 dh = hm_f32_to_fp16(d), mh = hm_f32_to_fp16(qmean * hm_fp16_to_f32(dh));
        for (int64_t i = 0; i < nbk; i++) {
            if (five) {
                block_q5_K *b = (block_q5_K *)dst + i;
                b->d = dh; b->dmin = mh;
                memcpy(b->scales, packed, 12);
                fill_bytes(&s, b->qh, 32);
                fill_bytes(&s, b->qs, 128);
            } else {
                block_q4_K *b = (block_q4_K *)dst + i;
                b->d = dh; b->dmin = mh;
                memcpy(b->scales, packed, 12);
                fill_bytes(&s, b->qs, 128);
            }
        }
        return true;
    }
    case HM_TYPE_Q6_K: {
        block_q6_K *b = dst;
        hm_fp16 d = hm_f32_to_fp16(std / (64.0f * 18.47f));
        for (int64_t i = 0; i < nbk; i++) {
            fill_bytes(&s, b[i].ql, 128);
            fill_bytes(&s, b[i].qh, 64);
            for (int j = 0; j < 16; j++) b[i].scales[j] = 64;
            b[i].d = d;
        }
        return true;
    }
    default: return false;
    }
}

hm_status forge_gen_rows(const forge_gen *g, const forge_preset *p, const forge_tensor *t,
                         int64_t r0, int64_t nr, void *dst, float *scratch) {
    const int64_t n = t->ne[0];
    const size_t rs = hm_row_size(t->type, n);
    if (!rs) return HM_ERR_ARG;
    uint64_t key = 0;
    if (g->direct && t->type != HM_TYPE_F32 && t->type != HM_TYPE_F16) key = forge_tensor_key(g->seed, t->name);
    for (int64_t r = r0; r < r0 + nr; r++) {
        uint8_t *out = (uint8_t *)dst + (size_t)(r - r0) * rs;
        if (key && direct_row(t->type, t->std, key, r, n, out)) continue;
        forge_gen_floats(g, p, t, r * n, n, scratch);
        hm_status st = forge_encode_row(t->type, scratch, out, n);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}
