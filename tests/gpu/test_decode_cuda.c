/*
 * test_decode_cuda.c — the GPU decode attention (attention/decode_cuda.cu) against the CPU
 * reference mkv_attn_decode_region (attention/decode_ref.c).
 *
 * A batch is n_seq sequences of H KV heads, each head-region with its own section lengths, in a
 * pool built with the CPU quantizer the way the memory manager builds it: shuffled page ids,
 * region rows in a shuffled order (regions[] is not the identity either), high pages from the
 * left of each row and low pages from the right, -1 elsewhere, pages and whole rows the call
 * never touches, the bytes of unused slots a pattern. out and the workspace are poisoned with
 * NaN (0xFF bytes). After the call the whole device pool must equal the host pool that the
 * reference updated, byte for byte, except the score slots of the attended tokens, which must
 * agree within tolerance; a head-region with no tokens leaves its out untouched.
 *
 * Both kernel families run: the generic fp32 kernels (every shape) and the tensor-core ones
 * (head_dim 64 and 128, G <= 8, one quantization group), which AUTO picks where they apply.
 * Tolerances:
 *   out     relative L2 error per output vector <= TOL_OUT for the generic kernels (GPU fp32 vs
 *           CPU fp32, different summation orders: dominated by the reference's own sequential
 *           fp32 sum, ~sqrt(n / 3) * 2.6e-8 relative, ~3e-6 at 32k), TOL_OUT_TENSOR for the
 *           tensor-core kernels, whose value products are fp16 (code * scale rounded once, the
 *           probability rounded once: about 2^-12 relative per term, docs/decode-kernel.md).
 *   scores  |got - want| <= TOL_SCORE_REL * |want| + TOL_SCORE_ABS for both (the tensor-core
 *           logits are fp32-grade: exact integer codes times q split into two fp16 halves).
 * Split against unsplit runs: the same tolerances (sums of exp are merged in another order).
 */
#include "attention/attention.h"
#include "attention/decode_cuda.h"
#include "gpu_util.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_OUT 1e-5
#define TOL_OUT_TENSOR 2e-3
#define TOL_SCORE_REL 1e-5
#define TOL_SCORE_ABS 1e-6
#define MAX_REPORT 5
#define ERR_LEN 512

/* ---- Reporting ---------------------------------------------------------------------------- */

typedef struct stats {
    const char *what;
    int64_t checked, bad;
    double max_err; /* relative L2 for outputs, absolute for scores */
} stats_t;

static void stats_note(stats_t *s, double err, int ok, const char *fmt, const char *ctx,
                       long long i, long long k, double got, double want)
{
    s->checked++;
    if (isnan(err) || err > s->max_err) s->max_err = isnan(err) ? INFINITY : err;
    if (ok) return;
    if (s->bad++ < MAX_REPORT) fprintf(stderr, fmt, ctx, s->what, i, k, got, want, err);
}

static void stats_expect(const stats_t *s, const char *test)
{
    cr_log_info("%s: %s: %lld checked, max error %.3g", test, s->what, (long long)s->checked,
                s->max_err);
    cr_assert_gt(s->checked, 0, "%s: %s checked nothing", test, s->what);
    cr_assert_eq(s->bad, 0, "%s: %lld of %lld %s out of tolerance (first ones above)", test,
                 (long long)s->bad, (long long)s->checked, s->what);
}

static float frand(uint64_t *r, double lo, double hi)
{
    return (float)(lo + (hi - lo) * ((double)(test_rand_next(r) >> 11) * 0x1p-53));
}

/* ---- A batch -------------------------------------------------------------------------------- */

typedef struct spec {
    mkv_format_t hi, lo;
    int32_t d, G, tpp;         /* tpp: high tokens per page asked of mkv_page_bytes_for */
    int32_t groups[4];         /* elements per group: hi key, hi value, lo key, lo value;
                                  0: the library's default */
    int32_t n_seq, H;
    const int32_t *len;        /* [n_seq * H][2] n_hi, n_lo of listed head-region j * H + h */
    uint64_t seed;
    float vamp;                /* value amplitude (0: 1); large ones give scales above 64 */
    int zero_scores;           /* scores start at 0 (else uniform in [0, 3)), so that the check
                                  is on each probability alone */
    int qwide;                 /* q's magnitudes log-uniform over 20 binades below 3 (some 0),
                                  and keys far from zero with a small spread, so that the
                                  zeros' term and the codes' nearly cancel (else q uniform in
                                  [-3, 3], keys within about [-3, 3]) */
    int qshift;                /* q times 2^-qshift: every query head's, the softmax scale
                                  times 2^qshift (the same logits, q's scale 2^E beyond a
                                  float's normal range), or with qshift_half the even query
                                  heads' only (the scale as is) */
    int qshift_half;
} spec_t;

/* The call's softmax scale (the reference's and the GPU's). */
static float spec_scale(const spec_t *c)
{
    return ldexpf((float)(1.0 / sqrt((double)c->d)), c->qshift_half ? 0 : c->qshift);
}

typedef struct batch {
    spec_t c;
    char ctx[192];
    mkv_page_layout_t lay_hi, lay_lo;
    int64_t page_bytes, P;
    size_t pool_bytes;
    int32_t T, R, nl, max_n, max_tokens; /* nl = n_seq * H listed regions, R >= nl rows */
    int32_t *table, *n_hi, *n_lo;        /* [R][T], [R], [R] */
    int64_t *regions;                    /* [nl] */
    uint8_t *pool;                       /* the call's input */
    uint8_t *ref_pool;                   /* after the reference */
    float *q, *ref_out;                  /* [n_seq][H * G][d] */
    uint8_t *d_pool;
    int32_t *d_table, *d_n_hi, *d_n_lo;
    int64_t *d_regions;
    float *d_q, *d_out;
    int32_t scores; /* mkv_cuda_decode_scores_t of the GPU calls */
    int32_t logits; /* mkv_cuda_decode_logits_t of the GPU calls */
    int32_t no_scores; /* the GPU calls write no scores back: the pool must come back unchanged */
    int32_t mean_tokens; /* the GPU calls' hint (0: none) */
} batch_t;

static void shuffle(int32_t *a, int64_t n, uint64_t *r)
{
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = (int64_t)(test_rand_next(r) % (uint64_t)(i + 1));
        const int32_t t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

static int32_t pages_for(int32_t n, int32_t tpp) { return (n + tpp - 1) / tpp; }

static const mkv_page_layout_t *lay_of(const batch_t *b, int32_t r, int32_t t)
{
    return t < b->n_hi[r] ? &b->lay_hi : &b->lay_lo;
}

/* Byte offset in the pool of token t (section order) of row r, and its slot. */
static int64_t token_at(const batch_t *b, int32_t r, int32_t t, int32_t *slot)
{
    const int32_t *row = b->table + (int64_t)r * b->T;
    int32_t entry;
    if (t < b->n_hi[r]) {
        entry = t / b->lay_hi.tokens, *slot = t % b->lay_hi.tokens;
    } else {
        const int32_t k = t - b->n_hi[r];
        entry = b->T - 1 - k / b->lay_lo.tokens, *slot = k % b->lay_lo.tokens;
    }
    return (int64_t)row[entry] * b->page_bytes;
}

static void batch_build(batch_t *b, const spec_t *c)
{
    memset(b, 0, sizeof *b);
    b->c = *c;
    uint64_t r = c->seed;
    const int32_t d = c->d;
    char err[ERR_LEN] = "";
    const int32_t *gr = c->groups;
    cr_assert_eq(mkv_page_bytes_for(c->hi, d, gr[0], gr[1], c->tpp, &b->page_bytes), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(c->hi, d, gr[0], gr[1], b->page_bytes, &b->lay_hi, err),
                 MKV_STATUS_OK, "%s", err);
    cr_assert_eq(mkv_page_layout(c->lo, d, gr[2], gr[3], b->page_bytes, &b->lay_lo, err),
                 MKV_STATUS_OK, "%s", err);
    const int32_t th = b->lay_hi.tokens, tl = b->lay_lo.tokens;
    b->nl = c->n_seq * c->H;
    b->R = b->nl + 2; /* two rows nobody lists */
    int32_t most = 1;
    int64_t used = 0;
    for (int32_t i = 0; i < b->nl; i++) {
        const int32_t np = pages_for(c->len[2 * i], th) + pages_for(c->len[2 * i + 1], tl);
        most = np > most ? np : most;
        used += np;
        const int32_t n = c->len[2 * i] + c->len[2 * i + 1];
        b->max_n = n > b->max_n ? n : b->max_n;
    }
    b->T = most + test_rand_range(&r, 0, 2);
    b->P = used + test_rand_range(&r, 1, 4);
    b->max_tokens = b->max_n + test_rand_range(&r, 0, 3);
    snprintf(b->ctx, sizeof b->ctx, "%s/%s d=%d G=%d groups=%d/%d,%d/%d tpp=%d/%d seqs=%d H=%d "
             "T=%d max_n=%d seed=%llu", mkv_format_name(c->hi), mkv_format_name(c->lo), d, c->G,
             b->lay_hi.key.group_elems, b->lay_hi.value.group_elems, b->lay_lo.key.group_elems,
             b->lay_lo.value.group_elems, th, tl, c->n_seq, c->H, b->T, b->max_n,
             (unsigned long long)c->seed);

    /* Rows in a shuffled order, pages from a shuffled permutation (never the identity). */
    int32_t *rperm = malloc(sizeof(int32_t) * (size_t)b->R);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)b->P);
    b->table = malloc(sizeof(int32_t) * (size_t)b->R * (size_t)b->T);
    b->n_hi = calloc((size_t)b->R, sizeof(int32_t));
    b->n_lo = calloc((size_t)b->R, sizeof(int32_t));
    b->regions = malloc(sizeof(int64_t) * (size_t)b->nl);
    cr_assert(rperm && perm && b->table && b->n_hi && b->n_lo && b->regions);
    for (int32_t i = 0; i < b->R; i++) rperm[i] = i;
    for (int64_t i = 0; i < b->P; i++) perm[i] = (int32_t)i;
    shuffle(rperm, b->R, &r);
    shuffle(perm, b->P, &r);
    if (b->P > 1 && perm[0] == 0) perm[0] = perm[1], perm[1] = 0;
    for (int64_t i = 0; i < (int64_t)b->R * b->T; i++) b->table[i] = -1;

    b->pool_bytes = (size_t)(b->P * b->page_bytes);
    b->pool = malloc(b->pool_bytes);
    b->ref_pool = malloc(b->pool_bytes);
    const size_t nq = (size_t)b->nl * (size_t)c->G * (size_t)d;
    b->q = malloc(sizeof(float) * nq);
    b->ref_out = malloc(sizeof(float) * nq);
    cr_assert(b->pool && b->ref_pool && b->q && b->ref_out);
    /* Unused slots and pages are NaN (0xFF bytes: NaN as fp16 and as fp32 alike). */
    memset(b->pool, 0xff, b->pool_bytes);
    memset(b->ref_out, 0xff, sizeof(float) * nq);

    float *k = malloc(sizeof(float) * (size_t)d), *v = malloc(sizeof(float) * (size_t)d);
    cr_assert(k && v);
    int64_t next = 0;
    for (int32_t i = 0; i < b->nl; i++) {
        const int32_t row = rperm[i];
        b->regions[i] = row;
        b->n_hi[row] = c->len[2 * i], b->n_lo[row] = c->len[2 * i + 1];
        int32_t *tr = b->table + (int64_t)row * b->T;
        for (int32_t e = 0; e < pages_for(b->n_hi[row], th); e++) tr[e] = perm[next++];
        for (int32_t e = 0; e < pages_for(b->n_lo[row], tl); e++) tr[b->T - 1 - e] = perm[next++];
        for (int32_t t = 0; t < b->n_hi[row] + b->n_lo[row]; t++) {
            /* A per-token offset and spread, so that groups differ in range. */
            const float ko = c->qwide ? frand(&r, -6, 6) : frand(&r, -1, 1);
            const float ka = c->qwide ? frand(&r, 0.05, 0.5) : frand(&r, 0.2, 2);
            const float vm = c->vamp > 0 ? c->vamp : 1.0f;
            const float vo = vm * frand(&r, -1, 1), va = vm * frand(&r, 0.2, 2);
            for (int32_t e = 0; e < d; e++) k[e] = ko + ka * frand(&r, -1, 1);
            for (int32_t e = 0; e < d; e++) v[e] = vo + va * frand(&r, -1, 1);
            int32_t slot;
            const int64_t at = token_at(b, row, t, &slot);
            cr_assert_eq(mkv_page_write_token(b->pool + at, lay_of(b, row, t), slot, k, v,
                                              c->zero_scores ? 0.0f : frand(&r, 0, 3),
                                              test_rand_range(&r, 0, 1 << 20)),
                         0);
        }
    }
    for (size_t i = 0; i < nq; i++) {
        if (!c->qwide) {
            b->q[i] = frand(&r, -3, 3);
        } else {
            const uint64_t x = test_rand_next(&r);
            const float m = (x & 15) == 0 ? 0.0f : 3.0f * exp2f(-20.0f * frand(&r, 0, 1));
            b->q[i] = x & 16 ? -m : m;
        }
        if (c->qshift && (!c->qshift_half || (i / (size_t)d) % 2 == 0)) b->q[i] = ldexpf(b->q[i], -c->qshift);
    }
    free(k), free(v), free(rperm), free(perm);

    /* The reference, on a copy of the pool. */
    memcpy(b->ref_pool, b->pool, b->pool_bytes);
    const size_t scratch_n = (size_t)c->G * (size_t)(b->max_n + 1) + 2 * (size_t)d;
    float *scratch = malloc(sizeof(float) * scratch_n);
    cr_assert_not_null(scratch);
    for (int32_t i = 0; i < b->nl; i++) {
        const int32_t row = (int32_t)b->regions[i];
        const mkv_region_pages_t reg = {
            .pool = b->ref_pool, .page_bytes = b->page_bytes, .lay_hi = &b->lay_hi,
            .lay_lo = &b->lay_lo, .row = b->table + (int64_t)row * b->T, .row_entries = b->T,
            .n_hi = b->n_hi[row], .n_lo = b->n_lo[row]};
        const size_t at = (size_t)i * (size_t)c->G * (size_t)d;
        mkv_attn_decode_region(&reg, c->G, d, b->q + at, spec_scale(c),
                               b->ref_out + at, scratch);
    }
    free(scratch);

    /* Device copies of everything but the pool (uploaded afresh by each run). */
    const size_t tb = sizeof(int32_t) * (size_t)b->R * (size_t)b->T;
    CUDA_CHECK(cudaMalloc((void **)&b->d_pool, b->pool_bytes));
    CUDA_CHECK(cudaMalloc((void **)&b->d_table, tb));
    CUDA_CHECK(cudaMalloc((void **)&b->d_n_hi, sizeof(int32_t) * (size_t)b->R));
    CUDA_CHECK(cudaMalloc((void **)&b->d_n_lo, sizeof(int32_t) * (size_t)b->R));
    CUDA_CHECK(cudaMalloc((void **)&b->d_regions, sizeof(int64_t) * (size_t)b->nl));
    CUDA_CHECK(cudaMalloc((void **)&b->d_q, sizeof(float) * nq));
    CUDA_CHECK(cudaMalloc((void **)&b->d_out, sizeof(float) * nq));
    CUDA_CHECK(cudaMemcpy(b->d_table, b->table, tb, cudaMemcpyHostToDevice));
    const size_t rb = sizeof(int32_t) * (size_t)b->R;
    CUDA_CHECK(cudaMemcpy(b->d_n_hi, b->n_hi, rb, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b->d_n_lo, b->n_lo, rb, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b->d_regions, b->regions, sizeof(int64_t) * (size_t)b->nl,
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b->d_q, b->q, sizeof(float) * nq, cudaMemcpyHostToDevice));
}

static void batch_free(batch_t *b)
{
    cudaFree(b->d_pool), cudaFree(b->d_table), cudaFree(b->d_n_hi), cudaFree(b->d_n_lo);
    cudaFree(b->d_regions), cudaFree(b->d_q), cudaFree(b->d_out);
    free(b->table), free(b->n_hi), free(b->n_lo), free(b->regions), free(b->pool);
    free(b->ref_pool), free(b->q), free(b->ref_out);
}

static size_t batch_out_floats(const batch_t *b) { return (size_t)b->nl * b->c.G * b->c.d; }

