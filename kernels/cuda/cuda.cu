/*
** cuda.cu — the cuda backend (and, compiled by hipcc with -DST_HIP, the hip backend): every
** operation of kernels/backend.h as a GPU kernel on one stream, weights decoded from their stored
** formats inside the kernels (kernels/lowp.h's arithmetic, the same values cpu-ref decodes).
**
** Determinism (the header's rule). Every output element is written by one thread, and every
** reduction runs in an order fixed by the reduction's length alone: a thread's sequential loop,
** or a shared-memory tree over a fixed 256 threads. Nothing depends on the token count, the grid,
** the number of SMs or timing: no float atomics (the only atomics are integer histogram counts in
** top-k, whose totals do not depend on their order), no split-K, one kernel per operation. So a
** token's outputs are the same bits whether it runs alone or in a chunk of 8192, and run to run.
** No fast math: nvcc's default contraction of a*b+c into fma is kept (it is deterministic), which
** is why this backend's bits differ from cpu-ref's within tests/test_backend_ops.c's budgets.
**
** Memory. alloc is cudaMalloc plus a zero fill on the stream; upload and download copy on the
** stream and wait (the engine reuses its host buffers at once); copy and every kernel are queued.
** A failure (a launch, a copy, an unsupported shape) is latched in the context with the op's name
** and returned by the next synchronize or download.
**
** What is plain here and fast later (bench/ says how far from the peaks): the GEMMs are fp32 SIMT
** tiles with the weights decoded while staging (exact mode); reference mode rounds activations
** through the quantize op exactly as on the CPU, then multiplies in fp32 too.
*/
#include "kernels/cuda/vendor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/base.h"
#include "kernels/backend.h"
}
#include "kernels/hc.h"
#include "kernels/lowp.h"
#include "kernels/moe.h"

#if defined(ST_HIP)
#define BACKEND_NAME "hip"
#define OPEN_FN st_backend_hip_open
#else
#define BACKEND_NAME "cuda"
#define OPEN_FN st_backend_cuda_open
#endif

/* ------------------------------------------------------------------------------------------ */
/* Context, errors                                                                              */

typedef struct gpu_ctx {
  int device;
  gpuStream_t stream;
  size_t smem_optin; /* the most dynamic shared memory one block may have */
  st_status error;   /* the first failure, latched */
  char error_text[320];
  char description[320];
} gpu_ctx;

static void latch(gpu_ctx *c, const char *op, const char *what) {
  if (c->error) return;
  c->error = ST_EBACKEND;
  snprintf(c->error_text, sizeof c->error_text, "%s: %s: %s", BACKEND_NAME, op, what);
}

/* After a launch (or a runtime call) of op: latches the runtime's error, if any. */
static void check(gpu_ctx *c, const char *op, gpuError_t e) {
  if (e != gpuSuccess) latch(c, op, gpuGetErrorString(e));
}
#define LAUNCHED(c, op) check(c, op, gpuGetLastError())

static st_status latched(gpu_ctx *c) {
  return c->error ? st_fail(c->error, "%s", c->error_text) : ST_OK;
}

static inline unsigned blocks_for(size_t count, unsigned threads) {
  size_t b = (count + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : b > 0x7fffffffu ? 0x7fffffffu : b);
}

/* ------------------------------------------------------------------------------------------ */
/* Weight decoding (the values of kernels/weight.h st_weight_decode)                            */

/* Index arithmetic in 32 bits where it is a block number (rows and columns of one matrix stay
** below 2^31): a 64-bit division costs a hundred instructions in a GEMM's staging loop. */
static __device__ __forceinline__ float wscale(const st_weight &w, int64_t r, int64_t c) {
  if (w.scale_dtype == ST_WSCALE_NONE) return 1.0f;
  int scale_cols = ((int)w.cols + w.block[1] - 1) / w.block[1];
  int64_t at = (int64_t)((int)r / w.block[0]) * scale_cols + (int)c / w.block[1];
  const unsigned char *s = (const unsigned char *)w.scales;
  switch (w.scale_dtype) {
  case ST_WSCALE_F32: return ((const float *)s)[at];
  case ST_WSCALE_BF16: return st_bf16_to_f32(((const uint16_t *)s)[at]);
  case ST_WSCALE_UE8M0: return st_e8m0_to_f32(s[at]);
  default: return 1.0f;
  }
}

