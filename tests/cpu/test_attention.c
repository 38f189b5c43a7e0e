/*
 * test_attention.c — the reference attention (attention/decode_ref.c, attention/prefill_ref.c)
 * against a naive float64 attention written independently here.
 *
 * Decode runs over pages built the way the memory manager builds them: a pool with pages
 * outside the region, a shuffled page-id permutation, high pages from the left of the row and
 * low pages from the right, unused entries -1, awkward section lengths and 1-token pages. The
 * float64 reference reads the keys and values back with mkv_quant_read_vector, so it checks the
 * attention, not the quantizer. Outputs are poisoned with NaN, the pool with a byte pattern,
 * and scratch is followed by a guard; only the scores of the region's tokens may change.
 *
 * Tolerances (fp32 reference vs float64):
 *   outputs            |got - want| <= TOL_ABS + TOL_REL * |want|
 *   decode scores      |got - (old + max_g p)| <= TOL_SCORE: fp32 logits at d = 256 move a
 *                      probability near 1 by up to ~1.3e-6 (measured), the fp32 add by ulp / 2
 *   prefill sig_sum    |got - want| <= TOL_SIG * (1 + |want|): up to n fp32 additions
 *   K16V16 vs attention on the unrounded fp32 K/V: within the bound that fp16 rounding of K
 *   and V explains (fp16_bound below) plus the fp32 tolerance, and within TOL_FP16_REL * max|v|.
 */
#include "attention/attention.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_ABS 1e-5
#define TOL_REL 1e-4
#define TOL_SCORE 4e-6
#define TOL_SIG 1e-5
#define TOL_FP16_REL 2e-3 /* K16V16 vs unrounded K/V, relative to max|v| */
#define MAX_REPORT 5
#define GUARD 8
#define GUARD_VALUE 12345.0f

/* ---- Checking with a report of the first mismatches ------------------------------------ */

typedef struct checker {
    const char *what;
    int64_t checked, bad;
    double max_abs; /* largest |got - want| seen */
} checker_t;

/* NaN fails: the comparison is written so that it must hold. */
static void check_close(checker_t *c, const char *ctx, int64_t i, int64_t j, double got,
                        double want, double tol_abs, double tol_rel)
{
    const double err = fabs(got - want);
    c->checked++;
    if (err > c->max_abs || isnan(err)) c->max_abs = isnan(err) ? INFINITY : err;
    if (err <= tol_abs + tol_rel * fabs(want)) return;
    if (c->bad++ < MAX_REPORT)
        fprintf(stderr, "%s: %s[%lld][%lld] = %.9g, want %.9g (err %.3g)\n", ctx, c->what,
                (long long)i, (long long)j, got, want, err);
}

static void expect_clean(const checker_t *c, const char *test)
{
    cr_log_info("%s: %s: %lld values, max abs error %.3g", test, c->what, (long long)c->checked,
                c->max_abs);
    cr_assert_gt(c->checked, 0, "%s: %s checked nothing", test, c->what);
    cr_assert_eq(c->bad, 0, "%s: %lld of %lld %s values out of tolerance (first ones above)", test,
                 (long long)c->bad, (long long)c->checked, c->what);
}

static float frand(tu_rng_t *r, double lo, double hi)
{
    return (float)(lo + (hi - lo) * ((double)(tu_rand(r) >> 11) * 0x1p-53));
}

static float round_f16(float x) { return mkv_f16_to_f32(mkv_f32_to_f16(x)); }

static float *fill_nan(int64_t n)
{
    float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    cr_assert_not_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* Scratch of exactly `need` floats (NaN) followed by a guard that must survive. */
static float *scratch_new(int64_t need)
{
    float *s = fill_nan(need + GUARD);
    for (int i = 0; i < GUARD; i++) s[need + i] = GUARD_VALUE;
    return s;
}

static void scratch_check(const float *s, int64_t need, const char *ctx)
{
    for (int i = 0; i < GUARD; i++)
        cr_assert_eq(s[need + i], GUARD_VALUE, "%s: scratch overrun at guard %d", ctx, i);
}

/* ---- The float64 reference ------------------------------------------------------------- */

/* Attention of one query q[d] over n keys and values (row i at K + i * ld), in double:
 * probabilities p[n] and out[d]. */
static void ref_attend(int32_t n, int32_t d, const float *q, const float *K, const float *V,
                       int64_t ld, double scale, double *p, double *out)
{
    double m = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        double dot = 0.0;
        for (int32_t e = 0; e < d; e++) dot += (double)q[e] * (double)K[i * ld + e];
        p[i] = scale * dot;
        if (p[i] > m) m = p[i];
    }
    for (int32_t i = 0; i < n; i++) sum += (p[i] = exp(p[i] - m));
    for (int32_t e = 0; e < d; e++) out[e] = 0.0;
    for (int32_t i = 0; i < n; i++) {
        p[i] /= sum;
        for (int32_t e = 0; e < d; e++) out[e] += p[i] * (double)V[i * ld + e];
    }
}

/* ---- Decode fixture -------------------------------------------------------------------- */

