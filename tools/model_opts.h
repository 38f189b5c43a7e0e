/*
 * model_opts.h — options shared by the commands that run a model or a cache (`bench`,
 * `calibrate`, `generate`, `needle`, `perplexity`, `serve-bench`): the policy, where the
 * forward pass runs, and making a cache sized for a workload.
 */
#ifndef MKV_TOOLS_MODEL_OPTS_H
#define MKV_TOOLS_MODEL_OPTS_H

#include "calib/policy.h"
#include "runner/forward_cuda.h"
#include "runner/model.h"
#include "runner/tokenizer.h"
#include "mixkv.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* The policy: calib/policy.h's value (tools once had their own copy of the struct; the old
 * names stay as aliases). */
typedef mkv_policy_t mkv_policy_opts_t;
static inline void mkv_policy_opts_default(mkv_policy_t *p) { mkv_policy_default(p); }

/* The policy's options, every tool's through one table (tools/model_opts.c), one name per
 * setting: --policy FILE (a policy file, schema mixkv-policy, as `mixkv calibrate` writes;
 * options given explicitly anywhere on the command line win over the file's settings),
 * --hi-format, --lo-format, --alpha-h, --alpha-l, --recent-window (W; not --window, which
 * `perplexity` uses for its text windows), --obs-window, --mix, --group-size (all four sides),
 * --hi-key-group, --hi-value-group, --lo-key-group, --lo-value-group. Tries argv[*i]; returns 1
 * when consumed, 0 when not ours, -1 on a bad value (message printed). Everything the library
 * would refuse later is refused here: group sizes other than 0, 16, 32, 64, 128, 256, and
 * alphas outside 0 <= alpha_l <= alpha_h (that pair is checked when the last --alpha-h /
 * --alpha-l / --policy of the command line is consumed, so callers need no check after their
 * loop). */
int mkv_policy_opts_parse(const char *cmd, int argc, char **argv, int *i, mkv_policy_t *p);

/* The same, with flags: MKV_POLICY_OPTS_ALIASES also accepts the older spellings (`bench`'s
 * --window for --recent-window; docs/cli.md lists them). */
#define MKV_POLICY_OPTS_ALIASES 1u
int mkv_policy_opts_parse_ex(const char *cmd, int argc, char **argv, int *i, mkv_policy_t *p,
                             unsigned flags);

/* The grid setting (calib/grid.h) that the option argv names when `calibrate` gives it a list
 * (--alpha-h, --alpha-l, --recent-window, --hi-format, --lo-format, --group-size), or -1. */
int mkv_policy_opts_is_sweepable(const char *arg);

/* Parses a group size option's value: 0 (default) or 16, 32, 64, 128, 256. -1 with a message. */
int mkv_cli_parse_group(const char *cmd, const char *what, const char *text, int32_t *out);

/* Where the forward pass runs: --backend cpu|cuda, --dtype f32|f16|bf16 (the CUDA pass's
 * weights and activations; the CPU pass is fp32). */
typedef struct mkv_run_opts {
    mkv_backend_t backend;
    mkv_dtype_t dtype;
} mkv_run_opts_t;

/* cpu, f32. */
void mkv_run_opts_default(mkv_run_opts_t *r);

/* Tries argv[*i] against --backend and --dtype: 1 consumed, 0 not ours, -1 bad value (printed). */
int mkv_run_opts_parse(const char *cmd, int argc, char **argv, int *i, mkv_run_opts_t *r);

#define MKV_RUN_OPTS_HELP                                                                      \
    "  --backend B         where the model and its cache run: cpu or cuda [cpu]\n"             \
    "  --dtype T           the CUDA pass's weights and activations: f32, f16, bf16 [f32]\n"

/* The model's forward pass on r's backend for up to max_tokens tokens a call: the CPU pass on
 * `threads` threads (0: one per core), or the CUDA pass in r->dtype. 0, or -1 with the
 * message printed (a CUDA run in a build or on a machine without a GPU, say). */
typedef struct mkv_tools_forward {
    mkv_forward_t fwd;
    mkv_forward_ws_t *ws;
    mkv_cuda_forward_t *cuda;
} mkv_tools_forward_t;
int mkv_tools_forward_create(const char *cmd, const mkv_model_t *model, const mkv_run_opts_t *r,
                             int32_t max_tokens, int32_t threads, mkv_tools_forward_t *out);
void mkv_tools_forward_free(mkv_tools_forward_t *f);

/* A cache on `backend` for `model` in mode fp16 (K16V16, thresholds 0) or mixkv (the policy options),
 * with max_seqs slots of up to max_seq_len tokens, and pool pages for all of them at full
 * length in whichever of the two formats takes more pages (a low format may be the wider one)
 * plus the scheduler's admission margin, times pool_scale (1.0: no pressure). NULL on
 * failure, message printed. */
mkv_cache_t *mkv_tools_make_cache(const char *cmd, const mkv_model_t *model, mkv_backend_t backend,
                                  int fp16, const mkv_policy_t *p, int32_t max_seqs,
                                  int32_t max_seq_len, double pool_scale);

/* How a policy chooses (for a tool's output): "fixed mix" (mix_high or mix_low set: fractions
 * kept high and low by significance rank) or "thresholds" (alpha_h, alpha_l). */
const char *mkv_policy_opts_mode(const mkv_policy_t *p);

/* One line of text: the mode with its fractions or thresholds, the window and the formats
 * ("fixed mix 20% high / 50% low / 30% pruned by significance rank, window 64, K8V4 / K4V2"). */
void mkv_policy_opts_describe(const mkv_policy_t *p, char *buf, size_t n);

/* The policy as a JSON object (mode, formats, alphas, windows, mix, groups). With a cache, the
 * group sizes it resolved (elements per group), else the options' (0: the library's default). */
cJSON *mkv_policy_opts_json(const mkv_policy_t *p, const mkv_cache_t *cache);

/* Whether text encoded for this model starts with BOS: the tokenizer's own setting where it
 * has one (GGUF's add_bos_token), else yes. */
int mkv_tools_add_bos(const mkv_tokenizer_t *tok);

#define MKV_POLICY_OPTS_HELP                                                                   \
    "  --policy FILE       a policy file (from 'mixkv calibrate'); the options below,\n"    \
    "                      given explicitly, win over its settings\n"                      \
    "  --hi-format F       mixkv's high format [K8V4]\n"                                        \
    "  --lo-format F       mixkv's low format [K4V2]\n"                                         \
    "  --alpha-h X         keep high when significance >= X / N [1.0]\n"                        \
    "  --alpha-l X         keep low when significance >= X / N, else prune [0.02]\n"            \
    "  --recent-window N   W: the most recent tokens, always high [64]\n"                       \
    "  --mix H,L           keep these fractions high and low by significance rank instead of\n"\
    "                      the alphas (the fixed mix; either backend) [off]\n"                  \
    "  --obs-window N      prompt significance from the last N queries only (0: all) [0]\n"     \
    "  --group-size N      elements per quantization group, all four sides: 16, 32, 64,\n"    \
    "                      128 or 256 (>= d: the whole vector; 0: the library's default)\n"    \
    "  --hi-key-group N    the same for one side: high format's keys [0: default]\n"           \
    "  --hi-value-group N  high format's values [0: default]\n"                                \
    "  --lo-key-group N    low format's keys [0: default]\n"                                   \
    "  --lo-value-group N  low format's values [0: default]\n"

#endif /* MKV_TOOLS_MODEL_OPTS_H */
