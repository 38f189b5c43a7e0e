/*
 * decode_fast.cuh — the tensor-core decode kernel template (interface in decode_fast.h, design
 * and numerics in docs/decode-kernel.md, "The tensor-core kernels"). Included only by the
 * generated per-format translation units, each instantiating one (key bits, value bits,
 * head_dim).
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
#ifndef MKV_ATTENTION_DECODE_FAST_CUH
#define MKV_ATTENTION_DECODE_FAST_CUH

#include "attention/decode_fast.h"

#ifndef MKV_MAX_DEVICES
#define MKV_MAX_DEVICES 64 /* devices whose properties are cached */
#endif

#include <cuda_fp16.h>

#include <atomic>

#include <type_traits>

#include <math.h>

namespace mkv_fast {


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

/* D += A B, m16n8k32, A unsigned 8-bit, B signed 8-bit, s32 accumulators (exact). */
__device__ __forceinline__ void mma_u8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
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

/* fp16x2 arithmetic on packed words, rounded to nearest (subnormals kept). */
__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

/* 2^-e as an fp16 pair (0 <= e <= 14: normal). */
__device__ __forceinline__ uint32_t h2_pow2_neg(int e) { return (uint32_t)((15 - e) << 10) * 0x00010001u; }

/* Multi-group values (VG > 1): the scale cannot ride on the probabilities (a tile's 16 rows
 * come from eight lanes' runs, which lie in different groups, and B is shared by the rows), so
 * it rides on the codes. A lane's run lies in one group (VG <= 8), so its pairs of tokens
 * (a, b) share one pair of scales s = (s_a, s_b) 2^-k; each code becomes a normal fp16
 * 1024 + f(u) code (an OR of the exponent, exact), and one fma with s / f(u) and -1024 s / f(u)
 * gives code * s 2^-k, rounded once (the product is exact inside the fma). s 2^-k <= 32 keeps
 * 1024 s 2^-k in range (k: the softmax step's shift). */
template <int VB, int WORDS, int RUN>
__device__ __forceinline__ void unpack_values_scaled(const uint32_t (&a)[WORDS], const uint32_t (&b)[WORDS],
                                                     uint32_t s, uint32_t (&vp)[RUN])
{
    static_assert(VB < 16, "quantized values");
    constexpr int EPB = 8 / VB; /* codes per byte */
    uint32_t sk[EPB], nk[EPB];
#pragma unroll
    for (int k = 0; k < EPB; k++) {
        sk[k] = k ? hmul2(s, h2_pow2_neg(VB * k)) : s;
        nk[k] = hmul2(sk[k], 0xE400E400u); /* -1024 */
    }
#pragma unroll
    for (int q = 0; q < RUN / EPB; q++) {
        const uint32_t y = __byte_perm(a[q / 4], b[q / 4], (q % 4) | ((4 + q % 4) << 8));
#pragma unroll
        for (int k = 0; k < EPB; k++)
            vp[q * EPB + k] = hfma2((y & (((1u << VB) - 1u) << (VB * k)) * 0x00010001u) | 0x64006400u,
                                    sk[k], nk[k]);
    }
}

/* ldmatrix: four 8x8 b16 matrices, rows from the addresses of lanes 8i .. 8i + 7 for matrix i;
 * lane (gr, tc) receives word tc of row gr of each. */
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

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

/* ---------------------------------------------------------------------------------------- */
/* The kernel                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* cp.async of 4, 8 or 16 bytes into shared memory; read false writes zeros and reads
 * nothing. */
template <int BYTES>
__device__ __forceinline__ void cp_async(uint32_t dst, const void *src, bool read)
{
    const int n = read ? BYTES : 0;
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src),
                     "n"(BYTES), "r"(n) : "memory");
}

__device__ __forceinline__ uint64_t policy_evict_first()
{
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* cp.async of 16 or 4 bytes of page data; FIRST: under an L2 evict_first policy. The fused
 * write-back wants it (the pages stream through once, and the logits stored evict_last should
 * outlast them); the separate launches do not (the two-launch mix measured slower with it). A
 * template parameter, not a runtime flag: the fused kernel and the separate launches inline
 * run_item each (a branch per copy, or a select of the policy, issued every copy twice). */
template <int BYTES, bool FIRST>
__device__ __forceinline__ void cp_async_page(uint32_t dst, const void *src, bool read)
{
    const int n = read ? BYTES : 0;
    if constexpr (!FIRST)
        cp_async<BYTES>(dst, src, read);
    else if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst),
                     "l"(src), "r"(n), "l"(policy_evict_first()) : "memory");
    else
        asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], %2, %3, %4;" ::"r"(dst),
                     "l"(src), "n"(BYTES), "r"(n), "l"(policy_evict_first()) : "memory");
}

/* cp_async_page of 16 bytes from base + off (the sum formed inside the copy's asm, so that the
 * compiler does not compute every copy's address up front). */
