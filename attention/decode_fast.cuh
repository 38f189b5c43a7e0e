/*
 * decode_fast.cuh — the tensor-core decode kernel template (interface in decode_fast.h, design
 * and numerics in docs/decode-kernel.md, "Version 2"). Included only by the generated
 * per-format translation units, each instantiating one (key bits, value bits, head_dim).
 *
 * A warp takes 16 tokens at a time (NT such subtiles per loop iteration, loads first) for the
 * G <= 8 query heads of its group, with two m16n8k16 mma products per subtile:
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
/* Runs: which bytes of a token's vector a thread reads                                      */
/* ---------------------------------------------------------------------------------------- */

/* Thread (gr, tc) reads a run of RUN consecutive elements of a vector: keys, run tc of d/4
 * elements; values, run gr of d/8. BYTES of them, as WORDS 32-bit words (a 2-byte run sits in
 * the low half of word 0). */
template <int BITS, int RUN>
struct run_traits {
    static constexpr int BYTES = RUN * BITS / 8;
    static constexpr int WORDS = BYTES >= 4 ? BYTES / 4 : 1;
};

/* Loads run `run` of a token's vector from its code segment: chunk-major layout, 16-byte
 * chunks ([chunk][token][16], quant/format.h). seg: the segment; stride: tokens per page * 16. */
