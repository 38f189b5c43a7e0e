/*
 * tc_subtile.cuh — the steps of a warp's item in the tensor-core decode kernel (run_item,
 * tc_item.cuh), for the G <= 8 query heads of its group and 16 staged tokens (a subtile) at a
 * time, with two mma products:
 *
 *   logits: S[token][head] = K[token][:] . Q[head][:]. Quantized keys: m16n8k32 u8 x s8 with
 *           the codes as they are (8-bit) or masked into bytes (2-bit, and 4-bit where the
 *           kernel would spill otherwise), and q scaled to integers and cut into three signed
 *           8-bit digits (three exact s32 chains); 4-bit keys: the codes masked into exact fp16
 *           subnormals (key_halves, five instructions a word of eight) through m16n8k16 with q
 *           split into fp16 hi + lo, one fp32 chain per group. 16-bit keys: m16n8k16 with q
 *           split into fp16 hi + lo. Then logit = scale * (s * S + z * sum(q)) per token in
 *           fp32: fp32-grade logits, so that the scores meet 1e-5.
 *   output: O^T[elem][head] += V^T[elem][token] . P^T[token][head], m16n8k16. A = quantized
 *           value codes as exact fp16 subnormals (one AND per pair of tokens: a code keeps its
 *           bit position, the factor 2^(bits * position) and 2^-24 are undone per output row),
 *           or raw fp16 values. B = the probabilities times the token's value scale in fp16,
 *           moved from the logits' accumulator layout by movmatrix.trans; the running max is
 *           raised so that these weights stay below 2^14.5. The zeros add z * sum(p) per head.
 *
 * Several quantization groups a side (template parameters KG, VG; groups_supported): keys take
 * one chain per group, each k-step inside one group; values carry their scale on the codes
 * instead of on the probabilities, and the zeros take a second mma (unpack_values_scaled).
 *
 * Element order inside a thread's run is permuted (the dot products do not care; q and the
 * output use the same maps). Tokens past the item's end are masked: zero codes, zero metadata
 * and a -inf logit, so that NaN-poisoned slots never reach an mma.
 *
 * In the order run_item takes them: item_q and load_q (q in the keys' operand form),
 * softmax_state (the online softmax's running state), subtile_logits, softmax_step,
 * store_compact_step, subtile_values, write_partial.
 */
#ifndef MKV_ATTENTION_TC_SUBTILE_CUH
#define MKV_ATTENTION_TC_SUBTILE_CUH

#include "attention/decode_tc.h"
#include "attention/tc_ptx.cuh"
#include "attention/tc_staging.cuh"
#include "attention/tc_unpack.cuh"

#include <math.h>

