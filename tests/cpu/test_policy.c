/*
 * test_policy.c — the compression policy (engine/policy.h): every branch of Algorithm 1 on
 * hand-built scores, threshold equality, tie-breaking and window edges; prompt classification;
 * the budget rule; and a randomised differential test of mkv_policy_decide and
 * mkv_policy_budget against a deliberately simple model below (sorted copies), over states
 * whose scores are drawn from a small set so that ties are common.
 */
#include "engine/policy.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef mkv_policy_token_t tok_t;
typedef mkv_policy_decision_t dec_t;

#define ARRAY_LEN(a) ((int32_t)(sizeof(a) / sizeof((a)[0])))

static dec_t decide(const tok_t *hi, int32_t n_hi, const tok_t *lo, int32_t n_lo, int32_t N,
                    float ah, float al, int32_t W)
{
    return mkv_policy_decide(hi, n_hi, lo, n_lo, N, ah, al, W);
}

static void expect_dec(dec_t d, mkv_policy_action_t act, int32_t cand, int32_t victim)
{
    cr_assert_eq(d.action, act, "action %d, want %d", (int)d.action, (int)act);
    cr_assert_eq(d.cand, cand, "cand %d, want %d", d.cand, cand);
    cr_assert_eq(d.victim, victim, "victim %d, want %d", d.victim, victim);
}

/* ---------------------------------------------------------------------------------------- */
/* Algorithm 1, one branch at a time                                                        */
/* ---------------------------------------------------------------------------------------- */

/* N = 10, W = 2: the window is positions 8 and 9, t_c is position 7. alpha_h = 1 and
 * alpha_l = 0.5 give th_h = 0.1f and th_l = 0.05f. Sections are deliberately not in position
 * order (the backend swap-removes). */
enum { N10 = 10, W2 = 2 };
static const float AH = 1.0f, AL = 0.5f;

Test(policy, keep)
{
    const tok_t hi[] = {{0.9f, 9}, {0.3f, 3}, {0.2f, 7}, {0.15f, 0}, {0.5f, 8}};
    const tok_t lo[] = {{0.01f, 1}};
    /* t_c (index 2) stays; the weakest high token outside the window is pos 0 (0.15 >= th_h). */
    expect_dec(decide(hi, ARRAY_LEN(hi), lo, ARRAY_LEN(lo), N10, AH, AL, W2), MKV_ACT_KEEP, 2, 3);
}

Test(policy, keep_victim_is_candidate)
{
    const tok_t hi[] = {{0.9f, 9}, {0.3f, 3}, {0.12f, 7}, {0.5f, 8}};
    expect_dec(decide(hi, ARRAY_LEN(hi), NULL, 0, N10, AH, AL, W2), MKV_ACT_KEEP, 2, -1);
}

Test(policy, demote_victim)
{
    const tok_t hi[] = {{0.9f, 9}, {0.07f, 3}, {0.2f, 7}, {0.08f, 0}, {0.5f, 8}};
    const tok_t lo[] = {{0.001f, 1}};
    expect_dec(decide(hi, ARRAY_LEN(hi), lo, ARRAY_LEN(lo), N10, AH, AL, W2),
               MKV_ACT_DEMOTE_VICTIM, 2, 1);
}

Test(policy, prune_victim)
{
    const tok_t hi[] = {{0.9f, 9}, {0.07f, 3}, {0.2f, 7}, {0.04f, 5}, {0.5f, 8}};
    expect_dec(decide(hi, ARRAY_LEN(hi), NULL, 0, N10, AH, AL, W2), MKV_ACT_PRUNE_VICTIM, 2, 3);
}

Test(policy, demote_cand_low_victim_kept)
{
    const tok_t hi[] = {{0.9f, 9}, {0.5f, 8}, {0.08f, 7}, {0.01f, 2}};
    const tok_t lo[] = {{0.07f, 1}, {0.06f, 4}, {0.065f, 0}};
    /* The weakest low token (pos 4, 0.06) is above th_l: kept and reported. The weak high token
     * at pos 2 plays no part in this branch. */
    expect_dec(decide(hi, ARRAY_LEN(hi), lo, ARRAY_LEN(lo), N10, AH, AL, W2), MKV_ACT_DEMOTE_CAND,
               2, 1);
}

