/*
 * tc_merge.cuh — the merge of a head-region's items and the score write-back's per-token
 * steps, shared by the fused kernel (tc_finish.cuh) and the finalize kernel of the separate
 * pass (decode_tc_finalize.cu): the final max and sum of a head over the items, a token's
 * probability from its logits, the section a write-back walks, and its score slots.
 */
#ifndef MKV_ATTENTION_TC_MERGE_CUH
#define MKV_ATTENTION_TC_MERGE_CUH

#include "attention/decode_tc.h"
#include "attention/tc_ptx.cuh"
#include "attention/tc_staging.cuh"

#include <math.h>

#include <stdint.h>

namespace mkv_tc {

/* One partial result of a block's items, in its part slot (block_part) of head-region rs:
 * warp w < n_work left its item's unnormalised output [G][D] and (max, sum) [G] at smem + w *
 * stride (run_item). The region's merge then reads a part per block, not per item. Threads
 * h < G find head h's max, the warps' weights 2^(m_w - max) (into wf) and the sum; then every
 * thread takes four consecutive outputs at a time, the warps' loads all issued at once. Warps
 * past n_work left nothing (their areas hold whatever was staged) and are skipped, not
 * weighted by 0. Ends without a barrier: the caller's, before the areas are reused.
 * single: the block is its region's only one, so its part is the region's result: the outputs
 * go to out, normalised, and the final max, sum and lse per head to M, S and lse (what
 * region_ms and the merge would make of the one part, bit for bit), and no part is written. */
template <int D>
__device__ __forceinline__ void block_merge(const tc_args &a, const uint8_t *smem, int64_t rs, const block_part &p,
                                            float (&wf)[MKV_TC_WARPS][MKV_TC_MAX_G], bool single, float *M_out,
                                            float *S_out, float *lse_out)
{
    const int32_t G = a.G, GD = G * D, tid = threadIdx.x;
    const int64_t part = (rs * 2 * a.sec_items + p.slot) * G;
    const auto ml = [&](int32_t w, int32_t h) {
        return *reinterpret_cast<const float2 *>(smem + w * p.stride + (GD + 2 * h) * 4);
    };
    if (tid < G) {
        float M = -INFINITY, l = 0.0f;
#pragma unroll
        for (int32_t w = 0; w < MKV_TC_WARPS; w++)
            if (w < p.n_work) M = fmaxf(M, ml(w, tid).x);
#pragma unroll
        for (int32_t w = 0; w < MKV_TC_WARPS; w++) {
            const float f = w < p.n_work ? exp2f(ml(w, tid).x - M) : 0.0f;
            if (w < p.n_work) l = fmaf(ml(w, tid).y, f, l);
            wf[w][tid] = f;
        }
        if (single) M_out[tid] = M, S_out[tid] = l, lse_out[tid] = M + log2f(l);
        else *reinterpret_cast<float2 *>(a.part_ml + (part + tid) * 2) = make_float2(M, l);
    }
    __syncthreads();
    for (int32_t e = 4 * tid; e < GD; e += 4 * MKV_TC_WARPS * 32) {
        const int32_t h = e / D;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int32_t w = 0; w < MKV_TC_WARPS; w++) {
            if (w >= p.n_work) break;
            const float4 x = *reinterpret_cast<const float4 *>(smem + w * p.stride + e * 4);
            const float f = wf[w][h];
            o.x = fmaf(x.x, f, o.x), o.y = fmaf(x.y, f, o.y), o.z = fmaf(x.z, f, o.z), o.w = fmaf(x.w, f, o.w);
        }
        if (!single) {
            *reinterpret_cast<float4 *>(a.part_o + part * D + e) = o;
            continue;
        }
        /* The region's merge of one part: weight 2^(m - M) = 1, then the division by S. */
        const float s = S_out[h];
        const float r[4] = {o.x / s, o.y / s, o.z / s, o.w / s};
        const int64_t at = rs * GD + e;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (a.out16) a.out16[at + k] = a.out_bf16 ? mkv_f32_to_bf16(r[k]) : mkv_f32_to_f16(r[k]);
            else a.out[at + k] = r[k];
        }
    }
}

/* The final max M and sum S (log2 units) of head g over the n_items part slots from part (an
 * item's each in the separate pass, a block's in the fused kernel):
 * one online pass, a slot per lane, then a warp reduction. Reads through L2 (in the fused kernel,
 * other blocks wrote them). UNIFORM (the finalize kernel's): every lane runs the same
 * instructions, the loads predicated, even where n_items is not a multiple of 32: with lanes
 * left out of the loop, the warp merge after it took 1,900 cycles instead of 714 (the mix's
 * 1 x 1k, 23 items a region: 0.6 us of the call; docs/decode-kernel.md), as if the divergent
 * path's code were fetched cold. Not in the fused kernel, where it made ptxas spill (the
 * one-group two-format kernel, 40 / 16 bytes) and its parts are a block's. */
