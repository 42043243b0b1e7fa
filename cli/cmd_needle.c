/*
** cmd_needle.c — `sparsetrace needle make` (one synthetic agentic request with a needle line) and
** `sparsetrace needle sweep` (the recall grid against the engine or a server, with its table).
*/
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "needle/needle_prompt.h"
#include "engine/text/pyjson.h"
#include "engine/text/tokenizer.h"
#include "recorder/recorder.h"
#include "needle/harness.h"

static const char needle_help[] =
  "usage: sparsetrace needle make  --tokens N --position P --seed S [options]\n"
  "       sparsetrace needle sweep (--model DIR | --endpoint URL) [options]\n"
  "\n"
  "Recall tests for long agentic prompts: one line (the needle) placed at a chosen fraction of a\n"
  "realistic coding-agent request, and a final question asking for it verbatim.\n"
  "'sparsetrace needle make --help' and 'sparsetrace needle sweep --help' list the options.\n";

/* --kinds: at most this many entries (a kind named twice is drawn twice as often) */
#define MAX_KIND_LIST 64
#define SPELL_(x) #x
#define SPELL(x) SPELL_(x)

static const st_opt_use make_options[] = {
  {ST_OPT_TOKENS, NULL, "prompt size in tokens (2048, 2k, 1.5k; k = 1024)"},
  {ST_OPT_POSITION, NULL, NULL},
  {ST_OPT_SEED, NULL, "seed (the needle depends on seed and kind only)"},
  {ST_OPT_KIND, NULL, "path (default: 'Working directory: /home/dev/...'), host, key, number,\n"
                      "ticket, branch, url, email, commit, env, random, assorted (one of 16\n"
                      "value shapes, each under its own label), vocab (label and value of\n"
                      "tokens drawn from the model's vocabulary; needs --model)"},
  {ST_OPT_FORMAT, NULL, "anthropic (default), openai-chat, openai-responses"},
  {ST_OPT_SHAPE, NULL, "agent (default: the transcript above) or toollist (one system string of\n"
                       "one-line tool descriptions with the environment in the middle, and one\n"
                       "question: the shape of a typical bug report's request)"},
  {ST_OPT_DECOYS, NULL, "0 to 64 more lines with the needle's label and other values of its kind,\n"
                        "at line boundaries before it, and a question asking for the last one:\n"
                        "where a line sits is all that tells it, so a fault in the indexer's\n"
                        "positions (index_rope=neox, compress_rope_theta) shows (default 0)"},
  {ST_OPT_VOCAB_TOKENS, NULL, "kind vocab: its value LO to HI tokens (N: N), 1 <= LO <= HI <= " SPELL(ST_NEEDLE_VOCAB_TOKENS_MAX) ",\n"
                             "as many as fit " SPELL(ST_NEEDLE_VALUE_MAX) " bytes (default 6-14 in at most 96 bytes): long\n"
                             "values give a model many tokens to copy in one example"},
  {ST_OPT_MODEL, NULL, "directory with tokenizer.json for exact sizes"},
  {ST_OPT_RENDER, NULL, "rendering used for sizing: reference (default), sglang, vllm, atom"},
  {ST_OPT_THINKING, NULL, "ask for thinking / chat mode in the request (default: say nothing)"},
  {ST_OPT_MODEL_NAME, NULL, "the request's \"model\" (default deepseek-v4)"},
  {ST_OPT_MAX_NEW_TOKENS, NULL, "the request's output limit, 1 to 1000000 (default 256)"},
  {ST_OPT_OUT, NULL, "write the request there instead of stdout"},
  {ST_OPT_META, NULL, "write {needle, expected, tokens, position, ...} as JSON there"},
  {ST_OPT_QUIET, NULL, "no summary on stderr"},
  {ST_OPT_BATCH, NULL, "batch mode: write N examples (training data) to --jsonl; needs --model"},
  {ST_OPT_JSONL, NULL, "batch mode: the JSON-lines file (\"-\": stdout)"},
  {ST_OPT_KINDS, NULL, "batch mode: kinds drawn from (default: all the split allows); a kind named\n"
                       "twice is drawn twice as often (" SPELL(MAX_KIND_LIST) " entries at most)"},
  {ST_OPT_FORMATS, NULL, "batch mode: formats drawn from (default: all three)"},
  {ST_OPT_SHAPES, NULL, "batch mode: request shapes drawn from: agent (the transcript `needle make`\n"
                       "writes), toollist (one system string of one-line tool descriptions with the\n"
                       "environment in the middle, and one question); default both"},
  {ST_OPT_LENGTHS, NULL, "batch mode: prompt sizes drawn from (default 1k,2k,4k)"},
  {ST_OPT_SPLIT, NULL, "batch mode: train (default; never kinds email, env nor question\n"
                       "families q5, q6) or heldout (every example has one of them)"},
  {ST_OPT_DECOYS, "N", "batch mode: N decoys in every example (as needle make; default 0), or\n"
                      "LO-HI: each example's count drawn from LO to HI"},
  {ST_OPT_COMPOSED, NULL, "batch mode, train split: that share (0 to 1, default 0) of the examples ask\n"
                          "a question composed from parts (opener, ask, the line wanted, manner,\n"
                          "ending; family \"composed\") instead of their family's wording, drawn on\n"
                          "a stream of their own: 0 writes the same bytes as without the option"},
  {ST_OPT_OPEN_LABELS, NULL, "batch mode, train split: that share (0 to 1, default 0) of the needles\n"
                             "get a made-up label (\"Brisano quota\", \"KTR mirror\") instead of their\n"
                             "kind's, drawn on a stream of their own (0: the same bytes as without)"},
  {0}};

static const st_cmd_spec make_spec = {
  "needle make", "sparsetrace needle make --tokens N --position P --seed S [options]\n",
  "Writes a coding-agent request (system prompt with rules and an environment section, tool\n"
  "definitions with JSON schemas, a task, rounds of tool calls and results, a summary) with one\n"
  "needle line at fraction P of the rendered prompt and a final question asking for that line\n"
  "verbatim. Same options, same bytes. The prompt is rendered with the DeepSeek-V4 encoding and\n"
  "sized with the tokenizer of --model DIR (tokenizer.json); without one, 3.25 bytes per token is\n"
  "assumed (said on stderr). The needle line and its expected answer go to stderr or --meta.\n",
  make_options, "Exit status: 0 written, 1 on error, 2 usage error.\n"};

