/*
** html.h — the HTML/SVG writer of `sparsetrace report`: one self-contained page (inline CSS, SVG
** and a little JavaScript; no network, opens from file://, prints legibly) built from a few
** figure kinds: table, heat map, pass/fail grid, histogram and bar chart.
**
** The writer draws; it computes nothing. Every value a caller hands it comes from the function
** the matching text command prints with (report.c says which), so a page and the text output
** cannot disagree. Every drawn element carries its value in data- attributes (data-value,
** data-row, data-col, ...) so tests read what was drawn from the DOM, and a <title> child for the
** hover text. Every string is escaped here (st_html_text): callers never write markup of their
** own around user text (answers, prompts, paths, settings are hostile input).
**
** All functions append to an st_buf and never fail on their own: st_buf records the first failed
** append (out of memory) and later appends do nothing; check st_buf_status once at the end.
*/
#ifndef ST_HTML_H
#define ST_HTML_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

/* Appends s[0..n) with & < > " ' escaped (valid as element text and inside a quoted attribute).
** Bytes that are not valid UTF-8, and control characters other than tab and newline, become
** U+FFFD, so a binary answer cannot break the page's encoding. */
void st_html_escape(st_buf *b, const char *s, size_t n);
/* st_html_escape of a NUL-terminated string; NULL appends nothing. */
void st_html_text(st_buf *b, const char *s);

/* <!DOCTYPE html> ... <body>, with the page's CSS and script, the title as <h1>. */
void st_html_begin(st_buf *b, const char *title);
/* Closes the page, with a footer line (escaped). */
void st_html_end(st_buf *b, const char *footer);

/* <section id=ID><h2>TITLE</h2>; st_html_section_end closes it. id: [A-Za-z0-9_-] only (other
** bytes become '-'). */
void st_html_section_begin(st_buf *b, const char *id, const char *title);
void st_html_section_end(st_buf *b);
/* <p class=CLASS>TEXT</p> (class NULL: none). */
void st_html_paragraph(st_buf *b, const char *cls, const char *text);

/* A table: st_html_table_begin(headers), rows of st_html_table_row, st_html_table_end. A cell
** that is NULL is drawn as "-". */
void st_html_table_begin(st_buf *b, const char *id, const char *const *headers, int n);
void st_html_table_row(st_buf *b, const char *const *cells, int n);
void st_html_table_end(st_buf *b);
/* Two-column key/value table (identity blocks): keys[i], values[i]; NULL values skipped. */
void st_html_key_values(st_buf *b, const char *id, const char *const *keys,
                        const char *const *values, int n);

/* Heat map of rows x columns of non-negative values (a needle's rank per layer x position):
** colour from 0 (best) on a log scale up to max; a missing value (< 0) is grey. Cells whose
** value is >= line (the top-k) are drawn hatched and outlined: the "top-k line" of the legend.
** Each cell: <rect data-row=ROWKEY data-col=COLKEY data-value=V data-over=0|1>. */
typedef struct st_html_heatmap {
  const char *id, *title;
  const char *row_axis, *col_axis;    /* "layer", "query position" */
  int n_rows, n_cols;
  const char *const *row_names;       /* n_rows labels ("layer 1") */
  const int64_t *row_keys, *col_keys; /* data-row / data-col values (layer, position) */
  const double *values;               /* [n_rows * n_cols], row-major; < 0: no value */
  double line;                        /* the threshold drawn (top-k); <= 0: none */
  const char *line_name;              /* "top-32" */
  const char *value_name;             /* "rank" */
  const char *const *col_notes;       /* NULL or n_cols hover notes per column (the token) */
} st_html_heatmap;
void st_html_heatmap_svg(st_buf *b, const st_html_heatmap *h);

/* A pass/fail grid (a needle sweep: context length x position). state: 1 pass, 0 fail, 2 some
** pass, -1 empty. label is drawn in the cell, hover is its tooltip (answer texts). Each cell:
** <rect data-row data-col data-state data-label>. */
typedef struct st_html_grid {
  const char *id, *title, *row_axis, *col_axis;
  int n_rows, n_cols;
  const char *const *row_names, *const *col_names;
  const int *state;                   /* [n_rows * n_cols] */
  const char *const *label, *const *hover; /* [n_rows * n_cols]; NULL entries: none */
} st_html_grid;
void st_html_grid_svg(st_buf *b, const st_html_grid *g);

/* Histogram of values (NaN and infinities are left out and counted in the caption) in n_bins
** equal bins over [min, max] of the finite values, with vertical marks at given values (a
** needle's rows) and one dashed line (the k-th best score). Each bin: <rect data-bin=I
** data-lo data-hi data-count>; each mark: <line data-mark=LABEL data-value>. */
typedef struct st_html_histogram {
  const char *id, *title, *value_axis;
  const float *values;
  int64_t n;
  int n_bins;
  const double *marks;
  const char *const *mark_names;      /* n_marks labels ("row 57") */
  int n_marks;
  double line;                        /* NaN: none */
  const char *line_name;
} st_html_histogram;
void st_html_histogram_svg(st_buf *b, const st_html_histogram *h);

/* Horizontal bars, one per item, in the given order (taps along the forward order, layers):
** value on a linear [0, max] scale, or a log10 scale when log is set (values <= 0 drawn at the
** floor 1e-12). flag[i] 1 draws the bar in the alarm colour (a divergence). Each bar:
** <rect data-name=NAME data-value=V data-flag=F>. */
typedef struct st_html_bars {
  const char *id, *title, *value_axis;
  int n;
  const char *const *names;
  const double *values;               /* NaN: nothing drawn, "-" */
  const int *flag;                    /* NULL: none */
  const char *const *notes;           /* NULL or per-bar hover text */
  double max;                         /* linear scale end (<= 0: the largest value) */
  int log;
} st_html_bars;
void st_html_bars_svg(st_buf *b, const st_html_bars *h);

#endif