template <bool UNIFORM = true>
__device__ __forceinline__ float2 head_ms(const tc_args &a, int64_t part, int32_t n_items, int32_t g)
{
    const int32_t lane = threadIdx.x & 31;
    float M = -INFINITY, S = 0.0f;
    if constexpr (!UNIFORM) {
        for (int32_t s = lane; s < n_items; s += 32) {
            const float2 ml = __ldcg(reinterpret_cast<const float2 *>(a.part_ml + ((part + s) * a.G + g) * 2));
            const float mn = fmaxf(M, ml.x);
            S = S * exp2f(M - mn) + ml.y * exp2f(ml.x - mn);
            M = mn;
        }
    } else {
        /* Four slots a lane loaded before any is used: one round trip for up to 128 slots,
         * where a loop of one slot a lane had taken one per 32 (the finalize's maxima at
         * batch 1, 33 to 64 item slots: two). */
        constexpr int B = 4;
        for (int32_t s0 = 0; s0 < n_items; s0 += 32 * B) {
            float2 ml[B];
#pragma unroll
            for (int b = 0; b < B; b++) {
                const int32_t s = s0 + b * 32 + lane;
                ml[b] = s < n_items ? __ldcg(reinterpret_cast<const float2 *>(a.part_ml + ((part + s) * a.G + g) * 2))
                                    : make_float2(-INFINITY, 0.0f);
            }
#pragma unroll
            for (int b = 0; b < B; b++) {
                const float mn = fmaxf(M, ml[b].x);
                S = (S > 0.0f ? S * exp2f(M - mn) : 0.0f) + (ml[b].y > 0.0f ? ml[b].y * exp2f(ml[b].x - mn) : 0.0f);
                M = mn;
            }
        }
    }
    /* The warp's maximum first, then one rescale a lane and a plain sum: two chains of five
     * shuffles with one ex2 between them, where merging (M, S) pairs put two ex2 in each of the
     * five rounds (the fused region merge's first step after the last arrival, decision 105;
     * the finalize's, decision 107). */
    float Mx = M;
    for (int x = 16; x > 0; x >>= 1) Mx = fmaxf(Mx, __shfl_xor_sync(0xffffffffu, Mx, x));
    S = S > 0.0f ? S * exp2f(M - Mx) : 0.0f;
    for (int x = 16; x > 0; x >>= 1) S += __shfl_xor_sync(0xffffffffu, S, x);
    return make_float2(Mx, S);
}

/* A token's probability from its row of G logits l (log2 units; global or shared memory,
 * written before this kernel or staged by it): the maximum over the group of
 * 2^(l - lse_g) = 2^(l - M_g) / S_g (the rounding of lse moves it by ~1e-7), taken as 2 to the
 * maximum exponent (one ex2 per token: 2^x is monotonic). */
__device__ __forceinline__ float token_prob(const float *l, int32_t G, const float *lse)
{
    float x = -INFINITY;
    if (G % 4 == 0) { /* 16-byte loads: rows of G % 4 == 0 logits are 16-byte aligned */
        for (int32_t g = 0; g < G; g += 4) {
            const float4 v = *reinterpret_cast<const float4 *>(l + g);
            x = fmaxf(x, fmaxf(fmaxf(v.x - lse[g], v.y - lse[g + 1]), fmaxf(v.z - lse[g + 2], v.w - lse[g + 3])));
        }
    } else {
        for (int32_t g = 0; g < G; g++) x = fmaxf(x, l[g] - lse[g]);
    }
    return ex2(x);
}

/* One section of a head-region for the score write-back: its n tokens' logits (token k's G at
 * lg + k G: the section's item rows follow each other, all full but the last), its page ids
 * (page i at row[i * step]: the high section from the row's start, the low one from its end)
 * and pages of tpp tokens with the score slots at off_score. */
struct section_tokens {
    const float *lg;
    int64_t lin0; /* token x of the compact logits of the section's token 0 */
    const int32_t *row;
    const uint8_t *pool;
    int64_t page_bytes, off_score;
    int32_t step, n, tpp, G;
    float inv_tpp; /* 1 / tpp, rounded */
};

/* Where a section's token k (k >= 0) sits: its page's index i in the section and its slot. */
struct page_slot {
    int32_t i, slot;
};

