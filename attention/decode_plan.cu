/*
 * decode_plan.cu — how a tensor-core decode call is laid out (decode_plan.h): the item size,
 * the workspace's layout, whether the score write-back is fused and the logits compact, the
 * kernel that covers both sections, and the device attributes these read (cached per device).
 * Host code; the AUTO thresholds are decode_tuning.h's, the launch decode_cuda.cu's.
 */
#include "attention/decode_plan.h"
#include "attention/decode_tuning.h"
#include "common/error.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#ifndef MKV_MAX_DEVICES
#define MKV_MAX_DEVICES 64 /* devices whose attributes are cached */
#endif
#define WS_ALIGN MKV_DECODE_WS_ALIGN

namespace mkv_tc_plan {

static bool valid_dim(int32_t d) { return d == 16 || d == 32 || d == 64 || d == 128 || d == 256; }

bool sizes_ok(int32_t n_seq, int32_t H, int32_t G, int32_t d, int32_t max_tokens,
                     int32_t split_tokens)
{
    return n_seq >= 0 && n_seq <= 65535 && H >= 1 && H <= 65535 && G >= 1 && G <= 65535 &&
           valid_dim(d) && max_tokens >= 0 && split_tokens >= 0;
}

/* Device attributes, queried once per device and attribute (a decode call plans with them:
 * asking the driver every call cost microseconds of host time per layer). */
int32_t device_attr(cudaDeviceAttr attr, int32_t fallback)
{
    enum { N_CACHED = 4 };
    static const cudaDeviceAttr cached[N_CACHED] = {cudaDevAttrMultiProcessorCount, cudaDevAttrL2CacheSize,
                                                    cudaDevAttrMemoryClockRate, cudaDevAttrClockRate};
    static std::atomic<int32_t> cache[MKV_MAX_DEVICES][N_CACHED + 1];
    int dev = 0, n = 0, k = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return fallback;
    }
    while (k < N_CACHED && cached[k] != attr) k++;
    if (attr == cudaDevAttrGlobalMemoryBusWidth) k = N_CACHED;
    const bool cacheable = dev >= 0 && dev < MKV_MAX_DEVICES && (k < N_CACHED || attr == cudaDevAttrGlobalMemoryBusWidth);
    if (cacheable) {
        const int32_t c = cache[dev][k].load(std::memory_order_relaxed);
        if (c > 0) return c;
    }
    if (cudaDeviceGetAttribute(&n, attr, dev) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return fallback;
    }
    if (cacheable) cache[dev][k].store(n, std::memory_order_relaxed);
    return n;
}

int32_t item_basis(int32_t max_tokens, int32_t mean_tokens)
{
    if (mean_tokens <= 0 || mean_tokens >= max_tokens) return max_tokens;
    const int32_t floor = (int32_t)(((int64_t)max_tokens + MKV_DECODE_MEAN_FLOOR - 1) / MKV_DECODE_MEAN_FLOOR);
    return mean_tokens > floor ? mean_tokens : floor;
}

/* cap_blocks: 0, the default item size; 1 to mkv_decode_tuning::l2_cap_max_blocks, items small
 * enough for the logits of the items in flight (cap_blocks resident blocks per multiprocessor)
 * to fill at most about half of L2 (plan_for). fused: room for the fused kernel's counters and
 * log-sum-exps. mean_tokens: the default item size's basis (item_basis). */
tc_plan plan_tc(int32_t n_seq, int32_t H, int32_t G, int32_t d, int32_t max_tokens,
                       int32_t split_tokens, bool fused, int32_t cap_blocks, int32_t max_item, int32_t mean_tokens)
{
    using T = mkv_decode_tuning;
    tc_plan w;
    w.compact = false, w.last_blocks_last = false, w.tail_regions = 0, w.head_regions = 0;
    w.piece_tokens = 0, w.piece_static = 0, w.wave_blocks = 0, w.merge_split = 1;
    w.ready = false;
    const int32_t sms = device_attr(cudaDevAttrMultiProcessorCount, T::fallback_sms);
    if (split_tokens > 0) {
        w.item_tokens = (int32_t)mkv_align_up64(split_tokens, MKV_TC_MIN_ITEM);
    } else {
        const int32_t basis = item_basis(max_tokens, mean_tokens);
        w.item_tokens = mkv_tc_item_tokens(n_seq, H, basis, sms);
        /* Fused calls of short regions: a quarter region (of the basis) an item, so that a
         * region is one block, merged in shared memory without the arrival and the region
         * merge. Judged on max_tokens, so that a hint never lengthens the items. */
        if (fused && max_tokens <= MKV_TC_WARPS * T::single_block_max_item)
            while ((int64_t)MKV_TC_WARPS * w.item_tokens < basis) w.item_tokens *= 2;
        if (w.item_tokens > max_item) w.item_tokens = max_item;
        /* cap_blocks > 0: halved while the logits of the items in flight would fill more than
         * l2_logits_num / l2_logits_den of L2, as long as a section keeps at most
         * l2_cap_max_items items. */
        const int64_t l2 = device_attr(cudaDevAttrL2CacheSize, T::fallback_l2_bytes);
        const int64_t warps = (int64_t)sms * cap_blocks * MKV_TC_WARPS;
        while (cap_blocks > 0 && w.item_tokens > T::l2_cap_min_item &&
               warps * w.item_tokens * G * 4 > l2 * T::l2_logits_num / T::l2_logits_den &&
               ((int64_t)max_tokens + w.item_tokens / 2 - 1) / (w.item_tokens / 2) <= T::l2_cap_max_items)
            w.item_tokens /= 2;
    }
    w.sec_items = (int32_t)(((int64_t)max_tokens + w.item_tokens - 1) / w.item_tokens);
    const size_t rs = (size_t)n_seq * (size_t)H, rg = rs * (size_t)G;
    const size_t slots = rg * 2 * (size_t)w.sec_items; /* (region, item slot, head) */
    size_t off = 0;
    w.off_logits = off; /* WS_ALIGN-aligned rows of item_tokens * G floats (a multiple of 256 B) */
    const size_t n_tok = rs * ((size_t)w.sec_items + 1) * (size_t)w.item_tokens;
    w.lg_n_tok = (int64_t)n_tok;
    size_t lg_bytes = n_tok * (size_t)G * sizeof(float);
    const size_t compact_bytes = G >= 2 ? mkv_tc_compact_layout(n_tok, G).bytes : 0;
    if (compact_bytes > lg_bytes) lg_bytes = compact_bytes;
    off += mkv_align_up64((int64_t)lg_bytes, WS_ALIGN);
    w.off_part_o = off;
    off += mkv_align_up64((int64_t)(slots * (size_t)d * sizeof(float)), WS_ALIGN);
    w.off_part_ml = off;
    off += mkv_align_up64((int64_t)(slots * 2 * sizeof(float)), WS_ALIGN);
    w.off_ready = off; /* the separate pass's ready flags, a part slot's each (tc_args::ready) */
    if (!fused) off += mkv_align_up64((int64_t)(rs * 2 * (size_t)w.sec_items * sizeof(int32_t)), WS_ALIGN);
    w.total_ids = ((w.sec_items + MKV_TC_WARPS - 1) / MKV_TC_WARPS + 1) * (int64_t)rs;
    w.hi_item = 0, w.sep_slots = (int32_t)mkv_align_up64(w.sec_items + 1, MKV_TC_SEP_WARPS);
    w.hi_align = false;
    w.off_counters = off; /* the fused kernel's only */
    if (fused) off += mkv_align_up64((int64_t)((rs + 4 + (size_t)w.total_ids) * sizeof(int32_t)), WS_ALIGN);
    w.off_lse = off;
    if (fused) off += mkv_align_up64((int64_t)(rg * sizeof(float)), WS_ALIGN);
    w.bytes = off;
    return w;
}

