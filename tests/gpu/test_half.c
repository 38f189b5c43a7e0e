/*
 * test_half.c — quant/half.h on the GPU: the shared conversions give the same fp16 bits as the
 * CPU (the quantizer's reference) and as CUDA's __float2half_rn, and decode like __half2float,
 * over every fp16 value, every rounding tie and millions of random floats.
 */
#include "gpu_util.h"
#include "quant/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int test_half_convert(const float *d_in, uint16_t *d_ours, uint16_t *d_cuda, float *d_back,
                      float *d_back_cuda, int64_t n);

static int same_float(float a, float b) { return mkv_f32_bits(a) == mkv_f32_bits(b) || (isnan(a) && isnan(b)); }

Test(gpu_half, matches_cpu_and_cuda_intrinsics)
{
    GPU_REQUIRE();
    /* Every half value, the midpoints between neighbours (ties), their float neighbours, the
     * overflow edge, and random floats of every exponent. */
    const int64_t n_rand = 1 << 22;
    const int64_t n = 65536 * 4 + n_rand;
    float *in = malloc((size_t)n * sizeof *in);
    uint16_t *ours = malloc((size_t)n * 2), *cuda = malloc((size_t)n * 2);
    float *back = malloc((size_t)n * sizeof *back), *back_cuda = malloc((size_t)n * sizeof *back_cuda);
    cr_assert(in && ours && cuda && back && back_cuda);
    int64_t k = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = mkv_f16_to_f32((uint16_t)h);
        const float g = mkv_f16_to_f32((uint16_t)(h + 1 < 65536 ? h + 1 : h));
        const float mid = (float)(((double)f + (double)g) / 2.0);
        in[k++] = f;
        in[k++] = isfinite(mid) ? mid : 65520.0f;
        in[k++] = isfinite(mid) ? nextafterf(mid, INFINITY) : 65519.99f;
        in[k++] = isfinite(mid) ? nextafterf(mid, -INFINITY) : -65520.0f;
    }
    uint64_t rng = 0x1234u;
    while (k < n) in[k++] = mkv_bits_f32((uint32_t)test_rand_next(&rng));

    float *d_in, *d_back, *d_back_cuda;
    uint16_t *d_ours, *d_cuda;
    CUDA_CHECK(cudaMalloc((void **)&d_in, (size_t)n * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&d_back, (size_t)n * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&d_back_cuda, (size_t)n * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&d_ours, (size_t)n * 2));
    CUDA_CHECK(cudaMalloc((void **)&d_cuda, (size_t)n * 2));
    CUDA_CHECK(cudaMemset(d_ours, 0x7f, (size_t)n * 2));
    CUDA_CHECK(cudaMemset(d_cuda, 0x7f, (size_t)n * 2));
    CUDA_CHECK(cudaMemcpy(d_in, in, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    cr_assert_eq(test_half_convert(d_in, d_ours, d_cuda, d_back, d_back_cuda, n), 0, "kernel failed");
    CUDA_CHECK(cudaMemcpy(ours, d_ours, (size_t)n * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(cuda, d_cuda, (size_t)n * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(back, d_back, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(back_cuda, d_back_cuda, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));

    int64_t bad_cpu = 0, bad_cuda = 0, bad_back = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t cpu = mkv_f32_to_f16(in[i]);
        const int nan = isnan(in[i]);
        /* NaN payloads may differ; a NaN must stay a NaN. */
        const int same_cpu = nan ? (ours[i] & 0x7c00u) == 0x7c00u && (ours[i] & 0x3ffu) : ours[i] == cpu;
        const int same_cuda = nan ? (cuda[i] & 0x7c00u) == 0x7c00u && (cuda[i] & 0x3ffu) : ours[i] == cuda[i];
        if (!same_cpu && bad_cpu++ < 5)
            fprintf(stderr, "in %a: device %04x, CPU %04x\n", (double)in[i], ours[i], cpu);
        if (!same_cuda && bad_cuda++ < 5)
            fprintf(stderr, "in %a: ours %04x, __float2half_rn %04x\n", (double)in[i], ours[i], cuda[i]);
        if ((!same_float(back[i], back_cuda[i]) || !same_float(back[i], mkv_f16_to_f32(ours[i]))) &&
            bad_back++ < 5)
            fprintf(stderr, "half %04x: ours %a, __half2float %a\n", ours[i], (double)back[i],
                    (double)back_cuda[i]);
    }
    cr_assert_eq(bad_cpu, 0, "%lld of %lld conversions differ between device and CPU", (long long)bad_cpu, (long long)n);
    cr_assert_eq(bad_cuda, 0, "%lld of %lld conversions differ from __float2half_rn", (long long)bad_cuda, (long long)n);
    cr_assert_eq(bad_back, 0, "%lld of %lld decodes differ from __half2float", (long long)bad_back, (long long)n);
    cudaFree(d_in);
    cudaFree(d_back);
    cudaFree(d_back_cuda);
    cudaFree(d_ours);
    cudaFree(d_cuda);
    free(in);
    free(ours);
    free(cuda);
    free(back);
    free(back_cuda);
}
