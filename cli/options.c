/*
** options.c — the command line of every subcommand: one alias table, one getopt_long convention,
** one --help format, one exit status per kind of outcome (cli/options.h says what the caller
** sees).
**
** The table is the single list of option names. A subcommand picks ids from it, so one name
** cannot mean two options; an alias is a second row with the same id. From the picked rows
** st_opts_init builds the getopt_long arrays: "-:" (return positional arguments in order, report a
** missing value as ':') followed by the short letters. optind is reset to 0, which makes glibc
** re-initialise getopt completely (its scan position inside a cluster of short options and the
** ordering mode read from the option string): a subcommand may be the second parse in a process,
** as in tests that call several, and "needle" parses once for itself and once for "make".
** opterr is 0: the messages are ours, they name the option and end with the --help hint.
*/
#include "options.h"

#include "kernels/backend.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct alias {
  const char *name;    /* long name, without "--" */
  char letter;         /* short option, 0 for none */
  int has_value;
  int id;
  int is_alias;        /* another spelling of the row before with the same id: not in --help */
  const char *metavar;
  const char *help;
} alias;

static const alias aliases[] = {
  {"model", 0, 1, ST_OPT_MODEL, 0, "DIR", "checkpoint directory (config.json, safetensors, tokenizer.json)"},
  {"store", 0, 1, ST_OPT_STORE, 0, "DIR", "trace store holding index.sqlite (default ./traces)"},
  {"set", 0, 1, ST_OPT_SET, 0, "KEY=VALUE", "engine setting (repeatable; 'sparsetrace settings' lists them)"},
  {"layer-set", 0, 1, ST_OPT_LAYER_SET, 0, "L[,L..]:KEY=VALUE", "a setting for the listed layers only (repeatable)"},
  {"tap", 0, 1, ST_OPT_TAP, 0, "GLOB", "taps whose names match (repeatable; 'sparsetrace taps' lists them)"},
  {"positions", 0, 1, ST_OPT_POSITIONS, 0, "SPEC", "token positions kept for armed taps: all | last | A:B"},
  {"json", 0, 0, ST_OPT_JSON, 0, NULL, "print the result as JSON"},
  {"threads", 0, 1, ST_OPT_THREADS, 0, "N", "OpenMP threads, 1..1024 (results are identical for any N)"},
  {"backend", 0, 1, ST_OPT_BACKEND, 0, "NAME", "compute backend: cpu (default), cpu-ref, cuda, hip"},
  {"quiet", 'q', 0, ST_OPT_QUIET, 0, NULL, "no progress or summary lines on stderr"},
  {"help", 'h', 0, ST_OPT_HELP, 0, NULL, "this text"},

  {"trace", 0, 1, ST_OPT_TRACE, 0, "T.h5", "the recorded trace"},
  {"out", 'o', 1, ST_OPT_OUT, 0, "FILE", "where to write the output ('-': standard output)"},
  {"output", 0, 1, ST_OPT_OUT, 1, NULL, NULL},
  {"max-new-tokens", 0, 1, ST_OPT_MAX_NEW_TOKENS, 0, "N", "greedy tokens to generate after the prompt"},
  {"max-tokens", 0, 1, ST_OPT_MAX_NEW_TOKENS, 1, NULL, NULL},
  {"needle", 0, 1, ST_OPT_NEEDLE, 0, "TEXT", "the needle's text, found in the tokens with the model's tokenizer"},
  {"needle-tokens", 0, 1, ST_OPT_NEEDLE_TOKENS, 0, "A:B", "the needle's token span [A, B)"},
  {"request", 0, 1, ST_OPT_REQUEST, 0, "FILE.json", "the request"},
  {"render", 0, 1, ST_OPT_RENDER, 0, "PROFILE", "reference (default), sglang, vllm or atom"},
  {"tokens", 0, 1, ST_OPT_TOKENS, 0, "N", "prompt size in tokens (2048, 2k, 1.5k; k = 1024)"},
  {"kind", 0, 1, ST_OPT_KIND, 0, "K", "needle kind: path (default), host, key, number"},
  {"format", 0, 1, ST_OPT_FORMAT, 0, "F", "request format: anthropic, openai-chat, openai-responses"},
  {"thinking", 0, 1, ST_OPT_THINKING, 0, "on|off", "thinking or chat mode"},
  {"model-name", 0, 1, ST_OPT_MODEL_NAME, 0, "NAME", "the request's \"model\""},
  {"api", 0, 1, ST_OPT_API, 0, "A", "the request API"},

  {"prompt-tokens", 0, 1, ST_OPT_PROMPT_TOKENS, 0, "FILE", "JSON array of token ids ('-' reads stdin)"},
  {"ignore-eos", 0, 0, ST_OPT_IGNORE_EOS, 0, NULL, "keep generating after the end-of-sequence token"},
  {"chunk", 0, 1, ST_OPT_CHUNK, 0, "N", "tokens per internal prefill chunk"},

  {"layer", 0, 1, ST_OPT_LAYER, 0, "N", "the layer"},
  {"stage", 0, 1, ST_OPT_STAGE, 0, "STAGE", "indexer, attention, layer or rest"},
  {"sweep", 0, 1, ST_OPT_SWEEP, 0, "KEY=V1,V2,...", "one cell per value (repeatable: the cross product)"},
  {"continue", 0, 1, ST_OPT_CONTINUE, 0, "N", "greedy tokens to generate after the replay"},
  {"good", 0, 1, ST_OPT_GOOD, 0, "K=V,...", "the settings that keep the needle"},
  {"bad", 0, 1, ST_OPT_BAD, 0, "K=V,...", "the settings that lose it"},

  {"tolerance", 0, 1, ST_OPT_TOLERANCE, 0, "RULES", "per-tap rules (repeatable)"},
  {"all", 0, 0, ST_OPT_ALL, 0, NULL, "compare every tap"},
  {"partial", 0, 0, ST_OPT_PARTIAL, 0, NULL, "open an unfinished recording"},

  {"position", 0, 1, ST_OPT_POSITION, 0, "P", "where the needle goes, a fraction of the prompt in [0, 1]"},
  {"seed", 0, 1, ST_OPT_SEED, 0, "S", "seed"},
  {"meta", 0, 1, ST_OPT_META, 0, "FILE", "write the needle's metadata as JSON there"},
  {"tokenizer", 0, 1, ST_OPT_TOKENIZER, 0, "DIR", "tokenizer.json to use"},
  {"endpoint", 0, 1, ST_OPT_ENDPOINT, 0, "URL", "server base URL"},
  {"seeds", 0, 1, ST_OPT_SEEDS, 0, "N", "seeds per cell"},
  {"first-seed", 0, 1, ST_OPT_FIRST_SEED, 0, "S", "the first seed"},
  {"tap-positions", 0, 1, ST_OPT_TAP_POSITIONS, 0, "SPEC", "positions recorded for the taps"},
  {"timeout", 0, 1, ST_OPT_TIMEOUT, 0, "S", "seconds per request"},
  {"batch", 0, 1, ST_OPT_BATCH, 0, "N", "write N examples"},
  {"jsonl", 0, 1, ST_OPT_JSONL, 0, "FILE", "write one JSON line per example there"},
  {"kinds", 0, 1, ST_OPT_KINDS, 0, "LIST", "needle kinds to draw from"},
  {"formats", 0, 1, ST_OPT_FORMATS, 0, "LIST", "request formats to draw from"},
  {"lengths", 0, 1, ST_OPT_LENGTHS, 0, "LIST", "prompt sizes to draw from"},
  {"split", 0, 1, ST_OPT_SPLIT, 0, "train|heldout", "which split of the data"},
  {"decoys", 0, 1, ST_OPT_DECOYS, 0, "N", "earlier lines of the needle's label; the last is asked for"},
  {"open-labels", 0, 1, ST_OPT_OPEN_LABELS, 0, "SHARE", "share of examples with a made-up label"},
  {"composed", 0, 1, ST_OPT_COMPOSED, 0, "SHARE", "share of examples asking a composed question"},
  {"vocab-tokens", 0, 1, ST_OPT_VOCAB_TOKENS, 0, "LO-HI", "the vocab kind's value length in tokens"},
  {"shapes", 0, 1, ST_OPT_SHAPES, 0, "LIST", "request shapes to draw from"},
  {"shape", 0, 1, ST_OPT_SHAPE, 0, "S", "request shape: agent (default) or toollist"},

  {"upstream", 0, 1, ST_OPT_UPSTREAM, 0, "URL", "the real server"},
  {"listen", 0, 1, ST_OPT_LISTEN, 0, "HOST:PORT", "where to listen"},
  {"upstream-proxy", 0, 1, ST_OPT_UPSTREAM_PROXY, 0, "URL", "reach the upstream through this HTTP proxy"},
  {"max-body", 0, 1, ST_OPT_MAX_BODY, 0, "SIZE", "larger request bodies get 413"},
  {"record-max", 0, 1, ST_OPT_RECORD_MAX, 0, "SIZE", "response bytes recorded per request"},
  {"inline-max", 0, 1, ST_OPT_INLINE_MAX, 0, "SIZE", "bodies above this are stored in files"},
  {"connect-timeout", 0, 1, ST_OPT_CONNECT_TIMEOUT, 0, "S", "upstream connect timeout in seconds"},
  {"idle-timeout", 0, 1, ST_OPT_IDLE_TIMEOUT, 0, "S", "upstream idle timeout in seconds"},
  {"grace", 0, 1, ST_OPT_GRACE, 0, "S", "seconds in-flight exchanges get on SIGINT/SIGTERM"},
  {"ready-file", 0, 1, ST_OPT_READY_FILE, 0, "FILE", "once listening, write the proxy's URL to FILE"},
  {"ask-prompt-ids", 0, 1, ST_OPT_ASK_PROMPT_IDS, 0, "ENGINE", "sglang | vllm"},

  {"limit", 0, 1, ST_OPT_LIMIT, 0, "N", "at most N"},
  {"body", 0, 0, ST_OPT_BODY, 0, NULL, "print request and response bodies too"},
  {"full", 0, 0, ST_OPT_FULL, 0, NULL, "never cut long cells"},
  {"no-truncate", 0, 0, ST_OPT_FULL, 1, NULL, NULL},

  {"decode", 0, 0, ST_OPT_DECODE, 0, NULL, "ids -> text"},
  {"no-special", 0, 0, ST_OPT_NO_SPECIAL, 0, NULL, "do not add BOS/EOS"},
  {"split-special", 0, 0, ST_OPT_SPLIT_SPECIAL, 0, NULL, "special-token strings in the text are plain text"},
  {"skip-special", 0, 0, ST_OPT_SKIP_SPECIAL, 0, NULL, "decode: leave out special tokens"},
  {"ids", 0, 0, ST_OPT_IDS, 0, NULL, "print the prompt's token ids"},
  {"effort", 0, 1, ST_OPT_EFFORT, 0, "E", "force reasoning_effort"},
  {"effort-table", 0, 1, ST_OPT_EFFORT_TABLE, 0, "T", "legacy or 0731"},
  {"drop-thinking", 0, 1, ST_OPT_DROP_THINKING, 0, "on|off", "the encoder's drop_thinking"},

  {"force", 0, 0, ST_OPT_FORCE, 0, NULL, "overwrite on purpose"},
  {"repair", 0, 0, ST_OPT_REPAIR, 0, NULL, "fix what is found"},
  {"pickle", 0, 0, ST_OPT_PICKLE, 0, NULL, "the file is a bare pickle, not a torch.save archive"},
  {"map", 0, 1, ST_OPT_MAP, 0, "FILE", "source-name-to-tap table replacing the format's own"},

  {"port", 0, 1, ST_OPT_PORT, 0, "N", "port to listen on (0: a free one)"},
  {"queue", 0, 1, ST_OPT_QUEUE, 0, "N", "requests that may wait for the engine"},
  {"context", 0, 1, ST_OPT_CONTEXT, 0, "N", "most tokens per request, prompt and answer"},
  {"script-answers", 0, 1, ST_OPT_SCRIPT_ANSWERS, 0, "FILE", "test setting: answers in turn from a JSON array of strings"},

  {"corpus", 0, 1, ST_OPT_CORPUS, 0, "NAME", "a corpus of schemas/scoreboard-corpora.json"},
  {"corpus-file", 0, 1, ST_OPT_CORPUS_FILE, 0, "FILE", "read the corpus from FILE (same shape)"},
  {"target", 0, 1, ST_OPT_TARGET, 0, "[LABEL=]SPEC", "a target to run (repeatable)"},
  {"baseline", 0, 1, ST_OPT_BASELINE, 0, "LABEL", "the target the others are compared with"},
  {"retry-errors", 0, 0, ST_OPT_RETRY_ERRORS, 0, NULL, "run again the cases that could not be made"},
};
#define N_ALIASES (int)(sizeof aliases / sizeof aliases[0])

