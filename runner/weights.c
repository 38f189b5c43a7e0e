/*
 * weights.c — packed projection weights and their matrix products (see weights.h).
 *
 * Kernels are written once with GCC vector types (16 floats) and compiled twice through
 * function multiversioning (target_clones: AVX-512F and the default x86-64 / generic target),
 * chosen at load time by the CPU. Both clones perform the same IEEE operations in the same
 * order (multiply, then add; the build's ISO C mode keeps the compiler from contracting them),
 * so they give the same bits; the AVX-512 clone is simply faster.
 *
 * Quantized panels (Q4_0, Q4_1, Q8_0) rebuild each group's weights from 64-byte code loads
 * (8 or 4 k per 32-bit lane) with the dequantizer's roundings, then run the same products: a
 * decode streams their bytes (16 to 28% of fp32's) instead of fp32 or bf16 panels.
 *
 * Tiles: a prefill multiplies 8 tokens by 3 panels (48 outputs) at a time, 24 accumulators of
 * 16 floats, over token chunks of 128 rows so the panel's slice stays in L2; a decode token
 * runs 8 panels at a time (8 independent accumulation chains). Every output's sum runs over
 * k from 0 upwards in one accumulator, whatever the tile: that is the operation order.
 */
#include "runner/weights.h"

#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__clang__)
#define MKV_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define MKV_CLONES
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

#define TOK_TILE 8
#define PANEL_TILE 3
#define MV_TILE 8
#define TOK_CHUNK 128

/* ---------------------------------------------------------------------------------------- */
/* Kernels                                                                                  */
/* ---------------------------------------------------------------------------------------- */

#define LOAD_F32(dst, p) memcpy(&(dst), (p), sizeof(v16f))
/* A bf16 panel's k pair (2k, 2k + 1): one 64-byte load, two 32-bit lane operations. */
#define LOAD_BF16_PAIR(lo, hi, p)                                                              \
    do {                                                                                       \
        v16u u_;                                                                               \
        memcpy(&u_, (p), sizeof u_);                                                           \
        (lo) = (v16f)(u_ << 16);                                                               \
        (hi) = (v16f)(u_ & 0xffff0000u);                                                       \
    } while (0)

/* Stores the 16 outputs of panel p (its first output at column `col`) into row y, only those
 * below `out`. */
#define STORE_PANEL(y, col, out, v)                                                            \
    do {                                                                                       \
        const int32_t valid_ = (out) - (col) < MKV_PANEL ? (out) - (col) : MKV_PANEL;          \
        if (valid_ == MKV_PANEL) memcpy((y) + (col), &(v), sizeof(v16f));                      \
        else {                                                                                 \
            float t_[MKV_PANEL];                                                               \
            memcpy(t_, &(v), sizeof t_);                                                       \
            memcpy((y) + (col), t_, (size_t)valid_ * sizeof(float));                           \
        }                                                                                      \
    } while (0)

/* Group g of panel p of a quantized matrix (weights.h's layout). */
static inline const uint8_t *qgroup(const mkv_wmat_t *w, int32_t p, int32_t g, const int FMT)
{
    return (const uint8_t *)w->data + (size_t)p * (size_t)w->panel_bytes +
           (size_t)g * MKV_WFMT_GROUP_BYTES(FMT);
}

/* A group's scales and (Q4_1) mins. */
static inline __attribute__((always_inline)) void
qgroup_scales(const uint8_t *grp, const int FMT, v16f *d, v16f *m)
{
    memcpy(d, grp, sizeof *d);
    if (FMT == MKV_WFMT_Q4_1) memcpy(m, grp + 64, sizeof *m);
    else *m = (v16f){0};
}

/* Code words s of a group: 16 rows at QPER consecutive k. */
#define QPER(FMT) ((FMT) == MKV_WFMT_Q8_0 ? 4 : 8)
static inline __attribute__((always_inline)) void qwords(const uint8_t *grp, int s, const int FMT,
                                                         v16u *u)
{
    memcpy(u, grp + (FMT == MKV_WFMT_Q4_1 ? 128 : 64) + (size_t)s * sizeof *u, sizeof *u);
}

