/*
 * tokenizer_state.h — inside the tokenizer (runner/tokenizer.h): the loaded tokenizer.json
 * (tokenizer_load.c builds it, tokenizer.c runs it) and the small containers both use.
 * Private to runner/tokenizer*.c.
 */
#ifndef MKV_ENGINE_TOKENIZER_STATE_H
#define MKV_ENGINE_TOKENIZER_STATE_H

#include "runner/tokenizer.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Small containers                                                                         */
/* ---------------------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p; /* [cap] NUL-terminated once anything was put */
    size_t n, cap;
} sbuf_t;

static inline int sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

static inline uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* Model vocabulary: token text -> id, open addressing; owns the keys. */
typedef struct smap_entry {
    char *key; /* NULL: empty slot */
    size_t len;
    int32_t id;
} smap_entry_t;

typedef struct smap {
    smap_entry_t *e; /* [cap], cap a power of two, at most half full */
    size_t cap;
} smap_t;

static inline smap_entry_t *smap_slot(const smap_t *m, const char *s, size_t n)
{
    size_t i = (size_t)hash_bytes(s, n) & (m->cap - 1);
    while (m->e[i].key && (m->e[i].len != n || memcmp(m->e[i].key, s, n) != 0))
        i = (i + 1) & (m->cap - 1);
    return &m->e[i];
}

static inline int32_t smap_get(const smap_t *m, const char *s, size_t n)
{
    const smap_entry_t *e = smap_slot(m, s, n);
    return e->key ? e->id : -1;
}

/* Merges: (left id, right id) -> (rank, merged id). */
typedef struct pmap_entry {
    uint64_t key;
    int32_t rank; /* -1: empty slot */
    int32_t new_id;
} pmap_entry_t;

typedef struct pmap {
    pmap_entry_t *e; /* [cap], cap a power of two, at most half full */
    size_t cap;
} pmap_t;

