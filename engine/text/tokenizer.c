/*
** tokenizer.c — loading tokenizer.json / tokenizer_config.json, id ↔ token lookups, decoding.
**
** The vocabulary is kept twice: by spelling (the tokenizer.json key, e.g. "Ġthe"), which is how
** merges and st_tokenizer_token_id name tokens, and by id with the decoded bytes, which is what
** decoding and the byte-level BPE in tokenizer_bpe.c work with. The BPE never sees the
** byte→unicode spelling: a word's symbols start as single bytes and merge by (left id, right id)
** pairs, which is the same computation HF does on the mapped characters, without the mapping.
**
** Loading refuses what it does not implement (see tokenizer.h). Every message names the file and
** the JSON field at fault, e.g. "tokenizer.json: model.merges[17]: token \"Ġx\" not in vocab".
*/
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/text/tokenizer_internal.h"

/* ---------------------------------------------------------------- hashing and the string map */

uint64_t tok_hash_bytes(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= s[i];
    h *= 1099511628211ull;
  }
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h;
}

static size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c <<= 1;
  return c;
}

st_status tok_strmap_init(tok_strmap *m, size_t expected) {
  size_t cap = pow2_at_least(expected * 2 + 1);
  m->keys = calloc(cap, sizeof *m->keys);
  m->lens = calloc(cap, sizeof *m->lens);
  m->vals = calloc(cap, sizeof *m->vals);
  m->mask = cap - 1;
  m->count = 0;
  if (!m->keys || !m->lens || !m->vals) {
    tok_strmap_free(m);
    return st_fail(ST_ENOMEM, "tokenizer: out of memory for a %zu-slot table", cap);
  }
  return ST_OK;
}

void tok_strmap_free(tok_strmap *m) {
  free(m->keys);
  free(m->lens);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

static st_status strmap_grow(tok_strmap *m) {
  tok_strmap bigger;
  st_status st = tok_strmap_init(&bigger, (m->mask + 1));
  if (st) return st;
  for (size_t i = 0; i <= m->mask; i++)
    if (m->keys[i]) tok_strmap_put(&bigger, m->keys[i], m->lens[i], m->vals[i]);
  tok_strmap_free(m);
  *m = bigger;
  return ST_OK;
}

st_status tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val) {
  if ((m->count + 1) * 2 > m->mask + 1) {
    st_status st = strmap_grow(m);
    if (st) return st;
  }
  size_t i = tok_hash_bytes(key, len) & m->mask;
  while (m->keys[i]) {
    if (m->lens[i] == len && !memcmp(m->keys[i], key, len)) {
      m->vals[i] = val;
      return ST_OK;
    }
    i = (i + 1) & m->mask;
  }
  m->keys[i] = key;
  m->lens[i] = (uint32_t)len;
  m->vals[i] = val;
  m->count++;
  return ST_OK;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
  if (!m->keys) return -1;
  size_t i = tok_hash_bytes(key, len) & m->mask;
  while (m->keys[i]) {
    if (m->lens[i] == len && !memcmp(m->keys[i], key, len)) return m->vals[i];
    i = (i + 1) & m->mask;
  }
  return -1;
}

/* ---------------------------------------------------------------- UTF-8 */

size_t tok_utf8_valid_prefix(const char *text, size_t n) {
  const unsigned char *p = (const unsigned char *)text;
  size_t i = 0;
  while (i < n) {
    unsigned c = p[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t need;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) need = 1, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) need = 2, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) need = 3, cp = c & 0x07, min = 0x10000;
    else return i;
    if (n - i <= need) return i; /* truncated */
    for (size_t k = 1; k <= need; k++) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += need + 1;
  }
  return n;
}

