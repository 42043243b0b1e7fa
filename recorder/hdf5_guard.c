/*
** hdf5_guard.c — a read-only POSIX file driver for libhdf5 that checks what libhdf5 1.10 would
** otherwise trust (see hdf5_util.h, st_h5_open_untrusted).
**
** Traces come from other machines, other people and crashed disks, and libhdf5 1.10 (Debian 12)
** does not survive every corrupt file: decoding a global heap collection (where variable-length
** strings live: every string attribute of a trace) it walks the objects by their stored sizes,
** and a free-space object of size 0 sends that walk nowhere, forever (found by
** tests/fuzz/fuzz_trace.c; tests/data/hostile/gheap-empty-free-object.h5). Nothing a caller
** passes to the API avoids it: the first read of any string attribute loads the collection.
**
** A file driver sees every byte libhdf5 reads. This one is the sec2 driver's read path (pread at
** an address, zeros past the end of the file) plus one check: a read that starts with a global
** heap collection's header ("GCOL", version 1) must hold a collection that the 1.10 decoder
** walks to its end, every object inside it, each one moving the walk forward. One that does not
** fails the read; libhdf5 turns that into an ordinary error on the API call that needed it, and
** the reason is kept for st_h5_fail's message. libhdf5 1.10 reads collections as raw data
** (H5FD_MEM_DRAW, like dataset bytes), so the header is what tells them apart: raw tap data
** whose read begins with those 5 bytes and then fails the walk would be refused too, a chance
** near 2^-40 per read that the trace format makes smaller still (no dataset holds text). The
** metadata accumulator is off (the driver does not advertise it), so a collection always
** arrives as a read of its own, never inside a larger block read for something else; the page
** cache makes the extra reads cheap (measured in the commit that added this file).
**
** Read-only: writes fail. The writer keeps the default driver. The driver is written against
** libhdf5 1.10's driver table (H5FD_class_t changes in later releases); other versions get the
** default driver and no check.
*/
#include "hdf5_util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <H5FDpublic.h>

/* Why the last read was refused on this thread ("" when none); st_h5_fail appends it. */
static _Thread_local char guard_reason[256];

const char *st_h5_guard_reason(void) { return guard_reason; }
void st_h5_guard_clear(void) { guard_reason[0] = 0; }

/* ---------------------------------------------------------------- global heap check */

static uint64_t decode_le(const unsigned char *p, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; i++) {
    if (i >= 8) {
      if (p[i]) return UINT64_MAX; /* more than 64 bits: absurd for any length in a file */
      continue;
    }
    v |= (uint64_t)p[i] << (8 * i);
  }
  return v;
}

static uint64_t align8(uint64_t v) {
  return v > UINT64_MAX - 7 ? UINT64_MAX : (v + 7) & ~(uint64_t)7;
}

/* Checks buf[0..n), read at addr as global heap metadata, against the walk that libhdf5 1.10's
** decoder makes: header (GCOL, version, 3 reserved bytes, collection size), then objects of a
** header (index, references, 4 reserved, size) each, the walk advancing by header + aligned size
** (index 0, the free space, by its size alone), a tail too short for a header being free space.
** Each object must fit in the collection and move the walk forward. Only buf[0..n) is read:
** the walk stops at an object header past n (check_collection passes whole collections).
** lsize: bytes of a length in this file. Returns 0, or -1 with guard_reason set. */
static int check_gheap(const unsigned char *buf, size_t n, unsigned lsize, haddr_t addr) {
  uint64_t hdr = align8(8 + (uint64_t)lsize), obj_hdr = align8(8 + (uint64_t)lsize);
  if (n < 8 + lsize || memcmp(buf, "GCOL\1", 5) != 0) return 0; /* not a collection */
  uint64_t size = decode_le(buf + 8, lsize);
  if (size < hdr) {
    snprintf(guard_reason, sizeof guard_reason, "global heap collection at %llu claims %llu bytes, "
             "less than its own header", (unsigned long long)addr, (unsigned long long)size);
    return -1;
  }
  uint64_t p = hdr;
  while (p < size) {
    if (size - p < obj_hdr) break;  /* free tail without a header */
    if (p + obj_hdr > n) return 0; /* the rest is checked when the whole collection is read */
    unsigned idx = (unsigned)buf[p] | (unsigned)buf[p + 1] << 8;
    uint64_t osize = decode_le(buf + p + 8, lsize);
    uint64_t need = idx ? (osize > size ? UINT64_MAX : obj_hdr + align8(osize)) : osize;
    if (need < obj_hdr || need > size - p) {
      snprintf(guard_reason, sizeof guard_reason, "global heap collection at %llu (%llu bytes): "
               "object %u at offset %llu claims %llu bytes, %s", (unsigned long long)addr,
               (unsigned long long)size, idx, (unsigned long long)p, (unsigned long long)osize,
               need < obj_hdr ? "less than its own header" : "past the end of the collection");
      return -1;
    }
    p += need;
  }
  return 0;
}

