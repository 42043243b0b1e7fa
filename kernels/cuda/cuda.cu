/*
** cuda.cu — the cuda backend (and, compiled by hipcc with -DST_HIP, the hip backend): every
** operation of kernels/backend.h as a GPU kernel on one stream, weights decoded from their stored
** formats inside the kernels (kernels/lowp.h's arithmetic, the same values cpu-ref decodes).
**
** Determinism (the header's rule). Every output element is written by one thread, and every
** reduction runs in an order fixed by the reduction's length alone: a thread's sequential loop,
** or a shared-memory tree over a fixed 256 threads. Nothing depends on the token count, the grid,
** the number of SMs or timing: no float atomics (the only atomics are integer histogram counts in
** top-k, whose totals do not depend on their order, and the redo lists' slots, whose order no
** output depends on), no split-K, one kernel per operation. So a
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

#define MOE_TABLES 192 /* three projections of 64 layers */
typedef struct moe_table_entry {
  st_weight *host, *dev;
  int E;
  unsigned long long used;
} moe_table_entry;

typedef struct gpu_ctx {
  int device;
  gpuStream_t stream;
  size_t smem_optin; /* the most dynamic shared memory one block may have */
  st_status error;   /* the first failure, latched */
  char error_text[320];
  char description[320];
  moe_table_entry tables[MOE_TABLES]; /* device copies of expert tables (moe_experts) */
  struct prof_state *prof;            /* ST_PROFILE=1 */
  unsigned long long clock;
  int sms;                            /* streaming multiprocessors */
  int *redo;                          /* sparse_attention's redo list: [0] its count, then entries */
  size_t redo_cap;                    /* ints at redo */
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

#if !defined(ST_HIP)
/* Blocks of a redo kernel over at most `items` entries: two an SM (a grid-stride loop). The redo
** kernels serve the cuda build's tensor-core paths alone. */
static unsigned redo_blocks(const gpu_ctx *c, size_t items) {
  size_t most = (size_t)c->sms * 2;
  return (unsigned)(items < most ? items : most);
}
#endif

/* Opts kernel f into `bytes` of dynamic shared memory once (per size reached). */
template <typename F>
static void smem_opt_in(gpu_ctx *c, const char *op, F *f, size_t bytes, size_t *opted) {
  if (bytes > 48 * 1024 && bytes > *opted) {
    check(c, op, gpuFuncSetAttribute(f, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *opted = bytes;
  }
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
/*
** Two tile functions share one contract: a block computes rows [m0, m0 + mrows) x outputs
** [o0, o0 + 128) of one weight, each output element a sum over k in increasing order that does
** not depend on where the element sits in the tile, in the grid or in the chunk. So the plain,
** grouped and MoE launches below, whatever their tiling, give a token the same bits.
**
** - simt_tile: fp32 FMAs, any weight format (the weight decoded element by element).
** - tc_tile (CUDA): bf16 tensor cores (mma.sync m16n8k16, fp32 accumulation) for weights whose
**   decoded values are bf16 exactly: bf16, and FP8 / FP4 with power-of-two (ue8m0) scales. The
**   activation is split into three bf16 pieces, x = hi + mid + lo exactly (truncations: each
**   remainder is exact), so every product is exact in fp32 and the sum is fp32 arithmetic: exact
**   mode keeps fp32 accuracy. A 32-wide step whose mid (lo) pieces are all zero skips them
**   (adding exact zeros changes no sum), so reference mode, whose activations are bf16 or FP8
**   values already, costs one pass.
*/

/* Row r of a tile's activations: x + r ld, or gathered, x + gather[r] ld. */
struct gemm_rows {
  const float *x;
  int64_t ld;
  const int32_t *gather;
};

static __device__ __forceinline__ const float *row_of(const gemm_rows &A, int r) {
  return A.x + (int64_t)(A.gather ? A.gather[r] : r) * A.ld;
}

#define GM 128 /* tokens per tile */
#define GN 128 /* outputs per tile */
#define GK 8   /* reduction step of the fp32 tile */

/* 256 threads; thread (ty, tx) owns tokens ty + 16 a and outputs tx + 16 b (a, b < 8), each an
** fp32 accumulator over k = 0, 1, ... in order. y points at the tile's first output of row 0. */
static __device__ __forceinline__ void simt_tile(float *y, int64_t ldy, const gemm_rows &A,
                                                 const st_weight &w, int64_t wrow0, int mrows,
                                                 int o0, int r, int c, int round_out) {
  __shared__ float xs[GK][GM];
  __shared__ float ws[GK][GN];
  int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const float *arow[4]; /* the rows this thread stages: tid / GK + 32 q */
#pragma unroll
  for (int q = 0; q < 4; q++) {
    int m = tid / GK + 32 * q;
    arow[q] = m < mrows ? row_of(A, m) : NULL;
  }
  float acc[8][8];
#pragma unroll
  for (int a = 0; a < 8; a++)
#pragma unroll
    for (int b = 0; b < 8; b++) acc[a][b] = 0;
  for (int k0 = 0; k0 < c; k0 += GK) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
      int m = tid / GK + 32 * q, kk = tid % GK, k = k0 + kk;
      xs[kk][m] = arow[q] && k < c ? arow[q][k] : 0.0f;
      int o = o0 + m;
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
    int row = ty + 16 * a;
    if (row >= mrows) continue;
#pragma unroll
    for (int b = 0; b < 8; b++) {
      int o = o0 + tx + 16 * b;
      if (o < r) y[(int64_t)row * ldy + o] = round_out ? st_round_bf16(acc[a][b]) : acc[a][b];
    }
  }
}

#if !defined(ST_HIP)
#define TK 32 /* reduction step of the tensor-core tile */
#define TLD 40 /* bf16 a shared row: 32 + 8, 80 bytes, so ldmatrix's eight rows hit distinct banks */

/* Which weights tc_tile reads: their decoded values are bf16 exactly, rows are 16-byte aligned
** and a 16-wide run of k shares one scale. */
enum { TC_NONE = 0, TC_BF16, TC_FP8, TC_FP4 };

static int tc_kind(const st_weight *w, int cols) {
  if (cols % TK || ((uintptr_t)w->data & 15)) return TC_NONE;
  int pow2 = w->scale_dtype == ST_WSCALE_NONE || w->scale_dtype == ST_WSCALE_UE8M0;
  int runs = w->scale_dtype == ST_WSCALE_NONE || (w->block[1] > 0 && w->block[1] % 16 == 0);
  switch (w->dtype) {
  case ST_W_BF16: return w->scale_dtype == ST_WSCALE_NONE ? TC_BF16 : TC_NONE;
  case ST_W_FP8_E4M3: return pow2 && runs ? TC_FP8 : TC_NONE;
  case ST_W_FP4_E2M1: return pow2 && runs ? TC_FP4 : TC_NONE;
  default: return TC_NONE;
  }
}

static __device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void ldsm4(const void *p, uint32_t *r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

/* c[16x8] += a[16x16] . b[16x8], bf16 inputs, fp32 accumulation */
static __device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* x = hi + mid + lo exactly, each a bf16 (the high half of an fp32): hi keeps x's top 8
** significant bits, mid the next 8 of the exact remainder, lo the last 8. Inf and NaN go whole
** into hi (a NaN stays a NaN). */
static __device__ __forceinline__ void split3(float x, uint32_t *hi, uint32_t *mid, uint32_t *lo) {
  uint32_t u = st_lowp_f32_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    *hi = (u & 0x007fffffu) ? ((u >> 16) | 0x40u) : u >> 16;
    *mid = *lo = 0;
    return;
  }
  float rest = x - st_lowp_bits_f32(u & 0xffff0000u);
  uint32_t v = st_lowp_f32_bits(rest);
  float last = rest - st_lowp_bits_f32(v & 0xffff0000u);
  *hi = u >> 16;
  *mid = v >> 16;
  *lo = st_lowp_f32_bits(last) >> 16;
}

/* The bf16 bits of a decoded weight value (exact: see tc_kind). */
static __device__ __forceinline__ uint32_t bf16_bits(float v) { return st_lowp_f32_bits(v) >> 16; }

/* What one thread carries from global memory to the next step's shared tile. */
struct tc_stage {
  float4 a[4];
  uint4 b[2];
  float scale;
};

template <int KIND>
static __device__ __forceinline__ void tc_load(tc_stage *st, const float *const *arow,
                                               const st_weight &w, int64_t wrow0, int o0, int r,
                                               int k0) {
  int tid = threadIdx.x;
#pragma unroll
  for (int q = 0; q < 4; q++) {
    int kc = ((tid + 256 * q) & 7) * 4;
    st->a[q] = arow[q] ? *(const float4 *)(arow[q] + k0 + kc) : make_float4(0, 0, 0, 0);
  }
  const unsigned char *wd = (const unsigned char *)w.data;
  if (KIND == TC_BF16) { /* 128 rows x 32 k x 2 bytes: two 16-byte pieces a thread */
#pragma unroll
    for (int q = 0; q < 2; q++) {
      int e = tid + 256 * q, o = o0 + (e >> 2), kc = (e & 3) * 8;
      st->b[q] = o < r ? *(const uint4 *)(wd + ((wrow0 + o) * w.cols + k0 + kc) * 2)
                       : make_uint4(0, 0, 0, 0);
    }
  } else { /* FP8: 16 bytes, FP4: 8 bytes, of 16 values of one row */
    int o = o0 + (tid >> 1), kc = (tid & 1) * 16;
    st->scale = 1.0f;
    if (o < r) {
      if (w.scale_dtype == ST_WSCALE_UE8M0) st->scale = wscale(w, wrow0 + o, k0 + kc);
      if (KIND == TC_FP8) {
        st->b[0] = *(const uint4 *)(wd + (wrow0 + o) * w.cols + k0 + kc);
      } else {
        uint2 v = *(const uint2 *)(wd + (wrow0 + o) * (w.cols / 2) + (k0 + kc) / 2);
        st->b[0] = make_uint4(v.x, v.y, 0, 0);
      }
    } else {
      st->b[0] = make_uint4(0, 0, 0, 0);
    }
  }
}

/* Shared tiles: the activation's three pieces and the decoded weight, [128][TLD] bf16 each. */
struct tc_tiles {
  uint16_t a[3][GM][TLD];
  uint16_t b[GN][TLD];
};

/* Writes a staged step's hi pieces and decoded weights into the shared tiles; returns bit 0: one
** of this thread's mid pieces is non-zero, bit 1: a lo piece is (tc_store_rest then writes them,
** when the block's vote says a step needs them). */
template <int KIND>
static __device__ __forceinline__ int tc_store(tc_tiles *t, const tc_stage *st, const float *lut) {
  int tid = threadIdx.x, nz = 0;
#pragma unroll
  for (int q = 0; q < 4; q++) {
    int e = tid + 256 * q, m = e >> 3, kc = (e & 7) * 4;
    const float v[4] = {st->a[q].x, st->a[q].y, st->a[q].z, st->a[q].w};
    uint32_t u[4] = {st_lowp_f32_bits(v[0]), st_lowp_f32_bits(v[1]), st_lowp_f32_bits(v[2]),
                     st_lowp_f32_bits(v[3])};
    if (!((u[0] | u[1] | u[2] | u[3]) & 0xffffu)) { /* bf16 values already: mid and lo are 0 */
      *(uint2 *)&t->a[0][m][kc] = make_uint2(__byte_perm(u[0], u[1], 0x7632), __byte_perm(u[2], u[3], 0x7632));
      continue;
    }
    uint32_t h[4], md[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; j++) split3(v[j], &h[j], &md[j], &l[j]);
    *(uint2 *)&t->a[0][m][kc] = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
    nz |= (md[0] | md[1] | md[2] | md[3]) & 0x7fffu ? 1 : 0;
    nz |= (l[0] | l[1] | l[2] | l[3]) & 0x7fffu ? 2 : 0;
  }
  if (KIND == TC_BF16) {
#pragma unroll
    for (int q = 0; q < 2; q++) {
      int e = tid + 256 * q;
      *(uint4 *)&t->b[e >> 2][(e & 3) * 8] = st->b[q];
    }
  } else {
    int o = tid >> 1, kc = (tid & 1) * 16;
    uint32_t out[8];
    const unsigned char *bytes = (const unsigned char *)&st->b[0];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      float v0, v1;
      if (KIND == TC_FP8) {
        v0 = lut[bytes[2 * j]];
        v1 = lut[bytes[2 * j + 1]];
      } else {
        v0 = lut[bytes[j] & 0xf];
        v1 = lut[bytes[j] >> 4];
      }
      out[j] = bf16_bits(v0 * st->scale) | bf16_bits(v1 * st->scale) << 16;
    }
    *(uint4 *)&t->b[o][kc] = make_uint4(out[0], out[1], out[2], out[3]);
    *(uint4 *)&t->b[o][kc + 8] = make_uint4(out[4], out[5], out[6], out[7]);
  }
  return nz;
}

/* The mid and lo pieces of a staged step (zeros where this thread's values had none). */
static __device__ __forceinline__ void tc_store_rest(tc_tiles *t, const tc_stage *st, int mid, int lo) {
  int tid = threadIdx.x;
#pragma unroll
  for (int q = 0; q < 4; q++) {
    int e = tid + 256 * q, m = e >> 3, kc = (e & 7) * 4;
    const float v[4] = {st->a[q].x, st->a[q].y, st->a[q].z, st->a[q].w};
    uint32_t h[4], md[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; j++) split3(v[j], &h[j], &md[j], &l[j]);
    if (mid) *(uint2 *)&t->a[1][m][kc] = make_uint2(md[0] | md[1] << 16, md[2] | md[3] << 16);
    if (lo) *(uint2 *)&t->a[2][m][kc] = make_uint2(l[0] | l[1] << 16, l[2] | l[3] << 16);
  }
}

/* 256 threads = 8 warps as 2 x 4, each warp 64 rows x 32 outputs: 4 x 4 mma tiles a k16 step. */
template <int KIND>
static __device__ __forceinline__ void tc_tile(float *y, int64_t ldy, const gemm_rows &A,
                                               const st_weight &w, int64_t wrow0, int mrows,
                                               int o0, int r, int c, int round_out) {
  __shared__ __align__(16) tc_tiles t;
  __shared__ float lut[256]; /* the weight format's code values (lowp.h's decoding) */
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
  if (KIND == TC_FP8) lut[tid] = st_fp8_e4m3fn_to_f32((uint8_t)tid);
  if (KIND == TC_FP4 && tid < 16) lut[tid] = st_fp4_e2m1_to_f32((uint8_t)tid);
  __syncthreads();
  const float *arow[4]; /* rows (tid + 256 q) / 8 */
#pragma unroll
  for (int q = 0; q < 4; q++) {
    int m = (tid + 256 * q) >> 3;
    arow[q] = m < mrows ? row_of(A, m) : NULL;
  }
  float acc[4][4][4];
#pragma unroll
  for (int a = 0; a < 4; a++)
#pragma unroll
    for (int b = 0; b < 4; b++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[a][b][e] = 0;
  tc_stage st;
  tc_load<KIND>(&st, arow, w, wrow0, o0, r, 0);
  for (int k0 = 0; k0 < c; k0 += TK) {
    int nz = tc_store<KIND>(&t, &st, lut);
    int need_mid = __syncthreads_or(nz & 1), need_lo = __syncthreads_or(nz & 2);
    if (need_mid | need_lo) { /* the block's vote: this step needs them (exact mode) */
      tc_store_rest(&t, &st, need_mid, need_lo);
      __syncthreads();
    }
    if (k0 + TK < c) tc_load<KIND>(&st, arow, w, wrow0, o0, r, k0 + TK);
#pragma unroll
    for (int ks = 0; ks < TK; ks += 16) {
      uint32_t bf[4][2];
#pragma unroll
      for (int j = 0; j < 2; j++) {
        uint32_t v[4];
        ldsm4(&t.b[wn * 32 + j * 16 + (lane >> 4) * 8 + (lane & 7)][ks + ((lane >> 3) & 1) * 8], v);
        bf[2 * j][0] = v[0], bf[2 * j][1] = v[1], bf[2 * j + 1][0] = v[2], bf[2 * j + 1][1] = v[3];
      }
#pragma unroll
      for (int p = 0; p < 3; p++) {
        if ((p == 1 && !need_mid) || (p == 2 && !need_lo)) continue;
#pragma unroll
        for (int mi = 0; mi < 4; mi++) {
          uint32_t af[4];
          ldsm4(&t.a[p][wm * 64 + mi * 16 + (lane & 15)][ks + (lane >> 4) * 8], af);
#pragma unroll
          for (int ni = 0; ni < 4; ni++) mma16816(acc[mi][ni], af, bf[ni][0], bf[ni][1]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int mi = 0; mi < 4; mi++)
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int row = wm * 64 + mi * 16 + (lane >> 2) + (e >> 1) * 8;
        int o = o0 + wn * 32 + ni * 8 + (lane & 3) * 2 + (e & 1);
        if (row < mrows && o < r) {
          float v = acc[mi][ni][e];
          y[(int64_t)row * ldy + o] = round_out ? st_round_bf16(v) : v;
        }
      }
}
#endif

/* The plain and grouped projections: block (x, y, z) = outputs, tokens, group. */
template <int KIND>
static __global__ void __launch_bounds__(256, 2) k_gemm(float *y, const float *x, st_weight w, int n,
                                                     int r, int c, int groups) {
  int g = blockIdx.z, m0 = blockIdx.y * GM, o0 = blockIdx.x * GN;
  int64_t ldx = (int64_t)groups * c, ldy = (int64_t)groups * r;
  gemm_rows A = {x + (int64_t)m0 * ldx + (int64_t)g * c, ldx, NULL};
  float *yt = y + (int64_t)m0 * ldy + (int64_t)g * r;
  int mrows = n - m0 < GM ? n - m0 : GM;
#if !defined(ST_HIP)
  if constexpr (KIND != 0) tc_tile<KIND>(yt, ldy, A, w, (int64_t)g * r, mrows, o0, r, c, 0);
  else
#endif
    simt_tile(yt, ldy, A, w, (int64_t)g * r, mrows, o0, r, c, 0);
}

/* The kind of tile a weight runs on here (0: the fp32 tile). */
static int gemm_kind(const st_weight *w, int cols, const float *x, int64_t ldx) {
#if !defined(ST_HIP)
  if (((uintptr_t)x & 15) || ldx % 4) return 0;
  return tc_kind(w, cols);
#else
  (void)w, (void)cols, (void)x, (void)ldx;
  return 0;
#endif
}

static void gemm(gpu_ctx *c, const char *op, float *y, const float *x, const st_weight *w, int n,
                 int groups) {
  if (n <= 0 || w->rows <= 0) return;
  int r = (int)(w->rows / groups), cols = (int)w->cols;
  dim3 grid(blocks_for((size_t)r, GN), blocks_for((size_t)n, GM), (unsigned)groups);
  switch (gemm_kind(w, cols, x, (int64_t)groups * cols)) {
#if !defined(ST_HIP)
  case TC_BF16: k_gemm<TC_BF16><<<grid, 256, 0, c->stream>>>(y, x, *w, n, r, cols, groups); break;
  case TC_FP8: k_gemm<TC_FP8><<<grid, 256, 0, c->stream>>>(y, x, *w, n, r, cols, groups); break;
  case TC_FP4: k_gemm<TC_FP4><<<grid, 256, 0, c->stream>>>(y, x, *w, n, r, cols, groups); break;
#endif
  default: k_gemm<0><<<grid, 256, 0, c->stream>>>(y, x, *w, n, r, cols, groups); break;
  }
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

#if !defined(ST_HIP)
/* The FP8 round trips a warp per (row, block): lanes take every 32nd value, the amax merges in a
** butterfly (st_fp8_amax_merge: order-free, so the bits of the one-thread form), each value's round
** trip is lowp.h's. Coalesced, where one thread per block strides through memory. */
static __global__ void k_quantize_fp8_warp(float *x, int rows, int64_t stride, int len, int block,
                                           int blocks_per_row, int ue8m0, int fnuz) {
  int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x & 31;
  if (w >= (int64_t)rows * blocks_per_row) return; /* a whole warp leaves together */
  int64_t r = w / blocks_per_row;
  int b0 = (int)(w % blocks_per_row) * block;
  int m = len - b0 < block ? len - b0 : block;
  float *p = x + r * stride + b0;
  float amax = 1e-4f;
  for (int i = lane; i < m; i += 32) amax = st_fp8_amax_step(amax, p[i]);
  for (int o = 16; o > 0; o >>= 1) amax = st_fp8_amax_merge(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  float s = st_fp8_block_scale(amax, ue8m0, fnuz);
  for (int i = lane; i < m; i += 32) p[i] = st_fp8_roundtrip_value(p[i], s, fnuz);
}
#endif

static void gpu_quantize(void *ctx, float *x, int rows, int64_t stride, int len, int block,
                         st_qformat format, int ue8m0) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (rows <= 0 || len <= 0) return;
  if (block <= 0 || block > len) block = len;
#if !defined(ST_HIP)
  if ((format == ST_Q_FP8_E4M3FN || format == ST_Q_FP8_E4M3FNUZ) && block >= 32) {
    int per_row = (len + block - 1) / block;
    size_t threads = (size_t)rows * per_row * 32;
    k_quantize_fp8_warp<<<blocks_for(threads, 256), 256, 0, c->stream>>>(
        x, rows, stride, len, block, per_row, ue8m0, format == ST_Q_FP8_E4M3FNUZ);
    LAUNCHED(c, "quantize");
    return;
  }
#endif
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
#define HC_MIX_REGS 24 /* mixes hc_weights sums in registers in one pass: (2 + hc) hc for hc <= 4 */

#define HC_TOKENS 4 /* tokens a block of hc_weights: each fn element read once for all of them */

/* Each of count sums (count <= HC_MIX_REGS) over the block's RT threads in block_sum's tree, all
** at once: sums[m] of thread 0 gets the total of v[m]. The same bits as count block_sums. */
static __device__ __forceinline__ void block_sums(float *v, int count, float (*sh)[RT]) {
  int t = threadIdx.x;
  __syncthreads(); /* sh may still be read from the previous call */
#pragma unroll
  for (int m = 0; m < HC_MIX_REGS; m++)
    if (m < count) sh[m][t] = v[m];
  __syncthreads();
  for (int s = RT / 2; s > 0; s >>= 1) {
    if (t < s)
#pragma unroll
      for (int m = 0; m < HC_MIX_REGS; m++)
        if (m < count) sh[m][t] += sh[m][t + s];
    __syncthreads();
  }
  if (t == 0)
#pragma unroll
    for (int m = 0; m < HC_MIX_REGS; m++)
      if (m < count) v[m] = sh[m][0];
}

static __global__ void __launch_bounds__(RT) k_hc_weights(float *pre, float *post, float *comb,
    const float *X, const float *fn, const float *base, const float *scale, int n, int hc, int D,
    float norm_eps, float hc_eps, int sinkhorn_iters) {
  __shared__ float sh[HC_MIX_REGS][RT];
  __shared__ float mix[HC_TOKENS][(2 + MAX_HC) * MAX_HC];
  int i0 = blockIdx.x * HC_TOKENS, flat = hc * D, mixes = (2 + hc) * hc;
  int nt = n - i0 < HC_TOKENS ? n - i0 : HC_TOKENS;
  float r[HC_TOKENS];
  for (int u = 0; u < nt; u++) {
    const float *x = X + (int64_t)(i0 + u) * flat;
    r[u] = 1.0f / sqrtf(block_dot(x, x, flat, sh[0]) / (float)flat + norm_eps);
  }
  if (mixes <= HC_MIX_REGS) {
    /* every mix of HC_TOKENS tokens in one pass over fn: each thread's partial sums run over the
    ** same k as block_dot's, in the same order, and go through the same tree: the same bits */
    float part[HC_TOKENS][HC_MIX_REGS];
#pragma unroll
    for (int u = 0; u < HC_TOKENS; u++)
#pragma unroll
      for (int m = 0; m < HC_MIX_REGS; m++) part[u][m] = 0;
    for (int k = threadIdx.x; k < flat; k += RT) {
      float xv[HC_TOKENS];
#pragma unroll
      for (int u = 0; u < HC_TOKENS; u++) xv[u] = u < nt ? X[(int64_t)(i0 + u) * flat + k] : 0.0f;
#pragma unroll
      for (int m = 0; m < HC_MIX_REGS; m++)
        if (m < mixes) {
          float f = fn[(int64_t)m * flat + k];
#pragma unroll
          for (int u = 0; u < HC_TOKENS; u++) part[u][m] += xv[u] * f;
        }
    }
#pragma unroll
    for (int u = 0; u < HC_TOKENS; u++)
      if (u < nt) { /* uniform: every thread takes the same branch */
        block_sums(part[u], mixes, sh);
        if (threadIdx.x == 0)
#pragma unroll
          for (int m = 0; m < HC_MIX_REGS; m++)
            if (m < mixes) mix[u][m] = part[u][m] * r[u];
      }
  } else {
    for (int u = 0; u < nt; u++)
      for (int m = 0; m < mixes; m++) {
        float d = block_dot(X + (int64_t)(i0 + u) * flat, fn + (int64_t)m * flat, flat, sh[0]);
        if (threadIdx.x == 0) mix[u][m] = d * r[u];
      }
  }
  __syncthreads();
  if (threadIdx.x < nt) {
    int64_t i = i0 + threadIdx.x;
    st_hc_weights_from_mix(mix[threadIdx.x], base, scale, hc, hc_eps, sinkhorn_iters, pre + i * hc,
                           post + i * hc, comb + i * hc * hc);
  }
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
  k_hc_weights<<<blocks_for((size_t)n, HC_TOKENS), RT, 0, c->stream>>>(pre, post, comb, X, fn, base,
      scale, n, hc, D, norm_eps, hc_eps, sinkhorn_iters);
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

#ifndef ST_INDEXER_BF16
#define ST_INDEXER_BF16 1 /* k_indexer_scores_fa (below); -DST_INDEXER_BF16=0 to leave it out */
#endif
#define ITC_Q 64  /* queries a block of the tensor-core indexer scores (below) */
#define ITC_R 128 /* rows a block */

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

/* The selection both top-k kernels make over len keys in ascending index order, key_of(e) the
** e-th: the `take` largest, ties to the earlier, passed to put(c, e) as the c-th kept (c
** ascending with e). A radix select of the take-th largest key, one byte a pass (integer
** atomics on a shared histogram: the same counts in any order), then one ordered pass that
** keeps every key above it and the first `left` equal to it. */
template <class KeyOf, class Put>
static __device__ void select_ordered(int len, int take, KeyOf key_of, Put put) {
  __shared__ int hist[256];
  __shared__ int scan[KT];
  __shared__ uint32_t sel_prefix;
  __shared__ int sel_left;
  int t = threadIdx.x;
  uint32_t prefix = 0, mask = 0;
  int left = take; /* how many of those matching prefix are still to be taken */
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = t; b < 256; b += KT) hist[b] = 0;
    __syncthreads();
    for (int e = t; e < len; e += KT) {
      uint32_t key = key_of(e);
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
  /* prefix is now the take-th largest key; keep every key above it and the first `left` equal. */
  int taken = 0, ties = 0;
  for (int e0 = 0; e0 < len; e0 += KT) {
    int e = e0 + t;
    uint32_t key = e < len ? key_of(e) : 0;
    int eq = e < len && key == prefix;
    int eq_before = block_scan(eq, scan) - eq, eq_total = scan[KT - 1];
    int keep = e < len && (key > prefix || (eq && ties + eq_before < left));
    int keep_before = block_scan(keep, scan) - keep, keep_total = scan[KT - 1];
    if (keep) put(taken + keep_before, e);
    taken += keep_total;
    ties += eq_total;
  }
}

/* How many of a query's rows are kept: min(k, visible rows, width), visible clamped to [0, rows]. */
static __device__ __forceinline__ int topk_take(int visible, int rows, int k, int width, int *vis_out) {
  int vis = visible < rows ? visible : rows;
  if (vis < 0) vis = 0;
  int take = k < vis ? k : vis;
  *vis_out = vis;
  return take < width ? take : width;
}

static __global__ void __launch_bounds__(KT) k_topk(int32_t *idx, const float *scores, int rows,
                                                    const int *visible, int k, int width) {
  int i = blockIdx.x, t = threadIdx.x, vis;
  const float *row = scores + (int64_t)i * rows;
  int32_t *out = idx + (int64_t)i * width;
  int take = topk_take(visible[i], rows, k, width, &vis);
  for (int c = take + t; c < width; c += KT) out[c] = -1;
  if (take == vis) { /* everything visible is kept */
    for (int c = t; c < take; c += KT) out[c] = c;
    return;
  }
  select_ordered(vis, take, [&](int j) { return score_key(row[j]); }, [&](int c, int j) { out[c] = j; });
}

/*
** The running top-k of the fused indexer_topk: rows [r0, r0 + cn) of each query scored into
** chunk [n, cn], merged with the selection of rows [0, r0) (idx and keys [n, width], ascending
** index, its first min(take, visible rows below r0) entries). Rows [0, r0) all precede the
** chunk's, so the two in sequence are in ascending index order and select_ordered keeps the same
** rows the one-pass k_topk keeps from the whole row: the take largest by key, ties to the lower
** index. Where everything seen is kept the order is ascending, as k_topk's 0 .. vis - 1.
*/
static __global__ void __launch_bounds__(KT) k_topk_merge(int32_t *idx, uint32_t *keys,
    const float *chunk, int64_t r0, int cn, int rows, const int *visible, int k, int width) {
  extern __shared__ uint32_t run[]; /* [2][width]: the selection so far, keys then indices */
  int i = blockIdx.x, t = threadIdx.x, vis;
  int32_t *out = idx + (int64_t)i * width;
  uint32_t *out_key = keys + (int64_t)i * width;
  int take = topk_take(visible[i], rows, k, width, &vis);
  if (r0 == 0)
    for (int c = take + t; c < width; c += KT) out[c] = -1;
  int before = vis < r0 ? vis : (int)r0, m = take < before ? take : before;
  int here = vis - (int)r0 < cn ? vis - (int)r0 : cn; /* visible rows of the chunk */
  if (here <= 0) return;
  uint32_t *run_key = run, *run_idx = run + width;
  for (int c = t; c < m; c += KT) run_key[c] = out_key[c], run_idx[c] = (uint32_t)out[c];
  __syncthreads();
  const float *row = chunk + (int64_t)i * cn;
  int len = m + here, keep = take < len ? take : len;
  auto key_of = [&](int e) { return e < m ? run_key[e] : score_key(row[e - m]); };
  auto put = [&](int c, int e) {
    out[c] = e < m ? (int32_t)run_idx[e] : (int32_t)(r0 + e - m);
    out_key[c] = key_of(e);
  };
  if (keep == len) {
    for (int e = t; e < len; e += KT) put(e, e);
    return;
  }
  select_ordered(len, keep, key_of, put);
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

#if !defined(ST_HIP)
/*
** The tensor-core sparse attention (CUDA): one block per (token, 16 heads). The heads' logits
** against the token's candidates are a [16, width] x d product and the output a [16, d] x width
** one, both on mma.sync in bf16 pieces: every operand is split into hi + mid + lo exactly (as in
** the GEMM tile) and the six products that reach fp32 precision are summed, those of all-zero
** pieces skipped (a tile's vote): in reference mode, where q, kv and the bf16 probabilities are
** bf16 values already, that is one product. Pass 1 stages 64 candidate rows at a time (fp32 in
** shared memory) and writes the scaled logits; the softmax with the sink runs a warp per head
** (a fixed butterfly); pass 2 stages the rows again and accumulates p kv in candidate order.
** Every output's sum runs in an order fixed by width and d alone.
*/
#define ATC_HEADS 16
#define ATC_QLD(d) ((d) + 8)   /* fp32 a shared q or probability row: 8 mod 32 words */
#define ATC_KLD(d) ((d) + 4)   /* fp32 a staged kv row: 4 mod 32 words */

/* The pieces of two fp32 values as packed bf16 pairs (element 0 in the low half). */
static __device__ __forceinline__ void split_pair(float a, float b, uint32_t *p) {
  uint32_t ah, am, al, bh, bm, bl;
  split3(a, &ah, &am, &al);
  split3(b, &bh, &bm, &bl);
  p[0] = ah | bh << 16, p[1] = am | bm << 16, p[2] = al | bl << 16;
}

/* The six products of the pieces whose sum is fp32-accurate, in a fixed order; need_a / need_b
** bit 0: a mid piece is non-zero, bit 1: a lo piece is. */
static __device__ __forceinline__ void mma_pieces(float *c, const uint32_t (*a)[4],
                                                  const uint32_t (*b)[2], int need_a, int need_b) {
  mma16816(c, a[0], b[0][0], b[0][1]);
  if (need_b & 1) mma16816(c, a[0], b[1][0], b[1][1]);
  if (need_a & 1) mma16816(c, a[1], b[0][0], b[0][1]);
  if ((need_a & 1) && (need_b & 1)) mma16816(c, a[1], b[1][0], b[1][1]);
  if (need_b & 2) mma16816(c, a[0], b[2][0], b[2][1]);
  if (need_a & 2) mma16816(c, a[2], b[0][0], b[0][1]);
}

/* The pieces of a pair where need says a mid or lo piece may be non-zero, else the hi pieces
** alone (the values are bf16 already: their high halves, packed in one byte permutation). */
static __device__ __forceinline__ void pieces_pair(float a, float b, int need, uint32_t *p) {
  if (need) {
    split_pair(a, b, p);
  } else {
    p[0] = __byte_perm(st_lowp_f32_bits(a), st_lowp_f32_bits(b), 0x7632);
    p[1] = p[2] = 0;
  }
}

/* Bit 0: v's mid piece is non-zero, bit 1: its lo piece is. */
static __device__ __forceinline__ int piece_bits(float v) {
  uint32_t h, m, l;
  split3(v, &h, &m, &l);
  return ((m & 0x7fffu) ? 1 : 0) | ((l & 0x7fffu) ? 2 : 0);
}

/* A warp's softmax over logit row l with the sink: l[c] becomes exp(l[c] - M) for each candidate
** c (ci[c] >= 0), M the largest logit or the sink; returns the sum of those and exp(sink - M),
** in a fixed butterfly. */
static __device__ __forceinline__ float softmax_exp(float *l, const int32_t *ci, int width, float sink) {
  int lane = threadIdx.x & 31;
  float mx = sink;
  for (int c = lane; c < width; c += 32)
    if (ci[c] >= 0) mx = fmaxf(mx, l[c]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float den = 0;
  for (int c = lane; c < width; c += 32)
    if (ci[c] >= 0) den += (l[c] = expf(l[c] - mx));
  for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
  return den + expf(sink - mx);
}

/* Stages candidate rows c0 .. c0 + rows of the token (zero where -1 or past width); returns the
** block's piece bits. */
#define ATC_BATCH 8 /* loads a thread has in flight while staging */

static __device__ int atc_stage(float *kvt, const float *kv, const int32_t *ci, int c0, int rows,
                                int width, int d) {
  int bits = 0, per_row = d / 4, total = rows * per_row;
  for (int e0 = threadIdx.x; e0 < total; e0 += 256 * ATC_BATCH) {
    float4 v[ATC_BATCH];
#pragma unroll
    for (int u = 0; u < ATC_BATCH; u++) { /* every load issued before the first is used */
      int e = e0 + 256 * u, r = e / per_row, k = (e % per_row) * 4;
      int32_t row = e < total && c0 + r < width ? ci[c0 + r] : -1;
      v[u] = row >= 0 ? *(const float4 *)(kv + (int64_t)row * d + k) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < ATC_BATCH; u++) {
      int e = e0 + 256 * u, r = e / per_row, k = (e % per_row) * 4;
      if (e >= total) break;
      *(float4 *)(kvt + r * ATC_KLD(d) + k) = v[u];
      bits |= piece_bits(v[u].x) | piece_bits(v[u].y) | piece_bits(v[u].z) | piece_bits(v[u].w);
    }
  }
  return __syncthreads_or(bits & 1) | (__syncthreads_or(bits & 2) << 1);
}

static __device__ __forceinline__ void atc_block(float *out, const float *q, const float *kv,
    const int32_t *cand, int heads, int d, int width, const float *sinks, float scale,
    int probs_bf16, int tile, int i, int h0) {
  extern __shared__ __align__(16) float smem[];
  int wpad = (width + 63) / 64 * 64;
  float *qs = smem;                                   /* [16][QLD]: q, then nothing */
  float *lg = qs + ATC_HEADS * ATC_QLD(d);            /* [16][wpad + 8]: logits, then p */
  float *kvt = lg + ATC_HEADS * (wpad + 8);           /* [tile][KLD] */
  __shared__ int p_bits;
  int lld = wpad + 8;
  int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  int g = lane >> 2, tq = lane & 3;
  int nh = heads - h0 < ATC_HEADS ? heads - h0 : ATC_HEADS;
  const int32_t *ci = cand + (int64_t)i * width;
  int q_bits = 0;
  for (int e0 = t * 4; e0 < ATC_HEADS * d; e0 += 256 * 4 * ATC_BATCH) {
    float4 v[ATC_BATCH];
#pragma unroll
    for (int u = 0; u < ATC_BATCH; u++) {
      int e = e0 + 1024 * u, h = e / d;
      v[u] = e < ATC_HEADS * d && h < nh ? *(const float4 *)(q + ((int64_t)i * heads + h0) * d + e)
                                         : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < ATC_BATCH; u++) {
      int e = e0 + 1024 * u, h = e / d, k = e % d;
      if (e >= ATC_HEADS * d) break;
      *(float4 *)(qs + h * ATC_QLD(d) + k) = v[u];
      q_bits |= piece_bits(v[u].x) | piece_bits(v[u].y) | piece_bits(v[u].z) | piece_bits(v[u].w);
    }
  }
  if (t == 0) p_bits = 0;
  q_bits = __syncthreads_or(q_bits & 1) | (__syncthreads_or(q_bits & 2) << 1);

  /* pass 1: logits; warp w computes candidates c0 + 8 w .. + 8 of the tile */
  for (int c0 = 0; c0 < width; c0 += tile) {
    int kv_bits = atc_stage(kvt, kv, ci, c0, tile, width, d);
    if (warp * 8 < tile) {
      float acc[4] = {0, 0, 0, 0};
      const float *brow = kvt + (warp * 8 + g) * ATC_KLD(d);
      for (int k0 = 0; k0 < d; k0 += 16) {
        uint32_t a[3][4], b[3][2], p[3];
        const float *q0 = qs + g * ATC_QLD(d) + k0 + 2 * tq, *q8 = q0 + 8 * ATC_QLD(d);
        pieces_pair(q0[0], q0[1], q_bits, p); a[0][0] = p[0], a[1][0] = p[1], a[2][0] = p[2];
        pieces_pair(q8[0], q8[1], q_bits, p); a[0][1] = p[0], a[1][1] = p[1], a[2][1] = p[2];
        pieces_pair(q0[8], q0[9], q_bits, p); a[0][2] = p[0], a[1][2] = p[1], a[2][2] = p[2];
        pieces_pair(q8[8], q8[9], q_bits, p); a[0][3] = p[0], a[1][3] = p[1], a[2][3] = p[2];
        const float *b0 = brow + k0 + 2 * tq;
        pieces_pair(b0[0], b0[1], kv_bits, p); b[0][0] = p[0], b[1][0] = p[1], b[2][0] = p[2];
        pieces_pair(b0[8], b0[9], kv_bits, p); b[0][1] = p[0], b[1][1] = p[1], b[2][1] = p[2];
        mma_pieces(acc, a, b, q_bits, kv_bits);
      }
      /* acc: heads g and g + 8, candidates c0 + 8 w + 2 tq, + 1 */
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int h = g + (e >> 1) * 8, c = c0 + warp * 8 + 2 * tq + (e & 1);
        if (c < width) lg[h * lld + c] = acc[e] * scale;
      }
    }
    __syncthreads();
  }

  /* the softmax with the sink, a warp per head (heads warp, warp + 8) */
  for (int h = warp; h < nh; h += 8) {
    float *l = lg + h * lld, den = softmax_exp(l, ci, width, sinks[h0 + h]);
    int bits = 0;
    for (int c = lane; c < wpad; c += 32) {
      float p = c < width && ci[c] >= 0 ? l[c] / den : 0.0f;
      l[c] = probs_bf16 ? st_round_bf16(p) : p;
      bits |= piece_bits(l[c]);
    }
    if (bits) atomicOr(&p_bits, bits);
  }
  for (int h = nh + warp; h < ATC_HEADS; h += 8) /* heads past the last: zero probabilities */
    for (int c = lane; c < wpad; c += 32) lg[h * lld + c] = 0.0f;
  __syncthreads();
  int pb = p_bits;

  /* pass 2: out = p kv; warp w owns dims [w d/8, (w+1) d/8) as d/64 n8 tiles */
  float acc[8][4];
#pragma unroll
  for (int nt = 0; nt < 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0;
  int ntiles = d / 64, n0 = warp * (d / 8);
  for (int c0 = 0; c0 < width; c0 += tile) {
    int kv_bits = atc_stage(kvt, kv, ci, c0, tile, width, d);
    for (int k0 = 0; k0 < tile; k0 += 16) {
      uint32_t a[3][4], p[3];
      const float *p0 = lg + g * lld + c0 + k0 + 2 * tq, *p8 = p0 + 8 * lld;
      pieces_pair(p0[0], p0[1], pb, p); a[0][0] = p[0], a[1][0] = p[1], a[2][0] = p[2];
      pieces_pair(p8[0], p8[1], pb, p); a[0][1] = p[0], a[1][1] = p[1], a[2][1] = p[2];
      pieces_pair(p0[8], p0[9], pb, p); a[0][2] = p[0], a[1][2] = p[1], a[2][2] = p[2];
      pieces_pair(p8[8], p8[9], pb, p); a[0][3] = p[0], a[1][3] = p[1], a[2][3] = p[2];
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        if (nt >= ntiles) break;
        /* b[k][n] = kv row c0 + k0 + k, dim n0 + 8 nt + n: rows 2 tq, 2 tq + 1 (+ 8), dim g */
        const float *b0 = kvt + (k0 + 2 * tq) * ATC_KLD(d) + n0 + nt * 8 + g;
        uint32_t b[3][2];
        pieces_pair(b0[0], b0[ATC_KLD(d)], kv_bits, p); b[0][0] = p[0], b[1][0] = p[1], b[2][0] = p[2];
        pieces_pair(b0[8 * ATC_KLD(d)], b0[9 * ATC_KLD(d)], kv_bits, p); b[0][1] = p[0], b[1][1] = p[1], b[2][1] = p[2];
        mma_pieces(acc[nt], a, b, pb, kv_bits);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int nt = 0; nt < 8; nt++) {
    if (nt >= ntiles) break;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int h = g + (e >> 1) * 8, k = n0 + nt * 8 + 2 * tq + (e & 1);
      if (h < nh) out[((int64_t)i * heads + h0 + h) * d + k] = acc[nt][e];
    }
  }
}

static __global__ void __launch_bounds__(256) k_sparse_attention_tc(float *out, const float *q,
    const float *kv, const int32_t *cand, int heads, int d, int width, const float *sinks,
    float scale, int probs_bf16, int tile) {
  atc_block(out, q, kv, cand, heads, d, width, sinks, scale, probs_bf16, tile, blockIdx.x,
            blockIdx.y * ATC_HEADS);
}

/* The (token, group of FA_HEADS heads) entries that k_sparse_attention_fa left undone (redo[0]
** of them from redo[1]), each as FA_HEADS / ATC_HEADS blocks' work of the kernel above; a grid
** of any size loops over them. */
#define FA_HEADS 32
static __global__ void __launch_bounds__(256) k_sparse_attention_redo(float *out, const float *q,
    const float *kv, const int32_t *cand, int heads, int d, int width, const float *sinks,
    float scale, int probs_bf16, int tile, const int *redo, int groups) {
  const int per = FA_HEADS / ATC_HEADS;
  int items = redo[0] * per;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    int e = redo[1 + item / per], h0 = e % groups * FA_HEADS + item % per * ATC_HEADS;
    if (h0 >= heads) continue; /* the same for every thread of the block */
    atc_block(out, q, kv, cand, heads, d, width, sinks, scale, probs_bf16, tile, e / groups, h0);
    __syncthreads(); /* the next item's staging overwrites what this one read */
  }
}

/*
** The flash sparse attention (CUDA), for reference mode's inputs: where q, the candidate kv rows
** and the probabilities are bf16 values (reference mode rounds all three), they sit in shared
** memory as bf16 and ldmatrix feeds mma.sync directly: one product a tile, no pieces. A block
** takes one token and FA_HEADS heads, so a tile of candidate rows is loaded once for 32 heads,
** and the next tile's loads are in flight (in registers) while the tensor cores work on this one.
** Pass 1 writes the scaled logits of every candidate into shared memory; the softmax with the
** sink (a warp per head, as in the kernel above) overwrites each logit row in place with its bf16
** probabilities; pass 2 loads the rows again and accumulates p kv in candidate order. A value
** that is not bf16 exactly stops the block before it writes anything: it puts its (token, group)
** on the redo list, which k_sparse_attention_redo finishes with the pieces. The bits never depend
** on the list's order (every entry writes its own outputs).
*/
#define FA_TILE 32                /* candidate rows a tile */
#define FA_LD(D) ((D) + 8)        /* bf16 elements of a shared q or kv row: 16 mod 128 bytes */
#define FA_LLD(w) ((w) + 4)       /* floats of a logit row (w a multiple of FA_TILE): 16 mod 128 bytes */

static __device__ __forceinline__ void ldsm2(const void *p, uint32_t *r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}

static __device__ __forceinline__ void ldsm4_trans(const void *p, uint32_t *r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

/* Four fp32 values into shared memory as bf16 (their high halves); the low halves OR'd into
** *inexact, which stays 0 while every value is bf16 exactly. */
static __device__ __forceinline__ void fa_put4(uint16_t *dst, float4 v, uint32_t *inexact) {
  uint32_t x = st_lowp_f32_bits(v.x), y = st_lowp_f32_bits(v.y), z = st_lowp_f32_bits(v.z),
           w = st_lowp_f32_bits(v.w);
  *inexact |= (x | y | z | w) & 0xffffu;
  *(uint2 *)dst = make_uint2(__byte_perm(x, y, 0x7632), __byte_perm(z, w, 0x7632));
}

/* This thread's share of candidate rows c0 .. c0 + FA_TILE (zeros where -1 or past width). */
template <int D>
static __device__ __forceinline__ void fa_load(float4 *v, const float *kv, const int32_t *ci,
                                               int c0, int width) {
#pragma unroll
  for (int u = 0; u < D / 32; u++) {
    int e = (threadIdx.x + 256 * u) * 4, r = e / D, k = e % D;
    int32_t row = c0 + r < width ? ci[c0 + r] : -1;
    v[u] = row >= 0 ? *(const float4 *)(kv + (int64_t)row * D + k) : make_float4(0, 0, 0, 0);
  }
}

template <int D>
static __device__ __forceinline__ void fa_store(uint16_t *ks, const float4 *v, uint32_t *inexact) {
#pragma unroll
  for (int u = 0; u < D / 32; u++) {
    int e = (threadIdx.x + 256 * u) * 4;
    fa_put4(ks + e / D * FA_LD(D) + e % D, v[u], inexact);
  }
}

template <int D>
static __global__ void __launch_bounds__(256, 1) k_sparse_attention_fa(float *out, const float *q,
    const float *kv, const int32_t *cand, int heads, int width, const float *sinks, float scale,
    int *redo) {
  extern __shared__ __align__(16) unsigned char fa_smem[];
  int wpad = (width + FA_TILE - 1) / FA_TILE * FA_TILE, lld = FA_LLD(wpad);
  uint16_t *qs = (uint16_t *)fa_smem;           /* [FA_HEADS][LD]: q */
  uint16_t *ks = qs + FA_HEADS * FA_LD(D);      /* [FA_TILE][LD]: a tile of candidate rows */
  float *lg = (float *)(ks + FA_TILE * FA_LD(D)); /* [FA_HEADS][lld]: logits, then probabilities */
  int i = blockIdx.x, h0 = blockIdx.y * FA_HEADS, t = threadIdx.x, lane = t & 31, warp = t >> 5;
  int g = lane >> 2, tq = lane & 3;
  int nh = heads - h0 < FA_HEADS ? heads - h0 : FA_HEADS;
  const int32_t *ci = cand + (int64_t)i * width;

  uint32_t inexact = 0;
  float4 v[D / 32]; /* FA_HEADS q rows and FA_TILE kv rows are both 32 rows of D */
#pragma unroll
  for (int u = 0; u < D / 32; u++) {
    int e = (t + 256 * u) * 4, h = e / D;
    v[u] = h < nh ? *(const float4 *)(q + ((int64_t)i * heads + h0 + h) * D + e % D)
                  : make_float4(0, 0, 0, 0);
  }
  fa_store<D>(qs, v, &inexact);
  fa_load<D>(v, kv, ci, 0, width);

  /* pass 1: logits; warp w computes heads 16 (w & 1) .. + 16 against candidates 8 (w >> 1) .. + 8 */
  int mh = warp & 1, nb = warp >> 1;
  for (int c0 = 0; c0 < wpad; c0 += FA_TILE) {
    fa_store<D>(ks, v, &inexact);
    if (__syncthreads_or(inexact)) { /* the same answer in every thread */
      if (t == 0) redo[1 + atomicAdd(&redo[0], 1)] = i * gridDim.y + blockIdx.y;
      return;
    }
    if (c0 + FA_TILE < wpad) fa_load<D>(v, kv, ci, c0 + FA_TILE, width);
    float acc[4] = {0, 0, 0, 0};
    const uint16_t *a_at = qs + (mh * 16 + (lane & 15)) * FA_LD(D) + (lane >> 4) * 8;
    const uint16_t *b_at = ks + (nb * 8 + (lane & 7)) * FA_LD(D) + ((lane >> 3) & 1) * 8;
#pragma unroll 8
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t a[4], b[2];
      ldsm4(a_at + k0, a);
      ldsm2(b_at + k0, b);
      mma16816(acc, a, b[0], b[1]);
    }
    float *l = lg + (mh * 16 + g) * lld + c0 + nb * 8 + 2 * tq;
    *(float2 *)l = make_float2(acc[0] * scale, acc[1] * scale);
    *(float2 *)(l + 8 * lld) = make_float2(acc[2] * scale, acc[3] * scale);
    __syncthreads(); /* the tile is read before the next overwrites it */
  }

  /* the softmax with the sink, a warp per head; the bf16 probabilities of row h overwrite the
  ** first half of its logits, each chunk of 32 written after it is read (the writes stay behind
  ** the reads: chunk c0 writes bytes 2 c0 .. 2 c0 + 64, reads 4 c0 .. 4 c0 + 128) */
  for (int h = warp; h < FA_HEADS; h += 8) {
    float *l = lg + h * lld;
    uint16_t *p = (uint16_t *)l;
    if (h >= nh) {
      for (int c = lane; c < wpad; c += 32) p[c] = 0;
      continue;
    }
    float den = softmax_exp(l, ci, width, sinks[h0 + h]);
    for (int c0 = 0; c0 < wpad; c0 += 32) {
      int c = c0 + lane;
      float pc = c < width && ci[c] >= 0 ? st_round_bf16(l[c] / den) : 0.0f;
      __syncwarp();
      p[c] = (uint16_t)(st_lowp_f32_bits(pc) >> 16);
    }
  }
  __syncthreads();

  /* pass 2: out = p kv; warp w owns dims w D/8 .. + D/8 of all FA_HEADS heads */
  const uint16_t *P = (const uint16_t *)lg;
  int pld = 2 * lld, n0 = warp * (D / 8);
  float acc[2][D / 64][4];
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int nt = 0; nt < D / 64; nt++) acc[m][nt][0] = acc[m][nt][1] = acc[m][nt][2] = acc[m][nt][3] = 0;
  fa_load<D>(v, kv, ci, 0, width);
  for (int c0 = 0; c0 < wpad; c0 += FA_TILE) {
    fa_store<D>(ks, v, &inexact); /* the rows of pass 1: bf16 exactly */
    __syncthreads();
    if (c0 + FA_TILE < wpad) fa_load<D>(v, kv, ci, c0 + FA_TILE, width);
#pragma unroll
    for (int k0 = 0; k0 < FA_TILE; k0 += 16) {
      uint32_t a[2][4];
#pragma unroll
      for (int m = 0; m < 2; m++) ldsm4(P + (m * 16 + (lane & 15)) * pld + c0 + k0 + (lane >> 4) * 8, a[m]);
#pragma unroll
      for (int nt = 0; nt < D / 64; nt += 2) {
        uint32_t b[4]; /* kv rows k0 .. + 16 (k), dims n0 + 8 nt .. + 16 (n), transposed */
        ldsm4_trans(ks + (k0 + (lane & 15)) * FA_LD(D) + n0 + nt * 8 + (lane >> 4) * 8, b);
#pragma unroll
        for (int m = 0; m < 2; m++) {
          mma16816(acc[m][nt], a[m], b[0], b[1]);
          mma16816(acc[m][nt + 1], a[m], b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int nt = 0; nt < D / 64; nt++)
#pragma unroll
      for (int half = 0; half < 2; half++) {
        int h = m * 16 + g + half * 8, k = n0 + nt * 8 + 2 * tq;
        if (h < nh)
          *(float2 *)(out + ((int64_t)i * heads + h0 + h) * D + k) =
              make_float2(acc[m][nt][2 * half], acc[m][nt][2 * half + 1]);
      }
}

/* Shared bytes of the flash attention. */
static size_t fa_bytes(int d, int width) {
  int wpad = (width + FA_TILE - 1) / FA_TILE * FA_TILE;
  return sizeof(uint16_t) * (size_t)(FA_HEADS + FA_TILE) * FA_LD(d) +
         sizeof(float) * (size_t)FA_HEADS * FA_LLD(wpad);
}

/* Shared bytes of the tensor-core attention with tiles of `tile` rows. */
static size_t atc_bytes(int d, int width, int tile) {
  int wpad = (width + 63) / 64 * 64;
  return sizeof(float) * ((size_t)ATC_HEADS * ATC_QLD(d) + (size_t)ATC_HEADS * (wpad + 8) +
                          (size_t)tile * ATC_KLD(d));
}
#endif

#if !defined(ST_HIP)
/*
** The tensor-core indexer scores (CUDA): a block scores 64 queries against 128 rows. The rows are
** staged once (fp32 in shared memory); then for each head in order the queries' head vectors are
** staged, their dot products with the rows formed on mma.sync in bf16 pieces (the attention's
** six fp32-accurate products, all-zero pieces skipped: one product in reference mode, whose
** indexer q and k are FP8 values) and w[i, h] relu(.) added to the score with one fmaf. Each
** score sums its heads in order: the same bits whatever the tiling or the chunk.
*/
static __device__ __forceinline__ void frag_a(const float *base, int ld, int need, uint32_t (*a)[4]) {
  /* rows g and g + 8 of a 16 x 16 fp32 tile at base (already offset by the lane's g, 2 tq) */
  uint32_t p[3];
  pieces_pair(base[0], base[1], need, p); a[0][0] = p[0], a[1][0] = p[1], a[2][0] = p[2];
  pieces_pair(base[8 * ld], base[8 * ld + 1], need, p); a[0][1] = p[0], a[1][1] = p[1], a[2][1] = p[2];
  pieces_pair(base[8], base[9], need, p); a[0][2] = p[0], a[1][2] = p[1], a[2][2] = p[2];
  pieces_pair(base[8 * ld + 8], base[8 * ld + 9], need, p); a[0][3] = p[0], a[1][3] = p[1], a[2][3] = p[2];
}

static __device__ __forceinline__ void frag_b(const float *base, int need, uint32_t (*b)[2]) {
  /* row g (an output) of a 8 x 16 fp32 tile at base (offset by the lane's g, 2 tq), k along it */
  uint32_t p[3];
  pieces_pair(base[0], base[1], need, p); b[0][0] = p[0], b[1][0] = p[1], b[2][0] = p[2];
  pieces_pair(base[8], base[9], need, p); b[0][1] = p[0], b[1][1] = p[1], b[2][1] = p[2];
}

/* The indexer tiles' shared steps (both kernels below: the same order, the same bits). Thread
** tid's visible[] entry of the tile's queries into vis; returns the most any query sees. */
static __device__ __forceinline__ int itc_visible(int *vis, const int *visible, int64_t i0, int n) {
  int tid = threadIdx.x;
  if (tid < ITC_Q) vis[tid] = i0 + tid < n ? visible[i0 + tid] : 0;
  __syncthreads();
  int max_vis = 0;
  for (int t = 0; t < ITC_Q; t++) max_vis = vis[t] > max_vis ? vis[t] : max_vis;
  return max_vis;
}

static __device__ __forceinline__ void itc_zero(float (*acc)[4][4]) {
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int b = 0; b < 4; b++) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0;
}

/* sc += w[i, h] relu(s) for the warp's 32 queries x 32 rows (warp row wm) of head h */
static __device__ __forceinline__ void itc_head_sum(float (*sc)[4][4], float (*s)[4][4], const float *w,
                                                    int64_t i0, int n, int heads, int h, int wm) {
  int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int64_t i = i0 + wm * 32 + mi * 16 + g + (e >> 1) * 8;
      float wi = i < n ? w[i * heads + h] : 0.0f;
#pragma unroll
      for (int ni = 0; ni < 4; ni++) {
        float v = s[mi][ni][e];
        sc[mi][ni][e] = fmaf(wi, v > 0 ? v : 0.0f, sc[mi][ni][e]);
      }
    }
}

/* The warp's scores, -inf where the query does not see the row */
static __device__ __forceinline__ void itc_write(float *scores, float (*sc)[4][4], const int *vis,
                                                 int64_t i0, int64_t j0, int n, int rows, int wm, int wn) {
  int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int t = wm * 32 + mi * 16 + g + (e >> 1) * 8;
        int64_t i = i0 + t, j = j0 + wn * 32 + ni * 8 + 2 * tq + (e & 1);
        if (i < n && j < rows) scores[i * rows + j] = j < vis[t] ? sc[mi][ni][e] : -INFINITY;
      }
}

static __device__ __forceinline__ void itc_block(float *scores, const float *q, const float *w,
    const float *k, int n, int rows, int heads, int dim, const int *visible, int64_t i0, int64_t j0) {
  extern __shared__ __align__(16) float smem[];
  __shared__ int vis[ITC_Q];
  int ld = dim + 8, per_row = dim / 4;
  float *ks = smem, *qs = ks + ITC_R * ld;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
  int g = lane >> 2, tq = lane & 3;
  int max_vis = itc_visible(vis, visible, i0, n);
  float sc[2][4][4];
  itc_zero(sc);
  if (j0 < max_vis) { /* a tile no query of the block sees is all -inf */
    int kb = 0;
    for (int e0 = tid; e0 < ITC_R * per_row; e0 += 256 * ATC_BATCH) {
      float4 v[ATC_BATCH];
#pragma unroll
      for (int u = 0; u < ATC_BATCH; u++) { /* every load issued before the first is used */
        int e = e0 + 256 * u, r = e / per_row, c = (e % per_row) * 4;
        v[u] = e < ITC_R * per_row && j0 + r < rows ? *(const float4 *)(k + (j0 + r) * dim + c)
                                                    : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < ATC_BATCH; u++) {
        int e = e0 + 256 * u, r = e / per_row, c = (e % per_row) * 4;
        if (e >= ITC_R * per_row) break;
        *(float4 *)(ks + r * ld + c) = v[u];
        kb |= piece_bits(v[u].x) | piece_bits(v[u].y) | piece_bits(v[u].z) | piece_bits(v[u].w);
      }
    }
    kb = __syncthreads_or(kb & 1) | (__syncthreads_or(kb & 2) << 1);
    for (int h = 0; h < heads; h++) {
      int qb = 0;
      __syncthreads(); /* the previous head's q tile is read */
      for (int e0 = tid; e0 < ITC_Q * per_row; e0 += 256 * ATC_BATCH) {
        float4 v[ATC_BATCH];
#pragma unroll
        for (int u = 0; u < ATC_BATCH; u++) {
          int e = e0 + 256 * u, t = e / per_row, c = (e % per_row) * 4;
          v[u] = e < ITC_Q * per_row && i0 + t < n ? *(const float4 *)(q + ((i0 + t) * heads + h) * dim + c)
                                                   : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < ATC_BATCH; u++) {
          int e = e0 + 256 * u, t = e / per_row, c = (e % per_row) * 4;
          if (e >= ITC_Q * per_row) break;
          *(float4 *)(qs + t * ld + c) = v[u];
          qb |= piece_bits(v[u].x) | piece_bits(v[u].y) | piece_bits(v[u].z) | piece_bits(v[u].w);
        }
      }
      qb = __syncthreads_or(qb & 1) | (__syncthreads_or(qb & 2) << 1);
      float s[2][4][4];
      itc_zero(s);
      for (int k0 = 0; k0 < dim; k0 += 16) {
        uint32_t a[2][3][4], b[4][3][2];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
          frag_a(qs + (wm * 32 + mi * 16 + g) * ld + k0 + 2 * tq, ld, qb, a[mi]);
#pragma unroll
        for (int ni = 0; ni < 4; ni++) frag_b(ks + (wn * 32 + ni * 8 + g) * ld + k0 + 2 * tq, kb, b[ni]);
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
          for (int ni = 0; ni < 4; ni++) mma_pieces(s[mi][ni], a[mi], b[ni], qb, kb);
      }
      itc_head_sum(sc, s, w, i0, n, heads, h, wm);
    }
  }
  itc_write(scores, sc, vis, i0, j0, n, rows, wm, wn);
}

static size_t itc_bytes(int dim) { return sizeof(float) * (size_t)(ITC_R + ITC_Q) * (dim + 8); }

static __global__ void __launch_bounds__(256) k_indexer_scores_tc(float *scores, const float *q,
    const float *w, const float *k, int n, int rows, int heads, int dim, const int *visible) {
  itc_block(scores, q, w, k, n, rows, heads, dim, visible, (int64_t)blockIdx.y * ITC_Q,
            (int64_t)blockIdx.x * ITC_R);
}

/* The tiles k_indexer_scores_fa left undone (redo[0] of them from redo[1], each q tile x
** row_tiles + row tile), by the kernel above; a grid of any size loops over them. */
static __global__ void __launch_bounds__(256) k_indexer_scores_redo(float *scores, const float *q,
    const float *w, const float *k, int n, int rows, int heads, int dim, const int *visible,
    const int *redo, int row_tiles) {
  for (int item = blockIdx.x; item < redo[0]; item += gridDim.x) {
    int e = redo[1 + item];
    itc_block(scores, q, w, k, n, rows, heads, dim, visible, (int64_t)(e / row_tiles) * ITC_Q,
              (int64_t)(e % row_tiles) * ITC_R);
    __syncthreads(); /* the next tile's staging overwrites what this one read */
  }
}

/*
** The bf16 indexer scores (CUDA), for reference mode's inputs: where the indexer q and k are bf16
** values (reference mode's are FP8 values), the same tile as above (64 queries x 128 rows, 8
** warps as 2 x 4) keeps them in shared memory as bf16 and feeds mma.sync through ldmatrix: the
** rows are staged once, each head's queries go to one of two buffers while the previous head's
** are multiplied (one barrier a head), and the head sum runs as above, head by head with one
** fmaf: the same bits as the kernel above. A value that is not bf16 exactly stops the block
** before it writes anything and puts its tile on the redo list (k_indexer_scores_redo).
*/
template <int DIM>
static __device__ __forceinline__ void ix_load_q(float4 *v, const float *q, int64_t i0, int n,
                                                 int heads, int h) {
#pragma unroll
  for (int u = 0; u < DIM / 16; u++) {
    int e = (threadIdx.x + 256 * u) * 4, t = e / DIM;
    v[u] = i0 + t < n ? *(const float4 *)(q + ((i0 + t) * heads + h) * DIM + e % DIM)
                      : make_float4(0, 0, 0, 0);
  }
}

template <int DIM>
static __global__ void __launch_bounds__(256, 2) k_indexer_scores_fa(float *scores, const float *q,
    const float *w, const float *k, int n, int rows, int heads, const int *visible, int *redo) {
  extern __shared__ __align__(16) unsigned char ix_smem[];
  __shared__ int vis[ITC_Q];
  const int LD = DIM + 8; /* bf16 elements a shared row: 16 mod 128 bytes */
  uint16_t *ks = (uint16_t *)ix_smem; /* [ITC_R][LD] */
  uint16_t *qs = ks + ITC_R * LD;     /* [2][ITC_Q][LD] */
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
  int64_t i0 = (int64_t)blockIdx.y * ITC_Q, j0 = (int64_t)blockIdx.x * ITC_R;
  int max_vis = itc_visible(vis, visible, i0, n);
  float sc[2][4][4];
  itc_zero(sc);
  if (j0 < max_vis) { /* a tile no query of the block sees is all -inf */
    uint32_t inexact = 0;
#pragma unroll
    for (int u = 0; u < DIM / 8; u++) {
      int e = (tid + 256 * u) * 4, r = e / DIM, c = e % DIM;
      float4 v = j0 + r < rows ? *(const float4 *)(k + (j0 + r) * DIM + c) : make_float4(0, 0, 0, 0);
      fa_put4(ks + r * LD + c, v, &inexact);
    }
    float4 qv[DIM / 16];
    ix_load_q<DIM>(qv, q, i0, n, heads, 0);
    for (int h = 0; h < heads; h++) {
      uint16_t *qb = qs + (h & 1) * ITC_Q * LD;
#pragma unroll
      for (int u = 0; u < DIM / 16; u++) {
        int e = (tid + 256 * u) * 4;
        fa_put4(qb + e / DIM * LD + e % DIM, qv[u], &inexact);
      }
      if (__syncthreads_or(inexact)) { /* the same answer in every thread */
        if (tid == 0) redo[1 + atomicAdd(&redo[0], 1)] = blockIdx.y * gridDim.x + blockIdx.x;
        return;
      }
      if (h + 1 < heads) ix_load_q<DIM>(qv, q, i0, n, heads, h + 1);
      float s[2][4][4];
      itc_zero(s);
#pragma unroll
      for (int k0 = 0; k0 < DIM; k0 += 16) {
        uint32_t a[2][4], b[4][2];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
          ldsm4(qb + (wm * 32 + mi * 16 + (lane & 15)) * LD + k0 + (lane >> 4) * 8, a[mi]);
#pragma unroll
        for (int j = 0; j < 2; j++) {
          uint32_t v[4];
          ldsm4(ks + (wn * 32 + j * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + k0 + ((lane >> 3) & 1) * 8, v);
          b[2 * j][0] = v[0], b[2 * j][1] = v[1], b[2 * j + 1][0] = v[2], b[2 * j + 1][1] = v[3];
        }
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
          for (int ni = 0; ni < 4; ni++) mma16816(s[mi][ni], a[mi], b[ni][0], b[ni][1]);
      }
      itc_head_sum(sc, s, w, i0, n, heads, h, wm);
    }
  }
  itc_write(scores, sc, vis, i0, j0, n, rows, wm, wn);
}

static size_t ix_bytes(int dim) { return sizeof(uint16_t) * (size_t)(ITC_R + 2 * ITC_Q) * (dim + 8); }

/* The redo list of the bf16 kernels (attention, indexer) with room for `entries`: [0] the count,
** zeroed on the stream, then the entries; NULL (latched) without memory. */
static int *redo_list(gpu_ctx *c, const char *op, size_t entries) {
  if (1 + entries > c->redo_cap) {
    if (c->redo) (void)gpuFree(c->redo);
    c->redo_cap = 0;
    if (gpuMalloc((void **)&c->redo, sizeof(int) * (1 + entries)) != gpuSuccess) {
      (void)gpuGetLastError();
      c->redo = NULL;
      latch(c, op, "no memory for the redo list");
      return NULL;
    }
    c->redo_cap = 1 + entries;
  }
  check(c, op, gpuMemsetAsync(c->redo, 0, sizeof(int), c->stream));
  return c->redo;
}

/* What k_indexer_scores_redo is opted into: one record for the kernel, whichever width asked
** (a record per width lowered it: width 64 after 128 left the 128 redo launch beyond its limit,
** "invalid argument"). */
static size_t ix_redo_opted = 0;

/* The bf16 kernel, then the exact kernel over what it left (nothing where the inputs are bf16
** values: the redo grid's blocks find an empty list and return). */
template <int DIM>
static void indexer_fa(gpu_ctx *c, float *scores, const float *q, const float *w, const float *k,
                       int n, int rows, int heads, const int *visible) {
  dim3 grid(blocks_for((size_t)rows, ITC_R), blocks_for((size_t)n, ITC_Q));
  int *redo = redo_list(c, "indexer_scores", (size_t)grid.x * grid.y);
  if (!redo) return;
  static size_t opted = 0; /* one a width: each width is its own kernel */
  smem_opt_in(c, "indexer_scores", k_indexer_scores_fa<DIM>, ix_bytes(DIM), &opted);
  k_indexer_scores_fa<DIM><<<grid, 256, ix_bytes(DIM), c->stream>>>(scores, q, w, k, n, rows, heads,
                                                                   visible, redo);
  LAUNCHED(c, "indexer_scores");
  smem_opt_in(c, "indexer_scores", k_indexer_scores_redo, itc_bytes(DIM), &ix_redo_opted);
  k_indexer_scores_redo<<<redo_blocks(c, (size_t)grid.x * grid.y), 256, itc_bytes(DIM), c->stream>>>(scores, q, w, k, n, rows, heads,
                                                                    DIM, visible, redo, (int)grid.x);
  LAUNCHED(c, "indexer_scores");
}
#endif

static void gpu_indexer_scores(void *ctx, float *scores, const float *q, const float *w,
                               const float *k, int n, int rows, int heads, int dim,
                               const int *visible) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0 || rows <= 0) return;
#if !defined(ST_HIP)
  /* the bf16 kernel where its widths and alignment hold (any input: its redo takes the rest) */
  if (ST_INDEXER_BF16 && (dim == 64 || dim == 128) && !((uintptr_t)q & 15) && !((uintptr_t)k & 15) &&
      itc_bytes(dim) <= c->smem_optin && ix_bytes(dim) <= c->smem_optin) {
    if (dim == 64) indexer_fa<64>(c, scores, q, w, k, n, rows, heads, visible);
    else indexer_fa<128>(c, scores, q, w, k, n, rows, heads, visible);
    return;
  }
  if (dim % 16 == 0 && dim <= 256 && !((uintptr_t)q & 15) && !((uintptr_t)k & 15) &&
      itc_bytes(dim) <= c->smem_optin) {
    size_t bytes = itc_bytes(dim);
    static size_t opted_tc = 0;
    smem_opt_in(c, "indexer_scores", k_indexer_scores_tc, bytes, &opted_tc);
    dim3 grid(blocks_for((size_t)rows, ITC_R), blocks_for((size_t)n, ITC_Q));
    k_indexer_scores_tc<<<grid, 256, bytes, c->stream>>>(scores, q, w, k, n, rows, heads, dim, visible);
    LAUNCHED(c, "indexer_scores");
    return;
  }
#endif
  dim3 grid(blocks_for((size_t)rows, IT), blocks_for((size_t)n, IT));
  k_indexer_scores<<<grid, 256, 0, c->stream>>>(scores, q, w, k, n, rows, heads, dim, visible);
  LAUNCHED(c, "indexer_scores");
}

/*
** indexer_topk: the scores of TOPK_CHUNK rows at a time into a [n, TOPK_CHUNK] scratch, by
** gpu_indexer_scores itself (the chunks start on multiples of every scores tile, so each score
** is the same bits as in the whole matrix), each chunk merged into the running selection by
** k_topk_merge. Scratch (the workspace): keys [n, width] | visible rows of the chunk [n] |
** scores [n, TOPK_CHUNK]; never the [n, rows] matrix.
*/
#define TOPK_CHUNK 4096

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

static size_t itk_bytes(int64_t n, int64_t rows, int width) {
  int64_t chunk = rows < TOPK_CHUNK ? rows : TOPK_CHUNK;
  return align256(sizeof(uint32_t) * (size_t)n * width) + align256(sizeof(int) * (size_t)n) +
         sizeof(float) * (size_t)n * (size_t)chunk;
}

static __global__ void k_chunk_visible(int *out, const int *visible, int n, int64_t r0, int cn) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t v = visible[i] - r0;
  out[i] = v < 0 ? 0 : v > cn ? cn : (int)v;
}




#if !defined(ST_HIP)
/* Whether the flash kernel takes the call: probabilities rounded to bf16, d one of its widths,
** out 8-byte aligned, its shared memory within the device's. */
static int fa_fits(gpu_ctx *c, int d, int width, int probs_bf16, const float *out) {
  return probs_bf16 && (d == 128 || d == 256 || d == 512) && !((uintptr_t)out & 7) &&
         fa_bytes(d, width) <= c->smem_optin;
}

template <int D>
static void fa_launch(gpu_ctx *c, dim3 grid, size_t bytes, float *out, const float *q,
                      const float *kv, const int32_t *cand, int heads, int width,
                      const float *sinks, float scale, int *redo) {
  static size_t opted = 0;
  smem_opt_in(c, "sparse_attention", k_sparse_attention_fa<D>, bytes, &opted);
  k_sparse_attention_fa<D><<<grid, 256, bytes, c->stream>>>(out, q, kv, cand, heads, width, sinks,
                                                            scale, redo);
}

/* The flash kernel, then the exact kernel over what it left (nothing where the inputs are bf16
** values: the redo grid's blocks find an empty list and return). */
static void sparse_attention_fa(gpu_ctx *c, float *out, const float *q, const float *kv,
                                const int32_t *cand, int n, int heads, int d, int width,
                                const float *sinks, float scale, int tile) {
  unsigned groups = (unsigned)((heads + FA_HEADS - 1) / FA_HEADS);
  int *redo = redo_list(c, "sparse_attention", (size_t)n * groups);
  if (!redo) return;
  dim3 grid((unsigned)n, groups);
  size_t bytes = fa_bytes(d, width);
  switch (d) {
  case 128: fa_launch<128>(c, grid, bytes, out, q, kv, cand, heads, width, sinks, scale, redo); break;
  case 256: fa_launch<256>(c, grid, bytes, out, q, kv, cand, heads, width, sinks, scale, redo); break;
  default: fa_launch<512>(c, grid, bytes, out, q, kv, cand, heads, width, sinks, scale, redo); break;
  }
  LAUNCHED(c, "sparse_attention");
  size_t rbytes = atc_bytes(d, width, tile);
  static size_t opted = 0;
  smem_opt_in(c, "sparse_attention", k_sparse_attention_redo, rbytes, &opted);
  k_sparse_attention_redo<<<redo_blocks(c, (size_t)n * groups * (FA_HEADS / ATC_HEADS)), 256, rbytes, c->stream>>>(out, q, kv, cand, heads, d, width, sinks,
                                                              scale, 1, tile, c->redo, (int)groups);
  LAUNCHED(c, "sparse_attention");
}
#endif

static void gpu_sparse_attention(void *ctx, float *out, const float *q, const float *kv,
                                 const int32_t *cand, int n, int heads, int d, int width,
                                 const float *sinks, float scale, int probs_bf16) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0 || heads <= 0) return;
#if !defined(ST_HIP)
  if (width > 0 && d % 64 == 0 && d <= 512 && !((uintptr_t)kv & 15) && !((uintptr_t)q & 15)) {
    int tile = atc_bytes(d, width, 64) <= c->smem_optin ? 64 : atc_bytes(d, width, 32) <= c->smem_optin ? 32 : 0;
    if (tile && fa_fits(c, d, width, probs_bf16, out)) {
      sparse_attention_fa(c, out, q, kv, cand, n, heads, d, width, sinks, scale, tile);
      return;
    }
    if (tile) {
      size_t bytes = atc_bytes(d, width, tile);
      static size_t opted_tc = 0;
      smem_opt_in(c, "sparse_attention", k_sparse_attention_tc, bytes, &opted_tc);
      dim3 grid((unsigned)n, (unsigned)((heads + ATC_HEADS - 1) / ATC_HEADS));
      k_sparse_attention_tc<<<grid, 256, bytes, c->stream>>>(out, q, kv, cand, heads, d, width, sinks,
                                                             scale, probs_bf16, tile);
      LAUNCHED(c, "sparse_attention");
      return;
    }
  }
#endif
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
  smem_opt_in(c, "sparse_attention", k_sparse_attention, bytes, &opted);
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
  for (int k = 0; k < count; k++) {
    float *o = out + (int64_t)row[k] * D + c;
    *o = fmaf(y[(int64_t)k * D + c], weight[k], *o);
  }
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
/* The routed experts fused (moe_experts): engine/model.c's routed_experts in a few launches     */
/*
** 1. k_moe_count, k_moe_plan, k_moe_place group the (token, slot) pairs by expert, tokens
**    ascending within an expert (the composed path's order), and cut the groups into tiles of
**    at most GM rows. Integer work only; every block scans the pairs in order.
** 2. One GEMM launch a projection over every expert's tiles, the gather folded into the staging,
**    through the tile functions above: each row gets the bits the per-expert matmul gives it.
** 3. k_moe_combine: each token adds its experts' outputs in ascending expert id (a repeated
**    expert in slot order), each addition k_scatter_add's fmaf: the composed path's bits.
** The device copies of the expert tables (st_weight[E] a projection) are cached by content.
*/

static __global__ void __launch_bounds__(RT) k_moe_count(int *count, const int32_t *experts, int nk) {
  int e = blockIdx.x, total = 0;
  for (int j0 = 0; j0 < nk; j0 += RT) {
    int j = j0 + threadIdx.x;
    total += __syncthreads_count(j < nk && experts[j] == e);
  }
  if (threadIdx.x == 0) count[e] = total;
}

/* start[e]: the expert's first grouped row; tiles[3 t ..]: expert, first row, rows. */
static __global__ void k_moe_plan(int *start, int *ntiles, int *tiles, const int *count, int E) {
  if (threadIdx.x || blockIdx.x) return;
  int p = 0, t = 0;
  for (int e = 0; e < E; e++) {
    start[e] = p;
    for (int q = 0; q < count[e]; q += GM, t++) {
      tiles[3 * t] = e;
      tiles[3 * t + 1] = p + q;
      tiles[3 * t + 2] = count[e] - q < GM ? count[e] - q : GM;
    }
    p += count[e];
  }
  start[E] = p;
  *ntiles = t;
}

/* rows_tok[p]: the token of grouped row p; pair_pos[i kE + s]: the grouped row of token i's
** slot s (pairs whose expert is out of range have none and are left out, as composed). */
static __global__ void __launch_bounds__(RT) k_moe_place(int32_t *rows_tok, int32_t *pair_pos,
                                                         const int32_t *experts, const int *start,
                                                         int nk, int kE) {
  __shared__ int sh[RT];
  int e = blockIdx.x, t = threadIdx.x, base = start[e];
  if (start[e + 1] == base) return;
  for (int j0 = 0; j0 < nk; j0 += RT) {
    int j = j0 + t, m = j < nk && experts[j] == e;
    __syncthreads();
    sh[t] = m;
    __syncthreads();
    for (int off = 1; off < RT; off <<= 1) { /* inclusive scan, a fixed tree */
      int add = t >= off ? sh[t - off] : 0;
      __syncthreads();
      sh[t] += add;
      __syncthreads();
    }
    if (m) {
      int p = base + sh[t] - 1;
      rows_tok[p] = j / kE;
      pair_pos[j] = p;
    }
    base += sh[RT - 1];
  }
}

/* Block (x, y) = outputs, tile of the plan: Y[p, :] for the tile's grouped rows p. */
template <int KIND>
static __global__ void __launch_bounds__(256, 2) k_gemm_moe(float *Y, const float *x, int64_t ldx,
    const int32_t *gather, const st_weight *table, const int *tiles, const int *ntiles, int r,
    int c, int round_out) {
  int t = blockIdx.y;
  if (t >= *ntiles) return;
  int e = tiles[3 * t], p0 = tiles[3 * t + 1], rows = tiles[3 * t + 2];
  st_weight w = table[e];
  gemm_rows A = {gather ? x : x + (int64_t)p0 * ldx, ldx, gather ? gather + p0 : NULL};
  float *yt = Y + (int64_t)p0 * r;
#if !defined(ST_HIP)
  if constexpr (KIND != 0) tc_tile<KIND>(yt, r, A, w, 0, rows, blockIdx.x * GN, r, c, round_out);
  else
#endif
    simt_tile(yt, r, A, w, 0, rows, blockIdx.x * GN, r, c, round_out);
}

static __global__ void k_moe_combine(float *out, const float *y, const int32_t *experts,
                                     const float *weights, const int32_t *pair_pos, int n, int E,
                                     int kE, int D) {
  int64_t at = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (int64_t)n * D) return;
  int64_t i = at / D, col = at % D;
  const int32_t *ex = experts + i * kE;
  float acc = out[at];
  int last_e = -1, last_s = -1; /* the slots in ascending (expert, slot) order */
  for (int step = 0; step < kE; step++) {
    int best = -1;
    for (int s = 0; s < kE; s++) {
      int e = ex[s];
      if (e < 0 || e >= E || e < last_e || (e == last_e && s <= last_s)) continue;
      if (best < 0 || e < ex[best]) best = s;
    }
    if (best < 0) break;
    last_e = ex[best], last_s = best;
    acc = fmaf(y[(int64_t)pair_pos[i * kE + best] * D + col], weights[i * kE + best], acc);
  }
  out[at] = acc;
}

/* The workspace of moe_experts, carved from `base` (NULL: only the size). */
struct moe_work {
  int *count, *start, *ntiles, *tiles;
  int32_t *rows_tok, *pair_pos;
  float *xq, *g, *u, *y;
  int max_tiles;
  size_t bytes;
};

static moe_work moe_layout(void *base, int64_t n, int64_t E, int64_t kE, int64_t D, int64_t F) {
  moe_work m;
  int64_t nk = n * kE;
  m.max_tiles = (int)(nk / GM + (E < nk ? E : nk) + 1);
  size_t at = 0;
  char *b = (char *)base;
  auto carve = [&](size_t bytes) -> void * {
    void *p = b ? b + at : NULL;
    at += (bytes + 255) & ~(size_t)255;
    return p;
  };
  m.count = (int *)carve(sizeof(int) * (size_t)E);
  m.start = (int *)carve(sizeof(int) * (size_t)(E + 1));
  m.ntiles = (int *)carve(sizeof(int));
  m.tiles = (int *)carve(sizeof(int) * 3 * (size_t)m.max_tiles);
  m.rows_tok = (int32_t *)carve(sizeof(int32_t) * (size_t)nk);
  m.pair_pos = (int32_t *)carve(sizeof(int32_t) * (size_t)nk);
  m.xq = (float *)carve(sizeof(float) * (size_t)(n * D));
  m.g = (float *)carve(sizeof(float) * (size_t)(nk * F));
  m.u = (float *)carve(sizeof(float) * (size_t)(nk * F));
  m.y = (float *)carve(sizeof(float) * (size_t)(nk * D));
  m.bytes = at;
  return m;
}

/* The device copy of an expert table, from the cache or uploaded into it (least recently used
** entry replaced; cudaFree waits for the work that may still read it). */
static const st_weight *moe_table(gpu_ctx *c, const st_weight *w, int E) {
  size_t bytes = sizeof(st_weight) * (size_t)E;
  moe_table_entry *victim = &c->tables[0];
  for (int k = 0; k < MOE_TABLES; k++) {
    moe_table_entry *t = &c->tables[k];
    if (t->dev && t->E == E && !memcmp(t->host, w, bytes)) {
      t->used = ++c->clock;
      return t->dev;
    }
    if (!t->dev || (victim->dev && t->used < victim->used)) victim = t;
  }
  if (victim->dev) (void)gpuFree(victim->dev);
  free(victim->host);
  victim->dev = NULL;
  victim->host = (st_weight *)malloc(bytes);
  if (!victim->host || gpuMalloc((void **)&victim->dev, bytes) != gpuSuccess) {
    (void)gpuGetLastError();
    victim->dev = NULL;
    latch(c, "moe_experts", "no memory for an expert table");
    return NULL;
  }
  memcpy(victim->host, w, bytes);
  victim->E = E;
  victim->used = ++c->clock;
  check(c, "moe_experts",
        gpuMemcpyAsync(victim->dev, victim->host, bytes, gpuMemcpyHostToDevice, c->stream));
  return victim->dev;
}

/* One projection over every expert's tiles: Y [rows, r] from x [., c] (gathered when given). */
static void moe_gemm(gpu_ctx *c, float *Y, const float *x, int64_t ldx, const int32_t *gather,
                     const st_weight *table, const st_weight *host, int E, const moe_work &m,
                     int round_out) {
  int r = (int)host[0].rows, cols = (int)host[0].cols;
  int kind = gemm_kind(&host[0], cols, x, ldx);
  for (int e = 1; e < E && kind; e++)
    if (gemm_kind(&host[e], cols, x, ldx) != kind || host[e].rows != r || host[e].cols != cols) kind = 0;
  dim3 grid(blocks_for((size_t)r, GN), (unsigned)m.max_tiles);
  switch (kind) {
#if !defined(ST_HIP)
  case TC_BF16:
    k_gemm_moe<TC_BF16><<<grid, 256, 0, c->stream>>>(Y, x, ldx, gather, table, m.tiles, m.ntiles, r, cols, round_out);
    break;
  case TC_FP8:
    k_gemm_moe<TC_FP8><<<grid, 256, 0, c->stream>>>(Y, x, ldx, gather, table, m.tiles, m.ntiles, r, cols, round_out);
    break;
  case TC_FP4:
    k_gemm_moe<TC_FP4><<<grid, 256, 0, c->stream>>>(Y, x, ldx, gather, table, m.tiles, m.ntiles, r, cols, round_out);
    break;
#endif
  default:
    k_gemm_moe<0><<<grid, 256, 0, c->stream>>>(Y, x, ldx, gather, table, m.tiles, m.ntiles, r, cols, round_out);
    break;
  }
  LAUNCHED(c, "moe_experts");
}

static void gpu_moe_experts(void *ctx, float *out, const float *x, const int32_t *experts,
                            const float *weights, const st_weight *w1, const st_weight *w2,
                            const st_weight *w3, int n, int E, int kE, float limit, int act_fp8,
                            void *work) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0 || E <= 0 || kE <= 0) return;
  int D = (int)w1[0].cols, F = (int)w1[0].rows, nk = n * kE;
  moe_work m = moe_layout(work, n, E, kE, D, F);
  const st_weight *t1 = moe_table(c, w1, E), *t2 = moe_table(c, w2, E), *t3 = moe_table(c, w3, E);
  if (!t1 || !t2 || !t3) return;
  k_moe_count<<<E, RT, 0, c->stream>>>(m.count, experts, nk);
  k_moe_plan<<<1, 1, 0, c->stream>>>(m.start, m.ntiles, m.tiles, m.count, E);
  k_moe_place<<<E, RT, 0, c->stream>>>(m.rows_tok, m.pair_pos, experts, m.start, nk, kE);
  LAUNCHED(c, "moe_experts");
  const float *xin = x;
  if (act_fp8 && D % 128 == 0) { /* the FP8 input round trip, per token as composed */
    check(c, "moe_experts", gpuMemcpyAsync(m.xq, x, sizeof(float) * (size_t)n * D,
                                           gpuMemcpyDeviceToDevice, c->stream));
    gpu_quantize(c, m.xq, n, D, D, 128, ST_Q_FP8_E4M3FN, 1);
    xin = m.xq;
  }
  moe_gemm(c, m.g, xin, D, m.rows_tok, t1, w1, E, m, act_fp8);
  moe_gemm(c, m.u, xin, D, m.rows_tok, t3, w3, E, m, act_fp8);
  k_swiglu<<<blocks_for((size_t)nk * F, 256), 256, 0, c->stream>>>(m.g, m.g, m.u, (size_t)nk * F, limit);
  LAUNCHED(c, "moe_experts");
  if (act_fp8 && F % 128 == 0) gpu_quantize(c, m.g, nk, F, F, 128, ST_Q_FP8_E4M3FN, 1);
  moe_gemm(c, m.y, m.g, F, NULL, t2, w2, E, m, act_fp8);
  k_moe_combine<<<blocks_for((size_t)n * D, 256), 256, 0, c->stream>>>(out, m.y, experts, weights,
                                                                       m.pair_pos, n, E, kE, D);
  LAUNCHED(c, "moe_experts");
}

/* ------------------------------------------------------------------------------------------ */
/* ST_PROFILE=1: every operation bracketed by stream events, its time summed per entry and the    */
/* table printed to stderr when the backend closes (the bits do not change)                      */

#define PROF_RING 1024

struct prof_state {
  gpuEvent_t start[PROF_RING], end[PROF_RING];
  int op[PROF_RING], pending;
  double ms[ST_OP_COUNT];
  long long calls[ST_OP_COUNT];
};

/* Sums the pending events' times (waits for them). */
static void prof_drain(gpu_ctx *c) {
  struct prof_state *p = c->prof;
  if (!p || !p->pending) return;
  (void)gpuEventSynchronize(p->end[p->pending - 1]);
  for (int k = 0; k < p->pending; k++) {
    float ms = 0;
    if (gpuEventElapsedTime(&ms, p->start[k], p->end[k]) == gpuSuccess) p->ms[p->op[k]] += ms;
    p->calls[p->op[k]]++;
  }
  p->pending = 0;
}

static int prof_begin(gpu_ctx *c, int op) {
  struct prof_state *p = c->prof;
  if (p->pending == PROF_RING) prof_drain(c);
  int k = p->pending++;
  p->op[k] = op;
  (void)gpuEventRecord(p->start[k], c->stream);
  return k;
}

static void prof_end(gpu_ctx *c, int k) { (void)gpuEventRecord(c->prof->end[k], c->stream); }

static void prof_open(gpu_ctx *c) {
  const char *env = getenv("ST_PROFILE");
  if (!env || !*env || !strcmp(env, "0")) return;
  struct prof_state *p = (struct prof_state *)calloc(1, sizeof *p);
  if (!p) return;
  for (int k = 0; k < PROF_RING; k++)
    if (gpuEventCreate(&p->start[k]) != gpuSuccess || gpuEventCreate(&p->end[k]) != gpuSuccess) {
      (void)gpuGetLastError();
      free(p); /* (the events made so far are the runtime's to reclaim at exit) */
      return;
    }
  c->prof = p;
}

static void prof_close(gpu_ctx *c) {
  struct prof_state *p = c->prof;
  if (!p) return;
  prof_drain(c);
  double total = 0;
  for (int o = 0; o < ST_OP_COUNT; o++) total += p->ms[o];
  fprintf(stderr, "%s profile (ST_PROFILE): time on the stream per operation\n", BACKEND_NAME);
  fprintf(stderr, "  %-18s %10s %12s %7s\n", "operation", "calls", "ms", "share");
  for (int o = 0; o < ST_OP_COUNT; o++)
    if (p->calls[o])
      fprintf(stderr, "  %-18s %10lld %12.3f %6.1f%%\n", st_op_name((st_op)o), p->calls[o], p->ms[o],
              total > 0 ? 100.0 * p->ms[o] / total : 0.0);
  fprintf(stderr, "  %-18s %10s %12.3f\n", "total", "", total);
  for (int k = 0; k < PROF_RING; k++) (void)gpuEventDestroy(p->start[k]), (void)gpuEventDestroy(p->end[k]);
  free(p);
  c->prof = NULL;
}

/* An entry wrapped in prof_begin / prof_end: profiled<ST_OP_X, decltype(&f), &f>::run. */
template <int OP, typename T, T f> struct profiled;
template <int OP, typename... A, void (*f)(void *, A...)>
struct profiled<OP, void (*)(void *, A...), f> {
  static void run(void *ctx, A... a) {
    gpu_ctx *c = (gpu_ctx *)ctx;
    if (!c->prof) return f(ctx, a...);
    int k = prof_begin(c, OP);
    f(ctx, a...);
    prof_end(c, k);
  }
};
#define PROFILED(op, fn) profiled<ST_OP_##op, decltype(&fn), &fn>::run

/* ------------------------------------------------------------------------------------------ */
/* Context and memory                                                                           */

static void gpu_close(void *ctx) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (!c) return;
  if (c->stream) (void)gpuStreamSynchronize(c->stream);
  prof_close(c);
  for (int k = 0; k < MOE_TABLES; k++) {
    if (c->tables[k].dev) (void)gpuFree(c->tables[k].dev);
    free(c->tables[k].host);
  }
  if (c->redo) (void)gpuFree(c->redo);
  if (c->stream) (void)gpuStreamDestroy(c->stream);
  free(c);
}

static const char *gpu_describe(void *ctx) { return ((gpu_ctx *)ctx)->description; }

static int gpu_supports(void *ctx, st_op op, int dtype) {
  (void)ctx, (void)op, (void)dtype;
  return 1;
}

static size_t gpu_workspace_size(void *ctx, const st_backend_limits *lim) {
  (void)ctx;
  moe_work m = moe_layout(NULL, lim->max_tokens, lim->max_experts, lim->max_expert_slots /
                          (lim->max_tokens > 0 ? lim->max_tokens : 1), lim->max_dim, lim->max_ffn);
  size_t topk = itk_bytes(lim->max_tokens, lim->max_rows, lim->max_topk);
  return m.bytes > topk ? m.bytes : topk;
}

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

/* Pinned host memory for taps: the device copies into it while later kernels run. */
static st_status gpu_host_alloc(void *ctx, size_t bytes, void **out) {
  (void)ctx;
  gpuError_t e = gpuMallocHost(out, bytes ? bytes : 16);
  if (e != gpuSuccess) {
    *out = NULL;
    (void)gpuGetLastError();
    return st_fail(ST_ENOMEM, "%s: pinning %zu bytes of host memory: %s", BACKEND_NAME, bytes,
                   gpuGetErrorString(e));
  }
  return ST_OK;
}

static void gpu_host_free(void *ctx, void *p) {
  (void)ctx;
  if (p) (void)gpuFreeHost(p);
}

static st_status gpu_download_async(void *ctx, void *dst, const void *src, size_t bytes) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (bytes) check(c, "download_async", gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToHost, c->stream));
  return latched(c);
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

/* The merge of one chunk (the top-k half of indexer_topk, profiled as topk). */
static void gpu_topk_merge(void *ctx, int32_t *idx, uint32_t *keys, const float *chunk, int64_t r0,
                           int cn, int rows, const int *visible, int n, int topk, int width) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  size_t run_bytes = sizeof(uint32_t) * 2 * (size_t)width;
  static size_t opted = 0;
  smem_opt_in(c, "indexer_topk", k_topk_merge, run_bytes, &opted);
  k_topk_merge<<<n, KT, run_bytes, c->stream>>>(idx, keys, chunk, r0, cn, rows, visible, topk, width);
  LAUNCHED(c, "indexer_topk");
}

/* Scoring and merging of each chunk, profiled (ST_PROFILE) as indexer_scores and topk: the
** logits kernel's own time stays one line of the profile. */
static void gpu_indexer_topk(void *ctx, int32_t *idx, const float *q, const float *w,
                             const float *k, int n, int rows, int heads, int dim,
                             const int *visible, int topk, int width, void *work) {
  gpu_ctx *c = (gpu_ctx *)ctx;
  if (n <= 0 || width <= 0) return;
  if (sizeof(uint32_t) * 2 * (size_t)width > c->smem_optin) {
    latch(c, "indexer_topk", "top-k width beyond one block's shared memory");
    return;
  }
  uint32_t *keys = (uint32_t *)work;
  int *vis_chunk = (int *)((char *)work + align256(sizeof(uint32_t) * (size_t)n * width));
  float *chunk = (float *)((char *)vis_chunk + align256(sizeof(int) * (size_t)n));
  for (int64_t r0 = 0; r0 == 0 || r0 < rows; r0 += TOPK_CHUNK) {
    int cn = rows - r0 < TOPK_CHUNK ? (int)(rows - r0) : TOPK_CHUNK;
    if (cn > 0) {
      k_chunk_visible<<<blocks_for((size_t)n, 256), 256, 0, c->stream>>>(vis_chunk, visible, n, r0, cn);
      LAUNCHED(c, "indexer_topk");
      PROFILED(INDEXER_SCORES, gpu_indexer_scores)(c, chunk, q, w, k + r0 * dim, n, cn, heads, dim, vis_chunk);
    }
    PROFILED(TOPK, gpu_topk_merge)(c, idx, keys, chunk, r0, cn, rows, visible, n, topk, width);
  }
}

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
  t->host_alloc = gpu_host_alloc;
  t->host_free = gpu_host_free;
  t->download_async = gpu_download_async;
  t->matmul = PROFILED(MATMUL, gpu_matmul);
  t->matmul_grouped = PROFILED(MATMUL_GROUPED, gpu_matmul_grouped);
  t->embed = PROFILED(EMBED, gpu_embed);
  t->rmsnorm = PROFILED(RMSNORM, gpu_rmsnorm);
  t->rope = PROFILED(ROPE, gpu_rope);
  t->hadamard = PROFILED(HADAMARD, gpu_hadamard);
  t->round_bf16 = PROFILED(ROUND_BF16, gpu_round_bf16);
  t->quantize = PROFILED(QUANTIZE, gpu_quantize);
  t->add = PROFILED(ADD, gpu_add);
  t->scale = PROFILED(SCALE, gpu_scale);
  t->fill = PROFILED(FILL, gpu_fill);
  t->hc_weights = PROFILED(HC_WEIGHTS, gpu_hc_weights);
  t->hc_collapse = PROFILED(HC_COLLAPSE, gpu_hc_collapse);
  t->hc_expand = PROFILED(HC_EXPAND, gpu_hc_expand);
  t->hc_head = PROFILED(HC_HEAD, gpu_hc_head);
  t->compress = PROFILED(COMPRESS, gpu_compress);
  t->indexer_scores = PROFILED(INDEXER_SCORES, gpu_indexer_scores);
  t->indexer_topk = gpu_indexer_topk; /* profiled by its parts */
  t->topk = PROFILED(TOPK, gpu_topk);
  t->candidates = PROFILED(CANDIDATES, gpu_candidates);
  t->sparse_attention = PROFILED(SPARSE_ATTENTION, gpu_sparse_attention);
  t->moe_route = PROFILED(MOE_ROUTE, gpu_moe_route);
  t->gather_rows = PROFILED(GATHER_ROWS, gpu_gather_rows);
  t->scatter_add = PROFILED(SCATTER_ADD, gpu_scatter_add);
  t->swiglu = PROFILED(SWIGLU, gpu_swiglu);
  t->moe_experts = PROFILED(MOE_EXPERTS, gpu_moe_experts);
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
  prof_open(c);
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
  c->sms = prop.multiProcessorCount;
  snprintf(c->description, sizeof c->description, "%.200s, device %d, %d SMs, %.0f GiB", prop.name,
           device, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024 * 1024));
  static int filled;
  if (!filled) fill_table(&gpu_ops), filled = 1;
  out->ops = &gpu_ops;
  out->ctx = c;
  return ST_OK;
}
