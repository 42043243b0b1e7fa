/*
** devemu.c — the cpu-ref-devemu backend: cpu-ref's arithmetic behind memory the host cannot
** touch. It exists to run and debug the engine's device path (host_memory = 0: weights uploaded
** at session create, per-chunk host data uploaded, taps and results downloaded) on a machine
** without a GPU, so that the first run on one does not die on an engine bug. Opened by name
** (st_backend_open("cpu-ref-devemu")); not one of the user-facing names of st_backend_names.
**
** Memory. The device is one reservation of address space (an anonymous private mapping,
** PROT_NONE). alloc hands out page-aligned blocks of it, first fit in address order; free gives
** the pages back to the kernel (MADV_DONTNEED), so every block is zero-filled when handed out
** without the host ever writing it. Outside a backend entry the part of the reservation ever
** handed out is PROT_NONE: the engine, a replay or a tap sink dereferencing device memory gets
** SIGSEGV at the faulting instruction, every time. An entry (an op, upload, download, copy)
** makes it PROT_READ | PROT_WRITE for the whole call, so cpu-ref's OpenMP workers, which run
** inside the call, see what the calling thread sees. Host threads may call entries concurrently:
** a depth count under the context's mutex opens the arena for the first one in and closes it
** after the last one out (while one is inside, another thread's stray read goes unnoticed).
**
** Checks a GPU makes, or crashes on: every pointer an op receives is device memory (or NULL),
** including the data and scales of its weights; upload reads host memory into one allocation,
** download the reverse, copy stays within allocations and does not overlap; free is given an
** allocation. A violating op is skipped and the error latched, as a device backend latches a
** failed kernel (backend.h "Errors"): the next synchronize or download returns ST_EINVAL naming
** the entry and the argument. A memory entry that violates them returns the error itself.
** ST_DEVEMU_ABORT=1 in the environment aborts at the violation instead (for a backtrace).
**
** download_async (the engine's taps) takes the bytes at the call, as a stream copy queued behind
** the work before it would, and writes them to the host only at the next synchronize or
** download: until then the destination holds 0xA5 bytes, so an engine that reads a tap before
** waiting for it reads garbage here, as it would on a GPU some of the time.
**
** The arithmetic is cpu-ref's, called through st_backend_cpu_ref_ops with cpu-ref's own context:
** the bits are cpu-ref's bits (tests/test_digests.c holds devemu to cpu-ref's digests). The
** optional entries cpu-ref leaves NULL (indexer_topk, moe_experts) stay NULL here.
**
** Cost: two mprotect calls of the used arena per entry; fine for the bundled models and the test
** fixtures, slow for anything large. ST_DEVEMU_RESERVE_GIB sets the reservation (default 64).
*/
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/base.h"
#include "kernels/backend.h"

#define REF (&st_backend_cpu_ref_ops)

/* A live allocation: [start, start + bytes) as asked for, [start, start + span) in pages. */
typedef struct block {
  uintptr_t start;
  size_t bytes, span;
} block;

typedef struct devemu_ctx {
  st_backend ref;        /* cpu-ref: its context is what its entries get */
  unsigned char *base;   /* the reservation */
  size_t reserved;       /* its bytes */
  size_t high;           /* bytes from base ever handed out (a page multiple): the part toggled */
  size_t page;
  block *blocks;         /* live allocations, ascending start */
  int n_blocks, cap_blocks;
  pthread_mutex_t lock;  /* guards everything below and the blocks */
  int depth;             /* entries running now; the arena is open while > 0 */
  st_status error;       /* the latched error (ST_OK: none) and its message */
  char message[512];
  char description[160];
  struct pending *pending; /* download_async copies not yet delivered, in order */
  int n_pending, cap_pending;
} devemu_ctx;

/* A queued download_async: the bytes as the stream had them (snapshot), delivered to dst at the
** next synchronize or download. */
typedef struct pending {
  void *dst, *snapshot;
  size_t bytes;
} pending;

/* ---- the arena ----------------------------------------------------------------------------- */

