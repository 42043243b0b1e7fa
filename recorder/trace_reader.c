/* trace_reader.c — opening and reading HDF5 traces (see trace_reader.h, trace-layout.md). */
#include "trace_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hdf5_util.h"

/* The file attributes this reader knows (trace_format.h), in that order. */
#define FILE_ATTR_NAME(name) #name,
static const char *const file_attr_names[] = {ST_TRACE_FILE_ATTRS(FILE_ATTR_NAME)};
#define N_FILE_ATTRS ((int)(sizeof file_attr_names / sizeof *file_attr_names))

typedef struct file_attr {
  char *text;  /* string attributes; NULL: absent or not a string */
  int has_int; /* integer attributes */
  int64_t value;
} file_attr;

struct st_trace {
  char *path;
  hid_t file;
  int complete;
  int64_t file_bytes; /* size when opened */
  file_attr attrs[N_FILE_ATTRS]; /* by index in file_attr_names */
  int32_t *tokens;
  int64_t n_tokens, n_prompt;
  st_trace_tap *taps;
  int64_t **positions; /* per tap, loaded on first use */
  int n_taps;
};

/* ---------------------------------------------------------------- metadata */

/* Reads file attribute i of t by name (never by listing: trace_format.h says why). ST_OK also
** when it is absent, or neither one string nor one integer (readers ignore what they do not
** know); ST_EFORMAT naming the file and the attribute when the attribute messages of / do not
** decode or its value does not read (a corrupt file). */
static st_status read_file_attr(st_trace *t, int i) {
  const char *name = file_attr_names[i];
  file_attr *a = &t->attrs[i];
  htri_t exists = H5Aexists(t->file, name);
  if (exists < 0)
    return st_h5_fail(ST_EFORMAT, "trace %s is corrupt: looking up file attribute '%s'", t->path,
                      name);
  if (!exists) return ST_OK;
  hid_t attr = H5Aopen(t->file, name, H5P_DEFAULT);
  hid_t type = attr < 0 ? -1 : H5Aget_type(attr);
  H5T_class_t cls = type < 0 ? H5T_NO_CLASS : H5Tget_class(type);
  if (type >= 0) H5Tclose(type);
  if (attr >= 0) H5Aclose(attr);
  if (type < 0)
    return st_h5_fail(ST_EFORMAT, "trace %s is corrupt: opening file attribute '%s'", t->path,
                      name);
  st_status st = ST_OK;
  if (cls == H5T_STRING) st = st_h5_attr_read_string(t->file, name, &a->text);
  else if (cls == H5T_INTEGER) st = st_h5_attr_read_int(t->file, name, &a->value);
  a->has_int = cls == H5T_INTEGER && st == ST_OK;
  H5Eclear2(H5E_DEFAULT);
  if (st == ST_EFORMAT) return ST_OK; /* not a single value: as if absent */
  if (st == ST_ENOMEM) return st_fail_context(st, "trace %s: ", t->path);
  if (st) return st_fail_context(ST_EFORMAT, "trace %s is corrupt: file attribute: ", t->path);
  return ST_OK;
}

static int file_attr_index(const char *name) {
  for (int i = 0; i < N_FILE_ATTRS; i++)
    if (!strcmp(file_attr_names[i], name)) return i;
  return -1;
}

const char *st_trace_path(const st_trace *t) { return t->path; }
int st_trace_is_complete(const st_trace *t) { return t->complete; }

const char *st_trace_attr(const st_trace *t, const char *name) {
  int i = file_attr_index(name);
  return i < 0 ? NULL : t->attrs[i].text;
}

int64_t st_trace_attr_int(const st_trace *t, const char *name, int64_t fallback) {
  int i = file_attr_index(name);
  return i >= 0 && t->attrs[i].has_int ? t->attrs[i].value : fallback;
}

const int32_t *st_trace_tokens(const st_trace *t, int64_t *n_tokens) {
  if (n_tokens) *n_tokens = t->n_tokens;
  return t->tokens;
}

int64_t st_trace_n_prompt(const st_trace *t) { return t->n_prompt; }

