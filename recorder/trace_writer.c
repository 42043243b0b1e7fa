/*
** trace_writer.c — the HDF5 trace writer thread (layout: schemas/trace-layout.md).
**
** Design. The engine's thread calls st_trace_writer_append(), which copies the rows into one
** malloc'd block and links it onto a FIFO. The writer thread pops blocks in order and appends
** them to the tap's dataset, creating the dataset on the tap's first block. HDF5 is globally
** locked anyway, so one thread doing every HDF5 call loses nothing and keeps the engine free of
** disk latency. The queue is bounded in bytes: an append that would push it past the limit waits
** (backpressure) unless the queue is empty, so a single block larger than the limit still goes
** through. Nothing is ever dropped.
**
** Datasets. Every axis is extendible (maxshape None): axis 0 grows with each block, and inner
** axes grow when a later block is wider (indexer.scores gains a column each time a compressed
** row becomes visible). Elements never written read back as the fill value: -inf for floats,
** -1 for signed integers, 0 otherwise. Chunks aim at chunk_target_bytes (64 KiB) and never
** exceed 1 MiB, so each dataset's current chunk stays in HDF5's per-dataset chunk cache and an
** append is a memory copy until the chunk is full; they hold at most the first block's row
** count rounded up to a power of two (>= 16 rows), so a tiny model's trace stays small. No filter by default: activations recorded in
** float32 barely compress and deflate runs at ~40 MB/s (LIBRARIES.md §1.6), which would make the
** writer, not the engine, the bottleneck.
**
** Positions. A position tap's rows are token positions in the order emitted. The writer keeps
** them as runs of consecutive positions; if at the end they are not exactly 0, 1, ..., n-1 (a
** positions filter dropped some, or the tap was only emitted for some positions), it writes
** /positions/<name> (int64, one entry per row).
**
** Statistics (count, finite, NaN, +inf, -inf, min, max, mean, rms) are accumulated per tap while
** writing; at finish the fill value is added once per element never written, so they describe the
** dataset as stored (what numpy computes on it), and are stored as dataset attributes; the
** recorder copies them into the index.
**
** Cost accounting. The file attributes writer_cpu_s, emit_wait_s and writer_peak_queued say what
** recording cost the run: the writer thread's CPU time (HDF5, statistics, the kernel's copy into
** the page cache), and the time the engine's thread spent waiting for queue space (0 unless the
** writer fell queue_limit_bytes behind). A recorded run with emit_wait_s = 0 was never held back
** by the disk or HDF5; on a machine whose cores the engine fills it lost about writer_cpu_s
** (measured on 2 idle cores, 16k-token prefill with every indexer tap, 424 MB: writer_cpu_s 0.6,
** emit_wait_s 0, prefill 7.1-7.5 s against 6.5-6.6 s unrecorded).
*/
#define _GNU_SOURCE /* memfd_create */
#include "trace_writer.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "hdf5_util.h"

#define DEFAULT_QUEUE_LIMIT ((size_t)256 << 20)
#define DEFAULT_CHUNK_TARGET ((size_t)64 << 10)
#define MAX_CHUNK_BYTES ((size_t)1 << 20)
#define GROWABLE_AXIS_MIN_CHUNK 64 /* chunk width of an axis that grows (R, k) */
#define FLUSH_INTERVAL_S 1.0

typedef struct block {
  struct block *next;
  st_tap_id id;
  int layer;
  st_dtype dtype;
  int rank;
  int64_t shape[ST_TRACE_MAX_RANK];
  int64_t pos0;
  size_t nbytes;
  _Alignas(16) unsigned char data[];
} block;

typedef struct position_run {
  int64_t start, count;
} position_run;

typedef struct tap_state {
  st_trace_tap info; /* info.shape = current dataset extent */
  hid_t dset;
  hid_t file_type, mem_type;
  int64_t rows_appended; /* position taps: rows written so far */
  position_run *runs;
  size_t n_runs, cap_runs;
  double sum, sumsq;
  int64_t n_ranged; /* values that entered min/max/sum */
} tap_state;

struct st_trace_writer {
  char *path;
  st_trace_writer_options opts;
  pthread_t thread;
  int thread_started;

  pthread_mutex_t lock;
  pthread_cond_t nonempty, space, ready;
  block *head, *tail;
  size_t queued_bytes, peak_queued;
  int opened;     /* writer thread finished creating the file (status in failed) */
  int finishing;  /* no more appends; drain and finalise */
  int aborting;   /* drop the queue and close */
  st_status failed; /* sticky error of the writer thread */
  char errmsg[2048];

  /* Owned by the writer thread after open: */
  const st_trace_run_attrs *attrs; /* only during open */
  hid_t file, taps_group;
  tap_state **by_key; /* (layer + 1) * ST_TAP_COUNT + id */
  size_t n_keys;
  tap_state **order; /* creation order */
  int n_taps, cap_taps;
  const int32_t *tokens;
  int64_t n_tokens, n_prompt;
  int64_t nonfinite_warnings; /* set by the caller before finish (st_trace_writer_set_nonfinite) */
  char *import_notes;         /* set before finish (st_trace_writer_set_import_notes), or NULL */
  double last_flush; /* CLOCK_MONOTONIC seconds */
  double wait_s;     /* under lock: seconds appends waited for queue space */
  char digest[ST_H5_DIGEST_LEN]; /* content_digest, computed at finish */
  char *digest_out;              /* where finish copies it (st_trace_writer_digest_out) */
};

