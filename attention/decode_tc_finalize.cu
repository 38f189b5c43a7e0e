/*
 * decode_tc_finalize.cu — the separate score pass's finalize kernel (decode_tc.h,
 * mkv_tc_finalize): per head-region, one block merges the items' partial results into out
 * (merge_out), the others add each token's probability to its score slot, from fp32 logit rows
 * (score_rows; the separate pass keeps fp32 logits, decision 89). Design:
 * docs/decode-kernel.md, "Score write-back, separate pass".
 */
#include "attention/decode_plan.h"
#include "attention/decode_tc.h"
#include "attention/tc_merge.cuh"
#include "attention/tc_trace.cuh"

#include <math.h>

#include <algorithm>
#include <type_traits>

#define FIN_THREADS 256
#define FIN_TOKENS 8 /* tokens per thread in the score blocks, independent of each other */
/* With rows loaded early (score_rows), regions of at least this many tokens take twice as many
 * per thread (H100, mix 20/50/30 and K4V2, A/B: 256 x 32k 3,833 against 3,756 us, 256 x 16k
 * 1,962 against 1,947; but 64 x 1k K4V2 81 against 92 and 256 x 4k mix 614 against 629). */
#define FIN_LONG_REGION 16384

/* The logits and page ids of a score block's tokens k = first + tid + u FIN_THREADS (the
 * region's tokens, high then low), loaded before the block knows the heads' lse, so that these
 * loads overlap the items' maxima and sums being read (NV float4s per token: rows of G = 4 NV
 * logits, 16-byte aligned). */
template <int NV, int U>
struct score_rows {
    static constexpr int32_t PER_BLOCK = FIN_THREADS * U; /* units (tokens) per score block */
    float4 v[U][NV];
    int32_t page[U], slot[U];

    /* A unit is a token: the high section's first, the region's n in all. */
    static __device__ __forceinline__ int32_t units(int32_t hi, int32_t n, int32_t *hi_units)
    {
        *hi_units = hi;
        return n;
    }

    /* ONE: every token of the block lies in section s[0], whose token 0 is the region's token
     * base (0 or hi): no per-token choice of section (most blocks; a block straddles the
     * sections only where the high one ends). Else base is hi, the high section s[0] and the
     * low one s[1]. */
    template <bool ONE>
    __device__ __forceinline__ void load(const tc_args &, const mkv_tc::section_tokens (&s)[2], int32_t base,
                                         int32_t n, int32_t first)
    {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int32_t k = first + (int32_t)threadIdx.x + u * FIN_THREADS;
            if (k >= n) break;
            const bool sec = !ONE && k >= base;
            const int32_t kk = k - (ONE || sec ? base : 0);
            const mkv_tc::section_tokens t = ONE ? s[0] : mkv_tc::pick_section(s, sec);
            const float4 *row = reinterpret_cast<const float4 *>(t.lg + (int64_t)kk * (4 * NV));
#pragma unroll
            for (int j = 0; j < NV; j++) v[u][j] = __ldcs(row + j);
            const mkv_tc::page_slot ps = mkv_tc::page_of(t, kk);
            page[u] = __ldg(t.row + ps.i * t.step);
            slot[u] = ps.slot;
        }
    }

    /* Each token's probability, the maximum over the group of 2^(l - lse_g), to its slot. */
    template <bool ONE>
    __device__ __forceinline__ void add(const tc_args &, const mkv_tc::section_tokens (&s)[2], int32_t base,
                                        int32_t n, int32_t first, const float *lse) const
    {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int32_t k = first + (int32_t)threadIdx.x + u * FIN_THREADS;
            if (k >= n) break;
            float x = -INFINITY;
#pragma unroll
            for (int j = 0; j < NV; j++)
                x = fmaxf(x, fmaxf(fmaxf(v[u][j].x - lse[4 * j], v[u][j].y - lse[4 * j + 1]),
                                   fmaxf(v[u][j].z - lse[4 * j + 2], v[u][j].w - lse[4 * j + 3])));
            const mkv_tc::section_tokens t = ONE ? s[0] : mkv_tc::pick_section(s, !ONE && k >= base);
            mkv_tc::red_add(mkv_tc::score_slot(t, page[u], slot[u]), mkv_tc::ex2(x));
        }
    }
};

