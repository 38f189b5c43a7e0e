/*
 * test_prefill_cuda.c — the GPU prefill (attention/prefill_cuda.cu) against the CPU reference
 * mkv_attn_prefill (attention/prefill_ref.c), sequence by sequence.
 *
 * Each batch packs sequences of awkward lengths (0 and 1 included, lengths that are not
 * multiples of the kernels' tiles) into one call. q, k, v are drawn fresh and rounded through
 * fp16; the reference gets the same values as fp32. out, sig_sum and the workspace are poisoned
 * (0xFF bytes: NaN in every element type) before the call, and every element of out and sig_sum
 * is checked afterwards. Both kernel families run: the tensor-core kernels (head_dim 64 and 128,
 * G <= 16, 16-byte aligned q, k, v) and the generic ones (every other shape; q offset by 4 bytes
 * sends d 64/128 there too).
 *
 * Tolerances (v is drawn in [-1, 1], so outputs lie in [-1, 1]):
 *   out  |got - want| <= TOL_OUT + ROUND(dtype) * |want|. TOL_OUT covers the tensor-core
 *        kernels' fp16 probabilities in P V (each rounded once: 2^-12 relative, at most
 *        2^-12 * max|v| on the weighted sum) and summation order; ROUND is the output's own
 *        rounding: 0 for f32, 2^-11 for f16, 2^-8 for bf16.
 *   sig  |got - want| <= TOL_SIG_REL * want + TOL_SIG_ABS: a sum of probabilities (all >= 0,
 *        so want is the sum's magnitude), each within a few 1e-7 relative (fp32 logits of exact
 *        fp16 products in another order, exp2 against expf, the log-sum-exp's own error).
 */
#include "attention/attention.h"
#include "attention/prefill_cuda.h"
#include "gpu_util.h"
#include "quant/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_OUT 2e-3
#define TOL_SIG_REL 1e-4
#define TOL_SIG_ABS 1e-6
#define MAX_REPORT 5
#define MAX_SEQ 16
#define ERR_LEN 512 /* MKV_ERR_LEN */

typedef struct pf_case {
    int32_t n_seq, lens[MAX_SEQ];
    int32_t H, G, d, obs_window;
    float qscale;   /* q drawn in [-qscale, qscale]: larger gives peakier softmax */
    int q_offset;   /* halves by which q is shifted off 16-byte alignment (0 or 2) */
    uint64_t seed;
} pf_case_t;

typedef struct pf_host {
    int32_t total, max_len, starts[MAX_SEQ + 1];
    uint16_t *q16, *k16, *v16;
    float *q, *k, *v, *out, *sig; /* reference copies and results */
} pf_host_t;

static float frand(uint64_t *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(test_rand_next(r) >> 11) * 0x1p-53);
}

