/*
** needle_prompt.c — the needle harness's request generator (needle_prompt.h).
**
** The request is built from a format-neutral model: system lines, the chosen tools, the user's
** task, rounds (one tool call and its output each), an assistant summary and the question. Every
** text that can carry the needle is a "unit" of lines; a slot is (unit, line) = "insert the
** needle line before that line". Units are listed in the order the rendered prompt shows them
** (system, tools, messages; ATOM's profile puts the tools first), so the needle's offset grows
** with the slot index and the slot nearest to the requested fraction is found by bisection.
**
** Sizing: filler is counted in output lines F spread over the rounds (turn i holds up to c_i
** lines, drawn from the seed; the last turn used is cut short). The prompt grows with F, so F
** is found by doubling and bisection on the measured size, with the needle parked at the end of
** the system text; then the needle is moved to its slot and the result measured again.
** Content of turn i depends only on (seed, i), never on F, so sizes nest.
*/
#define _GNU_SOURCE
#include "needle_prompt.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "needle/needle_corpus.h"
#include "engine/text/pyjson.h"

/* ---------------------------------------------------------------- names */

static const char *const kind_names[] = {"path", "host", "key", "number", "ticket", "branch",
                                         "url", "email", "commit", "env", "random", "assorted", "vocab"};
static const char *const format_names[] = {"anthropic", "openai-chat", "openai-responses"};

const char *st_needle_kind_name(st_needle_kind k) {
  return k >= 0 && k < ST_NEEDLE_KIND_COUNT ? kind_names[k] : "?";
}

const char *st_needle_kind_list(char *buf, size_t size, int with_opt_in) {
  size_t n = 0;
  if (size) buf[0] = 0;
  for (int i = 0; i < ST_NEEDLE_KIND_COUNT; i++) {
    if (!with_opt_in && st_needle_opt_in_kind((st_needle_kind)i)) continue;
    int k = snprintf(buf + n, size - n, "%s%s", n ? ", " : "", kind_names[i]);
    if (k < 0 || (size_t)k >= size - n) break;
    n += (size_t)k;
  }
  return buf;
}

st_status st_needle_kind_parse(const char *name, st_needle_kind *out) {
  for (int i = 0; i < ST_NEEDLE_KIND_COUNT; i++)
    if (!strcmp(name, kind_names[i])) return *out = (st_needle_kind)i, ST_OK;
  char list[160];
  return st_fail(ST_EINVAL, "needle kind \"%s\": expected one of %s", name, st_needle_kind_list(list, sizeof list, 1));
}

int st_needle_heldout_kind(st_needle_kind k) { return k == ST_NEEDLE_EMAIL || k == ST_NEEDLE_ENV; }
int st_needle_heldout_family(int family) { return family == 5 || family == 6; }
int st_needle_opt_in_kind(st_needle_kind k) { return k == ST_NEEDLE_ASSORTED || k == ST_NEEDLE_VOCAB; }

static const char *const shape_names[] = {"agent", "toollist"};

const char *st_needle_shape_name(st_needle_shape s) {
  return s >= 0 && s < ST_NEEDLE_SHAPE_COUNT ? shape_names[s] : "?";
}

st_status st_needle_shape_parse(const char *name, st_needle_shape *out) {
  for (int i = 0; i < ST_NEEDLE_SHAPE_COUNT; i++)
    if (!strcmp(name, shape_names[i])) return *out = (st_needle_shape)i, ST_OK;
  return st_fail(ST_EINVAL, "request shape \"%s\": expected agent or toollist", name);
}

const char *st_needle_format_name(st_needle_format f) {
  return f >= 0 && f < ST_NEEDLE_FORMAT_COUNT ? format_names[f] : "?";
}

st_status st_needle_format_parse(const char *name, st_needle_format *out) {
  for (int i = 0; i < ST_NEEDLE_FORMAT_COUNT; i++)
    if (!strcmp(name, format_names[i])) return *out = (st_needle_format)i, ST_OK;
  if (!strcmp(name, "openai") || !strcmp(name, "chat")) return *out = ST_NEEDLE_OPENAI_CHAT, ST_OK;
  if (!strcmp(name, "responses")) return *out = ST_NEEDLE_OPENAI_RESPONSES, ST_OK;
  return st_fail(ST_EINVAL, "request format \"%s\": expected anthropic, openai-chat or openai-responses", name);
}

void st_needle_spec_default(st_needle_spec *s) {
  memset(s, 0, sizeof *s);
  s->tokens = 2048;
  s->position = 0.5;
  s->seed = 1;
  s->kind = ST_NEEDLE_PATH;
  s->format = ST_NEEDLE_ANTHROPIC;
  st_chat_options_default(&s->render);
  s->thinking = -1;
  s->family = -1;
}

/* ---------------------------------------------------------------- random numbers */

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

typedef struct rng {
  uint64_t s;
} rng;

/* An independent stream per (seed, purpose, index). */
static rng rng_for(uint64_t seed, uint64_t tag, uint64_t index) {
  rng r = {mix64(mix64(seed + 0x9E3779B97F4A7C15ull) ^ mix64(tag * 0x100000001B3ull + index + 1))};
  return r;
}

static uint64_t rng_u64(rng *r) {
  r->s += 0x9E3779B97F4A7C15ull;
  return mix64(r->s);
}

static int rng_int(rng *r, int n) { return n > 0 ? (int)(rng_u64(r) % (uint64_t)n) : 0; }
static int rng_range(rng *r, int lo, int hi) { return lo + rng_int(r, hi - lo + 1); }
static const char *pick(rng *r, const char *const *list, int n) { return list[rng_int(r, n)]; }

#define PICK(r, list) pick(r, list, list##_n)

enum { TAG_NEEDLE = 1, TAG_STRUCT, TAG_ROUND, TAG_TOOLS, TAG_IDS, TAG_TEXT, TAG_POOL, TAG_DECOY, TAG_DECOY_SLOTS, TAG_QUESTION, TAG_LABEL };

/* ---------------------------------------------------------------- lines */

typedef struct lines {
  char **v;
  int n, cap;
} lines;

static _Thread_local int oom_flag; /* set by an allocation failure while building; checked by st_needle_make */

static void lines_push(lines *L, char *s) {
  if (!s) { oom_flag = 1; return; }
  if (L->n == L->cap) {
    int cap = L->cap ? 2 * L->cap : 16;
    char **v = realloc(L->v, sizeof(char *) * (size_t)cap);
    if (!v) { free(s); oom_flag = 1; return; }
    L->v = v;
    L->cap = cap;
  }
  L->v[L->n++] = s;
}

