/*
** import.c — dump directory + mapping table -> one trace (see import.h for what is aligned).
**
** Order: read the table; list the directory's .pt files and parse their name tags; open each
** with the torch.save reader and take its value and meta; per step, the alignment inputs
** (@tokens, @positions, @seq_lens) say which rows of a flat token axis are the chosen request's
** and at which positions; every mapped tensor is then reshaped to its tap's layout, converted to
** the tap's element type, and handed to the recorder (rows grouped into runs of consecutive
** positions; a position already written for a tap is skipped, so overlapping chunks count once).
** Whatever is dropped or changed is a note on its tap, written to the `import` attribute.
*/
#define _GNU_SOURCE
#include "import.h"

#include <dirent.h>
#include <sys/stat.h>
#include <fnmatch.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"
#include "engine/indexer.h"
#include "engine/settings.h"
#include "recorder/recorder.h"
#include "schemas/catalogue.h"
#include "st_import_maps.h"
#include "torchsave.h"

#define MAX_MAP_LINES 1024
#define MAX_AXES 8

enum { ALIGN_TOKENS = -2, ALIGN_POSITIONS = -3, ALIGN_SEQ_LENS = -4, ALIGN_RIDS = -5 };

typedef struct map_line {
  char name[256];  /* with {L} */
  int tap;         /* st_tap_id, or ALIGN_* */
  char axes[MAX_AXES][8];
  int n_axes;
  int topk;
  int csa_layer; /* the dump's layer id counts CSA layers only (sglang's compress_layer_id) */
  int line;
} map_line;

typedef struct dump_file {
  char *path, *name;
  int step, rank, layer; /* layer -1: none */
  long dump_index;
  int in_dict;           /* sglang-pass: name is a key of the file's dict (one file, many tensors) */
} dump_file;

typedef struct tap_seen {
  int64_t next_pos; /* position taps: the next position that may be written */
  int emitted;
} tap_seen;

typedef struct importer {
  const st_import_options *opt;
  st_config cfg;
  map_line *map;
  int n_map;
  dump_file *files;
  int n_files;
  json_t *notes;    /* tap name -> [note, ...] */
  json_t *unmapped; /* [name, ...] */
  st_recorder *rec;
  const st_tap_sink *sink;
  tap_seen seen[ST_TAP_COUNT][ST_MAX_LAYERS + 1];
  int32_t *tokens;  /* by position */
  int64_t n_tokens_cap, n_tokens, n_prompt;
  st_import_result *res;
  st_torchsave *cached;     /* sglang-pass: the Pass file open last, shared by its entries */
  char *cached_path;
} importer;

const char *st_import_builtin_map(const char *format) {
  for (int i = 0; i < ST_IMPORT_MAP_COUNT; i++)
    if (!strcmp(st_import_maps[i].format, format)) return st_import_maps[i].text;
  return NULL;
}

/* ------------------------------------------------------------------ the mapping table */

static st_status parse_map(importer *im, const char *text, const char *origin) {
  im->map = calloc(MAX_MAP_LINES, sizeof *im->map);
  if (!im->map) return st_fail(ST_ENOMEM, "mapping table");
  int line_no = 0;
  for (const char *p = text; *p;) {
    const char *eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    char line[1024];
    line_no++;
    if (len >= sizeof line) return st_fail(ST_EFORMAT, "%s line %d: longer than %zu characters", origin, line_no, sizeof line - 1);
    memcpy(line, p, len);
    line[len] = 0;
    p += len + (eol ? 1 : 0);
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char name[256], tap[64], layout[128], align[64] = "-", extra[8];
    int n = sscanf(line, "%255s %63s %127s %63s %7s", name, tap, layout, align, extra);
    if (n <= 0) continue;
    if (n < 3 || n > 4)
      return st_fail(ST_EFORMAT, "%s line %d: expected NAME TAP LAYOUT [ALIGN]", origin, line_no);
    if (im->n_map == MAX_MAP_LINES) return st_fail(ST_ETOOBIG, "%s: more than %d lines", origin, MAX_MAP_LINES);
    map_line *m = &im->map[im->n_map];
    snprintf(m->name, sizeof m->name, "%s", name);
    m->line = line_no;
    static const struct { const char *name; int id; } special[] = {
      {"@tokens", ALIGN_TOKENS}, {"@positions", ALIGN_POSITIONS}, {"@seq_lens", ALIGN_SEQ_LENS}, {"@rids", ALIGN_RIDS}};
    m->tap = -1;
    for (size_t k = 0; k < sizeof special / sizeof *special; k++)
      if (!strcmp(tap, special[k].name)) m->tap = special[k].id;
    for (int k = 0; k < ST_TAP_COUNT && m->tap == -1; k++)
      if (!strcmp(st_tap_catalogue[k].suffix, tap)) m->tap = k;
    if (m->tap == -1)
      return st_fail(ST_EFORMAT, "%s line %d: '%s' is no tap of schemas/taps.def (nor @tokens, @positions, "
                     "@seq_lens, @rids)", origin, line_no, tap);
    for (char *ax = strtok(layout, ","); ax; ax = strtok(NULL, ",")) {
      if (m->n_axes == MAX_AXES || strlen(ax) >= sizeof m->axes[0])
        return st_fail(ST_EFORMAT, "%s line %d: layout with more than %d axes or a long axis name", origin, line_no, MAX_AXES);
      snprintf(m->axes[m->n_axes++], sizeof m->axes[0], "%s", ax);
    }
    for (char *flag = strtok(align, ","); flag; flag = strtok(NULL, ",")) {
      if (!strcmp(flag, "topk")) m->topk = 1;
      else if (!strcmp(flag, "csa_layer")) m->csa_layer = 1;
      else if (strcmp(flag, "-"))
        return st_fail(ST_EFORMAT, "%s line %d: unknown ALIGN '%s' (topk, csa_layer or -)", origin, line_no, flag);
    }
    im->n_map++;
  }
  return ST_OK;
}

/* The line whose NAME matches name ({L} = the layer; must agree with the layer tag). */
static const map_line *map_find(const importer *im, const char *name, int *layer) {
  for (int i = 0; i < im->n_map; i++) {
    const map_line *m = &im->map[i];
    const char *brace = strstr(m->name, "{L}");
    if (!brace) {
      if (!strcmp(m->name, name)) return m;
      continue;
    }
    size_t pre = (size_t)(brace - m->name);
    if (strncmp(name, m->name, pre)) continue;
    char *end;
    long l = strtol(name + pre, &end, 10);
    if (end == name + pre || strcmp(end, brace + 3)) continue;
    if (*layer >= 0 && *layer != l) continue;
    *layer = (int)l;
    return m;
  }
  return NULL;
}

/* ------------------------------------------------------------------ the directory */

/* Parses "k=v___k=v.pt"; returns 0 when the name has a name= tag. */
static int parse_file_name(const char *base, dump_file *f) {
  f->step = 0;
  f->rank = 0;
  f->layer = -1;
  f->dump_index = 0;
  f->name = NULL;
  size_t n = strlen(base);
  if (n < 4 || strcmp(base + n - 3, ".pt")) return -1;
  char *copy = strndup(base, n - 3);
  if (!copy) return -1;
  for (char *part = copy, *next; part; part = next) {
    next = strstr(part, "___");
    if (next) { *next = 0; next += 3; }
    char *eq = strchr(part, '=');
    if (!eq) continue;
    *eq = 0;
    const char *v = eq + 1;
    if (!strcmp(part, "name")) { free(f->name); f->name = strdup(v); }
    else if (!strcmp(part, "step")) f->step = atoi(v);
    else if (!strcmp(part, "rank")) f->rank = atoi(v);
    else if (!strcmp(part, "layer_id")) f->layer = atoi(v);
    else if (!strcmp(part, "dump_index")) f->dump_index = atol(v);
  }
  free(copy);
  return f->name ? 0 : -1;
}

