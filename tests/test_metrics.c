/*
** test_metrics.c — replayer/metrics.h against brute-force computations written independently
** here: the difference metric as Sum((x-y)^2)/(Sum x^2 + Sum y^2) in long double, float classes
** decoded from the bit pattern, sets as membership bitmaps, ranks by counting every pair,
** softmax and KL the naive way in long double. Random inputs (fixed seeds) plus hand edge cases.
*/
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "replayer/metrics.h"

/* ------------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rng(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}
static double uniform(void) { return (double)(rng() >> 11) / 9007199254740992.0; } /* [0, 1) */
static int64_t below(int64_t n) { return (int64_t)(rng() % (uint64_t)n); }

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* 0 finite, 1 NaN, 2 +inf, 3 -inf, from the IEEE bit pattern (not from isnan/isinf). */
static int ref_class(float f) {
  uint32_t u = bits_of(f), e = (u >> 23) & 0xff, m = u & 0x7fffff;
  if (e != 0xff) return 0;
  if (m) return 1;
  return (u >> 31) ? 3 : 2;
}

static void expect_close(double got, long double want, double rel, const char *what) {
  long double err = fabsl((long double)got - want);
  long double scale = fabsl(want) > 1 ? fabsl(want) : 1;
  if (!(err <= rel * scale)) {
    fprintf(stderr, "%s: got %.17g want %.17Lg (err %.3Lg)\n", what, got, want, err);
    fail();
  }
}

/* Random float tensor: normal-ish values, some exact zeros, optional special values. */
static void random_tensor(float *x, int64_t n, double special_rate) {
  for (int64_t i = 0; i < n; i++) {
    double u = uniform();
    x[i] = (float)((uniform() + uniform() + uniform() - 1.5) * 4.0);
    if (u < 0.02) x[i] = 0;
    if (special_rate > 0 && uniform() < special_rate) {
      int k = (int)below(3);
      x[i] = k == 0 ? NAN : k == 1 ? INFINITY : -INFINITY;
    }
  }
}

/* ------------------------------------------------------------------ tensors */

typedef struct ref_tensor {
  long double sq_diff, xx, yy, xy, max_abs, max_mag;
  int64_t max_abs_index, mask, nan_mm, pos_mm, neg_mm, first_mask, bits, first_bits, finite;
} ref_tensor;

static ref_tensor ref_compare(const float *x, const float *y, int64_t n) {
  ref_tensor r = {0};
  r.max_abs_index = r.first_mask = r.first_bits = -1;
  for (int64_t i = 0; i < n; i++) {
    if (bits_of(x[i]) != bits_of(y[i])) {
      if (r.first_bits < 0) r.first_bits = i;
      r.bits++;
    }
    int cx = ref_class(x[i]), cy = ref_class(y[i]);
    if (cx != cy) {
      if (r.first_mask < 0) r.first_mask = i;
      r.mask++;
      r.nan_mm += (cx == 1) != (cy == 1);
      r.pos_mm += (cx == 2) != (cy == 2);
      r.neg_mm += (cx == 3) != (cy == 3);
    }
    if (cx || cy) continue;
    long double a = x[i], b = y[i];
    r.finite++;
    r.sq_diff += (a - b) * (a - b);
    r.xx += a * a;
    r.yy += b * b;
    r.xy += a * b;
    long double d = fabsl(a - b);
    if (d > r.max_abs) r.max_abs = d, r.max_abs_index = i;
    if (fabsl(a) > r.max_mag) r.max_mag = fabsl(a);
    if (fabsl(b) > r.max_mag) r.max_mag = fabsl(b);
  }
  return r;
}

