/*
 * tokenizer_fixture.h — helpers of the byte-level tokenizer tests (test_tokenizer_bpe.c,
 * test_tokenizer_hard.c): encode / decode that assert success, the streamed pieces, reading a
 * JSON fixture, and a minimal GGUF metadata reader for the tokenizer.ggml.* keys (test-only:
 * the library's GGUF reader lives elsewhere).
 */
#ifndef MKV_TESTS_TOKENIZER_FIXTURE_H
#define MKV_TESTS_TOKENIZER_FIXTURE_H

#include "runner/tokenizer.h"

#include "common/error.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int32_t *tf_encode(const mkv_tokenizer_t *tok, const char *s, size_t len, int add_bos,
                   int32_t *n);
char *tf_decode(const mkv_tokenizer_t *tok, const int32_t *ids, int32_t n, int skip);
/* Concatenation of mkv_tokenizer_piece over ids (malloc'ed; byte-exact, NULs excepted). */
char *tf_pieces(const mkv_tokenizer_t *tok, const int32_t *ids, int32_t n);
void tf_expect_ids(const int32_t *got, int32_t n_got, const int32_t *want, int32_t n_want,
                   const char *what, const char *text);
cJSON *tf_read_json(const char *path);
int32_t *tf_ids(const cJSON *arr, int32_t *n); /* a JSON array of ids, malloc'ed */

typedef struct tf_gguf {
    int32_t n_tokens, n_merges;
    char **tokens, **merges;          /* [n_tokens], [n_merges] */
    int32_t *token_lens, *merge_lens; /* [n_tokens], [n_merges] */
    int32_t *token_types;             /* [n_tokens] */
    char *model, *pre;
    int32_t bos, eos, unk, pad;
    int add_bos;
} tf_gguf_t;

/* 0 when the file is absent; asserts on a malformed one. */
int tf_gguf_read(const char *path, tf_gguf_t *g);
void tf_gguf_free(tf_gguf_t *g);

#endif /* MKV_TESTS_TOKENIZER_FIXTURE_H */
