/*
 * prefill_cuda.h — causal prefill attention on the GPU for a batch of prompts of different
 * lengths in one launch sequence, in full precision, with the prompt-phase significance of
 * attention/prefill_ref.c (mkv_attn_prefill is the reference: same definition, fp32
 * arithmetic, results within the tolerances stated by tests/gpu/test_prefill_cuda.c).
 *
 * Packing (varlen): sequence j owns rows [seq_start[j], seq_start[j + 1]) of q, k, v and out;
 * its token i is row seq_start[j] + i. GQA: KV head h serves query heads h * G .. h * G + G - 1.
 *
 * Significance: for KV head h and token i of sequence j (length n),
 *   sig_sum[h][seq_start[j] + i] = sum over observers t of max over g of P_g(t attends i),
 * observers being every t >= i, or with obs_window > 0 only t >= max(i, n - obs_window).
 * It is written (not accumulated), as fp32.
 */
#ifndef MKV_ATTENTION_PREFILL_CUDA_H
#define MKV_ATTENTION_PREFILL_CUDA_H

#include "mixkv.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mkv_cuda_prefill {
    int32_t n_seq;            /* 0 .. 65535 */
    const int32_t *seq_start; /* device [n_seq + 1], seq_start[0] = 0, non-decreasing */
    int32_t total_tokens;     /* seq_start[n_seq] (host copy) */
    int32_t max_len;          /* the longest sequence (host): sizes the grid; a longer one
                                 would be cut short (n_seq * max_len < total is refused) */
    int32_t n_heads, group_size, head_dim; /* H, G, d (16, 32, 64, 128 or 256); H * G <= 4096 */
    const uint16_t *q;        /* device fp16 [total][H * G][d] */
    const uint16_t *k, *v;    /* device fp16 [total][H][d] */
    void *out;                /* device [total][H * G][d], element type out_dtype */
    mkv_dtype_t out_dtype;    /* F32, F16 or BF16 */
    float softmax_scale;      /* finite, > 0 */
    int32_t obs_window;       /* 0: every later query observes */
    float *sig_sum;           /* device [H][total], or NULL: no significance (the column
                                 pass is skipped; an engine that keeps no scores) */
    void *workspace;          /* device, mkv_cuda_prefill_workspace_size bytes, 256-byte
                                 aligned (as cudaMalloc returns) */
} mkv_cuda_prefill_t;

/* Workspace for a call (per-row log-sum-exp and whatever the kernels need); 0 for sizes the
 * call refuses. */
size_t mkv_cuda_prefill_workspace_size(int32_t total_tokens, int32_t n_heads, int32_t group_size,
                                       int32_t head_dim);

/* Enqueues the call on `stream`; no host synchronisation. INVALID_ARGUMENT for bad sizes,
 * CUDA_ERROR when a launch fails (message in err, MKV_ERR_LEN bytes). */
mkv_status_t mkv_cuda_prefill(const mkv_cuda_prefill_t *a, void *stream, char *err);

#ifdef __cplusplus
}
#endif

#endif /* MKV_ATTENTION_PREFILL_CUDA_H */
