/*
** capture_http.c — the proxy's listening side: a small HTTP/1.1 server that hands complete
** requests (head and body) to a pool of worker threads.
**
** Why not a library server (it was civetweb until issue 14). civetweb gives each connection a
** worker thread from accept on, so 300 clients dripping a header byte a second held every worker
** and every normal request timed out; and it parses at most 64 header lines, dropping the rest
** without a word (an Authorization after 80 filler headers never reached the upstream), its own
** body framing then missing a Content-Length that came later (curl sends it last). Here:
**
**   - One thread (the reader) accepts and, in a poll loop over non-blocking sockets, reads every
**     request's head and body. A worker gets a connection only once its request is complete in
**     memory, so a slow or silent client costs a descriptor and a buffer, never a worker; the
**     workers (threads, default 256) are all for exchanges with the upstream.
**   - Deadlines: the head must be complete within head_timeout_ms of the connection's first
**     byte (first request: of the accept), an idle keep-alive connection is closed after
**     keepalive_timeout_ms, a body must arrive within body_timeout_ms plus one second per
**     64 KiB received (a fast upload of any size passes, a drip does not). A head that misses
**     its deadline gets 408; a body that does is handed over as `body_timeout` (recorded).
**   - At most max_client_connections connections per client address (the rest get 503 and are
**     closed), and at most max_connections in all (bounded by the descriptor limit, raised to
**     its hard value at start).
**   - Every header line is kept, in order, up to max_head_bytes for the request line and headers
**     together (CRLFs included; default 64 KiB); a longer head is handed over as
**     `head_too_large`, with the lines that fitted, so that the relay answers 431 and records it.
**     Nothing is dropped silently.
**   - Framing: Content-Length, or Transfer-Encoding ending in chunked (decoded here; chunk
**     extensions and trailers discarded); both at once, several differing lengths or another
**     coding are refused with 400 (request smuggling). Expect: 100-continue is answered before
**     the body is read. Keep-alive: HTTP/1.1 unless "Connection: close", HTTP/1.0 only with
**     "Connection: keep-alive"; pipelined bytes after a request are kept for the next one.
**   - Writes (from workers) are blocking with poll: a client that reads nothing for
**     write_timeout_ms is treated as gone. A connection that is not kept alive is closed
**     gracefully (shut down for writing, then drained by the reader for up to a second), so
**     that an error answer sent before the body was read is not destroyed by a reset.
*/
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "capture_internal.h"

enum conn_state { C_HEAD, C_BODY, C_WORK, C_CLOSING };

struct capture_conn {
  capture_http *h;
  int fd;
  enum conn_state state;
  st_buf in;       /* received, not yet consumed */
  size_t scanned;       /* C_HEAD: bytes of in already searched for the end of the head */
  capture_request rq;
  int keep_alive;       /* per request, from the head */
  int close_after;      /* the handler said so */
  int requests;         /* handled on this connection */
  int64_t deadline_ns;  /* of the current state */
  int idle;             /* C_HEAD waiting for a next request's first byte */
  int64_t body_start_ns;
  int64_t remaining;    /* Content-Length: bytes left; chunked: of the current chunk */
  int chunk_phase;      /* chunked: 0 size line, 1 data, 2 CRLF after data, 3 trailers */
  void **slot;          /* the worker's slot, while on a worker */
  struct capture_conn *next;
};

typedef struct addr_count {
  char addr[64];
  int n;
  struct addr_count *next;
} addr_count;

struct capture_http {
  capture_http_options o;
  int listen_fd, port;
  int wake[2];
  pthread_t reader;
  pthread_t *workers;
  int n_workers, reader_started;
  atomic_int stopping;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  capture_conn *ready_head, *ready_tail; /* complete requests for the workers */
  capture_conn *back;                    /* from workers: kept alive, or closing */
  addr_count *counts[256];
  int total;                             /* open connections */
};

static int64_t ms_ns(int ms) { return (int64_t)ms * 1000000; }

