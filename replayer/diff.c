/*
** diff.c — tap-by-tap comparison of two traces (contract, rules and alignment in diff.h).
**
** One tap at a time: the row pairs to compare are worked out first (positions both traces kept,
** or row indices for compressed-row taps), then runs of consecutive pairs are read in blocks of
** at most block_bytes per trace, padded to a common width when a growing axis ended at different
** widths, and fed to the accumulators of metrics.h. The verdict is decided once the whole tap
** has been seen; the worst place is mapped back from a flat element index to a token position
** and the coordinates inside its row.
*/
#include "diff.h"

#include "engine/config.h"

#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_BLOCK_BYTES ((size_t)32 << 20)

/* ---------------------------------------------------------------- rules */

static const char *const metric_names[] = {"diff", "cosine", "maxabs", "jaccard",
                                           "overlap", "exact", "ignore"};

const char *st_diff_metric_name(st_diff_metric m) {
  return (unsigned)m < sizeof metric_names / sizeof *metric_names ? metric_names[m] : "?";
}

const char *st_diff_verdict_name(st_diff_verdict v) {
  static const char *const names[] = {"ok", "DIVERGES", "only in A", "only in B", "ignored",
                                      "not compared", "no common positions", "unsupported dtype",
                                      "ties only"};
  return (unsigned)v < sizeof names / sizeof *names ? names[v] : "?";
}

int st_diff_verdict_compared(st_diff_verdict v) {
  return v == ST_DIFF_OK || v == ST_DIFF_DIVERGES || v == ST_DIFF_TIE;
}

/* The defaults of ST_DIFF_PROFILE_IMPORTED, first match wins (globs on the tap suffix). The diff
** metric of two tensors whose elements differ by independent relative errors e is about E[e^2]/2:
** one bf16 rounding (unit roundoff 2^-8) gives 2.6e-6, a layer of a bf16 engine chains tens of
** them, so activations get 1e-3; the indexer's sides are scored in fp8 (2^-4: 6.5e-4 per rounding)
** or fp4 (2^-2: 1.0e-2), so its quantised inputs and its scores get 3e-2; the logits sum every
** layer's error, 1e-2. Top-k sets of slightly different scores swap rows near the boundary: a
** Jaccard of 0.9 allows about one row in twenty (a rotated or misread side gives far less); the
** routed experts (k of 6) may swap one (5/7 = 0.71). Integer taps stay exact. */
static const struct {
  const char *glob;
  st_diff_metric metric;
  double threshold;
  st_diff_kind kind;
} imported_defaults[] = {
  {"indexer.q_used", ST_DIFF_METRIC_DIFF, 3e-2, ST_DIFF_KIND_FLOAT},
  {"indexer.k_used", ST_DIFF_METRIC_DIFF, 3e-2, ST_DIFF_KIND_FLOAT},
  {"indexer.scores", ST_DIFF_METRIC_DIFF, 3e-2, ST_DIFF_KIND_FLOAT},
  {"logits", ST_DIFF_METRIC_DIFF, 1e-2, ST_DIFF_KIND_FLOAT},
  {"*", ST_DIFF_METRIC_DIFF, 1e-3, ST_DIFF_KIND_FLOAT},
  {"indexer.topk", ST_DIFF_METRIC_JACCARD, 0.9, ST_DIFF_KIND_INDEX_SET},
  {"*", ST_DIFF_METRIC_JACCARD, 0.7, ST_DIFF_KIND_INDEX_SET},
  {"*", ST_DIFF_METRIC_EXACT, 0, ST_DIFF_KIND_INTEGER},
};

const char *st_diff_profile_name(st_diff_profile p) {
  return p == ST_DIFF_PROFILE_IMPORTED ? "imported" : "same-engine";
}

int st_diff_metric_applies(st_diff_metric m, st_diff_kind k) {
  switch (m) {
  case ST_DIFF_METRIC_DIFF: case ST_DIFF_METRIC_COSINE: case ST_DIFF_METRIC_MAXABS:
    return k == ST_DIFF_KIND_FLOAT;
  case ST_DIFF_METRIC_JACCARD: case ST_DIFF_METRIC_OVERLAP:
    return k == ST_DIFF_KIND_INDEX_SET;
  case ST_DIFF_METRIC_EXACT: case ST_DIFF_METRIC_IGNORE:
    return 1;
  }
  return 0;
}

static double default_threshold(st_diff_metric m) {
  switch (m) {
  case ST_DIFF_METRIC_DIFF: return ST_DIFF_DEFAULT_FLOAT_TOLERANCE;
  case ST_DIFF_METRIC_COSINE: return 1.0;
  case ST_DIFF_METRIC_JACCARD: case ST_DIFF_METRIC_OVERLAP: return ST_DIFF_DEFAULT_SET_JACCARD;
  default: return 0;
  }
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
  return s;
}

