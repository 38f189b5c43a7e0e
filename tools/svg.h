/*
 * svg.h — small SVG plots for the tools' pictures (`serve-bench --plot`, `calibrate --plot`):
 * a white page holding panels; each panel maps data coordinates to its rectangle and draws
 * ticks, lines, markers and labels in them. Plain SVG 1.1, no scripts, readable in a browser
 * and in docs/results/.
 */
#ifndef MKV_TOOLS_SVG_H
#define MKV_TOOLS_SVG_H

#include <stdio.h>

typedef struct mkv_svg {
    FILE *f;
    const char *path;
    int left, top, w, h;          /* the current panel, pixels */
    double x0, x1, y0, y1;        /* its data ranges */
} mkv_svg_t;

/* Opens path for a width x height picture; -1 with a message (mkv_cli_error as cmd). */
int mkv_svg_open(mkv_svg_t *s, const char *cmd, const char *path, int width, int height);
/* Writes the end; -1 with a message when the file could not be written. */
int mkv_svg_close(mkv_svg_t *s, const char *cmd);

/* Starts a panel: a frame at (left, top) of w x h pixels for data [x0, x1] x [y0, y1] (an
 * empty range is widened), with a title above it. */
void mkv_svg_panel(mkv_svg_t *s, int left, int top, int w, int h, double x0, double x1, double y0,
                   double y1, const char *title);
/* n + 1 evenly spaced ticks with labels (%.3g) on the y axis / the x axis, and light grid lines. */
void mkv_svg_yticks(mkv_svg_t *s, int n);
void mkv_svg_xticks(mkv_svg_t *s, int n);
/* One x tick at data x with its own label. */
void mkv_svg_xtick(mkv_svg_t *s, double x, const char *label);
/* Axis titles, below and to the left of the panel. */
void mkv_svg_axis_titles(mkv_svg_t *s, const char *x, const char *y);

/* Pixel coordinates of data (x, y) in the current panel. */
double mkv_svg_px(const mkv_svg_t *s, double x);
double mkv_svg_py(const mkv_svg_t *s, double y);

/* A line through n points (data coordinates); dashed when dash is set. */
void mkv_svg_polyline(mkv_svg_t *s, const double *x, const double *y, int n, const char *color,
                      double width, int dash);
/* A horizontal line across the panel at data y. */
void mkv_svg_hline(mkv_svg_t *s, double y, const char *color, int dash);
/* A circle of radius r pixels at data (x, y); fill "none" for a ring. */
void mkv_svg_circle(mkv_svg_t *s, double x, double y, double r, const char *fill, const char *stroke);
/* Text at pixel (px, py), anchored "start", "middle" or "end". */
void mkv_svg_text(mkv_svg_t *s, double px, double py, const char *anchor, const char *color,
                  int size, const char *text);

#endif /* MKV_TOOLS_SVG_H */
