/*
** cpu_ref.c — the cpu-ref backend: scalar, deterministic, allocation-free; the oracle.
**
** Memory is host memory (host_memory = 1): alloc is calloc, upload/download/copy are memcpy.
** Typed weights are decoded one row at a time into a small buffer, in the loader's arithmetic
** (kernels/weight.h), then reduced exactly as an fp32 row would be: the bits do not depend on the
** stored format's layout, only on the decoded values.
**
** Determinism rule: every output element is produced by exactly one thread, and every reduction
** runs in a fixed order that depends only on the reduction length (dot products accumulate in 8
** interleaved lanes combined by a fixed tree, which the compiler can vectorise without changing a
** bit). So the result is the same for 1 or N threads and for any chunking of the tokens. The build
** uses -ffp-contract=off: no fused multiply-add changes a rounding behind our back.
*/
#include <float.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base.h"
#include "kernels/backend.h"
#include "kernels/hc.h"
#include "kernels/lowp.h"
#include "kernels/moe.h"
#include "kernels/weight.h"

#ifdef _OPENMP
#include <omp.h>
#define THREAD_ID() omp_get_thread_num()
#else
#define THREAD_ID() 0
#endif

/* Dot product in a fixed order: 8 lanes, then a fixed tree, then the tail. */
static inline float dot(const float *a, const float *b, int n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) lane[l] += a[i + l] * b[i + l];
  float s = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

static inline float sum_squares(const float *a, int n) { return dot(a, a, n); }

/* Decoding tables of the 8- and 4-bit codes (the values of kernels/lowp.h's conversions). */
static float fp8_table[256], fp4_table[16];

static void build_tables(void) {
  for (int i = 0; i < 256; i++) fp8_table[i] = st_fp8_e4m3fn_to_f32((uint8_t)i);
  for (int i = 0; i < 16; i++) fp4_table[i] = st_fp4_e2m1_to_f32((uint8_t)i);
}

/* Row r of W as fp32: in place for f32 weights, else decoded into buf [cols] (the same values
** as st_weight_decode, through the tables for the 8- and 4-bit codes). */
static inline const float *weight_row(const st_weight *w, int64_t r, float *buf) {
  const unsigned char *p = w->data;
  int64_t cols = w->cols;
  switch (w->dtype) {
  case ST_W_F32: return (const float *)w->data + r * cols;
  case ST_W_FP8_E4M3:
    for (int64_t c0 = 0; c0 < cols; c0 += w->block[1]) {
      int64_t c1 = ST_MIN(c0 + w->block[1], cols);
      float scale = st_wscale_at(w, r, c0);
      for (int64_t c = c0; c < c1; c++) buf[c] = fp8_table[p[r * cols + c]] * scale;
    }
    return buf;
  case ST_W_FP4_E2M1:
    for (int64_t c0 = 0; c0 < cols; c0 += 32) { /* the last block may be partial (cols even) */
      float scale = st_wscale_at(w, r, c0);
      const unsigned char *q = p + r * (cols / 2) + c0 / 2;
      int pairs = (int)(ST_MIN(32, cols - c0) / 2);
      for (int k = 0; k < pairs; k++) {
        buf[c0 + 2 * k] = fp4_table[q[k] & 0xf] * scale;
        buf[c0 + 2 * k + 1] = fp4_table[q[k] >> 4] * scale;
      }
    }
    return buf;
  default:
    st_weight_decode(w, r, 0, (int)cols, buf);
    return buf;
  }
}

/* The largest row a matmul decodes on the stack (V4-Pro's widest input is 16384). */
#define MAX_DECODED_ROW 65536

