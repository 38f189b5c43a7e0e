/*
 * model.h — Llama-family models on the CPU reference path (docs/model.md): a Hugging Face
 * folder (config.json, *.safetensors, optionally sharded through model.safetensors.index.json)
 * or a GGUF file loaded into fp32, and a forward pass whose attention goes through the mixkv cache.
 *
 * Kept separate from the KV backend: the model only produces Q, K, V per layer and consumes the
 * attention output; where tokens live and at which precision is the cache's business. The GPU
 * runner will follow the same structure.
 */
#ifndef MKV_ENGINE_MODEL_H
#define MKV_ENGINE_MODEL_H

#include "mixkv.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mkv_model_config {
    int32_t hidden;       /* hidden_size */
    int32_t n_layers;     /* num_hidden_layers */
    int32_t n_heads;      /* num_attention_heads */
    int32_t n_kv_heads;   /* num_key_value_heads (default n_heads) */
    int32_t head_dim;     /* head_dim (default hidden / n_heads) */
    int32_t intermediate; /* intermediate_size */
    int32_t vocab;        /* vocab_size */
    int32_t max_pos;      /* max_position_embeddings */
    float rope_theta;     /* default 10000 */
    float rms_eps;        /* rms_norm_eps */
    int32_t tied;         /* tie_word_embeddings */
    int32_t bos, eos;     /* bos_token_id, eos_token_id (-1 when absent) */
} mkv_model_config_t;

/* A GGUF projection's quantized blocks, kept beside its fp32 copy so that the packed weights
 * (runner/weights.h) can stay quantized: the fp32 copy holds exactly what these blocks
 * dequantize to. blocks == NULL: none (a Hugging Face folder, or a type weights.c does not
 * pack quantized). */
typedef struct mkv_qblocks {
    uint32_t type;                    /* ggml type id (runner/gguf.h) */
    const void *blocks;               /* [out][in / block_elems] blocks, rows in the model's
                                         order (llama.cpp's Q/K permutation undone) */
} mkv_qblocks_t;

/* Weights, fp32, row-major as in the checkpoint ([out][in] for projections). */
typedef struct mkv_layer_weights {
    const float *attn_norm;           /* [hidden] input_layernorm */
    const float *wq, *wk, *wv, *wo;   /* [H*hd][hidden], [Hkv*hd][hidden] x2, [hidden][H*hd] */
    const float *mlp_norm;            /* [hidden] post_attention_layernorm */
    const float *w_gate, *w_up;       /* [inter][hidden] */
    const float *w_down;              /* [hidden][inter] */
    mkv_qblocks_t qwq, qwk, qwv, qwo, qw_gate, qw_up, qw_down; /* GGUF: the same, quantized */
} mkv_layer_weights_t;

typedef struct mkv_model {
    mkv_model_config_t cfg;
    const float *embed;               /* [vocab][hidden] */
    mkv_layer_weights_t *layers;      /* [n_layers] */
    const float *final_norm;          /* [hidden] */
    const float *lm_head;             /* [vocab][hidden]; == embed when tied */
    mkv_qblocks_t qlm_head;           /* GGUF: lm_head's quantized blocks (or none) */
    void *storage;                    /* owned: converted tensors, mappings */
} mkv_model_t;

/* Loads a model: `path` is a Hugging Face folder, or a GGUF file (a regular file: architecture
 * llama, weights dequantized to fp32, runner/model_gguf.c). Errors name the file, tensor or
 * field: IO_ERROR (missing files, a FIFO or device where a file is expected), PARSE_ERROR
 * (malformed JSON, safetensors or GGUF), UNSUPPORTED (architecture other than LlamaForCausalLM /
 * MistralForCausalLM / Qwen2ForCausalLM without biases or GGUF llama, dtype other than F32 /
 * F16 / BF16 or a GGUF type without a dequantizer, rope scaling), INVALID_ARGUMENT (a missing
 * tensor or a wrong shape). */
mkv_status_t mkv_model_load(const char *path, mkv_model_t **out, char *err);
void mkv_model_free(mkv_model_t *m);

/* Internal to the loaders. mkv_model_load_gguf fills a zeroed model whose storage model.c set
 * up (cfg, weights, layers); mkv_model_own returns `bytes` bytes freed with the model, or NULL
 * with OUT_OF_MEMORY's message in err. */
mkv_status_t mkv_model_load_gguf(const char *path, mkv_model_t *m, char *err);
void *mkv_model_own(mkv_model_t *m, size_t bytes, char *err);

/* A cache config for this model (L, H, G, d, from the model; the rest from base). */
void mkv_model_cache_config(const mkv_model_t *m, const mkv_cache_config_t *base,
                            mkv_cache_config_t *out);
void mkv_model_config_cache(const mkv_model_config_t *c, const mkv_cache_config_t *base,
                            mkv_cache_config_t *out);

/* A model's shape without its weights: path is a Hugging Face folder or its config.json (the
 * same checks as mkv_model_load). For runs at real sizes on random weights (--dummy-weights). */
mkv_status_t mkv_model_config_load(const char *path, mkv_model_config_t *out, char *err);

/* A built-in shape by name: "llama-3-8b" (Meta-Llama-3-8B's config.json). INVALID_ARGUMENT
 * for another name. */
mkv_status_t mkv_model_config_builtin(const char *name, mkv_model_config_t *out, char *err);

/* Scratch for the forward pass, sized for up to max_tokens tokens at once (a prompt or a
 * batch of decode tokens). */
typedef struct mkv_forward_ws mkv_forward_ws_t;
mkv_status_t mkv_forward_ws_create(const mkv_model_t *m, int32_t max_tokens, mkv_forward_ws_t **out,
                                   char *err);
void mkv_forward_ws_free(mkv_forward_ws_t *ws);

/* Threads the forward pass uses (the caller's thread counts as one): 1 to 256; a workspace
 * starts with one per online core. Results do not depend on it (docs/model.md, "Speed"). */
mkv_status_t mkv_forward_ws_set_threads(mkv_forward_ws_t *ws, int32_t n_threads);

/* The CPU forward pass of ws's model through ws, as mixkv.h's mkv_forward_t (what the
 * scheduler loop drives): prefill is mkv_model_prefill, decode is mkv_model_decode. ws must
 * outlive every use. */
mkv_forward_t mkv_model_forward(mkv_forward_ws_t *ws);
int32_t mkv_forward_ws_threads(const mkv_forward_ws_t *ws);

/* The prompt of an admitted slot (tokens[n], n == the admitted prompt_len) through every layer
 * (mkv_cache_prefill_layer), then mkv_cache_commit_prompt. logits: [n][vocab] for every
 * position, or NULL; last_logits: [vocab] of the last position, or NULL. */
mkv_status_t mkv_model_prefill(const mkv_model_t *m, mkv_cache_t *cache, int32_t slot,
                               const int32_t *tokens, int32_t n, float *logits, float *last_logits,
                               mkv_forward_ws_t *ws);

/* One decode step for n_slots sequences: mkv_cache_append, every layer through
 * mkv_cache_decode_layer (each token at its sequence's next position), mkv_cache_compress.
 * tokens: [n_slots]; logits: [n_slots][vocab]. */
mkv_status_t mkv_model_decode(const mkv_model_t *m, mkv_cache_t *cache, int32_t n_slots,
                              const int32_t *slots, const int32_t *tokens, float *logits,
                              mkv_forward_ws_t *ws);

#ifdef __cplusplus
}
#endif

#endif /* MKV_ENGINE_MODEL_H */
