/*
 * tokenizer.h — Hugging Face `tokenizer.json` tokenizers of the BPE kind the Llama-family
 * models here use (docs/tokenizer.md), matching HF tokenizers 0.21 / 0.22 exactly: added
 * tokens marked normalized: false are split out of the raw text first, those marked
 * normalized: true (the bundled model's) are matched in the normalized text, as HF does; text
 * is normalized by the Sequence of Prepend "▁" and Replace " " -> "▁" normalizers;
 * BPE over Unicode characters with the merges' ranks, no pre-tokenizer; unknown characters
 * to the unk token (consecutive unknowns fused when fuse_unk); decoding by the Replace "▁" ->
 * " ", ByteFallback, Fuse and Strip decoders. Anything else in tokenizer.json (another model
 * type, normalizer or pre-tokenizer) is refused with a message naming it: token ids (`--tokens`)
 * remain the fallback.
 */
#ifndef MKV_ENGINE_TOKENIZER_H
#define MKV_ENGINE_TOKENIZER_H

#include "mixkv.h"

#include <stddef.h>
#include <stdint.h>

typedef struct mkv_tokenizer mkv_tokenizer_t;

/* Loads dir/tokenizer.json (and tokenizer_config.json for add_bos_token when present).
 * IO_ERROR, PARSE_ERROR or UNSUPPORTED with the reason in err (MKV_ERR_LEN bytes). */
mkv_status_t mkv_tokenizer_load(const char *dir, mkv_tokenizer_t **out, char *err);
void mkv_tokenizer_free(mkv_tokenizer_t *tok);

int32_t mkv_tokenizer_vocab_size(const mkv_tokenizer_t *tok);
int32_t mkv_tokenizer_bos(const mkv_tokenizer_t *tok); /* -1 when none */
int32_t mkv_tokenizer_eos(const mkv_tokenizer_t *tok); /* -1 when none */
int32_t mkv_tokenizer_unk(const mkv_tokenizer_t *tok); /* -1 when none */

/* Encodes UTF-8 text. With add_bos (and a BOS token), BOS is prepended unless the text's first
 * token already is BOS. *out is malloc'ed (free it); *n_out its length. */
mkv_status_t mkv_tokenizer_encode(const mkv_tokenizer_t *tok, const char *text, size_t len,
                                  int add_bos, int32_t **out, int32_t *n_out, char *err);

/* Decodes ids to UTF-8 (malloc'ed, NUL-terminated). With skip_special, special tokens are left
 * out. The decoders' Strip removes one leading space of the whole text: to print a stream
 * token by token, use mkv_tokenizer_piece. */
mkv_status_t mkv_tokenizer_decode(const mkv_tokenizer_t *tok, const int32_t *ids, int32_t n,
                                  int skip_special, char **out, char *err);

/* The text one token adds when appended after `prev` (-1 at the start): "▁" as " ", the first
 * piece's leading space stripped; special tokens as "". Valid while tok lives. Writes into
 * buf (at least 256 bytes) and returns it. */
const char *mkv_tokenizer_piece(const mkv_tokenizer_t *tok, int32_t prev, int32_t id, char *buf,
                                size_t buf_len);

#endif /* MKV_ENGINE_TOKENIZER_H */