static void log_h(capture_http *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_h(capture_http *h, const char *fmt, ...) {
  if (!h->o.log) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  h->o.log(h->o.user, line);
}

const char *capture_http_reason(int status) {
  switch (status) {
  case 100: return "Continue";
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 301: return "Moved Permanently";
  case 302: return "Found";
  case 304: return "Not Modified";
  case 307: return "Temporary Redirect";
  case 308: return "Permanent Redirect";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 411: return "Length Required";
  case 413: return "Content Too Large";
  case 422: return "Unprocessable Content";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 499: return "Client Closed Request";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  case 529: return "Site Overloaded";
  }
  return status < 200 ? "Informational" : status < 300 ? "OK" : status < 400 ? "Redirection"
         : status < 500 ? "Client Error" : "Server Error";
}

/* ---- per-address connection counts (reader and workers) ------------------------------------ */

static unsigned addr_hash(const char *a) {
  unsigned v = 2166136261u;
  for (; *a; a++) v = (v ^ (unsigned char)*a) * 16777619u;
  return v & 255;
}

/* +1 for addr unless that passes the caps: 0, or -1 (per address) / -2 (in all). */
static int count_add(capture_http *h, const char *addr) {
  pthread_mutex_lock(&h->mu);
  int rc = 0;
  addr_count **slot = &h->counts[addr_hash(addr)], *c = *slot;
  while (c && strcmp(c->addr, addr)) c = c->next;
  if (h->total >= h->o.max_connections) rc = -2;
  else if (c && c->n >= h->o.max_client_connections) rc = -1;
  else if (!c && !(c = calloc(1, sizeof *c))) rc = -2;
  else {
    if (!c->addr[0]) {
      snprintf(c->addr, sizeof c->addr, "%s", addr);
      c->next = *slot;
      *slot = c;
    }
    c->n++;
    h->total++;
  }
  pthread_mutex_unlock(&h->mu);
  return rc;
}

static void count_remove(capture_http *h, const char *addr) {
  pthread_mutex_lock(&h->mu);
  addr_count **p = &h->counts[addr_hash(addr)];
  while (*p && strcmp((*p)->addr, addr)) p = &(*p)->next;
  if (*p && --(*p)->n == 0) {
    addr_count *dead = *p;
    *p = dead->next;
    free(dead);
  }
  h->total--;
  pthread_mutex_unlock(&h->mu);
}

/* ---- connections ----------------------------------------------------------------------------- */

static void request_reset(capture_request *rq) {
  free(rq->path);
  free(rq->query);
  capture_headers_free(&rq->headers);
  st_buf_free(&rq->body);
  char addr[sizeof rq->remote_addr];
  int port = rq->remote_port;
  memcpy(addr, rq->remote_addr, sizeof addr);
  memset(rq, 0, sizeof *rq);
  memcpy(rq->remote_addr, addr, sizeof addr);
  rq->remote_port = port;
  rq->content_length = -1;
}

static void conn_free(capture_conn *c) {
  if (c->fd >= 0) close(c->fd);
  count_remove(c->h, c->rq.remote_addr);
  request_reset(&c->rq);
  st_buf_free(&c->in);
  free(c);
}

size_t capture_http_plain(char *out, size_t cap, int status, const char *why) {
  int n = snprintf(out, cap,
                   "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                   "Connection: close\r\n\r\n%s\n",
                   status, capture_http_reason(status), strlen(why) + 1, why);
  return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* Best-effort write of a whole small answer from the reader (non-blocking socket). */
static void say_fd(int fd, int status, const char *why) {
  char msg[512];
  if (send(fd, msg, capture_http_plain(msg, sizeof msg, status, why), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
    /* client gone: fine */
  }
}

static void say(capture_conn *c, int status, const char *why) { say_fd(c->fd, status, why); }

int capture_conn_write(capture_conn *c, const void *p, size_t n) {
  const char *b = p;
  int64_t deadline = capture_now_ns() + ms_ns(c->h->o.write_timeout_ms);
  while (n > 0) {
    if (atomic_load(&c->h->stopping) == 2) return -1;
    ssize_t w = send(c->fd, b, n, MSG_NOSIGNAL);
    if (w > 0) {
      b += w;
      n -= (size_t)w;
      deadline = capture_now_ns() + ms_ns(c->h->o.write_timeout_ms);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (capture_now_ns() >= deadline) return -1; /* not read for write_timeout_ms */
      struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
      poll(&pf, 1, 100);
      continue;
    }
    return -1;
  }
  return 0;
}

void capture_conn_close_after(capture_conn *c) { c->close_after = 1; }
int capture_conn_fd(const capture_conn *c) { return c->fd; }
void **capture_conn_thread_slot(capture_conn *c) { return c->slot; }

/* ---- parsing (reader) ------------------------------------------------------------------------ */

static int is_tchar(unsigned char ch) {
  return ch > 32 && ch < 127 && !strchr("\"(),/:;<=>?@[\\]{}", ch);
}

/* Index just past the blank line ending the head in b (CRLF or bare LF line ends), or 0;
** searching from `from` (what was searched before, less the 2 bytes an end may straddle). */
static size_t head_end(const char *b, size_t n, size_t from) {
  for (size_t i = from > 2 ? from - 2 : 0; i < n; i++) {
    if (b[i] != '\n') continue;
    if (i + 1 < n && b[i + 1] == '\n') return i + 2;
    if (i + 2 < n && b[i + 1] == '\r' && b[i + 2] == '\n') return i + 3;
  }
  return 0;
}

/* Next line of [p, end): sets *len (without CR LF), returns the start of the following one, or
** NULL when no complete line is left. */
static const char *next_line(const char *p, const char *end, size_t *len) {
  const char *nl = memchr(p, '\n', (size_t)(end - p));
  if (!nl) return NULL;
  *len = (size_t)(nl - p);
  if (*len > 0 && p[*len - 1] == '\r') (*len)--;
  return nl + 1;
}

/* Parses the request line and the header lines of [b, b+n) into rq. complete: the head is all
** there (else only the whole lines that fitted are taken, for a 431's record). 0, or 400 with
** *why set. */
static int parse_head(capture_request *rq, const char *b, size_t n, int complete, const char **why) {
  const char *p = b, *end = b + n;
  size_t len;
  const char *next = next_line(p, end, &len);
  if (!next) {
    *why = "no request line";
    return 400;
  }
  const char *sp1 = memchr(p, ' ', len);
  const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', len - (size_t)(sp1 + 1 - p)) : NULL;
  if (!sp1 || !sp2 || sp1 == p || (size_t)(sp1 - p) >= sizeof rq->method || sp2 == sp1 + 1) {
    *why = "malformed request line";
    return 400;
  }
  for (const char *m = p; m < sp1; m++)
    if (!is_tchar((unsigned char)*m)) {
      *why = "malformed method";
      return 400;
    }
  const char *version = sp2 + 1;
  size_t vlen = len - (size_t)(version - p);
  if (vlen != 8 || strncmp(version, "HTTP/1.", 7) || (version[7] != '0' && version[7] != '1')) {
    *why = "not an HTTP/1.x request";
    return 400;
  }
  memcpy(rq->method, p, (size_t)(sp1 - p));
  rq->method[sp1 - p] = 0;
  rq->http10 = version[7] == '0';
  const char *target = sp1 + 1;
  size_t tlen = (size_t)(sp2 - target);
  for (size_t i = 0; i < tlen; i++)
    if ((unsigned char)target[i] <= 32 || (unsigned char)target[i] == 127) {
      *why = "malformed request target";
      return 400;
    }
  const char *q = memchr(target, '?', tlen);
  const char *hash = memchr(target, '#', tlen);
  size_t plen = q ? (size_t)(q - target) : hash ? (size_t)(hash - target) : tlen;
  rq->path = strndup(target, plen);
  if (q) rq->query = strndup(q + 1, (size_t)((hash && hash > q ? hash : target + tlen) - q - 1));
  if (!rq->path || (q && !rq->query)) {
    *why = "out of memory";
    return 500;
  }
  for (p = next; (next = next_line(p, end, &len)) && len > 0; p = next) {
    if (p[0] == ' ' || p[0] == '\t') {
      *why = "obsolete header line folding";
      return 400;
    }
    const char *colon = memchr(p, ':', len);
    if (!colon || colon == p) {
      *why = "malformed header line";
      return 400;
    }
    for (const char *k = p; k < colon; k++)
      if (!is_tchar((unsigned char)*k)) {
        *why = "malformed header name";
        return 400;
      }
    const char *v = colon + 1, *ve = p + len;
    while (v < ve && (*v == ' ' || *v == '\t')) v++;
    while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
    for (const char *k = v; k < ve; k++)
      if ((unsigned char)*k < 32 && *k != '\t') {
        *why = "control character in a header value";
        return 400;
      }
    if (capture_headers_add(&rq->headers, p, (size_t)(colon - p), v, (size_t)(ve - v)) < 0) {
      *why = "out of memory";
      return 500;
    }
  }
  if (!complete) return 0;
  /* Framing. */
  const char *te = NULL;
  int64_t cl = -1;
  for (size_t i = 0; i < rq->headers.n; i++) {
    const capture_header *hd = &rq->headers.items[i];
    if (!strcasecmp(hd->name, "transfer-encoding")) {
      if (te) {
        *why = "more than one Transfer-Encoding header";
        return 400;
      }
      te = hd->value;
    } else if (!strcasecmp(hd->name, "content-length")) {
      char *e;
      errno = 0;
      long long v = strtoll(hd->value, &e, 10);
      if (!hd->value[0] || *e || errno || v < 0 || !(hd->value[0] >= '0' && hd->value[0] <= '9')) {
        *why = "malformed Content-Length";
        return 400;
      }
      if (cl >= 0 && cl != v) {
        *why = "conflicting Content-Length headers";
        return 400;
      }
      cl = v;
    }
  }
  if (te) {
    if (cl >= 0) {
      *why = "both Transfer-Encoding and Content-Length";
      return 400;
    }
    if (strcasecmp(te, "chunked")) {
      *why = "a transfer coding other than chunked";
      return 400;
    }
    rq->chunked = 1;
  }
  rq->content_length = cl;
  const char *connection = capture_headers_get(&rq->headers, "connection");
  int close = 0, keep = 0;
  for (const char *t = connection; t && *t;) {
    while (*t == ' ' || *t == '\t' || *t == ',') t++;
    size_t k = strcspn(t, ", \t");
    if (k == 5 && !strncasecmp(t, "close", 5)) close = 1;
    if (k == 10 && !strncasecmp(t, "keep-alive", 10)) keep = 1;
    t += k;
  }
  rq->keep_alive = !close && (!rq->http10 || keep);
  return 0;
}

/* ---- the reader ------------------------------------------------------------------------------ */

typedef struct conn_list {
  capture_conn **items;
  size_t n, cap;
} conn_list;

static int list_add(conn_list *l, capture_conn *c) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    capture_conn **v = realloc(l->items, cap * sizeof *v);
    if (!v) return -1;
    l->items = v;
    l->cap = cap;
  }
  l->items[l->n++] = c;
  return 0;
}

/* Hands a complete request to the workers. */
static void dispatch(capture_http *h, capture_conn *c) {
  c->state = C_WORK;
  c->next = NULL;
  pthread_mutex_lock(&h->mu);
  if (h->ready_tail) h->ready_tail->next = c;
  else h->ready_head = c;
  h->ready_tail = c;
  pthread_cond_signal(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

/* Graceful close: no more writes, drain what the client still sends for up to a second. */
static void start_closing(capture_conn *c) {
  shutdown(c->fd, SHUT_WR);
  c->state = C_CLOSING;
  c->deadline_ns = capture_now_ns() + ms_ns(1000);
}

/* Decodes body bytes from c->in into the request. 1: body complete, 0: need more, -1: bad
** chunked framing. */
static int take_body(capture_http *h, capture_conn *c) {
  capture_request *rq = &c->rq;
  size_t used = 0;
  int rc = 0;
  while (rc == 0 && used < c->in.len) {
    const char *p = c->in.data + used;
    size_t avail = c->in.len - used;
    if (!rq->chunked || c->chunk_phase == 1) {
      size_t take = (int64_t)avail < c->remaining ? avail : (size_t)c->remaining;
      if (rq->body.len + take > h->o.max_body_bytes) { /* keep counting, stop keeping */
        rq->too_large = 1;
        rq->declared_bytes = rq->body.len + take;
        rc = 1;
        break;
      }
      if (st_buf_add(&rq->body, p, take) != ST_OK) {
        rq->oom = 1;
        rc = 1;
        break;
      }
      used += take;
      c->remaining -= (int64_t)take;
      if (c->remaining == 0) {
        if (!rq->chunked) rc = 1;
        else c->chunk_phase = 2;
      }
      continue;
    }
    size_t len;
    const char *next = next_line(p, p + avail, &len);
    if (!next) {
      if (avail > 4096) rc = -1; /* no line is that long in chunked framing */
      break;
    }
    used += (size_t)(next - p);
    if (c->chunk_phase == 0) { /* size [; extensions] */
      char *e;
      errno = 0;
      unsigned long long size = strtoull(p, &e, 16);
      if (e == p || errno || (*e != ';' && *e != ' ' && *e != '\t' && e != p + len) ||
          size > (1ull << 40)) {
        rc = -1;
        break;
      }
      if (size == 0) c->chunk_phase = 3;
      else {
        c->remaining = (int64_t)size;
        c->chunk_phase = 1;
      }
    } else if (c->chunk_phase == 2) { /* the CRLF after a chunk's data */
      if (len != 0) rc = -1;
      else c->chunk_phase = 0;
    } else if (len == 0) { /* trailers end */
      rc = 1;
    }
  }
  memmove(c->in.data, c->in.data + used, c->in.len - used);
  c->in.len -= used;
  if (c->in.data) c->in.data[c->in.len] = 0;
  return rc;
}

/* Moves c along with what it has buffered. Returns 0 to keep it in the reader, 1 when it was
** dispatched (or freed). */
static int advance(capture_http *h, capture_conn *c, int64_t now) {
  if (c->state == C_HEAD) {
    size_t skip = 0; /* RFC 9112 §2.2: empty lines before a request line are ignored */
    while (skip < c->in.len && (c->in.data[skip] == '\r' || c->in.data[skip] == '\n')) skip++;
    if (skip) {
      memmove(c->in.data, c->in.data + skip, c->in.len - skip);
      c->in.len -= skip;
      c->scanned = 0;
    }
    if (c->in.len > 0 && c->idle) { /* a next request began: its head has head_timeout_ms */
      c->idle = 0;
      c->deadline_ns = now + ms_ns(h->o.head_timeout_ms);
    }
    size_t end = head_end(c->in.data ? c->in.data : "", c->in.len, c->scanned);
    c->scanned = end ? 0 : c->in.len;
    if (!end && c->in.len <= h->o.max_head_bytes) return 0;
    const char *why = "";
    int too_large = !end || end > h->o.max_head_bytes;
    size_t parse_len = too_large ? h->o.max_head_bytes : end;
    if (parse_len > c->in.len) parse_len = c->in.len;
    int st = parse_head(&c->rq, c->in.data, parse_len, !too_large, &why);
    if (st && !(too_large && c->rq.path)) {
      if (too_large) {
        st = 431;
        why = "request line longer than the proxy's limit on request heads";
      }
      log_h(h, "%s:%d: %s: answered %d", c->rq.remote_addr, c->rq.remote_port, why, st);
      say(c, st, why);
      start_closing(c);
      return 0;
    }
    if (too_large) { /* handed over with the lines that fitted, answered 431 and recorded */
      c->rq.head_too_large = 1;
      c->rq.keep_alive = 0;
      c->in.len = 0;
      dispatch(h, c);
      return 1;
    }
    memmove(c->in.data, c->in.data + end, c->in.len - end);
    c->in.len -= end;
    c->in.data[c->in.len] = 0;
    if (c->rq.content_length > (int64_t)h->o.max_body_bytes) { /* refused unread: 413 */
      c->rq.too_large = 1;
      c->rq.declared_bytes = (size_t)c->rq.content_length;
      c->rq.keep_alive = 0;
      dispatch(h, c);
      return 1;
    }
    if (!c->rq.chunked && c->rq.content_length <= 0) {
      dispatch(h, c);
      return 1;
    }
    const char *expect = capture_headers_get(&c->rq.headers, "expect");
    if (expect && !strcasecmp(expect, "100-continue") && !c->rq.http10)
      send(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL | MSG_DONTWAIT);
    c->state = C_BODY;
    c->remaining = c->rq.chunked ? 0 : c->rq.content_length;
    c->chunk_phase = 0;
    c->body_start_ns = now;
    c->deadline_ns = now + ms_ns(h->o.body_timeout_ms);
  }
  if (c->state == C_BODY) {
    int rc = take_body(h, c);
    if (rc < 0) {
      log_h(h, "%s:%d: malformed chunked request body: answered 400", c->rq.remote_addr,
            c->rq.remote_port);
      say(c, 400, "malformed chunked request body");
      start_closing(c);
      return 0;
    }
    /* A second more for every 64 KiB that arrived: uploads at a useful rate never time out. */
    c->deadline_ns = c->body_start_ns + ms_ns(h->o.body_timeout_ms) +
                     (int64_t)(c->rq.body.len / 65536) * ms_ns(1000);
    if (rc == 0) return 0;
    if (c->rq.too_large || c->rq.oom) c->rq.keep_alive = 0;
    dispatch(h, c);
    return 1;
  }
  return 0;
}

/* A deadline passed. Returns 1 when c is gone from the reader. */
static int expire(capture_http *h, capture_conn *c) {
  if (c->state == C_HEAD) {
    if (!c->idle && c->in.len > 0) {
      log_h(h, "%s:%d: request head not complete within %d ms (%zu bytes): answered 408",
            c->rq.remote_addr, c->rq.remote_port, h->o.head_timeout_ms, c->in.len);
      say(c, 408, "request head not complete in time");
    }
    start_closing(c);
    return 0;
  }
  if (c->state == C_BODY) { /* handed over, recorded as a client that stopped sending */
    c->rq.body_timeout = 1;
    c->rq.keep_alive = 0;
    dispatch(h, c);
    return 1;
  }
  conn_free(c); /* C_CLOSING */
  return 1;
}

static void accept_new(capture_http *h, conn_list *live, int64_t now) {
  for (;;) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(h->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE)
        log_h(h, "accept: %s (raise the descriptor limit)", strerror(errno));
      return;
    }
    char addr[48] = "?";
    int port = 0;
    if (sa.ss_family == AF_INET) {
      inet_ntop(AF_INET, &((struct sockaddr_in *)&sa)->sin_addr, addr, sizeof addr);
      port = ntohs(((struct sockaddr_in *)&sa)->sin_port);
    } else if (sa.ss_family == AF_INET6) {
      inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&sa)->sin6_addr, addr, sizeof addr);
      port = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
    }
    int rc = count_add(h, addr);
    if (rc < 0) {
      static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                                 "Retry-After: 1\r\nContent-Length: 46\r\nConnection: close\r\n\r\n"
                                 "sparsetrace capture: too many connections\n\n\n\n";
      if (send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
      }
      shutdown(fd, SHUT_WR);
      close(fd);
      log_h(h, "%s:%d: refused: %s", addr, port,
            rc == -1 ? "too many connections from this address (max_client_connections)"
                     : "too many connections (max_connections)");
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    capture_conn *c = calloc(1, sizeof *c);
    if (!c || list_add(live, c) < 0) { /* the client and the log hear why */
      say_fd(fd, 500, "out of memory accepting the connection");
      free(c);
      shutdown(fd, SHUT_WR);
      close(fd);
      count_remove(h, addr);
      log_h(h, "%s:%d: out of memory accepting the connection: answered 500", addr, port);
      continue;
    }
    c->h = h;
    c->fd = fd;
    c->state = C_HEAD;
    snprintf(c->rq.remote_addr, sizeof c->rq.remote_addr, "%s", addr);
    c->rq.remote_port = port;
    c->rq.content_length = -1;
    c->deadline_ns = now + ms_ns(h->o.head_timeout_ms);
  }
}

