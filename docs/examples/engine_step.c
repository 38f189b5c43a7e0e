/*
 * engine_step.c — the calling sequence of an engine driving mixkv as its KV backend: admit a
 * request, run its prompt through every layer, commit it, then decode a few steps (append,
 * every layer, compress) and release it. The model is replaced by random Q/K/V; a real engine
 * passes its projections here. Built as `example_engine_step` (docs/api.md walks through it).
 */
#include <mixkv.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        mkv_status_t st_ = (call);                                                             \
        if (st_ != MKV_STATUS_OK) {                                                            \
            fprintf(stderr, "%s: %s: %s\n", #call, mkv_status_string(st_),                     \
                    cache ? mkv_cache_last_error(cache) : mkv_last_error());                   \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

/* Uniform in [-scale/2, scale/2]. Larger query scales give peakier attention: with nearly
 * uniform attention every token receives at least its share, and nothing is compressed. */
static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = scale * ((float)rand() / (float)RAND_MAX - 0.5f);
}

int main(void)
{
    enum { L = 2, H = 2, G = 4, D = 64, PROMPT = 100, STEPS = 20 };
    mkv_cache_t *cache = NULL;
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT; /* K8V4 / K4V2, alpha_h 1, alpha_l 0.02 */
    cfg.n_layers = L;
    cfg.n_kv_heads = H;
    cfg.group_size = G;
    cfg.head_dim = D;
    cfg.max_seqs = 4;
    cfg.max_seq_len = 512;
    cfg.window = 16;
    cfg.pool_pages = 256;
    CHECK(mkv_cache_create(&cfg, &cache));

    static float q[PROMPT * H * G * D], k[PROMPT * H * D], v[PROMPT * H * D], out[PROMPT * H * G * D];

    /* 1. Schedule: check, then act. Admission reserves the prompt's worst-case pages. */
    int ok = 0;
    int32_t slot;
    CHECK(mkv_cache_can_admit(cache, PROMPT, &ok));
    if (!ok) return 1;
    CHECK(mkv_cache_admit(cache, PROMPT, &slot));

    /* Prompt phase: each layer's attention in full precision, then one commit places the
     * tokens in high and low pages (or prunes them) per head-region. */
    for (int32_t l = 0; l < L; l++) {
        fill(q, sizeof q / sizeof *q, 40.0f);
        fill(k, sizeof k / sizeof *k, 1.0f);
        fill(v, sizeof v / sizeof *v, 1.0f);
        CHECK(mkv_cache_prefill_layer(cache, slot, l, q, k, v, out, NULL)); /* out: the layer's attention */
    }
    CHECK(mkv_cache_commit_prompt(cache, 1, &slot, NULL));

    for (int step = 0; step < STEPS; step++) {
        /* Preempt if the worst case of this step does not fit (one sequence here: it does). */
        int64_t demand;
        mkv_cache_stats_t st;
        CHECK(mkv_cache_step_demand(cache, 1, &slot, &demand));
        CHECK(mkv_cache_stats(cache, &st));
        if (demand > st.available_pages) break;

        /* 2. Plan and allocate: one more high-precision slot per head-region. */
        CHECK(mkv_cache_append(cache, 1, &slot, NULL));
        /* 3. Per layer: the new token's K/V go in, attention comes out. */
        for (int32_t l = 0; l < L; l++) {
            fill(q, H * G * D, 40.0f);
            fill(k, H * D, 1.0f);
            fill(v, H * D, 1.0f);
            CHECK(mkv_cache_decode_layer(cache, 1, &slot, l, q, k, v, out, NULL));
        }
        /* 4. Compress and recycle: Algorithm 1 per head-region. */
        CHECK(mkv_cache_compress(cache, 1, &slot, NULL));
    }

    mkv_cache_stats_t st;
    CHECK(mkv_cache_stats(cache, &st));
    printf("after %d tokens: %lld high, %lld low, %lld pruned token-heads; %lld KV bytes vs %lld "
           "for FP16\n",
           PROMPT + STEPS, (long long)st.tokens_hi, (long long)st.tokens_lo,
           (long long)st.tokens_pruned, (long long)st.bytes_in_use, (long long)st.bytes_fp16);
    CHECK(mkv_cache_validate(cache));

    /* 5. A finished request returns every page. */
    CHECK(mkv_cache_release(cache, slot, NULL));
    mkv_cache_destroy(cache);
    return 0;
}