/* The 16 rows' weights at code n of words u, rebuilt as gguf_dequant.c does: (float)code * d,
 * rounded, then + m, rounded (Q4_1); (float)(code - 8) * d (Q4_0); (float)code * d (Q8_0). */
static inline __attribute__((always_inline)) void
qweight(const v16u *u, int n, const int FMT, const v16f *d, const v16f *m, v16f *w)
{
    v16i c;
    if (FMT == MKV_WFMT_Q8_0) c = (v16i)(*u << (24 - 8 * n)) >> 24; /* sign-extends */
    else c = (v16i)((*u >> (4 * n)) & 15u);
    if (FMT == MKV_WFMT_Q4_0) c -= 8;
    *w = __builtin_convertvector(c, v16f) * *d;
    if (FMT == MKV_WFMT_Q4_1) *w += *m;
}

/* One tile: tm <= 8 token rows x NP <= 3 panels starting at panel p, fp32 or bf16 panels.
 * Rows past tm read row 0 (discarded). FMT and NP are constants in every instantiation. */
static inline __attribute__((always_inline)) void
tile_gemm(const mkv_wmat_t *w, int32_t p, const int NP, const int FMT, const float *x,
          int64_t ldx, int32_t tm, float *y, int64_t ldy)
{
    const int32_t K = w->in;
    const float *xr[TOK_TILE];
    for (int t = 0; t < TOK_TILE; t++) xr[t] = x + (t < tm ? t : 0) * ldx;
    v16f acc[TOK_TILE][PANEL_TILE];
    for (int t = 0; t < TOK_TILE; t++)
        for (int c = 0; c < PANEL_TILE; c++) acc[t][c] = (v16f){0};
    if (FMT == MKV_WFMT_BF16) {
        const size_t pstride = (size_t)w->panel_bytes / 2; /* uint16 per panel */
        const uint16_t *wd = (const uint16_t *)w->data + (size_t)p * pstride;
        int32_t k = 0;
        for (; k < K; k += 2) {
            v16f lo[PANEL_TILE], hi[PANEL_TILE];
            for (int c = 0; c < NP; c++) LOAD_BF16_PAIR(lo[c], hi[c], wd + c * pstride + (size_t)k * MKV_PANEL);
            const int odd = k + 1 == K; /* the last k of an odd K has no partner */
            for (int t = 0; t < TOK_TILE; t++) {
                const float x0 = xr[t][k];
                for (int c = 0; c < NP; c++) acc[t][c] += x0 * lo[c];
                if (!odd) {
                    const float x1 = xr[t][k + 1];
                    for (int c = 0; c < NP; c++) acc[t][c] += x1 * hi[c];
                }
            }
        }
    } else if (FMT == MKV_WFMT_F32) {
        const size_t pstride = (size_t)K * MKV_PANEL;
        for (int32_t k = 0; k < K; k++) {
            v16f wv[PANEL_TILE];
            for (int c = 0; c < NP; c++) LOAD_F32(wv[c], (const float *)w->data + (size_t)(p + c) * pstride + (size_t)k * MKV_PANEL);
            for (int t = 0; t < TOK_TILE; t++) {
                const float xv = xr[t][k];
                for (int c = 0; c < NP; c++) acc[t][c] += xv * wv[c];
            }
        }
    }
    for (int t = 0; t < tm; t++)
        for (int c = 0; c < NP; c++) STORE_PANEL(y + t * ldy, (p + c) * MKV_PANEL, w->out, acc[t][c]);
}

