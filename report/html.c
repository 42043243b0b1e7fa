/*
** html.c — the page and its figures (html.h). Plain SVG drawn by coordinates: no layout engine,
** no library, nothing fetched. Figures are sized from their data (cell sizes shrink for long
** axes, down to a floor) so a 32k-token heat map stays a few thousand rectangles per layer row.
*/
#include "html.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- text */

/* Length of the valid UTF-8 sequence at s[0..n), 0 when it is not one. */
static size_t utf8_length(const unsigned char *s, size_t n) {
  size_t len = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3
             : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
  if (!len || len > n) return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  if (len == 2 && s[0] < 0xC2) return 0;                       /* overlong */
  if (len == 3 && s[0] == 0xE0 && s[1] < 0xA0) return 0;
  if (len == 3 && s[0] == 0xED && s[1] >= 0xA0) return 0;      /* surrogates */
  if (len == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || s[0] > 0xF4 || (s[0] == 0xF4 && s[1] >= 0x90)))
    return 0;
  return len;
}

void st_html_escape(st_buf *b, const char *text, size_t n) {
  const unsigned char *s = (const unsigned char *)text;
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    const char *rep = NULL;
    switch (c) {
    case '&': rep = "&amp;"; break;
    case '<': rep = "&lt;"; break;
    case '>': rep = "&gt;"; break;
    case '"': rep = "&quot;"; break;
    case '\'': rep = "&#39;"; break;
    default: break;
    }
    if (rep) { st_buf_str(b, rep); i++; continue; }
    if (c < 0x20 && c != '\t' && c != '\n') { st_buf_str(b, "\xEF\xBF\xBD"); i++; continue; }
    if (c == 0x7F) { st_buf_str(b, "\xEF\xBF\xBD"); i++; continue; }
    size_t len = utf8_length(s + i, n - i);
    if (!len) { st_buf_str(b, "\xEF\xBF\xBD"); i++; continue; }
    st_buf_add(b, s + i, len);
    i += len;
  }
}

void st_html_text(st_buf *b, const char *s) {
  if (s) st_html_escape(b, s, strlen(s));
}

/* An id attribute's value: [A-Za-z0-9_-], anything else '-'. */
static void put_id(st_buf *b, const char *id) {
  for (const char *p = id ? id : "x"; *p; p++) {
    char c = *p;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    st_buf_add(b, ok ? &c : "-", 1);
  }
}

/* A number for a data- attribute or a label: integers without a fraction, others round-trip. */
static void put_number(st_buf *b, double v) {
  if (isnan(v)) st_buf_str(b, "NaN");
  else if (isinf(v)) st_buf_str(b, v > 0 ? "Infinity" : "-Infinity");
  else if (v == floor(v) && fabs(v) < 1e15) st_buf_printf(b, "%.0f", v);
  else st_buf_printf(b, "%.17g", v);
}

/* Short form for labels. */
static void put_short(st_buf *b, double v) {
  if (isnan(v)) st_buf_str(b, "-");
  else if (v == floor(v) && fabs(v) < 1e9) st_buf_printf(b, "%.0f", v);
  else st_buf_printf(b, "%.4g", v);
}

/* ---------------------------------------------------------------- page */

