/*
** scoreboard.h — `sparsetrace scoreboard`: one fixed corpus of needle cases against several
** targets, stored per target and case, read back as a matrix and compared with a baseline.
**
** Corpus: a named, versioned definition (schemas/scoreboard-corpora.json, compiled in; or a file
** of the same shape) that expands deterministically into cases: kinds x tokens x positions x
** seeds x formats, in that nesting order. Each case is one request of `needle make`'s generator.
**
** Target: "[LABEL=]SPEC" (LABEL one word, '=' allowed: "rotate=q=engine:rotate=q") where SPEC is
**   engine[:K=V,...]          this build's engine on --model: settings (rotate=q) and backend=NAME
**   binary:PATH[,K=V,...]     another sparsetrace build's engine on --model, same keys
**   http(s)://HOST:PORT[/v1]  a live server; each case goes to the API of its request format
** The label names the target's column; it defaults to the settings ("rotate=q"), "engine", the
** path or the URL.
**
** Store (schemas/migrations/0011_scoreboard.sql): every case a target answers is a needle_attempts
** row (the needle sweep's pass rule, st_harness_answer_passes) plus a scoreboard_results row with
** the distance of a wrong answer, both in one transaction; a case with a result is skipped when
** the scoreboard runs again, so re-running adds targets and resumes interrupted ones. A target
** that cannot be used, or whose every case fails, is marked 'error' with the reason, not dropped.
** Each case is bounded by timeout_s: a server's request, or a binary's run, which is then killed
** and the case stored as not made ("gave no answer within N s"), the next case going on.
**
** Reading: st_scoreboard_read gives the matrix (view scoreboard_cells) and each target's outcome
** per case; st_scoreboard_compare says, per case, what a target fixed and broke against a
** baseline. The printed matrix, --json and the HTML report all use these two.
*/
#ifndef ST_SCOREBOARD_H
#define ST_SCOREBOARD_H

#include <stdint.h>

#include "common/base.h"
#include "engine/text/chat.h"
#include "needle/harness.h"
#include "needle/needle_prompt.h"
#include "recorder/index.h"

#define ST_SCOREBOARD_MAX_AXIS 64   /* values per corpus list */
#define ST_SCOREBOARD_MAX_LABEL 64

/* ---------------------------------------------------------------- corpus */

typedef struct st_scoreboard_case {
  int index;                 /* 0.. in expansion order */
  st_needle_kind kind;
  int64_t tokens;
  double position;
  uint64_t seed;
  st_needle_format format;
} st_scoreboard_case;

typedef struct st_scoreboard_corpus {
  char name[64];
  int version;
  st_render_profile render;
  int thinking;              /* -1 leave it to the server, 0 chat, 1 thinking */
  int max_new;               /* tokens generated / max_tokens per case */
  int n_tokens, n_positions; /* the matrix's axes */
  int64_t tokens[ST_SCOREBOARD_MAX_AXIS];
  double positions[ST_SCOREBOARD_MAX_AXIS];
  int n_cases;
  st_scoreboard_case *cases; /* owned */
} st_scoreboard_corpus;

/* The corpus `name` of a definition text ({"corpora": [...]}); origin names it in messages
** ("schemas/scoreboard-corpora.json"). ST_EFORMAT naming the corpus and field for a bad one,
** ST_ENOTFOUND (listing the names) when there is no such corpus. */
st_status st_scoreboard_corpus_parse(const char *text, const char *origin, const char *name,
                                     st_scoreboard_corpus *out);
/* From the compiled-in schemas/scoreboard-corpora.json, or (path non-NULL) from that file. */
st_status st_scoreboard_corpus_load(const char *path, const char *name, st_scoreboard_corpus *out);
void st_scoreboard_corpus_free(st_scoreboard_corpus *c);

/* ---------------------------------------------------------------- targets */

typedef enum st_scoreboard_target_kind {
  ST_SCOREBOARD_ENGINE = 0,
  ST_SCOREBOARD_SERVER = 1,
  ST_SCOREBOARD_BINARY = 2,
} st_scoreboard_target_kind;

const char *st_scoreboard_target_kind_name(st_scoreboard_target_kind k); /* engine, server, binary */

typedef struct st_scoreboard_target {
  char label[ST_SCOREBOARD_MAX_LABEL];
  char spec[4096];           /* the SPEC part as given */
  st_scoreboard_target_kind kind;
  char url[4096];            /* server */
  char binary[4096];         /* binary */
  char backend[32];          /* engine, binary: "" default */
  int n_sets;
  char sets[ST_HARNESS_MAX_SETS][256]; /* engine, binary: KEY=VALUE settings */
} st_scoreboard_target;

/* Parses "[LABEL=]SPEC" (above). Engine settings are checked against the settings catalogue
** here. ST_EINVAL with the argument named for anything else. */
st_status st_scoreboard_target_parse(const char *arg, st_scoreboard_target *out);

/* ---------------------------------------------------------------- running */

