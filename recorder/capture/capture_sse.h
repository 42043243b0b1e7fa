/*
** capture_sse.h — an incremental server-sent-events parser (WHATWG "event stream" rules).
**
** The proxy receives a stream from libcurl in chunks of arbitrary boundaries: an event can be
** split across chunks, a chunk can hold several events, a CRLF can be split between two chunks.
** The relay forwards every chunk unchanged first and then feeds the same bytes here; the parser
** keeps only the unfinished line and the fields of the unfinished event, and calls back once per
** dispatched event with its type, joined data and where its bytes sit in the stream.
**
** Rules implemented: lines end in CRLF, LF or CR; a leading UTF-8 BOM is skipped; a line
** starting with ':' is a comment; "name: value" with one leading space stripped from the value;
** a line without ':' is a field with an empty value; several data lines join with '\n'; a blank
** line dispatches the event if any data line was seen (else the fields are dropped); "id" and
** "retry" are accepted and ignored; an unfinished event at end of stream is not dispatched.
**
** Byte accounting: the stream is cut into blocks, each ending with the blank line that dispatched
** an event (comments and data-less field groups before an event belong to that event's block),
** so the blocks of all dispatched events tile the stream from offset 0 to the end of the last
** dispatch. With a CRLF split across chunks, the LF lands in the next block.
**
** Self-contained (no other sparsetrace header) so that tests and tools can use it alone.
*/
#ifndef ST_CAPTURE_SSE_H
#define ST_CAPTURE_SSE_H

#include <stddef.h>

/* event: the "event" field (NULL, 0 when absent); data: joined data lines (NUL-terminated,
** may contain NULs); offset/length: the event's block in the stream. Pointers are valid only
** during the call. Return 0 to go on, -1 to make capture_sse_feed fail. */
typedef int (*capture_sse_callback)(void *user, const char *event, size_t event_len,
                                    const char *data, size_t data_len, size_t offset,
                                    size_t length);

typedef struct capture_sse_text {
  char *p;
  size_t len, cap;
} capture_sse_text;

typedef struct capture_sse_parser {
  capture_sse_callback on_event;
  void *user;
  size_t consumed;       /* bytes fed so far */
  size_t block_start;    /* offset of the first byte not yet part of a dispatched block */
  int after_cr;          /* previous byte ended a line with CR; an LF now is its partner */
  int bom_state;         /* 0..2: BOM bytes matched at stream start; 3: done */
  capture_sse_text line; /* unfinished line */
  capture_sse_text event;
  capture_sse_text data;
  int has_data;
} capture_sse_parser;

void capture_sse_init(capture_sse_parser *p, capture_sse_callback on_event, void *user);
/* Feeds the next n bytes. Returns 0, or -1 when out of memory or a callback returned -1 (the
** parser must then not be fed again). */
int capture_sse_feed(capture_sse_parser *p, const char *bytes, size_t n);
/* 1 when bytes have arrived since the last dispatch that do not form a complete event yet
** (an unfinished line or fields of an undispatched event). */
int capture_sse_pending(const capture_sse_parser *p);
void capture_sse_free(capture_sse_parser *p);

#endif