/* The tensor-core kernel for a layout at head_dim ({NULL, NULL} where none is instantiated:
 * a format or head_dim left out of the build, or quantization groups it does not cover). */
tc_kernel tc_for(const mkv_page_layout_t *l, int32_t head_dim)
{
    return mkv_tc_lookup(l->key.bits, l->value.bits, head_dim, l->key.groups, l->value.groups);
}

/* The kernel that covers both sections in one launch: the format's own where both sections
 * share it, else the two-format kernel where one is instantiated ({NULL, NULL} if none: two
 * launches, one per section). */
tc_kernel tc_one_launch(const mkv_cuda_decode_t *a)
{
    const mkv_page_layout_t *hi = &a->lay_hi, *lo = &a->lay_lo;
    const int32_t head_dim = a->head_dim;
    const tc_kernel fh = tc_for(hi, head_dim), fl = tc_for(lo, head_dim);
    if (fh.launch == nullptr || fl.launch == nullptr) return tc_kernel{nullptr, nullptr, nullptr, nullptr};
    if (fh.launch == fl.launch) return fh;
    if (a->kernel == MKV_DECODE_KERNEL_TENSOR_PER_SECTION) return tc_kernel{nullptr, nullptr, nullptr, nullptr};
    return mkv_tc_lookup_mix(hi->key.bits, hi->value.bits, hi->key.groups, hi->value.groups, lo->key.bits,
                             lo->value.bits, lo->key.groups, lo->value.groups, head_dim);
}

static bool same_format(const mkv_page_layout_t &x, const mkv_page_layout_t &y)
{
    return x.key.bits == y.key.bits && x.value.bits == y.value.bits && x.key.groups == y.key.groups &&
           x.value.groups == y.value.groups;
}

/* Whether a tensor-core call may write its scores back inside the decode kernel: one launch
 * for both sections (one, the kernel for that, exists), and asked for (FUSED), or under AUTO
 * where it is faster (mkv_decode_tuning's fuse_*): small calls of long regions (any format),
 * one format's long regions in any call, K16V16 in large calls, large calls of single-block
 * regions. Shorter regions in larger quantized calls, and two-format calls but small ones of
 * long regions, measured faster with the separate pass. On GPUs of fast DRAM per SM (the
 * H200; decision 99) only K16V16's large calls and single-block regions' are fused. */
static bool tc_may_fuse(const mkv_cuda_decode_t *a, const tc_kernel &one)
{
    using T = mkv_decode_tuning;
    if (a->scores == MKV_DECODE_SCORES_SEPARATE || one.launch == nullptr) return false;
    if (a->scores == MKV_DECODE_SCORES_FUSED) return true;
    const mkv_page_layout_t &l = a->lay_hi;
    const int64_t token_heads = (int64_t)a->n_seq * a->n_heads * a->max_tokens;
    const double bpc = mkv_cuda_dram_bytes_per_sm_cycle();
    const bool long_rules = !(bpc >= T::fuse_long_max_dram_bytes_per_sm_cycle); /* (unknown: as the H100) */
    const bool small = long_rules && token_heads <= T::fuse_max_small_token_heads;
    /* Without a score write-back the fused kernel only merges (in the region's last block):
     * one launch, as fast or faster from 2^17 token-heads up; the smallest calls are faster
     * without its counters and queue (decode_tuning.h). Two-format calls keep their rule
     * below (the fused mix without scores: 81 x 6000, spread 0.7, 242.6 against 209.8 us
     * separate). */
    if (a->no_scores && same_format(a->lay_hi, a->lay_lo)) return token_heads > T::fuse_no_scores_min_token_heads;
    /* Two formats: only small calls of long regions, as for one format (decode_tuning.h). */
    if (!same_format(a->lay_hi, a->lay_lo)) return small && a->max_tokens >= T::fuse_small_min_region_tokens;
    /* Large calls whose regions each fit one decode block (at most MKV_TC_WARPS items of the
     * default size): the fused kernel's single-block regions need no merge across blocks and
     * run their own score jobs. */
    if (token_heads >= T::fuse_min_single_block_token_heads && a->split_tokens == 0) {
        const int32_t sms = device_attr(cudaDevAttrMultiProcessorCount, T::fallback_sms);
        const int32_t item = mkv_tc_item_tokens(a->n_seq, a->n_heads, a->max_tokens, sms);
        if ((int64_t)a->max_tokens <= (int64_t)MKV_TC_WARPS * item) return true;
    }
    const bool k16v16 = l.key.bits == 16 && l.value.bits == 16;
    if (!long_rules) return k16v16 && token_heads >= T::fuse_min_k16v16_token_heads;
    return (small && a->max_tokens >= T::fuse_small_min_region_tokens) || a->max_tokens >= T::fuse_min_region_tokens ||
           (k16v16 && token_heads >= T::fuse_min_k16v16_token_heads);
}

/* Compact logits for a fused call with scores (decode_tc.h, mkv_cuda_decode_logits_t): where
 * they are smaller (G >= 2); under AUTO, on GPUs where the kernel waits on DRAM rather than on
 * issue. */
static bool tc_compact(const mkv_cuda_decode_t *a)
{
    if (a->logits == MKV_DECODE_LOGITS_FP32 || a->group_size < 2) return false;
    if (a->logits == MKV_DECODE_LOGITS_COMPACT) return true;
    const double b = mkv_cuda_dram_bytes_per_sm_cycle();
    return b > 0.0 && b < mkv_decode_tuning::compact_max_dram_bytes_per_sm_cycle;
}

/* The item cap of a two-format call (mkv_decode_tuning::two_format_min_items): the largest
 * power of two that cuts max_tokens into at least that many items, at least
 * MKV_TC_MIN_ITEM. */
