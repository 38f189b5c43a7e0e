/*
 * sampling.c — greedy, temperature and top-p sampling (see sampling.h).
 *
 * Top-p keeps the most probable tokens, in descending probability (ties to the lower id),
 * until their mass reaches top_p, then draws one in proportion to probability. The generator
 * is splitmix64: one 53-bit uniform per sampled token.
 *
 * NOTE: each probability is exp in double rounded to float, not expf: glibc's expf is not
 * correctly rounded (it differs from the rounded double exp in about 1e-4 of the arguments,
 * and its FMA build from its plain one), while the rounded double exp is, but for about one
 * argument in 2^29, on any host and on CUDA; so the device sampler (runner/sampling_cuda.cu)
 * computes the same float probabilities and differs from this reference only in the order of
 * its double sums.
 */
#include "engine/sampling.h"

#include <math.h>
#include <stdlib.h>

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void mkv_sampler_seed(mkv_sampler_t *s, uint64_t seed) { s->state = seed; }

int mkv_sampler_draws(const mkv_sampler_t *s, int32_t vocab) { return s->temperature > 0.0f && vocab > 1; }

double mkv_sampler_uniform(mkv_sampler_t *s) { return (double)(next(&s->state) >> 11) * 0x1.0p-53; }

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Sort key for top-p: probability descending, id ascending. */
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

int32_t mkv_sample_with_u(const float *logits, int32_t vocab, float temperature, float top_p, double u,
                          float *scratch)
{
    if (temperature <= 0.0f || vocab == 1) return argmax(logits, vocab);
    /* Softmax at the temperature, max-subtracted, in double for the normaliser. */
    const float m = logits[argmax(logits, vocab)];
    cand_t *c = (cand_t *)(void *)scratch; /* 2 floats per candidate */
    double z = 0.0;
    for (int32_t i = 0; i < vocab; i++) {
        const float x = (logits[i] - m) / temperature;
        c[i].p = (float)exp((double)x);
        c[i].id = i;
        z += c[i].p;
    }
    int32_t n = vocab;
    double mass = z;
    if (top_p > 0.0f && top_p < 1.0f) {
        qsort(c, (size_t)vocab, sizeof *c, cmp_cand);
        double acc = 0.0;
        for (n = 0; n < vocab;) {
            acc += c[n++].p;
            if (acc >= (double)top_p * z) break;
        }
        mass = acc;
    }
    const double x = u * mass;
    double acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (x < acc) return c[i].id;
    }
    return c[n - 1].id; /* x rounded up to the total */
}

int32_t mkv_sample(mkv_sampler_t *s, const float *logits, int32_t vocab, float *scratch)
{
    if (!mkv_sampler_draws(s, vocab)) return argmax(logits, vocab);
    return mkv_sample_with_u(logits, vocab, s->temperature, s->top_p, mkv_sampler_uniform(s), scratch);
}