/* ST_BACKEND_DEVEMU is accepted too, but not advertised (a debugging backend: kernels/backend.h). */
static const char *const backend_names[] = {"cpu-ref", "cpu", "cuda", "hip", ST_BACKEND_DEVEMU};

/* What st_opts_init builds from the spec. */
typedef struct parser {
  struct option longopts[N_ALIASES + 1];
  int row[N_ALIASES + 1];   /* longopts[i] is aliases[row[i]] */
  int n;
  char shortopts[2 * N_ALIASES + 4];
} parser;

static const alias *row_of(int id) {
  for (int i = 0; i < N_ALIASES; i++)
    if (aliases[i].id == id && !aliases[i].is_alias) return &aliases[i];
  return NULL;
}

static int spec_takes(const st_cmd_spec *spec, int id) {
  if (id == ST_OPT_HELP) return 1;
  for (const st_opt_use *u = spec->opts; u && u->id; u++)
    if (u->id == id) return 1;
  return 0;
}

void st_opts_init(st_opts *o, const st_cmd_spec *spec, int argc, char **argv) {
  memset(o, 0, sizeof *o);
  o->spec = spec;
  o->argc = argc;
  o->argv = argv;
  size_t n = (size_t)(argc > 0 ? argc : 0) + 1;
  o->sets = calloc(n, sizeof *o->sets);
  o->layer_sets = calloc(n, sizeof *o->layer_sets);
  o->taps = calloc(n, sizeof *o->taps);
  parser *p = calloc(1, sizeof *p);
  o->state = p;
  if (!p) return;
  char *s = p->shortopts;
  *s++ = '-';
  *s++ = ':';
  for (int i = 0; i < N_ALIASES; i++) {
    if (!spec_takes(spec, aliases[i].id)) continue;
    p->longopts[p->n] = (struct option){aliases[i].name, aliases[i].has_value ? required_argument : no_argument,
                                        NULL, aliases[i].id};
    p->row[p->n++] = i;
    if (aliases[i].letter) {
      *s++ = aliases[i].letter;
      if (aliases[i].has_value) *s++ = ':';
    }
  }
  *s = 0;
}