/* One GPU call on a fresh copy of the input pool; out and pool come back into got_*. */
static void batch_gpu(batch_t *b, int32_t kernel, int32_t split, float *got_out,
                      uint8_t *got_pool)
{
    const spec_t *c = &b->c;
    const size_t nq = batch_out_floats(b);
    const size_t ws = mkv_cuda_decode_workspace_size(c->n_seq, c->H, c->G, c->d, b->max_tokens,
                                                     split);
    cr_assert_gt(ws, 0, "%s: workspace size 0", b->ctx);
    void *d_ws;
    CUDA_CHECK(cudaMalloc(&d_ws, ws));
    CUDA_CHECK(cudaMemset(d_ws, 0xff, ws));
    CUDA_CHECK(cudaMemset(b->d_out, 0xff, sizeof(float) * nq));
    CUDA_CHECK(cudaMemcpy(b->d_pool, b->pool, b->pool_bytes, cudaMemcpyHostToDevice));
    const mkv_cuda_decode_t a = {
        .pool = b->d_pool, .page_bytes = b->page_bytes, .lay_hi = b->lay_hi, .lay_lo = b->lay_lo,
        .table = b->d_table, .n_hi = b->d_n_hi, .n_lo = b->d_n_lo, .row_entries = b->T,
        .regions = b->d_regions, .n_seq = c->n_seq, .n_heads = c->H, .group_size = c->G,
        .head_dim = c->d, .max_tokens = b->max_tokens, .q = b->d_q, .out = b->d_out,
        .softmax_scale = spec_scale(c), .split_tokens = split,
        .workspace = d_ws, .kernel = kernel, .scores = b->scores, .logits = b->logits,
        .no_scores = b->no_scores, .mean_tokens = b->mean_tokens};
    const size_t used = mkv_cuda_decode_plan_bytes(&a);
    cr_assert_leq(used, ws, "%s split=%d: the plan uses %zu bytes of a %zu-byte workspace", b->ctx, split, used, ws);
    char err[ERR_LEN] = "";
    const mkv_status_t st = mkv_cuda_decode(&a, NULL, err);
    cr_assert_eq(st, MKV_STATUS_OK, "%s split=%d: %s (%s)", b->ctx, split, mkv_status_string(st),
                 err);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(got_out, b->d_out, sizeof(float) * nq, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(got_pool, b->d_pool, b->pool_bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_ws));
}

/* Every output vector within TOL_OUT (relative L2); a region without tokens leaves its
 * vectors as they were (0xFF bytes, in got and want alike). */
static void check_out(const batch_t *b, const char *ctx, const float *got, const float *want,
                      double tol, stats_t *s)
{
    const int32_t G = b->c.G, d = b->c.d;
    for (int32_t i = 0; i < b->nl; i++) {
        const int32_t row = (int32_t)b->regions[i];
        const int empty = b->n_hi[row] + b->n_lo[row] == 0;
        for (int32_t g = 0; g < G; g++) {
            const float *x = got + ((size_t)i * G + g) * d, *y = want + ((size_t)i * G + g) * d;
            if (empty) {
                uint8_t poison[256 * sizeof(float)];
                memset(poison, 0xff, sizeof poison);
                cr_assert_eq(memcmp(x, poison, sizeof(float) * (size_t)d), 0,
                             "%s: out of empty region %d head %d was written", ctx, i, g);
                continue;
            }
            double num = 0.0, den = 0.0;
            for (int32_t e = 0; e < d; e++) {
                num += ((double)x[e] - y[e]) * ((double)x[e] - y[e]);
                den += (double)y[e] * y[e];
            }
            const double rel = sqrt(num) / (den > 0.0 ? sqrt(den) : 1.0);
            stats_note(s, rel, rel <= tol, "%s: %s of region %lld head %lld: got[0] %.9g, "
                       "want[0] %.9g, relative L2 error %.3g\n", ctx, i, g, x[0], y[0]);
        }
    }
}

/* The whole pool: attended tokens' scores within tolerance, every other byte identical. */
static void check_pool(const batch_t *b, const char *ctx, const uint8_t *got, const uint8_t *want,
                       stats_t *s)
{
    uint8_t *copy = malloc(b->pool_bytes);
    cr_assert_not_null(copy);
    memcpy(copy, got, b->pool_bytes);
    for (int32_t i = 0; i < b->nl; i++) {
        const int32_t row = (int32_t)b->regions[i];
        for (int32_t t = 0; t < b->n_hi[row] + b->n_lo[row]; t++) {
            int32_t slot;
            const int64_t at = token_at(b, row, t, &slot) +
                               mkv_score_offset(lay_of(b, row, t), slot);
            float x, y;
            memcpy(&x, got + at, 4), memcpy(&y, want + at, 4);
            const double err = fabs((double)x - y);
            stats_note(s, err, err <= TOL_SCORE_REL * fabs(y) + TOL_SCORE_ABS,
                       "%s: %s of region %lld token %lld: got %.9g, want %.9g (error %.3g)\n",
                       ctx, i, t, x, y);
            memcpy(copy + at, want + at, 4);
        }
    }
    for (size_t i = 0; i < b->pool_bytes; i++)
        if (copy[i] != want[i])
            cr_assert_fail("%s: pool byte %zu (page %lld, offset %lld) is %d, want %d: only the "
                           "attended tokens' scores may change", ctx, i,
                           (long long)(i / (size_t)b->page_bytes),
                           (long long)(i % (size_t)b->page_bytes), copy[i], want[i]);
    free(copy);
}

static int batch_uses_tensor(const batch_t *b, int32_t kernel)
{
    return kernel != MKV_DECODE_KERNEL_GENERIC &&
           mkv_cuda_decode_uses_tensor(&b->lay_hi, &b->lay_lo, b->c.G, b->c.d);
}

/* Runs the batch on the GPU with each split and compares with the reference; with two or more
 * splits, the later runs are also compared with the first (split against unsplit). */
static void batch_check_splits(batch_t *b, int32_t kernel, const int32_t *splits, int n_splits,
                               stats_t *ck_out, stats_t *ck_score, stats_t *ck_vs_out,
                               stats_t *ck_vs_score)
{
    const int tensor = batch_uses_tensor(b, kernel);
    cr_assert(kernel != MKV_DECODE_KERNEL_TENSOR || tensor, "%s: no tensor-core kernel", b->ctx);
    const double tol = tensor ? TOL_OUT_TENSOR : TOL_OUT;
    const size_t nq = batch_out_floats(b);
    float *out0 = malloc(sizeof(float) * nq), *out = malloc(sizeof(float) * nq);
    uint8_t *pool0 = malloc(b->pool_bytes), *pool = malloc(b->pool_bytes);
    cr_assert(out0 && out && pool0 && pool);
    char ctx[256];
    for (int k = 0; k < n_splits; k++) {
        snprintf(ctx, sizeof ctx, "%s %s split=%d", b->ctx, tensor ? "tensor" : "generic",
                 splits[k]);
        batch_gpu(b, kernel, splits[k], k == 0 ? out0 : out, k == 0 ? pool0 : pool);
        check_out(b, ctx, k == 0 ? out0 : out, b->ref_out, tol, ck_out);
        if (b->no_scores) {
            /* no score written back: not one byte of the pool changed */
            const uint8_t *got = k == 0 ? pool0 : pool;
            for (size_t i = 0; i < b->pool_bytes; i++)
                if (got[i] != b->pool[i])
                    cr_assert_fail("%s (no scores): pool byte %zu (page %lld, offset %lld) is %d, was %d",
                                   ctx, i, (long long)(i / (size_t)b->page_bytes),
                                   (long long)(i % (size_t)b->page_bytes), got[i], b->pool[i]);
            ck_score->checked += (int64_t)b->pool_bytes;
        } else {
            check_pool(b, ctx, k == 0 ? pool0 : pool, b->ref_pool, ck_score);
        }
        if (k > 0 && ck_vs_out) {
            snprintf(ctx, sizeof ctx, "%s split=%d vs split=%d", b->ctx, splits[k], splits[0]);
            check_out(b, ctx, out, out0, tol, ck_vs_out);
            check_pool(b, ctx, pool, pool0, ck_vs_score);
        }
    }
    free(out0), free(out), free(pool0), free(pool);
}

/* ---- Tests -------------------------------------------------------------------------------- */

static const mkv_format_t k_pairs[][2] = {
    {MKV_FORMAT_K16V16, MKV_FORMAT_K16V16}, {MKV_FORMAT_K8V8, MKV_FORMAT_K4V4},
    {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2},     {MKV_FORMAT_K4V8, MKV_FORMAT_K2V4},
    {MKV_FORMAT_K8V2, MKV_FORMAT_K4V2},
};
static const int32_t k_dims[] = {16, 32, 64, 128, 256};
static const int32_t k_groups[] = {1, 2, 4, 8};

/* Tokens per page of the high (lo = 0) or low format in the page of tpp high tokens. */
static int32_t tokens_per_page(const spec_t *c, int lo)
{
    int64_t bytes;
    int32_t tokens;
    const int32_t *g = c->groups;
    cr_assert_eq(mkv_page_bytes_for(c->hi, c->d, g[0], g[1], c->tpp, &bytes), MKV_STATUS_OK);
    cr_assert_eq(mkv_tokens_per_page(lo ? c->lo : c->hi, c->d, g[2 * lo], g[2 * lo + 1], bytes,
                                     &tokens), MKV_STATUS_OK);
    return tokens;
}

/* Per-side group choices (elements; 0: the default): one group everywhere, 16 everywhere (a
 * quarter of a 16-byte chunk at 2 bits; 16 groups at d 256), mixed sides, the defaults. */
static const int32_t k_side_groups[][4] = {
    {256, 256, 256, 256}, {16, 16, 16, 16}, {128, 32, 64, 16}, {32, 16, 16, 32}, {0, 0, 0, 0},
};
#define N_SIDE_GROUPS ((int)(sizeof k_side_groups / sizeof k_side_groups[0]))
#define ONE_GROUP {256, 256, 256, 256}

/* Section lengths of pattern p for pages of th / tl tokens: one token in either section,
 * one section empty with the other not a whole number of pages, partly filled last pages,
 * a long region, random, and an empty region. */
static void pattern_lengths(int p, int32_t th, int32_t tl, uint64_t *r, int32_t *len)
{
    switch (p % 8) {
    case 0: len[0] = 0, len[1] = 1; break;
    case 1: len[0] = 1, len[1] = 0; break;
    case 2: len[0] = 2 * th + 1, len[1] = 0; break;
    case 3: len[0] = 0, len[1] = 3 * tl - 1 > 0 ? 3 * tl - 1 : 2; break;
    case 4:
        len[0] = th + test_rand_range(r, 1, th);
        len[1] = 2 * tl + test_rand_range(r, 0, tl - 1);
        break;
    case 5: len[0] = test_rand_range(r, 100, 300), len[1] = test_rand_range(r, 100, 300); break;
    case 6: len[0] = test_rand_range(r, 0, 3 * th), len[1] = test_rand_range(r, 0, 3 * tl); break;
    default: len[0] = 0, len[1] = 0; break;
    }
}

Test(decode_cuda, every_format_dim_and_group)
{
    GPU_REQUIRE();
    static const int32_t tpps[] = {1, 3, 5, 2};
    static const int32_t splits[] = {0, 7, 32, 0, 100};
    stats_t ck_out = {.what = "out"}, ck_score = {.what = "score"};
    stats_t ck_out_t = {.what = "out (auto: tensor-core kernels)"};
    stats_t ck_score_t = {.what = "score (auto: tensor-core kernels)"};
    uint64_t r = 0xdec0de;
    int n_case = 0;
    for (int pr = 0; pr < 5; pr++)
        for (int di = 0; di < 5; di++)
            for (int gi = 0; gi < 4; gi++, n_case++) {
                spec_t c = {.hi = k_pairs[pr][0], .lo = k_pairs[pr][1], .d = k_dims[di],
                            .G = k_groups[gi], .tpp = tpps[n_case % 4], .n_seq = 3, .H = 2,
                            .seed = test_rand_next(&r)};
                memcpy(c.groups, k_side_groups[n_case % N_SIDE_GROUPS], sizeof c.groups);
                const int32_t th = tokens_per_page(&c, 0);
                const int32_t tl = tokens_per_page(&c, 1);
                int32_t len[6 * 2];
                for (int i = 0; i < 6; i++) pattern_lengths(n_case + i, th, tl, &r, len + 2 * i);
                c.len = len;
                batch_t b;
                batch_build(&b, &c);
                const int32_t split = splits[n_case % 5];
                batch_check_splits(&b, MKV_DECODE_KERNEL_GENERIC, &split, 1, &ck_out, &ck_score,
                                   NULL, NULL);
                if (batch_uses_tensor(&b, MKV_DECODE_KERNEL_AUTO))
                    batch_check_splits(&b, MKV_DECODE_KERNEL_AUTO, &split, 1, &ck_out_t,
                                       &ck_score_t, NULL, NULL);
                batch_free(&b);
            }
    stats_expect(&ck_out, "every_format_dim_and_group");
    stats_expect(&ck_score, "every_format_dim_and_group");
    stats_expect(&ck_out_t, "every_format_dim_and_group");
    stats_expect(&ck_score_t, "every_format_dim_and_group");
}

Test(decode_cuda, long_sequences_with_splits, .timeout = 600)
{
    GPU_REQUIRE();
    static const int32_t lens[] = {1, 777, 4097, 32768};
    static const int32_t splits[] = {64, 32, 0}; /* 32: the shortest items (decision 70) */
    /* (the third: G 8, whose separate pass loads 8 logits a token early, score_rows) */
    static const mkv_format_t pairs[][2] = {{MKV_FORMAT_K8V4, MKV_FORMAT_K4V2},
                                            {MKV_FORMAT_K16V16, MKV_FORMAT_K16V16},
                                            {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2}};
    stats_t ck_out = {.what = "out"}, ck_score = {.what = "score"};
    stats_t ck_vs_out = {.what = "out splits 32 and 0 vs 64"};
    stats_t ck_vs_score = {.what = "score splits 32 and 0 vs 64"};
    stats_t ck_out_g = {.what = "out (generic)"}, ck_score_g = {.what = "score (generic)"};
    stats_t ck_vs_out_g = {.what = "out splits 32 and 0 vs 64 (generic)"};
    stats_t ck_vs_score_g = {.what = "score splits 32 and 0 vs 64 (generic)"};
    uint64_t r = 0x10ad;
    for (int pr = 0; pr < 3; pr++) {
        const int32_t H = 3;
        int32_t len[4 * 3 * 2];
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < H; h++) { /* each head its own split between the sections */
                const int32_t n = lens[j], hi = test_rand_range(&r, 0, n);
                len[2 * (j * H + h)] = hi, len[2 * (j * H + h) + 1] = n - hi;
            }
        const spec_t c = {.hi = pairs[pr][0], .lo = pairs[pr][1], .d = 128, .G = pr == 2 ? 8 : 4, .groups = ONE_GROUP,
                          .tpp = 32, .n_seq = 4, .H = H, .len = len, .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        cr_assert(batch_uses_tensor(&b, MKV_DECODE_KERNEL_AUTO));
        batch_check_splits(&b, MKV_DECODE_KERNEL_AUTO, splits, 3, &ck_out, &ck_score, &ck_vs_out,
                           &ck_vs_score);
        batch_check_splits(&b, MKV_DECODE_KERNEL_GENERIC, splits, 3, &ck_out_g, &ck_score_g,
                           &ck_vs_out_g, &ck_vs_score_g);
        batch_free(&b);
    }
    stats_expect(&ck_out, "long_sequences_with_splits");
    stats_expect(&ck_score, "long_sequences_with_splits");
    stats_expect(&ck_vs_out, "long_sequences_with_splits");
    stats_expect(&ck_vs_score, "long_sequences_with_splits");
    stats_expect(&ck_out_g, "long_sequences_with_splits");
    stats_expect(&ck_score_g, "long_sequences_with_splits");
    stats_expect(&ck_vs_out_g, "long_sequences_with_splits");
    stats_expect(&ck_vs_score_g, "long_sequences_with_splits");
}

/* The first run has one split per region (split_tokens = max_tokens); the others must agree
 * with it. Includes G = 12, more query heads than one register tile of the kernel. */
