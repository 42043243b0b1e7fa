/*
** cpu_avx2.c — the cpu backend's kernels for AVX2 with FMA and F16C; compiled with those flags
** (CMakeLists.txt), called only when the machine has them. Same arithmetic as cpu_portable.c,
** lane for lane (cpu_internal.h): the 16 lanes of a reduction are two registers here.
*/
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/weight.h"

#define NR 16
#define MR 6 /* rows of the GEMM register tile: 6 x 2 accumulators */
#define INLINE static inline __attribute__((always_inline))

static inline __m256i lanes_below(int n) { /* mask of the first n (0..8) lanes */
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* ---------------------------------------------------------------- weight decoding */

static void decode_row(const st_weight *w, int64_t r, int64_t k0, int count, float *out) {
  const unsigned char *p = w->data;
  int k = 0;
  switch (w->dtype) {
  case ST_W_F32: {
    const float *src = (const float *)p + r * w->cols + k0;
    for (; k + 8 <= count; k += 8) _mm256_storeu_ps(out + k, _mm256_loadu_ps(src + k));
    break;
  }
  case ST_W_BF16: {
    const uint16_t *src = (const uint16_t *)p + r * w->cols + k0;
    for (; k + 8 <= count; k += 8) {
      __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + k)));
      _mm256_storeu_ps(out + k, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    break;
  }
  case ST_W_F16: {
    const uint16_t *src = (const uint16_t *)p + r * w->cols + k0;
    for (; k + 8 <= count; k += 8)
      _mm256_storeu_ps(out + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + k))));
    break;
  }
  case ST_W_FP8_E4M3: {
    if (w->scale_dtype != ST_WSCALE_NONE && w->block[1] % 8) break;
    const uint8_t *src = p + r * w->cols + k0;
    const __m256 pow120 = _mm256_castsi256_ps(_mm256_set1_epi32((127 + 120) << 23));
    const __m256i m7f = _mm256_set1_epi32(0x7f);
    const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    for (; k + 8 <= count; k += 8) {
      __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src + k)));
      __m256i mag = _mm256_and_si256(b, m7f);
      __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), pow120);
      v = _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, m7f)));
      __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(b, 7), 31);
      v = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
      v = _mm256_mul_ps(v, _mm256_set1_ps(st_wscale_at(w, r, k0 + k)));
      _mm256_storeu_ps(out + k, v);
    }
    break;
  }
  case ST_W_FP4_E2M1: {
    if (w->scale_dtype != ST_WSCALE_NONE && w->block[1] % 8) break;
    const uint8_t *src = p + r * (w->cols / 2) + k0 / 2;
    float lut[8];
    for (int a = 0; a < 8; a++) lut[a] = st_fp4_e2m1_to_f32((uint8_t)a);
    const __m256 table = _mm256_loadu_ps(lut);
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i shifts = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    for (; k + 8 <= count; k += 8) {
      int32_t four;
      memcpy(&four, src + k / 2, 4);
      __m256i b = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128(four), dup));
      __m256i nib = _mm256_srlv_epi32(b, shifts);
      __m256 v = _mm256_permutevar8x32_ps(table, _mm256_and_si256(nib, _mm256_set1_epi32(7)));
      __m256i sign = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28);
      v = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
      v = _mm256_mul_ps(v, _mm256_set1_ps(st_wscale_at(w, r, k0 + k)));
      _mm256_storeu_ps(out + k, v);
    }
    break;
  }
  case ST_W_TYPE_COUNT: break;
  }
  if (k < count) st_weight_decode(w, r, k0 + k, count - k, out + k);
}

/* The scalar path: decode a row, scatter it into the panel (odd shapes, the k tail). */
static void pack_rows(float *panel, const st_weight *w, int64_t r0, int cols, int64_t k0, int kb, int kc) {
  float row[CPU_KC];
  for (int j = 0; j < cols; j++) {
    if (kb == 0) decode_row(w, r0 + j, k0, kc, row);
    else st_weight_decode(w, r0 + j, k0 + kb, kc - kb, row + kb);
    for (int kk = kb; kk < kc; kk++) panel[(size_t)kk * NR + j] = row[kk];
  }
  if (cols < NR)
    for (int kk = kb; kk < kc; kk++)
      for (int j = cols; j < NR; j++) panel[(size_t)kk * NR + j] = 0.0f;
}