static void check_against_ref(const float *x, const float *y, int64_t n) {
  st_tensor_compare c;
  st_tensor_compare_f32(x, y, n, &c);
  ref_tensor r = ref_compare(x, y, n);
  assert_int_equal(c.count, n);
  assert_int_equal(c.finite_count, r.finite);
  assert_int_equal(c.mask_mismatch, r.mask);
  assert_int_equal(c.nan_mismatch, r.nan_mm);
  assert_int_equal(c.posinf_mismatch, r.pos_mm);
  assert_int_equal(c.neginf_mismatch, r.neg_mm);
  assert_int_equal(c.first_mask_mismatch, r.first_mask);
  assert_int_equal(c.bit_mismatch, r.bits);
  assert_int_equal(c.first_bit_mismatch, r.first_bits);
  assert_int_equal(c.max_abs_index, r.max_abs_index);
  expect_close(c.max_abs, r.max_abs, 1e-15, "max_abs");
  long double denom = r.xx + r.yy;
  long double want = denom == 0 ? 0.0L : r.sq_diff / denom;
  expect_close(st_tensor_difference(&c), want, 1e-12, "difference");
  /* and the defining form, 1 - 2 Sum(xy) / (Sum x^2 + Sum y^2), up to its cancellation */
  expect_close(st_tensor_difference(&c), denom == 0 ? 0.0L : 1.0L - 2.0L * r.xy / denom, 1e-12, "definition");
  long double cos = r.xx == 0 && r.yy == 0 ? 1.0L : (r.xx == 0 || r.yy == 0) ? 0.0L : r.xy / sqrtl(r.xx * r.yy);
  expect_close(st_tensor_cosine(&c), cos, 1e-12, "cosine");
  expect_close(st_tensor_rel_max_abs(&c), r.max_mag > 0 ? r.max_abs / r.max_mag : 0.0L, 1e-15, "rel");
  if (c.max_abs_index >= 0) {
    assert_true(bits_of(c.max_abs_x) == bits_of(x[c.max_abs_index]));
    assert_true(bits_of(c.max_abs_y) == bits_of(y[c.max_abs_index]));
  }
}

static void test_tensor_random_against_bruteforce(void **state) {
  (void)state;
  enum { N = 4099 };
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
  for (int trial = 0; trial < 60; trial++) {
    int64_t n = 1 + below(N);
    double special = trial % 3 == 0 ? 0 : 0.01 * (trial % 5);
    random_tensor(x, n, special);
    /* y: x plus noise of a random scale, sometimes unrelated, sometimes its own specials */
    double scale = pow(10.0, -(double)below(8));
    for (int64_t i = 0; i < n; i++) y[i] = x[i] + (float)((uniform() - 0.5) * scale);
    if (trial % 4 == 1) random_tensor(y, n, special);
    if (trial % 4 == 2)
      for (int64_t i = 0; i < n; i++)
        if (uniform() < 0.01) y[i] = x[i]; /* keep specials in the same place sometimes */
    check_against_ref(x, y, n);
  }
  free(x);
  free(y);
}

static void test_tensor_blocks_equal_one_call(void **state) {
  (void)state;
  enum { N = 3001 };
  float x[N], y[N];
  random_tensor(x, N, 0.01);
  random_tensor(y, N, 0.01);
  for (int i = 0; i < N; i += 7) y[i] = x[i];
  st_tensor_compare one, blocks;
  st_tensor_compare_f32(x, y, N, &one);
  st_tensor_compare_init(&blocks);
  for (int64_t i = 0; i < N;) {
    int64_t k = 1 + below(300);
    if (k > N - i) k = N - i;
    st_tensor_compare_add(&blocks, x + i, y + i, k);
    i += k;
  }
  assert_memory_equal(&one, &blocks, sizeof one);
}