Test(decode_cuda, split_matches_unsplit)
{
    GPU_REQUIRE();
    stats_t ck_out = {.what = "out"}, ck_score = {.what = "score"};
    stats_t ck_vs_out = {.what = "out split vs unsplit"};
    stats_t ck_vs_score = {.what = "score split vs unsplit"};
    static const struct { mkv_format_t hi, lo; int32_t d, G, groups, tpp; } cases[] = {
        {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 64, 8, 256, 16}, /* groups: elements, every side */
        {MKV_FORMAT_K4V8, MKV_FORMAT_K2V4, 32, 12, 16, 3},
        {MKV_FORMAT_K16V16, MKV_FORMAT_K8V2, 256, 2, 64, 7},
    };
    uint64_t r = 0x5b1;
    for (int ci = 0; ci < 3; ci++) {
        static const int32_t lens[] = {5, 300, 1500, 2049};
        int32_t len[4 * 3 * 2];
        for (int i = 0; i < 12; i++) {
            const int32_t n = lens[i / 3], hi = test_rand_range(&r, 0, n);
            len[2 * i] = hi, len[2 * i + 1] = n - hi;
        }
        const spec_t c = {.hi = cases[ci].hi, .lo = cases[ci].lo, .d = cases[ci].d,
                          .G = cases[ci].G,
                          .groups = {cases[ci].groups, cases[ci].groups, cases[ci].groups,
                                     cases[ci].groups}, .tpp = cases[ci].tpp,
                          .n_seq = 4, .H = 3, .len = len, .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        const int32_t splits[] = {b.max_tokens, 16, 100, 0, 1};
        batch_check_splits(&b, MKV_DECODE_KERNEL_AUTO, splits, 5, &ck_out, &ck_score,
                           &ck_vs_out, &ck_vs_score);
        batch_free(&b);
    }
    stats_expect(&ck_out, "split_matches_unsplit");
    stats_expect(&ck_score, "split_matches_unsplit");
    stats_expect(&ck_vs_out, "split_matches_unsplit");
    stats_expect(&ck_vs_score, "split_matches_unsplit");
}

/* The tensor-core kernels on their own: every format in either section, d 64 and 128, G 1, 2,
 * 4 and 8, pages of 1 to 32 high tokens, mixed batches, item sizes from 64 up, and values
 * large enough (some cases) that scales pass 64 and the unfused dequantization runs. */
/* Multiple groups on a side. The tensor-core kernels take one group a side and the library's
 * default groups (for K8V4 and K4V2: keys 1 / 32-element groups, values 16-element groups,
 * at d 64 and 128); AUTO must take them there (and TENSOR accept them), and fall back to the
 * generic kernels for every other choice (DiffKV's groups, 16-element 8-bit key groups), each
 * matching the reference, split and unsplit, on pages of 32 and of odd sizes. */
Test(decode_cuda, multi_group_layouts, .timeout = 300)
{
    GPU_REQUIRE();
    stats_t ck_out = {.what = "out"}, ck_score = {.what = "score"};
    stats_t ck_vs_out = {.what = "out split vs unsplit"};
    stats_t ck_vs_score = {.what = "score split vs unsplit"};
    static const struct { int32_t groups[4]; int tensor; } cases[] = {
        {{0, 0, 0, 0}, 1}, {{128, 64, 64, 32}, 0}, {{256, 16, 32, 16}, 1}, {{16, 256, 256, 256}, 0},
        {{0, 0, 0, 0}, 1},
    };
    static const int32_t tpps[] = {32, 32, 7, 32, 17};
    uint64_t r = 0x9a0;
    for (int gi = 0; gi < 5; gi++)
        for (int di = 0; di < 2; di++) {
            int32_t len[3 * 2 * 2];
            for (int i = 0; i < 6; i++) {
                const int32_t n = test_rand_range(&r, 1, 700), hi = test_rand_range(&r, 0, n);
                len[2 * i] = hi, len[2 * i + 1] = n - hi;
            }
            len[0] = 1500, len[1] = 333; /* more than one item */
            spec_t c = {.hi = MKV_FORMAT_K8V4, .lo = MKV_FORMAT_K4V2, .d = di ? 128 : 64,
                        .G = 1 + (3 * gi + di) % 8, .tpp = tpps[gi], .n_seq = 3, .H = 2, .len = len,
                        .seed = test_rand_next(&r), .vamp = gi == 4 ? 150.0f : 0.0f};
            memcpy(c.groups, cases[gi].groups, sizeof c.groups);
            batch_t b;
            batch_build(&b, &c);
            cr_assert_eq(batch_uses_tensor(&b, MKV_DECODE_KERNEL_AUTO), cases[gi].tensor,
                         "%s: tensor path %d, expected %d", b.ctx, !cases[gi].tensor, cases[gi].tensor);
            const int32_t splits[] = {0, 64, 100, b.max_tokens};
            batch_check_splits(&b, cases[gi].tensor ? MKV_DECODE_KERNEL_TENSOR : MKV_DECODE_KERNEL_AUTO,
                               splits, 4, &ck_out, &ck_score, &ck_vs_out, &ck_vs_score);
            batch_free(&b);
        }
    stats_expect(&ck_out, "multi_group_layouts");
    stats_expect(&ck_score, "multi_group_layouts");
    stats_expect(&ck_vs_out, "multi_group_layouts");
    stats_expect(&ck_vs_score, "multi_group_layouts");
}

/* Every format with its default groups in either section, d 64 and 128, G 1 to 8, pages of odd
 * sizes, through the tensor-core kernels wherever they cover both layouts (every format but
 * K2V4, whose 16-element 2-bit key groups they do not take: asserted). */
Test(decode_cuda, tensor_default_groups, .timeout = 300)
{
    GPU_REQUIRE();
    static const mkv_format_t fmts[] = {MKV_FORMAT_K16V16, MKV_FORMAT_K8V8, MKV_FORMAT_K8V4,
                                        MKV_FORMAT_K4V4,   MKV_FORMAT_K8V2, MKV_FORMAT_K4V2,
                                        MKV_FORMAT_K4V8,   MKV_FORMAT_K2V4};
    static const int32_t tpps[] = {32, 3, 12, 17, 16};
    static const int32_t gs[] = {1, 2, 4, 8};
    stats_t ck_out = {.what = "out"}, ck_score = {.what = "score"};
    stats_t ck_vs_out = {.what = "out split vs unsplit"};
    stats_t ck_vs_score = {.what = "score split vs unsplit"};
    uint64_t r = 0xd3f6;
    int n_case = 0, n_tensor = 0;
    for (int fh = 0; fh < 8; fh++)
        for (int di = 0; di < 2; di++)
            for (int gi = 0; gi < 4; gi++, n_case++) {
                int32_t len[6 * 2];
                spec_t c = {.hi = fmts[fh], .lo = fmts[(fh + 1 + n_case) % 8], .d = di ? 128 : 64,
                            .G = gs[gi], .groups = {0, 0, 0, 0}, .tpp = tpps[n_case % 5], .n_seq = 3,
                            .H = 2, .len = len, .seed = test_rand_next(&r),
                            .vamp = n_case % 3 == 2 ? 150.0f : 0.0f};
                for (;; c.tpp++) { /* pages big enough for one token of the low format */
                    int64_t bytes;
                    int32_t fit = 0;
                    cr_assert_eq(mkv_page_bytes_for(c.hi, c.d, 0, 0, c.tpp, &bytes), MKV_STATUS_OK);
                    if (mkv_tokens_per_page(c.lo, c.d, 0, 0, bytes, &fit) == MKV_STATUS_OK && fit > 0)
                        break;
                }
                const int32_t th = tokens_per_page(&c, 0);
                const int32_t tl = tokens_per_page(&c, 1);
                for (int i = 0; i < 6; i++) pattern_lengths(n_case + i, th, tl, &r, len + 2 * i);
                len[10] = test_rand_range(&r, 300, 700), len[11] = test_rand_range(&r, 1, 90);
                batch_t b;
                batch_build(&b, &c);
                const int expect = c.hi != MKV_FORMAT_K2V4 && c.lo != MKV_FORMAT_K2V4;
                cr_assert_eq(batch_uses_tensor(&b, MKV_DECODE_KERNEL_AUTO), expect, "%s: tensor path", b.ctx);
                if (expect) {
                    const int32_t splits[] = {b.max_tokens, 64, 100, 0};
                    batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 4, &ck_out, &ck_score,
                                       &ck_vs_out, &ck_vs_score);
                    n_tensor++;
                }
                batch_free(&b);
            }
    cr_assert_gt(n_tensor, 40);
    stats_expect(&ck_out, "tensor_default_groups");
    stats_expect(&ck_score, "tensor_default_groups");
    stats_expect(&ck_vs_out, "tensor_default_groups");
    stats_expect(&ck_vs_score, "tensor_default_groups");
}

Test(decode_cuda, tensor_every_format, .timeout = 300)
{
    GPU_REQUIRE();
    static const mkv_format_t fmts[] = {MKV_FORMAT_K16V16, MKV_FORMAT_K8V8, MKV_FORMAT_K8V4,
                                        MKV_FORMAT_K4V4,   MKV_FORMAT_K8V2, MKV_FORMAT_K4V2,
                                        MKV_FORMAT_K4V8,   MKV_FORMAT_K2V4};
    static const int32_t tpps[] = {32, 1, 3, 12, 17};
    static const int32_t gs[] = {1, 2, 4, 8};
    stats_t ck_out = {.what = "out"}, ck_score = {.what = "score"};
    stats_t ck_vs_out = {.what = "out split vs unsplit"};
    stats_t ck_vs_score = {.what = "score split vs unsplit"};
    uint64_t r = 0x7e50;
    int n_case = 0;
    for (int fh = 0; fh < 8; fh++)
        for (int di = 0; di < 2; di++)
            for (int gi = 0; gi < 4; gi++, n_case++) {
                int32_t len[6 * 2];
                spec_t c = {.hi = fmts[fh], .lo = fmts[(fh + 1 + n_case) % 8],
                            .d = di ? 128 : 64, .G = gs[gi], .groups = ONE_GROUP,
                            .tpp = tpps[n_case % 5], .n_seq = 3, .H = 2, .len = len,
                            .seed = test_rand_next(&r), .vamp = n_case % 3 == 2 ? 150.0f : 0.0f};
                for (;; c.tpp++) { /* pages big enough for one token of the low format */
                    int64_t bytes;
                    int32_t fit = 0;
                    cr_assert_eq(mkv_page_bytes_for(c.hi, c.d, 256, 256, c.tpp, &bytes), MKV_STATUS_OK);
                    if (mkv_tokens_per_page(c.lo, c.d, 256, 256, bytes, &fit) == MKV_STATUS_OK && fit > 0)
                        break;
                }
                const int32_t th = tokens_per_page(&c, 0);
                const int32_t tl = tokens_per_page(&c, 1);
                for (int i = 0; i < 6; i++) pattern_lengths(n_case + i, th, tl, &r, len + 2 * i);
                len[10] = test_rand_range(&r, 300, 700), len[11] = test_rand_range(&r, 1, 90);
                batch_t b;
                batch_build(&b, &c);
                const int32_t splits[] = {b.max_tokens, 64, 100, 0};
                batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 4, &ck_out, &ck_score,
                                   &ck_vs_out, &ck_vs_score);
                batch_free(&b);
            }
    stats_expect(&ck_out, "tensor_every_format");
    stats_expect(&ck_score, "tensor_every_format");
    stats_expect(&ck_vs_out, "tensor_every_format");
    stats_expect(&ck_vs_score, "tensor_every_format");
}

/* One case of the fused write-back tests: formats fmts[fi] in the high section and fmts[lo]
 * in the low one (lo = fi: one format), d 64 or 128 (di), regions from 1 to 9000 tokens, item
 * sizes from 64. Fp32 logits (compact 0): G 1 to 8, pages of 5 to 21 tokens, and the separate
 * pass too (ck[2], ck[3]). Compact logits (compact 1): G 2, 3, 4 and 8, pages of 16, 35 and 9
 * tokens (subtiles and quads of the score pass across pages), scores starting at zero, so that
 * each probability is checked alone; the
 * separate pass asked for them keeps fp32 logits (decision 89). ck: out and score stats of the
 * fused pass, then the separate. Two formats: the separate pass also with one launch per
 * section (ck[4], ck[5]). */
static const mkv_format_t k_fused_fmts[] = {MKV_FORMAT_K16V16, MKV_FORMAT_K8V8, MKV_FORMAT_K8V4,
                                            MKV_FORMAT_K4V4,   MKV_FORMAT_K8V2, MKV_FORMAT_K4V2,
                                            MKV_FORMAT_K4V8,   MKV_FORMAT_K2V4};

static const int32_t k_compact_tpp[] = {16, 35, 9};

static void fused_case(int fi, int lo, int di, int compact, int default_groups, uint64_t *r, stats_t *ck)
{
    const mkv_format_t *fmts = k_fused_fmts;
    static const int32_t lens[] = {1, 63, 64, 65, 700, 4097, 9000};
    static const int32_t Gs[] = {2, 3, 4, 8};
    const int32_t H = 2, n_seq = 4, eg = default_groups ? 0 : 256;
    int32_t len[4 * 2 * 2];
    for (int i = 0; i < n_seq * H; i++) {
        const int32_t n = lens[(i + (compact ? 3 : 1) * fi + di) % 7], hi = test_rand_range(r, 0, n);
        len[2 * i] = hi, len[2 * i + 1] = n - hi;
    }
    spec_t c = {.hi = fmts[fi], .lo = fmts[lo], .d = di ? 128 : 64,
                .G = compact ? Gs[(fi + di) % 4] : 1 << ((fi + di) % 4),
                .groups = {eg, eg, eg, eg},
                .tpp = compact ? k_compact_tpp[(fi + 2 * di) % 3] : 5 + 9 * di + fi,
                .n_seq = n_seq, .H = H, .len = len, .seed = test_rand_next(r),
                .vamp = fi % 3 == 1 ? 150.0f : 0.0f, .zero_scores = compact};
    batch_t b;
    batch_build(&b, &c);
    b.scores = MKV_DECODE_SCORES_FUSED;
    b.logits = compact ? MKV_DECODE_LOGITS_COMPACT : MKV_DECODE_LOGITS_FP32;
    const int32_t splits[] = {0, 64, 100};
    for (int k = 0; k < 3; k++) {
        const size_t ws = mkv_cuda_decode_workspace_size(n_seq, H, c.G, c.d, b.max_tokens, splits[k]);
        const mkv_cuda_decode_t a = {
            .lay_hi = b.lay_hi, .lay_lo = b.lay_lo, .n_seq = n_seq, .n_heads = H,
            .group_size = c.G, .head_dim = c.d, .max_tokens = b.max_tokens,
            .split_tokens = splits[k], .kernel = MKV_DECODE_KERNEL_TENSOR, .scores = b.scores,
            .logits = b.logits};
        cr_assert(ws > 0 && mkv_cuda_decode_fuses_scores(&a), "%s split=%d: not fused", b.ctx,
                  splits[k]);
        cr_assert_eq(mkv_cuda_decode_compact_logits(&a), compact, "%s split=%d: compact logits %d",
                     b.ctx, splits[k], !compact);
        mkv_cuda_decode_t sep = a;
        sep.scores = MKV_DECODE_SCORES_SEPARATE;
        cr_assert(!mkv_cuda_decode_fuses_scores(&sep), "%s split=%d: separate call fused", b.ctx, splits[k]);
        /* the separate pass keeps fp32 logits, whatever is asked (decision 89) */
        cr_assert(!mkv_cuda_decode_compact_logits(&sep), "%s split=%d: separate, compact logits", b.ctx, splits[k]);
        if (lo != fi) { /* one launch per section: never fused */
            mkv_cuda_decode_t per = a;
            per.kernel = MKV_DECODE_KERNEL_TENSOR_PER_SECTION;
            cr_assert(!mkv_cuda_decode_fuses_scores(&per), "%s: per-section call fused", b.ctx);
            cr_assert(!mkv_cuda_decode_compact_logits(&per), "%s: per-section, compact logits", b.ctx);
        }
    }
    batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 3, &ck[0], &ck[1], NULL, NULL);
    b.scores = MKV_DECODE_SCORES_SEPARATE;
    batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 3, &ck[2], &ck[3], NULL, NULL);
    if (lo != fi)
        batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR_PER_SECTION, splits, 3, &ck[4], &ck[5], NULL, NULL);
    batch_free(&b);
}

/* The fused write-back with compact logits (20-bit probabilities relative to each softmax
 * step's maximum; pages of a multiple of 16 tokens, G >= 2) against the reference (fused_case),
 * and the separate pass asked for them (it keeps fp32 logits, decision 89). Scores within the
 * same tolerance as fp32 logits (their absolute error from the codes is at most 2^-21). */
Test(decode_cuda, fused_scores_compact, .timeout = 300)
{
    GPU_REQUIRE();
    stats_t ck[4] = {{.what = "out (compact)"}, {.what = "score (compact)"},
                     {.what = "out (compact asked, separate)"}, {.what = "score (compact asked, separate)"}};
    uint64_t r = 0xc0dec;
    for (int fi = 0; fi < 8; fi++)
        for (int di = 0; di < 2; di++) fused_case(fi, fi, di, 1, 0, &r, ck);
    for (int i = 0; i < 4; i++) stats_expect(&ck[i], "fused_scores_compact");
}

/* The score write-back inside the decode kernel (one format in both sections; a persistent grid
 * taking decode blocks and score jobs), with fp32 logits, and the separate pass, both against
 * the reference (fused_case). */
Test(decode_cuda, fused_scores, .timeout = 300)
{
    GPU_REQUIRE();
    stats_t ck[4] = {{.what = "out (fused)"}, {.what = "score (fused)"},
                     {.what = "out (separate)"}, {.what = "score (separate)"}};
    uint64_t r = 0xf05ed;
    for (int fi = 0; fi < 8; fi++)
        for (int di = 0; di < 2; di++) fused_case(fi, fi, di, 0, 0, &r, ck);
    for (int i = 0; i < 4; i++) stats_expect(&ck[i], "fused_scores");
}

/* The fused write-back, fp32 and compact logits, with every format's default groups (every
 * format the tensor-core kernels cover with them: all but K2V4). */
Test(decode_cuda, fused_scores_default_groups, .timeout = 300)
{
    GPU_REQUIRE();
    stats_t ck[4] = {{.what = "out (fused, default groups)"}, {.what = "score (fused, default groups)"},
                     {.what = "out (separate, default groups)"}, {.what = "score (separate, default groups)"}};
    stats_t ckc[4] = {{.what = "out (compact, default groups)"}, {.what = "score (compact, default groups)"},
                      {.what = "out (compact asked, separate, default groups)"},
                      {.what = "score (compact asked, separate, default groups)"}};
    uint64_t r = 0xf06d;
    for (int fi = 0; fi < 7; fi++)
        for (int di = 0; di < 2; di++) {
            fused_case(fi, fi, di, 0, 1, &r, ck);
            fused_case(fi, fi, di, 1, 1, &r, ckc);
        }
    for (int i = 0; i < 4; i++) stats_expect(&ck[i], "fused_scores_default_groups");
    for (int i = 0; i < 4; i++) stats_expect(&ckc[i], "fused_scores_default_groups");
}

