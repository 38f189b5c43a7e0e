/*
 * backend.c — which backends can run here; element type names and sizes.
 */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#ifdef MKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

const char *mkv_dtype_name(mkv_dtype_t dtype)
{
    switch (dtype) {
    case MKV_DTYPE_F32: return "f32";
    case MKV_DTYPE_F16: return "f16";
    case MKV_DTYPE_BF16: return "bf16";
    default: return "?";
    }
}

size_t mkv_dtype_size(mkv_dtype_t dtype)
{
    switch (dtype) {
    case MKV_DTYPE_F32: return 4;
    case MKV_DTYPE_F16:
    case MKV_DTYPE_BF16: return 2;
    default: return 0;
    }
}

mkv_status_t mkv_report_error(mkv_status_t status, const char *fmt, ...)
{
    if (!fmt) {
        mkv_clear_global_error();
        return status;
    }
    char buf[MKV_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mkv_set_global_error_text(buf);
    return status;
}

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