static st_status load_tokens(st_trace *t) {
  if (H5Lexists(t->file, "tokens", H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    if (t->complete) return st_fail(ST_EFORMAT, "trace %s has no /tokens dataset", t->path);
    return ST_OK;
  }
  st_status st = ST_OK;
  hid_t d = H5Dopen2(t->file, "tokens", H5P_DEFAULT);
  hid_t space = d < 0 ? -1 : H5Dget_space(d);
  if (space < 0 || H5Sget_simple_extent_ndims(space) != 1) {
    st = st_h5_fail(ST_EFORMAT, "trace %s: /tokens is not a 1-d dataset", t->path);
    goto out;
  }
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, NULL);
  /* What libhdf5 and this reader allocate for comes from the file: bound it by the file before
  ** (a corrupt element size or extent asked for gigabytes). A token takes at least a byte. */
  hid_t type = H5Dget_type(d);
  H5T_class_t cls = type < 0 ? H5T_NO_CLASS : H5Tget_class(type);
  size_t elem = type < 0 ? 0 : H5Tget_size(type);
  if (type >= 0) H5Tclose(type);
  if (cls != H5T_INTEGER || elem < 1 || elem > 8) {
    st = st_h5_fail(ST_EFORMAT, "trace %s is corrupt: /tokens is not an integer dataset",
                    t->path);
    goto out;
  }
  if (n > (hsize_t)t->file_bytes) {
    st = st_fail(ST_EFORMAT, "trace %s is corrupt: /tokens claims %llu tokens, more than its "
                             "%lld bytes can hold", t->path, (unsigned long long)n,
                 (long long)t->file_bytes);
    goto out;
  }
  t->n_tokens = (int64_t)n;
  t->tokens = malloc((size_t)ST_MAX(n, 1) * sizeof *t->tokens);
  if (!t->tokens) {
    st = st_fail(ST_ENOMEM, "tokens of %s", t->path);
    goto out;
  }
  if (n && H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->tokens) < 0) {
    st = st_h5_fail(ST_EFORMAT, "trace %s: reading /tokens (truncated or corrupt?)", t->path);
    goto out;
  }
  if (st_h5_attr_read_int(d, "n_prompt", &t->n_prompt) != ST_OK) {
    st = st_fail(ST_EFORMAT, "trace %s: /tokens has no n_prompt attribute", t->path);
    goto out;
  }
  if (t->n_prompt < 0 || t->n_prompt > t->n_tokens)
    st = st_fail(ST_EFORMAT, "trace %s: n_prompt %lld outside 0..%lld", t->path,
                 (long long)t->n_prompt, (long long)t->n_tokens);
out:
  if (space >= 0) H5Sclose(space);
  if (d >= 0) H5Dclose(d);
  return st;
}

/* ---------------------------------------------------------------- taps */

static st_dtype dtype_from_name(const char *name, int *ok) {
  for (int i = 0; i < ST_DTYPE_COUNT; i++)
    if (!strcmp(st_dtype_name((st_dtype)i), name)) {
      *ok = 1;
      return (st_dtype)i;
    }
  *ok = 0;
  return ST_F32;
}