static int32_t two_format_max_item(int32_t max_tokens)
{
    int32_t item = MKV_TC_MAX_ITEM;
    while (item > MKV_TC_MIN_ITEM && (int64_t)item * mkv_decode_tuning::two_format_min_items > max_tokens)
        item /= 2;
    return item;
}

/* blocks: the kernel's resident blocks per multiprocessor (0 if unknown). */
static tc_plan plan_for(const mkv_cuda_decode_t *a, bool fused, int32_t blocks)
{
    /* Fused with wide keys: items capped for L2, so that more logits are read back from it;
     * narrower keys are bound by instruction issue and gain more from long items, whose
     * pipeline fill and drain cost fewer issue slots: uncapped with fp32 logits, at most
     * compact_max_item tokens with compact logits (mkv_decode_tuning). */
    using T = mkv_decode_tuning;
    int32_t cap = 0, max_item = MKV_TC_MAX_ITEM;
    /* The separate pass keeps fp32 logits, forced or not: its decode pass waits on issue, not
     * on the logits' bytes (H100, the mix 20/50/30 separate, fp32 against compact: 81 x 6,000
     * spread 177.2 against 180.9 us, 64 x 16k 474.0 against 476.5), and its kernel is built
     * without the compact form (decision 89: as an untaken branch in the item loop it cost
     * every separate call 2 to 4%). */
    const bool compact = fused && !a->no_scores && tc_compact(a);
    /* (no logits to keep in L2 without a score write-back) */
    if (fused && !a->no_scores && a->lay_hi.key.bits >= T::l2_cap_min_key_bits)
        cap = blocks >= 1 && blocks <= T::l2_cap_max_blocks ? blocks : +T::l2_cap_max_blocks;
    else if (fused && compact)
        max_item = T::compact_max_item;
    if (!same_format(a->lay_hi, a->lay_lo))
        max_item = std::min(max_item, two_format_max_item(item_basis(a->max_tokens, a->mean_tokens)));
    tc_plan w = plan_tc(a->n_seq, a->n_heads, a->group_size, a->head_dim, a->max_tokens,
                        a->split_tokens, fused, cap, max_item, a->mean_tokens);
    w.compact = compact;
    return w;
}

/* Whether a fused call queues each region's last block after all others
 * (tc_args::last_blocks_last): one format, and without a score write-back, or with one for
 * single-block regions of narrow keys (mkv_decode_tuning::last_blocks_last_max_key_bits). */
static bool last_blocks_last(const mkv_cuda_decode_t *a, const tc_plan &w)
{
    return same_format(a->lay_hi, a->lay_lo) &&
           (a->no_scores || (a->lay_hi.key.bits <= mkv_decode_tuning::last_blocks_last_max_key_bits &&
                             w.sec_items <= MKV_TC_WARPS));
}

/* The regions of a fused call that end its queue in items of half the size (tc_args::tail_rs):
 * the queue's order above, without a score write-back (whose logits' slots follow the item
 * size), 16-bit keys, regions of several blocks, more than tail_min_waves waves of resident
 * blocks: about a wave's worth of the last regions. 0 elsewhere (mkv_decode_tuning says what
 * was measured). */
static int32_t tail_regions(const mkv_cuda_decode_t *a, const tc_plan &w, int32_t blocks)
{
    const int64_t resident = (int64_t)blocks * device_attr(cudaDevAttrMultiProcessorCount, 0);
    const int32_t blocks_per_sec = (w.sec_items + MKV_TC_WARPS - 1) / MKV_TC_WARPS;
    if (!a->no_scores || !last_blocks_last(a, w) || a->lay_hi.key.bits != 16 || a->split_tokens != 0 ||
        w.item_tokens < 2 * MKV_TC_MIN_ITEM || blocks_per_sec < 2 || resident <= 0 ||
        w.total_ids <= mkv_decode_tuning::tail_min_waves * resident)
        return 0;
    const int64_t n_rs = (int64_t)a->n_seq * a->n_heads, grid_x = blocks_per_sec + 1;
    return (int32_t)std::min(n_rs, (resident + grid_x - 1) / grid_x);
}

/* The regions of a fused call that start its queue in items of half the size (tc_args::head_rs,
 * decision 96): as tail_regions, but in calls of more than one wave, and in single-block
 * regions of full blocks of short items (mkv_decode_tuning::head_single_max_item); as many as
 * give mkv_decode_tuning::head_per_mille of the resident blocks half-size items (a half
 * region's blocks are the tail regions'), so that the first wave's blocks end at two times,
 * not all at one. mkv_tc_head_override: -1 none, > 0 that per mille. */
static int32_t head_regions(const mkv_cuda_decode_t *a, const tc_plan &w, int32_t blocks)
{
    using T = mkv_decode_tuning;
    const int32_t o = mkv_tc_head_override;
    const int64_t resident = (int64_t)blocks * device_attr(cudaDevAttrMultiProcessorCount, 0);
    const bool single = w.sec_items <= MKV_TC_WARPS;
    if (o < 0 || !a->no_scores || !last_blocks_last(a, w) || a->lay_hi.key.bits != 16 || a->split_tokens != 0 ||
        w.item_tokens < 2 * MKV_TC_MIN_ITEM || w.wave_blocks != 0 || w.piece_tokens != 0 || resident <= 0 ||
        w.total_ids <= resident || (single && (w.sec_items != MKV_TC_WARPS || w.item_tokens > T::head_single_max_item)))
        return 0;
    const int64_t n_rs = (int64_t)a->n_seq * a->n_heads;
    const int64_t half_blocks = (2 * (int64_t)w.sec_items + MKV_TC_WARPS - 1) / MKV_TC_WARPS;
    const int64_t pm = o > 0 ? o : T::head_per_mille;
    return (int32_t)std::min<int64_t>(n_rs - w.tail_regions, resident * pm / 1000 / half_blocks);
}

/* A fused K16V16 call without scores (AUTO items): the plan with longer items where they make
 * the call one wave (blocks per multiprocessor: the resident blocks), keeping
 * small_call_min_items items (mkv_decode_tuning): items doubled up to
 * single_block_wave_max_item while the call keeps them, where that leaves single-block regions
 * that a wave holds; else, for a call of more than a wave, the least doubling up to
 * one_wave_max_item that a wave holds; else w. */
