/*
 * decode_fast.h — internal interface of the tensor-core decode kernels (CUDA only; the public
 * entry point is mkv_cuda_decode in decode_cuda.h, which chooses between these and the generic
 * kernels of decode_cuda.cu). Design and numerics: docs/decode-kernel.md, "Version 2".
 *
 * One kernel per (key bits, value bits, head_dim), each in its own generated translation unit
 * (CMake's MIXKV_DECODE_FAST_FORMATS and MIXKV_DECODE_FAST_DIMS list the instantiated ones).
 * A warp takes one item: up to item_tokens consecutive tokens of one section (high or low) of
 * one head-region, for all G <= 8 query heads of the group at once, and writes the item's
 * unnormalised partial output, running max and sum to the workspace together with every
 * token's logits. fast_finalize then merges the items of each head-region into out and adds
 * each token's probability (the maximum over the group) to its score slot.
 */
#ifndef MKV_ATTENTION_DECODE_FAST_H
#define MKV_ATTENTION_DECODE_FAST_H

#include "quant/format.h"

#include <cuda_runtime.h>

#include <stdint.h>

#define MKV_FAST_WARPS 4       /* warps (items) per block */
#define MKV_FAST_MAX_G 8       /* query heads per group: the n = 8 side of an m16n8k16 mma */
#define MKV_FAST_MIN_ITEM 64   /* item sizes are powers of two in [64, 4096] */
#define MKV_FAST_MAX_ITEM 4096

/* Where a section's segments sit in its pages (only group-count-1 layouts take this path). */
struct fast_section {
    int32_t tpp;                          /* tokens per page */
    int64_t off_key, off_key_meta, off_value, off_value_meta, off_score;
};

struct fast_args {
    const uint8_t *pool;
    int64_t page_bytes;
    const int32_t *table; /* [regions][T] */
    const int32_t *n_hi, *n_lo;
    int32_t T;
    const int64_t *regions; /* [n_seq][H] */
    int32_t H, G;
    int32_t max_tokens;  /* token counts are clamped to it, as in the generic kernels */
    int32_t item_tokens; /* tokens per item, a power of two >= 64 */
    int32_t sec_items;   /* ceil(max_tokens / item_tokens): items per section, at most */
    fast_section sec[2]; /* high, low */
    const float *q;      /* [n_seq][H * G][d] */
    float *out;          /* [n_seq][H * G][d] */
    float softmax_scale;
    float *logits;  /* [n_seq * H][max_tokens][G], log2 units (already times log2 e) */
    float *part_o;  /* [n_seq * H][2 * sec_items][G][d] unnormalised partial outputs */
    float *part_ml; /* [n_seq * H][2 * sec_items][G][2] partial max (log2 units), sum */
    /* Per launch: which sections this launch covers (1 high, 2 low, 3 both) and the blocks of
     * one section along grid x. */
    int32_t sec_mask, blocks_per_sec;
};

typedef cudaError_t (*fast_launch_fn)(const fast_args &a, dim3 grid, cudaStream_t stream);

/* The instantiated kernel for a format and head_dim, or NULL. */
fast_launch_fn mkv_fast_lookup(int32_t key_bits, int32_t value_bits, int32_t head_dim);

/* Merge and score write-back after the item kernels; head_dim d. */
cudaError_t mkv_fast_finalize(const fast_args &a, int32_t d, int32_t n_seq, cudaStream_t stream);

/* Tokens per item for a call of this size on a GPU of sm_count multiprocessors (enough items
 * to fill it several times over). */
int32_t mkv_fast_item_tokens(int32_t n_seq, int32_t H, int32_t max_tokens, int32_t sm_count);

#endif /* MKV_ATTENTION_DECODE_FAST_H */
