/*
** capture_served.c — the listener and the requests store of the capture proxy, answering
** requests itself (served.h) instead of relaying them (capture_server.c).
**
** One served exchange is a capture_exchange like a relayed one, so the store writer records it
** with the same code: the request side (headers redacted, credentials remembered and scrubbed
** from every recorded byte, the query redacted) before the handler runs, the answer (head, bytes,
** SSE events with their times, summary) after it. What differs: the row's origin is 'served' and
** its upstream column names what answered; no hop-by-hop filtering is needed since nothing is
** forwarded. The answer is framed here: Content-Length bodies whole, streams chunked (one chunk
** per st_served_write, so an SSE event reaches the client in the write that made it).
*/
#define _GNU_SOURCE
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture_internal.h"
#include "served.h"
#include "recorder/index.h"
#include "recorder/recorder.h"

struct st_served {
  capture_http *http;
  capture_store *store;
  char *served_by;
  size_t max_request_bytes;
  void (*handler)(void *user, st_served_exchange *x);
  void (*log)(void *, const char *);
  void *user;
  int port;
  char url[200];
};

struct st_served_exchange {
  st_served *s;
  capture_conn *conn;
  capture_request *rq;
  capture_exchange *x;
  int problem;          /* st_served_body_problem */
  char problem_why[256];
  int head_sent, stream, client_gone;
  st_served_outcome outcome;
  st_buf frame;
};

static void served_log(st_served *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void served_log(st_served *s, const char *fmt, ...) {
  if (!s->log) return;
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  s->log(s->user, line);
}

/* ---- the request ---------------------------------------------------------------------------- */

const char *st_served_id(const st_served_exchange *e) { return e->x->id; }
const char *st_served_method(const st_served_exchange *e) { return e->x->method; }
const char *st_served_path(const st_served_exchange *e) { return e->x->path ? e->x->path : "/"; }
const char *st_served_header(const st_served_exchange *e, const char *name) {
  return capture_headers_get(&e->x->request_headers, name);
}
const char *st_served_body(const st_served_exchange *e, size_t *len) {
  if (len) *len = e->x->request_body.len;
  return e->x->request_body.len ? e->x->request_body.data : "";
}
int st_served_body_problem(const st_served_exchange *e, char *why, size_t why_len) {
  if (why && why_len) snprintf(why, why_len, "%s", e->problem_why);
  return e->problem;
}

/* ---- the answer ----------------------------------------------------------------------------- */

int st_served_add_header(st_served_exchange *e, const char *name, const char *value) {
  return capture_headers_add(&e->x->response_headers, name, strlen(name), value, strlen(value));
}

static int client_write(st_served_exchange *e, const void *p, size_t n) {
  if (e->client_gone) return -1;
  if (n && capture_conn_write(e->conn, p, n) < 0) {
    e->client_gone = 1;
    if (!e->x->client_error)
      capture_exchange_set_error(e->x, &e->x->client_error, "client closed the connection after "
                                 "%zu response bytes", e->x->response_bytes);
    return -1;
  }
  return 0;
}

/* capture_sse's callback: one event of the answer, timed at the write that completed it. */
static int on_event(void *user, const char *event, size_t event_len, const char *data,
                    size_t data_len, size_t offset, size_t length) {
  capture_exchange *x = user;
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
  ev->t_ns = capture_now_ns() - x->t0_ns;
  ev->offset = offset;
  ev->length = length;
  ev->event = event ? strndup(event, event_len) : NULL;
  ev->data = strndup(data, data_len);
  ev->data_len = data_len;
  if ((event && !ev->event) || !ev->data) {
    free(ev->event);
    free(ev->data);
    x->events_oom = 1;
    return 0;
  }
  x->n_events++;
  return 0;
}

int st_served_begin(st_served_exchange *e, int status, const char *content_type, int stream,
                    size_t content_length) {
  capture_exchange *x = e->x;
  if (e->head_sent) return -1;
  char len_text[32];
  snprintf(len_text, sizeof len_text, "%zu", content_length);
  int fail = capture_headers_add(&x->response_headers, "Content-Type", 12, content_type,
                                 strlen(content_type)) < 0;
  if (stream) {
    fail |= capture_headers_add(&x->response_headers, "Cache-Control", 13, "no-cache", 8) < 0;
    fail |= capture_headers_add(&x->response_headers, "Transfer-Encoding", 17, "chunked", 7) < 0;
  } else {
    fail |= capture_headers_add(&x->response_headers, "Content-Length", 14, len_text,
                                strlen(len_text)) < 0;
  }
  fail |= capture_headers_add(&x->response_headers, "x-sparsetrace-request-id", 24, x->id,
                              strlen(x->id)) < 0;
  st_buf head = {0};
  char line[128];
  snprintf(line, sizeof line, "HTTP/1.1 %d %s\r\n", status, capture_http_reason(status));
  fail |= st_buf_str(&head, line);
  for (size_t i = 0; i < x->response_headers.n; i++)
    fail |= st_buf_str(&head, x->response_headers.items[i].name) | st_buf_str(&head, ": ") |
            st_buf_str(&head, x->response_headers.items[i].value) | st_buf_str(&head, "\r\n");
  fail |= st_buf_str(&head, "\r\n");
  if (fail) { /* the head could not be built: a plain 500 instead, so the client and the row agree */
    st_buf_free(&head);
    char oom[256];
    capture_conn_close_after(e->conn);
    x->status = 500;
    e->head_sent = 1;
    st_served_set_outcome(e, ST_SERVED_REJECTED, "out of memory writing the answer's head");
    x->t_headers_ns = capture_now_ns();
    client_write(e, oom, capture_http_plain(oom, sizeof oom, 500, "out of memory writing the answer"));
    return -1;
  }
  x->status = status;
  x->stream = stream;
  e->stream = stream;
  if (stream) capture_sse_init(&x->sse, on_event, x);
  int rc = client_write(e, head.data, head.len);
  st_buf_free(&head);
  e->head_sent = 1;
  x->t_headers_ns = capture_now_ns();
  return rc;
}

int st_served_write(st_served_exchange *e, const void *p, size_t n) {
  capture_exchange *x = e->x;
  if (!e->head_sent || n == 0) return e->head_sent ? 0 : -1;
  if (x->t_first_byte_ns < 0) x->t_first_byte_ns = capture_now_ns();
  int rc;
  if (e->stream) {
    char len[24];
    int m = snprintf(len, sizeof len, "%zx\r\n", n);
    st_buf_reset(&e->frame);
    if (st_buf_add(&e->frame, len, (size_t)m) || st_buf_add(&e->frame, p, n) ||
        st_buf_add(&e->frame, "\r\n", 2))
      rc = -1;
    else
      rc = client_write(e, e->frame.data, e->frame.len);
  } else {
    rc = client_write(e, p, n);
  }
  if (rc < 0) return -1;
  x->response_bytes += n;
  if (!x->response_truncated && st_buf_add(&x->response_body, p, n)) x->response_truncated = 1;
  if (e->stream && !x->response_truncated) capture_sse_feed(&x->sse, p, n);
  if (capture_now_ns() - x->progress_ns >= CAPTURE_PROGRESS_MS * 1000000LL)
    capture_store_submit_progress(e->s->store, x);
  return 0;
}

int st_served_reply(st_served_exchange *e, int status, const char *content_type, const char *body,
                    size_t n) {
  if (st_served_begin(e, status, content_type, 0, n) < 0) return -1;
  return st_served_write(e, body, n);
}

int st_served_client_gone(st_served_exchange *e) {
  if (e->client_gone) return 1;
  struct pollfd pfd = {.fd = capture_conn_fd(e->conn), .events = POLLRDHUP};
  if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
    e->client_gone = 1;
    if (!e->x->client_error)
      capture_exchange_set_error(e->x, &e->x->client_error, "client closed the connection after "
                                 "%zu response bytes", e->x->response_bytes);
  }
  return e->client_gone;
}

