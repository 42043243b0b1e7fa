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
**   2. By value. Every redacted value, and the credential part of it ("Bearer X" -> X, each
**      cookie value), is remembered for the duration of one exchange. Before anything is written,
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

int capture_secrets_add(capture_secrets *s, const char *value, size_t len) {
  while (len > 0 && isspace((unsigned char)value[0])) value++, len--;
  while (len > 0 && isspace((unsigned char)value[len - 1])) len--;
  if (len == 0) return 0;
  for (size_t i = 0; i < s->n; i++)
    if (strlen(s->values[i]) == len && !memcmp(s->values[i], value, len)) return 0;
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 8;
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

int capture_secrets_add_header(capture_secrets *s, const char *name, const char *value) {
  if (!capture_header_is_secret(name)) return 0;
  size_t len = strlen(value);
  if (capture_secrets_add(s, value, len) < 0) return -1;
  /* "Bearer sk-...", "Basic dXNlcjpwYXNz": the credential after the scheme word. */
  const char *space = memchr(value, ' ', len);
  if (space && capture_secrets_add(s, space + 1, len - (size_t)(space + 1 - value)) < 0) return -1;
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
  if (!at) return strdup(url);
  size_t prefix = (size_t)(authority - url);
  size_t rest = strlen(at + 1);
  char *out = malloc(prefix + rest + 1);
  if (!out) return NULL;
  memcpy(out, url, prefix);
  memcpy(out + prefix, at + 1, rest + 1);
  return out;
}
