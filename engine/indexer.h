/*
** indexer.h — the lightning indexer's scoring path (SPEC-dsv4 §3.3 steps 3-8), shared by the
** forward pass and by replay so that a replay under the recorded settings reproduces the recorded
** scores and top-k bit for bit. Every pointer is memory of the backend given.
**
** Inputs are what the taps record: q [n, hI, dI] and k rows [rows, dI] after RoPE and before
** rotation/quantisation, weights [n, hI] with d_I^-1/2 h_I^-1/2 folded in.
*/
#ifndef ST_INDEXER_H
#define ST_INDEXER_H

#include <stdint.h>

#include "kernels/backend.h"
#include "settings.h"

/* Rounds count vectors of dim through a storage format (SPEC §4): FP8 with one scale per vector,
** FP4 with one ue8m0 scale per 32 values, bf16 per element; fp32 leaves them. */
void st_quantize_vectors(const st_backend *be, float *x, int count, int dim, st_number_format format);

/* What is scored: Hadamard-rotated if the settings rotate that side, then quantised.
** out may equal in. */
void st_indexer_q_used(const st_backend *be, const st_settings *set, float *out, const float *q,
                       int count, int dim);
void st_indexer_k_used(const st_backend *be, const st_settings *set, float *out, const float *k,
                       int rows, int dim);

/* The row j is visible to the query at position t iff j < (t + 1) / m, capped at rows: the one
** causal rule of compressed rows (forward pass, replay, needle verdicts). */
static inline int st_visible_rows(int64_t position, int ratio, int64_t rows) {
  int64_t v = (position + 1) / ratio;
  return (int)(v < rows ? v : rows);
}

/* The two steps of st_indexer_select, for a caller that scores once and picks several top-k sizes
** (replay's sweeps): st_indexer_scores fills scores [n, max(rows, 1)] (-inf where j >= visible[i]
** or when rows == 0); st_indexer_topk_of picks from them into idx [n, width] (-1 padded; when rows
** == 0 the idx rows are left to the caller) and returns width = max(1, min(topk, rows)). Every
** pointer is backend memory. */
void st_indexer_scores(const st_backend *be, float *scores, const float *q_used, const float *w,
                       const float *k_used, int n, int rows, int heads, int dim, const int *visible);
int st_indexer_topk_of(const st_backend *be, int topk, const float *scores, int32_t *idx, int n,
                       int rows, const int *visible, void *work);

/* Each query's top-k rows, ascending, -1 padded, into idx [n, width]; width = max(1, min(topk,
** rows)) is returned. scores [n, max(rows, 1)] receives the scores (-inf where j >= visible[i])
** when it is non-NULL; with scores NULL a backend's fused indexer_topk may skip the score matrix.
** When rows == 0 scores are -inf (a row each) and idx is left to the caller (-1 a row). work: ops->workspace_size bytes. */
int st_indexer_select(const st_backend *be, int topk, float *scores, int32_t *idx,
                      const float *q_used, const float *w, const float *k_used, int n, int rows,
                      int heads, int dim, const int *visible, void *work);

#endif
