/*
 * test_gguf.c — the GGUF reader (runner/gguf.c), the dequantizers (runner/gguf_dequant.c) and
 * the GGUF model loader (runner/model_gguf.c), with the quantized blocks it keeps for the packed
 * weights.
 *
 * A small GGUF writer here builds synthetic files, so every refusal is tested without the
 * fixture: truncation at every byte of the header and metadata (then sampled through the data),
 * huge counts and lengths, bad magic / version / type ids, hostile shapes, misaligned,
 * out-of-bounds and overlapping tensors, FIFOs and folders. The dequantizers are checked on
 * blocks written byte by byte here, against values worked out from the format definitions.
 * With the fixture (models/smollm2-135m-instruct, skipped when absent): the metadata, the
 * derived config, logits against a float64 reference (tests/fixtures/smollm2_reference.py)
 * and the README's greedy answer.
 */
#include "common/error.h"
#include "runner/gguf.h"
#include "runner/model.h"
#include "quant/half.h"

#include "testutil.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MIXKV_MODELS_DIR
#error "define MIXKV_MODELS_DIR (the project's models/ folder)"
#endif
#ifndef MIXKV_FIXTURES_DIR
#error "define MIXKV_FIXTURES_DIR (tests/fixtures)"
#endif
#define SMOL MIXKV_MODELS_DIR "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"