static double monotonic_s(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* ---------------------------------------------------------------- writer thread: datasets */

/* Whether axis `axis` of tap id may grow between emits: its symbol in the catalogue's shape
** text is R (visible compressed rows) or k (top-k, which is min(k, R) early on). */
static int axis_may_grow(st_tap_id id, int axis) {
  if ((unsigned)id >= ST_TAP_COUNT) return 0;
  const char *s = strchr(st_tap_catalogue[id].shape, '[');
  if (!s) return 0;
  s++;
  for (int i = 0; i < axis && s; i++) {
    s = strchr(s, ',');
    if (s) s++;
  }
  if (!s) return 0;
  while (*s == ' ') s++;
  return (s[0] == 'R' || s[0] == 'k') && (s[1] == ',' || s[1] == ']');
}

/* Chunk shape for a tap whose first block has `shape`: inner axes as wide as the block (at
** least GROWABLE_AXIS_MIN_CHUNK on growing axes), halved until one row fits in 1 MiB, then as many
** rows as reach the target size. */
static void choose_chunk(const st_trace_writer *w, st_tap_id id, int rank, const int64_t *shape,
                         size_t elem, hsize_t *chunk) {
  size_t inner = elem;
  for (int i = 1; i < rank; i++) {
    int64_t c = ST_MAX(shape[i], 1);
    if (axis_may_grow(id, i)) c = ST_MAX(c, GROWABLE_AXIS_MIN_CHUNK);
    chunk[i] = (hsize_t)c;
    inner *= (size_t)c;
  }
  while (inner > MAX_CHUNK_BYTES) {
    int widest = 1;
    for (int i = 2; i < rank; i++)
      if (chunk[i] > chunk[widest]) widest = i;
    inner = inner / chunk[widest] * ((chunk[widest] + 1) / 2);
    chunk[widest] = (chunk[widest] + 1) / 2;
  }
  size_t rows = (w->opts.chunk_target_bytes + inner - 1) / inner;
  rows = ST_MAX(rows, 1);
  rows = ST_MIN(rows, ST_MAX(MAX_CHUNK_BYTES / inner, 1));
  /* A chunk is stored whole once touched: keep small traces small by not reserving far more rows
  ** than the first block brought (a prompt's worth; at least 16). */
  size_t first = 16;
  while (first < (size_t)shape[0] && first < rows) first *= 2;
  chunk[0] = ST_MIN(rows, first);
}

static void fill_value_for(st_dtype t, void *out) {
  switch (t) {
  case ST_F32: *(float *)out = -INFINITY; break;
  case ST_F64: *(double *)out = -INFINITY; break;
  case ST_F16: *(uint16_t *)out = 0xFC00; break; /* -inf */
  case ST_BF16: *(uint16_t *)out = 0xFF80; break; /* -inf */
  case ST_I32: *(int32_t *)out = -1; break;
  case ST_I64: *(int64_t *)out = -1; break;
  case ST_I8: *(int8_t *)out = -1; break;
  default: memset(out, 0, 8); break;
  }
}

static st_status create_dataset(st_trace_writer *w, tap_state *t, const block *b) {
  st_status st = ST_OK;
  hid_t space = -1, dcpl = -1, dapl = -1;
  hsize_t dims[ST_TRACE_MAX_RANK], maxdims[ST_TRACE_MAX_RANK], chunk[ST_TRACE_MAX_RANK];
  size_t elem = st_dtype_size(b->dtype);
  for (int i = 0; i < b->rank; i++) {
    dims[i] = i == 0 ? 0 : (hsize_t)b->shape[i];
    maxdims[i] = H5S_UNLIMITED;
  }
  choose_chunk(w, b->id, b->rank, b->shape, elem, chunk);
  unsigned char fill[8];
  fill_value_for(b->dtype, fill);
  space = H5Screate_simple(b->rank, dims, maxdims);
  dcpl = H5Pcreate(H5P_DATASET_CREATE);
  dapl = H5Pcreate(H5P_DATASET_ACCESS);
  if (space < 0 || dcpl < 0 || dapl < 0 || H5Pset_chunk(dcpl, b->rank, chunk) < 0 ||
      H5Pset_fill_value(dcpl, t->mem_type, fill) < 0 ||
      H5Pset_fill_time(dcpl, H5D_FILL_TIME_IFSET) < 0 ||
      H5Pset_chunk_cache(dapl, 521, 2 * MAX_CHUNK_BYTES, 1.0) < 0) {
    st = st_h5_fail(ST_EHDF5, "tap %s: dataset properties", t->info.name);
    goto out;
  }
  if (w->opts.deflate_level > 0 &&
      (H5Pset_shuffle(dcpl) < 0 || H5Pset_deflate(dcpl, (unsigned)w->opts.deflate_level) < 0)) {
    st = st_h5_fail(ST_EHDF5, "tap %s: deflate filter", t->info.name);
    goto out;
  }
  t->dset = H5Dcreate2(w->taps_group, t->info.name, t->file_type, space, H5P_DEFAULT, dcpl, dapl);
  if (t->dset < 0) {
    st = st_h5_fail(ST_EHDF5, "tap %s: creating dataset /taps/%s", t->info.name, t->info.name);
    goto out;
  }
  const st_tap_info *info = &st_tap_catalogue[b->id];
  if ((st = st_h5_attr_write_string(t->dset, "tap", info->suffix)) ||
      (st = st_h5_attr_write_int(t->dset, "layer", b->layer)) ||
      (st = st_h5_attr_write_string(t->dset, "dtype", st_dtype_name(b->dtype))) ||
      (st = st_h5_attr_write_string(t->dset, "axis0", st_trace_axis0_name(info->row_axis))) ||
      (st = st_h5_attr_write_string(t->dset, "shape_doc", info->shape)) ||
      (st = st_h5_attr_write_string(t->dset, "doc", info->doc)))
    st_fail_context(st, "tap %s: ", t->info.name);
out:
  if (space >= 0) H5Sclose(space);
  if (dcpl >= 0) H5Pclose(dcpl);
  if (dapl >= 0) H5Pclose(dapl);
  return st;
}

/* Finds or creates the state of the block's tap; checks rank and dtype against earlier blocks. */
static st_status tap_for_block(st_trace_writer *w, const block *b, tap_state **out) {
  size_t key = (size_t)(b->layer + 1) * ST_TAP_COUNT + (size_t)b->id;
  if (key >= w->n_keys) {
    size_t n = ST_MAX(key + 1, w->n_keys * 2);
    tap_state **grown = realloc(w->by_key, n * sizeof *grown);
    if (!grown) return st_fail(ST_ENOMEM, "tap table");
    memset(grown + w->n_keys, 0, (n - w->n_keys) * sizeof *grown);
    w->by_key = grown;
    w->n_keys = n;
  }
  tap_state *t = w->by_key[key];
  if (t) {
    if (t->info.rank != b->rank || t->info.dtype != b->dtype)
      return st_fail(ST_EINVAL, "tap %s: emitted as rank %d %s earlier, now rank %d %s",
                     t->info.name, t->info.rank, st_dtype_name(t->info.dtype), b->rank,
                     st_dtype_name(b->dtype));
    *out = t;
    return ST_OK;
  }
  if (w->n_taps == w->cap_taps) {
    int n = w->cap_taps ? w->cap_taps * 2 : 64;
    tap_state **grown = realloc(w->order, (size_t)n * sizeof *grown);
    if (!grown) return st_fail(ST_ENOMEM, "tap table");
    w->order = grown;
    w->cap_taps = n;
  }
  t = calloc(1, sizeof *t);
  if (!t) return st_fail(ST_ENOMEM, "tap state");
  t->dset = -1;
  st_tap_full_name(t->info.name, sizeof t->info.name, b->id, b->layer);
  t->info.id = b->id;
  t->info.layer = b->layer;
  t->info.dtype = b->dtype;
  t->info.rank = b->rank;
  t->info.row_axis = st_tap_catalogue[b->id].row_axis;
  for (int i = 1; i < b->rank; i++) t->info.shape[i] = b->shape[i];
  t->file_type = st_h5_file_type(b->dtype);
  t->mem_type = st_h5_mem_type(b->dtype);
  w->by_key[key] = t;
  w->order[w->n_taps++] = t;
  if (t->file_type < 0 || t->mem_type < 0) return st_fail_context(ST_EUNSUPPORTED, "tap %s: ", t->info.name);
  st_status st = create_dataset(w, t, b);
  if (st) return st;
  *out = t;
  return ST_OK;
}

static st_status note_positions(tap_state *t, int64_t pos0, int64_t n) {
  if (n == 0) return ST_OK;
  if (t->n_runs && t->runs[t->n_runs - 1].start + t->runs[t->n_runs - 1].count == pos0) {
    t->runs[t->n_runs - 1].count += n;
    return ST_OK;
  }
  if (t->n_runs == t->cap_runs) {
    size_t c = t->cap_runs ? t->cap_runs * 2 : 4;
    position_run *grown = realloc(t->runs, c * sizeof *grown);
    if (!grown) return st_fail(ST_ENOMEM, "positions of tap %s", t->info.name);
    t->runs = grown;
    t->cap_runs = c;
  }
  t->runs[t->n_runs++] = (position_run){pos0, n};
  return ST_OK;
}

static int positions_are_identity(const tap_state *t) {
  return t->n_runs == 0 || (t->n_runs == 1 && t->runs[0].start == 0);
}

static void stats_add_float(tap_state *t, double v) {
  st_tap_stats *s = &t->info.stats;
  if (isnan(v)) {
    s->nan_count++;
  } else if (isinf(v)) {
    s->inf_count++;
    if (v > 0) s->posinf_count++;
    else s->neginf_count++;
  } else {
    if (t->n_ranged == 0 || v < s->min) s->min = v;
    if (t->n_ranged == 0 || v > s->max) s->max = v;
    t->sum += v;
    t->sumsq += v * v;
    t->n_ranged++;
  }
}

static void stats_add_int(tap_state *t, double v) {
  st_tap_stats *s = &t->info.stats;
  if (t->n_ranged == 0 || v < s->min) s->min = v;
  if (t->n_ranged == 0 || v > s->max) s->max = v;
  t->sum += v;
  t->n_ranged++;
}

/* Adds a block's values to the tap's statistics. Raw low-precision floats other than bf16 only
** count (no decoder here; the replayer's lowp code owns those formats). */
static void stats_add_block(tap_state *t, const block *b) {
  size_t n = st_dtype_size(b->dtype) ? b->nbytes / st_dtype_size(b->dtype) : 0;
  t->info.stats.count += (int64_t)n;
  switch (b->dtype) {
  case ST_F32: {
    const float *v = (const float *)b->data;
    for (size_t i = 0; i < n; i++) stats_add_float(t, v[i]);
    break;
  }
  case ST_F64: {
    const double *v = (const double *)b->data;
    for (size_t i = 0; i < n; i++) stats_add_float(t, v[i]);
    break;
  }
  case ST_BF16: {
    const uint16_t *v = (const uint16_t *)b->data;
    for (size_t i = 0; i < n; i++) {
      uint32_t bits = (uint32_t)v[i] << 16;
      float f;
      memcpy(&f, &bits, sizeof f);
      stats_add_float(t, f);
    }
    break;
  }
  case ST_I32: {
    const int32_t *v = (const int32_t *)b->data;
    for (size_t i = 0; i < n; i++) stats_add_int(t, v[i]);
    break;
  }
  case ST_I64: {
    const int64_t *v = (const int64_t *)b->data;
    for (size_t i = 0; i < n; i++) stats_add_int(t, (double)v[i]);
    break;
  }
  case ST_I8: {
    const int8_t *v = (const int8_t *)b->data;
    for (size_t i = 0; i < n; i++) stats_add_int(t, v[i]);
    break;
  }
  case ST_U8: case ST_BOOL: {
    const uint8_t *v = (const uint8_t *)b->data;
    for (size_t i = 0; i < n; i++) stats_add_int(t, v[i]);
    break;
  }
  default: break;
  }
}

/* Appends one block to its dataset (writer thread). */
static st_status write_block(st_trace_writer *w, const block *b) {
  tap_state *t = NULL;
  st_status st = tap_for_block(w, b, &t);
  if (st) return st;
  int rank = b->rank;
  int64_t row0 = t->info.row_axis ? b->pos0 : t->rows_appended;
  hsize_t dims[ST_TRACE_MAX_RANK], start[ST_TRACE_MAX_RANK], count[ST_TRACE_MAX_RANK];
  int grow = 0;
  for (int i = 0; i < rank; i++) {
    int64_t want = i == 0 ? row0 + b->shape[0] : b->shape[i];
    if (want > t->info.shape[i]) {
      t->info.shape[i] = want;
      grow = 1;
    }
    dims[i] = (hsize_t)t->info.shape[i];
    start[i] = i == 0 ? (hsize_t)row0 : 0;
    count[i] = (hsize_t)b->shape[i];
  }
  if (grow && H5Dset_extent(t->dset, dims) < 0)
    return st_h5_fail(ST_EHDF5, "tap %s: extending dataset to %lld rows", t->info.name,
                      (long long)dims[0]);
  if (!t->info.row_axis) {
    t->rows_appended += b->shape[0];
    if ((st = note_positions(t, b->pos0, b->shape[0]))) return st;
  }
  if (b->nbytes == 0) return ST_OK; /* an axis of length 0: the extent is all there is */
  hid_t fspace = H5Dget_space(t->dset);
  hid_t mspace = H5Screate_simple(rank, count, NULL);
  if (fspace < 0 || mspace < 0 ||
      H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
      H5Dwrite(t->dset, t->mem_type, mspace, fspace, H5P_DEFAULT, b->data) < 0)
    st = st_h5_fail(ST_EHDF5, "tap %s: writing %lld rows at row %lld", t->info.name,
                    (long long)b->shape[0], (long long)row0);
  if (fspace >= 0) H5Sclose(fspace);
  if (mspace >= 0) H5Sclose(mspace);
  if (st) return st;
  stats_add_block(t, b);
  return ST_OK;
}

/* ---------------------------------------------------------------- writer thread: open/finish */

static st_status write_file_attrs(st_trace_writer *w, const st_trace_run_attrs *a) {
  st_status st;
  hid_t f = w->file;
  if ((st = st_h5_attr_write_string(f, "format", ST_TRACE_FORMAT_NAME)) ||
      (st = st_h5_attr_write_int(f, "schema_version", ST_TRACE_SCHEMA_VERSION)) ||
      (st = st_h5_attr_write_string(f, "run_id", a->run_id)) ||
      (st = st_h5_attr_write_string(f, "model", a->model)) ||
      (st = st_h5_attr_write_string(f, "model_dir", a->model_dir)) ||
      (st = st_h5_attr_write_string(f, "settings", a->settings_json ? a->settings_json : "{}")) ||
      (st = st_h5_attr_write_string(f, "config", a->config_json)) ||
      (st = st_h5_attr_write_string(f, "build_revision", a->build_revision)) ||
      (st = st_h5_attr_write_string(f, "compiler", a->compiler)) ||
      (st = st_h5_attr_write_string(f, "build_type", a->build_type)) ||
      (st = st_h5_attr_write_string(f, "backend", a->backend)) ||
      (st = st_h5_attr_write_string(f, "kernel_mode", a->kernel_mode)) ||
      (st = st_h5_attr_write_int(f, "threads", a->threads)) ||
      (st = st_h5_attr_write_int(f, "n_layers", a->n_layers)) ||
      (st = st_h5_attr_write_string(f, "created_at", a->created_at)) ||
      (st = st_h5_attr_write_string(f, "command_line", a->command_line)) ||
      (st = st_h5_attr_write_string(f, "request_id", a->request_id)) ||
      (st = st_h5_attr_write_string(f, "positions", a->positions ? a->positions : "all")))
    return st;
  if (a->needle_end > a->needle_start &&
      ((st = st_h5_attr_write_int(f, "needle_start", a->needle_start)) ||
       (st = st_h5_attr_write_int(f, "needle_end", a->needle_end)) ||
       (st = st_h5_attr_write_string(f, "needle_text", a->needle_text))))
    return st;
  if (a->import_json && (st = st_h5_attr_write_string(f, "import", a->import_json))) return st;
  return ST_OK;
}

static st_status open_file(st_trace_writer *w) {
  w->file = H5Fcreate(w->path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (w->file < 0) return st_h5_fail(ST_EIO, "cannot create trace %s", w->path);
  w->taps_group = H5Gcreate2(w->file, "taps", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (w->taps_group < 0) return st_h5_fail(ST_EHDF5, "trace %s: creating /taps", w->path);
  st_status st = write_file_attrs(w, w->attrs);
  if (st) return st_fail_context(st, "trace %s: ", w->path);
  return ST_OK;
}

static st_status write_tokens(st_trace_writer *w) {
  st_status st = ST_OK;
  hsize_t n = (hsize_t)w->n_tokens;
  hid_t space = H5Screate_simple(1, &n, NULL);
  hid_t d = space < 0 ? -1
                      : H5Dcreate2(w->file, "tokens", H5T_STD_I32LE, space, H5P_DEFAULT,
                                   H5P_DEFAULT, H5P_DEFAULT);
  if (d < 0 || (n && H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, w->tokens) < 0))
    st = st_h5_fail(ST_EHDF5, "writing /tokens");
  if (!st) st = st_h5_attr_write_int(d, "n_prompt", w->n_prompt);
  if (!st) st = st_h5_attr_write_int(w->file, "nonfinite_warnings", w->nonfinite_warnings);
  if (!st && w->import_notes) st = st_h5_attr_write_string(w->file, "import_notes", w->import_notes);
  if (d >= 0) H5Dclose(d);
  if (space >= 0) H5Sclose(space);
  return st;
}

static st_status write_positions(st_trace_writer *w, tap_state *t, hid_t *group) {
  if (!*group || *group < 0) {
    *group = H5Gcreate2(w->file, "positions", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (*group < 0) return st_h5_fail(ST_EHDF5, "creating /positions");
  }
  int64_t *pos = malloc((size_t)ST_MAX(t->rows_appended, 1) * sizeof *pos);
  if (!pos) return st_fail(ST_ENOMEM, "positions of tap %s", t->info.name);
  int64_t k = 0;
  for (size_t r = 0; r < t->n_runs; r++)
    for (int64_t i = 0; i < t->runs[r].count; i++) pos[k++] = t->runs[r].start + i;
  ST_ASSERT(k == t->rows_appended);
  st_status st = ST_OK;
  hsize_t n = (hsize_t)k;
  hid_t space = H5Screate_simple(1, &n, NULL);
  hid_t d = space < 0 ? -1
                      : H5Dcreate2(*group, t->info.name, H5T_STD_I64LE, space, H5P_DEFAULT,
                                   H5P_DEFAULT, H5P_DEFAULT);
  if (d < 0 || (n && H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, pos) < 0))
    st = st_h5_fail(ST_EHDF5, "writing /positions/%s", t->info.name);
  if (d >= 0) H5Dclose(d);
  if (space >= 0) H5Sclose(space);
  free(pos);
  if (!st) {
    char path[ST_TRACE_MAX_NAME + 16];
    snprintf(path, sizeof path, "/positions/%s", t->info.name);
    st = st_h5_attr_write_string(t->dset, "positions", path);
    t->info.has_positions = 1;
  }
  return st;
}

/* Adds the elements of the final dataset never written: they read back as the fill value
** (fill_value_for), and the statistics describe the dataset as stored. Finish only. */
static void stats_add_fill(tap_state *t) {
  int64_t total = 1;
  for (int i = 0; i < t->info.rank; i++) total *= t->info.shape[i];
  int64_t fill = total - t->info.stats.count;
  if (fill <= 0) return;
  st_tap_stats *s = &t->info.stats;
  s->count = total;
  switch (t->info.dtype) {
  case ST_F32: case ST_F64: case ST_BF16: /* -inf */
    s->inf_count += fill;
    s->neginf_count += fill;
    break;
  case ST_I32: case ST_I64: case ST_I8: case ST_U8: case ST_BOOL: { /* -1, or 0 for unsigned */
    double v = t->info.dtype == ST_U8 || t->info.dtype == ST_BOOL ? 0 : -1;
    if (t->n_ranged == 0 || v < s->min) s->min = v;
    if (t->n_ranged == 0 || v > s->max) s->max = v;
    t->sum += v * (double)fill;
    t->n_ranged += fill;
    break;
  }
  default: break; /* not decoded: count only */
  }
}

static st_status write_stats(tap_state *t) {
  st_tap_stats *s = &t->info.stats;
  int is_float = t->info.dtype == ST_F32 || t->info.dtype == ST_F64 || t->info.dtype == ST_BF16;
  int is_int = t->info.dtype == ST_I32 || t->info.dtype == ST_I64 || t->info.dtype == ST_I8 ||
               t->info.dtype == ST_U8 || t->info.dtype == ST_BOOL;
  stats_add_fill(t);
  if (is_float) s->finite_count = s->count - s->nan_count - s->inf_count;
  else if (is_int) s->finite_count = s->count;
  else s->finite_count = s->posinf_count = s->neginf_count = -1;
  s->has_range = (is_float || is_int) && t->n_ranged > 0;
  s->has_rms = is_float && t->n_ranged > 0;
  if (s->has_range) s->mean = t->sum / (double)t->n_ranged;
  if (s->has_rms) s->rms = sqrt(t->sumsq / (double)t->n_ranged);
  st_status st;
  if ((st = st_h5_attr_write_int(t->dset, "count", s->count)) ||
      (st = st_h5_attr_write_int(t->dset, "nan_count", s->nan_count)) ||
      (st = st_h5_attr_write_int(t->dset, "inf_count", s->inf_count)))
    return st;
  if ((is_float || is_int) &&
      ((st = st_h5_attr_write_int(t->dset, "finite_count", s->finite_count)) ||
       (st = st_h5_attr_write_int(t->dset, "posinf_count", s->posinf_count)) ||
       (st = st_h5_attr_write_int(t->dset, "neginf_count", s->neginf_count))))
    return st;
  if (s->has_range &&
      ((st = st_h5_attr_write_double(t->dset, "min", s->min)) ||
       (st = st_h5_attr_write_double(t->dset, "max", s->max)) ||
       (st = st_h5_attr_write_double(t->dset, "mean", s->mean))))
    return st;
  if (s->has_rms && (st = st_h5_attr_write_double(t->dset, "rms", s->rms))) return st;
  return ST_OK;
}

/* The run's recording cost (see "Cost accounting" above), as file attributes. Writer thread. */
static st_status write_cost(st_trace_writer *w) {
  struct timespec cpu = {0, 0};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
  double cpu_s = (double)cpu.tv_sec + 1e-9 * (double)cpu.tv_nsec;
  pthread_mutex_lock(&w->lock);
  double wait_s = w->wait_s;
  size_t peak = w->peak_queued;
  pthread_mutex_unlock(&w->lock);
  st_status st;
  if ((st = st_h5_attr_write_double(w->file, "writer_cpu_s", cpu_s)) ||
      (st = st_h5_attr_write_double(w->file, "emit_wait_s", wait_s)) ||
      (st = st_h5_attr_write_int(w->file, "writer_peak_queued", (int64_t)peak)))
    return st;
  return ST_OK;
}

static st_status finalise_file(st_trace_writer *w) {
  st_status st = write_tokens(w);
  hid_t positions_group = 0;
  for (int i = 0; !st && i < w->n_taps; i++) {
    tap_state *t = w->order[i];
    if (!t->info.row_axis && !positions_are_identity(t))
      st = write_positions(w, t, &positions_group);
    if (!st) st = write_stats(t);
  }
  if (positions_group > 0) H5Gclose(positions_group);
  /* flush the last chunks first, so that writer_cpu_s includes writing them */
  if (!st && H5Fflush(w->file, H5F_SCOPE_LOCAL) < 0)
    st = st_h5_fail(ST_EIO, "flushing trace %s", w->path);
  if (!st) st = write_cost(w);
  /* the digest reads every dataset back through HDF5 exactly as a reader will (fill values
  ** included), so the reader's recomputation matches; attributes do not enter it */
  if (!st) st = st_h5_content_digest(w->file, w->digest);
  if (!st) st = st_h5_attr_write_string(w->file, "content_digest", w->digest);
  if (!st) st = st_h5_attr_write_int(w->file, "complete", 1);
  if (!st && H5Fflush(w->file, H5F_SCOPE_GLOBAL) < 0)
    st = st_h5_fail(ST_EIO, "flushing trace %s", w->path);
  return st;
}

/* Points the file's descriptor at an anonymous in-memory file, so that what HDF5 still holds
** (dirty chunks and metadata) goes nowhere and H5Fclose can succeed. Called when a flush failed:
** the disk is full, and every later write would fail too. libhdf5 1.10 leaves a file whose
** H5Fclose failed registered but freed (its exit handler would then crash on it; hdf5_util.c
** keeps that handler from running); a close that succeeds leaves nothing dangling. Under the file
** size limit (EFBIG) the in-memory file is limited the same way and the close still fails.
** The .part on disk keeps what was written before the failure (up to the last good flush).
** Returns 0, or -1 when the descriptor could not be replaced. */
static int detach_to_memory(st_trace_writer *w) {
  void *handle = NULL;
  if (H5Fget_vfd_handle(w->file, H5P_DEFAULT, &handle) < 0 || !handle) {
    H5Eclear2(H5E_DEFAULT);
    return -1;
  }
  int fd = *(int *)handle, sink = memfd_create("sparsetrace-discard", MFD_CLOEXEC);
  if (sink < 0) return -1;
  int rc = dup2(sink, fd) < 0 ? -1 : 0;
  close(sink);
  return rc;
}

static st_status close_file(st_trace_writer *w) {
  st_status st = ST_OK;
  for (int i = 0; i < w->n_taps; i++)
    if (w->order[i]->dset >= 0) H5Dclose(w->order[i]->dset);
  if (w->taps_group >= 0) H5Gclose(w->taps_group);
  if (w->file >= 0 && H5Fflush(w->file, H5F_SCOPE_GLOBAL) < 0) {
    /* the close would fail the same way (and leave libhdf5 to crash at exit): keep the reason,
    ** let the rest go to memory */
    st = st_h5_fail(ST_EIO, "flushing trace %s before closing it", w->path);
    if (detach_to_memory(w) != 0)
      st_fail_context(st, "(its descriptor could not be detached: %s) ", strerror(errno));
  }
  if (w->file >= 0 && H5Fclose(w->file) < 0 && !st)
    st = st_h5_fail(ST_EIO, "closing trace %s", w->path);
  w->file = w->taps_group = -1;
  return st;
}

/* Flushes the file at most once per FLUSH_INTERVAL_S while writing, so that the .part left by a
** killed recorder still opens (inspect --partial) with the rows up to the last flush. */
static st_status flush_now_and_then(st_trace_writer *w) {
  double t = monotonic_s();
  if (t - w->last_flush < FLUSH_INTERVAL_S) return ST_OK;
  w->last_flush = t;
  if (H5Fflush(w->file, H5F_SCOPE_LOCAL) < 0) return st_h5_fail(ST_EIO, "flushing trace %s", w->path);
  return ST_OK;
}

/* Records the writer thread's first error so the engine's thread can report it. Lock held. */
static void set_failed_locked(st_trace_writer *w, st_status st) {
  if (w->failed) return;
  w->failed = st;
  snprintf(w->errmsg, sizeof w->errmsg, "%s", st_errmsg());
}

static void *writer_main(void *arg) {
  st_trace_writer *w = arg;
  st_h5_quiet();
  st_status st = open_file(w);
  if (st) {
    pthread_mutex_lock(&w->lock);
    set_failed_locked(w, st); /* before close_file, whose own failure would replace the message */
    pthread_mutex_unlock(&w->lock);
    close_file(w);
    pthread_mutex_lock(&w->lock);
    w->opened = 1;
    pthread_cond_broadcast(&w->ready);
    pthread_mutex_unlock(&w->lock);
    return NULL;
  }
  pthread_mutex_lock(&w->lock);
  w->opened = 1;
  pthread_cond_broadcast(&w->ready);
  for (;;) {
    while (!w->head && !w->finishing && !w->aborting) pthread_cond_wait(&w->nonempty, &w->lock);
    if (w->aborting) break; /* writer_free() releases what is still queued */
    block *b = w->head;
    if (!b) break; /* finishing, queue drained */
    w->head = b->next;
    if (!w->head) w->tail = NULL;
    pthread_mutex_unlock(&w->lock);
    if (!st && (st = write_block(w, b))) /* after an error, blocks are only discarded */
      st_fail_context(st, "trace %s: ", w->path);
    if (!st) st = flush_now_and_then(w);
    pthread_mutex_lock(&w->lock);
    if (st) set_failed_locked(w, st);
    w->queued_bytes -= b->nbytes;
    pthread_cond_broadcast(&w->space);
    free(b);
  }
  int finishing = !w->aborting;
  pthread_mutex_unlock(&w->lock);
  if (!st && finishing) st = finalise_file(w);
  if (st) { /* the first failure is the one to report: close_file may fail again after it */
    pthread_mutex_lock(&w->lock);
    set_failed_locked(w, st);
    pthread_mutex_unlock(&w->lock);
  }
  st_status close_st = close_file(w);
  if (!st && finishing) st = close_st;
  pthread_mutex_lock(&w->lock);
  if (st) set_failed_locked(w, st);
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

/* ---------------------------------------------------------------- caller side */

static void writer_free(st_trace_writer *w) {
  for (block *b = w->head; b;) {
    block *next = b->next;
    free(b);
    b = next;
  }
  for (int i = 0; i < w->n_taps; i++) {
    free(w->order[i]->runs);
    free(w->order[i]);
  }
  free(w->order);
  free(w->by_key);
  free(w->path);
  free(w->import_notes);
  pthread_mutex_destroy(&w->lock);
  pthread_cond_destroy(&w->nonempty);
  pthread_cond_destroy(&w->space);
  pthread_cond_destroy(&w->ready);
  free(w);
}

/* Tells the thread to stop (finish or abort), joins it. Returns its final status; message set. */
static st_status stop_thread(st_trace_writer *w, int abort_it) {
  pthread_mutex_lock(&w->lock);
  if (abort_it) w->aborting = 1;
  else w->finishing = 1;
  pthread_cond_broadcast(&w->nonempty);
  pthread_cond_broadcast(&w->space);
  pthread_mutex_unlock(&w->lock);
  if (w->thread_started) pthread_join(w->thread, NULL);
  w->thread_started = 0;
  if (w->failed) return st_fail(w->failed, "%s", w->errmsg);
  return ST_OK;
}

st_status st_trace_writer_open(const char *path, const st_trace_run_attrs *attrs,
                               const st_trace_writer_options *opts, st_trace_writer **out) {
  *out = NULL;
  st_trace_writer *w = calloc(1, sizeof *w);
  if (!w) return st_fail(ST_ENOMEM, "trace writer");
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->nonempty, NULL);
  pthread_cond_init(&w->space, NULL);
  pthread_cond_init(&w->ready, NULL);
  w->file = w->taps_group = -1;
  if (opts) w->opts = *opts;
  if (!w->opts.queue_limit_bytes) w->opts.queue_limit_bytes = DEFAULT_QUEUE_LIMIT;
  if (!w->opts.chunk_target_bytes) w->opts.chunk_target_bytes = DEFAULT_CHUNK_TARGET;
  w->opts.chunk_target_bytes = ST_MIN(w->opts.chunk_target_bytes, MAX_CHUNK_BYTES);
  if (w->opts.deflate_level < 0 || w->opts.deflate_level > 9) {
    writer_free(w);
    return st_fail(ST_EINVAL, "deflate level %d outside 0-9", opts->deflate_level);
  }
  w->path = strdup(path);
  w->attrs = attrs;
  if (!w->path) {
    writer_free(w);
    return st_fail(ST_ENOMEM, "trace writer");
  }
  int rc = pthread_create(&w->thread, NULL, writer_main, w);
  if (rc) {
    writer_free(w);
    return st_fail(ST_EIO, "starting the trace writer thread: %s", strerror(rc));
  }
  w->thread_started = 1;
  pthread_mutex_lock(&w->lock);
  while (!w->opened) pthread_cond_wait(&w->ready, &w->lock);
  int failed = w->failed != ST_OK;
  w->attrs = NULL;
  pthread_mutex_unlock(&w->lock);
  if (failed) {
    st_status st = stop_thread(w, 1);
    writer_free(w);
    return st;
  }
  *out = w;
  return ST_OK;
}

/* Whether an append of nbytes has to wait for the writer: the queue is over its limit and not
** empty (so a block larger than the limit still goes through). Lock held. */
static int must_wait_locked(const st_trace_writer *w, size_t nbytes) {
  return !w->failed && !w->finishing && !w->aborting && w->queued_bytes > 0 &&
         w->queued_bytes + nbytes > w->opts.queue_limit_bytes;
}

st_status st_trace_writer_append(st_trace_writer *w, st_tap_id id, int layer, int64_t pos0,
                                 st_dtype dtype, int rank, const int64_t *shape, const void *data) {
  if ((unsigned)id >= ST_TAP_COUNT) return st_fail(ST_EINVAL, "tap id %d out of range", (int)id);
  char name[ST_TRACE_MAX_NAME];
  st_tap_full_name(name, sizeof name, id, layer);
  int model_scope = st_tap_catalogue[id].scope == ST_TAP_SCOPE_MODEL;
  if (model_scope ? layer != -1 : layer < 0)
    return st_fail(ST_EINVAL, "tap %s: layer %d invalid for this tap", name, layer);
  if (rank < 1 || rank > ST_TRACE_MAX_RANK)
    return st_fail(ST_EINVAL, "tap %s: rank %d outside 1..%d", name, rank, ST_TRACE_MAX_RANK);
  size_t elem = st_dtype_size(dtype);
  if ((unsigned)dtype >= ST_DTYPE_COUNT || elem == 0)
    return st_fail(ST_EUNSUPPORTED, "tap %s: dtype %s cannot be stored in a trace", name,
                   st_dtype_name(dtype));
  if (pos0 < 0) return st_fail(ST_EINVAL, "tap %s: negative first position %lld", name, (long long)pos0);
  size_t nbytes = elem;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0 || shape[i] > ((int64_t)1 << 40))
      return st_fail(ST_EINVAL, "tap %s: axis %d has length %lld", name, i, (long long)shape[i]);
    if (shape[i] && nbytes > SIZE_MAX / (size_t)shape[i])
      return st_fail(ST_EINVAL, "tap %s: value too large", name);
    nbytes *= (size_t)shape[i];
  }
  if (nbytes && !data) return st_fail(ST_EINVAL, "tap %s: NULL data", name);
  block *b = malloc(sizeof *b + nbytes);
  if (!b) return st_fail(ST_ENOMEM, "copying %zu bytes of tap %s", nbytes, name);
  b->next = NULL;
  b->id = id;
  b->layer = layer;
  b->dtype = dtype;
  b->rank = rank;
  memcpy(b->shape, shape, (size_t)rank * sizeof *shape);
  b->pos0 = pos0;
  b->nbytes = nbytes;
  if (nbytes) memcpy(b->data, data, nbytes);

  pthread_mutex_lock(&w->lock);
  if (must_wait_locked(w, nbytes)) { /* backpressure: the engine waits, and the trace says so */
    double t0 = monotonic_s();
    while (must_wait_locked(w, nbytes)) pthread_cond_wait(&w->space, &w->lock);
    w->wait_s += monotonic_s() - t0;
  }
  if (!w->failed && (w->finishing || w->aborting)) {
    pthread_mutex_unlock(&w->lock);
    free(b);
    return st_fail(ST_EINVAL, "tap %s: emitted after the trace %s was closed", name, w->path);
  }
  if (w->failed) {
    st_status st = w->failed;
    st_fail(st, "%s", w->errmsg);
    pthread_mutex_unlock(&w->lock);
    free(b);
    return st;
  }
  if (w->tail) w->tail->next = b;
  else w->head = b;
  w->tail = b;
  w->queued_bytes += nbytes;
  if (w->queued_bytes > w->peak_queued) w->peak_queued = w->queued_bytes;
  pthread_cond_signal(&w->nonempty);
  pthread_mutex_unlock(&w->lock);
  return ST_OK;
}

