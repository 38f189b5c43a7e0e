/*
 * decode_fast.cuh — the tensor-core decode kernel template (interface in decode_fast.h, design
 * and numerics in docs/decode-kernel.md, "Version 2"). Included only by the generated
 * per-format translation units, each instantiating one (key bits, value bits, head_dim).
 *
 * A warp walks its item 16 tokens (a subtile) at a time, staged in shared memory by cp.async
 * two or three stages ahead, for the G <= 8 query heads of its group, with two m16n8k16 mma
 * products per subtile:
 *
 *   logits: S[token][head] = K[token][:] . Q[head][:]. A = key codes as exact fp16 integers
 *           (thread (gr, tc) holds tokens gr and gr + 8, a contiguous run of d/4 elements each:
 *           16-byte loads), B = q scaled by a power of two and split into fp16 hi + lo (two
 *           mma), fp32 accumulation. Then logit = scale * (s * S + z * sum(q)) per token:
 *           fp32-grade logits, so that the score write-back meets 1e-5.
 *   output: O^T[elem][head] += V^T[elem][token] . P^T[token][head]. A = value codes times their
 *           token's scale in fp16 (one rounding, exact codes), B = the probabilities in fp16,
 *           moved from the logits' accumulator layout by movmatrix.trans. The zeros add
 *           z * sum(p) per head in fp32.
 *
 * Element order inside a thread's run is permuted (the dot products do not care; q and the
 * output use the same maps), so that unpacking a 32-bit word of codes takes one or two
 * instructions per pair of halves. Tokens past the item's end are masked: zero codes, zero
 * metadata and a -inf logit, so that NaN-poisoned slots never reach an mma.
 */
#ifndef MKV_ATTENTION_DECODE_FAST_CUH
#define MKV_ATTENTION_DECODE_FAST_CUH

#include "attention/decode_fast.h"

#include <cuda_fp16.h>

#include <math.h>