static void test_tensor_edge_cases(void **state) {
  (void)state;
  enum { N = 513 };
  float x[N], y[N], z[N];
  random_tensor(x, N, 0);
  /* identical: difference 0 and cosine 1 exactly */
  st_tensor_compare c;
  st_tensor_compare_f32(x, x, N, &c);
  assert_true(st_tensor_difference(&c) == 0.0);
  assert_true(st_tensor_cosine(&c) == 1.0);
  assert_true(c.max_abs == 0 && c.max_abs_index == -1 && c.bit_mismatch == 0);
  /* x against -x: difference 2, cosine -1 exactly */
  for (int i = 0; i < N; i++) y[i] = -x[i];
  st_tensor_compare_f32(x, y, N, &c);
  assert_true(st_tensor_difference(&c) == 2.0);
  assert_true(st_tensor_cosine(&c) == -1.0);
  /* scaled copy: difference 1 - 2s/(1+s^2), cosine 1 */
  for (int i = 0; i < N; i++) y[i] = 2 * x[i];
  st_tensor_compare_f32(x, y, N, &c);
  expect_close(st_tensor_difference(&c), 1.0L - 4.0L / 5.0L, 1e-15, "scaled");
  expect_close(st_tensor_cosine(&c), 1.0L, 1e-15, "scaled cos");
  /* both all zero: difference 0, cosine 1; one zero: difference 1, cosine 0 */
  memset(z, 0, sizeof z);
  st_tensor_compare_f32(z, z, N, &c);
  assert_true(st_tensor_difference(&c) == 0.0 && st_tensor_cosine(&c) == 1.0);
  assert_true(st_tensor_rel_max_abs(&c) == 0.0);
  st_tensor_compare_f32(x, z, N, &c);
  assert_true(st_tensor_difference(&c) == 1.0 && st_tensor_cosine(&c) == 0.0);
  assert_true(st_tensor_rel_max_abs(&c) == 1.0);
  /* empty */
  st_tensor_compare_f32(x, x, 0, &c);
  assert_true(c.count == 0 && st_tensor_difference(&c) == 0.0 && st_tensor_cosine(&c) == 1.0);
  /* one ulp in a large tensor still shows (the 1 - 2 Sum(xy)/... form would cancel to 0) */
  for (int i = 0; i < N; i++) y[i] = x[i];
  y[7] = nextafterf(x[7], INFINITY);
  st_tensor_compare_f32(x, y, N, &c);
  long double d7 = (long double)y[7] - x[7], xx = 0, yy = 0;
  for (int i = 0; i < N; i++) xx += (long double)x[i] * x[i], yy += (long double)y[i] * y[i];
  assert_true(st_tensor_difference(&c) > 0);
  expect_close(st_tensor_difference(&c) * 1e20, d7 * d7 / (xx + yy) * 1e20L, 1e-12, "one ulp");
  /* +0 against -0: equal values, different bits */
  float pz = 0.0f, nz = -0.0f;
  st_tensor_compare_f32(&pz, &nz, 1, &c);
  assert_true(c.bit_mismatch == 1 && c.mask_mismatch == 0 && st_tensor_difference(&c) == 0.0);
}

static void test_tensor_nan_and_inf_masks(void **state) {
  (void)state;
  float x[8] = {1, NAN, 3, -INFINITY, INFINITY, NAN, 7, -INFINITY};
  float y[8] = {1, NAN, 3, -INFINITY, INFINITY, -INFINITY, NAN, 8};
  st_tensor_compare c;
  st_tensor_compare_f32(x, y, 8, &c);
  /* positions 1 (NaN/NaN), 3 (-inf/-inf), 4 (+inf/+inf) are equal and left out of the sums */
  assert_int_equal(c.mask_mismatch, 3);     /* 5: NaN vs -inf, 6: 7 vs NaN, 7: -inf vs 8 */
  assert_int_equal(c.nan_mismatch, 2);      /* 5, 6 */
  assert_int_equal(c.neginf_mismatch, 2);   /* 5, 7 */
  assert_int_equal(c.posinf_mismatch, 0);
  assert_int_equal(c.first_mask_mismatch, 5);
  assert_int_equal(c.finite_count, 2);      /* positions 0 and 2 */
  assert_true(st_tensor_difference(&c) == 0.0); /* the finite part {1, 3} is identical */
  float x2[4] = {1, NAN, 2, -INFINITY}, y2[4] = {1, NAN, 2, -INFINITY};
  st_tensor_compare_f32(x2, y2, 4, &c);
  assert_int_equal(c.mask_mismatch, 0);
  assert_true(st_tensor_difference(&c) == 0.0 && st_tensor_cosine(&c) == 1.0);
  /* a different NaN payload is the same class (mask equal) but different bits */
  uint32_t qnan2 = 0x7fc00001u;
  float other_nan;
  memcpy(&other_nan, &qnan2, 4);
  y2[1] = other_nan;
  st_tensor_compare_f32(x2, y2, 4, &c);
  assert_int_equal(c.mask_mismatch, 0);
  assert_int_equal(c.bit_mismatch, 1);
  /* a scores-like row: same -inf mask, finite part differs */
  float s1[6] = {0.5f, -1, 2, -INFINITY, -INFINITY, -INFINITY};
  float s2[6] = {0.5f, -1, 2.5f, -INFINITY, -INFINITY, -INFINITY};
  st_tensor_compare_f32(s1, s2, 6, &c);
  assert_int_equal(c.mask_mismatch, 0);
  assert_int_equal(c.finite_count, 3);
  assert_int_equal(c.max_abs_index, 2);
  expect_close(st_tensor_difference(&c), 0.25L / (5.25L + 7.5L), 1e-15, "scores diff");
}

