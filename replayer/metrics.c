/*
** metrics.c — the comparison metrics (definitions and edge-case values in metrics.h).
**
** Accumulation is in double and strictly sequential, so comparing a tensor in blocks gives the
** same bits as one call, and comparing a tensor with itself gives difference 0 and cosine 1
** exactly: each product of two floats is exact in double, Sum(xy) and Sum(x^2) then see the same
** addends in the same order, and the cosine divides equal sums by themselves.
*/
#include "metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- tensors */

enum { CLASS_FINITE = 0, CLASS_NAN = 1, CLASS_POSINF = 2, CLASS_NEGINF = 3 };

static int float_class(float v) {
  if (isnan(v)) return CLASS_NAN;
  if (isinf(v)) return v > 0 ? CLASS_POSINF : CLASS_NEGINF;
  return CLASS_FINITE;
}

void st_tensor_compare_init(st_tensor_compare *c) {
  memset(c, 0, sizeof *c);
  c->max_abs_index = -1;
  c->first_mask_mismatch = -1;
  c->first_bit_mismatch = -1;
}

void st_tensor_compare_add(st_tensor_compare *c, const float *x, const float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    int64_t flat = c->count + i;
    uint32_t bx, by;
    memcpy(&bx, &x[i], sizeof bx);
    memcpy(&by, &y[i], sizeof by);
    if (bx != by) {
      if (c->bit_mismatch == 0) c->first_bit_mismatch = flat;
      c->bit_mismatch++;
    }
    int kx = float_class(x[i]), ky = float_class(y[i]);
    if (kx != CLASS_FINITE || ky != CLASS_FINITE) {
      if (kx != ky) {
        if (c->mask_mismatch == 0) c->first_mask_mismatch = flat;
        c->mask_mismatch++;
        c->nan_mismatch += (kx == CLASS_NAN) != (ky == CLASS_NAN);
        c->posinf_mismatch += (kx == CLASS_POSINF) != (ky == CLASS_POSINF);
        c->neginf_mismatch += (kx == CLASS_NEGINF) != (ky == CLASS_NEGINF);
      }
      continue;
    }
    double a = x[i], b = y[i];
    c->finite_count++;
    c->sum_xy += a * b;
    c->sum_xx += a * a;
    c->sum_yy += b * b;
    c->sum_sq_diff += (a - b) * (a - b);
    double d = fabs(a - b);
    if (d > c->max_abs) {
      c->max_abs = d;
      c->max_abs_index = flat;
      c->max_abs_x = x[i];
      c->max_abs_y = y[i];
    }
    double m = fmax(fabs(a), fabs(b));
    if (m > c->max_magnitude) c->max_magnitude = m;
  }
  c->count += n;
}

void st_tensor_compare_f32(const float *x, const float *y, int64_t n, st_tensor_compare *out) {
  st_tensor_compare_init(out);
  st_tensor_compare_add(out, x, y, n);
}

double st_tensor_difference(const st_tensor_compare *c) {
  double denom = c->sum_xx + c->sum_yy;
  if (denom == 0) return 0; /* both all zero (or nothing finite to compare) */
  /* 1 - 2*Sum(xy)/denom, without the cancellation: exactly 0 for x == y (every addend is 0)
  ** and exactly 2 for x == -y (Sum(4x^2) = 4*Sum(x^2) in binary floating point). */
  return c->sum_sq_diff / denom;
}

double st_tensor_cosine(const st_tensor_compare *c) {
  if (c->sum_xx == 0 && c->sum_yy == 0) return 1;
  if (c->sum_xx == 0 || c->sum_yy == 0) return 0;
  /* Equal norms (x == y or x == -y) divide by sum_xx itself, so the result is exactly +-1. */
  double denom = c->sum_xx == c->sum_yy ? c->sum_xx : sqrt(c->sum_xx) * sqrt(c->sum_yy);
  double v = c->sum_xy / denom;
  return v > 1 ? 1 : v < -1 ? -1 : v;
}

double st_tensor_rel_max_abs(const st_tensor_compare *c) {
  return c->max_magnitude > 0 ? c->max_abs / c->max_magnitude : 0;
}