#define REQUIRE_SMOL()                                                                         \
    do {                                                                                       \
        if (access(SMOL, R_OK) != 0)                                                           \
            cr_skip_test("SmolLM2 GGUF not found at " SMOL " (scripts/fetch-smollm2.sh)");     \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* A GGUF writer                                                                            */
/* ---------------------------------------------------------------------------------------- */

typedef struct gbuf {
    uint8_t *p;
    size_t n, cap;
} gbuf_t;

static void gb_put(gbuf_t *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert_not_null(b->p);
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void gb_le(gbuf_t *b, uint64_t v, int n)
{
    uint8_t t[8];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    gb_put(b, t, (size_t)n);
}
static void gb_u32(gbuf_t *b, uint32_t v) { gb_le(b, v, 4); }
static void gb_u64(gbuf_t *b, uint64_t v) { gb_le(b, v, 8); }
static void gb_f32(gbuf_t *b, float f) { gb_u32(b, mkv_f32_bits(f)); }
static void gb_str(gbuf_t *b, const char *s)
{
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}

typedef struct gw {
    gbuf_t kv, ti, data;
    uint64_t n_kv, n_t;
    uint64_t align;
} gw_t;

static void gw_init(gw_t *w)
{
    memset(w, 0, sizeof *w);
    w->align = 32;
}

static void gw_free(gw_t *w)
{
    free(w->kv.p), free(w->ti.p), free(w->data.p);
}

static void gw_key(gw_t *w, const char *key, uint32_t type)
{
    gb_str(&w->kv, key);
    gb_u32(&w->kv, type);
    w->n_kv++;
}
static void gw_u32(gw_t *w, const char *k, uint32_t v) { gw_key(w, k, MKV_GGUF_U32), gb_u32(&w->kv, v); }
static void gw_f32(gw_t *w, const char *k, float v) { gw_key(w, k, MKV_GGUF_F32), gb_f32(&w->kv, v); }
static void gw_s(gw_t *w, const char *k, const char *v) { gw_key(w, k, MKV_GGUF_STRING), gb_str(&w->kv, v); }

static void gw_tensor(gw_t *w, const char *name, uint32_t type, int nd, const int64_t *ne,
                      const void *data, size_t nbytes)
{
    static const uint8_t zero[64];
    while (w->data.n % w->align) gb_put(&w->data, zero, 1);
    gb_str(&w->ti, name);
    gb_u32(&w->ti, (uint32_t)nd);
    for (int d = 0; d < nd; d++) gb_u64(&w->ti, (uint64_t)ne[d]);
    gb_u32(&w->ti, type);
    gb_u64(&w->ti, w->data.n);
    gb_put(&w->data, data, nbytes);
    w->n_t++;
}

/* The file: header, kvs, tensor infos, padding, data (the last tensor ends the file). */
static uint8_t *gw_file(const gw_t *w, uint32_t version, size_t *len)
{
    gbuf_t f = {0};
    gb_put(&f, "GGUF", 4);
    gb_u32(&f, version);
    gb_u64(&f, w->n_t);
    gb_u64(&f, w->n_kv);
    gb_put(&f, w->kv.p, w->kv.n);
    gb_put(&f, w->ti.p, w->ti.n);
    while (f.n % w->align) gb_put(&f, "", 1);
    gb_put(&f, w->data.p, w->data.n);
    *len = f.n;
    return f.p;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void tmp_path(char *out, size_t len, const char *tag)
{
    snprintf(out, len, "/tmp/mixkv_gguf_%d_%s.gguf", (int)getpid(), tag);
}

/* Writes bytes to a temp file and expects mkv_gguf_open to refuse it with want and a message
 * containing needle; then mkv_model_load must refuse it too. */
static void expect_refused(const char *tag, const void *bytes, size_t len, mkv_status_t want,
                           const char *needle)
{
    char path[256], err[MKV_ERR_LEN];
    tmp_path(path, sizeof path, tag);
    write_file(path, bytes, len);
    mkv_gguf_t *g = (mkv_gguf_t *)1;
    mkv_status_t st = mkv_gguf_open(path, &g, err);
    cr_expect_eq(st, want, "%s: got '%s' (%s), expected '%s'", tag, mkv_status_string(st), err,
                 mkv_status_string(want));
    cr_expect_null(g, "%s", tag);
    cr_expect(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", tag, err, needle);
    mkv_model_t *m = (mkv_model_t *)1;
    cr_expect_neq(mkv_model_load(path, &m, err), MKV_STATUS_OK, "%s: model loaded", tag);
    cr_expect_null(m);
    unlink(path);
}

/* ---------------------------------------------------------------------------------------- */
/* Dequantization, on blocks written by hand                                                */
/* ---------------------------------------------------------------------------------------- */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

Test(gguf, dequant_f32_f16_bf16)
{
    const float f[3] = {1.5f, -0.0f, 3e-38f};
    float out[8];
    mkv_dequant_f32(f, out, 3);
    cr_expect(memcmp(out, f, sizeof f) == 0);
    /* fp16: 1, -2, 1/3 rounded (0x3555 = 1 + 341/1024 times 2^-2), the smallest subnormal,
     * the largest finite, -inf. */
    uint8_t h[12];
    const uint16_t hv[6] = {0x3c00, 0xc000, 0x3555, 0x0001, 0x7bff, 0xfc00};
    for (int i = 0; i < 6; i++) put16(h + 2 * i, hv[i]);
    mkv_dequant_f16(h, out, 6);
    cr_expect_eq(out[0], 1.0f);
    cr_expect_eq(out[1], -2.0f);
    cr_expect_eq(out[2], 0.333251953125f);
    cr_expect_eq(out[3], ldexpf(1.0f, -24));
    cr_expect_eq(out[4], 65504.0f);
    cr_expect(isinf(out[5]) && out[5] < 0);
    /* bf16: the top half of the fp32 bits. */
    const uint16_t bv[4] = {0x3f80, 0xc0a0, 0x4049, 0x0001};
    for (int i = 0; i < 4; i++) put16(h + 2 * i, bv[i]);
    mkv_dequant_bf16(h, out, 4);
    cr_expect_eq(out[0], 1.0f);
    cr_expect_eq(out[1], -5.0f);
    cr_expect_eq(out[2], 3.140625f);
    cr_expect_eq(out[3], mkv_bits_f32(0x00010000u));
}

Test(gguf, dequant_q8_0_q4_0_q4_1)
{
    uint8_t b[2 * 34];
    float out[64];
    /* Q8_0, two blocks: d = 0.5 (0x3800), q = j - 16; then d = -2 (0xc000), q = -128 .. */
    put16(b, 0x3800);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j - 16);
    put16(b + 34, 0xc000);
    for (int j = 0; j < 32; j++) b[36 + j] = (uint8_t)(int8_t)(j == 0 ? -128 : 127 - j);
    mkv_dequant_q8_0(b, out, 64);
    for (int j = 0; j < 32; j++) cr_expect_eq(out[j], 0.5f * (float)(j - 16), "q8_0 %d", j);
    cr_expect_eq(out[32], 256.0f);
    cr_expect_eq(out[33], -252.0f);
    cr_expect_eq(out[63], -192.0f);

    /* Q4_0: d = 2 (0x4000); byte j = (j) | (15 - j) << 4: weight j = 2 (j - 8), weight j + 16
     * = 2 (15 - j - 8). */
    put16(b, 0x4000);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    mkv_dequant_q4_0(b, out, 32);
    cr_expect_eq(out[0], -16.0f);
    cr_expect_eq(out[15], 14.0f);
    cr_expect_eq(out[16], 14.0f);
    cr_expect_eq(out[31], -16.0f);
    for (int j = 0; j < 16; j++) {
        cr_expect_eq(out[j], 2.0f * (float)(j - 8));
        cr_expect_eq(out[j + 16], 2.0f * (float)(7 - j));
    }

    /* Q4_1: d = 0.25 (0x3400), m = -1 (0xbc00), same nibbles: w = q / 4 - 1. */
    put16(b, 0x3400);
    put16(b + 2, 0xbc00);
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | (15 - j) << 4);
    mkv_dequant_q4_1(b, out, 32);
    cr_expect_eq(out[0], -1.0f);
    cr_expect_eq(out[15], 2.75f);
    cr_expect_eq(out[16], 2.75f);
    cr_expect_eq(out[31], -1.0f);
    for (int j = 0; j < 16; j++) {
        cr_expect_eq(out[j], 0.25f * (float)j - 1.0f);
        cr_expect_eq(out[j + 16], 0.25f * (float)(15 - j) - 1.0f);
    }
}

Test(gguf, dequant_q4_k)
{
    /* d = 1, dmin = 0.5; sub-block s has 6-bit scale sc[s] and min mn[s]; s >= 4 store their low
     * 4 bits in bytes 8..11 (scale low nibble, min high nibble) and their top 2 bits in the top
     * of bytes s-4 (scale) and s (min). */
    static const int sc[8] = {1, 2, 3, 63, 17, 33, 48, 5};
    static const int mn[8] = {0, 4, 10, 62, 20, 40, 63, 1};
    uint8_t b[144] = {0};
    put16(b, 0x3c00);
    put16(b + 2, 0x3800);
    uint8_t *s = b + 4, *qs = b + 16;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    for (int k = 0; k < 128; k++) qs[k] = (uint8_t)(k * 7);
    float out[256];
    mkv_dequant_q4_k(b, out, 256);
    /* Weight i: sub-block i / 32; pair p = i / 64 reads qs[32p .. 32p+31], low nibbles for the
     * first 32, high for the next. */
    for (int i = 0; i < 256; i++) {
        const int sb = i / 32, byte = qs[32 * (i / 64) + i % 32];
        const int q = sb % 2 ? byte >> 4 : byte & 15;
        const float want = 1.0f * (float)sc[sb] * (float)q - 0.5f * (float)mn[sb];
        cr_expect_eq(out[i], want, "q4_k %d: %g, expected %g", i, (double)out[i], (double)want);
    }
    /* Worked by hand: weight 0: qs[0] = 0, sub-block 0: 1*1*0 - 0.5*0 = 0. Weight 33: qs[1] =
     * 7, high nibble 0, sub-block 1: 0 - 0.5*4 = -2. Weight 200: sub-block 6 (48, 63), byte
     * qs[96 + 8] = 104*7 mod 256 = 216 = 0xd8, low nibble 8: 48*8 - 31.5 = 352.5. Weight 255:
     * sub-block 7 (5, 1), qs[127] = 889 mod 256 = 121 = 0x79, high nibble 7: 35 - 0.5. */
    cr_expect_eq(out[0], 0.0f);
    cr_expect_eq(out[33], -2.0f);
    cr_expect_eq(out[200], 352.5f);
    cr_expect_eq(out[255], 34.5f);
}

Test(gguf, dequant_q6_k)
{
    /* d = 0.5 at byte 208; scales[16] = -8 .. 7; 6-bit q[i] = 37 i mod 64. In each half of 128,
     * weight l + 32k (l < 32) keeps its low 4 bits in ql[l + 32 (k & 1)] (low nibble for k < 2,
     * high for k >= 2) and its top 2 bits in bits 2k, 2k+1 of qh[l]. */
    uint8_t b[210] = {0};
    int q[256];
    for (int i = 0; i < 256; i++) q[i] = (37 * i) % 64;
    for (int h = 0; h < 2; h++) {
        uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int *qq = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((qq[l] & 15) | (qq[l + 64] & 15) << 4);
            ql[l + 32] = (uint8_t)((qq[l + 32] & 15) | (qq[l + 96] & 15) << 4);
            qh[l] = (uint8_t)(qq[l] >> 4 | (qq[l + 32] >> 4) << 2 | (qq[l + 64] >> 4) << 4 |
                              (qq[l + 96] >> 4) << 6);
        }
    }
    for (int i = 0; i < 16; i++) b[192 + i] = (uint8_t)(int8_t)(i - 8);
    put16(b + 208, 0x3800);
    float out[256];
    mkv_dequant_q6_k(b, out, 256);
    for (int i = 0; i < 256; i++) {
        const float want = 0.5f * (float)(i / 16 - 8) * (float)(q[i] - 32);
        cr_expect_eq(out[i], want, "q6_k %d: %g, expected %g", i, (double)out[i], (double)want);
    }
    /* By hand: weight 0: 0.5 * -8 * (0 - 32) = 128; weight 255: q = 9435 mod 64 = 27, scale 7:
     * 0.5 * 7 * -5 = -17.5; weight 130: q = 4810 mod 64 = 10, scale 0: -0. */
    cr_expect_eq(out[0], 128.0f);
    cr_expect_eq(out[255], -17.5f);
    cr_expect_eq(out[130], 0.0f);
}

Test(gguf, dequantize_dispatch)
{
    char err[MKV_ERR_LEN];
    float out[32];
    uint8_t b[34] = {0};
    cr_expect_eq(mkv_ggml_dequantize(MKV_GGML_Q8_0, b, out, 32, err), MKV_STATUS_OK);
    cr_expect_eq(mkv_ggml_dequantize(MKV_GGML_Q8_0, b, out, 31, err), MKV_STATUS_UNSUPPORTED);
    cr_expect(strstr(err, "Q8_0"), "%s", err);
    cr_expect_eq(mkv_ggml_dequantize(6, b, out, 32, err), MKV_STATUS_UNSUPPORTED);
    cr_expect(strstr(err, "Q5_0"), "%s", err);
    cr_expect_eq(mkv_ggml_dequantize(1000, b, out, 32, err), MKV_STATUS_UNSUPPORTED);
    int64_t be, bb;
    cr_expect(mkv_ggml_block(MKV_GGML_Q4_K, &be, &bb) && be == 256 && bb == 144);
    cr_expect(mkv_ggml_block(MKV_GGML_Q6_K, &be, &bb) && be == 256 && bb == 210);
    cr_expect(mkv_ggml_block(MKV_GGML_Q4_1, &be, &bb) && be == 32 && bb == 20);
    cr_expect(!mkv_ggml_block(99, &be, &bb));
}

/* ---------------------------------------------------------------------------------------- */
/* Synthetic files                                                                          */
/* ---------------------------------------------------------------------------------------- */

typedef struct rng {
    uint64_t s;
} rng_t;

static uint64_t rnd(rng_t *r)
{
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return r->s >> 11;
}

static float rndf(rng_t *r) { return (float)((double)(rnd(r) % 2000001) / 1e6 - 1.0); }

/* n weights of `type` as random blocks whose fp16 scales are small finite numbers. */
static uint8_t *rand_tensor(uint32_t type, int64_t n, size_t *nbytes, rng_t *r)
{
    int64_t be, bb;
    cr_assert(mkv_ggml_block(type, &be, &bb));
    const int64_t nb = n / be;
    uint8_t *p = tu_xcalloc((size_t)(nb * bb), 1);
    *nbytes = (size_t)(nb * bb);
    for (int64_t i = 0; i < nb * bb; i++) p[i] = (uint8_t)rnd(r);
    for (int64_t k = 0; k < nb; k++) {
        uint8_t *blk = p + k * bb;
        const uint16_t h1 = mkv_f32_to_f16(rndf(r) * 0.05f), h2 = mkv_f32_to_f16(rndf(r) * 0.05f);
        switch (type) {
        case MKV_GGML_F32: { const float f = rndf(r); memcpy(blk, &f, 4); break; }
        case MKV_GGML_F16: put16(blk, h1); break;
        case MKV_GGML_BF16: put16(blk, (uint16_t)(mkv_f32_bits(rndf(r)) >> 16)); break;
        case MKV_GGML_Q8_0: case MKV_GGML_Q4_0: put16(blk, h1); break;
        case MKV_GGML_Q4_1: case MKV_GGML_Q4_K: put16(blk, h1), put16(blk + 2, h2); break;
        case MKV_GGML_Q6_K: put16(blk + 208, h1); break;
        default: break;
        }
    }
    return p;
}

/* A tiny llama: hidden 32, 2 layers, 2 heads of 16 over 1 KV head, FFN 256, vocab 8; weights of
 * every supported type. Options change one thing each. */
enum { SD = 32, SL = 2, SH = 2, SKV = 1, SHD = 16, SI = 256, SV = 8 };

typedef struct tiny_opts {
    const char *arch;     /* default "llama" */
    int untied;           /* write output.weight */
    const char *skip;     /* a tensor left out */
    const char *rope_scaling;
    int rope_dims;        /* llama.rope.dimension_count when > 0 */
    int bos;              /* tokenizer.ggml.bos_token_id (default 1) */
    uint32_t down_type;   /* blk.1.ffn_down type (default Q6_K) */
    int bad_shape;        /* blk.0.ffn_gate written [SI, SD] instead of [SD, SI] */
} tiny_opts_t;

static const char *const str_arr[3] = {"<s>", "", "h\xc3\xa9llo"};

static void tiny_meta(gw_t *w, const tiny_opts_t *o)
{
    gw_s(w, "general.architecture", o->arch ? o->arch : "llama");
    gw_s(w, "general.name", "tiny");
    gw_u32(w, "llama.context_length", 128);
    gw_u32(w, "llama.embedding_length", SD);
    gw_u32(w, "llama.block_count", SL);
    gw_u32(w, "llama.feed_forward_length", SI);
    gw_u32(w, "llama.attention.head_count", SH);
    gw_u32(w, "llama.attention.head_count_kv", SKV);
    gw_f32(w, "llama.rope.freq_base", 50000.0f);
    gw_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (o->rope_dims) gw_u32(w, "llama.rope.dimension_count", (uint32_t)o->rope_dims);
    if (o->rope_scaling) gw_s(w, "llama.rope.scaling.type", o->rope_scaling);
    gw_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(o->bos ? o->bos : 1));
    gw_key(w, "tokenizer.ggml.eos_token_id", MKV_GGUF_I32), gb_u32(&w->kv, 2);
    /* One of every other value type, and arrays. */
    gw_key(w, "t.u8", MKV_GGUF_U8), gb_le(&w->kv, 200, 1);
    gw_key(w, "t.i8", MKV_GGUF_I8), gb_le(&w->kv, 0x80, 1);
    gw_key(w, "t.u16", MKV_GGUF_U16), gb_le(&w->kv, 65535, 2);
    gw_key(w, "t.i16", MKV_GGUF_I16), gb_le(&w->kv, 0xfffe, 2);
    gw_key(w, "t.bool", MKV_GGUF_BOOL), gb_le(&w->kv, 1, 1);
    gw_key(w, "t.u64", MKV_GGUF_U64), gb_u64(&w->kv, 1ull << 40);
    gw_key(w, "t.i64", MKV_GGUF_I64), gb_u64(&w->kv, (uint64_t)-3);
    gw_key(w, "t.f64", MKV_GGUF_F64), gb_u64(&w->kv, 0x400921fb54442d18ull); /* pi */
    gw_key(w, "t.strs", MKV_GGUF_ARRAY), gb_u32(&w->kv, MKV_GGUF_STRING), gb_u64(&w->kv, 3);
    for (int i = 0; i < 3; i++) gb_str(&w->kv, str_arr[i]);
    gw_key(w, "t.i32s", MKV_GGUF_ARRAY), gb_u32(&w->kv, MKV_GGUF_I32), gb_u64(&w->kv, 4);
    for (int i = 0; i < 4; i++) gb_u32(&w->kv, (uint32_t)(i * 3 - 5));
    gw_key(w, "t.f32s", MKV_GGUF_ARRAY), gb_u32(&w->kv, MKV_GGUF_F32), gb_u64(&w->kv, 2);
    gb_f32(&w->kv, -0.5f), gb_f32(&w->kv, 2.25f);
    gw_key(w, "t.empty", MKV_GGUF_ARRAY), gb_u32(&w->kv, MKV_GGUF_U8), gb_u64(&w->kv, 0);
}

