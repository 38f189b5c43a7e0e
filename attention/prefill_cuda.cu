/*
 * prefill_cuda.cu — causal prefill attention with prompt-phase significance on the GPU
 * (contract in prefill_cuda.h; reference: mkv_attn_prefill in prefill_ref.c, which
 * tests/gpu/test_prefill_cuda.c compares against).
 *
 * Two passes, both enqueued on the caller's stream (the second only where sig_sum is given):
 *   1. the forward: out and each row's log2-sum-exp (lse2, the workspace: [total][H * G]);
 *   2. the significance column pass: a CTA owns a tile of keys of one KV head of one sequence,
 *      recomputes the logits of the observing queries against its keys, turns them into
 *      probabilities with lse2, takes the max over the G heads of the group and sums over the
 *      observers. Each sig_sum slot is written once, by the CTA that owns its key, or (long
 *      prompts with many observers, tensor-core path) each of up to 8 CTAs that split the
 *      observers writes a partial sum to the workspace and sig_reduce_kernel adds them in a
 *      fixed order: no atomics, the same bits on every run.
 * With obs_window 64 the column pass costs little; with every query observing it costs about
 * one more Q K^T (no P V): 0.6 to 0.8 of the forward on an H100 (docs/results.md).
 *
 * Workspace: lse2 [total][H * G] floats, then [8][H][total] floats of partial sums.
 *
 * Kernel families: tensor-core kernels (prefill_tc.cuh) for head_dim 64 and 128 with G <= 16
 * and 16-byte aligned q, k, v; generic fp32 kernels (below) for every other shape.
 *
 * Grids: x enumerates (tile, head) with the head fastest, y the sequence. A sequence's tiles
 * are counted from max_len, so the CTAs past a shorter sequence's end return at once; no table
 * of tiles is needed, hence no workspace that depends on n_seq and no host synchronisation.
 */
#include "attention/prefill_cuda.h"

#include "attention/prefill_tc.cuh"
#include "common/error.h"

#include <cuda_runtime.h>

#include <atomic>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

using mkv_prefill::pf_args;

#define PF_G_THREADS 128
#define PF_G_ROWS 16 /* tokens per generic forward CTA: 4 per warp */
#define PF_G_KT 32   /* keys per generic tile: one per lane */
#define PF_MAX_D 256
#define PF_KW (PF_MAX_D / 2 + 1) /* 32-bit words per padded key row: lane j reads row j */
#define PF_WS_ALIGN 256
#define PF_MAX_DEVICES 64 /* devices whose shared-memory opt-in is remembered */

/* ---------------------------------------------------------------------------------------- */
/* Generic kernels: any head_dim in {16, .., 256}, any G                                    */
/* ---------------------------------------------------------------------------------------- */

/* Copies rows [kb, kb + 32) of K (padded half2 rows) and V of head h into shared memory,
 * zeros past the sequence. */
__device__ static void load_kv_generic(const pf_args &a, int64_t s0, int32_t n, int32_t h, int32_t kb,
                                       __half2 (*sk)[PF_KW], __half *sv, bool with_v)
{
    const int32_t w = a.d / 2;
    for (int32_t i = threadIdx.x; i < PF_G_KT * w; i += blockDim.x) {
        const int32_t r = i / w, c = i % w;
        const bool in = kb + r < n;
        const int64_t at = ((s0 + kb + r) * a.H + h) * a.d + 2 * c;
        const __half2 zero = __floats2half2_rn(0.0f, 0.0f);
        sk[r][c] = in ? *reinterpret_cast<const __half2 *>(a.k + at) : zero;
        if (with_v) reinterpret_cast<__half2 *>(sv)[r * w + c] = in ? *reinterpret_cast<const __half2 *>(a.v + at) : zero;
    }
}

/* Dot product of a q row (shared, broadcast) with padded key row j. */
__device__ static float dot_generic(const __half *q, const __half2 *krow, int32_t d)
{
    float acc = 0.0f;
    const __half2 *q2 = reinterpret_cast<const __half2 *>(q);
    for (int32_t c = 0; c < d / 2; c++) {
        const float2 x = __half22float2(q2[c]), y = __half22float2(krow[c]);
        acc = fmaf(x.x, y.x, acc);
        acc = fmaf(x.y, y.y, acc);
    }
    return acc;
}

