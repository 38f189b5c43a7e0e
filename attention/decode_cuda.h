/*
 * decode_cuda.h — decode attention on the GPU over mixed-precision pages: the kernel
 * family that mkv_attn_decode_region (attention/decode_ref.c) is the reference of. For each
 * sequence and KV head: high pages, then low pages; dequantization fused into the dot products
 * and the value accumulation; each page read once per GQA group; long sequences split across
 * thread blocks and merged; every stored token's score gains its attention probability, the
 * maximum over the group (race-free with splits). Any format of quant/format.h.
 */
#ifndef MKV_ATTENTION_DECODE_CUDA_H
#define MKV_ATTENTION_DECODE_CUDA_H

#include "quant/format.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mkv_cuda_decode {
    uint8_t *pool;            /* device: page p at pool + (int64_t)p * page_bytes */
    int64_t page_bytes;
    mkv_page_layout_t lay_hi, lay_lo;
    const int32_t *table;     /* device [regions][T] page-table rows (memmgr/state.h layout) */
    const int32_t *n_hi;      /* device [regions] */
    const int32_t *n_lo;      /* device [regions] */
    int32_t row_entries;      /* T */
    const int64_t *regions;   /* device [n_seq][H]: the head-region of sequence j, KV head h */
    int32_t n_seq, n_heads, group_size, head_dim; /* H, G, d */
    int32_t max_tokens;       /* an upper bound of n_hi + n_lo over the call (sizes splits) */
    const float *q;           /* device [n_seq][H * G][d] */
    float *out;               /* device [n_seq][H * G][d] */
    float softmax_scale;
    int32_t split_tokens;     /* tokens per thread block (per warp item on the tensor-core
                                 path, rounded up to a multiple of 32); 0: chosen */
    void *workspace;          /* device, mkv_cuda_decode_workspace_size bytes */
    int32_t kernel;           /* mkv_cuda_decode_kernel_t */
    int32_t scores;           /* mkv_cuda_decode_scores_t (tensor-core path) */
    int32_t logits;           /* mkv_cuda_decode_logits_t (fused write-back) */
    uint16_t *out16;          /* device [n_seq][H * G][d], or NULL: when set, the outputs are
                                 written here rounded to fp16 (bf16 when out_bf16) and out is
                                 not used (saves an engine with 16-bit activations a pass) */
    int32_t out_bf16;
    int32_t no_scores;        /* 1: no score write-back: the score slots are left untouched
                                 and no logits are kept (an engine that never compresses:
                                 the full-precision baseline); `scores` then only says where
                                 the items are merged (fused: inside the decode kernel) */
    int32_t mean_tokens;      /* 0, or a hint: the expected mean of n_hi + n_lo over the call's
                                 regions. max_tokens bounds the longest region (in serving, the
                                 longest sequence plus a graph's horizon: about twice the mean
                                 stored one), and the tensor-core path sizes its items from
                                 this instead, held to [max_tokens / MKV_DECODE_MEAN_FLOOR,
                                 max_tokens]. Any value gives the same results, and
                                 mkv_cuda_decode_workspace_size covers every value. */
} mkv_cuda_decode_t;

/* The least mean_tokens a plan takes, as a fraction of max_tokens: 1 / this. */
#define MKV_DECODE_MEAN_FLOOR 4

/* Which kernels a call uses. AUTO takes the tensor-core kernels where they apply (head_dim 64
 * or 128, G <= 8, one quantization group a side or the default groups, both formats
 * instantiated: docs/decode-kernel.md) and the generic fp32 kernels elsewhere; TENSOR fails
 * with UNSUPPORTED where they do not. Both run a call whose sections differ in format in one
 * launch where that pair has a two-format kernel (MIXKV_DECODE_TC_MIXES), else in one
 * launch per section; TENSOR_PER_SECTION is TENSOR with one launch per section always (for
 * comparison). Every AUTO threshold below is in one table, attention/decode_tuning.h, with
 * its origin. */
