/*
** tokenizer_internal.h — the st_tokenizer structure, shared by tokenizer.c (loading, lookups,
** decoding), tokenizer_pretok.c (added-token matching, regex splits) and tokenizer_bpe.c
** (merges, word cache, the encode driver). Not part of the public API.
*/
#ifndef ST_TOKENIZER_INTERNAL_H
#define ST_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/text/tokenizer.h"

/* ---------------------------------------------------------------- byte strings → id */

/* Open-addressing hash map from byte strings (borrowed, in the tokenizer's arena) to ids. */
typedef struct tok_strmap {
  const char **keys; /* NULL = empty slot */
  uint32_t *lens;
  int32_t *vals;
  size_t mask, count;
} tok_strmap;

uint64_t tok_hash_bytes(const void *p, size_t n);
st_status tok_strmap_init(tok_strmap *m, size_t expected);
void tok_strmap_free(tok_strmap *m);
/* Inserts or replaces; the key memory must outlive the map. */
st_status tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val);
/* -1 when absent. */
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len);

/* Merge table: (left id, right id) → (rank, merged id). */
typedef struct tok_merge {
  uint64_t key; /* (left << 32) | right; UINT64_MAX = empty */
  int32_t rank, merged;
} tok_merge;

/* ---------------------------------------------------------------- pre-tokenizer */

enum tok_split_behavior {
  TOK_SPLIT_REMOVED,
  TOK_SPLIT_ISOLATED,
  TOK_SPLIT_MERGED_WITH_PREVIOUS,
  TOK_SPLIT_MERGED_WITH_NEXT,
  TOK_SPLIT_CONTIGUOUS,
};

typedef struct tok_segment {
  size_t start, end;
  int is_match;
} tok_segment;

typedef struct tok_split {
  pcre2_code *re;
  pcre2_match_data *md;
  int behavior, invert;
  tok_segment *segs; /* scratch: the segments of one piece at this depth */
  size_t segs_cap;
} tok_split;

/* ---------------------------------------------------------------- added tokens */

typedef struct tok_added {
  const char *content; /* arena */
  uint32_t len;
  int32_t id;
  uint8_t special, normalized, lstrip, rstrip, single_word;
} tok_added;

/* Byte trie over added-token contents; one per matching pass (non-normalized, normalized). */
typedef struct tok_trie_node {
  int32_t first_child, next_sibling; /* -1 = none */
  int32_t added;                     /* index into tok->added whose content ends here, or -1 */
  uint8_t byte;
} tok_trie_node;

typedef struct tok_trie {
  tok_trie_node *nodes; /* node 0 = root */
  size_t n, cap;
  uint8_t first[256]; /* 1 when some token starts with this byte */
} tok_trie;

/* A piece of the input after added-token extraction: either an added token or plain text. */
typedef struct tok_piece {
  size_t start, end;
  int32_t added; /* index into tok->added, or -1 for text */
} tok_piece;

/* ---------------------------------------------------------------- word cache */

typedef struct tok_cache_entry {
  uint64_t hash;
  uint32_t key_off, key_len; /* into cache_bytes */
  uint32_t ids_off, ids_len; /* into cache_ids */
  uint8_t used;
} tok_cache_entry;

/* ---------------------------------------------------------------- the tokenizer */

struct st_tokenizer {
  char *json_path;

  /* Arena of token strings (tokenizer.json spelling) and decoded bytes; chunks linked. */
  char **arena_chunks;
  size_t n_arena_chunks, arena_used, arena_cap;

  /* Per id (0 .. n_ids-1). */
  int32_t n_ids;
  const char **id_text;   /* tokenizer.json spelling, NUL-terminated; NULL = hole */
  const char **id_bytes;  /* decoded bytes */
  uint32_t *id_bytes_len;
  uint8_t *id_flags;      /* TOK_ID_* */

  tok_strmap vocab;     /* model.vocab: spelling → id */
  size_t n_model_vocab;
  tok_strmap raw_vocab; /* decoded bytes → id (byte-level entries only), for ignore_merges */
  int32_t byte_id[256]; /* id of the token for each single byte, -1 when absent */

  tok_merge *merges;
  size_t merges_mask, n_merges;

  int ignore_merges, byte_fallback;
  int32_t unk_id; /* -1 = no unk_token */
  int fuse_unk;