/* ---------------------------------------------------------------- the driver (libhdf5 1.10) */

#if H5_VERSION_GE(1, 10, 0) && !H5_VERSION_GE(1, 12, 0)

typedef struct guard_file {
  H5FD_t pub; /* first: libhdf5 sees this part */
  int fd;
  haddr_t eoa, eof;
  dev_t dev;
  ino_t ino;
  unsigned lsize; /* bytes of a length (superblock); 0: unknown, heaps not checked */
} guard_file;

static herr_t fail(H5E_major_t major, H5E_minor_t minor, const char *what) {
  H5Epush2(H5E_DEFAULT, __FILE__, "st_guard", __LINE__, H5E_ERR_CLS, major, minor, "%s", what);
  return -1;
}

/* The size of lengths from the superblock, found as libhdf5 does (at 0, 512, 1024, ...): 0 when
** there is none or it is odd, which leaves heaps unchecked (libhdf5 refuses such a file). */
static unsigned superblock_lsize(int fd, haddr_t eof) {
  static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  for (haddr_t at = 0; at + 16 <= eof; at = at ? at * 2 : 512) {
    unsigned char b[16];
    if (pread(fd, b, sizeof b, (off_t)at) != (ssize_t)sizeof b) return 0;
    if (memcmp(b, sig, 8) != 0) continue;
    unsigned v = b[8] <= 1 ? b[14] : b[10]; /* versions 0-1: byte 14; 2-3: byte 10 */
    return v == 2 || v == 4 || v == 8 || v == 16 ? v : 0;
  }
  return 0;
}

/* The largest collection checked by reading it whole (a trace's strings need kilobytes). */
#define MAX_CHECKED_COLLECTION ((uint64_t)256 << 20)

