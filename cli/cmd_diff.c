/*
** cmd_diff.c — `sparsetrace diff A.h5 B.h5`: compares two traces tap by tap in forward order,
** names the first tap that exceeds its tolerance and prints a per-layer table. The comparison
** itself is replayer/diff.c (shared with replay and bisect); this file parses the command line
** and prints. Exit status like cmp(1): 0 same within tolerance, 1 different, 2 trouble.
*/
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "common/base.h"
#include "recorder/trace_reader.h"
#include "replayer/diff.h"

static const st_opt_use diff_options[] = {
  {ST_OPT_TRACE, NULL, "a trace, instead of as an argument (twice: A, then B)"},
  {ST_OPT_TAP, NULL, "compare only taps whose name or suffix matches (repeatable), e.g.\n"
                     "--tap 'layers.*.indexer.*' --tap logits"},
  {ST_OPT_TOLERANCE, NULL, "per-tap rules (repeatable; tried in the order given, first match\n"
                           "wins, then the defaults), e.g.\n"
                           "'indexer.topk=jaccard:0.9,indexer.scores=diff:1e-4,*=diff:1e-5'"},
  {ST_OPT_ALL, NULL, "compare every tap (default: stop after the layer of the first\n"
                     "divergence; later taps show as 'not compared')"},
  {ST_OPT_JSON, NULL, "one JSON object: a, b (build, settings), tokens, first_divergence\n"
                      "(null or {tap, layer, metric, value, threshold, position, ...}), taps"},
  {0}};

static const st_cmd_spec diff_spec = {
  "diff", "sparsetrace diff A.h5 B.h5 [--tap GLOB]... [--tolerance RULES]... [--json] [--all]\n",
  "Compares two traces tap by tap in forward order (layer by layer in catalogue order, then\n"
  "logits) and reports the first tap that exceeds its tolerance, then a per-layer table.\n"
  "A and B may come from different builds, backends or settings; both are shown.\n"
  "\n"
  "Position taps are matched by token position: only positions both traces kept are compared\n"
  "(a run recorded with --positions 300:400 against a full one compares 300..399).\n"
  "Compressed-row taps (compressor.kv, indexer.k, indexer.k_used) are matched by row index\n"
  "over the rows both hold; a row-count difference is shown, not judged. The token sequences\n"
  "are compared exactly: a prompt difference is the first divergence; a difference in the\n"
  "generated tokens is one when no tap diverges before it. Rows at or after the first\n"
  "differing token (compressed rows pooling such a token) are not compared: their inputs\n"
  "differ, so they would only echo an earlier divergence.\n",
  diff_options,
  "RULES:  RULE[,RULE]...   RULE:  GLOB=METRIC[:THRESHOLD]\n"
  "  GLOB is a shell glob on the tap suffix (indexer.topk) or full name (layers.3.indexer.topk).\n"
  "  A rule applies only to taps its metric can measure (so '*=diff:1e-5' sets float taps).\n"
  "  diff:T     float taps: diverges when 1 - 2*Sum(ab)/(Sum(a^2)+Sum(b^2)) > T\n"
  "  cosine:T   float taps: diverges when the cosine similarity < T\n"
  "  maxabs:T   float taps: diverges when max |a - b| > T\n"
  "  jaccard:T  index sets (indexer.topk, ffn.experts): diverges when the lowest per-row\n"
  "             Jaccard |A and B|/|A or B| < T (order within a row is irrelevant)\n"
  "  overlap:T  index sets: diverges when the lowest per-row |A and B|/max(|A|,|B|) < T\n"
  "  exact      any tap: diverges when any element's bits differ\n"
  "  ignore     any tap: not compared\n"
  "  Every float rule also requires equal NaN/+inf/-inf masks (metric 'mask'): indexer.scores\n"
  "  compares its -inf (not yet visible) pattern exactly and its finite entries by the rule.\n"
  "  Defaults: float taps diff:1e-6; index sets jaccard:1 (any differing set diverges);\n"
  "  other integer taps exact. When A or B was imported from another engine (sparsetrace\n"
  "  import), defaults for a bf16/fp8 engine against fp32 instead (diff prints them).\n"
  "  indexer.topk rows whose sets differ only by rows tied at the boundary score (in A's\n"
  "  indexer.scores at that position, else B's) are ties, not divergences ('ties only').\n"
  "\n"
  "exit status: 0 no divergence, 1 something diverges, 2 usage error or unreadable trace.\n"};

