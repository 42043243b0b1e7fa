/*
** diff.h — compares two traces tap by tap in forward order and finds the first tap that exceeds
** its tolerance (`sparsetrace diff`; reused by replay and bisect).
**
** Alignment. Position taps are matched by token position: only positions both traces kept are
** compared (the /positions datasets of a filtered recording). Compressed-row taps (axis 0 =
** compressed row) are matched by row index over min(rows_a, rows_b) rows; a row-count difference
** is reported, not judged (it follows from a different token count). Rows whose last axis grew
** to different widths (indexer.scores [T, R], indexer.topk [T, k]) are compared at the larger
** width, the narrower side padded with the fill value (-inf, -1) exactly as an HDF5 reader sees
** never-written elements. Any other shape difference is a divergence (metric "shape").
**
** Rules. Each tap is judged by the first rule whose glob matches it and whose metric applies to
** its kind; the built-in defaults come last:
**   index sets (indexer.topk, ffn.experts)  jaccard:1      min row Jaccard < 1, i.e. any set differs
**   float taps                              diff:1e-6      difference metric > 1e-6
**   other integer taps                      exact
** Every float rule also requires the NaN/+inf/-inf masks to be equal (metric "mask"): a scores
** tap's -inf pattern is compared exactly, its finite entries by the rule's metric.
** Metrics (metrics.h has the definitions):
**   diff:T     float      diverges when difference > T            (T default 1e-6)
**   cosine:T   float      diverges when cosine < T                (T default 1)
**   maxabs:T   float      diverges when max |a - b| > T           (T default 0)
**   jaccard:T  index set  diverges when min row Jaccard < T       (T default 1)
**   overlap:T  index set  diverges when min row overlap < T       (T default 1)
**   exact      any        diverges when any element's bits differ
**   ignore     any        not compared
** Rule text: RULE[,RULE]...  with  RULE = GLOB=METRIC[:T]; GLOB is a shell glob matched against
** the tap suffix ("indexer.topk") and the full name ("layers.3.indexer.topk"); "tokens" is not a
** tap (the token sequences are always compared exactly).
**
** Ties. Two top-k sets (indexer.topk, under jaccard or overlap) that differ at a position only
** by rows whose score ties the selection boundary are a tie, not a divergence: engines break
** exact ties differently (torch.topk against our lowest-index rule), and random models with few
** indexer heads score exact ties often. The scores are the trace's own indexer.scores row at that
** position: A's when A holds it, else B's (a trace that kept scores at `last` only judges that
** position); st_topk_differs_by_ties (metrics.h) decides. Such a row counts as identical in the
** Jaccard/overlap figures and in tie_rows; a tap whose only differences are ties gets the verdict
** ST_DIFF_TIE. Rule `exact` compares the bits and excuses nothing.
**
** Tolerance profiles. The built-in defaults above suit two runs of this engine. When either trace
** was imported from another engine (it has an `import` attribute: `sparsetrace import`), they are
** replaced by defaults for a bf16/fp8 serving engine against an fp32 reference (st_diff_profile_
** rules; `diff` prints which were used). Rules given by the user still come first.
**
** Token differences. Activations at position p depend on tokens 0..p, so once the token
** sequences differ (at position d: a different prompt, or a generated token after a divergence)
** later rows are consequences, not evidence: only positions < d are compared, and compressed
** rows j whose last pooled token (j+1)*m - 1 is < d (m = the layer's compress ratio from the
** trace's config; without a config every common row is compared). The excluded rows are counted.
**
** Stopping. Without `all`, comparison stops after the layer holding the first divergence (the
** rest of that layer is still compared, so its table is complete); later taps are reported as
** not compared. Reads go block by block (opt.block_bytes), so traces larger than memory work.
*/
#ifndef ST_DIFF_H
#define ST_DIFF_H

#include <stddef.h>
#include <stdint.h>

#include "common/base.h"
#include "metrics.h"
#include "recorder/trace_reader.h"

#define ST_DIFF_DEFAULT_FLOAT_TOLERANCE 1e-6
#define ST_DIFF_DEFAULT_SET_JACCARD 1.0
#define ST_DIFF_SET_DETAIL 8 /* members shown of each side's set difference at the worst row */

typedef enum st_diff_metric {
  ST_DIFF_METRIC_DIFF = 0,
  ST_DIFF_METRIC_COSINE = 1,
  ST_DIFF_METRIC_MAXABS = 2,
  ST_DIFF_METRIC_JACCARD = 3,
  ST_DIFF_METRIC_OVERLAP = 4,
  ST_DIFF_METRIC_EXACT = 5,
  ST_DIFF_METRIC_IGNORE = 6,
} st_diff_metric;

