/*
** index.h — the trace store's SQLite index, <store>/index.sqlite (DESIGN.md "Trace format").
**
** The schema lives in schemas/migrations/NNNN_*.sql (documented there), compiled into the binary
** and applied in order by st_index_open() in read-write mode, tracked by PRAGMA user_version
** and marked with PRAGMA application_id ST_INDEX_APPLICATION_ID. Every connection runs in WAL
** mode with synchronous=NORMAL, foreign_keys=ON and a busy timeout; writers take the write lock
** up front (BEGIN IMMEDIATE) so that concurrent recorders queue instead of failing half-way.
** One st_index per thread.
*/
#ifndef ST_INDEX_H
#define ST_INDEX_H

#include <sqlite3.h>
#include <stdint.h>

#include "common/base.h"
#include "trace_format.h"

#define ST_INDEX_FILE "index.sqlite"
#define ST_INDEX_APPLICATION_ID 0x53545243 /* 'STRC' */
#define ST_INDEX_BUSY_TIMEOUT_MS 15000

typedef struct st_index st_index;

typedef enum st_index_mode {
  ST_INDEX_READ_ONLY = 0,  /* SQLITE_OPEN_READONLY + query_only; the index must exist. A store
                           ** this process cannot write (or ST_INDEX_READONLY=1 in the
                           ** environment) is opened by URI, mode=ro or immutable=1, with one
                           ** line on stderr saying so */
  ST_INDEX_READ_WRITE = 1, /* creates store_dir and the index if absent, applies migrations */
} st_index_mode;

/* Opens <store_dir>/index.sqlite. Errors: ST_ENOTFOUND (read-only and no index: the message says
** so and names the path), ST_EFORMAT (not a sparsetrace index), ST_EUNSUPPORTED (read-write on
** an index migrated by a newer build), ST_ESQLITE / ST_EIO otherwise. */
st_status st_index_open(const char *store_dir, st_index_mode mode, st_index **out);
void st_index_close(st_index *ix); /* NULL ok */

sqlite3 *st_index_db(st_index *ix);    /* for callers' own prepared statements */
const char *st_index_path(const st_index *ix);
/* sqlite3_errmsg(db), and for a failed write (SQLITE_FULL, SQLITE_IOERR_*) also which file and
** why, from the system error: "disk I/O error (writing /s/index.sqlite or its -wal file: the
** disk is full (No space left on device))". This thread's buffer, valid until the next call. */
const char *st_index_errmsg(sqlite3 *db);
int st_index_schema_version(st_index *ix); /* PRAGMA user_version of this index */
int st_index_latest_version(void);         /* last migration compiled into this build */

/* Write transactions: BEGIN IMMEDIATE (waits up to the busy timeout for other writers), COMMIT,
** ROLLBACK (safe to call when no transaction is open). */
st_status st_index_begin(st_index *ix);
st_status st_index_commit(st_index *ix);
void st_index_rollback(st_index *ix);

typedef struct st_index_build {
  const char *revision, *compiler, *build_type, *backend, *kernel_mode;
} st_index_build;

/* Id of the builds row for b, inserted if new. Use inside a write transaction. */
st_status st_index_build_id(st_index *ix, const st_index_build *b, int64_t *build_id);

typedef struct st_index_run {
  const char *run_id, *created_at, *model, *model_dir;
  const char *trace_path;     /* the path rule's form: st_index_trace_key() */
  int64_t n_prompt, n_tokens;
  const char *positions;      /* NULL = "all" */
  const char *settings_json;  /* NULL = "{}" */
  st_index_build build;
  int threads;
  const char *command_line, *request_id; /* NULL ok */
  double duration_s;          /* < 0: unknown */
  const char *content_digest; /* the trace's content_digest attribute (migration 0009); NULL ok */
  int replace_same_path;      /* 1 (--force): a row of another run with this trace_path is
                              ** deleted first, with a store_notes row and a note on stderr */
} st_index_run;

/* Inserts a completed run, its build and its taps (with statistics) in one transaction. */
st_status st_index_add_run(st_index *ix, const st_index_run *run, const st_trace_tap *taps,
                           int n_taps);

/* Prepares sql for reading only: exactly one statement (trailing ';', spaces and comments are
** fine), and sqlite3_stmt_readonly() must hold. ST_EINVAL with a message saying why otherwise
** (a write, several statements, a syntax error with SQLite's text). Caller finalizes *out. */
st_status st_index_prepare_readonly(st_index *ix, const char *sql, sqlite3_stmt **out);

/* A schema migration: name "NNNN_what.sql" (NNNN = the user_version it brings the index to). */
typedef struct st_index_migration {
  const char *name, *sql;
} st_index_migration;

/* Applies, in order, every migration numbered above db's user_version, each in its own
** BEGIN IMMEDIATE transaction together with the new user_version and the application_id.
** st_index_open uses the compiled-in list; exposed for tests. origin names db in messages. */
st_status st_index_migrate(sqlite3 *db, const char *origin, const st_index_migration *migrations,
                           int n_migrations);

/* Trace paths in runs.trace_path follow one rule (schemas/trace-layout.md "Trace paths in the
** index"): a trace inside the store is stored relative to the store directory, any other
** absolutely; both forms are symlink-free (realpath of the trace's directory). */
/* The stored form of trace (its directory must exist). */
st_status st_index_trace_key(const char *store_dir, const char *trace, char *out, size_t size);
/* A stored trace_path as a path to open: relative ones are joined to store_dir. Every reader of
** runs.trace_path uses this. -1 when it does not fit. */
int st_index_resolve_trace(const char *store_dir, const char *stored, char *out, size_t size);
/* The run recorded at the stored path key, if any (*found 1; run_id and created_at filled). */
st_status st_index_find_trace(st_index *ix, const char *key, char *run_id, size_t size,
                              char *created_at, size_t created_size, int *found);
/* The run's runs.content_digest (migration 0009): *found 1 when the run is indexed; digest ""
** when its row has none (indexed before digests existed). */
st_status st_index_run_digest(st_index *ix, const char *run_id, char *digest, size_t size,
                              int *found);
/* Deletes a run and, by ON DELETE CASCADE, its taps, needles, verdicts and replays. */
st_status st_index_delete_run(st_index *ix, const char *run_id);
/* Appends a row to store_notes (migration 0007): what a --force or a repair changed. */
st_status st_index_note(st_index *ix, const char *kind, const char *run_id,
                        const char *trace_path, const char *detail);

#endif
