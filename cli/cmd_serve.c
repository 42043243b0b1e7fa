/*
** cmd_serve.c — `sparsetrace serve`: the reference engine behind OpenAI- and Anthropic-compatible
** endpoints, every request a row of the store's `requests` table and, with taps armed, a traced run
** linked to it.
**
** Endpoints: POST /v1/chat/completions, /v1/messages, /v1/responses (rendered into the DeepSeek-V4
** prompt exactly as `render` and `run --request` do: st_chat_render_request, then the model's
** tokenizer), GET /v1/models, GET /health. Answers are shaped as the official servers shape them,
** as one JSON body or, with "stream": true, in each API's own SSE event sequence.
**
** Decoding is greedy (argmax, ties to the lower id: the same tokens `run` generates for the same
** prompt) when the request gives no temperature or temperature 0. temperature > 0 (and top_p)
** draws from engine/sampler.h, seeded by the request's "seed" or, without one, by a seed derived
** from the request's row id; the seed is in the answer's X-Sparsetrace-Seed header, and the same
** seed with the same prompt and settings gives the same tokens. max_tokens (chat:
** max_completion_tokens too; responses: max_output_tokens), stop sequences (chat "stop", messages
** "stop_sequences") and EOS end the answer. In thinking mode (the prompt ends with <think>) the
** text before </think> is the reasoning: chat's message.reasoning_content, a messages "thinking"
** block (with a signature), a responses "reasoning" item.
**
** Tool calls: the content part of the completion is read back by st_chat_parse_completion (the
** inverse of the encoder's DSML block); its calls come back as chat "tool_calls" (finish_reason
** "tool_calls"), messages "tool_use" blocks (stop_reason "tool_use") and responses
** "function_call" items, streamed as each API streams them. While streaming, content is held
** back from the first byte of "<｜DSML｜tool_calls>" (and trailing whitespace before it), so the
** streamed text equals the whole answer's. A block that breaks the grammar is answered as text.
**
** Requests are checked before they are rendered: a top-level field none of the three APIs'
** tables below lists gets a 400 naming it (in OpenAI's or Anthropic's wording), a penalty or
** bias at a non-neutral value too (the engine does not apply them), and a content part that is
** not text (images, audio, files) a 400 naming where it is; each is a rejected row. Prompt ids:
** vLLM's "return_token_ids" (top-level prompt_token_ids, in the first chunk when streamed, and
** choices[0].token_ids) and sglang's "return_prompt_token_ids" (choices[0].prompt_token_ids; a
** stream asking for it gets sglang's 400), the fields `capture --ask-prompt-ids` reads.
**
** --script-answers FILE (a test setting): the answers are the texts of a JSON array, one per
** request in turn, tokenised and fed through the engine token by token as if generated (the
** trace is the engine's), then parsed and answered by the same code as generated text: how the
** tests drive tool calls and thinking through a model that does not write them by itself.
**
** One engine. The listener's workers (capture_http.c) read requests concurrently; a request that
** needs the engine takes a ticket and waits its turn, at most --queue of them waiting: one more
** is answered 429 with Retry-After. The model is loaded once; each request gets its own session
** (its settings may differ: X-Sparsetrace-Set). SIGTERM or SIGINT: requests still waiting get a
** 503, the one in flight finishes and is answered, then the listener stops and the store writer
** drains before the command returns. The tokenizer is shared as well: a request is rendered and
** encoded before it queues (a 400 or a 429 needs no turn of the engine), and the encoder is not
** reentrant (its word cache and scratch), so encodes take turns under a lock of their own.
**
** Per request, headers override the server's flags: X-Sparsetrace-Set: rotate=q,topk=64 (on top
** of --set), X-Sparsetrace-Tap: GLOB[,GLOB] (instead of --tap; "none" disarms),
** X-Sparsetrace-Positions: SPEC, X-Sparsetrace-Needle: TEXT (arms the indexer taps and records the
** needle verdicts, as `run --needle`). With taps armed the answer carries X-Sparsetrace-Run and
** X-Sparsetrace-Trace; the trace's run row has request_id = the request's row.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "options.h"
#include "common/json_oom.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/text/chat.h"
#include "engine/text/tokenizer.h"
#include "recorder/capture/served.h"
#include "recorder/recorder.h"
#include "replayer/needle.h"

static const st_opt_use serve_options[] = {
  {ST_OPT_MODEL, NULL, "checkpoint directory (config.json, safetensors, tokenizer.json)"},
  {ST_OPT_STORE, NULL, "trace store (default ./" ST_DEFAULT_STORE "): requests and runs go to\n"
                       "DIR/index.sqlite, traces to DIR/runs/"},
  {ST_OPT_PORT, NULL, "port (default 8788; 0 picks a free one)"},
  {ST_OPT_LISTEN, NULL, "address to bind, HOST or HOST:PORT (default 127.0.0.1: loopback)"},
  {ST_OPT_SET, NULL, "engine setting for every request (repeatable; a request adds its own\n"
                     "with the header X-Sparsetrace-Set: K=V,K=V)"},
  {ST_OPT_TAP, NULL, "arm these taps for every request: each becomes a traced run (repeatable;\n"
                     "a request's X-Sparsetrace-Tap: GLOB,GLOB replaces them, 'none' disarms)"},
  {ST_OPT_POSITIONS, NULL, "token positions kept for armed taps: all | last | A:B (default all)"},
  {ST_OPT_RENDER, NULL, "reference | sglang | vllm | atom: how requests become prompts (default\n"
                        "reference)"},
  {ST_OPT_MAX_NEW_TOKENS, NULL, "answer length when a request gives none (default 256)"},
  {ST_OPT_CONTEXT, NULL, "most tokens per request, prompt and answer (default 16384, at most the\n"
                         "model's max_position_embeddings); longer prompts get a 400"},
  {ST_OPT_QUEUE, NULL, "requests that may wait for the engine, 0..256 (default 8); one more\n"
                       "is answered 429 with Retry-After"},
  {ST_OPT_SCRIPT_ANSWERS, NULL, "test setting: request k is answered with text k (mod n) of FILE, a\n"
                              "JSON array of strings, fed through the engine as if generated"},
  {ST_OPT_BACKEND, NULL, NULL},
  {ST_OPT_THREADS, NULL, NULL},
  {ST_OPT_READY_FILE, NULL, "once listening, write the server's URL to FILE (for scripts)"},
  {ST_OPT_QUIET, NULL, "no per-request log lines"},
  {0}};

static const st_cmd_spec serve_spec = {
  "serve", "sparsetrace serve --model DIR [--store DIR] [--port N] [--set K=V]... [--tap GLOB]... [options]\n",
  "Serves the reference engine on OpenAI- and Anthropic-compatible endpoints (POST\n"
  "/v1/chat/completions, /v1/messages, /v1/responses; GET /v1/models, /health), greedy, streamed\n"
  "or not. Every request becomes a row of the store's requests table (`sparsetrace requests`),\n"
  "and with taps armed a traced run linked to it (`sparsetrace diff`, `replay`, `bisect`).\n"
  "Point a client at it:\n"
  "  ANTHROPIC_BASE_URL=http://127.0.0.1:8788   OPENAI_BASE_URL=http://127.0.0.1:8788/v1\n",
  serve_options,
  "Request headers: X-Sparsetrace-Set: K=V,K=V (settings on top of --set), X-Sparsetrace-Tap:\n"
  "GLOB,GLOB, X-Sparsetrace-Positions: SPEC, X-Sparsetrace-Needle: TEXT. Answers carry\n"
  "X-Sparsetrace-Run and X-Sparsetrace-Trace when a run was traced, X-Sparsetrace-Seed when\n"
  "sampled (temperature > 0; greedy otherwise). API keys clients send are never written\n"
  "(capture's redaction).\n"
  "\n"
  "Exit status: 0 after a clean shutdown (SIGINT/SIGTERM), 1 on failure, 2 usage error.\n"};

/* ---- the server's state ------------------------------------------------------------------------ */

typedef struct server {
  const char *model_dir, *store, *positions;
  char model_name[256];
  st_settings settings;        /* --set applied */
  const char **taps;           /* --tap */
  int n_taps;
  st_render_profile profile;
  int default_max_new, context, queue_max, quiet, threads;
  st_model *model;
  st_backend backend;
  st_tokenizer *tok;
  /* tok's encoder keeps a word cache and scratch buffers (tokenizer.h: one encode at a time):
  ** workers render concurrently, so every encode takes this lock; decode is read-only */
  pthread_mutex_t tok_mu;
  st_served *served;
  json_t *script;              /* --script-answers: an array of strings, or NULL */
  size_t script_next;          /* the next one (under the engine) */
  /* the engine's queue: tickets served in order, one at a time */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned long long next_ticket, now_serving;
  int waiting, busy, stopping;
} server;

static void log_line(void *user, const char *line) {
  server *sv = user;
  if (sv->quiet && strncmp(line, "store", 5) && strncmp(line, "warning", 7)) return;
  fprintf(stderr, "sparsetrace serve: %s\n", line);
}

