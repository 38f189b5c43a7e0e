/*
 * decode_fast.h — internal interface of the tensor-core decode kernels (CUDA only; the public
 * entry point is mkv_cuda_decode in decode_cuda.h, which chooses between these and the generic
 * kernels of decode_cuda.cu). Design and numerics: docs/decode-kernel.md, "The tensor-core
 * kernels".
 *
 * One kernel per (key bits, value bits, head_dim), each in its own generated translation unit
 * (CMake's MIXKV_DECODE_FAST_FORMATS and MIXKV_DECODE_FAST_DIMS list the instantiated ones).
 * A warp takes one item: up to item_tokens consecutive tokens of one section (high or low) of
 * one head-region, for all G <= 8 query heads of the group at once, and writes the item's
 * unnormalised partial output, running max and sum to the workspace together with every
 * token's logits. Then the items of each head-region are merged into out and each token's
 * probability (the maximum over the group) is added to its score slot: either inside the same
 * kernel (fused: the region's last block merges, and its blocks become score jobs for
 * whichever block is free), or by a separate pass, mkv_fast_finalize.
 */
#ifndef MKV_ATTENTION_DECODE_FAST_H
#define MKV_ATTENTION_DECODE_FAST_H

#include "attention/decode_tuning.h"
#include "quant/format.h"
#include "quant/half.h"

#include <cuda_runtime.h>

#include <math.h>

#include <stdint.h>

#define MKV_FAST_WARPS 4       /* warps (items) per block */
#define MKV_FAST_MAX_G 8       /* query heads per group: the n = 8 side of an m16n8k16 mma */
#define MKV_FAST_MIN_ITEM 64   /* item sizes are powers of two in [64, 4096] */
#define MKV_FAST_MAX_ITEM 4096

/* Where a section's segments sit in its pages (metadata group g of slot t at off_*_meta +
 * (g tpp + t) 4). */
struct fast_section {
    int32_t tpp;                          /* tokens per page */
    int64_t off_key, off_key_meta, off_value, off_value_meta, off_score;
};

struct fast_args {
    const uint8_t *pool;
    int64_t page_bytes;
    const int32_t *table; /* [regions][T] */
    const int32_t *n_hi, *n_lo;
    int32_t T;
    const int64_t *regions; /* [n_seq][H] */
    int32_t H, G;
    int32_t max_tokens;  /* token counts are clamped to it, as in the generic kernels */
    int32_t item_tokens; /* tokens per item, a power of two >= 64 */
    int32_t sec_items;   /* ceil(max_tokens / item_tokens): items per section, at most */
    fast_section sec[2]; /* high, low */
    const float *q;      /* [n_seq][H * G][d] */
    float *out;          /* [n_seq][H * G][d] */
    uint16_t *out16;     /* or, when non-null, here in fp16 (bf16 with out_bf16) */
    int32_t out_bf16;
    float softmax_scale;
    float *logits;  /* [n_seq * H][sec_items + 1][item_tokens][G]: item slot s of a region
                       holds its item's logits, log2 units (already times log2 e) */
    float *part_o;  /* [n_seq * H][2 * sec_items][G][d] unnormalised partial outputs */
    float *part_ml; /* [n_seq * H][2 * sec_items][G][2] partial max (log2 units), sum */
    /* Per launch: which sections this launch covers (1 high, 2 low, 3 both) and its blocks
     * along grid x per region: blocks_per_sec for one section; blocks_per_sec + 1 for both,
     * the high section's blocks first, then the low one's, then none (locate). */
    int32_t sec_mask, blocks_per_sec, grid_x;
    /* Fused score write-back (one launch covering both sections only; a persistent grid):
     * counters [n_rs + 4 + total_ids], the first n_rs + 4 zeroed before the launch (per region
     * arrivals; next decode id, score jobs taken, published, ids done), then the score jobs
     * (decode block ids, -1 before the launch); lse [n_rs][G], each region's log2-sum-exp per
     * head. discard: whether to drop read logits from L2 (the workspace is 128-byte aligned). */
    int32_t fused, discard;
    int32_t n_rs; /* n_seq * H */
    int32_t total_ids;
    int32_t *counters;
    float *lse;
    /* Compact logits (fused calls only, where G >= 2 and both sections' pages hold a multiple
     * of 16 tokens, so that every subtile but an item's last is 16 tokens and a softmax step of
     * the kernel covers a fixed STEP tokens), in place of logits: token x's probability
     * relative to its step's maximum logit R, y = 2^(l - R) in [0, 1], as 20-bit fixed point
     * (code = round(y MKV_FAST_YSCALE)), two heads per pair j < (G + 1) / 2, pair-major:
     * lg_a[j][x] the codes' low 16 bits (head 2j in the low half), lg_b[j][x] their high 4
     * bits (head 2j in the low nibble), lg_r[j][x / STEP][2] the steps' R. x = item slot *
     * item_tokens + token in the item, lg_n = slots * item_tokens (every region's). */
    int32_t compact;
    int64_t lg_n;
    uint32_t *lg_a;
    uint8_t *lg_b;
    float *lg_r;
};