int st_unravel_index(int64_t flat, const int64_t *shape, int rank, int64_t *coords) {
  if (flat < 0 || rank < 0 || rank > 8) return -1;
  int64_t total = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] <= 0) return -1;
    total *= shape[i];
  }
  if (flat >= total) return -1;
  for (int i = rank - 1; i >= 0; i--) {
    coords[i] = flat % shape[i];
    flat /= shape[i];
  }
  return 0;
}

/* ---------------------------------------------------------------- index sets */

static int cmp_i32(const void *pa, const void *pb) {
  int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
  return (a > b) - (a < b);
}

/* Copies the non-negative values of v[0..n) to out, sorted and without duplicates; returns how
** many. Rows from the engine are already ascending, which skips the sort. */
static int64_t sorted_set(const int32_t *v, int64_t n, int32_t *out) {
  int64_t m = 0, sorted = 1;
  for (int64_t i = 0; i < n; i++) {
    if (v[i] < 0) continue;
    if (m > 0 && v[i] <= out[m - 1]) sorted = 0;
    out[m++] = v[i];
  }
  if (!sorted) qsort(out, (size_t)m, sizeof *out, cmp_i32);
  int64_t k = 0;
  for (int64_t i = 0; i < m; i++)
    if (k == 0 || out[i] != out[k - 1]) out[k++] = out[i];
  return k;
}

st_set_counts st_index_set_counts(const int32_t *a, int64_t width_a, const int32_t *b,
                                  int64_t width_b, int32_t *scratch) {
  st_set_counts c;
  int32_t *sa = scratch, *sb = scratch + width_a;
  c.n_a = sorted_set(a, width_a, sa);
  c.n_b = sorted_set(b, width_b, sb);
  c.n_common = 0;
  for (int64_t i = 0, j = 0; i < c.n_a && j < c.n_b;) {
    if (sa[i] < sb[j]) i++;
    else if (sa[i] > sb[j]) j++;
    else c.n_common++, i++, j++;
  }
  return c;
}

int st_topk_differs_by_ties(const float *scores, int64_t n_scores, const int32_t *chosen,
                            int64_t width_chosen, const int32_t *other, int64_t width_other,
                            int32_t *scratch, float *boundary) {
  int32_t *sa = scratch, *sb = scratch + width_chosen;
  int64_t na = sorted_set(chosen, width_chosen, sa), nb = sorted_set(other, width_other, sb);
  if (na != nb || na == 0) return 0;
  float lowest = INFINITY;
  for (int64_t i = 0; i < na; i++) {
    if (sa[i] >= n_scores) return 0; /* a row the scores do not cover */
    if (scores[sa[i]] < lowest || isnan(scores[sa[i]])) lowest = scores[sa[i]];
  }
  if (!isfinite(lowest)) return 0;
  int64_t swapped = 0;
  for (int64_t i = 0, j = 0; i < na || j < nb;) {
    int32_t row;
    if (j >= nb || (i < na && sa[i] < sb[j])) row = sa[i++];
    else if (i >= na || sb[j] < sa[i]) row = sb[j++];
    else {
      i++, j++;
      continue;
    }
    if (row >= n_scores || scores[row] != lowest) return 0; /* NaN != anything: never a tie */
    swapped++;
  }
  if (swapped == 0) return 0;
  *boundary = lowest;
  return 1;
}

double st_set_jaccard(st_set_counts c) {
  int64_t uni = c.n_a + c.n_b - c.n_common;
  return uni == 0 ? 1.0 : (double)c.n_common / (double)uni;
}

double st_set_overlap(st_set_counts c) {
  int64_t m = c.n_a > c.n_b ? c.n_a : c.n_b;
  return m == 0 ? 1.0 : (double)c.n_common / (double)m;
}

void st_index_set_compare_init(st_index_set_compare *c) {
  memset(c, 0, sizeof *c);
  c->first_diff_row = -1;
  c->min_jaccard = 1;
  c->min_overlap = 1;
  c->min_jaccard_row = -1;
  c->min_overlap_row = -1;
}

