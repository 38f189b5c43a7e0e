/*
 * tc_decode.cuh — the tensor-core decode kernel template (interface in decode_tc.h, design
 * and numerics in docs/decode-kernel.md, "The tensor-core kernels"). Included only by the
 * generated per-format translation units, each instantiating one (key bits, value bits,
 * head_dim), or a pair of formats for the two-format kernel.
 *
 * This file holds the kernel itself: where a block's warps find their items (locate), the
 * persistent job queue of the fused kernel (decode_kernel), and the per-variant setup and
 * instantiation macros. Its parts, in the order they build on each other:
 *   tc_ptx.cuh      the PTX wrappers (mma, ldmatrix, cp.async, cache policies, ordering)
 *   tc_unpack.cuh   key and value runs into mma operands
 *   tc_staging.cuh  the shared-memory layout of staged subtiles, the walk over an item
 *   tc_query.cuh    q of an item in its key format's operand form
 *   tc_softmax.cuh  the online softmax's state and step, compact logits, the item's result
 *   tc_subtile.cuh  a subtile's logits and values (the two mma products)
 *   tc_item.cuh     run_item: one warp's item, its copy pipeline and the loop over the steps
 *   tc_merge.cuh    merge and score helpers shared with the finalize kernel
 *   tc_finish.cuh   the fused kernel's merge and score write-back jobs
 */
#ifndef MKV_ATTENTION_TC_DECODE_CUH
#define MKV_ATTENTION_TC_DECODE_CUH

#include "attention/decode_tc.h"
#include "attention/tc_finish.cuh"
#include "attention/tc_item.cuh"
#include "attention/tc_ptx.cuh"
#include "attention/tc_staging.cuh"
#include "attention/tc_trace.cuh"

#ifndef MKV_MAX_DEVICES
#define MKV_MAX_DEVICES 64 /* devices whose properties are cached */
#endif

#include <atomic>

#include <type_traits>

