/* hdf5_util.c — HDF5 error translation, attributes and dtype mapping (see hdf5_util.h). */
#include "hdf5_util.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void st_h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* libhdf5 1.10 keeps a file whose H5Fclose failed (a full disk, the file size limit: the close
** must flush and cannot) registered after freeing it; the library's exit handler then closes it
** again and the process dies of SIGSEGV in H5F__close_cb, after it has reported the error. The
** handler only releases memory the process is about to lose anyway (the writer closes every file
** it opens; the reader too), so it is not installed: before main, hence before any HDF5 call. */
__attribute__((constructor)) static void h5_no_exit_handler(void) { H5dont_atexit(); }

typedef struct stack_text {
  char buf[1024];
  size_t len;
  unsigned n;
  int out_of_memory; /* a frame says an allocation failed */
  int sys_errno; /* the errno a file driver frame reported ("errno = 28, ..."), 0 if none */
} stack_text;

/* H5Ewalk2 callback: appends "func: desc" for the first few frames, innermost last, and keeps
** the errno of a file driver frame wherever it is (a full disk is often deeper than 4 frames). */
static herr_t walk_frame(unsigned n, const H5E_error2_t *e, void *data) {
  stack_text *t = data;
  if (e->min_num == H5E_CANTALLOC || e->min_num == H5E_NOSPACE) t->out_of_memory = 1;
  const char *at = e->desc ? strstr(e->desc, "errno = ") : NULL;
  if (at && !t->sys_errno) t->sys_errno = atoi(at + 8);
  if (t->n++ >= 4 || t->len + 8 >= sizeof t->buf) return 0;
  int w = snprintf(t->buf + t->len, sizeof t->buf - t->len, "%s%s: %s", t->len ? " <- " : "",
                   e->func_name ? e->func_name : "?", e->desc ? e->desc : "?");
  if (w > 0) t->len = ST_MIN(t->len + (size_t)w, sizeof t->buf - 1);
  return 0;
}

static _Thread_local int h5_alloc_failed;
int st_h5_alloc_failed(void) { return h5_alloc_failed; }
void st_h5_alloc_failed_clear(void) { h5_alloc_failed = 0; }

st_status st_h5_fail(st_status s, const char *fmt, ...) {
  char head[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(head, sizeof head, fmt, ap);
  va_end(ap);
  stack_text t = {.len = 0, .n = 0, .out_of_memory = 0, .sys_errno = 0};
  t.buf[0] = 0;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_frame, &t);
  H5Eclear2(H5E_DEFAULT);
  /* The cause a user can act on first: a full disk or the file size limit, by name. */
  const char *cause = st_io_errno_cause(t.sys_errno);
  if (cause) {
    size_t n = strlen(head);
    snprintf(head + n, sizeof head - n, ": %s", cause);
  }
  char reason[256];
  snprintf(reason, sizeof reason, "%s", st_h5_guard_reason());
  st_h5_guard_clear();
  if (t.out_of_memory && !cause) s = ST_ENOMEM; /* not the file's fault, whatever head guessed */
  h5_alloc_failed |= t.out_of_memory && !cause;
  if (*reason && t.len) return st_fail(s, "%s: %s (%s)", head, reason, t.buf);
  if (*reason) return st_fail(s, "%s: %s", head, reason);
  if (t.len) return st_fail(s, "%s: %s", head, t.buf);
  return st_fail(s, "%s", head);
}

/* Opens a fresh attribute, deleting any of the same name first. */
static hid_t attr_create(hid_t obj, const char *name, hid_t type, hid_t space) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  return H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
}

st_status st_h5_attr_write_string(hid_t obj, const char *name, const char *value) {
  if (!value) return ST_OK;
  st_status st = ST_OK;
  hid_t type = H5Tcopy(H5T_C_S1), space = -1, attr = -1;
  if (type < 0 || H5Tset_size(type, H5T_VARIABLE) < 0 || H5Tset_cset(type, H5T_CSET_UTF8) < 0) {
    st = st_h5_fail(ST_EHDF5, "string type for attribute '%s'", name);
    goto out;
  }
  space = H5Screate(H5S_SCALAR);
  attr = space < 0 ? -1 : attr_create(obj, name, type, space);
  if (attr < 0 || H5Awrite(attr, type, &value) < 0)
    st = st_h5_fail(ST_EHDF5, "writing attribute '%s'", name);
out:
  if (attr >= 0) H5Aclose(attr);
  if (space >= 0) H5Sclose(space);
  if (type >= 0) H5Tclose(type);
  return st;
}