void st_index_set_compare_add(st_index_set_compare *c, const int32_t *a, int64_t width_a,
                              const int32_t *b, int64_t width_b, int64_t n_rows, int32_t *scratch) {
  for (int64_t r = 0; r < n_rows; r++) {
    st_set_counts k = st_index_set_counts(a + r * width_a, width_a, b + r * width_b, width_b, scratch);
    double j = st_set_jaccard(k), o = st_set_overlap(k);
    int64_t row = c->rows + r;
    int same = k.n_a == k.n_common && k.n_b == k.n_common;
    if (same) c->identical_rows++;
    else if (c->first_diff_row < 0) c->first_diff_row = row;
    c->sum_jaccard += j;
    c->sum_overlap += o;
    if (c->min_jaccard_row < 0 || j < c->min_jaccard) {
      c->min_jaccard = j;
      c->min_jaccard_row = row;
    }
    if (c->min_overlap_row < 0 || o < c->min_overlap) {
      c->min_overlap = o;
      c->min_overlap_row = row;
    }
  }
  c->rows += n_rows;
}

double st_index_set_mean_jaccard(const st_index_set_compare *c) {
  return c->rows ? c->sum_jaccard / (double)c->rows : 1.0;
}

double st_index_set_mean_overlap(const st_index_set_compare *c) {
  return c->rows ? c->sum_overlap / (double)c->rows : 1.0;
}

/* ---------------------------------------------------------------- needle ranks */

static int visible(float s) { return !isnan(s) && s != -INFINITY; }

st_needle_rank st_needle_best_rank(const float *scores, int64_t n, const int32_t *needle_rows,
                                   int64_t n_needle) {
  st_needle_rank r = {.rank = -1, .row = -1, .score = -INFINITY, .n_visible = 0};
  /* The rank only grows as the score falls, so the best needle row is the best-scoring one. */
  for (int64_t i = 0; i < n_needle; i++) {
    int32_t j = needle_rows[i];
    if (j < 0 || j >= n || !visible(scores[j])) continue;
    if (r.row < 0 || scores[j] > r.score || (scores[j] == r.score && j < r.row)) {
      r.row = j;
      r.score = scores[j];
    }
  }
  int64_t greater = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!visible(scores[i])) continue;
    r.n_visible++;
    if (r.row >= 0 && scores[i] > r.score) greater++;
  }
  if (r.row >= 0) r.rank = greater;
  return r;
}

int st_needle_in_topk(const int32_t *topk, int64_t k, const int32_t *needle_rows, int64_t n_needle) {
  for (int64_t i = 0; i < k; i++) {
    if (topk[i] < 0) continue;
    for (int64_t j = 0; j < n_needle; j++)
      if (needle_rows[j] == topk[i]) return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- logits */

/* log(Sum exp(x)) shifted by the maximum; NaN when x holds NaN or +inf or is all -inf. */
static double log_sum_exp(const float *x, int64_t n) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(x[i]) || x[i] == INFINITY) return NAN;
    if (x[i] > m) m = x[i];
  }
  if (m == -INFINITY) return NAN;
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += exp((double)x[i] - m);
  return m + log(s);
}

double st_logits_kl(const float *a, const float *b, int64_t n) {
  double la = log_sum_exp(a, n), lb = log_sum_exp(b, n);
  if (isnan(la) || isnan(lb)) return NAN;
  double kl = 0;
  for (int64_t i = 0; i < n; i++) {
    if (a[i] == -INFINITY) continue; /* P = 0 */
    double log_p = (double)a[i] - la;
    double p = exp(log_p);
    if (p == 0) continue;
    if (b[i] == -INFINITY) return INFINITY;
    kl += p * (log_p - ((double)b[i] - lb));
  }
  return kl > 0 ? kl : 0;
}

int64_t st_logits_argmax(const float *x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best;
}

int st_logits_greedy_agree(const float *a, const float *b, int64_t n) {
  int64_t ia = st_logits_argmax(a, n);
  return ia >= 0 && ia == st_logits_argmax(b, n);
}