/* The two-format kernel (a K8V4 high section and a K4V2 low one in one launch, CMake's default
 * MIXKV_DECODE_TC_MIXES): fused with fp32 and compact logits, the separate pass, and one
 * launch per section, with one group a side and the default groups, against the reference
 * (fused_case). */
Test(decode_cuda, two_format_kernel, .timeout = 300)
{
    GPU_REQUIRE();
    stats_t ck[6] = {{.what = "out (fused)"},    {.what = "score (fused)"},
                     {.what = "out (separate)"}, {.what = "score (separate)"},
                     {.what = "out (per section)"}, {.what = "score (per section)"}};
    stats_t ckc[6] = {{.what = "out (compact)"}, {.what = "score (compact)"},
                      {.what = "out (compact asked, separate)"}, {.what = "score (compact asked, separate)"},
                      {.what = "out (compact asked, per section)"}, {.what = "score (compact asked, per section)"}};
    uint64_t r = 0x2f0a;
    for (int rep = 0; rep < 2; rep++)
        for (int di = 0; di < 2; di++)
            for (int dg = 0; dg < 2; dg++) {
                fused_case(2, 5, di, 0, dg, &r, ck);  /* K8V4 + K4V2 */
                fused_case(2, 5, di, 1, dg, &r, ckc);
            }
    for (int i = 0; i < 6; i++) stats_expect(&ck[i], "two_format_kernel");
    for (int i = 0; i < 6; i++) stats_expect(&ckc[i], "two_format_kernel");
}

/* The mix's layouts at d 128 with the default groups (K8V4 high, K4V2 low) in pages sized for
 * tpp tokens of page_fmt. */
static void mix_layouts(mkv_format_t page_fmt, int32_t tpp, int64_t *page_bytes, mkv_page_layout_t *hi,
                        mkv_page_layout_t *lo)
{
    char err[ERR_LEN];
    cr_assert_eq(mkv_page_bytes_for(page_fmt, 128, 0, 0, tpp, page_bytes), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K8V4, 128, 0, 0, *page_bytes, hi, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K4V2, 128, 0, 0, *page_bytes, lo, err), MKV_STATUS_OK, "%s", err);
}

/* A plan query (pointers unset) for the mix in those layouts (pages of 32 K8V4 tokens), G 4,
 * d 128, 8 KV heads, the separate score pass. */
static mkv_cuda_decode_t mix_query(int32_t n_seq, int32_t max_tokens)
{
    int64_t page_bytes;
    mkv_page_layout_t hi, lo;
    mix_layouts(MKV_FORMAT_K8V4, 32, &page_bytes, &hi, &lo);
    return (mkv_cuda_decode_t){.page_bytes = page_bytes, .lay_hi = hi, .lay_lo = lo, .n_seq = n_seq, .n_heads = 8,
                               .group_size = 4, .head_dim = 128, .max_tokens = max_tokens,
                               .scores = MKV_DECODE_SCORES_SEPARATE};
}

/* mix_query's call on K16V16 pages of 32 tokens (both sections). */
static mkv_cuda_decode_t k16_query(int32_t n_seq, int32_t max_tokens)
{
    mkv_cuda_decode_t a = mix_query(n_seq, max_tokens);
    char err[ERR_LEN];
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K16V16, 128, 0, 0, 32, &a.page_bytes), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K16V16, 128, 0, 0, a.page_bytes, &a.lay_hi, err), MKV_STATUS_OK, "%s",
                 err);
    a.lay_lo = a.lay_hi;
    return a;
}

/* The separate pass with ready flags forced on (tc_args::ready, decision 84: the finalize
 * kernel waits on each region's items, whose flags their blocks set to 0 first; batch_gpu
 * poisons the workspace with 0xFF bytes, which a flag left unset would read as done): one
 * format (fp32 logits, also where compact ones are asked), the two-format kernel, calls without
 * scores, and a call of several waves of blocks, against the reference. Then the choice itself:
 * forced on and off, never for fused calls, and AUTO's at shapes of one wave, of short items and
 * of several waves (decode_tuning.h, ready_min_waves; asserted on GPUs of 132 multiprocessors,
 * H100 and H200). */
Test(decode_cuda, ready_flags, .timeout = 600)
{
    GPU_REQUIRE();
    stats_t ck[6] = {{.what = "out (fused)"},    {.what = "score (fused)"},
                     {.what = "out (separate, ready flags)"}, {.what = "score (separate, ready flags)"},
                     {.what = "out (per section)"}, {.what = "score (per section)"}};
    stats_t ckn[2] = {{.what = "out (no scores, ready flags)"}, {.what = "pool bytes unchanged (ready flags)"}};
    stats_t ckw[2] = {{.what = "out (waves, ready flags)"}, {.what = "score (waves, ready flags)"}};
    uint64_t r = 0x4ead7;
    mkv_tc_ready_override = 1;
    for (int di = 0; di < 2; di++) {
        fused_case(0, 0, di, 0, 0, &r, ck); /* K16V16 */
        fused_case(5, 5, di, 1, 1, &r, ck); /* K4V2, compact logits (fused; the separate pass keeps fp32) */
        fused_case(2, 5, di, 0, 1, &r, ck); /* K8V4 + K4V2 */
        fused_case(2, 5, di, 1, 0, &r, ck);
    }
    { /* without scores: the finalize only merges */
        const int32_t H = 2, n_seq = 3;
        int32_t len[3 * 2 * 2];
        for (int i = 0; i < n_seq * H; i++) {
            const int32_t n = test_rand_range(&r, 1, 5000), hi = test_rand_range(&r, 0, n);
            len[2 * i] = hi, len[2 * i + 1] = n - hi;
        }
        spec_t c = {.hi = MKV_FORMAT_K8V4, .lo = MKV_FORMAT_K4V2, .d = 128, .G = 4, .tpp = 23, .n_seq = n_seq,
                    .H = H, .len = len, .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        b.no_scores = 1;
        b.scores = MKV_DECODE_SCORES_SEPARATE;
        const int32_t splits[] = {0, 96};
        batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 2, &ckn[0], &ckn[1], NULL, NULL);
        batch_free(&b);
    }
    { /* a call of several waves of the separate kernel's blocks: finalize blocks start while
       * its last blocks run */
        const int32_t H = 8, n_seq = 48;
        int32_t *len = malloc(sizeof(int32_t) * 2 * n_seq * H);
        cr_assert_not_null(len);
        for (int i = 0; i < n_seq * H; i++) {
            const int32_t n = test_rand_range(&r, 1500, 4096), hi = test_rand_range(&r, n / 8, n / 2);
            len[2 * i] = hi, len[2 * i + 1] = n - hi;
        }
        spec_t c = {.hi = MKV_FORMAT_K8V4, .lo = MKV_FORMAT_K4V2, .d = 128, .G = 4, .tpp = 32, .n_seq = n_seq,
                    .H = H, .len = len, .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        b.scores = MKV_DECODE_SCORES_SEPARATE;
        const int32_t splits[] = {0, 256};
        batch_check_splits(&b, MKV_DECODE_KERNEL_AUTO, splits, 2, &ckw[0], &ckw[1], NULL, NULL);
        batch_free(&b);
        free(len);
    }
    mkv_tc_ready_override = 0;
    for (int i = 0; i < 6; i++) stats_expect(&ck[i], "ready_flags");
    for (int i = 0; i < 2; i++) stats_expect(&ckn[i], "ready_flags");
    for (int i = 0; i < 2; i++) stats_expect(&ckw[i], "ready_flags");

    /* The choice (plan queries only). */
    mkv_cuda_decode_t a = mix_query(64, 4096);
    mkv_tc_ready_override = 1;
    cr_assert(mkv_cuda_decode_ready_flags(&a), "forced on: no ready flags");
    a.scores = MKV_DECODE_SCORES_FUSED;
    cr_assert(!mkv_cuda_decode_ready_flags(&a), "a fused call with ready flags");
    a.scores = MKV_DECODE_SCORES_SEPARATE;
    mkv_tc_ready_override = -1;
    cr_assert(!mkv_cuda_decode_ready_flags(&a), "forced off: ready flags");
    mkv_tc_ready_override = 0;
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (sms != 132) {
        cr_log_info("ready_flags: AUTO's choice not asserted on a GPU of %d multiprocessors", sms);
        return;
    }
    static const struct {
        int32_t n_seq, max_tokens, mean_tokens, want;
    } cases[] = {{1, 1024, 0, 0},   {1, 16384, 0, 0}, {2, 2867, 0, 0},   {256, 1024, 0, 0},  {64, 1024, 0, 0},
                 {64, 4096, 0, 1},  {16, 16384, 0, 1}, {64, 16384, 0, 1}, {256, 16384, 0, 1}, {81, 6000, 2730, 1},
                 {16, 4096, 0, 1},  {8, 8192, 0, 1},  {16, 1024, 0, 0}}; /* (under two waves: decision 101) */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        a.n_seq = cases[i].n_seq, a.max_tokens = cases[i].max_tokens, a.mean_tokens = cases[i].mean_tokens;
        cr_assert_eq(mkv_cuda_decode_ready_flags(&a), cases[i].want,
                     "the mix %d x %d (mean %d), separate: ready flags %d (item %d)", a.n_seq, a.max_tokens,
                     a.mean_tokens, !cases[i].want, mkv_cuda_decode_item_tokens(&a));
    }
}


/* Two-format separate calls under a wave of the separate kernel's resident blocks take shorter
 * items that still fit one wave (wave_fill_item, decode_tuning.h's wave_fill_min_item): at such
 * a shape, with scores, AUTO's items (not a power of two) against the reference; a forced split
 * and the calls of several waves keep theirs. The choice is asserted on GPUs of 132
 * multiprocessors (H100, H200), where the sweep behind the rule ran. */
Test(decode_cuda, wave_fill_items, .timeout = 300)
{
    GPU_REQUIRE();
    mkv_cuda_decode_t a = mix_query(2, 8601);
    const int32_t item = mkv_cuda_decode_item_tokens(&a);
    cr_assert(item >= 32 && item % 32 == 0, "2 x 8,601: items of %d tokens", item);
    a.split_tokens = 256;
    cr_assert_eq(mkv_cuda_decode_item_tokens(&a), 256, "a forced split not kept");
    a.split_tokens = 0;
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (sms == 132) {
        static const struct {
            int32_t n_seq, max_tokens, want;
        } cases[] = {{2, 8601, 96},  {2, 11468, 128}, {4, 4300, 96},   {4, 8601, 192},
                     {4, 5734, 128}, {16, 2867, 256}, {16, 11468, 256}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            a.n_seq = cases[i].n_seq, a.max_tokens = cases[i].max_tokens;
            cr_assert_eq(mkv_cuda_decode_item_tokens(&a), cases[i].want, "%d x %d: items of %d tokens, want %d",
                         a.n_seq, a.max_tokens, mkv_cuda_decode_item_tokens(&a), cases[i].want);
        }
    } else {
        cr_log_warn("wave_fill_items: AUTO's items not asserted on a GPU of %d multiprocessors", sms);
    }

    /* AUTO at a shape the rule shortens (2 x 8,601 tokens on an H100: 96), against the reference */
    stats_t ck[2] = {{.what = "out (wave-filling items)"}, {.what = "score (wave-filling items)"}};
    uint64_t r = 0x3af111;
    const int32_t H = 8, n_seq = 2;
    int32_t len[2 * 2 * 8];
    for (int i = 0; i < n_seq * H; i++) {
        const int32_t n = test_rand_range(&r, 7000, 8601), h = test_rand_range(&r, n / 8, n / 2);
        len[2 * i] = h, len[2 * i + 1] = n - h;
    }
    len[0] = 1720, len[1] = 8601 - 1720; /* the longest region at max_tokens */
    spec_t c = {.hi = MKV_FORMAT_K8V4, .lo = MKV_FORMAT_K4V2, .d = 128, .G = 4, .tpp = 32, .n_seq = n_seq,
                .H = H, .len = len, .seed = test_rand_next(&r)};
    batch_t b;
    batch_build(&b, &c);
    b.scores = MKV_DECODE_SCORES_SEPARATE;
    a.n_seq = n_seq, a.max_tokens = b.max_tokens;
    if (sms == 132)
        cr_assert_eq(mkv_cuda_decode_item_tokens(&a), 96, "2 x %d: items of %d tokens", b.max_tokens,
                     mkv_cuda_decode_item_tokens(&a));
    const int32_t splits[] = {0};
    batch_check_splits(&b, MKV_DECODE_KERNEL_AUTO, splits, 1, &ck[0], &ck[1], NULL, NULL);
    batch_free(&b);
    for (int i = 0; i < 2; i++) stats_expect(&ck[i], "wave_fill_items");
}

/* Separate calls of few sequences: one sequence takes the shortest longer item whose grid is a
 * block a multiprocessor (decode_plan.cu, one_seq_item), one format of quantized keys at two
 * sequences items of a sixteenth-block region (few_region_item), the mix at few sequences twice
 * the shortest items where those spill past 9/8 blocks an SM (decision 95). AUTO's items on 132-SM GPUs,
 * a forced split kept, then a call at a length each rule changes, against the reference. */
Test(decode_cuda, few_seq_items, .timeout = 300)
{
    GPU_REQUIRE();
    mkv_cuda_decode_t a = mix_query(1, 8601);
    int64_t pb16;
    mkv_page_layout_t f16;
    char err[ERR_LEN];
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K16V16, 128, 0, 0, 32, &pb16), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K16V16, 128, 0, 0, pb16, &f16, err), MKV_STATUS_OK, "%s", err);
    mkv_cuda_decode_t q3[3] = {a, a, a}; /* K16V16, the mix, K4V2 alone */
    q3[0].page_bytes = pb16, q3[0].lay_hi = f16, q3[0].lay_lo = f16;
    q3[2].lay_hi = a.lay_lo;
    static const char *names[] = {"K16V16", "mix", "K4V2"};
    q3[1].split_tokens = 64;
    cr_assert_eq(mkv_cuda_decode_item_tokens(&q3[1]), 64, "a forced split not kept");
    q3[1].split_tokens = 0;
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (sms == 132) {
        static const struct {
            int f, n_seq, max_tokens, want; /* f: names[] */
        } cases[] = {{1, 1, 2867, 64},   {1, 1, 5017, 96},   {1, 1, 5734, 96},   {1, 1, 8601, 160},
                     {1, 1, 11468, 192}, {1, 1, 4300, 64},   {0, 1, 4096, 64},   {0, 1, 6144, 96},
                     {0, 1, 8192, 128},  {0, 1, 12288, 192}, {0, 1, 14336, 224}, {2, 1, 6144, 96},
                     {2, 1, 10240, 160}, {2, 1, 14336, 128}, {2, 2, 4096, 64},   {2, 2, 8192, 128},
                     {2, 2, 14336, 224}, {2, 4, 4096, 128},  {0, 2, 8192, 256},  {2, 2, 2048, 64},
                     {1, 2, 1433, 64},   {1, 3, 1075, 64},   {1, 2, 716, 32},    {1, 2, 1075, 32}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            mkv_cuda_decode_t *q = &q3[cases[i].f];
            q->n_seq = cases[i].n_seq, q->max_tokens = cases[i].max_tokens;
            cr_assert_eq(mkv_cuda_decode_item_tokens(q), cases[i].want, "%s %d x %d: items of %d tokens, want %d",
                         names[cases[i].f], q->n_seq, q->max_tokens, mkv_cuda_decode_item_tokens(q), cases[i].want);
        }
    } else {
        cr_log_warn("few_seq_items: AUTO's items not asserted on a GPU of %d multiprocessors", sms);
    }

    stats_t ck[2] = {{.what = "out (few sequences)"}, {.what = "score (few sequences)"}};
    uint64_t r = 0x1500e;
    const int32_t H = 8;
    static const struct {
        int f, n_seq, top, want;
    } calls[] = {{1, 1, 8601, 160}, {0, 1, 12200, 192}, {2, 2, 8000, 128}, {1, 2, 2000, 64}};
    static const mkv_format_t fmt[3][2] = {{MKV_FORMAT_K16V16, MKV_FORMAT_K16V16},
                                           {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2},
                                           {MKV_FORMAT_K4V2, MKV_FORMAT_K4V2}};
    for (int ci = 0; ci < (int)(sizeof calls / sizeof calls[0]); ci++) {
        const int32_t top = calls[ci].top, n_seq = calls[ci].n_seq, f = calls[ci].f;
        int32_t len[2 * 2 * 8];
        for (int i = 0; i < n_seq * H; i++) {
            const int32_t n = test_rand_range(&r, top - 1500, top), h = test_rand_range(&r, n / 8, n / 2);
            len[2 * i] = h, len[2 * i + 1] = n - h;
        }
        len[0] = top / 5, len[1] = top - top / 5; /* the longest region at max_tokens */
        spec_t c = {.hi = fmt[f][0], .lo = fmt[f][1], .d = 128, .G = 4, .tpp = 32, .n_seq = n_seq, .H = H,
                    .len = len, .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        b.scores = MKV_DECODE_SCORES_SEPARATE;
        mkv_cuda_decode_t *q = &q3[f];
        q->n_seq = n_seq, q->max_tokens = b.max_tokens;
        if (sms == 132)
            cr_assert_eq(mkv_cuda_decode_item_tokens(q), calls[ci].want, "%s %d x %d: items of %d tokens",
                         names[f], n_seq, b.max_tokens, mkv_cuda_decode_item_tokens(q));
        const int32_t splits[] = {0};
        batch_check_splits(&b, MKV_DECODE_KERNEL_AUTO, splits, 1, &ck[0], &ck[1], NULL, NULL);
        batch_free(&b);
    }
    for (int i = 0; i < 2; i++) stats_expect(&ck[i], "few_seq_items");
}

