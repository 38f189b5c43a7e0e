/*
 * tokenizer_load.c — reads a Hugging Face tokenizer.json (and tokenizer_config.json) into the
 * tables of tokenizer_state.h, refusing what tokenizer.c cannot run (docs/tokenizer.md): only a
 * BPE model, the pre-tokenizers of pretok.c, the Sequence / Prepend / Replace / NFC
 * normalizers, the Sequence / Replace / ByteFallback / Fuse / Strip / ByteLevel decoders and
 * TemplateProcessing / ByteLevel post-processors. The table builders at the end are shared
 * with the GGUF constructor (tokenizer_bpe.c).
 */
#include "runner/tokenizer_state.h"

#include "runner/pretok.h"

#include "runner/error.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>


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
        return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot open %s: %s", path, strerror(errno));
    }
    sbuf_t b = {0};
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (sb_put(&b, chunk, got) != 0) {
            fclose(f);
            free(b.p);
            return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "reading %s", path);
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b.p);
        return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot read %s", path);
    }
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(b.p ? b.p : "", b.n, &end, 0);
    size_t at = end && b.p ? (size_t)(end - b.p) : 0;
    free(b.p);
    if (!*out) return runner_fail(err, MKV_STATUS_PARSE_ERROR, "%s: malformed JSON near byte %zu",
                               path, at);
    return MKV_STATUS_OK;
}

static mkv_status_t add_step(step_t **steps, int32_t *n, step_t s, char *err)
{
    int needs_a = s.kind == STEP_PREPEND || s.kind == STEP_REPLACE || s.kind == STEP_STRIP;
    int lost = (needs_a && !s.a) ||
               (s.kind == STEP_REPLACE && !s.b); /* a strdup failed */
    step_t *p = lost ? NULL : realloc(*steps, (size_t)(*n + 1) * sizeof *p);
    if (!p) {
        free(s.a);
        free(s.b);
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer steps");
    }
    p[(*n)++] = s;
    *steps = p;
    return MKV_STATUS_OK;
}

/* Whether a NUL-terminated string is well-formed UTF-8 (the normalizers' strings end up in
 * the text the model splits into characters). */
static int valid_utf8(const char *s)
{
    const size_t n = strlen(s);
    for (size_t i = 0, cl; i < n; i += cl)
        if ((cl = utf8_len((const unsigned char *)s + i, n - i)) == 0) return 0;
    return 1;
}

/* A Replace's pattern must be {"String": ...}; a Regex pattern is refused. */
static mkv_status_t load_replace(const cJSON *n, const char *what, step_t *s, char *err)
{
    const cJSON *pat = jget(n, "pattern");
    const char *from = jstr(pat, "String"), *to = jstr(n, "content");
    if (jget(pat, "Regex"))
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "tokenizer.json: %s Replace with a Regex pattern is not supported", what);
    if (!from || !from[0] || !to)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed %s Replace",
                        what);
    if (!valid_utf8(from) || !valid_utf8(to))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "tokenizer.json: %s Replace with a string that is not valid UTF-8", what);
    *s = (step_t){.kind = STEP_REPLACE, .a = strdup(from), .b = strdup(to)};
    return MKV_STATUS_OK;
}

static mkv_status_t load_normalizer(mkv_tokenizer_t *tok, const cJSON *n, char *err)
{
    if (!n) return MKV_STATUS_OK;
    const char *type = jstr(n, "type");
    step_t s = {0};
    if (!type) return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: untyped normalizer");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *item;
        if (!cJSON_IsArray(jget(n, "normalizers")))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed Sequence");
        cJSON_ArrayForEach(item, jget(n, "normalizers")) {
            mkv_status_t st = load_normalizer(tok, item, err);
            if (st != MKV_STATUS_OK) return st;
        }
        return MKV_STATUS_OK;
    }
    if (strcmp(type, "Prepend") == 0) {
        if (!jstr(n, "prepend"))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed Prepend");
        if (!valid_utf8(jstr(n, "prepend")))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "tokenizer.json: Prepend with a string that is not valid UTF-8");
        s = (step_t){.kind = STEP_PREPEND, .a = strdup(jstr(n, "prepend"))};
    } else if (strcmp(type, "Replace") == 0) {
        mkv_status_t st = load_replace(n, "normalizer", &s, err);
        if (st != MKV_STATUS_OK) return st;
    } else if (strcmp(type, "NFC") == 0) {
        s.kind = STEP_NFC;
    } else {
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "tokenizer.json: normalizer '%s' is not supported (only Sequence, "
                        "Prepend, Replace, NFC)", type);
    }
    return add_step(&tok->norm, &tok->n_norm, s, err);
}

