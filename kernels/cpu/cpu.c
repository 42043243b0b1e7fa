/*
** cpu.c — the cpu backend: blocked, vectorised and deterministic (kernels/backend.h).
**
** Layout. This file is the table, the context, the memory entries and every driver: it cuts
** each operation into tasks, runs them with OpenMP and calls the instruction-set kernels of
** cpu_internal.h (AVX-512, AVX2+FMA or portable C, chosen once at open from what the machine
** has; ST_CPU_ISA=avx512|avx2|portable forces one). All three give the same bits: the arithmetic
** is defined per output element (cpu_internal.h), never per vector register.
**
** Determinism. Every output element is produced by one task, and a task's reduction order
** depends on the shapes alone: a GEMM element is one fma chain over k whatever the tile, thread
** or row split; the indexer and attention handle each query by itself. So the bits are the same
** for any OMP_NUM_THREADS and any chunking of the token rows (bench/bench_cpu_ops.c checks).
**
** Scratch. The context owns one slot of scratch per thread (GEMM panels, packed queries,
** attention logits), sized at open; top-k buffers come from the caller's `work`
** (workspace_size). No operation allocates.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/hc.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/lowp.h"
#include "kernels/moe.h"
#include "kernels/weight.h"

#ifdef _OPENMP
#include <omp.h>
#define THREAD_ID() omp_get_thread_num()
#else
#define THREAD_ID() 0
static int omp_get_max_threads(void) { return 1; }
static int omp_get_num_procs(void) { return 1; }
#endif

#define SLOT_FLOATS ((size_t)1 << 20) /* 4 MiB of scratch per thread */
#define IDX_TILE 48                   /* k rows of the indexer per tile (a multiple of 3 and 6) */

typedef struct cpu_ctx {
  const cpu_isa *isa;
  int slots;      /* threads with a scratch slot; parallel regions use at most this many */
  float *scratch; /* slots * SLOT_FLOATS */
  char description[96];
} cpu_ctx;

static int threads(const cpu_ctx *c) {
  int t = omp_get_max_threads();
  return t < c->slots ? t : c->slots;
}
static float *slot(const cpu_ctx *c) { return c->scratch + (size_t)THREAD_ID() * SLOT_FLOATS; }

/* ------------------------------------------------------------------------------------------ */
/* Context and memory                                                                           */

static void cpu_close(void *ctx) {
  cpu_ctx *c = ctx;
  if (!c) return;
  free(c->scratch);
  free(c);
}

static const char *cpu_describe(void *ctx) { return ((cpu_ctx *)ctx)->description; }

static int cpu_supports(void *ctx, st_op op, int dtype) {
  if (op == ST_OP_MOE_EXPERTS) return 0;
  if (op < 0 || op >= ST_OP_COUNT) return 0;
  if (op == ST_OP_MATMUL || op == ST_OP_MATMUL_GROUPED || op == ST_OP_EMBED)
    return dtype >= 0 && dtype < ST_W_TYPE_COUNT;
  return 1;
}

typedef struct cand { float key; int32_t idx; } cand; /* key: the score, NaN as -inf */

static size_t topk_slot_entries(int k) { return 2 * (size_t)(k > 0 ? k : 1) + 64; }

static size_t cpu_workspace_size(void *ctx, const st_backend_limits *lim) {
  const cpu_ctx *c = ctx;
  return (size_t)c->slots * topk_slot_entries(lim->max_topk) * sizeof(cand) + 64;
}

static st_status cpu_alloc(void *ctx, size_t bytes, void **out) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (!p) {
    *out = NULL;
    return st_fail(ST_ENOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
  }
  memset(p, 0, rounded ? rounded : 64);
  *out = p;
  return ST_OK;
}
static void cpu_free(void *ctx, void *p) { free(p); }
static st_status cpu_upload(void *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes) memcpy(dst, src, bytes);
  return ST_OK;
}
static st_status cpu_download(void *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes) memcpy(dst, src, bytes);
  return ST_OK;
}
static st_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes) memcpy(dst, src, bytes);
  return ST_OK;
}
static st_status cpu_synchronize(void *ctx) { return ST_OK; }

/* ------------------------------------------------------------------------------------------ */
/* GEMM                                                                                         */

