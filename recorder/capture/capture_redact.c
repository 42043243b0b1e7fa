/*
** capture_redact.c — keeping credentials out of everything the proxy writes.
**
** The proxy must forward credentials upstream (the client's key is what authenticates it) and
** must never write them anywhere: not the store, not the log, not an error message. Two
** mechanisms do that, and everything written goes through both:
**
**   1. By name. Headers whose name says "credential" (Authorization, Proxy-Authorization,
**      x-api-key, api-key, anything ending in -key / _key or containing auth, token, secret,
**      password, cookie, session, credential) are recorded with the value "[redacted]"; query
**      parameters with secret-looking names (key, api_key, access_token, sig, ...) likewise.
**      The rules are deliberately broad: losing an idempotency-key from a record costs nothing,
**      leaking a key costs a rotation.
**
**      JSON request bodies are scanned the same way: a string member whose name has a
**      credential word in it ("api_key", "key", "token", "secret", "password", "authorization",
**      "client_secret", "accessToken", ...; capture_field_is_secret) is a credential, and so is a
**      secret-named field of an application/x-www-form-urlencoded body.
**
**   2. By value. Every redacted value, and the credential part of it ("Bearer X" -> X, the
**      decoded "user:password" of "Basic X" and the password alone, each cookie value), is
**      remembered for the duration of one exchange, in each of the spellings an upstream may
**      echo it back in: as sent, %-decoded (when it holds %XX or '+'), %-encoded (upper- and
**      lower-case hex), base64, and JSON-escaped. Before anything is written,
**      bodies are masked in place with '*' (same length, so the byte offsets of SSE events stay
**      valid) and text (error messages, derived JSON, header values) has the values replaced by
**      "[redacted]". This catches an upstream that echoes the key back ("invalid key sk-...")
**      and curl messages that might quote a URL. Values shorter than CAPTURE_SECRET_MIN bytes are
**      not searched for, so that a one-letter cookie cannot shred a whole body.
**
** The upstream URL the user gives may hold user:password@; it is shown and recorded without it.
*/
#define _GNU_SOURCE /* memmem */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "capture_internal.h"

static int contains_ci(const char *s, size_t len, const char *needle) {
  size_t n = strlen(needle);
  for (size_t i = 0; i + n <= len; i++)
    if (!strncasecmp(s + i, needle, n)) return 1;
  return 0;
}

int capture_header_is_secret(const char *name) {
  size_t len = strlen(name);
  static const char *const words[] = {"auth", "token", "secret", "password", "passwd", "cookie",
                                      "session", "credential", "api-key", "api_key", "apikey"};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (contains_ci(name, len, words[i])) return 1;
  if (!strcasecmp(name, "key")) return 1;
  if (len >= 4 && (!strcasecmp(name + len - 4, "-key") || !strcasecmp(name + len - 4, "_key")))
    return 1;
  return 0;
}

int capture_query_param_is_secret(const char *name, size_t len) {
  static const char *const exact[] = {"key", "code", "sig", "signature", "pwd"};
  for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
    if (len == strlen(exact[i]) && !strncasecmp(name, exact[i], len)) return 1;
  static const char *const words[] = {"key", "token", "secret", "auth", "pass", "session",
                                      "credential"};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (contains_ci(name, len, words[i])) return 1;
  return 0;
}

/* Remembers exactly these bytes (no variants). */
static int add_exact(capture_secrets *s, const char *value, size_t len) {
  if (len == 0) return 0;
  for (size_t i = 0; i < s->n; i++)
    if (strlen(s->values[i]) == len && !memcmp(s->values[i], value, len)) return 0;
  if (memchr(value, 0, len)) return 0; /* cannot be searched for as a string; never in text */
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 16;
    char **v = realloc(s->values, cap * sizeof *v);
    if (!v) return -1;
    s->values = v;
    s->cap = cap;
  }
  char *copy = strndup(value, len);
  if (!copy) return -1;
  s->values[s->n++] = copy;
  return 0;
}

