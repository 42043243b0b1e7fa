/*
** recorder.h — records the values the engine emits at armed taps into one HDF5 trace per run,
** and adds the run to the store's index.sqlite once the file is complete.
**
** The engine calls the sink (engine/taps.h) from its own thread; the recorder filters rows by
** the positions spec, copies them, and queues them to a writer thread that owns every HDF5 call.
** The trace is written as <path>.part and renamed to <path> by st_recorder_finish(); only then is
** the run inserted into the index (docs/design.md "Trace format").
*/
#ifndef ST_RECORDER_H
#define ST_RECORDER_H

#include <stdint.h>

#include "common/base.h"
#include "engine/taps.h"

typedef struct st_run_meta {
  char run_id[40];             /* uuid v4 text, filled by st_run_id_new() */
  const char *model_dir;       /* as given by the user */
  const char *model_name;      /* basename of model_dir */
  const char *settings_json;   /* resolved settings, {"precision":"exact","index_k":"fp32",...} */
  const char *config_json;     /* the model's config.json text (stored as an attribute) */
  const char *backend;         /* "cpu-ref" */
  const char *kernel_mode;     /* "deterministic" */
  int threads;
  const char *command_line;    /* argv joined, for provenance */
  const char *request_id;      /* captured request this run replays, or NULL */
  const char *positions;       /* "all" | "last" | "A:B" (half-open token range) */
  int n_layers;                /* for the tap catalogue */
  int force;                   /* 1: overwrite an existing trace file and replace the index row
                               ** of the run that held its path (a note says which) */
  int64_t needle_start, needle_end; /* run --needle/--needle-tokens span (end > start), else 0, 0 */
  const char *needle_text;     /* --needle TEXT, or NULL */
  const char *import_json;     /* sparsetrace import: the trace attribute `import`, or NULL */
} st_run_meta;

/* Fills meta->run_id with a fresh random uuid. */
void st_run_id_new(st_run_meta *meta);

typedef struct st_recorder st_recorder;

/* Starts a trace at h5_path (written as h5_path.part until finished). store_dir is where
** index.sqlite lives (created and migrated if absent); NULL records no index row. n_prompt is
** the number of prompt tokens (positions "last" means: the last prompt position and every
** generated position). */
st_status st_recorder_open(const char *h5_path, const char *store_dir, const st_run_meta *meta,
                           int64_t n_prompt, st_recorder **out);

/* Refuses, before anything is computed, a trace path the store's index already gives to a run
** (the message names the run and --force) or a trace file that exists; with force both are
** allowed. Creates the store and the trace's directory. Called by st_recorder_open; callers may
** call it earlier (before loading a model). */
st_status st_recorder_check_target(const char *h5_path, const char *store_dir, int force);

/* The sink to hand to the engine; valid until finish/abort. */
const st_tap_sink *st_recorder_sink(st_recorder *r);

/* The run's non-finite warnings (NaN/inf weight tensors plus positions with non-finite logits),
** recorded as the trace attribute nonfinite_warnings at finish. */
void st_recorder_note_nonfinite(st_recorder *r, int64_t n);

/* sparsetrace import: the per-tap alignment notes (JSON), the trace attribute import_notes. */
st_status st_recorder_set_import_notes(st_recorder *r, const char *json);

/* Writes /tokens (prompt then generated) with attribute n_prompt, drains the writer thread,
** closes and renames the file, inserts the run, its build and its taps (with shape, dtype and
** summary statistics) into the index. Frees r in every case. */
st_status st_recorder_finish(st_recorder *r, const int32_t *tokens, int64_t n_tokens,
                             int64_t n_prompt);

/* Stops the writer, keeps the .part file (for diagnosis), indexes nothing. Frees r. NULL ok. */
void st_recorder_abort(st_recorder *r);

/* Default store: ./traces. Run files go to <store>/runs/<run_id>.h5. */
#define ST_DEFAULT_STORE "traces"

#endif
