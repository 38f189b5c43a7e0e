/*
 * prefill_ref.c — reference causal prefill attention over a full-precision prompt, with the
 * prompt-phase significance of DESIGN.md section 5 (the CPU backend; see attention.h).
 *
 * Significance needs, for each observing query j and KV head h, max over the G query heads of
 * the group of P(j -> i), for every i <= j. Keeping all G probability rows would take G * n
 * floats of scratch; instead each query head is handled on its own in two passes over the keys
 * (flash-attention style), and a per-i running max over the group is kept:
 *   1. an online softmax gives the row's max logit m and sum s = sum_i exp(l_i - m);
 *   2. the logits are recomputed, p_i = exp(l_i - m) / s, out += p_i * v_i, and the running max
 *      of p_i over the group is updated.
 * This costs the keys' dot products twice, and fits the documented scratch of n + d floats
 * (n: running max, d: output accumulator). Arithmetic is fp32 throughout.
 */
#include "attention/attention.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* The operation order is decode_ref.c's, step for step (logits, a sequential max, exp and
 * sum, normalisation, then accumulation in token order), so that row j of a prefill equals a
 * decode over the same tokens bit for bit: a request recomputed after preemption then
 * continues exactly as it would have (docs/decisions.md). */
static float logit(const float *q, const float *k, int32_t d, float softmax_scale)
{
    float dot = 0.0f;
    for (int32_t e = 0; e < d; e++) dot += q[e] * k[e];
    return softmax_scale * dot;
}

