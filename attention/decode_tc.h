/*
 * decode_tc.h — internal interface of the tensor-core decode kernels (CUDA only; the public
 * entry point is mkv_cuda_decode in decode_cuda.h, which chooses between these and the generic
 * kernels of decode_generic.cu). Design and numerics: docs/decode-kernel.md, "The tensor-core
 * kernels".
 *
 * One kernel per (key bits, value bits, head_dim), each in its own generated translation unit
 * (CMake's MIXKV_DECODE_TC_FORMATS and MIXKV_DECODE_TC_DIMS list the instantiated ones).
 * A warp takes one item: up to item_tokens consecutive tokens of one section (high or low) of
 * one head-region, for all G <= 8 query heads of the group at once, and writes the item's
 * unnormalised partial output, running max and sum to the workspace together with every
 * token's logits. Then the items of each head-region are merged into out and each token's
 * probability (the maximum over the group) is added to its score slot: either inside the same
 * kernel (fused: the region's last block merges, and its blocks become score jobs for
 * whichever block is free), or by a separate pass, mkv_tc_finalize.
 *
 * The kernel template is tc_decode.cuh (its parts are listed there); the device helpers the
 * finalize kernel shares with it (merge, token probabilities, score slots) are tc_merge.cuh's.
 */
#ifndef MKV_ATTENTION_DECODE_TC_H
#define MKV_ATTENTION_DECODE_TC_H

#include "attention/decode_tuning.h"
#include "quant/format.h"
#include "quant/half.h"

#include <cuda_runtime.h>

#include <stdint.h>

#define MKV_TC_WARPS 4         /* warps (items) per block */
/* Warps (items) per block of the separate pass, 1, 2 or 4; overridable at build time
 * (-DMKV_TC_SEP_WARPS=1 in CMAKE_CUDA_FLAGS) for experiments: fewer measured faster on some
 * shapes and slower on others (docs/decode-kernel.md, "Measured and not adopted"). */
#ifndef MKV_TC_SEP_WARPS
#define MKV_TC_SEP_WARPS 4
#endif
#if MKV_TC_SEP_WARPS != 1 && MKV_TC_SEP_WARPS != 2 && MKV_TC_SEP_WARPS != 4
#error "MKV_TC_SEP_WARPS is 1, 2 or 4"
#endif
#define MKV_TC_MAX_G 8         /* query heads per group: the n = 8 side of an m16n8k16 mma */
#define MKV_TC_MIN_ITEM 32     /* item sizes: multiples of 32 in [32, 4096] */
#define MKV_TC_MAX_ITEM 4096

/* Where a section's segments sit in its pages (metadata group g of slot t at off_*_meta +
 * (g tpp + t) 4). */
struct tc_section {
    int32_t tpp;                          /* tokens per page */
    int64_t off_key, off_key_meta, off_value, off_value_meta, off_score;
};