static st_status parse_rule(char *text, st_diff_rule *r) {
  char *eq = strchr(text, '=');
  if (!eq) return st_fail(ST_EINVAL, "tolerance rule '%s': expected GLOB=METRIC[:THRESHOLD]", text);
  *eq = 0;
  char *glob = trim(text), *metric = trim(eq + 1);
  if (!*glob) return st_fail(ST_EINVAL, "tolerance rule '=%s': empty tap glob", metric);
  if (strlen(glob) >= sizeof r->glob)
    return st_fail(ST_EINVAL, "tolerance rule '%s': glob longer than %zu characters", glob,
                   sizeof r->glob - 1);
  char *colon = strchr(metric, ':');
  if (colon) *colon = 0;
  metric = trim(metric);
  int m = -1;
  for (size_t i = 0; i < sizeof metric_names / sizeof *metric_names; i++)
    if (!strcmp(metric, metric_names[i])) m = (int)i;
  if (m < 0)
    return st_fail(ST_EINVAL, "tolerance rule '%s=%s': unknown metric '%s' (diff, cosine, maxabs, "
                              "jaccard, overlap, exact, ignore)", glob, metric, metric);
  memset(r, 0, sizeof *r);
  snprintf(r->glob, sizeof r->glob, "%s", glob);
  r->metric = (st_diff_metric)m;
  r->threshold = default_threshold(r->metric);
  if (colon) {
    char *num = trim(colon + 1), *end = NULL;
    if (m == ST_DIFF_METRIC_EXACT || m == ST_DIFF_METRIC_IGNORE)
      return st_fail(ST_EINVAL, "tolerance rule '%s=%s:%s': %s takes no threshold", glob, metric,
                     num, metric);
    errno = 0;
    double t = strtod(num, &end);
    if (!*num || *end || errno || !isfinite(t) || (t < 0 && m != ST_DIFF_METRIC_COSINE))
      return st_fail(ST_EINVAL, "tolerance rule '%s=%s:%s': threshold '%s' is not a finite "
                                "number >= 0", glob, metric, num, num);
    r->threshold = t;
  }
  return ST_OK;
}

st_status st_diff_rules_parse(st_diff_rules *rules, const char *text) {
  char *copy = strdup(text ? text : "");
  if (!copy) return st_fail(ST_ENOMEM, "tolerance rules");
  st_status st = ST_OK;
  int n0 = rules->n;
  char *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    tok = trim(tok);
    if (!*tok) continue;
    st_diff_rule r;
    if ((st = parse_rule(tok, &r))) break;
    if (rules->n == rules->cap) {
      int cap = rules->cap ? rules->cap * 2 : 8;
      st_diff_rule *v = realloc(rules->v, (size_t)cap * sizeof *v);
      if (!v) {
        st = st_fail(ST_ENOMEM, "tolerance rules");
        break;
      }
      rules->v = v;
      rules->cap = cap;
    }
    rules->v[rules->n++] = r;
  }
  if (st == ST_OK && rules->n == n0)
    st = st_fail(ST_EINVAL, "tolerance '%s': no rule in it (expected GLOB=METRIC[:THRESHOLD])",
                 text ? text : "");
  if (st) rules->n = n0;
  free(copy);
  return st;
}

void st_diff_rules_free(st_diff_rules *rules) {
  if (!rules) return;
  free(rules->v);
  memset(rules, 0, sizeof *rules);
}

st_diff_kind st_diff_tap_kind(const st_trace_tap *tap) {
  switch (tap->dtype) {
  case ST_F32: case ST_F64: case ST_F16: case ST_BF16:
    return ST_DIFF_KIND_FLOAT;
  case ST_I8: case ST_U8: case ST_I32: case ST_I64: case ST_BOOL:
    return tap->id == ST_TAP_INDEXER_TOPK || tap->id == ST_TAP_FFN_EXPERTS ? ST_DIFF_KIND_INDEX_SET
                                                                          : ST_DIFF_KIND_INTEGER;
  default:
    return ST_DIFF_KIND_UNSUPPORTED;
  }
}

void st_diff_profile_rules(st_diff_profile p, char *buf, size_t size) {
  size_t k = 0;
  buf[0] = 0;
  if (p != ST_DIFF_PROFILE_IMPORTED) {
    snprintf(buf, size, "float *=diff:%g, index sets *=jaccard:%g, other integers *=exact",
             ST_DIFF_DEFAULT_FLOAT_TOLERANCE, ST_DIFF_DEFAULT_SET_JACCARD);
    return;
  }
  static const char *const kinds[] = {"float", "index sets", "other integers", "?"};
  for (size_t i = 0; i < sizeof imported_defaults / sizeof *imported_defaults && k < size; i++) {
    int first_of_kind = i == 0 || imported_defaults[i - 1].kind != imported_defaults[i].kind;
    k += (size_t)snprintf(buf + k, size - k, "%s%s%s%s=%s", i ? ", " : "",
                          first_of_kind ? kinds[imported_defaults[i].kind] : "",
                          first_of_kind ? " " : "", imported_defaults[i].glob,
                          st_diff_metric_name(imported_defaults[i].metric));
    if (k < size && imported_defaults[i].metric != ST_DIFF_METRIC_EXACT)
      k += (size_t)snprintf(buf + k, size - k, ":%g", imported_defaults[i].threshold);
  }
}