static void test_unravel_index(void **state) {
  (void)state;
  int64_t shape[4] = {3, 1, 4, 5}, coords[4], flat = 0;
  for (int64_t a = 0; a < 3; a++)
    for (int64_t b = 0; b < 1; b++)
      for (int64_t c = 0; c < 4; c++)
        for (int64_t d = 0; d < 5; d++, flat++) {
          assert_int_equal(st_unravel_index(flat, shape, 4, coords), 0);
          assert_true(coords[0] == a && coords[1] == b && coords[2] == c && coords[3] == d);
        }
  assert_int_equal(st_unravel_index(60, shape, 4, coords), -1);
  assert_int_equal(st_unravel_index(-1, shape, 4, coords), -1);
  assert_int_equal(st_unravel_index(0, shape, 0, coords), 0); /* a scalar has one element */
}

/* ------------------------------------------------------------------ index sets */

enum { SET_RANGE = 96 };

/* Membership bitmap of a row (negative = none). Returns the number of distinct members. */
static int member_map(const int32_t *v, int n, unsigned char *in) {
  memset(in, 0, SET_RANGE);
  int count = 0;
  for (int i = 0; i < n; i++)
    if (v[i] >= 0 && !in[v[i]]) in[v[i]] = 1, count++;
  return count;
}

static void random_set_row(int32_t *v, int n, int range) {
  for (int i = 0; i < n; i++) v[i] = uniform() < 0.15 ? -1 : (int32_t)below(range);
}

static void test_sets_random_against_bruteforce(void **state) {
  (void)state;
  enum { MAXW = 40, ROWS = 50 };
  int32_t a[ROWS * MAXW], b[ROWS * MAXW], scratch[2 * MAXW];
  for (int trial = 0; trial < 200; trial++) {
    int wa = (int)below(MAXW + 1), wb = (int)below(MAXW + 1), rows = 1 + (int)below(ROWS);
    int range = 1 + (int)below(SET_RANGE);
    for (int r = 0; r < rows; r++) {
      random_set_row(a + r * wa, wa, range);
      random_set_row(b + r * wb, wb, range);
      if (uniform() < 0.3 && wa == wb) /* same set, shuffled order */
        for (int i = 0; i < wa; i++) b[r * wb + i] = a[r * wa + (i * 7 + 3) % wa];
    }
    st_index_set_compare c;
    st_index_set_compare_init(&c);
    st_index_set_compare_add(&c, a, wa, b, wb, rows, scratch);
    double sum_j = 0, sum_o = 0, min_j = 1, min_o = 1;
    int64_t identical = 0, first_diff = -1, min_row = -1, min_orow = -1;
    for (int r = 0; r < rows; r++) {
      unsigned char ia[SET_RANGE], ib[SET_RANGE];
      int na = member_map(a + r * wa, wa, ia), nb = member_map(b + r * wb, wb, ib), common = 0, uni = 0;
      for (int v = 0; v < SET_RANGE; v++) common += ia[v] && ib[v], uni += ia[v] || ib[v];
      double j = uni ? (double)common / uni : 1.0;
      int mx = na > nb ? na : nb;
      double o = mx ? (double)common / mx : 1.0;
      st_set_counts k = st_index_set_counts(a + r * wa, wa, b + r * wb, wb, scratch);
      assert_int_equal(k.n_a, na);
      assert_int_equal(k.n_b, nb);
      assert_int_equal(k.n_common, common);
      assert_true(st_set_jaccard(k) == j);
      assert_true(st_set_overlap(k) == o);
      sum_j += j, sum_o += o;
      if (min_row < 0 || j < min_j) min_j = j, min_row = r;
      if (min_orow < 0 || o < min_o) min_o = o, min_orow = r;
      if (common == uni) identical++;
      else if (first_diff < 0) first_diff = r;
    }
    assert_int_equal(c.rows, rows);
    assert_int_equal(c.identical_rows, identical);
    assert_int_equal(c.first_diff_row, first_diff);
    assert_int_equal(c.min_jaccard_row, min_row);
    assert_int_equal(c.min_overlap_row, min_orow);
    assert_true(c.min_jaccard == min_j && c.min_overlap == min_o);
    expect_close(st_index_set_mean_jaccard(&c), sum_j / rows, 1e-15, "mean jaccard");
    expect_close(st_index_set_mean_overlap(&c), sum_o / rows, 1e-15, "mean overlap");
  }
}