/* ---- API shapes ------------------------------------------------------------------------------------ */

typedef enum api_kind { API_CHAT, API_MESSAGES, API_RESPONSES } api_kind;

static char *dump(json_t *j) { /* compact, keys in insertion order; takes j */
  char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(j);
  return s;
}

/* The error body each API's own servers send. */
static char *error_json(api_kind api, int status, const char *code, const char *msg) {
  if (api == API_MESSAGES) {
    const char *type = status == 429 ? "rate_limit_error" : status == 413 ? "request_too_large"
                       : status == 404 ? "not_found_error" : status == 503 ? "overloaded_error"
                       : status >= 500 ? "api_error" : "invalid_request_error";
    return dump(json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", type, "message", msg));
  }
  const char *type = status == 429 ? "rate_limit_exceeded" : status >= 500 ? "server_error"
                                                                           : "invalid_request_error";
  return dump(json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message", msg, "type", type, "param",
                        "code", code));
}

static void reply_error(st_served_exchange *x, api_kind api, int status, const char *code,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void reply_error(st_served_exchange *x, api_kind api, int status, const char *code,
                        const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char *body = error_json(api, status, code, msg);
  if (status == 429 || status == 503) st_served_add_header(x, "Retry-After", "1");
  st_served_reply(x, status, "application/json", body ? body : "{}", body ? strlen(body) : 2);
  st_served_set_outcome(x, ST_SERVED_REJECTED, msg);
  free(body);
}

/* A request step that failed for want of memory is the server's failure (500 out_of_memory), not
** the client's: rc is the step's status, and errno was cleared before the step (malloc sets ENOMEM;
** jansson and the renderer often report a failed allocation as malformed input, common/json_oom.h).
** Answers and returns 1 then; 0 leaves the step's own error to the caller. */
static int reply_if_out_of_memory(st_served_exchange *x, api_kind api, st_status rc, const char *step) {
  if (rc != ST_ENOMEM && errno != ENOMEM) return 0;
  reply_error(x, api, 500, "out_of_memory", "out of memory %s%s%s", step, rc == ST_ENOMEM ? ": " : "",
              rc == ST_ENOMEM ? st_errmsg() : "");
  return 1;
}

/* ---- one request's parameters ------------------------------------------------------------------- */

#define MAX_STOPS 8
typedef struct request_params {
  api_kind api;
  int stream, include_usage;
  int return_token_ids;        /* vLLM's field: prompt_token_ids, choices[0].token_ids */
  int return_prompt_token_ids; /* sglang's: choices[0].prompt_token_ids (not streamed) */
  int max_new;
  double temperature, top_p; /* 0 / 1: greedy */
  int has_seed;
  uint64_t seed;
  const char *stops[MAX_STOPS];
  int n_stops;
  const char *model; /* the request's "model", or the server's name */
} request_params;

/* The top-level fields each API's request may carry. Read here or by the renderer (the rest is
** accepted and has no effect on a greedy or seeded single answer: bookkeeping such as "user",
** "metadata", "store", or choices the engine makes anyway such as "tool_choice": "auto").
** Anything else is refused with a 400 naming it, as the official servers refuse an argument they
** do not know, rather than silently answering a request that asked for something else. */
static const char *const known_common[] = {
  "model", "stream", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls",
  "metadata", "user", "service_tier", "store", "reasoning_effort", "chat_template_kwargs", NULL};
static const char *const known_chat[] = {
  "messages", "max_tokens", "max_completion_tokens", "stop", "seed", "n", "stream_options",
  "return_token_ids", "return_prompt_token_ids", "response_format", "logit_bias",
  "frequency_penalty", "presence_penalty", "separate_reasoning", "continue_final_message",
  "task", "thinking", NULL};
static const char *const known_messages[] = {
  "messages", "system", "max_tokens", "stop_sequences", "thinking", "anthropic_version",
  "output_config", "effort", "context_management", "container", "mcp_servers", NULL};
static const char *const known_responses[] = {
  "input", "instructions", "max_output_tokens", "reasoning", "previous_response_id", "seed",
  "text", "truncation", "include", "background", "prompt_cache_key", "safety_identifier",
  "max_tool_calls", NULL};

static int known_field(const char *const *list, const char *k) {
  for (; *list; list++)
    if (!strcmp(*list, k)) return 1;
  return 0;
}

/* Penalties, biases and forced tool choices the engine does not apply: accepted only at their
** neutral values ("tool_choice": "auto" or {"type": "auto"}: the model decides). */
static int neutral_field(const char *k, json_t *v) {
  if (json_is_null(v)) return 1;
  if (!strcmp(k, "tool_choice")) {
    const char *c = json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "type"));
    return c && !strcmp(c, "auto");
  }
  if (!strcmp(k, "frequency_penalty") || !strcmp(k, "presence_penalty"))
    return json_is_number(v) && json_number_value(v) == 0;
  if (!strcmp(k, "logit_bias")) return json_is_object(v) && json_object_size(v) == 0;
  return 1;
}

/* Content part types the engine reads (text, and the tool and reasoning blocks the encoder
** renders); images, audio, files and documents are refused by name rather than dropped from the
** prompt without a word. */
static int text_part(const char *type) {
  static const char *const ok[] = {"text", "input_text", "output_text", "refusal", "tool_use",
                                   "tool_result", "thinking", "redacted_thinking", "summary_text", NULL};
  return type && known_field(ok, type);
}

/* 0, or 400 with msg naming the first part of a type the engine cannot read: in messages[i] /
** input[i] content arrays and in tool_result contents one level down. */
static int check_content_types(json_t *body, api_kind api, char *msg, size_t msg_len) {
  const char *list = api == API_RESPONSES ? "input" : "messages";
  size_t i, j, k;
  json_t *m, *part, *inner;
  json_array_foreach(json_object_get(body, list), i, m) {
    json_array_foreach(json_object_get(m, "content"), j, part) {
      const char *type = json_string_value(json_object_get(part, "type"));
      if (json_is_object(part) && !text_part(type))
        return snprintf(msg, msg_len, "%s[%zu].content[%zu]: content of type \"%s\" is not supported: "
                        "the reference engine reads text (and tool and reasoning blocks) only", list, i,
                        j, type ? type : "(none)"), 400;
      json_array_foreach(json_object_get(part, "content"), k, inner) {
        const char *t = json_string_value(json_object_get(inner, "type"));
        if (json_is_object(inner) && !text_part(t))
          return snprintf(msg, msg_len, "%s[%zu].content[%zu].content[%zu]: content of type \"%s\" is "
                          "not supported: the reference engine reads text only", list, i, j, k,
                          t ? t : "(none)"), 400;
      }
    }
  }
  return 0;
}

/* Reads what decoding needs from the body; 0, or an HTTP status with msg set. */
static int read_params(const server *sv, json_t *body, request_params *p, char *msg, size_t msg_len) {
  json_t *v;
  const char *k;
  const char *const *own = p->api == API_CHAT ? known_chat : p->api == API_MESSAGES ? known_messages
                                                                                    : known_responses;
  json_object_foreach(body, k, v) {
    if (!known_field(known_common, k) && !known_field(own, k))
      return snprintf(msg, msg_len, p->api == API_MESSAGES ? "%s: Extra inputs are not permitted "
                      "(sparsetrace serve does not know this field)" : "Unrecognized request argument "
                      "supplied: %s (sparsetrace serve does not know this field)", k), 400;
    if (!neutral_field(k, v))
      return snprintf(msg, msg_len, "%s: sparsetrace serve does not apply it; only its neutral value "
                      "(0, {}, \"auto\" or null) is accepted", k), 400;
  }
  int bad_content = check_content_types(body, p->api, msg, msg_len);
  if (bad_content) return bad_content;
  p->stream = json_is_true(json_object_get(body, "stream"));
  p->model = json_string_value(json_object_get(body, "model"));
  if (!p->model) p->model = sv->model_name;
  p->top_p = 1;
  if ((v = json_object_get(body, "temperature")) && !json_is_null(v)) {
    double hi = p->api == API_MESSAGES ? 1 : 2; /* each API's documented range */
    if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > hi)
      return snprintf(msg, msg_len, "temperature: expected a number from 0 to %g", hi), 400;
    p->temperature = json_number_value(v);
  }
  if ((v = json_object_get(body, "top_p")) && !json_is_null(v)) {
    if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > 1)
      return snprintf(msg, msg_len, "top_p: expected a number in (0, 1]"), 400;
    p->top_p = json_number_value(v);
  }
  if ((v = json_object_get(body, "seed")) && !json_is_null(v)) {
    if (!json_is_integer(v)) return snprintf(msg, msg_len, "seed: expected an integer"), 400;
    p->has_seed = 1;
    p->seed = (uint64_t)json_integer_value(v);
  }
  if ((v = json_object_get(body, "n")) && json_is_integer(v) && json_integer_value(v) != 1)
    return snprintf(msg, msg_len, "n: only one choice is generated (n = 1)"), 400;
  const char *max_key = p->api == API_RESPONSES ? "max_output_tokens" : "max_tokens";
  v = json_object_get(body, max_key);
  if ((!v || json_is_null(v)) && p->api == API_CHAT) v = json_object_get(body, "max_completion_tokens");
  if (v && !json_is_null(v)) {
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000000)
      return snprintf(msg, msg_len, "%s: expected an integer from 1 to 1000000", max_key), 400;
    p->max_new = (int)json_integer_value(v);
  } else if (p->api == API_MESSAGES) {
    return snprintf(msg, msg_len, "max_tokens: Field required"), 400;
  } else {
    p->max_new = sv->default_max_new;
  }
  const char *stop_key = p->api == API_MESSAGES ? "stop_sequences" : "stop";
  v = p->api == API_RESPONSES ? NULL : json_object_get(body, stop_key);
  if (json_is_string(v)) {
    if (json_string_length(v)) p->stops[p->n_stops++] = json_string_value(v);
  } else if (json_is_array(v)) {
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
      if (!json_is_string(s)) return snprintf(msg, msg_len, "%s[%zu]: expected a string", stop_key, i), 400;
      if (p->n_stops == MAX_STOPS)
        return snprintf(msg, msg_len, "%s: at most %d stop sequences", stop_key, MAX_STOPS), 400;
      if (json_string_length(s)) p->stops[p->n_stops++] = json_string_value(s);
    }
  } else if (v && !json_is_null(v)) {
    return snprintf(msg, msg_len, "%s: expected a string or an array of strings", stop_key), 400;
  }
  p->include_usage = json_is_true(json_object_get(json_object_get(body, "stream_options"), "include_usage"));
  p->return_token_ids = json_is_true(json_object_get(body, "return_token_ids"));
  p->return_prompt_token_ids = json_is_true(json_object_get(body, "return_prompt_token_ids"));
  if (p->return_prompt_token_ids && p->stream) /* as sglang's serving_chat.py answers it */
    return snprintf(msg, msg_len, "return_prompt_token_ids is not supported with streaming"), 400;
  return 0;
}