static const st_opt_use sweep_options[] = {
  {ST_OPT_MODEL, NULL, "engine checkpoint; its tokenizer.json renders the prompts"},
  {ST_OPT_TOKENIZER, NULL, "tokenizer.json to use instead (engine), or for exact sizes (server)"},
  {ST_OPT_ENDPOINT, NULL, "server base URL (http://host:8000, .../v1, or the full endpoint)"},
  {ST_OPT_API, NULL, "server API: openai (default, /v1/chat/completions), anthropic\n"
                     "(/v1/messages), responses (/v1/responses). Key: $ST_API_KEY, else\n"
                     "$ANTHROPIC_API_KEY / $OPENAI_API_KEY"},
  {ST_OPT_MODEL_NAME, NULL, "the requests' \"model\" (default: model dir name, or deepseek-v4)"},
  {ST_OPT_SET, NULL, "engine setting (repeatable; 'sparsetrace settings'); for a server,\n"
                     "recorded with each attempt as a label (the server is not changed)"},
  {ST_OPT_TOKENS, "LIST", "context lengths (default 2k,4k,8k; k = 1024)"},
  {ST_OPT_POSITIONS, "LIST", "needle fractions (default 0.25,0.55,0.8,0.97); the tap positions of\n"
                             "the engine's runs are --tap-positions"},
  {ST_OPT_SEEDS, NULL, "seeds per cell, 1 to 10000 (default 3), starting at --first-seed (default 1)"},
  {ST_OPT_FIRST_SEED, NULL, NULL},
  {ST_OPT_KIND, NULL, "path (default), host, key, number, ticket, branch, url, email, commit,\n"
                      "env, random, assorted, vocab (as needle make; vocab draws from the\n"
                      "tokenizer: a server sweep needs --tokenizer)"},
  {ST_OPT_VOCAB_TOKENS, NULL, "kind vocab: its values LO to HI tokens (as needle make; default 6-14)"},
  {ST_OPT_SHAPE, NULL, "request shape: agent (default) or toollist (as needle make)"},
  {ST_OPT_DECOYS, NULL, "0 to 64 earlier lines of the needle's label in every request, the last\n"
                        "one asked for (as needle make; default 0): recall by position"},
  {ST_OPT_FORMAT, NULL, "engine request format: openai-chat (default), anthropic,\n"
                        "openai-responses (a server gets the format of its --api)"},
  {ST_OPT_RENDER, NULL, "engine rendering: reference (default), sglang, vllm, atom"},
  {ST_OPT_THINKING, "on|off|server", "chat mode (off, default), thinking mode (on), or leave it to\n"
                                     "the server / render profile default (server)"},
  {ST_OPT_MAX_NEW_TOKENS, NULL, "tokens generated / max_tokens of the request, 1 to 1000000\n"
                                "(default 64)"},
  {ST_OPT_TAP_POSITIONS, NULL, "engine: positions recorded for the indexer taps: last (default:\n"
                               "the last prompt token and every generated one), all, or A:B"},
  {ST_OPT_THREADS, NULL, "engine OpenMP threads, 1..1024"},
  {ST_OPT_BACKEND, NULL, "engine compute backend: cpu (default), cpu-ref, cuda, hip"},
  {ST_OPT_TIMEOUT, NULL, "server: seconds per request (default 600)"},
  {ST_OPT_STORE, NULL, "trace store (default ./traces)"},
  {ST_OPT_JSON, NULL, "print the sweep as JSON (cells and attempts)"},
  {ST_OPT_QUIET, NULL, "no progress lines on stderr"},
  {0}};

static const st_cmd_spec sweep_spec = {
  "needle sweep",
  "sparsetrace needle sweep (--model DIR | --endpoint URL [--api anthropic|openai|responses])\n"
  "                                [--tokens LIST] [--positions LIST] [--seeds N] [options]\n",
  "Runs the recall grid: for each context length, needle position and seed, a request from\n"
  "'needle make' goes to the reference engine (--model) or to a live server (--endpoint; POST,\n"
  "non-streaming, temperature 0). An attempt passes when the answer contains the needle's value\n"
  "verbatim. Prints the pass table (passed/attempts per length and position) and stores every\n"
  "attempt in STORE/index.sqlite (table needle_attempts, view needle_sweep_cells). Against the\n"
  "engine each attempt is also a recorded run: indexer taps armed, trace in STORE/runs/, the\n"
  "needle's token span and its per-layer verdicts in needles / needle_verdicts, so a failing cell\n"
  "is one 'sparsetrace replay --trace' away.\n",
  sweep_options,
  "Exit status: 0 when every attempt ran (whatever it recalled), 1 when some could not be made\n"
  "(their error is stored and counted in the table as '*'), 2 for usage errors.\n"};

/* "2048", "2k", "1.5k" (k = 1024, m = 1024^2). */
static int parse_count(const char *s, int64_t *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s) return -1;
  if (*end == 'k' || *end == 'K') v *= 1024, end++;
  else if (*end == 'm' || *end == 'M') v *= 1048576, end++;
  if (*end || !(v >= 1) || v > 1e12) return -1;
  *out = (int64_t)llround(v);
  return 0;
}

static int parse_fraction(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || !(v >= 0 && v <= 1)) return -1;
  *out = v;
  return 0;
}

static int on_off(const char *s, int *out) {
  if (!strcmp(s, "on") || !strcmp(s, "true") || !strcmp(s, "1")) return *out = 1, 0;
  if (!strcmp(s, "off") || !strcmp(s, "false") || !strcmp(s, "0")) return *out = 0, 0;
  return -1;
}

/* ---------------------------------------------------------------- make */

static st_status write_text_file(const char *path, const char *text, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return st_fail(ST_EIO, "%s: cannot create", path);
  int ok = fwrite(text, 1, len, f) == len;
  ok = fclose(f) == 0 && ok;
  return ok ? ST_OK : st_fail(ST_EIO, "%s: write failed", path);
}


/* ---------------------------------------------------------------- make --batch (training data) */

static int split_list(const char *list, void *out, size_t elem, int max, int (*parse)(const char *, void *));
static int parse_count_v(const char *s, void *out);
static int parse_kind_v(const char *s, void *out) { return st_needle_kind_parse(s, out) ? -1 : 0; }
static int parse_format_v(const char *s, void *out) { return st_needle_format_parse(s, out) ? -1 : 0; }
static int parse_shape_v(const char *s, void *out) { return st_needle_shape_parse(s, out) ? -1 : 0; }

typedef struct batch_options {
  int64_t n;
  const char *jsonl;
  int heldout;                       /* --split heldout */
  st_needle_kind kinds[MAX_KIND_LIST]; /* --kinds: a kind named twice is drawn twice as often */
  int n_kinds;                       /* 0: every kind the split allows */
  st_needle_format formats[ST_NEEDLE_FORMAT_COUNT];
  int n_formats;                     /* 0: all three */
  st_needle_shape shapes[ST_NEEDLE_SHAPE_COUNT];
  int n_shapes;                      /* 0: both */
  int64_t lengths[32];
  int n_lengths;                     /* 0: 1k, 2k, 4k */
  int decoys, decoys_hi;             /* decoys per example: drawn from decoys..decoys_hi (fewer are
                                     ** placed where the needle is early) */
  double composed;                   /* --composed: share of examples asking a composed question */
  double open_labels;                /* --open-labels: share of needles with a made-up label */
} batch_options;