uint32_t tok_utf8_decode(const unsigned char *p, size_t *adv) {
  unsigned c = p[0];
  if (c < 0x80) return *adv = 1, c;
  if (c < 0xE0) return *adv = 2, ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  if (c < 0xF0) return *adv = 3, ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  *adv = 4;
  return ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

/* ---------------------------------------------------------------- arena */

#define ARENA_CHUNK (1u << 20)

/* Copies n bytes (plus a NUL) into the tokenizer's arena; NULL on allocation failure. */
static char *arena_copy(st_tokenizer *tok, const char *s, size_t n) {
  if (!tok->n_arena_chunks || tok->arena_used + n + 1 > tok->arena_cap) {
    size_t cap = n + 1 > ARENA_CHUNK ? n + 1 : ARENA_CHUNK;
    char **chunks = realloc(tok->arena_chunks, (tok->n_arena_chunks + 1) * sizeof *chunks);
    if (!chunks) return NULL;
    tok->arena_chunks = chunks;
    char *c = malloc(cap);
    if (!c) return NULL;
    chunks[tok->n_arena_chunks++] = c;
    tok->arena_used = 0;
    tok->arena_cap = cap;
  }
  char *dst = tok->arena_chunks[tok->n_arena_chunks - 1] + tok->arena_used;
  memcpy(dst, s, n);
  dst[n] = 0;
  tok->arena_used += n + 1;
  return dst;
}

/* ---------------------------------------------------------------- per-id tables */

/* Ids index the per-id tables, so a file may leave holes but not name ids far beyond its entries
** (a 5 KB tokenizer.json naming id 800000000 would have them take 6 GB): the largest id accepted
** for `entries` entries on top of the `have` ids already held. */
static int64_t id_limit(size_t entries, int32_t have) {
  int64_t limit = (int64_t)have + 2 * (int64_t)entries + 65536;
  return limit < (1 << 30) ? limit : (1 << 30);
}

static st_status ensure_ids(st_tokenizer *tok, int32_t n) {
  if (n <= tok->n_ids) return ST_OK;
  size_t old = (size_t)tok->n_ids, want = (size_t)n;
  const char **text = realloc(tok->id_text, want * sizeof *text);
  if (text) tok->id_text = text;
  const char **bytes = realloc(tok->id_bytes, want * sizeof *bytes);
  if (bytes) tok->id_bytes = bytes;
  uint32_t *blen = realloc(tok->id_bytes_len, want * sizeof *blen);
  if (blen) tok->id_bytes_len = blen;
  uint8_t *flags = realloc(tok->id_flags, want);
  if (flags) tok->id_flags = flags;
  if (!text || !bytes || !blen || !flags) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
  for (size_t i = old; i < want; i++) {
    tok->id_text[i] = NULL;
    tok->id_bytes[i] = NULL;
    tok->id_bytes_len[i] = 0;
    tok->id_flags[i] = 0;
  }
  tok->n_ids = n;
  return ST_OK;
}

/* Records the spelling of an id and its decoded bytes. A spelling whose every character is in
** the byte-level table decodes to those bytes; any other spelling decodes to its own UTF-8 —
** HF's ByteLevel decoder does the same, token by token. */
static st_status set_id(st_tokenizer *tok, int32_t id, const char *spelling, size_t n) {
  st_status st = ensure_ids(tok, id + 1);
  if (st) return st;
  if (tok->id_text[id]) return ST_OK; /* first spelling wins; added tokens come first */
  char *text = arena_copy(tok, spelling, n);
  if (!text) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
  char tmp[1024];
  char *buf = n <= sizeof tmp ? tmp : malloc(n);
  if (!buf) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
  size_t m = 0, i = 0;
  int byte_level = n > 0 && tok_utf8_valid_prefix(spelling, n) == n;
  while (byte_level && i < n) {
    size_t adv;
    int b = tok_cp_to_byte(tok_utf8_decode((const unsigned char *)spelling + i, &adv));
    if (b < 0) byte_level = 0;
    else buf[m++] = (char)b;
    i += adv;
  }
  const char *bytes = text;
  uint32_t blen = (uint32_t)n;
  if (byte_level) {
    if (m == n && !memcmp(buf, spelling, n)) bytes = text;
    else if (!(bytes = arena_copy(tok, buf, m))) {
      if (buf != tmp) free(buf);
      return st_fail(ST_ENOMEM, "tokenizer: out of memory");
    }
    blen = (uint32_t)m;
    tok->id_flags[id] |= TOK_ID_BYTE_LEVEL;
  }
  if (buf != tmp) free(buf);
  tok->id_text[id] = text;
  tok->id_bytes[id] = bytes;
  tok->id_bytes_len[id] = blen;
  return ST_OK;
}

/* ---------------------------------------------------------------- merges table */

static st_status merges_init(st_tokenizer *tok, size_t expected) {
  size_t cap = pow2_at_least(expected * 2 + 1);
  tok->merges = malloc(cap * sizeof *tok->merges);
  if (!tok->merges) return st_fail(ST_ENOMEM, "tokenizer: out of memory for %zu merges", expected);
  for (size_t i = 0; i < cap; i++) tok->merges[i].key = UINT64_MAX;
  tok->merges_mask = cap - 1;
  return ST_OK;
}

static void merges_put(st_tokenizer *tok, int32_t a, int32_t b, int32_t rank, int32_t merged) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  size_t i = (size_t)(tok_hash_bytes(&key, sizeof key) & tok->merges_mask);
  while (tok->merges[i].key != UINT64_MAX && tok->merges[i].key != key)
    i = (i + 1) & tok->merges_mask;
  if (tok->merges[i].key == UINT64_MAX) tok->n_merges++;
  /* A repeated pair keeps the last rank, as HF's map built from the list does. */
  tok->merges[i].key = key;
  tok->merges[i].rank = rank;
  tok->merges[i].merged = merged;
}

/* ---------------------------------------------------------------- JSON helpers */

/* Short file name for messages: "tokenizer.json" rather than the whole path. */
static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static st_status load_json(const char *path, json_t **out) {
  struct stat sb;
  if (stat(path, &sb) != 0) return st_fail(ST_EIO, "%s: %s", path, strerror(errno));
  json_error_t err;
  json_t *root = json_load_file(path, JSON_ALLOW_NUL, &err);
  if (!root)
    return st_fail(ST_EFORMAT, "%s:%d:%d: not valid JSON: %s", path, err.line, err.column,
                   err.text);
  if (!json_is_object(root)) {
    json_decref(root);
    return st_fail(ST_EFORMAT, "%s: top level is not a JSON object", path);
  }
  *out = root;
  return ST_OK;
}