/* ---- the answer, streamed or whole ------------------------------------------------------------- */

/* Turns generated text into each API's JSON or SSE. Text arrives in two channels: reasoning
** (before </think> in thinking mode) and content. */
typedef struct answer {
  st_served_exchange *x;
  const request_params *p;
  char id[64], item_id[64], reasoning_id[64];
  long created;
  int n_prompt;
  const int32_t *prompt_ids;  /* [n_prompt] */
  st_buf reasoning, content;  /* everything emitted so far */
  int gone;                   /* the client left: stop generating */
  int seq;                    /* responses: sequence_number */
  int block_open;             /* messages/responses stream: 0 none, 1 reasoning, 2 content */
  int n_blocks;               /* blocks (messages) / output items (responses) opened so far */
  int content_opened;         /* the text block / message item was opened */
  char hex[40];               /* the request row's id without dashes: the names' suffix */
  st_chat_completion tools;   /* the tool calls read from the completion, at the end */
} answer;

/* An opaque, stable signature for a thinking block (Anthropic's clients carry one back with the
** block): FNV-1a of the text, so the same reasoning always has the same signature. */
static void thinking_signature(const char *text, char out[32]) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *c = (const unsigned char *)(text ? text : ""); *c; c++) h = (h ^ *c) * 0x100000001b3ull;
  snprintf(out, 32, "sparsetrace-%016llx", (unsigned long long)h);
}

/* The arguments of a parsed call as the APIs carry them: a JSON text. */
static char *call_arguments(const st_tool_call *c) {
  return json_dumps(c->arguments, JSON_COMPACT | JSON_PRESERVE_ORDER);
}

/* call ids: call_<hex>_<i> (chat, responses' call_id), toolu_<hex>_<i> (messages), fc_<hex>_<i>
** (responses' item id) */
static void call_name(const answer *a, const char *prefix, size_t i, char *out, size_t n) {
  snprintf(out, n, "%s%s_%zu", prefix, a->hex, i);
}

static json_t *responses_call_item(const answer *a, size_t i, const char *status, int with_arguments) {
  char id[96], call_id[96];
  call_name(a, "fc_", i, id, sizeof id);
  call_name(a, "call_", i, call_id, sizeof call_id);
  char *args = with_arguments ? call_arguments(&a->tools.calls[i]) : NULL;
  json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "type", "function_call", "id", id, "call_id",
                        call_id, "name", a->tools.calls[i].name, "arguments", args ? args : "",
                        "status", status);
  free(args);
  return o;
}

static int send_event(answer *a, const char *event, json_t *data) {
  char *body = dump(data);
  if (!body) return -1;
  st_buf b = {0};
  if (event) {
    st_buf_str(&b, "event: ");
    st_buf_str(&b, event);
    st_buf_str(&b, "\n");
  }
  st_buf_str(&b, "data: ");
  st_buf_str(&b, body);
  st_buf_str(&b, "\n\n");
  int rc = st_buf_status(&b, "event") ? -1 : st_served_write(a->x, b.data, b.len);
  st_buf_free(&b);
  free(body);
  if (rc < 0) a->gone = 1;
  return rc;
}

static json_t *chat_chunk(answer *a, json_t *delta, const char *finish) {
  return json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:n,s:o}]}", "id", a->id, "object",
                   "chat.completion.chunk", "created", (json_int_t)a->created, "model", a->p->model,
                   "choices", "index", 0, "delta", delta, "logprobs", "finish_reason",
                   finish ? json_string(finish) : json_null());
}

static json_t *responses_object(answer *a, const char *status, json_t *output, json_t *usage,
                                const char *incomplete) {
  return json_pack("{s:s,s:s,s:I,s:s,s:n,s:o,s:s,s:o,s:b,s:o,s:n,s:n,s:s,s:o}",
                   "id", a->id, "object", "response", "created_at", (json_int_t)a->created,
                   "status", status, "error", "incomplete_details",
                   incomplete ? json_pack("{s:s}", "reason", incomplete) : json_null(),
                   "model", a->p->model, "output", output, "parallel_tool_calls", 1,
                   "tools", json_array(), "temperature", "top_p", "tool_choice", "auto",
                   "usage", usage ? usage : json_null());
}

static json_t *responses_message_item(answer *a, const char *status, const char *text) {
  json_t *content = json_array();
  if (text) json_array_append_new(content, json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text",
                                                     text, "annotations"));
  return json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", a->item_id, "status", status,
                   "role", "assistant", "content", content);
}

static json_t *responses_reasoning_item(answer *a, const char *text) {
  json_t *summary = json_array();
  if (text) json_array_append_new(summary, json_pack("{s:s,s:s}", "type", "summary_text", "text", text));
  return json_pack("{s:s,s:s,s:o}", "type", "reasoning", "id", a->reasoning_id, "summary", summary);
}

static int resp_event(answer *a, const char *type, json_t *data) { /* type first, as OpenAI sends */
  json_t *e = json_pack("{s:s,s:i}", "type", type, "sequence_number", a->seq++);
  json_object_update(e, data);
  json_decref(data);
  return send_event(a, type, e);
}

static json_t *id_array(const int32_t *ids, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
  return a;
}

/* The head and opening events of a stream. */
static int answer_start(answer *a) {
  if (!a->p->stream) return 0;
  if (st_served_begin(a->x, 200, "text/event-stream; charset=utf-8", 1, 0) < 0) {
    a->gone = 1;
    return -1;
  }
  switch (a->p->api) {
  case API_CHAT: {
    json_t *first = chat_chunk(a, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL);
    if (a->p->return_token_ids) /* vLLM sends the prompt's ids in the first chunk */
      json_object_set_new(first, "prompt_token_ids", id_array(a->prompt_ids, a->n_prompt));
    return send_event(a, NULL, first);
  }
  case API_MESSAGES:
    if (send_event(a, "message_start", json_pack("{s:s,s:{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:{s:i,s:i}}}",
                   "type", "message_start", "message", "id", a->id, "type", "message", "role",
                   "assistant", "model", a->p->model, "content", "stop_reason", "stop_sequence",
                   "usage", "input_tokens", a->n_prompt, "output_tokens", 1)) < 0)
      return -1;
    return send_event(a, "ping", json_pack("{s:s}", "type", "ping"));
  case API_RESPONSES: {
    if (resp_event(a, "response.created", json_pack("{s:o}", "response",
                   responses_object(a, "in_progress", json_array(), NULL, NULL))) < 0)
      return -1;
    return resp_event(a, "response.in_progress", json_pack("{s:o}", "response",
                      responses_object(a, "in_progress", json_array(), NULL, NULL)));
  }
  }
  return 0;
}