static uint64_t batch_mix(uint64_t x) { /* splitmix64's finaliser */
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* x's top 53 bits as a double, uniform in [0, 1). */
static double batch_unit(uint64_t x) { return (double)(x >> 11) / 9007199254740992.0; }

/* Whether example i gets a training-only variant of the given share: a draw on a stream of its
** own (seed, salt, i), so every other field is drawn as without it. */
static int batch_share(uint64_t seed, uint64_t salt, int64_t i, double share) {
  return share > 0 && batch_unit(batch_mix(batch_mix(seed ^ salt) ^ batch_mix((uint64_t)i))) < share;
}

static json_t *ids_array(const int32_t *ids, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < n; i++)
    if (json_array_append_new(a, json_integer(ids[i]))) { json_decref(a); return NULL; }
  return a;
}

/* One example's line: what tools/needle_data.py jsonl-samples reads (README, "needle make --batch"). */
static json_t *batch_line(int64_t index, const st_needle_spec *sp, const st_needle_prompt *np,
                          const char *answer_text, const st_token_ids *answer, int heldout, int decoys_field) {
  char family[16];
  if (np->family == ST_NEEDLE_FAMILY_COMPOSED) snprintf(family, sizeof family, "composed");
  else snprintf(family, sizeof family, "q%d", np->family);
  json_t *o = json_pack("{s:I, s:I, s:s, s:s, s:s, s:s, s:b, s:b, s:f, s:f, s:I, s:I, s:s, s:s, s:s, s:I, s:s}",
                        "index", (json_int_t)index, "seed", (json_int_t)sp->seed, "kind", st_needle_kind_name(sp->kind),
                        "format", st_needle_format_name(sp->format), "shape", st_needle_shape_name(sp->shape), "family", family, "heldout", heldout,
                        "thinking", sp->thinking == 1, "position_requested", sp->position, "position", np->position,
                        "tokens_requested", (json_int_t)sp->tokens, "tokens", (json_int_t)np->tokens,
                        "needle", np->line, "answer", answer_text, "value", np->value,
                        "needle_byte", (json_int_t)np->needle_byte, "placement", np->placement);
  if (!o) return NULL;
  int64_t n = (int64_t)np->ids.n;
  if (json_object_set_new(o, "needle_span", json_pack("[I, I]", (json_int_t)np->needle_token,
                                                      (json_int_t)np->needle_token_end)) ||
      json_object_set_new(o, "answer_span", json_pack("[I, I]", (json_int_t)n, (json_int_t)(n + (int64_t)answer->n))) ||
      json_object_set_new(o, "ids", ids_array(np->ids.ids, np->ids.n)) ||
      json_object_set_new(o, "answer_ids", ids_array(answer->ids, answer->n)) ||
      (decoys_field && json_object_set_new(o, "decoys", json_integer(np->n_decoys))) ||
      json_object_set(o, "request", np->request)) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* Example i of (seed, split): kind, family, format, thinking, position and length are drawn from
** a stream of (seed, i) alone, so the same arguments give the same bytes. Train: no held-out kind
** or family ever; held-out: every example has a held-out kind or a held-out family (or both). */
static st_status batch_spec(const batch_options *b, uint64_t seed, int64_t i, st_needle_spec *sp) {
  uint64_t r = batch_mix(seed * 0x100000001B3ull ^ batch_mix((uint64_t)i + (b->heldout ? 0x5A5A5A5Aull : 0)));
#define DRAW(n) ((int)((r = batch_mix(r)) % (uint64_t)(n)))
  st_needle_kind kinds[MAX_KIND_LIST];
  int nk = 0;
  if (b->n_kinds) memcpy(kinds, b->kinds, sizeof kinds[0] * (size_t)(nk = b->n_kinds));
  else
    for (int k = 0; k < ST_NEEDLE_KIND_COUNT; k++)
      if (!st_needle_opt_in_kind((st_needle_kind)k) && (b->heldout || !st_needle_heldout_kind((st_needle_kind)k)))
        kinds[nk++] = (st_needle_kind)k;
  sp->kind = kinds[DRAW(nk)];
  int fams[ST_NEEDLE_FAMILY_COUNT], nf = 0;
  int need_heldout_family = b->heldout && !st_needle_heldout_kind(sp->kind);
  for (int f = 0; f < ST_NEEDLE_FAMILY_COUNT; f++) {
    int h = st_needle_heldout_family(f);
    if ((!b->heldout && !h) || (b->heldout && (h || !need_heldout_family))) fams[nf++] = f;
  }
  sp->family = fams[DRAW(nf)];
  sp->format = b->n_formats ? b->formats[DRAW(b->n_formats)] : (st_needle_format)DRAW(ST_NEEDLE_FORMAT_COUNT);
  sp->thinking = DRAW(2);
  sp->render.thinking = sp->thinking;
  sp->position = batch_unit(r = batch_mix(r));
  static const int64_t default_lengths[] = {1024, 2048, 4096};
  sp->tokens = b->n_lengths ? b->lengths[DRAW(b->n_lengths)] : default_lengths[DRAW(3)];
  sp->shape = b->n_shapes ? b->shapes[DRAW(b->n_shapes)] : (st_needle_shape)DRAW(ST_NEEDLE_SHAPE_COUNT);
  sp->seed = seed * 1000003ull + (uint64_t)i + 1;
  /* the decoys' count from a stream of its own: the other fields are drawn as without decoys */
  sp->decoys = b->decoys;
  if (b->decoys_hi > b->decoys) {
    uint64_t d = batch_mix(batch_mix(seed ^ 0xDEC0D15EA5Eull) ^ (uint64_t)i);
    sp->decoys += (int)(d % (uint64_t)(b->decoys_hi - b->decoys + 1));
  }
  /* a composed question in place of the family drawn above, a made-up label (train split only:
  ** cmd_make refuses both with heldout) */
  if (batch_share(seed, 0xC0A905EDull, i, b->composed)) sp->family = ST_NEEDLE_FAMILY_COMPOSED;
  sp->open_label = batch_share(seed, 0x1ABE1ull, i, b->open_labels);
#undef DRAW
  return ST_OK;
}

static int run_batch(const batch_options *b, st_needle_spec *base, st_tokenizer *tok, int quiet) {
  for (int k = 0; !b->heldout && k < b->n_kinds; k++)
    if (st_needle_heldout_kind(b->kinds[k])) {
      fprintf(stderr, "needle make: --kinds names %s, which is held out of --split train (held out: email, env; "
                      "families q5, q6)\n", st_needle_kind_name(b->kinds[k]));
      return 2;
    }
  FILE *f = !strcmp(b->jsonl, "-") ? stdout : fopen(b->jsonl, "wb");
  if (!f) {
    st_fail(ST_EIO, "%s: cannot write the examples", b->jsonl);
    return st_cli_report_error("needle make");
  }
  uint64_t seed = base->seed;
  int rc = 0;
  int64_t outside = 0;
  for (int64_t i = 0; i < b->n; i++) {
    st_needle_spec sp = *base;
    batch_spec(b, seed, i, &sp);
    st_needle_prompt np;
    st_status made = st_needle_make(&sp, &np);
    if (made) {
      st_fail_context(made, "example %lld (kind %s, format %s, shape %s, %lld tokens, seed %llu): ", (long long)i,
                      st_needle_kind_name(sp.kind), st_needle_format_name(sp.format), st_needle_shape_name(sp.shape), (long long)sp.tokens,
                      (unsigned long long)sp.seed);
      rc = st_cli_report_error("needle make");
      break;
    }
    if (!np.within_tolerance) outside++;
    /* the answer the model gives: in thinking mode it closes the thought at once, then the line */
    char answer_text[sizeof np.line + 16];
    snprintf(answer_text, sizeof answer_text, "%s%s", sp.thinking == 1 ? "</think>" : "", np.line);
    st_token_ids answer = {0};
    json_t *line = NULL;
    char *text = NULL;
    if (st_tokenizer_encode(tok, answer_text, strlen(answer_text), 0, &answer) ||
        !(line = batch_line(i, &sp, &np, answer_text, &answer, b->heldout, b->decoys_hi > 0)) ||
        !(text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII)) ||
        fputs(text, f) < 0 || fputc('\n', f) < 0) {
      if (!text && line) st_fail(ST_ENOMEM, "example %lld's line", (long long)i);
      else if (text) st_fail(ST_EIO, "%s: write failed at example %lld", b->jsonl, (long long)i);
      rc = st_cli_report_error("needle make");
    }
    free(text);
    json_decref(line);
    st_token_ids_free(&answer);
    st_needle_prompt_free(&np);
    if (rc) break;
  }
  if (f != stdout ? fclose(f) : fflush(f)) {
    if (!rc) {
      st_fail(ST_EIO, "%s: cannot finish writing", b->jsonl);
      rc = st_cli_report_error("needle make");
    }
  }
  if (!rc && !quiet)
    fprintf(stderr, "needle make: %lld examples (%s split) written to %s; %lld outside 2%% of their target size\n",
            (long long)b->n, b->heldout ? "heldout" : "train", b->jsonl, (long long)outside);
  return rc;
}

