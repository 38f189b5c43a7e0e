/*
 * pretok.c — the pre-tokenizers of pretok.h with PCRE2, following Hugging Face `tokenizers`
 * (pre_tokenizers/split.rs, digits.rs, byte_level.rs and NormalizedString::split): a step
 * finds the matches of its pattern in each piece, turns the piece into alternating
 * match / non-match segments, applies `invert` and the split behaviour, and drops empty
 * pieces. The regexes of the real models (GPT-2, Llama 3, Qwen2) are written for Oniguruma,
 * which HF uses; PCRE2 reads the same syntax ((?i:...), \p{L}, \p{N}, (?!\S)) with the same
 * leftmost-first alternation, and its UTF + UCP mode gives \s, \p{..} their Unicode meaning.
 */
#include "runner/pretok.h"

#include "runner/error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdio.h>
#include <string.h>

/* GPT-2's pattern, which ByteLevel(use_regex) splits with. */
#define RE_GPT2                                                                                \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* Llama 3's Split pattern (tokenizer.json of Meta-Llama-3 and 3.x). */
#define RE_LLAMA3                                                                              \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen2's: Llama 3's with single digits. */
#define RE_QWEN2                                                                               \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"    \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* HF's SplitDelimiterBehavior. */
enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };
static const char *const behavior_names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                             "MergedWithNext", "Contiguous"};

enum { PT_SPLIT, PT_PREFIX_SPACE };

typedef struct pt_step {
    int kind;
    pcre2_code *re; /* PT_SPLIT */
    int behavior, invert;
} pt_step_t;

struct mkv_pretok {
    pt_step_t *steps; /* [n] */
    int n;
};

typedef struct seg {
    size_t s, e;
    int match;
} seg_t;

void mkv_pretok_free(mkv_pretok_t *pt)
{
    if (!pt) return;
    for (int i = 0; i < pt->n; i++) pcre2_code_free(pt->steps[i].re);
    free(pt->steps);
    free(pt);
}

void mkv_pieces_free(mkv_pieces_t *p)
{
    free(p->text.p);
    free(p->p);
    *p = (mkv_pieces_t){0};
}

static mkv_status_t add_step(mkv_pretok_t *pt, pt_step_t s, char *err)
{
    pt_step_t *p = realloc(pt->steps, (size_t)(pt->n + 1) * sizeof *p);
    if (!p) {
        pcre2_code_free(s.re);
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "pre-tokenizer");
    }
    p[pt->n++] = s;
    pt->steps = p;
    return MKV_STATUS_OK;
}

/* Compiles pattern (a regex, or a literal when literal) for a Split step. */
static mkv_status_t add_split(mkv_pretok_t *pt, const char *pattern, int literal, int behavior,
                              int invert, char *err)
{
    int code;
    PCRE2_SIZE at;
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &code, &at,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "pre-tokenizer regex '%s': %s at offset %zu",
                        pattern, (const char *)msg, (size_t)at);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: the interpreter is the fallback */
    return add_step(pt, (pt_step_t){.kind = PT_SPLIT, .re = re, .behavior = behavior,
                                    .invert = invert}, err);
}

static mkv_status_t add_byte_level(mkv_pretok_t *pt, int prefix_space, int use_regex, char *err)
{
    if (prefix_space) {
        mkv_status_t st = add_step(pt, (pt_step_t){.kind = PT_PREFIX_SPACE}, err);
        if (st != MKV_STATUS_OK) return st;
    }
    return use_regex ? add_split(pt, RE_GPT2, 0, B_ISOLATED, 0, err) : MKV_STATUS_OK;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *k, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static mkv_status_t load_node(mkv_pretok_t *pt, const cJSON *n, int *byte_level, char *err)
{
    const char *type = jstr(n, "type");
    if (!type) return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: untyped pre_tokenizer");
    if (*byte_level)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.json: pre_tokenizer '%s' after "
                        "ByteLevel is not supported (ByteLevel must come last)", type);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *item, *list = cJSON_GetObjectItemCaseSensitive(n, "pretokenizers");
        if (!cJSON_IsArray(list))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed Sequence");
        cJSON_ArrayForEach(item, list) {
            mkv_status_t st = load_node(pt, item, byte_level, err);
            if (st != MKV_STATUS_OK) return st;
        }
        return MKV_STATUS_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        *byte_level = 1;
        return add_byte_level(pt, jbool(n, "add_prefix_space", 1), jbool(n, "use_regex", 1), err);
    }
    if (strcmp(type, "Digits") == 0)
        return add_split(pt, jbool(n, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+", 0,
                         B_ISOLATED, 0, err);
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String"), *b = jstr(n, "behavior");
        int behavior = -1;
        for (int i = 0; b && i < 5; i++)
            if (strcmp(b, behavior_names[i]) == 0) behavior = i;
        if ((!re && !lit) || (lit && !lit[0]) || !b)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tokenizer.json: malformed Split");
        if (behavior < 0)
            return runner_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.json: Split behavior '%s' "
                            "is not supported", b);
        return add_split(pt, re ? re : lit, !re, behavior, jbool(n, "invert", 0), err);
    }
    return runner_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.json: pre_tokenizer '%s' is not "
                    "supported (only Sequence, Split, Digits, ByteLevel)", type);
}