static void test_sets_edge_cases(void **state) {
  (void)state;
  int32_t scratch[16];
  int32_t none[4] = {-1, -1, -1, -1}, some[4] = {3, 1, -1, 3}, other[2] = {1, 7};
  st_set_counts k = st_index_set_counts(none, 4, none, 4, scratch);
  assert_true(st_set_jaccard(k) == 1.0 && st_set_overlap(k) == 1.0); /* two empty sets agree */
  k = st_index_set_counts(none, 0, none, 0, scratch);
  assert_true(st_set_jaccard(k) == 1.0 && k.n_a == 0 && k.n_b == 0);
  k = st_index_set_counts(none, 4, some, 4, scratch);
  assert_true(st_set_jaccard(k) == 0.0 && st_set_overlap(k) == 0.0);
  k = st_index_set_counts(some, 4, other, 2, scratch); /* {1,3} vs {1,7} */
  assert_true(k.n_a == 2 && k.n_b == 2 && k.n_common == 1);
  assert_true(st_set_jaccard(k) == 1.0 / 3.0 && st_set_overlap(k) == 0.5);
  /* top-k 2 inside top-k 4: Jaccard 1/2, overlap 1/2 (max convention) */
  int32_t k4[4] = {0, 5, 9, 12}, k2[2] = {5, 12};
  k = st_index_set_counts(k4, 4, k2, 2, scratch);
  assert_true(st_set_jaccard(k) == 0.5 && st_set_overlap(k) == 0.5);
  /* the inputs are not modified */
  assert_true(some[0] == 3 && some[1] == 1 && some[3] == 3);
  /* no rows at all */
  st_index_set_compare c;
  st_index_set_compare_init(&c);
  st_index_set_compare_add(&c, k4, 4, k4, 4, 0, scratch);
  assert_true(st_index_set_mean_jaccard(&c) == 1.0 && c.min_jaccard == 1.0 && c.min_jaccard_row == -1);
}

/* ------------------------------------------------------------------ top-k ties */

/* 1 when c[0..k) (distinct rows) is a valid top-k of scores[0..n): every member scores at least
** as high as every non-member. The reference for st_topk_differs_by_ties: two sets differ only
** by boundary ties exactly when both are valid top-k selections of the same scores. */
static int valid_topk(const float *scores, int n, const int32_t *c, int k) {
  unsigned char in[64] = {0};
  for (int i = 0; i < k; i++) in[c[i]] = 1;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++)
      if (in[i] && !in[j] && scores[i] < scores[j]) return 0;
  return 1;
}

/* The k highest of scores[0..n), ties broken by lowest index (low_first) or highest index. */
static void topk_by(const float *scores, int n, int k, int low_first, int32_t *out) {
  unsigned char used[64] = {0};
  for (int m = 0; m < k; m++) {
    int best = -1;
    for (int i = 0; i < n; i++) {
      if (used[i]) continue;
      if (best < 0 || scores[i] > scores[best] || (scores[i] == scores[best] && !low_first)) best = i;
    }
    used[best] = 1;
    out[m] = best;
  }
}

