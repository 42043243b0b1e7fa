/*
** capture_server.c — the relay: one exchange from a complete client request to the end of the
** answer (capture_http.c listens and reads requests, capture_upstream.c forwards with libcurl).
**
** Threading model. capture_http.c reads every request's head and body in one poll loop (with
** deadlines, and a bound on connections per client address) and hands complete requests to a
** pool of worker threads (--threads, default 256); each is handled start to finish on one of
** them by relay_request(), which calls the upstream synchronously (capture_upstream.c) and writes
** the answer to the client from curl's callbacks. The handler can wait for the upstream's status
** and headers before choosing its own, so 4xx/5xx/529 pass through as they are, and the code
** reads top to bottom. Slow or idle clients hold no worker; extra requests wait in a queue.
**
** Faithful relay. The request goes upstream with the client's method, raw path and query, and
** headers in order, minus hop-by-hop ones (Connection and what it names, Keep-Alive, TE,
** Transfer-Encoding, Upgrade, Trailer, Proxy-Connection) and those the next hop owns (Host,
** Content-Length, Expect). One deliberate change: Accept-Encoding is replaced by "identity", so
** that what is relayed and recorded is plaintext (a gzip'd SSE stream could not be teed). A
** second one only when asked (--ask-prompt-ids): one field added at the front of a chat or
** completions JSON body, so that a sglang or vLLM upstream returns the prompt ids it ran
** (capture_ask_prompt_ids; the record keeps the client's body and a note of the addition). The
** answer comes back with the upstream's status line (reason phrase included) and headers in
** order, minus hop-by-hop ones, written by the relay in one write (nothing adds Date or
** Connection headers of its own). Bodies are relayed byte for byte: a
** Content-Length answer as is, anything else re-chunked one chunk per upstream read, so an SSE
** event reaches the client in the same read it reached the proxy (TCP_NODELAY on both sides).
**
** Failure handling, and what the client sees:
**   - upstream unreachable / connect timeout / idle timeout / reset before the head: a 502 or 504
**     in the API's own JSON error shape (Anthropic {"type":"error","error":{...}} or OpenAI
**     {"error":{...}}), with an x-sparsetrace-request-id header naming the record;
**   - the same after an SSE head was sent: the API's stream error event (Anthropic
**     `event: error`, Responses `event: error` with type "error", chat/completions a data chunk
**     {"error":{...}}), then a clean end of stream; a non-stream body is cut (connection closed);
**   - client disconnects: detected by a failing write, or by polling the client socket for
**     hang-up while the upstream is silent; the upstream transfer is cancelled;
**   - request body over --max-body: 413 in the API's shape, body not read, connection closed;
**   - request head (line + headers) over CAPTURE_MAX_HEAD_BYTES: 431 in the API's shape,
**     recorded with the headers that fitted, connection closed;
**   - proxy stopping: in-flight exchanges get the grace period, then the stream error event (or
**     503) and state 'interrupted'; requests arriving meanwhile get a 503 (state 'rejected').
** Everything the client got — proxy-made answers and injected events included — is what the
** record's response side holds.
**
** Noticing that the client left. A streaming upstream can stay silent for minutes (a model
** thinking), during which no write would reveal that the client left: for exchanges still running
** after 200 ms the relay polls the client socket for POLLRDHUP (never reads it). A client that
** half-closes its sending side after the request (rare for HTTP clients) would be taken as gone.
*/
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "capture_internal.h"
#include "recorder/index.h"
#include "recorder/recorder.h"

struct st_capture {
  capture_http *http;
  capture_upstream *upstream;
  capture_store *store;
  char *upstream_display;
  char *store_dir;
  size_t max_request_bytes, max_record_bytes;
  st_capture_prompt_ids ask_prompt_ids;
  void (*log)(void *, const char *);
  void *log_user;
  int port;
  char url[200];
  atomic_int stopping;
  _Atomic int64_t deadline_ns;
  int grace_ms;
  atomic_uint_least64_t accepted, in_flight, completed, failed;
};