static mkv_status_t load_decoder(mkv_tokenizer_t *tok, const cJSON *n, char *err)
{
    const char *type = jstr(n, "type");
    step_t s = {0};
    if (!type) return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: untyped decoder");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *item;
        if (!cJSON_IsArray(jget(n, "decoders")))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed Sequence");
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
    } else if (strcmp(type, "ByteLevel") == 0) {
        s.kind = STEP_BYTE_LEVEL;
    } else if (strcmp(type, "Strip") == 0) {
        const char *c = jstr(n, "content");
        const cJSON *a = jget(n, "start"), *b = jget(n, "stop");
        if (!c || !c[0] || utf8_len((const unsigned char *)c, strlen(c)) != strlen(c) ||
            !cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valueint < 0 || b->valueint < 0)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed Strip");
        s = (step_t){.kind = STEP_STRIP, .a = strdup(c), .start = a->valueint,
                     .stop = b->valueint};
    } else {
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "tokenizer.json: decoder '%s' is not supported (only Sequence, "
                        "Replace, ByteFallback, Fuse, Strip, ByteLevel)", type);
    }
    return add_step(&tok->dec, &tok->n_dec, s, err);
}

static mkv_status_t load_model(mkv_tokenizer_t *tok, const cJSON *m, char *err)
{
    const char *type = jstr(m, "type");
    const cJSON *vocab = jget(m, "vocab"), *merges = jget(m, "merges"), *item, *drop;
    if (!cJSON_IsObject(m) || !type)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: no typed \"model\"");
    if (strcmp(type, "BPE") != 0)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "tokenizer.json: model type '%s' is not supported (only BPE)", type);
    drop = jget(m, "dropout");
    if ((drop && (!cJSON_IsNumber(drop) || drop->valuedouble != 0.0)) ||
        (jstr(m, "continuing_subword_prefix") && jstr(m, "continuing_subword_prefix")[0]) ||
        (jstr(m, "end_of_word_suffix") && jstr(m, "end_of_word_suffix")[0]))
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.json: BPE dropout, "
                        "continuing_subword_prefix and end_of_word_suffix are not supported");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: BPE without vocab/merges");

    mkv_status_t st = mkv_tok_alloc_tables(tok, (size_t)cJSON_GetArraySize(vocab),
                                           (size_t)cJSON_GetArraySize(merges), err);
    if (st != MKV_STATUS_OK) return st;
    cJSON_ArrayForEach(item, vocab) {
        if (!cJSON_IsNumber(item) || item->valuedouble < 0 || item->valuedouble > 1e9 ||
            item->valuedouble != (double)item->valueint)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: bad id of '%s'",
                            item->string);
        st = mkv_tok_add_vocab(tok, item->string, strlen(item->string), item->valueint, err);
        if (st != MKV_STATUS_OK) return st;
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
        if (!a) return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed merge %d",
                                rank);
        if ((st = mkv_tok_add_merge(tok, a, b, rank++, err)) != MKV_STATUS_OK) return st;
    }
    const char *unk = jstr(m, "unk_token");
    tok->unk = unk ? smap_get(&tok->vocab, unk, strlen(unk)) : -1;
    if (unk && tok->unk < 0)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: unk_token '%s' is not in "
                        "the vocabulary", unk);
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
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: added_tokens not a list");
    tok->added = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *tok->added);
    if (!tok->added) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "added tokens");
    cJSON_ArrayForEach(item, arr) {
        const cJSON *id = jget(item, "id");
        const char *content = jstr(item, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e9 || !content ||
            !content[0])
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed added token");
        for (int f = 0; f < 3; f++)
            if (jbool(item, flags[f], 0))
                return runner_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.json: added token "
                                "'%s' has %s set (not supported)", content, flags[f]);
        added_t *a = &tok->added[tok->n_added++];
        a->id = id->valueint;
        a->special = jbool(item, "special", 0);
        a->normalized = jbool(item, "normalized", !a->special); /* HF's default */
        if (!(a->content = strdup(content)))
            return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "added tokens");
        if (a->id >= tok->n_vocab) tok->n_vocab = a->id + 1;
    }
    return MKV_STATUS_OK;
}

int32_t mkv_tokenizer_token_id(const mkv_tokenizer_t *tok, const char *s)
{
    if (!tok || !s) return -1;
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
    if ((*id = mkv_tokenizer_token_id(tok, s)) < 0)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "tokenizer_config.json: %s '%s' is not in the vocabulary", key, s);
    return MKV_STATUS_OK;
}

