/*
 * state.c — calibration results as JSON and the resumable state file (see state.h).
 */
#include "calib/state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STATE_SCHEMA "mixkv-calibrate-state"
#define STATE_VERSION 1

struct mkv_calib_state {
    FILE *f;
    char *path;
};

/* The quality's members, in one place for writing and reading. */
#define QUALITY_DOUBLES(X)                                                                     \
    X(nll) X(nll_ref) X(ppl) X(ppl_ref) X(ppl_increase) X(agreement) X(memory_ratio)           \
    X(frac_hi) X(frac_lo) X(frac_pruned) X(seconds)

/* NOTE: cJSON prints a double with 15 digits when that reads back within a relative epsilon,
 * which is not always the same double; a resumed sweep must see exactly what was measured. */
static void add_exact(cJSON *o, const char *key, double v)
{
    char t[40];
    snprintf(t, sizeof t, "%.17g", v);
    cJSON_AddRawToObject(o, key, t);
}

/* The needle trials' counts (the accuracies follow from them). */
#define NEEDLE_COUNTS(X) X(needle_trials) X(needle_right) X(needle_right_ref) X(needle_same)

cJSON *mkv_calib_quality_json(const mkv_calib_quality_t *q)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "windows", q->windows);
    cJSON_AddNumberToObject(o, "predictions", (double)q->predictions);
#define W(f) add_exact(o, #f, q->f);
    QUALITY_DOUBLES(W)
#undef W
#define W(f) cJSON_AddNumberToObject(o, #f, q->f);
    NEEDLE_COUNTS(W)
#undef W
    if (q->needle_trials > 0) {
        add_exact(o, "needle_accuracy", q->needle_accuracy);
        add_exact(o, "needle_accuracy_ref", q->needle_accuracy_ref);
    } else {
        cJSON_AddNullToObject(o, "needle_accuracy");
        cJSON_AddNullToObject(o, "needle_accuracy_ref");
    }
    return o;
}

