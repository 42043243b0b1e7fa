/*
** checkpoint.c — a DeepSeek-V4 checkpoint directory (see checkpoint.h).
**
** Opening reads config.json, the optional model.safetensors.index.json and the header of every
** shard; it maps the shards but reads no tensor bytes. Each stored tensor gets one entry under
** its canonical (reference-dialect, SPEC-dsv4 §5) name, found by binary search. Names are mapped
** through the single table `name_rules` below; nothing else in the loader looks at dialects.
**
** Loading converts to fp32 according to the stored dtype:
**   F32 F16 BF16 F64 (and integer types, by value)  element by element, shape must match;
**   F8_E4M3 + "<base>.scale"                         FP8 weight [out, in] with one scale per
**                                                    Bo x Bi tile (quantization_config
**                                                    .weight_block_size, 128 or 64), the scale
**                                                    F8_E8M0, F32 or BF16 [ceil(out/Bo), ceil(in/Bi)];
**   I8 [out, in/2] + F8_E8M0 "<base>.scale" [out, in/32]
**                                                    FP4 e2m1 packed experts, logical [out, in];
**                                                    element 2k in the low nibble of byte k.
** Which of the two I8 readings applies is decided by the requested shape: the packed one only
** when the stored columns are half the requested ones and the e8m0 scale is there.
**
** Memory: the st_checkpoint owns the shards (st_safetensors, each owning its mapping) and the
** entry table; entries borrow tensor descriptors from the shards. Loaders copy out of the
** mappings into caller memory; no pointer into a mapping escapes this file.
*/
#include "checkpoint.h"
#include "common/json_oom.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/lowp.h"
#include "safetensors.h"

#define NAME_MAX_LEN 1024

_Static_assert(ST_SAFETENSORS_MAX_RANK == sizeof(((st_checkpoint_tensor_info *)0)->shape) / sizeof(int64_t),
               "st_checkpoint_tensor_info.shape must hold every rank the reader accepts");

typedef struct entry {
  char *canonical;                  /* owned */
  const st_safetensors_tensor *t;   /* borrowed from shards[shard] */
  int shard;
} entry;

struct st_checkpoint {
  char *dir;
  st_config config;
  st_safetensors **shards;
  int n_shards;
  entry *entries; /* sorted by canonical name */
  size_t n_entries;
  uint64_t bytes_read; /* updated with atomic adds: loaders may run on several threads */
};

/* ------------------------------------------------------------------ the name table */

typedef enum rule_kind {
  RULE_EXACT,         /* whole name equals `from` -> `to` */
  RULE_IGNORE_PREFIX, /* name starts with `from` -> not part of the model (MTP) */
  RULE_PREFIX,        /* leading `from` -> `to` */
  RULE_SEGMENT,       /* every dot-separated segment equal to `from` -> `to` */
  RULE_SUFFIX,        /* trailing `from` -> `to` */
  RULE_LAYER_TAIL,    /* "layers.N." + `from` exactly -> "layers.N." + `to` */
} rule_kind;

/*
** Applied in order, each at most once, to the progressively rewritten name. Reference-dialect
** names pass through untouched. Rows: transformers 5.17 save_pretrained (41 key patterns: the
** "model." prefix on top-level and layer keys, model.hc_head.*, attn.norm = the window-KV norm),
** then the HF-style alternates convert.py accepts (self_attn, mlp, weight_scale_inv,
** e_score_correction_bias).
*/
static const struct name_rule {
  rule_kind kind;
  const char *from, *to;
} name_rules[] = {
  {RULE_EXACT, "model.embed_tokens.weight", "embed.weight"},
  {RULE_EXACT, "model.norm.weight", "norm.weight"},
  {RULE_EXACT, "model.hc_head.hc_fn", "hc_head_fn"},
  {RULE_EXACT, "model.hc_head.hc_base", "hc_head_base"},
  {RULE_EXACT, "model.hc_head.hc_scale", "hc_head_scale"},
  {RULE_EXACT, "lm_head.weight", "head.weight"},
  {RULE_IGNORE_PREFIX, "mtp.", NULL},
  {RULE_IGNORE_PREFIX, "model.mtp.", NULL},
  {RULE_PREFIX, "model.layers.", "layers."},
  {RULE_SEGMENT, "self_attn", "attn"},
  {RULE_SEGMENT, "mlp", "ffn"},
  {RULE_SUFFIX, ".weight_scale_inv", ".scale"},
  {RULE_LAYER_TAIL, "attn.norm.weight", "attn.kv_norm.weight"},
  {RULE_LAYER_TAIL, "ffn.gate.e_score_correction_bias", "ffn.gate.bias"},
};

/* Length of "layers.N." at the start of s, or 0. */
static size_t layer_prefix_len(const char *s) {
  if (strncmp(s, "layers.", 7) != 0) return 0;
  size_t i = 7;
  while (s[i] >= '0' && s[i] <= '9') i++;
  return i > 7 && s[i] == '.' ? i + 1 : 0;
}