/* grid (HG * tiles, n_seq): 16 tokens of one query head; warp w takes tokens w * 4 .. + 3,
 * lane j key j of each 32-key tile; online softmax per row with warp shuffles; the output
 * element e of a row is lane e % 32's. */
__global__ static void __launch_bounds__(PF_G_THREADS) fwd_generic_kernel(pf_args a)
{
    __shared__ __half sq[PF_G_ROWS][PF_MAX_D];
    __shared__ __half2 sk[PF_G_KT][PF_KW];
    __shared__ __half sv[PF_G_KT * PF_MAX_D];
    const int32_t qh = blockIdx.x % a.HG, h = qh / a.G;
    int64_t s0;
    int32_t n;
    mkv_prefill::seq_of(a, &s0, &n);
    const int32_t tiles = (n + PF_G_ROWS - 1) / PF_G_ROWS;
    const int32_t tile_rev = blockIdx.x / a.HG;
    if (tile_rev >= tiles) return;
    const int32_t t0 = (tiles - 1 - tile_rev) * PF_G_ROWS, t_last = min(t0 + PF_G_ROWS, n) - 1;
    const int32_t d = a.d, warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    for (int32_t i = threadIdx.x; i < PF_G_ROWS * d; i += blockDim.x) {
        const int32_t r = i / d, t = min(t0 + r, n - 1);
        sq[r][i % d] = a.q[((s0 + t) * a.HG + qh) * d + i % d];
    }
    float acc[4][PF_MAX_D / 32], m[4], l[4];
    int32_t tok[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        m[r] = -INFINITY, l[r] = 0.0f, tok[r] = min(t0 + warp * 4 + r, n - 1);
#pragma unroll
        for (int c = 0; c < PF_MAX_D / 32; c++) acc[r][c] = 0.0f;
    }
    for (int32_t kb = 0; kb <= t_last; kb += PF_G_KT) {
        __syncthreads(); /* the previous tile is consumed (and sq written, the first time) */
        load_kv_generic(a, s0, n, h, kb, sk, sv, true);
        __syncthreads();
        const int32_t key = kb + lane;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            float x = dot_generic(sq[warp * 4 + r], sk[lane], d) * a.scale2;
            if (key > tok[r]) x = -INFINITY;
            float mx = x;
            for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            mx = fmaxf(mx, m[r]); /* finite: key 0 is in the first tile */
            const float corr = exp2f(m[r] - mx), p = exp2f(x - mx);
            m[r] = mx;
            l[r] = l[r] * corr + p;
#pragma unroll
            for (int c = 0; c < PF_MAX_D / 32; c++) acc[r][c] *= corr;
            for (int32_t j = 0; j < PF_G_KT; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int c = 0; c < PF_MAX_D / 32; c++)
                    if (lane + 32 * c < d) acc[r][c] = fmaf(pj, __half2float(sv[j * d + lane + 32 * c]), acc[r][c]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        float sum = l[r];
        for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const int32_t t = t0 + warp * 4 + r;
        if (t >= n) continue;
        const int64_t row = (s0 + t) * a.HG + qh;
        const float inv = 1.0f / sum;
#pragma unroll
        for (int c = 0; c < PF_MAX_D / 32; c++) {
            const int32_t e = lane + 32 * c;
            if (e >= d) continue;
            const float y = acc[r][c] * inv;
            if (a.out_dtype == MKV_DTYPE_F32) static_cast<float *>(a.out)[row * d + e] = y;
            else if (a.out_dtype == MKV_DTYPE_F16) static_cast<__half *>(a.out)[row * d + e] = __float2half_rn(y);
            else static_cast<__nv_bfloat16 *>(a.out)[row * d + e] = __float2bfloat16_rn(y);
        }
        if (lane == 0) a.lse2[row] = m[r] + log2f(sum);
    }
}

/* grid (H * key tiles, n_seq): 32 keys of KV head h, lane j key kb + j; warp w takes the
 * observers ts + w, ts + w + 4, ..; per observer the max over g of the probability, then the
 * column sums are added over the warps. */
__global__ static void __launch_bounds__(PF_G_THREADS) sig_generic_kernel(pf_args a)
{
    __shared__ __half2 sk[PF_G_KT][PF_KW];
    __shared__ __half sq[PF_G_THREADS / 32][PF_MAX_D];
    __shared__ float red[PF_G_THREADS / 32][PF_G_KT];
    const int32_t h = blockIdx.x % a.H;
    int64_t s0;
    int32_t n;
    mkv_prefill::seq_of(a, &s0, &n);
    const int32_t kb = (blockIdx.x / a.H) * PF_G_KT;
    if (kb >= n) return;
    const int32_t d = a.d, warp = threadIdx.x / 32, lane = threadIdx.x % 32, key = kb + lane;
    load_kv_generic(a, s0, n, h, kb, sk, nullptr, false);
    __syncthreads();
    const int32_t ts = max(kb, mkv_prefill::first_observer(n, a.obs_window));
    float col = 0.0f;
    for (int32_t t = ts + warp; t < n; t += PF_G_THREADS / 32) {
        float mx = 0.0f;
        for (int32_t g = 0; g < a.G; g++) {
            const int64_t row = (s0 + t) * a.HG + (int64_t)h * a.G + g;
            __syncwarp();
            for (int32_t e = lane; e < d; e += 32) sq[warp][e] = a.q[row * d + e];
            __syncwarp();
            const float p = exp2f(dot_generic(sq[warp], sk[lane], d) * a.scale2 - a.lse2[row]);
            mx = fmaxf(mx, p);
        }
        if (t >= key) col += mx;
    }
    red[warp][lane] = col;
    __syncthreads();
    if (warp == 0 && key < n) {
        float s = 0.0f;
        for (int w = 0; w < PF_G_THREADS / 32; w++) s += red[w][lane];
        a.sig[(int64_t)h * a.total + s0 + key] = s;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Launchers                                                                                */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t launched(const char *what, char *err, cudaError_t e = cudaSuccess)
{
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e == cudaSuccess) return MKV_STATUS_OK;
    if (err) mkv_fail(err, MKV_STATUS_CUDA_ERROR, "mkv_cuda_prefill: %s launch: %s", what,
                      cudaGetErrorString(e));
    return MKV_STATUS_CUDA_ERROR;
}

static unsigned tiles_of(int32_t max_len, int32_t tokens) { return (unsigned)((max_len + tokens - 1) / tokens); }

template <int D>
static mkv_status_t launch_tc(pf_args a, int32_t n_seq, int32_t max_len, cudaStream_t stream, char *err)
{
    using namespace mkv_prefill;
    constexpr int fwd_smem = fwd_smem_bytes<D>(), sig_smem = sig_smem_bytes<D>();
    /* The opt-in above 48 KB, once per device (no stream operation: capturable). Set on the
     * host between the caller's event and the launch it would show as GPU idle time. */
    static std::atomic<bool> opted[PF_MAX_DEVICES];
    int dev = -1;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess && (dev < 0 || dev >= PF_MAX_DEVICES || !opted[dev].load(std::memory_order_relaxed))) {
        e = cudaFuncSetAttribute(fwd_tc_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, fwd_smem);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(sig_tc_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, sig_smem);
        if (e == cudaSuccess && dev >= 0 && dev < PF_MAX_DEVICES) opted[dev].store(true, std::memory_order_relaxed);
    }
    if (e != cudaSuccess) return launched("cudaFuncSetAttribute (prefill)", err, e);
    fwd_tc_kernel<D><<<dim3(tiles_of(max_len, PF_TC_BM / a.G) * (unsigned)a.H, (unsigned)n_seq), PF_TC_THREADS,
                       fwd_smem, stream>>>(a);
    mkv_status_t st = launched("fwd_tc_kernel", err);
    if (st != MKV_STATUS_OK || !a.sig) return st; /* no significance asked */
    /* Split the observers of a key tile over parts where they are many (obs_window 0 on long
     * prompts): the first key tiles would otherwise each run the whole prompt alone, long
     * after the others are done. A part takes at least 4 observer tiles. */
    const int32_t observers = a.obs_window > 0 && a.obs_window < max_len ? a.obs_window : max_len;
    a.parts = min(PF_SIG_MAX_PARTS, max(1, (observers / PF_SIG_TT + 2 + 3) / 4));
    sig_tc_kernel<D><<<dim3(tiles_of(max_len, PF_SIG_BN) * (unsigned)a.H, (unsigned)n_seq, (unsigned)a.parts),
                       PF_SIG_THREADS, sig_smem, stream>>>(a);
    if ((st = launched("sig_tc_kernel", err)) != MKV_STATUS_OK || a.parts == 1) return st;
    const int64_t n = (int64_t)a.H * a.total;
    const unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    sig_reduce_kernel<<<blocks, 256, 0, stream>>>(a);
    return launched("sig_reduce_kernel", err);
}

static mkv_status_t launch_generic(pf_args a, int32_t n_seq, int32_t max_len, cudaStream_t stream, char *err)
{
    fwd_generic_kernel<<<dim3(tiles_of(max_len, PF_G_ROWS) * (unsigned)a.HG, (unsigned)n_seq), PF_G_THREADS, 0,
                         stream>>>(a);
    mkv_status_t st = launched("fwd_generic_kernel", err);
    if (st != MKV_STATUS_OK || !a.sig) return st; /* no significance asked */
    sig_generic_kernel<<<dim3(tiles_of(max_len, PF_G_KT) * (unsigned)a.H, (unsigned)n_seq), PF_G_THREADS, 0,
                         stream>>>(a);
    return launched("sig_generic_kernel", err);
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
        mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_prefill: %s", msg);
    }
    return MKV_STATUS_INVALID_ARGUMENT;
}