static st_status load_tap(st_trace *t, hid_t group, const char *name, st_trace_tap *tap) {
  memset(tap, 0, sizeof *tap);
  snprintf(tap->name, sizeof tap->name, "%s", name);
  if (st_tap_parse_name(name, &tap->id, &tap->layer) != 0) {
    tap->id = ST_TAP_COUNT; /* written by a build with a larger catalogue */
    tap->layer = -1;
  }
  st_status st = ST_OK;
  char *text = NULL;
  hid_t d = H5Dopen2(group, name, H5P_DEFAULT);
  hid_t space = d < 0 ? -1 : H5Dget_space(d);
  int rank = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
  if (rank < 1 || rank > ST_TRACE_MAX_RANK) {
    st = st_h5_fail(ST_EFORMAT, "trace %s: tap %s is not a readable dataset of rank 1..%d",
                    t->path, name, ST_TRACE_MAX_RANK);
    goto out;
  }
  hsize_t dims[ST_TRACE_MAX_RANK];
  H5Sget_simple_extent_dims(space, dims, NULL);
  tap->rank = rank;
  for (int i = 0; i < rank; i++) tap->shape[i] = (int64_t)dims[i];
  int ok = 0;
  st_status attr = st_h5_attr_read_string(d, "dtype", &text);
  if (attr == ST_ENOMEM) { /* not the file's fault: say so, not "no known dtype" */
    st = st_fail_context(attr, "trace %s: tap %s: ", t->path, name);
    goto out;
  }
  if (attr == ST_OK) tap->dtype = dtype_from_name(text, &ok);
  if (!ok) {
    st = st_fail(ST_EFORMAT, "trace %s: tap %s has no known dtype attribute", t->path, name);
    goto out;
  }
  free(text);
  text = NULL;
  attr = st_h5_attr_read_string(d, "axis0", &text);
  if (attr == ST_ENOMEM) {
    st = st_fail_context(attr, "trace %s: tap %s: ", t->path, name);
    goto out;
  }
  if (attr == ST_OK)
    tap->row_axis = !strcmp(text, "compressed_row");
  else if (tap->id < ST_TAP_COUNT)
    tap->row_axis = st_tap_catalogue[tap->id].row_axis;
  int64_t v;
  if (st_h5_attr_read_int(d, "layer", &v) == ST_OK) tap->layer = (int)v;
  tap->has_positions = H5Aexists(d, "positions") > 0;
  st_tap_stats *s = &tap->stats;
  if (st_h5_attr_read_int(d, "count", &s->count) != ST_OK) s->count = -1; /* unfinished file */
  st_h5_attr_read_int(d, "nan_count", &s->nan_count);
  st_h5_attr_read_int(d, "inf_count", &s->inf_count);
  if (st_h5_attr_read_int(d, "finite_count", &s->finite_count) != ST_OK) s->finite_count = -1;
  if (st_h5_attr_read_int(d, "posinf_count", &s->posinf_count) != ST_OK) s->posinf_count = -1;
  if (st_h5_attr_read_int(d, "neginf_count", &s->neginf_count) != ST_OK) s->neginf_count = -1;
  s->has_range = st_h5_attr_read_double(d, "min", &s->min) == ST_OK &&
                 st_h5_attr_read_double(d, "max", &s->max) == ST_OK &&
                 st_h5_attr_read_double(d, "mean", &s->mean) == ST_OK;
  s->has_rms = st_h5_attr_read_double(d, "rms", &s->rms) == ST_OK;
out:
  H5Eclear2(H5E_DEFAULT);
  free(text);
  if (space >= 0) H5Sclose(space);
  if (d >= 0) H5Dclose(d);
  return st;
}

static int tap_order(const void *a, const void *b) {
  const st_trace_tap *x = a, *y = b;
  int lx = x->layer < 0 ? 1 << 30 : x->layer, ly = y->layer < 0 ? 1 << 30 : y->layer;
  if (lx != ly) return lx < ly ? -1 : 1;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return strcmp(x->name, y->name);
}

static st_status load_taps(st_trace *t) {
  if (H5Lexists(t->file, "taps", H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return st_fail(ST_EFORMAT, "trace %s has no /taps group", t->path);
  }
  st_status st = ST_OK;
  hid_t g = H5Gopen2(t->file, "taps", H5P_DEFAULT);
  H5G_info_t info;
  if (g < 0 || H5Gget_info(g, &info) < 0) {
    st = st_h5_fail(ST_EFORMAT, "trace %s: reading /taps", t->path);
    goto out;
  }
  t->taps = calloc(ST_MAX(info.nlinks, 1), sizeof *t->taps);
  t->positions = calloc(ST_MAX(info.nlinks, 1), sizeof *t->positions);
  if (!t->taps || !t->positions) {
    st = st_fail(ST_ENOMEM, "tap list of %s", t->path);
    goto out;
  }
  for (hsize_t i = 0; i < info.nlinks; i++) {
    char name[ST_TRACE_MAX_NAME];
    ssize_t len = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name,
                                     H5P_DEFAULT);
    if (len < 0 || (size_t)len >= sizeof name) {
      st = st_h5_fail(ST_EFORMAT, "trace %s: listing /taps", t->path);
      goto out;
    }
    if ((st = load_tap(t, g, name, &t->taps[t->n_taps]))) goto out;
    t->n_taps++;
  }
  qsort(t->taps, (size_t)t->n_taps, sizeof *t->taps, tap_order);
out:
  if (g >= 0) H5Gclose(g);
  return st;
}