void st_opts_free(st_opts *o) {
  free(o->sets);
  free(o->layer_sets);
  free(o->taps);
  free(o->state);
  o->sets = o->layer_sets = o->taps = NULL;
  o->state = NULL;
}

int st_opts_error(st_opts *o, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "sparsetrace %s: ", o->spec->name);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n(sparsetrace %s --help lists the options)\n", o->spec->name);
  o->exit_code = ST_EXIT_USAGE;
  return ST_EXIT_USAGE;
}

int st_opts_fail(st_opts *o) { return st_opts_error(o, "%s", st_errmsg()); }

/* ---------------------------------------------------------------- help */

#define HELP_COLUMN 26

static void print_option(const alias *a, const st_opt_use *u) {
  const char *metavar = u && u->metavar ? u->metavar : a->metavar;
  const char *help = u && u->help ? u->help : a->help;
  /* "  -o, --out FILE" or "  --model DIR", then the help at HELP_COLUMN (on the next line when
  ** the head reaches it) */
  char head[128], letter[8] = "";
  if (a->letter) snprintf(letter, sizeof letter, "-%c, ", a->letter);
  int n = snprintf(head, sizeof head, "  %s--%s%s%s", letter, a->name, a->has_value ? " " : "",
                   a->has_value ? metavar : "");
  fputs(head, stdout);
  if (n + 1 >= HELP_COLUMN) printf("\n%*s", HELP_COLUMN, "");
  else printf("%*s", HELP_COLUMN - n, "");
  for (const char *line = help; *line;) {
    const char *nl = strchr(line, '\n');
    size_t len = nl ? (size_t)(nl - line) : strlen(line);
    printf("%.*s\n", (int)len, line);
    if (!nl || !nl[1]) break;
    line = nl + 1;
    printf("%*s", HELP_COLUMN, "");
  }
}