/* Draws the inputs (fp16) and runs the reference sequence by sequence. */
static void host_build(const pf_case_t *c, pf_host_t *h)
{
    memset(h, 0, sizeof *h);
    for (int32_t j = 0; j < c->n_seq; j++) {
        h->starts[j + 1] = h->starts[j] + c->lens[j];
        if (c->lens[j] > h->max_len) h->max_len = c->lens[j];
    }
    h->total = h->starts[c->n_seq];
    const int64_t HG = (int64_t)c->H * c->G, nq = (int64_t)h->total * HG * c->d, nk = (int64_t)h->total * c->H * c->d;
    h->q16 = malloc(sizeof(uint16_t) * (size_t)(nq + 8));
    h->k16 = malloc(sizeof(uint16_t) * (size_t)(nk + 8));
    h->v16 = malloc(sizeof(uint16_t) * (size_t)(nk + 8));
    h->q = malloc(sizeof(float) * (size_t)(nq + 1));
    h->k = malloc(sizeof(float) * (size_t)(nk + 1));
    h->v = malloc(sizeof(float) * (size_t)(nk + 1));
    h->out = malloc(sizeof(float) * (size_t)(nq + 1));
    h->sig = malloc(sizeof(float) * (size_t)((int64_t)c->H * h->total + 1));
    cr_assert(h->q16 && h->k16 && h->v16 && h->q && h->k && h->v && h->out && h->sig);
    uint64_t r = c->seed;
    for (int64_t i = 0; i < nq; i++) {
        h->q16[i] = mkv_f32_to_f16(frand(&r, -c->qscale, c->qscale));
        h->q[i] = mkv_f16_to_f32(h->q16[i]);
    }
    for (int64_t i = 0; i < nk; i++) {
        h->k16[i] = mkv_f32_to_f16(frand(&r, -1.0f, 1.0f));
        h->k[i] = mkv_f16_to_f32(h->k16[i]);
        h->v16[i] = mkv_f32_to_f16(frand(&r, -1.0f, 1.0f));
        h->v[i] = mkv_f16_to_f32(h->v16[i]);
    }
    const float scale = 1.0f / sqrtf((float)c->d);
    float *scratch = malloc(sizeof(float) * (size_t)(2 * h->max_len + 1));
    float *sig = malloc(sizeof(float) * (size_t)((int64_t)c->H * h->max_len + 1));
    cr_assert(scratch && sig);
    for (int32_t j = 0; j < c->n_seq; j++) {
        const int32_t n = c->lens[j], s0 = h->starts[j];
        if (n == 0) continue;
        mkv_attn_prefill(n, c->H, c->G, c->d, h->q + (int64_t)s0 * HG * c->d, h->k + (int64_t)s0 * c->H * c->d,
                         h->v + (int64_t)s0 * c->H * c->d, scale, c->obs_window,
                         h->out + (int64_t)s0 * HG * c->d, sig, scratch);
        for (int32_t hh = 0; hh < c->H; hh++)
            memcpy(h->sig + (int64_t)hh * h->total + s0, sig + (int64_t)hh * n, sizeof(float) * (size_t)n);
    }
    free(scratch);
    free(sig);
}

static void host_free(pf_host_t *h)
{
    free(h->q16), free(h->k16), free(h->v16);
    free(h->q), free(h->k), free(h->v), free(h->out), free(h->sig);
}

static float out_value(const void *buf, mkv_dtype_t dt, int64_t i)
{
    if (dt == MKV_DTYPE_F32) return ((const float *)buf)[i];
    const uint16_t b = ((const uint16_t *)buf)[i];
    return dt == MKV_DTYPE_F16 ? mkv_f16_to_f32(b) : mkv_bf16_to_f32(b);
}

static void case_name(const pf_case_t *c, mkv_dtype_t dt, char *buf, size_t len)
{
    int at = snprintf(buf, len, "d=%d G=%d H=%d obs=%d %s q+%d lens", c->d, c->G, c->H, c->obs_window,
                      mkv_dtype_name(dt), c->q_offset);
    for (int32_t j = 0; j < c->n_seq && at < (int)len; j++) at += snprintf(buf + at, len - (size_t)at, " %d", c->lens[j]);
}