struct tc_args {
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
    tc_section sec[2];   /* high, low */
    const float *q;      /* [n_seq][H * G][d] */
    float *out;          /* [n_seq][H * G][d] */
    uint16_t *out16;     /* or, when non-null, here in fp16 (bf16 with out_bf16) */
    int32_t out_bf16;
    float softmax_scale;
    float *logits;  /* [n_seq * H][sec_items + 1][item_tokens][G]: item slot s of a region
                       holds its item's logits, log2 units (already times log2 e) */
    float *part_o;  /* [n_seq * H][2 * sec_items][G][d] unnormalised partial outputs */
    float *part_ml; /* [n_seq * H][2 * sec_items][G][2] partial max (log2 units), sum */
    /* Per launch: which sections this launch covers (1 high, 2 low, 3 both) and its blocks
     * along grid x per region: blocks_per_sec for one section; blocks_per_sec + 1 for both,
     * the high section's blocks first, then the low one's, then none (locate). */
    int32_t sec_mask, blocks_per_sec, grid_x;
    /* Grid order of the separate pass and the finalize pass: 0, (blocks, H, n_seq); 1,
     * (H, n_seq, blocks), so that every region's first blocks are dispatched before any
     * region's later (often empty) ones. Needs blocks <= 65535 (grid z). */
    int32_t x_last;
    /* Fused score write-back (one launch covering both sections only; a persistent grid):
     * counters [n_rs + 4 + total_ids], all zeroed by a kernel ahead of it (mkv_tc_zero_counters): per region
     * arrivals; next decode id, score jobs taken, published, ids done; then the score jobs
     * (an entry holds a decode block id + 1 once published). lse [n_rs][G], each region's
     * log2-sum-exp per head. discard: whether to drop read logits from L2 (the workspace is
     * 128-byte aligned). */
    int32_t fused, discard;
    int32_t keep_logits; /* 0: no score write-back (mkv_cuda_decode_t::no_scores): no logits
                            stored, no score jobs, the finalize pass only merges */
    int32_t n_rs; /* n_seq * H */
    int32_t total_ids;
    /* The fused one-format kernel's queue order (last_blocks_last, queue_block): every region's
     * blocks but its last first, then every region's last block (empty unless both its sections
     * end in part blocks: a region of one section's always is), so that the ids most often empty
     * are handed out as the queue runs dry, not between other blocks' work. Where it is set,
     * regions tail_rs and up (the last in the queue; n_rs: none) take items of item_tokens / 2,
     * tail_gx blocks each, so that the queue ends in short blocks (only without a score
     * write-back, whose logits' slots follow the item size); their blocks' parts fit a region's
     * 2 sec_items part slots (fused parts are a block's). Regions below head_rs (the first in
     * the queue; 0: none) take them too (decision 96), so that the first wave's blocks do not
     * all end together. */
    int32_t last_blocks_last, tail_rs, tail_gx, head_rs;
    /* Where last_blocks_last and > 0 (calls in pieces of few regions; tail_rs n_rs): the queue
     * holds every region's first wave_blocks blocks first (region by region), then their other
     * blocks but the last block-major (block wave_blocks of every region, then the next), so
     * that one wave streams every region and later blocks join regions still running. */
    int32_t wave_blocks;
    /* Pieces (fused one-format calls without a score write-back, where the kernel has them:
     * tc_kernel::pieces_blocks_per_sm; 0: none): a block's warps take their region's tokens
     * piece_tokens at a time (a multiple of 16), each warp its first piece at the block's
     * start (piece 4 x + w of block x), then further pieces from the region's counter
     * (counters[n_rs + 4 + rs], in place of the score jobs), its softmax state carried from
     * piece to piece, until the region's pieces are taken; so that a region's blocks end
     * together. Both sections in one layout (sec[0] as sec[1]). */
    int32_t piece_tokens;
    /* Where > 0 (decision 102): each of a region's warps first takes piece_static per mille of
     * its even share of the region's high tokens as one piece (locate_pieces), then pieces of
     * piece_tokens from the counter, the rest of the high section and then the low one. */
    int32_t piece_static;
    /* The fused kernel's blocks that merge a region's parts into out (0 or 1: its last block
     * alone): where > 1, the region's last min(merge_split, arrivals) blocks to arrive each
     * merge a slice of its G d outputs, those before the last waiting for it. Only where every
     * block of the call is resident at once (a grid of total_ids blocks), so that the blocks
     * awaited are running (decision 105). */
    int32_t merge_split;
    int32_t *counters;
    float *lse;
    /* Compact logits (fused calls, where G >= 2; decision 89; every subtile but an
     * item's last is 16 tokens, so a softmax step covers a fixed STEP tokens), in place of
     * logits: token
     * x's probability relative to its step's maximum logit R, y = 2^(l - R) in [0, 1], as
     * 20-bit fixed point (code = round(y MKV_TC_YSCALE)), two heads per pair j < (G + 1) / 2,
     * pair-major: lg_a[j][x] the codes' low 16 bits (head 2j in the low half), lg_b[j][x] their
     * high 4 bits (head 2j in the low nibble), lg_r[j][x / MKV_TC_R_GRID][2] the steps' R
     * (every 16-token slot of a step holds its R). x = item slot *
     * item_tokens + token in the item, lg_n = slots * item_tokens (every region's). */
    int32_t compact;
    int64_t lg_n;
    uint32_t *lg_a;
    uint8_t *lg_b;
    float *lg_r;
    /* The separate pass's one launch (sec_mask 3), where non-null: [n_seq * H][2 * sec_items]
     * flags, a part slot's 1 once its item's parts and logits are written (release), set to 0
     * by the item's block before it releases the finalize kernel, which waits on each region's
     * flags instead of the decode kernel's end (its blocks start on regions done while the
     * decode kernel's last blocks run). */
    int32_t *ready;
    /* The separate pass's one launch (sec_mask 3), where hi_item > 0: a region's high items
     * take hi_item tokens (its low ones item_tokens) where its items then number at most
     * hi_cap (the launch's blocks a region times MKV_TC_SEP_WARPS, within the 2 sec_items part
     * slots), so that its high items, more bytes a token, end with its low ones in calls of a
     * block a multiprocessor (decision 88). The logits keep item_tokens' layout (section_of_region): a region's
     * high tokens from slot 0, its low ones from slot ceil(hi / item_tokens). */
    int32_t hi_item, hi_cap;
    /* The separate pass's one launch (sec_mask 3), where 1: a region's low items start at a
     * block of their own (item slot k of block x, warp w: x W + w less the high items' padding
     * to a whole block), so that no block runs both formats; the part slots stay contiguous
     * (high items, then low ones). Calls of at most a block a multiprocessor without ready
     * flags or hi_item (decision 109: a block of both formats had started its items 0.3 to
     * 0.6 us late). */
    int32_t hi_align;
    /* Timeline stamps (tc_trace.cuh; MKV_TC_TRACE builds only, else ignored): null for none. */
    unsigned long long *trace;
};

