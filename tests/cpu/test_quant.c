/*
 * test_quant.c — the reference quantizer (quant/quant.h) and the page layout it writes
 * (quant/format.h): fp16 conversions against a slow double-precision reference, per-group
 * quantization against independently computed directed roundings, round trips through pages
 * of every format, determinism, ties, non-finite input, copy, demotion, and the default pages'
 * byte offsets computed by hand.
 *
 * The references here never call the code under test for the values they predict: fp16 values
 * come from ldexp/frexp, the zero and scale from a sorted table of every finite half, codes are
 * unpacked with format.h's element rule (chunk i / chunk_elems, bit (i % chunk_elems) * bits).
 */
#include "quant/format.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) cr_assert_fail(__VA_ARGS__);                                              \
    } while (0)

static const int32_t k_dims[] = {16, 32, 64, 128, 256};
/* Elements per group, key and value (0: the default): one group, groups smaller than a chunk
 * (16 elements at 2 bits are 4 bytes), mixed sides, and the defaults. */
static const int32_t k_groups[][2] = {{256, 256}, {16, 32}, {32, 16}, {64, 128}, {16, 16}, {0, 0}};
#define N_GROUPS ((int)(sizeof k_groups / sizeof k_groups[0]))

/* ---------------------------------------------------------------------------------------- */
/* Slow fp16 reference                                                                       */
/* ---------------------------------------------------------------------------------------- */

static double ref_f16_value(uint16_t h)
{
    const int e = (h >> 10) & 31, mant = h & 1023;
    double v;
    if (e == 31) v = mant ? NAN : INFINITY;
    else if (e == 0) v = ldexp(mant, -24);
    else v = ldexp(1024 + mant, e - 25);
    return (h & 0x8000) ? -v : v;
}

static int is_f16_nan(uint16_t h) { return ((h >> 10) & 31) == 31 && (h & 1023) != 0; }

/* The value binary16 round-to-nearest-even gives for f (signed zero and infinities kept). */
static double ref_round_f16(float f)
{
    if (isnan(f)) return NAN;
    const double a = fabs((double)f);
    if (a >= 65520.0) return copysign(INFINITY, f);
    if (a == 0.0) return copysign(0.0, f);
    int e;
    frexp(a, &e); /* a = m * 2^e, m in [0.5, 1): the binade's exponent is e - 1 */
    const double ulp = e - 1 < -14 ? ldexp(1.0, -24) : ldexp(1.0, e - 1 - 10);
    const double t = a / ulp, fl = floor(t), fr = t - fl;
    double r = fl;
    if (fr > 0.5 || (fr == 0.5 && fmod(fl, 2.0) != 0.0)) r = fl + 1.0;
    return copysign(r * ulp, f);
}

static void expect_f16_rounds(float f)
{
    const uint16_t h = mkv_f32_to_f16(f);
    const double got = ref_f16_value(h), want = ref_round_f16(f);
    if (isnan(want)) {
        CHECK(is_f16_nan(h), "f32_to_f16(NaN 0x%08x) = 0x%04x, not NaN", mkv_f32_bits(f), h);
        return;
    }
    CHECK(got == want && !signbit(got) == !signbit(want),
          "f32_to_f16(%.9g = 0x%08x) = 0x%04x (%.9g), expected %.9g", f, mkv_f32_bits(f), h, got,
          want);
}

/* All finite fp16 values, sorted, -0 left out: the oracle for directed roundings. */
static double g_halves[65536];
static int g_n_halves;

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void halves_init(void)
{
    if (g_n_halves) return;
    for (int h = 0; h < 65536; h++) {
        if (((h >> 10) & 31) == 31 || h == 0x8000) continue;
        g_halves[g_n_halves++] = ref_f16_value((uint16_t)h);
    }
    qsort(g_halves, (size_t)g_n_halves, sizeof g_halves[0], cmp_double);
}

/* The largest fp16 <= v. */
static double half_floor(double v)
{
    int lo = 0, hi = g_n_halves - 1; /* invariant: g_halves[lo] <= v (v >= -65504) */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (g_halves[mid] <= v) lo = mid;
        else hi = mid - 1;
    }
    return g_halves[lo];
}

/* The smallest fp16 s > 0 with zero + m * s >= hi (exact in double: all terms are multiples
 * of 2^-149 within a 2^53 range here). */
static double half_scale(double zero, double hi, int m)
{
    int lo = 0, top = g_n_halves - 1;
    while (lo < top) {
        const int mid = (lo + top) / 2;
        if (g_halves[mid] > 0.0 && zero + m * g_halves[mid] >= hi) top = mid;
        else lo = mid + 1;
    }
    return g_halves[lo];
}

/* ---------------------------------------------------------------------------------------- */
/* Random inputs                                                                             */
/* ---------------------------------------------------------------------------------------- */

static double urand(tu_rng_t *r) { return (double)(tu_rand(r) >> 11) * (1.0 / 9007199254740992.0); }

static float frange(tu_rng_t *r, double a, double b) { return (float)(a + (b - a) * urand(r)); }

/* n elements of one of several shapes of group: ordinary, tiny, huge, negative, a small spread
 * at a large offset (where the fp16 zero is coarse), fp16-subnormal, near fp16's maximum,
 * constant, two values, small integers. */
static void random_group(tu_rng_t *r, float *x, int32_t n)
{
    const int kind = tu_rand_range(r, 0, 9);
    const float c = frange(r, -1000.0, 1000.0);
    for (int32_t i = 0; i < n; i++) {
        switch (kind) {
        case 0: x[i] = frange(r, -1.0, 1.0); break;
        case 1: x[i] = (float)(c * 1e-6) + frange(r, 0.0, 1e-6); break;
        case 2: x[i] = frange(r, -6e4, 6e4); break;
        case 3: x[i] = frange(r, -100.0, -0.01); break;
        case 4: x[i] = 1000.0f + frange(r, 0.0, 0.01); break;
        case 5: x[i] = frange(r, -1e-6, 1e-6); break;
        case 6: x[i] = frange(r, 65000.0, 65504.0); break;
        case 7: x[i] = c; break;
        case 8: x[i] = (tu_rand(r) & 1) ? c : -c * 0.5f; break;
        default: x[i] = (float)tu_rand_range(r, -7, 7); break;
        }
    }
}

