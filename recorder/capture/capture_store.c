/*
** capture_store.c — putting exchanges into the store's index.sqlite, and reading them back.
**
** Writing. The relay must not wait on the disk: a request's time to first byte through the proxy
** should be within a millisecond of direct, and 200 concurrent streams must not serialise on a
** SQLite write lock. So workers only queue jobs (a pointer and a reference count, no copy) and
** one writer thread owns the database connection. Woken by the first job, it lingers a few
** milliseconds for more, takes every job waiting, summarises the finished exchanges (request
** JSON, final-message reassembly: capture_message.c; done here rather than on the worker so that
** the next request on a keep-alive connection does not wait for it), then runs the batch in one
** BEGIN IMMEDIATE transaction (each job inside its own SAVEPOINT, so one bad row cannot sink its
** neighbours) and commits: under load, many exchanges share one commit, and the writer competes
** for a core with the relay a few hundred times a second at most. WAL with synchronous=NORMAL
** (set by recorder/index.c) keeps a commit at a write() without fsync.
**
** Jobs per exchange. 'open' inserts the row as soon as the request is read, before it goes
** upstream: a proxy that dies mid-stream still leaves the request in the store. 'progress'
** (every CAPTURE_PROGRESS_MS or CAPTURE_PROGRESS_BYTES while relaying) appends the response
** bytes and SSE events relayed since the last one to the open row, so that a proxy killed with
** kill -9 leaves what its clients had received (up to inline_max bytes of body; every event).
** 'finish' is an upsert of the whole row (so a finish whose open failed still lands) plus the
** SSE events. At start, rows a dead proxy left open are marked 'interrupted'
** (reconcile_open_rows).
** Backpressure. The queue is bounded by finished exchanges (CAPTURE_STORE_MAX_FINISHED): a worker
** that finds that many waiting blocks in capture_store_submit_finish until the writer takes them.
** The worker has already written the whole answer to its client by then, so no relay waits on the
** disk; only the next exchange does, and only while the writer is that far behind. Unbounded, the
** queue held every finished exchange (bodies and events) the writer had not reached: the soak
** (bench/soak-results.md) saw the proxy's RSS double, to batches of 2,000+ jobs, on a loaded
** 2-core machine where the one writer thread got less CPU than the workers.
** Closing the store drains the queue first; st_capture_stop() closes it only after every worker
** has finished its exchange, so nothing accepted is dropped.
**
** Redaction happens here, at the last moment before bytes are written: header values by name,
** and every remembered credential value masked in bodies and scrubbed from text
** (capture_redact.c). Bodies above inline_max_bytes go to <store>/captures/<id>.request|.response
** (written to a temporary name and renamed, before the row that points at them commits).
**
** Reading. st_capture_db_* open the index read-only and turn rows into the JSON of
** schemas/capture.schema.json; `sparsetrace requests` prints them and a later
** `sparsetrace run --request` replays them.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "capture_internal.h"
#include "recorder/index.h"

/* ---- writer ------------------------------------------------------------------------------ */

#define CAPTURE_STORE_LINGER_MS 5
/* Finished exchanges queued for the writer before submitters wait (see Backpressure above). */
#define CAPTURE_STORE_MAX_FINISHED 256
/* A job that failed for want of memory is tried this many more times (20, 40, 60 ms apart). */
#define CAPTURE_STORE_NOMEM_RETRIES 3

/* What a worker hands over mid-exchange (capture_store_submit_progress): copies, already masked,
** because the worker goes on appending to the exchange while the writer runs. */
typedef struct progress_event {
  double t_ms;
  size_t offset, length;
  char *name;
} progress_event;

typedef struct progress {
  char *body;          /* response bytes to append to the row's response_body, or NULL */
  size_t body_len;
  char *headers;       /* response headers JSON (the first time), or NULL */
  int status, stream;
  size_t response_bytes;
  double headers_ms, ttfb_ms; /* < 0: not yet */
  size_t first_event, n_events; /* events[] are seq first_event.. */
  progress_event *events;
} progress;

enum job_kind { JOB_OPEN, JOB_PROGRESS, JOB_FINISH };

typedef struct job {
  struct job *next;
  int finish; /* JOB_OPEN: open row, JOB_PROGRESS: relayed so far, JOB_FINISH: finishing upsert */
  capture_exchange *x;
  capture_summary summary;
  progress pg;
} job;

struct capture_store {
  char *dir;
  size_t inline_max;
  void (*log)(void *, const char *);
  void *log_user;
  st_index *ix;
  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_cond_t room; /* signalled when the writer takes the queue */
  job *head, *tail;
  size_t queued_finished; /* finish jobs in head..tail */
  int stopping;
  atomic_uint_least64_t recorded, errors;
  int lock_fd; /* <store>/.capture.lock, held shared while this proxy runs */
  st_status first_error;
  char first_error_msg[512];
};