Test(policy, demote_cand_victim_is_candidate)
{
    const tok_t hi[] = {{0.9f, 9}, {0.5f, 8}, {0.06f, 7}};
    const tok_t lo[] = {{0.07f, 1}, {0.08f, 4}};
    expect_dec(decide(hi, ARRAY_LEN(hi), lo, ARRAY_LEN(lo), N10, AH, AL, W2), MKV_ACT_DEMOTE_CAND,
               2, -1);
    /* An empty low section: t_c is the only candidate victim. */
    expect_dec(decide(hi, ARRAY_LEN(hi), NULL, 0, N10, AH, AL, W2), MKV_ACT_DEMOTE_CAND, 2, -1);
}

Test(policy, demote_cand_prune_low)
{
    const tok_t hi[] = {{0.9f, 9}, {0.5f, 8}, {0.06f, 7}};
    const tok_t lo[] = {{0.07f, 1}, {0.03f, 4}, {0.02f, 5}, {0.08f, 0}};
    expect_dec(decide(hi, ARRAY_LEN(hi), lo, ARRAY_LEN(lo), N10, AH, AL, W2),
               MKV_ACT_DEMOTE_CAND_PRUNE_LOW, 2, 2);
}

Test(policy, prune_cand)
{
    const tok_t hi[] = {{0.9f, 9}, {0.5f, 8}, {0.001f, 0}, {0.04f, 7}};
    const tok_t lo[] = {{0.001f, 1}};
    expect_dec(decide(hi, ARRAY_LEN(hi), lo, ARRAY_LEN(lo), N10, AH, AL, W2), MKV_ACT_PRUNE_CAND,
               3, -1);
}

Test(policy, none_while_window_not_full)
{
    const tok_t hi[] = {{0.0f, 0}, {0.0f, 1}};
    expect_dec(decide(hi, 2, NULL, 0, 2, AH, AL, 2), MKV_ACT_NONE, -1, -1); /* N == W */
    expect_dec(decide(hi, 1, NULL, 0, 1, AH, AL, 2), MKV_ACT_NONE, -1, -1); /* N < W */
    expect_dec(decide(NULL, 0, NULL, 0, 0, AH, AL, 0), MKV_ACT_NONE, -1, -1);
    /* N = W + 1: t_c is position 0, outside the window for the first time. */
    expect_dec(decide(hi, 2, NULL, 0, 3, AH, AL, 2), MKV_ACT_PRUNE_CAND, 0, -1);
}

Test(policy, inconsistent_without_candidate)
{
    /* Position 7 (t_c) sits in the low section or nowhere: cand = -2, nothing to do. */
    const tok_t hi[] = {{0.9f, 9}, {0.5f, 8}, {0.0f, 3}};
    const tok_t lo[] = {{0.06f, 7}};
    expect_dec(decide(hi, ARRAY_LEN(hi), lo, ARRAY_LEN(lo), N10, AH, AL, W2), MKV_ACT_NONE, -2,
               -1);
    expect_dec(decide(hi, ARRAY_LEN(hi), NULL, 0, N10, AH, AL, W2), MKV_ACT_NONE, -2, -1);
    expect_dec(decide(NULL, 0, NULL, 0, N10, AH, AL, W2), MKV_ACT_NONE, -2, -1);
}

/* ---------------------------------------------------------------------------------------- */
/* Threshold equality, ties, window edge                                                    */
/* ---------------------------------------------------------------------------------------- */

