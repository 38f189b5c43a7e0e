/*
 * tc_unpack.cuh — how a token's staged key and value runs become mma operands in the
 * tensor-core decode kernel (tc_subtile.cuh): keys as bytes of exact codes for the 8-bit integer
 * mma or (4-bit) as fp16 pairs of exact subnormal codes, values as fp16 pairs of two tokens
 * (exact subnormal codes, or codes times their scale where values have several groups), and
 * the fp16 pair helpers they use.
 */
#ifndef MKV_ATTENTION_TC_UNPACK_CUH
#define MKV_ATTENTION_TC_UNPACK_CUH

#include "attention/tc_ptx.cuh"

#include <cuda_fp16.h>

#include <stdint.h>

namespace mkv_tc {

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

/* ---------------------------------------------------------------------------------------- */
/* Keys: a token's run as bytes of exact codes (8-bit integer mma) or as fp16 (16-bit keys)  */
/* ---------------------------------------------------------------------------------------- */

/* Quantized keys become a stream of bytes, one code each: unpack_key_bytes's byte b holds
 * run element key_byte_elem(b) (q's digits follow the same map). */
template <int KB>
__host__ __device__ constexpr int key_byte_elem(int b)
{
    return KB == 8 ? b
         : KB == 4 ? 8 * (b / 8) + 2 * (b % 4) + (b / 4) % 2
                   : 16 * (b / 16) + 4 * (b % 4) + (b / 4) % 4;
}

template <int KB, int WORDS, int BWORDS>
__device__ __forceinline__ void unpack_key_bytes(const uint32_t (&w)[WORDS], uint32_t (&kb)[BWORDS])
{
    static_assert(BWORDS == WORDS * 8 / KB, "one byte per code");
#pragma unroll
    for (int i = 0; i < WORDS; i++) {
        if constexpr (KB == 8) {
            kb[i] = w[i];
        } else if constexpr (KB == 4) {
            kb[2 * i] = w[i] & 0x0F0F0F0Fu;
            kb[2 * i + 1] = (w[i] >> 4) & 0x0F0F0F0Fu;
        } else {
            static_assert(KB == 2, "quantized key bits 8, 4 or 2");
#pragma unroll
            for (int k = 0; k < 4; k++) kb[4 * i + k] = (w[i] >> (2 * k)) & 0x03030303u;
        }
    }
}

/* A word of 4-bit key codes (nibble n: the word's element n) as four fp16 pairs of exact
 * subnormals for the fp16 mma, c 2^-24 times f: (n0, n4), 16 (n1, n5), (n2, n6), 16 (n3, n7).
 * Codes stay in the low 10 bits of each half (the subnormal mantissa); q divides by f. */
__device__ __forceinline__ void key_halves(uint32_t w, uint32_t (&h)[4])
{
    const uint32_t t = w >> 8;
    h[0] = w & 0x000F000Fu;
    h[1] = w & 0x00F000F0u;
    h[2] = t & 0x000F000Fu;
    h[3] = t & 0x00F000F0u;
}

/* ---------------------------------------------------------------------------------------- */
/* Values: two tokens' runs as fp16 pairs (token a, token b), one pair per run element       */
/* ---------------------------------------------------------------------------------------- */

/* Quantized values enter the mma as fp16 subnormals, f(u) * code * 2^-24, exact and one AND per
 * pair: the code stays at its bit position (bits 0 to 9) inside a byte, so element u carries
 * the factor f(u) = 2^(bits * (u % codes per byte)), undone with the 2^24 on the output row at
 * the end (the token's scale is folded into its probability, the zero into z * sum p). */
template <int VB>
__host__ __device__ constexpr float value_factor(int u)
{
    return VB >= 8 ? 1.0f : (float)(1u << (VB * (u % (8 / VB))));
}

template <int VB, int WORDS, int RUN>
__device__ __forceinline__ void unpack_values(const uint32_t (&a)[WORDS], const uint32_t (&b)[WORDS],
                                              uint32_t (&vp)[RUN])
{
    if constexpr (VB == 16) {
#pragma unroll
        for (int u = 0; u < RUN; u++)
            vp[u] = __byte_perm(a[u / 2], b[u / 2], u % 2 ? 0x7632 : 0x5410);
    } else {
        constexpr int EPB = 8 / VB; /* codes per byte */
#pragma unroll
        for (int q = 0; q < RUN / EPB; q++) {
            /* byte q % 4 of a into byte 0, of b into byte 2; bytes 1 and 3 are masked off */
            const uint32_t y = __byte_perm(a[q / 4], b[q / 4], (q % 4) | ((4 + q % 4) << 8));
#pragma unroll
            for (int k = 0; k < EPB; k++)
                vp[q * EPB + k] = y & (((1u << VB) - 1u) << (VB * k)) * 0x00010001u;
        }
    }
}

/* (x & m) | e as one LOP3: a code masked out of its byte pair with the fp16 exponent e ORed
 * in, without a separate OR of e into the pair (the compiler, left to it, does not fold). */
__device__ __forceinline__ uint32_t and_or_b32(uint32_t x, uint32_t m, uint32_t e)
{
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "r"(m), "r"(e));
    return r;
}

/* 2^-e as an fp16 pair (0 <= e <= 14: normal). */
__device__ __forceinline__ uint32_t h2_pow2_neg(int e) { return (uint32_t)((15 - e) << 10) * 0x00010001u; }

/* Multi-group values (VG > 1): the scale cannot ride on the probabilities (a tile's 16 rows
 * come from eight lanes' runs, which lie in different groups, and B is shared by the rows), so
 * it rides on the codes. A lane's run lies in one group (VG <= 8), so its pairs of tokens
 * (a, b) share one pair of scales s = (s_a, s_b) 2^-k; each code becomes a normal fp16
 * 1024 + f(u) code (an OR of the exponent, exact: f(u) code < 256), and one fma with s and
 * -1024 s gives f(u) code s 2^-k, rounded once (the product is exact inside the fma); the
 * factor f(u) is undone per output row at the end, as for one group. s 2^-k <= 32 keeps
 * 1024 s 2^-k and f(u) code s 2^-k (at most 7,680) in range (k: the softmax step's shift). */
template <int VB, int WORDS, int RUN>
__device__ __forceinline__ void unpack_values_scaled(const uint32_t (&a)[WORDS], const uint32_t (&b)[WORDS],
                                                     uint32_t s, uint32_t (&vp)[RUN])
{
    static_assert(VB < 16, "quantized values");
    constexpr int EPB = 8 / VB; /* codes per byte */
    const uint32_t ns = hmul2(s, 0xE400E400u); /* -1024 s */
    /* The exponent ORed in by the mask's own LOP3, (y & m) | E: one instruction a code. */
    const uint32_t E = 0x64006400u;
#pragma unroll
    for (int q = 0; q < RUN / EPB; q++) {
        const uint32_t y = __byte_perm(a[q / 4], b[q / 4], (q % 4) | ((4 + q % 4) << 8));
#pragma unroll
        for (int k = 0; k < EPB; k++)
            vp[q * EPB + k] = hfma2(and_or_b32(y, (((1u << VB) - 1u) << (VB * k)) * 0x00010001u, E), s, ns);
    }
}

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_UNPACK_CUH */
