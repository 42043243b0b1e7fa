/*
** hc.h — the mHC mixing weights from one token's mixes (SPEC-dsv4 §2.2 step 3), shared by the
** CPU backends so the pre/post sigmoids, the comb softmax and the Sinkhorn normalisation are
** written once. Header only; scalar, in a fixed order (the backends differ only in how they
** compute the mixes, the dot products of the normalised streams with the mixer rows). ST_HD makes
** the same text a device function in kernels/cuda/ (one thread per token runs it there).
*/
#ifndef ST_KERNELS_HC_H
#define ST_KERNELS_HC_H

#include <math.h>

#ifndef ST_HD
#if defined(__CUDACC__) || defined(__HIPCC__)
#define ST_HD __host__ __device__
#else
#define ST_HD
#endif
#endif

static inline ST_HD float st_hc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* mix [(2 + hc) hc] (already scaled by the rsqrt norm) -> p [hc], o [hc], C [hc, hc]. */
static inline ST_HD void st_hc_weights_from_mix(const float *mix, const float *base, const float *scale,
                                          int hc, float hc_eps, int sinkhorn_iters, float *p,
                                          float *o, float *C) {
  for (int a = 0; a < hc; a++) {
    p[a] = st_hc_sigmoid(mix[a] * scale[0] + base[a]) + hc_eps;
    o[a] = 2.0f * st_hc_sigmoid(mix[hc + a] * scale[1] + base[hc + a]);
  }
  for (int a = 0; a < hc; a++) { /* softmax over b of each row a, plus eps */
    float *row = C + a * hc, mx = -INFINITY, sum = 0;
    for (int b = 0; b < hc; b++) {
      row[b] = mix[2 * hc + a * hc + b] * scale[2] + base[2 * hc + a * hc + b];
      mx = fmaxf(mx, row[b]);
    }
    for (int b = 0; b < hc; b++) sum += (row[b] = expf(row[b] - mx));
    for (int b = 0; b < hc; b++) row[b] = row[b] / sum + hc_eps;
  }
  for (int it = 0; it < sinkhorn_iters; it++) {
    if (it > 0) /* row normalise */
      for (int a = 0; a < hc; a++) {
        float s = 0;
        for (int b = 0; b < hc; b++) s += C[a * hc + b];
        for (int b = 0; b < hc; b++) C[a * hc + b] /= s + hc_eps;
      }
    for (int b = 0; b < hc; b++) { /* column normalise */
      float s = 0;
      for (int a = 0; a < hc; a++) s += C[a * hc + b];
      for (int a = 0; a < hc; a++) C[a * hc + b] /= s + hc_eps;
    }
  }
}

#endif
