/*
 * test_quant_cuda.c — the GPU quantizer (quant/quant_cuda.cu) against the CPU reference
 * (quant/quant.c): pools poisoned with 0xAB on both sides, the same tokens written by
 * mkv_page_write_token (or demoted by mkv_page_demote_token) on the host and by the kernels on
 * the device, then every byte of the two pools compared, unused slots and pages included.
 * Inputs are fresh random fp16 or bf16 bits of many shapes (tiny and subnormal, near 65504,
 * constant vectors and groups, signed zeros, exact rounding ties, adjacent values, scales that
 * need the exact check's step up, non-finite and beyond fp16's range), placed at shuffled
 * (page, slot) pairs of pages of a few tokens.
 * Every test but the argument checks skips without a GPU.
 */
#include "gpu_util.h"

#include "common/error.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "quant/quant_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POISON 0xAB
#define OK MKV_STATUS_OK

enum input_kind { IN_F16, IN_BF16, IN_F16_NONFINITE, IN_BF16_NONFINITE };

static const int32_t k_dims[] = {16, 32, 64, 128, 256};
/* Per-side group sizes (elements; 0: the default): hi key, hi value, lo key, lo value. One
 * group, 16 everywhere (a quarter of a 16-byte chunk at 2 bits; 16 groups at d 256), mixed
 * sides, the defaults. Appends use the first two of a row. */
static const int32_t k_groups[][4] = {
    {256, 256, 256, 256}, {16, 16, 16, 16}, {128, 32, 64, 16}, {32, 16, 16, 32}, {0, 0, 0, 0},
};
static const int32_t k_tpp[] = {1, 2, 3, 5, 7};

/* ---- Inputs ------------------------------------------------------------------------------ */

static int is_bf16_kind(int kind) { return kind == IN_BF16 || kind == IN_BF16_NONFINITE; }

static float in_to_f32(uint16_t b, int bf16) { return bf16 ? mkv_bits_f32((uint32_t)b << 16) : mkv_f16_to_f32(b); }

static uint16_t f32_to_in(float f, int bf16) { return bf16 ? (uint16_t)(mkv_f32_bits(f) >> 16) : mkv_f32_to_f16(f); }

static float rand_unit(uint64_t *rng) /* [-1, 1) */
{
    return (float)((double)(test_rand_next(rng) >> 11) / 4503599627370496.0 - 1.0);
}

static uint16_t rand_sign(uint64_t *rng) { return (test_rand_next(rng) & 1) ? 0x8000u : 0u; }

/* Finite bits of moderate range: fp16 exponents 1..29, bf16 magnitudes 2^-30 .. 65280. */
static uint16_t rand_finite(uint64_t *rng, int bf16)
{
    const uint16_t s = rand_sign(rng);
    if (bf16) return (uint16_t)(s | test_rand_range(rng, 97, 141) << 7 | test_rand_range(rng, 0, 127));
    return (uint16_t)(s | test_rand_range(rng, 1, 29) << 10 | test_rand_range(rng, 0, 1023));
}

/* Whether quant.c's scale for a group of fp16 min `zero` and max hi needs the exact check's
 * step up (the fp32 quotient rounded twice landed one fp16 ulp low): a restatement used only
 * to choose inputs that reach that rare branch. */
static int scale_steps_up(float zero, float hi, int32_t bits)
{
    const float m = (float)((1 << bits) - 1), want = (hi - zero) / m;
    uint16_t s = mkv_f32_to_f16(want);
    if (mkv_f16_to_f32(s) < want) s++; /* want > 0: one ulp up is + 1 */
    return (double)(m * mkv_f16_to_f32(s)) + (double)zero < (double)hi;
}

/* A group whose min and max are far apart in magnitude and need the scale's step up (about 1
 * in 40 such pairs at 2 bits, 1 in 200 at 4, 1 in 3000 at 8; capped at 20000 tries). bf16:
 * values of 8 significant bits, which fp16 and bf16 hold alike. */
