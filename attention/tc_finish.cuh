/*
 * tc_finish.cuh — the fused tensor-core decode kernel's region finish: a region's final max,
 * sum and log-sum-exp (region_ms), the merge of its items into out by its last block, and the
 * score write-back jobs, fp32 or compact logits (region_finish), all staged through the block's
 * idle staging area. The job queue that hands these out is decode_kernel's (tc_decode.cuh).
 */
#ifndef MKV_ATTENTION_TC_FINISH_CUH
#define MKV_ATTENTION_TC_FINISH_CUH

#include "attention/decode_tc.h"
#include "attention/tc_merge.cuh"
#include "attention/tc_ptx.cuh"
#include "attention/tc_staging.cuh"
#include "attention/tc_trace.cuh"

#include <type_traits>

#include <stdint.h>

namespace mkv_tc {

/* The final M, S and lse of every head of the region into bs from its n_parts part slots (a
 * block's items each; warp w takes heads w, w + MKV_TC_WARPS); block-wide, ends with a
 * barrier. */
__device__ __forceinline__ void region_ms(const tc_args &a, int64_t rs, int32_t n_parts, block_shared &bs)
{
    const int32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t part = rs * 2 * a.sec_items;
    for (int32_t g = warp; g < a.G; g += MKV_TC_WARPS) {
        const float2 ms = head_ms<false>(a, part, n_parts, g);
        if (lane == 0) bs.M[g] = ms.x, bs.S[g] = ms.y, bs.lse[g] = ms.x + log2f(ms.y);
    }
    __syncthreads();
}

/* The fused kernel's merge (by a region's last block) and score jobs, through the block's
 * staging area, idle between items: data come in chunks by cp.async, a whole chunk in flight
 * at once without holding registers (loads into registers raise the whole kernel's register
 * count: ptxas sizes it for the worst path, and the decode loop would lose occupancy). */
template <int D, int AREA_>
struct region_finish {
    static constexpr int32_t NTH = MKV_TC_WARPS * 32;
    static constexpr int32_t AREA = AREA_; /* the block's staging area */
    static constexpr int32_t IDS = 128;                      /* page ids per score chunk */
    static constexpr int32_t HALF = AREA / 2 - IDS * 4;      /* logits per score chunk */
    static constexpr int32_t E4 = (MKV_TC_MAX_G * D / 4 + NTH - 1) / NTH; /* float4 outputs per thread */
    static_assert(HALF >= 4096, "room for a chunk of logits");

