/* cuda_host.cu - pinned registration of host ranges and the double-buffered copy lane
 * (cuda_host.h).
 *
 * DESIGN: the registration is one cudaHostRegister call over whole pages (ReadOnly | Mapped,
 * Portable so any device of the process may copy from it); its failure is returned with the CUDA
 * error and the size, never logged here, and the caller switches to staging. The lane is a
 * private non-blocking stream, two device buffers and four events (ready and free per buffer,
 * cuda_host.h); a range inside the registration is one cudaMemcpyAsync (the rows of a strided
 * copy, cuda_copy_lane_copy_rows, one cudaMemcpyBatchAsync for the call), any other range is cut
 * into pieces of at most one pinned chunk, each memcpy'd into one of two chunks by the calling
 * thread and sent from there (an event per chunk says when the DMA engine is done with it).
 * No state outside the objects.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include "base/cpu.h"
#include "cuda/cuda_host.h"
}

static double host_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static hm_status host_fail(hm_error *err, cudaError_t e, const char *what) {
    cudaGetLastError(); /* clear a non-sticky error so later calls are not blamed */
    return hm_error_set(err, HM_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

/* ---- registration ---- */

struct cuda_host_reg {
    void *base; /* page-aligned */
    size_t len; /* whole pages */
    double secs;
};

extern "C" hm_status cuda_host_register(const void *p, size_t n, cuda_host_reg **out,
                                        hm_error *err) {
    *out = NULL;
    if (!p || n == 0)
        return hm_error_set(err, HM_ERR_ARG, "cuda_host_register: empty range (%p, %zu bytes)",
                            p, n);
    int dev = 0, count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "cuda_host_register: no CUDA device (%s)",
                            e == cudaSuccess ? "none found" : cudaGetErrorString(e));
    }
    if ((e = cudaGetDevice(&dev)) != cudaSuccess)
        return host_fail(err, e, "cuda_host_register: cudaGetDevice");
    int reg_ok = 0, ro_ok = 0;
    cudaDeviceGetAttribute(&reg_ok, cudaDevAttrHostRegisterSupported, dev);
    cudaDeviceGetAttribute(&ro_ok, cudaDevAttrHostRegisterReadOnlySupported, dev);
    cudaGetLastError();
    char sz[32];
    hm_bytes_str((uint64_t)n, sz);
    if (!reg_ok || !ro_ok)
        return hm_error_set(err, HM_ERR_UNSUPPORTED,
                            "cuda_host_register: device %d cannot register host memory%s "
                            "(%s not pinned)", dev, reg_ok ? " read-only" : "", sz);
    long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096u;
    const uintptr_t lo = (uintptr_t)p & ~(page - 1);
    const uintptr_t end = (uintptr_t)p + n;
    if (end < (uintptr_t)p || end > UINTPTR_MAX - page)
        return hm_error_set(err, HM_ERR_ARG, "cuda_host_register: range %p + %zu wraps", p, n);
    const uintptr_t hi = (end + page - 1) & ~(page - 1);
    cuda_host_reg *r = (cuda_host_reg *)calloc(1, sizeof(*r));
    if (!r) return hm_error_set(err, HM_ERR_NOMEM, "cuda_host_register: out of memory");
    r->base = (void *)lo;
    r->len = (size_t)(hi - lo);
    const double t0 = host_now_s();
    e = cudaHostRegister(r->base, r->len,
                         cudaHostRegisterReadOnly | cudaHostRegisterMapped |
                             cudaHostRegisterPortable);
    r->secs = host_now_s() - t0;
    if (e != cudaSuccess) {
        free(r);
        cudaGetLastError();
        return hm_error_set(err, HM_ERR_CUDA,
                            "cudaHostRegister(read-only, mapped) of %s at %p on device %d: %s",
                            sz, p, dev, cudaGetErrorString(e));
    }
    *out = r;
    return HM_OK;
}

extern "C" void cuda_host_unregister(cuda_host_reg *r) {
    if (!r) return;
    cudaHostUnregister(r->base);
    cudaGetLastError();
    free(r);
}

extern "C" bool cuda_host_reg_covers(const cuda_host_reg *r, const void *p, size_t n) {
    if (!r || !p) return false;
    const uintptr_t a = (uintptr_t)p, b = (uintptr_t)r->base;
    return a >= b && a - b <= r->len && n <= r->len - (a - b);
}

