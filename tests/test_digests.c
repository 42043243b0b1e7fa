/*
** test_digests.c — cpu-ref's bits, held to committed digests.
**
** Every tap of a set of runs (the oracle fixtures tiny and odd, the bundled needle model; exact
** and reference precision; the fault settings; a replay-style run with alternate settings in
** one layer; chunked prefill then greedy decode) is hashed as the engine emits it: FNV-1a 64
** over (tap, layer, pos0, shape, bytes) in emission order, one digest per (case, tap, layer).
** The committed file tests/data/digests/cpu-ref.txt was written by this program on the engine
** as it stood before the device-boundary rework (build 631139e); any change to a single bit of
** any tap of any case fails the test and names the case, tap and layer.
**
**   test_digests                      compare with tests/data/digests/cpu-ref.txt
**   test_digests --write FILE         write the digests of this build (to refresh on purpose)
**   test_digests --backend NAME       another backend against its own committed digests
**                                     (tests/data/digests/NAME.txt)
**   test_digests --runs N             every case N times; the runs must agree bit for bit
**                                     before the first is compared (or written)
**   test_digests --tap-staging BYTES  a device backend's tap staging this small (it fills and
**                                     is handed to the sink many times a chunk)
**   test_digests --backend NAME --expect OTHER
**                                     a backend that must give OTHER's bits (cpu-ref-devemu is
**                                     cpu-ref's arithmetic in emulated device memory: cpu-ref.txt)
**
** tests/data/digests/cpu.txt holds the fast CPU backend's bits (written on an AVX-512 machine and
** checked equal under ST_CPU_ISA=avx2 and portable): its determinism across instruction sets,
** thread counts and chunkings, held the same way. tests/data/digests/cuda.txt holds the cuda
** backend's (written on an H200 with --runs 5; ctest's test_digests_cuda in a -DST_WITH_CUDA=ON
** build, skipped where no device answers).
*/
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"

typedef struct digest_case {
  const char *name;
  const char *model;      /* relative to the source dir */
  const char *settings[6];
  int alt_layer;          /* -1: none; else this layer runs under alt_settings */
  const char *alt_settings[4];
  int n_prompt, chunk, n_decode;
} digest_case;

static const digest_case cases[] = {
  {"tiny-exact", "tests/data/oracle/tiny", {NULL}, -1, {NULL}, 301, 64, 3},
  {"tiny-exact-chunk7", "tests/data/oracle/tiny", {NULL}, -1, {NULL}, 150, 7, 2},
  {"tiny-reference", "tests/data/oracle/tiny", {"precision=reference"}, -1, {NULL}, 301, 64, 3},
  {"tiny-faults", "tests/data/oracle/tiny",
   {"rotate=q", "index_k=fp8_e4m3fn_as_fnuz", "index_q=bf16", "index_rope=neox", "topk=8", NULL},
   -1, {NULL}, 260, 100, 2},
  {"tiny-fp8", "tests/data/oracle/tiny",
   {"index_k=fp8_e4m3fnuz", "index_q=fp8_e4m3fn", "compress_rope_theta=20000", "yarn=off", NULL},
   -1, {NULL}, 200, 256, 1},
  {"tiny-fp4-topk-all", "tests/data/oracle/tiny", {"index_k=fp4_e2m1", "index_q=fp4_e2m1", "topk=all", NULL},
   -1, {NULL}, 200, 256, 1},
  {"tiny-alt-layer1", "tests/data/oracle/tiny", {NULL}, 1, {"rotate=k", "topk=4", NULL}, 220, 50, 2},
  {"odd-exact", "tests/data/oracle/odd", {NULL}, -1, {NULL}, 190, 33, 3},
  {"odd-reference", "tests/data/oracle/odd", {"precision=reference", "rotate=none", "index_k=bf16", "index_q=fp8_e4m3fn"}, -1, {NULL}, 190, 256, 2},
  {"needle-v4-exact", "models/needle-v4", {NULL}, -1, {NULL}, 1100, 256, 2},
  {"needle-v4-reference", "models/needle-v4", {"precision=reference"}, -1, {NULL}, 700, 128, 2},
};

/* ---- the hashing sink --------------------------------------------------------------------- */

typedef struct digest_sink {
  int n_layers;
  uint64_t *hash;   /* [(n_layers + 1) * ST_TAP_COUNT] */
  int64_t *rows;
} digest_sink;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * 0x100000001b3ull;
  return h;
}

