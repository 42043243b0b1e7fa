/*
** cpu_avx512.c — the cpu backend's kernels for AVX-512 (F, BW, VL, DQ) with FMA and F16C;
** compiled with those flags (CMakeLists.txt), called only when the machine has them.
** Same arithmetic as cpu_portable.c, lane for lane (cpu_internal.h).
*/
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/weight.h"

#define NR 32
#define MR 12 /* rows of the GEMM register tile: 12 x 2 accumulators */
#define INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------- weight decoding */

/* out[0..count) = W[r, k0 .. k0 + count), exactly st_weight_decode (k0 a multiple of 16). */
static void decode_row(const st_weight *w, int64_t r, int64_t k0, int count, float *out) {
  const unsigned char *p = w->data;
  int k = 0;
  switch (w->dtype) {
  case ST_W_F32: {
    const float *src = (const float *)p + r * w->cols + k0;
    for (; k + 16 <= count; k += 16) _mm512_storeu_ps(out + k, _mm512_loadu_ps(src + k));
    break;
  }
  case ST_W_BF16: {
    const uint16_t *src = (const uint16_t *)p + r * w->cols + k0;
    for (; k + 16 <= count; k += 16) {
      __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + k)));
      _mm512_storeu_ps(out + k, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    break;
  }
  case ST_W_F16: {
    const uint16_t *src = (const uint16_t *)p + r * w->cols + k0;
    for (; k + 16 <= count; k += 16)
      _mm512_storeu_ps(out + k, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + k))));
    break;
  }
  case ST_W_FP8_E4M3: {
    if (w->scale_dtype != ST_WSCALE_NONE && w->block[1] % 16) break;
    const uint8_t *src = p + r * w->cols + k0;
    const __m512 pow120 = _mm512_castsi512_ps(_mm512_set1_epi32((127 + 120) << 23));
    const __m512i m7f = _mm512_set1_epi32(0x7f), nan = _mm512_set1_epi32(0x7fc00000);
    for (; k + 16 <= count; k += 16) {
      __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + k)));
      __m512i mag = _mm512_and_si512(b, m7f);
      /* the magnitude bits placed in an f32 then scaled by 2^120: normal and subnormal codes */
      __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 20)), pow120);
      v = _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(mag, m7f), _mm512_castsi512_ps(nan));
      __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(b, 7), 31);
      v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
      v = _mm512_mul_ps(v, _mm512_set1_ps(st_wscale_at(w, r, k0 + k)));
      _mm512_storeu_ps(out + k, v);
    }
    break;
  }
  case ST_W_FP4_E2M1: {
    if (w->scale_dtype != ST_WSCALE_NONE && w->block[1] % 16) break;
    const uint8_t *src = p + r * (w->cols / 2) + k0 / 2;
    float lut[16];
    for (int a = 0; a < 16; a++) lut[a] = st_fp4_e2m1_to_f32((uint8_t)a);
    const __m512 table = _mm512_loadu_ps(lut);
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i shifts = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    const __m512i m15 = _mm512_set1_epi32(15);
    for (; k + 16 <= count; k += 16) {
      __m128i bytes = _mm_loadl_epi64((const __m128i *)(src + k / 2));
      __m512i b = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, dup));
      __m512i nib = _mm512_and_si512(_mm512_srlv_epi32(b, shifts), m15);
      __m512 v = _mm512_permutexvar_ps(nib, table);
      v = _mm512_mul_ps(v, _mm512_set1_ps(st_wscale_at(w, r, k0 + k)));
      _mm512_storeu_ps(out + k, v);
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

