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