static tc_plan one_wave_items(const mkv_cuda_decode_t *a, const tc_plan &w, int32_t blocks)
{
    using T = mkv_decode_tuning;
    const int64_t resident = (int64_t)blocks * device_attr(cudaDevAttrMultiProcessorCount, 0);
    const int64_t n_rs = (int64_t)a->n_seq * a->n_heads, n = a->max_tokens;
    if (!a->no_scores || a->split_tokens != 0 || !same_format(a->lay_hi, a->lay_lo) || a->lay_hi.key.bits != 16 ||
        a->lay_hi.value.bits != 16 || resident <= 0)
        return w;
    const auto items = [&](int64_t item) { return (n + item - 1) / item; }; /* a region's */
    const auto wave = [&](int64_t item) { return n_rs * ((items(item) + MKV_TC_WARPS - 1) / MKV_TC_WARPS); };
    const auto with = [&](int32_t item) {
        return plan_tc(a->n_seq, a->n_heads, a->group_size, a->head_dim, a->max_tokens, item, true, 0,
                       MKV_TC_MAX_ITEM, a->mean_tokens);
    };
    int32_t item = w.item_tokens;
    while (2 * item <= T::single_block_wave_max_item && n_rs * items(2 * item) >= T::small_call_min_items) item *= 2;
    if (item > w.item_tokens && items(item) <= MKV_TC_WARPS && n_rs <= resident) return with(item);
    if (wave(w.item_tokens) <= resident) return w;
    for (item = 2 * w.item_tokens; item <= T::one_wave_max_item; item *= 2) {
        if (n_rs * items(item) < T::small_call_min_items) break;
        if (wave(item) <= resident) return with(item);
    }
    return w;
}

/* Whether a call may run in pieces: without a score write-back, one format in one layout on
 * both sections, where the kernel has a variant in pieces, and the knob not off. */
static bool pieces_fit(const mkv_cuda_decode_t *a, const tc_kernel &one)
{
    const mkv_page_layout_t &h = a->lay_hi, &l = a->lay_lo;
    bool same = same_format(h, l) && h.tokens == l.tokens;
    for (int i = MKV_SEG_KEY; i <= MKV_SEG_VALUE_META; i++) same = same && h.offset[i] == l.offset[i];
    return a->no_scores && same && one.pieces_blocks_per_sm != nullptr && mkv_tc_piece_tokens_override >= 0;
}

/* Whether AUTO's pieces and piece waves pay on this GPU: below
 * mkv_decode_tuning::pieces_max_dram_bytes_per_sm_cycle (decision 94). */
static bool pieces_pay()
{
    const double b = mkv_cuda_dram_bytes_per_sm_cycle();
    return b > 0.0 && b < mkv_decode_tuning::pieces_max_dram_bytes_per_sm_cycle;
}

/* The piece size of a fused call of plan w (tc_args::piece_tokens; 0: none), where pieces_fit:
 * under AUTO, calls of more than a wave of resident blocks (blocks per multiprocessor) whose
 * regions take piece_min_region_blocks blocks or more, on GPUs where pieces pay
 * (mkv_decode_tuning); else what bench_attention --pieces asks (mkv_tc_piece_tokens_override). */
static int32_t piece_tokens(const mkv_cuda_decode_t *a, const tc_kernel &one, const tc_plan &w, int32_t blocks)
{
    using T = mkv_decode_tuning;
    if (!pieces_fit(a, one)) return 0;
    const int32_t o = mkv_tc_piece_tokens_override;
    if (o > 0) return (int32_t)mkv_align_up64(o, 16);
    const int64_t resident = (int64_t)blocks * device_attr(cudaDevAttrMultiProcessorCount, 0);
    const int32_t region_blocks = (w.sec_items + MKV_TC_WARPS - 1) / MKV_TC_WARPS;
    return resident > 0 && w.total_ids > resident && region_blocks >= T::piece_min_region_blocks && pieces_pay()
               ? T::piece_tokens
               : 0;
}

/* A fused call of few long regions, where pieces_fit (mkv_decode_tuning::piece_wave_*,
 * wave_spares_*): one wave of blocks in pieces, each region b = floor(resident / regions)
 * blocks, its items cut to fill them and the spares after them (a multiple of
 * MKV_TC_MIN_ITEM): where b >= piece_wave_min_region_blocks, no spares and pieces of
 * piece_wave_tokens (decision 82; on GPUs where pieces pay, decision 94); where b >=
 * wave_spares_min_region_blocks, wave_spares blocks a region more, queued after every region's
 * first b (tc_args::wave_blocks; decision 83); but where pieces do not pay, from
 * static_wave_min_region_blocks blocks a region and static_wave_min_warp_tokens a warp, no
 * spares, pieces of piece_tokens after static first pieces (tc_plan::piece_static, decision
 * 102). mkv_tc_wave_spares_override: -1, neither; > 0, that
 * many spares wherever b >= 1. mkv_tc_piece_static_override: -1, no static pieces; > 0 with
 * mkv_tc_piece_tokens_override > 0, static first pieces of that per mille in a wave. Only
 * where the plan needs no more workspace than the fused plan of AUTO items (w0:
 * mkv_cuda_decode_workspace_size covers that one; longer items give fewer parts), so calls
 * whose AUTO items already fit a wave keep them. True with *w the plan; false, w untouched,
 * elsewhere. */
static bool piece_wave(const mkv_cuda_decode_t *a, const tc_kernel &one, const tc_plan &w0, tc_plan *w)
{
    using T = mkv_decode_tuning;
    const int32_t ko = mkv_tc_wave_spares_override, o = mkv_tc_piece_tokens_override, so = mkv_tc_piece_static_override;
    const bool forced_static = so > 0 && o > 0; /* the knobs: a wave in pieces of o, static first pieces */
    if (!pieces_fit(a, one) || (!forced_static && (ko < 0 || (o != 0 && ko == 0))) || a->split_tokens != 0)
        return false;
    const int64_t n_rs = (int64_t)a->n_seq * a->n_heads;
    const int64_t resident = (int64_t)one.pieces_blocks_per_sm() * device_attr(cudaDevAttrMultiProcessorCount, 0);
    const int64_t wb = mkv_tc_wave_blocks_override; /* (forced: that many blocks a region) */
    const int64_t b = wb > 0 ? wb : n_rs > 0 && resident > 0 ? resident / n_rs : 0;
    if (wb > 0 && wb * n_rs > resident) return false;
    int64_t spares = forced_static ? 0 : ko;
    int32_t stat = forced_static ? so : 0;
    if (!forced_static && ko == 0) {
        if (!pieces_pay() && so == 0 && b >= T::static_wave_min_region_blocks &&
            a->max_tokens >= b * MKV_TC_WARPS * T::static_wave_min_warp_tokens) {
            spares = 0, stat = T::static_wave_per_mille; /* decision 102 */
        } else {
            const bool wave = b >= T::piece_wave_min_region_blocks;
            if (wave && !pieces_pay()) return false;
            spares = wave ? 0 : T::wave_spares;
            const int64_t min_tokens = wave ? T::piece_wave_min_warp_tokens : T::wave_spares_min_warp_tokens;
            if (b < T::wave_spares_min_region_blocks || a->max_tokens < (b + spares) * MKV_TC_WARPS * min_tokens)
                return false;
        }
    }
    if (b < 1) return false;
    const int64_t warps = (b + spares) * MKV_TC_WARPS;
    const int64_t item = mkv_align_up64((a->max_tokens + warps - 1) / warps, MKV_TC_MIN_ITEM);
    if (item > MKV_TC_MAX_ITEM) return false;
    const tc_plan x = plan_tc(a->n_seq, a->n_heads, a->group_size, a->head_dim, a->max_tokens, (int32_t)item, true, 0,
                              MKV_TC_MAX_ITEM, a->mean_tokens);
    if (x.bytes > w0.bytes) return false;
    *w = x;
    w->piece_tokens = o > 0                    ? (int32_t)mkv_align_up64(o, 16)
                      : spares > 0 || stat > 0 ? T::piece_tokens
                                               : T::piece_wave_tokens;
    w->piece_static = stat;
    /* (queue_block: at most the region's blocks but its last) */
    const int64_t bps = (x.sec_items + MKV_TC_WARPS - 1) / MKV_TC_WARPS;
    w->wave_blocks = spares > 0 ? (int32_t)std::min(b, bps) : 0;
    return true;
}

