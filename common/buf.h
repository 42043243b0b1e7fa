/*
** buf.h — the one growable byte buffer every folder uses (after curl's lib/curlx/dynbuf.h).
**
** Zero-initialised (`st_buf b = {0};`) a buffer is empty and unbounded; st_buf_init gives it a
** maximum length. The bytes stay NUL-terminated after every successful append (data is NULL only
** before the first one), so text can be handed on as a C string; binary data may hold NULs.
**
** An append that cannot grow the buffer (out of memory, or the result would exceed the maximum)
** leaves the contents as they were, records why in `failed` and returns that status; every later
** append does nothing and returns it again, until st_buf_reset or st_buf_free. So a writer may
** append without checking and ask st_buf_status once at the end, or check each append, as suits
** it. Appends never touch the thread's error message (st_errmsg): st_buf_status writes one.
*/
#ifndef ST_BUF_H
#define ST_BUF_H

#include <stddef.h>

#include "common/base.h"

typedef struct st_buf {
  char *data;       /* NULL until the first append, then NUL-terminated; owned */
  size_t len;       /* bytes held, without the terminating NUL */
  size_t cap;       /* bytes allocated */
  size_t max;       /* largest len allowed; 0: no limit */
  st_status failed; /* ST_OK, or why the first failed append failed (ST_ENOMEM, ST_ETOOBIG) */
} st_buf;

/* An empty buffer that refuses to hold more than max bytes (0: no limit). */
void st_buf_init(st_buf *b, size_t max);

/* Append n bytes (n == 0 still allocates, so data becomes ""), a C string, or printf output. */
st_status st_buf_add(st_buf *b, const void *p, size_t n);
st_status st_buf_str(st_buf *b, const char *s);
st_status st_buf_printf(st_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Empties the buffer and clears `failed`; keeps the memory and the maximum. */
void st_buf_reset(st_buf *b);
/* Releases the memory; the buffer is empty again (the maximum is kept). */
void st_buf_free(st_buf *b);

/* Hands the bytes to the caller as a NUL-terminated malloc'd string ("" when empty) and its
** length; NULL (and the bytes freed) when an append failed or "" cannot be allocated. The
** buffer is empty afterwards, its maximum kept. */
char *st_buf_take(st_buf *b, size_t *len);

/* ST_OK, or the failure of an append with a message naming `what` ("render: out of memory"). */
st_status st_buf_status(const st_buf *b, const char *what);

#endif