int st_trace_tap_count(const st_trace *t) { return t->n_taps; }

const st_trace_tap *st_trace_tap_at(const st_trace *t, int i) {
  return i >= 0 && i < t->n_taps ? &t->taps[i] : NULL;
}

const st_trace_tap *st_trace_find_tap(const st_trace *t, const char *name) {
  for (int i = 0; i < t->n_taps; i++)
    if (!strcmp(t->taps[i].name, name)) return &t->taps[i];
  return NULL;
}

const st_trace_tap *st_trace_find_tap_id(const st_trace *t, st_tap_id id, int layer) {
  for (int i = 0; i < t->n_taps; i++)
    if (t->taps[i].id == id && t->taps[i].layer == layer) return &t->taps[i];
  return NULL;
}

size_t st_trace_row_elements(const st_trace_tap *tap) {
  size_t n = 1;
  for (int i = 1; i < tap->rank; i++) n *= (size_t)tap->shape[i];
  return n;
}

/* ---------------------------------------------------------------- open / close */

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static st_status open_in_process(const char *path, unsigned flags, st_trace **out) {
  *out = NULL;
  st_h5_quiet();
  struct stat sb;
  if (stat(path, &sb) != 0) {
    int err = errno;
    char part[4096];
    snprintf(part, sizeof part, "%s.part", path);
    if (err == ENOENT && stat(part, &sb) == 0)
      return st_fail(ST_ENOTFOUND, "trace %s does not exist, but %s does: that recording never "
                                   "finished (still running, aborted or crashed)", path, part);
    return st_fail(err == ENOENT ? ST_ENOTFOUND : ST_EIO, "trace %s: %s", path, strerror(err));
  }
  if (!S_ISREG(sb.st_mode)) return st_fail(ST_EINVAL, "trace %s is not a regular file", path);
  int is_part = ends_with(path, ".part");
  if (is_part && !(flags & ST_TRACE_OPEN_INCOMPLETE))
    return st_fail(ST_EFORMAT, "trace %s is an unfinished recording (.part: the recorder did "
                               "not finish it; it may still be running or have crashed)", path);
  st_trace *t = calloc(1, sizeof *t);
  if (!t) return st_fail(ST_ENOMEM, "opening trace %s", path);
  t->file = -1;
  t->file_bytes = (int64_t)sb.st_size;
  t->path = strdup(path);
  st_status st = ST_OK;
  if (!t->path) {
    st = st_fail(ST_ENOMEM, "opening trace %s", path);
    goto fail;
  }
  t->file = st_h5_open_untrusted(path);
  if (t->file < 0) {
    st = st_h5_fail(ST_EFORMAT, "trace %s is not a readable HDF5 file (truncated or corrupt?)", path);
    goto fail;
  }
  for (int i = 0; i < N_FILE_ATTRS; i++)
    if ((st = read_file_attr(t, i))) goto fail;
  const char *format = st_trace_attr(t, "format");
  if (!format || strcmp(format, ST_TRACE_FORMAT_NAME) != 0) {
    st = st_fail(ST_EFORMAT, "%s is an HDF5 file but not a sparsetrace trace (no format=\"%s\" "
                             "attribute)", path, ST_TRACE_FORMAT_NAME);
    goto fail;
  }
  int64_t version = st_trace_attr_int(t, "schema_version", -1);
  if (version < 1) {
    st = st_fail(ST_EFORMAT, "trace %s has no valid schema_version attribute", path);
    goto fail;
  }
  if (version > ST_TRACE_SCHEMA_VERSION) {
    st = st_fail(ST_EUNSUPPORTED, "trace %s has schema version %lld; this build reads up to %d "
                                  "(update sparsetrace)", path, (long long)version,
                 ST_TRACE_SCHEMA_VERSION);
    goto fail;
  }
  t->complete = !is_part && st_trace_attr_int(t, "complete", 0) == 1;
  if (!t->complete && !(flags & ST_TRACE_OPEN_INCOMPLETE)) {
    st = st_fail(ST_EFORMAT, "trace %s is incomplete: it has no complete mark (the recording "
                             "was interrupted before it finished)", path);
    goto fail;
  }
  if ((st = load_tokens(t)) || (st = load_taps(t))) goto fail;
  *out = t;
  return ST_OK;
fail:
  st_trace_close(t);
  return st;
}