static void cpu_matmul(void *ctx, float *y, const float *x, const st_weight *w, int n) {
  int in = (int)w->cols, out = (int)w->rows;
  ST_ASSERT(in <= MAX_DECODED_ROW);
  if (w->dtype == ST_W_F32) {
    const float *wf = w->data;
#pragma omp parallel for collapse(2) schedule(static)
    for (int i = 0; i < n; i++)
      for (int o = 0; o < out; o++)
        y[(size_t)i * out + o] = dot(x + (size_t)i * in, wf + (size_t)o * in, in);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int o = 0; o < out; o++) {
    float buf[in];
    const float *row = weight_row(w, o, buf);
    for (int i = 0; i < n; i++) y[(size_t)i * out + o] = dot(x + (size_t)i * in, row, in);
  }
}

static void cpu_matmul_grouped(void *ctx, float *y, const float *x, const st_weight *w, int n,
                               int groups) {
  int c = (int)w->cols, r = (int)(w->rows / groups);
  ST_ASSERT(c <= MAX_DECODED_ROW && (int64_t)r * groups == w->rows);
#pragma omp parallel for schedule(static)
  for (int o = 0; o < groups * r; o++) {
    float buf[c];
    const float *row = weight_row(w, o, buf);
    int g = o / r;
    for (int i = 0; i < n; i++)
      y[(size_t)i * groups * r + o] = dot(x + (size_t)i * groups * c + (size_t)g * c, row, c);
  }
}

static void cpu_embed(void *ctx, float *X, const st_weight *table, const int32_t *tokens, int n,
                      int hc) {
  int D = (int)table->cols;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++) {
    float *first = X + (size_t)i * hc * D;
    st_weight_decode(table, tokens[i], 0, D, first);
    for (int a = 1; a < hc; a++) memcpy(first + (size_t)a * D, first, sizeof(float) * (size_t)D);
  }
}

static void cpu_rmsnorm(void *ctx, float *y, const float *x, const float *weight, int n, int dim, float eps) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++) {
    const float *xi = x + (size_t)i * dim;
    float *yi = y + (size_t)i * dim;
    float mean = sum_squares(xi, dim) / (float)dim;
    float r = 1.0f / sqrtf(mean + eps);
    for (int k = 0; k < dim; k++) yi[k] = weight ? weight[k] * (xi[k] * r) : xi[k] * r;
  }
}

static void cpu_rope(void *ctx, float *x, int n, int heads, int head_dim, int rope_dim, const int64_t *positions,
                     const float *cos_table, const float *sin_table, int neox, int inverse) {
  int half = rope_dim / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int i = 0; i < n; i++) {
    for (int h = 0; h < heads; h++) {
      float *v = x + ((size_t)i * heads + h) * head_dim + (head_dim - rope_dim);
      const float *c = cos_table + (size_t)positions[i] * half;
      const float *s = sin_table + (size_t)positions[i] * half;
      for (int p = 0; p < half; p++) {
        int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
        float sn = inverse ? -s[p] : s[p];
        float x0 = v[a], x1 = v[b];
        /* same association as x*cos + rotate_half(x)*sin */
        v[a] = x0 * c[p] + (-x1) * sn;
        v[b] = x1 * c[p] + x0 * sn;
      }
    }
  }
}

static void cpu_hadamard(void *ctx, float *x, int n, int dim) {
  float scale = 1.0f / sqrtf((float)dim);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++) {
    float *v = x + (size_t)i * dim;
    /* in-place fast Walsh-Hadamard transform, Sylvester order */
    for (int len = 1; len < dim; len <<= 1)
      for (int start = 0; start < dim; start += 2 * len)
        for (int k = start; k < start + len; k++) {
          float a = v[k], b = v[k + len];
          v[k] = a + b;
          v[k + len] = a - b;
        }
    for (int k = 0; k < dim; k++) v[k] *= scale;
  }
}


static void cpu_hc_weights(void *ctx, float *pre, float *post, float *comb, const float *X, const float *fn,
                           const float *base, const float *scale, int n, int hc, int D,
                           float norm_eps, float hc_eps, int sinkhorn_iters) {
  int flat = hc * D, mixes = (2 + hc) * hc;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++) {
    const float *x = X + (size_t)i * flat;
    float r = 1.0f / sqrtf(sum_squares(x, flat) / (float)flat + norm_eps);
    float mix[(2 + 16) * 16]; /* hc <= 16 */
    for (int m = 0; m < mixes; m++) mix[m] = dot(x, fn + (size_t)m * flat, flat) * r;
    float *p = pre + (size_t)i * hc, *q = post + (size_t)i * hc, *C = comb + (size_t)i * hc * hc;
    st_hc_weights_from_mix(mix, base, scale, hc, hc_eps, sinkhorn_iters, p, q, C);
  }
}

