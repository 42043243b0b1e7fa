/*
** safetensors.c — mmap reader for the safetensors format (see safetensors.h).
**
** The file is treated as hostile: every length and offset is checked against the file size with
** overflow-safe arithmetic before anything is dereferenced, and the JSON header is parsed by
** jansson with a length bound (never as a C string, so a NUL inside it is caught). The data
** region is mapped PROT_READ and never read here; madvise(MADV_RANDOM) stops the kernel from
** reading ahead into tensors nobody asked for (a 1.6T-parameter checkpoint is loaded one layer
** at a time).
*/
#include "safetensors.h"
#include "common/json_oom.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct st_safetensors {
  char *path;
  unsigned char *map; /* whole file, PROT_READ */
  size_t map_size;
  uint64_t data_start; /* 8 + header length */
  size_t count;
  st_safetensors_tensor *tensors; /* sorted by name */
  char *names;                    /* all names, NUL-separated; tensors[].name point here */
  json_t *metadata;               /* "__metadata__" object or NULL; owned reference */
};

static const struct {
  const char *name;
  size_t size;
} dtype_table[ST_SAFETENSORS_DTYPE_COUNT] = {
  [ST_SAFETENSORS_F64] = {"F64", 8},         [ST_SAFETENSORS_F32] = {"F32", 4},
  [ST_SAFETENSORS_F16] = {"F16", 2},         [ST_SAFETENSORS_BF16] = {"BF16", 2},
  [ST_SAFETENSORS_F8_E4M3] = {"F8_E4M3", 1}, [ST_SAFETENSORS_F8_E5M2] = {"F8_E5M2", 1},
  [ST_SAFETENSORS_F8_E8M0] = {"F8_E8M0", 1}, [ST_SAFETENSORS_I64] = {"I64", 8},
  [ST_SAFETENSORS_I32] = {"I32", 4},         [ST_SAFETENSORS_I16] = {"I16", 2},
  [ST_SAFETENSORS_I8] = {"I8", 1},           [ST_SAFETENSORS_U8] = {"U8", 1},
  [ST_SAFETENSORS_BOOL] = {"BOOL", 1},
};

const char *st_safetensors_dtype_name(st_safetensors_dtype t) {
  return (unsigned)t < ST_SAFETENSORS_DTYPE_COUNT ? dtype_table[t].name : "?";
}

size_t st_safetensors_dtype_size(st_safetensors_dtype t) {
  return (unsigned)t < ST_SAFETENSORS_DTYPE_COUNT ? dtype_table[t].size : 0;
}

int st_safetensors_dtype_parse(const char *s) {
  for (int i = 0; i < ST_SAFETENSORS_DTYPE_COUNT; i++)
    if (strcmp(s, dtype_table[i].name) == 0) return i;
  return -1;
}

st_status st_safetensors_dtype_to_st(st_safetensors_dtype t, st_dtype *out) {
  switch (t) {
  case ST_SAFETENSORS_F64: *out = ST_F64; return ST_OK;
  case ST_SAFETENSORS_F32: *out = ST_F32; return ST_OK;
  case ST_SAFETENSORS_F16: *out = ST_F16; return ST_OK;
  case ST_SAFETENSORS_BF16: *out = ST_BF16; return ST_OK;
  case ST_SAFETENSORS_F8_E4M3: *out = ST_F8_E4M3FN; return ST_OK;
  case ST_SAFETENSORS_F8_E8M0: *out = ST_F8_E8M0; return ST_OK;
  case ST_SAFETENSORS_I64: *out = ST_I64; return ST_OK;
  case ST_SAFETENSORS_I32: *out = ST_I32; return ST_OK;
  case ST_SAFETENSORS_I8: *out = ST_I8; return ST_OK;
  case ST_SAFETENSORS_U8: *out = ST_U8; return ST_OK;
  case ST_SAFETENSORS_BOOL: *out = ST_BOOL; return ST_OK;
  case ST_SAFETENSORS_F8_E5M2: case ST_SAFETENSORS_I16: case ST_SAFETENSORS_DTYPE_COUNT: break;
  }
  return st_fail(ST_EUNSUPPORTED, "safetensors dtype %s has no engine dtype",
                 st_safetensors_dtype_name(t));
}