/* v[t] (t < 16) := column t of the 16 x 16 matrix whose rows are v[0..16) */
INLINE void transpose16(__m512 v[16]) {
  __m512 t[16];
  #pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
  }
  #pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4) {
    v[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    v[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    v[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    v[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  #pragma GCC unroll 16
  for (int h = 0; h < 16; h += 8)
    #pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
      t[h + i] = _mm512_shuffle_f32x4(v[h + i], v[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(v[h + i], v[h + i + 4], 0xdd);
    }
  #pragma GCC unroll 16
  for (int i = 0; i < 8; i++) {
    v[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    v[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

/* W[r, k .. k + 16) as decode_row gives it; s the row's scale at k (fp8, fp4). */
INLINE __m512 decode16(int dtype, const st_weight *w, int64_t r, int64_t k, float s) {
  const unsigned char *p = w->data;
  switch (dtype) {
  case ST_W_F32: return _mm512_loadu_ps((const float *)p + r * w->cols + k);
  case ST_W_BF16: {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + r * w->cols + k)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  case ST_W_F16:
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + r * w->cols + k)));
  case ST_W_FP8_E4M3: {
    /* the f32 bits built with integer operations (no subnormal f32 operand, which costs a
    ** microcode assist): normal codes (mag << 20) + (120 << 23), subnormal ones m * 2^-9 from a
    ** table, NaN as 0x7fc00000, then the sign; the same values as decode_row, bit for bit */
    const __m512 sub = _mm512_setr_ps(0.0f, 0x1p-9f, 0x2p-9f, 0x3p-9f, 0x4p-9f, 0x5p-9f, 0x6p-9f, 0x7p-9f,
                                      0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i m7f = _mm512_set1_epi32(0x7f), nan = _mm512_set1_epi32(0x7fc00000);
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + r * w->cols + k)));
    __m512i mag = _mm512_and_si512(b, m7f);
    __m512i v = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
    v = _mm512_mask_mov_epi32(v, _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(8)),
                              _mm512_castps_si512(_mm512_permutexvar_ps(mag, sub)));
    v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(mag, m7f), nan);
    /* v | (b << 24 & sign bit) */
    v = _mm512_ternarylogic_epi32(v, _mm512_slli_epi32(b, 24), _mm512_set1_epi32((int)0x80000000u), 0xF8);
    return _mm512_mul_ps(_mm512_castsi512_ps(v), _mm512_set1_ps(s));
  }
  default: { /* ST_W_FP4_E2M1 */
    const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f,
                                        -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i shifts = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    __m128i bytes = _mm_loadl_epi64((const __m128i *)(p + r * (w->cols / 2) + k / 2));
    __m512i b = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, dup));
    __m512i nib = _mm512_and_si512(_mm512_srlv_epi32(b, shifts), _mm512_set1_epi32(15));
    return _mm512_mul_ps(_mm512_permutexvar_ps(nib, table), _mm512_set1_ps(s));
  }
  }
}

/* The vector path: 16 rows x 16 k decoded into registers, transposed, stored as 16 panel rows
** (the same values as pack_rows, element for element). k0 + kc16 within the row, kc16 % 16 == 0. */
INLINE void pack_tiles(int dtype, float *panel, const st_weight *w, int64_t r0, int cols, int64_t k0, int kc16) {
  int scaled = (dtype == ST_W_FP8_E4M3 || dtype == ST_W_FP4_E2M1) && w->scale_dtype != ST_WSCALE_NONE;
  int64_t b1 = scaled ? w->block[1] : 1;
  for (int j0 = 0; j0 < NR; j0 += 16) {
    int nj = cols - j0 < 0 ? 0 : cols - j0 > 16 ? 16 : cols - j0;
    if (nj == 0) {
      for (int kk = 0; kk < kc16; kk++) _mm512_store_ps(panel + (size_t)kk * NR + j0, _mm512_setzero_ps());
      continue;
    }
    float sc[16];
    int64_t next[16];
    for (int jj = 0; jj < 16; jj++) sc[jj] = 1.0f, next[jj] = scaled ? k0 : INT64_MAX;
    for (int kb = 0; kb < kc16; kb += 16) {
      __m512 v[16];
      int64_t k = k0 + kb;
      #pragma GCC unroll 16
      for (int jj = 0; jj < 16; jj++) {
        if (jj < nj) {
          int64_t r = r0 + j0 + jj;
          if (k >= next[jj]) sc[jj] = st_wscale_at(w, r, k), next[jj] = (k / b1 + 1) * b1;
          v[jj] = decode16(dtype, w, r, k, sc[jj]);
        } else {
          v[jj] = _mm512_setzero_ps();
        }
      }
      transpose16(v);
      #pragma GCC unroll 16
      for (int t = 0; t < 16; t++) _mm512_store_ps(panel + (size_t)(kb + t) * NR + j0, v[t]);
    }
  }
}

