/*
** capture_message.c — what an exchange meant: the request's model and stream flag (or the fact
** that its JSON was malformed), and the final assistant message reassembled from the response.
**
** All of this runs once, after the client has its last byte, so none of it is on the relay's
** critical path. The raw bytes stay the record of truth (LIBRARIES.md §1.1: never re-serialise a
** captured body); what is built here is a normalised view that is the same for every API:
**
**   { "api": "anthropic.messages", "id": "msg_...", "model": "...",
**     "text": "all text blocks / deltas, concatenated",
**     "thinking": "reasoning text, when the API streams it",
**     "tool_calls": [ { "id": "...", "name": "...", "arguments": {parsed} } ],
**     "stop_reason": "end_turn", "usage": { upstream's usage object, merged },
**     "input_tokens": N, "output_tokens": M, "complete": true, "error": {...} }
**
** `arguments` is the parsed JSON of the call's arguments; when they do not parse, it is null and
** `arguments_text` holds the raw text with `arguments_malformed: true`. input_tokens counts every
** prompt token the upstream reports, cached or not (Anthropic: input + cache_creation +
** cache_read; OpenAI: prompt_tokens / input_tokens, which already include cached tokens), so it
** can be compared with a rendered prompt's length. `complete` says the stream reached its proper
** end (message_stop, [DONE], response.completed/incomplete/failed) or the body was a whole JSON
** message. Only choice 0 of an OpenAI n>1 answer is reassembled.
**
** Per API, the stream grammar followed:
**   anthropic.messages  message_start, content_block_start/delta/stop (text_delta,
**                       input_json_delta, thinking_delta), message_delta (stop_reason, usage),
**                       message_stop, error, ping
**   openai.chat         chat.completion.chunk objects (delta.content, delta.reasoning_content,
**                       delta.tool_calls[index] fragments, finish_reason, usage), [DONE]
**   openai.completions  text_completion chunks (choices[0].text), [DONE]
**   openai.responses    response.created, output_item.added/done, output_text.delta,
**                       function_call_arguments.delta, reasoning_*_text.delta,
**                       response.completed/incomplete/failed (authoritative when present), error
**
** Prompt token ids (capture --ask-prompt-ids). The request side: capture_ask_prompt_ids() adds
** the serving engine's own field to the body forwarded upstream. The answer side: while the
** events (or the body) are parsed for the final message, the first object that carries prompt
** ids gives them — vLLM: top-level "prompt_token_ids" of a chat.completion, or of the first
** chat.completion.chunk of a stream (vllm/entrypoints/openai/chat_completion/protocol.py,
** ChatCompletionResponse / ChatCompletionStreamResponse.prompt_token_ids; serving.py sends them
** "at the first chunk ever"); vLLM and sglang completions, and sglang chat: choices[i].
** prompt_token_ids (completion/protocol.py CompletionResponseChoice / CompletionResponseStreamChoice;
** sglang protocol.py ChatCompletionResponseChoice, CompletionResponse(Stream)Choice), of choice 0.
** The answer itself is never touched: the client gets the upstream's bytes, ids included.
*/
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "capture_internal.h"

/* ---- the accumulator ---------------------------------------------------------------------- */

typedef struct part {
  int index;          /* block / tool / output index given by the stream */
  char kind;          /* 't' text, 'r' reasoning, 'c' tool call, '?' other */
  json_t *id, *name;  /* strings, owned */
  st_buf text;        /* text, reasoning text or argument JSON text */
  json_t *input;      /* arguments already given as an object (Anthropic start, Responses item) */
} part;

typedef struct acc {
  capture_api api;
  json_t *id, *model;
  part *parts;
  size_t n_parts, cap_parts;
  json_t *usage;       /* merged */
  json_t *stop_reason; /* string or null */
  json_t *error;
  int complete;
  int unparsed;        /* events whose data was not JSON */
  int oom;
} acc;

static void acc_free(acc *a) {
  json_decref(a->id);
  json_decref(a->model);
  for (size_t i = 0; i < a->n_parts; i++) {
    json_decref(a->parts[i].id);
    json_decref(a->parts[i].name);
    json_decref(a->parts[i].input);
    st_buf_free(&a->parts[i].text);
  }
  free(a->parts);
  json_decref(a->usage);
  json_decref(a->stop_reason);
  json_decref(a->error);
}