/* Runs the GPU prefill for every out dtype and checks everything against the reference. */
static void run_case(const pf_case_t *c)
{
    pf_host_t h;
    host_build(c, &h);
    const int64_t HG = (int64_t)c->H * c->G, nq = (int64_t)h.total * HG * c->d, nk = (int64_t)h.total * c->H * c->d;
    const int64_t nsig = (int64_t)c->H * h.total;
    uint16_t *dq, *dk, *dv;
    int32_t *dstart;
    void *dout, *dws;
    float *dsig;
    const size_t ws = mkv_cuda_prefill_workspace_size(h.total, c->H, c->G, c->d);
    cr_assert_gt(ws, 0);
    CUDA_CHECK(cudaMalloc((void **)&dq, sizeof(uint16_t) * (size_t)(nq + 8)));
    CUDA_CHECK(cudaMalloc((void **)&dk, sizeof(uint16_t) * (size_t)(nk + 8)));
    CUDA_CHECK(cudaMalloc((void **)&dv, sizeof(uint16_t) * (size_t)(nk + 8)));
    CUDA_CHECK(cudaMalloc((void **)&dstart, sizeof(int32_t) * (size_t)(c->n_seq + 1)));
    CUDA_CHECK(cudaMalloc(&dout, sizeof(float) * (size_t)(nq + 1)));
    CUDA_CHECK(cudaMalloc((void **)&dsig, sizeof(float) * (size_t)(nsig + 1)));
    CUDA_CHECK(cudaMalloc(&dws, ws));
    CUDA_CHECK(cudaMemcpy(dq + c->q_offset, h.q16, sizeof(uint16_t) * (size_t)nq, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dk, h.k16, sizeof(uint16_t) * (size_t)nk, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dv, h.v16, sizeof(uint16_t) * (size_t)nk, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dstart, h.starts, sizeof(int32_t) * (size_t)(c->n_seq + 1), cudaMemcpyHostToDevice));
    float *got = malloc(sizeof(float) * (size_t)(nq + 1)), *gsig = malloc(sizeof(float) * (size_t)(nsig + 1));
    cr_assert(got && gsig);

    /* The last run asks for no significance (sig_sum NULL): the same outputs, sig_sum's buffer
     * left as poisoned. */
    const mkv_dtype_t dtypes[] = {MKV_DTYPE_F32, MKV_DTYPE_F16, MKV_DTYPE_BF16, MKV_DTYPE_F16};
    for (int di = 0; di < 4; di++) {
        const mkv_dtype_t dt = dtypes[di];
        const int no_sig = di == 3;
        char name[256];
        case_name(c, dt, name, sizeof name);
        if (no_sig) snprintf(name + strlen(name), sizeof name - strlen(name), " (no sig)");
        CUDA_CHECK(cudaMemset(dout, 0xff, sizeof(float) * (size_t)(nq + 1)));
        CUDA_CHECK(cudaMemset(dsig, 0xff, sizeof(float) * (size_t)(nsig + 1)));
        CUDA_CHECK(cudaMemset(dws, 0xff, ws));
        mkv_cuda_prefill_t a = {
            .n_seq = c->n_seq, .seq_start = dstart, .total_tokens = h.total, .max_len = h.max_len,
            .n_heads = c->H, .group_size = c->G, .head_dim = c->d, .q = dq + c->q_offset, .k = dk, .v = dv,
            .out = dout, .out_dtype = dt, .softmax_scale = 1.0f / sqrtf((float)c->d),
            .obs_window = c->obs_window, .sig_sum = no_sig ? NULL : dsig, .workspace = dws};
        char err[ERR_LEN] = "";
        const mkv_status_t st = mkv_cuda_prefill(&a, NULL, err);
        cr_assert_eq(st, MKV_STATUS_OK, "%s: %s (%s)", name, mkv_status_string(st), err);
        CUDA_CHECK(cudaDeviceSynchronize());
        const size_t el = mkv_dtype_size(dt);
        void *raw = malloc(el * (size_t)(nq + 1));
        cr_assert_not_null(raw);
        CUDA_CHECK(cudaMemcpy(raw, dout, el * (size_t)nq, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < nq; i++) got[i] = out_value(raw, dt, i);
        free(raw);
        CUDA_CHECK(cudaMemcpy(gsig, dsig, sizeof(float) * (size_t)nsig, cudaMemcpyDeviceToHost));

        const double round = dt == MKV_DTYPE_F32 ? 0.0 : dt == MKV_DTYPE_F16 ? 0x1p-11 : 0x1p-8;
        int64_t bad = 0, bad_sig = 0;
        double max_out = 0.0, max_sig = 0.0;
        for (int64_t i = 0; i < nq; i++) {
            const double e = fabs((double)got[i] - h.out[i]);
            if (!(e <= max_out)) max_out = isnan(e) ? INFINITY : e;
            if (e <= TOL_OUT + round * fabs(h.out[i])) continue;
            if (bad++ < MAX_REPORT) {
                const int64_t row = i / c->d;
                fprintf(stderr, "%s: out token %lld head %lld elem %lld: got %.6g want %.6g\n", name,
                        (long long)(row / HG), (long long)(row % HG), (long long)(i % c->d), got[i], h.out[i]);
            }
        }
        for (int64_t i = 0; i < nsig && no_sig; i++) {
            uint32_t w;
            memcpy(&w, gsig + i, 4);
            cr_assert_eq(w, 0xffffffffu, "%s: sig_sum[%lld] written without a sig_sum", name, (long long)i);
        }
        for (int64_t i = 0; i < nsig && !no_sig; i++) {
            const double e = fabs((double)gsig[i] - h.sig[i]);
            if (!(e <= max_sig)) max_sig = isnan(e) ? INFINITY : e;
            if (e <= TOL_SIG_REL * fabs(h.sig[i]) + TOL_SIG_ABS) continue;
            if (bad_sig++ < MAX_REPORT)
                fprintf(stderr, "%s: sig head %lld token %lld: got %.7g want %.7g\n", name,
                        (long long)(i / h.total), (long long)(i % h.total), gsig[i], h.sig[i]);
        }
        cr_log_info("%s: out max abs err %.3g, sig max abs err %.3g", name, max_out, max_sig);
        cr_expect_eq(bad, 0, "%s: %lld of %lld outputs out of tolerance", name, (long long)bad, (long long)nq);
        cr_expect_eq(bad_sig, 0, "%s: %lld of %lld sig_sum out of tolerance", name, (long long)bad_sig,
                     (long long)nsig);
    }
    free(got), free(gsig);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dstart), cudaFree(dout), cudaFree(dsig), cudaFree(dws);
    host_free(&h);
}