static int file_cmp(const void *a, const void *b) {
  const dump_file *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  if (x->dump_index != y->dump_index) return x->dump_index < y->dump_index ? -1 : 1;
  return strcmp(x->path, y->path);
}

/* The .pt files of dir, or of its one subdirectory when dir holds none (the dumper writes
** DUMPER_DIR/<exp_name>/). */
static st_status list_files(importer *im, const char *dir, int depth) {
  DIR *d = opendir(dir);
  if (!d) return st_fail(ST_EIO, "open directory %s", dir);
  struct dirent *e;
  char sub[4096] = "";
  int n_sub = 0, cap = 0;
  st_status rc = ST_OK;
  while ((e = readdir(d)) && !rc) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    size_t len = strlen(e->d_name);
    if (len > 3 && !strcmp(e->d_name + len - 3, ".pt")) {
      dump_file f;
      if (parse_file_name(e->d_name, &f)) {
        json_array_append_new(im->unmapped, json_sprintf("%s (no name= tag in the file name)", e->d_name));
        continue;
      }
      if (im->n_files == cap) {
        cap = cap ? cap * 2 : 64;
        dump_file *grown = realloc(im->files, (size_t)cap * sizeof *grown);
        if (!grown) { free(f.name); rc = st_fail(ST_ENOMEM, "file list"); break; }
        im->files = grown;
      }
      f.path = strdup(path);
      if (!f.path) { free(f.name); rc = st_fail(ST_ENOMEM, "file list"); break; }
      im->files[im->n_files++] = f;
    } else if (e->d_type == DT_DIR) {
      n_sub++;
      snprintf(sub, sizeof sub, "%s", path);
    }
  }
  closedir(d);
  if (rc) return rc;
  if (!im->n_files && n_sub == 1 && depth == 0) return list_files(im, sub, 1);
  if (!im->n_files)
    return st_fail(ST_ENOTFOUND, "%s holds no dump files (NAME.pt with key=value tags joined by ___)", dir);
  qsort(im->files, (size_t)im->n_files, sizeof *im->files, file_cmp);
  return ST_OK;
}

/* ------------------------------------------------------------------ values */

