/*
 * tokenizer.c — the Hugging Face `tokenizer.json` BPE tokenizer of tokenizer.h (docs/tokenizer.md).
 *
 * Follows the `tokenizers` library (checked against 0.23.3, see tests/cpu/test_tokenizer.c) step
 * by step, so that ids match the ones the models were trained on:
 *  - added tokens with normalized=false are split out of the raw text; each other piece is
 *    normalized, and then the added tokens with normalized=true are matched in the normalized
 *    text against their *normalized* content (leftmost-longest). NOTE: with the Prepend "▁"
 *    normalizer, `<|end_story|>` is matched as "▁<|end_story|>", i.e. only at the start of the
 *    text or after a space; "a<|end_story|>" is plain text. That is what HF does.
 *  - BPE as HF's Word::merge_all: a heap of candidate merges keyed by (rank, left position);
 *    entries made stale by earlier merges are skipped when popped. O(n log n) per piece, and a
 *    piece can be a whole document (no pre-tokenizer).
 *  - decoding runs the decoder chain over a list of token strings.
 */
#include "engine/tokenizer.h"

#include "common/error.h"

#include <cjson/cJSON.h>

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FALLBACK_HINT "; pass token ids with --tokens instead"

/* ---------------------------------------------------------------------------------------- */
/* Small containers                                                                         */
/* ---------------------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p; /* [cap] NUL-terminated once anything was put */
    size_t n, cap;
} sbuf_t;

static int sb_put(sbuf_t *b, const char *s, size_t n)
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

typedef struct ivec {
    int32_t *p; /* [cap] */
    size_t n, cap;
} ivec_t;

static int iv_push(ivec_t *v, int32_t x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 256;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p) return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

static uint64_t hash_bytes(const char *s, size_t n)
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

static smap_entry_t *smap_slot(const smap_t *m, const char *s, size_t n)
{
    size_t i = (size_t)hash_bytes(s, n) & (m->cap - 1);
    while (m->e[i].key && (m->e[i].len != n || memcmp(m->e[i].key, s, n) != 0))
        i = (i + 1) & (m->cap - 1);
    return &m->e[i];
}

static int32_t smap_get(const smap_t *m, const char *s, size_t n)
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

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

/* The entry of key, or the empty slot where it belongs. */
static size_t pmap_find(const pmap_t *m, uint64_t key)
{
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (m->cap - 1);
    while (m->e[i].rank >= 0 && m->e[i].key != key) i = (i + 1) & (m->cap - 1);
    return i;
}

static const pmap_entry_t *pmap_get(const pmap_t *m, int32_t a, int32_t b)
{
    const pmap_entry_t *e = &m->e[pmap_find(m, pair_key(a, b))];
    return e->rank >= 0 ? e : NULL;
}

/* Length of the valid UTF-8 sequence at s[0..n) (n >= 1); 0 when invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
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

enum { STEP_PREPEND, STEP_REPLACE, STEP_BYTE_FALLBACK, STEP_FUSE, STEP_STRIP };

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
};

static const cJSON *jget(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNull(v) ? NULL : v;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = jget(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *k, int dflt)
{
    const cJSON *v = jget(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* Reads and parses path. With optional, a missing file gives OK and *out NULL. */
static mkv_status_t read_json(const char *path, int optional, cJSON **out, char *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (optional && errno == ENOENT) return MKV_STATUS_OK;
        return mkv_fail(err, MKV_STATUS_IO_ERROR, "cannot open %s: %s", path, strerror(errno));
    }
    sbuf_t b = {0};
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (sb_put(&b, chunk, got) != 0) {
            fclose(f);
            free(b.p);
            return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "reading %s", path);
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b.p);
        return mkv_fail(err, MKV_STATUS_IO_ERROR, "cannot read %s", path);
    }
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(b.p ? b.p : "", b.n, &end, 0);
    size_t at = end && b.p ? (size_t)(end - b.p) : 0;
    free(b.p);
    if (!*out) return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "%s: malformed JSON near byte %zu",
                               path, at);
    return MKV_STATUS_OK;
}

static mkv_status_t add_step(step_t **steps, int32_t *n, step_t s, char *err)
{
    step_t *p = realloc(*steps, (size_t)(*n + 1) * sizeof *p);
    if (!p) {
        free(s.a);
        free(s.b);
        return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer steps");
    }
    p[(*n)++] = s;
    *steps = p;
    return MKV_STATUS_OK;
}

/* A Replace's pattern must be {"String": ...}; a Regex pattern is refused. */
static mkv_status_t load_replace(const cJSON *n, const char *what, step_t *s, char *err)
{
    const cJSON *pat = jget(n, "pattern");
    const char *from = jstr(pat, "String"), *to = jstr(n, "content");
    if (jget(pat, "Regex"))
        return mkv_fail(err, MKV_STATUS_UNSUPPORTED,
                        "tokenizer.json: %s Replace with a Regex pattern is not supported"
                        FALLBACK_HINT, what);
    if (!from || !from[0] || !to)
        return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed %s Replace",
                        what);
    *s = (step_t){.kind = STEP_REPLACE, .a = strdup(from), .b = strdup(to)};
    return MKV_STATUS_OK;
}