static void store_log(capture_store *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void store_log(capture_store *s, const char *fmt, ...) {
  if (!s->log) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  s->log(s->log_user, line);
}

/* Records a failed job: counted, logged, first one kept for capture_store_close(). */
static void store_error(capture_store *s, const capture_exchange *x, const char *what) {
  atomic_fetch_add(&s->errors, 1);
  store_log(s, "store: request %s: %s: %s", x->id, what, st_errmsg());
  pthread_mutex_lock(&s->mu);
  if (!s->first_error) {
    s->first_error = ST_ESQLITE;
    snprintf(s->first_error_msg, sizeof s->first_error_msg, "request %s: %s: %s", x->id, what,
             st_errmsg());
  }
  pthread_mutex_unlock(&s->mu);
}

/* JSON text of a header list: [[name, value], ...], credentials replaced and scrubbed. */
static char *headers_json(const capture_headers *h, const capture_secrets *secrets) {
  json_t *arr = json_array();
  for (size_t i = 0; arr && i < h->n; i++) {
    const char *v = capture_header_is_secret(h->items[i].name) ? CAPTURE_REDACTED : h->items[i].value;
    char *clean = capture_secrets_scrub(secrets, v);
    json_t *pair = json_pack("[ss]", h->items[i].name, clean ? clean : "");
    if (!pair) /* not UTF-8: keep the bytes as Latin-1-ish escapes would lie; say so */
      pair = json_pack("[ss]", "(header name or value not UTF-8)", "");
    free(clean);
    json_array_append_new(arr, pair);
  }
  char *text = arr ? json_dumps(arr, JSON_COMPACT) : NULL;
  json_decref(arr);
  return text;
}

/* Writes bytes to <dir>/captures/<id>.<suffix> atomically; *rel gets the store-relative path. */
static st_status write_body_file(capture_store *s, const char *id, const char *suffix,
                                 const char *data, size_t len, char **rel) {
  char path[4096], tmp[4200];
  int n = snprintf(path, sizeof path, "%s/captures", s->dir);
  if (n < 0 || (size_t)n >= sizeof path) return st_fail(ST_EINVAL, "store path too long");
  if (mkdir(path, 0777) != 0 && errno != EEXIST)
    return st_fail(ST_EIO, "cannot create %s: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s/captures/%s.%s", s->dir, id, suffix);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return st_fail(ST_EIO, "cannot create %s: %s", tmp, strerror(errno));
  int ok = fwrite(data, 1, len, f) == len;
  ok &= fflush(f) == 0;
  ok &= fclose(f) == 0;
  if (!ok || rename(tmp, path) != 0) {
    st_status st = st_fail(ST_EIO, "cannot write %s: %s", path, strerror(errno));
    unlink(tmp);
    return st;
  }
  if (asprintf(rel, "captures/%s.%s", id, suffix) < 0) return st_fail(ST_ENOMEM, "body path");
  return ST_OK;
}

/* A body ready to bind: data (masked if it held credentials) or a file path. */
typedef struct body_bind {
  const char *data;
  size_t len;
  char *owned;   /* masked copy, if one was needed */
  char *file;    /* store-relative path when spilled */
  size_t masked; /* credential occurrences masked */
} body_bind;

static st_status prepare_body(capture_store *s, const capture_exchange *x, const char *suffix,
                              const char *data, size_t len, int may_modify, body_bind *out) {
  memset(out, 0, sizeof *out);
  out->data = data;
  out->len = len;
  if (!data || len == 0) return ST_OK;
  /* Mask in a copy unless the caller owns the bytes outright (the worker may still be reading). */
  int found = 0;
  for (size_t i = 0; i < x->secrets.n && !found; i++) {
    size_t n = strlen(x->secrets.values[i]);
    found = n >= CAPTURE_SECRET_MIN && memmem(data, len, x->secrets.values[i], n) != NULL;
  }
  if (found) {
    char *buf = (char *)data;
    if (!may_modify) {
      if (!(out->owned = malloc(len))) return st_fail(ST_ENOMEM, "masking a %zu-byte body", len);
      memcpy(out->owned, data, len);
      buf = out->owned;
    }
    out->masked = capture_secrets_mask(&x->secrets, buf, len);
    out->data = buf;
  }
  if (len > s->inline_max) {
    st_status st = write_body_file(s, x->id, suffix, out->data, len, &out->file);
    if (st) return st;
    out->data = NULL;
  }
  return ST_OK;
}

static void body_bind_free(body_bind *b) {
  free(b->owned);
  free(b->file);
}

/* A value bound by copy (SQLITE_TRANSIENT) that memory did not suffice for since the last
** step_done: the parameter stays NULL, which INSERT OR IGNORE would take for a NOT NULL conflict
** and skip the row without a word. step_done fails the statement instead. */
static _Thread_local int bind_nomem;

static void bind_text(sqlite3_stmt *st, int i, const char *v) {
  if (v) bind_nomem |= sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT) == SQLITE_NOMEM;
  else sqlite3_bind_null(st, i);
}
static void bind_ms(sqlite3_stmt *st, int i, const capture_exchange *x, int64_t t) {
  if (t >= 0) sqlite3_bind_double(st, i, (double)(t - x->t0_ns) / 1e6);
  else sqlite3_bind_null(st, i);
}
static void bind_blob(sqlite3_stmt *st, int i, const body_bind *b) {
  if (b->data) sqlite3_bind_blob64(st, i, b->data, b->len, SQLITE_STATIC);
  else sqlite3_bind_null(st, i);
}

static st_status step_done(sqlite3 *db, sqlite3_stmt *st, const char *what) {
  if (bind_nomem) {
    bind_nomem = 0;
    return st_fail(ST_ENOMEM, "%s: out of memory binding a value", what);
  }
  int rc = sqlite3_step(st);
  if (rc != SQLITE_DONE) return st_fail(ST_ESQLITE, "%s: %s", what, st_index_errmsg(db));
  return ST_OK;
}

/* Columns both jobs write (the request side), numbered ?1..?13 in both statements. */
#define REQUEST_COLUMNS                                                                           \
  "id, received_at, method, endpoint, query, api, upstream, client_addr, request_headers, "      \
  "request_body, request_body_file, request_bytes, redactions"
#define REQUEST_PARAMS "?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13"
/* modified_request (migration 0004) is written by both jobs too, as ?36 (after the finish's ?35;
** the open statement simply leaves ?14..?35 unused). */
#define MODIFIED_PARAM "?36"
#define MODIFIED_INDEX 36
/* origin (migration 0010: 'proxied' or 'served') likewise, as ?39 in both statements. */
#define ORIGIN_PARAM "?39"
#define ORIGIN_INDEX 39

/* Binds the request side. When the open row is already in (x->open_recorded), the upsert will
** take its UPDATE branch, which ignores these values: the body is then not masked or spilled a
** second time. */
static st_status bind_request(capture_store *s, sqlite3_stmt *st, const capture_exchange *x,
                              body_bind *body) {
  char *headers = headers_json(&x->request_headers, &x->secrets);
  if (!headers) return st_fail(ST_ENOMEM, "request headers");
  st_status rc = x->open_recorded ? (memset(body, 0, sizeof *body), ST_OK)
                                  : prepare_body(s, x, "request", x->request_body.data,
                                                 x->request_body.len, 0, body);
  if (rc) {
    free(headers);
    return rc;
  }
  bind_text(st, 1, x->id);
  bind_text(st, 2, x->received_at);
  bind_text(st, 3, x->method);
  /* Path and query by value too: a key seen elsewhere in the request may sit in either. */
  char *path = capture_secrets_scrub(&x->secrets, x->path ? x->path : "");
  char *query = x->query ? capture_secrets_scrub(&x->secrets, x->query) : NULL;
  if (!path || (x->query && !query)) {
    free(path);
    free(query);
    free(headers);
    body_bind_free(body);
    memset(body, 0, sizeof *body);
    return st_fail(ST_ENOMEM, "request path");
  }
  sqlite3_bind_text(st, 4, path, -1, free);
  if (query) sqlite3_bind_text(st, 5, query, -1, free);
  else sqlite3_bind_null(st, 5);
  bind_text(st, 6, capture_api_name(x->api));
  bind_text(st, 7, x->upstream);
  bind_text(st, 8, x->client_addr);
  sqlite3_bind_text(st, 9, headers, -1, free);
  bind_blob(st, 10, body);
  bind_text(st, 11, body->file);
  sqlite3_bind_int64(st, 12, (sqlite3_int64)(x->request_body.len ? x->request_body.len
                                                                   : x->request_declared_bytes));
  sqlite3_bind_int64(st, 13, (sqlite3_int64)body->masked);
  return ST_OK;
}

static st_status write_open(capture_store *s, sqlite3 *db, job *j) {
  capture_exchange *x = j->x;
  sqlite3_stmt *st = NULL;
  body_bind body = {0};
  st_status rc = ST_OK;
  if (sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO requests (" REQUEST_COLUMNS
                             ", modified_request, origin, state) VALUES (" REQUEST_PARAMS ", "
                             MODIFIED_PARAM ", " ORIGIN_PARAM ", 'open')",
                         -1, &st, NULL) != SQLITE_OK) {
    rc = st_fail(ST_ESQLITE, "preparing insert: %s", sqlite3_errmsg(db));
    goto out;
  }
  if ((rc = bind_request(s, st, x, &body))) goto out;
  bind_text(st, MODIFIED_INDEX, x->modified_request);
  bind_text(st, ORIGIN_INDEX, x->served ? "served" : "proxied");
  rc = step_done(db, st, "inserting the open row");
  x->open_recorded = !rc && sqlite3_changes(db) == 1;
  x->open_redactions = body.masked;
out:
  sqlite3_finalize(st);
  body_bind_free(&body);
  return rc;
}

