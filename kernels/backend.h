/*
** backend.h — the device boundary: one table of operations and memory entries that the forward
** pass, replay and the benchmarks call for everything that touches activations or weights
** (docs/design.md "Architecture", kernels/; the shape of ggml's backend + buffer layer,
** shrunk to what DeepSeek-V4 needs).
**
** A backend is a handle { ops, ctx }. Every entry takes the context first: a GPU backend keeps
** its stream, BLAS handle, workspace and latched error there; the CPU backends keep almost
** nothing. Open one by name with st_backend_open ("cpu-ref", "cpu", "cuda", "hip"; and
** "cpu-ref-devemu", below).
**
** Memory. Every pointer an operation reads or writes is memory of the backend that runs it,
** allocated with ops->alloc (zero-filled) and filled with upload / copy. Host data reaches it
** only through upload; results leave only through download (or download_async, into host_alloc
** memory: how a device backend hands over taps without a wait). When ops->host_memory is 1 (the CPU
** backends) backend memory is ordinary host memory: the engine may then read it in place and
** hand host pointers (weights mapped from the checkpoint) to operations directly.
**
** Errors. Memory entries return st_status. Operations return nothing: a failure inside one (a
** kernel launch, a BLAS call) is latched in the context, and the next synchronize or download
** returns it (with st_errmsg naming the operation). The CPU backends cannot fail once their
** memory is allocated.
**
** Shapes are explicit, layouts row-major, every output preallocated by the caller; no operation
** allocates. Index lists use -1 for "none". "n" is a count of token rows throughout.
**
** Determinism (every backend, default mode): every output element is produced by one thread in a
** reduction order fixed by the shapes alone; no float atomics; top-k ties go to the lower index.
** So a backend gives the same bits for any thread count and any chunking of the tokens, and a
** replay of the recorded settings on the recording backend reproduces the recorded tensors.
** cpu-ref (kernels/cpu-ref/) is scalar and the oracle; cpu (kernels/cpu/) is blocked and
** vectorised; their bits may differ within the per-op budgets of tests/test_backend_ops.c.
**
** Optional (fused) entries may be NULL; the engine then composes them from the primitives, so
** there is one forward pass for every backend (engine/model.c).
*/
#ifndef ST_BACKEND_H
#define ST_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/base.h"

/* ------------------------------------------------------------------------------------------ */
/* Typed weights: a matrix in its stored format                                                 */

typedef enum st_wtype {
  ST_W_F32,       /* 4 bytes an element */
  ST_W_BF16,      /* 2 bytes */
  ST_W_F16,       /* 2 bytes */
  ST_W_FP8_E4M3,  /* OCP e4m3fn, 1 byte; block scales */
  ST_W_FP4_E2M1,  /* two an byte, element 2k in the low nibble of byte k; a ue8m0 scale per 32 */
  ST_W_TYPE_COUNT
} st_wtype;

typedef enum st_wscale {
  ST_WSCALE_NONE,
  ST_WSCALE_F32,   /* 4 bytes a scale */
  ST_WSCALE_BF16,  /* 2 bytes */
  ST_WSCALE_UE8M0, /* 1 byte: 2^(e - 127) */
} st_wscale;

/* W [rows, cols] = [out, in]. Scales, when present, are [ceil(rows / block[0]),
** ceil(cols / block[1])] row-major: FP8 128x128 (or 64x64, 128x64 ...), FP4 1x32. Element (r, c)
** decodes to value(r, c) * scale(r / block[0], c / block[1]) in one fp32 multiplication (exact for
** power-of-two scales). Rows are contiguous: row r starts at data + r * row_bytes. */
typedef struct st_weight {
  st_wtype dtype;
  st_wscale scale_dtype;
  int block[2];
  int64_t rows, cols;
  const void *data;   /* backend memory */
  const void *scales; /* backend memory, or NULL */
} st_weight;

const char *st_wtype_name(st_wtype t);
/* Bytes of data / of scales of a weight (its resident size is their sum). */
size_t st_weight_data_bytes(const st_weight *w);
size_t st_weight_scale_bytes(const st_weight *w);