/* The part with stream index `index` and kind, created in arrival order when new. */
static part *acc_part(acc *a, int index, char kind) {
  for (size_t i = 0; i < a->n_parts; i++)
    if (a->parts[i].index == index && a->parts[i].kind == kind) return &a->parts[i];
  if (a->n_parts == a->cap_parts) {
    size_t cap = a->cap_parts ? 2 * a->cap_parts : 8;
    part *p = realloc(a->parts, cap * sizeof *p);
    if (!p) {
      a->oom = 1;
      return NULL;
    }
    a->parts = p;
    a->cap_parts = cap;
  }
  part *p = &a->parts[a->n_parts++];
  memset(p, 0, sizeof *p);
  p->index = index;
  p->kind = kind;
  return p;
}

static void set_json(json_t **slot, json_t *v) { /* v borrowed; null/absent leaves slot */
  if (!v || json_is_null(v)) return;
  json_decref(*slot);
  *slot = json_incref(v);
}

static void append_str(acc *a, st_buf *b, json_t *s) {
  if (json_is_string(s) && st_buf_add(b, json_string_value(s), json_string_length(s)))
    a->oom = 1;
}

/* Overlays the keys of a usage object onto the merged usage (later reports win). */
static void merge_usage(acc *a, json_t *usage) {
  if (!json_is_object(usage)) return;
  if (!a->usage) a->usage = json_object();
  if (a->usage) json_object_update(a->usage, usage);
}

static int get_int(json_t *obj, const char *key, int64_t *out) {
  json_t *v = json_object_get(obj, key);
  if (!json_is_integer(v)) return 0;
  *out = json_integer_value(v);
  return 1;
}

/* ---- Anthropic /v1/messages ----------------------------------------------------------------- */

static void anthropic_block_start(acc *a, int index, json_t *block) {
  const char *type = json_string_value(json_object_get(block, "type"));
  if (!type) return;
  char kind = !strcmp(type, "text")       ? 't'
              : !strcmp(type, "thinking") ? 'r'
              : (!strcmp(type, "tool_use") || !strcmp(type, "server_tool_use")) ? 'c'
                                                                               : '?';
  part *p = acc_part(a, index, kind);
  if (!p) return;
  set_json(&p->id, json_object_get(block, "id"));
  set_json(&p->name, json_object_get(block, "name"));
  set_json(&p->input, json_object_get(block, "input"));
  if (kind == 't') append_str(a, &p->text, json_object_get(block, "text"));
  if (kind == 'r') append_str(a, &p->text, json_object_get(block, "thinking"));
}

static void anthropic_event(acc *a, json_t *d) {
  const char *type = json_string_value(json_object_get(d, "type"));
  if (!type) return;
  if (!strcmp(type, "message_start")) {
    json_t *m = json_object_get(d, "message");
    set_json(&a->id, json_object_get(m, "id"));
    set_json(&a->model, json_object_get(m, "model"));
    merge_usage(a, json_object_get(m, "usage"));
    set_json(&a->stop_reason, json_object_get(m, "stop_reason"));
  } else if (!strcmp(type, "content_block_start")) {
    anthropic_block_start(a, (int)json_integer_value(json_object_get(d, "index")),
                          json_object_get(d, "content_block"));
  } else if (!strcmp(type, "content_block_delta")) {
    int index = (int)json_integer_value(json_object_get(d, "index"));
    json_t *delta = json_object_get(d, "delta");
    const char *dt = json_string_value(json_object_get(delta, "type"));
    if (!dt) return;
    part *p = NULL;
    if (!strcmp(dt, "text_delta") && (p = acc_part(a, index, 't')))
      append_str(a, &p->text, json_object_get(delta, "text"));
    else if (!strcmp(dt, "thinking_delta") && (p = acc_part(a, index, 'r')))
      append_str(a, &p->text, json_object_get(delta, "thinking"));
    else if (!strcmp(dt, "input_json_delta") && (p = acc_part(a, index, 'c')))
      append_str(a, &p->text, json_object_get(delta, "partial_json"));
  } else if (!strcmp(type, "message_delta")) {
    json_t *delta = json_object_get(d, "delta");
    set_json(&a->stop_reason, json_object_get(delta, "stop_reason"));
    merge_usage(a, json_object_get(d, "usage"));
  } else if (!strcmp(type, "message_stop")) {
    a->complete = 1;
  } else if (!strcmp(type, "error")) {
    set_json(&a->error, json_object_get(d, "error"));
  }
}