/* BOS from a TemplateProcessing post-processor: a SpecialToken ahead of sequence A. */
static mkv_status_t load_post(mkv_tokenizer_t *tok, const cJSON *pp, char *err)
{
    if (!pp) return MKV_STATUS_OK;
    const char *type = jstr(pp, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *item;
        cJSON_ArrayForEach(item, jget(pp, "processors")) {
            mkv_status_t st = load_post(tok, item, err);
            if (st != MKV_STATUS_OK) return st;
        }
        return MKV_STATUS_OK;
    }
    if (type && strcmp(type, "ByteLevel") == 0) return MKV_STATUS_OK; /* offsets only */
    if (!type || strcmp(type, "TemplateProcessing") != 0)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.json: post_processor '%s' is "
                        "not supported (only TemplateProcessing, ByteLevel, Sequence)", type ? type : "?");
    const cJSON *first = cJSON_GetArrayItem(jget(pp, "single"), 0);
    const char *name = jstr(jget(first, "SpecialToken"), "id");
    const cJSON *ids = name ? jget(jget(jget(pp, "special_tokens"), name), "ids") : NULL;
    if (cJSON_GetArraySize(ids) == 1 && cJSON_IsNumber(cJSON_GetArrayItem(ids, 0)))
        tok->bos = cJSON_GetArrayItem(ids, 0)->valueint;
    else if (name)
        tok->bos = mkv_tokenizer_token_id(tok, name);
    return MKV_STATUS_OK;
}

mkv_status_t mkv_tok_finish(mkv_tokenizer_t *tok, char *err)
{
    sbuf_t norm = {0}, tmp = {0};
    /* Ids index tables sized by the largest id, so they must be (nearly) dense: a 62-byte
     * file naming id 999999999 must not allocate gigabytes. */
    int64_t entries = tok->n_added;
    for (size_t i = 0; i < tok->vocab.cap; i++) entries += tok->vocab.e[i].key != NULL;
    if (tok->n_vocab > entries)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer: ids are not dense: id %d with "
                        "only %lld tokens", tok->n_vocab - 1, (long long)entries);
    tok->text = calloc((size_t)tok->n_vocab + 1, sizeof *tok->text);
    tok->special = calloc((size_t)tok->n_vocab + 1, 1);
    if (!tok->text || !tok->special) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
    for (size_t i = 0; i < tok->vocab.cap; i++) {
        const smap_entry_t *e = &tok->vocab.e[i];
        if (!e->key) continue;
        if (tok->text[e->id])
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer: id %d is given to both "
                            "'%s' and '%s'", e->id, tok->text[e->id], e->key);
        tok->text[e->id] = e->key;
    }
    for (int32_t k = 0; k < tok->n_added; k++) {
        added_t *a = &tok->added[k];
        tok->text[a->id] = a->content;
        tok->special[a->id] = (uint8_t)a->special;
        /* HF normalizes the content of normalized added tokens before matching them. */
        const char *m = a->content;
        if (a->normalized) {
            const int rc = mkv_tok_normalize(tok, a->content, strlen(a->content), &norm, &tmp);
            if (rc == -2) {
                free(norm.p);
                free(tmp.p);
                return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                                "tokenizer: the normalizer expands the added token '%.64s' "
                                "beyond %dx its length", a->content, MKV_TOK_GROWTH);
            }
            if (rc != 0) break;
            m = norm.p;
        }
        if (!(a->match = strdup(m))) break;
        a->match_len = strlen(m); /* 0 (normalized away): never matched */
        if (a->match_len) tok->first_byte[a->normalized][(uint8_t)m[0]] = 1;
    }
    free(norm.p);
    free(tmp.p);
    for (int32_t k = 0; k < tok->n_added; k++)
        if (!tok->added[k].match) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
    static const char *const names[3] = {"bos", "eos", "unk"};
    const int32_t ids[3] = {tok->bos, tok->eos, tok->unk};
    for (int i = 0; i < 3; i++)
        if (ids[i] < -1 || ids[i] >= tok->n_vocab || (ids[i] >= 0 && !tok->text[ids[i]]))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer: %s id %d is not a token "
                            "(vocabulary of %d)", names[i], ids[i], tok->n_vocab);
    return MKV_STATUS_OK;
}