/* Rewrites cur (capacity NAME_MAX_LEN) by one rule; returns 0 to ignore the name, -1 on
** overflow, 1 otherwise. */
static int apply_rule(const struct name_rule *r, char *cur) {
  char out[NAME_MAX_LEN];
  size_t len = strlen(cur), from_len = strlen(r->from);
  int n = -2; /* -2: rule did not match */
  switch (r->kind) {
  case RULE_EXACT:
    if (strcmp(cur, r->from) == 0) n = snprintf(out, sizeof out, "%s", r->to);
    break;
  case RULE_IGNORE_PREFIX:
    if (strncmp(cur, r->from, from_len) == 0) return 0;
    break;
  case RULE_PREFIX:
    if (strncmp(cur, r->from, from_len) == 0)
      n = snprintf(out, sizeof out, "%s%s", r->to, cur + from_len);
    break;
  case RULE_SUFFIX:
    if (len >= from_len && strcmp(cur + len - from_len, r->from) == 0)
      n = snprintf(out, sizeof out, "%.*s%s", (int)(len - from_len), cur, r->to);
    break;
  case RULE_LAYER_TAIL: {
    size_t p = layer_prefix_len(cur);
    if (p && strcmp(cur + p, r->from) == 0) n = snprintf(out, sizeof out, "%.*s%s", (int)p, cur, r->to);
    break;
  }
  case RULE_SEGMENT: {
    size_t o = 0;
    int changed = 0;
    for (const char *seg = cur;;) {
      const char *dot = strchr(seg, '.');
      size_t seg_len = dot ? (size_t)(dot - seg) : strlen(seg);
      int hit = seg_len == from_len && strncmp(seg, r->from, from_len) == 0;
      const char *piece = hit ? r->to : seg;
      size_t piece_len = hit ? strlen(r->to) : seg_len;
      changed |= hit;
      if (o + piece_len + 2 > sizeof out) return -1;
      memcpy(out + o, piece, piece_len);
      o += piece_len;
      if (!dot) break;
      out[o++] = '.';
      seg = dot + 1;
    }
    out[o] = 0;
    if (changed) n = (int)o;
    break;
  }
  }
  if (n == -2) return 1;
  if (n < 0 || (size_t)n >= sizeof out) return -1;
  memcpy(cur, out, (size_t)n + 1);
  return 1;
}

int st_checkpoint_canonical_name(const char *stored, char *buf, size_t size) {
  char cur[NAME_MAX_LEN];
  if (strlen(stored) >= sizeof cur) return -1;
  strcpy(cur, stored);
  for (size_t i = 0; i < sizeof name_rules / sizeof name_rules[0]; i++) {
    int r = apply_rule(&name_rules[i], cur);
    if (r <= 0) return r;
  }
  if (strlen(cur) >= size) return -1;
  memcpy(buf, cur, strlen(cur) + 1);
  return 1;
}

/* ------------------------------------------------------------------ open / close */

void st_checkpoint_close(st_checkpoint *ck) {
  if (!ck) return;
  for (size_t i = 0; i < ck->n_entries; i++) free(ck->entries[i].canonical);
  free(ck->entries);
  for (int i = 0; i < ck->n_shards; i++) st_safetensors_close(ck->shards[i]);
  free(ck->shards);
  free(ck->dir);
  free(ck);
}

const st_config *st_checkpoint_config(const st_checkpoint *ck) { return &ck->config; }
const char *st_checkpoint_dir(const st_checkpoint *ck) { return ck->dir; }

static int file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* "dir/name" in a new string, or NULL. */
static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static st_status add_shard(st_checkpoint *ck, const char *file, int *index) {
  char *path = join(ck->dir, file);
  if (!path) return st_fail(ST_ENOMEM, "%s: out of memory", ck->dir);
  st_safetensors **grown = realloc(ck->shards, (size_t)(ck->n_shards + 1) * sizeof *grown);
  if (!grown) {
    free(path);
    return st_fail(ST_ENOMEM, "%s: out of memory", ck->dir);
  }
  ck->shards = grown;
  st_status rc = st_safetensors_open(path, &ck->shards[ck->n_shards]);
  free(path);
  if (rc != ST_OK) return rc;
  *index = ck->n_shards++;
  return ST_OK;
}

/* A shard file name from the index must stay inside the directory. */
static int shard_name_ok(const char *f) {
  if (!*f || f[0] == '/') return 0;
  for (const char *p = f; *p;) {
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if ((n == 2 && p[0] == '.' && p[1] == '.') || n == 0) return 0;
    if (!slash) break;
    p = slash + 1;
  }
  return 1;
}

