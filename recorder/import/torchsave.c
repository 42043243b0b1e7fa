/*
** torchsave.c — the torch.save reader (see torchsave.h for the subset and the rules).
**
** Three layers, each distrusting the one below:
**   1. ZIP: the end-of-central-directory record (zip64 when a field is saturated), the central
**      directory (names, STORED only, sizes, local header offsets), the local header of an entry
**      when it is read. Every offset and length is checked against the file size before use.
**   2. Pickle: an iterative stack machine over data.pkl (no recursion, so no depth to exhaust),
**      bounded stack, mark and memo sizes. GLOBAL resolves names against a fixed table; REDUCE
**      calls only the table's builders, which check their arguments' kinds and build
**      descriptions, nothing else.
**   3. Tensors: a tensor's furthest element (offset + sum (size-1) * stride) must lie inside its
**      storage entry; reading gathers the strided elements from one bounded read of that span.
*/
#include "torchsave.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "engine/text/pyjson.h"

#define MAX_PICKLE_BYTES ((uint64_t)1 << 30)   /* data.pkl of a dump is kilobytes */
#define MAX_CD_BYTES ((uint64_t)1 << 28)
#define MAX_STACK (1 << 20)
#define MAX_MARKS (1 << 16)
#define MAX_MEMO (1 << 22)
#define MAX_OBJECTS (1 << 24)

typedef struct zip_entry {
  char *name;
  uint16_t method, flags;
  uint64_t size, csize, local_offset;
} zip_entry;

struct st_torchsave {
  char *path;
  int fd;
  uint64_t file_size;
  zip_entry *entries; /* sorted by name */
  size_t n_entries;
  char *prefix;
  st_py *objects;
  size_t n_objects;
  st_py *root;
};

/* ------------------------------------------------------------------ the whitelist */

enum {
  G_REBUILD_V2, G_REBUILD_V3, G_REBUILD_PARAMETER, G_REBUILD_PARAMETER_STATE,
  G_REBUILD_FROM_TYPE, G_ORDERED_DICT, G_TENSOR_CLASS, G_PARAMETER_CLASS, G_STORAGE, G_DTYPE
};

typedef struct global_name {
  const char *module, *name;
  int role;
  const char *dtype; /* G_STORAGE, G_DTYPE: the element type's torch name */
  size_t elem_size;
  int st_type;
} global_name;

static const global_name globals[] = {
  {"torch._utils", "_rebuild_tensor_v2", G_REBUILD_V2, NULL, 0, -1},
  {"torch._utils", "_rebuild_tensor_v3", G_REBUILD_V3, NULL, 0, -1},
  {"torch._utils", "_rebuild_parameter", G_REBUILD_PARAMETER, NULL, 0, -1},
  {"torch._utils", "_rebuild_parameter_with_state", G_REBUILD_PARAMETER_STATE, NULL, 0, -1},
  {"torch._tensor", "_rebuild_from_type_v2", G_REBUILD_FROM_TYPE, NULL, 0, -1},
  {"collections", "OrderedDict", G_ORDERED_DICT, NULL, 0, -1},
  {"torch._tensor", "Tensor", G_TENSOR_CLASS, NULL, 0, -1},
  {"torch", "Tensor", G_TENSOR_CLASS, NULL, 0, -1},
  {"torch.nn.parameter", "Parameter", G_PARAMETER_CLASS, NULL, 0, -1},
  {"torch", "FloatStorage", G_STORAGE, "float32", 4, ST_F32},
  {"torch", "DoubleStorage", G_STORAGE, "float64", 8, ST_F64},
  {"torch", "HalfStorage", G_STORAGE, "float16", 2, ST_F16},
  {"torch", "BFloat16Storage", G_STORAGE, "bfloat16", 2, ST_BF16},
  {"torch", "LongStorage", G_STORAGE, "int64", 8, ST_I64},
  {"torch", "IntStorage", G_STORAGE, "int32", 4, ST_I32},
  {"torch", "ShortStorage", G_STORAGE, "int16", 2, -1},
  {"torch", "CharStorage", G_STORAGE, "int8", 1, ST_I8},
  {"torch", "ByteStorage", G_STORAGE, "uint8", 1, ST_U8},
  {"torch", "BoolStorage", G_STORAGE, "bool", 1, ST_BOOL},
  {"torch", "UntypedStorage", G_STORAGE, "uint8", 1, ST_U8},
  {"torch.storage", "UntypedStorage", G_STORAGE, "uint8", 1, ST_U8},
  {"torch", "float32", G_DTYPE, "float32", 4, ST_F32},
  {"torch", "float64", G_DTYPE, "float64", 8, ST_F64},
  {"torch", "float16", G_DTYPE, "float16", 2, ST_F16},
  {"torch", "bfloat16", G_DTYPE, "bfloat16", 2, ST_BF16},
  {"torch", "float8_e4m3fn", G_DTYPE, "float8_e4m3fn", 1, ST_F8_E4M3FN},
  {"torch", "float8_e4m3fnuz", G_DTYPE, "float8_e4m3fnuz", 1, ST_F8_E4M3FNUZ},
  {"torch", "float8_e5m2", G_DTYPE, "float8_e5m2", 1, -1},
  {"torch", "float8_e5m2fnuz", G_DTYPE, "float8_e5m2fnuz", 1, -1},
  {"torch", "float8_e8m0fnu", G_DTYPE, "float8_e8m0fnu", 1, ST_F8_E8M0},
  {"torch", "int64", G_DTYPE, "int64", 8, ST_I64},
  {"torch", "int32", G_DTYPE, "int32", 4, ST_I32},
  {"torch", "int16", G_DTYPE, "int16", 2, -1},
  {"torch", "int8", G_DTYPE, "int8", 1, ST_I8},
  {"torch", "uint8", G_DTYPE, "uint8", 1, ST_U8},
  {"torch", "uint16", G_DTYPE, "uint16", 2, -1},
  {"torch", "uint32", G_DTYPE, "uint32", 4, -1},
  {"torch", "uint64", G_DTYPE, "uint64", 8, -1},
  {"torch", "bool", G_DTYPE, "bool", 1, ST_BOOL},
};
#define N_GLOBALS ((int)(sizeof globals / sizeof globals[0]))

static int global_lookup(const char *module, size_t mlen, const char *name, size_t nlen) {
  for (int g = 0; g < N_GLOBALS; g++)
    if (strlen(globals[g].module) == mlen && !memcmp(globals[g].module, module, mlen) &&
        strlen(globals[g].name) == nlen && !memcmp(globals[g].name, name, nlen))
      return g;
  return -1;
}

/* ------------------------------------------------------------------ objects */

static st_py *new_obj(st_torchsave *ts, st_py_kind kind) {
  if (ts->n_objects >= MAX_OBJECTS) return NULL;
  st_py *o = calloc(1, sizeof *o);
  if (!o) return NULL;
  o->kind = kind;
  o->next_alloc = ts->objects;
  ts->objects = o;
  ts->n_objects++;
  return o;
}

