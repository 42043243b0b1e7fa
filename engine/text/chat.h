/*
** chat.h — the DeepSeek-V4 chat encoding, and how serving engines turn API requests into it.
**
** Two layers (ENCODING-dsv4.md §7.1):
**
**  1. st_chat_encode_messages: the reference encoder, `encode_messages` of the checkpoint's
**     encoding/encoding_dsv4.py (§1): tool messages merged into user turns, tool results sorted
**     by call order, BOS, thinking dropped before the last user turn (unless tools are present),
**     system text after BOS, the tools block, <｜User｜>/<｜Assistant｜> turns, DSML tool calls,
**     <tool_result> blocks, latest_reminder, tasks, the reasoning-effort prefix, and the
**     generation prompt (<｜Assistant｜><think> or <｜Assistant｜></think>). Its input is the
**     encoder's own message shape (OpenAI-like: role, content string, reasoning_content,
**     tool_calls, tool_call_id, tools on a system/developer message, task, wo_eos,
**     response_format).
**
**  2. st_chat_render_request: an API request body — OpenAI /v1/chat/completions, Anthropic
**     /v1/messages or OpenAI /v1/responses — mapped to that message list the way one serving
**     engine does it (a render profile: where request tools go, tool-schema key order, how
**     content parts are joined, the thinking default, the effort mapping, history arguments),
**     then encoded. Profiles: reference, sglang, vllm, atom (§3, §4, §5; each deviation is
**     commented in chat_requests.c with its section).
**
** All JSON that lands in the prompt is written as CPython's json.dumps writes it (pyjson.h).
** Errors are values: ST_EINVAL for requests the engine would reject (the message names the
** JSON path, e.g. "messages[3].tool_calls[0].function.arguments"), ST_EUNSUPPORTED for what
** the chosen profile's engine does not accept (ATOM has no /v1/responses).
*/
#ifndef ST_CHAT_H
#define ST_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "common/base.h"
#include "engine/text/pyjson.h"
#include "engine/text/tokenizer.h"

typedef enum st_render_profile {
  ST_RENDER_REFERENCE = 0, /* the checkpoint's encoder with a plain request mapping */
  ST_RENDER_SGLANG = 1,    /* sglang's dsv4 chat path (§3.1, §4, §5) */
  ST_RENDER_VLLM = 2,      /* vLLM's DeepseekV4Renderer, later revision (§3.2, §4, §5) */
  ST_RENDER_ATOM = 3,      /* AMD ATOM at HEAD 2026-08-22 (§3.3, §4) */
  ST_RENDER_PROFILE_COUNT
} st_render_profile;

typedef enum st_chat_api {
  ST_API_AUTO = 0,      /* guess from the body (st_chat_detect_api) */
  ST_API_CHAT = 1,      /* OpenAI /v1/chat/completions */
  ST_API_ANTHROPIC = 2, /* Anthropic /v1/messages */
  ST_API_RESPONSES = 3, /* OpenAI /v1/responses */
} st_chat_api;

/* Which checkpoint's encoder (§1.7): the effort prefixes differ, nothing else. */
typedef enum st_effort_table {
  ST_EFFORT_LEGACY = 0, /* DeepSeek-V4-Flash, -Pro, -Flash-DSpark: None/high/max; only max adds text */
  ST_EFFORT_0731 = 1,   /* DeepSeek-V4-Flash-0731: low (default)/high/max */
} st_effort_table;

/* Name ↔ value; parse functions return ST_EINVAL naming the accepted values. */
const char *st_render_profile_name(st_render_profile p);
st_status st_render_profile_parse(const char *name, st_render_profile *out);
const char *st_chat_api_name(st_chat_api api);
st_status st_chat_api_parse(const char *name, st_chat_api *out);
/* Body shape → API: "input"/"instructions" without "messages" → responses; Anthropic markers
** (top-level "system", "anthropic_version", tools with "input_schema", tool_use/tool_result/
** thinking blocks) → anthropic; otherwise chat. */
st_chat_api st_chat_detect_api(const json_t *request);

/* Options of the reference encoder (encode_messages' keyword arguments). */
typedef struct st_chat_encoder {
  int thinking;                 /* 1: thinking_mode="thinking", 0: "chat" */
  const char *reasoning_effort; /* NULL = None; checked against effort_table (assert in Python) */
  st_effort_table effort_table;
  int drop_thinking;           /* default 1 */
  int add_bos;                 /* add_default_bos_token, default 1 */
  /* vLLM's copy and fixed sglang accept an already-parsed arguments object; the checkpoint's
  ** file json.loads() it, fails, and renders one parameter "arguments" (§1.6). */
  int arguments_object_ok;
} st_chat_encoder;

void st_chat_encoder_default(st_chat_encoder *e);

/* Appends the encoding of `messages` (a JSON array in the encoder's shape; not modified) to
** out. */
st_status st_chat_encode_messages(const json_t *messages, const st_chat_encoder *enc, st_buf *out);

/* Options of a request render. Fields left at their defaults (st_chat_options_default) take
** the request's own values, then the profile's defaults. */
typedef struct st_chat_options {
  st_render_profile profile;
  st_chat_api api;              /* ST_API_AUTO: detect */
  int thinking;                 /* -1: request / profile default; 0 chat; 1 thinking */
  const char *reasoning_effort; /* NULL: from the request; "none" forces chat mode */
  int drop_thinking;            /* -1: request's chat_template_kwargs, else 1 */
  st_effort_table effort_table;
} st_chat_options;

void st_chat_options_default(st_chat_options *o);

/* A rendered prompt. Normally one segment; sglang's continue_final_message appends the final
** assistant text as a second segment that it tokenises on its own (§3.1 step 3). */
typedef struct st_chat_prompt {
  char *text;
  size_t len;
  size_t n_segments;
  size_t segment_end[2];
  st_chat_api api;        /* the API the body was read as */
  int thinking;           /* the mode used */
  char effort[16];        /* the effort passed to the encoder ("" = None) */
  json_t *messages;       /* the encoder-shaped messages that were encoded (owned) */
} st_chat_prompt;

st_status st_chat_render_request(const json_t *request, const st_chat_options *opt,
                                 st_chat_prompt *out);
void st_chat_prompt_free(st_chat_prompt *p);

/* Token ids of a rendered prompt as the engine computes them: each segment encoded on its own
** (tokenizer.encode without BOS: the prompt already starts with its BOS text), appended. */
st_status st_chat_prompt_ids(st_tokenizer *tok, const st_chat_prompt *p, st_token_ids *out);

/* ---- reading a completion back (chat_completion.c) ---- */

/* A tool call the model wrote: the invoke's name and its parameters as a JSON object (string
** parameters as strings, string="false" ones parsed as JSON). */
typedef struct st_tool_call {
  char *name;
  json_t *arguments;
} st_tool_call;

typedef struct st_chat_completion {
  size_t content_len;   /* text[0..content_len) is the content (the bytes before the block) */
  st_tool_call *calls;  /* [n_calls], in the order written */
  size_t n_calls;
} st_chat_completion;

/* Splits a completion's content part (after </think>) into its text and its DSML tool calls.
** No block: ST_OK, no calls, all of it content. A block that breaks the grammar: ST_EFORMAT
** naming the byte offset, no calls, all of it content. Free with st_chat_completion_free. */
st_status st_chat_parse_completion(const char *text, size_t len, st_chat_completion *out);
void st_chat_completion_free(st_chat_completion *c);

/* "<｜DSML｜tool_calls>": where a completion's tool-call block begins (for streaming, which
** holds content back from the first byte of it). */
const char *st_chat_tool_calls_marker(void);

#endif