/* One task: y[i, o] for i < m, o in [o0, o0 + cols) from x rows (ldx) through W rows wrow0 + o,
** over K columns; panels in the calling thread's slot. */
static void gemm_task(const cpu_ctx *c, float *y, int64_t ldy, const float *x, int64_t ldx, int m,
                      const st_weight *w, int64_t wrow0, int cols, int K) {
  const cpu_isa *isa = c->isa;
  float *panels = slot(c);
  int nr = isa->nr;
  if (K <= 0) {
    for (int i = 0; i < m; i++) memset(y + i * ldy, 0, sizeof(float) * (size_t)cols);
    return;
  }
  for (int k0 = 0; k0 < K; k0 += CPU_KC) {
    int kc = K - k0 < CPU_KC ? K - k0 : CPU_KC;
    /* each panel is used by all m rows right after it is packed, while it is in L1 */
    for (int o = 0; o < cols; o += nr) {
      isa->pack(panels, w, wrow0 + o, cols - o < nr ? cols - o : nr, k0, kc);
      isa->gemm(y + o, ldy, x + k0, ldx, m, panels, cols - o < nr ? cols - o : nr, kc, k0 > 0);
    }
  }
}

/* y[n, groups * O] (ldy) = per group g: x[:, g K .. (g+1) K) through W rows [g O, (g+1) O). */
static void gemm_run(const cpu_ctx *c, float *y, int64_t ldy, const float *x, int64_t ldx, int n,
                     const st_weight *w, int O, int K, int groups) {
  if (n <= 0 || O <= 0) return;
  int nr = c->isa->nr, T = threads(c);
  int64_t nrb = (n + CPU_RB - 1) / CPU_RB;
  int cw = CPU_CW;
  while (cw > nr && (int64_t)groups * nrb * ((O + cw - 1) / cw) < 2 * T) cw /= 2;
  int64_t ncb = (O + cw - 1) / cw, tasks = (int64_t)groups * nrb * ncb;
#pragma omp parallel for schedule(static) num_threads(T)
  for (int64_t t = 0; t < tasks; t++) {
    int64_t g = t / (nrb * ncb), rb = (t / ncb) % nrb, cb = t % ncb;
    int i0 = (int)(rb * CPU_RB), m = n - i0 < CPU_RB ? n - i0 : CPU_RB;
    int o0 = (int)(cb * cw), cols = O - o0 < cw ? O - o0 : cw;
    gemm_task(c, y + i0 * ldy + g * O + o0, ldy, x + i0 * ldx + g * K, ldx, m, w, g * O + o0, cols, K);
  }
}

static void cpu_matmul(void *ctx, float *y, const float *x, const st_weight *w, int n) {
  gemm_run(ctx, y, w->rows, x, w->cols, n, w, (int)w->rows, (int)w->cols, 1);
}

static void cpu_matmul_grouped(void *ctx, float *y, const float *x, const st_weight *w, int n,
                               int groups) {
  int r = (int)(w->rows / groups), K = (int)w->cols;
  gemm_run(ctx, y, (int64_t)groups * r, x, (int64_t)groups * K, n, w, r, K, groups);
}

static void cpu_embed(void *ctx, float *X, const st_weight *table, const int32_t *tokens, int n,
                      int hc) {
  int64_t D = table->cols;
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int i = 0; i < n; i++) {
    float *dst = X + (size_t)i * hc * D;
    st_weight_decode(table, tokens[i], 0, (int)D, dst);
    for (int a = 1; a < hc; a++) memcpy(dst + a * D, dst, sizeof(float) * (size_t)D);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Element-wise and per-row operations                                                          */

static void cpu_rmsnorm(void *ctx, float *y, const float *x, const float *weight, int n, int dim,
                        float eps) {
  const cpu_isa *isa = ((cpu_ctx *)ctx)->isa;
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int i = 0; i < n; i++) {
    const float *xi = x + (size_t)i * dim;
    float *yi = y + (size_t)i * dim;
    float r = 1.0f / sqrtf(isa->dot(xi, xi, dim) / (float)dim + eps);
    if (weight) {
#pragma omp simd
      for (int k = 0; k < dim; k++) yi[k] = weight[k] * (xi[k] * r);
    } else {
#pragma omp simd
      for (int k = 0; k < dim; k++) yi[k] = xi[k] * r;
    }
  }
}

