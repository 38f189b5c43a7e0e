/*
 * model_opts.c — see model_opts.h.
 */
#include "tools/model_opts.h"

#include "calib/grid.h"
#include "tools/cli.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

int mkv_cli_parse_group(const char *cmd, const char *what, const char *text, int32_t *out)
{
    int32_t v;
    if (mkv_cli_parse_i32(cmd, what, text, 0, 256, &v) < 0) return -1;
    if (v != 0 && v != 16 && v != 32 && v != 64 && v != 128 && v != 256) {
        mkv_cli_error(cmd, "%s: %d elements per quantization group is not supported (16, 32, "
                           "64, 128 or 256; 0: the library's default)", what, v);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The policy's options: one table, one name per setting                                    */
/* ---------------------------------------------------------------------------------------- */

/* The fields of mkv_policy_t an option sets, as bits (for --policy: explicit options win). */
enum {
    F_HI = 1 << 0, F_LO = 1 << 1, F_AH = 1 << 2, F_AL = 1 << 3, F_W = 1 << 4, F_OBS = 1 << 5,
    F_HKG = 1 << 6, F_HVG = 1 << 7, F_LKG = 1 << 8, F_LVG = 1 << 9, F_MIXH = 1 << 10,
    F_MIXL = 1 << 11,
    F_GROUPS = F_HKG | F_HVG | F_LKG | F_LVG,
};

typedef enum { K_FILE, K_FORMAT, K_ALPHA, K_COUNT, K_GROUP, K_GROUPS, K_MIX } opt_kind_t;

typedef struct policy_opt {
    const char *name;
    const char *alias;   /* an older spelling, accepted with MKV_POLICY_OPTS_ALIASES (or NULL) */
    opt_kind_t kind;
    size_t offset;       /* the field (one-field kinds) */
    unsigned fields;     /* F_* bits it sets */
} policy_opt_t;

#define FIELD(f) offsetof(mkv_policy_t, f)
static const policy_opt_t g_opts[] = {
    {"--policy", NULL, K_FILE, 0, 0},
    {"--hi-format", NULL, K_FORMAT, FIELD(hi), F_HI},
    {"--lo-format", NULL, K_FORMAT, FIELD(lo), F_LO},
    {"--alpha-h", NULL, K_ALPHA, FIELD(alpha_h), F_AH},
    {"--alpha-l", NULL, K_ALPHA, FIELD(alpha_l), F_AL},
    {"--recent-window", "--window", K_COUNT, FIELD(window), F_W},
    {"--obs-window", NULL, K_COUNT, FIELD(obs_window), F_OBS},
    {"--mix", NULL, K_MIX, 0, F_MIXH | F_MIXL},
    {"--group-size", NULL, K_GROUPS, 0, F_GROUPS},
    {"--hi-key-group", NULL, K_GROUP, FIELD(hi_key_group), F_HKG},
    {"--hi-value-group", NULL, K_GROUP, FIELD(hi_value_group), F_HVG},
    {"--lo-key-group", NULL, K_GROUP, FIELD(lo_key_group), F_LKG},
    {"--lo-value-group", NULL, K_GROUP, FIELD(lo_value_group), F_LVG},
};
#undef FIELD
#define N_OPTS (sizeof g_opts / sizeof g_opts[0])

/* 1 when arg spells option o ("--alpha-h" or "--alpha-h=..."; the alias only with flags). */
static int spells(const policy_opt_t *o, const char *arg, unsigned flags)
{
    const char *names[2] = {o->name, (flags & MKV_POLICY_OPTS_ALIASES) ? o->alias : NULL};
    for (int k = 0; k < 2; k++) {
        if (!names[k]) continue;
        const size_t n = strlen(names[k]);
        if (strncmp(arg, names[k], n) == 0 && (arg[n] == '\0' || arg[n] == '=')) return 1;
    }
    return 0;
}

/* The F_* bits that the options of argv other than --policy set (explicit settings). */
static unsigned explicit_fields(int argc, char **argv, unsigned flags)
{
    unsigned set = 0;
    for (int k = 1; k < argc; k++)
        for (size_t e = 1; e < N_OPTS; e++)
            if (spells(&g_opts[e], argv[k], flags)) set |= g_opts[e].fields;
    return set;
}

/* 1 when an argument after i sets an alpha (directly or through a policy file). */
static int later_alpha(int argc, char **argv, int i, unsigned flags)
{
    for (int k = i + 1; k < argc; k++)
        if (spells(&g_opts[0], argv[k], flags) || spells(&g_opts[3], argv[k], flags) ||
            spells(&g_opts[4], argv[k], flags))
            return 1;
    return 0;
}

/* The library's rule (memmgr/config.c): 0 <= alpha_l <= alpha_h, checked on the final values. */
static int alpha_pair_ok(const char *cmd, int argc, char **argv, int i, unsigned flags,
                         const mkv_policy_t *p)
{
    if (later_alpha(argc, argv, i, flags) || p->alpha_l <= p->alpha_h) return 1;
    mkv_cli_error(cmd, "--alpha-l %g must not exceed --alpha-h %g (tokens are kept high when "
                       "significance >= alpha_h / N, low when >= alpha_l / N)",
                  (double)p->alpha_l, (double)p->alpha_h);
    return -1;
}

/* --policy FILE: the file's settings, except those given explicitly anywhere on the command
 * line (before or after it), which win. */
static int load_policy_file(const char *cmd, int argc, char **argv, int i, unsigned flags,
                            const char *path, mkv_policy_t *p)
{
    char err[MKV_ERR_LEN];
    mkv_policy_t f;
    if (mkv_policy_load(path, &f, err) != MKV_STATUS_OK) {
        mkv_cli_error(cmd, "--policy: %s", err);
        return -1;
    }
    const unsigned keep = explicit_fields(argc, argv, flags);
#define TAKE(bit, field)                                                                       \
    if (!(keep & (bit))) p->field = f.field;
    TAKE(F_HI, hi) TAKE(F_LO, lo) TAKE(F_AH, alpha_h) TAKE(F_AL, alpha_l) TAKE(F_W, window)
    TAKE(F_OBS, obs_window) TAKE(F_HKG, hi_key_group) TAKE(F_HVG, hi_value_group)
    TAKE(F_LKG, lo_key_group) TAKE(F_LVG, lo_value_group) TAKE(F_MIXH, mix_high)
    TAKE(F_MIXL, mix_low)
#undef TAKE
    return alpha_pair_ok(cmd, argc, argv, i, flags, p);
}

/* Sets option o's field(s) in p from the text v; 1, or -1 with a message. */
static int set_opt(const char *cmd, int argc, char **argv, int i, unsigned flags,
                   const policy_opt_t *o, const char *v, mkv_policy_t *p)
{
    char *field = (char *)p + o->offset;
    double x;
    int32_t n;
    switch (o->kind) {
    case K_FILE:
        return load_policy_file(cmd, argc, argv, i, flags, v, p) < 0 ? -1 : 1;
    case K_FORMAT: {
        mkv_format_t f;
        if (mkv_format_from_name(v, &f) != MKV_STATUS_OK) {
            mkv_cli_error(cmd, "%s", mkv_last_error());
            return -1;
        }
        memcpy(field, &f, sizeof f);
        return 1;
    }
    case K_ALPHA: {
        if (mkv_cli_parse_double(cmd, o->name, v, 0.0, 1e6, &x) < 0) return -1;
        const float a = (float)x;
        memcpy(field, &a, sizeof a);
        return alpha_pair_ok(cmd, argc, argv, i, flags, p);
    }
    case K_COUNT:
        if (mkv_cli_parse_i32(cmd, o->name, v, 0, 1 << 20, &n) < 0) return -1;
        memcpy(field, &n, sizeof n);
        return 1;
    case K_GROUP:
        if (mkv_cli_parse_group(cmd, o->name, v, &n) < 0) return -1;
        memcpy(field, &n, sizeof n);
        return 1;
    case K_GROUPS:
        if (mkv_cli_parse_group(cmd, o->name, v, &n) < 0) return -1;
        p->hi_key_group = p->hi_value_group = p->lo_key_group = p->lo_value_group = n;
        return 1;
    case K_MIX: {
        double h, l;
        char extra;
        if (sscanf(v, "%lf,%lf%c", &h, &l, &extra) != 2 || !(h >= 0 && l >= 0 && h + l <= 1.0 + 1e-9)) {
            mkv_cli_error(cmd, "--mix: '%s' is not H,L with H, L >= 0 and H + L <= 1", v);
            return -1;
        }
        p->mix_high = (float)h, p->mix_low = (float)l;
        return 1;
    }
    }
    return -1;
}

int mkv_policy_opts_parse_ex(const char *cmd, int argc, char **argv, int *i, mkv_policy_t *p,
                             unsigned flags)
{
    for (size_t e = 0; e < N_OPTS; e++) {
        const policy_opt_t *o = &g_opts[e];
        if (!spells(o, argv[*i], flags)) continue;
        /* Matched by spells(): read the value under whichever spelling was used. */
        const char *v;
        const char *name = strncmp(argv[*i], o->name, strlen(o->name)) == 0 ? o->name : o->alias;
        if (mkv_cli_option(cmd, argc, argv, i, name, 1, 0, &v) < 0) return -1;
        return set_opt(cmd, argc, argv, *i, flags, o, v, p);
    }
    return 0;
}

int mkv_policy_opts_parse(const char *cmd, int argc, char **argv, int *i, mkv_policy_t *p)
{
    return mkv_policy_opts_parse_ex(cmd, argc, argv, i, p, 0);
}

int mkv_policy_opts_is_sweepable(const char *arg)
{
    for (int s = 0; s < MKV_CALIB_SETTINGS; s++) {
        char name[40];
        snprintf(name, sizeof name, "--%s", mkv_calib_setting_name((mkv_calib_setting_t)s));
        const size_t n = strlen(name);
        if (strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=')) return s;
    }
    return -1;
}

void mkv_run_opts_default(mkv_run_opts_t *r)
{
    r->backend = MKV_BACKEND_CPU;
    r->dtype = MKV_DTYPE_F32;
}

int mkv_run_opts_parse(const char *cmd, int argc, char **argv, int *i, mkv_run_opts_t *r)
{
    const char *v;
    int m;
    if ((m = mkv_cli_option(cmd, argc, argv, i, "--backend", 1, 0, &v)) != 0) {
        if (m < 0) return -1;
        if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
            mkv_cli_error(cmd, "--backend: '%s' is not cpu or cuda", v);
            return -1;
        }
        r->backend = strcmp(v, "cpu") ? MKV_BACKEND_CUDA : MKV_BACKEND_CPU;
        return 1;
    }
    if ((m = mkv_cli_option(cmd, argc, argv, i, "--dtype", 1, 0, &v)) != 0) {
        if (m < 0) return -1;
        if (!strcmp(v, "f32")) r->dtype = MKV_DTYPE_F32;
        else if (!strcmp(v, "f16")) r->dtype = MKV_DTYPE_F16;
        else if (!strcmp(v, "bf16")) r->dtype = MKV_DTYPE_BF16;
        else {
            mkv_cli_error(cmd, "--dtype: '%s' is not f32, f16 or bf16", v);
            return -1;
        }
        return 1;
    }
    return 0;
}

int mkv_tools_forward_create(const char *cmd, const mkv_model_t *model, const mkv_run_opts_t *r,
                             int32_t max_tokens, int32_t threads, mkv_tools_forward_t *out)
{
    char err[MKV_ERR_LEN];
    memset(out, 0, sizeof *out);
    if (r->backend == MKV_BACKEND_CUDA) {
        if (mkv_cuda_forward_create(model, max_tokens, r->dtype, &out->cuda, err) != MKV_STATUS_OK) {
            mkv_cli_error(cmd, "--backend cuda: %s", err);
            return -1;
        }
        out->fwd = mkv_cuda_forward(out->cuda);
        return 0;
    }
    if (mkv_forward_ws_create(model, max_tokens, &out->ws, err) != MKV_STATUS_OK) {
        mkv_cli_error(cmd, "%s", err);
        return -1;
    }
    if (threads > 0 && mkv_forward_ws_set_threads(out->ws, threads) != MKV_STATUS_OK) {
        mkv_cli_error(cmd, "cannot use %d threads", threads);
        mkv_tools_forward_free(out);
        return -1;
    }
    out->fwd = mkv_model_forward(out->ws);
    return 0;
}

void mkv_tools_forward_free(mkv_tools_forward_t *f)
{
    mkv_forward_ws_free(f->ws);
    mkv_cuda_forward_free(f->cuda);
    memset(f, 0, sizeof *f);
}

const char *mkv_policy_opts_mode(const mkv_policy_t *p)
{
    return p->mix_high > 0.0f || p->mix_low > 0.0f ? "fixed mix" : "thresholds";
}

void mkv_policy_opts_describe(const mkv_policy_t *p, char *buf, size_t n)
{
    if (p->mix_high > 0.0f || p->mix_low > 0.0f) {
        const double pruned = 100.0 * (1.0 - (double)p->mix_high - (double)p->mix_low);
        snprintf(buf, n, "fixed mix %.4g%% high / %.4g%% low / %.4g%% pruned by significance rank, window %d, %s / %s",
                 100.0 * p->mix_high, 100.0 * p->mix_low, pruned < 0.0 ? 0.0 : pruned, p->window,
                 mkv_format_name(p->hi), mkv_format_name(p->lo));
    } else {
        snprintf(buf, n, "thresholds alpha_h %g / alpha_l %g, window %d, %s / %s", p->alpha_h, p->alpha_l, p->window,
                 mkv_format_name(p->hi), mkv_format_name(p->lo));
    }
}

cJSON *mkv_policy_opts_json(const mkv_policy_t *p, const mkv_cache_t *cache)
{
    cJSON *pol = cJSON_CreateObject();
    cJSON_AddStringToObject(pol, "mode", p->mix_high > 0.0f || p->mix_low > 0.0f ? "fixed_mix" : "thresholds");
    mkv_cache_info_t info;
    if (cache && mkv_cache_info(cache, &info) == MKV_STATUS_OK) {
        cJSON_AddNumberToObject(pol, "hi_key_group", info.config.hi_key_group);
        cJSON_AddNumberToObject(pol, "hi_value_group", info.config.hi_value_group);
        cJSON_AddNumberToObject(pol, "lo_key_group", info.config.lo_key_group);
        cJSON_AddNumberToObject(pol, "lo_value_group", info.config.lo_value_group);
    } else {
        cJSON_AddNumberToObject(pol, "hi_key_group", p->hi_key_group);
        cJSON_AddNumberToObject(pol, "hi_value_group", p->hi_value_group);
        cJSON_AddNumberToObject(pol, "lo_key_group", p->lo_key_group);
        cJSON_AddNumberToObject(pol, "lo_value_group", p->lo_value_group);
    }
    cJSON_AddStringToObject(pol, "hi_format", mkv_format_name(p->hi));
    cJSON_AddStringToObject(pol, "lo_format", mkv_format_name(p->lo));
    cJSON_AddNumberToObject(pol, "alpha_h", p->alpha_h);
    cJSON_AddNumberToObject(pol, "alpha_l", p->alpha_l);
    cJSON_AddNumberToObject(pol, "window", p->window);
    cJSON_AddNumberToObject(pol, "obs_window", p->obs_window);
    if (p->mix_high > 0.0f || p->mix_low > 0.0f) {
        cJSON_AddNumberToObject(pol, "mix_high", p->mix_high);
        cJSON_AddNumberToObject(pol, "mix_low", p->mix_low);
    }
    return pol;
}

mkv_cache_t *mkv_tools_make_cache(const char *cmd, const mkv_model_t *model, mkv_backend_t backend,
                                  int fp16, const mkv_policy_t *p, int32_t max_seqs,
                                  int32_t max_seq_len, double pool_scale)
{
    mkv_cache_t *c = NULL;
    if (mkv_policy_make_cache(model, backend, fp16, p, max_seqs, max_seq_len, pool_scale, &c) !=
        MKV_STATUS_OK) {
        mkv_cli_error(cmd, "cannot create the %s cache: %s", fp16 ? "fp16" : "mixkv", mkv_last_error());
        return NULL;
    }
    return c;
}

int mkv_tools_add_bos(const mkv_tokenizer_t *tok)
{
    const int b = mkv_tokenizer_add_bos(tok);
    return b >= 0 ? b : 1;
}