static void tiny_tensor(gw_t *w, const tiny_opts_t *o, const char *name, uint32_t type,
                        int64_t ne0, int64_t ne1, rng_t *r)
{
    if (o->skip && strcmp(o->skip, name) == 0) return;
    size_t nb;
    const int64_t ne[2] = {ne0, ne1};
    uint8_t *d = rand_tensor(type, ne0 * (ne1 ? ne1 : 1), &nb, r);
    gw_tensor(w, name, type, ne1 ? 2 : 1, ne, d, nb);
    free(d);
}

static uint8_t *tiny_gguf(const tiny_opts_t *o, size_t *len)
{
    gw_t w;
    gw_init(&w);
    rng_t r = {42};
    tiny_meta(&w, o);
    tiny_tensor(&w, o, "token_embd.weight", MKV_GGML_Q8_0, SD, SV, &r);
    if (o->untied) tiny_tensor(&w, o, "output.weight", MKV_GGML_F16, SD, SV, &r);
    tiny_tensor(&w, o, "output_norm.weight", MKV_GGML_F32, SD, 0, &r);
    for (int l = 0; l < SL; l++) {
        char nm[64];
#define T(suffix, type, a, b)                                                                  \
    snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, suffix);                                    \
    tiny_tensor(&w, o, nm, type, a, b, &r)
        T("attn_norm", MKV_GGML_F32, SD, 0);
        T("attn_q", l ? MKV_GGML_Q4_0 : MKV_GGML_F32, SD, SH * SHD);
        T("attn_k", MKV_GGML_F16, SD, SKV * SHD);
        T("attn_v", MKV_GGML_BF16, SD, SKV * SHD);
        T("attn_output", MKV_GGML_Q4_0, SH * SHD, SD);
        T("ffn_norm", MKV_GGML_F32, SD, 0);
        if (l == 0 && o->bad_shape) {
            T("ffn_gate", MKV_GGML_Q4_1, SI, SD);
        } else {
            T("ffn_gate", MKV_GGML_Q4_1, SD, SI);
        }
        T("ffn_up", MKV_GGML_Q8_0, SD, SI);
        T("ffn_down", l ? (o->down_type ? o->down_type : MKV_GGML_Q6_K) : MKV_GGML_Q4_K, SI, SD);
#undef T
    }
    uint8_t *f = gw_file(&w, 3, len);
    gw_free(&w);
    return f;
}

static mkv_gguf_t *open_ok(const char *path)
{
    char err[MKV_ERR_LEN];
    mkv_gguf_t *g = NULL;
    const mkv_status_t st = mkv_gguf_open(path, &g, err);
    cr_assert_eq(st, MKV_STATUS_OK, "%s: %s (%s)", path, mkv_status_string(st), err);
    return g;
}