/* Opens the shards named by model.safetensors.index.json and checks that every tensor of its
** weight_map is in the shard it names. */
static st_status open_index(st_checkpoint *ck, const char *index_path) {
  json_error_t jerr;
  errno = 0;
  json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
  if (!root && st_json_out_of_memory(&jerr)) return st_fail(ST_ENOMEM, "reading %s", index_path);
  if (!root)
    return st_fail(ST_EFORMAT, "%s: line %d column %d: %s", index_path, jerr.line, jerr.column,
                   jerr.text);
  st_status rc = ST_OK;
  json_t *map = json_object_get(root, "weight_map");
  if (!json_is_object(map)) {
    rc = st_fail(ST_EFORMAT, "%s: field \"weight_map\" is missing or not an object", index_path);
    goto out;
  }
  const char *name;
  json_t *file;
  json_object_foreach(map, name, file) {
    const char *f = json_string_value(file);
    if (!f || !shard_name_ok(f)) {
      rc = st_fail(ST_EFORMAT, "%s: tensor '%s': weight_map value must be a file name inside the "
                   "checkpoint directory", index_path, name);
      goto out;
    }
    int shard = -1;
    for (int i = 0; i < ck->n_shards; i++) {
      const char *p = st_safetensors_path(ck->shards[i]);
      if (strcmp(p + strlen(ck->dir) + 1, f) == 0) shard = i;
    }
    if (shard < 0) {
      char *path = join(ck->dir, f);
      int exists = path && file_exists(path);
      free(path);
      if (!exists) {
        rc = st_fail(ST_ENOTFOUND, "%s: tensor '%s' is mapped to shard '%s', which does not exist "
                     "in %s", index_path, name, f, ck->dir);
        goto out;
      }
      if ((rc = add_shard(ck, f, &shard)) != ST_OK) {
        st_fail_context(rc, "%s: shard of tensor '%s': ", index_path, name);
        goto out;
      }
    }
    if (!st_safetensors_find(ck->shards[shard], name)) {
      rc = st_fail(ST_EFORMAT, "%s: tensor '%s' is mapped to shard '%s', which does not hold it",
                   index_path, name, f);
      goto out;
    }
  }
  if (ck->n_shards == 0) rc = st_fail(ST_EFORMAT, "%s: weight_map names no tensors", index_path);
out:
  json_decref(root);
  return rc;
}

static int compare_entries(const void *a, const void *b) {
  return strcmp(((const entry *)a)->canonical, ((const entry *)b)->canonical);
}

/* One entry per stored tensor under its canonical name; a name stored twice (in two shards or in
** both dialects) is an error, since which copy is meant cannot be known. */
static st_status build_entries(st_checkpoint *ck) {
  size_t total = 0;
  for (int s = 0; s < ck->n_shards; s++) total += st_safetensors_count(ck->shards[s]);
  ck->entries = calloc(total ? total : 1, sizeof *ck->entries);
  if (!ck->entries) return st_fail(ST_ENOMEM, "%s: out of memory for %zu tensors", ck->dir, total);
  for (int s = 0; s < ck->n_shards; s++) {
    for (size_t i = 0; i < st_safetensors_count(ck->shards[s]); i++) {
      const st_safetensors_tensor *t = st_safetensors_at(ck->shards[s], i);
      char name[NAME_MAX_LEN];
      int r = st_checkpoint_canonical_name(t->name, name, sizeof name);
      if (r == 0) continue;
      if (r < 0)
        return st_fail(ST_EFORMAT, "%s: tensor '%.100s...': name too long",
                       st_safetensors_path(ck->shards[s]), t->name);
      entry *e = &ck->entries[ck->n_entries];
      if (!(e->canonical = strdup(name))) return st_fail(ST_ENOMEM, "%s: out of memory", ck->dir);
      e->t = t;
      e->shard = s;
      ck->n_entries++;
    }
  }
  qsort(ck->entries, ck->n_entries, sizeof *ck->entries, compare_entries);
  for (size_t i = 1; i < ck->n_entries; i++) {
    const entry *a = &ck->entries[i - 1], *b = &ck->entries[i];
    if (strcmp(a->canonical, b->canonical) == 0)
      return st_fail(ST_EFORMAT, "%s: tensor '%s' is stored twice: as '%s' in %s and as '%s' in %s",
                     ck->dir, a->canonical, a->t->name, st_safetensors_path(ck->shards[a->shard]),
                     b->t->name, st_safetensors_path(ck->shards[b->shard]));
  }
  return ST_OK;
}

st_status st_checkpoint_open(const char *dir, st_checkpoint **out) {
  *out = NULL;
  st_checkpoint *ck = calloc(1, sizeof *ck);
  if (!ck) return st_fail(ST_ENOMEM, "%s: out of memory", dir);
  st_status rc = ST_OK;
  char *config_path = NULL, *index_path = NULL;
  size_t dir_len = strlen(dir);
  while (dir_len > 1 && dir[dir_len - 1] == '/') dir_len--;
  if (!(ck->dir = strndup(dir, dir_len)) || !(config_path = join(ck->dir, "config.json")) ||
      !(index_path = join(ck->dir, "model.safetensors.index.json"))) {
    rc = st_fail(ST_ENOMEM, "%s: out of memory", dir);
    goto out;
  }
  struct stat sb;
  if (stat(ck->dir, &sb) != 0) {
    rc = st_fail(ST_EIO, "%s: cannot open checkpoint directory: %s", ck->dir, strerror(errno));
    goto out;
  }
  if (!S_ISDIR(sb.st_mode)) {
    rc = st_fail(ST_EIO, "%s: not a checkpoint directory", ck->dir);
    goto out;
  }
  if ((rc = st_config_load(config_path, &ck->config)) != ST_OK) goto out;
  if (file_exists(index_path)) {
    rc = open_index(ck, index_path);
  } else {
    int shard;
    char *single = join(ck->dir, "model.safetensors");
    int exists = single && file_exists(single);
    free(single);
    if (!exists)
      rc = st_fail(ST_ENOTFOUND, "%s: neither model.safetensors nor model.safetensors.index.json "
                   "is there", ck->dir);
    else
      rc = add_shard(ck, "model.safetensors", &shard);
  }
  if (rc == ST_OK) rc = build_entries(ck);
out:
  free(config_path);
  free(index_path);
  if (rc != ST_OK) {
    st_checkpoint_close(ck);
    return rc;
  }
  *out = ck;
  return ST_OK;
}

