/*
 * test_kernels.c — the forward pass's fast kernels against their references:
 *   - mkv_attn_prefill_blocked vs mkv_attn_prefill (attention/prefill_ref.c): bit for bit
 *     (outputs and significance sums) on awkward sizes, with 1 to 3 threads;
 *   - packed-weight products (engine/weights.c) vs a float64 product: |got - want| <=
 *     TOL_MM * sum_k |x_k w_k| (fp32 sums over at most 1,536 terms), for fp32 and bf16
 *     panels, odd sizes; a GEMM row equals the matvec of that token bit for bit, and 1 to 3
 *     threads give the same bits.
 */
#include "attention/attention.h"
#include "engine/parallel.h"
#include "engine/weights.h"

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
            cr_assert_eq(pw.bf16, bf, "storage: %d for %s weights", pw.bf16, bf ? "bf16" : "fp32");
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