static void pack(float *panel, const st_weight *w, int64_t r0, int cols, int64_t k0, int kc) {
  int kc16 = kc / 16 * 16;
  if ((w->dtype == ST_W_FP8_E4M3 || w->dtype == ST_W_FP4_E2M1) && w->scale_dtype != ST_WSCALE_NONE &&
      w->block[1] % 16)
    kc16 = 0;
  if (k0 % 16) kc16 = 0;
  switch (kc16 ? w->dtype : ST_W_TYPE_COUNT) {
  case ST_W_F32: pack_tiles(ST_W_F32, panel, w, r0, cols, k0, kc16); break;
  case ST_W_BF16: pack_tiles(ST_W_BF16, panel, w, r0, cols, k0, kc16); break;
  case ST_W_F16: pack_tiles(ST_W_F16, panel, w, r0, cols, k0, kc16); break;
  case ST_W_FP8_E4M3: pack_tiles(ST_W_FP8_E4M3, panel, w, r0, cols, k0, kc16); break;
  case ST_W_FP4_E2M1: pack_tiles(ST_W_FP4_E2M1, panel, w, r0, cols, k0, kc16); break;
  default: kc16 = 0; break;
  }
  if (kc16 < kc) pack_rows(panel, w, r0, cols, k0, kc16, kc);
}

/* ---------------------------------------------------------------- GEMM */

INLINE void gemm_tile(float *c, int64_t ldc, const float *a, int64_t lda, int mr, const float *panel,
                      __mmask16 m0, __mmask16 m1, int kc, int accumulate) {
  __m512 acc0[MR], acc1[MR];
  #pragma GCC unroll 16
  for (int i = 0; i < mr; i++) {
    acc0[i] = accumulate ? _mm512_maskz_loadu_ps(m0, c + i * ldc) : _mm512_setzero_ps();
    acc1[i] = accumulate ? _mm512_maskz_loadu_ps(m1, c + i * ldc + 16) : _mm512_setzero_ps();
  }
  for (int kk = 0; kk < kc; kk++) {
    __m512 b0 = _mm512_load_ps(panel + (size_t)kk * NR), b1 = _mm512_load_ps(panel + (size_t)kk * NR + 16);
    #pragma GCC unroll 16
    for (int i = 0; i < mr; i++) {
      __m512 x = _mm512_set1_ps(a[i * lda + kk]);
      acc0[i] = _mm512_fmadd_ps(x, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(x, b1, acc1[i]);
    }
  }
  #pragma GCC unroll 16
  for (int i = 0; i < mr; i++) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, acc0[i]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc1[i]);
  }
}

static void gemm(float *c, int64_t ldc, const float *a, int64_t lda, int m, const float *panel,
                 int cols, int kc, int accumulate) {
  __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
  __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
  int i = 0;
  for (; i + MR <= m; i += MR) gemm_tile(c + i * ldc, ldc, a + i * lda, lda, MR, panel, m0, m1, kc, accumulate);
  switch (m - i) {
#define TAIL(r) case r: gemm_tile(c + i * ldc, ldc, a + i * lda, lda, r, panel, m0, m1, kc, accumulate); break;
    TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5) TAIL(6) TAIL(7) TAIL(8) TAIL(9) TAIL(10) TAIL(11)
#undef TAIL
  default: break;
  }
}

/* ---------------------------------------------------------------- q . k rows */

#define QK_MR 12 /* register rows: 24 accumulators / hv */

INLINE void qk_tile(float *out, const float *qT, int hp, int hv, const float *const *rows, int mr,
                    int dim, const float *w, float scale) {
  __m512 acc[QK_MR][4];
  #pragma GCC unroll 16
  for (int r = 0; r < mr; r++)
    #pragma GCC unroll 16
    for (int v = 0; v < hv; v++) acc[r][v] = _mm512_setzero_ps();
  for (int k = 0; k < dim; k++) {
    __m512 q[4];
    #pragma GCC unroll 16
    for (int v = 0; v < hv; v++) q[v] = _mm512_load_ps(qT + (size_t)k * hp + 16 * v);
    #pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
      __m512 x = _mm512_set1_ps(rows[r][k]);
      #pragma GCC unroll 16
      for (int v = 0; v < hv; v++) acc[r][v] = _mm512_fmadd_ps(x, q[v], acc[r][v]);
    }
  }
  if (!w) {
    __m512 s = _mm512_set1_ps(scale);
    #pragma GCC unroll 16
    for (int r = 0; r < mr; r++)
      #pragma GCC unroll 16
      for (int v = 0; v < hv; v++) _mm512_storeu_ps(out + (size_t)r * hp + 16 * v, _mm512_mul_ps(acc[r][v], s));
  } else {
    #pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
      __m512 lane = _mm512_loadu_ps(out + (size_t)r * 16);
      #pragma GCC unroll 16
      for (int v = 0; v < hv; v++)
        lane = _mm512_fmadd_ps(_mm512_loadu_ps(w + 16 * v), _mm512_max_ps(acc[r][v], _mm512_setzero_ps()), lane);
      _mm512_storeu_ps(out + (size_t)r * 16, lane);
    }
  }
}