void st_safetensors_close(st_safetensors *st) {
  if (!st) return;
  if (st->map) munmap(st->map, st->map_size);
  json_decref(st->metadata);
  free(st->tensors);
  free(st->names);
  free(st->path);
  free(st);
}

const char *st_safetensors_path(const st_safetensors *st) { return st->path; }
size_t st_safetensors_count(const st_safetensors *st) { return st->count; }

const st_safetensors_tensor *st_safetensors_at(const st_safetensors *st, size_t i) {
  return i < st->count ? &st->tensors[i] : NULL;
}

static int compare_by_name(const void *a, const void *b) {
  return strcmp(((const st_safetensors_tensor *)a)->name, ((const st_safetensors_tensor *)b)->name);
}

const st_safetensors_tensor *st_safetensors_find(const st_safetensors *st, const char *name) {
  st_safetensors_tensor key = {.name = name};
  return bsearch(&key, st->tensors, st->count, sizeof key, compare_by_name);
}

const char *st_safetensors_metadata(const st_safetensors *st, const char *key) {
  if (!st->metadata) return NULL;
  return json_string_value(json_object_get(st->metadata, key));
}

/* Reads a JSON integer that must be a non-negative int64. */
static int json_u64(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
  *out = (uint64_t)json_integer_value(v);
  return 1;
}

/* Parses one tensor entry into *t (name set by the caller). */
static st_status parse_entry(const st_safetensors *st, const char *name, json_t *entry,
                             st_safetensors_tensor *t) {
  const char *path = st->path;
  if (!json_is_object(entry))
    return st_fail(ST_EFORMAT, "%s: tensor '%s': header entry is not an object", path, name);
  json_t *dtype = json_object_get(entry, "dtype");
  json_t *shape = json_object_get(entry, "shape");
  json_t *offsets = json_object_get(entry, "data_offsets");
  if (!json_is_string(dtype))
    return st_fail(ST_EFORMAT, "%s: tensor '%s': missing or non-string \"dtype\"", path, name);
  int dt = st_safetensors_dtype_parse(json_string_value(dtype));
  if (dt < 0)
    return st_fail(ST_EFORMAT,
                   "%s: tensor '%s': unknown dtype \"%s\" (expected one of F64 F32 F16 BF16 "
                   "F8_E4M3 F8_E5M2 F8_E8M0 I64 I32 I16 I8 U8 BOOL)",
                   path, name, json_string_value(dtype));
  t->dtype = (st_safetensors_dtype)dt;
  if (!json_is_array(shape))
    return st_fail(ST_EFORMAT, "%s: tensor '%s': missing or non-array \"shape\"", path, name);
  size_t rank = json_array_size(shape);
  if (rank > ST_SAFETENSORS_MAX_RANK)
    return st_fail(ST_EFORMAT, "%s: tensor '%s': rank %zu exceeds %d", path, name, rank,
                   ST_SAFETENSORS_MAX_RANK);
  t->rank = (int)rank;
  uint64_t n = 1;
  for (size_t i = 0; i < rank; i++) {
    uint64_t d;
    if (!json_u64(json_array_get(shape, i), &d))
      return st_fail(ST_EFORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer", path,
                     name, i);
    t->shape[i] = (int64_t)d;
    if (d != 0 && n > UINT64_MAX / d)
      return st_fail(ST_EFORMAT, "%s: tensor '%s': shape product overflows", path, name);
    n *= d;
  }
  t->n_elements = n;
  uint64_t begin, end;
  if (!json_is_array(offsets) || json_array_size(offsets) != 2 ||
      !json_u64(json_array_get(offsets, 0), &begin) || !json_u64(json_array_get(offsets, 1), &end))
    return st_fail(ST_EFORMAT,
                   "%s: tensor '%s': \"data_offsets\" must be [begin, end] non-negative integers",
                   path, name);
  uint64_t data_size = st->map_size - st->data_start;
  if (end < begin)
    return st_fail(ST_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before begin", path,
                   name, (unsigned long long)begin, (unsigned long long)end);
  if (end > data_size)
    return st_fail(ST_EFORMAT,
                   "%s: tensor '%s': data_offsets [%llu, %llu] beyond the %llu data bytes "
                   "(file truncated?)",
                   path, name, (unsigned long long)begin, (unsigned long long)end,
                   (unsigned long long)data_size);
  uint64_t elsize = dtype_table[dt].size;
  if (n > UINT64_MAX / elsize || n * elsize != end - begin)
    return st_fail(ST_EFORMAT,
                   "%s: tensor '%s': %llu elements of %s need %llu bytes but data_offsets give %llu",
                   path, name, (unsigned long long)n, dtype_table[dt].name,
                   (unsigned long long)(n <= UINT64_MAX / elsize ? n * elsize : UINT64_MAX),
                   (unsigned long long)(end - begin));
  t->offset = st->data_start + begin;
  t->n_bytes = end - begin;
  t->data = st->map + t->offset;
  return ST_OK;
}