st_diff_rule st_diff_rule_for(const st_diff_rules *rules, const char *name, const char *suffix,
                              st_diff_kind kind, st_diff_profile profile) {
  for (int i = 0; rules && i < rules->n; i++) {
    const st_diff_rule *r = &rules->v[i];
    if (!st_diff_metric_applies(r->metric, kind)) continue;
    if (!fnmatch(r->glob, name, 0) || (suffix && !fnmatch(r->glob, suffix, 0))) return *r;
  }
  st_diff_rule d = {.glob = "*", .builtin = 1};
  for (size_t i = 0; profile == ST_DIFF_PROFILE_IMPORTED && i < sizeof imported_defaults / sizeof *imported_defaults; i++) {
    if (imported_defaults[i].kind != kind) continue;
    if (fnmatch(imported_defaults[i].glob, name, 0) && (!suffix || fnmatch(imported_defaults[i].glob, suffix, 0)))
      continue;
    snprintf(d.glob, sizeof d.glob, "%s", imported_defaults[i].glob);
    d.metric = imported_defaults[i].metric;
    d.threshold = imported_defaults[i].threshold;
    return d;
  }
  d.metric = kind == ST_DIFF_KIND_FLOAT       ? ST_DIFF_METRIC_DIFF
             : kind == ST_DIFF_KIND_INDEX_SET ? ST_DIFF_METRIC_JACCARD
                                              : ST_DIFF_METRIC_EXACT;
  d.threshold = default_threshold(d.metric);
  return d;
}

/* ---------------------------------------------------------------- one tap */

/* "indexer.topk" from "layers.3.indexer.topk" (catalogue suffix when known). */
static void tap_suffix(const st_trace_tap *tap, char *out, size_t size) {
  if (tap->id < ST_TAP_COUNT) {
    snprintf(out, size, "%s", st_tap_catalogue[tap->id].suffix);
    return;
  }
  const char *s = tap->name;
  if (!strncmp(s, "layers.", 7)) {
    const char *dot = strchr(s + 7, '.');
    if (dot) s = dot + 1;
  }
  snprintf(out, size, "%s", s);
}

static void result_init(st_diff_tap_result *r, const st_trace_tap *tap) {
  memset(r, 0, sizeof *r);
  snprintf(r->name, sizeof r->name, "%s", tap->name);
  tap_suffix(tap, r->suffix, sizeof r->suffix);
  r->id = tap->id;
  r->layer = tap->layer;
  r->row_axis = tap->row_axis;
  r->kind = st_diff_tap_kind(tap);
  r->worst_position = -1;
  r->kl_max_position = -1;
  r->first_greedy_difference = -1;
  r->first_tie_position = -1;
  r->metric = "";
  st_tensor_compare_init(&r->tensor);
  st_index_set_compare_init(&r->sets);
}

/* Row pairs to compare: ra[i] in A with rb[i] in B, at token position pos[i]. */
typedef struct row_pairs {
  int64_t *ra, *rb, *pos;
  int64_t n;
} row_pairs;

static void pairs_free(row_pairs *p) {
  free(p->ra);
  free(p->rb);
  free(p->pos);
}

static st_status align_rows(st_trace *a, const st_trace_tap *ta, st_trace *b,
                            const st_trace_tap *tb, int64_t end, row_pairs *p,
                            st_diff_tap_result *r) {
  int64_t na = ta->shape[0], nb = tb->shape[0], cap = ST_MAX(ST_MIN(na, nb), 1);
  memset(p, 0, sizeof *p);
  p->ra = malloc((size_t)cap * sizeof *p->ra);
  p->rb = malloc((size_t)cap * sizeof *p->rb);
  p->pos = malloc((size_t)cap * sizeof *p->pos);
  int64_t *pa = malloc((size_t)ST_MAX(na, 1) * sizeof *pa), *pb = malloc((size_t)ST_MAX(nb, 1) * sizeof *pb);
  st_status st = ST_OK;
  if (!p->ra || !p->rb || !p->pos || !pa || !pb) {
    st = st_fail(ST_ENOMEM, "aligning rows of tap %s", ta->name);
    goto out;
  }
  if ((st = st_trace_read_positions(a, ta, pa)) || (st = st_trace_read_positions(b, tb, pb)))
    goto out;
  for (int64_t i = 1; i < na; i++)
    if (pa[i] <= pa[i - 1]) {
      st = st_fail(ST_EFORMAT, "trace %s: tap %s: positions not increasing at row %lld",
                   st_trace_path(a), ta->name, (long long)i);
      goto out;
    }
  for (int64_t i = 1; i < nb; i++)
    if (pb[i] <= pb[i - 1]) {
      st = st_fail(ST_EFORMAT, "trace %s: tap %s: positions not increasing at row %lld",
                   st_trace_path(b), tb->name, (long long)i);
      goto out;
    }
  int64_t i = 0, j = 0;
  while (i < na && j < nb) {
    if (pa[i] < pb[j]) i++, r->only_a++;
    else if (pa[i] > pb[j]) j++, r->only_b++;
    else if (end >= 0 && pa[i] >= end) {
      r->rows_excluded++, i++, j++;
    } else {
      p->ra[p->n] = i;
      p->rb[p->n] = j;
      p->pos[p->n] = pa[i];
      p->n++, i++, j++;
    }
  }
  r->only_a += na - i;
  r->only_b += nb - j;
out:
  free(pa);
  free(pb);
  if (st) pairs_free(p);
  return st;
}

