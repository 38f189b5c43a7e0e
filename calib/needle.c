/*
 * needle.c — needle-in-a-haystack trials: planning, prompts, greedy answers, the judge (see
 * needle.h). The draws (a 64-bit LCG from the seed, one step per trial) and the prompt's
 * construction are those `mixkv needle` has always made, so its results do not move.
 */
#include "calib/needle.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mkv_needle {
    const mkv_tokenizer_t *tok;
    mkv_needle_opts_t o;
    mkv_chat_template_t chat;
    int32_t end_token;        /* the template's end of turn, or -1 */
    mkv_needle_trial_t *trial;/* [n] */
    int32_t n;
    int32_t longest;          /* the longest prompt, tokens */
};

mkv_chat_template_t mkv_needle_chat(const mkv_tokenizer_t *tok, int plain)
{
    return plain ? MKV_CHAT_NONE : mkv_chat_detect(tok);
}

/* Encodes a user message: the chat template, or plain text with BOS where the tokenizer adds
 * one (a tokenizer.json tokenizer does not say: BOS, as the tools do). */
static mkv_status_t encode_message(const mkv_needle_t *nd, const char *msg, int32_t **ids,
                                   int32_t *n, char *err)
{
    if (nd->chat != MKV_CHAT_NONE) return mkv_chat_encode(nd->tok, nd->chat, msg, ids, n, err);
    const int bos = mkv_tokenizer_add_bos(nd->tok);
    return mkv_tokenizer_encode(nd->tok, msg, strlen(msg), bos >= 0 ? bos : 1, ids, n, err);
}

/* The prompt of one trial from the haystack tokens hay[0 .. n_hay): hay[0 .. H) with the
 * needle sentence inserted after the first sentence end at or after depth * H, then the
 * question; H shrunk until the whole prompt fits `length` tokens. */
static mkv_status_t build_prompt(const mkv_needle_t *nd, const int32_t *hay, int64_t n_hay,
                                 int32_t length, double depth, long secret, int32_t **ids,
                                 int32_t *n, char *err)
{
    char needle[128], question[256];
    snprintf(needle, sizeof needle, " The secret number is %ld. Remember it: %ld. ", secret, secret);
    snprintf(question, sizeof question,
             nd->chat != MKV_CHAT_NONE
                 ? "\n\nWhat is the secret number mentioned in the text above? Answer with the number only."
                 : "\n\nQuestion: What is the secret number mentioned in the text above?\nAnswer: "
                   "The secret number is");
    int64_t H = length; /* shrunk until the prompt fits */
    char *text = NULL;
    mkv_status_t st = MKV_STATUS_OK;
    for (int attempt = 0; attempt < 8; attempt++) {
        if (H > n_hay) H = n_hay;
        int64_t cut = (int64_t)llround(depth * (double)H);
        /* Move the cut to just after a sentence end, looking at most 64 tokens ahead. */
        for (int64_t k = cut; k < H && k < cut + 64; k++) {
            char piece[256];
            mkv_tokenizer_piece(nd->tok, k > 0 ? hay[k - 1] : -1, hay[k], piece, sizeof piece);
            if (strpbrk(piece, ".\n")) {
                cut = k + 1;
                break;
            }
        }
        char *a = NULL, *b = NULL;
        if ((st = mkv_tokenizer_decode(nd->tok, hay, (int32_t)cut, 1, &a, err)) != MKV_STATUS_OK ||
            (st = mkv_tokenizer_decode(nd->tok, hay + cut, (int32_t)(H - cut), 1, &b, err)) != MKV_STATUS_OK) {
            free(a);
            free(text);
            return st;
        }
        const size_t len = strlen(a) + strlen(needle) + strlen(b) + strlen(question) + 1;
        free(text);
        text = malloc(len);
        if (!text) {
            free(a);
            free(b);
            snprintf(err, MKV_ERR_LEN, "out of memory");
            return MKV_STATUS_OUT_OF_MEMORY;
        }
        snprintf(text, len, "%s%s%s%s", a, needle, b, question);
        free(a);
        free(b);
        free(*ids);
        *ids = NULL;
        if ((st = encode_message(nd, text, ids, n, err)) != MKV_STATUS_OK) break;
        if (*n <= length) break;
        H -= (*n - length) + 8; /* re-encoding can merge or split tokens at the joins */
        if (H < 1) {
            snprintf(err, MKV_ERR_LEN, "a prompt of %d tokens cannot hold the question", length);
            st = MKV_STATUS_INVALID_ARGUMENT;
            break;
        }
    }
    free(text);
    if (st == MKV_STATUS_OK && *n > length) {
        snprintf(err, MKV_ERR_LEN, "could not fit the prompt into %d tokens", length);
        st = MKV_STATUS_INVALID_ARGUMENT;
    }
    return st;
}

