/*
** alloc_fail.c — an LD_PRELOAD shim that makes the Nth allocation fail (tests/test_alloc_fail.sh).
**
** ST_ALLOC_FAIL_AT=N: the Nth call to malloc, calloc, realloc, strdup or strndup made after the
** program's main() starts returns NULL with errno ENOMEM; every other call goes to the real
** allocator. One failure per process (SQLite's "one-shot" mode): what a test then checks is that
** the program reports that one failure cleanly and frees what it had, not how it fares when
** nothing can be allocated any more. ST_ALLOC_FAIL_REPORT=PATH: the process that fails the call
** appends "hit N pid\n" to PATH, and every process appends "count C pid\n" at exit (C: the calls
** it counted), so the test knows whether N was reached and how many calls a path makes.
** ST_ALLOC_FAIL_BACKTRACE=1: the failing call's stack goes to stderr (debugging a probe).
**
** Why a preloaded shim and not ST_ALLOC_FAIL_AT in a wrapper layer: the project has no central
** allocation helper (hundreds of direct malloc/calloc/realloc/strdup calls across engine,
** recorder, replayer and cli), and its libraries (HDF5, SQLite, jansson) allocate on the same
** paths; a shim sees every one of them without touching the code under test, in the very binary
** users run. Counting starts at main() (the shim wraps __libc_start_main, glibc's entry to main)
** so that the dynamic loader's and the libraries' constructors are never the ones failed: the
** count then depends on the program's own path only. Calls are counted across threads and after
** fork (a child continues its parent's count), atomically.
**
** ST_ALLOC_FAIL_SKIP=NAME[,NAME..]: calls made from the code of a loaded library whose file name
** contains NAME are neither counted nor failed (the caller's return address against the library's
** loaded segments, found once with dl_iterate_phdr). tests/test_alloc_fail.sh skips libhdf5: HDF5
** 1.10 double-frees or reads freed memory from its free lists after its own allocations fail
** (H5MM_xfree, H5FL_garbage_coll at H5_term_library), a crash inside the library that no caller
** can prevent. Our calls into HDF5 are still failed wherever our own code allocates.
**
** Under AddressSanitizer the same shim works when it is preloaded ahead of the ASan runtime
** (ASAN_OPTIONS=verify_asan_link_order=0): its malloc then interposes ASan's, and forwards to it
** through dlsym(RTLD_NEXT), so ASan still owns every block and LeakSanitizer still reports what
** an error path forgot to free. A linker --wrap=malloc build was the alternative; it would only
** see the calls our own objects make, not the libraries', and needs a second set of binaries.
** free() is not interposed: it never fails, and every block still comes from the real allocator.
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);

static atomic_long calls;       /* allocation calls counted since main() started */
static atomic_int armed;        /* main() has started */
static long fail_at;            /* ST_ALLOC_FAIL_AT, 0: never fail */
static const char *report_path; /* ST_ALLOC_FAIL_REPORT, NULL: no report */

/* dlsym() may itself call calloc before real_calloc is known: served from here, never freed. */
static char bootstrap[4096];
static atomic_size_t bootstrap_used;

static void resolve(void) {
  if (real_malloc) return;
  real_calloc = dlsym(RTLD_NEXT, "calloc");
  real_realloc = dlsym(RTLD_NEXT, "realloc");
  real_malloc = dlsym(RTLD_NEXT, "malloc");
}