/* The compact logits' fixed-point scale: y = code / MKV_FAST_YSCALE (2^20 - 2, so that y up to
 * 1 plus the rounding of 2^x still rounds below 2^20). */
#define MKV_FAST_YSCALE 1048574.0f

/* Where the compact logits of n_tok token slots at group size G sit from lg_a: lg_b and lg_r
 * at byte offsets off_b and off_r (each array 256-byte aligned), bytes in all (the steps' maxima
 * sized for the shortest step, 16 tokens). */
struct fast_compact_layout {
    size_t off_b, off_r, bytes;
};

inline fast_compact_layout mkv_fast_compact_layout(size_t n_tok, int32_t G)
{
    const size_t g2 = (size_t)(G + 1) / 2, al = 255;
    fast_compact_layout l;
    l.off_b = (n_tok * g2 * 4 + al) & ~al;
    l.off_r = l.off_b + ((n_tok * g2 + al) & ~al);
    l.bytes = l.off_r + (n_tok / 16 + 1) * g2 * 8;
    return l;
}

typedef cudaError_t (*fast_launch_fn)(const fast_args &a, dim3 grid, cudaStream_t stream);

struct fast_kernel {
    fast_launch_fn launch;
    int (*blocks_per_sm)(void); /* resident blocks per multiprocessor (0 on error) */
};

/* The instantiated kernel for a format, head_dim and quantization groups per key and per value
 * vector ({NULL, NULL} if none): one group a side, or the library's defaults where the kernel
 * covers them (decode_fast.cuh, groups_supported). */
fast_kernel mkv_fast_lookup(int32_t key_bits, int32_t value_bits, int32_t head_dim, int32_t key_groups,
                            int32_t value_groups);

/* The instantiated two-format kernel for a high section of the format (hk bits, hv bits, hkg and
 * hvg groups) and a low section of (lk, lv, lkg, lvg) at head_dim: one launch for both
 * sections where the formats differ ({NULL, NULL} if none; CMake's MIXKV_DECODE_FAST_MIXES
 * lists the instantiated pairs). */
fast_kernel mkv_fast_lookup_mix(int32_t hk, int32_t hv, int32_t hkg, int32_t hvg, int32_t lk, int32_t lv,
                                int32_t lkg, int32_t lvg, int32_t head_dim);

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

/* The final max M and sum S (log2 units) of head g over the n_items item slots from part:
 * one online pass, a slot per lane, then a warp merge. Reads through L2 (in the fused kernel,
 * other blocks wrote them). */
__device__ __forceinline__ float2 head_ms(const fast_args &a, int64_t part, int32_t n_items, int32_t g)
{
    const int32_t lane = threadIdx.x & 31;
    float M = -INFINITY, S = 0.0f;
    for (int32_t s = lane; s < n_items; s += 32) {
        const float2 ml = __ldcg(reinterpret_cast<const float2 *>(a.part_ml + ((part + s) * a.G + g) * 2));
        const float mn = fmaxf(M, ml.x);
        S = S * exp2f(M - mn) + ml.y * exp2f(ml.x - mn);
        M = mn;
    }
    for (int x = 16; x > 0; x >>= 1) {
        const float Mo = __shfl_xor_sync(0xffffffffu, M, x), So = __shfl_xor_sync(0xffffffffu, S, x);
        const float mn = fmaxf(M, Mo);
        S = (S > 0.0f ? S * exp2f(M - mn) : 0.0f) + (So > 0.0f ? So * exp2f(Mo - mn) : 0.0f);
        M = mn;
    }
    return make_float2(M, S);
}

/* A token's probability from its row of G logits l (log2 units; global or shared memory,
 * written before this kernel or staged by it): the maximum over the group of
 * 2^(l - lse_g) = 2^(l - M_g) / S_g (the rounding of lse moves it by ~1e-7), taken as 2 to the
 * maximum exponent (one ex2 per token: 2^x is monotonic). */