template <int BYTES, int WORDS>
__device__ __forceinline__ void load_run(const uint8_t *seg, int32_t run, int32_t slot,
                                         int32_t stride, uint32_t (&w)[WORDS])
{
    const int32_t first = run * BYTES; /* byte offset in the vector */
    if constexpr (BYTES >= 16) {
#pragma unroll
        for (int i = 0; i < BYTES / 16; i++) {
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(
                seg + (int64_t)(first / 16 + i) * stride + slot * 16));
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else {
        const uint8_t *p = seg + (int64_t)(first / 16) * stride + slot * 16 + first % 16;
        if constexpr (BYTES == 8) {
            const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
            w[0] = v.x, w[1] = v.y;
        } else if constexpr (BYTES == 4) {
            w[0] = __ldg(reinterpret_cast<const unsigned int *>(p));
        } else {
            static_assert(BYTES == 2, "runs are 2, 4, 8 or a multiple of 16 bytes");
            w[0] = __ldg(reinterpret_cast<const unsigned short *>(p));
        }
    }
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

/* 16-token subtiles per loop iteration: about 8 KB of codes in flight per warp. */
template <int KB, int VB, int D>
__host__ __device__ constexpr int subtiles()
{
    return 8192 / (2 * (KB + VB) * D) >= 4 ? 4 : 8192 / (2 * (KB + VB) * D) >= 2 ? 2 : 1;
}

struct token_loc {
    const uint8_t *page;
    int32_t slot;
};

/* Page and slot of the token `o` places after the warp's current position (page index pi0,
 * slot s0) in a section; high pages fill the row from the left, low from the right. */
__device__ __forceinline__ token_loc locate(const fast_args &a, const int32_t *row, int sec,
                                            int32_t tpp, int32_t pi0, int32_t s0, int32_t o)
{
    int32_t slot = s0 + o, pi = pi0;
    while (slot >= tpp) slot -= tpp, pi++;
    const int32_t page = __ldg(row + (sec ? a.T - 1 - pi : pi));
    // NOTE: int32 page id, widen before the multiply (pools exceed 2 GiB).
    return {a.pool + (int64_t)page * a.page_bytes, slot};
}

template <int KB, int VB, int D>
__global__ void __launch_bounds__(MKV_FAST_WARPS * 32) decode_kernel(const fast_args a)
{
    constexpr int NT = subtiles<KB, VB, D>();
    constexpr int KRUN = D / 4, KPAIRS = KRUN / 2, KSTEPS = D / 16;
    constexpr int VRUN = D / 8, MTILES = D / 16;
    using KT = run_traits<KB, KRUN>;
    using VT = run_traits<VB, VRUN>;
    constexpr bool KQ = KB < 16, VQ = VB < 16; /* quantized: metadata present */

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

    int32_t pi0 = ta / L.tpp, s0 = ta - pi0 * L.tpp;
    for (int32_t t0 = ta; t0 < tb; t0 += 16 * NT) {
        /* Loads for NT subtiles: keys (and both metadata words) of tokens gr and gr + 8,
         * values of tokens 2tc, 2tc + 1, 2tc + 8 and 2tc + 9. */
        uint32_t kw[NT][2][KT::WORDS], km[NT][2], vz[NT][2];
        uint32_t vw[NT][4][VT::WORDS], vs[NT][4];
#pragma unroll
        for (int st = 0; st < NT; st++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int32_t off = st * 16 + gr + 8 * r;
#pragma unroll
                for (int i = 0; i < KT::WORDS; i++) kw[st][r][i] = 0u;
                km[st][r] = vz[st][r] = 0u;
                if (t0 + off < tb) {
                    const token_loc t = locate(a, row, sec, L.tpp, pi0, s0, off);
                    load_run<KT::BYTES>(t.page + L.off_key, tc, t.slot, stride, kw[st][r]);
                    if (KQ) km[st][r] = __ldg(reinterpret_cast<const unsigned int *>(
                                t.page + L.off_key_meta + t.slot * 4));
                    if (VQ) vz[st][r] = __ldg(reinterpret_cast<const unsigned int *>(
                                t.page + L.off_value_meta + t.slot * 4));
                }
            }
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int32_t off = st * 16 + 2 * tc + (r & 1) + 8 * (r >> 1);
#pragma unroll
                for (int i = 0; i < VT::WORDS; i++) vw[st][r][i] = 0u;
                vs[st][r] = 0u;
                if (t0 + off < tb) {
                    const token_loc t = locate(a, row, sec, L.tpp, pi0, s0, off);
                    load_run<VT::BYTES>(t.page + L.off_value, gr, t.slot, stride, vw[st][r]);
                    if (VQ) vs[st][r] = __ldg(reinterpret_cast<const unsigned int *>(
                                t.page + L.off_value_meta + t.slot * 4));
                }
            }
        }

#pragma unroll
        for (int st = 0; st < NT; st++) {
            /* Logits of tokens gr, gr + 8 (rows) for heads 2tc, 2tc + 1 (columns). */
            uint32_t k0[KPAIRS], k1[KPAIRS];
            unpack_key<KB>(kw[st][0], k0);
            unpack_key<KB>(kw[st][1], k1);
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                mma(c, k0[2 * ks], k1[2 * ks], k0[2 * ks + 1], k1[2 * ks + 1], qhi[2 * ks],
                    qhi[2 * ks + 1]);
                mma(c, k0[2 * ks], k1[2 * ks], k0[2 * ks + 1], k1[2 * ks + 1], qlo[2 * ks],
                    qlo[2 * ks + 1]);
            }
            float l[2][2];
            const int32_t tok0 = t0 + st * 16 + gr; /* section index of row 0's token */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const bool valid = tok0 + 8 * r < tb;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float raw = c[2 * r + i];
                    if (KQ) raw = fmaf(lo_f(km[st][r]), raw, hi_f(km[st][r]) * qsum[i]);
                    l[r][i] = valid ? fac[i] * raw : -INFINITY;
                    if (valid && 2 * tc + i < G) lg[(int64_t)(tok0 + 8 * r) * G + 2 * tc + i] = l[r][i];
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
                    if (VQ) zsum[i] = fmaf(p[r][i], hi_f(vz[st][r]), zsum[i]);
                }
            const uint32_t b0 = transpose8x8(pack_h2(p[0][0], p[0][1]));
            const uint32_t b1 = transpose8x8(pack_h2(p[1][0], p[1][1]));

            /* Values of tokens (2tc, 2tc + 1) and (2tc + 8, 2tc + 9), run gr. */
            uint32_t v01[VRUN], v23[VRUN];
            if (VQ) {
                const uint32_t s01 = __byte_perm(vs[st][0], vs[st][1], 0x5410);
                const uint32_t s23 = __byte_perm(vs[st][2], vs[st][3], 0x5410);
                /* 1024 * scale must stay finite in fp16: scales up to 63.97 (0x53FF). */
                bool small = true;
#pragma unroll
                for (int r = 0; r < 4; r++) small = small && (vs[st][r] & 0x7fffu) <= 0x53FFu;
                if (__all_sync(0xffffffffu, small)) {
                    const uint32_t n01 = hmul2(s01, 0xE400E400u), n23 = hmul2(s23, 0xE400E400u);
                    unpack_values<VB, true>(vw[st][0], vw[st][1], s01, n01, v01);
                    unpack_values<VB, true>(vw[st][2], vw[st][3], s23, n23, v23);
                } else {
                    unpack_values<VB, false>(vw[st][0], vw[st][1], s01, 0u, v01);
                    unpack_values<VB, false>(vw[st][2], vw[st][3], s23, 0u, v23);
                }
            } else {
                unpack_values<VB, false>(vw[st][0], vw[st][1], 0u, 0u, v01);
                unpack_values<VB, false>(vw[st][2], vw[st][3], 0u, 0u, v23);
            }
#pragma unroll
            for (int t = 0; t < MTILES; t++)
                mma(o[t], v01[2 * t], v01[2 * t + 1], v23[2 * t], v23[2 * t + 1], b0, b1);
        }

        s0 += 16 * NT;
        while (s0 >= L.tpp) s0 -= L.tpp, pi0++;
    }

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
        mkv_fast::decode_kernel<KB, VB, D><<<grid, MKV_FAST_WARPS * 32, 0, stream>>>(a);        \
        return cudaGetLastError();                                                             \
    }

#endif /* MKV_ATTENTION_DECODE_FAST_CUH */
