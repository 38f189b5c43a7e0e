/*
 * cli.c — helpers shared by the `mixkv` subcommands (see cli.h).
 */
#include "tools/cli.h"

#include <sys/stat.h>
#include <unistd.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void mkv_cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    if (cmd)
        fprintf(stderr, "mixkv %s: ", cmd);
    else
        fputs("mixkv: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int mkv_cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

int mkv_cli_option(const char *cmd, int argc, char **argv, int *i, const char *name, int want_value,
                   int allow_inline, const char **value)
{
    const char *arg = argv[*i];
    const size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0 || (arg[n] != '\0' && arg[n] != '=')) return 0;
    *value = NULL;
    if (arg[n] == '=') {
        if (!want_value && !allow_inline) {
            mkv_cli_error(cmd, "option %s takes no value", name);
            return -1;
        }
        *value = arg + n + 1;
        return 1;
    }
    if (!want_value) return 1;
    if (*i + 1 >= argc) {
        mkv_cli_error(cmd, "option %s needs a value", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int mkv_cli_parse_i64(const char *cmd, const char *what, const char *text, int64_t lo, int64_t hi,
                      int64_t *out)
{
    char *end = NULL;
    errno = 0;
    const long long v = text[0] ? strtoll(text, &end, 10) : 0;
    if (!text[0] || *end != '\0') {
        mkv_cli_error(cmd, "%s: '%s' is not an integer", what, text);
        return -1;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        mkv_cli_error(cmd, "%s: %s is out of range [%" PRId64 ", %" PRId64 "]", what, text, lo, hi);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

int mkv_cli_parse_i32(const char *cmd, const char *what, const char *text, int32_t lo, int32_t hi,
                      int32_t *out)
{
    int64_t v;
    if (mkv_cli_parse_i64(cmd, what, text, lo, hi, &v) != 0) return -1;
    *out = (int32_t)v;
    return 0;
}

int mkv_cli_parse_double(const char *cmd, const char *what, const char *text, double lo, double hi,
                         double *out)
{
    char *end = NULL;
    errno = 0;
    const double v = text[0] ? strtod(text, &end) : 0.0;
    if (!text[0] || *end != '\0' || !isfinite(v)) {
        mkv_cli_error(cmd, "%s: '%s' is not a finite number", what, text);
        return -1;
    }
    if (v < lo || v > hi) {
        mkv_cli_error(cmd, "%s: %s is out of range [%g, %g]", what, text, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int mkv_cli_parse_list(const char *cmd, const char *what, const char *text, double lo, double hi,
                       int integer, int32_t max, double *out, int32_t *n)
{
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        const double v = strtod(p, &end);
        if (end == p || errno || !(v >= lo && v <= hi) || (integer && v != floor(v)) ||
            (*end && *end != ',')) {
            mkv_cli_error(cmd, "%s: '%s' is not a list of %s in [%g, %g]", what, text,
                          integer ? "integers" : "numbers", lo, hi);
            return -1;
        }
        if (*n == max) {
            mkv_cli_error(cmd, "%s: at most %d values", what, max);
            return -1;
        }
        out[(*n)++] = v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) {
        mkv_cli_error(cmd, "%s: no values", what);
        return -1;
    }
    return 0;
}

int mkv_cli_write_json(const char *cmd, const cJSON *root, const char *path)
{
    char *text = cJSON_Print(root);
    if (!text) {
        mkv_cli_error(cmd, "out of memory formatting JSON");
        return -1;
    }
    const int to_stdout = !path || strcmp(path, "-") == 0;
    FILE *f = to_stdout ? stdout : fopen(path, "w");
    if (!f) {
        mkv_cli_error(cmd, "cannot open '%s' for writing: %s", path, strerror(errno));
        cJSON_free(text);
        return -1;
    }
    int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    ok = (to_stdout ? fflush(f) : fclose(f)) == 0 && ok;
    cJSON_free(text);
    if (!ok) {
        mkv_cli_error(cmd, "cannot write JSON to '%s': %s", to_stdout ? "stdout" : path,
                      strerror(errno));
        return -1;
    }
    return 0;
}

cJSON *mkv_cli_json_i64(int64_t v)
{
    /* NOTE: raw text, because cJSON would print a large int64 through a double. */
    char tmp[24];
    snprintf(tmp, sizeof tmp, "%" PRId64, v);
    return cJSON_CreateRaw(tmp);
}

void mkv_cli_json_add_i64(cJSON *obj, const char *key, int64_t v)
{
    cJSON *item = mkv_cli_json_i64(v);
    if (!cJSON_AddItemToObject(obj, key, item)) cJSON_Delete(item);
}

cJSON *mkv_cli_json_ids(const int32_t *ids, int64_t n)
{
    cJSON *arr = cJSON_CreateArray();
    for (int64_t i = 0; arr && i < n; i++) {
        cJSON *item = cJSON_CreateNumber(ids[i]);
        if (!cJSON_AddItemToArray(arr, item)) cJSON_Delete(item);
    }
    return arr;
}

int mkv_cli_check_writable(const char *cmd, const char *what, const char *path)
{
    if (!path || strcmp(path, "-") == 0) return 0;
    const int existed = access(path, F_OK) == 0;
    FILE *f = fopen(path, "a"); /* creates it if needed, truncates nothing */
    if (!f) {
        mkv_cli_error(cmd, "%s: cannot open '%s' for writing: %s", what, path, strerror(errno));
        return -1;
    }
    fclose(f);
    if (!existed) unlink(path); /* leave nothing behind if the run fails */
    return 0;
}

char *mkv_cli_read_file(const char *cmd, const char *path, size_t *len)
{
    const int from_stdin = strcmp(path, "-") == 0;
    FILE *f = from_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        mkv_cli_error(cmd, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (!from_stdin && (fstat(fileno(f), &sb) != 0 || S_ISDIR(sb.st_mode))) {
        mkv_cli_error(cmd, "'%s' is a directory, not a file", path);
        fclose(f);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        const size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        char *g = realloc(buf, (cap *= 2) + 1);
        if (!g) {
            free(buf);
            buf = NULL;
        } else {
            buf = g;
        }
    }
    const int bad = ferror(f);
    if (!from_stdin) fclose(f);
    if (!buf || bad) {
        mkv_cli_error(cmd, "cannot read '%s'%s", from_stdin ? "standard input" : path,
                      buf ? "" : ": out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}
