/*
** recorder.c — the engine's tap sink: filters rows by the positions spec, hands copies to the
** trace writer thread, and at finish renames the trace into place and indexes it.
**
** Order of events is the crash-safety contract (docs/design.md "Trace format"): the HDF5 file is
** written as <trace>.part; finish drains the writer, marks the file complete and closes it,
** renames it to <trace> (atomic on POSIX), and only then inserts the run into index.sqlite. A
** crash at any point leaves either a .part file and no index row, or a complete trace that the
** index may lack, never an index row pointing at a missing or partial file.
**
** Positions filter. "all" keeps every row; "last" keeps the last prompt position (n_prompt - 1)
** and every later one (the generated tokens); "A:B" keeps positions A <= p < B ("A:" and ":B"
** leave one end open). A block's rows are consecutive positions, so the kept rows are one
** contiguous slice and are copied with one memcpy. Row taps (compressor.kv, indexer.k,
** indexer.k_used) are never filtered: replay needs every compressed row a query can see.
*/
#include "recorder.h"
#include "common/build_info.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "index.h"
#include "trace_writer.h"

struct st_recorder {
  st_tap_sink sink;
  st_trace_writer *writer;
  char *h5_path, *part_path, *store_dir;
  int force;
  char run_id[40];
  char created_at[40];
  char *model, *model_dir, *settings, *command_line, *request_id, *positions, *backend,
      *kernel_mode;
  int threads;
  int64_t keep_lo, keep_hi; /* token positions kept: keep_lo <= p < keep_hi */
  struct timespec started;
};

/* ---------------------------------------------------------------- small helpers */

void st_run_id_new(st_run_meta *meta) {
  unsigned char b[16];
  if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
    /* No entropy source: time, pid and a counter still make collisions in one store unlikely. */
    static unsigned counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^
                 ((uint64_t)getpid() << 32) ^ (uint64_t)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 16; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      b[i] = (unsigned char)x;
    }
  }
  b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* version 4 */
  b[8] = (unsigned char)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
  snprintf(meta->run_id, sizeof meta->run_id,
           "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static double seconds_since(const struct timespec *t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - t0->tv_sec) + 1e-9 * (double)(now.tv_nsec - t0->tv_nsec);
}

/* strdup that keeps NULL; *failed is set when an allocation fails. */
static char *dup_or_null(const char *s, int *failed) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *failed = 1;
  return d;
}

static st_status make_parent_dirs(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash || slash == path) return ST_OK;
  char dir[PATH_MAX];
  size_t n = (size_t)(slash - path);
  if (n >= sizeof dir) return st_fail(ST_EINVAL, "path too long: %s", path);
  memcpy(dir, path, n);
  dir[n] = 0;
  return st_make_dirs(dir);
}

/* Parses the positions spec into [lo, hi). */
static st_status parse_positions(const char *spec, int64_t n_prompt, int64_t *lo, int64_t *hi) {
  *lo = 0;
  *hi = INT64_MAX;
  if (!spec || !strcmp(spec, "all")) return ST_OK;
  if (!strcmp(spec, "last")) {
    *lo = n_prompt > 0 ? n_prompt - 1 : 0;
    return ST_OK;
  }
  const char *colon = strchr(spec, ':');
  if (!colon) goto bad;
  char *end;
  if (colon != spec) {
    errno = 0;
    long long a = strtoll(spec, &end, 10);
    if (errno || end != colon || a < 0) goto bad;
    *lo = a;
  }
  if (colon[1]) {
    errno = 0;
    long long b = strtoll(colon + 1, &end, 10);
    if (errno || *end || b < 0) goto bad;
    *hi = b;
  }
  if (*hi <= *lo)
    return st_fail(ST_EINVAL, "positions '%s' selects nothing (A:B keeps A <= position < B)", spec);
  return ST_OK;
bad:
  return st_fail(ST_EINVAL, "positions '%s': expected all, last or A:B (half-open token range, "
                            "e.g. 120:160)", spec);
}

/* ---------------------------------------------------------------- the sink */

/* The rows of a block of n rows at pos0 that the positions spec keeps: [*k0, *k1). A tap whose
** axis 0 is not token positions (row_axis) keeps every row. */
static void recorder_kept(void *ctx, st_tap_id tap, int64_t pos0, int64_t n, int64_t *k0, int64_t *k1) {
  const st_recorder *r = ctx;
  if ((unsigned)tap >= ST_TAP_COUNT || st_tap_catalogue[tap].row_axis ||
      (r->keep_lo == 0 && r->keep_hi == INT64_MAX)) {
    *k0 = 0, *k1 = n;
    return;
  }
  int64_t lo = r->keep_lo - pos0, hi = r->keep_hi == INT64_MAX ? n : r->keep_hi - pos0;
  *k0 = ST_MAX(ST_MIN(lo, n), 0);
  *k1 = ST_MAX(ST_MIN(hi, n), 0);
}