static __device__ __forceinline__ float wget(const st_weight &w, int64_t r, int64_t c) {
  const unsigned char *p = (const unsigned char *)w.data;
  switch (w.dtype) {
  case ST_W_F32: return ((const float *)p)[r * w.cols + c];
  case ST_W_BF16: return st_bf16_to_f32(((const uint16_t *)p)[r * w.cols + c]);
  case ST_W_F16: return st_f16_to_f32(((const uint16_t *)p)[r * w.cols + c]);
  case ST_W_FP8_E4M3: return st_fp8_e4m3fn_to_f32(p[r * w.cols + c]) * wscale(w, r, c);
  case ST_W_FP4_E2M1: {
    unsigned char b = p[r * (w.cols / 2) + c / 2];
    return st_fp4_e2m1_to_f32((c & 1) ? (b >> 4) : (b & 0xf)) * wscale(w, r, c);
  }
  default: return 0.0f;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Reductions: 256 threads, a fixed tree                                                        */

#define RT 256 /* threads of every block-reducing kernel */

/* Sum of v over the block's RT threads, in a fixed tree; every thread gets the result. */
static __device__ float block_sum(float v, float *sh) {
  int t = threadIdx.x;
  __syncthreads(); /* sh may still be read from the previous call */
  sh[t] = v;
  __syncthreads();
  for (int s = RT / 2; s > 0; s >>= 1) {
    if (t < s) sh[t] += sh[t + s];
    __syncthreads();
  }
  return sh[0];
}

/* Each thread's strided partial dot product, then the block's tree: a fixed order for a length. */
static __device__ float block_dot(const float *a, const float *b, int n, float *sh) {
  float s = 0;
  for (int k = threadIdx.x; k < n; k += RT) s += a[k] * b[k];
  return block_sum(s, sh);
}

/* ------------------------------------------------------------------------------------------ */
/* GEMM: y[n, groups r] = x[n, groups c] . W^T per group, W decoded while staging               */

#define GM 128 /* tokens per tile */
#define GN 128 /* outputs per tile */
#define GK 8   /* reduction step */

/* 256 threads; thread (ty, tx) owns tokens ty + 16 a and outputs tx + 16 b (a, b < 8), each an
** fp32 accumulator over k = 0, 1, ... in order: the sum does not depend on the tiling. */
static __global__ void __launch_bounds__(256) k_gemm(float *y, const float *x, st_weight w, int n,
                                                     int r, int c, int groups) {
  __shared__ float xs[GK][GM];
  __shared__ float ws[GK][GN];
  int g = blockIdx.z, tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  int64_t m0 = (int64_t)blockIdx.y * GM, o0 = (int64_t)blockIdx.x * GN;
  int64_t ldx = (int64_t)groups * c, ldy = (int64_t)groups * r;
  const float *xg = x + (int64_t)g * c;
  int64_t wrow0 = (int64_t)g * r;
  float acc[8][8];
#pragma unroll
  for (int a = 0; a < 8; a++)
#pragma unroll
    for (int b = 0; b < 8; b++) acc[a][b] = 0;
  for (int k0 = 0; k0 < c; k0 += GK) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
      int e = tid + 256 * q, m = e / GK, kk = e % GK;
      int64_t row = m0 + m, k = k0 + kk;
      xs[kk][m] = row < n && k < c ? xg[row * ldx + k] : 0.0f;
      int64_t o = o0 + m;
      ws[kk][m] = o < r && k < c ? wget(w, wrow0 + o, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < GK; kk++) {
      float av[8], bv[8];
#pragma unroll
      for (int a = 0; a < 8; a++) av[a] = xs[kk][ty + 16 * a];
#pragma unroll
      for (int b = 0; b < 8; b++) bv[b] = ws[kk][tx + 16 * b];
#pragma unroll
      for (int a = 0; a < 8; a++)
#pragma unroll
        for (int b = 0; b < 8; b++) acc[a][b] += av[a] * bv[b];
    }
    __syncthreads();
  }
#pragma unroll
  for (int a = 0; a < 8; a++) {
    int64_t row = m0 + ty + 16 * a;
    if (row >= n) continue;
#pragma unroll
    for (int b = 0; b < 8; b++) {
      int64_t o = o0 + tx + 16 * b;
      if (o < r) y[row * ldy + (int64_t)g * r + o] = acc[a][b];
    }
  }
}

static void gemm(gpu_ctx *c, const char *op, float *y, const float *x, const st_weight *w, int n,
                 int groups) {
  if (n <= 0 || w->rows <= 0) return;
  int r = (int)(w->rows / groups), cols = (int)w->cols;
  dim3 grid(blocks_for((size_t)r, GN), blocks_for((size_t)n, GM), (unsigned)groups);
  k_gemm<<<grid, 256, 0, c->stream>>>(y, x, *w, n, r, cols, groups);
  LAUNCHED(c, op);
}

static void gpu_matmul(void *ctx, float *y, const float *x, const st_weight *w, int n) {
  gemm((gpu_ctx *)ctx, "matmul", y, x, w, n, 1);
}

static void gpu_matmul_grouped(void *ctx, float *y, const float *x, const st_weight *w, int n,
                               int groups) {
  gemm((gpu_ctx *)ctx, "matmul_grouped", y, x, w, n, groups);
}

/* ------------------------------------------------------------------------------------------ */
/* Element-wise and per-row operations                                                          */

static __global__ void k_embed(float *X, st_weight table, const int32_t *tokens, int n, int hc) {
  int64_t D = table.cols, at = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (int64_t)n * D) return;
  int64_t i = at / D, k = at % D;
  float v = wget(table, tokens[i], k);
  for (int a = 0; a < hc; a++) X[(i * hc + a) * D + k] = v;
}

static void gpu_embed(void *ctx, float *X, const st_weight *table, const int32_t *tokens, int n,
                      int hc) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0) return;
  size_t count = (size_t)n * (size_t)table->cols;
  k_embed<<<blocks_for(count, 256), 256, 0, c->stream>>>(X, *table, tokens, n, hc);
  LAUNCHED(c, "embed");
}

static __global__ void __launch_bounds__(RT) k_rmsnorm(float *y, const float *x, const float *weight,
                                                       int dim, float eps) {
  __shared__ float sh[RT];
  const float *xi = x + (int64_t)blockIdx.x * dim;
  float *yi = y + (int64_t)blockIdx.x * dim;
  float mean = block_dot(xi, xi, dim, sh) / (float)dim;
  float r = 1.0f / sqrtf(mean + eps);
  __syncthreads(); /* y may be x: every thread has read its part before any is written */
  for (int k = threadIdx.x; k < dim; k += RT) yi[k] = weight ? weight[k] * (xi[k] * r) : xi[k] * r;
}

static void gpu_rmsnorm(void *ctx, float *y, const float *x, const float *weight, int n, int dim,
                        float eps) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0) return;
  k_rmsnorm<<<n, RT, 0, c->stream>>>(y, x, weight, dim, eps);
  LAUNCHED(c, "rmsnorm");
}

static __global__ void k_rope(float *x, int n, int heads, int head_dim, int rope_dim,
                              const int64_t *positions, const float *cos_table,
                              const float *sin_table, int neox, int inverse) {
  int half = rope_dim / 2;
  int64_t at = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (int64_t)n * heads * half) return;
  int p = (int)(at % half);
  int64_t vh = at / half, i = vh / heads;
  float *v = x + vh * head_dim + (head_dim - rope_dim);
  float cs = cos_table[positions[i] * half + p], sn = sin_table[positions[i] * half + p];
  if (inverse) sn = -sn;
  int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
  float x0 = v[a], x1 = v[b];
  v[a] = x0 * cs + (-x1) * sn;
  v[b] = x1 * cs + x0 * sn;
}

static void gpu_rope(void *ctx, float *x, int n, int heads, int head_dim, int rope_dim,
                     const int64_t *positions, const float *cos_table, const float *sin_table,
                     int neox, int inverse) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  size_t count = (size_t)n * heads * (rope_dim / 2);
  if (!count) return;
  k_rope<<<blocks_for(count, 256), 256, 0, c->stream>>>(x, n, heads, head_dim, rope_dim, positions,
                                                       cos_table, sin_table, neox, inverse);
  LAUNCHED(c, "rope");
}

