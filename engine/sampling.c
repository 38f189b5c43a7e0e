/*
 * sampling.c — greedy, temperature and top-p sampling (see sampling.h).
 *
 * Top-p keeps the most probable tokens, in descending probability (ties to the lower id),
 * until their mass reaches top_p, then draws one in proportion to probability. The generator
 * is splitmix64: one 53-bit uniform per sampled token.
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

int32_t mkv_sample(mkv_sampler_t *s, const float *logits, int32_t vocab, float *scratch)
{
    if (s->temperature <= 0.0f || vocab == 1) return argmax(logits, vocab);
    /* Softmax at the temperature, max-subtracted, in double for the normaliser. */
    const float m = logits[argmax(logits, vocab)];
    cand_t *c = (cand_t *)(void *)scratch; /* 2 floats per candidate */
    double z = 0.0;
    for (int32_t i = 0; i < vocab; i++) {
        c[i].p = expf((logits[i] - m) / s->temperature);
        c[i].id = i;
        z += c[i].p;
    }
    int32_t n = vocab;
    double mass = z;
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
        qsort(c, (size_t)vocab, sizeof *c, cmp_cand);
        double acc = 0.0;
        for (n = 0; n < vocab;) {
            acc += c[n++].p;
            if (acc >= (double)s->top_p * z) break;
        }
        mass = acc;
    }
    const double u = (double)(next(&s->state) >> 11) * 0x1.0p-53 * mass;
    double acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id; /* u rounded up to the total */
}