/* Copies n rows of `outer` sub-rows of width w into rows of `outer` sub-rows of width wmax,
** filling the tail with fill (4-byte elements). */
static void pad_rows(const uint32_t *in, int64_t n, int64_t outer, int64_t w, int64_t wmax,
                     uint32_t fill, uint32_t *out) {
  for (int64_t r = 0; r < n * outer; r++) {
    memcpy(out + r * wmax, in + r * w, (size_t)w * sizeof *in);
    for (int64_t k = w; k < wmax; k++) out[r * wmax + k] = fill;
  }
}

/* Sorted distinct non-negative members of v[0..n) into out; returns the count. */
static int64_t set_of(const int32_t *v, int64_t n, int32_t *out) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; i++) {
    if (v[i] < 0) continue;
    int64_t k = m;
    while (k > 0 && out[k - 1] > v[i]) k--;
    if (k > 0 && out[k - 1] == v[i]) continue;
    memmove(out + k + 1, out + k, (size_t)(m - k) * sizeof *out);
    out[k] = v[i];
    m++;
  }
  return m;
}

/* Fills the worst row's set differences (the first ST_DIFF_SET_DETAIL of each). */
static st_status set_detail(st_trace *a, const st_trace_tap *ta, st_trace *b,
                            const st_trace_tap *tb, int64_t row_a, int64_t row_b,
                            st_diff_tap_result *r) {
  int64_t wa = (int64_t)st_trace_row_elements(ta), wb = (int64_t)st_trace_row_elements(tb);
  int32_t *buf = malloc((size_t)(2 * (wa + wb) + 1) * sizeof *buf);
  if (!buf) return st_fail(ST_ENOMEM, "tap %s", ta->name);
  int32_t *ra = buf, *rb = buf + wa, *sa = rb + wb, *sb = sa + wa;
  st_status st = st_trace_read_i32(a, ta, row_a, 1, ra);
  if (!st) st = st_trace_read_i32(b, tb, row_b, 1, rb);
  if (!st) {
    int64_t na = set_of(ra, wa, sa), nb = set_of(rb, wb, sb), i = 0, j = 0;
    while (i < na || j < nb) {
      if (j >= nb || (i < na && sa[i] < sb[j])) {
        if (r->n_worst_only_a < ST_DIFF_SET_DETAIL) r->worst_only_a[r->n_worst_only_a++] = sa[i];
        i++;
      } else if (i >= na || sb[j] < sa[i]) {
        if (r->n_worst_only_b < ST_DIFF_SET_DETAIL) r->worst_only_b[r->n_worst_only_b++] = sb[j];
        j++;
      } else {
        i++, j++;
      }
    }
  }
  free(buf);
  return st;
}

/* The scores that judge top-k ties (diff.h "Ties"): each trace's indexer.scores tap of the layer
** (NULL when it has none) and a buffer for one row of the wider. */
typedef struct tie_scores {
  st_trace *trace[2];
  const st_trace_tap *tap[2];
  float *row;
} tie_scores;

static st_status tie_scores_open(tie_scores *ts, st_trace *a, st_trace *b, int layer) {
  memset(ts, 0, sizeof *ts);
  ts->trace[0] = a;
  ts->trace[1] = b;
  size_t width = 0;
  for (int s = 0; s < 2; s++) {
    const st_trace_tap *t = st_trace_find_tap_id(ts->trace[s], ST_TAP_INDEXER_SCORES, layer);
    if (t && t->rank == 2 && st_diff_tap_kind(t) == ST_DIFF_KIND_FLOAT) {
      ts->tap[s] = t;
      width = ST_MAX(width, st_trace_row_elements(t));
    }
  }
  if (width && !(ts->row = malloc(width * sizeof *ts->row)))
    return st_fail(ST_ENOMEM, "layer %d: a scores row of %zu values", layer, width);
  return ST_OK;
}

/* Whether the sets rowa (A's) and rowb (B's) at position pos differ only by boundary ties, judged
** in A's scores at pos when A holds them, else in B's; *tie 0 when neither holds them. */
static st_status topk_tie(tie_scores *ts, int64_t pos, const int32_t *rowa, int64_t wa,
                          const int32_t *rowb, int64_t wb, int32_t *scratch, int *tie,
                          float *boundary, char *judged_by) {
  *tie = 0;
  for (int s = 0; s < 2; s++) {
    if (!ts->tap[s]) continue;
    int64_t row;
    if (st_trace_find_position(ts->trace[s], ts->tap[s], pos, &row) != ST_OK) {
      st_clear_error(); /* this trace kept no scores at pos: the other may have */
      continue;
    }
    st_status st = st_trace_read_f32(ts->trace[s], ts->tap[s], row, 1, ts->row);
    if (st) return st;
    int64_t n = (int64_t)st_trace_row_elements(ts->tap[s]);
    *tie = s == 0 ? st_topk_differs_by_ties(ts->row, n, rowa, wa, rowb, wb, scratch, boundary)
                  : st_topk_differs_by_ties(ts->row, n, rowb, wb, rowa, wa, scratch, boundary);
    *judged_by = s == 0 ? 'A' : 'B';
    return ST_OK;
  }
  return ST_OK;
}

