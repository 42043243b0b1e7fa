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

/* ---------------------------------------------------------------- text buffer */

static int text_reserve(st_text *t, size_t extra) {
  if (t->failed) return 0;
  if (t->len + extra + 1 <= t->cap) return 1;
  size_t cap = t->cap ? t->cap * 2 : 256;
  while (cap < t->len + extra + 1) cap *= 2;
  char *g = realloc(t->data, cap);
  if (!g) {
    t->failed = 1;
    return 0;
  }
  t->data = g;
  t->cap = cap;
  return 1;
}

void st_text_add(st_text *t, const char *s, size_t n) {
  if (!text_reserve(t, n)) return;
  if (n) memcpy(t->data + t->len, s, n);
  t->len += n;
  t->data[t->len] = 0;
}

void st_text_str(st_text *t, const char *s) { st_text_add(t, s, strlen(s)); }

void st_text_printf(st_text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !text_reserve(t, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(t->data + t->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  t->len += (size_t)n;
}

void st_text_free(st_text *t) {
  free(t->data);
  t->data = NULL;
  t->len = t->cap = 0;
  t->failed = 0;
}

st_status st_text_status(const st_text *t, const char *what) {
  return t->failed ? st_fail(ST_ENOMEM, "%s: out of memory", what) : ST_OK;
}

char *st_text_take(st_text *t, size_t *len) {
  if (!t->data) text_reserve(t, 0);
  char *d = t->data;
  if (d) d[t->len] = 0;
  if (len) *len = t->len;
  t->data = NULL;
  t->len = t->cap = 0;
  return d;
}

/* ---------------------------------------------------------------- strings */

static void hex4(st_text *out, unsigned v) {
  char b[8];
  snprintf(b, sizeof b, "\\u%04x", v & 0xFFFFu);
  st_text_add(out, b, 6);
}

void st_pyjson_string(st_text *out, const char *s, size_t n, int ensure_ascii) {
  const unsigned char *p = (const unsigned char *)s;
  st_text_add(out, "\"", 1);
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
    st_text_add(out, s + run, i - run);
    if (esc) {
      st_text_str(out, esc);
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
  st_text_add(out, s + run, n - run);
  st_text_add(out, "\"", 1);
}

/* ---------------------------------------------------------------- numbers */

void st_pyjson_float(st_text *out, double d) {
  if (isnan(d) || isinf(d) || d == 0) {
    st_text_str(out, isnan(d) ? "NaN" : isinf(d) ? (d < 0 ? "-Infinity" : "Infinity")
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
  if (neg) st_text_add(out, "-", 1);
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      st_text_add(out, "0.", 2);
      for (int i = 0; i < -decpt; i++) st_text_add(out, "0", 1);
      st_text_add(out, digits, (size_t)nd);
    } else if (decpt >= nd) {
      st_text_add(out, digits, (size_t)nd);
      for (int i = nd; i < decpt; i++) st_text_add(out, "0", 1);
      st_text_add(out, ".0", 2);
    } else {
      st_text_add(out, digits, (size_t)decpt);
      st_text_add(out, ".", 1);
      st_text_add(out, digits + decpt, (size_t)(nd - decpt));
    }
  } else {
    st_text_add(out, digits, 1);
    if (nd > 1) {
      st_text_add(out, ".", 1);
      st_text_add(out, digits + 1, (size_t)(nd - 1));
    }
    st_text_printf(out, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  }
}

/* ---------------------------------------------------------------- values */

void st_pyjson_dump(st_text *out, const json_t *v, int ensure_ascii) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: {
    const char *key;
    json_t *val;
    int first = 1;
    st_text_add(out, "{", 1);
    json_object_foreach((json_t *)v, key, val) {
      if (!first) st_text_add(out, ", ", 2);
      first = 0;
      st_pyjson_string(out, key, strlen(key), ensure_ascii);
      st_text_add(out, ": ", 2);
      st_pyjson_dump(out, val, ensure_ascii);
    }
    st_text_add(out, "}", 1);
    break;
  }
  case JSON_ARRAY: {
    size_t i;
    json_t *val;
    st_text_add(out, "[", 1);
    json_array_foreach(v, i, val) {
      if (i) st_text_add(out, ", ", 2);
      st_pyjson_dump(out, val, ensure_ascii);
    }
    st_text_add(out, "]", 1);
    break;
  }
  case JSON_STRING:
    st_pyjson_string(out, json_string_value(v), json_string_length(v), ensure_ascii);
    break;
  case JSON_INTEGER: st_text_printf(out, "%lld", (long long)json_integer_value(v)); break;
  case JSON_REAL: st_pyjson_float(out, json_real_value(v)); break;
  case JSON_TRUE: st_text_str(out, "true"); break;
  case JSON_FALSE: st_text_str(out, "false"); break;
  case JSON_NULL: st_text_str(out, "null"); break;
  }
}