/* Closes the open block/item of a stream (messages, responses). */
static int close_block(answer *a) {
  if (!a->block_open) return 0;
  int rc = 0, idx = a->n_blocks - 1;
  if (a->p->api == API_MESSAGES) {
    if (a->block_open == 1) {
      char sig[32];
      thinking_signature(a->reasoning.data, sig);
      rc = send_event(a, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s}}", "type",
                      "content_block_delta", "index", idx, "delta", "type", "signature_delta",
                      "signature", sig));
    }
    if (!rc) rc = send_event(a, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop",
                                                               "index", idx));
  } else if (a->block_open == 1) {
    json_t *item = responses_reasoning_item(a, a->reasoning.len ? a->reasoning.data : "");
    rc = resp_event(a, "response.reasoning_summary_text.done",
                    json_pack("{s:s,s:i,s:i,s:s}", "item_id", a->reasoning_id, "output_index", idx,
                              "summary_index", 0, "text", a->reasoning.len ? a->reasoning.data : ""));
    if (!rc) rc = resp_event(a, "response.reasoning_summary_part.done",
                             json_pack("{s:s,s:i,s:i,s:{s:s,s:s}}", "item_id", a->reasoning_id,
                                       "output_index", idx, "summary_index", 0, "part", "type",
                                       "summary_text", "text", a->reasoning.len ? a->reasoning.data : ""));
    if (!rc) rc = resp_event(a, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", idx, "item", item));
    else json_decref(item);
  } else {
    const char *text = a->content.len ? a->content.data : "";
    rc = resp_event(a, "response.output_text.done", json_pack("{s:s,s:i,s:i,s:s,s:[]}", "item_id",
                    a->item_id, "output_index", idx, "content_index", 0, "text", text, "logprobs"));
    if (!rc) rc = resp_event(a, "response.content_part.done", json_pack("{s:s,s:i,s:i,s:{s:s,s:s,s:[]}}",
                             "item_id", a->item_id, "output_index", idx, "content_index", 0, "part",
                             "type", "output_text", "text", text, "annotations"));
    if (!rc) rc = resp_event(a, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", idx,
                             "item", responses_message_item(a, "completed", text)));
  }
  a->block_open = 0;
  return rc;
}

/* Opens a stream's block (messages) or output item (responses) for a channel (1 reasoning,
** 2 content), closing the one open. */
static int open_block(answer *a, int channel) {
  int rc = close_block(a), idx = a->n_blocks++;
  a->block_open = channel;
  if (channel == 2) a->content_opened = 1;
  if (rc) return rc;
  if (a->p->api == API_MESSAGES)
    return send_event(a, "content_block_start", json_pack("{s:s,s:i,s:o}", "type",
                      "content_block_start", "index", idx, "content_block", channel == 1
                      ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
                      : json_pack("{s:s,s:s}", "type", "text", "text", "")));
  if (channel == 1) {
    rc = resp_event(a, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", idx,
                    "item", responses_reasoning_item(a, NULL)));
    if (!rc) rc = resp_event(a, "response.reasoning_summary_part.added", json_pack(
                             "{s:s,s:i,s:i,s:{s:s,s:s}}", "item_id", a->reasoning_id, "output_index",
                             idx, "summary_index", 0, "part", "type", "summary_text", "text", ""));
    return rc;
  }
  rc = resp_event(a, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", idx,
                  "item", responses_message_item(a, "in_progress", NULL)));
  if (!rc) rc = resp_event(a, "response.content_part.added", json_pack("{s:s,s:i,s:i,s:{s:s,s:s,s:[]}}",
                           "item_id", a->item_id, "output_index", idx, "content_index", 0, "part",
                           "type", "output_text", "text", "", "annotations"));
  return rc;
}

/* New text in one channel (1 reasoning, 2 content): kept, and streamed when streaming. */
static int answer_delta(answer *a, int channel, const char *text, size_t n) {
  if (!n) return 0;
  st_buf *b = channel == 1 ? &a->reasoning : &a->content;
  if (st_buf_add(b, text, n)) return -1;
  if (!a->p->stream) return 0;
  char *piece = strndup(text, n);
  if (!piece) return -1;
  int rc = 0;
  if (a->p->api == API_CHAT) {
    rc = send_event(a, NULL, chat_chunk(a, json_pack("{s:s}", channel == 1 ? "reasoning_content" : "content", piece), NULL));
  } else {
    if (a->block_open != channel) rc = open_block(a, channel);
    int idx = a->n_blocks - 1;
    if (rc) {
    } else if (a->p->api == API_MESSAGES) {
      rc = send_event(a, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s}}", "type",
                      "content_block_delta", "index", idx, "delta", "type",
                      channel == 1 ? "thinking_delta" : "text_delta",
                      channel == 1 ? "thinking" : "text", piece));
    } else if (channel == 1) {
      rc = resp_event(a, "response.reasoning_summary_text.delta", json_pack("{s:s,s:i,s:i,s:s}", "item_id",
                      a->reasoning_id, "output_index", idx, "summary_index", 0, "delta", piece));
    } else {
      rc = resp_event(a, "response.output_text.delta", json_pack("{s:s,s:i,s:i,s:s,s:[]}", "item_id",
                      a->item_id, "output_index", idx, "content_index", 0, "delta", piece, "logprobs"));
    }
  }
  free(piece);
  return rc;
}

typedef enum finish_kind { FINISH_EOS, FINISH_STOP, FINISH_LENGTH } finish_kind;

/* A stream's tool calls, after its text: a chat delta per call; a messages tool_use block per
** call (input as one input_json_delta); a responses function_call item per call. */
static int stream_tool_calls(answer *a) {
  int rc = 0;
  for (size_t i = 0; i < a->tools.n_calls && !rc; i++) {
    const st_tool_call *c = &a->tools.calls[i];
    char *args = call_arguments(c), id[96];
    if (!args) return -1;
    if (a->p->api == API_CHAT) {
      call_name(a, "call_", i, id, sizeof id);
      rc = send_event(a, NULL, chat_chunk(a, json_pack("{s:[{s:i,s:s,s:s,s:{s:s,s:s}}]}", "tool_calls",
                      "index", (int)i, "id", id, "type", "function", "function", "name", c->name,
                      "arguments", args), NULL));
    } else if (a->p->api == API_MESSAGES) {
      if (!(rc = close_block(a))) {
        int idx = a->n_blocks++;
        call_name(a, "toolu_", i, id, sizeof id);
        rc = send_event(a, "content_block_start", json_pack("{s:s,s:i,s:{s:s,s:s,s:s,s:{}}}", "type",
                        "content_block_start", "index", idx, "content_block", "type", "tool_use",
                        "id", id, "name", c->name, "input"));
        if (!rc) rc = send_event(a, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s}}", "type",
                                 "content_block_delta", "index", idx, "delta", "type",
                                 "input_json_delta", "partial_json", args));
        if (!rc) rc = send_event(a, "content_block_stop", json_pack("{s:s,s:i}", "type",
                                 "content_block_stop", "index", idx));
      }
    } else if (!(rc = close_block(a))) {
      int idx = a->n_blocks++;
      call_name(a, "fc_", i, id, sizeof id);
      rc = resp_event(a, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", idx,
                      "item", responses_call_item(a, i, "in_progress", 0)));
      if (!rc) rc = resp_event(a, "response.function_call_arguments.delta", json_pack("{s:s,s:i,s:s}",
                               "item_id", id, "output_index", idx, "delta", args));
      if (!rc) rc = resp_event(a, "response.function_call_arguments.done", json_pack("{s:s,s:i,s:s,s:s}",
                               "item_id", id, "output_index", idx, "name", c->name, "arguments", args));
      if (!rc) rc = resp_event(a, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", idx,
                               "item", responses_call_item(a, i, "completed", 1)));
    }
    free(args);
  }
  return rc;
}

/* A whole JSON answer; NULL (building it ran out of memory): a 500 saying so in the API's shape. */
static int reply_answer(answer *a, const char *body) {
  if (body) return st_served_reply(a->x, 200, "application/json", body, strlen(body));
  reply_error(a->x, a->p->api, 500, "out_of_memory", "out of memory writing the answer");
  return -1;
}

