/*
** tokenizer_pretok.c — the two steps before BPE: cutting added tokens out of the text, and the
** pre-tokenizer's regex splits.
**
** Added tokens. HF `tokenizers` matches added tokens with an Aho-Corasick automaton in
** leftmost-longest mode, in two passes: tokens with normalized=false on the raw text, then
** tokens with normalized=true on the pieces left over (after the normalizer, which is the
** identity here). A byte trie walked from each position gives the same matches: the leftmost
** start, and there the longest token. Matches do not overlap; a skipped match (a special token
** under ST_TOK_SPLIT_SPECIAL, a single_word token inside a word) is still consumed, as in HF.
**
** Regexes. HF compiles tokenizer.json's patterns with Oniguruma (Ruby syntax); PCRE2 with UTF +
** UCP agrees on the constructs these files use, with one measured exception: PCRE2's \s also
** matches U+180E, which Oniguruma's White_Space-based \s does not. Patterns are therefore
** rewritten before compiling (\s → an explicit White_Space class). Both libraries carry
** Unicode 14 tables (PCRE2 10.42; Oniguruma 6.9.8 in the onig crate HF builds with).
**
** Splits run depth-first: each piece of step k is split by step k+1 at once, and the last step's
** pieces go straight to the BPE, so nothing is materialised beyond one segment list per step.
*/
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "engine/text/tokenizer_internal.h"

/* ---------------------------------------------------------------- pattern rewriting */

/* White_Space as a class body (without brackets). */
#define WHITE_SPACE_BODY "\\t-\\r\\x{85}\\p{Z}"

st_status tok_regex_for_pcre2(const char *pat, size_t len, char **out, const char *where) {
  st_buf b = {0};
  int in_class = 0;
  size_t class_start = 0;
  *out = NULL;
  for (size_t i = 0; i < len; i++) {
    char c = pat[i];
    if (c == '\\' && i + 1 < len) {
      char e = pat[i + 1];
      i++;
      if (e == 's') st_buf_str(&b, in_class ? WHITE_SPACE_BODY : "[" WHITE_SPACE_BODY "]");
      else if (e == 'S') {
        if (in_class) {
          st_buf_free(&b);
          return st_fail(ST_EUNSUPPORTED, "%s: \\S inside a character class is not supported", where);
        }
        st_buf_str(&b, "[^" WHITE_SPACE_BODY "]");
      } else if (e == 'h') st_buf_str(&b, in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"); /* Ruby: hex digit */
      else if (e == 'H') {
        if (in_class) {
          st_buf_free(&b);
          return st_fail(ST_EUNSUPPORTED, "%s: \\H inside a character class is not supported", where);
        }
        st_buf_str(&b, "[^0-9a-fA-F]");
      } else {
        char two[2] = {c, e};
        st_buf_add(&b, two, 2);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = 1;
      st_buf_add(&b, &c, 1);
      class_start = i + 1;
      if (class_start < len && pat[class_start] == '^') {
        st_buf_add(&b, "^", 1);
        i++;
        class_start++;
      }
      /* A ']' first in a class is a literal. */
      if (class_start < len && pat[class_start] == ']') {
        st_buf_add(&b, "\\]", 2);
        i++;
      }
      continue;
    }
    if (in_class && c == '[') {
      st_buf_free(&b);
      return st_fail(ST_EUNSUPPORTED, "%s: nested character classes are not supported", where);
    }
    if (in_class && c == ']') in_class = 0;
    st_buf_add(&b, &c, 1);
  }
  st_status st = st_buf_status(&b, "tokenizer");
  if (st) {
    st_buf_free(&b);
    return st;
  }
  *out = st_buf_take(&b, NULL);
  if (!*out) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
  return ST_OK;
}

st_status tok_compile(st_tokenizer *tok, const char *pattern, size_t len, uint32_t options,
                      pcre2_code **out, const char *where) {
  (void)tok;
  char *rewritten = NULL;
  *out = NULL;
  if (!(options & PCRE2_LITERAL)) {
    st_status st = tok_regex_for_pcre2(pattern, len, &rewritten, where);
    if (st) return st;
    pattern = rewritten;
    len = strlen(rewritten);
  }
  int err;
  PCRE2_SIZE off;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP | options, &err,
                                 &off, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    st_status st = st_fail(ST_EFORMAT, "%s: regex does not compile at offset %zu: %s", where,
                           (size_t)off, (const char *)msg);
    free(rewritten);
    return st;
  }
  free(rewritten);
  /* JIT when the platform has it; pcre2_match falls back to the interpreter otherwise. */
  (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  *out = re;
  return ST_OK;
}

/* ---------------------------------------------------------------- added-token trie */

static st_status trie_node(tok_trie *t, uint8_t byte, int32_t *out) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    tok_trie_node *g = realloc(t->nodes, cap * sizeof *g);
    if (!g) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
    t->nodes = g;
    t->cap = cap;
  }
  t->nodes[t->n] = (tok_trie_node){.first_child = -1, .next_sibling = -1, .added = -1, .byte = byte};
  *out = (int32_t)t->n++;
  return ST_OK;
}