static int compare_by_offset(const void *a, const void *b) {
  const st_safetensors_tensor *x = *(const st_safetensors_tensor *const *)a;
  const st_safetensors_tensor *y = *(const st_safetensors_tensor *const *)b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  if (x->n_bytes != y->n_bytes) return x->n_bytes < y->n_bytes ? -1 : 1;
  return 0;
}

/* The byte ranges sorted by begin must tile [data_start, map_size) exactly. */
static st_status check_tiling(const st_safetensors *st) {
  st_status rc = ST_OK;
  const st_safetensors_tensor **order = malloc((st->count ? st->count : 1) * sizeof *order);
  if (!order) return st_fail(ST_ENOMEM, "%s: out of memory", st->path);
  for (size_t i = 0; i < st->count; i++) order[i] = &st->tensors[i];
  qsort(order, st->count, sizeof *order, compare_by_offset);
  uint64_t expect = st->data_start;
  for (size_t i = 0; i < st->count; i++) {
    const st_safetensors_tensor *t = order[i];
    if (t->offset < expect) {
      rc = st_fail(ST_EFORMAT, "%s: tensor '%s': data_offsets begin at %llu, overlapping '%s'",
                   st->path, t->name, (unsigned long long)(t->offset - st->data_start),
                   order[i - 1]->name);
      goto out;
    }
    if (t->offset > expect) {
      rc = st_fail(ST_EFORMAT, "%s: tensor '%s': data_offsets begin at %llu, leaving a gap after %llu",
                   st->path, t->name, (unsigned long long)(t->offset - st->data_start),
                   (unsigned long long)(expect - st->data_start));
      goto out;
    }
    expect = t->offset + t->n_bytes;
  }
  if (expect != st->map_size)
    rc = st_fail(ST_EFORMAT, "%s: %llu data bytes follow the header but the tensors cover %llu",
                 st->path, (unsigned long long)(st->map_size - st->data_start),
                 (unsigned long long)(expect - st->data_start));
out:
  free(order);
  return rc;
}

