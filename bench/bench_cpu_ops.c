/*
** bench_cpu_ops.c — the cpu backend's kernels timed and checked (bench/cpu-ops-results.md).
**
**   bench_cpu_ops [--quick]
**
** Measures the machine's fp32 FMA peak (independent FMA chains in registers, every thread), then
** for the cpu backend: matmul GFLOP/s per weight format, indexer_topk at 4k and 16k tokens
** (DeepSeek-V4-Flash indexer shapes: 64 heads x 128, top-512, rows = tokens / 4, causal) and
** sparse_attention; and checks on the way: agreement with a naive double-precision reference,
** bit-identity for 1 vs 2 threads and for a split of the token rows, bit-identity of the
** avx512, avx2 and portable paths (ST_CPU_ISA), indexer_topk == topk(indexer_scores).
** Exit status 1 when a check fails.
*/
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/lowp.h"
#include "kernels/weight.h"

static int failures;
#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      failures++;                                                                                  \
      printf("  FAIL: " __VA_ARGS__);                                                              \
      printf("\n");                                                                                \
    }                                                                                              \
  } while (0)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* CPU seconds of the whole process (every thread): robust when other work shares the cores */
static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
static double core_peak; /* fp32 FMA GFLOP per CPU-second of one core */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}
static float frand(void) { return (float)((rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }
static void fill_rand(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = frand();
}

/* ---------------------------------------------------------------- FMA peak */

#define PEAK_ITERS 20000000L
/* 12 independent accumulators, named so they stay in registers: more than the FMA latency x
** ports (4 x 2) in flight */
#define PEAK_BODY(FMA)                                                                             \
  a0 = FMA(a0, m, c), a1 = FMA(a1, m, c), a2 = FMA(a2, m, c), a3 = FMA(a3, m, c);                  \
  a4 = FMA(a4, m, c), a5 = FMA(a5, m, c), a6 = FMA(a6, m, c), a7 = FMA(a7, m, c);                  \
  a8 = FMA(a8, m, c), a9 = FMA(a9, m, c), a10 = FMA(a10, m, c), a11 = FMA(a11, m, c);
__attribute__((target("avx512f,fma"))) static double peak_avx512(long iters) {
  __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2), a3 = _mm512_set1_ps(3),
         a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5), a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7),
         a8 = _mm512_set1_ps(8), a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
  for (long it = 0; it < iters; it++) { PEAK_BODY(_mm512_fmadd_ps) }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  return _mm512_reduce_add_ps(s);
}
__attribute__((target("avx2,fma"))) static double peak_avx2(long iters) {
  __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2), a3 = _mm256_set1_ps(3),
         a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5), a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7),
         a8 = _mm256_set1_ps(8), a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
  for (long it = 0; it < iters; it++) { PEAK_BODY(_mm256_fmadd_ps) }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

/* GFLOP/s of every thread running the loop at once */
static double measure_peak(int avx512, int threads, long iters) {
  volatile double sink = 0;
  double t0 = now(), c0 = cpu_now();
#pragma omp parallel num_threads(threads)
  {
    double s = avx512 ? peak_avx512(iters) : peak_avx2(iters);
#pragma omp atomic
    sink += s;
  }
  double dt = now() - t0, cdt = cpu_now() - c0;
  double flops = (double)iters * threads * 12 * (avx512 ? 16 : 8) * 2;
  if (threads == 1 && avx512 == __builtin_cpu_supports("avx512f")) core_peak = flops / cdt / 1e9;
  return flops / dt / 1e9;
}

/* ---------------------------------------------------------------- backends */

static const char *isa_names[3] = {"avx512", "avx2", "portable"};

static st_backend open_cpu(const char *isa) {
  st_backend b;
  if (isa) setenv("ST_CPU_ISA", isa, 1);
  else unsetenv("ST_CPU_ISA");
  if (st_backend_open("cpu", &b) != ST_OK) {
    fprintf(stderr, "cannot open cpu: %s\n", st_errmsg());
    exit(2);
  }
  return b;
}

/* ---------------------------------------------------------------- weights */

typedef struct wbuf { st_weight w; void *data, *scales; } wbuf;

static wbuf make_weight(st_wtype t, st_wscale sd, int b0, int b1, int rows, int cols) {
  wbuf b = {{t, sd, {b0, b1}, rows, cols, NULL, NULL}, NULL, NULL};
  size_t nb = st_weight_data_bytes(&b.w);
  b.data = malloc(nb + 64);
  unsigned char *p = b.data;
  for (size_t i = 0; i < (size_t)rows * cols; i++) {
    float f = frand();
    switch (t) {
    case ST_W_F32: memcpy(p + 4 * i, &f, 4); break;
    case ST_W_BF16: { uint16_t v = st_f32_to_bf16(f); memcpy(p + 2 * i, &v, 2); break; }
    case ST_W_F16: { uint16_t v = st_f32_to_f16(f); memcpy(p + 2 * i, &v, 2); break; }
    case ST_W_FP8_E4M3: { uint8_t v = (uint8_t)rnd(); if ((v & 0x7f) == 0x7f) v ^= 1; p[i] = v; break; }
    case ST_W_FP4_E2M1: if (i % 2 == 0) p[i / 2] = (uint8_t)rnd(); break;
    default: break;
    }
  }
  size_t ns = st_weight_scale_bytes(&b.w);
  if (ns) {
    b.scales = malloc(ns + 64);
    unsigned char *s = b.scales;
    size_t count = ns / (sd == ST_WSCALE_F32 ? 4 : sd == ST_WSCALE_BF16 ? 2 : 1);
    for (size_t i = 0; i < count; i++) {
      float f = 0.01f + (frand() + 1.0f);
      if (sd == ST_WSCALE_F32) memcpy(s + 4 * i, &f, 4);
      else if (sd == ST_WSCALE_BF16) { uint16_t v = st_f32_to_bf16(f); memcpy(s + 2 * i, &v, 2); }
      else s[i] = (uint8_t)(120 + rnd() % 10);
    }
  }
  b.w.data = b.data;
  b.w.scales = b.scales;
  return b;
}