mkv_status_t mkv_tokenizer_load(const char *dir, mkv_tokenizer_t **out, char *err)
{
    char path[4096], dummy[MKV_ERR_LEN];
    mkv_status_t status = MKV_STATUS_OK;
    cJSON *root = NULL, *cfg = NULL;
    mkv_tokenizer_t *tok = NULL;
    if (!err) err = dummy;
    if (!dir || !out) return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "null argument");
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) return mkv_tokenizer_load_gguf(dir, out, err);
    if (snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= (int)sizeof path)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "path too long");
    RUNNER_TRY(read_json(path, 0, &root, err));
    if (!(tok = calloc(1, sizeof *tok))) {
        status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
        goto fail;
    }
    tok->bos = tok->eos = tok->unk = tok->pad = tok->add_bos = -1;
    mkv_tok_init_byte_level(tok); /* for a ByteLevel decoder, with or without the pre-tokenizer */
    if (jget(root, "pre_tokenizer"))
        RUNNER_TRY(mkv_pretok_from_json(jget(root, "pre_tokenizer"), &tok->pre, &tok->byte_level,
                                     err));
    RUNNER_TRY(load_model(tok, jget(root, "model"), err));
    RUNNER_TRY(load_added(tok, jget(root, "added_tokens"), err));
    RUNNER_TRY(load_normalizer(tok, jget(root, "normalizer"), err));
    if (jget(root, "decoder")) {
        tok->has_decoder = 1;
        RUNNER_TRY(load_decoder(tok, jget(root, "decoder"), err));
    }
    RUNNER_TRY(load_post(tok, jget(root, "post_processor"), err));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    RUNNER_TRY(read_json(path, 1, &cfg, err));
    RUNNER_TRY(config_token(tok, cfg, "bos_token", &tok->bos, err));
    RUNNER_TRY(config_token(tok, cfg, "eos_token", &tok->eos, err));
    RUNNER_TRY(mkv_tok_finish(tok, err));
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
    for (size_t i = 0; tok->vocab.e && i < tok->vocab.cap; i++) free(tok->vocab.e[i].key);
    for (int32_t k = 0; k < tok->n_added; k++) {
        free(tok->added[k].content);
        free(tok->added[k].match);
    }
    for (int32_t k = 0; k < tok->n_norm; k++) { free(tok->norm[k].a); free(tok->norm[k].b); }
    for (int32_t k = 0; k < tok->n_dec; k++) { free(tok->dec[k].a); free(tok->dec[k].b); }
    mkv_pretok_free(tok->pre);
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
/* Table builders (also used by mkv_tokenizer_create_bpe)                                   */
/* ---------------------------------------------------------------------------------------- */

mkv_status_t mkv_tok_alloc_tables(mkv_tokenizer_t *tok, size_t n_vocab, size_t n_merges,
                                  char *err)
{
    for (tok->vocab.cap = 16; tok->vocab.cap < 2 * n_vocab; tok->vocab.cap *= 2) {}
    for (tok->merges.cap = 16; tok->merges.cap < 2 * n_merges; tok->merges.cap *= 2) {}
    tok->vocab.e = calloc(tok->vocab.cap, sizeof *tok->vocab.e);
    tok->merges.e = malloc(tok->merges.cap * sizeof *tok->merges.e);
    if (!tok->vocab.e || !tok->merges.e)
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer vocab");
    for (size_t i = 0; i < tok->merges.cap; i++) tok->merges.e[i].rank = -1;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_tok_add_vocab(mkv_tokenizer_t *tok, const char *s, size_t n, int32_t id,
                               char *err)
{
    smap_entry_t *e = smap_slot(&tok->vocab, s, n);
    if (e->key)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer: token '%.*s' appears twice in "
                        "the vocabulary (ids %d and %d)", (int)n, s, e->id, id);
    if (!(e->key = malloc(n + 1))) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
    memcpy(e->key, s, n);
    e->key[n] = '\0';
    e->len = n;
    e->id = id;
    if (id >= tok->n_vocab) tok->n_vocab = id + 1;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_tok_add_merge(mkv_tokenizer_t *tok, const char *a, const char *b, int32_t rank,
                               char *err)
{
    char joined[2048];
    if (snprintf(joined, sizeof joined, "%s%s", a, b) >= (int)sizeof joined)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer: merge %d is too long", rank);
    int32_t ia = smap_get(&tok->vocab, a, strlen(a)), ib = smap_get(&tok->vocab, b, strlen(b));
    int32_t ij = smap_get(&tok->vocab, joined, strlen(joined));
    if (ia < 0 || ib < 0 || ij < 0)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer: merge %d ('%s' '%s') names a "
                        "token not in the vocabulary ('%s')", rank, a, b,
                        ia < 0 ? a : ib < 0 ? b : joined);
    pmap_entry_t *e = &tok->merges.e[pmap_find(&tok->merges, pair_key(ia, ib))];
    e->key = pair_key(ia, ib);
    e->rank = rank; /* a repeated pair keeps its last rank, as HF's HashMap collect does */
    e->new_id = ij;
    return MKV_STATUS_OK;
}