/* One row per block in shared memory; each butterfly is a + b, a - b: the same bits as cpu-ref's
** in-place transform whatever order a stage's pairs run in. */
static __global__ void k_hadamard(float *x, int dim, float scale) {
  extern __shared__ float v[];
  float *row = x + (int64_t)blockIdx.x * dim;
  for (int k = threadIdx.x; k < dim; k += blockDim.x) v[k] = row[k];
  __syncthreads();
  for (int len = 1; len < dim; len <<= 1) {
    for (int q = threadIdx.x; q < dim / 2; q += blockDim.x) {
      int k = (q / len) * 2 * len + q % len;
      float a = v[k], b = v[k + len];
      v[k] = a + b;
      v[k + len] = a - b;
    }
    __syncthreads();
  }
  for (int k = threadIdx.x; k < dim; k += blockDim.x) row[k] = v[k] * scale;
}

static void gpu_hadamard(void *ctx, float *x, int n, int dim) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0) return;
  size_t bytes = sizeof(float) * (size_t)dim;
  if (bytes > 48 * 1024) {
    latch(c, "hadamard", "dim above 12288 is not supported");
    return;
  }
  k_hadamard<<<n, 256, bytes, c->stream>>>(x, dim, 1.0f / sqrtf((float)dim));
  LAUNCHED(c, "hadamard");
}

static __global__ void k_round_bf16(float *x, size_t count) {
  size_t at = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at < count) x[at] = st_round_bf16(x[at]);
}

static void gpu_round_bf16(void *ctx, float *x, size_t count) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (!count) return;
  k_round_bf16<<<blocks_for(count, 256), 256, 0, c->stream>>>(x, count);
  LAUNCHED(c, "round_bf16");
}

/* One thread per (row, block): the block's round trip runs sequentially, in kernels/lowp.h. */
static __global__ void k_quantize(float *x, int rows, int64_t stride, int len, int block,
                                  int blocks_per_row, st_qformat format, int ue8m0) {
  int64_t at = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (int64_t)rows * blocks_per_row) return;
  int64_t r = at / blocks_per_row;
  int b0 = (int)(at % blocks_per_row) * block;
  int m = len - b0 < block ? len - b0 : block;
  float *p = x + r * stride + b0;
  switch (format) {
  case ST_Q_BF16: st_bf16_roundtrip(p, (size_t)m); break;
  case ST_Q_FP8_E4M3FN: st_fp8_roundtrip_blocks(p, m, m, ue8m0, 0); break;
  case ST_Q_FP8_E4M3FNUZ: st_fp8_roundtrip_blocks(p, m, m, ue8m0, 1); break;
  case ST_Q_FP8_FN_AS_FNUZ: st_fp8_fn_as_fnuz_blocks(p, m, m); break;
  case ST_Q_FP4_E2M1: st_fp4_roundtrip_blocks(p, m, m); break;
  }
}

static void gpu_quantize(void *ctx, float *x, int rows, int64_t stride, int len, int block,
                         st_qformat format, int ue8m0) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (rows <= 0 || len <= 0) return;
  if (block <= 0 || block > len) block = len;
  if (format == ST_Q_BF16) block = len < 32 ? len : 32; /* per element: any split is the same */
  int per_row = (len + block - 1) / block;
  size_t count = (size_t)rows * per_row;
  k_quantize<<<blocks_for(count, 128), 128, 0, c->stream>>>(x, rows, stride, len, block, per_row,
                                                           format, ue8m0);
  LAUNCHED(c, "quantize");
}

static __global__ void k_add(float *y, const float *a, const float *b, size_t count) {
  size_t at = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at < count) y[at] = a[at] + b[at];
}
static __global__ void k_scale(float *x, float s, size_t count) {
  size_t at = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at < count) x[at] *= s;
}
static __global__ void k_fill(float *x, float value, size_t count) {
  size_t at = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at < count) x[at] = value;
}

static void gpu_add(void *ctx, float *y, const float *a, const float *b, size_t count) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (!count) return;
  k_add<<<blocks_for(count, 256), 256, 0, c->stream>>>(y, a, b, count);
  LAUNCHED(c, "add");
}
static void gpu_scale(void *ctx, float *x, float s, size_t count) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (!count) return;
  k_scale<<<blocks_for(count, 256), 256, 0, c->stream>>>(x, s, count);
  LAUNCHED(c, "scale");
}
static void gpu_fill(void *ctx, float *x, float value, size_t count) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (!count) return;
  k_fill<<<blocks_for(count, 256), 256, 0, c->stream>>>(x, value, count);
  LAUNCHED(c, "fill");
}

/* ------------------------------------------------------------------------------------------ */
/* mHC                                                                                          */

#define MAX_HC 16

static __global__ void __launch_bounds__(RT) k_hc_weights(float *pre, float *post, float *comb,
    const float *X, const float *fn, const float *base, const float *scale, int hc, int D,
    float norm_eps, float hc_eps, int sinkhorn_iters) {
  __shared__ float sh[RT];
  __shared__ float mix[(2 + MAX_HC) * MAX_HC];
  int i = blockIdx.x, flat = hc * D, mixes = (2 + hc) * hc;
  const float *x = X + (int64_t)i * flat;
  float r = 1.0f / sqrtf(block_dot(x, x, flat, sh) / (float)flat + norm_eps);
  for (int m = 0; m < mixes; m++) {
    float d = block_dot(x, fn + (int64_t)m * flat, flat, sh);
    if (threadIdx.x == 0) mix[m] = d * r;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    st_hc_weights_from_mix(mix, base, scale, hc, hc_eps, sinkhorn_iters, pre + (int64_t)i * hc,
                           post + (int64_t)i * hc, comb + (int64_t)i * hc * hc);
}

static void gpu_hc_weights(void *ctx, float *pre, float *post, float *comb, const float *X,
                           const float *fn, const float *base, const float *scale, int n, int hc,
                           int D, float norm_eps, float hc_eps, int sinkhorn_iters) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0) return;
  if (hc > MAX_HC) {
    latch(c, "hc_weights", "more than 16 streams");
    return;
  }
  k_hc_weights<<<n, RT, 0, c->stream>>>(pre, post, comb, X, fn, base, scale, hc, D, norm_eps,
                                        hc_eps, sinkhorn_iters);
  LAUNCHED(c, "hc_weights");
}

static __global__ void k_hc_collapse(float *x, const float *X, const float *pre, int n, int hc, int D) {
  int64_t at = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (int64_t)n * D) return;
  int64_t i = at / D, k = at % D;
  float s = 0;
  for (int a = 0; a < hc; a++) s += pre[i * hc + a] * X[(i * hc + a) * D + k];
  x[at] = s;
}

