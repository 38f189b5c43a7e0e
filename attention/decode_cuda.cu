/*
 * decode_cuda.cu — decode attention over mixed-precision pages on the GPU (contract in
 * decode_cuda.h; reference: mkv_attn_decode_region in decode_ref.c, which the GPU tests in
 * tests/gpu/test_decode_cuda.c compare against).
 *
 * Three kernels per call, all fp32:
 *   1. split_kernel, grid (split, KV head, sequence): one block takes tokens
 *      [s * split, (s + 1) * split) of one head-region, in section order, for all G query heads
 *      of the group at once (each page is read once per group; G > G_TILE repeats the pass per
 *      tile of G_TILE heads). Keys: a thread per token walks the key chunks (a warp reads chunk
 *      c of 32 consecutive tokens, 16-byte loads), dequantizes in registers and accumulates G
 *      dot products against q in shared memory; logits go to the workspace. Then the block's
 *      max and sum of exp per head, and values: a tile of tokens is dequantized into shared
 *      memory with the same coalesced chunk loads, and each thread accumulates 4 output
 *      elements of every head over a subset of the tile's tokens. The unnormalised partial
 *      output, max and sum are written to the workspace.
 *   2. merge_kernel, grid (g, KV head, sequence): log-sum-exp merge of the splits into out,
 *      and the final max M and sum S of each query head.
 *   3. score_kernel, a thread per token: score += max over g of exp(logit - M_g) / S_g. Each
 *      score slot is written by exactly one thread, after every split is done: no races.
 * A head-region with no tokens is skipped (out untouched), as in the reference.
 */
#include "attention/decode_cuda.h"

#include "attention/decode_plan.h"
#include "attention/decode_tc.h"
#include "quant/half.h"
#include "common/error.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#define DEC_THREADS 128                /* threads of split_kernel */
#define G_TILE 8                       /* query heads per pass (register accumulators) */
#define MAX_D 256                      /* largest head_dim of format.c */
#define MAX_VT 64                      /* most tokens per value tile */
#define VS_PAD 4                       /* floats of padding per value-tile row (banks, float4) */
#define BUF_FLOATS (MAX_VT * (64 + VS_PAD)) /* largest vt(d) * (d + pad): d = 64 */
#define SCORE_THREADS 256
#define WS_ALIGN MKV_DECODE_WS_ALIGN

/* Tokens per value tile: about 16 KB of fp32 whatever d is. */
__host__ __device__ constexpr int32_t value_tile(int32_t d)
{
    return 4096 / d < 16 ? 16 : (4096 / d > MAX_VT ? MAX_VT : 4096 / d);
}

static_assert(DEC_THREADS % 32 == 0 && DEC_THREADS >= MAX_D / 4, "a thread per float4 column");
static_assert(value_tile(16) * (16 + VS_PAD) <= BUF_FLOATS &&
                  value_tile(32) * (32 + VS_PAD) <= BUF_FLOATS &&
                  value_tile(64) * (64 + VS_PAD) <= BUF_FLOATS &&
                  value_tile(128) * (128 + VS_PAD) <= BUF_FLOATS &&
                  value_tile(256) * (256 + VS_PAD) <= BUF_FLOATS,
              "every value tile fits the buffer");
/* The split reduction holds R = DEC_THREADS / (d / 4) lanes of G_TILE * d floats. */
static_assert(DEC_THREADS * 4 * G_TILE <= BUF_FLOATS, "the split reduction fits the buffer");

/* What the kernels get: the call's arguments plus the workspace plan. */
struct dec_args {
    const uint8_t *pool;
    int64_t page_bytes;
    mkv_page_layout_t lay_hi, lay_lo;
    const int32_t *table; /* [regions][T] */
    const int32_t *n_hi, *n_lo;
    int32_t T;
    const int64_t *regions; /* [n_seq][H] */
    int32_t H, G, d, max_tokens;
    int32_t split, n_splits;
    const float *q;         /* [n_seq][H * G][d] */
    float *out;             /* [n_seq][H * G][d] */
    uint16_t *out16;        /* or, when non-null, here in fp16 (bf16 with out_bf16) */
    int32_t out_bf16;
    float softmax_scale;
    float *logits;          /* [n_seq * H][G][max_tokens] */
    float *part_o;          /* [n_seq * H][n_splits][G][d] unnormalised partial outputs */
    float *part_ml;         /* [n_seq * H][n_splits][G][2] partial max, sum of exp */
    float *final_ms;        /* [n_seq * H][G][2] final max M, sum S */
    int32_t scores;         /* 0: no score write-back (no_scores) */
};

/* Workspace parts, each 256-byte aligned; the size query and the call share this plan. */
struct ws_plan {
    int32_t split, n_splits;
    size_t off_logits, off_part_o, off_part_ml, off_final, bytes;
};

/* Tokens per block of the generic kernels (mkv_decode_tuning's split_*). */
static int32_t auto_split(int32_t n_seq, int32_t H, int32_t max_tokens)
{
    using T = mkv_decode_tuning;
    if (max_tokens <= T::split_small) return max_tokens > 0 ? max_tokens : 1; /* no split */
    const int64_t blocks = (int64_t)n_seq * H * ((max_tokens + T::split_large - 1) / T::split_large);
    return blocks >= T::split_large_min_blocks ? T::split_large : T::split_small;
}

