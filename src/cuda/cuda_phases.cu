/* cuda_phases.cu - the decode-shape probe of cuda_phases.h (bench_cuda_phases only).
 *
 * DESIGN: every mode runs the same device function per (phase, block): the block's slice of the
 * phase's bytes (16-byte loads, four in flight per thread, summed), after its first thread has
 * read the word the previous phase's block 0 wrote (the dependency). Kernel mode launches one
 * kernel per phase with PDL, each block asking L2 for its slice before it waits for the previous
 * kernel (weights may be read early, as the engine's kernels do). The persistent kernel runs all
 * layers' phases with a grid barrier between them: a block-wide sync, then thread 0 arrives on a
 * counter; the last to arrive resets it and advances a generation word the others spin on (every
 * block is resident: the launcher never starts more than fit). With prefetch, each block asks L2
 * for its slice of the next phase before it arrives, so the weight stream need not stop while
 * the slowest block finishes.
 */
#include "cuda/cuda_launch.cuh"

extern "C" {
#include "cuda/cuda_phases.h"
}

enum { PH_THREADS = 256, PH_MIN_SLICE = 16384, PH_MAX_KERNEL_BLOCKS = 2048 };
/* scratch words: the barrier's count and generation on lines of their own, the dependency words */
enum { PH_COUNT = 0, PH_GEN = 32, PH_DEP = 64, PH_SINK = 96, PH_WORDS = 128 };

typedef struct {
    const uint8_t *w;
    size_t bytes[CUDA_PHASES_MAX], off[CUDA_PHASES_MAX], layer;
    int n_phase, n_layer;
    uint32_t *scratch;
} ph_plan;

/* bytes [o, e) of a phase that block b of nb reads (slices of whole 4 KiB pages) */
static __device__ __forceinline__ void ph_slice(size_t bytes, int b, int nb, size_t *o, size_t *e) {
    const size_t s = (bytes / 4096 + (size_t)nb - 1) / (size_t)nb * 4096;
    *o = (size_t)b * s < bytes ? (size_t)b * s : bytes;
    *e = *o + s < bytes ? *o + s : bytes;
}

static __device__ __forceinline__ void ph_prefetch(const uint8_t *p, size_t n) {
    for (size_t i = (size_t)threadIdx.x * 128; i < n; i += PH_THREADS * 128) cu_prefetch_l2(p + i);
}

/* Phase gp (counted over layers) of block b of nb: bytes [o, e) of base. */
static __device__ void ph_phase(const uint8_t *base, size_t bytes, int b, int nb, uint32_t *scratch,
                                int gp) {
    uint32_t acc = 0;
    if (threadIdx.x == 0 && gp > 0) acc = ((volatile uint32_t *)scratch)[PH_DEP + ((gp - 1) & 1)];
    size_t o, e;
    ph_slice(bytes, b, nb, &o, &e);
    const uint4 *p = (const uint4 *)(base + o);
    const size_t n = (e - o) / 16;
    size_t i = threadIdx.x;
    for (; i + 3 * PH_THREADS < n; i += 4 * PH_THREADS) {
        const uint4 x0 = __ldg(p + i), x1 = __ldg(p + i + PH_THREADS);
        const uint4 x2 = __ldg(p + i + 2 * PH_THREADS), x3 = __ldg(p + i + 3 * PH_THREADS);
        acc += (x0.x ^ x1.y ^ x2.z ^ x3.w) + (x0.w ^ x1.z ^ x2.y ^ x3.x);
    }
    for (; i < n; i += PH_THREADS) {
        const uint4 x = __ldg(p + i);
        acc += x.x ^ x.y ^ x.z ^ x.w;
    }
    if (acc == 0x9e3779b9u) scratch[PH_SINK] = acc; /* keeps the loads */
    if (b == 0 && threadIdx.x == 0) scratch[PH_DEP + (gp & 1)] = (uint32_t)gp;
}

