/*
** test_devemu.c — kernels/devemu/: the emulated device keeps its promises. Its memory faults
** when the host touches it outside a backend entry (checked in a forked child, for a read and a
** write, after an upload and after an op); entries see it; allocations start zero-filled, also
** after a free; transfers and ops refuse pointers on the wrong side of the boundary (host memory
** where device memory belongs, device memory where host memory belongs, past the end of an
** allocation, freed, overlapping) and say which; ops give cpu-ref's bits; concurrent host threads
** and cpu-ref's OpenMP workers run inside entries unharmed. The whole engine on it is held to
** cpu-ref's digests by test_digests_devemu.
*/
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/backend.h"

static st_backend open_devemu(void) {
  st_backend b;
  assert_int_equal(st_backend_open(ST_BACKEND_DEVEMU, &b), ST_OK);
  return b;
}

static void *dalloc(const st_backend *b, size_t bytes) {
  void *p = NULL;
  assert_int_equal(st_backend_alloc(b, bytes, &p), ST_OK);
  assert_non_null(p);
  return p;
}

static void on_segv(int sig) { _exit(128 + sig); }

/* How a forked child touching p ends: SIGSEGV when the access faulted, 0 when it went through.
** The child catches the fault itself (cmocka's and a sanitizer's handlers would report it). */
static int touch_in_child(void *p, int write) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    sigaction(SIGSEGV, &sa, NULL);
    if (write) *(volatile float *)p = 1.0f;
    else (void)*(volatile float *)p;
    _exit(0);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  if (WIFSIGNALED(st)) return WTERMSIG(st);
  return WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGSEGV ? SIGSEGV : 0;
}

static void test_table(void **state) {
  (void)state;
  st_backend b = open_devemu();
  assert_string_equal(b.ops->name, ST_BACKEND_DEVEMU);
  assert_int_equal(b.ops->host_memory, 0);
  assert_non_null(b.ops->describe);
  assert_non_null(strstr(b.ops->describe(b.ctx), "PROT_NONE"));
  /* not advertised, but opened by name */
  assert_null(strstr(st_backend_names(), ST_BACKEND_DEVEMU));
  /* the optional entries cpu-ref lacks stay NULL; the others are all there */
  assert_true(!b.ops->indexer_topk == !st_backend_cpu_ref_ops.indexer_topk);
  assert_true(!b.ops->moe_experts == !st_backend_cpu_ref_ops.moe_experts);
  const void *const *have = (const void *const *)&b.ops->matmul;
  const void *const *ref = (const void *const *)&st_backend_cpu_ref_ops.matmul;
  size_t n_ops = (sizeof(st_backend_ops) - offsetof(st_backend_ops, matmul)) / sizeof(void *);
  for (size_t k = 0; k < n_ops; k++) assert_true(!have[k] == !ref[k]);
  st_backend_close(&b);
}

static void test_host_access_faults(void **state) {
  (void)state;
  st_backend b = open_devemu();
  float *d = dalloc(&b, 64 * sizeof(float));
  assert_int_equal(touch_in_child(d, 0), SIGSEGV);
  assert_int_equal(touch_in_child(d, 1), SIGSEGV);
  float host[64];
  for (int k = 0; k < 64; k++) host[k] = (float)k;
  assert_int_equal(st_backend_upload(&b, d, host, sizeof host), ST_OK);
  assert_int_equal(touch_in_child(d + 10, 0), SIGSEGV); /* closed again after the upload */
  b.ops->scale(b.ctx, d, 2.0f, 64);
  assert_int_equal(b.ops->synchronize(b.ctx), ST_OK);
  assert_int_equal(touch_in_child(d + 63, 0), SIGSEGV); /* and after an op */
  float back[64];
  assert_int_equal(st_backend_download(&b, back, d, sizeof back), ST_OK);
  for (int k = 0; k < 64; k++) assert_true(back[k] == 2.0f * (float)k);
  /* ordinary host memory is not affected */
  assert_int_equal(touch_in_child(host, 1), 0);
  st_backend_free(&b, d);
  st_backend_close(&b);
}