static const char *weight_label(const st_weight *w) {
  static char buf[64];
  const char *sd = w->scale_dtype == ST_WSCALE_F32 ? "f32" : w->scale_dtype == ST_WSCALE_BF16 ? "bf16" : "ue8m0";
  if (w->scale_dtype == ST_WSCALE_NONE) snprintf(buf, sizeof buf, "%s", st_wtype_name(w->dtype));
  else snprintf(buf, sizeof buf, "%s/%s %dx%d", st_wtype_name(w->dtype), sd, w->block[0], w->block[1]);
  return buf;
}

/* max |y - ref| / (sum_k |x| |w|) against the double-precision product */
static double matmul_error(const float *y, const float *x, const st_weight *w, int n) {
  int O = (int)w->rows, K = (int)w->cols;
  float *row = malloc(sizeof(float) * K);
  double worst = 0;
  for (int o = 0; o < O; o++) {
    st_weight_decode(w, o, 0, K, row);
    for (int i = 0; i < n; i++) {
      double s = 0, mag = 1e-30;
      for (int k = 0; k < K; k++) s += (double)x[(size_t)i * K + k] * row[k], mag += fabs((double)x[(size_t)i * K + k] * row[k]);
      double e = fabs(y[(size_t)i * O + o] - s) / mag;
      if (e > worst) worst = e;
    }
  }
  free(row);
  return worst;
}

static void check_decode(void) {
  /* every fp8 and fp4 code and every f16 / bf16 pattern through the matmul's panel decoding:
  ** W [codes, 32] holds code r in column c of row r (other columns zero), x = e_c, so y[r] is
  ** the decoded element, bit for bit. c = 17 puts it off the vector boundaries. */
  for (int a = 0; a < 3; a++) {
    st_backend b = open_cpu(isa_names[a]);
    for (int t = ST_W_BF16; t <= ST_W_FP4_E2M1; t++) {
      int rows = t == ST_W_F16 || t == ST_W_BF16 ? 65536 : t == ST_W_FP8_E4M3 ? 256 : 16, cols = 32, c = 17;
      st_wscale sd = t == ST_W_FP8_E4M3 || t == ST_W_FP4_E2M1 ? ST_WSCALE_UE8M0 : ST_WSCALE_NONE;
      wbuf wb = make_weight((st_wtype)t, sd, t == ST_W_FP4_E2M1 ? 1 : 128, t == ST_W_FP4_E2M1 ? 32 : 128, rows, cols);
      unsigned char *p = wb.data;
      memset(p, 0, st_weight_data_bytes(&wb.w));
      for (int r = 0; r < rows; r++) {
        if (t == ST_W_F16 || t == ST_W_BF16) { uint16_t v = (uint16_t)r; memcpy(p + 2 * ((size_t)r * cols + c), &v, 2); }
        else if (t == ST_W_FP8_E4M3) p[(size_t)r * cols + c] = (uint8_t)r;
        else p[(size_t)r * cols / 2 + c / 2] = (uint8_t)(r << 4);
      }
      float x[32] = {0}, *y = malloc(sizeof(float) * rows), ref;
      x[c] = 1.0f;
      b.ops->matmul(b.ctx, y, x, &wb.w, 1);
      int bad = 0, nan_payload = 0;
      for (int r = 0; r < rows; r++) {
        float two[2];
        st_weight_decode(&wb.w, r, c - 1, 2, two);
        ref = two[1];
        uint32_t u1, u2;
        memcpy(&u1, &y[r], 4), memcpy(&u2, &ref, 4);
        if (u1 != u2 && y[r] != ref && !(y[r] != y[r] && ref != ref)) bad++; /* -0 reads as +0 */
        else if (u1 != u2) nan_payload++;
      }
      CHECK(!bad, "%s decode of %s: %d codes differ from st_weight_decode", isa_names[a], st_wtype_name((st_wtype)t), bad);
      if (nan_payload) printf("  note: %s %s: %d NaN or -0 codes read back as another NaN payload or +0 (through the fma, not the decoder)\n", isa_names[a], st_wtype_name((st_wtype)t), nan_payload);
      free(y), free(wb.data), free(wb.scales);
    }
    st_backend_close(&b);
  }
}