static void proxy_log(st_capture *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void proxy_log(st_capture *p, const char *fmt, ...) {
  if (!p->log) return;
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  p->log(p->log_user, line);
}

/* ---- error shapes ------------------------------------------------------------------------- */

/* Anthropic's shape for Anthropic clients (and unknown paths whose request looks Anthropic),
** OpenAI's for the rest. */
static int anthropic_style(const capture_exchange *x) {
  if (x->api == CAPTURE_API_ANTHROPIC_MESSAGES) return 1;
  if (x->api != CAPTURE_API_OTHER) return 0;
  return capture_headers_get(&x->request_headers, "anthropic-version") ||
         capture_headers_get(&x->request_headers, "x-api-key");
}

/* The JSON error body for status (compact, one line). */
static char *error_body(const capture_exchange *x, int status, const char *code, const char *msg) {
  json_t *j;
  if (anthropic_style(x)) {
    const char *type = status == 413 ? "request_too_large"
                       : status == 400 || status == 431 ? "invalid_request_error"
                       : status == 504 ? "timeout_error"
                       : status == 503 ? "overloaded_error"
                                       : "api_error";
    j = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message", msg);
  } else {
    const char *type = status < 500 ? "invalid_request_error" : "server_error";
    j = json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type", type, "param",
                  "code", code);
  }
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  return s;
}

/* The stream's own error event for an SSE answer cut short. */
static char *error_event(const capture_exchange *x, const char *code, const char *msg) {
  json_t *j = NULL;
  const char *prefix = "data: ";
  if (x->api == CAPTURE_API_OPENAI_RESPONSES) {
    j = json_pack("{s:s, s:s, s:s, s:n, s:I}", "type", "error", "code", code, "message", msg,
                  "param", "sequence_number", (json_int_t)x->n_events);
    prefix = "event: error\ndata: ";
  } else if (anthropic_style(x)) {
    j = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", "api_error", "message",
                  msg);
    prefix = "event: error\ndata: ";
  } else {
    j = json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type", "server_error",
                  "param", "code", code);
  }
  char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  char *event = NULL;
  if (body && asprintf(&event, "%s%s\n\n", prefix, body) < 0) event = NULL;
  free(body);
  return event;
}

/* ---- the relay ---------------------------------------------------------------------------- */

enum relay_mode { RELAY_NONE, RELAY_LENGTH, RELAY_CHUNKED, RELAY_CLOSE };

typedef struct relay {
  st_capture *p;
  capture_conn *conn;
  capture_exchange *x;
  int client_http10;
  int head_request;
  int head_sent;
  enum relay_mode mode;
  int client_gone;
  int64_t chunk_t_ns; /* arrival time of the chunk being fed to the SSE parser */
  st_buf frame;       /* chunk framing scratch */
} relay;

static int client_write(relay *r, const void *p, size_t n) {
  if (r->client_gone) return -1;
  if (n == 0) return 0;
  if (capture_conn_write(r->conn, p, n) < 0) {
    r->client_gone = 1;
    return -1;
  }
  return 0;
}

static int on_sse_event(void *user, const char *event, size_t event_len, const char *data,
                        size_t data_len, size_t offset, size_t length) {
  relay *r = user;
  capture_exchange *x = r->x;
  if (x->events_oom) return 0;
  if (x->n_events == x->cap_events) {
    size_t cap = x->cap_events ? 2 * x->cap_events : 64;
    capture_event *ev = realloc(x->events, cap * sizeof *ev);
    if (!ev) {
      x->events_oom = 1;
      return 0;
    }
    x->events = ev;
    x->cap_events = cap;
  }
  capture_event *ev = &x->events[x->n_events];
  ev->t_ns = r->chunk_t_ns;
  ev->offset = offset;
  ev->length = length;
  ev->event = event ? strndup(event, event_len) : NULL;
  ev->data = malloc(data_len + 1);
  ev->data_len = data_len;
  if ((event && !ev->event) || !ev->data) {
    free(ev->event);
    free(ev->data);
    x->events_oom = 1;
    return 0;
  }
  memcpy(ev->data, data, data_len);
  ev->data[data_len] = 0;
  x->n_events++;
  return 0;
}

/* Hands what was relayed since the last time to the store writer, at most every
** CAPTURE_PROGRESS_MS unless CAPTURE_PROGRESS_BYTES are new: a proxy killed mid-stream then
** leaves in the store (nearly) what its clients received. */
static void maybe_progress(relay *r) {
  capture_exchange *x = r->x;
  if (capture_now_ns() - x->progress_ns >= CAPTURE_PROGRESS_MS * 1000000LL ||
      x->response_bytes - x->progress_bytes >= CAPTURE_PROGRESS_BYTES)
    capture_store_submit_progress(r->p->store, x);
}

