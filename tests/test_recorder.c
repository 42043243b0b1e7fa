/*
** test_recorder.c — the recorder end to end with synthetic emits: multiple emits per tap,
** chunked prefill, a second axis that grows during decode, the positions filters (all, last,
** A:B) with their positions datasets, row taps; read back with the trace reader and with stock
** h5py (Debian's system python), the index row appearing only after finish, abort leaving a
** .part and no row, truncated/corrupt/unfinished traces giving clean errors, concurrent writers
** into one store, backpressure, a second axis growing block by block (indexer.scores of a chunked
** prefill: stored size, fill, the recording-cost attributes), and I/O failures.
*/
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <hdf5.h>

#include "common/build_info.h"
#include "recorder/index.h"
#include "recorder/recorder.h"
#include "recorder/trace_reader.h"
#include "recorder/trace_writer.h"

/* ------------------------------------------------------------------ scenario */

/* The synthetic run: 6 prompt tokens, 3 decode steps (9 tokens). Layer 0 is a window layer,
** layer 2 a CSA layer (compression 4: R = floor((p+1)/4) visible rows at position p). */
enum { N_PROMPT = 6, N_TOKENS = 9, N_LAYERS = 3, V = 5 };

static float fval(int layer, int64_t pos, int64_t j) {
  return (float)(pos * 100 + j) + 0.25f * (float)layer;
}

/* layers.0.input element value, with one NaN and one +inf at position 3. */
static float input_val(int64_t pos, int64_t j) {
  if (pos == 3 && j == 0) return NAN;
  if (pos == 3 && j == 1) return INFINITY;
  return fval(0, pos, j);
}

static int32_t ival(int64_t pos, int64_t j) { return (int32_t)(pos * 10 + j); }

static char tmp_root[256];

static void make_tmp(char *out, size_t size, const char *name) {
  snprintf(out, size, "%s/%s", tmp_root, name);
  mkdir(out, 0777);
}

static st_status emit(st_recorder *r, st_tap_id id, int layer, int64_t pos0, st_dtype dtype,
                      int rank, const int64_t *shape, const void *data) {
  const st_tap_sink *s = st_recorder_sink(r);
  return s->emit(s->ctx, id, layer, pos0, dtype, rank, shape, data);
}

/* Emits layers.0.input for positions [p0, p0 + n): [n, 2, 3]. */
static void emit_input(st_recorder *r, int64_t p0, int64_t n) {
  float buf[64 * 6];
  for (int64_t i = 0; i < n; i++)
    for (int j = 0; j < 6; j++) buf[i * 6 + j] = input_val(p0 + i, j);
  int64_t shape[3] = {n, 2, 3};
  assert_int_equal(emit(r, ST_TAP_INPUT, 0, p0, ST_F32, 3, shape, buf), ST_OK);
}

/* Emits the CSA layer's indexer taps for positions [p0, p0 + n) with R visible rows. */
static void emit_indexer(st_recorder *r, int64_t p0, int64_t n, int64_t R) {
  float q[64 * 8], w[64 * 2], scores[64 * 8];
  int32_t topk[64 * 8];
  for (int64_t i = 0; i < n; i++) {
    for (int j = 0; j < 8; j++) q[i * 8 + j] = fval(2, p0 + i, j);
    for (int j = 0; j < 2; j++) w[i * 2 + j] = fval(2, p0 + i, j);
    for (int64_t j = 0; j < R; j++) scores[i * R + j] = fval(2, p0 + i, j);
    for (int64_t j = 0; j < R; j++) topk[i * R + j] = ival(p0 + i, j);
  }
  int64_t sq[3] = {n, 2, 4}, sw[2] = {n, 2}, ss[2] = {n, R};
  assert_int_equal(emit(r, ST_TAP_INDEXER_Q, 2, p0, ST_F32, 3, sq, q), ST_OK);
  assert_int_equal(emit(r, ST_TAP_INDEXER_WEIGHTS, 2, p0, ST_F32, 2, sw, w), ST_OK);
  assert_int_equal(emit(r, ST_TAP_INDEXER_SCORES, 2, p0, ST_F32, 2, ss, scores), ST_OK);
  assert_int_equal(emit(r, ST_TAP_INDEXER_TOPK, 2, p0, ST_I32, 2, ss, topk), ST_OK);
}

/* Emits indexer.k rows [row0, row0 + n): [n, 4]. */
static void emit_rows(st_recorder *r, int64_t row0, int64_t n) {
  float k[16 * 4];
  for (int64_t i = 0; i < n; i++)
    for (int j = 0; j < 4; j++) k[i * 4 + j] = fval(2, row0 + i, j);
  int64_t shape[2] = {n, 4};
  assert_int_equal(emit(r, ST_TAP_INDEXER_K, 2, row0, ST_F32, 2, shape, k), ST_OK);
}

static void emit_logits(st_recorder *r, int64_t pos) {
  float l[V];
  for (int j = 0; j < V; j++) l[j] = fval(-1, pos, j);
  int64_t shape[2] = {1, V};
  assert_int_equal(emit(r, ST_TAP_LOGITS, -1, pos, ST_F32, 2, shape, l), ST_OK);
}

static const int32_t tokens[N_TOKENS] = {11, 12, 13, 14, 15, 16, 101, 102, 103};

static void fill_meta(st_run_meta *m, const char *positions) {
  memset(m, 0, sizeof *m);
  st_run_id_new(m);
  m->model_dir = "/models/tiny-dsv4";
  m->model_name = "tiny-dsv4";
  m->settings_json = "{\"precision\":\"exact\",\"index_k\":\"fp32\",\"index_q\":\"fp32\","
                     "\"rotate\":\"none\",\"topk\":\"64\"}";
  m->config_json = "{\"num_hidden_layers\":3,\"compress_ratios\":[0,128,4]}";
  m->backend = "cpu-ref";
  m->kernel_mode = "deterministic";
  m->threads = 2;
  m->command_line = "sparsetrace run --test";
  m->positions = positions;
  m->n_layers = N_LAYERS;
}

/* Records the scenario: chunked prefill (4 + 2 tokens), then 3 decode steps. Does not finish. */
static st_recorder *record_scenario(const char *h5, const char *store, st_run_meta *meta) {
  st_recorder *r = NULL;
  st_status st = st_recorder_open(h5, store, meta, N_PROMPT, &r);
  if (st) fail_msg("open: %s", st_errmsg());
  /* prefill chunk 1: positions 0..3 (R = 1 once position 3 is reached; emit as [4, 1]) */
  emit_input(r, 0, 4);
  emit_indexer(r, 0, 4, 1);
  emit_rows(r, 0, 1);
  /* prefill chunk 2: positions 4..5, still one row */
  emit_input(r, 4, 2);
  emit_indexer(r, 4, 2, 1);
  emit_logits(r, 5);
  /* decode 6 (R 1), 7 (R 2: new row 1), 8 (R 2) */
  for (int64_t p = 6; p < N_TOKENS; p++) {
    int64_t R = (p + 1) / 4;
    if (p == 7) emit_rows(r, 1, 1);
    emit_input(r, p, 1);
    emit_indexer(r, p, 1, R);
    emit_logits(r, p);
  }
  return r;
}

