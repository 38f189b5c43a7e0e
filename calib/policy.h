/*
 * policy.h — a compression policy as one value: the two formats, the thresholds, the recent
 * window, the quantization groups and the fixed mix; what `mixkv calibrate` chooses and what
 * every tool takes (`--policy FILE` or one option per field, tools/model_opts.h). A policy is
 * applied to a cache config with mkv_policy_apply and travels between programs as a policy
 * file: JSON, schema "mixkv-policy" (docs/results-schema.md).
 */
#ifndef MKV_CALIB_POLICY_H
#define MKV_CALIB_POLICY_H

#include "runner/model.h"
#include "mixkv.h"

#include <stdint.h>

typedef struct mkv_policy {
    mkv_format_t hi, lo;     /* high and low formats */
    float alpha_h, alpha_l;  /* thresholds: high when score >= alpha_h / N, low when >= alpha_l / N */
    int32_t window;          /* W: the most recent tokens, always high */
    int32_t obs_window;      /* prompt significance from the last obs_window queries (0: all) */
    int32_t hi_key_group, hi_value_group, lo_key_group, lo_value_group; /* elements; 0: default */
    float mix_high, mix_low; /* the fixed mix instead of the thresholds (0, 0: off) */
} mkv_policy_t;

/* The library's defaults (MKV_CACHE_CONFIG_INIT): K8V4 / K4V2, alpha_h 1, alpha_l 0.02, W 64,
 * default groups, no fixed mix. */
void mkv_policy_default(mkv_policy_t *p);

/* Copies p's fields into a cache config (formats, alphas, windows, groups, mix). */
void mkv_policy_apply(const mkv_policy_t *p, mkv_cache_config_t *cfg);

/* The checks the library would make later, made now: 0 <= alpha_l <= alpha_h, group sizes 0,
 * 16, 32, 64, 128 or 256, windows >= 0, the mix in [0, 1] with a sum <= 1. INVALID_ARGUMENT
 * with a message in err (MKV_ERR_LEN) naming the field. */
mkv_status_t mkv_policy_check(const mkv_policy_t *p, char *err);

/* 1 when two policies are the same (every field). */
int mkv_policy_equal(const mkv_policy_t *a, const mkv_policy_t *b);

/* A short text of the fields that differ from the defaults ("alpha_h 2 alpha_l 0.04 W 32"),
 * for labels; "defaults" when none does. */
void mkv_policy_label(const mkv_policy_t *p, char *buf, size_t len);

/* A cache on `backend` for model m: the FP16 paged baseline (fp16 = 1: K16V16, thresholds 0,
 * nothing compressed; p's windows and groups still apply) or policy p, with max_seqs slots of
 * up to max_seq_len tokens and pool pages for all of them at full length in whichever of the
 * two formats takes more pages (a low format may be the wider one), plus the scheduler's
 * admission margin, times pool_scale (1.0: no pressure). The library's status and message
 * (mkv_last_error) on failure. */
mkv_status_t mkv_policy_make_cache(const mkv_model_t *m, mkv_backend_t backend, int fp16,
                                   const mkv_policy_t *p, int32_t max_seqs, int32_t max_seq_len,
                                   double pool_scale, mkv_cache_t **out);

/* mkv_policy_make_cache for rank `rank` of n_ranks of a tensor-parallel run
 * (runner/forward_tp.h): the cache of the rank's n_kv_heads / n_ranks KV heads on CUDA device
 * `rank`, its pool sized the same way for them. n_ranks 1 is mkv_policy_make_cache. */
mkv_status_t mkv_policy_make_cache_rank(const mkv_model_t *m, mkv_backend_t backend, int fp16,
                                        const mkv_policy_t *p, int32_t max_seqs, int32_t max_seq_len,
                                        double pool_scale, int32_t rank, int32_t n_ranks,
                                        mkv_cache_t **out);

/* Where a policy file came from (every field optional: NULL, or NAN for numbers). */
typedef struct mkv_policy_source {
    const char *model;          /* the model it was calibrated for */
    const char *data;           /* the calibration data */
    double memory_ratio;        /* bytes in use / a plain FP16 cache's, on the calibration windows */
    double ppl_increase;        /* relative perplexity increase on the calibration windows */
    double valid_ppl_increase;  /* ... and on the validation windows */
    double valid_memory_ratio;
    double max_ppl_increase;    /* the tolerance it was chosen for */
    /* With needle trials (NAN: none): the fraction answered right on the calibration trials
     * and on the validation trials, and FP16's on the calibration trials. */
    double needle_accuracy, valid_needle_accuracy, needle_accuracy_ref;
} mkv_policy_source_t;

/* Writes a policy file (schema mixkv-policy, version 1); src may be NULL. IO_ERROR with a
 * message in err when the file cannot be written. */
mkv_status_t mkv_policy_save(const char *path, const mkv_policy_t *p, const mkv_policy_source_t *src,
                             char *err);

/* Reads a policy file into *p: members absent from the file keep the library's defaults;
 * unknown members are refused (a misspelt field must not pass silently), as is any value
 * mkv_policy_check refuses. IO_ERROR, PARSE_ERROR or INVALID_ARGUMENT with a message in err
 * naming the file and the member. */
mkv_status_t mkv_policy_load(const char *path, mkv_policy_t *p, char *err);

/* The same from a string (the whole file's text); `name` is used in messages. */
mkv_status_t mkv_policy_parse(const char *text, const char *name, mkv_policy_t *p, char *err);

#endif /* MKV_CALIB_POLICY_H */
