/*
 * decode_tuning.h — every threshold that mkv_cuda_decode's AUTO choices (and the tensor-core
 * kernel's compile-time stage shape) were tuned with, in one table, each with where it came
 * from. CUDA/C++ only (decode_plan.cu, decode_generic.cu, decode_tc_common.cu, decode_tc_finalize.cu,
 * tc_staging.cuh).
 *
 * These values were set by timing bench_attention (32 query / 8 KV heads, d 128, default pages;
 * figures and commands in docs/results.md) on one H100 80GB HBM3 and one H200. They are right
 * for those GPUs and a starting point elsewhere: a new GPU should be re-measured with
 * `bench_attention --scores separate|fused`, `--logits fp32|compact` and `--split N` before
 * trusting them. The structural limits (item sizes in [32, 4096], G <= 8, warps per block) are
 * not tuning and live in decode_tc.h.
 *
 * Static constexpr members, so that host code and the kernels' constant expressions read the
 * same values (scalar constexpr members may be used in device code).
 */
#ifndef MKV_ATTENTION_DECODE_TUNING_H
#define MKV_ATTENTION_DECODE_TUNING_H

#include <stdint.h>

struct mkv_decode_tuning {
    /* ---- Item size of the tensor-core path (mkv_tc_item_tokens, plan_tc) ---- */

