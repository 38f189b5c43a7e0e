#include "gpu_util.h"

#include "runner/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

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

int32_t test_argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

double test_rel_diff(const float *a, const float *b, int32_t n)
{
    double d = 0.0, s = 1e-30;
    for (int32_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)a[i]));
    }
    return d / s;
}

struct mkv_model *test_load_tinystories(const char *shared_dir)
{
    const char *env = getenv("MIXKV_TINYSTORIES");
    char path[1024];
    if (env) snprintf(path, sizeof path, "%s", env);
    else snprintf(path, sizeof path, "%s/models/tinystories-656k", shared_dir);
    struct stat sb;
    if (stat(path, &sb) != 0) cr_skip_test("TinyStories model not found at %s: test skipped", path);
    mkv_model_t *m = NULL;
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_model_load(path, &m, err), MKV_STATUS_OK, "%s", err);
    return m;
}
