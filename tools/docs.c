/*
 * docs.c — the documents a command measures on (see docs.h).
 */
#include "tools/docs.h"

#include "tools/cli.h"
#include "tools/model_opts.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void mkv_docs_free(mkv_docs_t *d)
{
    for (int32_t i = 0; i < d->n; i++) {
        free((void *)d->doc[i].tokens);
        free(d->name[i]);
    }
    free(d->doc);
    free(d->name);
    memset(d, 0, sizeof *d);
}

/* Reads and encodes one document (BOS first where the tokenizer adds one). 0 on success; a message is printed otherwise. */
static int docs_add(const char *cmd, mkv_docs_t *d, const mkv_tokenizer_t *tok, const char *path)
{
    size_t len = 0;
    char err[512];
    char *text = mkv_cli_read_file(cmd, path, &len);
    if (!text) return -1;
    int32_t *ids = NULL, n = 0;
    const mkv_status_t st = mkv_tokenizer_encode(tok, text, len, mkv_tools_add_bos(tok), &ids, &n, err);
    free(text);
    if (st != MKV_STATUS_OK) {
        mkv_cli_error(cmd, "%s: %s", path, err);
        return -1;
    }
    mkv_ppl_doc_t *nd = realloc(d->doc, (size_t)(d->n + 1) * sizeof *nd);
    if (nd) d->doc = nd;
    char **nn = realloc(d->name, (size_t)(d->n + 1) * sizeof *nn);
    if (nn) d->name = nn;
    char *name = strdup(path);
    if (!nd || !nn || !name) {
        free(ids);
        free(name);
        mkv_cli_error(cmd, "out of memory reading the documents");
        return -1;
    }
    d->doc[d->n] = (mkv_ppl_doc_t){ids, n};
    d->name[d->n++] = name;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of a directory (hidden ones skipped), sorted by name, into *names[*n]
 * (malloc'ed, each freed by the caller). 0, or -1 with a message printed as cmd. */
static int list_files(const char *cmd, const char *dir_path, char ***names, int32_t *n)
{
    *names = NULL;
    *n = 0;
    DIR *dir = opendir(dir_path);
    if (!dir) {
        mkv_cli_error(cmd, "cannot open the directory '%s': %s", dir_path, strerror(errno));
        return -1;
    }
    int32_t cap = 0;
    int rc = 0;
    char path[4096];
    struct stat sb;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir_path, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (*n == cap) {
            char **g = realloc(*names, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *g);
            if (!g) {
                rc = -1;
                break;
            }
            *names = g;
        }
        if (!((*names)[*n] = strdup(e->d_name))) {
            rc = -1;
            break;
        }
        (*n)++;
    }
    closedir(dir);
    if (rc < 0) mkv_cli_error(cmd, "out of memory listing '%s'", dir_path);
    if (rc == 0 && *n == 0) {
        mkv_cli_error(cmd, "the directory '%s' holds no regular files", dir_path);
        rc = -1;
    }
    if (rc == 0) qsort(*names, (size_t)*n, sizeof **names, cmp_str);
    if (rc < 0) {
        for (int32_t i = 0; i < *n; i++) free((*names)[i]);
        free(*names);
        *names = NULL;
        *n = 0;
    }
    return rc;
}

static int is_dir(const char *path)
{
    struct stat sb;
    return strcmp(path, "-") != 0 && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* --data: a file, "-" (standard input) or a directory of documents. */
int mkv_docs_load(const char *cmd, mkv_docs_t *d, const mkv_tokenizer_t *tok, const char *data)
{
    if (!is_dir(data)) return docs_add(cmd, d, tok, data); /* reports a missing file itself */
    char **names = NULL, path[4096];
    int32_t n = 0;
    int rc = list_files(cmd, data, &names, &n);
    for (int32_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", data, names[i]);
        if (rc == 0 && docs_add(cmd, d, tok, path) < 0) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

/* Appends a file's text, then "\n\n", to *buf. */
static int append_file(const char *cmd, char **buf, size_t *len, const char *path)
{
    size_t n = 0;
    char *t = mkv_cli_read_file(cmd, path, &n);
    if (!t) return -1;
    char *g = realloc(*buf, *len + n + 3);
    if (!g) {
        free(t);
        mkv_cli_error(cmd, "out of memory reading '%s'", path);
        return -1;
    }
    memcpy(g + *len, t, n);
    memcpy(g + *len + n, "\n\n", 3);
    *buf = g;
    *len += n + 2;
    free(t);
    return 0;
}

char *mkv_docs_read_text(const char *cmd, const char *path, size_t *len)
{
    char *buf = NULL;
    *len = 0;
    if (!is_dir(path)) return append_file(cmd, &buf, len, path) < 0 ? NULL : buf;
    char **names = NULL, full[4096];
    int32_t n = 0;
    int rc = list_files(cmd, path, &names, &n);
    for (int32_t i = 0; i < n; i++) {
        snprintf(full, sizeof full, "%s/%s", path, names[i]);
        if (rc == 0 && append_file(cmd, &buf, len, full) < 0) rc = -1;
        free(names[i]);
    }
    free(names);
    if (rc < 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

int64_t mkv_docs_tokens(const mkv_docs_t *d, int64_t *longest)
{
    int64_t total = 0, most = 0;
    for (int32_t i = 0; i < d->n; i++) {
        total += d->doc[i].n;
        most = d->doc[i].n > most ? d->doc[i].n : most;
    }
    if (longest) *longest = most;
    return total;
}