static void anthropic_message(acc *a, json_t *m) {
  if (!strcmp(json_string_value(json_object_get(m, "type")) ? json_string_value(json_object_get(m, "type")) : "", "error")) {
    set_json(&a->error, json_object_get(m, "error"));
    return;
  }
  set_json(&a->id, json_object_get(m, "id"));
  set_json(&a->model, json_object_get(m, "model"));
  merge_usage(a, json_object_get(m, "usage"));
  set_json(&a->stop_reason, json_object_get(m, "stop_reason"));
  size_t i;
  json_t *block;
  json_array_foreach(json_object_get(m, "content"), i, block) anthropic_block_start(a, (int)i, block);
  a->complete = 1;
}

/* ---- OpenAI chat and completions ------------------------------------------------------------ */

static void openai_tool_fragment(acc *a, int fallback_index, json_t *tc) {
  json_t *ji = json_object_get(tc, "index");
  int index = json_is_integer(ji) ? (int)json_integer_value(ji) : fallback_index;
  part *p = acc_part(a, index, 'c');
  if (!p) return;
  set_json(&p->id, json_object_get(tc, "id"));
  json_t *fn = json_object_get(tc, "function");
  json_t *name = json_object_get(fn, "name");
  if (json_is_string(name) && json_string_length(name) > 0) {
    /* Names arrive whole in practice; concatenate anyway, like the arguments. */
    const char *old = json_string_value(p->name);
    if (!old) {
      set_json(&p->name, name);
    } else if (strcmp(old, json_string_value(name))) {
      st_buf b = {0};
      st_buf_str(&b, old);
      st_buf_str(&b, json_string_value(name));
      json_decref(p->name);
      p->name = json_string(b.data ? b.data : "");
      st_buf_free(&b);
    }
  }
  json_t *args = json_object_get(fn, "arguments");
  if (json_is_string(args)) append_str(a, &p->text, args);
  else set_json(&p->input, args);
}

/* One chunk (stream) or the whole answer (stream == 0) of chat or completions. */
static void openai_chat_object(acc *a, json_t *d, int stream) {
  if (json_object_get(d, "error")) {
    set_json(&a->error, json_object_get(d, "error"));
    return;
  }
  set_json(&a->id, json_object_get(d, "id"));
  set_json(&a->model, json_object_get(d, "model"));
  merge_usage(a, json_object_get(d, "usage"));
  size_t i;
  json_t *choice;
  json_array_foreach(json_object_get(d, "choices"), i, choice) {
    json_t *ci = json_object_get(choice, "index");
    if (json_is_integer(ci) ? json_integer_value(ci) != 0 : i != 0) continue;
    set_json(&a->stop_reason, json_object_get(choice, "finish_reason"));
    json_t *m = json_object_get(choice, stream ? "delta" : "message");
    part *p;
    if (a->api == CAPTURE_API_OPENAI_COMPLETIONS) {
      if ((p = acc_part(a, 0, 't'))) append_str(a, &p->text, json_object_get(choice, "text"));
      continue;
    }
    json_t *content = json_object_get(m, "content");
    if (json_is_string(content) && (p = acc_part(a, 0, 't'))) append_str(a, &p->text, content);
    json_t *reasoning = json_object_get(m, "reasoning_content");
    if (!json_is_string(reasoning)) reasoning = json_object_get(m, "reasoning");
    if (json_is_string(reasoning) && (p = acc_part(a, 0, 'r'))) append_str(a, &p->text, reasoning);
    size_t k;
    json_t *tc;
    json_array_foreach(json_object_get(m, "tool_calls"), k, tc) openai_tool_fragment(a, (int)k, tc);
  }
  if (!stream) a->complete = 1;
}

/* ---- OpenAI /v1/responses ------------------------------------------------------------------- */

