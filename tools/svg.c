/*
 * svg.c — small SVG plots (see svg.h).
 */
#include "tools/svg.h"

#include "tools/cli.h"

#include <errno.h>
#include <string.h>

int mkv_svg_open(mkv_svg_t *s, const char *cmd, const char *path, int width, int height)
{
    memset(s, 0, sizeof *s);
    s->path = path;
    if (!(s->f = fopen(path, "w"))) {
        mkv_cli_error(cmd, "cannot open '%s' for writing: %s", path, strerror(errno));
        return -1;
    }
    fprintf(s->f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                  "font-family=\"sans-serif\" font-size=\"12\">\n"
                  "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", width, height);
    return 0;
}

int mkv_svg_close(mkv_svg_t *s, const char *cmd)
{
    fprintf(s->f, "</svg>\n");
    const int bad = ferror(s->f);
    if (fclose(s->f) != 0 || bad) {
        mkv_cli_error(cmd, "cannot write '%s'", s->path);
        return -1;
    }
    s->f = NULL;
    return 0;
}

double mkv_svg_px(const mkv_svg_t *s, double x) { return s->left + s->w * (x - s->x0) / (s->x1 - s->x0); }
double mkv_svg_py(const mkv_svg_t *s, double y) { return s->top + s->h - s->h * (y - s->y0) / (s->y1 - s->y0); }

/* Text with &, < and > escaped. */
static void put_escaped(FILE *f, const char *t)
{
    for (; *t; t++) {
        if (*t == '&') fputs("&amp;", f);
        else if (*t == '<') fputs("&lt;", f);
        else if (*t == '>') fputs("&gt;", f);
        else fputc(*t, f);
    }
}

void mkv_svg_text(mkv_svg_t *s, double px, double py, const char *anchor, const char *color,
                  int size, const char *text)
{
    fprintf(s->f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" fill=\"%s\" font-size=\"%d\">", px, py,
            anchor, color, size);
    put_escaped(s->f, text);
    fputs("</text>\n", s->f);
}

void mkv_svg_panel(mkv_svg_t *s, int left, int top, int w, int h, double x0, double x1, double y0,
                   double y1, const char *title)
{
    if (!(x1 > x0)) x0 -= 0.5, x1 = x0 + 1.0;
    if (!(y1 > y0)) y0 -= 0.5, y1 = y0 + 1.0;
    s->left = left, s->top = top, s->w = w, s->h = h;
    s->x0 = x0, s->x1 = x1, s->y0 = y0, s->y1 = y1;
    fprintf(s->f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n",
            left, top, w, h);
    if (title) mkv_svg_text(s, left, top - 20, "start", "black", 14, title);
}

void mkv_svg_yticks(mkv_svg_t *s, int n)
{
    for (int t = 0; t <= n; t++) {
        const double v = s->y0 + (s->y1 - s->y0) * t / n, y = mkv_svg_py(s, v);
        char label[32];
        snprintf(label, sizeof label, "%.3g", v);
        if (t > 0 && t < n)
            fprintf(s->f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>\n", s->left,
                    y, s->left + s->w, y);
        mkv_svg_text(s, s->left - 4, y + 4, "end", "black", 12, label);
    }
}

void mkv_svg_xtick(mkv_svg_t *s, double x, const char *label)
{
    mkv_svg_text(s, mkv_svg_px(s, x), s->top + s->h + 16, "middle", "black", 12, label);
}

void mkv_svg_xticks(mkv_svg_t *s, int n)
{
    for (int t = 0; t <= n; t++) {
        const double v = s->x0 + (s->x1 - s->x0) * t / n, x = mkv_svg_px(s, v);
        char label[32];
        snprintf(label, sizeof label, "%.3g", v);
        if (t > 0 && t < n)
            fprintf(s->f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/>\n", x,
                    s->top, x, s->top + s->h);
        mkv_svg_xtick(s, v, label);
    }
}

void mkv_svg_axis_titles(mkv_svg_t *s, const char *x, const char *y)
{
    if (x) mkv_svg_text(s, s->left + s->w / 2.0, s->top + s->h + 36, "middle", "black", 12, x);
    if (y) {
        const double px = s->left - 48, py = s->top + s->h / 2.0;
        fprintf(s->f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\" "
                      "transform=\"rotate(-90 %.1f %.1f)\">", px, py, px, py);
        put_escaped(s->f, y);
        fputs("</text>\n", s->f);
    }
}

void mkv_svg_polyline(mkv_svg_t *s, const double *x, const double *y, int n, const char *color,
                      double width, int dash)
{
    fprintf(s->f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%g\"%s points=\"", color, width,
            dash ? " stroke-dasharray=\"5,3\"" : "");
    for (int i = 0; i < n; i++) fprintf(s->f, "%.1f,%.1f ", mkv_svg_px(s, x[i]), mkv_svg_py(s, y[i]));
    fputs("\"/>\n", s->f);
}

void mkv_svg_hline(mkv_svg_t *s, double y, const char *color, int dash)
{
    const double py = mkv_svg_py(s, y);
    fprintf(s->f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\"%s/>\n", s->left, py,
            s->left + s->w, py, color, dash ? " stroke-dasharray=\"5,3\"" : "");
}

void mkv_svg_circle(mkv_svg_t *s, double x, double y, double r, const char *fill, const char *stroke)
{
    fprintf(s->f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%g\" fill=\"%s\" stroke=\"%s\"/>\n",
            mkv_svg_px(s, x), mkv_svg_py(s, y), r, fill, stroke);
}