/* Adds a malloc'd variant (NULL: out of memory) and wipes and frees it. */
static int add_owned(capture_secrets *s, char *v, size_t len) {
  if (!v) return -1;
  int rc = add_exact(s, v, len);
  memset(v, 0, len);
  free(v);
  return rc;
}

static int hexval(int c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* %XX (and, with plus, '+' as a space) decoded into a new string; *out_len its length. */
static char *pct_decode(const char *p, size_t n, int plus, size_t *out_len) {
  char *out = malloc(n + 1), *o = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n; i++) {
    int hi, lo;
    if (p[i] == '%' && i + 2 < n && (hi = hexval((unsigned char)p[i + 1])) >= 0 &&
        (lo = hexval((unsigned char)p[i + 2])) >= 0) {
      *o++ = (char)(hi * 16 + lo);
      i += 2;
    } else {
      *o++ = plus && p[i] == '+' ? ' ' : p[i];
    }
  }
  *o = 0;
  *out_len = (size_t)(o - out);
  return out;
}

/* Everything but RFC 3986 unreserved characters as %XX. */
static char *pct_encode(const char *p, size_t n, int lower, size_t *out_len) {
  const char *hex = lower ? "0123456789abcdef" : "0123456789ABCDEF";
  char *out = malloc(3 * n + 1), *o = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      *o++ = (char)c;
    } else {
      *o++ = '%';
      *o++ = hex[c >> 4];
      *o++ = hex[c & 15];
    }
  }
  *o = 0;
  *out_len = (size_t)(o - out);
  return out;
}

/* The value as it appears inside a JSON string (jansson's escaping, optionally of '/' too). */
static int add_json_escaped(capture_secrets *s, const char *p, size_t n, size_t flags) {
  json_t *str = json_stringn(p, n);
  if (!str) return 0; /* not UTF-8: no JSON text holds it as a string */
  char *text = json_dumps(str, JSON_ENCODE_ANY | flags);
  json_decref(str);
  if (!text) return -1;
  size_t len = strlen(text);
  int rc = len >= 2 ? add_exact(s, text + 1, len - 2) : 0; /* without the quotes */
  memset(text, 0, len);
  free(text);
  return rc;
}

/* One spelling of a secret and those derived from it by encoding. */
static int add_encodings(capture_secrets *s, const char *p, size_t n) {
  size_t len;
  char *v;
  if (add_exact(s, p, n) < 0) return -1;
  v = pct_encode(p, n, 0, &len);
  if (add_owned(s, v, len) < 0) return -1;
  v = pct_encode(p, n, 1, &len);
  if (add_owned(s, v, len) < 0) return -1;
  v = capture_base64(p, n);
  if (add_owned(s, v, v ? strlen(v) : 0) < 0) return -1;
  if (add_json_escaped(s, p, n, 0) < 0 || add_json_escaped(s, p, n, JSON_ESCAPE_SLASH) < 0 ||
      add_json_escaped(s, p, n, JSON_ENSURE_ASCII) < 0)
    return -1;
  return 0;
}

int capture_secrets_add(capture_secrets *s, const char *value, size_t len) {
  while (len > 0 && isspace((unsigned char)value[0])) value++, len--;
  while (len > 0 && isspace((unsigned char)value[len - 1])) len--;
  if (len == 0) return 0;
  if (add_encodings(s, value, len) < 0) return -1;
  /* A value that arrived %-encoded (a query parameter, a form field, a URL's userinfo) is also
  ** the secret in its decoded spelling, which is what an upstream quoting it back would show. */
  for (int plus = 0; plus < 2; plus++) {
    if (!memchr(value, plus ? '+' : '%', len)) continue;
    size_t dlen;
    char *d = pct_decode(value, len, plus, &dlen);
    if (!d) return -1;
    int rc = dlen != len || memcmp(d, value, len) ? add_encodings(s, d, dlen) : 0;
    memset(d, 0, dlen);
    free(d);
    if (rc < 0) return -1;
  }
  return 0;
}

