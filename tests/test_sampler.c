/*
** test_sampler.c — engine/sampler.h against the mathematics: on a fixed logit vector, the
** counts of 200,000 seeded draws are compared with softmax(logits / T) computed here the naive
** way (long double), by Pearson's chi-square against the 0.1% critical value of its degrees of
** freedom (from the tables); the nucleus (top_p) against a brute-force nucleus (every id's mass
** compared with every other's); a wrong distribution must fail the same test (the test can
** fail). Determinism: the same seed gives the same tokens, another seed other tokens.
*/
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/sampler.h"

#define N_IDS 8
static const float logits8[N_IDS] = {2.0f, 0.5f, 1.0f, -1.0f, 3.0f, 0.0f, 1.5f, -0.5f};

/* chi-square, upper 0.1% points (standard tables), by degrees of freedom */
static double chi2_critical_001(int df) {
  static const double table[] = {0, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124};
  assert_true(df >= 1 && df <= 8);
  return table[df];
}

/* softmax(l / T) restricted to keep[] (1 = in), the naive way */
static void reference_probs(const float *l, int n, double t, const int *keep, double *p) {
  long double z = 0;
  for (int i = 0; i < n; i++) z += keep[i] ? expl((long double)l[i] / t) : 0;
  for (int i = 0; i < n; i++) p[i] = keep[i] ? (double)(expl((long double)l[i] / t) / z) : 0;
}

/* Pearson's statistic over the ids with p > 0; *df = their count - 1. Any draw of an id with
** p = 0 makes it infinite. */
static double chi_square(const long *count, const double *p, int n, long draws, int *df) {
  double x2 = 0;
  int cells = 0;
  for (int i = 0; i < n; i++) {
    if (p[i] == 0) {
      if (count[i]) return INFINITY;
      continue;
    }
    double e = p[i] * (double)draws;
    x2 += ((double)count[i] - e) * ((double)count[i] - e) / e;
    cells++;
  }
  *df = cells - 1;
  return x2;
}

static void draw_counts(double t, double top_p, uint64_t seed, long draws, long *count) {
  st_sampler s;
  assert_int_equal(st_sampler_init(&s, N_IDS, t, top_p, seed), ST_OK);
  memset(count, 0, sizeof(long) * N_IDS);
  for (long k = 0; k < draws; k++) {
    int32_t id = st_sampler_next(&s, logits8);
    assert_true(id >= 0 && id < N_IDS);
    count[id]++;
  }
  st_sampler_free(&s);
}

static void test_temperature_matches_softmax(void **state) {
  (void)state;
  const long draws = 200000;
  const double temps[] = {0.7, 1.0, 1.6};
  int all[N_IDS] = {1, 1, 1, 1, 1, 1, 1, 1};
  for (int ti = 0; ti < 3; ti++) {
    long count[N_IDS];
    double p[N_IDS];
    draw_counts(temps[ti], 1.0, 1234 + (uint64_t)ti, draws, count);
    reference_probs(logits8, N_IDS, temps[ti], all, p);
    int df;
    double x2 = chi_square(count, p, N_IDS, draws, &df);
    print_message("T=%.1f: chi-square %.2f (df %d, 0.1%% point %.3f)\n", temps[ti], x2, df, chi2_critical_001(df));
    assert_int_equal(df, N_IDS - 1);
    assert_true(x2 < chi2_critical_001(df));
    /* the same counts against the softmax at another temperature: the test must reject it */
    double wrong[N_IDS];
    reference_probs(logits8, N_IDS, temps[ti] * 1.15, all, wrong);
    assert_true(chi_square(count, wrong, N_IDS, draws, &df) > chi2_critical_001(df));
  }
}