/* Sends body bytes to the client in the current framing and tees them into the record. */
static int relay_body(relay *r, const char *p, size_t n) {
  capture_exchange *x = r->x;
  int64_t now = capture_now_ns();
  if (x->t_first_byte_ns < 0) x->t_first_byte_ns = now;
  int rc = 0;
  if (r->mode == RELAY_CHUNKED) {
    char len[24];
    int m = snprintf(len, sizeof len, "%zx\r\n", n);
    st_buf_reset(&r->frame);
    if (st_buf_add(&r->frame, len, (size_t)m) || st_buf_add(&r->frame, p, n) ||
        st_buf_add(&r->frame, "\r\n", 2))
      rc = client_write(r, len, (size_t)m) || client_write(r, p, n) || client_write(r, "\r\n", 2) ? -1 : 0;
    else
      rc = client_write(r, r->frame.data, r->frame.len);
  } else if (r->mode != RELAY_NONE) {
    rc = client_write(r, p, n);
  }
  if (rc < 0) {
    if (!x->client_error)
      capture_exchange_set_error(x, &x->client_error,
                                 "client closed the connection after %zu response bytes",
                                 x->response_bytes);
    return -1;
  }
  x->response_bytes += n;
  if (!x->response_truncated) {
    size_t room = r->p->max_record_bytes > x->response_body.len ? r->p->max_record_bytes - x->response_body.len : 0;
    size_t keep = n < room ? n : room;
    if (st_buf_add(&x->response_body, p, keep) || keep < n) x->response_truncated = 1;
    if (x->stream && !x->response_truncated) {
      r->chunk_t_ns = now - x->t0_ns;
      capture_sse_feed(&x->sse, p, n);
    }
  }
  maybe_progress(r);
  return 0;
}

static int hook_head(void *user, int status, const char *reason, const capture_headers *h) {
  relay *r = user;
  capture_exchange *x = r->x;
  const char *connection = capture_headers_get(h, "connection");
  const char *ctype = capture_headers_get(h, "content-type");
  const char *clen = capture_headers_get(h, "content-length");
  x->status = status;
  x->stream = ctype && !strncasecmp(ctype, "text/event-stream", 17);
  if (x->stream) capture_sse_init(&x->sse, on_sse_event, r);
  int bodyless = r->head_request || status == 204 || status == 304 || (status >= 100 && status < 200);
  r->mode = bodyless ? RELAY_NONE : clen ? RELAY_LENGTH : r->client_http10 ? RELAY_CLOSE : RELAY_CHUNKED;

  st_buf head = {0};
  char line[256];
  snprintf(line, sizeof line, "HTTP/%s %d %s\r\n", r->client_http10 ? "1.0" : "1.1", status,
           reason && reason[0] ? reason : capture_http_reason(status));
  int fail = st_buf_str(&head, line);
  for (size_t i = 0; i < h->n; i++) {
    const char *name = h->items[i].name;
    int is_length = !strcasecmp(name, "content-length");
    if (!is_length && capture_header_is_hop_by_hop(name, connection)) continue;
    if (is_length && r->mode != RELAY_LENGTH && !(r->mode == RELAY_NONE && r->head_request)) continue;
    fail |= capture_headers_add(&x->response_headers, name, strlen(name), h->items[i].value,
                                strlen(h->items[i].value));
    fail |= st_buf_str(&head, name) | st_buf_str(&head, ": ") |
            st_buf_str(&head, h->items[i].value) | st_buf_str(&head, "\r\n");
  }
  if (r->mode == RELAY_CHUNKED) {
    fail |= st_buf_str(&head, "Transfer-Encoding: chunked\r\n");
    fail |= capture_headers_add(&x->response_headers, "Transfer-Encoding", 17, "chunked", 7);
  } else if (r->mode == RELAY_CLOSE) {
    fail |= st_buf_str(&head, "Connection: close\r\n");
    capture_conn_close_after(r->conn);
  }
  fail |= st_buf_str(&head, "\r\n");
  int rc = fail ? -1 : client_write(r, head.data, head.len);
  st_buf_free(&head);
  if (rc < 0) {
    if (!x->client_error)
      capture_exchange_set_error(x, &x->client_error, fail ? "out of memory relaying the head"
                                                           : "client closed the connection before "
                                                             "the response head");
    return -1;
  }
  r->head_sent = 1;
  x->t_headers_ns = capture_now_ns();
  return 0;
}

static int hook_body(void *user, const char *p, size_t n) { return relay_body(user, p, n); }