/* --NAME N or LO-HI (min <= LO <= HI <= max) into [*lo, *hi], each number read as st_opt_int reads
** one: --decoys, --vocab-tokens. */
static st_status parse_range(const char *name, const char *text, int min, int max, int *lo, int *hi) {
  const char *dash = strchr(text, '-');
  char first[24];
  int64_t a, b;
  if (!dash) {
    if (st_opt_int(name, text, min, max, &a)) goto bad;
    b = a;
  } else {
    if (dash == text || (size_t)(dash - text) >= sizeof first) goto bad;
    memcpy(first, text, (size_t)(dash - text));
    first[dash - text] = 0;
    if (st_opt_int(name, first, min, max, &a) || st_opt_int(name, dash + 1, a, max, &b)) goto bad;
  }
  *lo = (int)a, *hi = (int)b;
  return ST_OK;
bad:
  return st_fail(ST_EINVAL, "--%s '%s': expected N or LO-HI, %d <= LO <= HI <= %d", name, text, min, max);
}

static int cmd_make(int argc, char **argv) {
  st_needle_spec sp;
  st_needle_spec_default(&sp);
  const char *out_path = NULL, *meta_path = NULL;
  batch_options batch = {0};
  const char *have_drawn = NULL; /* an option the batch mode draws itself */
  int have_tokens = 0, have_position = 0, have_seed = 0, have_training_only = 0, c, rc = 2;
  int64_t v;
  st_opts o;
  st_opts_init(&o, &make_spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0) {
    switch (c) {
    case ST_OPT_TOKENS:
      if (parse_count(o.arg, &sp.tokens)) { st_opts_error(&o, "--tokens '%s': expected a count such as 2048 or 2k", o.arg); goto usage; }
      have_tokens = 1;
      break;
    case ST_OPT_POSITION:
      if (parse_fraction(o.arg, &sp.position)) { st_opts_error(&o, "--position '%s': expected a fraction in [0, 1]", o.arg); goto usage; }
      have_position = 1;
      break;
    case ST_OPT_SEED:
      if (st_opt_uint64(o.name, o.arg, &sp.seed)) goto bad_value;
      have_seed = 1;
      break;
    case ST_OPT_KIND:
      if (st_needle_kind_parse(o.arg, &sp.kind)) goto bad_value;
      have_drawn = "--kind";
      break;
    case ST_OPT_FORMAT:
      if (st_needle_format_parse(o.arg, &sp.format)) goto bad_value;
      have_drawn = "--format";
      break;
    case ST_OPT_RENDER:
      if (st_render_profile_parse(o.arg, &sp.render.profile)) goto bad_value;
      break;
    case ST_OPT_THINKING:
      if (on_off(o.arg, &sp.thinking)) { st_opts_error(&o, "--thinking '%s': on or off", o.arg); goto usage; }
      sp.render.thinking = sp.thinking;
      have_drawn = "--thinking";
      break;
    case ST_OPT_MODEL_NAME: sp.model_name = o.arg; break;
    case ST_OPT_MAX_NEW_TOKENS:
      if (st_opt_int(o.name, o.arg, 1, 1000000, &v)) goto bad_value;
      sp.max_tokens = (int)v;
      break;
    case ST_OPT_OUT: out_path = o.arg; break;
    case ST_OPT_META: meta_path = o.arg; break;
    case ST_OPT_BATCH:
      if (st_opt_int(o.name, o.arg, 1, 100000000, &batch.n)) goto bad_value;
      break;
    case ST_OPT_JSONL: batch.jsonl = o.arg; break;
    case ST_OPT_SPLIT:
      if (strcmp(o.arg, "train") && strcmp(o.arg, "heldout")) {
        st_opts_error(&o, "--split '%s': train or heldout", o.arg);
        goto usage;
      }
      batch.heldout = !strcmp(o.arg, "heldout");
      break;
    case ST_OPT_KINDS:
      if ((batch.n_kinds = split_list(o.arg, batch.kinds, sizeof batch.kinds[0], MAX_KIND_LIST, parse_kind_v)) < 1) {
        char list[160];
        int entries = 1;
        for (const char *c = o.arg; *c; c++) entries += *c == ',';
        if (entries > MAX_KIND_LIST)
          st_opts_error(&o, "--kinds: %d entries; at most %d (a kind named twice is drawn twice as often)", entries,
                        MAX_KIND_LIST);
        else
          st_opts_error(&o, "--kinds '%s': expected kinds such as path,url,commit (%s)", o.arg,
                        st_needle_kind_list(list, sizeof list, 1));
        goto usage;
      }
      break;
    case ST_OPT_FORMATS:
      if ((batch.n_formats = split_list(o.arg, batch.formats, sizeof batch.formats[0], ST_NEEDLE_FORMAT_COUNT,
                                        parse_format_v)) < 1) {
        st_opts_error(&o, "--formats '%s': expected anthropic, openai-chat, openai-responses (comma-separated)", o.arg);
        goto usage;
      }
      break;
    case ST_OPT_SHAPE:
      if (st_needle_shape_parse(o.arg, &sp.shape)) goto bad_value;
      have_drawn = "--shape";
      break;
    case ST_OPT_DECOYS:
      if (parse_range("decoys", o.arg, 0, ST_NEEDLE_MAX_DECOYS, &batch.decoys, &batch.decoys_hi)) goto bad_value;
      sp.decoys = batch.decoys;
      break;
    case ST_OPT_COMPOSED:
      if (st_opt_double(o.name, o.arg, 0.0, 1.0, &batch.composed)) goto bad_value;
      have_training_only = 1;
      break;
    case ST_OPT_OPEN_LABELS:
      if (st_opt_double(o.name, o.arg, 0.0, 1.0, &batch.open_labels)) goto bad_value;
      have_training_only = 1;
      break;
    case ST_OPT_VOCAB_TOKENS:
      if (parse_range("vocab-tokens", o.arg, 1, ST_NEEDLE_VOCAB_TOKENS_MAX, &sp.vocab_tokens[0], &sp.vocab_tokens[1]))
        goto bad_value;
      break;
    case ST_OPT_SHAPES:
      if ((batch.n_shapes = split_list(o.arg, batch.shapes, sizeof batch.shapes[0], ST_NEEDLE_SHAPE_COUNT,
                                       parse_shape_v)) < 1) {
        st_opts_error(&o, "--shapes '%s': expected agent, toollist (comma-separated)", o.arg);
        goto usage;
      }
      break;
    case ST_OPT_LENGTHS:
      if ((batch.n_lengths = split_list(o.arg, batch.lengths, sizeof batch.lengths[0], 32, parse_count_v)) < 1) {
        st_opts_error(&o, "--lengths '%s': expected token counts such as 1k,2k,4k", o.arg);
        goto usage;
      }
      break;
    default: st_opts_error(&o, "unexpected argument '%s'", o.arg); goto usage;
    }
  }
  if (c == ST_OPTS_EXIT) {
    rc = o.exit_code;
    goto usage;
  }
  const char *model = o.model;
  int quiet = o.quiet;
  if (batch.n || batch.jsonl) {
    if (!batch.n || !batch.jsonl || !model || !have_seed) {
      st_opts_error(&o, "the batch mode needs --batch N, --jsonl FILE, --model DIR (its tokenizer) and --seed S");
      goto usage;
    }
    if (have_tokens || have_position || have_drawn || out_path || meta_path) {
      st_opts_error(&o, "--batch draws each example's size, position, kind, format and mode itself: use --lengths, "
                        "--kinds, --formats, --shapes, not %s", have_drawn ? have_drawn : have_tokens ? "--tokens"
                        : have_position ? "--position" : out_path ? "--out (--jsonl is the output)" : "--meta");
      goto usage;
    }
    int vocab = 0;
    for (int k = 0; k < batch.n_kinds; k++) vocab |= batch.kinds[k] == ST_NEEDLE_VOCAB;
    if (sp.vocab_tokens[0] && !vocab) {
      st_opts_error(&o, "--vocab-tokens sets the vocab kind's values: name vocab in --kinds");
      goto usage;
    }
    if (batch.heldout && (batch.composed > 0 || batch.open_labels > 0)) {
      st_opts_error(&o, batch.composed > 0 ? "--composed: composed questions are training wordings; --split heldout "
                                             "asks in the held-out families' own"
                                           : "--open-labels: made-up labels are training data; --split heldout "
                                             "keeps its kinds' own labels");
      goto usage;
    }
    st_opts_free(&o);
    st_tokenizer *btok = NULL;
    if (st_cli_open_tokenizer(model, &btok)) return st_cli_report_error("needle make");
    sp.tok = btok;
    rc = run_batch(&batch, &sp, btok, quiet);
    st_tokenizer_close(btok);
    return rc;
  }
  if (batch.n_kinds || batch.n_formats || batch.n_shapes || batch.n_lengths || batch.heldout ||
      batch.decoys_hi > batch.decoys || have_training_only) {
    st_opts_error(&o, "--kinds, --formats, --shapes, --lengths, --split, --composed, --open-labels and --decoys LO-HI "
                      "are for --batch");
    goto usage;
  }
  if (!have_tokens || !have_position || !have_seed) {
    st_opts_error(&o, "--tokens, --position and --seed are required");
    goto usage;
  }
  if (sp.vocab_tokens[0] && sp.kind != ST_NEEDLE_VOCAB) {
    st_opts_error(&o, "--vocab-tokens sets the vocab kind's values: give --kind vocab");
    goto usage;
  }
  if (sp.kind == ST_NEEDLE_VOCAB && !model) {
    st_opts_error(&o, "--kind vocab draws its tokens from the model's tokenizer: give --model DIR");
    goto usage;
  }
  st_opts_free(&o);
  if (out_path && !strcmp(out_path, "-")) out_path = NULL;
  st_tokenizer *tok = NULL;
  if (model && st_cli_open_tokenizer(model, &tok)) return st_cli_report_error("needle make");
  sp.tok = tok;
  st_needle_prompt np;
  if (st_needle_make(&sp, &np)) {
    st_tokenizer_close(tok);
    return st_cli_report_error("needle make");
  }
  rc = 0;
  char *body = json_dumps(np.request, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  if (!body) {
    st_fail(ST_ENOMEM, "request text");
    rc = st_cli_report_error("needle make");
    goto out;
  }
  size_t blen = strlen(body);
  if (out_path) {
    char *with_nl = NULL;
    if (asprintf(&with_nl, "%s\n", body) < 0 || write_text_file(out_path, with_nl, blen + 1)) {
      free(with_nl);
      rc = st_cli_report_error("needle make");
      goto out;
    }
    free(with_nl);
  } else {
    fwrite(body, 1, blen, stdout);
    fputc('\n', stdout);
  }
  if (meta_path) {
    json_t *meta = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:s, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:b,"
                             " s:s, s:i, s:i, s:i, s:s, s:s}",
                             "needle", np.line, "expected", np.value, "label", np.label, "question", np.question,
                             "kind", st_needle_kind_name(sp.kind), "format", st_needle_format_name(sp.format),
                             "seed", (json_int_t)sp.seed, "tokens_requested", (json_int_t)sp.tokens,
                             "tokens_measure", np.measured ? "tokenizer" : "estimate",
                             "position_requested", sp.position, "position", np.position,
                             "tokens", (json_int_t)np.tokens, "prompt_bytes", (json_int_t)np.prompt_len,
                             "needle_byte", (json_int_t)np.needle_byte, "needle_token", (json_int_t)np.needle_token,
                             "needle_token_end", (json_int_t)np.needle_token_end, "within_tolerance",
                             np.within_tolerance, "placement", np.placement, "n_tools", np.n_tools, "n_rounds",
                             np.n_rounds, "filler_lines", np.filler_lines, "render",
                             st_render_profile_name(sp.render.profile), "tokenizer",
                             tok ? st_tokenizer_path(tok) : "");
    json_object_set_new(meta, "min_tokens", json_integer(np.min_tokens));
    json_object_set_new(meta, "shape", json_string(st_needle_shape_name(sp.shape)));
    json_object_set_new(meta, "decoys", json_integer(np.n_decoys));
    if (!meta || json_dump_file(meta, meta_path, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) {
      json_decref(meta);
      st_fail(ST_EIO, "%s: cannot write the metadata", meta_path);
      rc = st_cli_report_error("needle make");
      goto out;
    }
    json_decref(meta);
  }
  if (!np.measured && !quiet)
    fprintf(stderr, "needle make: no tokenizer (--model DIR with tokenizer.json): sizes are estimates at %.2f bytes per token\n",
            ST_NEEDLE_BYTES_PER_TOKEN);
  if (!np.within_tolerance)
    fprintf(stderr, "needle make: warning: the prompt has %lld tokens, not within 2%% of %lld%s\n", (long long)np.tokens,
            (long long)sp.tokens, np.min_tokens > sp.tokens ? " (the smallest request of this shape)" : "");
  if (!quiet)
    fprintf(stderr, "needle: %s\nexpected answer: %s\nprompt: %lld tokens (%s), %zu bytes rendered; needle at token %lld "
            "(%.3f of the prompt, requested %.3f), in the %s; %d tools, %d tool rounds\n",
            np.line, np.value, (long long)np.tokens, np.measured ? "tokenizer" : "estimate", np.prompt_len,
            (long long)np.needle_token, np.position, sp.position, np.placement, np.n_tools, np.n_rounds);
  if (!quiet && sp.decoys)
    fprintf(stderr, "decoys: %d earlier lines of \"%s\" (%d asked for)\n", np.n_decoys, np.label, sp.decoys);
out:
  free(body);
  st_needle_prompt_free(&np);
  st_tokenizer_close(tok);
  return rc;
bad_value:
  st_opts_fail(&o);
usage:
  st_opts_free(&o);
  return rc;
}

/* ---------------------------------------------------------------- sweep */

typedef struct sweep_cli {
  int quiet, json;
} sweep_cli;

static void progress(void *ctx, int done, int total, const st_harness_attempt *a) {
  const sweep_cli *c = ctx;
  if (c->quiet) return;
  fprintf(stderr, "[%d/%d] %lld tokens at %.2f seed %llu: ", done, total, (long long)a->tokens_requested, a->position,
          (unsigned long long)a->seed);
  if (a->error) fprintf(stderr, "ERROR %s\n", a->error);
  else {
    /* the first 80 bytes or so, cut at a character boundary, control characters as spaces */
    char shown[88];
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)(a->answer ? a->answer : ""); *p && n < sizeof shown - 1; p++) {
      if (n >= 80 && (*p & 0xC0) != 0x80) break;
      shown[n++] = (char)(*p < 0x20 || *p == 0x7f ? ' ' : *p);
    }
    shown[n] = 0;
    fprintf(stderr, "%s (%lld tokens, %.1f s) \"%s\"", a->pass ? "pass" : "FAIL", (long long)a->tokens_actual,
            a->seconds, shown);
    if (a->needle_layers)
      fprintf(stderr, "; needle retrieved by %d of %d CSA layers%s%s", a->needle_retrieving, a->needle_layers,
              a->needle_retrieving ? ": " : "", a->needle_retrieving_layers);
    fprintf(stderr, "\n");
  }
}