Test(gguf, synthetic_metadata)
{
    const tiny_opts_t o = {0};
    size_t len;
    uint8_t *f = tiny_gguf(&o, &len);
    char path[256], err[MKV_ERR_LEN];
    tmp_path(path, sizeof path, "meta");
    write_file(path, f, len);
    mkv_gguf_t *g = open_ok(path);
    cr_expect_eq(mkv_gguf_version(g), 3);
    cr_expect_eq(mkv_gguf_alignment(g), 32);
    cr_expect_eq(mkv_gguf_n_tensors(g), 2 + 9 * SL, "tied: no output.weight");
    cr_expect_eq(mkv_gguf_n_kv(g), 24);
    uint32_t u;
    int32_t i;
    float x;
    int b;
    mkv_gguf_str_t s;
    cr_expect(mkv_gguf_get_u32(g, "llama.block_count", &u, err) == 0 && u == SL);
    cr_expect(mkv_gguf_get_i32(g, "t.i8", &i, err) == 0 && i == -128);
    cr_expect(mkv_gguf_get_i32(g, "t.i16", &i, err) == 0 && i == -2);
    cr_expect(mkv_gguf_get_u32(g, "t.u16", &u, err) == 0 && u == 65535);
    cr_expect(mkv_gguf_get_u32(g, "t.u8", &u, err) == 0 && u == 200);
    cr_expect(mkv_gguf_get_i32(g, "tokenizer.ggml.eos_token_id", &i, err) == 0 && i == 2);
    cr_expect(mkv_gguf_get_bool(g, "t.bool", &b, err) == 0 && b == 1);
    cr_expect(mkv_gguf_get_f32(g, "t.f64", &x, err) == 0 && x == 3.14159265f);
    cr_expect(mkv_gguf_get_f32(g, "llama.rope.freq_base", &x, err) == 0 && x == 50000.0f);
    cr_expect(mkv_gguf_get_str(g, "general.name", &s, err) == 0 && s.len == 4 &&
              memcmp(s.ptr, "tiny", 4) == 0);
    /* Type checks and ranges. */
    cr_expect_eq(mkv_gguf_get_u32(g, "t.u64", &u, err), MKV_STATUS_PARSE_ERROR);
    cr_expect(strstr(err, "t.u64") && strstr(err, "does not fit"), "%s", err);
    cr_expect_eq(mkv_gguf_get_u32(g, "t.i64", &u, err), MKV_STATUS_PARSE_ERROR);
    cr_expect_eq(mkv_gguf_get_i32(g, "t.f64", &i, err), MKV_STATUS_PARSE_ERROR);
    cr_expect(strstr(err, "f64 value where an i32"), "%s", err);
    cr_expect_eq(mkv_gguf_get_bool(g, "t.u8", &b, err), MKV_STATUS_PARSE_ERROR);
    cr_expect_eq(mkv_gguf_get_str(g, "t.strs", &s, err), MKV_STATUS_PARSE_ERROR);
    cr_expect_eq(mkv_gguf_get_f32(g, "no.such.key", &x, err), MKV_STATUS_PARSE_ERROR);
    cr_expect(strstr(err, "no.such.key is missing"), "%s", err);
    cr_expect_null(mkv_gguf_find(g, "no.such.key"));
    /* Arrays. */
    mkv_gguf_type_t et;
    uint64_t n;
    cr_expect(mkv_gguf_get_arr(g, "t.strs", &et, &n, err) == 0 && et == MKV_GGUF_STRING && n == 3);
    const mkv_gguf_kv_t *kv = mkv_gguf_find(g, "t.strs");
    for (uint64_t k = 0; k < 3; k++) {
        s = mkv_gguf_arr_str(g, kv, k);
        cr_expect(s.len == strlen(str_arr[k]) && memcmp(s.ptr, str_arr[k], s.len) == 0, "str %d", (int)k);
    }
    cr_expect_eq(mkv_gguf_arr_str(g, kv, 3).len, 0, "out of range: empty");
    int64_t v;
    double d;
    cr_expect(!mkv_gguf_arr_int(kv, 0, &v), "strings are not integers");
    kv = mkv_gguf_find(g, "t.i32s");
    for (int k = 0; k < 4; k++) cr_expect(mkv_gguf_arr_int(kv, (uint64_t)k, &v) && v == k * 3 - 5);
    cr_expect(!mkv_gguf_arr_int(kv, 4, &v));
    cr_expect(!mkv_gguf_arr_float(kv, 0, &d));
    kv = mkv_gguf_find(g, "t.f32s");
    cr_expect(mkv_gguf_arr_float(kv, 1, &d) && d == 2.25);
    cr_expect(mkv_gguf_get_arr(g, "t.empty", &et, &n, err) == 0 && et == MKV_GGUF_U8 && n == 0);
    cr_expect_eq(mkv_gguf_get_arr(g, "general.name", &et, &n, err), MKV_STATUS_PARSE_ERROR);
    /* File order is kept; keys are found by name. */
    cr_expect_str_eq(mkv_gguf_kv_at(g, 0)->key, "general.architecture");
    cr_expect_null(mkv_gguf_kv_at(g, 24));
    /* Tensors. */
    const mkv_gguf_tensor_t *t = mkv_gguf_find_tensor(g, "blk.1.ffn_down.weight");
    cr_assert_not_null(t);
    cr_expect(t->type == MKV_GGML_Q6_K && t->n_dims == 2 && t->ne[0] == SI && t->ne[1] == SD &&
              t->ne[2] == 1 && t->n_elements == SI * SD && t->nbytes == (SD * SI / 256) * 210);
    cr_expect_eq(t->offset % 32, 0);
    cr_expect_eq((const uint8_t *)t->data - (const uint8_t *)mkv_gguf_tensor_at(g, 0)->data,
                 (ptrdiff_t)t->offset, "data pointers follow the offsets");
    cr_expect_null(mkv_gguf_find_tensor(g, "blk.2.ffn_down.weight"));
    cr_expect_str_eq(mkv_gguf_tensor_at(g, 0)->name, "token_embd.weight");
    mkv_gguf_close(g);
    unlink(path);
    free(f);
}

/* Every prefix of a valid file is refused: each byte up to the data section, then every 13th. */
Test(gguf, truncated_everywhere)
{
    const tiny_opts_t o = {0};
    size_t len;
    uint8_t *f = tiny_gguf(&o, &len);
    char path[256], err[MKV_ERR_LEN];
    tmp_path(path, sizeof path, "trunc");
    write_file(path, f, len);
    /* The data section starts at the first 32-byte boundary after the tensor infos; the
     * first tensor (token_embd) is its first 34 bytes. */
    mkv_gguf_t *g = open_ok(path);
    const mkv_gguf_tensor_t *t0 = mkv_gguf_tensor_at(g, 0);
    size_t first_data = 0;
    for (size_t k = 32; k + t0->nbytes <= len && !first_data; k += 32)
        if (memcmp(f + k, t0->data, (size_t)t0->nbytes) == 0) first_data = k;
    mkv_gguf_close(g);
    cr_assert(first_data > 0);
    int tried = 0;
    for (size_t cut = 0; cut < len; cut += cut < first_data + 64 ? 1 : 13) {
        cr_assert_eq(truncate(path, (off_t)cut), 0);
        g = (mkv_gguf_t *)1;
        const mkv_status_t st = mkv_gguf_open(path, &g, err);
        cr_assert(st == MKV_STATUS_PARSE_ERROR, "cut at %zu of %zu: %s (%s)", cut, len,
                  mkv_status_string(st), err);
        cr_assert_null(g);
        cr_assert(err[0], "cut at %zu: no message", cut);
        tried++;
    }
    cr_log_info("%d truncations refused (data section at %zu of %zu bytes)", tried, first_data, len);
    unlink(path);
    free(f);
}

/* A header with counts, then raw bytes. */
static uint8_t *raw_file(gbuf_t *b, uint32_t version, uint64_t nt, uint64_t nkv)
{
    memset(b, 0, sizeof *b);
    gb_put(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, nt);
    gb_u64(b, nkv);
    return b->p;
}

static void pad_to(gbuf_t *b, size_t n) { while (b->n < n) gb_put(b, "", 1); }