/* Adds one output item of a response (message, reasoning, function_call, *_call). */
static void responses_item(acc *a, int index, json_t *item) {
  const char *type = json_string_value(json_object_get(item, "type"));
  if (!type) return;
  size_t i;
  json_t *c;
  part *p;
  if (!strcmp(type, "message")) {
    if (!(p = acc_part(a, index, 't'))) return;
    p->text.len = 0;
    json_array_foreach(json_object_get(item, "content"), i, c) {
      json_t *t = json_object_get(c, "text");
      if (!json_is_string(t)) t = json_object_get(c, "refusal");
      append_str(a, &p->text, t);
    }
  } else if (!strcmp(type, "reasoning")) {
    if (!(p = acc_part(a, index, 'r'))) return;
    p->text.len = 0;
    json_array_foreach(json_object_get(item, "summary"), i, c)
      append_str(a, &p->text, json_object_get(c, "text"));
    json_array_foreach(json_object_get(item, "content"), i, c)
      append_str(a, &p->text, json_object_get(c, "text"));
  } else if (strlen(type) > 5 && !strcmp(type + strlen(type) - 5, "_call")) {
    if (!(p = acc_part(a, index, 'c'))) return;
    json_t *id = json_object_get(item, "call_id");
    set_json(&p->id, json_is_string(id) ? id : json_object_get(item, "id"));
    json_t *name = json_object_get(item, "name");
    if (!json_is_string(name)) name = json_object_get(item, "type");
    set_json(&p->name, name);
    json_t *args = json_object_get(item, "arguments");
    if (!args) args = json_object_get(item, "input");
    if (json_is_string(args)) {
      p->text.len = 0;
      append_str(a, &p->text, args);
    } else if (args) {
      set_json(&p->input, args);
    } else {
      set_json(&p->input, json_object_get(item, "action"));
    }
  }
}

/* The response object of response.completed/incomplete/failed or of a non-stream answer: when
** it lists its output, it replaces whatever the deltas built. */
static void responses_object(acc *a, json_t *r) {
  if (!json_is_object(r)) return;
  set_json(&a->id, json_object_get(r, "id"));
  set_json(&a->model, json_object_get(r, "model"));
  merge_usage(a, json_object_get(r, "usage"));
  set_json(&a->error, json_object_get(r, "error"));
  const char *status = json_string_value(json_object_get(r, "status"));
  if (status) {
    json_t *reason = json_object_get(json_object_get(r, "incomplete_details"), "reason");
    json_t *sr = json_is_string(reason) ? json_incref(reason) : json_string(status);
    json_decref(a->stop_reason);
    a->stop_reason = sr;
  }
  json_t *output = json_object_get(r, "output");
  if (json_array_size(output) > 0) {
    for (size_t i = 0; i < a->n_parts; i++) {
      json_decref(a->parts[i].id);
      json_decref(a->parts[i].name);
      json_decref(a->parts[i].input);
      st_buf_free(&a->parts[i].text);
    }
    a->n_parts = 0;
    size_t i;
    json_t *item;
    json_array_foreach(output, i, item) responses_item(a, (int)i, item);
  }
}

static void responses_event(acc *a, json_t *d) {
  const char *type = json_string_value(json_object_get(d, "type"));
  if (!type) return;
  int index = (int)json_integer_value(json_object_get(d, "output_index"));
  part *p;
  if (!strcmp(type, "response.created") || !strcmp(type, "response.in_progress")) {
    json_t *r = json_object_get(d, "response");
    set_json(&a->id, json_object_get(r, "id"));
    set_json(&a->model, json_object_get(r, "model"));
  } else if (!strcmp(type, "response.output_item.added") ||
             !strcmp(type, "response.output_item.done")) {
    responses_item(a, index, json_object_get(d, "item"));
  } else if (!strcmp(type, "response.output_text.delta") ||
             !strcmp(type, "response.refusal.delta")) {
    if ((p = acc_part(a, index, 't'))) append_str(a, &p->text, json_object_get(d, "delta"));
  } else if (!strcmp(type, "response.function_call_arguments.delta") ||
             !strcmp(type, "response.custom_tool_call_input.delta")) {
    if ((p = acc_part(a, index, 'c'))) append_str(a, &p->text, json_object_get(d, "delta"));
  } else if (!strcmp(type, "response.reasoning_summary_text.delta") ||
             !strcmp(type, "response.reasoning_text.delta")) {
    if ((p = acc_part(a, index, 'r'))) append_str(a, &p->text, json_object_get(d, "delta"));
  } else if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete") ||
             !strcmp(type, "response.failed")) {
    responses_object(a, json_object_get(d, "response"));
    a->complete = 1;
  } else if (!strcmp(type, "error")) {
    json_t *e = json_object_get(d, "error");
    set_json(&a->error, e ? e : d);
  }
}