/* The end: the closing events of a stream, or the whole JSON body. */
static int answer_finish(answer *a, finish_kind why, const char *stop_seq, int n_generated,
                         const int32_t *prompt_ids, const int32_t *gen_ids) {
  const request_params *p = a->p;
  const char *reasoning = a->reasoning.len ? a->reasoning.data : NULL;
  const char *content = a->content.len ? a->content.data : "";
  int n_prompt = a->n_prompt;
  size_t n_calls = a->tools.n_calls;
  if (p->stream && n_calls && stream_tool_calls(a) < 0) return -1;
  if (p->api == API_CHAT) {
    const char *finish = n_calls ? "tool_calls" : why == FINISH_LENGTH ? "length" : "stop";
    json_t *usage = json_pack("{s:i,s:i,s:i}", "prompt_tokens", n_prompt, "completion_tokens",
                              n_generated, "total_tokens", n_prompt + n_generated);
    if (p->stream) {
      int rc = send_event(a, NULL, chat_chunk(a, json_object(), finish));
      if (!rc && p->include_usage) {
        json_t *u = json_pack("{s:s,s:s,s:I,s:s,s:[],s:O}", "id", a->id, "object", "chat.completion.chunk",
                              "created", (json_int_t)a->created, "model", p->model, "choices", "usage", usage);
        rc = send_event(a, NULL, u);
      }
      json_decref(usage);
      if (!rc && st_served_write(a->x, "data: [DONE]\n\n", 14) < 0) {
        a->gone = 1;
        rc = -1;
      }
      return rc;
    }
    json_t *msg = json_pack("{s:s,s:o}", "role", "assistant", "content",
                            n_calls && !*content ? json_null() : json_string(content));
    if (reasoning) json_object_set_new(msg, "reasoning_content", json_string(reasoning));
    if (n_calls) {
      json_t *calls = json_array();
      for (size_t i = 0; i < n_calls; i++) {
        char id[96], *args = call_arguments(&a->tools.calls[i]);
        call_name(a, "call_", i, id, sizeof id);
        json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function",
                              "function", "name", a->tools.calls[i].name, "arguments", args ? args : "{}"));
        free(args);
      }
      json_object_set_new(msg, "tool_calls", calls);
    }
    json_t *choice = json_pack("{s:i,s:o,s:n,s:s}", "index", 0, "message", msg, "logprobs",
                               "finish_reason", finish);
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", a->id, "object", "chat.completion",
                          "created", (json_int_t)a->created, "model", p->model, "choices", choice,
                          "usage", usage);
    if (p->return_token_ids) { /* vLLM's fields (what capture --ask-prompt-ids vllm reads) */
      json_t *gi = json_array();
      for (int i = 0; i < n_generated; i++) json_array_append_new(gi, json_integer(gen_ids[i]));
      json_object_set_new(o, "prompt_token_ids", id_array(prompt_ids, n_prompt));
      json_object_set_new(choice, "token_ids", gi);
    }
    if (p->return_prompt_token_ids) /* sglang's (capture --ask-prompt-ids sglang) */
      json_object_set_new(choice, "prompt_token_ids", id_array(prompt_ids, n_prompt));
    char *body = dump(o);
    int rc = reply_answer(a, body);
    free(body);
    return rc;
  }
  if (p->api == API_MESSAGES) {
    const char *reason = n_calls ? "tool_use" : why == FINISH_LENGTH ? "max_tokens"
                         : why == FINISH_STOP ? "stop_sequence" : "end_turn";
    if (p->stream) {
      if (!a->content_opened && !n_calls) open_block(a, 2); /* an empty answer still has its text block */
      int rc = close_block(a);
      if (!rc) rc = send_event(a, "message_delta", json_pack("{s:s,s:{s:s,s:o},s:{s:i}}", "type", "message_delta",
                               "delta", "stop_reason", reason, "stop_sequence", stop_seq ? json_string(stop_seq)
                               : json_null(), "usage", "output_tokens", n_generated));
      if (!rc) rc = send_event(a, "message_stop", json_pack("{s:s}", "type", "message_stop"));
      return rc;
    }
    json_t *blocks = json_array();
    if (reasoning) {
      char sig[32];
      thinking_signature(reasoning, sig);
      json_array_append_new(blocks, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking",
                                              reasoning, "signature", sig));
    }
    if (*content || !n_calls) json_array_append_new(blocks, json_pack("{s:s,s:s}", "type", "text", "text", content));
    for (size_t i = 0; i < n_calls; i++) {
      char id[96];
      call_name(a, "toolu_", i, id, sizeof id);
      json_array_append_new(blocks, json_pack("{s:s,s:s,s:s,s:O}", "type", "tool_use", "id", id, "name",
                                              a->tools.calls[i].name, "input", a->tools.calls[i].arguments));
    }
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:o,s:{s:i,s:i}}", "id", a->id, "type", "message",
                          "role", "assistant", "model", p->model, "content", blocks, "stop_reason", reason,
                          "stop_sequence", stop_seq ? json_string(stop_seq) : json_null(), "usage",
                          "input_tokens", n_prompt, "output_tokens", n_generated);
    char *body = dump(o);
    int rc = reply_answer(a, body);
    free(body);
    return rc;
  }
  /* responses */
  const char *status = why == FINISH_LENGTH ? "incomplete" : "completed";
  const char *incomplete = why == FINISH_LENGTH ? "max_output_tokens" : NULL;
  json_t *usage = json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", n_prompt,
                            "input_tokens_details", "cached_tokens", 0, "output_tokens", n_generated,
                            "output_tokens_details", "reasoning_tokens", 0, "total_tokens",
                            n_prompt + n_generated);
  json_t *output = json_array();
  if (reasoning) json_array_append_new(output, responses_reasoning_item(a, reasoning));
  if (*content || !n_calls) json_array_append_new(output, responses_message_item(a, "completed", content));
  for (size_t i = 0; i < n_calls; i++) json_array_append_new(output, responses_call_item(a, i, "completed", 1));
  json_t *o = responses_object(a, status, output, usage, incomplete);
  if (p->stream) {
    if (!a->content_opened && !n_calls) open_block(a, 2); /* the message item the body has, even empty */
    int rc = close_block(a);
    if (!rc) rc = resp_event(a, why == FINISH_LENGTH ? "response.incomplete" : "response.completed",
                             json_pack("{s:o}", "response", o));
    else json_decref(o);
    return rc;
  }
  char *body = dump(o);
  int rc = reply_answer(a, body);
  free(body);
  return rc;
}

/* ---- text from tokens ------------------------------------------------------------------------------ */

/* Bytes of s[0..n) that end on a complete UTF-8 character. */
static size_t utf8_complete(const char *s, size_t n) {
  size_t i = n, back = 0;
  while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--, back++;
  if (i == 0) return n;
  unsigned char lead = (unsigned char)s[i - 1];
  size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return back + 1 >= need ? n : i - 1;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of word. */
static size_t partial_suffix(const char *s, size_t n, const char *word) {
  size_t w = strlen(word);
  for (size_t k = w > 1 ? w - 1 : 0; k > 0; k--)
    if (k <= n && !memcmp(s + n - k, word, k)) return k;
  return 0;
}

/* Splits the decoded answer into channels and streams what is final. State across calls. */
typedef struct splitter {
  int thinking;          /* the prompt opened <think>: reasoning first */
  size_t r_sent, c_sent; /* bytes of reasoning / content emitted */
  int stopped;           /* a stop sequence was found */
  const char *stop_seq;
  char tools_error[256]; /* why a DSML block was answered as text ("" when none was) */
} splitter;

/* text: the whole decoded answer so far; final: no more tokens follow. */
static int split_emit(answer *a, splitter *sp, const char *text, size_t n, int final) {
  static const char think_end[] = "</think>";
  size_t ready = final ? n : utf8_complete(text, n);
  const char *content = text;
  size_t c_len = ready;
  if (sp->thinking) {
    const char *end = memmem(text, ready, think_end, sizeof think_end - 1);
    size_t r_len = end ? (size_t)(end - text) : ready - (final ? 0 : partial_suffix(text, ready, think_end));
    if (r_len > sp->r_sent && answer_delta(a, 1, text + sp->r_sent, r_len - sp->r_sent) < 0) return -1;
    sp->r_sent = r_len > sp->r_sent ? r_len : sp->r_sent;
    if (!end) return 0;
    content = end + sizeof think_end - 1;
    c_len = ready - (size_t)(content - text);
  }
  size_t safe = c_len;
  for (int i = 0; i < a->p->n_stops; i++) {
    const char *hit = memmem(content, c_len, a->p->stops[i], strlen(a->p->stops[i]));
    if (hit && (size_t)(hit - content) <= safe && (!sp->stopped || (size_t)(hit - content) < safe)) {
      safe = (size_t)(hit - content);
      sp->stopped = 1;
      sp->stop_seq = a->p->stops[i];
    }
  }
  if (!sp->stopped && !final)
    for (int i = 0; i < a->p->n_stops; i++) {
      size_t k = partial_suffix(content, c_len, a->p->stops[i]);
      if (c_len - k < safe) safe = c_len - k;
    }
  /* tool calls: the content ends where the DSML block begins; at the end the block is parsed */
  const char *marker = st_chat_tool_calls_marker();
  const char *block = memmem(content, safe, marker, strlen(marker));
  if (block && final) {
    st_chat_completion_free(&a->tools);
    if (st_chat_parse_completion(content, safe, &a->tools) == ST_OK && a->tools.n_calls) {
      safe = a->tools.content_len;
    } else { /* answered as the text it is */
      snprintf(sp->tools_error, sizeof sp->tools_error, "%s", st_errmsg());
      st_clear_error();
    }
  } else if (block) {
    safe = (size_t)(block - content);
  } else if (!final) {
    safe -= partial_suffix(content, safe, marker);
  }
  if (!final) /* whitespace that may turn out to precede a block waits for what follows it */
    while (safe > sp->c_sent && (content[safe - 1] == ' ' || content[safe - 1] == '\n' ||
                                 content[safe - 1] == '\t' || content[safe - 1] == '\r'))
      safe--;
  if (safe > sp->c_sent && answer_delta(a, 2, content + sp->c_sent, safe - sp->c_sent) < 0) return -1;
  if (safe > sp->c_sent) sp->c_sent = safe;
  return 0;
}

/* ---- the engine's queue ------------------------------------------------------------------------- */

/* 0: the engine is this request's; 429 queue full; 503 shutting down. */
static int engine_acquire(server *sv) {
  pthread_mutex_lock(&sv->mu);
  if (sv->stopping) return pthread_mutex_unlock(&sv->mu), 503;
  if (sv->busy && sv->waiting >= sv->queue_max) return pthread_mutex_unlock(&sv->mu), 429;
  unsigned long long ticket = sv->next_ticket++;
  sv->waiting++;
  while ((sv->busy || ticket != sv->now_serving) && !sv->stopping) pthread_cond_wait(&sv->cv, &sv->mu);
  sv->waiting--;
  if (sv->stopping) {
    pthread_cond_broadcast(&sv->cv);
    pthread_mutex_unlock(&sv->mu);
    return 503;
  }
  sv->busy = 1;
  pthread_mutex_unlock(&sv->mu);
  return 0;
}

static void engine_release(server *sv) {
  pthread_mutex_lock(&sv->mu);
  sv->busy = 0;
  sv->now_serving++;
  pthread_cond_broadcast(&sv->cv);
  pthread_mutex_unlock(&sv->mu);
}

/* ---- one generation ------------------------------------------------------------------------------ */

/* st_tokenizer_encode on the server's tokenizer, one worker at a time (see server.tok_mu). */
static st_status encode_locked(server *sv, const st_chat_prompt *prompt, const char *text,
                               size_t len, st_token_ids *out) {
  pthread_mutex_lock(&sv->tok_mu);
  st_status rc = prompt ? st_chat_prompt_ids(sv->tok, prompt, out)
                        : st_tokenizer_encode(sv->tok, text, len, 0, out);
  pthread_mutex_unlock(&sv->tok_mu);
  return rc;
}

/* Splits "a,b,c" into at most max pieces (trimmed) in buf; returns the count. */
static int split_list(const char *text, char *buf, size_t buf_len, const char **out, int max) {
  snprintf(buf, buf_len, "%s", text);
  int n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save)) {
    while (*t == ' ' || *t == '\t') t++;
    char *e = t + strlen(t);
    while (e > t && (e[-1] == ' ' || e[-1] == '\t')) *--e = 0;
    if (*t) out[n++] = t;
  }
  return n;
}