void st_opts_help(const st_cmd_spec *spec) {
  printf("usage: %s", spec->usage);
  if (spec->about) printf("\n%s", spec->about);
  printf("\noptions:\n");
  for (const st_opt_use *u = spec->opts; u && u->id; u++) {
    const alias *a = row_of(u->id);
    if (a) print_option(a, u);
  }
  print_option(row_of(ST_OPT_HELP), NULL);
  if (spec->epilogue) printf("\n%s", spec->epilogue);
}

/* ---------------------------------------------------------------- parsing */

/* Why getopt_long refused argv element `text`: a message naming the option. */
static int refuse(st_opts *o, const parser *p, const char *text, int missing) {
  if (missing) return st_opts_error(o, "option '%s' needs a value", text);
  if (strncmp(text, "--", 2)) return st_opts_error(o, "unknown option '%s'", text);
  const char *name = text + 2, *eq = strchr(name, '=');
  size_t len = eq ? (size_t)(eq - name) : strlen(name);
  int matches = 0, exact = -1;
  char list[512] = "";
  for (int i = 0; i < p->n; i++) {
    const char *cand = p->longopts[i].name;
    if (strncmp(cand, name, len)) continue;
    if (strlen(cand) == len) exact = i;
    if (matches < 8) snprintf(list + strlen(list), sizeof list - strlen(list), "%s--%s", matches ? ", " : "", cand);
    matches++;
  }
  if (exact >= 0 && eq) return st_opts_error(o, "option '--%.*s' takes no value", (int)len, name);
  if (matches > 1) return st_opts_error(o, "ambiguous option '%s' (%s)", text, list);
  for (int i = 0; i < N_ALIASES; i++)
    if (strlen(aliases[i].name) == len && !strncmp(aliases[i].name, name, len))
      return st_opts_error(o, "unknown option '%s' (%s takes no --%s)", text, o->spec->name, aliases[i].name);
  return st_opts_error(o, "unknown option '%s'", text);
}

