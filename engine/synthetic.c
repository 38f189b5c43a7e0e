/*
 * synthetic.c — the synthetic workload (see synthetic.h, docs/synthetic-workload.md).
 *
 * Vectors of d elements are built from three parts whose dot products add up to the intended
 * logits (times sqrt(d), undone by the usual 1 / sqrt(d) scale):
 *   element 0            salience: a key's boost (sink, heavy hitter, else ~0) times the
 *                        query's sharpness, so sinks and heavy hitters attract every query;
 *   elements 1 .. 2F     F rotary pairs at frequencies spread over (0, pi / (2 local_len)]:
 *                        sum_f cos(w_f (n - t)) is F at distance 0 and fades with distance,
 *                        the strong local window;
 *   the rest             Gaussian content, scaled so it adds logit noise of about 1.
 * Values are Gaussian. F = d / 8.
 */
#include "engine/synthetic.h"

#include <math.h>
#include <stddef.h>

enum { KIND_PROFILE = 1, KIND_HEAVY, KIND_KEY, KIND_VALUE, KIND_QUERY };

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash6(uint64_t seed, int kind, int32_t req, int32_t layer, int32_t head, int32_t pos)
{
    uint64_t h = mix(seed ^ (uint64_t)kind * 0x100000001b3ull);
    h = mix(h ^ (uint64_t)(uint32_t)req);
    h = mix(h ^ ((uint64_t)(uint32_t)layer << 20) ^ (uint64_t)(uint32_t)head);
    return mix(h ^ (uint64_t)(uint32_t)pos);
}

/* Uniform in [0, 1) from element e of stream h. */
static double unif(uint64_t h, uint32_t e) { return (double)(mix(h + e) >> 11) * 0x1.0p-53; }

/* Standard normal (Box-Muller) from elements 2e, 2e + 1 of stream h. */
static float gauss(uint64_t h, uint32_t e)
{
    double u1 = unif(h, 2 * e), u2 = unif(h, 2 * e + 1);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static float lerp(double u, float a, float b) { return a + (float)u * (b - a); }

void mkv_synth_profile(const mkv_synth_t *w, int32_t req, int32_t layer, int32_t head,
                       mkv_synth_profile_t *p)
{
    const uint64_t h = hash6(w->seed, KIND_PROFILE, req, layer, head, 0);
    const uint64_t hr = hash6(w->seed, KIND_PROFILE, req, -1, -1, 0); /* per request */
    p->n_sinks = 1 + (int32_t)(unif(h, 0) * 4.0);
    p->sink = lerp(unif(h, 1), 4.0f, 8.0f);
    p->heavy = lerp(unif(h, 2), 3.0f, 7.0f);
    p->heavy_rate = (float)exp(lerp(unif(h, 3), (float)log(0.002), (float)log(0.02)));
    p->local = lerp(unif(h, 4), 3.0f, 8.0f);
    p->local_len = (float)exp(lerp(unif(h, 5), (float)log(4.0), (float)log(32.0)));
    p->sharpness = (float)exp(lerp(unif(h, 6), (float)log(0.5), (float)log(2.0))) *
                   (float)exp(lerp(unif(hr, 7), (float)log(0.8), (float)log(1.25)));
}

static int32_t pairs(const mkv_synth_t *w) { return w->head_dim / 8; }

static float freq(const mkv_synth_profile_t *p, int32_t f, int32_t F)
{
    return 1.5707963f / p->local_len * (float)(f + 1) / (float)F;
}

void mkv_synth_kv(const mkv_synth_t *w, int32_t req, int32_t layer, int32_t head, int32_t pos,
                  float *k, float *v)
{
    mkv_synth_profile_t p;
    mkv_synth_profile(w, req, layer, head, &p);
    const int32_t d = w->head_dim, F = pairs(w), content = d - 1 - 2 * F;
    if (k) {
        const uint64_t hk = hash6(w->seed, KIND_KEY, req, layer, head, pos);
        const int heavy = unif(hash6(w->seed, KIND_HEAVY, req, layer, head, pos), 0) < p.heavy_rate;
        k[0] = pos < p.n_sinks ? p.sink : heavy ? p.heavy : 0.1f * gauss(hk, 0);
        const float amp = sqrtf(p.local / (float)F);
        for (int32_t f = 0; f < F; f++) {
            const float a = freq(&p, f, F) * (float)pos;
            k[1 + 2 * f] = amp * cosf(a);
            k[2 + 2 * f] = amp * sinf(a);
        }
        for (int32_t e = 0; e < content; e++) k[1 + 2 * F + e] = gauss(hk, (uint32_t)(1 + e));
    }
    if (v) {
        const uint64_t hv = hash6(w->seed, KIND_VALUE, req, layer, head, pos);
        for (int32_t e = 0; e < d; e++) v[e] = gauss(hv, (uint32_t)e);
    }
}

void mkv_synth_q(const mkv_synth_t *w, int32_t req, int32_t layer, int32_t qh, int32_t pos, float *q)
{
    mkv_synth_profile_t p;
    mkv_synth_profile(w, req, layer, qh / w->group_size, &p);
    const int32_t d = w->head_dim, F = pairs(w), content = d - 1 - 2 * F;
    const float root_d = sqrtf((float)d), amp = sqrtf(p.local / (float)F);
    const uint64_t hq = hash6(w->seed, KIND_QUERY, req, layer, qh, pos);
    /* Query heads of one group differ a little in sharpness: the group's max matters. */
    const float sharp = p.sharpness * (0.85f + 0.3f * (float)unif(hq, 0));
    q[0] = root_d * sharp;
    for (int32_t f = 0; f < F; f++) {
        const float a = freq(&p, f, F) * (float)pos;
        q[1 + 2 * f] = root_d * sharp * amp * cosf(a);
        q[2 + 2 * f] = root_d * sharp * amp * sinf(a);
    }
    /* Content noise of logit std ~1: sum of `content` products of N(0, 1) x N(0, s^2). */
    const float s = content > 0 ? root_d / sqrtf((float)content) : 0.0f;
    for (int32_t e = 0; e < content; e++) q[1 + 2 * F + e] = s * gauss(hq, (uint32_t)(1 + e));
}

void mkv_synth_layer(const mkv_synth_t *w, int32_t req, int32_t layer, int32_t pos0, int32_t n,
                     float *q, float *k, float *v)
{
    const int64_t H = w->n_kv_heads, Hq = H * w->group_size, d = w->head_dim;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t h = 0; h < H && (k || v); h++)
            mkv_synth_kv(w, req, layer, (int32_t)h, pos0 + (int32_t)i, k ? k + (i * H + h) * d : NULL,
                         v ? v + (i * H + h) * d : NULL);
        for (int64_t qh = 0; qh < Hq && q; qh++)
            mkv_synth_q(w, req, layer, (int32_t)qh, pos0 + (int32_t)i, q + (i * Hq + qh) * d);
    }
}