static st_status write_finish(capture_store *s, sqlite3 *db, job *j) {
  capture_exchange *x = j->x;
  capture_summary *sum = &j->summary;
  sqlite3_stmt *st = NULL;
  body_bind req = {0}, resp = {0};
  char *final_text = NULL;
  st_status rc = ST_OK;
  static const char *sql =
    "INSERT INTO requests (" REQUEST_COLUMNS ", stream, state, status, model, request_malformed, "
    "request_json_error, response_headers, response_body, response_body_file, response_bytes, "
    "response_truncated, final_message, stop_reason, input_tokens, output_tokens, n_events, "
    "headers_ms, ttfb_ms, total_ms, max_gap_ms, upstream_error, client_error, modified_request, "
    "prompt_token_ids, prompt_token_ids_from, origin) VALUES ("
    REQUEST_PARAMS ", ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28,"
    " ?29, ?30, ?31, ?32, ?33, ?34, ?35, " MODIFIED_PARAM ", ?37, ?38, " ORIGIN_PARAM ") "
    "ON CONFLICT (id) DO UPDATE SET stream = ?14, state = ?15, status = ?16, model = ?17, "
    "request_malformed = ?18, request_json_error = ?19, response_headers = ?20, "
    "response_body = ?21, response_body_file = ?22, response_bytes = ?23, "
    "response_truncated = ?24, final_message = ?25, stop_reason = ?26, input_tokens = ?27, "
    "output_tokens = ?28, n_events = ?29, headers_ms = ?30, ttfb_ms = ?31, total_ms = ?32, "
    "max_gap_ms = ?33, upstream_error = ?34, client_error = ?35, redactions = ?13, "
    "modified_request = " MODIFIED_PARAM ", prompt_token_ids = ?37, prompt_token_ids_from = ?38";
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
    rc = st_fail(ST_ESQLITE, "preparing upsert: %s", sqlite3_errmsg(db));
    goto out;
  }
  if ((rc = bind_request(s, st, x, &req))) goto out;
  if ((rc = prepare_body(s, x, "response", x->response_body.data, x->response_body.len, 1, &resp)))
    goto out;
  sqlite3_bind_int(st, 14, x->stream || sum->request_stream);
  bind_text(st, 15, capture_state_name(x->state));
  if (x->status > 0) sqlite3_bind_int(st, 16, x->status);
  else sqlite3_bind_null(st, 16);
  bind_text(st, 17, sum->model);
  sqlite3_bind_int(st, 18, sum->request_malformed);
  bind_text(st, 19, sum->request_json_error);
  if (x->status > 0) {
    char *h = headers_json(&x->response_headers, &x->secrets);
    if (!h) {
      rc = st_fail(ST_ENOMEM, "response headers");
      goto out;
    }
    sqlite3_bind_text(st, 20, h, -1, free);
  } else {
    sqlite3_bind_null(st, 20);
  }
  bind_blob(st, 21, &resp);
  bind_text(st, 22, resp.file);
  if (x->status > 0) sqlite3_bind_int64(st, 23, (sqlite3_int64)x->response_bytes);
  else sqlite3_bind_null(st, 23);
  sqlite3_bind_int(st, 24, x->response_truncated);
  if (sum->final_message) {
    char *raw = json_dumps(sum->final_message, JSON_COMPACT);
    final_text = raw ? capture_secrets_scrub(&x->secrets, raw) : NULL;
    free(raw);
  }
  bind_text(st, 25, final_text);
  bind_text(st, 26, sum->stop_reason);
  if (sum->input_tokens >= 0) sqlite3_bind_int64(st, 27, sum->input_tokens);
  if (sum->output_tokens >= 0) sqlite3_bind_int64(st, 28, sum->output_tokens);
  if (x->stream) sqlite3_bind_int64(st, 29, (sqlite3_int64)x->n_events);
  bind_ms(st, 30, x, x->t_headers_ns);
  bind_ms(st, 31, x, x->t_first_byte_ns);
  bind_ms(st, 32, x, x->t_end_ns);
  if (sum->max_gap_ms >= 0) sqlite3_bind_double(st, 33, sum->max_gap_ms);
  bind_text(st, 34, x->upstream_error);
  bind_text(st, 35, x->client_error);
  bind_text(st, MODIFIED_INDEX, x->modified_request);
  bind_text(st, ORIGIN_INDEX, x->served ? "served" : "proxied");
  if (sum->prompt_token_ids) { /* integers only (checked when found): nothing to scrub */
    sqlite3_bind_text(st, 37, json_dumps(sum->prompt_token_ids, JSON_COMPACT), -1, free);
    bind_text(st, 38, sum->prompt_token_ids_from);
  }
  sqlite3_bind_int64(st, 13, (sqlite3_int64)((x->open_recorded ? x->open_redactions : req.masked) +
                                             resp.masked));
  if ((rc = step_done(db, st, "finishing the row"))) goto out;
  sqlite3_finalize(st);
  st = NULL;

  if (x->n_events > 0) {
    if (sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO request_events (request_id, seq, t_ms, "
                               "byte_offset, byte_length, event) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                           -1, &st, NULL) != SQLITE_OK) {
      rc = st_fail(ST_ESQLITE, "preparing event insert: %s", sqlite3_errmsg(db));
      goto out;
    }
    for (size_t i = 0; i < x->n_events && !rc; i++) {
      char scratch[128];
      const capture_event *ev = &x->events[i];
      char *name = capture_secrets_scrub(&x->secrets, capture_event_name(ev, scratch, sizeof scratch));
      sqlite3_reset(st);
      bind_text(st, 1, x->id);
      sqlite3_bind_int64(st, 2, (sqlite3_int64)i);
      sqlite3_bind_double(st, 3, (double)ev->t_ns / 1e6);
      sqlite3_bind_int64(st, 4, (sqlite3_int64)ev->offset);
      sqlite3_bind_int64(st, 5, (sqlite3_int64)ev->length);
      bind_text(st, 6, name ? name : "message");
      free(name);
      rc = step_done(db, st, "inserting an event");
    }
  }
out:
  sqlite3_finalize(st);
  body_bind_free(&req);
  body_bind_free(&resp);
  free(final_text);
  return rc;
}

