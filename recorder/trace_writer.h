/*
** trace_writer.h — writes one HDF5 trace (schemas/trace-layout.md) from its own thread.
**
** The caller (the engine's thread, through recorder.c) appends blocks of rows; each append
** copies the rows and queues them. A single writer thread owns the file and makes every HDF5
** call, so the engine never waits on the disk unless the queue holds more than the limit
** (default 256 MiB): then append blocks until the writer has caught up. Nothing is dropped.
** An HDF5 error on the writer thread is sticky: later appends and finish return it.
*/
#ifndef ST_TRACE_WRITER_H
#define ST_TRACE_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "trace_format.h"

typedef struct st_trace_writer st_trace_writer;

typedef struct st_trace_writer_options {
  size_t queue_limit_bytes;  /* 0: 256 MiB. Bytes of copied rows waiting for the writer. */
  size_t chunk_target_bytes; /* 0: 64 KiB. Smallest chunk aimed for (chunks stay <= 1 MiB). */
  int deflate_level;         /* 0: no filter (default); 1-9: shuffle + deflate at that level */
} st_trace_writer_options;

/* Creates the HDF5 file at path (truncating any file there; the recorder passes <trace>.part)
** with the run's file attributes, and starts the writer thread. The parent directory must
** exist. opts may be NULL. On failure nothing is left running and *out is NULL. */
st_status st_trace_writer_open(const char *path, const st_trace_run_attrs *attrs,
                               const st_trace_writer_options *opts, st_trace_writer **out);

/* Queues a copy of a block of rows of tap (id, layer): rank dims, shape[0] rows, row-major data
** (borrowed; copied before return). Position taps: row i holds token position pos0 + i and is
** appended after the rows already written. Row taps (catalogue row_axis): the rows are
** compressed rows pos0 .. pos0 + shape[0] - 1 and are written at those indices (rows emitted
** again overwrite the earlier ones, and then count twice in the statistics). Axes 1.. may
** grow between appends (the dataset grows; rows written earlier read as fill: -inf for floats,
** -1 for integers); rank and dtype may not change. Blocks while the queue is over its limit.
** Returns the writer's sticky error if it has failed. */
st_status st_trace_writer_append(st_trace_writer *w, st_tap_id id, int layer, int64_t pos0,
                                 st_dtype dtype, int rank, const int64_t *shape, const void *data);

/* The run's count of non-finite warnings (weight tensors holding NaN/inf, positions with
** non-finite logits), written at finish as the file attribute nonfinite_warnings (0 when none).
** Call before st_trace_writer_finish. */
void st_trace_writer_set_nonfinite(st_trace_writer *w, int64_t n);

/* sparsetrace import: what could not be aligned, per tap (JSON, copied), written at finish as
** the file attribute import_notes. */
st_status st_trace_writer_set_import_notes(st_trace_writer *w, const char *json);

/* Where st_trace_writer_finish copies, on success, the content digest it wrote as the file
** attribute content_digest ("fnv1a64:<16 hex>", ST_TRACE_DIGEST_LEN bytes with the NUL; see
** st_h5_content_digest and schemas/trace-layout.md). Call before finish. */
#define ST_TRACE_DIGEST_LEN 25
void st_trace_writer_digest_out(st_trace_writer *w, char *out);

/* Drains the queue, writes /tokens (borrowed, n_tokens values) with attribute n_prompt, the
** positions datasets, per-tap statistics and the recording cost (file attributes writer_cpu_s,
** emit_wait_s, writer_peak_queued), the content digest (content_digest), marks the file complete and closes it. On success
** *taps (if taps non-NULL) receives a malloc'd array of *n_taps descriptors, in the order taps
** were first written; the caller frees it. Frees w in every case. */
st_status st_trace_writer_finish(st_trace_writer *w, const int32_t *tokens, int64_t n_tokens,
                                 int64_t n_prompt, st_trace_tap **taps, int *n_taps);

/* Discards whatever is queued, closes the file without marking it complete, frees w. NULL ok. */
void st_trace_writer_abort(st_trace_writer *w);

/* Largest number of queued bytes seen so far (for tests and diagnostics). */
size_t st_trace_writer_peak_queued(st_trace_writer *w);

#endif