static ws_plan plan_workspace(int32_t n_seq, int32_t H, int32_t G, int32_t d, int32_t max_tokens,
                              int32_t split_tokens)
{
    ws_plan w;
    w.split = split_tokens > 0 ? split_tokens : auto_split(n_seq, H, max_tokens);
    w.n_splits = (int32_t)(((int64_t)max_tokens + w.split - 1) / w.split);
    const size_t rg = (size_t)n_seq * (size_t)H * (size_t)G; /* query heads of the call */
    size_t off = 0;
    w.off_logits = off;
    off += mkv_align_up64((int64_t)(rg * (size_t)max_tokens * sizeof(float)), WS_ALIGN);
    w.off_part_o = off;
    off += mkv_align_up64((int64_t)(rg * (size_t)w.n_splits * (size_t)d * sizeof(float)), WS_ALIGN);
    w.off_part_ml = off;
    off += mkv_align_up64((int64_t)(rg * (size_t)w.n_splits * 2 * sizeof(float)), WS_ALIGN);
    w.off_final = off;
    off += mkv_align_up64((int64_t)(rg * 2 * sizeof(float)), WS_ALIGN);
    w.bytes = off;
    return w;
}

/* ---------------------------------------------------------------------------------------- */
/* Device helpers                                                                           */
/* ---------------------------------------------------------------------------------------- */

__device__ __forceinline__ float h2f(uint32_t bits16)
{
    return __half2float(__ushort_as_half((unsigned short)(bits16 & 0xffffu)));
}

/* Tokens of a head-region as the kernels see them: counts clamped to [0, max_tokens] (the
 * workspace holds no more), high section [0, hi), low section [hi, n). */
struct region_view {
    const int32_t *row;
    int32_t hi, n;
};

__device__ __forceinline__ region_view region_of(const dec_args &a, int32_t j, int32_t h)
{
    const int64_t r = a.regions[(int64_t)j * a.H + h];
    region_view v;
    v.row = a.table + r * a.T;
    const int64_t nh = max(a.n_hi[r], 0), nl = max(a.n_lo[r], 0);
    v.n = (int32_t)min(nh + nl, (int64_t)a.max_tokens);
    v.hi = (int32_t)min(nh, (int64_t)v.n);
    return v;
}

/* The page and slot of the k-th token of a section (0 high, 1 low): high pages fill the row
 * from the left, low pages from the right (memmgr/state.h). */
__device__ __forceinline__ const uint8_t *section_token(const dec_args &a, const int32_t *row,
                                                        int sec, int32_t k, int32_t tpp,
                                                        int32_t *slot)
{
    const int32_t pg = k / tpp;
    *slot = k - pg * tpp;
    const int32_t page = __ldg(row + (sec == 0 ? pg : a.T - 1 - pg));
    // NOTE: int32 page id, widen before the multiply (pools exceed 2 GiB).
    return a.pool + (int64_t)page * a.page_bytes;
}

/* One chunk of codes (4, 8 or 16 bytes, aligned to its size: pages and segments are 16-byte
 * aligned); unused words are zero. The pool's codes are read-only during split_kernel. */
__device__ __forceinline__ uint4 load_chunk(const uint8_t *p, int32_t chunk_bytes)
{
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
    if (chunk_bytes == 16) {
        w = __ldg(reinterpret_cast<const uint4 *>(p));
    } else if (chunk_bytes == 8) {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
        w.x = v.x, w.y = v.y;
    } else {
        w.x = __ldg(reinterpret_cast<const unsigned int *>(p));
    }
    return w;
}

/* The {scale, zero} of the quantization group last asked for: reloaded only when the group
 * changes (a 16-byte chunk spans up to four groups of 16 elements at 2 bits). */
struct meta_cache {
    int32_t grp;
    float s, z;
};

/* Dequantizes one 32-bit word of codes (elements e0 .. e0 + 32 / BITS - 1 of the vector) as
 * mkv_quant_read_vector does: x = q * scale + zero in fp32 (the product is exact, so FMA or
 * not gives the same value), 16-bit elements raw fp16, element 2j in the low half. */
template <int BITS>
__device__ __forceinline__ void dequant_word(uint32_t w, int32_t e0, int32_t gshift,
                                             const uint8_t *page, const mkv_page_layout_t &lay,
                                             int which, int32_t slot, meta_cache &m, float *x)
{
    if constexpr (BITS == 16) {
        x[0] = h2f(w);
        x[1] = h2f(w >> 16);
    } else {
        constexpr uint32_t mask = (1u << BITS) - 1u;
#pragma unroll
        for (int i = 0; i < 32 / BITS; i++) {
            const int32_t grp = (e0 + i) >> gshift;
            if (grp != m.grp) {
                const uint32_t sz = __ldg(reinterpret_cast<const unsigned int *>(
                    page + mkv_meta_offset(&lay, which, slot, grp)));
                m.grp = grp, m.s = h2f(sz), m.z = h2f(sz >> 16);
            }
            x[i] = fmaf((float)((w >> (i * BITS)) & mask), m.s, m.z);
        }
    }
}

/* Keys: logits of the gn query heads in q_s ([gn][d]) for tokens [sa, sb) of one section
 * (section token k = t - base), a thread per token; lg: [gn][max_tokens] at the tile. */
