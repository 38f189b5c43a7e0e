/*
 * test_kernels.c — the forward pass's fast kernels against their references:
 *   - mkv_attn_prefill_blocked vs mkv_attn_prefill (attention/prefill_ref.c): bit for bit
 *     (outputs and significance sums) on awkward sizes, with 1 to 3 threads;
 *   - packed-weight products (runner/weights.c) vs a float64 product: |got - want| <=
 *     TOL_MM * sum_k |x_k w_k| (fp32 sums over at most 1,536 terms), for fp32 and bf16
 *     panels, odd sizes; a GEMM row equals the matvec of that token bit for bit, and 1 to 3
 *     threads give the same bits;
 *   - quantized panels (Q4_0, Q4_1, Q8_0 blocks) vs the fp32 panels of the same matrix, as the
 *     GGUF dequantizer gives it: bit for bit (memcmp), matvec and GEMM tiles, 1 to 3 threads,
 *     random codes and fp16 scales (zeros and subnormals included), outputs not a multiple of
 *     16.
 */
#include "attention/attention.h"
#include "common/error.h"
#include "runner/gguf.h"
#include "runner/parallel.h"
#include "runner/weights.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOL_MM 1e-6

static uint64_t rng = 12345;
static float frand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_vec(int64_t n, float scale)
{
    float *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = scale * frand();
    return v;
}

static void run_on_pool(void *runner, mkv_attn_range_fn fn, void *ctx, int64_t n)
{
    mkv_pool_run(runner, (mkv_pool_fn)fn, ctx, n);
}

Test(kernels, prefill_blocked_is_bitwise_reference)
{
    const int32_t shapes[][4] = {{1, 1, 1, 16}, {17, 2, 3, 16}, {130, 3, 3, 64}, {300, 1, 2, 32},
                                 {33, 2, 1, 128}, {144, 3, 3, 64}};
    const int32_t obs[] = {0, 5};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int32_t n = shapes[s][0], H = shapes[s][1], G = shapes[s][2], d = shapes[s][3];
        float *q = rand_vec((int64_t)n * H * G * d, 2.0f), *k = rand_vec((int64_t)n * H * d, 2.0f);
        float *v = rand_vec((int64_t)n * H * d, 1.0f);
        float *out_ref = malloc(sizeof(float) * (size_t)n * H * G * d);
        float *sig_ref = malloc(sizeof(float) * (size_t)H * n);
        float *out = malloc(sizeof(float) * (size_t)n * H * G * d);
        float *sig = malloc(sizeof(float) * (size_t)H * n);
        float *scr_ref = malloc(sizeof(float) * (size_t)(2 * n));
        for (int oi = 0; oi < 2; oi++) {
            const float scale = 1.0f / sqrtf((float)d);
            mkv_attn_prefill(n, H, G, d, q, k, v, scale, obs[oi], out_ref, sig_ref, scr_ref);
            for (int32_t threads = 1; threads <= 3; threads++) {
                mkv_pool_t *pool = mkv_pool_create(threads);
                cr_assert(pool);
                float *scr = malloc(sizeof(float) *
                                    (size_t)mkv_attn_prefill_blocked_scratch(n, H, G, d, threads));
                for (size_t i = 0; i < (size_t)n * H * G * d; i++) out[i] = NAN;
                mkv_attn_prefill_blocked(n, H, G, d, q, k, v, scale, obs[oi], out, sig, scr, threads,
                                         threads > 1 ? run_on_pool : NULL, pool);
                cr_assert(memcmp(out, out_ref, sizeof(float) * (size_t)n * H * G * d) == 0,
                          "out differs: n %d H %d G %d d %d obs %d threads %d", n, H, G, d, obs[oi],
                          threads);
                cr_assert(memcmp(sig, sig_ref, sizeof(float) * (size_t)H * n) == 0,
                          "sig differs: n %d H %d G %d d %d obs %d threads %d", n, H, G, d, obs[oi],
                          threads);
                free(scr);
                mkv_pool_destroy(pool);
            }
        }
        free(q), free(k), free(v), free(out_ref), free(sig_ref), free(out), free(sig), free(scr_ref);
    }
}