    /* Items per multiprocessor the default item size aims at: several waves of the 16 resident
     * warps, so that the last wave is short. */
    static constexpr int32_t items_per_sm = 64;
    /* Items start at the largest power of two up to long_region_min_item that still cuts a
     * region of max_tokens into min_region_items or more, even where that leaves fewer items
     * than items_per_sm asks: on long regions, shorter items cost their pipeline fill and
     * partial result more than their parallelism gives (H200, K16V16 with 64-token items
     * against 256: 1 x 32k 107 against 63 us, 1 x 16k 61 against 45, 1 x 8k 39 against 35;
     * 16 x 4k 113 against 105 with 128; but 1 x 4k 28 against 32 with 256, hence the floor of
     * 32 items a region). */
    static constexpr int32_t min_region_items = 32;
    static constexpr int32_t long_region_min_item = 256;
    /* Items of MKV_TC_MIN_ITEM (32) tokens only where the call's items at that size number at
     * most this many per multiprocessor (one wave of 3 blocks of 4 warps), 64 tokens or more
     * elsewhere: at batch 1 the shorter chain is the call's critical path, but where the items
     * fill several waves their fixed costs add up (H100, 20 calls, 32 against 64 tokens:
     * 1 x 1k K16V16 13.2 against 14.65 us, the mix 14.15 against 15.85; the mix 16 x 1k 24.8
     * against 22.6, K16V16 without scores 43.0 against 39.8). */
    static constexpr int32_t shortest_items_per_sm = 12;
    /* ... and, in small calls, items halved (down to 64 tokens) until the call has at least
     * this many: enough warps streaming at once where long_region_min_item would leave a few
     * hundred (H100, 20 calls, us, the items before this rule against halved; the mix's
     * max_tokens are its 70% stored: K16V16 1 x 4k without scores 16.7 against 15.2 with 64
     * tokens, with scores 17.2 against 15.4; 1 x 8k 24.0 against 19.2 with 128, with scores
     * 25.2 against 19.9; the mix 1 x 16k 26.6 against 24.1 with 128, but 1 x 8k 19.1 against
     * 19.6 with 64; 2 x 4k and 1 x 16k, already at 512 items, are best there or within 2%;
     * 32-token items lose where 64 gave 512 items or fewer: K16V16 1 x 2k 13.4 against 13.6,
     * the mix 1 x 4k 15.7 against 17.9). */
    static constexpr int32_t small_call_min_items = 512;
    /* ... and, where the call's items fill more than a wave (shortest_items_per_sm a
     * multiprocessor), items doubled up to long_region_min_item while a region keeps this many
     * and the call small_call_min_items: min_region_items and items_per_sm had left calls of a
     * few dozen regions of 2k to 8k tokens in items of 64 or 128 tokens, whose per-item costs
     * (pipeline fill, partial result, merge) outweighed the parallelism. H100, 2 x 20 calls,
     * us, before against after (decision 79): the mix 20/50/30 with scores 16 x 4k 56.7
     * against 42.6, 16 x 2k 31.8 against 26.5, 8 x 4k 32.0 against 27.2, 32 x 2k 59.4 against
     * 51.8, 16 x 8k 87.7 against 80.5; K4V2 16 x 2k 36.8 against 30.1, K8V4 44.7 against 36.8;
     * K16V16 without scores 8 x 2k 36.9 against 33.3, 16 x 2k 60.6 against 55.5, with scores
     * 64 x 1k 121.6 against 118.4. Where it lost: K8V4 16 x 4k 68.9 against 71.1 (K4V2 there
     * 58.2 against 55.0, K16V16 within 1.1). */
    static constexpr int32_t mid_region_items = 8;
    /* Fused calls whose regions hold at most MKV_TC_WARPS times this many tokens take items of
     * a quarter region: one block a region, merged in shared memory (H100, K16V16 without
     * scores, 20 calls, us, items of 64 tokens against 256: 16 x 1k 35.2 against 31.1, 64 x 1k
     * 103.1 against 100.2; 256 x 1k already at 256). */
    static constexpr int32_t single_block_max_item = 256;
    /* Fused K16V16 calls without a score write-back whose blocks at the item size above fill
     * more than a wave of resident blocks, but one wave with items of twice or four times
     * the size up to this many tokens (still small_call_min_items items), take those: one
     * wave of longer blocks instead of a second, partial wave whose blocks start together.
     * H100, 2 x 20 calls, us, AUTO (with pieces) against items of 512 (of 1,024): 16 x 4k
     * 104.3 against 99.5 (97.8), 4 x 16k 103.5 against 99.3 (100.0), 8 x 8k 104.8 against
     * 99.9, 32 x 2k 105.2 against 102.5 (98.8); where 512 would not fit a wave it lost or held
     * (64 x 2k 191.6 against 194.1, 16 x 8k 189.4 against 192.8, 8 x 16k 189.4 against
     * 191.2), as did 1,024 where it left few warps (8 x 4k 56.0 against 63.5, 4 x 8k 56.2
     * against 66.2). The rule against the build before it (decision 81): 16 x 4k 103.8 to
     * 99.8, 4 x 16k 103.6 to 99.7, 8 x 8k 103.6 to 99.8, 32 x 2k 104.1 to 103.9; the shapes it
     * leaves alone within 0.5 us. */
    static constexpr int32_t one_wave_max_item = 512;
    /* ... and before that rule, any such call whose items, doubled up to this many tokens while
     * the call keeps small_call_min_items, leave regions of one block that a wave holds takes
     * them (fewer, longer items: no merge across blocks, fewer item starts). H100, 2 x 20
     * calls, us, decision 81's rule against this one: 32 x 1k 57.0 to 53.7 (512 tokens, 2 a
     * region), 16 x 2k 55.8 to 53.2 (512), 16 x 4k 100.2 to 97.7 (1,024), 32 x 2k 107.7 to
     * 99.2 (1,024). Doubling to 1,024 where regions kept several blocks lost (4 x 16k 99.7
     * against 100.2, 8 x 8k 99.9 against 100.8, 2 x 16k 55.7 against 56.2 with 512). */
    static constexpr int32_t single_block_wave_max_item = 1024;
    /* Fused one-format calls queue each region's last block (a region of one section leaves it
     * empty) after every other block (tc_args::last_blocks_last): without a score write-back,
     * and with one for single-block regions of keys of at most this many bits. An empty block
     * costs its command and its region's counts; between other blocks' work that held up calls
     * of single-block regions most. H100, 2 x 20 calls, us, without against with: no scores,
     * K4V2 256 x 1k 144.2 against 138.9, K8V4 256 x 1k 186.6 against 183.8, K16V16 256 x 4k
     * 1,406 against 1,400 (with the tail below); with scores, K4V2 256 x 1k 204.6 against
     * 189.8, K8V4 231.8 against 225.2. With scores it lost elsewhere: K16V16 64 x 4k 392.0
     * against 396.8, 256 x 1k 386.2 against 392.9, K8V4 16 x 16k 236.3 against 240.7 (K4V2
     * and K8V4 at 64 x 4k within 0.6 us). */
    static constexpr int32_t last_blocks_last_max_key_bits = 8;
    /* Where the queue is so ordered, calls without a score write-back, of 16-bit keys and
     * regions of several blocks, of more than this many waves of resident blocks end in blocks
     * of half-size items (tc_args::tail_rs): the stamps put the SDPA gap in the last wave, where
     * blocks of 4 x 256 tokens end up to 35 us apart. The tail, queue empty to last stamp, went
     * from 44 to 22 us at 64 x 4k; the call, with the order above, from 370.0 to 367.6 us,
     * 16 x 16k 369.2 to 367.9, 64 x 16k 1,409.5 to 1,408.5 (H100, 2 x 20 calls, K16V16
     * without scores). Not taken where it lost: single-block regions, which it splits in two
     * (256 x 1k 363.4 against 364.4), and K4V2, bound by instruction issue (64 x 4k 146.2
     * against 147.7, 64 x 16k 448.6 against 452.4). */
    static constexpr int32_t tail_min_waves = 2;
    /* Such calls of more than one wave start with regions of half-size items
     * (tc_args::head_rs, decision 96) giving this per mille of the resident blocks half-size
     * items, so that the first wave's blocks, all of one size, do not end together: the stamps
     * at 64 x 4k had the warps streaming fall from 1,584 to about 250 for some 10 us there (the
     * blocks' transitions) and again, smaller, a wave later; with half the first wave in short
     * blocks the least was about 700. H200, 2 x 20 calls, K16V16 without scores, us, none /
     * 250 / 500 / 750: 64 x 4k 260.6 / 258.6 / 258.3 / 258.9, 32 x 8k 260.3 / 258.1 / 257.4 /
     * 257.8, 128 x 2k 261.4 / 259.1 / 258.6 / 259.6, 256 x 1k 257.6 / 255.6 / 255.8 / 256.0;
     * within 0.1% at 64 x 16k and 32k, 256 x 4k and 32k, 32 x 2k and 128 x 8k. */
    static constexpr int32_t head_per_mille = 500;
    /* Single-block regions take head regions only where their block is full (4 items) of items
     * of at most this many tokens. H200, 3 x 20 calls, us, without / with: 64 x 1k 77.3 / 72.7,
     * 128 x 1k 136.6 / 133.4, 256 x 1k 258.4 / 255.7 (items of 256); but 256 x 2k 495.4 /
     * 500.9, 256 x 4k 963.2 / 979.5, 256 x 16k 3,772 / 3,876 (items of 512 to 4,096: a block's
     * work is the grain of the call's end, and its blocks then end unevenly), and regions of 2
     * items (decision 81's one-wave plans) 32 x 1k 43.1 / 51.6, 32 x 2k 76.8 / 87.7. */
    static constexpr int32_t head_single_max_item = 256;
    /* Fused calls without a score write-back, of more than a wave of resident blocks, whose
     * regions take at least piece_min_region_blocks blocks, take their tokens in pieces of
     * piece_tokens (tc_args::piece_tokens; where the kernel has pieces: K16V16), so that a
     * region's blocks end together. H100, K16V16 without scores, 2 x 20 calls, us, without
     * against pieces of 32 (of 64): 16 x 16k 367.9 against 364.0 (365.7), 16 x 32k 717.0
     * against 706.6, 8 x 16k 192.1 against 189.8, 4 x 16k 104.2 against 103.5, 32 x 8k 366.8
     * against 363.4, 64 x 8k 715.8 against 709.5 (711.5), 64 x 16k 1,408.3 against 1,396.1
     * (1,396.5), 64 x 32k 2,796.6 against 2,766.5, 256 x 32k 11,103.6 against 11,041.1
     * (11,050.3; 2 blocks a region), 64 x 4k 367.1 against 365.8, 16 x 4k and 128 x 4k within
     * 0.1%; pieces of 16 were slower than 32 (64 x 4k 367.5). Left out where they lost: one
     * wave (1 x 16k 33.2 against 34.4; 1 x 32k 57.1 against 56.5) and single-block regions
     * (256 x 4k 1,400.2 against 1,409.9, 256 x 8k 2,786.2 against 2,808.6, 256 x 16k 5,566.8
     * against 5,584.5, 16 x 1k 30.4 against 31.1; 256 x 1k 362.7 against 361.2, 64 x 1k 101.2
     * against 100.6). */
    static constexpr int32_t piece_tokens = 32;
    static constexpr int32_t piece_min_region_blocks = 2;
    /* Pieces (the rule above) and piece waves (below, pieces of piece_wave_tokens) only below
     * this many peak DRAM bytes per SM cycle (mkv_cuda_dram_bytes_per_sm_cycle): measured on
     * the H100 (12.8); on the H200 (18.4) both lost (decision 94; 2 x 20 calls, K16V16 without
     * scores, us, AUTO with them against without: 4 x 16k 84.3 against 73.8, 4 x 32k 158.9
     * against 141.7, 4 x 64k 310.8 against 265.8, 2 x 32k 85.1 against 74.0, 16 x 8k 141.8
     * against 138.7, 32 x 8k 268.0 against 260.1, 32 x 16k 509.0 against 500.1, 64 x 16k 984
     * against 953, 64 x 32k 1,953 against 1,873, 64 x 4k 261.1 against 256.0; 64 x 8k and
     * 256 x 32k within 0.4%). The wave with spares (pieces of piece_tokens) still gained
     * there (16 x 16k 251.7 against 261.4, 16 x 32k 490.9 against 500.4, 8 x 32k 256.1
     * against 263.3; 8 x 16k 141.2 against 139.8) and is kept on both. */
    static constexpr double pieces_max_dram_bytes_per_sm_cycle = 16.0;
    /* Fused K16V16 calls without a score write-back of few long regions, at most a
     * piece_wave_min_region_blocks-th as many as resident blocks in pieces, run one wave of
     * them: each region floor(resident / regions) blocks, items cut to fill them (multiples of
     * MKV_TC_MIN_ITEM, not powers of two), pieces of piece_wave_tokens, so that every region's
     * blocks stream from the call's start to its end without changing regions; where a warp
     * keeps at least piece_wave_min_warp_tokens tokens of its region and the plan needs no more
     * workspace than AUTO's items (decision 82). H100, 2 x 20 calls, us, the build before
     * against the rule: 1 x 64k 101.6 to 99.5, 2 x 32k 100.8 to 99.3, 2 x 64k 193.1 to 183.9,
     * 4 x 16k 100.2 to 99.8, 4 x 32k 191.1 to 187.3, 4 x 64k 366.7 to 358.5; batch 1 to 8 at 8k
     * to 64k otherwise unchanged. Pieces of 32 in the wave gained less (4 x 32k 188.0 against
     * 185.9 with 16, 2 x 32k 100.5 against 98.8). Left alone where it lost or held: more
     * regions (b 6: 8 x 8k 100.0 against 101.0, 8 x 32k 364.4 against 366.8; b 3: 16 x 16k
     * 363.8 against 365.1), fewer tokens a warp (1 x 16k at 84: 33.1 against 35.2), and calls
     * whose AUTO items already fit a wave (1 x 32k 57.4 against 56.7, within the run-to-run
     * spread of AUTO's own 56.5 to 57.6). */
    static constexpr int32_t piece_wave_min_region_blocks = 12;
    static constexpr int32_t piece_wave_min_warp_tokens = 160;
    static constexpr int32_t piece_wave_tokens = 16;
    /* ... and with at least wave_spares_min_region_blocks (but under
     * piece_wave_min_region_blocks) blocks a region in a wave, a wave of floor(resident /
     * regions) blocks a region and wave_spares more a region queued after every region's first
     * ones (tc_args::wave_blocks; pieces of piece_tokens): every region streams from the start,
     * and a block whose region ends joins one still running, so that regions end together;
     * where a warp keeps wave_spares_min_warp_tokens tokens (decision 83: the build before
     * against the rule, 8 x 16k 189.7 to 186.0, 8 x 32k 364.2 to 355.8, 6 x 32k 277.4 to 270.4,
     * 16 x 16k 363.7 to 361.6). H100, 3 x 30 calls,
     * us, AUTO against 6 spares (pieces of 32; of 16): 6 x 32k 276.5 against 270.6 (269.5),
     * 8 x 16k 190.0 against 185.9 (186.0), 8 x 32k 364.6 against 357.8 (359.4), 12 x 16k 275.9
     * against 273.6, 16 x 16k 363.4 against 361.2, 16 x 32k 704.8 against 704.3. Left out
     * where it lost: 2 blocks a region (24 x 16k 532.1 against 538.8), fewer tokens a warp
     * (8 x 8k at 171: 99.8 against 100.9). 4 spares gained about as much (8 x 16k 185.9, 16 x
     * 16k 359.0 to 362.0 in two runs), 12 less (16 x 16k 365.8). */
    static constexpr int32_t wave_spares = 6;
    static constexpr int32_t wave_spares_min_region_blocks = 3;
    static constexpr int32_t wave_spares_min_warp_tokens = 256;
    /* On GPUs where pieces do not pay (the H200), such calls of static_wave_min_region_blocks
     * or more blocks a region in a wave (any number: decision 82's wave of 12 or more is off
     * there), where a warp keeps at least static_wave_min_warp_tokens tokens, run that wave
     * without spares: each warp first takes static_wave_per_mille of its even share of its
     * region's high tokens as one piece, then pieces of piece_tokens from the region's counter
     * (tc_args::piece_static, decision 102): the counter's round trips come only at the end,
     * where they even the warps' ends. H200, 2 x 20 calls, K16V16 without scores, us, AUTO
     * (decision 83's spares at 6 x and 8 x, plain at 4 x) against it: 4 x 32k 139.3 / 135.0
     * (A/B of the rule: 139.6 / 134.6), 6 x 16k 106.4 / 104.6, 6 x 32k 199.5 / 195.2, 8 x 16k
     * 142.2 / 134.8 (141.7 / 135.2), 8 x 32k 269.7 / 255.6 (in the A/B, the spares 256.5 /
     * 256.7); and from 12 blocks a region, where AUTO had plain items (forced, 2 x 20 calls):
     * 1 x 128k 155.2 / 134.9, 2 x 64k 142.9 / 134.0, 2 x 128k 272.5 / 253.3, 3 x 32k 114.4 /
     * 104.9, 3 x 64k 202.4 / 194.7, 3 x 128k 382.3 / 376.2. 800 and 950 per mille within 1%
     * of 900. Left out where it lost or held: fewer tokens a warp (1 x 16k at 84: 26.9 /
     * 29.9; 1 x 32k at 167: 43.7 / 45.2; 1 x 64k at 334: 75.1 / 75.0; 2 x 16k at 171: 42.3 /
     * 43.9; 2 x 32k at 341: 74.0 / 73.9; 4 x 8k at 171: 42.5 / 43.5; 4 x 16k 73.8 / 73.3;
     * 8 x 8k 73.4 / 74.0) and 3 blocks a region (16 x 16k 253.1 / 254.9, 16 x 32k 489.1 /
     * 495.6; but 16 x 8k 136.4 / 133.9). */
    static constexpr int32_t static_wave_min_region_blocks = 6;
    static constexpr int32_t static_wave_min_warp_tokens = 512;
    static constexpr int32_t static_wave_per_mille = 900;
    /* The fused kernel's region merge split between a region's last merge_split blocks to
     * arrive, a slice of its outputs each (tc_args::merge_split, decision 105), where the grid
     * holds every block at once and a region has merge_split_min_parts blocks or more: there
     * one block's copies of every part (2 KB each at G 4, d 128) outlast the others' wait for
     * the last arrival. H200, K16V16 without scores, 2 x 20 calls, us, 8 against 1: 1 x 32k
     * (32 parts) 41.7 / 42.2 and 42.1 / 43.2 in two calls; where regions have fewer (16 at
     * 1 x 16k) it lost: 1 x 16k 26.4 / 25.8 and 26.8 / 26.4, 2 x 16k 41.5 / 40.9 and 42.1 /
     * 41.7, 4 x 8k 41.5 / 40.9 and 41.9 / 41.6. 4 and 16 within 1% of 8. */
    static constexpr int32_t merge_split = 8;
    static constexpr int32_t merge_split_min_parts = 24;
    /* The separate pass's finalize (decode_tc_finalize.cu) cuts a small call's merge into
     * slices while each thread keeps at least this many of a region's items (its loop loads
     * them in predicated batches of 8). H100, 2 x 30 calls, us, at least 8 against at least 4
     * a thread: the mix 20/50/30 (23 items a region at 1k, one slice with 8, two with 4)
     * without scores 1 x 1k 12.4 against 11.9, 1 x 4k 14.7 against 14.4, 4 x 1k 15.2 against
     * 14.9, 4 x 4k 20.1 against 19.4, with scores 4 x 4k 19.9 against 19.1; but K16V16 (32
     * items, two slices with 8, four with 4) 1 x 1k 11.1 against 11.4, 4 x 1k 13.5 against
     * 14.1 without scores, 14.2 against 14.9 with. 5 takes 8's cuts for K16V16 and 4's for the
     * mix at these shapes. */
    static constexpr int32_t merge_min_items = 5;
    /* It also cuts while a thread would load a section's items in two batches (decision 97;
     * into the fewest slices that load them in one where that is fewer, decisions 112 and
     * 113), up to this many slices and only in calls of at most half a slice per multiprocessor.
     * H200, 3 x 30 calls, us, the slices forced: the mix at 1 x 1.5k (34 items a region, two
     * batches in 2 slices) 12.32 in 2, 11.97 in 4, 12.61 in 8 (K16V16 11.87); 8 lost at 1 x 3k
     * (13.22 against 12.83 in 4) and 4 at 4 x 1.5k (14.75 against 14.14 in 2). */
    static constexpr int32_t merge_batch_max_blocks = 4;
    /* Multiprocessors assumed when the device cannot be asked (an H100 SXM's count). */
    static constexpr int32_t fallback_sms = 132;
    /* L2 bytes assumed when the device cannot be asked (the H100's and H200's 50 MB). */
    static constexpr int32_t fallback_l2_bytes = 50 << 20;