/* Appends what the worker relayed since its last progress job to the open row: response bytes,
** head, counters and events, so that a proxy killed mid-stream leaves them in the store. */
static st_status write_progress(capture_store *s, sqlite3 *db, job *j) {
  capture_exchange *x = j->x;
  progress *pg = &j->pg;
  sqlite3_stmt *st = NULL;
  st_status rc = ST_OK;
  static const char *sql =
    "UPDATE requests SET status = coalesce(?1, status), stream = max(stream, ?2), "
    "response_headers = coalesce(?3, response_headers), "
    "response_body = CASE WHEN ?4 IS NULL THEN response_body "
    "                ELSE CAST(coalesce(response_body, X'') || ?4 AS BLOB) END, "
    "response_bytes = ?5, n_events = CASE WHEN ?6 > 0 THEN ?6 ELSE n_events END, "
    "headers_ms = coalesce(?7, headers_ms), ttfb_ms = coalesce(?8, ttfb_ms) "
    "WHERE id = ?9 AND state = 'open'";
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    return st_fail(ST_ESQLITE, "preparing progress update: %s", sqlite3_errmsg(db));
  if (pg->status > 0) sqlite3_bind_int(st, 1, pg->status);
  sqlite3_bind_int(st, 2, pg->stream);
  if (pg->headers) sqlite3_bind_text(st, 3, pg->headers, -1, SQLITE_STATIC);
  if (pg->body) sqlite3_bind_blob64(st, 4, pg->body, pg->body_len, SQLITE_STATIC);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)pg->response_bytes);
  sqlite3_bind_int64(st, 6, (sqlite3_int64)(pg->first_event + pg->n_events));
  if (pg->headers_ms >= 0) sqlite3_bind_double(st, 7, pg->headers_ms);
  if (pg->ttfb_ms >= 0) sqlite3_bind_double(st, 8, pg->ttfb_ms);
  bind_text(st, 9, x->id);
  rc = step_done(db, st, "recording relayed bytes");
  sqlite3_finalize(st);
  st = NULL;
  if (rc || pg->n_events == 0) return rc;
  if (sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO request_events (request_id, seq, t_ms, "
                             "byte_offset, byte_length, event) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                         -1, &st, NULL) != SQLITE_OK)
    return st_fail(ST_ESQLITE, "preparing event insert: %s", sqlite3_errmsg(db));
  for (size_t i = 0; i < pg->n_events && !rc; i++) {
    const progress_event *ev = &pg->events[i];
    sqlite3_reset(st);
    bind_text(st, 1, x->id);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)(pg->first_event + i));
    sqlite3_bind_double(st, 3, ev->t_ms);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)ev->offset);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)ev->length);
    sqlite3_bind_text(st, 6, ev->name ? ev->name : "message", -1, SQLITE_STATIC);
    rc = step_done(db, st, "inserting an event");
  }
  sqlite3_finalize(st);
  return rc;
}

static void progress_free(progress *pg) {
  free(pg->body);
  free(pg->headers);
  for (size_t i = 0; i < pg->n_events; i++) free(pg->events[i].name);
  free(pg->events);
}

static void job_free(job *j) {
  progress_free(&j->pg);
  capture_summary_free(&j->summary);
  capture_exchange_unref(j->x);
  free(j);
}

/* Waits a little longer each time (round 0, 1, ...) before a write is tried again. */
static void retry_pause(int round) {
  struct timespec pause = {0, 20000000L * (round + 1)};
  nanosleep(&pause, NULL);
}

/* Whether SQLite rolled back the transaction in_txn says is open (it may, with the failing
** statement, when memory or the disk runs out). */
static int txn_lost(sqlite3 *db, int in_txn) { return in_txn && sqlite3_get_autocommit(db); }

/* Reverses the list of jobs done so far onto the front of rest: the batch in its order again. */
static job *requeue(job *done_list, job *rest) {
  while (done_list) {
    job *d = done_list;
    done_list = d->next;
    d->x->open_recorded = 0; /* rolled back: a later finish must insert the whole row */
    d->next = rest;
    rest = d;
  }
  return rest;
}

/* Runs a batch of jobs in one transaction, each in its own savepoint. When memory or the disk
** runs out inside a statement (a job's, or the savepoint's own), SQLite may roll the whole
** transaction back, not just the statement: the jobs written before it in this batch are then
** gone too, and what follows would run outside the transaction. The batch is run again from
** its first job in a new transaction (CAPTURE_STORE_NOMEM_RETRIES times, pausing longer each
** time); past that, each of its jobs is logged as lost, with the cause. */
static void run_batch(capture_store *s, job *batch) {
  sqlite3 *db = st_index_db(s->ix);
  /* Parsing and reassembly happen outside the write transaction, so other writers to the
  ** index (recorders, other proxies) wait only for the inserts. */
  for (job *j = batch; j; j = j->next)
    if (j->finish == JOB_FINISH) capture_summarize(j->x, &j->summary);
  for (int round = 0;; round++) {
    int in_txn = st_index_begin(s->ix) == ST_OK;
    if (!in_txn) store_log(s, "store: %s (writing each request on its own)", st_errmsg());
    int committed_any = 0, rolled_back = 0;
    job *done_list = NULL, *j = batch;
    while (j) {
      job *next = j->next;
      if (sqlite3_exec(db, "SAVEPOINT capture_job", NULL, NULL, NULL) != SQLITE_OK && txn_lost(db, in_txn)) {
        rolled_back = 1;
        break;
      }
      st_status rc;
      /* Memory running out is often a moment, not a state: a job that failed for it is rolled
      ** back and tried again (CAPTURE_STORE_NOMEM_RETRIES times, pausing longer each time) before
      ** its loss is logged. The writes change the exchange only once they succeed. */
      for (int attempt = 0;; attempt++) {
        bind_nomem = 0;
        rc = j->finish == JOB_FINISH     ? write_finish(s, db, j)
             : j->finish == JOB_PROGRESS ? write_progress(s, db, j)
                                         : write_open(s, db, j);
        if (!rc) break;
        if (txn_lost(db, in_txn)) {
          rolled_back = 1;
          break;
        }
        /* SQLite can report memory running out inside a statement as its CHECK failing (the
        ** json_valid of a column's CHECK, seen with a failed allocation in sqlite3BtreeDelete):
        ** tried once more; a real violation fails again and is logged. */
        int nomem = rc == ST_ENOMEM || sqlite3_errcode(db) == SQLITE_NOMEM ||
                    (attempt == 0 && sqlite3_extended_errcode(db) == SQLITE_CONSTRAINT_CHECK);
        sqlite3_exec(db, "ROLLBACK TO capture_job", NULL, NULL, NULL);
        if (!nomem || attempt == CAPTURE_STORE_NOMEM_RETRIES) break;
        retry_pause(attempt);
      }
      if (rolled_back) break;
      if (rc)
        store_error(s, j->x, j->finish == JOB_FINISH     ? "recording the finished exchange"
                             : j->finish == JOB_PROGRESS ? "recording relayed bytes"
                                                         : "recording the request");
      int released = sqlite3_exec(db, "RELEASE capture_job", NULL, NULL, NULL) == SQLITE_OK;
      if (!rc && j->finish == JOB_FINISH) committed_any++;
      j->next = done_list;
      done_list = j;
      j = next;
      if (!released && txn_lost(db, in_txn)) {
        rolled_back = 1;
        break;
      }
    }
    /* A COMMIT that fails for memory (its journal or page buffers) leaves nothing written: the
    ** batch is run again like one rolled back mid-way. Written before, its rows would be left
    ** 'open' with their finish lost. */
    if (!rolled_back && in_txn && st_index_commit(s->ix) != ST_OK) {
      int nomem = (sqlite3_errcode(db) & 0xff) == SQLITE_NOMEM ||
                  sqlite3_extended_errcode(db) == SQLITE_IOERR_NOMEM;
      st_index_rollback(s->ix);
      if (nomem && round < CAPTURE_STORE_NOMEM_RETRIES) {
        batch = requeue(done_list, NULL);
        retry_pause(round);
        continue;
      }
      for (job *d = done_list; d; d = d->next) {
        d->x->open_recorded = 0; /* rolled back: a later finish must insert the whole row */
        store_error(s, d->x, "committing");
      }
      committed_any = 0;
    }
    if (rolled_back) {
      batch = requeue(done_list, j); /* j: the first job not done (NULL: all were) */
      if (round < CAPTURE_STORE_NOMEM_RETRIES) {
        retry_pause(round);
        continue;
      }
      for (job *k = batch; k; k = k->next) store_error(s, k->x, "rolled back with its batch's transaction");
      done_list = batch; /* to be freed: nothing is left to commit */
      committed_any = 0;
    }
    atomic_fetch_add(&s->recorded, (uint64_t)committed_any);
    while (done_list) {
      job *next = done_list->next;
      job_free(done_list);
      done_list = next;
    }
    return;
  }
}