/* ---------------------------------------------------------------- helpers */

static const char *or_dash(const char *s) { return s && *s ? s : "-"; }

static const char *kind_name(st_diff_kind k) {
  static const char *const names[] = {"float", "index_set", "integer", "unsupported"};
  return (unsigned)k < 4 ? names[k] : "?";
}

static const char *verdict_key(st_diff_verdict v) {
  static const char *const names[] = {"ok", "diverges", "only_a", "only_b", "ignored",
                                      "not_compared", "no_common_positions", "unsupported", "tie"};
  return (unsigned)v < sizeof names / sizeof *names ? names[v] : "?";
}

/* "<= 1e-06", ">= 1", "= 0": how the judged value is held to its threshold. */
static void limit_text(const st_diff_tap_result *r, char *buf, size_t size) {
  const char *op = "<=";
  if (!strcmp(r->metric, "cosine") || !strcmp(r->metric, "jaccard") || !strcmp(r->metric, "overlap"))
    op = ">=";
  else if (!strcmp(r->metric, "mask") || !strcmp(r->metric, "exact") || !strcmp(r->metric, "shape") ||
           !strcmp(r->metric, "dtype") || !strcmp(r->metric, "axis"))
    op = "=";
  snprintf(buf, size, "%s %.3g", op, r->threshold);
}

static void coords_text(const st_diff_tap_result *r, char *buf, size_t size) {
  size_t k = 0;
  buf[0] = 0;
  if (r->n_worst_coords == 0) return;
  k += (size_t)snprintf(buf + k, size - k, " [");
  for (int i = 0; i < r->n_worst_coords && k < size; i++)
    k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? "," : "", (long long)r->worst_coords[i]);
  if (k < size) snprintf(buf + k, size - k, "]");
}

static void set_list(char *buf, size_t size, const int32_t *v, int n, int more) {
  size_t k = (size_t)snprintf(buf, size, "{");
  for (int i = 0; i < n && k < size; i++) k += (size_t)snprintf(buf + k, size - k, "%s%d", i ? "," : "", v[i]);
  if (k < size) snprintf(buf + k, size - k, "%s}", more ? ",..." : "");
}

