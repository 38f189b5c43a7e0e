/*
 * forward_cuda.h — the model runner's forward pass on CUDA: a Llama-family model (loaded by
 * runner/model.h, fp32 on the host) copied to the device in f32, f16 or bf16, cuBLAS GEMMs with
 * fp32 accumulation, RMSNorm, RoPE (Hugging Face's rotate_half layout, angles in double as on
 * the CPU), SiLU-and-multiply and an fp32 residual stream on the device, and every layer's
 * attention through a CUDA-backend cache (mkv_cache_prefill_layer_ex / decode_layer_ex, device
 * tensors of the same element type). Exposed as mixkv.h's mkv_forward_t, so the scheduler loop
 * drives it exactly as it drives the CPU pass (runner/model.h, mkv_model_forward).
 *
 * What differs from the CPU pass: the order of every sum (GEMMs, norms), and in f16 / bf16 the
 * rounding of weights and activations; the residual stream and the logits stay fp32.
 */
#ifndef MKV_RUNNER_FORWARD_CUDA_H
#define MKV_RUNNER_FORWARD_CUDA_H

#include "mixkv.h"
#include "runner/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mkv_cuda_forward mkv_cuda_forward_t;

/* The model's weights on the current device in dtype, and scratch for up to max_tokens tokens
 * a call (a prompt, or a decode batch). The model may be freed afterwards. Errors:
 * INVALID_ARGUMENT (a null argument, max_tokens < 1, a dtype out of range), OUT_OF_MEMORY,
 * CUDA_ERROR (no device, or a failing call), with the reason in err. */
mkv_status_t mkv_cuda_forward_create(const mkv_model_t *m, int32_t max_tokens, mkv_dtype_t dtype,
                                     mkv_cuda_forward_t **out, char *err);
void mkv_cuda_forward_free(mkv_cuda_forward_t *f);

/* A model of shape c with deterministic stand-in weights made on the device from seed
 * (projections uniform in +-1/sqrt(fan-in), embeddings in +-1, norms 1): throughput at real
 * sizes without the weights (--dummy-weights). Its outputs mean nothing. */
mkv_status_t mkv_cuda_forward_create_dummy(const mkv_model_config_t *c, uint64_t seed, int32_t max_tokens,
                                           mkv_dtype_t dtype, mkv_cuda_forward_t **out, char *err);

/* One rank of a tensor-parallel pass (runner/forward_tp.h). Rank r of n holds, Megatron-style,
 * query heads [r H/n, (r+1) H/n), KV heads [r Hkv/n, (r+1) Hkv/n) and FFN columns
 * [r I/n, (r+1) I/n): the rows of Wq, Wk, Wv, W_gate and W_up and the columns of Wo and W_down
 * that belong to them (column- then row-parallel), and a replica of the embeddings, the norms,
 * lm_head and the fp32 residual stream. After each layer's output and down projections,
 * all_reduce sums every rank's stream in place: rank 0 adds its product to the stream (beta 1),
 * the others write theirs alone (beta 0), so the sum is the stream plus every rank's part. A
 * rank's cache holds its Hkv/n KV heads. Only rank 0 computes the head: the other ranks' calls
 * write no logits and no tokens. n = 1 is the single-GPU pass, operation for operation. */
typedef struct mkv_cuda_shard {
    int32_t rank, n_ranks;
    /* Sums x [n] (fp32, on this rank's device) over the ranks in place, on the default stream;
     * called by every rank in the same order. NULL when n_ranks is 1. */
    mkv_status_t (*all_reduce)(void *ctx, float *x, int64_t n, char *err);
    void *ctx;
} mkv_cuda_shard_t;

/* mkv_cuda_forward_create and _create_dummy for one rank (shard NULL: the whole model). The
 * stand-in weights of a rank are the same numbers as the whole model's rows and columns it
 * holds, so n ranks run the same model as one. INVALID_ARGUMENT when n_ranks does not divide
 * the heads, the KV heads and the FFN width. */
