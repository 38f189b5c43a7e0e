/*
 * tc_softmax.cuh — a warp item's online softmax in the tensor-core decode kernel: its running
 * state (softmax_state: maximum, sums, partial output in mma accumulators), one step over a
 * stage's subtiles (softmax_step), the compact logits a fused call keeps of a step
 * (store_compact_step, y_code), and the item's partial result at its end (write_partial).
 * The subtiles' mma products are tc_subtile.cuh's; run_item (tc_item.cuh) calls both.
 */
#ifndef MKV_ATTENTION_TC_SOFTMAX_CUH
#define MKV_ATTENTION_TC_SOFTMAX_CUH

#include "attention/decode_tc.h"
#include "attention/tc_ptx.cuh"
#include "attention/tc_staging.cuh"
#include "attention/tc_unpack.cuh"

#include <math.h>

namespace mkv_tc {

/* 20-bit code of y in [0, 1] (rounded to nearest: y (2^20 - 2) + 2^23 in fp32 has ulp 1),
 * in the low 20 bits; bits 20 to 22 are zero. */
__device__ __forceinline__ uint32_t y_code(float y) { return __float_as_uint(fmaf(y, MKV_TC_YSCALE, 8388608.0f)); }

/* The online softmax of a warp's item, per head column 2tc + i: the running maximum m (log2
 * units; raised so that the weights times the value scales stay in fp16 range), the sums of
 * the weights p' and of p' times the value zeros, and the partial output O^T in mma
 * accumulators. Multi-group values also keep the zeros' own mma accumulator (row gr: group
 * gr, heads 2tc, 2tc + 1; rows gr + 8 stay 0) and the current step's shift k (value scales
 * times 2^-k on the codes, p' times 2^k on B). */
template <int MTILES>
struct softmax_state {
    float o[MTILES][4];
    float m[2], lsum[2], zsum[2], zacc[4];
    int vshift;

