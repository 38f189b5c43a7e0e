/*
 * tokenizer_bpe.c — what byte-level BPE adds to the tokenizer (runner/tokenizer.h,
 * docs/tokenizer.md): GPT-2's byte-to-character map and its inverse, the ByteLevel decoder's
 * byte recovery and Rust's from_utf8_lossy, the NFC normalizer (ICU), and the constructor from
 * GGUF metadata arrays (mkv_tokenizer_create_bpe), which gives a GGUF model the same pipeline
 * as its tokenizer.json.
 *
 * NFC comes from ICU (libicu, Debian's libicu-dev): normalization needs the Unicode
 * composition tables, which mixkv does not keep a copy of; ICU is the reference
 * implementation, already on the build machines, and its C API (unorm2) is stable.
 */
#include "runner/tokenizer_state.h"

#include "runner/pretok.h"

#include "runner/error.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Byte-level map                                                                           */
/* ---------------------------------------------------------------------------------------- */

void mkv_tok_init_byte_level(mkv_tokenizer_t *tok)
{
    /* GPT-2's bytes_to_unicode: printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC,
     * U+00AE..U+00FF) stand for themselves; the 68 others, in byte order, get U+0100.. */
    uint32_t next = 256;
    for (int i = 0; i < 512; i++) tok->bl_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        uint32_t cp = printable ? (uint32_t)b : next++;
        tok->bl_byte[cp] = (int16_t)b;
        if (cp < 0x80) {
            tok->bl_char[b][0] = (char)cp;
            tok->bl_len[b] = 1;
        } else {
            tok->bl_char[b][0] = (char)(0xC0 | cp >> 6);
            tok->bl_char[b][1] = (char)(0x80 | (cp & 0x3F));
            tok->bl_len[b] = 2;
        }
    }
}

int mkv_tok_byte_level_bytes(const mkv_tokenizer_t *tok, const char *s, size_t n, sbuf_t *out)
{
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)s + i;
        size_t cl = utf8_len(u, n - i);
        uint32_t cp = cl == 1 ? u[0] : cl == 2 ? (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F)
                                                : 512;
        if (cp >= 512 || tok->bl_byte[cp] < 0) { /* not a byte-level token: its text as is */
            out->n = start;
            return sb_put(out, s, n);
        }
        char b = (char)tok->bl_byte[cp];
        if (sb_put(out, &b, 1) != 0) return -1;
        i += cl;
    }
    return 0;
}

int mkv_tok_utf8_lossy(const char *s, size_t n, sbuf_t *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    if (sb_put(out, "", 0) != 0) return -1;
    while (i < n) {
        size_t cl = utf8_len(u + i, n - i);
        if (cl) {
            i += cl;
            continue;
        }
        /* The maximal subpart: a lead byte and the continuation bytes that could still have
         * completed it (Unicode's "U+FFFD substitution of maximal subparts"). */
        unsigned char c = u[i];
        size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                      : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
        unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        size_t k = 1;
        if (need > 1 && i + 1 < n && u[i + 1] >= lo && u[i + 1] <= hi) {
            k = 2;
            while (k < need && i + k < n && (u[i + k] & 0xC0) == 0x80) k++;
        }
        if (sb_put(out, s + run, i - run) != 0 || sb_put(out, "\xEF\xBF\xBD", 3) != 0) return -1;
        i += k;
        run = i;
    }
    return sb_put(out, s + run, n - run);
}

/* ---------------------------------------------------------------------------------------- */
/* NFC                                                                                      */
/* ---------------------------------------------------------------------------------------- */

/* Appends NFC of the well-formed s[0..n). */
static int nfc_span(const char *s, size_t n, sbuf_t *out, size_t limit)
{
    size_t ascii = 0;
    while (ascii < n && (unsigned char)s[ascii] < 0x80) ascii++;
    if (ascii == n) return out->n + n > limit ? -2 : sb_put(out, s, n); /* ASCII is NFC */
    if (n > INT32_MAX / 4) return -2;
    UErrorCode e = U_ZERO_ERROR;
    const UNormalizer2 *nfc = unorm2_getNFCInstance(&e);
    int32_t n16 = 0, m16 = 0, n8 = 0;
    /* UTF-16 has at most one unit per UTF-8 byte; NFC at most triples a text (Unicode's
     * stated bound), and UTF-8 takes at most three bytes per UTF-16 unit. */
    UChar *a = malloc((n + 1) * sizeof *a), *b = malloc((3 * n + 1) * sizeof *b);
    int rc = -1;
    if (!a || !b || U_FAILURE(e)) goto done;
    u_strFromUTF8(a, (int32_t)n + 1, &n16, s, (int32_t)n, &e);
    if (U_SUCCESS(e)) m16 = unorm2_normalize(nfc, a, n16, b, 3 * (int32_t)n + 1, &e);
    if (U_FAILURE(e)) goto done;
    if (out->n + 3 * (size_t)m16 > limit) { /* a bound first: nothing past limit is made */
        u_strToUTF8(NULL, 0, &n8, b, m16, &e); /* preflight: the exact length */
        if (out->n + (size_t)n8 > limit) {
            rc = -2;
            goto done;
        }
        e = U_ZERO_ERROR;
    }
    free(a); /* reused for the UTF-8 bytes */
    if (!(a = malloc(3 * (size_t)m16 + 1))) goto done;
    u_strToUTF8((char *)a, 3 * m16 + 1, &n8, b, m16, &e);
    rc = U_FAILURE(e) ? -1 : sb_put(out, (const char *)a, (size_t)n8);
done:
    free(a);
    free(b);
    return rc;
}