static const char page_css[] =
  ":root{--ok:#1a7f37;--bad:#c62828;--mid:#b26a00;--ink:#1f2328;--mute:#57606a;--line:#d0d7de}\n"
  "body{font:14px/1.45 system-ui,-apple-system,'DejaVu Sans',sans-serif;color:var(--ink);"
  "margin:24px auto;max-width:1280px;padding:0 16px}\n"
  "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid var(--line)}"
  "h3{font-size:14px;margin:16px 0 6px}\n"
  "table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}"
  "th,td{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}"
  "th{background:#f6f8fa}td{font-variant-numeric:tabular-nums}\n"
  "table.kv th{width:12em}td.wrap{white-space:pre-wrap;word-break:break-all;max-width:900px}\n"
  ".note{color:var(--mute)}.sentence{font-weight:600;background:#fff8c5;padding:6px 10px;"
  "border-left:4px solid var(--mid)}\n"
  ".pair{display:flex;flex-wrap:wrap;gap:16px}.pair>div{flex:1 1 560px;min-width:0}\n"
  "figure{margin:8px 0 16px;overflow-x:auto}figcaption{color:var(--mute);font-size:12px}\n"
  "svg text{font:11px system-ui,'DejaVu Sans',sans-serif;fill:var(--ink)}\n"
  "svg [data-value]:hover,svg [data-state]:hover{stroke:#000;stroke-width:1.5}\n"
  ".readout{min-height:1.4em;font-size:12px;color:var(--mute);font-family:monospace}\n"
  "footer{margin-top:32px;color:var(--mute);font-size:12px}\n"
  "@media print{body{margin:0;max-width:none}.readout{display:none}section{break-inside:avoid-page}"
  "figure{overflow:visible}}\n";

/* Hovering a drawn value shows its tooltip text in the figure's readout line (the <title> is
** also the browser's own tooltip); nothing else runs. */
static const char page_js[] =
  "document.addEventListener('mouseover',function(e){\n"
  "  var el=e.target.closest&&e.target.closest('[data-value],[data-state]');\n"
  "  if(!el)return;var fig=el.closest('figure');if(!fig)return;\n"
  "  var out=fig.querySelector('.readout'),t=el.querySelector('title');\n"
  "  if(out&&t)out.textContent=t.textContent;\n"
  "});\n";

void st_html_begin(st_buf *b, const char *title) {
  st_buf_str(b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
                "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n"
                "<meta name=\"generator\" content=\"sparsetrace report\">\n<title>");
  st_html_text(b, title);
  st_buf_printf(b, "</title>\n<style>\n%s</style>\n<script>\n%s</script>\n</head><body>\n<h1>", page_css,
                page_js);
  st_html_text(b, title);
  st_buf_str(b, "</h1>\n");
}

void st_html_end(st_buf *b, const char *footer) {
  st_buf_str(b, "<footer>");
  st_html_text(b, footer);
  st_buf_str(b, "</footer>\n</body></html>\n");
}

void st_html_section_begin(st_buf *b, const char *id, const char *title) {
  st_buf_str(b, "<section id=\"");
  put_id(b, id);
  st_buf_str(b, "\"><h2>");
  st_html_text(b, title);
  st_buf_str(b, "</h2>\n");
}

void st_html_section_end(st_buf *b) { st_buf_str(b, "</section>\n"); }

void st_html_paragraph(st_buf *b, const char *cls, const char *text) {
  st_buf_str(b, "<p");
  if (cls) { st_buf_str(b, " class=\""); put_id(b, cls); st_buf_str(b, "\""); }
  st_buf_str(b, ">");
  st_html_text(b, text);
  st_buf_str(b, "</p>\n");
}

/* ---------------------------------------------------------------- tables */

void st_html_table_begin(st_buf *b, const char *id, const char *const *headers, int n) {
  st_buf_str(b, "<table id=\"");
  put_id(b, id);
  st_buf_str(b, "\"><thead><tr>");
  for (int i = 0; i < n; i++) {
    st_buf_str(b, "<th>");
    st_html_text(b, headers[i]);
    st_buf_str(b, "</th>");
  }
  st_buf_str(b, "</tr></thead><tbody>\n");
}

void st_html_table_row(st_buf *b, const char *const *cells, int n) {
  st_buf_str(b, "<tr>");
  for (int i = 0; i < n; i++) {
    st_buf_str(b, "<td>");
    st_html_text(b, cells[i] ? cells[i] : "-");
    st_buf_str(b, "</td>");
  }
  st_buf_str(b, "</tr>\n");
}

void st_html_table_end(st_buf *b) { st_buf_str(b, "</tbody></table>\n"); }