void st_served_set_outcome(st_served_exchange *e, st_served_outcome o, const char *detail) {
  e->outcome = o;
  if (detail) capture_exchange_set_error(e->x, &e->x->upstream_error, "%s", detail);
}

/* ---- one exchange ----------------------------------------------------------------------------- */

static void serve_request(void *user, capture_conn *conn, capture_request *rq) {
  st_served *s = user;
  capture_exchange *x = capture_exchange_new();
  if (!x) { /* no row can hold it: the client and the log hear why */
    char oom[256];
    capture_conn_write(conn, oom, capture_http_plain(oom, sizeof oom, 500, "out of memory recording the request"));
    capture_conn_close_after(conn);
    served_log(s, "%s:%d: out of memory recording a request: answered 500, not stored", rq->remote_addr,
               rq->remote_port);
    return;
  }
  st_served_exchange e = {.s = s, .conn = conn, .rq = rq, .x = x};
  x->served = 1;
  snprintf(x->method, sizeof x->method, "%s", rq->method[0] ? rq->method : "GET");
  x->path = strdup(rq->path ? rq->path : "/");
  x->api = capture_api_from_path(x->path ? x->path : "/");
  x->upstream = s->served_by;
  snprintf(x->client_addr, sizeof x->client_addr, "%s:%d", rq->remote_addr, rq->remote_port);
  int oom = !x->path;
  for (size_t i = 0; i < rq->headers.n && !oom; i++) {
    const char *n = rq->headers.items[i].name, *v = rq->headers.items[i].value;
    oom |= capture_headers_add(&x->request_headers, n, strlen(n), v, strlen(v)) < 0;
    oom |= capture_secrets_add_header(&x->secrets, n, v) < 0;
  }
  int qoom = 0;
  x->query = capture_redact_query(&x->secrets, rq->query, &qoom);
  oom |= qoom;
  if (oom || rq->oom) {
    e.problem = 500;
    snprintf(e.problem_why, sizeof e.problem_why, "out of memory reading the request");
  } else if (rq->head_too_large) {
    e.problem = 431;
    snprintf(e.problem_why, sizeof e.problem_why, "request head (line and headers) larger than %d "
             "bytes", CAPTURE_MAX_HEAD_BYTES);
  } else if (rq->too_large) {
    x->request_declared_bytes = rq->declared_bytes;
    e.problem = 413;
    snprintf(e.problem_why, sizeof e.problem_why, "request body of %zu bytes is larger than the "
             "server's limit of %zu bytes", rq->declared_bytes, s->max_request_bytes);
  } else {
    x->request_body = rq->body;
    memset(&rq->body, 0, sizeof rq->body);
    if (rq->body_timeout) {
      e.problem = 400;
      snprintf(e.problem_why, sizeof e.problem_why, "the request body was cut short after %zu "
               "bytes", x->request_body.len);
      capture_exchange_set_error(x, &x->client_error, "%s", e.problem_why);
    } else if (capture_secrets_add_body(&x->secrets, capture_headers_get(&x->request_headers,
                                        "content-type"), x->request_body.data,
                                        x->request_body.len) < 0) {
      e.problem = 500;
      snprintf(e.problem_why, sizeof e.problem_why, "out of memory reading the request");
    }
  }
  if (e.problem) capture_conn_close_after(conn);
  capture_store_submit_open(s->store, x);

  s->handler(s->user, &e);
  if (e.stream && !e.client_gone && client_write(&e, "0\r\n\r\n", 5) < 0) e.client_gone = 1;
  if (!e.head_sent) { /* a handler that answered nothing: the client still gets an answer */
    static const char empty[] = "{\"error\":{\"message\":\"no answer\",\"type\":\"server_error\"}}";
    st_served_reply(&e, 500, "application/json", empty, sizeof empty - 1);
    e.outcome = ST_SERVED_REJECTED;
  }
  x->state = e.client_gone ? CAPTURE_CLIENT_ABORTED
             : e.outcome == ST_SERVED_REJECTED ? CAPTURE_REJECTED
             : e.outcome == ST_SERVED_INTERRUPTED ? CAPTURE_INTERRUPTED
                                                  : CAPTURE_COMPLETE;
  if (e.client_gone) capture_conn_close_after(conn);
  x->t_end_ns = capture_now_ns();
  char *log_path = capture_secrets_scrub(&x->secrets, x->path ? x->path : "");
  served_log(s, "%s %s %s %d %s %.1f ms %zu B%s%s", x->id, x->method, log_path ? log_path : "",
             x->status, capture_state_name(x->state), (double)(x->t_end_ns - x->t0_ns) / 1e6,
             x->response_bytes, x->client_error ? " client: " : "",
             x->client_error ? x->client_error : "");
  free(log_path);
  capture_store_submit_finish(s->store, x);
  st_buf_free(&e.frame);
  capture_exchange_unref(x);
}