#define PRECHECK_SECONDS 30
/* What the pre-check's child may allocate beyond what it holds at the fork: far more than any
** trace's metadata needs (its tokens, tap table and attribute strings), far less than a corrupt
** length that libhdf5 allocates before it reads. A variable-length string claiming 4 GiB made it
** allocate and touch 4 GiB, twice (child, then the caller's own open): 20 s and 4 GB of memory
** before the error. Under the cap the allocation fails at once. */
#define PRECHECK_HEADROOM ((rlim_t)1 << 30)

/* The figure after `key` (a line's start, "VmData:") in the /proc file at path, which states it
** in kB, in bytes; 0 when the file or the line is missing. Read with read(2): this runs in a
** child forked from a process that may have threads. */
static unsigned long long proc_bytes(const char *path, const char *key) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  size_t k = strlen(key);
  for (const char *line = buf; line;) {
    if (!strncmp(line, key, k)) return strtoull(line + k, NULL, 10) * 1024;
    line = strchr(line, '\n');
    if (line) line++;
  }
  return 0;
}

/* Lowers RLIMIT_DATA to the data held now plus PRECHECK_HEADROOM (never raises it). */
static void cap_data(void) {
  /* VmData: heap and private writable mappings, what RLIMIT_DATA counts */
  rlim_t now = (rlim_t)proc_bytes("/proc/self/status", "VmData:");
  struct rlimit r;
  if (now == 0 || getrlimit(RLIMIT_DATA, &r) != 0) return;
  rlim_t cap = now + PRECHECK_HEADROOM;
  if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur <= cap) return;
  r.rlim_cur = cap;
  setrlimit(RLIMIT_DATA, &r);
}