template <int BITS>
__device__ __forceinline__ void qk_section(const dec_args &a, const mkv_page_layout_t &lay, int sec,
                           const int32_t *row, int32_t sa, int32_t sb, int32_t base,
                           const float *q_s, int gn, float *lg)
{
    constexpr int EW = 32 / BITS;
    const mkv_vec_layout_t &v = lay.key;
    const int32_t gshift = __ffs(v.group_elems) - 1, d = a.d;
    for (int32_t t = sa + (int32_t)threadIdx.x; t < sb; t += DEC_THREADS) {
        int32_t slot;
        const uint8_t *page = section_token(a, row, sec, t - base, lay.tokens, &slot);
        meta_cache m = {-1, 0.0f, 0.0f};
        float dot[G_TILE];
#pragma unroll
        for (int g = 0; g < G_TILE; g++) dot[g] = 0.0f;
        for (int32_t c = 0; c < v.n_chunks; c++) {
            const uint4 w4 = load_chunk(page + mkv_code_offset(&lay, 0, slot, c), v.chunk_bytes);
            const uint32_t words[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
            for (int wi = 0; wi < 4; wi++) {
                if (wi * 4 >= v.chunk_bytes) break;
                const int32_t e0 = c * v.chunk_elems + wi * EW;
                float x[EW];
                dequant_word<BITS>(words[wi], e0, gshift, page, lay, 0, slot, m, x);
                /* Elements in increasing order, as the reference's dot product. */
#pragma unroll
                for (int i = 0; i < EW; i++)
#pragma unroll
                    for (int g = 0; g < G_TILE; g++)
                        if (g < gn) dot[g] = fmaf(q_s[g * d + e0 + i], x[i], dot[g]);
            }
        }
#pragma unroll
        for (int g = 0; g < G_TILE; g++)
            if (g < gn) lg[(int64_t)g * a.max_tokens + t] = a.softmax_scale * dot[g];
    }
}

/* Values: dequantizes tokens [t0, t0 + tn) of one section into vs ([vt][d + VS_PAD] fp32).
 * Consecutive threads take consecutive tokens of one chunk: 16-byte loads, coalesced. */
template <int BITS>
__device__ __forceinline__ void stage_values(const dec_args &a, const mkv_page_layout_t &lay,
                                             int sec,
                             const int32_t *row, int32_t t0, int32_t tn, int32_t base, int32_t vt,
                             float *vs)
{
    constexpr int EW = 32 / BITS;
    const mkv_vec_layout_t &v = lay.value;
    const int32_t gshift = __ffs(v.group_elems) - 1, stride = a.d + VS_PAD;
    for (int32_t i = (int32_t)threadIdx.x; i < v.n_chunks * vt; i += DEC_THREADS) {
        const int32_t tt = i % vt, c = i / vt;
        if (tt >= tn) continue;
        int32_t slot;
        const uint8_t *page = section_token(a, row, sec, t0 + tt - base, lay.tokens, &slot);
        meta_cache m = {-1, 0.0f, 0.0f};
        const uint4 w4 = load_chunk(page + mkv_code_offset(&lay, 1, slot, c), v.chunk_bytes);
        const uint32_t words[4] = {w4.x, w4.y, w4.z, w4.w};
        float *dst = vs + tt * stride + c * v.chunk_elems;
#pragma unroll
        for (int wi = 0; wi < 4; wi++) {
            if (wi * 4 >= v.chunk_bytes) break;
            float x[EW];
            dequant_word<BITS>(words[wi], c * v.chunk_elems + wi * EW, gshift, page, lay, 1, slot,
                               m, x);
#pragma unroll
            for (int e = 0; e < EW; e++) dst[wi * EW + e] = x[e];
        }
    }
}

__device__ __forceinline__ void qk_dispatch(const dec_args &a, const mkv_page_layout_t &lay,
                                            int sec, const int32_t *row, int32_t sa, int32_t sb,
                                            int32_t base, const float *q_s, int gn, float *lg)
{
    switch (lay.key.bits) {
    case 16: qk_section<16>(a, lay, sec, row, sa, sb, base, q_s, gn, lg); break;
    case 8: qk_section<8>(a, lay, sec, row, sa, sb, base, q_s, gn, lg); break;
    case 4: qk_section<4>(a, lay, sec, row, sa, sb, base, q_s, gn, lg); break;
    default: qk_section<2>(a, lay, sec, row, sa, sb, base, q_s, gn, lg); break;
    }
}

__device__ __forceinline__ void stage_dispatch(const dec_args &a, const mkv_page_layout_t &lay,
                                               int sec, const int32_t *row, int32_t t0,
                                               int32_t tn, int32_t base, int32_t vt, float *vs)
{
    switch (lay.value.bits) {
    case 16: stage_values<16>(a, lay, sec, row, t0, tn, base, vt, vs); break;
    case 8: stage_values<8>(a, lay, sec, row, t0, tn, base, vt, vs); break;
    case 4: stage_values<4>(a, lay, sec, row, t0, tn, base, vt, vs); break;
    default: stage_values<2>(a, lay, sec, row, t0, tn, base, vt, vs); break;
    }
}

/* Values of tokens [sa, sb) of one section, a tile of value_tile(d) tokens at a time: the tile
 * is dequantized into vs, its probabilities exp(logit - m) into p_s ([gn][vt]), then thread
 * (r, col) accumulates elements 4 col .. 4 col + 3 of every head over tokens r, r + R, ... */
__device__ __forceinline__ void pv_section(const dec_args &a, const mkv_page_layout_t &lay,
                                           int sec, const region_view &rv, int32_t sa,
                                           int32_t sb, const float *lg, const float *m_s, int gn,
                                           float *vs, float *p_s, float (&acc)[G_TILE][4])
{
    const int32_t d = a.d, tid = threadIdx.x, vt = value_tile(d), stride = d + VS_PAD;
    const int32_t cols = d / 4, R = DEC_THREADS / cols, col = tid % cols, r = tid / cols;
    const int32_t base = sec == 0 ? 0 : rv.hi;
    for (int32_t t0 = sa; t0 < sb; t0 += vt) {
        const int32_t tn = min(vt, sb - t0);
        stage_dispatch(a, lay, sec, rv.row, t0, tn, base, vt, vs);
        for (int32_t i = tid; i < gn * vt; i += DEC_THREADS) {
            const int32_t g = i / vt, tt = i % vt;
            if (tt < tn) p_s[i] = expf(lg[(int64_t)g * a.max_tokens + t0 + tt] - m_s[g]);
        }
        __syncthreads();
        for (int32_t tt = r; tt < tn; tt += R) {
            const float4 v = *reinterpret_cast<const float4 *>(vs + tt * stride + col * 4);
#pragma unroll
            for (int g = 0; g < G_TILE; g++) {
                if (g >= gn) break;
                const float p = p_s[g * vt + tt];
                acc[g][0] = fmaf(p, v.x, acc[g][0]);
                acc[g][1] = fmaf(p, v.y, acc[g][1]);
                acc[g][2] = fmaf(p, v.z, acc[g][2]);
                acc[g][3] = fmaf(p, v.w, acc[g][3]);
            }
        }
        __syncthreads(); /* before the next tile overwrites vs and p_s */
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Kernels                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* 4 blocks per SM: without the minimum, ptxas settles on 80 registers and spills. */
static __global__ void __launch_bounds__(DEC_THREADS, 4) split_kernel(dec_args a)
{
    const int32_t s = blockIdx.x, h = blockIdx.y, j = blockIdx.z;
    const region_view rv = region_of(a, j, h);
    const int32_t ta = s * a.split;
    if (ta >= rv.n) return; /* whole block: this region has fewer splits */
    const int32_t tb = (int32_t)min((int64_t)ta + a.split, (int64_t)rv.n);
    const int64_t rs = (int64_t)j * a.H + h; /* the (sequence, KV head) of this block */
    const int32_t d = a.d, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t cols = d / 4, R = DEC_THREADS / cols, col = tid % cols, r = tid / cols;

    __shared__ float q_s[G_TILE * MAX_D];
    __shared__ __align__(16) float buf[BUF_FLOATS]; /* value tile, then the split reduction */
    __shared__ float p_s[G_TILE * MAX_VT];
    __shared__ float m_s[G_TILE], l_s[G_TILE];

    for (int32_t g0 = 0; g0 < a.G; g0 += G_TILE) {
        const int gn = min(G_TILE, a.G - g0);
        const float *q = a.q + (rs * a.G + g0) * d;
        for (int32_t i = tid; i < gn * d; i += DEC_THREADS) q_s[i] = q[i];
        __syncthreads();

        /* Keys, section by section so that a warp never mixes two layouts. */
        float *lg = a.logits + (rs * a.G + g0) * a.max_tokens;
        if (ta < rv.hi) qk_dispatch(a, a.lay_hi, 0, rv.row, ta, min(tb, rv.hi), 0, q_s, gn, lg);
        if (tb > rv.hi) qk_dispatch(a, a.lay_lo, 1, rv.row, max(ta, rv.hi), tb, rv.hi, q_s, gn, lg);
        __syncthreads(); /* the block's logits are visible to all of it */

        /* The split's max and sum of exp, a warp per query head. Plain loads: the logits were
         * written by this kernel. */
        for (int g = warp; g < gn; g += DEC_THREADS / 32) {
            const float *l = lg + (int64_t)g * a.max_tokens;
            float mx = -INFINITY, sum = 0.0f;
            for (int32_t t = ta + lane; t < tb; t += 32) mx = fmaxf(mx, l[t]);
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            for (int32_t t = ta + lane; t < tb; t += 32) sum += expf(l[t] - mx);
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) m_s[g] = mx, l_s[g] = sum;
        }
        __syncthreads();

        /* Values, a tile at a time (pv_section). */
        float acc[G_TILE][4];
#pragma unroll
        for (int g = 0; g < G_TILE; g++) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.0f;
        if (ta < rv.hi)
            pv_section(a, a.lay_hi, 0, rv, ta, min(tb, rv.hi), lg, m_s, gn, buf, p_s, acc);
        if (tb > rv.hi)
            pv_section(a, a.lay_lo, 1, rv, max(ta, rv.hi), tb, lg, m_s, gn, buf, p_s, acc);

        /* Sum the R token lanes: red[r][g][d] in buf. */
#pragma unroll
        for (int g = 0; g < G_TILE; g++)
            if (g < gn)
                *reinterpret_cast<float4 *>(buf + (r * G_TILE + g) * d + col * 4) =
                    make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
        __syncthreads();
        const int64_t part = (rs * a.n_splits + s) * a.G + g0; /* [rs][s][g] of this tile */
        for (int32_t i = tid; i < gn * d; i += DEC_THREADS) {
            const int32_t g = i / d, e = i % d;
            float o = 0.0f;
            for (int32_t k = 0; k < R; k++) o += buf[(k * G_TILE + g) * d + e];
            a.part_o[(part + g) * d + e] = o;
        }
        if (tid < gn) {
            a.part_ml[(part + tid) * 2] = m_s[tid];
            a.part_ml[(part + tid) * 2 + 1] = l_s[tid];
        }
        __syncthreads(); /* before the next head tile reuses shared memory */
    }
}

/* Log-sum-exp merge of one query head's splits; blockDim.x = d. */
static __global__ void merge_kernel(dec_args a)
{
    const int32_t g = blockIdx.x, h = blockIdx.y, j = blockIdx.z, e = threadIdx.x;
    const region_view rv = region_of(a, j, h);
    if (rv.n == 0) return; /* out untouched, as in the reference */
    const int32_t ns = (int32_t)(((int64_t)rv.n + a.split - 1) / a.split);
    const int64_t rs = (int64_t)j * a.H + h;
    const int64_t step = a.G; /* from split i to i + 1 in [rs][s][g] */
    const int64_t first = rs * a.n_splits * a.G + g;
    float M = -INFINITY;
    for (int32_t i = 0; i < ns; i++) M = fmaxf(M, a.part_ml[(first + i * step) * 2]);
    float S = 0.0f, o = 0.0f;
    for (int32_t i = 0; i < ns; i++) {
        const float f = expf(a.part_ml[(first + i * step) * 2] - M);
        S = fmaf(a.part_ml[(first + i * step) * 2 + 1], f, S);
        o = fmaf(a.part_o[(first + i * step) * a.d + e], f, o);
    }
    const float r = o / S;
    if (a.out16) a.out16[((rs * a.G) + g) * a.d + e] = a.out_bf16 ? mkv_f32_to_bf16(r) : mkv_f32_to_f16(r);
    else a.out[((rs * a.G) + g) * a.d + e] = r;
    if (e == 0) {
        a.final_ms[(rs * a.G + g) * 2] = M;
        a.final_ms[(rs * a.G + g) * 2 + 1] = S;
    }
}

__device__ __forceinline__ void add_score(const dec_args &a, const mkv_page_layout_t &lay, int sec,
                                          const int32_t *row, int32_t k, float p)
{
    int32_t slot;
    const uint8_t *page = section_token(a, row, sec, k, lay.tokens, &slot);
    /* The pool is const for the reading kernels; this is the one write into it. */
    float *score = reinterpret_cast<float *>(const_cast<uint8_t *>(page) +
                                             mkv_score_offset(&lay, slot));
    *score = *score + p;
}

/* score += max over g of exp(logit - M_g) / S_g, a thread per token. */
static __global__ void __launch_bounds__(SCORE_THREADS) score_kernel(dec_args a)
{
    const int32_t h = blockIdx.y, j = blockIdx.z;
    const int32_t t = blockIdx.x * SCORE_THREADS + threadIdx.x;
    const region_view rv = region_of(a, j, h);
    if (t >= rv.n) return;
    const int64_t rs = (int64_t)j * a.H + h;
    const float *lg = a.logits + rs * a.G * a.max_tokens;
    const float *ms = a.final_ms + rs * a.G * 2;
    float pmax = 0.0f;
    for (int32_t g = 0; g < a.G; g++) {
        const float p = expf(lg[(int64_t)g * a.max_tokens + t] - ms[2 * g]) / ms[2 * g + 1];
        pmax = p > pmax ? p : pmax;
    }
    if (t < rv.hi) add_score(a, a.lay_hi, 0, rv.row, t, pmax);
    else add_score(a, a.lay_lo, 1, rv.row, t - rv.hi, pmax);
}

/* ---------------------------------------------------------------------------------------- */
/* Launcher                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* e: what a launcher returned (cudaSuccess for a bare <<<>>> launch, which is then checked). */
static mkv_status_t launched(const char *what, char *err, cudaError_t e = cudaSuccess)
{
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e == cudaSuccess) return MKV_STATUS_OK;
    if (err) mkv_fail(err, MKV_STATUS_CUDA_ERROR, "mkv_cuda_decode: %s launch: %s", what,
                      cudaGetErrorString(e));
    return MKV_STATUS_CUDA_ERROR;
}

static mkv_status_t launch_decode(const dec_args &a, int32_t n_seq, cudaStream_t stream,
                                  char *err)
{
    mkv_status_t st;
    split_kernel<<<dim3((unsigned)a.n_splits, (unsigned)a.H, (unsigned)n_seq), DEC_THREADS, 0,
                   stream>>>(a);
    if ((st = launched("split_kernel", err)) != MKV_STATUS_OK) return st;
    merge_kernel<<<dim3((unsigned)a.G, (unsigned)a.H, (unsigned)n_seq), (unsigned)a.d, 0,
                   stream>>>(a);
    if ((st = launched("merge_kernel", err)) != MKV_STATUS_OK) return st;
    if (!a.scores) return MKV_STATUS_OK;
    const unsigned score_blocks = (unsigned)((a.max_tokens + SCORE_THREADS - 1) / SCORE_THREADS);
    score_kernel<<<dim3(score_blocks, (unsigned)a.H, (unsigned)n_seq), SCORE_THREADS, 0,
                   stream>>>(a);
    return launched("score_kernel", err);
}

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                             */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t bad(char *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        char msg[MKV_ERR_LEN];
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_decode: %s", msg);
    }
    return MKV_STATUS_INVALID_ARGUMENT;
}

