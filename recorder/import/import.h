/*
** import.h — another engine's tensor dumps as a sparsetrace trace (`sparsetrace import`).
**
** A format is a directory of torch.save files named the sglang dumper's way
** (step=S___rank=R___dump_index=K___name=NAME[___layer_id=L][___...].pt, each a dict
** {"value": tensor, "meta": {...}} or a bare tensor) plus a mapping table, schemas/import/
** <format>.map, that says which NAME is which tap in which layout (compiled in; a --map file
** replaces it). The importer aligns what differs from the reference engine's layout — batch and
** size-1 axes, the flat multi-request token axis (split by seq_lens / rids, rows placed by
** positions), steps (chunked prefill, decode) stitched into one position axis, top-k as sorted
** sets of compressed-row ids, element types (bf16/fp16/fp64/fp8 to f32, int64 to int32) — and
** records what it could not align, per tap, in the trace's `import` attribute, which `inspect`
** shows. The trace is written by the recorder and indexed like any run, so inspect, diff, query,
** replay and bisect read it unchanged. Two more sources go through the same path: sglang-pass, a
** --debug-tensor-dump-output-folder directory whose Pass*.pt dicts hold many named tensors each,
** and ds4, antirez/ds4's raw float32/int32 files named PREFIX_NAME-LAYER_posPOS (shapes from the
** names and config.json, token ids from st_import_options.tokens).
*/
#ifndef ST_IMPORT_H
#define ST_IMPORT_H

#include <stdint.h>

#include "common/base.h"

typedef struct st_import_options {
  const char *format;       /* "sglang-dumper", "sglang-pass", "hf" or "ds4" */
  const char *source_dir;   /* the dump directory */
  const char *model_dir;    /* the checkpoint the source ran (config.json: layers, shapes) */
  const char *out_path;     /* the trace to write */
  const char *store_dir;    /* index.sqlite's directory; NULL: not indexed */
  const char *map_path;     /* a mapping table replacing the format's own, or NULL */
  const char *command_line; /* for provenance */
  int request;              /* which request of a multi-request step (index into seq_lens) */
  int force;                /* overwrite the trace file and its index row */
  const int32_t *tokens;    /* ds4: the token ids the run processed (its dumps hold none) */
  int64_t n_tokens;
} st_import_options;

typedef struct st_import_result {
  char run_id[40];
  int n_files, n_mapped, n_unmapped, n_taps, n_notes;
  long long n_tokens;
} st_import_result;

/* Reads the dumps, aligns them and writes the trace. Errors name the file and the tensor. */
st_status st_import_run(const st_import_options *opt, st_import_result *res);

/* The compiled-in mapping table of a format (NULL for an unknown format). */
const char *st_import_builtin_map(const char *format);

#endif
