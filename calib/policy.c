/*
 * policy.c — policies as values and policy files (see policy.h).
 */
#include "calib/policy.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHEMA "mixkv-policy"
#define SCHEMA_VERSION 1

void mkv_policy_default(mkv_policy_t *p)
{
    const mkv_cache_config_t d = MKV_CACHE_CONFIG_INIT;
    memset(p, 0, sizeof *p);
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

void mkv_policy_apply(const mkv_policy_t *p, mkv_cache_config_t *cfg)
{
    cfg->hi_format = p->hi;
    cfg->lo_format = p->lo;
    cfg->alpha_h = p->alpha_h;
    cfg->alpha_l = p->alpha_l;
    cfg->window = p->window;
    cfg->obs_window = p->obs_window;
    cfg->hi_key_group = p->hi_key_group;
    cfg->hi_value_group = p->hi_value_group;
    cfg->lo_key_group = p->lo_key_group;
    cfg->lo_value_group = p->lo_value_group;
    cfg->mix_high = p->mix_high;
    cfg->mix_low = p->mix_low;
}

mkv_status_t mkv_policy_make_cache(const mkv_model_t *m, mkv_backend_t backend, int fp16,
                                   const mkv_policy_t *p, int32_t max_seqs, int32_t max_seq_len,
                                   double pool_scale, mkv_cache_t **out)
{
    return mkv_policy_make_cache_rank(m, backend, fp16, p, max_seqs, max_seq_len, pool_scale, 0, 1, out);
}

mkv_status_t mkv_policy_make_cache_rank(const mkv_model_t *m, mkv_backend_t backend, int fp16,
                                        const mkv_policy_t *p, int32_t max_seqs, int32_t max_seq_len,
                                        double pool_scale, int32_t rank, int32_t n_ranks,
                                        mkv_cache_t **out)
{
    mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, cfg;
    mkv_policy_apply(p, &base);
    if (fp16) {
        base.hi_format = base.lo_format = MKV_FORMAT_K16V16;
        base.alpha_h = base.alpha_l = 0.0f;
        base.mix_high = base.mix_low = 0.0f;
    }
    base.backend = backend;
    base.max_seqs = max_seqs;
    base.max_seq_len = max_seq_len;
    mkv_model_cache_config(m, &base, &cfg);
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks || cfg.n_kv_heads % n_ranks)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "rank %d of %d ranks (dividing %d KV heads)", rank,
                                n_ranks, cfg.n_kv_heads);
    if (n_ranks > 1) {
        cfg.n_kv_heads /= n_ranks;
        cfg.device_id = rank;
    }
    int32_t tpp, tpp_lo;
    int64_t page_bytes;
    mkv_status_t st;
    if ((st = mkv_page_bytes_for(cfg.hi_format, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group,
                                 32, &page_bytes)) != MKV_STATUS_OK ||
        (st = mkv_tokens_per_page(cfg.hi_format, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group,
                                  page_bytes, &tpp)) != MKV_STATUS_OK ||
        (st = mkv_tokens_per_page(cfg.lo_format, cfg.head_dim, cfg.lo_key_group, cfg.lo_value_group,
                                  page_bytes, &tpp_lo)) != MKV_STATUS_OK)
        return st;
    /* A low format wider than the high one (K4V2 / K16V16) takes more pages per token: size
     * for whichever takes more, or demotions run out of pages midway. */
    if (tpp_lo < tpp) tpp = tpp_lo;
    /* Per head-region: every token in the wider format, plus the scheduler's admission margin
     * (the prompt's extra page and two pages of headroom for the next step) and a low page. */
    const double full = (double)max_seqs * cfg.n_layers * cfg.n_kv_heads *
                        ((cfg.max_seq_len + tpp - 1) / tpp + 4);
    cfg.pool_pages = (int64_t)(full * pool_scale) + 1;
    return mkv_cache_create(&cfg, out);
}

static int group_ok(int32_t g)
{
    return g == 0 || g == 16 || g == 32 || g == 64 || g == 128 || g == 256;
}

