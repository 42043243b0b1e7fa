/*
** test_tokenizer_parity.c — sparsetrace's ids equal HF `tokenizers`' on the committed corpus.
**
** Inputs: tests/data/tokenizer/corpus.jsonl (tools/make_tokenizer_corpus.py), the expected ids
** tests/data/tokenizer/deepseek_v3_expected.jsonl (tools/tokenizer_parity.py, run with HF
** `tokenizers` on the GPU machine) and DeepSeek-V3's tokenizer.json (tests/tokenizer_fixture.h).
** Exit 77 (skipped) with a message when the vocabulary or the expected file is missing;
** $ST_TOKENIZER_EXPECTED overrides the expected file's path.
**
** Every string is encoded with add_special_tokens=False semantics (flags 0). A mismatch prints
** the corpus id, its kind, the first differing position and the ids around it with their text.
** Kind "unicode15" holds characters assigned after Unicode 14 (PCRE2 10.42's tables); there
** HF's Oniguruma may know more, so mismatches are counted and printed but do not fail the test.
*/
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/text/tokenizer.h"
#include "tokenizer_fixture.h"

#define MAX_KINDS 64

typedef struct kind_count {
  char name[32];
  int total, bad;
} kind_count;

static kind_count *kind_slot(kind_count *kinds, int *n, const char *name) {
  for (int i = 0; i < *n; i++)
    if (!strcmp(kinds[i].name, name)) return &kinds[i];
  if (*n == MAX_KINDS) return &kinds[MAX_KINDS - 1];
  memset(&kinds[*n], 0, sizeof kinds[*n]);
  snprintf(kinds[*n].name, sizeof kinds[*n].name, "%s", name);
  return &kinds[(*n)++];
}

static void show_token(const st_tokenizer *tok, int32_t id) {
  size_t n = 0;
  const char *b = st_tokenizer_token_bytes(tok, id, &n);
  printf(" %d", id);
  if (!b) return;
  putchar('(');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)b[i];
    if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
    else putchar(c);
  }
  putchar(')');
}

static void show_ids(const char *label, const st_tokenizer *tok, const int32_t *ids, size_t n,
                     size_t from, size_t to) {
  printf("    %s[%zu..%zu):", label, from, to < n ? to : n);
  for (size_t i = from; i < to && i < n; i++) show_token(tok, ids[i]);
  printf("\n");
}