/* Sets worst_position/coords from a flat index over the compared elements (W per row). */
static void locate(st_diff_tap_result *r, const row_pairs *p, int64_t flat, int64_t W) {
  if (flat < 0 || W <= 0 || flat / W >= p->n) return;
  r->worst_position = p->pos[flat / W];
  r->n_worst_coords = r->rank - 1;
  if (st_unravel_index(flat % W, r->row_shape, r->rank - 1, r->worst_coords) != 0)
    r->n_worst_coords = 0;
}

st_status st_diff_tap(st_trace *a, const st_trace_tap *ta, st_trace *b, const st_trace_tap *tb,
                      const st_diff_rule *rule, const st_diff_limits *lim,
                      st_diff_tap_result *r) {
  size_t block_bytes = lim ? lim->block_bytes : 0;
  int64_t end = !lim ? -1 : ta->row_axis ? lim->end_row : lim->end_position;
  result_init(r, ta);
  r->rule = *rule;
  r->metric = st_diff_metric_name(rule->metric);
  r->threshold = rule->threshold;
  r->rows_a = ta->shape[0];
  r->rows_b = tb->shape[0];
  if (!block_bytes) block_bytes = DEFAULT_BLOCK_BYTES;
  if (rule->metric == ST_DIFF_METRIC_IGNORE) {
    r->verdict = ST_DIFF_IGNORED;
    return ST_OK;
  }
  st_diff_kind kb = st_diff_tap_kind(tb);
  if (r->kind == ST_DIFF_KIND_UNSUPPORTED || kb == ST_DIFF_KIND_UNSUPPORTED) {
    r->verdict = ST_DIFF_UNSUPPORTED;
    return ST_OK;
  }
  if (r->kind != kb || ta->row_axis != tb->row_axis) {
    r->verdict = ST_DIFF_DIVERGES;
    r->metric = ta->row_axis != tb->row_axis ? "axis" : "dtype";
    r->value = 1;
    return ST_OK;
  }
  if (!st_diff_metric_applies(rule->metric, r->kind))
    return st_fail(ST_EINVAL, "tap %s: metric %s does not apply to %s values", ta->name,
                   r->metric, st_dtype_name(ta->dtype));

  /* Row shapes: equal except possibly the last axis, which is padded to the larger width. */
  if (ta->rank != tb->rank || ta->rank < 1) goto shape_differs;
  int64_t outer = 1;
  for (int k = 1; k < ta->rank - 1; k++) {
    if (ta->shape[k] != tb->shape[k]) goto shape_differs;
    outer *= ta->shape[k];
  }
  int64_t wa = (int64_t)st_trace_row_elements(ta), wb = (int64_t)st_trace_row_elements(tb);
  int64_t last_a = ta->rank >= 2 ? ta->shape[ta->rank - 1] : 1;
  int64_t last_b = tb->rank >= 2 ? tb->shape[tb->rank - 1] : 1;
  int64_t last = ST_MAX(last_a, last_b);
  int64_t W = outer * last; /* compared elements per row */
  r->rank = ta->rank;
  for (int k = 1; k < ta->rank; k++) r->row_shape[k - 1] = ta->shape[k];
  if (ta->rank >= 2) r->row_shape[ta->rank - 2] = last;

  row_pairs p;
  st_status st = align_rows(a, ta, b, tb, end, &p, r);
  if (st) return st;
  r->rows_compared = p.n;
  int set_metric = r->kind == ST_DIFF_KIND_INDEX_SET && rule->metric != ST_DIFF_METRIC_EXACT;
  int is_float = r->kind == ST_DIFF_KIND_FLOAT;
  int logits = is_float && ta->id == ST_TAP_LOGITS;
  int pad = !set_metric && (wa != W || wb != W);
  int64_t widest = ST_MAX(W, ST_MAX(wa, wb));
  int64_t max_rows = (int64_t)(block_bytes / (sizeof(float) * (size_t)ST_MAX(widest, 1)));
  max_rows = ST_MAX(max_rows, 1);
  max_rows = ST_MIN(max_rows, ST_MAX(p.n, 1));
  /* bf16 is widened in place from the tail of the buffer: the buffer holds floats either way */
  uint32_t *bufa = malloc((size_t)(max_rows * ST_MAX(wa, 1)) * 4);
  uint32_t *bufb = malloc((size_t)(max_rows * ST_MAX(wb, 1)) * 4);
  uint32_t *pada = pad ? malloc((size_t)(max_rows * ST_MAX(W, 1)) * 4) : NULL;
  uint32_t *padb = pad ? malloc((size_t)(max_rows * ST_MAX(W, 1)) * 4) : NULL;
  int32_t *scratch = set_metric ? malloc((size_t)(wa + wb + 1) * sizeof *scratch) : NULL;
  tie_scores ties = {0};
  int judge_ties = set_metric && ta->id == ST_TAP_INDEXER_TOPK;
  int64_t tie_ra = -1, tie_rb = -1;
  if (judge_ties && (st = tie_scores_open(&ties, a, b, ta->layer))) goto out;
  if (!bufa || !bufb || (pad && (!pada || !padb)) || (set_metric && !scratch)) {
    st = st_fail(ST_ENOMEM, "comparing tap %s (%lld rows per block)", ta->name, (long long)max_rows);
    goto out;
  }
  float neg_inf = -INFINITY;
  uint32_t fill;
  if (is_float) memcpy(&fill, &neg_inf, sizeof fill);
  else fill = (uint32_t)-1; /* int32 -1 */
  float mask_a = 0, mask_b = 0, bits_a = 0, bits_b = 0;
  int64_t first_int = -1;
  double int_a = 0, int_b = 0, kl_sum = 0;
  for (int64_t i = 0; i < p.n;) {
    int64_t len = 1;
    while (i + len < p.n && len < max_rows && p.ra[i + len] == p.ra[i] + len &&
           p.rb[i + len] == p.rb[i] + len)
      len++;
    if (is_float) {
      if ((st = st_trace_read_f32(a, ta, p.ra[i], len, (float *)bufa)) ||
          (st = st_trace_read_f32(b, tb, p.rb[i], len, (float *)bufb)))
        goto out;
    } else {
      if ((st = st_trace_read_i32(a, ta, p.ra[i], len, (int32_t *)bufa)) ||
          (st = st_trace_read_i32(b, tb, p.rb[i], len, (int32_t *)bufb)))
        goto out;
    }
    const uint32_t *xa = bufa, *xb = bufb;
    if (pad) {
      if (wa != W) pad_rows(bufa, len, outer, last_a, last, fill, pada), xa = pada;
      if (wb != W) pad_rows(bufb, len, outer, last_b, last, fill, padb), xb = padb;
    }
    int64_t flat0 = i * W;
    if (set_metric && (ties.tap[0] || ties.tap[1])) {
      for (int64_t k = 0; k < len; k++) { /* a tied row counts as identical */
        const int32_t *rowa = (const int32_t *)xa + k * wa, *rowb = (const int32_t *)xb + k * wb;
        st_set_counts c = st_index_set_counts(rowa, wa, rowb, wb, scratch);
        int tie = 0;
        float boundary = 0;
        char judged_by = 0;
        if ((c.n_common != c.n_a || c.n_common != c.n_b) &&
            (st = topk_tie(&ties, p.pos[i + k], rowa, wa, rowb, wb, scratch, &tie, &boundary,
                           &judged_by)))
          goto out;
        st_index_set_compare_add(&r->sets, rowa, wa, tie ? rowa : rowb, tie ? wa : wb, 1, scratch);
        if (tie && r->tie_rows++ == 0) {
          r->first_tie_position = p.pos[i + k];
          r->tie_boundary = boundary;
          r->tie_judged_by = judged_by;
          tie_ra = p.ra[i + k], tie_rb = p.rb[i + k];
        }
      }
    } else if (set_metric) {
      st_index_set_compare_add(&r->sets, (const int32_t *)xa, wa, (const int32_t *)xb, wb, len,
                               scratch);
    } else if (is_float) {
      const float *fa = (const float *)xa, *fb = (const float *)xb;
      int64_t mm0 = r->tensor.mask_mismatch, bm0 = r->tensor.bit_mismatch;
      st_tensor_compare_add(&r->tensor, fa, fb, len * W);
      if (mm0 == 0 && r->tensor.mask_mismatch > 0) {
        mask_a = fa[r->tensor.first_mask_mismatch - flat0];
        mask_b = fb[r->tensor.first_mask_mismatch - flat0];
      }
      if (bm0 == 0 && r->tensor.bit_mismatch > 0) {
        bits_a = fa[r->tensor.first_bit_mismatch - flat0];
        bits_b = fb[r->tensor.first_bit_mismatch - flat0];
      }
      for (int64_t k = 0; logits && k < len; k++) {
        double kl = st_logits_kl(fa + k * W, fb + k * W, W);
        kl_sum += kl;
        if (r->kl_max_position < 0 || kl > r->kl_max || (isnan(kl) && !isnan(r->kl_max))) {
          r->kl_max = kl; /* NaN, once seen, stays the maximum */
          r->kl_max_position = p.pos[i + k];
        }
        int agree = st_logits_greedy_agree(fa + k * W, fb + k * W, W);
        r->greedy_agree += agree;
        if (!agree && r->first_greedy_difference < 0) r->first_greedy_difference = p.pos[i + k];
      }
    } else {
      const int32_t *ia = (const int32_t *)xa, *ib = (const int32_t *)xb;
      for (int64_t k = 0; k < len * W; k++)
        if (ia[k] != ib[k]) {
          if (first_int < 0) first_int = flat0 + k, int_a = ia[k], int_b = ib[k];
          r->int_mismatch++;
        }
    }
    i += len;
  }
  if (logits) {
    r->has_logits = 1;
    r->kl_mean = p.n ? kl_sum / (double)p.n : 0;
  }

  /* The verdict. */
  int diverges = 0;
  if (set_metric) {
    int overlap = rule->metric == ST_DIFF_METRIC_OVERLAP;
    r->value = overlap ? r->sets.min_overlap : r->sets.min_jaccard;
    diverges = !(r->value >= rule->threshold);
    int64_t w = overlap ? r->sets.min_overlap_row : r->sets.min_jaccard_row;
    if (diverges || r->sets.first_diff_row >= 0) {
      if (!diverges) w = r->sets.min_jaccard_row;
      if (w >= 0) {
        r->worst_position = p.pos[w];
        r->n_worst_coords = 0;
        if ((st = set_detail(a, ta, b, tb, p.ra[w], p.rb[w], r))) goto out;
      }
    } else if (r->tie_rows > 0) { /* only ties: show the first */
      r->worst_position = r->first_tie_position;
      r->n_worst_coords = 0;
      if ((st = set_detail(a, ta, b, tb, tie_ra, tie_rb, r))) goto out;
    }
  } else if (is_float) {
    const st_tensor_compare *c = &r->tensor;
    if (rule->metric == ST_DIFF_METRIC_EXACT) {
      r->value = (double)c->bit_mismatch;
      diverges = c->bit_mismatch > 0;
      locate(r, &p, c->first_bit_mismatch, W);
      r->worst_a = bits_a, r->worst_b = bits_b;
    } else if (c->mask_mismatch > 0) {
      r->metric = "mask";
      r->value = (double)c->mask_mismatch;
      r->threshold = 0;
      diverges = 1;
      locate(r, &p, c->first_mask_mismatch, W);
      r->worst_a = mask_a, r->worst_b = mask_b;
    } else {
      if (rule->metric == ST_DIFF_METRIC_COSINE) {
        r->value = st_tensor_cosine(c);
        diverges = !(r->value >= rule->threshold);
      } else {
        r->value = rule->metric == ST_DIFF_METRIC_MAXABS ? c->max_abs : st_tensor_difference(c);
        diverges = !(r->value <= rule->threshold);
      }
      locate(r, &p, c->max_abs_index, W);
      r->worst_a = c->max_abs_x, r->worst_b = c->max_abs_y;
    }
  } else {
    r->value = (double)r->int_mismatch;
    diverges = r->int_mismatch > 0;
    locate(r, &p, first_int, W);
    r->worst_a = int_a, r->worst_b = int_b;
  }
  if (diverges) r->verdict = ST_DIFF_DIVERGES;
  else if (r->tie_rows > 0) r->verdict = ST_DIFF_TIE;
  else if (p.n == 0 && !ta->row_axis && (r->rows_a || r->rows_b)) r->verdict = ST_DIFF_NO_COMMON;
  else r->verdict = ST_DIFF_OK;
out:
  free(bufa);
  free(bufb);
  free(pada);
  free(padb);
  free(scratch);
  free(ties.row);
  pairs_free(&p);
  return st;
shape_differs:
  r->verdict = ST_DIFF_DIVERGES;
  r->metric = "shape";
  r->value = 1;
  r->threshold = 0;
  return ST_OK;
}