static void *reader_main(void *arg) {
  capture_http *h = arg;
  conn_list live = {0};
  struct pollfd *pf = NULL;
  size_t pf_cap = 0;
  while (!atomic_load(&h->stopping)) {
    int64_t now = capture_now_ns();
    /* Connections coming back from workers. */
    pthread_mutex_lock(&h->mu);
    capture_conn *back = h->back;
    h->back = NULL;
    pthread_mutex_unlock(&h->mu);
    while (back) {
      capture_conn *c = back;
      back = c->next;
      if (list_add(&live, c) < 0) conn_free(c);
      else if (c->state == C_HEAD && advance(h, c, now)) live.n--; /* pipelined: at once */
    }
    if (pf_cap < live.n + 2) {
      pf_cap = 2 * (live.n + 2);
      struct pollfd *np = realloc(pf, pf_cap * sizeof *pf);
      if (!np) break;
      pf = np;
    }
    int64_t soonest = now + ms_ns(1000);
    pf[0] = (struct pollfd){.fd = h->listen_fd, .events = POLLIN};
    pf[1] = (struct pollfd){.fd = h->wake[0], .events = POLLIN};
    for (size_t i = 0; i < live.n; i++) {
      pf[i + 2] = (struct pollfd){.fd = live.items[i]->fd, .events = POLLIN | POLLRDHUP};
      if (live.items[i]->deadline_ns < soonest) soonest = live.items[i]->deadline_ns;
    }
    int timeout = soonest <= now ? 0 : (int)((soonest - now) / 1000000) + 1;
    int n = poll(pf, live.n + 2, timeout);
    if (n < 0 && errno != EINTR) break;
    now = capture_now_ns();
    if (pf[1].revents & POLLIN) {
      char drain[64];
      while (read(h->wake[0], drain, sizeof drain) > 0) {
      }
    }
    size_t polled = live.n; /* accept_new appends after these */
    if (pf[0].revents & POLLIN) accept_new(h, &live, now);
    size_t keep = 0;
    for (size_t i = 0; i < live.n; i++) {
      capture_conn *c = live.items[i];
      int gone = 0;
      short rev = i < polled ? pf[i + 2].revents : 0;
      if (rev & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) {
        char buf[65536];
        int eof = 0, oom = 0;
        for (;;) {
          ssize_t r = recv(c->fd, buf, sizeof buf, 0);
          if (r > 0) {
            if (c->state == C_CLOSING) continue; /* drained and discarded */
            if (st_buf_add(&c->in, buf, (size_t)r) != ST_OK) {
              oom = 1;
              break;
            }
            /* Enough to decide on: a head over the limit or a body step; the rest next time. */
            if (c->in.len > h->o.max_head_bytes + sizeof buf && c->state != C_BODY) break;
            if (c->state == C_BODY && c->in.len > (1u << 20)) break;
            continue;
          }
          if (r < 0 && errno == EINTR) continue;
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          eof = 1; /* EOF or error */
          break;
        }
        if (oom) { /* the client hears why, and so does the log: not a silent hang-up */
          log_h(h, "%s:%d: out of memory buffering a request (%zu bytes read): answered 500", c->rq.remote_addr,
                c->rq.remote_port, c->in.len);
          say(c, 500, "out of memory reading the request");
          start_closing(c);
        } else if (c->state == C_CLOSING) {
          if (eof) {
            conn_free(c);
            gone = 1;
          }
        } else {
          if (eof) c->rq.keep_alive = 0;
          gone = advance(h, c, now); /* a request complete before the EOF still goes */
          if (!gone && eof) {
            if (c->state == C_BODY) { /* recorded: the client stopped sending */
              c->rq.body_timeout = 2;
              c->rq.keep_alive = 0;
              dispatch(h, c);
            } else {
              conn_free(c);
            }
            gone = 1;
          }
        }
      }
      if (!gone && now >= c->deadline_ns) gone = expire(h, c);
      if (!gone) live.items[keep++] = c;
    }
    live.n = keep;
  }
  for (size_t i = 0; i < live.n; i++) conn_free(live.items[i]);
  free(live.items);
  free(pf);
  return NULL;
}