/* ---- building the normalised message ------------------------------------------------------ */

static int part_cmp(const void *x, const void *y) {
  const part *a = x, *b = y;
  return (a->index > b->index) - (a->index < b->index);
}

static json_t *acc_result(acc *a) {
  if (a->oom) return NULL;
  json_t *out = json_object();
  json_t *tools = json_array();
  st_buf text = {0}, thinking = {0};
  if (!out || !tools) goto fail;
  /* In stream index order (an (index, kind) pair is unique, so ties never matter). */
  if (a->n_parts > 1) qsort(a->parts, a->n_parts, sizeof *a->parts, part_cmp);
  for (size_t i = 0; i < a->n_parts; i++) {
    part *p = &a->parts[i];
    if (p->kind == 't' && st_buf_add(&text, p->text.data, p->text.len)) goto fail;
    if (p->kind == 'r' && st_buf_add(&thinking, p->text.data, p->text.len)) goto fail;
    if (p->kind != 'c') continue;
    json_t *call = json_object();
    if (!call || json_array_append_new(tools, call) < 0) goto fail;
    json_object_set(call, "id", p->id ? p->id : json_null());
    json_object_set(call, "name", p->name ? p->name : json_null());
    if (p->text.len > 0) {
      json_t *args = json_loadb(p->text.data, p->text.len, JSON_DECODE_ANY, NULL);
      if (args) {
        json_object_set_new(call, "arguments", args);
      } else {
        json_object_set_new(call, "arguments", json_null());
        json_object_set_new(call, "arguments_text", json_stringn(p->text.data, p->text.len));
        json_object_set_new(call, "arguments_malformed", json_true());
      }
    } else {
      json_object_set_new(call, "arguments", p->input ? json_incref(p->input) : json_object());
    }
  }
  json_object_set_new(out, "api", json_string(capture_api_name(a->api)));
  json_object_set(out, "id", a->id ? a->id : json_null());
  json_object_set(out, "model", a->model ? a->model : json_null());
  json_t *t = json_stringn(text.data ? text.data : "", text.len);
  json_object_set_new(out, "text", t ? t : json_string("(text is not valid UTF-8)"));
  if (thinking.len > 0) json_object_set_new(out, "thinking", json_stringn(thinking.data, thinking.len));
  json_object_set_new(out, "tool_calls", tools);
  tools = NULL;
  json_object_set(out, "stop_reason", a->stop_reason ? a->stop_reason : json_null());
  json_object_set(out, "usage", a->usage ? a->usage : json_null());
  int64_t in = -1, out_tokens = -1, v;
  if (a->usage) {
    if (a->api == CAPTURE_API_ANTHROPIC_MESSAGES) {
      if (get_int(a->usage, "input_tokens", &v)) in = v;
      if (in >= 0 && get_int(a->usage, "cache_creation_input_tokens", &v)) in += v;
      if (in >= 0 && get_int(a->usage, "cache_read_input_tokens", &v)) in += v;
      if (get_int(a->usage, "output_tokens", &v)) out_tokens = v;
    } else {
      if (get_int(a->usage, "prompt_tokens", &v) || get_int(a->usage, "input_tokens", &v)) in = v;
      if (get_int(a->usage, "completion_tokens", &v) || get_int(a->usage, "output_tokens", &v))
        out_tokens = v;
    }
  }
  json_object_set_new(out, "input_tokens", in >= 0 ? json_integer(in) : json_null());
  json_object_set_new(out, "output_tokens", out_tokens >= 0 ? json_integer(out_tokens) : json_null());
  json_object_set_new(out, "complete", json_boolean(a->complete));
  if (a->error) json_object_set(out, "error", a->error);
  if (a->unparsed) json_object_set_new(out, "unparsed_events", json_integer(a->unparsed));
  st_buf_free(&text);
  st_buf_free(&thinking);
  return out;
fail:
  json_decref(out);
  json_decref(tools);
  st_buf_free(&text);
  st_buf_free(&thinking);
  return NULL;
}