static void *writer_main(void *arg) {
  capture_store *s = arg;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (!s->head && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
    /* Group commit: once work arrives, linger a few milliseconds for more, so that a busy
    ** proxy commits many exchanges per transaction and the writer wakes (and competes for a
    ** core with the relay) a few hundred times a second at most, not twice per request. */
    if (!s->stopping) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += CAPTURE_STORE_LINGER_MS * 1000000L;
      if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
      while (!s->stopping && pthread_cond_timedwait(&s->cv, &s->mu, &until) == 0) {
      }
    }
    job *batch = s->head;
    s->head = s->tail = NULL;
    s->queued_finished = 0;
    pthread_cond_broadcast(&s->room);
    int stop = s->stopping;
    pthread_mutex_unlock(&s->mu);
    if (batch) run_batch(s, batch);
    else if (stop) break;
  }
  return NULL;
}

static void submit(capture_store *s, job *j) {
  pthread_mutex_lock(&s->mu);
  if (j->finish == JOB_FINISH) {
    while (s->queued_finished >= CAPTURE_STORE_MAX_FINISHED && !s->stopping)
      pthread_cond_wait(&s->room, &s->mu);
    s->queued_finished++;
  }
  int was_empty = s->head == NULL;
  if (s->tail) s->tail->next = j;
  else s->head = j;
  s->tail = j;
  if (was_empty) pthread_cond_signal(&s->cv); /* later ones join the lingering batch quietly */
  pthread_mutex_unlock(&s->mu);
}

void capture_store_submit_open(capture_store *s, capture_exchange *x) {
  job *j = calloc(1, sizeof *j);
  if (!j) {
    atomic_fetch_add(&s->errors, 1);
    store_log(s, "store: request %s: out of memory queueing the open row", x->id);
    return; /* the finish job (an upsert) still records the request */
  }
  capture_exchange_ref(x);
  j->x = x;
  submit(s, j);
}

void capture_store_submit_finish(capture_store *s, capture_exchange *x) {
  job *j = calloc(1, sizeof *j);
  if (!j) {
    atomic_fetch_add(&s->errors, 1);
    store_log(s, "store: request %s: out of memory queueing the finished exchange", x->id);
    return;
  }
  capture_exchange_ref(x);
  j->x = x;
  j->finish = JOB_FINISH;
  submit(s, j);
}

void capture_store_submit_progress(capture_store *s, capture_exchange *x) {
  size_t have = x->response_body.len;
  int head_new = x->status > 0 && !x->progress_head;
  if (have == x->progress_body && x->n_events == x->progress_events && !head_new &&
      x->response_bytes == x->progress_bytes)
    return;
  job *j = calloc(1, sizeof *j);
  if (!j) return; /* progress is best effort: the finish job records everything */
  progress *pg = &j->pg;
  pg->status = x->status;
  pg->stream = x->stream;
  pg->response_bytes = x->response_bytes;
  pg->headers_ms = x->t_headers_ns >= 0 ? (double)(x->t_headers_ns - x->t0_ns) / 1e6 : -1;
  pg->ttfb_ms = x->t_first_byte_ns >= 0 ? (double)(x->t_first_byte_ns - x->t0_ns) / 1e6 : -1;
  int oom = 0;
  if (head_new && !(pg->headers = headers_json(&x->response_headers, &x->secrets))) oom = 1;
  /* Body bytes, at most inline_max of them (appending to a BLOB rewrites it: past that, the
  ** finish job spills the body to a file anyway). A credential may straddle the end of what is
  ** flushed now: the last (longest secret - 1) bytes are held back until more has arrived, and
  ** each flush is masked with that much context before it, so no flushed byte belongs to an
  ** occurrence not wholly inside a masked copy. */
  size_t hold = 1;
  for (size_t i = 0; i < x->secrets.n; i++) {
    size_t n = strlen(x->secrets.values[i]);
    if (n >= CAPTURE_SECRET_MIN && n > hold) hold = n;
  }
  hold -= 1;
  size_t cap = have < s->inline_max ? have : s->inline_max;
  size_t upto = have > hold ? have - hold : 0;
  if (upto > cap) upto = cap;
  size_t from = x->progress_body;
  if (!oom && upto > from) {
    size_t ctx = from > hold ? from - hold : 0;
    char *copy = malloc(have - ctx);
    if (copy) {
      memcpy(copy, x->response_body.data + ctx, have - ctx);
      capture_secrets_mask(&x->secrets, copy, have - ctx);
      pg->body = malloc(upto - from);
      if (pg->body) {
        memcpy(pg->body, copy + (from - ctx), upto - from);
        pg->body_len = upto - from;
      }
      free(copy);
    }
    if (!pg->body) oom = 1;
  }
  size_t ne = x->n_events - x->progress_events;
  if (!oom && ne > 0) {
    pg->events = calloc(ne, sizeof *pg->events);
    for (size_t i = 0; pg->events && i < ne; i++) {
      const capture_event *ev = &x->events[x->progress_events + i];
      char scratch[128];
      pg->events[i].t_ms = (double)ev->t_ns / 1e6;
      pg->events[i].offset = ev->offset;
      pg->events[i].length = ev->length;
      pg->events[i].name = capture_secrets_scrub(&x->secrets, capture_event_name(ev, scratch, sizeof scratch));
      pg->n_events = i + 1;
    }
    if (!pg->events) oom = 1;
    pg->first_event = x->progress_events;
  }
  if (oom) {
    progress_free(pg);
    free(j);
    return;
  }
  if (pg->body) x->progress_body = upto;
  x->progress_events += pg->n_events;
  x->progress_head |= head_new;
  x->progress_bytes = x->response_bytes;
  x->progress_ns = capture_now_ns();
  capture_exchange_ref(x);
  j->x = x;
  j->finish = JOB_PROGRESS;
  submit(s, j);
}