namespace mkv_tc {

/* Which quantization groups the kernel takes: one a side, or several where
 *   - keys: 8- or 4-bit codes in groups of 32 elements or more, so that each 32-element k-step
 *     of the integer mma lies in one group (its own chain; 2-bit keys would need 64);
 *   - values: quantized, at most 8 groups, so that a lane's run (d / 8 elements) lies in one.
 * The instantiated variants: one group a side, and the library's default groups
 * (MKV_DEFAULT_GROUPS) where they differ and are covered. */
template <int KB, int VB, int D, int KG, int VG>
__host__ __device__ constexpr bool groups_supported()
{
    return (KG == 1 || ((KB == 8 || KB == 4) && D / KG >= 32)) &&
           (VG == 1 || (VB < 16 && VG <= 8 && D / VG >= 16));
}

/* 20-bit code of y in [0, 1] (rounded to nearest: y (2^20 - 2) + 2^23 in fp32 has ulp 1),
 * in the low 20 bits; bits 20 to 22 are zero. */
__device__ __forceinline__ uint32_t y_code(float y) { return __float_as_uint(fmaf(y, MKV_TC_YSCALE, 8388608.0f)); }

/* q of a warp's item in the form its key format's mma takes, and the logits' per-head
 * factors (run_item): thread (gr, tc) holds head gr's run tc. */
template <int KB, int D, int KG, bool HALVES>
struct item_q {
    static constexpr bool KQ = KB < 16;
    /* 4-bit keys through the fp16 mma (key_halves) where HALVES: q as fp16 hi + lo, like
     * 16-bit keys, instead of three 8-bit digits. */
    static constexpr bool KH = HALVES && KB == 4 && D >= 64;
    static constexpr int KRUN = D / 4;                             /* key elements per thread and token */
    static constexpr int QWORDS = KQ && !KH ? KRUN / 4 : KRUN / 2; /* per hi / lo or per digit */
    uint32_t qw[KQ && !KH ? 3 : 2][QWORDS];
    float fac[2];      /* head 2tc + i: scale * log2(e) * 2^-E (2^24 more where KH) */
    float qsum[KG][2]; /* head 2tc + i: q (as the keys' mma sees it) summed over key group g
                          (2^-24 of it where KH) */
};

/* q of head gr: run tc (one key group), or (KG > 1) the thread's share of each 32-element
 * k-step (elements 32 s + 4 tc and 32 s + 16 + 4 tc, four each, for 8-bit keys; 32 s + 8 tc,
 * eight, for 4-bit ones), so that a k-step lies in one group. 16-bit keys: q scaled by 2^E
 * (max |q| in [2^14, 2^15)) and split into fp16 hi + lo. Quantized keys: q scaled to
 * integers (max |q| in [2^21, 2^22)) and cut into three signed 8-bit digits,
 * q = d0 + 256 d1 + 65536 d2, in key_byte_elem order; qsum[g] = sum of q over group g. */
template <int KB, int D, int KG, bool HALVES>
__device__ __forceinline__ void load_q(const tc_args &a, int64_t rs, int32_t gr, int32_t tc, item_q<KB, D, KG, HALVES> &Q)
{
    constexpr bool KQ = KB < 16, KH = item_q<KB, D, KG, HALVES>::KH;
    constexpr int KRUN = D / 4, QWORDS = item_q<KB, D, KG, HALVES>::QWORDS;
    constexpr int KSPG = D / 32 / KG; /* k-steps per key group (KG > 1) */
    const int G = a.G;
    float qv[KRUN];
    const float *qp = a.q + (rs * G + gr) * D;
    const auto quad = [&](int u) { /* element of the thread's q element u (u % 4 == 0) */
        if constexpr (KG == 1) return tc * KRUN + u;
        else if constexpr (KB == 8) return 32 * (u / 8) + 16 * ((u / 4) % 2) + 4 * tc;
        else return 32 * (u / 8) + 8 * tc + u % 8;
    };
#pragma unroll
    for (int u = 0; u < KRUN; u += 4) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (gr < G) v = __ldg(reinterpret_cast<const float4 *>(qp + quad(u)));
        qv[u] = v.x, qv[u + 1] = v.y, qv[u + 2] = v.z, qv[u + 3] = v.w;
    }
    float mx = 0.0f;
#pragma unroll
    for (int u = 0; u < KRUN; u++) mx = fmaxf(mx, fabsf(qv[u]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    int ex = 0;
    if (mx > 0.0f) frexpf(mx, &ex);
    const int E = mx > 0.0f ? (KQ && !KH ? 22 : 15) - ex : 0;
    /* x 2^E as two exact multiplies by powers of two (|E| <= 252, each half within a
     * float's exponent range): ldexpf costs several instructions per element. */
    const float p2a = __int_as_float((127 + E / 2) << 23), p2b = __int_as_float((127 + E - E / 2) << 23);
    float qs[KG]; /* q summed over each key group, as the logits take it */
    if constexpr (KH) {
        /* Word j of the thread's key codes holds its elements 8j to 8j + 7 (one per nibble);
         * key_halves makes it the pairs (0, 4), 16 (1, 5), (2, 6), 16 (3, 7), so q's pair 4j + k
         * is the same elements, the nibbles at bits 4 to 7 divided by their factor 16. */
        float gs[KG] = {};
#pragma unroll
        for (int u = 0; u < KRUN; u++) {
            qv[u] = qv[u] * p2a * p2b;
            gs[KG == 1 ? 0 : u / 8 / KSPG] += qv[u];
        }
#pragma unroll
        for (int pp = 0; pp < QWORDS; pp++) {
            const int k = pp % 4, ea = 8 * (pp / 4) + k; /* nibbles k and k + 4 of word pp / 4 */
            const float f = k % 2 ? 0.0625f : 1.0f;
            const float x = qv[ea] * f, y = qv[ea + 4] * f;
            Q.qw[0][pp] = pack_h2(x, y);
            Q.qw[1][pp] = pack_h2(x - lo_f(Q.qw[0][pp]), y - hi_f(Q.qw[0][pp]));
        }
#pragma unroll
        for (int g = 0; g < KG; g++) {
            gs[g] += __shfl_xor_sync(0xffffffffu, gs[g], 1);
            gs[g] += __shfl_xor_sync(0xffffffffu, gs[g], 2);
            qs[g] = gs[g] * 5.9604644775390625e-8f; /* 2^-24: the codes' scale in key_halves */
        }
    } else if constexpr (KQ) {
        int qi[KRUN], is[KG] = {};
#pragma unroll
        for (int u = 0; u < KRUN; u++) {
            qi[u] = __float2int_rn(qv[u] * p2a * p2b);
            is[KG == 1 ? 0 : u / 8 / KSPG] += qi[u];
        }
        /* The three signed digits of four elements at a time: with y = q + 0x8080, digit k
         * (k < 2) is byte k of y minus 128, stored as that byte ^ 0x80, and digit 2 is
         * byte 2 of y (the same unique digits in [-128, 127] as q mod 256, mod 65536). */
#pragma unroll
        for (int i = 0; i < QWORDS; i++) {
            uint32_t y[4];
#pragma unroll
            for (int j = 0; j < 4; j++) y[j] = (uint32_t)(qi[key_byte_elem<KB>(4 * i + j)] + 0x8080);
            const auto gather = [&](uint32_t sel) { /* byte sel of y[0..3] into bytes 0..3 */
                return __byte_perm(__byte_perm(y[0], y[1], sel | ((sel + 4) << 4)),
                                   __byte_perm(y[2], y[3], sel | ((sel + 4) << 4)), 0x5410);
            };
            Q.qw[0][i] = gather(0) ^ 0x80808080u;
            Q.qw[1][i] = gather(1) ^ 0x80808080u;
            Q.qw[2][i] = gather(2);
        }
#pragma unroll
        for (int g = 0; g < KG; g++) {
            is[g] += __shfl_xor_sync(0xffffffffu, is[g], 1);
            is[g] += __shfl_xor_sync(0xffffffffu, is[g], 2);
            qs[g] = (float)is[g];
        }
    } else {
        float s = 0.0f;
#pragma unroll
        for (int u = 0; u < KRUN; u++) {
            qv[u] = qv[u] * p2a * p2b;
            s += qv[u];
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        qs[0] = s;
#pragma unroll
        for (int pp = 0; pp < QWORDS; pp++) {
            const float x = qv[2 * pp], y = qv[2 * pp + 1];
            Q.qw[0][pp] = pack_h2(x, y);
            Q.qw[1][pp] = pack_h2(x - lo_f(Q.qw[0][pp]), y - hi_f(Q.qw[0][pp]));
        }
    }
    /* Logits in log2 units: l2 = scale * log2(e) * 2^-E * (s * S + z * sum q). */
    const float f = gr < G ? ldexpf(a.softmax_scale * 1.4426950408889634f, (KH ? 24 : 0) - E) : 0.0f;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        Q.fac[i] = __shfl_sync(0xffffffffu, f, 4 * (2 * tc + i));
#pragma unroll
        for (int g = 0; g < KG; g++) Q.qsum[g][i] = __shfl_sync(0xffffffffu, qs[g], 4 * (2 * tc + i));
    }
}

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
        float ms = 0.0f;
#pragma unroll
        for (int u = 0; u < PAIR; u++) ms = fmaxf(ms, __uint_as_float(vm[u][0]));
#pragma unroll
        for (int x = 1; x < 32; x <<= 1) ms = fmaxf(ms, __shfl_xor_sync(0xffffffffu, ms, x));
        sm.vshift = max(0, (__float_as_int(ms) >> 23) - 127 - 4);
        sh = (float)sm.vshift - 14.5f;
    } else if constexpr (VQ) {
        float ms = 0.0f;
#pragma unroll
        for (int u = 0; u < PAIR; u++)
            ms = fmaxf(ms, fmaxf(fabsf(lo_f(vm[u][0])), fabsf(lo_f(vm[u][1]))));
        ms = fmaxf(ms, __shfl_xor_sync(0xffffffffu, ms, 4));
        ms = fmaxf(ms, __shfl_xor_sync(0xffffffffu, ms, 8));
        ms = fmaxf(ms, __shfl_xor_sync(0xffffffffu, ms, 16));
        sh = fmaxf(lg2(ms) - 14.5f, -60.0f);
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
template <int PAIR, int RG, bool P_FROM_Y, int MTILES>
__device__ __forceinline__ void store_compact_step(const tc_args &a, float *&lg, float (&l)[PAIR][2][2],
                                                   const int32_t (&cnt)[PAIR], const float (&mxr)[2],
                                                   const softmax_state<MTILES> &sm, int32_t gr, int32_t tc,
                                                   bool lg_lane)
{
    const int G = a.G;
    uint32_t *const la = reinterpret_cast<uint32_t *>(lg);
    const int64_t w = la - a.lg_a; /* tc lg_n + x */
    if (gr == 0) {
        /* [tc][x / RG][2]: the step's maximum at its first token's slot of the
         * kernel's grid (RG = STEP but in a two-format kernel, decode_kernel) */
        float *R = a.lg_r + w / RG * 2;
        if (2 * tc < G) R[0] = mxr[0];
        if (2 * tc + 1 < G) R[1] = mxr[1];
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
        float *po = po_s + h * D + gr * VRUN;
#pragma unroll
        for (int t = 0; t < MTILES; t++) {
            float2 r = make_float2(sm.o[t][i], sm.o[t][2 + i]);
            if constexpr (VQ && VG > 1) {
                r.x = fmaf(r.x, 1.0f / value_factor<VB>(2 * t), sm.zsum[i]);
                r.y = fmaf(r.y, 1.0f / value_factor<VB>(2 * t + 1), sm.zsum[i]);
            } else if constexpr (VQ) {
                r.x = fmaf(r.x, 16777216.0f / value_factor<VB>(2 * t), sm.zsum[i]);
                r.y = fmaf(r.y, 16777216.0f / value_factor<VB>(2 * t + 1), sm.zsum[i]);
            }
            *reinterpret_cast<float2 *>(po + 2 * t) = r;
        }
        if (gr == 0) *reinterpret_cast<float2 *>(pml + 2 * h) = make_float2(sm.m[i], sm.lsum[i]);
    }
}

/* The logits l[r][i] of a staged subtile's tokens gr + 8r (rows) for heads 2tc + i
 * (columns), -inf past its cnt tokens, stored to the workspace; its value metadata vm. lg: the lane's
 * logits of the subtile in the workspace (fp32 logits; stored where store). */
template <class SL, int KB, int D, int KG, int VG, bool HALVES>
__device__ __forceinline__ void subtile_logits(const uint8_t *sub, int32_t cnt, const item_q<KB, D, KG, HALVES> &Q, int32_t gr,
                                               int32_t tc, float (&l)[2][2], uint32_t (&vm)[2], float *lg, int G,
                                               bool store)
{
    constexpr bool KQ = SL::KQ, VQ = SL::VQ;
    const int32_t lane = threadIdx.x & 31;
    constexpr int KRUN = D / 4, KSPG = D / 32 / KG;
    const bool lg_pair = G % 2 == 0;
    const auto key_at = [](int c, int t) { return SL::key_at(c, t); };
    /* Key runs tc of tokens gr and gr + 8, metadata of both. */
    uint32_t kw[2][SL::KW], km[2] = {0u, 0u};
    vm[0] = vm[1] = 0u;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = gr + 8 * r;
        if constexpr (KG == 1) load_run<SL::KBYTES>(sub, key_at, tc, t, kw[r]);
        if constexpr (KQ && KG == 1) km[r] = *reinterpret_cast<const uint32_t *>(sub + SL::META + t * 4);
        if constexpr (VQ && VG == 1) vm[r] = *reinterpret_cast<const uint32_t *>(sub + SL::VMETA + t * 4);
    }
    if constexpr (VQ && VG > 1) {
        /* vm[0]: the largest value scale of the lane's group over its tokens 2tc, 2tc + 1,
         * 2tc + 8, 2tc + 9 (fp32 bits), for the step's shift. Non-negative fp16 values
         * order as their bit patterns. */
        const int gv = gr * VG / 8;
        const uint2 m01 = *reinterpret_cast<const uint2 *>(sub + SL::VMETA + gv * 64 + tc * 8);
        const uint2 m23 = *reinterpret_cast<const uint2 *>(sub + SL::VMETA + gv * 64 + 32 + tc * 8);
        const uint32_t mm = __vmaxu2(__byte_perm(m01.x, m01.y, 0x5410) & 0x7fff7fffu,
                                     __byte_perm(m23.x, m23.y, 0x5410) & 0x7fff7fffu);
        vm[0] = __float_as_uint(__half2float(__ushort_as_half((unsigned short)max(mm & 0xffffu, mm >> 16))));
    }
    const uint32_t(&kw0)[SL::KW] = kw[0];
    const uint32_t(&kw1)[SL::KW] = kw[1];
    float c[4];
    constexpr bool KH = item_q<KB, D, KG, HALVES>::KH;
    if constexpr (KH) {
        /* 4-bit keys through the fp16 mma (key_halves), q as hi + lo: word j of the thread's
         * codes (token gr, gr + 8) is k-steps 2j and 2j + 1; one fp32 chain per key group (two
         * for one group), then c = sum over groups of s_g S_g + z_g sum(q over g), S_g 2^24 and
         * the sums of q 2^-24 (load_q). */
        constexpr int KWORDS = D / 32; /* words of codes per thread and token */
        uint32_t w0[KWORDS], w1[KWORDS];
        if constexpr (KG > 1) {
            /* word tc of each 16-byte chunk (ldmatrix: matrices (chunk 2j, tokens 0-7),
             * (2j, 8-15), (2j + 1, 0-7), (2j + 1, 8-15)) */
            const uint32_t sub_s = (uint32_t)__cvta_generic_to_shared(sub);
#pragma unroll
            for (int j = 0; j < KWORDS / 2; j++) {
                uint32_t kr[4];
                ldsm_x4(sub_s + SL::key_at(2 * j + (lane >> 4), (lane & 7) + (lane & 8)), kr);
                w0[2 * j] = kr[0], w1[2 * j] = kr[1], w0[2 * j + 1] = kr[2], w1[2 * j + 1] = kr[3];
            }
        } else {
#pragma unroll
            for (int j = 0; j < KWORDS; j++) w0[j] = kw0[j], w1[j] = kw1[j];
        }
        constexpr int NCH = KG > 1 ? KG : 2, WPC = KWORDS / NCH; /* chains, words per chain */
        float cc[NCH][4];
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            cc[ch][0] = cc[ch][1] = cc[ch][2] = cc[ch][3] = 0.0f;
#pragma unroll
            for (int jj = 0; jj < WPC; jj++) {
                const int j = KG > 1 ? ch * WPC + jj : 2 * jj + ch;
                uint32_t h0[4], h1[4];
                key_halves(w0[j], h0);
                key_halves(w1[j], h1);
#pragma unroll
                for (int hl = 0; hl < 2; hl++) {
                    mma(cc[ch], h0[0], h1[0], h0[1], h1[1], Q.qw[hl][4 * j], Q.qw[hl][4 * j + 1]);
                    mma(cc[ch], h0[2], h1[2], h0[3], h1[3], Q.qw[hl][4 * j + 2], Q.qw[hl][4 * j + 3]);
                }
            }
        }
        if constexpr (KG > 1) {
            c[0] = c[1] = c[2] = c[3] = 0.0f;
#pragma unroll
            for (int g = 0; g < KG; g++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const uint32_t mk = *reinterpret_cast<const uint32_t *>(sub + SL::META + g * 64 + (gr + 8 * r) * 4);
#pragma unroll
                    for (int i = 0; i < 2; i++)
                        c[2 * r + i] = fmaf(lo_f(mk), cc[g][2 * r + i], fmaf(hi_f(mk), Q.qsum[g][i], c[2 * r + i]));
                }
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) c[i] = cc[0][i] + cc[1][i];
        }
    } else if constexpr (KQ && KG > 1) {
        /* Groups of 32 elements or more: k-step s takes elements [32 s, 32 s + 32), all in
         * group s / KSPG, from word tc of each chunk (ldmatrix: matrices (chunk 2j, tokens
         * 0-7), (2j, 8-15), (2j + 1, 0-7), (2j + 1, 8-15)); one exact integer chain per digit
         * and group, then c = sum over groups of s_g S_g + z_g sum(q over g). */
        constexpr int NCALL = SL::KC / 2;
        /* 4-bit codes in groups of at most 32 elements: a group's S = c0 + 256 c1 + 65536 c2 is
         * exact in int32 (|S| <= 15 * 2^22 * 32 < 2^31, and so is every partial sum), one
         * conversion instead of two and an FMA. */
        constexpr bool EXACT32 = KB == 4 && D / KG <= 32;
        uint32_t kr[NCALL][4];
        const uint32_t sub_s = (uint32_t)__cvta_generic_to_shared(sub);
#pragma unroll
        for (int j = 0; j < NCALL; j++) ldsm_x4(sub_s + SL::key_at(2 * j + (lane >> 4), (lane & 7) + (lane & 8)), kr[j]);
        c[0] = c[1] = c[2] = c[3] = 0.0f;
#pragma unroll
        for (int g = 0; g < KG; g++) {
            int cc[3][4] = {};
#pragma unroll
            for (int ks = g * KSPG; ks < (g + 1) * KSPG; ks++) {
                uint32_t a0, a1, a2, a3;
                if constexpr (KB == 8) {
                    a0 = kr[ks][0], a1 = kr[ks][1], a2 = kr[ks][2], a3 = kr[ks][3];
                } else {
                    const uint32_t w0 = kr[ks / 2][2 * (ks % 2)], w1 = kr[ks / 2][2 * (ks % 2) + 1];
                    a0 = w0 & 0x0F0F0F0Fu, a1 = w1 & 0x0F0F0F0Fu;
                    a2 = (w0 >> 4) & 0x0F0F0F0Fu, a3 = (w1 >> 4) & 0x0F0F0F0Fu;
                }
#pragma unroll
                for (int dg = 0; dg < 3; dg++) mma_u8s8(cc[dg], a0, a1, a2, a3, Q.qw[dg][2 * ks], Q.qw[dg][2 * ks + 1]);
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint32_t mk = *reinterpret_cast<const uint32_t *>(sub + SL::META + g * 64 + (gr + 8 * r) * 4);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int x = 2 * r + i;
                    const float cg = EXACT32 ? (float)(cc[0][x] + 256 * cc[1][x] + 65536 * cc[2][x])
                                             : fmaf(65536.0f, (float)cc[2][x], (float)(cc[0][x] + 256 * cc[1][x]));
                    c[x] = fmaf(lo_f(mk), cg, fmaf(hi_f(mk), Q.qsum[g][i], c[x]));
                }
            }
        }
    } else if constexpr (KQ) {
        /* One exact integer chain per digit of q, then S = c0 + 256 c1 + 65536 c2. */
        constexpr int BW = KRUN / 4;
        uint32_t k0[BW], k1[BW];
        unpack_key_bytes<KB>(kw0, k0);
        unpack_key_bytes<KB>(kw1, k1);
        int cc[3][4] = {};
#pragma unroll
        for (int ks = 0; ks < BW / 2; ks++)
#pragma unroll
            for (int dg = 0; dg < 3; dg++)
                mma_u8s8(cc[dg], k0[2 * ks], k1[2 * ks], k0[2 * ks + 1], k1[2 * ks + 1],
                         Q.qw[dg][2 * ks], Q.qw[dg][2 * ks + 1]);
#pragma unroll
        for (int i = 0; i < 4; i++) /* |c0 + 256 c1| < 2^31: 128 x 255 x 128 x 257 */
            c[i] = fmaf(65536.0f, (float)cc[2][i], (float)(cc[0][i] + 256 * cc[1][i]));
    } else {
        /* Four independent chains (even and odd k-steps, hi and lo q). */
        constexpr int KSTEPS = D / 16;
        float cc[4][4] = {};
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
            mma(cc[ks % 2], kw0[2 * ks], kw1[2 * ks], kw0[2 * ks + 1], kw1[2 * ks + 1],
                Q.qw[0][2 * ks], Q.qw[0][2 * ks + 1]);
            mma(cc[2 + ks % 2], kw0[2 * ks], kw1[2 * ks], kw0[2 * ks + 1], kw1[2 * ks + 1],
                Q.qw[1][2 * ks], Q.qw[1][2 * ks + 1]);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) c[i] = (cc[0][i] + cc[1][i]) + (cc[2][i] + cc[3][i]);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const bool valid = gr + 8 * r < cnt;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float raw = c[2 * r + i];
            if constexpr (KQ && KG == 1) raw = fmaf(lo_f(km[r]), raw, hi_f(km[r]) * Q.qsum[0][i]);
            l[r][i] = valid ? Q.fac[i] * raw : -INFINITY;
        }
        if (valid && store) {
            float *dst = lg + 8 * r * G;
            if (lg_pair) {
                st_logit(dst, l[r][0], l[r][1], policy_evict_last());
            } else {
                st_logit(dst, l[r][0], policy_evict_last());
                if (2 * tc + 1 < G) st_logit(dst + 1, l[r][1], policy_evict_last());
            }
        }
    }
}