static void test_topk_ties_against_bruteforce(void **state) {
  (void)state;
  enum { MAXR = 40 };
  float scores[MAXR];
  int32_t a[MAXR], b[MAXR], c[MAXR], scratch[2 * MAXR];
  int ties_seen = 0, valid_others = 0, invalid_others = 0;
  for (int trial = 0; trial < 3000; trial++) {
    int n = 1 + (int)below(MAXR), k = 1 + (int)below(n), levels = 1 + (int)below(6);
    for (int i = 0; i < n; i++) scores[i] = (float)below(levels) * 0.25f - 0.5f; /* many ties */
    topk_by(scores, n, k, 1, a);
    topk_by(scores, n, k, 0, b);
    int differ = 0;
    st_set_counts ab = st_index_set_counts(a, k, b, k, scratch);
    differ = ab.n_common != k;
    float boundary = 12345;
    /* lowest-index against highest-index tie breaking: both valid, so a tie whenever they differ */
    assert_int_equal(st_topk_differs_by_ties(scores, n, a, k, b, k, scratch, &boundary), differ);
    assert_int_equal(st_topk_differs_by_ties(scores, n, b, k, a, k, scratch, &boundary), differ);
    if (differ) {
      float kth = INFINITY;
      for (int i = 0; i < k; i++) kth = fminf(kth, scores[a[i]]);
      assert_true(boundary == kth);
      ties_seen++;
    }
    /* any k distinct rows: a tie exactly when it is another valid top-k that differs from a */
    for (int i = 0; i < n; i++) c[i] = i;
    for (int i = n - 1; i > 0; i--) {
      int j = (int)below(i + 1);
      int32_t t = c[i];
      c[i] = c[j], c[j] = t;
    }
    st_set_counts ac = st_index_set_counts(a, k, c, k, scratch);
    int want = valid_topk(scores, n, c, k) && ac.n_common != k;
    valid_others += want;
    invalid_others += !valid_topk(scores, n, c, k);
    assert_int_equal(st_topk_differs_by_ties(scores, n, a, k, c, k, scratch, &boundary), want);
  }
  assert_true(ties_seen > 100 && valid_others > 50 && invalid_others > 100); /* both sides exercised */
}

static void test_topk_ties_edge_cases(void **state) {
  (void)state;
  int32_t scratch[16];
  float b = 0;
  float s[6] = {3, 1, 2, 2, -INFINITY, NAN};
  int32_t k2[2] = {0, 2}, k2b[2] = {3, 0}, k2c[2] = {0, 1}, k3[3] = {0, 2, 3};
  assert_int_equal(st_topk_differs_by_ties(s, 6, k2, 2, k2b, 2, scratch, &b), 1); /* 2 vs 3 at 2 */
  assert_true(b == 2);
  assert_int_equal(st_topk_differs_by_ties(s, 6, k2, 2, k2, 2, scratch, &b), 0);  /* equal sets */
  assert_int_equal(st_topk_differs_by_ties(s, 6, k2, 2, k2c, 2, scratch, &b), 0); /* 1 < 2: not a tie */
  assert_int_equal(st_topk_differs_by_ties(s, 6, k2, 2, k3, 3, scratch, &b), 0);  /* sizes differ */
  int32_t pad_a[3] = {0, 2, -1}, pad_b[2] = {3, 0}; /* -1 padding is no member */
  assert_int_equal(st_topk_differs_by_ties(s, 6, pad_a, 3, pad_b, 2, scratch, &b), 1);
  int32_t out[2] = {0, 9}; /* a row the scores row does not cover */
  assert_int_equal(st_topk_differs_by_ties(s, 6, k2, 2, out, 2, scratch, &b), 0);
  int32_t inf_a[2] = {0, 4}, inf_b[2] = {0, 1}; /* boundary -inf: rows not visible, never a tie */
  float t[5] = {3, -INFINITY, 0, 0, -INFINITY};
  assert_int_equal(st_topk_differs_by_ties(t, 5, inf_a, 2, inf_b, 2, scratch, &b), 0);
  int32_t nan_a[2] = {0, 5}, nan_b[2] = {0, 2}; /* NaN never ties */
  assert_int_equal(st_topk_differs_by_ties(s, 6, nan_a, 2, nan_b, 2, scratch, &b), 0);
  int32_t e[1] = {-1};
  assert_int_equal(st_topk_differs_by_ties(s, 6, e, 1, e, 1, scratch, &b), 0); /* both empty */
}

/* ------------------------------------------------------------------ needle ranks */

