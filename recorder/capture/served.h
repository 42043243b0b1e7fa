/*
** served.h — the capture proxy's HTTP listener and requests store, with the answers made here
** instead of relayed: what `sparsetrace serve` (cli/cmd_serve.c) stands on.
**
** Every request the listener reads becomes a row of the store's `requests` table exactly as a
** captured one does (capture_store.c; origin = 'served', migration 0010): the 'open' row is
** inserted before the handler runs, the finished row (status, headers, the bytes the client got,
** every SSE event with its time, the final message and usage reassembled from them) when it
** returns. Credentials the client sent (headers, query, body fields) are redacted by the same
** code as capture's (capture_redact.c): never written to the store or the log.
**
** Threading: the handler runs on one of the listener's worker threads (config.threads of them);
** everything an st_served_exchange offers is for that thread alone, during the call.
*/
#ifndef ST_SERVED_H
#define ST_SERVED_H

#include <stddef.h>

#include "common/base.h"

typedef struct st_served st_served;
typedef struct st_served_exchange st_served_exchange;

typedef struct st_served_config {
  const char *host;         /* an IP address; NULL: 127.0.0.1 (loopback) */
  int port;                 /* 0: any free port (st_served_port says which) */
  const char *store_dir;    /* trace store; created and migrated if missing */
  const char *served_by;    /* recorded in the row's upstream column (the model directory) */
  int threads;              /* handlers at once (the rest wait in the listener's queue) */
  size_t max_request_bytes; /* larger bodies: st_served_body_problem says 413; 0: 32 MiB */
  void (*handler)(void *user, st_served_exchange *x);
  void (*log)(void *user, const char *line); /* NULL: silent; thread-safe */
  void *user;
} st_served_config;

/* Opens the store, starts its writer and the listener. Nothing left running on failure. */
st_status st_served_start(const st_served_config *c, st_served **out);
int st_served_port(const st_served *s);
const char *st_served_url(const st_served *s); /* "http://HOST:PORT" */
/* Stops accepting, waits for running handlers, drains the store writer, frees s. The first store
** error of the whole run, if any. NULL ok. */
st_status st_served_stop(st_served *s);

/* ---- inside the handler: the request ------------------------------------------------------ */

const char *st_served_id(const st_served_exchange *x);     /* the row's id (uuid) */
const char *st_served_method(const st_served_exchange *x); /* "GET", "POST", ... */
const char *st_served_path(const st_served_exchange *x);   /* without the query */
/* First value of a request header (case-insensitive name), or NULL. */
const char *st_served_header(const st_served_exchange *x, const char *name);
/* The request body (NUL-terminated; len may be NULL), "" when there is none. */
const char *st_served_body(const st_served_exchange *x, size_t *len);
/* 0 when the request was read whole; else the status it must be answered with: 413 body too
** large, 431 head too large, 400 body cut short or not sent in time, 500 out of memory. */
int st_served_body_problem(const st_served_exchange *x, char *why, size_t why_len);

/* ---- inside the handler: the answer --------------------------------------------------------- */

/* Adds a response header, sent with the head (call before st_served_begin). 0 or -1 (OOM). */
int st_served_add_header(st_served_exchange *x, const char *name, const char *value);
/* Sends the head: status, Content-Type, the added headers; stream = 1 sends a chunked
** text/event-stream body (each st_served_write one chunk, an SSE event recorded as it goes),
** 0 a body of exactly content_length bytes. 0, or -1 when the client is gone. */
int st_served_begin(st_served_exchange *x, int status, const char *content_type, int stream,
                    size_t content_length);
/* Body bytes (teed into the record). 0, or -1 when the client is gone. */
int st_served_write(st_served_exchange *x, const void *p, size_t n);
/* A whole answer in one call: begin + write. */
int st_served_reply(st_served_exchange *x, int status, const char *content_type, const char *body,
                    size_t n);
/* 1 when the client hung up (polls its socket; never reads it). */
int st_served_client_gone(st_served_exchange *x);
/* The row's final state when the handler returns: complete (the default), or rejected (the
** server refused the request itself: 4xx/5xx of its own), or interrupted (shutting down). A
** client gone mid-answer is recorded client_aborted whatever is set. */
typedef enum st_served_outcome {
  ST_SERVED_COMPLETE = 0,
  ST_SERVED_REJECTED,
  ST_SERVED_INTERRUPTED
} st_served_outcome;
void st_served_set_outcome(st_served_exchange *x, st_served_outcome o, const char *detail);

#endif