/* One token, NP <= 8 panels from p. */
static inline __attribute__((always_inline)) void
tile_matvec(const mkv_wmat_t *w, int32_t p, const int NP, const int FMT, const float *x, float *y)
{
    const int32_t K = w->in;
    v16f acc[MV_TILE];
    for (int c = 0; c < MV_TILE; c++) acc[c] = (v16f){0};
    if (FMT == MKV_WFMT_BF16) {
        const size_t pstride = (size_t)w->panel_bytes / 2;
        const uint16_t *wd = (const uint16_t *)w->data + (size_t)p * pstride;
        int32_t k = 0;
        for (; k + 2 <= K; k += 2) {
            const float x0 = x[k], x1 = x[k + 1];
            for (int c = 0; c < NP; c++) {
                v16f lo, hi;
                LOAD_BF16_PAIR(lo, hi, wd + c * pstride + (size_t)k * MKV_PANEL);
                acc[c] += x0 * lo;
                acc[c] += x1 * hi;
            }
        }
        if (k < K)
            for (int c = 0; c < NP; c++) {
                v16f lo, hi;
                LOAD_BF16_PAIR(lo, hi, wd + c * pstride + (size_t)k * MKV_PANEL);
                (void)hi;
                acc[c] += x[k] * lo;
            }
    } else if (FMT == MKV_WFMT_F32) {
        const size_t pstride = (size_t)K * MKV_PANEL;
        for (int32_t k = 0; k < K; k++) {
            const float xv = x[k];
            for (int c = 0; c < NP; c++) {
                v16f wv;
                LOAD_F32(wv, (const float *)w->data + (size_t)(p + c) * pstride + (size_t)k * MKV_PANEL);
                acc[c] += xv * wv;
            }
        }
    } else {
        for (int32_t g = 0; g < K / MKV_QBLOCK; g++) {
            const uint8_t *grp[MV_TILE];
            v16f d[MV_TILE], m[MV_TILE];
            for (int c = 0; c < NP; c++) {
                grp[c] = qgroup(w, p + c, g, FMT);
                qgroup_scales(grp[c], FMT, &d[c], &m[c]);
            }
            const float *xg = x + g * MKV_QBLOCK;
            for (int s = 0; s < MKV_QBLOCK / QPER(FMT); s++) {
                v16u u[MV_TILE];
                for (int c = 0; c < NP; c++) qwords(grp[c], s, FMT, &u[c]);
                for (int n = 0; n < QPER(FMT); n++) {
                    const float xv = xg[s * QPER(FMT) + n];
                    for (int c = 0; c < NP; c++) {
                        v16f wv;
                        qweight(&u[c], n, FMT, &d[c], &m[c], &wv);
                        acc[c] += xv * wv;
                    }
                }
            }
        }
    }
    for (int c = 0; c < NP; c++) STORE_PANEL(y, (p + c) * MKV_PANEL, w->out, acc[c]);
}

#define GEMM_CASES(FMT, X, Y)                                                                  \
    switch (np) {                                                                              \
    case 3: tile_gemm(w, p, 3, FMT, X, ldx, tm, Y, ldy); break;                                \
    case 2: tile_gemm(w, p, 2, FMT, X, ldx, tm, Y, ldy); break;                                \
    default: tile_gemm(w, p, 1, FMT, X, ldx, tm, Y, ldy); break;                               \
    }

/* Panels [p0, p1) of w for tokens [0, n). */
MKV_CLONES static void gemm_panels(const mkv_wmat_t *w, int32_t p0, int32_t p1, const float *x,
                                   int64_t ldx, int32_t n, float *y, int64_t ldy)
{
    for (int32_t t0 = 0; t0 < n; t0 += TOK_CHUNK) {
        const int32_t t1 = t0 + TOK_CHUNK < n ? t0 + TOK_CHUNK : n;
        for (int32_t p = p0; p < p1; p += PANEL_TILE) {
            const int32_t np = p1 - p < PANEL_TILE ? p1 - p : PANEL_TILE;
            for (int32_t t = t0; t < t1; t += TOK_TILE) {
                const int32_t tm = t1 - t < TOK_TILE ? t1 - t : TOK_TILE;
                const float *xt = x + t * ldx;
                float *yt = y + t * ldy;
                if (w->fmt == MKV_WFMT_BF16) GEMM_CASES(MKV_WFMT_BF16, xt, yt)
                else GEMM_CASES(MKV_WFMT_F32, xt, yt)
            }
        }
    }
}

/* Quantized GEMM: the weights of NP <= 3 panels over QSLICE k are rebuilt once into an fp32
 * slice (24 KiB, in L1), then every 8-token tile of the 128-token chunk runs over it; the
 * tiles' accumulators stay in a stack array between slices (stored and reloaded exactly), so
 * each output's sum still runs over k in order in one accumulator. */
#define QSLICE 128

