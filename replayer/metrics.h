/*
** metrics.h — the comparison metrics of docs/design.md "Metrics", as pure functions: no I/O, no
** allocation, no global state. `replay`, `diff` and `bisect` all measure with these, so a number
** means the same thing wherever it is printed or stored in the index.
**
** Tensors (float32 in, double accumulation):
**   difference  1 - 2*Sum(xy) / (Sum(x^2) + Sum(y^2))  (DeepGEMM / sglang's form: 0 = identical,
**               1 = orthogonal, 2 = x vs -x; defined as 0 when both tensors are all zero).
**               Computed as the equal Sum((x-y)^2) / (Sum(x^2) + Sum(y^2)), which keeps its
**               precision for nearly equal tensors: 1 - 2*Sum(xy)/... cancels to exactly 0 once
**               the true value falls below ~1e-16, hiding a one-ulp change in a large tensor.
**   cosine      Sum(xy) / sqrt(Sum(x^2) Sum(y^2)); 1 when both are all zero, 0 when only one is
**   max-abs     max |x - y| with the flat index of its first occurrence; coordinates by
**               st_unravel_index; relative max-abs = max-abs / max(|x|, |y|) over the same elements
**   masks       each element is one of finite, NaN, +inf, -inf. Elements where x and y fall in
**               different classes are counted (per class and in total) and excluded from every
**               sum above; an element that is NaN in both, or the same infinity in both, is equal
**               and also excluded (so a scores row with -inf for invisible rows compares its
**               masks exactly and its finite entries by the difference metric).
**   bitwise     elements whose float32 bit patterns differ (the replay determinism check).
** Accumulators take elements in blocks and continue the flat index across calls, so a tensor
** too big for memory is compared block by block with exactly the result of one call.
**
** Index sets (rows of int32, any negative value = none, order and duplicates irrelevant):
**   Jaccard |A and B| / |A or B|, overlap |A and B| / max(|A|, |B|); both are 1 for two empty
**   sets (nothing to disagree on) and 0 when exactly one set is empty.
**
** Needle ranks (one row of index scores, -inf or NaN = not visible):
**   rank of row j = number of visible rows with a strictly greater score (0 = best; equal scores
**   share the rank of the first among them). Best rank of a set of needle rows = the smallest.
**
** Logits: KL(P || Q) of P = softmax(a), Q = softmax(b) in double with max-shifted log-sum-exp;
** greedy token = argmax with ties to the lower index.
*/
#ifndef ST_METRICS_H
#define ST_METRICS_H

#include <stdint.h>

/* ---------------------------------------------------------------- tensors */

/* Running comparison of two float tensors x (A) and y (B) of equal element count. Fields are
** public for reading; change them only through the functions below. Flat indices are 0-based
** over every element passed so far, -1 when there is none. */
typedef struct st_tensor_compare {
  int64_t count;          /* elements compared */
  int64_t finite_count;   /* elements finite in both: the ones in the sums */
  double sum_xy, sum_xx, sum_yy;
  double sum_sq_diff;     /* Sum((x-y)^2) */
  double max_abs;         /* max |x - y| over finite_count elements; 0 when none */
  int64_t max_abs_index;  /* flat index of the first element reaching max_abs; -1 if max_abs is 0 */
  float max_abs_x, max_abs_y; /* the two values there */
  double max_magnitude;   /* max(|x|, |y|) over finite_count elements */
  int64_t nan_mismatch;   /* isnan(x) != isnan(y) */
  int64_t posinf_mismatch; /* (x == +inf) != (y == +inf) */
  int64_t neginf_mismatch; /* (x == -inf) != (y == -inf) */
  int64_t mask_mismatch;  /* elements whose class (finite/NaN/+inf/-inf) differs */
  int64_t first_mask_mismatch;
  int64_t bit_mismatch;   /* elements whose bit patterns differ (NaN payloads and -0 included) */
  int64_t first_bit_mismatch;
} st_tensor_compare;

/* Resets c to "nothing compared yet". */
void st_tensor_compare_init(st_tensor_compare *c);
/* Adds n more element pairs (x[i], y[i]) to c; their flat indices are c->count + i. */
void st_tensor_compare_add(st_tensor_compare *c, const float *x, const float *y, int64_t n);
/* One call: init + add. */
void st_tensor_compare_f32(const float *x, const float *y, int64_t n, st_tensor_compare *out);

/* The metrics of a finished comparison (see the top of this file for the definitions and their
** values on zero tensors). */
double st_tensor_difference(const st_tensor_compare *c);
double st_tensor_cosine(const st_tensor_compare *c);
/* max_abs / max_magnitude; 0 when max_magnitude is 0. */
double st_tensor_rel_max_abs(const st_tensor_compare *c);

