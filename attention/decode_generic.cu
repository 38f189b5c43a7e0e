/*
 * decode_generic.cu — the generic fp32 decode kernels of mkv_cuda_decode (decode_cuda.cu), for
 * every format, head_dim and group size, where the tensor-core kernels do not apply or are not
 * asked for (reference: mkv_attn_decode_region in decode_ref.c, which the GPU tests in
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
#include "attention/decode_generic.h"

#include "attention/decode_plan.h"
#include "attention/decode_tuning.h"
#include "quant/half.h"
#include "common/error.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
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

mkv_status_t mkv_decode_launched(const char *what, char *err, cudaError_t e)
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
    if ((st = mkv_decode_launched("split_kernel", err)) != MKV_STATUS_OK) return st;
    merge_kernel<<<dim3((unsigned)a.G, (unsigned)a.H, (unsigned)n_seq), (unsigned)a.d, 0,
                   stream>>>(a);
    if ((st = mkv_decode_launched("merge_kernel", err)) != MKV_STATUS_OK) return st;
    if (!a.scores) return MKV_STATUS_OK;
    const unsigned score_blocks = (unsigned)((a.max_tokens + SCORE_THREADS - 1) / SCORE_THREADS);
    score_kernel<<<dim3(score_blocks, (unsigned)a.H, (unsigned)n_seq), SCORE_THREADS, 0,
                   stream>>>(a);
    return mkv_decode_launched("score_kernel", err);
}

size_t mkv_decode_generic_workspace(int32_t n_seq, int32_t n_heads, int32_t group_size, int32_t head_dim,
                                    int32_t max_tokens, int32_t split_tokens)
{
    return plan_workspace(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens).bytes;
}

mkv_status_t mkv_decode_generic(const mkv_cuda_decode_t *a, cudaStream_t stream, char *err)
{
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
    return launch_decode(k, a->n_seq, stream, err);
}