static st_status parse_header(st_safetensors *st) {
  const char *path = st->path;
  if (st->map_size < 8)
    return st_fail(ST_EFORMAT, "%s: not a safetensors file (%zu bytes, shorter than the 8-byte "
                   "header length)", path, st->map_size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | st->map[i];
  if (n == 0 || n > ST_SAFETENSORS_MAX_HEADER)
    return st_fail(ST_EFORMAT, "%s: not a safetensors file (header length %llu is implausible)",
                   path, (unsigned long long)n);
  if (n > st->map_size - 8)
    return st_fail(ST_EFORMAT, "%s: header length %llu runs past the end of the %zu-byte file "
                   "(truncated?)", path, (unsigned long long)n, st->map_size);
  if (st->map[8] != '{')
    return st_fail(ST_EFORMAT, "%s: not a safetensors file (header does not start with '{')", path);
  st->data_start = 8 + n;

  json_error_t jerr;
  errno = 0;
  json_t *root = json_loadb((const char *)st->map + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
  if (!root && st_json_out_of_memory(&jerr)) return st_fail(ST_ENOMEM, "%s: header JSON", path);
  if (!root)
    return st_fail(ST_EFORMAT, "%s: header JSON, line %d column %d: %s", path, jerr.line,
                   jerr.column, jerr.text);
  st_status rc = ST_OK;
  if (!json_is_object(root)) {
    rc = st_fail(ST_EFORMAT, "%s: header is not a JSON object", path);
    goto out;
  }
  size_t names_size = 0, count = 0;
  const char *key;
  json_t *value;
  json_object_foreach(root, key, value) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(value)) {
        rc = st_fail(ST_EFORMAT, "%s: \"__metadata__\" is not an object", path);
        goto out;
      }
      st->metadata = json_incref(value);
      continue;
    }
    names_size += strlen(key) + 1;
    count++;
  }
  st->tensors = calloc(count ? count : 1, sizeof *st->tensors);
  st->names = malloc(names_size ? names_size : 1);
  if (!st->tensors || !st->names) {
    rc = st_fail(ST_ENOMEM, "%s: out of memory for %zu tensors", path, count);
    goto out;
  }
  char *cursor = st->names;
  json_object_foreach(root, key, value) {
    if (strcmp(key, "__metadata__") == 0) continue;
    st_safetensors_tensor *t = &st->tensors[st->count];
    size_t len = strlen(key) + 1;
    memcpy(cursor, key, len);
    t->name = cursor;
    cursor += len;
    if ((rc = parse_entry(st, key, value, t)) != ST_OK) goto out;
    st->count++;
  }
  qsort(st->tensors, st->count, sizeof *st->tensors, compare_by_name);
  rc = check_tiling(st);
out:
  json_decref(root);
  return rc;
}

st_status st_safetensors_open(const char *path, st_safetensors **out) {
  *out = NULL;
  st_safetensors *st = calloc(1, sizeof *st);
  if (!st) return st_fail(ST_ENOMEM, "%s: out of memory", path);
  st_status rc = ST_OK;
  int fd = -1;
  if (!(st->path = strdup(path))) {
    rc = st_fail(ST_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    rc = st_fail(ST_EIO, "%s: cannot open: %s", path, strerror(errno));
    goto out;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    rc = st_fail(ST_EIO, "%s: cannot stat: %s", path, strerror(errno));
    goto out;
  }
  if (!S_ISREG(sb.st_mode)) {
    rc = st_fail(ST_EIO, "%s: not a regular file", path);
    goto out;
  }
  if (sb.st_size < 8) {
    rc = st_fail(ST_EFORMAT, "%s: not a safetensors file (%lld bytes, shorter than the 8-byte "
                 "header length)", path, (long long)sb.st_size);
    goto out;
  }
  st->map_size = (size_t)sb.st_size;
  void *map = mmap(NULL, st->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    rc = st_fail(ST_EIO, "%s: cannot mmap %zu bytes: %s", path, st->map_size, strerror(errno));
    goto out;
  }
  st->map = map;
  (void)madvise(st->map, st->map_size, MADV_RANDOM);
  rc = parse_header(st);
out:
  if (fd >= 0) close(fd);
  if (rc != ST_OK) {
    st_safetensors_close(st);
    return rc;
  }
  *out = st;
  return ST_OK;
}