static void listener_log(void *user, const char *line) { served_log(user, "%s", line); }

/* ---- start / stop ------------------------------------------------------------------------------ */

st_status st_served_start(const st_served_config *c, st_served **out) {
  *out = NULL;
  st_served *s = calloc(1, sizeof *s);
  if (!s) return st_fail(ST_ENOMEM, "starting the server");
  s->handler = c->handler;
  s->log = c->log;
  s->user = c->user;
  s->max_request_bytes = c->max_request_bytes ? c->max_request_bytes : 32u << 20;
  s->served_by = strdup(c->served_by ? c->served_by : "sparsetrace serve");
  st_status st;
  if (!s->served_by) {
    st = st_fail(ST_ENOMEM, "starting the server");
    goto fail;
  }
  const char *store_dir = c->store_dir ? c->store_dir : ST_DEFAULT_STORE;
  capture_store_options so = {store_dir, 1u << 20, c->log, c->user};
  if ((st = capture_store_open(&so, &s->store))) {
    st_fail_context(st, "store %s: ", store_dir);
    goto fail;
  }
  capture_http_options ho;
  capture_http_options_init(&ho);
  ho.host = c->host ? c->host : "127.0.0.1";
  ho.port = c->port;
  ho.threads = c->threads > 0 ? c->threads : 8;
  ho.max_body_bytes = s->max_request_bytes;
  ho.write_timeout_ms = 600000; /* a client may read slowly while the engine generates */
  ho.handler = serve_request;
  ho.log = listener_log;
  ho.user = s;
  if ((st = capture_http_start(&ho, &s->http))) {
    st_fail_context(st, "listening on %s:%d: ", ho.host, c->port);
    goto fail;
  }
  s->port = capture_http_port(s->http);
  snprintf(s->url, sizeof s->url, "http://%s:%d", ho.host, s->port);
  *out = s;
  return ST_OK;
fail:
  capture_store_close(s->store);
  free(s->served_by);
  free(s);
  return st;
}

int st_served_port(const st_served *s) { return s->port; }
const char *st_served_url(const st_served *s) { return s->url; }

st_status st_served_stop(st_served *s) {
  if (!s) return ST_OK;
  if (s->http) capture_http_stop(s->http); /* returns once every handler has returned */
  st_status st = capture_store_close(s->store);
  free(s->served_by);
  free(s);
  return st;
}
