/*
 * tokenizer.h — Hugging Face `tokenizer.json` tokenizers of the BPE kind the Llama-family
 * models use (docs/tokenizer.md), matching HF tokenizers exactly (0.21 / 0.22 for the
 * SentencePiece kind, 0.23 for the byte-level fixtures). Two kinds:
 *
 * Byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2), from tokenizer.json or from GGUF metadata
 * (mkv_tokenizer_create_bpe): added / special tokens are matched whole in the raw text; the
 * NFC normalizer when there is one; the pre-tokenizers Split (PCRE2 regex), Digits and
 * ByteLevel in a Sequence; every byte of a piece becomes GPT-2's character for it, then BPE
 * with the merges' ranks (ignore_merges: a piece that is a token is taken whole); decoding
 * maps the characters back to bytes (ByteLevel decoder).
 *
 * SentencePiece-style BPE (the bundled TinyStories model): added
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

/* Loads dir/tokenizer.json (or, when dir is a regular file, the GGUF tokenizer below) (and tokenizer_config.json for add_bos_token when present).
 * IO_ERROR, PARSE_ERROR or UNSUPPORTED with the reason in err (MKV_ERR_LEN bytes). */
mkv_status_t mkv_tokenizer_load(const char *dir, mkv_tokenizer_t **out, char *err);

/* The tokenizer in a GGUF file's metadata (tokenizer.ggml.*), through mkv_tokenizer_create_bpe;
 * mkv_tokenizer_load calls it when its path is a file rather than a folder. Errors name the
 * file and the key. */
mkv_status_t mkv_tokenizer_load_gguf(const char *path, mkv_tokenizer_t **out, char *err);
void mkv_tokenizer_free(mkv_tokenizer_t *tok);

int32_t mkv_tokenizer_vocab_size(const mkv_tokenizer_t *tok);
int32_t mkv_tokenizer_bos(const mkv_tokenizer_t *tok); /* -1 when none */
int32_t mkv_tokenizer_eos(const mkv_tokenizer_t *tok); /* -1 when none */
int32_t mkv_tokenizer_unk(const mkv_tokenizer_t *tok); /* -1 when none */

/* The id of the token whose text is exactly `text` (an added token's content, or a model
 * vocabulary entry as stored: byte-level vocabularies store " a" as "Ġa"); -1 when absent.
 * Chat templates use it for their markers, such as "<|im_start|>". */
int32_t mkv_tokenizer_token_id(const mkv_tokenizer_t *tok, const char *text);

/* A byte-level BPE tokenizer as GGUF metadata describes it (tokenizer.ggml.*). The arrays are
 * read during mkv_tokenizer_create_bpe only (the tokenizer copies what it keeps). */
typedef struct mkv_bpe_spec {
    int32_t n_vocab;
    const char *const *tokens;  /* [n_vocab] token texts, byte-level mapped as GGUF stores them */
    const int32_t *token_lens;  /* [n_vocab] their byte lengths; NULL: NUL-terminated */
    const int32_t *token_types; /* [n_vocab] or NULL; 3 = control (special: matched whole in the
                                 * raw text, skipped by skip_special), 4 = user-defined (matched
                                 * whole, decoded as text); other types are ordinary tokens */
    int32_t n_merges;
    const char *const *merges;  /* [n_merges] "a b", best (lowest rank) first */
    const int32_t *merge_lens;  /* [n_merges] byte lengths; NULL: NUL-terminated */
    const char *model;          /* tokenizer.ggml.model: only "gpt2" (byte-level BPE) */
    const char *pre;            /* tokenizer.ggml.pre: "gpt2", "default", "smollm",
                                 * "llama-bpe", "qwen2" (NULL: "default") */
    int32_t bos, eos, unk, pad; /* token ids, -1 when none */
    int add_bos;                /* tokenizer.ggml.add_bos_token: kept for the caller, who passes
                                 * it as encode's add_bos (mkv_tokenizer_add_bos) */
} mkv_bpe_spec_t;

/* Builds a byte-level BPE tokenizer from GGUF's arrays, with the pre-tokenizer pipeline (and
 * normalizer) of the model's tokenizer.json for spec->pre. PARSE_ERROR for a token twice, a
 * merge naming an unknown token, or a bos / eos / unk / pad id outside the vocabulary;
 * UNSUPPORTED names another model or pre. */
mkv_status_t mkv_tokenizer_create_bpe(const mkv_bpe_spec_t *spec, mkv_tokenizer_t **out,
                                      char *err);

/* spec->add_bos of a tokenizer made by mkv_tokenizer_create_bpe; -1 for tokenizer.json ones
 * (where the caller decides). */
int mkv_tokenizer_add_bos(const mkv_tokenizer_t *tok);

/* Encodes UTF-8 text. Byte-level tokenizers take any bytes: an ill-formed sequence is never
 * matched by the pre-tokenizer's regex, so it forms pieces of its own, whose bytes map to
 * tokens as every byte does; the SentencePiece kind refuses it (INVALID_ARGUMENT). A normalizer
 * that grows the text past 16x + 4 KiB is refused (INVALID_ARGUMENT) before it allocates more.
 * With add_bos (and a BOS token), BOS is prepended unless the text's first
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
