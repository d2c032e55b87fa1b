/* bench_ops.c - timings of the forward pass's non-matmul operators at real model shapes:
 * attention (decode at several context lengths, a 512-token prompt batch), RoPE, RMS norm,
 * router. Usage: bench_ops [threads]. Prints one line per case (best of 5 runs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/threadpool.h"
#include "cpu/ops.h"
#include "quant/qtypes.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *rnd(int64_t n) {
    float *v = malloc((size_t)n * sizeof(float));
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        v[i] = (float)((s >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
    }
    return v;
}

typedef struct { const char *name; int n_head, n_kv, hd; int64_t window; int sinks; } shape;

static void bench_attn(tp_pool *pool, const shape *sh, uint32_t type, int64_t ctx, int64_t n_tok) {
    cpu_kv_layer kv;
    int64_t slots = sh->window > 0 ? cpu_kv_slots_needed(sh->window, 512) : ctx + n_tok;
    if (cpu_kv_init(&kv, type, type, sh->n_kv, sh->hd, slots, NULL) != HM_OK) return;
    int64_t fill = ctx, chunk = 512;
    float *kvd = rnd(chunk * sh->n_kv * sh->hd);
    for (int64_t p = 0; p < fill; p += chunk) {
        int64_t nb = fill - p < chunk ? fill - p : chunk;
        cpu_kv_store(pool, &kv, p, nb, kvd, kvd, NULL);
    }
    float *q = rnd(n_tok * sh->n_head * sh->hd), *out = malloc((size_t)(n_tok * sh->n_head * sh->hd) * 4);
    float *sinks = rnd(sh->n_head);
    cpu_attn_args a = {.n_head = sh->n_head, .n_tok = n_tok, .pos0 = ctx, .window = sh->window,
                       .sinks = sh->sinks ? sinks : NULL, .q = q, .k_new = kvd, .v_new = kvd, .out = out};
    size_t ss = cpu_attention_scratch_size(&kv, &a, pool ? tp_size(pool) : 1);
    void *scr = malloc(ss);
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        hm_error err;
        if (cpu_attention(pool, &kv, &a, scr, ss, &err) != HM_OK) { printf("error: %s\n", err.msg); break; }
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("attention %-10s %-4s ctx %5lld n_tok %3lld: %8.3f ms/layer\n", sh->name, hm_type_name(type),
           (long long)ctx, (long long)n_tok, best * 1e3);
    free(scr); free(q); free(out); free(sinks); free(kvd);
    cpu_kv_free(&kv);
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    tp_pool *pool = NULL;
    if (tp_init(nth, &pool, NULL) != HM_OK) return 1;
    printf("threads %d\n", nth);
    shape qwen = {"qwen3-30b", 32, 4, 128, 0, 0}, oss = {"gpt-oss", 64, 8, 64, 0, 1},
          oss_swa = {"gpt-oss-swa", 64, 8, 64, 128, 1};
    uint32_t types[2] = {HM_TYPE_F16, HM_TYPE_Q8_0};
    for (int ti = 0; ti < 2; ti++) {
        bench_attn(pool, &qwen, types[ti], 512, 1);
        bench_attn(pool, &qwen, types[ti], 4096, 1);
        bench_attn(pool, &oss, types[ti], 4096, 1);
        bench_attn(pool, &oss_swa, types[ti], 4096, 1);
        bench_attn(pool, &qwen, types[ti], 0, 512);
        bench_attn(pool, &oss, types[ti], 0, 512);
        bench_attn(pool, &oss_swa, types[ti], 0, 512);
    }
    /* rope + norm at pp512 and decode */
    int64_t nt[2] = {1, 512};
    for (int i = 0; i < 2; i++) {
        float *x = rnd(nt[i] * 32 * 128), *w = rnd(4096);
        int32_t *pos = malloc((size_t)nt[i] * 4);
        for (int64_t t = 0; t < nt[i]; t++) pos[t] = (int32_t)(1000 + t);
        cpu_rope_params rp = cpu_rope_default(CPU_ROPE_NEOX, 128, 1e6f);
        double best = 1e9, bestn = 1e9;
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            cpu_rope(pool, x, nt[i], 32, 128, pos, &rp, NULL);
            double t1 = now();
            cpu_rmsnorm(pool, x, w, x, nt[i], 4096, 1e-6f);
            double t2 = now();
            if (t1 - t0 < best) best = t1 - t0;
            if (t2 - t1 < bestn) bestn = t2 - t1;
        }
        printf("rope 32x128 n_tok %3lld: %.3f ms   rmsnorm 4096 n_tok %3lld: %.3f ms\n", (long long)nt[i],
               best * 1e3, (long long)nt[i], bestn * 1e3);
        free(x); free(w); free(pos);
    }
    tp_free(pool);
    return 0;
}
