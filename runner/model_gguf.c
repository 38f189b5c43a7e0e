/*
 * model_gguf.c — a llama-architecture GGUF file (runner/gguf.h) into an mkv_model_t, the same
 * fp32 row-major [out][in] weights that a Hugging Face folder gives (docs/model.md).
 *
 * The config comes from the `llama.*` keys, the vocabulary size from token_embd, BOS / EOS from
 * the tokenizer keys. Every weight is dequantized straight into a buffer the model owns, so the
 * file's mapping is closed when loading ends. GGUF lists a 2-D shape as [ne0 = in, ne1 = out],
 * which is the same memory order as Hugging Face's [out][in].
 *
 * NOTE: llama.cpp's converter permutes the rows of attn_q / attn_k within each head so that
 * RoPE rotates adjacent pairs (2i, 2i+1). forward.c rotates Hugging Face's halves (i, i + hd/2),
 * so the rows are put back while dequantizing: GGUF row 2i + j of a head (j = 0, 1) becomes
 * row i + j hd/2. Q . K is unchanged by applying one permutation to both.
 *
 * Projections of a type the packed weights keep quantized (Q4_0, Q4_1, Q8_0: weights.h) also
 * keep a copy of their blocks (mkv_qblocks_t), rows reordered the same way.
 */
#include "runner/gguf.h"
#include "runner/model.h"
#include "runner/weights.h"

#include "runner/error.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* A required positive int32 llama.* key. */
static mkv_status_t key_pos(const mkv_gguf_t *g, const char *key, int32_t *out, char *err)
{
    mkv_status_t st = mkv_gguf_get_i32(g, key, out, err);
    if (st == MKV_STATUS_OK && *out < 1)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "GGUF key %s must be positive (found %d)",
                        key, *out);
    return st;
}

/* An optional key: absent leaves *out unchanged. */
static mkv_status_t key_pos_opt(const mkv_gguf_t *g, const char *key, int32_t *out, char *err)
{
    return mkv_gguf_find(g, key) ? key_pos(g, key, out, err) : MKV_STATUS_OK;
}

static mkv_status_t key_float_opt(const mkv_gguf_t *g, const char *key, float *out, char *err)
{
    if (!mkv_gguf_find(g, key)) return MKV_STATUS_OK;
    mkv_status_t st = mkv_gguf_get_f32(g, key, out, err);
    if (st == MKV_STATUS_OK && !(*out > 0.0f && *out < 1e30f))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "GGUF key %s must be a positive number",
                        key);
    return st;
}

/* A token id key: absent gives -1; present must be within the vocabulary. */
static mkv_status_t key_token(const mkv_gguf_t *g, const char *key, int32_t vocab, int32_t *out,
                              char *err)
{
    *out = -1;
    if (!mkv_gguf_find(g, key)) return MKV_STATUS_OK;
    mkv_status_t st = mkv_gguf_get_i32(g, key, out, err);
    if (st == MKV_STATUS_OK && (*out < 0 || *out >= vocab))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "GGUF key %s = %d is outside the vocabulary [0, %d)", key, *out, vocab);
    return st;
}