Test(gguf, hostile_headers)
{
    gbuf_t b;
    raw_file(&b, 3, 0, 0);
    gb_put(&b, "GGML", 4);
    memcpy(b.p, "GGML", 4);
    expect_refused("magic", b.p, b.n, MKV_STATUS_PARSE_ERROR, "bad magic");
    free(b.p);
    raw_file(&b, 1, 0, 0);
    expect_refused("v1", b.p, b.n, MKV_STATUS_UNSUPPORTED, "version 1");
    free(b.p);
    raw_file(&b, 4, 0, 0);
    expect_refused("v4", b.p, b.n, MKV_STATUS_UNSUPPORTED, "version 4");
    free(b.p);
    raw_file(&b, 0x03000000u, 0, 0);
    expect_refused("bigendian", b.p, b.n, MKV_STATUS_UNSUPPORTED, "big-endian");
    free(b.p);
    expect_refused("short", "GGUF\3\0\0\0", 8, MKV_STATUS_PARSE_ERROR, "too short");
    expect_refused("empty", "", 0, MKV_STATUS_PARSE_ERROR, "too short");

    /* Counts far beyond what the file could hold. */
    raw_file(&b, 3, 0, 1ull << 62);
    pad_to(&b, 256);
    expect_refused("nkv", b.p, b.n, MKV_STATUS_PARSE_ERROR, "n_kv");
    free(b.p);
    raw_file(&b, 3, UINT64_MAX, 0);
    pad_to(&b, 256);
    expect_refused("ntensors", b.p, b.n, MKV_STATUS_PARSE_ERROR, "n_tensors");
    free(b.p);

    /* Key and value lengths and types. */
    raw_file(&b, 3, 0, 1);
    gb_u64(&b, UINT64_MAX);
    pad_to(&b, 64);
    expect_refused("keylen", b.p, b.n, MKV_STATUS_PARSE_ERROR, "kv[0]: key");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_str(&b, "k"), gb_u32(&b, 13), gb_u32(&b, 0);
    expect_refused("vtype", b.p, b.n, MKV_STATUS_PARSE_ERROR, "unknown value type 13");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_str(&b, "k"), gb_u32(&b, MKV_GGUF_STRING), gb_u64(&b, 1ull << 40), gb_put(&b, "abc", 3);
    expect_refused("strlen", b.p, b.n, MKV_STATUS_PARSE_ERROR, "'k': string");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_str(&b, "k"), gb_u32(&b, MKV_GGUF_ARRAY), gb_u32(&b, MKV_GGUF_U32), gb_u64(&b, 1ull << 62);
    pad_to(&b, 128); /* 2^62 * 4 wraps to 0 in 64 bits: must still be refused */
    expect_refused("arrcount", b.p, b.n, MKV_STATUS_PARSE_ERROR, "array of 4611686018427387904 u32");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_str(&b, "k"), gb_u32(&b, MKV_GGUF_ARRAY), gb_u32(&b, MKV_GGUF_STRING), gb_u64(&b, 1ull << 61);
    pad_to(&b, 128);
    expect_refused("strcount", b.p, b.n, MKV_STATUS_PARSE_ERROR, "strings");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_str(&b, "k"), gb_u32(&b, MKV_GGUF_ARRAY), gb_u32(&b, MKV_GGUF_STRING), gb_u64(&b, 2);
    gb_str(&b, "ok"), gb_u64(&b, 99), gb_put(&b, "x", 1);
    expect_refused("strelem", b.p, b.n, MKV_STATUS_PARSE_ERROR, "string 1 of 2");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_str(&b, "k"), gb_u32(&b, MKV_GGUF_ARRAY), gb_u32(&b, MKV_GGUF_ARRAY), gb_u64(&b, 1);
    gb_u32(&b, MKV_GGUF_U8), gb_u64(&b, 1), gb_put(&b, "x", 1);
    expect_refused("nested", b.p, b.n, MKV_STATUS_UNSUPPORTED, "nested arrays");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_str(&b, "k"), gb_u32(&b, MKV_GGUF_ARRAY), gb_u32(&b, 77), gb_u64(&b, 1), gb_u64(&b, 0);
    expect_refused("elemtype", b.p, b.n, MKV_STATUS_PARSE_ERROR, "element type 77");
    free(b.p);
    raw_file(&b, 3, 0, 2);
    gb_str(&b, "k"), gb_u32(&b, MKV_GGUF_U8), gb_put(&b, "a", 1);
    gb_str(&b, "k"), gb_u32(&b, MKV_GGUF_U8), gb_put(&b, "b", 1);
    expect_refused("dupkey", b.p, b.n, MKV_STATUS_PARSE_ERROR, "'k' appears twice");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_u64(&b, 0), gb_u32(&b, MKV_GGUF_U8), gb_put(&b, "a", 1);
    pad_to(&b, 64);
    expect_refused("emptykey", b.p, b.n, MKV_STATUS_PARSE_ERROR, "empty key");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_str(&b, "b"), gb_u32(&b, MKV_GGUF_BOOL), gb_put(&b, "\2", 1);
    expect_refused("bool", b.p, b.n, MKV_STATUS_PARSE_ERROR, "bool value 2");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_str(&b, "general.alignment"), gb_u32(&b, MKV_GGUF_U32), gb_u32(&b, 24);
    expect_refused("align", b.p, b.n, MKV_STATUS_PARSE_ERROR, "general.alignment");
    free(b.p);
    raw_file(&b, 3, 0, 1);
    gb_str(&b, "general.alignment"), gb_u32(&b, MKV_GGUF_U64), gb_u64(&b, 32);
    expect_refused("aligntype", b.p, b.n, MKV_STATUS_PARSE_ERROR, "general.alignment");
    free(b.p);
}

/* One tensor info (and data) after an empty metadata section. */
static void one_tensor(gbuf_t *b, const char *name, uint32_t nd, const uint64_t *ne,
                       uint32_t type, uint64_t offset, size_t data_bytes, uint64_t nt)
{
    raw_file(b, 3, nt, 0);
    for (uint64_t k = 0; k < nt; k++) {
        char nm[80];
        snprintf(nm, sizeof nm, k ? "%s.%d" : "%s", name, (int)k);
        if (nt == 2 && strcmp(name, "dup") == 0) snprintf(nm, sizeof nm, "dup");
        gb_str(b, nm);
        gb_u32(b, nd);
        for (uint32_t d = 0; d < nd; d++) gb_u64(b, ne[d]);
        gb_u32(b, type);
        gb_u64(b, k ? offset + 32 * k : offset);
    }
    pad_to(b, (b->n + 31) / 32 * 32 + data_bytes);
}

