/*
 * sampling.h — choosing the next token from logits: greedy, temperature, top-p, seeded. Each
 * request owns its generator, so its tokens do not depend on what it is batched with.
 *
 * The choice is split in two so that a device can make it (mkv_forward_t's decode_sample): the
 * host draws the uniform from the request's generator (mkv_sampler_uniform, only when
 * mkv_sampler_draws says a draw is due), and the token for that uniform is a pure function of
 * the logits (mkv_sample_with_u), the reference the CUDA sampler (runner/sampling_cuda.h) is
 * tested against.
 */
#ifndef MKV_ENGINE_SAMPLING_H
#define MKV_ENGINE_SAMPLING_H

#include <stdint.h>

typedef struct mkv_sampler {
    float temperature; /* <= 0: greedy (argmax, ties to the lowest id) */
    float top_p;       /* (0, 1): sample from the smallest set of tokens whose probability
                          reaches top_p; otherwise (1, say): the whole vocabulary */
    uint64_t state;    /* generator state: seed it with mkv_sampler_seed */
} mkv_sampler_t;

void mkv_sampler_seed(mkv_sampler_t *s, uint64_t seed);

/* 1 when mkv_sample draws from s's generator for a vocabulary of vocab tokens (a temperature
 * above 0 and more than one token), 0 when it takes the argmax without a draw. */
int mkv_sampler_draws(const mkv_sampler_t *s, int32_t vocab);

/* The next uniform of s's generator in [0, 1): 53 random bits, exact in a double; advances s. */
double mkv_sampler_uniform(mkv_sampler_t *s);

/* The token that the uniform u in [0, 1) picks from logits [vocab] (finite) at temperature and
 * top_p; scratch: at least 2 * vocab floats (unused when greedy). Pure: the same arguments give
 * the same token. temperature <= 0 or vocab 1: the argmax (the lowest id among the largest),
 * u unused. Otherwise the probabilities are p_i = exp((logit_i - max) / temperature), the
 * difference and the quotient in float, exp in double rounded to float (so that a device gets
 * the same bits; see sampling.c); the kept set is, for top_p in (0, 1), the shortest prefix of
 * the tokens in descending p (ties to the lower id) whose double sum reaches top_p times the
 * sum of every p, else every token in id order; the token is the first of the kept set, in
 * that order, whose running double sum exceeds u times the kept set's sum (the last one when u
 * rounds up to it). */
int32_t mkv_sample_with_u(const float *logits, int32_t vocab, float temperature, float top_p, double u,
                          float *scratch);

/* The next token: mkv_sample_with_u with the next uniform of s's generator when
 * mkv_sampler_draws(s, vocab), the argmax (no draw) otherwise. scratch as above. */
int32_t mkv_sample(mkv_sampler_t *s, const float *logits, int32_t vocab, float *scratch);

#endif /* MKV_ENGINE_SAMPLING_H */
