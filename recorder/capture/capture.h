/*
** capture.h — `sparsetrace capture`: an HTTP proxy that sits between an agentic client and its
** model server and records every exchange into the trace store; and the read side that lists,
** shows and exports what it recorded.
**
** Shape of the thing. A client (Claude-Code-style /v1/messages, Codex-style /v1/responses, any
** OpenAI-compatible /v1/chat/completions or /v1/completions) is pointed at the proxy instead of
** its server. The proxy relays each request upstream unchanged except for hop-by-hop headers
** (and, only when asked to with ask_prompt_ids, one field added to the JSON body that makes a
** sglang or vLLM server return the prompt token ids it ran)
** (capture_server.c accepts with civetweb, capture_upstream.c forwards with libcurl), streams
** the answer back chunk by chunk as it arrives (server-sent events are never buffered), and tees
** a copy: request and response bytes, headers with credentials redacted (capture_redact.c), the
** SSE events with their arrival times (capture_sse.c), and the final message reassembled from
** the stream (capture_message.c). A writer thread puts all of that in the store's index.sqlite,
** table `requests` (schemas/migrations/0002_capture.sql), spilling large bodies to files beside
** it (capture_store.c). The exported form of one record is schemas/capture.schema.json; a later
** `sparsetrace run --request FILE.json` consumes exactly that file.
**
** Guarantees the rest of the project may rely on:
**   - every request the proxy accepted has a row, inserted (state 'open') before the request is
**     forwarded and finished (state complete / upstream_error / client_aborted / interrupted /
**     rejected) when the exchange ends, including at shutdown: st_capture_stop() lets in-flight
**     exchanges finish for a grace period, then cuts them, marks them 'interrupted' and drains
**     the writer before returning;
**   - no credential (Authorization, x-api-key, api-key, *-api-key, cookies, proxy credentials,
**     secret-looking query parameters, userinfo in the upstream URL) is ever written to the
**     store or passed to the log callback; values are forwarded upstream untouched.
**
** Threading: st_capture_start/stop from one controlling thread; the log callback is called from
** worker threads (one complete line per call, no trailing newline) and must be thread-safe.
** Call curl_global_init() once before st_capture_start() (the CLI's main does).
*/
#ifndef ST_CAPTURE_H
#define ST_CAPTURE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/base.h"

/* Which serving engine to ask for the prompt token ids it ran (capture --ask-prompt-ids). The ask
** is a field added to the JSON body forwarded upstream, so it CHANGES the request the server sees;
** the record keeps the client's body unchanged and notes the addition (capture_internal.h,
** capture_ask_prompt_ids). */
typedef enum st_capture_prompt_ids {
  ST_CAPTURE_PROMPT_IDS_OFF = 0, /* forward bodies unchanged (the default) */
  ST_CAPTURE_PROMPT_IDS_SGLANG,  /* "return_prompt_token_ids" / "return_token_ids" (completions) */
  ST_CAPTURE_PROMPT_IDS_VLLM,    /* "return_token_ids" */
} st_capture_prompt_ids;

/* "sglang" / "vllm" -> the enum; ST_EINVAL with a message otherwise. */
st_status st_capture_prompt_ids_parse(const char *name, st_capture_prompt_ids *out);

typedef struct st_capture_config {
  const char *listen;         /* "HOST:PORT", ":PORT" or "PORT"; host defaults to 127.0.0.1;
                                 port 0 picks a free port (see st_capture_port) */
  const char *upstream;       /* base URL of the real server: "https://api.anthropic.com";
                                 a path prefix is kept ("http://h:8000/api" + "/v1/messages") */
  const char *upstream_proxy; /* NULL: curl's default (http_proxy/https_proxy/no_proxy from the
                                 environment); "": never use a proxy; else a proxy URL */
  const char *store_dir;      /* trace store; created if missing. NULL: ST_DEFAULT_STORE */
  int threads;                /* worker threads = most concurrent exchanges; 0: 256 */
  size_t max_request_bytes;   /* larger request bodies get 413; 0: 32 MiB */
  size_t max_record_bytes;    /* response bytes kept per record (relay goes on); 0: 256 MiB */
  size_t inline_max_bytes;    /* bodies above this go to files beside the index; 0: 1 MiB */
  int connect_timeout_ms;     /* upstream connect; 0: 10000 */
  int idle_timeout_ms;        /* upstream silent this long -> 504 / stream error; 0: 600000 */
  st_capture_prompt_ids ask_prompt_ids; /* OFF: relay bodies unchanged */
  void (*log)(void *user, const char *line); /* NULL: silent */
  void *log_user;
} st_capture_config;