mkv_status_t mkv_pretok_from_json(const cJSON *node, mkv_pretok_t **out, int *byte_level,
                                  char *err)
{
    mkv_pretok_t *pt = calloc(1, sizeof *pt);
    *out = NULL;
    *byte_level = 0;
    if (!pt) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "pre-tokenizer");
    mkv_status_t st = load_node(pt, node, byte_level, err);
    if (st != MKV_STATUS_OK) {
        mkv_pretok_free(pt);
        return st;
    }
    *out = pt;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_pretok_from_name(const char *pre, mkv_pretok_t **out, int *nfc, char *err)
{
    mkv_status_t st;
    mkv_pretok_t *pt = calloc(1, sizeof *pt);
    *out = NULL;
    *nfc = 0;
    if (!pt) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "pre-tokenizer");
    if (!pre) pre = "default";
    /* Each name gets the pre_tokenizer of its models' tokenizer.json. "default" (a GGUF
     * written without a known pre-tokenizer) is taken as plain GPT-2 ByteLevel. */
    if (strcmp(pre, "gpt2") == 0 || strcmp(pre, "default") == 0) {
        st = add_byte_level(pt, 0, 1, err);
    } else if (strcmp(pre, "smollm") == 0) {
        st = add_split(pt, "\\p{N}", 0, B_ISOLATED, 0, err); /* Digits(individual_digits) */
        if (st == MKV_STATUS_OK) st = add_byte_level(pt, 0, 1, err);
    } else if (strcmp(pre, "llama-bpe") == 0 || strcmp(pre, "qwen2") == 0) {
        st = add_split(pt, pre[0] == 'q' ? RE_QWEN2 : RE_LLAMA3, 0, B_ISOLATED, 0, err);
        *nfc = pre[0] == 'q';
    } else {
        st = runner_fail(err, MKV_STATUS_UNSUPPORTED, "tokenizer.ggml.pre '%s' is not supported "
                      "(only gpt2, default, smollm, llama-bpe, qwen2)", pre);
    }
    if (st != MKV_STATUS_OK) {
        mkv_pretok_free(pt);
        return st;
    }
    *out = pt;
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Running                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static int put_piece(mkv_pieces_t *o, const char *s, size_t n, int prefix_space)
{
    if (n == 0) return 0;
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        mkv_piece_t *p = realloc(o->p, cap * sizeof *p);
        if (!p) return -1;
        o->p = p;
        o->cap = cap;
    }
    size_t off = o->text.n;
    if ((prefix_space && sb_put(&o->text, " ", 1) != 0) || sb_put(&o->text, s, n) != 0) return -1;
    o->p[o->n++] = (mkv_piece_t){off, o->text.n - off};
    return 0;
}

static int push_seg(seg_t **v, size_t *n, size_t *cap, seg_t s)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        seg_t *p = realloc(*v, c * sizeof *p);
        if (!p) return -1;
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = s;
    return 0;
}

/* The match / non-match segments of s[0..n) for re (HF's find_matches): empty matches are
 * skipped (none of the supported patterns has one). Returns -1 on error, with err set. */
static int find_segments(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n,
                         seg_t **v, size_t *nv, size_t *cap, char *err)
{
    size_t pos = 0, prev = 0;
    *nv = 0;
    while (pos < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "pre-tokenizer: %s", (const char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step over one character (or one ill-formed byte) */
            size_t cl = utf8_len((const unsigned char *)s + me, n - me);
            pos = me + (cl ? cl : 1);
            continue;
        }
        if ((ms > prev && push_seg(v, nv, cap, (seg_t){prev, ms, 0}) != 0) ||
            push_seg(v, nv, cap, (seg_t){ms, me, 1}) != 0)
            goto oom;
        pos = prev = me;
    }
    if (prev < n && push_seg(v, nv, cap, (seg_t){prev, n, 0}) != 0) goto oom;
    return 0;
oom:
    runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "pre-tokenizer");
    return -1;
}