static st_status recorder_emit(void *ctx, st_tap_id tap, int layer, int64_t pos0, st_dtype dtype,
                               int rank, const int64_t *shape, const void *data) {
  st_recorder *r = ctx;
  if ((unsigned)tap >= ST_TAP_COUNT) return st_fail(ST_EINVAL, "tap id %d out of range", (int)tap);
  if (rank < 1 || rank > ST_TRACE_MAX_RANK || !shape)
    return st_trace_writer_append(r->writer, tap, layer, pos0, dtype, rank, shape, data);
  int64_t n = shape[0], k0, k1;
  recorder_kept(r, tap, pos0, n, &k0, &k1);
  if (k0 == 0 && k1 == n) return st_trace_writer_append(r->writer, tap, layer, pos0, dtype, rank, shape, data);
  if (k1 <= k0) return ST_OK; /* no kept position in this block */
  size_t row_bytes = st_dtype_size(dtype);
  int64_t kept[ST_TRACE_MAX_RANK];
  for (int i = 0; i < rank; i++) {
    kept[i] = i == 0 ? k1 - k0 : shape[i];
    if (i > 0) row_bytes *= (size_t)ST_MAX(shape[i], 0);
  }
  const unsigned char *first = data ? (const unsigned char *)data + (size_t)k0 * row_bytes : NULL;
  return st_trace_writer_append(r->writer, tap, layer, pos0 + k0, dtype, rank, kept, first);
}

/* ---------------------------------------------------------------- lifecycle */

static void recorder_free(st_recorder *r) {
  if (!r) return;
  free(r->h5_path);
  free(r->part_path);
  free(r->store_dir);
  free(r->model);
  free(r->model_dir);
  free(r->settings);
  free(r->command_line);
  free(r->request_id);
  free(r->positions);
  free(r->backend);
  free(r->kernel_mode);
  free(r);
}

st_status st_recorder_open(const char *h5_path, const char *store_dir, const st_run_meta *meta,
                           int64_t n_prompt, st_recorder **out) {
  *out = NULL;
  if (!h5_path || !*h5_path) return st_fail(ST_EINVAL, "no trace path given");
  int64_t lo, hi;
  st_status st = parse_positions(meta->positions, n_prompt, &lo, &hi);
  if (st) return st;
  st_recorder *r = calloc(1, sizeof *r);
  if (!r) return st_fail(ST_ENOMEM, "recorder");
  r->keep_lo = lo;
  r->keep_hi = hi;
  clock_gettime(CLOCK_MONOTONIC, &r->started);
  st_utc_now(r->created_at, sizeof r->created_at);
  if (meta->run_id[0]) {
    snprintf(r->run_id, sizeof r->run_id, "%s", meta->run_id);
  } else {
    st_run_meta fresh;
    st_run_id_new(&fresh);
    memcpy(r->run_id, fresh.run_id, sizeof r->run_id);
  }
  const char *model = meta->model_name;
  if (!model && meta->model_dir) {
    const char *slash = strrchr(meta->model_dir, '/');
    model = slash && slash[1] ? slash + 1 : meta->model_dir;
  }
  int failed = 0;
  size_t n = strlen(h5_path);
  r->h5_path = dup_or_null(h5_path, &failed);
  r->part_path = malloc(n + 6);
  if (r->part_path) snprintf(r->part_path, n + 6, "%s.part", h5_path);
  r->store_dir = dup_or_null(store_dir, &failed);
  r->model = dup_or_null(model, &failed);
  r->model_dir = dup_or_null(meta->model_dir, &failed);
  r->settings = dup_or_null(meta->settings_json ? meta->settings_json : "{}", &failed);
  r->command_line = dup_or_null(meta->command_line, &failed);
  r->request_id = dup_or_null(meta->request_id, &failed);
  r->positions = dup_or_null(meta->positions ? meta->positions : "all", &failed);
  r->backend = dup_or_null(meta->backend ? meta->backend : "unknown", &failed);
  r->kernel_mode = dup_or_null(meta->kernel_mode ? meta->kernel_mode : "unknown", &failed);
  r->threads = meta->threads;
  if (failed || !r->part_path) {
    recorder_free(r);
    return st_fail(ST_ENOMEM, "recorder");
  }
  r->force = meta->force;
  if ((st = st_recorder_check_target(h5_path, store_dir, meta->force))) {
    recorder_free(r);
    return st;
  }
  st_trace_run_attrs attrs = {
    .run_id = r->run_id, .model = r->model, .model_dir = r->model_dir,
    .settings_json = r->settings, .config_json = meta->config_json,
    .build_revision = st_build_revision, .compiler = st_build_compiler, .build_type = st_build_type,
    .backend = r->backend, .kernel_mode = r->kernel_mode, .created_at = r->created_at,
    .command_line = r->command_line, .request_id = r->request_id, .positions = r->positions,
    .threads = meta->threads, .n_layers = meta->n_layers,
    .needle_start = meta->needle_start, .needle_end = meta->needle_end,
    .needle_text = meta->needle_text, .import_json = meta->import_json,
  };
  if ((st = st_trace_writer_open(r->part_path, &attrs, NULL, &r->writer))) {
    recorder_free(r);
    return st;
  }
  r->sink.ctx = r;
  r->sink.emit = recorder_emit;
  r->sink.kept = recorder_kept;
  *out = r;
  return ST_OK;
}