/* v[t] (t < 8) := column t of the 8 x 8 matrix whose rows are v[0..8) */
INLINE void transpose8(__m256 v[8]) {
  __m256 t[8];
  #pragma GCC unroll 8
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  #pragma GCC unroll 8
  for (int i = 0; i < 8; i += 4) {
    v[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    v[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    v[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    v[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  #pragma GCC unroll 8
  for (int i = 0; i < 4; i++) {
    t[i] = _mm256_permute2f128_ps(v[i], v[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(v[i], v[i + 4], 0x31);
  }
  #pragma GCC unroll 8
  for (int i = 0; i < 8; i++) v[i] = t[i];
}

/* W[r, k .. k + 8) as decode_row gives it; s the row's scale at k (fp8, fp4). */
INLINE __m256 decode8(int dtype, const st_weight *w, int64_t r, int64_t k, float s) {
  const unsigned char *p = w->data;
  switch (dtype) {
  case ST_W_F32: return _mm256_loadu_ps((const float *)p + r * w->cols + k);
  case ST_W_BF16: {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + r * w->cols + k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  case ST_W_F16:
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + r * w->cols + k)));
  case ST_W_FP8_E4M3: {
    /* integer construction of the f32 bits (no subnormal f32 operand: see cpu_avx512.c) */
    const __m256 sub = _mm256_setr_ps(0.0f, 0x1p-9f, 0x2p-9f, 0x3p-9f, 0x4p-9f, 0x5p-9f, 0x6p-9f, 0x7p-9f);
    const __m256i m7f = _mm256_set1_epi32(0x7f);
    const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + r * w->cols + k)));
    __m256i mag = _mm256_and_si256(b, m7f);
    __m256 v = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
    v = _mm256_blendv_ps(v, _mm256_permutevar8x32_ps(sub, mag),
                         _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
    v = _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, m7f)));
    __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(b, 7), 31);
    v = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
    return _mm256_mul_ps(v, _mm256_set1_ps(s));
  }
  default: { /* ST_W_FP4_E2M1 */
    const __m256 table = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i shifts = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    int32_t four;
    memcpy(&four, p + r * (w->cols / 2) + k / 2, 4);
    __m256i b = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128(four), dup));
    __m256i nib = _mm256_srlv_epi32(b, shifts);
    __m256 v = _mm256_permutevar8x32_ps(table, _mm256_and_si256(nib, _mm256_set1_epi32(7)));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28);
    v = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
    return _mm256_mul_ps(v, _mm256_set1_ps(s));
  }
  }
}

/* The vector path: 8 rows x 8 k decoded into registers, transposed, stored as 8 panel half-rows
** (the same values as pack_rows, element for element). kc8 % 8 == 0. */
INLINE void pack_tiles(int dtype, float *panel, const st_weight *w, int64_t r0, int cols, int64_t k0, int kc8) {
  int scaled = (dtype == ST_W_FP8_E4M3 || dtype == ST_W_FP4_E2M1) && w->scale_dtype != ST_WSCALE_NONE;
  int64_t b1 = scaled ? w->block[1] : 1;
  for (int j0 = 0; j0 < NR; j0 += 8) {
    int nj = cols - j0 < 0 ? 0 : cols - j0 > 8 ? 8 : cols - j0;
    if (nj == 0) {
      for (int kk = 0; kk < kc8; kk++) _mm256_store_ps(panel + (size_t)kk * NR + j0, _mm256_setzero_ps());
      continue;
    }
    float sc[8];
    int64_t next[8];
    for (int jj = 0; jj < 8; jj++) sc[jj] = 1.0f, next[jj] = scaled ? k0 : INT64_MAX;
    for (int kb = 0; kb < kc8; kb += 8) {
      __m256 v[8];
      int64_t k = k0 + kb;
      #pragma GCC unroll 8
      for (int jj = 0; jj < 8; jj++) {
        if (jj < nj) {
          int64_t r = r0 + j0 + jj;
          if (k >= next[jj]) sc[jj] = st_wscale_at(w, r, k), next[jj] = (k / b1 + 1) * b1;
          v[jj] = decode8(dtype, w, r, k, sc[jj]);
        } else {
          v[jj] = _mm256_setzero_ps();
        }
      }
      transpose8(v);
      #pragma GCC unroll 8
      for (int t = 0; t < 8; t++) _mm256_store_ps(panel + (size_t)(kb + t) * NR + j0, v[t]);
    }
  }
}

static void pack(float *panel, const st_weight *w, int64_t r0, int cols, int64_t k0, int kc) {
  int kc8 = kc / 8 * 8;
  if ((w->dtype == ST_W_FP8_E4M3 || w->dtype == ST_W_FP4_E2M1) && w->scale_dtype != ST_WSCALE_NONE &&
      w->block[1] % 8)
    kc8 = 0;
  if (k0 % 8) kc8 = 0;
  switch (kc8 ? w->dtype : ST_W_TYPE_COUNT) {
  case ST_W_F32: pack_tiles(ST_W_F32, panel, w, r0, cols, k0, kc8); break;
  case ST_W_BF16: pack_tiles(ST_W_BF16, panel, w, r0, cols, k0, kc8); break;
  case ST_W_F16: pack_tiles(ST_W_F16, panel, w, r0, cols, k0, kc8); break;
  case ST_W_FP8_E4M3: pack_tiles(ST_W_FP8_E4M3, panel, w, r0, cols, k0, kc8); break;
  case ST_W_FP4_E2M1: pack_tiles(ST_W_FP4_E2M1, panel, w, r0, cols, k0, kc8); break;
  default: kc8 = 0; break;
  }
  if (kc8 < kc) pack_rows(panel, w, r0, cols, k0, kc8, kc);
}