Test(gguf, hostile_tensors)
{
    gbuf_t b;
    const uint64_t v32[1] = {32}, big[2] = {1ull << 20, 1ull << 20}, five[5] = {32, 1, 1, 1, 1};
    one_tensor(&b, "w", 1, v32, MKV_GGML_F32, 0, 128, 1);
    char path[256];
    tmp_path(path, sizeof path, "ok1");
    write_file(path, b.p, b.n);
    mkv_gguf_close(open_ok(path)); /* the baseline is valid */
    unlink(path);
    free(b.p);
    one_tensor(&b, "w", 1, v32, MKV_GGML_F32, 0, 127, 1);
    expect_refused("tpast", b.p, b.n, MKV_STATUS_PARSE_ERROR, "tensor w: data");
    free(b.p);
    one_tensor(&b, "w", 1, v32, MKV_GGML_F32, 16, 256, 1);
    expect_refused("tmisaligned", b.p, b.n, MKV_STATUS_PARSE_ERROR, "not a multiple of the alignment");
    free(b.p);
    one_tensor(&b, "w", 1, v32, MKV_GGML_F32, UINT64_MAX - 31, 128, 1);
    expect_refused("thugeoff", b.p, b.n, MKV_STATUS_PARSE_ERROR, "tensor w: data");
    free(b.p);
    one_tensor(&b, "w", 5, five, MKV_GGML_F32, 0, 128, 1);
    expect_refused("tndims", b.p, b.n, MKV_STATUS_PARSE_ERROR, "n_dims 5");
    free(b.p);
    one_tensor(&b, "w", 0, v32, MKV_GGML_F32, 0, 128, 1);
    expect_refused("tndims0", b.p, b.n, MKV_STATUS_PARSE_ERROR, "n_dims 0");
    free(b.p);
    one_tensor(&b, "w", 2, big, MKV_GGML_F32, 0, 128, 1);
    expect_refused("tbig", b.p, b.n, MKV_STATUS_PARSE_ERROR, "larger than the file");
    free(b.p);
    const uint64_t ovf[3] = {1ull << 32, 1ull << 32, 1ull << 32};
    one_tensor(&b, "w", 3, ovf, MKV_GGML_F32, 0, 128, 1);
    expect_refused("toverflow", b.p, b.n, MKV_STATUS_PARSE_ERROR, "overflows");
    free(b.p);
    const uint64_t neg[1] = {UINT64_MAX};
    one_tensor(&b, "w", 1, neg, MKV_GGML_F32, 0, 128, 1);
    expect_refused("tneg", b.p, b.n, MKV_STATUS_PARSE_ERROR, "overflows");
    free(b.p);
    one_tensor(&b, "w", 1, v32, 99, 0, 128, 1);
    expect_refused("ttype", b.p, b.n, MKV_STATUS_PARSE_ERROR, "unknown ggml type 99");
    free(b.p);
    const uint64_t v33[1] = {33};
    one_tensor(&b, "w", 1, v33, MKV_GGML_Q8_0, 0, 128, 1);
    expect_refused("tblock", b.p, b.n, MKV_STATUS_PARSE_ERROR, "not a multiple of the Q8_0 block");
    free(b.p);
    one_tensor(&b, "dup", 1, v32, MKV_GGML_F32, 0, 256, 2);
    expect_refused("tdup", b.p, b.n, MKV_STATUS_PARSE_ERROR, "tensor dup appears twice");
    free(b.p);
    /* Two tensors of 128 bytes, 32 bytes apart. */
    one_tensor(&b, "w", 1, v32, MKV_GGML_F32, 0, 256, 2);
    expect_refused("toverlap", b.p, b.n, MKV_STATUS_PARSE_ERROR, "overlap");
    free(b.p);
    raw_file(&b, 3, 1, 0);
    gb_u64(&b, 65), pad_to(&b, 24 + 8 + 65 + 64);
    expect_refused("tname", b.p, b.n, MKV_STATUS_PARSE_ERROR, "name of 65 bytes");
    free(b.p);
}

Test(gguf, fifo_and_directory, .timeout = 20)
{
    char path[256], err[MKV_ERR_LEN];
    tmp_path(path, sizeof path, "fifo");
    unlink(path);
    cr_assert_eq(mkfifo(path, 0600), 0);
    mkv_gguf_t *g = NULL;
    cr_expect_eq(mkv_gguf_open(path, &g, err), MKV_STATUS_IO_ERROR);
    cr_expect(strstr(err, "a FIFO, not a regular file"), "%s", err);
    mkv_model_t *m = NULL;
    cr_expect_eq(mkv_model_load(path, &m, err), MKV_STATUS_IO_ERROR, "%s", err);
    cr_expect(strstr(err, "FIFO"), "%s", err);
    unlink(path);
    cr_expect_eq(mkv_gguf_open("/tmp", &g, err), MKV_STATUS_IO_ERROR);
    cr_expect(strstr(err, "a directory"), "%s", err);
    cr_expect_eq(mkv_gguf_open("/nonexistent/x.gguf", &g, err), MKV_STATUS_IO_ERROR);
    cr_expect(strstr(err, "No such file"), "%s", err);
    cr_expect_eq(mkv_model_load("/nonexistent/x.gguf", &m, err), MKV_STATUS_IO_ERROR);
    cr_expect_eq(mkv_gguf_open(NULL, &g, err), MKV_STATUS_INVALID_ARGUMENT);
}

/* ---------------------------------------------------------------------------------------- */
/* The GGUF model loader on synthetic files                                                 */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t load_tiny(const tiny_opts_t *o, const char *tag, mkv_model_t **m, char *err)
{
    size_t len;
    uint8_t *f = tiny_gguf(o, &len);
    char path[256];
    tmp_path(path, sizeof path, tag);
    write_file(path, f, len);
    free(f);
    const mkv_status_t st = mkv_model_load(path, m, err);
    unlink(path);
    return st;
}

/* The weights against the file's tensors dequantized here, with Q/K rows un-permuted. */
Test(gguf, synthetic_model_weights)
{
    for (int untied = 0; untied < 2; untied++) {
        tiny_opts_t o = {0};
        o.untied = untied;
        size_t len;
        uint8_t *f = tiny_gguf(&o, &len);
        char path[256], err[MKV_ERR_LEN];
        tmp_path(path, sizeof path, "weights");
        write_file(path, f, len);
        free(f);
        mkv_model_t *m = tu_model_load(path);
        mkv_gguf_t *g = open_ok(path);
        const mkv_model_config_t *c = &m->cfg;
        cr_expect(c->hidden == SD && c->n_layers == SL && c->n_heads == SH && c->n_kv_heads == SKV &&
                  c->head_dim == SHD && c->intermediate == SI && c->vocab == SV &&
                  c->max_pos == 128 && c->bos == 1 && c->eos == 2 && c->tied == !untied);
        cr_expect_eq(c->rope_theta, 50000.0f);
        cr_expect_eq(c->rms_eps, 1e-5f);
        cr_expect_eq(m->lm_head == m->embed, !untied);
        for (int64_t i = 0; i < mkv_gguf_n_tensors(g); i++) {
            const mkv_gguf_tensor_t *t = mkv_gguf_tensor_at(g, i);
            const float *got = NULL;
            const mkv_qblocks_t *qb = NULL; /* the blocks the model keeps for weights.c */
            int l = -1, heads = 0;
            char what[64] = "";
            if (strcmp(t->name, "token_embd.weight") == 0) got = m->embed, qb = untied ? NULL : &m->qlm_head;
            else if (strcmp(t->name, "output.weight") == 0) got = m->lm_head, qb = &m->qlm_head;
            else if (strcmp(t->name, "output_norm.weight") == 0) got = m->final_norm;
            else cr_assert(sscanf(t->name, "blk.%d.%63[a-z_]", &l, what) == 2);
            if (l >= 0) {
                const mkv_layer_weights_t *w = &m->layers[l];
                if (!strcmp(what, "attn_norm")) got = w->attn_norm;
                if (!strcmp(what, "attn_q")) got = w->wq, heads = SH, qb = &w->qwq;
                if (!strcmp(what, "attn_k")) got = w->wk, heads = SKV, qb = &w->qwk;
                if (!strcmp(what, "attn_v")) got = w->wv, qb = &w->qwv;
                if (!strcmp(what, "attn_output")) got = w->wo, qb = &w->qwo;
                if (!strcmp(what, "ffn_norm")) got = w->mlp_norm;
                if (!strcmp(what, "ffn_gate")) got = w->w_gate, qb = &w->qw_gate;
                if (!strcmp(what, "ffn_up")) got = w->w_up, qb = &w->qw_up;
                if (!strcmp(what, "ffn_down")) got = w->w_down, qb = &w->qw_down;
            }
            cr_assert_not_null(got, "%s", t->name);
            float *want = tu_xcalloc((size_t)t->n_elements, 4);
            cr_assert_eq(mkv_ggml_dequantize(t->type, t->data, want, t->n_elements, err), 0);
            const int64_t in = t->ne[0], rows = t->ne[1];
            for (int64_t r = 0; r < rows; r++) {
                /* Hugging Face row r of a head is GGUF row 2 (r mod hd/2) + r div (hd/2). */
                int64_t src = r;
                if (heads) src = r / SHD * SHD + 2 * (r % SHD % (SHD / 2)) + r % SHD / (SHD / 2);
                cr_assert(memcmp(got + r * in, want + src * in, (size_t)in * 4) == 0,
                          "%s row %lld", t->name, (long long)r);
            }
            /* Q4_0 / Q4_1 / Q8_0 keep their blocks, rows in the fp32 copy's order. */
            if (qb) {
                const int keep = t->type == MKV_GGML_Q4_0 || t->type == MKV_GGML_Q4_1 ||
                                 t->type == MKV_GGML_Q8_0;
                cr_assert_eq(qb->blocks != NULL, keep, "%s (%s): blocks kept", t->name,
                             mkv_ggml_type_name(t->type));
                if (keep) {
                    cr_assert_eq(qb->type, t->type, "%s", t->name);
                    cr_assert_eq(mkv_ggml_dequantize(t->type, qb->blocks, want, t->n_elements, err), 0);
                    cr_assert(memcmp(got, want, (size_t)t->n_elements * 4) == 0,
                              "%s: kept blocks differ from the fp32 copy", t->name);
                }
            }
            free(want);
        }
        mkv_gguf_close(g);
        mkv_model_free(m);
        unlink(path);
    }
}