static void fill_step_up(uint16_t *out, int32_t n, int32_t bits, int bf16, uint64_t *rng)
{
    float lo = 0.0f, hi = 1.0f;
    for (int tries = 0; tries < 20000; tries++) {
        const uint16_t keep = bf16 ? 0xfff8u : 0xffffu;
        const uint16_t a = (uint16_t)((rand_sign(rng) | test_rand_range(rng, 1, 9) << 10 |
                                       test_rand_range(rng, 0, 1023)) & keep);
        const uint16_t b = (uint16_t)((rand_sign(rng) | test_rand_range(rng, 20, 30) << 10 |
                                       test_rand_range(rng, 0, 1023)) & keep);
        const float fa = mkv_f16_to_f32(a), fb = mkv_f16_to_f32(b);
        lo = fa < fb ? fa : fb, hi = fa < fb ? fb : fa;
        if (scale_steps_up(lo, hi, bits)) break;
    }
    for (int32_t i = 0; i < n; i++) out[i] = f32_to_in(lo + (hi - lo) * (0.5f + 0.5f * rand_unit(rng)), bf16);
    const int32_t p = test_rand_range(rng, 0, n - 1), q = (p + test_rand_range(rng, 1, n - 1)) % n;
    out[p] = f32_to_in(lo, bf16), out[q] = f32_to_in(hi, bf16);
}

/* One group of n elements of a vector stored at `bits`, in one of nine shapes. */
static void fill_group(uint16_t *out, int32_t n, int32_t bits, int bf16, uint64_t *rng)
{
    switch (test_rand_range(rng, 0, 8)) {
    case 0: { /* plain random values of one magnitude */
        const float s = ldexpf(1.0f, test_rand_range(rng, -12, 12));
        for (int32_t i = 0; i < n; i++) out[i] = f32_to_in(rand_unit(rng) * s, bf16);
        break;
    }
    case 1: /* tiny: fp16 subnormals and the first normal binade; bf16 (fp32) subnormals and up */
        for (int32_t i = 0; i < n; i++)
            out[i] = (uint16_t)(rand_sign(rng) | test_rand_range(rng, 0, bf16 ? 0x0fff : 0x07ff));
        break;
    case 2: /* large, up to 65504 (fp16) or 65280 (bf16) */
        for (int32_t i = 0; i < n; i++)
            out[i] = (uint16_t)(rand_sign(rng) | (bf16 ? test_rand_range(rng, 0x4680, 0x477f)
                                                       : test_rand_range(rng, 0x7000, 0x7bff)));
        if (!bf16 && test_rand_range(rng, 0, 1)) out[test_rand_range(rng, 0, n - 1)] = 0x7bffu;
        if (!bf16 && test_rand_range(rng, 0, 1)) out[test_rand_range(rng, 0, n - 1)] = 0xfbffu;
        break;
    case 3: { /* constant group */
        const uint16_t c = test_rand_range(rng, 0, 3) ? rand_finite(rng, bf16) : rand_sign(rng);
        for (int32_t i = 0; i < n; i++) out[i] = c;
        break;
    }
    case 4: { /* exact ties: grid [-c, m - c] * unit, elements on half steps */
        const int32_t m = bits == 16 ? 15 : (1 << bits) - 1, c = test_rand_range(rng, 0, m);
        const float unit = ldexpf(1.0f, test_rand_range(rng, -6, 3));
        for (int32_t i = 0; i < n; i++)
            out[i] = f32_to_in(((float)test_rand_range(rng, 0, 2 * m) * 0.5f - (float)c) * unit, bf16);
        const int32_t p = test_rand_range(rng, 0, n - 1), q = (p + test_rand_range(rng, 1, n - 1)) % n;
        out[p] = f32_to_in(-(float)c * unit, bf16);
        out[q] = f32_to_in((float)(m - c) * unit, bf16);
        break;
    }
    case 5: { /* signed zeros, maybe with values of one sign: the sign of a zero min or max */
        const int with = test_rand_range(rng, 0, 2); /* 0: zeros only, 1: positive, 2: negative */
        for (int32_t i = 0; i < n; i++) {
            out[i] = rand_sign(rng);
            if (with && test_rand_range(rng, 0, 3) == 0)
                out[i] = (uint16_t)((rand_finite(rng, bf16) & 0x7fffu) | (with == 2 ? 0x8000u : 0u));
        }
        break;
    }
    case 6: { /* a few adjacent values: the narrowest ranges */
        const uint16_t b = rand_finite(rng, bf16);
        for (int32_t i = 0; i < n; i++) out[i] = (uint16_t)(b + test_rand_range(rng, 0, 3));
        break;
    }
    case 7: /* the scale's exact check steps up */
        if (bits != 16) {
            fill_step_up(out, n, bits, bf16, rng);
            break;
        }
        /* fall through */
    default: /* independent random bits of every exponent */
        for (int32_t i = 0; i < n; i++) out[i] = rand_finite(rng, bf16);
        break;
    }
}