static void gpu_hc_collapse(void *ctx, float *x, const float *X, const float *pre, int n, int hc,
                            int D) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  size_t count = (size_t)n * D;
  if (!count) return;
  k_hc_collapse<<<blocks_for(count, 256), 256, 0, c->stream>>>(x, X, pre, n, hc, D);
  LAUNCHED(c, "hc_collapse");
}

static __global__ void k_hc_expand(float *Xout, const float *a, const float *X, const float *post,
                                   const float *comb, int n, int hc, int D) {
  int64_t at = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (int64_t)n * hc * D) return;
  int64_t k = at % D, ij = at / D, i = ij / hc;
  int j = (int)(ij % hc);
  const float *C = comb + i * hc * hc;
  float s = 0;
  for (int src = 0; src < hc; src++) s += C[src * hc + j] * X[(i * hc + src) * D + k];
  Xout[at] = post[i * hc + j] * a[i * D + k] + s;
}

static void gpu_hc_expand(void *ctx, float *Xout, const float *a, const float *X, const float *post,
                          const float *comb, int n, int hc, int D) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  size_t count = (size_t)n * hc * D;
  if (!count) return;
  k_hc_expand<<<blocks_for(count, 256), 256, 0, c->stream>>>(Xout, a, X, post, comb, n, hc, D);
  LAUNCHED(c, "hc_expand");
}

static __global__ void __launch_bounds__(RT) k_hc_head(float *y, const float *X, const float *fn,
    const float *base, const float *scale, int hc, int D, float norm_eps, float hc_eps) {
  __shared__ float sh[RT];
  __shared__ float pre[MAX_HC];
  int i = blockIdx.x, flat = hc * D;
  const float *x = X + (int64_t)i * flat;
  float r = 1.0f / sqrtf(block_dot(x, x, flat, sh) / (float)flat + norm_eps);
  for (int a = 0; a < hc; a++) {
    float d = block_dot(x, fn + (int64_t)a * flat, flat, sh);
    if (threadIdx.x == 0) pre[a] = st_hc_sigmoid(d * r * scale[0] + base[a]) + hc_eps;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < D; k += RT) {
    float s = 0;
    for (int a = 0; a < hc; a++) s += pre[a] * x[(int64_t)a * D + k];
    y[(int64_t)i * D + k] = s;
  }
}

static void gpu_hc_head(void *ctx, float *y, const float *X, const float *fn, const float *base,
                        const float *scale, int n, int hc, int D, float norm_eps, float hc_eps) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0) return;
  if (hc > MAX_HC) {
    latch(c, "hc_head", "more than 16 streams");
    return;
  }
  k_hc_head<<<n, RT, 0, c->stream>>>(y, X, fn, base, scale, hc, D, norm_eps, hc_eps);
  LAUNCHED(c, "hc_head");
}

/* ------------------------------------------------------------------------------------------ */
/* Compressor (SPEC §3.2): every block completed in the chunk pooled at once, then the state     */
/* rewritten to what cpu-ref's token-by-token walk leaves                                       */

/* Where slot s of the pooling of block j reads token u, column col (k or d + k): from the chunk
** when u >= p0 (score plus ape), else from the state as it was before the chunk, at slot S. */
struct comp_args {
  float *rows, *state_kv, *state_score;
  const float *kv, *score, *ape;
  int n, m, d, cd, overlap;
  int64_t p0;
};

static __device__ __forceinline__ void comp_read(const comp_args &A, int64_t u, int S, int col,
                                                 float *kv, float *score) {
  if (u >= A.p0) {
    int64_t i = u - A.p0;
    *kv = A.kv[i * A.cd + col];
    *score = A.score[i * A.cd + col] + A.ape[(int64_t)(u % A.m) * A.cd + col];
  } else {
    *kv = A.state_kv[(int64_t)S * A.cd + col];
    *score = A.state_score[(int64_t)S * A.cd + col];
  }
}

/* Slot s of block j: its token, state slot and column (the CSA layout of backend.h). */
static __device__ __forceinline__ void comp_slot(const comp_args &A, int64_t j, int s, int k,
                                                 int64_t *u, int *S, int *col) {
  int m = A.m;
  if (!A.overlap) {
    *u = j * m + s, *S = s, *col = k;
  } else if (s < m) { /* the previous block: in the state's [0, m) if it completed before p0 */
    *u = (j - 1) * m + s, *S = j * m <= A.p0 ? s : m + s, *col = k;
  } else {
    *u = j * m + (s - m), *S = s, *col = A.d + k;
  }
}

static __global__ void k_compress_pool(comp_args A, int64_t j_first) {
  int k = blockIdx.y * blockDim.x + threadIdx.x;
  if (k >= A.d) return;
  int64_t j = j_first + blockIdx.x;
  int slots = A.overlap ? 2 * A.m : A.m;
  float mx = -INFINITY;
  for (int s = 0; s < slots; s++) {
    int64_t u; int S, col; float kv, sc;
    comp_slot(A, j, s, k, &u, &S, &col);
    comp_read(A, u, S, col, &kv, &sc);
    mx = fmaxf(mx, sc);
  }
  float *row = A.rows + j * A.d;
  if (mx == -INFINITY) { row[k] = 0; return; }
  float den = 0, num = 0;
  for (int s = 0; s < slots; s++) {
    int64_t u; int S, col; float kv, sc;
    comp_slot(A, j, s, k, &u, &S, &col);
    comp_read(A, u, S, col, &kv, &sc);
    den += expf(sc - mx);
  }
  for (int s = 0; s < slots; s++) {
    int64_t u; int S, col; float kv, sc;
    comp_slot(A, j, s, k, &u, &S, &col);
    comp_read(A, u, S, col, &kv, &sc);
    num += kv * (expf(sc - mx) / den);
  }
  row[k] = num;
}

/* Overlapping layout, slots [0, m): the last block completed in the chunk (L) moved there. Runs
** before k_compress_store, which rewrites the slots [m, 2m) this reads. */
static __global__ void k_compress_move(comp_args A, int64_t L) {
  int64_t at = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (int64_t)A.m * A.cd) return;
  int s = (int)(at / A.cd), col = (int)(at % A.cd);
  float kv, sc;
  comp_read(A, L * A.m + s, A.m + s, col, &kv, &sc);
  A.state_kv[at] = kv;
  A.state_score[at] = sc;
}