void st_html_key_values(st_buf *b, const char *id, const char *const *keys,
                        const char *const *values, int n) {
  st_buf_str(b, "<table class=\"kv\" id=\"");
  put_id(b, id);
  st_buf_str(b, "\"><tbody>\n");
  for (int i = 0; i < n; i++) {
    if (!values[i]) continue;
    st_buf_str(b, "<tr><th>");
    st_html_text(b, keys[i]);
    st_buf_str(b, "</th><td class=\"wrap\" data-key=\"");
    st_html_text(b, keys[i]);
    st_buf_str(b, "\">");
    st_html_text(b, values[i]);
    st_buf_str(b, "</td></tr>\n");
  }
  st_buf_str(b, "</tbody></table>\n");
}

/* ---------------------------------------------------------------- figures */

static void figure_begin(st_buf *b, const char *id, double width, double height) {
  st_buf_str(b, "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" id=\"");
  put_id(b, id);
  st_buf_printf(b, "\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" role=\"img\">\n", width, height,
                width, height);
}

static void figure_end(st_buf *b, const char *caption) {
  st_buf_str(b, "</svg><div class=\"readout\"></div><figcaption>");
  st_html_text(b, caption);
  st_buf_str(b, "</figcaption></figure>\n");
}

static void svg_text(st_buf *b, double x, double y, const char *anchor, const char *text) {
  st_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">", x, y, anchor);
  st_html_text(b, text);
  st_buf_str(b, "</text>\n");
}

