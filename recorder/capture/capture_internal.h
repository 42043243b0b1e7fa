/*
** capture_internal.h — what the capture_*.c files share and nobody else sees.
**
** One HTTP exchange through the proxy is a `capture_exchange`. The worker thread that the listener
** gives the request owns it while relaying; the store writer reads it twice: once when the
** request has been read (to insert the 'open' row) and once when the exchange is over (to
** finish the row). The fields the first read uses are immutable after submission, and the
** second submission happens after the worker is done with everything else, so the two never
** race; a reference count decides who frees it.
**
** Small helpers live here as static inline functions: an ordered list of header pairs
** (capture_headers), because every file needs it and it is too small to deserve a file of its
** own. Byte buffers are the project's st_buf (common/buf.h).
*/
#ifndef ST_CAPTURE_INTERNAL_H
#define ST_CAPTURE_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "capture.h"
#include "capture_sse.h"
#include "common/buf.h"

/* ---- ordered header list --------------------------------------------------------------- */

typedef struct capture_header {
  char *name, *value; /* owned; value without surrounding whitespace */
} capture_header;

typedef struct capture_headers {
  capture_header *items;
  size_t n, cap;
} capture_headers;

static inline int capture_headers_add(capture_headers *h, const char *name, size_t name_len,
                                      const char *value, size_t value_len) {
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 16;
    capture_header *items = realloc(h->items, cap * sizeof *items);
    if (!items) return -1;
    h->items = items;
    h->cap = cap;
  }
  char *n = strndup(name, name_len), *v = strndup(value, value_len);
  if (!n || !v) {
    free(n);
    free(v);
    return -1;
  }
  h->items[h->n].name = n;
  h->items[h->n].value = v;
  h->n++;
  return 0;
}
static inline void capture_headers_clear(capture_headers *h) {
  for (size_t i = 0; i < h->n; i++) {
    free(h->items[i].name);
    free(h->items[i].value);
  }
  h->n = 0;
}
static inline void capture_headers_free(capture_headers *h) {
  capture_headers_clear(h);
  free(h->items);
  h->items = NULL;
  h->cap = 0;
}
/* First value of a header by case-insensitive name, or NULL. */
static inline const char *capture_headers_get(const capture_headers *h, const char *name) {
  for (size_t i = 0; i < h->n; i++)
    if (!strcasecmp(h->items[i].name, name)) return h->items[i].value;
  return NULL;
}

/* ---- APIs the proxy understands ----------------------------------------------------------- */

typedef enum capture_api {
  CAPTURE_API_OTHER = 0,          /* relayed and recorded, nothing reassembled */
  CAPTURE_API_ANTHROPIC_MESSAGES, /* POST .../v1/messages */
  CAPTURE_API_OPENAI_CHAT,        /* POST .../v1/chat/completions */
  CAPTURE_API_OPENAI_COMPLETIONS, /* POST .../v1/completions */
  CAPTURE_API_OPENAI_RESPONSES,   /* POST .../v1/responses */
} capture_api;

/* Classifies by path (prefixes such as /api are allowed; the query string must be removed). */
capture_api capture_api_from_path(const char *path);
/* "anthropic.messages", "openai.chat", "openai.completions", "openai.responses", "other". */
const char *capture_api_name(capture_api api);

/* Final states of a record (the `state` column). Text values are a contract. */
typedef enum capture_state {
  CAPTURE_OPEN = 0,       /* being relayed (or the proxy died mid-exchange) */
  CAPTURE_COMPLETE,       /* relayed to the end, whatever the upstream's status */
  CAPTURE_UPSTREAM_ERROR, /* upstream down, reset, timed out; client got an error */
  CAPTURE_CLIENT_ABORTED, /* client went away; upstream transfer cancelled */
  CAPTURE_INTERRUPTED,    /* proxy stopped mid-exchange after its grace period */
  CAPTURE_REJECTED,       /* proxy answered itself (413 too large, 400 unreadable) */
} capture_state;
const char *capture_state_name(capture_state s);

/* ---- redaction (capture_redact.c) ----------------------------------------------------------- */