/* ------------------------------------------------------------------ read-back checks */

static void check_tokens(st_trace *t) {
  int64_t n = 0;
  const int32_t *tok = st_trace_tokens(t, &n);
  assert_int_equal(n, N_TOKENS);
  assert_int_equal(st_trace_n_prompt(t), N_PROMPT);
  assert_memory_equal(tok, tokens, sizeof tokens);
}

/* Checks a position tap against the generator for the kept positions [lo, hi). */
static void check_input(st_trace *t, int64_t lo, int64_t hi) {
  const st_trace_tap *tap = st_trace_find_tap(t, "layers.0.input");
  assert_non_null(tap);
  int64_t rows = hi - lo;
  assert_int_equal(tap->rank, 3);
  assert_int_equal(tap->shape[0], rows);
  assert_int_equal(tap->shape[1], 2);
  assert_int_equal(tap->shape[2], 3);
  assert_int_equal(tap->dtype, ST_F32);
  assert_int_equal(tap->row_axis, 0);
  assert_int_equal(tap->has_positions, lo != 0);
  int64_t pos[16];
  assert_int_equal(st_trace_read_positions(t, tap, pos), ST_OK);
  float v[16 * 6];
  assert_int_equal(st_trace_read_f32(t, tap, 0, rows, v), ST_OK);
  double sum = 0, sumsq = 0, mn = INFINITY, mx = -INFINITY;
  int64_t n = 0, nan = 0, inf = 0;
  for (int64_t i = 0; i < rows; i++) {
    assert_int_equal(pos[i], lo + i);
    for (int j = 0; j < 6; j++) {
      float want = input_val(lo + i, j), got = v[i * 6 + j];
      if (isnan(want)) {
        assert_true(isnan(got));
        nan++;
      } else {
        assert_true(got == want);
        if (isinf(want)) {
          inf++;
        } else {
          sum += want, sumsq += (double)want * want, n++;
          mn = fmin(mn, want), mx = fmax(mx, want);
        }
      }
    }
  }
  int64_t row = -1;
  assert_int_equal(st_trace_find_position(t, tap, lo + 1, &row), ST_OK);
  assert_int_equal(row, 1);
  if (lo > 0) assert_int_equal(st_trace_find_position(t, tap, lo - 1, &row), ST_ENOTFOUND);
  const st_tap_stats *s = &tap->stats;
  assert_int_equal(s->count, rows * 6);
  assert_int_equal(s->nan_count, nan);
  assert_int_equal(s->inf_count, inf);
  assert_int_equal(s->finite_count, rows * 6 - nan - inf);
  assert_int_equal(s->posinf_count + s->neginf_count, inf);
  assert_true(s->has_range && s->has_rms);
  assert_true(s->min == mn && s->max == mx);
  assert_true(fabs(s->mean - sum / (double)n) < 1e-9 * fabs(sum / (double)n) + 1e-12);
  assert_true(fabs(s->rms - sqrt(sumsq / (double)n)) < 1e-9 * sqrt(sumsq / (double)n));
}

/* indexer.scores / topk: [rows, 2], fill -inf / -1 where R was 1. */
static void check_scores(st_trace *t, int64_t lo, int64_t hi) {
  const st_trace_tap *sc = st_trace_find_tap(t, "layers.2.indexer.scores");
  const st_trace_tap *tk = st_trace_find_tap(t, "layers.2.indexer.topk");
  assert_non_null(sc);
  assert_non_null(tk);
  int64_t rows = hi - lo, width = ST_MAX((hi - 1 + 1) / 4, 1); /* R at the last kept position */
  assert_int_equal(sc->shape[0], rows);
  assert_int_equal(sc->shape[1], width);
  assert_int_equal(tk->shape[0], rows);
  assert_int_equal(tk->shape[1], width);
  assert_int_equal(tk->dtype, ST_I32);
  float s[32];
  int32_t k[32];
  assert_int_equal(st_trace_read_f32(t, sc, 0, rows, s), ST_OK);
  assert_int_equal(st_trace_read_i32(t, tk, 0, rows, k), ST_OK);
  int64_t written = 0, fill = 0;
  double topk_min = INFINITY, topk_sum = 0;
  for (int64_t i = 0; i < rows; i++) {
    int64_t p = lo + i, R = p < N_PROMPT ? 1 : (p + 1) / 4;
    for (int64_t j = 0; j < width; j++) {
      if (j < R) {
        assert_true(s[i * width + j] == fval(2, p, j));
        assert_int_equal(k[i * width + j], ival(p, j));
        written++;
      } else {
        assert_true(isinf(s[i * width + j]) && s[i * width + j] < 0);
        assert_int_equal(k[i * width + j], -1);
        fill++;
      }
      topk_min = fmin(topk_min, k[i * width + j]);
      topk_sum += k[i * width + j];
    }
  }
  /* the statistics describe the dataset as stored: fill values are elements like any other */
  assert_int_equal(sc->stats.count, rows * width);
  assert_int_equal(sc->stats.inf_count, fill);
  assert_int_equal(sc->stats.neginf_count, fill);
  assert_int_equal(sc->stats.posinf_count, 0);
  assert_int_equal(sc->stats.finite_count, written);
  assert_int_equal(tk->stats.count, rows * width);
  assert_int_equal(tk->stats.finite_count, rows * width);
  assert_true(tk->stats.has_range && !tk->stats.has_rms);
  assert_true(tk->stats.min == topk_min);
  assert_true(fabs(tk->stats.mean - topk_sum / (double)(rows * width)) < 1e-9 * fabs(topk_sum) + 1e-12);
  /* reading an int tap as float converts; reading a float tap as int refuses */
  assert_int_equal(st_trace_read_f32(t, tk, 0, 1, s), ST_OK);
  assert_true(s[0] == (float)ival(lo, 0));
  assert_int_equal(st_trace_read_i32(t, sc, 0, 1, k), ST_EINVAL);
  assert_int_equal(st_trace_read_f32(t, sc, rows - 1, 2, s), ST_EINVAL); /* past the end */
}

/* Row taps are never filtered: 2 rows whatever the positions spec. */
static void check_rows(st_trace *t) {
  const st_trace_tap *tap = st_trace_find_tap_id(t, ST_TAP_INDEXER_K, 2);
  assert_non_null(tap);
  assert_int_equal(tap->row_axis, 1);
  assert_int_equal(tap->has_positions, 0);
  assert_int_equal(tap->shape[0], 2);
  assert_int_equal(tap->shape[1], 4);
  float v[8];
  assert_int_equal(st_trace_read_f32(t, tap, 0, 2, v), ST_OK);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) assert_true(v[i * 4 + j] == fval(2, i, j));
}

