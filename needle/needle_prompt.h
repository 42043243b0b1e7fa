/*
** needle_prompt.h — synthetic agentic requests with one line to recall (the needle harness's
** generator; `sparsetrace needle make`, needle/harness.c).
**
** A request looks like what a coding agent sends: a system prompt (role, rules, an environment
** section), tool definitions with JSON schemas, a task from the user, rounds of tool calls and
** tool results (source files with line numbers, grep hits, test and build logs, listings, git
** history), a short assistant summary, and a final user question asking for the needle line
** verbatim. The needle — "Working directory: /home/dev/projects/…" (kind path), a database host,
** an API key, a ticket number — occurs once, as its own line, at fraction `position` of the
** rendered prompt: in the system text, in a tool description, or in a message.
**
** Size: the prompt is rendered with the DeepSeek-V4 encoding (engine/text/chat.h, the given render
** profile) and measured with the tokenizer when one is given, else estimated at 3.25 bytes per
** token; filler lines are added until the count is as close to `tokens` as line granularity
** allows (normally within 2%). How many tools and rules the request carries scales with the
** target, so small targets still make a complete request.
**
** Deterministic: the same spec (seed, tokens, position, kind, format, tokenizer, profile) gives
** the same bytes. The needle itself depends only on seed and kind, so one seed recalls the same
** value at every size and position.
**
** Decoys (spec.decoys): earlier lines with the needle's label and other values of its kind, and
** a question asking for the last of them; the needle stays at `position`, and the decoys take
** line boundaries before it, drawn by the seed.
*/
#ifndef ST_NEEDLE_PROMPT_H
#define ST_NEEDLE_PROMPT_H

#include <jansson.h>
#include <stdint.h>

#include "common/base.h"
#include "engine/text/chat.h"
#include "engine/text/tokenizer.h"

typedef enum st_needle_kind {
  ST_NEEDLE_PATH = 0,   /* Working directory: /home/dev/projects/<name>/<name> */
  ST_NEEDLE_HOST = 1,   /* Primary database host: pg-<name>-NN.<region>.internal.<name>.net */
  ST_NEEDLE_KEY = 2,    /* Deploy API key: sk-live-<32 base62> */
  ST_NEEDLE_NUMBER = 3, /* Incident ticket number: <14 digits> */
  /* The kinds below were added for the batch mode's training data (st_needle_batch_*); the four
  ** above keep their bytes. */
  ST_NEEDLE_TICKET = 4, /* Tracking ticket: <PROJ>-<digits> */
  ST_NEEDLE_BRANCH = 5, /* Release branch: release/<word>-<word>-<n>.<n> */
  ST_NEEDLE_URL = 6,    /* Artifact URL: https://<host>/<path>?build=<n> */
  ST_NEEDLE_EMAIL = 7,  /* On-call contact: <first>.<last><n>@<domain> (held out of training) */
  ST_NEEDLE_COMMIT = 8, /* Pinned commit: <40 hex> */
  ST_NEEDLE_ENV = 9,    /* Environment variable: <NAME>=<value> (held out of training) */
  ST_NEEDLE_RANDOM = 10, /* Session token: <24 printable, no spaces> */
  /* Drawn only when named (st_needle_opt_in_kind): a batch without --kinds draws the kinds above,
  ** so the sets made before it keep their bytes. */
  ST_NEEDLE_ASSORTED = 11, /* one of 16 value shapes no kind above has, each under its own label:
                           ** "Build version: v3.14.2-rc.7+build.4411", "Device MAC: 3c:22:fb:9a:41:07", ...
                           ** (no '@' address, no NAME=VALUE: the held-out kinds' shapes stay unseen) */
  ST_NEEDLE_VOCAB = 12,    /* a label of two or three word tokens and a value of 6 to 14 printable
                           ** tokens, each drawn uniformly from the tokenizer's vocabulary
                           ** ("Mosaicquant: 7f_QUEUEDolga.yaml}/ARN..."): training data that
                           ** makes every token something to copy (needs st_needle_spec.tok) */
  ST_NEEDLE_KIND_COUNT
} st_needle_kind;