/* ------------------------------------------------------------------------------------------ */
/* Operations                                                                                   */

/* Operation ids: supports(), test_backend_ops and benchmark tables name them from this list. */
#define ST_BACKEND_OPS(X)                                                                        \
  X(MATMUL, "matmul") X(MATMUL_GROUPED, "matmul_grouped") X(EMBED, "embed")                      \
  X(RMSNORM, "rmsnorm") X(ROPE, "rope") X(HADAMARD, "hadamard") X(ROUND_BF16, "round_bf16")      \
  X(QUANTIZE, "quantize") X(ADD, "add") X(SCALE, "scale") X(FILL, "fill")                        \
  X(HC_WEIGHTS, "hc_weights") X(HC_COLLAPSE, "hc_collapse") X(HC_EXPAND, "hc_expand")            \
  X(HC_HEAD, "hc_head") X(COMPRESS, "compress") X(INDEXER_SCORES, "indexer_scores")              \
  X(TOPK, "topk") X(INDEXER_TOPK, "indexer_topk") X(CANDIDATES, "candidates")                    \
  X(SPARSE_ATTENTION, "sparse_attention") X(MOE_ROUTE, "moe_route") X(GATHER_ROWS, "gather_rows") \
  X(SCATTER_ADD, "scatter_add") X(SWIGLU, "swiglu") X(MOE_EXPERTS, "moe_experts")
typedef enum st_op {
#define ST_OP_ENUM(id, name) ST_OP_##id,
  ST_BACKEND_OPS(ST_OP_ENUM)
#undef ST_OP_ENUM
  ST_OP_COUNT
} st_op;
const char *st_op_name(st_op op);

/* Formats the quantize operation rounds through (engine settings map onto these one to one). */
typedef enum st_qformat {
  ST_Q_BF16,             /* per element */
  ST_Q_FP8_E4M3FN,       /* e4m3fn codes, one scale per block (amax / 448, or ue8m0) */
  ST_Q_FP8_E4M3FNUZ,     /* e4m3fnuz codes, amax / 240 */
  ST_Q_FP8_FN_AS_FNUZ,   /* the writer's fn scale and bytes, decoded as fnuz (SPEC F2) */
  ST_Q_FP4_E2M1,         /* e2m1 codes, ue8m0 scale per block */
} st_qformat;

/* The largest shapes a session will ask for; workspace_size sizes scratch from them. */
typedef struct st_backend_limits {
  int64_t max_tokens;  /* tokens per call (a chunk) */
  int64_t max_rows;    /* compressed rows an indexer scores */
  int max_topk;        /* width of top-k rows */
  int max_dim;         /* largest row length an operation reduces over */
  int max_experts, max_expert_slots, max_ffn; /* MoE: E, n * kE, F */
} st_backend_limits;