extern "C" void cuda_host_reg_range(const cuda_host_reg *r, const void **base, size_t *len,
                                    double *secs) {
    if (base) *base = r ? r->base : NULL;
    if (len) *len = r ? r->len : 0;
    if (secs) *secs = r ? r->secs : 0.0;
}

extern "C" void *cuda_host_reg_device_ptr(const cuda_host_reg *r, const void *p) {
    if (!cuda_host_reg_covers(r, p, 1)) return NULL;
    void *d = NULL;
    if (cudaHostGetDevicePointer(&d, r->base, 0) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return (char *)d + ((uintptr_t)p - (uintptr_t)r->base);
}

/* ---- the copy lane ---- */

static const size_t k_chunk_max = 8u << 20;

struct cuda_copy_lane {
    int dev;
    size_t cap;                 /* bytes of each device buffer */
    const cuda_host_reg *reg;   /* borrowed, may be NULL */
    cudaStream_t s;             /* the lane's stream */
    void *buf[CUDA_COPY_LANE_BUFS];          /* device, [cap] bytes each */
    cudaEvent_t ready[CUDA_COPY_LANE_BUFS];  /* recorded on s after a copy into buf[b] */
    cudaEvent_t freed[CUDA_COPY_LANE_BUFS];  /* recorded on the consumer's stream */
    bool freed_set[CUDA_COPY_LANE_BUFS];
    int layer[CUDA_COPY_LANE_BUFS];
    /* staging: two pinned chunks, allocated on first use */
    void *chunk[2];
    cudaEvent_t chunk_ev[2];
    bool chunk_busy[2];
    size_t chunk_cap;
    int next_chunk;
    /* the direct rows of a cuda_copy_lane_copy_rows call as one cudaMemcpyBatchAsync: [bcap]
     * destinations, sources and sizes, grown on demand; no_batch: the call failed once, so one
     * cudaMemcpy2DAsync per run from then on */
    void **bd;
    const void **bs;
    size_t *bn, bcap;
    bool no_batch;
    cuda_copy_lane_stats st;
};

static size_t lane_align(size_t n) {
    return (n + CUDA_COPY_LANE_ALIGN - 1) & ~(size_t)(CUDA_COPY_LANE_ALIGN - 1);
}

extern "C" size_t cuda_copy_lane_bytes(const cuda_host_range *src, int n) {
    size_t t = 0;
    for (int i = 0; i < n; i++) t += lane_align(src[i].n);
    return t;
}

extern "C" size_t cuda_copy_lane_cap(const cuda_copy_lane *l) { return l ? l->cap : 0; }

extern "C" void cuda_copy_lane_free(cuda_copy_lane *l) {
    if (!l) return;
    cudaSetDevice(l->dev);
    if (l->s) cudaStreamSynchronize(l->s);
    for (int b = 0; b < CUDA_COPY_LANE_BUFS; b++) {
        if (l->buf[b]) cudaFree(l->buf[b]);
        if (l->ready[b]) cudaEventDestroy(l->ready[b]);
        if (l->freed[b]) cudaEventDestroy(l->freed[b]);
    }
    for (int k = 0; k < 2; k++) {
        if (l->chunk[k]) cudaFreeHost(l->chunk[k]);
        if (l->chunk_ev[k]) cudaEventDestroy(l->chunk_ev[k]);
    }
    if (l->s) cudaStreamDestroy(l->s);
    cudaGetLastError();
    free(l->bd);
    free(l->bs);
    free(l->bn);
    free(l);
}

static hm_status lane_chunks(cuda_copy_lane *l, hm_error *err);

extern "C" hm_status cuda_copy_lane_init(int dev, size_t cap, const cuda_host_reg *reg,
                                         cuda_copy_lane **out, hm_error *err) {
    *out = NULL;
    if (cap == 0) return hm_error_set(err, HM_ERR_ARG, "cuda_copy_lane_init: cap is 0 bytes");
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || dev < 0 || dev >= count) {
        cudaGetLastError();
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "cuda_copy_lane_init: no CUDA device %d "
                            "(%d found)", dev, e == cudaSuccess ? count : 0);
    }
    if ((e = cudaSetDevice(dev)) != cudaSuccess)
        return host_fail(err, e, "cuda_copy_lane_init: cudaSetDevice");
    cuda_copy_lane *l = (cuda_copy_lane *)calloc(1, sizeof(*l));
    if (!l) return hm_error_set(err, HM_ERR_NOMEM, "cuda_copy_lane_init: out of memory");
    l->dev = dev;
    l->cap = lane_align(cap);
    l->reg = reg;
    l->chunk_cap = l->cap < k_chunk_max ? l->cap : k_chunk_max;
    const char *what = "cudaStreamCreateWithFlags";
    e = cudaStreamCreateWithFlags(&l->s, cudaStreamNonBlocking);
    for (int b = 0; b < CUDA_COPY_LANE_BUFS && e == cudaSuccess; b++) {
        l->layer[b] = -1;
        what = "cudaMalloc (staging buffer)";
        e = cudaMalloc(&l->buf[b], l->cap);
        if (e == cudaSuccess) {
            what = "cudaEventCreate";
            e = cudaEventCreateWithFlags(&l->ready[b], cudaEventDisableTiming);
        }
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&l->freed[b], cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        char sz[32];
        hm_bytes_str((uint64_t)l->cap, sz);
        hm_status st = hm_error_set(err, e == cudaErrorMemoryAllocation ? HM_ERR_NOMEM
                                                                        : HM_ERR_CUDA,
                                    "cuda_copy_lane_init: %s (2 buffers of %s on device %d): %s",
                                    what, sz, dev, cudaGetErrorString(e));
        cudaGetLastError();
        cuda_copy_lane_free(l);
        return st;
    }
    /* the pinned chunks too: no allocation while a tiered step's kernel waits for the host */
    hm_status st = lane_chunks(l, err);
    if (st != HM_OK) {
        cuda_copy_lane_free(l);
        return st;
    }
    *out = l;
    return HM_OK;
}

