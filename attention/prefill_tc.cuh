/*
 * prefill_tc.cuh — the tensor-core kernels of the GPU prefill (attention/prefill_cuda.cu, the
 * only includer), instantiated for head_dim 64 and 128: fp16 operands of mma.sync.m16n8k16
 * loaded with ldmatrix from XOR-swizzled shared memory, fp32 accumulators.
 *
 * Rows of the GQA group are packed: a CTA takes one KV head h and TT = 128 / G consecutive
 * tokens, and row r of its 128-row tile is token r / G, query head h * G + r % G. The G heads
 * of a token are adjacent in q and out, and each K/V tile staged in shared memory serves all
 * of them.
 *
 * fwd_tc_kernel (FlashAttention-2 style): 4 warps of 32 rows (two m16 tiles each), key tiles
 * of BN = 64 staged by cp.async in two buffers, causal mask only on the tiles that need it,
 * online softmax in base 2 (one FFMA and one exp2 per logit) with a per-thread partial row sum
 * (the quad is reduced once at the end), P packed to fp16 A fragments straight from the S
 * accumulators. Q is re-read from shared memory at each k-step (in registers it would cost 64
 * more per thread at d 128). Two CTAs per SM (registers and 96 KB of shared memory at d 128).
 * Writes out and each row's log2-sum-exp (lse2 = max * scale2 + log2(sum), so that
 * p = exp2(s * scale2 - lse2) with scale2 = softmax_scale * log2(e)).
 *
 * sig_tc_kernel (the column pass): a CTA owns 128 keys of one KV head of one sequence and one
 * part of their observers. Its 8 warps are 4 key quarters x 2 token halves. Observers stream
 * through shared memory in stages of (64 tokens, one query head g) with their lse2, 4 stages
 * in flight (cp.async); K stays in shared memory and is re-read by ldmatrix at every stage,
 * which keeps the kernel at 124 registers, two CTAs per SM (holding K fragments in registers
 * instead was 4-8 % slower on an H100: one CTA per SM). Per stage: S = Q_g K^T (the forward's
 * mma chain, so the same bits), P = exp2(S * scale2 - lse2), the running max over g; after the
 * last g of a token tile, the masked maxima (token t >= key i, t < n) go into per-thread column
 * sums, reduced over the warp's lanes and the two token-half warps at the end. A part writes
 * sig_sum directly when there is one part, else its slice of the workspace, which
 * sig_reduce_kernel adds up in part order: no atomics, deterministic results.
 */
#ifndef MKV_ATTENTION_PREFILL_TC_CUH
#define MKV_ATTENTION_PREFILL_TC_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace mkv_prefill {

#define PF_TC_THREADS 128
#define PF_TC_BM 128 /* packed (token, g) rows per forward CTA */
#define PF_SIG_BN 128 /* keys per significance CTA: 4 warps' worth of 32 */
#define PF_SIG_THREADS 256 /* 8 warps: 4 key quarters x 2 token halves */
#define PF_FWD_BN 64 /* keys per forward key tile (32 measured the same at d 128) */
#define PF_SIG_TT 64 /* observer tokens per significance stage */
#define PF_TC_MAX_G 16 /* G <= 16: at least 8 tokens per forward CTA */
#define PF_SIG_STAGES 4 /* Q stages in flight in the column pass */
#define PF_SIG_MAX_PARTS 8 /* observer ranges split in at most this many parts */

/* What every kernel gets (prefill_cuda.cu fills it from mkv_cuda_prefill_t). */
struct pf_args {
    const int32_t *seq_start; /* [n_seq + 1] */
    int32_t H, G, d, HG;
    const __half *q;          /* [total][HG][d] */
    const __half *k, *v;      /* [total][H][d] */
    void *out;                /* [total][HG][d], out_dtype */
    int32_t out_dtype;        /* mkv_dtype_t */
    float scale2;             /* softmax_scale * log2(e) */
    int32_t obs_window;
    float *sig;               /* [H][total] */
    float *lse2;              /* [total][HG] workspace: log2-sum-exp of each row */
    int64_t total;
    int32_t parts;            /* observer ranges of the column pass split in this many parts */
    float *part_sig;          /* [parts][H][total] workspace: their sums when parts > 1 */
};

/* The sequence of blockIdx.y: its first row and length. */
__device__ __forceinline__ void seq_of(const pf_args &a, int64_t *s0, int32_t *n)
{
    const int32_t b = a.seq_start[blockIdx.y], e = a.seq_start[blockIdx.y + 1];
    *s0 = b;
    *n = e > b ? e - b : 0;
}