static int hook_poll(void *user) {
  relay *r = user;
  st_capture *p = r->p;
  int64_t now = capture_now_ns();
  if (atomic_load(&p->stopping) && now >= atomic_load(&p->deadline_ns)) return 2;
  maybe_progress(r); /* bytes held back (or the head) get out while the upstream is silent */
  /* A client may hang up as soon as it has its whole answer (a Content-Length body) while curl
  ** is still finishing the upstream transfer; so only exchanges past their first 200 ms are
  ** watched, as before. */
  if (now - r->x->t0_ns > 200 * 1000000LL) {
    struct pollfd pfd = {.fd = capture_conn_fd(r->conn), .events = POLLRDHUP};
    if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      r->client_gone = 1;
      if (!r->x->client_error)
        capture_exchange_set_error(r->x, &r->x->client_error,
                                   "client closed the connection after %zu response bytes",
                                   r->x->response_bytes);
      return 1;
    }
  }
  return 0;
}

/* A whole answer made by the proxy itself (errors, 413), recorded like a relayed one. */
static void send_own_answer(relay *r, int status, const char *code, const char *msg, int close) {
  capture_exchange *x = r->x;
  char *body = error_body(x, status, code, msg);
  if (!body) body = strdup("{}");
  size_t len = body ? strlen(body) : 0;
  char len_text[24];
  snprintf(len_text, sizeof len_text, "%zu", len);
  capture_headers_clear(&x->response_headers);
  capture_headers_add(&x->response_headers, "Content-Type", 12, "application/json", 16);
  capture_headers_add(&x->response_headers, "Content-Length", 14, len_text, strlen(len_text));
  capture_headers_add(&x->response_headers, "x-sparsetrace-request-id", 24, x->id, strlen(x->id));
  if (close) capture_headers_add(&x->response_headers, "Connection", 10, "close", 5);
  st_buf head = {0};
  char line[256];
  snprintf(line, sizeof line, "HTTP/%s %d %s\r\n", r->client_http10 ? "1.0" : "1.1", status,
           capture_http_reason(status));
  st_buf_str(&head, line);
  for (size_t i = 0; i < x->response_headers.n; i++) {
    st_buf_str(&head, x->response_headers.items[i].name);
    st_buf_str(&head, ": ");
    st_buf_str(&head, x->response_headers.items[i].value);
    st_buf_str(&head, "\r\n");
  }
  st_buf_str(&head, "\r\n");
  if (close) capture_conn_close_after(r->conn);
  x->status = status;
  r->mode = RELAY_LENGTH;
  if (client_write(r, head.data, head.len) == 0) {
    r->head_sent = 1;
    x->t_headers_ns = capture_now_ns();
    relay_body(r, body ? body : "", len);
  } else if (!x->client_error) {
    capture_exchange_set_error(x, &x->client_error, "client closed the connection before the "
                                                    "proxy's %d answer", status);
  }
  st_buf_free(&head);
  free(body);
}

/* Cuts a relayed answer short after its head went out: the stream's error event for SSE, or a
** closed connection otherwise. */
static void cut_answer(relay *r, const char *code, const char *msg) {
  capture_exchange *x = r->x;
  if (x->stream && (r->mode == RELAY_CHUNKED || r->mode == RELAY_CLOSE) && !r->client_gone) {
    /* An event cut mid-way cannot be cancelled in SSE; end it so ours parses on its own. */
    if (capture_sse_pending(&x->sse)) relay_body(r, "\n\n", 2);
    char *event = error_event(x, code, msg);
    if (event) relay_body(r, event, strlen(event));
    free(event);
    if (r->mode == RELAY_CHUNKED) client_write(r, "0\r\n\r\n", 5);
  }
  capture_conn_close_after(r->conn);
}

/* What the listener found reading the request (capture_http.c reads heads and bodies): 0 to
** relay it, 413 / 431 / 500 for the proxy's own answer, -1 when the client stopped sending. The
** body moves into the record. */
static int request_verdict(relay *r, capture_request *rq) {
  capture_exchange *x = r->x;
  if (rq->head_too_large) return 431;
  if (rq->too_large) {
    x->request_declared_bytes = rq->declared_bytes;
    return 413;
  }
  if (rq->oom) return 500;
  x->request_body = rq->body;
  memset(&rq->body, 0, sizeof rq->body);
  if (rq->body_timeout) {
    capture_exchange_set_error(x, &x->client_error, rq->body_timeout == 1
                               ? "client did not send the request body in time (%zu bytes)"
                               : "client stopped sending the request body after %zu bytes",
                               x->request_body.len);
    return -1;
  }
  return 0;
}

