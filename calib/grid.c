/*
 * grid.c — parsing and expanding the grid of policies (see grid.h).
 */
#include "calib/grid.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_names[MKV_CALIB_SETTINGS] = {"alpha-h", "alpha-l", "recent-window",
                                                        "hi-format", "lo-format", "group-size"};

void mkv_calib_grid_default(mkv_calib_grid_t *g)
{
    memset(g, 0, sizeof *g);
    char err[MKV_ERR_LEN];
    (void)mkv_calib_grid_parse(g, MKV_CALIB_ALPHA_H, "0:5:1", err);
    (void)mkv_calib_grid_parse(g, MKV_CALIB_ALPHA_L, "0:0.1:0.02", err);
}

int mkv_calib_setting_find(const char *name)
{
    for (int s = 0; s < MKV_CALIB_SETTINGS; s++)
        if (!strcmp(g_names[s], name)) return s;
    return -1;
}

const char *mkv_calib_setting_name(mkv_calib_setting_t s)
{
    return s >= 0 && s < MKV_CALIB_SETTINGS ? g_names[s] : "?";
}

/* A finite number filling the whole of text. */
static int number(const char *text, double *out)
{
    char *end = NULL;
    errno = 0;
    const double v = text[0] ? strtod(text, &end) : NAN;
    if (!text[0] || *end != '\0' || errno == ERANGE || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* Checks one value of setting s; a message in err when it is refused. */
static int value_ok(mkv_calib_setting_t s, double v, const char *item, char *err)
{
    const char *name = g_names[s];
    switch (s) {
    case MKV_CALIB_ALPHA_H:
    case MKV_CALIB_ALPHA_L:
        if (v >= 0 && v <= 1e6) return 0;
        snprintf(err, MKV_ERR_LEN, "--%s: '%s' is out of range [0, 1e6]", name, item);
        return -1;
    case MKV_CALIB_RECENT_WINDOW:
        if (v >= 0 && v <= (1 << 20) && v == floor(v)) return 0;
        snprintf(err, MKV_ERR_LEN, "--%s: '%s' is not a whole number in [0, 1048576]", name, item);
        return -1;
    case MKV_CALIB_GROUP_SIZE:
        if (v == 0 || v == 16 || v == 32 || v == 64 || v == 128 || v == 256) return 0;
        snprintf(err, MKV_ERR_LEN, "--%s: '%s' elements per quantization group is not supported "
                 "(16, 32, 64, 128 or 256; 0: the library's default)", name, item);
        return -1;
    default:
        return 0;
    }
}

static int add(double *vals, int32_t *n, double v, mkv_calib_setting_t s, const char *item, char *err)
{
    for (int32_t k = 0; k < *n; k++)
        if (vals[k] == v) {
            snprintf(err, MKV_ERR_LEN, "--%s: '%s' repeats a value", g_names[s], item);
            return -1;
        }
    if (*n == MKV_CALIB_MAX_VALUES) {
        snprintf(err, MKV_ERR_LEN, "--%s: more than %d values", g_names[s], MKV_CALIB_MAX_VALUES);
        return -1;
    }
    vals[(*n)++] = v;
    return 0;
}

mkv_status_t mkv_calib_grid_parse(mkv_calib_grid_t *g, mkv_calib_setting_t s, const char *text,
                                  char *err)
{
    if (s < 0 || s >= MKV_CALIB_SETTINGS) {
        snprintf(err, MKV_ERR_LEN, "no such grid setting");
        return MKV_STATUS_INVALID_ARGUMENT;
    }
    double vals[MKV_CALIB_MAX_VALUES];
    int32_t n = 0;
    char buf[1024];
    if (strlen(text) >= sizeof buf) {
        snprintf(err, MKV_ERR_LEN, "--%s: the list is too long", g_names[s]);
        return MKV_STATUS_INVALID_ARGUMENT;
    }
    snprintf(buf, sizeof buf, "%s", text);
    const int formats = s == MKV_CALIB_HI_FORMAT || s == MKV_CALIB_LO_FORMAT;
    char *save = NULL;
    /* NOTE: strtok_r would skip empty items ("1,,2"); count the commas to refuse them. */
    int32_t items = 0, commas = 0;
    for (const char *c = text; *c; c++) commas += *c == ',';
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        items++;
        if (formats) {
            mkv_format_t f;
            if (mkv_format_from_name(item, &f) != MKV_STATUS_OK) {
                snprintf(err, MKV_ERR_LEN, "--%s: '%s' is not a format (K16V16, K8V8, K8V4, K4V4, "
                         "K8V2, K4V2, K4V8, K2V4)", g_names[s], item);
                return MKV_STATUS_INVALID_ARGUMENT;
            }
            if (add(vals, &n, (double)f, s, item, err) < 0) return MKV_STATUS_INVALID_ARGUMENT;
            continue;
        }
        char *c1 = strchr(item, ':');
        if (!c1) {
            double v;
            if (number(item, &v) < 0) {
                snprintf(err, MKV_ERR_LEN, "--%s: '%s' is not a number", g_names[s], item);
                return MKV_STATUS_INVALID_ARGUMENT;
            }
            if (value_ok(s, v, item, err) < 0 || add(vals, &n, v, s, item, err) < 0)
                return MKV_STATUS_INVALID_ARGUMENT;
            continue;
        }
        char *c2 = strchr(c1 + 1, ':');
        double a, b, step;
        char whole[256];
        snprintf(whole, sizeof whole, "%s", item);
        if (c2) *c2 = '\0';
        *c1 = '\0';
        if (!c2 || number(item, &a) < 0 || number(c1 + 1, &b) < 0 || number(c2 + 1, &step) < 0) {
            snprintf(err, MKV_ERR_LEN, "--%s: '%s' is not a number or a range START:STOP:STEP",
                     g_names[s], whole);
            return MKV_STATUS_INVALID_ARGUMENT;
        }
        if (!(step > 0) || b < a) {
            snprintf(err, MKV_ERR_LEN, "--%s: range '%s' needs STEP > 0 and START <= STOP", g_names[s], whole);
            return MKV_STATUS_INVALID_ARGUMENT;
        }
        const double span = (b - a) / step;
        if (span > MKV_CALIB_MAX_VALUES) {
            snprintf(err, MKV_ERR_LEN, "--%s: range '%s' has more than %d values", g_names[s], whole,
                     MKV_CALIB_MAX_VALUES);
            return MKV_STATUS_INVALID_ARGUMENT;
        }
        const int64_t steps = (int64_t)floor(span + 1e-9);
        for (int64_t k = 0; k <= steps; k++) {
            /* start + k * step, rounded to 12 significant digits: 0.1 * 3 is 0.3, not
             * 0.30000000000000004 (the alphas become floats anyway). */
            char t[64];
            snprintf(t, sizeof t, "%.12g", a + (double)k * step);
            const double v = strtod(t, NULL);
            if (value_ok(s, v, t, err) < 0 || add(vals, &n, v, s, t, err) < 0)
                return MKV_STATUS_INVALID_ARGUMENT;
        }
    }
    if (items == 0 || items != commas + 1) {
        snprintf(err, MKV_ERR_LEN, "--%s: '%s' has an empty item", g_names[s], text);
        return MKV_STATUS_INVALID_ARGUMENT;
    }
    memcpy(g->value[s], vals, (size_t)n * sizeof *vals);
    g->n[s] = n;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_calib_grid_points(const mkv_policy_t *base, const mkv_calib_grid_t *g,
                                   mkv_calib_point_t **out, int32_t *n_out, char *err)
{
    *out = NULL;
    *n_out = 0;
    int64_t total = 1;
    int32_t len[MKV_CALIB_SETTINGS];
    for (int s = 0; s < MKV_CALIB_SETTINGS; s++) {
        len[s] = g->n[s] > 0 ? g->n[s] : 1;
        total *= len[s];
    }
    if (total > 100000) {
        snprintf(err, MKV_ERR_LEN, "the grid has %lld points; at most 100000", (long long)total);
        return MKV_STATUS_INVALID_ARGUMENT;
    }
    mkv_calib_point_t *pts = calloc((size_t)total, sizeof *pts);
    if (!pts) {
        snprintf(err, MKV_ERR_LEN, "out of memory");
        return MKV_STATUS_OUT_OF_MEMORY;
    }
    int32_t n = 0;
    for (int64_t k = 0; k < total; k++) {
        mkv_policy_t p = *base;
        int64_t r = k;
        for (int s = MKV_CALIB_SETTINGS - 1; s >= 0; s--) { /* the last setting varies fastest */
            const int32_t i = (int32_t)(r % len[s]);
            r /= len[s];
            if (g->n[s] == 0) continue;
            const double v = g->value[s][i];
            switch ((mkv_calib_setting_t)s) {
            case MKV_CALIB_ALPHA_H: p.alpha_h = (float)v; break;
            case MKV_CALIB_ALPHA_L: p.alpha_l = (float)v; break;
            case MKV_CALIB_RECENT_WINDOW: p.window = (int32_t)v; break;
            case MKV_CALIB_HI_FORMAT: p.hi = (mkv_format_t)(int)v; break;
            case MKV_CALIB_LO_FORMAT: p.lo = (mkv_format_t)(int)v; break;
            case MKV_CALIB_GROUP_SIZE:
                p.hi_key_group = p.hi_value_group = p.lo_key_group = p.lo_value_group = (int32_t)v;
                break;
            default: break;
            }
        }
        if (p.alpha_l > p.alpha_h) continue; /* the library refuses it: not a point */
        char why[MKV_ERR_LEN];
        if (mkv_policy_check(&p, why) != MKV_STATUS_OK) {
            free(pts);
            snprintf(err, MKV_ERR_LEN, "a grid point is refused: %.400s", why);
            return MKV_STATUS_INVALID_ARGUMENT;
        }
        pts[n++].policy = p;
    }
    if (n == 0) {
        free(pts);
        snprintf(err, MKV_ERR_LEN, "the grid has no point with alpha_l <= alpha_h");
        return MKV_STATUS_INVALID_ARGUMENT;
    }
    *out = pts;
    *n_out = n;
    return MKV_STATUS_OK;
}