/* k < 2^22 (every section but of pages of millions of tokens): floor((k + 1/2) / tpp) in fp32,
 * exact there (its distance to an integer, at least 1 / (2 tpp), exceeds the rounding), four
 * instructions where k / tpp and k % tpp as signed integers took two divisions with their
 * sign fix-ups, about 40. The division beyond, out of line: inlined, its code kept the finalize's
 * generic score loop (any G) from being unrolled, which put its page ids on the stack. */
static __device__ __noinline__ int32_t page_of_long(int32_t k, int32_t tpp) { return k / tpp; }

__device__ __forceinline__ page_slot page_of(const section_tokens &s, int32_t k)
{
    const int32_t q = k < (1 << 22) ? __float2int_rz(((float)k + 0.5f) * s.inv_tpp) : page_of_long(k, s.tpp);
    return page_slot{q, k - q * s.tpp};
}

/* Section sec of two, its fields selected rather than indexed: a runtime index into a local
 * array of structs puts the array on the stack (the finalize kernel's score blocks had 128
 * bytes of stack, every thread storing both sections and loading a token's fields back). */
__device__ __forceinline__ section_tokens pick_section(const section_tokens (&s)[2], bool sec)
{
    section_tokens r;
    r.lg = sec ? s[1].lg : s[0].lg;
    r.lin0 = sec ? s[1].lin0 : s[0].lin0;
    r.row = sec ? s[1].row : s[0].row;
    r.pool = s[0].pool, r.page_bytes = s[0].page_bytes, r.G = s[0].G;
    r.off_score = sec ? s[1].off_score : s[0].off_score;
    r.step = sec ? s[1].step : s[0].step;
    r.n = sec ? s[1].n : s[0].n;
    r.tpp = sec ? s[1].tpp : s[0].tpp;
    r.inv_tpp = sec ? s[1].inv_tpp : s[0].inv_tpp;
    return r;
}

/* The score slot at slot of page id page of a section. */
__device__ __forceinline__ float *score_slot(const section_tokens &s, int32_t page, int32_t slot)
{
    // NOTE: int32 page id, widen before the multiply (pools exceed 2 GiB).
    return reinterpret_cast<float *>(const_cast<uint8_t *>(s.pool) + (int64_t)page * s.page_bytes +
                                     s.off_score) + slot;
}

/* Whether the four score slots of tokens k to k + 3 (k a multiple of 4) share a page and are
 * 16-byte aligned (pages of a multiple of 4 tokens, and the pool, its pages and their score
 * segment 16-byte aligned, as mixkv's layouts are): red_add4 takes them. */
__device__ __forceinline__ bool score_v4(const section_tokens &s)
{
    return s.tpp % 4 == 0 &&
           ((reinterpret_cast<uintptr_t>(s.pool) | (uintptr_t)s.page_bytes | (uintptr_t)s.off_score) & 15) == 0;
}

/* The head-region's section sec (high tokens [0, hi), low [hi, n); logits of the high items
 * from slot 0, of the low ones from slot items_hi). */
__device__ __forceinline__ section_tokens section_of_region(const tc_args &a, int64_t rs, int64_t region,
                                                            int32_t sec, int32_t hi, int32_t n,
                                                            int32_t items_hi)
{
    section_tokens s;
    const int64_t slot = rs * (a.sec_items + 1) + (sec ? items_hi : 0);
    s.lg = a.logits + slot * a.item_tokens * a.G;
    s.lin0 = slot * a.item_tokens;
    s.row = a.table + region * a.T + (sec ? a.T - 1 : 0);
    s.step = sec ? -1 : 1;
    s.n = sec ? n - hi : hi;
    s.tpp = a.sec[sec].tpp;
    s.inv_tpp = 1.0f / (float)s.tpp;
    s.off_score = a.sec[sec].off_score;
    s.pool = a.pool, s.page_bytes = a.page_bytes, s.G = a.G;
    return s;
}

/* The score write-back of tokens k = first + u * stride (u < U, 0 <= k < n) of a section (the
 * finalize kernel): each one's probability added to its score slot. All loads (logits and
 * page ids) first, then the reductions: U independent chains, none waiting on a score slot. */
template <int U>
__device__ __forceinline__ void score_tokens(const section_tokens &s, int32_t first, int32_t stride,
                                             const float *lse)
{
    float pmax[U];
    int32_t page[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int32_t k = first + u * stride;
        if (k < 0 || k >= s.n) continue;
        pmax[u] = token_prob(s.lg + (int64_t)k * s.G, s.G, lse);
        page[u] = __ldg(s.row + page_of(s, k).i * s.step);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int32_t k = first + u * stride;
        if (k < 0 || k >= s.n) continue;
        red_add(score_slot(s, page[u], page_of(s, k).slot), pmax[u]);
    }
}

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_MERGE_CUH */
