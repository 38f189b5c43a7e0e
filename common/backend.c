/*
 * backend.c — which backends can run here.
 */
#include "common/error.h"

#ifdef MKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

const char *mkv_backend_name(mkv_backend_t backend)
{
    switch (backend) {
    case MKV_BACKEND_CPU: return "cpu";
    case MKV_BACKEND_CUDA: return "cuda";
    }
    return "?";
}

mkv_status_t mkv_backend_available(mkv_backend_t backend, int *out_available)
{
    mkv_clear_global_error();
    if (!out_available)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_backend_available: null out");
    switch (backend) {
    case MKV_BACKEND_CPU: *out_available = 1; return MKV_STATUS_OK;
    case MKV_BACKEND_CUDA: {
        *out_available = 0;
#ifdef MKV_HAVE_CUDA
        int count = 0;
        /* No driver or no device is an answer (0), not an error. */
        if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) *out_available = 1;
        else (void)cudaGetLastError();
#endif
        return MKV_STATUS_OK;
    }
    }
    return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "backend %d is not a valid mkv_backend_t",
                           (int)backend);
}