/* Feeds parsed event payloads (NULL entries = not JSON; is_done marks [DONE]). */
static void note_prompt_ids(capture_summary *s, json_t *d, const char *origin);

/* ids: where the prompt ids found on the way go (NULL: not wanted). */
static json_t *from_parsed_events(capture_api api, json_t *const *parsed, const int *is_done,
                                  size_t n, capture_summary *ids) {
  if (api == CAPTURE_API_OTHER) return NULL;
  acc a = {.api = api};
  for (size_t i = 0; i < n; i++) {
    if (is_done[i]) {
      a.complete = 1;
      continue;
    }
    if (!json_is_object(parsed[i])) {
      a.unparsed++;
      continue;
    }
    if (ids && !ids->prompt_token_ids) {
      char origin[32];
      snprintf(origin, sizeof origin, "event %zu", i);
      note_prompt_ids(ids, parsed[i], origin);
    }
    switch (api) {
    case CAPTURE_API_ANTHROPIC_MESSAGES: anthropic_event(&a, parsed[i]); break;
    case CAPTURE_API_OPENAI_CHAT:
    case CAPTURE_API_OPENAI_COMPLETIONS: openai_chat_object(&a, parsed[i], 1); break;
    case CAPTURE_API_OPENAI_RESPONSES: responses_event(&a, parsed[i]); break;
    case CAPTURE_API_OTHER: break;
    }
  }
  json_t *out = acc_result(&a);
  acc_free(&a);
  return out;
}

static int is_done_marker(const capture_event *ev) {
  return ev->data_len == 6 && !memcmp(ev->data, "[DONE]", 6);
}

static json_t *message_from_events(capture_api api, const capture_event *ev, size_t n,
                                   capture_summary *ids) {
  json_t **parsed = calloc(n ? n : 1, sizeof *parsed);
  int *done = calloc(n ? n : 1, sizeof *done);
  json_t *out = NULL;
  if (parsed && done) {
    for (size_t i = 0; i < n; i++) {
      done[i] = is_done_marker(&ev[i]);
      if (!done[i]) parsed[i] = json_loadb(ev[i].data, ev[i].data_len, 0, NULL);
    }
    out = from_parsed_events(api, parsed, done, n, ids);
    for (size_t i = 0; i < n; i++) json_decref(parsed[i]);
  }
  free(parsed);
  free(done);
  return out;
}

json_t *capture_message_from_events(capture_api api, const capture_event *ev, size_t n) {
  return message_from_events(api, ev, n, NULL);
}

static json_t *message_from_body(capture_api api, const char *body, size_t len,
                                 capture_summary *ids) {
  if (api == CAPTURE_API_OTHER || len == 0) return NULL;
  json_t *d = json_loadb(body, len, 0, NULL);
  if (!json_is_object(d)) {
    json_decref(d);
    return NULL;
  }
  note_prompt_ids(ids, d, "body");
  acc a = {.api = api};
  switch (api) {
  case CAPTURE_API_ANTHROPIC_MESSAGES: anthropic_message(&a, d); break;
  case CAPTURE_API_OPENAI_CHAT:
  case CAPTURE_API_OPENAI_COMPLETIONS: openai_chat_object(&a, d, 0); break;
  case CAPTURE_API_OPENAI_RESPONSES:
    if (json_object_get(d, "error") && !json_object_get(d, "output")) set_json(&a.error, json_object_get(d, "error"));
    else {
      responses_object(&a, d);
      a.complete = 1;
    }
    break;
  case CAPTURE_API_OTHER: break;
  }
  json_decref(d);
  json_t *out = acc_result(&a);
  acc_free(&a);
  return out;
}

json_t *capture_message_from_body(capture_api api, const char *body, size_t len) {
  return message_from_body(api, body, len, NULL);
}