namespace mkv_tc {

/* Where block x (along grid x) of region (sequence j, KV head h) puts warp warp: x <
 * blocks_per_sec in the one section of the launch (sec_mask 1 or 2), or for both (sec_mask 3)
 * the high section's blocks first, then the low one's, then none; each block MKV_TC_WARPS
 * consecutive items of its section. any: whether the block has an item at all (a region's
 * blocks with one are x < arrivals); n_items: the region's items, high then low (its item
 * slots); part: the block's part slot and its warps with an item (block_merge). */
struct block_pos {
    item_pos ip;
    block_part part; /* stride left 0: the kernel's (the section format's) */
    bool work, any;
    int32_t items_hi, n_items, hi, n, arrivals;
    int32_t bta, btb; /* the block's tokens [bta, btb) of its section */
};

template <int W, bool ITEM_IDS = true>
__device__ __forceinline__ block_pos locate(const tc_args &a, int32_t bx, int32_t hh, int32_t j, bool packed = false,
                                            int32_t I = 0)
{
    if (I == 0) I = a.item_tokens; /* the fused kernel's tail regions: half (queue_block) */
    block_pos b;
    const int32_t warp = threadIdx.x >> 5;
    item_pos &ip = b.ip;
    ip.rs = (int64_t)j * a.H + hh; /* (sequence, KV head) */
    ip.region = a.regions[ip.rs];
    /* The region's page ids start (high section) and end (low section) on their way to L2
     * while its token counts load. */
    if (threadIdx.x < 2)
        prefetch_l2(a.table + ip.region * a.T + (threadIdx.x ? a.T - 1 : 0));
    /* And (ITEM_IDS), where the block is in the high section (bx below its blocks there;
     * guessed before the counts that say so arrive), the page ids of each warp's item: a
     * warp's first window then waits on L2 only. Not in the fused two-format kernels, where
     * this made ptxas spill (the fused one-group mix, scripts/decode_regs.sh); the separate
     * pass takes it in every kernel (decision 98). */
    if (ITEM_IDS && (threadIdx.x & 31) == 0) {
        const int64_t pg = (int64_t)(bx * W + warp) * I / a.sec[0].tpp;
        prefetch_l2(a.table + ip.region * a.T + (pg < a.T ? pg : a.T - 1));
    }
    const int64_t nh = max(a.n_hi[ip.region], 0), nl = max(a.n_lo[ip.region], 0);
    const int32_t n = (int32_t)min(nh + nl, (int64_t)a.max_tokens);
    const int32_t hi = (int32_t)min(nh, (int64_t)n);
    b.hi = hi, b.n = n;
    /* (the separate pass's high items: hi_item tokens where set and the region's items fit) */
    const int32_t Ih = packed ? high_item_tokens(a, hi, n) : I;
    b.items_hi = (hi + Ih - 1) / Ih;
    b.n_items = b.items_hi + (n - hi + I - 1) / I;
    const int32_t bh = (b.items_hi + W - 1) / W; /* the high section's blocks */
    b.arrivals = bh + (b.n_items - b.items_hi + W - 1) / W;
    int32_t sec;
    if (packed) {
        /* The separate pass's one launch: block x takes items W x .. W x + W - 1 of the region's
         * items, high then low, so that a block holds items of both sections where the high
         * one ends (a warp's format is its own) and a region's blocks are full but its last. */
        /* (hi_align: the low items from block bh, the high section's last block's spare
         * warps idle; the slots stay high then low. The low blocks go first in the grid's
         * order: their items, longer to start, end last otherwise.) */
        if (a.hi_align) {
            const int32_t nlb = (b.n_items - b.items_hi + W - 1) / W;
            bx = bx < nlb ? bh + bx : bx < nlb + bh ? bx - nlb : bx;
        }
        const int32_t k = bx * W + warp, k0 = a.hi_align ? bh * W : b.items_hi;
        sec = k >= k0;
        const int32_t item = k - sec * k0, It = sec ? I : Ih;
        ip.sec = sec;
        ip.sec_n = sec ? n - hi : hi;
        ip.ta = item * It;
        ip.tb = min(ip.ta + It, ip.sec_n);
        ip.slot_id = sec ? b.items_hi + item : k;
        ip.lg_tok = (sec ? (hi + I - 1) / I * I : 0) + ip.ta; /* (item_tokens' layout) */
        b.work = sec ? ip.ta < ip.sec_n : k < b.items_hi; /* warp-uniform */
        b.any = bx * W < k0 + b.n_items - b.items_hi;
        b.part = block_part{0, 0, 0};
        b.bta = b.btb = 0;
        return b;
    }
    if (a.sec_mask == 3) {
        sec = bx >= bh;
        bx -= sec * bh;
    } else {
        sec = a.sec_mask == 2;
    }
    ip.sec = sec;
    ip.sec_n = sec ? n - hi : hi;
    const int32_t item = bx * W + warp; /* within the section */
    ip.ta = item * I;
    ip.tb = min(ip.ta + I, ip.sec_n);
    ip.slot_id = sec ? b.items_hi + item : item;
    ip.lg_tok = ip.slot_id * a.item_tokens;
    b.part.slot = bx + sec * bh;
    b.part.n_work = max(0, min(W, (ip.sec_n + I - 1) / I - bx * W));
    b.part.stride = 0;
    b.bta = bx * W * I;
    b.btb = min(b.bta + W * I, ip.sec_n);
    b.work = ip.ta < ip.sec_n; /* warp-uniform */
    b.any = (int64_t)bx * W * I < ip.sec_n; /* block-uniform */
    return b;
}

/* Block x of region (sequence j, KV head hh) of a fused call in pieces (tc_args::piece_tokens):
 * locate's region, its blocks (items of I tokens, MKV_TC_WARPS a block, but no more blocks
 * than give each warp a piece) and part slot x; warp w's item is the region's piece
 * x MKV_TC_WARPS + w (pp: the rest of its pieces). Every block below the region's arrivals
 * has work for its first n_work warps. */
template <int W>
__device__ __forceinline__ block_pos locate_pieces(const tc_args &a, int32_t bx, int32_t hh, int32_t j, int32_t I,
                                                   piece_pos &pp)
{
    block_pos b = locate<W, true>(a, bx, hh, j, false, I);
    item_pos &ip = b.ip;
    const int32_t P = a.piece_tokens, k = bx * W + (int32_t)(threadIdx.x >> 5);
    const int32_t ph = (b.hi + P - 1) / P, np = ph + (b.n - b.hi + P - 1) / P;
    b.arrivals = min(b.arrivals, (np + W - 1) / W);
    /* The region's page ids on their way to L2: every piece after a warp's first reloads its
     * window of them (run_item). */
    {
        const int32_t tpp = a.sec[0].tpp, T = a.T, per = 128 / 4; /* ids a line */
        const int32_t lh = ((b.hi + tpp - 1) / tpp + per - 1) / per, ll = ((b.n - b.hi + tpp - 1) / tpp + per - 1) / per;
        const int32_t *row = a.table + ip.region * T;
        for (int32_t i = threadIdx.x; i < lh + ll; i += W * 32)
            prefetch_l2(i < lh ? row + i * per : row + max(0, T - (i - lh + 1) * per));
    }
    pp.counter = a.counters + a.n_rs + 4 + ip.rs;
    pp.np = np, pp.ph = ph, pp.first_dynamic = b.arrivals * W, pp.hi = b.hi, pp.n = b.n, pp.s0 = 0;
    /* Static first pieces (tc_args::piece_static, decision 102): each of the region's nw warps
     * first takes S high tokens (piece_static per mille of its even share, a multiple of 16),
     * warp k tokens [k S, (k + 1) S); the counter then hands out the rest of the high section
     * from nw S, and the low section, in pieces of P. Where S < P, the plain pieces above. */
    const int32_t nw = b.arrivals * W;
    const int32_t S = a.piece_static > 0 && nw > 0 ? (int32_t)((int64_t)b.hi * a.piece_static / 1000 / nw) & ~15 : 0;
    if (S >= P) {
        const int32_t s0 = nw * S, dh = (b.hi - s0 + P - 1) / P;
        pp.s0 = s0, pp.ph = dh, pp.np = dh + (b.n - b.hi + P - 1) / P, pp.first_dynamic = 0;
        ip.sec = 0;
        ip.sec_n = b.hi;
        ip.ta = k * S;
        ip.tb = ip.ta + S;
        ip.slot_id = k;
        ip.lg_tok = k * a.item_tokens;
        b.work = b.any = bx < b.arrivals;
        b.part.slot = bx;
        b.part.n_work = b.any ? W : 0;
        return b;
    }
    const int32_t sec = k >= ph;
    ip.sec = sec;
    ip.sec_n = sec ? b.n - b.hi : b.hi;
    ip.ta = (k - sec * ph) * P;
    ip.tb = min(ip.ta + P, ip.sec_n);
    ip.slot_id = k;
    ip.lg_tok = k * a.item_tokens;
    b.any = bx < b.arrivals; /* block-uniform */
    b.work = b.any && k < np; /* warp-uniform */
    b.part.slot = bx;
    b.part.n_work = b.any ? min(W, np - bx * W) : 0;
    return b;
}

/* The fused one-format kernel's queue where tc_args::last_blocks_last: position id to region
 * r, its block bx and the item size (0: a.item_tokens). Positions: the head regions (below
 * head_rs), tail_gx - 1 blocks each of half-size items; the regions up to tail_rs, grid_x - 1
 * blocks each; the tail regions, as the head ones; then every region's last block. */
__device__ __forceinline__ void queue_block(const tc_args &a, int32_t id, int32_t &r, int32_t &bx, int32_t &item)
{
    const int32_t gx = a.grid_x - 1, tg = a.tail_gx - 1, hr = a.head_rs;
    const int32_t q1 = hr * tg, p1 = q1 + (a.tail_rs - hr) * gx, p2 = p1 + (a.n_rs - a.tail_rs) * tg;
    if (a.wave_blocks > 0 && id < p1) { /* (tail_rs n_rs, head_rs 0) */
        const int32_t b = a.wave_blocks, p0 = a.n_rs * b;
        if (id < p0) {
            r = id / b, bx = id - r * b;
        } else {
            const int32_t k = id - p0, s = k / a.n_rs;
            r = k - s * a.n_rs, bx = b + s;
        }
        item = 0;
    } else if (id < q1) {
        r = id / tg, bx = id - r * tg, item = a.item_tokens / 2;
    } else if (id < p1) {
        const int32_t k = id - q1, t = k / gx;
        r = hr + t, bx = k - t * gx, item = 0;
    } else if (id < p2) {
        const int32_t k = id - p1, t = k / tg;
        r = a.tail_rs + t, bx = k - t * tg, item = a.item_tokens / 2;
    } else {
        r = id - p2;
        const bool half = r >= a.tail_rs || r < hr;
        bx = half ? tg : gx, item = half ? a.item_tokens / 2 : 0;
    }
}

/*
 * Separate score pass (a.fused 0): grid (grid_x, H, n_seq); a block runs its items and ends;
 * mkv_tc_finalize then merges and writes the scores back.
 *
 * Fused (a.fused 1, one launch covering both sections): a persistent grid. Each block loops
 * over two kinds of work, taken from counters in the workspace:
 *   - score jobs first (so that logits leave L2 soon): a decode block id whose region is
 *     complete; the block adds its tokens' probabilities to their score slots from the logits
 *     (stored evict_last) and the region's log-sum-exp, then drops the logits from L2;
 *   - decode blocks, in id order (a block's first is its own index, without the queue): the
 *     items' logits, their partial results merged into one part per block (block_merge), then
 *     an arrival at the region's counter. The region's last block to arrive stores the
 *     region's log-sum-exp, publishes the region's blocks as score jobs and merges the parts
 *     into out.
 * Spreading a region's write-back over many blocks at once, as soon as it is complete, keeps
 * more of its logits in L2 than one block writing it all back (which drains a region slowly,
 * while the page stream evicts its logits to DRAM). Nobody waits for another block's work
 * except to end: a block leaves once every id is done and every score job taken.
 */
/* A section format of a kernel: key and value bits, quantization groups a side. */
template <int KB_, int VB_, int KG_, int VG_>
struct tc_fmt {
    static constexpr int KB = KB_, VB = VB_, KG = KG_, VG = VG_;
};

/* What a kernel for the high section's format HI and the low one's LO (the same type for a
 * one-format kernel) needs from both: the larger staging area, and 3 blocks per SM (168
 * registers) where either format has four-subtile
 * stages or several key groups (without the bound the compiler takes more registers and the
 * kernel keeps 2 blocks per SM). */
template <int D, class HI, class LO>
struct kernel_shape {
    using SH = stage_layout<HI::KB, HI::VB, D, HI::KG, HI::VG>;
    using SLO = stage_layout<LO::KB, LO::VB, D, LO::KG, LO::VG>;
    static constexpr int WARP_BYTES = SH::WARP_BYTES > SLO::WARP_BYTES ? SH::WARP_BYTES : SLO::WARP_BYTES;
    static constexpr int SMEM = MKV_TC_WARPS * WARP_BYTES + (int)sizeof(block_shared);
    static constexpr int SMEM_SEP = MKV_TC_SEP_WARPS * WARP_BYTES; /* the separate pass's blocks */
    static constexpr bool ONE = std::is_same<HI, LO>::value;
    static constexpr int MIN_BLOCKS = SH::NT >= 4 || HI::KG > 1 || SLO::NT >= 4 || LO::KG > 1 ? 3 : 0;
    /* The fused kernel alone, left unbounded at d 128 with quantized keys, is given 128
     * registers and spills (K8V4 with the default groups: 40 / 52 bytes), so it keeps 3 blocks
     * per SM there too; 16-bit keys spill under that bound, and at d 64 it would cost some
     * kernels their fourth block (scripts/decode_regs.sh). */
    static constexpr int FUSED_MIN_BLOCKS = D == 128 && (HI::KB < 16 || LO::KB < 16) ? 3 : MIN_BLOCKS;
};

/* q of head-region rs (its G heads' D floats) on its way to L2, before the loads it waits
 * behind (the region, its counts, the page ids). */
template <int D>
__device__ __forceinline__ void prefetch_q(const tc_args &a, int64_t rs)
{
    const int32_t lines = (a.G * D * 4 + 127) / 128;
    if ((int32_t)threadIdx.x < lines)
        prefetch_l2(reinterpret_cast<const uint8_t *>(a.q + rs * a.G * D) + threadIdx.x * 128);
}

/* The staging area per warp of a block of section sec: its partials' stride (block_merge). */
template <int D, class HI, class LO>
__device__ __forceinline__ int32_t part_stride(int32_t sec)
{
    using K = kernel_shape<D, HI, LO>;
    return K::ONE || sec == 0 ? K::SH::WARP_BYTES : K::SLO::WARP_BYTES;
}

/* The warp's item in its section's format. The separate pass's blocks mix sections (locate's
 * packed), so its warps' staging areas are all the larger format's size apart; the fused
 * kernel's blocks run one section, each warp's area its format's size (block_merge reads the
 * partial results at that stride). */
template <int D, class HI, class LO, bool FUSED, bool PIECES = false>
__device__ __forceinline__ void run_section_item(const tc_args &a, uint8_t *smem, const item_pos &ip,
                                                 const piece_pos &pp = piece_pos{})
{
    using K = kernel_shape<D, HI, LO>;
    /* 4-bit keys through the fp16 mma (key_halves), but where that made ptxas spill (at d 128,
     * scripts/decode_regs.sh): the fused two-format kernel, and either kernel of one key
     * group a side but the separate pass's one-format one. */
    constexpr bool HALVES_HI = K::ONE ? !FUSED || HI::KG > 1 : !FUSED && HI::KG > 1;
    constexpr bool HALVES_LO = K::ONE ? !FUSED || LO::KG > 1 : !FUSED && LO::KG > 1;
    static_assert(!PIECES || (K::ONE && FUSED), "pieces: the fused one-format kernel");
    if (K::ONE || ip.sec == 0)
        run_item<HI::KB, HI::VB, D, HI::KG, HI::VG, FUSED, FUSED ? K::SH::WARP_BYTES : K::WARP_BYTES, HALVES_HI,
                 PIECES>(a, smem, ip, pp);
    else
        run_item<LO::KB, LO::VB, D, LO::KG, LO::VG, FUSED, FUSED ? K::SLO::WARP_BYTES : K::WARP_BYTES, HALVES_LO>(
            a, smem, ip);
}

/* FUSED (a.fused): the persistent kernel of a fused write-back; otherwise the separate pass's
 * kernel, a kernel of its own so that its code and registers carry none of the fused path's.
 * PIECES (fused, a.piece_tokens > 0): the persistent kernel without a score write-back, its
 * warps taking their region's tokens in pieces (locate_pieces); a kernel of its own, without
 * the score jobs' code. */
template <int D, class HI, class LO, bool FUSED, bool PIECES = false>
__global__ void __launch_bounds__(FUSED ? MKV_TC_WARPS * 32 : MKV_TC_SEP_WARPS * 32,
                                  FUSED ? kernel_shape<D, HI, LO>::FUSED_MIN_BLOCKS
                                        : kernel_shape<D, HI, LO>::MIN_BLOCKS * MKV_TC_WARPS / MKV_TC_SEP_WARPS)
    decode_kernel(const tc_args a)
{
    using K = kernel_shape<D, HI, LO>;
    extern __shared__ __align__(16) uint8_t smem[];
    trace_init(a);

    if constexpr (!FUSED) {
        const int32_t bx = a.x_last ? blockIdx.z : blockIdx.x, hh = a.x_last ? blockIdx.x : blockIdx.y;
        const int32_t j = a.x_last ? blockIdx.y : blockIdx.z;
        /* The finalize kernel (launched with programmatic serialization) may start once every
         * block has: its first loads then overlap this kernel's end. */
        constexpr int NT = MKV_TC_SEP_WARPS * 32;
        const int32_t warp = threadIdx.x >> 5;
        if (!a.ready) {
            griddep_launch_dependents();
        } else if (warp == 0) {
            /* Ready flags (tc_args::ready): the block's item slots (packed: W x .. W x + W - 1)
             * read 0 until their items are done, set here before the block lets the finalize
             * kernel start (a block's first launch_dependents counts), so that the finalize
             * never reads an earlier call's 1. The other warps write their 1 only after this
             * warp's arrival at barrier 1 (its own, thread 0's, in program order). */
            if (threadIdx.x == 0) {
                int32_t *const f = a.ready + ((int64_t)j * a.H + hh) * 2 * a.sec_items;
                const int32_t k1 = min((bx + 1) * MKV_TC_SEP_WARPS, 2 * a.sec_items);
                for (int32_t k = bx * MKV_TC_SEP_WARPS; k < k1; k++) f[k] = 0;
                __threadfence();
                griddep_launch_dependents();
            }
            __syncwarp();
            if (MKV_TC_SEP_WARPS > 1) bar_arrive(1, NT);
        }
        if (threadIdx.x == 0) trace_stamp(a, TR_START, 0);
        prefetch_q<D>(a, (int64_t)j * a.H + hh);
        const block_pos b = locate<MKV_TC_SEP_WARPS, true>(a, bx, hh, j, a.sec_mask == 3);
        if (b.work) run_section_item<D, HI, LO, false>(a, smem, b.ip);
        if (a.ready && warp > 0) bar_sync(1, NT); /* every warp but 0, with or without an item */
        if (a.ready && b.work) { /* the item's parts and logits, then its flag (release, cumulative) */
            __syncwarp();
            if ((threadIdx.x & 31) == 0) st_release(a.ready + b.ip.rs * 2 * a.sec_items + b.ip.slot_id, 1);
        }
        return;
    }
    block_shared &bs = *reinterpret_cast<block_shared *>(smem + MKV_TC_WARPS * K::WARP_BYTES);
    const int32_t tid = threadIdx.x;
    using RF = region_finish<D, MKV_TC_WARPS * K::WARP_BYTES>;

    int32_t *const next_id = a.counters + a.n_rs, *const sq_head = next_id + 1;
    int32_t *const sq_tail = next_id + 2, *const finished = next_id + 3, *const jobs = next_id + 4;
    const int32_t gx = a.grid_x, total = a.total_ids;
    /* a.keep_logits, read where used; never in pieces (the kernel without score jobs) */
    const auto keep_logits = [&]() { return !PIECES && a.keep_logits; };
    if (tid == 0) bs.owed = -1, bs.exhausted = 0, bs.nap = 256, bs.started = 0, bs.own_job = -1, bs.zeroed = 0;
    if (tid == 0) trace_stamp(a, TR_START, 0);
    enum { EXIT, RETRY, DECODE, SCORE };
    for (;;) {
        if (tid == 0) {
            int32_t cmd = RETRY, arg = 0, owed = bs.owed;
            bool exhausted = bs.exhausted;
            if (!bs.started) {
                /* The first decode id is the block's own index (the grid never exceeds the
                 * ids; the queue's start after the grid's): no round trip before it. */
                bs.started = 1;
                cmd = DECODE, arg = blockIdx.x;
            } else if (bs.own_job >= 0) {
                /* The score job of the single-block region it just finished (not published). */
                cmd = SCORE, arg = bs.own_job;
                bs.own_job = -1;
            } else {
                if (!bs.zeroed) griddep_wait(), bs.zeroed = 1;
                /* A ticket when jobs seem to be waiting; it may name a job published later. */
                if (keep_logits() && owed < 0 && ld_relaxed(sq_head) < ld_relaxed(sq_tail)) {
                    owed = atomicAdd(sq_head, 1);
                    if (owed >= total) owed = -1; /* past any job there can be */
                }
                if (owed >= 0 && (arg = ld_acquire(jobs + owed) - 1) >= 0) {
                    cmd = SCORE, owed = -1;
                } else if (!exhausted && !keep_logits() && total <= (int32_t)gridDim.x) {
                    /* Every id was a block's first and no score job will come: the block
                     * leaves without asking the queue, whose counter every block's atomic met
                     * at the call's end (decision 105; with a score write-back the asking
                     * blocks' backoff did better: 1 x 16k 34.4 against 35.4 us). */
                    cmd = EXIT;
                } else if (!exhausted) {
                    arg = (int32_t)gridDim.x + atomicAdd(next_id, 1);
                    if (arg < total) {
                        cmd = DECODE;
                    } else {
                        exhausted = true;
                        /* Without a score write-back there are no jobs to wait for: the
                         * region merges are the decode blocks' own. */
                        if (!keep_logits()) cmd = EXIT;
                    }
                } else if (ld_acquire(finished) == total) { /* every job is published */
                    const int32_t tail = ld_relaxed(sq_tail);
                    if (owed >= tail) owed = -1; /* a ticket past the last job */
                    if (owed >= 0) {
                        while ((arg = ld_acquire(jobs + owed) - 1) < 0) __nanosleep(32);
                        cmd = SCORE, owed = -1;
                    } else if (ld_relaxed(sq_head) >= tail) {
                        cmd = EXIT;
                    }
                } else {
                    /* Nothing to take until a region completes: a backoff of 256 ns doubling
                     * to 2 us (every idle block of the call's tail polls these counters). */
                    __nanosleep(bs.nap);
                    bs.nap = min(2 * bs.nap, 2048);
                }
            }
            if (cmd != RETRY) bs.nap = 256;
            bs.cmd = cmd, bs.arg = arg, bs.owed = owed, bs.exhausted = exhausted;
        }
        __syncthreads();
        const int32_t cmd = bs.cmd, id = bs.arg;
        __syncthreads(); /* bs.cmd is rewritten in the next round */
        if (tid == 0 && (cmd == DECODE || cmd == SCORE)) trace_stamp(a, TR_CMD, cmd == DECODE ? id : -2 - id);
        if (cmd == EXIT) break;
        if (cmd == RETRY) continue;
        int32_t r = id / gx, bx = id - r * gx, item = 0; /* item 0: a.item_tokens */
        /* One-format kernels only (the fused one-group mix spilled): the queue's order, its
         * tail regions' items of half the size (tc_args::last_blocks_last, tail_rs). Score ids
         * keep the order above (a region's blocks' are r gx + x). */
        if (K::ONE && cmd == DECODE && a.last_blocks_last) queue_block(a, id, r, bx, item);
        if (cmd == DECODE) prefetch_q<D>(a, r); /* r = sequence x H + KV head */

        if (!PIECES && cmd == SCORE) {
            const block_pos b = locate<MKV_TC_WARPS, false>(a, bx, r % a.H, r / a.H);
            if (tid < a.G) bs.lse[tid] = __ldcg(a.lse + b.ip.rs * a.G + tid);
            __syncthreads();
            const section_tokens s = section_of_region(a, b.ip.rs, b.ip.region, b.ip.sec, b.hi, b.n, b.items_hi);
            if (!a.compact) RF::scores(a, smem, s, b.bta, b.btb, bs.lse);
            else RF::scores_compact(a, smem, s, b.bta, b.btb, bs.lse);
            __syncthreads(); /* bs.lse is rewritten in the next round */
            continue;
        }

        /* DECODE */
        bool any;
        {
            piece_pos pp = {};
            block_pos b;
            if constexpr (PIECES) b = locate_pieces<MKV_TC_WARPS>(a, bx, r % a.H, r / a.H, item, pp);
            else b = locate<MKV_TC_WARPS, K::ONE>(a, bx, r % a.H, r / a.H, false, item);
            if (tid == 0) {
                bs.reg = {b.ip.rs, b.ip.region, b.hi, b.n, b.items_hi, b.n_items, b.arrivals, r * gx};
                bs.part = {b.part.slot, b.part.n_work, part_stride<D, HI, LO>(b.ip.sec)};
            }
            any = b.any;
            /* (pp passed only in pieces: the unused reference made the fused one-group mix spill) */
            if constexpr (PIECES) {
                if (b.work) run_section_item<D, HI, LO, true, true>(a, smem, b.ip, pp);
            } else if (b.work) {
                run_section_item<D, HI, LO, true>(a, smem, b.ip);
            }
        }
        if (any) {
            /* Arrive (release and acquire in thread 0's one atomic, atom_add_acq_rel: the
             * barrier orders every thread's results before it, and release is cumulative; the
             * pattern of a grid sync, without a fence's round trip on either side). */
            __syncthreads();
            const region_info &g = bs.reg;
            /* A region of one block (short regions): its part is the region's result, written
             * to out here, without the part's round trip and the arrival. */
            const bool single = g.arrivals == 1;
            block_merge<D>(a, smem, g.rs, bs.part, bs.wf, single, bs.M, bs.S, bs.lse);
            __syncthreads();
            if (single) {
                /* Its one score job is the block's own next command (its logits are this
                 * block's, in L2): no publication, no other block's ticket. */
                if (keep_logits()) {
                    if (tid < a.G) a.lse[g.rs * a.G + tid] = bs.lse[tid];
                    if (tid == 0) bs.own_job = g.first_id;
                }
            } else if (tid == 0) {
                if (!bs.zeroed) griddep_wait(), bs.zeroed = 1;
                /* The region's last P blocks to arrive merge it, a slice each (tc_args::
                 * merge_split): the last the first slice, the one before it the second, ...;
                 * those before the last wait for it (every block of such a call is resident:
                 * the blocks awaited are running). */
                const int32_t k = atom_add_acq_rel(a.counters + g.rs, 1);
                bs.last = k == g.arrivals - 1;
                bs.slice = g.arrivals - 1 - k;
                trace_stamp(a, TR_ARRIVE, bs.last);
                if (!bs.last && bs.slice < min(a.merge_split, g.arrivals)) {
                    while (ld_acquire(a.counters + g.rs) < g.arrivals) __nanosleep(32);
                    trace_stamp(a, TR_WAITED, 0);
                }
            }
            __syncthreads();
            const int32_t P = max(1, min(a.merge_split, g.arrivals)), slice = bs.slice;
            if (!single && slice < P) {
                const int32_t GD4 = a.G * D / 4, lo4 = slice * GD4 / P, n4 = (slice + 1) * GD4 / P - lo4;
                RF::merge_first(a, smem, g, lo4, n4); /* its copies overlap region_ms */
                region_ms(a, g.rs, g.arrivals, bs);
                if (tid == 0) trace_stamp(a, TR_MS, slice);
                if (slice == 0 && keep_logits()) {
                    /* The region's lse, visible before its score jobs are. */
                    if (tid < a.G) a.lse[g.rs * a.G + tid] = bs.lse[tid];
                    __threadfence();
                    __syncthreads();
                    if (tid == 0) bs.arg = atomicAdd(sq_tail, g.arrivals);
                    __syncthreads();
                    for (int32_t i = tid; i < g.arrivals; i += MKV_TC_WARPS * 32)
                        st_release(jobs + bs.arg + i, g.first_id + i + 1); /* its blocks: x < arrivals */
                }
                RF::merge(a, smem, g, bs.M, bs.S, lo4, n4);
                if (tid == 0) trace_stamp(a, TR_MERGED, 0);
            }
        }
        __syncthreads(); /* bs is reused */
        if (tid == 0 && keep_logits()) { /* ids done: when every score job is published */
            __threadfence();
            atomicAdd(finished, 1);
        }
    }
    if (tid == 0) trace_stamp(a, TR_EXIT, 0);
}

} // namespace mkv_tc

