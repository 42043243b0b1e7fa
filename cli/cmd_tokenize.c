/*
** cmd_tokenize.c — `sparsetrace tokenize`: text on stdin → token ids, or ids → text.
**
** The same tokenizer the engine and `render --ids` use (engine/tokenizer.c), so a user can
** check one string against what their server's /tokenize endpoint says.
*/
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "options.h"
#include "common/base.h"
#include "engine/text/pyjson.h"
#include "engine/text/tokenizer.h"

static const st_opt_use tokenize_options[] = {
  {ST_OPT_MODEL, NULL, "the tokenizer (see above)"},
  {ST_OPT_JSON, NULL, "encode: one JSON array of ids, e.g. [128803, 30594]\n"
                      "decode: the text as one JSON string\n"
                      "(default: one line per token: position, id, decoded text as JSON)"},
  {ST_OPT_NO_SPECIAL, NULL, "do not add BOS/EOS even if tokenizer_config.json asks for them\n"
                            "(the default follows add_bos_token / add_eos_token, like\n"
                            "transformers' add_special_tokens=True)"},
  {ST_OPT_SPLIT_SPECIAL, NULL, "special-token strings in the text are plain text (HF\n"
                               "split_special_tokens); default: \"<｜User｜>\" in the text is one id"},
  {ST_OPT_DECODE, NULL, "ids → text"},
  {ST_OPT_SKIP_SPECIAL, NULL, "decode: leave out special tokens (BOS, EOS, ...)"},
  {0}};

static const st_cmd_spec tokenize_spec = {
  "tokenize",
  "sparsetrace tokenize --model DIR [--json] [--no-special] [--split-special]\n"
  "       sparsetrace tokenize --model DIR --decode [--json] [--skip-special]\n",
  "Reads UTF-8 text on standard input and prints its token ids; with --decode reads a JSON\n"
  "array of ids and prints the text they stand for.\n"
  "\n"
  "DIR holds tokenizer.json (Hugging Face format, byte-level BPE) and optionally\n"
  "tokenizer_config.json; DIR may also be the path of a tokenizer.json file.\n",
  tokenize_options,
  "examples:\n"
  "  printf '<｜User｜>你好<｜Assistant｜>' | sparsetrace tokenize --model M --json\n"
  "  echo '[128803, 30594]' | sparsetrace tokenize --model M --decode\n"};

/* Reads all of stdin; NULL on allocation failure (message set). */
static char *read_all(FILE *f, size_t *len) {
  st_buf t = {0};
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) st_buf_add(&t, buf, n);
  if (st_buf_status(&t, "reading standard input")) {
    st_buf_free(&t);
    return NULL;
  }
  return st_buf_take(&t, len);
}

