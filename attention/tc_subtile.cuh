/*
 * tc_subtile.cuh — a staged subtile's two mma products in the tensor-core decode kernel
 * (run_item, tc_item.cuh), for the G <= 8 query heads of a warp's group and 16 staged tokens
 * (a subtile) at a time:
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
 * run_item takes, per item: load_q_raw and form_q (tc_query.cuh), then per subtile
 * subtile_logits, per step softmax_step (and store_compact_step; tc_softmax.cuh), per subtile
 * subtile_values, and write_partial (tc_softmax.cuh) at the end.
 */
#ifndef MKV_ATTENTION_TC_SUBTILE_CUH
#define MKV_ATTENTION_TC_SUBTILE_CUH

#include "attention/decode_tc.h"
#include "attention/tc_ptx.cuh"
#include "attention/tc_query.cuh"
#include "attention/tc_softmax.cuh"
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

/* The logits l[r][i] of a staged subtile's tokens gr + 8r (rows) for heads 2tc + i
 * (columns), -inf past its cnt tokens, stored to the workspace; its value metadata vm. lg: the lane's
 * logits of the subtile in the workspace (fp32 logits; stored where store). PRED_ST: the
 * separate pass's kernel, whose stores are predicated instead of branched and plain (decision
 * 90); the fused kernel keeps branched stores under evict_last (predicated, it spilled), its
 * score jobs reading the logits back from L2. */
template <class SL, int KB, int D, int KG, int VG, bool HALVES, bool PRED_ST>
__device__ __forceinline__ void subtile_logits(const uint8_t *sub, int32_t cnt, const item_q<KB, D, KG, HALVES> &Q, int32_t gr,
                                               int32_t tc, float (&l)[2][2], uint32_t (&vm)[2], float *lg, int G,
                                               bool store)
{
    constexpr bool KQ = SL::KQ, VQ = SL::VQ, KLD = item_q<KB, D, KG, HALVES>::KLD;
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
        if constexpr (KG == 1 && !KLD) load_run<SL::KBYTES>(sub, key_at, tc, t, kw[r]);
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
         * the sums of q 2^-24 (form_q). */
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
            /* The zeros' term sum_g z_g sum(q over g) through one mma: A = the tokens' zeros
             * (rows gr, gr + 8; column k = 2 tc, 2 tc + 1 the groups of item_q::zq's row, so
             * that each group meets q's hi and lo sums), exact fp16 products in fp32; then
             * the scales' term, one FMA a group. */
            uint32_t mk[KG][2];
#pragma unroll
            for (int g = 0; g < KG; g++)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    mk[g][r] = *reinterpret_cast<const uint32_t *>(sub + SL::META + g * 64 + (gr + 8 * r) * 4);
            const bool second = KG == 4 && tc % (KG / 2) == 1;
            uint32_t za[2];
#pragma unroll
            for (int r = 0; r < 2; r++)
                za[r] = second ? __byte_perm(mk[KG == 4 ? 2 : 0][r], mk[KG == 4 ? 3 : 1][r], 0x7632)
                               : __byte_perm(mk[0][r], mk[1][r], 0x7632);
            float cz[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma(cz, za[0], za[1], 0u, 0u, Q.zq, 0u);
#pragma unroll
            for (int x = 0; x < 4; x++) c[x] = cz[x] * MKV_TC_ZQ_UNSCALE;
#pragma unroll
            for (int g = 0; g < KG; g++)
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int i = 0; i < 2; i++) c[2 * r + i] = fmaf(lo_f(mk[g][r]), cc[g][2 * r + i], c[2 * r + i]);
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) c[i] = cc[0][i] + cc[1][i];
        }
    } else if constexpr (KLD) {
        /* Groups of 32 elements or more (or one group of 8-bit keys): k-step s takes elements
         * [32 s, 32 s + 32), all in group s / KSPG, from word tc of each chunk (ldmatrix:
         * matrices (chunk 2j, tokens 0-7), (2j, 8-15), (2j + 1, 0-7), (2j + 1, 8-15)); one
         * exact integer chain per digit and group, then c = sum over groups of s_g S_g + z_g
         * sum(q over g) (one group: c = S, scaled with km below). */
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
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int x = 2 * r + i;
                    /* |c0 + 256 c1| < 2^31: 128 x 255 x 128 x 257 */
                    const float cg = EXACT32 ? (float)(cc[0][x] + 256 * cc[1][x] + 65536 * cc[2][x])
                                             : fmaf(65536.0f, (float)cc[2][x], (float)(cc[0][x] + 256 * cc[1][x]));
                    if constexpr (KG == 1) {
                        c[x] = cg;
                    } else {
                        const uint32_t mk = *reinterpret_cast<const uint32_t *>(sub + SL::META + g * 64 + (gr + 8 * r) * 4);
                        c[x] = fmaf(lo_f(mk), cg, fmaf(hi_f(mk), Q.qsum[g][i], c[x]));
                    }
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
        float *dst = lg + 8 * r * G;
        if constexpr (PRED_ST) {
            /* Predicated, not branched: a pair where G is even, else one or two singles. */
            const bool w = valid && store;
            st_logit_if(w && lg_pair, dst, l[r][0], l[r][1]);
            st_logit_if(w && !lg_pair, dst, l[r][0]);
            st_logit_if(w && !lg_pair && 2 * tc + 1 < G, dst + 1, l[r][1]);
        } else if (valid && store) {
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