static bool valid_dim(int32_t d) { return d == 16 || d == 32 || d == 64 || d == 128 || d == 256; }

/* Query heads per call: the grid's x of the generic forward is H * G * tiles. */
#define PF_MAX_HEADS 4096

/* The workspace: lse2 [total][H * G] floats, then the column pass's partial sums
 * [PF_SIG_MAX_PARTS][H][total] floats, each 256-byte aligned. */
static int64_t lse_bytes(int64_t total, int64_t HG)
{
    return mkv_align_up64(total * HG * (int64_t)sizeof(float), PF_WS_ALIGN);
}

extern "C" size_t mkv_cuda_prefill_workspace_size(int32_t total_tokens, int32_t n_heads, int32_t group_size,
                                                  int32_t head_dim)
{
    if (total_tokens < 0 || n_heads < 1 || group_size < 1 || (int64_t)n_heads * group_size > PF_MAX_HEADS ||
        !valid_dim(head_dim))
        return 0;
    const int64_t parts = (int64_t)PF_SIG_MAX_PARTS * n_heads * total_tokens * (int64_t)sizeof(float);
    const int64_t bytes = lse_bytes(total_tokens, (int64_t)n_heads * group_size) + mkv_align_up64(parts, PF_WS_ALIGN);
    return (size_t)(bytes > 0 ? bytes : PF_WS_ALIGN);
}