/* Rank colour: t in [0, 1], 0 = best (green) through amber to red. */
static void rank_colour(double t, char out[8]) {
  static const double stops[3][3] = {{26, 127, 55}, {230, 171, 2}, {198, 40, 40}};
  if (t < 0) t = 0;
  if (t > 1) t = 1;
  int s = t < 0.5 ? 0 : 1;
  double u = t < 0.5 ? t * 2 : (t - 0.5) * 2;
  int rgb[3];
  for (int i = 0; i < 3; i++) rgb[i] = (int)lround(stops[s][i] + u * (stops[s + 1][i] - stops[s][i]));
  snprintf(out, 8, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

void st_html_heatmap_svg(st_buf *b, const st_html_heatmap *h) {
  /* 18 px columns for a short answer, down to 1200 px in all for a long trace */
  double cell_w = h->n_cols > 200 ? 1200.0 / h->n_cols : h->n_cols > 100 ? 6 : h->n_cols > 40 ? 12 : 30;
  double cell_h = 22, left = 90, top = 28, legend = 44;
  double width = left + cell_w * (h->n_cols > 0 ? h->n_cols : 1) + 20;
  if (width < left + 620) width = left + 620; /* the legend's ramp and its top-k text */
  double height = top + cell_h * h->n_rows + 30 + legend;
  double max = 0;
  for (int i = 0; i < h->n_rows * h->n_cols; i++)
    if (h->values[i] > max) max = h->values[i];
  if (h->line > max) max = h->line;
  double log_max = log1p(max > 0 ? max : 1);
  const char *vn = h->value_name ? h->value_name : "value";
  figure_begin(b, h->id, width, height);
  st_buf_str(b, "<defs><pattern id=\"");
  put_id(b, h->id);
  st_buf_str(b, "-hatch\" width=\"4\" height=\"4\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
                "<rect width=\"2\" height=\"4\" fill=\"#fff\" fill-opacity=\"0.55\"/></pattern></defs>\n");
  svg_text(b, left, 14, "start", h->title);
  for (int r = 0; r < h->n_rows; r++) {
    svg_text(b, left - 6, top + cell_h * r + cell_h * 0.68, "end", h->row_names[r]);
    st_buf_printf(b, "<g data-heat-row=\"%lld\">\n", (long long)h->row_keys[r]);
    for (int c = 0; c < h->n_cols; c++) {
      double v = h->values[(size_t)r * h->n_cols + c];
      int over = h->line > 0 && v >= h->line;
      char colour[8] = "#d0d7de";
      if (v >= 0) rank_colour(log1p(v) / log_max, colour);
      double x = left + cell_w * c, y = top + cell_h * r;
      st_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" data-row=\"%lld\" "
                       "data-col=\"%lld\" data-value=\"",
                    x, y, cell_w, cell_h - 2, colour, (long long)h->row_keys[r], (long long)h->col_keys[c]);
      put_number(b, v);
      st_buf_printf(b, "\" data-over=\"%d\"><title>", over);
      st_html_text(b, h->row_names[r]);
      st_buf_str(b, ", ");
      st_html_text(b, h->col_axis);
      st_buf_printf(b, " %lld: ", (long long)h->col_keys[c]);
      st_html_text(b, vn);
      st_buf_str(b, " ");
      if (v >= 0) put_short(b, v);
      else st_buf_str(b, "none (no verdict)");
      if (h->line > 0 && v >= 0) {
        st_buf_str(b, over ? " (outside the " : " (inside the ");
        st_html_text(b, h->line_name);
        st_buf_str(b, ")");
      }
      if (h->col_notes && h->col_notes[c]) { st_buf_str(b, "; "); st_html_text(b, h->col_notes[c]); }
      st_buf_str(b, "</title></rect>\n");
      if (over) {
        st_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"url(#", x, y, cell_w,
                      cell_h - 2);
        put_id(b, h->id);
        st_buf_str(b, "-hatch)\" pointer-events=\"none\"/>\n");
      }
    }
    st_buf_str(b, "</g>\n");
  }
  /* column axis: first, last and a few between */
  double axis_y = top + cell_h * h->n_rows + 14;
  int step = h->n_cols > 8 ? (h->n_cols + 7) / 8 : 1;
  for (int c = 0; c < h->n_cols; c += step) {
    char label[32];
    snprintf(label, sizeof label, "%lld", (long long)h->col_keys[c]);
    svg_text(b, left + cell_w * c + cell_w / 2, axis_y, "middle", label);
  }
  svg_text(b, left - 6, axis_y, "end", h->col_axis);
  /* legend: the colour ramp from rank 0 to max, with the top-k line on it */
  double ly = axis_y + 12, lw = 240;
  for (int i = 0; i < 48; i++) {
    char colour[8];
    rank_colour(i / 47.0, colour);
    st_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"10\" fill=\"%s\"/>\n", left + lw * i / 48,
                  ly, lw / 48 + 0.3, colour);
  }
  char label[96];
  snprintf(label, sizeof label, "%s 0", vn);
  svg_text(b, left, ly + 24, "start", label);
  snprintf(label, sizeof label, "%.0f", max);
  svg_text(b, left + lw, ly + 24, "end", label);
  if (h->line > 0) {
    double x = left + lw * log1p(h->line) / log_max;
    st_buf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" stroke-width=\"2\" "
                     "data-line=\"%.17g\"/>\n", x, x, ly - 3, ly + 13, h->line);
    snprintf(label, sizeof label, "%s (hatched: %s >= %.0f, outside)", h->line_name ? h->line_name : "line", vn,
             h->line);
    svg_text(b, left + lw + 12, ly + 9, "start", label);
  }
  char caption[256];
  snprintf(caption, sizeof caption, "%s per %s x %s (log colour scale); grey: no verdict recorded", vn,
           h->row_axis, h->col_axis);
  figure_end(b, caption);
}