/* ------------------------------------------------------------------ lookup */

static const entry *find(const st_checkpoint *ck, const char *canonical) {
  entry key = {.canonical = (char *)canonical};
  return bsearch(&key, ck->entries, ck->n_entries, sizeof key, compare_entries);
}

int st_checkpoint_has(const st_checkpoint *ck, const char *canonical) {
  return find(ck, canonical) != NULL;
}

size_t st_checkpoint_count(const st_checkpoint *ck) { return ck->n_entries; }

const char *st_checkpoint_name_at(const st_checkpoint *ck, size_t i) {
  return i < ck->n_entries ? ck->entries[i].canonical : NULL;
}

uint64_t st_checkpoint_bytes_read(const st_checkpoint *ck) {
  return __atomic_load_n(&ck->bytes_read, __ATOMIC_RELAXED);
}

static void count_read(st_checkpoint *ck, uint64_t n) {
  __atomic_fetch_add(&ck->bytes_read, n, __ATOMIC_RELAXED);
}

static const char *file_of(const st_checkpoint *ck, const entry *e) {
  return st_safetensors_path(ck->shards[e->shard]);
}

static st_status not_found(const st_checkpoint *ck, const char *canonical) {
  return st_fail(ST_ENOTFOUND, "%s: tensor '%s' not found in the checkpoint (in either name "
                 "dialect)", ck->dir, canonical);
}

/* "[a, b, c]" */
static const char *shape_str(char *buf, size_t size, int rank, const int64_t *shape) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, size - o, "[");
  for (int i = 0; i < rank && o < size; i++)
    o += (size_t)snprintf(buf + o, size - o, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (o < size) snprintf(buf + o, size - o, "]");
  return buf;
}

/* "'layers.0.attn.kv_norm.weight' (stored as 'model.layers.0.attn.norm.weight')" */
static const char *who(char *buf, size_t size, const entry *e) {
  if (strcmp(e->canonical, e->t->name) == 0) snprintf(buf, size, "'%s'", e->canonical);
  else snprintf(buf, size, "'%s' (stored as '%s')", e->canonical, e->t->name);
  return buf;
}

st_status st_checkpoint_info(const st_checkpoint *ck, const char *canonical,
                             st_checkpoint_tensor_info *out) {
  const entry *e = find(ck, canonical);
  if (!e) return not_found(ck, canonical);
  memset(out, 0, sizeof *out);
  out->canonical = e->canonical;
  out->stored = e->t->name;
  out->file = file_of(ck, e);
  out->dtype = st_safetensors_dtype_name(e->t->dtype);
  out->rank = e->t->rank;
  memcpy(out->shape, e->t->shape, sizeof out->shape);
  out->n_bytes = e->t->n_bytes;
  return ST_OK;
}

/* The companion "<base>.scale" of "<base>.weight", or NULL. */
static const entry *find_scale(const st_checkpoint *ck, const char *canonical) {
  size_t n = strlen(canonical);
  if (n < 7 || strcmp(canonical + n - 7, ".weight") != 0 || n + 1 > NAME_MAX_LEN) return NULL;
  char name[NAME_MAX_LEN];
  snprintf(name, sizeof name, "%.*s.scale", (int)(n - 7), canonical);
  return find(ck, name);
}

st_status st_checkpoint_dtype(const st_checkpoint *ck, const char *canonical, st_dtype *out) {
  const entry *e = find(ck, canonical);
  if (!e) return not_found(ck, canonical);
  if (e->t->dtype == ST_SAFETENSORS_I8 && e->t->rank == 2) {
    const entry *s = find_scale(ck, canonical);
    if (s && s->t->dtype == ST_SAFETENSORS_F8_E8M0 && s->t->rank == 2 &&
        s->t->shape[0] == e->t->shape[0] && s->t->shape[1] * 16 == e->t->shape[1]) {
      *out = ST_F4_E2M1;
      return ST_OK;
    }
  }
  st_status rc = st_safetensors_dtype_to_st(e->t->dtype, out);
  if (rc != ST_OK) {
    char w[NAME_MAX_LEN + 64];
    return st_fail_context(rc, "%s: tensor %s: ", file_of(ck, e), who(w, sizeof w, e));
  }
  return ST_OK;
}