__device__ __forceinline__ float token_prob(const float *l, int32_t G, const float *lse)
{
    float x = -INFINITY;
    if (G % 4 == 0) { /* 16-byte loads: rows of G % 4 == 0 logits are 16-byte aligned */
        for (int32_t g = 0; g < G; g += 4) {
            const float4 v = *reinterpret_cast<const float4 *>(l + g);
            x = fmaxf(x, fmaxf(fmaxf(v.x - lse[g], v.y - lse[g + 1]), fmaxf(v.z - lse[g + 2], v.w - lse[g + 3])));
        }
    } else {
        for (int32_t g = 0; g < G; g++) x = fmaxf(x, l[g] - lse[g]);
    }
    return ex2(x);
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

/* One section of a head-region for the score write-back: its n tokens' logits (token k's G at
 * lg + k G: the section's item rows follow each other, all full but the last), its page ids
 * (page i at row[i * step]: the high section from the row's start, the low one from its end)
 * and pages of tpp tokens with the score slots at off_score. */
struct section_tokens {
    const float *lg;
    int64_t lin0; /* token x of the compact logits of the section's token 0 */
    const int32_t *row;
    const uint8_t *pool;
    int64_t page_bytes, off_score;
    int32_t step, n, tpp, G;
};

/* The score slot at slot of page id page of a section. */
__device__ __forceinline__ float *score_slot(const section_tokens &s, int32_t page, int32_t slot)
{
    // NOTE: int32 page id, widen before the multiply (pools exceed 2 GiB).
    return reinterpret_cast<float *>(const_cast<uint8_t *>(s.pool) + (int64_t)page * s.page_bytes +
                                     s.off_score) + slot;
}

/* Whether the four score slots of tokens k to k + 3 (k a multiple of 4) share a page and are
 * 16-byte aligned (pages of a multiple of 4 tokens, and the pool, its pages and their score
 * segment 16-byte aligned, as mixkv's layouts are): red_add4 takes them. */
__device__ __forceinline__ bool score_v4(const section_tokens &s)
{
    return s.tpp % 4 == 0 &&
           ((reinterpret_cast<uintptr_t>(s.pool) | (uintptr_t)s.page_bytes | (uintptr_t)s.off_score) & 15) == 0;
}

/* The head-region's section sec (high tokens [0, hi), low [hi, n); logits of the high items
 * from slot 0, of the low ones from slot items_hi). */
__device__ __forceinline__ section_tokens section_of_region(const fast_args &a, int64_t rs, int64_t region,
                                                            int32_t sec, int32_t hi, int32_t n,
                                                            int32_t items_hi)
{
    section_tokens s;
    const int64_t slot = rs * (a.sec_items + 1) + (sec ? items_hi : 0);
    s.lg = a.logits + slot * a.item_tokens * a.G;
    s.lin0 = slot * a.item_tokens;
    s.row = a.table + region * a.T + (sec ? a.T - 1 : 0);
    s.step = sec ? -1 : 1;
    s.n = sec ? n - hi : hi;
    s.tpp = a.sec[sec].tpp;
    s.off_score = a.sec[sec].off_score;
    s.pool = a.pool, s.page_bytes = a.page_bytes, s.G = a.G;
    return s;
}

/* The score write-back of tokens k = first + u * stride (u < U, 0 <= k < n) of a section (the
 * finalize kernel): each one's probability added to its score slot. All loads (logits and
 * page ids) first, then the reductions: U independent chains, none waiting on a score slot. */
template <int U>
__device__ __forceinline__ void score_tokens(const section_tokens &s, int32_t first, int32_t stride,
                                             const float *lse)
{
    float pmax[U];
    int32_t page[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int32_t k = first + u * stride;
        if (k < 0 || k >= s.n) continue;
        pmax[u] = token_prob(s.lg + (int64_t)k * s.G, s.G, lse);
        page[u] = __ldg(s.row + k / s.tpp * s.step);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int32_t k = first + u * stride;
        if (k < 0 || k >= s.n) continue;
        red_add(score_slot(s, page[u], k % s.tpp), pmax[u]);
    }
}

/* out of head-region rs = its n_items items' partial outputs (from part), each weighted by
 * 2^(m - M), over S; elements i0, i0 + stride, ... of the G x d. */
__device__ __forceinline__ void merge_out(const fast_args &a, int64_t part, int32_t n_items,
                                          int64_t rs, int32_t d, const float *M, const float *S,
                                          int32_t i0, int32_t stride)
{
    const int32_t G = a.G;
    for (int32_t i = i0; i < G * d; i += stride) {
        const int32_t g = i / d, e = i - g * d;
        float o = 0.0f;
#pragma unroll 4
        for (int32_t s = 0; s < n_items; s++) {
            const float w = exp2f(__ldcg(a.part_ml + ((part + s) * G + g) * 2) - M[g]);
            o = fmaf(__ldcg(a.part_o + ((part + s) * G + g) * d + e), w, o);
        }
        const float r = o / S[g];
        if (a.out16) a.out16[(rs * G + g) * d + e] = a.out_bf16 ? mkv_f32_to_bf16(r) : mkv_f32_to_f16(r);
        else a.out[(rs * G + g) * d + e] = r;
    }
}

/* Merge and score write-back after the item kernels; head_dim d. */
cudaError_t mkv_fast_finalize(const fast_args &a, int32_t d, int32_t n_seq, cudaStream_t stream);

/* Tokens per item for a call of this size on a GPU of sm_count multiprocessors (enough items
 * to fill it several times over). */
int32_t mkv_fast_item_tokens(int32_t n_seq, int32_t H, int32_t max_tokens, int32_t sm_count);

#endif /* MKV_ATTENTION_DECODE_FAST_H */
