/*
 * tc_query.cuh — q of a warp's item in the tensor-core decode kernel, in the form its key
 * format's mma takes (item_q, load_q_raw and form_q; used by subtile_logits, tc_subtile.cuh):
 * three signed 8-bit digits of q scaled to integers (the integer mma's keys), or fp16 hi + lo
 * (16-bit keys, and 4-bit keys through the fp16 mma), with the logits' per-head factors and q's sums over
 * each key group. Formed once per item.
 */
#ifndef MKV_ATTENTION_TC_QUERY_CUH
#define MKV_ATTENTION_TC_QUERY_CUH

#include "attention/decode_tc.h"
#include "attention/tc_unpack.cuh"

#include <math.h>

namespace mkv_tc {

/* q of a warp's item in the form its key format's mma takes, and the logits' per-head
 * factors (run_item): thread (gr, tc) holds head gr's run tc. */
template <int KB, int D, int KG, bool HALVES>
struct item_q {
    static constexpr bool KQ = KB < 16;
    /* 4-bit keys through the fp16 mma (key_halves) where HALVES: q as fp16 hi + lo, like
     * 16-bit keys, instead of three 8-bit digits. */
    static constexpr bool KH = HALVES && KB == 4 && D >= 64;
    /* Integer-mma keys loaded by ldmatrix straight into the mma's operand (KG > 1, and 8-bit
     * keys of one group, whose runs loaded per token had cost a register move per word to
     * interleave two tokens' words): q in ldmatrix's element order. */
    static constexpr bool KLD = KQ && !KH && (KG > 1 || KB == 8);
    static constexpr int KRUN = D / 4;                             /* key elements per thread and token */
    static constexpr int QWORDS = KQ && !KH ? KRUN / 4 : KRUN / 2; /* per hi / lo or per digit */
    uint32_t qw[KQ && !KH ? 3 : 2][QWORDS];
    float fac[2];      /* head 2tc + i: scale * log2(e) * 2^-E (2^24 more where KH) */
    float qsum[KG][2]; /* head 2tc + i: q (as the keys' mma sees it) summed over key group g
                          (2^-24 of it where KH) */
    /* KH with KG > 1: the B operand of the zeros' mma (subtile_logits), head gr's group sums
     * of q 2^-24 times MKV_TC_ZQ_SCALE as fp16 hi + lo: row k = 2 tc, 2 tc + 1 holds groups
     * 2 (tc % (KG / 2)) and the next, hi for tc < KG / 2 and lo up to KG, zero beyond. */
    uint32_t zq;
};

/* The zeros' mma scale (item_q::zq): a key group's sum of q 2^-24 is below 2^-3 (64 elements
 * under 2^15 2^-24), so that 2^18 keeps it under fp16's largest and its lo part normal or
 * negligible (2^-42 in q's units). */
#define MKV_TC_ZQ_SCALE 262144.0f
#define MKV_TC_ZQ_UNSCALE 3.814697265625e-06f

/* q of head gr: run tc (one key group), or (KLD, and KG > 1) the thread's share of each
 * 32-element k-step (elements 32 s + 4 tc and 32 s + 16 + 4 tc, four each, for 8-bit keys;
 * 32 s + 8 tc, eight, for 4-bit ones), so that a k-step lies in one group. 16-bit keys, and 4-bit keys
 * through the fp16 mma (KH): q scaled by 2^E (max |q| in [2^14, 2^15)) and split into fp16
 * hi + lo. Other quantized keys: q scaled to integers (max |q| in [2^21, 2^22)) and cut into
 * three signed 8-bit digits, q = d0 + 256 d1 + 65536 d2, in key_byte_elem order; qsum[g] =
 * sum of q over group g. */
/* The thread's elements of q (the loads, issued ahead of the item's first copies so that
 * their latencies overlap; form_q then waits on them). */
template <int KB, int D, int KG, bool HALVES>
__device__ __forceinline__ void load_q_raw(const tc_args &a, int64_t rs, int32_t gr, int32_t tc, float (&qv)[D / 4])
{
    constexpr int KRUN = D / 4;
    const int G = a.G;
    const float *qp = a.q + (rs * G + gr) * D;
    const auto quad = [&](int u) { /* element of the thread's q element u (u % 4 == 0) */
        if constexpr (KG == 1 && !item_q<KB, D, KG, HALVES>::KLD) return tc * KRUN + u;
        else if constexpr (KB == 8) return 32 * (u / 8) + 16 * ((u / 4) % 2) + 4 * tc;
        else return 32 * (u / 8) + 8 * tc + u % 8;
    };
#pragma unroll
    for (int u = 0; u < KRUN; u += 4) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (gr < G) v = __ldg(reinterpret_cast<const float4 *>(qp + quad(u)));
        qv[u] = v.x, qv[u + 1] = v.y, qv[u + 2] = v.z, qv[u + 3] = v.w;
    }
}