const char *capture_event_name(const capture_event *ev, char *scratch, size_t scratch_len) {
  if (ev->event) return ev->event;
  if (is_done_marker(ev)) return "[DONE]";
  json_t *d = json_loadb(ev->data, ev->data_len, 0, NULL);
  const char *type = json_string_value(json_object_get(d, "type"));
  const char *name = "message";
  if (type) {
    snprintf(scratch, scratch_len, "%s", type);
    name = scratch;
  } else if (json_object_get(d, "error")) {
    name = "error";
  }
  json_decref(d);
  return name;
}

/* ---- prompt token ids ------------------------------------------------------------------------ */

static int ids_valid(json_t *a) {
  if (!json_is_array(a) || json_array_size(a) == 0) return 0;
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
      return 0;
  }
  return 1;
}

json_t *capture_prompt_ids_in(json_t *d, const char **where) {
  if (!json_is_object(d)) return NULL;
  json_t *ids = json_object_get(d, "prompt_token_ids");
  if (ids_valid(ids)) {
    *where = "prompt_token_ids";
    return ids;
  }
  size_t i;
  json_t *choice;
  json_array_foreach(json_object_get(d, "choices"), i, choice) {
    json_t *ci = json_object_get(choice, "index");
    if (json_is_integer(ci) ? json_integer_value(ci) != 0 : i != 0) continue;
    ids = json_object_get(choice, "prompt_token_ids");
    if (ids_valid(ids)) {
      *where = "choices[0].prompt_token_ids";
      return ids;
    }
  }
  return NULL;
}