Test(policy, thresholds_equal_keep)
{
    /* N = 7 makes alpha / N inexact, so the comparison must use the same fp32 division. */
    const int32_t N = 7, W = 2; /* t_c is pos 4 */
    const float ah = 1.0f, al = 0.3f;
    const float th_h = ah / (float)N, th_l = al / (float)N;
    const float below_h = nextafterf(th_h, 0.0f), below_l = nextafterf(th_l, 0.0f);

    /* t_c exactly at th_h stays high; a victim exactly at th_h is kept. */
    tok_t hi[] = {{th_h, 1}, {1.0f, 6}, {th_h, 4}, {1.0f, 5}};
    expect_dec(decide(hi, 4, NULL, 0, N, ah, al, W), MKV_ACT_KEEP, 2, 0);
    /* One ulp below th_h: the victim is demoted. */
    hi[0].sig = below_h;
    expect_dec(decide(hi, 4, NULL, 0, N, ah, al, W), MKV_ACT_DEMOTE_VICTIM, 2, 0);
    /* Exactly at th_l: demoted, not pruned; one ulp below: pruned. */
    hi[0].sig = th_l;
    expect_dec(decide(hi, 4, NULL, 0, N, ah, al, W), MKV_ACT_DEMOTE_VICTIM, 2, 0);
    hi[0].sig = below_l;
    expect_dec(decide(hi, 4, NULL, 0, N, ah, al, W), MKV_ACT_PRUNE_VICTIM, 2, 0);

    /* t_c one ulp below th_h: demoted; a low victim exactly at th_l is kept, below is pruned. */
    hi[2].sig = below_h;
    tok_t lo[] = {{th_l, 0}, {0.5f, 2}};
    expect_dec(decide(hi, 4, lo, 2, N, ah, al, W), MKV_ACT_DEMOTE_CAND, 2, 0);
    lo[0].sig = below_l;
    expect_dec(decide(hi, 4, lo, 2, N, ah, al, W), MKV_ACT_DEMOTE_CAND_PRUNE_LOW, 2, 0);

    /* t_c exactly at th_l: demoted (and, being the weakest, it is its own victim, kept). */
    hi[2].sig = th_l;
    lo[0].sig = 0.5f;
    expect_dec(decide(hi, 4, lo, 2, N, ah, al, W), MKV_ACT_DEMOTE_CAND, 2, -1);
    /* One ulp below th_l: pruned. */
    hi[2].sig = below_l;
    expect_dec(decide(hi, 4, lo, 2, N, ah, al, W), MKV_ACT_PRUNE_CAND, 2, -1);
}

Test(policy, ties_go_to_lower_position)
{
    /* High section: three victims at 0.07, the array lists the higher positions first. */
    const tok_t hi[] = {{0.07f, 5}, {0.9f, 9}, {0.07f, 6}, {0.2f, 7}, {0.07f, 3}, {0.5f, 8}};
    expect_dec(decide(hi, ARRAY_LEN(hi), NULL, 0, N10, AH, AL, W2), MKV_ACT_DEMOTE_VICTIM, 3, 4);
    /* A tie between t_c and an older high token goes to the older one. */
    const tok_t hi2[] = {{0.2f, 7}, {0.9f, 9}, {0.2f, 4}, {0.5f, 8}, {0.3f, 1}};
    expect_dec(decide(hi2, ARRAY_LEN(hi2), NULL, 0, N10, AH, AL, W2), MKV_ACT_KEEP, 0, 2);

    /* Low section: ties among low tokens, pruned. */
    const tok_t hc[] = {{0.9f, 9}, {0.5f, 8}, {0.06f, 7}};
    const tok_t lo[] = {{0.03f, 6}, {0.03f, 2}, {0.08f, 0}, {0.03f, 4}};
    expect_dec(decide(hc, 3, lo, ARRAY_LEN(lo), N10, AH, AL, W2), MKV_ACT_DEMOTE_CAND_PRUNE_LOW,
               2, 1);
    /* A tie between t_c and a low token (lower position, as always): the low token is the
     * victim, kept because it is not below th_l. */
    const tok_t lo2[] = {{0.07f, 6}, {0.06f, 5}, {0.08f, 0}};
    expect_dec(decide(hc, 3, lo2, ARRAY_LEN(lo2), N10, AH, AL, W2), MKV_ACT_DEMOTE_CAND, 2, 1);
}