static void check_logits(st_trace *t, int64_t lo, int64_t hi) {
  const st_trace_tap *tap = st_trace_find_tap(t, "logits");
  int64_t first = ST_MAX(lo, 5), last = ST_MIN(hi, N_TOKENS);
  assert_non_null(tap);
  assert_int_equal(tap->layer, -1);
  assert_int_equal(tap->shape[0], last - first);
  assert_int_equal(tap->has_positions, 1); /* never position 0..n-1 */
  int64_t pos[8];
  float v[8 * V];
  assert_int_equal(st_trace_read_positions(t, tap, pos), ST_OK);
  assert_int_equal(st_trace_read_f32(t, tap, 0, last - first, v), ST_OK);
  for (int64_t i = 0; i < last - first; i++) {
    assert_int_equal(pos[i], first + i);
    for (int j = 0; j < V; j++) assert_true(v[i * V + j] == fval(-1, first + i, j));
  }
}

static void check_metadata(st_trace *t, const st_run_meta *m, const char *positions) {
  assert_true(st_trace_is_complete(t));
  assert_string_equal(st_trace_attr(t, "run_id"), m->run_id);
  assert_string_equal(st_trace_attr(t, "model"), "tiny-dsv4");
  assert_string_equal(st_trace_attr(t, "model_dir"), "/models/tiny-dsv4");
  assert_string_equal(st_trace_attr(t, "settings"), m->settings_json);
  assert_string_equal(st_trace_attr(t, "config"), m->config_json);
  assert_string_equal(st_trace_attr(t, "build_revision"), st_build_revision);
  assert_string_equal(st_trace_attr(t, "compiler"), st_build_compiler);
  assert_string_equal(st_trace_attr(t, "build_type"), st_build_type);
  assert_string_equal(st_trace_attr(t, "backend"), "cpu-ref");
  assert_string_equal(st_trace_attr(t, "kernel_mode"), "deterministic");
  assert_string_equal(st_trace_attr(t, "positions"), positions);
  assert_string_equal(st_trace_attr(t, "command_line"), "sparsetrace run --test");
  assert_null(st_trace_attr(t, "request_id"));
  const char *created = st_trace_attr(t, "created_at");
  assert_non_null(created);
  assert_int_equal(strlen(created), 24); /* 2025-01-01T00:00:00.000Z */
  assert_int_equal(created[23], 'Z');
  assert_int_equal(st_trace_attr_int(t, "threads", -1), 2);
  assert_int_equal(st_trace_attr_int(t, "schema_version", -1), ST_TRACE_SCHEMA_VERSION);
  assert_int_equal(st_trace_attr_int(t, "complete", -1), 1);
  /* forward order: layer 0, then layer 2 in catalogue order, logits last */
  assert_int_equal(st_trace_tap_count(t), 7);
  assert_string_equal(st_trace_tap_at(t, 0)->name, "layers.0.input");
  assert_string_equal(st_trace_tap_at(t, 1)->name, "layers.2.indexer.q");
  assert_string_equal(st_trace_tap_at(t, 2)->name, "layers.2.indexer.k");
  assert_string_equal(st_trace_tap_at(t, 6)->name, "logits");
}

/* ------------------------------------------------------------------ h5py */

static const char *h5py_script =
  "import sys, math, h5py, numpy as np\n"
  "path, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
  "def fval(layer, pos, j): return float(pos * 100 + j) + 0.25 * layer\n"
  "f = h5py.File(path, 'r')\n"
  "for k in ('run_id','model','settings','config','build_revision','compiler','build_type',\n"
  "          'backend','kernel_mode','created_at','command_line','positions'):\n"
  "    assert isinstance(f.attrs[k], str), (k, type(f.attrs[k]))\n"
  "assert f.attrs['model'] == 'tiny-dsv4'\n"
  "assert int(f.attrs['schema_version']) == 1 and int(f.attrs['threads']) == 2\n"
  "assert f.attrs['writer_cpu_s'].dtype == np.float64 and f.attrs['writer_cpu_s'] > 0\n"
  "assert f.attrs['emit_wait_s'].dtype == np.float64 and f.attrs['emit_wait_s'] >= 0\n"
  "assert int(f.attrs['writer_peak_queued']) > 0\n"
  "tok = f['tokens']\n"
  "assert tok.dtype == np.int32 and list(tok[()]) == [11,12,13,14,15,16,101,102,103]\n"
  "assert int(tok.attrs['n_prompt']) == 6\n"
  "x = f['taps/layers.0.input']\n"
  "assert x.dtype == np.float32 and x.shape == (hi - lo, 2, 3), x.shape\n"
  "assert x.maxshape == (None, None, None) and x.compression is None\n"
  "assert x.attrs['tap'] == 'input' and int(x.attrs['layer']) == 0\n"
  "assert x.attrs['dtype'] == 'float32' and x.attrs['axis0'] == 'position'\n"
  "assert x.attrs['shape_doc'].startswith('[T, hc, D]')\n"
  "assert int(x.attrs['count']) == (hi - lo) * 6\n"
  "a = x[()]\n"
  "for i in range(hi - lo):\n"
  "    for j in range(6):\n"
  "        p = lo + i\n"
  "        if p == 3 and j == 0: assert math.isnan(a[i].flat[j])\n"
  "        elif p == 3 and j == 1: assert a[i].flat[j] == np.inf\n"
  "        else: assert a[i].flat[j] == fval(0, p, j), (i, j, a[i].flat[j])\n"
  "if lo > 0:\n"
  "    assert x.attrs['positions'] == '/positions/layers.0.input'\n"
  "    assert list(f['positions/layers.0.input'][()]) == list(range(lo, hi))\n"
  "else:\n"
  "    assert 'positions' not in x.attrs\n"
  "s = f['taps/layers.2.indexer.scores'][()]\n"
  "width = max(hi // 4, 1)\n"
  "assert s.shape == (hi - lo, width)\n"
  "for i in range(hi - lo):\n"
  "    p = lo + i; R = 1 if p < 6 else (p + 1) // 4\n"
  "    for j in range(width):\n"
  "        assert s[i, j] == (fval(2, p, j) if j < R else -np.inf), (i, j, s[i, j])\n"
  "k = f['taps/layers.2.indexer.topk']\n"
  "assert k.dtype == np.int32 and (width == 1 or k[0, 1] == -1)\n"
  "kr = f['taps/layers.2.indexer.k']\n"
  "assert kr.shape == (2, 4) and kr.attrs['axis0'] == 'compressed_row' and kr[1, 3] == fval(2, 1, 3)\n"
  "lg = f['taps/logits']\n"
  "first = max(lo, 5)\n"
  "assert list(f['positions/logits'][()]) == list(range(first, min(hi, 9)))\n"
  "assert int(lg.attrs['layer']) == -1\n"
  "print('h5py ok', path)\n";

