/*
 * policy.h — DiffKV's compression policy (DESIGN.md section 5) as pure decisions over arrays:
 * which tokens of a head-region stay high, are demoted to low or are pruned. The data movement
 * (swap-remove, demotion, page recycling) is the backend's (engine/kv_backend.c). Pure
 * functions, so every branch is tested on hand-built scores and the GPU kernel can follow them.
 *
 * Significance is a token's mean received attention: score sum / observers (attention.h,
 * mkv_observers), computed in fp32. Thresholds are th_h = alpha_h / (float)N and
 * th_l = alpha_l / (float)N, compared with >=. Every argmin breaks ties towards the lower
 * position, so the CPU and GPU backends decide identically given identical scores.
 */
#ifndef MKV_ENGINE_POLICY_H
#define MKV_ENGINE_POLICY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mkv_token_class { MKV_CLASS_PRUNE = 0, MKV_CLASS_LOW = 1, MKV_CLASS_HIGH = 2 } mkv_token_class_t;

/* Prompt phase for one head-region of a prompt of n tokens (positions 0 .. n - 1): the last
 * `window` positions are high; any other token is high if sig >= alpha_h / n, low if
 * sig >= alpha_l / n, pruned otherwise. cls[n] receives mkv_token_class_t values. */
void mkv_policy_classify_prompt(const float *sig, int32_t n, float alpha_h, float alpha_l,
                                int32_t window, uint8_t *cls);

/* A stored token as the policy sees it. */
typedef struct mkv_policy_token {
    float sig;   /* significance (mean) */
    int32_t pos; /* position */
} mkv_policy_token_t;

typedef enum mkv_policy_action {
    MKV_ACT_NONE = 0,              /* no candidate yet: N <= W */
    MKV_ACT_KEEP,                  /* t_c stays high, the high victim stays */
    MKV_ACT_DEMOTE_VICTIM,         /* t_c stays high, the high victim is demoted to low */
    MKV_ACT_PRUNE_VICTIM,          /* t_c stays high, the high victim is pruned */
    MKV_ACT_DEMOTE_CAND,           /* t_c is demoted to low, the low victim stays */
    MKV_ACT_DEMOTE_CAND_PRUNE_LOW, /* t_c is demoted to low, the low victim is pruned */
    MKV_ACT_PRUNE_CAND,            /* t_c is pruned */
} mkv_policy_action_t;

typedef struct mkv_policy_decision {
    mkv_policy_action_t action;
    int32_t cand;   /* index of t_c in the high section, or -1 */
    int32_t victim; /* the victim's index: in the high section for KEEP / DEMOTE_VICTIM /
                       PRUNE_VICTIM, in the low section for DEMOTE_CAND and
                       DEMOTE_CAND_PRUNE_LOW; -1 when there is none or the victim is t_c
                       itself (KEEP, DEMOTE_CAND) */
} mkv_policy_decision_t;

/* Algorithm 1 for one head-region at sequence length N (the new token, position N - 1, is
 * already in the high section). t_c is the high token at position N - 1 - W. With
 * th_h = alpha_h / N and th_l = alpha_l / N:
 *  - sig(t_c) >= th_h: t_c stays; the victim is the lowest-sig high token outside the window
 *    (pos < N - W, t_c included); it is demoted if th_l <= sig < th_h, pruned if sig < th_l;
 *  - else sig(t_c) >= th_l: t_c is demoted; the victim is the lowest-sig low token, t_c
 *    included; it is pruned if sig < th_l (never t_c itself, whose sig >= th_l);
 *  - else t_c is pruned.
 * Returns MKV_ACT_NONE when N <= W. If N > W but no high token has position N - 1 - W, the
 * state is inconsistent: returns MKV_ACT_NONE with cand = -2. */
mkv_policy_decision_t mkv_policy_decide(const mkv_policy_token_t *hi, int32_t n_hi,
                                        const mkv_policy_token_t *lo, int32_t n_lo, int32_t N,
                                        float alpha_h, float alpha_l, int32_t window);

/* The fixed mix (mkv_cache_config_t.mix_high / mix_low > 0): fractions of the tokens outside
 * the window chosen by rank instead of thresholds. Of m such tokens, round(mix_high m) stay high
 * and round(mix_low m) (at most the rest) low; the targets for m. */
void mkv_policy_mix_targets(int32_t m, float mix_high, float mix_low, int32_t *n_high, int32_t *n_low);

/* Prompt phase with the fixed mix: the window high; of the other m tokens the strongest
 * n_high by (sig, pos) high, the next n_low low, the rest pruned. scratch: n entries. */
void mkv_policy_classify_prompt_mix(const float *sig, int32_t n, float mix_high, float mix_low, int32_t window,
                                    uint8_t *cls, mkv_policy_token_t *scratch);

/* Generation phase with the fixed mix, in mkv_policy_decide's terms: with m = N - W tokens
 * outside the window (t_c now among them) and targets (n_high, n_low) for m, when the high
 * tokens outside the window are no more than n_high: KEEP; else the weakest of them (the
 * victim, t_c included) leaves: demoted while the low section holds fewer than n_low
 * (DEMOTE_VICTIM, or DEMOTE_CAND when it is t_c), else pruned (PRUNE_VICTIM), except that t_c
 * leaving a full low section replaces its weakest token when stronger (DEMOTE_CAND_PRUNE_LOW,
 * else PRUNE_CAND). So the sections track the mix as the sequence grows. */
mkv_policy_decision_t mkv_policy_decide_mix(const mkv_policy_token_t *hi, int32_t n_hi,
                                            const mkv_policy_token_t *lo, int32_t n_lo, int32_t N,
                                            float mix_high, float mix_low, int32_t window);

/* Budget: when n_hi + n_lo > budget (budget > 0), the tokens to prune so that at most budget
 * remain: the lowest-sig tokens outside the window (pos < N - W) of both sections, ties to the
 * lower position, at most as many as lie outside the window (budget <= 0: none). NaN
 * significances are outside the contract: the picks are then unspecified but in range. Writes section (0 high, 1 low)
 * and index of each into out_sec / out_idx (capacity n_hi + n_lo), in pruning order; returns
 * the count. */
int32_t mkv_policy_budget(const mkv_policy_token_t *hi, int32_t n_hi, const mkv_policy_token_t *lo,
                          int32_t n_lo, int32_t N, int32_t window, int32_t budget,
                          uint8_t *out_sec, int32_t *out_idx);

#ifdef __cplusplus
}
#endif

#endif /* MKV_ENGINE_POLICY_H */