static int push_item(st_py *seq, st_py *item) {
  if (seq->n == seq->cap) {
    size_t cap = seq->cap ? seq->cap * 2 : 4;
    st_py **items = realloc(seq->items, cap * sizeof *items);
    if (!items) return -1;
    seq->items = items;
    seq->cap = cap;
  }
  seq->items[seq->n++] = item;
  return 0;
}

static void free_objects(st_torchsave *ts) {
  st_py *o = ts->objects;
  while (o) {
    st_py *next = o->next_alloc;
    free(o->s);
    free(o->items);
    free(o->tensor);
    free(o);
    o = next;
  }
  ts->objects = NULL;
}

const st_py *st_py_dict_get(const st_py *dict, const char *key) {
  if (!dict || dict->kind != ST_PY_DICT) return NULL;
  size_t klen = strlen(key);
  for (size_t i = 0; i + 1 < dict->n; i += 2) {
    const st_py *k = dict->items[i];
    if (k->kind == ST_PY_STR && k->len == klen && !memcmp(k->s, key, klen)) return dict->items[i + 1];
  }
  return NULL;
}

/* ------------------------------------------------------------------ file and ZIP */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* Reads exactly n bytes at offset off (checked against the file size first). */
static st_status read_at(st_torchsave *ts, uint64_t off, void *buf, size_t n, const char *what) {
  if (off > ts->file_size || n > ts->file_size - off)
    return st_fail(ST_EFORMAT, "%s: %s lies past the end of the file (bytes %llu..%llu of %llu)", ts->path,
                   what, (unsigned long long)off, (unsigned long long)(off + n), (unsigned long long)ts->file_size);
  size_t done = 0;
  while (done < n) {
    ssize_t got = pread(ts->fd, (uint8_t *)buf + done, n - done, (off_t)(off + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return st_fail(ST_EIO, "%s: reading %s: %s", ts->path, what, got < 0 ? strerror(errno) : "short read");
    done += (size_t)got;
  }
  return ST_OK;
}

static int entry_cmp(const void *a, const void *b) {
  return strcmp(((const zip_entry *)a)->name, ((const zip_entry *)b)->name);
}

static const zip_entry *find_entry(const st_torchsave *ts, const char *name) {
  zip_entry key = {.name = (char *)name};
  return ts->n_entries ? bsearch(&key, ts->entries, ts->n_entries, sizeof key, entry_cmp) : NULL;
}

/* Where an entry's bytes start, from its local header; checks that they lie inside the file. */
static st_status entry_data(st_torchsave *ts, const zip_entry *e, uint64_t *offset) {
  if (e->flags & 1) return st_fail(ST_EUNSUPPORTED, "%s: entry %s is encrypted", ts->path, e->name);
  if (e->method != 0)
    return st_fail(ST_EUNSUPPORTED, "%s: entry %s is compressed (method %u); torch.save writes STORED "
                   "entries only", ts->path, e->name, e->method);
  if (e->csize != e->size)
    return st_fail(ST_EFORMAT, "%s: STORED entry %s has compressed size %llu but size %llu", ts->path, e->name,
                   (unsigned long long)e->csize, (unsigned long long)e->size);
  uint8_t h[30];
  st_status rc = read_at(ts, e->local_offset, h, sizeof h, "a local file header");
  if (rc) return rc;
  if (rd32(h) != 0x04034b50)
    return st_fail(ST_EFORMAT, "%s: entry %s: no local file header at byte %llu", ts->path, e->name,
                   (unsigned long long)e->local_offset);
  uint64_t off = e->local_offset + 30 + rd16(h + 26) + rd16(h + 28);
  if (off > ts->file_size || e->size > ts->file_size - off)
    return st_fail(ST_EFORMAT, "%s: entry %s (%llu bytes at byte %llu) runs past the end of the file (%llu bytes)",
                   ts->path, e->name, (unsigned long long)e->size, (unsigned long long)off,
                   (unsigned long long)ts->file_size);
  *offset = off;
  return ST_OK;
}

static st_status read_central_directory(st_torchsave *ts) {
  uint64_t size = ts->file_size;
  if (size < 22) return st_fail(ST_EFORMAT, "%s: %llu bytes is too short for a ZIP archive (torch.save)", ts->path,
                                (unsigned long long)size);
  size_t tail_len = size < 65557 ? (size_t)size : 65557;
  uint8_t *tail = malloc(tail_len);
  if (!tail) return st_fail(ST_ENOMEM, "ZIP tail");
  st_status rc = read_at(ts, size - tail_len, tail, tail_len, "the ZIP end record");
  if (rc) { free(tail); return rc; }
  long eocd = -1;
  for (long i = (long)tail_len - 22; i >= 0; i--)
    if (rd32(tail + i) == 0x06054b50 && (uint64_t)i + 22 + rd16(tail + i + 20) == tail_len) { eocd = i; break; }
  if (eocd < 0) {
    free(tail);
    return st_fail(ST_EFORMAT, "%s: not a ZIP archive (no end-of-central-directory record); torch.save files "
                   "since torch 1.6 are ZIP archives", ts->path);
  }
  uint64_t eocd_pos = size - tail_len + (uint64_t)eocd;
  const uint8_t *e = tail + eocd;
  uint64_t n = rd16(e + 10), cd_size = rd32(e + 12), cd_off = rd32(e + 16);
  if (rd16(e + 4) != 0 || rd16(e + 6) != 0) {
    if (rd16(e + 4) != 0xFFFF && rd16(e + 6) != 0xFFFF) {
      free(tail);
      return st_fail(ST_EUNSUPPORTED, "%s: a multi-disk ZIP archive", ts->path);
    }
  }
  free(tail);
  if (n == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
    uint8_t loc[20], z[56];
    if (eocd_pos < 20) return st_fail(ST_EFORMAT, "%s: zip64 fields without a zip64 locator", ts->path);
    if ((rc = read_at(ts, eocd_pos - 20, loc, sizeof loc, "the zip64 locator"))) return rc;
    if (rd32(loc) != 0x07064b50) return st_fail(ST_EFORMAT, "%s: zip64 fields without a zip64 locator", ts->path);
    uint64_t z_off = rd64(loc + 8);
    if ((rc = read_at(ts, z_off, z, sizeof z, "the zip64 end record"))) return rc;
    if (rd32(z) != 0x06064b50) return st_fail(ST_EFORMAT, "%s: no zip64 end record at byte %llu", ts->path,
                                              (unsigned long long)z_off);
    n = rd64(z + 32);
    cd_size = rd64(z + 40);
    cd_off = rd64(z + 48);
  }
  if (cd_size > MAX_CD_BYTES || cd_off > size || cd_size > size - cd_off)
    return st_fail(ST_EFORMAT, "%s: central directory (%llu bytes at byte %llu) does not fit the file (%llu bytes)",
                   ts->path, (unsigned long long)cd_size, (unsigned long long)cd_off, (unsigned long long)size);
  if (n > cd_size / 46)
    return st_fail(ST_EFORMAT, "%s: %llu entries cannot fit a central directory of %llu bytes", ts->path,
                   (unsigned long long)n, (unsigned long long)cd_size);
  uint8_t *cd = malloc(cd_size ? (size_t)cd_size : 1);
  ts->entries = calloc(n ? (size_t)n : 1, sizeof *ts->entries);
  if (!cd || !ts->entries) { free(cd); return st_fail(ST_ENOMEM, "ZIP central directory"); }
  if ((rc = read_at(ts, cd_off, cd, (size_t)cd_size, "the central directory"))) { free(cd); return rc; }
  size_t p = 0;
  for (uint64_t i = 0; i < n; i++) {
    if (cd_size - p < 46 || rd32(cd + p) != 0x02014b50) {
      free(cd);
      return st_fail(ST_EFORMAT, "%s: central directory entry %llu is malformed", ts->path, (unsigned long long)i);
    }
    const uint8_t *h = cd + p;
    size_t name_len = rd16(h + 28), extra_len = rd16(h + 30), comment_len = rd16(h + 32);
    if (cd_size - p - 46 < name_len + extra_len + comment_len) {
      free(cd);
      return st_fail(ST_EFORMAT, "%s: central directory entry %llu runs past the directory", ts->path,
                     (unsigned long long)i);
    }
    zip_entry *z = &ts->entries[i];
    z->flags = rd16(h + 8);
    z->method = rd16(h + 10);
    z->csize = rd32(h + 20);
    z->size = rd32(h + 24);
    z->local_offset = rd32(h + 42);
    z->name = malloc(name_len + 1);
    if (!z->name) { free(cd); return st_fail(ST_ENOMEM, "ZIP entry name"); }
    ts->n_entries = (size_t)i + 1;
    memcpy(z->name, h + 46, name_len);
    z->name[name_len] = 0;
    if (memchr(z->name, 0, name_len)) {
      free(cd);
      return st_fail(ST_EFORMAT, "%s: central directory entry %llu has a NUL in its name", ts->path,
                     (unsigned long long)i);
    }
    /* zip64 extended information: the saturated fields, in this order. */
    const uint8_t *x = h + 46 + name_len, *xend = x + extra_len;
    while (xend - x >= 4) {
      uint16_t id = rd16(x), len = rd16(x + 2);
      if ((size_t)(xend - x - 4) < len) break;
      if (id == 0x0001) {
        const uint8_t *f = x + 4, *fend = f + len;
        if (z->size == 0xFFFFFFFFu && fend - f >= 8) { z->size = rd64(f); f += 8; }
        if (z->csize == 0xFFFFFFFFu && fend - f >= 8) { z->csize = rd64(f); f += 8; }
        if (z->local_offset == 0xFFFFFFFFu && fend - f >= 8) { z->local_offset = rd64(f); f += 8; }
      }
      x += 4 + len;
    }
    p += 46 + name_len + extra_len + comment_len;
  }
  free(cd);
  qsort(ts->entries, ts->n_entries, sizeof *ts->entries, entry_cmp);
  for (size_t i = 1; i < ts->n_entries; i++)
    if (!strcmp(ts->entries[i - 1].name, ts->entries[i].name))
      return st_fail(ST_EFORMAT, "%s: two ZIP entries are named %s", ts->path, ts->entries[i].name);
  return ST_OK;
}

/* The archive's folder: the one top-level folder holding data.pkl. */
static st_status find_prefix(st_torchsave *ts, const zip_entry **pkl) {
  *pkl = NULL;
  for (size_t i = 0; i < ts->n_entries; i++) {
    const char *name = ts->entries[i].name, *slash = strchr(name, '/');
    int top = !slash || !strchr(slash + 1, '/');
    const char *base = slash ? slash + 1 : name;
    if (top && !strcmp(base, "data.pkl")) {
      if (*pkl) return st_fail(ST_EFORMAT, "%s: two data.pkl entries (%s, %s)", ts->path, (*pkl)->name, name);
      *pkl = &ts->entries[i];
    }
  }
  if (!*pkl) return st_fail(ST_EFORMAT, "%s: a ZIP archive without data.pkl: not a torch.save file", ts->path);
  size_t plen = strlen((*pkl)->name) - strlen("data.pkl");
  ts->prefix = malloc(plen + 1);
  if (!ts->prefix) return st_fail(ST_ENOMEM, "archive prefix");
  memcpy(ts->prefix, (*pkl)->name, plen);
  ts->prefix[plen] = 0;
  return ST_OK;
}

static st_status check_byteorder(st_torchsave *ts) {
  char name[4096];
  if (snprintf(name, sizeof name, "%sbyteorder", ts->prefix) >= (int)sizeof name) return ST_OK;
  const zip_entry *e = find_entry(ts, name);
  if (!e) return ST_OK; /* torch before 1.10 wrote none: little-endian */
  uint64_t off;
  st_status rc = entry_data(ts, e, &off);
  if (rc) return rc;
  char text[16] = {0};
  if (e->size >= sizeof text) return st_fail(ST_EFORMAT, "%s: %s holds %llu bytes", ts->path, name, (unsigned long long)e->size);
  if ((rc = read_at(ts, off, text, (size_t)e->size, name))) return rc;
  if (strcmp(text, "little"))
    return st_fail(ST_EUNSUPPORTED, "%s: byteorder is '%s'; only little-endian files are read", ts->path, text);
  return ST_OK;
}

/* ------------------------------------------------------------------ the pickle machine */

typedef struct vm {
  st_torchsave *ts;
  const char *name;
  const uint8_t *p, *end, *start;
  st_py **stack;
  size_t sp, stack_cap;
  size_t *marks;
  size_t n_marks, marks_cap;
  st_py **memo;
  size_t memo_cap, memo_len; /* memo_len: entries set (MEMOIZE stores at that index) */
} vm;

#define VM_FAIL(v, code, ...) vm_fail(v, code, __VA_ARGS__)

static st_status vm_fail(vm *v, st_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static st_status vm_fail(vm *v, st_status code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return st_fail(code, "%s: data.pkl byte %zu: %s", v->name, (size_t)(v->p - v->start), msg);
}

static st_status push(vm *v, st_py *o) {
  if (!o) return VM_FAIL(v, ST_ENOMEM, "out of memory: pickle objects (or more than %d of them)", MAX_OBJECTS);
  if (v->sp == v->stack_cap) {
    if (v->stack_cap >= MAX_STACK) return VM_FAIL(v, ST_EFORMAT, "pickle stack deeper than %d", MAX_STACK);
    size_t cap = v->stack_cap ? v->stack_cap * 2 : 64;
    st_py **s = realloc(v->stack, cap * sizeof *s);
    if (!s) return VM_FAIL(v, ST_ENOMEM, "out of memory: pickle stack");
    v->stack = s;
    v->stack_cap = cap;
  }
  v->stack[v->sp++] = o;
  return ST_OK;
}

static size_t mark_base(const vm *v) { return v->n_marks ? v->marks[v->n_marks - 1] : 0; }

static st_status pop(vm *v, st_py **o) {
  if (v->sp <= mark_base(v)) return VM_FAIL(v, ST_EFORMAT, "pops an empty stack");
  *o = v->stack[--v->sp];
  return ST_OK;
}

static st_status top(vm *v, st_py **o) {
  if (v->sp <= mark_base(v)) return VM_FAIL(v, ST_EFORMAT, "reads an empty stack");
  *o = v->stack[v->sp - 1];
  return ST_OK;
}

/* Pops the topmost mark; the items above it are stack[*from .. sp). */
static st_status pop_mark(vm *v, size_t *from) {
  if (!v->n_marks) return VM_FAIL(v, ST_EFORMAT, "needs a MARK and there is none");
  *from = v->marks[--v->n_marks];
  return ST_OK;
}

static st_status need(vm *v, size_t n) {
  if ((size_t)(v->end - v->p) < n) return VM_FAIL(v, ST_EFORMAT, "truncated: an argument of %zu bytes runs past the end", n);
  return ST_OK;
}

static st_status memo_put(vm *v, uint64_t idx, st_py *o) {
  if (idx >= MAX_MEMO) return VM_FAIL(v, ST_EFORMAT, "memo index %llu is beyond %d", (unsigned long long)idx, MAX_MEMO);
  if (idx >= v->memo_cap) {
    size_t cap = v->memo_cap ? v->memo_cap : 64;
    while (cap <= idx) cap *= 2;
    st_py **m = realloc(v->memo, cap * sizeof *m);
    if (!m) return VM_FAIL(v, ST_ENOMEM, "out of memory: pickle memo");
    memset(m + v->memo_cap, 0, (cap - v->memo_cap) * sizeof *m);
    v->memo = m;
    v->memo_cap = cap;
  }
  if (!v->memo[idx]) v->memo_len++;
  v->memo[idx] = o;
  return ST_OK;
}

static st_status memo_get(vm *v, uint64_t idx) {
  if (idx >= v->memo_cap || !v->memo[idx]) return VM_FAIL(v, ST_EFORMAT, "memo entry %llu was never stored", (unsigned long long)idx);
  return push(v, v->memo[idx]);
}

static st_status push_str(vm *v, uint64_t len) {
  st_status rc = need(v, len);
  if (rc) return rc;
  st_py *o = new_obj(v->ts, ST_PY_STR);
  if (!o) return push(v, NULL);
  o->s = malloc((size_t)len + 1);
  if (!o->s) return VM_FAIL(v, ST_ENOMEM, "out of memory: a string of %llu bytes", (unsigned long long)len);
  memcpy(o->s, v->p, (size_t)len);
  o->s[len] = 0;
  o->len = (size_t)len;
  v->p += len;
  return push(v, o);
}

static st_status push_int(vm *v, int64_t value) {
  st_py *o = new_obj(v->ts, ST_PY_INT);
  if (o) o->i = value;
  return push(v, o);
}

static st_status push_global(vm *v, const char *module, size_t mlen, const char *name, size_t nlen) {
  int g = global_lookup(module, mlen, name, nlen);
  if (g < 0)
    return VM_FAIL(v, ST_EUNSUPPORTED, "refuses the global %.*s.%.*s (not on the whitelist of tensor "
                   "rebuilders, storages, dtypes and OrderedDict; nothing is executed)",
                   (int)ST_MIN(mlen, 200), module, (int)ST_MIN(nlen, 200), name);
  st_py *o = new_obj(v->ts, ST_PY_GLOBAL);
  if (o) o->global_id = g;
  return push(v, o);
}

static int is_int(const st_py *o) { return o && (o->kind == ST_PY_INT || o->kind == ST_PY_BOOL); }

/* BINPERSID: ('storage', storage class, key, location, numel) -> a storage reference. */
static st_status persistent_load(vm *v, st_py *pid) {
  st_torchsave *ts = v->ts;
  if (!ts->prefix) return VM_FAIL(v, ST_EFORMAT, "a persistent id outside a torch.save archive");
  if (pid->kind != ST_PY_TUPLE || pid->n != 5 || pid->items[0]->kind != ST_PY_STR ||
      strcmp(pid->items[0]->s, "storage") || pid->items[1]->kind != ST_PY_GLOBAL ||
      globals[pid->items[1]->global_id].role != G_STORAGE || pid->items[2]->kind != ST_PY_STR ||
      !is_int(pid->items[4]))
    return VM_FAIL(v, ST_EFORMAT, "a persistent id that is not ('storage', torch.<T>Storage, key, device, numel)");
  const global_name *cls = &globals[pid->items[1]->global_id];
  const char *key = pid->items[2]->s;
  int64_t numel = pid->items[4]->i;
  if (numel < 0) return VM_FAIL(v, ST_EFORMAT, "storage %s has %lld elements", key, (long long)numel);
  char name[4096];
  if (snprintf(name, sizeof name, "%sdata/%s", ts->prefix, key) >= (int)sizeof name)
    return VM_FAIL(v, ST_EFORMAT, "storage key of %zu bytes", strlen(key));
  const zip_entry *e = find_entry(ts, name);
  if (!e) return VM_FAIL(v, ST_EFORMAT, "storage %s has no entry %s in the archive", key, name);
  uint64_t off;
  st_status rc = entry_data(ts, e, &off);
  if (rc) return rc;
  if ((uint64_t)numel > e->size / cls->elem_size)
    return VM_FAIL(v, ST_EFORMAT, "storage %s claims %lld %s elements but its entry holds %llu bytes", key,
                   (long long)numel, cls->dtype, (unsigned long long)e->size);
  st_py *s = new_obj(ts, ST_PY_STORAGE);
  if (!s) return push(v, NULL);
  s->global_id = pid->items[1]->global_id;
  s->s = strdup(key);
  if (!s->s) return VM_FAIL(v, ST_ENOMEM, "out of memory: storage key");
  s->i = (int64_t)off;                                /* where its bytes start */
  s->f = 0;
  s->len = (size_t)((uint64_t)numel * cls->elem_size); /* its bytes */
  return push(v, s);
}

static st_status int_tuple(vm *v, const st_py *t, int64_t *out, int *n, const char *what) {
  if (t->kind != ST_PY_TUPLE && t->kind != ST_PY_LIST) return VM_FAIL(v, ST_EFORMAT, "tensor %s is not a tuple", what);
  if (t->n > ST_TORCH_MAX_DIMS) return VM_FAIL(v, ST_EUNSUPPORTED, "tensor with %zu dimensions (at most %d)", t->n, ST_TORCH_MAX_DIMS);
  for (size_t i = 0; i < t->n; i++) {
    if (!is_int(t->items[i])) return VM_FAIL(v, ST_EFORMAT, "tensor %s[%zu] is not an integer", what, i);
    out[i] = t->items[i]->i;
  }
  *n = (int)t->n;
  return ST_OK;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) and v3
** (..., hooks, dtype[, metadata]): checks every element lies inside the storage. */
static st_status rebuild_tensor(vm *v, const st_py *args, int v3, st_py **out) {
  size_t min_args = v3 ? 7 : 6;
  if (args->kind != ST_PY_TUPLE || args->n < min_args || args->n > min_args + 1)
    return VM_FAIL(v, ST_EFORMAT, "_rebuild_tensor_v%d with %zu arguments", v3 ? 3 : 2, args->kind == ST_PY_TUPLE ? args->n : 0);
  const st_py *storage = args->items[0];
  if (storage->kind != ST_PY_STORAGE) return VM_FAIL(v, ST_EFORMAT, "a tensor whose storage is not a persistent id");
  if (!is_int(args->items[1])) return VM_FAIL(v, ST_EFORMAT, "a tensor whose storage offset is not an integer");
  st_torch_tensor t = {0};
  st_status rc;
  int nstride;
  if ((rc = int_tuple(v, args->items[2], t.shape, &t.ndim, "size")) ||
      (rc = int_tuple(v, args->items[3], t.stride, &nstride, "stride")))
    return rc;
  if (nstride != t.ndim) return VM_FAIL(v, ST_EFORMAT, "a tensor with %d sizes and %d strides", t.ndim, nstride);
  const global_name *type = &globals[storage->global_id];
  if (v3) {
    const st_py *dt = args->items[6];
    if (dt->kind != ST_PY_GLOBAL || globals[dt->global_id].role != G_DTYPE)
      return VM_FAIL(v, ST_EFORMAT, "_rebuild_tensor_v3 whose dtype argument is not a torch dtype");
    type = &globals[dt->global_id];
  }
  t.dtype = type->dtype;
  t.elem_size = type->elem_size;
  t.st_type = type->st_type;
  t.storage_offset = args->items[1]->i;
  t.storage_key = storage->s;
  t.data_offset = (uint64_t)storage->i;
  t.data_size = storage->len;
  t.requires_grad = is_int(args->items[4]) && args->items[4]->i;
  if (t.storage_offset < 0) return VM_FAIL(v, ST_EFORMAT, "tensor storage offset %lld", (long long)t.storage_offset);
  /* numel and the furthest element, in elements, without overflow. */
  uint64_t numel = 1, last = (uint64_t)t.storage_offset;
  const uint64_t limit = (uint64_t)1 << 62;
  for (int d = 0; d < t.ndim; d++) {
    if (t.shape[d] < 0 || t.stride[d] < 0)
      return VM_FAIL(v, ST_EFORMAT, "tensor dimension %d has size %lld stride %lld", d, (long long)t.shape[d], (long long)t.stride[d]);
    if (t.shape[d] && numel > limit / (uint64_t)t.shape[d]) return VM_FAIL(v, ST_EFORMAT, "tensor of more than 2^62 elements");
    numel *= (uint64_t)t.shape[d];
  }
  if (numel) {
    for (int d = 0; d < t.ndim; d++) {
      uint64_t span = (uint64_t)(t.shape[d] - 1);
      if (t.stride[d] && span > (limit - last) / (uint64_t)t.stride[d]) return VM_FAIL(v, ST_EFORMAT, "tensor strides overflow");
      last += span * (uint64_t)t.stride[d];
    }
    if (last >= limit / t.elem_size || (last + 1) * t.elem_size > t.data_size)
      return VM_FAIL(v, ST_EFORMAT, "tensor [offset %lld, %d dims] reaches element %llu of storage %s, which holds %llu bytes of %s",
                     (long long)t.storage_offset, t.ndim, (unsigned long long)last, t.storage_key,
                     (unsigned long long)t.data_size, t.dtype);
  }
  t.numel = (int64_t)numel;
  st_py *o = new_obj(v->ts, ST_PY_TENSOR);
  if (!o) return VM_FAIL(v, ST_ENOMEM, "out of memory: tensor");
  o->tensor = malloc(sizeof t);
  if (!o->tensor) return VM_FAIL(v, ST_ENOMEM, "out of memory: tensor");
  *o->tensor = t;
  *out = o;
  return ST_OK;
}

static st_status as_parameter(vm *v, const st_py *data, st_py **out) {
  if (data->kind != ST_PY_TENSOR) return VM_FAIL(v, ST_EFORMAT, "_rebuild_parameter of something not a tensor");
  st_py *o = new_obj(v->ts, ST_PY_TENSOR);
  if (!o || !(o->tensor = malloc(sizeof *o->tensor))) return VM_FAIL(v, ST_ENOMEM, "out of memory: parameter");
  *o->tensor = *data->tensor;
  o->tensor->is_parameter = 1;
  *out = o;
  return ST_OK;
}

/* REDUCE: the callable must be a whitelisted builder; returns what it builds. */
static st_status reduce(vm *v, const st_py *fn, const st_py *args, st_py **out) {
  if (fn->kind != ST_PY_GLOBAL) return VM_FAIL(v, ST_EFORMAT, "REDUCE of something not a global");
  if (args->kind != ST_PY_TUPLE) return VM_FAIL(v, ST_EFORMAT, "REDUCE with arguments that are not a tuple");
  const global_name *g = &globals[fn->global_id];
  switch (g->role) {
  case G_REBUILD_V2: return rebuild_tensor(v, args, 0, out);
  case G_REBUILD_V3: return rebuild_tensor(v, args, 1, out);
  case G_REBUILD_PARAMETER:
  case G_REBUILD_PARAMETER_STATE: {
    size_t want = g->role == G_REBUILD_PARAMETER ? 3 : 4;
    if (args->n != want) return VM_FAIL(v, ST_EFORMAT, "%s with %zu arguments", g->name, args->n);
    st_status rc = as_parameter(v, args->items[0], out);
    if (!rc) (*out)->tensor->requires_grad = is_int(args->items[1]) && args->items[1]->i;
    return rc;
  }
  case G_REBUILD_FROM_TYPE: {
    /* (func, new_type, args, state): func a rebuilder, new_type torch.Tensor or Parameter. */
    if (args->n != 4 || args->items[0]->kind != ST_PY_GLOBAL || args->items[1]->kind != ST_PY_GLOBAL ||
        args->items[2]->kind != ST_PY_TUPLE)
      return VM_FAIL(v, ST_EFORMAT, "_rebuild_from_type_v2 with unexpected arguments");
    int inner = globals[args->items[0]->global_id].role, cls = globals[args->items[1]->global_id].role;
    if (inner != G_REBUILD_V2 && inner != G_REBUILD_V3 && inner != G_REBUILD_PARAMETER)
      return VM_FAIL(v, ST_EUNSUPPORTED, "_rebuild_from_type_v2 of %s", globals[args->items[0]->global_id].name);
    if (cls != G_TENSOR_CLASS && cls != G_PARAMETER_CLASS)
      return VM_FAIL(v, ST_EUNSUPPORTED, "_rebuild_from_type_v2 to %s", globals[args->items[1]->global_id].name);
    st_status rc = reduce(v, args->items[0], args->items[2], out);
    if (!rc && cls == G_PARAMETER_CLASS) rc = as_parameter(v, *out, out);
    return rc;
  }
  case G_ORDERED_DICT: {
    if (args->n != 0) return VM_FAIL(v, ST_EUNSUPPORTED, "OrderedDict built from arguments");
    st_py *d = new_obj(v->ts, ST_PY_DICT);
    if (!d) return VM_FAIL(v, ST_ENOMEM, "out of memory: dict");
    d->ordered = 1;
    *out = d;
    return ST_OK;
  }
  default:
    return VM_FAIL(v, ST_EUNSUPPORTED, "refuses to call %s.%s", g->module, g->name);
  }
}

static st_status setitems(vm *v, st_py *dict, size_t from) {
  if (dict->kind != ST_PY_DICT) return VM_FAIL(v, ST_EFORMAT, "SETITEM(S) on something not a dict");
  if ((v->sp - from) % 2) return VM_FAIL(v, ST_EFORMAT, "SETITEMS with an odd number of items");
  for (size_t i = from; i < v->sp; i += 2) {
    st_py *k = v->stack[i], *val = v->stack[i + 1];
    size_t j = 0;
    if (k->kind == ST_PY_STR) /* a repeated str key replaces, as in Python */
      for (j = 0; j + 1 < dict->n; j += 2)
        if (dict->items[j]->kind == ST_PY_STR && dict->items[j]->len == k->len && !memcmp(dict->items[j]->s, k->s, k->len)) break;
    if (k->kind == ST_PY_STR && j + 1 < dict->n) dict->items[j + 1] = val;
    else if (push_item(dict, k) || push_item(dict, val)) return VM_FAIL(v, ST_ENOMEM, "out of memory: dict");
  }
  v->sp = from;
  return ST_OK;
}

static st_status appends(vm *v, st_py *list, size_t from) {
  if (list->kind != ST_PY_LIST) return VM_FAIL(v, ST_EFORMAT, "APPEND(S) on something not a list");
  for (size_t i = from; i < v->sp; i++)
    if (push_item(list, v->stack[i])) return VM_FAIL(v, ST_ENOMEM, "out of memory: list");
  v->sp = from;
  return ST_OK;
}

static st_status make_seq(vm *v, st_py_kind kind, size_t from, st_py **out) {
  st_py *o = new_obj(v->ts, kind);
  if (!o) return VM_FAIL(v, ST_ENOMEM, "out of memory: tuple");
  for (size_t i = from; i < v->sp; i++)
    if (push_item(o, v->stack[i])) return VM_FAIL(v, ST_ENOMEM, "out of memory: tuple");
  v->sp = from;
  *out = o;
  return ST_OK;
}

static st_status run_pickle(vm *v) {
  st_status rc = ST_OK;
  st_py *a, *b, *o;
  size_t from = 0;
  while (!rc) {
    if (v->p >= v->end) return VM_FAIL(v, ST_EFORMAT, "truncated: no STOP opcode");
    uint8_t op = *v->p++;
    switch (op) {
    case 0x80: /* PROTO */
      if ((rc = need(v, 1))) break;
      if (*v->p < 2 || *v->p > 5) rc = VM_FAIL(v, ST_EUNSUPPORTED, "pickle protocol %u (2 to 5 are read)", *v->p);
      v->p++;
      break;
    case 0x95: /* FRAME */
      if (!(rc = need(v, 8))) v->p += 8;
      break;
    case '.': /* STOP */
      if (v->sp != 1 || v->n_marks) return VM_FAIL(v, ST_EFORMAT, "STOP with %zu objects and %zu marks left", v->sp, v->n_marks);
      v->ts->root = v->stack[0];
      return ST_OK;
    case '(': /* MARK */
      if (v->n_marks == v->marks_cap) {
        if (v->marks_cap >= MAX_MARKS) { rc = VM_FAIL(v, ST_EFORMAT, "more than %d open marks", MAX_MARKS); break; }
        size_t cap = v->marks_cap ? v->marks_cap * 2 : 16;
        size_t *m = realloc(v->marks, cap * sizeof *m);
        if (!m) { rc = VM_FAIL(v, ST_ENOMEM, "out of memory: marks"); break; }
        v->marks = m;
        v->marks_cap = cap;
      }
      v->marks[v->n_marks++] = v->sp;
      break;
    case '}': rc = push(v, new_obj(v->ts, ST_PY_DICT)); break;
    case ']': rc = push(v, new_obj(v->ts, ST_PY_LIST)); break;
    case ')': rc = push(v, new_obj(v->ts, ST_PY_TUPLE)); break;
    case 'N': rc = push(v, new_obj(v->ts, ST_PY_NONE)); break;
    case 0x88: case 0x89: /* NEWTRUE, NEWFALSE */
      if ((o = new_obj(v->ts, ST_PY_BOOL))) o->i = op == 0x88;
      rc = push(v, o);
      break;
    case 'K': if (!(rc = need(v, 1))) { rc = push_int(v, v->p[0]); v->p += 1; } break;
    case 'M': if (!(rc = need(v, 2))) { rc = push_int(v, rd16(v->p)); v->p += 2; } break;
    case 'J': if (!(rc = need(v, 4))) { rc = push_int(v, (int32_t)rd32(v->p)); v->p += 4; } break;
    case 0x8a: case 0x8b: { /* LONG1, LONG4: little-endian two's complement */
      uint64_t n;
      if (op == 0x8a) { if ((rc = need(v, 1))) break; n = *v->p++; }
      else { if ((rc = need(v, 4))) break; n = rd32(v->p); v->p += 4; }
      if (n > 8) { rc = VM_FAIL(v, ST_EUNSUPPORTED, "an integer of %llu bytes (int64 at most)", (unsigned long long)n); break; }
      if ((rc = need(v, (size_t)n))) break;
      uint64_t u = 0;
      for (uint64_t k = 0; k < n; k++) u |= (uint64_t)v->p[k] << (8 * k);
      if (n && n < 8 && (v->p[n - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * n);
      v->p += n;
      int64_t value;
      memcpy(&value, &u, sizeof value);
      rc = push_int(v, value);
      break;
    }
    case 'G': { /* BINFLOAT: big-endian double */
      if ((rc = need(v, 8))) break;
      uint64_t u = 0;
      for (int k = 0; k < 8; k++) u = u << 8 | v->p[k];
      v->p += 8;
      if ((o = new_obj(v->ts, ST_PY_FLOAT))) memcpy(&o->f, &u, sizeof o->f);
      rc = push(v, o);
      break;
    }
    case 'X': if (!(rc = need(v, 4))) { uint32_t n = rd32(v->p); v->p += 4; rc = push_str(v, n); } break;
    case 0x8c: if (!(rc = need(v, 1))) { uint8_t n = *v->p++; rc = push_str(v, n); } break;
    case 0x8d: if (!(rc = need(v, 8))) { uint64_t n = rd64(v->p); v->p += 8; rc = push_str(v, n); } break;
    case 'q': if (!(rc = need(v, 1)) && !(rc = top(v, &o))) { rc = memo_put(v, v->p[0], o); v->p += 1; } break;
    case 'r': if (!(rc = need(v, 4)) && !(rc = top(v, &o))) { rc = memo_put(v, rd32(v->p), o); v->p += 4; } break;
    case 0x94: /* MEMOIZE: the next free index */
      if (!(rc = top(v, &o))) rc = memo_put(v, v->memo_len, o);
      break;
    case 'h': if (!(rc = need(v, 1))) { uint8_t i = *v->p++; rc = memo_get(v, i); } break;
    case 'j': if (!(rc = need(v, 4))) { uint32_t i = rd32(v->p); v->p += 4; rc = memo_get(v, i); } break;
    case 'c': { /* GLOBAL "module\nname\n" */
      const uint8_t *m = v->p, *nl1 = memchr(m, '\n', (size_t)(v->end - m));
      const uint8_t *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(v->end - nl1 - 1)) : NULL;
      if (!nl2) { rc = VM_FAIL(v, ST_EFORMAT, "truncated GLOBAL"); break; }
      v->p = nl2 + 1;
      rc = push_global(v, (const char *)m, (size_t)(nl1 - m), (const char *)nl1 + 1, (size_t)(nl2 - nl1 - 1));
      break;
    }
    case 0x93: /* STACK_GLOBAL */
      if ((rc = pop(v, &b)) || (rc = pop(v, &a))) break;
      if (a->kind != ST_PY_STR || b->kind != ST_PY_STR) { rc = VM_FAIL(v, ST_EFORMAT, "STACK_GLOBAL of non-strings"); break; }
      rc = push_global(v, a->s, a->len, b->s, b->len);
      break;
    case 'Q': /* BINPERSID */
      if (!(rc = pop(v, &a))) rc = persistent_load(v, a);
      break;
    case 'R': /* REDUCE */
      if ((rc = pop(v, &b)) || (rc = pop(v, &a))) break;
      if (!(rc = reduce(v, a, b, &o))) rc = push(v, o);
      break;
    case 'b': /* BUILD: state on a rebuilt tensor or OrderedDict (_metadata) carries nothing we read */
      if ((rc = pop(v, &b)) || (rc = top(v, &a))) break;
      if (a->kind != ST_PY_DICT && a->kind != ST_PY_TENSOR) rc = VM_FAIL(v, ST_EUNSUPPORTED, "BUILD on a %d object", (int)a->kind);
      break;
    case 't': if (!(rc = pop_mark(v, &from)) && !(rc = make_seq(v, ST_PY_TUPLE, from, &o))) rc = push(v, o); break;
    case 'l': if (!(rc = pop_mark(v, &from)) && !(rc = make_seq(v, ST_PY_LIST, from, &o))) rc = push(v, o); break;
    case 'd':
      if (!(rc = pop_mark(v, &from)) && (o = new_obj(v->ts, ST_PY_DICT))) {
        size_t base = from;
        if (!(rc = setitems(v, o, base))) rc = push(v, o);
      } else if (!rc) rc = push(v, NULL);
      break;
    case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
      size_t k = (size_t)(op - 0x84);
      if (v->sp - mark_base(v) < k) { rc = VM_FAIL(v, ST_EFORMAT, "TUPLE%zu with fewer items on the stack", k); break; }
      if (!(rc = make_seq(v, ST_PY_TUPLE, v->sp - k, &o))) rc = push(v, o);
      break;
    }
    case 'a': if (!(rc = pop(v, &b)) && !(rc = top(v, &a))) { v->stack[v->sp++] = b; rc = appends(v, a, v->sp - 1); } break;
    case 'e':
      if (!(rc = pop_mark(v, &from))) {
        if (from == 0 || from <= mark_base(v)) { rc = VM_FAIL(v, ST_EFORMAT, "APPENDS without a list"); break; }
        rc = appends(v, v->stack[from - 1], from);
      }
      break;
    case 's':
      if (v->sp - mark_base(v) < 3) { rc = VM_FAIL(v, ST_EFORMAT, "SETITEM with fewer than 3 items"); break; }
      rc = setitems(v, v->stack[v->sp - 3], v->sp - 2);
      break;
    case 'u':
      if (!(rc = pop_mark(v, &from))) {
        if (from == 0 || from <= mark_base(v)) { rc = VM_FAIL(v, ST_EFORMAT, "SETITEMS without a dict"); break; }
        rc = setitems(v, v->stack[from - 1], from);
      }
      break;
    case '0': rc = pop(v, &a); break; /* POP */
    case '2': if (!(rc = top(v, &a))) rc = push(v, a); break; /* DUP */
    default:
      v->p--;
      rc = VM_FAIL(v, ST_EUNSUPPORTED, "opcode 0x%02x ('%c') is outside the subset torch.save uses", op,
                   op >= 32 && op < 127 ? op : '?');
    }
  }
  return rc;
}

static st_status unpickle(st_torchsave *ts, const uint8_t *data, size_t size) {
  vm v = {.ts = ts, .name = ts->path, .p = data, .start = data, .end = data + size};
  st_status rc = run_pickle(&v);
  free(v.stack);
  free(v.marks);
  free(v.memo);
  return rc;
}

/* ------------------------------------------------------------------ public */

static st_torchsave *new_handle(const char *path) {
  st_torchsave *ts = calloc(1, sizeof *ts);
  if (!ts) return NULL;
  ts->fd = -1;
  ts->path = strdup(path);
  if (!ts->path) { free(ts); return NULL; }
  return ts;
}

void st_torchsave_close(st_torchsave *ts) {
  if (!ts) return;
  if (ts->fd >= 0) close(ts->fd);
  for (size_t i = 0; i < ts->n_entries; i++) free(ts->entries[i].name);
  free(ts->entries);
  free_objects(ts);
  free(ts->prefix);
  free(ts->path);
  free(ts);
}

st_status st_torchsave_open(const char *path, st_torchsave **out) {
  *out = NULL;
  st_torchsave *ts = new_handle(path);
  if (!ts) return st_fail(ST_ENOMEM, "torch.save reader");
  st_status rc = ST_OK;
  uint8_t *pkl_bytes = NULL;
  struct stat st;
  ts->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (ts->fd < 0) { rc = st_fail(ST_EIO, "open %s: %s", path, strerror(errno)); goto out; }
  if (fstat(ts->fd, &st) || !S_ISREG(st.st_mode)) { rc = st_fail(ST_EIO, "%s: not a regular file", path); goto out; }
  ts->file_size = (uint64_t)st.st_size;
  const zip_entry *pkl;
  uint64_t off;
  if ((rc = read_central_directory(ts)) || (rc = find_prefix(ts, &pkl)) || (rc = check_byteorder(ts)) ||
      (rc = entry_data(ts, pkl, &off)))
    goto out;
  if (pkl->size > MAX_PICKLE_BYTES) { rc = st_fail(ST_ETOOBIG, "%s: data.pkl of %llu bytes", path, (unsigned long long)pkl->size); goto out; }
  pkl_bytes = malloc(pkl->size ? (size_t)pkl->size : 1);
  if (!pkl_bytes) { rc = st_fail(ST_ENOMEM, "data.pkl of %s", path); goto out; }
  if ((rc = read_at(ts, off, pkl_bytes, (size_t)pkl->size, "data.pkl"))) goto out;
  rc = unpickle(ts, pkl_bytes, (size_t)pkl->size);
out:
  free(pkl_bytes);
  if (rc) st_torchsave_close(ts);
  else *out = ts;
  return rc;
}

st_status st_pickle_parse(const char *name, const uint8_t *data, size_t size, st_torchsave **out) {
  *out = NULL;
  st_torchsave *ts = new_handle(name);
  if (!ts) return st_fail(ST_ENOMEM, "pickle reader");
  st_status rc = unpickle(ts, data, size);
  if (rc) st_torchsave_close(ts);
  else *out = ts;
  return rc;
}

const st_py *st_torchsave_root(const st_torchsave *ts) { return ts->root; }

const char *st_torchsave_prefix(const st_torchsave *ts) { return ts->prefix ? ts->prefix : ""; }

st_status st_torchsave_read(st_torchsave *ts, const st_torch_tensor *t, void *dst, size_t dst_size) {
  uint64_t bytes = (uint64_t)t->numel * t->elem_size;
  if (dst_size < bytes) return st_fail(ST_EINVAL, "%s: tensor of %llu bytes into a buffer of %zu", ts->path, (unsigned long long)bytes, dst_size);
  if (!t->numel) return ST_OK;
  if (ts->fd < 0) return st_fail(ST_EINVAL, "%s: a bare pickle holds no tensor data", ts->path);
  /* The span of storage the tensor touches (checked at unpickling to lie inside the storage). */
  uint64_t first = (uint64_t)t->storage_offset, last = first;
  int contiguous = 1;
  int64_t expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    last += (uint64_t)(t->shape[d] - 1) * (uint64_t)t->stride[d];
    if (t->shape[d] != 1 && t->stride[d] != expect) contiguous = 0;
    expect *= t->shape[d];
  }
  uint64_t span = (last - first + 1) * t->elem_size;
  if ((last + 1) * t->elem_size > t->data_size) return st_fail(ST_EFORMAT, "%s: tensor outside its storage %s", ts->path, t->storage_key);
  char what[96];
  snprintf(what, sizeof what, "storage %.60s", t->storage_key);
  if (contiguous) return read_at(ts, t->data_offset + first * t->elem_size, dst, (size_t)bytes, what);
  uint8_t *buf = malloc((size_t)span);
  if (!buf) return st_fail(ST_ENOMEM, "a strided tensor's storage span (%llu bytes)", (unsigned long long)span);
  st_status rc = read_at(ts, t->data_offset + first * t->elem_size, buf, (size_t)span, what);
  if (!rc) {
    int64_t idx[ST_TORCH_MAX_DIMS] = {0};
    uint8_t *o = dst;
    for (int64_t k = 0; k < t->numel; k++) {
      uint64_t e = 0;
      for (int d = 0; d < t->ndim; d++) e += (uint64_t)idx[d] * (uint64_t)t->stride[d];
      memcpy(o, buf + e * t->elem_size, t->elem_size);
      o += t->elem_size;
      for (int d = t->ndim - 1; d >= 0; d--) {
        if (++idx[d] < t->shape[d]) break;
        idx[d] = 0;
      }
    }
  }
  free(buf);
  return rc;
}

/* ------------------------------------------------------------------ JSON view */

typedef struct json_walk {
  st_torchsave *ts;
  FILE *f;
  long budget; /* nodes left: shared objects may make a small pickle a huge tree */
} json_walk;

/* One JSON string literal, written by the project's one JSON string writer (pyjson.c). */
static st_status show_string(FILE *f, const char *s, size_t len) {
  st_buf b = {0};
  st_pyjson_string(&b, s, len, 0);
  st_status rc = st_buf_status(&b, "a string to show");
  if (!rc) fwrite(b.data, 1, b.len, f);
  st_buf_free(&b);
  return rc;
}

static st_status json_value(json_walk *w, const st_py *o, int depth) {
  FILE *f = w->f;
  if (depth > 100) return st_fail(ST_EFORMAT, "%s: objects nested deeper than 100 (or a cycle)", w->ts->path);
  if (--w->budget < 0) return st_fail(ST_ETOOBIG, "%s: more than a million objects to show", w->ts->path);
  st_status rc = ST_OK;
  switch (o->kind) {
  case ST_PY_NONE: fputs("null", f); break;
  case ST_PY_BOOL: fputs(o->i ? "true" : "false", f); break;
  case ST_PY_INT: fprintf(f, "%lld", (long long)o->i); break;
  case ST_PY_FLOAT: fprintf(f, "{\"float\": \"%.17g\"}", o->f); break;
  case ST_PY_STR: rc = show_string(f, o->s, o->len); break;
  case ST_PY_LIST:
  case ST_PY_TUPLE:
    fputs(o->kind == ST_PY_TUPLE ? "{\"tuple\": [" : "[", f);
    for (size_t i = 0; i < o->n && !rc; i++) {
      if (i) fputs(", ", f);
      rc = json_value(w, o->items[i], depth + 1);
    }
    fputs(o->kind == ST_PY_TUPLE ? "]}" : "]", f);
    break;
  case ST_PY_DICT:
    fputs(o->ordered ? "{\"ordered_dict\": [" : "{\"dict\": [", f);
    for (size_t i = 0; i + 1 < o->n && !rc; i += 2) {
      fputs(i ? ", [" : "[", f);
      if (!(rc = json_value(w, o->items[i], depth + 1))) {
        fputs(", ", f);
        rc = json_value(w, o->items[i + 1], depth + 1);
      }
      fputc(']', f);
    }
    fputs("]}", f);
    break;
  case ST_PY_TENSOR: {
    const st_torch_tensor *t = o->tensor;
    fprintf(f, "{\"tensor\": {\"dtype\": \"%s\", \"shape\": [", t->dtype);
    for (int d = 0; d < t->ndim; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    fputs("], \"stride\": [", f);
    for (int d = 0; d < t->ndim; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)t->stride[d]);
    fprintf(f, "], \"storage_offset\": %lld, \"storage\": ", (long long)t->storage_offset);
    if ((rc = show_string(f, t->storage_key, strlen(t->storage_key)))) break;
    fprintf(f, ", \"is_parameter\": %s, \"requires_grad\": %s, \"hex\": \"", t->is_parameter ? "true" : "false",
            t->requires_grad ? "true" : "false");
    size_t bytes = (size_t)t->numel * t->elem_size;
    if (bytes > ((size_t)1 << 28)) { rc = st_fail(ST_ETOOBIG, "%s: a tensor of %zu bytes to show", w->ts->path, bytes); break; }
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (!buf) { rc = st_fail(ST_ENOMEM, "tensor to show"); break; }
    if (!(rc = st_torchsave_read(w->ts, t, buf, bytes)))
      for (size_t i = 0; i < bytes; i++) fprintf(f, "%02x", buf[i]);
    free(buf);
    fputs("\"}}", f);
    break;
  }
  case ST_PY_GLOBAL:
    fprintf(f, "{\"global\": \"%s.%s\"}", globals[o->global_id].module, globals[o->global_id].name);
    break;
  case ST_PY_STORAGE:
    fputs("{\"storage\": ", f);
    rc = show_string(f, o->s, strlen(o->s));
    fputc('}', f);
    break;
  }
  return rc;
}

st_status st_py_write_json(st_torchsave *ts, const st_py *o, FILE *f) {
  json_walk w = {.ts = ts, .f = f, .budget = 1000000};
  st_status rc = json_value(&w, o, 0);
  fputc('\n', f);
  return rc;
}
