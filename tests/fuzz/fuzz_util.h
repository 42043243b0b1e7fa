/*
** fuzz_util.h — helpers shared by the libFuzzer targets in tests/fuzz/ (built with -DST_FUZZ=ON).
**
** Parsers that read a path (safetensors, tokenizer, trace) get the input written to a file of
** their own under $TMPDIR (one per process, so parallel fuzzers do not collide).
*/
#ifndef ST_FUZZ_UTIL_H
#define ST_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A per-process path "$TMPDIR/st_fuzz_<tag>_<pid><suffix>" (static storage). */
static inline const char *fuzz_path(const char *tag, const char *suffix) {
  static char buf[8][512];
  static int next;
  char *b = buf[next++ & 7];
  const char *dir = getenv("TMPDIR");
  snprintf(b, sizeof buf[0], "%s/st_fuzz_%s_%ld%s", dir && *dir ? dir : "/tmp", tag, (long)getpid(),
           suffix);
  return b;
}

/* Writes data to path; aborts when it cannot (the harness, not the parser, is at fault). */
static inline void fuzz_write(const char *path, const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) {
    perror(path);
    abort();
  }
}

/* data as a NUL-terminated malloc'd string (NULs inside kept). */
static inline char *fuzz_strdup(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) abort();
  memcpy(s, data, size);
  s[size] = 0;
  return s;
}

#endif