static float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* y = x W^T for every shape and storage; the checks of the file's header. */
Test(kernels, packed_matmul)
{
    const int32_t shapes[][2] = {{37, 45}, {50, 33}, {16, 1}, {576, 576}, {100, 1536}};
    const int32_t ns[] = {1, 2, 9, 130};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int32_t O = shapes[s][0], K = shapes[s][1];
        for (int bf = 0; bf < 2; bf++) {
            float *w = rand_vec((int64_t)O * K, 0.5f);
            if (bf)
                for (int64_t i = 0; i < (int64_t)O * K; i++) w[i] = round_bf16(w[i]);
            mkv_wmat_t pw;
            cr_assert_eq(mkv_wmat_pack(w, O, K, 0, &pw), MKV_STATUS_OK);
            cr_assert_eq(pw.fmt == MKV_WFMT_BF16, bf, "storage: %d for %s weights", pw.fmt, bf ? "bf16" : "fp32");
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                const int32_t n = ns[ni];
                float *x = rand_vec((int64_t)n * K, 1.0f);
                float *y = malloc(sizeof(float) * (size_t)n * O), *y1 = malloc(sizeof(float) * (size_t)O);
                float *yt = malloc(sizeof(float) * (size_t)n * O);
                for (int32_t threads = 1; threads <= 3; threads++) {
                    mkv_pool_t *pool = mkv_pool_create(threads);
                    const mkv_matmul_t mm = {1, {&pw}, {threads == 1 ? y : yt}, {O}};
                    mkv_matmul_run(pool, &mm, x, K, n);
                    if (threads > 1)
                        cr_assert(memcmp(y, yt, sizeof(float) * (size_t)n * O) == 0,
                                  "O %d K %d n %d: %d threads differ from 1", O, K, n, threads);
                    mkv_pool_destroy(pool);
                }
                for (int32_t t = 0; t < n; t++) {
                    for (int32_t o = 0; o < O; o++) {
                        double want = 0.0, mag = 0.0;
                        for (int32_t kk = 0; kk < K; kk++) {
                            want += (double)x[t * K + kk] * w[(int64_t)o * K + kk];
                            mag += fabs((double)x[t * K + kk] * w[(int64_t)o * K + kk]);
                        }
                        cr_assert(fabs(y[t * O + o] - want) <= TOL_MM * mag + 1e-30,
                                  "O %d K %d n %d bf16 %d: y[%d][%d] = %.9g, want %.9g", O, K, n, bf,
                                  t, o, (double)y[t * O + o], want);
                    }
                    const mkv_matmul_t mv = {1, {&pw}, {y1}, {O}};
                    mkv_matmul_run(NULL, &mv, x + (int64_t)t * K, K, 1);
                    cr_assert(memcmp(y1, y + (int64_t)t * O, sizeof(float) * (size_t)O) == 0,
                              "O %d K %d n %d: row %d differs from its matvec", O, K, n, t);
                }
                free(x), free(y), free(y1), free(yt);
            }
            mkv_wmat_free(&pw);
            free(w);
        }
    }
}

/* Random ggml blocks of `type` for an [out][in] matrix: random codes, scales (and Q4_1 mins)
 * random fp16 values of either sign over a wide range, with some zeros and subnormals. */
static uint8_t *rand_blocks(uint32_t type, int32_t out, int32_t in, size_t *bytes)
{
    const size_t bb = type == MKV_GGML_Q8_0 ? 34 : type == MKV_GGML_Q4_1 ? 20 : 18;
    *bytes = (size_t)out * (size_t)(in / 32) * bb;
    uint8_t *b = malloc(*bytes);
    for (size_t i = 0; i < *bytes; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        b[i] = (uint8_t)(rng >> 24);
    }
    for (size_t blk = 0; blk < *bytes; blk += bb)
        for (int h = 0; h < (type == MKV_GGML_Q4_1 ? 2 : 1); h++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            const uint32_t r = (uint32_t)(rng >> 20);
            /* exponent 1 .. 20 (|v| about 6e-5 to 32), else zero or subnormal */
            uint16_t f = (uint16_t)((r & 0x8000u) | ((1u + r % 20u) << 10) | (r >> 16 & 0x3ffu));
            if (r % 37 == 0) f = (uint16_t)(r & 0x8000u);
            if (r % 41 == 0) f = (uint16_t)((r & 0x8000u) | (r >> 16 & 0x3ffu));
            b[blk + 2 * h] = (uint8_t)f, b[blk + 2 * h + 1] = (uint8_t)(f >> 8);
        }
    return b;
}

/* Quantized panels against the fp32 / bf16 panels of the dequantized matrix: the same bits for
 * every token count (matvec and GEMM tiles), thread count, and every GEMM row equal to its
 * matvec; outputs past `out` in a wider row are never written. */
