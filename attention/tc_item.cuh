/*
 * tc_item.cuh — one warp's item in the tensor-core decode kernel (run_item): the logits of its
 * tokens and its partial output, running max and sum. Part of the kernel template
 * (tc_decode.cuh); the staging layout is tc_staging.cuh's, the operand unpacking
 * tc_unpack.cuh's.
 *
 * A warp walks its item 16 tokens (a subtile) at a time, staged in shared memory by cp.async
 * two or three stages ahead (the whole warp copies the subtile's page segments in 16-byte units;
 * every sector is read once), for the G <= 8 query heads of its group, with two mma products:
 *
 *   logits: S[token][head] = K[token][:] . Q[head][:]. Quantized keys: m16n8k32 u8 x s8 with
 *           the codes as they are (8-bit) or masked into bytes (4- and 2-bit), and q scaled to
 *           integers and cut into three signed 8-bit digits (three exact s32 chains). 16-bit
 *           keys: m16n8k16 with q split into fp16 hi + lo. Then logit = scale * (s * S + z *
 *           sum(q)) per token in fp32: fp32-grade logits, so that the scores meet 1e-5.
 *   output: O^T[elem][head] += V^T[elem][token] . P^T[token][head], m16n8k16. A = quantized
 *           value codes as exact fp16 subnormals (one AND per pair of tokens: a code keeps its
 *           bit position, the factor 2^(bits * position) and 2^-24 are undone per output row),
 *           or raw fp16 values. B = the probabilities times the token's value scale in fp16,
 *           moved from the logits' accumulator layout by movmatrix.trans; the running max is
 *           raised so that these weights stay below 2^14.5. The zeros add z * sum(p) per head.
 *
 * Several quantization groups a side (template parameters KG, VG; groups_supported): keys take
 * one integer chain per group, each k-step inside one group; values carry their scale on the
 * codes instead of on the probabilities, and the zeros take a second mma (unpack_values_scaled).
 *
 * Element order inside a thread's run is permuted (the dot products do not care; q and the
 * output use the same maps). Tokens past the item's end are masked: zero codes, zero metadata
 * and a -inf logit, so that NaN-poisoned slots never reach an mma.
 */
#ifndef MKV_ATTENTION_TC_ITEM_CUH
#define MKV_ATTENTION_TC_ITEM_CUH

#include "attention/decode_tc.h"
#include "attention/tc_ptx.cuh"
#include "attention/tc_staging.cuh"
#include "attention/tc_unpack.cuh"

#include <type_traits>

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

/* One warp's item: the logits of its tokens (to the workspace), and its unnormalised partial
 * output, running max and sum (to its part slot, or fused to the warp's staging area for
 * block_merge). */