/* The detail column: where it is worst, and the numbers behind the verdict. */
static void detail_text(const st_diff_tap_result *r, char *buf, size_t size) {
  size_t k = 0;
  buf[0] = 0;
#define ADD(...) (k += (k < size ? (size_t)snprintf(buf + k, size - k, __VA_ARGS__) : 0))
  const char *where = r->row_axis ? "row" : "pos";
  if (r->kind == ST_DIFF_KIND_INDEX_SET && r->rule.metric != ST_DIFF_METRIC_EXACT) {
    ADD("mean J %.4g, %lld/%lld rows same", st_index_set_mean_jaccard(&r->sets),
        (long long)r->sets.identical_rows, (long long)r->sets.rows);
    if (r->worst_position >= 0 && (r->n_worst_only_a || r->n_worst_only_b)) {
      char la[160], lb[160];
      set_list(la, sizeof la, r->worst_only_a, r->n_worst_only_a, r->n_worst_only_a == ST_DIFF_SET_DETAIL);
      set_list(lb, sizeof lb, r->worst_only_b, r->n_worst_only_b, r->n_worst_only_b == ST_DIFF_SET_DETAIL);
      ADD("; %s %s %lld: only A %s, only B %s", r->verdict == ST_DIFF_TIE ? "first tie at" : "worst",
          where, (long long)r->worst_position, la, lb);
    }
    if (r->tie_rows)
      ADD("; %lld row%s differ only by ties at the boundary score (first at pos %lld: %g in %s's "
          "scores)", (long long)r->tie_rows, r->tie_rows == 1 ? "" : "s",
          (long long)r->first_tie_position, r->tie_boundary, r->tie_judged_by == 'A' ? "A" : "B");
  } else if (r->worst_position >= 0) {
    char c[128];
    coords_text(r, c, sizeof c);
    if (!strcmp(r->metric, "mask"))
      ADD("masks differ at %lld (NaN %lld, +inf %lld, -inf %lld); first %s %lld%s: A %g, B %g",
          (long long)r->tensor.mask_mismatch, (long long)r->tensor.nan_mismatch,
          (long long)r->tensor.posinf_mismatch, (long long)r->tensor.neginf_mismatch, where,
          (long long)r->worst_position, c, r->worst_a, r->worst_b);
    else if (r->kind == ST_DIFF_KIND_FLOAT && strcmp(r->metric, "exact"))
      ADD("max|A-B| %.3g at %s %lld%s (A %g, B %g); cos %.6g", r->tensor.max_abs, where,
          (long long)r->worst_position, c, r->worst_a, r->worst_b, st_tensor_cosine(&r->tensor));
    else
      ADD("first at %s %lld%s: A %g, B %g", where, (long long)r->worst_position, c, r->worst_a,
          r->worst_b);
  }
  if (r->has_logits)
    ADD("%sKL mean %.3g max %.3g; greedy same %lld/%lld", k ? "; " : "", r->kl_mean, r->kl_max,
        (long long)r->greedy_agree, (long long)r->rows_compared);
  if (r->rows_a != r->rows_b && r->row_axis)
    ADD("%srows %lld vs %lld", k ? "; " : "", (long long)r->rows_a, (long long)r->rows_b);
  if (!r->row_axis && (r->only_a || r->only_b) && r->verdict != ST_DIFF_NOT_COMPARED)
    ADD("%s%lld common positions (%lld only in A, %lld only in B)", k ? "; " : "",
        (long long)r->rows_compared, (long long)r->only_a, (long long)r->only_b);
#undef ADD
}

static int compared(const st_diff_tap_result *r) { return st_diff_verdict_compared(r->verdict); }

/* ---------------------------------------------------------------- text output */

static void print_trace(const char *label, const st_trace *t) {
  int64_t n_tokens = 0;
  st_trace_tokens(t, &n_tokens);
  printf("%s  %s\n", label, st_trace_path(t));
  printf("   run %s, model %s, %lld tokens (%lld prompt), positions %s\n",
         or_dash(st_trace_attr(t, "run_id")), or_dash(st_trace_attr(t, "model")),
         (long long)n_tokens, (long long)st_trace_n_prompt(t), or_dash(st_trace_attr(t, "positions")));
  printf("   build %s, %s, %s; backend %s (%s)\n", or_dash(st_trace_attr(t, "build_revision")),
         or_dash(st_trace_attr(t, "compiler")), or_dash(st_trace_attr(t, "build_type")),
         or_dash(st_trace_attr(t, "backend")), or_dash(st_trace_attr(t, "kernel_mode")));
  printf("   settings %s\n", or_dash(st_trace_attr(t, "settings")));
}

