/* cuda_host.h - host memory the GPU copies from: the model's mapping registered as pinned, and a
 * copy lane that streams experts' bytes into two device staging buffers (double buffering).
 * Plain C; implemented in cuda_host.cu, stubbed in cuda_none.c (HM_ERR_UNSUPPORTED).
 *
 * DESIGN: experts in host RAM stay in the file's read-only mapping (no second copy). For the GPU
 * to copy them at full PCIe speed the mapping is registered as pinned memory
 * (cudaHostRegister with cudaHostRegisterReadOnly | cudaHostRegisterMapped over the page-aligned
 * range that covers the bytes: a read-only mapping can only be registered read-only). When that
 * fails (no driver support for read-only registration, a memory-lock limit, ...)
 * cuda_host_register says why and the caller hands the copy lane no registration: its copies
 * then go through two pinned staging chunks of its own (the calling thread copies a chunk from
 * the mapping, the DMA engine sends it while the next chunk is filled).
 *
 * The copy lane owns a private non-blocking stream and two device staging buffers of cap bytes.
 * One buffer holds one layer's copied experts, packed in the order given, each range 256-byte
 * aligned. The protocol between the copy lane and a consumer stream (the GPU engine's) is two
 * events per buffer:
 *
 *   copy(b, layer L+1 ranges)   lane stream: wait free[b]; copies; record ready[b]
 *   wait(b, stream)             consumer stream waits ready[b] (its kernels read buffer b)
 *   release(b, stream)          free[b] recorded on the consumer stream after those kernels
 *
 * so layer L+1's bytes stream into buffer b^1 while layer L's kernels read buffer b, and a copy
 * into a buffer never overwrites bytes a kernel has not finished reading. Nothing synchronises
 * the host except the staged path (the thread waits for a pinned chunk to be free before
 * refilling it) and cuda_copy_lane_sync.
 *
 *   cuda_host_reg *reg = NULL;
 *   if (cuda_host_register(span, span_bytes, &reg, &err) != HM_OK) log("staging: %s", err.msg);
 *   cuda_copy_lane *lane; cuda_copy_lane_init(dev, cap, reg, &lane, &err);
 *   cuda_copy_lane_copy(lane, b, layer, ranges, n, offs, &err);   offs[i]: range i in buffer b
 *   cuda_copy_lane_wait(lane, b, stream, &err);  ... kernels read cuda_copy_lane_buf(lane, b) ...
 *   cuda_copy_lane_release(lane, b, stream, &err);
 *   ...  cuda_copy_lane_free(lane); cuda_host_unregister(reg);
 *
 * A lane is used by one host thread at a time. Streams are cudaStream_t passed as void *.
 */
#ifndef HM_CUDA_CUDA_HOST_H
#define HM_CUDA_CUDA_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- pinned registration of a host range ---- */

typedef struct cuda_host_reg cuda_host_reg;

/* Registers the pages covering [p, p + n) (p rounded down, p + n up to the page size) as pinned,
 * read-only and mapped. On failure *out is NULL and the status (HM_ERR_CUDA, HM_ERR_UNSUPPORTED
 * for a build or device without the feature, HM_ERR_ARG) comes with a message saying why, the
 * bytes and the CUDA error: the caller then copies through pinned staging (a lane without
 * registration). Registration faults every page in (the file is read once): about 0.04 s per
 * GiB on the GPU machine. */
hm_status cuda_host_register(const void *p, size_t n, cuda_host_reg **out, hm_error *err);
/* Unregisters; NULL is allowed. */
void cuda_host_unregister(cuda_host_reg *r);
/* Whether [p, p + n) lies inside the registered pages. r NULL: false. */
bool cuda_host_reg_covers(const cuda_host_reg *r, const void *p, size_t n);
/* The registered range (page-aligned) and the seconds cudaHostRegister took. */
void cuda_host_reg_range(const cuda_host_reg *r, const void **base, size_t *len, double *secs);
/* The device address of host address p inside the registration (kernels may read the mapping
 * directly, at PCIe speed); NULL when p is outside it or the device gives none. */
void *cuda_host_reg_device_ptr(const cuda_host_reg *r, const void *p);

/* ---- the copy lane ---- */

typedef struct {
    const void *p; /* host bytes (in the registration, or anywhere: then staged) */
    size_t n;
} cuda_host_range;

/* rows strided rows of n bytes: row k from p + k * spitch to buffer offset off + k * dpitch. */
typedef struct {
    const void *p;
    size_t n, rows;
    size_t spitch, dpitch; /* >= n */
    size_t off;
} cuda_host_rows;

typedef struct cuda_copy_lane cuda_copy_lane;

enum { CUDA_COPY_LANE_BUFS = 2, CUDA_COPY_LANE_ALIGN = 256 };