/* Splits a comma list; each item parsed by the callback. Returns the count or -1. */
static int split_list(const char *list, void *out, size_t elem, int max, int (*parse)(const char *, void *)) {
  char *copy = strdup(list), *save = NULL;
  int n = 0;
  if (!copy) return -1;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    if (n == max || parse(tok, (char *)out + (size_t)n * elem)) { free(copy); return -1; }
    n++;
  }
  free(copy);
  return n;
}

static int parse_count_v(const char *s, void *out) { return parse_count(s, out); }
static int parse_fraction_v(const char *s, void *out) { return parse_fraction(s, out); }

static void print_json(const st_harness_options *o, const st_harness_result *r) {
  json_t *root = json_object();
  json_object_set_new(root, "sweep_id", json_string(r->sweep_id));
  json_object_set_new(root, "target", json_string(r->target));
  json_object_set_new(root, "api", json_string(st_harness_api_name(o->api)));
  json_object_set_new(root, "kind", json_string(st_needle_kind_name(o->kind)));
  json_object_set_new(root, "shape", json_string(st_needle_shape_name(o->shape)));
  json_object_set_new(root, "decoys", json_integer(o->decoys));
  json_object_set_new(root, "vocab_tokens", o->vocab_tokens[0] ? json_pack("[ii]", o->vocab_tokens[0], o->vocab_tokens[1])
                                                               : json_null());
  json_error_t e;
  json_t *settings = json_loads(r->settings_json, 0, &e);
  json_object_set_new(root, "settings", settings ? settings : json_object());
  json_object_set_new(root, "attempts", json_integer(r->n_attempts));
  json_object_set_new(root, "passed", json_integer(r->n_passed));
  json_object_set_new(root, "errors", json_integer(r->n_errors));
  json_t *cells = json_array(), *rows = json_array();
  for (int t = 0; t < o->n_tokens; t++)
    for (int p = 0; p < o->n_positions; p++) {
      int passed = 0, errors = 0, n = 0;
      for (int s = 0; s < o->n_seeds; s++) {
        const st_harness_attempt *a = &r->attempts[(t * o->n_positions + p) * o->n_seeds + s];
        passed += a->pass, errors += a->error != NULL, n++;
      }
      json_array_append_new(cells, json_pack("{s:I, s:f, s:i, s:i, s:i}", "tokens", (json_int_t)o->tokens[t], "position",
                                             o->positions[p], "passed", passed, "attempts", n, "errors", errors));
    }
  for (int i = 0; i < r->n_attempts; i++) {
    const st_harness_attempt *a = &r->attempts[i];
    json_t *row = json_pack("{s:I, s:I, s:I, s:s, s:f, s:f, s:I, s:s, s:s, s:b, s:f}", "attempt_id", (json_int_t)a->attempt_id,
                            "tokens_requested", (json_int_t)a->tokens_requested, "tokens_actual", (json_int_t)a->tokens_actual,
                            "tokens_measure", a->measured ? "tokenizer" : "estimate", "position", a->position,
                            "position_actual", a->position_actual, "seed", (json_int_t)a->seed, "needle", a->needle,
                            "expected", a->expected, "pass", a->pass, "seconds", a->seconds);
    json_object_set_new(row, "answer", a->answer ? json_string(a->answer) : json_null());
    json_object_set_new(row, "error", a->error ? json_string(a->error) : json_null());
    json_object_set_new(row, "run_id", a->run_id[0] ? json_string(a->run_id) : json_null());
    json_object_set_new(row, "tokens_reported", a->tokens_reported >= 0 ? json_integer(a->tokens_reported) : json_null());
    if (a->needle_end > a->needle_start && a->needle_start >= 0)
      json_object_set_new(row, "needle_tokens", json_pack("[I, I]", (json_int_t)a->needle_start, (json_int_t)a->needle_end));
    if (a->needle_layers) { /* the needle verdict: the CSA layers that retrieve the needle */
      json_t *layers = json_array();
      for (const char *p = a->needle_retrieving_layers; *p;) {
        char *end;
        long layer = strtol(p, &end, 10);
        if (end == p) break;
        json_array_append_new(layers, json_integer(layer));
        p = *end == ',' ? end + 1 : end;
      }
      json_object_set_new(row, "needle_layers_retrieving", layers);
      json_object_set_new(row, "needle_layers_judged", json_integer(a->needle_layers));
    }
    json_array_append_new(rows, row);
  }
  json_object_set_new(root, "cells", cells);
  json_object_set_new(root, "attempt_rows", rows);
  char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  if (s) printf("%s\n", s);
  free(s);
  json_decref(root);
}