static void bench_matmul(st_backend *best, int quick, int checks_only) {
  struct { st_wtype t; st_wscale s; int b0, b1; } kinds[] = {
    {ST_W_F32, ST_WSCALE_NONE, 1, 1},          {ST_W_BF16, ST_WSCALE_NONE, 1, 1},
    {ST_W_F16, ST_WSCALE_NONE, 1, 1},          {ST_W_FP8_E4M3, ST_WSCALE_UE8M0, 128, 128},
    {ST_W_FP8_E4M3, ST_WSCALE_F32, 128, 128},  {ST_W_FP8_E4M3, ST_WSCALE_BF16, 64, 64},
    {ST_W_FP4_E2M1, ST_WSCALE_UE8M0, 1, 32},
  };
  int nk = sizeof kinds / sizeof kinds[0];
  st_backend isa[3];
  for (int a = 0; a < 3; a++) isa[a] = open_cpu(isa_names[a]);
  printf("\n## matmul\n\n");
  printf("checks on [n=77, out=300, in=520] (odd tails, partial scale blocks): error vs double, "
         "1 vs 2 threads, rows split 0..31 + 31..77, avx512 == avx2 == portable\n\n");
  for (int q = 0; q < nk; q++) {
    int n = 77, O = 300, K = 520;
    wbuf wb = make_weight(kinds[q].t, kinds[q].s, kinds[q].b0, kinds[q].b1, O, K);
    float *x = malloc(sizeof(float) * n * K), *y = malloc(sizeof(float) * n * O),
          *y2 = malloc(sizeof(float) * n * O);
    fill_rand(x, (size_t)n * K);
    best->ops->matmul(best->ctx, y, x, &wb.w, n);
    double err = matmul_error(y, x, &wb.w, n);
    CHECK(err < 1e-6, "matmul %s: error %.3g", weight_label(&wb.w), err);
    omp_set_num_threads(1);
    best->ops->matmul(best->ctx, y2, x, &wb.w, n);
    omp_set_num_threads(2);
    CHECK(!memcmp(y, y2, sizeof(float) * n * O), "matmul %s: 1 thread != 2 threads", weight_label(&wb.w));
    best->ops->matmul(best->ctx, y2, x, &wb.w, 31);
    best->ops->matmul(best->ctx, y2 + 31 * O, x + 31 * K, &wb.w, n - 31);
    CHECK(!memcmp(y, y2, sizeof(float) * n * O), "matmul %s: split rows differ", weight_label(&wb.w));
    for (int a = 0; a < 3; a++) {
      memset(y2, 0, sizeof(float) * n * O);
      isa[a].ops->matmul(isa[a].ctx, y2, x, &wb.w, n);
      CHECK(!memcmp(y, y2, sizeof(float) * n * O), "matmul %s: %s differs", weight_label(&wb.w),
            isa[a].ops->describe(isa[a].ctx));
    }
    /* grouped: 4 groups of [75, 130] */
    {
      st_weight g = wb.w;
      g.cols = 130;
      g.rows = 300;
      /* a grouped matmul equals per-group matmuls on the column slices */
      if (g.dtype != ST_W_FP8_E4M3 && g.dtype != ST_W_FP4_E2M1) {
        float *xg = malloc(sizeof(float) * n * 4 * 130), *yg = malloc(sizeof(float) * n * 300);
        fill_rand(xg, (size_t)n * 520);
        best->ops->matmul_grouped(best->ctx, yg, xg, &g, n, 4);
        float *xs = malloc(sizeof(float) * n * 130), *ys = malloc(sizeof(float) * n * 75);
        int same = 1;
        for (int gi = 0; gi < 4; gi++) {
          st_weight sub = g;
          sub.rows = 75;
          sub.data = (const char *)g.data + (size_t)gi * 75 * 130 * (g.dtype == ST_W_F32 ? 4 : 2);
          for (int i = 0; i < n; i++) memcpy(xs + i * 130, xg + (size_t)i * 520 + gi * 130, 130 * 4);
          best->ops->matmul(best->ctx, ys, xs, &sub, n);
          for (int i = 0; i < n; i++) same &= !memcmp(ys + i * 75, yg + (size_t)i * 300 + gi * 75, 75 * 4);
        }
        CHECK(same, "matmul_grouped %s differs from per-group matmul", st_wtype_name(g.dtype));
        free(xg), free(yg), free(xs), free(ys);
      }
    }
    free(x), free(y), free(y2), free(wb.data), free(wb.scales);
  }
  if (checks_only) {
    for (int a = 0; a < 3; a++) st_backend_close(&isa[a]);
    return;
  }
  int shapes[2][3] = {{512, 4096, 4096}, {1, 4096, 4096}};
  printf("| weight | GFLOP/s n=%d [%dx%d] | GFLOP per core-second | GFLOP/s avx2 | GFLOP/s n=1 (decode) | GB/s of weight n=1 |\n|---|---:|---:|---:|---:|---:|\n",
         quick ? 128 : shapes[0][0], shapes[0][1], shapes[0][2]);
  for (int q = 0; q < nk; q++) {
    int O = shapes[0][1], K = shapes[0][2];
    wbuf wb = make_weight(kinds[q].t, kinds[q].s, kinds[q].b0, kinds[q].b1, O, K);
    double gf[3], core_gf = 0;
    for (int s = 0; s < 3; s++) {
      int n = s == 2 ? 1 : quick ? 128 : shapes[0][0];
      st_backend *b = s == 1 ? &isa[1] : best;
      float *x = malloc(sizeof(float) * n * K), *y = malloc(sizeof(float) * n * O);
      fill_rand(x, (size_t)n * K);
      b->ops->matmul(b->ctx, y, x, &wb.w, n); /* warm */
      int reps = n == 1 ? 20 : 2;
      double t0 = now(), c0 = cpu_now();
      for (int r = 0; r < reps; r++) b->ops->matmul(b->ctx, y, x, &wb.w, n);
      double dt = (now() - t0) / reps;
      gf[s] = 2.0 * n * O * K / dt / 1e9;
      if (s == 0) core_gf = 2.0 * n * O * K / ((cpu_now() - c0) / reps) / 1e9;
      if (s == 2) gf[2] = dt; /* seconds */
      free(x), free(y);
    }
    double bytes = (double)st_weight_data_bytes(&wb.w) + st_weight_scale_bytes(&wb.w);
    printf("| %s | %.1f | %.1f (%.0f%% of core peak) | %.1f | %.2f | %.1f |\n", weight_label(&wb.w), gf[0], core_gf,
           100 * core_gf / core_peak, gf[1],
           2.0 * O * K / gf[2] / 1e9, bytes / gf[2] / 1e9);
    free(wb.data), free(wb.scales);
  }
  for (int a = 0; a < 3; a++) st_backend_close(&isa[a]);
}

