/*
** capture_upstream.c — the proxy's outgoing side: one libcurl easy transfer per exchange.
**
** Each worker thread runs its exchange's transfer synchronously (curl_easy_perform) and is
** handed the answer through three hooks: the response head once complete, body bytes as they
** arrive, and a poll (several times a second while data flows, about once a second when the
** upstream is silent) that lets the relay cancel the transfer when its client has gone or the
** proxy is stopping. Keeping the transfer on the worker's own stack makes backpressure free: a
** slow client blocks the body hook, which blocks curl, which stops reading the upstream socket.
**
** Connections to the upstream are kept alive per worker thread: each worker reuses one easy
** handle (curl_easy_reset keeps its connection cache), because libcurl does not support sharing
** a connection cache between concurrent threads (CURLSHOPT_SHARE(3); a shared one crashed under
** 16-core load). A CURLSH shares only what is safe to share across threads: the DNS cache and
** TLS sessions.
**
** What is deliberately not done: no overall timeout (a long generation is not an error); instead
** a connect timeout and an idle timeout measured from the last byte received. No redirects are
** followed (the client sees the 3xx, as it would directly). No content decoding: bytes are
** relayed as received; the relay asks for identity encoding so that what is recorded is
** plaintext. Chunked transfer coding is removed by curl and re-applied by the relay (it is
** hop-by-hop), so the body bytes are identical either way.
*/
#define _GNU_SOURCE
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "capture_internal.h"

struct capture_upstream {
  char *base;    /* as given up to its query, trailing '/' removed; may hold credentials: never
                    printed. Request paths are appended to it. */
  char *base_query; /* the upstream URL's own query string (may hold a key), or NULL: it goes
                       after the request path, before the client's query */
  char *display; /* base without credentials (in messages, followed by the request path) */
  char *proxy;   /* NULL: curl's default; "" none */
  int connect_timeout_ms, idle_timeout_ms;
  CURLSH *share;
  pthread_mutex_t locks[CURL_LOCK_DATA_LAST];
};

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *user) {
  capture_upstream *u = user;
  pthread_mutex_lock(&u->locks[data]);
}
static void share_unlock(CURL *h, curl_lock_data data, void *user) {
  capture_upstream *u = user;
  pthread_mutex_unlock(&u->locks[data]);
}