typedef enum mkv_cuda_decode_kernel {
    MKV_DECODE_KERNEL_AUTO = 0,
    MKV_DECODE_KERNEL_GENERIC = 1,
    MKV_DECODE_KERNEL_TENSOR = 2,
    MKV_DECODE_KERNEL_TENSOR_PER_SECTION = 3,
} mkv_cuda_decode_kernel_t;

/* How the tensor-core path writes the scores back. SEPARATE: a second kernel reads every
 * token's logits back from the workspace once the decode kernel is done. FUSED (where one
 * launch covers the call: both sections of one format, or a two-format kernel): inside the decode kernel, a persistent
 * grid whose blocks also take "score jobs" for head-regions that are complete. AUTO: FUSED
 * where it measured faster (small calls, counted in token-heads n_seq * n_heads * max_tokens;
 * long regions, by max_tokens; K16V16 in large calls), SEPARATE elsewhere
 * (mkv_decode_tuning's fuse_*, docs/decode-kernel.md). */
typedef enum mkv_cuda_decode_scores {
    MKV_DECODE_SCORES_AUTO = 0,
    MKV_DECODE_SCORES_SEPARATE = 1,
    MKV_DECODE_SCORES_FUSED = 2,
} mkv_cuda_decode_scores_t;

/* How a score write-back keeps the logits from the decode to the score jobs, fused or in the
 * separate finalize pass (through the workspace, so mostly through DRAM). FP32: 4 bytes per
 * token and query head. COMPACT, where G >= 2 (else FP32): 20-bit fixed-point probabilities
 * relative to each softmax step's maximum, about 11 bytes per token at G = 4 instead of 16,
 * for ~65 more instructions per 16 tokens and warp; each probability added to a score then
 * carries an absolute error of at most 2^-21 more. The separate pass always keeps FP32 (its
 * kernel is built without the compact form, which as an untaken branch in its item loop cost
 * it 2 to 4%: docs/decode-kernel.md, decision 89); COMPACT and AUTO choose for fused calls.
 * AUTO, fused: COMPACT on GPUs whose DRAM is slow for their multiprocessors (fewer peak DRAM
 * bytes per SM cycle than mkv_decode_tuning::compact_max_dram_bytes_per_sm_cycle;
 * mkv_cuda_dram_bytes_per_sm_cycle), where the kernel waits on DRAM and fewer logit bytes pay;
 * FP32 on faster ones, where it waits on instruction issue and the extra instructions cost
 * more than they save. */
typedef enum mkv_cuda_decode_logits {
    MKV_DECODE_LOGITS_AUTO = 0,
    MKV_DECODE_LOGITS_FP32 = 1,
    MKV_DECODE_LOGITS_COMPACT = 2,
} mkv_cuda_decode_logits_t;

/* The current device's peak DRAM bytes per multiprocessor clock cycle, all multiprocessors
 * together (2 x memory clock x bus width / 8 over SMs x SM clock); 0 if unknown. */
double mkv_cuda_dram_bytes_per_sm_cycle(void);

/* Whether a call with these layouts and sizes takes the tensor-core kernels under AUTO. */
int mkv_cuda_decode_uses_tensor(const mkv_page_layout_t *lay_hi, const mkv_page_layout_t *lay_lo,
                                int32_t group_size, int32_t head_dim);

/* Whether a call with these arguments (pointers unused) writes its scores back inside the
 * decode kernel (mkv_cuda_decode_scores_t above). */
int mkv_cuda_decode_fuses_scores(const mkv_cuda_decode_t *a);

/* Whether such a call keeps its logits for the score write-back in the compact 20-bit form
 * (mkv_cuda_decode_logits_t above; fused calls only). */
int mkv_cuda_decode_compact_logits(const mkv_cuda_decode_t *a);

/* How many of such a call's regions (the last of its fused kernel's queue) take items of half
 * the size, so that the call ends in short ones (decode_tuning.h, tail_min_waves); 0 for none.
 * Depends on the current device (its multiprocessors and the kernel's occupancy). */