typedef struct dcase {
    mkv_format_t hi, lo;
    int32_t d, G;
    int32_t groups[4];  /* elements per group: hi key, hi value, lo key, lo value (0: default) */
    int32_t tpp;        /* high tokens per page asked of mkv_page_bytes_for */
    int32_t n_hi, n_lo;
    uint64_t seed;
    const float *k_src, *v_src, *q_src; /* optional [n][d], [n][d], [G][d]; else random */
    int zero_scores;                      /* initial scores 0 instead of random */
} dcase_t;

typedef struct dfix {
    dcase_t c;
    char ctx[160];
    mkv_page_layout_t lay_hi, lay_lo;
    int64_t page_bytes, P;
    int32_t T, n;
    int32_t *row;               /* [T] */
    uint8_t *pool, *before;     /* [P * page_bytes], before: after the writes, before decode */
    int32_t *page_of, *slot_of; /* [n] where the test put each token (section order) */
    float *K0, *V0;             /* [n][d] inputs */
    float *Kq, *Vq;             /* [n][d] read back with mkv_quant_read_vector */
    float *score0;              /* [n] */
    float *q, *out;             /* [G][d] */
} dfix_t;

static const mkv_page_layout_t *dfix_lay(const dfix_t *f, int32_t t)
{
    return t < f->c.n_hi ? &f->lay_hi : &f->lay_lo;
}

