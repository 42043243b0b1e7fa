/*
** pyjson.c — see pyjson.h. The float formatting follows CPython's float_repr_style "short":
** the shortest digit string that reads back to the same double, placed in fixed notation when
** the decimal point position is in (-4, 16], else in exponent notation with a signed two-digit
** (at least) exponent.
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/pyjson.h"

/* ---------------------------------------------------------------- strings */

static void hex4(st_buf *out, unsigned v) {
  char b[8];
  snprintf(b, sizeof b, "\\u%04x", v & 0xFFFFu);
  st_buf_add(out, b, 6);
}

void st_pyjson_string(st_buf *out, const char *s, size_t n, int ensure_ascii) {
  const unsigned char *p = (const unsigned char *)s;
  st_buf_add(out, "\"", 1);
  size_t run = 0; /* start of the pending run of bytes copied verbatim */
  for (size_t i = 0; i < n;) {
    unsigned c = p[i];
    const char *esc = NULL;
    switch (c) {
    case '"': esc = "\\\""; break;
    case '\\': esc = "\\\\"; break;
    case '\n': esc = "\\n"; break;
    case '\r': esc = "\\r"; break;
    case '\t': esc = "\\t"; break;
    case '\b': esc = "\\b"; break;
    case '\f': esc = "\\f"; break;
    }
    int plain = !esc && c >= 0x20 && (!ensure_ascii || c < 0x7F);
    if (plain) {
      i++;
      continue;
    }
    st_buf_add(out, s + run, i - run);
    if (esc) {
      st_buf_str(out, esc);
      i++;
    } else if (c < 0x80) {
      hex4(out, c);
      i++;
    } else {
      /* ensure_ascii: one \uXXXX per UTF-16 unit (surrogate pairs above U+FFFF). */
      unsigned cp;
      size_t adv;
      if (c < 0xE0) cp = ((c & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu), adv = 2;
      else if (c < 0xF0) cp = ((c & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu), adv = 3;
      else cp = ((c & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu), adv = 4;
      if (adv > n - i) adv = n - i; /* truncated input: jansson never gives us one */
      if (cp >= 0x10000) {
        cp -= 0x10000;
        hex4(out, 0xD800 + (cp >> 10));
        hex4(out, 0xDC00 + (cp & 0x3FF));
      } else {
        hex4(out, cp);
      }
      i += adv;
    }
    run = i;
  }
  st_buf_add(out, s + run, n - run);
  st_buf_add(out, "\"", 1);
}

/* ---------------------------------------------------------------- numbers */

void st_pyjson_float(st_buf *out, double d) {
  if (isnan(d) || isinf(d) || d == 0) {
    st_buf_str(out, isnan(d) ? "NaN" : isinf(d) ? (d < 0 ? "-Infinity" : "Infinity")
                                      : signbit(d) ? "-0.0" : "0.0");
    return;
  }
  /* Shortest %.{p}e that reads back exactly. */
  char buf[40];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (strtod(buf, NULL) == d) break;
  }
  /* buf: [-]D[.DDDD]e[+-]XX → digits and decimal exponent. */
  const char *q = buf;
  int neg = 0;
  if (*q == '-') neg = 1, q++;
  char digits[24];
  int nd = 0;
  for (; *q && *q != 'e'; q++)
    if (*q != '.') digits[nd++] = *q;
  int exp10 = atoi(q + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--; /* "%.*e" may pad with zeros */
  digits[nd] = 0;
  int decpt = exp10 + 1; /* value = 0.DIGITS × 10^decpt */
  if (neg) st_buf_add(out, "-", 1);
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      st_buf_add(out, "0.", 2);
      for (int i = 0; i < -decpt; i++) st_buf_add(out, "0", 1);
      st_buf_add(out, digits, (size_t)nd);
    } else if (decpt >= nd) {
      st_buf_add(out, digits, (size_t)nd);
      for (int i = nd; i < decpt; i++) st_buf_add(out, "0", 1);
      st_buf_add(out, ".0", 2);
    } else {
      st_buf_add(out, digits, (size_t)decpt);
      st_buf_add(out, ".", 1);
      st_buf_add(out, digits + decpt, (size_t)(nd - decpt));
    }
  } else {
    st_buf_add(out, digits, 1);
    if (nd > 1) {
      st_buf_add(out, ".", 1);
      st_buf_add(out, digits + 1, (size_t)(nd - 1));
    }
    st_buf_printf(out, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  }
}

/* ---------------------------------------------------------------- values */

void st_pyjson_dump(st_buf *out, const json_t *v, int ensure_ascii) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: {
    const char *key;
    json_t *val;
    int first = 1;
    st_buf_add(out, "{", 1);
    json_object_foreach((json_t *)v, key, val) {
      if (!first) st_buf_add(out, ", ", 2);
      first = 0;
      st_pyjson_string(out, key, strlen(key), ensure_ascii);
      st_buf_add(out, ": ", 2);
      st_pyjson_dump(out, val, ensure_ascii);
    }
    st_buf_add(out, "}", 1);
    break;
  }
  case JSON_ARRAY: {
    size_t i;
    json_t *val;
    st_buf_add(out, "[", 1);
    json_array_foreach(v, i, val) {
      if (i) st_buf_add(out, ", ", 2);
      st_pyjson_dump(out, val, ensure_ascii);
    }
    st_buf_add(out, "]", 1);
    break;
  }
  case JSON_STRING:
    st_pyjson_string(out, json_string_value(v), json_string_length(v), ensure_ascii);
    break;
  case JSON_INTEGER: st_buf_printf(out, "%lld", (long long)json_integer_value(v)); break;
  case JSON_REAL: st_pyjson_float(out, json_real_value(v)); break;
  case JSON_TRUE: st_buf_str(out, "true"); break;
  case JSON_FALSE: st_buf_str(out, "false"); break;
  case JSON_NULL: st_buf_str(out, "null"); break;
  }
}