static uint16_t rand_special(uint64_t *rng, int bf16)
{
    static const uint16_t f16[] = {0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0xffff, 0x7bff, 0xfbff};
    /* inf, NaNs, +-3.4e38, +-65536, 131072, 8.6e9 (beyond fp16), 65280 (inside) */
    static const uint16_t b16[] = {0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x7f7f, 0xff7f,
                                   0x4780, 0xc780, 0x4800, 0x5000, 0x477f};
    return bf16 ? b16[test_rand_range(rng, 0, (int32_t)(sizeof b16 / 2) - 1)]
                : f16[test_rand_range(rng, 0, (int32_t)(sizeof f16 / 2) - 1)];
}

/* A key or value vector of d elements in `groups` groups (as the layout groups it). */
static void fill_vector(uint16_t *out, int32_t d, int32_t groups, int32_t bits, int kind, uint64_t *rng)
{
    const int bf16 = is_bf16_kind(kind);
    const int32_t n = d / groups;
    if (test_rand_range(rng, 0, 11) == 0) { /* constant vector */
        const uint16_t c = test_rand_range(rng, 0, 2) ? rand_finite(rng, bf16) : rand_sign(rng);
        for (int32_t i = 0; i < d; i++) out[i] = c;
    } else {
        for (int32_t g = 0; g < groups; g++) fill_group(out + g * n, n, bits, bf16, rng);
    }
    if (kind != IN_F16_NONFINITE && kind != IN_BF16_NONFINITE) return;
    for (int32_t g = 0; g < groups; g++) {
        if (test_rand_range(rng, 0, 3) == 0) { /* a whole group of one special */
            const uint16_t s = rand_special(rng, bf16);
            for (int32_t i = 0; i < n; i++) out[g * n + i] = s;
            continue;
        }
        for (int32_t i = 0; i < n; i++)
            if (test_rand_range(rng, 0, 5) == 0) out[g * n + i] = rand_special(rng, bf16);
    }
}

/* A random permutation of 0 .. n - 1. */
static int64_t *shuffled(int64_t n, uint64_t *rng)
{
    int64_t *p = malloc((size_t)n * sizeof *p);
    cr_assert(p);
    for (int64_t i = 0; i < n; i++) p[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = (int64_t)(test_rand_next(rng) % (uint64_t)(i + 1)), t = p[i];
        p[i] = p[j], p[j] = t;
    }
    return p;
}

/* ---- Pool comparison ---------------------------------------------------------------------- */

static void describe(const mkv_page_layout_t *lay, int64_t off, char *buf, size_t len)
{
    static const char *names[MKV_PAGE_SEGMENTS] = {"key codes", "key metadata", "value codes",
                                                   "value metadata", "score", "position"};
    if (!lay) {
        snprintf(buf, len, "page not used by the test");
        return;
    }
    for (int s = 0; s < MKV_PAGE_SEGMENTS; s++) {
        if (off < lay->offset[s] || off >= lay->offset[s] + lay->bytes[s]) continue;
        const int64_t in = off - lay->offset[s];
        if (s == MKV_SEG_KEY || s == MKV_SEG_VALUE) {
            const int32_t cb = s == MKV_SEG_KEY ? lay->key.chunk_bytes : lay->value.chunk_bytes;
            const int64_t idx = in / cb;
            snprintf(buf, len, "%s, token slot %lld, chunk %lld, byte %lld", names[s],
                     (long long)(idx % lay->tokens), (long long)(idx / lay->tokens), (long long)(in % cb));
        } else if (s == MKV_SEG_KEY_META || s == MKV_SEG_VALUE_META) {
            const int64_t idx = in / 4;
            snprintf(buf, len, "%s, token slot %lld, group %lld, %s byte %lld", names[s],
                     (long long)(idx % lay->tokens), (long long)(idx / lay->tokens),
                     in % 4 < 2 ? "scale" : "zero", (long long)(in % 2));
        } else {
            snprintf(buf, len, "%s, token slot %lld", names[s], (long long)(in / 4));
        }
        return;
    }
    snprintf(buf, len, "padding between segments");
}

