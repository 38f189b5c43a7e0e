/*
 * sampling.h — choosing the next token from logits: greedy, temperature, top-p, seeded. Each
 * request owns its generator, so its tokens do not depend on what it is batched with.
 */
#ifndef MKV_ENGINE_SAMPLING_H
#define MKV_ENGINE_SAMPLING_H

#include <stdint.h>

typedef struct mkv_sampler {
    float temperature; /* <= 0: greedy (argmax, ties to the lowest id) */
    float top_p;       /* (0, 1]: sample from the smallest set of tokens whose probability
                          reaches top_p; 1: the whole vocabulary */
    uint64_t state;    /* generator state: seed it with mkv_sampler_seed */
} mkv_sampler_t;

void mkv_sampler_seed(mkv_sampler_t *s, uint64_t seed);

/* The next token. scratch: at least 2 * vocab floats (unused when greedy). */
int32_t mkv_sample(mkv_sampler_t *s, const float *logits, int32_t vocab, float *scratch);

#endif /* MKV_ENGINE_SAMPLING_H */