static void test_zero_filled(void **state) {
  (void)state;
  st_backend b = open_devemu();
  enum { N = 3000 }; /* not a page multiple */
  float *d = dalloc(&b, N * sizeof(float)), back[N];
  b.ops->fill(b.ctx, d, 7.0f, N);
  st_backend_free(&b, d);
  float *again = dalloc(&b, N * sizeof(float)); /* first fit: the same pages */
  assert_ptr_equal(again, d);
  assert_int_equal(st_backend_download(&b, back, again, sizeof back), ST_OK);
  for (int k = 0; k < N; k++) assert_true(back[k] == 0.0f);
  void *empty = dalloc(&b, 0);
  st_backend_free(&b, empty);
  st_backend_free(&b, NULL);
  st_backend_free(&b, again);
  st_backend_close(&b);
}

static void test_transfers_checked(void **state) {
  (void)state;
  st_backend b = open_devemu();
  float *d = dalloc(&b, 16 * sizeof(float)), *e = dalloc(&b, 16 * sizeof(float));
  float host[32] = {0};
  /* past the end of the allocation */
  assert_int_equal(st_backend_upload(&b, d, host, 17 * sizeof(float)), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "upload"));
  assert_int_equal(st_backend_download(&b, host, d + 8, 9 * sizeof(float)), ST_EINVAL);
  /* the wrong side of the boundary */
  assert_int_equal(st_backend_upload(&b, host, host + 16, sizeof(float)), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "host pointer"));
  assert_int_equal(st_backend_upload(&b, d, e, sizeof(float)), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "device memory"));
  assert_int_equal(st_backend_download(&b, e, d, sizeof(float)), ST_EINVAL);
  assert_int_equal(b.ops->copy(b.ctx, host, d, sizeof(float)), ST_EINVAL);
  /* copy: within allocations, not overlapping */
  assert_int_equal(b.ops->copy(b.ctx, e, d, 16 * sizeof(float)), ST_OK);
  assert_int_equal(b.ops->copy(b.ctx, d + 1, d, 8 * sizeof(float)), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "overlapping"));
  /* a freed block is no longer device memory */
  st_backend_free(&b, e);
  assert_int_equal(st_backend_upload(&b, e, host, sizeof(float)), ST_EINVAL);
  /* exactly to the end is fine, and so is nothing */
  assert_int_equal(st_backend_upload(&b, d + 8, host, 8 * sizeof(float)), ST_OK);
  assert_int_equal(st_backend_upload(&b, d, host, 0), ST_OK);
  assert_int_equal(b.ops->synchronize(b.ctx), ST_OK); /* none of these latched anything */
  st_backend_free(&b, d);
  st_backend_close(&b);
}

static void test_ops_checked(void **state) {
  (void)state;
  st_backend b = open_devemu();
  float *y = dalloc(&b, 8 * sizeof(float)), *a = dalloc(&b, 8 * sizeof(float));
  float host[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8];
  assert_int_equal(st_backend_upload(&b, a, host, sizeof host), ST_OK);
  /* a host pointer handed to an op: skipped, latched, reported by the next synchronize */
  b.ops->add(b.ctx, y, a, host, 8);
  assert_int_equal(b.ops->synchronize(b.ctx), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "add"));
  assert_non_null(strstr(st_errmsg(), "host pointer"));
  assert_int_equal(b.ops->synchronize(b.ctx), ST_OK); /* reported once */
  assert_int_equal(st_backend_download(&b, back, y, sizeof back), ST_OK);
  for (int k = 0; k < 8; k++) assert_true(back[k] == 0.0f); /* the op did not run */
  /* ... or by the next download, which then copies nothing */
  b.ops->rmsnorm(b.ctx, y, a, host, 1, 8, 1e-6f);
  back[0] = 42.0f;
  assert_int_equal(st_backend_download(&b, back, y, sizeof back), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "rmsnorm"));
  assert_true(back[0] == 42.0f);
  /* a weight whose data is host memory */
  st_weight w = {.dtype = ST_W_F32, .block = {1, 1}, .rows = 8, .cols = 8, .data = host};
  b.ops->matmul(b.ctx, y, a, &w, 1);
  assert_int_equal(b.ops->synchronize(b.ctx), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "matmul: weight"));
  /* a NULL where the op allows none is fine (rmsnorm without a weight) */
  b.ops->rmsnorm(b.ctx, y, a, NULL, 1, 8, 1e-6f);
  assert_int_equal(b.ops->synchronize(b.ctx), ST_OK);
  st_backend_free(&b, y);
  st_backend_free(&b, a);
  st_backend_close(&b);
}