static mkv_status_t load_normalizer(mkv_tokenizer_t *tok, const cJSON *n, char *err)
{
    if (!n) return MKV_STATUS_OK;
    const char *type = jstr(n, "type");
    step_t s = {0};
    if (!type) return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: untyped normalizer");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *item;
        if (!cJSON_IsArray(jget(n, "normalizers")))
            return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed Sequence");
        cJSON_ArrayForEach(item, jget(n, "normalizers")) {
            mkv_status_t st = load_normalizer(tok, item, err);
            if (st != MKV_STATUS_OK) return st;
        }
        return MKV_STATUS_OK;
    }
    if (strcmp(type, "Prepend") == 0) {
        if (!jstr(n, "prepend"))
            return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed Prepend");
        s = (step_t){.kind = STEP_PREPEND, .a = strdup(jstr(n, "prepend"))};
    } else if (strcmp(type, "Replace") == 0) {
        mkv_status_t st = load_replace(n, "normalizer", &s, err);
        if (st != MKV_STATUS_OK) return st;
    } else {
        return mkv_fail(err, MKV_STATUS_UNSUPPORTED,
                        "tokenizer.json: normalizer '%s' is not supported (only Sequence, "
                        "Prepend, Replace)" FALLBACK_HINT, type);
    }
    return add_step(&tok->norm, &tok->n_norm, s, err);
}

static mkv_status_t load_decoder(mkv_tokenizer_t *tok, const cJSON *n, char *err)
{
    const char *type = jstr(n, "type");
    step_t s = {0};
    if (!type) return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: untyped decoder");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *item;
        if (!cJSON_IsArray(jget(n, "decoders")))
            return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed Sequence");
        cJSON_ArrayForEach(item, jget(n, "decoders")) {
            mkv_status_t st = load_decoder(tok, item, err);
            if (st != MKV_STATUS_OK) return st;
        }
        return MKV_STATUS_OK;
    }
    if (strcmp(type, "Replace") == 0) {
        mkv_status_t st = load_replace(n, "decoder", &s, err);
        if (st != MKV_STATUS_OK) return st;
    } else if (strcmp(type, "ByteFallback") == 0) {
        s.kind = STEP_BYTE_FALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        s.kind = STEP_FUSE;
    } else if (strcmp(type, "Strip") == 0) {
        const char *c = jstr(n, "content");
        const cJSON *a = jget(n, "start"), *b = jget(n, "stop");
        if (!c || !c[0] || utf8_len((const unsigned char *)c, strlen(c)) != strlen(c) ||
            !cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valueint < 0 || b->valueint < 0)
            return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed Strip");
        s = (step_t){.kind = STEP_STRIP, .a = strdup(c), .start = a->valueint,
                     .stop = b->valueint};
    } else {
        return mkv_fail(err, MKV_STATUS_UNSUPPORTED,
                        "tokenizer.json: decoder '%s' is not supported (only Sequence, "
                        "Replace, ByteFallback, Fuse, Strip)" FALLBACK_HINT, type);
    }
    return add_step(&tok->dec, &tok->n_dec, s, err);
}

/* Appends s[0..n) to out with every non-overlapping pat (non-empty) replaced by rep. */
static int replace_all(const char *s, size_t n, const char *pat, const char *rep, sbuf_t *out)
{
    size_t pl = strlen(pat), run = 0, i = 0;
    while (i < n) {
        if (n - i >= pl && memcmp(s + i, pat, pl) == 0) {
            if (sb_put(out, s + run, i - run) != 0 || sb_put(out, rep, strlen(rep)) != 0)
                return -1;
            i += pl;
            run = i;
        } else {
            i++;
        }
    }
    return sb_put(out, s + run, n - run);
}

/* Applies the normalizer chain to s[0..n) into out (cleared first). */
static int normalize(const mkv_tokenizer_t *tok, const char *s, size_t n, sbuf_t *out,
                     sbuf_t *tmp)
{
    out->n = 0;
    if (sb_put(out, s, n) != 0) return -1;
    for (int32_t k = 0; k < tok->n_norm; k++) {
        const step_t *st = &tok->norm[k];
        tmp->n = 0;
        if (st->kind == STEP_PREPEND) {
            if (out->n == 0) continue; /* HF prepends to non-empty text only */
            if (sb_put(tmp, st->a, strlen(st->a)) != 0) return -1;
            if (sb_put(tmp, out->p, out->n) != 0) return -1;
        } else if (replace_all(out->p, out->n, st->a, st->b, tmp) != 0) {
            return -1;
        }
        sbuf_t t = *out;
        *out = *tmp;
        *tmp = t;
    }
    return 0;
}

