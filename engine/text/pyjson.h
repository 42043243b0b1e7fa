/*
** pyjson.h — a growable text buffer, and JSON written exactly as CPython's json.dumps writes it.
**
** The DeepSeek-V4 prompt embeds tool schemas and tool-call argument values serialised by
** Python's `json.dumps(value, ensure_ascii=False)` (ENCODING-dsv4.md §1.8): separators ", " and
** ": ", keys in insertion order (jansson keeps it), non-ASCII raw, the seven short escapes, other
** C0 controls as \u00XX, "/" unescaped, floats as Python's repr (shortest round-trip digits;
** exponent form below 1e-4 and from 1e16: "1e-05", "1e+16"), integers as digits.
** Because jansson parses numbers into long long / double first, spellings are normalised the
** way a Python server's json.loads normalises them ("1.50" → 1.5, "1e3" → 1000.0). Integers
** beyond 64 bits are refused by jansson when the request is parsed.
*/
#ifndef ST_PYJSON_H
#define ST_PYJSON_H

#include <jansson.h>
#include <stddef.h>

#include "common/base.h"

/* Zero-initialise. Appends never fail loudly: the first allocation failure sets `failed` and
** later appends do nothing; check it (st_text_status) once at the end. data is NUL-terminated
** whenever len > 0. */
typedef struct st_text {
  char *data;
  size_t len, cap;
  int failed;
} st_text;

void st_text_add(st_text *t, const char *s, size_t n);
void st_text_str(st_text *t, const char *s);
void st_text_printf(st_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void st_text_free(st_text *t);
/* ST_OK, or ST_ENOMEM with a message naming `what` if an append failed. */
st_status st_text_status(const st_text *t, const char *what);
/* Hands the buffer to the caller (never NULL when status is OK: "" for empty); t is reset. */
char *st_text_take(st_text *t, size_t *len);

/* json.dumps(v, ensure_ascii=ensure_ascii) with default separators. */
void st_pyjson_dump(st_text *out, const json_t *v, int ensure_ascii);
/* One JSON string literal (with quotes) for n bytes of UTF-8. */
void st_pyjson_string(st_text *out, const char *s, size_t n, int ensure_ascii);
/* repr(float) — also what json.dumps writes for a float. */
void st_pyjson_float(st_text *out, double d);

#endif