/* The plan of a tensor-core call, and whether it fuses the score write-back (where it may and
 * its block ids fit an int32); blocks: the one-launch kernel's
 * resident blocks per multiprocessor, asked only where it may fuse (0 otherwise). */
/* Whether a separate call of one launch (one) sets ready flags (tc_args::ready, decision 84;
 * decode_tuning.h): blocks of at least ready_min_waves waves of the kernel's resident blocks,
 * items of ready_min_item tokens or more, and waves x ready_wave_tokens at most the item size;
 * the blocks a region's items of the item basis (mean_tokens where given) fill, both sections'
 * last items partial. mkv_tc_ready_override: -1 never, 1 always. */
/* MIXKV_DECODE_READY=off|on in the environment: the override for a process that cannot set it
 * (serve-bench's A/B of the flags in one binary); read once, anything else is AUTO. */
static int32_t ready_env()
{
    static const int32_t v = [] {
        const char *e = getenv("MIXKV_DECODE_READY");
        return e == nullptr ? 0 : !strcmp(e, "off") ? -1 : !strcmp(e, "on") ? 1 : 0;
    }();
    return v;
}

static bool ready_flags(const mkv_cuda_decode_t *a, const tc_kernel &one, const tc_plan &w)
{
    using T = mkv_decode_tuning;
    if (one.launch == nullptr) return false;
    const int32_t o = mkv_tc_ready_override != 0 ? mkv_tc_ready_override : ready_env();
    if (o != 0) return o > 0;
    const int32_t per_sm = one.sep_blocks_per_sm ? one.sep_blocks_per_sm() : 0;
    if (per_sm <= 0) return false;
    const int64_t sms = device_attr(cudaDevAttrMultiProcessorCount, T::fallback_sms), resident = per_sm * sms;
    const int64_t items = (item_basis(a->max_tokens, a->mean_tokens) + w.item_tokens - 1) / w.item_tokens + 1;
    const int64_t blocks = (int64_t)a->n_seq * a->n_heads * ((items + MKV_TC_SEP_WARPS - 1) / MKV_TC_SEP_WARPS);
    /* Under ready_min_waves waves: from ready_wave_min_sm_blocks blocks a multiprocessor, items
     * of ready_wave_min_item tokens or more (decision 101). */
    if (blocks < T::ready_min_waves * resident)
        return blocks >= T::ready_wave_min_sm_blocks * sms && w.item_tokens >= T::ready_wave_min_item;
    return w.item_tokens >= T::ready_min_item && blocks * T::ready_wave_tokens <= resident * w.item_tokens;
}

/* A two-format separate call's item where its plan (item w.item_tokens) fills less than a wave
 * of resident blocks (resident: the separate kernel's, 0 if unknown): the shortest multiple of
 * MKV_TC_MIN_ITEM, at least wave_fill_min_item and below the plan's, whose grid (a region's
 * items of the item basis, both sections' last partial, MKV_TC_SEP_WARPS a block) still fits
 * one wave; the plan's item where none does. plan_call takes it where its plan fits the
 * workspace mkv_cuda_decode_workspace_size gives the call (at every shape measured), so that
 * the workspace keeps its size. */
static int32_t wave_fill_item(int64_t n_rs, int32_t basis, int32_t item, int64_t resident)
{
    const auto blocks = [&](int64_t i) {
        return n_rs * (((basis + i - 1) / i + 1 + MKV_TC_SEP_WARPS - 1) / MKV_TC_SEP_WARPS);
    };
    if (resident <= 0 || blocks(item) > resident) return item;
    for (int64_t i = mkv_decode_tuning::wave_fill_min_item; i < item; i += MKV_TC_MIN_ITEM)
        if (blocks(i) <= resident) return (int32_t)i;
    return item;
}

/* A separate call of one sequence whose plan (item `item`) has more blocks than
 * mkv_decode_tuning::one_seq_spill_num / one_seq_spill_den of the GPU's multiprocessors: the
 * shortest longer multiple of MKV_TC_MIN_ITEM, at most max_item, whose grid (a region's items of
 * the item basis, a section's last partial where the sections' formats differ,
 * MKV_TC_SEP_WARPS a block) is one block a multiprocessor; `item` where the grid is smaller or
 * no such item is. At batch 1 a block is a chain of dependent loads and mma steps at one warp
 * a scheduler: the multiprocessors holding two blocks end last, and longer items (fewer merge
 * rounds, decode_tc_finalize.cu) cost less than that where many of them do. */
static int32_t one_seq_item(int32_t H, int32_t basis, int32_t item, int32_t max_item, bool two_sections,
                            int32_t sms)
{
    using T = mkv_decode_tuning;
    const auto blocks = [&](int64_t i) {
        return (int64_t)H * (((basis + i - 1) / i + (two_sections ? 1 : 0) + MKV_TC_SEP_WARPS - 1) / MKV_TC_SEP_WARPS);
    };
    if (blocks(item) * T::one_seq_spill_den <= (int64_t)sms * T::one_seq_spill_num) return item;
    for (int64_t i = mkv_align_up64(item + 1, MKV_TC_MIN_ITEM); i <= max_item; i += MKV_TC_MIN_ITEM)
        if (blocks(i) <= sms) return (int32_t)i;
    return item;
}

/* One format of quantized keys in a separate call of few regions (mkv_decode_tuning::
 * few_region_blocks): the shortest multiple of MKV_TC_MIN_ITEM that cuts the item basis into
 * at most few_region_blocks blocks of MKV_TC_SEP_WARPS items (one merge round), so that the
 * grid holds about few_region_waves blocks a multiprocessor; `item` where that is shorter than
 * few_region_min_item tokens. */
