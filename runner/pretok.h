/*
 * pretok.h — pre-tokenizers: how a normalized text is cut into the pieces that BPE sees
 * separately (docs/tokenizer.md). Private to runner/tokenizer*.c.
 *
 * A pipeline is a list of steps, each turning a list of pieces into a new one, as Hugging Face
 * `tokenizers` runs a pre_tokenizer Sequence: Split (a PCRE2 regex or a literal, with one of
 * the five split behaviours and `invert`), Digits (\p{N}, one by one or in runs) and ByteLevel
 * (add_prefix_space, then GPT-2's regex when use_regex). ByteLevel's byte-to-character mapping
 * is not done here: the BPE model maps each piece's bytes (tokenizer_bpe.c), so that every step
 * sees the raw UTF-8 text, as the regexes of the real models expect.
 *
 * The regexes run in PCRE2 with UTF and UCP (Unicode classes such as \p{L}, \s) and
 * MATCH_INVALID_UTF: an ill-formed byte never matches, so it ends up in a piece of the text
 * between matches instead of stopping the search.
 */
#ifndef MKV_ENGINE_PRETOK_H
#define MKV_ENGINE_PRETOK_H

#include "runner/tokenizer_state.h"

#include <cjson/cJSON.h>

typedef struct mkv_pretok mkv_pretok_t;

typedef struct mkv_piece {
    size_t off, len; /* bytes of mkv_pieces_t.text */
} mkv_piece_t;

typedef struct mkv_pieces {
    sbuf_t text;    /* the pieces' bytes, back to back */
    mkv_piece_t *p; /* [cap] */
    size_t n, cap;
} mkv_pieces_t;

/* The pipeline of a tokenizer.json "pre_tokenizer" object (node not NULL). *byte_level is set
 * when it contains a ByteLevel step, which must then be its last step. UNSUPPORTED names any
 * other pre-tokenizer or option; PARSE_ERROR for a malformed node or a regex PCRE2 refuses. */
mkv_status_t mkv_pretok_from_json(const cJSON *node, mkv_pretok_t **out, int *byte_level,
                                  char *err);

/* The pipeline that a GGUF `tokenizer.ggml.pre` name stands for: the one the model's
 * tokenizer.json has. *nfc is set when that tokenizer.json also normalizes with NFC (qwen2).
 * UNSUPPORTED names an unknown `pre`. */
mkv_status_t mkv_pretok_from_name(const char *pre, mkv_pretok_t **out, int *nfc, char *err);

void mkv_pretok_free(mkv_pretok_t *pt);

/* Cuts s[0..n) (any bytes) into pieces; out and tmp are reused across calls (free their
 * buffers with mkv_pieces_free). Empty pieces are dropped, as in HF. */
mkv_status_t mkv_pretok_run(const mkv_pretok_t *pt, const char *s, size_t n, mkv_pieces_t *out,
                            mkv_pieces_t *tmp, char *err);

void mkv_pieces_free(mkv_pieces_t *p);

#endif /* MKV_ENGINE_PRETOK_H */