/* A JSON boolean field; absent or null gives dflt; anything else is a format error. */
static st_status get_bool(const json_t *obj, const char *key, int dflt, int *out, const char *file,
                          const char *where) {
  const json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return *out = dflt, ST_OK;
  if (!json_is_boolean(v))
    return st_fail(ST_EFORMAT, "%s: %s%s: expected true or false", file, where, key);
  *out = json_is_true(v);
  return ST_OK;
}

/* ---------------------------------------------------------------- the model */

static st_status load_model(st_tokenizer *tok, const json_t *model, const char *file) {
  if (!json_is_object(model)) return st_fail(ST_EFORMAT, "%s: model: missing or not an object", file);
  const json_t *type = json_object_get(model, "type");
  if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "BPE")))
    return st_fail(ST_EUNSUPPORTED, "%s: model.type: \"%s\" is not supported (only BPE)", file,
                   json_is_string(type) ? json_string_value(type) : "?");
  const json_t *dropout = json_object_get(model, "dropout");
  if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
    return st_fail(ST_EUNSUPPORTED, "%s: model.dropout: BPE dropout is random; only null or 0", file);
  static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (size_t i = 0; i < 2; i++) {
    const json_t *v = json_object_get(model, affixes[i]);
    if (v && !json_is_null(v) && !(json_is_string(v) && !json_string_length(v)))
      return st_fail(ST_EUNSUPPORTED, "%s: model.%s: not supported (byte-level BPE has none)",
                     file, affixes[i]);
  }
  st_status st;
  if ((st = get_bool(model, "ignore_merges", 0, &tok->ignore_merges, file, "model.")) ||
      (st = get_bool(model, "byte_fallback", 0, &tok->byte_fallback, file, "model.")) ||
      (st = get_bool(model, "fuse_unk", 0, &tok->fuse_unk, file, "model.")))
    return st;

  const json_t *vocab = json_object_get(model, "vocab");
  if (!json_is_object(vocab)) return st_fail(ST_EFORMAT, "%s: model.vocab: missing or not an object", file);
  if ((st = tok_strmap_init(&tok->vocab, json_object_size(vocab)))) return st;
  const char *key;
  const json_t *val;
  const int64_t limit = id_limit(json_object_size(vocab), tok->n_ids);
  json_object_foreach((json_t *)vocab, key, val) {
    if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= (1 << 30))
      return st_fail(ST_EFORMAT, "%s: model.vocab[\"%s\"]: id is not an integer in [0, 2^30)", file, key);
    if (json_integer_value(val) >= limit)
      return st_fail(ST_EFORMAT, "%s: model.vocab[\"%s\"]: id %lld is far beyond the vocabulary's %zu "
                     "entries (at most %lld)", file, key, (long long)json_integer_value(val),
                     json_object_size(vocab), (long long)limit - 1);
    int32_t id = (int32_t)json_integer_value(val);
    size_t klen = strlen(key);
    if ((st = set_id(tok, id, key, klen))) return st;
    /* The map's key must live as long as the tokenizer: use the arena copy when this id's
    ** spelling is this key, else make one. */
    const char *stored = tok->id_text[id];
    if (strcmp(stored, key) && !(stored = arena_copy(tok, key, klen)))
      return st_fail(ST_ENOMEM, "tokenizer: out of memory");
    if ((st = tok_strmap_put(&tok->vocab, stored, klen, id))) return st;
  }
  tok->n_model_vocab = json_object_size(vocab);

  for (int b = 0; b < 256; b++) {
    char sp[4];
    uint32_t cp = tok_byte_to_cp((uint8_t)b);
    size_t n = cp < 0x80 ? (sp[0] = (char)cp, 1) : (sp[0] = (char)(0xC0 | (cp >> 6)), sp[1] = (char)(0x80 | (cp & 0x3F)), 2);
    tok->byte_id[b] = tok_strmap_get(&tok->vocab, sp, n);
    if (tok->byte_id[b] < 0 && tok->byte_fallback) {
      char fb[8];
      snprintf(fb, sizeof fb, "<0x%02X>", b);
      tok->byte_id[b] = tok_strmap_get(&tok->vocab, fb, 6);
    }
  }

  tok->unk_id = -1;
  const json_t *unk = json_object_get(model, "unk_token");
  if (unk && !json_is_null(unk)) {
    if (!json_is_string(unk)) return st_fail(ST_EFORMAT, "%s: model.unk_token: not a string", file);
    tok->unk_id = tok_strmap_get(&tok->vocab, json_string_value(unk), json_string_length(unk));
    if (tok->unk_id < 0)
      return st_fail(ST_EFORMAT, "%s: model.unk_token: \"%s\" is not in model.vocab", file,
                     json_string_value(unk));
  }

  if (tok->ignore_merges) {
    if ((st = tok_strmap_init(&tok->raw_vocab, json_object_size(vocab)))) return st;
    for (int32_t id = 0; id < tok->n_ids; id++)
      if (tok->id_text[id] && (tok->id_flags[id] & TOK_ID_BYTE_LEVEL))
        if ((st = tok_strmap_put(&tok->raw_vocab, tok->id_bytes[id], tok->id_bytes_len[id], id)))
          return st;
  }

  const json_t *merges = json_object_get(model, "merges");
  if (!json_is_array(merges)) return st_fail(ST_EFORMAT, "%s: model.merges: missing or not an array", file);
  if ((st = merges_init(tok, json_array_size(merges)))) return st;
  size_t i;
  json_array_foreach(merges, i, val) {
    const char *a, *b;
    size_t alen, blen;
    if (json_is_string(val)) {
      a = json_string_value(val);
      const char *sp = memchr(a, ' ', json_string_length(val));
      if (!sp) return st_fail(ST_EFORMAT, "%s: model.merges[%zu]: \"%s\" is not \"left right\"", file, i, a);
      alen = (size_t)(sp - a);
      b = sp + 1;
      blen = json_string_length(val) - alen - 1;
    } else if (json_is_array(val) && json_array_size(val) == 2 &&
               json_is_string(json_array_get(val, 0)) && json_is_string(json_array_get(val, 1))) {
      a = json_string_value(json_array_get(val, 0));
      alen = json_string_length(json_array_get(val, 0));
      b = json_string_value(json_array_get(val, 1));
      blen = json_string_length(json_array_get(val, 1));
    } else {
      return st_fail(ST_EFORMAT, "%s: model.merges[%zu]: expected \"left right\" or [left, right]", file, i);
    }
    int32_t ia = tok_strmap_get(&tok->vocab, a, alen), ib = tok_strmap_get(&tok->vocab, b, blen);
    char stackbuf[512];
    char *cat = alen + blen <= sizeof stackbuf ? stackbuf : malloc(alen + blen);
    if (!cat) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
    memcpy(cat, a, alen);
    memcpy(cat + alen, b, blen);
    int32_t im = tok_strmap_get(&tok->vocab, cat, alen + blen);
    if (ia < 0 || ib < 0 || im < 0) {
      st = st_fail(ST_EFORMAT, "%s: model.merges[%zu]: token \"%.*s\" is not in model.vocab", file, i,
                   ia < 0 ? (int)alen : ib < 0 ? (int)blen : (int)(alen + blen),
                   ia < 0 ? a : ib < 0 ? b : cat);
      if (cat != stackbuf) free(cat);
      return st;
    }
    if (cat != stackbuf) free(cat);
    merges_put(tok, ia, ib, (int32_t)i, im);
  }
  return ST_OK;
}