static void wake_reader(capture_http *h) {
  if (write(h->wake[1], "x", 1) < 0) { /* full pipe: the reader is awake anyway */
  }
}

/* ---- workers --------------------------------------------------------------------------------- */

static void *worker_main(void *arg) {
  capture_http *h = arg;
  void *slot = NULL;
  for (;;) {
    pthread_mutex_lock(&h->mu);
    while (!h->ready_head && !atomic_load(&h->stopping)) pthread_cond_wait(&h->cv, &h->mu);
    capture_conn *c = h->ready_head;
    if (c) {
      h->ready_head = c->next;
      if (!h->ready_head) h->ready_tail = NULL;
    }
    pthread_mutex_unlock(&h->mu);
    if (!c) break; /* stopping, nothing queued */
    c->slot = &slot;
    c->close_after = 0;
    h->o.handler(h->o.user, c, &c->rq);
    c->slot = NULL;
    c->requests++;
    int keep = c->rq.keep_alive && !c->close_after && !atomic_load(&h->stopping);
    request_reset(&c->rq);
    if (atomic_load(&h->stopping)) {
      conn_free(c);
      continue;
    }
    if (keep) {
      c->state = C_HEAD;
      c->idle = 1;
      c->deadline_ns = capture_now_ns() + ms_ns(h->o.keepalive_timeout_ms);
    } else {
      start_closing(c);
    }
    pthread_mutex_lock(&h->mu);
    c->next = h->back;
    h->back = c;
    pthread_mutex_unlock(&h->mu);
    wake_reader(h);
  }
  if (h->o.free_slot) h->o.free_slot(slot);
  return NULL;
}

