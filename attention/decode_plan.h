/*
 * decode_plan.h — the tensor-core decode path's planning (decode_plan.cu), for decode_cuda.cu:
 * a call's item size and workspace layout, whether it fuses the score write-back and keeps
 * compact logits, and which kernel covers it. C++, internal to the attention layer.
 */
#ifndef MKV_ATTENTION_DECODE_PLAN_H
#define MKV_ATTENTION_DECODE_PLAN_H

#include "attention/decode_cuda.h"
#include "attention/decode_tc.h"

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

/* Alignment of the decode workspace's areas (both paths). */
#define MKV_DECODE_WS_ALIGN 256

namespace mkv_tc_plan {

struct tc_plan {
    int32_t item_tokens, sec_items;
    bool compact;     /* compact logits (calls with scores, fused or separate; plan_for) */
    int64_t lg_n_tok; /* token slots of the logits: regions x (sec_items + 1) x item_tokens */
    int64_t total_ids; /* decode blocks of a one-launch call: (blocks per section + 1) * regions */
    /* Fused one-format calls: each region's last block queued after every other block
     * (tc_args::last_blocks_last), and how many regions, the last in the queue, take items of
     * item_tokens / 2 (0: none; plan_call), and how many, the first in the queue, take them too
     * (decision 96). */
    bool last_blocks_last;
    int32_t tail_regions, head_regions;
    /* Fused calls without a score write-back: the piece size (tc_args::piece_tokens; 0: none;
     * plan_call). */
    int32_t piece_tokens;
    int32_t piece_static; /* tc_args::piece_static (0: none; piece_wave) */
    int32_t wave_blocks; /* tc_args::wave_blocks */
    int32_t merge_split; /* tc_args::merge_split (fused calls; plan_call) */
    bool ready; /* the separate pass's one launch with ready flags (tc_args::ready; plan_call) */
    /* The separate pass's one launch: the high items' tokens (tc_args::hi_item; 0: the item
     * size) and the item slots a region's blocks hold (sep_slots / MKV_TC_SEP_WARPS blocks). */
    int32_t hi_item, sep_slots;
    bool hi_align; /* tc_args::hi_align (plan_call) */
    size_t off_logits, off_part_o, off_part_ml, off_ready, off_counters, off_lse, bytes;
};

/* Whether the call's sizes are within what the kernels index (n_seq and heads within a grid
 * dimension, a head_dim the formats have). */
bool sizes_ok(int32_t n_seq, int32_t H, int32_t G, int32_t d, int32_t max_tokens, int32_t split_tokens);

/* A device attribute of the current device, cached per device (fallback where it cannot be
 * asked). */
int32_t device_attr(cudaDeviceAttr attr, int32_t fallback);

/* The layout of a call (cap_blocks, fused, max_item: plan_for's). */
tc_plan plan_tc(int32_t n_seq, int32_t H, int32_t G, int32_t d, int32_t max_tokens, int32_t split_tokens,
                bool fused, int32_t cap_blocks, int32_t max_item = MKV_TC_MAX_ITEM, int32_t mean_tokens = 0);

/* The region length items are sized from: mean_tokens held to [max_tokens /
 * MKV_DECODE_MEAN_FLOOR, max_tokens] (rounded up), or max_tokens where it is 0. */
int32_t item_basis(int32_t max_tokens, int32_t mean_tokens);

/* The kernel of one layout ({NULL, NULL}: none instantiated), and the one covering both
 * sections of a call in one launch. */
tc_kernel tc_for(const mkv_page_layout_t *l, int32_t head_dim);
tc_kernel tc_one_launch(const mkv_cuda_decode_t *a);

/* The plan of a call and whether it fuses the score write-back; blocks: the one-launch
 * kernel's resident blocks per multiprocessor where it may fuse (0 otherwise). */
tc_plan plan_call(const mkv_cuda_decode_t *a, const tc_kernel &one, bool *fused, int32_t *blocks);

/* The workspace any tensor-core plan of these sizes can need. */
size_t workspace_bytes(int32_t n_seq, int32_t n_heads, int32_t group_size, int32_t head_dim, int32_t max_tokens,
                       int32_t split_tokens);

} // namespace mkv_tc_plan

#endif /* MKV_ATTENTION_DECODE_PLAN_H */