static void test_needle_rank_against_bruteforce(void **state) {
  (void)state;
  enum { N = 200 };
  float s[N];
  int32_t needles[12], topk[40];
  for (int trial = 0; trial < 500; trial++) {
    int n = (int)below(N + 1), nn = (int)below(12);
    int levels = 1 + (int)below(20); /* few levels: many ties */
    for (int i = 0; i < n; i++) {
      double u = uniform();
      s[i] = u < 0.2 ? -INFINITY : u < 0.23 ? NAN : (float)below(levels) * 0.25f - 2.0f;
    }
    for (int i = 0; i < nn; i++) needles[i] = (int32_t)below(N + 10) - 5; /* some out of range */
    /* brute force: every visible needle row's rank by counting strictly greater visible scores */
    int64_t best = -1, n_visible = 0;
    int32_t best_row = -1;
    for (int i = 0; i < n; i++) n_visible += !isnan(s[i]) && s[i] != -INFINITY;
    for (int q = 0; q < nn; q++) {
      int j = needles[q];
      if (j < 0 || j >= n || isnan(s[j]) || s[j] == -INFINITY) continue;
      int64_t rank = 0;
      for (int i = 0; i < n; i++)
        if (!isnan(s[i]) && s[i] != -INFINITY && s[i] > s[j]) rank++;
      if (best < 0 || rank < best || (rank == best && j < best_row)) best = rank, best_row = j;
    }
    st_needle_rank r = st_needle_best_rank(s, n, needles, nn);
    assert_int_equal(r.rank, best);
    assert_int_equal(r.row, best_row);
    assert_int_equal(r.n_visible, n_visible);
    if (best_row >= 0) assert_true(r.score == s[best_row]);
    /* in top-k: membership by brute force */
    int k = (int)below(40);
    for (int i = 0; i < k; i++) topk[i] = (int32_t)below(N + 1) - 1;
    int want = 0;
    for (int i = 0; i < k; i++)
      for (int q = 0; q < nn; q++) want |= topk[i] >= 0 && topk[i] == needles[q];
    assert_int_equal(st_needle_in_topk(topk, k, needles, nn), want);
  }
}

static void test_needle_rank_edge_cases(void **state) {
  (void)state;
  float s[6] = {1, 3, 3, -INFINITY, 2, 3};
  int32_t n1[1] = {2}, n2[2] = {4, 0}, n3[1] = {3}, n4[2] = {5, 2};
  st_needle_rank r = st_needle_best_rank(s, 6, n1, 1);
  assert_true(r.rank == 0 && r.row == 2); /* ties: rank of the first among equals = 0 */
  r = st_needle_best_rank(s, 6, n2, 2);
  assert_true(r.rank == 3 && r.row == 4);
  r = st_needle_best_rank(s, 6, n3, 1);
  assert_true(r.rank == -1 && r.row == -1 && r.n_visible == 5); /* not yet visible */
  r = st_needle_best_rank(s, 6, n4, 2);
  assert_true(r.rank == 0 && r.row == 2); /* equal scores: the lower row is reported */
  r = st_needle_best_rank(s, 6, n1, 0);
  assert_true(r.rank == -1);
  int32_t topk[3] = {1, -1, 5};
  assert_int_equal(st_needle_in_topk(topk, 3, n4, 2), 1);
  assert_int_equal(st_needle_in_topk(topk, 3, n2, 2), 0);
  int32_t minus[1] = {-1};
  assert_int_equal(st_needle_in_topk(topk, 3, minus, 1), 0); /* -1 = none never matches */
}

/* ------------------------------------------------------------------ logits */

static long double ref_kl(const float *a, const float *b, int n) {
  long double za = 0, zb = 0, kl = 0;
  for (int i = 0; i < n; i++) za += expl((long double)a[i]), zb += expl((long double)b[i]);
  for (int i = 0; i < n; i++) {
    long double p = expl((long double)a[i]) / za, q = expl((long double)b[i]) / zb;
    if (p > 0) kl += p * logl(p / q);
  }
  return kl;
}

static int64_t ref_argmax(const float *x, int n) {
  for (int i = 0; i < n; i++) {
    if (isnan(x[i])) continue;
    int best = 1;
    for (int j = 0; j < n; j++)
      if (!isnan(x[j]) && (x[j] > x[i] || (x[j] == x[i] && j < i))) best = 0;
    if (best) return i;
  }
  return -1;
}