/* Standard base64 decoded (padding optional); NULL when not base64. */
static char *base64_decode(const char *p, size_t n, size_t *out_len) {
  char *out = malloc(n / 4 * 3 + 4), *o = out;
  if (!out) return NULL;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    int v = c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26
            : c >= '0' && c <= '9' ? c - '0' + 52 : c == '+' ? 62 : c == '/' ? 63 : -1;
    if (c == '=') break;
    if (v < 0) {
      free(out);
      return NULL;
    }
    acc = acc << 6 | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      *o++ = (char)(acc >> bits & 0xFF);
    }
  }
  *o = 0;
  *out_len = (size_t)(o - out);
  return out;
}

int capture_secrets_add_header(capture_secrets *s, const char *name, const char *value) {
  if (!capture_header_is_secret(name)) return 0;
  size_t len = strlen(value);
  if (capture_secrets_add(s, value, len) < 0) return -1;
  /* "Bearer sk-...", "Basic dXNlcjpwYXNz": the credential after the scheme word. */
  const char *space = memchr(value, ' ', len);
  if (space && capture_secrets_add(s, space + 1, len - (size_t)(space + 1 - value)) < 0) return -1;
  /* "Basic base64(user:password)": the decoded pair and the password alone, which an upstream
  ** refusing it may well quote back in plain text. */
  if (space && space - value == 5 && !strncasecmp(value, "basic", 5)) {
    const char *b = space + 1;
    while (*b == ' ') b++;
    size_t dlen = 0;
    char *pair = base64_decode(b, strlen(b), &dlen);
    if (pair) {
      const char *colon = memchr(pair, ':', dlen);
      int rc = capture_secrets_add(s, pair, dlen);
      if (!rc && colon) rc = capture_secrets_add(s, colon + 1, dlen - (size_t)(colon + 1 - pair));
      memset(pair, 0, dlen);
      free(pair);
      if (rc < 0) return -1;
    }
  }
  /* Cookie lists "a=1; b=2": every value on its own. */
  if (contains_ci(name, strlen(name), "cookie")) {
    const char *p = value;
    while (*p) {
      const char *end = strchr(p, ';');
      if (!end) end = p + strlen(p);
      const char *eq = memchr(p, '=', (size_t)(end - p));
      if (eq && capture_secrets_add(s, eq + 1, (size_t)(end - eq - 1)) < 0) return -1;
      p = *end ? end + 1 : end;
    }
  }
  return 0;
}

int capture_field_is_secret(const char *name, size_t len) {
  /* Words of the name, split at '_', '-', '.', ' ' and lower-to-upper case changes
  ** ("clientSecret" -> client, secret), compared whole: "max_tokens" and "author" are not
  ** credentials, "api_key", "accessToken" and "Authorization" are. */
  static const char *const words[] = {"key", "apikey", "token", "secret", "password", "passwd",
                                      "pwd", "passphrase", "authorization", "auth", "credential",
                                      "credentials", "cookie", "bearer"};
  size_t i = 0;
  while (i < len) {
    while (i < len && !isalnum((unsigned char)name[i])) i++;
    size_t start = i;
    while (i < len && isalnum((unsigned char)name[i])) {
      i++;
      if (i < len && islower((unsigned char)name[i - 1]) && isupper((unsigned char)name[i])) break;
    }
    size_t n = i - start;
    for (size_t k = 0; n && k < sizeof words / sizeof words[0]; k++)
      if (strlen(words[k]) == n && !strncasecmp(name + start, words[k], n)) return 1;
  }
  return 0;
}

/* The end of the JSON string token starting at p[0] == '"' (index of the closing quote), or n. */
static size_t json_string_end(const char *p, size_t n) {
  size_t i = 1;
  while (i < n && p[i] != '"') i += p[i] == '\\' ? 2 : 1;
  return i < n ? i : n;
}