void mkv_attn_prefill(int32_t n, int32_t H, int32_t G, int32_t d, const float *q, const float *k,
                      const float *v, float softmax_scale, int32_t obs_window, float *out,
                      float *sig_sum, float *scratch)
{
    assert(n >= 0 && H >= 1 && G >= 1 && d >= 1);
    memset(sig_sum, 0, sizeof(float) * (size_t)H * (size_t)(n > 0 ? n : 0));

    float *p = scratch;        /* [n] logits, then probabilities, of one query head */
    float *rmax = scratch + n; /* [n] max over the group of P(j -> i), for the current j */
    const int32_t first_observer = obs_window > 0 ? n - obs_window : 0;
    const int64_t q_stride = (int64_t)H * G * d; /* one position of q and out */
    const int64_t kv_stride = (int64_t)H * d;    /* one position of k and v */

    for (int32_t h = 0; h < H; h++) {
        const float *kh = k + (int64_t)h * d;
        const float *vh = v + (int64_t)h * d;
        float *sig = sig_sum + (int64_t)h * n;
        for (int32_t j = 0; j < n; j++) {
            const int observe = j >= first_observer;
            if (observe) memset(rmax, 0, sizeof(float) * (size_t)(j + 1));
            for (int32_t g = 0; g < G; g++) {
                const int64_t qh = (int64_t)j * q_stride + ((int64_t)h * G + g) * d;
                const float *qg = q + qh;
                for (int32_t i = 0; i <= j; i++) p[i] = logit(qg, kh + i * kv_stride, d, softmax_scale);
                float m = p[0];
                for (int32_t i = 1; i <= j; i++) m = p[i] > m ? p[i] : m;
                float sum = 0.0f;
                for (int32_t i = 0; i <= j; i++) {
                    p[i] = expf(p[i] - m);
                    sum += p[i];
                }
                for (int32_t i = 0; i <= j; i++) p[i] /= sum;

                float *og = out + qh;
                memset(og, 0, sizeof(float) * (size_t)d);
                for (int32_t i = 0; i <= j; i++) {
                    const float *vi = vh + i * kv_stride;
                    for (int32_t e = 0; e < d; e++) og[e] += p[i] * vi[e];
                    if (observe && p[i] > rmax[i]) rmax[i] = p[i];
                }
            }
            if (observe)
                for (int32_t i = 0; i <= j; i++) sig[i] += rmax[i];
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The blocked prefill                                                                      */
/* ---------------------------------------------------------------------------------------- */
/*
 * Sixteen query rows at a time (one lane each, GCC vector types compiled for AVX-512 and for the
 * default target): per query head of the group, every logit of the block's rows against keys
 * 0 .. the block's last row (a multiply, then an add, over e in order, as logit() does; keys
 * past a row's own position get -inf, whose exp is 0 and whose additions to the row's sum and
 * output are exact no-ops on finite values), the max, exp and sum per row in key order, the
 * normalisation, the output accumulated in key order, and the max over the group kept per
 * (row, key). Rows are processed in waves of WAVE rows: first every (head, 16-row block) of the
 * wave in parallel, then the wave's maxima are added into sig_sum in row order, split by key
 * ranges, so each sum runs over j in order as in the reference.
 */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__clang__)
#define MKV_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define MKV_CLONES
#endif

typedef float v16f __attribute__((vector_size(64)));
#define ROWS 16
#define WAVE 128
#define KEY_CHUNK 256
#define MAX_D 256 /* quant/format.c accepts d up to 256 */

static int64_t round16(int64_t x) { return (x + 15) & ~(int64_t)15; }

int64_t mkv_attn_prefill_blocked_scratch(int32_t n, int32_t H, int32_t G, int32_t d, int32_t parts)
{
    const int64_t wave = (int64_t)H * WAVE * round16(n);       /* maxima of a wave */
    const int64_t part = (int64_t)G * round16(n) * ROWS        /* logits, probabilities */
                         + (int64_t)d * ROWS;                  /* the rows' q, transposed */
    return wave + (int64_t)(parts < 1 ? 1 : parts) * part + 16;
}

typedef struct pf_ctx {
    int32_t n, H, G, d, first_observer, wave_j0, wave_rows;
    const float *q, *k, *v;
    float scale;
    float *out, *sig, *rmax, *part_scratch;
    int64_t part_floats, npad;
} pf_ctx_t;

/* Logits of rows j0 .. j0+rows-1 (lanes) against keys [0, nk): L[i][lane]. */
MKV_CLONES static void block_logits(const pf_ctx_t *c, const float *qT, const float *kh,
                                    int32_t j0, int32_t nk, float *L)
{
    const int32_t d = c->d;
    const int64_t ks = (int64_t)c->H * d;
    int32_t i = 0;
    for (; i + 4 <= nk; i += 4) {
        v16f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        const float *k0 = kh + i * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;
        for (int32_t e = 0; e < d; e++) {
            v16f qe;
            memcpy(&qe, qT + (int64_t)e * ROWS, sizeof qe);
            a0 += qe * k0[e];
            a1 += qe * k1[e];
            a2 += qe * k2[e];
            a3 += qe * k3[e];
        }
        a0 = c->scale * a0, a1 = c->scale * a1, a2 = c->scale * a2, a3 = c->scale * a3;
        memcpy(L + (int64_t)(i + 0) * ROWS, &a0, sizeof a0);
        memcpy(L + (int64_t)(i + 1) * ROWS, &a1, sizeof a1);
        memcpy(L + (int64_t)(i + 2) * ROWS, &a2, sizeof a2);
        memcpy(L + (int64_t)(i + 3) * ROWS, &a3, sizeof a3);
    }
    for (; i < nk; i++) {
        v16f a = {0};
        const float *ki = kh + i * ks;
        for (int32_t e = 0; e < d; e++) {
            v16f qe;
            memcpy(&qe, qT + (int64_t)e * ROWS, sizeof qe);
            a += qe * ki[e];
        }
        a = c->scale * a;
        memcpy(L + (int64_t)i * ROWS, &a, sizeof a);
    }
    /* The causal mask: key i > row j0 + lane. */
    for (int32_t ii = j0 + 1; ii < nk; ii++)
        for (int32_t lane = 0; lane < ii - j0 && lane < ROWS; lane++) L[(int64_t)ii * ROWS + lane] = -INFINITY;
}

/* Output rows: out[row] = sum over keys in order of p * v, four rows at a time. */
MKV_CLONES static void block_pv(const pf_ctx_t *c, const float *P, const float *vh, int32_t rows,
                                int32_t nk, float *acc /* [ROWS][d] */)
{
    const int32_t d = c->d;
    const int64_t vs = (int64_t)c->H * d;
    memset(acc, 0, sizeof(float) * (size_t)ROWS * (size_t)d);
    for (int32_t r0 = 0; r0 < rows; r0 += 4) {
        float *o0 = acc + (int64_t)r0 * d, *o1 = o0 + d, *o2 = o1 + d, *o3 = o2 + d;
        for (int32_t i = 0; i < nk; i++) {
            const float *vi = vh + i * vs, *pi = P + (int64_t)i * ROWS + r0;
            const float p0 = pi[0], p1 = pi[1], p2 = pi[2], p3 = pi[3];
            for (int32_t e = 0; e < d; e++) {
                o0[e] += p0 * vi[e];
                o1[e] += p1 * vi[e];
                o2[e] += p2 * vi[e];
                o3[e] += p3 * vi[e];
            }
        }
    }
}

/* Item (h, block): rows wave_j0 + 16 * block .. of KV head h, every query head of the group. */
static void block_item(const pf_ctx_t *c, int64_t item, int32_t part)
{
    const int32_t blocks = (c->wave_rows + ROWS - 1) / ROWS;
    const int32_t h = (int32_t)(item / blocks), b = (int32_t)(item % blocks);
    const int32_t d = c->d, G = c->G;
    const int32_t j0 = c->wave_j0 + b * ROWS;
    const int32_t rows = c->n - j0 < ROWS ? c->n - j0 : ROWS;
    const int32_t nk = j0 + rows; /* keys 0 .. the last row */
    float *L = c->part_scratch + (int64_t)part * c->part_floats; /* [G][npad][ROWS] */
    float *qT = L + (int64_t)G * c->npad * ROWS;                 /* [d][ROWS] */
    const float *kh = c->k + (int64_t)h * d, *vh = c->v + (int64_t)h * d;
    const int64_t q_stride = (int64_t)c->H * G * d;
    float acc[ROWS * MAX_D];
    for (int32_t g = 0; g < G; g++) {
        float *Lg = L + (int64_t)g * c->npad * ROWS;
        for (int32_t e = 0; e < d; e++)
            for (int32_t lane = 0; lane < ROWS; lane++)
                qT[e * ROWS + lane] =
                    lane < rows ? c->q[(int64_t)(j0 + lane) * q_stride + ((int64_t)h * G + g) * d + e] : 0.0f;
        block_logits(c, qT, kh, j0, nk, Lg);
        float m[ROWS], sum[ROWS];
        for (int32_t lane = 0; lane < ROWS; lane++) m[lane] = Lg[lane];
        for (int32_t i = 1; i < nk; i++)
            for (int32_t lane = 0; lane < ROWS; lane++) {
                const float x = Lg[(int64_t)i * ROWS + lane];
                m[lane] = x > m[lane] ? x : m[lane];
            }
        for (int32_t lane = 0; lane < ROWS; lane++) sum[lane] = 0.0f;
        for (int32_t i = 0; i < nk; i++)
            for (int32_t lane = 0; lane < ROWS; lane++) {
                float *x = &Lg[(int64_t)i * ROWS + lane];
                *x = expf(*x - m[lane]);
                sum[lane] += *x;
            }
        for (int32_t i = 0; i < nk; i++)
            for (int32_t lane = 0; lane < ROWS; lane++) Lg[(int64_t)i * ROWS + lane] /= sum[lane];
        block_pv(c, Lg, vh, rows, nk, acc);
        for (int32_t r = 0; r < rows; r++)
            memcpy(c->out + (int64_t)(j0 + r) * q_stride + ((int64_t)h * G + g) * d, acc + (int64_t)r * d,
                   sizeof(float) * (size_t)d);
    }
    /* The max over the group per (row, key), for the rows that observe. */
    for (int32_t r = 0; r < rows; r++) {
        const int32_t j = j0 + r;
        if (j < c->first_observer) continue;
        float *rm = c->rmax + ((int64_t)h * WAVE + (j - c->wave_j0)) * c->npad;
        for (int32_t i = 0; i <= j; i++) {
            float mx = 0.0f;
            for (int32_t g = 0; g < G; g++) {
                const float p = L[((int64_t)g * c->npad + i) * ROWS + r];
                mx = p > mx ? p : mx;
            }
            rm[i] = mx;
        }
    }
}

static void blocks_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    for (int64_t i = b; i < e; i++) block_item(ctx, i, part);
}

/* Item (h, key chunk): sig[h][i] += the wave's maxima, rows in order. */
static void sig_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    (void)part;
    const pf_ctx_t *c = ctx;
    const int64_t chunks = (c->wave_j0 + c->wave_rows + KEY_CHUNK - 1) / KEY_CHUNK;
    for (int64_t it = b; it < e; it++) {
        const int32_t h = (int32_t)(it / chunks);
        const int32_t i0 = (int32_t)(it % chunks) * KEY_CHUNK;
        float *sig = c->sig + (int64_t)h * c->n;
        for (int32_t r = 0; r < c->wave_rows; r++) {
            const int32_t j = c->wave_j0 + r;
            if (j < c->first_observer) continue;
            const int32_t i1 = i0 + KEY_CHUNK < j + 1 ? i0 + KEY_CHUNK : j + 1;
            const float *rm = c->rmax + ((int64_t)h * WAVE + r) * c->npad;
            for (int32_t i = i0; i < i1; i++) sig[i] += rm[i];
        }
    }
}