mkv_status_t mkv_policy_check(const mkv_policy_t *p, char *err)
{
#define BAD(...)                                                                               \
    do {                                                                                       \
        snprintf(err, MKV_ERR_LEN, __VA_ARGS__);                                               \
        return MKV_STATUS_INVALID_ARGUMENT;                                                    \
    } while (0)
    if (!(p->alpha_h >= 0.0f) || !isfinite(p->alpha_h)) BAD("alpha_h %g: need a finite value >= 0", (double)p->alpha_h);
    if (!(p->alpha_l >= 0.0f) || !isfinite(p->alpha_l)) BAD("alpha_l %g: need a finite value >= 0", (double)p->alpha_l);
    if (p->alpha_l > p->alpha_h)
        BAD("alpha_l %g must not exceed alpha_h %g (tokens are kept high when significance >= "
            "alpha_h / N, low when >= alpha_l / N)", (double)p->alpha_l, (double)p->alpha_h);
    if (p->window < 0) BAD("recent window %d: need >= 0", p->window);
    if (p->obs_window < 0) BAD("obs_window %d: need >= 0", p->obs_window);
    const int32_t g[4] = {p->hi_key_group, p->hi_value_group, p->lo_key_group, p->lo_value_group};
    static const char *const gn[4] = {"hi_key_group", "hi_value_group", "lo_key_group", "lo_value_group"};
    for (int k = 0; k < 4; k++)
        if (!group_ok(g[k]))
            BAD("%s: %d elements per quantization group is not supported (16, 32, 64, 128 or "
                "256; 0: the library's default)", gn[k], g[k]);
    if (!(p->mix_high >= 0.0f && p->mix_low >= 0.0f && p->mix_high + p->mix_low <= 1.0f + 1e-6f))
        BAD("mix %g,%g: need fractions >= 0 with a sum <= 1", (double)p->mix_high, (double)p->mix_low);
    if (mkv_format_name(p->hi)[0] == '?' || mkv_format_name(p->lo)[0] == '?') BAD("unknown format");
#undef BAD
    return MKV_STATUS_OK;
}

int mkv_policy_equal(const mkv_policy_t *a, const mkv_policy_t *b)
{
    return a->hi == b->hi && a->lo == b->lo && a->alpha_h == b->alpha_h && a->alpha_l == b->alpha_l &&
           a->window == b->window && a->obs_window == b->obs_window &&
           a->hi_key_group == b->hi_key_group && a->hi_value_group == b->hi_value_group &&
           a->lo_key_group == b->lo_key_group && a->lo_value_group == b->lo_value_group &&
           a->mix_high == b->mix_high && a->mix_low == b->mix_low;
}

/* The shortest decimal text that reads back as the same float (0.02f prints "0.02", not
 * 0.0199999995529651641845703125 as a double would). */
static void float_text(float v, char *buf, size_t len)
{
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, len, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) return;
    }
}

void mkv_policy_label(const mkv_policy_t *p, char *buf, size_t len)
{
    char a[32], b[32];
    float_text(p->alpha_h, a, sizeof a);
    float_text(p->alpha_l, b, sizeof b);
    int n = snprintf(buf, len, "alpha_h %s alpha_l %s", a, b);
    mkv_policy_t d;
    mkv_policy_default(&d);
#define MORE(...)                                                                              \
    do {                                                                                       \
        if (n >= 0 && (size_t)n < len) n += snprintf(buf + n, len - (size_t)n, __VA_ARGS__);  \
    } while (0)
    if (p->window != d.window) MORE(" W %d", p->window);
    if (p->hi != d.hi || p->lo != d.lo) MORE(" %s/%s", mkv_format_name(p->hi), mkv_format_name(p->lo));
    if (p->hi_key_group || p->hi_value_group || p->lo_key_group || p->lo_value_group) {
        if (p->hi_key_group == p->hi_value_group && p->hi_key_group == p->lo_key_group &&
            p->hi_key_group == p->lo_value_group)
            MORE(" groups %d", p->hi_key_group);
        else
            MORE(" groups %d/%d/%d/%d", p->hi_key_group, p->hi_value_group, p->lo_key_group,
                 p->lo_value_group);
    }
    if (p->obs_window != d.obs_window) MORE(" obs %d", p->obs_window);
    if (p->mix_high > 0.0f || p->mix_low > 0.0f) MORE(" mix %g,%g", (double)p->mix_high, (double)p->mix_low);
#undef MORE
}