/* Item weights staged per round of merge_out: a round's items' 2^(m - M) per head. */
#define MKV_TC_MERGE_ROUND 64
/* Items a merge block's thread loads at once (merge_out), and the most merge blocks a region:
 * in small calls a region's G x d outputs are cut among merge blocks while each thread keeps
 * at least this many items, loaded together (one block walking 64 items two float4 lanes
 * wide, four at a time, had taken eight round trips: the call's last 3 us at 1 x 4k). */
#define MKV_TC_MERGE_BATCH 8
#define MKV_TC_MERGE_MAX_BLOCKS 8

/* out of head-region rs = its n_items parts' partial outputs (from part), each weighted by
 * 2^(m - M), over S; block-wide (all NTH threads call it: it holds barriers), and it finds M
 * and S itself (warp h < G head h's, into M and S). The block is merge block k of mb: it takes
 * slice k of the G x d outputs as float4s (n4 of them, cut in mb slices of w4), thread t
 * float4 t % w4 of the slice for the items congruent to t / w4 modulo NTH / w4
 * (MKV_TC_MERGE_BATCH loads in flight per thread, where one thread per output element had
 * walked every item with scalar loads), the item lanes then summed through shared memory. The
 * weights are computed once per item and head into W, a round of MKV_TC_MERGE_ROUND items at a
 * time. The first round's first batch of parts is loaded before the maxima, and the first
 * round's weights come from the maxima's own loads: the parts, the maxima and the weights had
 * been three round trips one after the other, the call's last step at batch 1. */
template <int NTH>
static __device__ __forceinline__ void merge_out(const tc_args &a, int64_t part, int32_t n_items, int64_t rs,
                                                 int32_t d, float *M, float *S,
                                                 float (&W)[MKV_TC_MERGE_ROUND][MKV_TC_MAX_G], float4 (&R)[NTH],
                                                 int32_t k, int32_t mb)
{
    static_assert(MKV_TC_MAX_G * 128 / 4 <= NTH, "a thread per float4 of the G x d outputs (d <= 128)");
    static_assert(MKV_TC_MERGE_ROUND == 64, "a round's weights: two item slots a lane");
    constexpr int BATCH = MKV_TC_MERGE_BATCH;
    const int32_t G = a.G, n4 = G * d / 4, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int32_t w4 = (n4 + mb - 1) / mb, e0 = k * w4, we = min(w4, n4 - e0); /* the slice */
    const int32_t lanes = NTH / w4 > 0 ? NTH / w4 : 1; /* item lanes */
    const int32_t p = tid / w4, e4 = e0 + tid - p * w4, g = 4 * e4 / d;
    const bool mine = p < lanes && tid - p * w4 < we;
    const float4 *po = reinterpret_cast<const float4 *>(a.part_o + part * G * d) + e4;
    /* BATCH items' loads issued before any is used, predicated: `#pragma unroll` left the
     * trip count's remainder a chain of load, use, branch (SASS), a round trip per item.
     * Items past nr add fmaf(0, 0, o) = o: the sums are the loop's, bit for bit. */
    float4 x[BATCH];
    const auto load = [&](int32_t s0, int32_t s1, int32_t nr) {
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int32_t s = s1 + b * lanes;
            x[b] = mine && s < nr ? __ldcg(po + (int64_t)(s0 + s) * n4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const auto add = [&](int32_t s1, int32_t nr) {
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int32_t s = s1 + b * lanes;
            const float w = s < nr ? W[s][g] : 0.0f;
            o.x = fmaf(x[b].x, w, o.x), o.y = fmaf(x[b].y, w, o.y), o.z = fmaf(x[b].z, w, o.z);
            o.w = fmaf(x[b].w, w, o.w);
        }
    };
    const int32_t nr0 = min(MKV_TC_MERGE_ROUND, n_items);
    load(0, p, nr0);
    /* Warp h: head h's M and S over every item slot (head_ms), and the first round's weights
     * from its lanes' own (max, sum) of slots lane and lane + 32, loaded beside head_ms's. */
    if (warp < G) {
        const float2 *ml = reinterpret_cast<const float2 *>(a.part_ml) + part * G + warp;
        const float m0 = lane < nr0 ? __ldcg(ml + (int64_t)lane * G).x : 0.0f;
        const float m1 = lane + 32 < nr0 ? __ldcg(ml + (int64_t)(lane + 32) * G).x : 0.0f;
        const float2 ms = mkv_tc::head_ms(a, part, n_items, warp);
        if (lane == 0) M[warp] = ms.x, S[warp] = ms.y;
        if (lane < nr0) W[lane][warp] = exp2f(m0 - ms.x);
        if (lane + 32 < nr0) W[lane + 32][warp] = exp2f(m1 - ms.x);
    }
    __syncthreads();
    if (tid == 0) mkv_tc::trace_stamp(a, mkv_tc::TR_FIN_MS, k);
    /* 1 / S, its latency beside the sums' (four divisions at the end had been a chain of
     * their own after them). */
    const float inv = mine ? 1.0f / S[g] : 0.0f;
    for (int32_t s0 = 0; s0 < n_items; s0 += MKV_TC_MERGE_ROUND) {
        const int32_t nr = min(MKV_TC_MERGE_ROUND, n_items - s0);
        if (s0 > 0) {
            __syncthreads(); /* the previous round's W is read */
            for (int32_t i = tid; i < nr * G; i += NTH) {
                const int32_t s = i / G, h = i - s * G;
                W[s][h] = exp2f(__ldcg(a.part_ml + ((part + s0 + s) * G + h) * 2) - M[h]);
            }
            __syncthreads();
        }
        if (!mine) continue;
        for (int32_t s1 = p; s1 < nr; s1 += BATCH * lanes) {
            if (s0 > 0 || s1 > p) load(s0, s1, nr); /* (round 0's first batch: above) */
            add(s1, nr);
        }
    }
    if (lanes > 1) {
        R[tid] = o;
        __syncthreads();
        if (p != 0 || !mine) return;
        for (int32_t q = 1; q < lanes; q++) {
            const float4 y = R[q * w4 + e4 - e0];
            o.x += y.x, o.y += y.y, o.z += y.z, o.w += y.w;
        }
    } else if (!mine) {
        return;
    }
    const float r[4] = {o.x * inv, o.y * inv, o.z * inv, o.w * inv};
    const int64_t at = rs * G * d + 4 * e4;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (a.out16) a.out16[at + k] = a.out_bf16 ? mkv_f32_to_bf16(r[k]) : mkv_f32_to_f16(r[k]);
        else a.out[at + k] = r[k];
    }
}