/* Runs the checks above under /usr/bin/python3 with h5py. 0 ok, 77 h5py missing, else failed. */
static int h5py_check(const char *h5, int64_t lo, int64_t hi) {
  if (system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") != 0) return 77;
  char script[512], cmd[2048];
  snprintf(script, sizeof script, "%s/check_h5py.py", tmp_root);
  FILE *f = fopen(script, "w");
  if (!f) return 1;
  fputs(h5py_script, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s %lld %lld", script, h5, (long long)lo,
           (long long)hi);
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
}

/* ------------------------------------------------------------------ index helpers */

static int64_t index_count(const char *store, const char *sql) {
  st_index *ix = NULL;
  if (st_index_open(store, ST_INDEX_READ_ONLY, &ix) != ST_OK) return -1;
  sqlite3_stmt *s = NULL;
  int64_t n = -2;
  if (sqlite3_prepare_v2(st_index_db(ix), sql, -1, &s, NULL) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW)
    n = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  st_index_close(ix);
  return n;
}

static int file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* ------------------------------------------------------------------ tests */

/* Full round trip for one positions spec; [lo, hi) are the positions it keeps. */
static void round_trip(const char *name, const char *spec, int64_t lo, int64_t hi) {
  char store[512], h5[600], part[640];
  make_tmp(store, sizeof store, name);
  snprintf(h5, sizeof h5, "%s/runs/sub/run.h5", store); /* runs/sub created on demand */
  snprintf(part, sizeof part, "%s.part", h5);
  st_run_meta meta;
  fill_meta(&meta, spec);
  st_recorder *r = record_scenario(h5, store, &meta);
  /* while recording: a .part file, no trace, no index row */
  assert_true(file_exists(part));
  assert_false(file_exists(h5));
  assert_true(index_count(store, "SELECT count(*) FROM runs") <= 0);
  st_status st = st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT);
  if (st) fail_msg("finish: %s", st_errmsg());
  assert_false(file_exists(part));
  assert_true(file_exists(h5));

  st_trace *t = NULL;
  st = st_trace_open(h5, 0, &t);
  if (st) fail_msg("open: %s", st_errmsg());
  check_metadata(t, &meta, spec);
  check_tokens(t);
  check_input(t, lo, hi);
  check_scores(t, lo, hi);
  check_rows(t);
  check_logits(t, lo, hi);
  st_trace_close(t);

  int rc = h5py_check(h5, lo, hi);
  if (rc == 77) fprintf(stderr, "note: /usr/bin/python3 has no h5py; stock-reader check skipped\n");
  else assert_int_equal(rc, 0);

  /* the index holds the run, its build and its taps */
  char sql[512];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE run_id = '%s' AND n_prompt = 6 AND "
           "n_tokens = 9 AND n_generated = 3 AND trace_path = 'runs/sub/run.h5' AND precision = "
           "'exact' AND rotate = 'none' AND topk = '64' AND tap_positions = '%s' AND duration_s >= 0",
           meta.run_id, spec);
  assert_int_equal(index_count(store, sql), 1);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM taps WHERE run_id = '%s'", meta.run_id);
  assert_int_equal(index_count(store, sql), 7);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM taps WHERE run_id = '%s' AND name = "
           "'layers.0.input' AND layer = 0 AND tap = 'input' AND shape = '[%lld,2,3]' AND "
           "nan_count = %d AND inf_count = %d AND axis0 = 'position' AND has_positions = %d",
           meta.run_id, (long long)(hi - lo), lo <= 3 && hi > 3, lo <= 3 && hi > 3, lo != 0);
  assert_int_equal(index_count(store, sql), 1);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM tap_summary WHERE run_id = '%s' AND name = "
           "'logits' AND layer IS NULL AND revision = '%s'", meta.run_id, st_build_revision);
  assert_int_equal(index_count(store, sql), 1);
  assert_int_equal(index_count(store, "SELECT count(*) FROM taps WHERE name = "
                                      "'layers.2.indexer.k' AND axis0 = 'compressed_row' AND rows = 2"), 1);
}

static void test_round_trip_all(void **state) { round_trip("all", "all", 0, N_TOKENS); }
static void test_round_trip_last(void **state) { round_trip("last", "last", N_PROMPT - 1, N_TOKENS); }
static void test_round_trip_range(void **state) { round_trip("range", "2:7", 2, 7); }

static void test_open_end_ranges(void **state) {
  char store[512], h5[600];
  make_tmp(store, sizeof store, "openend");
  snprintf(h5, sizeof h5, "%s/a.h5", store);
  st_run_meta meta;
  fill_meta(&meta, "7:");
  st_recorder *r = record_scenario(h5, NULL, &meta);
  assert_int_equal(st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT), ST_OK);
  st_trace *t = NULL;
  assert_int_equal(st_trace_open(h5, 0, &t), ST_OK);
  check_input(t, 7, N_TOKENS);
  st_trace_close(t);
  /* no store: no index */
  char ixpath[600];
  snprintf(ixpath, sizeof ixpath, "%s/index.sqlite", store);
  assert_false(file_exists(ixpath));
  const char *bad[] = {"first", "5:3", "3:3", "a:b", "-1:4", "2:x"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    fill_meta(&meta, bad[i]);
    snprintf(h5, sizeof h5, "%s/bad%zu.h5", store, i);
    assert_int_equal(st_recorder_open(h5, NULL, &meta, N_PROMPT, &r), ST_EINVAL);
    assert_non_null(strstr(st_errmsg(), bad[i]));
    assert_false(file_exists(h5));
  }
}

static void test_abort_keeps_part(void **state) {
  char store[512], h5[600], part[640];
  make_tmp(store, sizeof store, "abort");
  snprintf(h5, sizeof h5, "%s/runs/x.h5", store);
  snprintf(part, sizeof part, "%s.part", h5);
  st_run_meta meta;
  fill_meta(&meta, "all");
  st_recorder *r = record_scenario(h5, store, &meta);
  st_recorder_abort(r);
  st_recorder_abort(NULL);
  assert_true(file_exists(part));
  assert_false(file_exists(h5));
  assert_true(index_count(store, "SELECT count(*) FROM runs") <= 0);
  /* the .part is refused by default, readable on request, and the final name explains it */
  st_trace *t = NULL;
  assert_int_equal(st_trace_open(part, 0, &t), ST_EFORMAT);
  assert_non_null(strstr(st_errmsg(), part));
  assert_non_null(strstr(st_errmsg(), "unfinished"));
  assert_int_equal(st_trace_open(h5, 0, &t), ST_ENOTFOUND);
  assert_non_null(strstr(st_errmsg(), "never finished"));
  assert_int_equal(st_trace_open(part, ST_TRACE_OPEN_INCOMPLETE, &t), ST_OK);
  assert_false(st_trace_is_complete(t));
  assert_true(st_trace_tap_count(t) <= 7); /* abort drops what was still queued */
  st_trace_close(t);
  /* a finished trace is never overwritten */
  fill_meta(&meta, "all");
  r = record_scenario(h5, store, &meta);
  assert_int_equal(st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT), ST_OK);
  assert_int_equal(st_recorder_open(h5, store, &meta, N_PROMPT, &r), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "already exists"));
  assert_int_equal(index_count(store, "SELECT count(*) FROM runs"), 1);
}