typedef enum st_needle_format {
  ST_NEEDLE_ANTHROPIC = 0,        /* POST /v1/messages */
  ST_NEEDLE_OPENAI_CHAT = 1,      /* POST /v1/chat/completions */
  ST_NEEDLE_OPENAI_RESPONSES = 2, /* POST /v1/responses */
  ST_NEEDLE_FORMAT_COUNT
} st_needle_format;

/* The request's shape. */
typedef enum st_needle_shape {
  ST_NEEDLE_SHAPE_AGENT = 0,    /* the coding-agent transcript: tools with JSON schemas, task, tool
                                ** rounds with their results, summary, question (the default) */
  ST_NEEDLE_SHAPE_TOOLLIST = 1, /* a bug report's shape: one system string (hundreds of one-line tool
                                ** descriptions with the environment section in the middle, rules)
                                ** and one user question; no tools field, no tool rounds */
  ST_NEEDLE_SHAPE_COUNT
} st_needle_shape;

const char *st_needle_shape_name(st_needle_shape s);
st_status st_needle_shape_parse(const char *name, st_needle_shape *out);
const char *st_needle_kind_name(st_needle_kind k);
st_status st_needle_kind_parse(const char *name, st_needle_kind *out);
const char *st_needle_format_name(st_needle_format f);
st_status st_needle_format_parse(const char *name, st_needle_format *out);

/* Bytes per token assumed when no tokenizer is given. */
#define ST_NEEDLE_BYTES_PER_TOKEN 3.25

typedef struct st_needle_spec {
  int64_t tokens;            /* target size of the rendered prompt */
  double position;           /* where the needle goes, 0..1 of the prompt */
  uint64_t seed;
  st_needle_kind kind;
  st_needle_format format;
  st_tokenizer *tok;         /* borrowed; NULL: estimate ST_NEEDLE_BYTES_PER_TOKEN */
  st_chat_options render;    /* how the prompt is rendered for measuring (api is set here) */
  const char *model_name;    /* the request's "model" (NULL: "deepseek-v4") */
  int max_tokens;            /* the request's output limit (0: 256) */
  double temperature;        /* the request's temperature (normally 0) */
  int thinking;              /* -1: say nothing; 0/1: ask the server for chat / thinking mode
                             ** (anthropic "thinking", openai chat_template_kwargs) */
  st_needle_shape shape;     /* the request's shape (default: agent) */
  int family;                /* the final question's template family, 0..ST_NEEDLE_FAMILY_COUNT-1,
                             ** or ST_NEEDLE_FAMILY_COMPOSED; -1 (default): one of the first
                             ** three, picked by the seed */
  int decoys;                /* 0..ST_NEEDLE_MAX_DECOYS: more lines with the needle's label and a
                             ** value of its kind, at line boundaries before the needle, and a
                             ** question asking for the last one (0, the default: none, and the
                             ** same bytes as before decoys existed) */
  int open_label;            /* 1: the needle's label is made up on a stream of its own (one to
                             ** three parts, one of them a made-up word or an acronym) instead of
                             ** its kind's ("Tracking ticket"): training data only (`needle make
                             ** --batch --open-labels SHARE`), so a model copies the label a
                             ** question names rather than recognising the kinds' eleven */
  int vocab_tokens[2];       /* ST_NEEDLE_VOCAB's value: LO to HI tokens (1 <= LO <= HI <=
                             ** ST_NEEDLE_VOCAB_TOKENS_MAX), as many as fit ST_NEEDLE_VALUE_MAX;
                             ** {0, 0} (the default): 6 to 14, at most 96 bytes, the bytes the kind
                             ** has always made. Long values give a model many tokens to copy per
                             ** example (`needle make --vocab-tokens`) */
} st_needle_spec;