/* Prints "settings differ: rotate none -> q, topk 32 -> 8" (nothing when they agree). */
static void print_settings_diff(const st_trace *a, const st_trace *b) {
  json_t *sa = json_loads(or_dash(st_trace_attr(a, "settings")), 0, NULL);
  json_t *sb = json_loads(or_dash(st_trace_attr(b, "settings")), 0, NULL);
  if (json_is_object(sa) && json_is_object(sb)) {
    int n = 0;
    const char *key;
    json_t *va;
    json_object_foreach(sa, key, va) {
      json_t *vb = json_object_get(sb, key);
      if (vb && json_equal(va, vb)) continue;
      char *ta = json_dumps(va, JSON_ENCODE_ANY), *tb = vb ? json_dumps(vb, JSON_ENCODE_ANY) : NULL;
      printf("%s %s %s -> %s", n++ ? "," : "settings differ:", key, ta ? ta : "?", tb ? tb : "(absent)");
      free(ta);
      free(tb);
    }
    json_object_foreach(sb, key, va) {
      if (json_object_get(sa, key)) continue;
      char *tb = json_dumps(va, JSON_ENCODE_ANY);
      printf("%s %s (absent) -> %s", n++ ? "," : "settings differ:", key, tb ? tb : "?");
      free(tb);
    }
    if (n) putchar('\n');
  }
  json_decref(sa);
  json_decref(sb);
}

static void print_tokens(const st_diff_report *rep) {
  const st_diff_tokens *tk = &rep->tokens;
  if (tk->first_difference < 0) {
    printf("tokens   identical (%lld, %lld prompt)\n", (long long)tk->n_a, (long long)tk->n_prompt_a);
    return;
  }
  printf("tokens   differ from position %lld (%s): A %d, B %d; A has %lld (%lld prompt), B %lld (%lld prompt)\n",
         (long long)tk->first_difference, tk->in_prompt ? "prompt" : "generated", tk->token_a,
         tk->token_b, (long long)tk->n_a, (long long)tk->n_prompt_a, (long long)tk->n_b,
         (long long)tk->n_prompt_b);
  printf("         positions from %lld on are not compared (their inputs differ)%s\n",
         (long long)rep->end_position,
         rep->row_limits_known ? "" : "; no config in A, so compressed rows are compared whole");
}

static void print_text(const st_trace *a, const st_trace *b, const st_diff_report *rep) {
  print_trace("A", a);
  print_trace("B", b);
  print_settings_diff(a, b);
  char defaults[512];
  st_diff_profile_rules(rep->profile, defaults, sizeof defaults);
  if (rep->profile == ST_DIFF_PROFILE_IMPORTED)
    printf("tolerances: defaults for an imported engine (%s is imported: bf16/fp8 against fp32): %s; "
           "--tolerance rules come first\n", rep->imported == 'B' ? "B" : "A", defaults);
  else
    printf("tolerances: defaults for two runs of this engine: %s; --tolerance rules come first\n", defaults);
  print_tokens(rep);
  if (rep->tokens_first) {
    const st_diff_tokens *tk = &rep->tokens;
    printf("first divergence: tokens at position %lld (%s): A %d, B %d\n",
           (long long)tk->first_difference, tk->in_prompt ? "the prompts differ" : "generated",
           tk->token_a, tk->token_b);
  }
  if (rep->first_divergence >= 0) {
    const st_diff_tap_result *r = &rep->taps[rep->first_divergence];
    char limit[48], detail[1024];
    limit_text(r, limit, sizeof limit);
    detail_text(r, detail, sizeof detail);
    printf("%s %s", rep->tokens_first ? "first diverging tap:" : "first divergence:", r->name);
    if (r->layer >= 0) printf(" (layer %d)", r->layer);
    printf(": %s = %.6g, limit %s\n", r->metric, r->value, limit);
    if (detail[0]) printf("  %s\n", detail);
  } else if (!rep->tokens_first) {
    printf("no divergence\n");
  }
  /* The per-layer table. */
  size_t wt = 3;
  for (int i = 0; i < rep->n_taps; i++) wt = ST_MAX(wt, strlen(rep->taps[i].suffix));
  printf("\n%-5s  %-*s  %-8s  %-11s  %-9s  %-12s  %s\n", "layer", (int)wt, "tap", "metric", "value",
         "limit", "verdict", "detail");
  int prev_layer = -2, skipped = 0;
  for (int i = 0; i < rep->n_taps; i++) {
    const st_diff_tap_result *r = &rep->taps[i];
    if (r->verdict == ST_DIFF_NOT_COMPARED) {
      skipped++;
      continue;
    }
    if (prev_layer != -2 && r->layer != prev_layer) putchar('\n');
    prev_layer = r->layer;
    char layer[16], value[32] = "-", limit[48] = "-", detail[1024] = "";
    snprintf(layer, sizeof layer, r->layer >= 0 ? "%d" : "-", r->layer);
    if (compared(r)) {
      snprintf(value, sizeof value, "%.6g", r->value);
      limit_text(r, limit, sizeof limit);
      detail_text(r, detail, sizeof detail);
    } else if (r->verdict == ST_DIFF_ONLY_A || r->verdict == ST_DIFF_ONLY_B) {
      snprintf(detail, sizeof detail, "%lld rows", (long long)(r->rows_a + r->rows_b));
    }
    printf("%-5s  %-*s  %-8s  %-11s  %-9s  %-12s  %s\n", layer, (int)wt, r->suffix,
           compared(r) ? r->metric : "-", value, limit, st_diff_verdict_name(r->verdict), detail);
  }
  if (skipped)
    printf("\n%d later tap%s not compared (stopped after the layer of the first divergence; "
           "--all compares every tap)\n", skipped, skipped == 1 ? "" : "s");
}