/* ---------------------------------------------------------------- GEMM */

INLINE void gemm_tile(float *c, int64_t ldc, const float *a, int64_t lda, int mr, const float *panel,
                      int full, __m256i m0, __m256i m1, int kc, int accumulate) {
  __m256 acc0[MR], acc1[MR];
  #pragma GCC unroll 16
  for (int i = 0; i < mr; i++) {
    if (!accumulate) acc0[i] = acc1[i] = _mm256_setzero_ps();
    else if (full) acc0[i] = _mm256_loadu_ps(c + i * ldc), acc1[i] = _mm256_loadu_ps(c + i * ldc + 8);
    else acc0[i] = _mm256_maskload_ps(c + i * ldc, m0), acc1[i] = _mm256_maskload_ps(c + i * ldc + 8, m1);
  }
  for (int kk = 0; kk < kc; kk++) {
    __m256 b0 = _mm256_load_ps(panel + (size_t)kk * NR), b1 = _mm256_load_ps(panel + (size_t)kk * NR + 8);
    #pragma GCC unroll 16
    for (int i = 0; i < mr; i++) {
      __m256 x = _mm256_broadcast_ss(a + i * lda + kk);
      acc0[i] = _mm256_fmadd_ps(x, b0, acc0[i]);
      acc1[i] = _mm256_fmadd_ps(x, b1, acc1[i]);
    }
  }
  #pragma GCC unroll 16
  for (int i = 0; i < mr; i++) {
    if (full) _mm256_storeu_ps(c + i * ldc, acc0[i]), _mm256_storeu_ps(c + i * ldc + 8, acc1[i]);
    else _mm256_maskstore_ps(c + i * ldc, m0, acc0[i]), _mm256_maskstore_ps(c + i * ldc + 8, m1, acc1[i]);
  }
}

static void gemm(float *c, int64_t ldc, const float *a, int64_t lda, int m, const float *panel,
                 int cols, int kc, int accumulate) {
  int full = cols >= 16;
  __m256i m0 = lanes_below(cols > 8 ? 8 : cols), m1 = lanes_below(cols > 16 ? 8 : cols > 8 ? cols - 8 : 0);
  int i = 0;
  for (; i + MR <= m; i += MR)
    gemm_tile(c + i * ldc, ldc, a + i * lda, lda, MR, panel, full, m0, m1, kc, accumulate);
  switch (m - i) {
#define TAIL(r) case r: gemm_tile(c + i * ldc, ldc, a + i * lda, lda, r, panel, full, m0, m1, kc, accumulate); break;
    TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5)
#undef TAIL
  default: break;
  }
}

/* ---------------------------------------------------------------- q . k rows */

#define QK_MR 6 /* register rows: 12 accumulators / hv */

/* lanes h0 .. h0 + 8 hv of the chunk (h0 a multiple of 16, hv 2 or 4) */
INLINE void qk_tile(float *out, const float *qT, int hp, int h0, int hv, const float *const *rows,
                    int mr, int dim, const float *w, float scale) {
  __m256 acc[QK_MR][4];
  #pragma GCC unroll 16
  for (int r = 0; r < mr; r++)
    #pragma GCC unroll 16
    for (int v = 0; v < hv; v++) acc[r][v] = _mm256_setzero_ps();
  for (int k = 0; k < dim; k++) {
    const float *qk = qT + (size_t)k * hp + h0;
    #pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
      __m256 x = _mm256_broadcast_ss(rows[r] + k);
      #pragma GCC unroll 16
      for (int v = 0; v < hv; v++) acc[r][v] = _mm256_fmadd_ps(x, _mm256_load_ps(qk + 8 * v), acc[r][v]);
    }
  }
  if (!w) {
    __m256 s = _mm256_set1_ps(scale);
    #pragma GCC unroll 16
    for (int r = 0; r < mr; r++)
      #pragma GCC unroll 16
      for (int v = 0; v < hv; v++)
        _mm256_storeu_ps(out + (size_t)r * hp + h0 + 8 * v, _mm256_mul_ps(acc[r][v], s));
  } else {
    #pragma GCC unroll 16
    for (int r = 0; r < mr; r++) { /* lanes 0-7 take the even registers, lanes 8-15 the odd */
      __m256 lo = _mm256_loadu_ps(out + (size_t)r * 16), hi = _mm256_loadu_ps(out + (size_t)r * 16 + 8);
      #pragma GCC unroll 4
      for (int v = 0; v < hv; v += 2) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(w + h0 + 8 * v), _mm256_max_ps(acc[r][v], _mm256_setzero_ps()), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(w + h0 + 8 * v + 8), _mm256_max_ps(acc[r][v + 1], _mm256_setzero_ps()), hi);
      }
      _mm256_storeu_ps(out + (size_t)r * 16, lo);
      _mm256_storeu_ps(out + (size_t)r * 16 + 8, hi);
    }
  }
}