static mkv_status_t load_model(mkv_tokenizer_t *tok, const cJSON *m, char *err)
{
    const char *type = jstr(m, "type");
    const cJSON *vocab = jget(m, "vocab"), *merges = jget(m, "merges"), *item, *drop;
    if (!cJSON_IsObject(m) || !type)
        return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: no typed \"model\"");
    if (strcmp(type, "BPE") != 0)
        return mkv_fail(err, MKV_STATUS_UNSUPPORTED,
                        "tokenizer.json: model type '%s' is not supported (only BPE)"
                        FALLBACK_HINT, type);
    drop = jget(m, "dropout");
    if ((drop && (!cJSON_IsNumber(drop) || drop->valuedouble != 0.0)) ||
        (jstr(m, "continuing_subword_prefix") && jstr(m, "continuing_subword_prefix")[0]) ||
        (jstr(m, "end_of_word_suffix") && jstr(m, "end_of_word_suffix")[0]))
        return mkv_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.json: BPE dropout, "
                        "continuing_subword_prefix and end_of_word_suffix are not supported"
                        FALLBACK_HINT);
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: BPE without vocab/merges");

    size_t nv = (size_t)cJSON_GetArraySize(vocab), nm = (size_t)cJSON_GetArraySize(merges);
    for (tok->vocab.cap = 16; tok->vocab.cap < 2 * nv; tok->vocab.cap *= 2) {}
    for (tok->merges.cap = 16; tok->merges.cap < 2 * nm; tok->merges.cap *= 2) {}
    tok->vocab.e = calloc(tok->vocab.cap, sizeof *tok->vocab.e);
    tok->merges.e = malloc(tok->merges.cap * sizeof *tok->merges.e);
    if (!tok->vocab.e || !tok->merges.e)
        return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer vocab");
    for (size_t i = 0; i < tok->merges.cap; i++) tok->merges.e[i].rank = -1;

    cJSON_ArrayForEach(item, vocab) {
        size_t len = strlen(item->string);
        if (!cJSON_IsNumber(item) || item->valuedouble < 0 || item->valuedouble > 1e9 ||
            item->valuedouble != (double)item->valueint)
            return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: bad id of '%s'",
                            item->string);
        smap_entry_t *e = smap_slot(&tok->vocab, item->string, len);
        if (!e->key && !(e->key = strdup(item->string)))
            return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer vocab");
        e->len = len;
        e->id = item->valueint;
        if (e->id >= tok->n_vocab) tok->n_vocab = e->id + 1;
    }
    int32_t rank = 0;
    cJSON_ArrayForEach(item, merges) {
        /* "a b" (one space) in older files, ["a", "b"] in newer ones. */
        char pair[1024];
        const char *a = NULL, *b = NULL;
        if (cJSON_IsString(item) && strlen(item->valuestring) < sizeof pair) {
            strcpy(pair, item->valuestring);
            char *sp = strchr(pair, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                *sp = '\0';
                a = pair;
                b = sp + 1;
            }
        } else if (cJSON_GetArraySize(item) == 2 && cJSON_IsString(cJSON_GetArrayItem(item, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(item, 1))) {
            a = cJSON_GetArrayItem(item, 0)->valuestring;
            b = cJSON_GetArrayItem(item, 1)->valuestring;
        }
        char joined[2048];
        if (!a || snprintf(joined, sizeof joined, "%s%s", a, b) >= (int)sizeof joined)
            return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed merge %d",
                            rank);
        int32_t ia = smap_get(&tok->vocab, a, strlen(a)), ib = smap_get(&tok->vocab, b, strlen(b));
        int32_t ij = smap_get(&tok->vocab, joined, strlen(joined));
        if (ia < 0 || ib < 0 || ij < 0)
            return mkv_fail(err, MKV_STATUS_PARSE_ERROR,
                            "tokenizer.json: merge %d ('%s' '%s') names a token not in the vocab",
                            rank, a, b);
        pmap_entry_t *e = &tok->merges.e[pmap_find(&tok->merges, pair_key(ia, ib))];
        e->key = pair_key(ia, ib);
        e->rank = rank++; /* a repeated pair keeps its last rank, as HF's HashMap collect does */
        e->new_id = ij;
    }
    const char *unk = jstr(m, "unk_token");
    tok->unk = unk ? smap_get(&tok->vocab, unk, strlen(unk)) : -1;
    tok->fuse_unk = jbool(m, "fuse_unk", 0);
    tok->ignore_merges = jbool(m, "ignore_merges", 0);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_tok[b] = jbool(m, "byte_fallback", 0) ? smap_get(&tok->vocab, name, 6) : -1;
    }
    return MKV_STATUS_OK;
}