/* matmul [4096x4096] by token count: decode steps and MoE experts (~3 tokens each) run at small n,
** where decoding the weight into panels, not the FMAs, sets the pace. Both ISA paths. */
static void bench_matmul_small(st_backend *best) {
  struct { st_wtype t; st_wscale s; int b0, b1; } kinds[] = {
    {ST_W_BF16, ST_WSCALE_NONE, 1, 1}, {ST_W_FP8_E4M3, ST_WSCALE_UE8M0, 128, 128},
    {ST_W_FP4_E2M1, ST_WSCALE_UE8M0, 1, 32},
  };
  int ns[] = {1, 3, 8, 64, 512}, O = 4096, K = 4096;
  st_backend avx2 = open_cpu("avx2");
  printf("\n## matmul by token count [4096x4096]\n\n");
  printf("GFLOP/s wall clock (GFLOP per core-second in brackets), 2 threads\n\n");
  printf("| weight | path | n=1 | n=3 | n=8 | n=64 | n=512 |\n|---|---|---:|---:|---:|---:|---:|\n");
  for (int q = 0; q < 3; q++) {
    wbuf wb = make_weight(kinds[q].t, kinds[q].s, kinds[q].b0, kinds[q].b1, O, K);
    for (int p = 0; p < 2; p++) {
      st_backend *b = p ? &avx2 : best;
      printf("| %s | %s |", weight_label(&wb.w), p ? "avx2" : "best");
      for (int a = 0; a < 5; a++) {
        int n = ns[a];
        float *x = malloc(sizeof(float) * n * K), *y = malloc(sizeof(float) * n * O);
        fill_rand(x, (size_t)n * K);
        b->ops->matmul(b->ctx, y, x, &wb.w, n); /* warm */
        int reps = n <= 8 ? 10 : n <= 64 ? 4 : 1;
        double t0 = now(), c0 = cpu_now();
        for (int r = 0; r < reps; r++) b->ops->matmul(b->ctx, y, x, &wb.w, n);
        double dt = (now() - t0) / reps, ct = (cpu_now() - c0) / reps, f = 2.0 * n * O * K / 1e9;
        printf(" %.2f (%.2f) |", f / dt, f / ct);
        free(x), free(y);
      }
      printf("\n");
    }
    free(wb.data), free(wb.scales);
  }
  st_backend_close(&avx2);
}

/* ---------------------------------------------------------------- indexer */

static double ref_score(const float *q, const float *w, const float *k, int i, int j, int heads, int dim) {
  double s = 0;
  for (int h = 0; h < heads; h++) {
    double d = 0;
    for (int c = 0; c < dim; c++) d += (double)q[((size_t)i * heads + h) * dim + c] * k[(size_t)j * dim + c];
    s += w[(size_t)i * heads + h] * (d > 0 ? d : 0);
  }
  return s;
}

/* reference top-k: full sort by (score desc, NaN lowest, index asc) */
static const float *sort_scores;
static int cmp_ref(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  float sx = sort_scores[x], sy = sort_scores[y];
  if (sx != sx) sx = -INFINITY;
  if (sy != sy) sy = -INFINITY;
  if (sx != sy) return sx > sy ? -1 : 1;
  return (x > y) - (x < y);
}
static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }
static void ref_topk(int32_t *out, const float *scores, int vis, int k, int width) {
  int *order = malloc(sizeof(int) * (vis > 0 ? vis : 1));
  for (int j = 0; j < vis; j++) order[j] = j;
  sort_scores = scores;
  qsort(order, (size_t)vis, sizeof(int), cmp_ref);
  int take = k < vis ? k : vis;
  if (take > width) take = width;
  qsort(order, (size_t)take, sizeof(int), cmp_int);
  for (int c = 0; c < width; c++) out[c] = c < take ? order[c] : -1;
  free(order);
}

