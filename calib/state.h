/*
 * state.h — calibration results as JSON, and the state file that makes a sweep resumable.
 *
 * A state file holds JSON Lines: a header naming the run (`run`: the settings that change
 * what a point measures: model, data, windows, needle trials, ...), then one line per finished
 * point, written and flushed as the point finishes, and with needle trials a line per set of
 * the FP16 cache's results on them. Reopening it for the same run restores those points (done,
 * with their figures, exactly: doubles are written to round-trip), so an interrupted sweep
 * resumes where it stopped; a state file of another run is refused rather than mixed in. A
 * last line cut short by the interruption is ignored. Internal to the project's tools (it
 * speaks cJSON); calib.h is the engine's API.
 */
#ifndef MKV_CALIB_STATE_H
#define MKV_CALIB_STATE_H

#include "calib/calib.h"

#include <cjson/cJSON.h>

/* Adds p's fields to the object o (the members of a policy file, schema mixkv-policy). */
void mkv_policy_to_json(const mkv_policy_t *p, cJSON *o);
/* Reads a policy from the object o (as mkv_policy_parse; "schema" and "source" are skipped). */
mkv_status_t mkv_policy_from_json(const cJSON *o, const char *name, mkv_policy_t *p, char *err);

/* A quality as a JSON object and back (every field). */
cJSON *mkv_calib_quality_json(const mkv_calib_quality_t *q);
int mkv_calib_quality_from_json(const cJSON *o, mkv_calib_quality_t *q);

typedef struct mkv_calib_state mkv_calib_state_t;

/* Opens (creating it when absent) the state file at path for the run described by `run` (a
 * JSON object; compared member by member with the file's header). Points of the file that
 * equal one of points[n] (mkv_policy_equal) are restored into it; *restored counts them. The
 * FP16 cache's needle results are restored into c (mkv_calib_needle_restore) when c is not
 * NULL.
 * IO_ERROR, PARSE_ERROR (not a state file) or INVALID_ARGUMENT (another run's state file: the
 * message names the first setting that differs) with a message in err. */
mkv_status_t mkv_calib_state_open(const char *path, const cJSON *run, mkv_calib_point_t *points,
                                  int32_t n, mkv_calib_t *c, mkv_calib_state_t **out, int32_t *restored,
                                  char *err);

/* Appends a finished point and flushes it to the disk. IO_ERROR with a message in err. */
mkv_status_t mkv_calib_state_add(mkv_calib_state_t *s, const mkv_calib_point_t *p, char *err);

/* Appends the FP16 cache's results on needle set `set` (mkv_calib_opts_t.needle_ref_done)
 * and flushes them. IO_ERROR with a message in err. */
mkv_status_t mkv_calib_state_add_needle_reference(mkv_calib_state_t *s, int32_t set,
                                                  const mkv_needle_result_t *r, int32_t n, char *err);

void mkv_calib_state_close(mkv_calib_state_t *s);

#endif /* MKV_CALIB_STATE_H */
