/*
** test_backend_ops.c — every entry of the backend table (kernels/backend.h) against a naive
** double-precision reference written here from SPEC-dsv4 and the header's contract, then every
** other backend against cpu-ref on the same inputs (in the spirit of llama.cpp's
** test-backend-ops; none of its code).
**
** What one case checks, on every backend that opens (cpu-ref, cpu, cuda, hip, and cpu-ref-devemu:
** cpu-ref behind memory the host cannot touch, which holds this file to its own rule below; one
** that is not built or has no device is SKIPPED):
**   - all memory goes through the backend: alloc, upload, run, synchronize, download, free, so the
**     same test drives a GPU backend;
**   - guard bytes before and after every output (and scratch) buffer stay untouched, and every
**     input buffer reads back unchanged;
**   - cpu-ref against the double reference within the budget below; every other backend against
**     cpu-ref within its cross budget (integer outputs exactly, ties as described below);
**   - determinism (the header's rule, for every backend): the same call twice gives the same bits;
**     OMP threads 1 vs 2 give the same bits; for ops over token rows, rows [0, n) in one call
**     equal [0, a) then [a, n) bit for bit (the engine's chunked prefill), with state (compress)
**     or accumulators (scatter_add) carried from the first call to the second.
**
** Error metrics ("err" in the table). Every float output element e gets a magnitude mag(e) from
** the reference; err = |got - expected| / mag(e), maximised over the case's elements:
**   dot   mag = sum of |terms| of the element's reduction (matmul: sum_k |x_k w_k|), so err is the
**         usual floating-point error bound's coefficient: K terms in fp32 give at most ~K 2^-24.
**   scale mag = the largest |reference| in the same output row (or the whole output).
**   elem  mag = |reference element| + 2^-20 (elementwise relative).
**   exact mag = 0: the bits must match (NaN matches any NaN; -0 and +0 differ).
** A NaN expected must be NaN, an infinity must be the same infinity, a NaN or infinity not
** expected is an error (err = inf).
**
** Budgets (err <= budget):
**   op                dtype/variant         vs double ref   cpu-ref vs other   metric
**   matmul            f32 bf16 f16          1e-5            1e-5               dot
**   matmul            fp8 (all scales), fp4 1e-5            1e-5               dot
**   matmul_grouped    every dtype           1e-5            1e-5               dot
**   embed             every dtype           exact           exact              exact
**   rmsnorm           -                     1e-5            1e-5               scale (row)
**   rope              neox 0/1, inverse     2e-6            2e-6               scale (pair)
**   hadamard          dim 1..256            4e-6            4e-6               scale (row)
**   round_bf16        -                     exact           exact              exact
**   quantize          bf16 fp8 fnuz fn-as-  exact           exact              exact
**                     fnuz fp4
**   add scale fill    -                     exact           exact              exact
**   hc_weights        -                     2e-5            2e-5               scale (abs, the
**                                                                              values are O(1))
**   hc_collapse       -                     1e-6            1e-6               dot
**   hc_expand         -                     1e-6            1e-6               dot
**   hc_head           -                     1e-5            1e-5               dot
**   compress          rows / state          4e-6 / exact    4e-6 / exact       scale (pooled kv;
**                                                                              m = 128 slots)
**   indexer_scores    -                     1e-5            1e-5               dot (-inf exact)
**   topk              -                     exact           exact              exact
**   indexer_topk      -                     tie rule        tie rule           + same bits as
**                                                                              its composition
**   candidates        -                     exact           exact              exact
**   sparse_attention  probs fp32            1e-5            1e-5               scale (max |kv|
**                     probs bf16            1e-5 + ties     1e-5 + ties         of the cands)
**   moe_route         scores / weights      1e-6 / 1e-6     1e-6 / 1e-6        scale / elem
**                     experts               tie rule        tie rule
**   gather_rows       -                     exact           exact              exact
**   scatter_add       -                     1e-6            1e-6               dot
**   swiglu            -                     1e-5            1e-5               elem
**   moe_experts       act fp32, every dtype 1e-5            1e-5               scale (output)
**   (composed, fused) act_fp8, every dtype  1e-5 + ties     1e-5 + ties        scale (output)
** "+ ties": bf16 probabilities and the FP8/bf16 round trips of moe_experts are discontinuous.
** The reference carries, per value, how far an fp32 computation may be from it (1e-5 relative,
** generous) and, where a bf16 or FP8 rounding boundary lies within that distance, adds that one
** rounding step (propagated through swiglu, the FP8 block scale and the next projection) to the
** element's tolerance; away from ties the rounded values must match exactly. Everything else is
** continuous and held near fp32 rounding. moe_experts "composed" is engine/model.c's
** routed_experts from primitives (gather_rows, quantize, matmul, round_bf16, swiglu,
** scatter_add), run on every backend; "fused" is the optional entry, checked against the
** reference and against cpu-ref's composition.
**
** Tie rule (indexer_topk on computed scores, moe_route's experts). Integer outputs are compared
** exactly, except that a selection is accepted when it differs from the reference's only by ties
** within the reference's rounding: for every selected c and every unselected u,
** not (ref[u] > ref[c] + tol) and not (ref[u] == ref[c] and u < c), with tol = budget * mag. So
** exact ties (equal inputs) must still go to the lower index; near-ties may go either way.
** Selections must also have the right count, no duplicates, -1 padding, ascending order (topk).
** topk takes its scores as inputs, so there is no rounding: it is compared exactly (NaN ranks
** as -inf; ties to the lower index). moe_route's expert order within a
** token is not part of the contract: experts are compared as (expert, weight) pairs in any order.
**
** Optional entries (indexer_topk, moe_experts) that a backend leaves NULL or declines through
** supports() are SKIP rows, as are backends that do not open (listed once at the top).
**
** Each group of ops runs in a child process writing into a shared results table: a backend that
** crashes is a FAIL of that (op, dtype, backend) and the group goes on after the crashed case.
**
** Output: one line per (op, dtype, backend) and a summary; exit 0 when all pass, 1 on any
** failure, 77 when nothing at all could run. ST_OPS_VERBOSE=1 prints every failing case,
** ST_OPS_TIMING=1 the cpu time of each group, ST_OPS_NOFORK=1 runs everything in one process.
*/
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#pragma GCC diagnostic ignored "-Wformat-truncation" /* failure messages may be cut short */

#include "common/base.h"
#include "kernels/backend.h"
#include "kernels/lowp.h"

/* ------------------------------------------------------------------------------------------ */
/* Budgets                                                                                      */

#define B_DOT 1e-5
#define B_RMS 1e-5
#define B_ROPE 2e-6
#define B_HAD 4e-6
#define B_HCW 2e-5
#define B_HCC 1e-6
#define B_HCHEAD 1e-5
#define B_COMP 4e-6
#define B_ATT 1e-5
#define B_ROUTE 1e-6
#define B_SCAT 1e-6
#define B_SWI 1e-5
#define B_MOE 1e-5
#define B_MOE_FP8 1e-5

/* ------------------------------------------------------------------------------------------ */
/* Results                                                                                      */

typedef struct result {
  char op[24], dtype[40], backend[24];
  int cases, fails, skipped;
  double maxerr, budget;
  char first[240];
} result;

/* The results live in a shared mapping: each group of ops runs in a child process (fork), so a
** backend that crashes on one op is reported as a failure of that op and the others still run. */
typedef struct shared_state {
  result results[900];
  int nresults, total_runs, total_fails;
  int open[5];
  char current[240]; /* the case running now, for a crash report */
  int cur_case, cur_slot, resume_case, resume_slot;
} shared_state;
static shared_state *SH;
#define results (SH->results)
#define nresults (SH->nresults)
#define total_runs (SH->total_runs)
#define total_fails (SH->total_fails)
static int verbose;

static result *res_get(const char *op, const char *dtype, const char *backend, double budget) {
  for (int k = 0; k < nresults; k++)
    if (!strcmp(results[k].op, op) && !strcmp(results[k].dtype, dtype) &&
        !strcmp(results[k].backend, backend))
      return &results[k];
  if (nresults == (int)(sizeof results / sizeof results[0])) {
    fprintf(stderr, "test_backend_ops: result table full\n");
    exit(1);
  }
  result *r = &results[nresults++];
  memset(r, 0, sizeof *r);
  snprintf(r->op, sizeof r->op, "%s", op);
  snprintf(r->dtype, sizeof r->dtype, "%s", dtype);
  snprintf(r->backend, sizeof r->backend, "%s", backend);
  r->budget = budget;
  return r;
}

static void res_skip(const char *op, const char *dtype, const char *backend, const char *why) {
  result *r = res_get(op, dtype, backend, 0);
  r->skipped++;
  if (!r->first[0]) snprintf(r->first, sizeof r->first, "%s", why);
}

/* Records one checked case; why != "" marks it failed. */
static void res_case(result *r, double err, const char *label, const char *why) {
  r->cases++;
  total_runs++;
  if (err > r->maxerr || err != err) r->maxerr = err;
  if (why && why[0]) {
    r->fails++;
    total_fails++;
    if (!r->first[0]) snprintf(r->first, sizeof r->first, "%s: %s", label, why);
    if (verbose) fprintf(stderr, "FAIL %s %s %s %s: %s\n", r->op, r->dtype, r->backend, label, why);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Random numbers                                                                               */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull; }
static uint64_t rng_u64(void) {
  uint64_t x = rng_state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  rng_state = x;
  return x * 0x2545f4914f6cdd1dull;
}
static double rng_unif(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }
static int rng_int(int n) { return n > 0 ? (int)(rng_u64() % (uint64_t)n) : 0; }
static double rng_normal(void) {
  double u = rng_unif(), v = rng_unif();
  if (u < 1e-300) u = 1e-300;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
static float *rand_floats(size_t n, double sd) {
  float *p = malloc(sizeof(float) * (n ? n : 1));
  for (size_t k = 0; k < n; k++) p[k] = (float)(rng_normal() * sd);
  return p;
}
static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) {
    fprintf(stderr, "test_backend_ops: out of memory\n");
    exit(1);
  }
  return p;
}
static void *xdup(const void *p, size_t bytes) {
  void *q = xcalloc(1, bytes);
  if (bytes) memcpy(q, p, bytes);
  return q;
}

/* ------------------------------------------------------------------------------------------ */
/* Backend memory: every buffer an op touches is allocated, uploaded and downloaded through the */
/* backend, with guard bytes on both sides of it                                                */

#define GUARD 64

typedef struct rbuf {
  unsigned char *base; /* backend memory: [GUARD | data | GUARD] */
  size_t bytes;
  void *host;          /* downloaded into at the end (outputs), or NULL */
  void *orig;          /* a copy of what an input must still hold at the end, or NULL */
  const char *name;
} rbuf;

typedef struct rctx {
  const st_backend *b;
  rbuf buf[96];
  int n;
  int bad;
  char why[240];
} rctx;

static unsigned char guard_byte(size_t k) { return (unsigned char)(0xA5u ^ (unsigned)(k * 37u)); }

static void rbad(rctx *r, const char *fmt, ...) {
  if (!r->bad++) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
  }
}

/* Allocates data + guards, uploads guards + init (NULL: the poison byte 0x7f, a huge float or
** integer that no correct output equals). Returns the device pointer to the data. */
static void *r_alloc(rctx *r, const char *name, const void *init, size_t bytes, void *host,
                     const void *orig) {
  if (r->n == (int)(sizeof r->buf / sizeof r->buf[0])) {
    rbad(r, "too many buffers");
    return NULL;
  }
  size_t total = bytes + 2 * GUARD;
  void *base = NULL;
  st_status rc = st_backend_alloc(r->b, total, &base);
  if (rc || !base) {
    rbad(r, "alloc %zu bytes: %s", total, st_errmsg());
    return NULL;
  }
  unsigned char *stage = xcalloc(1, total);
  for (size_t k = 0; k < GUARD; k++) stage[k] = stage[GUARD + bytes + k] = guard_byte(k);
  if (init) memcpy(stage + GUARD, init, bytes);
  else memset(stage + GUARD, 0x7f, bytes);
  rc = st_backend_upload(r->b, base, stage, total);
  free(stage);
  if (rc) rbad(r, "upload: %s", st_errmsg());
  rbuf *q = &r->buf[r->n++];
  q->base = base;
  q->bytes = bytes;
  q->host = host;
  q->orig = orig ? xdup(orig, bytes) : NULL; /* the caller may free its host copy */
  q->name = name;
  return (unsigned char *)base + GUARD;
}
/* A const input: must read back unchanged. */
static void *r_in(rctx *r, const char *name, const void *host, size_t bytes) {
  return r_alloc(r, name, host, bytes, NULL, host);
}
/* An output the op writes entirely: poisoned first, downloaded into host at the end. */
static void *r_out(rctx *r, const char *name, void *host, size_t bytes) {
  return r_alloc(r, name, NULL, bytes, host, NULL);
}
/* In and out (in place, accumulators, state): host's contents first, downloaded back at the end. */
static void *r_io(rctx *r, const char *name, void *host, size_t bytes) {
  return r_alloc(r, name, host, bytes, host, NULL);
}
/* Scratch (workspace): only its guards are checked. */
static void *r_scratch(rctx *r, size_t bytes) { return r_alloc(r, "work", NULL, bytes, NULL, NULL); }

/* Synchronises, downloads outputs, checks guards and inputs, frees. Returns 0 or the number of
** problems (the first in r->why). */
static int r_end(rctx *r) {
  st_status rc = r->b->ops->synchronize ? r->b->ops->synchronize(r->b->ctx) : ST_OK;
  if (rc) rbad(r, "synchronize: %s", st_errmsg());
  for (int k = 0; k < r->n; k++) {
    rbuf *q = &r->buf[k];
    size_t total = q->bytes + 2 * GUARD;
    unsigned char *stage = xcalloc(1, total);
    rc = st_backend_download(r->b, stage, q->base, total);
    if (rc) rbad(r, "download %s: %s", q->name, st_errmsg());
    for (size_t j = 0; j < GUARD; j++) {
      if (stage[j] != guard_byte(j)) {
        rbad(r, "%s: guard byte %zu before the buffer overwritten", q->name, GUARD - j);
        break;
      }
      if (stage[GUARD + q->bytes + j] != guard_byte(j)) {
        rbad(r, "%s: guard byte %zu past the end (%zu bytes) overwritten", q->name, j, q->bytes);
        break;
      }
    }
    if (q->host) memcpy(q->host, stage + GUARD, q->bytes);
    if (q->orig && q->bytes && memcmp(q->orig, stage + GUARD, q->bytes))
      rbad(r, "input %s was modified", q->name);
    free(stage);
    free(q->orig);
    st_backend_free(r->b, q->base);
  }
  r->n = 0;
  return r->bad;
}

/* ------------------------------------------------------------------------------------------ */
/* Backends                                                                                     */

typedef struct backend_slot {
  const char *name;
  st_backend b;
  int open;
  char why[200];
} backend_slot;

static backend_slot backends[5] = {{.name = "cpu-ref"}, {.name = "cpu"}, {.name = "cuda"}, {.name = "hip"},
                                   {.name = ST_BACKEND_DEVEMU}};
#define NBACKENDS 5

static size_t workspace_bytes(const st_backend *b) {
  st_backend_limits lim = {.max_tokens = 256, .max_rows = 9000, .max_topk = 1024, .max_dim = 512,
                           .max_experts = 16, .max_expert_slots = 256 * 4, .max_ffn = 256};
  return b->ops->workspace_size ? b->ops->workspace_size(b->ctx, &lim) : 0;
}

static void set_threads(int t) {
#ifdef _OPENMP
  omp_set_num_threads(t);
#else
  (void)t;
#endif
}
static int default_threads = 1;

/* ------------------------------------------------------------------------------------------ */
/* The generic case driver                                                                      */

typedef struct outs {
  float *f;
  size_t nf;
  int32_t *i;
  size_t ni;
} outs;

typedef struct opdesc opdesc;
struct opdesc {
  const char *op;   /* st_op_name */
  st_op id;
  int dtype;        /* for supports(): st_wtype, or -1 */
  char dname[40];   /* the table's dtype column */
  size_t nf, ni;    /* float and int32 outputs */
  int rows;         /* token rows the op can be split over (0: no split) */
  int split;        /* where to split (1 <= split < rows; 0: rows / 2) */
  int nosplit;      /* the op's rows depend on where the call starts (candidates) */
  double bref, bcross;
  const void *cs;   /* the case */
  const char *label;
  /* Runs rows [r0, r1) on backend b, writing their outputs into o. 0 or problems (in r). */
  int (*call)(rctx *r, const void *cs, int r0, int r1, outs *o);
  /* Double reference: val/mag for every float output, iref for the integer ones. */
  void (*ref)(const void *cs, double *val, double *mag, int32_t *iref);
  /* Optional custom check of got against expected (ival/fval: the reference's or cpu-ref's);
  ** returns err, writes why on failure. NULL: generic (floats by mag, integers exactly). */
  double (*check)(const opdesc *d, const double *val, const double *mag, const int32_t *iexp,
                  const outs *got, int vs_ref, char *why);
};

static int same_bits_f(float a, float b) {
  uint32_t x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  return x == y || (a != a && b != b);
}

/* Generic float comparison: max err over elements; why on the first bad element. */
static double cmp_floats(const double *val, const double *mag, const float *got, size_t nf,
                         double budget, char *why, const char *what) {
  double worst = 0;
  for (size_t k = 0; k < nf; k++) {
    double e = val[k], g = got[k], err;
    if (mag[k] == 0) {
      err = same_bits_f((float)e, got[k]) ? 0 : INFINITY;
    } else if (e != e) {
      err = g != g ? 0 : INFINITY;
    } else if (isinf(e)) {
      err = g == e ? 0 : INFINITY;
    } else if (!isfinite(g)) {
      err = INFINITY;
    } else {
      err = fabs(g - e) / mag[k];
    }
    if (err > budget && (worst <= budget) && why && !why[0])
      snprintf(why, 200, "%s[%zu] = %.9g, expected %.9g (err %.3g > %.3g)", what, k, g, e, err,
               budget);
    if (err > worst) worst = err;
  }
  return worst;
}

static double generic_check(const opdesc *d, const double *val, const double *mag,
                            const int32_t *iexp, const outs *got, int vs_ref, char *why) {
  double budget = vs_ref ? d->bref : d->bcross;
  double err = cmp_floats(val, mag, got->f, got->nf, budget, why, "out");
  for (size_t k = 0; k < got->ni; k++)
    if (got->i[k] != iexp[k]) {
      if (!why[0]) snprintf(why, 200, "int[%zu] = %d, expected %d", k, got->i[k], iexp[k]);
      err = INFINITY;
      break;
    }
  return err;
}