/* Runs open_in_process on path in a forked child, its memory capped (cap_data), that reports
** its status and message over a pipe and _exits (no atexit handlers, no stdio flush: the
** parent's buffers and files stay its own). Returns what the child found when it reported an
** error (the parent does not read the file again); ST_OK when the child found the trace sound
** (the caller then opens it itself); ST_EFORMAT naming the file when the child died without
** reporting or ran past PRECHECK_SECONDS; ST_OK without a child when pipe or fork fails. */
static st_status precheck_in_child(const char *path, unsigned flags) {
  int fds[2];
  if (pipe(fds) != 0) return ST_OK;
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return ST_OK;
  }
  if (pid == 0) {
    close(fds[0]);
    cap_data();
    st_trace *t = NULL; /* never closed: the kernel closes the file at _exit, sooner */
    char report[1 + 2048];
    st_h5_alloc_failed_clear();
    st_status st = open_in_process(path, flags, &t);
    /* libhdf5 could not allocate while the system had more than the cap to give: the cap
    ** refused it, so the file claims more than any trace's metadata. Any other failed
    ** allocation is the machine's shortage and stays "out of memory". */
    if (st == ST_ENOMEM && st_h5_alloc_failed() &&
        proc_bytes("/proc/meminfo", "MemAvailable:") > PRECHECK_HEADROOM) {
      char why[1536];
      const char *msg = st_errmsg(), *oom = strstr(msg, "out of memory: ");
      snprintf(why, sizeof why, "%s", oom ? oom + strlen("out of memory: ") : msg);
      st = st_fail(ST_EFORMAT, "trace %s is corrupt: reading its metadata needs more than %llu MiB: "
                   "%s", path, (unsigned long long)(PRECHECK_HEADROOM >> 20), why);
    }
    report[0] = (char)st;
    size_t len = 1;
    if (st != ST_OK) {
      const char *msg = st_errmsg();
      size_t m = strlen(msg);
      if (m > sizeof report - 1) m = sizeof report - 1;
      memcpy(report + 1, msg, m);
      len += m;
    }
    _exit(write(fds[1], report, len) == (ssize_t)len ? 0 : 1);
  }
  close(fds[1]);
  char report[1 + 2048 + 1];
  size_t got = 0;
  int ready = 1;
  while (got < sizeof report - 1) { /* the child writes once and exits: read to end of file */
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    do ready = poll(&p, 1, PRECHECK_SECONDS * 1000);
    while (ready < 0 && errno == EINTR);
    if (ready <= 0) break;
    ssize_t n = read(fds[0], report + got, sizeof report - 1 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  if (ready == 0) kill(pid, SIGKILL);
  int status = 0;
  pid_t done;
  do done = waitpid(pid, &status, 0);
  while (done < 0 && errno == EINTR);
  close(fds[0]);
  if (got >= 1) {
    st_status found = (st_status)(unsigned char)report[0];
    if (found == ST_OK) return ST_OK;
    report[got] = 0;
    return st_fail(found, "%s", report + 1);
  }
  if (ready < 0) return ST_OK; /* poll failed: open in process */
  if (ready == 0)
    return st_fail(ST_EFORMAT, "trace %s is corrupt: the HDF5 library was still reading its "
                               "metadata after %d s (stopped)", path, PRECHECK_SECONDS);
  if (done == pid && WIFSIGNALED(status))
    return st_fail(ST_EFORMAT, "trace %s is corrupt: the HDF5 library crashed reading it "
                               "(signal %d, %s)", path, WTERMSIG(status),
                   strsignal(WTERMSIG(status)));
  if (done == pid && WIFEXITED(status))
    return st_fail(ST_EFORMAT, "trace %s is corrupt: the HDF5 library failed reading it (a "
                               "process reading it exited with status %d)", path,
                   WEXITSTATUS(status));
  return ST_OK; /* the child's end is unknown (SIGCHLD ignored?): open in process */
}

st_status st_trace_open(const char *path, unsigned flags, st_trace **out) {
  *out = NULL;
  if (!(flags & ST_TRACE_OPEN_IN_PROCESS)) {
    st_status st = precheck_in_child(path, flags);
    if (st) return st;
  }
  return open_in_process(path, flags, out);
}

void st_trace_close(st_trace *t) {
  if (!t) return;
  if (t->file >= 0) H5Fclose(t->file);
  for (int i = 0; i < N_FILE_ATTRS; i++) free(t->attrs[i].text);
  for (int i = 0; t->positions && i < t->n_taps; i++) free(t->positions[i]);
  free(t->positions);
  free(t->tokens);
  free(t->taps);
  free(t->path);
  free(t);
}

/* ---------------------------------------------------------------- data */

static int tap_index(const st_trace *t, const st_trace_tap *tap) {
  if (tap < t->taps || tap >= t->taps + t->n_taps) return -1;
  return (int)(tap - t->taps);
}

/* Reads rows of tap converted to mem_type into out. */
static st_status read_rows(st_trace *t, const st_trace_tap *tap, int64_t row0, int64_t n_rows,
                           hid_t mem_type, void *out) {
  st_h5_quiet();
  if (tap_index(t, tap) < 0) return st_fail(ST_EINVAL, "tap does not belong to trace %s", t->path);
  if (row0 < 0 || n_rows < 0 || row0 + n_rows > tap->shape[0])
    return st_fail(ST_EINVAL, "trace %s: rows %lld..%lld outside tap %s (%lld rows)", t->path,
                   (long long)row0, (long long)(row0 + n_rows), tap->name, (long long)tap->shape[0]);
  if (n_rows == 0 || st_trace_row_elements(tap) == 0) return ST_OK;
  char path[ST_TRACE_MAX_NAME + 8];
  snprintf(path, sizeof path, "/taps/%s", tap->name);
  st_status st = ST_OK;
  hsize_t start[ST_TRACE_MAX_RANK] = {0}, count[ST_TRACE_MAX_RANK];
  for (int i = 0; i < tap->rank; i++) count[i] = (hsize_t)tap->shape[i];
  start[0] = (hsize_t)row0;
  count[0] = (hsize_t)n_rows;
  hid_t d = H5Dopen2(t->file, path, H5P_DEFAULT);
  hid_t fspace = d < 0 ? -1 : H5Dget_space(d);
  hid_t mspace = H5Screate_simple(tap->rank, count, NULL);
  if (fspace < 0 || mspace < 0 ||
      H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
      H5Dread(d, mem_type, mspace, fspace, H5P_DEFAULT, out) < 0)
    st = st_h5_fail(ST_EFORMAT, "trace %s: reading rows %lld..%lld of tap %s (corrupt?)", t->path,
                    (long long)row0, (long long)(row0 + n_rows), tap->name);
  if (mspace >= 0) H5Sclose(mspace);
  if (fspace >= 0) H5Sclose(fspace);
  if (d >= 0) H5Dclose(d);
  return st;
}

st_status st_trace_read_f32(st_trace *t, const st_trace_tap *tap, int64_t row0, int64_t n_rows,
                            float *out) {
  switch (tap->dtype) {
  case ST_F32: case ST_F64: case ST_F16: case ST_I32: case ST_I64: case ST_I8: case ST_U8:
  case ST_BOOL:
    return read_rows(t, tap, row0, n_rows, H5T_NATIVE_FLOAT, out);
  case ST_BF16: {
    /* Raw bits stored as uint16: read them into the tail half of out, widen in place. */
    size_t n = (size_t)n_rows * st_trace_row_elements(tap);
    uint16_t *raw = (uint16_t *)(out + n) - n;
    st_status st = read_rows(t, tap, row0, n_rows, H5T_NATIVE_UINT16, raw);
    if (st) return st;
    for (size_t i = 0; i < n; i++) {
      uint32_t bits = (uint32_t)raw[i] << 16;
      memcpy(&out[i], &bits, sizeof bits);
    }
    return ST_OK;
  }
  default:
    return st_fail(ST_EUNSUPPORTED, "trace %s: tap %s is %s, which this reader cannot widen to "
                                    "float32", t->path, tap->name, st_dtype_name(tap->dtype));
  }
}

st_status st_trace_read_i32(st_trace *t, const st_trace_tap *tap, int64_t row0, int64_t n_rows,
                            int32_t *out) {
  switch (tap->dtype) {
  case ST_I32: case ST_I64: case ST_I8: case ST_U8: case ST_BOOL:
    return read_rows(t, tap, row0, n_rows, H5T_NATIVE_INT32, out);
  default:
    return st_fail(ST_EINVAL, "trace %s: tap %s is %s; read it as float32", t->path, tap->name,
                   st_dtype_name(tap->dtype));
  }
}

/* Loads (once) the positions of tap i. */
static st_status load_positions(st_trace *t, int i) {
  if (t->positions[i]) return ST_OK;
  const st_trace_tap *tap = &t->taps[i];
  int64_t n = tap->shape[0];
  int64_t *pos = malloc((size_t)ST_MAX(n, 1) * sizeof *pos);
  if (!pos) return st_fail(ST_ENOMEM, "positions of tap %s", tap->name);
  if (tap->row_axis || !tap->has_positions) {
    for (int64_t r = 0; r < n; r++) pos[r] = r;
    t->positions[i] = pos;
    return ST_OK;
  }
  char path[ST_TRACE_MAX_NAME + 16];
  snprintf(path, sizeof path, "/positions/%s", tap->name);
  st_h5_quiet();
  st_status st = ST_OK;
  hid_t d = H5Dopen2(t->file, path, H5P_DEFAULT);
  hid_t space = d < 0 ? -1 : H5Dget_space(d);
  hsize_t len = 0;
  if (space < 0 || H5Sget_simple_extent_ndims(space) != 1 ||
      H5Sget_simple_extent_dims(space, &len, NULL) < 0 || (int64_t)len != n)
    st = st_h5_fail(ST_EFORMAT, "trace %s: %s missing or not %lld long", t->path, path, (long long)n);
  else if (n && H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, pos) < 0)
    st = st_h5_fail(ST_EFORMAT, "trace %s: reading %s", t->path, path);
  if (space >= 0) H5Sclose(space);
  if (d >= 0) H5Dclose(d);
  if (st) {
    free(pos);
    return st;
  }
  t->positions[i] = pos;
  return ST_OK;
}

