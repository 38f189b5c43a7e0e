/*
 * gguf_dequant.c — ggml's tensor types (gguf.h): the block size table and one dequantizer to
 * fp32 per supported type. The block layouts are ggml's (ggml-common.h), restated here as byte
 * offsets because the blocks in a GGUF file are packed without padding and need not be aligned:
 *
 *   Q8_0  34 B / 32:  fp16 d, int8 q[32];                 w = d q
 *   Q4_0  18 B / 32:  fp16 d, u8 qs[16];                  w = d (q - 8)
 *   Q4_1  20 B / 32:  fp16 d, fp16 m, u8 qs[16];          w = d q + m
 *         (4-bit blocks: byte j holds weight j in its low nibble and weight j + 16 in its high)
 *   Q4_K 144 B / 256: fp16 d, fp16 dmin, u8 scales[12], u8 qs[128];
 *         8 sub-blocks of 32 with 6-bit scale sc and min mn: w = d sc q - dmin mn; the 64
 *         weights 64p .. 64p+63 take the low nibbles (sub-block 2p) then the high nibbles
 *         (sub-block 2p+1) of qs[32p .. 32p+31]
 *   Q6_K 210 B / 256: u8 ql[128], u8 qh[64], int8 scales[16], fp16 d;
 *         w = d scales[i/16] (q - 32), q = 4 low bits from ql, 2 high bits from qh
 *
 * Each weight is computed as ggml computes it (fp32 products in the same order), so the
 * results equal ggml's dequantization bit for bit.
 */
#include "runner/gguf.h"

#include "runner/error.h"

#include <string.h>

typedef struct ggml_type_info {
    uint32_t id;
    const char *name;
    int64_t block_elems, block_bytes;
} ggml_type_info_t;

/* Every type a current GGUF file may hold, so that a tensor's size can be checked even when
 * mixkv cannot dequantize it (it is then refused only where its data is needed). */
static const ggml_type_info_t types[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},       {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},       {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},   {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},    {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},         {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},    {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},
};

static const ggml_type_info_t *type_info(uint32_t id)
{
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (types[i].id == id) return &types[i];
    return NULL;
}

int mkv_ggml_block(uint32_t type, int64_t *block_elems, int64_t *block_bytes)
{
    const ggml_type_info_t *t = type_info(type);
    if (!t) return 0;
    *block_elems = t->block_elems;
    *block_bytes = t->block_bytes;
    return 1;
}

const char *mkv_ggml_type_name(uint32_t type)
{
    const ggml_type_info_t *t = type_info(type);
    return t ? t->name : "?";
}

/* ---------------------------------------------------------------------------------------- */
/* Dequantizers                                                                             */
/* ---------------------------------------------------------------------------------------- */

static float h2f(const uint8_t *p)
{
    float f;
    (void)mkv_convert(&f, MKV_DTYPE_F32, p, MKV_DTYPE_F16, 1); /* little-endian, as the file */
    return f;
}

void mkv_dequant_f32(const void *src, float *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float)); /* little-endian host, as the file */
}

void mkv_dequant_f16(const void *src, float *dst, int64_t n)
{
    (void)mkv_convert(dst, MKV_DTYPE_F32, src, MKV_DTYPE_F16, n);
}

void mkv_dequant_bf16(const void *src, float *dst, int64_t n)
{
    (void)mkv_convert(dst, MKV_DTYPE_F32, src, MKV_DTYPE_BF16, n);
}

void mkv_dequant_q8_0(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 32; blk++, b += 34, dst += 32) {
        const float d = h2f(b);
        for (int j = 0; j < 32; j++) dst[j] = (float)(int8_t)b[2 + j] * d;
    }
}

void mkv_dequant_q4_0(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 32; blk++, b += 18, dst += 32) {
        const float d = h2f(b);
        for (int j = 0; j < 16; j++) {
            dst[j] = (float)((b[2 + j] & 0x0f) - 8) * d;
            dst[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
        }
    }
}

void mkv_dequant_q4_1(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 32; blk++, b += 20, dst += 32) {
        const float d = h2f(b), m = h2f(b + 2);
        for (int j = 0; j < 16; j++) {
            dst[j] = (float)(b[4 + j] & 0x0f) * d + m;
            dst[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
    }
}

/* Q4_K's 12 scale bytes hold eight 6-bit scales and eight 6-bit mins: sub-blocks 0-3 in the
 * low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 in the nibbles of bytes 8-11
 * (low: scale, high: min) with their top 2 bits in the top bits of bytes 0-3 / 4-7. */
static void q4k_scale_min(int j, const uint8_t *s, int *sc, int *mn)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

void mkv_dequant_q4_k(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 256; blk++, b += 144) {
        const float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *scales = b + 4, *qs = b + 16;
        for (int p = 0; p < 4; p++, qs += 32) {
            int sc, mn;
            q4k_scale_min(2 * p, scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            q4k_scale_min(2 * p + 1, scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = dmin * (float)mn;
            for (int l = 0; l < 32; l++) *dst++ = d1 * (float)(qs[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) *dst++ = d2 * (float)(qs[l] >> 4) - m2;
        }
    }
}

/* Q6_K: each half (128 weights) uses 64 ql bytes, 32 qh bytes and 8 scales. Weight l + 32 k
 * (l < 32, k < 4) of a half: low 4 bits from ql[l + 32 (k & 1)] (low nibble for k < 2, high
 * for k >= 2), high 2 bits from bits 2k..2k+1 of qh[l]; scale index l / 16 + 2 k. */
void mkv_dequant_q6_k(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 256; blk++, b += 210) {
        const float d = h2f(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, dst += 128)
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = ((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                dst[l] = d * (float)sc[is] * (float)q1;
                dst[l + 32] = d * (float)sc[is + 2] * (float)q2;
                dst[l + 64] = d * (float)sc[is + 4] * (float)q3;
                dst[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
    }
}

typedef void (*dequant_fn)(const void *, float *, int64_t);

static dequant_fn dequantizer(uint32_t type)
{
    switch (type) {
    case MKV_GGML_F32: return mkv_dequant_f32;
    case MKV_GGML_F16: return mkv_dequant_f16;
    case MKV_GGML_BF16: return mkv_dequant_bf16;
    case MKV_GGML_Q8_0: return mkv_dequant_q8_0;
    case MKV_GGML_Q4_0: return mkv_dequant_q4_0;
    case MKV_GGML_Q4_1: return mkv_dequant_q4_1;
    case MKV_GGML_Q4_K: return mkv_dequant_q4_k;
    case MKV_GGML_Q6_K: return mkv_dequant_q6_k;
    default: return NULL;
    }
}

int mkv_ggml_can_dequantize(uint32_t type) { return dequantizer(type) != NULL; }

mkv_status_t mkv_ggml_dequantize(uint32_t type, const void *src, float *dst, int64_t n, char *err)
{
    const dequant_fn f = dequantizer(type);
    if (!f)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "ggml type %s (%u) cannot be dequantized (F32, F16, BF16, Q8_0, Q4_0, "
                        "Q4_1, Q4_K, Q6_K)",
                        mkv_ggml_type_name(type), type);
    const ggml_type_info_t *t = type_info(type);
    if (n < 0 || n % t->block_elems != 0)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "%lld weights of %s: not whole blocks of %lld",
                        (long long)n, t->name, (long long)t->block_elems);
    f(src, dst, n);
    return MKV_STATUS_OK;
}
