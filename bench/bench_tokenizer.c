/*
** bench_tokenizer.c — how long tokenising a ~100 kB agentic prompt takes.
**
**   build-tok/bench/bench_tokenizer --model DIR [--corpus FILE] [--bytes N] [--repeat R]
**                                   [--dump FILE]
**
** The prompt is built deterministically from the parity corpus (tests/data/tokenizer/
** corpus.jsonl): its agentic, schema, code, path, prompt and whitespace strings in file order,
** joined by blank lines, until N bytes (default 100000). Reported: tokenizer load time, the
** first encode (empty word cache, what a fresh process pays), the median of R warm encodes
** (default 20, cache filled by the first) and a cold median (a fresh tokenizer per run is too
** slow to repeat, so the cold figure is the first encode of each of 3 opened tokenizers).
** --dump writes the prompt so bench/bench_tokenizer_hf.py can time HF `tokenizers` on the same
** bytes.
*/
#define _GNU_SOURCE
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/text/pyjson.h"
#include "engine/text/tokenizer.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static char *build_prompt(const char *corpus_path, size_t target, size_t *len) {
  FILE *f = fopen(corpus_path, "rb");
  if (!f) {
    fprintf(stderr, "bench_tokenizer: cannot read %s\n", corpus_path);
    return NULL;
  }
  static const char *const kinds[] = {"agentic", "schema", "code", "path", "prompt", "whitespace"};
  st_buf t = {0};
  char *line = NULL;
  size_t cap = 0;
  while (t.len < target && getline(&line, &cap, f) > 0) {
    json_error_t e;
    json_t *rec = json_loads(line, JSON_ALLOW_NUL, &e);
    const char *kind = json_string_value(json_object_get(rec, "kind"));
    json_t *text = json_object_get(rec, "text");
    for (size_t k = 0; kind && k < sizeof kinds / sizeof kinds[0]; k++)
      if (!strcmp(kind, kinds[k])) {
        if (t.len) st_buf_add(&t, "\n\n", 2);
        st_buf_add(&t, json_string_value(text), json_string_length(text));
      }
    json_decref(rec);
  }
  free(line);
  fclose(f);
  if (t.len > target) t.len = target;
  /* Do not end inside a UTF-8 sequence. */
  while (t.len && ((unsigned char)t.data[t.len] & 0xC0) == 0x80) t.len--;
  return st_buf_take(&t, len);
}

int main(int argc, char **argv) {
  static const struct option options[] = {
    {"model", required_argument, NULL, 'm'},  {"corpus", required_argument, NULL, 'c'},
    {"bytes", required_argument, NULL, 'b'},  {"repeat", required_argument, NULL, 'r'},
    {"dump", required_argument, NULL, 'd'},   {NULL, 0, NULL, 0},
  };
  const char *model = NULL, *corpus = "tests/data/tokenizer/corpus.jsonl", *dump = NULL;
  size_t bytes = 100000;
  int repeat = 20, opt;
  while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
    switch (opt) {
    case 'm': model = optarg; break;
    case 'c': corpus = optarg; break;
    case 'b': bytes = (size_t)strtoull(optarg, NULL, 10); break;
    case 'r': repeat = atoi(optarg); break;
    case 'd': dump = optarg; break;
    default: return 2;
    }
  }
  if (!model || repeat < 1) {
    fprintf(stderr, "usage: bench_tokenizer --model DIR [--corpus FILE] [--bytes N] [--repeat R] [--dump FILE]\n");
    return 2;
  }
  size_t len = 0;
  char *text = build_prompt(corpus, bytes, &len);
  if (!text) return 1;
  if (dump) {
    FILE *f = fopen(dump, "wb");
    if (!f || fwrite(text, 1, len, f) != len || fclose(f)) {
      fprintf(stderr, "bench_tokenizer: cannot write %s\n", dump);
      return 1;
    }
  }
  double cold[3], load = 0;
  size_t n_tokens = 0;
  st_tokenizer *tok = NULL;
  for (int i = 0; i < 3; i++) {
    st_tokenizer_close(tok);
    double t0 = now();
    if (st_tokenizer_open(model, &tok)) {
      fprintf(stderr, "bench_tokenizer: %s\n", st_errmsg());
      return 1;
    }
    double t1 = now();
    st_token_ids ids = {0};
    if (st_tokenizer_encode(tok, text, len, 0, &ids)) {
      fprintf(stderr, "bench_tokenizer: %s\n", st_errmsg());
      return 1;
    }
    cold[i] = now() - t1;
    load += (t1 - t0) / 3;
    n_tokens = ids.n;
    st_token_ids_free(&ids);
  }
  double *warm = malloc((size_t)repeat * sizeof *warm);
  st_token_ids ids = {0};
  for (int i = 0; i < repeat; i++) {
    ids.n = 0;
    double t0 = now();
    st_tokenizer_encode(tok, text, len, 0, &ids);
    warm[i] = now() - t0;
  }
  qsort(cold, 3, sizeof *cold, cmp_double);
  qsort(warm, (size_t)repeat, sizeof *warm, cmp_double);
  printf("prompt: %zu bytes, %zu tokens (%.2f bytes/token)\n", len, n_tokens, (double)len / (double)n_tokens);
  printf("load tokenizer.json: %.1f ms (mean of 3)\n", load * 1e3);
  printf("encode, empty word cache: %.2f ms (median of 3)  %.1f MB/s\n", cold[1] * 1e3, (double)len / cold[1] / 1e6);
  printf("encode, warm word cache:  %.2f ms (median of %d)  %.1f MB/s\n", warm[repeat / 2] * 1e3, repeat,
         (double)len / warm[repeat / 2] / 1e6);
  st_token_ids_free(&ids);
  free(warm);
  st_tokenizer_close(tok);
  free(text);
  return 0;
}
