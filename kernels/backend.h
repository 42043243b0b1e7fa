/*
** backend.h — the one table of operations the forward pass calls (STYLE: "A reader finds the
** model in one place"; ggml's backend table, shrunk to what DeepSeek-V4 needs).
**
** Every operation reads and writes memory of the backend that owns it (host memory for cpu-ref),
** with shapes given explicitly and row-major layouts. Outputs are preallocated by the caller;
** no operation allocates. cpu-ref (kernels/cpu-ref/) is scalar and deterministic: every output
** element is computed by one thread in a fixed order, so results are bit-identical whatever the
** thread count, and chunked processing equals one-shot. It is the oracle other backends are tested
** against, op by op.
*/
#ifndef ST_BACKEND_H
#define ST_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* Candidate index lists use -1 for "no candidate". */
typedef struct st_backend_ops {
  const char *name;        /* "cpu-ref" */
  const char *kernel_mode; /* "deterministic" */

  /* y[n, out] = x[n, in] . w[out, in]^T */
  void (*matmul)(float *y, const float *x, const float *w, int n, int in, int out);

  /* y[n, dim] = x * rsqrt(mean(x^2) + eps) * weight; weight NULL = no weight. y may equal x. */
  void (*rmsnorm)(float *y, const float *x, const float *weight, int n, int dim, float eps);

  /* Rotates the last rope_dim dims of each of n*heads vectors of head_dim, row i at position
  ** positions[i]. cos/sin tables are [max_position, rope_dim/2]. neox = 0: pairs (2i, 2i+1);
  ** neox = 1: pairs (i, i + rope_dim/2). inverse = 1 applies the conjugate rotation. */
  void (*rope)(float *x, int n, int heads, int head_dim, int rope_dim, const int64_t *positions,
               const float *cos_table, const float *sin_table, int neox, int inverse);

  /* x[n, dim] = H_dim x * dim^-1/2 (Sylvester order); dim a power of two. */
  void (*hadamard)(float *x, int n, int dim);

  /* mHC mixing weights from residual streams X [n, hc, D] (SPEC §2.2 steps 2-3):
  ** pre [n, hc], post [n, hc], comb [n, hc, hc] (comb[i][j]: stream i into output stream j). */
  void (*hc_weights)(float *pre, float *post, float *comb, const float *X, const float *fn,
                     const float *base, const float *scale, int n, int hc, int D, float norm_eps,
                     float hc_eps, int sinkhorn_iters);
  /* x[n, D] = sum_i pre[n, i] X[n, i, :] */
  void (*hc_collapse)(float *x, const float *X, const float *pre, int n, int hc, int D);
  /* Xout[n, j, :] = post[n, j] a[n, :] + sum_i comb[n, i, j] X[n, i, :]; Xout != X */
  void (*hc_expand)(float *Xout, const float *a, const float *X, const float *post,
                    const float *comb, int n, int hc, int D);
  /* hc_head: pre = sigmoid(mix * scale + base) + eps on the normalised flat streams; y = sum. */
  void (*hc_head)(float *y, const float *X, const float *fn, const float *base,
                  const float *scale, int n, int hc, int D, float norm_eps, float hc_eps);

  /* Gated pooling of one compressed row per channel over `slots` candidates (SPEC §3.2.1):
  ** row[k] = sum_s softmax_s(score[s, k]) kv[s, k]; kv/score are [slots, stride] and channel k of
  ** slot s is read at column col_offset[s] + k. */
  void (*compressor_pool)(float *row, const float *kv, const float *score, int slots, int stride,
                          const int *col_offset, int d);

  /* Indexer scores (SPEC §3.3 step 7): scores[i, j] = sum_h w[i, h] relu(q[i, h, :] . k[j, :])
  ** for j < visible[i], -inf for visible[i] <= j < rows. */
  void (*indexer_scores)(float *scores, const float *q, const float *w, const float *k, int n,
                         int rows, int heads, int dim, const int *visible);

  /* Per query: the min(k, visible[i]) largest scores among the first visible[i] (ties: lower
  ** index first), written ascending into idx[i, 0..width), padded with -1. scratch holds
  ** threads * rows (float, int) pairs (see st_topk_scratch_size). */
  void (*topk)(int32_t *idx, const float *scores, int n, int rows, const int *visible, int k,
               int width, void *scratch);

  /* Attention with a per-head sink over candidate rows of kv [*, d] (SPEC §3.4):
  ** out[i, h, :] = sum_c p_c kv[idx[i, c]] with p = exp(s - M) / (sum exp(s - M) + exp(sink_h - M)),
  ** s_c = q[i, h] . kv[idx[i, c]] * scale. probs_bf16 rounds p to bf16 before the weighted sum. */
  void (*sparse_attention)(float *out, const float *q, const float *kv, const int32_t *idx, int n,
                           int heads, int d, int width, const float *sinks, float scale,
                           int probs_bf16);

  /* MoE routing (SPEC §2.5), in place on logits [n, E] which become the sqrt(softplus) scores:
  ** experts [n, kE] = hash_experts[n, kE] when given (hash layers), else the kE best of
  ** score + bias (ties to the lower id); weights [n, kE] = score / sum * route_scale. */
  void (*moe_route)(int32_t *experts, float *weights, float *logits, const float *bias,
                    const int32_t *hash_experts, int n, int E, int kE, float route_scale);

  /* out[row[k], :] += y[k, :] * weight[k] for k in [0, count), in order of k; rows may repeat
  ** only in increasing k order of the caller's choosing (the sum order is k's). */
  void (*scatter_add)(float *out, const float *y, const int32_t *row, const float *weight,
                      int count, int D);

  /* h[n, F] = silu(min(g, limit)) * clamp(u, -limit, limit) */
  void (*swiglu)(float *h, const float *g, const float *u, int n, int F, float limit);
} st_backend_ops;

extern const st_backend_ops st_backend_cpu_ref;

/* Bytes of scratch the cpu-ref topk needs for `rows` candidates on `threads` threads. */
size_t st_topk_scratch_size(int rows, int threads);

#endif