int32_t mkv_cuda_decode_tail_regions(const mkv_cuda_decode_t *a);
/* How many of such a call's regions (the first of its queue) take items of half the size, so
 * that its first wave's blocks end at two times (decision 96; decode_tuning.h, head_per_mille);
 * 0 for none. Depends on the current device, as above. */
int32_t mkv_cuda_decode_head_regions(const mkv_cuda_decode_t *a);

/* The tokens a warp takes at a time in such a call where its fused kernel runs in pieces
 * (without a score write-back, one format in one layout, K16V16: docs/decode-kernel.md,
 * "Pieces"); 0 where it does not. Depends on the current device, as above. */
int32_t mkv_cuda_decode_piece_tokens(const mkv_cuda_decode_t *a);

/* The piece size such calls take (above), for measuring it (bench_attention --pieces) and
 * testing it: 0, the library's choice (the default); -1, none; else that many tokens,
 * rounded up to a multiple of 16. Process-wide and not thread-safe: a knob for tools and
 * tests, not for engines. */
extern int32_t mkv_tc_piece_tokens_override;

/* How many blocks a region such a call runs in its first wave where its queue then gives
 * every region more blocks, joining regions still running (docs/decode-kernel.md, "Pieces":
 * calls of few long regions); 0 where it does not. Depends on the current device. */
int32_t mkv_cuda_decode_wave_blocks(const mkv_cuda_decode_t *a);

/* Where such a call runs one wave whose warps first take a static share of their region's
 * high tokens (decision 102: that per mille of a warp's even share, then pieces from the
 * region's counter), the per mille; 0 where it does not. Depends on the current device. */
int32_t mkv_cuda_decode_piece_static(const mkv_cuda_decode_t *a);

/* The wave plans of calls in pieces (above), for measuring and testing them
 * (bench_attention --wave-spares): 0, the library's choice (the default); -1, none (neither
 * the wave of decision 82 nor its spares); N > 0, a wave of floor(resident / regions) blocks a
 * region and N more queued after them, wherever a region gets a block. Process-wide and not
 * thread-safe, as above. */
extern int32_t mkv_tc_wave_spares_override;

/* Whether such a call's finalize pass waits on each region's items (ready flags the separate
 * pass's one launch sets) rather than on the decode kernel's end, so that it starts on regions
 * done while the decode kernel's last blocks run (docs/decode-kernel.md, "Score write-back,
 * separate pass"); depends on the current device, as above. */
int mkv_cuda_decode_ready_flags(const mkv_cuda_decode_t *a);

/* That choice forced, for measuring and testing it (bench_attention --ready): 0, the
 * library's (the default); -1, never; 1, wherever one launch runs the separate pass.
 * Process-wide and not thread-safe, as above. Where it is 0, MIXKV_DECODE_READY=off or on in
 * the environment (read once) forces it the same way, for programs without the knob
 * (serve-bench). */
extern int32_t mkv_tc_ready_override;
/* The two-format separate pass's high items (decision 88): 0 AUTO, -1 never, > 0 those tokens
 * (rounded up to a multiple of 16; AUTO's are below the item size, forced ones may be above)
 * wherever the pass is one launch. For tests and bench_attention --hi-item. */
extern int32_t mkv_tc_hi_item_override;
/* The low items of those calls from a block of their own (tc_args::hi_align, decision 109): 0
 * AUTO, -1 never, 1 wherever the pass is one launch without ready flags or high items of their
 * own. For tests and bench_attention --hi-align. */
extern int32_t mkv_tc_hi_align_override;
/* Those head regions (decision 96): 0 AUTO, -1 none, > 0 as many as give that per mille of the
 * resident blocks half-size items, wherever the rule's other conditions hold. For tests and
 * bench_attention --head. Process-wide and not thread-safe, as above. */