static void copy_file(const char *from, const char *to, long keep_bytes, long zero_at,
                      long zero_len) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  assert_non_null(in);
  assert_non_null(out);
  char buf[4096];
  long off = 0;
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
    for (size_t i = 0; i < n; i++, off++) {
      if (keep_bytes >= 0 && off >= keep_bytes) goto done;
      char c = buf[i];
      if (off >= zero_at && off < zero_at + zero_len) c = (char)0xA5;
      fputc(c, out);
    }
  }
done:
  fclose(in);
  fclose(out);
}

/* Opens path and reads every tap; returns the first error (never crashes). */
static st_status open_and_read_all(const char *path) {
  st_trace *t = NULL;
  st_status st = st_trace_open(path, 0, &t);
  if (st) return st;
  for (int i = 0; !st && i < st_trace_tap_count(t); i++) {
    const st_trace_tap *tap = st_trace_tap_at(t, i);
    size_t n = (size_t)tap->shape[0] * st_trace_row_elements(tap);
    float *buf = malloc(ST_MAX(n, 1) * sizeof *buf);
    int64_t *pos = malloc((size_t)ST_MAX(tap->shape[0], 1) * sizeof *pos);
    st = st_trace_read_f32(t, tap, 0, tap->shape[0], buf);
    if (!st) st = st_trace_read_positions(t, tap, pos);
    free(buf);
    free(pos);
  }
  st_trace_close(t);
  return st;
}

static void test_corrupt_traces(void **state) {
  char dir[512], h5[600], bad[640];
  make_tmp(dir, sizeof dir, "corrupt");
  snprintf(h5, sizeof h5, "%s/good.h5", dir);
  st_run_meta meta;
  fill_meta(&meta, "all");
  st_recorder *r = record_scenario(h5, NULL, &meta);
  assert_int_equal(st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT), ST_OK);
  assert_int_equal(open_and_read_all(h5), ST_OK);
  struct stat sb;
  assert_int_equal(stat(h5, &sb), 0);

  /* truncated at several lengths */
  long cuts[] = {0, 7, 512, sb.st_size / 2, sb.st_size - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
    snprintf(bad, sizeof bad, "%s/truncated%zu.h5", dir, i);
    copy_file(h5, bad, cuts[i], 0, 0);
    st_status st = open_and_read_all(bad);
    assert_int_not_equal(st, ST_OK);
    assert_non_null(strstr(st_errmsg(), bad));
  }
  /* garbage, and a file with garbage in the middle: an error or a clean read, never a crash */
  snprintf(bad, sizeof bad, "%s/garbage.h5", dir);
  FILE *f = fopen(bad, "wb");
  for (int i = 0; i < 5000; i++) fputc((i * 7919) & 0xff, f);
  fclose(f);
  assert_int_equal(open_and_read_all(bad), ST_EFORMAT);
  assert_non_null(strstr(st_errmsg(), "not a readable HDF5 file"));
  for (long at = 0; at < sb.st_size; at += sb.st_size / 16) {
    snprintf(bad, sizeof bad, "%s/smashed%ld.h5", dir, at);
    copy_file(h5, bad, -1, at, 256);
    st_status st = open_and_read_all(bad);
    if (st) assert_non_null(strstr(st_errmsg(), bad));
  }
  /* an HDF5 file that is not a trace */
  snprintf(bad, sizeof bad, "%s/other.h5", dir);
  hid_t other = H5Fcreate(bad, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Fclose(other);
  assert_int_equal(open_and_read_all(bad), ST_EFORMAT);
  assert_non_null(strstr(st_errmsg(), "not a sparsetrace trace"));
  /* missing, and a directory */
  snprintf(bad, sizeof bad, "%s/missing.h5", dir);
  assert_int_equal(open_and_read_all(bad), ST_ENOTFOUND);
  assert_int_equal(open_and_read_all(dir), ST_EINVAL);
}

/* Each of several workers records `runs_each` runs into one store. */
typedef struct worker {
  const char *store;
  int id, runs_each;
  st_status result;
  char message[512];
} worker;

static void *record_runs(void *arg) {
  worker *w = arg;
  w->result = ST_OK;
  for (int i = 0; i < w->runs_each && !w->result; i++) {
    char h5[700];
    st_run_meta meta;
    fill_meta(&meta, i % 2 ? "last" : "all");
    snprintf(h5, sizeof h5, "%s/runs/%s.h5", w->store, meta.run_id);
    st_recorder *r = NULL;
    w->result = st_recorder_open(h5, w->store, &meta, N_PROMPT, &r);
    if (w->result) break;
    for (int64_t p = 0; p < N_TOKENS; p++) {
      float v[6];
      for (int j = 0; j < 6; j++) v[j] = fval(w->id, p, j);
      int64_t shape[3] = {1, 2, 3};
      emit(r, ST_TAP_INPUT, 0, p, ST_F32, 3, shape, v);
    }
    w->result = st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT);
  }
  if (w->result) snprintf(w->message, sizeof w->message, "%s", st_errmsg());
  return NULL;
}