/* Number of differing bytes; the first few printed with page, segment and token slot. */
static int64_t compare_pools(const uint8_t *want, const uint8_t *got, int64_t n_pages, int64_t page_bytes,
                             const mkv_page_layout_t *const *lay_of, const char *label)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n_pages * page_bytes; i++) {
        if (want[i] == got[i]) continue;
        if (bad++ < 5) {
            char where[160];
            describe(lay_of[i / page_bytes], i % page_bytes, where, sizeof where);
            fprintf(stderr, "%s: page %lld byte %lld (%s): CPU %02x, GPU %02x\n", label,
                    (long long)(i / page_bytes), (long long)(i % page_bytes), where, want[i], got[i]);
        }
    }
    if (bad) fprintf(stderr, "%s: %lld bytes differ\n", label, (long long)bad);
    return bad;
}

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CUDA_CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void make_layout(mkv_format_t f, int32_t d, int32_t kg, int32_t vg, int32_t tpp,
                        int64_t *page_bytes, mkv_page_layout_t *lay)
{
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_page_bytes_for(f, d, kg, vg, tpp, page_bytes), OK, "%s", mkv_last_error());
    cr_assert_eq(mkv_page_layout(f, d, kg, vg, *page_bytes, lay, err), OK, "%s", err);
}

/* ---- Append: one call on the GPU against mkv_page_write_token ----------------------------- */

typedef struct append_case {
    mkv_format_t format;
    int32_t d, kg, vg, tpp, n_tok, n_heads; /* kg, vg: elements per key / value group */
    int kind;
} append_case_t;

