/*
 * weights.c — packed projection weights and their matrix products (see weights.h).
 *
 * Kernels are written once with GCC vector types (16 floats) and compiled twice through
 * function multiversioning (target_clones: AVX-512F and the default x86-64 / generic target),
 * chosen at load time by the CPU. Both clones perform the same IEEE operations in the same
 * order (multiply, then add; the build's ISO C mode keeps the compiler from contracting them),
 * so they give the same bits; the AVX-512 clone is simply faster.
 *
 * Tiles: a prefill multiplies 8 tokens by 3 panels (48 outputs) at a time, 24 accumulators of
 * 16 floats, over token chunks of 128 rows so the panel's slice stays in L2; a decode token
 * runs 8 panels at a time (8 independent accumulation chains). Every output's sum runs over
 * k from 0 upwards in one accumulator, whatever the tile: that is the operation order.
 */
#include "engine/weights.h"

#include "common/error.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__clang__)
#define MKV_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define MKV_CLONES
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));

#define TOK_TILE 8
#define PANEL_TILE 3
#define MV_TILE 8
#define TOK_CHUNK 128

/* ---------------------------------------------------------------------------------------- */
/* Packing                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static int bf16_exact(const float *w, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &w[i], 4);
        if (u & 0xffffu) return 0;
    }
    return 1;
}

static uint16_t to_bf16(float x) /* round to nearest even; exact for bf16 values */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void mkv_wmat_free(mkv_wmat_t *w)
{
    if (!w) return;
    free(w->data);
    w->data = NULL;
}

mkv_status_t mkv_wmat_pack(const float *w, int32_t out, int32_t in, int allow_lossy,
                           mkv_wmat_t *dst)
{
    memset(dst, 0, sizeof *dst);
    dst->out = out;
    dst->in = in;
    dst->panels = (out + MKV_PANEL - 1) / MKV_PANEL;
    dst->bf16 = allow_lossy || bf16_exact(w, (int64_t)out * in);
    const size_t in_pad = (size_t)in + (size_t)(in % 2); /* bf16 panels hold k in pairs */
    const size_t elems = (size_t)dst->panels * in_pad * MKV_PANEL;
    dst->data = calloc(elems, dst->bf16 ? 2 : 4);
    if (!dst->data) return MKV_STATUS_OUT_OF_MEMORY;
    for (int32_t p = 0; p < dst->panels; p++)
        for (int32_t j = 0; j < MKV_PANEL && p * MKV_PANEL + j < out; j++) {
            const float *row = w + (int64_t)(p * MKV_PANEL + j) * in;
            const size_t base = (size_t)p * in * MKV_PANEL + (size_t)j;
            if (dst->bf16) {
                /* k pairs: lane j's 32-bit word holds k (low half) and k + 1 (high half). */
                uint16_t *d = (uint16_t *)dst->data + (size_t)p * in_pad * MKV_PANEL;
                for (int32_t k = 0; k < in; k++)
                    d[((size_t)(k / 2) * MKV_PANEL + (size_t)j) * 2 + (size_t)(k % 2)] = to_bf16(row[k]);
            } else {
                float *d = (float *)dst->data + base;
                for (int32_t k = 0; k < in; k++) d[(size_t)k * MKV_PANEL] = row[k];
            }
        }
    return MKV_STATUS_OK;
}

void mkv_weights_free(mkv_weights_t *w)
{
    if (!w) return;
    if (w->mats)
        for (int64_t i = 0; i < (int64_t)w->n_layers * MKV_W_PER_LAYER; i++) mkv_wmat_free(&w->mats[i]);
    free(w->mats);
    mkv_wmat_free(&w->lm_head);
    free(w);
}

typedef struct pack_job {
    const float *src[MKV_W_PER_LAYER];
    int32_t out[MKV_W_PER_LAYER], in[MKV_W_PER_LAYER];
    const mkv_model_t *m;
    mkv_weights_t *w;
    atomic_int failed;
} pack_job_t;

/* Items: every layer's matrices, then the lm_head. */
static void pack_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    (void)part;
    pack_job_t *j = ctx;
    const mkv_model_config_t *c = &j->m->cfg;
    for (int64_t i = b; i < e; i++) {
        mkv_status_t st;
        if (i == (int64_t)c->n_layers * MKV_W_PER_LAYER) {
            st = mkv_wmat_pack(j->m->lm_head, c->vocab, c->hidden, 0, &j->w->lm_head);
        } else {
            const mkv_layer_weights_t *L = &j->m->layers[i / MKV_W_PER_LAYER];
            const float *src[MKV_W_PER_LAYER] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
            const int32_t k = (int32_t)(i % MKV_W_PER_LAYER);
            st = mkv_wmat_pack(src[k], j->out[k], j->in[k], 0, &j->w->mats[i]);
        }
        if (st != MKV_STATUS_OK) atomic_store(&j->failed, 1);
    }
}