/* Checks the collection at addr whose first n bytes (buf) libhdf5 just read, reading the rest
** itself when the collection is longer: libhdf5 may fetch only the remainder next, which does
** not start with the header. 0 or -1 (guard_reason set). */
static int check_collection(guard_file *f, const unsigned char *buf, size_t n, haddr_t addr) {
  unsigned ls = f->lsize;
  if (n < 8 + ls || memcmp(buf, "GCOL\1", 5) != 0) return 0; /* raw data, or refused by libhdf5 */
  uint64_t size = decode_le(buf + 8, ls);
  if (size <= n) return check_gheap(buf, n, ls, addr);
  if (size > MAX_CHECKED_COLLECTION || size > f->eoa || addr > f->eoa - size) {
    snprintf(guard_reason, sizeof guard_reason, "global heap collection at %llu claims %llu "
             "bytes, past the end of the file's data (%llu bytes)", (unsigned long long)addr,
             (unsigned long long)size, (unsigned long long)f->eoa);
    return -1;
  }
  unsigned char *whole = malloc((size_t)size);
  if (!whole) {
    snprintf(guard_reason, sizeof guard_reason, "no memory to check the global heap collection "
             "at %llu (%llu bytes)", (unsigned long long)addr, (unsigned long long)size);
    return -1;
  }
  size_t done = 0;
  while (done < size) {
    ssize_t got = pread(f->fd, whole + done, (size_t)size - done, (off_t)(addr + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += (size_t)got;
  }
  memset(whole + done, 0, (size_t)size - done); /* past the end of the file: zeros */
  int rc = check_gheap(whole, (size_t)size, ls, addr);
  free(whole);
  return rc;
}

static H5FD_t *guard_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
  (void)fapl;
  (void)maxaddr;
  if (flags & (H5F_ACC_RDWR | H5F_ACC_TRUNC | H5F_ACC_CREAT | H5F_ACC_EXCL)) {
    fail(H5E_ARGS, H5E_BADVALUE, "the guarded driver is read-only");
    return NULL;
  }
  int fd = open(name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    fail(H5E_FILE, H5E_CANTOPENFILE, strerror(errno));
    return NULL;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    fail(H5E_FILE, H5E_CANTOPENFILE, strerror(errno));
    close(fd);
    return NULL;
  }
  guard_file *f = calloc(1, sizeof *f);
  if (!f) {
    fail(H5E_RESOURCE, H5E_NOSPACE, "out of memory for the file driver's state");
    close(fd);
    return NULL;
  }
  f->fd = fd;
  f->eof = (haddr_t)sb.st_size;
  f->dev = sb.st_dev;
  f->ino = sb.st_ino;
  f->lsize = superblock_lsize(fd, f->eof);
  return &f->pub;
}

static herr_t guard_close(H5FD_t *file) {
  guard_file *f = (guard_file *)file;
  int rc = close(f->fd);
  free(f);
  return rc == 0 ? 0 : fail(H5E_IO, H5E_CANTCLOSEFILE, strerror(errno));
}

static int guard_cmp(const H5FD_t *a, const H5FD_t *b) {
  const guard_file *x = (const guard_file *)a, *y = (const guard_file *)b;
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
  return 0;
}

static herr_t guard_query(const H5FD_t *file, unsigned long *flags) {
  (void)file;
  *flags = H5FD_FEAT_DATA_SIEVE; /* raw data may be sieved; metadata is never accumulated */
  return 0;
}

static haddr_t guard_get_eoa(const H5FD_t *file, H5FD_mem_t type) {
  (void)type;
  return ((const guard_file *)file)->eoa;
}

static herr_t guard_set_eoa(H5FD_t *file, H5FD_mem_t type, haddr_t addr) {
  (void)type;
  ((guard_file *)file)->eoa = addr;
  return 0;
}

static haddr_t guard_get_eof(const H5FD_t *file, H5FD_mem_t type) {
  (void)type;
  return ((const guard_file *)file)->eof;
}

static herr_t guard_get_handle(H5FD_t *file, hid_t fapl, void **handle) {
  (void)fapl;
  *handle = &((guard_file *)file)->fd;
  return 0;
}

static herr_t guard_read(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size,
                         void *buf) {
  (void)dxpl;
  guard_file *f = (guard_file *)file;
  if (addr == HADDR_UNDEF || addr > (haddr_t)INT64_MAX || size > (haddr_t)INT64_MAX - addr)
    return fail(H5E_ARGS, H5E_OVERFLOW, "address out of range");
  unsigned char *out = buf;
  size_t done = 0;
  while (done < size) {
    ssize_t got = pread(f->fd, out + done, size - done, (off_t)(addr + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return fail(H5E_IO, H5E_READERROR, strerror(errno));
    if (got == 0) { /* past the end of the file: zeros, as sec2 */
      memset(out + done, 0, size - done);
      break;
    }
    done += (size_t)got;
  }
  if ((type == H5FD_MEM_GHEAP || type == H5FD_MEM_DRAW) && f->lsize &&
      check_collection(f, out, size, addr) != 0)
    return fail(H5E_HEAP, H5E_BADVALUE, guard_reason);
  return 0;
}

static herr_t guard_write(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size,
                          const void *buf) {
  (void)file, (void)type, (void)dxpl, (void)addr, (void)size, (void)buf;
  return fail(H5E_IO, H5E_WRITEERROR, "the guarded driver is read-only");
}

static const H5FD_class_t guard_class = {
  .name = "sparsetrace_guard",
  .maxaddr = (haddr_t)INT64_MAX,
  .fc_degree = H5F_CLOSE_WEAK,
  .open = guard_open,
  .close = guard_close,
  .cmp = guard_cmp,
  .query = guard_query,
  .get_eoa = guard_get_eoa,
  .set_eoa = guard_set_eoa,
  .get_eof = guard_get_eof,
  .get_handle = guard_get_handle,
  .read = guard_read,
  .write = guard_write,
  .fl_map = H5FD_FLMAP_DICHOTOMY,
};

/* The driver and a file access list using it: made once, never closed (the library releases
** them at exit), so no HDF5 call runs between a failed H5Fopen and the caller's st_h5_fail (each
** API call clears the error stack). */
static hid_t guard_fapl = -1;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;

static void make_guard_fapl(void) {
  hid_t id = H5FDregister(&guard_class);
  hid_t fapl = id < 0 ? -1 : H5Pcreate(H5P_FILE_ACCESS);
  if (fapl >= 0 && H5Pset_driver(fapl, id, NULL) < 0) {
    H5Pclose(fapl);
    fapl = -1;
  }
  guard_fapl = fapl;
}

hid_t st_h5_open_untrusted(const char *path) {
  st_h5_guard_clear();
  pthread_once(&guard_once, make_guard_fapl);
  if (guard_fapl < 0) return -1;
  return H5Fopen(path, H5F_ACC_RDONLY, guard_fapl);
}

#else

hid_t st_h5_open_untrusted(const char *path) {
  st_h5_guard_clear();
  return H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
}

#endif
