/*
** capture_sse.c — the incremental SSE parser (rules and byte accounting in capture_sse.h).
**
** The parser scans each chunk for line terminators and handles whole lines straight from the
** caller's buffer; only a line cut by a chunk boundary is copied into p->line. That keeps the
** common case (servers write whole events per chunk) at one pass over the bytes with no copy
** except the data fields themselves, which the callback needs joined anyway.
*/
#include "capture_sse.h"

#include <stdlib.h>
#include <string.h>

static int text_append(capture_sse_text *t, const char *s, size_t n) {
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 128;
    while (cap < t->len + n + 1) cap *= 2;
    char *p = realloc(t->p, cap);
    if (!p) return -1;
    t->p = p;
    t->cap = cap;
  }
  if (n) memcpy(t->p + t->len, s, n);
  t->len += n;
  t->p[t->len] = 0;
  return 0;
}

void capture_sse_init(capture_sse_parser *p, capture_sse_callback on_event, void *user) {
  memset(p, 0, sizeof *p);
  p->on_event = on_event;
  p->user = user;
}

void capture_sse_free(capture_sse_parser *p) {
  free(p->line.p);
  free(p->event.p);
  free(p->data.p);
  memset(p, 0, sizeof *p);
}

int capture_sse_pending(const capture_sse_parser *p) {
  return p->line.len > 0 || p->has_data || p->event.len > 0;
}

/* One complete line (terminator excluded); end = stream offset just past its terminator. */
static int process_line(capture_sse_parser *p, const char *line, size_t len, size_t end) {
  if (len == 0) {
    int rc = 0;
    if (p->has_data) {
      size_t data_len = p->data.len;
      if (data_len > 0 && p->data.p[data_len - 1] == '\n') data_len--; /* the last join LF */
      if (p->data.p) p->data.p[data_len] = 0;
      if (p->on_event)
        rc = p->on_event(p->user, p->event.len ? p->event.p : NULL, p->event.len,
                         p->data.p ? p->data.p : "", data_len, p->block_start,
                         end - p->block_start);
      p->block_start = end;
    }
    p->event.len = 0;
    p->data.len = 0;
    p->has_data = 0;
    return rc;
  }
  if (line[0] == ':') return 0; /* comment */
  const char *colon = memchr(line, ':', len);
  size_t name_len = colon ? (size_t)(colon - line) : len;
  const char *value = colon ? colon + 1 : line + len;
  size_t value_len = (size_t)(line + len - value);
  if (value_len > 0 && value[0] == ' ') {
    value++;
    value_len--;
  }
  if (name_len == 5 && !memcmp(line, "event", 5)) {
    p->event.len = 0;
    return text_append(&p->event, value, value_len);
  }
  if (name_len == 4 && !memcmp(line, "data", 4)) {
    p->has_data = 1;
    if (text_append(&p->data, value, value_len) < 0) return -1;
    return text_append(&p->data, "\n", 1);
  }
  return 0; /* id, retry and unknown fields are ignored */
}

static int feed_lines(capture_sse_parser *p, const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (p->after_cr) {
      p->after_cr = 0;
      if (s[i] == '\n') { /* second half of a CRLF split across chunks */
        i++;
        p->consumed++;
        continue;
      }
    }
    size_t j = i;
    while (j < n && s[j] != '\n' && s[j] != '\r') j++;
    if (j == n) { /* unfinished line: keep it for the next chunk */
      if (text_append(&p->line, s + i, n - i) < 0) return -1;
      p->consumed += n - i;
      return 0;
    }
    size_t term = 1;
    if (s[j] == '\r') {
      if (j + 1 < n) {
        if (s[j + 1] == '\n') term = 2;
      } else {
        p->after_cr = 1;
      }
    }
    p->consumed += j - i + term;
    int rc;
    if (p->line.len > 0) {
      if (text_append(&p->line, s + i, j - i) < 0) return -1;
      rc = process_line(p, p->line.p, p->line.len, p->consumed);
      p->line.len = 0;
    } else {
      rc = process_line(p, s + i, j - i, p->consumed);
    }
    if (rc < 0) return -1;
    i = j + term;
  }
  return 0;
}

int capture_sse_feed(capture_sse_parser *p, const char *s, size_t n) {
  static const char bom[3] = {'\xEF', '\xBB', '\xBF'};
  while (p->bom_state < 3 && n > 0) {
    if (s[0] == bom[p->bom_state]) { /* skip BOM bytes (they stay counted in offsets) */
      p->bom_state++;
      p->consumed++;
      s++;
      n--;
      continue;
    }
    /* Not a BOM after all: the bytes skipped so far are ordinary text. */
    int matched = p->bom_state;
    p->bom_state = 3;
    if (matched > 0) {
      p->consumed -= (size_t)matched;
      if (feed_lines(p, bom, (size_t)matched) < 0) return -1;
    }
  }
  if (n == 0) return 0;
  return feed_lines(p, s, n);
}