typedef struct st_backend_ops {
  const char *name;        /* "cpu-ref" */
  const char *kernel_mode; /* "deterministic" */
  int host_memory;         /* 1: backend memory is host memory (see the header comment) */

  /* ---- context and memory -------------------------------------------------------------- */
  void (*close)(void *ctx);                                        /* frees the context */
  const char *(*describe)(void *ctx); /* "avx512, 2 threads"; NULL: nothing beyond the name */
  int (*supports)(void *ctx, st_op op, int dtype); /* dtype: st_wtype for weight ops, else -1 */
  size_t (*workspace_size)(void *ctx, const st_backend_limits *lim);
  st_status (*alloc)(void *ctx, size_t bytes, void **out); /* zero-filled */
  void (*free)(void *ctx, void *p);                        /* accepts NULL */
  st_status (*upload)(void *ctx, void *dst, const void *src_host, size_t bytes);
  st_status (*download)(void *ctx, void *dst_host, const void *src, size_t bytes);
  st_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes); /* may not overlap */
  st_status (*synchronize)(void *ctx); /* waits for queued work; returns the latched error */
  /* Optional (NULL on host backends; the engine then downloads taps with download): host memory
  ** a device copies into directly (pinned), and a download that returns once queued behind the
  ** work before it; dst_host (host_alloc memory) holds the bytes after the next synchronize or
  ** download, and not before. */
  st_status (*host_alloc)(void *ctx, size_t bytes, void **out);
  void (*host_free)(void *ctx, void *p); /* accepts NULL */
  st_status (*download_async)(void *ctx, void *dst_host, const void *src, size_t bytes);

  /* ---- dense algebra ------------------------------------------------------------------- */
  /* y[n, w.rows] = x[n, w.cols] . W^T, W decoded from its stored format. */
  void (*matmul)(void *ctx, float *y, const float *x, const st_weight *w, int n);
  /* Grouped projection: W is [groups * r, c]; group g maps columns [g c, (g+1) c) of x [n, groups
  ** c] through rows [g r, (g+1) r) of W into columns [g r, (g+1) r) of y [n, groups r]. */
  void (*matmul_grouped)(void *ctx, float *y, const float *x, const st_weight *w, int n,
                         int groups);
  /* X[i, a, :] = row tokens[i] of table [V, D] decoded, for each of the hc streams a. */
  void (*embed)(void *ctx, float *X, const st_weight *table, const int32_t *tokens, int n, int hc);
  /* y[n, dim] = x * rsqrt(mean(x^2) + eps) * weight; weight NULL = none. y may equal x. */
  void (*rmsnorm)(void *ctx, float *y, const float *x, const float *weight, int n, int dim,
                  float eps);
  /* Rotates the last rope_dim dims of each of n*heads vectors of head_dim, row i at position
  ** positions[i]; cos/sin tables are [max_position, rope_dim/2]. neox 0: pairs (2p, 2p+1), 1:
  ** pairs (p, p + rope_dim/2). inverse 1 applies the conjugate rotation. */
  void (*rope)(void *ctx, float *x, int n, int heads, int head_dim, int rope_dim,
               const int64_t *positions, const float *cos_table, const float *sin_table, int neox,
               int inverse);
  /* x[n, dim] = H_dim x * dim^-1/2 (Sylvester order); dim a power of two. */
  void (*hadamard)(void *ctx, float *x, int n, int dim);
  /* x[k] = bf16(x[k]) for k < count (round to nearest even). */
  void (*round_bf16)(void *ctx, float *x, size_t count);
  /* Round trip through a storage format: for each row r < rows, the first len values at
  ** x + r * stride, in blocks of `block` values (block <= 0: the whole len), each block with its
  ** own scale from its amax (ue8m0 1: the power of two at or above amax / qmax; 0: amax / qmax;
  ** FP4 always ue8m0; FN_AS_FNUZ always the writer's max(amax, 1e-4) / 448). The arithmetic is
  ** kernels/lowp.h's st_fp8/fp4_roundtrip_blocks. */
  void (*quantize)(void *ctx, float *x, int rows, int64_t stride, int len, int block,
                   st_qformat format, int ue8m0);
  void (*add)(void *ctx, float *y, const float *a, const float *b, size_t count); /* y = a + b */
  void (*scale)(void *ctx, float *x, float s, size_t count);                     /* x *= s */
  void (*fill)(void *ctx, float *x, float value, size_t count);

  /* ---- mHC (SPEC §2.2) ----------------------------------------------------------------- */
  /* pre [n, hc], post [n, hc], comb [n, hc, hc] (comb[i][j]: stream i into output stream j)
  ** from the residual streams X [n, hc, D]. */
  void (*hc_weights)(void *ctx, float *pre, float *post, float *comb, const float *X,
                     const float *fn, const float *base, const float *scale, int n, int hc, int D,
                     float norm_eps, float hc_eps, int sinkhorn_iters);
  /* x[n, D] = sum_i pre[n, i] X[n, i, :] */
  void (*hc_collapse)(void *ctx, float *x, const float *X, const float *pre, int n, int hc, int D);
  /* Xout[n, j, :] = post[n, j] a[n, :] + sum_i comb[n, i, j] X[n, i, :]; Xout != X */
  void (*hc_expand)(void *ctx, float *Xout, const float *a, const float *X, const float *post,
                    const float *comb, int n, int hc, int D);
  /* hc_head: pre = sigmoid(mix * scale + base) + eps on the normalised flat streams; y = sum. */
  void (*hc_head)(void *ctx, float *y, const float *X, const float *fn, const float *base,
                  const float *scale, int n, int hc, int D, float norm_eps, float hc_eps);

  /* ---- compressor and lightning indexer (SPEC §3.2, §3.3) -------------------------------- */
  /* One chunk of tokens p0 .. p0+n through a compressor's state (ratio m, row dim d, overlap =
  ** the CSA layout with c = 2 slots of width c d): token t = p0 + i stores kv[i, :] and
  ** score[i, :] + ape[t mod m, :] in its slot; when t + 1 is a multiple of m, compressed row
  ** j = t / m is pooled into rows[j, 0..d): rows[j, k] = sum_s softmax_s(score) kv over the
  ** block's slots. Non-overlapping: the m slots [0, m), channel k at column k. Overlapping: the
  ** previous block's slots [0, m) read at column k and the current block's [m, 2m) (where token t
  ** is stored, slot m + t mod m) read at column d + k; after pooling, the current block's slots
  ** move to [0, m). State kv and score are [2 m, c d], reset by the caller to kv 0, score -inf
  ** (no previous block before block 0). kv/score inputs are [n, c d]; rows: the layer's rows. */
  void (*compress)(void *ctx, float *rows, float *state_kv, float *state_score, const float *kv,
                   const float *score, const float *ape, int n, int64_t p0, int m, int d,
                   int overlap);
  /* scores[i, j] = sum_h w[i, h] relu(q[i, h, :] . k[j, :]) for j < visible[i], -inf for
  ** visible[i] <= j < rows. */
  void (*indexer_scores)(void *ctx, float *scores, const float *q, const float *w, const float *k,
                         int n, int rows, int heads, int dim, const int *visible);
  /* Per query: the min(k, visible[i]) largest of scores[i, 0..visible[i]) (NaN ranks as -inf;
  ** ties to the lower index), ascending, into idx[i, 0..width), padded with -1. */
  void (*topk)(void *ctx, int32_t *idx, const float *scores, int n, int rows, const int *visible,
               int k, int width, void *work);
  /* Optional: indexer_scores then topk without the [n, rows] score matrix; same bits as the
  ** two composed (the engine composes them when this is NULL or when the scores are tapped). */
  void (*indexer_topk)(void *ctx, int32_t *idx, const float *q, const float *w, const float *k,
                       int n, int rows, int heads, int dim, const int *visible, int topk,
                       int width, void *work);

  /* ---- attention (SPEC §3.4) ----------------------------------------------------------- */
  /* Candidate rows of each query t = p0 + i into cand[n, window + width], indices into the
  ** layer's kv rows: first the window positions t - window + 1 .. t ascending (position p at
  ** chunk row window + (p - p0) when p >= p0, else ring slot p mod window; -1 before 0), then the
  ** compressed rows: topk[i, 0..width) + compressed_base for CSA (-1 stays -1), or for HCA
  ** (topk NULL) rows 0..width-1 + compressed_base where row j < (t + 1) / ratio, else -1. */
  void (*candidates)(void *ctx, int32_t *cand, const int32_t *topk, int n, int64_t p0, int window,
                     int width, int32_t compressed_base, int ratio);
  /* out[i, h, :] = sum_c p_c kv[cand[i, c]] with p = exp(s - M) / (sum exp(s - M) +
  ** exp(sink_h - M)), s_c = q[i, h] . kv[cand[i, c]] * scale; probs_bf16 rounds p to bf16. */
  void (*sparse_attention)(void *ctx, float *out, const float *q, const float *kv,
                           const int32_t *cand, int n, int heads, int d, int width,
                           const float *sinks, float scale, int probs_bf16);

  /* ---- MoE (SPEC §2.5) ----------------------------------------------------------------- */
  /* In place on logits [n, E], which become the sqrt(softplus) scores: experts [n, kE] =
  ** hash_experts when given (hash layers), else the kE best of score + bias (ties to the lower
  ** id); weights [n, kE] = score / sum * route_scale. */
  void (*moe_route)(void *ctx, int32_t *experts, float *weights, float *logits, const float *bias,
                    const int32_t *hash_experts, int n, int E, int kE, float route_scale);
  /* dst[k, :] = src[rows[k], :] for k < count */
  void (*gather_rows)(void *ctx, float *dst, const float *src, const int32_t *rows, int count,
                      int D);
  /* out[rows[k], :] += y[k, :] * weight[k] for k in [0, count), in order of k. */
  void (*scatter_add)(void *ctx, float *out, const float *y, const int32_t *rows,
                      const float *weight, int count, int D);
  /* h[n, F] = silu(min(g, limit)) * clamp(u, -limit, limit) */
  void (*swiglu)(void *ctx, float *h, const float *g, const float *u, int n, int F, float limit);
  /* Optional, the routed experts fused (ggml's mul_mat_id): out[n, D] += for each expert e in
  ** ascending id, for the tokens that chose it (ascending), weight * w2_e(swiglu(w1_e x, w3_e x)).
  ** act_fp8 (reference precision): the inputs of w1/w3 and of w2 go through the FP8 round trip
  ** (128-blocks, ue8m0) and every projection's output through bf16, as the composed path does. */
  void (*moe_experts)(void *ctx, float *out, const float *x, const int32_t *experts,
                      const float *weights, const st_weight *w1, const st_weight *w2,
                      const st_weight *w3, int n, int E, int kE, float limit, int act_fp8,
                      void *work);
} st_backend_ops;

