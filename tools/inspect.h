/*
 * inspect.h — the parts of `mixkv inspect` shared between inspect.c (check, summary) and
 * inspect_diff.c (comparison of two dumps).
 */
#ifndef MKV_TOOLS_INSPECT_H
#define MKV_TOOLS_INSPECT_H

#include "mixkv.h"

#include <cjson/cJSON.h>

/* `mixkv inspect --diff A B`: prints what changed from dump A to dump B (text on stdout, or
 * JSON on stdout when json is set and json_path is NULL, or text plus JSON into json_path).
 * Returns the exit status: 0 identical, 1 different, 2 bad input. */
int mkv_inspect_diff(const char *path_a, const char *path_b, int json, const char *json_path);

#endif /* MKV_TOOLS_INSPECT_H */