/* A lexical scan (no parse, no allocation per token): every "name": "value" pair whose name
** capture_field_is_secret() accepts, at any depth. The value is remembered as written (JSON
** escapes included) and unescaped. */
static int add_json_fields(capture_secrets *s, const char *p, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (p[i] != '"') {
      i++;
      continue;
    }
    size_t end = json_string_end(p + i, n - i) + i;
    if (end >= n) break;
    size_t name = i + 1, name_len = end - name;
    size_t j = end + 1;
    while (j < n && isspace((unsigned char)p[j])) j++;
    if (j >= n || p[j] != ':') { /* a string that is not a member name */
      i = end + 1;
      continue;
    }
    j++;
    while (j < n && isspace((unsigned char)p[j])) j++;
    if (j < n && p[j] == '"' && capture_field_is_secret(p + name, name_len)) {
      size_t vend = json_string_end(p + j, n - j) + j;
      if (vend >= n) break;
      const char *v = p + j + 1;
      size_t vlen = vend - j - 1;
      if (capture_secrets_add(s, v, vlen) < 0) return -1;
      if (memchr(v, '\\', vlen)) { /* and as the string it denotes */
        char *quoted = strndup(p + j, vlen + 2);
        json_t *str = quoted ? json_loads(quoted, JSON_DECODE_ANY, NULL) : NULL;
        int rc = quoted ? 0 : -1;
        if (json_is_string(str))
          rc = capture_secrets_add(s, json_string_value(str), json_string_length(str));
        if (quoted) memset(quoted, 0, vlen + 2);
        free(quoted);
        json_decref(str);
        if (rc < 0) return -1;
      }
      i = vend + 1;
      continue;
    }
    i = j; /* the value (or the next token) */
  }
  return 0;
}

/* name=value&... pairs whose name is secret-looking (query rules): values remembered. */
static int add_form_fields(capture_secrets *s, const char *p, size_t n) {
  size_t i = 0;
  while (i < n) {
    const char *amp = memchr(p + i, '&', n - i);
    size_t end = amp ? (size_t)(amp - p) : n;
    const char *eq = memchr(p + i, '=', end - i);
    if (eq && (capture_query_param_is_secret(p + i, (size_t)(eq - p - i)) ||
               capture_field_is_secret(p + i, (size_t)(eq - p - i))) &&
        capture_secrets_add(s, eq + 1, (size_t)(p + end - eq - 1)) < 0)
      return -1;
    i = end + 1;
  }
  return 0;
}

int capture_secrets_add_body(capture_secrets *s, const char *content_type, const char *body,
                             size_t len) {
  if (!body || len == 0) return 0;
  size_t i = 0;
  while (i < len && isspace((unsigned char)body[i])) i++;
  if (i < len && (body[i] == '{' || body[i] == '['))
    return add_json_fields(s, body, len);
  /* A form: said so, or text that can only be one (name=value, printable, no spaces; clients
  ** are not always right about their Content-Type). */
  int declared = content_type && !strncasecmp(content_type, "application/x-www-form-urlencoded", 33);
  int looks = 1, has_eq = 0;
  for (size_t k = 0; k < len && looks; k++) {
    unsigned char c = (unsigned char)body[k];
    if (c == '=') has_eq = 1;
    else if (isspace(c) || !isprint(c)) looks = 0;
  }
  if (declared || (looks && has_eq)) return add_form_fields(s, body, len);
  if (content_type && strcasestr(content_type, "json")) return add_json_fields(s, body, len);
  return 0;
}