Test(policy, window_edge)
{
    /* pos N - W = 8 is inside the window and never a victim, however weak; pos 7 = t_c is the
     * newest token outside it. */
    const tok_t hi[] = {{0.0f, 8}, {0.0f, 9}, {0.12f, 7}, {0.2f, 3}};
    expect_dec(decide(hi, ARRAY_LEN(hi), NULL, 0, N10, AH, AL, W2), MKV_ACT_KEEP, 2, -1);
    const tok_t hi2[] = {{0.0f, 8}, {0.0f, 9}, {0.12f, 7}, {0.08f, 3}};
    expect_dec(decide(hi2, ARRAY_LEN(hi2), NULL, 0, N10, AH, AL, W2), MKV_ACT_DEMOTE_VICTIM, 2,
               3);
    /* W = 0: t_c is the new token itself and every token is outside. */
    const tok_t hi3[] = {{0.0f, 8}, {0.5f, 9}, {0.5f, 7}};
    expect_dec(decide(hi3, 3, NULL, 0, N10, AH, AL, 0), MKV_ACT_PRUNE_VICTIM, 1, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Prompt classification                                                                    */
/* ---------------------------------------------------------------------------------------- */

enum { P = MKV_CLASS_PRUNE, L = MKV_CLASS_LOW, H = MKV_CLASS_HIGH };

/* Classifies into a poisoned buffer with a sentinel past the end and compares. */
static void expect_classes(const float *sig, int32_t n, float ah, float al, int32_t W,
                           const uint8_t *want)
{
    uint8_t cls[64];
    cr_assert(n + 1 <= (int32_t)sizeof cls);
    memset(cls, 0xEE, sizeof cls);
    mkv_policy_classify_prompt(sig, n, ah, al, W, cls);
    for (int32_t i = 0; i < n; i++)
        cr_assert_eq(cls[i], want[i], "token %d: class %d, want %d", i, cls[i], want[i]);
    cr_assert_eq(cls[n], 0xEE, "wrote past n");
}

Test(policy, prompt_classes)
{
    /* n = 8, th_h = 1 / 8 = 0.125, th_l = 0.5 / 8 = 0.0625; window 2 covers positions 6, 7. */
    const float sig[] = {0.5f, 0.125f, 0.1f, 0.0625f, 0.06f, 0.0f, 0.0f, 0.01f};
    const uint8_t want[] = {H, H, L, L, P, P, H, H};
    expect_classes(sig, 8, 1.0f, 0.5f, 2, want);
    /* No window: 6 and 7 fall to their scores. */
    const uint8_t want0[] = {H, H, L, L, P, P, P, P};
    expect_classes(sig, 8, 1.0f, 0.5f, 0, want0);
}

Test(policy, prompt_threshold_equality)
{
    const int32_t n = 7;
    const float ah = 1.0f, al = 0.3f;
    const float th_h = ah / (float)n, th_l = al / (float)n;
    const float sig[] = {th_h, nextafterf(th_h, 0.0f), th_l, nextafterf(th_l, 0.0f),
                         nextafterf(th_h, 1.0f), 0.0f, 0.0f};
    const uint8_t want[] = {H, L, L, P, H, P, H};
    expect_classes(sig, n, ah, al, 1, want);
}

Test(policy, prompt_alpha_zero_keeps_all_high)
{
    const float sig[] = {0.0f, 0.3f, 0.0f, 1e-30f, 0.0f, 0.2f};
    const uint8_t want[] = {H, H, H, H, H, H};
    expect_classes(sig, 6, 0.0f, 0.0f, 0, want);
    expect_classes(sig, 6, 0.0f, 0.0f, 3, want);
}

Test(policy, prompt_window_longer_than_prompt)
{
    const float sig[] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const uint8_t want[] = {H, H, H, H, H};
    expect_classes(sig, 5, 4.0f, 2.0f, 5, want);
    expect_classes(sig, 5, 4.0f, 2.0f, 64, want);
    const uint8_t want4[] = {P, H, H, H, H};
    expect_classes(sig, 5, 4.0f, 2.0f, 4, want4);
}

Test(policy, prompt_no_low_band)
{
    /* alpha_l = alpha_h: a token is high or pruned, never low. th = 2 / 4 = 0.5. */
    const float sig[] = {0.5f, 0.49f, 0.7f, 0.0f};
    const uint8_t want[] = {H, P, H, P};
    expect_classes(sig, 4, 2.0f, 2.0f, 0, want);
}

/* ---------------------------------------------------------------------------------------- */
/* Budget                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Runs the budget into poisoned outputs and compares with want_sec / want_idx. */
static void expect_budget(const tok_t *hi, int32_t n_hi, const tok_t *lo, int32_t n_lo, int32_t N,
                          int32_t W, int32_t budget, int32_t want_n, const uint8_t *want_sec,
                          const int32_t *want_idx)
{
    uint8_t sec[64];
    int32_t idx[64];
    memset(sec, 0xEE, sizeof sec);
    for (int i = 0; i < 64; i++) idx[i] = -7;
    int32_t got = mkv_policy_budget(hi, n_hi, lo, n_lo, N, W, budget, sec, idx);
    cr_assert_eq(got, want_n, "budget %d pruned %d, want %d", budget, got, want_n);
    for (int32_t k = 0; k < want_n; k++) {
        cr_assert_eq(sec[k], want_sec[k], "pick %d: section %d, want %d", k, sec[k], want_sec[k]);
        cr_assert_eq(idx[k], want_idx[k], "pick %d: index %d, want %d", k, idx[k], want_idx[k]);
    }
}

Test(policy, budget_hand_built)
{
    /* N = 10, W = 2: positions 8, 9 protected. 8 tokens stored. */
    const tok_t hi[] = {{0.9f, 9}, {0.3f, 3}, {0.2f, 7}, {0.0f, 8}, {0.15f, 0}};
    const tok_t lo[] = {{0.05f, 1}, {0.25f, 5}, {0.01f, 4}};
    const uint8_t s3[] = {1, 1, 0};
    const int32_t i3[] = {2, 0, 4};
    expect_budget(hi, 5, lo, 3, 10, 2, 5, 3, s3, i3);
    const uint8_t s5[] = {1, 1, 0, 0, 1};
    const int32_t i5[] = {2, 0, 4, 2, 1};
    expect_budget(hi, 5, lo, 3, 10, 2, 3, 5, s5, i5);
    expect_budget(hi, 5, lo, 3, 10, 2, 7, 1, s3, i3);
}

Test(policy, budget_ties)
{
    const tok_t hi[] = {{0.1f, 6}, {0.9f, 9}, {0.1f, 2}, {0.5f, 8}};
    const tok_t lo[] = {{0.1f, 4}, {0.1f, 0}, {0.1f, 5}};
    const uint8_t s[] = {1, 0, 1, 1, 0};
    const int32_t i[] = {1, 2, 0, 2, 0};
    for (int32_t k = 1; k <= 5; k++) expect_budget(hi, 4, lo, 3, 10, 2, 7 - k, k, s, i);
}

Test(policy, budget_protects_window_and_caps)
{
    /* The weakest tokens are inside the window (positions 8, 9): never picked. */
    const tok_t hi[] = {{0.0f, 9}, {0.0f, 8}, {0.5f, 7}, {0.4f, 1}};
    const tok_t lo[] = {{0.3f, 2}};
    const uint8_t s[] = {1, 0, 0};
    const int32_t i[] = {0, 3, 2};
    expect_budget(hi, 4, lo, 1, 10, 2, 4, 1, s, i);
    /* A budget below the window: everything outside goes, nothing more. */
    expect_budget(hi, 4, lo, 1, 10, 2, 1, 3, s, i);
    /* A window that covers everything: nothing can go. */
    expect_budget(hi, 4, lo, 1, 10, 10, 1, 0, s, i);
    expect_budget(hi, 4, lo, 1, 10, 64, 1, 0, s, i);
}

Test(policy, budget_not_exceeded)
{
    const tok_t hi[] = {{0.0f, 9}, {0.0f, 8}, {0.5f, 7}, {0.4f, 1}};
    const tok_t lo[] = {{0.3f, 2}};
    expect_budget(hi, 4, lo, 1, 10, 2, 5, 0, NULL, NULL);
    expect_budget(hi, 4, lo, 1, 10, 2, 100, 0, NULL, NULL);
    expect_budget(hi, 4, lo, 1, 10, 2, 0, 0, NULL, NULL);  /* no budget */
    expect_budget(NULL, 0, NULL, 0, 0, 2, 3, 0, NULL, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* Random states and a simple model                                                         */
/* ---------------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int32_t rng_below(uint64_t *s, int32_t n) { return (int32_t)(rng_next(s) % (uint64_t)n); }

enum { MAXN = 48 };

typedef struct rstate {
    int32_t N, W, n_hi, n_lo;
    float ah, al;
    tok_t hi[MAXN], lo[MAXN];
} rstate_t;

static void shuffle(uint64_t *s, tok_t *t, int32_t n)
{
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = rng_below(s, i + 1);
        tok_t x = t[i];
        t[i] = t[j];
        t[j] = x;
    }
}

/* A consistent state: positions >= N - W and the candidate are high, every other position is
 * high, low or pruned; scores from a small set that includes both thresholds exactly. With
 * probability 1/50 the candidate is dropped (inconsistent state). */
static void random_state(uint64_t *s, rstate_t *st, int alpha_zero)
{
    static const float alphas[] = {0.0f, 0.5f, 1.0f, 1.5f, 3.0f};
    st->N = rng_below(s, MAXN + 1);
    st->W = rng_below(s, 9);
    st->ah = alpha_zero ? 0.0f : alphas[rng_below(s, 5)];
    st->al = alpha_zero ? 0.0f : alphas[rng_below(s, 5)];
    if (!alpha_zero && rng_below(s, 4) != 0 && st->al > st->ah) { /* mostly alpha_l <= alpha_h */
        float t = st->al;
        st->al = st->ah;
        st->ah = t;
    }
    const float N = (float)(st->N > 0 ? st->N : 1);
    const float vals[] = {0.0f, 0.01f, 0.03f, 0.05f, 0.1f, 0.5f, st->ah / N, st->al / N};
    const int32_t cand = st->N - 1 - st->W;
    const int drop_cand = rng_below(s, 50) == 0;
    st->n_hi = st->n_lo = 0;
    for (int32_t p = 0; p < st->N; p++) {
        tok_t t = {vals[rng_below(s, ARRAY_LEN(vals))], p};
        int where = rng_below(s, 3); /* 0 high, 1 low, 2 pruned */
        if (p >= st->N - st->W || p == cand) where = 0;
        if (p == cand && drop_cand) where = 1 + rng_below(s, 2);
        if (where == 0) st->hi[st->n_hi++] = t;
        else if (where == 1) st->lo[st->n_lo++] = t;
    }
    shuffle(s, st->hi, st->n_hi);
    shuffle(s, st->lo, st->n_lo);
}

/* The model works on (sig, pos, section, index) records sorted with qsort. */
typedef struct rec {
    float sig;
    int32_t pos, sec, idx;
} rec_t;

static int rec_cmp(const void *a, const void *b)
{
    const rec_t *x = a, *y = b;
    if (x->sig != y->sig) return x->sig < y->sig ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static dec_t model_decide(const rstate_t *st)
{
    dec_t d = {MKV_ACT_NONE, -1, -1};
    if (st->N <= st->W) return d;
    int32_t c = -1;
    for (int32_t i = 0; i < st->n_hi; i++)
        if (st->hi[i].pos == st->N - 1 - st->W) c = i;
    if (c < 0) {
        d.cand = -2;
        return d;
    }
    d.cand = c;
    const float th_h = st->ah / (float)st->N, th_l = st->al / (float)st->N;
    rec_t r[2 * MAXN + 1];
    int32_t n = 0;
    if (st->hi[c].sig >= th_h) {
        for (int32_t i = 0; i < st->n_hi; i++)
            if (st->hi[i].pos < st->N - st->W) r[n++] = (rec_t){st->hi[i].sig, st->hi[i].pos, 0, i};
        qsort(r, (size_t)n, sizeof r[0], rec_cmp);
        const float v = r[0].sig;
        d.action = (v >= th_l && v < th_h) ? MKV_ACT_DEMOTE_VICTIM
                   : (v < th_l)            ? MKV_ACT_PRUNE_VICTIM
                                           : MKV_ACT_KEEP;
        d.victim = r[0].idx == c ? -1 : r[0].idx;
    } else if (st->hi[c].sig >= th_l) {
        r[n++] = (rec_t){st->hi[c].sig, st->hi[c].pos, 0, c};
        for (int32_t i = 0; i < st->n_lo; i++) r[n++] = (rec_t){st->lo[i].sig, st->lo[i].pos, 1, i};
        qsort(r, (size_t)n, sizeof r[0], rec_cmp);
        if (r[0].sec == 0) {
            d.action = MKV_ACT_DEMOTE_CAND;
        } else {
            d.action = r[0].sig < th_l ? MKV_ACT_DEMOTE_CAND_PRUNE_LOW : MKV_ACT_DEMOTE_CAND;
            d.victim = r[0].idx;
        }
    } else {
        d.action = MKV_ACT_PRUNE_CAND;
    }
    return d;
}

static int32_t model_budget(const rstate_t *st, int32_t budget, rec_t *out)
{
    const int32_t total = st->n_hi + st->n_lo;
    if (budget <= 0 || total <= budget) return 0;
    int32_t n = 0;
    for (int32_t i = 0; i < st->n_hi; i++)
        if (st->hi[i].pos < st->N - st->W) out[n++] = (rec_t){st->hi[i].sig, st->hi[i].pos, 0, i};
    for (int32_t i = 0; i < st->n_lo; i++)
        if (st->lo[i].pos < st->N - st->W) out[n++] = (rec_t){st->lo[i].sig, st->lo[i].pos, 1, i};
    qsort(out, (size_t)n, sizeof out[0], rec_cmp);
    return total - budget < n ? total - budget : n;
}

Test(policy, random_decide_matches_model)
{
    uint64_t s = 0x5eed0001;
    int hits[MKV_ACT_PRUNE_CAND + 1] = {0};
    int inconsistent = 0;
    for (int it = 0; it < 20000; it++) {
        rstate_t st;
        random_state(&s, &st, 0);
        dec_t want = model_decide(&st);
        dec_t got = mkv_policy_decide(st.hi, st.n_hi, st.lo, st.n_lo, st.N, st.ah, st.al, st.W);
        cr_assert(got.action == want.action && got.cand == want.cand && got.victim == want.victim,
                  "state %d (N %d W %d alpha %g/%g, %d high, %d low): got (%d, %d, %d), model "
                  "(%d, %d, %d)",
                  it, st.N, st.W, st.ah, st.al, st.n_hi, st.n_lo, (int)got.action, got.cand,
                  got.victim, (int)want.action, want.cand, want.victim);
        hits[want.action]++;
        inconsistent += want.cand == -2;
    }
    /* The generator must reach every branch, or the comparison proves little. */
    for (int a = 0; a <= MKV_ACT_PRUNE_CAND; a++) cr_assert_gt(hits[a], 100, "action %d: %d", a, hits[a]);
    cr_assert_gt(inconsistent, 50);
}

Test(policy, random_budget_matches_model)
{
    uint64_t s = 0x5eed0002;
    int partial = 0, capped = 0;
    for (int it = 0; it < 20000; it++) {
        rstate_t st;
        random_state(&s, &st, 0);
        const int32_t total = st.n_hi + st.n_lo;
        const int32_t budget = rng_below(&s, total + 3);
        rec_t want[2 * MAXN];
        const int32_t want_n = model_budget(&st, budget, want);
        uint8_t sec[2 * MAXN];
        int32_t idx[2 * MAXN];
        memset(sec, 0xEE, sizeof sec);
        memset(idx, 0xEE, sizeof idx);
        const int32_t got_n =
            mkv_policy_budget(st.hi, st.n_hi, st.lo, st.n_lo, st.N, st.W, budget, sec, idx);
        cr_assert_eq(got_n, want_n, "state %d (N %d W %d, %d stored, budget %d): %d pruned, want %d",
                     it, st.N, st.W, total, budget, got_n, want_n);
        for (int32_t k = 0; k < want_n; k++)
            cr_assert(sec[k] == want[k].sec && idx[k] == want[k].idx,
                      "state %d pick %d: (%d, %d), model (%d, %d)", it, k, sec[k], idx[k],
                      want[k].sec, want[k].idx);
        partial += want_n > 0 && total - want_n == budget;
        capped += want_n > 0 && total - want_n > budget;
    }
    cr_assert_gt(partial, 1000);
    cr_assert_gt(capped, 100);
}

Test(policy, random_alpha_zero_never_compresses)
{
    /* alpha_h = alpha_l = 0: thresholds are 0 and scores are >= 0, so every token stays high. */
    uint64_t s = 0x5eed0003;
    int keeps = 0;
    for (int it = 0; it < 20000; it++) {
        rstate_t st;
        random_state(&s, &st, 1);
        dec_t d = mkv_policy_decide(st.hi, st.n_hi, st.lo, st.n_lo, st.N, 0.0f, 0.0f, st.W);
        cr_assert(d.action == MKV_ACT_KEEP || d.action == MKV_ACT_NONE,
                  "state %d (N %d W %d): action %d", it, st.N, st.W, (int)d.action);
        if (st.N > st.W && d.cand >= 0) cr_assert_eq(d.action, MKV_ACT_KEEP, "state %d", it);
        keeps += d.action == MKV_ACT_KEEP;
    }
    cr_assert_gt(keeps, 10000);
}

/* ---------------------------------------------------------------------------------------- */
/* The fixed mix                                                                            */
/* ---------------------------------------------------------------------------------------- */

Test(policy_mix, targets_round_half_up_and_fit)
{
    int32_t h, l;
    mkv_policy_mix_targets(10, 0.2f, 0.5f, &h, &l);
    cr_assert(h == 2 && l == 5, "%d %d", h, l);
    mkv_policy_mix_targets(3, 0.5f, 0.5f, &h, &l); /* 1.5 -> 2 high, the one left low */
    cr_assert(h == 2 && l == 1, "%d %d", h, l);
    mkv_policy_mix_targets(0, 0.3f, 0.3f, &h, &l);
    cr_assert(h == 0 && l == 0);
    mkv_policy_mix_targets(7, 1.0f, 0.0f, &h, &l);
    cr_assert(h == 7 && l == 0);
}

/* 20 tokens, W 4: of the 16 outside, round(0.3 x 16) = 5 strongest high, round(0.4 x 16) = 6
 * next low, 5 pruned; equal significances rank the lower position as weaker. */
Test(policy_mix, prompt_by_rank)
{
    float sig[20];
    for (int i = 0; i < 20; i++) sig[i] = (float)((i * 7) % 20) / 20.0f;
    sig[3] = sig[5]; /* a tie: position 3 ranks below 5 */
    uint8_t cls[20];
    tok_t scratch[20];
    mkv_policy_classify_prompt_mix(sig, 20, 0.3f, 0.4f, 4, cls, scratch);
    int cnt[3] = {0, 0, 0};
    for (int i = 0; i < 16; i++) cnt[cls[i]]++;
    cr_assert(cnt[MKV_CLASS_HIGH] == 5 && cnt[MKV_CLASS_LOW] == 6 && cnt[MKV_CLASS_PRUNE] == 5, "%d %d %d",
              cnt[MKV_CLASS_HIGH], cnt[MKV_CLASS_LOW], cnt[MKV_CLASS_PRUNE]);
    for (int i = 16; i < 20; i++) cr_assert_eq(cls[i], MKV_CLASS_HIGH, "window position %d", i);
    for (int i = 0; i < 16; i++) /* every kept token outranks every pruned one, high every low */
        for (int j = 0; j < 16; j++)
            if (cls[i] > cls[j])
                cr_assert(sig[i] > sig[j] || (sig[i] == sig[j] && i > j), "%d (class %d) vs %d (class %d)", i,
                          cls[i], j, cls[j]);
}

/* N 10, W 2: m = 8 outside (t_c at 7). mix 0.5 / 0.25: targets 4 high, 2 low. */
Test(policy_mix, step_actions)
{
    /* 4 high outside (positions 1, 3, 5 and t_c 7) = target: keep */
    const tok_t hi4[] = {{0.9f, 9}, {0.3f, 3}, {0.2f, 7}, {0.4f, 1}, {0.5f, 8}, {0.6f, 5}};
    expect_dec(mkv_policy_decide_mix(hi4, ARRAY_LEN(hi4), NULL, 0, N10, 0.5f, 0.25f, W2), MKV_ACT_KEEP, 2, -1);
    /* 5 high outside: the weakest (position 0) leaves, room in low: demoted */
    const tok_t hi5[] = {{0.9f, 9}, {0.3f, 3}, {0.2f, 7}, {0.4f, 1}, {0.5f, 8}, {0.6f, 5}, {0.1f, 0}};
    const tok_t lo1[] = {{0.05f, 2}};
    expect_dec(mkv_policy_decide_mix(hi5, ARRAY_LEN(hi5), lo1, 1, N10, 0.5f, 0.25f, W2), MKV_ACT_DEMOTE_VICTIM, 2,
               6);
    /* the same with the low section full (2 = target): the victim is pruned */
    const tok_t lo2[] = {{0.05f, 2}, {0.06f, 4}};
    expect_dec(mkv_policy_decide_mix(hi5, ARRAY_LEN(hi5), lo2, 2, N10, 0.5f, 0.25f, W2), MKV_ACT_PRUNE_VICTIM, 2,
               6);
    /* t_c the weakest: demoted while there is room */
    const tok_t hic[] = {{0.9f, 9}, {0.3f, 3}, {0.01f, 7}, {0.4f, 1}, {0.5f, 8}, {0.6f, 5}, {0.1f, 0}};
    expect_dec(mkv_policy_decide_mix(hic, ARRAY_LEN(hic), lo1, 1, N10, 0.5f, 0.25f, W2), MKV_ACT_DEMOTE_CAND, 2, -1);
    /* full low section: t_c replaces its weakest when stronger, else is pruned */
    const tok_t hid[] = {{0.9f, 9}, {0.3f, 3}, {0.055f, 7}, {0.4f, 1}, {0.5f, 8}, {0.6f, 5}, {0.1f, 0}};
    expect_dec(mkv_policy_decide_mix(hid, ARRAY_LEN(hid), lo2, 2, N10, 0.5f, 0.25f, W2),
               MKV_ACT_DEMOTE_CAND_PRUNE_LOW, 2, 0);
    expect_dec(mkv_policy_decide_mix(hic, ARRAY_LEN(hic), lo2, 2, N10, 0.5f, 0.25f, W2), MKV_ACT_PRUNE_CAND, 2, -1);
    /* no candidate yet while the window fills */
    expect_dec(mkv_policy_decide_mix(hi4, ARRAY_LEN(hi4), NULL, 0, 2, 0.5f, 0.25f, W2), MKV_ACT_NONE, -1, -1);
}