static void test_logits_against_bruteforce(void **state) {
  (void)state;
  enum { V = 300 };
  float a[V], b[V];
  for (int trial = 0; trial < 100; trial++) {
    int n = 1 + (int)below(V);
    double spread = 1 + below(12);
    for (int i = 0; i < n; i++) {
      a[i] = (float)((uniform() - 0.5) * spread);
      b[i] = trial % 3 == 0 ? a[i] + (float)((uniform() - 0.5) * 1e-3) : (float)((uniform() - 0.5) * spread);
      if (trial % 5 == 0 && uniform() < 0.1) a[i] = b[i] = (float)below(3); /* ties */
    }
    expect_close(st_logits_kl(a, b, n), ref_kl(a, b, n), 1e-11, "kl");
    assert_int_equal(st_logits_argmax(a, n), ref_argmax(a, n));
    assert_int_equal(st_logits_greedy_agree(a, b, n), ref_argmax(a, n) == ref_argmax(b, n));
  }
  /* large logits stay finite (a naive softmax would overflow) */
  for (int i = 0; i < 10; i++) a[i] = 1000.0f + (float)i, b[i] = 1000.0f + (float)(9 - i);
  float a0[10], b0[10];
  for (int i = 0; i < 10; i++) a0[i] = (float)i, b0[i] = (float)(9 - i);
  expect_close(st_logits_kl(a, b, 10), ref_kl(a0, b0, 10), 1e-12, "shifted kl");
}

static void test_logits_edge_cases(void **state) {
  (void)state;
  float a[5] = {1, 2, 3, 3, -1}, b[5] = {1, 2, 3, 3, -1};
  assert_true(st_logits_kl(a, b, 5) == 0.0);
  assert_int_equal(st_logits_argmax(a, 5), 2); /* tie between 2 and 3: lower index */
  assert_int_equal(st_logits_greedy_agree(a, b, 5), 1);
  /* -inf where both are -inf: the term is 0 */
  float c[3] = {0, -INFINITY, 1}, d[3] = {0.5f, -INFINITY, 1};
  float c2[2] = {0, 1}, d2[2] = {0.5f, 1};
  expect_close(st_logits_kl(c, d, 3), ref_kl(c2, d2, 2), 1e-13, "masked kl");
  /* Q = 0 where P > 0: +inf; P = 0 where Q > 0: finite */
  float e[3] = {0, 0, 0}, f[3] = {0, -INFINITY, 0};
  assert_true(isinf(st_logits_kl(e, f, 3)) && st_logits_kl(e, f, 3) > 0);
  assert_true(isfinite(st_logits_kl(f, e, 3)));
  /* NaN anywhere, or all -inf: NaN */
  float g[3] = {0, NAN, 1}, h[2] = {-INFINITY, -INFINITY};
  assert_true(isnan(st_logits_kl(g, e, 3)) && isnan(st_logits_kl(e, g, 3)));
  assert_true(isnan(st_logits_kl(h, h, 2)));
  assert_int_equal(st_logits_argmax(g, 3), 2); /* NaN never wins */
  float nans[2] = {NAN, NAN};
  assert_int_equal(st_logits_argmax(nans, 2), -1);
  assert_int_equal(st_logits_argmax(a, 0), -1);
  assert_int_equal(st_logits_greedy_agree(nans, nans, 2), 0);
  float i1[3] = {5, 1, 5}, i2[3] = {4, 1, 5};
  assert_int_equal(st_logits_greedy_agree(i1, i2, 3), 0); /* 0 vs 2 */
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_tensor_random_against_bruteforce),
    cmocka_unit_test(test_tensor_blocks_equal_one_call),
    cmocka_unit_test(test_tensor_edge_cases),
    cmocka_unit_test(test_tensor_nan_and_inf_masks),
    cmocka_unit_test(test_unravel_index),
    cmocka_unit_test(test_sets_random_against_bruteforce),
    cmocka_unit_test(test_sets_edge_cases),
    cmocka_unit_test(test_topk_ties_against_bruteforce),
    cmocka_unit_test(test_topk_ties_edge_cases),
    cmocka_unit_test(test_needle_rank_against_bruteforce),
    cmocka_unit_test(test_needle_rank_edge_cases),
    cmocka_unit_test(test_logits_against_bruteforce),
    cmocka_unit_test(test_logits_edge_cases),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