static st_status attr_write_scalar(hid_t obj, const char *name, hid_t file_type, hid_t mem_type,
                                   const void *value) {
  st_status st = ST_OK;
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = space < 0 ? -1 : attr_create(obj, name, file_type, space);
  if (attr < 0 || H5Awrite(attr, mem_type, value) < 0)
    st = st_h5_fail(ST_EHDF5, "writing attribute '%s'", name);
  if (attr >= 0) H5Aclose(attr);
  if (space >= 0) H5Sclose(space);
  return st;
}

st_status st_h5_attr_write_int(hid_t obj, const char *name, int64_t value) {
  return attr_write_scalar(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

st_status st_h5_attr_write_double(hid_t obj, const char *name, double value) {
  return attr_write_scalar(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

/* Opens attribute name of obj; -2 when absent (no message), -1 on error (message set). */
static hid_t attr_open(hid_t obj, const char *name) {
  htri_t exists = H5Aexists(obj, name);
  if (exists == 0) return -2;
  if (exists < 0) {
    st_h5_fail(ST_EHDF5, "looking up attribute '%s'", name);
    return -1;
  }
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) st_h5_fail(ST_EHDF5, "opening attribute '%s'", name);
  return a;
}

st_status st_h5_attr_read_string(hid_t obj, const char *name, char **out) {
  *out = NULL;
  hid_t attr = attr_open(obj, name);
  if (attr == -2) return ST_ENOTFOUND;
  if (attr < 0) return ST_EHDF5;
  st_status st = ST_OK;
  hid_t ftype = H5Aget_type(attr), mtype = -1, space = H5Aget_space(attr);
  if (ftype < 0 || space < 0 || H5Tget_class(ftype) != H5T_STRING ||
      H5Sget_simple_extent_npoints(space) != 1) {
    st = st_fail(ST_EFORMAT, "attribute '%s' is not a single string", name);
    goto out;
  }
  if (H5Tis_variable_str(ftype) > 0) {
    mtype = H5Tcopy(H5T_C_S1);
    H5Tset_size(mtype, H5T_VARIABLE);
    H5Tset_cset(mtype, H5Tget_cset(ftype));
    char *value = NULL;
    if (H5Aread(attr, mtype, &value) < 0) {
      st = st_h5_fail(ST_EHDF5, "reading attribute '%s'", name);
      goto out;
    }
    *out = strdup(value ? value : "");
    H5free_memory(value);
  } else {
    size_t size = H5Tget_size(ftype);
    mtype = H5Tcopy(H5T_C_S1);
    H5Tset_size(mtype, size + 1); /* room for the terminator HDF5 adds (NULLTERM) */
    H5Tset_strpad(mtype, H5T_STR_NULLTERM);
    char *value = calloc(size + 2, 1);
    if (!value) {
      st = st_fail(ST_ENOMEM, "reading attribute '%s'", name);
      goto out;
    }
    if (H5Aread(attr, mtype, value) < 0) {
      free(value);
      st = st_h5_fail(ST_EHDF5, "reading attribute '%s'", name);
      goto out;
    }
    *out = value;
  }
  if (!*out) st = st_fail(ST_ENOMEM, "reading attribute '%s'", name);
out:
  if (mtype >= 0) H5Tclose(mtype);
  if (ftype >= 0) H5Tclose(ftype);
  if (space >= 0) H5Sclose(space);
  H5Aclose(attr);
  return st;
}

static st_status attr_read_scalar(hid_t obj, const char *name, hid_t mem_type, void *out) {
  hid_t attr = attr_open(obj, name);
  if (attr == -2) return ST_ENOTFOUND;
  if (attr < 0) return ST_EHDF5;
  st_status st = ST_OK;
  hid_t ftype = H5Aget_type(attr), space = H5Aget_space(attr);
  H5T_class_t cls = ftype < 0 ? H5T_NO_CLASS : H5Tget_class(ftype);
  if (space < 0 || (cls != H5T_INTEGER && cls != H5T_FLOAT) ||
      H5Sget_simple_extent_npoints(space) != 1)
    st = st_fail(ST_EFORMAT, "attribute '%s' is not a single number", name);
  else if (H5Aread(attr, mem_type, out) < 0)
    st = st_h5_fail(ST_EHDF5, "reading attribute '%s'", name);
  if (ftype >= 0) H5Tclose(ftype);
  if (space >= 0) H5Sclose(space);
  H5Aclose(attr);
  return st;
}

st_status st_h5_attr_read_int(hid_t obj, const char *name, int64_t *out) {
  return attr_read_scalar(obj, name, H5T_NATIVE_INT64, out);
}

st_status st_h5_attr_read_double(hid_t obj, const char *name, double *out) {
  return attr_read_scalar(obj, name, H5T_NATIVE_DOUBLE, out);
}

/* IEEE binary16, little endian: HDF5 has no predefined one in 1.10. Created once, never closed
** (the library releases it at exit). */
static hid_t half_type = -1;
static pthread_once_t half_once = PTHREAD_ONCE_INIT;

static void make_half_type(void) {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  if (t < 0) return;
  if (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_precision(t, 16) < 0 ||
      H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, 15) < 0) {
    H5Tclose(t);
    return;
  }
  half_type = t;
}

hid_t st_h5_file_type(st_dtype t) {
  switch (t) {
  case ST_F32: return H5T_IEEE_F32LE;
  case ST_F64: return H5T_IEEE_F64LE;
  case ST_I32: return H5T_STD_I32LE;
  case ST_I64: return H5T_STD_I64LE;
  case ST_I8: return H5T_STD_I8LE;
  case ST_U8: case ST_BOOL: case ST_F8_E4M3FN: case ST_F8_E4M3FNUZ: case ST_F8_E8M0:
    return H5T_STD_U8LE;
  case ST_BF16: return H5T_STD_U16LE;
  case ST_F16:
    pthread_once(&half_once, make_half_type);
    if (half_type < 0) st_h5_fail(ST_EHDF5, "creating the float16 type");
    return half_type;
  case ST_F4_E2M1: case ST_DTYPE_COUNT: break;
  }
  st_fail(ST_EUNSUPPORTED, "dtype %s cannot be stored in a trace", st_dtype_name(t));
  return -1;
}

hid_t st_h5_mem_type(st_dtype t) {
  switch (t) {
  case ST_F32: return H5T_NATIVE_FLOAT;
  case ST_F64: return H5T_NATIVE_DOUBLE;
  case ST_I32: return H5T_NATIVE_INT32;
  case ST_I64: return H5T_NATIVE_INT64;
  case ST_I8: return H5T_NATIVE_INT8;
  case ST_U8: case ST_BOOL: case ST_F8_E4M3FN: case ST_F8_E4M3FNUZ: case ST_F8_E8M0:
    return H5T_NATIVE_UINT8;
  case ST_BF16: return H5T_NATIVE_UINT16;
  case ST_F16: return st_h5_file_type(ST_F16); /* raw half bits, x86/arm hosts are little endian */
  case ST_F4_E2M1: case ST_DTYPE_COUNT: break;
  }
  st_fail(ST_EUNSUPPORTED, "dtype %s cannot be stored in a trace", st_dtype_name(t));
  return -1;
}

/* ---------------------------------------------------------------- content digest */

#define FNV64_OFFSET 0xcbf29ce484222325ull
#define FNV64_PRIME 0x100000001b3ull
#define DIGEST_BLOCK_BYTES ((size_t)8 << 20)

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= FNV64_PRIME;
  }
  return h;
}