    /* The score jobs' double-buffered loop over n_chunks chunks: issue(c, at) starts chunk c's
     * copies into the buffer at shared address at (and commits them); use(c, buf) scores it
     * from buf once every copy has landed. */
    template <typename Issue, typename Use>
    static __device__ __forceinline__ void chunks(uint8_t *smem, int32_t n_chunks, Issue issue, Use use)
    {
        const uint32_t base_s = (uint32_t)__cvta_generic_to_shared(smem);
        issue(0, base_s);
        for (int32_t c = 0; c < n_chunks; c++) {
            if (c + 1 < n_chunks) {
                issue(c + 1, base_s + ((c + 1) & 1) * (AREA / 2));
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            use(c, smem + (c & 1) * (AREA / 2));
            __syncthreads(); /* the chunk after next reuses this buffer */
        }
    }

    /* The page ids of a section's tokens [k0, k1) into the buffer at shared address at. */
    static __device__ __forceinline__ void issue_ids(uint32_t at, const section_tokens &s, int32_t k0, int32_t k1)
    {
        const int32_t p0 = k0 / s.tpp, np = (k1 - 1) / s.tpp - p0 + 1;
        for (int32_t i = threadIdx.x; i < np; i += NTH)
            cp_async<4>(at + i * 4, s.row + (int64_t)(p0 + i) * s.step, true);
        cp_async_commit();
    }

    /* Adds the probabilities p of a section's tokens k to k + 3 (those below k1; k a multiple of
     * 4) to their score slots: one 16-byte reduction where v4 (score_v4) and all four count,
     * else one per token. ids: the chunk's page ids, from the page of its first token k0, which
     * lies s0 slots into it; token k sits rel = k - k0 + s0 slots past that page's start, and
     * rel < 2^22 (a chunk and a page) makes floor((rel + 1/2) / tpp) exact in fp32 without a
     * correction: its distance to an integer, at least 1/(2 tpp), exceeds the rounding. */
    static __device__ __forceinline__ void add_four(const section_tokens &s, const int32_t *ids, int32_t rel,
                                                    float inv_tpp, bool v4, int32_t k, int32_t k1,
                                                    const float (&p)[4])
    {
        const auto slot_of = [&](int32_t x) {
            /* chunks hold at most 2^13 tokens, so rel < 2^21 where tpp < 2^20 */
            const int32_t q = s.tpp < (1 << 20) ? __float2int_rz(((float)x + 0.5f) * inv_tpp) : x / s.tpp;
            return score_slot(s, ids[q], x - q * s.tpp);
        };
        if (v4 && k + 4 <= k1) {
            red_add4(slot_of(rel), p[0], p[1], p[2], p[3]);
            return;
        }
#pragma unroll
        for (int t = 0; t < 4; t++) {
            if (k + t >= k1) break;
            red_add(slot_of(rel + t), p[t]);
        }
    }

    /* out's float4s [lo4, lo4 + n4) of the region (all G D / 4 of them, or a slice: the
     * region's merge split between blocks, tc_args::merge_split) = the parts' partial outputs
     * (a part per block of the region: g.arrivals) at those float4s, each weighted by
     * 2^(m - M) / S: chunks of whole parts (their slices, then max and sum of every head),
     * weights computed once per part and head; the first chunk's copies issued by
     * merge_first. */
    /* Parts per chunk of merge, and the copies of parts [s0, s0 + cnt) into the area. */
    static __device__ __forceinline__ int32_t merge_chunk(const tc_args &a, int32_t n4)
    {
        return AREA / (n4 * 16 + a.G * 12); /* outputs, max and sum, weight */
    }
    static __device__ __forceinline__ void merge_issue(const tc_args &a, uint8_t *smem, const region_info &g,
                                                       int32_t s0, int32_t cnt, int32_t lo4, int32_t n4)
    {
        const int32_t tid = threadIdx.x, G = a.G, GD = G * D, GD4 = GD / 4;
        const uint32_t po_s = (uint32_t)__cvta_generic_to_shared(smem);
        const uint32_t ml_s = po_s + cnt * n4 * 16;
        const int64_t part = g.rs * 2 * a.sec_items;
        const uint8_t *src_o = reinterpret_cast<const uint8_t *>(a.part_o + (part + s0) * GD);
        const uint8_t *src_ml = reinterpret_cast<const uint8_t *>(a.part_ml + (part + s0) * G * 2);
        if (n4 == GD4) { /* whole parts: one run */
            for (int32_t off = tid * 16; off < cnt * GD * 4; off += NTH * 16)
                cp_async<16>(po_s + off, src_o + off, true);
        } else {
            for (int32_t i = tid; i < cnt * n4; i += NTH) {
                const int32_t s = i / n4;
                cp_async<16>(po_s + i * 16, src_o + (int64_t)(s * GD4 + lo4 + i - s * n4) * 16, true);
            }
        }
        for (int32_t off = tid * 8; off < cnt * G * 8; off += NTH * 8)
            cp_async<8>(ml_s + off, src_ml + off, true);
        cp_async_commit();
    }

    /* merge_first: its first chunk's copies (merge_issue), on their way while the caller finds
     * M and S (region_ms). */
    static __device__ __forceinline__ void merge_first(const tc_args &a, uint8_t *smem, const region_info &g,
                                                       int32_t lo4, int32_t n4)
    {
        merge_issue(a, smem, g, 0, min(merge_chunk(a, n4), g.arrivals), lo4, n4);
    }

    /* Where the slice is narrower than the block (n4 < NTH), its parts are shared between
     * NTH / n4 groups of n4 threads (group q the chunk's parts q, q + groups, ...), their sums
     * added in group order after the last chunk: short chains where a slice has few float4s. */
    static __device__ __forceinline__ void merge(const tc_args &a, uint8_t *smem, const region_info &g,
                                                 const float *M, const float *S, int32_t lo4, int32_t n4)
    {
        const int32_t tid = threadIdx.x, G = a.G;
        const int32_t c = merge_chunk(a, n4);
        const int32_t span = min(n4, NTH), groups = NTH / span, grp = tid / span;
        float *po = reinterpret_cast<float *>(smem);
        /* Thread t's outputs: float4s t % span + j span, each part's weighted in order (fma
         * chains of the four components side by side, the parts' loads unrolled ahead of
         * them). */
        float4 o[E4];
#pragma unroll
        for (int j = 0; j < E4; j++) o[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int32_t s0 = 0; s0 < g.arrivals; s0 += c) {
            const int32_t cnt = min(c, g.arrivals - s0);
            float *ml = po + cnt * n4 * 4, *w = ml + cnt * G * 2;
            if (s0 > 0) merge_issue(a, smem, g, s0, cnt, lo4, n4); /* the first chunk's: merge_first */
            cp_async_wait<0>();
            __syncthreads();
            if (tid == 0 && s0 == 0) trace_stamp(a, TR_LANDED, cnt);
            for (int32_t i = tid; i < cnt * G; i += NTH) w[i] = exp2f(ml[2 * i] - M[i % G]);
            __syncthreads();
#pragma unroll
            for (int j = 0; j < E4; j++) {
                const int32_t e4 = tid - grp * span + j * span;
                if (e4 >= n4 || grp >= groups) break;
                const int32_t h = 4 * (lo4 + e4) / D;
                const float4 *p4 = reinterpret_cast<const float4 *>(po) + e4;
                float4 acc = o[j];
#pragma unroll 4
                for (int32_t s = grp; s < cnt; s += groups) {
                    const float4 x = p4[s * n4];
                    const float f = w[s * G + h];
                    acc.x = fmaf(x.x, f, acc.x), acc.y = fmaf(x.y, f, acc.y);
                    acc.z = fmaf(x.z, f, acc.z), acc.w = fmaf(x.w, f, acc.w);
                }
                o[j] = acc;
            }
            __syncthreads(); /* the next chunk reuses the area */
        }
        if (groups > 1) { /* (n4 < NTH: one float4 a thread) */
            float4 *red = reinterpret_cast<float4 *>(smem);
            if (grp < groups && grp > 0) red[(grp - 1) * span + tid - grp * span] = o[0];
            __syncthreads();
            if (grp == 0)
                for (int32_t q = 1; q < groups; q++) {
                    const float4 x = red[(q - 1) * span + tid];
                    o[0].x += x.x, o[0].y += x.y, o[0].z += x.z, o[0].w += x.w;
                }
            if (grp > 0) return;
        }
#pragma unroll
        for (int j = 0; j < E4; j++) {
            const int32_t e4 = tid + j * span;
            if (e4 >= n4) break;
            const float sum = S[4 * (lo4 + e4) / D];
            const float r[4] = {o[j].x / sum, o[j].y / sum, o[j].z / sum, o[j].w / sum};
            const int64_t at = g.rs * G * D + 4 * (lo4 + e4);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (a.out16) a.out16[at + k] = a.out_bf16 ? mkv_f32_to_bf16(r[k]) : mkv_f32_to_f16(r[k]);
                else a.out[at + k] = r[k];
            }
        }
    }

