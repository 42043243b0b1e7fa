/*
** trace_format.h — names and small types shared by the HDF5 trace writer, the trace reader and
** the index: what one recorded tap is (st_trace_tap) and the statistics kept for it.
**
** The layout itself is specified in schemas/trace-layout.md; the constants below are its C
** spelling. Bump ST_TRACE_SCHEMA_VERSION when a reader of the old layout would misread a new file.
*/
#ifndef ST_TRACE_FORMAT_H
#define ST_TRACE_FORMAT_H

#include <stdint.h>

#include "common/base.h"
#include "schemas/catalogue.h"

#define ST_TRACE_SCHEMA_VERSION 1
#define ST_TRACE_FORMAT_NAME "sparsetrace-trace" /* file attribute "format" */
#define ST_TRACE_MAX_RANK 8
#define ST_TRACE_MAX_NAME 128

/* Summary statistics of one tap's dataset as stored, over every element of its final shape:
** the values written and the fill values of elements never written (a scores row narrower than
** the dataset reads back -inf, a short top-k row -1: trace-layout.md "Statistics"), so they equal
** what any reader (numpy) computes on the dataset.
** Float taps: min/max/mean/rms over the finite values (has_range 0 when there are none);
** finite_count + nan_count + posinf_count + neginf_count = count, inf_count = posinf + neginf.
** Integer taps: min/max/mean over all values, finite_count = count. Other element types
** (raw fp8/fp4, f16) are not decoded: count only, the other counts -1 (unknown). */
typedef struct st_tap_stats {
  int64_t count;        /* elements of the dataset */
  int64_t finite_count; /* -1: unknown (not decoded, or a trace written before they were kept) */
  int64_t nan_count;
  int64_t inf_count;    /* +inf and -inf */
  int64_t posinf_count, neginf_count; /* -1: unknown */
  int has_range;        /* min/max/mean valid */
  int has_rms;          /* rms valid (float taps) */
  double min, max, mean, rms;
} st_tap_stats;

/* One tap as stored in a trace: the dataset /taps/<name>. */
typedef struct st_trace_tap {
  char name[ST_TRACE_MAX_NAME]; /* "layers.3.indexer.scores" */
  st_tap_id id;                 /* catalogue id (ST_TAP_COUNT if the name is not in this build's catalogue) */
  int layer;                    /* -1 for model-scope taps */
  st_dtype dtype;
  int rank;
  int64_t shape[ST_TRACE_MAX_RANK]; /* shape[0] = rows */
  int row_axis;                 /* 1: axis 0 is the compressed row; 0: token position */
  int has_positions;            /* 1: /positions/<name> maps each row to its token position */
  st_tap_stats stats;
} st_trace_tap;

/* "position" or "compressed_row" (dataset attribute axis0 and the index's taps.axis0). */
static inline const char *st_trace_axis0_name(int row_axis) {
  return row_axis ? "compressed_row" : "position";
}

/* The file attributes on "/" that readers use (schemas/trace-layout.md "File attributes"), each
** X(name); the float costs (writer_cpu_s, ...) are for people and left out. The reader opens
** exactly these, by name, and never lists a file's attributes: listing them (H5Aiterate2,
** H5Aopen_by_idx) builds a table that libhdf5 1.10 frees uninitialised when one attribute of a
** corrupt file does not decode (a crash in H5A__close); opening one by name builds none. */
#define ST_TRACE_FILE_ATTRS(X)                                                                  \
  X(format) X(schema_version) X(run_id) X(created_at) X(model) X(model_dir) X(settings)         \
  X(config) X(build_revision) X(compiler) X(build_type) X(backend) X(kernel_mode) X(threads)    \
  X(n_layers) X(command_line) X(request_id) X(positions) X(needle_start) X(needle_end)          \
  X(needle_text) X(writer_peak_queued) X(nonfinite_warnings) X(content_digest) X(import)         \
  X(import_notes) X(complete)

/* Run-level metadata written as file attributes (all strings borrowed, NULL = absent). */
typedef struct st_trace_run_attrs {
  const char *run_id, *model, *model_dir, *settings_json, *config_json;
  const char *build_revision, *compiler, *build_type, *backend, *kernel_mode;
  const char *created_at, *command_line, *request_id, *positions;
  int threads;
  int n_layers;
  /* the needle span of run --needle / --needle-tokens: [needle_start, needle_end) token
  ** positions of the prompt, written as file attributes when needle_end > needle_start;
  ** needle_text (NULL: none) is the --needle text */
  int64_t needle_start, needle_end;
  const char *needle_text;
  /* sparsetrace import: JSON naming the source engine, its version and settings, and what could
  ** not be aligned per tap (schemas/trace-layout.md "Imported traces"); NULL for engine runs */
  const char *import_json;
} st_trace_run_attrs;

#endif