static void add_float(cJSON *o, const char *key, float v)
{
    char t[32];
    float_text(v, t, sizeof t);
    cJSON_AddRawToObject(o, key, t);
}

static void add_opt(cJSON *o, const char *key, double v)
{
    if (!isnan(v)) cJSON_AddNumberToObject(o, key, v);
}

void mkv_policy_to_json(const mkv_policy_t *p, cJSON *o)
{
    cJSON_AddStringToObject(o, "hi_format", mkv_format_name(p->hi));
    cJSON_AddStringToObject(o, "lo_format", mkv_format_name(p->lo));
    add_float(o, "alpha_h", p->alpha_h);
    add_float(o, "alpha_l", p->alpha_l);
    cJSON_AddNumberToObject(o, "recent_window", p->window);
    cJSON_AddNumberToObject(o, "obs_window", p->obs_window);
    cJSON_AddNumberToObject(o, "hi_key_group", p->hi_key_group);
    cJSON_AddNumberToObject(o, "hi_value_group", p->hi_value_group);
    cJSON_AddNumberToObject(o, "lo_key_group", p->lo_key_group);
    cJSON_AddNumberToObject(o, "lo_value_group", p->lo_value_group);
    add_float(o, "mix_high", p->mix_high);
    add_float(o, "mix_low", p->mix_low);
}

mkv_status_t mkv_policy_save(const char *path, const mkv_policy_t *p, const mkv_policy_source_t *src,
                             char *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "schema", SCHEMA);
    cJSON_AddNumberToObject(root, "schema_version", SCHEMA_VERSION);
    mkv_policy_to_json(p, root);
    if (src) {
        cJSON *s = cJSON_AddObjectToObject(root, "source");
        if (src->model) cJSON_AddStringToObject(s, "model", src->model);
        if (src->data) cJSON_AddStringToObject(s, "data", src->data);
        add_opt(s, "max_ppl_increase", src->max_ppl_increase);
        add_opt(s, "memory_ratio", src->memory_ratio);
        add_opt(s, "ppl_increase", src->ppl_increase);
        add_opt(s, "validation_memory_ratio", src->valid_memory_ratio);
        add_opt(s, "validation_ppl_increase", src->valid_ppl_increase);
        add_opt(s, "needle_accuracy", src->needle_accuracy);
        add_opt(s, "validation_needle_accuracy", src->valid_needle_accuracy);
        add_opt(s, "needle_accuracy_fp16", src->needle_accuracy_ref);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) {
        snprintf(err, MKV_ERR_LEN, "out of memory formatting the policy");
        return MKV_STATUS_OUT_OF_MEMORY;
    }
    FILE *f = fopen(path, "w");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f) ok = fclose(f) == 0 && ok;
    cJSON_free(text);
    if (!ok) {
        snprintf(err, MKV_ERR_LEN, "cannot write the policy file '%s': %s", path, strerror(errno));
        return MKV_STATUS_IO_ERROR;
    }
    return MKV_STATUS_OK;
}

/* The members a policy file may hold. */
typedef enum { F_FORMAT, F_FLOAT, F_INT } kind_t;
typedef struct member {
    const char *name;
    kind_t kind;
    size_t offset;
} member_t;

#define M(name, kind, field) {name, kind, offsetof(mkv_policy_t, field)}
static const member_t g_members[] = {
    M("hi_format", F_FORMAT, hi),         M("lo_format", F_FORMAT, lo),
    M("alpha_h", F_FLOAT, alpha_h),       M("alpha_l", F_FLOAT, alpha_l),
    M("recent_window", F_INT, window),    M("obs_window", F_INT, obs_window),
    M("hi_key_group", F_INT, hi_key_group), M("hi_value_group", F_INT, hi_value_group),
    M("lo_key_group", F_INT, lo_key_group), M("lo_value_group", F_INT, lo_value_group),
    M("mix_high", F_FLOAT, mix_high),     M("mix_low", F_FLOAT, mix_low),
};
#undef M
#define N_MEMBERS (sizeof g_members / sizeof g_members[0])

