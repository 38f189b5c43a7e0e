/*
 * half_kernels.cu — test-only kernels: quant/half.h's conversions compiled for the device,
 * side by side with CUDA's own intrinsics, so test_half.c can check that the shared header
 * gives the same bits on the GPU as on the CPU and as __float2half_rn / __half2float.
 */
#include "quant/half.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

static __global__ void convert_kernel(const float *in, uint16_t *ours, uint16_t *cuda, float *back,
                                      float *back_cuda, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        ours[i] = mkv_f32_to_f16(in[i]);
        const __half h = __float2half_rn(in[i]);
        cuda[i] = __half_as_ushort(h);
        back[i] = mkv_f16_to_f32(ours[i]);
        back_cuda[i] = __half2float(__ushort_as_half(ours[i]));
    }
}

extern "C" int test_half_convert(const float *d_in, uint16_t *d_ours, uint16_t *d_cuda,
                                 float *d_back, float *d_back_cuda, int64_t n)
{
    convert_kernel<<<256, 256>>>(d_in, d_ours, d_cuda, d_back, d_back_cuda, n);
    return cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}