/* Returns differing bytes; *sanitised gets the CPU's count of sanitised elements. */
static int64_t run_append(const append_case_t *c, uint64_t *rng, int64_t *sanitised)
{
    int64_t page_bytes;
    mkv_page_layout_t lay;
    make_layout(c->format, c->d, c->kg, c->vg, c->tpp, &page_bytes, &lay);
    const int bf16 = is_bf16_kind(c->kind);
    const int32_t d = c->d, T = lay.tokens;
    const int64_t jobs = (int64_t)c->n_tok * c->n_heads;
    const int64_t n_pages = (jobs + T - 1) / T + 2, pool_bytes = n_pages * page_bytes;

    /* shuffled, distinct (page, slot) pairs: neither pages nor slots in order */
    int64_t *perm = shuffled(n_pages * T, rng);
    int32_t *page = malloc((size_t)jobs * 4), *slot = malloc((size_t)jobs * 4);
    int32_t *pos = malloc((size_t)c->n_tok * 4 + 4);
    uint16_t *k = malloc((size_t)jobs * d * 2), *v = malloc((size_t)jobs * d * 2);
    float *kf = malloc((size_t)d * 4), *vf = malloc((size_t)d * 4);
    uint8_t *want = malloc((size_t)pool_bytes), *got = malloc((size_t)pool_bytes);
    cr_assert(page && slot && pos && k && v && kf && vf && want && got);
    for (int64_t j = 0; j < jobs; j++) {
        page[j] = (int32_t)(perm[j] / T), slot[j] = (int32_t)(perm[j] % T);
        fill_vector(k + j * d, d, lay.key.groups, lay.key.bits, c->kind, rng);
        fill_vector(v + j * d, d, lay.value.groups, lay.value.bits, c->kind, rng);
    }
    for (int32_t i = 0; i < c->n_tok; i++) pos[i] = (int32_t)test_rand_next(rng);
    const float score = rand_unit(rng) * 1000.0f;

    memset(want, POISON, (size_t)pool_bytes);
    *sanitised = 0;
    for (int64_t j = 0; j < jobs; j++) {
        for (int32_t i = 0; i < d; i++) kf[i] = in_to_f32(k[j * d + i], bf16), vf[i] = in_to_f32(v[j * d + i], bf16);
        *sanitised += mkv_page_write_token(want + page[j] * page_bytes, &lay, slot[j], kf, vf, score,
                                           pos[j / c->n_heads]);
    }

    mkv_cuda_append_t a = {0};
    a.k = dev_copy(k, (size_t)jobs * d * 2), a.v = dev_copy(v, (size_t)jobs * d * 2);
    a.is_bf16 = bf16, a.n_tok = c->n_tok, a.n_heads = c->n_heads;
    a.page = dev_copy(page, (size_t)jobs * 4), a.slot = dev_copy(slot, (size_t)jobs * 4);
    a.pos = dev_copy(pos, (size_t)c->n_tok * 4);
    a.score = score, a.page_bytes = page_bytes, a.lay = lay;
    CUDA_CHECK(cudaMalloc((void **)&a.pool, (size_t)pool_bytes));
    CUDA_CHECK(cudaMemset(a.pool, POISON, (size_t)pool_bytes));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    char err[MKV_ERR_LEN] = "";
    const mkv_status_t st = mkv_cuda_quant_append(&a, stream, err);
    cr_assert_eq(st, OK, "mkv_cuda_quant_append: %s (%s)", mkv_status_string(st), err);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(got, a.pool, (size_t)pool_bytes, cudaMemcpyDeviceToHost));

    char label[128];
    snprintf(label, sizeof label, "%s d=%d groups=%d/%d tokens/page=%d %s%s",
             mkv_format_name(c->format), d, lay.key.group_elems, lay.value.group_elems, T,
             bf16 ? "bf16" : "fp16",
             c->kind == IN_F16_NONFINITE || c->kind == IN_BF16_NONFINITE ? " non-finite" : "");
    const mkv_page_layout_t **lay_of = malloc((size_t)n_pages * sizeof *lay_of);
    cr_assert(lay_of);
    for (int64_t p = 0; p < n_pages; p++) lay_of[p] = &lay;
    const int64_t bad = compare_pools(want, got, n_pages, page_bytes, lay_of, label);

    cudaStreamDestroy(stream);
    cudaFree((void *)a.k), cudaFree((void *)a.v), cudaFree((void *)a.page), cudaFree((void *)a.slot);
    cudaFree((void *)a.pos), cudaFree(a.pool);
    free(perm), free(page), free(slot), free(pos), free(k), free(v), free(kf), free(vf);
    free(want), free(got), free(lay_of);
    return bad;
}

/* Every format x d x groups, 97 tokens x 3 heads per call, pages of a few tokens. */
static void append_sweep(int kind, uint64_t seed, int64_t *sanitised)
{
    uint64_t rng = seed;
    int64_t bad = 0, cases = 0;
    *sanitised = 0;
    for (int f = 0; f < MKV_FORMAT_COUNT; f++)
        for (size_t di = 0; di < sizeof k_dims / sizeof *k_dims; di++)
            for (size_t gi = 0; gi < sizeof k_groups / sizeof *k_groups; gi++) {
                /* high or low pair of the row, alternately */
                const int32_t *g = k_groups[gi] + 2 * ((f + (int)di) % 2);
                const append_case_t c = {(mkv_format_t)f, k_dims[di], g[0], g[1],
                                         k_tpp[test_rand_range(&rng, 0, 4)], 97, 3, kind};
                int64_t s = 0;
                const int64_t b = run_append(&c, &rng, &s);
                bad += b, cases += b != 0, *sanitised += s;
            }
    cr_assert_eq(bad, 0, "%lld bytes differ in %lld configurations (first ones above)", (long long)bad,
                 (long long)cases);
}

