/*
 * kv_cuda.cu — the KV backend on the GPU (engine/kv.h's mkv_kv_cuda_ops): the token-data
 * calls of include/mixkv.h over the device state of memmgr/cuda_mm.cu, with the CPU backend
 * (engine/kv_backend.c) as the reference it follows decision for decision.
 *
 * Prompt: prefill converts the packed tensors to fp16 (keys and values sanitised, as a K16V16
 * page stores them), runs attention/prefill_cuda.h over every listed slot at once, and keeps
 * each slot's fp16 K/V and significance sums in device working memory. Commit classifies every
 * head-region on the device (one warp each: DiffKV's thresholds, the window, then the budget
 * by a radix select of the lowest (significance, position) keys), writes each region's section
 * sizes for one batched mkv_cache_resize, and quantizes every kept token into its page in
 * position order (the CPU's order, so pages match byte for byte given the same classes).
 * Decode: one kernel converts the queries, finds each new token's page and slot and quantizes
 * it there (the CPU's bytes; key and value in two warps), then decode_cuda.h attends with the
 * score write-back. Compress: one warp per head-region runs Algorithm 1 (engine/policy.c's
 * decide, with its tie order); the resize's fit check gates the moves that must see the pages
 * (the leaving high token staged and swap-removed), one resize recycles and allocates, the
 * staged tokens are demoted into their low slots; then budgets prune by the same radix select.
 *
 * Per-slot arguments travel as kernel parameters (KC_SLOTS slots per launch, more in chunks)
 * and N is read on the device, so a step copies nothing from the host and a graph can replay
 * it. Every step kernel does nothing while the memory manager's sticky failure is set
 * (MKV_CACHE_ASYNC_STEPS, docs/decisions.md 42); without the flag, append and compress wait
 * for the device to return their status.
 */
#include "engine/kv.h"

#include "attention/decode_cuda.h"
#include "attention/prefill_cuda.h"
#include "engine/policy.h"
#include "memmgr/cuda_mm.h"
#include "quant/quant_cuda.cuh"

#include "common/device_scope.cuh"

#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long u64;

#define KC_SLOTS 256 /* slots per launch, passed by value (kernel parameters up to 32 KB) */
#define KC_WARPS 4   /* warps per block; one head-region per warp */