static void addf(lines *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(lines *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  lines_push(L, s);
}

static void lines_free(lines *L) {
  for (int i = 0; i < L->n; i++) free(L->v[i]);
  free(L->v);
  memset(L, 0, sizeof *L);
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  if (!s) oom_flag = 1;
  return s;
}

static void capitalise(char *dst, size_t size, const char *s) {
  snprintf(dst, size, "%s", s);
  if (dst[0]) dst[0] = (char)toupper((unsigned char)dst[0]);
}

/* ---------------------------------------------------------------- the model of a request */

typedef enum artifact {
  ART_PY_FILE, ART_GREP, ART_PYTEST, ART_LISTING, ART_GIT_LOG, ART_BUILD_LOG, ART_TS_FILE, ART_COUNT
} artifact;

typedef struct turn {
  const char *tool;  /* tool called (NULL: no tools in the request; the user runs it) */
  json_t *input;     /* the call's arguments (owned) */
  char *shell;       /* the same as a shell command */
  char *thought;     /* what the assistant says before the call */
  lines out;         /* the output, all c_i lines */
  char call_id[40];
} turn;

typedef struct gen {
  const st_needle_spec *spec;
  uint64_t seed;
  char label[64], value[ST_NEEDLE_VALUE_MAX], line[ST_NEEDLE_LINE_MAX];
  int shape; /* ST_NEEDLE_ASSORTED's value shape, the needle's and its decoys' */
  char *question;
  int family; /* the question's template family */
  lines system;
  int tools[64];     /* indices into st_nc_tools, request order */
  int n_tools;
  char *task;
  char *summary;
  turn *rounds;
  int n_rounds, cap_rounds;
  int64_t round_lines; /* lines held by the generated rounds */
  /* shape toollist: the system text is base's head, F one-line tool descriptions from pool with
  ** base's environment section in the middle, then base's rules; system then borrows its strings */
  lines base, pool;
  int64_t system_F;    /* F the borrowed system was built for (-1: none yet) */
  char module[32], project[48];
  /* decoys: their lines, and where they go (NULL: with the needle, just before it) */
  int n_decoys;
  char decoy_line[ST_NEEDLE_MAX_DECOYS][ST_NEEDLE_LINE_MAX];
  const struct slot *decoy_at[ST_NEEDLE_MAX_DECOYS];
} gen;

/* Units, in order of appearance in a reference rendering. */
typedef enum unit_kind { U_SYSTEM, U_TOOL, U_TASK, U_THOUGHT, U_OUTPUT, U_SUMMARY } unit_kind;

typedef struct slot {
  unit_kind kind;
  int index; /* tool or turn */
  int line;  /* insert before this line (n = at the end) */
} slot;

static int has_tool(const gen *g, const char *name) {
  for (int i = 0; i < g->n_tools; i++)
    if (!strcmp(st_nc_tools[g->tools[i]].name, name)) return 1;
  return 0;
}

/* ---------------------------------------------------------------- the needle */

/* ST_NEEDLE_ASSORTED: a value of one of its 16 shapes (shape < 0: one drawn from r), under the
** shape's own label; returns the shape. None is an address with '@' or a NAME=VALUE assignment
** (the held-out kinds', email and env), and no label is another kind's. */
#define ASSORTED_SHAPES 16
static int assorted_value(int shape, rng *r, char *label, size_t label_size, char *value, size_t value_size) {
  static const char hex[] = "0123456789abcdef";
  static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char h[48];
  const char *a = PICK(r, st_nc_words), *m = PICK(r, st_nc_modules), *n = PICK(r, st_nc_nouns),
             *j = PICK(r, st_nc_adjs);
  if (shape < 0 || shape >= ASSORTED_SHAPES) shape = rng_int(r, ASSORTED_SHAPES);
  switch (shape) {
  case 0:
    snprintf(label, label_size, "Build version");
    snprintf(value, value_size, "v%d.%d.%d-rc.%d+build.%d", rng_range(r, 0, 19), rng_range(r, 0, 40),
             rng_range(r, 0, 99), rng_range(r, 1, 12), rng_range(r, 100, 99999));
    break;
  case 1:
    snprintf(label, label_size, "Service address");
    snprintf(value, value_size, "10.%d.%d.%d:%d", rng_range(r, 0, 255), rng_range(r, 0, 255), rng_range(r, 1, 254),
             rng_range(r, 1024, 65535));
    break;
  case 2:
    for (int i = 0; i < 32; i++) h[i] = hex[rng_int(r, 16)];
    snprintf(label, label_size, "Request id");
    snprintf(value, value_size, "%.8s-%.4s-4%.3s-%c%.3s-%.12s", h, h + 8, h + 12, "89ab"[rng_int(r, 4)], h + 15, h + 18);
    break;
  case 3:
    snprintf(label, label_size, "Cutover time");
    snprintf(value, value_size, "20%02d-%02d-%02dT%02d:%02d:%02dZ", rng_range(r, 24, 29), rng_range(r, 1, 12),
             rng_range(r, 1, 28), rng_range(r, 0, 23), rng_range(r, 0, 59), rng_range(r, 0, 59));
    break;
  case 4:
    snprintf(label, label_size, "Base image");
    snprintf(value, value_size, "ghcr.io/%s/%s:%d.%d.%d", a, m, rng_range(r, 0, 9), rng_range(r, 0, 30), rng_range(r, 0, 99));
    break;
  case 5:
    snprintf(label, label_size, "Bucket ARN");
    snprintf(value, value_size, "arn:aws:s3:::%s-%s-%04x", a, n, (unsigned)(rng_u64(r) & 0xffff));
    break;
  case 6:
    snprintf(label, label_size, "Escalation phone");
    snprintf(value, value_size, "+%d %d %04d %04d", rng_range(r, 30, 49), rng_range(r, 10, 99), rng_range(r, 0, 9999),
             rng_range(r, 0, 9999));
    break;
  case 7:
    for (int i = 0; i < 12; i++) h[i] = hex[rng_int(r, 16)];
    snprintf(label, label_size, "Device MAC");
    snprintf(value, value_size, "%.2s:%.2s:%.2s:%.2s:%.2s:%.2s", h, h + 2, h + 4, h + 6, h + 8, h + 10);
    break;
  case 8:
    snprintf(label, label_size, "Cleanup schedule");
    snprintf(value, value_size, "%d %d * * %d-%d", rng_range(r, 0, 59), rng_range(r, 0, 23), rng_range(r, 0, 2),
             rng_range(r, 4, 6));
    break;
  case 9:
    snprintf(label, label_size, "Config key");
    snprintf(value, value_size, "%s.%s.%s_%s", m, n, j, PICK(r, st_nc_nouns));
    break;
  case 10:
    snprintf(label, label_size, "Feature flag");
    snprintf(value, value_size, "%s_%s_%s_%d", j, m, n, rng_range(r, 2, 999));
    break;
  case 11: {
    char c[3][32];
    const char *parts[3] = {a, n, j};
    for (int i = 0; i < 3; i++) { /* capitalised, underscores dropped */
      char *o = c[i];
      for (const char *p = parts[i]; *p && o < c[i] + sizeof c[i] - 1; p++)
        if (*p != '_') {
          *o = o == c[i] ? (char)toupper((unsigned char)*p) : *p;
          o++;
        }
      *o = 0;
    }
    snprintf(label, label_size, "Handler class");
    snprintf(value, value_size, "%s%s%sHandler%d", c[0], c[1], c[2], rng_range(r, 2, 99));
    break;
  }
  case 12:
    snprintf(label, label_size, "Export path");
    snprintf(value, value_size, "s3://%s-%s/%s/20%02d/%02d/part-%05d.parquet", a, m, n, rng_range(r, 24, 29),
             rng_range(r, 1, 12), rng_range(r, 0, 99999));
    break;
  case 13:
    snprintf(label, label_size, "Budget cap");
    snprintf(value, value_size, "EUR %d,%03d.%02d", rng_range(r, 1, 999), rng_range(r, 0, 999), rng_range(r, 0, 99));
    break;
  case 14:
    snprintf(label, label_size, "Site coordinates");
    snprintf(value, value_size, "%d.%04dN, %d.%04dE", rng_range(r, 0, 89), rng_range(r, 0, 9999), rng_range(r, 0, 179),
             rng_range(r, 0, 9999));
    break;
  default:
    for (int i = 0; i < 43; i++) h[i] = b64[rng_int(r, 64)];
    snprintf(label, label_size, "Signing fingerprint");
    snprintf(value, value_size, "SHA256:%.43s", h);
    break;
  }
  return shape;
}

/* ST_NEEDLE_VOCAB: tokens drawn uniformly from tok's vocabulary (no added or special token). A
** copy is only as good as the tokens a model was trained to copy: a token that no training
** needle held is copied wrong nearly always, whatever the kind around it
** (bench/needle-train-results.md, "eleventh session"). This kind makes every token of the
** vocabulary a needle's, in labels and values. */
static int32_t vocab_token(const st_tokenizer *tok, rng *r, int word) {
  int32_t n = (int32_t)st_tokenizer_vocab_size(tok);
  for (int tries = 0; tries < 10000; tries++) {
    int32_t id = (int32_t)rng_int(r, (int)n);
    size_t len = 0;
    const char *b = st_tokenizer_token_bytes(tok, id, &len);
    if (!b || !len || st_tokenizer_is_added(tok, id)) continue;
    size_t i = word && b[0] == ' ' ? 1 : 0, letters = 0;
    int ok = len > i;
    for (; ok && i < len; i++) {
      unsigned char c = (unsigned char)b[i];
      if (word) ok = isalpha(c) || (c == '-' && letters), letters += isalpha(c) != 0; /* starts with a letter */
      else ok = c > ' ' && c < 0x7f && c != '"' && c != '\\' && c != '`';
    }
    if (ok && (!word || letters >= 2)) return id;
  }
  return -1;
}

/* Appends token id's bytes to buf (holding *n bytes); 0 when they do not fit. */
static int append_token(const st_tokenizer *tok, int32_t id, int drop_space, char *buf, size_t size, size_t *n) {
  size_t len = 0;
  const char *b = id < 0 ? NULL : st_tokenizer_token_bytes(tok, id, &len);
  if (!b) return 0; /* no token drawn (vocab_token's -1), or none with that id */
  if (drop_space && len && b[0] == ' ') b++, len--;
  if (*n + len + 1 > size) return 0;
  memcpy(buf + *n, b, len);
  buf[*n += len] = 0;
  return 1;
}

/* Its label: two or three word tokens as they join ("Mosaic" + " con" + "act": "Mosaic conact"),
** the first one's space dropped and its letter capitalised; never a held-out kind's label (C or
** Python). Its value: printable tokens with no space, quote, backslash or backtick, 6 to 14 of
** them in at most 96 bytes, or count[0] to count[1] of them in as many bytes as value holds when
** count[0] is set (st_needle_spec.vocab_tokens). */
static void vocab_value(const st_tokenizer *tok, const int count[2], rng *r, char *label, size_t label_size,
                        char *value, size_t value_size) {
  static const char *const held_out[] = {"on-call contact", "environment variable", "branch"};
  for (int tries = 0;; tries++) {
    size_t n = 0;
    label[0] = 0;
    for (int p = 0, parts = rng_range(r, 2, 3); p < parts; p++)
      if (!append_token(tok, vocab_token(tok, r, 1), p == 0, label, label_size, &n)) break;
    char lower[64];
    snprintf(lower, sizeof lower, "%s", label);
    for (char *c = lower; *c; c++) *c = (char)tolower((unsigned char)*c);
    int clash = !n;
    for (size_t h = 0; h < sizeof held_out / sizeof *held_out; h++) clash |= strstr(lower, held_out[h]) != NULL;
    if (!clash || tries == 100) break;
  }
  label[0] = (char)toupper((unsigned char)label[0]);
  size_t n = 0, size = count[0] || value_size < 97 ? value_size : 97;
  value[0] = 0;
  for (int t = 0, tokens = count[0] ? rng_range(r, count[0], count[1]) : rng_range(r, 6, 14); t < tokens; t++)
    if (!append_token(tok, vocab_token(tok, r, 0), 0, value, size, &n)) break;
}

/* A label and a value of spec's kind, drawn from r (the needle's, or a decoy's stream); ST_NEEDLE_ASSORTED
** in *shape (< 0: drawn, and stored there), so that a decoy takes its needle's shape. */
static void kind_value(const st_needle_spec *spec, int *shape, rng *rp, char *label, size_t label_size, char *value,
                       size_t value_size) {
  st_needle_kind kind = spec->kind;
  rng r = *rp;
  static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  switch (kind) {
  case ST_NEEDLE_PATH: {
    const char *a = PICK(&r, st_nc_words), *b = PICK(&r, st_nc_words), *m = PICK(&r, st_nc_modules);
    snprintf(label, label_size, "Working directory");
    snprintf(value, value_size, "/home/dev/projects/%s-%s-%04x/services/%s", a, b,
             (unsigned)(rng_u64(&r) & 0xffff), m);
    break;
  }
  case ST_NEEDLE_HOST: {
    const char *a = PICK(&r, st_nc_words), *b = PICK(&r, st_nc_words), *reg = PICK(&r, st_nc_regions);
    snprintf(label, label_size, "Primary database host");
    snprintf(value, value_size, "pg-%s-%02d.%s.internal.%s-%03x.net", a, rng_range(&r, 1, 99), reg, b,
             (unsigned)(rng_u64(&r) & 0xfff));
    break;
  }
  case ST_NEEDLE_KEY: {
    char key[33];
    for (int i = 0; i < 32; i++) key[i] = alnum[rng_int(&r, 62)];
    key[32] = 0;
    snprintf(label, label_size, "Deploy API key");
    snprintf(value, value_size, "sk-live-%s", key);
    break;
  }
  case ST_NEEDLE_TICKET: {
    char proj[5];
    for (int i = 0; i < 4; i++) proj[i] = (char)('A' + rng_int(&r, 26));
    proj[rng_range(&r, 2, 4)] = 0;
    snprintf(label, label_size, "Tracking ticket");
    snprintf(value, value_size, "%s-%d", proj, rng_range(&r, 10, 99999));
    break;
  }
  case ST_NEEDLE_BRANCH: {
    const char *a = PICK(&r, st_nc_words), *b = PICK(&r, st_nc_nouns);
    snprintf(label, label_size, "Release branch");
    snprintf(value, value_size, "release/%s-%s-%d.%d", a, b, rng_range(&r, 1, 9), rng_range(&r, 0, 40));
    break;
  }
  case ST_NEEDLE_URL: {
    const char *a = PICK(&r, st_nc_words), *b = PICK(&r, st_nc_modules), *c = PICK(&r, st_nc_nouns);
    snprintf(label, label_size, "Artifact URL");
    snprintf(value, value_size, "https://artifacts.%s.dev/%s/%s-%04x.tar.gz?build=%d", a, b, c,
             (unsigned)(rng_u64(&r) & 0xffff), rng_range(&r, 100, 99999));
    break;
  }
  case ST_NEEDLE_EMAIL: {
    const char *a = PICK(&r, st_nc_people), *b = PICK(&r, st_nc_words);
    char user[48];
    snprintf(user, sizeof user, "%s", a);
    for (char *p = user; *p; p++) *p = *p == ' ' ? '.' : (char)tolower((unsigned char)*p);
    snprintf(label, label_size, "On-call contact");
    snprintf(value, value_size, "%s%d@%s-ops.example.org", user, rng_range(&r, 1, 99), b);
    break;
  }
  case ST_NEEDLE_COMMIT: {
    static const char hex[] = "0123456789abcdef";
    char h[41];
    for (int i = 0; i < 40; i++) h[i] = hex[rng_int(&r, 16)];
    h[40] = 0;
    snprintf(label, label_size, "Pinned commit");
    snprintf(value, value_size, "%s", h);
    break;
  }
  case ST_NEEDLE_ENV: {
    char name[48], val[20];
    snprintf(name, sizeof name, "%s_%s_%s", PICK(&r, st_nc_modules), PICK(&r, st_nc_nouns), PICK(&r, st_nc_adjs));
    for (char *p = name; *p; p++) *p = isalnum((unsigned char)*p) ? (char)toupper((unsigned char)*p) : '_';
    for (int i = 0; i < 12; i++) val[i] = alnum[rng_int(&r, 62)];
    val[12] = 0;
    snprintf(label, label_size, "Environment variable");
    snprintf(value, value_size, "%s=%s", name, val);
    break;
  }
  case ST_NEEDLE_ASSORTED:
    *shape = assorted_value(*shape, &r, label, label_size, value, value_size);
    break;
  case ST_NEEDLE_VOCAB: /* st_needle_make refuses it without a tokenizer */
    vocab_value(spec->tok, spec->vocab_tokens, &r, label, label_size, value, value_size);
    break;
  case ST_NEEDLE_RANDOM: {
    static const char printable[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&*+-./:;<=>?@^_~";
    char t[25];
    for (int i = 0; i < 24; i++) t[i] = printable[rng_int(&r, (int)sizeof printable - 1)];
    t[24] = 0;
    snprintf(label, label_size, "Session token");
    snprintf(value, value_size, "%s", t);
    break;
  }
  default: {
    char num[15];
    num[0] = (char)('1' + rng_int(&r, 9));
    for (int i = 1; i < 14; i++) num[i] = (char)('0' + rng_int(&r, 10));
    num[14] = 0;
    snprintf(label, label_size, "Incident ticket number");
    snprintf(value, value_size, "%s", num);
    break;
  }
  }
  *rp = r;
}

/* A made-up label (st_needle_spec.open_label) of one to three parts: one is a made-up word
** (onset, vowel, coda syllables) or, one time in three, an acronym; the others are made-up words
** too or words of the corpus's lists. No list holds the label, so none of the kinds' own labels
** (held-out kinds' included) can come out. */
static void open_label(uint64_t seed, st_needle_kind kind, char *label, size_t size) {
  static const char *const onsets[] = {"b", "br", "c", "d", "dr", "f", "g", "gl", "h", "k", "l", "m",
                                       "n", "p", "pr", "r", "s", "st", "t", "tr", "v", "w", "z"};
  static const char *const vowels[] = {"a", "e", "i", "o", "u", "ai", "ou", "ea"};
  static const char *const codas[] = {"", "", "", "n", "r", "l", "s", "x", "nd", "k", "m"};
  enum { onsets_n = sizeof onsets / sizeof *onsets, vowels_n = sizeof vowels / sizeof *vowels,
         codas_n = sizeof codas / sizeof *codas };
  rng r = rng_for(seed, TAG_LABEL, (uint64_t)kind);
  int parts = 1 + rng_int(&r, 3), made = rng_int(&r, parts);
  size_t n = 0;
  label[0] = 0;
  for (int p = 0; p < parts && n + 1 < size; p++) {
    char w[40] = "";
    int form = p == made ? rng_int(&r, 3) : 1 + rng_int(&r, 4); /* 0: acronym; 1, 2: made up; 3, 4: a list's */
    if (form == 0) {
      int len = rng_range(&r, 2, 4);
      for (int i = 0; i < len; i++) w[i] = (char)('A' + rng_int(&r, 26));
      w[len] = 0;
    } else if (form <= 2) {
      int syllables = rng_range(&r, 2, 3);
      for (int i = 0; i < syllables; i++) {
        size_t m = strlen(w);
        snprintf(w + m, sizeof w - m, "%s%s", PICK(&r, onsets), PICK(&r, vowels));
      }
      size_t m = strlen(w);
      snprintf(w + m, sizeof w - m, "%s", PICK(&r, codas));
    } else {
      snprintf(w, sizeof w, "%s", form == 3 ? PICK(&r, st_nc_nouns) : PICK(&r, st_nc_words));
    }
    int k = snprintf(label + n, size - n, "%s%s", p ? " " : "", w);
    if (k < 0 || (size_t)k >= size - n) break;
    n += (size_t)k;
  }
  label[0] = (char)toupper((unsigned char)label[0]);
}

/* Decoy i's line: the needle's label, another value of its kind (of its shape), unlike the needle's and the
** earlier decoys' (neither holds the other: the needle's value must occur once in the prompt). */
static void make_decoy(gen *g, int i) {
  rng r = rng_for(g->seed, TAG_DECOY, (uint64_t)g->spec->kind * ST_NEEDLE_MAX_DECOYS + (uint64_t)i);
  char label[64], value[ST_NEEDLE_VALUE_MAX];
  for (int tries = 0;; tries++) {
    kind_value(g->spec, &g->shape, &r, label, sizeof label, value, sizeof value);
    int clash = strstr(value, g->value) || strstr(g->value, value);
    for (int j = 0; j < i && !clash; j++) {
      const char *v = g->decoy_line[j] + strlen(g->label) + 2;
      clash = strstr(value, v) || strstr(v, value);
    }
    if (!clash || tries == 100) break;
  }
  snprintf(g->decoy_line[i], sizeof g->decoy_line[i], "%s: %s", g->label, value);
}

/* A question composed from parts (ST_NEEDLE_FAMILY_COMPOSED): an opener, an ask three times in
** four, the line wanted with its manner and ending; with decoys, the asks and lines of the most
** recent one. Its own stream, so the rest of the request is drawn as for any family. */
static char *composed_question(gen *g, const char *lower) {
  rng r = rng_for(g->seed, TAG_QUESTION, (uint64_t)g->spec->kind);
  int last = g->n_decoys > 0;
  const char *opener = PICK(&r, st_nc_ask_openers);
  char *ask = NULL;
  if (rng_int(&r, 4) < 3)
    ask = xasprintf(last ? PICK(&r, st_nc_ask_last) : PICK(&r, st_nc_ask_what), lower, PICK(&r, st_nc_ask_wheres));
  char *line = xasprintf(last ? PICK(&r, st_nc_ask_line_last) : PICK(&r, st_nc_ask_line), g->label);
  const char *manner = PICK(&r, st_nc_ask_manners), *end = PICK(&r, st_nc_ask_ends);
  char *q = line ? xasprintf("%s%s%s%s%s%s%s", opener, *opener ? " " : "", ask ? ask : "", ask ? " " : "", line,
                             manner, end)
                 : NULL;
  free(ask);
  free(line);
  return q;
}

static void make_needle(gen *g) {
  rng r = rng_for(g->seed, TAG_NEEDLE, (uint64_t)g->spec->kind);
  g->shape = -1;
  kind_value(g->spec, &g->shape, &r, g->label, sizeof g->label, g->value, sizeof g->value);
  if (g->spec->open_label) open_label(g->seed, g->spec->kind, g->label, sizeof g->label);
  snprintf(g->line, sizeof g->line, "%s: %s", g->label, g->value);
  char lower[64];
  snprintf(lower, sizeof lower, "%s", g->label);
  for (char *p = lower; *p; p++) *p = (char)tolower((unsigned char)*p);
  rng q = rng_for(g->seed, TAG_TEXT, 1);
  int fam = g->spec->family;
  int composed = fam == ST_NEEDLE_FAMILY_COMPOSED;
  if (!composed && (fam < 0 || fam >= ST_NEEDLE_FAMILY_COUNT)) fam = rng_int(&q, st_nc_questions_n); /* as PICK did */
  g->family = fam;
  const char *tmpl = composed                 ? NULL
                     : fam < st_nc_questions_n ? st_nc_questions[fam]
                                               : st_nc_questions_more[fam - st_nc_questions_n];
  g->n_decoys = g->spec->decoys < 0 ? 0 : g->spec->decoys > ST_NEEDLE_MAX_DECOYS ? ST_NEEDLE_MAX_DECOYS : g->spec->decoys;
  if (g->n_decoys && !composed) { /* the last wording is the held-out families' */
    int n = st_nc_decoy_questions_n;
    tmpl = st_nc_decoy_questions[st_needle_heldout_family(fam) ? n - 1 : fam % (n - 1)];
  }
  for (int i = 0; i < g->n_decoys; i++) make_decoy(g, i);
  g->question = composed ? composed_question(g, lower) : xasprintf(tmpl, lower, g->label);
}

/* ---------------------------------------------------------------- structure */

static size_t tool_bytes(int t) {
  return strlen(st_nc_tools[t].name) + strlen(st_nc_tools[t].description) + strlen(st_nc_tools[t].schema) + 60;
}

static st_status toollist_system(gen *g, int64_t F);

/* Tools and rules scale with the budget (bytes of rendered prompt the target stands for). */
static void make_structure(gen *g, double budget_bytes) {
  rng r = rng_for(g->seed, TAG_STRUCT, 0);
  snprintf(g->module, sizeof g->module, "%s", PICK(&r, st_nc_modules));
  snprintf(g->project, sizeof g->project, "%s-%s", PICK(&r, st_nc_words), PICK(&r, st_nc_words));

  /* tools: the core ones in order, then the others shuffled, while they fit in half the budget
  ** (the encoder's tools preamble, about 1.1 kB, counts once) */
  int order[64], n = st_nc_n_tools < 64 ? st_nc_n_tools : 64;
  for (int i = 0; i < n; i++) order[i] = i;
  rng tr = rng_for(g->seed, TAG_TOOLS, 0);
  for (int i = n - 1; i > ST_NC_CORE_TOOLS; i--) {
    int j = ST_NC_CORE_TOOLS + rng_int(&tr, i - ST_NC_CORE_TOOLS + 1);
    int t = order[i]; order[i] = order[j]; order[j] = t;
  }
  double used = 1100;
  g->n_tools = 0;
  for (int i = 0; i < n; i++) {
    used += (double)tool_bytes(order[i]);
    if (used > 0.50 * budget_bytes) break;
    g->tools[g->n_tools++] = order[i];
  }

  /* system prompt: intro, rules (about 8% of the budget, 1 at least), environment */
  lines *S = &g->system;
  addf(S, "%s", PICK(&r, st_nc_intros));
  addf(S, "%s", "");
  addf(S, "# Rules");
  int n_rules = (int)(0.08 * budget_bytes / 95.0);
  if (n_rules < 1) n_rules = 1;
  if (n_rules > st_nc_rules_n) n_rules = st_nc_rules_n;
  int first = rng_int(&r, st_nc_rules_n);
  for (int i = 0; i < n_rules; i++) addf(S, "%s", st_nc_rules[(first + i) % st_nc_rules_n]);
  addf(S, "%s", "");
  addf(S, "# Environment");
  addf(S, "Platform: linux");
  addf(S, "OS version: Linux 6.%d.0-%d-amd64", rng_range(&r, 1, 12), rng_range(&r, 10, 40));
  addf(S, "Shell: /bin/bash");
  addf(S, "Today's date: 2026-%02d-%02d", rng_range(&r, 1, 12), rng_range(&r, 1, 28));
  addf(S, "Git repository: yes (branch fix/%s-%s)", g->module, PICK(&r, st_nc_nouns));
  addf(S, "Project: %s (Python 3.11, PostgreSQL 16)", g->project);

  if (g->spec->shape == ST_NEEDLE_SHAPE_TOOLLIST) {
    g->n_tools = 0;
    g->base = g->system;
    memset(&g->system, 0, sizeof g->system);
    g->system_F = -1;
    toollist_system(g, 0);
  }

  rng t = rng_for(g->seed, TAG_TEXT, 2);
  g->task = xasprintf(PICK(&t, st_nc_tasks), g->module);
  char fn[64], path[96];
  snprintf(fn, sizeof fn, "%s_%s", PICK(&t, st_nc_verbs), PICK(&t, st_nc_nouns));
  snprintf(path, sizeof path, "src/%s/%s.py:%d", g->module, PICK(&t, st_nc_nouns), rng_range(&t, 20, 400));
  g->summary = xasprintf(PICK(&t, st_nc_summaries), fn, path);
}

/* ---------------------------------------------------------------- filler artifacts */

static void py_function(rng *r, lines *L, const char *ind) {
  const char *v = PICK(r, st_nc_verbs), *n = PICK(r, st_nc_nouns), *n2 = PICK(r, st_nc_nouns);
  const char *a = PICK(r, st_nc_adjs), *t = PICK(r, st_nc_types), *e = PICK(r, st_nc_errors);
  char V[32];
  capitalise(V, sizeof V, v);
  addf(L, "%sdef %s_%s(self, %s_id: int, *, %s: bool = False) -> %s:", ind, v, n, n, a, t);
  addf(L, "%s    \"\"\"%s the %s %s and return its %s.\"\"\"", ind, V, a, n, n2);
  addf(L, "%s    %s = self._%ss.get(%s_id)", ind, n, n, n);
  addf(L, "%s    if %s is None:", ind, n);
  addf(L, "%s        raise %s(f\"unknown %s: {%s_id}\")", ind, e, n, n);
  int extra = rng_range(r, 1, 4);
  for (int k = 0; k < extra; k++) {
    const char *v2 = PICK(r, st_nc_verbs), *n3 = PICK(r, st_nc_nouns);
    switch (rng_int(r, 6)) {
    case 0: addf(L, "%s    %s = %s.%s(%s=%s)", ind, n2, n, v2, a, a); break;
    case 1: addf(L, "%s    logger.debug(\"%s %%s -> %%s\", %s_id, %s)", ind, v, n, n2); break;
    case 2:
      addf(L, "%s    for %s in %s.%ss:", ind, n3, n, n3);
      addf(L, "%s        %s.%s()", ind, n3, v2);
      break;
    case 3:
      addf(L, "%s    if not %s.%s:", ind, n, a);
      addf(L, "%s        return %s", ind, rng_int(r, 2) ? "None" : "[]");
      break;
    case 4:
      addf(L, "%s    with self._lock:", ind);
      addf(L, "%s        self._%ss[%s_id] = %s", ind, n, n, n);
      break;
    default: addf(L, "%s    self._%s_count += %d", ind, v2, rng_range(r, 1, 3)); break;
    }
  }
  addf(L, "%s    return %s", ind, n2);
  addf(L, "%s", "");
}

static void gen_py_file(gen *g, rng *r, lines *out, int want, const char *path) {
  lines L = {0};
  const char *m = g->module;
  addf(&L, "\"\"\"%s: %s %s handling for the %s service.\"\"\"", path, PICK(r, st_nc_adjs), PICK(r, st_nc_nouns), m);
  addf(&L, "%s", "");
  addf(&L, "from __future__ import annotations");
  addf(&L, "%s", "");
  addf(&L, "import logging");
  addf(&L, "import threading");
  addf(&L, "from typing import Any, Iterator, Optional");
  addf(&L, "%s", "");
  addf(&L, "from %s.models import %s", m, "Record, Session, Event");
  addf(&L, "from %s.errors import %s, %s", m, PICK(r, st_nc_errors), PICK(r, st_nc_errors));
  addf(&L, "%s", "");
  addf(&L, "logger = logging.getLogger(__name__)");
  addf(&L, "%s", "");
  addf(&L, "MAX_%sS = %d", PICK(r, st_nc_nouns), rng_range(r, 16, 4096));
  for (char *p = L.v[L.n - 1]; *p && *p != ' '; p++) *p = (char)toupper((unsigned char)*p);
  addf(&L, "%s", "");
  addf(&L, "%s", "");
  while (L.n < want) {
    char C[32], N[32];
    capitalise(C, sizeof C, PICK(r, st_nc_nouns));
    capitalise(N, sizeof N, PICK(r, st_nc_verbs));
    addf(&L, "class %s%ser:", C, N);
    addf(&L, "    def __init__(self, store: Any) -> None:");
    addf(&L, "        self._store = store");
    addf(&L, "        self._lock = threading.Lock()");
    addf(&L, "%s", "");
    int funcs = rng_range(r, 2, 5);
    for (int f = 0; f < funcs && L.n < want; f++) py_function(r, &L, "    ");
    addf(&L, "%s", "");
  }
  for (int i = 0; i < want && i < L.n; i++) addf(out, "%6d\t%s", i + 1, L.v[i]);
  lines_free(&L);
}

static void gen_ts_file(gen *g, rng *r, lines *out, int want) {
  lines L = {0};
  addf(&L, "import { db } from \"../db\";");
  addf(&L, "import { NotFoundError, ConflictError } from \"../errors\";");
  addf(&L, "import type { %sOptions } from \"./types\";", "Query");
  addf(&L, "%s", "");
  while (L.n < want) {
    const char *v = PICK(r, st_nc_verbs), *n = PICK(r, st_nc_nouns), *a = PICK(r, st_nc_adjs);
    char N[32];
    capitalise(N, sizeof N, n);
    addf(&L, "export async function %s%s(%sId: string, opts: QueryOptions = {}): Promise<%s> {", v, N, n, N);
    addf(&L, "  const %s = await db.%s.findUnique({ where: { id: %sId } });", n, n, n);
    addf(&L, "  if (!%s) throw new NotFoundError(`%s ${%sId} not found`);", n, n, n);
    if (rng_int(r, 2)) {
      addf(&L, "  if (%s.%s && !opts.force) {", n, a);
      addf(&L, "    throw new ConflictError(`%s ${%sId} is %s`);", n, n, a);
      addf(&L, "  }");
    }
    addf(&L, "  const updated = { ...%s, %sAt: new Date(), revision: %s.revision + 1 };", n, v, n);
    addf(&L, "  await db.%s.update({ where: { id: %sId }, data: updated });", n, n);
    addf(&L, "  return updated;");
    addf(&L, "}");
    addf(&L, "%s", "");
  }
  for (int i = 0; i < want && i < L.n; i++) addf(out, "%6d\t%s", i + 1, L.v[i]);
  lines_free(&L);
}

static void gen_grep(gen *g, rng *r, lines *out, int want, const char *pattern) {
  lines code = {0};
  while (out->n < want) {
    if (code.n == 0) py_function(r, &code, "    ");
    const char *file = PICK(r, st_nc_nouns);
    int ln = rng_range(r, 10, 900);
    for (int k = 0; k < code.n && out->n < want; k++)
      if (code.v[k][0] && rng_int(r, 3) == 0)
        addf(out, "src/%s/%s.py:%d:%s", rng_int(r, 3) ? g->module : PICK(r, st_nc_modules), file, ln + k, code.v[k]);
    lines_free(&code);
  }
  (void)pattern;
}

static void gen_pytest(gen *g, rng *r, lines *out, int want) {
  int total = want * 2 + 20, failed = 0;
  addf(out, "============================= test session starts ==============================");
  addf(out, "platform linux -- Python 3.11.9, pytest-8.2.1, pluggy-1.5.0");
  addf(out, "configfile: pyproject.toml");
  addf(out, "plugins: xdist-3.6.1, cov-5.0.0, timeout-2.3.1");
  addf(out, "collected %d items", total);
  addf(out, "%s", "");
  int done = 0;
  while (out->n < want) {
    const char *v = PICK(r, st_nc_verbs), *n = PICK(r, st_nc_nouns), *a = PICK(r, st_nc_adjs);
    done += rng_range(r, 1, 3);
    int pct = done * 100 / total > 99 ? 99 : done * 100 / total;
    int fail = rng_int(r, 9) == 0;
    failed += fail;
    addf(out, "tests/%s/test_%s.py::test_%s_%s_%s %s [%3d%%]", g->module, n, v, n, a, fail ? "FAILED" : "PASSED", pct);
    if (fail && out->n + 6 < want) {
      addf(out, "    def test_%s_%s_%s(client, %s_factory):", v, n, a, n);
      addf(out, "        %s = %s_factory(%s=True)", n, n, a);
      addf(out, ">       assert client.%s(%s.id).status == %d", v, n, rng_int(r, 2) ? 200 : 409);
      addf(out, "E       AssertionError: assert %d == %d", rng_int(r, 2) ? 500 : 404, 200);
      addf(out, "tests/%s/test_%s.py:%d: AssertionError", g->module, n, rng_range(r, 20, 300));
    }
  }
  (void)failed;
}

static void gen_listing(gen *g, rng *r, lines *out, int want) {
  static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  addf(out, "total %d", rng_range(r, 40, 900));
  while (out->n < want) {
    int dir = rng_int(r, 5) == 0;
    addf(out, "%s  %d dev dev %6d %s %2d %02d:%02d %s_%s%s", dir ? "drwxr-xr-x" : "-rw-r--r--", dir ? rng_range(r, 2, 9) : 1,
         dir ? 4096 : rng_range(r, 120, 64000), months[rng_int(r, 12)], rng_range(r, 1, 28), rng_range(r, 0, 23),
         rng_range(r, 0, 59), PICK(r, st_nc_nouns), PICK(r, st_nc_verbs), dir ? "" : rng_int(r, 4) ? ".py" : ".json");
  }
  (void)g;
}

static void gen_git_log(gen *g, rng *r, lines *out, int want) {
  static const char *const days[] = {"Mon", "Tue", "Wed", "Thu", "Fri"};
  static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun"};
  while (out->n < want) {
    char hex[41];
    for (int i = 0; i < 40; i++) hex[i] = "0123456789abcdef"[rng_int(r, 16)];
    hex[40] = 0;
    const char *who = PICK(r, st_nc_people);
    char first[32];
    snprintf(first, sizeof first, "%s", who);
    first[strcspn(first, " ")] = 0;
    for (char *p = first; *p; p++) *p = (char)tolower((unsigned char)*p);
    char V[32];
    capitalise(V, sizeof V, PICK(r, st_nc_verbs));
    addf(out, "commit %s", hex);
    addf(out, "Author: %s <%s@%s.dev>", who, first, g->project);
    addf(out, "Date:   %s %s %d %02d:%02d:%02d 2026 +0100", days[rng_int(r, 5)], months[rng_int(r, 6)],
         rng_range(r, 1, 28), rng_range(r, 7, 19), rng_range(r, 0, 59), rng_range(r, 0, 59));
    addf(out, "%s", "");
    addf(out, "    %s %s %s handling in %s", V, PICK(r, st_nc_adjs), PICK(r, st_nc_nouns), g->module);
    addf(out, "%s", "");
    int files = rng_range(r, 1, 3), ins = 0, del = 0;
    for (int f = 0; f < files; f++) {
      int a = rng_range(r, 1, 40), d = rng_range(r, 0, 20);
      ins += a, del += d;
      addf(out, " src/%s/%s.py | %d %.*s%.*s", g->module, PICK(r, st_nc_nouns), a + d, a > 20 ? 20 : a,
           "++++++++++++++++++++", d > 10 ? 10 : d, "----------");
    }
    addf(out, " %d file%s changed, %d insertions(+), %d deletions(-)", files, files > 1 ? "s" : "", ins, del);
    addf(out, "%s", "");
  }
}

static void gen_build_log(gen *g, rng *r, lines *out, int want) {
  int pct = 0;
  while (out->n < want) {
    const char *n = PICK(r, st_nc_nouns), *m = rng_int(r, 2) ? g->module : PICK(r, st_nc_modules);
    pct += rng_range(r, 0, 2);
    if (pct > 99) pct = 99;
    int k = rng_int(r, 8);
    if (k == 0) {
      const char *a = PICK(r, st_nc_adjs), *v = PICK(r, st_nc_verbs);
      int ln = rng_range(r, 20, 800), col = rng_range(r, 5, 30);
      addf(out, "native/%s/%s.c:%d:%d: warning: unused variable '%s_%s' [-Wunused-variable]", m, n, ln, col, a, n);
      addf(out, "  %d |     int %s_%s = %s_%s(ctx);", ln, a, n, v, n);
      addf(out, "      |         ^~~~~~~~");
    } else if (k == 1) {
      addf(out, "[%3d%%] Linking C static library lib%s.a", pct, m);
    } else {
      addf(out, "[%3d%%] Building C object native/%s/CMakeFiles/%s.dir/%s_%s.c.o", pct, m, m, n, PICK(r, st_nc_verbs));
    }
  }
}

/* Round i: which artifact, which tool, its output. Depends only on (seed, i) and the tools. */
static void make_turn(gen *g, int i, turn *rd) {
  memset(rd, 0, sizeof *rd);
  rng r = rng_for(g->seed, TAG_ROUND, (uint64_t)i);
  artifact a = (artifact)rng_int(&r, ART_COUNT);
  if (i == 0) a = ART_PY_FILE;
  int want = rng_range(&r, 24, 110);
  rng ids = rng_for(g->seed, TAG_IDS, (uint64_t)i);
  static const char b62[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  char id[25];
  for (int k = 0; k < 24; k++) id[k] = b62[rng_int(&ids, 62)];
  id[24] = 0;
  snprintf(rd->call_id, sizeof rd->call_id, "%s", id);
  char target[128];
  const char *n = PICK(&r, st_nc_nouns), *v = PICK(&r, st_nc_verbs);
  switch (a) {
  case ART_PY_FILE:
  case ART_TS_FILE: {
    if (a == ART_PY_FILE) snprintf(target, sizeof target, "src/%s/%s_%s.py", g->module, n, v);
    else snprintf(target, sizeof target, "web/src/%s/%s.ts", g->module, n);
    if (has_tool(g, "read_file")) {
      rd->tool = "read_file";
      rd->input = json_pack("{s:s}", "path", target);
    }
    rd->shell = xasprintf("cat -n %s", target);
    if (a == ART_PY_FILE) gen_py_file(g, &r, &rd->out, want, target);
    else gen_ts_file(g, &r, &rd->out, want);
    break;
  }
  case ART_GREP: {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "def %s_", v);
    snprintf(target, sizeof target, "where `%s` is defined", pattern);
    if (has_tool(g, "search_files")) {
      rd->tool = "search_files";
      rd->input = json_pack("{s:s, s:s, s:s, s:s}", "pattern", pattern, "path", "src", "glob", "*.py", "output_mode", "content");
    }
    rd->shell = xasprintf("rg -n '%s' src -g '*.py'", pattern);
    gen_grep(g, &r, &rd->out, want, pattern);
    break;
  }
  case ART_PYTEST: {
    char dir[64];
    snprintf(dir, sizeof dir, "tests/%s", g->module);
    snprintf(target, sizeof target, "what the tests in %s say", dir);
    if (has_tool(g, "run_tests")) {
      rd->tool = "run_tests";
      rd->input = json_pack("{s:[s], s:s, s:b}", "targets", dir, "framework", "pytest", "fail_fast", 0);
    }
    rd->shell = xasprintf("python -m pytest %s -v", dir);
    gen_pytest(g, &r, &rd->out, want);
    break;
  }
  case ART_LISTING: {
    char dir[64];
    snprintf(dir, sizeof dir, "src/%s", rng_int(&r, 2) ? g->module : PICK(&r, st_nc_modules));
    snprintf(target, sizeof target, "what is in %s", dir);
    if (has_tool(g, "list_directory")) {
      rd->tool = "list_directory";
      rd->input = json_pack("{s:s}", "path", dir);
    }
    rd->shell = xasprintf("ls -la %s", dir);
    gen_listing(g, &r, &rd->out, want);
    break;
  }
  case ART_GIT_LOG:
    snprintf(target, sizeof target, "the recent history of src/%s", g->module);
    rd->shell = xasprintf("git log --stat -n %d -- src/%s", want / 8 + 2, g->module);
    gen_git_log(g, &r, &rd->out, want);
    break;
  default:
    snprintf(target, sizeof target, "the output of the native build");
    rd->shell = xasprintf("cmake --build build -j8 2>&1 | tail -n %d", want);
    gen_build_log(g, &r, &rd->out, want);
    break;
  }
  if (!rd->tool && g->n_tools) { /* run_shell is always the first tool */
    rd->tool = "run_shell";
    rd->input = json_pack("{s:s, s:s}", "command", rd->shell, "description", "Inspect the repository");
  }
  while (rd->out.n > want) free(rd->out.v[--rd->out.n]);
  rd->thought = xasprintf(PICK(&r, st_nc_thoughts), target);
}

static void turn_free(turn *rd) {
  json_decref(rd->input);
  free(rd->shell);
  free(rd->thought);
  lines_free(&rd->out);
}

/* Generates rounds until they hold at least F lines. */
static st_status ensure_rounds(gen *g, int64_t F) {
  if (g->spec->shape == ST_NEEDLE_SHAPE_TOOLLIST) return toollist_system(g, F);
  while (g->round_lines < F) {
    if (g->n_rounds == g->cap_rounds) {
      int cap = g->cap_rounds ? 2 * g->cap_rounds : 16;
      turn *v = realloc(g->rounds, sizeof(turn) * (size_t)cap);
      if (!v) return st_fail(ST_ENOMEM, "needle prompt rounds");
      g->rounds = v;
      g->cap_rounds = cap;
    }
    turn *rd = &g->rounds[g->n_rounds];
    make_turn(g, g->n_rounds, rd);
    g->n_rounds++;
    g->round_lines += rd->out.n;
    if (oom_flag) return st_fail(ST_ENOMEM, "needle prompt filler");
  }
  return ST_OK;
}

/* One-line tool description number i of the toollist shape (depends on seed and i only). */
static void pool_line(gen *g, int64_t i) {
  rng r = rng_for(g->seed, TAG_POOL, (uint64_t)i);
  const char *v = PICK(&r, st_nc_verbs), *n = PICK(&r, st_nc_nouns), *a = PICK(&r, st_nc_adjs);
  const char *m = PICK(&r, st_nc_modules), *n2 = PICK(&r, st_nc_nouns);
  switch (rng_int(&r, 4)) {
  case 0: addf(&g->pool, "- %s_%s_%" PRId64 ": %s the %s %s records of the %s module.", v, n, i, v, a, n, m); break;
  case 1:
    addf(&g->pool, "- %s.%s_%s_%" PRId64 "(%s_id, limit=%d): returns the %s %ss linked to a %s.", m, v, n2, i, n2,
         rng_range(&r, 10, 500), a, n, n2);
    break;
  case 2: addf(&g->pool, "- %s_%s_%" PRId64 ": use when the user asks to %s a %s %s; read-only.", m, v, i, v, a, n2); break;
  default:
    addf(&g->pool, "- %s_%s_%" PRId64 ": %s every %s in %s/ that is %s (dry_run defaults to true).", v, n2, i, v,
         n2, m, a);
    break;
  }
}

/* The toollist shape's system text for F tool lines (borrowing base's and pool's strings). */
static st_status toollist_system(gen *g, int64_t F) {
  if (F == g->system_F) return ST_OK;
  while (g->pool.n < F) {
    pool_line(g, g->pool.n);
    if (oom_flag) return st_fail(ST_ENOMEM, "needle prompt tool lines");
  }
  static char header[] = "# Tools (call one by writing its name and arguments; one tool per line)";
  static char more[] = "# More tools";
  static char empty[] = "";
  int env = 0, n = g->base.n;
  while (env < n && strcmp(g->base.v[env], "# Environment")) env++;
  int rules = 0;
  while (rules < n && strcmp(g->base.v[rules], "# Rules")) rules++;
  free(g->system.v);
  memset(&g->system, 0, sizeof g->system);
  g->system.v = malloc(sizeof(char *) * (size_t)(n + F + 8));
  if (!g->system.v) return st_fail(ST_ENOMEM, "needle prompt system text");
  char **v = g->system.v;
  int k = 0;
  int64_t half = F / 2;
  for (int i = 0; i < rules && i < n; i++) v[k++] = g->base.v[i];  /* intro, blank */
  v[k++] = header;
  for (int64_t i = 0; i < half; i++) v[k++] = g->pool.v[i];
  v[k++] = empty;
  for (int i = env; i < n; i++) v[k++] = g->base.v[i];              /* the environment section */
  v[k++] = empty;
  v[k++] = more;
  for (int64_t i = half; i < F; i++) v[k++] = g->pool.v[i];
  v[k++] = empty;
  for (int i = rules; i < env - 1 && i < n; i++) v[k++] = g->base.v[i]; /* "# Rules", the rules */
  g->system.n = g->system.cap = k;
  g->system_F = F;
  return ST_OK;
}

/* Rounds used for F lines, and the lines of the last one. */
static int rounds_for(const gen *g, int64_t F, int *last_lines) {
  if (g->spec->shape == ST_NEEDLE_SHAPE_TOOLLIST) return *last_lines = 0, 0;
  int r = 0;
  int64_t left = F;
  *last_lines = 0;
  while (left > 0 && r < g->n_rounds) {
    int n = g->rounds[r].out.n;
    *last_lines = left < n ? (int)left : n;
    left -= n;
    r++;
  }
  return r;
}

/* ---------------------------------------------------------------- slots */

typedef struct slots {
  slot *v;
  int n, cap;
} slots;

static void slots_add(slots *S, unit_kind k, int index, int line) {
  if (S->n == S->cap) {
    int cap = S->cap ? 2 * S->cap : 256;
    slot *v = realloc(S->v, sizeof(slot) * (size_t)cap);
    if (!v) { oom_flag = 1; return; }
    S->v = v;
    S->cap = cap;
  }
  S->v[S->n++] = (slot){k, index, line};
}

static int sentence_count(const char *s);

static void list_slots(const gen *g, int64_t F, slots *S) {
  int tools_first = g->spec->render.profile == ST_RENDER_ATOM;
  if (tools_first)
    for (int t = 0; t < g->n_tools; t++) slots_add(S, U_TOOL, t, 1);
  for (int l = 0; l <= g->system.n; l++) slots_add(S, U_SYSTEM, 0, l);
  if (!tools_first)
    for (int t = 0; t < g->n_tools; t++) slots_add(S, U_TOOL, t, 1);
  if (g->spec->shape == ST_NEEDLE_SHAPE_TOOLLIST) return; /* the system text and the question only */
  for (int l = 0, n = sentence_count(g->task); l <= n; l++) slots_add(S, U_TASK, 0, l);
  int last_lines, nr = rounds_for(g, F, &last_lines);
  for (int r = 0; r < nr; r++) {
    slots_add(S, U_THOUGHT, r, 0);
    slots_add(S, U_THOUGHT, r, 1);
    int n = r == nr - 1 ? last_lines : g->rounds[r].out.n;
    for (int l = 0; l <= n; l++) slots_add(S, U_OUTPUT, r, l);
  }
  for (int l = 0, n = sentence_count(g->summary); l <= n; l++) slots_add(S, U_SUMMARY, 0, l);
}

/* ---------------------------------------------------------------- emission */

/* A line that goes into a unit (the system text, a tool's description, the task, a turn's
** thought or output, the summary) before its line `at`: the needle, or a decoy. */
typedef struct insert {
  int at;
  const char *text;
} insert;

/* The lines unit (k, index) gets when the needle is at s: the decoys placed in it, those parked
** with the needle (decoy_at NULL: just before it, while the needle's place is searched), and
** the needle; ordered by `at`, a decoy before the needle at the same line. Returns how many. */
static int inserts_for(const gen *g, const slot *s, unit_kind k, int index, insert out[ST_NEEDLE_MAX_DECOYS + 1]) {
  int n = 0, needle_here = s && s->kind == k && s->index == index;
  for (int i = 0; i < g->n_decoys; i++) {
    const slot *d = g->decoy_at[i] ? g->decoy_at[i] : needle_here ? s : NULL;
    if (d && d->kind == k && d->index == index) out[n++] = (insert){d->line, g->decoy_line[i]};
  }
  if (needle_here) out[n++] = (insert){s->line, g->line};
  for (int i = 1; i < n; i++) { /* stable: equal lines keep decoys first */
    insert x = out[i];
    int j = i;
    for (; j > 0 && out[j - 1].at > x.at; j--) out[j] = out[j - 1];
    out[j] = x;
  }
  return n;
}

/* Lines [0, n) of v joined with "\n", with unit (k, index)'s inserts (inserts_for) as lines of
** their own before their line. */
static char *join(const gen *g, char *const *v, int n, const slot *s, unit_kind k, int index) {
  insert ins[ST_NEEDLE_MAX_DECOYS + 1];
  int nins = inserts_for(g, s, k, index, ins), next = 0;
  st_buf t = {0};
  int first = 1;
  for (int i = 0; i <= n; i++) {
    for (; next < nins && (ins[next].at <= i || i == n); next++) {
      if (!first) st_buf_str(&t, "\n");
      st_buf_str(&t, ins[next].text);
      first = 0;
    }
    if (i == n) break;
    if (!first) st_buf_str(&t, "\n");
    st_buf_str(&t, v[i]);
    first = 0;
  }
  if (t.failed) oom_flag = 1;
  char *r = st_buf_take(&t, NULL);
  if (!r) oom_flag = 1;
  return r;
}

static char *join1(const gen *g, const char *text, const slot *s, unit_kind k, int index) {
  char *v[1] = {(char *)text};
  return join(g, v, 1, s, k, index);
}

/* Sentences of a paragraph: they end at ". ". */
static int sentence_count(const char *s) {
  int n = 1;
  for (const char *p = s; (p = strstr(p, ". ")); p += 2) n++;
  return n;
}

/* A paragraph with unit (k, index)'s inserts each on its own line before their sentence. */
static char *join_sentences(const gen *g, const char *text, const slot *s, unit_kind k, int index) {
  insert ins[ST_NEEDLE_MAX_DECOYS + 1];
  int nins = inserts_for(g, s, k, index, ins), next = 0;
  if (!nins) return join1(g, text, NULL, k, index);
  st_buf t = {0};
  int i = 0;
  const char *p = text;
  for (;;) {
    if (next < nins && (ins[next].at <= i || !*p)) {
      for (; next < nins && (ins[next].at <= i || !*p); next++) {
        if (t.len) st_buf_str(&t, "\n");
        st_buf_str(&t, ins[next].text);
      }
      if (*p) st_buf_str(&t, "\n");
    }
    if (!*p) break;
    const char *end = strstr(p, ". ");
    size_t len = end ? (size_t)(end - p) + 1 : strlen(p);
    st_buf_add(&t, p, len);
    p += len;
    if (*p == ' ') {
      p++;
      if (!(next < nins && ins[next].at <= i + 1)) st_buf_str(&t, " ");
    }
    i++;
  }
  if (t.failed) oom_flag = 1;
  char *r = st_buf_take(&t, NULL);
  if (!r) oom_flag = 1;
  return r;
}

static json_t *text_blocks(const char *text) {
  return json_pack("[{s:s, s:s}]", "type", "text", "text", text ? text : "");
}

static json_t *input_blocks(const char *type, const char *text) {
  return json_pack("[{s:s, s:s}]", "type", type, "text", text ? text : "");
}

static char *dumps_compact(const json_t *v) {
  char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (!s) oom_flag = 1;
  return s;
}

/* The user's text when the request has no tools: the command and its output. */
static char *pasted_output(const gen *g, const turn *rd, int n, const slot *s, int index) {
  char *body = join(g, rd->out.v, n, s, U_OUTPUT, index);
  char *text = xasprintf("$ %s\n%s", rd->shell, body ? body : "");
  free(body);
  return text;
}

static char *no_tool_thought(const turn *rd) {
  return xasprintf("%s Please run `%s` and paste the output.", rd->thought, rd->shell);
}

static json_t *build_request(gen *g, int64_t F, const slot *s) {
  const st_needle_spec *sp = g->spec;
  st_needle_format fmt = sp->format;
  json_t *req = json_object();
  json_object_set_new(req, "model", json_string(sp->model_name ? sp->model_name : "deepseek-v4"));
  int max_tokens = sp->max_tokens > 0 ? sp->max_tokens : 256;
  char *system = join(g, g->system.v, g->system.n, s, U_SYSTEM, 0);

  /* tools */
  json_t *tools = json_array();
  for (int t = 0; t < g->n_tools; t++) {
    const st_nc_tool *T = &st_nc_tools[g->tools[t]];
    json_error_t e;
    json_t *schema = json_loads(T->schema, JSON_PRESERVE_ORDER, &e);
    ST_ASSERT(schema); /* the corpus is fixed: a parse failure is a bug */
    /* the needle (and decoys) in a description: a paragraph after it */
    insert ins[ST_NEEDLE_MAX_DECOYS + 1];
    int nins = inserts_for(g, s, U_TOOL, t, ins);
    st_buf d = {0};
    st_buf_str(&d, T->description);
    for (int i = 0; i < nins; i++) st_buf_str(&d, i ? "\n" : "\n\n"), st_buf_str(&d, ins[i].text);
    char *desc = d.failed ? NULL : st_buf_take(&d, NULL);
    if (d.failed) st_buf_free(&d);
    if (!desc) oom_flag = 1;
    json_t *tool;
    if (fmt == ST_NEEDLE_ANTHROPIC)
      tool = json_pack("{s:s, s:s, s:o}", "name", T->name, "description", desc ? desc : "", "input_schema", schema);
    else if (fmt == ST_NEEDLE_OPENAI_CHAT)
      tool = json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function", "name", T->name, "description",
                       desc ? desc : "", "parameters", schema);
    else
      tool = json_pack("{s:s, s:s, s:s, s:o}", "type", "function", "name", T->name, "description", desc ? desc : "",
                       "parameters", schema);
    free(desc);
    json_array_append_new(tools, tool);
  }

  /* messages */
  json_t *msgs = json_array();
  char *task = join_sentences(g, g->task, s, U_TASK, 0);
  int last_lines, nr = rounds_for(g, F, &last_lines);
  int toollist = sp->shape == ST_NEEDLE_SHAPE_TOOLLIST;
  if (fmt == ST_NEEDLE_OPENAI_CHAT) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
  if (toollist) {
  } else if (fmt == ST_NEEDLE_ANTHROPIC)
    json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "user", "content", text_blocks(task)));
  else if (fmt == ST_NEEDLE_OPENAI_CHAT)
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", task));
  else
    json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "type", "message", "role", "user", "content",
                                          input_blocks("input_text", task)));
  for (int r = 0; r < nr; r++) {
    const turn *rd = &g->rounds[r];
    int n = r == nr - 1 ? last_lines : rd->out.n;
    char *thought = g->n_tools ? join1(g, rd->thought, s, U_THOUGHT, r) : NULL;
    if (!g->n_tools) {
      char *t0 = no_tool_thought(rd);
      thought = join1(g, t0 ? t0 : "", s, U_THOUGHT, r);
      free(t0);
    }
    char *output = g->n_tools ? join(g, rd->out.v, n, s, U_OUTPUT, r) : pasted_output(g, rd, n, s, r);
    char call_id[64];
    if (fmt == ST_NEEDLE_ANTHROPIC) snprintf(call_id, sizeof call_id, "toolu_01%.22s", rd->call_id);
    else snprintf(call_id, sizeof call_id, "call_%s", rd->call_id);
    if (!g->n_tools) {
      if (fmt == ST_NEEDLE_ANTHROPIC) {
        json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "assistant", "content", text_blocks(thought)));
        json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "user", "content", text_blocks(output)));
      } else if (fmt == ST_NEEDLE_OPENAI_CHAT) {
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", thought));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", output));
      } else {
        json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "type", "message", "role", "assistant", "content",
                                              input_blocks("output_text", thought)));
        json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "type", "message", "role", "user", "content",
                                              input_blocks("input_text", output)));
      }
    } else if (fmt == ST_NEEDLE_ANTHROPIC) {
      json_t *content = text_blocks(thought);
      json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:O}", "type", "tool_use", "id", call_id, "name",
                                               rd->tool, "input", rd->input));
      json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "assistant", "content", content));
      json_array_append_new(msgs, json_pack("{s:s, s:[{s:s, s:s, s:s}]}", "role", "user", "content", "type",
                                            "tool_result", "tool_use_id", call_id, "content", output));
    } else {
      char *args = dumps_compact(rd->input);
      if (fmt == ST_NEEDLE_OPENAI_CHAT) {
        json_array_append_new(msgs, json_pack("{s:s, s:s, s:[{s:s, s:s, s:{s:s, s:s}}]}", "role", "assistant",
                                              "content", thought, "tool_calls", "id", call_id, "type", "function",
                                              "function", "name", rd->tool, "arguments", args ? args : "{}"));
        json_array_append_new(msgs, json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", call_id, "content", output));
      } else {
        json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "type", "message", "role", "assistant", "content",
                                              input_blocks("output_text", thought)));
        json_array_append_new(msgs, json_pack("{s:s, s:s, s:s, s:s}", "type", "function_call", "call_id", call_id,
                                              "name", rd->tool, "arguments", args ? args : "{}"));
        json_array_append_new(msgs, json_pack("{s:s, s:s, s:s}", "type", "function_call_output", "call_id", call_id,
                                              "output", output));
      }
      free(args);
    }
    free(thought);
    free(output);
  }
  char *summary = join_sentences(g, g->summary, s, U_SUMMARY, 0);
  if (fmt == ST_NEEDLE_ANTHROPIC) {
    if (!toollist)
      json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "assistant", "content", text_blocks(summary)));
    json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "user", "content", text_blocks(g->question)));
  } else if (fmt == ST_NEEDLE_OPENAI_CHAT) {
    if (!toollist) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", summary));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", g->question));
  } else {
    if (!toollist)
      json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "type", "message", "role", "assistant", "content",
                                            input_blocks("output_text", summary)));
    json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "type", "message", "role", "user", "content",
                                          input_blocks("input_text", g->question)));
  }

  /* the body, in the order clients write it */
  if (fmt == ST_NEEDLE_ANTHROPIC) {
    json_object_set_new(req, "max_tokens", json_integer(max_tokens));
    json_object_set_new(req, "temperature", json_real(sp->temperature));
    if (sp->thinking == 0) json_object_set_new(req, "thinking", json_pack("{s:s}", "type", "disabled"));
    if (sp->thinking == 1)
      json_object_set_new(req, "thinking", json_pack("{s:s, s:i}", "type", "enabled", "budget_tokens",
                                                     max_tokens > 2048 ? max_tokens / 2 : 1024));
    json_object_set_new(req, "system", text_blocks(system));
    if (g->n_tools) json_object_set_new(req, "tools", tools);
    else json_decref(tools);
    json_object_set_new(req, "messages", msgs);
  } else if (fmt == ST_NEEDLE_OPENAI_CHAT) {
    json_object_set_new(req, "temperature", json_real(sp->temperature));
    json_object_set_new(req, "max_tokens", json_integer(max_tokens));
    if (sp->thinking >= 0)
      json_object_set_new(req, "chat_template_kwargs", json_pack("{s:b}", "thinking", sp->thinking));
    json_object_set_new(req, "messages", msgs);
    if (g->n_tools) json_object_set_new(req, "tools", tools);
    else json_decref(tools);
  } else {
    json_object_set_new(req, "temperature", json_real(sp->temperature));
    json_object_set_new(req, "max_output_tokens", json_integer(max_tokens));
    if (sp->thinking >= 0)
      json_object_set_new(req, "chat_template_kwargs", json_pack("{s:b}", "thinking", sp->thinking));
    json_object_set_new(req, "instructions", json_string(system ? system : ""));
    json_object_set_new(req, "input", msgs);
    if (g->n_tools) json_object_set_new(req, "tools", tools);
    else json_decref(tools);
  }
  json_object_set_new(req, "stream", json_false());
  free(system);
  free(task);
  free(summary);
  return req;
}