static mkv_status_t load_added(mkv_tokenizer_t *tok, const cJSON *arr, char *err)
{
    const cJSON *item;
    static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
    if (!arr) return MKV_STATUS_OK;
    if (!cJSON_IsArray(arr))
        return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: added_tokens not a list");
    tok->added = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *tok->added);
    if (!tok->added) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "added tokens");
    cJSON_ArrayForEach(item, arr) {
        const cJSON *id = jget(item, "id");
        const char *content = jstr(item, "content");
        if (!cJSON_IsNumber(id) || id->valueint < 0 || !content || !content[0])
            return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed added token");
        for (int f = 0; f < 3; f++)
            if (jbool(item, flags[f], 0))
                return mkv_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.json: added token "
                                "'%s' has %s set (not supported)" FALLBACK_HINT, content, flags[f]);
        added_t *a = &tok->added[tok->n_added++];
        a->id = id->valueint;
        a->special = jbool(item, "special", 0);
        a->normalized = jbool(item, "normalized", !a->special); /* HF's default */
        if (!(a->content = strdup(content)))
            return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "added tokens");
        if (a->id >= tok->n_vocab) tok->n_vocab = a->id + 1;
    }
    return MKV_STATUS_OK;
}

/* Id of a token text: added tokens first, then the model vocab; -1 when absent. */
static int32_t token_id(const mkv_tokenizer_t *tok, const char *s)
{
    for (int32_t k = 0; k < tok->n_added; k++)
        if (strcmp(tok->added[k].content, s) == 0) return tok->added[k].id;
    return smap_get(&tok->vocab, s, strlen(s));
}

/* The id of a special token named in tokenizer_config.json ("x" or {"content": "x"}). */
static mkv_status_t config_token(const mkv_tokenizer_t *tok, const cJSON *cfg, const char *key,
                                 int32_t *id, char *err)
{
    const cJSON *v = jget(cfg, key);
    const char *s = cJSON_IsString(v) ? v->valuestring : jstr(v, "content");
    if (!s) return MKV_STATUS_OK;
    if ((*id = token_id(tok, s)) < 0)
        return mkv_fail(err, MKV_STATUS_PARSE_ERROR,
                        "tokenizer_config.json: %s '%s' is not in the vocabulary", key, s);
    return MKV_STATUS_OK;
}

/* BOS from a TemplateProcessing post-processor: a SpecialToken ahead of sequence A. */
static mkv_status_t load_post(mkv_tokenizer_t *tok, const cJSON *pp, char *err)
{
    if (!pp) return MKV_STATUS_OK;
    const char *type = jstr(pp, "type");
    if (!type || strcmp(type, "TemplateProcessing") != 0)
        return mkv_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.json: post_processor '%s' is "
                        "not supported (only TemplateProcessing)" FALLBACK_HINT,
                        type ? type : "?");
    const cJSON *first = cJSON_GetArrayItem(jget(pp, "single"), 0);
    const char *name = jstr(jget(first, "SpecialToken"), "id");
    const cJSON *ids = name ? jget(jget(jget(pp, "special_tokens"), name), "ids") : NULL;
    if (cJSON_GetArraySize(ids) == 1 && cJSON_IsNumber(cJSON_GetArrayItem(ids, 0)))
        tok->bos = cJSON_GetArrayItem(ids, 0)->valueint;
    else if (name)
        tok->bos = token_id(tok, name);
    return MKV_STATUS_OK;
}

static mkv_status_t finish(mkv_tokenizer_t *tok, char *err)
{
    sbuf_t norm = {0}, tmp = {0};
    tok->text = calloc((size_t)tok->n_vocab + 1, sizeof *tok->text);
    tok->special = calloc((size_t)tok->n_vocab + 1, 1);
    if (!tok->text || !tok->special) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
    for (size_t i = 0; i < tok->vocab.cap; i++)
        if (tok->vocab.e[i].key) tok->text[tok->vocab.e[i].id] = tok->vocab.e[i].key;
    for (int32_t k = 0; k < tok->n_added; k++) {
        added_t *a = &tok->added[k];
        tok->text[a->id] = a->content;
        tok->special[a->id] = (uint8_t)a->special;
        /* HF normalizes the content of normalized added tokens before matching them. */
        const char *m = a->content;
        if (a->normalized) {
            if (normalize(tok, a->content, strlen(a->content), &norm, &tmp) != 0) break;
            m = norm.p;
        }
        if (!(a->match = strdup(m))) break;
        a->match_len = strlen(m); /* 0 (normalized away): never matched */
        if (a->match_len) tok->first_byte[a->normalized][(uint8_t)m[0]] = 1;
    }
    free(norm.p);
    free(tmp.p);
    for (int32_t k = 0; k < tok->n_added; k++)
        if (!tok->added[k].match) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
    return MKV_STATUS_OK;
}

