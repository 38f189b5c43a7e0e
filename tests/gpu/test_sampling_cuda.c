/*
 * test_sampling_cuda.c — the device sampler (runner/sampling_cuda.h) against the host
 * reference (engine/sampling.h, mkv_sample_with_u) on fresh random logits of awkward sizes:
 * rows 1, 7, 33, 64; vocabularies 1, 3, 1000, 49152, 128256; temperatures 0, 0.7, 1, 1.3;
 * top_p 0.05, 0.5, 0.9, 1; uniforms at random and at the edges (0, the largest below 1); logits
 * continuous, in coarse steps (many exactly tied probabilities) or one far above the rest. The
 * picks are poisoned (-7) before every launch.
 *
 * The two may differ only where u falls within rounding of a boundary between two tokens (their
 * double sums run in different orders): a differing pick counts as such when u lies within
 * TOL_U of the device's token's interval of the reference's running sum (the first mismatches
 * are printed either way); every other difference fails.
 */
#include "gpu_util.h"

#include "engine/sampling.h"
#include "runner/sampling_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_U 1e-9 /* u's distance from a boundary that rounding can explain (sums ~1e-16 relative) */

typedef struct cand {
    float p;
    int32_t id;
} cand_t;

static int cmp_cand(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Whether token t's interval of the reference's running sum (over its kept set, in its order,
 * as a fraction of the kept mass; engine/sampling.c) comes within TOL_U of u. Test-only: it
 * restates the reference's order to measure the distance, never to choose. */
static int near_boundary(const float *lg, int32_t V, float temp, float top_p, double u, int32_t t, cand_t *c)
{
    if (temp <= 0.0f || V == 1 || t < 0 || t >= V) return 0;
    float m = lg[0];
    for (int32_t i = 1; i < V; i++) m = lg[i] > m ? lg[i] : m;
    double z = 0.0;
    for (int32_t i = 0; i < V; i++) {
        c[i].p = (float)exp((double)((lg[i] - m) / temp));
        c[i].id = i;
        z += c[i].p;
    }
    int32_t n = V;
    double mass = z;
    if (top_p > 0.0f && top_p < 1.0f) {
        qsort(c, (size_t)V, sizeof *c, cmp_cand);
        double acc = 0.0;
        for (n = 0; n < V;) {
            acc += c[n++].p;
            if (acc >= (double)top_p * z) break;
        }
        mass = acc;
    }
    double acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const double lo = acc / mass;
        acc += c[i].p;
        if (c[i].id == t) return u >= lo - TOL_U && u <= acc / mass + TOL_U;
    }
    return 0; /* outside the kept set */
}

static double unif(uint64_t *s) { return (double)(test_rand_next(s) >> 11) * 0x1.0p-53; }

/* Row j's logits: kind j % 3 (continuous in [-6, 6); steps of 0.5 in [-6, 6): ties; [-2, 2)
 * with one logit at 8). */
static void fill_row(float *lg, int32_t V, int j, uint64_t *rng)
{
    const int kind = j % 3;
    for (int32_t i = 0; i < V; i++) {
        double g = unif(rng);
        if (kind == 0) g = 12.0 * g - 6.0;
        else if (kind == 1) g = floor(24.0 * g) * 0.5 - 6.0;
        else g = 4.0 * g - 2.0;
        lg[i] = (float)g;
    }
    if (kind == 2) lg[test_rand_range(rng, 0, V - 1)] = 8.0f;
}