/* ---------------------------------------------------------------- measuring */

typedef struct measured {
  json_t *request;
  char *prompt;
  size_t len;
  st_token_ids ids;
  int64_t tokens;
  int64_t needle_byte; /* -1: not found */
  int64_t needle_token, needle_token_end;
} measured;

static void measured_free(measured *m) {
  json_decref(m->request);
  free(m->prompt);
  st_token_ids_free(&m->ids);
  memset(m, 0, sizeof *m);
}

static int64_t estimate(size_t bytes) { return (int64_t)llround((double)bytes / ST_NEEDLE_BYTES_PER_TOKEN); }

st_status st_needle_token_span(const st_tokenizer *tok, const int32_t *ids, size_t n, size_t prompt_len,
                               int64_t byte_start, int64_t byte_end, int64_t *start, int64_t *end) {
  int64_t off = 0, s = -1, e = -1;
  for (size_t i = 0; i < n; i++) {
    size_t len = 0;
    if (!st_tokenizer_token_bytes(tok, ids[i], &len)) return st_fail(ST_EINVAL, "token id %d has no bytes", ids[i]);
    int64_t next = off + (int64_t)len;
    if (s < 0 && next > byte_start) s = (int64_t)i;
    if (e < 0 && next >= byte_end) e = (int64_t)i + 1;
    off = next;
  }
  if (off != (int64_t)prompt_len || s < 0 || e < 0)
    return st_fail(ST_EMISMATCH, "the prompt's %zu tokens decode to %lld bytes, the prompt has %zu", n,
                   (long long)off, prompt_len);
  *start = s;
  *end = e;
  return ST_OK;
}

