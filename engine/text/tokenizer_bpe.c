/*
** tokenizer_bpe.c — byte-level BPE on one pre-tokenized word, the word cache, and the encode
** driver (added tokens → splits → BPE).
**
** Merging copies HF `tokenizers`' Word::merge_all so ties and oddities come out the same: a
** min-heap of (rank, position) over adjacent pairs; a popped entry is skipped when its left
** symbol is gone or has no right neighbour, or when the pair now there maps to a different
** merged id (only the merged id is compared, not the rank — as HF does). Each merge pushes the
** two new neighbour pairs. O(n log n) per word, no quadratic rescans.
**
** Cache: word bytes → ids, for words up to CACHE_MAX_WORD bytes; cleared wholesale when it
** fills. Agentic prompts repeat most words (JSON keys, code identifiers, whitespace runs), so
** most words are one hash lookup.
*/
#include <stdlib.h>
#include <string.h>

#include "engine/text/tokenizer_internal.h"

#define CACHE_SLOTS (1u << 17)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 2)
#define CACHE_MAX_WORD 256

struct tok_symbol {
  int32_t id;
  int32_t prev, next;
  uint32_t len; /* bytes covered; 0 once merged into its left neighbour */
};

struct tok_heap_item {
  int32_t rank, pos, merged;
};

/* ---------------------------------------------------------------- merges lookup */

static inline const tok_merge *merge_get(const st_tokenizer *tok, int32_t a, int32_t b) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  size_t i = (size_t)(tok_hash_bytes(&key, sizeof key) & tok->merges_mask);
  for (;;) {
    const tok_merge *m = &tok->merges[i];
    if (m->key == key) return m;
    if (m->key == UINT64_MAX) return NULL;
    i = (i + 1) & tok->merges_mask;
  }
}

/* ---------------------------------------------------------------- min-heap on (rank, pos) */

static inline int heap_less(const struct tok_heap_item *x, const struct tok_heap_item *y) {
  return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static st_status heap_push(st_tokenizer *tok, size_t *n, struct tok_heap_item it) {
  if (*n == tok->heap_cap) {
    size_t cap = tok->heap_cap ? tok->heap_cap * 2 : 256;
    struct tok_heap_item *g = realloc(tok->heap, cap * sizeof *g);
    if (!g) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
    tok->heap = g;
    tok->heap_cap = cap;
  }
  struct tok_heap_item *h = tok->heap;
  size_t i = (*n)++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!heap_less(&it, &h[parent])) break;
    h[i] = h[parent];
    i = parent;
  }
  h[i] = it;
  return ST_OK;
}

static struct tok_heap_item heap_pop(st_tokenizer *tok, size_t *n) {
  struct tok_heap_item *h = tok->heap, top = h[0], last = h[--*n];
  size_t i = 0, m = *n;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, best = i;
    const struct tok_heap_item *bv = &last;
    if (l < m && heap_less(&h[l], bv)) best = l, bv = &h[l];
    if (r < m && heap_less(&h[r], bv)) best = r;
    if (best == i) break;
    h[i] = h[best];
    i = best;
  }
  if (m) h[i] = last;
  return top;
}

/* ---------------------------------------------------------------- word cache */

void tok_cache_free(st_tokenizer *tok) {
  free(tok->cache);
  free(tok->cache_bytes);
  free(tok->cache_ids);
  tok->cache = NULL;
  tok->cache_bytes = NULL;
  tok->cache_ids = NULL;
  tok->cache_count = tok->cache_bytes_used = tok->cache_ids_used = 0;
  tok->cache_bytes_cap = tok->cache_ids_cap = 0;
}

static void cache_clear(st_tokenizer *tok) {
  memset(tok->cache, 0, CACHE_SLOTS * sizeof *tok->cache);
  tok->cache_count = tok->cache_bytes_used = tok->cache_ids_used = 0;
}

/* Slot for a word: the matching entry, or the empty slot where it would go. */
static tok_cache_entry *cache_slot(st_tokenizer *tok, const char *w, size_t n, uint64_t h) {
  size_t i = (size_t)h & tok->cache_mask;
  for (;;) {
    tok_cache_entry *e = &tok->cache[i];
    if (!e->used) return e;
    if (e->hash == h && e->key_len == n && !memcmp(tok->cache_bytes + e->key_off, w, n)) return e;
    i = (i + 1) & tok->cache_mask;
  }
}