/* ---- start / stop ---------------------------------------------------------------------------- */

void capture_http_options_init(capture_http_options *o) {
  memset(o, 0, sizeof *o);
  o->threads = 256;
  o->max_client_connections = 256;
  o->max_connections = 8192;
  o->max_head_bytes = CAPTURE_MAX_HEAD_BYTES;
  o->max_body_bytes = 32u << 20;
  o->head_timeout_ms = 10000;
  o->keepalive_timeout_ms = 10000;
  o->body_timeout_ms = 60000;
  o->write_timeout_ms = 60000;
}

st_status capture_http_start(const capture_http_options *o, capture_http **out) {
  *out = NULL;
  capture_http *h = calloc(1, sizeof *h);
  if (!h) return st_fail(ST_ENOMEM, "starting the listener");
  h->o = *o;
  h->listen_fd = h->wake[0] = h->wake[1] = -1;
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  /* Each connection is a descriptor (two, with its upstream one): use what the system allows. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    long room = ((long)rl.rlim_cur - 64) / 2;
    if (room < h->o.max_connections) h->o.max_connections = room > 16 ? (int)room : 16;
  }
  char host[128];
  snprintf(host, sizeof host, "%s", o->host);
  size_t hl = strlen(host);
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = 0;
  }
  struct sockaddr_storage sa = {0};
  socklen_t sl;
  struct sockaddr_in *a4 = (struct sockaddr_in *)&sa;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&sa;
  if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)o->port);
    sl = sizeof *a4;
  } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)o->port);
    sl = sizeof *a6;
  } else {
    free(h);
    return st_fail(ST_EINVAL, "'%s' is not an IP address", o->host);
  }
  st_status st = ST_OK;
  int one = 1;
  h->listen_fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (h->listen_fd < 0 || setsockopt(h->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(h->listen_fd, (struct sockaddr *)&sa, sl) || listen(h->listen_fd, 1024)) {
    st = st_fail(ST_EIO, "cannot listen on %s:%d: %s", o->host, o->port, strerror(errno));
    goto fail;
  }
  sl = sizeof sa;
  getsockname(h->listen_fd, (struct sockaddr *)&sa, &sl);
  h->port = ntohs(sa.ss_family == AF_INET ? a4->sin_port : a6->sin6_port);
  if (pipe2(h->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    st = st_fail(ST_EIO, "listener: pipe: %s", strerror(errno));
    goto fail;
  }
  h->workers = calloc((size_t)o->threads, sizeof *h->workers);
  if (!h->workers) {
    st = st_fail(ST_ENOMEM, "listener: %d workers", o->threads);
    goto fail;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1u << 20);
  if (pthread_create(&h->reader, &attr, reader_main, h) != 0) {
    pthread_attr_destroy(&attr);
    st = st_fail(ST_EIO, "listener: cannot start its thread");
    goto fail;
  }
  h->reader_started = 1;
  for (int i = 0; i < o->threads; i++) {
    if (pthread_create(&h->workers[i], &attr, worker_main, h) != 0) break;
    h->n_workers++;
  }
  pthread_attr_destroy(&attr);
  if (h->n_workers == 0) {
    capture_http_stop(h);
    return st_fail(ST_EIO, "listener: cannot start worker threads");
  }
  *out = h;
  return ST_OK;
fail:
  if (h->listen_fd >= 0) close(h->listen_fd);
  if (h->wake[0] >= 0) close(h->wake[0]), close(h->wake[1]);
  free(h->workers);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  free(h);
  return st;
}

int capture_http_port(const capture_http *h) { return h->port; }

void capture_http_stop(capture_http *h) {
  if (!h) return;
  atomic_store(&h->stopping, 2); /* writes fail from now on; no connection is kept */
  pthread_mutex_lock(&h->mu);
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  wake_reader(h);
  if (h->reader_started) pthread_join(h->reader, NULL);
  for (int i = 0; i < h->n_workers; i++) pthread_join(h->workers[i], NULL);
  for (capture_conn *c = h->ready_head, *next; c; c = next) { /* queued, never handled */
    next = c->next;
    conn_free(c);
  }
  for (capture_conn *c = h->back, *next; c; c = next) {
    next = c->next;
    conn_free(c);
  }
  close(h->listen_fd);
  close(h->wake[0]);
  close(h->wake[1]);
  for (int i = 0; i < 256; i++)
    for (addr_count *c = h->counts[i], *next; c; c = next) {
      next = c->next;
      free(c);
    }
  free(h->workers);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  free(h);
}