st_status capture_upstream_new(const capture_upstream_options *o, capture_upstream **out) {
  *out = NULL;
  const char *scheme_end = strstr(o->base_url, "://");
  if (!scheme_end || (strncasecmp(o->base_url, "http://", 7) && strncasecmp(o->base_url, "https://", 8)))
    return st_fail(ST_EINVAL, "upstream must be an http:// or https:// URL, got '%.*s...'",
                   scheme_end ? (int)(scheme_end - o->base_url) : 8, o->base_url);
  capture_upstream *u = calloc(1, sizeof *u);
  if (!u) return st_fail(ST_ENOMEM, "upstream");
  /* "http://h/api?key=K#x" -> base "http://h/api", base_query "key=K" (fragments are never
  ** sent). */
  size_t base_len = strcspn(o->base_url, "?#");
  u->base = strndup(o->base_url, base_len);
  if (o->base_url[base_len] == '?') {
    const char *q = o->base_url + base_len + 1;
    u->base_query = strndup(q, strcspn(q, "#"));
  }
  u->display = u->base ? capture_url_without_credentials(u->base) : NULL;
  u->proxy = o->proxy ? strdup(o->proxy) : NULL;
  u->connect_timeout_ms = o->connect_timeout_ms;
  u->idle_timeout_ms = o->idle_timeout_ms;
  for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_init(&u->locks[i], NULL);
  u->share = curl_share_init();
  if (!u->base || !u->display || (o->proxy && !u->proxy) || !u->share ||
      (o->base_url[base_len] == '?' && !u->base_query)) {
    capture_upstream_free(u);
    return st_fail(ST_ENOMEM, "upstream");
  }
  size_t n = strlen(u->base);
  while (n > 0 && u->base[n - 1] == '/') u->base[--n] = 0;
  n = strlen(u->display);
  while (n > 0 && u->display[n - 1] == '/') u->display[--n] = 0;
  curl_share_setopt(u->share, CURLSHOPT_LOCKFUNC, share_lock);
  curl_share_setopt(u->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
  curl_share_setopt(u->share, CURLSHOPT_USERDATA, u);
  curl_share_setopt(u->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
  curl_share_setopt(u->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  *out = u;
  return ST_OK;
}

void capture_upstream_free(capture_upstream *u) {
  if (!u) return;
  if (u->share) curl_share_cleanup(u->share);
  for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_destroy(&u->locks[i]);
  if (u->base) memset(u->base, 0, strlen(u->base)); /* may hold credentials */
  if (u->base_query) memset(u->base_query, 0, strlen(u->base_query));
  free(u->base);
  free(u->base_query);
  free(u->display);
  free(u->proxy);
  free(u);
}

/* Decodes %XX escapes of n bytes of a URL part into a new string. */
static char *percent_decode(const char *s, size_t n) {
  char *out = malloc(n + 1), *o = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '%' && i + 2 < n && isxdigit((unsigned char)s[i + 1]) &&
        isxdigit((unsigned char)s[i + 2])) {
      char hex[3] = {s[i + 1], s[i + 2], 0};
      *o++ = (char)strtol(hex, NULL, 16);
      i += 2;
    } else {
      *o++ = s[i];
    }
  }
  *o = 0;
  return out;
}

/* Adds a URL's userinfo to s: as written ("user:pa%40ss"), the password alone, and the
** "Basic" credential curl derives from it (base64 of the decoded "user:pa@ss"), which an
** upstream that echoes headers would otherwise hand back into a recorded body; and the values
** of its secret-looking query parameters (?key=...). */
static int add_url_secrets(const char *url, capture_secrets *s) {
  if (!url) return 0;
  const char *query = strchr(url, '?');
  if (query) {
    char *q = strndup(query + 1, strcspn(query + 1, "#"));
    int oom = 0;
    char *redacted = q ? capture_redact_query(s, q, &oom) : NULL; /* remembers the values */
    int fail = !q || oom;
    if (q) memset(q, 0, strlen(q));
    free(q);
    free(redacted);
    if (fail) return -1;
  }
  const char *scheme_end = strstr(url, "://");
  const char *authority = scheme_end ? scheme_end + 3 : url;
  size_t auth_len = strcspn(authority, "/?#");
  const char *at = NULL;
  for (size_t i = 0; i < auth_len; i++)
    if (authority[i] == '@') at = authority + i;
  if (!at) return 0;
  size_t n = (size_t)(at - authority);
  if (capture_secrets_add(s, authority, n) < 0) return -1;
  const char *colon = memchr(authority, ':', n);
  if (colon && capture_secrets_add(s, colon + 1, (size_t)(at - colon - 1)) < 0) return -1;
  char *user = percent_decode(authority, colon ? (size_t)(colon - authority) : n);
  char *pass = colon ? percent_decode(colon + 1, (size_t)(at - colon - 1)) : strdup("");
  char *pair = NULL, *b64 = NULL;
  int rc = -1;
  if (user && pass && asprintf(&pair, "%s:%s", user, pass) >= 0 &&
      (b64 = capture_base64(pair, strlen(pair))))
    rc = capture_secrets_add(s, pass, strlen(pass)) | capture_secrets_add(s, b64, strlen(b64));
  free(user);
  free(pass);
  free(pair);
  free(b64);
  return rc;
}

int capture_upstream_add_secrets(const capture_upstream *u, capture_secrets *s) {
  if (add_url_secrets(u->base, s) < 0) return -1;
  if (u->base_query) {
    int oom = 0;
    free(capture_redact_query(s, u->base_query, &oom));
    if (oom) return -1;
  }
  return add_url_secrets(u->proxy, s);
}

int capture_header_is_hop_by_hop(const char *name, const char *connection) {
  static const char *const hop[] = {"connection", "keep-alive", "proxy-connection", "te",
                                    "trailer", "transfer-encoding", "upgrade",
                                    /* set by the proxy itself for the next hop: */
                                    "host", "content-length", "expect"};
  for (size_t i = 0; i < sizeof hop / sizeof hop[0]; i++)
    if (!strcasecmp(name, hop[i])) return 1;
  if (connection) { /* "Connection: close, X-Foo" makes X-Foo hop-by-hop too */
    size_t n = strlen(name);
    const char *p = connection;
    while (*p) {
      while (*p == ' ' || *p == '\t' || *p == ',') p++;
      const char *start = p;
      while (*p && *p != ',') p++;
      const char *end = p;
      while (end > start && (end[-1] == ' ' || end[-1] == '\t')) end--;
      if ((size_t)(end - start) == n && !strncasecmp(start, name, n)) return 1;
    }
  }
  return 0;
}

/* ---- one transfer ------------------------------------------------------------------------- */

enum { ABORT_NONE = 0, ABORT_CLIENT = 1, ABORT_SHUTDOWN = 2, ABORT_IDLE = 3 };

typedef struct transfer {
  capture_upstream *u;
  const capture_upstream_hooks *hooks;
  capture_headers headers;
  int status;
  char reason[128];
  int head_done;
  int abort_reason;
  int oom;
  int64_t last_activity_ns;
} transfer;

static size_t on_header(char *buf, size_t size, size_t nitems, void *user) {
  transfer *t = user;
  size_t n = size * nitems, len = n;
  t->last_activity_ns = capture_now_ns();
  if (t->head_done) return n; /* trailers after a chunked body: not relayed */
  while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
  if (len >= 5 && !memcmp(buf, "HTTP/", 5)) { /* a status line starts a new head */
    capture_headers_clear(&t->headers);
    const char *p = memchr(buf, ' ', len);
    t->status = p ? atoi(p + 1) : 0;
    t->reason[0] = 0;
    if (p) {
      const char *r = memchr(p + 1, ' ', len - (size_t)(p + 1 - buf));
      if (r) snprintf(t->reason, sizeof t->reason, "%.*s", (int)(len - (size_t)(r + 1 - buf)), r + 1);
    }
    return n;
  }
  if (len == 0) { /* end of a head: 1xx heads are informational, wait for the final one */
    if (t->status >= 100 && t->status < 200 && t->status != 101) return n;
    t->head_done = 1;
    if (t->hooks->on_head(t->hooks->user, t->status, t->reason, &t->headers) < 0) {
      t->abort_reason = ABORT_CLIENT;
      return 0;
    }
    return n;
  }
  if ((buf[0] == ' ' || buf[0] == '\t') && t->headers.n > 0) { /* obsolete line folding */
    capture_header *h = &t->headers.items[t->headers.n - 1];
    size_t old = strlen(h->value);
    char *v = realloc(h->value, old + len + 1);
    if (!v) {
      t->oom = 1;
      return 0;
    }
    memcpy(v + old, buf, len);
    v[old + len] = 0;
    h->value = v;
    return n;
  }
  const char *colon = memchr(buf, ':', len);
  if (!colon) return n; /* not a header line: ignore rather than fail the exchange */
  const char *v = colon + 1, *end = buf + len;
  while (v < end && (*v == ' ' || *v == '\t')) v++;
  while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
  if (capture_headers_add(&t->headers, buf, (size_t)(colon - buf), v, (size_t)(end - v)) < 0) {
    t->oom = 1;
    return 0;
  }
  return n;
}

static size_t on_write(char *buf, size_t size, size_t nmemb, void *user) {
  transfer *t = user;
  size_t n = size * nmemb;
  t->last_activity_ns = capture_now_ns();
  if (t->hooks->on_body(t->hooks->user, buf, n) < 0) {
    t->abort_reason = ABORT_CLIENT;
    return 0;
  }
  return n;
}

static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow) {
  transfer *t = user;
  int r = t->hooks->poll_abort ? t->hooks->poll_abort(t->hooks->user) : 0;
  if (r == 1) t->abort_reason = ABORT_CLIENT;
  else if (r == 2) t->abort_reason = ABORT_SHUTDOWN;
  else if (t->u->idle_timeout_ms > 0 &&
           capture_now_ns() - t->last_activity_ns > (int64_t)t->u->idle_timeout_ms * 1000000)
    t->abort_reason = ABORT_IDLE;
  return t->abort_reason != ABORT_NONE;
}