typedef struct st_backend {
  const st_backend_ops *ops;
  void *ctx;
} st_backend;

/* ------------------------------------------------------------------------------------------ */
/* Registry                                                                                     */

/* Opens a backend by name: "cpu-ref", "cpu", "cuda", "hip", or ST_BACKEND_DEVEMU. ST_EUNSUPPORTED
** (the message says why: not built, no device) when it is not available here; ST_EINVAL for an
** unknown name (the message lists the known ones). */
st_status st_backend_open(const char *name, st_backend *out);
void st_backend_close(st_backend *b); /* accepts a zeroed handle */
/* The user-facing names st_backend_open knows, "|"-separated ("cpu-ref|cpu|cuda|hip"), and the
** default. */
const char *st_backend_names(void);
#define ST_BACKEND_DEFAULT "cpu"
/* A debugging backend, accepted by st_backend_open (and --backend) but left out of
** st_backend_names and the help texts: cpu-ref's arithmetic (the same bits) with host_memory = 0
** and memory that is PROT_NONE to the host outside backend calls (kernels/devemu/devemu.c), so
** the engine's device path runs on any POSIX machine and a host read of backend memory faults.
** Its traces record it as their backend, so replay and bisect reopen it. */
#define ST_BACKEND_DEVEMU "cpu-ref-devemu"

/* Convenience wrappers over the memory entries. */
static inline st_status st_backend_alloc(const st_backend *b, size_t bytes, void **out) {
  return b->ops->alloc(b->ctx, bytes, out);
}
static inline void st_backend_free(const st_backend *b, void *p) { b->ops->free(b->ctx, p); }
static inline st_status st_backend_upload(const st_backend *b, void *dst, const void *src, size_t n) {
  return b->ops->upload(b->ctx, dst, src, n);
}
static inline st_status st_backend_download(const st_backend *b, void *dst, const void *src, size_t n) {
  return b->ops->download(b->ctx, dst, src, n);
}

/* The built-in tables (kernels/cpu-ref/, kernels/cpu/). Their contexts come from st_backend_open. */
extern const st_backend_ops st_backend_cpu_ref_ops;
extern const st_backend_ops st_backend_cpu_ops;

#endif