void mkv_needle_free(mkv_needle_t *nd)
{
    if (!nd) return;
    for (int32_t i = 0; nd->trial && i < nd->n; i++) free((void *)nd->trial[i].prompt);
    free(nd->trial);
    free(nd);
}

mkv_status_t mkv_needle_create(const mkv_tokenizer_t *tok, const int32_t *hay, int64_t n_hay,
                               const mkv_needle_opts_t *o, mkv_needle_t **out)
{
    *out = NULL;
    if (!tok || !hay || !o)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "mkv_needle_create: null argument");
    int ok = o->n_lengths >= 1 && o->n_lengths <= MKV_NEEDLE_MAX_GRID && o->n_depths >= 1 &&
             o->n_depths <= MKV_NEEDLE_MAX_GRID && o->trials >= 1 && o->max_new >= 1 &&
             o->max_new <= MKV_NEEDLE_MAX_NEW && o->seed >= 0;
    int32_t longest = 0;
    for (int32_t k = 0; ok && k < o->n_lengths; k++) {
        ok = o->lengths[k] >= 1;
        longest = o->lengths[k] > longest ? o->lengths[k] : longest;
    }
    for (int32_t k = 0; ok && k < o->n_depths; k++) ok = o->depths[k] >= 0.0 && o->depths[k] <= 1.0;
    if (!ok)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                "needle options out of range (1 to %d lengths >= 1, 1 to %d depths in "
                                "[0, 1], trials >= 1, answer tokens 1 to %d, seed >= 0)",
                                MKV_NEEDLE_MAX_GRID, MKV_NEEDLE_MAX_GRID, MKV_NEEDLE_MAX_NEW);
    if (n_hay < longest)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                "the haystack has %lld tokens, fewer than the longest length's %d",
                                (long long)n_hay, longest);
    mkv_needle_t *nd = calloc(1, sizeof *nd);
    const int32_t n = o->n_lengths * o->n_depths * o->trials;
    if (!nd || !(nd->trial = calloc((size_t)n, sizeof *nd->trial))) {
        free(nd);
        return mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "out of memory planning %d needle trials", n);
    }
    nd->tok = tok;
    nd->o = *o;
    nd->n = n;
    nd->chat = mkv_needle_chat(tok, o->plain);
    nd->end_token = mkv_chat_end_token(tok, nd->chat);
    uint64_t rng = (uint64_t)o->seed * 0x9E3779B97F4A7C15ull + 1;
    int32_t i = 0;
    for (int32_t li = 0; li < o->n_lengths; li++)
        for (int32_t di = 0; di < o->n_depths; di++)
            for (int32_t t = 0; t < o->trials; t++, i++) {
                mkv_needle_trial_t *tr = &nd->trial[i];
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                tr->length = o->lengths[li];
                tr->depth = o->depths[di];
                tr->secret = 10000 + (long)((rng >> 33) % 90000);
                /* Each trial reads a different stretch of the haystack. */
                const int64_t span = n_hay - tr->length;
                tr->start = span > 0 ? (int64_t)((rng >> 17) % (uint64_t)(span + 1)) : 0;
                int32_t *ids = NULL;
                char err[MKV_ERR_LEN];
                const mkv_status_t st = build_prompt(nd, hay + tr->start, n_hay - tr->start, tr->length,
                                                     tr->depth, tr->secret, &ids, &tr->n_prompt, err);
                tr->prompt = ids;
                if (st != MKV_STATUS_OK) {
                    mkv_needle_free(nd);
                    return mkv_report_error(st, "%s", err);
                }
                nd->longest = tr->n_prompt > nd->longest ? tr->n_prompt : nd->longest;
            }
    *out = nd;
    return MKV_STATUS_OK;
}