int mkv_calib_quality_from_json(const cJSON *o, mkv_calib_quality_t *q)
{
    const cJSON *it;
    memset(q, 0, sizeof *q);
#define R(f)                                                                                   \
    if (!cJSON_IsNumber(it = cJSON_GetObjectItemCaseSensitive(o, #f))) return -1;              \
    q->f = it->valuedouble;
    R(windows)
    R(predictions)
    QUALITY_DOUBLES(R)
#undef R
    /* Optional: absent from the lines of a run without needle trials. */
#define R(f)                                                                                   \
    if (cJSON_IsNumber(it = cJSON_GetObjectItemCaseSensitive(o, #f))) q->f = (int32_t)it->valuedouble;
    NEEDLE_COUNTS(R)
#undef R
    if (q->needle_trials < 0 || q->needle_right < 0 || q->needle_right > q->needle_trials ||
        q->needle_right_ref < 0 || q->needle_right_ref > q->needle_trials || q->needle_same < 0 ||
        q->needle_same > q->needle_trials)
        return -1;
    if (q->needle_trials > 0) {
        q->needle_accuracy = (double)q->needle_right / q->needle_trials;
        q->needle_accuracy_ref = (double)q->needle_right_ref / q->needle_trials;
    }
    return 0;
}

/* The first member of a that b lacks or holds differently (NULL when they are equal). */
static const char *first_difference(const cJSON *a, const cJSON *b)
{
    for (const cJSON *x = a->child; x; x = x->next)
        if (!cJSON_Compare(x, cJSON_GetObjectItemCaseSensitive(b, x->string), 1)) return x->string;
    for (const cJSON *y = b->child; y; y = y->next)
        if (!cJSON_GetObjectItemCaseSensitive(a, y->string)) return y->string;
    return NULL;
}

static int write_line(FILE *f, const cJSON *o)
{
    char *text = cJSON_PrintUnformatted(o);
    if (!text) return -1;
    int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF && fflush(f) == 0;
    ok = ok && fsync(fileno(f)) == 0;
    cJSON_free(text);
    return ok ? 0 : -1;
}

/* Appends the line o to the state file (and deletes o). IO_ERROR with a message in err. */
static mkv_status_t append(mkv_calib_state_t *s, cJSON *o, char *err)
{
    const int w = write_line(s->f, o);
    cJSON_Delete(o);
    if (w < 0) {
        snprintf(err, MKV_ERR_LEN, "cannot write the state file '%s': %s", s->path, strerror(errno));
        return MKV_STATUS_IO_ERROR;
    }
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* The FP16 cache's needle results                                                          */
/* ---------------------------------------------------------------------------------------- */

mkv_status_t mkv_calib_state_add_needle_reference(mkv_calib_state_t *s, int32_t set,
                                                  const mkv_needle_result_t *r, int32_t n, char *err)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *ref = cJSON_AddObjectToObject(o, "needle_reference");
    cJSON_AddNumberToObject(ref, "set", set);
    cJSON *arr = cJSON_AddArrayToObject(ref, "results");
    for (int32_t i = 0; i < n; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddItemToObject(t, "answer", cJSON_CreateIntArray(r[i].answer, r[i].n_answer));
        cJSON_AddBoolToObject(t, "right", r[i].right);
        add_exact(t, "memory_ratio", r[i].memory_ratio);
        cJSON_AddItemToArray(arr, t);
    }
    return append(s, o, err);
}

/* Restores a needle_reference line into c; 1 when it was one (restored or not). */
static int restore_needle_reference(const cJSON *line, mkv_calib_t *c)
{
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(line, "needle_reference");
    if (!ref) return 0;
    const cJSON *set = cJSON_GetObjectItemCaseSensitive(ref, "set");
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(ref, "results");
    const int32_t n = cJSON_GetArraySize(arr);
    if (!c || !cJSON_IsNumber(set) || !cJSON_IsArray(arr) || n == 0) return 1;
    mkv_needle_result_t *r = calloc((size_t)n, sizeof *r);
    int ok = r != NULL;
    for (int32_t i = 0; ok && i < n; i++) {
        const cJSON *t = cJSON_GetArrayItem(arr, i);
        const cJSON *ans = cJSON_GetObjectItemCaseSensitive(t, "answer");
        const cJSON *right = cJSON_GetObjectItemCaseSensitive(t, "right");
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(t, "memory_ratio");
        ok = cJSON_IsArray(ans) && cJSON_GetArraySize(ans) <= MKV_NEEDLE_MAX_NEW && cJSON_IsBool(right) &&
             cJSON_IsNumber(mem);
        const cJSON *id;
        cJSON_ArrayForEach(id, ans) {
            ok = ok && cJSON_IsNumber(id);
            if (ok) r[i].answer[r[i].n_answer++] = (int32_t)id->valuedouble;
        }
        if (ok) {
            r[i].right = cJSON_IsTrue(right);
            r[i].memory_ratio = mem->valuedouble;
        }
    }
    /* One of another shape (it cannot be, under the same run header) is run again instead. */
    if (ok) (void)mkv_calib_needle_restore(c, (int32_t)set->valuedouble, r, n);
    free(r);
    return 1;
}

/* Restores the point of one line into points[n] (or, for the FP16 cache's needle results,
 * into c); 1 when a point was restored. */
static int restore(const char *line, mkv_calib_point_t *points, int32_t n, mkv_calib_t *c)
{
    cJSON *o = cJSON_Parse(line);
    int got = 0;
    mkv_policy_t p;
    mkv_calib_quality_t q;
    char err[MKV_ERR_LEN];
    if (o && !restore_needle_reference(o, c) && mkv_policy_from_json(cJSON_GetObjectItemCaseSensitive(o, "policy"), "state", &p, err) ==
                 MKV_STATUS_OK &&
        mkv_calib_quality_from_json(cJSON_GetObjectItemCaseSensitive(o, "quality"), &q) == 0) {
        for (int32_t i = 0; i < n; i++)
            if (!points[i].done && mkv_policy_equal(&points[i].policy, &p)) {
                points[i].done = 1;
                points[i].q = q;
                got = 1;
                break;
            }
    }
    cJSON_Delete(o);
    return got;
}

mkv_status_t mkv_calib_state_open(const char *path, const cJSON *run, mkv_calib_point_t *points,
                                  int32_t n, mkv_calib_t *c, mkv_calib_state_t **out, int32_t *restored,
                                  char *err)
{
    *out = NULL;
    *restored = 0;
    mkv_status_t st = MKV_STATUS_OK;
    char *text = NULL, *line = NULL;
    FILE *f = fopen(path, "a+");
    if (!f) {
        snprintf(err, MKV_ERR_LEN, "cannot open the state file '%s': %s", path, strerror(errno));
        return MKV_STATUS_IO_ERROR;
    }
    /* Read what is there. */
    rewind(f);
    size_t len = 0, cap = 0;
    for (int ch; (ch = fgetc(f)) != EOF;) {
        if (len + 2 > cap) {
            char *g = realloc(text, cap = cap ? 2 * cap : 4096);
            if (!g) {
                st = MKV_STATUS_OUT_OF_MEMORY;
                snprintf(err, MKV_ERR_LEN, "out of memory reading '%s'", path);
                goto fail;
            }
            text = g;
        }
        text[len++] = (char)ch;
    }
    if (len == 0) { /* a new state file: its header */
        cJSON *h = cJSON_CreateObject();
        cJSON_AddStringToObject(h, "schema", STATE_SCHEMA);
        cJSON_AddNumberToObject(h, "schema_version", STATE_VERSION);
        cJSON_AddItemToObject(h, "run", cJSON_Duplicate(run, 1));
        const int w = write_line(f, h);
        cJSON_Delete(h);
        if (w < 0) {
            st = MKV_STATUS_IO_ERROR;
            snprintf(err, MKV_ERR_LEN, "cannot write the state file '%s': %s", path, strerror(errno));
            goto fail;
        }
    } else {
        text[len] = '\0';
        char *save = NULL;
        line = strtok_r(text, "\n", &save);
        cJSON *h = line ? cJSON_Parse(line) : NULL;
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(h, "schema");
        const cJSON *hrun = cJSON_GetObjectItemCaseSensitive(h, "run");
        if (!cJSON_IsString(schema) || strcmp(schema->valuestring, STATE_SCHEMA) != 0 ||
            !cJSON_IsObject(hrun)) {
            cJSON_Delete(h);
            st = MKV_STATUS_PARSE_ERROR;
            snprintf(err, MKV_ERR_LEN, "'%s' is not a calibration state file", path);
            goto fail;
        }
        const char *diff = first_difference(run, hrun);
        if (diff) {
            st = MKV_STATUS_INVALID_ARGUMENT;
            snprintf(err, MKV_ERR_LEN, "'%s' holds the state of another run (its \"%s\" differs); "
                     "remove it or name another state file", path, diff);
            cJSON_Delete(h);
            goto fail;
        }
        cJSON_Delete(h);
        while ((line = strtok_r(NULL, "\n", &save)) != NULL) *restored += restore(line, points, n, c);
        /* A line cut short by an interruption: end it, so the next point starts a line. */
        if (text[len - 1] != '\n' && (fputc('\n', f) == EOF || fflush(f) != 0)) {
            st = MKV_STATUS_IO_ERROR;
            snprintf(err, MKV_ERR_LEN, "cannot write the state file '%s': %s", path, strerror(errno));
            goto fail;
        }
    }
    free(text);
    mkv_calib_state_t *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        fclose(f);
        snprintf(err, MKV_ERR_LEN, "out of memory");
        return MKV_STATUS_OUT_OF_MEMORY;
    }
    s->f = f;
    *out = s;
    return MKV_STATUS_OK;
fail:
    free(text);
    fclose(f);
    return st;
}

mkv_status_t mkv_calib_state_add(mkv_calib_state_t *s, const mkv_calib_point_t *p, char *err)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *pol = cJSON_AddObjectToObject(o, "policy");
    mkv_policy_to_json(&p->policy, pol);
    cJSON_AddItemToObject(o, "quality", mkv_calib_quality_json(&p->q));
    return append(s, o, err);
}

void mkv_calib_state_close(mkv_calib_state_t *s)
{
    if (!s) return;
    fclose(s->f);
    free(s->path);
    free(s);
}