/* A needle's value and line (label ": " value), with their terminating 0: the vocab kind's long
** values (st_needle_spec.vocab_tokens) set them; every other kind's fit 128 and 200. */
#define ST_NEEDLE_VALUE_MAX 640
#define ST_NEEDLE_LINE_MAX (64 + 2 + ST_NEEDLE_VALUE_MAX)
#define ST_NEEDLE_VOCAB_TOKENS_MAX 160

/* Decoys: where a line sits is then all that tells the answer, so a fault in the indexer's
** positional part (index_rope=neox, compress_rope_theta) loses it where the needle alone, found
** by its content, survives. At most this many per request; fewer when the needle has fewer line
** boundaries before it. */
#define ST_NEEDLE_MAX_DECOYS 64

/* Template families of the final question: "q0".."q6". q0-q2 are the ones `needle make` has
** always used; q5 and q6 (and the kinds email and env) are held out of the batch mode's train
** split (st_needle_heldout_family, st_needle_heldout_kind). */
#define ST_NEEDLE_FAMILY_COUNT 7
/* st_needle_spec.family for a question composed from parts (needle_corpus.h st_nc_ask_*), drawn
** on a stream of its own: training data only (`needle make --batch --composed SHARE`), so a model
** learns to copy the label a question names, not to recognise five wordings. */
#define ST_NEEDLE_FAMILY_COMPOSED 100
int st_needle_heldout_family(int family);
int st_needle_heldout_kind(st_needle_kind k);
/* A kind a batch draws only when --kinds names it (ST_NEEDLE_ASSORTED, ST_NEEDLE_VOCAB). */
int st_needle_opt_in_kind(st_needle_kind k);
/* The kinds' names joined by ", " into buf (the opt-in kinds too when with_opt_in), for messages. */
const char *st_needle_kind_list(char *buf, size_t size, int with_opt_in);

void st_needle_spec_default(st_needle_spec *s);

typedef struct st_needle_prompt {
  json_t *request;           /* the request body (owned) */
  char label[64];            /* "Working directory" */
  char value[ST_NEEDLE_VALUE_MAX]; /* what the answer must contain verbatim */
  char line[ST_NEEDLE_LINE_MAX];  /* the needle line: label ": " value */
  char *question;            /* the final user message (owned) */
  char *prompt;              /* the rendered prompt (owned), prompt_len bytes */
  size_t prompt_len;
  st_token_ids ids;          /* the prompt's token ids (empty without a tokenizer) */
  int64_t tokens;            /* prompt size: tokenizer count, or bytes / 3.25 rounded */
  int measured;              /* 1: tokens counted by the tokenizer; 0: estimated */
  int64_t needle_byte;       /* byte offset of the needle line in the rendered prompt */
  int64_t needle_token;      /* token of its first byte (estimated without a tokenizer) */
  int64_t needle_token_end;  /* one past the token of its last byte */
  double position;           /* needle_token / tokens */
  int within_tolerance;      /* |tokens - target| <= 2% of the target */
  int64_t min_tokens;        /* size with no filler at all (the smallest this spec makes) */
  int n_tools, n_rounds, filler_lines;
  const char *placement;     /* "system", "tool description", "user", "assistant", "tool result" */
  int family;                /* the question's template family used (0..ST_NEEDLE_FAMILY_COUNT-1,
                             ** or ST_NEEDLE_FAMILY_COMPOSED) */
  int n_decoys;              /* decoy lines placed before the needle (<= spec.decoys) */
} st_needle_prompt;

/* Builds the request for spec. Errors: ST_EINVAL for a bad spec (position outside [0, 1],
** tokens < 1), render or tokenizer errors as they come. */
st_status st_needle_make(const st_needle_spec *spec, st_needle_prompt *out);
void st_needle_prompt_free(st_needle_prompt *p);

/* The token span [start, end) of prompt bytes [byte_start, byte_end) in ids (the tokens whose
** decoded bytes overlap it). ST_EMISMATCH when the decoded ids do not add up to prompt_len. */
st_status st_needle_token_span(const st_tokenizer *tok, const int32_t *ids, size_t n, size_t prompt_len,
                               int64_t byte_start, int64_t byte_end, int64_t *start, int64_t *end);

#endif