/* "L[,L..]:KEY=VALUE": the layers are checked against the model later. */
static st_status check_layer_set(const char *text) {
  const char *colon = strchr(text, ':');
  if (!colon || colon == text || !strchr(colon + 1, '=') || colon[1] == '=')
    return st_fail(ST_EINVAL, "--layer-set '%s': expected LAYERS:KEY=VALUE, e.g. 3:rotate=q or 2,3:topk=8", text);
  for (const char *q = text; q < colon;) {
    const char *comma = memchr(q, ',', (size_t)(colon - q));
    const char *end = comma ? comma : colon;
    char layer[32];
    int64_t v;
    if (end - q <= 0 || end - q >= (long)sizeof layer)
      return st_fail(ST_EINVAL, "--layer-set '%s': expected LAYERS:KEY=VALUE, e.g. 3:rotate=q or 2,3:topk=8", text);
    memcpy(layer, q, (size_t)(end - q));
    layer[end - q] = 0;
    if (st_opt_int("layer-set", layer, 0, 65535, &v))
      return st_fail(ST_EINVAL, "--layer-set '%s': '%s' is not a layer number (0 to 65535)", text, layer);
    q = comma ? comma + 1 : colon;
  }
  return ST_OK;
}

/* Parses a shared option into o; 0, or a usage error's exit code. */
static int take_shared(st_opts *o, int id, const char *arg) {
  int64_t v;
  switch (id) {
  case ST_OPT_MODEL: o->model = arg; return 0;
  case ST_OPT_STORE: o->store = arg; return 0;
  case ST_OPT_POSITIONS: o->positions = arg; return 0;
  case ST_OPT_JSON: o->json = 1; return 0;
  case ST_OPT_QUIET: o->quiet = 1; return 0;
  case ST_OPT_TAP: o->taps[o->n_taps++] = arg; return 0;
  case ST_OPT_SET:
    if (!strchr(arg, '=') || arg[0] == '=') return st_opts_error(o, "--set '%s': expected KEY=VALUE", arg);
    o->sets[o->n_sets++] = arg;
    return 0;
  case ST_OPT_LAYER_SET:
    if (check_layer_set(arg)) return st_opts_fail(o);
    o->layer_sets[o->n_layer_sets++] = arg;
    return 0;
  case ST_OPT_THREADS:
    if (st_opt_int("threads", arg, 1, ST_THREADS_MAX, &v)) return st_opts_fail(o);
    o->threads = (int)v;
    return 0;
  case ST_OPT_BACKEND:
    for (size_t i = 0; i < sizeof backend_names / sizeof backend_names[0]; i++)
      if (!strcmp(arg, backend_names[i])) {
        o->backend = backend_names[i];
        return 0;
      }
    return st_opts_error(o, "--backend '%s': expected one of %s", arg, ST_BACKEND_NAMES);
  }
  return -1;
}

static int is_shared(int id) { return id >= ST_OPT_MODEL && id < ST_OPT_HELP; }