/* ---------------------------------------------------------------- added tokens */

/* Adds one added token (from tokenizer.json added_tokens or tokenizer_config.json
** added_tokens_decoder). A content already added keeps its first entry. */
static st_status add_token(st_tokenizer *tok, const json_t *t, int32_t id, const char *file,
                           const char *where) {
  const json_t *content = json_object_get(t, "content");
  if (!json_is_string(content) || !json_string_length(content))
    return st_fail(ST_EFORMAT, "%s: %s.content: missing or empty", file, where);
  const char *s = json_string_value(content);
  size_t n = json_string_length(content);
  if (tok_utf8_valid_prefix(s, n) != n)
    return st_fail(ST_EFORMAT, "%s: %s.content: not valid UTF-8", file, where);
  if (tok_strmap_get(&tok->added_map, s, n) >= 0) return ST_OK;
  tok_added a = {0};
  int special = 0, normalized = 0, lstrip = 0, rstrip = 0, single_word = 0;
  st_status st;
  char w[160];
  snprintf(w, sizeof w, "%s.", where);
  if ((st = get_bool(t, "special", 0, &special, file, w)) ||
      (st = get_bool(t, "normalized", !special, &normalized, file, w)) ||
      (st = get_bool(t, "lstrip", 0, &lstrip, file, w)) ||
      (st = get_bool(t, "rstrip", 0, &rstrip, file, w)) ||
      (st = get_bool(t, "single_word", 0, &single_word, file, w)))
    return st;
  a.special = (uint8_t)special, a.normalized = (uint8_t)normalized, a.lstrip = (uint8_t)lstrip;
  a.rstrip = (uint8_t)rstrip, a.single_word = (uint8_t)single_word;
  a.id = id;
  a.len = (uint32_t)n;
  if (!(a.content = arena_copy(tok, s, n))) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
  tok_added *grown = realloc(tok->added, (tok->n_added + 1) * sizeof *grown);
  if (!grown) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
  tok->added = grown;
  tok->added[tok->n_added] = a;
  if ((st = tok_strmap_put(&tok->added_map, a.content, n, (int32_t)tok->n_added))) return st;
  tok->n_added++;
  if ((st = set_id(tok, id, s, n))) return st;
  tok->id_flags[id] |= TOK_ID_ADDED | (special ? TOK_ID_SPECIAL : 0);
  return ST_OK;
}