static void cpu_hc_collapse(void *ctx, float *x, const float *X, const float *pre, int n, int hc, int D) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++)
    for (int k = 0; k < D; k++) {
      float s = 0;
      for (int a = 0; a < hc; a++) s += pre[(size_t)i * hc + a] * X[((size_t)i * hc + a) * D + k];
      x[(size_t)i * D + k] = s;
    }
}

static void cpu_hc_expand(void *ctx, float *Xout, const float *a, const float *X, const float *post,
                          const float *comb, int n, int hc, int D) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int i = 0; i < n; i++)
    for (int j = 0; j < hc; j++) {
      const float *C = comb + (size_t)i * hc * hc;
      float pj = post[(size_t)i * hc + j];
      for (int k = 0; k < D; k++) {
        float s = 0;
        for (int src = 0; src < hc; src++) s += C[src * hc + j] * X[((size_t)i * hc + src) * D + k];
        Xout[((size_t)i * hc + j) * D + k] = pj * a[(size_t)i * D + k] + s;
      }
    }
}

static void cpu_hc_head(void *ctx, float *y, const float *X, const float *fn, const float *base,
                        const float *scale, int n, int hc, int D, float norm_eps, float hc_eps) {
  int flat = hc * D;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++) {
    const float *x = X + (size_t)i * flat;
    float r = 1.0f / sqrtf(sum_squares(x, flat) / (float)flat + norm_eps);
    float pre[16];
    for (int a = 0; a < hc; a++)
      pre[a] = st_hc_sigmoid(dot(x, fn + (size_t)a * flat, flat) * r * scale[0] + base[a]) + hc_eps;
    for (int k = 0; k < D; k++) {
      float s = 0;
      for (int a = 0; a < hc; a++) s += pre[a] * x[(size_t)a * D + k];
      y[(size_t)i * D + k] = s;
    }
  }
}

static void pool_row(float *row, const float *kv, const float *score, int slots,
                                int stride, const int *col_offset, int d) {
  for (int k = 0; k < d; k++) {
    float mx = -INFINITY;
    for (int s = 0; s < slots; s++) mx = fmaxf(mx, score[(size_t)s * stride + col_offset[s] + k]);
    float den = 0, num = 0;
    if (mx == -INFINITY) { row[k] = 0; continue; } /* unreachable: block j always has its m tokens */
    for (int s = 0; s < slots; s++) den += expf(score[(size_t)s * stride + col_offset[s] + k] - mx);
    for (int s = 0; s < slots; s++) {
      float p = expf(score[(size_t)s * stride + col_offset[s] + k] - mx) / den;
      num += kv[(size_t)s * stride + col_offset[s] + k] * p;
    }
    row[k] = num;
  }
}

static void cpu_compress(void *ctx, float *rows, float *state_kv, float *state_score,
                         const float *kv, const float *score, const float *ape, int n, int64_t p0,
                         int m, int d, int overlap) {
  int cd = (overlap ? 2 : 1) * d, slots = overlap ? 2 * m : m;
  int offsets[2 * 128];
  ST_ASSERT(slots <= (int)(sizeof offsets / sizeof offsets[0]));
  for (int sl = 0; sl < slots; sl++) offsets[sl] = overlap && sl >= m ? d : 0;
  for (int i = 0; i < n; i++) {
    int64_t t = p0 + i;
    int within = (int)(t % m);
    int slot = overlap ? m + within : within;
    float *skv = state_kv + (size_t)slot * cd, *sscore = state_score + (size_t)slot * cd;
    const float *a = ape + (size_t)within * cd;
    for (int k = 0; k < cd; k++) {
      skv[k] = kv[(size_t)i * cd + k];
      sscore[k] = score[(size_t)i * cd + k] + a[k];
    }
    if ((t + 1) % m) continue;
    pool_row(rows + (size_t)(t / m) * d, state_kv, state_score, slots, cd, offsets, d);
    if (overlap) { /* this block becomes the previous block */
      memcpy(state_kv, state_kv + (size_t)m * cd, sizeof(float) * (size_t)m * cd);
      memcpy(state_score, state_score + (size_t)m * cd, sizeof(float) * (size_t)m * cd);
    }
  }
}