/* Rows a proxy left 'open' are of one that died (kill -9, a crash, a power cut) unless that
** proxy is still running. Every running proxy holds <store>/.capture.lock shared; one that gets
** it exclusively at start is alone, so every open row is a dead one's: marked 'interrupted',
** keeping what was recorded of it (bytes relayed, events). Then it holds the lock shared like
** the others. With another proxy running the rows are left for a later start. */
static void reconcile_open_rows(capture_store *s) {
  char path[4096];
  snprintf(path, sizeof path, "%s/.capture.lock", s->dir);
  s->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (s->lock_fd < 0) {
    store_log(s, "store: cannot open %s (%s): rows left open by a dead proxy are not reconciled",
              path, strerror(errno));
    return;
  }
  if (flock(s->lock_fd, LOCK_EX | LOCK_NB) == 0) {
    sqlite3 *db = st_index_db(s->ix);
    char *err = NULL;
    if (sqlite3_exec(db, "UPDATE requests SET state = 'interrupted', upstream_error = "
                         "coalesce(upstream_error, 'interrupted: the proxy relaying this exchange "
                         "ended without finishing its record (killed or crashed); what it had "
                         "recorded by then is kept') WHERE state = 'open'",
                     NULL, NULL, &err) != SQLITE_OK) {
      store_log(s, "store: reconciling rows left open: %s", err ? err : "?");
    } else if (sqlite3_changes(db) > 0) {
      store_log(s, "store: %d request(s) left open by a proxy that did not stop cleanly marked "
                   "'interrupted' (what was relayed before it died is kept)", sqlite3_changes(db));
    }
    sqlite3_free(err);
  } else {
    store_log(s, "store: another capture proxy is running on this store; rows it has open are "
                 "left as they are");
  }
  flock(s->lock_fd, LOCK_SH); /* from exclusive: a conversion; else waits out a reconciling one */
}

st_status capture_store_open(const capture_store_options *o, capture_store **out) {
  *out = NULL;
  capture_store *s = calloc(1, sizeof *s);
  if (!s) return st_fail(ST_ENOMEM, "opening the capture store");
  s->dir = strdup(o->dir);
  s->inline_max = o->inline_max_bytes;
  s->log = o->log;
  s->log_user = o->log_user;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_cond_init(&s->room, NULL);
  st_status st = s->dir ? st_index_open(o->dir, ST_INDEX_READ_WRITE, &s->ix)
                        : st_fail(ST_ENOMEM, "store path");
  s->lock_fd = -1;
  if (!st) reconcile_open_rows(s);
  if (!st && pthread_create(&s->thread, NULL, writer_main, s) != 0)
    st = st_fail(ST_EIO, "starting the capture store writer: %s", strerror(errno));
  if (st) {
    if (s->lock_fd >= 0) close(s->lock_fd);
    st_index_close(s->ix);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->room);
    free(s->dir);
    free(s);
    return st;
  }
  s->thread_started = 1;
  *out = s;
  return ST_OK;
}

st_status capture_store_close(capture_store *s) {
  if (!s) return ST_OK;
  if (s->thread_started) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_cond_broadcast(&s->room);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
  }
  st_index_close(s->ix);
  if (s->lock_fd >= 0) close(s->lock_fd); /* releases the shared lock */
  st_status st = s->first_error;
  if (st) st_fail(st, "capture store %s: %s", s->dir, s->first_error_msg);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  pthread_cond_destroy(&s->room);
  free(s->dir);
  free(s);
  return st;
}

uint64_t capture_store_recorded(const capture_store *s) { return atomic_load(&s->recorded); }
uint64_t capture_store_errors(const capture_store *s) { return atomic_load(&s->errors); }

/* ---- reading ------------------------------------------------------------------------------- */

struct st_capture_db {
  st_index *ix;
  char *dir;
};

st_status st_capture_db_open(const char *store_dir, st_capture_db **out) {
  *out = NULL;
  st_index *ix = NULL;
  st_status st = st_index_open(store_dir, ST_INDEX_READ_ONLY, &ix);
  if (st) return st;
  sqlite3_stmt *q = NULL;
  int found = 0;
  if (sqlite3_prepare_v2(st_index_db(ix),
                         "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'requests'",
                         -1, &q, NULL) == SQLITE_OK)
    found = sqlite3_step(q) == SQLITE_ROW;
  sqlite3_finalize(q);
  if (!found) {
    st_index_close(ix);
    return st_fail(ST_ENOTFOUND, "store %s has no captured requests (its index predates "
                                 "`sparsetrace capture`; run a capture with --store %s)",
                   store_dir, store_dir);
  }
  st_capture_db *db = calloc(1, sizeof *db);
  if (!db || !(db->dir = strdup(store_dir))) {
    free(db);
    st_index_close(ix);
    return st_fail(ST_ENOMEM, "opening %s", store_dir);
  }
  db->ix = ix;
  *out = db;
  return ST_OK;
}

void st_capture_db_close(st_capture_db *db) {
  if (!db) return;
  st_index_close(db->ix);
  free(db->dir);
  free(db);
}

st_status st_capture_db_resolve(st_capture_db *db, const char *ref, char id_out[40]) {
  sqlite3 *sq = st_index_db(db->ix);
  sqlite3_stmt *q = NULL;
  int last = !strcmp(ref, "last");
  if (!last && strlen(ref) < 4)
    return st_fail(ST_EINVAL, "request id '%s' is too short: give at least 4 characters, or "
                              "'last'", ref);
  const char *sql = last ? "SELECT id FROM requests ORDER BY received_at DESC, rowid DESC LIMIT 1"
                         : "SELECT id FROM requests WHERE substr(id, 1, length(?1)) = ?1 "
                           "ORDER BY id LIMIT 3";
  if (sqlite3_prepare_v2(sq, sql, -1, &q, NULL) != SQLITE_OK)
    return st_fail(ST_ESQLITE, "looking up request %s: %s", ref, sqlite3_errmsg(sq));
  if (!last) sqlite3_bind_text(q, 1, ref, -1, SQLITE_TRANSIENT);
  int n = 0;
  char first[40] = "", second[40] = "";
  while (sqlite3_step(q) == SQLITE_ROW) {
    snprintf(n == 0 ? first : second, 40, "%s", (const char *)sqlite3_column_text(q, 0));
    if (++n == 2) break;
  }
  sqlite3_finalize(q);
  if (n == 0)
    return st_fail(ST_ENOTFOUND, last ? "no captured requests in store %s"
                                      : "no captured request with id '%s' in store %s",
                   last ? db->dir : ref, db->dir);
  if (n > 1)
    return st_fail(ST_EINVAL, "request id '%s' is ambiguous (%s, %s, ...): give more characters",
                   ref, first, second);
  snprintf(id_out, 40, "%s", first);
  return ST_OK;
}