const st_tap_sink *st_recorder_sink(st_recorder *r) { return &r->sink; }

st_status st_recorder_check_target(const char *h5_path, const char *store_dir, int force) {
  st_status st;
  if (store_dir && (st = st_make_dirs(store_dir)))
    return st_fail_context(st, "trace store %s: ", store_dir);
  if ((st = make_parent_dirs(h5_path))) return st_fail_context(st, "recording trace %s: ", h5_path);
  struct stat sb;
  int exists = stat(h5_path, &sb) == 0;
  if (store_dir) {
    char key[PATH_MAX], index_path[PATH_MAX];
    if ((st = st_index_trace_key(store_dir, h5_path, key, sizeof key))) return st;
    snprintf(index_path, sizeof index_path, "%s/%s", store_dir, ST_INDEX_FILE);
    if (stat(index_path, &sb) == 0) {
      st_index *ix = NULL;
      char run_id[64], created[40];
      int found = 0;
      if (!(st = st_index_open(store_dir, ST_INDEX_READ_ONLY, &ix)))
        st = st_index_find_trace(ix, key, run_id, sizeof run_id, created, sizeof created, &found);
      else if (st == ST_ENOTFOUND) /* another recorder created the index and is migrating it */
        st = ST_OK, found = 0, st_clear_error();
      st_index_close(ix);
      if (st) return st_fail_context(st, "checking trace path %s: ", h5_path);
      if (found && !force)
        return st_fail(ST_EINVAL, "trace %s %s: the index of store %s gives that path to run %s "
                                  "(recorded %s); choose another --out, or pass --force to "
                                  "overwrite it and replace that run's index row%s", h5_path,
                       exists ? "already exists" : "is missing but its path is taken", store_dir,
                       run_id, created, exists ? "" : " ('sparsetrace store check --repair' "
                                                      "removes the dangling row)");
    }
  }
  if (exists && !force)
    return st_fail(ST_EINVAL, "trace %s already exists; refusing to overwrite it (--force "
                              "overwrites)", h5_path);
  return ST_OK;
}

/* Makes the rename durable: fsync of the directory holding path (best effort). */
static void sync_parent_dir(const char *path) {
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) + (slash == path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

st_status st_recorder_set_import_notes(st_recorder *r, const char *json) {
  return r ? st_trace_writer_set_import_notes(r->writer, json) : ST_OK;
}

void st_recorder_note_nonfinite(st_recorder *r, int64_t n) {
  if (r) st_trace_writer_set_nonfinite(r->writer, n);
}

st_status st_recorder_finish(st_recorder *r, const int32_t *tokens, int64_t n_tokens,
                             int64_t n_prompt) {
  st_trace_tap *taps = NULL;
  int n_taps = 0;
  char digest[ST_TRACE_DIGEST_LEN] = "";
  st_trace_writer_digest_out(r->writer, digest);
  st_status st = st_trace_writer_finish(r->writer, tokens, n_tokens, n_prompt, &taps, &n_taps);
  r->writer = NULL;
  if (st) {
    st_fail_context(st, "recording %s (partial file kept as %s): ", r->h5_path, r->part_path);
    goto out;
  }
  if (rename(r->part_path, r->h5_path) != 0) {
    st = st_fail(ST_EIO, "renaming %s to %s: %s", r->part_path, r->h5_path, strerror(errno));
    goto out;
  }
  sync_parent_dir(r->h5_path);
  if (!r->store_dir) goto out;
  char rel[PATH_MAX];
  if ((st = st_index_trace_key(r->store_dir, r->h5_path, rel, sizeof rel))) goto out;
  st_index_run run = {
    .run_id = r->run_id, .created_at = r->created_at, .model = r->model,
    .model_dir = r->model_dir, .trace_path = rel, .n_prompt = n_prompt, .n_tokens = n_tokens,
    .positions = r->positions, .settings_json = r->settings,
    .build = {st_build_revision, st_build_compiler, st_build_type, r->backend, r->kernel_mode},
    .threads = r->threads, .command_line = r->command_line, .request_id = r->request_id,
    .duration_s = seconds_since(&r->started), .replace_same_path = r->force,
    .content_digest = digest[0] ? digest : NULL,
  };
  st_index *ix = NULL;
  if (!(st = st_index_open(r->store_dir, ST_INDEX_READ_WRITE, &ix)))
    st = st_index_add_run(ix, &run, taps, n_taps);
  st_index_close(ix);
  if (st) st_fail_context(st, "trace %s is complete, but indexing it failed: ", r->h5_path);
out:
  free(taps);
  recorder_free(r);
  return st;
}

void st_recorder_abort(st_recorder *r) {
  if (!r) return;
  st_trace_writer_abort(r->writer);
  recorder_free(r);
}