/* The first observer of a sequence of n tokens. */
__device__ __forceinline__ int32_t first_observer(int32_t n, int32_t obs_window)
{
    return obs_window > 0 && n - obs_window > 0 ? n - obs_window : 0;
}

__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* One output pair (row, columns c, c + 1) in the caller's element type. */
__device__ __forceinline__ void store_pair(void *out, int32_t dtype, int64_t at, float x, float y)
{
    if (dtype == 0)
        *reinterpret_cast<float2 *>(static_cast<float *>(out) + at) = make_float2(x, y);
    else if (dtype == 1)
        *reinterpret_cast<__half2 *>(static_cast<__half *>(out) + at) = __floats2half2_rn(x, y);
    else
        *reinterpret_cast<__nv_bfloat162 *>(static_cast<__nv_bfloat16 *>(out) + at) =
            __floats2bfloat162_rn(x, y);
}

/* ---- PTX wrappers ---------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* 16 bytes global -> shared; read false writes zeros (src is not read). */
__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool read)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(read ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm4(uint32_t addr, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm4_t(uint32_t addr, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* c += A B, m16n8k16, row.col, fp16 in, fp32 accumulators. */
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* Byte offset of 16-byte chunk c of row r in a tile of D halves per row: chunks XOR-swizzled
 * by the row's low 3 bits, so that the 8 rows one ldmatrix matrix reads hit 8 distinct bank
 * groups (rows are 128 or 256 bytes: unswizzled, they would all hit the same banks). */
template <int D>
__device__ __forceinline__ uint32_t swz(int32_t r, int32_t c)
{
    return (uint32_t)(r * (D * 2) + ((c ^ (r & 7)) << 4));
}

/* cp.async of rows [0, ROWS) of a tile: row i from src_row(i), or zeros where that is null
 * (the copy then reads nothing, but is still given a valid address: any). */
template <int D, int ROWS, int THREADS = PF_TC_THREADS, typename F>
__device__ __forceinline__ void load_tile(uint32_t base, const __half *any, F src_row)
{
    constexpr int CH = D / 8; /* 16-byte chunks per row */
    static_assert(ROWS * CH % THREADS == 0, "whole rounds of chunks");
#pragma unroll
    for (int32_t it = 0; it < ROWS * CH / THREADS; it++) {
        const int32_t i = it * THREADS + (int32_t)threadIdx.x;
        const int32_t r = i / CH, c = i % CH;
        const __half *s = src_row(r);
        cp16(base + swz<D>(r, c), s ? s + c * 8 : any, s != nullptr);
    }
}

/* ---- The forward ----------------------------------------------------------------------- */

template <int D>
__host__ __device__ constexpr int fwd_smem_bytes() { return (PF_TC_BM + 4 * PF_FWD_BN) * D * 2; } /* Q, 2 K, 2 V */

template <int D>
__global__ void __launch_bounds__(PF_TC_THREADS, 2) fwd_tc_kernel(pf_args a)
{
    constexpr int BN = PF_FWD_BN, NT = BN / 8, DT = D / 8, KS = D / 16;
    extern __shared__ __align__(128) uint8_t smem[];
    const int32_t h = blockIdx.x % a.H;
    const int32_t TT = PF_TC_BM / a.G; /* tokens of this CTA */
    int64_t s0;
    int32_t n;
    seq_of(a, &s0, &n);
    const int32_t tiles = (n + TT - 1) / TT;
    const int32_t tile_rev = blockIdx.x / a.H; /* the heaviest (last) tiles first */
    if (tile_rev >= tiles) return;
    const int32_t t0 = (tiles - 1 - tile_rev) * TT;
    const int32_t t_last = min(t0 + TT, n) - 1;
    const int32_t n_kt = t_last / BN + 1;

    const uint32_t sQ = smem_u32(smem);
    const uint32_t sK = sQ + PF_TC_BM * D * 2, sV = sK + 2 * BN * D * 2;
    const int32_t rows = TT * a.G;
    const int64_t kv_stride = (int64_t)a.H * D;

    load_tile<D, PF_TC_BM>(sQ, a.q, [&](int32_t r) -> const __half * {
        const int32_t t = t0 + r / a.G;
        if (r >= rows || t >= n) return nullptr;
        return a.q + ((s0 + t) * a.HG + (int64_t)h * a.G + r % a.G) * D;
    });
    auto load_kv = [&](int32_t kt) {
        const int32_t buf = kt & 1, kb = kt * BN;
        auto row = [&](const __half *base, int32_t i) -> const __half * {
            return kb + i < n ? base + (s0 + kb + i) * kv_stride + (int64_t)h * D : nullptr;
        };
        load_tile<D, BN>(sK + buf * BN * D * 2, a.k, [&](int32_t i) { return row(a.k, i); });
        load_tile<D, BN>(sV + buf * BN * D * 2, a.k, [&](int32_t i) { return row(a.v, i); });
    };
    load_kv(0);
    cp_commit();

    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int32_t gr = lane / 4, tc = lane % 4;
    /* This thread's 4 rows: [m-tile][half]; token (clamped into the sequence) and validity. */
    int32_t tok[2][2];
    bool valid[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int32_t r = warp * 32 + mt * 16 + hf * 8 + gr;
            const int32_t t = t0 + r / a.G;
            valid[mt][hf] = r < rows && t < n;
            tok[mt][hf] = min(t, n - 1);
        }
    const int32_t warp_tok0 = t0 + (warp * 32) / a.G; /* the smallest token of the warp */

    float o[2][DT][4];
    float m[2][2], l[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int j = 0; j < DT; j++) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    for (int32_t kt = 0; kt < n_kt; kt++) {
        if (kt + 1 < n_kt) load_kv(kt + 1);
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        const uint32_t kbuf = sK + (kt & 1) * BN * D * 2, vbuf = sV + (kt & 1) * BN * D * 2;
        const int32_t kb = kt * BN;

        /* S = Q K^T */
        float s[2][NT][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int j = 0; j < NT; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t qa[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ldsm4(sQ + swz<D>(warp * 32 + mt * 16 + (lane & 15), ks * 2 + (lane >> 4)), qa[mt]);
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b[4];
                ldsm4(kbuf + swz<D>(np * 16 + ((lane >> 4) << 3) + (lane & 7), ks * 2 + ((lane >> 3) & 1)), b);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma16816(s[mt][2 * np], qa[mt], b[0], b[1]);
                    mma16816(s[mt][2 * np + 1], qa[mt], b[2], b[3]);
                }
            }
        }

        /* Causal mask, only on the tiles where a key can follow a row's token (a branch
         * uniform over the warp). */
        if (kb + BN - 1 > warp_tok0)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int c = 0; c < 2; c++)
                            if (kb + j * 8 + 2 * tc + c > tok[mt][hf]) s[mt][j][hf * 2 + c] = -INFINITY;

        /* Online softmax; rows live on the 4 threads of a quad. m is the raw running max (the
         * scale is > 0), so that each probability is one FFMA and one exp2. P goes to fp16 A
         * fragments at once: the S accumulators of n-tiles 2kk, 2kk + 1 are k-step kk's. */
        uint32_t pa[2][BN / 16][4];
        float corr[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float mx = m[mt][hf];
#pragma unroll
                for (int j = 0; j < NT; j++) mx = fmaxf(mx, fmaxf(s[mt][j][hf * 2], s[mt][j][hf * 2 + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                /* Key 0 is in the first tile and visible to every row: mx is finite. */
                corr[mt][hf] = fast_exp2((m[mt][hf] - mx) * a.scale2);
                const float mxs = mx * a.scale2;
                m[mt][hf] = mx;
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const float p0 = fast_exp2(fmaf(s[mt][j][hf * 2], a.scale2, -mxs));
                    const float p1 = fast_exp2(fmaf(s[mt][j][hf * 2 + 1], a.scale2, -mxs));
                    sum += p0 + p1;
                    pa[mt][j / 2][(j & 1) * 2 + hf] = pack_half2(p0, p1);
                }
                l[mt][hf] = l[mt][hf] * corr[mt][hf] + sum;
            }
        /* Rescale O only when some row's max moved (exp2(0) is exactly 1: skipping is exact);
         * past the first tiles the maxima rarely move. */
        if (__any_sync(0xffffffffu, corr[0][0] != 1.0f || corr[0][1] != 1.0f || corr[1][0] != 1.0f ||
                                        corr[1][1] != 1.0f))
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int j = 0; j < DT; j++) {
                    o[mt][j][0] *= corr[mt][0];
                    o[mt][j][1] *= corr[mt][0];
                    o[mt][j][2] *= corr[mt][1];
                    o[mt][j][3] *= corr[mt][1];
                }

        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t b[4];
                ldsm4_t(vbuf + swz<D>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), dp * 2 + (lane >> 4)), b);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma16816(o[mt][2 * dp], pa[mt][kk], b[0], b[1]);
                    mma16816(o[mt][2 * dp + 1], pa[mt][kk], b[2], b[3]);
                }
            }
        __syncthreads(); /* the buffer is refilled by the next iteration's loads */
    }