static void cpu_rope(void *ctx, float *x, int n, int heads, int head_dim, int rope_dim,
                     const int64_t *positions, const float *cos_table, const float *sin_table,
                     int neox, int inverse) {
  int half = rope_dim / 2;
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int i = 0; i < n; i++) {
    const float *cs = cos_table + (size_t)positions[i] * half;
    const float *sn = sin_table + (size_t)positions[i] * half;
    for (int h = 0; h < heads; h++) {
      float *v = x + ((size_t)i * heads + h) * head_dim + (head_dim - rope_dim);
      for (int p = 0; p < half; p++) {
        int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
        float s = inverse ? -sn[p] : sn[p];
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs[p] + (-x1) * s; /* x cos + rotate_half(x) sin */
        v[b] = x1 * cs[p] + x0 * s;
      }
    }
  }
}

static void cpu_hadamard(void *ctx, float *x, int n, int dim) {
  float scale = 1.0f / sqrtf((float)dim);
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int i = 0; i < n; i++) {
    float *v = x + (size_t)i * dim;
    for (int len = 1; len < dim; len <<= 1)
      for (int start = 0; start < dim; start += 2 * len)
#pragma omp simd
        for (int k = start; k < start + len; k++) {
          float a = v[k], b = v[k + len];
          v[k] = a + b;
          v[k + len] = a - b;
        }
#pragma omp simd
    for (int k = 0; k < dim; k++) v[k] *= scale;
  }
}

static void cpu_round_bf16(void *ctx, float *x, size_t count) {
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (size_t k = 0; k < count; k++) x[k] = st_round_bf16(x[k]);
}

static void cpu_quantize(void *ctx, float *x, int rows, int64_t stride, int len, int block,
                         st_qformat format, int ue8m0) {
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int r = 0; r < rows; r++) {
    float *p = x + r * stride;
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
#pragma omp parallel for simd schedule(static) num_threads(threads(ctx))
  for (size_t k = 0; k < count; k++) y[k] = a[k] + b[k];
}
static void cpu_scale(void *ctx, float *x, float s, size_t count) {
#pragma omp parallel for simd schedule(static) num_threads(threads(ctx))
  for (size_t k = 0; k < count; k++) x[k] *= s;
}
static void cpu_fill(void *ctx, float *x, float value, size_t count) {
#pragma omp parallel for simd schedule(static) num_threads(threads(ctx))
  for (size_t k = 0; k < count; k++) x[k] = value;
}

/* ------------------------------------------------------------------------------------------ */
/* mHC (SPEC §2.2)                                                                              */


/* mix[i, o] = x[i, :] . fn[o, :] for i < m, o < O (rows of x in the thread's slot, after the
** GEMM panels): the same fma chain as matmul. */
static float *row_mixes(const cpu_ctx *c, const float *x, int m, const float *fn, int O, int flat) {
  st_weight w = {ST_W_F32, ST_WSCALE_NONE, {1, 1}, O, flat, fn, NULL};
  float *mix = slot(c) + (size_t)(O + 31) / 32 * 32 * CPU_KC; /* after the panels */
  ST_ASSERT((size_t)(O + 31) / 32 * 32 * CPU_KC + (size_t)m * O <= SLOT_FLOATS);
  gemm_task(c, mix, O, x, flat, m, &w, 0, O, flat);
  return mix;
}

#define HC_ROWS 64 /* tokens of one mHC task: 64 * (2 + 16) * 16 mixes fit the slot */

static void cpu_hc_weights(void *ctx, float *pre, float *post, float *comb, const float *X,
                           const float *fn, const float *base, const float *scale, int n, int hc,
                           int D, float norm_eps, float hc_eps, int sinkhorn_iters) {
  const cpu_ctx *c = ctx;
  int flat = hc * D, mixes = (2 + hc) * hc;
  int tasks = (n + HC_ROWS - 1) / HC_ROWS;
#pragma omp parallel for schedule(static) num_threads(threads(c))
  for (int t = 0; t < tasks; t++) {
    int i0 = t * HC_ROWS, m = n - i0 < HC_ROWS ? n - i0 : HC_ROWS;
    const float *mixall = row_mixes(c, X + (size_t)i0 * flat, m, fn, mixes, flat);
    for (int ii = 0; ii < m; ii++) {
      int i = i0 + ii;
      const float *x = X + (size_t)i * flat;
      float r = 1.0f / sqrtf(c->isa->dot(x, x, flat) / (float)flat + norm_eps);
      float mix[(2 + 16) * 16];
      for (int q = 0; q < mixes; q++) mix[q] = mixall[(size_t)ii * mixes + q] * r;
      float *p = pre + (size_t)i * hc, *o = post + (size_t)i * hc, *C = comb + (size_t)i * hc * hc;
      st_hc_weights_from_mix(mix, base, scale, hc, hc_eps, sinkhorn_iters, p, o, C);
    }
  }
}