/* Renders, queues, generates and answers one API request (the engine held only while generating). */
static void serve_generate(server *sv, st_served_exchange *x, api_kind api) {
  size_t body_len;
  const char *body_text = st_served_body(x, &body_len);
  json_error_t jerr;
  errno = 0;
  json_t *body = json_loadb(body_text, body_len, 0, &jerr); /* duplicate keys: the last wins, as in Python servers */
  int body_oom = !body && st_json_out_of_memory(&jerr);
  st_chat_prompt prompt = {0};
  st_token_ids ids = {0}, script = {0};
  st_sampler sampler = {0};
  st_taps taps = {0};
  st_recorder *recorder = NULL;
  st_session *session = NULL;
  float *logits = NULL;
  int32_t *tokens = NULL;
  char *text = NULL;
  int held = 0;
  answer a = {.x = x};
  char msg[1024], settings_json[2048], trace_path[4096], set_buf[1024], tap_buf[1024];
  if (body_oom) {
    reply_error(x, api, 500, "out_of_memory", "out of memory reading the request body");
    goto out;
  }
  if (!body) {
    reply_error(x, api, 400, "invalid_json", "the request body is not valid JSON: line %d column %d: %s",
                jerr.line, jerr.column, jerr.text);
    goto out;
  }
  if (!json_is_object(body)) {
    reply_error(x, api, 400, "invalid_request", "the request body must be a JSON object");
    goto out;
  }
  request_params p = {.api = api};
  errno = 0;
  int status = read_params(sv, body, &p, msg, sizeof msg);
  if (status && reply_if_out_of_memory(x, api, ST_OK, "reading the request")) goto out;
  if (status) {
    reply_error(x, api, status, "invalid_request", "%s", msg);
    goto out;
  }
  a.p = &p;

  /* the request's settings and taps: the server's, then its headers */
  st_settings settings = sv->settings;
  const char *hdr = st_served_header(x, "x-sparsetrace-set");
  if (hdr) {
    const char *kv[32];
    int n = split_list(hdr, set_buf, sizeof set_buf, kv, 32);
    for (int i = 0; i < n; i++)
      if (st_settings_set(&settings, kv[i])) {
        reply_error(x, api, 400, "invalid_setting", "X-Sparsetrace-Set: %s", st_errmsg());
        goto out;
      }
  }
  const char *tap_globs[40];
  int n_taps = 0;
  hdr = st_served_header(x, "x-sparsetrace-tap");
  if (hdr) {
    n_taps = split_list(hdr, tap_buf, sizeof tap_buf, tap_globs, 32);
    if (n_taps == 1 && !strcmp(tap_globs[0], "none")) n_taps = 0;
  } else {
    for (int i = 0; i < sv->n_taps && i < 32; i++) tap_globs[n_taps++] = sv->taps[i];
  }
  const char *positions = st_served_header(x, "x-sparsetrace-positions");
  if (!positions) positions = sv->positions;
  const char *needle = st_served_header(x, "x-sparsetrace-needle");
  if (needle && !*needle) needle = NULL;

  /* the prompt, as render and run --request make it */
  st_chat_options opt;
  st_chat_options_default(&opt);
  opt.profile = sv->profile;
  opt.api = api == API_CHAT ? ST_API_CHAT : api == API_MESSAGES ? ST_API_ANTHROPIC : ST_API_RESPONSES;
  errno = 0;
  st_status rc = st_chat_render_request(body, &opt, &prompt);
  if (!rc) rc = encode_locked(sv, &prompt, NULL, 0, &ids);
  if (rc && reply_if_out_of_memory(x, api, rc, "rendering the request")) goto out;
  if (rc) {
    reply_error(x, api, 400, rc == ST_EUNSUPPORTED ? "unsupported_content" : "invalid_request", "%s", st_errmsg());
    goto out;
  }
  if (!ids.n) {
    reply_error(x, api, 400, "invalid_request", "the request renders to an empty prompt");
    goto out;
  }
  int n_prompt = (int)ids.n;
  a.n_prompt = n_prompt;
  a.prompt_ids = ids.ids;
  if ((int64_t)n_prompt + p.max_new > sv->context) {
    if (n_prompt >= sv->context)
      reply_error(x, api, 400, "context_length_exceeded", "prompt is too long: %d tokens > %d maximum "
                  "(serve --context)", n_prompt, sv->context);
    else
      reply_error(x, api, 400, "context_length_exceeded", "prompt of %d tokens plus %s %d exceeds the "
                  "context of %d tokens (serve --context)", n_prompt, api == API_RESPONSES
                  ? "max_output_tokens" : "max_tokens", p.max_new, sv->context);
    goto out;
  }
  int64_t needle_start = 0, needle_end = 0;
  if (needle) {
    errno = 0;
    st_status nrc = st_needle_locate(sv->model_dir, ids.ids, n_prompt, needle, &needle_start, &needle_end);
    if (nrc && reply_if_out_of_memory(x, api, nrc, "locating X-Sparsetrace-Needle")) goto out;
    if (nrc) {
      reply_error(x, api, 400, "needle_not_found", "X-Sparsetrace-Needle: %s", st_errmsg());
      goto out;
    }
    tap_globs[n_taps++] = "layers.*.indexer.*";
  }
  const st_config *cfg = sv->model->cfg;
  errno = 0;
  st_status trc = st_taps_arm(&taps, cfg->num_hidden_layers, tap_globs, n_taps);
  if (trc && reply_if_out_of_memory(x, api, trc, "arming the taps")) goto out;
  if (trc) {
    reply_error(x, api, 400, "invalid_tap", "X-Sparsetrace-Tap / --tap: %s", st_errmsg());
    goto out;
  }

  uint64_t seed = p.seed;
  if (!p.has_seed) /* the request row's id: a different stream per request, and reported */
    for (const char *c = st_served_id(x); *c; c++) seed = (seed ^ (unsigned char)*c) * 0x100000001b3ull;
  errno = 0;
  st_status src = st_sampler_init(&sampler, (int)cfg->vocab_size, p.temperature, p.top_p, seed);
  if (src && reply_if_out_of_memory(x, api, src, "preparing the sampler")) goto out;
  if (src) {
    reply_error(x, api, 400, "invalid_request", "%s", st_errmsg());
    goto out;
  }
  if (p.temperature > 0) {
    char seed_text[32];
    snprintf(seed_text, sizeof seed_text, "%llu", (unsigned long long)seed);
    st_served_add_header(x, "X-Sparsetrace-Seed", seed_text);
  }

  /* the engine */
  status = engine_acquire(sv);
  if (status == 429) {
    reply_error(x, api, 429, "rate_limit_exceeded", "the engine is busy and %d request%s already wait "
                "for it (serve --queue %d); retry later", sv->queue_max, sv->queue_max == 1 ? "" : "s",
                sv->queue_max);
    goto out;
  }
  if (status == 503) {
    reply_error(x, api, 503, "shutting_down", "sparsetrace serve is shutting down");
    goto out;
  }
  held = 1;
  if (sv->script) { /* --script-answers: this request's text, as tokens, then EOS */
    json_t *t = json_array_get(sv->script, sv->script_next++ % json_array_size(sv->script));
    if (encode_locked(sv, NULL, json_string_value(t), json_string_length(t), &script)) {
      reply_error(x, api, 500, "server_error", "--script-answers: %s", st_errmsg());
      goto out;
    }
  }

  st_settings resolved = settings;
  st_settings_resolve(&resolved, cfg);
  st_settings_json(&resolved, settings_json, sizeof settings_json);
  st_run_meta meta = {0};
  int traced = n_taps > 0;
  char *config_text = NULL;
  if (traced) {
    char config_path[4096], command_line[512];
    snprintf(config_path, sizeof config_path, "%s/config.json", sv->model_dir);
    config_text = st_read_text_file(config_path);
    snprintf(command_line, sizeof command_line, "sparsetrace serve %s %s", st_served_method(x), st_served_path(x));
    meta = (st_run_meta){.model_dir = sv->model_dir, .model_name = sv->model_name,
                         .settings_json = settings_json, .config_json = config_text ? config_text : "{}",
                         .backend = sv->backend.ops->name, .kernel_mode = sv->backend.ops->kernel_mode,
                         .threads = sv->threads, .command_line = command_line, .positions = positions,
                         .n_layers = cfg->num_hidden_layers, .request_id = st_served_id(x),
                         .needle_start = needle_start, .needle_end = needle_end, .needle_text = needle};
    st_run_id_new(&meta);
    snprintf(trace_path, sizeof trace_path, "%s/runs/%s.h5", sv->store, meta.run_id);
    rc = st_recorder_open(trace_path, sv->store, &meta, n_prompt, &recorder);
    free(config_text);
    if (rc) {
      reply_error(x, api, 500, "trace_error", "starting the trace: %s", st_errmsg());
      goto out;
    }
    taps.sink = st_recorder_sink(recorder);
    st_served_add_header(x, "X-Sparsetrace-Run", meta.run_id);
    st_served_add_header(x, "X-Sparsetrace-Trace", trace_path);
  }
  st_served_add_header(x, "X-Sparsetrace-Settings", settings_json);
  st_session_options so = {.max_tokens = (int64_t)n_prompt + p.max_new, .settings = settings,
                           .taps = &taps, .backend = &sv->backend};
  tokens = malloc(sizeof(int32_t) * ((size_t)n_prompt + (size_t)p.max_new));
  logits = malloc(sizeof(float) * (size_t)cfg->vocab_size);
  if (!tokens || !logits) {
    reply_error(x, api, 500, "server_error", "out of memory for a prompt of %d tokens", n_prompt);
    goto out;
  }
  memcpy(tokens, ids.ids, sizeof(int32_t) * (size_t)n_prompt);
  if (st_session_create(sv->model, &so, &session)) {
    reply_error(x, api, 500, "server_error", "engine session: %s", st_errmsg());
    goto out;
  }
  /* ids for the answer's names: the request row's uuid without dashes */
  size_t h = 0;
  for (const char *c = st_served_id(x); *c && h + 1 < sizeof a.hex; c++)
    if (*c != '-') a.hex[h++] = *c;
  a.hex[h] = 0;
  snprintf(a.id, sizeof a.id, "%s%s", api == API_CHAT ? "chatcmpl-" : api == API_MESSAGES ? "msg_" : "resp_", a.hex);
  snprintf(a.item_id, sizeof a.item_id, "msg_%s", a.hex);
  snprintf(a.reasoning_id, sizeof a.reasoning_id, "rs_%s", a.hex);
  a.created = (long)time(NULL);
  splitter sp = {.thinking = prompt.thinking};
  if (answer_start(&a) < 0) goto out;

  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  rc = st_session_forward(session, tokens, n_prompt, logits, NULL);
  int n_gen = 0;
  finish_kind why = FINISH_LENGTH;
  int32_t *gen = tokens + n_prompt;
  while (!rc && n_gen < p.max_new) {
    int32_t next = !sv->script ? st_sampler_next(&sampler, logits)
                   : (size_t)n_gen < script.n ? script.ids[n_gen] : (int32_t)cfg->eos_token_id;
    gen[n_gen++] = next;
    if (next == cfg->eos_token_id) {
      why = FINISH_EOS;
      break;
    }
    free(text);
    text = NULL;
    size_t len = 0;
    if ((rc = st_tokenizer_decode(sv->tok, gen, (size_t)n_gen, ST_TOK_SKIP_SPECIAL, &text, &len))) break;
    if (split_emit(&a, &sp, text, len, 0) < 0 || a.gone || st_served_client_gone(x)) break;
    if (sp.stopped) {
      why = FINISH_STOP;
      break;
    }
    if (n_gen < p.max_new) rc = st_session_forward(session, &next, 1, logits, NULL);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (rc) {
    if (!p.stream) reply_error(x, api, 500, "engine_error", "the engine failed: %s", st_errmsg());
    goto out;
  }
  if (a.gone || st_served_client_gone(x)) goto out; /* the trace stays a .part: nothing answered */
  /* the rest of the text: the whole answer, final */
  free(text);
  text = NULL;
  size_t len = 0;
  int n_text = why == FINISH_EOS ? n_gen - 1 : n_gen;
  if (st_tokenizer_decode(sv->tok, gen, (size_t)n_text, ST_TOK_SKIP_SPECIAL, &text, &len) == ST_OK)
    split_emit(&a, &sp, text, len, 1);
  if (sp.stopped) why = FINISH_STOP;
  if (*sp.tools_error) {
    char line[400];
    snprintf(line, sizeof line, "warning: %s: answered as text: %s", st_served_id(x), sp.tools_error);
    log_line(sv, line);
  }
  if (recorder) {
    st_recorder_note_nonfinite(recorder, sv->model->nonfinite_tensors + st_session_nonfinite_logits(session));
    st_recorder *finishing = recorder;
    recorder = NULL;
    if (st_recorder_finish(finishing, tokens, (int64_t)n_prompt + n_gen, n_prompt)) {
      log_line(sv, "warning: the trace of this request could not be finished");
      st_clear_error();
    } else if (needle_end > needle_start) {
      st_needle_summary *summary = calloc(1, sizeof *summary);
      if (!summary || st_needle_record_verdicts(trace_path, sv->model_dir, sv->store, needle_start,
                                                needle_end, needle, 1, summary)) {
        log_line(sv, "warning: the needle verdicts of this request could not be recorded");
        st_clear_error();
      }
      free(summary);
    }
  }
  answer_finish(&a, why, why == FINISH_STOP ? sp.stop_seq : NULL, n_gen, tokens, gen);
  if (!sv->quiet) {
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    char line[512];
    snprintf(line, sizeof line, "%s: %d prompt + %d generated tokens in %.2f s%s%s", st_served_id(x),
             n_prompt, n_gen, s, traced ? ", run " : "", traced ? meta.run_id : "");
    log_line(sv, line);
  }
out:
  if (held) engine_release(sv);
  st_recorder_abort(recorder);
  st_session_free(session);
  st_taps_free(&taps);
  st_token_ids_free(&ids);
  st_token_ids_free(&script);
  st_sampler_free(&sampler);
  st_chat_completion_free(&a.tools);
  st_chat_prompt_free(&prompt);
  st_buf_free(&a.reasoning);
  st_buf_free(&a.content);
  free(tokens);
  free(logits);
  free(text);
  json_decref(body);
  st_clear_error();
}

static void handle(void *user, st_served_exchange *x) {
  server *sv = user;
  const char *path = st_served_path(x), *method = st_served_method(x);
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') n--;
  api_kind api = API_CHAT;
  int is_api = 1;
  if (n == 20 && !strncmp(path, "/v1/chat/completions", n)) api = API_CHAT;
  else if (n == 12 && !strncmp(path, "/v1/messages", n)) api = API_MESSAGES;
  else if (n == 13 && !strncmp(path, "/v1/responses", n)) api = API_RESPONSES;
  else is_api = 0;
  if (!is_api && st_served_header(x, "anthropic-version")) api = API_MESSAGES;
  char why[256];
  int problem = st_served_body_problem(x, why, sizeof why);
  if (problem) {
    reply_error(x, api, problem, problem == 413 ? "request_too_large" : "invalid_request", "%s", why);
    return;
  }
  if (is_api) {
    if (strcmp(method, "POST")) {
      st_served_add_header(x, "Allow", "POST");
      reply_error(x, api, 405, "method_not_allowed", "%s %s: use POST", method, path);
      return;
    }
    serve_generate(sv, x, api);
    return;
  }
  if (!strcmp(method, "GET") && n == 7 && !strncmp(path, "/health", n)) {
    pthread_mutex_lock(&sv->mu);
    char *body = dump(json_pack("{s:s,s:s,s:i,s:i,s:i}", "status", sv->stopping ? "stopping" : "ok",
                                "model", sv->model_name, "busy", sv->busy, "waiting", sv->waiting,
                                "queue", sv->queue_max));
    pthread_mutex_unlock(&sv->mu);
    st_served_reply(x, 200, "application/json", body ? body : "{}", body ? strlen(body) : 2);
    free(body);
    return;
  }
  if (!strcmp(method, "GET") && n == 10 && !strncmp(path, "/v1/models", n)) {
    json_t *o;
    if (st_served_header(x, "anthropic-version")) {
      char created[32];
      st_utc_now(created, sizeof created);
      o = json_pack("{s:[{s:s,s:s,s:s,s:s}],s:b,s:s,s:s}", "data", "type", "model", "id",
                    sv->model_name, "display_name", sv->model_name, "created_at", created, "has_more",
                    0, "first_id", sv->model_name, "last_id", sv->model_name);
    } else {
      o = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", sv->model_name,
                    "object", "model", "created", (json_int_t)time(NULL), "owned_by", "sparsetrace");
    }
    char *body = dump(o);
    st_served_reply(x, 200, "application/json", body ? body : "{}", body ? strlen(body) : 2);
    free(body);
    return;
  }
  reply_error(x, api, 404, "not_found", "%s %s: sparsetrace serve answers POST /v1/chat/completions, "
              "/v1/messages, /v1/responses and GET /v1/models, /health", method, path);
}