static void outs_alloc(outs *o, const opdesc *d) {
  o->nf = d->nf;
  o->ni = d->ni;
  o->f = xcalloc(d->nf ? d->nf : 1, sizeof(float));
  o->i = xcalloc(d->ni ? d->ni : 1, sizeof(int32_t));
  memset(o->f, 0x7f, sizeof(float) * (d->nf ? d->nf : 1));
  memset(o->i, 0x7f, sizeof(int32_t) * (d->ni ? d->ni : 1));
}
static void outs_free(outs *o) {
  free(o->f);
  free(o->i);
}
static int outs_same(const outs *a, const outs *b, size_t *at) {
  for (size_t k = 0; k < a->nf; k++)
    if (!same_bits_f(a->f[k], b->f[k])) {
      *at = k;
      return 0;
    }
  for (size_t k = 0; k < a->ni; k++)
    if (a->i[k] != b->i[k]) {
      *at = a->nf + k;
      return 0;
    }
  return 1;
}

/* One call of the op on backend slot s; returns 0 or a problem (in why). */
static int run_once(const opdesc *d, const st_backend *b, int r0, int r1, outs *o, char *why) {
  rctx r = {.b = b};
  snprintf(SH->current, sizeof SH->current, "%s|%s|%s|%s", d->op, d->dname, b->ops->name, d->label);
  d->call(&r, d->cs, r0, r1, o);
  int bad = r_end(&r);
  if (bad && !why[0]) snprintf(why, 200, "%s", r.why);
  return bad;
}

/* Determinism on one backend: twice, threads 1 vs 2, split rows. */
static void determinism(const opdesc *d, const st_backend *b, const outs *first, char *why) {
  outs o;
  size_t at = 0;
  outs_alloc(&o, d);
  if (!run_once(d, b, 0, d->rows, &o, why) && !outs_same(first, &o, &at) && !why[0])
    snprintf(why, 200, "not deterministic: the same call twice differs at output %zu", at);
  outs_free(&o);
  if (why[0]) return;
  outs o1, o2;
  outs_alloc(&o1, d);
  outs_alloc(&o2, d);
  set_threads(1);
  run_once(d, b, 0, d->rows, &o1, why);
  set_threads(2);
  run_once(d, b, 0, d->rows, &o2, why);
  set_threads(default_threads);
  if (!why[0] && !outs_same(&o1, &o2, &at))
    snprintf(why, 200, "threads 1 vs 2 differ at output %zu", at);
  outs_free(&o1);
  outs_free(&o2);
  if (why[0] || d->rows < 2 || d->nosplit) return;
  int a = d->split > 0 && d->split < d->rows ? d->split : d->rows / 2;
  outs_alloc(&o, d);
  if (!run_once(d, b, 0, a, &o, why) && !run_once(d, b, a, d->rows, &o, why) &&
      !outs_same(first, &o, &at))
    snprintf(why, 200, "rows [0,%d) + [%d,%d) differ from [0,%d) at output %zu", a, a, d->rows,
             d->rows, at);
  outs_free(&o);
}

/* Runs one case everywhere: cpu-ref vs the reference, every other backend vs cpu-ref. */
/* Crash recovery: cases are numbered in the order a group runs them; when a backend crashes on
** (case, slot), the parent records the failure and runs the group again from the next pair. */
static int case_counter;
static int case_next(void) { return case_counter++; }
static int case_skip(int ci, int slot) {
  return ci < SH->resume_case || (ci == SH->resume_case && slot <= SH->resume_slot);
}
static void case_mark(int ci, int slot) {
  SH->cur_case = ci;
  SH->cur_slot = slot;
}

/* Runs one case everywhere: cpu-ref vs the reference, every other backend vs cpu-ref (vs the
** reference when cpu-ref failed or crashed on the case). */
static void run_case(const opdesc *d) {
  int ci = case_next();
  double *val = xcalloc(d->nf, sizeof(double)), *mag = xcalloc(d->nf, sizeof(double));
  int32_t *iref = xcalloc(d->ni, sizeof(int32_t));
  d->ref(d->cs, val, mag, iref);
  outs base = {0};
  int have_base = 0;
  double *bval = xcalloc(d->nf, sizeof(double));
  for (int s = 0; s < NBACKENDS; s++) {
    backend_slot *bs = &backends[s];
    int cross = s > 0;
    if (!bs->open) {
      res_skip(d->op, d->dname, bs->name, bs->why);
      continue;
    }
    if (case_skip(ci, s)) continue;
    const st_backend *b = &bs->b;
    if (b->ops->supports && !b->ops->supports(b->ctx, d->id, d->dtype)) {
      res_skip(d->op, d->dname, bs->name, "supports() declines");
      continue;
    }
    int vs_base = cross && have_base;
    double budget = vs_base ? d->bcross : d->bref;
    result *res = res_get(d->op, d->dname, bs->name, budget);
    char why[256] = "";
    outs o;
    outs_alloc(&o, d);
    double err = 0;
    case_mark(ci, s);
    if (!run_once(d, b, 0, d->rows, &o, why)) {
      if (!vs_base) {
        err = (d->check ? d->check : generic_check)(d, val, mag, iref, &o, 1, why);
      } else {
        for (size_t k = 0; k < d->nf; k++) bval[k] = base.f[k];
        err = (d->check ? d->check : generic_check)(d, bval, mag, base.i, &o, 0, why);
      }
      if (err > budget && !why[0]) snprintf(why, 200, "err %.3g > budget %.3g", err, budget);
      if (cross && !vs_base && !why[0] && s > 0) res->budget = d->bref; /* vs the reference */
      if (!why[0]) determinism(d, b, &o, why);
    }
    res_case(res, err, d->label, why);
    if (!cross && !why[0]) {
      base = o;
      have_base = 1;
    } else {
      outs_free(&o);
    }
  }
  if (have_base) outs_free(&base);
  free(bval);
  free(val);
  free(mag);
  free(iref);
}

/* ------------------------------------------------------------------------------------------ */
/* Typed weights: generation, and the reference's own decoding (lowp.h's scalar conversions;    */
/* the scale lookup written here)                                                               */

typedef struct wspec {
  st_wtype dtype;
  st_wscale sdt;
  int b0, b1;
  const char *name;
} wspec;

static const wspec WSPECS[] = {
  {ST_W_F32, ST_WSCALE_NONE, 0, 0, "f32"},
  {ST_W_BF16, ST_WSCALE_NONE, 0, 0, "bf16"},
  {ST_W_F16, ST_WSCALE_NONE, 0, 0, "f16"},
  {ST_W_FP8_E4M3, ST_WSCALE_UE8M0, 128, 128, "fp8_e4m3/128x128/ue8m0"},
  {ST_W_FP8_E4M3, ST_WSCALE_UE8M0, 64, 64, "fp8_e4m3/64x64/ue8m0"},
  {ST_W_FP8_E4M3, ST_WSCALE_F32, 128, 128, "fp8_e4m3/128x128/f32"},
  {ST_W_FP8_E4M3, ST_WSCALE_BF16, 128, 64, "fp8_e4m3/128x64/bf16"},
  {ST_W_FP4_E2M1, ST_WSCALE_UE8M0, 1, 32, "fp4_e2m1/1x32/ue8m0"},
};
#define NWSPECS ((int)(sizeof WSPECS / sizeof WSPECS[0]))

/* A host weight: the st_weight's data/scales point at host memory here. */
typedef struct hweight {
  st_weight w;
  void *data, *scales;
  size_t data_bytes, scale_bytes;
} hweight;

/* Random weight [rows, cols] of spec; zero_row >= 0 makes that row all zeros. Values ~ sd. */
static void hweight_make(hweight *h, const wspec *sp, int64_t rows, int64_t cols, double sd,
                         int zero_row) {
  memset(h, 0, sizeof *h);
  h->w.dtype = sp->dtype;
  h->w.scale_dtype = sp->sdt;
  h->w.block[0] = sp->b0;
  h->w.block[1] = sp->b1;
  h->w.rows = rows;
  h->w.cols = cols;
  h->data_bytes = st_weight_data_bytes(&h->w);
  h->scale_bytes = st_weight_scale_bytes(&h->w);
  h->data = xcalloc(1, h->data_bytes);
  h->scales = h->scale_bytes ? xcalloc(1, h->scale_bytes) : NULL;
  unsigned char *p = h->data;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      int z = r == zero_row;
      size_t at = (size_t)(r * cols + c);
      switch (sp->dtype) {
      case ST_W_F32: {
        float v = z ? 0.0f : (float)(rng_normal() * sd);
        memcpy(p + 4 * at, &v, 4);
        break;
      }
      case ST_W_BF16: {
        uint16_t v = st_f32_to_bf16(z ? 0.0f : (float)(rng_normal() * sd));
        memcpy(p + 2 * at, &v, 2);
        break;
      }
      case ST_W_F16: {
        uint16_t v = st_f32_to_f16(z ? 0.0f : (float)(rng_normal() * sd));
        memcpy(p + 2 * at, &v, 2);
        break;
      }
      case ST_W_FP8_E4M3: {
        unsigned v;
        do v = (unsigned)rng_int(256); while ((v & 0x7f) == 0x7f); /* no NaN codes */
        p[at] = z ? 0 : (unsigned char)v;
        break;
      }
      case ST_W_FP4_E2M1: {
        unsigned v = (unsigned)rng_int(16);
        if (z) v = 0;
        if (c & 1) p[at / 2] |= (unsigned char)(v << 4);
        else p[at / 2] = (unsigned char)v;
        break;
      }
      case ST_W_TYPE_COUNT: break;
      }
    }
  size_t ns = h->scale_bytes ? h->scale_bytes / (sp->sdt == ST_WSCALE_F32 ? 4 : sp->sdt == ST_WSCALE_BF16 ? 2 : 1) : 0;
  /* scales bring the decoded values to ~sd: fp8 codes span +-448, fp4 +-6 */
  double base = sp->dtype == ST_W_FP4_E2M1 ? sd / 3.0 : sd / 100.0;
  for (size_t k = 0; k < ns; k++) {
    double s = base * exp2((double)(rng_int(5) - 2));
    unsigned char *q = h->scales;
    if (sp->sdt == ST_WSCALE_UE8M0) {
      int e = (int)floor(log2(s)) + 127;
      q[k] = (unsigned char)e;
    } else if (sp->sdt == ST_WSCALE_F32) {
      float v = (float)(s * (1.0 + 0.7 * rng_unif())); /* not a power of two */
      memcpy(q + 4 * k, &v, 4);
    } else {
      uint16_t v = st_f32_to_bf16((float)(s * (1.0 + 0.7 * rng_unif())));
      memcpy(q + 2 * k, &v, 2);
    }
  }
  h->w.data = h->data;
  h->w.scales = h->scales;
}
static void hweight_free(hweight *h) {
  free(h->data);
  free(h->scales);
}

/* The reference's decoding: value(r, c) * scale(r / b0, c / b1), the product rounded once to
** fp32 as the contract says (exact for power-of-two scales). */
static double ref_scale(const st_weight *w, int64_t r, int64_t c) {
  if (w->scale_dtype == ST_WSCALE_NONE) return 1.0;
  int64_t sc = (w->cols + w->block[1] - 1) / w->block[1];
  int64_t at = (r / w->block[0]) * sc + c / w->block[1];
  const unsigned char *s = w->scales;
  if (w->scale_dtype == ST_WSCALE_UE8M0) return ldexp(1.0, (int)s[at] - 127);
  if (w->scale_dtype == ST_WSCALE_F32) {
    float v;
    memcpy(&v, s + 4 * at, 4);
    return v;
  }
  uint16_t v;
  memcpy(&v, s + 2 * at, 2);
  return st_bf16_to_f32(v);
}
static double ref_wval(const st_weight *w, int64_t r, int64_t c) {
  const unsigned char *p = w->data;
  size_t at = (size_t)(r * w->cols + c);
  double v = 0;
  switch (w->dtype) {
  case ST_W_F32: {
    float f;
    memcpy(&f, p + 4 * at, 4);
    return f;
  }
  case ST_W_BF16: {
    uint16_t u;
    memcpy(&u, p + 2 * at, 2);
    return st_bf16_to_f32(u);
  }
  case ST_W_F16: {
    uint16_t u;
    memcpy(&u, p + 2 * at, 2);
    return st_f16_to_f32(u);
  }
  case ST_W_FP8_E4M3: v = st_fp8_e4m3fn_to_f32(p[at]); break;
  case ST_W_FP4_E2M1: {
    unsigned char byte = p[(size_t)r * (size_t)(w->cols / 2) + (size_t)c / 2];
    v = st_fp4_e2m1_to_f32((uint8_t)((c & 1) ? byte >> 4 : byte & 0xf));
    break;
  }
  case ST_W_TYPE_COUNT: break;
  }
  return (double)(float)(v * ref_scale(w, r, c));
}

/* Uploads a host weight; returns the st_weight with backend pointers. */
static st_weight r_weight(rctx *r, const hweight *h) {
  st_weight w = h->w;
  w.data = r_in(r, "weight", h->data, h->data_bytes);
  w.scales = h->scale_bytes ? r_in(r, "scales", h->scales, h->scale_bytes) : NULL;
  return w;
}

/* ------------------------------------------------------------------------------------------ */
/* Small helpers for references                                                                 */

static double nz(double m) { return m > 0 ? m : 1e-30; }

/* Rounding ties. A backend computes v in fp32, within dist of the reference's v; where a bf16
** (or FP8) rounding boundary lies in [v - dist, v + dist] the rounded value may differ from the
** reference's by one step. These return that step (0 when no boundary is in reach, so the
** rounded values must then match exactly): the tie rule of the bf16/FP8 round trips. */
static double tie_step_bf16(double v, double dist) {
  double r = st_round_bf16((float)v);
  return fmax(fabs(st_round_bf16((float)(v - dist)) - r), fabs(st_round_bf16((float)(v + dist)) - r));
}
static double fp8q(double v, float sc) {
  float y = (float)v / sc;
  if (y > 448.0f) y = 448.0f;
  if (y < -448.0f) y = -448.0f;
  return (double)(st_fp8_e4m3fn_to_f32(st_f32_to_fp8_e4m3fn(y)) * sc);
}
static double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }
#define OPD(d_, name_, id_, dt_, dn_)                                                            \
  opdesc d_ = {.op = name_, .id = id_, .dtype = dt_};                                          \
  snprintf(d_.dname, sizeof d_.dname, "%s", dn_)

/* ------------------------------------------------------------------------------------------ */
/* matmul, matmul_grouped                                                                       */

typedef struct mm_case {
  hweight w;
  float *x;
  int n, groups; /* groups 0: plain matmul */
} mm_case;

static int mm_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const mm_case *c = cv;
  int g = c->groups ? c->groups : 1;
  int64_t in = g * c->w.w.cols, out = c->w.w.rows;
  st_weight w = r_weight(r, &c->w);
  float *x = r_in(r, "x", c->x + (size_t)r0 * in, sizeof(float) * (size_t)(r1 - r0) * in);
  float *y = r_out(r, "y", o->f + (size_t)r0 * out, sizeof(float) * (size_t)(r1 - r0) * out);
  if (r->bad) return r->bad;
  if (c->groups) r->b->ops->matmul_grouped(r->b->ctx, y, x, &w, r1 - r0, c->groups);
  else r->b->ops->matmul(r->b->ctx, y, x, &w, r1 - r0);
  return 0;
}
static void mm_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const mm_case *c = cv;
  int g = c->groups ? c->groups : 1;
  int64_t cols = c->w.w.cols, out = c->w.w.rows, rg = out / g, in = g * cols;
  for (int i = 0; i < c->n; i++)
    for (int64_t o = 0; o < out; o++) {
      int64_t xoff = (o / rg) * cols;
      double s = 0, m = 0;
      for (int64_t k = 0; k < cols; k++) {
        double t = (double)c->x[(size_t)i * in + xoff + k] * ref_wval(&c->w.w, o, k);
        s += t;
        m += fabs(t);
      }
      val[(size_t)i * out + o] = s;
      mag[(size_t)i * out + o] = nz(m);
    }
}