/* ---------------------------------------------------------------- tokens */

void st_diff_compare_tokens(const st_trace *a, const st_trace *b, st_diff_tokens *out) {
  memset(out, 0, sizeof *out);
  const int32_t *ta = st_trace_tokens(a, &out->n_a), *tb = st_trace_tokens(b, &out->n_b);
  out->n_prompt_a = st_trace_n_prompt(a);
  out->n_prompt_b = st_trace_n_prompt(b);
  out->first_difference = -1;
  out->token_a = out->token_b = -1;
  int64_t n = ST_MIN(out->n_a, out->n_b), i = 0;
  while (i < n && ta[i] == tb[i]) i++;
  if (i == n && out->n_a == out->n_b) return;
  out->first_difference = i;
  out->token_a = i < out->n_a ? ta[i] : -1;
  out->token_b = i < out->n_b ? tb[i] : -1;
  out->in_prompt = i < ST_MIN(out->n_prompt_a, out->n_prompt_b);
}

/* ---------------------------------------------------------------- the whole trace */

typedef struct entry {
  const st_trace_tap *a, *b;
} entry;

static int entry_cmp(const void *pa, const void *pb) {
  const entry *x = pa, *y = pb;
  const st_trace_tap *tx = x->a ? x->a : x->b, *ty = y->a ? y->a : y->b;
  int lx = tx->layer < 0 ? INT_MAX : tx->layer, ly = ty->layer < 0 ? INT_MAX : ty->layer;
  if (lx != ly) return lx < ly ? -1 : 1;
  if (tx->id != ty->id) return tx->id < ty->id ? -1 : 1;
  return strcmp(tx->name, ty->name);
}