static int32_t few_region_item(int32_t basis, int32_t item)
{
    using T = mkv_decode_tuning;
    const int64_t items = (int64_t)T::few_region_blocks * MKV_TC_SEP_WARPS;
    const int64_t i = mkv_align_up64((basis + items - 1) / items, MKV_TC_MIN_ITEM);
    return i < T::few_region_min_item ? item : (int32_t)std::min<int64_t>(i, MKV_TC_MAX_ITEM);
}

/* A separate K16V16 call of more than a wave of blocks (resident: the separate kernel's; its
 * grid is sized by max_tokens, hint or none) whose items (`item`), doubled up to
 * mkv_decode_tuning::one_wave_max_item tokens while the call keeps small_call_min_items, fit
 * one wave: the first such size, else `item` (decision 100; the separate pass's form of
 * one_wave_items). A hint never lengthens the items beyond the plain call's: both double along
 * the same powers of two to the same bound. */
static int32_t sep_wave_item(int64_t n_rs, int32_t max_tokens, int32_t item, int64_t resident)
{
    using T = mkv_decode_tuning;
    const auto items = [&](int64_t i) { return (max_tokens + i - 1) / i; };
    const auto blocks = [&](int64_t i) { return n_rs * ((items(i) + 1 + MKV_TC_SEP_WARPS - 1) / MKV_TC_SEP_WARPS); };
    if (resident <= 0 || blocks(item) <= resident) return item;
    for (int64_t i = 2 * (int64_t)item; i <= T::one_wave_max_item; i *= 2) {
        if (n_rs * items(i) < T::small_call_min_items) break;
        if (blocks(i) <= resident) return (int32_t)i;
    }
    return item;
}

/* A layout's bytes a token, all its segments. */
static int64_t token_bytes(const mkv_page_layout_t &l) { return l.tokens > 0 ? l.used_bytes / l.tokens : 0; }

/* The separate pass's one launch of two formats (w: its plan), one sequence whose grid is more
 * than a block a multiprocessor: the high section's items of the fewest tokens above w's and
 * under twice it whose grid, with room for a region of max_tokens whose high share is up to
 * hi_item_share, is at most a block a multiprocessor, where the high format reads
 * hi_item_bytes_ratio times the low one's bytes a token or more: the call's items then all run
 * at once, one block an SM (decision 88; its high items shorter than the low ones' no longer
 * gain after decisions 90 to 92, decision 93). Not with compact logits (a softmax step's slots are
 * item-aligned) nor ready flags (calls of two waves or more). mkv_tc_hi_item_override: -1
 * never, > 0 those tokens (rounded up to 16; longer than the item too) wherever the launch is
 * one. */
static void high_items(const mkv_cuda_decode_t *a, const tc_kernel &one, int32_t sms, tc_plan *w)
{
    using T = mkv_decode_tuning;
    if (one.launch == nullptr || same_format(a->lay_hi, a->lay_lo) || w->compact || w->ready) return;
    const int32_t o = mkv_tc_hi_item_override, I = w->item_tokens;
    if (o < 0) return;
    /* A region's item slots with high items of h tokens (whole blocks, within its part slots). */
    const int64_t N = a->max_tokens, nh = (N * T::hi_item_share_num + T::hi_item_share_den - 1) / T::hi_item_share_den;
    const auto slots = [&](int64_t h) {
        const int64_t v = (nh + h - 1) / h + (N - nh + I - 1) / I + 1;
        return (int32_t)mkv_align_up64(std::min<int64_t>(v, 2 * (int64_t)w->sec_items), MKV_TC_SEP_WARPS);
    };
    int32_t h = o > 0 ? (int32_t)mkv_align_up64(o, 16) : 0;
    if (o == 0) {
        if (token_bytes(a->lay_hi) * T::hi_item_bytes_ratio_den < token_bytes(a->lay_lo) * T::hi_item_bytes_ratio)
            return;
        const int64_t n_rs = (int64_t)a->n_seq * a->n_heads;
        const auto fits = [&](int32_t x) { return n_rs * (slots(x) / MKV_TC_SEP_WARPS) <= sms; };
        /* Shorter high items than low ones no longer gain once K8V4's step runs fewer
         * instructions than K4V2's (decisions 90 to 92; H200 sweep: 1 x 1k 11.39 us with 16
         * against 10.94 without, 1 x 4k 13.38 against 13.20, nowhere a gain): only longer ones.
         * One sequence, and w's grid more than a block a multiprocessor (decision 86 leaves up
         * to 9/8): high items longer than w's, under twice its, where they bring the grid
         * under (at two sequences this lost: 2 x 3k 15.92 against 16.42 us). */
        const bool over = a->n_seq == 1 && n_rs * (w->sep_slots / MKV_TC_SEP_WARPS) > sms;
        for (int32_t x = I + 16; h == 0 && over && x < 2 * I; x += 16)
            if (fits(x)) h = x;
    }
    if (h <= 0 || h == I) return;
    w->hi_item = h, w->sep_slots = std::max(w->sep_slots, slots(h));
}

/* A two-format separate call's low items from a block of their own (tc_args::hi_align,
 * decision 109) where its grid, with the high section's last block padded, holds at most a
 * block a multiprocessor: the straddling block, whose warps run both formats' code, had
 * started its items 0.3 to 0.6 us after the others at 1 x 1.5k (H200, timeline stamps) and
 * ended the call's items last; where blocks share multiprocessors the padding's extra full
 * block lost more (2 x 1.5k and 4 x 1.5k, 4 to 5%). Not with ready flags (their slots are the
 * blocks' own) nor high items of their own. mkv_tc_hi_align_override: -1 never, 1 wherever
 * those allow. */
static void align_sections(const mkv_cuda_decode_t *a, const tc_kernel &one, int32_t sms, tc_plan *w)
{
    w->hi_align = false;
    const int32_t o = mkv_tc_hi_align_override;
    if (one.launch == nullptr || same_format(a->lay_hi, a->lay_lo) || w->ready || w->hi_item != 0 || o < 0) return;
    /* a region's items with the padding: at most sec_items + 1 and MKV_TC_SEP_WARPS - 1 idle */
    const int32_t slots = (int32_t)mkv_align_up64(w->sec_items + MKV_TC_SEP_WARPS, MKV_TC_SEP_WARPS);
    if (o == 0) {
        const int64_t n_rs = (int64_t)a->n_seq * a->n_heads;
        if (n_rs * (slots / MKV_TC_SEP_WARPS) > sms) return;
    }
    w->hi_align = true, w->sep_slots = std::max(w->sep_slots, slots);
}

/* The blocks that merge each region of fused plan w (tc_args::merge_split, decision 105): where
 * the grid holds every block id at once (the waits of a region's last blocks for its last are
 * then on running blocks) and its regions have merge_split_min_parts parts or more, the last
 * merge_split of them, each a slice; else 1. mkv_tc_merge_split_override: -1 or 1, 1; N > 1, N
 * wherever the grid holds every id. */
