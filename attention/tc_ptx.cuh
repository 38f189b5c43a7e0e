/*
 * tc_ptx.cuh — the PTX the tensor-core decode kernels issue, each instruction behind a small
 * inline wrapper: the mma products and fragment moves, fp16x2 arithmetic, the MUFU exponent
 * and logarithm, cp.async with its groups and L2 cache policies, stores and reductions under
 * cache hints, the loads and stores with memory ordering of the fused kernel's job queue, and
 * programmatic dependent launch.
 * Part of the kernel template (tc_decode.cuh); tc_merge.cuh and the finalize kernel
 * (decode_tc_finalize.cu) use ex2 and red_add too.
 */
#ifndef MKV_ATTENTION_TC_PTX_CUH
#define MKV_ATTENTION_TC_PTX_CUH

#include <cuda_runtime.h>

#include <stdint.h>

namespace mkv_tc {

/* ---------------------------------------------------------------------------------------- */
/* Tensor cores: mma products and fragment moves                                            */
/* ---------------------------------------------------------------------------------------- */

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

/* ldmatrix: four 8x8 b16 matrices, rows from the addresses of lanes 8i .. 8i + 7 for matrix i;
 * lane (gr, tc) receives word tc of row gr of each. */
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* ---------------------------------------------------------------------------------------- */
/* fp16x2 arithmetic and the MUFU exponent and logarithm                                    */
/* ---------------------------------------------------------------------------------------- */

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

/* 2^x and log2(x) as the hardware approximates them (MUFU, relative error ~2^-22), with
 * subnormal inputs and results flushed to zero: exp2f and log2f add a range fix-up of three
 * instructions each for subnormals, which the softmax does not need (a weight below 2^-126 is
 * zero to every sum it enters). ex2(0) is exactly 1 and ex2(-inf) is 0. */
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float lg2(float x)
{
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* ---------------------------------------------------------------------------------------- */
/* cp.async into shared memory, its groups, and L2 cache policies                           */
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

/* cp_async_page of 16 or 4 bytes from base + off (the sum formed inside the copy's asm, so that
 * the compiler does not compute every copy's address up front, nor each from the page id). */
template <int BYTES, bool FIRST>
__device__ __forceinline__ void cp_async_page_at(uint32_t dst, const uint8_t *base, int32_t off, bool read)
{
    static_assert(BYTES == 16 || BYTES == 4, "16- or 4-byte copies");
    const int n = read ? BYTES : 0;
    if constexpr (FIRST && BYTES == 16)
        asm volatile("{\n\t.reg .s64 o;\n\t.reg .u64 s;\n\tcvt.s64.s32 o, %2;\n\tadd.u64 s, %1, o;\n\t"
                     "cp.async.cg.shared.global.L2::cache_hint [%0], [s], 16, %3, %4;\n\t}" ::"r"(dst),
                     "l"(base), "r"(off), "r"(n), "l"(policy_evict_first()) : "memory");
    else if constexpr (BYTES == 16)
        asm volatile("{\n\t.reg .s64 o;\n\t.reg .u64 s;\n\tcvt.s64.s32 o, %2;\n\tadd.u64 s, %1, o;\n\t"
                     "cp.async.cg.shared.global [%0], [s], 16, %3;\n\t}" ::"r"(dst), "l"(base), "r"(off), "r"(n)
                     : "memory");
    else if constexpr (FIRST)
        asm volatile("{\n\t.reg .s64 o;\n\t.reg .u64 s;\n\tcvt.s64.s32 o, %2;\n\tadd.u64 s, %1, o;\n\t"
                     "cp.async.ca.shared.global.L2::cache_hint [%0], [s], 4, %3, %4;\n\t}" ::"r"(dst),
                     "l"(base), "r"(off), "r"(n), "l"(policy_evict_first()) : "memory");
    else
        asm volatile("{\n\t.reg .s64 o;\n\t.reg .u64 s;\n\tcvt.s64.s32 o, %2;\n\tadd.u64 s, %1, o;\n\t"
                     "cp.async.ca.shared.global [%0], [s], 4, %3;\n\t}" ::"r"(dst), "l"(base), "r"(off), "r"(n)
                     : "memory");
}

/* A hint: the 128-byte line holding p into L2; nothing waits for it and it holds no register
 * (small calls: q and the page table's row ends start their way while the block's first
 * dependent loads are in flight). */
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* ---------------------------------------------------------------------------------------- */
/* Global stores and reductions under cache hints; loads and stores with ordering           */
/* ---------------------------------------------------------------------------------------- */

__device__ __forceinline__ uint64_t policy_evict_last()
{
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
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

/* Stores of logits where w, predicated (no branch: the item loop keeps one path) and plain
 * (the separate pass's: an L2 policy operand cost two uniform-register moves a store, and the
 * policy measured no gain there; H200, decision 90). */
__device__ __forceinline__ void st_logit_if(bool w, float *p, float x)
{
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q st.global.f32 [%0], %1;\n\t}" ::"l"(p), "f"(x),
                 "r"((int)w) : "memory");
}

__device__ __forceinline__ void st_logit_if(bool w, float *p, float x, float y)
{
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %3, 0;\n\t@q st.global.v2.f32 [%0], {%1, %2};\n\t}" ::"l"(p),
                 "f"(x), "f"(y), "r"((int)w) : "memory");
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

/* Drops the 128-byte line at p (128-aligned) from L2 without writing it back: for workspace
 * that has been read for the last time. */
__device__ __forceinline__ void discard_line(const void *p)
{
    asm volatile("discard.global.L2 [%0], 128;" ::"l"(p) : "memory");
}

/* score += v as a fire-and-forget reduction in L2: no load waits on it. Each slot has one writer
 * per call, so this is the load, add and store it replaces, except that the add flushes
 * subnormals (below 1.2e-38) to zero. */
__device__ __forceinline__ void red_add(float *score, float v)
{
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(score), "f"(v) : "memory");
}

/* red_add of four consecutive slots (16-byte aligned) in one reduction. */
__device__ __forceinline__ void red_add4(float *score, float v0, float v1, float v2, float v3)
{
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(score), "f"(v0), "f"(v1),
                 "f"(v2), "f"(v3) : "memory");
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

/* Named barrier id of n threads (whole warps, warp-uniform): arrive without waiting, or wait
 * for the others' arrivals; memory ordered as bar.sync orders it among the participants. */
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

__device__ __forceinline__ int32_t ld_acquire(const int32_t *p)
{
    int32_t v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* An arrival: *p += 1 with release and acquire semantics at GPU scope (one instruction where
 * a fence, the add and another fence had each waited on its own round trip); returns the old
 * value. After a block barrier, thread 0's release covers the block's writes (cumulativity). */
__device__ __forceinline__ int32_t atom_add_acq_rel(int32_t *p, int32_t v)
{
    int32_t old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

/* Programmatic dependent launch (sm_90): a kernel launched with programmatic stream
 * serialization (launch_pdl) may start before the kernel ahead of it in the stream has ended,
 * once each of that kernel's blocks has run griddep_launch_dependents (or ended);
 * griddep_wait then waits for that kernel's end and its memory. Both are no-ops in a kernel
 * launched without the attribute. */
__device__ __forceinline__ void griddep_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void griddep_launch_dependents(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_PTX_CUH */