/* Uniform pseudo-random floats in [-1, 1). */
static void fill_random(float *x, size_t n, uint32_t seed) {
  for (size_t k = 0; k < n; k++) {
    seed = seed * 1664525u + 1013904223u;
    x[k] = (float)(seed >> 8) / 8388608.0f - 1.0f;
  }
}

/* Big enough that cpu-ref's OpenMP loop splits it among its threads. */
static void test_same_bits_as_cpu_ref(void **state) {
  (void)state;
  enum { N = 67, K = 256, O = 96 };
  st_backend dev = open_devemu(), ref;
  assert_int_equal(st_backend_open("cpu-ref", &ref), ST_OK);
  float *x = malloc(sizeof(float) * N * K), *wt = malloc(sizeof(float) * O * K);
  float *y_ref = malloc(sizeof(float) * N * O), *y_dev = malloc(sizeof(float) * N * O);
  assert_true(x && wt && y_ref && y_dev);
  fill_random(x, (size_t)N * K, 1);
  fill_random(wt, (size_t)O * K, 2);
  st_weight w = {.dtype = ST_W_F32, .block = {1, 1}, .rows = O, .cols = K, .data = wt};
  ref.ops->matmul(ref.ctx, y_ref, x, &w, N); /* cpu-ref: host memory in place */
  float *dx = dalloc(&dev, sizeof(float) * N * K), *dw = dalloc(&dev, sizeof(float) * O * K);
  float *dy = dalloc(&dev, sizeof(float) * N * O);
  assert_int_equal(st_backend_upload(&dev, dx, x, sizeof(float) * N * K), ST_OK);
  assert_int_equal(st_backend_upload(&dev, dw, wt, sizeof(float) * O * K), ST_OK);
  st_weight dwt = w;
  dwt.data = dw;
  dev.ops->matmul(dev.ctx, dy, dx, &dwt, N);
  assert_int_equal(st_backend_download(&dev, y_dev, dy, sizeof(float) * N * O), ST_OK);
  assert_memory_equal(y_ref, y_dev, sizeof(float) * N * O);
  st_backend_free(&dev, dx);
  st_backend_free(&dev, dw);
  st_backend_free(&dev, dy);
  free(x), free(wt), free(y_ref), free(y_dev);
  st_backend_close(&dev);
  st_backend_close(&ref);
}

/* Host threads calling entries at once: the last one out closes the arena, not the first. */
typedef struct worker {
  const st_backend *b;
  float *d;
  int bad;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  float host[1024];
  for (int round = 0; round < 200; round++) {
    for (int k = 0; k < 1024; k++) host[k] = (float)((round + k) % 200); /* halves stay bf16-exact */
    if (st_backend_upload(w->b, w->d, host, sizeof host)) w->bad++;
    w->b->ops->scale(w->b->ctx, w->d, 0.5f, 1024);
    w->b->ops->round_bf16(w->b->ctx, w->d, 1024);
    if (st_backend_download(w->b, host, w->d, sizeof host)) w->bad++;
    for (int k = 0; k < 1024; k++) w->bad += host[k] != (float)((round + k) % 200) * 0.5f;
    void *extra = NULL; /* allocations come and go while others are inside */
    if (st_backend_alloc(w->b, 4096 * (size_t)(1 + round % 5), &extra)) w->bad++;
    st_backend_free(w->b, extra);
  }
  return NULL;
}

static void test_concurrent_threads(void **state) {
  (void)state;
  st_backend b = open_devemu();
  worker w[4];
  pthread_t t[4];
  for (int k = 0; k < 4; k++) {
    w[k] = (worker){.b = &b, .d = dalloc(&b, 1024 * sizeof(float))};
    assert_int_equal(pthread_create(&t[k], NULL, work, &w[k]), 0);
  }
  for (int k = 0; k < 4; k++) {
    pthread_join(t[k], NULL);
    assert_int_equal(w[k].bad, 0);
  }
  assert_int_equal(b.ops->synchronize(b.ctx), ST_OK);
  assert_int_equal(touch_in_child(w[0].d, 0), SIGSEGV); /* closed once all have left */
  for (int k = 0; k < 4; k++) st_backend_free(&b, w[k].d);
  st_backend_close(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_table),
    cmocka_unit_test(test_host_access_faults),
    cmocka_unit_test(test_zero_filled),
    cmocka_unit_test(test_transfers_checked),
    cmocka_unit_test(test_ops_checked),
    cmocka_unit_test(test_same_bits_as_cpu_ref),
    cmocka_unit_test(test_concurrent_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