static int selected(const st_diff_options *opt, const st_trace_tap *tap) {
  if (!opt || opt->n_tap_globs == 0) return 1;
  char suffix[ST_TRACE_MAX_NAME];
  tap_suffix(tap, suffix, sizeof suffix);
  for (int i = 0; i < opt->n_tap_globs; i++)
    if (!fnmatch(opt->tap_globs[i], tap->name, 0) || !fnmatch(opt->tap_globs[i], suffix, 0))
      return 1;
  return 0;
}

int st_diff_glob_matches(const st_trace *t, const char *glob) {
  int n = 0, count = st_trace_tap_count(t);
  for (int i = 0; i < count; i++) {
    const st_trace_tap *tap = st_trace_tap_at(t, i);
    char suffix[ST_TRACE_MAX_NAME];
    tap_suffix(tap, suffix, sizeof suffix);
    n += !fnmatch(glob, tap->name, 0) || !fnmatch(glob, suffix, 0);
  }
  return n;
}

st_status st_diff_traces(st_trace *a, st_trace *b, const st_diff_options *opt, st_diff_report *out) {
  memset(out, 0, sizeof *out);
  out->first_divergence = -1;
  st_diff_compare_tokens(a, b, &out->tokens);
  int na = st_trace_tap_count(a), nb = st_trace_tap_count(b), n = 0;
  entry *e = malloc((size_t)ST_MAX(na + nb, 1) * sizeof *e);
  if (!e) return st_fail(ST_ENOMEM, "diff: tap list");
  for (int i = 0; i < na; i++) {
    const st_trace_tap *t = st_trace_tap_at(a, i);
    if (selected(opt, t)) e[n++] = (entry){t, st_trace_find_tap(b, t->name)};
  }
  for (int i = 0; i < nb; i++) {
    const st_trace_tap *t = st_trace_tap_at(b, i);
    if (selected(opt, t) && !st_trace_find_tap(a, t->name)) e[n++] = (entry){NULL, t};
  }
  qsort(e, (size_t)n, sizeof *e, entry_cmp);
  out->taps = calloc((size_t)ST_MAX(n, 1), sizeof *out->taps);
  if (!out->taps) {
    free(e);
    return st_fail(ST_ENOMEM, "diff: %d taps", n);
  }
  /* Rows after the first token difference are not compared (diff.h "Token differences"). */
  st_config *config = NULL;
  out->end_position = out->tokens.first_difference;
  if (out->end_position >= 0 && st_trace_attr(a, "config") && (config = malloc(sizeof *config)) &&
      st_config_parse(st_trace_attr(a, "config"), st_trace_path(a), config) == ST_OK)
    out->row_limits_known = 1;
  st_clear_error();
  out->profile = opt && opt->profile ? opt->profile : ST_DIFF_PROFILE_SAME;
  if (!(opt && opt->profile) && (st_trace_attr(a, "import") || st_trace_attr(b, "import"))) {
    out->profile = ST_DIFF_PROFILE_IMPORTED;
    out->imported = st_trace_attr(a, "import") ? 'A' : 'B';
  }
  st_status st = ST_OK;
  for (int i = 0; i < n; i++) {
    st_diff_tap_result *r = &out->taps[i];
    const st_trace_tap *t = e[i].a ? e[i].a : e[i].b;
    out->n_taps = i + 1;
    if (!e[i].a || !e[i].b) {
      result_init(r, t);
      r->verdict = e[i].a ? ST_DIFF_ONLY_A : ST_DIFF_ONLY_B;
      r->rows_a = e[i].a ? t->shape[0] : 0;
      r->rows_b = e[i].b ? t->shape[0] : 0;
      continue;
    }
    int first = out->first_divergence;
    if (first >= 0 && !(opt && opt->all) && t->layer != out->taps[first].layer) {
      result_init(r, t);
      r->verdict = ST_DIFF_NOT_COMPARED;
      r->rows_a = e[i].a->shape[0];
      r->rows_b = e[i].b->shape[0];
      continue;
    }
    char suffix[ST_TRACE_MAX_NAME];
    tap_suffix(t, suffix, sizeof suffix);
    st_diff_rule rule = st_diff_rule_for(opt ? opt->rules : NULL, t->name, suffix,
                                         st_diff_tap_kind(e[i].a), out->profile);
    st_diff_limits lim = {opt ? opt->block_bytes : 0, out->end_position, -1};
    if (out->end_position >= 0 && t->row_axis) {
      int ratio = out->row_limits_known && t->layer >= 0 && t->layer < ST_MAX_LAYERS
                    ? config->compress_ratio[t->layer] : 0;
      if (ratio > 0) lim.end_row = out->end_position / ratio; /* rows j with (j+1)*m - 1 < d */
    }
    st = st_diff_tap(a, e[i].a, b, e[i].b, &rule, &lim, r);
    if (st) {
      st_fail_context(st, "comparing tap %s", t->name);
      break;
    }
    if (r->verdict == ST_DIFF_DIVERGES && out->first_divergence < 0) out->first_divergence = i;
  }
  free(e);
  free(config);
  if (st) {
    st_diff_report_free(out);
    return st;
  }
  const st_diff_tokens *tk = &out->tokens;
  out->tokens_first = tk->first_difference >= 0 && (tk->in_prompt || out->first_divergence < 0);
  out->diverges = out->first_divergence >= 0 || tk->first_difference >= 0;
  return ST_OK;
}

void st_diff_report_free(st_diff_report *r) {
  if (!r) return;
  free(r->taps);
  r->taps = NULL;
  r->n_taps = 0;
}