/* The weights p' = 2^(l - m) of a subtile's tokens (after the softmax step) into lsum, zsum
 * and, through the values' mma, o. READY: whether l holds
 * them already (compact logits: p = y 2^(R - m)), or the logits. */
template <class SL, int VB, int D, int VG, bool READY, int MTILES>
__device__ __forceinline__ void subtile_values(softmax_state<MTILES> &sm, const uint8_t *sub, const float (&l)[2][2],
                                               const uint32_t (&vm)[2], int32_t gr, int32_t tc)
{
    constexpr bool VQ = SL::VQ;
    constexpr int VRUN = D / 8;
    const auto value_at = [](int c, int t) { return SL::value_at(c, t); };
    uint32_t pw[2];
    float p[2][2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if constexpr (READY) p[r][i] = l[r][i];
            else p[r][i] = ex2(l[r][i] - sm.m[i]);
            sm.lsum[i] += p[r][i];
            if constexpr (VQ && VG == 1) sm.zsum[i] = fmaf(p[r][i], hi_f(vm[r]), sm.zsum[i]);
        }
        if constexpr (VQ && VG > 1) {
            /* Multi-group values: the scale rides on the codes, p' 2^k on B. */
            const float e2k = __int_as_float((127 + sm.vshift) << 23);
            pw[r] = pack_h2(p[r][0] * e2k, p[r][1] * e2k);
        } else if constexpr (VQ) {
            /* The mma's weights: p' times the value scale, one fp16 rounding. */
            const float vs = lo_f(vm[r]);
            pw[r] = pack_h2(p[r][0] * vs, p[r][1] * vs);
        } else {
            pw[r] = pack_h2(p[r][0], p[r][1]);
        }
    }
    const uint32_t b0 = transpose8x8(pw[0]);
    const uint32_t b1 = transpose8x8(pw[1]);
    /* Values of tokens (2tc, 2tc + 1) and (2tc + 8, 2tc + 9), run gr. */
    uint32_t vw[4][SL::VW];