static void relay_request(void *user, capture_conn *conn, capture_request *rq) {
  st_capture *p = user;
  capture_exchange *x = capture_exchange_new();
  if (!x) { /* no row can hold it: the client and the log hear why (it is not relayed) */
    char oom[256];
    capture_conn_write(conn, oom, capture_http_plain(oom, sizeof oom, 500, "out of memory recording the request"));
    capture_conn_close_after(conn);
    proxy_log(p, "%s:%d: out of memory recording a request: answered 500, not relayed, not stored",
              rq->remote_addr, rq->remote_port);
    return;
  }
  atomic_fetch_add(&p->accepted, 1);
  atomic_fetch_add(&p->in_flight, 1);
  relay r = {.p = p, .conn = conn, .x = x};
  r.client_http10 = rq->http10;
  snprintf(x->method, sizeof x->method, "%s", rq->method[0] ? rq->method : "GET");
  r.head_request = !strcmp(x->method, "HEAD");
  const char *raw_path = rq->path ? rq->path : "/";
  x->path = strdup(raw_path);
  x->api = capture_api_from_path(raw_path);
  x->upstream = p->upstream_display;
  snprintf(x->client_addr, sizeof x->client_addr, "%s:%d", rq->remote_addr, rq->remote_port);

  /* Headers: all recorded (redacted at write time), credentials remembered, hop-by-hop ones
  ** and Accept-Encoding left out of what goes upstream. */
  int oom = !x->path;
  capture_headers forward = {0};
  const char *connection = capture_headers_get(&rq->headers, "connection");
  for (size_t i = 0; i < rq->headers.n && !oom; i++) {
    const char *n = rq->headers.items[i].name, *v = rq->headers.items[i].value;
    oom |= capture_headers_add(&x->request_headers, n, strlen(n), v, strlen(v)) < 0;
    oom |= capture_secrets_add_header(&x->secrets, n, v) < 0;
    if (capture_header_is_hop_by_hop(n, connection) || !strcasecmp(n, "accept-encoding")) continue;
    oom |= capture_headers_add(&forward, n, strlen(n), v, strlen(v)) < 0;
  }
  oom |= capture_headers_add(&forward, "Accept-Encoding", 15, "identity", 8) < 0;
  oom |= capture_upstream_add_secrets(p->upstream, &x->secrets) < 0;
  int qoom = 0;
  x->query = capture_redact_query(&x->secrets, rq->query, &qoom);
  oom |= qoom;

  int verdict = oom ? 500 : rq->head_too_large ? 431 : atomic_load(&p->stopping) ? 503
              : request_verdict(&r, rq);
  /* Credentials in the body ("api_key": "...", a form's client_secret=...) are scrubbed from
  ** the record like header ones; known before the open row is queued, which masks the body. */
  if (verdict == 0 &&
      capture_secrets_add_body(&x->secrets, capture_headers_get(&x->request_headers, "content-type"),
                               x->request_body.data, x->request_body.len) < 0)
    verdict = 500;
  /* --ask-prompt-ids: the body that goes upstream may carry one more field than the client's
  ** (kept as it was in x->request_body); the note of it goes into the open row. */
  char *forward_body = NULL;
  size_t forward_len = 0;
  if (verdict == 0 && capture_ask_prompt_ids(x, p->ask_prompt_ids, &forward_body, &forward_len) < 0)
    verdict = 500;
  capture_store_submit_open(p->store, x);

  char message[1024] = "";
  const char *refusal = NULL; /* the proxy's own answer to the client, for the log line */
  if (verdict == 413) {
    snprintf(message, sizeof message,
             "sparsetrace capture: request body of %zu bytes is larger than the proxy's limit of "
             "%zu bytes (--max-body)", x->request_declared_bytes, p->max_request_bytes);
    x->state = CAPTURE_REJECTED;
    send_own_answer(&r, 413, "request_too_large", message, 1);
    refusal = message;
  } else if (verdict == 431) {
    snprintf(message, sizeof message,
             "sparsetrace capture: request head (request line and headers) is larger than the "
             "proxy's limit of %d bytes", CAPTURE_MAX_HEAD_BYTES);
    x->state = CAPTURE_REJECTED;
    send_own_answer(&r, 431, "request_header_fields_too_large", message, 1);
    refusal = message;
  } else if (verdict == 503) {
    x->state = CAPTURE_REJECTED;
    refusal = "sparsetrace capture: the proxy is shutting down; retry against the upstream or a "
              "new proxy";
    send_own_answer(&r, 503, "proxy_shutting_down", refusal, 1);
  } else if (verdict == 500) {
    x->state = CAPTURE_REJECTED;
    refusal = "sparsetrace capture: out of memory reading the request";
    send_own_answer(&r, 500, "proxy_error", refusal, 1);
  } else if (verdict < 0) {
    x->state = CAPTURE_CLIENT_ABORTED;
    capture_conn_close_after(conn);
  } else {
    capture_upstream_hooks hooks = {&r, hook_head, hook_body, hook_poll};
    void *local_handle = NULL, **handle = capture_conn_thread_slot(conn);
    if (!handle) handle = &local_handle; /* not a pool worker: a handle for this call only */
    capture_upstream_outcome out = capture_upstream_perform(
        p->upstream, handle, x->method, raw_path, rq->query, &forward,
        forward_body ? forward_body : x->request_body.data,
        forward_body ? forward_len : x->request_body.len, &hooks, message, sizeof message);
    capture_upstream_handle_free(local_handle);
    if (out == CAPTURE_UPSTREAM_OK) {
      x->state = CAPTURE_COMPLETE;
      if (r.mode == RELAY_CHUNKED && client_write(&r, "0\r\n\r\n", 5) < 0) {
        x->state = CAPTURE_CLIENT_ABORTED;
        capture_exchange_set_error(x, &x->client_error, "client closed the connection before the "
                                                        "end of the response");
      }
    } else if (out == CAPTURE_UPSTREAM_CLIENT_GONE) {
      x->state = CAPTURE_CLIENT_ABORTED;
      if (!x->client_error) capture_exchange_set_error(x, &x->client_error, "%s", message);
      capture_conn_close_after(conn);
    } else {
      int shutdown = out == CAPTURE_UPSTREAM_SHUTDOWN;
      int status = shutdown ? 503 : out == CAPTURE_UPSTREAM_TIMEOUT ? 504 : 502;
      const char *code = shutdown ? "proxy_shutting_down"
                         : out == CAPTURE_UPSTREAM_TIMEOUT ? "upstream_timeout"
                         : out == CAPTURE_UPSTREAM_UNREACHABLE ? "upstream_unreachable"
                                                               : "upstream_failed";
      x->state = shutdown ? CAPTURE_INTERRUPTED : CAPTURE_UPSTREAM_ERROR;
      if (shutdown)
        capture_exchange_set_error(x, &x->upstream_error, "interrupted: proxy stopped; transfer "
                                   "cut after its %d ms grace period", p->grace_ms);
      else
        capture_exchange_set_error(x, &x->upstream_error, "%s", message);
      char client_msg[1200];
      snprintf(client_msg, sizeof client_msg, "sparsetrace capture: %s", x->upstream_error);
      if (!r.head_sent) send_own_answer(&r, status, code, client_msg, 0);
      else cut_answer(&r, code, client_msg);
    }
  }
  x->t_end_ns = capture_now_ns();

  int status = x->status;
  char *log_path = capture_secrets_scrub(&x->secrets, x->path ? x->path : "");
  static const char own[] = "sparsetrace capture: ";
  if (refusal && !strncmp(refusal, own, sizeof own - 1)) refusal += sizeof own - 1;
  proxy_log(p, "%s %s %s %s %d %s %.1f ms %zu B%s%s%s%s%s%s", x->id, x->method, log_path ? log_path : "",
            capture_api_name(x->api), status, capture_state_name(x->state),
            (double)(x->t_end_ns - x->t0_ns) / 1e6, x->response_bytes,
            refusal ? " proxy: " : "", refusal ? refusal : "",
            x->upstream_error ? " upstream: " : "", x->upstream_error ? x->upstream_error : "",
            x->client_error ? " client: " : "", x->client_error ? x->client_error : "");
  free(log_path);
  if (x->state == CAPTURE_COMPLETE) atomic_fetch_add(&p->completed, 1);
  else atomic_fetch_add(&p->failed, 1);
  /* The summary (request JSON, reassembly) is the writer's job: computing it here would delay
  ** the next request on this keep-alive connection. */
  capture_store_submit_finish(p->store, x);
  capture_headers_free(&forward);
  free(forward_body);
  st_buf_free(&r.frame);
  capture_exchange_unref(x);
  atomic_fetch_sub(&p->in_flight, 1);
}