st_status st_trace_read_positions(st_trace *t, const st_trace_tap *tap, int64_t *out) {
  int i = tap_index(t, tap);
  if (i < 0) return st_fail(ST_EINVAL, "tap does not belong to trace %s", t->path);
  st_status st = load_positions(t, i);
  if (st) return st;
  memcpy(out, t->positions[i], (size_t)tap->shape[0] * sizeof *out);
  return ST_OK;
}

st_status st_trace_find_position(st_trace *t, const st_trace_tap *tap, int64_t position,
                                 int64_t *row) {
  int i = tap_index(t, tap);
  if (i < 0) return st_fail(ST_EINVAL, "tap does not belong to trace %s", t->path);
  st_status st = load_positions(t, i);
  if (st) return st;
  for (int64_t r = 0; r < tap->shape[0]; r++)
    if (t->positions[i][r] == position) {
      *row = r;
      return ST_OK;
    }
  return st_fail(ST_ENOTFOUND, "trace %s: tap %s holds no row for %s %lld", t->path, tap->name,
                 tap->row_axis ? "compressed row" : "position", (long long)position);
}

st_status st_trace_check_tap(const st_trace *t, const st_trace_tap *tap) {
  int64_t total = 1;
  for (int i = 0; i < tap->rank; i++) total *= tap->shape[i];
  if (tap->stats.count >= 0 && tap->stats.count != total)
    return st_fail(ST_EFORMAT, "%s: tap %s holds %lld elements (shape[0] = %lld rows) but its "
                               "count attribute, written when the trace was finished, says %lld: "
                               "the dataset was changed after recording", t->path, tap->name,
                   (long long)total, (long long)tap->shape[0], (long long)tap->stats.count);
  if (!tap->row_axis && !tap->has_positions && t->n_tokens > 0 && tap->shape[0] > t->n_tokens)
    return st_fail(ST_EFORMAT, "%s: tap %s has %lld position rows, more than the trace's %lld "
                               "tokens", t->path, tap->name, (long long)tap->shape[0],
                   (long long)t->n_tokens);
  return ST_OK;
}