INLINE void qk_hv(float *out, const float *qT, int hp, int hv, const float *const *rows, int nrows,
                  int dim, const float *w, float scale) {
  int stride = w ? 16 : hp, r = 0, mr = hv <= 2 ? 12 : hv == 3 ? 8 : 6;
  for (; r + mr <= nrows; r += mr) qk_tile(out + (size_t)r * stride, qT, hp, hv, rows + r, mr, dim, w, scale);
  switch (nrows - r) {
#define TAIL(m) case m: qk_tile(out + (size_t)r * stride, qT, hp, hv, rows + r, m, dim, w, scale); break;
    TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5) TAIL(6) TAIL(7) TAIL(8) TAIL(9) TAIL(10) TAIL(11)
#undef TAIL
  default: break;
  }
}

static void qk(float *out, const float *qT, int hp, const float *const *rows, int nrows, int dim,
               const float *w, float scale) {
  switch (hp / 16) {
  case 1: qk_hv(out, qT, hp, 1, rows, nrows, dim, w, scale); break;
  case 2: qk_hv(out, qT, hp, 2, rows, nrows, dim, w, scale); break;
  case 3: qk_hv(out, qT, hp, 3, rows, nrows, dim, w, scale); break;
  default: qk_hv(out, qT, hp, 4, rows, nrows, dim, w, scale); break;
  }
}

/* ---------------------------------------------------------------- p . v rows */

#define AV_MH 12

INLINE void av_tile(float *out, int64_t ldo, const float *p, int ldp, int mh, const float *const *rows,
                    int ncand, int k0, __mmask16 m0, __mmask16 m1) {
  __m512 acc0[AV_MH], acc1[AV_MH];
  #pragma GCC unroll 16
  for (int h = 0; h < mh; h++) acc0[h] = acc1[h] = _mm512_setzero_ps();
  for (int c = 0; c < ncand; c++) {
    __m512 v0 = _mm512_maskz_loadu_ps(m0, rows[c] + k0), v1 = _mm512_maskz_loadu_ps(m1, rows[c] + k0 + 16);
    #pragma GCC unroll 16
    for (int h = 0; h < mh; h++) {
      __m512 x = _mm512_set1_ps(p[(size_t)c * ldp + h]);
      acc0[h] = _mm512_fmadd_ps(x, v0, acc0[h]);
      acc1[h] = _mm512_fmadd_ps(x, v1, acc1[h]);
    }
  }
  #pragma GCC unroll 16
  for (int h = 0; h < mh; h++) {
    _mm512_mask_storeu_ps(out + h * ldo + k0, m0, acc0[h]);
    _mm512_mask_storeu_ps(out + h * ldo + k0 + 16, m1, acc1[h]);
  }
}

static void av(float *out, int64_t ldo, const float *p, int ldp, int heads, const float *const *rows,
               int ncand, int d) {
  for (int k0 = 0; k0 < d; k0 += 32) {
    int cols = d - k0;
    __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
    __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    int h = 0;
    for (; h + AV_MH <= heads; h += AV_MH) av_tile(out + h * ldo, ldo, p + h, ldp, AV_MH, rows, ncand, k0, m0, m1);
    switch (heads - h) {
#define TAIL(m) case m: av_tile(out + h * ldo, ldo, p + h, ldp, m, rows, ncand, k0, m0, m1); break;
      TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5) TAIL(6) TAIL(7) TAIL(8) TAIL(9) TAIL(10) TAIL(11)
#undef TAIL
    default: break;
    }
  }
}

/* ---------------------------------------------------------------- dot */

static float dot(const float *a, const float *b, int n) {
  __m512 acc = _mm512_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1)); /* l, l+8 */
  __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));     /* l, l+4 */
  __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));                                     /* l, l+2 */
  __m128 t1 = _mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1));                                 /* 0, 1 */
  float s = _mm_cvtss_f32(t1);
  for (; i < n; i++) s = fmaf(a[i], b[i], s);
  return s;
}

const cpu_isa st_cpu_isa_avx512 = {"avx512", NR, pack, gemm, qk, av, dot};