st_status tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t added_index) {
  int32_t node, child;
  st_status st;
  if (!t->n && (st = trie_node(t, 0, &node))) return st;
  node = 0;
  for (size_t i = 0; i < n; i++) {
    uint8_t byte = (uint8_t)s[i];
    for (child = t->nodes[node].first_child; child >= 0; child = t->nodes[child].next_sibling)
      if (t->nodes[child].byte == byte) break;
    if (child < 0) {
      if ((st = trie_node(t, byte, &child))) return st;
      t->nodes[child].next_sibling = t->nodes[node].first_child;
      t->nodes[node].first_child = child;
    }
    node = child;
  }
  if (t->nodes[node].added < 0) t->nodes[node].added = added_index;
  t->first[(uint8_t)s[0]] = 1;
  return ST_OK;
}

void tok_trie_free(tok_trie *t) {
  free(t->nodes);
  memset(t, 0, sizeof *t);
}

/* Longest token starting at text[pos] within [pos, end): index into tok->added, or -1. */
static int32_t trie_longest(const tok_trie *t, const char *text, size_t pos, size_t end,
                            size_t *match_end) {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < end; i++) {
    uint8_t byte = (uint8_t)text[i];
    int32_t child;
    for (child = t->nodes[node].first_child; child >= 0; child = t->nodes[child].next_sibling)
      if (t->nodes[child].byte == byte) break;
    if (child < 0) break;
    node = child;
    if (t->nodes[node].added >= 0) {
      best = t->nodes[node].added;
      *match_end = i + 1;
    }
  }
  return best;
}

/* Rust's \w on the character that ends at / starts at a byte offset. */
static int word_char_at(st_tokenizer *tok, const char *text, size_t start, size_t end) {
  size_t adv;
  tok_utf8_decode((const unsigned char *)text + start, &adv);
  if (start + adv > end) return 0;
  return pcre2_match(tok->re_word, (PCRE2_SPTR)text + start, adv, 0,
                     PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, tok->md_small, tok->mctx) >= 0;
}

static size_t char_start_before(const char *text, size_t lo, size_t pos) {
  size_t i = pos;
  while (i > lo) {
    i--;
    if (((unsigned char)text[i] & 0xC0) != 0x80) break;
  }
  return i;
}

static st_status push_piece(tok_piece **arr, size_t *cap, size_t *n, size_t start, size_t end,
                            int32_t added) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 64;
    tok_piece *g = realloc(*arr, c * sizeof *g);
    if (!g) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
    *arr = g;
    *cap = c;
  }
  (*arr)[(*n)++] = (tok_piece){start, end, added};
  return ST_OK;
}

/* One matching pass over [start, end) (HF's find_matches), appending pieces. */
static st_status match_pass(st_tokenizer *tok, const tok_trie *t, const char *text, size_t start,
                            size_t end, unsigned flags, tok_piece **arr, size_t *cap, size_t *n) {
  size_t offset = start, pos = start;
  st_status st;
  if (t->n) {
    while (pos < end) {
      if (!t->first[(uint8_t)text[pos]]) {
        pos++;
        continue;
      }
      size_t mend = 0;
      int32_t idx = trie_longest(t, text, pos, end, &mend);
      if (idx < 0) {
        pos++;
        continue;
      }
      const tok_added *a = &tok->added[idx];
      size_t mstart = pos, mstop = mend;
      pos = mend;
      if ((flags & ST_TOK_SPLIT_SPECIAL) && a->special) continue;
      if (a->single_word) {
        int word_before = mstart > start && word_char_at(tok, text, char_start_before(text, start, mstart), mstart);
        int word_after = mstop < end && word_char_at(tok, text, mstop, end);
        if (word_before || word_after) continue;
      }
      if (a->lstrip) {
        size_t s = mstart;
        while (s > start) {
          size_t cs = char_start_before(text, start, s), adv;
          if (!tok_is_white_space(tok_utf8_decode((const unsigned char *)text + cs, &adv))) break;
          s = cs;
        }
        mstart = s > offset ? s : offset;
      }
      if (a->rstrip) {
        while (mstop < end) {
          size_t adv;
          if (!tok_is_white_space(tok_utf8_decode((const unsigned char *)text + mstop, &adv))) break;
          mstop += adv;
        }
        if (pos < mstop) pos = mstop;
      }
      if (offset < mstart && (st = push_piece(arr, cap, n, offset, mstart, -1))) return st;
      if ((st = push_piece(arr, cap, n, mstart, mstop, idx))) return st;
      offset = mstop;
    }
  }
  if (offset < end && (st = push_piece(arr, cap, n, offset, end, -1))) return st;
  return ST_OK;
}