/* Builds, renders and counts one candidate. With find_needle the needle's offsets are set. */
static st_status measure(gen *g, int64_t F, const slot *s, int find_needle, measured *m) {
  memset(m, 0, sizeof *m);
  m->needle_byte = -1;
  st_status rc = ensure_rounds(g, F);
  if (rc) return rc;
  m->request = build_request(g, F, s);
  if (oom_flag || !m->request) return st_fail(ST_ENOMEM, "needle request");
  st_chat_options o = g->spec->render;
  o.api = g->spec->format == ST_NEEDLE_ANTHROPIC ? ST_API_ANTHROPIC
        : g->spec->format == ST_NEEDLE_OPENAI_CHAT ? ST_API_CHAT : ST_API_RESPONSES;
  st_chat_prompt p;
  if ((rc = st_chat_render_request(m->request, &o, &p)))
    return st_fail_context(rc, "rendering the needle request (%s, profile %s): ", st_needle_format_name(g->spec->format),
                           st_render_profile_name(o.profile));
  if (g->spec->tok && (rc = st_chat_prompt_ids(g->spec->tok, &p, &m->ids))) {
    st_chat_prompt_free(&p);
    return rc;
  }
  m->prompt = p.text;
  m->len = p.len;
  p.text = NULL;
  st_chat_prompt_free(&p);
  m->tokens = g->spec->tok ? (int64_t)m->ids.n : estimate(m->len);
  if (!find_needle) return ST_OK;
  const char *hit = memmem(m->prompt, m->len, g->line, strlen(g->line));
  if (!hit) return st_fail(ST_EINVAL, "the needle line is not in the rendered prompt (profile %s)",
                           st_render_profile_name(o.profile));
  int count = 0;
  for (const char *at = m->prompt; (at = memmem(at, m->len - (size_t)(at - m->prompt), g->value, strlen(g->value)));
       at++)
    count++;
  if (count != 1) return st_fail(ST_EINVAL, "the needle value \"%s\" occurs %d times in the prompt", g->value, count);
  m->needle_byte = hit - m->prompt;
  if (g->spec->tok) {
    rc = st_needle_token_span(g->spec->tok, m->ids.ids, m->ids.n, m->len, m->needle_byte,
                              m->needle_byte + (int64_t)strlen(g->line), &m->needle_token, &m->needle_token_end);
    if (rc) return rc;
  } else {
    m->needle_token = estimate((size_t)m->needle_byte);
    m->needle_token_end = estimate((size_t)m->needle_byte + strlen(g->line));
  }
  return ST_OK;
}