/* Without a device the plan takes the fallback attributes (132 multiprocessors, no occupancy,
 * so no rule that needs the kernels' resident blocks): the batch-1 and two-sequence item rules
 * (decode_plan.cu, one_seq_item and few_region_item) checked where CI runs, on the H100's
 * multiprocessor count. With a device its own attributes hold, and few_seq_items checks them. */
Test(decode_cuda, few_seq_items_fallback)
{
    const char *why;
    if (gpu_available(&why)) cr_skip_test("a CUDA device is present: few_seq_items checks its plans");
    mkv_cuda_decode_t q3[3] = {k16_query(1, 0), mix_query(1, 0), mix_query(1, 0)}; /* K16V16, mix, K4V2 */
    q3[2].lay_hi = q3[2].lay_lo;
    static const struct {
        int f, n_seq, max_tokens, want;
    } cases[] = {{0, 1, 4096, 64},  {0, 1, 6144, 96},   {0, 1, 8192, 128},  {0, 1, 12288, 192}, {0, 1, 14336, 224},
                 {2, 1, 6144, 96},  {2, 1, 10240, 160}, {2, 1, 14336, 128}, {1, 1, 4300, 64},   {1, 1, 5734, 96},
                 {1, 1, 11468, 192}, {2, 2, 2048, 64},  {2, 2, 4096, 64},   {2, 2, 8192, 128},  {2, 2, 14336, 224},
                 {2, 4, 4096, 128}, {0, 2, 8192, 256},  {2, 2, 1024, 32},
                 /* the mix at few sequences: 64 where 32 would spill past 9/8 blocks an SM
                  * (decision 95; 132 SMs: 192 and 216 blocks at 32, against 96 and 144) */
                 {1, 2, 1433, 64},  {1, 3, 1075, 64},   {1, 2, 716, 32},    {1, 2, 1075, 32}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mkv_cuda_decode_t *q = &q3[cases[i].f];
        q->n_seq = cases[i].n_seq, q->max_tokens = cases[i].max_tokens;
        cr_assert_eq(mkv_cuda_decode_item_tokens(q), cases[i].want, "format %d, %d x %d: items of %d tokens, want %d",
                     cases[i].f, q->n_seq, q->max_tokens, mkv_cuda_decode_item_tokens(q), cases[i].want);
    }
    /* The high items (decisions 88 and 93), AUTO's and forced: the mix only, AUTO's longer than
     * its item size. */
    q3[1].n_seq = 1, q3[1].max_tokens = 2867, q3[2].n_seq = 1, q3[2].max_tokens = 2867;
    mkv_tc_hi_item_override = 32;
    const int32_t mix_hi = mkv_cuda_decode_hi_item_tokens(&q3[1]), k4_hi = mkv_cuda_decode_hi_item_tokens(&q3[2]);
    mkv_tc_hi_item_override = 64;
    const int32_t mix_64 = mkv_cuda_decode_hi_item_tokens(&q3[1]); /* the item size itself: none */
    mkv_tc_hi_item_override = 0;
    const int32_t auto_4k = mkv_cuda_decode_hi_item_tokens(&q3[1]);
    q3[1].max_tokens = 3584; /* 1 x 5k: the shortest whose grid is 128 blocks */
    const int32_t auto_5k = mkv_cuda_decode_hi_item_tokens(&q3[1]);
    q3[1].max_tokens = 4300; /* 1 x 6k: 144 blocks, 128 with longer high items */
    const int32_t auto_6k = mkv_cuda_decode_hi_item_tokens(&q3[1]);
    q3[1].max_tokens = 5734; /* 1 x 8k: 128 blocks, more with shorter high items */
    const int32_t auto_8k = mkv_cuda_decode_hi_item_tokens(&q3[1]);
    cr_assert_eq(auto_4k, 0, "AUTO's high items at 1 x 4k: %d, want none (decision 93)", auto_4k);
    cr_assert_eq(auto_5k, 0, "AUTO's high items at 1 x 5k: %d, want none (decision 93)", auto_5k);
    cr_assert_eq(auto_6k, 80, "AUTO's high items at 1 x 6k: %d, want 80", auto_6k);
    cr_assert_eq(auto_8k, 0, "AUTO's high items at 1 x 8k: %d, want none", auto_8k);
    q3[1].max_tokens = 2150; /* 1 x 3k: items of 32 tokens with high items of 48 (decision 93) */
    const int32_t auto_3k = mkv_cuda_decode_hi_item_tokens(&q3[1]), item_3k = mkv_cuda_decode_item_tokens(&q3[1]);
    cr_assert(auto_3k == 48 && item_3k == 32, "AUTO at 1 x 3k: items %d, high items %d; want 32 and 48", item_3k,
              auto_3k);
    q3[1].n_seq = 2, q3[1].max_tokens = 2150; /* 2 x 3k: longer high items for one sequence only */
    const int32_t auto_2x3k = mkv_cuda_decode_hi_item_tokens(&q3[1]);
    cr_assert_eq(auto_2x3k, 0, "AUTO's high items at 2 x 3k: %d, want none", auto_2x3k);
    cr_assert_eq(mix_hi, 32, "the mix's high items forced to 32: %d", mix_hi);
    cr_assert_eq(k4_hi, 0, "K4V2 alone with high items of %d", k4_hi);
    cr_assert_eq(mix_64, 0, "high items of the item size itself: %d", mix_64);
}

/* Batch b with and without scores at each setting of a process-wide knob (left at 0, AUTO),
 * against the reference: ck[0] the outputs, ck[1] the scores, ck[2] the pool unchanged. */
static void check_knob_settings(batch_t *b, int32_t *knob, const int32_t *settings, int n, stats_t ck[3])
{
    const int32_t splits[] = {0};
    for (int ns = 0; ns < 2; ns++) {
        b->no_scores = ns;
        for (int k = 0; k < n; k++) {
            *knob = settings[k];
            batch_check_splits(b, MKV_DECODE_KERNEL_TENSOR, splits, 1, &ck[0], ns ? &ck[2] : &ck[1], NULL, NULL);
        }
    }
    *knob = 0;
}

/* The separate finalize pass's merge blocks (decisions 97, 112 and 113): the plan's (AUTO's at
 * the mix 1 x 1.5k, whose 34 items a region take two batches of loads a thread in 2 slices and
 * one in 3, at 2 x 1.5k, not at 4 x 1.5k nor beyond 4 from the batches; the mix at 1 x 1,408
 * (985 tokens kept: 2), 1,664 (1,165: 3), 1,792 (1,254, 40 items: 3, one batch, not 4),
 * 2,048 (1,434, 45 items: 4, as 3 would take two batches) and 4 x 1,792 (2);
 * K16V16 at 1 x 1k, 1,280 (40 items: 3), 1,408 (44: 4) and 1.5k, one where the
 * call has more regions than the multiprocessors; forced), asserted on 132 multiprocessors or
 * the fallback's; then, with a device, calls whose regions hold from one item to the most,
 * AUTO's and forced 1 to 8, with and without scores, against the reference. */
Test(decode_cuda, merge_blocks, .timeout = 300)
{
    const char *why;
    const int gpu = gpu_available(&why);
    int sms = 132;
    if (gpu) CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    mkv_cuda_decode_t q2[2] = {k16_query(1, 0), mix_query(1, 0)}; /* K16V16, the mix */
    if (sms == 132) {
        static const struct {
            int f, n_seq, max_tokens, want;
        } cases[] = {{1, 1, 1075, 3}, {1, 2, 1075, 3}, {1, 4, 1075, 2}, {1, 1, 716, 2},  {1, 1, 2150, 4},
                     {0, 1, 1536, 4}, {0, 1, 1024, 2}, {0, 4, 1280, 4}, {1, 64, 11468, 1}, {1, 16, 716, 1},
                     {0, 8, 1024, 1}, {1, 1, 985, 2},  {1, 1, 1165, 3}, {1, 1, 1254, 3},
                     {1, 1, 1434, 4}, {0, 1, 1280, 3}, {0, 1, 1408, 4}, {1, 4, 1254, 2}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            mkv_cuda_decode_t *q = &q2[cases[i].f];
            q->n_seq = cases[i].n_seq, q->max_tokens = cases[i].max_tokens;
            const int32_t got = mkv_cuda_decode_merge_blocks(q);
            cr_assert_eq(got, cases[i].want, "%s %d x %d: %d merge blocks, want %d", cases[i].f ? "mix" : "K16V16",
                         q->n_seq, q->max_tokens, got, cases[i].want);
        }
    } else {
        cr_log_info("merge_blocks: AUTO's plans not asserted on a GPU of %d multiprocessors", sms);
    }
    q2[1].n_seq = 64, q2[1].max_tokens = 11468;
    mkv_tc_merge_blocks_override = 8;
    const int32_t forced = mkv_cuda_decode_merge_blocks(&q2[1]);
    q2[1].scores = MKV_DECODE_SCORES_FUSED;
    const int32_t fused = mkv_cuda_decode_merge_blocks(&q2[1]); /* no finalize pass: 1 */
    mkv_tc_merge_blocks_override = 0;
    cr_assert_eq(forced, 8, "forced to 8: %d merge blocks", forced);
    cr_assert_eq(fused, 1, "a fused call with %d merge blocks", fused);
    if (!gpu) {
        /* (info, not warn: Criterion exits non-zero after a warning) */
        cr_log_info("merge_blocks: no CUDA device (%s): calls not run", why);
        return;
    }

    stats_t ck[3] = {{.what = "out (merge blocks)"}, {.what = "score (merge blocks)"},
                     {.what = "pool bytes unchanged (merge blocks, no scores)"}};
    uint64_t r = 0x3e26b;
    static const mkv_format_t fmt[2][2] = {{MKV_FORMAT_K16V16, MKV_FORMAT_K16V16},
                                           {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2}};
    static const struct {
        int f, n_seq, top;
    } calls[] = {{1, 1, 1536}, {0, 1, 1024}, {1, 2, 2100}, {0, 4, 1500}};
    static const int32_t knob[] = {0, 1, 2, 3, 4, 8};
    const int32_t H = 8;
    for (int ci = 0; ci < (int)(sizeof calls / sizeof calls[0]); ci++) {
        const int32_t n_seq = calls[ci].n_seq, top = calls[ci].top;
        int32_t len[2 * 4 * 8];
        for (int i = 0; i < n_seq * H; i++) { /* from one item's tokens to the most */
            const int32_t n = i == 0 ? top : test_rand_range(&r, 1, top);
            const int32_t h = calls[ci].f ? test_rand_range(&r, 0, n) : n;
            len[2 * i] = h, len[2 * i + 1] = n - h;
        }
        spec_t c = {.hi = fmt[calls[ci].f][0], .lo = fmt[calls[ci].f][1], .d = 128, .G = 4, .tpp = 23,
                    .n_seq = n_seq, .H = H, .len = len, .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        b.scores = MKV_DECODE_SCORES_SEPARATE;
        check_knob_settings(&b, &mkv_tc_merge_blocks_override, knob, (int)(sizeof knob / sizeof knob[0]), ck);
        batch_free(&b);
    }
    for (int i = 0; i < 3; i++) stats_expect(&ck[i], "merge_blocks");
}

/* The fused kernel's region merge split between a region's last blocks to arrive (tc_args::
 * merge_split, decision 105): the plan's (AUTO's 8 at K16V16 1 x 32k without scores, one grid of
 * every block, 32 blocks a region; 1 at 1 x 16k, 16 a region; 1 at 64 x 16k, more blocks than
 * resident, also where forced; 1 for separate calls; forced 3, and forced off, asserted on 132
 * multiprocessors); then calls
 * of one wave whose regions hold from one block to the most (so that some have fewer blocks
 * than the split), d 128 G 4 and d 64 G 3 (slices of uneven size), K16V16 and the mix, with and
 * without scores, AUTO's split and forced 1, 2, 3, 8 and 32, against the reference. */
Test(decode_cuda, merge_split, .timeout = 600)
{
    GPU_REQUIRE();
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (sms == 132) {
        mkv_cuda_decode_t k = k16_query(1, 32768), m = mix_query(1, 16384);
        k.no_scores = 1, k.scores = MKV_DECODE_SCORES_FUSED;
        const int32_t k_auto = mkv_cuda_decode_merge_split(&k);
        k.max_tokens = 16384;
        const int32_t k_16k = mkv_cuda_decode_merge_split(&k);
        k.n_seq = 64;
        const int32_t k_big = mkv_cuda_decode_merge_split(&k);
        mkv_tc_merge_split_override = 3;
        const int32_t k_big3 = mkv_cuda_decode_merge_split(&k);
        const int32_t m_sep = mkv_cuda_decode_merge_split(&m);
        k.n_seq = 1, k.max_tokens = 32768;
        const int32_t k_3 = mkv_cuda_decode_merge_split(&k);
        mkv_tc_merge_split_override = -1;
        const int32_t k_off = mkv_cuda_decode_merge_split(&k);
        mkv_tc_merge_split_override = 0;
        cr_assert(mkv_cuda_decode_fuses_scores(&k), "K16V16 1 x 32k without scores not fused");
        cr_assert(!mkv_cuda_decode_fuses_scores(&m), "the mix 1 x 16k with scores fused");
        cr_assert_eq(k_auto, 8, "K16V16 1 x 32k without scores: merge split %d, want 8", k_auto);
        cr_assert_eq(k_16k, 1, "K16V16 1 x 16k without scores: merge split %d, want 1", k_16k);
        cr_assert_eq(k_big, 1, "K16V16 64 x 16k: merge split %d, want 1 (more blocks than resident)", k_big);
        cr_assert_eq(k_big3, 1, "K16V16 64 x 16k forced to 3: merge split %d, want 1", k_big3);
        cr_assert_eq(m_sep, 1, "a separate call with merge split %d", m_sep);
        cr_assert_eq(k_3, 3, "forced to 3: merge split %d", k_3);
        cr_assert_eq(k_off, 1, "forced off: merge split %d", k_off);
    } else {
        cr_log_info("merge_split: AUTO's plans not asserted on a GPU of %d multiprocessors", sms);
    }

    stats_t ck[3] = {{.what = "out (merge split)"}, {.what = "score (merge split)"},
                     {.what = "pool bytes unchanged (merge split, no scores)"}};
    uint64_t r = 0x5b117;
    static const struct {
        mkv_format_t hi, lo;
        int32_t d, G, n_seq, top;
    } calls[] = {{MKV_FORMAT_K16V16, MKV_FORMAT_K16V16, 128, 4, 1, 20000},
                 {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 128, 4, 2, 9000},
                 {MKV_FORMAT_K16V16, MKV_FORMAT_K16V16, 64, 3, 1, 12000}};
    static const int32_t knob[] = {0, 1, 2, 3, 8, 32};
    const int32_t H = 8;
    for (int ci = 0; ci < (int)(sizeof calls / sizeof calls[0]); ci++) {
        const int32_t n_seq = calls[ci].n_seq, top = calls[ci].top;
        int32_t len[2 * 2 * 8];
        for (int i = 0; i < n_seq * H; i++) { /* from one block's tokens to the most */
            const int32_t n = i == 0 ? top : i == 1 ? 300 : test_rand_range(&r, 1, top);
            const int32_t h = calls[ci].hi != calls[ci].lo ? test_rand_range(&r, 0, n) : n;
            len[2 * i] = h, len[2 * i + 1] = n - h;
        }
        spec_t c = {.hi = calls[ci].hi, .lo = calls[ci].lo, .d = calls[ci].d, .G = calls[ci].G, .tpp = 23 + 9 * ci,
                    .n_seq = n_seq, .H = H, .len = len, .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        b.scores = MKV_DECODE_SCORES_FUSED;
        check_knob_settings(&b, &mkv_tc_merge_split_override, knob, (int)(sizeof knob / sizeof knob[0]), ck);
        batch_free(&b);
    }
    for (int i = 0; i < 3; i++) stats_expect(&ck[i], "merge_split");
}

/* The two-format separate pass's short high items (tc_args::hi_item, decision 88): forced to
 * 16 and 48 tokens against items of AUTO's size, 64, 96 and 128, with and without ready flags
 * and scores, on regions whose high share leaves room for them and regions whose share does not
 * (those keep one item size: high_item_tokens), pages of 23 tokens, against the reference; then
 * the plan: AUTO's choice at one wave and at many (asserted on 132 multiprocessors), never for
 * one format or compact logits, off where forced off. */
Test(decode_cuda, hi_items, .timeout = 600)
{
    GPU_REQUIRE();
    stats_t ck[2] = {{.what = "out (high items)"}, {.what = "score (high items)"}};
    stats_t ckn[2] = {{.what = "out (high items, no scores)"}, {.what = "pool bytes unchanged (high items)"}};
    uint64_t r = 0x41173;
    static const int32_t forced[] = {16, 48};
    for (int fi = 0; fi < 2; fi++)
        for (int ready = 0; ready < 2; ready++)
            for (int ns = 0; ns < 2; ns++) {
                const int32_t H = 3, n_seq = 2;
                int32_t len[2 * 3 * 2];
                for (int i = 0; i < n_seq * H; i++) {
                    const int32_t n = test_rand_range(&r, 1, 3000);
                    /* a high share of up to 40% (short items fit), or more (they may not) */
                    const int32_t hi = i % 3 == 2 ? test_rand_range(&r, n / 2, n) : test_rand_range(&r, 0, 2 * n / 5);
                    len[2 * i] = hi, len[2 * i + 1] = n - hi;
                }
                len[0] = 1700, len[1] = 1300; /* the longest region: more high tokens than fit */
                spec_t c = {.hi = MKV_FORMAT_K8V4, .lo = MKV_FORMAT_K4V2, .d = 128, .G = 4, .tpp = 23,
                            .n_seq = n_seq, .H = H, .len = len, .seed = test_rand_next(&r)};
                batch_t b;
                batch_build(&b, &c);
                b.scores = MKV_DECODE_SCORES_SEPARATE;
                b.no_scores = ns;
                mkv_tc_hi_item_override = forced[fi];
                mkv_tc_ready_override = ready ? 1 : -1;
                const int32_t splits[] = {0, 64, 96, 128};
                batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 4, ns ? &ckn[0] : &ck[0],
                                   ns ? &ckn[1] : &ck[1], NULL, NULL);
                batch_free(&b);
            }
    mkv_tc_hi_item_override = 0;
    mkv_tc_ready_override = 0;
    for (int i = 0; i < 2; i++) stats_expect(&ck[i], "hi_items");
    for (int i = 0; i < 2; i++) stats_expect(&ckn[i], "hi_items");

    /* The choice (plan queries only). */
    mkv_cuda_decode_t a = mix_query(1, 2867), k4 = a;
    k4.lay_hi = k4.lay_lo;
    mkv_tc_hi_item_override = 32;
    cr_assert_eq(mkv_cuda_decode_hi_item_tokens(&k4), 0, "one format with high items");
    a.split_tokens = 128;
    cr_assert_eq(mkv_cuda_decode_hi_item_tokens(&a), 32, "forced to 32: %d", mkv_cuda_decode_hi_item_tokens(&a));
    a.logits = MKV_DECODE_LOGITS_COMPACT; /* the separate pass keeps fp32 logits (decision 89) */
    cr_assert_eq(mkv_cuda_decode_hi_item_tokens(&a), 32, "compact logits asked: high items %d",
                 mkv_cuda_decode_hi_item_tokens(&a));
    a.logits = MKV_DECODE_LOGITS_AUTO, a.split_tokens = 0;
    mkv_tc_hi_item_override = -1;
    cr_assert_eq(mkv_cuda_decode_hi_item_tokens(&a), 0, "forced off: high items");
    mkv_tc_hi_item_override = 0;
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (sms != 132) {
        cr_log_warn("hi_items: AUTO's choice not asserted on a GPU of %d multiprocessors", sms);
        return;
    }
    static const struct {
        int32_t n_seq, max_tokens, want;
    } cases[] = {{1, 717, 0},   {1, 2150, 48}, {1, 2867, 0}, {1, 3584, 0},
                 {2, 717, 0},   {1, 4300, 80}, {1, 5734, 0}, {2, 1433, 0}, {2, 2150, 0},
                 {64, 2867, 0}, {256, 717, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        a.n_seq = cases[i].n_seq, a.max_tokens = cases[i].max_tokens;
        cr_assert_eq(mkv_cuda_decode_hi_item_tokens(&a), cases[i].want, "mix %d x %d: high items of %d, want %d",
                     a.n_seq, a.max_tokens, mkv_cuda_decode_hi_item_tokens(&a), cases[i].want);
    }
}

/* The two-format separate pass with its low items from a block of their own (tc_args::hi_align,
 * decision 109) forced on and off against the reference: regions whose high items fill their
 * last block or leave 1 to 3 warps idle, none or all of them high, G 4 and 8, d 64 and 128,
 * pages of 23 and 32 tokens, several splits, with and without scores (the pool unchanged);
 * then AUTO's choice. */
Test(decode_cuda, hi_align, .timeout = 600)
{
    GPU_REQUIRE();
    stats_t ck[2][2] = {{{.what = "out (aligned)"}, {.what = "score (aligned)"}},
                        {{.what = "out (packed)"}, {.what = "score (packed)"}}};
    stats_t ckn[2] = {{.what = "out (aligned, no scores)"}, {.what = "pool bytes unchanged (aligned)"}};
    uint64_t r = 0xa11a;
    for (int on = 0; on < 2; on++)
        for (int cse = 0; cse < 4; cse++) {
            const int32_t H = 3, n_seq = 2;
            int32_t len[2 * 3 * 2];
            for (int i = 0; i < n_seq * H; i++) {
                const int32_t n = test_rand_range(&r, 1, 1500);
                len[2 * i] = test_rand_range(&r, 0, n / 2), len[2 * i + 1] = n - len[2 * i];
            }
            /* high sections of 4, 5, 6 and 7 items of 32 tokens, none, and all of a region */
            len[0] = 32 * (4 + cse) - 5, len[1] = 700;
            len[2] = 0, len[3] = 333;
            len[4] = 410, len[5] = 0;
            spec_t c = {.hi = MKV_FORMAT_K8V4, .lo = MKV_FORMAT_K4V2, .d = cse % 2 ? 64 : 128,
                        .G = cse / 2 ? 8 : 4, .tpp = cse % 2 ? 32 : 23, .n_seq = n_seq, .H = H,
                        .len = len, .seed = test_rand_next(&r)};
            batch_t b;
            batch_build(&b, &c);
            b.scores = MKV_DECODE_SCORES_SEPARATE;
            mkv_tc_hi_align_override = on ? 1 : -1;
            const int32_t splits[] = {0, 64, 96};
            batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 3, &ck[!on][0], &ck[!on][1], NULL, NULL);
            if (on) {
                b.no_scores = 1;
                batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 3, &ckn[0], &ckn[1], NULL, NULL);
            }
            batch_free(&b);
        }
    mkv_tc_hi_align_override = 0;
    for (int i = 0; i < 2; i++) {
        stats_expect(&ck[i][0], "hi_align");
        stats_expect(&ck[i][1], "hi_align");
        stats_expect(&ckn[i], "hi_align");
    }

    /* The choice (plan queries only): never with ready flags, high items of their own or one
     * format; forced on elsewhere; AUTO on in calls of a wave. */
    mkv_cuda_decode_t a = mix_query(1, 1536), k4 = a;
    k4.lay_hi = k4.lay_lo;
    mkv_tc_hi_align_override = 1;
    cr_assert_eq(mkv_cuda_decode_hi_align(&k4), 0, "one format aligned");
    mkv_tc_ready_override = 1;
    cr_assert_eq(mkv_cuda_decode_hi_align(&a), 0, "aligned with ready flags");
    mkv_tc_ready_override = 0;
    mkv_tc_hi_item_override = 48;
    cr_assert_eq(mkv_cuda_decode_hi_align(&a), 0, "aligned with high items of 48");
    mkv_tc_hi_item_override = 0;
    a.n_seq = 64, a.max_tokens = 16384;
    cr_assert_eq(mkv_cuda_decode_hi_align(&a), !mkv_cuda_decode_ready_flags(&a), "forced on at 64 x 16k");
    mkv_tc_hi_align_override = -1;
    a.n_seq = 1, a.max_tokens = 1536;
    cr_assert_eq(mkv_cuda_decode_hi_align(&a), 0, "forced off");
    mkv_tc_hi_align_override = 0;
    a.n_seq = 64, a.max_tokens = 16384;
    cr_assert_eq(mkv_cuda_decode_hi_align(&a), 0, "AUTO at 64 x 16k");
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (sms != 132) {
        cr_log_warn("hi_align: AUTO's choice at a block a multiprocessor not asserted on %d of them", sms);
        return;
    }
    /* 8 regions of 13 blocks (1.5k tokens in items of 32) fit 132 multiprocessors; 32 regions
     * of 7 (items of 64) do not */
    a.n_seq = 1, a.max_tokens = 1536;
    cr_assert_eq(mkv_cuda_decode_hi_align(&a), 1, "AUTO at 1 x 1.5k");
    a.n_seq = 4;
    cr_assert_eq(mkv_cuda_decode_hi_align(&a), 0, "AUTO at 4 x 1.5k");
}