Test(gpu_quant, append_fp16_every_format)
{
    GPU_REQUIRE();
    int64_t s;
    append_sweep(IN_F16, 0x51u, &s);
    cr_assert_eq(s, 0, "finite fp16 input needs no sanitising");
}

Test(gpu_quant, append_bf16_every_format)
{
    GPU_REQUIRE();
    int64_t s;
    append_sweep(IN_BF16, 0xbf16u, &s);
}

Test(gpu_quant, append_nonfinite_sanitised_like_cpu)
{
    GPU_REQUIRE();
    int64_t s16, sbf;
    append_sweep(IN_F16_NONFINITE, 0x7c00u, &s16);
    append_sweep(IN_BF16_NONFINITE, 0x7f80u, &sbf);
    cr_assert(s16 > 0 && sbf > 0, "the inputs were meant to need sanitising (%lld, %lld)",
              (long long)s16, (long long)sbf);
}

/* Page size 1, and more jobs than the grid has warps (the grid-stride loop). */
Test(gpu_quant, append_page_of_one_token_and_grid_stride)
{
    GPU_REQUIRE();
    uint64_t rng = 0x1u;
    int64_t s;
    const append_case_t one = {MKV_FORMAT_K4V2, 64, 32, 16, 1, 37, 5, IN_F16};
    cr_assert_eq(run_append(&one, &rng, &s), 0);
    const append_case_t big = {MKV_FORMAT_K8V4, 16, 256, 16, 32, 100003, 3, IN_F16};
    cr_assert_eq(run_append(&big, &rng, &s), 0);
}

/* ---- Demotion: mkv_cuda_demote against mkv_page_demote_token ----------------------------- */

/* groups: elements per group of the source's keys and values, then the destination's. */
static int64_t run_demote(mkv_format_t from, mkv_format_t to, int32_t d, const int32_t *groups,
                          int32_t tpp, int32_t n, uint64_t *rng)
{
    int64_t page_bytes;
    mkv_page_layout_t src, dst;
    char err[MKV_ERR_LEN] = "";
    make_layout(from, d, groups[0], groups[1], tpp, &page_bytes, &src);
    cr_assert_eq(mkv_page_layout(to, d, groups[2], groups[3], page_bytes, &dst, err), OK, "%s", err);
    const int64_t n_src = (n + src.tokens - 1) / src.tokens + 1, n_dst = (n + dst.tokens - 1) / dst.tokens + 1;
    const int64_t n_pages = n_src + n_dst + 2, pool_bytes = n_pages * page_bytes;
    /* page roles shuffled: the first n_src of the permutation hold sources, then destinations */
    int64_t *role = shuffled(n_pages, rng), *sp = shuffled(n_src * src.tokens, rng);
    int64_t *dp = shuffled(n_dst * dst.tokens, rng);
    const mkv_page_layout_t **lay_of = calloc((size_t)n_pages, sizeof *lay_of);
    int32_t *ids = malloc((size_t)n * 16);
    uint16_t *bits = malloc((size_t)d * 2);
    float *k = malloc((size_t)d * 4), *v = malloc((size_t)d * 4), *scratch = malloc((size_t)d * 8);
    uint8_t *want = malloc((size_t)pool_bytes), *got = malloc((size_t)pool_bytes);
    cr_assert(lay_of && ids && bits && k && v && scratch && want && got);
    for (int64_t p = 0; p < n_src + n_dst; p++) lay_of[role[p]] = p < n_src ? &src : &dst;
    int32_t *src_page = ids, *src_slot = ids + n, *dst_page = ids + 2 * n, *dst_slot = ids + 3 * n;

    memset(want, POISON, (size_t)pool_bytes);
    for (int32_t i = 0; i < n; i++) {
        src_page[i] = (int32_t)role[sp[i] / src.tokens], src_slot[i] = (int32_t)(sp[i] % src.tokens);
        dst_page[i] = (int32_t)role[n_src + dp[i] / dst.tokens], dst_slot[i] = (int32_t)(dp[i] % dst.tokens);
        const int kind = test_rand_range(rng, 0, 3), bf16 = is_bf16_kind(kind);
        fill_vector(bits, d, src.key.groups, src.key.bits, kind, rng);
        for (int32_t e = 0; e < d; e++) k[e] = in_to_f32(bits[e], bf16);
        fill_vector(bits, d, src.value.groups, src.value.bits, kind, rng);
        for (int32_t e = 0; e < d; e++) v[e] = in_to_f32(bits[e], bf16);
        mkv_page_write_token(want + src_page[i] * page_bytes, &src, src_slot[i], k, v,
                             rand_unit(rng) * 50.0f, (int32_t)test_rand_next(rng));
    }
    uint8_t *pool = dev_copy(want, (size_t)pool_bytes); /* the same starting pool on both sides */
    int32_t *d_ids = dev_copy(ids, (size_t)n * 16);
    for (int32_t i = 0; i < n; i++)
        mkv_page_demote_token(want + dst_page[i] * page_bytes, &dst, dst_slot[i],
                              want + src_page[i] * page_bytes, &src, src_slot[i], scratch);
    const mkv_status_t st = mkv_cuda_demote(pool, page_bytes, &src, &dst, n, d_ids, d_ids + n,
                                            d_ids + 2 * n, d_ids + 3 * n, NULL, err);
    cr_assert_eq(st, OK, "mkv_cuda_demote: %s (%s)", mkv_status_string(st), err);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(got, pool, (size_t)pool_bytes, cudaMemcpyDeviceToHost));

    char label[128];
    snprintf(label, sizeof label, "demote %s -> %s d=%d groups=%d/%d -> %d/%d",
             mkv_format_name(from), mkv_format_name(to), d, src.key.group_elems,
             src.value.group_elems, dst.key.group_elems, dst.value.group_elems);
    const int64_t bad = compare_pools(want, got, n_pages, page_bytes, lay_of, label);
    cudaFree(pool), cudaFree(d_ids);
    free(role), free(sp), free(dp), free(lay_of), free(ids), free(bits), free(k), free(v);
    free(scratch), free(want), free(got);
    return bad;
}