static st_status digest_emit(void *ctx, st_tap_id tap, int layer, int64_t pos0, st_dtype dtype,
                             int rank, const int64_t *shape, const void *data) {
  digest_sink *d = ctx;
  size_t slot = (size_t)(layer < 0 ? d->n_layers : layer) * ST_TAP_COUNT + tap;
  uint64_t h = d->hash[slot] ? d->hash[slot] : 0xcbf29ce484222325ull;
  int64_t head[4] = {pos0, rank, 0, 0};
  size_t count = 1;
  h = fnv(h, head, sizeof head);
  for (int k = 0; k < rank; k++) {
    h = fnv(h, &shape[k], sizeof shape[k]);
    count *= (size_t)shape[k];
  }
  h = fnv(h, data, count * st_dtype_size(dtype));
  d->hash[slot] = h;
  d->rows[slot] += shape[0];
  return ST_OK;
}

/* Deterministic prompt: a fixed LCG over the vocabulary (no reliance on any tokenizer). */
static void make_prompt(int32_t *out, int n, int vocab, uint32_t seed) {
  uint32_t x = seed;
  for (int i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    out[i] = (int32_t)((x >> 8) % (uint32_t)vocab);
  }
}

static size_t tap_staging; /* --tap-staging; 0: the session's default */

static st_status run_case(const char *root, const digest_case *c, const char *backend, FILE *out) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", root, c->model);
  st_model *m = NULL;
  st_status rc = st_model_open(dir, &m);
  if (rc == ST_OK) rc = st_model_load_all(m);
  if (rc) return rc;
  const st_config *cfg = m->cfg;
  int L = cfg->num_hidden_layers;
  st_taps taps = {0};
  const char *all[] = {"*"};
  digest_sink sink = {L, calloc((size_t)(L + 1) * ST_TAP_COUNT, sizeof(uint64_t)),
                      calloc((size_t)(L + 1) * ST_TAP_COUNT, sizeof(int64_t))};
  st_tap_sink ts = {.ctx = &sink, .emit = digest_emit};
  uint8_t *alt = calloc((size_t)L, 1);
  int32_t *prompt = malloc(sizeof(int32_t) * (size_t)c->n_prompt), gen[16];
  int n_gen = 0;
  st_session *s = NULL;
  st_session_options opt = {0};
  st_backend be = {0};
  if (!sink.hash || !sink.rows || !alt || !prompt) { rc = st_fail(ST_ENOMEM, "digest buffers"); goto out; }
  if ((rc = st_taps_arm(&taps, L, all, 1))) goto out;
  taps.sink = &ts;
  opt.max_tokens = c->n_prompt + c->n_decode + 1;
  opt.max_chunk = c->chunk;
  opt.taps = &taps;
  opt.tap_staging = tap_staging;
  st_settings_default(&opt.settings);
  for (int k = 0; c->settings[k]; k++)
    if ((rc = st_settings_set(&opt.settings, c->settings[k]))) goto out;
  if (c->alt_layer >= 0) {
    opt.alt_settings = opt.settings;
    for (int k = 0; c->alt_settings[k]; k++)
      if ((rc = st_settings_set(&opt.alt_settings, c->alt_settings[k]))) goto out;
    alt[c->alt_layer] = 1;
    opt.alt_layers = alt;
  }
  if ((rc = st_backend_open(backend, &be))) goto out;
  opt.backend = &be;
  if ((rc = st_session_create(m, &opt, &s))) goto out;
  make_prompt(prompt, c->n_prompt, cfg->vocab_size, 12345u + (uint32_t)c->n_prompt);
  if ((rc = st_generate_greedy(s, prompt, c->n_prompt, c->n_decode, 0, gen, &n_gen))) goto out;
  fprintf(out, "%s generated", c->name);
  for (int k = 0; k < n_gen; k++) fprintf(out, " %d", gen[k]);
  fprintf(out, "\n");
  for (int l = 0; l <= L; l++)
    for (int t = 0; t < ST_TAP_COUNT; t++) {
      size_t slot = (size_t)l * ST_TAP_COUNT + t;
      if (!sink.rows[slot]) continue;
      fprintf(out, "%s %s %d %" PRId64 " %016" PRIx64 "\n", c->name, st_tap_catalogue[t].suffix,
              l == L ? -1 : l, sink.rows[slot], sink.hash[slot]);
    }
out:
  st_session_free(s);
  st_backend_close(&be);
  st_taps_free(&taps);
  free(sink.hash);
  free(sink.rows);
  free(alt);
  free(prompt);
  st_model_close(m);
  return rc;
}