extern "C" bool cuda_copy_lane_direct(const cuda_copy_lane *l, const void *p, size_t n) {
    return l && cuda_host_reg_covers(l->reg, p, n);
}

static hm_status lane_chunks(cuda_copy_lane *l, hm_error *err) {
    if (l->chunk[0]) return HM_OK;
    for (int k = 0; k < 2; k++) {
        cudaError_t e = cudaMallocHost(&l->chunk[k], l->chunk_cap);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&l->chunk_ev[k], cudaEventDisableTiming);
        if (e != cudaSuccess) return host_fail(err, e, "copy lane: pinned staging chunk");
    }
    return HM_OK;
}

/* n bytes from host p (not registered) to device d through the pinned chunks. */
static hm_status lane_staged(cuda_copy_lane *l, char *d, const char *p, size_t n, hm_error *err) {
    hm_status st = lane_chunks(l, err);
    if (st != HM_OK) return st;
    while (n > 0) {
        const size_t m = n < l->chunk_cap ? n : l->chunk_cap;
        const int k = l->next_chunk;
        cudaError_t e = cudaSuccess;
        if (l->chunk_busy[k] && (e = cudaEventSynchronize(l->chunk_ev[k])) != cudaSuccess)
            return host_fail(err, e, "copy lane: waiting for a staging chunk");
        memcpy(l->chunk[k], p, m);
        e = cudaMemcpyAsync(d, l->chunk[k], m, cudaMemcpyHostToDevice, l->s);
        if (e == cudaSuccess) e = cudaEventRecord(l->chunk_ev[k], l->s);
        if (e != cudaSuccess) return host_fail(err, e, "copy lane: staged cudaMemcpyAsync");
        l->chunk_busy[k] = true;
        l->next_chunk = k ^ 1;
        l->st.bytes_staged += m;
        d += m;
        p += m;
        n -= m;
    }
    return HM_OK;
}

/* Before copies into buffer b: the lane's device, then the consumer's last release of b. */
static hm_status lane_begin(cuda_copy_lane *l, int b, hm_error *err) {
    cudaError_t e = cudaSetDevice(l->dev);
    if (e != cudaSuccess) return host_fail(err, e, "cuda_copy_lane_copy: cudaSetDevice");
    if (l->freed_set[b] && (e = cudaStreamWaitEvent(l->s, l->freed[b], 0)) != cudaSuccess)
        return host_fail(err, e, "cuda_copy_lane_copy: waiting for the buffer's release");
    return HM_OK;
}