mkv_status_t mkv_tokenizer_load(const char *dir, mkv_tokenizer_t **out, char *err)
{
    char path[4096], dummy[MKV_ERR_LEN];
    mkv_status_t status = MKV_STATUS_OK;
    cJSON *root = NULL, *cfg = NULL;
    mkv_tokenizer_t *tok = NULL;
    if (!err) err = dummy;
    if (!dir || !out) return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "null argument");
    *out = NULL;
    if (snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= (int)sizeof path)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "path too long");
    MKV_TRY(read_json(path, 0, &root, err));
    if (!(tok = calloc(1, sizeof *tok))) {
        status = mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
        goto fail;
    }
    tok->bos = tok->eos = tok->unk = -1;
    if (jget(root, "pre_tokenizer")) {
        const char *t = jstr(jget(root, "pre_tokenizer"), "type");
        status = mkv_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.json: pre_tokenizer '%s' is "
                          "not supported (only null)" FALLBACK_HINT, t ? t : "?");
        goto fail;
    }
    MKV_TRY(load_model(tok, jget(root, "model"), err));
    MKV_TRY(load_added(tok, jget(root, "added_tokens"), err));
    MKV_TRY(load_normalizer(tok, jget(root, "normalizer"), err));
    if (jget(root, "decoder")) {
        tok->has_decoder = 1;
        MKV_TRY(load_decoder(tok, jget(root, "decoder"), err));
    }
    MKV_TRY(finish(tok, err));
    MKV_TRY(load_post(tok, jget(root, "post_processor"), err));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    MKV_TRY(read_json(path, 1, &cfg, err));
    MKV_TRY(config_token(tok, cfg, "bos_token", &tok->bos, err));
    MKV_TRY(config_token(tok, cfg, "eos_token", &tok->eos, err));
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    *out = tok;
    return MKV_STATUS_OK;
fail:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    mkv_tokenizer_free(tok);
    return status;
}

void mkv_tokenizer_free(mkv_tokenizer_t *tok)
{
    if (!tok) return;
    for (size_t i = 0; i < tok->vocab.cap; i++) free(tok->vocab.e[i].key);
    for (int32_t k = 0; k < tok->n_added; k++) {
        free(tok->added[k].content);
        free(tok->added[k].match);
    }
    for (int32_t k = 0; k < tok->n_norm; k++) { free(tok->norm[k].a); free(tok->norm[k].b); }
    for (int32_t k = 0; k < tok->n_dec; k++) { free(tok->dec[k].a); free(tok->dec[k].b); }
    free(tok->vocab.e);
    free(tok->merges.e);
    free(tok->added);
    free(tok->norm);
    free(tok->dec);
    free(tok->text);
    free(tok->special);
    free(tok);
}

int32_t mkv_tokenizer_vocab_size(const mkv_tokenizer_t *tok) { return tok ? tok->n_vocab : 0; }
int32_t mkv_tokenizer_bos(const mkv_tokenizer_t *tok) { return tok ? tok->bos : -1; }
int32_t mkv_tokenizer_eos(const mkv_tokenizer_t *tok) { return tok ? tok->eos : -1; }
int32_t mkv_tokenizer_unk(const mkv_tokenizer_t *tok) { return tok ? tok->unk : -1; }

/* ---------------------------------------------------------------------------------------- */
/* Encoding                                                                                 */
/* ---------------------------------------------------------------------------------------- */

typedef struct cand {
    int32_t rank, pos, new_id; /* merge symbols pos and next(pos) into new_id */
} cand_t;

/* Scratch of one encode call: a doubly linked list of symbols and a min-heap of candidates. */
typedef struct bpe_work {
    int32_t *c, *prev, *next, *len; /* [cap] symbol id, links, byte length (0: merged away) */
    size_t cap;
    cand_t *heap; /* [heap_cap] ordered by (rank, pos), as HF's Merge */
    size_t n_heap, heap_cap;
} bpe_work_t;

static int cand_less(cand_t x, cand_t y) { return x.rank < y.rank || (x.rank == y.rank && x.pos < y.pos); }

static int heap_push(bpe_work_t *w, const pmap_entry_t *m, int32_t pos)
{
    if (!m) return 0;
    if (w->n_heap == w->heap_cap) {
        size_t cap = w->heap_cap ? 2 * w->heap_cap : 256;
        cand_t *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return -1;
        w->heap = h;
        w->heap_cap = cap;
    }
    cand_t c = {m->rank, pos, m->new_id};
    size_t i = w->n_heap++;
    for (; i > 0 && cand_less(c, w->heap[(i - 1) / 2]); i = (i - 1) / 2)
        w->heap[i] = w->heap[(i - 1) / 2];
    w->heap[i] = c;
    return 0;
}

static cand_t heap_pop(bpe_work_t *w)
{
    cand_t top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= n) break;
        if (k + 1 < n && cand_less(w->heap[k + 1], w->heap[k])) k++;
        if (!cand_less(w->heap[k], last)) break;
        w->heap[i] = w->heap[k];
        i = k;
    }
    if (n) w->heap[i] = last;
    return top;
}