extern int32_t mkv_tc_head_override;
/* Static first pieces (decision 102): 0 AUTO, -1 none, > 0 with a forced piece size
 * (mkv_tc_piece_tokens_override), a wave of blocks whose warps first take that per mille of
 * their share of a region's high tokens, then pieces from the counter. For tests and
 * bench_attention --piece-static. Process-wide and not thread-safe, as above. */
extern int32_t mkv_tc_piece_static_override;
/* The blocks a call with a separate finalize pass merges each head-region's items in (the
 * outputs cut in slices in small calls; decision 97), 1 without that pass. Depends on the
 * current device, as above. */
int32_t mkv_cuda_decode_merge_blocks(const mkv_cuda_decode_t *a);
/* Those forced (bench_attention --merge-blocks): 0 AUTO, N > 0 N slices (at most G head_dim
 * / 4). Process-wide and not thread-safe, as above. */
extern int32_t mkv_tc_merge_blocks_override;
/* The blocks a fused call merges each head-region in, a slice of its outputs each (decision
 * 105; 1: its last block alone), where the call's grid holds every block at once. Depends on
 * the current device, as above. */
int32_t mkv_cuda_decode_merge_split(const mkv_cuda_decode_t *a);
/* Those forced (bench_attention --merge-split): 0 AUTO, -1 or 1 one block, N > 1 N (at most G
 * head_dim / 4) wherever the grid holds every block. Process-wide and not thread-safe, as
 * above. */
extern int32_t mkv_tc_merge_split_override;
/* The blocks a region of a wave in pieces takes (piece_wave: decisions 82, 83 and 102): 0 AUTO
 * (the resident blocks over the regions), N > 0 N where N blocks a region stay resident
 * (bench_attention --wave-blocks). Process-wide and not thread-safe, as above. */
extern int32_t mkv_tc_wave_blocks_override;
/* The high items' tokens of such a two-format separate call where they differ from its item
 * size (decision 88; a region whose high share would overflow its blocks keeps one size),
 * else 0; depends on the current device, as above. */
int32_t mkv_cuda_decode_hi_item_tokens(const mkv_cuda_decode_t *a);
/* 1 where such a call's low items start at a block of their own (decision 109), else 0;
 * depends on the current device, as above. */
int mkv_cuda_decode_hi_align(const mkv_cuda_decode_t *a);

/* The item size a call with these arguments (pointers unused) plans on the tensor-core path,
 * and the workspace bytes that plan uses; 0 where the call takes the generic kernels. */
int32_t mkv_cuda_decode_item_tokens(const mkv_cuda_decode_t *a);
size_t mkv_cuda_decode_plan_bytes(const mkv_cuda_decode_t *a);

/* Workspace for a call with these sizes (partial results of split sequences, logits for the
 * score write-back), whatever its formats, kernel choices and mean_tokens. */
size_t mkv_cuda_decode_workspace_size(int32_t n_seq, int32_t n_heads, int32_t group_size,
                                      int32_t head_dim, int32_t max_tokens, int32_t split_tokens);

/* The most mkv_cuda_decode_workspace_size asks for n_seq sequences and any max_tokens from 1
 * to max_tokens (split_tokens 0). The size is not monotonic in max_tokens (the item size steps
 * at powers of two: at 8 sequences, regions of 8,065 tokens need half as much again as
 * regions of 8,192), so an engine that allocates once for calls of every length up to a
 * bound (a captured step replayed as its sequences grow) allocates this. One size
 * computation per length: about a microsecond each. 0 on sizes out of range. */
size_t mkv_cuda_decode_workspace_bound(int32_t n_seq, int32_t n_heads, int32_t group_size,
                                       int32_t head_dim, int32_t max_tokens);

mkv_status_t mkv_cuda_decode(const mkv_cuda_decode_t *a, void *stream, char *err);

#ifdef __cplusplus
}
#endif

#endif /* MKV_ATTENTION_DECODE_CUDA_H */