template <int KB, int VB, int D, int KG, int VG, bool FUSED, int RG>
__device__ __forceinline__ void run_item(const tc_args &a, uint8_t *smem, const item_pos &ip)
{
    using SL = stage_layout<KB, VB, D, KG, VG>;
    constexpr int NT = SL::NT, S = SL::STAGES;
    /* Subtiles per softmax step (step_subtiles), tokens per step of the compact logits. */
    constexpr int PAIR = step_subtiles<KB, VB, D, KG, VG>();
    static_assert(16 * PAIR % RG == 0, "the maxima's grid divides the step");
    /* Compact logits: the weights from the codes' y (p = y 2^(R - m)) where a step holds two or
     * more subtiles; with one (K16V16, K8V8) the second copy of the values' code that this needs
     * made K16V16 spill, and they keep p = 2^(l - m). */
    constexpr bool P_FROM_Y = PAIR >= 2;
    constexpr int KRUN = D / 4; /* key elements per thread and token */
    constexpr int VRUN = D / 8, MTILES = D / 16;
    constexpr bool KQ = SL::KQ, VQ = SL::VQ;

    const int32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tc = lane & 3;
    const int64_t rs = ip.rs, region = ip.region;
    const int32_t sec = ip.sec, ta = ip.ta, tb = ip.tb;
    const tc_section L = a.sec[sec];
    const int32_t *row = a.table + region * a.T;
    const int32_t stride = L.tpp * 16;
    const int G = a.G;
    const int32_t sec_n = ip.sec_n;

    /* q of head gr: run tc (one key group), or (KG > 1) the thread's share of each 32-element
     * k-step (elements 32 s + 4 tc and 32 s + 16 + 4 tc, four each, for 8-bit keys; 32 s + 8 tc,
     * eight, for 4-bit ones), so that a k-step lies in one group. 16-bit keys: q scaled by 2^E
     * (max |q| in [2^14, 2^15)) and split into fp16 hi + lo. Quantized keys: q scaled to
     * integers (max |q| in [2^21, 2^22)) and cut into three signed 8-bit digits,
     * q = d0 + 256 d1 + 65536 d2, in key_byte_elem order; qsum[g] = sum of q over group g. */
    constexpr int QWORDS = KQ ? KRUN / 4 : KRUN / 2; /* per hi / lo or per digit */
    constexpr int KSPG = D / 32 / KG;                /* k-steps per key group (KG > 1) */
    uint32_t qw[KQ ? 3 : 2][QWORDS];
    float fac[2], qsum[KG][2];
    {
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
        const int E = mx > 0.0f ? (KQ ? 22 : 15) - ex : 0;
        /* x 2^E as two exact multiplies by powers of two (|E| <= 252, each half within a
         * float's exponent range): ldexpf costs several instructions per element. */
        const float p2a = __int_as_float((127 + E / 2) << 23), p2b = __int_as_float((127 + E - E / 2) << 23);
        float s = 0.0f;
        int is[KG] = {};
        if constexpr (KQ) {
            int qi[KRUN];
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
                qw[0][i] = gather(0) ^ 0x80808080u;
                qw[1][i] = gather(1) ^ 0x80808080u;
                qw[2][i] = gather(2);
            }
#pragma unroll
            for (int g = 0; g < KG; g++) {
                is[g] += __shfl_xor_sync(0xffffffffu, is[g], 1);
                is[g] += __shfl_xor_sync(0xffffffffu, is[g], 2);
            }
            s = (float)is[0];
        } else {
#pragma unroll
            for (int u = 0; u < KRUN; u++) {
                qv[u] = qv[u] * p2a * p2b;
                s += qv[u];
            }
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
#pragma unroll
            for (int pp = 0; pp < QWORDS; pp++) {
                const float x = qv[2 * pp], y = qv[2 * pp + 1];
                qw[0][pp] = pack_h2(x, y);
                qw[1][pp] = pack_h2(x - lo_f(qw[0][pp]), y - hi_f(qw[0][pp]));
            }
        }
        /* Logits in log2 units: l2 = scale * log2(e) * 2^-E * (s * S + z * sum q). */
        const float f = gr < G ? ldexpf(a.softmax_scale * 1.4426950408889634f, -E) : 0.0f;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            fac[i] = __shfl_sync(0xffffffffu, f, 4 * (2 * tc + i));
            qsum[0][i] = __shfl_sync(0xffffffffu, s, 4 * (2 * tc + i));
#pragma unroll
            for (int g = 1; g < KG; g++) qsum[g][i] = __shfl_sync(0xffffffffu, (float)is[g], 4 * (2 * tc + i));
        }
    }

    float o[MTILES][4];