static int add_symbol(bpe_work_t *w, size_t *n, int32_t id, int32_t len)
{
    if (*n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 256;
        int32_t **arrs[4] = {&w->c, &w->prev, &w->next, &w->len};
        for (int k = 0; k < 4; k++) {
            int32_t *p = realloc(*arrs[k], cap * sizeof *p);
            if (!p) return -1;
            *arrs[k] = p;
        }
        w->cap = cap;
    }
    w->c[*n] = id;
    w->len[(*n)++] = len;
    return 0;
}

#define OOM_IF(cond)                                                                           \
    do {                                                                                       \
        if (cond) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer: encoding");       \
    } while (0)

/* BPE of one normalized piece s[0..n) (valid UTF-8), ids appended to out. */
static mkv_status_t bpe(const mkv_tokenizer_t *tok, const char *s, size_t n, bpe_work_t *w,
                        ivec_t *out, char *err)
{
    size_t n_sym = 0;
    int32_t unk_len = 0; /* bytes of the pending (fused) unknown run */
    if (tok->ignore_merges && smap_get(&tok->vocab, s, n) >= 0) {
        OOM_IF(iv_push(out, smap_get(&tok->vocab, s, n)) != 0);
        return MKV_STATUS_OK;
    }
    for (size_t i = 0; i < n;) {
        int32_t cl = (int32_t)utf8_len((const unsigned char *)s + i, n - i);
        int32_t id = smap_get(&tok->vocab, s + i, (size_t)cl), bytes_ok = id < 0;
        for (int32_t b = 0; b < cl && bytes_ok; b++) bytes_ok = tok->byte_tok[(uint8_t)s[i + b]] >= 0;
        if (id < 0 && bytes_ok) {
            for (int32_t b = 0; b < cl; b++)
                OOM_IF(add_symbol(w, &n_sym, tok->byte_tok[(uint8_t)s[i + b]], 1) != 0);
        } else if (id < 0) {
            if (tok->unk < 0)
                return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "tokenizer: character at "
                                "byte %zu is not in the vocabulary and there is no unk token", i);
            if (unk_len > 0 && !tok->fuse_unk) OOM_IF(add_symbol(w, &n_sym, tok->unk, unk_len) != 0);
            unk_len = (tok->fuse_unk ? unk_len : 0) + cl;
        } else {
            if (unk_len > 0) OOM_IF(add_symbol(w, &n_sym, tok->unk, unk_len) != 0);
            unk_len = 0;
            OOM_IF(add_symbol(w, &n_sym, id, cl) != 0);
        }
        i += (size_t)cl;
    }
    if (unk_len > 0) OOM_IF(add_symbol(w, &n_sym, tok->unk, unk_len) != 0);

    w->n_heap = 0;
    for (size_t i = 0; i < n_sym; i++) {
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n_sym ? (int32_t)i + 1 : -1;
        if (i + 1 < n_sym)
            OOM_IF(heap_push(w, pmap_get(&tok->merges, w->c[i], w->c[i + 1]), (int32_t)i) != 0);
    }
    while (w->n_heap > 0) {
        cand_t top = heap_pop(w);
        int32_t p = top.pos, r = w->next[p];
        if (w->len[p] == 0 || r < 0) continue; /* merged away, or the last symbol */
        const pmap_entry_t *m = pmap_get(&tok->merges, w->c[p], w->c[r]);
        if (!m || m->new_id != top.new_id) continue; /* stale: the pair has changed */
        w->c[p] = top.new_id;
        w->len[p] += w->len[r];
        w->len[r] = 0;
        w->next[p] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = p;
        if (w->prev[p] >= 0)
            OOM_IF(heap_push(w, pmap_get(&tok->merges, w->c[w->prev[p]], w->c[p]), w->prev[p]) != 0);
        if (w->next[p] >= 0)
            OOM_IF(heap_push(w, pmap_get(&tok->merges, w->c[p], w->c[w->next[p]]), p) != 0);
    }
    for (int32_t i = n_sym ? 0 : -1; i >= 0; i = w->next[i]) OOM_IF(iv_push(out, w->c[i]) != 0);
    return MKV_STATUS_OK;
}

/* Leftmost-longest match of the added tokens of class `normalized` in s[from..n). Returns the
 * index into tok->added (and *at) or -1. */
static int32_t find_added(const mkv_tokenizer_t *tok, int normalized, const char *s, size_t n,
                          size_t from, size_t *at)
{
    for (size_t i = from; i < n; i++) {
        int32_t best = -1;
        if (!tok->first_byte[normalized][(uint8_t)s[i]]) continue;
        for (int32_t k = 0; k < tok->n_added; k++) {
            const added_t *a = &tok->added[k];
            if (a->normalized == normalized && a->match_len && a->match_len <= n - i &&
                memcmp(s + i, a->match, a->match_len) == 0 &&
                (best < 0 || a->match_len > tok->added[best].match_len))
                best = k;
        }
        if (best >= 0) {
            *at = i;
            return best;
        }
    }
    return -1;
}