static int32_t merge_split(const mkv_cuda_decode_t *a, const tc_plan &w, int32_t blocks)
{
    using T = mkv_decode_tuning;
    const int64_t n_rs = (int64_t)a->n_seq * a->n_heads;
    const int64_t half = w.tail_regions + w.head_regions; /* regions of half-size items */
    const int64_t gx = (w.sec_items + MKV_TC_WARPS - 1) / MKV_TC_WARPS + 1;
    const int64_t tgx = (2 * w.sec_items + MKV_TC_WARPS - 1) / MKV_TC_WARPS + 1;
    const int64_t ids = (n_rs - half) * gx + half * tgx; /* (decode_cuda.cu's total_ids) */
    const int64_t resident = (int64_t)blocks * device_attr(cudaDevAttrMultiProcessorCount, 0);
    const int32_t o = mkv_tc_merge_split_override, n4 = a->group_size * a->head_dim / 4;
    if (resident <= 0 || ids > resident || o < 0 || o == 1) return 1;
    if (o > 1) return std::min(o, n4);
    return gx - 1 >= T::merge_split_min_parts ? std::min(T::merge_split, n4) : 1;
}

tc_plan plan_call(const mkv_cuda_decode_t *a, const tc_kernel &one, bool *fused, int32_t *blocks)
{
    *blocks = 0;
    if (tc_may_fuse(a, one)) {
        *blocks = one.blocks_per_sm();
        const tc_plan w0 = plan_for(a, true, *blocks);
        tc_plan w = one_wave_items(a, w0, *blocks);
        /* (the kernel in pieces holds as many blocks where it is chosen: 3 an SM, d 128) */
        if (!piece_wave(a, one, w0, &w)) w.piece_tokens = piece_tokens(a, one, w, *blocks);
        if (w.piece_tokens > 0) *blocks = one.pieces_blocks_per_sm();
        if (w.total_ids < INT32_MAX / 2) {
            /* (tail regions at most double the ids) */
            w.last_blocks_last = last_blocks_last(a, w);
            w.tail_regions = w.total_ids < INT32_MAX / 4 && w.wave_blocks == 0 ? tail_regions(a, w, *blocks) : 0;
            w.head_regions = w.total_ids < INT32_MAX / 4 ? head_regions(a, w, *blocks) : 0;
            w.merge_split = merge_split(a, w, *blocks);
            *fused = true;
            return w;
        }
    }
    *fused = false;
    tc_plan w = plan_for(a, false, *blocks);
    using T = mkv_decode_tuning;
    const bool two = !same_format(a->lay_hi, a->lay_lo);
    const int32_t basis = item_basis(a->max_tokens, a->mean_tokens);
    const int32_t sms = device_attr(cudaDevAttrMultiProcessorCount, T::fallback_sms);
    const int64_t n_rs = (int64_t)a->n_seq * a->n_heads;
    /* The plan of items `item` in place of w's, where it needs at most `limit` bytes. */
    const auto adopt = [&](int32_t item, size_t limit) {
        if (item == w.item_tokens) return;
        mkv_cuda_decode_t b = *a;
        b.split_tokens = item;
        tc_plan x = plan_for(&b, false, *blocks);
        if (x.bytes <= limit) {
            x.compact = w.compact;
            w = x;
        }
    };
    /* What the workspace the call was given holds beyond w: the two-format separate plan at the
     * smallest item basis, one of those workspace_bytes takes for every call. */
    const auto covered = [&]() {
        const int32_t floor = item_basis(a->max_tokens, 1);
        return std::max(w.bytes, plan_tc(a->n_seq, a->n_heads, a->group_size, a->head_dim, a->max_tokens, 0, false, 0,
                                         two_format_max_item(floor), floor)
                                     .bytes);
    };
    if (a->split_tokens == 0 && two && a->n_seq >= 2 && w.item_tokens == MKV_TC_MIN_ITEM) {
        /* Few sequences: twice the shortest items where those spill past a block a
         * multiprocessor (decision 95; mkv_decode_tuning::one_seq_spill_*). */
        const int64_t grid = n_rs * (((basis + MKV_TC_MIN_ITEM - 1) / MKV_TC_MIN_ITEM + 1 + MKV_TC_SEP_WARPS - 1) /
                                     MKV_TC_SEP_WARPS);
        if (grid * T::one_seq_spill_den > (int64_t)sms * T::one_seq_spill_num) adopt(2 * MKV_TC_MIN_ITEM, covered());
    }
    if (a->split_tokens == 0 && two && one.launch && one.sep_blocks_per_sm)
        adopt(wave_fill_item(n_rs, basis, w.item_tokens, (int64_t)one.sep_blocks_per_sm() * sms), covered());
    if (a->split_tokens == 0 && a->n_seq == 1) {
        /* (longer items: fewer part slots for about the same logit rows; no larger a plan) */
        const int32_t max_item = two                        ? two_format_max_item(basis)
                                 : a->lay_hi.key.bits < 16 ? +T::one_seq_max_quant_item
                                                           : MKV_TC_MAX_ITEM;
        adopt(one_seq_item(a->n_heads, basis, w.item_tokens, max_item, two, sms), w.bytes);
    } else if (a->split_tokens == 0 && !two && a->lay_hi.key.bits < 16 &&
               n_rs * T::few_region_blocks <= (int64_t)T::few_region_waves * sms) {
        adopt(few_region_item(basis, w.item_tokens), covered());
    } else if (a->split_tokens == 0 && !two && a->lay_hi.key.bits == 16 && one.launch && one.sep_blocks_per_sm) {
        adopt(sep_wave_item(n_rs, a->max_tokens, w.item_tokens, (int64_t)one.sep_blocks_per_sm() * sms), covered());
    }
    w.ready = ready_flags(a, one, w);
    high_items(a, one, sms, &w);
    if (mkv_tc_hi_item_override == 0 && a->split_tokens == 0 && a->n_seq == 1 && two && w.hi_item == 0 &&
        w.item_tokens == 2 * MKV_TC_MIN_ITEM) {
        /* One sequence of items of 64 tokens: half the item with longer high items, where
         * those keep the grid at a block a multiprocessor (H200, 1 x 3k: 32 and 48 tokens
         * 12.67 us against 64 and none 13.17, a grid of 122 blocks against 88; at 4k to 6k
         * none fits). Longer items were not measured this way. */
        mkv_cuda_decode_t b = *a;
        b.split_tokens = (int32_t)mkv_align_up64(w.item_tokens / 2, MKV_TC_MIN_ITEM);
        tc_plan x = plan_for(&b, false, *blocks);
        x.compact = w.compact;
        x.ready = ready_flags(a, one, x);
        high_items(a, one, sms, &x);
        if (x.hi_item > x.item_tokens && x.bytes <= covered()) w = x;
    }
    align_sections(a, one, sms, &w);
    return w;
}