/* ------------------------------------------------------------------ element conversion */

/* Conversion of a large tensor is spread over threads (each output element is written once, so
** the result does not depend on the thread count); `work` is the element count in scope. */
#ifdef _OPENMP
#define PARALLEL_FOR _Pragma("omp parallel for schedule(static) if(work > 1048576)")
#else
#define PARALLEL_FOR
#endif

/* Element i of a stored tensor as double (exact for every type but I64 beyond 2^53). */
static double load_scalar(st_safetensors_dtype dt, const unsigned char *p, uint64_t i) {
  switch (dt) {
  case ST_SAFETENSORS_F64: { double v; memcpy(&v, p + 8 * i, 8); return v; }
  case ST_SAFETENSORS_F32: { float v; memcpy(&v, p + 4 * i, 4); return v; }
  case ST_SAFETENSORS_F16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return st_f16_to_f32(v); }
  case ST_SAFETENSORS_BF16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return st_bf16_to_f32(v); }
  case ST_SAFETENSORS_F8_E4M3: return st_fp8_e4m3fn_to_f32(p[i]);
  case ST_SAFETENSORS_F8_E5M2: return st_fp8_e5m2_to_f32(p[i]);
  case ST_SAFETENSORS_F8_E8M0: return st_e8m0_to_f32(p[i]);
  case ST_SAFETENSORS_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
  case ST_SAFETENSORS_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
  case ST_SAFETENSORS_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); return v; }
  case ST_SAFETENSORS_I8: return (int8_t)p[i];
  case ST_SAFETENSORS_U8: case ST_SAFETENSORS_BOOL: return p[i];
  case ST_SAFETENSORS_DTYPE_COUNT: break;
  }
  return 0;
}

/* Plain dtypes: dst[i] = (float)stored[i]. */
static void convert_plain(const st_safetensors_tensor *t, float *dst) {
  const unsigned char *p = t->data;
  int64_t n = (int64_t)t->n_elements, work = n;
  (void)work;
  switch (t->dtype) {
  case ST_SAFETENSORS_F32:
    memcpy(dst, p, (size_t)n * 4);
    return;
  case ST_SAFETENSORS_BF16:
    PARALLEL_FOR
    for (int64_t i = 0; i < n; i++) {
      uint16_t v;
      memcpy(&v, p + 2 * i, 2);
      dst[i] = st_bf16_to_f32(v);
    }
    return;
  case ST_SAFETENSORS_F16:
    PARALLEL_FOR
    for (int64_t i = 0; i < n; i++) {
      uint16_t v;
      memcpy(&v, p + 2 * i, 2);
      dst[i] = st_f16_to_f32(v);
    }
    return;
  default:
    PARALLEL_FOR
    for (int64_t i = 0; i < n; i++) dst[i] = (float)load_scalar(t->dtype, p, (uint64_t)i);
    return;
  }
}

/* FP8 e4m3fn [out, in] times one scale per bo x bi tile. The product of an fp8 value and a
** power-of-two scale is exact; with F32 scales it is one fp32 rounding, as in the reference. */
static void dequant_fp8(const st_safetensors_tensor *w, const st_safetensors_tensor *s, int bo,
                        int bi, float *dst) {
  int64_t out = w->shape[0], in = w->shape[1], scale_cols = s->shape[1], work = out * in;
  (void)work;
  float lut[256];
  for (int i = 0; i < 256; i++) lut[i] = st_fp8_e4m3fn_to_f32((uint8_t)i);
  PARALLEL_FOR
  for (int64_t r = 0; r < out; r++) {
    const unsigned char *q = w->data + r * in;
    float *d = dst + r * in;
    uint64_t srow = (uint64_t)((r / bo) * scale_cols);
    for (int64_t c0 = 0; c0 < in; c0 += bi) {
      int64_t c1 = ST_MIN(c0 + bi, in);
      float scale = (float)load_scalar(s->dtype, s->data, srow + (uint64_t)(c0 / bi));
      for (int64_t c = c0; c < c1; c++) d[c] = lut[q[c]] * scale;
    }
  }
}

/* FP4 e2m1 packed [out, in/2] (element 2k = low nibble of byte k) times e8m0 [out, in/32];
** in % 32 == 0. Every product is exact (power-of-two scales). */
static void dequant_fp4(const st_safetensors_tensor *w, const st_safetensors_tensor *s,
                        int64_t out, int64_t in, float *dst) {
  int64_t work = out * in;
  (void)work;
  float lut[16];
  for (int i = 0; i < 16; i++) lut[i] = st_fp4_e2m1_to_f32((uint8_t)i);
  PARALLEL_FOR
  for (int64_t r = 0; r < out; r++) {
    const unsigned char *q = w->data + r * (in / 2);
    const unsigned char *sc = s->data + r * (in / 32);
    float *d = dst + r * in;
    for (int64_t b = 0; b < in / 32; b++) {
      float scale = st_e8m0_to_f32(sc[b]);
      for (int64_t k = b * 16; k < b * 16 + 16; k++) {
        d[2 * k] = lut[q[k] & 0xf] * scale;
        d[2 * k + 1] = lut[q[k] >> 4] * scale;
      }
    }
  }
}