mkv_status_t mkv_weights_prepare(const mkv_model_t *m, mkv_pool_t *pool, mkv_weights_t **out,
                                 char *err)
{
    *out = NULL;
    const mkv_model_config_t *c = &m->cfg;
    mkv_weights_t *w = calloc(1, sizeof *w);
    if (!w) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate packed weights");
    w->n_layers = c->n_layers;
    w->mats = calloc((size_t)c->n_layers * MKV_W_PER_LAYER, sizeof *w->mats);
    if (!w->mats) {
        free(w);
        return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate packed weights");
    }
    const int32_t D = c->hidden, QD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim,
                  I = c->intermediate;
    pack_job_t j = {.out = {QD, KD, KD, D, I, I, D}, .in = {D, D, D, QD, D, D, I}, .m = m, .w = w};
    atomic_init(&j.failed, 0);
    mkv_pool_run(pool, pack_range, &j, (int64_t)c->n_layers * MKV_W_PER_LAYER + 1);
    if (atomic_load(&j.failed)) {
        mkv_weights_free(w);
        return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate packed weights");
    }
    for (int64_t i = 0; i < (int64_t)c->n_layers * MKV_W_PER_LAYER; i++)
        w->bytes += (int64_t)w->mats[i].panels * w->mats[i].in * MKV_PANEL * (w->mats[i].bf16 ? 2 : 4);
    w->bytes += (int64_t)w->lm_head.panels * w->lm_head.in * MKV_PANEL * (w->lm_head.bf16 ? 2 : 4);
    /* (odd `in` pads bf16 panels by one k; not counted) */
    *out = w;
    return MKV_STATUS_OK;
}

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

/* One tile: tm <= 8 token rows x NP <= 3 panels starting at panel p. Rows past tm read row 0
 * (discarded). BF16 and NP are constants in every instantiation. */
static inline __attribute__((always_inline)) void
tile_gemm(const mkv_wmat_t *w, int32_t p, const int NP, const int BF16, const float *x,
          int64_t ldx, int32_t tm, float *y, int64_t ldy)
{
    const int32_t K = w->in;
    const float *xr[TOK_TILE];
    for (int t = 0; t < TOK_TILE; t++) xr[t] = x + (t < tm ? t : 0) * ldx;
    v16f acc[TOK_TILE][PANEL_TILE];
    for (int t = 0; t < TOK_TILE; t++)
        for (int c = 0; c < PANEL_TILE; c++) acc[t][c] = (v16f){0};
    if (BF16) {
        const size_t pstride = (size_t)(K + K % 2) * MKV_PANEL; /* uint16 per panel */
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
    } else {
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
tile_matvec(const mkv_wmat_t *w, int32_t p, const int NP, const int BF16, const float *x, float *y)
{
    const int32_t K = w->in;
    v16f acc[MV_TILE];
    for (int c = 0; c < MV_TILE; c++) acc[c] = (v16f){0};
    if (BF16) {
        const size_t pstride = (size_t)(K + K % 2) * MKV_PANEL;
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
    } else {
        const size_t pstride = (size_t)K * MKV_PANEL;
        for (int32_t k = 0; k < K; k++) {
            const float xv = x[k];
            for (int c = 0; c < NP; c++) {
                v16f wv;
                LOAD_F32(wv, (const float *)w->data + (size_t)(p + c) * pstride + (size_t)k * MKV_PANEL);
                acc[c] += xv * wv;
            }
        }
    }
    for (int c = 0; c < NP; c++) STORE_PANEL(y, (p + c) * MKV_PANEL, w->out, acc[c]);
}

#define GEMM_CASES(BF16, X, Y)                                                                 \
    switch (np) {                                                                              \
    case 3: tile_gemm(w, p, 3, BF16, X, ldx, tm, Y, ldy); break;                               \
    case 2: tile_gemm(w, p, 2, BF16, X, ldx, tm, Y, ldy); break;                               \
    default: tile_gemm(w, p, 1, BF16, X, ldx, tm, Y, ldy); break;                              \
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
                if (w->bf16) GEMM_CASES(1, xt, yt)
                else GEMM_CASES(0, xt, yt)
            }
        }
    }
}

#define MATVEC_CASES(BF16)                                                                     \
    switch (np) {                                                                              \
    case 8: tile_matvec(w, p, 8, BF16, x, y); break;                                           \
    case 7: tile_matvec(w, p, 7, BF16, x, y); break;                                           \
    case 6: tile_matvec(w, p, 6, BF16, x, y); break;                                           \
    case 5: tile_matvec(w, p, 5, BF16, x, y); break;                                           \
    case 4: tile_matvec(w, p, 4, BF16, x, y); break;                                           \
    case 3: tile_matvec(w, p, 3, BF16, x, y); break;                                           \
    case 2: tile_matvec(w, p, 2, BF16, x, y); break;                                           \
    default: tile_matvec(w, p, 1, BF16, x, y); break;                                          \
    }

MKV_CLONES static void matvec_panels(const mkv_wmat_t *w, int32_t p0, int32_t p1, const float *x,
                                     float *y)
{
    for (int32_t p = p0; p < p1; p += MV_TILE) {
        const int32_t np = p1 - p < MV_TILE ? p1 - p : MV_TILE;
        if (w->bf16) MATVEC_CASES(1)
        else MATVEC_CASES(0)
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
            else gemm_panels(w, p0, p1, c->x, c->ldx, c->n, c->mm->y[i], c->mm->ldy[i]);
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