    /* ---- Fused score write-back under MKV_DECODE_SCORES_AUTO (tc_may_fuse) ----
     * Tuned on an H200 from full bench_attention grids with either pass forced
     * (docs/results/bench_attention_h200_scores_{separate,fused}.json): fused wins for calls
     * small enough that one launch instead of two matters, for long regions in every format,
     * and for K16V16 in large calls; it loses for short regions in large quantized calls.
     * Two-format calls (a K8V4 high and a K4V2 low section, one launch) are fused as one
     * format's small calls are, only where their regions reach fuse_small_min_region_tokens:
     * once the separate pass had a kernel of its own (decode_kernel's FUSED), an H100 measured
     * it faster below (the mix, separate against fused: 1 x 1k 16.1 against 22.0 us, 1 x 2k
     * 18.9 against 22.1, 1 x 4k 21.2 against 22.4, 1 x 8k 24.2 against 26.7, 1 x 16k (11.5k
     * tokens stored) 32.5 against 35.6, 4 x 4k 26.7 against 29.6, 16 x 4k 73.5 against 97.2,
     * 32 x 2k 69.2 against 108.1) and slower from there (1 x 32k, 22.9k stored: 47.2 against
     * 41.8). (Before, with one kernel for both passes, an H200 had measured fused faster at
     * batch 1: 26 against 31 us at 1 x 1k.) */
    static constexpr int64_t fuse_max_small_token_heads = (int64_t)1 << 18; /* n_seq H max_tokens */
    /* ... but only for regions of at least this many tokens (one format; two formats): with
     * this build's separate pass (finalize loads its tokens early) and fused kernel (one
     * memset, single-block regions), an H100 measured the separate pass faster on small calls
     * of short regions: 1 x 1k K16V16 16.2 against 20.8 us, K4V2 16.8 against 21.5, the mix
     * 20.1 against 21.7; 16 x 1k K4V2 30.3 against 38.9; 1 x 4k K16V16 21.4 against 25.9,
     * 1 x 8k 28.9 against 32.5, K4V2 27.1 against 29.4; and the fused kernel faster for one
     * format from 16k (K16V16 1 x 16k 38.5 against 55.4 without scores), where
     * fuse_min_region_tokens takes over: one-format small calls are fused only there (4 x 8k
     * went the other way, K16V16 68.4 fused against 71.0, K4V2 44.2 against 46.8). After the
     * kernels' split the H100 still measured one format fused faster from 16k (K16V16 1 x 16k
     * 42.3 against 46.9, 1 x 32k 64.1 against 79.9; K8V4 1 x 32k 42.4 against 56.3; K4V2
     * 256 x 32k 3,999 against 4,362) but for K4V2 16 x 16k (197.6 against 182.5). */
    static constexpr int32_t fuse_small_min_region_tokens = 16384;
    static constexpr int32_t fuse_min_region_tokens = 16384;                /* max_tokens */
    static constexpr int64_t fuse_min_k16v16_token_heads = (int64_t)1 << 21;
    /* The rules above for small calls and long regions (the fused kernel's gains there were
     * measured on the H100, 12.8 peak DRAM bytes per SM cycle) hold only below this many
     * bytes per SM cycle (mkv_cuda_dram_bytes_per_sm_cycle). From it (the H200, 18.4) the
     * separate pass, its decisions 84 to 98 since, was faster at every such shape measured
     * (decision 99; H200, 2 x 20 calls, separate against fused, us: the mix 1 x 32k 27.0
     * against 34.6, 64 x 32k 659 against 912; K16V16 1 x 16k 28.7 against 35.0, 2 x 16k 45.8
     * against 50.8, 4 x 16k 86.7 against 90.3, 2 x 32k 88.7 against 91.3; K8V4 1 x 16k 20.9
     * against 30.6, 16 x 32k 285.6 against 297.5; K4V2 4 x 32k 78.7 against 100.2, 64 x 32k
     * 837.5 against 963.6; K8V4 64 x 32k 1,056 against 1,052, the only tie), so there the
     * fused kernel takes only K16V16 calls of fuse_min_k16v16_token_heads and more (16 x 16k
     * 294.5 against 290.3, 32 x 8k 291.8 against 287.1, 8 x 32k 295.7 against 293.3, 64 x 32k
     * 2,175 against 2,118; below, 16 x 8k 156.1 against 161.5, 8 x 16k 156.9 both, 4 x 32k
     * 160.1 against 158.4) and, as before, large calls of single-block regions. */
    static constexpr double fuse_long_max_dram_bytes_per_sm_cycle = 16.0;
    /* One-format calls without scores fuse (the merge in the region's last block, one launch)
     * above this many token-heads, and take the separate pass (no counters to zero, no job
     * queue) at or below it. H100, K16V16 without scores, the grids in the blocks' index last
     * order, separate against fused, us: 1 x 1k 15.1 against 18.2, 4 x 1k 16.1 against 21.0,
     * 1 x 4k 19.5 against 21.4, 2 x 4k 20.8 against 26.6; from 2^17 fused is as fast or
     * faster: 4 x 4k 40.0 against 39.5, 8 x 2k 43.6 against 40.5, 16 x 1k 41.4 against 39.9,
     * 1 x 16k 44.0 against 38.7, 64 x 4k 385.8 against 372.3. With decision 73's overlapped
     * zeroing and early exit the separate pass stayed faster below: 1 x 1k 11.8 against
     * 13.2 us, 1 x 4k 16.6 against 18.4, 1 x 8k 23.7 against 25.2. */
    static constexpr int64_t fuse_no_scores_min_token_heads = (int64_t)1 << 16;
    /* One-format calls of at least this many token-heads whose regions fit one decode block
     * each are fused too (single-block regions merge in shared memory and run their own score
     * job; H100, fused against separate: K8V4 256 x 1k 227.9 against 256.8 us, 256 x 4k 796.4
     * against 863.3, K4V2 256 x 4k 568.1 against 603.5; against it K4V2 256 x 1k 210.4
     * against 202.9). Calls of regions of several blocks stay separate (K4V2 64 x 4k 215.7
     * fused against 186.6, 64 x 1k 125.1 against 81.5). */
    static constexpr int64_t fuse_min_single_block_token_heads = (int64_t)1 << 21;

