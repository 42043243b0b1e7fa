/*
** weight.h — decoding typed weights (kernels/backend.h st_weight) on the host, for the CPU
** backends and the tests. Header only.
**
** st_weight_decode gives element (r, c) as value * scale in one fp32 multiplication, the same
** arithmetic the checkpoint loader used when it dequantised at load, so a backend that decodes a
** row tile by tile sees exactly the fp32 values the engine used to hold in memory.
*/
#ifndef ST_WEIGHT_H
#define ST_WEIGHT_H

#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/lowp.h"

static inline float st_wscale_at(const st_weight *w, int64_t r, int64_t c) {
  if (w->scale_dtype == ST_WSCALE_NONE) return 1.0f;
  int64_t scale_cols = (w->cols + w->block[1] - 1) / w->block[1];
  int64_t at = (r / w->block[0]) * scale_cols + c / w->block[1];
  const unsigned char *s = (const unsigned char *)w->scales;
  switch (w->scale_dtype) {
  case ST_WSCALE_F32: { float v; memcpy(&v, s + 4 * at, 4); return v; }
  case ST_WSCALE_BF16: { uint16_t v; memcpy(&v, s + 2 * at, 2); return st_bf16_to_f32(v); }
  case ST_WSCALE_UE8M0: return st_e8m0_to_f32(s[at]);
  case ST_WSCALE_NONE: break;
  }
  return 1.0f;
}

/* out[0..count) = W[r, c0 .. c0 + count) as fp32. For FP4, c0 and count are even. */
static inline void st_weight_decode(const st_weight *w, int64_t r, int64_t c0, int count, float *out) {
  const unsigned char *p = (const unsigned char *)w->data;
  switch (w->dtype) {
  case ST_W_F32:
    memcpy(out, p + 4 * (r * w->cols + c0), 4 * (size_t)count);
    return;
  case ST_W_BF16:
    for (int k = 0; k < count; k++) {
      uint16_t v;
      memcpy(&v, p + 2 * (r * w->cols + c0 + k), 2);
      out[k] = st_bf16_to_f32(v);
    }
    return;
  case ST_W_F16:
    for (int k = 0; k < count; k++) {
      uint16_t v;
      memcpy(&v, p + 2 * (r * w->cols + c0 + k), 2);
      out[k] = st_f16_to_f32(v);
    }
    return;
  case ST_W_FP8_E4M3: {
    const unsigned char *q = p + r * w->cols;
    for (int k = 0; k < count;) {
      int64_t c = c0 + k, block_end = (c / w->block[1] + 1) * w->block[1];
      int stop = (int)(block_end - c0 < count ? block_end - c0 : count);
      float scale = st_wscale_at(w, r, c);
      for (; k < stop; k++) out[k] = st_fp8_e4m3fn_to_f32(q[c0 + k]) * scale;
    }
    return;
  }
  case ST_W_FP4_E2M1: {
    const unsigned char *q = p + r * (w->cols / 2);
    for (int k = 0; k < count; k += 2) {
      int64_t c = c0 + k;
      float scale = st_wscale_at(w, r, c);
      unsigned char b = q[c / 2];
      out[k] = st_fp4_e2m1_to_f32(b & 0xf) * scale;
      out[k + 1] = st_fp4_e2m1_to_f32(b >> 4) * scale;
    }
    return;
  }
  case ST_W_TYPE_COUNT: break;
  }
}

#endif