static void cpu_hc_collapse(void *ctx, float *x, const float *X, const float *pre, int n, int hc,
                            int D) {
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int i = 0; i < n; i++) {
    float *xi = x + (size_t)i * D;
    const float *Xi = X + (size_t)i * hc * D, *p = pre + (size_t)i * hc;
#pragma omp simd
    for (int k = 0; k < D; k++) xi[k] = 0;
    for (int a = 0; a < hc; a++) {
      float pa = p[a];
      const float *Xa = Xi + (size_t)a * D;
#pragma omp simd
      for (int k = 0; k < D; k++) xi[k] += pa * Xa[k];
    }
  }
}

static void cpu_hc_expand(void *ctx, float *Xout, const float *a, const float *X, const float *post,
                          const float *comb, int n, int hc, int D) {
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int i = 0; i < n; i++) {
    const float *C = comb + (size_t)i * hc * hc, *ai = a + (size_t)i * D;
    const float *Xi = X + (size_t)i * hc * D;
    for (int j = 0; j < hc; j++) {
      float *o = Xout + ((size_t)i * hc + j) * D, pj = post[(size_t)i * hc + j];
#pragma omp simd
      for (int k = 0; k < D; k++) o[k] = 0;
      for (int src = 0; src < hc; src++) {
        float cs = C[src * hc + j];
        const float *Xs = Xi + (size_t)src * D;
#pragma omp simd
        for (int k = 0; k < D; k++) o[k] += cs * Xs[k];
      }
#pragma omp simd
      for (int k = 0; k < D; k++) o[k] = pj * ai[k] + o[k];
    }
  }
}