/* The kernels trust the layout's arithmetic; check the fields they use against each other. */
static bool vec_ok(const mkv_vec_layout_t *v, int32_t d)
{
    const int32_t b = v->bits;
    if (b != 16 && b != 8 && b != 4 && b != 2) return false;
    if (v->vec_bytes != d * b / 8 || v->chunk_bytes != (v->vec_bytes < 16 ? v->vec_bytes : 16))
        return false;
    if (v->n_chunks * v->chunk_bytes != v->vec_bytes || v->chunk_elems != v->chunk_bytes * 8 / b)
        return false;
    /* groups: 1 for 16-bit; else d / group_elems with group_elems a power of two >= 16 (the
     * dequantizers find an element's group by a shift), so 1 .. 16 groups. */
    const int32_t ge = v->group_elems;
    if (ge < 16 || (ge & (ge - 1)) != 0 || (b == 16 && v->groups != 1)) return false;
    return ge * v->groups == d;
}

static bool layout_ok(const mkv_page_layout_t *l, int32_t d, int64_t page_bytes)
{
    if (l->tokens < 1 || l->head_dim != d || !vec_ok(&l->key, d) || !vec_ok(&l->value, d))
        return false;
    const int64_t n = l->tokens; /* segments as large as the accessors address */
    if (l->bytes[MKV_SEG_KEY] != n * l->key.vec_bytes ||
        l->bytes[MKV_SEG_VALUE] != n * l->value.vec_bytes ||
        l->bytes[MKV_SEG_KEY_META] != n * MKV_META_BYTES(l->key.groups, l->key.bits) ||
        l->bytes[MKV_SEG_VALUE_META] != n * MKV_META_BYTES(l->value.groups, l->value.bits) ||
        l->bytes[MKV_SEG_SCORE] != n * 4)
        return false;
    for (int s = 0; s < MKV_PAGE_SEGMENTS; s++)
        if (l->offset[s] < 0 || l->offset[s] % MKV_SEGMENT_ALIGN != 0 || l->bytes[s] < 0 ||
            l->offset[s] + l->bytes[s] > page_bytes)
            return false;
    return l->used_bytes <= page_bytes;
}


