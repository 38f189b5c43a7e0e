/*
 * test_scan.c — the device exclusive prefix sum (memmgr/scan_cuda.cu, CUB) against the C
 * reference mkv_exclusive_scan_i32, exactly, on fresh random page demands of awkward sizes,
 * with the output poisoned first.
 */
#include "gpu_util.h"
#include "memmgr/scan.h"

#include <stdio.h>
#include <stdlib.h>

static void check_scan(int64_t n, uint64_t seed, int32_t max_demand)
{
    uint64_t rng = seed;
    int32_t *in = malloc((size_t)(n > 0 ? n : 1) * sizeof *in);
    int32_t *ref = malloc((size_t)(n > 0 ? n : 1) * sizeof *ref);
    int32_t *got = malloc((size_t)(n > 0 ? n : 1) * sizeof *got);
    cr_assert(in && ref && got);
    for (int64_t i = 0; i < n; i++) {
        /* Mostly zeros, as in a decode step where few sections cross a page boundary. */
        in[i] = test_rand_range(&rng, 0, 3) == 0 ? test_rand_range(&rng, 1, max_demand) : 0;
    }
    const int64_t ref_total = mkv_exclusive_scan_i32(in, ref, n);

    int32_t *d_in, *d_out, *d_total;
    const size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(int32_t);
    CUDA_CHECK(cudaMalloc((void **)&d_in, bytes));
    CUDA_CHECK(cudaMalloc((void **)&d_out, bytes));
    CUDA_CHECK(cudaMalloc((void **)&d_total, sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(d_in, in, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
    gpu_poison_i32(d_out, (size_t)(n > 0 ? n : 1));
    gpu_poison_i32(d_total, 1);

    char err[512] = "";
    size_t temp_bytes = 0;
    cr_assert_eq(mkv_cuda_exclusive_scan_i32(d_in, d_out, d_total, n, NULL, &temp_bytes, NULL, err),
                 MKV_STATUS_OK, "%s", err);
    void *d_temp;
    CUDA_CHECK(cudaMalloc(&d_temp, temp_bytes > 0 ? temp_bytes : 1));
    cr_assert_eq(mkv_cuda_exclusive_scan_i32(d_in, d_out, d_total, n, d_temp, &temp_bytes, NULL, err),
                 MKV_STATUS_OK, "%s", err);
    CUDA_CHECK(cudaDeviceSynchronize());
    int32_t total = -1;
    CUDA_CHECK(cudaMemcpy(got, d_out, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&total, d_total, sizeof total, cudaMemcpyDeviceToHost));

    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; i++) {
        if (got[i] != ref[i] && mismatches++ < 8)
            fprintf(stderr, "scan n=%lld: out[%lld] = %d, reference %d\n", (long long)n,
                    (long long)i, got[i], ref[i]);
    }
    cr_assert_eq(mismatches, 0, "n=%lld: %lld of %lld offsets differ from the reference",
                 (long long)n, (long long)mismatches, (long long)n);
    cr_assert_eq(total, ref_total, "n=%lld: total %d, reference %lld", (long long)n, total,
                 (long long)ref_total);
    cudaFree(d_in);
    cudaFree(d_out);
    cudaFree(d_total);
    cudaFree(d_temp);
    free(in);
    free(ref);
    free(got);
}

Test(gpu_scan, matches_reference_on_awkward_sizes)
{
    GPU_REQUIRE();
    /* 2 * batch * L * H sections for a few batches, plus primes and off-by-ones. */
    const int64_t sizes[] = {1, 2, 31, 33, 255, 257, 1023, 4099, 2 * 1 * 32 * 8, 2 * 17 * 32 * 8,
                             2 * 256 * 32 * 8 - 1, 2 * 512 * 32 * 8, 1000003};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        check_scan(sizes[i], 0x5eed0000u + i, 3);
}

Test(gpu_scan, large_demands_do_not_overflow)
{
    GPU_REQUIRE();
    /* Totals near 2^31 / 2 with large per-section demands (a prompt placement). */
    check_scan(65537, 0xfeedu, 16000);
}

Test(gpu_scan, rejects_bad_arguments)
{
    /* Needs no device: argument checks come first. */
    char err[512] = "";
    size_t temp_bytes = 0;
    cr_assert_eq(mkv_cuda_exclusive_scan_i32(NULL, NULL, NULL, -1, NULL, &temp_bytes, NULL, err),
                 MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_neq(err[0], '\0', "no message for a negative n");
    cr_assert_eq(mkv_cuda_exclusive_scan_i32(NULL, NULL, NULL, 10, NULL, NULL, NULL, err),
                 MKV_STATUS_INVALID_ARGUMENT);
}
