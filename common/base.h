/*
** base.h — status codes, error detail and element types shared by every part of sparsetrace.
**
** Errors are values: a function that can fail returns an st_status and leaves a human message in
** a per-thread buffer (st_errmsg()), set through st_fail(). Only main() prints and exits.
** The numbers of st_status are API: never renumber or reuse them; retire with a placeholder.
*/
#ifndef ST_BASE_H
#define ST_BASE_H

#include <stddef.h>
#include <stdint.h>

typedef enum st_status {
  ST_OK = 0,
  ST_EINVAL = 1,       /* bad argument or setting given by the user */
  ST_ENOMEM = 2,       /* allocation failed */
  ST_EIO = 3,          /* read/write/open failed */
  ST_EFORMAT = 4,      /* input file malformed (safetensors, JSON, trace) */
  ST_EUNSUPPORTED = 5, /* valid input we do not handle (shape, dtype, model type) */
  ST_EBACKEND = 6,     /* a compute backend failed */
  ST_EHDF5 = 7,        /* HDF5 library error */
  ST_ESQLITE = 8,      /* SQLite error */
  ST_EHTTP = 9,        /* HTTP protocol error */
  ST_EUPSTREAM = 10,   /* upstream server failed */
  ST_EMISMATCH = 11,   /* comparison found a difference */
  ST_ETIMEOUT = 12,    /* operation timed out */
  ST_ENOTFOUND = 13,   /* named thing (tensor, run, tap) does not exist */
  ST_ETOOBIG = 14,     /* a size limit was reached (st_buf's maximum) */
} st_status;

/* Short fixed name of a status ("invalid argument"); never NULL. */
const char *st_strerror(st_status s);

/* Formats a message into this thread's error buffer and returns s, so callers write
** `return st_fail(ST_EIO, "open %s: %s", path, strerror(errno));`. For ST_ENOMEM name what was
** being allocated (`st_fail(ST_ENOMEM, "tap table")`): the message becomes "out of memory: tap
** table" unless it already says "out of memory". */
st_status st_fail(st_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with context: "loading layer 3: " + old message. Returns s. */
st_status st_fail_context(st_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* This thread's last error message ("" when none). Valid until the next st_fail on the thread. */
const char *st_errmsg(void);
void st_clear_error(void);

/* Element types of tensors on disk, in traces and in memory. Values are stored in traces: fixed. */
typedef enum st_dtype {
  ST_F32 = 0,
  ST_F16 = 1,
  ST_BF16 = 2,
  ST_F8_E4M3FN = 3,
  ST_F8_E4M3FNUZ = 4,
  ST_F8_E8M0 = 5,  /* ue8m0 scale: value 2^(e-127) */
  ST_F4_E2M1 = 6,  /* packed two per byte, element 2k in the low nibble */
  ST_I8 = 7,
  ST_U8 = 8,
  ST_I32 = 9,
  ST_I64 = 10,
  ST_F64 = 11,
  ST_BOOL = 12,
  ST_DTYPE_COUNT
} st_dtype;

/* Name as used in traces and the index ("float32", "bfloat16", "int32", ...). */
const char *st_dtype_name(st_dtype t);
/* Bytes per element; 0 for packed sub-byte types (ST_F4_E2M1). */
size_t st_dtype_size(st_dtype t);

/* Invariant check that stays on in every build: prints file:line and the expression, aborts. */
#define ST_ASSERT(cond)                                                                            \
  ((cond) ? (void)0 : st_assert_fail(#cond, __FILE__, __LINE__))
#ifdef __cplusplus /* kernels/cuda/ includes this header from C++ */
[[noreturn]] void st_assert_fail(const char *expr, const char *file, int line);
#else
_Noreturn void st_assert_fail(const char *expr, const char *file, int line);
#endif

/* Now in UTC, ISO 8601 with milliseconds: "2026-11-29T22:35:48.737Z" (needs size >= 25). */
void st_utc_now(char *buf, size_t size);

/* For a write that failed with errno e: a sentence naming the cause when it is a full disk
** (ENOSPC, EDQUOT) or the file size limit (EFBIG), e.g. "the disk is full (No space left on
** device)"; NULL for any other errno. Static storage. */
const char *st_io_errno_cause(int e);

/* The whole file as a NUL-terminated malloc'd string (caller frees), or NULL when it cannot be read. */
char *st_read_text_file(const char *path);

/* mkdir -p: creates dir and every missing folder above it (mode 0777 less the umask). ST_EINVAL
** for an empty or over-long path; ST_EIO naming the folder that cannot be made, or that is a file. */
st_status st_make_dirs(const char *dir);

#define ST_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ST_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
