/*
 * calib_fixture.c — the calibration tests' fixture and helpers (see calib_fixture.h).
 */
#include "calib_fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

char cf_out[1 << 20];

int cf_present(void)
{
    return access(CF_MODEL_DIR "/config.json", R_OK) == 0 && access(CF_DATA_FILE, R_OK) == 0;
}

void cf_load(cf_fixture_t *f)
{
    if (!cf_present())
        cr_skip_test("model or data fixture absent under %s: calibration runs skipped", MIXKV_SHARED_DIR);
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_model_load(CF_MODEL_DIR, &f->m, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(mkv_tokenizer_load(CF_MODEL_DIR, &f->tok, err), MKV_STATUS_OK, "%s", err);
    FILE *fp = fopen(CF_DATA_FILE, "rb");
    cr_assert_not_null(fp);
    static char text[1 << 16];
    const size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = '\0';
    cr_assert_eq(mkv_tokenizer_encode(f->tok, text, len, 1, &f->ids, &f->n, err), MKV_STATUS_OK, "%s", err);
    f->doc = (mkv_ppl_doc_t){f->ids, f->n};
}

void cf_unload(cf_fixture_t *f)
{
    free(f->ids);
    mkv_tokenizer_free(f->tok);
    mkv_model_free(f->m);
}

char *cf_tmp_path(const char *tag)
{
    char *path = malloc(128);
    snprintf(path, 128, "/tmp/mkv_calib_%s_XXXXXX", tag);
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    return path;
}

int cf_sh(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    const size_t n = fread(cf_out, 1, sizeof cf_out - 1, p);
    cf_out[n] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