/* ---------------------------------------------------------------- JSON output */

static json_t *json_text(const char *s) { return s ? json_string(s) : json_null(); }

/* Finite numbers as numbers; NaN and infinities as the strings "NaN", "Infinity", "-Infinity". */
static json_t *json_num(double v) {
  if (isnan(v)) return json_string("NaN");
  if (isinf(v)) return json_string(v > 0 ? "Infinity" : "-Infinity");
  if (v == floor(v) && fabs(v) < 9e15) return json_integer((json_int_t)v);
  return json_real(v);
}

static json_t *trace_json(const st_trace *t) {
  json_t *o = json_object();
  int64_t n_tokens = 0;
  st_trace_tokens(t, &n_tokens);
  json_object_set_new(o, "path", json_string(st_trace_path(t)));
  json_object_set_new(o, "run_id", json_text(st_trace_attr(t, "run_id")));
  json_object_set_new(o, "model", json_text(st_trace_attr(t, "model")));
  json_t *build = json_object();
  static const char *keys[][2] = {{"revision", "build_revision"}, {"compiler", "compiler"},
                                  {"build_type", "build_type"}, {"backend", "backend"},
                                  {"kernel_mode", "kernel_mode"}};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    json_object_set_new(build, keys[i][0], json_text(st_trace_attr(t, keys[i][1])));
  json_object_set_new(o, "build", build);
  const char *settings = st_trace_attr(t, "settings");
  json_t *parsed = settings ? json_loads(settings, 0, NULL) : NULL;
  json_object_set_new(o, "settings", parsed ? parsed : json_text(settings));
  json_object_set_new(o, "positions", json_text(st_trace_attr(t, "positions")));
  json_object_set_new(o, "n_tokens", json_integer(n_tokens));
  json_object_set_new(o, "n_prompt", json_integer(st_trace_n_prompt(t)));
  return o;
}

static json_t *coords_json(const st_diff_tap_result *r) {
  json_t *c = json_array();
  for (int i = 0; i < r->n_worst_coords; i++) json_array_append_new(c, json_integer(r->worst_coords[i]));
  return c;
}

static json_t *set_json(const int32_t *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return a;
}