/* Writes the row-major coordinates of flat index `flat` in a tensor of the given shape
** (rank <= 8) into coords[rank]. Returns 0, or -1 (coords untouched) when flat is negative or
** outside the shape. */
int st_unravel_index(int64_t flat, const int64_t *shape, int rank, int64_t *coords);

/* ---------------------------------------------------------------- index sets */

/* Sizes of two index sets and of their intersection (distinct non-negative values). */
typedef struct st_set_counts {
  int64_t n_a, n_b, n_common;
} st_set_counts;

/* Counts the sets held in a[0..width_a) and b[0..width_b) (negative = none; duplicates count
** once). scratch must hold width_a + width_b int32 values; a and b are not modified. */
st_set_counts st_index_set_counts(const int32_t *a, int64_t width_a, const int32_t *b,
                                  int64_t width_b, int32_t *scratch);
double st_set_jaccard(st_set_counts c); /* 1 when both are empty */
double st_set_overlap(st_set_counts c); /* |A and B| / max(|A|, |B|); 1 when both are empty */

/* Running comparison of rows of index sets. Rows are numbered from 0 across calls. */
typedef struct st_index_set_compare {
  int64_t rows;            /* rows compared */
  int64_t identical_rows;  /* rows whose two sets are equal */
  int64_t first_diff_row;  /* first row whose sets differ, -1 if none */
  double sum_jaccard, sum_overlap;
  double min_jaccard, min_overlap; /* 1 when no rows */
  int64_t min_jaccard_row; /* first row reaching min_jaccard, -1 if no rows */
  int64_t min_overlap_row; /* first row reaching min_overlap, -1 if no rows */
} st_index_set_compare;

void st_index_set_compare_init(st_index_set_compare *c);
/* Adds n_rows rows: a is [n_rows, width_a], b is [n_rows, width_b] (the widths may differ, e.g.
** top-k 8 against top-k 32). scratch holds width_a + width_b int32 values. */
void st_index_set_compare_add(st_index_set_compare *c, const int32_t *a, int64_t width_a,
                              const int32_t *b, int64_t width_b, int64_t n_rows, int32_t *scratch);
double st_index_set_mean_jaccard(const st_index_set_compare *c); /* 1 when no rows */
double st_index_set_mean_overlap(const st_index_set_compare *c); /* 1 when no rows */

/* Top-k ties (diff.h "Ties"). Whether two top-k sets of one position differ only by rows whose
** score ties the selection boundary, judged in one trace's scores: scores[0..n_scores) is that
** trace's indexer.scores row (compressed-row ids index it), chosen[0..width_chosen) the set that
** trace selected, other[0..width_other) the other trace's set (negative = none, any order). Returns
** 1 when the sets differ, hold as many rows each, the boundary (the lowest score in chosen, i.e.
** the k-th score) is finite, and every row of either set difference has exactly the boundary score
** (*boundary is set to it); 0 otherwise, equal sets included. scratch holds width_chosen +
** width_other int32 values. The one function that decides "tie, not divergence". */
int st_topk_differs_by_ties(const float *scores, int64_t n_scores, const int32_t *chosen,
                            int64_t width_chosen, const int32_t *other, int64_t width_other,
                            int32_t *scratch, float *boundary);

/* ---------------------------------------------------------------- needle ranks */

typedef struct st_needle_rank {
  int64_t rank;      /* best rank of any visible needle row; -1 when none is visible */
  int32_t row;       /* the needle row achieving it (lowest index among equal scores); -1 if none */
  float score;       /* its score (-inf if none) */
  int64_t n_visible; /* visible rows in the whole score row */
} st_needle_rank;

/* Best rank of the needle rows (indices into scores[0..n); out-of-range and negative entries are
** ignored) in one row of index scores. O(n + n_needle). */
st_needle_rank st_needle_best_rank(const float *scores, int64_t n, const int32_t *needle_rows,
                                   int64_t n_needle);
/* 1 when any needle row appears in topk[0..k) (negative entries = none), else 0. */
int st_needle_in_topk(const int32_t *topk, int64_t k, const int32_t *needle_rows, int64_t n_needle);

/* ---------------------------------------------------------------- logits */

/* KL(P || Q) in nats, P = softmax(a), Q = softmax(b), a and b of n logits. -inf logits are
** probability 0 (a term with P = 0 adds nothing); +inf when P > 0 where Q = 0; NaN when a or b
** holds NaN or +inf, or either is all -inf. Exactly 0 for identical rows; never negative
** (rounding below 0 is clamped). */
double st_logits_kl(const float *a, const float *b, int64_t n);
/* Index of the largest logit, ties to the lower index; NaN never wins; -1 when n == 0 or all
** are NaN. */
int64_t st_logits_argmax(const float *x, int64_t n);
/* 1 when both rows have the same greedy token (and it exists), else 0. */
int st_logits_greedy_agree(const float *a, const float *b, int64_t n);

#endif