/* ---- Tests ---------------------------------------------------------------------------------- */

Test(prefill_cuda, awkward_batches, .timeout = 600)
{
    GPU_REQUIRE();
    const int32_t dims[] = {16, 64, 128}, groups[] = {1, 3, 4}, windows[] = {0, 64, 1000};
    uint64_t seed = 0x5eedf00dull;
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < 3; gi++)
            for (int wi = 0; wi < 3; wi++) {
                pf_case_t c = {.n_seq = 6, .lens = {1, 7, 0, 65, 130, 333}, .H = 2, .G = groups[gi],
                               .d = dims[di], .obs_window = windows[wi], .qscale = 2.0f, .seed = seed++};
                run_case(&c);
            }
}

/* Lengths around the tiles (forward: 128 / G tokens, significance: 64 keys), a peakier
 * softmax, and a long prompt. */
Test(prefill_cuda, tile_edges_and_long_prompt, .timeout = 600)
{
    GPU_REQUIRE();
    pf_case_t a = {.n_seq = 9, .lens = {63, 64, 65, 127, 128, 129, 31, 32, 33}, .H = 3, .G = 1, .d = 128,
                   .obs_window = 0, .qscale = 6.0f, .seed = 11};
    run_case(&a);
    a.G = 4, a.H = 1, a.d = 64, a.obs_window = 64, a.seed = 12;
    run_case(&a);
    a.G = 16, a.d = 128, a.obs_window = 0, a.seed = 15; /* 8 tokens per forward CTA */
    run_case(&a);
    pf_case_t b = {.n_seq = 2, .lens = {1500, 2}, .H = 2, .G = 4, .d = 128, .obs_window = 0, .qscale = 2.0f,
                   .seed = 13};
    run_case(&b);
    b.obs_window = 64, b.seed = 14;
    run_case(&b);
}

/* The generic kernels: the other head dims, G beyond the tensor-core limit, and d 64/128 with
 * q off 16-byte alignment. */
Test(prefill_cuda, generic_path, .timeout = 600)
{
    GPU_REQUIRE();
    pf_case_t a = {.n_seq = 3, .lens = {5, 100, 37}, .H = 2, .G = 2, .d = 32, .obs_window = 0, .qscale = 2.0f,
                   .seed = 21};
    run_case(&a);
    a.d = 256, a.obs_window = 16, a.seed = 22;
    run_case(&a);
    a.d = 64, a.G = 20, a.H = 1, a.obs_window = 0, a.seed = 23;
    run_case(&a);
    a.d = 128, a.G = 4, a.H = 2, a.q_offset = 2, a.seed = 24;
    run_case(&a);
    a.d = 64, a.G = 3, a.obs_window = 64, a.seed = 25;
    run_case(&a);
}