mkv_status_t mkv_policy_from_json(const cJSON *obj, const char *name, mkv_policy_t *out, char *err)
{
    mkv_policy_t p;
    mkv_policy_default(&p);
    if (!cJSON_IsObject(obj)) {
        snprintf(err, MKV_ERR_LEN, "%s: a policy is a JSON object", name);
        return MKV_STATUS_PARSE_ERROR;
    }
    for (const cJSON *it = obj->child; it; it = it->next) {
        if (!strcmp(it->string, "schema") || !strcmp(it->string, "schema_version") ||
            !strcmp(it->string, "source"))
            continue;
        const member_t *m = NULL;
        for (size_t k = 0; k < N_MEMBERS && !m; k++)
            if (!strcmp(g_members[k].name, it->string)) m = &g_members[k];
        if (!m) {
            snprintf(err, MKV_ERR_LEN, "%s: unknown member \"%s\"", name, it->string);
            return MKV_STATUS_PARSE_ERROR;
        }
        char *field = (char *)&p + m->offset;
        if (m->kind == F_FORMAT) {
            mkv_format_t f;
            if (!cJSON_IsString(it) || mkv_format_from_name(it->valuestring, &f) != MKV_STATUS_OK) {
                snprintf(err, MKV_ERR_LEN, "%s: \"%s\" is not a format name (K8V4, K4V2, ...)", name,
                         it->string);
                return MKV_STATUS_PARSE_ERROR;
            }
            memcpy(field, &f, sizeof f);
        } else if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) {
            snprintf(err, MKV_ERR_LEN, "%s: \"%s\" is not a number", name, it->string);
            return MKV_STATUS_PARSE_ERROR;
        } else if (m->kind == F_FLOAT) {
            const float v = (float)it->valuedouble;
            memcpy(field, &v, sizeof v);
        } else {
            const double v = it->valuedouble;
            if (v != floor(v) || v < 0 || v > (1 << 30)) {
                snprintf(err, MKV_ERR_LEN, "%s: \"%s\" %g is not a whole number in [0, 2^30]", name,
                         it->string, v);
                return MKV_STATUS_PARSE_ERROR;
            }
            const int32_t iv = (int32_t)v;
            memcpy(field, &iv, sizeof iv);
        }
    }
    char why[MKV_ERR_LEN];
    if (mkv_policy_check(&p, why) != MKV_STATUS_OK) {
        snprintf(err, MKV_ERR_LEN, "%s: %.400s", name, why);
        return MKV_STATUS_INVALID_ARGUMENT;
    }
    *out = p;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_policy_parse(const char *text, const char *name, mkv_policy_t *out, char *err)
{
    mkv_status_t st = MKV_STATUS_PARSE_ERROR;
    cJSON *root = cJSON_Parse(text);
    if (!cJSON_IsObject(root)) {
        snprintf(err, MKV_ERR_LEN, "%s: not a JSON object (a policy file, schema %s)", name, SCHEMA);
        goto done;
    }
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(root, "schema");
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "schema_version");
    if (!cJSON_IsString(schema) || strcmp(schema->valuestring, SCHEMA) != 0) {
        snprintf(err, MKV_ERR_LEN, "%s: not a policy file (\"schema\" is not \"%s\")", name, SCHEMA);
        goto done;
    }
    if (!cJSON_IsNumber(version) || version->valuedouble != SCHEMA_VERSION) {
        snprintf(err, MKV_ERR_LEN, "%s: policy file version %g; this mixkv reads version %d", name,
                 cJSON_IsNumber(version) ? version->valuedouble : -1.0, SCHEMA_VERSION);
        goto done;
    }
    st = mkv_policy_from_json(root, name, out, err);
done:
    cJSON_Delete(root);
    return st;
}

mkv_status_t mkv_policy_load(const char *path, mkv_policy_t *p, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, MKV_ERR_LEN, "cannot open the policy file '%s': %s", path, strerror(errno));
        return MKV_STATUS_IO_ERROR;
    }
    char buf[1 << 16];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    const int big = !feof(f);
    fclose(f);
    if (big) {
        snprintf(err, MKV_ERR_LEN, "%s: larger than a policy file can be (64 KiB)", path);
        return MKV_STATUS_PARSE_ERROR;
    }
    buf[n] = '\0';
    return mkv_policy_parse(buf, path, p, err);
}