static json_t *col_text(sqlite3_stmt *q, int i) {
  if (sqlite3_column_type(q, i) == SQLITE_NULL) return json_null();
  json_t *s = json_stringn((const char *)sqlite3_column_text(q, i), (size_t)sqlite3_column_bytes(q, i));
  return s ? s : json_null();
}
static json_t *col_int(sqlite3_stmt *q, int i) {
  return sqlite3_column_type(q, i) == SQLITE_NULL ? json_null()
                                                   : json_integer(sqlite3_column_int64(q, i));
}
static json_t *col_real(sqlite3_stmt *q, int i) {
  if (sqlite3_column_type(q, i) == SQLITE_NULL) return json_null();
  /* Milliseconds to microsecond precision: enough, and keeps exports readable. */
  return json_real((double)(int64_t)(sqlite3_column_double(q, i) * 1000.0 + 0.5) / 1000.0);
}
static json_t *col_json(sqlite3_stmt *q, int i) {
  if (sqlite3_column_type(q, i) == SQLITE_NULL) return json_null();
  json_t *v = json_loadb((const char *)sqlite3_column_text(q, i), (size_t)sqlite3_column_bytes(q, i),
                         JSON_DECODE_ANY, NULL);
  return v ? v : json_null();
}

st_status st_capture_db_list(st_capture_db *db, int limit, json_t **out) {
  *out = NULL;
  sqlite3 *sq = st_index_db(db->ix);
  sqlite3_stmt *q = NULL;
  /* origin is migration 0010's; a store last written by an older build holds proxied rows only */
  const char *sql = st_index_schema_version(db->ix) >= 10
    ? "SELECT id, received_at, method, endpoint, api, stream, state, status, model, input_tokens, "
      "output_tokens, ttfb_ms, total_ms, request_bytes, response_bytes, request_malformed, origin "
      "FROM requests ORDER BY received_at DESC, rowid DESC LIMIT ?1"
    : "SELECT id, received_at, method, endpoint, api, stream, state, status, model, input_tokens, "
      "output_tokens, ttfb_ms, total_ms, request_bytes, response_bytes, request_malformed, "
      "'proxied' FROM requests ORDER BY received_at DESC, rowid DESC LIMIT ?1";
  if (sqlite3_prepare_v2(sq, sql, -1, &q, NULL) != SQLITE_OK)
    return st_fail(ST_ESQLITE, "listing requests: %s", sqlite3_errmsg(sq));
  sqlite3_bind_int64(q, 1, limit > 0 ? limit : -1);
  json_t *arr = json_array();
  int rc;
  while (arr && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    json_t *o = json_object();
    json_object_set_new(o, "id", col_text(q, 0));
    json_object_set_new(o, "received_at", col_text(q, 1));
    json_object_set_new(o, "method", col_text(q, 2));
    json_object_set_new(o, "endpoint", col_text(q, 3));
    json_object_set_new(o, "api", col_text(q, 4));
    json_object_set_new(o, "stream", json_boolean(sqlite3_column_int(q, 5)));
    json_object_set_new(o, "state", col_text(q, 6));
    json_object_set_new(o, "status", col_int(q, 7));
    json_object_set_new(o, "model", col_text(q, 8));
    json_object_set_new(o, "input_tokens", col_int(q, 9));
    json_object_set_new(o, "output_tokens", col_int(q, 10));
    json_object_set_new(o, "ttfb_ms", col_real(q, 11));
    json_object_set_new(o, "total_ms", col_real(q, 12));
    json_object_set_new(o, "request_bytes", col_int(q, 13));
    json_object_set_new(o, "response_bytes", col_int(q, 14));
    json_object_set_new(o, "request_malformed", json_boolean(sqlite3_column_int(q, 15)));
    json_object_set_new(o, "origin", col_text(q, 16));
    json_array_append_new(arr, o);
  }
  st_status st = ST_OK;
  if (!arr) st = st_fail(ST_ENOMEM, "listing requests");
  else if (rc != SQLITE_DONE) st = st_fail(ST_ESQLITE, "listing requests: %s", sqlite3_errmsg(sq));
  sqlite3_finalize(q);
  if (st) json_decref(arr);
  else *out = arr;
  return st;
}

/* Sets "body" (raw text) or "body_base64" (not UTF-8) on obj from a BLOB column or its file. */
static st_status export_body(st_capture_db *db, sqlite3_stmt *q, int blob_col, int file_col,
                             json_t *obj) {
  const char *data = NULL;
  size_t len = 0;
  char *owned = NULL;
  if (sqlite3_column_type(q, file_col) != SQLITE_NULL) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", db->dir, (const char *)sqlite3_column_text(q, file_col));
    FILE *f = fopen(path, "rb");
    if (!f) return st_fail(ST_EIO, "cannot open captured body %s: %s", path, strerror(errno));
    st_buf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
      if (st_buf_add(&b, chunk, n)) {
        fclose(f);
        st_buf_free(&b);
        return st_fail(ST_ENOMEM, "reading %s", path);
      }
    fclose(f);
    len = b.len;
    data = owned = st_buf_take(&b, NULL);
  } else if (sqlite3_column_type(q, blob_col) != SQLITE_NULL) {
    data = sqlite3_column_blob(q, blob_col);
    len = (size_t)sqlite3_column_bytes(q, blob_col);
    if (!data) data = "";
  }
  if (!data) {
    json_object_set_new(obj, "body", json_null());
  } else {
    /* Only valid UTF-8 goes in as text (json_stringn checks); anything else as base64. */
    json_t *text = json_stringn(data, len);
    if (text) {
      json_object_set_new(obj, "body", text);
    } else {
      char *b64 = capture_base64(data, len);
      json_object_set_new(obj, "body", json_null());
      json_object_set_new(obj, "body_base64", b64 ? json_string(b64) : json_null());
      free(b64);
    }
  }
  free(owned);
  return ST_OK;
}