/* Applies the behaviour (HF's NormalizedString::split) to the segments of one piece; the
 * resulting ranges overwrite v, *nv updated. */
static void apply_behavior(int behavior, seg_t *v, size_t *nv)
{
    size_t m = 0, pending = SIZE_MAX; /* m <= i: v is rewritten behind the reader */
    int prev_match = 0;               /* HF's previous_match, false before the first */
    for (size_t i = 0; i < *nv; i++) {
        seg_t g = v[i];
        int extend = 0;
        switch (behavior) {
        case B_REMOVED:
            if (g.match) goto next;
            break;
        case B_MERGED_PREV: /* a match joins the piece before it, unless that was a match */
            extend = g.match && !prev_match;
            break;
        case B_MERGED_NEXT: /* a match joins the piece after it, unless that is a match */
            if (g.match && i + 1 < *nv && !v[i + 1].match) {
                pending = g.s;
                goto next;
            }
            if (pending != SIZE_MAX) g.s = pending;
            pending = SIZE_MAX;
            break;
        case B_CONTIGUOUS: /* runs of segments of one kind become one piece */
            extend = g.match == prev_match;
            break;
        default: /* B_ISOLATED */
            break;
        }
        if (extend && m > 0)
            v[m - 1].e = g.e;
        else
            v[m++] = g;
    next:
        prev_match = g.match;
    }
    *nv = m;
}

static mkv_status_t run_split(const pt_step_t *st, const mkv_pieces_t *in, mkv_pieces_t *out,
                              char *err)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(st->re, NULL);
    seg_t *v = NULL;
    size_t nv = 0, cap = 0;
    mkv_status_t status = MKV_STATUS_OK;
    if (!md) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "pre-tokenizer");
    for (size_t k = 0; k < in->n; k++) {
        const char *s = in->text.p + in->p[k].off;
        if (find_segments(st->re, md, s, in->p[k].len, &v, &nv, &cap, err) != 0) {
            status = MKV_STATUS_INVALID_ARGUMENT;
            break;
        }
        for (size_t i = 0; st->invert && i < nv; i++) v[i].match = !v[i].match;
        apply_behavior(st->behavior, v, &nv);
        for (size_t i = 0; i < nv; i++)
            if (put_piece(out, s + v[i].s, v[i].e - v[i].s, 0) != 0) {
                status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "pre-tokenizer");
                break;
            }
        if (status != MKV_STATUS_OK) break;
    }
    free(v);
    pcre2_match_data_free(md);
    return status;
}

mkv_status_t mkv_pretok_run(const mkv_pretok_t *pt, const char *s, size_t n, mkv_pieces_t *out,
                            mkv_pieces_t *tmp, char *err)
{
    out->n = out->text.n = 0;
    if (put_piece(out, s, n, 0) != 0)
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "pre-tokenizer");
    for (int i = 0; i < pt->n; i++) {
        const pt_step_t *st = &pt->steps[i];
        mkv_status_t status = MKV_STATUS_OK;
        tmp->n = tmp->text.n = 0;
        if (st->kind == PT_SPLIT) {
            status = run_split(st, out, tmp, err);
        } else { /* PT_PREFIX_SPACE: HF prepends " " to every piece not starting with one */
            for (size_t k = 0; k < out->n && status == MKV_STATUS_OK; k++) {
                const char *p = out->text.p + out->p[k].off;
                if (put_piece(tmp, p, out->p[k].len, p[0] != ' ') != 0)
                    status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "pre-tokenizer");
            }
        }
        if (status != MKV_STATUS_OK) return status;
        /* A step keeps or drops bytes and adds at most one space per piece: a text can at
         * most double here. Anything more is a bug, refused rather than allocated. */
        if (tmp->text.n > 2 * n + 16)
            return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "pre-tokenizer: %zu input bytes "
                            "grew to %zu (limit 2x + 16)", n, tmp->text.n);
        mkv_pieces_t t = *out;
        *out = *tmp;
        *tmp = t;
    }
    return MKV_STATUS_OK;
}