/* After them: ready[b] and the layer tag. */
static hm_status lane_end(cuda_copy_lane *l, int b, int layer, hm_error *err) {
    cudaError_t e = cudaEventRecord(l->ready[b], l->s);
    if (e != cudaSuccess) return host_fail(err, e, "cuda_copy_lane_copy: cudaEventRecord");
    l->layer[b] = layer;
    l->st.copies++;
    return HM_OK;
}

extern "C" hm_status cuda_copy_lane_copy_at(cuda_copy_lane *l, int b, int layer, size_t start,
                                            const cuda_host_range *src, int n, size_t *off,
                                            hm_error *err) {
    if (!l || b < 0 || b >= CUDA_COPY_LANE_BUFS || n < 0 || (n > 0 && !src) ||
        start % CUDA_COPY_LANE_ALIGN != 0)
        return hm_error_set(err, HM_ERR_ARG, "cuda_copy_lane_copy: bad arguments (buffer %d, "
                            "%d ranges, at %zu)", b, n, start);
    for (int i = 0; i < n; i++)
        if (!src[i].p && src[i].n > 0)
            return hm_error_set(err, HM_ERR_ARG, "cuda_copy_lane_copy: range %d is NULL with "
                                "%zu bytes", i, src[i].n);
    const size_t total = cuda_copy_lane_bytes(src, n);
    if (start > l->cap || total > l->cap - start)
        return hm_error_set(err, HM_ERR_RANGE, "cuda_copy_lane_copy: layer %d needs %zu bytes "
                            "in %d ranges at %zu, the buffer holds %zu", layer, total, n, start,
                            l->cap);
    hm_status st = lane_begin(l, b, err);
    if (st != HM_OK) return st;
    size_t o = start;
    for (int i = 0; i < n; i++) {
        if (off) off[i] = o;
        if (src[i].n == 0) continue;
        char *d = (char *)l->buf[b] + o;
        if (cuda_host_reg_covers(l->reg, src[i].p, src[i].n)) {
            cudaError_t e = cudaMemcpyAsync(d, src[i].p, src[i].n, cudaMemcpyHostToDevice, l->s);
            if (e != cudaSuccess) return host_fail(err, e, "cuda_copy_lane_copy: cudaMemcpyAsync");
            l->st.bytes_direct += src[i].n;
        } else {
            st = lane_staged(l, d, (const char *)src[i].p, src[i].n, err);
            if (st != HM_OK) return st;
        }
        o += lane_align(src[i].n);
        l->st.ranges++;
    }
    return lane_end(l, b, layer, err);
}

/* Whether run r is well formed and ends inside a buffer of cap bytes. */
static bool rows_ok(const cuda_host_rows *r, size_t cap) {
    if (r->rows == 0 || r->n == 0) return true;
    if (!r->p || r->spitch < r->n || r->dpitch < r->n || r->off > cap) return false;
    const size_t span = (r->rows - 1) * r->dpitch; /* rows <= cap / dpitch checked first */
    return r->rows - 1 <= (cap - r->off) / r->dpitch && span <= cap - r->off &&
           r->n <= cap - r->off - span;
}

/* A cuda_copy_lane_copy_rows call's direct rows (inside the registration) go as one
 * cudaMemcpyBatchAsync (CUDA 12.8 on): a prompt layer of a mixed layer's cold experts is hundreds
 * of short runs (the hot ones in between), and one call per run costs the worker microseconds
 * each. batch_room: room for m rows (false: no batch for this call: an older toolkit, out of
 * memory, or a batch failed before). batch_send: the m rows gathered; false when the call failed
 * (then never tried again), the caller copying run by run instead. */
static bool batch_room(cuda_copy_lane *l, size_t m) {
#if CUDART_VERSION >= 12080
    if (l->no_batch) return false;
    if (m <= l->bcap) return true;
    void **bd = (void **)realloc(l->bd, m * sizeof(*bd));
    if (bd) l->bd = bd;
    const void **bs = (const void **)realloc(l->bs, m * sizeof(*bs));
    if (bs) l->bs = bs;
    size_t *bn = (size_t *)realloc(l->bn, m * sizeof(*bn));
    if (bn) l->bn = bn;
    if (!bd || !bs || !bn) return false;
    l->bcap = m;
    return true;
#else
    (void)l, (void)m;
    return false;
#endif
}