Test(gpu_quant, demote_matches_cpu)
{
    GPU_REQUIRE();
    static const mkv_format_t pairs[][2] = {{MKV_FORMAT_K8V4, MKV_FORMAT_K4V2},
                                            {MKV_FORMAT_K8V8, MKV_FORMAT_K4V4},
                                            {MKV_FORMAT_K16V16, MKV_FORMAT_K8V2},
                                            {MKV_FORMAT_K4V8, MKV_FORMAT_K2V4}};
    uint64_t rng = 0xde307eu;
    int64_t bad = 0;
    for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++)
        for (size_t di = 0; di < sizeof k_dims / sizeof *k_dims; di++)
            for (size_t gi = 0; gi < sizeof k_groups / sizeof *k_groups; gi++)
                bad += run_demote(pairs[p][0], pairs[p][1], k_dims[di], k_groups[gi],
                                  k_tpp[test_rand_range(&rng, 0, 4)], 150, &rng);
    cr_assert_eq(bad, 0, "%lld bytes differ (first ones above)", (long long)bad);
}

/* ---- Arguments: refused before any CUDA call, so no device is needed ---------------------- */

#define EXPECT_INVALID(call, what)                                                             \
    do {                                                                                       \
        err[0] = '\0';                                                                         \
        const mkv_status_t st_ = (call);                                                       \
        cr_expect_eq(st_, MKV_STATUS_INVALID_ARGUMENT, "%s: got %s (%s)", what,                \
                     mkv_status_string(st_), err);                                             \
        cr_expect(err[0] != '\0', "%s: no message", what);                                     \
    } while (0)

