/*
 * gpu_util.h — what every GPU test needs: a clean skip when there is no device, checked CUDA
 * calls, poisoned buffers, seeded random inputs. CUDA is initialised inside each test (never
 * before main), because Criterion forks a process per test; run GPU suites with --jobs 1.
 */
#ifndef MKV_TESTS_GPU_UTIL_H
#define MKV_TESTS_GPU_UTIL_H

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

/* 1 when a CUDA device is usable; otherwise 0 and *why says why (no driver, no device). */
int gpu_available(const char **why);

#define GPU_REQUIRE()                                                                          \
    do {                                                                                       \
        const char *why_;                                                                      \
        if (!gpu_available(&why_)) cr_skip_test("no CUDA device (%s): GPU test skipped", why_); \
    } while (0)

#define CUDA_CHECK(expr)                                                                       \
    do {                                                                                       \
        cudaError_t e_ = (expr);                                                               \
        cr_assert_eq(e_, cudaSuccess, "%s failed: %s", #expr, cudaGetErrorString(e_));        \
    } while (0)

/* Fills n int32 with 0x7fc00000-style poison (a NaN bit pattern, and an absurd integer). */
void gpu_poison_i32(int32_t *d_ptr, size_t n);

/* splitmix64: a small seeded generator for test inputs. */
uint64_t test_rand_next(uint64_t *state);
int32_t test_rand_range(uint64_t *state, int32_t lo, int32_t hi_inclusive);

/* The first index of the largest of x[n]; the largest |a - b| over n values relative to the
 * largest |a| (logit comparisons). */
int32_t test_argmax(const float *x, int32_t n);
double test_rel_diff(const float *a, const float *b, int32_t n);

/* The TinyStories model from $MIXKV_TINYSTORIES (the GPU machine does not see ../shared) or
 * shared_dir/models/tinystories-656k, as an mkv_model_t (runner/model.h); skips the test
 * without it. */
struct mkv_model;
struct mkv_model *test_load_tinystories(const char *shared_dir);

#endif