static void test_concurrent_writers(void **state) {
  char store[512];
  make_tmp(store, sizeof store, "concurrent");
  enum { PROCS = 3, THREADS = 3, RUNS = 4 };
  /* processes: each child records RUNS runs; all start with no index present */
  pid_t pids[PROCS];
  for (int i = 0; i < PROCS; i++) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) {
      worker w = {store, i, RUNS, ST_OK, ""};
      record_runs(&w);
      if (w.result) fprintf(stderr, "child %d: %s\n", i, w.message);
      _exit(w.result ? 1 : 0);
    }
  }
  /* threads in this process, at the same time */
  pthread_t th[THREADS];
  worker ws[THREADS];
  for (int i = 0; i < THREADS; i++) {
    ws[i] = (worker){store, 10 + i, RUNS, ST_OK, ""};
    assert_int_equal(pthread_create(&th[i], NULL, record_runs, &ws[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    if (ws[i].result) fail_msg("thread %d: %s", i, ws[i].message);
  }
  for (int i = 0; i < PROCS; i++) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  assert_int_equal(index_count(store, "SELECT count(*) FROM runs"), (PROCS + THREADS) * RUNS);
  assert_int_equal(index_count(store, "SELECT count(*) FROM taps"), (PROCS + THREADS) * RUNS);
  assert_int_equal(index_count(store, "SELECT count(*) FROM builds"), 1);
  assert_int_equal(index_count(store, "SELECT count(*) FROM taps WHERE rows = 9"),
                   (PROCS + THREADS) * RUNS / 2);
}

static void test_unwritable(void **state) {
  char dir[512], path[700];
  make_tmp(dir, sizeof dir, "unwritable");
  /* a regular file where a directory is needed: fails even as root */
  snprintf(path, sizeof path, "%s/afile", dir);
  FILE *f = fopen(path, "w");
  fputs("x", f);
  fclose(f);
  st_run_meta meta;
  fill_meta(&meta, "all");
  st_recorder *r = NULL;
  snprintf(path, sizeof path, "%s/afile/runs/x.h5", dir);
  assert_int_equal(st_recorder_open(path, NULL, &meta, N_PROMPT, &r), ST_EIO);
  assert_null(r);
  assert_non_null(strstr(st_errmsg(), "afile"));
  /* a read-only directory (meaningless for root, who may write anyway) */
  if (geteuid() != 0) {
    char ro[600];
    snprintf(ro, sizeof ro, "%s/readonly", dir);
    mkdir(ro, 0555);
    snprintf(path, sizeof path, "%s/x.h5", ro);
    assert_int_equal(st_recorder_open(path, NULL, &meta, N_PROMPT, &r), ST_EIO);
    assert_non_null(strstr(st_errmsg(), "x.h5.part"));
    chmod(ro, 0755);
  }
  /* the trace can be written but the store cannot be created: refused before recording */
  char store[600];
  snprintf(store, sizeof store, "%s/afile/store", dir);
  snprintf(path, sizeof path, "%s/ok.h5", dir);
  assert_int_equal(st_recorder_open(path, store, &meta, N_PROMPT, &r), ST_EIO);
  assert_non_null(strstr(st_errmsg(), "afile"));
  assert_false(file_exists(path));
  /* an index file that is not SQLite */
  snprintf(store, sizeof store, "%s/garbage-store", dir);
  mkdir(store, 0777);
  char ix[700];
  snprintf(ix, sizeof ix, "%s/index.sqlite", store);
  f = fopen(ix, "w");
  for (int i = 0; i < 4096; i++) fputc('z', f);
  fclose(f);
  snprintf(path, sizeof path, "%s/ok2.h5", dir);
  fill_meta(&meta, "all");
  /* refused before recording: the trace path is checked against the index at open */
  assert_int_equal(st_recorder_open(path, store, &meta, N_PROMPT, &r), ST_EFORMAT);
  assert_non_null(strstr(st_errmsg(), "not a SQLite database"));
}

/* Issue 14 #1. Before: reusing a trace path whose file was removed ran the whole recording and
** failed at the index insert (UNIQUE constraint failed: runs.trace_path), leaving the old row on
** a file that held the new run; and the first run into a new store with a trace outside it was
** indexed with the path as given (relative to the cwd), later ones absolutely. */
static void test_trace_path_reuse(void **state) {
  char dir[512], store[600], h5[700], sql[4300];
  make_tmp(dir, sizeof dir, "pathreuse");
  snprintf(store, sizeof store, "%s/S", dir);
  snprintf(h5, sizeof h5, "%s/mine.h5", store);
  st_run_meta meta;
  fill_meta(&meta, "all");
  st_recorder *r = record_scenario(h5, store, &meta);
  assert_int_equal(st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT), ST_OK);
  char first[64];
  snprintf(first, sizeof first, "%s", meta.run_id);
  assert_int_equal(index_count(store, "SELECT count(*) FROM runs WHERE trace_path = 'mine.h5'"), 1);
  unlink(h5);
  /* the same path again: refused at open, naming the run, nothing recorded */
  fill_meta(&meta, "all");
  r = NULL;
  assert_int_equal(st_recorder_open(h5, store, &meta, N_PROMPT, &r), ST_EINVAL);
  assert_null(r);
  assert_non_null(strstr(st_errmsg(), first));
  assert_non_null(strstr(st_errmsg(), "--force"));
  assert_false(file_exists(h5));
  /* --force: recorded, the stale row replaced, a note kept */
  fill_meta(&meta, "all");
  meta.force = 1;
  r = record_scenario(h5, store, &meta);
  assert_int_equal(st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT), ST_OK);
  assert_int_equal(index_count(store, "SELECT count(*) FROM runs"), 1);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE run_id = '%s' AND trace_path = 'mine.h5'", meta.run_id);
  assert_int_equal(index_count(store, sql), 1);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM taps WHERE run_id = '%s'", first);
  assert_int_equal(index_count(store, sql), 0);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM store_notes WHERE kind = 'replaced' AND run_id = '%s'", first);
  assert_int_equal(index_count(store, sql), 1);
  /* --force over an existing file too */
  fill_meta(&meta, "all");
  assert_int_equal(st_recorder_open(h5, store, &meta, N_PROMPT, &r), ST_EINVAL);
  meta.force = 1;
  r = record_scenario(h5, store, &meta);
  assert_int_equal(st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT), ST_OK);
  assert_int_equal(index_count(store, "SELECT count(*) FROM runs"), 1);
  /* one path rule from the first run on: a relative trace outside a new store is absolute */
  char cwd[4096], real[4096], store2[600];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(dir), 0);
  assert_non_null(realpath(".", real));
  snprintf(store2, sizeof store2, "%s/newstore", dir);
  fill_meta(&meta, "all");
  r = record_scenario("outside.h5", store2, &meta);
  assert_int_equal(st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT), ST_OK);
  assert_int_equal(chdir(cwd), 0);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE trace_path = '%s/outside.h5'", real);
  assert_int_equal(index_count(store2, sql), 1);
  char resolved[4096];
  assert_int_equal(st_index_resolve_trace(store2, real, resolved, sizeof resolved), 0);
}