void st_trace_writer_set_nonfinite(st_trace_writer *w, int64_t n) {
  if (w) w->nonfinite_warnings = n;
}

st_status st_trace_writer_set_import_notes(st_trace_writer *w, const char *json) {
  if (!w) return ST_OK;
  free(w->import_notes);
  w->import_notes = json ? strdup(json) : NULL;
  return json && !w->import_notes ? st_fail(ST_ENOMEM, "import notes") : ST_OK;
}

void st_trace_writer_digest_out(st_trace_writer *w, char *out) {
  if (w) w->digest_out = out;
}

st_status st_trace_writer_finish(st_trace_writer *w, const int32_t *tokens, int64_t n_tokens,
                                 int64_t n_prompt, st_trace_tap **taps, int *n_taps) {
  if (taps) *taps = NULL;
  if (n_taps) *n_taps = 0;
  if (n_tokens < 0 || (n_tokens && !tokens) || n_prompt < 0 || n_prompt > n_tokens) {
    st_trace_writer_abort(w);
    return st_fail(ST_EINVAL, "finishing trace: %lld tokens with n_prompt %lld",
                   (long long)n_tokens, (long long)n_prompt);
  }
  /* The thread reads these only after it has seen `finishing`, under the lock. */
  pthread_mutex_lock(&w->lock);
  w->tokens = tokens;
  w->n_tokens = n_tokens;
  w->n_prompt = n_prompt;
  pthread_mutex_unlock(&w->lock);
  st_status st = stop_thread(w, 0);
  if (!st && w->digest_out) memcpy(w->digest_out, w->digest, ST_H5_DIGEST_LEN);
  if (!st && taps) {
    *taps = calloc((size_t)ST_MAX(w->n_taps, 1), sizeof **taps);
    if (!*taps) st = st_fail(ST_ENOMEM, "tap list");
    for (int i = 0; !st && i < w->n_taps; i++) (*taps)[i] = w->order[i]->info;
    if (!st && n_taps) *n_taps = w->n_taps;
  }
  writer_free(w);
  return st;
}

void st_trace_writer_abort(st_trace_writer *w) {
  if (!w) return;
  stop_thread(w, 1);
  writer_free(w);
}

size_t st_trace_writer_peak_queued(st_trace_writer *w) {
  pthread_mutex_lock(&w->lock);
  size_t peak = w->peak_queued;
  pthread_mutex_unlock(&w->lock);
  return peak;
}