/* Keeps the first ids found (s may be NULL: nobody wants them). */
static void note_prompt_ids(capture_summary *s, json_t *d, const char *origin) {
  const char *where = NULL;
  json_t *ids;
  if (!s || s->prompt_token_ids || !(ids = capture_prompt_ids_in(d, &where))) return;
  s->prompt_token_ids = json_incref(ids);
  snprintf(s->prompt_token_ids_from, sizeof s->prompt_token_ids_from, "%s.%s", origin, where);
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

int capture_ask_prompt_ids(capture_exchange *x, st_capture_prompt_ids engine, char **forward,
                           size_t *forward_len) {
  *forward = NULL;
  *forward_len = 0;
  if (engine == ST_CAPTURE_PROMPT_IDS_OFF || strcmp(x->method, "POST") ||
      x->api == CAPTURE_API_OTHER)
    return 0;
  const char *engine_name = engine == ST_CAPTURE_PROMPT_IDS_SGLANG ? "sglang" : "vllm";
  const char *data = x->request_body.data ? x->request_body.data : "";
  size_t len = x->request_body.len;
  json_t *req = len ? json_loadb(data, len, 0, NULL) : NULL;
  const char *field = NULL;
  char why[256] = "";
  size_t open = 0;
  if (!json_is_object(req)) {
    snprintf(why, sizeof why, "the body is not a JSON object");
  } else if (x->api == CAPTURE_API_ANTHROPIC_MESSAGES || x->api == CAPTURE_API_OPENAI_RESPONSES) {
    snprintf(why, sizeof why, "%s returns no prompt token ids on %s (only on /v1/chat/completions "
             "and /v1/completions)", engine_name,
             x->api == CAPTURE_API_ANTHROPIC_MESSAGES ? "/v1/messages" : "/v1/responses");
  } else {
    int sglang_chat = engine == ST_CAPTURE_PROMPT_IDS_SGLANG && x->api == CAPTURE_API_OPENAI_CHAT;
    field = sglang_chat ? "return_prompt_token_ids" : "return_token_ids";
    if (sglang_chat && json_is_true(json_object_get(req, "stream"))) {
      /* sglang serving_chat.py _convert_to_internal_request: "return_prompt_token_ids is not
      ** supported with streaming" (a 400 to the client): asking would break the request. */
      snprintf(why, sizeof why, "sglang refuses return_prompt_token_ids on a streaming "
                                "/v1/chat/completions request (HTTP 400), so it was not asked");
      field = NULL;
    } else if (json_object_get(req, field)) {
      snprintf(why, sizeof why, "the client's body already sets \"%s\"", field);
      field = NULL;
    } else {
      while (open < len && is_space(data[open])) open++;
      if (open == len || data[open] != '{') { /* cannot happen for an object jansson parsed */
        snprintf(why, sizeof why, "the body does not start with '{'");
        field = NULL;
      }
    }
  }
  json_decref(req);
  int rc = 0;
  if (field) {
    size_t after = open + 1;
    while (after < len && is_space(data[after])) after++;
    char member[64];
    int m = snprintf(member, sizeof member, "\"%s\":true%s", field,
                     after < len && data[after] == '}' ? "" : ",");
    char *out = malloc(len + (size_t)m + 1);
    if (!out) return -1;
    memcpy(out, data, open + 1);
    memcpy(out + open + 1, member, (size_t)m);
    memcpy(out + open + 1 + m, data + open + 1, len - open - 1);
    out[len + (size_t)m] = 0;
    *forward = out;
    *forward_len = len + (size_t)m;
  }
  json_t *note = json_pack("{s:s, s:o, s:I}", "engine", engine_name, "added",
                           field ? json_pack("{s:b}", field, 1) : json_null(), "forwarded_bytes",
                           (json_int_t)(field ? *forward_len : len));
  if (note && !field) json_object_set_new(note, "skipped", json_string(why));
  char *text = note ? json_dumps(note, JSON_COMPACT) : NULL;
  json_decref(note);
  if (!text) {
    free(*forward);
    *forward = NULL;
    *forward_len = 0;
    rc = -1;
  }
  free(x->modified_request);
  x->modified_request = text;
  return rc;
}

/* ---- the whole summary ---------------------------------------------------------------------- */

static int is_json_api_request(const capture_exchange *x) {
  if (x->api != CAPTURE_API_OTHER) return 1;
  const char *ct = capture_headers_get(&x->request_headers, "content-type");
  return ct && strcasestr(ct, "json") != NULL;
}

void capture_summarize(const capture_exchange *x, capture_summary *s) {
  memset(s, 0, sizeof *s);
  s->input_tokens = s->output_tokens = -1;
  s->max_gap_ms = -1;
  int has_body = x->request_body.len > 0 || strcmp(x->method, "GET") != 0;
  if (has_body && strcmp(x->method, "GET") && strcmp(x->method, "HEAD") && is_json_api_request(x) &&
      x->state != CAPTURE_REJECTED) {
    json_error_t err;
    json_t *req = x->request_body.len
                      ? json_loadb(x->request_body.data, x->request_body.len, 0, &err)
                      : NULL;
    if (!req) {
      s->request_malformed = 1;
      char msg[300];
      if (x->request_body.len == 0)
        snprintf(msg, sizeof msg, "empty request body");
      else
        snprintf(msg, sizeof msg, "line %d column %d: %s", err.line, err.column, err.text);
      s->request_json_error = capture_secrets_scrub(&x->secrets, msg);
    } else {
      const char *model = json_string_value(json_object_get(req, "model"));
      if (model) s->model = capture_secrets_scrub(&x->secrets, model);
      s->request_stream = json_is_true(json_object_get(req, "stream"));
      json_decref(req);
    }
  }
  if (x->n_events > 0) s->final_message = message_from_events(x->api, x->events, x->n_events, s);
  else if (!x->stream && x->response_body.len > 0 && !x->response_truncated)
    s->final_message = message_from_body(x->api, x->response_body.data, x->response_body.len, s);
  if (s->final_message) {
    const char *sr = json_string_value(json_object_get(s->final_message, "stop_reason"));
    if (sr) s->stop_reason = strdup(sr);
    json_t *v = json_object_get(s->final_message, "input_tokens");
    if (json_is_integer(v)) s->input_tokens = json_integer_value(v);
    v = json_object_get(s->final_message, "output_tokens");
    if (json_is_integer(v)) s->output_tokens = json_integer_value(v);
  }
  for (size_t i = 1; i < x->n_events; i++) {
    double gap = (double)(x->events[i].t_ns - x->events[i - 1].t_ns) / 1e6;
    if (gap > s->max_gap_ms) s->max_gap_ms = gap;
  }
}

void capture_summary_free(capture_summary *s) {
  free(s->request_json_error);
  free(s->model);
  json_decref(s->final_message);
  free(s->stop_reason);
  json_decref(s->prompt_token_ids);
  memset(s, 0, sizeof *s);
}