static void test_bad_emits(void **state) {
  char dir[512], path[700];
  make_tmp(dir, sizeof dir, "bademit");
  snprintf(path, sizeof path, "%s/x.h5", dir);
  st_run_meta meta;
  fill_meta(&meta, "all");
  st_recorder *r = NULL;
  assert_int_equal(st_recorder_open(path, NULL, &meta, N_PROMPT, &r), ST_OK);
  float v[12] = {0};
  int64_t s2[2] = {1, 6}, s3[3] = {1, 2, 3}, s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  /* caught on the caller's thread */
  assert_int_equal(emit(r, ST_TAP_LOGITS, 3, 0, ST_F32, 2, s2, v), ST_EINVAL);  /* model tap with a layer */
  assert_int_equal(emit(r, ST_TAP_INPUT, -1, 0, ST_F32, 3, s3, v), ST_EINVAL);  /* layer tap without */
  assert_int_equal(emit(r, ST_TAP_INPUT, 0, 0, ST_F32, 9, s9, v), ST_EINVAL);   /* rank 9 */
  assert_int_equal(emit(r, ST_TAP_INPUT, 0, 0, ST_F4_E2M1, 3, s3, v), ST_EUNSUPPORTED);
  assert_int_equal(emit(r, (st_tap_id)ST_TAP_COUNT, 0, 0, ST_F32, 3, s3, v), ST_EINVAL);
  /* caught on the writer thread: rank changes; sticky, reported by finish */
  assert_int_equal(emit(r, ST_TAP_INPUT, 0, 0, ST_F32, 3, s3, v), ST_OK);
  assert_int_equal(emit(r, ST_TAP_INPUT, 0, 1, ST_F32, 2, s2, v), ST_OK);
  st_status st = st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT);
  assert_int_equal(st, ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "layers.0.input"));
  assert_non_null(strstr(st_errmsg(), "partial file kept"));
  char part[720];
  snprintf(part, sizeof part, "%s.part", path);
  assert_true(file_exists(part));
  /* inconsistent tokens */
  snprintf(path, sizeof path, "%s/y.h5", dir);
  assert_int_equal(st_recorder_open(path, NULL, &meta, N_PROMPT, &r), ST_OK);
  assert_int_equal(st_recorder_finish(r, tokens, 3, 5), ST_EINVAL);
}

/* Writer alone: many blocks through a tiny queue; the engine side blocks instead of queueing
** without bound, and every row arrives. Also float16/bf16/int8 dtypes and a deflate variant. */
static void test_backpressure_and_dtypes(void **state) {
  char dir[512], path[700];
  make_tmp(dir, sizeof dir, "writer");
  for (int deflate = 0; deflate <= 1; deflate++) {
    snprintf(path, sizeof path, "%s/w%d.h5", dir, deflate);
    st_trace_run_attrs attrs = {.run_id = "r", .settings_json = "{}", .positions = "all"};
    st_trace_writer_options opts = {.queue_limit_bytes = 64 << 10, .deflate_level = deflate};
    st_trace_writer *w = NULL;
    assert_int_equal(st_trace_writer_open(path, &attrs, &opts, &w), ST_OK);
    enum { ROWS = 400, D = 1024 };
    static float row[D];
    int64_t shape[3] = {1, 1, D};
    for (int p = 0; p < ROWS; p++) {
      for (int j = 0; j < D; j++) row[j] = (float)(p * D + j);
      assert_int_equal(st_trace_writer_append(w, ST_TAP_INPUT, 1, p, ST_F32, 3, shape, row), ST_OK);
    }
    /* a block larger than the whole queue limit still goes through */
    static float big[64 * D];
    int64_t bshape[3] = {64, 1, D};
    for (int i = 0; i < 64 * D; i++) big[i] = (float)(ROWS * D + i);
    assert_int_equal(st_trace_writer_append(w, ST_TAP_INPUT, 1, ROWS, ST_F32, 3, bshape, big), ST_OK);
    size_t peak = st_trace_writer_peak_queued(w);
    assert_true(peak <= sizeof big);
    uint16_t half[4] = {0x3C00, 0xC000, 0x7C00, 0x0000}; /* 1, -2, inf, 0 */
    uint16_t bf[4] = {0x3F80, 0xC000, 0x7FC0, 0x0000};   /* 1, -2, nan, 0 */
    int8_t i8[4] = {-3, 0, 5, 127};
    int64_t s4[2] = {1, 4};
    assert_int_equal(st_trace_writer_append(w, ST_TAP_ATTN_X, 0, 0, ST_F16, 2, s4, half), ST_OK);
    assert_int_equal(st_trace_writer_append(w, ST_TAP_ATTN_QR, 0, 0, ST_BF16, 2, s4, bf), ST_OK);
    assert_int_equal(st_trace_writer_append(w, ST_TAP_FFN_EXPERTS, 0, 0, ST_I8, 2, s4, i8), ST_OK);
    int32_t tok[3] = {1, 2, 3};
    st_trace_tap *taps = NULL;
    int n_taps = 0;
    assert_int_equal(st_trace_writer_finish(w, tok, 3, 2, &taps, &n_taps), ST_OK);
    assert_int_equal(n_taps, 4);
    assert_string_equal(taps[0].name, "layers.1.input");
    assert_int_equal(taps[0].shape[0], ROWS + 64);
    assert_int_equal(taps[0].stats.count, (ROWS + 64) * D);
    assert_true(taps[0].stats.max == (double)((ROWS + 64) * D - 1));
    free(taps);

    st_trace *t = NULL;
    assert_int_equal(st_trace_open(path, 0, &t), ST_OK);
    const st_trace_tap *in = st_trace_find_tap(t, "layers.1.input");
    float *all = malloc((ROWS + 64) * D * sizeof *all);
    assert_int_equal(st_trace_read_f32(t, in, 0, ROWS + 64, all), ST_OK);
    for (int i = 0; i < (ROWS + 64) * D; i++)
      if (all[i] != (float)i) fail_msg("element %d is %g", i, all[i]);
    free(all);
    float f[4];
    int32_t k[4];
    assert_int_equal(st_trace_read_f32(t, st_trace_find_tap(t, "layers.0.attn.x"), 0, 1, f), ST_OK);
    assert_true(f[0] == 1 && f[1] == -2 && isinf(f[2]) && f[3] == 0);
    const st_trace_tap *qr = st_trace_find_tap(t, "layers.0.attn.qr");
    assert_int_equal(qr->dtype, ST_BF16);
    assert_int_equal(qr->stats.nan_count, 1);
    assert_int_equal(st_trace_read_f32(t, qr, 0, 1, f), ST_OK);
    assert_true(f[0] == 1 && f[1] == -2 && isnan(f[2]) && f[3] == 0);
    assert_int_equal(st_trace_read_i32(t, st_trace_find_tap(t, "layers.0.ffn.experts"), 0, 1, k), ST_OK);
    assert_true(k[0] == -3 && k[3] == 127);
    st_trace_close(t);
  }
}

static double file_attr_double(const char *path, const char *name) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t a = f < 0 ? -1 : H5Aopen(f, name, H5P_DEFAULT);
  double v = -1;
  if (a < 0 || H5Aread(a, H5T_NATIVE_DOUBLE, &v) < 0) v = -1;
  if (a >= 0) H5Aclose(a);
  if (f >= 0) H5Fclose(f);
  return v;
}

