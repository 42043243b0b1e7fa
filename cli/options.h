/*
** options.h — the one way every sparsetrace subcommand reads its command line (cli/options.c).
**
** One alias table (after curl's src/tool_getparam.c) names every option of every subcommand once:
** its long name, short letter, value and the help line it has unless a subcommand says otherwise.
** A subcommand describes itself with an st_cmd_spec (usage line, prose, the options it takes) and
** loops over st_opts_next(), which
**   - parses the shared options itself into st_opts (--model, --store, --set, --layer-set, --tap,
**     --positions, --json, --threads, --backend, --quiet), checking what can be checked without
**     a model (--threads 1..ST_THREADS_MAX, --backend one of ST_BACKEND_NAMES, KEY=VALUE shapes);
**   - prints --help / -h (generated from the spec: usage, prose, one entry per option) and stops
**     with exit 0;
**   - stops with exit 2 and a message naming the option on an unknown, ambiguous, valueless or
**     malformed option;
**   - returns the subcommand's own options by id (value in o->arg) and every positional argument
**     as ST_OPT_POSITIONAL, in command-line order.
** The rules are the same everywhere: getopt_long in return-in-order mode (options and positional
** arguments mix freely; "--" ends the options), long options may be abbreviated to any unique
** prefix, "--name=value" and "--name value" are the same.
**
** Exit status of every subcommand: 0 success, 1 runtime failure, 2 usage error.
*/
#ifndef ST_OPTIONS_H
#define ST_OPTIONS_H

#include <stdint.h>

#include "common/base.h"

enum { ST_EXIT_OK = 0, ST_EXIT_FAILURE = 1, ST_EXIT_USAGE = 2 };

/* --threads N: 1..ST_THREADS_MAX (OpenMP threads; capture: exchanges at once). Far above any
** machine this runs on, far below what makes libgomp or pthread_create fall over. */
#define ST_THREADS_MAX 1024

/* The compute backends --backend accepts (the engine's registry decides which are built in). */
#define ST_BACKEND_NAMES "cpu-ref, cpu, cuda, hip"

/* Every option of every subcommand. Aliases (other spellings kept so old scripts work) share
** the id of the option they stand for and are not listed in --help. */
typedef enum st_opt_id {
  ST_OPT_POSITIONAL = 1,
  /* shared, parsed into st_opts */
  ST_OPT_MODEL = 256, ST_OPT_STORE, ST_OPT_SET, ST_OPT_LAYER_SET, ST_OPT_TAP, ST_OPT_POSITIONS,
  ST_OPT_JSON, ST_OPT_THREADS, ST_OPT_BACKEND, ST_OPT_QUIET, ST_OPT_HELP,
  /* the same name for the same thing wherever it appears */
  ST_OPT_TRACE, ST_OPT_OUT, ST_OPT_MAX_NEW_TOKENS, ST_OPT_NEEDLE, ST_OPT_NEEDLE_TOKENS,
  ST_OPT_REQUEST, ST_OPT_RENDER, ST_OPT_TOKENS, ST_OPT_KIND, ST_OPT_FORMAT, ST_OPT_THINKING,
  ST_OPT_MODEL_NAME, ST_OPT_API,
  /* run */
  ST_OPT_PROMPT_TOKENS, ST_OPT_IGNORE_EOS, ST_OPT_CHUNK,
  /* replay, bisect */
  ST_OPT_LAYER, ST_OPT_STAGE, ST_OPT_SWEEP, ST_OPT_CONTINUE, ST_OPT_GOOD, ST_OPT_BAD,
  /* diff, inspect */
  ST_OPT_TOLERANCE, ST_OPT_ALL, ST_OPT_PARTIAL,
  /* needle make, needle sweep */
  ST_OPT_POSITION, ST_OPT_SEED, ST_OPT_META, ST_OPT_TOKENIZER, ST_OPT_ENDPOINT, ST_OPT_SEEDS,
  ST_OPT_FIRST_SEED, ST_OPT_TAP_POSITIONS, ST_OPT_TIMEOUT,
  ST_OPT_BATCH, ST_OPT_JSONL, ST_OPT_KINDS, ST_OPT_FORMATS, ST_OPT_LENGTHS, ST_OPT_SPLIT, ST_OPT_SHAPES, ST_OPT_SHAPE, ST_OPT_DECOYS, ST_OPT_COMPOSED, ST_OPT_OPEN_LABELS, ST_OPT_VOCAB_TOKENS,
  /* capture */
  ST_OPT_UPSTREAM, ST_OPT_LISTEN, ST_OPT_UPSTREAM_PROXY, ST_OPT_MAX_BODY, ST_OPT_RECORD_MAX,
  ST_OPT_INLINE_MAX, ST_OPT_CONNECT_TIMEOUT, ST_OPT_IDLE_TIMEOUT, ST_OPT_GRACE, ST_OPT_READY_FILE,
  ST_OPT_ASK_PROMPT_IDS,
  /* requests */
  ST_OPT_LIMIT, ST_OPT_BODY,
  /* query */
  ST_OPT_FULL,
  /* tokenize, render */
  ST_OPT_DECODE, ST_OPT_NO_SPECIAL, ST_OPT_SPLIT_SPECIAL, ST_OPT_SKIP_SPECIAL, ST_OPT_IDS,
  ST_OPT_EFFORT, ST_OPT_EFFORT_TABLE, ST_OPT_DROP_THINKING,
  /* run, store check */
  ST_OPT_FORCE, ST_OPT_REPAIR,
  /* serve */
  ST_OPT_PORT, ST_OPT_QUEUE, ST_OPT_CONTEXT, ST_OPT_SCRIPT_ANSWERS,
  /* import */
  ST_OPT_PICKLE, ST_OPT_MAP,
  /* scoreboard */
  ST_OPT_CORPUS, ST_OPT_CORPUS_FILE, ST_OPT_TARGET, ST_OPT_BASELINE, ST_OPT_RETRY_ERRORS,
  ST_OPT_ID_END
} st_opt_id;