static void check_topk(st_backend *b) {
  /* adversarial rows: ties, NaN, -inf, all equal */
  int n = 40, rows = 300, k = 37, width = 37;
  float *s = malloc(sizeof(float) * n * rows);
  int *vis = malloc(sizeof(int) * n);
  for (int i = 0; i < n; i++) {
    vis[i] = i * 8;
    for (int j = 0; j < rows; j++) {
      float v = (float)(rnd() % 7);
      if (i % 4 == 1 && rnd() % 5 == 0) v = NAN;
      if (i % 4 == 2 && rnd() % 3 == 0) v = -INFINITY;
      if (i % 4 == 3) v = 1.0f;
      s[(size_t)i * rows + j] = v;
    }
  }
  st_backend_limits lim = {.max_tokens = n, .max_rows = rows, .max_topk = k, .max_dim = 128};
  void *work = malloc(b->ops->workspace_size(b->ctx, &lim));
  int32_t *idx = malloc(sizeof(int32_t) * n * width), *ref = malloc(sizeof(int32_t) * width);
  b->ops->topk(b->ctx, idx, s, n, rows, vis, k, width, work);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    ref_topk(ref, s + (size_t)i * rows, vis[i] < rows ? vis[i] : rows, k, width);
    bad += memcmp(ref, idx + (size_t)i * width, sizeof(int32_t) * width) != 0;
  }
  CHECK(!bad, "topk on ties/NaN/-inf: %d of %d rows differ from a full sort", bad, n);
  printf("topk on ties, NaN, -inf, constant rows: %s\n", bad ? "FAIL" : "equal to a full sort");
  free(s), free(vis), free(work), free(idx), free(ref);
}

static void check_indexer_small(st_backend *best, int heads) {
  /* odd shapes, heads across chunks (80 > 64) or a partial chunk (20), every path */
  int n = 91, rows = 83, dim = 36, topk = 19, width = 19;
  float *q = malloc(sizeof(float) * n * heads * dim), *w = malloc(sizeof(float) * n * heads),
        *k = malloc(sizeof(float) * rows * dim), *sc = malloc(sizeof(float) * n * rows),
        *sc2 = malloc(sizeof(float) * n * rows);
  int *vis = malloc(sizeof(int) * n);
  fill_rand(q, (size_t)n * heads * dim), fill_rand(w, (size_t)n * heads), fill_rand(k, (size_t)rows * dim);
  for (int i = 0; i < n; i++) vis[i] = i % 5 == 0 ? rows + 5 : i;
  st_backend_limits lim = {.max_tokens = n, .max_rows = rows, .max_topk = topk, .max_dim = dim};
  void *work = malloc(best->ops->workspace_size(best->ctx, &lim));
  int32_t *a = malloc(sizeof(int32_t) * n * width), *b2 = malloc(sizeof(int32_t) * n * width);
  best->ops->indexer_scores(best->ctx, sc, q, w, k, n, rows, heads, dim, vis);
  double worst = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < rows; j++) {
      float got = sc[(size_t)i * rows + j];
      if (j >= vis[i]) { CHECK(got == -INFINITY, "indexer_scores: masked (%d,%d) not -inf", i, j); continue; }
      double mag = 0;
      for (int h = 0; h < heads; h++) mag += fabs(w[i * heads + h]) * dim;
      double e = fabs(got - ref_score(q, w, k, i, j, heads, dim)) / mag;
      worst = e > worst ? e : worst;
    }
  CHECK(worst < 1e-6, "indexer_scores error %.3g", worst);
  best->ops->indexer_topk(best->ctx, a, q, w, k, n, rows, heads, dim, vis, topk, width, work);
  best->ops->topk(best->ctx, b2, sc, n, rows, vis, topk, width, work);
  CHECK(!memcmp(a, b2, sizeof(int32_t) * n * width), "indexer_topk != topk(indexer_scores) (odd shapes)");
  for (int t = 0; t < 3; t++) {
    st_backend o = open_cpu(isa_names[t]);
    o.ops->indexer_scores(o.ctx, sc2, q, w, k, n, rows, heads, dim, vis);
    CHECK(!memcmp(sc, sc2, sizeof(float) * n * rows), "indexer_scores: %s differs", o.ops->describe(o.ctx));
    int32_t *c = malloc(sizeof(int32_t) * n * width);
    o.ops->indexer_topk(o.ctx, c, q, w, k, n, rows, heads, dim, vis, topk, width, work);
    CHECK(!memcmp(a, c, sizeof(int32_t) * n * width), "indexer_topk: %s differs", o.ops->describe(o.ctx));
    free(c);
    st_backend_close(&o);
  }
  printf("indexer odd shapes [n=91, rows=83, heads=%d, dim=36]: error vs double %.2g; fused == composed; "
         "avx512 == avx2 == portable\n", heads, worst);
  free(q), free(w), free(k), free(sc), free(sc2), free(vis), free(work), free(a), free(b2);
}