mkv_status_t mkv_cuda_forward_create_ex(const mkv_model_t *m, const mkv_cuda_shard_t *shard, int32_t max_tokens,
                                        mkv_dtype_t dtype, mkv_cuda_forward_t **out, char *err);
mkv_status_t mkv_cuda_forward_create_dummy_ex(const mkv_model_config_t *c, uint64_t seed,
                                              const mkv_cuda_shard_t *shard, int32_t max_tokens,
                                              mkv_dtype_t dtype, mkv_cuda_forward_t **out, char *err);

/* The model shape this pass (rank) runs: the heads, KV heads and FFN width of its share. */
const mkv_model_config_t *mkv_cuda_forward_config(const mkv_cuda_forward_t *f);

/* Bytes of its weights on the device (what a decode step reads at least once). */
int64_t mkv_cuda_forward_weight_bytes(const mkv_cuda_forward_t *f);

/* The pass as an mkv_forward_t; the cache must use the CUDA backend on the same device and
 * have the model's geometry (L, KV heads, G, head_dim). f must outlive every use. Its decode
 * also takes logits NULL: the logits are computed and left on the device (a benchmark's step
 * without the copy to the host). It offers decode_greedy and decode_sample (the tokens chosen
 * on the device, runner/sampling_cuda.h; only they cross to the host). */
mkv_forward_t mkv_cuda_forward(mkv_cuda_forward_t *f);

/* Where the calls' time goes on the device, measured with events at phase boundaries once
 * timing is on (a little overhead: one event per boundary): GEMMs (the projections), the
 * cache's layer calls (the new tokens' writes and attention), its step calls (append,
 * compress, commit), the rest of the layers (norms, RoPE, SiLU, embedding), and the head
 * (final norm, lm_head, the logits' copy), and with several ranks the all-reduces (time a
 * rank waits there for the others included). Milliseconds summed over every call since the last
 * reset. */
enum {
    MKV_CUDA_PHASE_GEMM = 0,
    MKV_CUDA_PHASE_ATTENTION,
    MKV_CUDA_PHASE_CACHE,
    MKV_CUDA_PHASE_OTHER,
    MKV_CUDA_PHASE_HEAD,
    MKV_CUDA_PHASE_ALL_REDUCE, /* tensor parallelism: the sums over the ranks */
    MKV_CUDA_PHASES
};
mkv_status_t mkv_cuda_forward_set_timing(mkv_cuda_forward_t *f, int on);
void mkv_cuda_forward_phases(mkv_cuda_forward_t *f, double ms[MKV_CUDA_PHASES], int reset);

/* CUDA graphs of decode steps (on: 1). The pass then launches on a stream of its own, captures
 * a decode step (append, every layer, compress, head, greedy picks) into a graph and launches
 * the graph again while the batch, its slots and the kind of picks stay the same, at most
 * `horizon` times a capture (the cache plans each captured attention call for that many:
 * mkv_cache_set_capture_horizon); a new capture updates the graph in place where it can.
 * Steps with timing on, with the logits copied to the host, or with sampled picks run as
 * before. The cache must have MKV_CACHE_ASYNC_STEPS. INVALID_ARGUMENT for horizon < 1 when on;
 * UNSUPPORTED with tensor parallelism. */
mkv_status_t mkv_cuda_forward_set_graphs(mkv_cuda_forward_t *f, int on, int32_t horizon);
/* Captures, in-place updates among them, and launches of captured steps since graphs were
 * last turned on. */
void mkv_cuda_forward_graph_stats(const mkv_cuda_forward_t *f, int64_t *captures, int64_t *updates,
                                  int64_t *launches);

/* Whether this build has the CUDA pass (0: mkv_cuda_forward_create returns UNSUPPORTED). */
int mkv_cuda_forward_available(void);
/* The current device's name ("NVIDIA H100 80GB HBM3") into buf; "none" without CUDA or a
 * device. Results name the card they ran on with it. */
void mkv_cuda_device_name(char *buf, int n);

#ifdef __cplusplus
}
#endif

#endif /* MKV_RUNNER_FORWARD_CUDA_H */
