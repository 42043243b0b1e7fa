/* indexer.c — rotation, quantisation, scoring and top-k of the lightning indexer. */
#include "indexer.h"

#include <math.h>

void st_quantize_vectors(const st_backend *be, float *x, int count, int dim, st_number_format format) {
  const st_backend_ops *ops = be->ops;
  switch (format) {
  case ST_FORMAT_BF16: ops->round_bf16(be->ctx, x, (size_t)count * dim); break;
  case ST_FORMAT_FP8_E4M3FN: ops->quantize(be->ctx, x, count, dim, dim, dim, ST_Q_FP8_E4M3FN, 0); break;
  case ST_FORMAT_FP8_E4M3FNUZ: ops->quantize(be->ctx, x, count, dim, dim, dim, ST_Q_FP8_E4M3FNUZ, 0); break;
  case ST_FORMAT_FP4_E2M1: ops->quantize(be->ctx, x, count, dim, dim, 32, ST_Q_FP4_E2M1, 1); break;
  case ST_FORMAT_FP8_E4M3FN_AS_FNUZ:
    ops->quantize(be->ctx, x, count, dim, dim, dim, ST_Q_FP8_FN_AS_FNUZ, 0);
    break;
  case ST_FORMAT_FP32: case ST_FORMAT_AUTO: break;
  }
}

static void prepare(const st_backend *be, int rotate, st_number_format format, float *out,
                    const float *in, int count, int dim) {
  if (out != in) be->ops->copy(be->ctx, out, in, sizeof(float) * (size_t)count * dim);
  if (rotate) be->ops->hadamard(be->ctx, out, count, dim);
  st_quantize_vectors(be, out, count, dim, format);
}

void st_indexer_q_used(const st_backend *be, const st_settings *set, float *out, const float *q,
                       int count, int dim) {
  prepare(be, set->rotate & ST_ROTATE_Q, set->index_q, out, q, count, dim);
}

void st_indexer_k_used(const st_backend *be, const st_settings *set, float *out, const float *k,
                       int rows, int dim) {
  prepare(be, set->rotate & ST_ROTATE_K, set->index_k, out, k, rows, dim);
}

static int topk_width(int topk, int rows) {
  int width = topk < rows ? topk : rows;
  return width < 1 ? 1 : width;
}

void st_indexer_scores(const st_backend *be, float *scores, const float *q_used, const float *w,
                       const float *k_used, int n, int rows, int heads, int dim, const int *visible) {
  if (rows == 0) be->ops->fill(be->ctx, scores, -INFINITY, (size_t)n);
  else be->ops->indexer_scores(be->ctx, scores, q_used, w, k_used, n, rows, heads, dim, visible);
}

int st_indexer_topk_of(const st_backend *be, int topk, const float *scores, int32_t *idx, int n,
                       int rows, const int *visible, void *work) {
  int width = topk_width(topk, rows);
  if (rows > 0) be->ops->topk(be->ctx, idx, scores, n, rows, visible, topk, width, work);
  return width;
}

int st_indexer_select(const st_backend *be, int topk, float *scores, int32_t *idx,
                      const float *q_used, const float *w, const float *k_used, int n, int rows,
                      int heads, int dim, const int *visible, void *work) {
  if (!scores && rows > 0 && be->ops->indexer_topk) {
    int width = topk_width(topk, rows);
    be->ops->indexer_topk(be->ctx, idx, q_used, w, k_used, n, rows, heads, dim, visible, topk, width, work);
    return width;
  }
  ST_ASSERT(scores != NULL || rows == 0);
  if (scores) st_indexer_scores(be, scores, q_used, w, k_used, n, rows, heads, dim, visible);
  return st_indexer_topk_of(be, topk, scores, idx, n, rows, visible, work);
}