/* ---- the command ------------------------------------------------------------------------------- */

int st_cmd_serve(int argc, char **argv) {
  server sv = {0};
  sv.default_max_new = 256;
  sv.context = 16384;
  sv.queue_max = 8;
  sv.profile = ST_RENDER_REFERENCE;
  st_settings_default(&sv.settings);
  pthread_mutex_init(&sv.mu, NULL);
  pthread_cond_init(&sv.cv, NULL);
  pthread_mutex_init(&sv.tok_mu, NULL);
  const char *ready_file = NULL, *listen = NULL;
  int port = 8788, c, exit_code = 2;
  int64_t v;
  st_opts o;
  st_opts_init(&o, &serve_spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0) {
    switch (c) {
    case ST_OPT_PORT:
      if (st_opt_int(o.name, o.arg, 0, 65535, &v)) goto bad_value;
      port = (int)v;
      break;
    case ST_OPT_LISTEN: listen = o.arg; break;
    case ST_OPT_QUEUE:
      if (st_opt_int(o.name, o.arg, 0, 256, &v)) goto bad_value;
      sv.queue_max = (int)v;
      break;
    case ST_OPT_CONTEXT:
      if (st_opt_int(o.name, o.arg, 2, 1 << 24, &v)) goto bad_value;
      sv.context = (int)v;
      break;
    case ST_OPT_MAX_NEW_TOKENS:
      if (st_opt_int(o.name, o.arg, 1, 1000000, &v)) goto bad_value;
      sv.default_max_new = (int)v;
      break;
    case ST_OPT_RENDER:
      if (st_render_profile_parse(o.arg, &sv.profile)) goto bad_value;
      break;
    case ST_OPT_READY_FILE: ready_file = o.arg; break;
    case ST_OPT_SCRIPT_ANSWERS: {
      json_error_t e;
      json_decref(sv.script);
      sv.script = json_load_file(o.arg, 0, &e);
      size_t i;
      json_t *t;
      int ok = json_is_array(sv.script) && json_array_size(sv.script) > 0;
      json_array_foreach(sv.script, i, t) ok = ok && json_is_string(t);
      if (!ok) {
        st_opts_error(&o, "--script-answers %s: %s", o.arg, sv.script ? "expected a non-empty JSON array "
                      "of strings" : e.text);
        goto usage_out;
      }
      break;
    }
    default:
      st_opts_error(&o, "unexpected argument '%s'", o.arg);
      goto usage_out;
    }
  }
  if (c == ST_OPTS_EXIT) {
    exit_code = o.exit_code;
    goto usage_out;
  }
  if (!o.model) {
    st_opts_error(&o, "--model DIR is required");
    goto usage_out;
  }
  for (int i = 0; i < o.n_sets; i++)
    if (st_settings_set(&sv.settings, o.sets[i])) goto bad_value;
  sv.model_dir = o.model;
  sv.store = o.store ? o.store : ST_DEFAULT_STORE;
  sv.positions = o.positions;
  sv.taps = o.taps;
  sv.n_taps = o.n_taps > 32 ? 32 : o.n_taps;
  sv.quiet = o.quiet;
  char host[128] = "127.0.0.1";
  if (listen) {
    const char *colon = strrchr(listen, ':');
    size_t hn = colon ? (size_t)(colon - listen) : strlen(listen);
    if (hn >= sizeof host) { st_opts_error(&o, "--listen %s: host too long", listen); goto usage_out; }
    if (hn) {
      memcpy(host, listen, hn);
      host[hn] = 0;
    }
    if (colon && (st_opt_int("listen", colon + 1, 0, 65535, &v))) goto bad_value;
    if (colon) port = (int)v;
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  }
  exit_code = 1;
  sv.threads = st_opts_apply_threads(o.threads);
  char *model_copy = strdup(sv.model_dir);
  snprintf(sv.model_name, sizeof sv.model_name, "%s", model_copy ? basename(model_copy) : "model");
  free(model_copy);
  if (st_opts_backend_available(o.backend) ||
      st_model_open(sv.model_dir, &sv.model) || st_model_load_all(sv.model) ||
      st_backend_open(o.backend ? o.backend : ST_BACKEND_DEFAULT, &sv.backend) ||
      st_tokenizer_open(sv.model_dir, &sv.tok)) {
    st_cli_report_error("serve");
    goto out;
  }
  if (sv.context > sv.model->cfg->max_position_embeddings) sv.context = (int)sv.model->cfg->max_position_embeddings;
  { /* one token through a throwaway session before listening: the first request's latency is
    ** then the engine's, not the first touch of every weight page */
    st_session *warm = NULL;
    st_session_options wo = {.max_tokens = 1, .settings = sv.settings, .backend = &sv.backend};
    int32_t bos = st_tokenizer_bos_id(sv.tok) >= 0 ? st_tokenizer_bos_id(sv.tok) : 0;
    if (st_session_create(sv.model, &wo, &warm) || st_session_forward(warm, &bos, 1, NULL, NULL)) {
      st_session_free(warm);
      st_cli_report_error("serve");
      goto out;
    }
    st_session_free(warm);
  }

  signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, NULL); /* before any thread: all inherit the mask */

  char served_by[4200];
  snprintf(served_by, sizeof served_by, "sparsetrace serve: %s", sv.model_dir);
  st_served_config sc = {.host = host, .port = port, .store_dir = sv.store, .served_by = served_by,
                         .threads = sv.queue_max + 5, .handler = handle, .log = log_line, .user = &sv};
  if (st_served_start(&sc, &sv.served)) {
    st_cli_report_error("serve");
    goto out;
  }
  const char *url = st_served_url(sv.served);
  fprintf(stderr, "sparsetrace serve: %s on %s (%s, queue %d, context %d), recording into %s/index.sqlite\n"
          "sparsetrace serve: clients: OPENAI_BASE_URL=%s/v1  ANTHROPIC_BASE_URL=%s  (Ctrl-C to stop)\n",
          sv.model_name, url, sv.backend.ops->name, sv.queue_max, sv.context, sv.store, url, url);
  if (strncmp(host, "127.", 4) && strcmp(host, "::1") && strcmp(host, "[::1]"))
    fprintf(stderr, "sparsetrace serve: warning: listening on %s, not loopback: anyone who can reach it "
            "can use the engine\n", host);
  if (ready_file) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", ready_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%s\n", url) < 0 || fclose(f) != 0 || rename(tmp, ready_file) != 0) {
      fprintf(stderr, "sparsetrace serve: cannot write --ready-file %s: %s\n", ready_file, strerror(errno));
      st_served_stop(sv.served);
      goto out;
    }
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  fprintf(stderr, "sparsetrace serve: %s received: finishing the request in flight, refusing new ones\n",
          strsignal(sig));
  pthread_mutex_lock(&sv.mu);
  sv.stopping = 1;
  pthread_cond_broadcast(&sv.cv);
  while (sv.busy || sv.waiting) pthread_cond_wait(&sv.cv, &sv.mu);
  pthread_mutex_unlock(&sv.mu);
  if (st_served_stop(sv.served)) {
    st_cli_report_error("serve");
    goto out;
  }
  fprintf(stderr, "sparsetrace serve: stopped; every request is in %s/index.sqlite\n", sv.store);
  exit_code = 0;
  goto out;
bad_value:
  st_opts_fail(&o);
usage_out:
  st_opts_free(&o);
  json_decref(sv.script);
  return exit_code ? exit_code : 0;
out:
  st_tokenizer_close(sv.tok);
  st_model_close(sv.model);
  st_backend_close(&sv.backend);
  st_opts_free(&o);
  json_decref(sv.script);
  return exit_code;
}