static inline uint64_t pair_key(int32_t a, int32_t b)
{
    return (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}

/* The entry of key, or the empty slot where it belongs. */
static inline size_t pmap_find(const pmap_t *m, uint64_t key)
{
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (m->cap - 1);
    while (m->e[i].rank >= 0 && m->e[i].key != key) i = (i + 1) & (m->cap - 1);
    return i;
}

static inline const pmap_entry_t *pmap_get(const pmap_t *m, int32_t a, int32_t b)
{
    const pmap_entry_t *e = &m->e[pmap_find(m, pair_key(a, b))];
    return e->rank >= 0 ? e : NULL;
}

/* Length of the valid UTF-8 sequence at s[0..n) (n >= 1); 0 when invalid. */
static inline size_t utf8_len(const unsigned char *s, size_t n)
{
    uint32_t cp, min;
    size_t len;
    if (s[0] < 0x80) return 1;
    if ((s[0] & 0xE0) == 0xC0) { len = 2; cp = s[0] & 0x1Fu; min = 0x80; }
    else if ((s[0] & 0xF0) == 0xE0) { len = 3; cp = s[0] & 0x0Fu; min = 0x800; }
    else if ((s[0] & 0xF8) == 0xF0) { len = 4; cp = s[0] & 0x07u; min = 0x10000; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* ---------------------------------------------------------------------------------------- */
/* The tokenizer                                                                            */
/* ---------------------------------------------------------------------------------------- */

typedef struct added {
    char *content; /* the token's text (what decoding prints) */
    char *match;   /* what is searched: content, normalized when `normalized` */
    size_t match_len;
    int32_t id;
    int special, normalized;
} added_t;

/* Normalizers (PREPEND, REPLACE, NFC) and decoders (REPLACE, BYTE_FALLBACK, FUSE, STRIP,
 * BYTE_LEVEL). */
enum { STEP_PREPEND, STEP_REPLACE, STEP_BYTE_FALLBACK, STEP_FUSE, STEP_STRIP, STEP_NFC,
       STEP_BYTE_LEVEL };

/* The normalizer chain may grow a text to at most MKV_TOK_GROWTH times its length plus
 * MKV_TOK_SLACK bytes: a Replace that expands a short prompt into megabytes is refused before
 * it allocates them. */
#define MKV_TOK_GROWTH 16
#define MKV_TOK_SLACK 4096

struct mkv_pretok;

/* One normalizer or decoder of a (flattened) Sequence. */
typedef struct step {
    int kind;
    char *a, *b; /* PREPEND: a the prefix; REPLACE: a -> b; STRIP: a the character */
    int start, stop; /* STRIP: at most this many leading / trailing characters */
} step_t;

struct mkv_tokenizer {
    int32_t n_vocab;      /* max id + 1 over the model vocab and the added tokens */
    const char **text;    /* [n_vocab] id -> token text (added content first); NULL for holes */
    uint8_t *special;     /* [n_vocab] 1 for special added tokens */
    smap_t vocab;         /* the model's vocab */
    pmap_t merges;
    added_t *added;       /* [n_added] */
    int32_t n_added;
    uint8_t first_byte[2][256]; /* [normalized][byte]: some added token's match starts with it */
    step_t *norm, *dec;   /* [n_norm], [n_dec] flattened chains */
    int32_t n_norm, n_dec, has_decoder;
    int32_t bos, eos, unk;
    int fuse_unk, ignore_merges;
    int32_t byte_tok[256]; /* <0xXX> ids (byte_fallback), -1 when absent */
    struct mkv_pretok *pre; /* NULL: the whole piece goes to BPE */
    int byte_level;         /* BPE sees each byte as GPT-2's character for it (bl_char) */
    char bl_char[256][3];   /* [byte] UTF-8 of the byte's character, NUL-terminated */
    uint8_t bl_len[256];    /* [byte] its length: 1 or 2 */
    int16_t bl_byte[512];   /* [code point] the byte a character stands for, -1 when none */
    int32_t pad;            /* GGUF's padding id, -1 when none */
    int add_bos;            /* GGUF's add_bos_token; -1 for tokenizer.json */
};

/* runner/tokenizer_load.c, shared with the GGUF constructor (tokenizer_bpe.c) */

/* Adds a model vocabulary entry; PARSE_ERROR when the text is there already. */
mkv_status_t mkv_tok_add_vocab(mkv_tokenizer_t *tok, const char *s, size_t n, int32_t id,
                               char *err);
/* Adds merge `rank` of a and b (NUL-terminated); PARSE_ERROR naming a token not in the vocab. */
mkv_status_t mkv_tok_add_merge(mkv_tokenizer_t *tok, const char *a, const char *b, int32_t rank,
                               char *err);
/* Allocates the vocab and merge tables for n_vocab tokens and n_merges merges. */
mkv_status_t mkv_tok_alloc_tables(mkv_tokenizer_t *tok, size_t n_vocab, size_t n_merges,
                                  char *err);
/* Builds id -> text and the added tokens' match strings; refuses an id held by two vocab
 * tokens and BOS / EOS / UNK ids that are not tokens. */
mkv_status_t mkv_tok_finish(mkv_tokenizer_t *tok, char *err);

/* runner/tokenizer_bpe.c */

/* Fills bl_char / bl_len / bl_byte with GPT-2's bytes_to_unicode (byte_level is the caller's). */
void mkv_tok_init_byte_level(mkv_tokenizer_t *tok);
/* Appends NFC of s[0..n) to out; ill-formed bytes are copied as they are. -1 when out of
 * memory or past limit bytes. */
int mkv_tok_nfc(const char *s, size_t n, sbuf_t *out, size_t limit);
/* Appends s[0..n) with each ill-formed sequence replaced by U+FFFD, as Rust's
 * String::from_utf8_lossy does (one per maximal ill-formed subpart). */
int mkv_tok_utf8_lossy(const char *s, size_t n, sbuf_t *out);
/* Appends the bytes a byte-level token stands for (HF's ByteLevel decoder: a token with a
 * character outside the map is taken as it is). */
int mkv_tok_byte_level_bytes(const mkv_tokenizer_t *tok, const char *s, size_t n, sbuf_t *out);

/* Applies the normalizer chain to s[0..n) into out (cleared first; tmp is scratch). -1 when out
 * of memory, -2 when the text would grow past MKV_TOK_GROWTH x n + MKV_TOK_SLACK bytes. */
int mkv_tok_normalize(const mkv_tokenizer_t *tok, const char *s, size_t n, sbuf_t *out,
                      sbuf_t *tmp);

#endif /* MKV_ENGINE_TOKENIZER_STATE_H */
