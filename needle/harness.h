/*
** harness.h — the needle sweep: a grid of context lengths × needle positions × seeds, each cell
** one recall attempt, run through the reference engine or sent to a live OpenAI/Anthropic-style
** server; every attempt is stored in the index (table needle_attempts, view needle_sweep_cells).
**
** Engine: the request (needle/needle_prompt.h) is rendered with the DeepSeek-V4 encoding and
** tokenised with the model's tokenizer, run greedily with the indexer taps armed and recorded as a
** trace like `sparsetrace run` does; the needle's token span goes into needles/needle_verdicts, so
** a failing cell is one `sparsetrace replay --trace` away. The continuation is decoded and passes
** when it contains the needle's value verbatim.
**
** Server: the request is POSTed (libcurl, non-streaming, temperature 0) to /v1/messages,
** /v1/chat/completions or /v1/responses; the answer's text is judged the same way. The API key
** comes from $ST_API_KEY, else $ANTHROPIC_API_KEY or $OPENAI_API_KEY.
**
** An attempt that fails (HTTP error, render error, vocabulary mismatch) is stored with its error
** and counts as not passed; the sweep goes on. Errors that stop the sweep (model, store) are
** returned as st_status.
*/
#ifndef ST_HARNESS_H
#define ST_HARNESS_H

#include <stdint.h>

#include "common/base.h"
#include "engine/text/chat.h"
#include "needle/needle_prompt.h"
#include "engine/settings.h"
#include "recorder/index.h"

typedef enum st_harness_api {
  ST_HARNESS_ENGINE = 0,    /* the reference engine, --model DIR */
  ST_HARNESS_ANTHROPIC = 1, /* POST /v1/messages */
  ST_HARNESS_OPENAI = 2,    /* POST /v1/chat/completions */
  ST_HARNESS_RESPONSES = 3, /* POST /v1/responses */
} st_harness_api;

const char *st_harness_api_name(st_harness_api api); /* engine, anthropic, openai, responses */
st_status st_harness_api_parse(const char *name, st_harness_api *out);

/* One attempt, as stored. */
typedef struct st_harness_attempt {
  int64_t attempt_id;       /* needle_attempts row */
  int64_t tokens_requested;
  int64_t tokens_actual;    /* engine: ids fed; server: measured with --tokenizer, else estimated */
  int measured;             /* 1: tokens_actual counted by a tokenizer */
  int64_t tokens_reported;  /* server usage (prompt_tokens / input_tokens); -1 unknown */
  double position, position_actual;
  uint64_t seed;
  st_needle_kind kind;      /* the request: set by the caller before st_harness_make */
  st_needle_shape shape;    /* the request's shape (0: agent) */
  int decoys;               /* decoy lines asked for (st_needle_spec.decoys; 0: none) */
  int vocab_tokens[2];      /* kind vocab: its value's LO-HI tokens (st_needle_spec.vocab_tokens;
                            ** {0, 0}: needle make's default) */
  st_needle_format format;  /* a server target's API follows it */
  char target[8192];        /* server: the URL posted to ("" : the harness's target) */
  char foreign_run_id[40];  /* another build's run, in its own store ("" when none) */
  char needle[ST_NEEDLE_LINE_MAX], expected[ST_NEEDLE_VALUE_MAX];
  char *answer;             /* the model's text (owned; NULL when the attempt failed) */
  int pass;
  char run_id[40];          /* engine trace's run ("" when none) */
  int64_t needle_start, needle_end; /* engine: token span of the needle line; -1 otherwise */
  int needle_layers;        /* engine: CSA layers judged (the needle verdict, schemas/needle-verdicts.md) */
  int needle_retrieving;    /* engine: of those, the layers that retrieve the needle */
  char needle_retrieving_layers[128]; /* engine: their numbers, "5" or "1,5" ("" none) */
  char *error;              /* owned; NULL when the attempt ran */
  double seconds;
} st_harness_attempt;

