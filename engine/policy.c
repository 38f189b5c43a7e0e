/*
 * policy.c — DiffKV's compression policy (DESIGN.md section 5) as pure decisions over the
 * tokens of one head-region: prompt classification, Algorithm 1 for one generation step, and
 * the budget rule. No data moves here; the backend applies the decisions.
 *
 * Every argmin orders tokens by (sig, pos) lexicographically, so ties go to the lower position.
 * Positions are unique within a head-region, which makes that order strict: the CPU and GPU
 * backends pick the same token given the same scores. Thresholds are computed in fp32 exactly
 * as policy.h states (alpha / (float)N) so that a kernel doing the same division agrees bit for
 * bit on which side of a threshold a score falls.
 */
#include "engine/policy.h"

#include <math.h>
#include <stdlib.h>

#include <stddef.h>

/* (sig, pos) order. NOTE: NaN scores are outside the contract (a score is a sum of softmax
 * probabilities over a positive observer count); with one, the picks are unspecified but every
 * loop still ends and every index stays in range. */
static inline int tok_less(float sig_a, int32_t pos_a, float sig_b, int32_t pos_b)
{
    return sig_a < sig_b || (sig_a == sig_b && pos_a < pos_b);
}

void mkv_policy_classify_prompt(const float *sig, int32_t n, float alpha_h, float alpha_l,
                                int32_t window, uint8_t *cls)
{
    if (n <= 0) return;
    const float th_h = alpha_h / (float)n;
    const float th_l = alpha_l / (float)n;
    const int32_t win_start = n - window; /* positions >= win_start are inside the window */
    for (int32_t i = 0; i < n; i++) {
        uint8_t c;
        if (i >= win_start || sig[i] >= th_h) c = MKV_CLASS_HIGH;
        else if (sig[i] >= th_l) c = MKV_CLASS_LOW;
        else c = MKV_CLASS_PRUNE;
        cls[i] = c;
    }
}

/* Index of the (sig, pos)-smallest token with pos < limit, or -1 when there is none. */
static int32_t argmin_before(const mkv_policy_token_t *t, int32_t n, int32_t limit)
{
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++) {
        if (t[i].pos >= limit) continue;
        if (best < 0 || tok_less(t[i].sig, t[i].pos, t[best].sig, t[best].pos)) best = i;
    }
    return best;
}

mkv_policy_decision_t mkv_policy_decide(const mkv_policy_token_t *hi, int32_t n_hi,
                                        const mkv_policy_token_t *lo, int32_t n_lo, int32_t N,
                                        float alpha_h, float alpha_l, int32_t window)
{
    mkv_policy_decision_t d = {MKV_ACT_NONE, -1, -1};
    if (N <= window) return d;

    const int32_t cand_pos = N - 1 - window;
    int32_t c = -1;
    for (int32_t i = 0; i < n_hi; i++) {
        if (hi[i].pos == cand_pos) {
            c = i;
            break;
        }
    }
    if (c < 0) {
        d.cand = -2; /* inconsistent state: the caller should not act on it */
        return d;
    }
    d.cand = c;

    const float th_h = alpha_h / (float)N;
    const float th_l = alpha_l / (float)N;
    const float sc = hi[c].sig;

    if (sc >= th_h) {
        /* Lines 6-12: t_c stays high; the victim is the weakest high token outside the window
         * (t_c included, since pos N - 1 - W < N - W), so one always exists. */
        const int32_t v = argmin_before(hi, n_hi, N - window);
        const float sv = hi[v].sig;
        /* Branch order follows Algorithm 1 so that alpha_l > alpha_h still means something. */
        if (th_l <= sv && sv < th_h) d.action = MKV_ACT_DEMOTE_VICTIM;
        else if (sv < th_l) d.action = MKV_ACT_PRUNE_VICTIM;
        else d.action = MKV_ACT_KEEP;
        d.victim = (v == c) ? -1 : v;
    } else if (sc >= th_l) {
        /* Lines 14-18: t_c joins the low section; the victim is the weakest low token, t_c
         * included. t_c itself is never pruned here: its sig >= th_l. */
        const int32_t v = argmin_before(lo, n_lo, INT32_MAX);
        if (v >= 0 && tok_less(lo[v].sig, lo[v].pos, sc, hi[c].pos) && lo[v].sig < th_l) {
            d.action = MKV_ACT_DEMOTE_CAND_PRUNE_LOW;
            d.victim = v;
        } else {
            d.action = MKV_ACT_DEMOTE_CAND;
            /* The victim is kept: report it when it is a low token, -1 when it is t_c. */
            d.victim = (v >= 0 && tok_less(lo[v].sig, lo[v].pos, sc, hi[c].pos)) ? v : -1;
        }
    } else {
        d.action = MKV_ACT_PRUNE_CAND;
    }
    return d;
}

/* round(f * m), half up, within [0, m]. */
static int32_t mix_count(float f, int32_t m)
{
    const double x = floor((double)f * m + 0.5);
    return x < 0 ? 0 : x > m ? m : (int32_t)x;
}

void mkv_policy_mix_targets(int32_t m, float mix_high, float mix_low, int32_t *n_high, int32_t *n_low)
{
    const int32_t h = mix_count(mix_high, m);
    int32_t l = mix_count(mix_low, m);
    if (h + l > m) l = m - h;
    *n_high = h;
    *n_low = l;
}

