/*
** torchsave.h — a reader of the torch.save subset that tensor dumps use, which never executes
** anything from the file.
**
** A torch.save file is a ZIP archive of STORED entries under one folder: data.pkl (a pickle of
** the saved object), data/<key> (the raw bytes of each storage), byteorder, version. The pickle
** is run by a small stack machine that knows the opcodes of protocols 2 to 4 that plain data
** needs (dicts, lists, tuples, str, int, float, bool, None, the memo) plus GLOBAL / REDUCE /
** BINPERSID / BUILD for a whitelist of names: torch._utils._rebuild_tensor_v2 / _v3 /
** _rebuild_parameter(_with_state), torch._tensor._rebuild_from_type_v2, the torch.*Storage
** classes and torch.UntypedStorage, the torch dtypes, collections.OrderedDict. Any other global
** is refused by name. Calling a whitelisted name only builds a description (st_torch_tensor);
** tensor bytes are read later, on demand, from the storage's ZIP entry, every offset checked
** against the entry and the file.
**
** Objects live in the st_torchsave handle and are freed with it. Shared objects (the memo) are
** shared here too, and a hostile pickle can make cycles: walkers must bound their depth.
*/
#ifndef ST_TORCHSAVE_H
#define ST_TORCHSAVE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/base.h"

#define ST_TORCH_MAX_DIMS 16

typedef enum st_py_kind {
  ST_PY_NONE,
  ST_PY_BOOL,   /* i: 0 or 1 */
  ST_PY_INT,    /* i (int64; larger integers are refused) */
  ST_PY_FLOAT,  /* f */
  ST_PY_STR,    /* s, len (UTF-8 as in the file, NUL-terminated) */
  ST_PY_LIST,   /* items[0..n) */
  ST_PY_TUPLE,  /* items[0..n) */
  ST_PY_DICT,   /* items: key0, value0, key1, value1, ... (n = 2 * pairs), in insertion order */
  ST_PY_TENSOR, /* tensor */
  ST_PY_GLOBAL, /* a whitelisted name (class, function, dtype); seen only inside the pickle */
  ST_PY_STORAGE /* a storage reference (BINPERSID); seen only inside tensors */
} st_py_kind;

/* A tensor as torch.save describes it: element type, shape and strides in elements, offset into
** its storage in elements, and where that storage's bytes are in the file. */
typedef struct st_torch_tensor {
  const char *dtype;     /* torch's name: "float32", "bfloat16", "float8_e4m3fn", "int64", ... */
  int st_type;           /* the st_dtype of the same bits, -1 when sparsetrace has none (int16) */
  size_t elem_size;      /* bytes per element */
  int ndim;
  int64_t shape[ST_TORCH_MAX_DIMS], stride[ST_TORCH_MAX_DIMS];
  int64_t storage_offset;
  int64_t numel;          /* product of shape */
  const char *storage_key;
  uint64_t data_offset;   /* storage bytes: [data_offset, data_offset + data_size) in the file */
  uint64_t data_size;
  int requires_grad, is_parameter;
} st_torch_tensor;

typedef struct st_py st_py;
struct st_py {
  st_py_kind kind;
  int ordered;          /* ST_PY_DICT: built as collections.OrderedDict */
  int64_t i;
  double f;
  char *s;
  size_t len;
  st_py **items;
  size_t n, cap;
  st_torch_tensor *tensor;
  int global_id;        /* ST_PY_GLOBAL: index into the whitelist */
  st_py *next_alloc;    /* every object of a handle, for freeing */
};

typedef struct st_torchsave st_torchsave;

/* Opens a torch.save file and unpickles its data.pkl. ST_EFORMAT (the message names the file,
** the entry or the pickle byte, and what is wrong) for anything malformed or hostile,
** ST_EUNSUPPORTED for valid files outside the subset (a compressed entry, big-endian data, a
** global not on the whitelist), ST_EIO, ST_ENOMEM. *out is NULL on error. */
st_status st_torchsave_open(const char *path, st_torchsave **out);

/* Unpickles a bare pickle from memory (no archive: a persistent id is an error). For tests and
** the fuzzer; name is used in messages. */
st_status st_pickle_parse(const char *name, const uint8_t *data, size_t size, st_torchsave **out);

/* The saved object. Valid until st_torchsave_close. */
const st_py *st_torchsave_root(const st_torchsave *ts);
/* The archive's folder inside the ZIP ("archive/"), "" for a bare pickle. */
const char *st_torchsave_prefix(const st_torchsave *ts);

/* Copies the tensor's elements into dst in row-major (C-contiguous) order, as torch's
** t.contiguous() holds them: numel * elem_size bytes, which dst_size must be at least. */
st_status st_torchsave_read(st_torchsave *ts, const st_torch_tensor *t, void *dst, size_t dst_size);

void st_torchsave_close(st_torchsave *ts);

/* The value of str key `key` in a dict, or NULL (not a dict, or no such key). */
const st_py *st_py_dict_get(const st_py *dict, const char *key);

/* Writes o as one line of JSON: None/bool/int/str as themselves, a float as {"float": "%.17g"},
** a tuple as {"tuple": [...]}, a dict as {"dict": [[key, value], ...]} ({"ordered_dict": ...}),
** a tensor as {"tensor": {dtype, shape, stride, storage_offset, storage, is_parameter,
** requires_grad, hex: its row-major bytes}}. Bounded: 100 levels, a million objects. */
st_status st_py_write_json(st_torchsave *ts, const st_py *o, FILE *f);

#endif
