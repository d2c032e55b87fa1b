/* cuda_launch.cuh - every kernel launch of the CUDA backend, with programmatic dependent launch
 * (PDL, sm_90).
 *
 * DESIGN: decode is ~12 small kernels per layer in one graph, so the gap between a kernel's
 * last block and the next kernel's first (launch, block scheduling, prologue) is a large part of
 * a token. With PDL a kernel may be launched while its predecessor on the stream still runs.
 * Correctness rests on one rule: every kernel calls cu_pdl_enter() before it touches memory
 * that a kernel writes (weights, never written, may be requested before: a kernel's first
 * loads then overlap its predecessor's tail), and no block exits before calling it. Its
 * griddepcontrol.wait returns once the previous kernel has completed and its writes
 * are visible (a no-op when launched without PDL), and only then does the kernel allow its own
 * successor to launch (griddepcontrol.launch_dependents). So at most one kernel waits ahead of
 * the running one, and each kernel completes after its predecessor: the chain orders every
 * pair of kernels, as plain stream order does.
 */
#ifndef HM_CUDA_CUDA_LAUNCH_CUH
#define HM_CUDA_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

#include <utility>

/* First statement of every kernel (see DESIGN). */
static __device__ __forceinline__ void cu_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* asks L2 for the 128-byte line at p (no register, no wait) */
static __device__ __forceinline__ void cu_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* cp.async copies global -> shared, no registers held (commit, then wait for the groups):
 * cu_cp16 16 bytes (L2 only), cu_cp16z the same or 16 zero bytes when !ok (nothing read),
 * cu_cp4 4 bytes; cu_cp_commit closes a group, cu_cp_wait<N> waits until at most N groups of
 * this thread are pending, cu_cp_wait_all does both for everything issued. */
static __device__ __forceinline__ unsigned cu_smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void cu_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(cu_smem_addr(dst)), "l"(src));
}
static __device__ __forceinline__ void cu_cp16z(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(cu_smem_addr(dst)), "l"(src),
                 "r"(ok ? 16 : 0));
}
static __device__ __forceinline__ void cu_cp4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(cu_smem_addr(dst)), "l"(src));
}
static __device__ __forceinline__ void cu_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> static __device__ __forceinline__ void cu_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
static __device__ __forceinline__ void cu_cp_wait_all() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

/* kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute, in thread-block
 * clusters of cluster_x blocks along x when cluster_x > 1; errors are left for cudaGetLastError
 * as with <<<>>> (the callers' launch checks). */
template <typename... P, typename... A>
static inline void cu_launch_cluster(void (*kernel)(P...), unsigned cluster_x, dim3 grid,
                                     dim3 block, size_t smem, cudaStream_t stream, A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = cluster_x;
    at[1].val.clusterDim.y = 1;
    at[1].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = cluster_x > 1 ? 2 : 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

template <typename... P, typename... A>
static inline void cu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, A &&...args) {
    cu_launch_cluster(kernel, 1, grid, block, smem, stream, std::forward<A>(args)...);
}

#endif