static bool batch_send(cuda_copy_lane *l, size_t m) {
#if CUDART_VERSION >= 12080
    cudaMemcpyAttributes a;
    memset(&a, 0, sizeof(a));
    a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
#if CUDART_VERSION >= 13000
    const cudaError_t e = cudaMemcpyBatchAsync(l->bd, l->bs, l->bn, m, &a, &first, 1, l->s);
#else /* 12.8 and 12.9 also report the index of a failed copy */
    size_t fail = 0;
    const cudaError_t e = cudaMemcpyBatchAsync(l->bd, (void **)l->bs, l->bn, m, &a, &first, 1,
                                               &fail, l->s);
#endif
    if (e != cudaSuccess) {
        cudaGetLastError();
        l->no_batch = true;
        return false;
    }
    l->st.batches++;
    return true;
#else
    (void)l, (void)m;
    return false;
#endif
}

/* One strided run as one 2D copy (the registration covers it). */
static hm_status run_copy(cuda_copy_lane *l, int b, const cuda_host_rows *r, hm_error *err) {
    cudaError_t e = cudaMemcpy2DAsync((char *)l->buf[b] + r->off, r->dpitch, r->p, r->spitch, r->n,
                                      r->rows, cudaMemcpyHostToDevice, l->s);
    return e == cudaSuccess ? HM_OK : host_fail(err, e, "cuda_copy_lane_copy_rows: cudaMemcpy2DAsync");
}

extern "C" hm_status cuda_copy_lane_copy_rows(cuda_copy_lane *l, int b, int layer,
                                              const cuda_host_rows *r, int n, hm_error *err) {
    if (!l || b < 0 || b >= CUDA_COPY_LANE_BUFS || n < 0 || (n > 0 && !r))
        return hm_error_set(err, HM_ERR_ARG, "cuda_copy_lane_copy_rows: bad arguments (buffer "
                            "%d, %d runs)", b, n);
    size_t rows = 0;
    for (int i = 0; i < n; i++) {
        if (!rows_ok(&r[i], l->cap))
            return hm_error_set(err, HM_ERR_RANGE, "cuda_copy_lane_copy_rows: layer %d: run %d "
                                "(%zu rows of %zu bytes, pitches %zu / %zu, at %zu) does not fit "
                                "the buffer of %zu bytes", layer, i, r[i].rows, r[i].n,
                                r[i].spitch, r[i].dpitch, r[i].off, l->cap);
        rows += r[i].n ? r[i].rows : 0;
    }
    hm_status st = lane_begin(l, b, err);
    if (st != HM_OK) return st;
    const bool batch = rows >= 2 && batch_room(l, rows);
    size_t m = 0; /* direct rows gathered for the batch */
    for (int i = 0; i < n; i++) {
        if (r[i].rows == 0 || r[i].n == 0) continue;
        char *d = (char *)l->buf[b] + r[i].off;
        const char *p = (const char *)r[i].p;
        if (cuda_host_reg_covers(l->reg, p, (r[i].rows - 1) * r[i].spitch + r[i].n)) {
            for (size_t k = 0; batch && k < r[i].rows; k++, m++) {
                l->bd[m] = d + k * r[i].dpitch;
                l->bs[m] = p + k * r[i].spitch;
                l->bn[m] = r[i].n;
            }
            if (!batch && (st = run_copy(l, b, &r[i], err)) != HM_OK) return st;
            l->st.bytes_direct += r[i].n * r[i].rows;
        } else {
            for (size_t k = 0; k < r[i].rows && st == HM_OK; k++)
                st = lane_staged(l, d + k * r[i].dpitch, p + k * r[i].spitch, r[i].n, err);
            if (st != HM_OK) return st;
        }
        l->st.ranges += r[i].rows;
    }
    if (m > 0 && !batch_send(l, m)) /* the direct runs one call each after all */
        for (int i = 0; i < n && st == HM_OK; i++)
            if (r[i].rows && r[i].n &&
                cuda_host_reg_covers(l->reg, r[i].p, (r[i].rows - 1) * r[i].spitch + r[i].n))
                st = run_copy(l, b, &r[i], err);
    return st == HM_OK ? lane_end(l, b, layer, err) : st;
}

extern "C" hm_status cuda_copy_lane_copy(cuda_copy_lane *l, int b, int layer,
                                         const cuda_host_range *src, int n, size_t *off,
                                         hm_error *err) {
    return cuda_copy_lane_copy_at(l, b, layer, 0, src, n, off, err);
}

extern "C" void *cuda_copy_lane_buf(const cuda_copy_lane *l, int b) {
    return l && b >= 0 && b < CUDA_COPY_LANE_BUFS ? l->buf[b] : NULL;
}