static int same_shape(int rank, const int64_t *a, int rank_b, const int64_t *b) {
  if (rank != rank_b) return 0;
  for (int i = 0; i < rank; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

/* Validates the requested shape and returns its element count. */
static st_status requested_count(const st_checkpoint *ck, const char *canonical, int rank,
                                 const int64_t *shape, uint64_t *n) {
  if (rank < 0 || rank > ST_SAFETENSORS_MAX_RANK || (rank > 0 && !shape))
    return st_fail(ST_EINVAL, "%s: tensor '%s': requested rank %d is invalid", ck->dir, canonical,
                   rank);
  *n = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0 || (shape[i] && *n > (SIZE_MAX / 8) / (uint64_t)shape[i]))
      return st_fail(ST_EINVAL, "%s: tensor '%s': requested shape has a bad dimension %lld",
                     ck->dir, canonical, (long long)shape[i]);
    *n *= (uint64_t)shape[i];
  }
  return ST_OK;
}

static st_status wrong_shape(const st_checkpoint *ck, const entry *e, int rank, const int64_t *shape,
                             const char *hint) {
  char w[NAME_MAX_LEN + 64], a[256], b[256];
  return st_fail(ST_EFORMAT, "%s: tensor %s: expected shape %s, found %s %s%s", file_of(ck, e),
                 who(w, sizeof w, e), shape_str(a, sizeof a, rank, shape),
                 st_safetensors_dtype_name(e->t->dtype),
                 shape_str(b, sizeof b, e->t->rank, e->t->shape), hint);
}

/* Checks an FP8 weight and its block scales against the requested shape; *scale_out is the
** scale entry and bo x bi the block. */
static st_status check_fp8(const st_checkpoint *ck, const entry *e, int rank, const int64_t *shape,
                           const entry **scale_out, int *bo_out, int *bi_out) {
  char w[NAME_MAX_LEN + 64], a[256];
  const char *file = file_of(ck, e);
  if (rank != 2 || e->t->rank != 2)
    return st_fail(ST_EUNSUPPORTED, "%s: tensor %s: FP8 is only supported for 2-D weights (found "
                   "%s)", file, who(w, sizeof w, e), shape_str(a, sizeof a, e->t->rank, e->t->shape));
  if (!same_shape(rank, shape, e->t->rank, e->t->shape)) return wrong_shape(ck, e, rank, shape, "");
  int bo = ck->config.weight_block[0], bi = ck->config.weight_block[1];
  if ((bo != 128 && bo != 64) || (bi != 128 && bi != 64))
    return st_fail(ST_EUNSUPPORTED, "%s: tensor %s: FP8 block size %dx%d from "
                   "quantization_config.weight_block_size is not supported (128 or 64 only)",
                   file, who(w, sizeof w, e), bo, bi);
  const entry *s = find_scale(ck, e->canonical);
  if (!s)
    return st_fail(ST_EFORMAT, "%s: tensor %s: FP8 weight has no block scale (expected '%.*s.scale')",
                   file, who(w, sizeof w, e), (int)(strlen(e->canonical) - 7), e->canonical);
  int64_t want[2] = {(shape[0] + bo - 1) / bo, (shape[1] + bi - 1) / bi};
  if (s->t->dtype != ST_SAFETENSORS_F8_E8M0 && s->t->dtype != ST_SAFETENSORS_F32 &&
      s->t->dtype != ST_SAFETENSORS_BF16)
    return st_fail(ST_EUNSUPPORTED, "%s: tensor %s: FP8 block scale dtype %s is not F8_E8M0, F32 or "
                   "BF16", file_of(ck, s), who(w, sizeof w, s), st_safetensors_dtype_name(s->t->dtype));
  if (!same_shape(2, want, s->t->rank, s->t->shape)) {
    char hint[128];
    snprintf(hint, sizeof hint, " (block scales of %s %dx%d for weight %s)", e->canonical, bo, bi,
             shape_str(a, sizeof a, 2, shape));
    return wrong_shape(ck, s, 2, want, hint);
  }
  *scale_out = s;
  *bo_out = bo;
  *bi_out = bi;
  return ST_OK;
}

static st_status read_fp8(st_checkpoint *ck, const entry *e, int rank, const int64_t *shape,
                          float *dst) {
  const entry *s;
  int bo, bi;
  st_status rc = check_fp8(ck, e, rank, shape, &s, &bo, &bi);
  if (rc) return rc;
  dequant_fp8(e->t, s->t, bo, bi, dst);
  count_read(ck, e->t->n_bytes + s->t->n_bytes);
  return ST_OK;
}