static void print_table(const st_harness_options *o, const st_harness_result *r, char **token_labels) {
  char request[64] = ""; /* what the sweep asked of each prompt beyond kind and shape */
  int n = 0;
  if (o->vocab_tokens[0]) n = snprintf(request, sizeof request, ", values of %d-%d tokens", o->vocab_tokens[0], o->vocab_tokens[1]);
  if (o->decoys) snprintf(request + n, sizeof request - (size_t)n, ", %d decoys", o->decoys);
  printf("needle sweep %s: %s %s, kind %s%s%s%s, seeds %llu..%llu\n", r->sweep_id,
         o->api == ST_HARNESS_ENGINE ? "engine" : st_harness_api_name(o->api), r->target, st_needle_kind_name(o->kind),
         o->shape != ST_NEEDLE_SHAPE_AGENT ? ", shape " : "", o->shape != ST_NEEDLE_SHAPE_AGENT ? st_needle_shape_name(o->shape) : "",
         request, (unsigned long long)o->first_seed, (unsigned long long)(o->first_seed + (uint64_t)o->n_seeds - 1));
  printf("settings %s\n\n", r->settings_json);
  printf("%-16s", "tokens");
  for (int p = 0; p < o->n_positions; p++) printf("  %6.2f", o->positions[p]);
  printf("  %7s\n", "all");
  int any_error = 0;
  int *col_pass = calloc((size_t)o->n_positions, sizeof(int)), *col_n = calloc((size_t)o->n_positions, sizeof(int));
  int *col_err = calloc((size_t)o->n_positions, sizeof(int));
  for (int t = 0; t < o->n_tokens; t++) {
    int64_t actual = 0, n_actual = 0;
    int row_pass = 0, row_n = 0, row_err = 0;
    char cells[64][16];
    for (int p = 0; p < o->n_positions; p++) {
      int passed = 0, errors = 0, n = 0;
      for (int s = 0; s < o->n_seeds; s++) {
        const st_harness_attempt *a = &r->attempts[(t * o->n_positions + p) * o->n_seeds + s];
        passed += a->pass, errors += a->error != NULL, n++;
        if (a->needle[0]) actual += a->tokens_actual, n_actual++;
      }
      if (p < 64) snprintf(cells[p], sizeof cells[p], "%d/%d%s", passed, n, errors ? "*" : "");
      row_pass += passed, row_n += n, row_err += errors;
      if (col_pass) col_pass[p] += passed, col_n[p] += n, col_err[p] += errors;
    }
    any_error |= row_err > 0;
    char label[64];
    if (n_actual) snprintf(label, sizeof label, "%s (%lld)", token_labels[t], (long long)(actual / n_actual));
    else snprintf(label, sizeof label, "%s", token_labels[t]);
    printf("%-16s", label);
    for (int p = 0; p < o->n_positions; p++) printf("  %6s", p < 64 ? cells[p] : "?");
    char all[32];
    snprintf(all, sizeof all, "%d/%d%s", row_pass, row_n, row_err ? "*" : "");
    printf("  %7s\n", all);
  }
  if (o->n_tokens > 1 && col_pass) {
    printf("%-16s", "all");
    for (int p = 0; p < o->n_positions; p++) {
      char cell[32];
      snprintf(cell, sizeof cell, "%d/%d%s", col_pass[p], col_n[p], col_err[p] ? "*" : "");
      printf("  %6s", cell);
    }
    char all[32];
    snprintf(all, sizeof all, "%d/%d%s", r->n_passed, r->n_attempts, r->n_errors ? "*" : "");
    printf("  %7s\n", all);
  }
  free(col_pass);
  free(col_n);
  free(col_err);
  printf("\n(tokens: requested (mean actual); cells: passed/attempts");
  if (any_error) printf("; * = some attempts could not be made, see the error column");
  printf(")\nstored: %s/index.sqlite, needle_attempts WHERE sweep_id = '%s' (view needle_sweep_cells)\n", o->store,
         r->sweep_id);
}