/* Spec c's batch on the tensor-core kernels, items of the plan's size and of 64 tokens, with the
 * fused write-back (fp32 logits) into ck[0] (outputs) and ck[1] (scores), with the separate
 * pass into ck[2] and ck[3]. */
static void check_fused_and_separate(const spec_t *c, stats_t ck[4])
{
    batch_t b;
    batch_build(&b, c);
    const int32_t splits[] = {0, 64};
    b.scores = MKV_DECODE_SCORES_FUSED;
    b.logits = MKV_DECODE_LOGITS_FP32;
    batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 2, &ck[0], &ck[1], NULL, NULL);
    b.scores = MKV_DECODE_SCORES_SEPARATE;
    batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 2, &ck[2], &ck[3], NULL, NULL);
    batch_free(&b);
}

/* q of a wide dynamic range (20 binades) against keys far from zero (zeros' and codes' terms
 * nearly cancel): the formats whose keys take the fp16 mma as subnormals (4-bit: one format,
 * default groups and one group, and the two-format kernel, whose fused pass keeps the integer
 * path) beside 16-bit keys, fused and separate, each probability against the reference. */
Test(decode_cuda, wide_range_q, .timeout = 300)
{
    GPU_REQUIRE();
    static const mkv_format_t pairs[][2] = {{MKV_FORMAT_K4V2, MKV_FORMAT_K4V2}, {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2},
                                            {MKV_FORMAT_K4V4, MKV_FORMAT_K4V4}, {MKV_FORMAT_K4V8, MKV_FORMAT_K4V8},
                                            {MKV_FORMAT_K16V16, MKV_FORMAT_K16V16}};
    static const int32_t lens[] = {1, 65, 700, 1500, 4097};
    stats_t ck[4] = {{.what = "out (fused)"}, {.what = "score (fused)"},
                     {.what = "out (separate)"}, {.what = "score (separate)"}};
    uint64_t r = 0x91de;
    int n_case = 0;
    for (int pi = 0; pi < 5; pi++)
        for (int di = 0; di < 2; di++)
            for (int dg = 0; dg < 2; dg++, n_case++) {
                const int32_t H = 2, n_seq = 3, eg = dg ? 0 : 256;
                int32_t len[3 * 2 * 2];
                for (int i = 0; i < n_seq * H; i++) {
                    const int32_t n = lens[(i + n_case) % 5], hi = test_rand_range(&r, 0, n);
                    len[2 * i] = hi, len[2 * i + 1] = n - hi;
                }
                spec_t c = {.hi = pairs[pi][0], .lo = pairs[pi][1], .d = di ? 128 : 64,
                            .G = n_case % 2 ? 8 : 4, .groups = {eg, eg, eg, eg}, .tpp = 16 + 5 * (n_case % 3),
                            .n_seq = n_seq, .H = H, .len = len, .seed = test_rand_next(&r),
                            .zero_scores = 1, .qwide = 1};
                check_fused_and_separate(&c, ck);
            }
    for (int i = 0; i < 4; i++) stats_expect(&ck[i], "wide_range_q");
}

/* q far below a float's normal range (max |q| about 2^-116: its scale 2^E is no normal
 * float, so form_q scales it in two steps), every query head's with the softmax scale raised to
 * match, or the even heads' only (a warp's lanes then mix both cases): the two-format kernel,
 * K16V16, K8V4 and K4V2, d 64 and 128, G 4 and 8, fused and separate. */
Test(decode_cuda, tiny_q, .timeout = 300)
{
    GPU_REQUIRE();
    static const mkv_format_t pairs[][2] = {{MKV_FORMAT_K8V4, MKV_FORMAT_K4V2}, {MKV_FORMAT_K16V16, MKV_FORMAT_K16V16},
                                            {MKV_FORMAT_K8V4, MKV_FORMAT_K8V4}, {MKV_FORMAT_K4V2, MKV_FORMAT_K4V2}};
    static const int32_t lens[] = {1, 70, 333, 1200};
    stats_t ck[4] = {{.what = "out (fused)"}, {.what = "score (fused)"},
                     {.what = "out (separate)"}, {.what = "score (separate)"}};
    uint64_t r = 0x7195;
    int n_case = 0;
    for (int pi = 0; pi < 4; pi++)
        for (int di = 0; di < 2; di++)
            for (int half = 0; half < 2; half++, n_case++) {
                const int32_t H = 2, n_seq = 2;
                int32_t len[2 * 2 * 2];
                for (int i = 0; i < n_seq * H; i++) {
                    const int32_t n = lens[(i + n_case) % 4], hi = test_rand_range(&r, 0, n);
                    len[2 * i] = hi, len[2 * i + 1] = n - hi;
                }
                spec_t c = {.hi = pairs[pi][0], .lo = pairs[pi][1], .d = di ? 128 : 64,
                            .G = n_case % 2 ? 8 : 4, .tpp = 16 + 5 * (n_case % 3), .n_seq = n_seq,
                            .H = H, .len = len, .seed = test_rand_next(&r), .zero_scores = 1,
                            .qshift = 118, .qshift_half = half};
                check_fused_and_separate(&c, ck);
            }
    for (int i = 0; i < 4; i++) stats_expect(&ck[i], "tiny_q");
}

/* Calls planned from a mean_tokens hint (items sized for shorter regions than max_tokens, which
 * is several times the longest here) against the reference: the two-format kernel and K16V16,
 * fused and separate, with and without scores. */
Test(decode_cuda, mean_tokens_hint, .timeout = 300)
{
    GPU_REQUIRE();
    stats_t ck[2] = {{.what = "out (hint)"}, {.what = "score (hint)"}};
    static const mkv_format_t fmts[][2] = {{MKV_FORMAT_K8V4, MKV_FORMAT_K4V2}, {MKV_FORMAT_K16V16, MKV_FORMAT_K16V16}};
    static const int32_t lens[] = {1, 63, 700, 2050, 4097};
    uint64_t r = 0x5ee1;
    for (int ci = 0; ci < 4; ci++) {
        const int32_t H = 3, n_seq = 4;
        int32_t len[4 * 3 * 2];
        for (int i = 0; i < n_seq * H; i++) {
            const int32_t n = lens[(i + ci) % 5], hi = test_rand_range(&r, 0, n);
            len[2 * i] = hi, len[2 * i + 1] = n - hi;
        }
        spec_t c = {.hi = fmts[ci % 2][0], .lo = fmts[ci % 2][1], .d = 128, .G = 4, .groups = {0, 0, 0, 0},
                    .tpp = 32, .n_seq = n_seq, .H = H, .len = len, .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        b.max_tokens = 4 * b.max_n + test_rand_range(&r, 0, 100);
        b.no_scores = ci >= 2;
        const int32_t none[] = {0};
        for (int s = MKV_DECODE_SCORES_SEPARATE; s <= MKV_DECODE_SCORES_FUSED; s++)
            for (int h = 0; h < 3; h++) {
                b.scores = s;
                b.mean_tokens = h == 0 ? 1 : h == 1 ? b.max_n / 3 + 1 : b.max_n;
                batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, none, 1, &ck[0], &ck[1], NULL, NULL);
            }
        batch_free(&b);
    }
    stats_expect(&ck[0], "mean_tokens_hint");
    stats_expect(&ck[1], "mean_tokens_hint");
}

/* Calls without the score write-back (no_scores: an engine that never compresses): the same
 * outputs as the reference, and the pool, score slots included, exactly as it was; the
 * tensor-core kernels fused and separate, one and two formats, and the generic kernels. */