/* 1 when a header (by name) carries a credential: its value is replaced by "[redacted]" in
** anything written, and remembered so that it can be scrubbed from bodies and messages. */
int capture_header_is_secret(const char *name);
/* 1 when a query parameter (by name) carries a credential (key, api_key, token, ...). */
int capture_query_param_is_secret(const char *name, size_t len);
/* 1 when a JSON member or form field (by name) carries a credential: one of the words of its
** name (split at _ - . and case changes) is key, apikey, token, secret, password, auth,
** authorization, credential(s), cookie, ... ("api_key", "accessToken"; not "max_tokens"). */
int capture_field_is_secret(const char *name, size_t len);

#define CAPTURE_REDACTED "[redacted]"

/* The credential values seen in one exchange (never written anywhere). Shorter values than
** CAPTURE_SECRET_MIN are redacted in headers but not searched for in bodies. */
#define CAPTURE_SECRET_MIN 8
typedef struct capture_secrets {
  char **values;
  size_t n, cap;
} capture_secrets;

/* Remembers a header's value when capture_header_is_secret(name): the whole value, plus the
** credential part of "Bearer X" / "Basic X" and each value of a cookie list. 0 or -1 (OOM). */
int capture_secrets_add_header(capture_secrets *s, const char *name, const char *value);
/* Remembers a value in every spelling an upstream may echo it in: as given, %-decoded (when it
** holds %XX or '+'), %-encoded (upper- and lower-case hex), base64, JSON-escaped. */
int capture_secrets_add(capture_secrets *s, const char *value, size_t len);
/* Remembers the credentials in a request body: string values of secret-named members of a JSON
** body (any depth), secret-named fields of a form body. 0 or -1 (OOM). */
int capture_secrets_add_body(capture_secrets *s, const char *content_type, const char *body,
                             size_t len);
/* Copy of a query string with secret parameters' values replaced by "[redacted]" (values are
** remembered in s). NULL query -> NULL. Returns NULL also on OOM (then *oom = 1). */
char *capture_redact_query(capture_secrets *s, const char *query, int *oom);
/* Overwrites, in place, every occurrence of a remembered secret in buf with '*' (same length,
** so byte offsets into recorded bodies stay valid). Returns the number of occurrences. */
size_t capture_secrets_mask(const capture_secrets *s, char *buf, size_t len);
/* New string: text with every remembered secret replaced by "[redacted]". NULL on OOM. */
char *capture_secrets_scrub(const capture_secrets *s, const char *text);
void capture_secrets_free(capture_secrets *s);
/* Copy of a URL with any user:password@ removed and secret query parameters' values replaced
** by "[redacted]" (for logs and records); a #fragment is dropped. NULL on OOM. */
char *capture_url_without_credentials(const char *url);

/* ---- one exchange ------------------------------------------------------------------------------ */

typedef struct capture_event {
  int64_t t_ns;       /* when the chunk that completed the event arrived, since exchange start */
  size_t offset;      /* first byte of the event's block in the response body */
  size_t length;      /* bytes of the block, through the blank line that dispatched it */
  char *event;        /* SSE "event:" field, or NULL */
  char *data;         /* joined data lines (owned) */
  size_t data_len;
} capture_event;

typedef struct capture_exchange {
  atomic_int refs;
  char id[40];               /* uuid v4 */
  char received_at[32];      /* ISO 8601 UTC with milliseconds */
  int64_t t0_ns;             /* CLOCK_MONOTONIC at handler entry */
  char method[16];
  char *path;                /* raw request path, no query */
  char *query;               /* redacted query string, or NULL */
  capture_api api;
  char client_addr[64];      /* "ip:port" */
  const char *upstream;      /* credentials-free upstream base URL (borrowed from the proxy);
                                for served exchanges, what answered (the model directory) */
  int served;                /* answered by `sparsetrace serve` (requests.origin = 'served') */
  capture_headers request_headers; /* as received (values include credentials: never written
                                      without capture_header_is_secret() filtering) */
  st_buf request_body;           /* as the client sent it (what the record keeps) */
  size_t request_declared_bytes; /* Content-Length when the body was refused */
  char *modified_request;        /* JSON note of what the forwarded body had in addition
                                    (capture_ask_prompt_ids), or NULL: forwarded unchanged */
  capture_secrets secrets;

  /* response side, written by the worker while relaying */
  int status;                /* what the client got; 0 = nothing sent */
  capture_headers response_headers; /* as relayed (proxy-made responses: as made) */
  int stream;                /* response is text/event-stream (or request asked stream:true) */
  st_buf response_body;      /* the bytes the client got, up to max_record_bytes */
  size_t response_bytes;     /* all body bytes relayed */
  int response_truncated;
  capture_sse_parser sse;
  capture_event *events;
  size_t n_events, cap_events;
  int events_oom;
  int64_t t_headers_ns, t_first_byte_ns, t_end_ns; /* -1: never */
  char *upstream_error;      /* scrubbed message, or NULL */
  char *client_error;
  capture_state state;

  /* worker only: what capture_store_submit_progress has handed over so far */
  size_t progress_body, progress_events, progress_bytes;
  int progress_head;
  int64_t progress_ns;

  /* store writer only */
  int open_recorded;         /* the 'open' row was inserted */
  size_t open_redactions;    /* credential occurrences masked in the request body */
} capture_exchange;