static bool aligned(const void *p, uintptr_t to) { return (uintptr_t)p % to == 0; }

extern "C" mkv_status_t mkv_cuda_prefill(const mkv_cuda_prefill_t *a, void *stream, char *err)
{
    if (!a) return bad(err, "null arguments");
    if (a->n_seq < 0 || a->n_seq > 65535)
        return bad(err, "n_seq %d (0 .. 65535: the grid's y)", a->n_seq);
    if (a->n_heads < 1 || a->group_size < 1 || (int64_t)a->n_heads * a->group_size > PF_MAX_HEADS ||
        !valid_dim(a->head_dim))
        return bad(err, "n_heads %d, group_size %d (H * G <= %d), head_dim %d (16, 32, 64, 128 or 256)",
                   a->n_heads, a->group_size, PF_MAX_HEADS, a->head_dim);
    /* Sequences longer than max_len would be cut short by the grid: refuse what shows it. */
    if (a->total_tokens < 0 || a->max_len < 0 || a->max_len > a->total_tokens ||
        (int64_t)a->max_len * a->n_seq < a->total_tokens)
        return bad(err, "total_tokens %d, max_len %d, n_seq %d (max_len <= total_tokens <= n_seq * max_len)",
                   a->total_tokens, a->max_len, a->n_seq);
    if (a->out_dtype != MKV_DTYPE_F32 && a->out_dtype != MKV_DTYPE_F16 && a->out_dtype != MKV_DTYPE_BF16)
        return bad(err, "out_dtype %d (f32, f16 or bf16)", (int)a->out_dtype);
    if (!(a->softmax_scale > 0.0f) || !isfinite(a->softmax_scale))
        return bad(err, "softmax_scale %g (finite, > 0)", (double)a->softmax_scale);
    if (a->obs_window < 0) return bad(err, "obs_window %d (0: every query observes)", a->obs_window);
    if (a->n_seq > 0 && !a->seq_start) return bad(err, "null seq_start");
    if (a->n_seq == 0 || a->total_tokens == 0 || a->max_len == 0) return MKV_STATUS_OK;
    if (!a->q || !a->k || !a->v || !a->out || !a->workspace)
        return bad(err, "null pointer (q %p, k %p, v %p, out %p, sig_sum %p, workspace %p)", (const void *)a->q,
                   (const void *)a->k, (const void *)a->v, a->out, (void *)a->sig_sum, a->workspace);
    const size_t el = a->out_dtype == MKV_DTYPE_F32 ? 4 : 2;
    if (!aligned(a->q, 4) || !aligned(a->k, 4) || !aligned(a->v, 4) || !aligned(a->out, el) ||
        !aligned(a->sig_sum, 4) || !aligned(a->workspace, PF_WS_ALIGN))
        return bad(err, "misaligned pointer: q, k, v need 4 bytes, out its element, sig_sum 4 and the "
                        "workspace %d", PF_WS_ALIGN);

    if (((int64_t)a->max_len + PF_G_ROWS - 1) / PF_G_ROWS * a->n_heads * a->group_size > INT32_MAX)
        return bad(err, "max_len %d too long for %d query heads (the grid's x)", a->max_len,
                   a->n_heads * a->group_size);

    pf_args p;
    p.seq_start = a->seq_start;
    p.H = a->n_heads, p.G = a->group_size, p.d = a->head_dim, p.HG = a->n_heads * a->group_size;
    p.q = reinterpret_cast<const __half *>(a->q);
    p.k = reinterpret_cast<const __half *>(a->k);
    p.v = reinterpret_cast<const __half *>(a->v);
    p.out = a->out;
    p.out_dtype = (int32_t)a->out_dtype;
    p.scale2 = a->softmax_scale * 1.4426950408889634f;
    p.obs_window = a->obs_window;
    p.sig = a->sig_sum;
    p.lse2 = static_cast<float *>(a->workspace);
    p.total = a->total_tokens;
    p.parts = 1; /* the generic column pass and short observer ranges write sig directly */
    p.part_sig = reinterpret_cast<float *>(static_cast<uint8_t *>(a->workspace) + lse_bytes(p.total, p.HG));

    cudaStream_t s = static_cast<cudaStream_t>(stream);
    /* The tensor-core kernels copy 16-byte chunks of q, k, v and store pairs of out. */
    const bool tc = a->group_size <= PF_TC_MAX_G && aligned(a->q, 16) && aligned(a->k, 16) &&
                    aligned(a->v, 16) && aligned(a->out, 2 * el);
    if (tc && a->head_dim == 64) return launch_tc<64>(p, a->n_seq, a->max_len, s, err);
    if (tc && a->head_dim == 128) return launch_tc<128>(p, a->n_seq, a->max_len, s, err);
    return launch_generic(p, a->n_seq, a->max_len, s, err);
}