/* Fills defaults (all zero/NULL fields mean "default"; listen = "127.0.0.1:8787"). */
void st_capture_config_init(st_capture_config *c);

typedef struct st_capture st_capture;

/* Opens (and migrates) the store, starts the store writer and the listener. On failure nothing
** is left running, *out is NULL and the message names the address, URL or store path. */
st_status st_capture_start(const st_capture_config *c, st_capture **out);

/* The port actually bound (useful with port 0), and "http://HOST:PORT" for clients. */
int st_capture_port(const st_capture *p);
const char *st_capture_url(const st_capture *p);

typedef struct st_capture_stats {
  uint64_t accepted;       /* exchanges started (each has a row) */
  uint64_t in_flight;      /* started and not yet finished */
  uint64_t completed;      /* finished with state 'complete' */
  uint64_t failed;         /* finished in any other state */
  uint64_t recorded;       /* finish rows committed by the store writer */
  uint64_t store_errors;   /* store writes that failed (message went to the log) */
} st_capture_stats;
void st_capture_get_stats(const st_capture *p, st_capture_stats *out);

/* Stops accepting, gives in-flight exchanges grace_ms to finish on their own, then aborts the
** rest (client gets the API's stream error event or a 503; rows are marked 'interrupted'),
** and drains the store writer. Returns when every accepted exchange is recorded, with the first
** store error of the whole run, if any. Call once; then st_capture_free(). */
st_status st_capture_shutdown(st_capture *p, int grace_ms);
/* While st_capture_shutdown() waits (called from another thread, e.g. on a second Ctrl-C):
** ends the grace period now. */
void st_capture_cut_now(st_capture *p);
void st_capture_free(st_capture *p); /* NULL ok; shuts down with no grace if still running */
/* st_capture_shutdown() then st_capture_free(). NULL ok. */
st_status st_capture_stop(st_capture *p, int grace_ms);

/* ---- Reading a store's captured requests (sparsetrace requests, run --request) ---------- */

typedef struct st_capture_db st_capture_db;

/* Opens <store_dir>/index.sqlite read-only. ST_ENOTFOUND when the store has no index or no
** requests table (no capture ever ran there). */
st_status st_capture_db_open(const char *store_dir, st_capture_db **out);
void st_capture_db_close(st_capture_db *db);

/* Resolves a reference typed by a user — a full id, a unique prefix of one (>= 4 characters),
** or "last" (most recently received) — to the full id (36 characters + NUL). ST_ENOTFOUND or
** ST_EINVAL (ambiguous prefix) with a message that says which. */
st_status st_capture_db_resolve(st_capture_db *db, const char *ref, char id_out[40]);

/* Summaries of the newest `limit` requests (0: all), newest first: a JSON array of objects with
** id, received_at, method, endpoint, api, stream, state, status, model, input_tokens,
** output_tokens, ttfb_ms, total_ms, request_bytes, response_bytes. Caller json_decref()s. */
st_status st_capture_db_list(st_capture_db *db, int limit, json_t **out);

/* The full record of one request as a JSON object following schemas/capture.schema.json
** (bodies as raw text, or base64 when not UTF-8; redacted headers; final message; timings with
** every SSE event; the prompt token ids the server returned, when it was asked for them).
** Caller json_decref()s. */
st_status st_capture_db_export(st_capture_db *db, const char *id, json_t **out);

/* Loads an exported record from a file and checks the fields a replay needs (schema, api,
** endpoint, request.body). The message names the file and what is missing. */
st_status st_capture_record_load(const char *path, json_t **out);

/* The schema tag written into every exported record. */
#define ST_CAPTURE_RECORD_SCHEMA "sparsetrace.capture/1"

#endif
