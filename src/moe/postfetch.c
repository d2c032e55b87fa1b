/* postfetch.c - post-fetch's configuration and decision (postfetch.h). */
#include "moe/postfetch.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pf_config pf_config_default(void) {
    return (pf_config){.enable = true, .force_cpu = false, .block_on_miss = true,
                       .max_transfers = 8, .scratchpad_mb = 0, .dedicated_streams = true,
                       .debug = false, .force_gpu = false};
}

/* An integer variable in [lo, hi] into *v (unset or empty: unchanged). */
static hm_status env_int(const char *name, long lo, long hi, int *v, hm_error *err) {
    const char *s = getenv(name);
    if (!s || !*s) return HM_OK;
    char *end = NULL;
    errno = 0;
    const long x = strtol(s, &end, 10);
    if (errno || !end || *end || x < lo || x > hi)
        return hm_error_set(err, HM_ERR_ARG, "%s=%s: must be an integer in [%ld, %ld]", name, s,
                            lo, hi);
    *v = (int)x;
    return HM_OK;
}

static hm_status env_flag(const char *name, bool *v, hm_error *err) {
    int x = *v ? 1 : 0;
    hm_status st = env_int(name, 0, 1, &x, err);
    *v = x != 0;
    return st;
}

hm_status pf_config_from_env(pf_config *c, hm_error *err) {
    *c = pf_config_default();
    hm_status st = env_flag("LLAMA_POSTFETCH_ENABLE", &c->enable, err);
    if (st == HM_OK) st = env_flag("LLAMA_POSTFETCH_FORCE_CPU", &c->force_cpu, err);
    if (st == HM_OK) st = env_flag("LLAMA_POSTFETCH_BLOCK_ON_MISS", &c->block_on_miss, err);
    if (st == HM_OK) st = env_int("LLAMA_POSTFETCH_MAX_TRANSFERS", 1, 1024, &c->max_transfers, err);
    if (st == HM_OK)
        st = env_int("LLAMA_POSTFETCH_SCRATCHPAD_MB", 0, 1 << 20, &c->scratchpad_mb, err);
    if (st == HM_OK)
        st = env_flag("LLAMA_POSTFETCH_USE_DEDICATED_STREAMS", &c->dedicated_streams, err);
    if (st == HM_OK) st = env_flag("LLAMA_POSTFETCH_DEBUG", &c->debug, err);
    if (st == HM_OK) st = env_flag("HOTMOE_POSTFETCH_FORCE", &c->force_gpu, err);
    return st;
}

static double max3(double a, double b, double c) {
    const double m = a > b ? a : b;
    return m > c ? m : c;
}

/* T for cpu bytes, copy bytes and k D products on the GPU. */
static double t_of(const pf_rates *r, double cpu, double copy, int k) {
    const double copy_t = copy > 0 ? copy / r->h2d_bytes_per_s : 0.0;
    return max3(cpu / r->read_bytes_per_s, copy_t,
                (cpu + copy) / (r->concurrency * r->read_bytes_per_s)) +
           (double)k * r->gpu_d_s;
}

static bool rates_ok(const pf_rates *r) {
    return isfinite(r->read_bytes_per_s) && r->read_bytes_per_s > 0 &&
           isfinite(r->h2d_bytes_per_s) && r->h2d_bytes_per_s > 0 && isfinite(r->concurrency) &&
           r->concurrency >= 1 && isfinite(r->gpu_d_s) && r->gpu_d_s >= 0;
}

hm_status pf_decide(const pf_config *c, const pf_rates *r, const pf_expert *ex, int n,
                    uint8_t *gpu, uint8_t *why, pf_decision *d, hm_error *err) {
    memset(d, 0, sizeof(*d));
    if (n < 0 || !rates_ok(r))
        return hm_error_set(err, HM_ERR_ARG, "post-fetch: %d experts, rates read %g B/s, h2d %g "
                            "B/s, concurrency %g (>= 1), GPU D %g s", n, r->read_bytes_per_s,
                            r->h2d_bytes_per_s, r->concurrency, r->gpu_d_s);
    double cpu = 0;
    for (int i = 0; i < n; i++) {
        gpu[i] = 0;
        why[i] = PF_WHY_CPU;
        cpu += (double)(ex[i].gate_up_bytes + ex[i].down_bytes);
    }
    d->t_cpu_only_s = d->t_s = t_of(r, cpu, 0, 0);
    if (!c->enable || c->force_cpu) return HM_OK;
    double copy = 0;
    for (int k = 0; k < n; k++) { /* the largest D not yet chosen (ties: lower index) */
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!gpu[i] && why[i] == PF_WHY_CPU &&
                (best < 0 || ex[i].down_bytes > ex[best].down_bytes))
                best = i;
        if (best < 0) break;
        const double db = (double)ex[best].down_bytes;
        const double t = t_of(r, cpu - db, copy + db, d->n_gpu + 1);
        if (!c->force_gpu && !(t < d->t_s)) break; /* T only grows from here: largest first */
        if (d->n_gpu >= c->max_transfers ||
            (c->scratchpad_mb > 0 && copy + db > (double)c->scratchpad_mb * 1048576.0)) {
            why[best] = PF_WHY_CAP;
            continue;
        }
        gpu[best] = 1;
        why[best] = c->force_gpu ? PF_WHY_FORCED : PF_WHY_GAIN;
        d->n_gpu++;
        cpu -= db;
        copy += db;
        d->t_s = t;
    }
    d->copy_bytes = (uint64_t)copy;
    return HM_OK;
}

size_t pf_format(const pf_decision *d, int layer, int n, char *buf, size_t cap) {
    const int w = snprintf(buf, cap, "[PF] layer %d: %d cold experts, %d D over PCIe (%.2f MiB), "
                           "T %.3f -> %.3f ms", layer, n, d->n_gpu,
                           (double)d->copy_bytes / 1048576.0, d->t_cpu_only_s * 1e3,
                           d->t_s * 1e3);
    return w < 0 ? 0 : (size_t)w;
}
