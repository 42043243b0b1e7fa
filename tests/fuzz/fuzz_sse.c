/*
** fuzz_sse.c — recorder/capture/capture_sse.c: the input fed in chunks whose sizes come from
** the input itself, then all at once into a second parser; both must dispatch the same events,
** whose blocks tile the stream from offset 0 (block ends may differ by the LF of a CRLF split
** between two chunks, as capture_sse.h says).
*/
#include "recorder/capture/capture_sse.h"
#include "fuzz_util.h"

typedef struct seen {
  size_t n_events, next_offset;
  unsigned long digest;
  size_t total;
} seen;

static int on_event(void *user, const char *event, size_t event_len, const char *data,
                    size_t data_len, size_t offset, size_t length) {
  seen *s = user;
  if (offset != s->next_offset) abort(); /* blocks tile the stream */
  if (data[data_len] != 0) abort();      /* NUL-terminated */
  s->next_offset = offset + length;
  s->n_events++;
  for (size_t i = 0; i < event_len; i++) s->digest = s->digest * 31 + (unsigned char)event[i];
  s->digest = s->digest * 31 + 0x100;
  for (size_t i = 0; i < data_len; i++) s->digest = s->digest * 31 + (unsigned char)data[i];
  s->digest = s->digest * 31 + 0x200;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  unsigned seed = data[0];
  data++, size--;
  seen a = {0}, b = {0};
  capture_sse_parser pa, pb;
  capture_sse_init(&pa, on_event, &a);
  capture_sse_init(&pb, on_event, &b);
  size_t at = 0;
  while (at < size) {
    size_t n = 1 + (seed % 17);
    seed = seed * 1103515245u + 12345u;
    seed ^= seed >> 16;
    if (n > size - at) n = size - at;
    if (capture_sse_feed(&pa, (const char *)data + at, n) != 0) abort();
    at += n;
  }
  if (capture_sse_feed(&pb, (const char *)data, size) != 0) abort();
  if (a.n_events != b.n_events || a.digest != b.digest) abort();
  if (a.next_offset > size || b.next_offset > size || a.next_offset + 1 < b.next_offset ||
      b.next_offset + 1 < a.next_offset)
    abort();
  (void)capture_sse_pending(&pa);
  capture_sse_free(&pa);
  capture_sse_free(&pb);
  return 0;
}
