/*
** capture_exchange.c — the life of one exchange object, and the small vocabulary every capture
** file shares: which API a path belongs to, the names of record states, clocks and ids.
**
** An exchange is created by the worker thread that handles the request, referenced once more
** by each store submission, and freed by whoever drops the last reference (usually the store
** writer, after the finishing row is committed). Freeing wipes the remembered credentials.
*/
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "capture_internal.h"

static int ends_with(const char *s, size_t len, const char *suffix) {
  size_t n = strlen(suffix);
  return len >= n && !memcmp(s + len - n, suffix, n);
}

capture_api capture_api_from_path(const char *path) {
  size_t len = strlen(path);
  while (len > 1 && path[len - 1] == '/') len--;
  if (ends_with(path, len, "/chat/completions")) return CAPTURE_API_OPENAI_CHAT;
  if (ends_with(path, len, "/completions")) return CAPTURE_API_OPENAI_COMPLETIONS;
  if (ends_with(path, len, "/responses")) return CAPTURE_API_OPENAI_RESPONSES;
  if (ends_with(path, len, "/messages")) return CAPTURE_API_ANTHROPIC_MESSAGES;
  return CAPTURE_API_OTHER;
}

const char *capture_api_name(capture_api api) {
  switch (api) {
  case CAPTURE_API_ANTHROPIC_MESSAGES: return "anthropic.messages";
  case CAPTURE_API_OPENAI_CHAT: return "openai.chat";
  case CAPTURE_API_OPENAI_COMPLETIONS: return "openai.completions";
  case CAPTURE_API_OPENAI_RESPONSES: return "openai.responses";
  case CAPTURE_API_OTHER: break;
  }
  return "other";
}

const char *capture_state_name(capture_state s) {
  switch (s) {
  case CAPTURE_OPEN: return "open";
  case CAPTURE_COMPLETE: return "complete";
  case CAPTURE_UPSTREAM_ERROR: return "upstream_error";
  case CAPTURE_CLIENT_ABORTED: return "client_aborted";
  case CAPTURE_INTERRUPTED: return "interrupted";
  case CAPTURE_REJECTED: return "rejected";
  }
  return "open";
}

st_status st_capture_prompt_ids_parse(const char *name, st_capture_prompt_ids *out) {
  if (name && !strcmp(name, "sglang")) *out = ST_CAPTURE_PROMPT_IDS_SGLANG;
  else if (name && !strcmp(name, "vllm")) *out = ST_CAPTURE_PROMPT_IDS_VLLM;
  else
    return st_fail(ST_EINVAL, "--ask-prompt-ids '%s': the engines that return prompt token ids "
                              "are sglang and vllm", name ? name : "");
  return ST_OK;
}

int64_t capture_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void capture_uuid_v4(char out[40]) {
  unsigned char b[16];
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t n = getrandom(b + got, sizeof b - got, 0);
    if (n <= 0) break;
    got += (size_t)n;
  }
  if (got < sizeof b) { /* no entropy source: fall back to time and address bits, still unique */
    uint64_t t = (uint64_t)capture_now_ns(), a = (uint64_t)(uintptr_t)out;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(t >> (8 * i)), b[8 + i] = (unsigned char)(a >> (8 * i));
  }
  b[6] = (unsigned char)((b[6] & 0x0F) | 0x40);
  b[8] = (unsigned char)((b[8] & 0x3F) | 0x80);
  snprintf(out, 40,
           "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
           b[15]);
}

char *capture_base64(const void *data, size_t n) {
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const unsigned char *p = data;
  char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                 (i + 2 < n ? p[i + 2] : 0);
    *o++ = tab[v >> 18 & 63];
    *o++ = tab[v >> 12 & 63];
    *o++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
    *o++ = i + 2 < n ? tab[v & 63] : '=';
  }
  *o = 0;
  return out;
}

capture_exchange *capture_exchange_new(void) {
  capture_exchange *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  atomic_init(&x->refs, 1);
  capture_uuid_v4(x->id);
  st_utc_now(x->received_at, sizeof x->received_at);
  x->t0_ns = capture_now_ns();
  x->t_headers_ns = x->t_first_byte_ns = x->t_end_ns = -1;
  x->state = CAPTURE_OPEN;
  return x;
}

void capture_exchange_ref(capture_exchange *x) { atomic_fetch_add(&x->refs, 1); }

void capture_exchange_unref(capture_exchange *x) {
  if (!x || atomic_fetch_sub(&x->refs, 1) != 1) return;
  free(x->path);
  free(x->query);
  capture_headers_free(&x->request_headers);
  st_buf_free(&x->request_body);
  free(x->modified_request);
  capture_secrets_free(&x->secrets);
  capture_headers_free(&x->response_headers);
  st_buf_free(&x->response_body);
  capture_sse_free(&x->sse);
  for (size_t i = 0; i < x->n_events; i++) {
    free(x->events[i].event);
    free(x->events[i].data);
  }
  free(x->events);
  free(x->upstream_error);
  free(x->client_error);
  free(x);
}

void capture_exchange_set_error(capture_exchange *x, char **slot, const char *fmt, ...) {
  char raw[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  char *clean = capture_secrets_scrub(&x->secrets, raw);
  free(*slot);
  *slot = clean ? clean : strdup("(out of memory formatting the error)");
}