/* Q from the thread's elements qv (load_q_raw). */
template <int KB, int D, int KG, bool HALVES>
__device__ __forceinline__ void form_q(const tc_args &a, float (&qv)[D / 4], int32_t gr, int32_t tc,
                                       item_q<KB, D, KG, HALVES> &Q)
{
    constexpr bool KQ = KB < 16, KH = item_q<KB, D, KG, HALVES>::KH;
    constexpr int KRUN = D / 4, QWORDS = item_q<KB, D, KG, HALVES>::QWORDS;
    constexpr int KSPG = D / 32 / KG; /* k-steps per key group (KG > 1) */
    const int G = a.G;
    /* max |q| over four chains (an item's start waits on this at one warp a scheduler) */
    float m4[4] = {};
#pragma unroll
    for (int u = 0; u < KRUN; u++) m4[u % 4] = fmaxf(m4[u % 4], fabsf(qv[u]));
    float mx = fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    int ex = 0;
    if (mx > 0.0f) frexpf(mx, &ex);
    const int E = mx > 0.0f ? (KQ && !KH ? 22 : 15) - ex : 0;
    /* x 2^E (|E| <= 252) by one exact multiply by p = 2^E where that is a normal float (max |q|
     * from 2^-105 up: any q a model gives); otherwise q is first multiplied by 2^(E / 2) and p
     * is the rest (a warp-uniform branch). ldexpf costs several instructions per element. */
    float p = __int_as_float((127 + E) << 23);
    if (__any_sync(0xffffffffu, E < -126 || E > 127)) {
        const float p2a = __int_as_float((127 + E / 2) << 23);
#pragma unroll
        for (int u = 0; u < KRUN; u++) qv[u] *= p2a;
        p = __int_as_float((127 + E - E / 2) << 23);
    }
    float qs[KG]; /* q summed over each key group, as the logits take it */
    if constexpr (KH) {
        /* Word j of the thread's key codes holds its elements 8j to 8j + 7 (one per nibble);
         * key_halves makes it the pairs (0, 4), 16 (1, 5), (2, 6), 16 (3, 7), so q's pair 4j + k
         * is the same elements, the nibbles at bits 4 to 7 divided by their factor 16 (p / 16:
         * p >= 2^-113, so a normal float). The group sums are of q unscaled, then times p (both
         * exact scalings by powers of two). */
        float gs[KG] = {};
#pragma unroll
        for (int u = 0; u < KRUN; u++) gs[KG == 1 ? 0 : u / 8 / KSPG] += qv[u];
        const float p16 = p * 0.0625f;
#pragma unroll
        for (int pp = 0; pp < QWORDS; pp++) {
            const int k = pp % 4, ea = 8 * (pp / 4) + k; /* nibbles k and k + 4 of word pp / 4 */
            const float f = k % 2 ? p16 : p;
            const float x = qv[ea] * f, y = qv[ea + 4] * f;
            Q.qw[0][pp] = pack_h2(x, y);
            Q.qw[1][pp] = pack_h2(x - lo_f(Q.qw[0][pp]), y - hi_f(Q.qw[0][pp]));
        }
#pragma unroll
        for (int g = 0; g < KG; g++) {
            gs[g] += __shfl_xor_sync(0xffffffffu, gs[g], 1);
            gs[g] += __shfl_xor_sync(0xffffffffu, gs[g], 2);
            qs[g] = gs[g] * p * 5.9604644775390625e-8f; /* 2^-24: the codes' scale in key_halves */
        }
        if constexpr (KG > 1) {
            static_assert(KG == 2 || KG == 4, "4-bit key groups of 32 elements or more");
            constexpr int HP = KG / 2; /* group pairs */
            const bool second = KG == 4 && tc % HP == 1;
            const float x = (second ? qs[KG == 4 ? 2 : 0] : qs[0]) * MKV_TC_ZQ_SCALE;
            const float y = (second ? qs[KG == 4 ? 3 : 1] : qs[1]) * MKV_TC_ZQ_SCALE;
            const uint32_t hi = pack_h2(x, y), lo = pack_h2(x - lo_f(hi), y - hi_f(hi));
            Q.zq = tc < HP ? hi : tc < KG ? lo : 0u;
        }
    } else if constexpr (KQ) {
        int qi[KRUN], is[KG] = {};
#pragma unroll
        for (int u = 0; u < KRUN; u++) {
            qi[u] = __float2int_rn(qv[u] * p);
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
        for (int u = 0; u < KRUN; u++) s += qv[u];
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        qs[0] = s * p;
#pragma unroll
        for (int pp = 0; pp < QWORDS; pp++) {
            const float x = qv[2 * pp] * p, y = qv[2 * pp + 1] * p;
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

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_QUERY_CUH */