/* The nucleus by brute force: id i is in when the mass of the ids strictly before it (heavier,
** or as heavy with a lower id) is below top_p. */
static void test_top_p_matches_bruteforce_nucleus(void **state) {
  (void)state;
  const long draws = 200000;
  const double t = 1.0, tops[] = {0.5, 0.8, 0.95};
  int all[N_IDS] = {1, 1, 1, 1, 1, 1, 1, 1};
  double full[N_IDS];
  reference_probs(logits8, N_IDS, t, all, full);
  for (int pi = 0; pi < 3; pi++) {
    int keep[N_IDS], n_keep = 0;
    for (int i = 0; i < N_IDS; i++) {
      double before = 0;
      for (int j = 0; j < N_IDS; j++)
        if (full[j] > full[i] || (full[j] == full[i] && j < i)) before += full[j];
      keep[i] = before < tops[pi];
      n_keep += keep[i];
    }
    long count[N_IDS];
    double p[N_IDS];
    draw_counts(t, tops[pi], 99 + (uint64_t)pi, draws, count);
    reference_probs(logits8, N_IDS, t, keep, p);
    int df;
    double x2 = chi_square(count, p, N_IDS, draws, &df);
    print_message("top_p=%.2f: %d ids kept, chi-square %.2f (df %d)\n", tops[pi], n_keep, x2, df);
    assert_true(n_keep < N_IDS);
    if (df == 0) { /* one id: every draw is it */
      for (int i = 0; i < N_IDS; i++) assert_int_equal(count[i], keep[i] ? draws : 0);
    } else {
      assert_true(x2 < chi2_critical_001(df)); /* INFINITY when an id outside the nucleus came */
    }
  }
}

static void test_same_seed_same_tokens(void **state) {
  (void)state;
  st_sampler a, b, c;
  assert_int_equal(st_sampler_init(&a, N_IDS, 1.0, 0.9, 42), ST_OK);
  assert_int_equal(st_sampler_init(&b, N_IDS, 1.0, 0.9, 42), ST_OK);
  assert_int_equal(st_sampler_init(&c, N_IDS, 1.0, 0.9, 43), ST_OK);
  int differ = 0;
  for (int k = 0; k < 2000; k++) {
    int32_t x = st_sampler_next(&a, logits8), y = st_sampler_next(&b, logits8), z = st_sampler_next(&c, logits8);
    assert_int_equal(x, y);
    differ += x != z;
  }
  assert_true(differ > 100); /* another seed is another stream */
  st_sampler_free(&a);
  st_sampler_free(&b);
  st_sampler_free(&c);
  /* the stream is a function of (seed, index) alone */
  assert_true(st_sampler_uniform(7, 3) == st_sampler_uniform(7, 3));
  assert_true(st_sampler_uniform(7, 3) != st_sampler_uniform(7, 4));
  for (int k = 0; k < 1000; k++) {
    double u = st_sampler_uniform(5, (uint64_t)k);
    assert_true(u >= 0 && u < 1);
  }
}

static void test_greedy_and_edges(void **state) {
  (void)state;
  st_sampler s;
  const float ties[4] = {1.0f, 3.0f, 3.0f, 2.0f};
  assert_int_equal(st_sampler_init(&s, 4, 0.0, 1.0, 1), ST_OK);
  assert_int_equal(st_sampler_next(&s, ties), 1); /* ties to the lower id */
  st_sampler_free(&s);
  /* NaN and -inf never drawn */
  const float odd[4] = {NAN, -INFINITY, 0.0f, 0.0f};
  assert_int_equal(st_sampler_init(&s, 4, 1.0, 1.0, 3), ST_OK);
  for (int k = 0; k < 1000; k++) {
    int32_t id = st_sampler_next(&s, odd);
    assert_true(id == 2 || id == 3);
  }
  st_sampler_free(&s);
  assert_int_equal(st_argmax(odd, 4), 2);
  /* out of range */
  assert_int_equal(st_sampler_init(&s, 4, -0.5, 1.0, 1), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "temperature"));
  assert_int_equal(st_sampler_init(&s, 4, NAN, 1.0, 1), ST_EINVAL);
  assert_int_equal(st_sampler_init(&s, 4, 1.0, 0.0, 1), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "top_p"));
  assert_int_equal(st_sampler_init(&s, 4, 1.0, 1.5, 1), ST_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_temperature_matches_softmax),
    cmocka_unit_test(test_top_p_matches_bruteforce_nucleus),
    cmocka_unit_test(test_same_seed_same_tokens),
    cmocka_unit_test(test_greedy_and_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