#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float sum = l[mt][hf];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (!valid[mt][hf]) continue;
            const int32_t r = warp * 32 + mt * 16 + hf * 8 + gr;
            const int64_t row = (s0 + tok[mt][hf]) * a.HG + (int64_t)h * a.G + r % a.G;
            const float inv = 1.0f / sum;
#pragma unroll
            for (int j = 0; j < DT; j++)
                store_pair(a.out, a.out_dtype, row * D + j * 8 + 2 * tc, o[mt][j][hf * 2] * inv,
                           o[mt][j][hf * 2 + 1] * inv);
            if (tc == 0) a.lse2[row] = m[mt][hf] * a.scale2 + __log2f(sum);
        }
}

/* ---- The significance column pass ------------------------------------------------------ */

template <int D>
constexpr int sig_smem_bytes() /* K, then PF_SIG_STAGES stages of Q and their rows' lse2 */
{
    return PF_SIG_BN * D * 2 + PF_SIG_STAGES * (PF_SIG_TT * D * 2 + PF_SIG_TT * 4);
}

/* Observer token tiles [*tt0, *tt1) (of PF_SIG_TT tokens from ts) of part p of a key tile. */
__device__ __forceinline__ void part_range(int32_t n, int32_t ts, int32_t parts, int32_t p, int32_t *tt0,
                                           int32_t *tt1)
{
    const int32_t tiles = (n - ts + PF_SIG_TT - 1) / PF_SIG_TT;
    const int32_t per = (tiles + parts - 1) / parts;
    *tt0 = min(p * per, tiles);
    *tt1 = min(*tt0 + per, tiles);
}