typedef struct st_scoreboard_run_options {
  const char *store;         /* the trace store: index, engine traces */
  const char *model_dir;     /* engine and binary targets */
  const char *tokenizer_dir; /* NULL: the model's */
  const char *model_name;    /* the requests' "model" (NULL: the harness's default) */
  double timeout_s;          /* per case: a server's request, a binary's run (0: 600 s) */
  int retry_errors;          /* 1: run again the cases whose attempt failed */
  const char *command_line;  /* provenance of the engine's runs */
  /* after each case (may be NULL); distance -1 when the attempt failed */
  void (*progress)(void *ctx, const st_scoreboard_target *t, int done, int todo, const st_scoreboard_case *c,
                   const st_harness_attempt *a, int distance);
  void *progress_ctx;
} st_scoreboard_run_options;

typedef struct st_scoreboard_run_summary {
  int cases;                 /* the corpus's */
  int skipped;               /* already answered */
  int ran, passed, errors;   /* this time */
  int failed;                /* 1: the target is marked 'error' (reason in error) */
  char error[1024];
} st_scoreboard_run_summary;

/* Stores the corpus's cases and the targets' rows, checking before anything runs that the corpus
** matches what the store holds under its name and version (ST_EMISMATCH: raise the version) and
** that no label already names another spec (ST_EINVAL). */
st_status st_scoreboard_prepare(const char *store, const st_scoreboard_corpus *c, const st_scoreboard_target *t,
                                int n_targets);

/* Runs the cases of c the target has not answered yet. ST_OK whenever the store could be
** written, whatever the target did (its failure is in s and in scoreboard_targets). */
st_status st_scoreboard_run_target(const st_scoreboard_run_options *o, const st_scoreboard_corpus *c,
                                   const st_scoreboard_target *t, st_scoreboard_run_summary *s);

/* Fewest single-byte insertions, deletions and substitutions that turn some substring of answer
** into expected (approximate substring match): 0 exactly when answer contains expected,
** strlen(expected) at most. */
int st_scoreboard_distance(const char *answer, const char *expected);

/* ---------------------------------------------------------------- reading */

enum { ST_SCOREBOARD_NONE = -1, ST_SCOREBOARD_FAIL = 0, ST_SCOREBOARD_PASS = 1, ST_SCOREBOARD_ERROR = 2 };

typedef struct st_scoreboard_cell {
  int cases, passed, errors, wrong; /* wrong: answered but not passed */
  double mean_distance;      /* of the wrong answers; -1 when none */
} st_scoreboard_cell;

typedef struct st_scoreboard_row {
  char label[ST_SCOREBOARD_MAX_LABEL];
  char spec[4096];
  char kind[16], status[16];
  char *error;               /* owned; NULL when none */
  st_scoreboard_cell total;  /* over every answered case */
  st_scoreboard_cell *cells; /* [t * n_positions + p], the corpus's axes */
  signed char *outcome;      /* [case_index]: ST_SCOREBOARD_NONE / FAIL / PASS / ERROR */
  int *distance;             /* [case_index]: -1 unknown */
} st_scoreboard_row;

typedef struct st_scoreboard {
  char corpus[64];
  int version;
  int n_cases;
  int n_tokens, n_positions;
  int64_t tokens[ST_SCOREBOARD_MAX_AXIS];
  double positions[ST_SCOREBOARD_MAX_AXIS];
  st_scoreboard_case *cases; /* owned, as stored */
  int n_rows;                /* targets, in the order they were first run */
  st_scoreboard_row *rows;
} st_scoreboard;

/* A cell as the matrix shows it (text, JSON and the report page alike): "passed/cases", then
** "~D" (the wrong answers' mean edit distance) when some answer was wrong, "*" when some case
** could not be made; "-" when the cell has no case. */
void st_scoreboard_cell_text(const st_scoreboard_cell *c, char *buf, size_t size);

/* Reads corpus `name` version `version` (version 0: the highest stored) from the index.
** ST_ENOTFOUND when the store holds no such scoreboard. */
st_status st_scoreboard_read(st_index *ix, const char *name, int version, st_scoreboard *out);
void st_scoreboard_free(st_scoreboard *sb);
const st_scoreboard_row *st_scoreboard_row_named(const st_scoreboard *sb, const char *label);

typedef struct st_scoreboard_comparison {
  char baseline[ST_SCOREBOARD_MAX_LABEL], target[ST_SCOREBOARD_MAX_LABEL];
  int compared;              /* cases both answered without an error */
  int baseline_failed, restored; /* of those, the baseline's failures; of them, the target passes */
  int baseline_passed, broken;   /* the baseline's passes; of them, the target fails */
  int not_compared;          /* cases missing or failed to run on either side */
  int *restored_cases, *broken_cases; /* case indices (restored, broken entries; owned) */
} st_scoreboard_comparison;

/* Per case, target against baseline (labels). ST_ENOTFOUND naming a label the board lacks. */
st_status st_scoreboard_compare(const st_scoreboard *sb, const char *baseline, const char *target,
                                st_scoreboard_comparison *out);
/* "rotate=both restores 4 of 4 that trained fails and breaks none of the 8 it passes" (+ the
** cases not compared). */
void st_scoreboard_comparison_sentence(const st_scoreboard_comparison *c, char *buf, size_t size);
void st_scoreboard_comparison_free(st_scoreboard_comparison *c);

#endif