/* Each worker thread keeps one curl handle (its slot) for its upstream connections. */
static void free_slot(void *slot) { capture_upstream_handle_free(slot); }

static void listener_log(void *user, const char *line) { proxy_log(user, "%s", line); }

/* ---- start / stop --------------------------------------------------------------------------- */

void st_capture_config_init(st_capture_config *c) {
  memset(c, 0, sizeof *c);
  c->listen = "127.0.0.1:8787";
}

/* "HOST:PORT", ":PORT", "PORT" -> "IP:PORT" ("[v6]:PORT"); host names other than localhost are
** not resolved (give an address). */
static st_status parse_listen(const char *listen, char *out, size_t out_len, int *loopback) {
  const char *colon = strrchr(listen, ':');
  const char *port = colon ? colon + 1 : listen;
  char host[128] = "127.0.0.1";
  if (colon && colon > listen) {
    size_t n = (size_t)(colon - listen);
    if (n >= sizeof host) return st_fail(ST_EINVAL, "--listen %s: host too long", listen);
    memcpy(host, listen, n);
    host[n] = 0;
  }
  char *end;
  long v = strtol(port, &end, 10);
  if (!*port || *end || v < 0 || v > 65535)
    return st_fail(ST_EINVAL, "--listen %s: expected HOST:PORT (port 0-65535)", listen);
  if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  struct in_addr a4;
  struct in6_addr a6;
  char bare[128];
  snprintf(bare, sizeof bare, "%s", host);
  if (bare[0] == '[') {
    size_t n = strlen(bare);
    if (n < 2 || bare[n - 1] != ']')
      return st_fail(ST_EINVAL, "--listen %s: malformed IPv6 address", listen);
    memmove(bare, bare + 1, n - 2);
    bare[n - 2] = 0;
  }
  if (inet_pton(AF_INET, bare, &a4) == 1) {
    *loopback = (ntohl(a4.s_addr) >> 24) == 127;
  } else if (inet_pton(AF_INET6, bare, &a6) == 1) {
    *loopback = IN6_IS_ADDR_LOOPBACK(&a6);
    if (host[0] != '[') snprintf(host, sizeof host, "[%s]", bare);
  } else {
    return st_fail(ST_EINVAL, "--listen %s: '%s' is not an IP address (use 127.0.0.1, "
                              "localhost, or an address of this machine)", listen, host);
  }
  snprintf(out, out_len, "%s:%ld", host, v);
  return ST_OK;
}