static void t_matmul(int grouped) {
  /* n, rows (per group), cols (per group), groups */
  /* the last two of each span several 128 x 128 tiles with partial edges and a reduction that
  ** is a multiple of 32 (a device backend's tensor-core tile) */
  static const int shapes[][4] = {{1, 24, 40, 0}, {5, 72, 40, 0}, {13, 40, 200, 0},
                                  {3, 130, 72, 0}, {8, 64, 256, 0}, {130, 136, 96, 0},
                                  {129, 257, 64, 0}};
  static const int gshapes[][4] = {{1, 20, 40, 3}, {5, 20, 40, 3}, {7, 24, 72, 2},
                                   {4, 128, 256, 2}, {3, 36, 130, 3}, {130, 130, 64, 2},
                                   {131, 40, 64, 3}};
  for (int s = 0; s < NWSPECS; s++)
    for (int k = 0; k < 7; k++) {
      const int *sh = grouped ? gshapes[k] : shapes[k];
      int n = sh[0], g = sh[3] ? sh[3] : 1;
      if (WSPECS[s].dtype == ST_W_FP4_E2M1 && sh[2] % 2) continue;
      mm_case c = {.n = n, .groups = sh[3]};
      rng_seed(1000 + 10 * s + k + 500 * grouped);
      hweight_make(&c.w, &WSPECS[s], (int64_t)sh[1] * g, sh[2], 0.1, sh[1] > 2 ? 2 : -1);
      c.x = rand_floats((size_t)n * g * sh[2], 1.0);
      if (n > 1) memset(c.x + (size_t)1 * g * sh[2], 0, sizeof(float) * (size_t)g * sh[2]);
      char label[64];
      snprintf(label, sizeof label, "n=%d %dx%d g=%d", n, sh[1] * g, sh[2], g);
      OPD(d, grouped ? "matmul_grouped" : "matmul", grouped ? ST_OP_MATMUL_GROUPED : ST_OP_MATMUL,
          WSPECS[s].dtype, WSPECS[s].name);
      d.nf = (size_t)n * sh[1] * g;
      d.rows = n;
      d.bref = d.bcross = B_DOT;
      d.cs = &c;
      d.label = label;
      d.call = mm_call;
      d.ref = mm_ref;
      run_case(&d);
      hweight_free(&c.w);
      free(c.x);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* embed                                                                                        */

typedef struct emb_case {
  hweight t;
  int32_t *tokens;
  int n, hc;
} emb_case;

static int emb_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const emb_case *c = cv;
  int64_t D = c->t.w.cols;
  st_weight w = r_weight(r, &c->t);
  int32_t *tok = r_in(r, "tokens", c->tokens + r0, sizeof(int32_t) * (size_t)(r1 - r0));
  float *X = r_out(r, "X", o->f + (size_t)r0 * c->hc * D, sizeof(float) * (size_t)(r1 - r0) * c->hc * D);
  if (r->bad) return r->bad;
  r->b->ops->embed(r->b->ctx, X, &w, tok, r1 - r0, c->hc);
  return 0;
}
static void emb_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const emb_case *c = cv;
  int64_t D = c->t.w.cols;
  for (int i = 0; i < c->n; i++)
    for (int a = 0; a < c->hc; a++)
      for (int64_t k = 0; k < D; k++) {
        size_t at = ((size_t)i * c->hc + a) * D + k;
        val[at] = ref_wval(&c->t.w, c->tokens[i], k);
        mag[at] = 0; /* exact */
      }
}
static void t_embed(void) {
  static const int shapes[][4] = {{1, 300, 72, 4}, {7, 300, 40, 1}, {13, 130, 256, 4}, {5, 64, 24, 3}};
  for (int s = 0; s < NWSPECS; s++)
    for (int k = 0; k < 4; k++) {
      const int *sh = shapes[k];
      emb_case c = {.n = sh[0], .hc = sh[3]};
      rng_seed(2000 + 10 * s + k);
      hweight_make(&c.t, &WSPECS[s], sh[1], sh[2], 1.0, 3);
      c.tokens = xcalloc((size_t)c.n, sizeof(int32_t));
      for (int i = 0; i < c.n; i++) c.tokens[i] = rng_int(sh[1]);
      c.tokens[0] = sh[1] - 1;
      if (c.n > 2) c.tokens[1] = 3, c.tokens[2] = 0; /* the zero row, the first row */
      if (c.n > 4) c.tokens[4] = c.tokens[3];       /* a repeated token */
      char label[64];
      snprintf(label, sizeof label, "n=%d V=%d D=%d hc=%d", c.n, sh[1], sh[2], c.hc);
      OPD(d, "embed", ST_OP_EMBED, WSPECS[s].dtype, WSPECS[s].name);
      d.nf = (size_t)c.n * c.hc * sh[2];
      d.rows = c.n;
      d.cs = &c;
      d.label = label;
      d.call = emb_call;
      d.ref = emb_ref;
      run_case(&d);
      hweight_free(&c.t);
      free(c.tokens);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* rmsnorm                                                                                      */

typedef struct rms_case {
  float *x, *w;
  int n, dim, inplace;
  float eps;
} rms_case;

static int rms_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const rms_case *c = cv;
  size_t off = (size_t)r0 * c->dim, cnt = (size_t)(r1 - r0) * c->dim;
  float *w = c->w ? r_in(r, "weight", c->w, sizeof(float) * (size_t)c->dim) : NULL;
  float *x, *y;
  if (c->inplace) {
    memcpy(o->f + off, c->x + off, sizeof(float) * cnt);
    x = y = r_io(r, "x", o->f + off, sizeof(float) * cnt);
  } else {
    x = r_in(r, "x", c->x + off, sizeof(float) * cnt);
    y = r_out(r, "y", o->f + off, sizeof(float) * cnt);
  }
  if (r->bad) return r->bad;
  r->b->ops->rmsnorm(r->b->ctx, y, x, w, r1 - r0, c->dim, c->eps);
  return 0;
}
static void rms_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const rms_case *c = cv;
  for (int i = 0; i < c->n; i++) {
    const float *x = c->x + (size_t)i * c->dim;
    double ss = 0, mx = 0;
    for (int k = 0; k < c->dim; k++) ss += (double)x[k] * x[k];
    double rr = 1.0 / sqrt(ss / c->dim + (double)c->eps);
    for (int k = 0; k < c->dim; k++) {
      double v = x[k] * rr * (c->w ? c->w[k] : 1.0);
      val[(size_t)i * c->dim + k] = v;
      if (fabs(v) > mx) mx = fabs(v);
    }
    for (int k = 0; k < c->dim; k++) mag[(size_t)i * c->dim + k] = nz(mx);
  }
}
static void t_rmsnorm(void) {
  static const int shapes[][2] = {{1, 24}, {5, 40}, {13, 72}, {3, 512}, {4, 1}, {6, 130}};
  for (int k = 0; k < 6; k++)
    for (int v = 0; v < 3; v++) { /* 0: weight, 1: no weight, 2: weight and in place */
      rms_case c = {.n = shapes[k][0], .dim = shapes[k][1], .inplace = v == 2, .eps = 1e-6f};
      rng_seed(3000 + 10 * k + v);
      c.x = rand_floats((size_t)c.n * c.dim, k == 3 ? 30.0 : 1.0);
      c.w = v == 1 ? NULL : rand_floats((size_t)c.dim, 1.0);
      if (c.n > 1) memset(c.x + c.dim, 0, sizeof(float) * c.dim); /* a row of zeros */
      if (c.n > 2) c.x[2 * c.dim] = 1e-3f;                       /* a row dominated by eps */
      if (c.n > 2) for (int j = 1; j < c.dim; j++) c.x[2 * c.dim + j] = 0;
      char label[64];
      snprintf(label, sizeof label, "n=%d dim=%d %s", c.n, c.dim,
               v == 0 ? "weight" : v == 1 ? "no weight" : "in place");
      OPD(d, "rmsnorm", ST_OP_RMSNORM, -1, "f32");
      d.nf = (size_t)c.n * c.dim;
      d.rows = c.n;
      d.bref = d.bcross = B_RMS;
      d.cs = &c;
      d.label = label;
      d.call = rms_call;
      d.ref = rms_ref;
      run_case(&d);
      free(c.x);
      free(c.w);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* rope                                                                                         */

typedef struct rope_case {
  float *x, *cos_t, *sin_t;
  int64_t *pos;
  int n, heads, head_dim, rope_dim, neox, inverse, max_pos;
} rope_case;

/* SPEC §3.5 tables: f_i = theta^(-2i/r), YaRN ramp between low and high (factor 16). */
static void rope_tables(float *cs, float *sn, int max_pos, int rope_dim, double theta, int yarn) {
  int half = rope_dim / 2;
  double *f = xcalloc((size_t)half, sizeof(double));
  for (int i = 0; i < half; i++) f[i] = pow(theta, -2.0 * i / rope_dim);
  if (yarn) {
    double corr32 = rope_dim * log(65536.0 / (2 * M_PI * 32)) / (2 * log(theta));
    double corr1 = rope_dim * log(65536.0 / (2 * M_PI * 1)) / (2 * log(theta));
    double lo = fmax(floor(corr32), 0), hi = fmin(ceil(corr1), rope_dim - 1);
    for (int i = 0; i < half; i++) {
      double ramp = hi > lo ? (i - lo) / (hi - lo) : (i >= lo);
      ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
      f[i] = f[i] * (1 - ramp) + f[i] / 16 * ramp;
    }
  }
  for (int p = 0; p < max_pos; p++)
    for (int i = 0; i < half; i++) {
      cs[(size_t)p * half + i] = (float)cos(p * f[i]);
      sn[(size_t)p * half + i] = (float)sin(p * f[i]);
    }
  free(f);
}

static int rope_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const rope_case *c = cv;
  size_t row = (size_t)c->heads * c->head_dim, half = (size_t)c->rope_dim / 2;
  memcpy(o->f + r0 * row, c->x + r0 * row, sizeof(float) * (size_t)(r1 - r0) * row);
  float *x = r_io(r, "x", o->f + r0 * row, sizeof(float) * (size_t)(r1 - r0) * row);
  int64_t *pos = r_in(r, "positions", c->pos + r0, sizeof(int64_t) * (size_t)(r1 - r0));
  float *cs = r_in(r, "cos", c->cos_t, sizeof(float) * c->max_pos * half);
  float *sn = r_in(r, "sin", c->sin_t, sizeof(float) * c->max_pos * half);
  if (r->bad) return r->bad;
  r->b->ops->rope(r->b->ctx, x, r1 - r0, c->heads, c->head_dim, c->rope_dim, pos, cs, sn, c->neox,
                  c->inverse);
  return 0;
}
static void rope_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const rope_case *c = cv;
  int half = c->rope_dim / 2, start = c->head_dim - c->rope_dim;
  for (int i = 0; i < c->n; i++)
    for (int h = 0; h < c->heads; h++) {
      size_t base = ((size_t)i * c->heads + h) * c->head_dim;
      const float *v = c->x + base;
      for (int k = 0; k < c->head_dim; k++) {
        val[base + k] = v[k];
        mag[base + k] = 0; /* the dims before the rotated ones are untouched */
      }
      for (int p = 0; p < half; p++) {
        int a = start + (c->neox ? p : 2 * p), b = start + (c->neox ? p + half : 2 * p + 1);
        double cc = c->cos_t[(size_t)c->pos[i] * half + p], ss = c->sin_t[(size_t)c->pos[i] * half + p];
        if (c->inverse) ss = -ss;
        double x0 = v[a], x1 = v[b];
        val[base + a] = x0 * cc - x1 * ss;
        val[base + b] = x1 * cc + x0 * ss;
        double m = nz(sqrt(x0 * x0 + x1 * x1));
        mag[base + a] = mag[base + b] = m;
      }
    }
}
static void t_rope(void) {
  /* n, heads, head_dim, rope_dim */
  static const int shapes[][4] = {{1, 3, 40, 16}, {13, 3, 40, 16}, {5, 7, 24, 16}, {3, 2, 128, 64},
                                  {4, 1, 16, 16}};
  for (int k = 0; k < 5; k++)
    for (int v = 0; v < 4; v++) {
      rope_case c = {.n = shapes[k][0], .heads = shapes[k][1], .head_dim = shapes[k][2],
                     .rope_dim = shapes[k][3], .neox = v & 1, .inverse = v >> 1, .max_pos = 5000};
      rng_seed(4000 + 10 * k + v);
      size_t half = (size_t)c.rope_dim / 2;
      c.cos_t = xcalloc(c.max_pos * half, sizeof(float));
      c.sin_t = xcalloc(c.max_pos * half, sizeof(float));
      rope_tables(c.cos_t, c.sin_t, c.max_pos, c.rope_dim, k & 1 ? 160000.0 : 10000.0, k & 1);
      c.x = rand_floats((size_t)c.n * c.heads * c.head_dim, 1.0);
      c.pos = xcalloc((size_t)c.n, sizeof(int64_t));
      for (int i = 0; i < c.n; i++) c.pos[i] = rng_int(c.max_pos);
      c.pos[0] = 0;
      if (c.n > 1) c.pos[c.n - 1] = c.max_pos - 1;
      if (c.n > 2) memset(c.x + (size_t)c.heads * c.head_dim, 0, sizeof(float) * c.heads * c.head_dim);
      char label[80];
      snprintf(label, sizeof label, "n=%d heads=%d hd=%d rd=%d neox=%d inverse=%d", c.n, c.heads,
               c.head_dim, c.rope_dim, c.neox, c.inverse);
      OPD(d, "rope", ST_OP_ROPE, -1, c.neox ? "neox" : "interleaved");
      d.nf = (size_t)c.n * c.heads * c.head_dim;
      d.rows = c.n;
      d.bref = d.bcross = B_ROPE;
      d.cs = &c;
      d.label = label;
      d.call = rope_call;
      d.ref = rope_ref;
      run_case(&d);
      free(c.x);
      free(c.pos);
      free(c.cos_t);
      free(c.sin_t);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* hadamard                                                                                     */

typedef struct had_case {
  float *x;
  int n, dim;
} had_case;

static int had_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const had_case *c = cv;
  size_t off = (size_t)r0 * c->dim, cnt = (size_t)(r1 - r0) * c->dim;
  memcpy(o->f + off, c->x + off, sizeof(float) * cnt);
  float *x = r_io(r, "x", o->f + off, sizeof(float) * cnt);
  if (r->bad) return r->bad;
  r->b->ops->hadamard(r->b->ctx, x, r1 - r0, c->dim);
  return 0;
}
static int popcount_u(unsigned v) {
  int k = 0;
  for (; v; v &= v - 1) k++;
  return k;
}
static void had_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const had_case *c = cv;
  double sc = 1.0 / sqrt((double)c->dim);
  for (int i = 0; i < c->n; i++) {
    const float *x = c->x + (size_t)i * c->dim;
    double l1 = 0;
    for (int j = 0; j < c->dim; j++) l1 += fabs(x[j]);
    for (int k = 0; k < c->dim; k++) {
      double s = 0;
      for (int j = 0; j < c->dim; j++) s += (popcount_u((unsigned)(k & j)) & 1) ? -x[j] : x[j];
      val[(size_t)i * c->dim + k] = s * sc;
      mag[(size_t)i * c->dim + k] = nz(l1 * sc);
    }
  }
}
static void t_hadamard(void) {
  static const int shapes[][2] = {{1, 1}, {3, 2}, {5, 8}, {13, 32}, {7, 128}, {2, 256}};
  for (int k = 0; k < 6; k++) {
    had_case c = {.n = shapes[k][0], .dim = shapes[k][1]};
    rng_seed(5000 + k);
    c.x = rand_floats((size_t)c.n * c.dim, 1.0);
    if (c.n > 1) memset(c.x + c.dim, 0, sizeof(float) * c.dim);
    if (c.n > 2) for (int j = 0; j < c.dim; j++) c.x[2 * c.dim + j] = 1.0f; /* exact cancellations */
    char label[64];
    snprintf(label, sizeof label, "n=%d dim=%d", c.n, c.dim);
    OPD(d, "hadamard", ST_OP_HADAMARD, -1, "f32");
    d.nf = (size_t)c.n * c.dim;
    d.rows = c.n;
    d.bref = d.bcross = B_HAD;
    d.cs = &c;
    d.label = label;
    d.call = had_call;
    d.ref = had_ref;
    run_case(&d);
    free(c.x);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Elementwise: round_bf16, add, scale, fill                                                    */

typedef struct ew_case {
  float *a, *b;
  float s;
  int count, kind; /* 0 round_bf16, 1 add, 2 scale, 3 fill, 4 add in place */
} ew_case;

static int ew_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const ew_case *c = cv;
  size_t cnt = (size_t)(r1 - r0);
  const st_backend_ops *ops = r->b->ops;
  if (c->kind == 4) { /* y == a, as the engine calls it (a += y) */
    memcpy(o->f + r0, c->a + r0, sizeof(float) * cnt);
    float *y = r_io(r, "y=a", o->f + r0, sizeof(float) * cnt);
    float *b = r_in(r, "b", c->b + r0, sizeof(float) * cnt);
    if (r->bad) return r->bad;
    ops->add(r->b->ctx, y, y, b, cnt);
    return 0;
  }
  if (c->kind == 1) {
    float *a = r_in(r, "a", c->a + r0, sizeof(float) * cnt);
    float *b = r_in(r, "b", c->b + r0, sizeof(float) * cnt);
    float *y = r_out(r, "y", o->f + r0, sizeof(float) * cnt);
    if (r->bad) return r->bad;
    ops->add(r->b->ctx, y, a, b, cnt);
    return 0;
  }
  memcpy(o->f + r0, c->a + r0, sizeof(float) * cnt);
  float *x = r_io(r, "x", o->f + r0, sizeof(float) * cnt);
  if (r->bad) return r->bad;
  if (c->kind == 0) ops->round_bf16(r->b->ctx, x, cnt);
  else if (c->kind == 2) ops->scale(r->b->ctx, x, c->s, cnt);
  else ops->fill(r->b->ctx, x, c->s, cnt);
  return 0;
}
static void ew_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const ew_case *c = cv;
  for (int k = 0; k < c->count; k++) {
    float a = c->a[k], v;
    switch (c->kind) {
    case 0: v = st_round_bf16(a); break; /* lowp.h's conversion (tests/test_lowp.c) */
    case 1: case 4: v = (float)((double)a + (double)c->b[k]); break; /* correctly rounded */
    case 2: v = (float)((double)a * (double)c->s); break;
    default: v = c->s; break;
    }
    val[k] = v;
    mag[k] = 0;
  }
}
/* Values that stress rounding: ties, the bf16/f32 range ends, subnormals, signed zeros, inf, NaN. */
static float special_float(int k) {
  static const uint32_t bits[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                  0xffc00001u, 0x7f7fffffu, 0xff7fffffu, 0x3f808000u, 0x3f818000u,
                                  0x3f808001u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x7f7f8000u,
                                  0x3f7fffffu, 0x4b800000u, 0x33800000u};
  float f;
  memcpy(&f, &bits[k % (int)(sizeof bits / sizeof bits[0])], 4);
  return f;
}
static void t_elementwise(void) {
  static const char *names[] = {"round_bf16", "add", "scale", "fill", "add"};
  static const st_op ids[] = {ST_OP_ROUND_BF16, ST_OP_ADD, ST_OP_SCALE, ST_OP_FILL, ST_OP_ADD};
  static const int counts[] = {1, 7, 1001, 64};
  static const float scalars[] = {-0.75f, 3.0f, 0.0f, -0.0f};
  for (int kind = 0; kind < 5; kind++)
    for (int k = 0; k < 4; k++) {
      ew_case c = {.count = counts[k], .kind = kind, .s = scalars[k]};
      if (kind == 3 && k == 2) c.s = NAN;
      if (kind == 2 && k == 3) c.s = INFINITY;
      rng_seed(6000 + 10 * kind + k);
      c.a = xcalloc((size_t)c.count, sizeof(float));
      c.b = xcalloc((size_t)c.count, sizeof(float));
      for (int j = 0; j < c.count; j++) {
        c.a[j] = (float)(rng_normal() * exp2(rng_int(60) - 30));
        c.b[j] = (float)(rng_normal() * exp2(rng_int(60) - 30));
        if (j % 5 == 1) c.a[j] = special_float(j / 5);
        if (j % 7 == 3) c.b[j] = special_float(j / 7 + 3);
        if (j % 11 == 4) c.b[j] = -c.a[j]; /* exact cancellation */
      }
      char label[64];
      snprintf(label, sizeof label, "count=%d s=%g", c.count, c.s);
      OPD(d, names[kind], ids[kind], -1, kind == 4 ? "f32 y=a" : "f32");
      d.nf = (size_t)c.count;
      d.rows = c.count;
      d.split = c.count / 3;
      d.cs = &c;
      d.label = label;
      d.call = ew_call;
      d.ref = ew_ref;
      run_case(&d);
      free(c.a);
      free(c.b);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* quantize: exact, the block scales computed here                                              */

typedef struct q_case {
  float *x;
  int rows, len, block, ue8m0;
  int64_t stride;
  st_qformat fmt;
} q_case;

static int q_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const q_case *c = cv;
  size_t off = (size_t)r0 * c->stride, cnt = (size_t)(r1 - r0) * c->stride;
  memcpy(o->f + off, c->x + off, sizeof(float) * cnt);
  float *x = r_io(r, "x", o->f + off, sizeof(float) * cnt);
  if (r->bad) return r->bad;
  r->b->ops->quantize(r->b->ctx, x, r1 - r0, c->stride, c->len, c->block, c->fmt, c->ue8m0);
  return 0;
}
/* 2^ceil(log2(amax / qmax)) from frexp, clamped to the ue8m0 range; NaN for NaN/inf amax. */
static float ref_pow2_scale(float amax, float qmax) {
  if (!isfinite(amax)) return NAN;
  if (amax == 0) return ldexpf(1.0f, -127);
  int ea, eq;
  double ma = frexp(amax, &ea), mq = frexp(qmax, &eq);
  int k = ea - eq + (ma > mq ? 1 : 0);
  if (k < -127) k = -127;
  if (k > 127) k = 127;
  return (float)ldexp(1.0, k);
}
static void q_ref_block(float *x, int n, st_qformat fmt, int ue8m0) {
  if (fmt == ST_Q_BF16) {
    for (int i = 0; i < n; i++) x[i] = st_round_bf16(x[i]);
    return;
  }
  int fp4 = fmt == ST_Q_FP4_E2M1, fnuz = fmt == ST_Q_FP8_E4M3FNUZ;
  float qmax = fp4 ? 6.0f : fnuz ? 240.0f : 448.0f;
  float amax = fp4 ? ldexpf(6.0f, -126) : 1e-4f;
  int nan = 0;
  for (int i = 0; i < n; i++) {
    if (x[i] != x[i]) nan = 1;
    else if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
  }
  if (nan) amax = NAN;
  /* F2 keeps the writer's amax / 448 scale whatever ue8m0 says (backend.h) */
  int pow2 = fp4 || (ue8m0 && fmt != ST_Q_FP8_FN_AS_FNUZ);
  float s = pow2 ? ref_pow2_scale(amax, qmax) : (float)((double)amax / qmax);
  for (int i = 0; i < n; i++) {
    float y = x[i] / s;
    if (fp4 && y != y) {
      x[i] = y;
      continue;
    }
    if (y > qmax) y = qmax;
    if (y < -qmax) y = -qmax;
    float dq;
    switch (fmt) {
    case ST_Q_FP8_E4M3FN: dq = st_fp8_e4m3fn_to_f32(st_f32_to_fp8_e4m3fn(y)); break;
    case ST_Q_FP8_E4M3FNUZ: dq = st_fp8_e4m3fnuz_to_f32(st_f32_to_fp8_e4m3fnuz(y)); break;
    case ST_Q_FP8_FN_AS_FNUZ: dq = st_fp8_e4m3fnuz_to_f32(st_f32_to_fp8_e4m3fn(y)); break;
    default: dq = st_fp4_e2m1_to_f32(st_f32_to_fp4_e2m1(y)); break;
    }
    x[i] = dq * s;
  }
}
static void q_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const q_case *c = cv;
  float *x = xdup(c->x, sizeof(float) * (size_t)c->rows * c->stride);
  int block = c->block > 0 ? c->block : c->len;
  for (int r = 0; r < c->rows; r++)
    for (int b0 = 0; b0 < c->len; b0 += block)
      q_ref_block(x + (size_t)r * c->stride + b0, c->len - b0 < block ? c->len - b0 : block, c->fmt,
                  c->ue8m0);
  for (size_t k = 0; k < (size_t)c->rows * c->stride; k++) {
    val[k] = x[k];
    mag[k] = 0;
  }
  free(x);
}
static void t_quantize(void) {
  static const char *fnames[] = {"bf16", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_fn_as_fnuz", "fp4_e2m1"};
  /* rows, stride, len, block */
  static const int shapes[][4] = {{1, 40, 40, 128}, {4, 80, 72, 32}, {3, 130, 130, 64},
                                  {2, 64, 48, 0}, {5, 24, 24, 1}, {6, 512, 448, 64}};
  for (int f = 0; f <= ST_Q_FP4_E2M1; f++)
    for (int u = 0; u < 2; u++)
      for (int k = 0; k < 6; k++) {
        if ((f == ST_Q_BF16 || f == ST_Q_FP4_E2M1) && u) continue; /* ue8m0 is implied / unused */
        q_case c = {.rows = shapes[k][0], .stride = shapes[k][1], .len = shapes[k][2],
                    .block = shapes[k][3], .ue8m0 = u, .fmt = (st_qformat)f};
        rng_seed(7000 + 100 * f + 10 * u + k);
        size_t tot = (size_t)c.rows * c.stride;
        c.x = xcalloc(tot, sizeof(float));
        for (size_t j = 0; j < tot; j++) c.x[j] = (float)(rng_normal() * exp2(rng_int(12) - 6));
        if (c.rows > 1) /* a row of zeros (amax floor) */
          for (int j = 0; j < c.len; j++) c.x[c.stride + j] = 0;
        if (c.rows > 2) /* tiny values: subnormal codes, a -0 */
          for (int j = 0; j < c.len; j++) c.x[2 * c.stride + j] = (float)(rng_normal() * 1e-6);
        if (c.rows > 2) c.x[2 * c.stride] = -0.0f;
        if (c.rows > 3 && f != ST_Q_FP8_FN_AS_FNUZ) { /* NaN and inf in a block (not F2's case) */
          c.x[3 * c.stride + 1] = NAN;
          if (c.len > 40) c.x[3 * c.stride + 40] = -INFINITY;
        }
        if (c.rows > 4) /* exact ties of the target grid */
          for (int j = 0; j < c.len; j++) c.x[4 * c.stride + j] = (float)((j % 13) * 0.25 + 0.125);
        char label[80];
        snprintf(label, sizeof label, "rows=%d stride=%lld len=%d block=%d ue8m0=%d", c.rows,
                 (long long)c.stride, c.len, c.block, c.ue8m0);
        char dn[40];
        snprintf(dn, sizeof dn, "%s%s", fnames[f], u ? "/ue8m0" : "");
        OPD(d, "quantize", ST_OP_QUANTIZE, -1, dn);
        d.nf = tot;
        d.rows = c.rows;
        d.cs = &c;
        d.label = label;
        d.call = q_call;
        d.ref = q_ref;
        run_case(&d);
        free(c.x);
      }
}

/* ------------------------------------------------------------------------------------------ */
/* mHC (SPEC §2.2): hc_weights, hc_collapse, hc_expand, hc_head                                 */

typedef struct hc_case {
  float *X, *fn, *base, *scale, *pre, *post, *comb, *a;
  int n, hc, D, iters, kind; /* 0 weights, 1 collapse, 2 expand, 3 head */
  float norm_eps, hc_eps;
} hc_case;

static int hc_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const hc_case *c = cv;
  int n = r1 - r0, hc = c->hc, D = c->D, mixes = (2 + hc) * hc, flat = hc * D;
  const st_backend_ops *ops = r->b->ops;
  float *X = r_in(r, "X", c->X + (size_t)r0 * flat, sizeof(float) * (size_t)n * flat);
  if (c->kind == 0) {
    float *fn = r_in(r, "fn", c->fn, sizeof(float) * (size_t)mixes * flat);
    float *base = r_in(r, "base", c->base, sizeof(float) * (size_t)mixes);
    float *scale = r_in(r, "scale", c->scale, sizeof(float) * 3);
    float *pre = r_out(r, "pre", o->f + (size_t)r0 * hc, sizeof(float) * (size_t)n * hc);
    float *post = r_out(r, "post", o->f + (size_t)c->n * hc + (size_t)r0 * hc, sizeof(float) * (size_t)n * hc);
    float *comb = r_out(r, "comb", o->f + (size_t)2 * c->n * hc + (size_t)r0 * hc * hc,
                        sizeof(float) * (size_t)n * hc * hc);
    if (r->bad) return r->bad;
    ops->hc_weights(r->b->ctx, pre, post, comb, X, fn, base, scale, n, hc, D, c->norm_eps,
                    c->hc_eps, c->iters);
  } else if (c->kind == 1) {
    float *pre = r_in(r, "pre", c->pre + (size_t)r0 * hc, sizeof(float) * (size_t)n * hc);
    float *x = r_out(r, "x", o->f + (size_t)r0 * D, sizeof(float) * (size_t)n * D);
    if (r->bad) return r->bad;
    ops->hc_collapse(r->b->ctx, x, X, pre, n, hc, D);
  } else if (c->kind == 2) {
    float *a = r_in(r, "a", c->a + (size_t)r0 * D, sizeof(float) * (size_t)n * D);
    float *post = r_in(r, "post", c->post + (size_t)r0 * hc, sizeof(float) * (size_t)n * hc);
    float *comb = r_in(r, "comb", c->comb + (size_t)r0 * hc * hc, sizeof(float) * (size_t)n * hc * hc);
    float *Xo = r_out(r, "Xout", o->f + (size_t)r0 * flat, sizeof(float) * (size_t)n * flat);
    if (r->bad) return r->bad;
    ops->hc_expand(r->b->ctx, Xo, a, X, post, comb, n, hc, D);
  } else {
    float *fn = r_in(r, "fn", c->fn, sizeof(float) * (size_t)hc * flat);
    float *base = r_in(r, "base", c->base, sizeof(float) * (size_t)hc);
    float *scale = r_in(r, "scale", c->scale, sizeof(float));
    float *y = r_out(r, "y", o->f + (size_t)r0 * D, sizeof(float) * (size_t)n * D);
    if (r->bad) return r->bad;
    ops->hc_head(r->b->ctx, y, X, fn, base, scale, n, hc, D, c->norm_eps, c->hc_eps);
  }
  return 0;
}
static double rho_d(const float *x, int flat, double eps) {
  double ss = 0;
  for (int k = 0; k < flat; k++) ss += (double)x[k] * x[k];
  return 1.0 / sqrt(ss / flat + eps);
}
static void hc_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const hc_case *c = cv;
  int hc = c->hc, D = c->D, flat = hc * D, mixes = (2 + hc) * hc;
  double eps = c->hc_eps;
  for (int i = 0; i < c->n; i++) {
    const float *x = c->X + (size_t)i * flat;
    if (c->kind == 0) {
      double r = rho_d(x, flat, c->norm_eps), mix[18 * 16], C[16 * 16];
      for (int m = 0; m < mixes; m++) {
        double s = 0;
        for (int k = 0; k < flat; k++) s += (double)x[k] * c->fn[(size_t)m * flat + k];
        mix[m] = s * r;
      }
      double *pre = val + (size_t)i * hc, *post = val + (size_t)c->n * hc + (size_t)i * hc;
      double *comb = val + (size_t)2 * c->n * hc + (size_t)i * hc * hc;
      for (int a = 0; a < hc; a++) {
        pre[a] = sigmoid_d(mix[a] * c->scale[0] + c->base[a]) + eps;
        post[a] = 2 * sigmoid_d(mix[hc + a] * c->scale[1] + c->base[hc + a]);
      }
      for (int a = 0; a < hc; a++) { /* softmax over b, + eps */
        double mx = -INFINITY, sum = 0;
        for (int b = 0; b < hc; b++) {
          C[a * hc + b] = mix[2 * hc + a * hc + b] * c->scale[2] + c->base[2 * hc + a * hc + b];
          mx = fmax(mx, C[a * hc + b]);
        }
        for (int b = 0; b < hc; b++) sum += (C[a * hc + b] = exp(C[a * hc + b] - mx));
        for (int b = 0; b < hc; b++) C[a * hc + b] = C[a * hc + b] / sum + eps;
      }
      for (int it = 0; it < c->iters; it++) {
        if (it > 0)
          for (int a = 0; a < hc; a++) {
            double s = 0;
            for (int b = 0; b < hc; b++) s += C[a * hc + b];
            for (int b = 0; b < hc; b++) C[a * hc + b] /= s + eps;
          }
        for (int b = 0; b < hc; b++) {
          double s = 0;
          for (int a = 0; a < hc; a++) s += C[a * hc + b];
          for (int a = 0; a < hc; a++) C[a * hc + b] /= s + eps;
        }
      }
      for (int k = 0; k < hc * hc; k++) comb[k] = C[k];
    } else if (c->kind == 1 || c->kind == 3) {
      double pre[16];
      if (c->kind == 1) {
        for (int a = 0; a < hc; a++) pre[a] = c->pre[(size_t)i * hc + a];
      } else {
        double r = rho_d(x, flat, c->norm_eps);
        for (int a = 0; a < hc; a++) {
          double s = 0;
          for (int k = 0; k < flat; k++) s += (double)x[k] * c->fn[(size_t)a * flat + k];
          pre[a] = sigmoid_d(s * r * c->scale[0] + c->base[a]) + eps;
        }
      }
      for (int k = 0; k < D; k++) {
        double s = 0, m = 0;
        for (int a = 0; a < hc; a++) {
          s += pre[a] * x[(size_t)a * D + k];
          m += (c->kind == 3 ? 1.0 : fabs(pre[a])) * fabs(x[(size_t)a * D + k]);
        }
        val[(size_t)i * D + k] = s;
        mag[(size_t)i * D + k] = nz(m);
      }
    } else {
      const float *C = c->comb + (size_t)i * hc * hc;
      for (int j = 0; j < hc; j++)
        for (int k = 0; k < D; k++) {
          double pj = c->post[(size_t)i * hc + j], av = c->a[(size_t)i * D + k];
          double s = pj * av, m = fabs(pj * av);
          for (int src = 0; src < hc; src++) {
            double t = (double)C[src * hc + j] * x[(size_t)src * D + k];
            s += t;
            m += fabs(t);
          }
          val[((size_t)i * hc + j) * D + k] = s;
          mag[((size_t)i * hc + j) * D + k] = nz(m);
        }
    }
  }
  if (c->kind == 0)
    for (size_t k = 0; k < (size_t)c->n * (2 * hc + hc * hc); k++) mag[k] = 1.0; /* absolute */
}
static void t_hc(void) {
  static const char *names[] = {"hc_weights", "hc_collapse", "hc_expand", "hc_head"};
  static const st_op ids[] = {ST_OP_HC_WEIGHTS, ST_OP_HC_COLLAPSE, ST_OP_HC_EXPAND, ST_OP_HC_HEAD};
  static const double budgets[] = {B_HCW, B_HCC, B_HCC, B_HCHEAD};
  /* n, hc, D, sinkhorn iterations */
  static const int shapes[][4] = {{1, 4, 72, 20}, {5, 4, 40, 20}, {13, 3, 24, 1}, {3, 4, 256, 20},
                                  {4, 1, 72, 3}, {2, 16, 8, 20}};
  for (int kind = 0; kind < 4; kind++)
    for (int k = 0; k < 6; k++) {
      hc_case c = {.n = shapes[k][0], .hc = shapes[k][1], .D = shapes[k][2], .iters = shapes[k][3],
                   .kind = kind, .norm_eps = k == 4 ? 1e-2f : 1e-6f,
                   .hc_eps = k == 2 || k == 4 ? 1e-2f : 1e-6f}; /* large eps: its placement shows */
      int hc = c.hc, flat = hc * c.D, mixes = (2 + hc) * hc;
      rng_seed(8000 + 10 * kind + k);
      c.X = rand_floats((size_t)c.n * flat, 1.0);
      if (c.n > 1) memset(c.X + flat, 0, sizeof(float) * flat); /* a row of zeros */
      double fsd = 1.5 / sqrt((double)flat);                    /* mixes of order 1 */
      c.fn = rand_floats((size_t)mixes * flat, fsd);
      c.base = rand_floats((size_t)mixes, 0.5);
      c.scale = rand_floats(3, 0.5);
      for (int j = 0; j < 3; j++) c.scale[j] = 0.5f + fabsf(c.scale[j]);
      c.pre = rand_floats((size_t)c.n * hc, 0.5);
      c.post = rand_floats((size_t)c.n * hc, 0.8);
      c.comb = rand_floats((size_t)c.n * hc * hc, 0.3);
      c.a = rand_floats((size_t)c.n * c.D, 1.0);
      char label[64];
      snprintf(label, sizeof label, "n=%d hc=%d D=%d iters=%d eps=%g/%g", c.n, hc, c.D, c.iters,
               c.norm_eps, c.hc_eps);
      OPD(d, names[kind], ids[kind], -1, "f32");
      d.nf = kind == 0 ? (size_t)c.n * (2 * hc + hc * hc) : kind == 2 ? (size_t)c.n * flat : (size_t)c.n * c.D;
      d.rows = c.n;
      d.bref = d.bcross = budgets[kind];
      d.cs = &c;
      d.label = label;
      d.call = hc_call;
      d.ref = hc_ref;
      run_case(&d);
      free(c.X), free(c.fn), free(c.base), free(c.scale), free(c.pre), free(c.post), free(c.comb);
      free(c.a);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* compress (SPEC §3.2): gated pooling through the compressor state                             */

typedef struct comp_case {
  float *kv, *score, *ape, *state_kv, *state_score, *rows0;
  int n, m, d, overlap, rows_cap;
  int64_t p0;
} comp_case;

static size_t comp_state_floats(const comp_case *c) { return (size_t)2 * c->m * (c->overlap ? 2 : 1) * c->d; }

/* Output layout: rows [rows_cap, d] | state kv | state score. Rows [r0, r1) of the chunk; for
** r0 > 0 the state and rows are the previous call's (carried in o). */
static int comp_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const comp_case *c = cv;
  int cd = (c->overlap ? 2 : 1) * c->d;
  size_t nrows = (size_t)c->rows_cap * c->d, ns = comp_state_floats(c);
  float *orows = o->f, *okv = o->f + nrows, *osc = okv + ns;
  if (r0 == 0) {
    memcpy(orows, c->rows0, sizeof(float) * nrows);
    memcpy(okv, c->state_kv, sizeof(float) * ns);
    memcpy(osc, c->state_score, sizeof(float) * ns);
  }
  float *rows = r_io(r, "rows", orows, sizeof(float) * nrows);
  float *skv = r_io(r, "state_kv", okv, sizeof(float) * ns);
  float *ssc = r_io(r, "state_score", osc, sizeof(float) * ns);
  float *kv = r_in(r, "kv", c->kv + (size_t)r0 * cd, sizeof(float) * (size_t)(r1 - r0) * cd);
  float *sc = r_in(r, "score", c->score + (size_t)r0 * cd, sizeof(float) * (size_t)(r1 - r0) * cd);
  float *ape = r_in(r, "ape", c->ape, sizeof(float) * (size_t)c->m * cd);
  if (r->bad) return r->bad;
  r->b->ops->compress(r->b->ctx, rows, skv, ssc, kv, sc, ape, r1 - r0, c->p0 + r0, c->m, c->d,
                      c->overlap);
  return 0;
}

/* The reference: SPEC §3.2.1-2 in double (state updates are copies and one fp32 addition). The
** previous block's slots 0..m-1 are read at column k, the current block's m..2m-1 at d + k. */
static void comp_ref_run(const comp_case *c, const float *kvin, const float *scin, int n, int64_t p0,
                         float *skv, float *ssc, double *rows, double *rmag) {
  int m = c->m, d = c->d, cd = (c->overlap ? 2 : 1) * d, slots = c->overlap ? 2 * m : m;
  for (int i = 0; i < n; i++) {
    int64_t t = p0 + i;
    int within = (int)(t % m), slot = c->overlap ? m + within : within;
    for (int k = 0; k < cd; k++) {
      skv[(size_t)slot * cd + k] = kvin[(size_t)i * cd + k];
      ssc[(size_t)slot * cd + k] = (float)((double)scin[(size_t)i * cd + k] + c->ape[(size_t)within * cd + k]);
    }
    if ((t + 1) % m) continue;
    int64_t j = t / m;
    for (int k = 0; k < d; k++) {
      double mx = -INFINITY, den = 0, num = 0, vm = 0;
      for (int s = 0; s < slots; s++) {
        int col = c->overlap && s >= m ? d + k : k;
        mx = fmax(mx, ssc[(size_t)s * cd + col]);
      }
      for (int s = 0; s < slots; s++) {
        int col = c->overlap && s >= m ? d + k : k;
        double e = exp((double)ssc[(size_t)s * cd + col] - mx);
        den += e;
        num += e * skv[(size_t)s * cd + col];
        if (e > 0) vm = fmax(vm, fabs(skv[(size_t)s * cd + col]));
      }
      if (rows) {
        rows[(size_t)j * d + k] = num / den;
        rmag[(size_t)j * d + k] = nz(vm);
      }
    }
    if (c->overlap) {
      memcpy(skv, skv + (size_t)m * cd, sizeof(float) * (size_t)m * cd);
      memcpy(ssc, ssc + (size_t)m * cd, sizeof(float) * (size_t)m * cd);
    }
  }
}
static void comp_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const comp_case *c = cv;
  size_t nrows = (size_t)c->rows_cap * c->d, ns = comp_state_floats(c);
  float *skv = xdup(c->state_kv, sizeof(float) * ns), *ssc = xdup(c->state_score, sizeof(float) * ns);
  for (size_t k = 0; k < nrows; k++) {
    val[k] = c->rows0[k]; /* rows no block completes stay as they were */
    mag[k] = 0;
  }
  comp_ref_run(c, c->kv, c->score, c->n, c->p0, skv, ssc, val, mag);
  for (size_t k = 0; k < ns; k++) {
    val[nrows + k] = skv[k];
    val[nrows + ns + k] = ssc[k];
    mag[nrows + k] = mag[nrows + ns + k] = 0; /* exact */
  }
  free(skv);
  free(ssc);
}
static void t_compress(void) {
  /* m, d, overlap, p0, n, split */
  static const int shapes[][6] = {{4, 24, 1, 0, 13, 6},  {4, 40, 1, 6, 9, 1},   {16, 40, 0, 0, 37, 17},
                                  {16, 24, 0, 10, 1, 0}, {4, 24, 1, 0, 3, 2},   {128, 8, 0, 0, 130, 64},
                                  {4, 128, 1, 3, 5, 1},  {16, 24, 0, 15, 33, 16}};
  for (int k = 0; k < 8; k++) {
    const int *sh = shapes[k];
    comp_case c = {.m = sh[0], .d = sh[1], .overlap = sh[2], .p0 = sh[3], .n = sh[4]};
    int cd = (c.overlap ? 2 : 1) * c.d;
    c.rows_cap = (int)((c.p0 + c.n) / c.m) + 1;
    rng_seed(9000 + k);
    size_t ns = comp_state_floats(&c);
    c.ape = rand_floats((size_t)c.m * cd, 0.3);
    c.state_kv = xcalloc(ns, sizeof(float));
    c.state_score = xcalloc(ns, sizeof(float));
    for (size_t j = 0; j < ns; j++) c.state_score[j] = -INFINITY;
    c.rows0 = xcalloc((size_t)c.rows_cap * c.d, sizeof(float));
    for (size_t j = 0; j < (size_t)c.rows_cap * c.d; j++) c.rows0[j] = 777.0f + (float)j;
    if (c.p0 > 0) { /* the state after tokens 0..p0-1 */
      float *pkv = rand_floats((size_t)c.p0 * cd, 1.0), *psc = rand_floats((size_t)c.p0 * cd, 1.0);
      comp_ref_run(&c, pkv, psc, (int)c.p0, 0, c.state_kv, c.state_score, NULL, NULL);
      free(pkv);
      free(psc);
    }
    c.kv = rand_floats((size_t)c.n * cd, 1.0);
    c.score = rand_floats((size_t)c.n * cd, 2.0);
    for (int i = 0; i < c.n; i++) {
      if ((c.p0 + i) % c.m == 0) /* -inf scores: that slot gets weight 0 (never a whole pool) */
        for (int j = 0; j < cd; j += 3) c.score[(size_t)i * cd + j] = -INFINITY;
      if (i == 1) memset(c.kv + (size_t)i * cd, 0, sizeof(float) * cd);
      if (i == 2) for (int j = 0; j < cd; j++) c.score[(size_t)i * cd + j] = 40.0f; /* dominant */
    }
    char label[80];
    snprintf(label, sizeof label, "m=%d d=%d overlap=%d p0=%lld n=%d", c.m, c.d, c.overlap,
             (long long)c.p0, c.n);
    OPD(d, "compress", ST_OP_COMPRESS, -1, c.overlap ? "csa (overlap)" : "hca");
    d.nf = (size_t)c.rows_cap * c.d + 2 * ns;
    d.rows = c.n;
    d.split = sh[5];
    d.bref = d.bcross = B_COMP;
    d.cs = &c;
    d.label = label;
    d.call = comp_call;
    d.ref = comp_ref;
    run_case(&d);
    free(c.kv), free(c.score), free(c.ape), free(c.state_kv), free(c.state_score), free(c.rows0);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* indexer_scores (SPEC §3.3 step 7-8)                                                          */

typedef struct isc_case {
  float *q, *w, *k;
  int *visible;
  int n, rows, heads, dim, topk, width;
} isc_case;

static int isc_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const isc_case *c = cv;
  int n = r1 - r0;
  float *q = r_in(r, "q", c->q + (size_t)r0 * c->heads * c->dim, sizeof(float) * (size_t)n * c->heads * c->dim);
  float *w = r_in(r, "w", c->w + (size_t)r0 * c->heads, sizeof(float) * (size_t)n * c->heads);
  float *k = r_in(r, "k", c->k, sizeof(float) * (size_t)c->rows * c->dim);
  int *vis = r_in(r, "visible", c->visible + r0, sizeof(int) * (size_t)n);
  float *s = r_out(r, "scores", o->f + (size_t)r0 * c->rows, sizeof(float) * (size_t)n * c->rows);
  if (r->bad) return r->bad;
  r->b->ops->indexer_scores(r->b->ctx, s, q, w, k, n, c->rows, c->heads, c->dim, vis);
  return 0;
}
static void isc_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const isc_case *c = cv;
  for (int i = 0; i < c->n; i++)
    for (int j = 0; j < c->rows; j++) {
      size_t at = (size_t)i * c->rows + j;
      if (j >= c->visible[i]) {
        val[at] = -INFINITY;
        mag[at] = 0;
        continue;
      }
      double s = 0, m = 0;
      for (int h = 0; h < c->heads; h++) {
        const float *qh = c->q + ((size_t)i * c->heads + h) * c->dim, *kj = c->k + (size_t)j * c->dim;
        double dd = 0, dm = 0;
        for (int e = 0; e < c->dim; e++) {
          dd += (double)qh[e] * kj[e];
          dm += fabs((double)qh[e] * kj[e]);
        }
        double wh = c->w[(size_t)i * c->heads + h];
        s += wh * (dd > 0 ? dd : 0);
        m += fabs(wh) * dm;
      }
      val[at] = s;
      mag[at] = nz(m);
    }
}
/* n, rows, heads, dim, topk, width, q and k rounded to bf16 (as FP8 values are). The 70 x 300
** and 66 x 140 cases span several 64-query x 128-row tiles, partial at both ends (a device
** backend's tensor-core path); the last spans three 4096-row chunks of a running top-k, with
** the rows tied to row 1 (below) repeated beyond each chunk start. */
static const int ISC_SHAPES[][7] = {{5, 20, 7, 24, 5, 5, 0},   {1, 1, 7, 24, 5, 1, 0},    {13, 64, 8, 128, 16, 16, 0},
                                    {9, 33, 3, 40, 40, 40, 0}, {4, 12, 1, 8, 3, 12, 0},   {70, 300, 4, 64, 20, 20, 0},
                                    {66, 140, 3, 128, 8, 8, 1}, {6, 9000, 16, 64, 512, 512, 1}};