template <bool FIRST>
__device__ __forceinline__ void cp_async_page_at(uint32_t dst, const uint8_t *base, int32_t off, bool read)
{
    const int n = read ? 16 : 0;
    if constexpr (FIRST)
        asm volatile("{\n\t.reg .s64 o;\n\t.reg .u64 s;\n\tcvt.s64.s32 o, %2;\n\tadd.u64 s, %1, o;\n\t"
                     "cp.async.cg.shared.global.L2::cache_hint [%0], [s], 16, %3, %4;\n\t}" ::"r"(dst),
                     "l"(base), "r"(off), "r"(n), "l"(policy_evict_first()) : "memory");
    else
        asm volatile("{\n\t.reg .s64 o;\n\t.reg .u64 s;\n\tcvt.s64.s32 o, %2;\n\tadd.u64 s, %1, o;\n\t"
                     "cp.async.cg.shared.global [%0], [s], 16, %3;\n\t}" ::"r"(dst), "l"(base), "r"(off), "r"(n)
                     : "memory");
}

/* Stores of logits under L2 policy pol (evict_last where the kernel reads them back itself). */
__device__ __forceinline__ void st_logit(float *p, float x, uint64_t pol)
{
    asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(p), "f"(x), "l"(pol) : "memory");
}

__device__ __forceinline__ void st_logit(float *p, float x, float y, uint64_t pol)
{
    asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;" ::"l"(p), "f"(x), "f"(y),
                 "l"(pol) : "memory");
}

/* Stores of compact logits (a word of codes' low halves, a byte of high nibbles) under L2
 * policy pol. */
__device__ __forceinline__ void st_code(uint32_t *p, uint32_t x, uint64_t pol)
{
    asm volatile("st.global.L2::cache_hint.b32 [%0], %1, %2;" ::"l"(p), "r"(x), "l"(pol) : "memory");
}

__device__ __forceinline__ void st_code(uint8_t *p, uint32_t x, uint64_t pol)
{
    asm volatile("st.global.L2::cache_hint.b8 [%0], %1, %2;" ::"l"(p), "r"(x), "l"(pol) : "memory");
}

/* A token's compact logits, where ok: the word at a, the byte at b (predicated stores, not a
 * branch: a branch per token kept the compiler from overlapping the tokens' ex2 latencies). */
__device__ __forceinline__ void st_codes_if(bool ok, uint32_t *a, uint32_t x, uint8_t *b, uint32_t y, uint64_t pol)
{
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
                 "@p st.global.L2::cache_hint.b32 [%0], %1, %5;\n\t"
                 "@p st.global.L2::cache_hint.b8 [%2], %3, %5;\n\t}" ::"l"(a), "r"(x), "l"(b), "r"(y),
                 "r"((int)ok), "l"(pol) : "memory");
}

/* 20-bit code of y in [0, 1] (rounded to nearest: y (2^20 - 2) + 2^23 in fp32 has ulp 1),
 * in the low 20 bits; bits 20 to 22 are zero. */
__device__ __forceinline__ uint32_t y_code(float y) { return __float_as_uint(fmaf(y, MKV_FAST_YSCALE, 8388608.0f)); }