#pragma unroll
    for (int i = 0; i < MTILES; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}, zsum[2] = {0.0f, 0.0f};
    /* Multi-group values: the zeros' mma accumulator (row gr: group gr, heads 2tc, 2tc + 1;
     * rows gr + 8 stay 0), and the current softmax step's shift k (value scales times 2^-k on
     * the codes, p' times 2^k on B). */
    float zacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int vshift = 0;
    /* This thread's logits of the next subtile: token gr, heads 2tc and 2tc + 1 (token gr + 8 is
     * 8 G further on); lanes 2tc >= G store none. */
    const int64_t lin = (rs * (a.sec_items + 1) + ip.slot_id) * a.item_tokens;
    const bool lg_lane = 2 * tc < G, lg_pair = G % 2 == 0;
    /* Compact logits (tc_args): lg is then the lane's word of lg_a (token gr, pair tc),
     * advanced once per softmax step, after its stores. */
    const bool compact = FUSED && a.compact;
    float *lg = compact ? reinterpret_cast<float *>(a.lg_a + tc * a.lg_n + lin + gr) : a.logits + (lin + gr) * G + 2 * tc;

    /* The warp's staging area: [stage][subtile][BYTES_PER_SUBTILE]. */
    const uint32_t warp_smem = (uint32_t)__cvta_generic_to_shared(smem) + warp * SL::WARP_BYTES;
    const uint8_t *warp_gen = smem + warp * SL::WARP_BYTES;
    /* The copy: lane (tl, half) moves token tl's units of chunks 2k + half (keys, then values)
     * and, where the format has them, its key (half 0) or value (half 1) metadata. Offsets are
     * 32-bit: the tensor-core path takes pages under 2 GiB. */
    const int32_t tl = lane & 15, half = lane >> 4;
    const int32_t koff = (int32_t)L.off_key, voff = (int32_t)L.off_value;
    const int32_t moff = half ? (int32_t)L.off_value_meta : (int32_t)L.off_key_meta;
    const bool meta_lane = half ? VQ : KQ;

    walker P = {ta, ta / L.tpp, ta % L.tpp}; /* producer: what to load next */
    walker C = P;                            /* consumer: what to compute next */
    int32_t cur_pidx = -1;
    const uint8_t *page = a.pool;
    /* Page ids 32 at a time: lane i holds the id of page win + i of the section (one load per
     * 32 pages, then a shuffle per page, instead of a dependent load per page). */
    const int32_t sec_pages = (sec_n + L.tpp - 1) / L.tpp;
    int32_t win = INT32_MIN / 2, win_id = -1;

    /* page = the producer's current page (P.pidx). Warp-uniform. */
    auto find_page = [&]() {
        if (P.pidx == cur_pidx) return;
        cur_pidx = P.pidx;
        if ((uint32_t)(cur_pidx - win) >= 32u) {
            win = cur_pidx;
            const int32_t e = win + lane;
            win_id = e < sec_pages ? __ldg(row + (sec ? a.T - 1 - e : e)) : 0;
        }
        const int32_t pid = __shfl_sync(0xffffffffu, win_id, cur_pidx - win);
        // NOTE: int32 page id, widen before the multiply (pools exceed 2 GiB).
        page = a.pool + (int64_t)pid * a.page_bytes;
    };

    /* Issues the cp.async of one stage (NT subtiles) and commits it (possibly empty). */
    auto produce = [&](int32_t stage) {
        if constexpr (SL::WHOLE) {
            /* Runs: up to 32 tokens, to the end of the page, of the item or of the stage's
             * subtiles, whichever comes first; a run of len tokens fills the next ceil(len / 16)
             * subtiles (16 tokens of one page each, as the consumer walks them). Lane i copies
             * run token i whole: its chunks and its key and value metadata, from one page address
             * (the lanes' copies per subtile, two chunks each, had spent most of their
             * instructions on addresses). Each copy's address is formed inside its asm: computed
             * up front, the eight made K4V2's kernel spill. */
            int32_t u0 = 0; /* the run's first subtile */
#pragma unroll
            for (int run = 0; run < NT; run++) { /* a stage holds at most NT runs */
                if (u0 >= NT) break;
                const int32_t len = min(min(tb - P.t, L.tpp - P.slot), min(NT - u0, 2) * 16);
                if (len <= 0) break; /* warp-uniform: nothing left to load */
                find_page();
                /* Tokens past the run's end in its last subtile copy nothing (source size 0,
                 * zeros written) from an in-page address: the run's first slot. */
                if (lane < ((len + 15) & ~15)) {
                    const bool ok = lane < len;
                    const int32_t slot = P.slot + (ok ? lane : 0);
                    const uint8_t *tok = page + slot * 16;
                    const uint32_t dst = warp_smem + (stage * NT + u0 + (lane >> 4)) * SL::BYTES_PER_SUBTILE;
#pragma unroll
                    for (int c = 0; c < SL::KC; c++)
                        cp_async_page_at<FUSED>(dst + SL::key_at(c, tl), tok, koff + c * stride, ok);
#pragma unroll
                    for (int c = 0; c < SL::VC; c++)
                        cp_async_page_at<FUSED>(dst + SL::value_at(c, tl), tok, voff + c * stride, ok);
#pragma unroll
                    for (int g = 0; g < KG; g++)
                        cp_async_page<4, FUSED>(dst + SL::META + g * 64 + tl * 4,
                                                page + ((int32_t)L.off_key_meta + (g * L.tpp + slot) * 4), ok);
#pragma unroll
                    for (int g = 0; g < VG; g++)
                        cp_async_page<4, FUSED>(dst + SL::VMETA + g * 64 + tl * 4,
                                                page + ((int32_t)L.off_value_meta + (g * L.tpp + slot) * 4), ok);
                }
                P.advance(len, L.tpp);
                u0 += (len + 15) >> 4;
            }
        } else {
#pragma unroll
            for (int st = 0; st < NT; st++) {
                const int32_t cnt = P.count(tb, L.tpp);
                if (cnt == 0) break; /* warp-uniform: nothing left to load */
                find_page();
                const uint32_t dst = warp_smem + (stage * NT + st) * SL::BYTES_PER_SUBTILE;
                /* Tokens past the subtile's end copy nothing (source size 0, zeros written) from an
                 * in-page address: the subtile's first slot. */
                const bool ok = tl < cnt;
                const int32_t slot = P.slot + (ok ? tl : 0);
                const uint8_t *tok = page + slot * 16;
#pragma unroll
                for (int k = 0; k < SL::ROUNDS; k++) {
                    const int32_t c = 2 * k + half;
                    if (2 * k + 1 < SL::KC || (2 * k < SL::KC && half == 0)) {
                        cp_async_page<16, FUSED>(dst + SL::key_at(c, tl), tok + (koff + c * stride), ok);
                    } else if (c - SL::KC < SL::VC) {
                        const int32_t cv = c - SL::KC;
                        cp_async_page<16, FUSED>(dst + SL::value_at(cv, tl), tok + (voff + cv * stride), ok);
                    }
                }
                if constexpr (KQ || VQ)
                    if (meta_lane) {
                        /* half 0: the key groups, half 1: the value groups */
                        const uint32_t mdst = dst + (half ? SL::VMETA : SL::META) + tl * 4;
#pragma unroll
                        for (int g = 0; g < (KG > VG ? KG : VG); g++)
                            if (g < (half ? VG : KG))
                                cp_async_page<4, FUSED>(mdst + g * 64, page + (moff + (g * L.tpp + slot) * 4), ok);
                    }
                P.advance(cnt, L.tpp);
            }
        }
        cp_async_commit();
    };

    const auto key_at = [](int c, int t) { return SL::key_at(c, t); };
    const auto value_at = [](int c, int t) { return SL::value_at(c, t); };

    /* The logits l[r][i] of a staged subtile's tokens gr + 8r (rows) for heads 2tc + i
     * (columns), -inf past its cnt tokens, stored to the workspace; its value metadata vm. */
    auto subtile_logits = [&](const uint8_t *sub, int32_t cnt, float (&l)[2][2], uint32_t (&vm)[2]) {
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
        if constexpr (KQ && KG > 1) {
            /* Groups of 32 elements or more: k-step s takes elements [32 s, 32 s + 32), all in
             * group s / KSPG, from word tc of each chunk (ldmatrix: matrices (chunk 2j, tokens
             * 0-7), (2j, 8-15), (2j + 1, 0-7), (2j + 1, 8-15)); one exact integer chain per digit
             * and group, then c = sum over groups of s_g S_g + z_g sum(q over g). */
            constexpr int NCALL = SL::KC / 2;
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
                    for (int dg = 0; dg < 3; dg++) mma_u8s8(cc[dg], a0, a1, a2, a3, qw[dg][2 * ks], qw[dg][2 * ks + 1]);
                }
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const uint32_t mk = *reinterpret_cast<const uint32_t *>(sub + SL::META + g * 64 + (gr + 8 * r) * 4);
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const int x = 2 * r + i;
                        const float cg = fmaf(65536.0f, (float)cc[2][x], (float)(cc[0][x] + 256 * cc[1][x]));
                        c[x] = fmaf(lo_f(mk), cg, fmaf(hi_f(mk), qsum[g][i], c[x]));
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
                             qw[dg][2 * ks], qw[dg][2 * ks + 1]);
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
                    qw[0][2 * ks], qw[0][2 * ks + 1]);
                mma(cc[2 + ks % 2], kw0[2 * ks], kw1[2 * ks], kw0[2 * ks + 1], kw1[2 * ks + 1],
                    qw[1][2 * ks], qw[1][2 * ks + 1]);
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
                if constexpr (KQ && KG == 1) raw = fmaf(lo_f(km[r]), raw, hi_f(km[r]) * qsum[0][i]);
                l[r][i] = valid ? fac[i] * raw : -INFINITY;
            }
            if (valid && lg_lane && !compact) {
                float *dst = lg + 8 * r * G;
                if (lg_pair) {
                    st_logit(dst, l[r][0], l[r][1], policy_evict_last());
                } else {
                    st_logit(dst, l[r][0], policy_evict_last());
                    if (2 * tc + 1 < G) st_logit(dst + 1, l[r][1], policy_evict_last());
                }
            }
        }
    };

    /* The weights p' = 2^(l - m) of a subtile's tokens (after the softmax step) into lsum, zsum
     * and, through the values' mma, o. ready (std::true_type or false_type): whether l holds
     * them already (compact logits: p = y 2^(R - m)), or the logits. */
    auto subtile_values = [&](auto ready, const uint8_t *sub, const float (&l)[2][2], const uint32_t (&vm)[2]) {
        uint32_t pw[2];
        float p[2][2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                if constexpr (decltype(ready)::value) p[r][i] = l[r][i];
                else p[r][i] = ex2(l[r][i] - m[i]);
                lsum[i] += p[r][i];
                if constexpr (VQ && VG == 1) zsum[i] = fmaf(p[r][i], hi_f(vm[r]), zsum[i]);
            }
            if constexpr (VQ && VG > 1) {
                /* Multi-group values: the scale rides on the codes, p' 2^k on B. */
                const float e2k = __int_as_float((127 + vshift) << 23);
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
            const uint32_t hk = h2_pow2_neg(vshift);
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
            mma(zacc, hmul2(z01, hk), 0u, hmul2(z23, hk), 0u, b0, b1);
            unpack_values_scaled<VB>(vw[0], vw[1], hmul2(__byte_perm(m01.x, m01.y, 0x5410), hk), v01);
            unpack_values_scaled<VB>(vw[2], vw[3], hmul2(__byte_perm(m23.x, m23.y, 0x5410), hk), v23);
        } else {
            unpack_values<VB>(vw[0], vw[1], v01);
            unpack_values<VB>(vw[2], vw[3], v23);
        }
#pragma unroll
        for (int t = 0; t < MTILES; t++)
            mma(o[t], v01[2 * t], v01[2 * t + 1], v23[2 * t], v23[2 * t + 1], b0, b1);
    };