    __device__ __forceinline__ void init()
    {
#pragma unroll
        for (int t = 0; t < MTILES; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
        m[0] = m[1] = -INFINITY;
        lsum[0] = lsum[1] = zsum[0] = zsum[1] = 0.0f;
        zacc[0] = zacc[1] = zacc[2] = zacc[3] = 0.0f;
        vshift = 0;
    }

    /* Everything accumulated so far times alpha[i] (head column i's maximum moved). */
    __device__ __forceinline__ void rescale(const float (&alpha)[2])
    {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            lsum[i] *= alpha[i];
            zsum[i] *= alpha[i];
            zacc[i] *= alpha[i];
#pragma unroll
            for (int t = 0; t < MTILES; t++) o[t][i] *= alpha[i], o[t][2 + i] *= alpha[i];
        }
    }
};

/* One online-softmax step over PAIR staged subtiles' logits l[u][r][i] (token gr + 8r of
 * subtile u, head column 2tc + i) and value metadata vm: the step's maximum per head column
 * into mxr (a reduction over gr), the running maximum moved (and everything accumulated
 * rescaled, skipped when no lane's maximum moved). */
template <bool VQ, int VG, int PAIR, int MTILES>
__device__ __forceinline__ void softmax_step(softmax_state<MTILES> &sm, const float (&l)[PAIR][2][2],
                                             const uint32_t (&vm)[PAIR][2], float (&mxr)[2])
{
    /* Quantized values: the running maximum m is raised by sh = log2(max scale) - 14.5, so
     * that p' = 2^(l - m) times the token's value scale stays below 2^14.5 in fp16 (o, lsum,
     * and zsum all carry the same factor, which the merge cancels). */
    float sh = 0.0f;
    if constexpr (VQ && VG > 1) {
        /* Multi-group values: k = max(0, floor(log2(max scale)) - 4), so that every
         * scale times 2^-k is at most 32 (unpack_values_scaled), and the running
         * maximum raised so that p' 2^k stays below 2^14.5. */
        /* The scales' fp32 bits (non-negative) order as unsigned integers: one warp
         * reduction instead of five shuffles and maxima. */
        uint32_t ms = 0u;
#pragma unroll
        for (int u = 0; u < PAIR; u++) ms = max(ms, vm[u][0]);
        ms = __reduce_max_sync(0xffffffffu, ms);
        sm.vshift = max(0, (int)(ms >> 23) - 127 - 4);
        sh = (float)sm.vshift - 14.5f;
    } else if constexpr (VQ) {
        /* |scale| as fp16 bits (sign cleared) orders as unsigned integers: one warp reduction
         * (every lane of a row holds its tokens' metadata) instead of three shuffles. */
        uint32_t mb = 0u;
#pragma unroll
        for (int u = 0; u < PAIR; u++) mb = max(mb, max(vm[u][0] & 0x7fffu, vm[u][1] & 0x7fffu));
        mb = __reduce_max_sync(0xffffffffu, mb);
        sh = fmaxf(lg2(__half2float(__ushort_as_half((unsigned short)mb))) - 14.5f, -60.0f);
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float mx = fmaxf(l[0][0][i], l[0][1][i]);
#pragma unroll
        for (int u = 1; u < PAIR; u++) mx = fmaxf(mx, fmaxf(l[u][0][i], l[u][1][i]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        mxr[i] = mx;
        const float mn = fmaxf(sm.m[i], mx + sh);
        alpha[i] = ex2(sm.m[i] - mn);
        sm.m[i] = mn;
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) sm.rescale(alpha);
}

/* Compact logits of a softmax step (fused calls, a.compact): the step's maximum R per head
 * (lanes gr = 0) and each token's y = 2^(l - R), heads 2tc and 2tc + 1 as a word of the
 * codes' low halves and a byte of their high nibbles; where P_FROM_Y, the token's weight
 * p = y 2^(R - m) replaces its logit (a multiply instead of a second ex2; subtile_values takes
 * it as it is). Subtile u's tokens start 16 u on (all subtiles of a step but the item's last
 * are 16 tokens). Pair-major arrays: the offsets are immediates. lg: the lane's word of lg_a
 * (token gr, pair tc), advanced past the step. */
template <int PAIR, bool P_FROM_Y, int MTILES>
__device__ __forceinline__ void store_compact_step(const tc_args &a, float *&lg, float (&l)[PAIR][2][2],
                                                   const int32_t (&cnt)[PAIR], const float (&mxr)[2],
                                                   const softmax_state<MTILES> &sm, int32_t gr, int32_t tc,
                                                   bool lg_lane)
{
    const int G = a.G;
    uint32_t *const la = reinterpret_cast<uint32_t *>(lg);
    const int64_t w = la - a.lg_a; /* tc lg_n + x */
    if (gr == 0) {
        /* [tc][x / MKV_TC_R_GRID][2]: the step's maximum at each of its 16-token slots that holds
         * tokens (an item's last step may reach past its slot row), so that a reader finds a
         * token's at x / 16 without knowing the step. */
        static_assert(MKV_TC_R_GRID == 16, "a slot per subtile");
        float *R = a.lg_r + w / MKV_TC_R_GRID * 2;
#pragma unroll
        for (int u = 0; u < PAIR; u++) {
            if (cnt[u] == 0) break;
            if (2 * tc < G) R[2 * u] = mxr[0];
            if (2 * tc + 1 < G) R[2 * u + 1] = mxr[1];
        }
    }
    uint8_t *const lb = a.lg_b + w;
    const float e0 = P_FROM_Y ? ex2(mxr[0] - sm.m[0]) : 0.0f, e1 = P_FROM_Y ? ex2(mxr[1] - sm.m[1]) : 0.0f;
    int32_t step_n = 0;
#pragma unroll
    for (int u = 0; u < PAIR; u++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float y0 = ex2(l[u][r][0] - mxr[0]), y1 = ex2(l[u][r][1] - mxr[1]);
            if constexpr (P_FROM_Y) l[u][r][0] = y0 * e0, l[u][r][1] = y1 * e1;
            const uint32_t c0 = y_code(y0), c1 = y_code(y1);
            /* Low 16 bits of both codes; bits 16 to 19 of both in one byte (bits
             * 20 to 23 of c are zero): a byte permute and a bit select. */
            st_codes_if(gr + 8 * r < cnt[u] && lg_lane, la + 16 * u + 8 * r, __byte_perm(c0, c1, 0x5410),
                        lb + 16 * u + 8 * r, ((c0 >> 16) & 0xFu) | ((c1 >> 12) & 0xF0u), policy_evict_last());
        }
        step_n += cnt[u];
    }
    lg = reinterpret_cast<float *>(la + step_n);
}

/* The end of a warp's item (every copy landed): its partial result. */
template <int VB, int D, int VG, bool FUSED, int WARP_BYTES, int MTILES>
__device__ __forceinline__ void write_partial(const tc_args &a, uint8_t *smem, const item_pos &ip,
                                              softmax_state<MTILES> &sm, int32_t gr, int32_t tc)
{
    constexpr bool VQ = VB < 16;
    constexpr int VRUN = D / 8;
    const int G = a.G;
    /* The item's partial result: sums over the rows (gr), then per head O + z * sum(p'), where
     * one-group quantized values first give back their 2^-24 and factor f(u); multi-group ones
     * add their group's row of the zeros' product (group gv's, held by lane (gv, tc)). */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) {
            sm.lsum[i] += __shfl_xor_sync(0xffffffffu, sm.lsum[i], x);
            if constexpr (VG == 1) sm.zsum[i] += __shfl_xor_sync(0xffffffffu, sm.zsum[i], x);
        }
    if constexpr (VQ && VG > 1) {
#pragma unroll
        for (int i = 0; i < 2; i++) sm.zsum[i] = __shfl_sync(0xffffffffu, sm.zacc[i], (gr * VG / 8) * 4 + tc);
    }
    /* Separate pass: to the item's part slot. Fused: into the warp's staging area, idle now
     * (every copy has landed and every lane has read its last stage), o as [G][D] then (max,
     * sum) per head, for block_merge (one part per block: the region's last block merges a
     * quarter of the parts, which shortened the fused calls' tail; the separate launches of
     * two-format calls measured slower with it). */
    __syncwarp();
    static_assert(WARP_BYTES >= MKV_TC_MAX_G * (D + 2) * 4, "a warp's area holds its partial result");
    float *const po_s = FUSED ? reinterpret_cast<float *>(smem + (threadIdx.x >> 5) * WARP_BYTES)
                              : a.part_o + (ip.rs * 2 * a.sec_items + ip.slot_id) * G * D;
    float *const pml = FUSED ? po_s + G * D : a.part_ml + (ip.rs * 2 * a.sec_items + ip.slot_id) * G * 2;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int32_t h = 2 * tc + i;
        if (h >= G) continue;
        /* The lane's VRUN consecutive outputs of head h (tile t's rows hold elements 2t and
         * 2t + 1 of its run), 16 bytes a store: half the store instructions of 8-byte ones,
         * which had queued behind each other at the item's end. */
        float *po = po_s + h * D + gr * VRUN;
        static_assert(MTILES % 2 == 0, "runs of whole float4s");
#pragma unroll
        for (int t = 0; t < MTILES; t += 2) {
            float r[4] = {sm.o[t][i], sm.o[t][2 + i], sm.o[t + 1][i], sm.o[t + 1][2 + i]};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if constexpr (VQ && VG > 1) r[e] = fmaf(r[e], 1.0f / value_factor<VB>(2 * t + e), sm.zsum[i]);
                else if constexpr (VQ) r[e] = fmaf(r[e], 16777216.0f / value_factor<VB>(2 * t + e), sm.zsum[i]);
            }
            *reinterpret_cast<float4 *>(po + 2 * t) = make_float4(r[0], r[1], r[2], r[3]);
        }
        if (gr == 0) *reinterpret_cast<float2 *>(pml + 2 * h) = make_float2(sm.m[i], sm.lsum[i]);
    }
}

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_SOFTMAX_CUH */