static void bench_indexer(st_backend *best, st_backend *avx2, double peak, int tokens, int heads, int topk,
                          int time_avx2) {
  int n = tokens, rows = tokens / 4, dim = 128, width = topk < rows ? topk : rows;
  float *q = malloc(sizeof(float) * n * heads * dim), *w = malloc(sizeof(float) * n * heads),
        *k = malloc(sizeof(float) * rows * dim);
  int *vis = malloc(sizeof(int) * n);
  fill_rand(q, (size_t)n * heads * dim), fill_rand(w, (size_t)n * heads), fill_rand(k, (size_t)rows * dim);
  double flops = 0;
  for (int i = 0; i < n; i++) {
    vis[i] = (i + 1) / 4;
    flops += 2.0 * vis[i] * heads * dim;
  }
  st_backend_limits lim = {.max_tokens = n, .max_rows = rows, .max_topk = topk, .max_dim = dim};
  void *work = malloc(best->ops->workspace_size(best->ctx, &lim));
  int32_t *idx = malloc(sizeof(int32_t) * n * width);
  double t0 = now(), c0 = cpu_now();
  best->ops->indexer_topk(best->ctx, idx, q, w, k, n, rows, heads, dim, vis, topk, width, work);
  double dt = now() - t0, cdt = cpu_now() - c0, dt2 = 0;
  if (time_avx2) {
    int32_t *idx2 = malloc(sizeof(int32_t) * n * width);
    t0 = now();
    avx2->ops->indexer_topk(avx2->ctx, idx2, q, w, k, n, rows, heads, dim, vis, topk, width, work);
    dt2 = now() - t0;
    CHECK(!memcmp(idx, idx2, sizeof(int32_t) * n * width), "indexer_topk %d tokens: avx2 differs", tokens);
    free(idx2);
  }
  /* checks on the last 64 queries (the most rows): composed, 1 thread, split, reference */
  int q0 = n - 64, m = 64;
  float *sc = malloc(sizeof(float) * m * rows);
  int32_t *c = malloc(sizeof(int32_t) * m * width);
  best->ops->indexer_scores(best->ctx, sc, q + (size_t)q0 * heads * dim, w + (size_t)q0 * heads, k, m, rows,
                            heads, dim, vis + q0);
  best->ops->topk(best->ctx, c, sc, m, rows, vis + q0, topk, width, work);
  CHECK(!memcmp(c, idx + (size_t)q0 * width, sizeof(int32_t) * m * width),
        "indexer_topk %d tokens: fused != composed on the last 64 queries", tokens);
  omp_set_num_threads(1);
  best->ops->indexer_topk(best->ctx, c, q + (size_t)q0 * heads * dim, w + (size_t)q0 * heads, k, m, rows,
                          heads, dim, vis + q0, topk, width, work);
  omp_set_num_threads(2);
  CHECK(!memcmp(c, idx + (size_t)q0 * width, sizeof(int32_t) * m * width),
        "indexer_topk %d tokens: 1 thread / split differs", tokens);
  double worst = 0;
  for (int a = 0; a < m; a += 7)
    for (int j = 0; j < vis[q0 + a]; j += 13) {
      double mag = 0;
      for (int h = 0; h < heads; h++) mag += fabs(w[(size_t)(q0 + a) * heads + h]) * dim;
      double e = fabs(sc[(size_t)a * rows + j] - ref_score(q, w, k, q0 + a, j, heads, dim)) / mag;
      worst = e > worst ? e : worst;
    }
  CHECK(worst < 1e-6, "indexer %d tokens: score error %.3g", tokens, worst);
  int32_t *r = malloc(sizeof(int32_t) * width);
  int bad = 0;
  for (int a = 0; a < m; a++) {
    ref_topk(r, sc + (size_t)a * rows, vis[q0 + a], topk, width);
    bad += memcmp(r, c + (size_t)a * width, sizeof(int32_t) * width) != 0;
  }
  CHECK(!bad, "indexer %d tokens: %d rows differ from a full sort of the scores", tokens, bad);
  printf("| %d | %d | %d x %d | %d | %.1f | %.3f | %.1f | %.0f%% | %.1f | %.0f%% |\n", tokens, rows, heads, dim,
         topk, flops / 1e9, dt, flops / dt / 1e9, 100.0 * flops / dt / 1e9 / peak, flops / cdt / 1e9,
         100.0 * flops / cdt / 1e9 / core_peak);
  if (time_avx2) printf("|  | (avx2 path) | | | | %.3f | %.1f | | | |\n", dt2, flops / dt2 / 1e9);
  free(q), free(w), free(k), free(vis), free(work), free(idx), free(sc), free(c), free(r);
}

/* ---------------------------------------------------------------- attention */