/* Compares two digest files line by line; prints every difference. Returns the count. */
static int compare(const char *expected_path, const char *got, size_t got_len) {
  FILE *f = fopen(expected_path, "r");
  if (!f) {
    fprintf(stderr, "test_digests: cannot open %s\n", expected_path);
    return 1;
  }
  FILE *g = fmemopen((void *)got, got_len, "r");
  char a[512], b[512];
  int diffs = 0, line = 0;
  for (;;) {
    char *ra = fgets(a, sizeof a, f), *rb = fgets(b, sizeof b, g);
    line++;
    if (!ra && !rb) break;
    if (!ra || !rb || strcmp(a, b)) {
      fprintf(stderr, "line %d: expected %s         got %s", line, ra ? a : "(end)\n", rb ? b : "(end)\n");
      if (++diffs > 40) { fprintf(stderr, "(more differences not shown)\n"); break; }
    }
  }
  fclose(f);
  fclose(g);
  return diffs;
}

int main(int argc, char **argv) {
  const char *write_path = NULL, *backend = "cpu-ref", *expect = NULL;
  int runs = 1;
  for (int k = 1; k < argc; k++) {
    if (!strcmp(argv[k], "--write") && k + 1 < argc) write_path = argv[++k];
    else if (!strcmp(argv[k], "--backend") && k + 1 < argc) backend = argv[++k];
    else if (!strcmp(argv[k], "--expect") && k + 1 < argc) expect = argv[++k];
    else if (!strcmp(argv[k], "--runs") && k + 1 < argc && atoi(argv[k + 1]) > 0) runs = atoi(argv[++k]);
    else if (!strcmp(argv[k], "--tap-staging") && k + 1 < argc && atol(argv[k + 1]) > 0)
      tap_staging = (size_t)atol(argv[++k]);
    else {
      fprintf(stderr, "usage: test_digests [--write FILE] [--backend NAME [--expect NAME]] [--runs N] "
                      "[--tap-staging BYTES]\n");
      return 2;
    }
  }
  const char *root = getenv("ST_SOURCE_DIR");
  if (!root) root = ".";
  st_backend probe;
  st_status open_rc = st_backend_open(backend, &probe);
  if (open_rc == ST_EUNSUPPORTED) { /* a GPU backend not built here, or no device: skipped */
    printf("test_digests: SKIPPED: %s\n", st_errmsg());
    return 77;
  }
  if (open_rc) {
    fprintf(stderr, "test_digests: %s\n", st_errmsg());
    return 1;
  }
  st_backend_close(&probe);
  /* every case `runs` times: each run's digests must equal the first's byte for byte */
  char *buf = NULL;
  size_t len = 0;
  for (int r = 0; r < runs; r++) {
    char *this_buf = NULL;
    size_t this_len = 0;
    FILE *out = open_memstream(&this_buf, &this_len);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
      st_status rc = run_case(root, &cases[k], backend, out);
      if (rc) {
        fprintf(stderr, "test_digests: case %s: %s\n", cases[k].name, st_errmsg());
        return 1;
      }
    }
    fclose(out);
    if (r == 0) {
      buf = this_buf, len = this_len;
      continue;
    }
    if (this_len != len || memcmp(this_buf, buf, len)) {
      fprintf(stderr, "test_digests: run %d of %s differs from run 1 (not deterministic):\n%s\n",
              r + 1, backend, this_buf);
      return 1;
    }
    free(this_buf);
  }
  if (runs > 1) printf("test_digests: %d runs of %s gave the same bits\n", runs, backend);
  if (write_path) {
    FILE *w = fopen(write_path, "w");
    if (!w || fwrite(buf, 1, len, w) != len || fclose(w)) {
      fprintf(stderr, "test_digests: cannot write %s\n", write_path);
      return 1;
    }
    printf("wrote %zu bytes of digests to %s\n", len, write_path);
    free(buf);
    return 0;
  }
  char expected[1024];
  snprintf(expected, sizeof expected, "%s/tests/data/digests/%s.txt", root, expect ? expect : backend);
  int diffs = compare(expected, buf, len);
  free(buf);
  if (diffs) {
    fprintf(stderr, "test_digests: %d line(s) differ from %s\n", diffs, expected);
    return 1;
  }
  printf("test_digests: every tap of %zu cases on %s equals %s bit for bit\n",
         sizeof cases / sizeof cases[0], backend, expected);
  return 0;
}