    /* ---- Compact logits under MKV_DECODE_LOGITS_AUTO (tc_compact) ----
     * Compact below this many peak DRAM bytes per SM cycle (mkv_cuda_dram_bytes_per_sm_cycle):
     * between the H100 (12.8, waits on DRAM: compact faster) and the H200 (18.4, waits on
     * instruction issue: fp32 faster), from interleaved A/B runs at 256 x 32k. */
    static constexpr double compact_max_dram_bytes_per_sm_cycle = 16.0;

    /* ---- Item caps of fused calls (plan_for, plan_tc) ----
     * Keys of at least this many bits: items halved while the logits of the items in flight
     * would fill more than l2_logits_num / l2_logits_den of L2, as long as a section keeps at
     * most l2_cap_max_items items (tuned on an H200 at 256 x 32k, fp32 logits). Narrower keys
     * are bound by instruction issue and gain more from long items (fewer pipeline fills):
     * uncapped (MKV_TC_MAX_ITEM) with fp32 logits (H200, 256 x 32k), at most
     * compact_max_item tokens with compact logits (H100, 256 x 32k). */
    static constexpr int32_t l2_cap_min_key_bits = 8;
    static constexpr int32_t l2_logits_num = 9, l2_logits_den = 16;
    static constexpr int32_t l2_cap_max_items = 256;
    /* ... and items of at least this many tokens (the cap's floor before 32-token items). */
    static constexpr int32_t l2_cap_min_item = 64;
    /* Resident blocks per SM assumed for the cap when the occupancy query fails: the most any
     * instantiated kernel keeps, so the cap is never too loose. */
    static constexpr int32_t l2_cap_max_blocks = 4;
    static constexpr int32_t compact_max_item = 2048;
    /* Two-format calls (the policy's K8V4 / K4V2 regions, a high and a low section each):
     * items at most a power of two that cuts max_tokens into this many, so that each section
     * fills whole blocks of MKV_TC_WARPS items rather than leaving warps of a block idle
     * (H200, mix 20/50/30: 256 x 16k 3,070 us with the default 4,096-token items, 1,910 with
     * 1,024; 256 x 32k 4,292 with 4,096, 3,686 with 2,048). */
    static constexpr int32_t two_format_min_items = 8;
    /* Two-format separate calls whose grid fills less than a wave of the kernel's resident
     * blocks: items cut to the shortest multiple of MKV_TC_MIN_ITEM, not below this, whose
     * grid still fits one wave (decode_plan.cu, wave_fill_item). H100, the mix 20/50/30 with
     * scores, 2 x 30 calls, us, AUTO's power of two against the item the rule takes: 4 x 6k
     * 24.6 against 23.1 (96), 2 x 12k 27.2 against 24.7 (96), 2 x 16k 31.6 against 29.0 (128),
     * 4 x 12k 37.8 against 36.8 (192); below 96 tokens the extra blocks cost more than the
     * shorter items gain (2 x 6k 18.9 with 128, 19.7 with 64). */
    static constexpr int32_t wave_fill_min_item = 96;
    /* Separate calls of one sequence whose grid has more than one_seq_spill_num /
     * one_seq_spill_den blocks a multiprocessor: items lengthened to the shortest whose grid is
     * a block a multiprocessor (decode_plan.cu, one_seq_item), for one format with keys under
     * 16 bits at most one_seq_max_quant_item tokens. H100, 3 x 30 calls, us, AUTO's item
     * against the rule's: the mix 20/50/30 1 x 7k 17.50 against 16.62 (64 to 96), 1 x 8k
     * 18.11 against 16.59 (64 to 96), 1 x 10k 19.30 against 18.30 (64 to 128), 1 x 14k 21.46
     * against 20.26 (96 to 160); K16V16 with scores 1 x 6k 17.54 against 15.97 (64 to 96),
     * 1 x 12k 31.46 against 29.34 (128 to 192), without 1 x 5k 16.82 against 15.20; K4V2 1 x 6k
     * 16.45 against 15.68. Where a few multiprocessors hold a second block the longer items
     * lose (the mix 1 x 6k, 144 blocks on 132: 16.35 with 64 against 16.75 with 96), as do
     * quantized formats alone at 224 tokens (K4V2 1 x 14k 20.86 with 128, 21.73 with 224;
     * K8V4 21.74 against 22.18). */
    static constexpr int32_t one_seq_spill_num = 9, one_seq_spill_den = 8;
    /* Two-format separate calls of two sequences or more whose items of MKV_TC_MIN_ITEM tokens
     * make a grid of more than one_seq_spill_num / one_seq_spill_den blocks a multiprocessor
     * take items of twice that (decision 95): at small batch a block is a latency-bound chain,
     * and a second block on most multiprocessors costs more than the shorter items gain. H200,
     * 3 x 30 calls, the mix 20/50/30 with scores, median us, 32 against 64 tokens (blocks at
     * 32): 2 x 2k 14.24 against 12.93 (192), 2 x 2.5k 14.83 against 12.74 (240), 3 x 1.5k
     * 14.59 against 13.34 (216), 3 x 2k 15.55 against 13.86 (288), 4 x 1k 13.79 against 12.80
     * (192), 4 x 2k 16.06 against 14.80 (384), 6 x 1k 15.23 against 13.86 (288), 8 x 1k 15.26
     * against 14.99 (384); where the grid stays under it 32 keeps the lead (2 x 1k 11.57
     * against 12.38, 96 blocks; 2 x 1.5k 12.48 against 12.98, 144; 3 x 1k 12.48 both, 144). */
    static constexpr int32_t one_seq_max_quant_item = 192;
    /* Separate calls of one format with keys under 16 bits whose regions, few_region_blocks
     * blocks each, fill at most few_region_waves blocks a multiprocessor (on an H100, at 8 KV
     * heads, 2 sequences; one sequence takes the rule above): items of the item basis cut in
     * few_region_blocks blocks (decode_plan.cu, few_region_item). A --split sweep (H100, 20
     * calls, us) found that item the best at 2 x 4k to 2 x 14k for both formats, against
     * AUTO's; then one binary before and after (H100, 3 x 30 calls, us): K4V2 2 x 4k 16.77 to
     * 16.06 (128 to 64), 2 x 8k 23.01 to 20.06 (256 to 128), 2 x 10k 27.39 to 22.59 (256 to
     * 160), 2 x 14k 30.21 to 28.61; K8V4 2 x 6k 19.65 to 18.16, 2 x 10k 29.84 to 25.25, 2 x 12k
     * 31.31 to 31.28. Not below few_region_min_item tokens (2 x 2k with 32: K4V2 13.73 to
     * 14.18, K8V4 13.73 to 14.67), nor at 4 sequences (K4V2 4 x 4k 19.9 with AUTO's 128
     * against 23.5 with 64 in the sweep). */
    static constexpr int32_t few_region_blocks = 16, few_region_waves = 2, few_region_min_item = 64;
    /* Two-format separate calls: the high section's items of the fewest tokens (a multiple of
     * 16 from half the item and below it) whose grid, with room for a region of max_tokens
     * whose high share is up to hi_item_share_num / hi_item_share_den of its tokens, is at
     * most a block a multiprocessor, where the high format's bytes a token are at least
     * hi_item_bytes_ratio / hi_item_bytes_ratio_den times the low one's (regions of a larger
     * high share keep one item size; tc_args::hi_item; decision 88). H100, the mix 20/50/30
     * with scores, 3 x 30 calls, us, one item size against high items of half its tokens:
     * 1 x 2k 13.89 against 13.34, 1 x 3k 15.36 / 14.58, 1 x 4k 15.68 / 14.62 (without scores
     * 15.71 / 14.32); 1 x 5k (items of 64) 15.97 against 15.09 with 48-token high items.
     * Grids of more than a block an SM lost (1 x 6k 16.70 against 18.16, 1 x 8k 16.99 / 19.44,
     * 2 x 2k 15.50 / 16.30, 4 x 1k 15.30 / 15.78; 1 x 5k with 32-token high items, 144
     * blocks, 17.39), whence the share of a third, which keeps 1 x 4k's grid at 128 blocks.
     * One sequence whose grid is over a block an SM with no such item takes high items
     * longer than the low ones where that brings it under (1 x 6k, 144 blocks: 80-token high
     * items, 128 blocks, 16.94 against 16.10 us; at 2 x 3k it lost, 15.92 against 16.42). */
    static constexpr int32_t hi_item_bytes_ratio = 3, hi_item_bytes_ratio_den = 2;
    static constexpr int32_t hi_item_share_num = 1, hi_item_share_den = 3;