/* ---------------------------------------------------------------------------------------- */
/* The tensor-core path (decode_tc.h; planned in decode_plan.cu)                            */
/* ---------------------------------------------------------------------------------------- */

static tc_section section_of(const mkv_page_layout_t &l)
{
    tc_section s;
    s.tpp = l.tokens;
    s.off_key = l.offset[MKV_SEG_KEY], s.off_key_meta = l.offset[MKV_SEG_KEY_META];
    s.off_value = l.offset[MKV_SEG_VALUE], s.off_value_meta = l.offset[MKV_SEG_VALUE_META];
    s.off_score = l.offset[MKV_SEG_SCORE];
    return s;
}

static mkv_status_t launch_tc(const mkv_cuda_decode_t *a, cudaStream_t stream, char *err)
{
    using namespace mkv_tc_plan;
    const tc_kernel fh = tc_for(&a->lay_hi, a->head_dim);
    const tc_kernel fl = tc_for(&a->lay_lo, a->head_dim);
    const tc_kernel one = tc_one_launch(a);
    bool fused;
    int32_t blocks;
    const tc_plan w = plan_call(a, one, &fused, &blocks);
    uint8_t *ws = static_cast<uint8_t *>(a->workspace);
    tc_args f;
    f.pool = a->pool, f.page_bytes = a->page_bytes, f.table = a->table;
    f.n_hi = a->n_hi, f.n_lo = a->n_lo, f.T = a->row_entries, f.regions = a->regions;
    f.H = a->n_heads, f.G = a->group_size, f.max_tokens = a->max_tokens;
    f.item_tokens = w.item_tokens, f.sec_items = w.sec_items;
    f.sec[0] = section_of(a->lay_hi), f.sec[1] = section_of(a->lay_lo);
    f.q = a->q, f.out = a->out, f.softmax_scale = a->softmax_scale;
    f.out16 = a->out16, f.out_bf16 = a->out_bf16;
    f.logits = reinterpret_cast<float *>(ws + w.off_logits);
    f.part_o = reinterpret_cast<float *>(ws + w.off_part_o);
    f.part_ml = reinterpret_cast<float *>(ws + w.off_part_ml);
    f.blocks_per_sec = (w.sec_items + MKV_TC_WARPS - 1) / MKV_TC_WARPS;
    f.n_rs = a->n_seq * a->n_heads;
    f.counters = fused ? reinterpret_cast<int32_t *>(ws + w.off_counters) : nullptr;
    f.lse = fused ? reinterpret_cast<float *>(ws + w.off_lse) : nullptr;
    f.fused = 0, f.discard = 0;
    f.keep_logits = !a->no_scores;
    f.compact = 0, f.lg_n = 0, f.lg_a = nullptr, f.lg_b = nullptr, f.lg_r = nullptr;
    f.total_ids = (int32_t)w.total_ids;
    /* The separate and finalize passes' grids put the blocks' index last where grid z holds
     * them (tc_args::x_last): every region's first blocks start before any region's later,
     * often empty, ones. */
    const auto order = [&](unsigned blocks, bool x_last) {
        return x_last ? dim3((unsigned)a->n_heads, (unsigned)a->n_seq, blocks)
                      : dim3(blocks, (unsigned)a->n_heads, (unsigned)a->n_seq);
    };
    const bool x_last = w.sec_items + 1 <= 65535;
    f.x_last = x_last;
    const dim3 grid = order((unsigned)f.blocks_per_sec, x_last);
    mkv_status_t st;
    if (one.launch != nullptr) { /* one launch covers both sections */
        f.sec_mask = 3;
        f.grid_x = f.blocks_per_sec + 1; /* a region's high and low blocks together */
        if (fused) {
            f.fused = 1;
            f.discard = (uintptr_t)f.logits % 128 == 0;
            if (w.compact) {
                const tc_compact_layout cl = mkv_tc_compact_layout((size_t)w.lg_n_tok, f.G);
                f.compact = 1;
                f.lg_n = w.lg_n_tok;
                f.lg_a = reinterpret_cast<uint32_t *>(f.logits);
                f.lg_b = reinterpret_cast<uint8_t *>(f.logits) + cl.off_b;
                f.lg_r = reinterpret_cast<float *>(reinterpret_cast<uint8_t *>(f.logits) + cl.off_r);
            }
            /* Counters and score-job entries (if any: entries hold a decode id + 1, 0 until
             * published) to zero in one memset; a persistent grid of what the GPU holds. */
            const size_t words = (size_t)f.n_rs + 4 + (f.keep_logits ? (size_t)f.total_ids : 0);
            if ((st = launched("cudaMemsetAsync (decode counters)", err,
                               cudaMemsetAsync(f.counters, 0, words * sizeof(int32_t), stream))) != MKV_STATUS_OK)
                return st;
            const int64_t resident = (int64_t)blocks * device_attr(cudaDevAttrMultiProcessorCount, 1);
            const dim3 gp((unsigned)(resident > 0 && resident < f.total_ids ? resident : f.total_ids));
            return launched("tensor-core decode kernel (fused scores)", err, one.launch(f, gp, stream));
        }
        /* the separate pass packs a region's items, high then low, into full blocks */
        const dim3 g2 = order((unsigned)((w.sec_items + 1 + MKV_TC_WARPS - 1) / MKV_TC_WARPS), x_last);
        if ((st = launched("tensor-core decode kernel", err, one.launch(f, g2, stream))) != MKV_STATUS_OK)
            return st;
    } else {
        f.sec_mask = 1, f.grid_x = f.blocks_per_sec;
        if ((st = launched("tensor-core decode kernel (high)", err, fh.launch(f, grid, stream))) !=
            MKV_STATUS_OK)
            return st;
        f.sec_mask = 2;
        if ((st = launched("tensor-core decode kernel (low)", err, fl.launch(f, grid, stream))) !=
            MKV_STATUS_OK)
            return st;
    }
    return launched("finalize_kernel", err, mkv_tc_finalize(f, a->head_dim, a->n_seq, stream));
}

