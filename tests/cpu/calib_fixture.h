/*
 * calib_fixture.h — what the calibration tests (test_calib.c, test_calib_needle.c) share: the
 * bundled TinyStories model with the first 64 KiB of its data as one document (the test is
 * skipped where they are absent), temporary files, and shell commands for `mixkv calibrate`.
 */
#ifndef MKV_TESTS_CPU_CALIB_FIXTURE_H
#define MKV_TESTS_CPU_CALIB_FIXTURE_H

#include "runner/model.h"
#include "runner/perplexity.h"
#include "runner/tokenizer.h"

#include <stdint.h>

#define CF_MODEL_DIR MIXKV_SHARED_DIR "/models/tinystories-656k"
#define CF_DATA_FILE MIXKV_SHARED_DIR "/data/tinystories/tinystories_val_dev.txt"

typedef struct cf_fixture {
    mkv_model_t *m;
    mkv_tokenizer_t *tok;
    int32_t *ids;             /* [n] the first 64 KiB of the data (about 60 windows of 255), BOS first */
    int32_t n;
    mkv_ppl_doc_t doc;        /* ids as one document */
} cf_fixture_t;

/* 1 when the model and the data are there. */
int cf_present(void);
/* Loads the fixture, or skips the calling test when it is absent. */
void cf_load(cf_fixture_t *f);
void cf_unload(cf_fixture_t *f);

/* A new empty file /tmp/mkv_calib_<tag>_XXXXXX (malloc'ed path). */
char *cf_tmp_path(const char *tag);

/* Runs a shell command; its stdout in cf_out; the exit status. */
extern char cf_out[1 << 20];
int cf_sh(const char *cmd);

#endif /* MKV_TESTS_CPU_CALIB_FIXTURE_H */