Test(gpu_quant_args, bad_arguments_refused_without_a_device)
{
    char err[MKV_ERR_LEN];
    int64_t pb;
    mkv_page_layout_t hi, lo, lay;
    make_layout(MKV_FORMAT_K8V4, 128, 256, 256, 8, &pb, &hi);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K4V2, 128, 256, 256, pb, &lo, err), OK, "%s", err);
    /* never dereferenced: every call below must fail on the host */
    static uint8_t fake[64];
    const uint16_t *fk = (const uint16_t *)(void *)fake;
    const int32_t *fi = (const int32_t *)(void *)fake;
    const mkv_cuda_append_t good = {fk, fk, 0, 4, 2, fi, fi, fi, 0.0f, fake, pb, hi};
    mkv_cuda_append_t a;

    EXPECT_INVALID(mkv_cuda_quant_append(NULL, NULL, err), "NULL arguments");
    a = good, a.n_tok = -1;
    EXPECT_INVALID(mkv_cuda_quant_append(&a, NULL, err), "n_tok < 0");
    a = good, a.n_heads = -3;
    EXPECT_INVALID(mkv_cuda_quant_append(&a, NULL, err), "n_heads < 0");
    a = good, a.k = NULL;
    EXPECT_INVALID(mkv_cuda_quant_append(&a, NULL, err), "null k");
    a = good, a.slot = NULL;
    EXPECT_INVALID(mkv_cuda_quant_append(&a, NULL, err), "null slot");
    a = good, a.pool = NULL;
    EXPECT_INVALID(mkv_cuda_quant_append(&a, NULL, err), "null pool");
    a = good, a.lay.head_dim = 512;
    EXPECT_INVALID(mkv_cuda_quant_append(&a, NULL, err), "d > 256");
    a = good, a.lay.key.groups = 2;
    EXPECT_INVALID(mkv_cuda_quant_append(&a, NULL, err), "key groups mismatching the layout");
    a = good, a.lay.key.bits = 3;
    EXPECT_INVALID(mkv_cuda_quant_append(&a, NULL, err), "3-bit keys");
    a = good, a.page_bytes = pb / 2;
    EXPECT_INVALID(mkv_cuda_quant_append(&a, NULL, err), "layout for a larger page");
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K8V4, 64, 256, 256, pb, &lay, err), OK, "%s", err);
    a = good, a.lay = lay, a.lay.head_dim = 128;
    EXPECT_INVALID(mkv_cuda_quant_append(&a, NULL, err), "head_dim not the layout's");
    a = good, a.k = NULL;
    cr_expect_eq(mkv_cuda_quant_append(&a, NULL, NULL), MKV_STATUS_INVALID_ARGUMENT, "err may be NULL");

    uint8_t *pool = fake;
    EXPECT_INVALID(mkv_cuda_demote(pool, pb, &hi, &lo, -1, fi, fi, fi, fi, NULL, err), "n < 0");
    EXPECT_INVALID(mkv_cuda_demote(NULL, pb, &hi, &lo, 3, fi, fi, fi, fi, NULL, err), "null pool");
    EXPECT_INVALID(mkv_cuda_demote(pool, pb, NULL, &lo, 3, fi, fi, fi, fi, NULL, err), "null src");
    EXPECT_INVALID(mkv_cuda_demote(pool, pb, &hi, &lo, 3, fi, NULL, fi, fi, NULL, err), "null src_slot");
    EXPECT_INVALID(mkv_cuda_demote(pool, pb, &hi, &lo, 3, fi, fi, fi, NULL, NULL, err), "null dst_slot");
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K4V2, 64, 256, 256, pb, &lay, err), OK, "%s", err);
    EXPECT_INVALID(mkv_cuda_demote(pool, pb, &hi, &lay, 3, fi, fi, fi, fi, NULL, err), "head dims differ");
    lay = lo, lay.value.group_elems = 64;
    EXPECT_INVALID(mkv_cuda_demote(pool, pb, &hi, &lay, 3, fi, fi, fi, fi, NULL, err), "bad dst groups");
    lay = lo, lay.key.group_elems = 8, lay.key.groups = 16;
    EXPECT_INVALID(mkv_cuda_demote(pool, pb, &hi, &lay, 3, fi, fi, fi, fi, NULL, err), "8-element groups");

    /* empty calls are valid and launch nothing */
    a = good, a.n_tok = 0;
    cr_expect_eq(mkv_cuda_quant_append(&a, NULL, err), OK, "%s", err);
    cr_expect_eq(mkv_cuda_demote(pool, pb, &hi, &lo, 0, NULL, NULL, NULL, NULL, NULL, err), OK, "%s", err);
}