static json_t *tap_json(const st_diff_tap_result *r) {
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(r->name));
  json_object_set_new(o, "tap", json_string(r->suffix));
  json_object_set_new(o, "layer", r->layer >= 0 ? json_integer(r->layer) : json_null());
  json_object_set_new(o, "kind", json_string(kind_name(r->kind)));
  json_object_set_new(o, "verdict", json_string(verdict_key(r->verdict)));
  json_object_set_new(o, "diverges", json_boolean(r->verdict == ST_DIFF_DIVERGES));
  json_object_set_new(o, "rows_a", json_integer(r->rows_a));
  json_object_set_new(o, "rows_b", json_integer(r->rows_b));
  if (!compared(r) && r->verdict != ST_DIFF_NO_COMMON) return o;
  json_object_set_new(o, "rule", json_sprintf("%s=%s:%g%s", r->rule.glob,
                                              st_diff_metric_name(r->rule.metric),
                                              r->rule.threshold, r->rule.builtin ? " (default)" : ""));
  json_object_set_new(o, "metric", json_string(r->metric));
  json_object_set_new(o, "value", json_num(r->value));
  json_object_set_new(o, "threshold", json_num(r->threshold));
  json_object_set_new(o, "rows_compared", json_integer(r->rows_compared));
  json_object_set_new(o, "rows_excluded", json_integer(r->rows_excluded));
  if (!r->row_axis) {
    json_object_set_new(o, "positions_only_a", json_integer(r->only_a));
    json_object_set_new(o, "positions_only_b", json_integer(r->only_b));
  }
  if (r->worst_position >= 0) {
    json_t *w = json_object();
    json_object_set_new(w, r->row_axis ? "row" : "position", json_integer(r->worst_position));
    json_object_set_new(w, "coordinates", coords_json(r));
    if (r->kind == ST_DIFF_KIND_INDEX_SET && r->rule.metric != ST_DIFF_METRIC_EXACT) {
      json_object_set_new(w, "only_a", set_json(r->worst_only_a, r->n_worst_only_a));
      json_object_set_new(w, "only_b", set_json(r->worst_only_b, r->n_worst_only_b));
    } else {
      json_object_set_new(w, "a", json_num(r->worst_a));
      json_object_set_new(w, "b", json_num(r->worst_b));
    }
    json_object_set_new(o, "worst", w);
  } else {
    json_object_set_new(o, "worst", json_null());
  }
  if (r->kind == ST_DIFF_KIND_FLOAT) {
    const st_tensor_compare *c = &r->tensor;
    json_object_set_new(o, "elements", json_integer(c->count));
    json_object_set_new(o, "difference", json_num(st_tensor_difference(c)));
    json_object_set_new(o, "cosine", json_num(st_tensor_cosine(c)));
    json_object_set_new(o, "max_abs", json_num(c->max_abs));
    json_object_set_new(o, "rel_max_abs", json_num(st_tensor_rel_max_abs(c)));
    json_object_set_new(o, "mask_mismatch", json_integer(c->mask_mismatch));
    json_object_set_new(o, "nan_mismatch", json_integer(c->nan_mismatch));
    json_object_set_new(o, "posinf_mismatch", json_integer(c->posinf_mismatch));
    json_object_set_new(o, "neginf_mismatch", json_integer(c->neginf_mismatch));
    json_object_set_new(o, "bit_mismatch", json_integer(c->bit_mismatch));
  } else if (r->kind == ST_DIFF_KIND_INDEX_SET && r->rule.metric != ST_DIFF_METRIC_EXACT) {
    json_object_set_new(o, "jaccard_min", json_num(r->sets.min_jaccard));
    json_object_set_new(o, "jaccard_mean", json_num(st_index_set_mean_jaccard(&r->sets)));
    json_object_set_new(o, "overlap_min", json_num(r->sets.min_overlap));
    json_object_set_new(o, "overlap_mean", json_num(st_index_set_mean_overlap(&r->sets)));
    json_object_set_new(o, "identical_rows", json_integer(r->sets.identical_rows));
    json_object_set_new(o, "tie_rows", json_integer(r->tie_rows));
    if (r->tie_rows) {
      json_t *t = json_object();
      json_object_set_new(t, "position", json_integer(r->first_tie_position));
      json_object_set_new(t, "boundary_score", json_num(r->tie_boundary));
      json_object_set_new(t, "judged_by", json_stringn(&r->tie_judged_by, 1));
      json_object_set_new(o, "first_tie", t);
    }
  } else {
    json_object_set_new(o, "mismatches", json_integer(r->int_mismatch));
  }
  if (r->has_logits) {
    json_object_set_new(o, "kl_mean", json_num(r->kl_mean));
    json_object_set_new(o, "kl_max", json_num(r->kl_max));
    json_object_set_new(o, "kl_max_position", json_integer(r->kl_max_position));
    json_object_set_new(o, "greedy_agree", json_integer(r->greedy_agree));
    json_object_set_new(o, "first_greedy_difference",
                        r->first_greedy_difference >= 0 ? json_integer(r->first_greedy_difference) : json_null());
  }
  return o;
}