/* Decoded bytes may end inside a character; as JSON they go through U+FFFD like Python's
** bytes.decode(errors="replace") would show them. */
static void json_text(st_buf *out, const char *s, size_t n) {
  st_buf clean = {0};
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t need = p[i] < 0x80 ? 0 : p[i] >= 0xC2 && p[i] <= 0xDF ? 1 : p[i] >= 0xE0 && p[i] <= 0xEF ? 2
                : p[i] >= 0xF0 && p[i] <= 0xF4 ? 3 : 99;
    int ok = need != 99 && n - i > need;
    for (size_t k = 1; ok && k <= need; k++) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && need == 2) {
      unsigned cp = ((p[i] & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6);
      ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (ok && need == 3) {
      unsigned cp = ((p[i] & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12);
      ok = cp >= 0x10000 && cp <= 0x10FFFF;
    }
    if (ok) {
      st_buf_add(&clean, s + i, need + 1);
      i += need + 1;
    } else {
      st_buf_str(&clean, "\xEF\xBF\xBD");
      i++;
    }
  }
  st_pyjson_string(out, clean.data ? clean.data : "", clean.len, 0);
  st_buf_free(&clean);
}

static int do_encode(st_tokenizer *tok, int json, unsigned flags) {
  size_t len;
  char *text = read_all(stdin, &len);
  if (!text) return st_cli_report_error("tokenize");
  st_token_ids ids = {0};
  st_status st = st_tokenizer_encode(tok, text, len, flags, &ids);
  free(text);
  if (st) return st_cli_report_error("tokenize");
  st_buf out = {0};
  if (json) {
    st_buf_add(&out, "[", 1);
    for (size_t i = 0; i < ids.n; i++) st_buf_printf(&out, i ? ", %d" : "%d", ids.ids[i]);
    st_buf_add(&out, "]\n", 2);
  } else {
    for (size_t i = 0; i < ids.n; i++) {
      size_t blen = 0;
      const char *b = st_tokenizer_token_bytes(tok, ids.ids[i], &blen);
      st_buf_printf(&out, "%6zu %7d ", i, ids.ids[i]);
      json_text(&out, b, blen);
      st_buf_add(&out, "\n", 1);
    }
    st_buf_printf(&out, "%zu tokens\n", ids.n);
  }
  st_token_ids_free(&ids);
  if ((st = st_buf_status(&out, "tokenize"))) {
    st_buf_free(&out);
    return st_cli_report_error("tokenize");
  }
  fwrite(out.data, 1, out.len, stdout);
  st_buf_free(&out);
  return 0;
}

static int do_decode(st_tokenizer *tok, int json, unsigned flags) {
  size_t len;
  char *text = read_all(stdin, &len);
  if (!text) return st_cli_report_error("tokenize");
  json_error_t err;
  json_t *arr = json_loadb(text, len, 0, &err);
  free(text);
  if (!json_is_array(arr)) {
    if (arr) st_fail(ST_EINVAL, "--decode: standard input is not a JSON array of ids");
    else st_fail(ST_EINVAL, "--decode: standard input:%d:%d: %s", err.line, err.column, err.text);
    json_decref(arr);
    return st_cli_report_error("tokenize");
  }
  size_t n = json_array_size(arr);
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids) {
    json_decref(arr);
    st_fail(ST_ENOMEM, "--decode: out of memory");
    return st_cli_report_error("tokenize");
  }
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(arr, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
      free(ids);
      json_decref(arr);
      st_fail(ST_EINVAL, "--decode: element %zu of the array is not a token id", i);
      return st_cli_report_error("tokenize");
    }
    ids[i] = (int32_t)json_integer_value(v);
  }
  json_decref(arr);
  char *out = NULL;
  size_t out_len = 0;
  st_status st = st_tokenizer_decode(tok, ids, n, flags, &out, &out_len);
  free(ids);
  if (st) return st_cli_report_error("tokenize");
  if (json) {
    st_buf t = {0};
    json_text(&t, out, out_len);
    st_buf_add(&t, "\n", 1);
    if (!st_buf_status(&t, "tokenize")) fwrite(t.data, 1, t.len, stdout);
    st_buf_free(&t);
  } else {
    fwrite(out, 1, out_len, stdout);
  }
  free(out);
  return 0;
}

/* --model DIR, or the path of a tokenizer.json (its directory's config is used if present). */
int st_cli_open_tokenizer(const char *model, st_tokenizer **tok) {
  struct stat sb;
  if (stat(model, &sb) == 0 && S_ISREG(sb.st_mode)) {
    char *cfg = NULL;
    const char *slash = strrchr(model, '/');
    int dir_len = slash ? (int)(slash - model) : 1;
    if (asprintf(&cfg, "%.*s/tokenizer_config.json", dir_len, slash ? model : ".") < 0)
      return st_fail(ST_ENOMEM, "out of memory");
    st_status st = st_tokenizer_open_files(model, stat(cfg, &sb) == 0 ? cfg : NULL, tok);
    free(cfg);
    return st;
  }
  return st_tokenizer_open(model, tok);
}

int st_cmd_tokenize(int argc, char **argv) {
  int decode = 0, no_special = 0, split_special = 0, skip_special = 0, c;
  st_opts o;
  st_opts_init(&o, &tokenize_spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0) {
    switch (c) {
    case ST_OPT_DECODE: decode = 1; break;
    case ST_OPT_NO_SPECIAL: no_special = 1; break;
    case ST_OPT_SPLIT_SPECIAL: split_special = 1; break;
    case ST_OPT_SKIP_SPECIAL: skip_special = 1; break;
    default: st_opts_error(&o, "unexpected argument '%s' (text comes on standard input)", o.arg); c = ST_OPTS_EXIT;
    }
    if (c == ST_OPTS_EXIT) break;
  }
  const char *model = o.model;
  int json = o.json;
  st_opts_free(&o);
  if (c == ST_OPTS_EXIT) return o.exit_code;
  if (!model) {
    fprintf(stderr, "sparsetrace tokenize: --model is required\n(sparsetrace tokenize --help lists the options)\n");
    return 2;
  }
  st_tokenizer *tok = NULL;
  if (st_cli_open_tokenizer(model, &tok)) return st_cli_report_error("tokenize");
  int rc = decode ? do_decode(tok, json, skip_special ? ST_TOK_SKIP_SPECIAL : 0)
                  : do_encode(tok, json, (no_special ? 0 : ST_TOK_ADD_SPECIAL) |
                                             (split_special ? ST_TOK_SPLIT_SPECIAL : 0));
  st_tokenizer_close(tok);
  return rc;
}