st_status st_capture_start(const st_capture_config *cin, st_capture **out) {
  *out = NULL;
  st_capture_config c = *cin;
  if (!c.listen) c.listen = "127.0.0.1:8787";
  if (!c.upstream || !*c.upstream)
    return st_fail(ST_EINVAL, "no upstream: give --upstream URL (e.g. https://api.anthropic.com)");
  if (!c.store_dir) c.store_dir = ST_DEFAULT_STORE;
  if (c.threads <= 0) c.threads = 256;
  if (!c.max_request_bytes) c.max_request_bytes = 32u << 20;
  if (!c.max_record_bytes) c.max_record_bytes = 256u << 20;
  if (!c.inline_max_bytes) c.inline_max_bytes = 1u << 20;
  if (c.connect_timeout_ms <= 0) c.connect_timeout_ms = 10000;
  if (c.idle_timeout_ms <= 0) c.idle_timeout_ms = 600000;

  char ports[160];
  int loopback = 1;
  st_status st = parse_listen(c.listen, ports, sizeof ports, &loopback);
  if (st) return st;

  st_capture *p = calloc(1, sizeof *p);
  if (!p) return st_fail(ST_ENOMEM, "starting the capture proxy");
  p->max_request_bytes = c.max_request_bytes;
  p->max_record_bytes = c.max_record_bytes;
  p->ask_prompt_ids = c.ask_prompt_ids;
  p->log = c.log;
  p->log_user = c.log_user;
  p->upstream_display = capture_url_without_credentials(c.upstream);
  p->store_dir = strdup(c.store_dir);
  if (!p->upstream_display || !p->store_dir) {
    st = st_fail(ST_ENOMEM, "starting the capture proxy");
    goto fail;
  }
  capture_upstream_options uo = {c.upstream, c.upstream_proxy, c.connect_timeout_ms,
                                 c.idle_timeout_ms};
  if ((st = capture_upstream_new(&uo, &p->upstream))) goto fail;
  capture_store_options so = {c.store_dir, c.inline_max_bytes, c.log, c.log_user};
  if ((st = capture_store_open(&so, &p->store))) {
    st_fail_context(st, "capture store %s: ", c.store_dir);
    goto fail;
  }

  capture_http_options ho;
  capture_http_options_init(&ho);
  char host[sizeof ports];
  snprintf(host, sizeof host, "%s", ports);
  char *colon = strrchr(host, ':');
  *colon = 0;
  ho.host = host;
  ho.port = atoi(colon + 1);
  ho.threads = c.threads;
  ho.max_body_bytes = c.max_request_bytes;
  if (c.max_client_connections > 0) ho.max_client_connections = c.max_client_connections;
  if (c.head_timeout_ms > 0) ho.head_timeout_ms = c.head_timeout_ms;
  if (c.body_timeout_ms > 0) ho.body_timeout_ms = c.body_timeout_ms;
  ho.handler = relay_request;
  ho.free_slot = free_slot;
  ho.log = listener_log;
  ho.user = p;
  if ((st = capture_http_start(&ho, &p->http))) {
    st_fail_context(st, "--listen %s: ", c.listen);
    goto fail;
  }
  p->port = capture_http_port(p->http);
  snprintf(p->url, sizeof p->url, "http://%s:%d", host, p->port);
  proxy_log(p, "listening on %s, relaying to %s, recording into %s/%s", p->url, p->upstream_display,
            c.store_dir, ST_INDEX_FILE);
  if (p->ask_prompt_ids)
    proxy_log(p, "asking the upstream (%s) for prompt token ids: chat/completions request bodies "
                 "are forwarded with one field added (recorded as the client sent them)",
              p->ask_prompt_ids == ST_CAPTURE_PROMPT_IDS_SGLANG ? "sglang" : "vllm");
  if (!loopback)
    proxy_log(p, "warning: listening on a non-loopback address: anyone who can reach %s can use "
                 "the credentials your clients send through it", p->url);
  *out = p;
  return ST_OK;
fail:
  capture_store_close(p->store);
  capture_upstream_free(p->upstream);
  free(p->upstream_display);
  free(p->store_dir);
  free(p);
  return st;
}