/* Remembers ids for a word; failure to allocate only means no caching. */
static void cache_put(st_tokenizer *tok, tok_cache_entry *e, const char *w, size_t n, uint64_t h,
                      const int32_t *ids, size_t n_ids) {
  if (tok->cache_bytes_used + n > tok->cache_bytes_cap) {
    size_t cap = tok->cache_bytes_cap ? tok->cache_bytes_cap * 2 : (1u << 20);
    while (cap < tok->cache_bytes_used + n) cap *= 2;
    char *g = realloc(tok->cache_bytes, cap);
    if (!g) return;
    tok->cache_bytes = g;
    tok->cache_bytes_cap = cap;
  }
  if (tok->cache_ids_used + n_ids > tok->cache_ids_cap) {
    size_t cap = tok->cache_ids_cap ? tok->cache_ids_cap * 2 : (1u << 18);
    while (cap < tok->cache_ids_used + n_ids) cap *= 2;
    int32_t *g = realloc(tok->cache_ids, cap * sizeof *g);
    if (!g) return;
    tok->cache_ids = g;
    tok->cache_ids_cap = cap;
  }
  memcpy(tok->cache_bytes + tok->cache_bytes_used, w, n);
  memcpy(tok->cache_ids + tok->cache_ids_used, ids, n_ids * sizeof *ids);
  *e = (tok_cache_entry){.hash = h,
                         .key_off = (uint32_t)tok->cache_bytes_used,
                         .key_len = (uint32_t)n,
                         .ids_off = (uint32_t)tok->cache_ids_used,
                         .ids_len = (uint32_t)n_ids,
                         .used = 1};
  tok->cache_bytes_used += n;
  tok->cache_ids_used += n_ids;
  tok->cache_count++;
}

/* ---------------------------------------------------------------- BPE on one word */

/* Initial symbols: one per byte (HF: one per byte-level character), with unk handling. */
static st_status word_symbols(st_tokenizer *tok, const char *w, size_t n, size_t *n_syms) {
  if (n > tok->syms_cap) {
    struct tok_symbol *g = realloc(tok->syms, n * sizeof *g);
    if (!g) return st_fail(ST_ENOMEM, "tokenizer: out of memory for a %zu-byte word", n);
    tok->syms = g;
    tok->syms_cap = n;
  }
  size_t m = 0;
  int pending_unk = 0; /* bytes of an unknown run waiting to be emitted (HF's `unk`) */
  for (size_t i = 0; i < n; i++) {
    int32_t id = tok->byte_id[(uint8_t)w[i]];
    if (id >= 0) {
      if (pending_unk) tok->syms[m++] = (struct tok_symbol){tok->unk_id, 0, 0, (uint32_t)pending_unk};
      pending_unk = 0;
      tok->syms[m++] = (struct tok_symbol){id, 0, 0, 1};
    } else if (tok->unk_id >= 0) {
      if (pending_unk && !tok->fuse_unk) {
        tok->syms[m++] = (struct tok_symbol){tok->unk_id, 0, 0, (uint32_t)pending_unk};
        pending_unk = 0;
      }
      pending_unk++;
    }
    /* no token and no unk: HF drops the character */
  }
  if (pending_unk) tok->syms[m++] = (struct tok_symbol){tok->unk_id, 0, 0, (uint32_t)pending_unk};
  for (size_t i = 0; i < m; i++) {
    tok->syms[i].prev = (int32_t)i - 1;
    tok->syms[i].next = i + 1 < m ? (int32_t)i + 1 : -1;
  }
  *n_syms = m;
  return ST_OK;
}