/* Where the column sum of (head h, packed row) goes: sig itself, or this part's slice of the
 * workspace when the observers are split over parts (sig_reduce_kernel adds them up). */
__device__ __forceinline__ float *sig_slot(const pf_args &a, int32_t h, int64_t row)
{
    return a.parts > 1 ? a.part_sig + ((int64_t)blockIdx.z * a.H + h) * a.total + row
                       : a.sig + (int64_t)h * a.total + row;
}

__device__ __forceinline__ void cp4(uint32_t dst, const void *src, bool read)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(read ? 4 : 0)
                 : "memory");
}

/* grid (H * key tiles, n_seq, parts). */
template <int D>
__global__ void __launch_bounds__(PF_SIG_THREADS, 2) sig_tc_kernel(pf_args a)
{
    constexpr int KS = D / 16, TT = PF_SIG_TT, NS = PF_SIG_STAGES;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ float red[PF_SIG_BN];
    const int32_t h = blockIdx.x % a.H;
    int64_t s0;
    int32_t n;
    seq_of(a, &s0, &n);
    const int32_t kb = (blockIdx.x / a.H) * PF_SIG_BN; /* low keys (most observers) first */
    if (kb >= n) return;
    const int32_t ts = max(kb, first_observer(n, a.obs_window));
    int32_t tt0, tt1;
    part_range(n, ts, a.parts, blockIdx.z, &tt0, &tt1);
    if (tt0 == tt1) { /* no observer in this part: its partial sums are 0 */
        for (int32_t i = threadIdx.x; i < PF_SIG_BN && kb + i < n; i += PF_SIG_THREADS) *sig_slot(a, h, s0 + kb + i) = 0.0f;
        return;
    }
    const int32_t stages = (tt1 - tt0) * a.G;

    const uint32_t sK = smem_u32(smem), sQ = sK + PF_SIG_BN * D * 2, sL = sQ + NS * TT * D * 2;
    const float *sLf = reinterpret_cast<const float *>(smem + PF_SIG_BN * D * 2 + NS * TT * D * 2);
    const int64_t kv_stride = (int64_t)a.H * D;
    load_tile<D, PF_SIG_BN, PF_SIG_THREADS>(sK, a.k, [&](int32_t i) -> const __half * {
        return kb + i < n ? a.k + (s0 + kb + i) * kv_stride + (int64_t)h * D : nullptr;
    });
    /* Stage st: Q of tokens tb .. tb + 63 for query head h * G + g, and their lse2. */
    auto load_stage = [&](int32_t st) {
        if (st >= stages) return;
        const int32_t tb = ts + (tt0 + st / a.G) * TT, g = st % a.G, buf = st % NS;
        const int64_t qh = (int64_t)h * a.G + g;
        load_tile<D, TT, PF_SIG_THREADS>(sQ + buf * TT * D * 2, a.q, [&](int32_t r) -> const __half * {
            return tb + r < n ? a.q + ((s0 + tb + r) * a.HG + qh) * D : nullptr;
        });
        for (int32_t r = threadIdx.x; r < TT; r += PF_SIG_THREADS)
            cp4(sL + (buf * TT + r) * 4, tb + r < n ? a.lse2 + (s0 + tb + r) * a.HG + qh : a.lse2, tb + r < n);
    };
#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        load_stage(s);
        cp_commit();
    }

    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int32_t gr = lane / 4, tc = lane % 4;
    const int32_t kh = warp & 3, th = warp >> 2; /* keys kh * 32 .., tokens th * 32 .. */
    float runmax[2][4][4] = {}, col[4][2] = {};

    /* Probabilities of stage st into the running max over g; after the last g, the masked
     * maxima into the column sums. */
    auto accumulate = [&](int32_t st, const float (&s)[2][4][4], const float (&lse)[2][2]) {
        const int32_t g = st % a.G, tb = ts + (tt0 + st / a.G) * TT;
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const float p = fast_exp2(fmaf(s[mt][j][hf * 2 + c], a.scale2, -lse[mt][hf]));
                        runmax[mt][j][hf * 2 + c] = fmaxf(runmax[mt][j][hf * 2 + c], p); /* p >= 0 */
                    }
        if (g != a.G - 1) return;
        /* Observers t >= key, t < n; tiles wholly past the warp's keys and inside the sequence
         * skip the compare (a branch uniform over the warp). */
        const int32_t w0 = tb + th * 32, k1 = kb + kh * 32 + 31;
        const bool whole = w0 >= k1 && w0 + 31 < n;
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int32_t t = w0 + mt * 16 + hf * 8 + gr;
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int32_t key = kb + kh * 32 + j * 8 + 2 * tc + c;
                        float &x = runmax[mt][j][hf * 2 + c];
                        if (whole || (t < n && t >= key)) col[j][c] += x;
                        x = 0.0f;
                    }
            }
    };

    /* K re-read from shared memory at every stage: few registers, two CTAs per SM. */
    for (int32_t st = 0; st < stages; st++) {
        cp_wait<NS - 2>();
        __syncthreads(); /* stage st landed; stage st - 1's buffer is free for st + NS - 1 */
        load_stage(st + NS - 1);
        cp_commit();
        const int32_t buf = st % NS;
        const uint32_t qbuf = sQ + buf * TT * D * 2;
        float s[2][4][4] = {}, lse[2][2];
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t qa[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ldsm4(qbuf + swz<D>(th * 32 + mt * 16 + (lane & 15), ks * 2 + (lane >> 4)), qa[mt]);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t b[4];
                ldsm4(sK + swz<D>(kh * 32 + np * 16 + ((lane >> 4) << 3) + (lane & 7), ks * 2 + ((lane >> 3) & 1)), b);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma16816(s[mt][2 * np], qa[mt], b[0], b[1]);
                    mma16816(s[mt][2 * np + 1], qa[mt], b[2], b[3]);
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) lse[mt][hf] = sLf[buf * TT + th * 32 + mt * 16 + hf * 8 + gr];
        accumulate(st, s, lse);
    }

    /* Column sums: over the 8 row groups of the warp, then over the two token halves. */
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float x = col[j][c];
            x += __shfl_xor_sync(0xffffffffu, x, 4);
            x += __shfl_xor_sync(0xffffffffu, x, 8);
            x += __shfl_xor_sync(0xffffffffu, x, 16);
            col[j][c] = x;
        }
    if (th == 1 && gr == 0)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 2; c++) red[kh * 32 + j * 8 + 2 * tc + c] = col[j][c];
    __syncthreads();
    if (th == 0 && gr == 0)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int32_t i = kh * 32 + j * 8 + 2 * tc + c;
                if (kb + i < n) *sig_slot(a, h, s0 + kb + i) = col[j][c] + red[i];
            }
}

/* sig = the sum of the parts' partial sums, in part order (deterministic). */
__global__ void sig_reduce_kernel(pf_args a)
{
    const int64_t n = (int64_t)a.H * a.total;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int32_t p = 0; p < a.parts; p++) s += a.part_sig[p * n + i];
        a.sig[i] = s;
    }
}

} /* namespace mkv_prefill */

#endif /* MKV_ATTENTION_PREFILL_TC_CUH */