Test(decode_cuda, no_scores, .timeout = 300)
{
    GPU_REQUIRE();
    stats_t ck[2] = {{.what = "out (no scores)"}, {.what = "pool bytes unchanged (no scores)"}};
    static const struct {
        mkv_format_t hi, lo;
        int32_t d, G;
    } cases[] = {{MKV_FORMAT_K16V16, MKV_FORMAT_K16V16, 128, 4}, {MKV_FORMAT_K16V16, MKV_FORMAT_K16V16, 64, 3},
                 {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 128, 4},   {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 64, 8},
                 {MKV_FORMAT_K4V2, MKV_FORMAT_K4V2, 128, 2},   {MKV_FORMAT_K8V4, MKV_FORMAT_K8V4, 32, 4}};
    static const int32_t lens[] = {1, 63, 700, 4097, 9000, 130};
    uint64_t r = 0x5c0e;
    const int32_t splits[] = {0, 64, 100};
    for (int ci = 0; ci < 6; ci++) {
        const int32_t H = 2, n_seq = 3;
        int32_t len[3 * 2 * 2];
        for (int i = 0; i < n_seq * H; i++) {
            const int32_t n = lens[(i + ci) % 6], hi = test_rand_range(&r, 0, n);
            len[2 * i] = hi, len[2 * i + 1] = n - hi;
        }
        len[2 * 3] = len[2 * 3 + 1] = 0; /* a head-region with no tokens: out untouched */
        spec_t c = {.hi = cases[ci].hi, .lo = cases[ci].lo, .d = cases[ci].d, .G = cases[ci].G,
                    .tpp = 16 + 7 * ci, .n_seq = n_seq, .H = H, .len = len, .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        b.no_scores = 1;
        for (int s = MKV_DECODE_SCORES_SEPARATE; s <= MKV_DECODE_SCORES_FUSED; s++) {
            b.scores = s;
            batch_check_splits(&b, MKV_DECODE_KERNEL_AUTO, splits, 3, &ck[0], &ck[1], NULL, NULL);
        }
        batch_free(&b);
    }
    stats_expect(&ck[0], "no_scores");
    stats_expect(&ck[1], "no_scores");
}

/* The lengths [n][2] (n_hi, n_lo) of n head-regions, mostly full (len tokens, the plan's max):
 * region i shorter (a random length) where i % short_every == short_at, every third split at
 * random between its two sections. malloc'd. */
static int32_t *mostly_full_lengths(int32_t n, int32_t len, int short_every, int short_at, uint64_t *r)
{
    int32_t *l = malloc(sizeof(int32_t) * 2 * (size_t)n);
    cr_assert_not_null(l);
    for (int i = 0; i < n; i++) {
        const int32_t t = i % short_every == short_at ? test_rand_range(r, 1, len) : len;
        const int32_t hi = i % 3 == 0 ? test_rand_range(r, 0, t) : t;
        l[2 * i] = hi, l[2 * i + 1] = t - hi;
    }
    return l;
}

/* A fused call without scores large enough (more than mkv_decode_tuning::tail_min_waves waves
 * of resident blocks) that its last regions take items of half the size (tc_args::tail_rs;
 * mkv_cuda_decode_tail_regions says so), and one of more than a wave whose first regions take
 * them too (tc_args::head_rs, decision 96; mkv_cuda_decode_head_regions): the same outputs as
 * the reference, regions of every length, one and two sections, the pool unchanged. K16V16 at
 * d 64 and d 128 (pages of 32 tokens), head regions at AUTO's share of the first wave and at
 * the knob's 250 and 1000 per mille; the rules leave K4V2 out, and the tail rule single-block
 * regions (256 x 8 x 1,000: 4 items of 256 tokens), which the head rule takes where their
 * block is full of short items (not 32 x 8 x 1,000's 2 items of 512). */
Test(decode_cuda, no_scores_tail_regions, .timeout = 600)
{
    GPU_REQUIRE();
    stats_t ck[2] = {{.what = "out (no scores, tail and head regions)"},
                     {.what = "pool bytes unchanged (tail and head regions)"}};
    static const struct {
        mkv_format_t f;
        int32_t d, G, n_seq, H, len, tail, head, knob;
    } cases[] = {{MKV_FORMAT_K16V16, 64, 2, 160, 8, 1500, 1, 1, 0},
                 {MKV_FORMAT_K16V16, 128, 4, 96, 8, 2100, 1, 1, 0},
                 {MKV_FORMAT_K16V16, 128, 4, 96, 8, 2100, 1, 1, 1000},
                 {MKV_FORMAT_K4V2, 128, 4, 96, 8, 2100, 0, 0, 0},
                 {MKV_FORMAT_K16V16, 128, 4, 256, 8, 1000, 0, 1, 0},
                 {MKV_FORMAT_K16V16, 128, 4, 256, 8, 1000, 0, 1, 250},
                 {MKV_FORMAT_K16V16, 128, 4, 256, 8, 1000, 0, 0, -1},
                 {MKV_FORMAT_K16V16, 128, 4, 32, 8, 1000, 0, 0, 0}};
    uint64_t r = 0x7a11;
    const int32_t splits[] = {0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int32_t n = cases[ci].n_seq * cases[ci].H;
        int32_t *len = mostly_full_lengths(n, cases[ci].len, 7, 0, &r);
        spec_t c = {.hi = cases[ci].f, .lo = cases[ci].f, .d = cases[ci].d, .G = cases[ci].G, .tpp = 32,
                    .n_seq = cases[ci].n_seq, .H = cases[ci].H, .len = len, .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        b.no_scores = 1;
        const mkv_cuda_decode_t a = {.lay_hi = b.lay_hi, .lay_lo = b.lay_lo, .n_seq = c.n_seq, .n_heads = c.H,
                                     .group_size = c.G, .head_dim = c.d, .max_tokens = b.max_tokens,
                                     .no_scores = 1};
        mkv_tc_head_override = cases[ci].knob;
        const int32_t tail = mkv_cuda_decode_tail_regions(&a), head = mkv_cuda_decode_head_regions(&a);
        cr_assert(mkv_cuda_decode_fuses_scores(&a), "%s: not fused", b.ctx);
        if (cases[ci].tail)
            cr_assert(tail > 0 && tail < n, "%s: %d tail regions of %d", b.ctx, tail, n);
        else
            cr_assert_eq(tail, 0, "%s: %d tail regions", b.ctx, tail);
        if (cases[ci].head)
            cr_assert(head > 0 && head + tail <= n, "%s: %d head and %d tail regions of %d", b.ctx, head, tail, n);
        else
            cr_assert_eq(head, 0, "%s: %d head regions", b.ctx, head);
        cr_log_info("%s: %d head, %d tail regions of %d (knob %d)", b.ctx, head, tail, n, cases[ci].knob);
        if (cases[ci].tail || cases[ci].head)
            batch_check_splits(&b, MKV_DECODE_KERNEL_AUTO, splits, 1, &ck[0], &ck[1], NULL, NULL);
        mkv_tc_head_override = 0;
        batch_free(&b);
        free(len);
    }
    stats_expect(&ck[0], "no_scores_tail_regions");
    stats_expect(&ck[1], "no_scores_tail_regions");
}

/* Fused calls without scores in pieces (tc_args::piece_tokens, K16V16): the reference's outputs
 * and the pool unchanged, at piece sizes asked of the knob (16: a piece a stage; 32; 48 and
 * 208, ending inside pages of 23 and 30 tokens; 208 also longer than the items of 64 and 128
 * tokens, so that a region's blocks are cut to its pieces), regions of every length, one and two
 * sections, one region alone and calls of many; a call that AUTO runs in pieces (more than a
 * wave of blocks, regions of 2 blocks or more), one it fits in a wave with longer items and
 * one of few long regions it runs as one wave in pieces. mkv_cuda_decode_piece_tokens says which calls
 * run in pieces: not small ones under AUTO, not with scores, not K4V2, not with the knob off. */
Test(decode_cuda, no_scores_pieces, .timeout = 600)
{
    GPU_REQUIRE();
    stats_t ck[2] = {{.what = "out (no scores, pieces)"}, {.what = "pool bytes unchanged (pieces)"}};
    /* auto_pieces, auto_item: what AUTO takes on an H100 or H200 (132 SMs of 3 blocks at d 128):
     * the first three calls fit a wave; the fourth does with items of 1,024 tokens, a block a
     * region (mkv_decode_tuning::single_block_wave_max_item); the fifth, of 9-block regions, does
     * not (0: not asserted); the sixth, 32 regions of 20,000 tokens, runs one wave of 12 blocks a
     * region, items of 448 tokens in pieces of 16 (piece_wave_*); the last, 64 regions of
     * 16,000 tokens, a wave of 6 blocks a region and 6 spares after them (auto_wave: wave_spares_*,
     * items of 352 tokens, pieces of 32); knob: run the sizes asked, and pieces of 48 with 2
     * spares a region where that plan takes no more workspace. On GPUs where AUTO's pieces do
     * not pay (decision 94: from 16 peak DRAM bytes per SM cycle, mkv_decode_tuning::
     * pieces_max_dram_bytes_per_sm_cycle; an H200) the fifth and sixth take none, the fifth
     * its items of 256 tokens as they are; the spares' wave stays on the H100, and the H200
     * runs the last call's wave without spares, its warps' first pieces static (decision 102:
     * auto_static, the items of 672 tokens of 6 blocks a region, 900 per mille, then pieces
     * of 32), and the spares' wave with that rule off. */
    const double dram_b = mkv_cuda_dram_bytes_per_sm_cycle();
    const int pieces_pay = dram_b > 0.0 && dram_b < 16.0;
    static const struct {
        int32_t d, G, n_seq, H, len, tpp, auto_pieces, auto_item, auto_wave, knob, auto_static;
    } cases[] = {{128, 4, 3, 2, 9000, 23, 0, 0, 0, 1, 0},    {64, 3, 5, 3, 4097, 30, 0, 0, 0, 1, 0},
                 {128, 8, 1, 1, 20000, 32, 0, 0, 0, 1, 0},   {128, 4, 40, 8, 1500, 32, 0, 1024, 0, 1, 0},
                 {64, 2, 24, 8, 9000, 32, 32, 256, 0, 0, 0}, {128, 4, 4, 8, 20000, 32, 16, 448, 0, 0, 0},
                 {128, 4, 8, 8, 16000, 32, 32, 352, 6, 0, 672}};
    static const int32_t pieces[] = {16, 32, 48, 208};
    const int32_t splits[] = {0, 64, 128}, auto_split[] = {0};
    int spared = 0, statics = 0;
    uint64_t r = 0x91ec;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int32_t n = cases[ci].n_seq * cases[ci].H;
        int32_t *len = mostly_full_lengths(n, cases[ci].len, 4, 1, &r);
        if (n > 2) len[2 * 2] = len[2 * 2 + 1] = 0; /* a head-region with no tokens: out untouched */
        spec_t c = {.hi = MKV_FORMAT_K16V16, .lo = MKV_FORMAT_K16V16, .d = cases[ci].d, .G = cases[ci].G,
                    .tpp = cases[ci].tpp, .n_seq = cases[ci].n_seq, .H = cases[ci].H, .len = len,
                    .seed = test_rand_next(&r)};
        batch_t b;
        batch_build(&b, &c);
        b.no_scores = 1;
        b.scores = MKV_DECODE_SCORES_FUSED;
        mkv_cuda_decode_t a = {.lay_hi = b.lay_hi, .lay_lo = b.lay_lo, .n_seq = c.n_seq, .n_heads = c.H,
                               .group_size = c.G, .head_dim = c.d, .max_tokens = b.max_tokens,
                               .scores = MKV_DECODE_SCORES_FUSED, .no_scores = 1};
        mkv_tc_piece_tokens_override = 0;
        const int32_t at = mkv_cuda_decode_piece_tokens(&a);
        const int plain = !pieces_pay && cases[ci].auto_wave == 0; /* AUTO's pieces off here */
        const int stat = !pieces_pay && cases[ci].auto_static > 0;  /* decision 102's wave */
        const int32_t want_pieces = plain ? 0 : cases[ci].auto_pieces;
        const int32_t want_item =
            stat ? cases[ci].auto_static : plain && cases[ci].auto_pieces == 16 ? 0 : cases[ci].auto_item;
        cr_assert_eq(at, want_pieces, "%s: AUTO pieces of %d, expected %d (%.1f DRAM bytes an SM cycle)", b.ctx, at,
                     want_pieces, dram_b);
        const int32_t item = mkv_cuda_decode_item_tokens(&a);
        cr_assert(!want_item || item == want_item, "%s: AUTO items of %d, expected %d", b.ctx, item, want_item);
        const int32_t wave = mkv_cuda_decode_wave_blocks(&a), st = mkv_cuda_decode_piece_static(&a);
        cr_assert_eq(wave, stat ? 0 : cases[ci].auto_wave, "%s: AUTO wave of %d blocks a region, expected %d", b.ctx,
                     wave, stat ? 0 : cases[ci].auto_wave);
        cr_assert_eq(st, stat ? 900 : 0, "%s: AUTO static pieces of %d per mille", b.ctx, st);
        if (stat) { /* the rule off: decision 83's spares */
            mkv_tc_piece_static_override = -1;
            cr_assert_eq(mkv_cuda_decode_wave_blocks(&a), cases[ci].auto_wave, "%s: spares with the rule off", b.ctx);
            cr_assert_eq(mkv_cuda_decode_piece_static(&a), 0, "%s: static pieces with the rule off", b.ctx);
            mkv_tc_piece_static_override = 0;
        }
        if (at > 0 || cases[ci].auto_item || cases[ci].auto_pieces)
            batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, auto_split, 1, &ck[0], &ck[1], NULL, NULL);
        if (cases[ci].knob) {
            for (size_t pi = 0; pi < sizeof pieces / sizeof pieces[0]; pi++) {
                mkv_tc_piece_tokens_override = pieces[pi];
                const int32_t pt = mkv_cuda_decode_piece_tokens(&a);
                cr_assert_eq(pt, pieces[pi], "%s: pieces of %d, asked %d", b.ctx, pt, pieces[pi]);
                batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 3, &ck[0], &ck[1], NULL, NULL);
            }
            /* static first pieces (decision 102) of 700 and 900 per mille, then pieces of 32 or 48
             * from the counter: in a wave where its workspace allows, else AUTO's items with
             * plain pieces */
            for (int ps = 0; ps < 2; ps++) {
                mkv_tc_piece_static_override = ps ? 900 : 700;
                mkv_tc_piece_tokens_override = ps ? 48 : 32;
                const int32_t ks = mkv_cuda_decode_piece_static(&a);
                cr_assert(ks == 0 || ks == mkv_tc_piece_static_override, "%s: static pieces of %d per mille, asked %d",
                          b.ctx, ks, mkv_tc_piece_static_override);
                statics += ks > 0;
                batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, auto_split, 1, &ck[0], &ck[1], NULL, NULL);
            }
            mkv_tc_piece_static_override = 0;
            /* a wave with 2 spares a region, pieces of 48, where its items need no more
             * workspace than AUTO's (not where the wave's items would be shorter) */
            mkv_tc_piece_tokens_override = 48;
            mkv_tc_wave_spares_override = 2;
            if (mkv_cuda_decode_wave_blocks(&a) > 0) {
                spared++;
                batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, auto_split, 1, &ck[0], &ck[1], NULL, NULL);
            }
            mkv_tc_wave_spares_override = -1;
            cr_assert_eq(mkv_cuda_decode_wave_blocks(&a), 0, "%s: a wave with the knob off", b.ctx);
            mkv_tc_wave_spares_override = 0;
        }
        mkv_tc_piece_tokens_override = -1;
        cr_assert_eq(mkv_cuda_decode_piece_tokens(&a), 0, "%s: pieces with the knob off", b.ctx);
        mkv_tc_piece_tokens_override = 48;
        a.no_scores = 0;
        cr_assert_eq(mkv_cuda_decode_piece_tokens(&a), 0, "%s: pieces with scores", b.ctx);
        mkv_tc_piece_tokens_override = 0;
        batch_free(&b);
        free(len);
    }
    /* On an H100 or H200, the first call (a wave of 36 blocks a region: its items are AUTO's
     * 64) and the fourth (1 block a region and 2 spares) */
    cr_assert_geq(spared, 2, "the knob's spares ran on %d calls", spared);
    /* and the knob's static first pieces in a wave on some (the first's wave needs no more
     * workspace than AUTO's items) */
    cr_assert_geq(statics, 1, "the knob's static pieces ran in a wave on %d calls", statics);
    /* not for K4V2 (no variant in pieces) */
    mkv_page_layout_t l;
    char err[ERR_LEN] = "";
    int64_t bytes;
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K4V2, 128, 0, 0, 32, &bytes), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K4V2, 128, 0, 0, bytes, &l, err), MKV_STATUS_OK, "%s", err);
    const mkv_cuda_decode_t k4 = {.lay_hi = l, .lay_lo = l, .n_seq = 8, .n_heads = 8, .group_size = 4,
                                  .head_dim = 128, .max_tokens = 4096, .scores = MKV_DECODE_SCORES_FUSED,
                                  .no_scores = 1};
    mkv_tc_piece_tokens_override = 48;
    cr_assert_eq(mkv_cuda_decode_piece_tokens(&k4), 0, "K4V2 in pieces");
    mkv_tc_piece_tokens_override = 0;
    stats_expect(&ck[0], "no_scores_pieces");
    stats_expect(&ck[1], "no_scores_pieces");
}

/* mkv_cuda_decode_workspace_bound covers every length up to its bound (what the CUDA KV
 * backend allocates once for captured steps) and is the size of one of them. Host arithmetic
 * only: runs without a device. */
Test(decode_cuda, workspace_bound)
{
    static const int32_t seqs[] = {1, 8, 16, 64}, lens[] = {1, 3000, 8192};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 3; k++) {
            const size_t bound = mkv_cuda_decode_workspace_bound(seqs[i], 8, 4, 128, lens[k]);
            size_t most = 0;
            for (int32_t m = 1; m <= lens[k]; m++) {
                const size_t w = mkv_cuda_decode_workspace_size(seqs[i], 8, 4, 128, m, 0);
                cr_assert_leq(w, bound, "n_seq %d: %zu bytes at %d tokens above the bound %zu for %d", seqs[i], w,
                              m, bound, lens[k]);
                most = w > most ? w : most;
            }
            cr_assert_eq(bound, most, "n_seq %d, up to %d tokens: bound %zu, largest size %zu", seqs[i], lens[k],
                         bound, most);
        }
    cr_assert_eq(mkv_cuda_decode_workspace_bound(1, 8, 4, 128, 0), 0);
    cr_assert_eq(mkv_cuda_decode_workspace_bound(1, 8, 0, 128, 100), 0);
}

/* The mean_tokens hint: items sized from it (shorter where the regions are shorter than
 * max_tokens says), every plan within mkv_cuda_decode_workspace_size for any hint, and at a
 * serving shape (81 sequences of Llama-3-8B heads, the longest 6,000 tokens, the mean stored
 * 2,900) the mix's items halved. Host arithmetic only: runs without a device. */
