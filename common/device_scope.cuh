/*
 * device_scope.cuh — makes a cache's CUDA device current for the length of one call and gives
 * the caller back its own (every CUDA entry point of memmgr/ and engine/ opens one).
 */
#ifndef MKV_COMMON_DEVICE_SCOPE_CUH
#define MKV_COMMON_DEVICE_SCOPE_CUH

#include <cuda_runtime.h>

struct device_scope {
    int prev;
    explicit device_scope(int device)
    {
        if (cudaGetDevice(&prev) != cudaSuccess) prev = device;
        if (prev != device) cudaSetDevice(device);
    }
    ~device_scope() { cudaSetDevice(prev); }
};

#endif /* MKV_COMMON_DEVICE_SCOPE_CUH */
