/*
 * model_opts.h — options shared by the commands that run a model (`generate`, `perplexity`):
 * the cache modes and their policy, and making a cache sized for a workload.
 */
#ifndef MKV_TOOLS_MODEL_OPTS_H
#define MKV_TOOLS_MODEL_OPTS_H

#include "engine/model.h"
#include "mixkv.h"

typedef struct mkv_policy_opts {
    mkv_format_t hi, lo;
    float alpha_h, alpha_l;
    int32_t window, obs_window, quant_groups;
} mkv_policy_opts_t;

/* DiffKV's defaults: K8V4 / K4V2, alpha_h 1, alpha_l 0.02, W 64, one group. */
void mkv_policy_opts_default(mkv_policy_opts_t *p);

/* Tries argv[*i] against --hi-format, --lo-format, --alpha-h, --alpha-l, --recent-window (W;
 * not --window, which `perplexity` uses for its text windows),
 * --obs-window, --quant-groups. Returns 1 when consumed, 0 when not ours, -1 on a bad value
 * (message printed). */
int mkv_policy_opts_parse(const char *cmd, int argc, char **argv, int *i, mkv_policy_opts_t *p);

/* A CPU cache for `model` in mode fp16 (K16V16, thresholds 0) or mixkv (the policy options),
 * with max_seqs slots of up to max_seq_len tokens, and pool pages for all of them at full
 * length in high precision plus the scheduler's admission margin, times pool_scale (1.0: no
 * pressure). NULL on failure, message printed. */
mkv_cache_t *mkv_tools_make_cache(const char *cmd, const mkv_model_t *model, int fp16,
                                  const mkv_policy_opts_t *p, int32_t max_seqs,
                                  int32_t max_seq_len, double pool_scale);

#define MKV_POLICY_OPTS_HELP                                                                   \
    "  --hi-format F       mixkv's high format [K8V4]\n"                                        \
    "  --lo-format F       mixkv's low format [K4V2]\n"                                         \
    "  --alpha-h X         keep high when significance >= X / N [1.0]\n"                        \
    "  --alpha-l X         keep low when significance >= X / N, else prune [0.02]\n"            \
    "  --recent-window N   W: the most recent tokens, always high [64]\n"                       \
    "  --obs-window N      prompt significance from the last N queries only (0: all) [0]\n"     \
    "  --quant-groups N    quantization groups per vector: 1, 2 or 4 [1]\n"

#endif /* MKV_TOOLS_MODEL_OPTS_H */