Test(decode_cuda, mean_tokens_plans)
{
    static const mkv_format_t pairs[][2] = {{MKV_FORMAT_K8V4, MKV_FORMAT_K4V2},
                                            {MKV_FORMAT_K16V16, MKV_FORMAT_K16V16},
                                            {MKV_FORMAT_K4V2, MKV_FORMAT_K4V2}};
    char err[ERR_LEN];
    uint64_t r = 0x3ea7;
    for (int p = 0; p < 3; p++) {
        int64_t page_bytes;
        mkv_page_layout_t hi, lo;
        cr_assert_eq(mkv_page_bytes_for(pairs[p][0], 128, 0, 0, 32, &page_bytes), MKV_STATUS_OK);
        cr_assert_eq(mkv_page_layout(pairs[p][0], 128, 0, 0, page_bytes, &hi, err), MKV_STATUS_OK, "%s", err);
        cr_assert_eq(mkv_page_layout(pairs[p][1], 128, 0, 0, page_bytes, &lo, err), MKV_STATUS_OK, "%s", err);
        for (int rep = 0; rep < 60; rep++) {
            mkv_cuda_decode_t a = {.page_bytes = page_bytes, .lay_hi = hi, .lay_lo = lo,
                                   .n_seq = test_rand_range(&r, 1, 200), .n_heads = 8, .group_size = 4,
                                   .head_dim = 128, .max_tokens = test_rand_range(&r, 1, 33000),
                                   .scores = test_rand_range(&r, 0, 2), .no_scores = rep % 5 == 0};
            const size_t ws = mkv_cuda_decode_workspace_size(a.n_seq, 8, 4, 128, a.max_tokens, 0);
            const int32_t plain = mkv_cuda_decode_item_tokens(&a);
            cr_assert_gt(plain, 0, "%s: not a tensor-core call", mkv_format_name(pairs[p][0]));
            for (int k = 0; k < 8; k++) {
                a.mean_tokens = k == 0 ? 1 : test_rand_range(&r, 1, a.max_tokens + 100);
                const size_t used = mkv_cuda_decode_plan_bytes(&a);
                cr_assert(used > 0 && used <= ws, "%s + %s, n_seq %d, max %d, mean %d: plan %zu bytes, workspace %zu",
                          mkv_format_name(pairs[p][0]), mkv_format_name(pairs[p][1]), a.n_seq, a.max_tokens,
                          a.mean_tokens, used, ws);
                cr_assert_leq(mkv_cuda_decode_item_tokens(&a), plain, "a hint below max_tokens lengthened the items");
            }
        }
    }
    int64_t page_bytes;
    mkv_page_layout_t hi, lo;
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K8V4, 128, 0, 0, 32, &page_bytes), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K8V4, 128, 0, 0, page_bytes, &hi, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K4V2, 128, 0, 0, page_bytes, &lo, err), MKV_STATUS_OK, "%s", err);
    mkv_cuda_decode_t a = {.page_bytes = page_bytes, .lay_hi = hi, .lay_lo = lo, .n_seq = 81, .n_heads = 8,
                           .group_size = 4, .head_dim = 128, .max_tokens = 6000};
    const int32_t plain = mkv_cuda_decode_item_tokens(&a);
    a.mean_tokens = 2900;
    const int32_t hinted = mkv_cuda_decode_item_tokens(&a);
    cr_assert_eq(hinted * 2, plain, "81 x 6,000 (mean 2,900): items of %d tokens with the hint, %d without", hinted,
                 plain);
}

/* The logit form the separate pass plans: fp32 whatever is asked (decision 89: its kernel is
 * built without the compact form), at every G, with and without scores, on pages that hold no
 * multiple of 16 tokens (since decision 111 only pages under 16 tokens: 4 fp16 tokens' bytes
 * hold 8 K8V4 and 13 K4V2 tokens; decision 71 had made compact logits take such pages). Host
 * arithmetic only: runs without a device. */
Test(decode_cuda, separate_logits_plan)
{
    int64_t page_bytes;
    mkv_page_layout_t hi, lo;
    mix_layouts(MKV_FORMAT_K16V16, 4, &page_bytes, &hi, &lo);
    cr_assert(hi.tokens % 16 != 0 && lo.tokens % 16 != 0, "pages of %d and %d tokens", hi.tokens, lo.tokens);
    static const int32_t Gs[] = {1, 2, 3, 4, 8};
    for (int gi = 0; gi < 5; gi++)
        for (int form = MKV_DECODE_LOGITS_AUTO; form <= MKV_DECODE_LOGITS_COMPACT; form++)
            for (int ns = 0; ns < 2; ns++) {
                const mkv_cuda_decode_t a = {.page_bytes = page_bytes, .lay_hi = hi, .lay_lo = lo, .n_seq = 81,
                                             .n_heads = 8, .group_size = Gs[gi], .head_dim = 128,
                                             .max_tokens = 6000, .scores = MKV_DECODE_SCORES_SEPARATE,
                                             .logits = form, .no_scores = ns};
                cr_assert(!mkv_cuda_decode_fuses_scores(&a), "G %d: a separate call fused", Gs[gi]);
                cr_assert(mkv_cuda_decode_item_tokens(&a) > 0, "G %d: not on the tensor-core path", Gs[gi]);
                cr_assert(!mkv_cuda_decode_compact_logits(&a), "G %d, logits %d, no_scores %d: compact logits",
                          Gs[gi], form, ns);
            }
}

/* AUTO's choice for one-format calls without scores (decode_tuning.h,
 * fuse_no_scores_min_token_heads): the separate pass up to 2^16 token-heads, the fused kernel
 * above. Host arithmetic only (no occupancy query needs a device: 0 blocks then). */
Test(decode_cuda, no_scores_fuse_rule)
{
    int64_t page_bytes;
    mkv_page_layout_t l;
    char err[ERR_LEN];
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K16V16, 128, 0, 0, 16, &page_bytes), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K16V16, 128, 0, 0, page_bytes, &l, err), MKV_STATUS_OK, "%s", err);
    static const struct {
        int32_t n_seq, max_tokens, fused;
    } cases[] = {{1, 1024, 0}, {4, 1024, 0}, {1, 4096, 0}, {2, 4096, 0}, {2, 4097, 1},
                 {4, 4096, 1}, {1, 16384, 1}, {64, 4096, 1}, {16, 1024, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mkv_cuda_decode_t a = {.page_bytes = page_bytes, .lay_hi = l, .lay_lo = l, .n_seq = cases[i].n_seq,
                               .n_heads = 8, .group_size = 4, .head_dim = 128, .max_tokens = cases[i].max_tokens,
                               .no_scores = 1};
        cr_assert_eq(mkv_cuda_decode_fuses_scores(&a), cases[i].fused, "K16V16 %d x %d without scores: fused %d",
                     cases[i].n_seq, cases[i].max_tokens, mkv_cuda_decode_fuses_scores(&a));
        a.scores = MKV_DECODE_SCORES_FUSED; /* asked for: always */
        cr_assert(mkv_cuda_decode_fuses_scores(&a), "K16V16 %d x %d: FUSED not honoured", cases[i].n_seq,
                  cases[i].max_tokens);
    }
}

/* AUTO's choice for calls with scores (tc_may_fuse, decision 99): on GPUs of at least
 * fuse_long_max_dram_bytes_per_sm_cycle peak DRAM bytes per SM cycle (the H200) only K16V16
 * from 2^21 token-heads is fused among these long-region calls; below it (the H100) or where the
 * device cannot be asked (no GPU: as the H100), small calls and long regions are too. Host
 * arithmetic and device attributes only. */
Test(decode_cuda, scores_fuse_rule)
{
    const double bpc = mkv_cuda_dram_bytes_per_sm_cycle();
    const int fast = bpc >= 16.0;
    mkv_cuda_decode_t k16 = k16_query(1, 16384), mix = mix_query(1, 22938), k4 = mix_query(1, 32768);
    k16.scores = mix.scores = k4.scores = MKV_DECODE_SCORES_AUTO;
    k4.lay_hi = k4.lay_lo; /* K4V2 alone */
    static const struct {
        int f, n_seq, max_tokens, fused_fast, fused_slow;
    } cases[] = {{0, 1, 16384, 0, 1}, {0, 2, 32768, 0, 1}, {0, 4, 32768, 0, 1}, {0, 8, 32768, 1, 1},
                 {0, 32, 8192, 1, 1},  {0, 16, 8192, 0, 0},  {1, 1, 22938, 0, 1}, {1, 2, 11468, 0, 0},
                 {2, 64, 32768, 0, 1}, {2, 4, 16384, 0, 1}};
    static const char *names[] = {"K16V16", "mix", "K4V2"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mkv_cuda_decode_t *q = cases[i].f == 0 ? &k16 : cases[i].f == 1 ? &mix : &k4;
        q->n_seq = cases[i].n_seq, q->max_tokens = cases[i].max_tokens;
        const int want = fast ? cases[i].fused_fast : cases[i].fused_slow, got = mkv_cuda_decode_fuses_scores(q);
        cr_assert_eq(got, want, "%s %d x %d with scores, %.1f DRAM bytes per SM cycle: fused %d, want %d",
                     names[cases[i].f], q->n_seq, q->max_tokens, bpc, got, want);
        q->scores = MKV_DECODE_SCORES_SEPARATE;
        cr_assert(!mkv_cuda_decode_fuses_scores(q), "%s: SEPARATE not honoured", names[cases[i].f]);
        q->scores = MKV_DECODE_SCORES_AUTO;
    }
}

/* The separate pass's K16V16 items of a call of more than a wave of blocks, doubled while that
 * brings the call into one (decision 100): asserted on a GPU of 132 multiprocessors (3 separate
 * blocks each at d 128), AUTO's item at shapes where it doubles and where it does not; then one
 * such call against the reference. */
Test(decode_cuda, sep_wave_items, .timeout = 300)
{
    GPU_REQUIRE();
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    mkv_cuda_decode_t q = k16_query(2, 32768); /* the separate pass, with scores */
    if (sms == 132) {
        static const struct {
            int n_seq, max_tokens, want;
        } cases[] = {{2, 32768, 512}, {4, 16384, 512}, {4, 32768, 256}, {2, 16384, 256}, {8, 16384, 256}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            q.n_seq = cases[i].n_seq, q.max_tokens = cases[i].max_tokens;
            const int32_t got = mkv_cuda_decode_item_tokens(&q);
            cr_assert_eq(got, cases[i].want, "K16V16 %d x %d, separate: items of %d, want %d", q.n_seq, q.max_tokens,
                         got, cases[i].want);
        }
    } else {
        cr_log_info("sep_wave_items: AUTO's items not asserted on a GPU of %d multiprocessors", sms);
    }
    stats_t ck[2] = {{.what = "out (separate wave items)"}, {.what = "score (separate wave items)"}};
    uint64_t r = 0x5e9a7;
    const int32_t n_seq = 2, H = 8, top = 30000;
    int32_t len[2 * 2 * 8];
    for (int i = 0; i < n_seq * H; i++) {
        const int32_t n = i == 0 ? top : test_rand_range(&r, 1, top);
        len[2 * i] = n, len[2 * i + 1] = 0;
    }
    spec_t c = {.hi = MKV_FORMAT_K16V16, .lo = MKV_FORMAT_K16V16, .d = 128, .G = 4, .tpp = 32, .n_seq = n_seq,
                .H = H, .len = len, .seed = test_rand_next(&r)};
    batch_t b;
    batch_build(&b, &c);
    b.scores = MKV_DECODE_SCORES_SEPARATE;
    const int32_t splits[] = {0};
    batch_check_splits(&b, MKV_DECODE_KERNEL_TENSOR, splits, 1, &ck[0], &ck[1], NULL, NULL);
    batch_free(&b);
    for (int i = 0; i < 2; i++) stats_expect(&ck[i], "sep_wave_items");
}

/* Argument checks only: no pointer is dereferenced, so this runs without a device too. */
Test(decode_cuda, bad_arguments)
{
    static _Alignas(16) uint8_t fake[64];
    mkv_page_layout_t hi, lo;
    int64_t page_bytes;
    char err[ERR_LEN];
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K8V4, 128, 256, 256, 32, &page_bytes), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K8V4, 128, 256, 256, page_bytes, &hi, err), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K4V2, 128, 256, 256, page_bytes, &lo, err), MKV_STATUS_OK);
    /* n_seq = 0: valid, and a call with nothing to do touches no pointer. */
    const mkv_cuda_decode_t good = {
        .pool = fake, .page_bytes = page_bytes, .lay_hi = hi, .lay_lo = lo,
        .table = (const int32_t *)fake, .n_hi = (const int32_t *)fake,
        .n_lo = (const int32_t *)fake, .row_entries = 8, .regions = (const int64_t *)fake,
        .n_seq = 0, .n_heads = 8, .group_size = 4, .head_dim = 128, .max_tokens = 100,
        .q = (const float *)fake, .out = (float *)fake, .softmax_scale = 0.1f,
        .split_tokens = 0, .workspace = fake};
    cr_assert_eq(mkv_cuda_decode(&good, NULL, err), MKV_STATUS_OK, "%s", err);

    mkv_cuda_decode_t bad[40];
    int n = 0;
    for (int i = 0; i < 40; i++) bad[i] = good;
    bad[n++].pool = NULL;
    bad[n++].table = NULL;
    bad[n++].n_hi = NULL;
    bad[n++].n_lo = NULL;
    bad[n++].regions = NULL;
    bad[n++].q = NULL;
    bad[n++].out = NULL;
    bad[n++].workspace = NULL;
    bad[n++].group_size = 0;
    bad[n++].group_size = -3;
    bad[n++].n_heads = 0;
    bad[n++].n_seq = -1;
    bad[n++].head_dim = 48;
    bad[n++].head_dim = 64;      /* the layouts are for d = 128 */
    bad[n++].lay_lo.head_dim = 64; /* hi and lo disagree */
    bad[n++].lay_lo.key.vec_bytes = 32;
    bad[n].lay_lo.value.groups = 16, bad[n++].lay_lo.value.group_elems = 8; /* under 16 */
    bad[n].lay_hi.key.groups = 3, bad[n++].lay_hi.key.group_elems = 43;    /* not a power of 2 */
    bad[n++].lay_hi.tokens = 0;
    bad[n++].max_tokens = -1;
    bad[n++].split_tokens = -2;
    bad[n++].page_bytes = page_bytes + 8;    /* not a multiple of 16 */
    bad[n++].page_bytes = hi.used_bytes - 16; /* smaller than the layout */
    bad[n++].row_entries = 0;
    bad[n++].pool = fake + 4;                 /* not 16-byte aligned */
    bad[n++].kernel = 4;
    bad[n++].kernel = -1;
    bad[n] = good;
    bad[n++].scores = 3;
    bad[n++].logits = 3;
    bad[n++].logits = -1;
    bad[n++].no_scores = 2;
    bad[n++].mean_tokens = -1;
    cr_assert_leq(n, 40);
    for (int i = 0; i < n; i++) {
        err[0] = '\0';
        cr_assert_eq(mkv_cuda_decode(&bad[i], NULL, err), MKV_STATUS_INVALID_ARGUMENT,
                     "bad argument set %d accepted", i);
        cr_assert_neq(err[0], '\0', "bad argument set %d: no message", i);
        cr_assert_eq(mkv_cuda_decode(&bad[i], NULL, NULL), MKV_STATUS_INVALID_ARGUMENT);
    }
    cr_assert_eq(mkv_cuda_decode(NULL, NULL, err), MKV_STATUS_INVALID_ARGUMENT);

    /* The tensor-core kernels asked for where they do not apply: UNSUPPORTED, with a reason. */
    mkv_cuda_decode_t t = good;
    t.kernel = MKV_DECODE_KERNEL_TENSOR;
    cr_assert_eq(mkv_cuda_decode(&t, NULL, err), MKV_STATUS_OK, "%s", err);
    cr_assert(mkv_cuda_decode_uses_tensor(&hi, &lo, 4, 128));
    t.group_size = 12;
    cr_assert_eq(mkv_cuda_decode(&t, NULL, err), MKV_STATUS_UNSUPPORTED);
    cr_assert_neq(strstr(err, "group_size 12"), NULL, "%s", err);
    mkv_page_layout_t hi2;
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K8V4, 128, 64, 64, page_bytes, &hi2, err), MKV_STATUS_OK);
    t = good;
    t.kernel = MKV_DECODE_KERNEL_TENSOR;
    t.lay_hi = hi2;
    t.lay_lo = hi2;
    cr_assert_eq(mkv_cuda_decode(&t, NULL, err), MKV_STATUS_UNSUPPORTED);
    cr_assert_not(mkv_cuda_decode_uses_tensor(&hi2, &hi2, 4, 128));

    cr_assert_eq(mkv_cuda_decode_workspace_size(1, 8, 0, 128, 100, 0), 0);
    cr_assert_eq(mkv_cuda_decode_workspace_size(1, 8, 4, 48, 100, 0), 0);
    cr_assert_eq(mkv_cuda_decode_workspace_size(1, 8, 4, 128, -1, 0), 0);
    cr_assert_geq(mkv_cuda_decode_workspace_size(2, 8, 4, 128, 100, 0),
                  sizeof(float) * 2 * 8 * 4 * 100, "the logits alone need this much");
}