static void expect_tiny_refused(const tiny_opts_t *o, const char *tag, mkv_status_t want,
                                const char *needle)
{
    char err[MKV_ERR_LEN];
    mkv_model_t *m = (mkv_model_t *)1;
    const mkv_status_t st = load_tiny(o, tag, &m, err);
    cr_expect_eq(st, want, "%s: got '%s' (%s)", tag, mkv_status_string(st), err);
    cr_expect_null(m, "%s", tag);
    cr_expect(strstr(err, needle), "%s: '%s' lacks '%s'", tag, err, needle);
    cr_expect(strstr(err, ".gguf: "), "%s: '%s' names no file", tag, err);
    cr_expect_str_eq(mkv_last_error(), err);
}

Test(gguf, synthetic_model_refusals)
{
    tiny_opts_t o = {0};
    o.arch = "gptneox";
    expect_tiny_refused(&o, "arch", MKV_STATUS_UNSUPPORTED, "architecture 'gptneox'");
    o = (tiny_opts_t){0};
    o.rope_scaling = "yarn";
    expect_tiny_refused(&o, "rs", MKV_STATUS_UNSUPPORTED, "llama.rope.scaling.type yarn");
    o.rope_scaling = "none";
    mkv_model_t *m = NULL;
    char err[MKV_ERR_LEN];
    cr_expect_eq(load_tiny(&o, "rsnone", &m, err), MKV_STATUS_OK, "%s", err);
    mkv_model_free(m);
    o = (tiny_opts_t){0};
    o.rope_dims = 8;
    expect_tiny_refused(&o, "rdims", MKV_STATUS_UNSUPPORTED, "llama.rope.dimension_count 8");
    o.rope_dims = SHD;
    cr_expect_eq(load_tiny(&o, "rdims16", &m, err), MKV_STATUS_OK, "%s", err);
    mkv_model_free(m);
    o = (tiny_opts_t){0};
    o.skip = "blk.1.attn_v.weight";
    expect_tiny_refused(&o, "missing", MKV_STATUS_INVALID_ARGUMENT, "missing tensor blk.1.attn_v.weight");
    o = (tiny_opts_t){0};
    o.skip = "token_embd.weight";
    expect_tiny_refused(&o, "noembd", MKV_STATUS_INVALID_ARGUMENT, "token_embd.weight");
    o = (tiny_opts_t){0};
    o.bad_shape = 1;
    expect_tiny_refused(&o, "shape", MKV_STATUS_INVALID_ARGUMENT,
                        "blk.0.ffn_gate.weight: expected GGUF shape [32, 256]");
    o = (tiny_opts_t){0};
    o.down_type = 13; /* Q5_K: a valid file, but no dequantizer */
    expect_tiny_refused(&o, "q5k", MKV_STATUS_UNSUPPORTED, "blk.1.ffn_down.weight has type Q5_K");
    o = (tiny_opts_t){0};
    o.bos = SV;
    expect_tiny_refused(&o, "bos", MKV_STATUS_PARSE_ERROR, "bos_token_id = 8 is outside");
}

/* ---------------------------------------------------------------------------------------- */
/* SmolLM2-135M-Instruct                                                                    */
/* ---------------------------------------------------------------------------------------- */

Test(gguf, smollm2_metadata)
{
    REQUIRE_SMOL();
    char err[MKV_ERR_LEN];
    mkv_gguf_t *g = open_ok(SMOL);
    cr_expect_eq(mkv_gguf_version(g), 3);
    cr_expect_eq(mkv_gguf_n_tensors(g), 272);
    mkv_gguf_str_t s;
    cr_expect(mkv_gguf_get_str(g, "general.architecture", &s, err) == 0 && s.len == 5 &&
              memcmp(s.ptr, "llama", 5) == 0);
    cr_expect(mkv_gguf_get_str(g, "tokenizer.ggml.model", &s, err) == 0 && s.len == 4 &&
              memcmp(s.ptr, "gpt2", 4) == 0);
    uint32_t u;
    float x;
    cr_expect(mkv_gguf_get_u32(g, "llama.block_count", &u, err) == 0 && u == 30);
    cr_expect(mkv_gguf_get_u32(g, "llama.context_length", &u, err) == 0 && u == 8192);
    cr_expect(mkv_gguf_get_u32(g, "llama.attention.head_count_kv", &u, err) == 0 && u == 3);
    cr_expect(mkv_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u, err) == 0 && u == 1);
    cr_expect(mkv_gguf_get_f32(g, "llama.rope.freq_base", &x, err) == 0 && x == 100000.0f);
    mkv_gguf_type_t et;
    uint64_t n;
    cr_expect(mkv_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, err) == 0 &&
              et == MKV_GGUF_STRING && n == 49152);
    const mkv_gguf_kv_t *tok = mkv_gguf_find(g, "tokenizer.ggml.tokens");
    static const char *const first[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 3; i++) {
        s = mkv_gguf_arr_str(g, tok, (uint64_t)i);
        cr_expect(s.len == strlen(first[i]) && memcmp(s.ptr, first[i], s.len) == 0, "token %d", i);
    }
    s = mkv_gguf_arr_str(g, tok, 4649); /* "ĠFrance" */
    cr_expect(s.len == 8 && memcmp(s.ptr, "\xc4\xa0" "France", 8) == 0, "token 4649: %.*s",
              (int)s.len, s.ptr);
    const mkv_gguf_kv_t *tt = mkv_gguf_find(g, "tokenizer.ggml.token_type");
    int64_t v;
    cr_expect(mkv_gguf_arr_int(tt, 2, &v) && v == 3, "<|im_end|> is a control token");
    cr_expect(mkv_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, err) == 0 &&
              et == MKV_GGUF_STRING && n > 40000);
    const mkv_gguf_tensor_t *t = mkv_gguf_find_tensor(g, "token_embd.weight");
    cr_assert_not_null(t);
    cr_expect(t->type == MKV_GGML_Q8_0 && t->ne[0] == 576 && t->ne[1] == 49152);
    t = mkv_gguf_find_tensor(g, "blk.29.ffn_down.weight");
    cr_expect(t && t->type == MKV_GGML_Q4_1 && t->ne[0] == 1536 && t->ne[1] == 576);
    cr_expect_null(mkv_gguf_find_tensor(g, "output.weight"), "tied embeddings");
    mkv_gguf_close(g);
}

/* Whether `path` is mapped into this process (the loader must close the file's mapping). */
static int is_mapped(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, f)) found |= strstr(line, name) != NULL;
    fclose(f);
    return found;
}