static st_status load_added(st_tokenizer *tok, const json_t *root, const char *file) {
  const json_t *list = json_object_get(root, "added_tokens");
  if (!list || json_is_null(list)) return ST_OK;
  if (!json_is_array(list)) return st_fail(ST_EFORMAT, "%s: added_tokens: not an array", file);
  const json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
  size_t vocab_entries = json_is_object(vocab) ? json_object_size(vocab) : 0;
  size_t i;
  const json_t *t;
  json_array_foreach(list, i, t) {
    char where[64];
    snprintf(where, sizeof where, "added_tokens[%zu]", i);
    const json_t *id = json_object_get(t, "id");
    if (!json_is_object(t) || !json_is_integer(id) || json_integer_value(id) < 0 ||
        json_integer_value(id) >= (1 << 30))
      return st_fail(ST_EFORMAT, "%s: %s: expected an object with an integer id in [0, 2^30)", file, where);
    /* added tokens follow the vocabulary: bounded by both lists' entries */
    if (json_integer_value(id) >= id_limit(json_array_size(list) + vocab_entries, 0))
      return st_fail(ST_EFORMAT, "%s: %s: id %lld is far beyond anything the file defines", file, where,
                     (long long)json_integer_value(id));
    st_status st = add_token(tok, t, (int32_t)json_integer_value(id), file, where);
    if (st) return st;
  }
  return ST_OK;
}

/* ---------------------------------------------------------------- normalizer, pre-tokenizer */

/* Only "no normalisation" is implemented: null, or Sequence of (recursively) nothing. */
static st_status check_normalizer(const json_t *n, const char *file, const char *where) {
  if (!n || json_is_null(n)) return ST_OK;
  const json_t *type = json_object_get(n, "type");
  if (json_is_string(type) && !strcmp(json_string_value(type), "Sequence")) {
    const json_t *list = json_object_get(n, "normalizers");
    size_t i;
    const json_t *item;
    json_array_foreach(list, i, item) {
      char w[128];
      snprintf(w, sizeof w, "%s.normalizers[%zu]", where, i);
      st_status st = check_normalizer(item, file, w);
      if (st) return st;
    }
    return ST_OK;
  }
  return st_fail(ST_EUNSUPPORTED, "%s: %s: normalizer \"%s\" is not supported (only none)", file,
                 where, json_is_string(type) ? json_string_value(type) : "?");
}

static st_status add_split(st_tokenizer *tok, const char *pattern, size_t len, uint32_t options,
                           int behavior, int invert, const char *where) {
  tok_split *grown = realloc(tok->splits, (tok->n_splits + 1) * sizeof *grown);
  if (!grown) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
  tok->splits = grown;
  tok_split *s = &tok->splits[tok->n_splits];
  memset(s, 0, sizeof *s);
  st_status st = tok_compile(tok, pattern, len, options, &s->re, where);
  if (st) return st;
  s->md = pcre2_match_data_create_from_pattern(s->re, NULL);
  if (!s->md) {
    pcre2_code_free(s->re);
    return st_fail(ST_ENOMEM, "tokenizer: out of memory");
  }
  s->behavior = behavior;
  s->invert = invert;
  tok->n_splits++;
  return ST_OK;
}

/* GPT-2's split, used by ByteLevel when use_regex is true. */
static const char gpt2_pattern[] =
  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static st_status load_pretokenizer(st_tokenizer *tok, const json_t *p, const char *file,
                                   const char *where) {
  if (!p || json_is_null(p)) return ST_OK;
  const json_t *type = json_object_get(p, "type");
  const char *t = json_is_string(type) ? json_string_value(type) : "?";
  char w[160];
  if (!strcmp(t, "Sequence")) {
    const json_t *list = json_object_get(p, "pretokenizers");
    if (!json_is_array(list)) return st_fail(ST_EFORMAT, "%s: %s.pretokenizers: not an array", file, where);
    size_t i;
    const json_t *item;
    json_array_foreach(list, i, item) {
      snprintf(w, sizeof w, "%s.pretokenizers[%zu]", where, i);
      st_status st = load_pretokenizer(tok, item, file, w);
      if (st) return st;
    }
    return ST_OK;
  }
  if (!strcmp(t, "Split")) {
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    const json_t *beh = json_object_get(p, "behavior");
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    int behavior = -1;
    for (int k = 0; k < 5 && json_is_string(beh); k++)
      if (!strcmp(json_string_value(beh), names[k])) behavior = k;
    if (behavior < 0)
      return st_fail(ST_EFORMAT, "%s: %s.behavior: expected one of Removed, Isolated, "
                     "MergedWithPrevious, MergedWithNext, Contiguous", file, where);
    int invert = 0;
    st_status st = get_bool(p, "invert", 0, &invert, file, where);
    if (st) return st;
    snprintf(w, sizeof w, "%s: %s.pattern", file, where);
    if (json_is_string(re))
      return add_split(tok, json_string_value(re), json_string_length(re), 0, behavior, invert, w);
    if (json_is_string(lit))
      return add_split(tok, json_string_value(lit), json_string_length(lit), PCRE2_LITERAL,
                       behavior, invert, w);
    return st_fail(ST_EFORMAT, "%s: %s.pattern: expected {\"Regex\": ...} or {\"String\": ...}", file, where);
  }
  if (!strcmp(t, "ByteLevel")) {
    int add_prefix_space = 0, use_regex = 1;
    st_status st;
    if ((st = get_bool(p, "add_prefix_space", 0, &add_prefix_space, file, where)) ||
        (st = get_bool(p, "use_regex", 1, &use_regex, file, where)))
      return st;
    if (add_prefix_space)
      return st_fail(ST_EUNSUPPORTED, "%s: %s.add_prefix_space: true is not supported", file, where);
    tok->byte_level = 1;
    if (use_regex) {
      snprintf(w, sizeof w, "%s: %s (GPT-2 split)", file, where);
      return add_split(tok, gpt2_pattern, sizeof gpt2_pattern - 1, 0, TOK_SPLIT_ISOLATED, 0, w);
    }
    return ST_OK;
  }
  if (!strcmp(t, "Digits")) {
    int individual = 0;
    st_status st = get_bool(p, "individual_digits", 0, &individual, file, where);
    if (st) return st;
    snprintf(w, sizeof w, "%s: %s", file, where);
    /* HF splits on char::is_numeric (Unicode N*): alone, or runs kept together. */
    return add_split(tok, "\\p{N}", 5, 0, individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, 0, w);
  }
  return st_fail(ST_EUNSUPPORTED, "%s: %s: pre-tokenizer \"%s\" is not supported (Sequence, Split, "
                 "ByteLevel, Digits)", file, where, t);
}

