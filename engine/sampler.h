/*
** sampler.h — the next token from a logit vector: greedy at temperature 0, otherwise a seeded
** draw from softmax(logits / temperature), restricted to the nucleus (top_p) when top_p < 1.
**
** Deterministic by construction: the draw depends only on (seed, the logits, temperature,
** top_p) and on how many draws the sampler made before, never on the thread count or the
** clock; the same seed and the same logits give the same tokens. The arithmetic is double
** precision and ordered by token id (nucleus: by probability, ties to the lower id), so the
** result is the same on every backend that produced the same logits.
**
** The random stream is splitmix64 over a 64-bit counter: draw k of seed s is
** mix64(s + (k+1)·0x9E3779B97F4A7C15), its top 53 bits a uniform in [0, 1).
*/
#ifndef ST_SAMPLER_H
#define ST_SAMPLER_H

#include <stdint.h>

#include "common/base.h"

typedef struct st_sampler {
  double temperature; /* 0: greedy (argmax, ties to the lower id) */
  double top_p;       /* (0, 1]; 1 keeps every token */
  uint64_t seed;
  uint64_t draws;     /* draws made so far */
  int n_vocab;
  double *weight;     /* [n_vocab] scratch: exp((logit - max) / temperature) */
  int32_t *order;     /* [2 n_vocab] scratch: ids by weight for the nucleus, and the sort's */
} st_sampler;

/* Checks the parameters (temperature in [0, 100], top_p in (0, 1]; ST_EINVAL naming the one
** out of range) and sizes the scratch for n_vocab ids. Free with st_sampler_free. */
st_status st_sampler_init(st_sampler *s, int n_vocab, double temperature, double top_p,
                          uint64_t seed);
void st_sampler_free(st_sampler *s);

/* The next token for logits[0..n_vocab). Non-finite logits never win (NaN and -inf weigh 0); a
** vector with no finite logit gives the lowest id. */
int32_t st_sampler_next(st_sampler *s, const float *logits);

/* Uniform in [0, 1) for draw `index` of `seed` (the stream st_sampler_next consumes). */
double st_sampler_uniform(uint64_t seed, uint64_t index);

/* The greedy choice: the largest logit, ties to the lower id (what `run` generates). */
int32_t st_argmax(const float *logits, int n_vocab);

#endif