void st_html_grid_svg(st_buf *b, const st_html_grid *g) {
  double cell_w = 86, cell_h = 34, left = 110, top = 58;
  double width = left + cell_w * g->n_cols + 20, height = top + cell_h * g->n_rows + 24;
  figure_begin(b, g->id, width, height);
  svg_text(b, left, 14, "start", g->title);
  svg_text(b, left - 8, top - 8, "end", g->row_axis);
  for (int c = 0; c < g->n_cols; c++) svg_text(b, left + cell_w * c + cell_w / 2, top - 8, "middle", g->col_names[c]);
  svg_text(b, left + cell_w * g->n_cols / 2, 32, "middle", g->col_axis);
  for (int r = 0; r < g->n_rows; r++) {
    svg_text(b, left - 8, top + cell_h * r + cell_h * 0.6, "end", g->row_names[r]);
    for (int c = 0; c < g->n_cols; c++) {
      size_t i = (size_t)r * g->n_cols + c;
      int s = g->state[i];
      const char *fill = s == 1 ? "#1a7f37" : s == 0 ? "#c62828" : s == 2 ? "#e6ab02" : "#eaeef2";
      double x = left + cell_w * c, y = top + cell_h * r;
      st_buf_printf(b, "<g><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" data-row=\"", x, y,
                    cell_w - 3, cell_h - 3, fill);
      st_html_text(b, g->row_names[r]);
      st_buf_str(b, "\" data-col=\"");
      st_html_text(b, g->col_names[c]);
      st_buf_printf(b, "\" data-state=\"%d\" data-label=\"", s);
      if (g->label && g->label[i]) st_html_text(b, g->label[i]);
      st_buf_str(b, "\"><title>");
      if (g->hover && g->hover[i]) st_html_text(b, g->hover[i]);
      st_buf_str(b, "</title></rect>");
      if (g->label && g->label[i]) {
        st_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" pointer-events=\"none\" "
                         "style=\"fill:#fff;font-weight:600\">", x + (cell_w - 3) / 2, y + cell_h * 0.58);
        st_html_text(b, g->label[i]);
        st_buf_str(b, "</text>");
      }
      st_buf_str(b, "</g>\n");
    }
  }
  figure_end(b, "green: every attempt passed; red: none; amber: some. Hover a cell for the answers.");
}

void st_html_histogram_svg(st_buf *b, const st_html_histogram *h) {
  int bins = h->n_bins > 0 ? h->n_bins : 40;
  double lo = INFINITY, hi = -INFINITY;
  int64_t finite = 0;
  for (int64_t i = 0; i < h->n; i++)
    if (isfinite(h->values[i])) {
      finite++;
      if (h->values[i] < lo) lo = h->values[i];
      if (h->values[i] > hi) hi = h->values[i];
    }
  if (!finite) lo = 0, hi = 1;
  if (hi <= lo) hi = lo + 1;
  int64_t counts[512] = {0};
  if (bins > 512) bins = 512;
  for (int64_t i = 0; i < h->n; i++) {
    if (!isfinite(h->values[i])) continue;
    int k = (int)((h->values[i] - lo) / (hi - lo) * bins);
    counts[k >= bins ? bins - 1 : k < 0 ? 0 : k]++;
  }
  int64_t cmax = 1;
  for (int k = 0; k < bins; k++)
    if (counts[k] > cmax) cmax = counts[k];
  double left = 44, top = 24, plot_w = 420, plot_h = 120;
  double width = left + plot_w + 20, height = top + plot_h + 46;
  figure_begin(b, h->id, width, height);
  svg_text(b, left, 14, "start", h->title);
  double bw = plot_w / bins;
  for (int k = 0; k < bins; k++) {
    double blo = lo + (hi - lo) * k / bins, bhi = lo + (hi - lo) * (k + 1) / bins;
    double bh = plot_h * (double)counts[k] / (double)cmax;
    st_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.2f\" fill=\"#8c959f\" data-bin=\"%d\" "
                     "data-lo=\"%.9g\" data-hi=\"%.9g\" data-count=\"%lld\" data-value=\"%lld\"><title>%.4g .. %.4g: "
                     "%lld rows</title></rect>\n",
                  left + bw * k, top + plot_h - bh, bw - 0.5 > 0.5 ? bw - 0.5 : bw, bh, k, blo, bhi,
                  (long long)counts[k], (long long)counts[k], blo, bhi, (long long)counts[k]);
  }
  st_buf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#57606a\"/>\n", left,
                left + plot_w, top + plot_h, top + plot_h);
  char label[64];
  snprintf(label, sizeof label, "%.4g", lo);
  svg_text(b, left, top + plot_h + 14, "start", label);
  snprintf(label, sizeof label, "%.4g", hi);
  svg_text(b, left + plot_w, top + plot_h + 14, "end", label);
  svg_text(b, left + plot_w / 2, top + plot_h + 14, "middle", h->value_axis);
  snprintf(label, sizeof label, "%lld", (long long)cmax);
  svg_text(b, left - 4, top + 8, "end", label);
  if (!isnan(h->line) && isfinite(h->line)) {
    double x = left + plot_w * (h->line - lo) / (hi - lo);
    st_buf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" stroke-dasharray=\"4 3\" "
                     "data-line=\"%.9g\"><title>", x, x, top - 4, top + plot_h, h->line);
    st_html_text(b, h->line_name);
    st_buf_printf(b, ": %.6g</title></line>\n", h->line);
  }
  for (int m = 0; m < h->n_marks; m++) {
    if (!isfinite(h->marks[m])) continue;
    double x = left + plot_w * (h->marks[m] - lo) / (hi - lo);
    st_buf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#c62828\" stroke-width=\"2\" "
                     "data-mark=\"", x, x, top, top + plot_h + 4);
    st_html_text(b, h->mark_names[m]);
    st_buf_printf(b, "\" data-value=\"%.9g\"><title>", h->marks[m]);
    st_html_text(b, h->mark_names[m]);
    st_buf_printf(b, ": score %.6g</title></line>\n", h->marks[m]);
  }
  char caption[200];
  snprintf(caption, sizeof caption, "%lld visible rows in %d bins; red: the needle's rows; dashed: %s%s",
           (long long)finite, bins, h->line_name ? h->line_name : "-",
           finite < h->n ? " (rows not visible at this position, -inf, are left out)" : "");
  figure_end(b, caption);
}