int mkv_tok_nfc(const char *s, size_t n, sbuf_t *out, size_t limit)
{
    size_t i = 0, run = 0;
    if (sb_put(out, "", 0) != 0) return -1;
    while (i < n) {
        size_t cl = utf8_len((const unsigned char *)s + i, n - i);
        if (cl) {
            i += cl;
            continue;
        }
        int rc = nfc_span(s + run, i - run, out, limit); /* the ill-formed byte as it is */
        if (rc != 0) return rc;
        if (out->n + 1 > limit) return -2;
        if (sb_put(out, s + i, 1) != 0) return -1;
        run = ++i;
    }
    return nfc_span(s + run, n - run, out, limit);
}

/* ---------------------------------------------------------------------------------------- */
/* From GGUF metadata                                                                       */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t one_step(step_t **steps, int32_t *n, int kind, char *err)
{
    if (!(*steps = calloc(1, sizeof **steps)))
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
    (*steps)[0].kind = kind;
    *n = 1;
    return MKV_STATUS_OK;
}

static mkv_status_t load_tokens(mkv_tokenizer_t *tok, const mkv_bpe_spec_t *sp, char *err)
{
    mkv_status_t status = MKV_STATUS_OK;
    RUNNER_TRY(mkv_tok_alloc_tables(tok, (size_t)sp->n_vocab, (size_t)sp->n_merges, err));
    if (!(tok->added = calloc((size_t)sp->n_vocab, sizeof *tok->added)))
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
    for (int32_t i = 0; i < sp->n_vocab; i++) {
        const char *s = sp->tokens[i];
        int32_t len = s && sp->token_lens ? sp->token_lens[i] : s ? (int32_t)strlen(s) : -1;
        int32_t type = sp->token_types ? sp->token_types[i] : 1;
        if (len <= 0 || memchr(s, '\0', (size_t)len))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer: token %d is %s", i,
                            len < 0 ? "missing" : len == 0 ? "empty" : "holds a NUL byte");
        RUNNER_TRY(mkv_tok_add_vocab(tok, s, (size_t)len, i, err));
        if (type != 3 && type != 4) continue;
        /* Control and user-defined tokens are matched whole in the raw text, as the
         * tokenizer.json's added tokens (normalized: false) are. */
        added_t *a = &tok->added[tok->n_added++];
        a->id = i;
        a->special = type == 3;
        if (!(a->content = malloc((size_t)len + 1)))
            return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
        memcpy(a->content, s, (size_t)len);
        a->content[len] = '\0';
    }
    for (int32_t r = 0; r < sp->n_merges; r++) {
        char pair[2048];
        const char *m = sp->merges[r];
        int32_t len = m && sp->merge_lens ? sp->merge_lens[r] : m ? (int32_t)strlen(m) : -1;
        char *sp1 = NULL;
        if (len > 0 && len < (int32_t)sizeof pair) {
            memcpy(pair, m, (size_t)len);
            pair[len] = '\0';
            sp1 = strchr(pair, ' ');
        }
        if (!sp1 || sp1 == pair || !sp1[1] || strchr(sp1 + 1, ' ') || strlen(pair) != (size_t)len)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer: merge %d is not \"a b\"", r);
        *sp1 = '\0';
        RUNNER_TRY(mkv_tok_add_merge(tok, pair, sp1 + 1, r, err));
    }
fail:
    return status;
}

mkv_status_t mkv_tokenizer_create_bpe(const mkv_bpe_spec_t *sp, mkv_tokenizer_t **out, char *err)
{
    char dummy[MKV_ERR_LEN];
    mkv_status_t status = MKV_STATUS_OK;
    int nfc = 0;
    if (!err) err = dummy;
    if (!sp || !out || sp->n_vocab <= 0 || !sp->tokens || sp->n_merges < 0 ||
        (sp->n_merges > 0 && !sp->merges))
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "tokenizer: bad BPE spec");
    *out = NULL;
    if (!sp->model || strcmp(sp->model, "gpt2") != 0)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.ggml.model '%s' is not "
                        "supported (only gpt2, byte-level BPE)", sp->model ? sp->model : "(none)");
    const int32_t ids[4] = {sp->bos, sp->eos, sp->unk, sp->pad};
    static const char *const names[4] = {"bos", "eos", "unk", "pad"};
    for (int i = 0; i < 4; i++)
        if (ids[i] < -1 || ids[i] >= sp->n_vocab)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer: %s id %d is not a token "
                            "(vocabulary of %d)", names[i], ids[i], sp->n_vocab);
    mkv_tokenizer_t *tok = calloc(1, sizeof *tok);
    if (!tok) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer");
    tok->bos = sp->bos;
    tok->eos = sp->eos;
    tok->unk = sp->unk;
    tok->pad = sp->pad;
    tok->add_bos = sp->add_bos != 0;
    for (int b = 0; b < 256; b++) tok->byte_tok[b] = -1;
    mkv_tok_init_byte_level(tok);
    tok->byte_level = 1;
    /* Llama 3's tokenizer.json sets ignore_merges; the others leave it false. */
    tok->ignore_merges = sp->pre && strcmp(sp->pre, "llama-bpe") == 0;
    RUNNER_TRY(mkv_pretok_from_name(sp->pre, &tok->pre, &nfc, err));
    if (nfc) RUNNER_TRY(one_step(&tok->norm, &tok->n_norm, STEP_NFC, err));
    RUNNER_TRY(one_step(&tok->dec, &tok->n_dec, STEP_BYTE_LEVEL, err));
    tok->has_decoder = 1;
    RUNNER_TRY(load_tokens(tok, sp, err));
    RUNNER_TRY(mkv_tok_finish(tok, err));
    *out = tok;
    return MKV_STATUS_OK;
fail:
    mkv_tokenizer_free(tok);
    return status;
}

int mkv_tokenizer_add_bos(const mkv_tokenizer_t *tok) { return tok ? tok->add_bos : -1; }