/* A key or value vector: per group a random magnitude 10^[-3, 3], sometimes an outlier. */
static void random_vector(tu_rng_t *r, float *x, int32_t d)
{
    const double mag = pow(10.0, frange(r, -3.0, 3.0));
    for (int32_t i = 0; i < d; i++) {
        x[i] = (float)(mag * (2.0 * urand(r) - 1.0));
        if (tu_rand_range(r, 0, 63) == 0) x[i] *= 40.0f;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Group checks                                                                              */
/* ---------------------------------------------------------------------------------------- */

static float sanitised(float v)
{
    if (isnan(v)) return 0.0f;
    if (v > 65504.0f) return 65504.0f;
    if (v < -65504.0f) return -65504.0f;
    return v;
}

/* fp32 rounding slack of one element's round trip: a few roundings of terms no larger than
 * the element, the zero and the grid's span. */
static double slack(double maxabs, double zero, double scale, int m)
{
    return 4e-7 * (maxabs + fabs(zero) + m * scale) + 1e-30;
}

/* Quantizes x[n] at bits and checks everything the contract promises about the result. */
static void check_group(const float *x, int32_t n, int32_t bits, const char *what)
{
    uint16_t scale = 0xffff, zero = 0xffff;
    uint8_t codes[256];
    float out[256];
    const int m = (1 << bits) - 1;
    int32_t bad = 0;
    double lo = INFINITY, hi = -INFINITY, maxabs = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const float s = sanitised(x[i]);
        bad += s != x[i] || isnan(x[i]);
        lo = fmin(lo, s);
        hi = fmax(hi, s);
        maxabs = fmax(maxabs, fabs(s));
    }
    const int32_t got_bad = mkv_quant_group(x, n, bits, &scale, &zero, codes);
    CHECK(got_bad == bad, "%s: %d sanitised, expected %d", what, got_bad, bad);
    const double zf = ref_f16_value(zero), sf = ref_f16_value(scale);
    CHECK(isfinite(zf) && isfinite(sf) && sf >= 0.0, "%s: scale 0x%04x zero 0x%04x", what, scale,
          zero);
    for (int32_t i = 0; i < n; i++) CHECK(codes[i] <= m, "%s: code %d of %d", what, codes[i], i);
    mkv_dequant_group(codes, n, scale, zero, out);
    if (lo == hi) {
        CHECK(scale == 0 && zf == ref_round_f16((float)lo),
              "%s: constant %.9g stored scale %.9g zero %.9g", what, lo, sf, zf);
        for (int32_t i = 0; i < n; i++)
            CHECK(codes[i] == 0 && out[i] == zf, "%s: constant decodes to %.9g", what, out[i]);
        return;
    }
    /* The directed roundings, exactly: zero the largest fp16 <= lo, scale the smallest fp16
     * whose grid reaches hi (coverage, and nothing coarser). */
    CHECK(zf == half_floor(lo), "%s: lo %.9g zero %.9g, expected %.9g", what, lo, zf,
          half_floor(lo));
    CHECK(sf == half_scale(zf, hi, m), "%s: lo %.9g hi %.9g zero %.9g scale %.9g, expected %.9g",
          what, lo, hi, zf, sf, half_scale(zf, hi, m));
    CHECK(zf <= lo && zf + m * sf >= hi, "%s: grid [%.9g, %.9g] misses [%.9g, %.9g]", what, zf,
          zf + m * sf, lo, hi);
    const double tol = sf / 2 + slack(maxabs, zf, sf, m);
    for (int32_t i = 0; i < n; i++) {
        const float s = sanitised(x[i]);
        float q = nearbyintf((s - (float)zf) / (float)sf);
        q = q < 0 ? 0 : (q > m ? (float)m : q);
        CHECK(codes[i] == (uint8_t)q, "%s: element %d (%.9g) code %d, expected %d", what, i, s,
              codes[i], (int)q);
        CHECK(out[i] == (float)codes[i] * (float)sf + (float)zf, "%s: dequant formula", what);
        CHECK(fabs(out[i] - s) <= tol, "%s: element %d %.9g decodes to %.9g (scale %.9g)", what, i,
              s, out[i], sf);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Page helpers                                                                              */
/* ---------------------------------------------------------------------------------------- */

static mkv_page_layout_t layout(mkv_format_t f, int32_t d, int32_t kg, int32_t vg,
                                int64_t page_bytes)
{
    mkv_page_layout_t lay;
    char err[512] = "";
    cr_assert_eq(mkv_page_layout(f, d, kg, vg, page_bytes, &lay, err), MKV_STATUS_OK,
                 "layout %s d %d groups %d/%d: %s", mkv_format_name(f), d, kg, vg, err);
    return lay;
}

static mkv_page_layout_t layout_tokens(mkv_format_t f, int32_t d, int32_t kg, int32_t vg,
                                       int32_t tokens)
{
    int64_t bytes = 0;
    cr_assert_eq(mkv_page_bytes_for(f, d, kg, vg, tokens, &bytes), MKV_STATUS_OK);
    return layout(f, d, kg, vg, bytes);
}

static uint8_t *poisoned_page(const mkv_page_layout_t *lay)
{
    uint8_t *p = malloc((size_t)lay->used_bytes);
    cr_assert_not_null(p);
    memset(p, 0xAB, (size_t)lay->used_bytes);
    return p;
}

/* Offsets of every byte of slot t, in a canonical order (codes, metadata, score, position). */
static int32_t slot_bytes(const mkv_page_layout_t *lay, int32_t t, int64_t *offs)
{
    int32_t n = 0;
    for (int which = 0; which < 2; which++) {
        const mkv_vec_layout_t *v = which ? &lay->value : &lay->key;
        for (int32_t c = 0; c < v->n_chunks; c++)
            for (int32_t b = 0; b < v->chunk_bytes; b++)
                offs[n++] = mkv_code_offset(lay, which, t, c) + b;
        if (v->bits != 16)
            for (int32_t g = 0; g < v->groups; g++)
                for (int32_t b = 0; b < 4; b++) offs[n++] = mkv_meta_offset(lay, which, t, g) + b;
    }
    for (int32_t b = 0; b < 4; b++) offs[n++] = mkv_score_offset(lay, t) + b;
    for (int32_t b = 0; b < 4; b++) offs[n++] = mkv_pos_offset(lay, t) + b;
    return n;
}

#define MAX_SLOT_BYTES (2 * 512 + 2 * 16 * 4 + 8) /* codes, up to 16 groups a side, score, pos */

/* Fails unless a and b agree on every byte outside slot t. */
static void expect_same_except_slot(const uint8_t *a, const uint8_t *b,
                                    const mkv_page_layout_t *lay, int32_t t, const char *what)
{
    uint8_t *mask = calloc((size_t)lay->used_bytes, 1);
    int64_t offs[MAX_SLOT_BYTES];
    const int32_t n = slot_bytes(lay, t, offs);
    for (int32_t i = 0; i < n; i++) {
        CHECK(offs[i] >= 0 && offs[i] < lay->used_bytes, "%s: slot byte %lld out of the page",
              what, (long long)offs[i]);
        CHECK(!mask[offs[i]], "%s: slot byte %lld counted twice", what, (long long)offs[i]);
        mask[offs[i]] = 1;
    }
    for (int64_t i = 0; i < lay->used_bytes; i++)
        CHECK(mask[i] || a[i] == b[i], "%s: byte %lld outside slot %d changed (%02x -> %02x)",
              what, (long long)i, t, a[i], b[i]);
    free(mask);
}

static void read_meta(const uint8_t *page, const mkv_page_layout_t *lay, int which, int32_t t,
                      int32_t g, uint16_t *scale, uint16_t *zero)
{
    const uint8_t *p = page + mkv_meta_offset(lay, which, t, g);
    *scale = (uint16_t)(p[0] | p[1] << 8);
    *zero = (uint16_t)(p[2] | p[3] << 8);
}

/* Code i of a vector by format.h's element rule (16-bit: the fp16 bits). */
static uint32_t read_code(const uint8_t *page, const mkv_page_layout_t *lay, int which, int32_t t,
                          int32_t i)
{
    const mkv_vec_layout_t *v = which ? &lay->value : &lay->key;
    const int32_t c = i / v->chunk_elems, e = i % v->chunk_elems;
    const uint8_t *p = page + mkv_code_offset(lay, which, t, c) + e * v->bits / 8;
    if (v->bits == 16) return (uint32_t)(p[0] | p[1] << 8);
    return (uint32_t)(p[0] >> (e * v->bits % 8)) & ((1u << v->bits) - 1u);
}

/* Fails unless the stored vector of slot t is exactly what quantizing x gives, group by group
 * (metadata and codes), and its decode (dec) is within the half-step bound of x. */
static void expect_vector(const uint8_t *page, const mkv_page_layout_t *lay, int which, int32_t t,
                          const float *x, const float *dec, const char *what)
{
    const mkv_vec_layout_t *v = which ? &lay->value : &lay->key;
    if (v->bits == 16) {
        for (int32_t i = 0; i < lay->head_dim; i++) {
            const double want = ref_round_f16(sanitised(x[i]));
            CHECK(dec[i] == want && ref_f16_value((uint16_t)read_code(page, lay, which, t, i)) == want,
                  "%s: fp16 element %d of %.9g reads %.9g", what, i, x[i], dec[i]);
        }
        return;
    }
    const int m = (1 << v->bits) - 1;
    for (int32_t g = 0; g < v->groups; g++) {
        const float *xg = x + g * v->group_elems;
        uint16_t scale, zero, s2, z2;
        uint8_t codes[256];
        mkv_quant_group(xg, v->group_elems, v->bits, &scale, &zero, codes);
        read_meta(page, lay, which, t, g, &s2, &z2);
        CHECK(s2 == scale && z2 == zero, "%s: group %d metadata %04x/%04x, expected %04x/%04x",
              what, g, s2, z2, scale, zero);
        double lo = INFINITY, hi = -INFINITY, maxabs = 0;
        for (int32_t i = 0; i < v->group_elems; i++) {
            const float s = sanitised(xg[i]);
            lo = fmin(lo, s), hi = fmax(hi, s), maxabs = fmax(maxabs, fabs(s));
        }
        const double sf = ref_f16_value(scale), zf = ref_f16_value(zero);
        /* The format's bound from the data alone: half a step of (hi - lo) / m, widened by the
         * zero's fp16 rounding (< one fp16 spacing at lo) and the scale's (< 2^-10 relative). */
        const double spacing = fmax(ldexp(1.0, -24), fabs(lo) * ldexp(1.0, -10));
        const double fmt_bound = ((hi - lo + spacing) / m * (1 + ldexp(1.0, -10)) +
                                  ldexp(1.0, -24)) / 2 + slack(maxabs, zf, sf, m);
        for (int32_t i = 0; i < v->group_elems; i++) {
            const int32_t k = g * v->group_elems + i;
            const double err = fabs(dec[k] - (double)sanitised(xg[i]));
            CHECK(read_code(page, lay, which, t, k) == codes[i], "%s: code %d is %u, expected %u",
                  what, k, read_code(page, lay, which, t, k), codes[i]);
            CHECK(err <= sf / 2 + slack(maxabs, zf, sf, m) && err <= fmt_bound,
                  "%s: element %d (%.9g) decodes to %.9g: error %.3g, scale %.3g, range %.3g", what,
                  k, xg[i], dec[k], err, sf, hi - lo);
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* fp16                                                                                      */
/* ---------------------------------------------------------------------------------------- */

Test(quant_half, every_half_decodes_and_round_trips)
{
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = mkv_f16_to_f32((uint16_t)h);
        const uint16_t back = mkv_f32_to_f16(f);
        if (is_f16_nan((uint16_t)h)) {
            CHECK(isnan(f) && is_f16_nan(back) && (back & 0x8000) == (h & 0x8000),
                  "NaN 0x%04x -> %g -> 0x%04x", h, f, back);
            continue;
        }
        const double want = ref_f16_value((uint16_t)h);
        CHECK((double)f == want && !signbit(f) == !signbit(want), "f16_to_f32(0x%04x) = %.9g, "
              "expected %.9g", h, f, want);
        CHECK(back == h, "0x%04x -> %.9g -> 0x%04x", h, f, back);
    }
}

Test(quant_half, rounding_matches_reference)
{
    /* Every tie between neighbouring halves, and the floats either side of it; the last
     * "neighbour" of 65504 is 65536, so its tie 65520 overflows to inf. */
    for (uint32_t h = 0; h <= 0x7bff; h++) {
        const double a = ref_f16_value((uint16_t)h);
        const double b = h == 0x7bff ? 65536.0 : ref_f16_value((uint16_t)(h + 1));
        const float mid = (float)((a + b) / 2);
        cr_assert_eq((double)mid, (a + b) / 2, "midpoint of 0x%04x not exact in fp32", h);
        const float cases[] = {(float)a, mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 4; i++) {
            expect_f16_rounds(cases[i]);
            expect_f16_rounds(-cases[i]);
        }
    }
    const float edges[] = {0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e10f,
                           FLT_MAX, INFINITY, -INFINITY, NAN, -NAN, 0x1p-24f, 0x1p-25f,
                           0x1.000002p-25f, 0x1p-26f, 0x3p-26f, 0x1p-14f, 0x1p-14f - 0x1p-25f,
                           FLT_MIN, 1e-45f, 1.0f, 2049.0f, 2051.0f, 4097.0f, 0.1f, 1.0f / 3.0f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        expect_f16_rounds(edges[i]);
        expect_f16_rounds(-edges[i]);
    }
    cr_assert_eq(mkv_f32_to_f16(65520.0f), 0x7c00);
    cr_assert_eq(mkv_f32_to_f16(65519.996f), 0x7bff);
    cr_assert_eq(mkv_f32_to_f16(0x1p-25f), 0x0000); /* tie to even: 0 */
    cr_assert_eq(mkv_f32_to_f16(0x3p-25f), 0x0002); /* 1.5 * 2^-24: tie to even 2 * 2^-24 */
    tu_rng_t r = {42};
    for (int i = 0; i < 2000000; i++) {
        /* any bit pattern (NaNs, infinities, fp32 subnormals included) */
        expect_f16_rounds(mkv_bits_f32((uint32_t)tu_rand(&r)));
        /* and exponents that land in or near fp16's range */
        const uint64_t u = tu_rand(&r);
        const uint32_t exp = 127 - 26 + (uint32_t)(u % 44);
        expect_f16_rounds(mkv_bits_f32(((uint32_t)(u >> 63) << 31) | (exp << 23) |
                                       ((uint32_t)(u >> 8) & 0x7fffffu)));
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Groups                                                                                    */
/* ---------------------------------------------------------------------------------------- */

Test(quant_group, sanitize)
{
    const struct { float in, out; int changed; } cases[] = {
        {NAN, 0.0f, 1},          {-NAN, 0.0f, 1},           {INFINITY, 65504.0f, 1},
        {-INFINITY, -65504.0f, 1}, {65504.0f, 65504.0f, 0}, {65505.0f, 65504.0f, 1},
        {-1e30f, -65504.0f, 1},  {FLT_MAX, 65504.0f, 1},    {1e-45f, 1e-45f, 0},
        {-3.5f, -3.5f, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x = cases[i].in;
        cr_assert_eq(mkv_quant_sanitize(&x), cases[i].changed, "case %zu", i);
        cr_assert(x == cases[i].out, "case %zu: %g -> %g", i, cases[i].in, x);
    }
    float z = -0.0f;
    cr_assert_eq(mkv_quant_sanitize(&z), 0);
    cr_assert(signbit(z), "-0 must stay -0");
}

Test(quant_group, random_groups_within_half_step)
{
    halves_init();
    static const int32_t sizes[] = {1, 2, 3, 5, 8, 16, 31, 32, 64, 128, 256};
    static const int32_t bits[] = {8, 4, 2};
    tu_rng_t r = {7};
    float x[256];
    char what[96];
    for (int iter = 0; iter < 30000; iter++) {
        const int32_t n = sizes[tu_rand_range(&r, 0, 10)];
        random_group(&r, x, n);
        for (int b = 0; b < 3; b++) {
            snprintf(what, sizeof what, "iter %d n %d bits %d", iter, n, bits[b]);
            check_group(x, n, bits[b], what);
        }
    }
}

Test(quant_group, constant_groups_decode_exactly)
{
    halves_init();
    const float values[] = {0.0f, -0.0f, 1.0f, -2.5f, 0.1f, 1e-7f, -1e-9f, 65504.0f, 1e-30f,
                            -65504.0f, 1234.567f};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        float x[7];
        for (int j = 0; j < 7; j++) x[j] = values[i];
        for (int32_t b = 2; b <= 8; b *= 2) {
            uint16_t scale = 1, zero;
            uint8_t codes[7];
            float out[7];
            mkv_quant_group(x, 7, b, &scale, &zero, codes);
            cr_assert_eq(scale, 0, "constant %g at %d bits: scale 0x%04x", values[i], b, scale);
            mkv_dequant_group(codes, 7, scale, zero, out);
            for (int j = 0; j < 7; j++)
                cr_assert(out[j] == ref_round_f16(values[i]) && codes[j] == 0,
                          "constant %g decodes to %g", values[i], out[j]);
        }
    }
}

Test(quant_group, directed_roundings_at_the_edges)
{
    halves_init();
    /* lo not an fp16 (0.1): zero below it; lo a negative non-half; hi just past a grid point;
     * lo slightly negative with hi on an exact multiple (the fp32 quotient falls short there:
     * (3 + 2^-24) / 3 rounds to 1.0, one fp16 ulp too small); subnormal spreads; max range. */
    const float groups[][2] = {{0.1f, 1.0f},       {-0.1f, 0.3f},     {0.0f, 3.0f},
                               {-1e-8f, 3.0f},     {-1e-8f, 765.0f},  {-1e-8f, 15.0f},
                               {1e-7f, 2e-7f},     {-3e-8f, 3e-8f},   {-65504.0f, 65504.0f},
                               {65503.0f, 65504.0f}, {1000.3f, 1000.31f}, {-1e-40f, 1e-40f}};
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        for (int32_t b = 2; b <= 8; b *= 2) {
            char what[64];
            snprintf(what, sizeof what, "{%g, %g} at %d bits", groups[i][0], groups[i][1], b);
            check_group(groups[i], 2, b, what);
        }
}

Test(quant_group, ties_round_half_even)
{
    /* Grids with an exact fp16 zero and scale, elements exactly on half steps. */
    const struct { float x[6]; int32_t bits; uint8_t want[6]; } cases[] = {
        {{0, 3, 0.5f, 1.5f, 2.5f, 1}, 2, {0, 3, 0, 2, 2, 1}},
        {{-4, -1, -3.5f, -2.5f, -1.5f, -3}, 2, {0, 3, 0, 2, 2, 1}},
        {{0, 0.75f, 0.125f, 0.375f, 0.625f, 0.25f}, 2, {0, 3, 0, 2, 2, 1}},
        {{0, 15, 0.5f, 7.5f, 8.5f, 14.5f}, 4, {0, 15, 0, 8, 8, 14}},
        {{0, 255, 0.5f, 1.5f, 126.5f, 253.5f}, 8, {0, 255, 0, 2, 126, 254}},
        {{0, 127.5f, 0.25f, 0.75f, 63.25f, 1.25f}, 8, {0, 255, 0, 2, 126, 2}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t scale, zero;
        uint8_t codes[6];
        mkv_quant_group(cases[i].x, 6, cases[i].bits, &scale, &zero, codes);
        for (int j = 0; j < 6; j++)
            cr_assert_eq(codes[j], cases[i].want[j], "case %zu element %d (%g): code %d, expected "
                         "%d (scale %g zero %g)", i, j, cases[i].x[j], codes[j], cases[i].want[j],
                         mkv_f16_to_f32(scale), mkv_f16_to_f32(zero));
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Pages                                                                                     */
/* ---------------------------------------------------------------------------------------- */

Test(quant_page, round_trip_every_format)
{
    halves_init();
    tu_rng_t r = {1234};
    float k[256], v[256], kd[256], vd[256];
    char what[128];
    for (int f = 0; f < MKV_FORMAT_COUNT; f++)
        for (int gi = 0; gi < N_GROUPS; gi++)
            for (int di = 0; di < 5; di++) {
                const int32_t tokens = tu_rand_range(&r, 1, 40);
                const mkv_page_layout_t lay = layout_tokens((mkv_format_t)f, k_dims[di],
                                                            k_groups[gi][0], k_groups[gi][1], tokens);
                uint8_t *page = poisoned_page(&lay), *before = malloc((size_t)lay.used_bytes);
                for (int w = 0; w < 8; w++) {
                    const int32_t t = w == 0 ? 0 : w == 1 ? lay.tokens - 1
                                                          : tu_rand_range(&r, 0, lay.tokens - 1);
                    snprintf(what, sizeof what, "%s d %d groups %d/%d slot %d/%d",
                             mkv_format_name((mkv_format_t)f), k_dims[di], k_groups[gi][0], k_groups[gi][1], t,
                             lay.tokens);
                    random_vector(&r, k, lay.head_dim);
                    random_vector(&r, v, lay.head_dim);
                    const float score = frange(&r, 0, 100);
                    const int32_t pos = tu_rand_range(&r, 0, 1 << 20);
                    memcpy(before, page, (size_t)lay.used_bytes);
                    cr_assert_eq(mkv_page_write_token(page, &lay, t, k, v, score, pos), 0, "%s",
                                 what);
                    expect_same_except_slot(before, page, &lay, t, what);
                    float s2 = -1;
                    int32_t p2 = -1;
                    mkv_page_read_token(page, &lay, t, kd, vd, &s2, &p2);
                    cr_assert(s2 == score && p2 == pos, "%s: score %g pos %d", what, s2, p2);
                    cr_assert(mkv_page_score(page, &lay, t) == score &&
                                  mkv_page_pos(page, &lay, t) == pos, "%s", what);
                    expect_vector(page, &lay, 0, t, k, kd, what);
                    expect_vector(page, &lay, 1, t, v, vd, what);
                }
                free(page);
                free(before);
            }
}

Test(quant_page, codes_packed_as_documented)
{
    /* K4V2 at d = 64: 4-bit keys in 2 chunks of 32 elements, 2-bit values in one chunk of 16
     * bytes (64 elements). Key x[i] = i % 16 on a grid {0..15} gives code i % 16, so byte j of
     * a chunk is (2j % 16) | (2j + 1) % 16 << 4; value x[i] = i % 4 gives code i % 4, so every
     * value byte is 0 | 1 << 2 | 2 << 4 | 3 << 6 = 0xe4. */
    const mkv_page_layout_t lay = layout_tokens(MKV_FORMAT_K4V2, 64, 256, 256, 5);
    uint8_t *page = poisoned_page(&lay);
    float k[64], v[64];
    for (int i = 0; i < 64; i++) k[i] = (float)(i % 16), v[i] = (float)(i % 4);
    mkv_page_write_token(page, &lay, 3, k, v, 0.0f, 0);
    cr_assert_eq(lay.key.n_chunks, 2);
    for (int c = 0; c < 2; c++)
        for (int j = 0; j < 16; j++) {
            const uint8_t want = (uint8_t)((2 * j) % 16 | ((2 * j + 1) % 16) << 4);
            cr_assert_eq(page[mkv_code_offset(&lay, 0, 3, c) + j], want, "key chunk %d byte %d",
                         c, j);
        }
    for (int j = 0; j < 16; j++)
        cr_assert_eq(page[mkv_code_offset(&lay, 1, 3, 0) + j], 0xe4, "value byte %d", j);
    const uint8_t *km = page + mkv_meta_offset(&lay, 0, 3, 0);
    cr_assert(km[0] == 0x00 && km[1] == 0x3c && km[2] == 0 && km[3] == 0,
              "key scale 1.0 (0x3c00) and zero 0, little-endian: %02x %02x %02x %02x", km[0],
              km[1], km[2], km[3]);
    free(page);

    /* 16-bit: little-endian halves, 8 per chunk. */
    const mkv_page_layout_t l16 = layout_tokens(MKV_FORMAT_K16V16, 16, 256, 256, 3);
    page = poisoned_page(&l16);
    for (int i = 0; i < 16; i++) k[i] = (float)i + 0.5f, v[i] = -(float)i;
    mkv_page_write_token(page, &l16, 1, k, v, 0.0f, 0);
    cr_assert_eq(l16.key.n_chunks, 2);
    for (int i = 0; i < 16; i++) {
        const uint8_t *p = page + mkv_code_offset(&l16, 0, 1, i / 8) + 2 * (i % 8);
        const uint16_t h = (uint16_t)(p[0] | p[1] << 8);
        cr_assert(ref_f16_value(h) == k[i], "fp16 key %d is 0x%04x", i, h);
    }
    free(page);
}

Test(quant_page, deterministic_across_runs_and_slots)
{
    tu_rng_t r = {99};
    float k[128], v[128], other[128];
    const mkv_format_t fmts[] = {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, MKV_FORMAT_K16V16,
                                 MKV_FORMAT_K2V4};
    for (int fi = 0; fi < 4; fi++)
        for (int gi = 0; gi < N_GROUPS; gi++) {
            const mkv_page_layout_t lay = layout(fmts[fi], 128, k_groups[gi][0], k_groups[gi][1], 6656);
            uint8_t *a = poisoned_page(&lay), *b = poisoned_page(&lay), *c = poisoned_page(&lay);
            random_vector(&r, k, 128);
            random_vector(&r, v, 128);
            random_vector(&r, other, 128);
            const int32_t s = tu_rand_range(&r, 0, lay.tokens - 1);
            const int32_t s2 = (s + 1 + tu_rand_range(&r, 0, lay.tokens - 2)) % lay.tokens;
            mkv_page_write_token(a, &lay, s, k, v, 1.5f, 7);
            /* b: first another token, then ours: nothing of the old one may remain */
            mkv_page_write_token(b, &lay, s, other, other, 2.5f, 8);
            mkv_page_write_token(b, &lay, s, k, v, 1.5f, 7);
            cr_assert(memcmp(a, b, (size_t)lay.used_bytes) == 0, "%s groups %d/%d: rewrite differs",
                      mkv_format_name(fmts[fi]), k_groups[gi][0], k_groups[gi][1]);
            mkv_page_write_token(c, &lay, s2, k, v, 1.5f, 7);
            int64_t oa[MAX_SLOT_BYTES], oc[MAX_SLOT_BYTES];
            const int32_t n = slot_bytes(&lay, s, oa);
            slot_bytes(&lay, s2, oc);
            for (int32_t i = 0; i < n; i++)
                cr_assert_eq(a[oa[i]], c[oc[i]], "%s groups %d/%d: slot %d vs %d byte %d",
                             mkv_format_name(fmts[fi]), k_groups[gi][0], k_groups[gi][1], s, s2, i);
            free(a);
            free(b);
            free(c);
        }
}

Test(quant_page, non_finite_input_is_contained)
{
    halves_init();
    tu_rng_t r = {5};
    const mkv_format_t fmts[] = {MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, MKV_FORMAT_K16V16};
    for (int fi = 0; fi < 3; fi++) {
        const mkv_page_layout_t lay = layout(fmts[fi], 128, 32, 32, 6656);
        uint8_t *clean = poisoned_page(&lay), *dirty = poisoned_page(&lay);
        float k[128], v[128], kb[128], vb[128], kd[128], vd[128], kc[128], vc[128];
        random_vector(&r, k, 128);
        random_vector(&r, v, 128);
        /* neighbours first, so their bytes can be checked afterwards */
        for (int32_t t = 0; t < 3; t++) {
            mkv_page_write_token(clean, &lay, t, k, v, 0.0f, t);
            mkv_page_write_token(dirty, &lay, t, k, v, 0.0f, t);
        }
        memcpy(kb, k, sizeof k);
        memcpy(vb, v, sizeof v);
        kb[5] = NAN;       /* group 0 of the key */
        kb[70] = INFINITY; /* group 2 */
        vb[3] = -INFINITY; /* group 0 of the value */
        vb[100] = 1e30f;   /* group 3 */
        uint8_t *before = malloc((size_t)lay.used_bytes);
        memcpy(before, dirty, (size_t)lay.used_bytes);
        cr_assert_eq(mkv_page_write_token(dirty, &lay, 1, kb, vb, 0.5f, 1), 4);
        mkv_page_write_token(clean, &lay, 1, k, v, 0.5f, 1);
        expect_same_except_slot(before, dirty, &lay, 1, mkv_format_name(fmts[fi]));
        mkv_page_read_token(dirty, &lay, 1, kd, vd, NULL, NULL);
        mkv_page_read_token(clean, &lay, 1, kc, vc, NULL, NULL);
        for (int i = 0; i < 128; i++)
            cr_assert(isfinite(kd[i]) && isfinite(vd[i]), "%s: element %d not finite",
                      mkv_format_name(fmts[fi]), i);
        /* the untouched groups (key 1 and 3, value 1 and 2) are bit for bit the clean ones */
        for (int i = 0; i < 128; i++) {
            const int g = i / 32;
            if (g == 1 || g == 3) cr_assert(kd[i] == kc[i], "key element %d changed", i);
            if (g == 1 || g == 2) cr_assert(vd[i] == vc[i], "value element %d changed", i);
        }
        for (int g = 0; g < 4 && lay.key.bits != 16; g++) {
            uint16_t s, z;
            read_meta(dirty, &lay, 0, 1, g, &s, &z);
            cr_assert(isfinite(ref_f16_value(s)) && isfinite(ref_f16_value(z)), "key meta %d", g);
            read_meta(dirty, &lay, 1, 1, g, &s, &z);
            cr_assert(isfinite(ref_f16_value(s)) && isfinite(ref_f16_value(z)), "value meta %d", g);
        }
        /* the bad elements decode to 0 / +-65504 within their group's bound (expect_vector
         * sanitises its reference) */
        expect_vector(dirty, &lay, 0, 1, kb, kd, "key with NaN and inf");
        expect_vector(dirty, &lay, 1, 1, vb, vd, "value with -inf and 1e30");
        free(clean);
        free(dirty);
        free(before);
    }
}

Test(quant_page, copy_token_moves_every_segment)
{
    tu_rng_t r = {77};
    float k[128], v[128], k1[128], v1[128], k2[128], v2[128];
    for (int f = 0; f < MKV_FORMAT_COUNT; f++)
        for (int gi = 0; gi < N_GROUPS; gi++) {
            const mkv_page_layout_t lay = layout((mkv_format_t)f, 128, k_groups[gi][0], k_groups[gi][1], 6656);
            uint8_t *src = poisoned_page(&lay), *dst = poisoned_page(&lay);
            uint8_t *before = malloc((size_t)lay.used_bytes);
            for (int32_t t = 0; t < lay.tokens; t++) {
                random_vector(&r, k, 128);
                random_vector(&r, v, 128);
                mkv_page_write_token(src, &lay, t, k, v, (float)t * 0.25f, 1000 + t);
            }
            const int32_t a = tu_rand_range(&r, 0, lay.tokens - 1);
            const int32_t b = tu_rand_range(&r, 0, lay.tokens - 1);
            memcpy(before, dst, (size_t)lay.used_bytes);
            mkv_page_copy_token(dst, b, src, a, &lay);
            expect_same_except_slot(before, dst, &lay, b, "copy between pages");
            int64_t oa[MAX_SLOT_BYTES], ob[MAX_SLOT_BYTES];
            const int32_t n = slot_bytes(&lay, a, oa);
            slot_bytes(&lay, b, ob);
            for (int32_t i = 0; i < n; i++)
                cr_assert_eq(src[oa[i]], dst[ob[i]], "%s groups %d/%d: byte %d of the slot",
                             mkv_format_name((mkv_format_t)f), k_groups[gi][0], k_groups[gi][1], i);
            float s1, s2;
            int32_t p1, p2;
            mkv_page_read_token(src, &lay, a, k1, v1, &s1, &p1);
            mkv_page_read_token(dst, &lay, b, k2, v2, &s2, &p2);
            cr_assert(memcmp(k1, k2, sizeof k1) == 0 && memcmp(v1, v2, sizeof v1) == 0 &&
                          s1 == s2 && p1 == p2, "copy reads back different");
            /* swap-remove inside one page: the last slot moves onto slot a */
            const int32_t last = lay.tokens - 1;
            mkv_page_read_token(src, &lay, last, k1, v1, &s1, &p1);
            memcpy(before, src, (size_t)lay.used_bytes);
            mkv_page_copy_token(src, a, src, last, &lay);
            expect_same_except_slot(before, src, &lay, a, "copy within a page");
            mkv_page_read_token(src, &lay, a, k2, v2, &s2, &p2);
            cr_assert(memcmp(k1, k2, sizeof k1) == 0 && memcmp(v1, v2, sizeof v1) == 0 &&
                          s1 == s2 && p1 == p2, "in-page copy reads back different");
            free(src);
            free(dst);
            free(before);
        }
}

Test(quant_page, demote_requantizes_decoded_values)
{
    tu_rng_t r = {31};
    float k[256], v[256], kd[256], vd[256], scratch[512];
    for (int di = 2; di < 5; di++)
        for (int gi = 0; gi < N_GROUPS; gi++) {
            const int32_t d = k_dims[di];
            const mkv_page_layout_t hi = layout_tokens(MKV_FORMAT_K8V4, d, k_groups[gi][0], k_groups[gi][1], 32);
            const mkv_page_layout_t lo = layout_tokens(MKV_FORMAT_K4V2, d, k_groups[gi][0], k_groups[gi][1], 59);
            uint8_t *src = poisoned_page(&hi), *dst = poisoned_page(&lo);
            uint8_t *before = malloc((size_t)lo.used_bytes);
            for (int rep = 0; rep < 8; rep++) {
                const int32_t a = tu_rand_range(&r, 0, hi.tokens - 1);
                const int32_t b = tu_rand_range(&r, 0, lo.tokens - 1);
                random_vector(&r, k, d);
                random_vector(&r, v, d);
                mkv_page_write_token(src, &hi, a, k, v, 3.25f, 4242 + rep);
                memcpy(before, dst, (size_t)lo.used_bytes);
                cr_assert_eq(mkv_page_demote_token(dst, &lo, b, src, &hi, a, scratch), 0);
                expect_same_except_slot(before, dst, &lo, b, "demote");
                /* expected: quantize the K8V4 decode afresh, group by group */
                mkv_page_read_token(src, &hi, a, kd, vd, NULL, NULL);
                for (int which = 0; which < 2; which++) {
                    const mkv_vec_layout_t *vl = which ? &lo.value : &lo.key;
                    const float *x = which ? vd : kd;
                    for (int32_t g = 0; g < vl->groups; g++) {
                        uint16_t scale, zero, s2, z2;
                        uint8_t codes[256];
                        mkv_quant_group(x + g * vl->group_elems, vl->group_elems, vl->bits,
                                        &scale, &zero, codes);
                        read_meta(dst, &lo, which, b, g, &s2, &z2);
                        cr_assert(s2 == scale && z2 == zero, "d %d groups %d/%d %s group %d meta",
                                  d, k_groups[gi][0], k_groups[gi][1], which ? "value" : "key", g);
                        for (int32_t i = 0; i < vl->group_elems; i++) {
                            const int32_t e = g * vl->group_elems + i;
                            cr_assert_eq(read_code(dst, &lo, which, b, e), codes[i],
                                         "d %d groups %d/%d %s element %d", d, k_groups[gi][0],
                                         k_groups[gi][1], which ? "value" : "key", e);
                        }
                    }
                }
                cr_assert(mkv_page_score(dst, &lo, b) == 3.25f &&
                          mkv_page_pos(dst, &lo, b) == 4242 + rep, "score/position not carried");
            }
            free(src);
            free(dst);
            free(before);
        }
}

/* ---------------------------------------------------------------------------------------- */
/* Layout by hand                                                                            */
/* ---------------------------------------------------------------------------------------- */

static void expect_layout(const mkv_page_layout_t *l, int32_t tokens, const int64_t off[6],
                          const int64_t bytes[6], int64_t used, const char *what)
{
    cr_assert_eq(l->tokens, tokens, "%s: %d tokens", what, l->tokens);
    for (int s = 0; s < 6; s++) {
        cr_assert_eq(l->offset[s], off[s], "%s: segment %d at %lld", what, s,
                     (long long)l->offset[s]);
        cr_assert_eq(l->bytes[s], bytes[s], "%s: segment %d of %lld bytes", what, s,
                     (long long)l->bytes[s]);
    }
    cr_assert_eq(l->used_bytes, used, "%s: %lld bytes used", what, (long long)l->used_bytes);
}

static void expect_vec(const mkv_vec_layout_t *v, int32_t bits, int32_t vec, int32_t chunk,
                       int32_t n_chunks, int32_t elems, int32_t groups, const char *what)
{
    cr_assert(v->bits == bits && v->vec_bytes == vec && v->chunk_bytes == chunk &&
                  v->n_chunks == n_chunks && v->chunk_elems == elems && v->groups == groups &&
                  v->group_elems == 128 / groups,
              "%s: bits %d vec %d chunk %d x %d, %d elems, %d groups", what, v->bits, v->vec_bytes,
              v->chunk_bytes, v->n_chunks, v->chunk_elems, v->groups);
}

Test(quant_layout, default_pages_by_hand)
{
    /* K8V4, d 128, one group: 32 tokens, every segment a multiple of 16 bytes. */
    const mkv_page_layout_t a = layout(MKV_FORMAT_K8V4, 128, 256, 256, 6656);
    expect_layout(&a, 32, (const int64_t[]){0, 4096, 4224, 6272, 6400, 6528},
                  (const int64_t[]){4096, 128, 2048, 128, 128, 128}, 6656, "K8V4");
    expect_vec(&a.key, 8, 128, 16, 8, 16, 1, "K8V4 key");
    expect_vec(&a.value, 4, 64, 16, 4, 32, 1, "K8V4 value");
    /* K4V2: 59 tokens fit (112 bytes each), the page holds 48 (MKV_PAGE_TOKEN_ALIGN); 48 * 64
     * = 3072 key bytes; meta 192 to 3264, where value codes start (1536 bytes, to 4800); value
     * meta 192 to 4992; scores at 4992 to 5184; positions at 5184 to 5376. */
    const mkv_page_layout_t b = layout(MKV_FORMAT_K4V2, 128, 256, 256, 6656);
    expect_layout(&b, 48, (const int64_t[]){0, 3072, 3264, 4800, 4992, 5184},
                  (const int64_t[]){3072, 192, 1536, 192, 192, 192}, 5376, "K4V2");
    expect_vec(&b.key, 4, 64, 16, 4, 32, 1, "K4V2 key");
    expect_vec(&b.value, 2, 32, 16, 2, 64, 1, "K4V2 value");
    /* K16V16: 12 tokens, no metadata segments. */
    const mkv_page_layout_t c = layout(MKV_FORMAT_K16V16, 128, 256, 256, 6656);
    expect_layout(&c, 12, (const int64_t[]){0, 3072, 3072, 6144, 6144, 6192},
                  (const int64_t[]){3072, 0, 3072, 0, 48, 48}, 6240, "K16V16");
    expect_vec(&c.key, 16, 256, 16, 16, 8, 1, "K16V16 key");
}

Test(quant_layout, accessors_by_hand)
{
    const mkv_page_layout_t a = layout(MKV_FORMAT_K8V4, 128, 256, 256, 6656);
    /* key chunk c of slot t at c * 32 * 16 + t * 16; value at 4224 + c * 512 + t * 16 */
    const int32_t ct[][2] = {{0, 0}, {0, 1}, {0, 31}, {1, 0}, {3, 17}, {7, 31}};
    const int64_t key_off[] = {0, 16, 496, 512, 1808, 4080};
    for (int i = 0; i < 6; i++)
        cr_assert_eq(mkv_code_offset(&a, 0, ct[i][1], ct[i][0]), key_off[i], "K8V4 key %d", i);
    cr_assert_eq(mkv_code_offset(&a, 1, 31, 3), 6256);
    cr_assert_eq(mkv_code_offset(&a, 1, 2, 1), 4224 + 512 + 32);
    cr_assert_eq(mkv_meta_offset(&a, 0, 5, 0), 4096 + 20);
    cr_assert_eq(mkv_meta_offset(&a, 1, 31, 0), 6272 + 124);
    cr_assert_eq(mkv_score_offset(&a, 3), 6412);
    cr_assert_eq(mkv_pos_offset(&a, 31), 6652);

    const mkv_page_layout_t b = layout(MKV_FORMAT_K4V2, 128, 256, 256, 6656);
    /* 48 tokens: a chunk row is 48 * 16 = 768 bytes */
    cr_assert_eq(mkv_code_offset(&b, 0, 47, 3), 3 * 768 + 47 * 16);       /* 3056, ends 3072 */
    cr_assert_eq(mkv_code_offset(&b, 1, 47, 1), 3264 + 768 + 47 * 16);    /* 4784, ends 4800 */
    cr_assert_eq(mkv_code_offset(&b, 1, 10, 0), 3264 + 160);
    cr_assert_eq(mkv_meta_offset(&b, 1, 47, 0), 4800 + 188);
    cr_assert_eq(mkv_pos_offset(&b, 47), 5184 + 188);

    /* K8V4 with 4 groups: 232 bytes a token, 28 fit, 16 held; meta [group][token]. */
    const mkv_page_layout_t c = layout(MKV_FORMAT_K8V4, 128, 32, 32, 6656);
    cr_assert_eq(c.tokens, 16);
    cr_assert_eq(c.offset[MKV_SEG_KEY_META], 16 * 128);
    cr_assert_eq(mkv_meta_offset(&c, 0, 5, 2), 2048 + (2 * 16 + 5) * 4);
    cr_assert_eq(mkv_meta_offset(&c, 1, 15, 3), 2048 + 256 + 1024 + (3 * 16 + 15) * 4);

    /* K2V4 at d = 16: a 2-bit key is 4 bytes, one chunk of 4 bytes. */
    const mkv_page_layout_t d = layout_tokens(MKV_FORMAT_K2V4, 16, 256, 256, 10);
    cr_assert(d.key.chunk_bytes == 4 && d.key.n_chunks == 1 && d.value.chunk_bytes == 8);
    cr_assert_eq(mkv_code_offset(&d, 0, 7, 0), 28);
    cr_assert_eq(mkv_code_offset(&d, 1, 7, 0), d.offset[MKV_SEG_VALUE] + 56);
}