/* I8 stored [out, in/2] for a requested [out, in] with an e8m0 scale: packed FP4. Returns 1 when
** the tensor looks like that (then *rc is the outcome of the checks and *scale_out the scale
** entry), 0 when it is plain I8. */
static int match_fp4(const st_checkpoint *ck, const entry *e, int rank, const int64_t *shape,
                     const entry **scale_out, st_status *rc) {
  if (e->t->dtype != ST_SAFETENSORS_I8 || rank != 2 || e->t->rank != 2 ||
      e->t->shape[0] != shape[0] || e->t->shape[1] * 2 != shape[1])
    return 0;
  const entry *s = find_scale(ck, e->canonical);
  if (!s || s->t->dtype != ST_SAFETENSORS_F8_E8M0) return 0;
  char w[NAME_MAX_LEN + 64], a[256];
  if (shape[1] % 32 != 0) {
    *rc = st_fail(ST_EUNSUPPORTED, "%s: tensor %s: packed FP4 with %lld input columns; the format "
                  "needs a multiple of 32 (one ue8m0 scale per 32 elements)", file_of(ck, e),
                  who(w, sizeof w, e), (long long)shape[1]);
    return 1;
  }
  int64_t want[2] = {shape[0], shape[1] / 32};
  if (!same_shape(2, want, s->t->rank, s->t->shape)) {
    char hint[128];
    snprintf(hint, sizeof hint, " (FP4 scales, one per 32 elements of logical %s)",
             shape_str(a, sizeof a, 2, shape));
    *rc = wrong_shape(ck, s, 2, want, hint);
    return 1;
  }
  *scale_out = s;
  *rc = ST_OK;
  return 1;
}

static int try_fp4(st_checkpoint *ck, const entry *e, int rank, const int64_t *shape, float *dst,
                   st_status *rc) {
  const entry *s = NULL;
  if (!match_fp4(ck, e, rank, shape, &s, rc)) return 0;
  if (*rc) return 1;
  dequant_fp4(e->t, s->t, shape[0], shape[1], dst);
  count_read(ck, e->t->n_bytes + s->t->n_bytes);
  return 1;
}

st_status st_checkpoint_view(st_checkpoint *ck, const char *canonical, int64_t rows, int64_t cols,
                             st_weight *out) {
  memset(out, 0, sizeof *out);
  int64_t shape[2] = {rows, cols};
  uint64_t n;
  st_status rc = requested_count(ck, canonical, 2, shape, &n);
  if (rc != ST_OK) return rc;
  const entry *e = find(ck, canonical);
  if (!e) return not_found(ck, canonical);
  out->rows = rows;
  out->cols = cols;
  out->data = e->t->data;
  out->block[0] = out->block[1] = 1;
  const entry *s = NULL;
  if (e->t->dtype == ST_SAFETENSORS_F8_E4M3) {
    if ((rc = check_fp8(ck, e, 2, shape, &s, &out->block[0], &out->block[1]))) return rc;
    out->dtype = ST_W_FP8_E4M3;
    out->scale_dtype = s->t->dtype == ST_SAFETENSORS_F8_E8M0 ? ST_WSCALE_UE8M0
                       : s->t->dtype == ST_SAFETENSORS_F32  ? ST_WSCALE_F32
                                                            : ST_WSCALE_BF16;
  } else if (match_fp4(ck, e, 2, shape, &s, &rc)) {
    if (rc) return rc;
    out->dtype = ST_W_FP4_E2M1;
    out->scale_dtype = ST_WSCALE_UE8M0;
    out->block[1] = 32;
  } else {
    if (!same_shape(2, shape, e->t->rank, e->t->shape)) return wrong_shape(ck, e, 2, shape, "");
    switch (e->t->dtype) {
    case ST_SAFETENSORS_F32: out->dtype = ST_W_F32; break;
    case ST_SAFETENSORS_BF16: out->dtype = ST_W_BF16; break;
    case ST_SAFETENSORS_F16: out->dtype = ST_W_F16; break;
    default: {
      char w[NAME_MAX_LEN + 64];
      return st_fail(ST_EUNSUPPORTED, "%s: tensor %s: dtype %s is not a weight format the backends "
                     "read (F32, BF16, F16, F8_E4M3 + scales, packed FP4)", file_of(ck, e),
                     who(w, sizeof w, e), st_safetensors_dtype_name(e->t->dtype));
    }
    }
    if (out->dtype == ST_W_F32 && ((uintptr_t)e->t->data & 3u))
      return st_fail(ST_EUNSUPPORTED, "%s: tensor %s: F32 data is not 4-byte aligned in the file",
                     file_of(ck, e), canonical);
  }
  if (s) out->scales = s->t->data;
  count_read(ck, e->t->n_bytes + (s ? s->t->n_bytes : 0));
  return ST_OK;
}

st_status st_checkpoint_read_f32(st_checkpoint *ck, const char *canonical, int rank,
                                 const int64_t *shape, float *dst) {
  uint64_t n;
  st_status rc = requested_count(ck, canonical, rank, shape, &n);
  if (rc != ST_OK) return rc;
  const entry *e = find(ck, canonical);
  if (!e) return not_found(ck, canonical);
  if (e->t->dtype == ST_SAFETENSORS_F8_E4M3) return read_fp8(ck, e, rank, shape, dst);
  if (try_fp4(ck, e, rank, shape, dst, &rc)) return rc;
  if (!same_shape(rank, shape, e->t->rank, e->t->shape))
    return wrong_shape(ck, e, rank, shape,
                       e->t->dtype == ST_SAFETENSORS_I8 && rank == 2
                           ? " (packed FP4 would be I8 [out, in/2] with an F8_E8M0 '.scale' [out, in/32])"
                           : "");
  convert_plain(e->t, dst);
  count_read(ck, e->t->n_bytes);
  return ST_OK;
}