static void cpu_indexer_scores(void *ctx, float *scores, const float *q, const float *w, const float *k, int n,
                               int rows, int heads, int dim, const int *visible) {
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = 0; i < n; i++) {
    float *out = scores + (size_t)i * rows;
    const float *qi = q + (size_t)i * heads * dim;
    const float *wi = w + (size_t)i * heads;
    for (int j = 0; j < rows; j++) {
      if (j >= visible[i]) { out[j] = -INFINITY; continue; }
      const float *kj = k + (size_t)j * dim;
      float s = 0;
      for (int h = 0; h < heads; h++) {
        float d = dot(qi + (size_t)h * dim, kj, dim);
        s += wi[h] * (d > 0 ? d : 0);
      }
      out[j] = s;
    }
  }
}

typedef struct scored { float score; int index; } scored;

/* Strict total order: higher score first, then lower index; NaN ranks lowest. */
static inline int better(scored a, scored b) {
  float sa = isnan(a.score) ? -INFINITY : a.score, sb = isnan(b.score) ? -INFINITY : b.score;
  return sa > sb || (sa == sb && a.index < b.index);
}

/* Moves the k best of v[0..n) to v[0..k) (any order). Quickselect on a strict total order. */
static void select_best(scored *v, int n, int k) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    scored pivot = v[lo + (hi - lo) / 2];
    int i = lo, j = hi;
    while (i <= j) {
      while (better(v[i], pivot)) i++;
      while (better(pivot, v[j])) j--;
      if (i <= j) { scored t = v[i]; v[i] = v[j]; v[j] = t; i++; j--; }
    }
    if (k - 1 <= j) hi = j;
    else if (k - 1 >= i) lo = i;
    else break;
  }
}

static int compare_int32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* cpu-ref's context: the thread count its top-k workspace was sized for. */
typedef struct cpu_ref_ctx { int threads; } cpu_ref_ctx;

static size_t cpu_workspace_size(void *ctx, const st_backend_limits *lim) {
  cpu_ref_ctx *c = ctx;
  return (size_t)(lim->max_rows > 0 ? lim->max_rows : 1) * (size_t)c->threads * sizeof(scored);
}

static void cpu_topk(void *ctx, int32_t *idx, const float *scores, int n, int rows, const int *visible, int k,
                     int width, void *scratch) {
  int threads = ((cpu_ref_ctx *)ctx)->threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int i = 0; i < n; i++) {
    scored *v = (scored *)scratch + (size_t)THREAD_ID() * rows;
    int vis = visible[i] < rows ? visible[i] : rows;
    int take = k < vis ? k : vis;
    if (take > width) take = width;
    for (int j = 0; j < vis; j++) v[j] = (scored){scores[(size_t)i * rows + j], j};
    if (take < vis) select_best(v, vis, take);
    int32_t *out = idx + (size_t)i * width;
    for (int c = 0; c < take; c++) out[c] = v[c].index;
    qsort(out, (size_t)take, sizeof *out, compare_int32);
    for (int c = take; c < width; c++) out[c] = -1;
  }
}