static mkv_status_t read_config(const mkv_gguf_t *g, mkv_model_config_t *c, char *err)
{
    mkv_gguf_str_t arch;
    mkv_status_t status;
    RUNNER_TRY(mkv_gguf_get_str(g, "general.architecture", &arch, err));
    if (arch.len != 5 || memcmp(arch.ptr, "llama", 5) != 0)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "GGUF architecture '%.*s' is not supported (llama only)",
                        (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    memset(c, 0, sizeof *c);
    RUNNER_TRY(key_pos(g, "llama.context_length", &c->max_pos, err));
    RUNNER_TRY(key_pos(g, "llama.embedding_length", &c->hidden, err));
    RUNNER_TRY(key_pos(g, "llama.block_count", &c->n_layers, err));
    RUNNER_TRY(key_pos(g, "llama.feed_forward_length", &c->intermediate, err));
    RUNNER_TRY(key_pos(g, "llama.attention.head_count", &c->n_heads, err));
    c->n_kv_heads = c->n_heads;
    RUNNER_TRY(key_pos_opt(g, "llama.attention.head_count_kv", &c->n_kv_heads, err));
    c->rope_theta = 10000.0f;
    RUNNER_TRY(key_float_opt(g, "llama.rope.freq_base", &c->rope_theta, err));
    RUNNER_TRY(mkv_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &c->rms_eps, err));
    if (!(c->rms_eps > 0.0f && c->rms_eps < 1.0f))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "GGUF key llama.attention.layer_norm_rms_epsilon = %g (0 to 1)",
                        (double)c->rms_eps);

    int32_t kl = 0, vl = 0, rd = 0;
    RUNNER_TRY(key_pos_opt(g, "llama.attention.key_length", &kl, err));
    RUNNER_TRY(key_pos_opt(g, "llama.attention.value_length", &vl, err));
    if (!kl && c->hidden % c->n_heads != 0)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "llama.embedding_length %d is not a multiple of head_count %d", c->hidden,
                        c->n_heads);
    c->head_dim = kl ? kl : c->hidden / c->n_heads;
    if (vl && vl != c->head_dim)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "llama.attention.value_length %d differs from the key length %d", vl,
                        c->head_dim);
    RUNNER_TRY(key_pos_opt(g, "llama.rope.dimension_count", &rd, err));
    if (rd && rd != c->head_dim)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "llama.rope.dimension_count %d: partial RoPE is not supported (head_dim %d)",
                        rd, c->head_dim);
    if (c->n_heads % c->n_kv_heads != 0)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "llama.attention.head_count %d is not a multiple of head_count_kv %d",
                        c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 != 0 || (int64_t)c->n_heads * c->head_dim > INT32_MAX / 2)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "head_dim %d with %d heads", c->head_dim,
                        c->n_heads);

    /* Refused rather than silently ignored: they change the model. */
    const mkv_gguf_kv_t *rs = mkv_gguf_find(g, "llama.rope.scaling.type");
    if (rs && !(rs->type == MKV_GGUF_STRING && rs->str.len == 4 && memcmp(rs->str.ptr, "none", 4) == 0))
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "llama.rope.scaling.type %.*s is not supported",
                        rs->type == MKV_GGUF_STRING ? (int)(rs->str.len > 32 ? 32 : rs->str.len) : 3,
                        rs->type == MKV_GGUF_STRING ? rs->str.ptr : "set");
    float lin = 1.0f;
    RUNNER_TRY(key_float_opt(g, "llama.rope.scale_linear", &lin, err));
    if (lin != 1.0f)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "llama.rope.scale_linear %g is not supported",
                        (double)lin);
    int32_t experts = 0;
    if (mkv_gguf_find(g, "llama.expert_count")) RUNNER_TRY(mkv_gguf_get_i32(g, "llama.expert_count", &experts, err));
    if (experts > 0)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "llama.expert_count %d: mixture of experts",
                        experts);

    /* The vocabulary is token_embd's row count; a stated vocab_size must agree. */
    const mkv_gguf_tensor_t *emb = mkv_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "missing tensor token_embd.weight");
    if (emb->n_dims != 2 || emb->ne[1] < 1 || emb->ne[1] > INT32_MAX)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "tensor token_embd.weight: %d dims, ne1 = %lld", emb->n_dims,
                        (long long)emb->ne[1]);
    c->vocab = (int32_t)emb->ne[1];
    int32_t vs = c->vocab;
    RUNNER_TRY(key_pos_opt(g, "llama.vocab_size", &vs, err));
    if (vs != c->vocab)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "llama.vocab_size %d differs from token_embd.weight's %d rows", vs,
                        c->vocab);
    c->tied = mkv_gguf_find_tensor(g, "output.weight") == NULL;
    RUNNER_TRY(key_token(g, "tokenizer.ggml.bos_token_id", c->vocab, &c->bos, err));
    RUNNER_TRY(key_token(g, "tokenizer.ggml.eos_token_id", c->vocab, &c->eos, err));
    /* Nine tensors per block: bounds block_count by the file before allocating layers. */
    if (c->n_layers > mkv_gguf_n_tensors(g) / 9)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "llama.block_count %d, but the file holds only %lld tensors", c->n_layers,
                        (long long)mkv_gguf_n_tensors(g));
    return MKV_STATUS_OK;
fail:
    return status;
}

/* Dequantizes tensor `name`, of GGUF shape [in] (out == 0) or [in, out], into an owned buffer.
 * heads > 0: rows are heads x hd with llama.cpp's Q/K permutation, undone. qdst (or NULL):
 * also an owned copy of the blocks, rows in the same order, when the packed weights can keep
 * the type quantized (weights.h); left empty otherwise. */