static void attention(st_backend *best, int n, int heads, int d, int window, int topk, int check,
                      double peak) {
  int width = window + topk, kvrows = window + n + 4 * n;
  float *q = malloc(sizeof(float) * n * heads * d), *kv = malloc(sizeof(float) * kvrows * d),
        *o = malloc(sizeof(float) * n * heads * d), *o2 = malloc(sizeof(float) * n * heads * d),
        *sinks = malloc(sizeof(float) * heads);
  int32_t *cand = malloc(sizeof(int32_t) * n * width);
  fill_rand(q, (size_t)n * heads * d), fill_rand(kv, (size_t)kvrows * d), fill_rand(sinks, heads);
  for (size_t a = 0; a < (size_t)n * heads * d; a++) q[a] *= 4;
  for (int i = 0; i < n; i++)
    for (int c = 0; c < width; c++)
      cand[(size_t)i * width + c] = rnd() % 9 == 0 ? -1 : (int32_t)(rnd() % kvrows);
  float scale = 1.0f / sqrtf((float)d);
  double t0 = now(), c0 = cpu_now();
  best->ops->sparse_attention(best->ctx, o, q, kv, cand, n, heads, d, width, sinks, scale, 1);
  double dt = now() - t0, cdt = cpu_now() - c0;
  double flops = 4.0 * n * heads * width * d;
  if (check) {
    double worst = 0;
    for (int i = 0; i < n; i++)
      for (int h = 0; h < heads; h++) {
        double *p = malloc(sizeof(double) * width), mx = sinks[h], den = 0;
        for (int c = 0; c < width; c++) {
          int32_t r = cand[(size_t)i * width + c];
          if (r < 0) continue;
          double s = 0;
          for (int k = 0; k < d; k++) s += (double)q[((size_t)i * heads + h) * d + k] * kv[(size_t)r * d + k];
          p[c] = s * scale;
          mx = p[c] > mx ? p[c] : mx;
        }
        for (int c = 0; c < width; c++) if (cand[(size_t)i * width + c] >= 0) den += (p[c] = exp(p[c] - mx));
        den += exp(sinks[h] - mx);
        for (int k = 0; k < d; k++) {
          double s = 0;
          for (int c = 0; c < width; c++) {
            int32_t r = cand[(size_t)i * width + c];
            if (r >= 0) s += st_round_bf16((float)(p[c] / den)) * (double)kv[(size_t)r * d + k];
          }
          double e = fabs(o[((size_t)i * heads + h) * d + k] - s);
          worst = e > worst ? e : worst;
        }
        free(p);
      }
    /* the reference rounds its own p to bf16: a p on a rounding boundary may round the other way */
    CHECK(worst < 2e-3, "sparse_attention error %.3g", worst);
    omp_set_num_threads(1);
    best->ops->sparse_attention(best->ctx, o2, q, kv, cand, n, heads, d, width, sinks, scale, 1);
    omp_set_num_threads(2);
    CHECK(!memcmp(o, o2, sizeof(float) * n * heads * d), "sparse_attention: 1 thread differs");
    best->ops->sparse_attention(best->ctx, o2, q, kv, cand, 1, heads, d, width, sinks, scale, 1);
    best->ops->sparse_attention(best->ctx, o2 + (size_t)heads * d, q + (size_t)heads * d, kv, cand + width,
                                n - 1, heads, d, width, sinks, scale, 1);
    CHECK(!memcmp(o, o2, sizeof(float) * n * heads * d), "sparse_attention: split differs");
    for (int t = 0; t < 3; t++) {
      st_backend b = open_cpu(isa_names[t]);
      b.ops->sparse_attention(b.ctx, o2, q, kv, cand, n, heads, d, width, sinks, scale, 1);
      CHECK(!memcmp(o, o2, sizeof(float) * n * heads * d), "sparse_attention: %s differs", b.ops->describe(b.ctx));
      st_backend_close(&b);
    }
    printf("sparse_attention [n=%d, heads=%d, d=%d, width=%d]: max abs error vs double %.2g; 1 thread, split, "
           "avx512/avx2/portable identical\n", n, heads, d, width, worst);
  } else {
    printf("sparse_attention [n=%d, heads=%d, d=%d, width=%d]: %.3f s, %.1f GFLOP/s (%.0f%% of the 2-thread peak); "
           "%.1f GFLOP per core-second (%.0f%% of the core peak)\n", n, heads, d, width, dt, flops / dt / 1e9,
           100 * flops / dt / 1e9 / peak, flops / cdt / 1e9, 100 * flops / cdt / 1e9 / core_peak);
  }
  free(q), free(kv), free(o), free(o2), free(sinks), free(cand);
}

/* ---------------------------------------------------------------- other ops across paths */