static void note(importer *im, st_tap_id tap, int layer, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void note(importer *im, st_tap_id tap, int layer, const char *fmt, ...) {
  char name[128], text[512];
  st_tap_full_name(name, sizeof name, tap, layer);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  json_t *list = json_object_get(im->notes, name);
  if (!list) { list = json_array(); json_object_set_new(im->notes, name, list); }
  for (size_t i = 0; i < json_array_size(list); i++)
    if (!strcmp(json_string_value(json_array_get(list, i)), text)) return;
  json_array_append_new(list, json_string(text));
  im->res->n_notes++;
}

static float half_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
  float v;
  if (exp == 0) v = ldexpf((float)man, -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = ldexpf((float)(man | 1024), (int)exp - 25);
  return sign ? -v : v;
}

/* fp8: e4m3fn (no inf; S.1111.111 is NaN), e4m3fnuz (bias 8, 0x80 NaN), e5m2 (IEEE-like). */
static float fp8_to_f32(uint8_t b, const char *dtype) {
  int e5 = !strcmp(dtype, "float8_e5m2"), fnuz = !strcmp(dtype, "float8_e4m3fnuz");
  int man_bits = e5 ? 2 : 3, bias = e5 ? 15 : (fnuz ? 8 : 7);
  int sign = b >> 7, exp = (b >> man_bits) & (e5 ? 31 : 15), man = b & ((1 << man_bits) - 1);
  if (fnuz && b == 0x80) return NAN;
  if (!e5 && !fnuz && exp == 15 && man == 7) return NAN;
  if (e5 && exp == 31) return man ? NAN : (sign ? -INFINITY : INFINITY);
  float v = exp ? ldexpf((float)(man | 1 << man_bits), exp - bias - man_bits) : ldexpf((float)man, 1 - bias - man_bits);
  return sign ? -v : v;
}

/* Element i of a tensor's bytes as double (floats) or int64 (ints). */
static int elem_is_float(const char *dtype) { return !strncmp(dtype, "float", 5) || !strcmp(dtype, "bfloat16"); }

static double elem_f(const uint8_t *p, const char *dtype) {
  if (!strcmp(dtype, "float32")) { float f; memcpy(&f, p, 4); return f; }
  if (!strcmp(dtype, "float64")) { double f; memcpy(&f, p, 8); return f; }
  if (!strcmp(dtype, "bfloat16")) { uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16; float f; memcpy(&f, &u, 4); return f; }
  if (!strcmp(dtype, "float16")) return half_to_f32((uint16_t)(p[0] | p[1] << 8));
  return fp8_to_f32(p[0], dtype);
}

static int64_t elem_i(const uint8_t *p, const char *dtype, size_t size) {
  if (!strcmp(dtype, "bool") || !strcmp(dtype, "uint8")) return p[0];
  if (!strcmp(dtype, "int8")) return (int8_t)p[0];
  if (size == 2) { int16_t v; memcpy(&v, p, 2); return !strcmp(dtype, "uint16") ? (uint16_t)v : v; }
  if (size == 4) { int32_t v; memcpy(&v, p, 4); return !strcmp(dtype, "uint32") ? (int64_t)(uint32_t)v : v; }
  int64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* A dumped value: the tensor inside {"value": ..., "meta": ...} or the bare tensor. */
static const st_torch_tensor *value_tensor(const st_py *root, const st_py **meta) {
  *meta = NULL;
  const st_py *v = root;
  if (root->kind == ST_PY_DICT && st_py_dict_get(root, "value")) {
    v = st_py_dict_get(root, "value");
    *meta = st_py_dict_get(root, "meta");
  }
  return v->kind == ST_PY_TENSOR ? v->tensor : NULL;
}

static int64_t meta_int(const st_py *meta, const char *key, int64_t fallback) {
  const st_py *v = st_py_dict_get(meta, key);
  return v && v->kind == ST_PY_INT ? v->i : fallback;
}

/* Opens the file of a dump (a Pass file stays open for its other entries: close_dump keeps it). */
static st_status open_dump(importer *im, const dump_file *f, st_torchsave **ts) {
  if (f->in_dict && im->cached && !strcmp(im->cached_path, f->path)) {
    *ts = im->cached;
    return ST_OK;
  }
  st_status rc = st_torchsave_open(f->path, ts);
  if (rc || !f->in_dict) return rc;
  st_torchsave_close(im->cached);
  free(im->cached_path);
  im->cached = *ts;
  im->cached_path = strdup(f->path);
  if (!im->cached_path) { im->cached = NULL; st_torchsave_close(*ts); return st_fail(ST_ENOMEM, "%s", f->path); }
  return ST_OK;
}

static void close_dump(importer *im, st_torchsave *ts) {
  if (ts != im->cached) st_torchsave_close(ts);
}

/* The value a dump names: the file's root, or its entry f->name (sglang-pass). */
static const st_py *dump_root(st_torchsave *ts, const dump_file *f) {
  const st_py *root = st_torchsave_root(ts);
  if (!f->in_dict) return root;
  const st_py *v = st_py_dict_get(root, f->name);
  return v ? v : root; /* cannot happen: the name was read from this dict */
}

/* Reads a whole tensor as int64 values (the alignment inputs). */
static st_status read_ints(st_torchsave *ts, const st_torch_tensor *t, const char *path, int64_t **out, int64_t *n) {
  *out = NULL;
  *n = t->numel;
  if (elem_is_float(t->dtype)) return st_fail(ST_EFORMAT, "%s: expected an integer tensor, found %s", path, t->dtype);
  uint8_t *raw = malloc((size_t)t->numel * t->elem_size + 1);
  int64_t *v = malloc((size_t)t->numel * sizeof *v + 1);
  st_status rc = raw && v ? st_torchsave_read(ts, t, raw, (size_t)t->numel * t->elem_size) : st_fail(ST_ENOMEM, "%s", path);
  if (!rc) for (int64_t i = 0; i < t->numel; i++) v[i] = elem_i(raw + (size_t)i * t->elem_size, t->dtype, t->elem_size);
  free(raw);
  if (rc) free(v);
  else *out = v;
  return rc;
}

/* ------------------------------------------------------------------ one step */

typedef struct step_align {
  int64_t *positions, n_positions; /* per row of the flat axis */
  int64_t row0, rows;              /* the chosen request's rows of the flat axis */
  int has_positions;
} step_align;

/* Emits rows [r0, r1) (of the tap's token axis) whose positions are pos[r0..r1), in runs of
** consecutive positions, skipping positions the tap already holds. */
static st_status emit_rows(importer *im, st_tap_id tap, int layer, const int64_t *pos, int64_t r0, int64_t r1,
                           st_dtype type, int rank, const int64_t *shape, const uint8_t *data, size_t row_bytes) {
  tap_seen *s = &im->seen[tap][layer < 0 ? ST_MAX_LAYERS : layer];
  int64_t r = r0;
  while (r < r1) {
    if (pos[r] < s->next_pos) {
      note(im, tap, layer, "positions written twice (overlapping chunks or steps): the first kept");
      r++;
      continue;
    }
    int64_t e = r + 1;
    while (e < r1 && pos[e] == pos[e - 1] + 1) e++;
    int64_t sh[MAX_AXES];
    memcpy(sh, shape, sizeof(int64_t) * (size_t)rank);
    sh[0] = e - r;
    st_status rc = im->sink->emit(im->sink->ctx, tap, layer, pos[r], type, rank, sh, data + (size_t)r * row_bytes);
    if (rc) return rc;
    s->next_pos = pos[e - 1] + 1;
    s->emitted = 1;
    r = e;
  }
  return ST_OK;
}

/* The tap's axes after the first, from the model's config (-1: any size); returns their count. */
static int tap_dims(const st_config *c, st_tap_id tap, int64_t *d) {
  switch (tap) {
  case ST_TAP_INPUT: case ST_TAP_OUTPUT: d[0] = c->hc_mult; d[1] = c->hidden_size; return 2;
  case ST_TAP_ATTN_X: case ST_TAP_ATTN_OUT: case ST_TAP_FFN_OUT: d[0] = c->hidden_size; return 1;
  case ST_TAP_ATTN_QR: d[0] = c->q_lora_rank; return 1;
  case ST_TAP_ATTN_Q: d[0] = c->num_attention_heads; d[1] = c->head_dim; return 2;
  case ST_TAP_ATTN_KV: case ST_TAP_COMPRESSOR_KV: d[0] = c->head_dim; return 1;
  case ST_TAP_INDEXER_Q: case ST_TAP_INDEXER_Q_USED: d[0] = c->index_n_heads; d[1] = c->index_head_dim; return 2;
  case ST_TAP_INDEXER_K: case ST_TAP_INDEXER_K_USED: d[0] = c->index_head_dim; return 1;
  case ST_TAP_INDEXER_WEIGHTS: d[0] = c->index_n_heads; return 1;
  case ST_TAP_INDEXER_SCORES: case ST_TAP_INDEXER_TOPK: d[0] = -1; return 1;
  case ST_TAP_FFN_EXPERTS: d[0] = c->num_experts_per_tok; return 1;
  case ST_TAP_LOGITS: d[0] = c->vocab_size; return 1;
  default: return -1;
  }
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* A source tensor in memory: its element type (torch's names: "float32", "int64", ...), shape and
** row-major bytes, whatever file format it came from. */
typedef struct raw_tensor {
  const char *dtype;
  size_t elem_size;
  int ndim;
  int64_t shape[MAX_AXES];
  int64_t numel;
  const uint8_t *data; /* numel * elem_size bytes */
} raw_tensor;

static st_status import_values(importer *im, const dump_file *f, const map_line *m, int layer,
                               const raw_tensor *t, const st_py *meta, const step_align *al);

/* One mapped tensor of a step (a torch.save file) -> its tap. */
static st_status import_tensor(importer *im, const dump_file *f, const map_line *m, int layer, st_torchsave *ts,
                               const st_torch_tensor *tt, const st_py *meta, const step_align *al) {
  if (tt->ndim > MAX_AXES)
    return st_fail(ST_EFORMAT, "%s: tensor %s has %d axes (at most %d)", f->path, f->name, tt->ndim, MAX_AXES);
  raw_tensor t = {.dtype = tt->dtype, .elem_size = tt->elem_size, .ndim = tt->ndim, .numel = tt->numel};
  for (int a = 0; a < tt->ndim; a++) t.shape[a] = tt->shape[a];
  uint8_t *raw = malloc((size_t)tt->numel * tt->elem_size + 1);
  if (!raw) return st_fail(ST_ENOMEM, "tensor %s", f->name);
  st_status rc = st_torchsave_read(ts, tt, raw, (size_t)tt->numel * tt->elem_size);
  t.data = raw;
  if (!rc) rc = import_values(im, f, m, layer, &t, meta, al);
  free(raw);
  return rc;
}

/* One mapped tensor's values -> its tap: layout checked against the model, converted to the tap's
** element type, top-k rows made sets, token rows placed at their positions. */
static st_status import_values(importer *im, const dump_file *f, const map_line *m, int layer,
                               const raw_tensor *t, const st_py *meta, const step_align *al) {
  st_tap_id tap = (st_tap_id)m->tap;
  const st_tap_info *info = &st_tap_catalogue[tap];
  if (info->scope == ST_TAP_SCOPE_LAYER && (layer < 0 || layer >= im->cfg.num_hidden_layers))
    return st_fail(ST_EFORMAT, "%s: tensor %s maps to tap %s but its layer %d is not one of the model's 0..%d",
                   f->path, f->name, info->suffix, layer, im->cfg.num_hidden_layers - 1);
  if (info->scope == ST_TAP_SCOPE_MODEL) layer = -1;
  if (t->ndim != m->n_axes)
    return st_fail(ST_EFORMAT, "%s: tensor %s has %d axes, its layout %s line %d names %d", f->path, f->name,
                   t->ndim, im->opt->format, m->line, m->n_axes);
  /* kept axes: drop B and 1 (size 1), find the token axis (S or N) or the row axis (R) */
  int64_t shape[MAX_AXES];
  int rank = 0, token_axis = -1, flat = 0;
  for (int a = 0; a < m->n_axes; a++) {
    const char *ax = m->axes[a];
    if (!strcmp(ax, "B") || !strcmp(ax, "1")) {
      if (t->shape[a] != 1)
        return st_fail(ST_EUNSUPPORTED, "%s: tensor %s axis %d (%s) has size %lld: only one sequence per dump is "
                       "imported", f->path, f->name, a, ax, (long long)t->shape[a]);
      continue;
    }
    if (!strcmp(ax, "S") || !strcmp(ax, "N")) { token_axis = rank; flat = !strcmp(ax, "N"); }
    shape[rank++] = t->shape[a];
  }
  if (rank == 0) return st_fail(ST_EFORMAT, "%s: tensor %s: layout keeps no axis", f->path, f->name);
  if (info->row_axis == (token_axis >= 0) || (token_axis > 0))
    return st_fail(ST_EFORMAT, "%s: tensor %s: tap %s needs its %s axis first in the layout", f->path, f->name,
                   info->suffix, info->row_axis ? "row (R)" : "token (S or N)");
  int64_t want[MAX_AXES];
  int n_want = tap_dims(&im->cfg, tap, want);
  int shape_ok = n_want < 0 || n_want == rank - 1;
  for (int a = 0; shape_ok && n_want >= 0 && a < n_want; a++) shape_ok = want[a] < 0 || want[a] == shape[a + 1];
  if (!shape_ok) {
    char got[128] = "", need[128] = "";
    for (int a = 1; a < rank; a++) snprintf(got + strlen(got), sizeof got - strlen(got), ", %lld", (long long)shape[a]);
    for (int a = 0; a < n_want; a++) snprintf(need + strlen(need), sizeof need - strlen(need), ", %lld", (long long)want[a]);
    return st_fail(ST_EFORMAT, "%s: tensor %s is [rows%s] in the tap's layout, but tap %s of the model in %s is "
                   "[rows%s] (%s line %d)", f->path, f->name, got, info->suffix, im->opt->model_dir, need,
                   im->opt->map_path ? im->opt->map_path : "the built-in map", m->line);
  }
  size_t n = (size_t)t->numel;
  const uint8_t *raw = t->data;
  st_status rc = ST_OK;
  /* the tap's element type: f32 for float taps, int32 for integer ones (taps.def) */
  int int_tap = strstr(info->shape, " i32") != NULL;
  void *conv = malloc(n * 4 + 4);
  if (!conv) return st_fail(ST_ENOMEM, "tensor %s", f->name);
  if (int_tap) {
    if (elem_is_float(t->dtype)) { free(conv); return st_fail(ST_EFORMAT, "%s: tensor %s is %s; tap %s holds integers", f->path, f->name, t->dtype, info->suffix); }
    int32_t *o = conv;
    for (size_t i = 0; i < n; i++) {
      int64_t v = elem_i(raw + i * t->elem_size, t->dtype, t->elem_size);
      if (v < INT32_MIN || v > INT32_MAX) { free(conv); return st_fail(ST_EFORMAT, "%s: tensor %s value %lld does not fit int32", f->path, f->name, (long long)v); }
      o[i] = (int32_t)v;
    }
    if (strcmp(t->dtype, "int32")) note(im, tap, layer, "converted from %s", t->dtype);
  } else {
    if (!elem_is_float(t->dtype)) { free(conv); return st_fail(ST_EFORMAT, "%s: tensor %s is %s; tap %s holds floats", f->path, f->name, t->dtype, info->suffix); }
    float *o = conv;
    for (size_t i = 0; i < n; i++) o[i] = (float)elem_f(raw + i * t->elem_size, t->dtype);
    if (strcmp(t->dtype, "float32")) note(im, tap, layer, "converted from %s (exactly; the values keep %s precision)", t->dtype, t->dtype);
  }
  size_t row_elems = n / (size_t)(shape[0] ? shape[0] : 1);
  if (m->topk && row_elems) { /* each row: the selected rows as a set, ascending, -1 after */
    int32_t *o = conv;
    for (int64_t r = 0; r < shape[0]; r++) {
      int32_t *row = o + (size_t)r * row_elems;
      size_t valid = 0;
      for (size_t k = 0; k < row_elems; k++) if (row[k] >= 0) row[valid++] = row[k];
      qsort(row, valid, sizeof *row, cmp_i32);
      for (size_t k = valid; k < row_elems; k++) row[k] = -1;
    }
    note(im, tap, layer, "compared as a set: sorted ascending, -1 after the selected rows (the source's order is not kept)");
  }
  st_dtype type = int_tap ? ST_I32 : ST_F32;
  size_t row_bytes = row_elems * 4;
  if (info->row_axis) {
    tap_seen *s = &im->seen[tap][layer < 0 ? ST_MAX_LAYERS : layer];
    if (s->emitted) note(im, tap, layer, "rows dumped again in a later step: written again at their indices");
    rc = im->sink->emit(im->sink->ctx, tap, layer, 0, type, rank, shape, conv);
    s->emitted = 1;
    free(conv);
    return rc;
  }
  /* token rows -> positions */
  int64_t rows = shape[0];
  int64_t *pos = malloc((size_t)(rows ? rows : 1) * sizeof *pos);
  if (!pos) { free(conv); return st_fail(ST_ENOMEM, "positions"); }
  int64_t r0 = 0, r1 = rows;
  const st_py *kept = st_py_dict_get(meta, "positions_kept");
  if (kept && kept->kind == ST_PY_LIST && kept->n == 2 && kept->items[0]->kind == ST_PY_INT) {
    for (int64_t r = 0; r < rows; r++) pos[r] = kept->items[0]->i + r;
    if (kept->items[1]->kind == ST_PY_INT && kept->items[1]->i - kept->items[0]->i != rows)
      rc = st_fail(ST_EFORMAT, "%s: tensor %s has %lld rows, its meta positions_kept says %lld..%lld", f->path, f->name,
                   (long long)rows, (long long)kept->items[0]->i, (long long)kept->items[1]->i);
  } else if (flat) {
    if (al->has_positions && al->n_positions != rows)
      rc = st_fail(ST_EFORMAT, "%s: tensor %s has %lld token rows but the step's positions has %lld", f->path, f->name,
                   (long long)rows, (long long)al->n_positions);
    for (int64_t r = 0; r < rows; r++) pos[r] = al->has_positions ? al->positions[r] : r;
    r0 = ST_MIN(al->row0, rows);
    r1 = ST_MIN(al->row0 + al->rows, rows);
  } else {
    for (int64_t r = 0; r < rows; r++) pos[r] = al->has_positions && al->n_positions == rows ? al->positions[r] : r;
  }
  if (!rc) rc = emit_rows(im, tap, layer, pos, r0, r1, type, rank, shape, conv, row_bytes);
  free(pos);
  free(conv);
  return rc;
}

static st_status add_tokens(importer *im, const int64_t *ids, const step_align *al, int64_t n) {
  for (int64_t r = al->row0; r < al->row0 + al->rows && r < n; r++) {
    int64_t p = al->has_positions && al->n_positions == n ? al->positions[r] : r - al->row0;
    if (p < 0 || p > (1 << 24)) return st_fail(ST_EFORMAT, "token position %lld", (long long)p);
    if (p >= im->n_tokens_cap) {
      int64_t cap = im->n_tokens_cap ? im->n_tokens_cap : 1024;
      while (cap <= p) cap *= 2;
      int32_t *t = realloc(im->tokens, (size_t)cap * sizeof *t);
      if (!t) return st_fail(ST_ENOMEM, "tokens");
      for (int64_t k = im->n_tokens_cap; k < cap; k++) t[k] = -1;
      im->tokens = t;
      im->n_tokens_cap = cap;
    }
    if (ids[r] < INT32_MIN || ids[r] > INT32_MAX) return st_fail(ST_EFORMAT, "token id %lld", (long long)ids[r]);
    im->tokens[p] = (int32_t)ids[r];
    if (p + 1 > im->n_tokens) im->n_tokens = p + 1;
    if (al->rows > 1 && p + 1 > im->n_prompt) im->n_prompt = p + 1; /* a prefill (or chunk) */
  }
  return ST_OK;
}

/* The files [from, to) of one step (and rank 0). */
static st_status import_step(importer *im, int from, int to) {
  st_status rc = ST_OK;
  step_align al = {0};
  int64_t *seq = NULL, n_seq = 0, *ids = NULL, n_ids = 0;
  /* pass 1: the alignment inputs */
  for (int i = from; i < to && !rc; i++) {
    dump_file *f = &im->files[i];
    int layer = f->layer;
    const map_line *m = map_find(im, f->name, &layer);
    if (!m || m->tap >= 0 || m->tap == ALIGN_RIDS) continue;
    st_torchsave *ts = NULL;
    if ((rc = open_dump(im, f, &ts))) break;
    const st_py *meta;
    const st_torch_tensor *t = value_tensor(dump_root(ts, f), &meta);
    if (!t) rc = st_fail(ST_EFORMAT, "%s: %s is not a tensor", f->path, f->name);
    else if (m->tap == ALIGN_POSITIONS) { free(al.positions); rc = read_ints(ts, t, f->path, &al.positions, &al.n_positions); al.has_positions = !rc; }
    else if (m->tap == ALIGN_SEQ_LENS) { free(seq); rc = read_ints(ts, t, f->path, &seq, &n_seq); }
    else if (m->tap == ALIGN_TOKENS) { free(ids); rc = read_ints(ts, t, f->path, &ids, &n_ids); }
    close_dump(im, ts);
  }
  if (!rc) {
    int64_t total = ids ? n_ids : al.n_positions;
    al.row0 = 0;
    al.rows = total;
    if (seq && n_seq > 0) {
      if (im->opt->request >= n_seq)
        rc = st_fail(ST_EINVAL, "step %d holds %lld requests; --request %d is not one of them", im->files[from].step,
                     (long long)n_seq, im->opt->request);
      for (int r = 0; r < im->opt->request && !rc; r++) al.row0 += seq[r];
      if (!rc) al.rows = seq[im->opt->request];
      if (!rc && n_seq > 1)
        note(im, ST_TAP_INPUT, -1, "the dump held %lld requests per step; request %d imported", (long long)n_seq, im->opt->request);
      /* seq_lens counts a request's cached prefix too: the step's rows of it are its last ones */
      if (!rc && total && al.row0 + al.rows > total) rc = st_fail(ST_EFORMAT, "step %d: seq_lens sum past the %lld token rows", im->files[from].step, (long long)total);
    }
    if (!rc && ids) rc = add_tokens(im, ids, &al, n_ids);
  }
  /* pass 2: the taps */
  for (int i = from; i < to && !rc; i++) {
    dump_file *f = &im->files[i];
    int layer = f->layer;
    const map_line *m = map_find(im, f->name, &layer);
    if (!m) {
      im->res->n_unmapped++;
      if (json_array_size(im->unmapped) < 64) json_array_append_new(im->unmapped, json_string(f->name));
      continue;
    }
    if (m->tap < 0) continue;
    im->res->n_mapped++;
    st_torchsave *ts = NULL;
    if ((rc = open_dump(im, f, &ts))) break;
    const st_py *meta;
    const st_torch_tensor *t = value_tensor(dump_root(ts, f), &meta);
    if (meta && layer < 0) layer = (int)meta_int(meta, "layer_id", -1);
    if (m->csa_layer && layer >= 0) { /* compact CSA-layer id -> the model's layer */
      int k = -1, model_layer = -1;
      for (int l = 0; l < im->cfg.num_hidden_layers && model_layer < 0; l++)
        if (im->cfg.compress_ratio[l] == im->cfg.compress_rate_csa && ++k == layer) model_layer = l;
      if (model_layer < 0) {
        rc = st_fail(ST_EFORMAT, "%s: tensor %s: CSA layer %d, but the model has %d CSA layers", f->path, f->name,
                     layer, k + 1);
        close_dump(im, ts);
        break;
      }
      layer = model_layer;
    }
    if (!t) rc = st_fail(ST_EFORMAT, "%s: %s is not a tensor (nor {\"value\": tensor, ...})", f->path, f->name);
    else rc = import_tensor(im, f, m, layer, ts, t, meta, &al);
    close_dump(im, ts);
  }
  free(al.positions);
  free(seq);
  free(ids);
  return rc;
}

/* sglang-pass (--debug-tensor-dump-output-folder; sglang's debug_utils/tensor_dump_forward_hook.py):
** DIR/TP{t}_PP{p}_Rank{r}_pid{pid}/Pass{N:05d}.pt, one per forward pass, each a dict of every leaf
** module's output by module name, plus model.forward_batch_info.{input_ids,seq_lens,positions}.
** Each entry becomes a dump of step N (in_dict); tensor-parallel rank 0 of every pipeline stage
** is read, the other ranks noted. DIR may also be one rank's directory. */
static st_status add_pass_file(importer *im, const char *path, int pass, int *cap) {
  st_torchsave *ts = NULL;
  st_status rc = st_torchsave_open(path, &ts);
  if (rc) return rc;
  const st_py *root = st_torchsave_root(ts);
  if (root->kind != ST_PY_DICT) {
    st_torchsave_close(ts);
    return st_fail(ST_EFORMAT, "%s: a Pass file holds a dict of module outputs; this one holds no dict", path);
  }
  for (size_t k = 0; k + 1 < root->n && !rc; k += 2) {
    const st_py *key = root->items[k];
    if (key->kind != ST_PY_STR) continue;
    if (im->n_files == *cap) {
      *cap = *cap ? *cap * 2 : 256;
      dump_file *grown = realloc(im->files, (size_t)*cap * sizeof *grown);
      if (!grown) { rc = st_fail(ST_ENOMEM, "file list"); break; }
      im->files = grown;
    }
    dump_file f = {.path = strdup(path), .name = strdup(key->s), .step = pass, .rank = 0, .layer = -1,
                   .dump_index = (long)(k / 2), .in_dict = 1};
    if (!f.path || !f.name) { free(f.path); free(f.name); rc = st_fail(ST_ENOMEM, "file list"); break; }
    im->files[im->n_files++] = f;
  }
  st_torchsave_close(ts);
  return rc;
}

static st_status list_pass_files(importer *im, const char *dir) {
  int cap = 0, other_ranks = 0, n_pass = 0;
  st_status rc = ST_OK;
  char rank_dirs[16][4096];
  int n_dirs = 0;
  DIR *d = opendir(dir);
  if (!d) return st_fail(ST_EIO, "open directory %s", dir);
  struct dirent *e;
  int has_pass = 0;
  while ((e = readdir(d))) {
    int tp, pp, rank, pid, n;
    if (!strncmp(e->d_name, "Pass", 4)) has_pass = 1;
    else if (sscanf(e->d_name, "TP%d_PP%d_Rank%d_pid%d%n", &tp, &pp, &rank, &pid, &n) == 4 && !e->d_name[n]) {
      if (tp != 0) other_ranks++;
      else if (n_dirs < 16) snprintf(rank_dirs[n_dirs++], sizeof rank_dirs[0], "%s/%s", dir, e->d_name);
      else return closedir(d), st_fail(ST_ETOOBIG, "%s: more than 16 pipeline stages", dir);
    }
  }
  closedir(d);
  if (has_pass) snprintf(rank_dirs[n_dirs++], sizeof rank_dirs[0], "%s", dir);
  for (int r = 0; r < n_dirs && !rc; r++) {
    if (!(d = opendir(rank_dirs[r]))) return st_fail(ST_EIO, "open directory %s", rank_dirs[r]);
    while ((e = readdir(d)) && !rc) {
      int pass, n;
      if (sscanf(e->d_name, "Pass%d.pt%n", &pass, &n) != 1 || e->d_name[n] || pass < 0) continue;
      char path[8192];
      if (snprintf(path, sizeof path, "%s/%s", rank_dirs[r], e->d_name) >= (int)sizeof path) continue;
      rc = add_pass_file(im, path, pass, &cap);
      n_pass++;
    }
    closedir(d);
  }
  if (rc) return rc;
  if (!n_pass)
    return st_fail(ST_ENOTFOUND, "%s holds no Pass*.pt file (sglang --debug-tensor-dump-output-folder writes "
                   "TP0_PP0_Rank0_pid<pid>/Pass00000.pt, ...)", dir);
  if (other_ranks)
    note(im, ST_TAP_INPUT, -1, "%d tensor-parallel ranks other than 0 left out (shards are not concatenated)", other_ranks);
  qsort(im->files, (size_t)im->n_files, sizeof *im->files, file_cmp);
  return ST_OK;
}

/* ------------------------------------------------------------------ antirez/ds4's raw dumps */

/* ds4 (schemas/import/ds4.map) writes PREFIX_NAME-LAYER_posPOS.bin (float32) or .i32 (int32):
** raw little-endian, no header, POS the first position of the batch. Shapes come from the names
** and the model: the row width of a tap from config.json (tap_dims), the rows from the size;
** indexer_scores [n, n_comp] takes n from the other files of its batch. */
typedef struct ds4_file {
  char *path;
  dump_file df;           /* path and name for messages, the layer */
  const map_line *m;
  int64_t pos, bytes, rows;
  int is_i32;
} ds4_file;

typedef struct ds4_set {
  ds4_file *v;
  int n, cap;
} ds4_set;

static void ds4_set_free(ds4_set *s) {
  for (int i = 0; i < s->n; i++) { free(s->v[i].path); free(s->v[i].df.name); }
  free(s->v);
}

/* Splits a file name: PREFIX_NAME-LAYER_posPOS.EXT. prefix: the part before NAME ("run_"), or
** NULL when only the map's names can tell where NAME starts. Returns the map line or NULL. */
static const map_line *ds4_parse_name(importer *im, const char *base, const char *prefix, ds4_file *f,
                                      char *name, size_t name_size) {
  size_t n = strlen(base);
  if (n < 5 || (strcmp(base + n - 4, ".bin") && strcmp(base + n - 4, ".i32"))) return NULL;
  f->is_i32 = !strcmp(base + n - 4, ".i32");
  char stem[1024];
  if (n - 4 >= sizeof stem) return NULL;
  memcpy(stem, base, n - 4);
  stem[n - 4] = 0;
  char *pos = strstr(stem, "_pos"), *next;
  while (pos && (next = strstr(pos + 1, "_pos"))) pos = next;
  if (!pos || !pos[4]) return NULL;
  char *end;
  long long p = strtoll(pos + 4, &end, 10);
  if (*end || p < 0 || p > ((long long)1 << 40)) return NULL;
  *pos = 0;
  char *dash = strrchr(stem, '-');
  if (!dash || !dash[1]) return NULL;
  long layer = strtol(dash + 1, &end, 10);
  if (*end || layer < 0 || layer > 65535) return NULL;
  *dash = 0;
  f->pos = p;
  f->df.layer = (int)layer;
  const char *nm = NULL;
  if (prefix) {
    if (strncmp(stem, prefix, strlen(prefix))) return NULL;
    nm = stem + strlen(prefix);
  } else { /* the longest map name that ends the stem after a '_' (or is all of it) */
    size_t best = 0, ls = strlen(stem);
    for (int i = 0; i < im->n_map; i++) {
      size_t lm = strlen(im->map[i].name);
      if (lm > best && lm <= ls && !strcmp(stem + ls - lm, im->map[i].name) && (lm == ls || stem[ls - lm - 1] == '_')) {
        best = lm;
        nm = stem + ls - lm;
      }
    }
    if (!nm) nm = stem;
  }
  snprintf(name, name_size, "%s", nm);
  int l = -1;
  return map_find(im, nm, &l);
}

static int ds4_cmp(const void *a, const void *b) {
  const ds4_file *x = a, *y = b;
  if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
  if (x->df.layer != y->df.layer) return x->df.layer < y->df.layer ? -1 : 1;
  return strcmp(x->path, y->path);
}

/* The dump files of src: a directory (every .bin/.i32 in it) or a prefix (DIR/PREFIX: the files
** DIR/PREFIX_*), as DS4_METAL_GRAPH_DUMP_PREFIX was set. */
static st_status ds4_list(importer *im, const char *src, ds4_set *set) {
  char dir[4096], prefix[1024] = "";
  struct stat sb;
  int is_dir = stat(src, &sb) == 0 && S_ISDIR(sb.st_mode);
  if (is_dir) {
    snprintf(dir, sizeof dir, "%s", src);
  } else {
    const char *slash = strrchr(src, '/');
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - src), src);
    else snprintf(dir, sizeof dir, ".");
    if (!dir[0]) snprintf(dir, sizeof dir, "/");
    snprintf(prefix, sizeof prefix, "%s_", slash ? slash + 1 : src);
  }
  DIR *d = opendir(dir);
  if (!d) return st_fail(ST_EIO, "open directory %s (ds4: a dump directory or the DS4_METAL_GRAPH_DUMP_PREFIX path)", dir);
  struct dirent *e;
  st_status rc = ST_OK;
  while ((e = readdir(d)) && !rc) {
    if (e->d_name[0] == '.') continue;
    if (!is_dir && strncmp(e->d_name, prefix, strlen(prefix))) continue;
    size_t len = strlen(e->d_name);
    if (len < 5 || (strcmp(e->d_name + len - 4, ".bin") && strcmp(e->d_name + len - 4, ".i32"))) continue;
    ds4_file f = {0};
    char name[256] = "";
    const map_line *m = ds4_parse_name(im, e->d_name, is_dir ? NULL : prefix, &f, name, sizeof name);
    if (!m || m->tap < 0) { /* another tensor, or a name not of the PREFIX_NAME-LAYER_posPOS form */
      im->res->n_unmapped++;
      if (json_array_size(im->unmapped) < 64) json_array_append_new(im->unmapped, json_string(name[0] ? name : e->d_name));
      continue;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    if (stat(path, &sb)) { rc = st_fail(ST_EIO, "stat %s", path); break; }
    f.bytes = (int64_t)sb.st_size;
    f.m = m;
    f.rows = -1;
    f.path = strdup(path);
    f.df.name = strdup(name);
    if (!f.path || !f.df.name) { free(f.path); free(f.df.name); rc = st_fail(ST_ENOMEM, "file list"); break; }
    f.df.path = f.path;
    if (set->n == set->cap) {
      int cap = set->cap ? set->cap * 2 : 64;
      ds4_file *grown = realloc(set->v, (size_t)cap * sizeof *grown);
      if (!grown) { free(f.path); free(f.df.name); rc = st_fail(ST_ENOMEM, "file list"); break; }
      set->v = grown;
      set->cap = cap;
    }
    set->v[set->n++] = f;
  }
  closedir(d);
  if (rc) return rc;
  if (!set->n)
    return st_fail(ST_ENOTFOUND, "%s holds no ds4 dump of a mapped tensor (%sNAME-LAYER_posPOS.bin or .i32)",
                   is_dir ? dir : src, is_dir ? "PREFIX_" : "");
  qsort(set->v, (size_t)set->n, sizeof *set->v, ds4_cmp);
  im->res->n_files = set->n + im->res->n_unmapped;
  return ST_OK;
}

/* Elements of one row of tap, from the model (0: a width the file must tell, indexer.scores). */
static int64_t ds4_row_elements(const importer *im, st_tap_id tap) {
  int64_t d[MAX_AXES], e = 1;
  int n = tap_dims(&im->cfg, tap, d);
  for (int a = 0; a < n; a++) {
    if (d[a] < 0) return tap == ST_TAP_INDEXER_TOPK ? im->cfg.index_topk : 0;
    e *= d[a];
  }
  return e;
}

/* Rows of every file: from its size for taps of a known width (every file of one batch must
** agree), then indexer.scores from its batch; sizes that fit no whole row are errors. */
static st_status ds4_rows(importer *im, ds4_set *set) {
  for (int i = 0; i < set->n; i++) {
    ds4_file *f = &set->v[i];
    st_tap_id tap = (st_tap_id)f->m->tap;
    int64_t row = ds4_row_elements(im, tap);
    if (f->bytes == 0 || f->bytes % 4)
      return st_fail(ST_EFORMAT, "%s: %lld bytes, not a whole number of 4-byte %s values (truncated?)", f->path,
                     (long long)f->bytes, f->is_i32 ? "int32" : "float32");
    if (!row) continue;
    if ((f->bytes / 4) % row)
      return st_fail(ST_EFORMAT, "%s: %lld values, not a whole number of rows of %lld (tap %s of the model in %s: "
                     "a truncated file or another model)", f->path, (long long)(f->bytes / 4), (long long)row,
                     st_tap_catalogue[tap].suffix, im->opt->model_dir);
    f->rows = f->bytes / 4 / row;
    for (int j = 0; j < i; j++)
      if (set->v[j].pos == f->pos && set->v[j].rows >= 0 && set->v[j].rows != f->rows)
        return st_fail(ST_EFORMAT, "%s holds %lld rows, %s of the same batch (position %lld) %lld: the files "
                       "disagree (truncated?)", f->path, (long long)f->rows, set->v[j].path, (long long)f->pos,
                       (long long)set->v[j].rows);
  }
  for (int i = 0; i < set->n; i++) {
    ds4_file *f = &set->v[i];
    if (f->rows >= 0) continue;
    int64_t values = f->bytes / 4;
    int64_t m = f->df.layer < im->cfg.num_hidden_layers ? im->cfg.compress_ratio[f->df.layer] : 0;
    for (int j = 0; j < set->n && f->rows < 0; j++)
      if (set->v[j].pos == f->pos && set->v[j].rows > 0) f->rows = set->v[j].rows;
    if (f->rows < 0 && m > 0) /* alone in its batch: n * n_comp with n_comp = (pos + n) / m rows */
      for (int64_t n = 1; n <= values && f->rows < 0; n++)
        if (n * ((f->pos + n) / m) == values) f->rows = n;
    if (f->rows <= 0 || values % f->rows)
      return st_fail(ST_EFORMAT, "%s: %lld values do not make %s rows of compressed-row scores for its batch at "
                     "position %lld (truncated, or the batch's other files are missing)", f->path, (long long)values,
                     f->rows > 0 ? "whole" : "any number of", (long long)f->pos);
  }
  return ST_OK;
}

/* Every file -> its tap, in position order. Scores of rows not yet visible at a position become
** -inf and top-k entries naming them are dropped, as the reference writes them (noted). */
static st_status ds4_import(importer *im, ds4_set *set) {
  st_status rc = ds4_rows(im, set);
  for (int i = 0; i < set->n && !rc; i++) {
    ds4_file *f = &set->v[i];
    st_tap_id tap = (st_tap_id)f->m->tap;
    int layer = f->df.layer;
    if (layer >= im->cfg.num_hidden_layers)
      return st_fail(ST_EFORMAT, "%s: layer %d, but the model in %s has layers 0..%d", f->path, layer,
                     im->opt->model_dir, im->cfg.num_hidden_layers - 1);
    if (f->pos + f->rows > im->n_tokens)
      return st_fail(ST_EFORMAT, "%s: positions %lld..%lld, past the %lld tokens of --prompt-tokens", f->path,
                     (long long)f->pos, (long long)(f->pos + f->rows - 1), (long long)im->n_tokens);
    int64_t width = f->bytes / 4 / f->rows;
    uint8_t *data = malloc((size_t)f->bytes + 1);
    if (!data) return st_fail(ST_ENOMEM, "%s", f->path);
    FILE *fp = fopen(f->path, "rb");
    size_t got = fp ? fread(data, 1, (size_t)f->bytes, fp) : 0;
    if (fp) fclose(fp);
    if (got != (size_t)f->bytes) {
      free(data);
      return st_fail(ST_EIO, "read %s (%zu of %lld bytes)", f->path, got, (long long)f->bytes);
    }
    int m = im->cfg.compress_ratio[layer];
    int64_t hidden = 0, dropped = 0;
    for (int64_t r = 0; r < f->rows && m > 0 && (tap == ST_TAP_INDEXER_SCORES || tap == ST_TAP_INDEXER_TOPK); r++) {
      int visible = st_visible_rows(f->pos + r, m, width);
      if (tap == ST_TAP_INDEXER_SCORES && !f->is_i32) {
        float *row = (float *)data + r * width;
        for (int64_t j = visible; j < width; j++) {
          hidden += isfinite(row[j]) != 0;
          row[j] = -INFINITY;
        }
      } else if (f->is_i32) {
        int32_t *row = (int32_t *)data + r * width;
        int v = st_visible_rows(f->pos + r, m, INT32_MAX);
        for (int64_t j = 0; j < width; j++)
          if (row[j] >= v) row[j] = -1, dropped++;
      }
    }
    if (hidden) note(im, tap, layer, "finite scores of rows not yet visible at their position set to -inf (%lld in %s)",
                     (long long)hidden, f->df.name);
    if (dropped) note(im, tap, layer, "selected rows not yet visible at their position dropped (%lld)", (long long)dropped);
    raw_tensor t = {.dtype = f->is_i32 ? "int32" : "float32", .elem_size = 4, .ndim = 2,
                    .shape = {f->rows, width}, .numel = f->bytes / 4, .data = data};
    if (f->m->n_axes != 2) rc = st_fail(ST_EFORMAT, "%s line %d: ds4 dumps are 2-D ([rows, width]); the layout names %d axes",
                                        im->opt->map_path ? im->opt->map_path : "ds4.map", f->m->line, f->m->n_axes);
    int64_t *positions = malloc(sizeof(int64_t) * (size_t)f->rows);
    if (!rc && !positions) rc = st_fail(ST_ENOMEM, "positions");
    for (int64_t r = 0; !rc && r < f->rows; r++) positions[r] = f->pos + r;
    step_align al = {.positions = positions, .n_positions = f->rows, .row0 = 0, .rows = f->rows, .has_positions = 1};
    if (!rc) {
      im->res->n_mapped++;
      rc = import_values(im, &f->df, f->m, layer, &t, NULL, &al);
    }
    if (f->rows > 1 && f->pos + f->rows > im->n_prompt) im->n_prompt = f->pos + f->rows; /* a prefill batch */
    free(positions);
    free(data);
  }
  return rc;
}

/* Source provenance from the first file's meta (exporter fields, sglang's static meta). */
static json_t *source_info(importer *im) {
  json_t *src = json_object();
  st_torchsave *ts = NULL;
  for (int i = 0; i < im->n_files && !ts; i++)
    if (st_torchsave_open(im->files[i].path, &ts)) { st_clear_error(); ts = NULL; }
  if (!ts) return src;
  const st_py *meta = st_py_dict_get(st_torchsave_root(ts), "meta");
  static const char *keys[] = {"source_engine", "transformers_version", "torch_version", "sglang_version", "model",
                               "model_class", "dtype", "device", "patch", "world_size", "tp_size", "tokenizer_path"};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
    const st_py *v = st_py_dict_get(meta, keys[k]);
    if (v && v->kind == ST_PY_STR) json_object_set_new(src, keys[k], json_string(v->s));
    else if (v && v->kind == ST_PY_INT) json_object_set_new(src, keys[k], json_integer(v->i));
  }
  st_torchsave_close(ts);
  return src;
}

st_status st_import_run(const st_import_options *opt, st_import_result *res) {
  memset(res, 0, sizeof *res);
  importer *im = calloc(1, sizeof *im);
  if (!im) return st_fail(ST_ENOMEM, "importer");
  im->opt = opt;
  im->res = res;
  im->notes = json_object();
  im->unmapped = json_array();
  st_status rc = ST_OK;
  char *map_text = NULL, *config_text = NULL, *import_json = NULL, *model_copy = NULL;
  int ds4 = !strcmp(opt->format, "ds4");
  ds4_set ds4_files = {0};
  char config_path[4096], settings_json[2048];
  const char *builtin = st_import_builtin_map(opt->format);
  if (!builtin) { rc = st_fail(ST_EINVAL, "unknown import format '%s' (sglang-dumper, sglang-pass, hf, ds4)", opt->format); goto out; }
  if (opt->map_path && !(map_text = st_read_text_file(opt->map_path))) { rc = st_fail(ST_EIO, "read %s", opt->map_path); goto out; }
  if ((rc = parse_map(im, map_text ? map_text : builtin, opt->map_path ? opt->map_path : "the built-in map"))) goto out;
  snprintf(config_path, sizeof config_path, "%s/config.json", opt->model_dir);
  if ((rc = st_config_load(config_path, &im->cfg))) goto out;
  config_text = st_read_text_file(config_path);
  if (ds4) {
    if (!opt->tokens || opt->n_tokens <= 0) { rc = st_fail(ST_EINVAL, "ds4 dumps hold no token ids: --prompt-tokens FILE gives them"); goto out; }
    if ((rc = ds4_list(im, opt->source_dir, &ds4_files))) goto out;
    im->tokens = malloc(sizeof(int32_t) * (size_t)opt->n_tokens);
    if (!im->tokens) { rc = st_fail(ST_ENOMEM, "tokens"); goto out; }
    memcpy(im->tokens, opt->tokens, sizeof(int32_t) * (size_t)opt->n_tokens);
    im->n_tokens = im->n_tokens_cap = opt->n_tokens;
  } else if (!strcmp(opt->format, "sglang-pass")) {
    if ((rc = list_pass_files(im, opt->source_dir))) goto out;
    res->n_files = im->n_files;
  } else {
    if ((rc = list_files(im, opt->source_dir, 0))) goto out;
    res->n_files = im->n_files;
  }

  st_settings settings;
  st_settings_default(&settings);
  st_settings_resolve(&settings, &im->cfg);
  st_settings_json(&settings, settings_json, sizeof settings_json);
  model_copy = strdup(opt->model_dir);
  if (!model_copy) { rc = st_fail(ST_ENOMEM, "model name"); goto out; }
  char backend[64];
  snprintf(backend, sizeof backend, "import:%s", opt->format);
  st_run_meta meta = {.model_dir = opt->model_dir, .model_name = basename(model_copy), .settings_json = settings_json,
                      .config_json = config_text ? config_text : "{}", .backend = backend,
                      .kernel_mode = "imported", .threads = 0, .command_line = opt->command_line, .positions = "all",
                      .n_layers = im->cfg.num_hidden_layers, .force = opt->force};
  st_run_id_new(&meta);
  snprintf(res->run_id, sizeof res->run_id, "%s", meta.run_id);
  /* `import` (the source, written when the file is created); `import_notes` (per tap, known
  ** only at the end, written at finish) */
  json_t *imp = json_object();
  json_object_set_new(imp, "format", json_string(opt->format));
  json_object_set_new(imp, "source_dir", json_string(opt->source_dir));
  json_object_set_new(imp, "map", json_string(opt->map_path ? opt->map_path : "built-in"));
  json_object_set_new(imp, "source", ds4 ? json_pack("{s:s}", "source_engine", "antirez/ds4")
                                    : !strcmp(opt->format, "sglang-pass") ? json_pack("{s:s}", "source_engine", "sglang")
                                    : source_info(im));
  import_json = json_dumps(imp, JSON_COMPACT);
  json_decref(imp);
  meta.import_json = import_json;
  if ((rc = st_recorder_open(opt->out_path, opt->store_dir, &meta, 0, &im->rec))) goto out;
  im->sink = st_recorder_sink(im->rec);

  if (ds4) rc = ds4_import(im, &ds4_files);
  for (int i = 0; i < im->n_files && !rc;) {
    int j = i;
    while (j < im->n_files && im->files[j].step == im->files[i].step) j++;
    int any_rank0 = 0;
    for (int k = i; k < j; k++) any_rank0 |= im->files[k].rank == 0;
    if (any_rank0) {
      /* rank 0 only: tensor-parallel shards are not concatenated yet */
      int w = i;
      for (int k = i; k < j; k++) {
        if (im->files[k].rank == 0) { dump_file tmp = im->files[w]; im->files[w++] = im->files[k]; im->files[k] = tmp; }
      }
      if (w < j) note(im, ST_TAP_INPUT, -1, "dumps of ranks other than 0 left out (tensor-parallel shards are not concatenated)");
      rc = import_step(im, i, w);
    }
    i = j;
  }
  if (!rc && ds4 && !im->res->n_mapped) rc = st_fail(ST_EFORMAT, "%s: no ds4 dump of a mapped tensor", opt->source_dir);
  if (!rc && !im->n_tokens) rc = st_fail(ST_EFORMAT, "%s: no input_ids dump (@tokens in the map): the trace needs its tokens", opt->source_dir);
  for (int64_t p = 0; !rc && p < im->n_tokens; p++)
    if (im->tokens[p] < 0) rc = st_fail(ST_EFORMAT, "%s: no token id for position %lld (a step is missing)", opt->source_dir, (long long)p);
  if (!im->n_prompt) im->n_prompt = im->n_tokens;
  if (rc) { st_recorder_abort(im->rec); im->rec = NULL; goto out; }
  for (int tp = 0; tp < ST_TAP_COUNT; tp++)
    for (int l = 0; l <= ST_MAX_LAYERS; l++) res->n_taps += im->seen[tp][l].emitted;
  {
    st_recorder *r = im->rec;
    im->rec = NULL;
    json_t *all = json_pack("{s:O,s:O}", "taps", im->notes, "unmapped", im->unmapped);
    char *notes = all ? json_dumps(all, JSON_COMPACT) : NULL;
    json_decref(all);
    rc = notes ? st_recorder_set_import_notes(r, notes) : st_fail(ST_ENOMEM, "import notes");
    free(notes);
    if (rc) st_recorder_abort(r);
    else rc = st_recorder_finish(r, im->tokens, im->n_tokens, im->n_prompt);
  }
  res->n_tokens = im->n_tokens;
out:
  ds4_set_free(&ds4_files);
  st_torchsave_close(im->cached);
  free(im->cached_path);
  if (im->rec) st_recorder_abort(im->rec);
  for (int i = 0; i < im->n_files; i++) { free(im->files[i].path); free(im->files[i].name); }
  free(im->files);
  free(im->map);
  free(im->tokens);
  json_decref(im->notes);
  json_decref(im->unmapped);
  free(im);
  free(map_text);
  free(config_text);
  free(import_json);
  free(model_copy);
  return rc;
}