  tok_added *added;
  size_t n_added;
  tok_strmap added_map; /* content → index into added */
  tok_trie trie_raw;    /* normalized == false: matched on the raw text first */
  tok_trie trie_norm;   /* normalized == true: matched on what is left */

  tok_split *splits;
  size_t n_splits;
  int byte_level; /* a ByteLevel pre-tokenizer step was present (required) */

  /* single_word needs Rust's \w on one character (compiled only when a token needs it). */
  pcre2_code *re_word;
  pcre2_match_data *md_small;
  pcre2_jit_stack *jit_stack;
  pcre2_match_context *mctx;

  /* tokenizer_config.json */
  int add_bos, add_eos, has_chat_template;
  int32_t bos_id, eos_id;

  /* Word cache (per tokenizer; see the threading note in tokenizer.h). */
  tok_cache_entry *cache;
  size_t cache_mask, cache_count;
  char *cache_bytes;
  size_t cache_bytes_used, cache_bytes_cap;
  int32_t *cache_ids;
  size_t cache_ids_used, cache_ids_cap;

  /* Scratch for one encode call. */
  tok_piece *pieces, *pieces2;
  size_t pieces_cap, pieces2_cap;
  struct tok_symbol *syms;
  size_t syms_cap;
  struct tok_heap_item *heap;
  size_t heap_cap;
};

enum {
  TOK_ID_ADDED = 1,
  TOK_ID_SPECIAL = 2,
  TOK_ID_BYTE_LEVEL = 4, /* spelling maps back to bytes through the byte-level table */
};

/* GPT-2's byte ↔ unicode table in closed form: printable Latin-1 bytes (! .. ~, ¡ .. ¬,
** ® .. ÿ) stand for themselves; the other 68 bytes take U+0100 .. U+0143 in byte order. */
static inline uint32_t tok_byte_to_cp(uint8_t b) {
  if (b <= 32) return 256u + b;
  if (b >= 127 && b <= 160) return b + 162u;
  if (b == 173) return 323u;
  return b;
}
/* Inverse: the byte a code point stands for, or -1. */
static inline int tok_cp_to_byte(uint32_t cp) {
  if (cp < 256) return (cp <= 32 || (cp >= 127 && cp <= 160) || cp == 173) ? -1 : (int)cp;
  if (cp <= 288) return (int)(cp - 256);
  if (cp <= 322) return (int)(cp - 162);
  if (cp == 323) return 173;
  return -1;
}

/* Oniguruma's (and Rust's) White_Space set, which HF's \s matches. */
static inline int tok_is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

/* UTF-8: validates [p, p+n) like Rust's str (no overlongs, surrogates or > U+10FFFF). Returns
** n when valid, else the offset of the first bad byte. */
size_t tok_utf8_valid_prefix(const char *p, size_t n);
/* Decodes one code point at p (valid UTF-8 assumed); stores its byte length in *adv. */
uint32_t tok_utf8_decode(const unsigned char *p, size_t *adv);

/* tokenizer_pretok.c */
/* Rewrites an Oniguruma (Ruby syntax) pattern for PCRE2 so the classes match what HF
** tokenizers matches: \s/\S → Oniguruma's White_Space set, \h/\H → hex digits. Caller frees. */
st_status tok_regex_for_pcre2(const char *pattern, size_t len, char **out, const char *where);
st_status tok_compile(st_tokenizer *tok, const char *pattern, size_t len, uint32_t options,
                      pcre2_code **out, const char *where);
st_status tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t added_index);
void tok_trie_free(tok_trie *t);
/* Cuts added tokens out of [0, len) of text; fills tok->pieces, returns the count in *n. */
st_status tok_extract_added(st_tokenizer *tok, const char *text, size_t len, unsigned flags,
                            size_t *n);
/* Runs the split steps from `step` on [start, end) and calls the BPE on each final piece. */
st_status tok_pretokenize(st_tokenizer *tok, const char *text, size_t start, size_t end,
                          size_t step, st_token_ids *out);

/* tokenizer_bpe.c */
st_status tok_bpe_word(st_tokenizer *tok, const char *word, size_t n, st_token_ids *out);
void tok_cache_free(st_tokenizer *tok);

#endif