static uint64_t fnv1a_i64(uint64_t h, int64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)v >> (8 * i));
  return fnv1a(h, b, 8);
}

typedef struct name_list {
  char **names;
  size_t n, cap;
  int failed;
} name_list;

#if H5_VERSION_GE(1, 12, 0)
static herr_t collect_dataset(hid_t root, const char *name, const H5L_info2_t *info, void *data) {
#else
static herr_t collect_dataset(hid_t root, const char *name, const H5L_info_t *info, void *data) {
#endif
  name_list *l = data;
  if (info->type != H5L_TYPE_HARD) return 0;
  H5O_info_t oi;
#if H5_VERSION_GE(1, 12, 0)
  if (H5Oget_info_by_name3(root, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return -1;
#else
  if (H5Oget_info_by_name2(root, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return -1;
#endif
  if (oi.type != H5O_TYPE_DATASET) return 0;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    char **grown = realloc(l->names, cap * sizeof *grown);
    if (!grown) return l->failed = 1, -1;
    l->names = grown;
    l->cap = cap;
  }
  size_t len = strlen(name);
  char *full = malloc(len + 2);
  if (!full) return l->failed = 1, -1;
  full[0] = '/';
  memcpy(full + 1, name, len + 1);
  l->names[l->n++] = full;
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "f4le", "i8le", "u1le", "f2be", ...; other classes "c<class>_<size>". */
static void type_tag(hid_t type, char *out, size_t n) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  const char *order = H5Tget_order(type) == H5T_ORDER_BE ? "be" : "le";
  if (cls == H5T_FLOAT) snprintf(out, n, "f%zu%s", size, order);
  else if (cls == H5T_INTEGER)
    snprintf(out, n, "%c%zu%s", H5Tget_sign(type) == H5T_SGN_NONE ? 'u' : 'i', size, order);
  else snprintf(out, n, "c%d_%zu", (int)cls, size);
}

static st_status digest_dataset(hid_t file, const char *name, uint64_t *h, unsigned char *buf) {
  st_status st = ST_OK;
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  hid_t type = d < 0 ? -1 : H5Dget_type(d);
  hid_t space = d < 0 ? -1 : H5Dget_space(d);
  hid_t mspace = -1, fspace = -1;
  if (d < 0 || type < 0 || space < 0) {
    st = st_h5_fail(ST_EFORMAT, "digest: opening dataset %s", name);
    goto out;
  }
  if (H5Tis_variable_str(type) > 0 || H5Tget_class(type) == H5T_VLEN) {
    st = st_fail(ST_EUNSUPPORTED, "digest: dataset %s has a variable-length type", name);
    goto out;
  }
  char tag[32];
  type_tag(type, tag, sizeof tag);
  int rank = H5Sget_simple_extent_ndims(space);
  hsize_t dims[H5S_MAX_RANK];
  if (rank < 0 || H5Sget_simple_extent_dims(space, dims, NULL) < 0) {
    st = st_h5_fail(ST_EFORMAT, "digest: dataset %s has no simple extent", name);
    goto out;
  }
  *h = fnv1a(*h, name, strlen(name) + 1);
  *h = fnv1a(*h, tag, strlen(tag) + 1);
  *h = fnv1a_i64(*h, rank);
  size_t elem = H5Tget_size(type), row_bytes = elem;
  for (int i = 0; i < rank; i++) {
    *h = fnv1a_i64(*h, (int64_t)dims[i]);
    if (i) row_bytes *= (size_t)dims[i];
  }
  if (rank == 0) {
    if (elem > DIGEST_BLOCK_BYTES) {
      st = st_fail(ST_EUNSUPPORTED, "digest: dataset %s has %zu-byte elements", name, elem);
      goto out;
    }
    if (H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
      st = st_h5_fail(ST_EFORMAT, "digest: reading dataset %s", name);
      goto out;
    }
    *h = fnv1a(*h, buf, elem);
    goto out;
  }
  if (row_bytes == 0 || dims[0] == 0) goto out;
  hsize_t rows_per = row_bytes >= DIGEST_BLOCK_BYTES ? 1 : DIGEST_BLOCK_BYTES / row_bytes;
  unsigned char *big = NULL; /* one row larger than the block */
  if (row_bytes > DIGEST_BLOCK_BYTES && !(big = malloc(row_bytes))) {
    st = st_fail(ST_ENOMEM, "digest: a row of dataset %s (%zu bytes)", name, row_bytes);
    goto out;
  }
  for (hsize_t r0 = 0; !st && r0 < dims[0]; r0 += rows_per) {
    hsize_t start[H5S_MAX_RANK] = {0}, count[H5S_MAX_RANK];
    for (int i = 0; i < rank; i++) count[i] = dims[i];
    start[0] = r0;
    count[0] = dims[0] - r0 < rows_per ? dims[0] - r0 : rows_per;
    fspace = H5Dget_space(d);
    mspace = H5Screate_simple(rank, count, NULL);
    unsigned char *dst = big ? big : buf;
    if (fspace < 0 || mspace < 0 ||
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
        H5Dread(d, type, mspace, fspace, H5P_DEFAULT, dst) < 0)
      st = st_h5_fail(ST_EFORMAT, "digest: reading dataset %s", name);
    else *h = fnv1a(*h, dst, (size_t)count[0] * row_bytes);
    if (fspace >= 0) H5Sclose(fspace);
    if (mspace >= 0) H5Sclose(mspace);
    fspace = mspace = -1;
  }
  free(big);
out:
  if (space >= 0) H5Sclose(space);
  if (type >= 0) H5Tclose(type);
  if (d >= 0) H5Dclose(d);
  return st;
}

st_status st_h5_content_digest(hid_t file, char out[ST_H5_DIGEST_LEN]) {
  out[0] = 0;
  name_list l = {0};
  st_status st = ST_OK;
#if H5_VERSION_GE(1, 12, 0)
  herr_t rc = H5Lvisit2(file, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &l);
#else
  herr_t rc = H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &l);
#endif
  if (rc < 0)
    st = l.failed ? st_fail(ST_ENOMEM, "digest: listing datasets")
                  : st_h5_fail(ST_EFORMAT, "digest: listing datasets");
  unsigned char *buf = st ? NULL : malloc(DIGEST_BLOCK_BYTES);
  if (!st && !buf) st = st_fail(ST_ENOMEM, "digest buffer");
  if (!st) qsort(l.names, l.n, sizeof *l.names, by_name);
  uint64_t h = FNV64_OFFSET;
  for (size_t i = 0; !st && i < l.n; i++) st = digest_dataset(file, l.names[i], &h, buf);
  for (size_t i = 0; i < l.n; i++) free(l.names[i]);
  free(l.names);
  free(buf);
  if (!st) snprintf(out, ST_H5_DIGEST_LEN, "fnv1a64:%016llx", (unsigned long long)h);
  return st;
}