namespace mkv_fast {

constexpr uint32_t H2_1024 = 0x64006400u; /* fp16 1024 in both halves: the magic base */

__device__ __forceinline__ uint32_t hsub2(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi)
{
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

__device__ __forceinline__ float lo_f(uint32_t x)
{
    return __half2float(__ushort_as_half((unsigned short)(x & 0xffffu)));
}

__device__ __forceinline__ float hi_f(uint32_t x)
{
    return __half2float(__ushort_as_half((unsigned short)(x >> 16)));
}

/* D += A B, m16n8k16, fp16 inputs, fp32 accumulators. */
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The 8x8 fp16 matrix whose row lane/4, columns 2 (lane%4) and + 1 this thread holds,
 * transposed, in the same fragment layout. */
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x)
{
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

/* ---------------------------------------------------------------------------------------- */
/* Keys: a token's run as fp16 pairs of exact integer codes                                 */
/* ---------------------------------------------------------------------------------------- */

/* The run elements in the low and high half of pair p (what unpack_key produces). */
template <int KB>
__host__ __device__ constexpr int key_pair_lo(int p)
{
    return KB >= 8 ? 2 * p : KB == 4 ? 8 * (p / 4) + p % 4 : 16 * (p / 8) + p % 8;
}

template <int KB>
__host__ __device__ constexpr int key_pair_hi(int p)
{
    return KB >= 8 ? 2 * p + 1 : KB == 4 ? 8 * (p / 4) + 4 + p % 4 : 16 * (p / 8) + 8 + p % 8;
}

/* Position k of a 2-bit word (bits 2k of each half; k >= 5 after a shift by 10): the code
 * times 4^k over the base 1024, brought back to the code by one exact fp16 fma. */
template <int SHIFT>
__device__ __forceinline__ uint32_t codes_at(uint32_t x, uint32_t mask)
{
    const uint32_t v = (x & (mask << SHIFT)) | H2_1024;
    if constexpr (SHIFT == 0) return hsub2(v, H2_1024);
    else if constexpr (SHIFT == 2) return hfma2(v, 0x34003400u, 0xDC00DC00u); /* 1/4, -256 */
    else if constexpr (SHIFT == 4) return hfma2(v, 0x2C002C00u, 0xD400D400u); /* 1/16, -64 */
    else if constexpr (SHIFT == 6) return hfma2(v, 0x24002400u, 0xCC00CC00u); /* 1/64, -16 */
    else {
        static_assert(SHIFT == 8, "bits 0 to 9 of each half");
        return hfma2(v, 0x1C001C00u, 0xC400C400u); /* 1/256, -4 */
    }
}

template <int KB, int WORDS, int PAIRS>
__device__ __forceinline__ void unpack_key(const uint32_t (&w)[WORDS], uint32_t (&kp)[PAIRS])
{
    if constexpr (KB == 16) {
#pragma unroll
        for (int p = 0; p < PAIRS; p++) kp[p] = w[p];
    } else if constexpr (KB == 8) {
#pragma unroll
        for (int i = 0; i < WORDS; i++) {
            kp[2 * i] = hsub2(__byte_perm(w[i], 0x64646464u, 0x4140), H2_1024);
            kp[2 * i + 1] = hsub2(__byte_perm(w[i], 0x64646464u, 0x4342), H2_1024);
        }
    } else if constexpr (KB == 4) {
#pragma unroll
        for (int i = 0; i < WORDS; i++) {
            const uint32_t hi = w[i] >> 8;
            kp[4 * i] = codes_at<0>(w[i], 0x000F000Fu);
            kp[4 * i + 1] = codes_at<4>(w[i], 0x000F000Fu);
            kp[4 * i + 2] = codes_at<0>(hi, 0x000F000Fu);
            kp[4 * i + 3] = codes_at<4>(hi, 0x000F000Fu);
        }
    } else {
        static_assert(KB == 2, "key bits 16, 8, 4 or 2");
#pragma unroll
        for (int i = 0; i < WORDS; i++) {
            const uint32_t hi = w[i] >> 10;
            kp[8 * i] = codes_at<0>(w[i], 0x00030003u);
            kp[8 * i + 1] = codes_at<2>(w[i], 0x00030003u);
            kp[8 * i + 2] = codes_at<4>(w[i], 0x00030003u);
            kp[8 * i + 3] = codes_at<6>(w[i], 0x00030003u);
            kp[8 * i + 4] = codes_at<8>(w[i], 0x00030003u);
            kp[8 * i + 5] = codes_at<0>(hi, 0x00030003u);
            kp[8 * i + 6] = codes_at<2>(hi, 0x00030003u);
            kp[8 * i + 7] = codes_at<4>(hi, 0x00030003u);
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Values: two tokens' runs as fp16 pairs (token a, token b) of code * scale, per element   */
/* ---------------------------------------------------------------------------------------- */

/* vp[u] = (a[u], b[u]) for run element u: raw fp16 for 16-bit values, else the code times the
 * token's scale (s2 = scale a, scale b), one rounding. FUSED: one fma from the magic base
 * (needs 1024 * scale finite in fp16); else an exact subtraction, then the product. */
template <int VB, bool FUSED, int WORDS, int RUN>
__device__ __forceinline__ void unpack_values(const uint32_t (&a)[WORDS], const uint32_t (&b)[WORDS],
                                              uint32_t s2, uint32_t ns2, uint32_t (&vp)[RUN])
{
    if constexpr (VB == 16) {
#pragma unroll
        for (int u = 0; u < RUN; u++)
            vp[u] = __byte_perm(a[u / 2], b[u / 2], u % 2 ? 0x7632 : 0x5410);
    } else {
        constexpr int EPH = 16 / VB; /* elements per 16-bit half */
        constexpr uint32_t MASK = ((1u << VB) - 1u) * 0x00010001u;
#pragma unroll
        for (int u0 = 0; u0 < RUN; u0 += EPH) {
            const int wi = u0 / (2 * EPH), hw = (u0 / EPH) % 2;
            const uint32_t y = __byte_perm(a[wi], b[wi], hw ? 0x7632 : 0x5410);
#pragma unroll
            for (int k = 0; k < EPH; k++) {
                const uint32_t x = ((y >> (VB * k)) & MASK) | H2_1024;
                vp[u0 + k] = FUSED ? hfma2(x, s2, ns2) : hmul2(hsub2(x, H2_1024), s2);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The kernel                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* cp.async of 4, 8 or 16 bytes into shared memory; read false writes zeros and reads
 * nothing. L1: whether to allocate in L1 (value runs: a warp's instruction reads half of each
 * 32-byte sector, the next instruction the other half). */
template <int BYTES, bool L1 = false>
__device__ __forceinline__ void cp_async(uint32_t dst, const void *src, bool read)
{
    const int n = read ? BYTES : 0;
    if constexpr (BYTES == 16 && !L1)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src),
                     "n"(BYTES), "r"(n)
                     : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* What one thread stages for one 16-token subtile, in 32-bit words, each block 16-byte aligned:
 * the key runs of its two tokens (gr, gr + 8), their key and value metadata, the value runs of
 * its four tokens (2tc, 2tc + 1, 2tc + 8, 2tc + 9) and their value metadata. */
template <int KB, int VB, int D>
struct stage_layout {
    static constexpr int KBYTES = D / 4 * KB / 8, VBYTES_RAW = D / 8 * VB / 8;
    static constexpr int VBYTES = VBYTES_RAW < 4 ? 4 : VBYTES_RAW; /* 2-byte runs: a word */
    static constexpr int KW = KBYTES / 4, VW = VBYTES / 4;
    static constexpr bool KQ = KB < 16, VQ = VB < 16;
    static constexpr int up4(int x) { return (x + 3) / 4 * 4; }
    static constexpr int K = 0;
    static constexpr int KM = up4(K + 2 * KW);
    static constexpr int VZ = KM + (KQ ? 2 : 0);
    static constexpr int V = up4(VZ + (VQ ? 2 : 0));
    static constexpr int VS = V + up4(4 * VW) / 4 * 4;
    static constexpr int END = up4(VS + (VQ ? 4 : 0));
    /* Words per thread, an odd number of 16-byte units: LDS.128 without bank conflicts. */
    static constexpr int WORDS = (END / 4) % 2 ? END : END + 4;
    static constexpr int BYTES_PER_SUBTILE = 32 * WORDS * 4; /* per warp */
    static constexpr int NT = BYTES_PER_SUBTILE <= 3072 ? 2 : 1; /* subtiles per stage */
    /* Three stages, two for the largest subtiles (K16V16 at d 128) so that 12 warps fit an SM. */
    static constexpr int STAGES = BYTES_PER_SUBTILE > 6144 ? 2 : 3;
    static constexpr int WARP_BYTES = STAGES * NT * BYTES_PER_SUBTILE;
};

template <int KB, int VB, int D>
constexpr int smem_bytes() { return MKV_FAST_WARPS * stage_layout<KB, VB, D>::WARP_BYTES; }

/* The warp's walk over its item, one subtile at a time: a subtile is up to 16 consecutive
 * tokens of one page (it ends at the page's end or the item's), so that a thread's token is
 * just slot + offset. Warp-uniform. */
struct walker {
    int32_t t, pidx, slot; /* section token, page index in the row, slot in the page */
    __device__ __forceinline__ int32_t count(int32_t tb, int32_t tpp) const
    {
        return max(0, min(16, min(tpp - slot, tb - t)));
    }
    __device__ __forceinline__ void advance(int32_t n, int32_t tpp)
    {
        t += n, slot += n;
        if (slot == tpp) slot = 0, pidx++;
    }
};

template <int KB, int VB, int D>
__global__ void __launch_bounds__(MKV_FAST_WARPS * 32) decode_kernel(const fast_args a)
{
    using SL = stage_layout<KB, VB, D>;
    constexpr int NT = SL::NT, S = SL::STAGES;
    constexpr int KRUN = D / 4, KPAIRS = KRUN / 2, KSTEPS = D / 16;
    constexpr int VRUN = D / 8, MTILES = D / 16;
    constexpr bool KQ = SL::KQ, VQ = SL::VQ;
    extern __shared__ __align__(16) uint8_t smem[];

    const int32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tc = lane & 3;
    int32_t bx = blockIdx.x, sec;
    if (a.sec_mask == 3) {
        sec = bx >= a.blocks_per_sec;
        bx -= sec * a.blocks_per_sec;
    } else {
        sec = a.sec_mask == 2;
    }
    const int32_t item = bx * MKV_FAST_WARPS + warp; /* within the section */
    const int32_t hh = blockIdx.y, j = blockIdx.z;
    const int64_t rs = (int64_t)j * a.H + hh; /* (sequence, KV head) */
    const int64_t region = a.regions[rs];
    const int64_t nh = max(a.n_hi[region], 0), nl = max(a.n_lo[region], 0);
    const int32_t n = (int32_t)min(nh + nl, (int64_t)a.max_tokens);
    const int32_t hi = (int32_t)min(nh, (int64_t)n);
    const int32_t sec_n = sec ? n - hi : hi, base = sec ? hi : 0;
    const int32_t ta = item * a.item_tokens;
    if (ta >= sec_n) return; /* warp-uniform */
    const int32_t tb = min(ta + a.item_tokens, sec_n);
    const int32_t slot_id = sec ? (hi + a.item_tokens - 1) / a.item_tokens + item : item;
    const fast_section L = a.sec[sec];
    const int32_t *row = a.table + region * a.T;
    const int32_t stride = L.tpp * 16;
    const int G = a.G;

    /* q of head gr, run tc, scaled by 2^E (max |q| in [2^14, 2^15)) and split hi + lo. */
    uint32_t qhi[KPAIRS], qlo[KPAIRS];
    float fac[2], qsum[2];
    {
        float qv[KRUN];
        const float *qp = a.q + ((rs * G + gr) * D + tc * KRUN);
#pragma unroll
        for (int u = 0; u < KRUN; u += 4) {
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (gr < G) v = __ldg(reinterpret_cast<const float4 *>(qp + u));
            qv[u] = v.x, qv[u + 1] = v.y, qv[u + 2] = v.z, qv[u + 3] = v.w;
        }
        float mx = 0.0f;
#pragma unroll
        for (int u = 0; u < KRUN; u++) mx = fmaxf(mx, fabsf(qv[u]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        int ex = 0;
        if (mx > 0.0f) frexpf(mx, &ex);
        const int E = mx > 0.0f ? 15 - ex : 0;
        float s = 0.0f;
#pragma unroll
        for (int u = 0; u < KRUN; u++) {
            qv[u] = ldexpf(qv[u], E);
            s += qv[u];
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
#pragma unroll
        for (int p = 0; p < KPAIRS; p++) {
            const float x = qv[key_pair_lo<KB>(p)], y = qv[key_pair_hi<KB>(p)];
            qhi[p] = pack_h2(x, y);
            qlo[p] = pack_h2(x - lo_f(qhi[p]), y - hi_f(qhi[p]));
        }
        /* Logits in log2 units: l2 = scale * log2(e) * 2^-E * (s * S + z * sum q). */
        const float f = gr < G ? ldexpf(a.softmax_scale * 1.4426950408889634f, -E) : 0.0f;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            fac[i] = __shfl_sync(0xffffffffu, f, 4 * (2 * tc + i));
            qsum[i] = __shfl_sync(0xffffffffu, s, 4 * (2 * tc + i));
        }
    }

    float o[MTILES][4];
#pragma unroll
    for (int i = 0; i < MTILES; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}, zsum[2] = {0.0f, 0.0f};
    float *lg = a.logits + (rs * a.max_tokens + base) * G;

    /* This thread's staging area: [stage][subtile][lane][WORDS]. */
    const uint32_t my_smem = (uint32_t)__cvta_generic_to_shared(smem) +
                             warp * SL::WARP_BYTES + lane * SL::WORDS * 4;
    const uint8_t *my_gen = smem + warp * SL::WARP_BYTES + lane * SL::WORDS * 4;
    /* Byte offsets of this thread's runs in a page (chunk-major segments, quant/format.h);
     * 32-bit: the tensor-core path takes pages under 2 GiB. */
    const int32_t krun = tc * SL::KBYTES, vrun = gr * SL::VBYTES_RAW;
    const int32_t koff = (int32_t)L.off_key + krun / 16 * stride + krun % 16;
    const int32_t voff = (int32_t)L.off_value + vrun / 16 * stride + (vrun % 16) / 4 * 4;
    const int32_t kmoff = (int32_t)L.off_key_meta, vmoff = (int32_t)L.off_value_meta;

    walker P = {ta, ta / L.tpp, ta % L.tpp}; /* producer: what to load next */
    walker C = P;                            /* consumer: what to compute next */
    int32_t cur_pidx = -1;
    const uint8_t *page = a.pool;
    /* Page ids 32 at a time: lane i holds the id of page win + i of the section (one load per
     * 32 pages, then a shuffle per page, instead of a dependent load per page). */
    const int32_t sec_pages = (sec_n + L.tpp - 1) / L.tpp;
    int32_t win = INT32_MIN / 2, win_id = -1;

    /* Issues the cp.async of one stage (NT subtiles) and commits it (possibly empty). */
    auto produce = [&](int32_t stage) {
#pragma unroll
        for (int st = 0; st < NT; st++) {
            const int32_t cnt = P.count(tb, L.tpp);
            if (cnt == 0) break; /* warp-uniform: nothing left to load */
            if (P.pidx != cur_pidx) {
                cur_pidx = P.pidx;
                if ((uint32_t)(cur_pidx - win) >= 32u) {
                    win = cur_pidx;
                    const int32_t e = win + lane;
                    win_id = e < sec_pages ? __ldg(row + (sec ? a.T - 1 - e : e)) : 0;
                }
                const int32_t pid = __shfl_sync(0xffffffffu, win_id, cur_pidx - win);
                // NOTE: int32 page id, widen before the multiply (pools exceed 2 GiB).
                page = a.pool + (int64_t)pid * a.page_bytes;
            }
            const uint32_t dst = my_smem + (stage * NT + st) * SL::BYTES_PER_SUBTILE;
            /* A masked token (past the subtile's end) copies nothing (source size 0, zeros
             * written) from an in-page address: the subtile's first slot. */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int32_t off = gr + 8 * r;
                const bool ok = off < cnt;
                const int32_t slot = P.slot + (ok ? off : 0);
                const int32_t ko = koff + slot * 16;
                if constexpr (SL::KBYTES >= 16) {
#pragma unroll
                    for (int i = 0; i < SL::KBYTES / 16; i++)
                        cp_async<16>(dst + (SL::K + r * SL::KW) * 4 + i * 16,
                                     page + (ko + i * stride), ok);
                } else {
                    cp_async<SL::KBYTES>(dst + (SL::K + r * SL::KW) * 4, page + ko, ok);
                }
                if constexpr (KQ) cp_async<4>(dst + (SL::KM + r) * 4, page + (kmoff + slot * 4), ok);
                if constexpr (VQ) cp_async<4>(dst + (SL::VZ + r) * 4, page + (vmoff + slot * 4), ok);
            }
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int32_t off = 2 * tc + (r & 1) + 8 * (r >> 1);
                const bool ok = off < cnt;
                const int32_t slot = P.slot + (ok ? off : 0);
                const int32_t vo = voff + slot * 16;
                if constexpr (SL::VBYTES >= 16) {
#pragma unroll
                    for (int i = 0; i < SL::VBYTES / 16; i++)
                        cp_async<16, true>(dst + (SL::V + r * SL::VW) * 4 + i * 16,
                                           page + (vo + i * stride), ok);
                } else {
                    cp_async<SL::VBYTES, true>(dst + (SL::V + r * SL::VW) * 4, page + vo, ok);
                }
                if constexpr (VQ) cp_async<4>(dst + (SL::VS + r) * 4, page + (vmoff + slot * 4), ok);
            }
            P.advance(cnt, L.tpp);
        }
        cp_async_commit();
    };

#pragma unroll
    for (int s = 0; s < S - 1; s++) produce(s);

    int32_t ps = S - 1, cs = 0; /* the stages being filled and computed */
    while (C.t < tb) {
        produce(ps);
        ps = ps + 1 == S ? 0 : ps + 1;
        cp_async_wait<S - 1>(); /* this thread's copies of stage cs have landed */
        const uint8_t *stage = my_gen + cs * NT * SL::BYTES_PER_SUBTILE;
        cs = cs + 1 == S ? 0 : cs + 1;
#pragma unroll
        for (int st = 0; st < NT; st++) {
            const int32_t cnt = C.count(tb, L.tpp), t0 = C.t;
            C.advance(cnt, L.tpp);
            if (cnt == 0) break; /* warp-uniform: the item is done */
            uint32_t w[SL::END];
            const uint8_t *src = stage + st * SL::BYTES_PER_SUBTILE;
#pragma unroll
            for (int i = 0; i < SL::END; i += 4) {
                const uint4 v = *reinterpret_cast<const uint4 *>(src + i * 4);
                w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
            }
            uint32_t kw0[SL::KW], kw1[SL::KW];
#pragma unroll
            for (int i = 0; i < SL::KW; i++) kw0[i] = w[SL::K + i], kw1[i] = w[SL::K + SL::KW + i];

            /* Logits of tokens gr, gr + 8 (rows) for heads 2tc, 2tc + 1 (columns). */
            uint32_t k0[KPAIRS], k1[KPAIRS];
            unpack_key<KB>(kw0, k0);
            unpack_key<KB>(kw1, k1);
            /* Four independent accumulator chains (even and odd k-steps, hi and lo q): the
             * mma latency is paid KSTEPS / 2 times, not 2 KSTEPS times. */
            float cc[4][4] = {};
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                mma(cc[ks % 2], k0[2 * ks], k1[2 * ks], k0[2 * ks + 1], k1[2 * ks + 1],
                    qhi[2 * ks], qhi[2 * ks + 1]);
                mma(cc[2 + ks % 2], k0[2 * ks], k1[2 * ks], k0[2 * ks + 1], k1[2 * ks + 1],
                    qlo[2 * ks], qlo[2 * ks + 1]);
            }
            float c[4];
#pragma unroll
            for (int i = 0; i < 4; i++) c[i] = (cc[0][i] + cc[1][i]) + (cc[2][i] + cc[3][i]);
            float l[2][2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int32_t off = gr + 8 * r;
                const bool valid = off < cnt;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float raw = c[2 * r + i];
                    if constexpr (KQ) raw = fmaf(lo_f(w[SL::KM + r]), raw, hi_f(w[SL::KM + r]) * qsum[i]);
                    l[r][i] = valid ? fac[i] * raw : -INFINITY;
                }
                if (valid && 2 * tc < G) {
                    float *dst = lg + (int64_t)(t0 + off) * G + 2 * tc;
                    if (2 * tc + 1 < G) {
                        if (G % 2 == 0) *reinterpret_cast<float2 *>(dst) = make_float2(l[r][0], l[r][1]);
                        else dst[0] = l[r][0], dst[1] = l[r][1];
                    } else {
                        dst[0] = l[r][0];
                    }
                }
            }
            /* Online softmax per head (columns 2tc, 2tc + 1: a reduction over gr). */
            float alpha[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float mx = fmaxf(l[0][i], l[1][i]);
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                const float mn = fmaxf(m[i], mx);
                alpha[i] = exp2f(m[i] - mn);
                m[i] = mn;
            }
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    lsum[i] *= alpha[i];
                    zsum[i] *= alpha[i];
#pragma unroll
                    for (int t = 0; t < MTILES; t++) o[t][i] *= alpha[i], o[t][2 + i] *= alpha[i];
                }
            }
            float p[2][2];
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    p[r][i] = exp2f(l[r][i] - m[i]);
                    lsum[i] += p[r][i];
                    if constexpr (VQ) zsum[i] = fmaf(p[r][i], hi_f(w[SL::VZ + r]), zsum[i]);
                }
            const uint32_t b0 = transpose8x8(pack_h2(p[0][0], p[0][1]));
            const uint32_t b1 = transpose8x8(pack_h2(p[1][0], p[1][1]));

            /* Values of tokens (2tc, 2tc + 1) and (2tc + 8, 2tc + 9), run gr. */
            uint32_t vw[4][SL::VW];
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int i = 0; i < SL::VW; i++) {
                    vw[r][i] = w[SL::V + r * SL::VW + i];
                    if (SL::VBYTES_RAW == 2 && (gr & 1)) vw[r][i] >>= 16; /* odd 2-byte run */
                }
            uint32_t v01[VRUN], v23[VRUN];
            if constexpr (VQ) {
                const uint32_t s01 = __byte_perm(w[SL::VS], w[SL::VS + 1], 0x5410);
                const uint32_t s23 = __byte_perm(w[SL::VS + 2], w[SL::VS + 3], 0x5410);
                /* 1024 * scale must stay finite in fp16: scales up to 63.97 (0x53FF). */
                bool small = true;
#pragma unroll
                for (int r = 0; r < 4; r++) small = small && (w[SL::VS + r] & 0x7fffu) <= 0x53FFu;
                if (__all_sync(0xffffffffu, small)) {
                    const uint32_t n01 = hmul2(s01, 0xE400E400u), n23 = hmul2(s23, 0xE400E400u);
                    unpack_values<VB, true>(vw[0], vw[1], s01, n01, v01);
                    unpack_values<VB, true>(vw[2], vw[3], s23, n23, v23);
                } else {
                    unpack_values<VB, false>(vw[0], vw[1], s01, 0u, v01);
                    unpack_values<VB, false>(vw[2], vw[3], s23, 0u, v23);
                }
            } else {
                unpack_values<VB, false>(vw[0], vw[1], 0u, 0u, v01);
                unpack_values<VB, false>(vw[2], vw[3], 0u, 0u, v23);
            }
#pragma unroll
            for (int t = 0; t < MTILES; t++)
                mma(o[t], v01[2 * t], v01[2 * t + 1], v23[2 * t], v23[2 * t + 1], b0, b1);
        }
    }
    cp_async_wait<0>();

    /* The item's partial result: sums over the rows (gr), then O + z * sum(p) per head. */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) {
            lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], x);
            zsum[i] += __shfl_xor_sync(0xffffffffu, zsum[i], x);
        }
    const int64_t part = (rs * 2 * a.sec_items + slot_id) * G;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int32_t h = 2 * tc + i;
        if (h >= G) continue;
        float *po = a.part_o + (part + h) * D + gr * VRUN;
#pragma unroll
        for (int t = 0; t < MTILES; t++)
            *reinterpret_cast<float2 *>(po + 2 * t) = make_float2(o[t][i] + zsum[i],
                                                                  o[t][2 + i] + zsum[i]);
        if (gr == 0)
            *reinterpret_cast<float2 *>(a.part_ml + (part + h) * 2) = make_float2(m[i], lsum[i]);
    }
}

} // namespace mkv_fast

/* One instantiation per translation unit (generated by CMake). */
#define MKV_DECODE_FAST_INSTANCE(KB, VB, D)                                                    \
    cudaError_t mkv_fast_launch_K##KB##V##VB##_d##D(const fast_args &a, dim3 grid,            \
                                                    cudaStream_t stream)                      \
    {                                                                                          \
        constexpr int smem = mkv_fast::smem_bytes<KB, VB, D>();                                \
        /* The opt-in above 48 KB (per device: set on every call, it is cheap). */             \
        const cudaError_t e = cudaFuncSetAttribute(mkv_fast::decode_kernel<KB, VB, D>,         \
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem);          \
        if (e != cudaSuccess) return e;                                                        \
        mkv_fast::decode_kernel<KB, VB, D><<<grid, MKV_FAST_WARPS * 32, smem, stream>>>(a);     \
        return cudaGetLastError();                                                             \
    }

#endif /* MKV_ATTENTION_DECODE_FAST_CUH */