#define CUDA_TRY(expr)                                                                         \
    do {                                                                                       \
        cudaError_t e_ = (expr);                                                               \
        if (e_ != cudaSuccess)                                                                 \
            return mkv_fail(c->err, MKV_STATUS_CUDA_ERROR, "%s: %s", #expr, cudaGetErrorString(e_)); \
    } while (0)

#define LAUNCHED(what)                                                                         \
    do {                                                                                       \
        cudaError_t e_ = cudaGetLastError();                                                   \
        if (e_ != cudaSuccess)                                                                 \
            return mkv_fail(c->err, MKV_STATUS_CUDA_ERROR, "%s launch: %s", what,              \
                            cudaGetErrorString(e_));                                           \
    } while (0)

/* Per-slot prompt working memory on the device. */
typedef struct dev_ws {
    uint32_t epoch; /* the occupant it belongs to; 0: none */
    int32_t n;
    uint16_t *k, *v; /* [L][n][H][d] fp16 */
    float *sig;      /* [L][H][n] significance sums */
} dev_ws_t;

typedef struct cuda_kv {
    int32_t device;
    mkv_cuda_mm_view_t mm;
    int64_t page_bytes;
    int32_t L, H, G, d, S, T, max_len;
    dev_ws_t *ws;      /* [S] host records of device buffers */
    uint16_t **d_ws_k, **d_ws_v; /* device [S] pointer tables for the commit kernels */
    float **d_ws_sig;
    /* decode */
    float *q32;             /* [S][H * G][d] */
    int64_t *regions;       /* [S][H] */
    void *dec_ws;
    size_t dec_ws_bytes;
    size_t dec_ws_capture;  /* asynchronous steps: what a captured step of any length may need */
    int32_t ws_seqs_last, ws_max_last; /* the last size query's arguments (0: none) ... */
    size_t ws_need_last;               /* ... and its answer: layers ask the same, one after another */
    /* compress */
    int32_t *act, *cand, *victim; /* [S * L * H] decisions in call order */
    int32_t *tgt_hi, *tgt_lo;     /* [S * L * H] */
    uint8_t *stage;               /* staging pages for one token per head-region */
    int32_t *seq;                 /* host [S] */
    int32_t *d_decoded;           /* [S][L] the KV layer's step bookkeeping, device-authoritative */
    int32_t *d_compressed;        /* [S] */
    int32_t *h_decoded, *h_compressed; /* host staging */
    const void *checked[4];       /* q, k, v, out of the last call whose pointers were checked */
} cuda_kv_t;


/* Slots of one launch and what the kernels need of each. */
struct slot_args {
    int32_t n;                /* slots in this launch */
    int32_t first;            /* index of slot[0] in the call */
    int32_t slot[KC_SLOTS];
    int32_t plen[KC_SLOTS];   /* prompt length (N is read on the device: graph replays move it) */
    int32_t budget[KC_SLOTS]; /* 0: none */
    int64_t base[KC_SLOTS];   /* commit: first job of the slot (prefix of L * H * plen) */
};

/* ---------------------------------------------------------------------------------------- */
/* Device helpers                                                                           */
/* ---------------------------------------------------------------------------------------- */

/* A lane's page index pi and slot in it, moved on by 32 tokens (dq = 32 / tpp, dr = 32 % tpp):
 * straight-line, so that the unrolled loops' loads of several tokens can be issued together. */
__device__ __forceinline__ void next_token(int32_t &pi, int32_t &slot, int32_t dq, int32_t dr, int32_t tpp)
{
    slot += dr;
    pi += dq;
    const bool wrap = slot >= tpp;
    slot -= wrap ? tpp : 0;
    pi += wrap;
}

/* attention.h's mkv_observers. */
__device__ __forceinline__ int32_t observers(int32_t pos, int32_t plen, int32_t N, int32_t obs)
{
    if (pos >= plen) return N - pos;
    int32_t first = pos;
    if (obs > 0 && plen - obs > first) first = plen - obs;
    return (plen - first) + (N - plen);
}

/* A float's order as an unsigned integer (-0 taken as +0); NaN is outside the contract. */
__device__ __forceinline__ uint32_t ord_f32(float f)
{
    uint32_t u = __float_as_uint(f);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float unord_f32(uint32_t o)
{
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

/* policy.c's (sig, pos) order as one key: smaller key, smaller token. */
__device__ __forceinline__ u64 tok_key(float sig, int32_t pos)
{
    return ((u64)ord_f32(sig) << 32) | (uint32_t)pos;
}

__device__ __forceinline__ u64 warp_min_u64(u64 v)
{
    for (int off = 16; off > 0; off >>= 1) {
        const u64 o = __shfl_xor_sync(FULL_MASK, v, off);
        v = o < v ? o : v;
    }
    return v;
}

__device__ __forceinline__ int32_t warp_sum(int32_t v)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ uint8_t *page_of(uint8_t *pool, int64_t page_bytes, const int32_t *row,
                                            int32_t T, int sec, int32_t k, int32_t tpp,
                                            int32_t *slot)
{
    const int32_t page = sec ? row[T - 1 - k / tpp] : row[k / tpp];
    *slot = k % tpp;
    return pool + (int64_t)page * page_bytes;
}

/* One token's words in a warp, one lane each (groups <= 16): what copy_token moves on its fast
 * path, loaded all at once (one round trip) and stored apart from the load, so that a caller
 * can have two tokens in flight before it stores either. */
struct token_words {
    uint4 kc, vc;
    uint32_t km, vm, sc, ps;
    bool has_kc, has_vc, has_km, has_vm;

    /* The fast path applies: 16-byte chunks, at most one chunk and one group a lane. */
    static __device__ __forceinline__ bool fits(const mkv_page_layout_t *lay)
    {
        const mkv_vec_layout_t *k = &lay->key, *v = &lay->value;
        return k->chunk_bytes == 16 && v->chunk_bytes == 16 && k->n_chunks <= 32 && v->n_chunks <= 32;
    }

    __device__ __forceinline__ void load(const uint8_t *src, int32_t ss, const mkv_page_layout_t *lay, int lane)
    {
        const mkv_vec_layout_t *k = &lay->key, *v = &lay->value;
        kc = vc = make_uint4(0, 0, 0, 0);
        km = vm = sc = ps = 0;
        has_kc = lane < k->n_chunks, has_vc = lane < v->n_chunks;
        has_km = k->bits != 16 && lane < k->groups, has_vm = v->bits != 16 && lane < v->groups;
        if (has_kc) kc = *(const uint4 *)(src + mkv_code_offset(lay, 0, ss, lane));
        if (has_vc) vc = *(const uint4 *)(src + mkv_code_offset(lay, 1, ss, lane));
        if (has_km) km = *(const uint32_t *)(src + mkv_meta_offset(lay, 0, ss, lane));
        if (has_vm) vm = *(const uint32_t *)(src + mkv_meta_offset(lay, 1, ss, lane));
        if (lane == 0) {
            sc = *(const uint32_t *)(src + mkv_score_offset(lay, ss));
            ps = *(const uint32_t *)(src + mkv_pos_offset(lay, ss));
        }
    }

    __device__ __forceinline__ void store(uint8_t *dst, int32_t ds, const mkv_page_layout_t *lay, int lane) const
    {
        if (has_kc) *(uint4 *)(dst + mkv_code_offset(lay, 0, ds, lane)) = kc;
        if (has_vc) *(uint4 *)(dst + mkv_code_offset(lay, 1, ds, lane)) = vc;
        if (has_km) *(uint32_t *)(dst + mkv_meta_offset(lay, 0, ds, lane)) = km;
        if (has_vm) *(uint32_t *)(dst + mkv_meta_offset(lay, 1, ds, lane)) = vm;
        if (lane == 0) {
            *(uint32_t *)(dst + mkv_score_offset(lay, ds)) = sc;
            *(uint32_t *)(dst + mkv_pos_offset(lay, ds)) = ps;
        }
    }
};

/* mkv_page_copy_token by one warp (distinct slots, or distinct pages). */
__device__ void copy_token(uint8_t *dst, int32_t ds, const uint8_t *src, int32_t ss,
                           const mkv_page_layout_t *lay, int lane)
{
    if (token_words::fits(lay)) {
        /* every word loaded before any is stored: one round trip instead of one per segment
         * (the stores could alias the loads as far as the compiler knows, so the loop below
         * waits for each segment in turn) */
        token_words w;
        w.load(src, ss, lay, lane);
        __syncwarp(); /* every lane's loads issued and their values held before any store */
        w.store(dst, ds, lay, lane);
        __syncwarp();
        return;
    }
    /* Segments start on 16-byte boundaries and pages are multiples of 16 bytes: whole 16-byte
     * chunks copy as one vector, metadata, score and position as words. */
    for (int which = 0; which < 2; which++) {
        const mkv_vec_layout_t *v = which ? &lay->value : &lay->key;
        if (v->chunk_bytes == 16) {
            for (int32_t c = lane; c < v->n_chunks; c += 32)
                *(uint4 *)(dst + mkv_code_offset(lay, which, ds, c)) =
                    *(const uint4 *)(src + mkv_code_offset(lay, which, ss, c));
        } else {
            for (int32_t c = 0; c < v->n_chunks; c++)
                for (int32_t b = lane; b < v->chunk_bytes; b += 32)
                    dst[mkv_code_offset(lay, which, ds, c) + b] = src[mkv_code_offset(lay, which, ss, c) + b];
        }
        if (v->bits != 16)
            for (int32_t g = lane; g < v->groups; g += 32)
                *(uint32_t *)(dst + mkv_meta_offset(lay, which, ds, g)) =
                    *(const uint32_t *)(src + mkv_meta_offset(lay, which, ss, g));
    }
    if (lane == 0) {
        *(uint32_t *)(dst + mkv_score_offset(lay, ds)) = *(const uint32_t *)(src + mkv_score_offset(lay, ss));
        *(uint32_t *)(dst + mkv_pos_offset(lay, ds)) = *(const uint32_t *)(src + mkv_pos_offset(lay, ss));
    }
    __syncwarp();
}

/* mkv_page_demote_token by one warp; xs, qs: the warp's shared scratch. */
__device__ void demote_token(uint8_t *dst, const mkv_page_layout_t *dl, int32_t ds, const uint8_t *src,
                             const mkv_page_layout_t *sl, int32_t ss, float *xs, uint8_t *qs, int lane)
{
    for (int which = 0; which < 2; which++) {
        read_vector(src, sl, which, ss, xs, lane);
        write_vector(dst, dl, which, ds, xs, qs, lane);
    }
    if (lane == 0) {
        *(uint32_t *)(dst + mkv_score_offset(dl, ds)) = *(const uint32_t *)(src + mkv_score_offset(sl, ss));
        *(uint32_t *)(dst + mkv_pos_offset(dl, ds)) = *(const uint32_t *)(src + mkv_pos_offset(sl, ss));
    }
    __syncwarp();
}

__device__ __forceinline__ float token_sig(const uint8_t *page, const mkv_page_layout_t *lay,
                                           int32_t slot, int32_t plen, int32_t N, int32_t obs,
                                           int32_t *pos)
{
    /* aligned words: pages are multiples of 16 bytes and segments start on 16-byte boundaries */
    *pos = *(const int32_t *)(page + mkv_pos_offset(lay, slot));
    const float sum = *(const float *)(page + mkv_score_offset(lay, slot));
    return __fdiv_rn(sum, (float)observers(*pos, plen, N, obs));
}

/* policy.c's mkv_policy_mix_targets, in the same arithmetic. */
__device__ __forceinline__ void mix_targets(int32_t m, float mix_high, float mix_low, int32_t *nh, int32_t *nl)
{
    const double xh = floor((double)mix_high * m + 0.5), xl = floor((double)mix_low * m + 0.5);
    const int32_t h = xh < 0 ? 0 : xh > m ? m : (int32_t)xh;
    int32_t l = xl < 0 ? 0 : xl > m ? m : (int32_t)xl;
    if (h + l > m) l = m - h;
    *nh = h;
    *nl = l;
}

/* The k-th smallest (1-based) of the keys key_at(i) over i in [0, n) where key_at gives ~0 for
 * non-candidates, by one warp: a radix select, 8 bits a pass; hist: the warp's 256 counters.
 * Keys are unique, so the answer is the one key with exactly k keys <= it. */
template <class KeyAt>
__device__ u64 warp_select(int32_t n, int32_t k, KeyAt key_at, uint32_t *hist, int lane)
{
    u64 prefix = 0, mask = 0;
    uint32_t rank = (uint32_t)k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = lane; b < 256; b += 32) hist[b] = 0;
        __syncwarp();
        for (int32_t i = lane; i < n; i += 32) {
            const u64 key = key_at(i);
            if (key != ~0ull && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncwarp();
        uint32_t digit = 0, below = 0;
        if (lane == 0) {
            for (int b = 0; b < 256; b++) {
                if (below + hist[b] >= rank) {
                    digit = (uint32_t)b;
                    break;
                }
                below += hist[b];
            }
        }
        digit = __shfl_sync(FULL_MASK, digit, 0);
        below = __shfl_sync(FULL_MASK, below, 0);
        rank -= below;
        prefix |= (u64)digit << shift;
        mask |= (u64)255u << shift;
        __syncwarp();
    }
    return prefix;
}

/* ---------------------------------------------------------------------------------------- */
/* Conversion kernels                                                                       */
/* ---------------------------------------------------------------------------------------- */

__device__ __forceinline__ float load_elem(const void *p, int dtype, int64_t i)
{
    if (dtype == MKV_DTYPE_F32) return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return dtype == MKV_DTYPE_F16 ? mkv_f16_to_f32(h) : mkv_bf16_to_f32(h);
}

/* dtype -> fp16, sanitised when `sane` (NaN -> 0, clamped to +-65504: a K16V16 page's value). */
static __global__ void to_f16_kernel(const void *src, int dtype, int64_t n, uint16_t *dst, int sane)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float x = load_elem(src, dtype, i);
        dst[i] = mkv_f32_to_f16(sane ? sanitize(x) : x);
    }
}

static unsigned grid_for(int64_t n, int threads)
{
    const int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

/* ---------------------------------------------------------------------------------------- */
/* Decode plan                                                                              */
/* ---------------------------------------------------------------------------------------- */

struct new_token_args {
    const void *k, *v;          /* [n_slots][H][d] in dtype */
    const void *q;              /* [n_slots][H * G][d] in dtype: to q32 by the blocks after */
    float *q32;
    int64_t q_elems;            /* 0: no conversion */
    uint32_t token_blocks;      /* blocks of token jobs */
    int32_t dtype;
    const int32_t *table, *n_hi, *len, *fail;
    uint8_t *pool;
    int64_t page_bytes;
    mkv_page_layout_t lay;      /* the high layout */
    int32_t L, H, T, layer;
    int64_t empty_region;
    int64_t *regions;           /* [n_slots][H] for the attention */
    int32_t *decoded;           /* [S][L] */
};

/* One warp per listed slot j and KV head h: the head-region, its newest high slot (position
 * N - 1, made room for by mkv_cache_append), and the new token's K/V written there as a K16V16
 * page would first hold them (sanitised, rounded to fp16), then quantized: what the CPU
 * backend's decode writes, byte for byte. After a failed asynchronous call: nothing written,
 * and the attention pointed at an always-empty region. */
static __global__ void __launch_bounds__(KC_WARPS * 32)
new_token_kernel(const __grid_constant__ slot_args sa, const __grid_constant__ new_token_args a)
{
    __shared__ float xs[KC_WARPS][QC_MAX_D];
    __shared__ uint8_t qs[KC_WARPS][QC_MAX_D];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (blockIdx.x >= a.token_blocks) { /* the queries to f32, in the same launch */
        const int64_t n = a.q_elems, stride = (int64_t)(gridDim.x - a.token_blocks) * blockDim.x;
        for (int64_t i = (int64_t)(blockIdx.x - a.token_blocks) * blockDim.x + threadIdx.x; i < n; i += stride)
            a.q32[i] = load_elem(a.q, a.dtype, i);
        return;
    }
    const int64_t w2 = (int64_t)blockIdx.x * KC_WARPS + warp, w = w2 / 2;
    const int which = (int)(w2 % 2); /* the key and the value in two warps: half the latency */
    if (w >= (int64_t)sa.n * a.H) return;
    const int32_t jl = (int32_t)(w / a.H), h = (int32_t)(w % a.H), j = sa.first + jl, s = sa.slot[jl];
    const int32_t d = a.lay.head_dim;
    if (*a.fail != 0) {
        if (lane == 0 && which == 0) a.regions[(int64_t)j * a.H + h] = a.empty_region;
        return;
    }
    const int64_t r = ((int64_t)s * a.L + a.layer) * a.H + h;
    const int32_t k = a.n_hi[r] - 1, N = a.len[s];
    if (lane == 0 && which == 0) {
        a.regions[(int64_t)j * a.H + h] = r;
        if (h == 0) a.decoded[(int64_t)s * a.L + a.layer] = N;
    }
    if (k < 0) return;
    uint8_t *page = a.pool + (int64_t)a.table[r * a.T + k / a.lay.tokens] * a.page_bytes;
    const int32_t slot = k % a.lay.tokens;
    const int64_t src = ((int64_t)j * a.H + h) * d;
    for (int32_t e = lane; e < d; e += 32) {
        const float x = load_elem(which ? a.v : a.k, a.dtype, src + e);
        xs[warp][e] = mkv_f16_to_f32(mkv_f32_to_f16(sanitize(x)));
    }
    __syncwarp();
    write_vector(page, &a.lay, which, slot, xs[warp], qs[warp], lane);
    if (lane == 0 && which == 0) {
        *(uint32_t *)(page + mkv_score_offset(&a.lay, slot)) = 0u; /* aligned words */
        *(int32_t *)(page + mkv_pos_offset(&a.lay, slot)) = N - 1;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Prompt: classification and placement                                                     */
/* ---------------------------------------------------------------------------------------- */

struct classify_args {
    float *const *ws_sig;  /* device [S] */
    int32_t LH, window, obs;
    float alpha_h, alpha_l;
    float mix_high, mix_low; /* the fixed mix when either is > 0 (policy.c) */
    int32_t *place;        /* [jobs]: (sec << 30 | index in section), or -1 when pruned */
    int32_t *tgt_hi, *tgt_lo; /* [n_slots * L * H] in call order */
};

/* One warp per head-region (listed slot j, layer-head lh): policy.c's classify_prompt, then
 * mkv_policy_budget's picks (the k lowest (sig, pos) kept tokens outside the window), then the
 * section index of every kept token in position order. */
static __global__ void __launch_bounds__(KC_WARPS * 32)
classify_kernel(const __grid_constant__ slot_args sa, const __grid_constant__ classify_args a)
{
    __shared__ uint32_t hist[KC_WARPS][256];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t w = (int64_t)blockIdx.x * KC_WARPS + warp;
    if (w >= (int64_t)sa.n * a.LH) return;
    const int32_t jl = (int32_t)(w / a.LH), lh = (int32_t)(w % a.LH);
    const int32_t n = sa.plen[jl], s = sa.slot[jl];
    const float *sum = a.ws_sig[s] + (int64_t)lh * n;
    int32_t *place = a.place + sa.base[jl] + (int64_t)lh * n;
    const float th_h = __fdiv_rn(a.alpha_h, (float)n), th_l = __fdiv_rn(a.alpha_l, (float)n);
    const int32_t win_start = n - a.window;

    /* Classes (2 high, 1 low, 0 pruned) into place[], and the counts. */
    int32_t kept = 0, cands = 0;
    if (a.mix_high > 0.0f || a.mix_low > 0.0f) {
        /* The fixed mix (policy.c's classify_prompt_mix): of the m tokens outside the window,
         * keys above the (m - nh)-th smallest are high, above the (m - nh - nl)-th low. */
        const int32_t m = win_start > 0 ? win_start : 0;
        int32_t nh_t, nl_t;
        mix_targets(m, a.mix_high, a.mix_low, &nh_t, &nl_t);
        auto key_out = [&](int32_t i) -> u64 {
            return i < win_start ? tok_key(__fdiv_rn(sum[i], (float)observers(i, n, n, a.obs)), i) : ~0ull;
        };
        const int32_t kh = m - nh_t, kp = m - nh_t - nl_t;
        const u64 cut_h = kh > 0 ? warp_select(n, kh, key_out, hist[warp], lane) : 0ull;
        __syncwarp();
        const u64 cut_p = kp > 0 ? warp_select(n, kp, key_out, hist[warp], lane) : 0ull;
        __syncwarp();
        for (int32_t i = lane; i < n; i += 32) {
            const u64 key = key_out(i);
            const int32_t c = (i >= win_start || kh == 0 || key > cut_h) ? MKV_CLASS_HIGH
                              : (kp == 0 || key > cut_p)                 ? MKV_CLASS_LOW
                                                                         : MKV_CLASS_PRUNE;
            place[i] = c;
            kept += c != MKV_CLASS_PRUNE;
            cands += c != MKV_CLASS_PRUNE && i < win_start;
        }
    } else {
        for (int32_t i = lane; i < n; i += 32) {
            const float sig = __fdiv_rn(sum[i], (float)observers(i, n, n, a.obs));
            const int32_t c = (i >= win_start || sig >= th_h) ? MKV_CLASS_HIGH
                              : sig >= th_l                   ? MKV_CLASS_LOW
                                                              : MKV_CLASS_PRUNE;
            place[i] = c;
            kept += c != MKV_CLASS_PRUNE;
            cands += c != MKV_CLASS_PRUNE && i < win_start;
        }
    }
    kept = warp_sum(kept);
    cands = warp_sum(cands);
    const int32_t budget = sa.budget[jl];
    __syncwarp();
    if (budget > 0 && kept > budget) {
        const int32_t k = kept - budget < cands ? kept - budget : cands;
        if (k > 0) {
            auto key_at = [&](int32_t i) -> u64 {
                if (i >= win_start || place[i] == MKV_CLASS_PRUNE) return ~0ull;
                return tok_key(__fdiv_rn(sum[i], (float)observers(i, n, n, a.obs)), i);
            };
            const u64 kth = warp_select(n, k, key_at, hist[warp], lane);
            __syncwarp();
            for (int32_t i = lane; i < n; i += 32) {
                const u64 key = key_at(i);
                if (key != ~0ull && key <= kth) place[i] = MKV_CLASS_PRUNE;
            }
            __syncwarp();
        }
    }
    /* Section indices in position order: ballots give each lane its rank in the chunk. */
    int32_t nh = 0, nl = 0;
    const uint32_t below = (1u << lane) - 1u;
    for (int32_t i0 = 0; i0 < n; i0 += 32) {
        const int32_t i = i0 + lane;
        const int32_t c = i < n ? place[i] : MKV_CLASS_PRUNE;
        const uint32_t hi = __ballot_sync(FULL_MASK, c == MKV_CLASS_HIGH);
        const uint32_t lo = __ballot_sync(FULL_MASK, c == MKV_CLASS_LOW);
        if (i < n) {
            if (c == MKV_CLASS_HIGH) place[i] = nh + __popc(hi & below);
            else if (c == MKV_CLASS_LOW) place[i] = (1 << 30) | (nl + __popc(lo & below));
            else place[i] = -1;
        }
        nh += __popc(hi);
        nl += __popc(lo);
    }
    if (lane == 0) {
        a.tgt_hi[(int64_t)(sa.first + jl) * a.LH + lh] = nh;
        a.tgt_lo[(int64_t)(sa.first + jl) * a.LH + lh] = nl;
    }
}

struct place_args {
    uint16_t *const *ws_k;
    uint16_t *const *ws_v;
    float *const *ws_sig;
    const int32_t *place;
    const int32_t *table;
    uint8_t *pool;
    int64_t page_bytes;
    int32_t L, H, T;
    mkv_page_layout_t lay_hi, lay_lo;
};

/* One warp per prompt token and head-region: quantizes the kept token into its section slot
 * (mkv_page_write_token on the fp16 working values), with its score sum and position. */
static __global__ void __launch_bounds__(KC_WARPS * 32)
place_kernel(const __grid_constant__ slot_args sa, const __grid_constant__ place_args a, int64_t jobs)
{
    __shared__ float xs[KC_WARPS][QC_MAX_D];
    __shared__ uint8_t qs[KC_WARPS][QC_MAX_D];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int32_t d = a.lay_hi.head_dim, LH = a.L * a.H;
    for (int64_t e = (int64_t)blockIdx.x * KC_WARPS + warp; e < jobs; e += (int64_t)gridDim.x * KC_WARPS) {
        const int32_t p = a.place[e];
        if (p < 0) continue; /* warp-uniform */
        int32_t jl = 0;
        while (jl + 1 < sa.n && sa.base[jl + 1] <= e) jl++;
        const int32_t s = sa.slot[jl], n = sa.plen[jl];
        const int64_t rel = e - sa.base[jl];
        const int32_t lh = (int32_t)(rel / n), i = (int32_t)(rel % n);
        const int32_t l = lh / a.H, h = lh % a.H;
        const int sec = p >> 30;
        const int32_t idx = p & ((1 << 30) - 1);
        const mkv_page_layout_t *lay = sec ? &a.lay_lo : &a.lay_hi;
        const int32_t *row = a.table + ((int64_t)s * LH + lh) * a.T;
        int32_t slot;
        uint8_t *page = page_of(a.pool, a.page_bytes, row, a.T, sec, idx, lay->tokens, &slot);
        const int64_t src = (((int64_t)l * n + i) * a.H + h) * d;
        for (int which = 0; which < 2; which++) {
            const uint16_t *x = (which ? a.ws_v[s] : a.ws_k[s]) + src;
            for (int32_t t = lane; t < d; t += 32) xs[warp][t] = sanitize(mkv_f16_to_f32(x[t]));
            __syncwarp();
            write_vector(page, lay, which, slot, xs[warp], qs[warp], lane);
        }
        if (lane == 0) {
            *(float *)(page + mkv_score_offset(lay, slot)) = a.ws_sig[s][(int64_t)lh * n + i];
            *(int32_t *)(page + mkv_pos_offset(lay, slot)) = i;
        }
        __syncwarp();
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Compress                                                                                 */
/* ---------------------------------------------------------------------------------------- */

struct compress_args {
    int32_t *table;
    int32_t *n_hi, *n_lo;
    uint8_t *pool, *stage;
    int64_t page_bytes;
    int32_t LH, T, window, obs;
    float alpha_h, alpha_l;
    mkv_page_layout_t lay_hi, lay_lo;
    int32_t *act, *cand, *victim, *tgt_hi, *tgt_lo; /* [n_slots * L * H] in call order */
    float mix_high, mix_low; /* the fixed mix when either is > 0 */
    const int32_t *len, *fail, *check_code;
    mkv_cuda_fail_t *fail_rec, *fail_host;
    int32_t *compressed;
    int32_t L;
};

/* Every token k < n of a section (sec 1: the low one, its rows from the end) by one warp, as
 * (k, pos, score sum) to f, each lane's tokens in increasing k. SCAN_U tokens a lane at a
 * time, with all their page ids and then all their words loaded before any is used: one
 * token's chain (page id, then its words, then the division) a lane at a time left the
 * kernel waiting on memory (ncu, serve-bench's steps: 1.6 TB/s, 13 of 18 cycles per
 * instruction stalled on loads). 4 tokens: 54 registers; ncu at step 700 of serve-bench's long
 * generations (H100): 102.2 us against 108.6 with 8 (72 registers) and 152.9 with 16 (118). */
#define SCAN_U 4
template <typename F>
__device__ __forceinline__ void scan_section(const compress_args &a, const mkv_page_layout_t *lay,
                                             const int32_t *row, int sec, int32_t n, int lane, F &&f)
{
    const int32_t tpp = lay->tokens, dq = 32 / tpp, dr = 32 - dq * tpp;
    int32_t pi = lane / tpp, slot = lane - pi * tpp;
    for (int32_t k0 = lane; k0 < n; k0 += 32 * SCAN_U) {
        int32_t page[SCAN_U], sl[SCAN_U], pos[SCAN_U];
        float sum[SCAN_U];
#pragma unroll
        for (int u = 0; u < SCAN_U; u++) {
            sl[u] = slot;
            page[u] = k0 + 32 * u < n ? row[sec ? a.T - 1 - pi : pi] : 0;
            next_token(pi, slot, dq, dr, tpp);
        }
#pragma unroll
        for (int u = 0; u < SCAN_U; u++) {
            /* aligned words: pages are multiples of 16 bytes and segments start on 16-byte
             * boundaries */
            const uint8_t *pg = a.pool + (int64_t)page[u] * a.page_bytes;
            pos[u] = k0 + 32 * u < n ? *(const int32_t *)(pg + mkv_pos_offset(lay, sl[u])) : 0;
            sum[u] = k0 + 32 * u < n ? *(const float *)(pg + mkv_score_offset(lay, sl[u])) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < SCAN_U; u++)
            if (k0 + 32 * u < n) f(k0 + 32 * u, pos[u], sum[u]);
    }
}

static __device__ __forceinline__ int32_t leaving_high(int32_t act, int32_t cand, int32_t victim)
{
    switch (act) {
    case MKV_ACT_DEMOTE_VICTIM:
    case MKV_ACT_PRUNE_VICTIM: return victim;
    case MKV_ACT_DEMOTE_CAND:
    case MKV_ACT_DEMOTE_CAND_PRUNE_LOW:
    case MKV_ACT_PRUNE_CAND: return cand;
    default: return -1;
    }
}

static __device__ __forceinline__ bool grows_low(int32_t act)
{
    return act == MKV_ACT_DEMOTE_VICTIM || act == MKV_ACT_DEMOTE_CAND;
}

/* One warp per head-region: policy.c's mkv_policy_decide on the stored tokens. */
static __global__ void __launch_bounds__(KC_WARPS * 32)
decide_kernel(const __grid_constant__ slot_args sa, const __grid_constant__ compress_args a)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t w = (int64_t)blockIdx.x * KC_WARPS + warp;
    if (w >= (int64_t)sa.n * a.LH) return;
    const int32_t jl = (int32_t)(w / a.LH), lh = (int32_t)(w % a.LH);
    const int32_t N = a.len[sa.slot[jl]], plen = sa.plen[jl];
    const int64_t r = (int64_t)sa.slot[jl] * a.LH + lh, i = (int64_t)(sa.first + jl) * a.LH + lh;
    const int32_t nh = a.n_hi[r], nl = a.n_lo[r];
    const int32_t *row = a.table + r * a.T;
    int32_t act = MKV_ACT_NONE, cand = -1, victim = -1;
    const bool failed = *a.fail != 0; /* the resize that follows will change nothing either */
    const bool mix = a.mix_high > 0.0f || a.mix_low > 0.0f;
    int32_t want_h = 0, want_l = 0;
    if (mix) mix_targets(N - a.window, a.mix_high, a.mix_low, &want_h, &want_l);
    if (!failed && N > a.window && mix && nh - a.window <= want_h) {
        act = MKV_ACT_KEEP; /* policy.c's decide_mix: the high section is not over its share, t_c
                             * stays (no scan: it would only find t_c) */
    } else if (!failed && N > a.window) {
        const int32_t cand_pos = N - 1 - a.window, limit = N - a.window;
        u64 best_hi = ~0ull, best_lo = ~0ull;
        int32_t c = -1, bh = -1, bl = -1;
        float sc = 0.0f;
        scan_section(a, &a.lay_hi, row, 0, nh, lane, [&](int32_t k, int32_t pos, float sum) {
            const float sig = __fdiv_rn(sum, (float)observers(pos, plen, N, a.obs));
            if (pos == cand_pos) c = k, sc = sig;
            const u64 key = tok_key(sig, pos);
            if (pos < limit && key < best_hi) best_hi = key, bh = k;
        });
        /* the low section matters only when t_c itself is demoted (th_l <= sig < th_h) */
        const uint32_t has_c = __ballot_sync(FULL_MASK, c >= 0);
        const float sc_all = has_c ? __shfl_sync(FULL_MASK, sc, __ffs(has_c) - 1) : 0.0f;
        const float th_h0 = __fdiv_rn(a.alpha_h, (float)N), th_l0 = __fdiv_rn(a.alpha_l, (float)N);
        bool need_low;
        if (mix) { /* policy.c's decide_mix needs the low section only when t_c leaves a full one */
            const u64 mh = warp_min_u64(best_hi);
            need_low = has_c && nh - a.window > want_h && nl + 1 > want_l && mh == tok_key(sc_all, cand_pos);
        } else {
            need_low = has_c && !(sc_all >= th_h0) && sc_all >= th_l0;
        }
        if (need_low)
            scan_section(a, &a.lay_lo, row, 1, nl, lane, [&](int32_t k, int32_t pos, float sum) {
                const u64 key = tok_key(__fdiv_rn(sum, (float)observers(pos, plen, N, a.obs)), pos);
                if (key < best_lo) best_lo = key, bl = k;
            });
        /* the owners of the candidate and of each minimum tell the warp */
        const u64 min_hi = warp_min_u64(best_hi), min_lo = warp_min_u64(best_lo);
        const uint32_t own_hi = __ballot_sync(FULL_MASK, best_hi == min_hi && bh >= 0);
        const uint32_t own_lo = __ballot_sync(FULL_MASK, best_lo == min_lo && bl >= 0);
        if (has_c == 0) { /* inconsistent state: fail the call (and the step) on the device */
            cand = -2;
            if (lane == 0 && atomicCAS(&a.fail_rec->code, 0, (int32_t)MKV_STATUS_INTERNAL) == 0) {
                a.fail_rec->kind = -1;
                a.fail_host->kind = -1;
                a.fail_host->code = MKV_STATUS_INTERNAL;
            }
        } else {
            const int src_c = __ffs(has_c) - 1;
            c = __shfl_sync(FULL_MASK, c, src_c);
            sc = __shfl_sync(FULL_MASK, sc, src_c);
            const int32_t v_hi = own_hi ? __shfl_sync(FULL_MASK, bh, __ffs(own_hi) - 1) : -1;
            const int32_t v_lo = own_lo ? __shfl_sync(FULL_MASK, bl, __ffs(own_lo) - 1) : -1;
            const float th_h = __fdiv_rn(a.alpha_h, (float)N), th_l = __fdiv_rn(a.alpha_l, (float)N);
            cand = c;
            if (mix) { /* policy.c's decide_mix */
                if (nh - a.window <= want_h) {
                    act = MKV_ACT_KEEP;
                } else if (nl + 1 <= want_l) {
                    act = v_hi == c ? MKV_ACT_DEMOTE_CAND : MKV_ACT_DEMOTE_VICTIM;
                    victim = v_hi == c ? -1 : v_hi;
                } else if (v_hi != c) {
                    act = MKV_ACT_PRUNE_VICTIM;
                    victim = v_hi;
                } else if (v_lo >= 0 && min_lo < tok_key(sc, cand_pos)) {
                    act = MKV_ACT_DEMOTE_CAND_PRUNE_LOW;
                    victim = v_lo;
                } else {
                    act = MKV_ACT_PRUNE_CAND;
                }
            } else if (sc >= th_h) {
                const float sv = unord_f32((uint32_t)(min_hi >> 32));
                if (th_l <= sv && sv < th_h) act = MKV_ACT_DEMOTE_VICTIM;
                else if (sv < th_l) act = MKV_ACT_PRUNE_VICTIM;
                else act = MKV_ACT_KEEP;
                victim = v_hi == c ? -1 : v_hi;
            } else if (sc >= th_l) {
                const u64 key_c = tok_key(sc, cand_pos);
                const bool below = v_lo >= 0 && min_lo < key_c;
                if (below && unord_f32((uint32_t)(min_lo >> 32)) < th_l) {
                    act = MKV_ACT_DEMOTE_CAND_PRUNE_LOW;
                    victim = v_lo;
                } else {
                    act = MKV_ACT_DEMOTE_CAND;
                    victim = below ? v_lo : -1;
                }
            } else {
                act = MKV_ACT_PRUNE_CAND;
            }
        }
    }
    if (lane == 0) {
        if (cand == -2) act = MKV_ACT_NONE;
        a.act[i] = act;
        a.cand[i] = cand;
        a.victim[i] = victim;
        a.tgt_hi[i] = nh - (leaving_high(act, cand, victim) >= 0);
        a.tgt_lo[i] = nl + grows_low(act);
    }
}

/* One warp per head-region, before the resize (every page still held): the leaving high token
 * is staged (unless pruned) and swap-removed; a demoted candidate that replaces a pruned low
 * victim goes straight into the victim's slot. */
static __global__ void __launch_bounds__(KC_WARPS * 32, 8) /* 64 registers, no spills (72 and spills unbounded) */
move_kernel(const __grid_constant__ slot_args sa, const __grid_constant__ compress_args a)
{
    __shared__ float xs[KC_WARPS][QC_MAX_D];
    __shared__ uint8_t qs[KC_WARPS][QC_MAX_D];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t w = (int64_t)blockIdx.x * KC_WARPS + warp;
    if (w >= (int64_t)sa.n * a.LH) return;
    const int32_t jl = (int32_t)(w / a.LH), lh = (int32_t)(w % a.LH);
    const int64_t r = (int64_t)sa.slot[jl] * a.LH + lh, i = (int64_t)(sa.first + jl) * a.LH + lh;
    if (*a.check_code != 0) return; /* the resize was refused (or skipped): nothing moves */
    const int32_t act = a.act[i];
    const int32_t leaving = leaving_high(act, a.cand[i], a.victim[i]);
    if (leaving < 0) return;
    const int32_t *row = a.table + r * a.T;
    const int32_t nh = a.n_hi[r], tpp = a.lay_hi.tokens;
    int32_t ls, es;
    uint8_t *lp = page_of(a.pool, a.page_bytes, row, a.T, 0, leaving, tpp, &ls);
    uint8_t *sp = a.stage + (i / tpp) * a.page_bytes;
    const int32_t ss = (int32_t)(i % tpp);
    const bool stage = act != MKV_ACT_PRUNE_VICTIM && act != MKV_ACT_PRUNE_CAND, swap = leaving != nh - 1;
    const uint8_t *ep = swap ? page_of(a.pool, a.page_bytes, row, a.T, 0, nh - 1, tpp, &es) : NULL;
    if (token_words::fits(&a.lay_hi)) { /* both tokens in flight before either is stored */
        token_words lw, ew;
        if (stage) lw.load(lp, ls, &a.lay_hi, lane);
        if (swap) ew.load(ep, es, &a.lay_hi, lane);
        __syncwarp();
        if (stage) lw.store(sp, ss, &a.lay_hi, lane);
        if (swap) ew.store(lp, ls, &a.lay_hi, lane);
        __syncwarp();
    } else {
        if (stage) copy_token(sp, ss, lp, ls, &a.lay_hi, lane);
        if (swap) copy_token(lp, ls, ep, es, &a.lay_hi, lane);
    }
    if (act == MKV_ACT_DEMOTE_CAND_PRUNE_LOW) {
        int32_t vs;
        uint8_t *vp = page_of(a.pool, a.page_bytes, row, a.T, 1, a.victim[i], a.lay_lo.tokens, &vs);
        demote_token(vp, &a.lay_lo, vs, sp, &a.lay_hi, ss, xs[warp], qs[warp], lane);
    }
}

/* After the resize: each staged token that grows the low section, demoted into its last slot. */
static __global__ void __launch_bounds__(KC_WARPS * 32)
unstage_kernel(const __grid_constant__ slot_args sa, const __grid_constant__ compress_args a)
{
    __shared__ float xs[KC_WARPS][QC_MAX_D];
    __shared__ uint8_t qs[KC_WARPS][QC_MAX_D];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t w2 = (int64_t)blockIdx.x * KC_WARPS + warp, w = w2 / 2;
    const int which = (int)(w2 % 2); /* the key and the value in two warps: half the latency */
    if (w >= (int64_t)sa.n * a.LH) return;
    const int32_t jl = (int32_t)(w / a.LH), lh = (int32_t)(w % a.LH);
    const int64_t r = (int64_t)sa.slot[jl] * a.LH + lh, i = (int64_t)(sa.first + jl) * a.LH + lh;
    if (*a.fail != 0) return;
    if (which == 0 && lh == 0 && lane == 0) a.compressed[sa.slot[jl]] = a.len[sa.slot[jl]]; /* step done */
    if (!grows_low(a.act[i])) return;
    const int32_t tpp = a.lay_hi.tokens, ss = (int32_t)(i % tpp);
    int32_t vs;
    uint8_t *vp = page_of(a.pool, a.page_bytes, a.table + r * a.T, a.T, 1, a.n_lo[r] - 1,
                          a.lay_lo.tokens, &vs);
    const uint8_t *sp = a.stage + (i / tpp) * a.page_bytes;
    read_vector(sp, &a.lay_hi, which, ss, xs[warp], lane);
    write_vector(vp, &a.lay_lo, which, vs, xs[warp], qs[warp], lane);
    if (which == 0 && lane == 0) {
        *(uint32_t *)(vp + mkv_score_offset(&a.lay_lo, vs)) = *(const uint32_t *)(sp + mkv_score_offset(&a.lay_hi, ss));
        *(uint32_t *)(vp + mkv_pos_offset(&a.lay_lo, vs)) = *(const uint32_t *)(sp + mkv_pos_offset(&a.lay_hi, ss));
    }
}

/* One warp per head-region of a slot with a budget: mkv_policy_budget's picks (the k lowest
 * (sig, pos) tokens outside the window, both sections), removed per section in descending
 * index order by swap-remove, exactly as the CPU backend's apply_budgets. */
static __global__ void __launch_bounds__(KC_WARPS * 32)
budget_kernel(const __grid_constant__ slot_args sa, const __grid_constant__ compress_args a)
{
    __shared__ uint32_t hist[KC_WARPS][256];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t w = (int64_t)blockIdx.x * KC_WARPS + warp;
    if (w >= (int64_t)sa.n * a.LH) return;
    const int32_t jl = (int32_t)(w / a.LH), lh = (int32_t)(w % a.LH);
    const int32_t N = a.len[sa.slot[jl]], plen = sa.plen[jl];
    const int32_t budget = *a.fail != 0 ? 0 : sa.budget[jl];
    const int64_t r = (int64_t)sa.slot[jl] * a.LH + lh, i = (int64_t)(sa.first + jl) * a.LH + lh;
    int32_t n[2] = {a.n_hi[r], a.n_lo[r]};
    const int32_t *row = a.table + r * a.T;
    const mkv_page_layout_t *lays[2] = {&a.lay_hi, &a.lay_lo};
    const int32_t limit = N - a.window;
    if (budget > 0 && n[0] + n[1] > budget) {
        const int32_t total = n[0] + n[1], n0 = n[0];
        /* token t of the concatenation (high, then low), by the counts before any removal */
        auto key_at = [&](int32_t t) -> u64 {
            const int sec = t >= n0;
            const int32_t k = sec ? t - n0 : t;
            int32_t slot, pos;
            const uint8_t *pg = page_of(a.pool, a.page_bytes, row, a.T, sec, k, lays[sec]->tokens, &slot);
            const float sig = token_sig(pg, lays[sec], slot, plen, N, a.obs, &pos);
            return pos < limit ? tok_key(sig, pos) : ~0ull;
        };
        int32_t cands = 0;
        for (int32_t t = lane; t < total; t += 32) cands += key_at(t) != ~0ull;
        cands = warp_sum(cands);
        const int32_t k = total - budget < cands ? total - budget : cands;
        if (k > 0) {
            const u64 kth = warp_select(total, k, key_at, hist[warp], lane);
            for (int sec = 0; sec < 2; sec++) {
                const int32_t base = sec ? n0 : 0, tpp = lays[sec]->tokens;
                int32_t cur = n[sec];
                /* Descending windows of 32: each index still holds its original token when
                 * tested (only marked indices above it were written). */
                for (int32_t top = n[sec] - 1; top >= 0; top -= 32) {
                    const int32_t idx = top - lane;
                    const u64 key = idx >= 0 ? key_at(base + idx) : ~0ull;
                    uint32_t marks = __ballot_sync(FULL_MASK, key != ~0ull && key <= kth);
                    while (marks) {
                        const int b = __ffs(marks) - 1; /* lowest lane = highest index */
                        marks &= marks - 1;
                        const int32_t at = top - b;
                        if (at != cur - 1) {
                            int32_t ds, ss;
                            uint8_t *dp = page_of(a.pool, a.page_bytes, row, a.T, sec, at, tpp, &ds);
                            const uint8_t *sp = page_of(a.pool, a.page_bytes, row, a.T, sec, cur - 1, tpp, &ss);
                            copy_token(dp, ds, sp, ss, lays[sec], lane);
                        }
                        cur--;
                    }
                }
                n[sec] = cur;
            }
        }
    }
    if (lane == 0) {
        a.tgt_hi[i] = n[0];
        a.tgt_lo[i] = n[1];
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Host side                                                                                */
/* ---------------------------------------------------------------------------------------- */

static cudaStream_t stream_of(void *s) { return (cudaStream_t)s; }

/* Fills a launch's slot_args for slots [first, first + n) of the call. */
static void fill_slots(const mkv_cache_t *c, const int32_t *slots, int32_t first, int32_t n,
                       slot_args *sa)
{
    sa->n = n;
    sa->first = first;
    for (int32_t j = 0; j < n; j++) {
        const int32_t s = slots[first + j];
        sa->slot[j] = s;
        sa->plen[j] = c->prompt_len[s];
        sa->budget[j] = mkv_kv_budget(c, c->kv, s);
        sa->base[j] = 0;
    }
}

static void ws_release(dev_ws_t *ws)
{
    cudaFree(ws->k);
    cudaFree(ws->v);
    cudaFree(ws->sig);
    memset(ws, 0, sizeof *ws);
}

static void cuda_destroy(mkv_kv_t *base)
{
    cuda_kv_t *kv = (cuda_kv_t *)base->impl;
    if (!kv) return;
    device_scope scope(kv->device);
    if (kv->ws)
        for (int32_t s = 0; s < kv->S; s++) ws_release(&kv->ws[s]);
    free(kv->ws);
    free(kv->seq);
    void *dev[] = {kv->d_ws_k, kv->d_ws_v, kv->d_ws_sig, kv->q32,
                   kv->regions, kv->dec_ws, kv->act,
                   kv->cand, kv->victim, kv->tgt_hi, kv->tgt_lo, kv->stage, kv->d_decoded,
                   kv->d_compressed};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    free(kv->h_decoded);
    free(kv->h_compressed);
    free(kv);
    base->impl = NULL;
}

static mkv_status_t cuda_create(mkv_cache_t *c, mkv_kv_t *base)
{
    const mkv_cache_config_t *cfg = &c->cfg;
    cuda_kv_t *kv = (cuda_kv_t *)calloc(1, sizeof *kv);
    if (!kv) return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the CUDA KV backend");
    base->impl = kv;
    mkv_cuda_mm_get_view(c->dev, &kv->mm);
    kv->device = kv->mm.device;
    device_scope scope(kv->device);
    kv->page_bytes = cfg->page_bytes;
    kv->L = cfg->n_layers, kv->H = cfg->n_kv_heads, kv->G = cfg->group_size, kv->d = cfg->head_dim;
    kv->S = cfg->max_seqs, kv->T = c->st.g.row_entries, kv->max_len = cfg->max_seq_len;
    const int64_t S = kv->S, H = kv->H, G = kv->G, d = kv->d, R = S * kv->L * H;
    kv->ws = (dev_ws_t *)calloc((size_t)S, sizeof *kv->ws);
    kv->seq = (int32_t *)calloc((size_t)S, sizeof *kv->seq);
    kv->h_decoded = (int32_t *)calloc((size_t)(S * kv->L), sizeof(int32_t));
    kv->h_compressed = (int32_t *)calloc((size_t)S, sizeof(int32_t));
    if (!kv->ws || !kv->seq || !kv->h_decoded || !kv->h_compressed) {
        cuda_destroy(base);
        return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the CUDA KV backend");
    }
    const int64_t stage_pages = (R + base->lay_hi.tokens - 1) / base->lay_hi.tokens;
#define DMALLOC(p, bytes)                                                                      \
    do {                                                                                       \
        if (cudaMalloc((void **)&(p), (size_t)(bytes)) != cudaSuccess) {                       \
            (void)cudaGetLastError();                                                          \
            cuda_destroy(base);                                                                \
            return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY,                                  \
                            "cannot allocate %lld bytes of device memory for the KV backend",  \
                            (long long)(bytes));                                               \
        }                                                                                      \
    } while (0)
    DMALLOC(kv->d_ws_k, S * sizeof(uint16_t *));
    DMALLOC(kv->d_ws_v, S * sizeof(uint16_t *));
    DMALLOC(kv->d_ws_sig, S * sizeof(float *));
    DMALLOC(kv->q32, S * H * G * d * 4);
    DMALLOC(kv->regions, S * H * 8);
    DMALLOC(kv->act, R * 4);
    DMALLOC(kv->cand, R * 4);
    DMALLOC(kv->victim, R * 4);
    DMALLOC(kv->tgt_hi, R * 4);
    DMALLOC(kv->tgt_lo, R * 4);
    DMALLOC(kv->stage, stage_pages * kv->page_bytes);
    DMALLOC(kv->d_decoded, S * kv->L * 4);
    DMALLOC(kv->d_compressed, S * 4);
    if (c->async) { /* the decode workspace of a captured step, now: a capture cannot allocate */
        const size_t g = mkv_cuda_decode_workspace_bound((int32_t)S, (int32_t)H, (int32_t)G, (int32_t)d, kv->max_len);
        DMALLOC(kv->dec_ws, g + g / 4);
        kv->dec_ws_bytes = g + g / 4;
        kv->dec_ws_capture = g;
    }
#undef DMALLOC
    if (cudaMemset(kv->d_ws_k, 0, (size_t)S * sizeof(uint16_t *)) != cudaSuccess ||
        cudaMemset(kv->d_ws_v, 0, (size_t)S * sizeof(uint16_t *)) != cudaSuccess ||
        cudaMemset(kv->d_ws_sig, 0, (size_t)S * sizeof(float *)) != cudaSuccess ||
        cudaMemset(kv->d_decoded, 0, (size_t)(S * kv->L) * 4) != cudaSuccess ||
        cudaMemset(kv->d_compressed, 0, (size_t)S * 4) != cudaSuccess) {
        cuda_destroy(base);
        return mkv_fail(c->err, MKV_STATUS_CUDA_ERROR, "cannot initialise the KV backend's device state");
    }
    return MKV_STATUS_OK;
}

/* The slot's device working memory for its current occupant's prompt. */
static mkv_status_t ws_for(mkv_cache_t *c, cuda_kv_t *kv, int32_t s, dev_ws_t **out)
{
    dev_ws_t *ws = &kv->ws[s];
    if (ws->epoch == c->epoch[s]) {
        *out = ws;
        return MKV_STATUS_OK;
    }
    ws_release(ws);
    const int64_t n = c->prompt_len[s], L = kv->L, H = kv->H, d = kv->d;
    const size_t kvb = (size_t)(L * n * H * d) * 2, sb = (size_t)(L * H * n) * 4;
    if (cudaMalloc((void **)&ws->k, kvb ? kvb : 1) != cudaSuccess ||
        cudaMalloc((void **)&ws->v, kvb ? kvb : 1) != cudaSuccess ||
        cudaMalloc((void **)&ws->sig, sb ? sb : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        ws_release(ws);
        return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY,
                        "cannot allocate %lld bytes of device prompt working memory",
                        (long long)(2 * kvb + sb));
    }
    CUDA_TRY(cudaMemcpy(kv->d_ws_k + s, &ws->k, sizeof ws->k, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(kv->d_ws_v + s, &ws->v, sizeof ws->v, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(kv->d_ws_sig + s, &ws->sig, sizeof ws->sig, cudaMemcpyHostToDevice));
    ws->n = (int32_t)n;
    ws->epoch = c->epoch[s];
    *out = ws;
    return MKV_STATUS_OK;
}

/* q, k, v and out must be memory of the cache's device: a host pointer is refused with nothing
 * changed (a kernel reading it would fault and poison the context). */
static mkv_status_t device_tensors(mkv_cache_t *c, cuda_kv_t *kv, const void *q, const void *k,
                                   const void *v, const void *out)
{
    const void *p[4] = {q, k, v, out};
    /* engines reuse their buffers: pointers checked by the previous call pass at once */
    if (memcmp(p, kv->checked, sizeof p) == 0) return MKV_STATUS_OK;
    static const char *const names[4] = {"q", "k", "v", "out"};
    for (int i = 0; i < 4; i++) {
        cudaPointerAttributes at;
        if (cudaPointerGetAttributes(&at, p[i]) != cudaSuccess) {
            (void)cudaGetLastError();
            return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT, "%s (%p) is not a pointer CUDA knows",
                            names[i], p[i]);
        }
        if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
            return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT,
                            "%s (%p) is host memory: the CUDA backend takes device tensors", names[i], p[i]);
        if (at.type == cudaMemoryTypeDevice && at.device != kv->device)
            return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT,
                            "%s is memory of device %d; the cache lives on device %d", names[i], at.device,
                            kv->device);
    }
    memcpy(kv->checked, p, sizeof p);
    return MKV_STATUS_OK;
}

/* Scatters a packed [H][total] significance block into slot j's [L][H][n] working memory. */
static __global__ void scatter_sig_kernel(const float *sig, int32_t total, int32_t row0, int32_t n,
                                          int32_t H, float *dst)
{
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (int64_t)H * n) return;
    const int32_t h = (int32_t)(e / n), i = (int32_t)(e % n);
    dst[(int64_t)h * n + i] = sig[(int64_t)h * total + row0 + i];
}

static mkv_status_t cuda_prefill(mkv_cache_t *c, mkv_kv_t *base, int32_t n_slots,
                                 const int32_t *slots, int32_t layer, mkv_dtype_t dtype,
                                 const void *q, const void *k, const void *v, void *out,
                                 void *stream_v)
{
    cuda_kv_t *kv = (cuda_kv_t *)base->impl;
    device_scope scope(kv->device);
    const cudaStream_t stream = stream_of(stream_v);
    const int64_t H = kv->H, G = kv->G, d = kv->d;
    mkv_status_t st = device_tensors(c, kv, q, k, v, out);
    if (st != MKV_STATUS_OK) return st;
    int32_t *starts = (int32_t *)malloc((size_t)(n_slots + 1) * sizeof(int32_t));
    if (!starts) return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the prefill's offsets");
    int64_t total = 0;
    int32_t max_len = 0;
    for (int32_t j = 0; j < n_slots; j++) {
        dev_ws_t *ws;
        if ((st = ws_for(c, kv, slots[j], &ws)) != MKV_STATUS_OK) {
            free(starts);
            return st;
        }
        starts[j] = (int32_t)total;
        total += c->prompt_len[slots[j]];
        if (c->prompt_len[slots[j]] > max_len) max_len = c->prompt_len[slots[j]];
    }
    starts[n_slots] = (int32_t)total;
    /* One device block for the call: fp16 q, k, v, the offsets, significance, workspace. */
    const size_t nq = (size_t)(total * H * G * d), nkv = (size_t)(total * H * d);
    const size_t wsb = mkv_cuda_prefill_workspace_size((int32_t)total, (int32_t)H, (int32_t)G, (int32_t)d);
    const size_t off_q = 0, off_k = off_q + nq * 2, off_v = off_k + nkv * 2, off_s = off_v + nkv * 2;
    const size_t off_sig = (off_s + (size_t)(n_slots + 1) * 4 + 255) / 256 * 256;
    const size_t off_ws = (off_sig + (size_t)(total * H) * 4 + 255) / 256 * 256;
    uint8_t *buf = NULL;
    if (cudaMallocAsync((void **)&buf, off_ws + wsb + 1, stream) != cudaSuccess) {
        (void)cudaGetLastError();
        free(starts);
        return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate %lld bytes of prefill workspace",
                        (long long)(off_ws + wsb));
    }
    uint16_t *q16 = (uint16_t *)(buf + off_q), *k16 = (uint16_t *)(buf + off_k), *v16 = (uint16_t *)(buf + off_v);
    int32_t *d_starts = (int32_t *)(buf + off_s);
    float *sig = (float *)(buf + off_sig);
    st = MKV_STATUS_OK;
    do {
        if (cudaMemcpyAsync(d_starts, starts, (size_t)(n_slots + 1) * 4, cudaMemcpyHostToDevice, stream) !=
            cudaSuccess) {
            st = mkv_fail(c->err, MKV_STATUS_CUDA_ERROR, "prefill: copying the offsets failed");
            break;
        }
        to_f16_kernel<<<grid_for((int64_t)nq, 256), 256, 0, stream>>>(q, dtype, (int64_t)nq, q16, 1);
        to_f16_kernel<<<grid_for((int64_t)nkv, 256), 256, 0, stream>>>(k, dtype, (int64_t)nkv, k16, 1);
        to_f16_kernel<<<grid_for((int64_t)nkv, 256), 256, 0, stream>>>(v, dtype, (int64_t)nkv, v16, 1);
        mkv_cuda_prefill_t a;
        memset(&a, 0, sizeof a);
        a.n_seq = n_slots;
        a.seq_start = d_starts;
        a.total_tokens = (int32_t)total;
        a.max_len = max_len;
        a.n_heads = (int32_t)H, a.group_size = (int32_t)G, a.head_dim = (int32_t)d;
        a.q = q16, a.k = k16, a.v = v16;
        a.out = out;
        a.out_dtype = dtype;
        a.softmax_scale = c->cfg.softmax_scale;
        a.obs_window = c->cfg.obs_window;
        a.sig_sum = sig;
        if (c->cfg.flags & MKV_CACHE_NO_SCORES) { /* no significance pass: the scores start at 0 */
            a.sig_sum = NULL;
            if (cudaMemsetAsync(sig, 0, (size_t)(total * H) * 4, stream) != cudaSuccess) {
                st = mkv_fail(c->err, MKV_STATUS_CUDA_ERROR, "prefill: clearing the significance failed");
                break;
            }
        }
        a.workspace = buf + off_ws;
        if ((st = mkv_cuda_prefill(&a, stream, c->err)) != MKV_STATUS_OK) break;
        for (int32_t j = 0; j < n_slots && st == MKV_STATUS_OK; j++) {
            const dev_ws_t *ws = &kv->ws[slots[j]];
            const int64_t n = ws->n, at = (int64_t)layer * n * H * d;
            const size_t bytes = (size_t)(n * H * d) * 2;
            if (n == 0) continue;
            if (cudaMemcpyAsync(ws->k + at, k16 + (int64_t)starts[j] * H * d, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess ||
                cudaMemcpyAsync(ws->v + at, v16 + (int64_t)starts[j] * H * d, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess) {
                st = mkv_fail(c->err, MKV_STATUS_CUDA_ERROR, "prefill: copying K/V to working memory failed");
                break;
            }
            scatter_sig_kernel<<<grid_for(H * n, 256), 256, 0, stream>>>(sig, (int32_t)total, starts[j], (int32_t)n,
                                                                         (int32_t)H, ws->sig + (int64_t)layer * H * n);
        }
        if (st == MKV_STATUS_OK) {
            const cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess) st = mkv_fail(c->err, MKV_STATUS_CUDA_ERROR, "prefill: %s", cudaGetErrorString(e));
        }
    } while (0);
    cudaFreeAsync(buf, stream);
    /* The host offsets must outlive their asynchronous copy. */
    if (cudaStreamSynchronize(stream) != cudaSuccess && st == MKV_STATUS_OK)
        st = mkv_fail(c->err, MKV_STATUS_CUDA_ERROR, "prefill: %s", cudaGetErrorString(cudaGetLastError()));
    free(starts);
    return st;
}

static mkv_status_t cuda_commit(mkv_cache_t *c, mkv_kv_t *base, int32_t n_slots,
                                const int32_t *slots, void *stream_v)
{
    cuda_kv_t *kv = (cuda_kv_t *)base->impl;
    device_scope scope(kv->device);
    const cudaStream_t stream = stream_of(stream_v);
    const mkv_cache_config_t *cfg = &c->cfg;
    const int64_t LH = (int64_t)kv->L * kv->H;
    mkv_status_t st;
    int64_t jobs = 0;
    for (int32_t j = 0; j < n_slots; j++) {
        kv->seq[j] = c->prompt_len[slots[j]];
        jobs += LH * kv->seq[j];
    }
    int32_t *place = NULL;
    CUDA_TRY(cudaMallocAsync((void **)&place, (size_t)(jobs > 0 ? jobs : 1) * 4, stream));
    slot_args sa;
    classify_args ca = {kv->d_ws_sig, (int32_t)LH, cfg->window, cfg->obs_window, cfg->alpha_h,
                        cfg->alpha_l, cfg->mix_high, cfg->mix_low, place, kv->tgt_hi, kv->tgt_lo};
    int64_t base_job = 0;
    for (int32_t first = 0; first < n_slots; first += KC_SLOTS) {
        const int32_t n = n_slots - first < KC_SLOTS ? n_slots - first : KC_SLOTS;
        fill_slots(c, slots, first, n, &sa);
        for (int32_t j = 0; j < n; j++) {
            sa.base[j] = base_job;
            base_job += LH * sa.plen[j];
        }
        const int64_t warps = (int64_t)n * LH;
        classify_kernel<<<(unsigned)((warps + KC_WARPS - 1) / KC_WARPS), KC_WARPS * 32, 0, stream>>>(sa, ca);
        LAUNCHED("classify_kernel");
    }
    /* One resize for every slot, layer and head (the admission reserved the pages). */
    const mkv_resize_t rz = {n_slots, slots, kv->seq, kv->tgt_hi, kv->tgt_lo};
    if ((st = mkv_cache_resize(c, &rz, stream_v)) != MKV_STATUS_OK) {
        cudaFreeAsync(place, stream);
        return st;
    }
    place_args pa = {kv->d_ws_k, kv->d_ws_v, kv->d_ws_sig, place, kv->mm.table, kv->mm.pool,
                     kv->page_bytes, kv->L, kv->H, kv->T, base->lay_hi, base->lay_lo};
    base_job = 0;
    for (int32_t first = 0; first < n_slots; first += KC_SLOTS) {
        const int32_t n = n_slots - first < KC_SLOTS ? n_slots - first : KC_SLOTS;
        fill_slots(c, slots, first, n, &sa);
        int64_t chunk = 0;
        for (int32_t j = 0; j < n; j++) {
            sa.base[j] = chunk;
            chunk += LH * sa.plen[j];
        }
        pa.place = place + base_job;
        const int64_t blocks = (chunk + KC_WARPS - 1) / KC_WARPS;
        if (chunk > 0) {
            place_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), KC_WARPS * 32, 0, stream>>>(sa, pa, chunk);
            LAUNCHED("place_kernel");
        }
        base_job += chunk;
    }
    cudaFreeAsync(place, stream);
    CUDA_TRY(cudaStreamSynchronize(stream)); /* the working memory is freed below */
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j];
        /* the step bookkeeping of a new occupant (kv_api.c sets the host's the same way) */
        for (int32_t l = 0; l < kv->L; l++) kv->h_decoded[(int64_t)s * kv->L + l] = c->prompt_len[s];
        kv->h_compressed[s] = 0;
        CUDA_TRY(cudaMemcpy(kv->d_decoded + (int64_t)s * kv->L, kv->h_decoded + (int64_t)s * kv->L,
                            (size_t)kv->L * 4, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMemcpy(kv->d_compressed + s, kv->h_compressed + s, 4, cudaMemcpyHostToDevice));
        ws_release(&kv->ws[s]);
        const void *null = NULL;
        CUDA_TRY(cudaMemcpy(kv->d_ws_k + s, &null, sizeof null, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMemcpy(kv->d_ws_v + s, &null, sizeof null, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMemcpy(kv->d_ws_sig + s, &null, sizeof null, cudaMemcpyHostToDevice));
    }
    return MKV_STATUS_OK;
}

static mkv_status_t cuda_decode(mkv_cache_t *c, mkv_kv_t *base, int32_t n_slots,
                                const int32_t *slots, int32_t layer, mkv_dtype_t dtype,
                                const void *q, const void *k, const void *v, void *out,
                                void *stream_v)
{
    cuda_kv_t *kv = (cuda_kv_t *)base->impl;
    device_scope scope(kv->device);
    const cudaStream_t stream = stream_of(stream_v);
    const mkv_cache_config_t *cfg = &c->cfg;
    const int64_t H = kv->H, G = kv->G, d = kv->d;
    const int64_t nq = (int64_t)n_slots * H * G * d;
    {
        const mkv_status_t ts = device_tensors(c, kv, q, k, v, out);
        if (ts != MKV_STATUS_OK) return ts;
    }
    /* A step being captured into a graph (replayed later, at other lengths) bounds every region
     * by max_seq_len; any other call by the longest N in the host's view, which an asynchronous
     * step keeps at or above the device's (a refused append only lowers the device's), so the
     * plan fits the regions as they are. Asynchronous steps keep the workspace sized for every
     * slot at max_seq_len as well. */
    int32_t max_tokens = 1, ws_seqs = n_slots;
    int64_t len_sum = 0;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (c->async && cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
        (void)cudaGetLastError();
        capture = cudaStreamCaptureStatusActive; /* unknown: plan as for a graph */
    }
    if (capture != cudaStreamCaptureStatusNone) {
        max_tokens = kv->max_len;
        ws_seqs = kv->S;
        if (c->capture_horizon > 0) { /* the engine launches the graph at most that often */
            int64_t m = 1;
            for (int32_t j = 0; j < n_slots; j++)
                if (c->st.seq_len[slots[j]] > m) m = c->st.seq_len[slots[j]];
            m += c->capture_horizon - 1;
            if (m < max_tokens) max_tokens = (int32_t)m;
        }
    } else {
        for (int32_t j = 0; j < n_slots; j++)
            if (c->st.seq_len[slots[j]] > max_tokens) max_tokens = c->st.seq_len[slots[j]];
    }
    /* The plan's hint: the mean region, from the sequences' lengths and the share of tokens the
     * cache kept at the last stats (a captured step keeps it as its sequences grow). */
    for (int32_t j = 0; j < n_slots; j++) len_sum += c->st.seq_len[slots[j]];
    const double mean = n_slots > 0 ? (double)len_sum / n_slots * c->kept_fraction : 0.0;
    const int32_t mean_tokens = mean >= 1.0 && mean < (double)max_tokens ? (int32_t)mean : 0;
    if (ws_seqs != kv->ws_seqs_last || max_tokens != kv->ws_max_last) {
        kv->ws_need_last = mkv_cuda_decode_workspace_size(ws_seqs, (int32_t)H, (int32_t)G, (int32_t)d, max_tokens, 0);
        kv->ws_seqs_last = ws_seqs, kv->ws_max_last = max_tokens;
    }
    size_t need = kv->ws_need_last;
    if (c->async && kv->dec_ws_capture > need) /* room for a captured step too: a capture never allocates */
        need = kv->dec_ws_capture;
    if (need > kv->dec_ws_bytes) { /* grows rarely: to the longest context seen */
        CUDA_TRY(cudaStreamSynchronize(stream));
        cudaFree(kv->dec_ws);
        kv->dec_ws = NULL;
        kv->dec_ws_bytes = 0;
        const size_t want = need + need / 4;
        if (cudaMalloc(&kv->dec_ws, want) != cudaSuccess) {
            (void)cudaGetLastError();
            return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate %lld bytes of decode workspace",
                            (long long)want);
        }
        kv->dec_ws_bytes = want;
    }
    /* q and out travel in f32; one launch converts q and writes the new tokens. */
    const float *q32 = dtype == MKV_DTYPE_F32 ? (const float *)q : kv->q32;
    slot_args sa;
    new_token_args na = {k, v, q, kv->q32, 0, 0, (int32_t)dtype, kv->mm.table, kv->mm.n_hi, kv->mm.len,
                         kv->mm.fail, kv->mm.pool, kv->page_bytes, base->lay_hi, kv->L, kv->H, kv->T,
                         layer, kv->mm.empty_region, kv->regions, kv->d_decoded};
    for (int32_t first = 0; first < n_slots; first += KC_SLOTS) {
        const int32_t n = n_slots - first < KC_SLOTS ? n_slots - first : KC_SLOTS;
        fill_slots(c, slots, first, n, &sa);
        na.token_blocks = (uint32_t)((2 * (int64_t)n * H + KC_WARPS - 1) / KC_WARPS);
        unsigned q_blocks = 0;
        if (first == 0 && dtype != MKV_DTYPE_F32) {
            na.q_elems = nq;
            q_blocks = grid_for(nq, KC_WARPS * 32) < 1024 ? grid_for(nq, KC_WARPS * 32) : 1024;
        } else {
            na.q_elems = 0;
        }
        new_token_kernel<<<na.token_blocks + q_blocks, KC_WARPS * 32, 0, stream>>>(sa, na);
        LAUNCHED("new_token_kernel");
    }
    mkv_cuda_decode_t da;
    memset(&da, 0, sizeof da);
    da.pool = kv->mm.pool, da.page_bytes = kv->page_bytes;
    da.lay_hi = base->lay_hi, da.lay_lo = base->lay_lo;
    da.table = kv->mm.table, da.n_hi = kv->mm.n_hi, da.n_lo = kv->mm.n_lo, da.row_entries = kv->T;
    da.regions = kv->regions;
    da.n_seq = n_slots, da.n_heads = (int32_t)H, da.group_size = (int32_t)G, da.head_dim = (int32_t)d;
    da.max_tokens = max_tokens;
    da.mean_tokens = mean_tokens;
    da.q = q32;
    if (dtype == MKV_DTYPE_F32) da.out = (float *)out;
    else da.out16 = (uint16_t *)out, da.out_bf16 = dtype == MKV_DTYPE_BF16; /* written as dtype */
    da.softmax_scale = cfg->softmax_scale;
    da.no_scores = (cfg->flags & MKV_CACHE_NO_SCORES) != 0;
    da.workspace = kv->dec_ws;
    return mkv_cuda_decode(&da, stream, c->err);
}

static mkv_status_t launch_regions(mkv_cache_t *c, cuda_kv_t *kv, const int32_t *slots, int32_t n_slots,
                                   int which, const compress_args *ca, cudaStream_t stream)
{
    slot_args sa;
    const int64_t LH = (int64_t)kv->L * kv->H;
    for (int32_t first = 0; first < n_slots; first += KC_SLOTS) {
        const int32_t n = n_slots - first < KC_SLOTS ? n_slots - first : KC_SLOTS;
        fill_slots(c, slots, first, n, &sa);
        const int64_t warps = (int64_t)n * LH * (which == 2 ? 2 : 1); /* unstage: key, value apart */
        const unsigned blocks = (unsigned)((warps + KC_WARPS - 1) / KC_WARPS);
        switch (which) {
        case 0: decide_kernel<<<blocks, KC_WARPS * 32, 0, stream>>>(sa, *ca); break;
        case 1: move_kernel<<<blocks, KC_WARPS * 32, 0, stream>>>(sa, *ca); break;
        case 2: unstage_kernel<<<blocks, KC_WARPS * 32, 0, stream>>>(sa, *ca); break;
        default: budget_kernel<<<blocks, KC_WARPS * 32, 0, stream>>>(sa, *ca); break;
        }
        LAUNCHED("compress kernel");
    }
    return MKV_STATUS_OK;
}

struct move_ctx {
    mkv_cache_t *c;
    cuda_kv_t *kv;
    const int32_t *slots;
    int32_t n_slots;
    const compress_args *ca;
};

/* Between the fit check and the page movement of compress's resize. */
static mkv_status_t launch_moves(void *ctx, void *stream, char *err)
{
    (void)err;
    const move_ctx *m = (const move_ctx *)ctx;
    return launch_regions(m->c, m->kv, m->slots, m->n_slots, 1, m->ca, stream_of(stream));
}

/* Decide (reading only), then one resize whose fit check gates the moves that must see the
 * pages before it (stage, swap-remove, demote into a pruned victim's slot), then the demotions
 * into new low slots, then budgets and their shrinking resize. Nothing here waits for the
 * device: with MKV_CACHE_ASYNC_STEPS a refusal is collected later, else at the resize. */
static mkv_status_t cuda_compress(mkv_cache_t *c, mkv_kv_t *base, int32_t n_slots,
                                  const int32_t *slots, void *stream_v)
{
    cuda_kv_t *kv = (cuda_kv_t *)base->impl;
    device_scope scope(kv->device);
    const cudaStream_t stream = stream_of(stream_v);
    const mkv_cache_config_t *cfg = &c->cfg;
    int budgets = 0;
    for (int32_t j = 0; j < n_slots; j++) budgets |= mkv_kv_budget(c, base, slots[j]) > 0;
    compress_args ca = {kv->mm.table, kv->mm.n_hi, kv->mm.n_lo, kv->mm.pool, kv->stage,
                        kv->page_bytes, kv->L * kv->H, kv->T, cfg->window, cfg->obs_window,
                        cfg->alpha_h, cfg->alpha_l, base->lay_hi, base->lay_lo, kv->act,
                        kv->cand, kv->victim, kv->tgt_hi, kv->tgt_lo, cfg->mix_high, cfg->mix_low,
                        kv->mm.len, kv->mm.fail,
                        kv->mm.check_code, kv->mm.fail_rec, kv->mm.fail_host, kv->d_compressed, kv->L};
    /* With both thresholds 0 every significance passes: Algorithm 1 keeps everything; the
     * decide kernel still records the step. */
    const int mix = cfg->mix_high > 0.0f || cfg->mix_low > 0.0f;
    const int keep_all = !mix && cfg->alpha_h == 0.0f && cfg->alpha_l == 0.0f;
    if (keep_all) ca.window = INT32_MAX;
    mkv_status_t st = launch_regions(c, kv, slots, n_slots, 0, &ca, stream);
    if (st != MKV_STATUS_OK) return st;
    move_ctx m = {c, kv, slots, n_slots, &ca};
    if (!keep_all &&
        (st = mkv_cache_resize_device(c, n_slots, slots, kv->tgt_hi, kv->tgt_lo, launch_moves, &m,
                                      stream_v)) != MKV_STATUS_OK)
        return st;
    if ((st = launch_regions(c, kv, slots, n_slots, 2, &ca, stream)) != MKV_STATUS_OK) return st;
    if (!budgets) return MKV_STATUS_OK;
    ca.window = cfg->window;
    if ((st = launch_regions(c, kv, slots, n_slots, 3, &ca, stream)) != MKV_STATUS_OK) return st;
    return mkv_cache_resize_device(c, n_slots, slots, kv->tgt_hi, kv->tgt_lo, NULL, NULL, stream_v);
}

static void cuda_refresh(mkv_cache_t *c, mkv_kv_t *base)
{
    cuda_kv_t *kv = (cuda_kv_t *)base->impl;
    device_scope scope(kv->device);
    if (cudaMemcpy(base->decoded, kv->d_decoded, (size_t)kv->S * kv->L * 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(base->compressed, kv->d_compressed, (size_t)kv->S * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        snprintf(c->err, sizeof c->err, "refresh: %s", cudaGetErrorString(cudaGetLastError()));
}

extern "C" const mkv_kv_ops_t mkv_kv_cuda_ops = {"cuda", cuda_create, cuda_destroy, cuda_prefill,
                                                  cuda_commit, cuda_decode, cuda_compress,
                                                  cuda_refresh};