static mkv_status_t load_tensor(mkv_model_t *m, const mkv_gguf_t *g, const char *name,
                                int64_t in, int64_t out, int32_t heads, const float **dst,
                                mkv_qblocks_t *qdst, char *err)
{
    const mkv_gguf_tensor_t *t = mkv_gguf_find_tensor(g, name);
    const int32_t nd = out ? 2 : 1;
    if (!t) {
        if (out) return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "missing tensor %s (shape [%lld, %lld])", name, (long long)in, (long long)out);
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "missing tensor %s (shape [%lld])", name, (long long)in);
    }
    if (t->n_dims != nd || t->ne[0] != in || (out && t->ne[1] != out))
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "tensor %s: expected GGUF shape [%lld, %lld] (ne0 first), found "
                        "[%lld, %lld, %lld, %lld] (%d dims)",
                        name, (long long)in, (long long)(out ? out : 1), (long long)t->ne[0],
                        (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], t->n_dims);
    if (!mkv_ggml_can_dequantize(t->type))
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "tensor %s has type %s (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                        "Q4_K, Q6_K)",
                        name, mkv_ggml_type_name(t->type));
    const int64_t rows = out ? out : 1;
    float *buf = mkv_model_own(m, (size_t)(in * rows) * sizeof(float), err);
    if (!buf) return MKV_STATUS_OUT_OF_MEMORY;
    const uint64_t row_bytes = t->nbytes / (uint64_t)rows;
    const uint8_t *src = t->data;
    uint8_t *qbuf = NULL;
    if (qdst && out && in % MKV_QBLOCK == 0 && mkv_wmat_quant_supported(t->type)) {
        qbuf = mkv_model_own(m, (size_t)t->nbytes, err);
        if (!qbuf) return MKV_STATUS_OUT_OF_MEMORY;
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t to = r;
        if (heads > 0) {
            const int64_t hd = rows / heads, h = r / hd, w = r % hd;
            to = h * hd + (w % 2) * (hd / 2) + w / 2;
        }
        mkv_status_t st = mkv_ggml_dequantize(t->type, src + (uint64_t)r * row_bytes,
                                              buf + to * in, in, err);
        if (st != MKV_STATUS_OK) return st;
        /* Row-blocked types: the permutation moves whole rows of blocks. */
        if (qbuf) memcpy(qbuf + (uint64_t)to * row_bytes, src + (uint64_t)r * row_bytes, row_bytes);
    }
    *dst = buf;
    if (qbuf) *qdst = (mkv_qblocks_t){t->type, qbuf};
    return MKV_STATUS_OK;
}

mkv_status_t mkv_model_load_gguf(const char *path, mkv_model_t *m, char *err)
{
    char msg[MKV_ERR_LEN];
    mkv_gguf_t *g = NULL;
    mkv_status_t status;
    RUNNER_TRY(mkv_gguf_open(path, &g, err));
    status = read_config(g, &m->cfg, msg);
    if (status != MKV_STATUS_OK) {
        runner_fail(err, status, "%s: %s", path, msg);
        goto fail;
    }
    const mkv_model_config_t *c = &m->cfg;
    const int64_t D = c->hidden, V = c->vocab, I = c->intermediate, hd = c->head_dim;
    const int64_t QD = c->n_heads * hd, KD = c->n_kv_heads * hd;
    mkv_layer_weights_t *layers = mkv_model_own(m, (size_t)c->n_layers * sizeof *layers, msg);
    if (!layers) {
        status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "%s: %s", path, msg);
        goto fail;
    }
    memset(layers, 0, (size_t)c->n_layers * sizeof *layers);
    m->layers = layers;
#define TENSOR(name, in, out, heads, dst, qdst)                                                \
    do {                                                                                       \
        status = load_tensor(m, g, name, in, out, heads, dst, qdst, msg);                      \
        if (status != MKV_STATUS_OK) {                                                         \
            runner_fail(err, status, "%s: %s", path, msg);                                        \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)
    /* The embedding's blocks are kept only as the tied lm_head's. */
    TENSOR("token_embd.weight", D, V, 0, &m->embed, c->tied ? &m->qlm_head : NULL);
    if (c->tied) m->lm_head = m->embed;
    else TENSOR("output.weight", D, V, 0, &m->lm_head, &m->qlm_head);
    TENSOR("output_norm.weight", D, 0, 0, &m->final_norm, NULL);
    for (int32_t l = 0; l < c->n_layers; l++) {
        mkv_layer_weights_t *w = &layers[l];
        char nm[MKV_GGUF_MAX_NAME + 1];
#define LAYER(suffix, in, out, heads, field, qdst)                                             \
    do {                                                                                       \
        snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, suffix);                                \
        TENSOR(nm, in, out, heads, &w->field, qdst);                                           \
    } while (0)
        LAYER("attn_norm", D, 0, 0, attn_norm, NULL);
        LAYER("attn_q", D, QD, c->n_heads, wq, &w->qwq);
        LAYER("attn_k", D, KD, c->n_kv_heads, wk, &w->qwk);
        LAYER("attn_v", D, KD, 0, wv, &w->qwv);
        LAYER("attn_output", QD, D, 0, wo, &w->qwo);
        LAYER("ffn_norm", D, 0, 0, mlp_norm, NULL);
        LAYER("ffn_gate", D, I, 0, w_gate, &w->qw_gate);
        LAYER("ffn_up", D, I, 0, w_up, &w->qw_up);
        LAYER("ffn_down", I, D, 0, w_down, &w->qw_down);
#undef LAYER
    }
#undef TENSOR
    mkv_gguf_close(g); /* nothing points into the mapping */
    return MKV_STATUS_OK;
fail:
    mkv_gguf_close(g);
    return status;
}