static json_t *first_json(const st_diff_report *rep) {
  if (rep->tokens_first) {
    const st_diff_tokens *tk = &rep->tokens;
    json_t *o = json_object();
    json_object_set_new(o, "tap", json_string("tokens"));
    json_object_set_new(o, "layer", json_null());
    json_object_set_new(o, "metric", json_string("tokens"));
    json_object_set_new(o, "value", json_integer(tk->first_difference));
    json_object_set_new(o, "threshold", json_integer(0));
    json_object_set_new(o, "position", json_integer(tk->first_difference));
    json_object_set_new(o, "in_prompt", json_boolean(tk->in_prompt));
    json_object_set_new(o, "a", json_integer(tk->token_a));
    json_object_set_new(o, "b", json_integer(tk->token_b));
    return o;
  }
  if (rep->first_divergence < 0) return json_null();
  const st_diff_tap_result *r = &rep->taps[rep->first_divergence];
  json_t *o = json_object();
  json_object_set_new(o, "tap", json_string(r->name));
  json_object_set_new(o, "suffix", json_string(r->suffix));
  json_object_set_new(o, "layer", r->layer >= 0 ? json_integer(r->layer) : json_null());
  json_object_set_new(o, "metric", json_string(r->metric));
  json_object_set_new(o, "value", json_num(r->value));
  json_object_set_new(o, "threshold", json_num(r->threshold));
  json_object_set_new(o, "position", r->worst_position >= 0 ? json_integer(r->worst_position) : json_null());
  json_object_set_new(o, "axis0", json_string(r->row_axis ? "compressed_row" : "position"));
  json_object_set_new(o, "coordinates", coords_json(r));
  return o;
}