#define ISC_COUNT 8
static void isc_make(isc_case *c, int k) {
  const int *sh = ISC_SHAPES[k];
  memset(c, 0, sizeof *c);
  c->n = sh[0], c->rows = sh[1], c->heads = sh[2], c->dim = sh[3], c->topk = sh[4], c->width = sh[5];
  rng_seed(10000 + k);
  c->q = rand_floats((size_t)c->n * c->heads * c->dim, 1.0);
  c->w = rand_floats((size_t)c->n * c->heads, 0.1);
  c->k = rand_floats((size_t)c->rows * c->dim, 1.0);
  if (sh[6]) {
    for (size_t j = 0; j < (size_t)c->n * c->heads * c->dim; j++) c->q[j] = st_round_bf16(c->q[j]);
    for (size_t j = 0; j < (size_t)c->rows * c->dim; j++) c->k[j] = st_round_bf16(c->k[j]);
  }
  c->visible = xcalloc((size_t)c->n, sizeof(int));
  for (int i = 0; i < c->n; i++) c->visible[i] = rng_int(c->rows + 1);
  c->visible[0] = c->rows;
  if (c->n > 1) c->visible[1] = 0; /* nothing visible */
  if (c->n > 2) memset(c->q + (size_t)2 * c->heads * c->dim, 0, sizeof(float) * c->heads * c->dim);
  if (c->rows > 3) { /* two identical key rows: exact ties */
    memcpy(c->k + (size_t)3 * c->dim, c->k + (size_t)1 * c->dim, sizeof(float) * c->dim);
    memset(c->k + (size_t)2 * c->dim, 0, sizeof(float) * c->dim); /* and a zero row: score 0 */
    for (int r = 4097; r < c->rows; r += 4096) /* ties across the chunks of a running top-k */
      memcpy(c->k + (size_t)r * c->dim, c->k + (size_t)1 * c->dim, sizeof(float) * c->dim);
  }
}
static void isc_free(isc_case *c) {
  free(c->q), free(c->w), free(c->k), free(c->visible);
}
static void t_indexer_scores(void) {
  for (int k = 0; k < ISC_COUNT; k++) {
    isc_case c;
    isc_make(&c, k);
    char label[80];
    snprintf(label, sizeof label, "n=%d rows=%d heads=%d dim=%d", c.n, c.rows, c.heads, c.dim);
    OPD(d, "indexer_scores", ST_OP_INDEXER_SCORES, -1, "f32");
    d.nf = (size_t)c.n * c.rows;
    d.rows = c.n;
    d.bref = d.bcross = B_DOT;
    d.cs = &c;
    d.label = label;
    d.call = isc_call;
    d.ref = isc_ref;
    run_case(&d);
    isc_free(&c);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* topk                                                                                         */

typedef struct tk_case {
  float *scores;
  int *visible;
  int n, rows, k, width;
} tk_case;

static int tk_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const tk_case *c = cv;
  int n = r1 - r0;
  float *s = r_in(r, "scores", c->scores + (size_t)r0 * c->rows, sizeof(float) * (size_t)n * c->rows);
  int *vis = r_in(r, "visible", c->visible + r0, sizeof(int) * (size_t)n);
  int32_t *idx = r_out(r, "idx", o->i + (size_t)r0 * c->width, sizeof(int32_t) * (size_t)n * c->width);
  void *work = r_scratch(r, workspace_bytes(r->b));
  if (r->bad) return r->bad;
  r->b->ops->topk(r->b->ctx, idx, s, n, c->rows, vis, c->k, c->width, work);
  return 0;
}
/* a ranks above b: higher score, NaN ranking as -inf, ties to the lower index */
static int tk_better(double sa, int a, double sb, int b) {
  if (sa != sa) sa = -INFINITY;
  if (sb != sb) sb = -INFINITY;
  if (sa != sb) return sa > sb;
  return a < b;
}
static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}
/* The reference selection: take = min(k, visible) best of s[0..visible), ascending, -1 padded. */
static void tk_select(const double *s, int visible, int k, int width, int32_t *out) {
  int take = k < visible ? k : visible, c = 0;
  if (take > width) take = width;
  for (int j = 0; j < visible && c < take; j++) {
    int better = 0; /* j is selected iff fewer than take entries rank above it */
    for (int u = 0; u < visible && better < take; u++)
      if (u != j && tk_better(s[u], u, s[j], j)) better++;
    if (better < take) out[c++] = j;
  }
  qsort(out, (size_t)c, sizeof *out, cmp_i32);
  for (; c < width; c++) out[c] = -1;
}
static void tk_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)val, (void)mag;
  const tk_case *c = cv;
  double *s = xcalloc((size_t)c->rows, sizeof(double));
  for (int i = 0; i < c->n; i++) {
    for (int j = 0; j < c->rows; j++) s[j] = c->scores[(size_t)i * c->rows + j];
    tk_select(s, c->visible[i], c->k, c->width, iref + (size_t)i * c->width);
  }
  free(s);
}
static void t_topk(void) {
  /* n, rows, k, width, kind (0 random, 1 quantised ties, 2 NaN, 3 -inf, 4 NaN vs -inf) */
  static const int shapes[][5] = {{5, 20, 5, 5, 0},   {13, 64, 16, 16, 1}, {7, 40, 8, 10, 2},
                                  {6, 33, 7, 12, 3},  {1, 1, 5, 5, 0},     {9, 300, 64, 64, 1},
                                  {4, 10, 20, 24, 1}, {3, 6, 2, 2, 4},     {8, 50, 1, 1, 1}};
  for (int k = 0; k < 9; k++) {
    const int *sh = shapes[k];
    tk_case c = {.n = sh[0], .rows = sh[1], .k = sh[2], .width = sh[3]};
    rng_seed(11000 + k);
    c.scores = rand_floats((size_t)c.n * c.rows, 1.0);
    c.visible = xcalloc((size_t)c.n, sizeof(int));
    for (int i = 0; i < c.n; i++) c.visible[i] = rng_int(c.rows + 1);
    c.visible[0] = c.rows;
    if (c.n > 1) c.visible[1] = 0;
    if (c.n > 2) c.visible[2] = c.rows < 3 ? c.rows : 3; /* width > visible */
    for (size_t j = 0; j < (size_t)c.n * c.rows; j++) {
      float *s = &c.scores[j];
      if (sh[4] == 1) *s = (float)rng_int(4);                 /* many exact ties */
      if (sh[4] == 2 && rng_int(4) == 0) *s = NAN;
      if (sh[4] == 3 && rng_int(3) == 0) *s = -INFINITY;       /* masked scores */
    }
    if (c.n > 3) for (int j = 0; j < c.rows; j++) c.scores[(size_t)3 * c.rows + j] = 0.5f; /* all tied */
    if (sh[4] == 2 && c.n > 4) for (int j = 0; j < c.rows; j++) c.scores[(size_t)4 * c.rows + j] = NAN;
    if (sh[4] == 4) { /* NaN ranks as -inf: [NaN, -inf, 1, NaN, -inf, 2] keeps 1, 2 and then 0, 1 */
      static const float row[6] = {NAN, -INFINITY, 1.0f, NAN, -INFINITY, 2.0f};
      for (int i = 0; i < c.n; i++) {
        memcpy(c.scores + (size_t)i * c.rows, row, sizeof row);
        c.visible[i] = 6 - i;
      }
      c.k = 4;
      c.width = 4;
    }
    char label[80];
    snprintf(label, sizeof label, "n=%d rows=%d k=%d width=%d kind=%d", c.n, c.rows, c.k, c.width, sh[4]);
    OPD(d, "topk", ST_OP_TOPK, -1, sh[4] == 4 ? "nan_vs_-inf" : "f32");
    d.ni = (size_t)c.n * c.width;
    d.rows = c.n;
    d.cs = &c;
    d.label = label;
    d.call = tk_call;
    d.ref = tk_ref;
    run_case(&d);
    free(c.scores);
    free(c.visible);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* indexer_topk (optional): the tie rule against the reference, and the same bits as            */
/* indexer_scores + topk on the same backend                                                    */

static int itk_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const isc_case *c = cv;
  int n = r1 - r0;
  float *q = r_in(r, "q", c->q + (size_t)r0 * c->heads * c->dim, sizeof(float) * (size_t)n * c->heads * c->dim);
  float *w = r_in(r, "w", c->w + (size_t)r0 * c->heads, sizeof(float) * (size_t)n * c->heads);
  float *k = r_in(r, "k", c->k, sizeof(float) * (size_t)c->rows * c->dim);
  int *vis = r_in(r, "visible", c->visible + r0, sizeof(int) * (size_t)n);
  int32_t *idx = r_out(r, "idx", o->i + (size_t)r0 * c->width, sizeof(int32_t) * (size_t)n * c->width);
  void *work = r_scratch(r, workspace_bytes(r->b));
  if (r->bad) return r->bad;
  r->b->ops->indexer_topk(r->b->ctx, idx, q, w, k, n, c->rows, c->heads, c->dim, vis, c->topk,
                          c->width, work);
  return 0;
}
/* The composition on one backend: scores into backend memory, then topk. */
static int itk_composed_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const isc_case *c = cv;
  int n = r1 - r0;
  float *q = r_in(r, "q", c->q + (size_t)r0 * c->heads * c->dim, sizeof(float) * (size_t)n * c->heads * c->dim);
  float *w = r_in(r, "w", c->w + (size_t)r0 * c->heads, sizeof(float) * (size_t)n * c->heads);
  float *k = r_in(r, "k", c->k, sizeof(float) * (size_t)c->rows * c->dim);
  int *vis = r_in(r, "visible", c->visible + r0, sizeof(int) * (size_t)n);
  int32_t *idx = r_out(r, "idx", o->i + (size_t)r0 * c->width, sizeof(int32_t) * (size_t)n * c->width);
  float *s = r_scratch(r, sizeof(float) * (size_t)n * c->rows);
  void *work = r_scratch(r, workspace_bytes(r->b));
  if (r->bad) return r->bad;
  r->b->ops->indexer_scores(r->b->ctx, s, q, w, k, n, c->rows, c->heads, c->dim, vis);
  r->b->ops->topk(r->b->ctx, idx, s, n, c->rows, vis, c->topk, c->width, work);
  return 0;
}
static void itk_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)val, (void)mag;
  const isc_case *c = cv;
  double *s = xcalloc((size_t)c->n * c->rows, sizeof(double)), *m = xcalloc((size_t)c->n * c->rows, sizeof(double));
  isc_ref(c, s, m, NULL);
  for (int i = 0; i < c->n; i++) tk_select(s + (size_t)i * c->rows, c->visible[i], c->topk, c->width, iref + (size_t)i * c->width);
  free(s);
  free(m);
}
/* Checks one selection row against reference scores s (tolerance tol[j]) with the tie rule. */
static int check_selection(const int32_t *got, int count, int width, const double *s, const double *tol,
                           int n_all, int ascending, char *why) {
  char *in = xcalloc((size_t)n_all + 1, 1);
  int bad = 0;
  for (int c = 0; c < width && !bad; c++) {
    int32_t e = got[c];
    if (c >= count) {
      if (e != -1) snprintf(why, 200, "slot %d = %d, expected the -1 padding", c, e), bad = 1;
      continue;
    }
    if (e < 0 || e >= n_all) snprintf(why, 200, "slot %d = %d: out of range [0, %d)", c, e, n_all), bad = 1;
    else if (in[e]) snprintf(why, 200, "slot %d: %d selected twice", c, e), bad = 1;
    else if (ascending && c > 0 && got[c - 1] >= e) snprintf(why, 200, "slot %d: not ascending", c), bad = 1;
    else in[e] = 1;
  }
  for (int c = 0; c < count && !bad; c++) {
    int32_t e = got[c];
    for (int u = 0; u < n_all && !bad; u++) {
      if (in[u]) continue;
      double su = s[u] != s[u] ? -INFINITY : s[u], se = s[e] != s[e] ? -INFINITY : s[e]; /* NaN as -inf */
      int beats = su > se + fmax(tol[u], tol[e]) || (su == se && u < e);
      if (beats) snprintf(why, 200, "%d (ref %.9g) selected over %d (ref %.9g)", e, se, u, su), bad = 1;
    }
  }
  free(in);
  return bad;
}
static double itk_check(const opdesc *d, const double *val, const double *mag, const int32_t *iexp,
                        const outs *got, int vs_ref, char *why) {
  (void)val, (void)mag, (void)iexp, (void)vs_ref;
  const isc_case *c = d->cs;
  double *s = xcalloc((size_t)c->n * c->rows, sizeof(double)), *m = xcalloc((size_t)c->n * c->rows, sizeof(double));
  isc_ref(c, s, m, NULL);
  for (size_t j = 0; j < (size_t)c->n * c->rows; j++) m[j] *= B_DOT;
  int bad = 0;
  for (int i = 0; i < c->n && !bad; i++) {
    int take = c->topk < c->visible[i] ? c->topk : c->visible[i];
    if (take > c->width) take = c->width;
    char w2[200] = "";
    bad = check_selection(got->i + (size_t)i * c->width, take, c->width, s + (size_t)i * c->rows,
                          m + (size_t)i * c->rows, c->visible[i], 1, w2);
    if (bad) snprintf(why, 200, "query %d: %s", i, w2);
  }
  free(s);
  free(m);
  return bad ? INFINITY : 0;
}
static void t_indexer_topk(void) {
  for (int k = 0; k < ISC_COUNT; k++) {
    isc_case c;
    isc_make(&c, k);
    char label[80];
    snprintf(label, sizeof label, "n=%d rows=%d heads=%d dim=%d topk=%d width=%d", c.n, c.rows, c.heads,
             c.dim, c.topk, c.width);
    OPD(d, "indexer_topk", ST_OP_INDEXER_TOPK, -1, "f32");
    d.ni = (size_t)c.n * c.width;
    d.rows = c.n;
    d.cs = &c;
    d.label = label;
    d.call = itk_call;
    d.ref = itk_ref;
    d.check = itk_check;
    /* the composition through the same driver (its own rows in the table) */
    OPD(dc, "indexer_topk", ST_OP_INDEXER_SCORES, -1, "composed");
    dc.ni = d.ni;
    dc.rows = c.n;
    dc.cs = &c;
    dc.label = label;
    dc.call = itk_composed_call;
    dc.ref = itk_ref;
    dc.check = itk_check;
    run_case(&dc);
    int ci = case_next();
    for (int s = 0; s < NBACKENDS; s++) { /* fused: optional; same bits as the composition */
      backend_slot *bs = &backends[s];
      if (!bs->open || case_skip(ci, s)) continue;
      case_mark(ci, s);
      if (!bs->b.ops->indexer_topk) {
        res_skip("indexer_topk", "fused", bs->name, "optional entry is NULL (the engine composes)");
        continue;
      }
      result *res = res_get("indexer_topk", "fused", bs->name, 0);
      char why[256] = "";
      outs of, oc;
      outs_alloc(&of, &d);
      outs_alloc(&oc, &d);
      double err = 0;
      if (!run_once(&d, &bs->b, 0, c.n, &of, why) && !run_once(&dc, &bs->b, 0, c.n, &oc, why)) {
        size_t at;
        err = itk_check(&d, NULL, NULL, NULL, &of, 1, why);
        if (!why[0] && !outs_same(&of, &oc, &at))
          snprintf(why, 200, "fused differs from indexer_scores + topk at index %zu", at);
        if (!why[0]) determinism(&d, &bs->b, &of, why);
      }
      res_case(res, err, label, why);
      outs_free(&of);
      outs_free(&oc);
    }
    isc_free(&c);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* candidates (SPEC §2.3-2.4)                                                                   */

typedef struct cand_case {
  int32_t *topk; /* NULL: HCA */
  int n, window, width, ratio;
  int64_t p0;
  int32_t base;
} cand_case;

static int cand_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const cand_case *c = cv;
  int n = r1 - r0, cw = c->window + c->width;
  int32_t *tk = c->topk ? r_in(r, "topk", c->topk + (size_t)r0 * c->width, sizeof(int32_t) * (size_t)n * c->width) : NULL;
  int32_t *cand = r_out(r, "cand", o->i + (size_t)r0 * cw, sizeof(int32_t) * (size_t)n * cw);
  if (r->bad) return r->bad;
  r->b->ops->candidates(r->b->ctx, cand, tk, n, c->p0 + r0, c->window, c->width, c->base, c->ratio);
  return 0;
}
/* Written from the contract. */
static void cand_ref_rows(const cand_case *c, int64_t p0, int r0, int r1, int32_t *out) {
  int cw = c->window + c->width;
  for (int i = r0; i < r1; i++) {
    int64_t t = c->p0 + i;
    int32_t *o = out + (size_t)i * cw;
    for (int k = 0; k < c->window; k++) {
      int64_t p = t - c->window + 1 + k;
      o[k] = p < 0 ? -1 : p >= p0 ? (int32_t)(c->window + (p - p0)) : (int32_t)(p % c->window);
    }
    for (int j = 0; j < c->width; j++) {
      if (c->topk) {
        int32_t v = c->topk[(size_t)i * c->width + j];
        o[c->window + j] = v < 0 ? -1 : v + c->base;
      } else {
        o[c->window + j] = j < (t + 1) / c->ratio ? c->base + j : -1;
      }
    }
  }
}
static void cand_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)val, (void)mag;
  const cand_case *c = cv;
  cand_ref_rows(c, c->p0, 0, c->n, iref);
}
static void t_candidates(void) {
  /* n, p0, window, width, ratio (0: CSA with top-k) */
  static const int shapes[][5] = {{13, 0, 16, 5, 0},  {7, 100, 16, 5, 0}, {37, 0, 16, 2, 16},
                                  {1, 250, 16, 15, 16}, {5, 3, 16, 0, 0},  {9, 60, 64, 16, 4},
                                  {3, 0, 1, 3, 4}};
  for (int k = 0; k < 7; k++) {
    const int *sh = shapes[k];
    cand_case c = {.n = sh[0], .p0 = sh[1], .window = sh[2], .width = sh[3], .ratio = sh[4] ? sh[4] : 4};
    c.base = c.window + 64;
    rng_seed(12000 + k);
    if (!sh[4]) {
      c.topk = xcalloc((size_t)c.n * (c.width ? c.width : 1), sizeof(int32_t));
      for (int i = 0; i < c.n * c.width; i++) c.topk[i] = rng_int(3) == 0 ? -1 : rng_int(200);
    }
    char label[80];
    snprintf(label, sizeof label, "n=%d p0=%lld window=%d width=%d %s", c.n, (long long)c.p0, c.window,
             c.width, c.topk ? "csa" : "hca");
    OPD(d, "candidates", ST_OP_CANDIDATES, -1, c.topk ? "csa" : "hca");
    d.ni = (size_t)c.n * (c.window + c.width);
    d.rows = c.n;
    d.nosplit = 1; /* a later chunk start maps earlier window positions to ring slots */
    d.cs = &c;
    d.label = label;
    d.call = cand_call;
    d.ref = cand_ref;
    run_case(&d);
    free(c.topk);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* sparse_attention (SPEC §3.4): one softmax over the candidates and the sink                   */

typedef struct att_case {
  float *q, *kv, *sinks;
  int32_t *cand;
  int n, heads, d, width, rows, probs_bf16;
  float scale;
} att_case;

static int att_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const att_case *c = cv;
  int n = r1 - r0;
  size_t qrow = (size_t)c->heads * c->d;
  float *q = r_in(r, "q", c->q + r0 * qrow, sizeof(float) * n * qrow);
  float *kv = r_in(r, "kv", c->kv, sizeof(float) * (size_t)c->rows * c->d);
  int32_t *cand = r_in(r, "cand", c->cand + (size_t)r0 * c->width, sizeof(int32_t) * (size_t)n * c->width);
  float *sinks = r_in(r, "sinks", c->sinks, sizeof(float) * (size_t)c->heads);
  float *out = r_out(r, "out", o->f + r0 * qrow, sizeof(float) * n * qrow);
  if (r->bad) return r->bad;
  r->b->ops->sparse_attention(r->b->ctx, out, q, kv, cand, n, c->heads, c->d, c->width, sinks,
                              c->scale, c->probs_bf16);
  return 0;
}
static void att_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const att_case *c = cv;
  double *s = xcalloc((size_t)c->width + 1, sizeof(double));
  for (int i = 0; i < c->n; i++) {
    const int32_t *cd = c->cand + (size_t)i * c->width;
    double vmax = 0;
    for (int j = 0; j < c->width; j++)
      if (cd[j] >= 0)
        for (int k = 0; k < c->d; k++) vmax = fmax(vmax, fabs(c->kv[(size_t)cd[j] * c->d + k]));
    for (int h = 0; h < c->heads; h++) {
      const float *qh = c->q + ((size_t)i * c->heads + h) * c->d;
      double M = c->sinks[h], den = 0;
      for (int j = 0; j < c->width; j++) {
        if (cd[j] < 0) continue;
        double dd = 0;
        for (int k = 0; k < c->d; k++) dd += (double)qh[k] * c->kv[(size_t)cd[j] * c->d + k];
        s[j] = dd * c->scale;
        M = fmax(M, s[j]);
      }
      for (int j = 0; j < c->width; j++)
        if (cd[j] >= 0) den += exp(s[j] - M);
      den += exp(c->sinks[h] - M);
      double *o = val + ((size_t)i * c->heads + h) * c->d;
      for (int k = 0; k < c->d; k++) o[k] = 0;
      double *m = mag + ((size_t)i * c->heads + h) * c->d;
      for (int k = 0; k < c->d; k++) m[k] = B_ATT * nz(vmax); /* the tolerance, divided below */
      for (int j = 0; j < c->width; j++) {
        if (cd[j] < 0) continue;
        double p = exp(s[j] - M) / den, step = 0;
        if (c->probs_bf16) { /* a probability within fp32 error of a bf16 tie may round either way */
          step = tie_step_bf16(p, 1e-5 * p);
          p = st_round_bf16((float)p);
        }
        for (int k = 0; k < c->d; k++) {
          o[k] += p * c->kv[(size_t)cd[j] * c->d + k];
          m[k] += step * fabs(c->kv[(size_t)cd[j] * c->d + k]);
        }
      }
      for (int k = 0; k < c->d; k++) m[k] /= B_ATT;
    }
  }
  free(s);
}
static void t_sparse_attention(void) {
  /* n, heads, d, kv rows, width, logit scale multiplier, inputs: 0 fp32, 1 q and kv rounded to
  ** bf16 (as in reference mode), 2 the same but for one kv row, the last candidate of token 0
  ** (a device backend's bf16 path must notice it late and fall back). From the seventh: several
  ** 16- and 32-head groups and 32- and 64-row candidate tiles, partial at both ends, with d a
  ** multiple of 64 (a device backend's tensor-core paths); the last but two, V4-Flash's CSA shape
  ** (64 heads of 512, a window of 128 and the top 512). */
  static const int shapes[][7] = {{5, 3, 40, 30, 21, 1, 0}, {1, 3, 40, 30, 21, 1, 0}, {13, 2, 24, 80, 37, 1, 0},
                                  {3, 2, 512, 50, 16, 1, 0}, {4, 3, 40, 20, 0, 1, 0},  {6, 4, 72, 40, 25, 30, 0},
                                  {6, 20, 64, 150, 140, 1, 0}, {6, 20, 64, 150, 140, 4, 1},
                                  {5, 17, 512, 90, 70, 1, 1}, {3, 64, 512, 700, 640, 1, 1},
                                  {5, 33, 128, 64, 45, 2, 1}, {3, 40, 256, 300, 200, 1, 2}};
  for (int k = 0; k < 12; k++)
    for (int pb = 0; pb < 2; pb++) {
      const int *sh = shapes[k];
      att_case c = {.n = sh[0], .heads = sh[1], .d = sh[2], .rows = sh[3], .width = sh[4], .probs_bf16 = pb};
      c.scale = (float)(sh[5] / sqrt((double)c.d));
      rng_seed(13000 + 10 * k + pb);
      c.q = rand_floats((size_t)c.n * c.heads * c.d, 1.0);
      c.kv = rand_floats((size_t)c.rows * c.d, 1.0);
      c.sinks = rand_floats((size_t)c.heads, 1.0);
      if (sh[6]) {
        for (size_t j = 0; j < (size_t)c.n * c.heads * c.d; j++) c.q[j] = st_round_bf16(c.q[j]);
        size_t exact = (size_t)(sh[6] == 2 ? c.rows - 1 : c.rows) * c.d; /* 2: the last row stays fp32 */
        for (size_t j = 0; j < exact; j++) c.kv[j] = st_round_bf16(c.kv[j]);
      }
      c.cand = xcalloc((size_t)c.n * (c.width ? c.width : 1), sizeof(int32_t));
      for (int j = 0; j < c.n * c.width; j++) c.cand[j] = rng_int(4) == 0 ? -1 : rng_int(c.rows);
      if (c.n > 1 && c.width) /* only the sink: every candidate -1 */
        for (int j = 0; j < c.width; j++) c.cand[(size_t)1 * c.width + j] = -1;
      if (c.n > 2 && c.width > 3) c.cand[(size_t)2 * c.width + 3] = c.cand[(size_t)2 * c.width + 2] = 5; /* repeated */
      if (sh[6] == 2) c.cand[c.width - 1] = c.rows - 1; /* token 0's last candidate: the fp32 row */
      if (c.n > 3) memset(c.q + (size_t)3 * c.heads * c.d, 0, sizeof(float) * c.heads * c.d); /* uniform */
      if (c.n > 4 && c.width) { /* a single candidate */
        for (int j = 0; j < c.width; j++) c.cand[(size_t)4 * c.width + j] = -1;
        c.cand[(size_t)4 * c.width + c.width - 1] = c.rows - 1;
      }
      char label[80];
      snprintf(label, sizeof label, "n=%d heads=%d d=%d width=%d scale x%d%s", c.n, c.heads, c.d, c.width,
               sh[5], sh[6] == 1 ? " bf16 inputs" : sh[6] ? " bf16 inputs but one kv row" : "");
      OPD(d, "sparse_attention", ST_OP_SPARSE_ATTENTION, -1, pb ? "probs bf16" : "probs f32");
      d.nf = (size_t)c.n * c.heads * c.d;
      d.rows = c.n;
      d.bref = d.bcross = B_ATT;
      d.cs = &c;
      d.label = label;
      d.call = att_call;
      d.ref = att_ref;
      run_case(&d);
      free(c.q), free(c.kv), free(c.sinks), free(c.cand);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* moe_route (SPEC §2.5)                                                                        */

typedef struct route_case {
  float *logits, *bias;
  int32_t *hash;
  int n, E, kE;
  float rs;
} route_case;

/* Outputs: floats = weights [n, kE] | scores [n, E]; ints = experts [n, kE]. */
static int route_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const route_case *c = cv;
  int n = r1 - r0;
  float *sc_host = o->f + (size_t)c->n * c->kE + (size_t)r0 * c->E;
  memcpy(sc_host, c->logits + (size_t)r0 * c->E, sizeof(float) * (size_t)n * c->E);
  float *logits = r_io(r, "logits", sc_host, sizeof(float) * (size_t)n * c->E);
  float *bias = c->bias ? r_in(r, "bias", c->bias, sizeof(float) * (size_t)c->E) : NULL;
  int32_t *hash = c->hash ? r_in(r, "hash", c->hash + (size_t)r0 * c->kE, sizeof(int32_t) * (size_t)n * c->kE) : NULL;
  int32_t *ex = r_out(r, "experts", o->i + (size_t)r0 * c->kE, sizeof(int32_t) * (size_t)n * c->kE);
  float *w = r_out(r, "weights", o->f + (size_t)r0 * c->kE, sizeof(float) * (size_t)n * c->kE);
  if (r->bad) return r->bad;
  r->b->ops->moe_route(r->b->ctx, ex, w, logits, bias, hash, n, c->E, c->kE, c->rs);
  return 0;
}
static double softplus_sqrt(double l) { return sqrt(l > 30 ? l + log1p(exp(-l)) : log1p(exp(l))); }
static void route_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  const route_case *c = cv;
  double *sel = xcalloc((size_t)c->E, sizeof(double));
  for (int i = 0; i < c->n; i++) {
    double *sc = val + (size_t)c->n * c->kE + (size_t)i * c->E, mx = 0;
    for (int e = 0; e < c->E; e++) {
      sc[e] = softplus_sqrt(c->logits[(size_t)i * c->E + e]);
      mx = fmax(mx, sc[e]);
      sel[e] = sc[e] + (c->bias ? c->bias[e] : 0);
    }
    for (int e = 0; e < c->E; e++) mag[(size_t)c->n * c->kE + (size_t)i * c->E + e] = nz(mx);
    int32_t *ex = iref + (size_t)i * c->kE;
    if (c->hash) memcpy(ex, c->hash + (size_t)i * c->kE, sizeof(int32_t) * (size_t)c->kE);
    else tk_select(sel, c->E, c->kE, c->kE, ex); /* ascending; the order is not the contract's */
    double sum = 0;
    for (int k = 0; k < c->kE; k++) sum += sc[ex[k]];
    for (int k = 0; k < c->kE; k++) {
      val[(size_t)i * c->kE + k] = sc[ex[k]] / sum * c->rs;
      mag[(size_t)i * c->kE + k] = c->rs;
    }
  }
  free(sel);
}
/* Scores as generic; experts by the tie rule (any order within a token; hash: exactly); weights
** against the expected scores gathered at the experts the backend chose. */
static double route_check(const opdesc *d, const double *val, const double *mag, const int32_t *iexp,
                          const outs *got, int vs_ref, char *why) {
  (void)iexp;
  const route_case *c = d->cs;
  double budget = vs_ref ? d->bref : d->bcross;
  size_t nk = (size_t)c->n * c->kE;
  double err = cmp_floats(val + nk, mag + nk, got->f + nk, (size_t)c->n * c->E, budget, why, "score");
  double *rv = xcalloc((size_t)c->n * c->E + nk, sizeof(double)), *rm = xcalloc((size_t)c->n * c->E + nk, sizeof(double));
  int32_t *ri = xcalloc(nk, sizeof(int32_t));
  route_ref(c, rv, rm, ri); /* the double reference's scores decide the ties */
  double *sel = xcalloc((size_t)c->E, sizeof(double)), *tol = xcalloc((size_t)c->E, sizeof(double));
  int32_t *sorted = xcalloc((size_t)c->kE, sizeof(int32_t));
  for (int i = 0; i < c->n && !why[0]; i++) {
    const int32_t *ex = got->i + (size_t)i * c->kE;
    if (c->hash) {
      for (int k = 0; k < c->kE; k++)
        if (ex[k] != c->hash[(size_t)i * c->kE + k] && !why[0])
          snprintf(why, 200, "token %d slot %d: expert %d, the hash gives %d", i, k, ex[k], c->hash[(size_t)i * c->kE + k]);
    } else {
      double mx = 0;
      for (int e = 0; e < c->E; e++) {
        sel[e] = rv[nk + (size_t)i * c->E + e] + c->bias[e];
        mx = fmax(mx, fabs(sel[e]));
      }
      for (int e = 0; e < c->E; e++) tol[e] = d->bref * mx;
      memcpy(sorted, ex, sizeof(int32_t) * (size_t)c->kE);
      qsort(sorted, (size_t)c->kE, sizeof(int32_t), cmp_i32);
      char w2[200] = "";
      if (check_selection(sorted, c->kE, c->kE, sel, tol, c->E, 1, w2)) snprintf(why, 200, "token %d: %s", i, w2);
    }
    if (why[0]) break;
    double sum = 0; /* weights of the chosen experts, from the expected scores */
    for (int k = 0; k < c->kE; k++) sum += val[nk + (size_t)i * c->E + ex[k]];
    for (int k = 0; k < c->kE; k++) {
      double e = val[nk + (size_t)i * c->E + ex[k]] / sum * c->rs, g = got->f[(size_t)i * c->kE + k];
      double er = isfinite(g) ? fabs(g - e) / c->rs : INFINITY;
      if (er > budget && !why[0])
        snprintf(why, 200, "token %d slot %d (expert %d): weight %.9g, expected %.9g", i, k, ex[k], g, e);
      err = fmax(err, er);
    }
  }
  free(rv), free(rm), free(ri), free(sel), free(tol), free(sorted);
  return why[0] ? fmax(err, INFINITY) : err;
}
static void t_moe_route(void) {
  /* n, E, kE, kind (0 random, 1 exact ties, 2 hash, 3 -inf and large logits) */
  static const int shapes[][4] = {{13, 5, 2, 0}, {1, 5, 2, 0}, {7, 8, 2, 1}, {5, 5, 2, 2},
                                  {3, 256, 6, 0}, {6, 16, 4, 3}, {9, 8, 3, 1}};
  for (int k = 0; k < 7; k++) {
    const int *sh = shapes[k];
    route_case c = {.n = sh[0], .E = sh[1], .kE = sh[2], .rs = k & 1 ? 2.5f : 1.5f};
    rng_seed(14000 + k);
    c.logits = rand_floats((size_t)c.n * c.E, 2.0);
    if (sh[3] != 2) c.bias = rand_floats((size_t)c.E, 0.2);
    if (sh[3] == 1) { /* ties: quantised logits, equal biases, a row of zeros */
      for (int j = 0; j < c.n * c.E; j++) c.logits[j] = (float)(rng_int(3) - 1);
      for (int e = 0; e < c.E; e++) c.bias[e] = e % 2 ? 0.25f : 0.0f;
      memset(c.logits, 0, sizeof(float) * c.E);
    }
    if (sh[3] == 2) {
      c.hash = xcalloc((size_t)c.n * c.kE, sizeof(int32_t));
      for (int j = 0; j < c.n * c.kE; j++) c.hash[j] = rng_int(c.E);
    }
    if (sh[3] == 3)
      for (int i = 0; i < c.n; i++) {
        c.logits[(size_t)i * c.E + 0] = -INFINITY; /* score 0 */
        c.logits[(size_t)i * c.E + 1] = 25.0f + i;  /* the large-logit branch */
        c.logits[(size_t)i * c.E + 2] = -40.0f;
      }
    char label[80];
    snprintf(label, sizeof label, "n=%d E=%d kE=%d kind=%d", c.n, c.E, c.kE, sh[3]);
    OPD(d, "moe_route", ST_OP_MOE_ROUTE, -1, sh[3] == 2 ? "hash" : "scored");
    d.nf = (size_t)c.n * (c.kE + c.E);
    d.ni = (size_t)c.n * c.kE;
    d.rows = c.n;
    d.bref = d.bcross = B_ROUTE;
    d.cs = &c;
    d.label = label;
    d.call = route_call;
    d.ref = route_ref;
    d.check = route_check;
    run_case(&d);
    free(c.logits), free(c.bias), free(c.hash);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* gather_rows, scatter_add, swiglu                                                             */

typedef struct gs_case {
  float *src, *y, *w, *out0, *g, *u;
  int32_t *rows;
  int count, D, R, kind; /* 0 gather, 1 scatter_add, 2 swiglu (count = n, D = F) */
  float limit;
} gs_case;

static int gs_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const gs_case *c = cv;
  int n = r1 - r0;
  size_t D = (size_t)c->D;
  const st_backend_ops *ops = r->b->ops;
  if (c->kind == 0) {
    float *src = r_in(r, "src", c->src, sizeof(float) * c->R * D);
    int32_t *rows = r_in(r, "rows", c->rows + r0, sizeof(int32_t) * (size_t)n);
    float *dst = r_out(r, "dst", o->f + r0 * D, sizeof(float) * n * D);
    if (r->bad) return r->bad;
    ops->gather_rows(r->b->ctx, dst, src, rows, n, c->D);
  } else if (c->kind == 1) {
    if (r0 == 0) memcpy(o->f, c->out0, sizeof(float) * c->R * D); /* later: the previous call's */
    float *out = r_io(r, "out", o->f, sizeof(float) * c->R * D);
    float *y = r_in(r, "y", c->y + r0 * D, sizeof(float) * n * D);
    int32_t *rows = r_in(r, "rows", c->rows + r0, sizeof(int32_t) * (size_t)n);
    float *w = r_in(r, "weight", c->w + r0, sizeof(float) * (size_t)n);
    if (r->bad) return r->bad;
    ops->scatter_add(r->b->ctx, out, y, rows, w, n, c->D);
  } else {
    float *g = r_in(r, "g", c->g + r0 * D, sizeof(float) * n * D);
    float *u = r_in(r, "u", c->u + r0 * D, sizeof(float) * n * D);
    float *h = r_out(r, "h", o->f + r0 * D, sizeof(float) * n * D);
    if (r->bad) return r->bad;
    ops->swiglu(r->b->ctx, h, g, u, n, c->D, c->limit);
  }
  return 0;
}
static void gs_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const gs_case *c = cv;
  size_t D = (size_t)c->D;
  if (c->kind == 0) {
    for (int k = 0; k < c->count; k++)
      for (size_t j = 0; j < D; j++) {
        val[k * D + j] = c->src[(size_t)c->rows[k] * D + j];
        mag[k * D + j] = 0;
      }
  } else if (c->kind == 1) {
    for (size_t j = 0; j < c->R * D; j++) {
      val[j] = c->out0[j];
      mag[j] = fabs(c->out0[j]);
    }
    for (int k = 0; k < c->count; k++)
      for (size_t j = 0; j < D; j++) {
        double t = (double)c->y[k * D + j] * c->w[k];
        val[(size_t)c->rows[k] * D + j] += t;
        mag[(size_t)c->rows[k] * D + j] += fabs(t);
      }
    for (size_t j = 0; j < c->R * D; j++) {
      int touched = 0;
      for (int k = 0; k < c->count && !touched; k++) touched = (size_t)c->rows[k] == j / D;
      mag[j] = touched ? nz(mag[j]) : 0; /* untouched rows stay exactly */
    }
  } else {
    double L = c->limit;
    for (size_t j = 0; j < (size_t)c->count * D; j++) {
      double g = fmin(c->g[j], L), u = fmin(fmax(c->u[j], -L), L);
      double h = g / (1 + exp(-g)) * u;
      val[j] = h;
      mag[j] = fabs(h) + ldexp(1.0, -20);
    }
  }
}
static void t_gather_scatter_swiglu(void) {
  static const char *names[] = {"gather_rows", "scatter_add", "swiglu"};
  static const st_op ids[] = {ST_OP_GATHER_ROWS, ST_OP_SCATTER_ADD, ST_OP_SWIGLU};
  static const double budgets[] = {0, B_SCAT, B_SWI};
  /* count, D, R */
  static const int shapes[][3] = {{1, 72, 5}, {13, 40, 7}, {0, 24, 3}, {37, 36, 13}, {8, 256, 4}};
  for (int kind = 0; kind < 3; kind++)
    for (int k = 0; k < 5; k++) {
      const int *sh = shapes[k];
      gs_case c = {.count = sh[0], .D = sh[1], .R = sh[2], .kind = kind, .limit = 10.0f};
      if (kind == 2 && c.count == 0) continue;
      rng_seed(15000 + 10 * kind + k);
      size_t D = (size_t)c.D;
      c.src = rand_floats(c.R * D, 1.0);
      c.out0 = rand_floats(c.R * D, 1.0);
      c.y = rand_floats((size_t)c.count * D, 1.0);
      c.w = rand_floats((size_t)c.count, 1.0);
      c.g = rand_floats((size_t)c.count * D, 6.0);
      c.u = rand_floats((size_t)c.count * D, 6.0);
      c.rows = xcalloc((size_t)c.count + 1, sizeof(int32_t));
      for (int j = 0; j < c.count; j++) c.rows[j] = rng_int(c.R - 1); /* row R-1 never touched */
      if (c.count > 3) c.rows[3] = c.rows[2] = c.rows[1];               /* repeated rows */
      if (c.count > 2) c.w[2] = 0.0f;
      for (size_t j = 0; j < (size_t)c.count * D; j += 7) { /* past the limits, infinities */
        c.g[j] = j % 3 ? 15.0f : INFINITY;
        c.u[j] = j % 2 ? -INFINITY : 12.0f;
      }
      if (c.count > 1) for (size_t j = 0; j < D; j++) c.g[D + j] = -90.0f + (float)j; /* tiny silu */
      char label[64];
      snprintf(label, sizeof label, "count=%d D=%d R=%d", c.count, c.D, c.R);
      OPD(d, names[kind], ids[kind], -1, "f32");
      d.nf = kind == 1 ? c.R * D : (size_t)c.count * D;
      d.rows = c.count;
      d.bref = d.bcross = budgets[kind];
      d.cs = &c;
      d.label = label;
      d.call = gs_call;
      d.ref = gs_ref;
      run_case(&d);
      free(c.src), free(c.out0), free(c.y), free(c.w), free(c.g), free(c.u), free(c.rows);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* moe_experts (optional, fused): against the reference and against its composition from        */
/* primitives (engine/model.c routed_experts), which every backend runs                         */

typedef struct moe_case {
  hweight *w1, *w2, *w3; /* E each: [F, D], [D, F], [F, D] */
  float *x, *wts, *out0;
  int32_t *experts;
  int n, E, kE, D, F, act_fp8;
  float limit;
} moe_case;

static int moe_upload(rctx *r, const moe_case *c, int r0, int r1, outs *o, st_weight *w1,
                      st_weight *w2, st_weight *w3, float **x, int32_t **ex, float **wts, float **out) {
  int n = r1 - r0;
  for (int e = 0; e < c->E; e++) {
    w1[e] = r_weight(r, &c->w1[e]);
    w2[e] = r_weight(r, &c->w2[e]);
    w3[e] = r_weight(r, &c->w3[e]);
  }
  size_t D = (size_t)c->D;
  memcpy(o->f + r0 * D, c->out0 + r0 * D, sizeof(float) * n * D);
  *x = r_in(r, "x", c->x + r0 * D, sizeof(float) * n * D);
  *ex = r_in(r, "experts", c->experts + (size_t)r0 * c->kE, sizeof(int32_t) * (size_t)n * c->kE);
  *wts = r_in(r, "weights", c->wts + (size_t)r0 * c->kE, sizeof(float) * (size_t)n * c->kE);
  *out = r_io(r, "out", o->f + r0 * D, sizeof(float) * n * D);
  return r->bad;
}
static int moe_fused_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const moe_case *c = cv;
  st_weight w1[16], w2[16], w3[16];
  float *x, *wts, *out;
  int32_t *ex;
  if (moe_upload(r, c, r0, r1, o, w1, w2, w3, &x, &ex, &wts, &out)) return r->bad;
  void *work = r_scratch(r, workspace_bytes(r->b));
  if (r->bad) return r->bad;
  r->b->ops->moe_experts(r->b->ctx, out, x, ex, wts, w1, w2, w3, r1 - r0, c->E, c->kE, c->limit,
                         c->act_fp8, work);
  return 0;
}
/* engine/model.c's routed_experts + linear(): gather, [fp8 input], matmul, [bf16], swiglu, ... */
static void moe_linear(rctx *r, const moe_case *c, float *y, const float *x, float *tmp,
                       const st_weight *w, int rows) {
  const st_backend_ops *ops = r->b->ops;
  int in = (int)w->cols;
  if (c->act_fp8 && in % 128 == 0) {
    ops->copy(r->b->ctx, tmp, x, sizeof(float) * (size_t)rows * in);
    ops->quantize(r->b->ctx, tmp, rows, in, in, 128, ST_Q_FP8_E4M3FN, 1);
    x = tmp;
  }
  ops->matmul(r->b->ctx, y, x, w, rows);
  if (c->act_fp8) ops->round_bf16(r->b->ctx, y, (size_t)rows * w->rows);
}
static int moe_composed_call(rctx *r, const void *cv, int r0, int r1, outs *o) {
  const moe_case *c = cv;
  st_weight w1[16], w2[16], w3[16];
  float *x, *wts, *out;
  int32_t *ex;
  if (moe_upload(r, c, r0, r1, o, w1, w2, w3, &x, &ex, &wts, &out)) return r->bad;
  int n = r1 - r0, cnt = 0, mx = c->D > c->F ? c->D : c->F;
  int32_t *grows = xcalloc((size_t)n * c->kE + 1, sizeof(int32_t));
  float *gw = xcalloc((size_t)n * c->kE + 1, sizeof(float));
  int start[17];
  for (int e = 0; e < c->E; e++) {
    start[e] = cnt;
    for (int i = 0; i < n; i++)
      for (int k = 0; k < c->kE; k++)
        if (c->experts[(size_t)(r0 + i) * c->kE + k] == e) {
          grows[cnt] = i;
          gw[cnt++] = c->wts[(size_t)(r0 + i) * c->kE + k];
        }
  }
  start[c->E] = cnt;
  int32_t *drows = r_in(r, "group rows", grows, sizeof(int32_t) * (size_t)(cnt + 1));
  float *dw = r_in(r, "group weights", gw, sizeof(float) * (size_t)(cnt + 1));
  size_t big = sizeof(float) * (size_t)(cnt + 1) * mx;
  float *xg = r_scratch(r, big), *g = r_scratch(r, big), *u = r_scratch(r, big), *h = r_scratch(r, big);
  float *y = r_scratch(r, big), *tmp = r_scratch(r, big);
  free(grows);
  free(gw);
  if (r->bad) return r->bad;
  for (int e = 0; e < c->E; e++) {
    int c0 = start[e], rows = start[e + 1] - c0;
    if (!rows) continue;
    r->b->ops->gather_rows(r->b->ctx, xg, x, drows + c0, rows, c->D);
    moe_linear(r, c, g, xg, tmp, &w1[e], rows);
    moe_linear(r, c, u, xg, tmp, &w3[e], rows);
    r->b->ops->swiglu(r->b->ctx, h, g, u, rows, c->F, c->limit);
    moe_linear(r, c, y, h, tmp, &w2[e], rows);
    r->b->ops->scatter_add(r->b->ctx, out, y, drows + c0, dw + c0, rows, c->D);
  }
  return 0;
}
/* The reference: the composed path's arithmetic in double, with its roundings (q_ref_block for
** the FP8 inputs, bf16 outputs) applied where the composed path applies them. With act_fp8 it
** also carries a tolerance per value through the chain (tie_step_bf16, and for the FP8 round trip
** of the swiglu output the scale and the value at the ends of their uncertainty), so that a
** rounding may flip only where the reference is within fp32 error of a tie. */
static void moe_ref_linear(const moe_case *c, const hweight *w, const double *xin, const double *xtol,
                           double *y, double *ytol) {
  int in = (int)w->w.cols, out = (int)w->w.rows;
  float *xq = xcalloc((size_t)in, sizeof(float));
  double *xqt = xcalloc((size_t)in, sizeof(double));
  for (int k = 0; k < in; k++) xq[k] = (float)xin[k], xqt[k] = xtol ? xtol[k] : 0;
  if (c->act_fp8 && in % 128 == 0)
    for (int b0 = 0; b0 < in; b0 += 128) {
      int len = in - b0 < 128 ? in - b0 : 128;
      double amax = 1e-4, dam = 0;
      for (int k = b0; k < b0 + len; k++) amax = fmax(amax, fabs(xq[k])), dam = fmax(dam, xqt[k]);
      float s0 = ref_pow2_scale((float)amax, 448.0f), sl = ref_pow2_scale((float)fmax(amax - dam, 1e-4), 448.0f);
      float sh = ref_pow2_scale((float)(amax + dam), 448.0f);
      for (int k = b0; k < b0 + len; k++) {
        double q = fp8q(xq[k], s0), t = 0;
        if (xqt[k] > 0 || sl != sh) {
          float sc[3] = {s0, sl, sh};
          for (int a = 0; a < 3; a++)
            for (int sg = -1; sg <= 1; sg += 2) t = fmax(t, fabs(fp8q(xq[k] + sg * xqt[k], sc[a]) - q));
        }
        xq[k] = (float)q; /* exactly q_ref_block's value */
        xqt[k] = t;
      }
    }
  for (int o = 0; o < out; o++) {
    double sum = 0, m = 0, t = 0;
    for (int k = 0; k < in; k++) {
      double wv = ref_wval(&w->w, o, k);
      sum += (double)xq[k] * wv;
      m += fabs((double)xq[k] * wv);
      t += fabs(wv) * xqt[k];
    }
    t += 1e-5 * m; /* fp32 accumulation, generously */
    y[o] = c->act_fp8 ? st_round_bf16((float)sum) : sum;
    if (ytol) ytol[o] = c->act_fp8 ? tie_step_bf16(sum, t) : 0;
  }
  free(xq);
  free(xqt);
}
static double swiglu_d(double g, double u, double L) {
  g = fmin(g, L), u = fmin(fmax(u, -L), L);
  return g / (1 + exp(-g)) * u;
}
static void moe_ref(const void *cv, double *val, double *mag, int32_t *iref) {
  (void)iref;
  const moe_case *c = cv;
  size_t D = (size_t)c->D;
  int F = c->F;
  double *xd = xcalloc(D, sizeof(double)), *g = xcalloc((size_t)F, sizeof(double));
  double *u = xcalloc((size_t)F, sizeof(double)), *y = xcalloc(D, sizeof(double));
  double *gt = xcalloc((size_t)F, sizeof(double)), *ut = xcalloc((size_t)F, sizeof(double));
  double *h = xcalloc((size_t)F, sizeof(double)), *ht = xcalloc((size_t)F, sizeof(double));
  double *yt = xcalloc(D, sizeof(double)), *tol = xcalloc(c->n * D, sizeof(double));
  double scale = 0;
  for (size_t j = 0; j < c->n * D; j++) val[j] = c->out0[j];
  for (int e = 0; e < c->E; e++)
    for (int i = 0; i < c->n; i++)
      for (int k = 0; k < c->kE; k++) {
        if (c->experts[(size_t)i * c->kE + k] != e) continue;
        for (size_t j = 0; j < D; j++) xd[j] = c->x[i * D + j];
        moe_ref_linear(c, &c->w1[e], xd, NULL, g, gt);
        moe_ref_linear(c, &c->w3[e], xd, NULL, u, ut);
        for (int f = 0; f < F; f++) {
          h[f] = (float)swiglu_d(g[f], u[f], c->limit); /* swiglu's output is an fp32 tensor */
          double t = 1e-6 * fabs(h[f]);
          if (gt[f] > 0 || ut[f] > 0)
            for (int a = -1; a <= 1; a += 2)
              for (int b = -1; b <= 1; b += 2)
                t = fmax(t, fabs(swiglu_d(g[f] + a * gt[f], u[f] + b * ut[f], c->limit) - h[f]) + 1e-6 * fabs(h[f]));
          ht[f] = t;
        }
        moe_ref_linear(c, &c->w2[e], h, ht, y, yt);
        double wk = c->wts[(size_t)i * c->kE + k];
        for (size_t j = 0; j < D; j++) {
          val[i * D + j] += y[j] * wk;
          tol[i * D + j] += yt[j] * fabs(wk);
        }
      }
  for (size_t j = 0; j < c->n * D; j++) scale = fmax(scale, fabs(val[j]));
  double base = c->act_fp8 ? B_MOE_FP8 : B_MOE;
  for (size_t j = 0; j < c->n * D; j++) mag[j] = (base * nz(scale) + tol[j]) / base;
  free(xd), free(g), free(u), free(y), free(gt), free(ut), free(h), free(ht), free(yt), free(tol);
}
static void t_moe_experts(void) {
  /* n, E, kE, D, F, act_fp8 */
  /* the last two: several tiles an expert, widths a multiple of 32 (a device backend's
  ** tensor-core tile), and an expert with more than 128 rows */
  static const int shapes[][6] = {{5, 5, 2, 72, 36, 0}, {1, 5, 2, 72, 36, 0}, {5, 3, 2, 128, 128, 1},
                                  {6, 3, 3, 40, 24, 1}, {200, 4, 2, 128, 96, 0},
                                  {200, 4, 2, 128, 128, 1}};
  int any_fused = 0;
  for (int b = 0; b < NBACKENDS; b++) any_fused |= backends[b].open && backends[b].b.ops->moe_experts;
  for (int s = 0; s < NWSPECS; s++)
    for (int k = 0; k < 6; k++) {
      const int *sh = shapes[k];
      moe_case c = {.n = sh[0], .E = sh[1], .kE = sh[2], .D = sh[3], .F = sh[4], .act_fp8 = sh[5],
                    .limit = 10.0f};
      rng_seed(16000 + 10 * s + k);
      c.w1 = xcalloc((size_t)c.E, sizeof(hweight));
      c.w2 = xcalloc((size_t)c.E, sizeof(hweight));
      c.w3 = xcalloc((size_t)c.E, sizeof(hweight));
      for (int e = 0; e < c.E; e++) {
        hweight_make(&c.w1[e], &WSPECS[s], c.F, c.D, 0.3, e == 1 ? 0 : -1);
        hweight_make(&c.w2[e], &WSPECS[s], c.D, c.F, 0.3, -1);
        hweight_make(&c.w3[e], &WSPECS[s], c.F, c.D, 0.3, -1);
      }
      c.x = rand_floats((size_t)c.n * c.D, 1.0);
      c.out0 = rand_floats((size_t)c.n * c.D, 0.5);
      c.wts = rand_floats((size_t)c.n * c.kE, 0.5);
      c.experts = xcalloc((size_t)c.n * c.kE, sizeof(int32_t));
      for (int i = 0; i < c.n; i++) /* distinct experts per token, expert E-1 never chosen */
        for (int j = 0; j < c.kE; j++) c.experts[(size_t)i * c.kE + j] = (i + j * (j + 1)) % (c.E - 1);
      if (c.n > 1) memset(c.x + c.D, 0, sizeof(float) * c.D);
      char label[80], dn[40];
      snprintf(label, sizeof label, "n=%d E=%d kE=%d D=%d F=%d act_fp8=%d", c.n, c.E, c.kE, c.D, c.F, c.act_fp8);
      double budget = c.act_fp8 ? B_MOE_FP8 : B_MOE;
      snprintf(dn, sizeof dn, "%s%s composed", WSPECS[s].name, c.act_fp8 ? " act_fp8" : "");
      OPD(dc, "moe_experts", ST_OP_MATMUL, WSPECS[s].dtype, dn);
      dc.nf = (size_t)c.n * c.D;
      dc.rows = c.n;
      dc.bref = dc.bcross = budget;
      dc.cs = &c;
      dc.label = label;
      dc.call = moe_composed_call;
      dc.ref = moe_ref;
      run_case(&dc);
      /* fused, where a backend has it: vs the reference and vs cpu-ref's composition */
      snprintf(dn, sizeof dn, "%s%s fused", WSPECS[s].name, c.act_fp8 ? " act_fp8" : "");
      OPD(d, "moe_experts", ST_OP_MOE_EXPERTS, WSPECS[s].dtype, dn);
      d.nf = dc.nf;
      d.rows = c.n;
      d.bref = d.bcross = budget;
      d.cs = &c;
      d.label = label;
      d.call = moe_fused_call;
      d.ref = moe_ref;
      double *val = xcalloc(d.nf, sizeof(double)), *mag = xcalloc(d.nf, sizeof(double));
      if (any_fused) moe_ref(&c, val, mag, NULL);
      outs base;
      char bwhy[256] = "";
      outs_alloc(&base, &dc);
      int ci = case_next(); /* the composition on cpu-ref again (it may crash too: slot 0) */
      int have_base = any_fused && backends[0].open && !case_skip(ci, 0) &&
                      (case_mark(ci, 0), !run_once(&dc, &backends[0].b, 0, c.n, &base, bwhy));
      int ci2 = case_next();
      for (int b = 0; b < NBACKENDS; b++) {
        backend_slot *bs = &backends[b];
        if (!bs->open || case_skip(ci2, b)) continue;
        case_mark(ci2, b);
        if (!bs->b.ops->moe_experts || (bs->b.ops->supports && !bs->b.ops->supports(bs->b.ctx, ST_OP_MOE_EXPERTS, d.dtype))) {
          res_skip("moe_experts", dn, bs->name, "optional entry is NULL or declined (the engine composes)");
          continue;
        }
        result *res = res_get("moe_experts", dn, bs->name, budget);
        char why[256] = "";
        outs o;
        outs_alloc(&o, &d);
        double err = 0;
        if (!run_once(&d, &bs->b, 0, c.n, &o, why)) {
          err = generic_check(&d, val, mag, NULL, &o, 1, why);
          if (have_base && !why[0]) {
            double *bv = xcalloc(d.nf, sizeof(double));
            for (size_t j = 0; j < d.nf; j++) bv[j] = base.f[j];
            err = fmax(err, generic_check(&d, bv, mag, NULL, &o, 0, why));
            free(bv);
          }
          if (err > budget && !why[0]) snprintf(why, 200, "err %.3g > budget %.3g", err, budget);
          if (!why[0]) determinism(&d, &bs->b, &o, why);
          if (!why[0]) { /* the fused entry gives its own backend's composition, bit for bit */
            outs own;
            outs_alloc(&own, &dc);
            if (!run_once(&dc, &bs->b, 0, c.n, &own, why)) {
              for (size_t j = 0; j < d.nf && !why[0]; j++)
                if (memcmp(&own.f[j], &o.f[j], sizeof(float)))
                  snprintf(why, 200, "fused differs from this backend's composition at %zu: %.9g vs %.9g",
                           j, o.f[j], own.f[j]);
            }
            outs_free(&own);
          }
        }
        res_case(res, err, label, why);
        outs_free(&o);
      }
      outs_free(&base);
      free(val), free(mag);
      for (int e = 0; e < c.E; e++) hweight_free(&c.w1[e]), hweight_free(&c.w2[e]), hweight_free(&c.w3[e]);
      free(c.w1), free(c.w2), free(c.w3), free(c.x), free(c.out0), free(c.wts), free(c.experts);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* main                                                                                         */

static void open_backends(int print) {
  for (int s = 0; s < NBACKENDS; s++) {
    st_status rc = st_backend_open(backends[s].name, &backends[s].b);
    if (rc) {
      snprintf(backends[s].why, sizeof backends[s].why, "not available: %s", st_errmsg());
      if (print) printf("backend %-14s SKIPPED (%s)\n", backends[s].name, st_errmsg());
      continue;
    }
    backends[s].open = 1;
    const char *desc = backends[s].b.ops->describe ? backends[s].b.ops->describe(backends[s].b.ctx) : NULL;
    if (print)
      printf("backend %-14s opened (%s%s%s)\n", backends[s].name, backends[s].b.ops->kernel_mode,
             desc ? ", " : "", desc ? desc : "");
  }
}
static void close_backends(void) {
  for (int s = 0; s < NBACKENDS; s++) st_backend_close(&backends[s].b);
}

typedef struct group {
  const char *name;
  void (*run)(void);
} group;
static void g_matmul(void) { t_matmul(0); }
static void g_matmul_grouped(void) { t_matmul(1); }
static const group GROUPS[] = {
  {"matmul", g_matmul}, {"matmul_grouped", g_matmul_grouped}, {"embed", t_embed},
  {"rmsnorm", t_rmsnorm}, {"rope", t_rope}, {"hadamard", t_hadamard},
  {"round_bf16/add/scale/fill", t_elementwise}, {"quantize", t_quantize}, {"hc_*", t_hc},
  {"compress", t_compress}, {"indexer_scores", t_indexer_scores}, {"topk", t_topk},
  {"indexer_topk", t_indexer_topk}, {"candidates", t_candidates},
  {"sparse_attention", t_sparse_attention}, {"moe_route", t_moe_route},
  {"gather_rows/scatter_add/swiglu", t_gather_scatter_swiglu}, {"moe_experts", t_moe_experts},
};

int main(void) {
  verbose = getenv("ST_OPS_VERBOSE") && atoi(getenv("ST_OPS_VERBOSE"));
  int nofork = getenv("ST_OPS_NOFORK") && atoi(getenv("ST_OPS_NOFORK"));
  SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (SH == MAP_FAILED) {
    perror("test_backend_ops: mmap");
    return 1;
  }
  memset(SH, 0, sizeof *SH);
#ifdef _OPENMP
  default_threads = omp_get_max_threads(); /* no parallel region in this process before a fork */
#endif
  /* Which backends open: probed in a child too, so that a device runtime is never initialised
  ** before a fork (a CUDA context does not survive one). */
  fflush(stdout);
  pid_t probe = nofork ? 0 : fork();
  if (probe == 0) {
    open_backends(1);
    for (int s = 0; s < NBACKENDS; s++) SH->open[s] = backends[s].open;
    close_backends();
    fflush(stdout);
    if (!nofork) _exit(0);
  } else {
    int st;
    waitpid(probe, &st, 0);
  }
  if (!SH->open[0]) {
    printf("cpu-ref is not available: nothing can be checked\n");
    return 77;
  }

  for (size_t g = 0; g < sizeof GROUPS / sizeof GROUPS[0]; g++) {
    SH->resume_case = -1;
    SH->resume_slot = NBACKENDS;
    for (int attempt = 0; attempt < 64; attempt++) {
      SH->current[0] = 0;
      SH->cur_case = -1;
      fflush(stdout);
      pid_t pid = nofork ? 0 : fork();
      if (pid == 0) {
        if (nofork) {
          memset(backends, 0, sizeof backends);
          backends[0].name = "cpu-ref", backends[1].name = "cpu", backends[2].name = "cuda", backends[3].name = "hip";
          backends[4].name = ST_BACKEND_DEVEMU;
        }
        case_counter = 0;
        open_backends(0);
        GROUPS[g].run();
        close_backends();
        fflush(stdout);
        if (!nofork) _exit(0);
        break;
      }
      int st = 0;
      struct rusage ru;
      memset(&ru, 0, sizeof ru);
      wait4(pid, &st, 0, &ru);
      if (getenv("ST_OPS_TIMING"))
        printf("group %-30s %6.2f s cpu\n", GROUPS[g].name,
               ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec));
      if (WIFEXITED(st) && !WEXITSTATUS(st)) break;
      char op[64] = "?", dt[64] = "?", be[32] = "?", label[128] = "";
      sscanf(SH->current, "%63[^|]|%63[^|]|%31[^|]|%127[^\n]", op, dt, be, label);
      char why[256];
      if (WIFSIGNALED(st)) snprintf(why, sizeof why, "CRASHED (signal %d)", WTERMSIG(st));
      else snprintf(why, sizeof why, "exited with status %d", WEXITSTATUS(st));
      printf("group %s: %s %s on %s, case '%s': %s\n", GROUPS[g].name, op, dt, be, label, why);
      fflush(stdout);
      res_case(res_get(op, dt, be, 0), INFINITY, label, why);
      if (SH->cur_case < 0) break; /* not inside a case: nothing to resume from */
      SH->resume_case = SH->cur_case;
      SH->resume_slot = SH->cur_slot;
    }
  }

  /* every op of the table appears at least once */
  for (int op = 0; op < ST_OP_COUNT; op++) {
    int seen = 0;
    for (int k = 0; k < nresults; k++) seen |= !strcmp(results[k].op, st_op_name((st_op)op));
    if (!seen) {
      printf("op %s has no test\n", st_op_name((st_op)op));
      total_fails++;
    }
  }

  printf("\n%-17s %-34s %-14s %6s %10s %7s  %s\n", "op", "dtype", "backend", "cases", "max err",
         "budget", "result");
  int cross_ran = 0;
  for (int k = 0; k < nresults; k++) {
    result *r = &results[k];
    int open = 0;
    for (int b = 0; b < NBACKENDS; b++) open |= SH->open[b] && !strcmp(backends[b].name, r->backend);
    if (!open) continue; /* a backend that did not open is reported once, above */
    const char *verdict = r->fails ? "FAIL" : r->cases ? "PASS" : "SKIP";
    if (strcmp(r->backend, "cpu-ref") && r->cases) cross_ran = 1;
    char err[24], bud[24];
    if (r->cases) snprintf(err, sizeof err, "%.3g", r->maxerr);
    else snprintf(err, sizeof err, "-");
    if (r->budget > 0) snprintf(bud, sizeof bud, "%.0e", r->budget);
    else snprintf(bud, sizeof bud, r->cases ? "exact" : "-");
    printf("%-17s %-34s %-14s %6d %10s %7s  %s", r->op, r->dtype, r->backend, r->cases, err, bud, verdict);
    if (r->fails || (!r->cases && r->first[0])) printf("  (%s)", r->first);
    printf("\n");
  }
  printf("\nsummary: %d checks, %d failed; backends:", total_runs, total_fails);
  for (int b = 0; b < NBACKENDS; b++) printf(" %s %s", backends[b].name, SH->open[b] ? "ran" : "skipped");
  if (!cross_ran) printf("; cross-backend part SKIPPED (no backend other than cpu-ref is available)");
  printf("\n");
  if (!total_runs) return 77;
  return total_fails ? 1 : 0;
}