/* slice[k - k0][c][16] for k in [k0, k0 + kn), c < np (kn a multiple of 32). */
static inline __attribute__((always_inline)) void
qslice(const mkv_wmat_t *w, int32_t p, int32_t np, const int FMT, int32_t k0, int32_t kn,
       float *slice)
{
    for (int32_t g = k0 / MKV_QBLOCK; g < (k0 + kn) / MKV_QBLOCK; g++)
        for (int32_t c = 0; c < np; c++) {
            const uint8_t *grp = qgroup(w, p + c, g, FMT);
            v16f d, m;
            qgroup_scales(grp, FMT, &d, &m);
            for (int s = 0; s < MKV_QBLOCK / QPER(FMT); s++) {
                v16u u;
                qwords(grp, s, FMT, &u);
                for (int n = 0; n < QPER(FMT); n++) {
                    const int32_t k = g * MKV_QBLOCK + s * QPER(FMT) + n - k0;
                    v16f wv;
                    qweight(&u, n, FMT, &d, &m, &wv);
                    memcpy(slice + ((size_t)k * (size_t)np + (size_t)c) * MKV_PANEL, &wv, sizeof wv);
                }
            }
        }
}

/* acc[t][c] += sum over the slice's kn k of x[t][k] slice[k][c], t < 8 (rows past tm read
 * row 0). */
static inline __attribute__((always_inline)) void
tile_slice(const float *slice, int32_t kn, const int NP, const float *x, int64_t ldx, int32_t tm,
           v16f acc[TOK_TILE][PANEL_TILE])
{
    const float *xr[TOK_TILE];
    for (int t = 0; t < TOK_TILE; t++) xr[t] = x + (t < tm ? t : 0) * ldx;
    v16f a[TOK_TILE][PANEL_TILE];
    for (int t = 0; t < TOK_TILE; t++)
        for (int c = 0; c < NP; c++) a[t][c] = acc[t][c];
    for (int32_t k = 0; k < kn; k++) {
        v16f wv[PANEL_TILE];
        for (int c = 0; c < NP; c++) LOAD_F32(wv[c], slice + ((size_t)k * NP + (size_t)c) * MKV_PANEL);
        for (int t = 0; t < TOK_TILE; t++) {
            const float xv = xr[t][k];
            for (int c = 0; c < NP; c++) a[t][c] += xv * wv[c];
        }
    }
    for (int t = 0; t < TOK_TILE; t++)
        for (int c = 0; c < NP; c++) acc[t][c] = a[t][c];
}

#define QSLICE_CASES(FMT)                                                                      \
    case FMT: qslice(w, p, np, FMT, k0, kn, slice); break;

MKV_CLONES static void gemm_panels_quant(const mkv_wmat_t *w, int32_t p0, int32_t p1,
                                         const float *x, int64_t ldx, int32_t n, float *y,
                                         int64_t ldy)
{
    float slice[QSLICE * PANEL_TILE * MKV_PANEL] __attribute__((aligned(64)));
    v16f acc[TOK_CHUNK / TOK_TILE][TOK_TILE][PANEL_TILE];
    const int32_t K = w->in;
    for (int32_t t0 = 0; t0 < n; t0 += TOK_CHUNK) {
        const int32_t t1 = t0 + TOK_CHUNK < n ? t0 + TOK_CHUNK : n;
        const int32_t tiles = (t1 - t0 + TOK_TILE - 1) / TOK_TILE;
        for (int32_t p = p0; p < p1; p += PANEL_TILE) {
            const int32_t np = p1 - p < PANEL_TILE ? p1 - p : PANEL_TILE;
            for (int32_t i = 0; i < tiles; i++)
                for (int t = 0; t < TOK_TILE; t++)
                    for (int c = 0; c < PANEL_TILE; c++) acc[i][t][c] = (v16f){0};
            for (int32_t k0 = 0; k0 < K; k0 += QSLICE) {
                const int32_t kn = K - k0 < QSLICE ? K - k0 : QSLICE;
                switch (w->fmt) {
                    QSLICE_CASES(MKV_WFMT_Q4_0)
                    QSLICE_CASES(MKV_WFMT_Q4_1)
                    default: qslice(w, p, np, MKV_WFMT_Q8_0, k0, kn, slice); break;
                }
                for (int32_t i = 0; i < tiles; i++) {
                    const int32_t t = t0 + i * TOK_TILE, tm = t1 - t < TOK_TILE ? t1 - t : TOK_TILE;
                    const float *xt = x + t * ldx + k0;
                    if (np == 3) tile_slice(slice, kn, 3, xt, ldx, tm, acc[i]);
                    else if (np == 2) tile_slice(slice, kn, 2, xt, ldx, tm, acc[i]);
                    else tile_slice(slice, kn, 1, xt, ldx, tm, acc[i]);
                }
            }
            for (int32_t i = 0; i < tiles; i++) {
                const int32_t t = t0 + i * TOK_TILE, tm = t1 - t < TOK_TILE ? t1 - t : TOK_TILE;
                for (int32_t r = 0; r < tm; r++)
                    for (int c = 0; c < np; c++)
                        STORE_PANEL(y + (t + r) * ldy, (p + c) * MKV_PANEL, w->out, acc[i][r][c]);
            }
        }
    }
}

