/* buf.c — see buf.h. Capacity doubles from 256 bytes; one byte is always kept for the NUL. */
#include "common/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for n more bytes and the NUL, or the reason there is none (recorded in b->failed). */
static st_status buf_grow(st_buf *b, size_t n) {
  if (b->failed) return b->failed;
  size_t max = b->max ? b->max : SIZE_MAX / 2;
  if (b->len > max || n > max - b->len) return b->failed = b->max ? ST_ETOOBIG : ST_ENOMEM;
  size_t need = b->len + n + 1;
  if (need <= b->cap) return ST_OK;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) cap *= 2; /* need <= SIZE_MAX / 2 + 1, so this cannot overflow */
  if (b->max && cap > b->max + 1) cap = b->max + 1;
  char *g = realloc(b->data, cap);
  if (!g) return b->failed = ST_ENOMEM;
  b->data = g;
  b->cap = cap;
  return ST_OK;
}

void st_buf_init(st_buf *b, size_t max) {
  memset(b, 0, sizeof *b);
  b->max = max;
}

st_status st_buf_add(st_buf *b, const void *p, size_t n) {
  st_status st = buf_grow(b, n);
  if (st) return st;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
  return ST_OK;
}

st_status st_buf_str(st_buf *b, const char *s) { return st_buf_add(b, s, strlen(s)); }

st_status st_buf_printf(st_buf *b, const char *fmt, ...) {
  if (b->failed) return b->failed;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return ST_EINVAL; /* a wide character it cannot convert: nothing appended */
  st_status st = buf_grow(b, (size_t)n);
  if (st) return st;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return ST_OK;
}

void st_buf_reset(st_buf *b) {
  b->len = 0;
  if (b->data) b->data[0] = 0;
  b->failed = ST_OK;
}

void st_buf_free(st_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
  b->failed = ST_OK;
}

char *st_buf_take(st_buf *b, size_t *len) {
  if (!b->data && !buf_grow(b, 0)) b->data[0] = 0;
  char *d = b->failed ? NULL : b->data;
  if (len) *len = d ? b->len : 0;
  if (!d) free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
  b->failed = ST_OK;
  return d;
}

st_status st_buf_status(const st_buf *b, const char *what) {
  if (b->failed == ST_ETOOBIG) return st_fail(ST_ETOOBIG, "%s: more than %zu bytes", what, b->max);
  return b->failed ? st_fail(b->failed, "%s: out of memory", what) : ST_OK;
}