/* Argument checks happen before any CUDA call: this runs without a device. */
Test(prefill_cuda, bad_arguments)
{
    _Alignas(16) uint16_t buf[64];
    _Alignas(256) float fbuf[64];
    int32_t starts[2] = {0, 4};
    const mkv_cuda_prefill_t good = {
        .n_seq = 1, .seq_start = starts, .total_tokens = 4, .max_len = 4, .n_heads = 1, .group_size = 1,
        .head_dim = 16, .q = buf, .k = buf, .v = buf, .out = fbuf, .out_dtype = MKV_DTYPE_F32,
        .softmax_scale = 0.25f, .obs_window = 0, .sig_sum = fbuf, .workspace = fbuf};
    char err[ERR_LEN];
    cr_assert_eq(mkv_cuda_prefill(NULL, NULL, err), MKV_STATUS_INVALID_ARGUMENT);
    mkv_cuda_prefill_t a;
#define EXPECT_BAD(field, value)                                                                \
    do {                                                                                       \
        a = good;                                                                              \
        a.field = value;                                                                       \
        err[0] = 0;                                                                            \
        cr_expect_eq(mkv_cuda_prefill(&a, NULL, err), MKV_STATUS_INVALID_ARGUMENT, "%s = %s accepted", \
                     #field, #value);                                                          \
        cr_expect_neq(err[0], 0, "%s = %s: no message", #field, #value);                        \
    } while (0)
    EXPECT_BAD(n_seq, -1);
    EXPECT_BAD(n_seq, 70000);
    EXPECT_BAD(seq_start, NULL);
    EXPECT_BAD(total_tokens, -1);
    EXPECT_BAD(max_len, 5);
    EXPECT_BAD(max_len, -2);
    EXPECT_BAD(max_len, 3); /* 1 sequence of 4 tokens */
    EXPECT_BAD(max_len, 0);
    EXPECT_BAD(n_heads, 0);
    EXPECT_BAD(group_size, 0);
    EXPECT_BAD(group_size, 5000);
    EXPECT_BAD(head_dim, 48);
    EXPECT_BAD(head_dim, 512);
    EXPECT_BAD(out_dtype, (mkv_dtype_t)7);
    EXPECT_BAD(softmax_scale, NAN);
    EXPECT_BAD(softmax_scale, 0.0f);
    EXPECT_BAD(softmax_scale, -0.5f);
    EXPECT_BAD(obs_window, -1);
    EXPECT_BAD(q, NULL);
    EXPECT_BAD(k, NULL);
    EXPECT_BAD(v, NULL);
    EXPECT_BAD(out, NULL);
    EXPECT_BAD(workspace, NULL);
    EXPECT_BAD(q, buf + 1); /* 2-byte aligned */
    EXPECT_BAD(workspace, fbuf + 4); /* 16-byte aligned */
#undef EXPECT_BAD
    cr_expect_eq(mkv_cuda_prefill_workspace_size(-1, 1, 1, 64), 0);
    cr_expect_eq(mkv_cuda_prefill_workspace_size(10, 1, 1, 48), 0);
    cr_expect_eq(mkv_cuda_prefill_workspace_size(10, 0, 1, 64), 0);
    cr_expect_geq(mkv_cuda_prefill_workspace_size(10, 2, 3, 64), 10 * 2 * 3 * sizeof(float));
    /* Nothing to do is fine, and touches nothing. */
    a = good;
    a.n_seq = 0, a.total_tokens = 0, a.max_len = 0;
    cr_expect_eq(mkv_cuda_prefill(&a, NULL, err), MKV_STATUS_OK, "%s", err);
    a.n_seq = 0, a.total_tokens = 4, a.max_len = 4; /* tokens but no sequence */
    cr_expect_eq(mkv_cuda_prefill(&a, NULL, err), MKV_STATUS_INVALID_ARGUMENT);
}

/* Small enough for compute-sanitizer (memcheck, racecheck): both kernel families. */
Test(prefill_cuda, sanitizer_sized, .timeout = 600)
{
    GPU_REQUIRE();
    pf_case_t c = {.n_seq = 4, .lens = {1, 7, 65, 130}, .H = 2, .G = 4, .d = 64, .obs_window = 64, .qscale = 2.0f,
                   .seed = 31};
    run_case(&c);
    c.d = 128, c.G = 1, c.obs_window = 0, c.seed = 32;
    run_case(&c);
    c.d = 16, c.G = 3, c.seed = 33;
    run_case(&c);
}