/* ---------------------------------------------------------------- content digest */

st_status st_trace_content_digest(st_trace *t, char *out) {
  st_h5_quiet();
  st_status st = st_h5_content_digest(t->file, out);
  if (st) st_fail_context(st, "trace %s: ", t->path);
  return st;
}

st_status st_trace_verify_digest(st_trace *t, const char *expected, int *verified, char *computed) {
  if (verified) *verified = 0;
  char now[ST_H5_DIGEST_LEN];
  st_status st = st_trace_content_digest(t, now);
  if (st) return st;
  if (computed) memcpy(computed, now, sizeof now);
  const char *attr = st_trace_attr(t, "content_digest");
  if (attr && strcmp(attr, now) != 0)
    return st_fail(ST_EFORMAT, "trace %s changed after recording: its content digest is %s, but "
                               "the writer recorded %s (attribute content_digest)",
                   t->path, now, attr);
  if (expected && *expected && strcmp(expected, now) != 0)
    return st_fail(ST_EFORMAT, "trace %s is not the trace indexed for run %s (changed after "
                               "recording, or another trace): its content digest is %s, the index "
                               "records %s for that run", t->path,
                   st_trace_attr(t, "run_id") ? st_trace_attr(t, "run_id") : "?", now, expected);
  if (verified) *verified = attr != NULL || (expected && *expected);
  return ST_OK;
}
