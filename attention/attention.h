/*
 * attention.h — the reference attention of the CPU backend: decode attention over the
 * mixed-precision pages of a head-region, with significance accumulation, and causal prefill
 * attention over a full-precision prompt. The CUDA kernels (decode_cuda.h) must match these
 * within the tolerances stated by the tests.
 *
 * GQA: KV head h serves query heads h * G .. h * G + G - 1 (Hugging Face's repeat_kv order).
 * Arithmetic is fp32 with a max-subtracted softmax; keys and values are dequantized to fp32.
 */
#ifndef MKV_ATTENTION_ATTENTION_H
#define MKV_ATTENTION_ATTENTION_H

#include "quant/format.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One head-region's pages as decode attention reads them. */
typedef struct mkv_region_pages {
    uint8_t *pool;                   /* page p starts at pool + (int64_t)p * page_bytes */
    int64_t page_bytes;
    const mkv_page_layout_t *lay_hi; /* layout of high-precision pages */
    const mkv_page_layout_t *lay_lo; /* layout of low-precision pages */
    const int32_t *row;              /* [T] the region's page-table row */
    int32_t row_entries;             /* T */
    int32_t n_hi, n_lo;              /* tokens in each section */
} mkv_region_pages_t;

/* Decode attention of G query heads over one head-region. Tokens are visited high section
 * first, then low: high token k is in page row[k / tpp_hi], slot k % tpp_hi; low token k in
 * page row[T - 1 - k / tpp_lo], slot k % tpp_lo. q: [G][d]; out: [G][d].
 * Each stored token's score gains max over g of its attention probability (fp32 add).
 * scratch: at least G * (n_hi + n_lo) + 2 * d floats. Does nothing to out when n_hi + n_lo is
 * 0 (the caller never asks: the current token is always stored). */
void mkv_attn_decode_region(const mkv_region_pages_t *r, int32_t G, int32_t d, const float *q,
                            float softmax_scale, float *out, float *scratch);

/* mkv_attn_decode_region over R head-regions at once (attention/decode_cpu.c), with the same
 * results bit for bit: outputs and score updates. Region i attends with q + i * G * d into
 * out + i * G * d. The work is split into independent items that run(runner, fn, ctx, n) spreads
 * over `parts` threads (the mkv_attn_run_fn contract below; run == NULL runs serially).
 * d must be a multiple of 16 (every supported head dimension is). scratch: at least
 * mkv_attn_decode_batch_scratch(r, R, G, d, parts) floats, 8-byte aligned. */
typedef void (*mkv_attn_range_fn)(void *ctx, int64_t begin, int64_t end, int32_t part);
typedef void (*mkv_attn_run_fn)(void *runner, mkv_attn_range_fn fn, void *ctx, int64_t n);
int64_t mkv_attn_decode_batch_scratch(const mkv_region_pages_t *r, int32_t R, int32_t G,
                                      int32_t d, int32_t parts);
void mkv_attn_decode_batch(const mkv_region_pages_t *r, int32_t R, int32_t G, int32_t d,
                           const float *q, float softmax_scale, float *out, float *scratch,
                           int32_t parts, mkv_attn_run_fn run, void *runner);

/* Causal prefill attention of one layer over a prompt of n tokens, in full precision.
 * q: [n][H * G][d], k, v: [n][H][d], out: [n][H * G][d].
 * sig_sum: [H][n]: for KV head h and token i, the sum over observing queries j of
 * max over the group of P(j attends i). Observers are all j >= i, or with obs_window > 0 only
 * j >= n - obs_window (and j >= i). scratch: at least 2 * n floats.
 * Row j is computed with decode's operation order: given the same K/V values, it equals
 * mkv_attn_decode_region over tokens 0 .. j bit for bit. */
void mkv_attn_prefill(int32_t n, int32_t H, int32_t G, int32_t d, const float *q, const float *k,
                      const float *v, float softmax_scale, int32_t obs_window, float *out,
                      float *sig_sum, float *scratch);

/* The blocked prefill (attention/prefill_ref.c): mkv_attn_prefill's results, bit for bit (the
 * same operations per row, in the same order), computed 16 query rows at a time and split into
 * independent items that the caller's threads run. run(runner, fn, ctx, n) must call
 * fn(ctx, begin, end, part) over a partition of [0, n), part < parts naming the thread (its
 * scratch); run == NULL runs serially. scratch: mkv_attn_prefill_blocked_scratch floats. */
int64_t mkv_attn_prefill_blocked_scratch(int32_t n, int32_t H, int32_t G, int32_t d, int32_t parts);
void mkv_attn_prefill_blocked(int32_t n, int32_t H, int32_t G, int32_t d, const float *q,
                              const float *k, const float *v, float softmax_scale,
                              int32_t obs_window, float *out, float *sig_sum, float *scratch,
                              int32_t parts, mkv_attn_run_fn run, void *runner);

/* How many queries have observed the token at position pos when the sequence holds N tokens,
 * of which the first prompt_len were the prompt: prompt queries as prefill counts them, plus
 * every generated query (positions prompt_len .. N - 1, each observes all earlier tokens and
 * itself). Significance = score sum / observers. */
static inline int32_t mkv_observers(int32_t pos, int32_t prompt_len, int32_t N, int32_t obs_window)
{
    if (pos >= prompt_len) return N - pos;
    int32_t first = pos;
    if (obs_window > 0 && prompt_len - obs_window > first) first = prompt_len - obs_window;
    return (prompt_len - first) + (N - prompt_len);
}

#ifdef __cplusplus
}
#endif

#endif /* MKV_ATTENTION_ATTENTION_H */
