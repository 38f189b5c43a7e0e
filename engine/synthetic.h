/*
 * synthetic.h — a seeded synthetic attention workload whose attention looks like a real
 * model's (docs/synthetic-workload.md): attention sinks at the first positions, a strong local
 * window, a few heavy hitters per head, and sharpness that differs across heads and requests.
 *
 * Stateless: every element is a hash of (seed, request, layer, head, position, element), so
 * any token's K, V or Q can be regenerated, e.g. for an exact float64 reference.
 */
#ifndef MKV_ENGINE_SYNTHETIC_H
#define MKV_ENGINE_SYNTHETIC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mkv_synth {
    int32_t n_layers, n_kv_heads, group_size, head_dim;
    uint64_t seed;
} mkv_synth_t;

/* The attention shape of one (request, layer, KV head); its query heads share it. */
typedef struct mkv_synth_profile {
    int32_t n_sinks;   /* positions 0 .. n_sinks - 1 are sinks (1 to 4) */
    float sink;        /* logit boost of a sink (4 to 8) */
    float heavy;       /* logit boost of a heavy hitter (3 to 7) */
    float heavy_rate;  /* chance that a position is a heavy hitter (0.2% to 2%) */
    float local;       /* logit boost at distance 0, fading over about 2 * local_len (3 to 8) */
    float local_len;   /* tokens (4 to 32) */
    float sharpness;   /* multiplies every boost: per head 0.5 to 2, per request 0.8 to 1.25 */
} mkv_synth_profile_t;

void mkv_synth_profile(const mkv_synth_t *w, int32_t req, int32_t layer, int32_t head,
                       mkv_synth_profile_t *out);

/* Key and value of KV head `head` at position pos: k[d], v[d]. */
void mkv_synth_kv(const mkv_synth_t *w, int32_t req, int32_t layer, int32_t head, int32_t pos,
                  float *k, float *v);

/* Query of query head qh (KV head qh / G) at position pos: q[d]. Logits are meant to be
 * scaled by 1 / sqrt(d). */
void mkv_synth_q(const mkv_synth_t *w, int32_t req, int32_t layer, int32_t qh, int32_t pos,
                 float *q);

/* A layer's tensors for positions pos0 .. pos0 + n - 1: q [n][H * G][d], k, v [n][H][d]
 * (any of them may be NULL). */
void mkv_synth_layer(const mkv_synth_t *w, int32_t req, int32_t layer, int32_t pos0, int32_t n,
                     float *q, float *k, float *v);

#ifdef __cplusplus
}
#endif

#endif /* MKV_ENGINE_SYNTHETIC_H */