#pragma unroll
    for (int s = 0; s < S - 1; s++) produce(s);

    int32_t ps = S - 1, cs = 0; /* the stages being filled and computed */
    while (C.t < tb) {
        /* Lanes read each other's copies: every lane is done with the stage refilled next
         * (read in the previous round) before any lane copies into it, and every lane's copies
         * of stage cs have landed before any lane reads them. */
        __syncwarp();
        produce(ps);
        ps = ps + 1 == S ? 0 : ps + 1;
        cp_async_wait<S - 1>(); /* this lane's copies of stage cs have landed */
        __syncwarp();
        const uint8_t *stage = warp_gen + cs * NT * SL::BYTES_PER_SUBTILE;
        cs = cs + 1 == S ? 0 : cs + 1;
#pragma unroll
        for (int st = 0; st < NT; st += PAIR) {
            /* Logits of PAIR subtiles (one softmax step for all of them). */
            int32_t cnt[PAIR];
            float l[PAIR][2][2];
            uint32_t vm[PAIR][2];
#pragma unroll
            for (int u = 0; u < PAIR; u++) {
                cnt[u] = C.count(tb, L.tpp);
                C.advance(cnt[u], L.tpp);
                if (u == 0 && cnt[0] == 0) break; /* warp-uniform: the item is done */
                if (cnt[u] == 0) { /* an empty second subtile: nothing staged to read */
                    l[u][0][0] = l[u][0][1] = l[u][1][0] = l[u][1][1] = -INFINITY;
                    vm[u][0] = vm[u][1] = 0u;
                    continue;
                }
                subtile_logits(stage + (st + u) * SL::BYTES_PER_SUBTILE, cnt[u], l[u], vm[u]);
                if (!compact) lg += cnt[u] * G;
            }
            if (cnt[0] == 0) break;
            /* Online softmax per head (columns 2tc, 2tc + 1: a reduction over gr). Quantized
             * values: the running maximum m is raised by sh = log2(max scale) - 14.5, so that
             * p' = 2^(l - m) times the token's value scale stays below 2^14.5 in fp16 (o, lsum,
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
                vshift = max(0, (__float_as_int(ms) >> 23) - 127 - 4);
                sh = (float)vshift - 14.5f;
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
            float alpha[2], mxr[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float mx = fmaxf(l[0][0][i], l[0][1][i]);
#pragma unroll
                for (int u = 1; u < PAIR; u++) mx = fmaxf(mx, fmaxf(l[u][0][i], l[u][1][i]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                mxr[i] = mx;
                const float mn = fmaxf(m[i], mx + sh);
                alpha[i] = ex2(m[i] - mn);
                m[i] = mn;
            }
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    lsum[i] *= alpha[i];
                    zsum[i] *= alpha[i];
                    zacc[i] *= alpha[i];
#pragma unroll
                    for (int t = 0; t < MTILES; t++) o[t][i] *= alpha[i], o[t][2 + i] *= alpha[i];
                }
            }
            /* Compact logits: the step's maximum R per head (lanes gr = 0) and each token's
             * y = 2^(l - R), heads 2tc and 2tc + 1 as a word of the codes' low halves and a byte
             * of their high nibbles; where P_FROM_Y, the token's weight p = y 2^(R - m) replaces
             * its logit (a multiply instead of a second ex2; subtile_values takes it as it is).
             * Subtile u's tokens start 16 u on (all subtiles of a step but the item's last are
             * 16 tokens). Pair-major arrays: the offsets are immediates. */
            if (compact) {
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
                const float e0 = P_FROM_Y ? ex2(mxr[0] - m[0]) : 0.0f, e1 = P_FROM_Y ? ex2(mxr[1] - m[1]) : 0.0f;
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
            if (P_FROM_Y && compact) {
#pragma unroll
                for (int u = 0; u < PAIR; u++) {
                    if (u > 0 && cnt[u] == 0) break;
                    subtile_values(std::true_type(), stage + (st + u) * SL::BYTES_PER_SUBTILE, l[u], vm[u]);
                }
            } else {
#pragma unroll
                for (int u = 0; u < PAIR; u++) {
                    if (u > 0 && cnt[u] == 0) break;
                    subtile_values(std::false_type(), stage + (st + u) * SL::BYTES_PER_SUBTILE, l[u], vm[u]);
                }
            }
        }
    }
    cp_async_wait<0>();

    /* The item's partial result: sums over the rows (gr), then per head O + z * sum(p'), where
     * one-group quantized values first give back their 2^-24 and factor f(u); multi-group ones
     * add their group's row of the zeros' product (group gv's, held by lane (gv, tc)). */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) {
            lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], x);
            if constexpr (VG == 1) zsum[i] += __shfl_xor_sync(0xffffffffu, zsum[i], x);
        }
    if constexpr (VQ && VG > 1) {
#pragma unroll
        for (int i = 0; i < 2; i++) zsum[i] = __shfl_sync(0xffffffffu, zacc[i], (gr * VG / 8) * 4 + tc);
    }
    /* Separate pass: to the item's part slot. Fused: into the warp's staging area, idle now
     * (every copy has landed and every lane has read its last stage), o as [G][D] then (max,
     * sum) per head, for block_merge (one part per block: the region's last block merges a
     * quarter of the parts, which shortened the fused calls' tail; the separate launches of
     * two-format calls measured slower with it). */
    __syncwarp();
    static_assert(SL::WARP_BYTES >= MKV_TC_MAX_G * (D + 2) * 4, "a warp's area holds its partial result");
    float *const po_s = FUSED ? reinterpret_cast<float *>(smem + warp * SL::WARP_BYTES)
                              : a.part_o + (rs * 2 * a.sec_items + ip.slot_id) * G * D;
    float *const pml = FUSED ? po_s + G * D : a.part_ml + (rs * 2 * a.sec_items + ip.slot_id) * G * 2;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int32_t h = 2 * tc + i;
        if (h >= G) continue;
        float *po = po_s + h * D + gr * VRUN;
#pragma unroll
        for (int t = 0; t < MTILES; t++) {
            float2 r = make_float2(o[t][i], o[t][2 + i]);
            if constexpr (VQ && VG > 1) {
                r.x += zsum[i];
                r.y += zsum[i];
            } else if constexpr (VQ) {
                r.x = fmaf(r.x, 16777216.0f / value_factor<VB>(2 * t), zsum[i]);
                r.y = fmaf(r.y, 16777216.0f / value_factor<VB>(2 * t + 1), zsum[i]);
            }
            *reinterpret_cast<float2 *>(po + 2 * t) = r;
        }
        if (gr == 0) *reinterpret_cast<float2 *>(pml + 2 * h) = make_float2(m[i], lsum[i]);
    }
}

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_ITEM_CUH */
