#include "gpu_util.h"

int gpu_available(const char **why)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        *why = cudaGetErrorString(e);
        (void)cudaGetLastError();
        return 0;
    }
    if (count == 0) {
        *why = "the runtime sees 0 devices";
        return 0;
    }
    *why = "";
    return 1;
}

void gpu_poison_i32(int32_t *d_ptr, size_t n)
{
    CUDA_CHECK(cudaMemset(d_ptr, 0x7f, n * sizeof(int32_t)));
}

uint64_t test_rand_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int32_t test_rand_range(uint64_t *state, int32_t lo, int32_t hi_inclusive)
{
    uint64_t span = (uint64_t)((int64_t)hi_inclusive - lo + 1);
    return (int32_t)(lo + (int64_t)(test_rand_next(state) % span));
}