typedef struct st_harness_options {
  st_harness_api api;
  const char *model_dir;      /* engine: the checkpoint directory */
  const char *backend;        /* engine: backend name (NULL = ST_BACKEND_DEFAULT) */
  const char *binary;         /* engine through another sparsetrace build: its path (NULL: this
                              ** build); each attempt runs `BINARY needle sweep` for one cell */
  const char *binary_store;   /* that build's own trace store (its index schema may differ) */
  const char *endpoint;       /* server: base URL (…/v1 or the full endpoint path are accepted) */
  const char *tokenizer_dir;  /* tokenizer.json for sizing; NULL: model_dir (engine) / none */
  const char *model_name;     /* the requests' "model" (NULL: the model dir's name, or deepseek-v4) */
  st_settings settings;       /* engine settings (--set) */
  const char *const *set_args; /* the --set arguments as given (stored for server sweeps) */
  int n_set;
  st_chat_options render;     /* engine rendering (profile); thinking set from `thinking` */
  int thinking;               /* -1: the request says nothing (profile / server default); 0 chat; 1 thinking */
  st_needle_format format;    /* request format for the engine (server: follows api) */
  st_needle_kind kind;
  st_needle_shape shape;      /* agent (default) or toollist */
  int decoys;                 /* 0..ST_NEEDLE_MAX_DECOYS decoy lines before each needle (default 0) */
  int vocab_tokens[2];        /* kind vocab: values of LO to HI tokens ({0, 0}: needle make's default,
                              ** 6-14); the kind needs a tokenizer (model_dir, or tokenizer_dir) */
  const int64_t *tokens;
  int n_tokens;
  const double *positions;
  int n_positions;
  uint64_t first_seed;
  int n_seeds;
  int max_new;                /* tokens to generate / max_tokens of the request */
  const char *store;          /* index.sqlite and the engine's traces */
  const char *tap_positions;  /* engine: positions recorded for the taps (default "last") */
  double timeout_s;           /* server: per request; another build: per attempt, then killed
                              ** and the attempt stored with the reason (default 600) */
  const char *command_line;   /* provenance for the engine's runs */
  /* Called after each attempt (may be NULL). */
  void (*progress)(void *ctx, int done, int total, const st_harness_attempt *a);
  void *progress_ctx;
} st_harness_options;

void st_harness_options_default(st_harness_options *o);

typedef struct st_harness_result {
  char sweep_id[40];
  char target[8192];          /* model dir or endpoint URL as used */
  char settings_json[2048];   /* engine: resolved settings; server: the --set pairs */
  int n_attempts;             /* n_tokens × n_positions × n_seeds, in that nesting order */
  st_harness_attempt *attempts;
  int n_passed, n_errors;
} st_harness_result;

/* One attempt at a time (the scoreboard, needle/scoreboard.h): open what attempts need (model,
** tokenizer, backend, or the server's URL; the index), make attempts and store them, close. */
typedef struct st_harness st_harness;
#define ST_HARNESS_MAX_SETS 16      /* --set pairs passed to another build */
st_status st_harness_open(const st_harness_options *o, st_harness **out);
/* Makes the attempt a (tokens_requested, position, seed, kind and format set by the caller):
** runs it and judges the answer; its own failure goes to a->error, never to the return. */
void st_harness_make(st_harness *h, st_harness_attempt *a);
/* Stores a in needle_attempts under sweep_id (a->attempt_id set). Inside the caller's
** transaction when it has one open on st_harness_index(h). */
st_status st_harness_store(st_harness *h, const char *sweep_id, st_harness_attempt *a);
st_index *st_harness_index(st_harness *h);
const char *st_harness_target(const st_harness *h);        /* as stored in needle_attempts.target */
const char *st_harness_settings_json(const st_harness *h); /* as stored in needle_attempts.settings */
void st_harness_close(st_harness *h); /* NULL ok */

/* The one pass rule of every recall attempt (engine, server, another build; needle sweep and
** scoreboard): the answer contains the needle's value verbatim. */
int st_harness_answer_passes(const char *answer, const char *expected);
/* The request format a server API takes (anthropic, openai-chat, openai-responses). */
st_needle_format st_harness_api_format(st_harness_api api);

/* Runs the grid. On success every attempt has been stored (and *out holds them), whatever
** their outcome. */
st_status st_harness_sweep(const st_harness_options *o, st_harness_result *out);
void st_harness_result_free(st_harness_result *r);

/* The text of a server answer: Anthropic content[].text, OpenAI choices[0].message.content,
** Responses output[].content[].text (output_text). *prompt_tokens gets the usage count or -1.
** ST_EFORMAT when the body holds no text at all. Caller frees *text. */
st_status st_harness_answer_text(st_harness_api api, const char *body, size_t len, char **text,
                                 int64_t *prompt_tokens);

#endif