typedef struct {
    uint64_t copies;       /* cuda_copy_lane_copy calls */
    uint64_t ranges;       /* ranges copied */
    uint64_t bytes_direct; /* from the registration, one DMA per range */
    uint64_t bytes_staged; /* through the pinned staging chunks */
    uint64_t batches;      /* cudaMemcpyBatchAsync calls (strided runs' direct rows) */
} cuda_copy_lane_stats;

/* A lane on device dev with two device buffers of cap bytes each (cap > 0). reg (borrowed, may
 * be NULL) is the registration ranges are copied from directly; ranges outside it are staged
 * through two pinned chunks of min(cap, 8 MiB) bytes, allocated at init (never while a tiered
 * step waits for the host). */
hm_status cuda_copy_lane_init(int dev, size_t cap, const cuda_host_reg *reg,
                              cuda_copy_lane **out, hm_error *err);
/* Waits for every copy in flight, then frees; NULL is allowed. */
void cuda_copy_lane_free(cuda_copy_lane *l);

/* Bytes buffer b needs for these ranges (each rounded up to CUDA_COPY_LANE_ALIGN). */
size_t cuda_copy_lane_bytes(const cuda_host_range *src, int n);
size_t cuda_copy_lane_cap(const cuda_copy_lane *l);

/* Enqueues the copy of src[0..n) into buffer b (0 or 1), after the consumer's last release of b;
 * off[i] (may be NULL) gets range i's byte offset in the buffer. layer is a tag read back with
 * cuda_copy_lane_layer (the consumer's check that b holds the layer it expects). Ranges with
 * n == 0 take no space. HM_ERR_RANGE when the ranges need more than cap bytes (nothing is
 * enqueued); HM_ERR_ARG for b outside [0, 2) or a NULL range with n > 0. */
hm_status cuda_copy_lane_copy(cuda_copy_lane *l, int b, int layer, const cuda_host_range *src,
                              int n, size_t *off, hm_error *err);
/* The same from byte start of buffer b on (a multiple of CUDA_COPY_LANE_ALIGN): ranges appended
 * after an earlier copy into b, which stays (both are in the buffer once ready[b], recorded after
 * this copy, has fired). */
hm_status cuda_copy_lane_copy_at(cuda_copy_lane *l, int b, int layer, size_t start,
                                 const cuda_host_range *src, int n, size_t *off, hm_error *err);
/* Strided runs into buffer b, placed by the caller (off, dpitch): each one cudaMemcpy2DAsync
 * when the registration covers its rows, else staged row by row; after the consumer's last
 * release of b, as cuda_copy_lane_copy_at (earlier copies into b stay). A run's rows count as
 * ranges in the stats. HM_ERR_RANGE (nothing enqueued) when a run does not fit the buffer or
 * its pitches are below n; HM_ERR_ARG for b outside [0, 2). Runs with no rows or n == 0 take
 * no space. */
hm_status cuda_copy_lane_copy_rows(cuda_copy_lane *l, int b, int layer, const cuda_host_rows *r,
                                   int n, hm_error *err);
/* Device address of buffer b (cap bytes). */
void *cuda_copy_lane_buf(const cuda_copy_lane *l, int b);
/* The layer tag of the last copy into b (-1 before any). */
int cuda_copy_lane_layer(const cuda_copy_lane *l, int b);
/* Makes stream (a cudaStream_t; NULL: the legacy default stream) wait, on the device, for the
 * last copy into b. */
hm_status cuda_copy_lane_wait(cuda_copy_lane *l, int b, void *stream, hm_error *err);
/* Records on stream that the work enqueued there so far is all that reads buffer b: the next
 * copy into b waits for it. */
hm_status cuda_copy_lane_release(cuda_copy_lane *l, int b, void *stream, hm_error *err);
/* The host waits for every copy enqueued on the lane. */
hm_status cuda_copy_lane_sync(cuda_copy_lane *l, hm_error *err);
/* The host waits for the copies into buffer b enqueued so far (not for later ones, into the
 * other buffer). */
hm_status cuda_copy_lane_sync_buf(cuda_copy_lane *l, int b, hm_error *err);
/* Whether the copies into buffer b enqueued so far have landed (*done), without waiting. */
hm_status cuda_copy_lane_query_buf(cuda_copy_lane *l, int b, bool *done, hm_error *err);
void cuda_copy_lane_get_stats(const cuda_copy_lane *l, cuda_copy_lane_stats *s);
/* Whether copies from [p, p + n) would go directly (registered) or through staging. */
bool cuda_copy_lane_direct(const cuda_copy_lane *l, const void *p, size_t n);

/* Host->device bandwidth through this lane: n bytes from src (n <= cap) copied into buffer 0
 * reps times (after one untimed copy), timed with events on the lane's stream; *bytes_per_s gets
 * the best repetition. The lane must be idle (nothing in flight that a consumer has not
 * released). */
hm_status cuda_copy_lane_measure(cuda_copy_lane *l, const void *src, size_t n, int reps,
                                 double *bytes_per_s, hm_error *err);

#ifdef __cplusplus
}
#endif

#endif