/* An fp16 (K16V16, nothing compressed) cache for one sequence. */
static mkv_cache_t *fp16_cache(const mkv_model_t *m, int32_t max_len)
{
    mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, cfg;
    base.max_seqs = 1;
    base.max_seq_len = max_len;
    base.hi_format = base.lo_format = MKV_FORMAT_K16V16;
    base.alpha_h = base.alpha_l = 0.0f;
    mkv_model_cache_config(m, &base, &cfg);
    cfg.pool_pages = (int64_t)cfg.n_layers * cfg.n_kv_heads * (max_len / 32 + 3);
    mkv_cache_t *c = NULL;
    cr_assert_eq(mkv_cache_create(&cfg, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    return c;
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The README's chat prompt and greedy answer ("The capital of France is Paris." <|im_end|>). */
static const int32_t CHAT[16] = {1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198};
static const int32_t ANSWER[8] = {504, 3575, 282, 4649, 314, 7042, 30, 2};

typedef struct ref_pos {
    int32_t pos, argmax;
    double l2, sum;
    int32_t id[20];
    double logit[20];
} ref_pos_t;

static int read_fixture(ref_pos_t *rp, int max, int32_t *greedy, int *n_greedy)
{
    FILE *f = fopen(MIXKV_FIXTURES_DIR "/smollm2_logits.txt", "r");
    cr_assert_not_null(f, "cannot open " MIXKV_FIXTURES_DIR "/smollm2_logits.txt");
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        if (strncmp(line, "prompt", 6) == 0) {
            int cnt, at = 0, used;
            cr_assert_eq(sscanf(line + 6, "%d%n", &cnt, &used), 1);
            cr_assert_eq(cnt, 16);
            const char *p = line + 6 + used;
            for (int i = 0; i < cnt; i++, p += used) {
                cr_assert_eq(sscanf(p, "%d%n", &at, &used), 1);
                cr_assert_eq(at, CHAT[i], "fixture prompt id %d", i);
            }
        } else if (strncmp(line, "greedy", 6) == 0) {
            int used;
            const char *p = line + 6;
            cr_assert_eq(sscanf(p, "%d%n", n_greedy, &used), 1);
            p += used;
            for (int i = 0; i < *n_greedy && i < 8; i++, p += used)
                cr_assert_eq(sscanf(p, "%d%n", &greedy[i], &used), 1);
        } else if (strncmp(line, "pos", 3) == 0 && n < max) {
            ref_pos_t *r = &rp[n++];
            cr_assert_eq(sscanf(line, "pos %d %lf %lf %d", &r->pos, &r->l2, &r->sum, &r->argmax), 4);
            for (int k = 0; k < 20; k++) {
                cr_assert_not_null(fgets(line, sizeof line, f));
                cr_assert_eq(sscanf(line, "%d %lf", &r->id[k], &r->logit[k]), 2);
            }
        }
    }
    fclose(f);
    return n;
}

/* Tolerances for fp32 arithmetic against the float64 reference (both with fp16 K/V), over
 * 30 layers: the top-20 logits within TOL_TOP of the largest one's magnitude, the vector's L2
 * norm within TOL_L2 relative. Measured: 2.2e-6 / 4.7e-6 at position 0 (attention over one
 * token), at most 2.9e-4 / 2.5e-4 at positions 7-23, where an fp32 K or V that lands on the
 * other side of an fp16 rounding boundary than float64's moves by one fp16 ulp (4.9e-4
 * relative); a 24-token prefill gives the same figures as prefill + decode. */
#define TOL_TOP 1e-3
#define TOL_L2 1e-3

Test(gguf, smollm2_logits_vs_float64, .timeout = 120)
{
    REQUIRE_SMOL();
    ref_pos_t ref[8];
    int32_t greedy[8];
    int n_greedy = 0;
    const int n_ref = read_fixture(ref, 8, greedy, &n_greedy);
    cr_assert(n_ref >= 4 && n_greedy == 8);
    mkv_model_t *m = tu_model_load(SMOL);
    cr_expect(!is_mapped("SmolLM2-135M-Instruct.Q4_1.gguf"), "the file is still mapped");
    const mkv_model_config_t *c = &m->cfg;
    cr_expect(c->hidden == 576 && c->n_layers == 30 && c->n_heads == 9 && c->n_kv_heads == 3 &&
              c->head_dim == 64 && c->intermediate == 1536 && c->vocab == 49152 &&
              c->max_pos == 8192 && c->tied == 1 && c->bos == 1 && c->eos == 2);
    cr_expect_eq(c->rope_theta, 100000.0f);
    cr_expect_eq(c->rms_eps, 1e-5f);
    const int32_t V = c->vocab, NP = 16;
    mkv_cache_t *cache = fp16_cache(m, 64);
    mkv_forward_ws_t *ws = NULL;
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_forward_ws_create(m, NP, &ws, err), MKV_STATUS_OK, "%s", err);
    float *lg = tu_xcalloc((size_t)(NP + 8) * V, 4);
    int32_t slot = -1;
    cr_assert_eq(mkv_cache_admit(cache, NP, &slot), MKV_STATUS_OK);
    cr_assert_eq(mkv_model_prefill(m, cache, slot, CHAT, NP, lg, NULL, ws), MKV_STATUS_OK, "%s",
                 mkv_last_error());
    for (int s = 0; s < 8; s++)
        cr_assert_eq(mkv_model_decode(m, cache, 1, &slot, &greedy[s], lg + (size_t)(NP + s) * V, ws),
                     MKV_STATUS_OK, "%s", mkv_last_error());
    double worst_top = 0, worst_l2 = 0;
    for (int k = 0; k < n_ref; k++) {
        const ref_pos_t *r = &ref[k];
        /* Position p's logits: prefill row p, or the decode step that fed greedy[p - NP]. */
        const float *z = lg + (size_t)r->pos * V;
        double l2 = 0, top = 0, scale = fabs(r->logit[0]);
        for (int32_t i = 0; i < V; i++) l2 += (double)z[i] * z[i];
        l2 = sqrt(l2);
        for (int i = 0; i < 20; i++) {
            scale = fmax(scale, fabs(r->logit[i]));
            top = fmax(top, fabs((double)z[r->id[i]] - r->logit[i]));
        }
        top /= scale;
        const double el2 = fabs(l2 - r->l2) / r->l2;
        cr_log_info("position %d: top-20 %.3g, L2 %.3g", r->pos, top, el2);
        cr_expect(top <= TOL_TOP, "position %d: top-20 logits differ by %.3g of the largest", r->pos, top);
        cr_expect(el2 <= TOL_L2, "position %d: L2 norm %.9g vs %.9g", r->pos, l2, r->l2);
        cr_expect_eq(argmax(z, V), r->argmax, "position %d: argmax", r->pos);
        worst_top = fmax(worst_top, top);
        worst_l2 = fmax(worst_l2, el2);
    }
    cr_log_info("SmolLM2 vs float64 at %d positions: top-20 logits %.3g (tolerance %g), L2 %.3g "
                "(tolerance %g)",
                n_ref, worst_top, TOL_TOP, worst_l2, TOL_L2);
    free(lg);
    mkv_forward_ws_free(ws);
    mkv_cache_destroy(cache);
    mkv_model_free(m);
}

Test(gguf, smollm2_greedy_readme, .timeout = 120)
{
    REQUIRE_SMOL();
    mkv_model_t *m = tu_model_load(SMOL);
    const int32_t V = m->cfg.vocab;
    mkv_cache_t *cache = fp16_cache(m, 64);
    mkv_forward_ws_t *ws = NULL;
    cr_assert_eq(mkv_forward_ws_create(m, 16, &ws, NULL), MKV_STATUS_OK);
    float *lg = tu_xcalloc((size_t)V, 4);
    int32_t slot = -1, out[8];
    int n = 0;
    cr_assert_eq(mkv_cache_admit(cache, 16, &slot), MKV_STATUS_OK);
    cr_assert_eq(mkv_model_prefill(m, cache, slot, CHAT, 16, NULL, lg, ws), MKV_STATUS_OK, "%s",
                 mkv_last_error());
    for (; n < 8; n++) {
        out[n] = argmax(lg, V);
        if (out[n] == m->cfg.eos) {
            n++;
            break;
        }
        cr_assert_eq(mkv_model_decode(m, cache, 1, &slot, &out[n], lg, ws), MKV_STATUS_OK, "%s",
                     mkv_last_error());
    }
    cr_expect_eq(n, 8);
    cr_expect(memcmp(out, ANSWER, sizeof ANSWER) == 0,
              "greedy: %d %d %d %d %d %d %d %d, expected 504 3575 282 4649 314 7042 30 2", out[0],
              out[1], out[2], out[3], out[4], out[5], out[6], out[7]);
    free(lg);
    mkv_forward_ws_free(ws);
    mkv_cache_destroy(cache);
    mkv_model_free(m);
}