int st_capture_port(const st_capture *p) { return p->port; }
const char *st_capture_url(const st_capture *p) { return p->url; }

void st_capture_get_stats(const st_capture *p, st_capture_stats *s) {
  s->accepted = atomic_load(&p->accepted);
  s->in_flight = atomic_load(&p->in_flight);
  s->completed = atomic_load(&p->completed);
  s->failed = atomic_load(&p->failed);
  s->recorded = p->store ? capture_store_recorded(p->store) : 0;
  s->store_errors = p->store ? capture_store_errors(p->store) : 0;
}

st_status st_capture_shutdown(st_capture *p, int grace_ms) {
  if (grace_ms < 0) grace_ms = 0;
  p->grace_ms = grace_ms;
  atomic_store(&p->deadline_ns, capture_now_ns() + (int64_t)grace_ms * 1000000);
  atomic_store(&p->stopping, 1);
  uint64_t in_flight = atomic_load(&p->in_flight);
  if (in_flight)
    proxy_log(p, "stopping: %llu exchange(s) in flight, waiting up to %d ms for them",
              (unsigned long long)in_flight, grace_ms);
  /* Drain before capture_http_stop(): from then on writes fail, so exchanges must
  ** finish (or be cut, with their error event written) while it is still down. New requests
  ** meanwhile get a 503. A worker stuck writing to a client that stopped reading is released
  ** by capture_http_stop() after a further 3 s; it then records a client_aborted exchange. */
  while (atomic_load(&p->in_flight) > 0 && capture_now_ns() < atomic_load(&p->deadline_ns))
    usleep(10000);
  for (int waited = 0; atomic_load(&p->in_flight) > 0 && waited < 3000; waited += 10) usleep(10000);
  if (p->http) capture_http_stop(p->http); /* returns once every worker has finished */
  p->http = NULL;
  st_status st = capture_store_close(p->store);
  p->store = NULL;
  proxy_log(p, "stopped: %llu accepted, %llu complete, %llu other; all recorded%s",
            (unsigned long long)atomic_load(&p->accepted),
            (unsigned long long)atomic_load(&p->completed),
            (unsigned long long)atomic_load(&p->failed), st ? " except as logged above" : "");
  return st;
}

void st_capture_cut_now(st_capture *p) { atomic_store(&p->deadline_ns, capture_now_ns()); }

void st_capture_free(st_capture *p) {
  if (!p) return;
  if (p->http || p->store) st_capture_shutdown(p, 0);
  capture_upstream_free(p->upstream);
  free(p->upstream_display);
  free(p->store_dir);
  free(p);
}

st_status st_capture_stop(st_capture *p, int grace_ms) {
  if (!p) return ST_OK;
  st_status st = st_capture_shutdown(p, grace_ms);
  st_capture_free(p);
  return st;
}