/* Until the n part slots' ready flags from f (tc_args::ready) all read 1 (a warp: lane l the
 * slots l, l + 32, ...; acquire, so that what the items wrote is visible after). */
static __device__ __forceinline__ void wait_ready(const int32_t *f, int32_t n)
{
    const int32_t lane = threadIdx.x & 31;
    for (int32_t s0 = 0; s0 < n; s0 += 32) {
        const bool mine = s0 + lane < n;
        for (uint32_t ns = 32;; ns = ns < 256 ? 2 * ns : ns) {
            const bool done = !mine || mkv_tc::ld_acquire(f + s0 + lane) != 0;
            if (__all_sync(0xffffffffu, done)) break;
            __nanosleep(ns);
        }
    }
}

/* Block index bx (grid x, or z with tc_args::x_last) below nsb: scores of the region's units
 * [bx B, (bx + 1) B) (SC::PER_BLOCK = B: FIN_THREADS threads, U units
 * each, FIN_THREADS apart, coalesced), its tokens high then low (SC: score_rows, a token and its
 * fp32 row a unit, G = 4 or 8). Each block first
 * finds the final max M and sum S of every query head from the items; the score blocks load
 * their units' logits and page ids before that, so that those loads overlap the items' maxima
 * and sums being read. SC void: fp32 logits of any G, FIN_TOKENS per thread, loaded after.
 * bx = nsb + k, k < mb: out = the merged items, slice k of mb (merge_out). */