/* One translation unit per (key bits, value bits, head_dim), generated by CMake: the kernel
 * with one quantization group a side, and the one with the library's default groups where
 * they differ and groups_supported takes them. mkv_tc_get_K<KB>V<VB>_d<D>(kg, vg) returns
 * the variant for kg key and vg value groups ({NULL, NULL} if none). A two-format translation
 * unit (MKV_DECODE_TC_MIX_INSTANCE) holds the kernel that runs a high section of one format
 * and a low section of another in one launch, for one group a side or the default groups. */
namespace mkv_tc {

/* The shared-memory opt-in above 48 KB and the occupancy it gives, once per device and
 * variant (both are per-device function state; asking every call cost host time per layer).
 * Returns blocks per multiprocessor, 0 when the opt-in failed. */
template <int D, class HI, class LO, bool FUSED, bool PIECES = false>
int kernel_setup(void)
{
    static std::atomic<int> cache[MKV_MAX_DEVICES]; /* 0: not yet; -1: failed; else blocks */
    constexpr int smem = FUSED ? kernel_shape<D, HI, LO>::SMEM : kernel_shape<D, HI, LO>::SMEM_SEP;
    constexpr int threads = (FUSED ? MKV_TC_WARPS : MKV_TC_SEP_WARPS) * 32;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MKV_MAX_DEVICES) {
        (void)cudaGetLastError();
        dev = -1;
    } else {
        const int c = cache[dev].load(std::memory_order_relaxed);
        if (c != 0) return c > 0 ? c : 0;
    }
    int n = 0;
    if (cudaFuncSetAttribute(decode_kernel<D, HI, LO, FUSED, PIECES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel<D, HI, LO, FUSED, PIECES>, threads, smem) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    if (dev >= 0) cache[dev].store(n > 0 ? n : -1, std::memory_order_relaxed);
    return n;
}

/* The separate pass's kernel's resident blocks per multiprocessor. */
template <int D, class HI, class LO>
int sep_setup(void)
{
    return kernel_setup<D, HI, LO, false>();
}

/* The fused kernel's resident blocks per multiprocessor (its persistent grid's size). */
template <int D, class HI, class LO>
int variant_setup(void)
{
    return kernel_setup<D, HI, LO, true>();
}

/* Whether the kernel has a variant in pieces (tc_args::piece_tokens): one format of 16-bit
 * keys and values (the calls measured: decode-kernel.md; each variant is one more kernel to
 * build). */
template <class HI, class LO>
constexpr bool has_pieces()
{
    return std::is_same<HI, LO>::value && HI::KB == 16 && HI::VB == 16;
}

template <int D, class HI, class LO>
int pieces_setup(void)
{
    if constexpr (has_pieces<HI, LO>()) return kernel_setup<D, HI, LO, true, true>();
    return 0;
}

template <int D, class HI, class LO>
cudaError_t launch_variant(const tc_args &a, dim3 grid, cudaStream_t stream)
{
    using K = kernel_shape<D, HI, LO>;
    if (a.fused && a.piece_tokens > 0) { /* as below, in pieces */
        if constexpr (has_pieces<HI, LO>()) {
            if (kernel_setup<D, HI, LO, true, true>() <= 0) return cudaErrorInvalidValue;
            return mkv_tc_launch_pdl(decode_kernel<D, HI, LO, true, true>, grid, dim3(MKV_TC_WARPS * 32), K::SMEM,
                                     stream, a);
        }
        return cudaErrorInvalidValue; /* the plan asks only where has_pieces */
    } else if (a.fused) { /* after mkv_tc_zero_counters, which it overlaps */
        if (kernel_setup<D, HI, LO, true>() <= 0) return cudaErrorInvalidValue;
        const cudaError_t e =
            mkv_tc_launch_pdl(decode_kernel<D, HI, LO, true>, grid, dim3(MKV_TC_WARPS * 32), K::SMEM, stream, a);
        if (e != cudaSuccess) return e;
    } else {
        if (kernel_setup<D, HI, LO, false>() <= 0) return cudaErrorInvalidValue;
        decode_kernel<D, HI, LO, false><<<grid, MKV_TC_SEP_WARPS * 32, K::SMEM_SEP, stream>>>(a);
    }
    return cudaGetLastError();
}

template <int D, class HI, class LO>
tc_kernel kernel_of(void)
{
    return tc_kernel{launch_variant<D, HI, LO>, variant_setup<D, HI, LO>,
                     has_pieces<HI, LO>() ? pieces_setup<D, HI, LO> : nullptr, sep_setup<D, HI, LO>};
}

/* A format's default groups a side at head_dim D (one for 16-bit vectors). */
template <int KB, int VB, int D>
using default_fmt = tc_fmt<KB, VB, KB == 16 ? 1 : MKV_DEFAULT_GROUPS(D, KB, 0), VB == 16 ? 1 : MKV_DEFAULT_GROUPS(D, VB, 1)>;

template <int KB, int VB, int D>
constexpr bool has_default_variant()
{
    using F = default_fmt<KB, VB, D>;
    return (F::KG != 1 || F::VG != 1) && groups_supported<KB, VB, D, F::KG, F::VG>();
}

template <int KB, int VB, int D>
tc_kernel get_variant(int32_t kg, int32_t vg)
{
    using ONE = tc_fmt<KB, VB, 1, 1>;
    if (kg == 1 && vg == 1) return kernel_of<D, ONE, ONE>();
    if constexpr (has_default_variant<KB, VB, D>()) {
        using F = default_fmt<KB, VB, D>;
        if (kg == F::KG && vg == F::VG) return kernel_of<D, F, F>();
    }
    return tc_kernel{nullptr, nullptr, nullptr, nullptr};
}

/* The two-format kernel: one group a side on both sections, or the default groups on both. */
template <int KBH, int VBH, int KBL, int VBL, int D>
tc_kernel get_mix_variant(int32_t kgh, int32_t vgh, int32_t kgl, int32_t vgl)
{
    if (kgh == 1 && vgh == 1 && kgl == 1 && vgl == 1)
        return kernel_of<D, tc_fmt<KBH, VBH, 1, 1>, tc_fmt<KBL, VBL, 1, 1>>();
    if constexpr (has_default_variant<KBH, VBH, D>() && has_default_variant<KBL, VBL, D>()) {
        using FH = default_fmt<KBH, VBH, D>;
        using FL = default_fmt<KBL, VBL, D>;
        if (kgh == FH::KG && vgh == FH::VG && kgl == FL::KG && vgl == FL::VG) return kernel_of<D, FH, FL>();
    }
    return tc_kernel{nullptr, nullptr, nullptr, nullptr};
}

} // namespace mkv_tc

#define MKV_DECODE_TC_INSTANCE(KB, VB, D)                                                      \
    tc_kernel mkv_tc_get_K##KB##V##VB##_d##D(int32_t kg, int32_t vg)                           \
    {                                                                                          \
        return mkv_tc::get_variant<KB, VB, D>(kg, vg);                                         \
    }

#define MKV_DECODE_TC_MIX_INSTANCE(KBH, VBH, KBL, VBL, D)                                      \
    tc_kernel mkv_tc_get_K##KBH##V##VBH##_K##KBL##V##VBL##_d##D(int32_t kgh, int32_t vgh,      \
                                                                int32_t kgl, int32_t vgl)      \
    {                                                                                          \
        return mkv_tc::get_mix_variant<KBH, VBH, KBL, VBL, D>(kgh, vgh, kgl, vgl);             \
    }

#endif /* MKV_ATTENTION_TC_DECODE_CUH */