static st_status check_decoder(st_tokenizer *tok, const json_t *d, const char *file,
                               const char *where) {
  if (!d || json_is_null(d)) return ST_OK;
  const json_t *type = json_object_get(d, "type");
  const char *t = json_is_string(type) ? json_string_value(type) : "?";
  if (!strcmp(t, "ByteLevel")) return tok->byte_level = 1, ST_OK;
  if (!strcmp(t, "Sequence")) {
    size_t i;
    const json_t *item;
    json_array_foreach(json_object_get(d, "decoders"), i, item) {
      char w[128];
      snprintf(w, sizeof w, "%s.decoders[%zu]", where, i);
      st_status st = check_decoder(tok, item, file, w);
      if (st) return st;
    }
    return ST_OK;
  }
  return st_fail(ST_EUNSUPPORTED, "%s: %s: decoder \"%s\" is not supported (only ByteLevel)", file, where, t);
}

static st_status check_post_processor(const json_t *p, const char *file, const char *where) {
  if (!p || json_is_null(p)) return ST_OK;
  const json_t *type = json_object_get(p, "type");
  const char *t = json_is_string(type) ? json_string_value(type) : "?";
  if (!strcmp(t, "ByteLevel")) return ST_OK; /* offsets only; adds no tokens */
  if (!strcmp(t, "Sequence")) {
    size_t i;
    const json_t *item;
    json_array_foreach(json_object_get(p, "processors"), i, item) {
      char w[128];
      snprintf(w, sizeof w, "%s.processors[%zu]", where, i);
      st_status st = check_post_processor(item, file, w);
      if (st) return st;
    }
    return ST_OK;
  }
  /* TemplateProcessing and the BERT/RoBERTa processors add tokens by their own rules; BOS/EOS
  ** here come from tokenizer_config.json only, so refuse rather than disagree. */
  return st_fail(ST_EUNSUPPORTED, "%s: %s: post-processor \"%s\" is not supported (only ByteLevel)",
                 file, where, t);
}

/* ---------------------------------------------------------------- tokenizer_config.json */

/* bos_token / eos_token: a string, an AddedToken object with "content", or null. */
static st_status config_token(st_tokenizer *tok, const json_t *cfg, const char *key, int32_t *id,
                              const char *file) {
  const json_t *v = json_object_get(cfg, key);
  *id = -1;
  if (!v || json_is_null(v)) return ST_OK;
  if (json_is_object(v)) v = json_object_get(v, "content");
  if (!json_is_string(v)) return st_fail(ST_EFORMAT, "%s: %s: expected a string or {\"content\": ...}", file, key);
  *id = st_tokenizer_token_id(tok, json_string_value(v));
  if (*id < 0)
    return st_fail(ST_EFORMAT, "%s: %s: \"%s\" is not a token of tokenizer.json", file, key,
                   json_string_value(v));
  return ST_OK;
}

static st_status load_config(st_tokenizer *tok, const char *path) {
  json_t *cfg = NULL;
  st_status st = load_json(path, &cfg);
  if (st) return st;
  const char *file = base_name(path);
  /* Tokens the config declares that tokenizer.json lacks are added, as transformers does. */
  const json_t *dec = json_object_get(cfg, "added_tokens_decoder");
  if (dec && !json_is_null(dec)) {
    if (!json_is_object(dec)) {
      st = st_fail(ST_EFORMAT, "%s: added_tokens_decoder: not an object", file);
      goto out;
    }
    const char *key;
    const json_t *t;
    json_object_foreach((json_t *)dec, key, t) {
      char *end;
      long id = strtol(key, &end, 10);
      char where[96];
      snprintf(where, sizeof where, "added_tokens_decoder[\"%.40s\"]", key);
      if (*end || end == key || id < 0 || id >= (1L << 30) || !json_is_object(t)) {
        st = st_fail(ST_EFORMAT, "%s: %s: expected an integer id key and an object", file, where);
        goto out;
      }
      if (id < tok->n_ids && (tok->id_flags[id] & TOK_ID_ADDED)) continue;
      if ((st = add_token(tok, t, (int32_t)id, file, where))) goto out;
    }
  }
  if ((st = get_bool(cfg, "add_bos_token", 0, &tok->add_bos, file, "")) ||
      (st = get_bool(cfg, "add_eos_token", 0, &tok->add_eos, file, "")) ||
      (st = config_token(tok, cfg, "bos_token", &tok->bos_id, file)) ||
      (st = config_token(tok, cfg, "eos_token", &tok->eos_id, file)))
    goto out;
  if (tok->add_bos && tok->bos_id < 0) {
    st = st_fail(ST_EFORMAT, "%s: add_bos_token is true but bos_token is not set", file);
    goto out;
  }
  if (tok->add_eos && tok->eos_id < 0) {
    st = st_fail(ST_EFORMAT, "%s: add_eos_token is true but eos_token is not set", file);
    goto out;
  }
  const json_t *tmpl = json_object_get(cfg, "chat_template");
  tok->has_chat_template = tmpl && !json_is_null(tmpl);
out:
  json_decref(cfg);
  return st;
}