static int print_json(const st_trace *a, const st_trace *b, const st_diff_report *rep) {
  json_t *o = json_object();
  json_object_set_new(o, "a", trace_json(a));
  json_object_set_new(o, "b", trace_json(b));
  const st_diff_tokens *tk = &rep->tokens;
  json_t *tok = json_object();
  json_object_set_new(tok, "equal", json_boolean(tk->first_difference < 0));
  json_object_set_new(tok, "n_a", json_integer(tk->n_a));
  json_object_set_new(tok, "n_b", json_integer(tk->n_b));
  json_object_set_new(tok, "n_prompt_a", json_integer(tk->n_prompt_a));
  json_object_set_new(tok, "n_prompt_b", json_integer(tk->n_prompt_b));
  json_object_set_new(tok, "first_difference", tk->first_difference >= 0 ? json_integer(tk->first_difference) : json_null());
  json_object_set_new(tok, "in_prompt", tk->first_difference >= 0 ? json_boolean(tk->in_prompt) : json_null());
  json_object_set_new(tok, "compared_before", rep->end_position >= 0 ? json_integer(rep->end_position) : json_null());
  json_object_set_new(o, "tokens", tok);
  json_object_set_new(o, "diverges", json_boolean(rep->diverges));
  char defaults[512];
  st_diff_profile_rules(rep->profile, defaults, sizeof defaults);
  json_t *tol = json_object();
  json_object_set_new(tol, "profile", json_string(st_diff_profile_name(rep->profile)));
  json_object_set_new(tol, "imported", rep->imported ? json_stringn(&rep->imported, 1) : json_null());
  json_object_set_new(tol, "defaults", json_string(defaults));
  json_object_set_new(o, "tolerances", tol);
  json_object_set_new(o, "first_divergence", first_json(rep));
  if (rep->first_divergence >= 0 && rep->tokens_first)
    json_object_set_new(o, "first_diverging_tap", json_string(rep->taps[rep->first_divergence].name));
  int not_compared = 0;
  json_t *taps = json_array();
  for (int i = 0; i < rep->n_taps; i++) {
    not_compared += rep->taps[i].verdict == ST_DIFF_NOT_COMPARED;
    json_array_append_new(taps, tap_json(&rep->taps[i]));
  }
  json_object_set_new(o, "not_compared", json_integer(not_compared));
  json_object_set_new(o, "taps", taps);
  int rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  putchar('\n');
  json_decref(o);
  return rc;
}

/* ---------------------------------------------------------------- command */

int st_cmd_diff(int argc, char **argv) {
  const char *paths[2] = {NULL, NULL};
  int n_paths = 0, json = 0, rc = 2, c;
  st_diff_rules rules = {0};
  st_opts o;
  st_opts_init(&o, &diff_spec, argc, argv);
  st_diff_options opt = {.tap_globs = o.taps, .rules = &rules};
  st_trace *a = NULL, *b = NULL;
  st_diff_report rep = {0};
  while ((c = st_opts_next(&o)) > 0) {
    switch (c) {
    case ST_OPT_ALL: opt.all = 1; break;
    case ST_OPT_TOLERANCE:
      if (st_diff_rules_parse(&rules, o.arg)) {
        st_opts_fail(&o);
        goto out;
      }
      break;
    default: /* ST_OPT_POSITIONAL, ST_OPT_TRACE */
      if (n_paths == 2) {
        st_opts_error(&o, "two traces, not more ('%s')", o.arg);
        goto out;
      }
      paths[n_paths++] = o.arg;
    }
  }
  if (c == ST_OPTS_EXIT) {
    rc = o.exit_code;
    goto out;
  }
  json = o.json;
  opt.n_tap_globs = o.n_taps;
  if (n_paths != 2) {
    st_opts_error(&o, "two traces needed");
    goto out;
  }
  if (st_trace_open(paths[0], 0, &a) || st_trace_open(paths[1], 0, &b)) {
    st_cli_report_error("diff");
    goto out;
  }
  for (int i = 0; i < opt.n_tap_globs; i++) /* a glob that selects nothing compares nothing */
    if (!st_diff_glob_matches(a, opt.tap_globs[i]) && !st_diff_glob_matches(b, opt.tap_globs[i])) {
      fprintf(stderr, "sparsetrace diff: --tap '%s' matches no tap of %s or %s (names like "
              "layers.3.indexer.topk or suffixes like indexer.topk; 'sparsetrace inspect' lists a trace's taps)\n",
              opt.tap_globs[i], paths[0], paths[1]);
      goto out;
    }
  if (st_diff_traces(a, b, &opt, &rep)) {
    st_cli_report_error("diff");
    goto out;
  }
  if (json) {
    if (print_json(a, b, &rep)) goto out;
  } else {
    print_text(a, b, &rep);
  }
  if (fflush(stdout) != 0) goto out;
  rc = rep.diverges ? 1 : 0;
out:
  st_diff_report_free(&rep);
  st_trace_close(a);
  st_trace_close(b);
  st_diff_rules_free(&rules);
  st_opts_free(&o);
  return rc;
}
