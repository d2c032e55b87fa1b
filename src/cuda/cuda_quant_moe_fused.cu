/* cuda_quant_moe_fused.cu - the instantiations of the fused gate/up expert kernel
 * (cuda_quant_moe.cuh), in their own file so that nvcc builds them in parallel with the rest. */
#include "cuda/cuda_quant_moe.cuh"

void cq_moe_fused_launch(uint32_t wtype, const moe_params *P, cudaStream_t st) {
    CB_DISPATCH(wtype, launch_moe_fused, P, st);
}