Test(sampling_cuda, matches_the_host_reference)
{
    GPU_REQUIRE();
    static const int32_t vocabs[5] = {1, 3, 1000, 49152, 128256}, rows[4] = {1, 7, 33, 64};
    static const float temps[4] = {0.0f, 0.7f, 1.0f, 1.3f}, tops[4] = {0.05f, 0.5f, 0.9f, 1.0f};
    enum { REPS = 6, SHOW = 10 };
    const int32_t max_n = 64, max_v = 128256;
    float *lg = malloc((size_t)max_n * max_v * sizeof(float));
    float *scratch = malloc((size_t)2 * max_v * sizeof(float));
    cand_t *cands = malloc((size_t)max_v * sizeof(cand_t));
    mkv_sample_row_t hrows[64];
    int32_t next[64], poison[64];
    for (int j = 0; j < 64; j++) poison[j] = -7;
    cr_assert(lg && scratch && cands);
    float *d_lg;
    mkv_sample_row_t *d_rows;
    int32_t *d_next;
    CUDA_CHECK(cudaMalloc((void **)&d_lg, (size_t)max_n * max_v * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&d_rows, sizeof hrows));
    CUDA_CHECK(cudaMalloc((void **)&d_next, sizeof next));
    uint64_t rng = 20261126;
    int64_t picks = 0, near = 0, wrong = 0;
    char err[MKV_ERR_LEN];
    for (int vi = 0; vi < 5; vi++)
        for (int ni = 0; ni < 4; ni++) {
            const int32_t V = vocabs[vi], n = rows[ni];
            for (int j = 0; j < n; j++) fill_row(lg + (int64_t)j * V, V, j, &rng);
            for (int rep = 0; rep < REPS; rep++) {
                for (int j = 0; j < n; j++) { /* every (temperature, top_p) pair over the rows and reps */
                    const int c = (j + 5 * rep) % 16;
                    hrows[j].temperature = temps[c % 4];
                    hrows[j].top_p = tops[c / 4];
                    hrows[j].u = rep == 0 && j % 3 == 0 ? 0.0 : rep == 1 && j % 3 == 1 ? 1.0 - 0x1.0p-53 : unif(&rng);
                }
                CUDA_CHECK(cudaMemcpy(d_lg, lg, (size_t)n * V * sizeof(float), cudaMemcpyHostToDevice));
                CUDA_CHECK(cudaMemcpy(d_rows, hrows, (size_t)n * sizeof *hrows, cudaMemcpyHostToDevice));
                CUDA_CHECK(cudaMemcpy(d_next, poison, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
                cr_assert_eq(mkv_cuda_sample(d_lg, n, V, d_rows, d_next, NULL, err), MKV_STATUS_OK, "%s", err);
                CUDA_CHECK(cudaDeviceSynchronize());
                CUDA_CHECK(cudaMemcpy(next, d_next, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost));
                for (int j = 0; j < n; j++) {
                    const float *row = lg + (int64_t)j * V;
                    const mkv_sample_row_t *r = &hrows[j];
                    const int32_t want = mkv_sample_with_u(row, V, r->temperature, r->top_p, r->u, scratch);
                    picks++;
                    if (next[j] == want) continue;
                    const int ok = near_boundary(row, V, r->temperature, r->top_p, r->u, next[j], cands);
                    near += ok, wrong += !ok;
                    if (near + wrong <= SHOW)
                        printf("sampling_cuda: V %d, %d rows, row %d (kind %d), T %g, top_p %g, u %.17g: device %d, "
                               "reference %d%s\n", V, n, j, j % 3, r->temperature, r->top_p, r->u, next[j], want,
                               ok ? " (u within rounding of the boundary)" : "");
                }
            }
        }
    cr_log_info("sampling_cuda: %lld picks, %lld differ within rounding of a boundary, %lld differ otherwise",
                (long long)picks, (long long)near, (long long)wrong);
    cr_assert_eq(wrong, 0, "%lld of %lld device picks differ from the reference", (long long)wrong,
                 (long long)picks);
    cr_assert_leq(near * 1000, picks, "%lld picks differ at boundaries: more than rounding explains",
                  (long long)near);
    cudaFree(d_lg), cudaFree(d_rows), cudaFree(d_next);
    free(lg), free(scratch), free(cands);
}

/* Ties and the kept set's edge, on rows made for them: every logit equal (the kept set is the
 * lowest ids; u in k / kept picks id k), and two tied maxima under a tiny top_p (the lower id). */
Test(sampling_cuda, ties_go_to_the_lower_id)
{
    GPU_REQUIRE();
    enum { V = 1000, N = 8 };
    float *lg = malloc((size_t)N * V * sizeof(float)), *d_lg;
    mkv_sample_row_t h[N], *d_rows;
    int32_t next[N], *d_next, poison[N];
    char err[MKV_ERR_LEN];
    for (int j = 0; j < N; j++) poison[j] = -7;
    for (int64_t i = 0; i < (int64_t)N * V; i++) lg[i] = 0.25f;
    for (int j = 4; j < N; j++) { /* rows 4..7: two tied maxima, at ids 700 and 300 + j */
        lg[(int64_t)j * V + 700] = 3.0f;
        lg[(int64_t)j * V + 300 + j] = 3.0f;
    }
    /* rows 0..3, all equal: top_p 0.5 keeps ids 0..499; u picks floor(u * 500) */
    const double us[4] = {0.0, 0.3, 0.7999, 1.0 - 0x1.0p-53};
    const int32_t want[N] = {0, 150, 399, 499, 304, 305, 306, 307};
    for (int j = 0; j < N; j++) {
        h[j].temperature = 1.0f;
        h[j].top_p = j < 4 ? 0.5f : 1e-6f;
        h[j].u = j < 4 ? us[j] : 0.999;
    }
    CUDA_CHECK(cudaMalloc((void **)&d_lg, (size_t)N * V * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&d_rows, sizeof h));
    CUDA_CHECK(cudaMalloc((void **)&d_next, sizeof next));
    CUDA_CHECK(cudaMemcpy(d_lg, lg, (size_t)N * V * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_rows, h, sizeof h, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_next, poison, sizeof poison, cudaMemcpyHostToDevice));
    cr_assert_eq(mkv_cuda_sample(d_lg, N, V, d_rows, d_next, NULL, err), MKV_STATUS_OK, "%s", err);
    CUDA_CHECK(cudaMemcpy(next, d_next, sizeof next, cudaMemcpyDeviceToHost));
    float scratch[2 * V];
    for (int j = 0; j < N; j++) {
        cr_assert_eq(mkv_sample_with_u(lg + (int64_t)j * V, V, h[j].temperature, h[j].top_p, h[j].u, scratch), want[j],
                     "the reference, row %d", j);
        cr_assert_eq(next[j], want[j], "row %d: device %d, expected %d", j, next[j], want[j]);
    }
    /* refusals */
    cr_assert_eq(mkv_cuda_sample(d_lg, 0, V, d_rows, d_next, NULL, err), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_cuda_sample(d_lg, N, 0, d_rows, d_next, NULL, err), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_cuda_sample(NULL, N, V, d_rows, d_next, NULL, err), MKV_STATUS_INVALID_ARGUMENT);
    cudaFree(d_lg), cudaFree(d_rows), cudaFree(d_next);
    free(lg);
}
