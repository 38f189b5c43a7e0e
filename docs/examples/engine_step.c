/*
 * engine_step.c — the calling sequence of an engine driving mixkv as its KV backend: admit
 * requests, run their prompts through every layer (one batched call per layer), commit them,
 * then decode steps (append, every layer, compress) and release them. The model is replaced by
 * random Q/K/V in fp16; a real engine passes its projections here. Built as
 * `example_engine_step` (docs/api.md walks through it):
 *
 *   example_engine_step          the CPU backend (host tensors)
 *   example_engine_step cuda     the CUDA backend (device tensors), with asynchronous steps:
 *                                no host synchronisation inside a step; refusals are collected
 *                                by mkv_cache_sync at the end of each step
 */
#include <mixkv.h>

#ifdef MKV_EXAMPLE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        mkv_status_t st_ = (call);                                                             \
        if (st_ != MKV_STATUS_OK) {                                                            \
            fprintf(stderr, "%s: %s: %s\n", #call, mkv_status_string(st_),                     \
                    cache ? mkv_cache_last_error(cache) : mkv_last_error());                   \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

enum { L = 2, H = 2, G = 4, D = 64, SEQS = 2, PROMPT0 = 100, PROMPT1 = 37, STEPS = 20 };
enum { ROWS = PROMPT0 + PROMPT1 };

/* fp16 bits of x (round to nearest even; the example's values are small and normal). */
static uint16_t to_f16(float x)
{
    union { float f; uint32_t u; } v = {x};
    const uint32_t sign = (v.u >> 16) & 0x8000u, a = v.u & 0x7fffffffu;
    if (a < 0x38800000u) return (uint16_t)sign; /* tiny: flush (not reached here) */
    uint32_t h = ((a >> 13) - (112u << 10));
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* Uniform in [-scale/2, scale/2]. Larger query scales give peakier attention: with nearly
 * uniform attention every token receives at least its share, and nothing is compressed. */
static void fill(uint16_t *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = to_f16(scale * ((float)rand() / (float)RAND_MAX - 0.5f));
}

/* Where the tensors live: host memory for the CPU backend, device memory for CUDA. */
typedef struct tensors {
    int on_device;
    uint16_t *hq, *hk, *hv;      /* host staging (the "model") */
    void *q, *k, *v, *out;       /* what the calls receive */
} tensors_t;

static int tensors_init(tensors_t *t, int on_device)
{
    const size_t nq = (size_t)ROWS * H * G * D * 2, nkv = (size_t)ROWS * H * D * 2;
    memset(t, 0, sizeof *t);
    t->on_device = on_device;
    t->hq = malloc(nq), t->hk = malloc(nkv), t->hv = malloc(nkv);
    if (!t->hq || !t->hk || !t->hv) return 1;
    if (!on_device) {
        t->q = t->hq, t->k = t->hk, t->v = t->hv;
        t->out = malloc(nq);
        return t->out == NULL;
    }
#ifdef MKV_EXAMPLE_CUDA
    if (cudaMalloc(&t->q, nq) != cudaSuccess || cudaMalloc(&t->k, nkv) != cudaSuccess ||
        cudaMalloc(&t->v, nkv) != cudaSuccess || cudaMalloc(&t->out, nq) != cudaSuccess)
        return 1;
    return 0;
#else
    return 1;
#endif
}

/* The next `rows` rows of Q/K/V from the "model". */
static void produce(tensors_t *t, int32_t rows)
{
    fill(t->hq, (size_t)rows * H * G * D, 40.0f);
    fill(t->hk, (size_t)rows * H * D, 1.0f);
    fill(t->hv, (size_t)rows * H * D, 1.0f);
#ifdef MKV_EXAMPLE_CUDA
    if (t->on_device) {
        cudaMemcpy(t->q, t->hq, (size_t)rows * H * G * D * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(t->k, t->hk, (size_t)rows * H * D * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(t->v, t->hv, (size_t)rows * H * D * 2, cudaMemcpyHostToDevice);
    }
#endif
}

static void tensors_free(tensors_t *t)
{
#ifdef MKV_EXAMPLE_CUDA
    if (t->on_device) {
        cudaFree(t->q), cudaFree(t->k), cudaFree(t->v), cudaFree(t->out);
        t->out = NULL;
    }
#endif
    if (!t->on_device) free(t->out);
    free(t->hq), free(t->hk), free(t->hv);
}

int main(int argc, char **argv)
{
    const int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (argc > 1 && !cuda && strcmp(argv[1], "cpu") != 0) {
        fprintf(stderr, "usage: %s [cpu|cuda]\n", argv[0]);
        return 2;
    }
    mkv_cache_t *cache = NULL;
    if (cuda) {
        int available = 0;
        CHECK(mkv_backend_available(MKV_BACKEND_CUDA, &available));
#ifndef MKV_EXAMPLE_CUDA
        available = 0;
#endif
        if (!available) {
            fprintf(stderr, "engine_step: the CUDA backend is not available here\n");
            return 3;
        }
    }
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT; /* K8V4 / K4V2, alpha_h 1, alpha_l 0.02 */
    cfg.n_layers = L;
    cfg.n_kv_heads = H;
    cfg.group_size = G;
    cfg.head_dim = D;
    cfg.max_seqs = 4;
    cfg.max_seq_len = 512;
    cfg.window = 16;
    cfg.pool_pages = 256;
    if (cuda) {
        cfg.backend = MKV_BACKEND_CUDA;
        cfg.flags |= MKV_CACHE_ASYNC_STEPS;
    }
    CHECK(mkv_cache_create(&cfg, &cache));
    tensors_t t;
    if (tensors_init(&t, cuda)) {
        fprintf(stderr, "engine_step: cannot allocate the tensors\n");
        return 1;
    }
    void *stream = NULL; /* a real engine passes its cudaStream_t */

    /* 1. Schedule: check, then act. Admission reserves each prompt's worst-case pages. */
    const int32_t prompts[SEQS] = {PROMPT0, PROMPT1};
    int32_t slots[SEQS];
    for (int i = 0; i < SEQS; i++) {
        int ok = 0;
        CHECK(mkv_cache_can_admit(cache, prompts[i], &ok));
        if (!ok) return 1;
        CHECK(mkv_cache_admit(cache, prompts[i], &slots[i]));
    }

    /* Prompt phase: each layer's attention in full precision for both prompts at once (their
     * rows one after the other), then one commit places the tokens in high and low pages (or
     * prunes them) per head-region. */
    for (int32_t l = 0; l < L; l++) {
        produce(&t, ROWS);
        CHECK(mkv_cache_prefill_layer_ex(cache, SEQS, slots, l, MKV_DTYPE_F16, t.q, t.k, t.v, t.out,
                                         stream)); /* out: the layer's attention */
    }
    CHECK(mkv_cache_commit_prompt(cache, SEQS, slots, stream));

    for (int step = 0; step < STEPS; step++) {
        /* Preempt if the worst case of this step does not fit (it does here). */
        int64_t demand;
        mkv_cache_stats_t st;
        CHECK(mkv_cache_step_demand(cache, SEQS, slots, &demand));
        CHECK(mkv_cache_stats(cache, &st));
        if (demand > st.available_pages) break;

        /* 2. Plan and allocate: one more high-precision slot per head-region. */
        CHECK(mkv_cache_append(cache, SEQS, slots, stream));
        /* 3. Per layer: the new tokens' K/V go in, attention comes out. */
        for (int32_t l = 0; l < L; l++) {
            produce(&t, SEQS);
            CHECK(mkv_cache_decode_layer_ex(cache, SEQS, slots, l, MKV_DTYPE_F16, t.q, t.k, t.v, t.out,
                                            stream));
        }
        /* 4. Compress and recycle: Algorithm 1 per head-region. */
        CHECK(mkv_cache_compress(cache, SEQS, slots, stream));
        /* Asynchronous steps: a refusal on the device is reported here (CPU: always OK). */
        CHECK(mkv_cache_sync(cache, stream));
    }

    mkv_cache_stats_t st;
    CHECK(mkv_cache_stats(cache, &st));
    printf("%s backend, after %d steps: %lld high, %lld low, %lld pruned token-heads; %lld KV "
           "bytes vs %lld for FP16\n",
           cuda ? "cuda" : "cpu", STEPS, (long long)st.tokens_hi, (long long)st.tokens_lo,
           (long long)st.tokens_pruned, (long long)st.bytes_in_use, (long long)st.bytes_fp16);
    CHECK(mkv_cache_validate(cache));

    /* 5. Finished requests return every page. */
    for (int i = 0; i < SEQS; i++) CHECK(mkv_cache_release(cache, slots[i], stream));
    tensors_free(&t);
    mkv_cache_destroy(cache);
    return 0;
}