extern "C" size_t mkv_cuda_decode_workspace_size(int32_t n_seq, int32_t n_heads,
                                                 int32_t group_size, int32_t head_dim,
                                                 int32_t max_tokens, int32_t split_tokens)
{
    if (!mkv_tc_plan::sizes_ok(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens)) return 0;
    const size_t generic =
        plan_workspace(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens).bytes;
    if (head_dim != 64 && head_dim != 128) return generic;
    const size_t tc = mkv_tc_plan::workspace_bytes(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens);
    return tc > generic ? tc : generic;
}

extern "C" size_t mkv_cuda_decode_workspace_bound(int32_t n_seq, int32_t n_heads, int32_t group_size,
                                                  int32_t head_dim, int32_t max_tokens)
{
    if (!mkv_tc_plan::sizes_ok(n_seq, n_heads, group_size, head_dim, max_tokens, 0)) return 0;
    size_t most = 0;
    for (int32_t m = 1; m <= max_tokens; m++) {
        const size_t b = mkv_cuda_decode_workspace_size(n_seq, n_heads, group_size, head_dim, m, 0);
        if (b > most) most = b;
    }
    return most;
}

extern "C" mkv_status_t mkv_cuda_decode(const mkv_cuda_decode_t *a, void *stream, char *err)
{
    if (!a) return bad(err, "null arguments");
    if (!a->pool || !a->table || !a->n_hi || !a->n_lo || !a->regions || !a->q ||
        (!a->out && !a->out16) || !a->workspace)
        return bad(err, "null pointer (pool %p, table %p, n_hi %p, n_lo %p, regions %p, q %p, "
                        "out %p, workspace %p)", (void *)a->pool, (const void *)a->table,
                   (const void *)a->n_hi, (const void *)a->n_lo, (const void *)a->regions,
                   (const void *)a->q, (void *)a->out, a->workspace);
    if (!mkv_tc_plan::sizes_ok(a->n_seq, a->n_heads, a->group_size, a->head_dim, a->max_tokens,
                  a->split_tokens))
        return bad(err, "n_seq %d (0 .. 65535), n_heads %d, group_size %d (1 .. 65535), "
                        "head_dim %d (16, 32, 64, 128 or 256), max_tokens %d or split_tokens "
                        "%d (>= 0) out of range", a->n_seq, a->n_heads, a->group_size,
                   a->head_dim, a->max_tokens, a->split_tokens);
    if (a->mean_tokens < 0) return bad(err, "mean_tokens %d must be >= 0", a->mean_tokens);
    if (a->page_bytes < MKV_SEGMENT_ALIGN || a->page_bytes % MKV_SEGMENT_ALIGN != 0 ||
        (uintptr_t)a->pool % MKV_SEGMENT_ALIGN != 0)
        return bad(err, "page_bytes %lld must be a positive multiple of 16 and the pool 16-byte "
                        "aligned", (long long)a->page_bytes);
    if (a->row_entries < 1) return bad(err, "row_entries %d must be >= 1", a->row_entries);
    if (!layout_ok(&a->lay_hi, a->head_dim, a->page_bytes) ||
        !layout_ok(&a->lay_lo, a->head_dim, a->page_bytes))
        return bad(err, "the page layouts (head_dim %d/%d) do not match head_dim %d and "
                        "page_bytes %lld", a->lay_hi.head_dim, a->lay_lo.head_dim, a->head_dim,
                   (long long)a->page_bytes);
    if (a->kernel < MKV_DECODE_KERNEL_AUTO || a->kernel > MKV_DECODE_KERNEL_TENSOR_PER_SECTION)
        return bad(err, "kernel %d (0 auto, 1 generic, 2 tensor, 3 tensor per section)", a->kernel);
    if (a->scores < MKV_DECODE_SCORES_AUTO || a->scores > MKV_DECODE_SCORES_FUSED)
        return bad(err, "scores %d (0 auto, 1 separate, 2 fused)", a->scores);
    if (a->logits < MKV_DECODE_LOGITS_AUTO || a->logits > MKV_DECODE_LOGITS_COMPACT)
        return bad(err, "logits %d (0 auto, 1 fp32, 2 compact)", a->logits);
    if (a->no_scores != 0 && a->no_scores != 1) return bad(err, "no_scores %d (0 or 1)", a->no_scores);
    const bool tensor = a->kernel != MKV_DECODE_KERNEL_GENERIC &&
                        mkv_cuda_decode_uses_tensor(&a->lay_hi, &a->lay_lo, a->group_size,
                                                    a->head_dim);
    if (a->kernel >= MKV_DECODE_KERNEL_TENSOR && !tensor) {
        if (err)
            mkv_fail(err, MKV_STATUS_UNSUPPORTED, "mkv_cuda_decode: no tensor-core kernel for "
                     "K%dV%d / K%dV%d, head_dim %d, group_size %d, quantization groups (key/value) "
                     "%d/%d, %d/%d (needs head_dim 64 or 128, group_size <= 8, instantiated "
                     "formats, one group a side or the default groups)", a->lay_hi.key.bits,
                     a->lay_hi.value.bits, a->lay_lo.key.bits, a->lay_lo.value.bits, a->head_dim,
                     a->group_size, a->lay_hi.key.groups, a->lay_hi.value.groups,
                     a->lay_lo.key.groups, a->lay_lo.value.groups);
        return MKV_STATUS_UNSUPPORTED;
    }
    if (a->n_seq == 0 || a->max_tokens == 0) return MKV_STATUS_OK;
    if (tensor) return launch_tc(a, static_cast<cudaStream_t>(stream), err);

    const ws_plan w = plan_workspace(a->n_seq, a->n_heads, a->group_size, a->head_dim,
                                     a->max_tokens, a->split_tokens);
    uint8_t *ws = static_cast<uint8_t *>(a->workspace);
    dec_args k;
    k.pool = a->pool, k.page_bytes = a->page_bytes, k.lay_hi = a->lay_hi, k.lay_lo = a->lay_lo;
    k.table = a->table, k.n_hi = a->n_hi, k.n_lo = a->n_lo, k.T = a->row_entries;
    k.regions = a->regions, k.H = a->n_heads, k.G = a->group_size, k.d = a->head_dim;
    k.max_tokens = a->max_tokens, k.split = w.split, k.n_splits = w.n_splits;
    k.q = a->q, k.out = a->out, k.softmax_scale = a->softmax_scale;
    k.out16 = a->out16, k.out_bf16 = a->out_bf16;
    k.logits = reinterpret_cast<float *>(ws + w.off_logits);
    k.part_o = reinterpret_cast<float *>(ws + w.off_part_o);
    k.part_ml = reinterpret_cast<float *>(ws + w.off_part_ml);
    k.final_ms = reinterpret_cast<float *>(ws + w.off_final);
    k.scores = !a->no_scores;
    return launch_decode(k, a->n_seq, static_cast<cudaStream_t>(stream), err);
}