st_status st_capture_db_export(st_capture_db *db, const char *id, json_t **out) {
  *out = NULL;
  sqlite3 *sq = st_index_db(db->ix);
  sqlite3_stmt *q = NULL;
  static const char *sql =
    "SELECT id, received_at, method, endpoint, query, api, stream, state, status, upstream, "
    "client_addr, model, request_headers, request_body, request_body_file, request_bytes, "
    "request_malformed, request_json_error, response_headers, response_body, response_body_file, "
    "response_bytes, response_truncated, final_message, stop_reason, input_tokens, output_tokens, "
    "n_events, headers_ms, ttfb_ms, total_ms, max_gap_ms, upstream_error, client_error, "
    "redactions FROM requests WHERE id = ?1";
  if (sqlite3_prepare_v2(sq, sql, -1, &q, NULL) != SQLITE_OK)
    return st_fail(ST_ESQLITE, "reading request %s: %s", id, sqlite3_errmsg(sq));
  sqlite3_bind_text(q, 1, id, -1, SQLITE_TRANSIENT);
  if (sqlite3_step(q) != SQLITE_ROW) {
    sqlite3_finalize(q);
    return st_fail(ST_ENOTFOUND, "no captured request with id '%s' in store %s", id, db->dir);
  }
  json_t *r = json_object(), *req = json_object(), *resp = json_object(), *tim = json_object();
  json_t *errs = json_object(), *usage = json_object(), *events = json_array();
  st_status st = ST_OK;
  if (!r || !req || !resp || !tim || !errs || !usage || !events) {
    st = st_fail(ST_ENOMEM, "exporting request %s", id);
    goto out;
  }
  json_object_set_new(r, "schema", json_string(ST_CAPTURE_RECORD_SCHEMA));
  static const char *const top[] = {"id", "received_at", "method", "endpoint", "query", "api"};
  for (int i = 0; i < 6; i++) json_object_set_new(r, top[i], col_text(q, i));
  json_object_set_new(r, "stream", json_boolean(sqlite3_column_int(q, 6)));
  json_object_set_new(r, "state", col_text(q, 7));
  json_object_set_new(r, "status", col_int(q, 8));
  json_object_set_new(r, "upstream", col_text(q, 9));
  json_object_set_new(r, "client_addr", col_text(q, 10));
  json_object_set_new(r, "model", col_text(q, 11));

  json_object_set_new(req, "headers", col_json(q, 12));
  if ((st = export_body(db, q, 13, 14, req))) goto out;
  json_object_set_new(req, "bytes", col_int(q, 15));
  json_object_set_new(req, "malformed", json_boolean(sqlite3_column_int(q, 16)));
  json_object_set_new(req, "json_error", col_text(q, 17));
  json_object_set(r, "request", req);

  json_object_set_new(resp, "headers", col_json(q, 18));
  if ((st = export_body(db, q, 19, 20, resp))) goto out;
  json_object_set_new(resp, "bytes", col_int(q, 21));
  json_object_set_new(resp, "truncated", json_boolean(sqlite3_column_int(q, 22)));
  json_object_set(r, "response", resp);

  json_object_set_new(r, "final_message", col_json(q, 23));
  json_object_set_new(r, "stop_reason", col_text(q, 24));
  json_object_set_new(usage, "input_tokens", col_int(q, 25));
  json_object_set_new(usage, "output_tokens", col_int(q, 26));
  json_object_set(r, "usage", usage);

  json_object_set_new(tim, "n_events", col_int(q, 27));
  json_object_set_new(tim, "headers_ms", col_real(q, 28));
  json_object_set_new(tim, "ttfb_ms", col_real(q, 29));
  json_object_set_new(tim, "total_ms", col_real(q, 30));
  json_object_set_new(tim, "max_gap_ms", col_real(q, 31));
  json_object_set_new(errs, "upstream", col_text(q, 32));
  json_object_set_new(errs, "client", col_text(q, 33));
  json_object_set(r, "errors", errs);
  json_object_set_new(r, "redactions", col_int(q, 34));
  sqlite3_finalize(q);
  q = NULL;

  /* Migration 0004's columns; a store last written by an older build has none of them (it is
  ** opened read-only, so not migrated): the record then says null. */
  json_object_set_new(req, "modified", json_null());
  json_object_set_new(r, "prompt_token_ids", json_null());
  json_object_set_new(r, "prompt_token_ids_from", json_null());
  if (st_index_schema_version(db->ix) >= 4) {
    if (sqlite3_prepare_v2(sq, "SELECT modified_request, prompt_token_ids, prompt_token_ids_from "
                               "FROM requests WHERE id = ?1", -1, &q, NULL) != SQLITE_OK) {
      st = st_fail(ST_ESQLITE, "reading the prompt ids of %s: %s", id, sqlite3_errmsg(sq));
      goto out;
    }
    sqlite3_bind_text(q, 1, id, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(q) == SQLITE_ROW) {
      json_object_set_new(req, "modified", col_json(q, 0));
      json_object_set_new(r, "prompt_token_ids", col_json(q, 1));
      json_object_set_new(r, "prompt_token_ids_from", col_text(q, 2));
    }
    sqlite3_finalize(q);
    q = NULL;
  }
  /* Migration 0010's origin: 'proxied' (capture) or 'served' (serve); older stores only proxied. */
  json_object_set_new(r, "origin", json_string("proxied"));
  if (st_index_schema_version(db->ix) >= 10) {
    if (sqlite3_prepare_v2(sq, "SELECT origin FROM requests WHERE id = ?1", -1, &q, NULL) != SQLITE_OK) {
      st = st_fail(ST_ESQLITE, "reading the origin of %s: %s", id, sqlite3_errmsg(sq));
      goto out;
    }
    sqlite3_bind_text(q, 1, id, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(q) == SQLITE_ROW) json_object_set_new(r, "origin", col_text(q, 0));
    sqlite3_finalize(q);
    q = NULL;
  }

  if (sqlite3_prepare_v2(sq, "SELECT seq, t_ms, gap_ms, event, byte_offset, byte_length FROM "
                             "request_event_gaps WHERE request_id = ?1 ORDER BY seq",
                         -1, &q, NULL) != SQLITE_OK) {
    st = st_fail(ST_ESQLITE, "reading events of %s: %s", id, sqlite3_errmsg(sq));
    goto out;
  }
  sqlite3_bind_text(q, 1, id, -1, SQLITE_TRANSIENT);
  while (sqlite3_step(q) == SQLITE_ROW) {
    json_t *e = json_object();
    json_object_set_new(e, "seq", col_int(q, 0));
    json_object_set_new(e, "t_ms", col_real(q, 1));
    json_object_set_new(e, "gap_ms", col_real(q, 2));
    json_object_set_new(e, "event", col_text(q, 3));
    json_object_set_new(e, "offset", col_int(q, 4));
    json_object_set_new(e, "length", col_int(q, 5));
    json_array_append_new(events, e);
  }
  json_object_set(tim, "events", events);
  json_object_set(r, "timings", tim);
out:
  sqlite3_finalize(q);
  json_decref(req);
  json_decref(resp);
  json_decref(tim);
  json_decref(errs);
  json_decref(usage);
  json_decref(events);
  if (st) json_decref(r);
  else *out = r;
  return st;
}

st_status st_capture_record_load(const char *path, json_t **out) {
  *out = NULL;
  json_error_t err;
  json_t *r = json_load_file(path, 0, &err);
  if (!r)
    return st_fail(ST_EFORMAT, "%s:%d:%d: not a JSON capture record: %s", path, err.line,
                   err.column, err.text);
  const char *schema = json_string_value(json_object_get(r, "schema"));
  const char *missing = NULL;
  if (!schema || strcmp(schema, ST_CAPTURE_RECORD_SCHEMA)) missing = "\"schema\": \"" ST_CAPTURE_RECORD_SCHEMA "\"";
  else if (!json_is_string(json_object_get(r, "api"))) missing = "\"api\"";
  else if (!json_is_string(json_object_get(r, "endpoint"))) missing = "\"endpoint\"";
  else if (!json_is_object(json_object_get(r, "request"))) missing = "\"request\"";
  else if (!json_is_string(json_object_get(json_object_get(r, "request"), "body")) &&
           !json_is_string(json_object_get(json_object_get(r, "request"), "body_base64")))
    missing = "\"request\".\"body\"";
  if (missing) {
    json_decref(r);
    return st_fail(ST_EFORMAT, "%s: not a capture record (%s missing or wrong; export one with "
                               "`sparsetrace requests export ID`)", path, missing);
  }
  *out = r;
  return ST_OK;
}