static void cpu_sparse_attention(void *ctx, float *out, const float *q, const float *kv, const int32_t *idx,
                                 int n, int heads, int d, int width, const float *sinks, float scale,
                                 int probs_bf16) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int i = 0; i < n; i++)
    for (int h = 0; h < heads; h++) {
      const float *qh = q + ((size_t)i * heads + h) * d;
      const int32_t *cand = idx + (size_t)i * width;
      float *o = out + ((size_t)i * heads + h) * d;
      float logit[width > 0 ? width : 1]; /* width <= window + top-k: small */
      float mx = sinks[h];
      for (int c = 0; c < width; c++) {
        if (cand[c] < 0) continue;
        logit[c] = dot(qh, kv + (size_t)cand[c] * d, d) * scale;
        mx = fmaxf(mx, logit[c]);
      }
      float den = 0;
      for (int c = 0; c < width; c++)
        if (cand[c] >= 0) den += (logit[c] = expf(logit[c] - mx));
      den += expf(sinks[h] - mx);
      for (int k = 0; k < d; k++) o[k] = 0;
      for (int c = 0; c < width; c++) {
        if (cand[c] < 0) continue;
        const float *v = kv + (size_t)cand[c] * d;
        float p = logit[c] / den;
        if (probs_bf16) p = st_round_bf16(p);
        for (int k = 0; k < d; k++) o[k] += p * v[k];
      }
    }
}

static void cpu_moe_route(void *ctx, int32_t *experts, float *weights, float *logits, const float *bias,
                          const int32_t *hash_experts, int n, int E, int kE, float route_scale) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++)
    st_moe_route_token(logits + (size_t)i * E, bias, hash_experts ? hash_experts + (size_t)i * kE : NULL,
                       E, kE, route_scale, experts + (size_t)i * kE, weights + (size_t)i * kE);
}

static void cpu_scatter_add(void *ctx, float *out, const float *y, const int32_t *row, const float *weight,
                            int count, int D) {
  /* one thread per output column keeps each element's additions in k order */
#pragma omp parallel for schedule(static)
  for (int c = 0; c < D; c++)
    for (int k = 0; k < count; k++) out[(size_t)row[k] * D + c] += y[(size_t)k * D + c] * weight[k];
}

static void cpu_swiglu(void *ctx, float *h, const float *g, const float *u, int n, int F, float limit) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++)
    for (int k = 0; k < F; k++) {
      size_t at = (size_t)i * F + k;
      float gv = fminf(g[at], limit);
      float uv = fminf(fmaxf(u[at], -limit), limit);
      h[at] = gv / (1.0f + expf(-gv)) * uv;
    }
}

/* ---- small element-wise ops ---------------------------------------------------------------- */

static void cpu_round_bf16(void *ctx, float *x, size_t count) { st_bf16_roundtrip(x, count); }

static void cpu_quantize(void *ctx, float *x, int rows, int64_t stride, int len, int block,
                         st_qformat format, int ue8m0) {
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int r = 0; r < rows; r++) {
    float *p = x + (size_t)r * (size_t)stride;
    switch (format) {
    case ST_Q_BF16: st_bf16_roundtrip(p, (size_t)len); break;
    case ST_Q_FP8_E4M3FN: st_fp8_roundtrip_blocks(p, len, block, ue8m0, 0); break;
    case ST_Q_FP8_E4M3FNUZ: st_fp8_roundtrip_blocks(p, len, block, ue8m0, 1); break;
    case ST_Q_FP8_FN_AS_FNUZ: st_fp8_fn_as_fnuz_blocks(p, len, block); break;
    case ST_Q_FP4_E2M1: st_fp4_roundtrip_blocks(p, len, block); break;
    }
  }
}

static void cpu_add(void *ctx, float *y, const float *a, const float *b, size_t count) {
  for (size_t k = 0; k < count; k++) y[k] = a[k] + b[k];
}

static void cpu_scale(void *ctx, float *x, float s, size_t count) {
  for (size_t k = 0; k < count; k++) x[k] *= s;
}

static void cpu_fill(void *ctx, float *x, float value, size_t count) {
  for (size_t k = 0; k < count; k++) x[k] = value;
}