/* ---------------------------------------------------------------- open / close */

static st_status build_tries(st_tokenizer *tok) {
  for (size_t i = 0; i < tok->n_added; i++) {
    tok_trie *t = tok->added[i].normalized ? &tok->trie_norm : &tok->trie_raw;
    st_status st = tok_trie_add(t, tok->added[i].content, tok->added[i].len, (int32_t)i);
    if (st) return st;
  }
  return ST_OK;
}

/* single_word needs Rust's \w (Alphabetic, marks, decimal digits, connector punctuation, join
** controls) on the characters around a match; compiled only when some token asks for it. */
static st_status build_word_helper(st_tokenizer *tok, const char *file) {
  int need = 0;
  for (size_t i = 0; i < tok->n_added; i++) need |= tok->added[i].single_word;
  if (!need) return ST_OK;
  static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
  char where[128];
  snprintf(where, sizeof where, "%s: single_word helper", file);
  st_status st = tok_compile(tok, word, sizeof word - 1, PCRE2_ANCHORED, &tok->re_word, where);
  if (st) return st;
  if (!(tok->md_small = pcre2_match_data_create(4, NULL))) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
  return ST_OK;
}

st_status st_tokenizer_open_files(const char *json_path, const char *config_path,
                                  st_tokenizer **out) {
  *out = NULL;
  st_tokenizer *tok = calloc(1, sizeof *tok);
  if (!tok) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
  tok->bos_id = tok->eos_id = tok->unk_id = -1;
  json_t *root = NULL;
  st_status st = ST_OK;
  const char *file = base_name(json_path);
  if (!(tok->json_path = strdup(json_path))) {
    st = st_fail(ST_ENOMEM, "tokenizer: out of memory");
    goto fail;
  }
  if (!(tok->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL)) ||
      !(tok->mctx = pcre2_match_context_create(NULL))) {
    st = st_fail(ST_ENOMEM, "tokenizer: out of memory");
    goto fail;
  }
  pcre2_jit_stack_assign(tok->mctx, NULL, tok->jit_stack);
  if ((st = load_json(json_path, &root))) goto fail;
  if ((st = tok_strmap_init(&tok->added_map, 64))) goto fail;
  /* Added tokens first: their spelling is the one an id reports, as in HF's id_to_token. */
  if ((st = load_added(tok, root, file))) goto fail;
  if ((st = load_model(tok, json_object_get(root, "model"), file))) goto fail;
  if ((st = check_normalizer(json_object_get(root, "normalizer"), file, "normalizer"))) goto fail;
  if ((st = load_pretokenizer(tok, json_object_get(root, "pre_tokenizer"), file, "pre_tokenizer"))) goto fail;
  if ((st = check_decoder(tok, json_object_get(root, "decoder"), file, "decoder"))) goto fail;
  if ((st = check_post_processor(json_object_get(root, "post_processor"), file, "post_processor"))) goto fail;
  if (!tok->byte_level) {
    st = st_fail(ST_EUNSUPPORTED, "%s: pre_tokenizer: no ByteLevel step; only byte-level BPE is supported", file);
    goto fail;
  }
  for (int b = 0; b < 256; b++)
    if (tok->byte_id[b] < 0 && tok->unk_id < 0) {
      st = st_fail(ST_EFORMAT, "%s: model.vocab: no token for byte 0x%02X and no unk_token", file, b);
      goto fail;
    }
  json_decref(root);
  root = NULL;
  if (config_path && (st = load_config(tok, config_path))) goto fail;
  if ((st = build_tries(tok))) goto fail;
  if ((st = build_word_helper(tok, file))) goto fail;
  *out = tok;
  return ST_OK;
fail:
  json_decref(root);
  st_tokenizer_close(tok);
  return st;
}

st_status st_tokenizer_open(const char *dir, st_tokenizer **out) {
  char *json_path = NULL, *cfg_path = NULL;
  *out = NULL;
  if (asprintf(&json_path, "%s/tokenizer.json", dir) < 0) return st_fail(ST_ENOMEM, "out of memory");
  if (asprintf(&cfg_path, "%s/tokenizer_config.json", dir) < 0) {
    free(json_path);
    return st_fail(ST_ENOMEM, "out of memory");
  }
  struct stat sb;
  st_status st;
  if (stat(json_path, &sb) != 0)
    st = st_fail(ST_EIO, "%s: %s (a model directory needs tokenizer.json)", json_path, strerror(errno));
  else
    st = st_tokenizer_open_files(json_path, stat(cfg_path, &sb) == 0 ? cfg_path : NULL, out);
  free(json_path);
  free(cfg_path);
  return st;
}

