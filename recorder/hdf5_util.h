/*
** hdf5_util.h — the HDF5 boundary shared by the trace writer and reader: error translation,
** string and scalar attributes, and the mapping between st_dtype and HDF5 types.
**
** Every function here calls HDF5, so callers decide on which thread it runs (the writer keeps all
** its HDF5 calls on its own thread). HDF5's automatic error printing is switched off per thread
** by st_h5_quiet(); failures are turned into st_fail messages that end with the walked error
** stack ("H5Dcreate2: unable to create dataset <- ...").
*/
#ifndef ST_HDF5_UTIL_H
#define ST_HDF5_UTIL_H

#include <hdf5.h>
#include <stdint.h>

#include "common/base.h"

/* Turns off HDF5's printing of errors for the calling thread. Idempotent, cheap. */
void st_h5_quiet(void);

/* st_fail(s, fmt...) with ": <HDF5 error stack>" appended, then clears the stack; when the
** guarded driver refused a read, ": <why> (<stack>)". Returns s, or ST_ENOMEM when a frame of the
** stack says an allocation failed (H5E_CANTALLOC, H5E_NOSPACE): that is not a corrupt file. */
st_status st_h5_fail(st_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether an allocation inside libhdf5 failed (the ST_ENOMEM above) in any st_h5_fail on this
** thread since st_h5_alloc_failed_clear: libhdf5's own request, not one of ours. */
int st_h5_alloc_failed(void);
void st_h5_alloc_failed_clear(void);

/* Opens path read-only through a file driver that refuses metadata libhdf5 1.10 cannot survive
** (hdf5_guard.c): for files from elsewhere (st_trace_open). Returns the file, or -1 with the
** HDF5 error stack set (st_h5_fail then names what the driver refused, if it refused). */
hid_t st_h5_open_untrusted(const char *path);
/* Why the guarded driver last refused a read on this thread, "" when it has not since the last
** st_h5_guard_clear (st_h5_fail clears it). */
const char *st_h5_guard_reason(void);
void st_h5_guard_clear(void);

/* Writes a scalar variable-length UTF-8 string attribute (h5py reads it as str). value NULL:
** nothing is written and ST_OK returned. Replaces an existing attribute of that name. */
st_status st_h5_attr_write_string(hid_t obj, const char *name, const char *value);
/* Writes scalar int64 / float64 attributes (replacing any of that name). */
st_status st_h5_attr_write_int(hid_t obj, const char *name, int64_t value);
st_status st_h5_attr_write_double(hid_t obj, const char *name, double value);

/* Reads a string attribute (variable- or fixed-length) into a malloc'd string the caller frees.
** Returns ST_ENOTFOUND (no message set) when obj has no attribute of that name. */
st_status st_h5_attr_read_string(hid_t obj, const char *name, char **out);
/* Reads a scalar numeric attribute converted to int64 / double; ST_ENOTFOUND when absent. */
st_status st_h5_attr_read_int(hid_t obj, const char *name, int64_t *out);
st_status st_h5_attr_read_double(hid_t obj, const char *name, double *out);

/* The HDF5 file type a dtype is stored as, and the matching memory type for raw values in host
** order. Both are predefined or cached types: never H5Tclose them. Returns -1 (and sets an
** st_fail message) for dtypes a trace cannot hold (packed fp4). bf16/fp8 are stored as raw
** uint16/uint8 (no numpy type exists); float16 as IEEE half, which h5py reads as float16. */
hid_t st_h5_file_type(st_dtype t);
hid_t st_h5_mem_type(st_dtype t);

/* The content digest of a trace (schemas/trace-layout.md, "Content digest"): FNV-1a 64 over every
** dataset of the file, in byte order of their full paths ("/positions/x" < "/taps/y" < "/tokens"),
** each contributing its path, its file type ("f4le", "i8le", "u2le", ...), its rank and extents
** (int64 little-endian) and its raw bytes as stored (no conversion). Attributes do not count.
** Written as "fnv1a64:<16 lowercase hex digits>" into out (ST_H5_DIGEST_LEN bytes with the NUL). */
#define ST_H5_DIGEST_LEN 25
st_status st_h5_content_digest(hid_t file, char out[ST_H5_DIGEST_LEN]);

#endif
