/*
 * model_opts.c — see model_opts.h.
 */
#include "tools/model_opts.h"

#include "tools/cli.h"

#include <string.h>

void mkv_policy_opts_default(mkv_policy_opts_t *p)
{
    const mkv_cache_config_t d = MKV_CACHE_CONFIG_INIT;
    p->hi = d.hi_format;
    p->lo = d.lo_format;
    p->alpha_h = d.alpha_h;
    p->alpha_l = d.alpha_l;
    p->window = d.window;
    p->obs_window = d.obs_window;
    p->hi_key_group = d.hi_key_group;
    p->hi_value_group = d.hi_value_group;
    p->lo_key_group = d.lo_key_group;
    p->lo_value_group = d.lo_value_group;
    p->mix_high = d.mix_high;
    p->mix_low = d.mix_low;
}

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

/* 1 when a later argument is another --alpha-h / --alpha-l (either spelling). */
static int later_alpha(int argc, char **argv, int i)
{
    for (int k = i + 1; k < argc; k++)
        if (strncmp(argv[k], "--alpha-h", 9) == 0 || strncmp(argv[k], "--alpha-l", 9) == 0)
            return 1;
    return 0;
}

/* The library's rule (memmgr/config.c): 0 <= alpha_l <= alpha_h. */
static int alpha_pair_ok(const char *cmd, int argc, char **argv, int i, const mkv_policy_opts_t *p)
{
    if (later_alpha(argc, argv, i) || p->alpha_l <= p->alpha_h) return 1;
    mkv_cli_error(cmd, "--alpha-l %g must not exceed --alpha-h %g (tokens are kept high when "
                       "significance >= alpha_h / N, low when >= alpha_l / N)",
                  (double)p->alpha_l, (double)p->alpha_h);
    return -1;
}

static int format_opt(const char *cmd, const char *text, mkv_format_t *out)
{
    if (mkv_format_from_name(text, out) == MKV_STATUS_OK) return 1;
    mkv_cli_error(cmd, "%s", mkv_last_error());
    return -1;
}