void st_tokenizer_close(st_tokenizer *tok) {
  if (!tok) return;
  free(tok->json_path);
  for (size_t i = 0; i < tok->n_arena_chunks; i++) free(tok->arena_chunks[i]);
  free(tok->arena_chunks);
  free(tok->id_text);
  free(tok->id_bytes);
  free(tok->id_bytes_len);
  free(tok->id_flags);
  tok_strmap_free(&tok->vocab);
  tok_strmap_free(&tok->raw_vocab);
  tok_strmap_free(&tok->added_map);
  free(tok->merges);
  free(tok->added);
  tok_trie_free(&tok->trie_raw);
  tok_trie_free(&tok->trie_norm);
  for (size_t i = 0; i < tok->n_splits; i++) {
    pcre2_match_data_free(tok->splits[i].md);
    pcre2_code_free(tok->splits[i].re);
    free(tok->splits[i].segs);
  }
  free(tok->splits);
  pcre2_code_free(tok->re_word);
  pcre2_match_data_free(tok->md_small);
  pcre2_match_context_free(tok->mctx);
  pcre2_jit_stack_free(tok->jit_stack);
  tok_cache_free(tok);
  free(tok->pieces);
  free(tok->pieces2);
  free(tok->syms);
  free(tok->heap);
  free(tok);
}

/* ---------------------------------------------------------------- lookups and decoding */

int32_t st_tokenizer_token_id(const st_tokenizer *tok, const char *token) {
  size_t n = strlen(token);
  int32_t i = tok_strmap_get(&tok->added_map, token, n);
  if (i >= 0) return tok->added[i].id;
  return tok_strmap_get(&tok->vocab, token, n);
}

const char *st_tokenizer_token_text(const st_tokenizer *tok, int32_t id) {
  return id >= 0 && id < tok->n_ids ? tok->id_text[id] : NULL;
}

const char *st_tokenizer_token_bytes(const st_tokenizer *tok, int32_t id, size_t *len) {
  if (id < 0 || id >= tok->n_ids || !tok->id_text[id]) return NULL;
  if (len) *len = tok->id_bytes_len[id];
  return tok->id_bytes[id];
}

st_status st_tokenizer_decode(const st_tokenizer *tok, const int32_t *ids, size_t n,
                              unsigned flags, char **text, size_t *len) {
  *text = NULL;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= tok->n_ids || !tok->id_text[id])
      return st_fail(ST_EINVAL, "decode: id %d at position %zu is not in the vocabulary (size %d)",
                     id, i, tok->n_ids);
    total += tok->id_bytes_len[id];
  }
  char *buf = malloc(total + 1);
  if (!buf) return st_fail(ST_ENOMEM, "decode: out of memory for %zu bytes", total);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if ((flags & ST_TOK_SKIP_SPECIAL) && (tok->id_flags[id] & TOK_ID_SPECIAL)) continue;
    memcpy(buf + at, tok->id_bytes[id], tok->id_bytes_len[id]);
    at += tok->id_bytes_len[id];
  }
  buf[at] = 0;
  *text = buf;
  if (len) *len = at;
  return ST_OK;
}

size_t st_tokenizer_vocab_size(const st_tokenizer *tok) { return (size_t)tok->n_ids; }
size_t st_tokenizer_model_vocab_size(const st_tokenizer *tok) { return tok->n_model_vocab; }
size_t st_tokenizer_merge_count(const st_tokenizer *tok) { return tok->n_merges; }
size_t st_tokenizer_added_count(const st_tokenizer *tok) { return tok->n_added; }
int st_tokenizer_is_added(const st_tokenizer *tok, int32_t id) {
  return id >= 0 && id < tok->n_ids && (tok->id_flags[id] & TOK_ID_ADDED);
}
int st_tokenizer_is_special(const st_tokenizer *tok, int32_t id) {
  return id >= 0 && id < tok->n_ids && (tok->id_flags[id] & TOK_ID_SPECIAL);
}
int32_t st_tokenizer_bos_id(const st_tokenizer *tok) { return tok->bos_id; }
int32_t st_tokenizer_eos_id(const st_tokenizer *tok) { return tok->eos_id; }
int st_tokenizer_adds_bos(const st_tokenizer *tok) { return tok->add_bos; }
int st_tokenizer_adds_eos(const st_tokenizer *tok) { return tok->add_eos; }
int st_tokenizer_has_chat_template(const st_tokenizer *tok) { return tok->has_chat_template; }
const char *st_tokenizer_path(const st_tokenizer *tok) { return tok->json_path; }

void st_token_ids_free(st_token_ids *v) {
  free(v->ids);
  v->ids = NULL;
  v->n = v->cap = 0;
}

st_status st_token_ids_push(st_token_ids *v, int32_t id) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 256;
    int32_t *grown = realloc(v->ids, cap * sizeof *grown);
    if (!grown) return st_fail(ST_ENOMEM, "tokenizer: out of memory for %zu ids", cap);
    v->ids = grown;
    v->cap = cap;
  }
  v->ids[v->n++] = id;
  return ST_OK;
}
