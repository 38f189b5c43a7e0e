/*
 * grid.h — the grid of policies a calibration sweeps: lists of values per setting (alpha_h,
 * alpha_l, the recent window, the formats, the quantization group size), their product over a
 * base policy. DiffKV's ranges are the default (section 7: alpha_h over 0..5 in steps of 1,
 * alpha_l over 0..0.1 in steps of 0.02).
 */
#ifndef MKV_CALIB_GRID_H
#define MKV_CALIB_GRID_H

#include "calib/calib.h"

#define MKV_CALIB_MAX_VALUES 64 /* values per setting */

/* The settings a grid can sweep, by the name of their command-line option without "--". */
typedef enum mkv_calib_setting {
    MKV_CALIB_ALPHA_H,       /* alpha-h */
    MKV_CALIB_ALPHA_L,       /* alpha-l */
    MKV_CALIB_RECENT_WINDOW, /* recent-window */
    MKV_CALIB_HI_FORMAT,     /* hi-format */
    MKV_CALIB_LO_FORMAT,     /* lo-format */
    MKV_CALIB_GROUP_SIZE,    /* group-size: all four sides at once */
    MKV_CALIB_SETTINGS
} mkv_calib_setting_t;

typedef struct mkv_calib_grid {
    int32_t n[MKV_CALIB_SETTINGS];                       /* 0: the base policy's value */
    double value[MKV_CALIB_SETTINGS][MKV_CALIB_MAX_VALUES]; /* numbers, or mkv_format_t */
} mkv_calib_grid_t;

/* DiffKV's alpha ranges; the other settings from the base policy. */
void mkv_calib_grid_default(mkv_calib_grid_t *g);

/* The setting named `name` ("alpha-h", ...), or -1. */
int mkv_calib_setting_find(const char *name);
const char *mkv_calib_setting_name(mkv_calib_setting_t s);

/* Parses the list of one setting and replaces its values: comma-separated items, each a value
 * or, for numbers, a range START:STOP:STEP (STOP included when a whole number of steps away,
 * within 1e-9 of a step; STEP > 0), e.g. "0:5:1", "0,0.02,0.05", "1:3:1,8"; format names for
 * the formats. Values are checked as the library would (alphas finite and >= 0, windows whole
 * numbers >= 0, group sizes 0, 16, 32, 64, 128 or 256, known format names); duplicates are
 * refused. INVALID_ARGUMENT with a message in err naming the item. */
mkv_status_t mkv_calib_grid_parse(mkv_calib_grid_t *g, mkv_calib_setting_t s, const char *text,
                                  char *err);

/* The product of the grid's lists over base, in order (alpha_h slowest ... group size
 * fastest), skipping combinations the library refuses (alpha_l > alpha_h). *out is malloc'ed
 * (points zeroed, not done). INVALID_ARGUMENT when none is left or a point fails
 * mkv_policy_check (message in err). */
mkv_status_t mkv_calib_grid_points(const mkv_policy_t *base, const mkv_calib_grid_t *g,
                                   mkv_calib_point_t **out, int32_t *n, char *err);

#endif /* MKV_CALIB_GRID_H */
