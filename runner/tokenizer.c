/*
 * tokenizer.c — encoding and decoding with a loaded tokenizer.json (runner/tokenizer.h,
 * docs/tokenizer.md; tokenizer_load.c reads the file).
 *
 * Follows Hugging Face `tokenizers` step by step (checked against 0.21.1 and 0.22.2, see
 * tests/cpu/test_tokenizer.c), so that ids match the ones the models were trained on:
 *  - added tokens with normalized=false are split out of the raw text; each other piece is
 *    normalized, and then the added tokens with normalized=true are matched in the normalized
 *    text against their *normalized* content (leftmost-longest). NOTE: with the Prepend "▁"
 *    normalizer, `<|end_story|>` is matched as "▁<|end_story|>", i.e. only at the start of the
 *    text or after a space; "a<|end_story|>" stays plain text, as in HF.
 *  - BPE as HF's Word::merge_all: a heap of candidate merges keyed by (rank, left position);
 *    entries made stale by earlier merges are skipped when popped. O(n log n) per piece, and a
 *    piece can be a whole document (no pre-tokenizer).
 *  - each normalized piece goes through the pre-tokenizer (pretok.c), when there is one; with
 *    byte-level BPE, each byte of a piece becomes its GPT-2 character before BPE.
 *  - decoding runs the decoder chain over a list of token strings.
 */
#include "runner/tokenizer_state.h"

#include "runner/pretok.h"

#include "runner/error.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Appends s[0..n) to out with every non-overlapping pat (non-empty) replaced by rep. -1 when
 * out of memory, -2 when out would pass limit bytes. */
static int replace_all(const char *s, size_t n, const char *pat, const char *rep, sbuf_t *out,
                       size_t limit)
{
    size_t pl = strlen(pat), rl = strlen(rep), run = 0, i = 0;
    while (i < n) {
        if (n - i >= pl && memcmp(s + i, pat, pl) == 0) {
            if (out->n + (i - run) + rl > limit) return -2;
            if (sb_put(out, s + run, i - run) != 0 || sb_put(out, rep, rl) != 0)
                return -1;
            i += pl;
            run = i;
        } else {
            i++;
        }
    }
    if (out->n + (n - run) > limit) return -2;
    return sb_put(out, s + run, n - run);
}

int mkv_tok_normalize(const mkv_tokenizer_t *tok, const char *s, size_t n, sbuf_t *out,
                      sbuf_t *tmp)
{
    size_t limit = MKV_TOK_GROWTH * n + MKV_TOK_SLACK;
    int rc = 0;
    out->n = 0;
    if (sb_put(out, s, n) != 0) return -1;
    for (int32_t k = 0; k < tok->n_norm; k++) {
        const step_t *st = &tok->norm[k];
        tmp->n = 0;
        if (st->kind == STEP_PREPEND) {
            if (out->n == 0) continue; /* HF prepends to non-empty text only */
            if (out->n + strlen(st->a) > limit) return -2;
            if (sb_put(tmp, st->a, strlen(st->a)) != 0) return -1;
            if (sb_put(tmp, out->p, out->n) != 0) return -1;
        } else if (st->kind == STEP_NFC) {
            if ((rc = mkv_tok_nfc(out->p, out->n, tmp, limit)) != 0) return rc;
        } else if ((rc = replace_all(out->p, out->n, st->a, st->b, tmp, limit)) != 0) {
            return rc;
        }
        sbuf_t t = *out;
        *out = *tmp;
        *tmp = t;
    }
    return 0;
}

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

static int cand_less(cand_t x, cand_t y)
{
    return x.rank < y.rank || (x.rank == y.rank && x.pos < y.pos);
}

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
        if (cond) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer: encoding");       \
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
        if (cl == 0)
            return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                            "tokenizer: the text is not valid UTF-8 at byte %zu", i);
        int32_t id = smap_get(&tok->vocab, s + i, (size_t)cl), bytes_ok = id < 0;
        for (int32_t b = 0; b < cl && bytes_ok; b++)
            bytes_ok = tok->byte_tok[(uint8_t)s[i + b]] >= 0;
        if (id < 0 && bytes_ok) {
            /* NOTE: as HF, a pending <unk> run is not flushed first: "😀é" with byte tokens for
             * é only gives <0xC3> <0xA9> <unk>. */
            for (int32_t b = 0; b < cl; b++)
                OOM_IF(add_symbol(w, &n_sym, tok->byte_tok[(uint8_t)s[i + b]], 1) != 0);
        } else if (id < 0) {
            if (tok->unk < 0)
                return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "tokenizer: character at "
                                "byte %zu is not in the vocabulary and there is no unk token", i);
            if (unk_len > 0 && !tok->fuse_unk)
                OOM_IF(add_symbol(w, &n_sym, tok->unk, unk_len) != 0);
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
        int32_t l = w->prev[p], nx = w->next[p];
        if (l >= 0) OOM_IF(heap_push(w, pmap_get(&tok->merges, w->c[l], w->c[p]), l) != 0);
        if (nx >= 0) OOM_IF(heap_push(w, pmap_get(&tok->merges, w->c[p], w->c[nx]), p) != 0);
    }
    for (int32_t i = n_sym ? 0 : -1; i >= 0; i = w->next[i]) OOM_IF(iv_push(out, w->c[i]) != 0);
    return MKV_STATUS_OK;
}

/* One normalized piece without added tokens: pre-tokenized, byte-mapped when byte-level, and
 * each piece through BPE. */
