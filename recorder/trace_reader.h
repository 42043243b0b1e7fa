/*
** trace_reader.h — reads a sparsetrace HDF5 trace (schemas/trace-layout.md): run metadata,
** tokens, the list of recorded taps with shape, dtype and statistics, and a tap's rows.
**
** Used by `sparsetrace inspect` and by the replayer. Opening validates the file (HDF5 readable,
** format attribute, schema version, complete mark, /tokens) so that a truncated, corrupt or
** unfinished trace gives one clear error naming the file instead of failing later. Every read
** makes its own HDF5 calls on the calling thread; one st_trace must not be used from two threads
** at once.
*/
#ifndef ST_TRACE_READER_H
#define ST_TRACE_READER_H

#include <stddef.h>
#include <stdint.h>

#include "trace_format.h"

typedef struct st_trace st_trace;

enum {
  /* Open a trace that was not finished (a .part file, or no complete mark) instead of failing
  ** with ST_EFORMAT; st_trace_is_complete() then tells. Its /tokens may be missing. */
  ST_TRACE_OPEN_INCOMPLETE = 1u << 0,
  /* Skip the pre-check in a child process (below): for the fuzzer, which must see libhdf5's own
  ** faults to count them. */
  ST_TRACE_OPEN_IN_PROCESS = 1u << 1,
};

/* Opens path read-only and loads the metadata, tokens and tap list. Errors name the file:
** ST_ENOTFOUND (no such file), ST_EFORMAT (not HDF5, truncated, corrupt, not a sparsetrace
** trace, unfinished), ST_EUNSUPPORTED (written by a newer schema).
** A forked child does the same open first and exits: libhdf5 1.10 still crashes on some
** corrupt files in ways no caller can check beforehand (inside H5HG_read, fetching a string
** attribute from the global heap: tests/data/hostile/heap-read-crash.h5), and a child that
** dies on a signal, or runs past 30 s, makes this ST_EFORMAT ("trace F is corrupt: the HDF5
** library crashed reading it (signal N, ...)") instead of the caller's death. Cost: a fork and
** a second open of the metadata, 3 ms (a small trace) to 7 ms (54 taps) more than the 0.6 to
** 4 ms of the open itself. Not for callers with another thread inside HDF5 at the time (the
** child would wait on the library's lock; the recorder's writer never opens traces). Reads
** after the open (rows, positions, the content digest) run in process. */
st_status st_trace_open(const char *path, unsigned flags, st_trace **out);
void st_trace_close(st_trace *t); /* NULL ok */

const char *st_trace_path(const st_trace *t);
/* 1 when the writer finished the file (complete mark present and the name is not .part). */
int st_trace_is_complete(const st_trace *t);

/* A string file attribute (run_id, model, model_dir, settings, config, build_revision, compiler,
** build_type, backend, kernel_mode, created_at, command_line, request_id, positions, format,
** ...: the names of ST_TRACE_FILE_ATTRS in trace_format.h, the only ones read), or NULL when the
** trace has none. Valid until st_trace_close. */
const char *st_trace_attr(const st_trace *t, const char *name);
/* An integer file attribute (threads, n_layers, schema_version, complete), or fallback. */
int64_t st_trace_attr_int(const st_trace *t, const char *name, int64_t fallback);

/* Tokens (prompt then generated), valid until st_trace_close; n_prompt from /tokens. */
const int32_t *st_trace_tokens(const st_trace *t, int64_t *n_tokens);
int64_t st_trace_n_prompt(const st_trace *t);

/* Taps in forward order (layer by layer in catalogue order, model-scope taps last). A tap's
** stats.count is -1 when the file holds no statistics for it (written at finish: an unfinished
** recording opened with ST_TRACE_OPEN_INCOMPLETE). */
int st_trace_tap_count(const st_trace *t);
const st_trace_tap *st_trace_tap_at(const st_trace *t, int i);
/* By full name ("layers.3.indexer.q") or by catalogue id and layer (-1 for model taps);
** NULL when the trace does not hold that tap. */
const st_trace_tap *st_trace_find_tap(const st_trace *t, const char *name);
const st_trace_tap *st_trace_find_tap_id(const st_trace *t, st_tap_id id, int layer);

/* Checks a tap against the trace's own metadata: its element count against the count attribute
** written at finish (a dataset cut or grown afterwards fails), its position rows against
** /tokens. ST_EFORMAT with a message naming the file and the tap. The replayer checks every tap
** it reads. */
st_status st_trace_check_tap(const st_trace *t, const st_trace_tap *tap);

/* Recomputes the trace's content digest from its datasets (st_h5_content_digest: FNV-1a 64 over
** every dataset's path, type, extents and bytes, in path order; schemas/trace-layout.md) into out
** (ST_TRACE_DIGEST_LEN = 25 bytes with the NUL: "fnv1a64:<16 hex>"). Reads every dataset. */
st_status st_trace_content_digest(st_trace *t, char *out);

/* Checks the trace's content: recomputes its digest and compares it with the file attribute
** content_digest and, when expected is non-NULL and non-empty, with expected (the index's
** runs.content_digest). ST_EFORMAT naming the file and both digests when one differs (the trace
** was modified after it was written); ST_OK when they match. A trace without the attribute
** (written before digests existed) passes when expected is NULL or empty, and *verified (if
** non-NULL) is then 0; otherwise 1. computed (if non-NULL) receives the recomputed digest. */
st_status st_trace_verify_digest(st_trace *t, const char *expected, int *verified, char *computed);

/* Elements per row: the product of shape[1..rank-1] (1 for rank-1 taps). */
size_t st_trace_row_elements(const st_trace_tap *tap);

/* Reads rows [row0, row0 + n_rows) of tap into out (n_rows * st_trace_row_elements values,
** row-major; caller's buffer). Converts: _f32 accepts float32/float64/float16/bfloat16 and
** integer taps; _i32 accepts integer taps only. Elements that were never written hold the fill
** value (-inf, -1). ST_EINVAL when the range is outside the tap or the dtype does not convert. */
st_status st_trace_read_f32(st_trace *t, const st_trace_tap *tap, int64_t row0, int64_t n_rows,
                            float *out);
st_status st_trace_read_i32(st_trace *t, const st_trace_tap *tap, int64_t row0, int64_t n_rows,
                            int32_t *out);

/* The token position of every row (shape[0] values into out). Rows of row taps map to their row
** index; position taps without a positions dataset map row i to position i. */
st_status st_trace_read_positions(st_trace *t, const st_trace_tap *tap, int64_t *out);
/* The row holding token position `position` (row index for row taps); ST_ENOTFOUND when the
** trace did not keep it. */
st_status st_trace_find_position(st_trace *t, const st_trace_tap *tap, int64_t position,
                                 int64_t *row);

#endif