extern "C" int cuda_copy_lane_layer(const cuda_copy_lane *l, int b) {
    return l && b >= 0 && b < CUDA_COPY_LANE_BUFS ? l->layer[b] : -1;
}

extern "C" hm_status cuda_copy_lane_wait(cuda_copy_lane *l, int b, void *stream, hm_error *err) {
    if (!l || b < 0 || b >= CUDA_COPY_LANE_BUFS)
        return hm_error_set(err, HM_ERR_ARG, "cuda_copy_lane_wait: bad buffer %d", b);
    cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, l->ready[b], 0);
    if (e != cudaSuccess) return host_fail(err, e, "cuda_copy_lane_wait: cudaStreamWaitEvent");
    return HM_OK;
}

extern "C" hm_status cuda_copy_lane_release(cuda_copy_lane *l, int b, void *stream,
                                            hm_error *err) {
    if (!l || b < 0 || b >= CUDA_COPY_LANE_BUFS)
        return hm_error_set(err, HM_ERR_ARG, "cuda_copy_lane_release: bad buffer %d", b);
    cudaError_t e = cudaEventRecord(l->freed[b], (cudaStream_t)stream);
    if (e != cudaSuccess) return host_fail(err, e, "cuda_copy_lane_release: cudaEventRecord");
    l->freed_set[b] = true;
    return HM_OK;
}

extern "C" hm_status cuda_copy_lane_sync_buf(cuda_copy_lane *l, int b, hm_error *err) {
    if (!l || b < 0 || b >= CUDA_COPY_LANE_BUFS)
        return hm_error_set(err, HM_ERR_ARG, "cuda_copy_lane_sync_buf: bad buffer %d", b);
    cudaError_t e = cudaEventSynchronize(l->ready[b]);
    if (e != cudaSuccess) return host_fail(err, e, "cuda_copy_lane_sync_buf");
    return HM_OK;
}

extern "C" hm_status cuda_copy_lane_query_buf(cuda_copy_lane *l, int b, bool *done,
                                              hm_error *err) {
    *done = false;
    if (!l || b < 0 || b >= CUDA_COPY_LANE_BUFS)
        return hm_error_set(err, HM_ERR_ARG, "cuda_copy_lane_query_buf: bad buffer %d", b);
    cudaError_t e = cudaEventQuery(l->ready[b]);
    if (e == cudaErrorNotReady) return HM_OK;
    if (e != cudaSuccess) return host_fail(err, e, "cuda_copy_lane_query_buf");
    *done = true;
    return HM_OK;
}

extern "C" hm_status cuda_copy_lane_sync(cuda_copy_lane *l, hm_error *err) {
    if (!l) return hm_error_set(err, HM_ERR_ARG, "cuda_copy_lane_sync: no lane");
    cudaError_t e = cudaStreamSynchronize(l->s);
    if (e != cudaSuccess) return host_fail(err, e, "cuda_copy_lane_sync");
    return HM_OK;
}

extern "C" void cuda_copy_lane_get_stats(const cuda_copy_lane *l, cuda_copy_lane_stats *s) {
    if (l) *s = l->st;
    else memset(s, 0, sizeof(*s));
}

extern "C" hm_status cuda_copy_lane_measure(cuda_copy_lane *l, const void *src, size_t n,
                                            int reps, double *bytes_per_s, hm_error *err) {
    *bytes_per_s = 0;
    if (!l || !src || n == 0 || n > l->cap || reps < 1)
        return hm_error_set(err, HM_ERR_ARG, "cuda_copy_lane_measure: %zu bytes (buffer %zu), "
                            "%d repetitions", n, l ? l->cap : 0, reps);
    const cuda_host_range r = {src, n};
    double best = 0;
    for (int i = 0; i <= reps; i++) { /* i == 0: untimed (first touch, driver set-up) */
        const double t0 = host_now_s();
        hm_status st = cuda_copy_lane_copy(l, 0, -1, &r, 1, NULL, err);
        if (st == HM_OK) st = cuda_copy_lane_sync(l, err);
        if (st != HM_OK) return st;
        const double dt = host_now_s() - t0;
        if (i > 0 && dt > 0 && (double)n / dt > best) best = (double)n / dt;
    }
    *bytes_per_s = best;
    return HM_OK;
}