    /* ---- Ready flags of the separate pass (decision 84; tc_args::ready) ----
     * The finalize kernel waits on each region's items instead of the decode kernel's end,
     * so that its blocks start on regions done while the decode kernel's last blocks run, where
     * the separate kernel's blocks (of its regions' item basis, mean_tokens where given) are at
     * least ready_min_waves waves of its resident blocks, its items at least ready_min_item
     * tokens and its waves times ready_wave_tokens at most the item size: each block then sets
     * its flags and a fence before it releases the finalize, a cost per block that short items
     * and many waves feel more than the overlap gains (H100,
     * the mix 20/50/30, 2 x 20 calls, us: 64 x 4k 151.0 to 143.8, 64 x 16k 491.1 to 467.7,
     * 16 x 16k 149.1 to 143.8, 64 x 32k 954.3 to 918.6, 256 x 16k 1,866 to 1,847; K8V4 64 x 4k
     * 225.5 to 215.4, K4V2 170.5 to 164.3; but 256 x 1k 200.9 to 215.8 and 64 x 1k 60.5 to 62.5
     * with 64-token items, 256 x 4k 522.8 to 526.2 at 26 waves of 256-token items, and 16 x 4k,
     * a wave, 42.1 to 42.5; forced on, 128 x 4k 272.7 to 268.9 at 13 waves, 256 x 8k 967.2 to
     * 960.9 at 26 waves of 512 tokens, serve-bench's shape 81 x 6,000 spread 0.7 with the hint
     * 179.4 to 171.8). */
    static constexpr int32_t ready_min_waves = 2;
    static constexpr int32_t ready_min_item = 256;
    static constexpr int32_t ready_wave_tokens = 16;
    /* Calls of fewer waves take them too from this many blocks a multiprocessor and items of
     * ready_wave_min_item tokens or more (decision 101): the finalize's blocks, resident beside
     * the decode kernel's, then write back each region as its items end instead of after the
     * whole grid. H200, flags forced on against AUTO (none), 2 x 30 calls, us: the mix 16 x 8k
     * 65.0 to 61.6, 8 x 16k 65.8 to 63.8, 8 x 8k 35.3 to 34.1, 16 x 4k 35.1 to 34.1, 4 x 16k
     * 36.0 to 35.0, 2 x 32k 36.6 to 35.9; K16V16 with scores 16 x 4k 80.5 to 78.9, 8 x 8k 80.7
     * to 79.4, 4 x 16k 81.0 to 79.7, 8 x 4k 46.3 to 45.4; below two blocks a multiprocessor
     * they lost (the mix 1 x 4k 13.2 to 13.8, 2 x 4k 15.5 to 15.7, 2 x 8k 17.9 to 18.2; K16V16
     * 1 x 4k 13.8 to 14.3, 1 x 32k 46.7 to 47.4), and with items of 64 tokens the rule lost at
     * the mix 16 x 1k (16.6 to 17.4) and moved others by -2.4 to +0.8% (the rule's A/B,
     * bench_attention_h200_decision101_ab.json). */
    static constexpr int32_t ready_wave_min_sm_blocks = 2;
    static constexpr int32_t ready_wave_min_item = 128;

