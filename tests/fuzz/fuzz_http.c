/*
** fuzz_http.c — the capture proxy's request reading (recorder/capture/capture_http.c): request
** line and header parsing, framing (Content-Length, chunked decoding, smuggling refusals), the
** head/body size limits and pipelined requests on one connection. The file is included so that
** its static parser and connection state machine (parse_head, take_body, advance) run exactly as
** the reader thread runs them, on a connection without a socket (fd -1: answers go nowhere);
** the input arrives in chunks whose sizes come from its first byte.
*/
#include "recorder/capture/capture_http.c"

#include "fuzz_util.h"

static void check_request(const capture_request *rq) {
  if (!rq->head_too_large && !rq->path) abort();
  if (rq->method[sizeof rq->method - 1] != 0) abort();
  for (size_t i = 0; i < rq->headers.n; i++)
    if (!rq->headers.items[i].name || !rq->headers.items[i].value) abort();
  if (rq->chunked && rq->content_length >= 0) abort();
  if (!rq->too_large && !rq->oom && !rq->chunked && rq->content_length >= 0 &&
      !rq->head_too_large && rq->body.len != (size_t)rq->content_length)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  unsigned seed = data[0];
  data++, size--;
  static capture_http h;
  static int ready;
  if (!ready) {
    capture_http_options_init(&h.o);
    h.o.max_head_bytes = 1024; /* small limits, so that the 431 and 413 paths are reached */
    h.o.max_body_bytes = 2048;
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    ready = 1;
  }
  capture_conn *c = calloc(1, sizeof *c);
  if (!c) abort();
  c->h = &h;
  c->fd = -1;
  c->state = C_HEAD;
  c->rq.content_length = -1;
  int64_t now = 0;
  size_t at = 0;
  int requests = 0;
  while (at < size && c->state != C_CLOSING) {
    size_t n = 1 + (seed % 300);
    seed = seed * 1103515245u + 12345u;
    seed ^= seed >> 16;
    if (n > size - at) n = size - at;
    if (st_buf_add(&c->in, data + at, n) != ST_OK) abort();
    at += n;
    while (c->state == C_HEAD || c->state == C_BODY) {
      if (!advance(&h, c, now)) break;
      /* dispatched: take it off the queue as a worker would, then keep the connection or not */
      if (h.ready_head != c || c->state != C_WORK) abort();
      h.ready_head = h.ready_tail = NULL;
      check_request(&c->rq);
      int keep = c->rq.keep_alive;
      request_reset(&c->rq);
      if (!keep || ++requests > 64) {
        c->state = C_CLOSING;
        break;
      }
      c->state = C_HEAD;
      c->idle = 1;
    }
  }
  request_reset(&c->rq);
  st_buf_free(&c->in);
  free(c);
  return 0;
}
