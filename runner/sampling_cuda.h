/*
 * sampling_cuda.h — each row's next token chosen on the device from fp32 logits that are
 * already there: greedy, or temperature and top-p with a uniform the host drew from the
 * request's generator (mixkv.h, mkv_forward_t's decode_sample). The reference is the library's
 * host sampler (engine/sampling.h, mkv_sample_with_u): the same float probabilities, the same
 * order (descending probability, ties to the lower id, for top-p; id order otherwise), double
 * sums in another order; tests/gpu/test_sampling_cuda.c compares the two.
 */
#ifndef MKV_RUNNER_SAMPLING_CUDA_H
#define MKV_RUNNER_SAMPLING_CUDA_H

#include "mixkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One row's parameters, as the host uploads them (16 bytes, one copy for a batch). */
typedef struct mkv_sample_row {
    double u;          /* [0, 1): the row's uniform (unused when greedy) */
    float temperature; /* <= 0: greedy (the lowest id among the largest logits) */
    float top_p;       /* in (0, 1): nucleus; otherwise every token */
} mkv_sample_row_t;

/* next [n] (device) = the token of each row of logits [n][vocab] (device, fp32, finite) under
 * rows [n] (device): one 1024-thread block per row on stream (a cudaStream_t; NULL: the
 * default stream), asynchronous. Sampled rows' logits are overwritten with their
 * probabilities. Errors: INVALID_ARGUMENT (n or vocab < 1, a null pointer), CUDA_ERROR (the
 * launch), with the reason in err. */
mkv_status_t mkv_cuda_sample(float *logits, int32_t n, int32_t vocab, const mkv_sample_row_t *rows, int32_t *next,
                             void *stream, char *err);

#ifdef __cplusplus
}
#endif

#endif /* MKV_RUNNER_SAMPLING_CUDA_H */