const mkv_needle_opts_t *mkv_needle_options(const mkv_needle_t *nd) { return &nd->o; }
int32_t mkv_needle_count(const mkv_needle_t *nd) { return nd->n; }
int32_t mkv_needle_longest(const mkv_needle_t *nd) { return nd->longest; }
mkv_chat_template_t mkv_needle_template(const mkv_needle_t *nd) { return nd->chat; }

const mkv_needle_trial_t *mkv_needle_trial(const mkv_needle_t *nd, int32_t i)
{
    return i >= 0 && i < nd->n ? &nd->trial[i] : NULL;
}

mkv_status_t mkv_needle_run(const mkv_needle_t *nd, int32_t i, const mkv_forward_t *fw, int32_t eos,
                            mkv_cache_t *cache, float *logits, mkv_needle_result_t *r, char **text)
{
    const mkv_needle_trial_t *tr = mkv_needle_trial(nd, i);
    if (!tr) return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "needle trial %d of %d", i, nd->n);
    if (text) *text = NULL;
    memset(r, 0, sizeof *r);
    const int32_t V = fw->vocab;
    int32_t slot;
    mkv_status_t st = mkv_cache_admit(cache, tr->n_prompt, &slot);
    if (st != MKV_STATUS_OK) return mkv_report_error(st, "%s", mkv_cache_last_error(cache));
    if ((st = fw->prefill(fw->ctx, cache, slot, tr->prompt, tr->n_prompt, NULL, logits)) != MKV_STATUS_OK)
        return st;
    for (;;) {
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        if (best == eos || best == nd->end_token) break;
        r->answer[r->n_answer++] = best;
        if (r->n_answer == nd->o.max_new) break;
        const int32_t in = best;
        if ((st = fw->decode(fw->ctx, cache, 1, &slot, &in, logits)) != MKV_STATUS_OK) return st;
    }
    mkv_cache_stats_t cs;
    mkv_cache_stats(cache, &cs);
    r->memory_ratio = (double)cs.bytes_in_use / (double)cs.bytes_fp16;
    if ((st = mkv_cache_release(cache, slot, NULL)) != MKV_STATUS_OK)
        return mkv_report_error(st, "%s", mkv_cache_last_error(cache));
    char *answer = NULL, err[MKV_ERR_LEN];
    if ((st = mkv_tokenizer_decode(nd->tok, r->answer, r->n_answer, 1, &answer, err)) != MKV_STATUS_OK)
        return mkv_report_error(st, "%s", err);
    r->right = mkv_needle_judge(answer, tr->secret);
    if (text) *text = answer;
    else free(answer);
    return MKV_STATUS_OK;
}

int mkv_needle_same_answer(const mkv_needle_result_t *a, const mkv_needle_result_t *b)
{
    return a->n_answer == b->n_answer && !memcmp(a->answer, b->answer, (size_t)a->n_answer * sizeof *a->answer);
}

long mkv_needle_first_number(const char *text)
{
    while (*text && !isdigit((unsigned char)*text)) text++;
    if (!*text) return -1;
    long v = 0;
    for (int k = 0; isdigit((unsigned char)*text) && k < 12; text++, k++) v = 10 * v + (*text - '0');
    return v;
}

int mkv_needle_judge(const char *answer, long secret)
{
    return mkv_needle_first_number(answer) == secret;
}