/* One option a subcommand takes; metavar and help replace the table's when non-NULL. help may
** span lines ('\n'); --help indents the continuation lines under the first. */
typedef struct st_opt_use {
  int id;
  const char *metavar;
  const char *help;
} st_opt_use;

/* A subcommand's command line. --help prints "usage: " usage, about, the options (in the order
** given, then -h, --help), epilogue. */
typedef struct st_cmd_spec {
  const char *name;        /* "replay", "needle sweep": message prefix "sparsetrace <name>: " */
  const char *usage;       /* "sparsetrace replay --trace T.h5 ... [options]\n" (lines) */
  const char *about;       /* prose, or NULL */
  const st_opt_use *opts;  /* ends with {0} */
  const char *epilogue;    /* after the options (value syntax, exit status), or NULL */
} st_cmd_spec;

typedef struct st_opts {
  /* the shared options, as given (NULL / 0 when absent) */
  const char *model, *store, *positions, *backend;
  const char **sets;       /* --set KEY=VALUE, in order */
  int n_sets;
  const char **layer_sets; /* --layer-set L[,L..]:KEY=VALUE */
  int n_layer_sets;
  const char **taps;       /* --tap GLOB */
  int n_taps;
  int json, quiet;
  int threads;             /* 0: not given */
  /* the option st_opts_next just returned */
  const char *arg;         /* its value, or the positional argument */
  const char *name;        /* its long name ("layer"), NULL for a positional argument */
  int exit_code;           /* when st_opts_next returns ST_OPTS_EXIT: 0 after --help, else 1 or 2 */
  /* parser state */
  const st_cmd_spec *spec;
  int argc, rest;
  char **argv;
  int done;
  void *state;
} st_opts;

enum { ST_OPTS_DONE = 0, ST_OPTS_EXIT = -1 };

/* Starts parsing argv[1..argc) (argv[0] is the subcommand's name). Pair with st_opts_free. */
void st_opts_init(st_opts *o, const st_cmd_spec *spec, int argc, char **argv);

/* The next option of the subcommand's own (an st_opt_id, value in o->arg), ST_OPT_POSITIONAL,
** ST_OPTS_DONE at the end, or ST_OPTS_EXIT when the subcommand must return o->exit_code now
** (help printed; or a usage error printed). */
int st_opts_next(st_opts *o);

void st_opts_free(st_opts *o);

/* Prints "sparsetrace <cmd>: <message>" and the --help hint to stderr; returns 2 (and sets
** o->exit_code). st_opts_fail prints st_errmsg(). */
int st_opts_error(st_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int st_opts_fail(st_opts *o);

/* Prints the spec's help to stdout. */
void st_opts_help(const st_cmd_spec *spec);

/* --threads (0: not given) for OpenMP; returns the threads the engine will use. */
int st_opts_apply_threads(int threads);

/* Until the engine's backend registry (st_backend_open) is wired to --backend: ST_OK for NULL and
** "cpu-ref", else ST_EUNSUPPORTED naming the backend (a runtime error: exit 1). */
st_status st_opts_backend_available(const char *backend);

/* Value parsers. Each rejects an empty value, trailing characters, overflow and values outside
** [lo, hi], with a message that names the option ("--layer '4294967297': expected an integer
** from 0 to 65535"); name is the long name without dashes. */
st_status st_opt_int(const char *name, const char *text, int64_t lo, int64_t hi, int64_t *out);
st_status st_opt_uint64(const char *name, const char *text, uint64_t *out);
st_status st_opt_double(const char *name, const char *text, double lo, double hi, double *out);
/* A token span "A:B", 0 <= A < B. */
st_status st_opt_span(const char *name, const char *text, int64_t *start, int64_t *end);

#endif