int main(void) {
  const char *data = getenv("ST_TEST_DATA");
  char corpus_path[4096], expected_path[4096];
  snprintf(corpus_path, sizeof corpus_path, "%s/tokenizer/corpus.jsonl", data ? data : "tests/data");
  const char *exp_env = getenv("ST_TOKENIZER_EXPECTED");
  snprintf(expected_path, sizeof expected_path, "%s",
           exp_env && *exp_env ? exp_env : "");
  if (!expected_path[0])
    snprintf(expected_path, sizeof expected_path, "%s/tokenizer/deepseek_v3_expected.jsonl",
             data ? data : "tests/data");

  size_t exp_len = 0;
  char *expected = fixture_read_file(expected_path, &exp_len);
  if (!expected) {
    printf("SKIP: %s does not exist yet. It is made on a machine with HF tokenizers:\n"
           "  python3 tools/tokenizer_parity.py DIR/tokenizer.json tests/data/tokenizer/corpus.jsonl"
           " > tests/data/tokenizer/deepseek_v3_expected.jsonl\n"
           "(DIR from tools/fetch_tokenizer.sh). Round trips and hand-checked ids run in "
           "test_tokenizer meanwhile.\n", expected_path);
    return 77;
  }
  const char *why = NULL;
  const char *dir = fixture_deepseek_dir(&why);
  if (!dir) {
    printf("SKIP: %s\n", why);
    free(expected);
    return 77;
  }
  st_tokenizer *tok = NULL;
  if (st_tokenizer_open(dir, &tok)) {
    printf("FAIL: opening %s: %s\n", dir, st_errmsg());
    free(expected);
    return 1;
  }
  size_t corpus_len = 0;
  char *corpus = fixture_read_file(corpus_path, &corpus_len);
  if (!corpus) {
    printf("FAIL: cannot read %s\n", corpus_path);
    return 1;
  }

  kind_count kinds[MAX_KINDS];
  int n_kinds = 0, failures = 0, printed = 0, lines = 0;
  size_t total_tokens = 0, total_bytes = 0;
  double seconds = 0;
  char *cline = corpus, *eline = expected;
  /* The expected file starts with a {"meta": ...} line. */
  json_error_t err;
  json_t *first = json_loadb(eline, strcspn(eline, "\n"), 0, &err);
  if (first && json_object_get(first, "meta")) {
    char *meta = json_dumps(json_object_get(first, "meta"), JSON_COMPACT);
    printf("expected ids: %s\n", meta ? meta : "?");
    free(meta);
    eline += strcspn(eline, "\n") + (eline[strcspn(eline, "\n")] ? 1 : 0);
  }
  json_decref(first);
  st_token_ids ids = {0};
  while (*cline) {
    size_t cl = strcspn(cline, "\n"), el = strcspn(eline, "\n");
    json_t *c = json_loadb(cline, cl, JSON_ALLOW_NUL, &err);
    json_t *e = *eline ? json_loadb(eline, el, 0, &err) : NULL;
    if (!c || !e || json_integer_value(json_object_get(c, "id")) != json_integer_value(json_object_get(e, "id"))) {
      printf("FAIL: corpus line %d and expected line do not correspond (regenerate the expected "
             "file after changing the corpus)\n", lines + 1);
      return 1;
    }
    const char *kind = json_string_value(json_object_get(c, "kind"));
    json_t *text = json_object_get(c, "text");
    json_t *want = json_object_get(e, "ids");
    kind_count *k = kind_slot(kinds, &n_kinds, kind ? kind : "?");
    k->total++;
    ids.n = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st_status st = st_tokenizer_encode(tok, json_string_value(text), json_string_length(text), 0, &ids);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    seconds += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    total_bytes += json_string_length(text);
    total_tokens += ids.n;
    size_t nw = json_array_size(want), diff = 0;
    int same = st == ST_OK && nw == ids.n;
    for (diff = 0; diff < nw && diff < ids.n; diff++)
      if (json_integer_value(json_array_get(want, diff)) != ids.ids[diff]) {
        same = 0;
        break;
      }
    if (!same) {
      k->bad++;
      int allowed = kind && !strcmp(kind, "unicode15");
      if (!allowed) failures++;
      if (printed++ < 20) {
        printf("%s: corpus id %lld (%s): %s at position %zu (got %zu ids, want %zu)\n",
               allowed ? "known divergence" : "MISMATCH",
               (long long)json_integer_value(json_object_get(c, "id")), kind,
               st ? st_errmsg() : "ids differ", diff, ids.n, nw);
        int32_t *w = malloc((nw ? nw : 1) * sizeof *w);
        for (size_t i = 0; w && i < nw; i++) w[i] = (int32_t)json_integer_value(json_array_get(want, i));
        size_t from = diff > 4 ? diff - 4 : 0;
        show_ids("got ", tok, ids.ids, ids.n, from, diff + 6);
        if (w) show_ids("want", tok, w, nw, from, diff + 6);
        free(w);
      }
    }
    json_decref(c);
    json_decref(e);
    lines++;
    cline += cl + (cline[cl] ? 1 : 0);
    eline += el + (eline[el] ? 1 : 0);
  }
  if (*eline) {
    printf("FAIL: the expected file has more lines than the corpus\n");
    failures++;
  }
  printf("\n%-12s %7s %7s\n", "kind", "strings", "differ");
  for (int i = 0; i < n_kinds; i++) printf("%-12s %7d %7d\n", kinds[i].name, kinds[i].total, kinds[i].bad);
  printf("\n%d strings, %zu bytes, %zu tokens, encoded in %.1f ms; %d mismatches outside "
         "\"unicode15\"\n", lines, total_bytes, total_tokens, seconds * 1e3, failures);
  st_token_ids_free(&ids);
  st_tokenizer_close(tok);
  free(corpus);
  free(expected);
  return failures ? 1 : 0;
}