/* The slots tokens are stored in ([0, m), or [m, 2m) when overlapping): each holds the latest
** token of its residue class, from the chunk when that token is in it. */
static __global__ void k_compress_store(comp_args A) {
  int64_t at = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (int64_t)A.m * A.cd) return;
  int s = (int)(at / A.cd), col = (int)(at % A.cd);
  int64_t last = A.p0 + A.n - 1;
  if (last < s) return;
  int64_t u = last - ((last - s) % A.m);
  if (u < A.p0) return;
  int S = A.overlap ? A.m + s : s;
  float kv, sc;
  comp_read(A, u, S, col, &kv, &sc);
  A.state_kv[(int64_t)S * A.cd + col] = kv;
  A.state_score[(int64_t)S * A.cd + col] = sc;
}

static void gpu_compress(void *ctx, float *rows, float *state_kv, float *state_score,
                         const float *kv, const float *score, const float *ape, int n, int64_t p0,
                         int m, int d, int overlap) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0) return;
  comp_args A = {rows, state_kv, state_score, kv, score, ape, n, m, d, (overlap ? 2 : 1) * d,
                 overlap, p0};
  int64_t j_first = p0 / m, j_last = (p0 + n) / m - 1;
  if (j_last >= j_first) {
    dim3 grid((unsigned)(j_last - j_first + 1), blocks_for((size_t)d, 128));
    k_compress_pool<<<grid, 128, 0, c->stream>>>(A, j_first);
    LAUNCHED(c, "compress");
    if (overlap) {
      k_compress_move<<<blocks_for((size_t)m * A.cd, 256), 256, 0, c->stream>>>(A, j_last);
      LAUNCHED(c, "compress");
    }
  }
  k_compress_store<<<blocks_for((size_t)m * A.cd, 256), 256, 0, c->stream>>>(A);
  LAUNCHED(c, "compress");
}

/* ------------------------------------------------------------------------------------------ */
/* Lightning indexer scores: 64 queries x 64 rows a block, heads summed in order                */

#define IT 64 /* queries and rows per tile */
#define IK 16 /* reduction step over dim */

static __global__ void __launch_bounds__(256) k_indexer_scores(float *scores, const float *q,
    const float *w, const float *k, int n, int rows, int heads, int dim, const int *visible) {
  __shared__ float qs[IK][IT + 1];
  __shared__ float ks[IK][IT + 1];
  __shared__ int vis[IT];
  int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  int64_t i0 = (int64_t)blockIdx.y * IT, j0 = (int64_t)blockIdx.x * IT;
  if (tid < IT) vis[tid] = i0 + tid < n ? visible[i0 + tid] : 0;
  __syncthreads();
  int max_vis = 0;
  for (int t = 0; t < IT; t++) max_vis = vis[t] > max_vis ? vis[t] : max_vis;
  float s[4][4];
#pragma unroll
  for (int a = 0; a < 4; a++)
#pragma unroll
    for (int b = 0; b < 4; b++) s[a][b] = 0;
  if (j0 < max_vis) { /* a tile no query of the block sees is all -inf */
    for (int h = 0; h < heads; h++) {
      float acc[4][4];
#pragma unroll
      for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b] = 0;
      for (int k0 = 0; k0 < dim; k0 += IK) {
#pragma unroll
        for (int e4 = 0; e4 < 4; e4++) {
          int e = tid + 256 * e4, t = e / IK, kk = e % IK;
          int64_t i = i0 + t, j = j0 + t;
          qs[kk][t] = i < n && k0 + kk < dim ? q[(i * heads + h) * dim + k0 + kk] : 0.0f;
          ks[kk][t] = j < rows && k0 + kk < dim ? k[j * dim + k0 + kk] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < IK; kk++) {
          float av[4], bv[4];
#pragma unroll
          for (int a = 0; a < 4; a++) av[a] = qs[kk][ty + 16 * a];
#pragma unroll
          for (int b = 0; b < 4; b++) bv[b] = ks[kk][tx + 16 * b];
#pragma unroll
          for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) acc[a][b] += av[a] * bv[b];
        }
        __syncthreads();
      }
#pragma unroll
      for (int a = 0; a < 4; a++) {
        int64_t i = i0 + ty + 16 * a;
        float wi = i < n ? w[i * heads + h] : 0.0f;
#pragma unroll
        for (int b = 0; b < 4; b++) s[a][b] += wi * (acc[a][b] > 0 ? acc[a][b] : 0.0f);
      }
    }
  }
#pragma unroll
  for (int a = 0; a < 4; a++) {
    int t = ty + 16 * a;
    int64_t i = i0 + t;
    if (i >= n) continue;
#pragma unroll
    for (int b = 0; b < 4; b++) {
      int64_t j = j0 + tx + 16 * b;
      if (j < rows) scores[i * rows + j] = j < vis[t] ? s[a][b] : -INFINITY;
    }
  }
}

static void gpu_indexer_scores(void *ctx, float *scores, const float *q, const float *w,
                               const float *k, int n, int rows, int heads, int dim,
                               const int *visible) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0 || rows <= 0) return;
  dim3 grid(blocks_for((size_t)rows, IT), blocks_for((size_t)n, IT));
  k_indexer_scores<<<grid, 256, 0, c->stream>>>(scores, q, w, k, n, rows, heads, dim, visible);
  LAUNCHED(c, "indexer_scores");
}

/* ------------------------------------------------------------------------------------------ */
/* Top-k: a radix select of the k-th largest key, then one ordered pass that keeps what is      */
/* above it and the lowest-indexed ties, so the output is ascending with no sort                 */

#define KT 512 /* threads of a top-k block */

/* An order-preserving key: larger score, larger key; NaN ranks as -inf. */
static __device__ __forceinline__ uint32_t score_key(float f) {
  uint32_t u = st_lowp_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) u = 0xff800000u; /* NaN -> -inf */
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Inclusive prefix sum of v over the block's KT threads (Hillis-Steele in shared memory). */
static __device__ int block_scan(int v, int *sh) {
  int t = threadIdx.x;
  __syncthreads();
  sh[t] = v;
  __syncthreads();
  for (int off = 1; off < KT; off <<= 1) {
    int add = t >= off ? sh[t - off] : 0;
    __syncthreads();
    sh[t] += add;
    __syncthreads();
  }
  return sh[t];
}

