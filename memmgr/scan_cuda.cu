/*
 * scan_cuda.cu — the device exclusive prefix sum (CUB), matched bit for bit against
 * mkv_exclusive_scan_i32 by tests/gpu/test_scan.c. The GPU memory manager (cuda_mm.cu) runs its
 * coordination phase through this entry point.
 */
#include "memmgr/scan.h"

#include "common/error.h"

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

static __global__ void scan_total_kernel(const int32_t *in, const int32_t *out, int32_t *total,
                                         int n)
{
    *total = n > 0 ? out[n - 1] + in[n - 1] : 0;
}

static mkv_status_t launch_scan(const int32_t *d_in, int32_t *d_out, int32_t *d_total, int n,
                                void *d_temp, size_t *temp_bytes, cudaStream_t stream, char *err)
{
    cudaError_t e = cub::DeviceScan::ExclusiveSum(d_temp, *temp_bytes, d_in, d_out, n, stream);
    if (e != cudaSuccess)
        return mkv_fail(err, MKV_STATUS_CUDA_ERROR, "cub::DeviceScan::ExclusiveSum: %s",
                        cudaGetErrorString(e));
    if (d_temp == NULL) return MKV_STATUS_OK; /* size query only */
    scan_total_kernel<<<1, 1, 0, stream>>>(d_in, d_out, d_total, n);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return mkv_fail(err, MKV_STATUS_CUDA_ERROR, "scan_total_kernel launch: %s",
                        cudaGetErrorString(e));
    return MKV_STATUS_OK;
}

extern "C" mkv_status_t mkv_cuda_exclusive_scan_i32(const int32_t *d_in, int32_t *d_out,
                                                    int32_t *d_total, int64_t n, void *d_temp,
                                                    size_t *temp_bytes, void *stream, char *err)
{
    if (!temp_bytes || n < 0 || n > INT32_MAX || (d_temp && (!d_out || !d_total || (n > 0 && !d_in))))
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "mkv_cuda_exclusive_scan_i32: bad arguments (n = %lld)", (long long)n);
    return launch_scan(d_in, d_out, d_total, (int)n, d_temp, temp_bytes, (cudaStream_t)stream, err);
}