static st_status merge_word(st_tokenizer *tok, size_t n_syms) {
  struct tok_symbol *s = tok->syms;
  size_t hn = 0;
  st_status st;
  for (size_t i = 0; i + 1 < n_syms; i++) {
    const tok_merge *m = merge_get(tok, s[i].id, s[i + 1].id);
    if (m && (st = heap_push(tok, &hn, (struct tok_heap_item){m->rank, (int32_t)i, m->merged})))
      return st;
  }
  while (hn) {
    struct tok_heap_item top = heap_pop(tok, &hn);
    struct tok_symbol *left = &s[top.pos];
    if (!left->len || left->next < 0) continue;
    int32_t right_pos = left->next;
    struct tok_symbol *right = &s[right_pos];
    const tok_merge *cur = merge_get(tok, left->id, right->id);
    if (!cur || cur->merged != top.merged) continue;
    left->id = top.merged;
    left->len += right->len;
    left->next = right->next;
    right->len = 0;
    if (left->next >= 0) s[left->next].prev = top.pos;
    if (left->prev >= 0) {
      const tok_merge *m = merge_get(tok, s[left->prev].id, left->id);
      if (m && (st = heap_push(tok, &hn, (struct tok_heap_item){m->rank, left->prev, m->merged})))
        return st;
    }
    if (left->next >= 0) {
      const tok_merge *m = merge_get(tok, left->id, s[left->next].id);
      if (m && (st = heap_push(tok, &hn, (struct tok_heap_item){m->rank, top.pos, m->merged})))
        return st;
    }
  }
  return ST_OK;
}

st_status tok_bpe_word(st_tokenizer *tok, const char *w, size_t n, st_token_ids *out) {
  st_status st;
  if (!n) return ST_OK;
  if (n == 1 && tok->byte_id[(uint8_t)w[0]] >= 0) return st_token_ids_push(out, tok->byte_id[(uint8_t)w[0]]);
  if (tok->ignore_merges) {
    int32_t id = tok_strmap_get(&tok->raw_vocab, w, n);
    if (id >= 0) return st_token_ids_push(out, id);
  }
  uint64_t h = 0;
  tok_cache_entry *slot = NULL;
  if (n <= CACHE_MAX_WORD) {
    if (!tok->cache) {
      tok->cache = calloc(CACHE_SLOTS, sizeof *tok->cache);
      tok->cache_mask = CACHE_SLOTS - 1;
    }
    if (tok->cache) {
      h = tok_hash_bytes(w, n);
      slot = cache_slot(tok, w, n, h);
      if (slot->used) {
        for (uint32_t i = 0; i < slot->ids_len; i++)
          if ((st = st_token_ids_push(out, tok->cache_ids[slot->ids_off + i]))) return st;
        return ST_OK;
      }
    }
  }
  size_t n_syms = 0;
  if ((st = word_symbols(tok, w, n, &n_syms))) return st;
  if ((st = merge_word(tok, n_syms))) return st;
  size_t first = out->n;
  for (int32_t i = n_syms ? 0 : -1; i >= 0; i = tok->syms[i].next)
    if ((st = st_token_ids_push(out, tok->syms[i].id))) return st;
  if (slot) {
    if (tok->cache_count >= CACHE_MAX_ENTRIES) {
      cache_clear(tok);
      slot = cache_slot(tok, w, n, h);
    }
    cache_put(tok, slot, w, n, h, out->ids + first, out->n - first);
  }
  return ST_OK;
}

/* ---------------------------------------------------------------- encode */

st_status st_tokenizer_encode(st_tokenizer *tok, const char *text, size_t len, unsigned flags,
                              st_token_ids *out) {
  size_t n0 = out->n, bad = tok_utf8_valid_prefix(text, len);
  if (bad != len)
    return st_fail(ST_EINVAL, "encode: the text is not valid UTF-8 at byte %zu (of %zu)", bad, len);
  st_status st = ST_OK;
  if ((flags & ST_TOK_ADD_SPECIAL) && tok->add_bos && (st = st_token_ids_push(out, tok->bos_id)))
    goto fail;
  size_t n_pieces;
  if ((st = tok_extract_added(tok, text, len, flags, &n_pieces))) goto fail;
  for (size_t i = 0; i < n_pieces; i++) {
    tok_piece p = tok->pieces[i];
    if (p.added >= 0) st = st_token_ids_push(out, tok->added[p.added].id);
    else st = tok_pretokenize(tok, text, p.start, p.end, 0, out);
    if (st) goto fail;
  }
  if ((flags & ST_TOK_ADD_SPECIAL) && tok->add_eos && (st = st_token_ids_push(out, tok->eos_id)))
    goto fail;
  return ST_OK;
fail:
  out->n = n0;
  return st;
}
