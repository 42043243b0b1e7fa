/*
** pyjson.h — JSON written exactly as CPython's json.dumps writes it, into an st_buf.
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
#include "common/buf.h"

/* json.dumps(v, ensure_ascii=ensure_ascii) with default separators. */
void st_pyjson_dump(st_buf *out, const json_t *v, int ensure_ascii);
/* One JSON string literal (with quotes) for n bytes of UTF-8. */
void st_pyjson_string(st_buf *out, const char *s, size_t n, int ensure_ascii);
/* repr(float) — also what json.dumps writes for a float. */
void st_pyjson_float(st_buf *out, double d);

#endif