#pragma unroll
    for (int r = 0; r < 4; r++)
        load_run<SL::VBYTES_RAW>(sub, value_at, gr, 2 * tc + (r & 1) + 8 * (r >> 1), vw[r]);
    uint32_t v01[VRUN], v23[VRUN];
    if constexpr (VQ && VG > 1) {
        /* The lane's run lies in group gv: its tokens' scales times 2^-k (unpack_values_scaled).
         * The zeros through the tensor cores too: Z[group][head] += z[group][token] B, rows
         * = groups (lane gr holds group gr's zeros, times 2^-k; rows gr + 8 none). */
        const int gv = gr * VG / 8;
        const uint32_t hk = h2_pow2_neg(sm.vshift);
        const uint2 m01 = *reinterpret_cast<const uint2 *>(sub + SL::VMETA + gv * 64 + tc * 8);
        const uint2 m23 = *reinterpret_cast<const uint2 *>(sub + SL::VMETA + gv * 64 + 32 + tc * 8);
        uint32_t z01, z23;
        if constexpr (VG == 8) {
            z01 = __byte_perm(m01.x, m01.y, 0x7632), z23 = __byte_perm(m23.x, m23.y, 0x7632);
        } else {
            const int gz = gr < VG ? gr : VG - 1;
            const uint2 n01 = *reinterpret_cast<const uint2 *>(sub + SL::VMETA + gz * 64 + tc * 8);
            const uint2 n23 = *reinterpret_cast<const uint2 *>(sub + SL::VMETA + gz * 64 + 32 + tc * 8);
            z01 = gr < VG ? __byte_perm(n01.x, n01.y, 0x7632) : 0u;
            z23 = gr < VG ? __byte_perm(n23.x, n23.y, 0x7632) : 0u;
        }
        mma(sm.zacc, hmul2(z01, hk), 0u, hmul2(z23, hk), 0u, b0, b1);
        unpack_values_scaled<VB>(vw[0], vw[1], hmul2(__byte_perm(m01.x, m01.y, 0x5410), hk), v01);
        unpack_values_scaled<VB>(vw[2], vw[3], hmul2(__byte_perm(m23.x, m23.y, 0x5410), hk), v23);
    } else {
        unpack_values<VB>(vw[0], vw[1], v01);
        unpack_values<VB>(vw[2], vw[3], v23);
    }
#pragma unroll
    for (int t = 0; t < MTILES; t++)
        mma(sm.o[t], v01[2 * t], v01[2 * t + 1], v23[2 * t], v23[2 * t + 1], b0, b1);
}

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_SUBTILE_CUH */