/* Splits s[0..n) on the added tokens of one class; gaps go to bpe (normalized) or are
 * normalized and split again on the normalized class. */
static mkv_status_t split(const mkv_tokenizer_t *tok, int normalized, const char *s, size_t n,
                          bpe_work_t *w, ivec_t *out, char *err)
{
    size_t pos = 0, at = 0;
    for (;;) {
        int32_t k = find_added(tok, normalized, s, n, pos, &at);
        size_t end = k >= 0 ? at : n;
        if (end > pos && normalized) {
            mkv_status_t st = bpe(tok, s + pos, end - pos, w, out, err);
            if (st != MKV_STATUS_OK) return st;
        } else if (end > pos) {
            sbuf_t norm = {0}, tmp = {0};
            int bad = normalize(tok, s + pos, end - pos, &norm, &tmp);
            mkv_status_t st = bad ? mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer: normalizing")
                                  : split(tok, 1, norm.p, norm.n, w, out, err);
            free(norm.p);
            free(tmp.p);
            if (st != MKV_STATUS_OK) return st;
        }
        if (k < 0) return MKV_STATUS_OK;
        OOM_IF(iv_push(out, tok->added[k].id) != 0);
        pos = at + tok->added[k].match_len;
    }
}

mkv_status_t mkv_tokenizer_encode(const mkv_tokenizer_t *tok, const char *text, size_t len,
                                  int add_bos, int32_t **out, int32_t *n_out, char *err)
{
    char dummy[MKV_ERR_LEN];
    if (!err) err = dummy;
    if (!tok || !out || !n_out || (!text && len))
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "tokenizer encode: null argument");
    *out = NULL;
    *n_out = 0;
    for (size_t i = 0, cl; i < len; i += cl)
        if ((cl = utf8_len((const unsigned char *)text + i, len - i)) == 0)
            return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                            "tokenizer encode: invalid UTF-8 at byte %zu", i);
    ivec_t ids = {0};
    bpe_work_t w = {0};
    int bos = add_bos && tok->bos >= 0;
    mkv_status_t status = iv_push(&ids, tok->bos) != 0
                              ? mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer: encoding")
                              : split(tok, 0, text ? text : "", len, &w, &ids, err);
    free(w.c);
    free(w.prev);
    free(w.next);
    free(w.len);
    free(w.heap);
    if (status != MKV_STATUS_OK || ids.n > INT32_MAX) {
        free(ids.p);
        return status != MKV_STATUS_OK ? status
                                       : mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "text too long");
    }
    /* ids[0] is a placeholder BOS, kept only when asked for and not already there. */
    int keep = bos && !(ids.n > 1 && ids.p[1] == tok->bos);
    if (!keep) memmove(ids.p, ids.p + 1, (ids.n - 1) * sizeof *ids.p);
    *out = ids.p;
    *n_out = (int32_t)(ids.n - (size_t)!keep);
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Decoding                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Runs the decoder chain over t[0..*n) in place. stream (mkv_tokenizer_piece): byte tokens
 * give their raw byte, and a Strip after a Fuse (i.e. of the whole text) applies only when
 * first. Returns -1 when out of memory. */