template <class SC>
static __device__ __forceinline__ void finalize_block(const tc_args &a, int32_t d, int32_t nsb, int32_t mb)
{
    constexpr bool ANY_G = std::is_void<SC>::value;
    using ROWS = typename std::conditional<ANY_G, score_rows<1, 1>, SC>::type;
    const int32_t bx = a.x_last ? blockIdx.z : blockIdx.x, h = a.x_last ? blockIdx.x : blockIdx.y;
    const int32_t j = a.x_last ? blockIdx.y : blockIdx.z, tid = threadIdx.x;
    if (tid == 0) mkv_tc::trace_stamp(a, mkv_tc::TR_FIN_START, bx);
    const int64_t rs = (int64_t)j * a.H + h;
    const int64_t region = a.regions[rs];
    const int64_t nh = max(a.n_hi[region], 0), nl = max(a.n_lo[region], 0);
    const int32_t n = (int32_t)min(nh + nl, (int64_t)a.max_tokens);
    if (n == 0) return; /* out untouched, as in the reference */
    const int32_t hi = (int32_t)min(nh, (int64_t)n);
    /* The region's item slots (the high items' from high_item_tokens), and where its low
     * section's logits start (items_hi's of item_tokens: section_of_region). */
    const int32_t I = a.item_tokens, Ih = mkv_tc::high_item_tokens(a, hi, n);
    const int32_t items_hi = (hi + I - 1) / I, items_lo = (n - hi + I - 1) / I;
    const int32_t slots = (hi + Ih - 1) / Ih + items_lo;
    /* the region's units, the high section's first */
    int32_t uhi;
    const int32_t un = ANY_G ? (uhi = hi, n) : ROWS::units(hi, n, &uhi);
    const bool merging = bx >= nsb;
    const int32_t first = merging ? 0 : bx * (ANY_G ? FIN_THREADS * FIN_TOKENS : ROWS::PER_BLOCK);
    if (first >= un) return;
    const int32_t G = a.G;
    const int64_t part = rs * 2 * a.sec_items; /* item slots of this head-region */
    mkv_tc::section_tokens secs[2];
    ROWS rows;
    /* A block in one section (one), and its section's first unit in the region (base). */
    const bool one = first >= uhi || min(first + ROWS::PER_BLOCK, un) <= uhi;
    const int32_t base = one && first < uhi ? 0 : uhi;
    /* Launched with programmatic serialization: what the decode kernel wrote (logits, parts)
     * is read only once it has ended, or, with ready flags, once the region's items have. */
    if (a.ready) {
        if (tid < 32) wait_ready(a.ready + part, slots);
        __syncthreads();
    } else {
        mkv_tc::griddep_wait();
    }
    if (tid == 0) mkv_tc::trace_stamp(a, mkv_tc::TR_FIN_WAITED, bx);
    if (!ANY_G && !merging) {
        secs[0] = mkv_tc::section_of_region(a, rs, region, one ? first >= uhi : 0, hi, n, items_hi);
        if (one) {
            rows.template load<true>(a, secs, base, un, first);
        } else {
            secs[1] = mkv_tc::section_of_region(a, rs, region, 1, hi, n, items_hi);
            rows.template load<false>(a, secs, base, un, first);
        }
    }

    /* Warp g finds head g's M and S, its lanes taking every 32nd item slot (the low items'
     * slots follow the high ones'); the merge blocks, in merge_out. */
    static_assert(FIN_THREADS / 32 >= MKV_TC_MAX_G, "a warp per query head");
    __shared__ float M_s[MKV_TC_MAX_G], S_s[MKV_TC_MAX_G], LSE_s[MKV_TC_MAX_G];
    if (merging) {
        __shared__ float W_s[MKV_TC_MERGE_ROUND][MKV_TC_MAX_G];
        __shared__ float4 R_s[FIN_THREADS];
        merge_out<FIN_THREADS>(a, part, slots, rs, d, M_s, S_s, W_s, R_s, bx - nsb, mb);
        if (tid == 0) mkv_tc::trace_stamp(a, mkv_tc::TR_FIN_END, bx);
        return;
    }
    const int32_t warp = tid >> 5, lane = tid & 31;
    if (warp < G) {
        const float2 ms = mkv_tc::head_ms(a, part, slots, warp);
        if (lane == 0) M_s[warp] = ms.x, S_s[warp] = ms.y, LSE_s[warp] = ms.x + log2f(ms.y);
    }
    __syncthreads();
    if (tid == 0) mkv_tc::trace_stamp(a, mkv_tc::TR_FIN_MS, bx);

    if constexpr (!ANY_G) {
        if (one) rows.template add<true>(a, secs, base, un, first, LSE_s);
        else rows.template add<false>(a, secs, base, un, first, LSE_s);
    } else {
        /* The tokens of the block in each section (first is past hi in the low one: none). */
        for (int32_t sec = 0; sec < 2; sec++) {
            const mkv_tc::section_tokens s = mkv_tc::section_of_region(a, rs, region, sec, hi, n, items_hi);
            mkv_tc::score_tokens<FIN_TOKENS>(s, first + tid - (sec ? hi : 0), FIN_THREADS, LSE_s);
        }
    }
    if (tid == 0) mkv_tc::trace_stamp(a, mkv_tc::TR_FIN_END, bx);
}

template <class SC>
static __global__ void __launch_bounds__(FIN_THREADS) finalize_kernel(const tc_args a, int32_t d, int32_t nsb,
                                                                       int32_t mb)
{
    mkv_tc::trace_init(a);
    finalize_block<SC>(a, d, nsb, mb);
    /* With ready flags no block waits for the decode kernel's end, which the kernels after
     * this one in the stream count on: the grid's last block does, once done. */
    if (a.ready && blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1 && blockIdx.z == gridDim.z - 1)
        mkv_tc::griddep_wait();
}