static __global__ void __launch_bounds__(KT) k_topk(int32_t *idx, const float *scores, int rows,
                                                    const int *visible, int k, int width) {
  __shared__ int hist[256];
  __shared__ int scan[KT];
  __shared__ uint32_t sel_prefix;
  __shared__ int sel_left;
  int i = blockIdx.x, t = threadIdx.x;
  const float *row = scores + (int64_t)i * rows;
  int32_t *out = idx + (int64_t)i * width;
  int vis = visible[i] < rows ? visible[i] : rows;
  if (vis < 0) vis = 0;
  int take = k < vis ? k : vis;
  if (take > width) take = width;
  for (int c = take + t; c < width; c += KT) out[c] = -1;
  if (take == vis) { /* everything visible is kept */
    for (int c = t; c < take; c += KT) out[c] = c;
    return;
  }
  uint32_t prefix = 0, mask = 0;
  int left = take; /* how many of those matching prefix are still to be taken */
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = t; b < 256; b += KT) hist[b] = 0;
    __syncthreads();
    for (int j = t; j < vis; j += KT) {
      uint32_t key = score_key(row[j]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (t == 0) {
      int above = 0, b = 255;
      for (; b > 0 && above + hist[b] < left; b--) above += hist[b];
      sel_prefix = prefix | ((uint32_t)b << shift);
      sel_left = left - above;
    }
    __syncthreads();
    prefix = sel_prefix;
    left = sel_left;
    mask |= 255u << shift;
  }
  /* prefix is now the k-th largest key; keep every key above it and the first `left` equal. */
  int taken = 0, ties = 0;
  for (int j0 = 0; j0 < vis; j0 += KT) {
    int j = j0 + t;
    uint32_t key = j < vis ? score_key(row[j]) : 0;
    int eq = j < vis && key == prefix;
    int eq_before = block_scan(eq, scan) - eq, eq_total = scan[KT - 1];
    int keep = j < vis && (key > prefix || (eq && ties + eq_before < left));
    int keep_before = block_scan(keep, scan) - keep, keep_total = scan[KT - 1];
    if (keep) out[taken + keep_before] = j;
    taken += keep_total;
    ties += eq_total;
  }
}

static void gpu_topk(void *ctx, int32_t *idx, const float *scores, int n, int rows,
                     const int *visible, int k, int width, void *work) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0 || width <= 0) return;
  k_topk<<<n, KT, 0, c->stream>>>(idx, scores, rows, visible, k, width);
  LAUNCHED(c, "topk");
}

/* ------------------------------------------------------------------------------------------ */
/* Attention candidates and sparse attention                                                    */

static __global__ void k_candidates(int32_t *cand, const int32_t *topk, int n, int64_t p0,
                                    int window, int width, int32_t compressed_base, int ratio) {
  int stride = window + width;
  int64_t at = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (int64_t)n * stride) return;
  int64_t i = at / stride, t = p0 + i;
  int k = (int)(at % stride);
  int32_t v;
  if (k < window) {
    int64_t pos = t - window + 1 + k;
    v = pos < 0 ? -1 : pos >= p0 ? (int32_t)(window + (pos - p0)) : (int32_t)(pos % window);
  } else if (topk) {
    int32_t row = topk[i * width + (k - window)];
    v = row >= 0 ? compressed_base + row : -1;
  } else {
    int64_t visible = (t + 1) / ratio;
    v = k - window < visible ? compressed_base + (k - window) : -1;
  }
  cand[at] = v;
}

static void gpu_candidates(void *ctx, int32_t *cand, const int32_t *topk, int n, int64_t p0,
                           int window, int width, int32_t compressed_base, int ratio) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  size_t count = (size_t)n * (window + width);
  if (!count) return;
  k_candidates<<<blocks_for(count, 256), 256, 0, c->stream>>>(cand, topk, n, p0, window, width,
                                                             compressed_base, ratio);
  LAUNCHED(c, "candidates");
}

/*
** One block per (token, group of hb heads): the heads share the token's candidate rows, so each
** tile of kv rows is staged once in shared memory (rows padded by one float against bank
** conflicts) for all of them. Pass 1: logits; then the softmax with the sink, one thread per
** head in candidate order; pass 2: out[h, :] = sum_c p_c kv_c, each output a register summed in
** candidate order.
*/
#define AT_THREADS 256
#define AT_OUT 32 /* outputs a thread accumulates: hb * d <= 256 * 32 */

static __global__ void __launch_bounds__(AT_THREADS) k_sparse_attention(float *out, const float *q,
    const float *kv, const int32_t *cand, int heads, int d, int width, const float *sinks,
    float scale, int probs_bf16, int hb, int tile) {
  extern __shared__ float smem[];
  int ld = d + 1;
  float *qs = smem, *lg = qs + (size_t)hb * d, *kvt = lg + (size_t)hb * width;
  int i = blockIdx.x, h0 = blockIdx.y * hb, t = threadIdx.x;
  int nh = heads - h0 < hb ? heads - h0 : hb;
  const int32_t *ci = cand + (int64_t)i * width;
  for (int e = t; e < nh * d; e += AT_THREADS)
    qs[e] = q[((int64_t)i * heads + h0) * d + e];
  for (int c0 = 0; c0 < width; c0 += tile) {
    int tn = width - c0 < tile ? width - c0 : tile;
    __syncthreads();
    for (int e = t; e < tn * d; e += AT_THREADS) {
      int r = e / d, k = e % d;
      int32_t row = ci[c0 + r];
      kvt[r * ld + k] = row >= 0 ? kv[(int64_t)row * d + k] : 0.0f;
    }
    __syncthreads();
    for (int p = t; p < nh * tn; p += AT_THREADS) {
      int h = p / tn, r = p % tn;
      if (ci[c0 + r] < 0) continue;
      const float *qh = qs + (size_t)h * d, *v = kvt + (size_t)r * ld;
      float s = 0;
      for (int k = 0; k < d; k++) s += qh[k] * v[k];
      lg[(size_t)h * width + c0 + r] = s * scale;
    }
  }
  __syncthreads();
  if (t < nh) {
    float *l = lg + (size_t)t * width, sink = sinks[h0 + t], mx = sink, den = 0;
    for (int c = 0; c < width; c++)
      if (ci[c] >= 0) mx = fmaxf(mx, l[c]);
    for (int c = 0; c < width; c++)
      if (ci[c] >= 0) den += (l[c] = expf(l[c] - mx));
    den += expf(sink - mx);
    for (int c = 0; c < width; c++) {
      float p = ci[c] >= 0 ? l[c] / den : 0.0f;
      l[c] = probs_bf16 ? st_round_bf16(p) : p;
    }
  }
  float acc[AT_OUT];
#pragma unroll
  for (int r = 0; r < AT_OUT; r++) acc[r] = 0;
  for (int c0 = 0; c0 < width; c0 += tile) {
    int tn = width - c0 < tile ? width - c0 : tile;
    __syncthreads();
    for (int e = t; e < tn * d; e += AT_THREADS) {
      int r = e / d, k = e % d;
      int32_t row = ci[c0 + r];
      kvt[r * ld + k] = row >= 0 ? kv[(int64_t)row * d + k] : 0.0f;
    }
    __syncthreads();
    for (int r = 0; r < tn; r++) {
      if (ci[c0 + r] < 0) continue;
#pragma unroll
      for (int o = 0; o < AT_OUT; o++) {
        int e = t + AT_THREADS * o;
        if (e < nh * d) acc[o] += lg[(size_t)(e / d) * width + c0 + r] * kvt[r * ld + e % d];
      }
    }
  }
#pragma unroll
  for (int o = 0; o < AT_OUT; o++) {
    int e = t + AT_THREADS * o;
    if (e < nh * d) out[((int64_t)i * heads + h0) * d + e] = acc[o];
  }
}