static int cmd_sweep(int argc, char **argv) {
  st_harness_options o;
  st_harness_options_default(&o);
  int64_t tokens[64] = {2048, 4096, 8192};
  double positions[64] = {0.25, 0.55, 0.8, 0.97};
  char *token_labels[64] = {"2k", "4k", "8k"};
  char *labels_copy = NULL;
  o.n_tokens = 3;
  o.n_positions = 4;
  int have_api = 0, c, rc = 2;
  int64_t v;
  sweep_cli cli = {0};
  char *command_line = NULL;
  st_harness_result res = {0};
  st_opts op;
  st_opts_init(&op, &sweep_spec, argc, argv);
  while ((c = st_opts_next(&op)) > 0) {
    switch (c) {
    case ST_OPT_TOKENIZER: o.tokenizer_dir = op.arg; break;
    case ST_OPT_ENDPOINT: o.endpoint = op.arg; break;
    case ST_OPT_API:
      if (st_harness_api_parse(op.arg, &o.api)) goto bad_value;
      have_api = 1;
      break;
    case ST_OPT_MODEL_NAME: o.model_name = op.arg; break;
    case ST_OPT_TOKENS:
      o.n_tokens = split_list(op.arg, tokens, sizeof tokens[0], 64, parse_count_v);
      if (o.n_tokens < 1) { st_opts_error(&op, "--tokens '%s': expected counts such as 2k,4k,8k", op.arg); goto out; }
      free(labels_copy);
      labels_copy = strdup(op.arg);
      if (!labels_copy) { rc = 1; goto out; }
      {
        int n = 0;
        char *save = NULL;
        for (char *tok = strtok_r(labels_copy, ",", &save); tok && n < 64; tok = strtok_r(NULL, ",", &save))
          token_labels[n++] = tok + strspn(tok, " ");
      }
      break;
    case ST_OPT_SEEDS:
      if (st_opt_int(op.name, op.arg, 1, 10000, &v)) goto bad_value;
      o.n_seeds = (int)v;
      break;
    case ST_OPT_FIRST_SEED:
      if (st_opt_uint64(op.name, op.arg, &o.first_seed)) goto bad_value;
      break;
    case ST_OPT_KIND:
      if (st_needle_kind_parse(op.arg, &o.kind)) goto bad_value;
      break;
    case ST_OPT_VOCAB_TOKENS:
      if (parse_range("vocab-tokens", op.arg, 1, ST_NEEDLE_VOCAB_TOKENS_MAX, &o.vocab_tokens[0], &o.vocab_tokens[1]))
        goto bad_value;
      break;
    case ST_OPT_SHAPE:
      if (st_needle_shape_parse(op.arg, &o.shape)) goto bad_value;
      break;
    case ST_OPT_DECOYS:
      if (st_opt_int(op.name, op.arg, 0, ST_NEEDLE_MAX_DECOYS, &v)) goto bad_value;
      o.decoys = v;
      break;
    case ST_OPT_FORMAT:
      if (st_needle_format_parse(op.arg, &o.format)) goto bad_value;
      break;
    case ST_OPT_RENDER:
      if (st_render_profile_parse(op.arg, &o.render.profile)) goto bad_value;
      break;
    case ST_OPT_THINKING:
      if (!strcmp(op.arg, "server") || !strcmp(op.arg, "default")) o.thinking = -1;
      else if (on_off(op.arg, &o.thinking)) { st_opts_error(&op, "--thinking '%s': on, off or server", op.arg); goto out; }
      break;
    case ST_OPT_MAX_NEW_TOKENS:
      if (st_opt_int(op.name, op.arg, 1, 1000000, &v)) goto bad_value;
      o.max_new = (int)v;
      break;
    case ST_OPT_TAP_POSITIONS: o.tap_positions = op.arg; break;
    case ST_OPT_TIMEOUT:
      if (st_opt_double(op.name, op.arg, 1e-3, 86400.0 * 365, &o.timeout_s)) goto bad_value;
      break;
    default: st_opts_error(&op, "unexpected argument '%s'", op.arg); goto out;
    }
  }
  if (c == ST_OPTS_EXIT) {
    rc = op.exit_code;
    goto out;
  }
  o.model_dir = op.model;
  o.backend = op.backend;
  if (op.store) o.store = op.store;
  cli.json = op.json;
  cli.quiet = op.quiet;
  if (op.positions) {
    o.n_positions = split_list(op.positions, positions, sizeof positions[0], 64, parse_fraction_v);
    if (o.n_positions < 1) {
      st_opts_error(&op, "--positions '%s': expected fractions such as 0.25,0.55,0.8,0.97", op.positions);
      goto out;
    }
  }
  /* a server's --set pairs are labels; the settings they name are recorded when they parse */
  for (int i = 0; i < op.n_sets; i++)
    if (st_settings_set(&o.settings, op.sets[i])) st_clear_error();
  if (!!o.model_dir == !!o.endpoint) {
    st_opts_error(&op, "give either --model DIR (the engine) or --endpoint URL (a server)");
    goto out;
  }
  if (o.vocab_tokens[0] && o.kind != ST_NEEDLE_VOCAB) {
    st_opts_error(&op, "--vocab-tokens sets the vocab kind's values: give --kind vocab");
    goto out;
  }
  if (o.kind == ST_NEEDLE_VOCAB && o.endpoint && !o.tokenizer_dir) {
    st_opts_error(&op, "--kind vocab draws its needles from the served model's vocabulary: give --tokenizer DIR");
    goto out;
  }
  if (o.model_dir) {
    if (have_api) { st_opts_error(&op, "--api is for --endpoint; the engine takes --format"); goto out; }
    o.api = ST_HARNESS_ENGINE;
    /* with the engine every --set must be a real setting */
    st_settings_default(&o.settings);
    for (int i = 0; i < op.n_sets; i++)
      if (st_settings_set(&o.settings, op.sets[i])) goto bad_value;
    if (st_opts_backend_available(o.backend)) {
      rc = st_cli_report_error("needle sweep");
      goto out;
    }
  } else if (!have_api) {
    o.api = ST_HARNESS_OPENAI;
  }
  o.set_args = op.sets;
  o.n_set = op.n_sets;
  o.tokens = tokens;
  o.positions = positions;
  st_opts_apply_threads(op.threads);
  command_line = st_cli_join_args("sparsetrace needle", argc, argv);
  o.command_line = command_line;
  o.progress = progress;
  o.progress_ctx = &cli;
  if (st_harness_sweep(&o, &res)) {
    rc = st_cli_report_error("needle sweep");
    goto out;
  }
  if (cli.json) print_json(&o, &res);
  else print_table(&o, &res, token_labels);
  rc = 0;
  if (res.n_errors) {
    const char *first = "";
    for (int i = 0; i < res.n_attempts; i++)
      if (res.attempts[i].error) { first = res.attempts[i].error; break; }
    fprintf(stderr, "sparsetrace needle sweep: %d of %d attempts could not be made (first: %s)\n", res.n_errors,
            res.n_attempts, first);
    rc = 1;
  }
  goto out;
bad_value:
  st_opts_fail(&op);
out:
  st_opts_free(&op);
  st_harness_result_free(&res);
  free(labels_copy);
  free(command_line);
  return rc;
}

int st_cmd_needle(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    fputs(needle_help, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "make")) return cmd_make(argc - 1, argv + 1);
  if (!strcmp(argv[1], "sweep")) return cmd_sweep(argc - 1, argv + 1);
  fprintf(stderr, "sparsetrace needle: unknown subcommand '%s' (make or sweep)\n\n%s", argv[1], needle_help);
  return 2;
}
