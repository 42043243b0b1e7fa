/* indexer.c — rotation, quantisation, scoring and top-k of the lightning indexer. */
#include "indexer.h"

#include <math.h>
#include <string.h>

#include "kernels/lowp.h"

void st_quantize_vectors(float *x, int count, int dim, st_number_format format) {
  for (int v = 0; v < count; v++) {
    float *p = x + (size_t)v * dim;
    switch (format) {
    case ST_FORMAT_BF16: st_bf16_roundtrip(p, (size_t)dim); break;
    case ST_FORMAT_FP8_E4M3FN: st_fp8_roundtrip_blocks(p, dim, dim, 0, 0); break;
    case ST_FORMAT_FP8_E4M3FNUZ: st_fp8_roundtrip_blocks(p, dim, dim, 0, 1); break;
    case ST_FORMAT_FP4_E2M1: st_fp4_roundtrip_blocks(p, dim, 32); break;
    case ST_FORMAT_FP8_E4M3FN_AS_FNUZ: { /* the writer's scale and bytes, the reader's decoding */
      float amax = 0;
      for (int k = 0; k < dim; k++) amax = fmaxf(amax, fabsf(p[k]));
      float scale = fmaxf(amax, 1e-4f) / 448.0f;
      for (int k = 0; k < dim; k++)
        p[k] = st_fp8_e4m3fnuz_to_f32(st_f32_to_fp8_e4m3fn(p[k] / scale)) * scale;
      break;
    }
    case ST_FORMAT_FP32: case ST_FORMAT_AUTO: break;
    }
  }
}

static void prepare(const st_backend_ops *ops, int rotate, st_number_format format, float *out,
                    const float *in, int count, int dim) {
  if (out != in) memcpy(out, in, sizeof(float) * (size_t)count * dim);
  if (rotate) ops->hadamard(out, count, dim);
  st_quantize_vectors(out, count, dim, format);
}

void st_indexer_q_used(const st_backend_ops *ops, const st_settings *set, float *out,
                       const float *q, int count, int dim) {
  prepare(ops, set->rotate & ST_ROTATE_Q, set->index_q, out, q, count, dim);
}

void st_indexer_k_used(const st_backend_ops *ops, const st_settings *set, float *out,
                       const float *k, int rows, int dim) {
  prepare(ops, set->rotate & ST_ROTATE_K, set->index_k, out, k, rows, dim);
}

int st_indexer_select(const st_backend_ops *ops, int topk, float *scores, int32_t *idx,
                      const float *q_used, const float *w, const float *k_used, int n, int rows,
                      int heads, int dim, const int *visible, void *scratch) {
  int width = topk < rows ? topk : rows;
  if (width < 1) width = 1;
  if (rows > 0) {
    ops->indexer_scores(scores, q_used, w, k_used, n, rows, heads, dim, visible);
    ops->topk(idx, scores, n, rows, visible, topk, width, scratch);
  } else {
    for (int i = 0; i < n; i++) {
      scores[i] = -INFINITY;
      idx[i] = -1;
    }
  }
  return width;
}