static int run_decoders(const mkv_tokenizer_t *tok, sbuf_t *t, size_t *n, int stream, int first)
{
    int fused = 0;
    for (int32_t k = 0; k < tok->n_dec; k++) {
        const step_t *st = &tok->dec[k];
        size_t j = 0;
        if (st->kind == STEP_REPLACE) {
            for (size_t i = 0; i < *n; i++) {
                sbuf_t r = {0};
                int bad = replace_all(t[i].p, t[i].n, st->a, st->b, &r);
                free(t[i].p);
                t[i] = r;
                if (bad) return -1;
            }
        } else if (st->kind == STEP_BYTE_FALLBACK) {
            /* HF: a run of <0xXX> tokens becomes its bytes when they are valid UTF-8, else one
             * U+FFFD per byte. */
            sbuf_t bytes = {0};
            for (size_t i = 0; i <= *n; i++) {
                const char *p = i < *n ? t[i].p : "";
                if (i < *n && t[i].n == 6 && memcmp(p, "<0x", 3) == 0 && isxdigit((uint8_t)p[3]) &&
                    isxdigit((uint8_t)p[4]) && p[5] == '>') {
                    char c = (char)strtol(p + 3, NULL, 16);
                    free(t[i].p);
                    t[i] = (sbuf_t){0};
                    if (sb_put(&bytes, &c, 1) != 0) return -1;
                    continue;
                }
                if (bytes.n > 0) {
                    size_t ok = 0, cl;
                    while (ok < bytes.n && (cl = utf8_len((unsigned char *)bytes.p + ok, bytes.n - ok)))
                        ok += cl;
                    for (size_t b = 0; b < (ok == bytes.n || stream ? 1 : bytes.n); b++) {
                        sbuf_t r = {0};
                        int bad = ok == bytes.n || stream ? sb_put(&r, bytes.p, bytes.n)
                                                          : sb_put(&r, "\xEF\xBF\xBD", 3);
                        t[j++] = r;
                        if (bad) {
                            free(bytes.p);
                            return -1;
                        }
                    }
                    free(bytes.p);
                    bytes = (sbuf_t){0};
                }
                if (i < *n && j != i) {
                    t[j] = t[i];
                    t[i] = (sbuf_t){0};
                }
                j += i < *n;
            }
            *n = j;
        } else if (st->kind == STEP_FUSE) {
            fused = 1;
            for (size_t i = 1; i < *n; i++) {
                if (sb_put(&t[0], t[i].p, t[i].n) != 0) return -1;
                free(t[i].p);
                t[i] = (sbuf_t){0};
            }
            *n = *n > 1 ? 1 : *n;
        } else if (st->kind == STEP_STRIP && (!fused || !stream || first)) {
            size_t cl = strlen(st->a);
            for (size_t i = 0; i < *n; i++) {
                size_t lo = 0, hi = t[i].n;
                for (int c = 0; c < st->start && hi - lo >= cl && !memcmp(t[i].p + lo, st->a, cl); c++)
                    lo += cl;
                for (int c = 0; c < st->stop && hi - lo >= cl && !memcmp(t[i].p + hi - cl, st->a, cl); c++)
                    hi -= cl;
                memmove(t[i].p, t[i].p + lo, hi - lo);
                t[i].n = hi - lo;
                t[i].p[t[i].n] = '\0';
            }
        }
    }
    return 0;
}

mkv_status_t mkv_tokenizer_decode(const mkv_tokenizer_t *tok, const int32_t *ids, int32_t n,
                                  int skip_special, char **out, char *err)
{
    char dummy[MKV_ERR_LEN];
    mkv_status_t status = MKV_STATUS_OK;
    if (!err) err = dummy;
    if (!tok || !out || n < 0 || (!ids && n))
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "tokenizer decode: bad argument");
    *out = NULL;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->n_vocab || !tok->text[ids[i]])
            return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                            "tokenizer decode: id %d at %d is not in the vocabulary", ids[i], i);
    size_t m = 0;
    sbuf_t *t = calloc((size_t)n + 1, sizeof *t), all = {0};
    if (!t) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer decode");
    for (int32_t i = 0; i < n; i++) {
        if (skip_special && tok->special[ids[i]]) continue;
        const char *s = tok->text[ids[i]];
        if (sb_put(&t[m++], s, strlen(s)) != 0) goto oom;
    }
    if (run_decoders(tok, t, &m, 0, 1) != 0) goto oom;
    /* HF joins the decoded strings; without a decoder, with spaces. */
    if (sb_put(&all, "", 0) != 0) goto oom;
    for (size_t i = 0; i < m; i++)
        if ((i > 0 && !tok->has_decoder && sb_put(&all, " ", 1) != 0) ||
            sb_put(&all, t[i].p, t[i].n) != 0)
            goto oom;
    *out = all.p;
    all.p = NULL;
    goto done;
oom:
    status = mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer decode");
done:
    for (int32_t i = 0; i < n; i++) free(t[i].p);
    free(t);
    free(all.p);
    return status;
}

const char *mkv_tokenizer_piece(const mkv_tokenizer_t *tok, int32_t prev, int32_t id, char *buf,
                                size_t buf_len)
{
    if (!buf || buf_len == 0) return "";
    buf[0] = '\0';
    if (!tok || id < 0 || id >= tok->n_vocab || !tok->text[id] || tok->special[id]) return buf;
    /* A document starts at -1 and after BOS: decode(skip_special) of BOS + text strips the
     * text's leading space too. Other specials (<unk> mid-text) do not restart it. */
    int first = prev < 0 || prev == tok->bos;
    sbuf_t t = {0};
    size_t n = 1;
    if ((!tok->has_decoder && !first && sb_put(&t, " ", 1) != 0) ||
        sb_put(&t, tok->text[id], strlen(tok->text[id])) != 0 ||
        run_decoders(tok, &t, &n, 1, first) != 0 || n == 0) {
        free(t.p);
        return buf;
    }
    size_t len = t.n < buf_len ? t.n : buf_len - 1;
    while (len < t.n && len > 0 && ((unsigned char)t.p[len] & 0xC0) == 0x80) len--;
    memcpy(buf, t.p, len);
    buf[len] = '\0';
    free(t.p);
    return buf;
}