/* How a tap's values are compared. */
typedef enum st_diff_kind {
  ST_DIFF_KIND_FLOAT = 0,       /* float32/float64/float16/bfloat16 */
  ST_DIFF_KIND_INDEX_SET = 1,   /* rows of indices, order irrelevant: indexer.topk, ffn.experts */
  ST_DIFF_KIND_INTEGER = 2,     /* other integer taps */
  ST_DIFF_KIND_UNSUPPORTED = 3, /* fp8 / fp4 raw bits: reported, not compared */
} st_diff_kind;

typedef struct st_diff_rule {
  char glob[ST_TRACE_MAX_NAME]; /* "*" for the built-in defaults */
  st_diff_metric metric;
  double threshold;
  int builtin;                  /* 1: one of the defaults */
} st_diff_rule;

/* Which built-in defaults apply (diff.h "Tolerance profiles"). */
typedef enum st_diff_profile {
  ST_DIFF_PROFILE_AUTO = 0,     /* IMPORTED when either trace has an `import` attribute, else SAME */
  ST_DIFF_PROFILE_SAME = 1,     /* two runs of this engine: diff:1e-6, jaccard:1, exact */
  ST_DIFF_PROFILE_IMPORTED = 2, /* a bf16/fp8 engine's dump against an fp32 reference */
} st_diff_profile;

/* "same-engine", "imported". */
const char *st_diff_profile_name(st_diff_profile p);
/* The profile's defaults as text ("indexer.scores=diff:0.03, ..., *=diff:1e-06"), for output. */
void st_diff_profile_rules(st_diff_profile p, char *buf, size_t size);

typedef struct st_diff_rules {
  st_diff_rule *v;
  int n, cap;
} st_diff_rules; /* zero-initialise; st_diff_rules_free releases */

/* Appends the rules of text (grammar above) to rules, in order. ST_EINVAL with a message naming
** the offending rule (unknown metric, bad threshold, missing '='); rules is unchanged then. */
st_status st_diff_rules_parse(st_diff_rules *rules, const char *text);
void st_diff_rules_free(st_diff_rules *rules);

/* "diff", "cosine", "maxabs", "jaccard", "overlap", "exact", "ignore". */
const char *st_diff_metric_name(st_diff_metric m);
/* 1 when rule metric m can judge a tap of kind k. */
int st_diff_metric_applies(st_diff_metric m, st_diff_kind k);
st_diff_kind st_diff_tap_kind(const st_trace_tap *tap);
/* The rule for a tap: the first of rules (NULL = none) that matches name or suffix and applies
** to kind, else the profile's built-in default for it (AUTO counts as SAME here). */
st_diff_rule st_diff_rule_for(const st_diff_rules *rules, const char *name, const char *suffix,
                              st_diff_kind kind, st_diff_profile profile);

typedef enum st_diff_verdict {
  ST_DIFF_OK = 0,
  ST_DIFF_DIVERGES = 1,
  ST_DIFF_ONLY_A = 2,        /* only trace A holds the tap */
  ST_DIFF_ONLY_B = 3,
  ST_DIFF_IGNORED = 4,       /* rule "ignore" */
  ST_DIFF_NOT_COMPARED = 5,  /* after the layer of the first divergence (without `all`) */
  ST_DIFF_NO_COMMON = 6,     /* no token position kept by both traces */
  ST_DIFF_UNSUPPORTED = 7,   /* a dtype the reader cannot widen */
  ST_DIFF_TIE = 8,           /* top-k sets differ, but only by boundary ties (diff.h "Ties") */
} st_diff_verdict;

/* "ok", "DIVERGES", "only in A", "only in B", "ignored", "not compared", "no common positions",
** "unsupported dtype", "ties only". */
const char *st_diff_verdict_name(st_diff_verdict v);
/* 1 for the verdicts that come from comparing values (ok, DIVERGES, ties only). */
int st_diff_verdict_compared(st_diff_verdict v);

