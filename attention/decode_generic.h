/*
 * decode_generic.h — the generic fp32 decode kernels (decode_generic.cu) as mkv_cuda_decode
 * (decode_cuda.cu) calls them, and the launch check both use. Internal to the library.
 */
#ifndef MKV_ATTENTION_DECODE_GENERIC_H
#define MKV_ATTENTION_DECODE_GENERIC_H

#include "attention/decode_cuda.h"

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

/* The generic kernels' workspace for a call of these sizes (split_tokens 0: their own split). */
size_t mkv_decode_generic_workspace(int32_t n_seq, int32_t n_heads, int32_t group_size, int32_t head_dim,
                                    int32_t max_tokens, int32_t split_tokens);

/* A validated call (mkv_cuda_decode's checks passed, n_seq and max_tokens > 0) on the generic
 * kernels: split, merge and (unless no_scores) score kernels on stream. */
mkv_status_t mkv_decode_generic(const mkv_cuda_decode_t *a, cudaStream_t stream, char *err);

/* MKV_STATUS_OK, or MKV_STATUS_CUDA_ERROR with err naming what failed to launch: e is what a
 * launcher returned (cudaSuccess for a bare <<<>>> launch, whose error is then read). */
mkv_status_t mkv_decode_launched(const char *what, char *err, cudaError_t e = cudaSuccess);

#endif /* MKV_ATTENTION_DECODE_GENERIC_H */