void capture_upstream_handle_free(void *handle) {
  if (handle) curl_easy_cleanup(handle);
}

capture_upstream_outcome capture_upstream_perform(capture_upstream *u, void **handle,
                                                  const char *method, const char *path,
                                                  const char *query,
                                                  const capture_headers *headers,
                                                  const void *body, size_t body_len,
                                                  const capture_upstream_hooks *hooks,
                                                  char *message, size_t message_len) {
  transfer t = {.u = u, .hooks = hooks, .last_activity_ns = capture_now_ns()};
  char errbuf[CURL_ERROR_SIZE] = "";
  struct curl_slist *list = NULL;
  char *url = NULL;
  capture_upstream_outcome outcome = CAPTURE_UPSTREAM_FAILED;
  message[0] = 0;
  CURL *h = *handle;
  if (h) curl_easy_reset(h); /* options back to defaults; live connections stay */
  else *handle = h = curl_easy_init();
  int have_accept = 0, have_type = 0, oom = !h;
  /* base + path, then the query: the upstream URL's own parameters first, the client's after. */
  const char *bq = u->base_query && u->base_query[0] ? u->base_query : NULL;
  const char *cq = query && query[0] ? query : NULL;
  if (!oom && asprintf(&url, "%s%s%s%s%s%s", u->base, path, bq || cq ? "?" : "", bq ? bq : "",
                       bq && cq ? "&" : "", cq ? cq : "") < 0) {
    url = NULL;
    oom = 1;
  }
  for (size_t i = 0; !oom && i < headers->n; i++) {
    const capture_header *hd = &headers->items[i];
    char *line = NULL;
    have_accept |= !strcasecmp(hd->name, "accept");
    have_type |= !strcasecmp(hd->name, "content-type");
    /* "Name;" is curl's spelling of a header sent with an empty value. */
    int r = hd->value[0] ? asprintf(&line, "%s: %s", hd->name, hd->value)
                         : asprintf(&line, "%s;", hd->name);
    struct curl_slist *next = r < 0 ? NULL : curl_slist_append(list, line);
    if (r >= 0) {
      memset(line, 0, strlen(line)); /* may be a credential */
      free(line);
    }
    if (!next) oom = 1;
    else list = next;
  }
  /* Stop curl from adding headers the client did not send. */
  static const char *const suppress[] = {"Expect:", "Accept:", "Content-Type:"};
  for (int i = 0; !oom && i < 3; i++) {
    if ((i == 1 && have_accept) || (i == 2 && have_type)) continue;
    struct curl_slist *next = curl_slist_append(list, suppress[i]);
    if (!next) oom = 1;
    else list = next;
  }
  if (oom) {
    snprintf(message, message_len, "out of memory preparing the upstream request");
    goto out;
  }

  /* The options curl copies (the URL, the proxy, a custom method) fail when memory runs out;
  ** unchecked, the transfer then failed as "No URL set" and read as the upstream's fault. */
  CURLcode set = curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_SHARE, u->share);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_HTTP_CONTENT_DECODING, 0L);
  curl_easy_setopt(h, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)u->connect_timeout_ms);
  if (u->proxy && set == CURLE_OK) set = curl_easy_setopt(h, CURLOPT_PROXY, u->proxy);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  if (!strcmp(method, "GET") && body_len == 0) {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  } else if (!strcmp(method, "HEAD")) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else {
    if (strcmp(method, "POST") && set == CURLE_OK) set = curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (body_len > 0 || !strcmp(method, "POST") || !strcmp(method, "PUT") || !strcmp(method, "PATCH")) {
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, body_len ? body : "");
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
  }

  if (set != CURLE_OK) {
    snprintf(message, message_len, "%s preparing the upstream request",
             set == CURLE_OUT_OF_MEMORY ? "out of memory" : curl_easy_strerror(set));
    goto out;
  }

  /* A name that did not resolve sent nothing upstream, so it is tried once more before the
  ** client hears of it: curl reports memory running out in the resolver (its thread, the C
  ** library's getaddrinfo) as "Couldn't resolve host name", even for a numeric address. */
  CURLcode rc = curl_easy_perform(h);
  if (rc == CURLE_COULDNT_RESOLVE_HOST && !t.head_done && t.abort_reason == ABORT_NONE) {
    errbuf[0] = 0;
    rc = curl_easy_perform(h);
  }
  if (rc == CURLE_OK && !t.head_done) { /* e.g. a response with no head at all */
    rc = CURLE_GOT_NOTHING;
    snprintf(errbuf, sizeof errbuf, "no response head");
  }
  const char *detail = errbuf[0] ? errbuf : curl_easy_strerror(rc);
  if (rc == CURLE_OK) {
    outcome = CAPTURE_UPSTREAM_OK;
  } else if (t.abort_reason == ABORT_CLIENT) {
    outcome = CAPTURE_UPSTREAM_CLIENT_GONE;
    snprintf(message, message_len, "client went away; upstream transfer cancelled");
  } else if (t.abort_reason == ABORT_SHUTDOWN) {
    outcome = CAPTURE_UPSTREAM_SHUTDOWN;
    snprintf(message, message_len, "proxy shutting down; upstream transfer cancelled");
  } else if (t.abort_reason == ABORT_IDLE) {
    outcome = CAPTURE_UPSTREAM_TIMEOUT;
    snprintf(message, message_len, "%s %s%s: upstream sent nothing for %d ms (idle timeout)",
             method, u->display, path, u->idle_timeout_ms);
  } else {
    if (t.oom) detail = "out of memory reading the response head";
    switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT: outcome = CAPTURE_UPSTREAM_UNREACHABLE; break;
    case CURLE_OPERATION_TIMEDOUT: outcome = CAPTURE_UPSTREAM_TIMEOUT; break;
    default: outcome = CAPTURE_UPSTREAM_FAILED; break;
    }
    snprintf(message, message_len, "%s %s%s: %s (curl: %s)", method, u->display, path, detail,
             curl_easy_strerror(rc));
  }
out:
  if (h) { /* drop pointers into this call's stack before the handle outlives it */
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
  }
  curl_slist_free_all(list); /* (header lines may hold credentials; curl copies are its own) */
  if (url) memset(url, 0, strlen(url)); /* may hold the upstream's key */
  free(url);
  capture_headers_free(&t.headers);
  return outcome;
}
