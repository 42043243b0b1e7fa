/*
** moe.h — MoE routing of one token (SPEC-dsv4 §2.5), written once for every backend: cpu-ref and
** cpu run it per token on the host, cuda/hip one thread per token (ST_HD). Header only; scalar,
** in a fixed order.
*/
#ifndef ST_KERNELS_MOE_H
#define ST_KERNELS_MOE_H

#include <math.h>
#include <stdint.h>

#ifndef ST_HD
#if defined(__CUDACC__) || defined(__HIPCC__)
#define ST_HD __host__ __device__
#else
#define ST_HD
#endif
#endif

/* In place on score [E] (the token's router logits, which become sqrt(softplus)): chosen [kE] =
** hash [kE] when given (hash layers), else the kE best of score + bias (ties to the lower id);
** weights [kE] = score / sum * route_scale. */
static inline ST_HD void st_moe_route_token(float *score, const float *bias, const int32_t *hash,
                                            int E, int kE, float route_scale, int32_t *chosen,
                                            float *weights) {
  for (int e = 0; e < E; e++) {
    float l = score[e];
    score[e] = sqrtf(l > 20.0f ? l : log1pf(expf(l)));
  }
  if (hash) {
    for (int c = 0; c < kE; c++) chosen[c] = hash[c];
  } else {
    for (int c = 0; c < kE; c++) { /* selection by (score + bias) desc, then id asc */
      int best = -1;
      for (int e = 0; e < E; e++) {
        int taken = 0;
        for (int q = 0; q < c; q++) taken |= chosen[q] == e;
        if (taken) continue;
        if (best < 0 || score[e] + bias[e] > score[best] + bias[best]) best = e;
      }
      chosen[c] = best;
    }
  }
  float sum = 0;
  for (int c = 0; c < kE; c++) sum += score[chosen[c]];
  for (int c = 0; c < kE; c++) weights[c] = score[chosen[c]] / (sum + 1e-20f) * route_scale;
}

#endif
