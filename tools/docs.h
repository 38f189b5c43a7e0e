/*
 * docs.h — the documents a command measures on (`perplexity`, `calibrate`): --data names a
 * text file, "-" (standard input) or a directory whose regular files are documents (name
 * order, hidden files skipped); each is encoded with the model's tokenizer (BOS first where
 * the tokenizer adds one); and the haystack text of `needle` and `calibrate --needle`.
 */
#ifndef MKV_TOOLS_DOCS_H
#define MKV_TOOLS_DOCS_H

#include "runner/perplexity.h"
#include "runner/tokenizer.h"

typedef struct mkv_docs {
    mkv_ppl_doc_t *doc; /* [n] */
    char **name;        /* [n] file names (for messages) */
    int32_t n;
} mkv_docs_t;

/* Loads --data into d (zeroed); 0, or -1 with a message printed as cmd. */
int mkv_docs_load(const char *cmd, mkv_docs_t *d, const mkv_tokenizer_t *tok, const char *data);
void mkv_docs_free(mkv_docs_t *d);

/* The text of path as one string: a file ("-": standard input) or a directory's regular files
 * in name order (hidden files skipped), each followed by "\n\n" (`needle --haystack`).
 * malloc'ed and NUL-terminated, *len its length; NULL with a message printed as cmd. */
char *mkv_docs_read_text(const char *cmd, const char *path, size_t *len);

/* Tokens in all documents, and the longest document's. */
int64_t mkv_docs_tokens(const mkv_docs_t *d, int64_t *longest);

#endif /* MKV_TOOLS_DOCS_H */