char *capture_redact_query(capture_secrets *s, const char *query, int *oom) {
  *oom = 0;
  if (!query) return NULL;
  st_buf out = {0};
  const char *p = query;
  int fail = 0;
  for (;;) {
    const char *end = strchr(p, '&');
    if (!end) end = p + strlen(p);
    const char *eq = memchr(p, '=', (size_t)(end - p));
    if (eq && capture_query_param_is_secret(p, (size_t)(eq - p))) {
      fail |= st_buf_add(&out, p, (size_t)(eq - p) + 1);
      fail |= st_buf_str(&out, CAPTURE_REDACTED);
      fail |= capture_secrets_add(s, eq + 1, (size_t)(end - eq - 1));
    } else {
      fail |= st_buf_add(&out, p, (size_t)(end - p));
    }
    if (!*end) break;
    fail |= st_buf_add(&out, "&", 1);
    p = end + 1;
  }
  if (fail) {
    st_buf_free(&out);
    *oom = 1;
    return NULL;
  }
  return st_buf_take(&out, NULL);
}

size_t capture_secrets_mask(const capture_secrets *s, char *buf, size_t len) {
  size_t count = 0;
  if (!buf) return 0;
  for (size_t i = 0; i < s->n; i++) {
    size_t n = strlen(s->values[i]);
    if (n < CAPTURE_SECRET_MIN) continue;
    char *p = buf, *end = buf + len;
    while ((size_t)(end - p) >= n) {
      char *hit = memmem(p, (size_t)(end - p), s->values[i], n);
      if (!hit) break;
      memset(hit, '*', n);
      count++;
      p = hit + n;
    }
  }
  return count;
}

char *capture_secrets_scrub(const capture_secrets *s, const char *text) {
  if (!text) return NULL;
  st_buf out = {0};
  if (st_buf_str(&out, text)) return NULL;
  if (!out.data) return strdup("");
  for (size_t i = 0; s && i < s->n; i++) {
    size_t n = strlen(s->values[i]);
    if (n < CAPTURE_SECRET_MIN) continue;
    char *hit;
    size_t from = 0;
    while (out.len - from >= n && (hit = memmem(out.data + from, out.len - from, s->values[i], n))) {
      size_t at = (size_t)(hit - out.data), rlen = strlen(CAPTURE_REDACTED);
      st_buf next = {0};
      if (st_buf_add(&next, out.data, at) || st_buf_str(&next, CAPTURE_REDACTED) ||
          st_buf_add(&next, out.data + at + n, out.len - at - n)) {
        st_buf_free(&next);
        st_buf_free(&out);
        return NULL;
      }
      st_buf_free(&out);
      out = next;
      from = at + rlen;
    }
  }
  return st_buf_take(&out, NULL);
}

void capture_secrets_free(capture_secrets *s) {
  for (size_t i = 0; i < s->n; i++) {
    /* Wipe before freeing: a credential should not linger in freed heap memory either. */
    volatile char *v = s->values[i];
    for (size_t j = 0; v[j]; j++) v[j] = 0;
    free(s->values[i]);
  }
  free(s->values);
  memset(s, 0, sizeof *s);
}

char *capture_url_without_credentials(const char *url) {
  const char *scheme_end = strstr(url, "://");
  const char *authority = scheme_end ? scheme_end + 3 : url;
  size_t auth_len = strcspn(authority, "/?#");
  const char *at = NULL;
  for (size_t i = 0; i < auth_len; i++)
    if (authority[i] == '@') at = authority + i;
  const char *rest = at ? at + 1 : authority;
  size_t prefix = (size_t)(authority - url);
  /* The query part may hold a key (?key=..., ?api_key=...): its secret values are redacted. */
  size_t path_len = strcspn(rest, "?#");
  const char *query = rest[path_len] == '?' ? rest + path_len + 1 : NULL;
  char *redacted = NULL;
  if (query) {
    char *q = strndup(query, strcspn(query, "#"));
    capture_secrets tmp = {0};
    int oom = 0;
    redacted = q ? capture_redact_query(&tmp, q, &oom) : NULL;
    capture_secrets_free(&tmp);
    free(q);
    if (!redacted) return NULL;
  }
  char *out = NULL;
  if (asprintf(&out, "%.*s%.*s%s%s", (int)prefix, url, (int)path_len, rest, query ? "?" : "",
               query ? redacted : "") < 0)
    out = NULL;
  free(redacted);
  return out;
}