    /* ---- Stages of the tensor-core kernel (tc_staging.cuh, stage_layout) ----
     * Subtiles per stage: four up to stage4_max_subtile_bytes per subtile, two up to
     * stage2_max_subtile_bytes, else one (fewer waits and warp barriers per token for small
     * subtiles; tuned on an H200 at 256 x 32k, K8V4 and K4V2). Two stages instead of three
     * where a stage exceeds stage3_max_bytes, so that 12 warps' staging fits an SM.
     * stage2_max_subtile_bytes was 3,328, just under K8V4's subtile with the default groups at
     * d 128 (3,648: 1 key and 8 value groups), which then ran one-subtile stages and softmax
     * steps; at 3,712 it runs two (registers 150 to 156, the two-format kernel 167 to 165, no
     * spills; H100, 20 calls, one call, us: K8V4 64 x 16k 803.9 to 766.0, 256 x 32k 5,972 to
     * 5,755, 64 x 4k 235.4 to 229.8, 1 x 16k 38.0 to 35.3; the mix 81 x 6,000 spread 198.5 to
     * 195.6, 64 x 16k 521.0 to 515.5, 256 x 32k 3,792 to 3,738, 256 x 4k 567.3 to 559.1). */
    static constexpr int stage4_max_subtile_bytes = 1792;
    static constexpr int stage2_max_subtile_bytes = 3712;
    static constexpr int stage3_max_bytes = 6144;

    /* ---- Splits of the generic fp32 kernels (decode_generic.cu, auto_split) ----
     * Sequences up to split_small tokens are not split; longer ones take split_small tokens per
     * block, or split_large once the call has split_large_min_blocks blocks (two waves of 132
     * SMs). Set when these were the only kernels; not re-tuned since. */
    static constexpr int32_t split_small = 256;
    static constexpr int32_t split_large = 512;
    static constexpr int64_t split_large_min_blocks = 264;
};

#endif /* MKV_ATTENTION_DECODE_TUNING_H */
