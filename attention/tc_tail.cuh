/*
 * tc_tail.cuh — the separate pass's write-back in the decode kernel (tc_args::fin_inline):
 * the last block of a head-region to end its items merges the region's item parts into out
 * and adds its tokens' probabilities to their score slots, what the finalize kernel
 * (decode_tc_finalize.cu) does for every region after the decode kernel has ended. Here it
 * runs while the decode kernel's other blocks stream, and reads the region's logits and parts
 * from L2, shortly after they were written. Design: docs/decode-kernel.md, "Score write-back
 * in the regions' last blocks".
 */
#ifndef MKV_ATTENTION_TC_TAIL_CUH
#define MKV_ATTENTION_TC_TAIL_CUH

#include "attention/decode_tc.h"
#include "attention/tc_merge.cuh"
#include "attention/tc_staging.cuh"

#include <stdint.h>

namespace mkv_tc {

/* The score write-back of a region's n tokens (high [0, hi) in s[0], low in s[1]), a block of
 * ROWS's threads ROWS::PER_BLOCK tokens at a time, each chunk's loads issued together. */
template <class ROWS>
__device__ __forceinline__ void tail_scores(const tc_args &a, const section_tokens (&s)[2], int32_t hi, int32_t n,
                                            const float *lse)
{
    for (int32_t first = 0; first < n; first += ROWS::PER_BLOCK) {
        ROWS rows;
        if (first >= hi || min(first + ROWS::PER_BLOCK, n) <= hi) { /* in one section */
            const section_tokens t[2] = {pick_section(s, first >= hi), s[1]};
            const int32_t base = first >= hi ? hi : 0;
            rows.template load<true>(a, t, base, n, first);
            rows.template add<true>(a, t, base, n, first, lse);
        } else {
            rows.template load<false>(a, s, hi, n, first);
            rows.template add<false>(a, s, hi, n, first, lse);
        }
    }
}

/* Drops the 128-byte lines wholly inside bytes bytes from p from L2 without writing them back
 * (a line shared with a neighbouring range stays), a block's threads a line each. */
__device__ __forceinline__ void discard_lines(const float *p, int64_t bytes)
{
    const uintptr_t b = reinterpret_cast<uintptr_t>(p), e = b + (uintptr_t)bytes;
    for (uintptr_t x = ((b + 127) & ~(uintptr_t)127) + threadIdx.x * 128; x + 128 <= e; x += blockDim.x * 128)
        discard_line(reinterpret_cast<const void *>(x));
}

/* Head-region rs's write-back by the block (NTH threads; all call it: it holds barriers) that
 * found itself the region's last: each head's final max and sum over the item slots
 * (head_ms), the scores (fp32 logits, G 4 or 8), then out (merge_out, in slices of at most
 * NTH float4s). smem: the block's staging areas, idle by now (4,224 bytes used). Where
 * a.discard, the region's logits and parts, read, leave L2 without a write-back to DRAM. */
template <int D, int NTH>
__device__ __forceinline__ void region_tail(const tc_args &a, uint8_t *smem, int64_t rs)
{
    const int32_t tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, G = a.G;
    const int64_t region = a.regions[rs];
    const int64_t nh = max(a.n_hi[region], 0), nl = max(a.n_lo[region], 0);
    const int32_t n = (int32_t)min(nh + nl, (int64_t)a.max_tokens);
    if (n == 0) return; /* out untouched, as in the reference */
    const int32_t hi = (int32_t)min(nh, (int64_t)n);
    /* the region's item slots (high items from high_item_tokens), as the finalize kernel's */
    const int32_t I = a.item_tokens, Ih = high_item_tokens(a, hi, n);
    const int32_t items_hi = (hi + I - 1) / I, items_lo = (n - hi + I - 1) / I;
    const int32_t slots = (hi + Ih - 1) / Ih + items_lo;
    const int64_t part = rs * 2 * a.sec_items;
    float *const M = reinterpret_cast<float *>(smem), *const S = M + MKV_TC_MAX_G, *const lse = S + MKV_TC_MAX_G;
    using W_t = float[MKV_TC_MERGE_ROUND][MKV_TC_MAX_G];
    using R_t = float4[NTH];
    W_t &W = *reinterpret_cast<W_t *>(smem + 128);
    R_t &R = *reinterpret_cast<R_t *>(smem + 128 + sizeof(W_t));
    for (int32_t g = warp; g < G; g += NTH / 32) {
        const float2 ms = head_ms(a, part, slots, g);
        if (lane == 0) M[g] = ms.x, S[g] = ms.y, lse[g] = ms.x + log2f(ms.y);
    }
    __syncthreads();
    if (a.keep_logits) {
        const section_tokens s[2] = {section_of_region(a, rs, region, 0, hi, n, items_hi),
                                     section_of_region(a, rs, region, 1, hi, n, items_hi)};
        if (G == 4) tail_scores<score_rows<1, 8, NTH, true>>(a, s, hi, n, lse);
        else tail_scores<score_rows<2, 4, NTH, true>>(a, s, hi, n, lse);
        if (a.discard) { /* the region's logit rows, read: dropped from L2 unwritten */
            __syncthreads();
            discard_lines(a.logits + rs * (a.sec_items + 1) * I * G, (int64_t)(items_hi + items_lo) * I * G * 4);
        }
    }
    const int32_t n4 = G * D / 4, mb = (n4 + NTH - 1) / NTH;
    for (int32_t k = 0; k < mb; k++) merge_out<NTH>(a, part, slots, rs, D, M, S, W, R, k, mb);
    if (a.discard) { /* likewise the parts */
        __syncthreads();
        discard_lines(a.part_o + part * G * D, (int64_t)slots * G * D * 4);
        discard_lines(a.part_ml + part * G * 2, (int64_t)slots * G * 2 * 4);
    }
}

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_TAIL_CUH */