static mkv_status_t encode_text(const mkv_tokenizer_t *tok, const char *s, size_t n,
                                bpe_work_t *w, ivec_t *out, char *err)
{
    mkv_pieces_t pcs = {0}, tmp = {0};
    sbuf_t mapped = {0};
    mkv_status_t st = MKV_STATUS_OK;
    if (tok->pre) {
        st = mkv_pretok_run(tok->pre, s, n, &pcs, &tmp, err);
    } else if (n > 0) { /* one piece: the whole text */
        pcs.p = malloc(sizeof *pcs.p);
        if (!pcs.p) st = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer: encoding");
        else pcs.p[pcs.n++] = (mkv_piece_t){0, n};
    }
    for (size_t k = 0; k < pcs.n && st == MKV_STATUS_OK; k++) {
        const char *p = (tok->pre ? pcs.text.p : s) + pcs.p[k].off;
        size_t len = pcs.p[k].len;
        if (tok->byte_level) {
            mapped.n = 0;
            for (size_t i = 0; i < len; i++) {
                uint8_t b = (uint8_t)p[i];
                if (sb_put(&mapped, tok->bl_char[b], tok->bl_len[b]) != 0) {
                    st = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer: encoding");
                    break;
                }
            }
            p = mapped.p;
            len = mapped.n;
        }
        if (st == MKV_STATUS_OK) st = bpe(tok, p, len, w, out, err);
    }
    mkv_pieces_free(&pcs);
    mkv_pieces_free(&tmp);
    free(mapped.p);
    return st;
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
            mkv_status_t st = encode_text(tok, s + pos, end - pos, w, out, err);
            if (st != MKV_STATUS_OK) return st;
        } else if (end > pos) {
            sbuf_t norm = {0}, tmp = {0};
            int bad = mkv_tok_normalize(tok, s + pos, end - pos, &norm, &tmp);
            mkv_status_t st =
                bad == -2 ? runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "tokenizer: the normalizer "
                                     "grows %zu bytes of text past %d x + %d bytes", end - pos,
                                     MKV_TOK_GROWTH, MKV_TOK_SLACK)
                : bad ? runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer: encoding")
                      : split(tok, 1, norm.p ? norm.p : "", norm.n, w, out, err);
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
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "tokenizer encode: null argument");
    *out = NULL;
    *n_out = 0;
    for (size_t i = 0, cl; i < len && !tok->byte_level; i += cl)
        if ((cl = utf8_len((const unsigned char *)text + i, len - i)) == 0)
            return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                            "tokenizer encode: invalid UTF-8 at byte %zu", i);
    ivec_t ids = {0};
    bpe_work_t w = {0};
    int bos = add_bos && tok->bos >= 0;
    mkv_status_t status = iv_push(&ids, tok->bos) != 0
                              ? runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer: encoding")
                              : split(tok, 0, text ? text : "", len, &w, &ids, err);
    free(w.c);
    free(w.prev);
    free(w.next);
    free(w.len);
    free(w.heap);
    if (status == MKV_STATUS_OK && ids.n > INT32_MAX)
        status = runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "tokenizer encode: text too long");
    if (status != MKV_STATUS_OK) {
        free(ids.p);
        return status;
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
                int bad = replace_all(t[i].p, t[i].n, st->a, st->b, &r, SIZE_MAX);
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
                if (i < *n && t[i].n == 6 && memcmp(p, "<0x", 3) == 0 &&
                    isxdigit((uint8_t)p[3]) && isxdigit((uint8_t)p[4]) && p[5] == '>') {
                    char c = (char)strtol(p + 3, NULL, 16);
                    free(t[i].p);
                    t[i] = (sbuf_t){0};
                    if (sb_put(&bytes, &c, 1) != 0) return -1;
                    continue;
                }
                if (bytes.n > 0) {
                    size_t ok = 0, cl;
                    while (ok < bytes.n &&
                           (cl = utf8_len((unsigned char *)bytes.p + ok, bytes.n - ok)) > 0)
                        ok += cl;
                    int whole = ok == bytes.n || stream;
                    for (size_t b = 0; b < (whole ? 1 : bytes.n); b++) {
                        sbuf_t r = {0};
                        int bad = whole ? sb_put(&r, bytes.p, bytes.n)
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
        } else if (st->kind == STEP_BYTE_LEVEL) {
            /* HF: all tokens' bytes joined, then from_utf8_lossy; a stream keeps raw bytes so
             * that a character split over tokens is whole again once concatenated. */
            sbuf_t bytes = {0}, r = {0};
            for (size_t i = 0; i < *n; i++) {
                if (mkv_tok_byte_level_bytes(tok, t[i].p, t[i].n, &bytes) != 0) goto bl_oom;
                free(t[i].p);
                t[i] = (sbuf_t){0};
            }
            if (stream ? sb_put(&r, bytes.p ? bytes.p : "", bytes.n) != 0
                       : mkv_tok_utf8_lossy(bytes.p ? bytes.p : "", bytes.n, &r) != 0)
                goto bl_oom;
            free(bytes.p);
            t[0] = r;
            *n = 1;
            fused = 1;
            continue;
        bl_oom:
            free(bytes.p);
            free(r.p);
            return -1;
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
                const char *p = t[i].p;
                size_t lo = 0, hi = t[i].n;
                for (int c = 0; c < st->start && hi - lo >= cl && !memcmp(p + lo, st->a, cl); c++)
                    lo += cl;
                for (int c = 0; c < st->stop && hi - lo >= cl; c++, hi -= cl)
                    if (memcmp(p + hi - cl, st->a, cl) != 0) break;
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
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "tokenizer decode: bad argument");
    *out = NULL;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->n_vocab || !tok->text[ids[i]])
            return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                            "tokenizer decode: id %d at %d is not in the vocabulary", ids[i], i);
    size_t m = 0;
    sbuf_t *t = calloc((size_t)n + 1, sizeof *t), all = {0};
    if (!t) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer decode");
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
    status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "tokenizer decode");
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
