/*
 * tokenizer_gguf.c — the tokenizer a GGUF file describes in its metadata (tokenizer.ggml.*:
 * model, pre, tokens, merges, token_type, the bos / eos / unknown / padding ids and
 * add_bos_token), built through mkv_tokenizer_create_bpe. mkv_tokenizer_load takes this path
 * for a regular file. The token and merge strings stay in the file's mapping while the
 * tokenizer is built (it copies what it keeps), then the file is closed.
 */
#include "runner/tokenizer.h"

#include "runner/error.h"
#include "runner/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An optional u32 id: -1 when the key is absent. */
static mkv_status_t opt_id(const mkv_gguf_t *g, const char *key, int32_t *out, char *err)
{
    *out = -1;
    if (!mkv_gguf_find(g, key)) return MKV_STATUS_OK;
    uint32_t v;
    const mkv_status_t st = mkv_gguf_get_u32(g, key, &v, err);
    if (st == MKV_STATUS_OK) *out = v > INT32_MAX ? INT32_MAX : (int32_t)v;
    return st;
}

/* A STRING key as a NUL-terminated copy in buf; "" when absent and optional. */
static mkv_status_t str_key(const mkv_gguf_t *g, const char *key, int required, char *buf,
                            size_t cap, char *err)
{
    buf[0] = '\0';
    if (!required && !mkv_gguf_find(g, key)) return MKV_STATUS_OK;
    mkv_gguf_str_t s;
    const mkv_status_t st = mkv_gguf_get_str(g, key, &s, err);
    if (st != MKV_STATUS_OK) return st;
    if (s.len >= cap || memchr(s.ptr, '\0', s.len))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "GGUF %s: not a short text value", key);
    memcpy(buf, s.ptr, s.len);
    buf[s.len] = '\0';
    return MKV_STATUS_OK;
}

/* A string array as pointers and lengths into the mapping. */
static mkv_status_t str_array(const mkv_gguf_t *g, const char *key, int32_t *n,
                              const char ***ptrs, int32_t **lens, char *err)
{
    mkv_gguf_type_t elem;
    uint64_t count;
    mkv_status_t st = mkv_gguf_get_arr(g, key, &elem, &count, err);
    if (st != MKV_STATUS_OK) return st;
    if (elem != MKV_GGUF_STRING)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "GGUF %s: not an array of strings", key);
    if (count > INT32_MAX / 2)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "GGUF %s: %llu entries", key,
                        (unsigned long long)count);
    const mkv_gguf_kv_t *kv = mkv_gguf_find(g, key);
    *ptrs = malloc((count ? count : 1) * sizeof **ptrs);
    *lens = malloc((count ? count : 1) * sizeof **lens);
    if (!*ptrs || !*lens) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "GGUF %s", key);
    for (uint64_t i = 0; i < count; i++) {
        const mkv_gguf_str_t s = mkv_gguf_arr_str(g, kv, i);
        if (s.len > INT32_MAX)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "GGUF %s[%llu]: too long", key,
                            (unsigned long long)i);
        (*ptrs)[i] = s.ptr ? s.ptr : "";
        (*lens)[i] = (int32_t)s.len;
    }
    *n = (int32_t)count;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_tokenizer_load_gguf(const char *path, mkv_tokenizer_t **out, char *err)
{
    char dummy[MKV_ERR_LEN], model[64], pre[64];
    if (!err) err = dummy;
    if (!path || !out) return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "null argument");
    *out = NULL;
    mkv_gguf_t *g = NULL;
    const char **tokens = NULL, **merges = NULL;
    int32_t *token_lens = NULL, *merge_lens = NULL, *types = NULL;
    mkv_bpe_spec_t spec;
    memset(&spec, 0, sizeof spec);
    mkv_status_t status = mkv_gguf_open(path, &g, err);
    if (status != MKV_STATUS_OK) return status;
    RUNNER_TRY(str_key(g, "tokenizer.ggml.model", 1, model, sizeof model, err));
    RUNNER_TRY(str_key(g, "tokenizer.ggml.pre", 0, pre, sizeof pre, err));
    RUNNER_TRY(str_array(g, "tokenizer.ggml.tokens", &spec.n_vocab, &tokens, &token_lens, err));
    if (mkv_gguf_find(g, "tokenizer.ggml.merges"))
        RUNNER_TRY(str_array(g, "tokenizer.ggml.merges", &spec.n_merges, &merges, &merge_lens, err));
    const mkv_gguf_kv_t *tt = mkv_gguf_find(g, "tokenizer.ggml.token_type");
    if (tt) {
        if (tt->type != MKV_GGUF_ARRAY || tt->arr_count != (uint64_t)spec.n_vocab) {
            status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                              "GGUF tokenizer.ggml.token_type: not an array of %d integers",
                              spec.n_vocab);
            goto fail;
        }
        if (!(types = malloc((size_t)(spec.n_vocab ? spec.n_vocab : 1) * sizeof *types))) {
            status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "token types");
            goto fail;
        }
        for (int32_t i = 0; i < spec.n_vocab; i++) {
            int64_t v;
            if (!mkv_gguf_arr_int(tt, (uint64_t)i, &v) || v < INT32_MIN || v > INT32_MAX) {
                status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                                  "GGUF tokenizer.ggml.token_type[%d]: not an integer", i);
                goto fail;
            }
            types[i] = (int32_t)v;
        }
    }
    RUNNER_TRY(opt_id(g, "tokenizer.ggml.bos_token_id", &spec.bos, err));
    RUNNER_TRY(opt_id(g, "tokenizer.ggml.eos_token_id", &spec.eos, err));
    RUNNER_TRY(opt_id(g, "tokenizer.ggml.unknown_token_id", &spec.unk, err));
    RUNNER_TRY(opt_id(g, "tokenizer.ggml.padding_token_id", &spec.pad, err));
    spec.add_bos = 0;
    if (mkv_gguf_find(g, "tokenizer.ggml.add_bos_token"))
        RUNNER_TRY(mkv_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &spec.add_bos, err));
    spec.tokens = tokens;
    spec.token_lens = token_lens;
    spec.token_types = types;
    spec.merges = merges;
    spec.merge_lens = merge_lens;
    spec.model = model;
    spec.pre = pre[0] ? pre : NULL;
    status = mkv_tokenizer_create_bpe(&spec, out, err);
    if (status != MKV_STATUS_OK) {
        /* Name the file: the builder's message names the field. */
        char inner[MKV_ERR_LEN];
        memcpy(inner, err, sizeof inner);
        inner[sizeof inner - 1] = '\0';
        const int n = snprintf(err, MKV_ERR_LEN, "%.200s: ", path);
        snprintf(err + n, (size_t)(MKV_ERR_LEN - n), "%.*s", MKV_ERR_LEN - n - 1, inner);
    }
fail:
    free(tokens);
    free(token_lens);
    free(merges);
    free(merge_lens);
    free(types);
    mkv_gguf_close(g);
    return status;
}
