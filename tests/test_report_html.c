/*
** test_report_html.c — report/html.c, the page writer: escaping (markup, quotes, invalid UTF-8,
** control bytes), figures that carry exactly the values handed to them in data- attributes with
** every label escaped, histogram bins counted against a brute-force count, and a failed append
** (st_buf's maximum) reported once at the end.
*/
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/buf.h"
#include "report/html.h"

static char *escaped(const char *s, size_t n) {
  st_buf b = {0};
  st_html_escape(&b, s, n);
  st_buf_add(&b, "", 0);
  return st_buf_take(&b, NULL);
}

static void test_escape_markup_and_quotes(void **state) {
  const char *markup = "<script>a & 'b' \"c\"</script>";
  char *e = escaped(markup, strlen(markup));
  assert_string_equal(e, "&lt;script&gt;a &amp; &#39;b&#39; &quot;c&quot;&lt;/script&gt;");
  free(e);
  e = escaped("tab\tand\nnewline", 15); /* kept: legible in pre-wrap cells */
  assert_string_equal(e, "tab\tand\nnewline");
  free(e);
}

static void test_escape_replaces_bytes_that_are_not_text(void **state) {
  const char fffd[] = "\xEF\xBF\xBD";
  char want[64];
  /* a lone continuation byte, a truncated 3-byte sequence, an overlong '/', a surrogate, NUL, ESC */
  char *e = escaped("a\x80" "b", 3);
  snprintf(want, sizeof want, "a%sb", fffd);
  assert_string_equal(e, want);
  free(e);
  e = escaped("\xE2\x82", 2);
  snprintf(want, sizeof want, "%s%s", fffd, fffd);
  assert_string_equal(e, want);
  free(e);
  e = escaped("\xC0\xAF", 2);
  assert_string_equal(e, want);
  free(e);
  e = escaped("\xED\xA0\x80", 3);
  snprintf(want, sizeof want, "%s%s%s", fffd, fffd, fffd);
  assert_string_equal(e, want);
  free(e);
  e = escaped("x\0y\x1b", 4);
  snprintf(want, sizeof want, "x%sy%s", fffd, fffd);
  assert_string_equal(e, want);
  free(e);
  /* valid multi-byte text passes unchanged: é, €, U+1F600 */
  e = escaped("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 9);
  assert_string_equal(e, "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  free(e);
}

/* Count occurrences of needle in hay. */
static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static void test_heatmap_values_and_escaped_labels(void **state) {
  const char *rows[] = {"<b>layer 1</b>", "layer 3"};
  int64_t row_keys[] = {1, 3}, col_keys[] = {100, 101, 102};
  double values[] = {0, 31, 32, -1, 7, 500};
  st_html_heatmap h = {.id = "r\"x", .title = "t<i>", .row_axis = "layer", .col_axis = "pos", .n_rows = 2,
                       .n_cols = 3, .row_names = rows, .row_keys = row_keys, .col_keys = col_keys,
                       .values = values, .line = 32, .line_name = "top-32", .value_name = "rank"};
  st_buf b = {0};
  st_html_heatmap_svg(&b, &h);
  assert_int_equal(st_buf_status(&b, "heat map"), ST_OK);
  assert_non_null(strstr(b.data, "data-row=\"1\" data-col=\"100\" data-value=\"0\" data-over=\"0\""));
  assert_non_null(strstr(b.data, "data-row=\"1\" data-col=\"101\" data-value=\"31\" data-over=\"0\""));
  assert_non_null(strstr(b.data, "data-row=\"1\" data-col=\"102\" data-value=\"32\" data-over=\"1\""));
  assert_non_null(strstr(b.data, "data-row=\"3\" data-col=\"100\" data-value=\"-1\" data-over=\"0\""));
  assert_non_null(strstr(b.data, "data-row=\"3\" data-col=\"102\" data-value=\"500\" data-over=\"1\""));
  assert_int_equal(count(b.data, "data-col="), 6);
  assert_int_equal(count(b.data, "-hatch)\""), 2); /* the two cells at or past the top-k */
  assert_null(strstr(b.data, "<b>"));
  assert_null(strstr(b.data, "<i>"));
  assert_non_null(strstr(b.data, "&lt;b&gt;layer 1&lt;/b&gt;"));
  assert_non_null(strstr(b.data, "id=\"r-x\"")); /* ids keep [A-Za-z0-9_-] only */
  st_buf_free(&b);
}

static void test_histogram_bins_match_a_brute_force_count(void **state) {
  enum { N = 1000, BINS = 7 };
  float v[N];
  uint32_t s = 12345;
  for (int i = 0; i < N; i++) {
    s = s * 1664525u + 1013904223u;
    v[i] = (float)((s >> 8) % 10000) / 100.0f - 20.0f;
  }
  v[3] = -INFINITY, v[10] = NAN; /* not counted */
  double lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < N; i++)
    if (isfinite(v[i])) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
  int want[BINS] = {0};
  for (int i = 0; i < N; i++) {
    if (!isfinite(v[i])) continue;
    int k = 0; /* brute force: the bin whose half-open range holds it, the last one closed */
    while (k < BINS - 1 && !(v[i] < lo + (hi - lo) * (k + 1) / BINS)) k++;
    want[k]++;
  }
  double marks[] = {v[0]};
  const char *names[] = {"row <0>"};
  st_html_histogram h = {.id = "h", .title = "x", .value_axis = "score", .values = v, .n = N, .n_bins = BINS,
                         .marks = marks, .mark_names = names, .n_marks = 1, .line = 1.5, .line_name = "k"};
  st_buf b = {0};
  st_html_histogram_svg(&b, &h);
  assert_int_equal(st_buf_status(&b, "histogram"), ST_OK);
  int total = 0;
  for (int k = 0; k < BINS; k++) {
    char key[64];
    snprintf(key, sizeof key, "data-bin=\"%d\"", k);
    const char *p = strstr(b.data, key);
    assert_non_null(p);
    p = strstr(p, "data-count=\"");
    assert_non_null(p);
    int got = atoi(p + strlen("data-count=\""));
    assert_int_equal(got, want[k]);
    total += got;
  }
  assert_int_equal(total, N - 2);
  assert_non_null(strstr(b.data, "data-mark=\"row &lt;0&gt;\""));
  assert_non_null(strstr(b.data, "data-line=\"1.5\""));
  st_buf_free(&b);
}

static void test_grid_and_bars_carry_their_values(void **state) {
  const char *rows[] = {"1024 tokens"}, *cols[] = {"0.25", "0.75"};
  int st[] = {1, 2};
  const char *label[] = {"2/2", "1/2"}, *hover[] = {"seed 1: </title><script>x</script>", NULL};
  st_html_grid g = {.id = "g", .title = "grid", .row_axis = "context", .col_axis = "position", .n_rows = 1,
                    .n_cols = 2, .row_names = rows, .col_names = cols, .state = st, .label = label, .hover = hover};
  st_buf b = {0};
  st_html_grid_svg(&b, &g);
  assert_non_null(strstr(b.data, "data-row=\"1024 tokens\" data-col=\"0.75\" data-state=\"2\" data-label=\"1/2\""));
  assert_non_null(strstr(b.data, "seed 1: &lt;/title&gt;&lt;script&gt;x&lt;/script&gt;"));
  assert_null(strstr(b.data, "<script>"));
  st_buf_reset(&b);
  const char *names[] = {"layers.1.indexer.q", "layers.1.indexer.q_used"};
  double values[] = {0, 1.0019};
  int flags[] = {0, 1};
  st_html_bars bars = {.id = "b", .title = "diff", .value_axis = "difference", .n = 2, .names = names,
                       .values = values, .flag = flags, .log = 1};
  st_html_bars_svg(&b, &bars);
  assert_non_null(strstr(b.data, "data-name=\"layers.1.indexer.q\" data-value=\"0\" data-flag=\"0\""));
  assert_non_null(strstr(b.data, "data-name=\"layers.1.indexer.q_used\" data-value=\"1.0019\" data-flag=\"1\""));
  st_buf_free(&b);
}

static void test_page_is_self_contained_and_failure_is_reported(void **state) {
  st_buf b = {0};
  st_html_begin(&b, "report <x>");
  st_html_end(&b, "footer & co");
  assert_int_equal(st_buf_status(&b, "page"), ST_OK);
  assert_non_null(strstr(b.data, "<title>report &lt;x&gt;</title>"));
  assert_non_null(strstr(b.data, "footer &amp; co"));
  assert_null(strstr(b.data, "src="));
  assert_null(strstr(b.data, "href="));
  assert_null(strstr(b.data, "https:"));
  st_buf_free(&b);
  st_buf_init(&b, 64); /* the page does not fit: the first failed append is kept and reported */
  st_html_begin(&b, "report");
  st_html_end(&b, "footer");
  assert_int_equal(b.failed, ST_ETOOBIG);
  assert_int_equal(st_buf_status(&b, "page"), ST_ETOOBIG);
  st_buf_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_escape_markup_and_quotes),
    cmocka_unit_test(test_escape_replaces_bytes_that_are_not_text),
    cmocka_unit_test(test_heatmap_values_and_escaped_labels),
    cmocka_unit_test(test_histogram_bins_match_a_brute_force_count),
    cmocka_unit_test(test_grid_and_bars_carry_their_values),
    cmocka_unit_test(test_page_is_self_contained_and_failure_is_reported),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