static int rank_cmp(const void *a, const void *b)
{
    const mkv_policy_token_t *x = a, *y = b;
    if (tok_less(x->sig, x->pos, y->sig, y->pos)) return -1;
    return tok_less(y->sig, y->pos, x->sig, x->pos) ? 1 : 0;
}

void mkv_policy_classify_prompt_mix(const float *sig, int32_t n, float mix_high, float mix_low, int32_t window,
                                    uint8_t *cls, mkv_policy_token_t *r)
{
    if (n <= 0) return;
    const int32_t m = n - window > 0 ? n - window : 0; /* positions 0 .. m - 1 lie outside the window */
    for (int32_t i = m; i < n; i++) cls[i] = MKV_CLASS_HIGH;
    if (m == 0) return;
    for (int32_t i = 0; i < m; i++) r[i].sig = sig[i], r[i].pos = i;
    qsort(r, (size_t)m, sizeof *r, rank_cmp); /* the weakest first; keys are unique (positions) */
    int32_t nh, nl;
    mkv_policy_mix_targets(m, mix_high, mix_low, &nh, &nl);
    for (int32_t k = 0; k < m; k++)
        cls[r[k].pos] = k >= m - nh ? MKV_CLASS_HIGH : k >= m - nh - nl ? MKV_CLASS_LOW : MKV_CLASS_PRUNE;
}

mkv_policy_decision_t mkv_policy_decide_mix(const mkv_policy_token_t *hi, int32_t n_hi,
                                            const mkv_policy_token_t *lo, int32_t n_lo, int32_t N,
                                            float mix_high, float mix_low, int32_t window)
{
    mkv_policy_decision_t d = {MKV_ACT_NONE, -1, -1};
    if (N <= window) return d;
    const int32_t cand_pos = N - 1 - window;
    int32_t c = -1;
    for (int32_t i = 0; i < n_hi; i++)
        if (hi[i].pos == cand_pos) {
            c = i;
            break;
        }
    if (c < 0) {
        d.cand = -2; /* inconsistent state: the caller should not act on it */
        return d;
    }
    d.cand = c;
    int32_t want_hi, want_lo;
    mkv_policy_mix_targets(N - window, mix_high, mix_low, &want_hi, &want_lo);
    const int32_t out_hi = n_hi - window; /* high tokens outside the window, t_c included */
    if (out_hi <= want_hi) {
        d.action = MKV_ACT_KEEP;
        return d;
    }
    /* One high token too many: the weakest outside the window leaves (t_c included). */
    const int32_t v = argmin_before(hi, n_hi, N - window);
    if (n_lo + 1 <= want_lo) { /* room in the low section */
        d.action = v == c ? MKV_ACT_DEMOTE_CAND : MKV_ACT_DEMOTE_VICTIM;
        d.victim = v == c ? -1 : v;
        return d;
    }
    if (v != c) { /* the low section is full: the leaving token goes */
        d.action = MKV_ACT_PRUNE_VICTIM;
        d.victim = v;
        return d;
    }
    /* t_c leaves and the low section is full: it replaces the weakest low token if stronger */
    const int32_t w = argmin_before(lo, n_lo, INT32_MAX);
    if (w >= 0 && tok_less(lo[w].sig, lo[w].pos, hi[c].sig, hi[c].pos)) {
        d.action = MKV_ACT_DEMOTE_CAND_PRUNE_LOW;
        d.victim = w;
    } else {
        d.action = MKV_ACT_PRUNE_CAND;
    }
    return d;
}

int32_t mkv_policy_budget(const mkv_policy_token_t *hi, int32_t n_hi, const mkv_policy_token_t *lo,
                          int32_t n_lo, int32_t N, int32_t window, int32_t budget,
                          uint8_t *out_sec, int32_t *out_idx)
{
    if (budget <= 0) return 0;
    const int64_t total = (int64_t)n_hi + n_lo;
    if (total <= budget) return 0;
    const int32_t limit = N - window; /* outside the window: pos < limit */
    const int64_t want = total - budget;

    /* Repeated argmin, each pick the (sig, pos)-successor of the previous one. The order is
     * strict (unique positions), so nothing is picked twice and no marks are needed: O(n * k)
     * and allocation-free; budget pruning is rare and k is usually 1. When every token outside
     * the window is taken, the scan finds no successor and stops short of want. */
    const mkv_policy_token_t *const sec[2] = {hi, lo};
    const int32_t cnt[2] = {n_hi, n_lo};
    int have_prev = 0;
    float prev_sig = 0.0f;
    int32_t prev_pos = 0;
    int32_t k = 0;
    for (; k < want; k++) {
        int best_s = -1;
        int32_t best_i = -1;
        for (int s = 0; s < 2; s++) {
            for (int32_t i = 0; i < cnt[s]; i++) {
                const mkv_policy_token_t *t = &sec[s][i];
                if (t->pos >= limit) continue;
                if (have_prev && !tok_less(prev_sig, prev_pos, t->sig, t->pos)) continue;
                if (best_s < 0 ||
                    tok_less(t->sig, t->pos, sec[best_s][best_i].sig, sec[best_s][best_i].pos)) {
                    best_s = s;
                    best_i = i;
                }
            }
        }
        if (best_s < 0) break; /* every token outside the window is taken */
        out_sec[k] = (uint8_t)best_s;
        out_idx[k] = best_i;
        have_prev = 1;
        prev_sig = sec[best_s][best_i].sig;
        prev_pos = sec[best_s][best_i].pos;
    }
    return k;
}