static void set_protection(devemu_ctx *c, uintptr_t from, size_t bytes, int prot) {
  if (!bytes) return;
  if (mprotect((void *)from, bytes, prot) != 0) {
    /* the emulation's one promise cannot be kept: stop rather than run unchecked */
    fprintf(stderr, "cpu-ref-devemu: mprotect of %zu bytes: %s\n", bytes, strerror(errno));
    abort();
  }
}

/* The first block whose start is above p (blocks ascending): the one before it may hold p. */
static int block_after(const devemu_ctx *c, uintptr_t p) {
  int lo = 0, hi = c->n_blocks;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (c->blocks[mid].start <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The allocation holding [p, p + bytes) (a pointer one past its end counts, for bytes 0), or
** NULL. Under the lock. */
static const block *find_block(const devemu_ctx *c, const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p;
  int k = block_after(c, a) - 1;
  if (k < 0) return NULL;
  const block *b = &c->blocks[k];
  return a - b->start <= b->bytes && bytes <= b->bytes - (a - b->start) ? b : NULL;
}

static int in_arena(const devemu_ctx *c, const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)c->base, hi = lo + c->reserved;
  return a < hi && a + bytes > lo;
}

/* Keeps the first error (under the lock); aborts instead when ST_DEVEMU_ABORT is set. */
static void latch(devemu_ctx *c, const char *fmt, ...) {
  char msg[sizeof c->message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *abort_env = getenv("ST_DEVEMU_ABORT");
  if (abort_env && atoi(abort_env)) {
    fprintf(stderr, "cpu-ref-devemu: %s\n", msg);
    abort();
  }
  if (c->error) return;
  c->error = ST_EINVAL;
  memcpy(c->message, msg, sizeof msg);
}

/* Opens the arena for one entry (under the lock). */
static void open_arena(devemu_ctx *c) {
  if (c->depth++ == 0) set_protection(c, (uintptr_t)c->base, c->high, PROT_READ | PROT_WRITE);
}

static void close_arena(devemu_ctx *c) {
  pthread_mutex_lock(&c->lock);
  ST_ASSERT(c->depth > 0);
  if (--c->depth == 0) set_protection(c, (uintptr_t)c->base, c->high, PROT_NONE);
  pthread_mutex_unlock(&c->lock);
}

/* An op's entry: 1 with the arena open when every pointer it gets (ptrs, and the data and scales
** of weights) is device memory or NULL; else 0 with the error latched, and the op is skipped. */
static int op_enter(devemu_ctx *c, const char *op, const void *const *ptrs, int n_ptrs,
                    const st_weight *const *weights, int n_weights) {
  int ok = 1;
  pthread_mutex_lock(&c->lock);
  for (int k = 0; k < n_ptrs && ok; k++)
    if (ptrs[k] && !find_block(c, ptrs[k], 0)) {
      latch(c, "%s: pointer argument %d (%p) is not device memory (%s)", op, k + 1, ptrs[k],
            in_arena(c, ptrs[k], 1) ? "freed or between allocations" : "a host pointer");
      ok = 0;
    }
  for (int k = 0; k < n_weights && ok; k++) {
    const st_weight *w = weights[k];
    if (!w) continue;
    if (!w->data || !find_block(c, w->data, st_weight_data_bytes(w)) ||
        (w->scales && !find_block(c, w->scales, st_weight_scale_bytes(w)))) {
      latch(c, "%s: weight [%lld, %lld] %s has %s (%p, scales %p) outside device memory", op,
            (long long)w->rows, (long long)w->cols, st_wtype_name(w->dtype),
            w->data ? "data or scales" : "no data", w->data, w->scales);
      ok = 0;
    }
  }
  if (ok) open_arena(c);
  pthread_mutex_unlock(&c->lock);
  return ok;
}

/* ---- the operations: cpu-ref's, each between op_enter and close_arena ---------------------- */

#define PTRS(...) (const void *const[]){__VA_ARGS__}, (int)(sizeof((const void *[]){__VA_ARGS__}) / sizeof(void *))
#define WEIGHTS(...) \
  (const st_weight *const[]){__VA_ARGS__}, (int)(sizeof((const st_weight *[]){__VA_ARGS__}) / sizeof(void *))
#define NO_WEIGHTS NULL, 0
/* Runs cpu-ref's entry `op` with the arguments after `weights` when the pointers check out. */
#define RUN(op, ptrs, weights, ...)                                   \
  do {                                                                \
    devemu_ctx *c_ = ctx;                                             \
    if (op_enter(c_, #op, ptrs, weights)) {                           \
      REF->op(c_->ref.ctx, __VA_ARGS__);                              \
      close_arena(c_);                                                \
    }                                                                 \
  } while (0)

static void dv_matmul(void *ctx, float *y, const float *x, const st_weight *w, int n) {
  RUN(matmul, PTRS(y, x), WEIGHTS(w), y, x, w, n);
}
static void dv_matmul_grouped(void *ctx, float *y, const float *x, const st_weight *w, int n, int groups) {
  RUN(matmul_grouped, PTRS(y, x), WEIGHTS(w), y, x, w, n, groups);
}
static void dv_embed(void *ctx, float *X, const st_weight *table, const int32_t *tokens, int n, int hc) {
  RUN(embed, PTRS(X, tokens), WEIGHTS(table), X, table, tokens, n, hc);
}
static void dv_rmsnorm(void *ctx, float *y, const float *x, const float *weight, int n, int dim, float eps) {
  RUN(rmsnorm, PTRS(y, x, weight), NO_WEIGHTS, y, x, weight, n, dim, eps);
}
static void dv_rope(void *ctx, float *x, int n, int heads, int head_dim, int rope_dim,
                    const int64_t *positions, const float *cos_table, const float *sin_table, int neox,
                    int inverse) {
  RUN(rope, PTRS(x, positions, cos_table, sin_table), NO_WEIGHTS, x, n, heads, head_dim, rope_dim,
      positions, cos_table, sin_table, neox, inverse);
}
static void dv_hadamard(void *ctx, float *x, int n, int dim) {
  RUN(hadamard, PTRS(x), NO_WEIGHTS, x, n, dim);
}
static void dv_round_bf16(void *ctx, float *x, size_t count) {
  RUN(round_bf16, PTRS(x), NO_WEIGHTS, x, count);
}
static void dv_quantize(void *ctx, float *x, int rows, int64_t stride, int len, int block,
                        st_qformat format, int ue8m0) {
  RUN(quantize, PTRS(x), NO_WEIGHTS, x, rows, stride, len, block, format, ue8m0);
}
static void dv_add(void *ctx, float *y, const float *a, const float *b, size_t count) {
  RUN(add, PTRS(y, a, b), NO_WEIGHTS, y, a, b, count);
}
static void dv_scale(void *ctx, float *x, float s, size_t count) {
  RUN(scale, PTRS(x), NO_WEIGHTS, x, s, count);
}
static void dv_fill(void *ctx, float *x, float value, size_t count) {
  RUN(fill, PTRS(x), NO_WEIGHTS, x, value, count);
}
static void dv_hc_weights(void *ctx, float *pre, float *post, float *comb, const float *X,
                          const float *fn, const float *base, const float *scale, int n, int hc, int D,
                          float norm_eps, float hc_eps, int sinkhorn_iters) {
  RUN(hc_weights, PTRS(pre, post, comb, X, fn, base, scale), NO_WEIGHTS, pre, post, comb, X, fn, base,
      scale, n, hc, D, norm_eps, hc_eps, sinkhorn_iters);
}
static void dv_hc_collapse(void *ctx, float *x, const float *X, const float *pre, int n, int hc, int D) {
  RUN(hc_collapse, PTRS(x, X, pre), NO_WEIGHTS, x, X, pre, n, hc, D);
}
static void dv_hc_expand(void *ctx, float *Xout, const float *a, const float *X, const float *post,
                         const float *comb, int n, int hc, int D) {
  RUN(hc_expand, PTRS(Xout, a, X, post, comb), NO_WEIGHTS, Xout, a, X, post, comb, n, hc, D);
}
static void dv_hc_head(void *ctx, float *y, const float *X, const float *fn, const float *base,
                       const float *scale, int n, int hc, int D, float norm_eps, float hc_eps) {
  RUN(hc_head, PTRS(y, X, fn, base, scale), NO_WEIGHTS, y, X, fn, base, scale, n, hc, D, norm_eps,
      hc_eps);
}
static void dv_compress(void *ctx, float *rows, float *state_kv, float *state_score, const float *kv,
                        const float *score, const float *ape, int n, int64_t p0, int m, int d,
                        int overlap) {
  RUN(compress, PTRS(rows, state_kv, state_score, kv, score, ape), NO_WEIGHTS, rows, state_kv,
      state_score, kv, score, ape, n, p0, m, d, overlap);
}
static void dv_indexer_scores(void *ctx, float *scores, const float *q, const float *w, const float *k,
                              int n, int rows, int heads, int dim, const int *visible) {
  RUN(indexer_scores, PTRS(scores, q, w, k, visible), NO_WEIGHTS, scores, q, w, k, n, rows, heads, dim,
      visible);
}
static void dv_topk(void *ctx, int32_t *idx, const float *scores, int n, int rows, const int *visible,
                    int k, int width, void *work) {
  RUN(topk, PTRS(idx, scores, visible, work), NO_WEIGHTS, idx, scores, n, rows, visible, k, width, work);
}
static void dv_candidates(void *ctx, int32_t *cand, const int32_t *topk, int n, int64_t p0, int window,
                          int width, int32_t compressed_base, int ratio) {
  RUN(candidates, PTRS(cand, topk), NO_WEIGHTS, cand, topk, n, p0, window, width, compressed_base, ratio);
}
static void dv_sparse_attention(void *ctx, float *out, const float *q, const float *kv,
                                const int32_t *cand, int n, int heads, int d, int width,
                                const float *sinks, float scale, int probs_bf16) {
  RUN(sparse_attention, PTRS(out, q, kv, cand, sinks), NO_WEIGHTS, out, q, kv, cand, n, heads, d, width,
      sinks, scale, probs_bf16);
}
static void dv_moe_route(void *ctx, int32_t *experts, float *weights, float *logits, const float *bias,
                         const int32_t *hash_experts, int n, int E, int kE, float route_scale) {
  RUN(moe_route, PTRS(experts, weights, logits, bias, hash_experts), NO_WEIGHTS, experts, weights,
      logits, bias, hash_experts, n, E, kE, route_scale);
}
static void dv_gather_rows(void *ctx, float *dst, const float *src, const int32_t *rows, int count, int D) {
  RUN(gather_rows, PTRS(dst, src, rows), NO_WEIGHTS, dst, src, rows, count, D);
}
static void dv_scatter_add(void *ctx, float *out, const float *y, const int32_t *rows, const float *weight,
                           int count, int D) {
  RUN(scatter_add, PTRS(out, y, rows, weight), NO_WEIGHTS, out, y, rows, weight, count, D);
}
static void dv_swiglu(void *ctx, float *h, const float *g, const float *u, int n, int F, float limit) {
  RUN(swiglu, PTRS(h, g, u), NO_WEIGHTS, h, g, u, n, F, limit);
}

/* ---- context and memory -------------------------------------------------------------------- */

static void dv_close(void *ctx) {
  devemu_ctx *c = ctx;
  if (!c) return;
  if (c->base) munmap(c->base, c->reserved);
  free(c->blocks);
  for (int k = 0; k < c->n_pending; k++) free(c->pending[k].snapshot);
  free(c->pending);
  st_backend_close(&c->ref);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static const char *dv_describe(void *ctx) { return ((devemu_ctx *)ctx)->description; }

static int dv_supports(void *ctx, st_op op, int dtype) {
  devemu_ctx *c = ctx;
  return REF->supports ? REF->supports(c->ref.ctx, op, dtype) : 1;
}

static size_t dv_workspace_size(void *ctx, const st_backend_limits *lim) {
  devemu_ctx *c = ctx;
  return REF->workspace_size(c->ref.ctx, lim);
}

/* First fit in address order among the gaps between live blocks, else above the high mark. */
static st_status dv_alloc(void *ctx, size_t bytes, void **out) {
  devemu_ctx *c = ctx;
  *out = NULL;
  size_t span = ((bytes ? bytes : 1) + c->page - 1) / c->page * c->page;
  st_status rc = ST_OK;
  pthread_mutex_lock(&c->lock);
  if (c->n_blocks == c->cap_blocks) {
    int cap = c->cap_blocks ? 2 * c->cap_blocks : 256;
    block *grown = realloc(c->blocks, sizeof *grown * (size_t)cap);
    if (!grown) { rc = st_fail(ST_ENOMEM, "cpu-ref-devemu: allocation table"); goto out; }
    c->blocks = grown;
    c->cap_blocks = cap;
  }
  uintptr_t at = (uintptr_t)c->base;
  int k = 0;
  for (; k < c->n_blocks; k++) {
    if (c->blocks[k].start - at >= span) break;
    at = c->blocks[k].start + c->blocks[k].span;
  }
  size_t end = at + span - (uintptr_t)c->base;
  if (span > c->reserved || end > c->reserved) {
    rc = st_fail(ST_ENOMEM, "cpu-ref-devemu: %zu bytes do not fit in the %zu MiB reserved (%zu MiB "
                 "in use; ST_DEVEMU_RESERVE_GIB sets the reservation)", bytes, c->reserved >> 20,
                 c->high >> 20);
    goto out;
  }
  if (end > c->high) {
    /* the new pages join the toggled part; open already when an entry is running */
    if (c->depth > 0) set_protection(c, (uintptr_t)c->base + c->high, end - c->high, PROT_READ | PROT_WRITE);
    c->high = end;
  }
  memmove(c->blocks + k + 1, c->blocks + k, sizeof *c->blocks * (size_t)(c->n_blocks - k));
  c->blocks[k] = (block){.start = at, .bytes = bytes, .span = span};
  c->n_blocks++;
  *out = (void *)at; /* zero: never written, or given back to the kernel by free */
out:
  pthread_mutex_unlock(&c->lock);
  return rc;
}

static void dv_free(void *ctx, void *p) {
  devemu_ctx *c = ctx;
  if (!p) return;
  pthread_mutex_lock(&c->lock);
  int k = block_after(c, (uintptr_t)p) - 1;
  if (k < 0 || c->blocks[k].start != (uintptr_t)p) {
    /* free returns nothing and comes last: say it now, the latch may never be read */
    fprintf(stderr, "cpu-ref-devemu: free: %p is not an allocation\n", p);
    latch(c, "free: %p is not an allocation", p);
  } else {
    /* the pages go back to the kernel: the next block here starts zero-filled */
    int dropped = madvise((void *)c->blocks[k].start, c->blocks[k].span, MADV_DONTNEED);
    ST_ASSERT(dropped == 0); /* a private anonymous mapping, page-aligned: cannot fail */
    memmove(c->blocks + k, c->blocks + k + 1, sizeof *c->blocks * (size_t)(c->n_blocks - k - 1));
    c->n_blocks--;
  }
  pthread_mutex_unlock(&c->lock);
}

/* The latched error, once (the caller's st_errmsg gets its message); ST_OK when none. */
static st_status take_error(devemu_ctx *c) {
  if (!c->error) return ST_OK;
  st_status rc = c->error;
  c->error = ST_OK;
  return st_fail(rc, "cpu-ref-devemu: %s", c->message);
}

/* One transfer: checks both sides (dst/src device or host as the entry says), then copies. */
static st_status transfer(devemu_ctx *c, const char *entry, void *dst, int dst_device, const void *src,
                          int src_device, size_t bytes) {
  st_status rc = ST_OK;
  pthread_mutex_lock(&c->lock);
  if (!strcmp(entry, "download") && (rc = take_error(c))) goto out;
  const void *sides[2] = {dst, src};
  const int device[2] = {dst_device, src_device};
  for (int k = 0; k < 2; k++) {
    const char *side = k ? "source" : "destination";
    if (device[k] && !find_block(c, sides[k], bytes)) {
      rc = st_fail(ST_EINVAL, "cpu-ref-devemu: %s of %zu bytes: the %s %p is not %zu bytes of one "
                   "device allocation (%s)", entry, bytes, side, sides[k], bytes,
                   in_arena(c, sides[k], 1) ? "past its end, freed or between allocations"
                                            : "a host pointer");
      goto out;
    }
    if (!device[k] && bytes && in_arena(c, sides[k], bytes)) {
      rc = st_fail(ST_EINVAL, "cpu-ref-devemu: %s of %zu bytes: the %s %p is device memory, where "
                   "host memory is expected", entry, bytes, side, sides[k]);
      goto out;
    }
  }
  if (dst_device && src_device && bytes && (uintptr_t)dst < (uintptr_t)src + bytes &&
      (uintptr_t)src < (uintptr_t)dst + bytes) {
    rc = st_fail(ST_EINVAL, "cpu-ref-devemu: copy of %zu bytes between overlapping ranges %p and %p",
                 bytes, dst, src);
    goto out;
  }
  if (!bytes) goto out;
  open_arena(c);
  pthread_mutex_unlock(&c->lock);
  memcpy(dst, src, bytes);
  close_arena(c);
  return ST_OK;
out:
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* The queued copies reach host memory, as a device stream's would once waited for. Caller holds
** the lock. */
static void deliver_pending(devemu_ctx *c) {
  for (int k = 0; k < c->n_pending; k++) {
    memcpy(c->pending[k].dst, c->pending[k].snapshot, c->pending[k].bytes);
    free(c->pending[k].snapshot);
  }
  c->n_pending = 0;
}

static st_status dv_upload(void *ctx, void *dst, const void *src_host, size_t bytes) {
  return transfer(ctx, "upload", dst, 1, src_host, 0, bytes);
}
static st_status dv_download(void *ctx, void *dst_host, const void *src, size_t bytes) {
  devemu_ctx *c = ctx;
  pthread_mutex_lock(&c->lock);
  deliver_pending(c); /* a download waits for the work queued before it */
  pthread_mutex_unlock(&c->lock);
  return transfer(ctx, "download", dst_host, 0, src, 1, bytes);
}

/* Host memory for download_async (nothing to pin here). */
static st_status dv_host_alloc(void *ctx, size_t bytes, void **out) {
  (void)ctx;
  *out = malloc(bytes ? bytes : 1);
  return *out ? ST_OK : st_fail(ST_ENOMEM, "cpu-ref-devemu: host_alloc of %zu bytes", bytes);
}
static void dv_host_free(void *ctx, void *p) { (void)ctx, free(p); }

/* The bytes are taken now (the stream's order) and reach dst_host only at the next synchronize or
** download; until then dst_host holds 0xA5 bytes, so a reader that does not wait reads them. */
static st_status dv_download_async(void *ctx, void *dst_host, const void *src, size_t bytes) {
  devemu_ctx *c = ctx;
  void *snapshot = malloc(bytes ? bytes : 1);
  if (!snapshot) return st_fail(ST_ENOMEM, "cpu-ref-devemu: download_async of %zu bytes", bytes);
  st_status rc = transfer(c, "download_async", snapshot, 0, src, 1, bytes);
  pthread_mutex_lock(&c->lock);
  if (!rc && bytes && in_arena(c, dst_host, bytes))
    rc = st_fail(ST_EINVAL, "cpu-ref-devemu: download_async of %zu bytes: the destination %p is "
                 "device memory, where host memory is expected", bytes, dst_host);
  if (!rc && c->n_pending == c->cap_pending) {
    int cap = c->cap_pending ? 2 * c->cap_pending : 64;
    pending *grown = realloc(c->pending, sizeof *grown * (size_t)cap);
    if (!grown) rc = st_fail(ST_ENOMEM, "cpu-ref-devemu: download_async queue");
    else c->pending = grown, c->cap_pending = cap;
  }
  if (rc) {
    pthread_mutex_unlock(&c->lock);
    free(snapshot);
    return rc;
  }
  memset(dst_host, 0xA5, bytes);
  c->pending[c->n_pending++] = (pending){dst_host, snapshot, bytes};
  pthread_mutex_unlock(&c->lock);
  return ST_OK;
}
static st_status dv_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  return transfer(ctx, "copy", dst, 1, src, 1, bytes);
}

static st_status dv_synchronize(void *ctx) {
  devemu_ctx *c = ctx;
  pthread_mutex_lock(&c->lock);
  deliver_pending(c);
  st_status rc = take_error(c);
  pthread_mutex_unlock(&c->lock);
  return rc;
}

static const st_backend_ops devemu_ops = {
  .name = "cpu-ref-devemu",
  .kernel_mode = "deterministic",
  .host_memory = 0,
  .close = dv_close,
  .describe = dv_describe,
  .supports = dv_supports,
  .workspace_size = dv_workspace_size,
  .alloc = dv_alloc,
  .free = dv_free,
  .upload = dv_upload,
  .download = dv_download,
  .copy = dv_copy,
  .synchronize = dv_synchronize,
  .host_alloc = dv_host_alloc,
  .host_free = dv_host_free,
  .download_async = dv_download_async,
  .matmul = dv_matmul,
  .matmul_grouped = dv_matmul_grouped,
  .embed = dv_embed,
  .rmsnorm = dv_rmsnorm,
  .rope = dv_rope,
  .hadamard = dv_hadamard,
  .round_bf16 = dv_round_bf16,
  .quantize = dv_quantize,
  .add = dv_add,
  .scale = dv_scale,
  .fill = dv_fill,
  .hc_weights = dv_hc_weights,
  .hc_collapse = dv_hc_collapse,
  .hc_expand = dv_hc_expand,
  .hc_head = dv_hc_head,
  .compress = dv_compress,
  .indexer_scores = dv_indexer_scores,
  .topk = dv_topk,
  .indexer_topk = NULL, /* cpu-ref has none (asserted at open) */
  .candidates = dv_candidates,
  .sparse_attention = dv_sparse_attention,
  .moe_route = dv_moe_route,
  .gather_rows = dv_gather_rows,
  .scatter_add = dv_scatter_add,
  .swiglu = dv_swiglu,
  .moe_experts = NULL,  /* likewise */
};

st_status st_backend_cpu_ref_open(st_backend *out);

st_status st_backend_devemu_open(st_backend *out) {
  /* a fused entry cpu-ref gains must be wrapped here too, or devemu would compose what cpu-ref fuses */
  ST_ASSERT(!REF->indexer_topk && !REF->moe_experts);
  devemu_ctx *c = calloc(1, sizeof *c);
  if (!c) return st_fail(ST_ENOMEM, "cpu-ref-devemu context");
  st_status rc = st_backend_cpu_ref_open(&c->ref);
  if (rc) { free(c); return rc; }
  pthread_mutex_init(&c->lock, NULL);
  long page = sysconf(_SC_PAGESIZE);
  c->page = page > 0 ? (size_t)page : 4096;
  const char *env = getenv("ST_DEVEMU_RESERVE_GIB");
  size_t gib = env && atol(env) > 0 ? (size_t)atol(env) : 64;
  /* address space only: PROT_NONE pages cost nothing until an entry opens and touches them */
  for (; gib >= 1; gib /= 2) {
    void *p = mmap(NULL, gib << 30, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      c->base = p;
      c->reserved = gib << 30;
      break;
    }
  }
  if (!c->base) {
    dv_close(c);
    return st_fail(ST_ENOMEM, "cpu-ref-devemu: cannot reserve address space for its memory: %s",
                   strerror(errno));
  }
  snprintf(c->description, sizeof c->description,
           "cpu-ref arithmetic, emulated device memory: %zu GiB arena, PROT_NONE outside backend "
           "calls", gib);
  out->ops = &devemu_ops;
  out->ctx = c;
  return ST_OK;
}