static void check_other_ops(void) {
  int n = 37, hc = 4, D = 200, flat = hc * D, mixes = (2 + hc) * hc;
  float *X = malloc(sizeof(float) * n * flat), *fn = malloc(sizeof(float) * mixes * flat),
        *base = malloc(sizeof(float) * mixes), scale[3] = {0.5f, 0.7f, 0.9f};
  fill_rand(X, (size_t)n * flat), fill_rand(fn, (size_t)mixes * flat), fill_rand(base, mixes);
  float *out[3][5];
  for (int t = 0; t < 3; t++) {
    st_backend b = open_cpu(isa_names[t]);
    for (int a = 0; a < 5; a++) out[t][a] = calloc((size_t)n * flat, sizeof(float));
    b.ops->hc_weights(b.ctx, out[t][0], out[t][0] + n * hc, out[t][0] + 2 * n * hc, X, fn, base, scale, n, hc,
                      D, 1e-6f, 1e-6f, 20);
    b.ops->hc_head(b.ctx, out[t][1], X, fn, base, scale, n, hc, D, 1e-6f, 1e-6f);
    b.ops->rmsnorm(b.ctx, out[t][2], X, fn, n * 4, 50, 1e-6f); /* odd dim: a tail after 3 x 16 */
    b.ops->hc_collapse(b.ctx, out[t][3], X, out[t][0], n, hc, D);
    b.ops->hc_expand(b.ctx, out[t][4], out[t][3], X, out[t][0] + n * hc, out[t][0] + 2 * n * hc, n, hc, D);
    st_backend_close(&b);
  }
  const char *names[5] = {"hc_weights", "hc_head", "rmsnorm", "hc_collapse", "hc_expand"};
  for (int a = 0; a < 5; a++)
    for (int t = 1; t < 3; t++)
      CHECK(!memcmp(out[0][a], out[t][a], sizeof(float) * n * flat), "%s: %s differs from avx512", names[a], isa_names[t]);
  /* hc_weights pre against double */
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double ss = 0;
    for (int k = 0; k < flat; k++) ss += (double)X[(size_t)i * flat + k] * X[(size_t)i * flat + k];
    double r = 1.0 / sqrt(ss / flat + 1e-6);
    for (int a = 0; a < hc; a++) {
      double m = 0;
      for (int k = 0; k < flat; k++) m += (double)X[(size_t)i * flat + k] * fn[(size_t)a * flat + k];
      double p = 1.0 / (1.0 + exp(-(m * r * scale[0] + base[a]))) + 1e-6;
      double e = fabs(out[0][0][i * hc + a] - p);
      worst = e > worst ? e : worst;
    }
  }
  CHECK(worst < 1e-5, "hc_weights pre error %.3g", worst);
  printf("hc_weights, hc_head, rmsnorm, hc_collapse, hc_expand: avx512 == avx2 == portable; hc_weights pre error vs double %.2g\n", worst);
  for (int t = 0; t < 3; t++)
    for (int a = 0; a < 5; a++) free(out[t][a]);
  free(X), free(fn), free(base);
}

int main(int argc, char **argv) {
  int quick = argc > 1 && !strcmp(argv[1], "--quick"), checks_only = argc > 1 && !strcmp(argv[1], "--checks");
  setvbuf(stdout, NULL, _IOLBF, 0);
  omp_set_num_threads(2);
  __builtin_cpu_init();
  if (argc > 1 && !strcmp(argv[1], "--small-n")) { /* only the matmul-by-token-count table */
    st_backend b = open_cpu(NULL);
    bench_matmul_small(&b);
    st_backend_close(&b);
    return 0;
  }
  int has512 = __builtin_cpu_supports("avx512f");
  double peak1 = measure_peak(has512, 1, PEAK_ITERS / 4), peak = measure_peak(has512, 2, PEAK_ITERS / 4);
  double peak_avx2 = measure_peak(0, 2, PEAK_ITERS / 4);
  st_backend best = open_cpu(NULL), avx2 = open_cpu("avx2");
  printf("# cpu backend: %s\n\n", best.ops->describe(best.ctx));
  printf("fp32 FMA peak (%s, independent chains in registers): %.1f GFLOP/s on 1 thread (%.1f GFLOP per "
         "core-second of CPU time), %.1f on 2; AVX2 peak on 2: %.1f\n", has512 ? "AVX-512" : "AVX2", peak1,
         core_peak, peak, peak_avx2);

  printf("\n## checks\n\n");
  check_decode();
  printf("decoding: every bf16/f16 pattern, every fp8 and fp4 code, through matmul on every path: %s\n",
         failures ? "see failures" : "equal to st_weight_decode");
  check_topk(&best);
  check_indexer_small(&best, 80);
  check_indexer_small(&best, 20);
  check_other_ops();
  attention(&best, 24, 20, 72, 16, 40, 1, peak);
  bench_matmul(&best, quick, checks_only);
  if (!checks_only) bench_matmul_small(&best);
  if (checks_only) {
    printf("\n%s (%d failures)\n", failures ? "FAILED" : "all checks passed", failures);
    return failures ? 1 : 0;
  }

  printf("\n## indexer_topk (DeepSeek-V4-Flash shapes, causal: query i sees (i+1)/4 rows)\n\n");
  printf("| tokens | rows | heads x dim | top-k | GFLOP | seconds | GFLOP/s | of 2-thread peak | GFLOP per core-second | of core peak |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  bench_indexer(&best, &avx2, peak, 4096, 64, 512, 1);
  if (!quick) bench_indexer(&best, &avx2, peak, 16384, 64, 512, 0);
  bench_indexer(&best, &avx2, peak, quick ? 4096 : 16384, 16, 64, 0);

  printf("\n## sparse_attention\n\n");
  attention(&best, quick ? 64 : 256, 64, 512, 128, 512, 0, peak);

  st_backend_close(&best);
  st_backend_close(&avx2);
  printf("\n%s (%d failures)\n", failures ? "FAILED" : "all checks passed", failures);
  return failures ? 1 : 0;
}