static void cpu_candidates(void *ctx, int32_t *cand, const int32_t *topk, int n, int64_t p0,
                           int window, int width, int32_t compressed_base, int ratio) {
  int stride = window + width;
#pragma omp parallel for schedule(static) if (n > 64)
  for (int i = 0; i < n; i++) {
    int64_t t = p0 + i;
    int32_t *c = cand + (size_t)i * stride;
    for (int k = 0; k < window; k++) {
      int64_t pos = t - window + 1 + k;
      c[k] = pos < 0 ? -1 : pos >= p0 ? (int32_t)(window + (pos - p0)) : (int32_t)(pos % window);
    }
    if (topk) {
      for (int j = 0; j < width; j++) {
        int32_t row = topk[(size_t)i * width + j];
        c[window + j] = row >= 0 ? compressed_base + row : -1;
      }
    } else {
      int64_t visible = (t + 1) / ratio;
      for (int j = 0; j < width; j++) c[window + j] = j < visible ? compressed_base + j : -1;
    }
  }
}

static void cpu_gather_rows(void *ctx, float *dst, const float *src, const int32_t *rows, int count,
                            int D) {
  for (int k = 0; k < count; k++)
    memcpy(dst + (size_t)k * D, src + (size_t)rows[k] * D, sizeof(float) * (size_t)D);
}

/* ---- context and memory ------------------------------------------------------------------- */

static void cpu_close(void *ctx) { free(ctx); }

static int cpu_supports(void *ctx, st_op op, int dtype) {
  return op != ST_OP_INDEXER_TOPK && op != ST_OP_MOE_EXPERTS;
}

static st_status cpu_alloc(void *ctx, size_t bytes, void **out) {
  *out = calloc(bytes ? bytes : 1, 1);
  return *out ? ST_OK : st_fail(ST_ENOMEM, "cpu-ref: %zu bytes", bytes);
}

static void cpu_free(void *ctx, void *p) { free(p); }

static st_status cpu_memcpy(void *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes) memcpy(dst, src, bytes);
  return ST_OK;
}

static st_status cpu_synchronize(void *ctx) { return ST_OK; }

const st_backend_ops st_backend_cpu_ref_ops = {
  .name = "cpu-ref",
  .kernel_mode = "deterministic",
  .host_memory = 1,
  .close = cpu_close,
  .supports = cpu_supports,
  .workspace_size = cpu_workspace_size,
  .alloc = cpu_alloc,
  .free = cpu_free,
  .upload = cpu_memcpy,
  .download = cpu_memcpy,
  .copy = cpu_memcpy,
  .synchronize = cpu_synchronize,
  .matmul = cpu_matmul,
  .matmul_grouped = cpu_matmul_grouped,
  .embed = cpu_embed,
  .rmsnorm = cpu_rmsnorm,
  .rope = cpu_rope,
  .hadamard = cpu_hadamard,
  .round_bf16 = cpu_round_bf16,
  .quantize = cpu_quantize,
  .add = cpu_add,
  .scale = cpu_scale,
  .fill = cpu_fill,
  .hc_weights = cpu_hc_weights,
  .hc_collapse = cpu_hc_collapse,
  .hc_expand = cpu_hc_expand,
  .hc_head = cpu_hc_head,
  .compress = cpu_compress,
  .indexer_scores = cpu_indexer_scores,
  .topk = cpu_topk,
  .candidates = cpu_candidates,
  .sparse_attention = cpu_sparse_attention,
  .moe_route = cpu_moe_route,
  .gather_rows = cpu_gather_rows,
  .scatter_add = cpu_scatter_add,
  .swiglu = cpu_swiglu,
};

st_status st_backend_cpu_ref_open(st_backend *out) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, build_tables);
  cpu_ref_ctx *c = calloc(1, sizeof *c);
  if (!c) return st_fail(ST_ENOMEM, "cpu-ref context");
#ifdef _OPENMP
  c->threads = omp_get_max_threads();
#else
  c->threads = 1;
#endif
  out->ops = &st_backend_cpu_ref_ops;
  out->ctx = c;
  return ST_OK;
}
