/* base.c — status names, the per-thread error buffer, dtype names, small file helpers. */
#include "common/base.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static _Thread_local char error_buffer[2048];

const char *st_strerror(st_status s) {
  switch (s) {
  case ST_OK: return "ok";
  case ST_EINVAL: return "invalid argument";
  case ST_ENOMEM: return "out of memory";
  case ST_EIO: return "input/output error";
  case ST_EFORMAT: return "malformed input";
  case ST_EUNSUPPORTED: return "unsupported";
  case ST_EBACKEND: return "backend error";
  case ST_EHDF5: return "HDF5 error";
  case ST_ESQLITE: return "SQLite error";
  case ST_EHTTP: return "HTTP error";
  case ST_EUPSTREAM: return "upstream error";
  case ST_EMISMATCH: return "mismatch";
  case ST_ETIMEOUT: return "timed out";
  case ST_ENOTFOUND: return "not found";
  case ST_ETOOBIG: return "too large";
  }
  return "unknown status";
}

st_status st_fail(st_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error_buffer, sizeof error_buffer, fmt, ap);
  va_end(ap);
  /* ST_ENOMEM sites name what they were allocating ("tap table"); the reader must also learn
  ** that memory ran out, whichever command prints the message */
  if (s == ST_ENOMEM && !strstr(error_buffer, "out of memory")) {
    char what[sizeof error_buffer];
    memcpy(what, error_buffer, sizeof what);
    snprintf(error_buffer, sizeof error_buffer, "out of memory%s%.2000s",
             what[0] ? ": " : "", what);
  }
  return s;
}

st_status st_fail_context(st_status s, const char *fmt, ...) {
  char old[sizeof error_buffer];
  memcpy(old, error_buffer, sizeof old);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(error_buffer, sizeof error_buffer, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof error_buffer)
    snprintf(error_buffer + n, sizeof error_buffer - (size_t)n, "%s", old);
  return s;
}

const char *st_errmsg(void) { return error_buffer; }
void st_clear_error(void) { error_buffer[0] = 0; }

static const char *const dtype_names[ST_DTYPE_COUNT] = {
  [ST_F32] = "float32", [ST_F16] = "float16", [ST_BF16] = "bfloat16",
  [ST_F8_E4M3FN] = "float8_e4m3fn", [ST_F8_E4M3FNUZ] = "float8_e4m3fnuz",
  [ST_F8_E8M0] = "float8_e8m0fnu", [ST_F4_E2M1] = "float4_e2m1fn_x2", [ST_I8] = "int8",
  [ST_U8] = "uint8", [ST_I32] = "int32", [ST_I64] = "int64", [ST_F64] = "float64",
  [ST_BOOL] = "bool",
};

const char *st_dtype_name(st_dtype t) {
  return (unsigned)t < ST_DTYPE_COUNT ? dtype_names[t] : "unknown";
}

size_t st_dtype_size(st_dtype t) {
  switch (t) {
  case ST_F32: case ST_I32: return 4;
  case ST_F16: case ST_BF16: return 2;
  case ST_F8_E4M3FN: case ST_F8_E4M3FNUZ: case ST_F8_E8M0: case ST_I8: case ST_U8: case ST_BOOL:
    return 1;
  case ST_I64: case ST_F64: return 8;
  case ST_F4_E2M1: case ST_DTYPE_COUNT: return 0;
  }
  return 0;
}

void st_utc_now(char *buf, size_t size) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char text[96]; /* wide enough for any int fields */
  snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
           tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
           (int)(ts.tv_nsec / 1000000));
  snprintf(buf, size, "%s", text);
}

const char *st_io_errno_cause(int e) {
  switch (e) {
  case ENOSPC: return "the disk is full (No space left on device)";
  case EDQUOT: return "the disk quota is exhausted (Disk quota exceeded)";
  case EFBIG: return "the file is too large: the file size limit was reached (File too large)";
  default: return NULL;
  }
}

char *st_read_text_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *text = NULL;
  long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (size >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)size + 1))) {
    if (fread(text, 1, (size_t)size, f) == (size_t)size) {
      text[size] = 0;
    } else {
      free(text);
      text = NULL;
    }
  }
  fclose(f);
  return text;
}

st_status st_make_dirs(const char *dir) {
  char buf[4096];
  if (!dir[0]) return st_fail(ST_EINVAL, "cannot create a directory of an empty name");
  if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
    return st_fail(ST_EINVAL, "path too long: %s", dir);
  for (char *p = buf + 1;; p++) { /* each prefix ending before a '/', then the whole path */
    if (*p != '/' && *p != 0) continue;
    char c = *p;
    *p = 0;
    struct stat sb;
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
      return st_fail(ST_EIO, "cannot create directory %s: %s", buf, strerror(errno));
    if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode))
      return st_fail(ST_EIO, "cannot create directory %s: a file of that name is in the way", buf);
    *p = c;
    if (!c) break;
  }
  return ST_OK;
}

void st_assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "sparsetrace: assertion failed at %s:%d: %s\n", file, line, expr);
  abort();
}