/* The indexer.scores pattern of a chunked prefill: blocks of 256 query rows, each as wide as the
** compressed rows existing at its end (R = (p0 + 256) / 4), so axis 1 grows with every block.
** The file must hold about the bytes written (the -inf triangle right of each block is fill,
** never stored), every value and fill must read back, and the cost attributes must be there. */
static void test_growing_width_layout(void **state) {
  char dir[512], path[700];
  make_tmp(dir, sizeof dir, "growing");
  snprintf(path, sizeof path, "%s/g.h5", dir);
  st_trace_run_attrs attrs = {.run_id = "r", .settings_json = "{}", .positions = "all"};
  st_trace_writer *w = NULL;
  assert_int_equal(st_trace_writer_open(path, &attrs, NULL, &w), ST_OK);
  enum { T = 4096, C = 256, M = 4, R = T / M };
  float *block = malloc(sizeof(float) * C * R);
  assert_non_null(block);
  int64_t written = 0;
  for (int64_t p0 = 0; p0 < T; p0 += C) {
    int64_t width = (p0 + C) / M;
    for (int64_t i = 0; i < C; i++)
      for (int64_t j = 0; j < width; j++)
        block[i * width + j] = j < (p0 + i + 1) / M ? (float)((p0 + i) * 10000 + j) : -INFINITY;
    int64_t shape[2] = {C, width};
    assert_int_equal(st_trace_writer_append(w, ST_TAP_INDEXER_SCORES, 1, p0, ST_F32, 2, shape, block),
                     ST_OK);
    written += C * width * (int64_t)sizeof(float);
  }
  int32_t tok[1] = {0};
  assert_int_equal(st_trace_writer_finish(w, tok, 1, 1, NULL, NULL), ST_OK);

  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  hid_t d = H5Dopen2(f, "taps/layers.1.indexer.scores", H5P_DEFAULT);
  assert_true(d >= 0);
  hid_t space = H5Dget_space(d);
  hsize_t dims[2] = {0, 0};
  H5Sget_simple_extent_dims(space, dims, NULL);
  assert_int_equal(dims[0], T);
  assert_int_equal(dims[1], R);
  hsize_t storage = H5Dget_storage_size(d);
  /* about the bytes written: no chunk of the never-written triangle is stored */
  assert_true((int64_t)storage >= written && (double)storage <= 1.1 * (double)written);
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
  assert_true(file_attr_double(path, "writer_cpu_s") > 0);
  assert_true(file_attr_double(path, "emit_wait_s") >= 0);

  st_trace *t = NULL;
  assert_int_equal(st_trace_open(path, 0, &t), ST_OK);
  const st_trace_tap *sc = st_trace_find_tap(t, "layers.1.indexer.scores");
  assert_non_null(sc);
  float *row = malloc(sizeof(float) * R);
  assert_non_null(row);
  for (int64_t p = 0; p < T; p += 37) {
    assert_int_equal(st_trace_read_f32(t, sc, p, 1, row), ST_OK);
    for (int64_t j = 0; j < R; j++) {
      float want = j < (p + 1) / M ? (float)(p * 10000 + j) : -INFINITY;
      if (row[j] != want) fail_msg("row %lld column %lld is %g, not %g", (long long)p, (long long)j, row[j], want);
    }
  }
  free(row);
  st_trace_close(t);
  free(block);
}

static int setup(void **state) {
  const char *base = getenv("TMPDIR");
  snprintf(tmp_root, sizeof tmp_root, "%s/st_test_recorder.XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(tmp_root)) return -1;
  return 0;
}

static int teardown(void **state) {
  if (getenv("ST_KEEP_TMP")) {
    fprintf(stderr, "kept %s\n", tmp_root);
    return 0;
  }
  char cmd[600];
  snprintf(cmd, sizeof cmd, "chmod -R u+w '%s' 2>/dev/null; rm -rf '%s'", tmp_root, tmp_root);
  return system(cmd) == 0 ? 0 : -1;
}

/* `test_recorder --fixture DIR`: records the scenario into the store DIR (positions all and
** last) plus an aborted DIR/runs/aborted.h5.part, for tests/test_query_cli.sh. */
static int write_fixture(const char *store) {
  const char *specs[] = {"all", "last"};
  for (int i = 0; i < 2; i++) {
    char h5[1024];
    st_run_meta meta;
    fill_meta(&meta, specs[i]);
    snprintf(h5, sizeof h5, "%s/runs/fixture-%s.h5", store, specs[i]);
    st_recorder *r = record_scenario(h5, store, &meta);
    if (st_recorder_finish(r, tokens, N_TOKENS, N_PROMPT)) {
      fprintf(stderr, "fixture: %s\n", st_errmsg());
      return 1;
    }
  }
  char h5[1024];
  st_run_meta meta;
  fill_meta(&meta, "all");
  snprintf(h5, sizeof h5, "%s/runs/aborted.h5", store);
  st_recorder_abort(record_scenario(h5, store, &meta));
  return 0;
}

/* `test_recorder --truncate FILE TAP ROWS`: cuts /taps/TAP of FILE to ROWS rows in place, as a
** hostile or careless h5py user would (dataset.resize), leaving every attribute as it was. */
static int truncate_tap(const char *file, const char *tap, long long rows) {
  hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
  char name[512];
  snprintf(name, sizeof name, "/taps/%s", tap);
  hid_t d = f < 0 ? -1 : H5Dopen2(f, name, H5P_DEFAULT);
  hid_t sp = d < 0 ? -1 : H5Dget_space(d);
  hsize_t dims[ST_TRACE_MAX_RANK];
  int rank = sp < 0 ? -1 : H5Sget_simple_extent_dims(sp, dims, NULL);
  int rc = 1;
  if (rank >= 1) {
    dims[0] = (hsize_t)rows;
    rc = H5Dset_extent(d, dims) < 0;
  }
  if (sp >= 0) H5Sclose(sp);
  if (d >= 0) H5Dclose(d);
  if (f >= 0) H5Fclose(f);
  if (rc) fprintf(stderr, "truncate: cannot cut %s of %s\n", name, file);
  return rc;
}

int main(int argc, char **argv) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  if (argc == 3 && !strcmp(argv[1], "--fixture")) return write_fixture(argv[2]);
  if (argc == 5 && !strcmp(argv[1], "--truncate")) return truncate_tap(argv[2], argv[3], atoll(argv[4]));
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_round_trip_all),
    cmocka_unit_test(test_round_trip_last),
    cmocka_unit_test(test_round_trip_range),
    cmocka_unit_test(test_open_end_ranges),
    cmocka_unit_test(test_abort_keeps_part),
    cmocka_unit_test(test_corrupt_traces),
    cmocka_unit_test(test_concurrent_writers),
    cmocka_unit_test(test_unwritable),
    cmocka_unit_test(test_trace_path_reuse),
    cmocka_unit_test(test_bad_emits),
    cmocka_unit_test(test_backpressure_and_dtypes),
    cmocka_unit_test(test_growing_width_layout),
  };
  return cmocka_run_group_tests_name("recorder", tests, setup, teardown);
}
