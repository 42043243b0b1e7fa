/*
** sampler.c — greedy and seeded temperature / top_p sampling (see sampler.h for the contract).
**
** The weights are computed once per step in double: w_i = exp((l_i - max) / T), so the largest
** is 1 and nothing overflows. Without a nucleus the draw walks the ids in order until the running
** sum passes u·Σw. With top_p < 1 the ids are sorted by weight (ties to the lower id), the
** nucleus is the shortest prefix whose mass reaches top_p·Σw (as the OpenAI and vLLM samplers
** define it: the token that crosses the threshold is kept), and the draw walks that prefix.
*/
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double st_sampler_uniform(uint64_t seed, uint64_t index) {
  uint64_t x = mix64(seed + (index + 1) * 0x9E3779B97F4A7C15ull);
  return (double)(x >> 11) * 0x1.0p-53;
}

int32_t st_argmax(const float *logits, int n_vocab) {
  int32_t best = 0;
  for (int i = 1; i < n_vocab; i++)
    if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i]))) best = i;
  return best;
}

st_status st_sampler_init(st_sampler *s, int n_vocab, double temperature, double top_p,
                          uint64_t seed) {
  *s = (st_sampler){.temperature = temperature, .top_p = top_p, .seed = seed, .n_vocab = n_vocab};
  if (!(temperature >= 0 && temperature <= 100))
    return st_fail(ST_EINVAL, "temperature %g: expected a number from 0 to 100", temperature);
  if (!(top_p > 0 && top_p <= 1))
    return st_fail(ST_EINVAL, "top_p %g: expected a number in (0, 1]", top_p);
  if (n_vocab < 1) return st_fail(ST_EINVAL, "sampler: a vocabulary of %d ids", n_vocab);
  if (temperature == 0) return ST_OK;
  s->weight = malloc(sizeof(double) * (size_t)n_vocab);
  /* the ids by weight, and the merge sort's scratch */
  s->order = top_p < 1 ? malloc(sizeof(int32_t) * 2 * (size_t)n_vocab) : NULL;
  if (!s->weight || (top_p < 1 && !s->order)) {
    st_sampler_free(s);
    return st_fail(ST_ENOMEM, "sampler scratch for %d ids", n_vocab);
  }
  return ST_OK;
}

void st_sampler_free(st_sampler *s) {
  free(s->weight);
  free(s->order);
  s->weight = NULL;
  s->order = NULL;
}

/* Sorts ids [0, n) by weight descending, ties to the lower id (a stable merge sort with
** tmp[n] scratch). */
static void sort_ids(int32_t *ids, int32_t *tmp, int n, const double *w) {
  if (n < 2) return;
  int h = n / 2;
  sort_ids(ids, tmp, h, w);
  sort_ids(ids + h, tmp, n - h, w);
  int i = 0, j = h, k = 0;
  while (i < h && j < n) {
    int32_t a = ids[i], b = ids[j];
    int take_b = w[b] > w[a] || (w[b] == w[a] && b < a);
    tmp[k++] = take_b ? ids[j++] : ids[i++];
  }
  while (i < h) tmp[k++] = ids[i++];
  while (j < n) tmp[k++] = ids[j++];
  for (k = 0; k < n; k++) ids[k] = tmp[k];
}

int32_t st_sampler_next(st_sampler *s, const float *logits) {
  int n = s->n_vocab;
  if (s->temperature == 0) return st_argmax(logits, n);
  int32_t best = st_argmax(logits, n);
  double max = logits[best];
  if (!isfinite(max)) return best;
  double *w = s->weight, total = 0;
  for (int i = 0; i < n; i++) {
    w[i] = isfinite(logits[i]) ? exp(((double)logits[i] - max) / s->temperature) : 0.0;
    total += w[i];
  }
  double u = st_sampler_uniform(s->seed, s->draws++);
  if (s->top_p >= 1) {
    double target = u * total, run = 0;
    for (int i = 0; i < n; i++) {
      run += w[i];
      if (w[i] > 0 && run > target) return i;
    }
    return best; /* rounding left target at the very end */
  }
  int32_t *order = s->order;
  for (int i = 0; i < n; i++) order[i] = i;
  sort_ids(order, order + n, n, w);
  double need = s->top_p * total, kept = 0;
  int k = 0;
  while (k < n && kept < need) kept += w[order[k++]];
  double target = u * kept, run = 0;
  for (int i = 0; i < k; i++) {
    run += w[order[i]];
    if (run > target) return order[i];
  }
  return order[k > 0 ? k - 1 : 0];
}
