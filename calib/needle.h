/*
 * needle.h — needle-in-a-haystack retrieval trials: a short fact (a secret number) inserted
 * at a depth of long text cut to a prompt length, a question about it at the end, a greedy
 * answer, judged right when its first number is the secret. The library behind `mixkv
 * needle` (FP16 against one policy) and `mixkv calibrate --needle` (every point of a grid);
 * an engine can call it too. It sits beside calib.h, above the model runner.
 *
 * A set of trials (mkv_needle_t) is planned once: for each length, depth and trial, in that
 * order, a secret and a stretch of the haystack drawn from the seed, and the prompt built
 * from them. Running a trial takes a cache made for the policy under test
 * (mkv_policy_make_cache), so the same prompts go through every policy.
 *
 * The prompt. The haystack's tokens from the trial's stretch are cut so that the whole prompt
 * is close to (never above) the length; the sentence " The secret number is N. Remember it:
 * N. " is inserted after the first sentence end at or after depth x the cut haystack (looking
 * at most 64 tokens ahead), and a question ends it. With a chat template (runner/chat.h) the
 * text is one user message; without one (or with `plain`) it is plain text ending in
 * "Answer: The secret number is", BOS first where the tokenizer adds one. The whole prompt
 * goes through the prompt phase, so a trial tests whether the prompt-phase policy keeps the
 * tokens that matter far back.
 *
 * Thread safety: a set is read-only after mkv_needle_create; trials of one set may run from
 * several threads at once, each with its own cache, workspace and logits.
 */
#ifndef MKV_CALIB_NEEDLE_H
#define MKV_CALIB_NEEDLE_H

#include "runner/chat.h"
#include "runner/model.h"
#include "runner/tokenizer.h"
#include "mixkv.h"

#include <stddef.h>
#include <stdint.h>

#define MKV_NEEDLE_MAX_GRID 32  /* lengths, and depths, of one set */
#define MKV_NEEDLE_MAX_NEW 256  /* answer tokens at most */

typedef struct mkv_needle_opts {
    int32_t lengths[MKV_NEEDLE_MAX_GRID]; /* prompt lengths in tokens, >= 1 */
    int32_t n_lengths;                    /* 1 .. MKV_NEEDLE_MAX_GRID */
    double depths[MKV_NEEDLE_MAX_GRID];   /* needle depths, fractions of the haystack in [0, 1] */
    int32_t n_depths;                     /* 1 .. MKV_NEEDLE_MAX_GRID */
    int32_t trials;                       /* per length and depth, >= 1 */
    int32_t max_new;                      /* answer tokens at most, 1 .. MKV_NEEDLE_MAX_NEW */
    int64_t seed;                         /* of the secrets and the stretches, >= 0 */
    int plain;                            /* no chat template, even where the tokenizer has one */
} mkv_needle_opts_t;

/* `mixkv needle`'s defaults. */
#define MKV_NEEDLE_OPTS_INIT {{1024, 2048, 4096}, 3, {0.0, 0.25, 0.5, 0.75, 1.0}, 5, 2, 24, 1, 0}

typedef struct mkv_needle_trial {
    int32_t length;       /* the prompt length asked for */
    double depth;
    long secret;          /* 10000 .. 99999 */
    int64_t start;        /* the stretch's first haystack token */
    const int32_t *prompt;/* [n_prompt] token ids (the set's) */
    int32_t n_prompt;     /* at most length */
} mkv_needle_trial_t;

/* One trial through one cache. */
typedef struct mkv_needle_result {
    int32_t answer[MKV_NEEDLE_MAX_NEW]; /* [n_answer] the greedy answer's tokens */
    int32_t n_answer;     /* stops at EOS, the template's end token or max_new */
    int right;            /* the answer's first number is the secret */
    double memory_ratio;  /* the cache's bytes in use / a plain FP16 cache's, at the answer's end */
} mkv_needle_result_t;

typedef struct mkv_needle mkv_needle_t; /* opaque: the planned trials and their prompts */

/* The chat template the prompts use: the tokenizer's (mkv_chat_detect), MKV_CHAT_NONE when
 * plain. */
mkv_chat_template_t mkv_needle_chat(const mkv_tokenizer_t *tok, int plain);

/* Plans the trials on the haystack's tokens hay[n_hay] (read during the call only) and builds
 * their prompts with tok (which must outlive the set). INVALID_ARGUMENT, with a message in
 * mkv_last_error(), when an option is out of range, the haystack holds fewer tokens than the
 * longest length, or a prompt cannot hold the question. */
mkv_status_t mkv_needle_create(const mkv_tokenizer_t *tok, const int32_t *hay, int64_t n_hay,
                               const mkv_needle_opts_t *o, mkv_needle_t **out);
void mkv_needle_free(mkv_needle_t *nd);

const mkv_needle_opts_t *mkv_needle_options(const mkv_needle_t *nd);
int32_t mkv_needle_count(const mkv_needle_t *nd);       /* lengths x depths x trials */
int32_t mkv_needle_longest(const mkv_needle_t *nd);     /* the longest prompt, tokens */
mkv_chat_template_t mkv_needle_template(const mkv_needle_t *nd);
/* Trial i, 0 <= i < count: index (length * n_depths + depth) * trials + trial. */
const mkv_needle_trial_t *mkv_needle_trial(const mkv_needle_t *nd, int32_t i);

/* Trial i of nd through forward pass fw (either backend; its max_tokens covers the prompt)
 * and cache (a free slot of n_prompt + max_new tokens, released again before returning): the
 * prompt phase, then greedy decoding until eos (the model's; -1: none), the template's end
 * token or max_new tokens. logits: [vocab] scratch. text: NULL, or the answer decoded (special
 * tokens skipped; malloc'ed, the caller frees it). The library's status and message on
 * failure. */
mkv_status_t mkv_needle_run(const mkv_needle_t *nd, int32_t i, const mkv_forward_t *fw, int32_t eos,
                            mkv_cache_t *cache, float *logits, mkv_needle_result_t *r, char **text);

/* 1 when two results answered with the same tokens. */
int mkv_needle_same_answer(const mkv_needle_result_t *a, const mkv_needle_result_t *b);

/* The first run of decimal digits in text as a number (at most 12 digits read); -1 when
 * there is none. */
long mkv_needle_first_number(const char *text);

/* The judge: 1 when the answer's first number is the secret. */
int mkv_needle_judge(const char *answer, long secret);

#endif /* MKV_CALIB_NEEDLE_H */