    /* The score write-back of tokens [t0, t1) of section s (t0 a multiple of 64): every token's
     * probability, the maximum over the group of 2^(l - lse_g), added to its score slot, from
     * the logits; then (discard) the logits dropped from L2. Two buffers: the next chunk's
     * logits and page ids are on their way while this one is scored. */
    static __device__ __forceinline__ void scores(const tc_args &a, uint8_t *smem, const section_tokens &s,
                                                  int32_t t0, int32_t t1, const float *lse)
    {
        const int32_t tid = threadIdx.x, G = a.G;
        if (t1 <= t0) return;
        /* Tokens per chunk: a multiple of 4 (16-byte aligned starts), its pages within IDS;
         * whole rounds of the block's four tokens per thread where that leaves one. */
        int32_t chunk = min(HALF / (G * 4), (IDS - 2) * s.tpp) & ~3;
        if (chunk >= 4 * NTH) chunk -= chunk % (4 * NTH);
        const float inv_tpp = 1.0f / (float)s.tpp;
        const uint8_t *lg = reinterpret_cast<const uint8_t *>(s.lg);
        const int32_t n_chunks = (t1 - t0 + chunk - 1) / chunk;
        /* Buffer b: page ids at b * (AREA / 2), logits IDS * 4 bytes on. */
        auto issue = [&](int32_t c, uint32_t at) {
            const int32_t k0 = t0 + c * chunk, k1 = min(k0 + chunk, t1);
            /* Whole 16-byte units: the item rows are padded to 256 bytes. */
            const int32_t bytes = ((k1 - k0) * G * 4 + 15) & ~15;
            for (int32_t off = tid * 16; off < bytes; off += NTH * 16)
                cp_async<16>(at + IDS * 4 + off, lg + (int64_t)k0 * G * 4 + off, true);
            issue_ids(at, s, k0, k1);
        };
        const bool v4 = score_v4(s);
        chunks(smem, n_chunks, issue, [&](int32_t c, const uint8_t *at) {
            const int32_t *ids = reinterpret_cast<const int32_t *>(at);
            const float *buf = reinterpret_cast<const float *>(at + IDS * 4);
            const int32_t k0 = t0 + c * chunk, k1 = min(k0 + chunk, t1), s0 = k0 % s.tpp;
            /* Four tokens per thread (the chunk holds whole fours: a past-the-end token's
             * probability is computed and dropped). */
            for (int32_t k = k0 + 4 * tid; k < k1; k += 4 * NTH) {
                float p[4];
#pragma unroll
                for (int t = 0; t < 4; t++) p[t] = token_prob(buf + (k + t - k0) * G, G, lse);
                add_four(s, ids, k - k0 + s0, inv_tpp, v4, k, k1, p);
            }
        });
        if (a.discard) { /* the rows from t0 start 128-byte aligned */
            const int32_t l0 = t0 * G * 4 / 128, l1 = (t1 * G * 4 + 127) / 128;
            for (int32_t i = l0 + tid; i < l1; i += NTH) discard_line(lg + (int64_t)i * 128);
        }
    }