__device__ __forceinline__ uint64_t policy_evict_last()
{
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* Drops the 128-byte line at p (128-aligned) from L2 without writing it back: for workspace
 * that has been read for the last time. */
__device__ __forceinline__ void discard_line(const void *p)
{
    asm volatile("discard.global.L2 [%0], 128;" ::"l"(p) : "memory");
}

__device__ __forceinline__ int32_t ld_relaxed(const int32_t *p)
{
    int32_t v;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(int32_t *p, int32_t v)
{
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ int32_t ld_acquire(const int32_t *p)
{
    int32_t v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* A warp's staged subtile: the page segments of its (up to) 16 tokens as the page holds them,
 * copied by the whole warp in 16-byte units (every sector read whole, once). Key chunks, then
 * value chunks, each chunk a row of 16 tokens x 16 bytes, then the key metadata (KG groups) and
 * the value metadata (VG groups), each group 16 words, [group][token] as in the page. Inside a chunk row, token t sits at unit t ^ swizzle(chunk), so that the
 * fragment reads (thread (gr, tc): key run tc of tokens gr, gr + 8; value run gr of tokens 2tc,
 * 2tc + 1, 2tc + 8, 2tc + 9) hit distinct banks within each phase of a warp's load. */
template <int KB, int VB, int D, int KG, int VG>
struct stage_layout {
    static constexpr int KBYTES = D / 4 * KB / 8, VBYTES_RAW = D / 8 * VB / 8; /* runs */
    static constexpr int VBYTES = VBYTES_RAW < 4 ? 4 : VBYTES_RAW; /* 2-byte runs: a word */
    static constexpr int KW = KBYTES / 4, VW = VBYTES / 4;
    static constexpr bool KQ = KB < 16, VQ = VB < 16;
    static constexpr int KC = D * KB / 128, VC = D * VB / 128; /* 16-byte chunks per token */
    static constexpr int ROUNDS = (KC + VC + 1) / 2;            /* copy rounds (2 chunks each) */
    /* Quantized keys and values of up to 8 chunks: a lane copies whole tokens (run_item). */
    static constexpr bool WHOLE = KQ && VQ && KC + VC <= 8;
    static constexpr int META = (KC + VC) * 256;  /* key metadata, group g at META + 64 g */
    static constexpr int VMETA = META + 64 * KG;  /* value metadata, group g at VMETA + 64 g */
    static constexpr int BYTES_PER_SUBTILE = META + (KQ || VQ ? 64 * (KG + VG) : 0); /* per warp */
    /* Subtiles per stage: fewer, larger stages for small subtiles (one wait and one barrier per
     * stage); three stages, two where a stage is large, so that 12 warps fit an SM. The
     * thresholds are tuning (decode_tuning.h). */
    static constexpr int NT = BYTES_PER_SUBTILE <= mkv_decode_tuning::stage4_max_subtile_bytes ? 4
                              : BYTES_PER_SUBTILE <= mkv_decode_tuning::stage2_max_subtile_bytes ? 2 : 1;
    static constexpr int STAGES = NT * BYTES_PER_SUBTILE > mkv_decode_tuning::stage3_max_bytes ? 2 : 3;
    static constexpr int WARP_BYTES = STAGES * NT * BYTES_PER_SUBTILE;
    /* Byte offset of token t of key chunk c, of value chunk c. */
    __device__ static __forceinline__ int key_at(int c, int t)
    {
        const int x = KBYTES >= 16 ? (2 * (c / (KBYTES / 16))) & 7 : KBYTES == 8 ? 4 * c : 0;
        return (c * 16 + (t ^ x)) * 16;
    }
    __device__ static __forceinline__ int value_at(int c, int t)
    {
        const int y = (c / (VBYTES_RAW >= 16 ? VBYTES_RAW / 16 : 1)) & 1;
        return ((KC + c) * 16 + (t ^ y)) * 16;
    }
};

/* The block's scalars, after the staging areas (which start the dynamic shared memory, so that
 * their swizzle keeps its bank pattern). */
struct region_info {
    int64_t rs, region;
    int32_t hi, n, items_hi, n_items, arrivals;
    int32_t first_id; /* the decode id of its block x = 0 */
};

struct block_shared {
    region_info reg; /* the fused kernel's current region (kept here, not in registers, across
                        the items) */
    int32_t cmd, arg, last;
    int32_t nap;             /* thread 0's: its next pause (ns) while nothing is to be taken */
    int32_t owed, exhausted; /* thread 0's: the score job ticket it holds (-1: none); whether
                                every decode id has been taken */
    float M[MKV_FAST_MAX_G], S[MKV_FAST_MAX_G], lse[MKV_FAST_MAX_G];
};

/* Subtiles per softmax step: all of a stage's where it holds two or four (one max, rescale
 * test and value-scale reduction per 32 or 64 tokens instead of 16). Four need the 3-block
 * bound of decode_kernel's __launch_bounds__ to stay at 168 registers. */
template <int KB, int VB, int D, int KG, int VG>
__host__ __device__ constexpr int step_subtiles()
{
    return stage_layout<KB, VB, D, KG, VG>::NT >= 4 ? 4 : stage_layout<KB, VB, D, KG, VG>::NT >= 2 ? 2 : 1;
}

/* Run R (BYTES bytes: run R of a vector is its bytes [R * BYTES, (R + 1) * BYTES)) of staged
 * token t, where at(c, t) is the byte offset of token t's unit in chunk row c. 2-byte runs: the
 * word holding the run, shifted down for odd R. */
template <int BYTES, int W, typename At>
__device__ __forceinline__ void load_run(const uint8_t *sub, At at, int R, int t, uint32_t (&w)[W])
{
    if constexpr (BYTES >= 16) {
#pragma unroll
        for (int i = 0; i < BYTES / 16; i++) {
            const uint4 v = *reinterpret_cast<const uint4 *>(sub + at(R * (BYTES / 16) + i, t));
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if constexpr (BYTES == 8) {
        const uint2 v = *reinterpret_cast<const uint2 *>(sub + at(R / 2, t) + R % 2 * 8);
        w[0] = v.x, w[1] = v.y;
    } else if constexpr (BYTES == 4) {
        w[0] = *reinterpret_cast<const uint32_t *>(sub + at(R / 4, t) + R % 4 * 4);
    } else {
        static_assert(BYTES == 2, "runs of 2 to 16n bytes");
        w[0] = *reinterpret_cast<const uint32_t *>(sub + at(R / 8, t) + R % 8 / 2 * 4) >> (16 * (R & 1));
    }
}

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

/* Where a warp's item sits: the section's tokens [ta, tb) of head-region rs, item slot slot_id
 * (the row of its partial result and of its logits in the workspace). */
struct item_pos {
    int64_t rs, region;
    int32_t sec, sec_n, ta, tb, slot_id; /* sec_n: the section's token count */
};

/* One warp's item: the logits of its tokens (to the workspace), and its unnormalised partial
 * output, running max and sum. */
template <int KB, int VB, int D, int KG, int VG, bool FUSED, int RG>
__device__ __forceinline__ void run_item(const fast_args &a, uint8_t *smem, const item_pos &ip)
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
    const fast_section L = a.sec[sec];
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
    /* Compact logits (fast_args): lg is then the lane's word of lg_a (token gr, pair tc),
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
    const int64_t part = (rs * 2 * a.sec_items + ip.slot_id) * G;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int32_t h = 2 * tc + i;
        if (h >= G) continue;
        float *po = a.part_o + (part + h) * D + gr * VRUN;
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
        if (gr == 0)
            *reinterpret_cast<float2 *>(a.part_ml + (part + h) * 2) = make_float2(m[i], lsum[i]);
    }
}


/* Where block x (along grid x) of region (sequence j, KV head h) puts warp warp: x <
 * blocks_per_sec in the one section of the launch (sec_mask 1 or 2), or for both (sec_mask 3)
 * the high section's blocks first, then the low one's, then none; each block MKV_FAST_WARPS
 * consecutive items of its section. any: whether the block has an item at all (a region's
 * blocks with one are x < arrivals); n_items: the region's items, high then low (its item
 * slots). */
struct block_pos {
    item_pos ip;
    bool work, any;
    int32_t items_hi, n_items, hi, n, arrivals;
    int32_t bta, btb; /* the block's tokens [bta, btb) of its section */
};

__device__ __forceinline__ block_pos locate(const fast_args &a, int32_t bx, int32_t hh, int32_t j)
{
    block_pos b;
    const int32_t warp = threadIdx.x >> 5, W = MKV_FAST_WARPS;
    item_pos &ip = b.ip;
    ip.rs = (int64_t)j * a.H + hh; /* (sequence, KV head) */
    ip.region = a.regions[ip.rs];
    const int64_t nh = max(a.n_hi[ip.region], 0), nl = max(a.n_lo[ip.region], 0);
    const int32_t n = (int32_t)min(nh + nl, (int64_t)a.max_tokens);
    const int32_t hi = (int32_t)min(nh, (int64_t)n), I = a.item_tokens;
    b.hi = hi, b.n = n;
    b.items_hi = (hi + I - 1) / I;
    b.n_items = b.items_hi + (n - hi + I - 1) / I;
    const int32_t bh = (b.items_hi + W - 1) / W; /* the high section's blocks */
    b.arrivals = bh + (b.n_items - b.items_hi + W - 1) / W;
    int32_t sec;
    if (a.sec_mask == 3) {
        sec = bx >= bh;
        bx -= sec * bh;
    } else {
        sec = a.sec_mask == 2;
    }
    ip.sec = sec;
    ip.sec_n = sec ? n - hi : hi;
    const int32_t item = bx * W + warp; /* within the section */
    ip.ta = item * I;
    ip.tb = min(ip.ta + I, ip.sec_n);
    ip.slot_id = sec ? b.items_hi + item : item;
    b.bta = bx * W * I;
    b.btb = min(b.bta + W * I, ip.sec_n);
    b.work = ip.ta < ip.sec_n; /* warp-uniform */
    b.any = (int64_t)bx * W * I < ip.sec_n; /* block-uniform */
    return b;
}

/* The final M, S and lse of every head of the region into bs (warp w takes heads w,
 * w + MKV_FAST_WARPS); block-wide, ends with a barrier. */
__device__ __forceinline__ void region_ms(const fast_args &a, int64_t rs, int32_t n_items, block_shared &bs)
{
    const int32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t part = rs * 2 * a.sec_items;
    for (int32_t g = warp; g < a.G; g += MKV_FAST_WARPS) {
        const float2 ms = head_ms(a, part, n_items, g);
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
    static constexpr int32_t NTH = MKV_FAST_WARPS * 32;
    static constexpr int32_t AREA = AREA_; /* the block's staging area */
    static constexpr int32_t IDS = 128;                      /* page ids per score chunk */
    static constexpr int32_t HALF = AREA / 2 - IDS * 4;      /* logits per score chunk */
    static constexpr int32_t EMAX = (MKV_FAST_MAX_G * D + NTH - 1) / NTH; /* outputs per thread */
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

    /* out = the items' partial outputs, each weighted by 2^(m - M) / S: chunks of whole items
     * (outputs, then max and sum), weights computed once per item and head. */
    static __device__ __forceinline__ void merge(const fast_args &a, uint8_t *smem, const region_info &g,
                                                 const float *M, const float *S)
    {
        const int32_t tid = threadIdx.x, G = a.G, GD = G * D;
        const int32_t per_item = GD * 4 + G * 12; /* outputs, max and sum, weight */
        const int32_t c = AREA / per_item;
        float *po = reinterpret_cast<float *>(smem);
        const uint32_t po_s = (uint32_t)__cvta_generic_to_shared(smem);
        const int64_t part = g.rs * 2 * a.sec_items;
        float o[EMAX];
#pragma unroll
        for (int j = 0; j < EMAX; j++) o[j] = 0.0f;
        for (int32_t s0 = 0; s0 < g.n_items; s0 += c) {
            const int32_t cnt = min(c, g.n_items - s0);
            float *ml = po + cnt * GD, *w = ml + cnt * G * 2;
            const uint32_t ml_s = po_s + cnt * GD * 4;
            const uint8_t *src_o = reinterpret_cast<const uint8_t *>(a.part_o + (part + s0) * GD);
            const uint8_t *src_ml = reinterpret_cast<const uint8_t *>(a.part_ml + (part + s0) * G * 2);
            for (int32_t off = tid * 16; off < cnt * GD * 4; off += NTH * 16)
                cp_async<16>(po_s + off, src_o + off, true);
            for (int32_t off = tid * 8; off < cnt * G * 8; off += NTH * 8)
                cp_async<8>(ml_s + off, src_ml + off, true);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
            for (int32_t i = tid; i < cnt * G; i += NTH) w[i] = exp2f(ml[2 * i] - M[i % G]);
            __syncthreads();
#pragma unroll
            for (int j = 0; j < EMAX; j++) {
                const int32_t e = tid + j * NTH;
                if (e >= GD) break;
                const int32_t h = e / D;
                for (int32_t s = 0; s < cnt; s++) o[j] = fmaf(po[s * GD + e], w[s * G + h], o[j]);
            }
            __syncthreads(); /* the next chunk reuses the area */
        }
#pragma unroll
        for (int j = 0; j < EMAX; j++) {
            const int32_t e = tid + j * NTH;
            if (e >= GD) break;
            const float r = o[j] / S[e / D];
            if (a.out16) a.out16[g.rs * GD + e] = a.out_bf16 ? mkv_f32_to_bf16(r) : mkv_f32_to_f16(r);
            else a.out[g.rs * GD + e] = r;
        }
    }

    /* The score write-back of tokens [t0, t1) of section s (t0 a multiple of 64): every token's
     * probability, the maximum over the group of 2^(l - lse_g), added to its score slot, from
     * the logits; then (discard) the logits dropped from L2. Two buffers: the next chunk's
     * logits and page ids are on their way while this one is scored. */
    static __device__ __forceinline__ void scores(const fast_args &a, uint8_t *smem, const section_tokens &s,
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
     * probability is the maximum over the group of y 2^(R - lse_g). STEP: the section's
     * tokens per softmax step; RG: the grid of the maxima (run_item), a divisor of STEP. */
    template <int32_t STEP, int32_t RG>
    static __device__ __forceinline__ void scores_compact(const fast_args &a, uint8_t *smem,
                                                          const section_tokens &s, int32_t t0,
                                                          int32_t t1, const float *lse)
    {
        static_assert(STEP % RG == 0 && 64 % STEP == 0, "steps of 16, 32 or 64 tokens on a grid dividing them");
        const int32_t tid = threadIdx.x, G = a.G, G2 = (G + 1) / 2;
        if (t1 <= t0) return;
        /* Tokens per chunk: a multiple of 64 (whole steps, 16-byte aligned runs), its pages
         * within IDS. Per 64 tokens: G2 x (256 bytes of codes, 64 of nibbles, 512 / RG of
         * maxima). */
        const int32_t per64 = G2 * (320 + 512 / RG);
        const int32_t chunk = min(HALF / per64 * 64, (IDS - 2) * s.tpp) & ~63;
        const int32_t n_chunks = (t1 - t0 + chunk - 1) / chunk;
        const int64_t n = a.lg_n;
        /* Buffer b at b * (AREA / 2): page ids, then codes [G2][chunk], nibbles [G2][chunk],
         * maxima [G2][chunk / RG][2] (a step's at its first token's grid slot). */
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
            /* Each step maximum R becomes its codes' factor 2^(R - lse_g) / MKV_FAST_YSCALE, in
             * place (0 for the missing head of an odd G's last pair). */
            const int32_t spc = chunk / RG, nr = 2 * PAIRS * spc;
            for (int32_t i = tid; i < nr; i += NTH) {
                const int32_t h = 2 * (i / (2 * spc)) + (i & 1);
                cr[i] = h < G ? ex2(cr[i] - lse[h]) * (1.0f / MKV_FAST_YSCALE) : 0.0f;
            }
            __syncthreads();
            /* Four tokens per thread (one step, one page: pages hold a multiple of 16 tokens):
             * 16 bytes of codes and 4 of nibbles per pair, and one 16-byte reduction. */
            for (int32_t k = k0 + 4 * tid; k < k1; k += 4 * NTH) {
                const int32_t i = k - k0;
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int32_t j = 0; j < PAIRS; j++) {
                    const uint4 w4 = *reinterpret_cast<const uint4 *>(ca + (j * chunk + i) * 4);
                    const uint32_t b = *reinterpret_cast<const uint32_t *>(cb + j * chunk + i);
                    const float2 f = *reinterpret_cast<const float2 *>(cr + (j * spc + i / STEP * (STEP / RG)) * 2);
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
            switch (G2) { /* G <= MKV_FAST_MAX_G = 8 */
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

/*
 * Separate score pass (a.fused 0): grid (grid_x, H, n_seq); a block runs its items and ends;
 * fast_finalize then merges and writes the scores back.
 *
 * Fused (a.fused 1, one launch covering both sections): a persistent grid. Each block loops
 * over two kinds of work, taken from counters in the workspace:
 *   - score jobs first (so that logits leave L2 soon): a decode block id whose region is
 *     complete; the block adds its tokens' probabilities to their score slots from the logits
 *     (stored evict_last) and the region's log-sum-exp, then drops the logits from L2;
 *   - decode blocks, in id order: the items' logits and partial results, then an arrival at the
 *     region's counter. The region's last block to arrive stores the region's log-sum-exp,
 *     publishes the region's blocks as score jobs and merges the items into out.
 * Spreading a region's write-back over many blocks at once, as soon as it is complete, keeps
 * more of its logits in L2 than one block writing it all back (which drains a region slowly,
 * while the page stream evicts its logits to DRAM). Nobody waits for another block's work
 * except to end: a block leaves once every id is done and every score job taken.
 */
/* A section format of a kernel: key and value bits, quantization groups a side. */
template <int KB_, int VB_, int KG_, int VG_>
struct fast_fmt {
    static constexpr int KB = KB_, VB = VB_, KG = KG_, VG = VG_;
};

/* What a kernel for the high section's format HI and the low one's LO (the same type for a
 * one-format kernel) needs from both: the larger staging area, the finer step of the compact
 * logits' maxima (RG), and 3 blocks per SM (168 registers) where either format has four-subtile
 * stages or several key groups (without the bound the compiler takes more registers and the
 * kernel keeps 2 blocks per SM). */
template <int D, class HI, class LO>
struct kernel_shape {
    using SH = stage_layout<HI::KB, HI::VB, D, HI::KG, HI::VG>;
    using SLO = stage_layout<LO::KB, LO::VB, D, LO::KG, LO::VG>;
    static constexpr int STEP_HI = 16 * step_subtiles<HI::KB, HI::VB, D, HI::KG, HI::VG>();
    static constexpr int STEP_LO = 16 * step_subtiles<LO::KB, LO::VB, D, LO::KG, LO::VG>();
    static constexpr int RG = STEP_HI < STEP_LO ? STEP_HI : STEP_LO;
    static constexpr int WARP_BYTES = SH::WARP_BYTES > SLO::WARP_BYTES ? SH::WARP_BYTES : SLO::WARP_BYTES;
    static constexpr int SMEM = MKV_FAST_WARPS * WARP_BYTES + (int)sizeof(block_shared);
    static constexpr bool ONE = std::is_same<HI, LO>::value;
    static constexpr int MIN_BLOCKS = SH::NT >= 4 || HI::KG > 1 || SLO::NT >= 4 || LO::KG > 1 ? 3 : 0;
};

/* The warp's item in its section's format. */
template <int D, class HI, class LO, bool FUSED>
__device__ __forceinline__ void run_section_item(const fast_args &a, uint8_t *smem, const item_pos &ip)
{
    constexpr int RG = kernel_shape<D, HI, LO>::RG;
    if (kernel_shape<D, HI, LO>::ONE || ip.sec == 0)
        run_item<HI::KB, HI::VB, D, HI::KG, HI::VG, FUSED, RG>(a, smem, ip);
    else
        run_item<LO::KB, LO::VB, D, LO::KG, LO::VG, FUSED, RG>(a, smem, ip);
}

template <int D, class HI, class LO>
__global__ void __launch_bounds__(MKV_FAST_WARPS * 32, kernel_shape<D, HI, LO>::MIN_BLOCKS) decode_kernel(const fast_args a)
{
    using K = kernel_shape<D, HI, LO>;
    extern __shared__ __align__(16) uint8_t smem[];
    block_shared &bs = *reinterpret_cast<block_shared *>(smem + MKV_FAST_WARPS * K::WARP_BYTES);
    const int32_t tid = threadIdx.x;
    using RF = region_finish<D, MKV_FAST_WARPS * K::WARP_BYTES>;

    if (!a.fused) {
        const block_pos b = locate(a, blockIdx.x, blockIdx.y, blockIdx.z);
        if (b.work) run_section_item<D, HI, LO, false>(a, smem, b.ip);
        return;
    }

    int32_t *const next_id = a.counters + a.n_rs, *const sq_head = next_id + 1;
    int32_t *const sq_tail = next_id + 2, *const finished = next_id + 3, *const jobs = next_id + 4;
    const int32_t gx = a.grid_x, total = a.total_ids;
    if (tid == 0) bs.owed = -1, bs.exhausted = 0, bs.nap = 256;
    enum { EXIT, RETRY, DECODE, SCORE };
    for (;;) {
        if (tid == 0) {
            int32_t cmd = RETRY, arg = 0, owed = bs.owed;
            bool exhausted = bs.exhausted;
            /* A ticket when jobs seem to be waiting; it may name a job published later. */
            if (owed < 0 && ld_relaxed(sq_head) < ld_relaxed(sq_tail)) {
                owed = atomicAdd(sq_head, 1);
                if (owed >= total) owed = -1; /* past any job there can be */
            }
            if (owed >= 0 && (arg = ld_acquire(jobs + owed)) >= 0) {
                cmd = SCORE, owed = -1;
            } else if (!exhausted) {
                arg = atomicAdd(next_id, 1);
                if (arg < total) cmd = DECODE;
                else exhausted = true;
            } else if (ld_acquire(finished) == total) { /* every job is published */
                const int32_t tail = ld_relaxed(sq_tail);
                if (owed >= tail) owed = -1; /* a ticket past the last job */
                if (owed >= 0) {
                    while ((arg = ld_acquire(jobs + owed)) < 0) __nanosleep(32);
                    cmd = SCORE, owed = -1;
                } else if (ld_relaxed(sq_head) >= tail) {
                    cmd = EXIT;
                }
            } else {
                /* Nothing to take until a region completes: a backoff of 256 ns doubling to
                 * 2 us (every idle block of the call's tail polls these counters). */
                __nanosleep(bs.nap);
                bs.nap = min(2 * bs.nap, 2048);
            }
            if (cmd != RETRY) bs.nap = 256;
            bs.cmd = cmd, bs.arg = arg, bs.owed = owed, bs.exhausted = exhausted;
        }
        __syncthreads();
        const int32_t cmd = bs.cmd, id = bs.arg;
        __syncthreads(); /* bs.cmd is rewritten in the next round */
        if (cmd == EXIT) break;
        if (cmd == RETRY) continue;
        const int32_t r = id / gx, bx = id - r * gx;

        if (cmd == SCORE) {
            const block_pos b = locate(a, bx, r % a.H, r / a.H);
            if (tid < a.G) bs.lse[tid] = __ldcg(a.lse + b.ip.rs * a.G + tid);
            __syncthreads();
            const section_tokens s = section_of_region(a, b.ip.rs, b.ip.region, b.ip.sec, b.hi, b.n, b.items_hi);
            if (!a.compact) RF::scores(a, smem, s, b.bta, b.btb, bs.lse);
            else if (K::ONE || b.ip.sec == 0) RF::template scores_compact<K::STEP_HI, K::RG>(a, smem, s, b.bta, b.btb, bs.lse);
            else RF::template scores_compact<K::STEP_LO, K::RG>(a, smem, s, b.bta, b.btb, bs.lse);
            __syncthreads(); /* bs.lse is rewritten in the next round */
            continue;
        }

        /* DECODE */
        bool any;
        {
            const block_pos b = locate(a, bx, r % a.H, r / a.H);
            if (tid == 0) bs.reg = {b.ip.rs, b.ip.region, b.hi, b.n, b.items_hi, b.n_items, b.arrivals, r * gx};
            any = b.any;
            if (b.work) run_section_item<D, HI, LO, true>(a, smem, b.ip);
        }
        if (any) {
            /* Arrive (release: the barrier orders every thread's results before thread 0's
             * fence, which is cumulative, and its increment; the pattern of a grid sync. One
             * fence, not a MEMBAR.SC in each of the block's threads). */
            __syncthreads();
            const region_info &g = bs.reg;
            if (tid == 0) {
                __threadfence();
                bs.last = atomicAdd(a.counters + g.rs, 1) == g.arrivals - 1;
                __threadfence(); /* acquire, for the last one */
            }
            __syncthreads();
            if (bs.last) {
                region_ms(a, g.rs, g.n_items, bs);
                /* The region's lse, visible before its score jobs are. */
                if (tid < a.G) a.lse[g.rs * a.G + tid] = bs.lse[tid];
                __threadfence();
                __syncthreads();
                if (tid == 0) bs.arg = atomicAdd(sq_tail, g.arrivals);
                __syncthreads();
                for (int32_t i = tid; i < g.arrivals; i += MKV_FAST_WARPS * 32)
                    st_release(jobs + bs.arg + i, g.first_id + i); /* its blocks: x < arrivals */
                RF::merge(a, smem, g, bs.M, bs.S);
            }
        }
        __syncthreads(); /* bs is reused */
        if (tid == 0) {
            __threadfence();
            atomicAdd(finished, 1);
        }
    }
}

} // namespace mkv_fast

/* One translation unit per (key bits, value bits, head_dim), generated by CMake: the kernel
 * with one quantization group a side, and the one with the library's default groups where
 * they differ and groups_supported takes them. mkv_fast_get_K<KB>V<VB>_d<D>(kg, vg) returns
 * the variant for kg key and vg value groups ({NULL, NULL} if none). A two-format translation
 * unit (MKV_DECODE_FAST_MIX_INSTANCE) holds the kernel that runs a high section of one format
 * and a low section of another in one launch, for one group a side or the default groups. */
namespace mkv_fast {

/* The shared-memory opt-in above 48 KB and the occupancy it gives, once per device and
 * variant (both are per-device function state; asking every call cost host time per layer).
 * Returns blocks per multiprocessor, 0 when the opt-in failed. */
template <int D, class HI, class LO>
int variant_setup(void)
{
    static std::atomic<int> cache[MKV_MAX_DEVICES]; /* 0: not yet; -1: failed; else blocks */
    constexpr int smem = kernel_shape<D, HI, LO>::SMEM;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MKV_MAX_DEVICES) {
        (void)cudaGetLastError();
        dev = -1;
    } else {
        const int c = cache[dev].load(std::memory_order_relaxed);
        if (c != 0) return c > 0 ? c : 0;
    }
    int n = 0;
    if (cudaFuncSetAttribute(decode_kernel<D, HI, LO>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel<D, HI, LO>, MKV_FAST_WARPS * 32, smem) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    if (dev >= 0) cache[dev].store(n > 0 ? n : -1, std::memory_order_relaxed);
    return n;
}

template <int D, class HI, class LO>
cudaError_t launch_variant(const fast_args &a, dim3 grid, cudaStream_t stream)
{
    if (variant_setup<D, HI, LO>() <= 0) return cudaErrorInvalidValue;
    decode_kernel<D, HI, LO><<<grid, MKV_FAST_WARPS * 32, kernel_shape<D, HI, LO>::SMEM, stream>>>(a);
    return cudaGetLastError();
}

template <int D, class HI, class LO>
fast_kernel kernel_of(void)
{
    return fast_kernel{launch_variant<D, HI, LO>, variant_setup<D, HI, LO>};
}

/* A format's default groups a side at head_dim D (one for 16-bit vectors). */
template <int KB, int VB, int D>
using default_fmt = fast_fmt<KB, VB, KB == 16 ? 1 : MKV_DEFAULT_GROUPS(D, KB, 0), VB == 16 ? 1 : MKV_DEFAULT_GROUPS(D, VB, 1)>;

template <int KB, int VB, int D>
constexpr bool has_default_variant()
{
    using F = default_fmt<KB, VB, D>;
    return (F::KG != 1 || F::VG != 1) && groups_supported<KB, VB, D, F::KG, F::VG>();
}

template <int KB, int VB, int D>
fast_kernel get_variant(int32_t kg, int32_t vg)
{
    using ONE = fast_fmt<KB, VB, 1, 1>;
    if (kg == 1 && vg == 1) return kernel_of<D, ONE, ONE>();
    if constexpr (has_default_variant<KB, VB, D>()) {
        using F = default_fmt<KB, VB, D>;
        if (kg == F::KG && vg == F::VG) return kernel_of<D, F, F>();
    }
    return fast_kernel{nullptr, nullptr};
}

/* The two-format kernel: one group a side on both sections, or the default groups on both. */
template <int KBH, int VBH, int KBL, int VBL, int D>
fast_kernel get_mix_variant(int32_t kgh, int32_t vgh, int32_t kgl, int32_t vgl)
{
    if (kgh == 1 && vgh == 1 && kgl == 1 && vgl == 1)
        return kernel_of<D, fast_fmt<KBH, VBH, 1, 1>, fast_fmt<KBL, VBL, 1, 1>>();
    if constexpr (has_default_variant<KBH, VBH, D>() && has_default_variant<KBL, VBL, D>()) {
        using FH = default_fmt<KBH, VBH, D>;
        using FL = default_fmt<KBL, VBL, D>;
        if (kgh == FH::KG && vgh == FH::VG && kgl == FL::KG && vgl == FL::VG) return kernel_of<D, FH, FL>();
    }
    return fast_kernel{nullptr, nullptr};
}

} // namespace mkv_fast

#define MKV_DECODE_FAST_INSTANCE(KB, VB, D)                                                    \
    fast_kernel mkv_fast_get_K##KB##V##VB##_d##D(int32_t kg, int32_t vg)                       \
    {                                                                                          \
        return mkv_fast::get_variant<KB, VB, D>(kg, vg);                                       \
    }

#define MKV_DECODE_FAST_MIX_INSTANCE(KBH, VBH, KBL, VBL, D)                                    \
    fast_kernel mkv_fast_get_K##KBH##V##VBH##_K##KBL##V##VBL##_d##D(int32_t kgh, int32_t vgh,  \
                                                                    int32_t kgl, int32_t vgl)  \
    {                                                                                          \
        return mkv_fast::get_mix_variant<KBH, VBH, KBL, VBL, D>(kgh, vgh, kgl, vgl);           \
    }

#endif /* MKV_ATTENTION_DECODE_FAST_CUH */