void st_html_bars_svg(st_buf *b, const st_html_bars *h) {
  double left = 230, top = 24, bar_h = 14, plot_w = 420;
  double width = left + plot_w + 120, height = top + (bar_h + 3) * h->n + 30;
  double max = h->max;
  if (max <= 0)
    for (int i = 0; i < h->n; i++)
      if (isfinite(h->values[i]) && h->values[i] > max) max = h->values[i];
  if (max <= 0) max = 1;
  const double floor_log = -12;
  double top_log = max > 0 ? ceil(log10(max)) : 0;
  if (top_log <= floor_log) top_log = floor_log + 1;
  figure_begin(b, h->id, width, height);
  svg_text(b, left, 14, "start", h->title);
  for (int i = 0; i < h->n; i++) {
    double v = h->values[i], y = top + (bar_h + 3) * i, w = 0;
    if (isfinite(v)) {
      if (h->log) {
        double l = v > 0 ? log10(v) : floor_log;
        if (l < floor_log) l = floor_log;
        w = plot_w * (l - floor_log) / (top_log - floor_log);
      } else {
        w = plot_w * (v < 0 ? 0 : v) / max;
      }
    }
    int flag = h->flag ? h->flag[i] : 0;
    svg_text(b, left - 6, y + bar_h * 0.8, "end", h->names[i]);
    st_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" data-name=\"", left, y,
                  w < 1 && isfinite(v) ? 1 : w, bar_h, flag ? "#c62828" : "#0969da");
    st_html_text(b, h->names[i]);
    st_buf_str(b, "\" data-value=\"");
    put_number(b, v);
    st_buf_printf(b, "\" data-flag=\"%d\"><title>", flag);
    st_html_text(b, h->names[i]);
    st_buf_str(b, ": ");
    put_short(b, v);
    if (h->notes && h->notes[i]) { st_buf_str(b, "; "); st_html_text(b, h->notes[i]); }
    st_buf_str(b, "</title></rect>\n");
    char label[48];
    if (isfinite(v)) snprintf(label, sizeof label, "%.4g", v);
    else snprintf(label, sizeof label, "-");
    svg_text(b, left + (w < 1 ? 1 : w) + 4, y + bar_h * 0.8, "start", label);
  }
  char caption[160];
  if (h->log) snprintf(caption, sizeof caption, "%s, log scale from 1e-12 (0 is drawn at the floor); red: diverges",
                       h->value_axis);
  else snprintf(caption, sizeof caption, "%s, linear scale 0 .. %.4g", h->value_axis, max);
  figure_end(b, caption);
}