/* ---------------------------------------------------------------- st_needle_make */

static void gen_free(gen *g) {
  free(g->question);
  if (g->spec && g->spec->shape == ST_NEEDLE_SHAPE_TOOLLIST) {
    free(g->system.v); /* borrowed strings: base's and pool's */
    memset(&g->system, 0, sizeof g->system);
    lines_free(&g->base);
    lines_free(&g->pool);
  } else {
    lines_free(&g->system);
  }
  free(g->task);
  free(g->summary);
  for (int i = 0; i < g->n_rounds; i++) turn_free(&g->rounds[i]);
  free(g->rounds);
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static const char *placement_name(const slot *s) {
  switch (s->kind) {
  case U_SYSTEM: return "system";
  case U_TOOL: return "tool description";
  case U_TASK: return "user";
  case U_THOUGHT: return "assistant";
  case U_OUTPUT: return "tool result";
  default: return "assistant";
  }
}

st_status st_needle_make(const st_needle_spec *spec, st_needle_prompt *out) {
  memset(out, 0, sizeof *out);
  if (!(spec->position >= 0.0 && spec->position <= 1.0))
    return st_fail(ST_EINVAL, "needle position %g: expected a fraction in [0, 1]", spec->position);
  if (spec->tokens < 1) return st_fail(ST_EINVAL, "needle prompt size %lld: expected a positive token count", (long long)spec->tokens);
  if (spec->decoys < 0 || spec->decoys > ST_NEEDLE_MAX_DECOYS)
    return st_fail(ST_EINVAL, "needle decoys %d: expected 0 to %d", spec->decoys, ST_NEEDLE_MAX_DECOYS);
  if (spec->kind == ST_NEEDLE_VOCAB && !spec->tok)
    return st_fail(ST_EINVAL, "needle kind vocab draws its tokens from a tokenizer: give the model (--model DIR)");
  const int *vt = spec->vocab_tokens;
  if ((vt[0] || vt[1]) && !(vt[0] >= 1 && vt[0] <= vt[1] && vt[1] <= ST_NEEDLE_VOCAB_TOKENS_MAX))
    return st_fail(ST_EINVAL, "needle vocab tokens %d-%d: expected LO-HI, 1 <= LO <= HI <= %d", vt[0], vt[1],
                   ST_NEEDLE_VOCAB_TOKENS_MAX);
  oom_flag = 0;
  gen g = {0};
  g.spec = spec;
  g.seed = spec->seed;
  st_status rc = ST_OK;
  measured m = {0}, best = {0};
  slots S = {0};
  make_needle(&g);

  /* bytes per token: measured on a calibration request when there is a tokenizer */
  double bpt = ST_NEEDLE_BYTES_PER_TOKEN;
  if (spec->tok) {
    gen cal = {0};
    cal.spec = spec;
    cal.seed = spec->seed;
    make_needle(&cal);
    make_structure(&cal, 1e9);
    slot park = {U_SYSTEM, 0, 0};
    rc = measure(&cal, 400, &park, 0, &m);
    if (!rc && m.tokens > 0) bpt = (double)m.len / (double)m.tokens;
    measured_free(&m);
    gen_free(&cal);
    if (rc) goto out;
  }
  make_structure(&g, (double)spec->tokens * bpt);
  if (oom_flag) { rc = st_fail(ST_ENOMEM, "needle prompt"); goto out; }

  /* size: F filler lines, needle parked at the end of the system text (the decoys just before it) */
size:;
  slot park = {U_SYSTEM, 0, g.system.n};
  int64_t target = spec->tokens, F = 0;
  if ((rc = measure(&g, 0, &park, 0, &m))) goto out;
  out->min_tokens = m.tokens;
  int64_t size0 = m.tokens;
  measured_free(&m);
  if (size0 < target) {
    int64_t lo = 0, hi = 64, size_hi = 0;
    for (;;) {
      if ((rc = measure(&g, hi, &park, 0, &m))) goto out;
      size_hi = m.tokens;
      measured_free(&m);
      if (size_hi >= target || hi >= (int64_t)1 << 26) break;
      lo = hi;
      hi *= 2;
    }
    /* smallest F in (lo, hi] with size >= target; then the closer of F and F - 1 */
    int64_t size_lo = -1;
    while (hi - lo > 1) {
      int64_t mid = lo + (hi - lo) / 2;
      if ((rc = measure(&g, mid, &park, 0, &m))) goto out;
      if (m.tokens >= target) hi = mid, size_hi = m.tokens;
      else lo = mid, size_lo = m.tokens;
      measured_free(&m);
    }
    if (size_lo < 0) {
      if ((rc = measure(&g, lo, &park, 0, &m))) goto out;
      size_lo = m.tokens;
      measured_free(&m);
    }
    F = (size_hi - target <= target - size_lo) ? hi : lo;
  }

  /* placement: the slot whose needle token is nearest position * size */
  if ((rc = ensure_rounds(&g, F))) goto out; /* the toollist shape's system text is F's */
  list_slots(&g, F, &S);
  if (oom_flag || S.n == 0) { rc = st_fail(ST_ENOMEM, "needle slots"); goto out; }
  int lo = 0, hi = S.n - 1;
  double want = spec->position;
  /* first slot with fraction >= want */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if ((rc = measure(&g, F, &S.v[mid], 1, &m))) goto out;
    double frac = m.tokens ? (double)m.needle_token / (double)m.tokens : 0;
    measured_free(&m);
    if (frac >= want) hi = mid;
    else lo = mid + 1;
  }
  if ((rc = measure(&g, F, &S.v[lo], 1, &best))) goto out;
  int chosen = lo;
  if (lo > 0) {
    if ((rc = measure(&g, F, &S.v[lo - 1], 1, &m))) goto out;
    double a = fabs((double)best.needle_token / (double)best.tokens - want);
    double b = fabs((double)m.needle_token / (double)m.tokens - want);
    if (b < a) {
      measured_free(&best);
      best = m;
      memset(&m, 0, sizeof m);
      chosen = lo - 1;
    }
    measured_free(&m);
  }

  /* Decoys: from beside the needle (where they were while its place was searched, so the sizes
  ** counted them) to line boundaries drawn among those before it, in prompt order. With fewer
  ** boundaries before the needle than decoys, the size and the place are searched again for as
  ** many as there were, or half as many when that is more (long decoys parked beside the needle
  ** can push it past the position from the first boundary on); each time fewer, so it ends. */
  if (g.n_decoys) {
    int placed = g.n_decoys < chosen ? g.n_decoys : chosen;
    if (placed < g.n_decoys) {
      g.n_decoys = placed > g.n_decoys / 2 ? placed : g.n_decoys / 2;
      measured_free(&best);
      free(S.v);
      memset(&S, 0, sizeof S);
      goto size;
    }
    int *pick = malloc(sizeof(int) * (size_t)(chosen > 0 ? chosen : 1));
    if (!pick) { rc = st_fail(ST_ENOMEM, "needle decoys"); goto out; }
    for (int i = 0; i < chosen; i++) pick[i] = i;
    rng r = rng_for(g.seed, TAG_DECOY_SLOTS, (uint64_t)chosen);
    for (int i = 0; i < placed; i++) { /* a partial Fisher-Yates shuffle: `placed` distinct slots */
      int j = i + rng_int(&r, chosen - i), t = pick[i];
      pick[i] = pick[j];
      pick[j] = t;
    }
    qsort(pick, (size_t)placed, sizeof pick[0], cmp_int);
    for (int i = 0; i < placed; i++) g.decoy_at[i] = &S.v[pick[i]];
    free(pick);
    measured_free(&best);
    if ((rc = measure(&g, F, &S.v[chosen], 1, &best))) goto out;
  }

  out->request = best.request;
  best.request = NULL;
  memcpy(out->label, g.label, sizeof out->label);
  memcpy(out->value, g.value, sizeof out->value);
  memcpy(out->line, g.line, sizeof out->line);
  out->family = g.family;
  out->question = g.question;
  g.question = NULL;
  out->prompt = best.prompt;
  out->prompt_len = best.len;
  best.prompt = NULL;
  out->ids = best.ids;
  memset(&best.ids, 0, sizeof best.ids);
  out->tokens = best.tokens;
  out->measured = spec->tok != NULL;
  out->needle_byte = best.needle_byte;
  out->needle_token = best.needle_token;
  out->needle_token_end = best.needle_token_end;
  out->position = best.tokens ? (double)best.needle_token / (double)best.tokens : 0;
  out->within_tolerance = llabs(best.tokens - target) <= (int64_t)ceil(0.02 * (double)target);
  out->n_tools = g.n_tools;
  int last_lines;
  out->n_rounds = rounds_for(&g, F, &last_lines);
  out->filler_lines = (int)F;
  out->placement = placement_name(&S.v[chosen]);
  out->n_decoys = g.n_decoys;
out:
  measured_free(&m);
  measured_free(&best);
  free(S.v);
  gen_free(&g);
  if (rc) st_needle_prompt_free(out);
  return rc;
}

void st_needle_prompt_free(st_needle_prompt *p) {
  json_decref(p->request);
  free(p->question);
  free(p->prompt);
  st_token_ids_free(&p->ids);
  memset(p, 0, sizeof *p);
}