/* Appends one line to the report file with system calls only (no allocation, no stdio). */
static void report(const char *what, long n) {
  if (!report_path) return;
  char line[64];
  int len = snprintf(line, sizeof line, "%s %ld %ld\n", what, n, (long)getpid());
  int fd = open(report_path, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  if (write(fd, line, (size_t)len) < 0) { /* nothing to do: the test sees no line */ }
  close(fd);
}

/* Address ranges of the loaded segments of the libraries named in ST_ALLOC_FAIL_SKIP. */
static struct { uintptr_t lo, hi; } skip_ranges[64];
static int n_skip_ranges;

static int add_skip_ranges(struct dl_phdr_info *info, size_t size, void *names) {
  (void)size;
  const char *list = names;
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ",");
    int match = 0;
    for (const char *f = info->dlpi_name; len && *f && !match; f++) match = !strncmp(f, p, len);
    if (match)
      for (int i = 0; i < info->dlpi_phnum && n_skip_ranges < 64; i++)
        if (info->dlpi_phdr[i].p_type == PT_LOAD) {
          uintptr_t lo = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
          skip_ranges[n_skip_ranges].lo = lo;
          skip_ranges[n_skip_ranges++].hi = lo + info->dlpi_phdr[i].p_memsz;
        }
    p += len;
    if (*p == ',') p++;
  }
  return 0;
}

static int skipped_caller(const void *caller) {
  for (int i = 0; i < n_skip_ranges; i++)
    if ((uintptr_t)caller >= skip_ranges[i].lo && (uintptr_t)caller < skip_ranges[i].hi) return 1;
  return 0;
}

/* True when this call (made from code at caller) is the one to fail. */
static int should_fail(const void *caller) {
  if (!atomic_load(&armed) || skipped_caller(caller)) return 0;
  long n = atomic_fetch_add(&calls, 1) + 1;
  if (n != fail_at) return 0;
  report("hit", n);
  if (getenv("ST_ALLOC_FAIL_BACKTRACE")) { /* where the failed call came from, for debugging */
    void *frames[32];
    backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
  }
  errno = ENOMEM;
  return 1;
}

void *malloc(size_t size) {
  resolve();
  if (should_fail(__builtin_return_address(0))) return NULL;
  return real_malloc(size);
}

void *calloc(size_t n, size_t size) {
  if (!real_calloc) { /* inside dlsym, before resolve() finished */
    size_t bytes = (n * size + 15) & ~(size_t)15;
    size_t at = atomic_fetch_add(&bootstrap_used, bytes);
    if (at + bytes > sizeof bootstrap) return NULL;
    return bootstrap + at; /* static storage: already zero */
  }
  if (should_fail(__builtin_return_address(0))) return NULL;
  return real_calloc(n, size);
}

void *realloc(void *p, size_t size) {
  resolve();
  if (should_fail(__builtin_return_address(0))) return NULL;
  return real_realloc(p, size);
}

/* The string copies are made here with the real malloc, so each counts once (for its caller)
** whichever allocator is underneath (glibc's strdup calls malloc; ASan's would not). */
char *strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = should_fail(__builtin_return_address(0)) ? NULL : (resolve(), real_malloc(n));
  if (p) memcpy(p, s, n);
  return p;
}

char *strndup(const char *s, size_t max) {
  size_t n = strnlen(s, max);
  char *p = should_fail(__builtin_return_address(0)) ? NULL : (resolve(), real_malloc(n + 1));
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

static void at_exit_report(void) { report("count", atomic_load(&calls)); }

typedef int (*main_fn)(int, char **, char **);
static main_fn real_main;

static int counting_main(int argc, char **argv, char **envp) {
  const char *at = getenv("ST_ALLOC_FAIL_AT");
  fail_at = at ? strtol(at, NULL, 10) : 0;
  report_path = getenv("ST_ALLOC_FAIL_REPORT");
  const char *skip = getenv("ST_ALLOC_FAIL_SKIP");
  if (skip && *skip) dl_iterate_phdr(add_skip_ranges, (void *)skip);
  atexit(at_exit_report); /* registered before counting: its own allocation is never failed */
  atomic_store(&armed, 1);
  return real_main(argc, argv, envp);
}

int __libc_start_main(main_fn main, int argc, char **argv, int (*init)(int, char **, char **),
                      void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
  int (*real_start)(main_fn, int, char **, int (*)(int, char **, char **), void (*)(void),
                    void (*)(void), void *) = dlsym(RTLD_NEXT, "__libc_start_main");
  real_main = main;
  return real_start(counting_main, argc, argv, init, fini, rtld_fini, stack_end);
}