int mkv_policy_opts_parse(const char *cmd, int argc, char **argv, int *i, mkv_policy_opts_t *p)
{
    const char *v;
    double x;
    int m;
    if ((m = mkv_cli_option(cmd, argc, argv, i, "--hi-format", 1, 0, &v)) != 0)
        return m < 0 ? -1 : format_opt(cmd, v, &p->hi);
    if ((m = mkv_cli_option(cmd, argc, argv, i, "--lo-format", 1, 0, &v)) != 0)
        return m < 0 ? -1 : format_opt(cmd, v, &p->lo);
    if ((m = mkv_cli_option(cmd, argc, argv, i, "--alpha-h", 1, 0, &v)) != 0) {
        if (m < 0 || mkv_cli_parse_double(cmd, "--alpha-h", v, 0.0, 1e6, &x) < 0) return -1;
        p->alpha_h = (float)x;
        return alpha_pair_ok(cmd, argc, argv, *i, p);
    }
    if ((m = mkv_cli_option(cmd, argc, argv, i, "--alpha-l", 1, 0, &v)) != 0) {
        if (m < 0 || mkv_cli_parse_double(cmd, "--alpha-l", v, 0.0, 1e6, &x) < 0) return -1;
        p->alpha_l = (float)x;
        return alpha_pair_ok(cmd, argc, argv, *i, p);
    }
    if ((m = mkv_cli_option(cmd, argc, argv, i, "--recent-window", 1, 0, &v)) != 0)
        return m < 0 || mkv_cli_parse_i32(cmd, "--recent-window", v, 0, 1 << 20, &p->window) < 0 ? -1 : 1;
    if ((m = mkv_cli_option(cmd, argc, argv, i, "--mix", 1, 0, &v)) != 0) {
        if (m < 0) return -1;
        double h, l;
        char extra;
        if (sscanf(v, "%lf,%lf%c", &h, &l, &extra) != 2 || !(h >= 0 && l >= 0 && h + l <= 1.0 + 1e-9)) {
            mkv_cli_error(cmd, "--mix: '%s' is not H,L with H, L >= 0 and H + L <= 1", v);
            return -1;
        }
        p->mix_high = (float)h, p->mix_low = (float)l;
        return 1;
    }
    if ((m = mkv_cli_option(cmd, argc, argv, i, "--obs-window", 1, 0, &v)) != 0)
        return m < 0 || mkv_cli_parse_i32(cmd, "--obs-window", v, 0, 1 << 20, &p->obs_window) < 0 ? -1 : 1;
    if ((m = mkv_cli_option(cmd, argc, argv, i, "--group-size", 1, 0, &v)) != 0) {
        int32_t e;
        if (m < 0 || mkv_cli_parse_group(cmd, "--group-size", v, &e) < 0) return -1;
        p->hi_key_group = p->hi_value_group = p->lo_key_group = p->lo_value_group = e;
        return 1;
    }
    static const char *const names[4] = {"--hi-key-group", "--hi-value-group", "--lo-key-group",
                                         "--lo-value-group"};
    int32_t *const fields[4] = {&p->hi_key_group, &p->hi_value_group, &p->lo_key_group,
                                &p->lo_value_group};
    for (int k = 0; k < 4; k++)
        if ((m = mkv_cli_option(cmd, argc, argv, i, names[k], 1, 0, &v)) != 0)
            return m < 0 || mkv_cli_parse_group(cmd, names[k], v, fields[k]) < 0 ? -1 : 1;
    return 0;
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

mkv_cache_t *mkv_tools_make_cache(const char *cmd, const mkv_model_t *model, mkv_backend_t backend,
                                  int fp16, const mkv_policy_opts_t *p, int32_t max_seqs,
                                  int32_t max_seq_len, double pool_scale)
{
    mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, cfg;
    base.backend = backend;
    base.hi_format = fp16 ? MKV_FORMAT_K16V16 : p->hi;
    base.lo_format = fp16 ? MKV_FORMAT_K16V16 : p->lo;
    base.alpha_h = fp16 ? 0.0f : p->alpha_h;
    base.alpha_l = fp16 ? 0.0f : p->alpha_l;
    base.mix_high = fp16 ? 0.0f : p->mix_high;
    base.mix_low = fp16 ? 0.0f : p->mix_low;
    base.window = p->window;
    base.obs_window = p->obs_window;
    base.hi_key_group = p->hi_key_group;
    base.hi_value_group = p->hi_value_group;
    base.lo_key_group = p->lo_key_group;
    base.lo_value_group = p->lo_value_group;
    base.max_seqs = max_seqs;
    base.max_seq_len = max_seq_len;
    mkv_model_cache_config(model, &base, &cfg);
    int32_t tpp, tpp_lo;
    int64_t page_bytes;
    if (mkv_page_bytes_for(cfg.hi_format, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group, 32,
                           &page_bytes) != MKV_STATUS_OK ||
        mkv_tokens_per_page(cfg.hi_format, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group,
                            page_bytes, &tpp) != MKV_STATUS_OK ||
        mkv_tokens_per_page(cfg.lo_format, cfg.head_dim, cfg.lo_key_group, cfg.lo_value_group,
                            page_bytes, &tpp_lo) != MKV_STATUS_OK) {
        mkv_cli_error(cmd, "%s", mkv_last_error());
        return NULL;
    }
    /* A low format wider than the high one (K4V2 / K16V16) takes more pages per token: size
     * for whichever takes more, or demotions run out of pages midway. */
    if (tpp_lo < tpp) tpp = tpp_lo;
    /* Per head-region: every token in the wider format, plus the scheduler's admission margin
     * (the prompt's extra page and two pages of headroom for the next step) and a low page. */
    const double full = (double)max_seqs * cfg.n_layers * cfg.n_kv_heads *
                        ((cfg.max_seq_len + tpp - 1) / tpp + 4);
    cfg.pool_pages = (int64_t)(full * pool_scale) + 1;
    mkv_cache_t *c = NULL;
    if (mkv_cache_create(&cfg, &c) != MKV_STATUS_OK) {
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