    /* scores for compact logits (a.compact): per chunk, each pair's run of codes, of low nibbles
     * and of step maxima (pair-major in the workspace, so G2 runs of each); a token's
     * probability is the maximum over the group of y 2^(R - lse_g), R its 16-token slot's
     * (MKV_TC_R_GRID). */
    static __device__ __forceinline__ void scores_compact(const tc_args &a, uint8_t *smem, const section_tokens &s,
                                                          int32_t t0, int32_t t1, const float *lse)
    {
        constexpr int32_t RG = MKV_TC_R_GRID;
        const int32_t tid = threadIdx.x, G = a.G, G2 = (G + 1) / 2;
        if (t1 <= t0) return;
        /* Tokens per chunk: a multiple of 64 (16-byte aligned runs), its pages within IDS. Per
         * 64 tokens: G2 x (256 bytes of codes, 64 of nibbles, 512 / RG of maxima). */
        const int32_t per64 = G2 * (320 + 512 / RG);
        const int32_t chunk = min(HALF / per64 * 64, (IDS - 2) * s.tpp) & ~63;
        const int32_t n_chunks = (t1 - t0 + chunk - 1) / chunk;
        const int64_t n = a.lg_n;
        /* Buffer b at b * (AREA / 2): page ids, then codes [G2][chunk], nibbles [G2][chunk],
         * maxima [G2][chunk / RG][2]. */
        const int32_t o_b = IDS * 4 + G2 * chunk * 4, o_r = o_b + G2 * chunk;
        auto issue = [&](int32_t c, uint32_t at) {
            const int32_t k0 = t0 + c * chunk, k1 = min(k0 + chunk, t1), nk = k1 - k0;
            const int64_t x0 = s.lin0 + k0;
            const int32_t ba = (nk * 4 + 15) & ~15, bb = (nk + 15) & ~15, ns = (nk + RG - 1) / RG;
            for (int32_t j = 0; j < G2; j++) {
                const uint8_t *ga = reinterpret_cast<const uint8_t *>(a.lg_a + j * n + x0);
                const uint8_t *gb = a.lg_b + j * n + x0;
                const uint8_t *gr_ = reinterpret_cast<const uint8_t *>(a.lg_r + (j * n + x0) / RG * 2);
                for (int32_t off = tid * 16; off < ba; off += NTH * 16)
                    cp_async<16>(at + IDS * 4 + j * chunk * 4 + off, ga + off, true);
                for (int32_t off = tid * 16; off < bb; off += NTH * 16)
                    cp_async<16>(at + o_b + j * chunk + off, gb + off, true);
                for (int32_t i = tid; i < ns; i += NTH)
                    cp_async<8>(at + o_r + (j * (chunk / RG) + i) * 8, gr_ + i * 8, true);
            }
            issue_ids(at, s, k0, k1);
        };
        const float inv_tpp = 1.0f / (float)s.tpp;
        const bool v4 = score_v4(s);
        /* The scoring of a chunk for G2 = PAIRS (a constant: the pair loop unrolled). */
        const auto score_chunk = [&](auto pairs, int32_t c, uint8_t *at) {
            constexpr int32_t PAIRS = decltype(pairs)::value;
            const int32_t *ids = reinterpret_cast<const int32_t *>(at);
            const uint8_t *ca = at + IDS * 4, *cb = at + o_b;
            float *cr = reinterpret_cast<float *>(at + o_r);
            const int32_t k0 = t0 + c * chunk, k1 = min(k0 + chunk, t1), s0 = k0 % s.tpp;
            /* Each step maximum R becomes its codes' factor 2^(R - lse_g) / MKV_TC_YSCALE, in
             * place (0 for the missing head of an odd G's last pair). */
            const int32_t spc = chunk / RG, nr = 2 * PAIRS * spc;
            for (int32_t i = tid; i < nr; i += NTH) {
                const int32_t h = 2 * (i / (2 * spc)) + (i & 1);
                cr[i] = h < G ? ex2(cr[i] - lse[h]) * (1.0f / MKV_TC_YSCALE) : 0.0f;
            }
            __syncthreads();
            /* Four tokens per thread (one 16-token slot: chunks start at multiples of 64): 16
             * bytes of codes and 4 of nibbles per pair, and one 16-byte reduction where the four
             * share a page (add_four). */
            for (int32_t k = k0 + 4 * tid; k < k1; k += 4 * NTH) {
                const int32_t i = k - k0;
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int32_t j = 0; j < PAIRS; j++) {
                    const uint4 w4 = *reinterpret_cast<const uint4 *>(ca + (j * chunk + i) * 4);
                    const uint32_t b = *reinterpret_cast<const uint32_t *>(cb + j * chunk + i);
                    const float2 f = *reinterpret_cast<const float2 *>(cr + (j * spc + i / RG) * 2);
                    const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
                    for (int t = 0; t < 4; t++) {
                        const uint32_t bt = b >> (8 * t);
                        const uint32_t c0 = (w[t] & 0xFFFFu) | ((bt & 0xFu) << 16);
                        const uint32_t c1 = (w[t] >> 16) | ((bt & 0xF0u) << 12);
                        /* f.y is 0 for a missing head: its code (whatever it is) adds nothing */
                        p[t] = fmaxf(p[t], fmaxf((float)c0 * f.x, (float)c1 * f.y));
                    }
                }
                add_four(s, ids, i + s0, inv_tpp, v4, k, k1, p);
            }
        };
        chunks(smem, n_chunks, issue, [&](int32_t c, uint8_t *at) {
            switch (G2) { /* G <= MKV_TC_MAX_G = 8 */
            case 1: score_chunk(std::integral_constant<int32_t, 1>(), c, at); break;
            case 2: score_chunk(std::integral_constant<int32_t, 2>(), c, at); break;
            case 3: score_chunk(std::integral_constant<int32_t, 3>(), c, at); break;
            default: score_chunk(std::integral_constant<int32_t, 4>(), c, at); break;
            }
        });
        if (a.discard) { /* whole 128-byte lines of [t0, t1) only: the rest may be others' */
            auto drop = [&](const void *base, int64_t b0, int64_t b1) {
                const uint8_t *p = static_cast<const uint8_t *>(base);
                for (int64_t i = (b0 + 127) / 128 + tid; i < b1 / 128; i += NTH) discard_line(p + i * 128);
            };
            for (int32_t j = 0; j < G2; j++) {
                const int64_t x0 = j * n + s.lin0 + t0, x1 = j * n + s.lin0 + t1;
                drop(a.lg_a, x0 * 4, x1 * 4);
                drop(a.lg_b, x0, x1);
                drop(a.lg_r, x0 / RG * 8, (x1 + RG - 1) / RG * 8);
            }
        }
    }
};

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_FINISH_CUH */