/* The plan mkv_cuda_decode would make for a call, and whether it fuses; false where the call
 * would not take the tensor-core kernels. */
static bool query_plan(const mkv_cuda_decode_t *a, tc_plan *w, bool *fused)
{
    if (!a || a->kernel == MKV_DECODE_KERNEL_GENERIC ||
        !sizes_ok(a->n_seq, a->n_heads, a->group_size, a->head_dim, a->max_tokens, a->split_tokens) ||
        !mkv_cuda_decode_uses_tensor(&a->lay_hi, &a->lay_lo, a->group_size, a->head_dim))
        return false;
    int32_t blocks;
    *w = plan_call(a, tc_one_launch(a), fused, &blocks);
    return true;
}

/* Any plan of these sizes: separate, or fused with any item cap, compact logits' cap, or a
 * two-format call's shorter items; and each of those for any mean_tokens hint. The item size
 * falls at most by half when its basis does (mkv_tc_item_tokens, two_format_max_item), so
 * bases halving from max_tokens to the floor meet every item size a hint can give. */
size_t workspace_bytes(int32_t n_seq, int32_t n_heads, int32_t group_size, int32_t head_dim, int32_t max_tokens,
                       int32_t split_tokens)
{
    using T = mkv_decode_tuning;
    size_t most = 0;
    const auto take = [&](const tc_plan &w) { most = std::max(most, w.bytes); };
    const int32_t floor = item_basis(max_tokens, 1);
    for (int32_t basis = max_tokens;; basis = std::max(basis / 2, floor)) {
        const int32_t mean = basis; /* item_basis(max_tokens, mean) == basis */
        take(plan_tc(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens, false, 0, MKV_TC_MAX_ITEM,
                     mean));
        for (int32_t cap = 0; cap <= T::l2_cap_max_blocks; cap++)
            take(plan_tc(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens, true, cap, MKV_TC_MAX_ITEM,
                         mean));
        take(plan_tc(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens, true, 0, T::compact_max_item,
                     mean));
        /* Fused calls without scores: items up to four times longer (one_wave_items). */
        if (split_tokens == 0) {
            const int32_t item = plan_tc(n_seq, n_heads, group_size, head_dim, max_tokens, 0, true, 0,
                                         MKV_TC_MAX_ITEM, mean).item_tokens;
            for (int32_t x = 2 * item; x <= std::max(T::one_wave_max_item, T::single_block_wave_max_item); x *= 2)
                take(plan_tc(n_seq, n_heads, group_size, head_dim, max_tokens, x, true, 0, MKV_TC_MAX_ITEM, mean));
        }
        /* Two-format calls: shorter items, more partial results. */
        const int32_t two = two_format_max_item(basis);
        for (int32_t cap = 0; cap <= T::l2_cap_max_blocks; cap++)
            for (int fused = 0; fused < 2; fused++)
                take(plan_tc(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens, fused, fused ? cap : 0,
                             two, mean));
        if (basis <= floor || split_tokens > 0) break;
    }
    return most;
}

} // namespace mkv_tc_plan

extern "C" int mkv_cuda_decode_uses_tensor(const mkv_page_layout_t *lay_hi,
                                           const mkv_page_layout_t *lay_lo, int32_t group_size,
                                           int32_t head_dim)
{
    return group_size >= 1 && group_size <= MKV_TC_MAX_G && lay_hi->used_bytes < INT32_MAX / 2 &&
           lay_lo->used_bytes < INT32_MAX / 2 && mkv_tc_plan::tc_for(lay_hi, head_dim).launch != nullptr &&
           mkv_tc_plan::tc_for(lay_lo, head_dim).launch != nullptr;
}

/* Cached per device: querying the clock-rate attributes is slow (a fraction of a millisecond),
 * which a decode call would otherwise spend before its launch. */
extern "C" double mkv_cuda_dram_bytes_per_sm_cycle(void)
{
    static std::atomic<double> cache[MKV_MAX_DEVICES];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
        (void)cudaGetLastError();
        dev = -1;
    }
    if (dev >= 0 && dev < MKV_MAX_DEVICES) {
        const double c = cache[dev].load(std::memory_order_relaxed);
        if (c > 0.0) return c;
    }
    const double mem_khz = mkv_tc_plan::device_attr(cudaDevAttrMemoryClockRate, 0);
    const double bus_bits = mkv_tc_plan::device_attr(cudaDevAttrGlobalMemoryBusWidth, 0);
    const double sms = mkv_tc_plan::device_attr(cudaDevAttrMultiProcessorCount, 0);
    const double sm_khz = mkv_tc_plan::device_attr(cudaDevAttrClockRate, 0);
    const double b = sms > 0 && sm_khz > 0 ? 2.0 * mem_khz * bus_bits / 8.0 / (sms * sm_khz) : 0.0;
    if (b > 0.0 && dev >= 0 && dev < MKV_MAX_DEVICES) cache[dev].store(b, std::memory_order_relaxed);
    return b;
}

extern "C" int32_t mkv_cuda_decode_item_tokens(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) ? w.item_tokens : 0;
}

extern "C" size_t mkv_cuda_decode_plan_bytes(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) ? w.bytes : 0;
}

extern "C" int mkv_cuda_decode_fuses_scores(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && fused;
}

extern "C" int32_t mkv_cuda_decode_tail_regions(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && fused ? w.tail_regions : 0;
}

extern "C" int32_t mkv_cuda_decode_head_regions(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && fused ? w.head_regions : 0;
}

extern "C" int32_t mkv_cuda_decode_piece_tokens(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && fused ? w.piece_tokens : 0;
}

extern "C" int32_t mkv_cuda_decode_piece_static(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && fused && w.piece_tokens > 0 ? w.piece_static : 0;
}

extern "C" int32_t mkv_cuda_decode_wave_blocks(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && fused && w.last_blocks_last ? w.wave_blocks : 0;
}

extern "C" int mkv_cuda_decode_ready_flags(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && !fused && w.ready;
}

extern "C" int32_t mkv_cuda_decode_hi_item_tokens(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && !fused ? w.hi_item : 0;
}

extern "C" int mkv_cuda_decode_hi_align(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && !fused && w.hi_align;
}

extern "C" int32_t mkv_cuda_decode_merge_blocks(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    if (!mkv_tc_plan::query_plan(a, &w, &fused) || fused) return 1;
    return mkv_tc_merge_blocks(a->group_size, a->head_dim, (int64_t)a->n_seq * a->n_heads, w.sec_items);
}

extern "C" int32_t mkv_cuda_decode_merge_split(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && fused ? w.merge_split : 1;
}

extern "C" int mkv_cuda_decode_compact_logits(const mkv_cuda_decode_t *a)
{
    mkv_tc_plan::tc_plan w;
    bool fused;
    return mkv_tc_plan::query_plan(a, &w, &fused) && w.compact;
}