capture_exchange *capture_exchange_new(void);
void capture_exchange_ref(capture_exchange *x);
void capture_exchange_unref(capture_exchange *x);
/* Replaces *slot with a scrubbed copy of the formatted message. */
void capture_exchange_set_error(capture_exchange *x, char **slot, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- derived facts, computed once the exchange is over (capture_message.c) ---------------- */

typedef struct capture_summary {
  int request_malformed;   /* POST to a JSON API whose body is not JSON */
  char *request_json_error; /* "line 1 column 7: ..." or NULL */
  char *model;             /* request's "model", or NULL */
  int request_stream;      /* request's "stream": true */
  json_t *final_message;   /* normalised final message (schema: capture.schema.json), or NULL */
  char *stop_reason;
  int64_t input_tokens, output_tokens; /* -1: not reported */
  double max_gap_ms;       /* largest gap between consecutive SSE events, -1 if < 2 events */
  json_t *prompt_token_ids; /* array of the prompt ids the upstream returned, or NULL */
  char prompt_token_ids_from[64]; /* where: "body.prompt_token_ids", "event 0.choices[0]..." */
} capture_summary;

/* Parses the request body and reassembles the response (from the SSE events for streams, from
** the JSON body otherwise). Never fails: what cannot be derived stays NULL/-1. */
void capture_summarize(const capture_exchange *x, capture_summary *out);
void capture_summary_free(capture_summary *s);

/* --ask-prompt-ids: decides whether the request x asks `engine` for its prompt token ids and how.
** The field each engine reads (sglang python/sglang/srt/entrypoints/openai/protocol.py,
** ChatCompletionRequest.return_prompt_token_ids and CompletionRequest.return_token_ids; vLLM
** vllm/entrypoints/openai/{chat_completion,completion}/protocol.py, return_token_ids):
**   sglang  POST .../chat/completions, not streaming   "return_prompt_token_ids": true
**           (sglang's serving_chat.py refuses it with stream=true: nothing is added then)
**   sglang  POST .../completions                       "return_token_ids": true
**   vllm    POST .../chat/completions, .../completions "return_token_ids": true
**   either  .../messages, .../responses                nothing: neither engine returns ids there
** The field is inserted as the first member of the top-level object; every other byte of the
** client's body is forwarded as it was. When the field is added, *forward gets the new body
** (malloc'd, *forward_len bytes); otherwise *forward is NULL (forward x->request_body). When the
** flag is on and the request is a JSON-API POST, x->modified_request gets the note recorded in
** the store: {"engine", "added": {...} | null, "forwarded_bytes", "skipped": why}. 0, or -1 on
** out of memory. Call before capture_store_submit_open (the note is in the open row). */
int capture_ask_prompt_ids(capture_exchange *x, st_capture_prompt_ids engine, char **forward,
                           size_t *forward_len);

/* The prompt ids in one parsed answer object (a whole JSON body or one SSE event's data): its
** top-level "prompt_token_ids" (vLLM chat), else those of choice 0 (sglang chat, completions).
** Returns a borrowed reference to an array of non-negative integers, or NULL; *where gets
** "prompt_token_ids" or "choices[0].prompt_token_ids". */
json_t *capture_prompt_ids_in(json_t *answer, const char **where);

/* Reassembly entry points, exposed for tests. Return a new normalised message or NULL. */
json_t *capture_message_from_events(capture_api api, const capture_event *ev, size_t n);
json_t *capture_message_from_body(capture_api api, const char *body, size_t len);
/* Name for an event in the index: its SSE event field, else the JSON "type", else "message",
** "[DONE]" for OpenAI's terminator. Returns a static string or a pointer into ev. */
const char *capture_event_name(const capture_event *ev, char *scratch, size_t scratch_len);

/* ---- store (capture_store.c) ------------------------------------------------------------------ */

typedef struct capture_store capture_store;

typedef struct capture_store_options {
  const char *dir;
  size_t inline_max_bytes;
  void (*log)(void *user, const char *line);
  void *log_user;
} capture_store_options;

st_status capture_store_open(const capture_store_options *o, capture_store **out);
/* Queues the 'open' row of x (takes a reference). Never blocks on the disk. */
void capture_store_submit_open(capture_store *s, capture_exchange *x);
/* Queues the finishing update of x (takes a reference); the writer summarises it
** (capture_summarize) and records it. The caller must not touch x afterwards. */
void capture_store_submit_finish(capture_store *s, capture_exchange *x);
/* Called by the worker while relaying (it owns x's response side): queues copies of the response
** bytes (masked), head and SSE events relayed since the last call, appended to the open row by
** the writer. Nothing when nothing is new. Best effort (the finish job records everything). */
void capture_store_submit_progress(capture_store *s, capture_exchange *x);
#define CAPTURE_PROGRESS_MS 200       /* the relay submits progress at most this often ... */
#define CAPTURE_PROGRESS_BYTES 65536  /* ... unless this much is new */
/* Drains the queue, stops the writer, closes the database. Returns the first error seen. */
st_status capture_store_close(capture_store *s);
uint64_t capture_store_recorded(const capture_store *s);
uint64_t capture_store_errors(const capture_store *s);

/* ---- upstream (capture_upstream.c) ------------------------------------------------------------ */

typedef struct capture_upstream capture_upstream;

typedef struct capture_upstream_options {
  const char *base_url;       /* with credentials if the user gave them */
  const char *proxy;          /* see st_capture_config.upstream_proxy */
  int connect_timeout_ms;
  int idle_timeout_ms;
} capture_upstream_options;

st_status capture_upstream_new(const capture_upstream_options *o, capture_upstream **out);
void capture_upstream_free(capture_upstream *u);
/* Adds the credentials embedded in the upstream and proxy URLs (user:password@) to s, so that
** they are scrubbed like header credentials. 0 or -1 (OOM). */
int capture_upstream_add_secrets(const capture_upstream *u, capture_secrets *s);

typedef enum capture_upstream_outcome {
  CAPTURE_UPSTREAM_OK = 0,
  CAPTURE_UPSTREAM_UNREACHABLE,   /* connect/resolve failed: 502 */
  CAPTURE_UPSTREAM_TIMEOUT,       /* connect timeout or idle timeout: 504 */
  CAPTURE_UPSTREAM_FAILED,        /* reset, closed early, protocol error: 502 */
  CAPTURE_UPSTREAM_CLIENT_GONE,   /* a hook said the client left */
  CAPTURE_UPSTREAM_SHUTDOWN,      /* a hook said the proxy is stopping */
} capture_upstream_outcome;

typedef struct capture_upstream_hooks {
  void *user;
  /* The final (non-1xx) response head: status, reason phrase, headers in order. Return 0 to go
  ** on, -1 to abort (client gone). */
  int (*on_head)(void *user, int status, const char *reason, const capture_headers *headers);
  /* Body bytes as they arrive. Return 0 to go on, -1 to abort (client gone). */
  int (*on_body)(void *user, const char *p, size_t n);
  /* Polled while the transfer runs (several times a second while data flows, at least once a
  ** second when idle): 0 go on, 1 client gone, 2 proxy shutting down. */
  int (*poll_abort)(void *user);
} capture_upstream_hooks;

/* Sends method + path?query with headers (already filtered of hop-by-hop ones) and body to the
** upstream and streams the answer into the hooks. *handle is the calling thread's reusable curl
** handle (NULL: one is created and left there; free it with capture_upstream_handle_free from
** the same thread's cleanup); it keeps the thread's upstream connections alive between calls.
** Returns the outcome; *message gets a human-readable detail (credentials-free upstream URL,
** curl's error) for anything but OK. */
capture_upstream_outcome capture_upstream_perform(capture_upstream *u, void **handle,
                                                  const char *method, const char *path,
                                                  const char *query,
                                                  const capture_headers *headers,
                                                  const void *body, size_t body_len,
                                                  const capture_upstream_hooks *hooks,
                                                  char *message, size_t message_len);
void capture_upstream_handle_free(void *handle); /* NULL ok */

/* 1 for hop-by-hop headers (RFC 9110 §7.6.1) plus those the proxy sets itself (Host,
** Content-Length, Expect); `connection` is the request's Connection header value (its tokens
** are hop-by-hop too), may be NULL. */
int capture_header_is_hop_by_hop(const char *name, const char *connection);

/* ---- the listening side (capture_http.c) ------------------------------------------------------ */

/* The request line and headers together may take this many bytes (CRLFs included); a longer
** head is answered 431 (and recorded). Every header within it is forwarded and recorded. */
#define CAPTURE_MAX_HEAD_BYTES 65536

typedef struct capture_http capture_http;
typedef struct capture_conn capture_conn;

/* One request, complete: head parsed, body read (chunked coding removed). */
typedef struct capture_request {
  char method[16];
  char *path;               /* request target up to '?' (raw, not decoded) */
  char *query;              /* after '?', or NULL */
  int http10;
  int keep_alive;           /* the connection may carry another request after this one */
  int chunked;
  int64_t content_length;   /* -1: none */
  capture_headers headers;  /* every header line, in order */
  st_buf body;
  int too_large;            /* body over max_body_bytes: not kept (declared_bytes says how big) */
  int head_too_large;       /* head over max_head_bytes: headers hold the lines that fitted */
  int body_timeout;         /* 1: body not complete in time, 2: client closed mid-body */
  int oom;
  size_t declared_bytes;
  char remote_addr[48];       /* INET6_ADDRSTRLEN */
  int remote_port;
} capture_request;

typedef struct capture_http_options {
  const char *host;          /* an IP address ("[::1]" or "::1" for IPv6) */
  int port;                  /* 0: any free port */
  int threads;               /* workers: most requests handled at once */
  int max_client_connections; /* per client address (more get 503) */
  int max_connections;       /* in all (also bounded by the descriptor limit) */
  size_t max_head_bytes, max_body_bytes;
  int head_timeout_ms;       /* a request head must be complete within this of its first byte */
  int keepalive_timeout_ms;  /* an idle kept-alive connection is closed after this */
  int body_timeout_ms;       /* a body must arrive within this, plus 1 s per 64 KiB received */
  int write_timeout_ms;      /* a client that reads nothing for this long is gone */
  /* Called on a worker thread with a complete request; answers it with capture_conn_write. */
  void (*handler)(void *user, capture_conn *c, capture_request *rq);
  void (*free_slot)(void *slot); /* a worker's slot (capture_conn_thread_slot) at its exit */
  void (*log)(void *user, const char *line);
  void *user;
} capture_http_options;

void capture_http_options_init(capture_http_options *o); /* the defaults in capture_http.c */
st_status capture_http_start(const capture_http_options *o, capture_http **out);
int capture_http_port(const capture_http *h);
/* Stops accepting, closes every connection (writes in progress fail at once), waits for the
** handlers to return and the threads to end, frees h. */
void capture_http_stop(capture_http *h);
/* For handlers: writes all n bytes (0), or -1 when the client is gone or read nothing for
** write_timeout_ms, or the listener is stopping. */
int capture_conn_write(capture_conn *c, const void *p, size_t n);
void capture_conn_close_after(capture_conn *c); /* no further request on this connection */
int capture_conn_fd(const capture_conn *c);     /* to poll for the client hanging up; never read */
void **capture_conn_thread_slot(capture_conn *c); /* the worker thread's own pointer slot */
const char *capture_http_reason(int status);    /* "Not Found", ... */
/* A whole small plain-text answer with Connection: close (status line, headers, why and a newline)
** formatted into out, without allocating (it serves when memory has run out): its length. */
size_t capture_http_plain(char *out, size_t cap, int status, const char *why);

/* ---- small shared utilities ---------------------------------------------------------------- */

int64_t capture_now_ns(void); /* CLOCK_MONOTONIC */
void capture_uuid_v4(char out[40]);
char *capture_base64(const void *data, size_t n); /* malloc'd, NUL-terminated; NULL on OOM */

#endif