static void gpu_sparse_attention(void *ctx, float *out, const float *q, const float *kv,
                                 const int32_t *cand, int n, int heads, int d, int width,
                                 const float *sinks, float scale, int probs_bf16) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0 || heads <= 0) return;
  /* the widest head group and kv tile that fit in shared memory */
  static const int hbs[] = {16, 8, 4, 2, 1}, tiles[] = {32, 16, 8, 4};
  int hb = 0, tile = 0;
  size_t bytes = 0;
  for (int a = 0; a < 5 && !hb; a++) {
    if (hbs[a] > heads && hbs[a] > 1) continue;
    if ((size_t)hbs[a] * d > (size_t)AT_THREADS * AT_OUT) continue;
    for (int b = 0; b < 4; b++) {
      size_t need = sizeof(float) * ((size_t)hbs[a] * d + (size_t)hbs[a] * width +
                                     (size_t)tiles[b] * (d + 1));
      if (need <= c->smem_optin) {
        hb = hbs[a], tile = tiles[b], bytes = need;
        break;
      }
    }
  }
  if (!hb) {
    latch(c, "sparse_attention", "head dim or candidate count too large for shared memory");
    return;
  }
  static size_t opted = 0;
  if (bytes > 48 * 1024 && bytes > opted) {
    check(c, "sparse_attention",
          gpuFuncSetAttribute(k_sparse_attention, gpuFuncAttributeMaxDynamicSharedMemorySize,
                              (int)bytes));
    opted = bytes;
  }
  dim3 grid((unsigned)n, (unsigned)((heads + hb - 1) / hb));
  k_sparse_attention<<<grid, AT_THREADS, bytes, c->stream>>>(out, q, kv, cand, heads, d, width,
                                                             sinks, scale, probs_bf16, hb, tile);
  LAUNCHED(c, "sparse_attention");
}

/* ------------------------------------------------------------------------------------------ */
/* MoE                                                                                          */

static __global__ void k_moe_route(int32_t *experts, float *weights, float *logits,
                                   const float *bias, const int32_t *hash_experts, int n, int E,
                                   int kE, float route_scale) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  st_moe_route_token(logits + (int64_t)i * E, bias, hash_experts ? hash_experts + (int64_t)i * kE : NULL,
                     E, kE, route_scale, experts + (int64_t)i * kE, weights + (int64_t)i * kE);
}

static void gpu_moe_route(void *ctx, int32_t *experts, float *weights, float *logits,
                          const float *bias, const int32_t *hash_experts, int n, int E, int kE,
                          float route_scale) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0) return;
  k_moe_route<<<blocks_for((size_t)n, 64), 64, 0, c->stream>>>(experts, weights, logits, bias,
                                                              hash_experts, n, E, kE, route_scale);
  LAUNCHED(c, "moe_route");
}

static __global__ void k_gather_rows(float *dst, const float *src, const int32_t *rows, int count,
                                     int D) {
  int64_t at = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (int64_t)count * D) return;
  int64_t k = at / D, c = at % D;
  dst[at] = src[(int64_t)rows[k] * D + c];
}

static void gpu_gather_rows(void *ctx, float *dst, const float *src, const int32_t *rows, int count,
                            int D) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  size_t total = (size_t)count * D;
  if (!total) return;
  k_gather_rows<<<blocks_for(total, 256), 256, 0, c->stream>>>(dst, src, rows, count, D);
  LAUNCHED(c, "gather_rows");
}

/* One thread per output column keeps each element's additions in k order (as cpu-ref). */
static __global__ void k_scatter_add(float *out, const float *y, const int32_t *row,
                                     const float *weight, int count, int D) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= D) return;
  for (int k = 0; k < count; k++) out[(int64_t)row[k] * D + c] += y[(int64_t)k * D + c] * weight[k];
}

static void gpu_scatter_add(void *ctx, float *out, const float *y, const int32_t *rows,
                            const float *weight, int count, int D) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (count <= 0 || D <= 0) return;
  k_scatter_add<<<blocks_for((size_t)D, 128), 128, 0, c->stream>>>(out, y, rows, weight, count, D);
  LAUNCHED(c, "scatter_add");
}

static __global__ void k_swiglu(float *h, const float *g, const float *u, size_t count, float limit) {
  size_t at = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= count) return;
  float gv = fminf(g[at], limit);
  float uv = fminf(fmaxf(u[at], -limit), limit);
  h[at] = gv / (1.0f + expf(-gv)) * uv;
}

static void gpu_swiglu(void *ctx, float *h, const float *g, const float *u, int n, int F,
                       float limit) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  size_t count = (size_t)n * F;
  if (!count) return;
  k_swiglu<<<blocks_for(count, 256), 256, 0, c->stream>>>(h, g, u, count, limit);
  LAUNCHED(c, "swiglu");
}

/* ------------------------------------------------------------------------------------------ */
/* Context and memory                                                                           */