/* The checks st_checkpoint_read_f32 makes, without reading: a buffer is sized from the request
** only once the checkpoint is known to hold a tensor of that shape (a config value that does not
** match the file must give a shape error, not an allocation of what the config claims). */
static st_status check_request(const st_checkpoint *ck, const char *canonical, int rank,
                               const int64_t *shape) {
  const entry *e = find(ck, canonical);
  if (!e) return not_found(ck, canonical);
  const entry *s;
  int bo, bi;
  st_status rc = ST_OK;
  if (e->t->dtype == ST_SAFETENSORS_F8_E4M3) return check_fp8(ck, e, rank, shape, &s, &bo, &bi);
  if (match_fp4(ck, e, rank, shape, &s, &rc)) return rc;
  if (!same_shape(rank, shape, e->t->rank, e->t->shape))
    return wrong_shape(ck, e, rank, shape,
                       e->t->dtype == ST_SAFETENSORS_I8 && rank == 2
                           ? " (packed FP4 would be I8 [out, in/2] with an F8_E8M0 '.scale' [out, in/32])"
                           : "");
  return ST_OK;
}

st_status st_checkpoint_load_f32(st_checkpoint *ck, const char *canonical, int rank,
                                 const int64_t *shape, float **out) {
  *out = NULL;
  uint64_t n;
  st_status rc = requested_count(ck, canonical, rank, shape, &n);
  if (rc != ST_OK) return rc;
  if ((rc = check_request(ck, canonical, rank, shape)) != ST_OK) return rc;
  float *buf = malloc(n ? (size_t)n * sizeof *buf : 1);
  if (!buf)
    return st_fail(ST_ENOMEM, "%s: tensor '%s': out of memory for %llu floats", ck->dir, canonical,
                   (unsigned long long)n);
  if ((rc = st_checkpoint_read_f32(ck, canonical, rank, shape, buf)) != ST_OK) {
    free(buf);
    return rc;
  }
  *out = buf;
  return ST_OK;
}

st_status st_checkpoint_read_i32_in(st_checkpoint *ck, const char *canonical, int rank,
                                    const int64_t *shape, int64_t lo, int64_t hi, int32_t *dst) {
  uint64_t n;
  st_status rc = requested_count(ck, canonical, rank, shape, &n);
  if (rc != ST_OK) return rc;
  const entry *e = find(ck, canonical);
  if (!e) return not_found(ck, canonical);
  char w[NAME_MAX_LEN + 64];
  switch (e->t->dtype) {
  case ST_SAFETENSORS_I64: case ST_SAFETENSORS_I32: case ST_SAFETENSORS_I16:
  case ST_SAFETENSORS_I8: case ST_SAFETENSORS_U8: case ST_SAFETENSORS_BOOL:
    break;
  default:
    return st_fail(ST_EUNSUPPORTED, "%s: tensor %s: dtype %s is not an integer type",
                   file_of(ck, e), who(w, sizeof w, e), st_safetensors_dtype_name(e->t->dtype));
  }
  if (!same_shape(rank, shape, e->t->rank, e->t->shape)) return wrong_shape(ck, e, rank, shape, "");
  if (lo < INT32_MIN) lo = INT32_MIN;
  if (hi > INT32_MAX) hi = INT32_MAX;
  for (uint64_t i = 0; i < n; i++) {
    int64_t v;
    switch (e->t->dtype) {
    case ST_SAFETENSORS_I64: memcpy(&v, e->t->data + 8 * i, 8); break;
    case ST_SAFETENSORS_I32: { int32_t x; memcpy(&x, e->t->data + 4 * i, 4); v = x; break; }
    case ST_SAFETENSORS_I16: { int16_t x; memcpy(&x, e->t->data + 2 * i, 2); v = x; break; }
    case ST_SAFETENSORS_I8: v = (int8_t)e->t->data[i]; break;
    default: v = e->t->data[i]; break;
    }
    if (v < lo || v > hi) {
      count_read(ck, e->t->n_bytes);
      return st_fail(ST_EFORMAT, "%s: tensor %s: value %lld at flat index %llu is outside "
                     "[%lld, %lld]", file_of(ck, e), who(w, sizeof w, e), (long long)v,
                     (unsigned long long)i, (long long)lo, (long long)hi);
    }
    dst[i] = (int32_t)v;
  }
  count_read(ck, e->t->n_bytes);
  return ST_OK;
}

st_status st_checkpoint_read_i32(st_checkpoint *ck, const char *canonical, int rank,
                                 const int64_t *shape, int32_t *dst) {
  return st_checkpoint_read_i32_in(ck, canonical, rank, shape, INT32_MIN, INT32_MAX, dst);
}