#define MATVEC_CASES(FMT)                                                                      \
    switch (np) {                                                                              \
    case 8: tile_matvec(w, p, 8, FMT, x, y); break;                                            \
    case 7: tile_matvec(w, p, 7, FMT, x, y); break;                                            \
    case 6: tile_matvec(w, p, 6, FMT, x, y); break;                                            \
    case 5: tile_matvec(w, p, 5, FMT, x, y); break;                                            \
    case 4: tile_matvec(w, p, 4, FMT, x, y); break;                                            \
    case 3: tile_matvec(w, p, 3, FMT, x, y); break;                                            \
    case 2: tile_matvec(w, p, 2, FMT, x, y); break;                                            \
    default: tile_matvec(w, p, 1, FMT, x, y); break;                                           \
    }

MKV_CLONES static void matvec_panels(const mkv_wmat_t *w, int32_t p0, int32_t p1, const float *x,
                                     float *y)
{
    for (int32_t p = p0; p < p1; p += MV_TILE) {
        const int32_t np = p1 - p < MV_TILE ? p1 - p : MV_TILE;
        switch (w->fmt) {
        case MKV_WFMT_BF16: MATVEC_CASES(MKV_WFMT_BF16) break;
        case MKV_WFMT_Q4_0: MATVEC_CASES(MKV_WFMT_Q4_0) break;
        case MKV_WFMT_Q4_1: MATVEC_CASES(MKV_WFMT_Q4_1) break;
        case MKV_WFMT_Q8_0: MATVEC_CASES(MKV_WFMT_Q8_0) break;
        default: MATVEC_CASES(MKV_WFMT_F32) break;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Parallel products                                                                        */
/* ---------------------------------------------------------------------------------------- */

typedef struct mm_ctx {
    const mkv_matmul_t *mm;
    const float *x;
    int64_t ldx;
    int32_t n;
} mm_ctx_t;

/* Items are the panels of every matrix, in order. */
static void mm_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    (void)part;
    const mm_ctx_t *c = ctx;
    int64_t first = 0;
    for (int32_t i = 0; i < c->mm->count; i++) {
        const mkv_wmat_t *w = c->mm->w[i];
        const int64_t lo = b > first ? b : first, hi = e < first + w->panels ? e : first + w->panels;
        if (lo < hi) {
            const int32_t p0 = (int32_t)(lo - first), p1 = (int32_t)(hi - first);
            if (c->n == 1) matvec_panels(w, p0, p1, c->x, c->mm->y[i]);
            else if (w->fmt == MKV_WFMT_F32 || w->fmt == MKV_WFMT_BF16)
                gemm_panels(w, p0, p1, c->x, c->ldx, c->n, c->mm->y[i], c->mm->ldy[i]);
            else gemm_panels_quant(w, p0, p1, c->x, c->ldx, c->n, c->mm->y[i], c->mm->ldy[i]);
        }
        first += w->panels;
    }
}

void mkv_matmul_run(mkv_pool_t *pool, const mkv_matmul_t *mm, const float *x, int64_t ldx,
                    int32_t n)
{
    if (n < 1) return;
    int64_t panels = 0;
    for (int32_t i = 0; i < mm->count; i++) panels += mm->w[i]->panels;
    const mm_ctx_t c = {mm, x, ldx, n};
    mkv_pool_run(pool, mm_range, (void *)&c, panels);
}

const char *mkv_weights_isa(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__clang__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return "avx512f";
#endif
    return "generic";
}