/* The records a trace buffer holds (tc_trace.cuh): 4 + 4 MKV_TC_TRACE_CAP words. */
#define MKV_TC_TRACE_CAP (1 << 20)

/* The trace buffer every call's tc_args::trace takes (null: none); set by bench_attention
 * --trace in MKV_TC_TRACE builds. */
extern unsigned long long *mkv_tc_trace_buffer;

/* Tokens per slot of the compact logits' step maxima (lg_r): every 16-token slot of a softmax
 * step holds the step's R, so that a reader finds a token's at x / 16 whatever the step. */
#define MKV_TC_R_GRID 16

/* The compact logits' fixed-point scale: y = code / MKV_TC_YSCALE (2^20 - 2, so that y up to
 * 1 plus the rounding of 2^x still rounds below 2^20). */
#define MKV_TC_YSCALE 1048574.0f

/* Where the compact logits of n_tok token slots at group size G sit from lg_a: lg_b and lg_r
 * at byte offsets off_b and off_r (each array 256-byte aligned), bytes in all (a step maximum
 * per MKV_TC_R_GRID tokens). */
struct tc_compact_layout {
    size_t off_b, off_r, bytes;
};

inline tc_compact_layout mkv_tc_compact_layout(size_t n_tok, int32_t G)
{
    const size_t g2 = (size_t)(G + 1) / 2, al = 255;
    tc_compact_layout l;
    l.off_b = (n_tok * g2 * 4 + al) & ~al;
    l.off_r = l.off_b + ((n_tok * g2 + al) & ~al);
    l.bytes = l.off_r + (n_tok / 16 + 1) * g2 * 8;
    return l;
}

typedef cudaError_t (*tc_launch_fn)(const tc_args &a, dim3 grid, cudaStream_t stream);

struct tc_kernel {
    tc_launch_fn launch;
    int (*blocks_per_sm)(void); /* resident blocks per multiprocessor (0 on error) */
    int (*pieces_blocks_per_sm)(void); /* its variant in pieces (tc_args::piece_tokens), or null */
    int (*sep_blocks_per_sm)(void);    /* the separate pass's kernel (0 on error), or null */
};

/* The instantiated kernel for a format, head_dim and quantization groups per key and per value
 * vector ({NULL, NULL} if none): one group a side, or the library's defaults where the kernel
 * covers them (tc_subtile.cuh, groups_supported). */
tc_kernel mkv_tc_lookup(int32_t key_bits, int32_t value_bits, int32_t head_dim, int32_t key_groups,
                        int32_t value_groups);

/* The instantiated two-format kernel for a high section of the format (hk bits, hv bits, hkg and
 * hvg groups) and a low section of (lk, lv, lkg, lvg) at head_dim: one launch for both
 * sections where the formats differ ({NULL, NULL} if none; CMake's MIXKV_DECODE_TC_MIXES
 * lists the instantiated pairs). */
tc_kernel mkv_tc_lookup_mix(int32_t hk, int32_t hv, int32_t hkg, int32_t hvg, int32_t lk, int32_t lv,
                            int32_t lkg, int32_t lvg, int32_t head_dim);

/* Launches kernel k with programmatic stream serialization: it may start before the kernel
 * ahead of it in the stream has ended (tc_ptx.cuh, griddep_wait). */
template <typename... P, typename... A>
cudaError_t mkv_tc_launch_pdl(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A... args)
{
    cudaLaunchConfig_t c = {};
    c.gridDim = grid, c.blockDim = block, c.dynamicSmemBytes = smem, c.stream = stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at, c.numAttrs = 1;
    return cudaLaunchKernelEx(&c, k, args...);
}

/* Zeroes the fused kernel's words counters (tc_args::counters) ahead of it, letting it start
 * at once (it waits for this kernel before its first use of them; decode_tc_common.cu). */
cudaError_t mkv_tc_zero_counters(int32_t *counters, size_t words, cudaStream_t stream);

/* Merge and score write-back after the item kernels; head_dim d (decode_tc_finalize.cu). */
cudaError_t mkv_tc_finalize(const tc_args &a, int32_t d, int32_t n_seq, cudaStream_t stream);

/* The blocks its merge of each of n_rs head-regions takes (G query heads, head_dim d, at most
 * sec_items items a section): the outputs cut in slices in small calls, a power of two, or 3
 * where that loads the items in one batch and 4 would be needed for it otherwise
 * (decode_tc_finalize.cu; mkv_tc_merge_blocks_override's where set). */
int32_t mkv_tc_merge_blocks(int32_t G, int32_t d, int64_t n_rs, int32_t sec_items);

/* Tokens per item for a call of this size on a GPU of sm_count multiprocessors (enough items
 * to fill it several times over). */
int32_t mkv_tc_item_tokens(int32_t n_seq, int32_t H, int32_t max_tokens, int32_t sm_count);

#endif /* MKV_ATTENTION_DECODE_TC_H */