void mkv_attn_prefill_blocked(int32_t n, int32_t H, int32_t G, int32_t d, const float *q,
                              const float *k, const float *v, float softmax_scale,
                              int32_t obs_window, float *out, float *sig_sum, float *scratch,
                              int32_t parts, mkv_attn_run_fn run, void *runner)
{
    assert(n >= 0 && H >= 1 && G >= 1 && d >= 1 && d <= MAX_D);
    memset(sig_sum, 0, sizeof(float) * (size_t)H * (size_t)(n > 0 ? n : 0));
    if (n <= 0) return;
    if (parts < 1 || !run) parts = 1;
    pf_ctx_t c = {.n = n, .H = H, .G = G, .d = d,
                  .first_observer = obs_window > 0 ? n - obs_window : 0,
                  .q = q, .k = k, .v = v, .scale = softmax_scale, .out = out, .sig = sig_sum};
    c.npad = round16(n);
    c.rmax = scratch;
    c.part_scratch = scratch + (int64_t)H * WAVE * c.npad;
    c.part_floats = (int64_t)G * c.npad * ROWS + (int64_t)d * ROWS;
    for (int32_t j0 = 0; j0 < n; j0 += WAVE) {
        c.wave_j0 = j0;
        c.wave_rows = n - j0 < WAVE ? n - j0 : WAVE;
        const int64_t items = (int64_t)H * ((c.wave_rows + ROWS - 1) / ROWS);
        const int64_t sig_items = (int64_t)H * ((j0 + c.wave_rows + KEY_CHUNK - 1) / KEY_CHUNK);
        if (run) {
            run(runner, blocks_range, &c, items);
            if (j0 + c.wave_rows > c.first_observer) run(runner, sig_range, &c, sig_items);
        } else {
            blocks_range(&c, 0, items, 0);
            if (j0 + c.wave_rows > c.first_observer) sig_range(&c, 0, sig_items, 0);
        }
    }
}