static __device__ void ph_grid_sync(uint32_t *scratch, unsigned nb) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile uint32_t *gen = scratch + PH_GEN;
        const uint32_t g = *gen; /* cannot advance before this block arrives */
        __threadfence();
        if (atomicAdd(scratch + PH_COUNT, 1u) == nb - 1) {
            scratch[PH_COUNT] = 0;
            __threadfence();
            atomicAdd(scratch + PH_GEN, 1u);
        } else {
            while (*gen == g) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

static __global__ void __launch_bounds__(PH_THREADS) k_ph_phase(const uint8_t *base, size_t bytes,
                                                                uint32_t *scratch, int gp) {
    size_t o, e;
    ph_slice(bytes, blockIdx.x, gridDim.x, &o, &e);
    ph_prefetch(base + o, e - o);
    cu_pdl_enter();
    ph_phase(base, bytes, blockIdx.x, gridDim.x, scratch, gp);
}

static __global__ void __launch_bounds__(PH_THREADS) k_ph_persistent(ph_plan pl, int prefetch) {
    cu_pdl_enter();
    int gp = 0;
    for (int l = 0; l < pl.n_layer; l++)
        for (int p = 0; p < pl.n_phase; p++, gp++) {
            const uint8_t *base = pl.w + (size_t)l * pl.layer + pl.off[p];
            ph_phase(base, pl.bytes[p], blockIdx.x, gridDim.x, pl.scratch, gp);
            const int np = p + 1 < pl.n_phase ? p + 1 : 0, nl = p + 1 < pl.n_phase ? l : l + 1;
            if (prefetch && nl < pl.n_layer) {
                size_t o, e;
                ph_slice(pl.bytes[np], blockIdx.x, gridDim.x, &o, &e);
                ph_prefetch(pl.w + (size_t)nl * pl.layer + pl.off[np] + o, e - o);
            }
            ph_grid_sync(pl.scratch, gridDim.x);
        }
}

extern "C" size_t cuda_phases_scratch_words(void) { return PH_WORDS; }

extern "C" int cuda_phases_max_blocks(void) {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_ph_persistent, PH_THREADS, 0) !=
            cudaSuccess)
        return 0;
    return sms * per_sm;
}

extern "C" hm_status cuda_phases_run(cuda_phases_mode mode, const cuda_phases_args *a, void *stream,
                                     hm_error *err) {
    if (!a || a->n_phase < 1 || a->n_phase > CUDA_PHASES_MAX || a->n_layer < 1 || !a->w || !a->scratch)
        return hm_error_set(err, HM_ERR_ARG, "phases probe: bad arguments");
    ph_plan pl = {};
    pl.w = a->w;
    pl.n_phase = a->n_phase;
    pl.n_layer = a->n_layer;
    pl.scratch = a->scratch;
    for (int p = 0; p < a->n_phase; p++) {
        if (a->bytes[p] % 4096)
            return hm_error_set(err, HM_ERR_ARG, "phases probe: phase %d is not whole pages", p);
        pl.bytes[p] = a->bytes[p];
        pl.off[p] = pl.layer;
        pl.layer += a->bytes[p];
    }
    cudaStream_t s = (cudaStream_t)stream;
    if (mode == CUDA_PHASES_PERSISTENT || mode == CUDA_PHASES_PREFETCH) {
        const int max = cuda_phases_max_blocks();
        if (a->blocks < 1 || a->blocks > max)
            return hm_error_set(err, HM_ERR_ARG, "phases probe: %d blocks, 1 to %d fit at once",
                                a->blocks, max);
        cu_launch(k_ph_persistent, dim3(a->blocks), dim3(PH_THREADS), 0, s, pl,
                  mode == CUDA_PHASES_PREFETCH ? 1 : 0);
    } else {
        const bool one = mode == CUDA_PHASES_STREAM;
        int gp = 0;
        for (int l = 0; l < a->n_layer; l++)
            for (int p = 0; p < (one ? 1 : a->n_phase); p++, gp++) {
                const size_t bytes = one ? pl.layer : pl.bytes[p];
                size_t nb = (bytes + PH_MIN_SLICE - 1) / PH_MIN_SLICE;
                if (nb > PH_MAX_KERNEL_BLOCKS) nb = PH_MAX_KERNEL_BLOCKS;
                cu_launch(k_ph_phase, dim3((unsigned)nb), dim3(PH_THREADS), 0, s,
                          pl.w + (size_t)l * pl.layer + (one ? 0 : pl.off[p]), bytes, pl.scratch, gp);
            }
    }
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? HM_OK
                            : hm_error_set(err, HM_ERR_CUDA, "phases probe: %s", cudaGetErrorString(e));
}