static void cpu_hc_head(void *ctx, float *y, const float *X, const float *fn, const float *base,
                        const float *scale, int n, int hc, int D, float norm_eps, float hc_eps) {
  const cpu_ctx *c = ctx;
  int flat = hc * D;
  int tasks = (n + HC_ROWS - 1) / HC_ROWS;
#pragma omp parallel for schedule(static) num_threads(threads(c))
  for (int t = 0; t < tasks; t++) {
    int i0 = t * HC_ROWS, m = n - i0 < HC_ROWS ? n - i0 : HC_ROWS;
    const float *mixall = row_mixes(c, X + (size_t)i0 * flat, m, fn, hc, flat);
    for (int ii = 0; ii < m; ii++) {
      int i = i0 + ii;
      const float *x = X + (size_t)i * flat;
      float r = 1.0f / sqrtf(c->isa->dot(x, x, flat) / (float)flat + norm_eps);
      float pre[16];
      for (int a = 0; a < hc; a++)
        pre[a] = st_hc_sigmoid(mixall[(size_t)ii * hc + a] * r * scale[0] + base[a]) + hc_eps;
      float *yi = y + (size_t)i * D;
#pragma omp simd
      for (int k = 0; k < D; k++) yi[k] = 0;
      for (int a = 0; a < hc; a++) {
        float pa = pre[a];
        const float *xa = x + (size_t)a * D;
#pragma omp simd
        for (int k = 0; k < D; k++) yi[k] += pa * xa[k];
      }
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Compressor (SPEC §3.2)                                                                       */

static void cpu_compress(void *ctx, float *rows, float *state_kv, float *state_score,
                         const float *kv, const float *score, const float *ape, int n, int64_t p0,
                         int m, int d, int overlap) {
  int cd = (overlap ? 2 : 1) * d, slots = overlap ? 2 * m : m;
  for (int i = 0; i < n; i++) {
    int64_t t = p0 + i;
    int within = (int)(t % m), sl = overlap ? m + within : within;
    float *skv = state_kv + (size_t)sl * cd, *ssc = state_score + (size_t)sl * cd;
    const float *a = ape + (size_t)within * cd;
    memcpy(skv, kv + (size_t)i * cd, sizeof(float) * (size_t)cd);
    for (int k = 0; k < cd; k++) ssc[k] = score[(size_t)i * cd + k] + a[k];
    if ((t + 1) % m) continue;
    /* block j = t / m is complete: the previous block's slots read channel k at column k, this
    ** block's at column d + k (overlap, SPEC §3.2.1); one softmax over the slots per channel */
    float *row = rows + (size_t)(t / m) * d;
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
    for (int k = 0; k < d; k++) {
      float mx = -INFINITY, den = 0, num = 0;
      for (int s = 0; s < slots; s++) mx = fmaxf(mx, state_score[(size_t)s * cd + (overlap && s >= m ? d : 0) + k]);
      if (mx == -INFINITY) { row[k] = 0; continue; }
      for (int s = 0; s < slots; s++)
        den += expf(state_score[(size_t)s * cd + (overlap && s >= m ? d : 0) + k] - mx);
      for (int s = 0; s < slots; s++) {
        size_t at = (size_t)s * cd + (overlap && s >= m ? d : 0) + k;
        num += state_kv[at] * (expf(state_score[at] - mx) / den);
      }
      row[k] = num;
    }
    if (overlap) { /* this block becomes the previous block */
      memcpy(state_kv, state_kv + (size_t)m * cd, sizeof(float) * (size_t)m * cd);
      memcpy(state_score, state_score + (size_t)m * cd, sizeof(float) * (size_t)m * cd);
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Top-k: a running buffer per query (the k best so far plus newcomers), never a full row sort */

/* Strict total order on (key, index): higher key first, then lower index. */
static inline int better(cand a, cand b) { return a.key > b.key || (a.key == b.key && a.idx < b.idx); }

/* Moves the k best of v[0..n) to v[0..k) (any order): quickselect on the strict order. */
static void select_best(cand *v, int n, int k) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    cand pivot = v[lo + (hi - lo) / 2];
    int i = lo, j = hi;
    while (i <= j) {
      while (better(v[i], pivot)) i++;
      while (better(pivot, v[j])) j--;
      if (i <= j) { cand t = v[i]; v[i] = v[j]; v[j] = t; i++; j--; }
    }
    if (k - 1 <= j) hi = j;
    else if (k - 1 >= i) lo = i;
    else break;
  }
}

typedef struct running_topk {
  cand *v;
  int n, cap, k;
  int have_threshold; /* set once the buffer has overflowed: v holds >= k entries */
  float threshold;    /* the k-th best key so far: a newcomer (a higher index) must beat it */
} running_topk;

static void topk_compact(running_topk *t) {
  select_best(t->v, t->n, t->k);
  t->n = t->k;
  float worst = t->v[0].key;
  for (int a = 1; a < t->k; a++) worst = t->v[a].key < worst ? t->v[a].key : worst;
  t->threshold = worst;
  t->have_threshold = 1;
}

/* Offers scores s[0..count) of indices j0 .. j0 + count - 1 (ascending, above all offered). */
static inline void topk_offer(running_topk *t, const float *s, int j0, int count) {
  for (int a = 0; a < count; a++) {
    float key = s[a] != s[a] ? -INFINITY : s[a];
    if (t->have_threshold && !(key > t->threshold)) continue;
    t->v[t->n++] = (cand){key, j0 + a};
    if (t->n == t->cap) topk_compact(t);
  }
}

static int compare_int32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

static void topk_finish(running_topk *t, int32_t *out, int width) {
  if (t->n > t->k) select_best(t->v, t->n, t->k);
  int take = t->n < t->k ? t->n : t->k;
  for (int c = 0; c < take; c++) out[c] = t->v[c].idx;
  qsort(out, (size_t)take, sizeof *out, compare_int32);
  for (int c = take; c < width; c++) out[c] = -1;
}

static running_topk topk_start(void *work, int k, int width) {
  int kk = k < width ? k : width;
  if (kk < 0) kk = 0;
  running_topk t = {0};
  t.cap = (int)topk_slot_entries(kk);
  t.v = (cand *)work + (size_t)THREAD_ID() * (size_t)t.cap;
  t.k = kk;
  return t;
}

static void cpu_topk(void *ctx, int32_t *idx, const float *scores, int n, int rows, const int *visible,
                     int k, int width, void *work) {
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int i = 0; i < n; i++) {
    int vis = visible[i] < rows ? visible[i] : rows;
    running_topk t = topk_start(work, k, width);
    if (t.k > 0) topk_offer(&t, scores + (size_t)i * rows, 0, vis);
    topk_finish(&t, idx + (size_t)i * width, width);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Lightning indexer (SPEC §3.3)                                                                */

/* The head chunks of query i packed for the qk kernel: qT[chunk][k][hp] (hp lanes a chunk),
** w as wp[chunk][hp]; lanes beyond the heads are zeros. */
static void pack_query(float *qT, float *wp, const float *qi, const float *wi, int heads, int dim,
                       int chunks, int hp) {
  for (int ch = 0; ch < chunks; ch++) {
    float *dst = qT + (size_t)ch * dim * hp;
    for (int hh = 0; hh < hp; hh++) {
      int h = ch * hp + hh;
      wp[ch * hp + hh] = h < heads ? wi[h] : 0.0f;
      for (int k = 0; k < dim; k++) dst[(size_t)k * hp + hh] = h < heads ? qi[(size_t)h * dim + k] : 0.0f;
    }
  }
}

/* scores of query i for k rows [j0, j0 + count), count <= IDX_TILE */
static void indexer_tile(const cpu_ctx *c, float *out, const float *qT, const float *wp,
                         const float *k, int j0, int count, int dim, int chunks, int hp) {
  const float *rows[IDX_TILE];
  float lanes[IDX_TILE * 16];
  for (int a = 0; a < count; a++) rows[a] = k + (size_t)(j0 + a) * dim;
  memset(lanes, 0, sizeof(float) * 16 * (size_t)count);
  for (int ch = 0; ch < chunks; ch++)
    c->isa->qk(lanes, qT + (size_t)ch * dim * hp, hp, rows, count, dim, wp + ch * hp, 1.0f);
  for (int a = 0; a < count; a++) out[a] = st_cpu_tree16(lanes + 16 * a);
}

/* hp: the padded width of the chunk (one chunk of fewer heads than CPU_HCHUNK uses fewer
** lanes; zero lanes add nothing but fma(0, 0, s) — the same bits either way). */
static int chunk_lanes(int heads) { return heads >= CPU_HCHUNK ? CPU_HCHUNK : (heads + 15) / 16 * 16; }

static void cpu_indexer_scores(void *ctx, float *scores, const float *q, const float *w,
                               const float *k, int n, int rows, int heads, int dim, const int *visible) {
  const cpu_ctx *c = ctx;
  int chunks = (heads + CPU_HCHUNK - 1) / CPU_HCHUNK, hp = chunks > 1 ? CPU_HCHUNK : chunk_lanes(heads);
  ST_ASSERT((size_t)chunks * CPU_HCHUNK * (dim + 1) <= SLOT_FLOATS);
#pragma omp parallel for schedule(static, 1) num_threads(threads(c))
  for (int i = 0; i < n; i++) {
    float *qT = slot(c), *wp = qT + (size_t)chunks * hp * dim;
    pack_query(qT, wp, q + (size_t)i * heads * dim, w + (size_t)i * heads, heads, dim, chunks, hp);
    int vis = visible[i] < rows ? visible[i] : rows;
    float *out = scores + (size_t)i * rows;
    for (int j = 0; j < vis; j += IDX_TILE)
      indexer_tile(c, out + j, qT, wp, k, j, vis - j < IDX_TILE ? vis - j : IDX_TILE, dim, chunks, hp);
    for (int j = vis < 0 ? 0 : vis; j < rows; j++) out[j] = -INFINITY;
  }
}

static void cpu_indexer_topk(void *ctx, int32_t *idx, const float *q, const float *w, const float *k,
                             int n, int rows, int heads, int dim, const int *visible, int topk,
                             int width, void *work) {
  const cpu_ctx *c = ctx;
  int chunks = (heads + CPU_HCHUNK - 1) / CPU_HCHUNK, hp = chunks > 1 ? CPU_HCHUNK : chunk_lanes(heads);
  ST_ASSERT((size_t)chunks * CPU_HCHUNK * (dim + 1) <= SLOT_FLOATS);
#pragma omp parallel for schedule(static, 1) num_threads(threads(c))
  for (int i = 0; i < n; i++) {
    running_topk t = topk_start(work, topk, width);
    int vis = visible[i] < rows ? visible[i] : rows;
    if (t.k > 0 && vis > 0) {
      float *qT = slot(c), *wp = qT + (size_t)chunks * hp * dim;
      pack_query(qT, wp, q + (size_t)i * heads * dim, w + (size_t)i * heads, heads, dim, chunks, hp);
      float s[IDX_TILE];
      for (int j = 0; j < vis; j += IDX_TILE) {
        int count = vis - j < IDX_TILE ? vis - j : IDX_TILE;
        indexer_tile(c, s, qT, wp, k, j, count, dim, chunks, hp);
        topk_offer(&t, s, j, count);
      }
    }
    topk_finish(&t, idx + (size_t)i * width, width);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Attention (SPEC §3.4)                                                                        */

static void cpu_candidates(void *ctx, int32_t *cand_out, const int32_t *topk, int n, int64_t p0,
                           int window, int width, int32_t compressed_base, int ratio) {
  int total = window + width;
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int i = 0; i < n; i++) {
    int64_t t = p0 + i;
    int32_t *cc = cand_out + (size_t)i * total;
    for (int k = 0; k < window; k++) {
      int64_t pos = t - window + 1 + k;
      cc[k] = pos < 0 ? -1 : pos >= p0 ? (int32_t)(window + (pos - p0)) : (int32_t)(pos % window);
    }
    if (topk) {
      for (int j = 0; j < width; j++) {
        int32_t row = topk[(size_t)i * width + j];
        cc[window + j] = row >= 0 ? compressed_base + row : -1;
      }
    } else {
      int64_t visible = (t + 1) / ratio;
      for (int j = 0; j < width; j++) cc[window + j] = j < visible ? compressed_base + j : -1;
    }
  }
}

static void cpu_sparse_attention(void *ctx, float *out, const float *q, const float *kv,
                                 const int32_t *cand_idx, int n, int heads, int d, int width,
                                 const float *sinks, float scale, int probs_bf16) {
  const cpu_ctx *c = ctx;
  int T = threads(c);
  /* head chunks: 64 lanes, fewer when there are too few queries to busy every thread */
  int hchunk = CPU_HCHUNK;
  while (hchunk > 16 && (int64_t)n * ((heads + hchunk - 1) / hchunk) < 2 * T) hchunk /= 2;
  if (hchunk > (heads + 15) / 16 * 16) hchunk = (heads + 15) / 16 * 16;
  /* slot: qT [d][hchunk], logits [width][hchunk], candidate row pointers */
  while (hchunk > 16 && (size_t)hchunk * (d + width) + 2 * (size_t)width + 16 > SLOT_FLOATS) hchunk /= 2;
  ST_ASSERT((size_t)hchunk * (d + width) + 2 * (size_t)width + 16 <= SLOT_FLOATS);
  int chunks = (heads + hchunk - 1) / hchunk;
  int64_t tasks = (int64_t)n * chunks;
#pragma omp parallel for schedule(static) num_threads(T)
  for (int64_t task = 0; task < tasks; task++) {
    int i = (int)(task / chunks), h0 = (int)(task % chunks) * hchunk;
    int hn = heads - h0 < hchunk ? heads - h0 : hchunk;
    float *qT = slot(c), *logit = qT + (size_t)hchunk * d;
    const float **rows = (const float **)(void *)(logit + (size_t)hchunk * width + 16);
    const int32_t *ci = cand_idx + (size_t)i * width;
    int nv = 0;
    for (int a = 0; a < width; a++)
      if (ci[a] >= 0) rows[nv++] = kv + (size_t)ci[a] * d;
    for (int hh = 0; hh < hchunk; hh++) {
      const float *qh = q + ((size_t)i * heads + h0 + hh) * d;
      for (int k = 0; k < d; k++) qT[(size_t)k * hchunk + hh] = hh < hn ? qh[k] : 0.0f;
    }
    c->isa->qk(logit, qT, hchunk, rows, nv, d, NULL, scale); /* logit[c][hh] */
    for (int hh = 0; hh < hn; hh++) {
      float sink = sinks[h0 + hh], mx = sink, den = 0;
      for (int a = 0; a < nv; a++) mx = fmaxf(mx, logit[(size_t)a * hchunk + hh]);
      for (int a = 0; a < nv; a++) {
        float *l = logit + (size_t)a * hchunk + hh;
        den += (*l = expf(*l - mx));
      }
      den += expf(sink - mx);
      for (int a = 0; a < nv; a++) {
        float *l = logit + (size_t)a * hchunk + hh;
        float p = *l / den;
        *l = probs_bf16 ? st_round_bf16(p) : p;
      }
    }
    c->isa->av(out + ((size_t)i * heads + h0) * d, d, logit, hchunk, hn, rows, nv, d);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* MoE (SPEC §2.5)                                                                              */

static void cpu_moe_route(void *ctx, int32_t *experts, float *weights, float *logits,
                          const float *bias, const int32_t *hash_experts, int n, int E, int kE,
                          float route_scale) {
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int i = 0; i < n; i++)
    st_moe_route_token(logits + (size_t)i * E, bias, hash_experts ? hash_experts + (size_t)i * kE : NULL,
                       E, kE, route_scale, experts + (size_t)i * kE, weights + (size_t)i * kE);
}

static void cpu_gather_rows(void *ctx, float *dst, const float *src, const int32_t *rows, int count,
                            int D) {
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int a = 0; a < count; a++)
    memcpy(dst + (size_t)a * D, src + (size_t)rows[a] * D, sizeof(float) * (size_t)D);
}

static void cpu_scatter_add(void *ctx, float *out, const float *y, const int32_t *rows,
                            const float *weight, int count, int D) {
  /* one thread per block of columns keeps each element's additions in the order of k */
  int blocks = (D + 63) / 64;
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (int b = 0; b < blocks; b++) {
    int c0 = b * 64, c1 = D - c0 < 64 ? D : c0 + 64;
    for (int a = 0; a < count; a++) {
      float *o = out + (size_t)rows[a] * D;
      const float *ya = y + (size_t)a * D;
      float wa = weight[a];
#pragma omp simd
      for (int cc = c0; cc < c1; cc++) o[cc] += ya[cc] * wa;
    }
  }
}

static void cpu_swiglu(void *ctx, float *h, const float *g, const float *u, int n, int F, float limit) {
  size_t count = (size_t)n * F;
#pragma omp parallel for schedule(static) num_threads(threads(ctx))
  for (size_t at = 0; at < count; at++) {
    float gv = fminf(g[at], limit);
    float uv = fminf(fmaxf(u[at], -limit), limit);
    h[at] = gv / (1.0f + expf(-gv)) * uv;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* The table                                                                                    */

const st_backend_ops st_backend_cpu_ops = {
  .name = "cpu",
  .kernel_mode = "deterministic",
  .host_memory = 1,
  .close = cpu_close,
  .describe = cpu_describe,
  .supports = cpu_supports,
  .workspace_size = cpu_workspace_size,
  .alloc = cpu_alloc,
  .free = cpu_free,
  .upload = cpu_upload,
  .download = cpu_download,
  .copy = cpu_copy,
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
  .indexer_topk = cpu_indexer_topk,
  .candidates = cpu_candidates,
  .sparse_attention = cpu_sparse_attention,
  .moe_route = cpu_moe_route,
  .gather_rows = cpu_gather_rows,
  .scatter_add = cpu_scatter_add,
  .swiglu = cpu_swiglu,
  .moe_experts = NULL,
};

/* The best kernels this machine runs, or those ST_CPU_ISA names (when the machine runs them). */
static const cpu_isa *choose_isa(const char **note) {
  const char *want = getenv("ST_CPU_ISA");
  *note = "";
#ifdef ST_CPU_HAVE_X86
  __builtin_cpu_init();
  int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
  if (want && *want) {
    if (!strcmp(want, "portable")) return &st_cpu_isa_portable;
    if (!strcmp(want, "avx2") && avx2) return &st_cpu_isa_avx2;
    if (!strcmp(want, "avx512") && avx512) return &st_cpu_isa_avx512;
    *note = " (ST_CPU_ISA not available here)";
  }
  if (avx512) return &st_cpu_isa_avx512;
  if (avx2) return &st_cpu_isa_avx2;
#else
  if (want && *want && strcmp(want, "portable")) *note = " (ST_CPU_ISA not available here)";
#endif
  return &st_cpu_isa_portable;
}

st_status st_backend_cpu_open(st_backend *out) {
  memset(out, 0, sizeof *out);
  cpu_ctx *c = calloc(1, sizeof *c);
  if (!c) return st_fail(ST_ENOMEM, "cpu backend: out of memory");
  const char *note;
  c->isa = choose_isa(&note);
  int t = omp_get_max_threads(), p = omp_get_num_procs();
  c->slots = t > p ? t : p;
  if (c->slots < 1) c->slots = 1;
  c->scratch = aligned_alloc(64, (size_t)c->slots * SLOT_FLOATS * sizeof(float));
  if (!c->scratch) {
    int mib = c->slots * 4;
    free(c);
    return st_fail(ST_ENOMEM, "cpu backend: cannot allocate %d MiB of scratch", mib);
  }
  snprintf(c->description, sizeof c->description, "%s%s, %d threads", c->isa->name, note,
           omp_get_max_threads() < c->slots ? omp_get_max_threads() : c->slots);
  out->ops = &st_backend_cpu_ops;
  out->ctx = c;
  return ST_OK;
}