Test(kernels, quant_panels_are_bitwise_fp32)
{
    const uint32_t types[] = {MKV_GGML_Q4_0, MKV_GGML_Q4_1, MKV_GGML_Q8_0};
    const int32_t fmts[] = {MKV_WFMT_Q4_0, MKV_WFMT_Q4_1, MKV_WFMT_Q8_0};
    const int32_t shapes[][2] = {{37, 64}, {50, 32}, {16, 96}, {1, 32}, {200, 576}, {130, 1536}};
    const int32_t ns[] = {1, 3, 9, 130};
    char err[MKV_ERR_LEN];
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int32_t O = shapes[s][0], K = shapes[s][1], ldy = O + 3;
            size_t nb;
            uint8_t *blocks = rand_blocks(types[ti], O, K, &nb);
            float *w = malloc(sizeof(float) * (size_t)O * K);
            cr_assert_eq(mkv_ggml_dequantize(types[ti], blocks, w, (int64_t)O * K, err), MKV_STATUS_OK);
            mkv_wmat_t pf, pq;
            cr_assert_eq(mkv_wmat_pack(w, O, K, 0, &pf), MKV_STATUS_OK);
            cr_assert_eq(mkv_wmat_pack_quant(types[ti], blocks, O, K, &pq), MKV_STATUS_OK);
            cr_assert_eq(pq.fmt, fmts[ti]);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                const int32_t n = ns[ni];
                float *x = rand_vec((int64_t)n * K, 2.0f);
                float *want = malloc(sizeof(float) * (size_t)n * ldy);
                float *got = malloc(sizeof(float) * (size_t)n * ldy), *y1 = malloc(sizeof(float) * (size_t)ldy);
                for (size_t i = 0; i < (size_t)n * ldy; i++) want[i] = NAN;
                const mkv_matmul_t mf = {1, {&pf}, {want}, {ldy}};
                mkv_matmul_run(NULL, &mf, x, K, n);
                for (int32_t threads = 1; threads <= 3; threads++) {
                    mkv_pool_t *pool = mkv_pool_create(threads);
                    for (size_t i = 0; i < (size_t)n * ldy; i++) got[i] = NAN;
                    const mkv_matmul_t mq = {1, {&pq}, {got}, {ldy}};
                    mkv_matmul_run(pool, &mq, x, K, n);
                    mkv_pool_destroy(pool);
                    for (int32_t t = 0; t < n; t++) {
                        const float *a = got + (size_t)t * ldy, *b = want + (size_t)t * ldy;
                        if (memcmp(a, b, sizeof(float) * (size_t)O) != 0)
                            for (int32_t o = 0; o < O; o++)
                                cr_assert(memcmp(&a[o], &b[o], 4) == 0,
                                          "%s O %d K %d n %d threads %d: y[%d][%d] = %.9g, "
                                          "fp32 panels %.9g",
                                          mkv_ggml_type_name(types[ti]), O, K, n, threads, t, o,
                                          (double)a[o], (double)b[o]);
                        for (int32_t o = O; o < ldy; o++)
                            cr_assert(isnan(a[o]), "y[%d][%d] past out written", t, o);
                    }
                }
                for (int32_t t = 0; t < n; t++) {
                    const mkv_matmul_t mv = {1, {&pq}, {y1}, {O}};
                    mkv_matmul_run(NULL, &mv, x + (int64_t)t * K, K, 1);
                    cr_assert(memcmp(y1, got + (size_t)t * ldy, sizeof(float) * (size_t)O) == 0,
                              "%s O %d K %d n %d: row %d differs from its matvec",
                              mkv_ggml_type_name(types[ti]), O, K, n, t);
                }
                free(x), free(want), free(got), free(y1);
            }
            mkv_wmat_free(&pf);
            mkv_wmat_free(&pq);
            free(w), free(blocks);
        }
}

/* Types and shapes the quantized panels do not take. */
Test(kernels, quant_panels_refusals)
{
    uint8_t blocks[64 * 34] = {0};
    mkv_wmat_t pq;
    cr_expect_eq(mkv_wmat_pack_quant(MKV_GGML_Q4_K, blocks, 1, 256, &pq), MKV_STATUS_UNSUPPORTED);
    cr_expect_eq(mkv_wmat_pack_quant(MKV_GGML_F16, blocks, 1, 32, &pq), MKV_STATUS_UNSUPPORTED);
    cr_expect_eq(mkv_wmat_pack_quant(MKV_GGML_Q8_0, blocks, 1, 48, &pq), MKV_STATUS_UNSUPPORTED);
    cr_expect(mkv_wmat_quant_supported(MKV_GGML_Q4_1) && !mkv_wmat_quant_supported(MKV_GGML_Q6_K));
}