static void gpu_close(void *ctx) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (!c) return;
  if (c->stream) (void)gpuStreamDestroy(c->stream);
  free(c);
}

static const char *gpu_describe(void *ctx) { return ((gpu_ctx *)ctx)->description; }

static int gpu_supports(void *ctx, st_op op, int dtype) {
  return op != ST_OP_INDEXER_TOPK && op != ST_OP_MOE_EXPERTS;
}

static size_t gpu_workspace_size(void *ctx, const st_backend_limits *lim) { return 16; }

static st_status gpu_alloc(void *ctx, size_t bytes, void **out) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  *out = NULL;
  if (bytes < 16) bytes = 16;
  gpuError_t e = gpuMalloc(out, bytes);
  if (e != gpuSuccess) {
    *out = NULL;
    (void)gpuGetLastError(); /* an allocation failure is not sticky: clear it */
    return st_fail(ST_ENOMEM, "%s: allocating %zu bytes: %s", BACKEND_NAME, bytes,
                   gpuGetErrorString(e));
  }
  e = gpuMemsetAsync(*out, 0, bytes, c->stream);
  if (e != gpuSuccess) {
    (void)gpuFree(*out);
    *out = NULL;
    return st_fail(ST_EBACKEND, "%s: zero-filling %zu bytes: %s", BACKEND_NAME, bytes,
                   gpuGetErrorString(e));
  }
  return ST_OK;
}

static void gpu_free(void *ctx, void *p) {
  if (p) (void)gpuFree(p);
}

static st_status copy_wait(gpu_ctx *c, void *dst, const void *src, size_t bytes, int kind,
                           const char *what) {
  if (!bytes) return latched(c);
  gpuError_t e = gpuMemcpyAsync(dst, src, bytes, (decltype(gpuMemcpyHostToDevice))kind, c->stream);
  if (e == gpuSuccess) e = gpuStreamSynchronize(c->stream);
  check(c, what, e);
  return latched(c);
}

static st_status gpu_upload(void *ctx, void *dst, const void *src, size_t bytes) {
  return copy_wait((gpu_ctx *)ctx, dst, src, bytes, gpuMemcpyHostToDevice, "upload");
}

static st_status gpu_download(void *ctx, void *dst, const void *src, size_t bytes) {
  return copy_wait((gpu_ctx *)ctx, dst, src, bytes, gpuMemcpyDeviceToHost, "download");
}

static st_status gpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (bytes) check(c, "copy", gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToDevice, c->stream));
  return latched(c);
}

static st_status gpu_synchronize(void *ctx) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  check(c, "synchronize", gpuStreamSynchronize(c->stream));
  return latched(c);
}

static st_backend_ops gpu_ops;

static void fill_table(st_backend_ops *t) {
  memset(t, 0, sizeof *t);
  t->name = BACKEND_NAME;
  t->kernel_mode = "deterministic";
  t->host_memory = 0;
  t->close = gpu_close;
  t->describe = gpu_describe;
  t->supports = gpu_supports;
  t->workspace_size = gpu_workspace_size;
  t->alloc = gpu_alloc;
  t->free = gpu_free;
  t->upload = gpu_upload;
  t->download = gpu_download;
  t->copy = gpu_copy;
  t->synchronize = gpu_synchronize;
  t->matmul = gpu_matmul;
  t->matmul_grouped = gpu_matmul_grouped;
  t->embed = gpu_embed;
  t->rmsnorm = gpu_rmsnorm;
  t->rope = gpu_rope;
  t->hadamard = gpu_hadamard;
  t->round_bf16 = gpu_round_bf16;
  t->quantize = gpu_quantize;
  t->add = gpu_add;
  t->scale = gpu_scale;
  t->fill = gpu_fill;
  t->hc_weights = gpu_hc_weights;
  t->hc_collapse = gpu_hc_collapse;
  t->hc_expand = gpu_hc_expand;
  t->hc_head = gpu_hc_head;
  t->compress = gpu_compress;
  t->indexer_scores = gpu_indexer_scores;
  t->topk = gpu_topk;
  t->candidates = gpu_candidates;
  t->sparse_attention = gpu_sparse_attention;
  t->moe_route = gpu_moe_route;
  t->gather_rows = gpu_gather_rows;
  t->scatter_add = gpu_scatter_add;
  t->swiglu = gpu_swiglu;
}

/* ST_GPU_DEVICE picks the device (default 0). */
extern "C" st_status OPEN_FN(st_backend *out) {
  int count = 0;
  gpuError_t e = gpuGetDeviceCount(&count);
  if (e != gpuSuccess || count == 0) {
    (void)gpuGetLastError();
    return st_fail(ST_EUNSUPPORTED, "backend %s: no device (%s)", BACKEND_NAME,
                   e != gpuSuccess ? gpuGetErrorString(e) : "none found");
  }
  const char *env = getenv("ST_GPU_DEVICE");
  int device = env ? atoi(env) : 0;
  if (device < 0 || device >= count)
    return st_fail(ST_EINVAL, "backend %s: ST_GPU_DEVICE=%s but %d device(s)", BACKEND_NAME,
                   env, count);
  gpu_ctx *c = (gpu_ctx *)calloc(1, sizeof *c);
  if (!c) return st_fail(ST_ENOMEM, "%s context", BACKEND_NAME);
  c->device = device;
  gpuDeviceProp prop;
  if ((e = gpuSetDevice(device)) != gpuSuccess || (e = gpuGetDeviceProperties(&prop, device)) != gpuSuccess ||
      (e = gpuStreamCreateWithFlags(&c->stream, gpuStreamNonBlocking)) != gpuSuccess) {
    free(c);
    return st_fail(ST_EBACKEND, "backend %s: device %d: %s", BACKEND_NAME, device,
                   gpuGetErrorString(e));
  }
#if defined(ST_HIP)
  c->smem_optin = prop.sharedMemPerBlock; /* gfx90a: 64 KiB of LDS */
#else
  c->smem_optin = prop.sharedMemPerBlockOptin ? prop.sharedMemPerBlockOptin : prop.sharedMemPerBlock;
#endif
  snprintf(c->description, sizeof c->description, "%.200s, device %d, %d SMs, %.0f GiB", prop.name,
           device, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024 * 1024));
  static int filled;
  if (!filled) fill_table(&gpu_ops), filled = 1;
  out->ops = &gpu_ops;
  out->ctx = c;
  return ST_OK;
}