INLINE void qk_part(float *out, const float *qT, int hp, int h0, int hv, const float *const *rows,
                    int nrows, int dim, const float *w, float scale) {
  int stride = w ? 16 : hp, r = 0, mr = hv == 2 ? 6 : 3;
  for (; r + mr <= nrows; r += mr)
    qk_tile(out + (size_t)r * stride, qT, hp, h0, hv, rows + r, mr, dim, w, scale);
  switch (nrows - r) {
#define TAIL(m) case m: qk_tile(out + (size_t)r * stride, qT, hp, h0, hv, rows + r, m, dim, w, scale); break;
    TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5)
#undef TAIL
  default: break;
  }
}

static void qk(float *out, const float *qT, int hp, const float *const *rows, int nrows, int dim,
               const float *w, float scale) {
  int h0 = 0;
  for (; h0 + 32 <= hp; h0 += 32) qk_part(out, qT, hp, h0, 4, rows, nrows, dim, w, scale);
  if (h0 < hp) qk_part(out, qT, hp, h0, 2, rows, nrows, dim, w, scale);
}

/* ---------------------------------------------------------------- p . v rows */

#define AV_MH 6

INLINE void av_tile(float *out, int64_t ldo, const float *p, int ldp, int mh, const float *const *rows,
                    int ncand, int k0, int full, __m256i m0, __m256i m1) {
  __m256 acc0[AV_MH], acc1[AV_MH];
  #pragma GCC unroll 16
  for (int h = 0; h < mh; h++) acc0[h] = acc1[h] = _mm256_setzero_ps();
  for (int c = 0; c < ncand; c++) {
    __m256 v0, v1;
    if (full) v0 = _mm256_loadu_ps(rows[c] + k0), v1 = _mm256_loadu_ps(rows[c] + k0 + 8);
    else v0 = _mm256_maskload_ps(rows[c] + k0, m0), v1 = _mm256_maskload_ps(rows[c] + k0 + 8, m1);
    #pragma GCC unroll 16
    for (int h = 0; h < mh; h++) {
      __m256 x = _mm256_broadcast_ss(p + (size_t)c * ldp + h);
      acc0[h] = _mm256_fmadd_ps(x, v0, acc0[h]);
      acc1[h] = _mm256_fmadd_ps(x, v1, acc1[h]);
    }
  }
  #pragma GCC unroll 16
  for (int h = 0; h < mh; h++) {
    if (full) _mm256_storeu_ps(out + h * ldo + k0, acc0[h]), _mm256_storeu_ps(out + h * ldo + k0 + 8, acc1[h]);
    else _mm256_maskstore_ps(out + h * ldo + k0, m0, acc0[h]), _mm256_maskstore_ps(out + h * ldo + k0 + 8, m1, acc1[h]);
  }
}

static void av(float *out, int64_t ldo, const float *p, int ldp, int heads, const float *const *rows,
               int ncand, int d) {
  for (int k0 = 0; k0 < d; k0 += 16) {
    int cols = d - k0, full = cols >= 16;
    __m256i m0 = lanes_below(cols > 8 ? 8 : cols), m1 = lanes_below(cols > 16 ? 8 : cols > 8 ? cols - 8 : 0);
    int h = 0;
    for (; h + AV_MH <= heads; h += AV_MH) av_tile(out + h * ldo, ldo, p + h, ldp, AV_MH, rows, ncand, k0, full, m0, m1);
    switch (heads - h) {
#define TAIL(m) case m: av_tile(out + h * ldo, ldo, p + h, ldp, m, rows, ncand, k0, full, m0, m1); break;
      TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5)
#undef TAIL
    default: break;
    }
  }
}

/* ---------------------------------------------------------------- dot */

static float dot(const float *a, const float *b, int n) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
  }
  __m256 t8 = _mm256_add_ps(lo, hi);                                                 /* l, l+8 */
  __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1)); /* l, l+4 */
  __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));                                 /* l, l+2 */
  __m128 t1 = _mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1));                             /* 0, 1 */
  float s = _mm_cvtss_f32(t1);
  for (; i < n; i++) s = fmaf(a[i], b[i], s);
  return s;
}

const cpu_isa st_cpu_isa_avx2 = {"avx2", NR, pack, gemm, qk, av, dot};