int32_t mkv_tc_merge_blocks(int32_t G, int32_t d, int64_t n_rs, int32_t sec_items)
{
    using T = mkv_decode_tuning;
    const int32_t n4 = G * d / 4;
    if (mkv_tc_merge_blocks_override > 0) return std::min(mkv_tc_merge_blocks_override, n4);
    /* Only small calls (at most a merge block per multiprocessor): where the GPU is full the
     * merge is not the call's last step, and the extra blocks' own loads cost (H100, the mix
     * 16 x 4k with up to 8: 60.9 against 57.0 us). */
    const int64_t sms = mkv_tc_plan::device_attr(cudaDevAttrMultiProcessorCount, T::fallback_sms);
    const int64_t per_merge = (int64_t)FIN_THREADS * T::merge_min_items;
    /* the items a thread of m merge blocks loads (merge_out's item lanes) */
    const auto per_lane = [&](int32_t m) {
        const int32_t lanes = std::max(FIN_THREADS / ((n4 + m - 1) / m), 1);
        return (sec_items + lanes - 1) / lanes;
    };
    int32_t mb = 1;
    for (;;) {
        const int32_t next = 2 * mb;
        if (next > MKV_TC_MERGE_MAX_BLOCKS || next > n4 || n_rs * next > sms) break;
        /* each thread keeps at least merge_min_items items of a section's sec_items */
        const bool few = (int64_t)sec_items * n4 >= next * per_merge;
        /* or would load them in two batches of MKV_TC_MERGE_BATCH */
        const bool two = next <= T::merge_batch_max_blocks && 2 * n_rs * next <= sms && per_lane(mb) > MKV_TC_MERGE_BATCH;
        if (!few && !two) break;
        if (two) {
            /* two batches: the fewest blocks that load them in one (3 where 4 had doubled
             * the head maxima's loads for nothing, decision 112), also where each thread
             * would still keep merge_min_items (40 items: 3 blocks, not 4; decision 113) */
            int32_t m = mb + 1;
            while (m < next && per_lane(m) > MKV_TC_MERGE_BATCH) m++;
            if (m < next) return m;
        }
        mb = next;
    }
    return mb;
}

cudaError_t mkv_tc_finalize(const tc_args &a, int32_t d, int32_t n_seq, cudaStream_t stream)
{
    /* A block's units (tokens): FIN_TOKENS a thread, twice that on long regions with rows. */
    const bool rows = a.G == 4 || a.G == 8, wide = a.max_tokens >= FIN_LONG_REGION;
    const int32_t per_thread = rows && wide ? 2 * FIN_TOKENS : FIN_TOKENS;
    const int64_t units = a.max_tokens;
    const int64_t per_block = (int64_t)FIN_THREADS * per_thread;
    /* Score blocks first (none without a score write-back), then the merge blocks
     * (mkv_tc_merge_blocks). */
    const int32_t nsb = a.keep_logits ? (int32_t)((units + per_block - 1) / per_block) : 0;
    const int32_t mb = mkv_tc_merge_blocks(a.G, d, (int64_t)n_seq * a.H, a.sec_items);
    const unsigned bx = (unsigned)(nsb + mb);
    tc_args f = a; /* the blocks' index last (as the decode pass) where grid z holds them */
    f.x_last = a.x_last && bx <= 65535u;
    const dim3 grid = f.x_last ? dim3((unsigned)a.H, (unsigned)n_seq, bx) : dim3(bx, (unsigned)a.H, (unsigned)n_seq);
    constexpr int T = FIN_TOKENS;
    /* Programmatic serialization: the blocks start while the decode kernel ends (their first
     * loads before griddep_wait). */
    const auto launch = [&](void (*k)(tc_args, int32_t, int32_t, int32_t)) {
        return mkv_tc_launch_pdl(k, grid, dim3(FIN_THREADS), 0, stream, f, d, nsb, mb);
    };
    if (!rows) return launch(finalize_kernel<void>);
    if (a.G == 4) return launch(wide ? finalize_kernel<score_rows<1, 2 * T>> : finalize_kernel<score_rows<1, T>>);
    return launch(wide ? finalize_kernel<score_rows<2, 2 * T>> : finalize_kernel<score_rows<2, T>>);
}