static void dfix_build(dfix_t *f, const dcase_t *c)
{
    memset(f, 0, sizeof *f);
    f->c = *c;
    const int32_t d = c->d;
    tu_rng_t r = {c->seed};
    char err[512] = "";
    const int32_t *gr = c->groups;
    TU_OK(mkv_page_bytes_for(c->hi, d, gr[0], gr[1], c->tpp, &f->page_bytes));
    cr_assert_eq(mkv_page_layout(c->hi, d, gr[0], gr[1], f->page_bytes, &f->lay_hi, err),
                 MKV_STATUS_OK, "%s", err);
    cr_assert_eq(mkv_page_layout(c->lo, d, gr[2], gr[3], f->page_bytes, &f->lay_lo, err),
                 MKV_STATUS_OK, "%s", err);
    const int32_t tpp_hi = f->lay_hi.tokens, tpp_lo = f->lay_lo.tokens;
    const int32_t np_hi = (c->n_hi + tpp_hi - 1) / tpp_hi, np_lo = (c->n_lo + tpp_lo - 1) / tpp_lo;
    f->n = c->n_hi + c->n_lo;
    f->T = np_hi + np_lo + tu_rand_range(&r, 0, 2);
    f->P = f->T + tu_rand_range(&r, 1, 4); /* pages outside the row too */
    snprintf(f->ctx, sizeof f->ctx,
             "%s/%s d=%d G=%d groups=%d/%d,%d/%d tpp=%d/%d n=%d+%d T=%d seed=%llu",
             mkv_format_name(c->hi), mkv_format_name(c->lo), d, c->G, f->lay_hi.key.group_elems,
             f->lay_hi.value.group_elems, f->lay_lo.key.group_elems, f->lay_lo.value.group_elems,
             tpp_hi, tpp_lo,
             c->n_hi, c->n_lo, f->T, (unsigned long long)c->seed);

    /* A shuffled pool; the first used entry never holds its own index, so the row is never
     * the identity map. */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)f->P);
    f->row = malloc(sizeof(int32_t) * (size_t)(f->T + 1));
    cr_assert(perm && f->row);
    for (int32_t i = 0; i < f->P; i++) perm[i] = i;
    for (int32_t i = (int32_t)f->P - 1; i > 0; i--) {
        int32_t j = tu_rand_range(&r, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    if (f->P > 1 && perm[0] == (np_hi > 0 ? 0 : f->T - 1)) {
        const int32_t t = perm[0];
        perm[0] = perm[1], perm[1] = t;
    }
    for (int32_t e = 0; e < f->T; e++) f->row[e] = -1;
    for (int32_t e = 0; e < np_hi; e++) f->row[e] = perm[e];
    for (int32_t e = 0; e < np_lo; e++) f->row[f->T - 1 - e] = perm[np_hi + e];
    free(perm);

    const size_t pool_bytes = (size_t)(f->P * f->page_bytes);
    f->pool = malloc(pool_bytes);
    f->before = malloc(pool_bytes);
    cr_assert(f->pool && f->before);
    for (size_t b = 0; b < pool_bytes; b++) f->pool[b] = (uint8_t)(b * 131u + 0x5b);

    const size_t nd = (size_t)(f->n > 0 ? f->n : 1) * (size_t)d;
    f->K0 = malloc(sizeof(float) * nd), f->V0 = malloc(sizeof(float) * nd);
    f->Kq = malloc(sizeof(float) * nd), f->Vq = malloc(sizeof(float) * nd);
    f->score0 = malloc(sizeof(float) * (size_t)(f->n + 1));
    f->page_of = malloc(sizeof(int32_t) * (size_t)(f->n + 1));
    f->slot_of = malloc(sizeof(int32_t) * (size_t)(f->n + 1));
    f->q = malloc(sizeof(float) * (size_t)c->G * (size_t)d);
    f->out = fill_nan((int64_t)c->G * d);
    cr_assert(f->K0 && f->V0 && f->Kq && f->Vq && f->score0 && f->page_of && f->slot_of && f->q);

    for (int32_t t = 0; t < f->n; t++) {
        float *k = f->K0 + (size_t)t * d, *v = f->V0 + (size_t)t * d;
        if (c->k_src) {
            memcpy(k, c->k_src + (size_t)t * d, sizeof(float) * (size_t)d);
            memcpy(v, c->v_src + (size_t)t * d, sizeof(float) * (size_t)d);
        } else { /* per-token offset and spread, so groups differ in range */
            const float ko = frand(&r, -1, 1), ka = frand(&r, 0.2, 2);
            const float vo = frand(&r, -1, 1), va = frand(&r, 0.2, 2);
            for (int32_t e = 0; e < d; e++) k[e] = ko + ka * frand(&r, -1, 1);
            for (int32_t e = 0; e < d; e++) v[e] = vo + va * frand(&r, -1, 1);
        }
        f->score0[t] = c->zero_scores ? 0.0f : frand(&r, 0, 3);
        int32_t entry, slot;
        if (t < c->n_hi) {
            entry = t / tpp_hi, slot = t % tpp_hi;
        } else {
            entry = f->T - 1 - (t - c->n_hi) / tpp_lo, slot = (t - c->n_hi) % tpp_lo;
        }
        f->page_of[t] = f->row[entry], f->slot_of[t] = slot;
        uint8_t *page = f->pool + (int64_t)f->row[entry] * f->page_bytes;
        const mkv_page_layout_t *lay = dfix_lay(f, t);
        cr_assert_eq(mkv_page_write_token(page, lay, slot, k, v, f->score0[t],
                                          tu_rand_range(&r, 0, 100000)), 0);
        mkv_quant_read_vector(page, lay, 0, slot, f->Kq + (size_t)t * d);
        mkv_quant_read_vector(page, lay, 1, slot, f->Vq + (size_t)t * d);
    }
    for (int32_t i = 0; i < c->G * d; i++) f->q[i] = c->q_src ? c->q_src[i] : frand(&r, -3, 3);
    memcpy(f->before, f->pool, pool_bytes);
}

static double dfix_scale(const dfix_t *f) { return 1.0 / sqrt((double)f->c.d); }

static void dfix_run(dfix_t *f)
{
    const mkv_region_pages_t reg = {
        .pool = f->pool, .page_bytes = f->page_bytes, .lay_hi = &f->lay_hi,
        .lay_lo = &f->lay_lo, .row = f->row, .row_entries = f->T, .n_hi = f->c.n_hi,
        .n_lo = f->c.n_lo};
    const int64_t need = (int64_t)f->c.G * f->n + 2 * f->c.d;
    float *scratch = scratch_new(need);
    mkv_attn_decode_region(&reg, f->c.G, f->c.d, f->q, (float)dfix_scale(f), f->out, scratch);
    scratch_check(scratch, need, f->ctx);
    free(scratch);
}

static float dfix_score(const dfix_t *f, int32_t t)
{
    float s;
    const uint8_t *page = f->pool + (int64_t)f->page_of[t] * f->page_bytes;
    memcpy(&s, page + mkv_score_offset(dfix_lay(f, t), f->slot_of[t]), sizeof s);
    return s;
}

/* out against float64 attention over K, V; with ck_score, also every token's new score, and
 * that nothing but those scores changed in the pool. */
static void dfix_check(const dfix_t *f, const float *K, const float *V, double tol_abs,
                       double tol_rel, checker_t *ck_out, checker_t *ck_score)
{
    const int32_t n = f->n, d = f->c.d;
    double *p = malloc(sizeof(double) * (size_t)n), *pmax = calloc((size_t)n, sizeof(double));
    double *want = malloc(sizeof(double) * (size_t)d);
    cr_assert(p && pmax && want);
    for (int32_t g = 0; g < f->c.G; g++) {
        ref_attend(n, d, f->q + (size_t)g * d, K, V, d, dfix_scale(f), p, want);
        for (int32_t e = 0; e < d; e++)
            check_close(ck_out, f->ctx, g, e, f->out[(size_t)g * d + e], want[e], tol_abs, tol_rel);
        for (int32_t t = 0; t < n; t++) pmax[t] = p[t] > pmax[t] ? p[t] : pmax[t];
    }
    if (ck_score) {
        for (int32_t t = 0; t < n; t++)
            check_close(ck_score, f->ctx, t, 0, dfix_score(f, t), (double)f->score0[t] + pmax[t],
                        TOL_SCORE, 0.0);
        /* Put the old scores back; then the pool must equal its state before the call. */
        uint8_t *copy = malloc((size_t)(f->P * f->page_bytes));
        cr_assert_not_null(copy);
        memcpy(copy, f->pool, (size_t)(f->P * f->page_bytes));
        for (int32_t t = 0; t < n; t++) {
            const int64_t at = (int64_t)f->page_of[t] * f->page_bytes +
                               mkv_score_offset(dfix_lay(f, t), f->slot_of[t]);
            memcpy(copy + at, f->before + at, 4);
        }
        for (int64_t b = 0; b < f->P * f->page_bytes; b++)
            cr_assert_eq(copy[b], f->before[b], "%s: pool byte %lld (page %lld, offset %lld) "
                         "changed from %d to %d", f->ctx, (long long)b,
                         (long long)(b / f->page_bytes), (long long)(b % f->page_bytes),
                         f->before[b], copy[b]);
        free(copy);
    }
    free(p), free(pmax), free(want);
}

static void dfix_free(dfix_t *f)
{
    free(f->row), free(f->pool), free(f->before), free(f->page_of), free(f->slot_of);
    free(f->K0), free(f->V0), free(f->Kq), free(f->Vq), free(f->score0), free(f->q), free(f->out);
}

/* ---- Decode tests ---------------------------------------------------------------------- */

/* Every format appears at least once, on either side. */
static const mkv_format_t k_pairs[][2] = {
    {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2},   {MKV_FORMAT_K16V16, MKV_FORMAT_K16V16},
    {MKV_FORMAT_K8V8, MKV_FORMAT_K4V4},   {MKV_FORMAT_K4V8, MKV_FORMAT_K2V4},
    {MKV_FORMAT_K16V16, MKV_FORMAT_K8V2}, {MKV_FORMAT_K8V8, MKV_FORMAT_K8V4},
};
#define N_PAIRS ((int)(sizeof k_pairs / sizeof k_pairs[0]))
static const int32_t k_dims[] = {16, 32, 64, 128, 256};
static const int32_t k_heads[] = {1, 2, 4, 8};

/* Section lengths in pages and leftover tokens of each section (n = pages * tpp + extra; a
 * negative extra is a partly filled last page); pages < 0: random length up to 3 pages. */
static const int32_t k_lengths[][4] = {
    {0, 1, 0, 0}, {0, 0, 0, 1}, {2, 1, 1, 2}, {1, -1, 2, -1}, {3, 0, 0, 0}, {-1, 0, -1, 0},
};
#define N_LENGTHS ((int)(sizeof k_lengths / sizeof k_lengths[0]))

/* Tokens per page of format fmt (groups g[0..1] for the high format, g[2..3] for the low one)
 * in the page that holds tpp high tokens. */
static int32_t tpp_of(mkv_format_t fmt, int lo, mkv_format_t hi, int32_t d, const int32_t *g,
                      int32_t tpp)
{
    int64_t bytes;
    int32_t tokens;
    TU_OK(mkv_page_bytes_for(hi, d, g[0], g[1], tpp, &bytes));
    TU_OK(mkv_tokens_per_page(fmt, d, g[2 * lo], g[2 * lo + 1], bytes, &tokens));
    return tokens;
}

/* Per-side group choices (elements; 0: the default): one group everywhere, 16 everywhere
 * (at 2 bits a quarter of a 16-byte chunk; 16 groups at d 256), mixed sides, the defaults. */
static const int32_t k_side_groups[][4] = {
    {256, 256, 256, 256}, {16, 16, 16, 16}, {128, 32, 64, 16}, {32, 16, 16, 32}, {0, 0, 0, 0},
};
#define N_SIDE_GROUPS ((int)(sizeof k_side_groups / sizeof k_side_groups[0]))

static void set_groups(dcase_t *c, int i) { memcpy(c->groups, k_side_groups[i], sizeof c->groups); }

/* Runs one decode case for every length pattern; returns through the checkers. */
static void decode_lengths(dcase_t c, tu_rng_t *r, checker_t *ck_out, checker_t *ck_score)
{
    const int32_t th = tpp_of(c.hi, 0, c.hi, c.d, c.groups, c.tpp);
    const int32_t tl = tpp_of(c.lo, 1, c.hi, c.d, c.groups, c.tpp);
    for (int l = 0; l < N_LENGTHS; l++) {
        const int32_t *s = k_lengths[l];
        c.n_hi = s[0] < 0 ? tu_rand_range(r, 0, 3 * th) : s[0] * th + s[1];
        c.n_lo = s[2] < 0 ? tu_rand_range(r, 0, 3 * tl) : s[2] * tl + s[3];
        if (c.n_hi < 0) c.n_hi = 0;
        if (c.n_lo < 0) c.n_lo = 0;
        if (c.n_hi + c.n_lo == 0) c.n_hi = 1;
        c.seed = tu_rand(r);
        dfix_t f;
        dfix_build(&f, &c);
        dfix_run(&f);
        dfix_check(&f, f.Kq, f.Vq, TOL_ABS, TOL_REL, ck_out, ck_score);
        dfix_free(&f);
    }
}

Test(attention, decode_formats)
{
    static const int32_t tpps[] = {3, 8, 32};
    tu_rng_t r = {101};
    checker_t ck_out = {.what = "out"}, ck_score = {.what = "score"};
    int k = 0;
    for (int pr = 0; pr < N_PAIRS; pr++)
        for (int di = 0; di < 5; di++)
            for (int gi = 0; gi < 4; gi++, k++) {
                dcase_t c = {.hi = k_pairs[pr][0], .lo = k_pairs[pr][1], .d = k_dims[di],
                             .G = k_heads[gi], .tpp = tpps[k % 3]};
                set_groups(&c, k % N_SIDE_GROUPS);
                decode_lengths(c, &r, &ck_out, &ck_score);
            }
    expect_clean(&ck_out, "decode_formats");
    expect_clean(&ck_score, "decode_formats");
}

Test(attention, decode_one_token_pages)
{
    tu_rng_t r = {202};
    checker_t ck_out = {.what = "out"}, ck_score = {.what = "score"};
    for (int pr = 0; pr < N_PAIRS; pr++)
        for (int gi = 0; gi < 3; gi++) {
            dcase_t c = {.hi = k_pairs[pr][0], .lo = k_pairs[pr][1], .d = gi == 2 ? 128 : 16,
                         .G = gi == 1 ? 4 : 1, .tpp = 1};
            set_groups(&c, gi == 0 ? 0 : gi == 1 ? 4 : 2);
            decode_lengths(c, &r, &ck_out, &ck_score);
        }
    expect_clean(&ck_out, "decode_one_token_pages");
    expect_clean(&ck_score, "decode_one_token_pages");
}

Test(attention, decode_empty_region_does_nothing)
{
    const dcase_t c = {.hi = MKV_FORMAT_K8V4, .lo = MKV_FORMAT_K4V2, .d = 32, .G = 2,
                       .tpp = 4, .seed = 7};
    dfix_t f;
    dfix_build(&f, &c);
    dfix_run(&f);
    for (int32_t i = 0; i < c.G * c.d; i++)
        cr_assert(isnan(f.out[i]), "out[%d] written (%g) for an empty region", i, f.out[i]);
    cr_assert_eq(memcmp(f.pool, f.before, (size_t)(f.P * f.page_bytes)), 0, "pool changed");
    dfix_free(&f);
}

/* With K and V rounded to fp16 (relative error <= u = 2^-11 per element), each logit moves by
 * at most delta = scale * u * sum_e |q_e| * max|k_e|, each probability by a factor within
 * e^(+-2 delta), so out moves by at most max|v| * (u + e^(2 delta) - 1). */
static double absmax(const float *x, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

static double fp16_bound(const dfix_t *f, int32_t g)
{
    const double u = 0x1p-11;
    double qsum = 0.0;
    for (int32_t e = 0; e < f->c.d; e++) qsum += fabs(f->q[(size_t)g * f->c.d + e]);
    const double delta = dfix_scale(f) * u * qsum * absmax(f->K0, (int64_t)f->n * f->c.d);
    return absmax(f->V0, (int64_t)f->n * f->c.d) * (u + expm1(2.0 * delta));
}

Test(attention, decode_k16v16_is_exact_up_to_fp16_rounding)
{
    tu_rng_t r = {303};
    checker_t ck_round = {.what = "out vs fp16-rounded K/V"};
    checker_t ck_raw = {.what = "out vs fp32 K/V"}, ck_score = {.what = "score"};
    double worst_ratio = 0.0, worst_rel = 0.0; /* error / fp16_bound, error / max|v| */
    for (int di = 0; di < 5; di++)
        for (int gi = 0; gi < 4; gi++) {
            const dcase_t c = {.hi = MKV_FORMAT_K16V16, .lo = MKV_FORMAT_K16V16, .d = k_dims[di],
                               .G = k_heads[gi], .tpp = 5,
                               .n_hi = tu_rand_range(&r, 1, 23), .n_lo = tu_rand_range(&r, 0, 17),
                               .seed = tu_rand(&r)};
            dfix_t f;
            dfix_build(&f, &c);
            const int64_t nd = (int64_t)f.n * c.d;
            float *Kr = malloc(sizeof(float) * (size_t)nd);
            float *Vr = malloc(sizeof(float) * (size_t)nd);
            cr_assert(Kr && Vr);
            for (int64_t i = 0; i < nd; i++) {
                Kr[i] = round_f16(f.K0[i]), Vr[i] = round_f16(f.V0[i]);
                cr_assert(Kr[i] == f.Kq[i] && Vr[i] == f.Vq[i], "%s: K16V16 element %lld reads "
                          "back as %g/%g, not fp16(%g/%g)", f.ctx, (long long)i, f.Kq[i], f.Vq[i],
                          f.K0[i], f.V0[i]);
            }
            dfix_run(&f);
            dfix_check(&f, Kr, Vr, TOL_ABS, TOL_REL, &ck_round, &ck_score);
            /* Against the unrounded inputs, one query head at a time with its own bound. */
            double *p = malloc(sizeof(double) * (size_t)f.n);
            double *want = malloc(sizeof(double) * (size_t)c.d);
            cr_assert(p && want);
            const double vmax = absmax(f.V0, nd);
            for (int32_t g = 0; g < c.G; g++) {
                const double bound = fp16_bound(&f, g);
                ref_attend(f.n, c.d, f.q + (size_t)g * c.d, f.K0, f.V0, c.d, dfix_scale(&f), p,
                           want);
                for (int32_t e = 0; e < c.d; e++) {
                    const double got = f.out[(size_t)g * c.d + e];
                    check_close(&ck_raw, f.ctx, g, e, got, want[e], bound + TOL_ABS, TOL_REL);
                    worst_ratio = fmax(worst_ratio, fabs(got - want[e]) / (bound + TOL_ABS));
                    worst_rel = fmax(worst_rel, fabs(got - want[e]) / vmax);
                }
            }
            free(p), free(want), free(Kr), free(Vr);
            dfix_free(&f);
        }
    cr_log_info("decode_k16v16: worst error / fp16 bound = %.3g, / max|v| = %.3g", worst_ratio,
                worst_rel);
    cr_assert_lt(worst_rel, TOL_FP16_REL, "K16V16 vs fp32 K/V: error %.3g of max|v|", worst_rel);
    expect_clean(&ck_round, "decode_k16v16");
    expect_clean(&ck_raw, "decode_k16v16");
    expect_clean(&ck_score, "decode_k16v16");
}

/* ---- Prefill --------------------------------------------------------------------------- */

typedef struct prun {
    int32_t n, H, G, d, obs;
    float *q, *k, *v;  /* [n][H*G][d], [n][H][d], [n][H][d] */
    float *out, *sig;  /* [n][H*G][d], [H][n] */
    char ctx[96];
} prun_t;

static void prun_make(prun_t *p, int32_t n, int32_t H, int32_t G, int32_t d, int32_t obs,
                      tu_rng_t *r)
{
    *p = (prun_t){.n = n, .H = H, .G = G, .d = d, .obs = obs};
    snprintf(p->ctx, sizeof p->ctx, "prefill n=%d H=%d G=%d d=%d obs=%d", n, H, G, d, obs);
    const int64_t nq = (int64_t)n * H * G * d, nkv = (int64_t)n * H * d;
    p->q = malloc(sizeof(float) * (size_t)nq);
    p->k = malloc(sizeof(float) * (size_t)nkv);
    p->v = malloc(sizeof(float) * (size_t)nkv);
    cr_assert(p->q && p->k && p->v);
    for (int64_t i = 0; i < nq; i++) p->q[i] = frand(r, -3, 3);
    for (int64_t i = 0; i < nkv; i++) p->k[i] = frand(r, -1.5, 1.5), p->v[i] = frand(r, -2, 2);
    p->out = fill_nan(nq);
    p->sig = fill_nan((int64_t)H * n);
}

static void prun_run(prun_t *p)
{
    const int64_t need = 2 * (int64_t)p->n; /* attention.h: at least 2 * n floats */
    float *scratch = scratch_new(need);
    mkv_attn_prefill(p->n, p->H, p->G, p->d, p->q, p->k, p->v, (float)(1.0 / sqrt((double)p->d)),
                     p->obs, p->out, p->sig, scratch);
    scratch_check(scratch, need, p->ctx);
    free(scratch);
}

static void prun_free(prun_t *p) { free(p->q), free(p->k), free(p->v), free(p->out), free(p->sig); }

/* Causal float64 attention, query head by query head, and the significance sums. */
static void prun_check(const prun_t *p, checker_t *ck_out, checker_t *ck_sig)
{
    const int32_t n = p->n, H = p->H, G = p->G, d = p->d;
    double *pr = malloc(sizeof(double) * (size_t)n), *pmax = malloc(sizeof(double) * (size_t)n);
    double *want = malloc(sizeof(double) * (size_t)d), *sig = calloc((size_t)n, sizeof(double));
    cr_assert(pr && pmax && want && sig);
    for (int32_t h = 0; h < H; h++) {
        memset(sig, 0, sizeof(double) * (size_t)n);
        for (int32_t j = 0; j < n; j++) {
            for (int32_t i = 0; i <= j; i++) pmax[i] = 0.0;
            for (int32_t g = 0; g < G; g++) {
                const int64_t row = ((int64_t)j * H * G + (int64_t)h * G + g) * d;
                ref_attend(j + 1, d, p->q + row, p->k + (int64_t)h * d, p->v + (int64_t)h * d,
                           (int64_t)H * d, 1.0 / sqrt((double)d), pr, want);
                for (int32_t e = 0; e < d; e++)
                    check_close(ck_out, p->ctx, j, (int64_t)(h * G + g) * d + e, p->out[row + e],
                                want[e], TOL_ABS, TOL_REL);
                for (int32_t i = 0; i <= j; i++) pmax[i] = fmax(pmax[i], pr[i]);
            }
            if (p->obs <= 0 || j >= n - p->obs)
                for (int32_t i = 0; i <= j; i++) sig[i] += pmax[i];
        }
        for (int32_t i = 0; i < n; i++)
            check_close(ck_sig, p->ctx, h, i, p->sig[(int64_t)h * n + i], sig[i], TOL_SIG, TOL_SIG);
    }
    free(pr), free(pmax), free(want), free(sig);
}

Test(attention, prefill_random)
{
    static const int32_t ns[] = {1, 2, 7, 33, 100};
    static const int32_t shapes[][3] = {{1, 1, 16}, {2, 4, 32}, {3, 2, 64}, {1, 8, 128},
                                        {2, 1, 256}};
    tu_rng_t r = {404};
    checker_t ck_out = {.what = "out"}, ck_sig = {.what = "sig_sum"};
    for (int ni = 0; ni < 5; ni++)
        for (int si = 0; si < 5; si++) {
            const int32_t obs[] = {0, 1, 5, ns[ni] + 3};
            for (int oi = 0; oi < 4; oi++) {
                prun_t p;
                prun_make(&p, ns[ni], shapes[si][0], shapes[si][1], shapes[si][2], obs[oi], &r);
                prun_run(&p);
                prun_check(&p, &ck_out, &ck_sig);
                prun_free(&p);
            }
        }
    expect_clean(&ck_out, "prefill_random");
    expect_clean(&ck_sig, "prefill_random");
}

/* Each query's probabilities sum to 1: with G = 1 the sig sums of a head add up to the number
 * of observing queries; with G > 1 the max over the group lies between that and G times it. */
Test(attention, prefill_sig_sums_count_observers)
{
    tu_rng_t r = {505};
    double worst = 0.0;
    for (int32_t G = 1; G <= 4; G *= 2)
        for (int32_t n = 1; n <= 129; n += 16)
            for (int32_t obs = 0; obs <= n + 1; obs += n / 3 + 1) {
                prun_t p;
                prun_make(&p, n, 2, G, 32, obs, &r);
                prun_run(&p);
                const double observers = obs > 0 && obs < n ? obs : n;
                for (int32_t h = 0; h < p.H; h++) {
                    double sum = 0.0;
                    for (int32_t i = 0; i < n; i++) sum += p.sig[(int64_t)h * n + i];
                    const double tol = 1e-6 * observers;
                    if (G == 1) {
                        worst = fmax(worst, fabs(sum - observers));
                        cr_assert(fabs(sum - observers) <= tol, "%s h=%d: sig sum %.9g, want %g",
                                  p.ctx, h, sum, observers);
                    } else {
                        cr_assert(sum >= observers - tol && sum <= G * observers + tol,
                                  "%s h=%d: sig sum %.9g outside [%g, %g]", p.ctx, h, sum,
                                  observers, G * observers);
                    }
                }
                prun_free(&p);
            }
    cr_log_info("prefill_sig_sums: G=1 worst |sum - observers| = %.3g", worst);
}

/* The last row of a prefill equals a decode of the last query over K16V16 pages holding the
 * same (fp16-rounded) sequence; with obs_window = 1 prefill's sig_sum is that one query's
 * max-over-group probabilities, which decode adds to zero-initialised scores. */
Test(attention, decode_matches_last_prefill_row)
{
    tu_rng_t r = {606};
    checker_t ck_out = {.what = "decode out vs prefill"};
    checker_t ck_score = {.what = "decode score vs prefill sig"};
    static const int32_t ns[] = {1, 2, 7, 33, 100};
    for (int ni = 0; ni < 5; ni++) {
        const int32_t n = ns[ni], H = 2, G = 4, d = 64;
        prun_t p;
        prun_make(&p, n, H, G, d, 1, &r);
        for (int64_t i = 0; i < (int64_t)n * H * d; i++)
            p.k[i] = round_f16(p.k[i]), p.v[i] = round_f16(p.v[i]);
        prun_run(&p);
        float *kh = malloc(sizeof(float) * (size_t)n * d);
        float *vh = malloc(sizeof(float) * (size_t)n * d);
        cr_assert(kh && vh);
        for (int32_t h = 0; h < H; h++) {
            for (int32_t i = 0; i < n; i++) {
                memcpy(kh + (size_t)i * d, p.k + ((int64_t)i * H + h) * d, sizeof(float) * d);
                memcpy(vh + (size_t)i * d, p.v + ((int64_t)i * H + h) * d, sizeof(float) * d);
            }
            const int32_t n_hi = tu_rand_range(&r, 1, n);
            const dcase_t c = {.hi = MKV_FORMAT_K16V16, .lo = MKV_FORMAT_K16V16, .d = d, .G = G,
                               .tpp = 6, .n_hi = n_hi, .n_lo = n - n_hi,
                               .seed = tu_rand(&r), .k_src = kh, .v_src = vh,
                               .q_src = p.q + ((int64_t)(n - 1) * H * G + (int64_t)h * G) * d,
                               .zero_scores = 1};
            dfix_t f;
            dfix_build(&f, &c);
            dfix_run(&f);
            for (int32_t g = 0; g < G; g++)
                for (int32_t e = 0; e < d; e++) {
                    const int64_t at = ((int64_t)(n - 1) * H * G + (int64_t)h * G + g) * d + e;
                    /* Bit for bit: prefill follows decode's operation order (attention.h). */
                    check_close(&ck_out, f.ctx, g, e, f.out[(size_t)g * d + e], p.out[at], 0.0, 0.0);
                }
            for (int32_t t = 0; t < n; t++)
                check_close(&ck_score, f.ctx, t, 0, dfix_score(&f, t), p.sig[(int64_t)h * n + t],
                            0.0, 0.0);
            dfix_free(&f);
        }
        free(kh), free(vh);
        prun_free(&p);
    }
    expect_clean(&ck_out, "decode_matches_prefill");
    expect_clean(&ck_score, "decode_matches_prefill");
}

/* ---- The batched decode (attention/decode_cpu.c) ---------------------------------------- */

/* A runner that cuts [0, n) into uneven pieces, runs them last first and names three parts,
 * so that no item may depend on another of the same phase. */
static void scrambled_run(void *runner, mkv_attn_range_fn fn, void *ctx, int64_t n)
{
    (void)runner;
    const int64_t cut[3] = {n / 5, n / 2, n};
    fn(ctx, cut[1], cut[2], 2);
    fn(ctx, cut[0], cut[1], 0);
    fn(ctx, 0, cut[0], 1);
}

/* R head-regions of one shape (including an empty one and one of several 256-token blocks)
 * through mkv_attn_decode_batch and, one by one, through mkv_attn_decode_region: outputs and
 * pools must be equal byte for byte. */
static void batch_case(dcase_t c, tu_rng_t *r, const char *what)
{
    enum { R = 5 };
    dfix_t f[R];
    const int32_t G = c.G, d = c.d;
    const int32_t th = tpp_of(c.hi, 0, c.hi, d, c.groups, c.tpp);
    const int32_t tl = tpp_of(c.lo, 1, c.hi, d, c.groups, c.tpp);
    mkv_region_pages_t reg[R];
    uint8_t *pool2[R];
    float *q = malloc(sizeof(float) * R * G * d), *out = fill_nan((int64_t)R * G * d);
    cr_assert_not_null(q);
    for (int i = 0; i < R; i++) {
        switch (i) {
        case 0: c.n_hi = 0, c.n_lo = 0; break;                                /* empty */
        case 1: c.n_hi = 1, c.n_lo = 0; break;
        case 2: c.n_hi = 600 + tu_rand_range(r, 0, th), c.n_lo = 150 + tu_rand_range(r, 0, tl); break;
        case 3: c.n_hi = 0, c.n_lo = tu_rand_range(r, 1, 3 * tl); break;      /* low only */
        default: c.n_hi = tu_rand_range(r, 1, 300), c.n_lo = tu_rand_range(r, 0, 300); break;
        }
        c.seed = tu_rand(r);
        dfix_build(&f[i], &c);
        const size_t bytes = (size_t)(f[i].P * f[i].page_bytes);
        pool2[i] = malloc(bytes);
        cr_assert_not_null(pool2[i]);
        memcpy(pool2[i], f[i].before, bytes);
        reg[i] = (mkv_region_pages_t){.pool = pool2[i], .page_bytes = f[i].page_bytes,
                                      .lay_hi = &f[i].lay_hi, .lay_lo = &f[i].lay_lo,
                                      .row = f[i].row, .row_entries = f[i].T,
                                      .n_hi = f[i].c.n_hi, .n_lo = f[i].c.n_lo};
        memcpy(q + (size_t)i * G * d, f[i].q, sizeof(float) * (size_t)G * d);
        dfix_run(&f[i]);
    }
    const float scale = (float)dfix_scale(&f[0]);
    for (int serial = 0; serial < 2; serial++) {
        const int32_t parts = serial ? 1 : 3;
        const int64_t need = mkv_attn_decode_batch_scratch(reg, R, G, d, parts);
        float *scratch = scratch_new(need);
        if (serial) { /* again from the untouched pools */
            for (int i = 0; i < R; i++)
                memcpy(pool2[i], f[i].before, (size_t)(f[i].P * f[i].page_bytes));
            for (int64_t k = 0; k < (int64_t)R * G * d; k++) out[k] = NAN;
        }
        mkv_attn_decode_batch(reg, R, G, d, q, scale, out, scratch, parts,
                              serial ? NULL : scrambled_run, NULL);
        scratch_check(scratch, need, f[0].ctx);
        free(scratch);
        for (int i = 0; i < R; i++) {
            cr_assert_eq(memcmp(out + (size_t)i * G * d, f[i].out, sizeof(float) * (size_t)G * d), 0,
                         "%s %s: region %d (n %d): outputs differ from the reference (%s)", what,
                         f[i].ctx, i, f[i].n, serial ? "serial" : "split");
            cr_assert_eq(memcmp(pool2[i], f[i].pool, (size_t)(f[i].P * f[i].page_bytes)), 0,
                         "%s %s: region %d: pool (scores) differs from the reference (%s)", what,
                         f[i].ctx, i, serial ? "serial" : "split");
        }
    }
    for (int i = 0; i < R; i++) free(pool2[i]), dfix_free(&f[i]);
    free(q), free(out);
}

Test(attention, decode_batch_is_bitwise_reference)
{
    static const int32_t dims[] = {16, 64, 128};
    static const int32_t heads[] = {1, 3, 9};
    tu_rng_t r = {707};
    int k = 0;
    for (int pr = 0; pr < N_PAIRS; pr++)
        for (int di = 0; di < 3; di++, k++) {
            dcase_t c = {.hi = k_pairs[pr][0], .lo = k_pairs[pr][1], .d = dims[di],
                         .G = heads[k % 3], .tpp = k % 2 ? 32 : 7};
            set_groups(&c, k % N_SIDE_GROUPS);
            batch_case(c, &r, "decode_batch");
        }
}
