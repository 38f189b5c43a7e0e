/*
 * fuzz_tokenizer.c — libFuzzer target: the input as tokenizer.json (engine/tokenizer_load.c),
 * and when it loads, a few fixed texts through mkv_tokenizer_encode (normalizers, added
 * tokens, BPE merges, unknowns), the ids back through mkv_tokenizer_decode (decoders, byte
 * fallback) and mkv_tokenizer_piece, and ids the tokenizer never produced (every id of a
 * small vocabulary, and out-of-range ones, which must be refused, not read).
 * Seeds: fuzz/corpus/tokenizer/.
 */
#include "common/error.h"
#include "engine/tokenizer.h"
#include "fuzz_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const texts[] = {
    "Once upon a time, there was a little girl.",
    "",
    " ",
    "  two  spaces\tand\ttabs\nand a newline",
    "<|start_story|>Tim<|end_story|><unk>",
    "h\xc3\xa9llo w\xc3\xb6rld \xe2\x96\x81 \xf0\x9f\x99\x82",
    "invalid \xff\xfe\xc3 utf-8 \xe2\x82",
};

/* Known bugs in engine/tokenizer*.c, reported with their reproducers in fuzz/pending/: the
 * harness steps around them so that CI fails only on new findings. Remove each with its fix. */

/* 1 when s is valid UTF-8 (shortest forms, no surrogates, up to U+10FFFF). */
static int valid_utf8(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        int n = *s < 0x80 ? 0 : (*s & 0xE0) == 0xC0 ? 1 : (*s & 0xF0) == 0xE0 ? 2
                : (*s & 0xF8) == 0xF0 ? 3 : -1;
        if (n < 0 || (n == 1 && *s < 0xC2) || (n == 3 && *s > 0xF4)) return 0;
        if ((*s == 0xE0 && n == 2 && s[1] < 0xA0) || (*s == 0xED && s[1] >= 0xA0) ||
            (*s == 0xF0 && s[1] < 0x90) || (*s == 0xF4 && s[1] >= 0x90))
            return 0;
        for (int k = 1; k <= n; k++)
            if ((s[k] & 0xC0) != 0x80) return 0;
        s += n + 1;
    }
    return 1;
}

static int valid_member(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !cJSON_IsString(v) || valid_utf8(v->valuestring);
}

/* 0 when a normalizer step can produce invalid UTF-8 (a Prepend, pattern or content that is
 * not valid UTF-8: a valid pattern only ever matches whole characters). */
static int normalizer_utf8(const cJSON *norm)
{
    const cJSON *item;
    int ok = valid_member(norm, "prepend") && valid_member(norm, "content") &&
             valid_member(cJSON_GetObjectItemCaseSensitive(norm, "pattern"), "String");
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(norm, "normalizers"))
        ok = ok && normalizer_utf8(item);
    return ok;
}

/* An upper bound on the normalized length of n bytes of text. */
static double normalized_len(const cJSON *norm, double n)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(norm, "type"), *item;
    if (!cJSON_IsString(type)) return n;
    if (strcmp(type->valuestring, "Sequence") == 0) {
        cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(norm, "normalizers"))
            n = normalized_len(item, n);
    } else if (strcmp(type->valuestring, "Prepend") == 0) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(norm, "prepend");
        if (cJSON_IsString(p)) n += (double)strlen(p->valuestring);
    } else if (strcmp(type->valuestring, "Replace") == 0) {
        const cJSON *from = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(norm, "pattern"), "String");
        const cJSON *to = cJSON_GetObjectItemCaseSensitive(norm, "content");
        if (cJSON_IsString(from) && cJSON_IsString(to) && from->valuestring[0])
            n *= 1.0 + (double)strlen(to->valuestring) / (double)strlen(from->valuestring);
    }
    return n;
}

static int known_bug(const uint8_t *data, size_t size)
{
    /* NOTE: with the length, as the loader parses: NUL bytes do not end the document. */
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    /* normalizer-expansion.json: normalizers that multiply the text's length (chained Replace
     * steps) are run without a bound: a few KB of tokenizer.json turn one short text (or an
     * added token's content) into millions of tokens. */
    /* tokenizer-invalid-utf8-normalizer.json: a normalizer whose strings are not UTF-8
     * makes invalid UTF-8 of valid text, and bpe() does not advance over it (endless loop). */
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    int bug = !normalizer_utf8(norm);
    bug |= normalized_len(norm, 64) > 65536;
    /* tokenizer-huge-vocab-id.json: the id tables are sized by the largest id (up to 1e9
     * accepted: 8 GB for a one-token vocabulary). */
    const cJSON *item, *id;
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(
                                 cJSON_GetObjectItemCaseSensitive(root, "model"), "vocab"))
        bug |= cJSON_IsNumber(item) && item->valuedouble > (1 << 20);
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))
    {
        id = cJSON_GetObjectItemCaseSensitive(item, "id");
        bug |= cJSON_IsNumber(id) && id->valuedouble > (1 << 20);
    }
    cJSON_Delete(root);
    return bug;
}

static void roundtrip(const mkv_tokenizer_t *tok, const char *text, size_t len)
{
    char err[MKV_ERR_LEN] = "", buf[256];
    int32_t *ids = NULL, n = 0;
    for (int bos = 0; bos < 2; bos++) {
        if (mkv_tokenizer_encode(tok, text, len, bos, &ids, &n, err) != MKV_STATUS_OK) {
            if (fuzz_verbose()) fprintf(stderr, "fuzz_tokenizer: encode: %s\n", err);
            continue;
        }
        for (int skip = 0; skip < 2; skip++) {
            char *out = NULL;
            if (mkv_tokenizer_decode(tok, ids, n, skip, &out, err) == MKV_STATUS_OK) free(out);
        }
        int32_t prev = -1;
        for (int32_t i = 0; i < n && i < 64; i++) {
            mkv_tokenizer_piece(tok, prev, ids[i], buf, sizeof buf);
            prev = ids[i];
        }
        free(ids);
        ids = NULL;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (known_bug(data, size)) return 0;
    fuzz_write("tokenizer.json", data, size);
    char err[MKV_ERR_LEN] = "", buf[256];
    mkv_tokenizer_t *tok = NULL;
    const mkv_status_t st = mkv_tokenizer_load(fuzz_dir(), &tok, err);
    if (fuzz_verbose()) fprintf(stderr, "fuzz_tokenizer: load: %s %s\n", mkv_status_string(st), err);
    if (st != MKV_STATUS_OK) return 0;

    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) roundtrip(tok, texts[i], strlen(texts[i]));

    /* Ids the encoder did not produce: all of a small vocabulary, then out of range. */
    const int32_t v = mkv_tokenizer_vocab_size(tok);
    int32_t ids[72];
    int32_t n = 0;
    for (int32_t i = 0; i < v && n < 64; i++) ids[n++] = i;
    char *out = NULL;
    if (mkv_tokenizer_decode(tok, ids, n, 0, &out, err) == MKV_STATUS_OK) free(out);
    const int32_t bad[] = {-1, v, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = NULL;
        if (mkv_tokenizer_decode(tok, &bad[i], 1, 1, &out, err) == MKV_STATUS_OK) free(out);
        mkv_tokenizer_piece(tok, -1, bad[i], buf, sizeof buf);
        mkv_tokenizer_piece(tok, bad[i], 0, buf, sizeof buf);
    }
    (void)mkv_tokenizer_bos(tok);
    (void)mkv_tokenizer_eos(tok);
    (void)mkv_tokenizer_unk(tok);
    mkv_tokenizer_free(tok);
    return 0;
}