/* The comparison of one tap. Positions are token positions (compressed rows for row taps). */
typedef struct st_diff_tap_result {
  char name[ST_TRACE_MAX_NAME];
  char suffix[ST_TRACE_MAX_NAME]; /* name without "layers.N." */
  st_tap_id id;                   /* ST_TAP_COUNT when not in this build's catalogue */
  int layer;                      /* -1 for model-scope taps */
  int row_axis;
  st_diff_kind kind;
  st_diff_rule rule;
  st_diff_verdict verdict;
  const char *metric;  /* what was judged: the rule's metric name, or "mask" / "shape" / "dtype" */
  double value;        /* its value (for "mask": elements whose class differs) */
  double threshold;    /* the limit it was held to */
  int64_t rows_a, rows_b;   /* rows each trace holds */
  int64_t rows_compared;    /* rows (positions) both hold and that were compared */
  int64_t rows_excluded;    /* rows both hold, left out because they follow a token difference */
  int64_t only_a, only_b;   /* positions kept by one trace only (position taps) */
  int rank;                 /* rank of the compared tensor [rows_compared, row_shape...] */
  int64_t row_shape[ST_TRACE_MAX_RANK]; /* row_shape[0 .. rank-2]: one row, widths padded */
  /* The worst place: for a float metric the largest |a - b| (the first mask or bit difference
  ** when those decided), for index sets the row with the lowest Jaccard/overlap, for exact the
  ** first differing element. worst_position -1 when there is none. */
  int64_t worst_position;
  int64_t worst_coords[ST_TRACE_MAX_RANK]; /* inside the row (n_worst_coords = rank - 1 values; */
  int n_worst_coords;                      /* 0 when a whole row is the worst: index sets) */
  double worst_a, worst_b;                 /* the values there (element comparisons) */
  st_tensor_compare tensor;  /* float taps */
  st_index_set_compare sets; /* index-set taps (also filled when the rule is exact) */
  int64_t int_mismatch;      /* integer / exact on integer taps: differing elements */
  /* Index sets at the worst row: members only in A, only in B (the first few, ascending). */
  int32_t worst_only_a[ST_DIFF_SET_DETAIL], worst_only_b[ST_DIFF_SET_DETAIL];
  int n_worst_only_a, n_worst_only_b;
  /* Ties (indexer.topk): rows whose sets differ only by boundary ties; the first of them, its
  ** boundary score and whose scores judged it ('A' or 'B'; 0 when no tie). When nothing diverges,
  ** worst_position and worst_only_a/b show that first tie. */
  int64_t tie_rows, first_tie_position;
  float tie_boundary;
  char tie_judged_by;
  /* logits only (has_logits): per-row KL(softmax a || softmax b) and greedy agreement. */
  int has_logits;
  double kl_mean, kl_max;
  int64_t kl_max_position, greedy_agree, first_greedy_difference;
} st_diff_tap_result;

typedef struct st_diff_tokens {
  int64_t n_a, n_b, n_prompt_a, n_prompt_b;
  int64_t first_difference; /* first position where the token ids (or the lengths) differ; -1 */
  int in_prompt;            /* 1 when first_difference lies in both prompts */
  int32_t token_a, token_b; /* the ids there; -1 past the end of a sequence */
} st_diff_tokens;

typedef struct st_diff_options {
  const char *const *tap_globs; /* compare only taps matching one of these (name or suffix) */
  int n_tap_globs;              /* 0: every tap */
  const st_diff_rules *rules;   /* NULL: the defaults */
  int all;                      /* 1: compare every tap, do not stop after the first divergence */
  size_t block_bytes;           /* read buffer per trace; 0 = 32 MiB */
  st_diff_profile profile;      /* built-in defaults; 0 = AUTO */
} st_diff_options;

typedef struct st_diff_report {
  st_diff_tokens tokens;
  st_diff_tap_result *taps; /* every tap held by either trace and selected, in forward order */
  int n_taps;
  int first_divergence;     /* index into taps, -1 when no tap diverges */
  int64_t end_position;     /* positions >= this were not compared (tokens differ); -1 = none */
  int row_limits_known;     /* 1: compress ratios came from the config (row taps limited too) */
  /* 1 when the token sequences decide the first divergence: the prompts differ, or no compared
  ** tap diverges but the generated tokens (or their count) do. */
  int tokens_first;
  int diverges;             /* 1 when anything diverges (a tap or the tokens) */
  st_diff_profile profile;  /* the built-in defaults used (never AUTO) */
  char imported;            /* AUTO chose IMPORTED because of this trace ('A' or 'B'); 0 otherwise */
} st_diff_report;

/* How many taps of t a --tap glob selects (by full name or suffix, as st_diff_traces does). */
int st_diff_glob_matches(const st_trace *t, const char *glob);

/* Compares trace a with trace b. *out is filled (free with st_diff_report_free) on ST_OK.
** A divergence is a result, not an error: errors are I/O and format problems only. */
st_status st_diff_traces(st_trace *a, st_trace *b, const st_diff_options *opt, st_diff_report *out);
void st_diff_report_free(st_diff_report *r);

/* What one tap comparison may read. */
typedef struct st_diff_limits {
  size_t block_bytes;   /* read buffer per trace; 0 = 32 MiB */
  int64_t end_position; /* position taps: compare positions < end_position only; -1 = all */
  int64_t end_row;      /* compressed-row taps: compare rows < end_row only; -1 = all */
} st_diff_limits;

/* Compares one tap held by both traces under rule (kind decides how). lim NULL = no limits. */
st_status st_diff_tap(st_trace *a, const st_trace_tap *ta, st_trace *b, const st_trace_tap *tb,
                      const st_diff_rule *rule, const st_diff_limits *lim, st_diff_tap_result *out);

/* Compares the token sequences. */
void st_diff_compare_tokens(const st_trace *a, const st_trace *b, st_diff_tokens *out);

#endif
