/*
** cpu_portable.c — the cpu backend's kernels in plain C: the definition of its arithmetic
** (cpu_internal.h) written out with fmaf, for machines without AVX2 and as the check of the
** vector paths (ST_CPU_ISA=portable).
*/
#include <math.h>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/weight.h"

#define NR 16

static void pack(float *panel, const st_weight *w, int64_t r0, int cols, int64_t k0, int kc) {
  float row[CPU_KC];
  for (int j = 0; j < cols; j++) {
    st_weight_decode(w, r0 + j, k0, kc, row);
    for (int kk = 0; kk < kc; kk++) panel[(size_t)kk * NR + j] = row[kk];
  }
  for (int j = cols; j < NR; j++)
    for (int kk = 0; kk < kc; kk++) panel[(size_t)kk * NR + j] = 0.0f;
}

static void gemm(float *c, int64_t ldc, const float *a, int64_t lda, int m, const float *panel,
                 int cols, int kc, int accumulate) {
  for (int i = 0; i < m; i++) {
    float acc[NR];
    for (int j = 0; j < NR; j++) acc[j] = accumulate && j < cols ? c[i * ldc + j] : 0.0f;
    const float *ai = a + i * lda;
    for (int kk = 0; kk < kc; kk++)
      for (int j = 0; j < NR; j++) acc[j] = fmaf(ai[kk], panel[(size_t)kk * NR + j], acc[j]);
    for (int j = 0; j < cols; j++) c[i * ldc + j] = acc[j];
  }
}

static void qk(float *out, const float *qT, int hp, const float *const *rows, int nrows, int dim,
               const float *w, float scale) {
  float acc[CPU_HCHUNK];
  for (int r = 0; r < nrows; r++) {
    for (int h = 0; h < hp; h++) acc[h] = 0.0f;
    const float *kr = rows[r];
    for (int k = 0; k < dim; k++)
      for (int h = 0; h < hp; h++) acc[h] = fmaf(kr[k], qT[(size_t)k * hp + h], acc[h]);
    if (!w) {
      for (int h = 0; h < hp; h++) out[(size_t)r * hp + h] = acc[h] * scale;
    } else {
      float *lane = out + (size_t)r * 16;
      for (int h = 0; h < hp; h++) {
        float v = acc[h] > 0 ? acc[h] : 0.0f;
        lane[h & 15] = fmaf(w[h], v, lane[h & 15]);
      }
    }
  }
}

static void av(float *out, int64_t ldo, const float *p, int ldp, int heads, const float *const *rows,
               int ncand, int d) {
  for (int h = 0; h < heads; h++) {
    float *o = out + h * ldo;
    for (int k = 0; k < d; k++) o[k] = 0.0f;
    for (int c = 0; c < ncand; c++) {
      float pc = p[(size_t)c * ldp + h];
      const float *v = rows[c];
      for (int k = 0; k < d; k++) o[k] = fmaf(pc, v[k], o[k]);
    }
  }
}

static float dot(const float *a, const float *b, int n) {
  float lane[16] = {0};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) lane[l] = fmaf(a[i + l], b[i + l], lane[l]);
  float s = st_cpu_tree16(lane);
  for (; i < n; i++) s = fmaf(a[i], b[i], s);
  return s;
}

const cpu_isa st_cpu_isa_portable = {"portable", NR, pack, gemm, qk, av, dot};