st_status tok_extract_added(st_tokenizer *tok, const char *text, size_t len, unsigned flags,
                            size_t *n_out) {
  size_t n = 0;
  st_status st = match_pass(tok, &tok->trie_raw, text, 0, len, flags, &tok->pieces,
                            &tok->pieces_cap, &n);
  if (st) return st;
  if (tok->trie_norm.n) {
    size_t n2 = 0;
    for (size_t i = 0; i < n; i++) {
      tok_piece p = tok->pieces[i];
      if (p.added >= 0) st = push_piece(&tok->pieces2, &tok->pieces2_cap, &n2, p.start, p.end, p.added);
      else st = match_pass(tok, &tok->trie_norm, text, p.start, p.end, flags, &tok->pieces2,
                           &tok->pieces2_cap, &n2);
      if (st) return st;
    }
    tok_piece *swap = tok->pieces;
    size_t swap_cap = tok->pieces_cap;
    tok->pieces = tok->pieces2, tok->pieces_cap = tok->pieces2_cap;
    tok->pieces2 = swap, tok->pieces2_cap = swap_cap;
    n = n2;
  }
  *n_out = n;
  return ST_OK;
}

/* ---------------------------------------------------------------- regex splits */

static st_status push_seg(tok_split *s, size_t *n, size_t start, size_t end, int is_match) {
  if (*n == s->segs_cap) {
    size_t c = s->segs_cap ? s->segs_cap * 2 : 64;
    tok_segment *g = realloc(s->segs, c * sizeof *g);
    if (!g) return st_fail(ST_ENOMEM, "tokenizer: out of memory");
    s->segs = g;
    s->segs_cap = c;
  }
  s->segs[(*n)++] = (tok_segment){start, end, is_match};
  return ST_OK;
}

/* Applies a split's behaviour to its segment list in place (HF's SplitDelimiterBehavior). The
** result's is_match flags are meaningless; every remaining segment is a piece. */
static size_t apply_behavior(tok_segment *seg, size_t n, int behavior) {
  size_t m = 0;
  int prev_match = 0;
  switch (behavior) {
  case TOK_SPLIT_ISOLATED:
    return n;
  case TOK_SPLIT_REMOVED:
    for (size_t i = 0; i < n; i++)
      if (!seg[i].is_match) seg[m++] = seg[i];
    return m;
  case TOK_SPLIT_MERGED_WITH_PREVIOUS:
    for (size_t i = 0; i < n; i++) {
      if (seg[i].is_match && !prev_match && m > 0) seg[m - 1].end = seg[i].end;
      else seg[m++] = seg[i];
      prev_match = seg[i].is_match;
    }
    return m;
  case TOK_SPLIT_MERGED_WITH_NEXT: {
    /* Walk backwards: a match absorbs the non-match segment after it. */
    size_t w = n;
    for (size_t k = n; k-- > 0;) {
      tok_segment cur = seg[k];
      if (cur.is_match && !prev_match && w < n) seg[w].start = cur.start;
      else seg[--w] = cur;
      prev_match = cur.is_match;
    }
    memmove(seg, seg + w, (n - w) * sizeof *seg);
    return n - w;
  }
  case TOK_SPLIT_CONTIGUOUS:
    for (size_t i = 0; i < n; i++) {
      if (seg[i].is_match == prev_match && m > 0) seg[m - 1].end = seg[i].end;
      else seg[m++] = seg[i];
      prev_match = seg[i].is_match;
    }
    return m;
  }
  return n;
}

st_status tok_pretokenize(st_tokenizer *tok, const char *text, size_t start, size_t end,
                          size_t step, st_token_ids *out) {
  if (start >= end) return ST_OK;
  if (step == tok->n_splits) return tok_bpe_word(tok, text + start, end - start, out);
  tok_split *s = &tok->splits[step];
  size_t n = 0, prev = 0, offset = 0, len = end - start;
  const char *subject = text + start;
  st_status st;
  while (offset < len) {
    int rc = pcre2_match(s->re, (PCRE2_SPTR)subject, len, offset, PCRE2_NO_UTF_CHECK, s->md, tok->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return st_fail(ST_EUNSUPPORTED, "tokenizer: pre_tokenizer split %zu failed on a %zu-byte piece: %s",
                     step, len, (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
    size_t ms = ov[0], me = ov[1];
    if (me == ms) { /* an empty match splits nothing; step over one character */
      size_t adv;
      tok_utf8_decode((const unsigned char *)subject + ms, &adv);
      offset = ms + adv;
      continue;
    }
    if (ms > prev && (st = push_seg(s, &n, start + prev, start + ms, s->invert))) return st;
    if ((st = push_seg(s, &n, start + ms, start + me, !s->invert))) return st;
    prev = offset = me;
  }
  if (prev < len && (st = push_seg(s, &n, start + prev, end, s->invert))) return st;
  n = apply_behavior(s->segs, n, s->behavior);
  for (size_t i = 0; i < n; i++) {
    /* Deeper steps use their own segment lists, so s->segs stays valid across the call. */
    tok_segment g = s->segs[i];
    if ((st = tok_pretokenize(tok, text, g.start, g.end, step + 1, out))) return st;
  }
  return ST_OK;
}