int st_opts_next(st_opts *o) {
  parser *p = o->state;
  o->arg = o->name = NULL;
  if (o->exit_code) return ST_OPTS_EXIT;
  if (!p || !o->sets || !o->layer_sets || !o->taps) {
    fprintf(stderr, "sparsetrace %s: out of memory\n", o->spec->name);
    o->exit_code = ST_EXIT_FAILURE;
    return ST_OPTS_EXIT;
  }
  if (o->done) { /* after "--": the rest are positional */
    if (o->rest >= o->argc) return ST_OPTS_DONE;
    o->arg = o->argv[o->rest++];
    return ST_OPT_POSITIONAL;
  }
  if (!o->rest) { /* the first call */
    optind = 0;
    opterr = 0;
    o->rest = 1;
  }
  for (;;) {
    int index = -1;
    int c = getopt_long(o->argc, o->argv, p->shortopts, p->longopts, &index);
    if (c == -1) {
      o->done = 1;
      o->rest = optind;
      return st_opts_next(o);
    }
    if (c == 1) {
      o->arg = optarg;
      return ST_OPT_POSITIONAL;
    }
    if (c == '?' || c == ':') { /* optopt: a short option's letter; a long one's id, or 0 */
      if (optopt > 0 && optopt < 256) {
        char text[3] = {'-', (char)optopt, 0};
        refuse(o, p, text, c == ':');
      } else {
        refuse(o, p, optind >= 1 && optind - 1 < o->argc ? o->argv[optind - 1] : "?", c == ':');
      }
      return ST_OPTS_EXIT;
    }
    const alias *a = NULL;
    if (index >= 0) a = &aliases[p->row[index]];
    else
      for (int i = 0; i < p->n; i++)
        if (aliases[p->row[i]].letter == c) a = &aliases[p->row[i]];
    if (!a) { /* cannot happen: getopt returns only what it was given */
      o->exit_code = st_opts_error(o, "unknown option '%c'", c);
      return ST_OPTS_EXIT;
    }
    if (a->id == ST_OPT_HELP) {
      st_opts_help(o->spec);
      o->exit_code = ST_EXIT_OK;
      return ST_OPTS_EXIT;
    }
    if (is_shared(a->id)) {
      if (take_shared(o, a->id, optarg)) return ST_OPTS_EXIT;
      continue;
    }
    o->arg = optarg;
    o->name = row_of(a->id)->name;
    return a->id;
  }
}

int st_opts_apply_threads(int threads) {
#ifdef _OPENMP
  if (threads) omp_set_num_threads(threads);
  return omp_get_max_threads();
#else
  (void)threads;
  return 1;
#endif
}

st_status st_opts_backend_available(const char *backend) {
  st_backend b;
  st_status rc = st_backend_open(backend ? backend : ST_BACKEND_DEFAULT, &b);
  if (rc) return st_fail_context(rc, "--backend %s: ", backend ? backend : ST_BACKEND_DEFAULT);
  st_backend_close(&b);
  return ST_OK;
}

/* ---------------------------------------------------------------- values */

st_status st_opt_int(const char *name, const char *text, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (end == text || *end || errno == ERANGE || v < lo || v > hi || !*text || text[0] == ' ')
    return st_fail(ST_EINVAL, "--%s '%s': expected an integer from %lld to %lld", name, text, (long long)lo,
                   (long long)hi);
  *out = v;
  return ST_OK;
}

st_status st_opt_uint64(const char *name, const char *text, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (end == text || *end || errno == ERANGE || text[0] < '0' || text[0] > '9')
    return st_fail(ST_EINVAL, "--%s '%s': expected an integer from 0 to %llu", name, text, (unsigned long long)UINT64_MAX);
  *out = v;
  return ST_OK;
}

st_status st_opt_double(const char *name, const char *text, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || *end || errno == ERANGE || !(v >= lo && v <= hi) || text[0] == ' ')
    return st_fail(ST_EINVAL, "--%s '%s': expected a number from %g to %g", name, text, lo, hi);
  *out = v;
  return ST_OK;
}

st_status st_opt_span(const char *name, const char *text, int64_t *start, int64_t *end) {
  const char *colon = strchr(text, ':');
  char first[32];
  int64_t a, b;
  if (!colon || colon == text || (size_t)(colon - text) >= sizeof first) goto bad;
  memcpy(first, text, (size_t)(colon - text));
  first[colon - text] = 0;
  if (st_opt_int(name, first, 0, INT64_MAX - 1, &a) || st_opt_int(name, colon + 1, 1, INT64_MAX, &b) || b <= a)
    goto bad;
  *start = a;
  *end = b;
  return ST_OK;
bad:
  return st_fail(ST_EINVAL, "--%s '%s': expected A:B with 0 <= A < B", name, text);
}
