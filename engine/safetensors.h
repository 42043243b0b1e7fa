/*
** safetensors.h — a read-only, mmap'd safetensors file, validated against its size.
**
** Layout: u64 little-endian header length N, N bytes of a JSON object (name -> {dtype, shape,
** data_offsets: [begin, end]} plus an optional "__metadata__" of string values), then the data.
** Offsets are relative to the start of the data. Every tensor's byte range must lie in the data,
** match dtype x shape exactly, and the ranges sorted by begin must tile the data with no gap and
** no overlap (as the format's reference implementation requires). Opening reads the header only;
** tensor bytes are touched only when a caller reads through a tensor's `data` pointer.
**
** Memory: the st_safetensors owns the mapping, the names and the tensor table. Every pointer it
** hands out (names, `data`, metadata strings) borrows from it and dies with st_safetensors_close.
** `data` is not aligned for any element type: read elements with memcpy.
*/
#ifndef ST_SAFETENSORS_H
#define ST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/base.h"

#define ST_SAFETENSORS_MAX_RANK 8
#define ST_SAFETENSORS_MAX_HEADER (100u * 1024u * 1024u) /* the format's own limit */

/* The on-disk dtype strings. Kept apart from st_dtype because the file format has types the
** engine has no use for (F8_E5M2, I16). */
typedef enum st_safetensors_dtype {
  ST_SAFETENSORS_F64 = 0,
  ST_SAFETENSORS_F32,
  ST_SAFETENSORS_F16,
  ST_SAFETENSORS_BF16,
  ST_SAFETENSORS_F8_E4M3, /* OCP e4m3fn */
  ST_SAFETENSORS_F8_E5M2,
  ST_SAFETENSORS_F8_E8M0, /* ue8m0 scale */
  ST_SAFETENSORS_I64,
  ST_SAFETENSORS_I32,
  ST_SAFETENSORS_I16,
  ST_SAFETENSORS_I8,
  ST_SAFETENSORS_U8,
  ST_SAFETENSORS_BOOL,
  ST_SAFETENSORS_DTYPE_COUNT
} st_safetensors_dtype;

typedef struct st_safetensors_tensor {
  const char *name;           /* as written in the file */
  st_safetensors_dtype dtype;
  int rank;
  int64_t shape[ST_SAFETENSORS_MAX_RANK];
  uint64_t n_elements;        /* product of shape (1 for rank 0) */
  uint64_t offset;            /* of the first byte, from the start of the file */
  uint64_t n_bytes;
  const unsigned char *data;  /* borrowed from the mapping; unaligned */
} st_safetensors_tensor;

typedef struct st_safetensors st_safetensors;

/* Maps and validates PATH. On failure *out is NULL and the message names the file and, where one
** is at fault, the tensor. ST_EIO: cannot open/stat/map; ST_EFORMAT: anything malformed. */
st_status st_safetensors_open(const char *path, st_safetensors **out);
void st_safetensors_close(st_safetensors *st); /* accepts NULL */

const char *st_safetensors_path(const st_safetensors *st);
size_t st_safetensors_count(const st_safetensors *st);
/* Tensors sorted by name; i < count. */
const st_safetensors_tensor *st_safetensors_at(const st_safetensors *st, size_t i);
/* NULL when absent. */
const st_safetensors_tensor *st_safetensors_find(const st_safetensors *st, const char *name);
/* A string value of "__metadata__", or NULL. */
const char *st_safetensors_metadata(const st_safetensors *st, const char *key);

/* "F32", "BF16", ... */
const char *st_safetensors_dtype_name(st_safetensors_dtype t);
/* Bytes per element (all on-disk types are whole bytes). */
size_t st_safetensors_dtype_size(st_safetensors_dtype t);
/* Parses a dtype string; -1 when unknown. */
int st_safetensors_dtype_parse(const char *s);
/* The engine's st_dtype for an on-disk type; ST_EUNSUPPORTED for F8_E5M2 and I16, which st_dtype
** cannot name. */
st_status st_safetensors_dtype_to_st(st_safetensors_dtype t, st_dtype *out);

#endif
