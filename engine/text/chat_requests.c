/*
** chat_requests.c — API request bodies → the encoder's messages, one render profile at a time.
**
** Pipeline: the body is read as OpenAI chat completions, Anthropic messages or OpenAI responses
** and turned into an OpenAI-chat-shaped list (from_chat / from_anthropic / from_responses), each
** following the chosen engine's own converter; then to_encoder applies the engine's chat path
** (content-part joining, history arguments, tools placement and schema key order, trailing
** assistant handling) and decide_mode its thinking/effort rules; then the reference encoder
** (chat.c) renders.
**
** Every deviation is cited to ENCODING-dsv4.md. Where the document says nothing about an engine
** for some detail, that engine's profile does what the reference profile does, and the comment
** says so. The reference profile is the checkpoint's encoder with the plainest request mapping
** the document supports; its choices are marked "reference:".
**
** Known gaps (documented, not guessed): sglang's normalize_json_schema_types rewrite of
** non-standard schema "type" values (§3.1 step 5) is not applied; sglang's `tool_reference`
** parts, images anywhere, and vLLM's early/intermediate revisions (tools before the system
** prompt, chat by default) are not modelled; `previous_response_id` cannot be resolved.
*/
#include <stdlib.h>
#include <string.h>

#include "engine/text/chat.h"

/* ---------------------------------------------------------------- names */

static const char *const profile_names[] = {"reference", "sglang", "vllm", "atom"};
static const char *const api_names[] = {"auto", "chat", "anthropic", "responses"};

const char *st_render_profile_name(st_render_profile p) {
  return p >= 0 && p < ST_RENDER_PROFILE_COUNT ? profile_names[p] : "?";
}

st_status st_render_profile_parse(const char *name, st_render_profile *out) {
  for (int i = 0; i < ST_RENDER_PROFILE_COUNT; i++)
    if (!strcmp(name, profile_names[i])) return *out = (st_render_profile)i, ST_OK;
  return st_fail(ST_EINVAL, "render profile \"%s\": expected reference, sglang, vllm or atom", name);
}

const char *st_chat_api_name(st_chat_api api) {
  return api >= 0 && api <= ST_API_RESPONSES ? api_names[api] : "?";
}

st_status st_chat_api_parse(const char *name, st_chat_api *out) {
  for (int i = 0; i <= ST_API_RESPONSES; i++)
    if (!strcmp(name, api_names[i])) return *out = (st_chat_api)i, ST_OK;
  return st_fail(ST_EINVAL, "api \"%s\": expected auto, chat, anthropic or responses", name);
}

void st_chat_options_default(st_chat_options *o) {
  memset(o, 0, sizeof *o);
  o->profile = ST_RENDER_REFERENCE;
  o->api = ST_API_AUTO;
  o->thinking = -1;
  o->drop_thinking = -1;
  o->effort_table = ST_EFFORT_LEGACY;
}

static int is_type(const json_t *block, const char *type) {
  const char *t = json_string_value(json_object_get(block, "type"));
  return t && !strcmp(t, type);
}

st_chat_api st_chat_detect_api(const json_t *req) {
  json_t *messages = json_object_get(req, "messages");
  if (!messages && (json_object_get(req, "input") || json_object_get(req, "instructions"))) return ST_API_RESPONSES;
  if (json_object_get(req, "system") || json_object_get(req, "anthropic_version")) return ST_API_ANTHROPIC;
  size_t i, k;
  json_t *t, *m, *b;
  json_array_foreach(json_object_get(req, "tools"), i, t)
    if (json_object_get(t, "input_schema")) return ST_API_ANTHROPIC;
  json_array_foreach(messages, i, m) {
    json_array_foreach(json_object_get(m, "content"), k, b)
      if (is_type(b, "tool_use") || is_type(b, "tool_result") || is_type(b, "thinking") ||
          is_type(b, "redacted_thinking"))
        return ST_API_ANTHROPIC;
  }
  return ST_API_CHAT;
}

/* ---------------------------------------------------------------- small helpers */

static void set_str(json_t *obj, const char *key, const char *s, size_t n) {
  json_object_set_new(obj, key, json_stringn(s, n));
}

/* Text of the text-like parts of a content list (text, input_text, output_text), joined. */
static void join_text_parts(st_buf *out, const json_t *parts, const char *joiner) {
  size_t i;
  json_t *p;
  int first = 1;
  json_array_foreach(parts, i, p) {
    json_t *text = json_object_get(p, "text");
    if (!json_is_string(text)) continue;
    if (!(is_type(p, "text") || is_type(p, "input_text") || is_type(p, "output_text"))) continue;
    if (!first) st_buf_str(out, joiner);
    first = 0;
    st_buf_add(out, json_string_value(text), json_string_length(text));
  }
}

static json_t *joined_text(const json_t *parts, const char *joiner) {
  st_buf t = {0};
  join_text_parts(&t, parts, joiner);
  json_t *s = json_stringn(t.data ? t.data : "", t.len);
  st_buf_free(&t);
  return s;
}

/* Python's str.strip() == "" for ASCII/Unicode whitespace (enough for "dropped if blank"). */
static int blank(const char *s) {
  for (; s && *s; s++)
    if (!strchr(" \t\n\r\f\v", *s)) return 0;
  return 1;
}

/* json.dumps(value) with Python's defaults (ensure_ascii=True), as engines build arguments. */
static json_t *python_dumps(const json_t *v) {
  st_buf t = {0};
  st_pyjson_dump(&t, v, 1);
  json_t *s = json_stringn(t.data ? t.data : "", t.len);
  st_buf_free(&t);
  return s;
}

/* ---------------------------------------------------------------- request signals */

typedef struct request_signals {
  json_t *kwargs;         /* chat_template_kwargs (borrowed) or NULL */
  const char *effort;     /* request reasoning effort, NULL if none */
  int thinking_param;     /* Anthropic `thinking`: -1 absent, 0 disabled, 1 enabled */
  int reasoning_enabled;  /* OpenAI `reasoning: {enabled: true}` */
  int continue_final;     /* continue_final_message */
  const char *task;       /* request-level task */
} request_signals;

typedef struct chat_request {
  json_t *messages; /* OpenAI-chat shaped; reasoning in "reasoning_content" */
  json_t *tools;    /* OpenAI tools [{type: function, function: {...}}] */
  request_signals sig;
} chat_request;

static void chat_request_free(chat_request *c) {
  json_decref(c->messages);
  json_decref(c->tools);
}

/* ---------------------------------------------------------------- tool schemas per engine */

/* The function object as the engine dumps it; `fn` is the client's function dict. */
static json_t *function_dump(st_render_profile p, const json_t *fn) {
  json_t *out = json_object();
  const char *k;
  json_t *v;
  switch (p) {
  case ST_RENDER_SGLANG:
    /* §3.1 step 5: sglang's Function model fields in declaration order description, name,
    ** parameters, strict (default false); model_dump keeps None as null; extra keys dropped. */
    json_object_set(out, "description", json_object_get(fn, "description") ? json_object_get(fn, "description") : json_null());
    json_object_set(out, "name", json_object_get(fn, "name") ? json_object_get(fn, "name") : json_null());
    json_object_set(out, "parameters", json_object_get(fn, "parameters") ? json_object_get(fn, "parameters") : json_null());
    json_object_set(out, "strict", json_object_get(fn, "strict") ? json_object_get(fn, "strict") : json_false());
    break;
  case ST_RENDER_VLLM:
    /* §3.2: FunctionDefinition dump: name, description (null if missing), parameters (null if
    ** missing), then the client's extra keys (e.g. strict) in their order [I in the document]. */
    json_object_set(out, "name", json_object_get(fn, "name") ? json_object_get(fn, "name") : json_null());
    json_object_set(out, "description", json_object_get(fn, "description") ? json_object_get(fn, "description") : json_null());
    json_object_set(out, "parameters", json_object_get(fn, "parameters") ? json_object_get(fn, "parameters") : json_null());
    json_object_foreach((json_t *)fn, k, v)
      if (strcmp(k, "name") && strcmp(k, "description") && strcmp(k, "parameters")) json_object_set(out, k, v);
    break;
  default:
    /* reference and ATOM (§3.3: raw request dicts): the client's object as it came. */
    json_object_update(out, (json_t *)fn);
    break;
  }
  return out;
}

static json_t *openai_tool(json_t *function) {
  json_t *t = json_object();
  json_object_set_new(t, "type", json_string("function"));
  json_object_set_new(t, "function", function);
  return t;
}

/* Request tools → OpenAI tools in the engine's dump. Anthropic-shaped tools on the OpenAI
** endpoint are converted by ATOM (§3.3 normalize_chat_tools); elsewhere they are refused. */
static st_status tools_dump(st_render_profile p, const json_t *tools, json_t **out) {
  *out = NULL;
  if (!tools || json_is_null(tools)) return ST_OK;
  if (!json_is_array(tools)) return st_fail(ST_EINVAL, "tools: not a list");
  json_t *list = json_array();
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    json_t *fn = json_object_get(t, "function");
    if (!fn && p == ST_RENDER_ATOM && json_object_get(t, "name")) {
      json_t *conv = json_object();
      json_object_set(conv, "name", json_object_get(t, "name"));
      json_object_set_new(conv, "description", json_object_get(t, "description") ? json_incref(json_object_get(t, "description")) : json_string(""));
      json_object_set(conv, "parameters", json_object_get(t, "input_schema") ? json_object_get(t, "input_schema") : json_object_get(t, "parameters"));
      json_array_append_new(list, openai_tool(conv));
      continue;
    }
    if (!json_is_object(fn)) {
      json_decref(list);
      return st_fail(ST_EINVAL, "tools[%zu]: expected {\"type\": \"function\", \"function\": {...}}", i);
    }
    json_array_append_new(list, openai_tool(function_dump(p, fn)));
  }
  *out = list;
  return ST_OK;
}

/* ---------------------------------------------------------------- OpenAI chat completions */

static st_status from_chat(st_render_profile p, const json_t *req, chat_request *c) {
  json_t *messages = json_object_get(req, "messages");
  if (!json_is_array(messages)) return st_fail(ST_EINVAL, "messages: missing or not a list");
  c->messages = json_array();
  size_t i;
  json_t *m;
  json_array_foreach(messages, i, m) {
    if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
      return st_fail(ST_EINVAL, "messages[%zu]: expected an object with a string role", i);
    json_t *copy = json_deep_copy(m);
    /* Reasoning of history turns: the checkpoint reads reasoning_content; vLLM's copy reads
    ** `reasoning` (§0 VLLM-ENC, §3.2); reference accepts either (reasoning_content first). */
    json_t *rc = json_object_get(m, "reasoning_content"), *r = json_object_get(m, "reasoning");
    json_object_del(copy, "reasoning");
    json_object_del(copy, "reasoning_content");
    json_t *reasoning = p == ST_RENDER_VLLM ? r : p == ST_RENDER_REFERENCE ? (rc ? rc : r) : rc;
    if (reasoning) json_object_set(copy, "reasoning_content", reasoning);
    json_array_append_new(c->messages, copy);
  }
  st_status st = tools_dump(p, json_object_get(req, "tools"), &c->tools);
  if (st) return st;
  json_t *kw = json_object_get(req, "chat_template_kwargs");
  c->sig.kwargs = json_is_object(kw) ? kw : NULL;
  c->sig.effort = json_string_value(json_object_get(req, "reasoning_effort"));
  json_t *reasoning = json_object_get(req, "reasoning");
  c->sig.reasoning_enabled = json_is_true(json_object_get(reasoning, "enabled"));
  if (!c->sig.effort) c->sig.effort = json_string_value(json_object_get(reasoning, "effort"));
  c->sig.thinking_param = -1;
  c->sig.continue_final = json_is_true(json_object_get(req, "continue_final_message"));
  c->sig.task = json_string_value(json_object_get(req, "task"));
  return ST_OK;
}

/* ---------------------------------------------------------------- Anthropic /v1/messages (§4) */

static int billing_header(const json_t *block) {
  const char *t = json_string_value(json_object_get(block, "text"));
  return t && !strncmp(t, "x-anthropic-billing-header", 26);
}

static json_t *anthropic_system(st_render_profile p, const json_t *system) {
  if (json_is_string(system)) {
    /* sglang drops a blank system string (§4). */
    if (p == ST_RENDER_SGLANG && blank(json_string_value(system))) return NULL;
    return json_incref((json_t *)system);
  }
  if (!json_is_array(system)) return NULL;
  /* Block lists: sglang "\n", no filter; vLLM "", billing header skipped; ATOM "\n", billing
  ** header skipped (§4). reference: "\n\n" (the encoder's own joiner), no filter. */
  const char *joiner = p == ST_RENDER_VLLM ? "" : p == ST_RENDER_REFERENCE ? "\n\n" : "\n";
  int skip_billing = p == ST_RENDER_VLLM || p == ST_RENDER_ATOM;
  st_buf t = {0};
  size_t i;
  json_t *b;
  int first = 1;
  json_array_foreach(system, i, b) {
    if (!is_type(b, "text") || (skip_billing && billing_header(b))) continue;
    if (!first) st_buf_str(&t, joiner);
    first = 0;
    json_t *text = json_object_get(b, "text");
    st_buf_add(&t, json_string_value(text), json_string_length(text));
  }
  json_t *s = json_stringn(t.data ? t.data : "", t.len);
  st_buf_free(&t);
  if (p == ST_RENDER_SGLANG && blank(json_string_value(s))) {
    json_decref(s);
    return NULL;
  }
  return s;
}

static json_t *make_msg(const char *role) {
  json_t *m = json_object();
  json_object_set_new(m, "role", json_string(role));
  return m;
}

/* Content of a tool_result block as the engine hands it to the tool message. */
static json_t *tool_result_content(st_render_profile p, const json_t *block) {
  json_t *content = json_object_get(block, "content");
  if (!content) return json_string("");
  if (json_is_string(content)) return json_incref(content);
  if (!json_is_array(content)) return json_incref(content);
  /* vLLM and ATOM join text parts with "\n" (§4); sglang keeps the parts (flattened with " "
  ** later, §3.1 step 2); reference keeps them for the encoder's own list handling (§1.4). */
  if (p == ST_RENDER_VLLM || p == ST_RENDER_ATOM) return joined_text(content, "\n");
  json_t *parts = json_array();
  size_t i;
  json_t *b;
  json_array_foreach(content, i, b)
    if (is_type(b, "text")) json_array_append(parts, b);
  return parts;
}

static st_status anthropic_user(st_render_profile p, const json_t *content, json_t *out, size_t mi) {
  if (json_is_string(content)) {
    json_t *m = make_msg("user");
    json_object_set(m, "content", (json_t *)content);
    json_array_append_new(out, m);
    return ST_OK;
  }
  if (!json_is_array(content)) return st_fail(ST_EINVAL, "messages[%zu].content: expected a string or a list of blocks", mi);
  json_t *texts = json_array(), *tools = json_array();
  size_t i;
  json_t *b;
  /* Flushes the text collected so far as one user message. */
#define FLUSH_TEXT()                                                                                \
  do {                                                                                              \
    if (json_array_size(texts)) {                                                                   \
      json_t *um = make_msg("user");                                                                \
      if (p == ST_RENDER_SGLANG) json_object_set(um, "content", texts);                             \
      else json_object_set_new(um, "content", joined_text(texts, p == ST_RENDER_ATOM ? "\n" : "\n\n")); \
      json_array_append_new(out, um);                                                               \
      json_decref(texts);                                                                           \
      texts = json_array();                                                                         \
    }                                                                                               \
  } while (0)
  json_array_foreach(content, i, b) {
    if (is_type(b, "text")) {
      json_t *part = json_object();
      json_object_set_new(part, "type", json_string("text"));
      json_object_set_new(part, "text", json_object_get(b, "text") ? json_incref(json_object_get(b, "text")) : json_string(""));
      json_array_append_new(texts, part);
    } else if (is_type(b, "tool_result")) {
      json_t *tm = make_msg("tool");
      json_object_set_new(tm, "tool_call_id", json_object_get(b, "tool_use_id") ? json_incref(json_object_get(b, "tool_use_id")) : json_string(""));
      json_object_set_new(tm, "content", tool_result_content(p, b));
      if (p == ST_RENDER_ATOM) {
        /* ATOM: all user text first, then all tool messages (§4). */
        json_array_append_new(tools, tm);
      } else {
        /* sglang flushes pending user text first, keeping the order (§4); vLLM's order is not
        ** described: same as reference, which keeps the order. */
        FLUSH_TEXT();
        json_array_append_new(out, tm);
      }
    }
    /* images, documents: not modelled (see the file comment) */
  }
  FLUSH_TEXT();
#undef FLUSH_TEXT
  json_array_extend(out, tools);
  json_decref(texts);
  json_decref(tools);
  return ST_OK;
}

static st_status anthropic_assistant(st_render_profile p, const json_t *content, json_t *out, size_t mi) {
  json_t *m = make_msg("assistant");
  if (json_is_string(content)) {
    json_object_set(m, "content", (json_t *)content);
    json_array_append_new(out, m);
    return ST_OK;
  }
  if (!json_is_array(content)) {
    json_decref(m);
    return st_fail(ST_EINVAL, "messages[%zu].content: expected a string or a list of blocks", mi);
  }
  json_t *texts = json_array(), *calls = json_array();
  st_buf thinking = {0};
  int n_thinking = 0;
  size_t i;
  json_t *b;
  json_array_foreach(content, i, b) {
    if (is_type(b, "text")) {
      json_array_append(texts, b);
    } else if (is_type(b, "thinking")) {
      /* Several thinking blocks: sglang joins "\n", vLLM "" (§4); reference "\n\n". */
      const char *joiner = p == ST_RENDER_SGLANG ? "\n" : p == ST_RENDER_VLLM ? "" : "\n\n";
      if (n_thinking++) st_buf_str(&thinking, joiner);
      json_t *t = json_object_get(b, "thinking");
      st_buf_add(&thinking, json_string_value(t) ? json_string_value(t) : "", json_string_length(t));
    } else if (is_type(b, "redacted_thinking")) {
      if (p == ST_RENDER_SGLANG) {
        json_decref(m), json_decref(texts), json_decref(calls), st_buf_free(&thinking);
        return st_fail(ST_EINVAL, "messages[%zu].content[%zu]: sglang answers redacted_thinking with 400 (§4)", mi, i);
      }
    } else if (is_type(b, "tool_use")) {
      /* arguments = json.dumps(input) in every engine (§4); the encoder parses them back. */
      json_t *fn = json_object(), *call = json_object();
      json_object_set_new(fn, "name", json_object_get(b, "name") ? json_incref(json_object_get(b, "name")) : json_string(""));
      json_t *input = json_object_get(b, "input"), *no_input = input ? NULL : json_object();
      json_object_set_new(fn, "arguments", python_dumps(input ? input : no_input));
      json_decref(no_input);
      json_object_set_new(call, "id", json_object_get(b, "id") ? json_incref(json_object_get(b, "id")) : json_string(""));
      json_object_set_new(call, "type", json_string("function"));
      json_object_set_new(call, "function", fn);
      json_array_append_new(calls, call);
    }
  }
  if (p == ST_RENDER_SGLANG) {
    /* sglang: thinking re-wrapped as "<think>" + text + "\n</think>" and inserted as the first
    ** content text part (§4); the parts are flattened with " " later (§3.1 step 2). */
    if (n_thinking) {
      json_t *part = json_object();
      st_buf w = {0};
      st_buf_str(&w, "<think>");
      st_buf_add(&w, thinking.data ? thinking.data : "", thinking.len);
      st_buf_str(&w, "\n</think>");
      json_object_set_new(part, "type", json_string("text"));
      set_str(part, "text", w.data, w.len);
      st_buf_free(&w);
      json_array_insert_new(texts, 0, part);
    }
    json_object_set(m, "content", texts);
  } else {
    json_object_set_new(m, "content", joined_text(texts, p == ST_RENDER_REFERENCE ? "\n\n" : p == ST_RENDER_VLLM ? "\n\n" : "\n"));
    /* ATOM drops thinking blocks (§4). */
    if (n_thinking && p != ST_RENDER_ATOM) set_str(m, "reasoning_content", thinking.data ? thinking.data : "", thinking.len);
  }
  if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
  json_array_append_new(out, m);
  json_decref(texts);
  json_decref(calls);
  st_buf_free(&thinking);
  return ST_OK;
}

static st_status from_anthropic(st_render_profile p, const json_t *req, chat_request *c) {
  json_t *messages = json_object_get(req, "messages");
  if (!json_is_array(messages)) return st_fail(ST_EINVAL, "messages: missing or not a list");
  c->messages = json_array();
  json_t *system = anthropic_system(p, json_object_get(req, "system"));
  if (system) {
    json_t *m = make_msg("system");
    json_object_set_new(m, "content", system);
    json_array_append_new(c->messages, m);
  }
  size_t i;
  json_t *m;
  st_status st = ST_OK;
  json_array_foreach(messages, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *content = json_object_get(m, "content");
    if (role && !strcmp(role, "user")) st = anthropic_user(p, content, c->messages, i);
    else if (role && !strcmp(role, "assistant")) st = anthropic_assistant(p, content, c->messages, i);
    else if (role && !strcmp(role, "system")) {
      /* role "system" inside messages: kept as a system message (sglang without
      ** merge_inline_system, ATOM pass-through, §4); reference does the same. */
      json_t *sm = make_msg("system");
      json_object_set_new(sm, "content", json_is_array(content) ? joined_text(content, "\n") : content ? json_incref(content) : json_string(""));
      json_array_append_new(c->messages, sm);
    } else st = st_fail(ST_EINVAL, "messages[%zu].role: expected user or assistant", i);
    if (st) return st;
  }
  /* Tools: {name, description, input_schema}; server tools (a "type" other than "custom")
  ** are skipped by sglang (§4); the others are not described, so the same. */
  json_t *tools = json_object_get(req, "tools"), *t;
  if (json_is_array(tools) && json_array_size(tools)) {
    c->tools = json_array();
    json_array_foreach(tools, i, t) {
      const char *type = json_string_value(json_object_get(t, "type"));
      if (type && strcmp(type, "custom")) continue;
      json_t *fn = json_object(), *desc = json_object_get(t, "description");
      json_t *params = json_object_get(t, "input_schema");
      if (p == ST_RENDER_SGLANG || p == ST_RENDER_ATOM) {
        /* sglang Function(name, description or "", parameters=input_schema) — dumped in its
        ** field order by function_dump; ATOM {"name", "description" (default ""), "parameters"}. */
        json_object_set(fn, "name", json_object_get(t, "name"));
        json_object_set_new(fn, "description", json_is_string(desc) ? json_incref(desc) : json_string(""));
        json_object_set(fn, "parameters", params ? params : json_null());
      } else {
        /* vLLM FunctionDefinition(name, description, parameters); reference the same keys,
        ** description only when given. */
        json_object_set(fn, "name", json_object_get(t, "name"));
        if (desc || p == ST_RENDER_VLLM) json_object_set(fn, "description", desc ? desc : json_null());
        json_object_set(fn, "parameters", params ? params : json_null());
      }
      json_t *dumped = function_dump(p, fn);
      json_decref(fn);
      json_array_append_new(c->tools, openai_tool(dumped));
    }
  }
  json_t *kw = json_object_get(req, "chat_template_kwargs");
  c->sig.kwargs = json_is_object(kw) ? kw : NULL;
  c->sig.thinking_param = -1;
  json_t *thinking = json_object_get(req, "thinking");
  if (json_is_object(thinking) && p != ST_RENDER_VLLM && p != ST_RENDER_ATOM) {
    /* sglang: enabled unless type "disabled" (§4); vLLM does not map it, ATOM ignores it.
    ** reference: the same as sglang. */
    c->sig.thinking_param = is_type(thinking, "disabled") ? 0 : 1;
  }
  const char *effort = json_string_value(json_object_get(json_object_get(req, "output_config"), "effort"));
  if (effort && p != ST_RENDER_ATOM) {
    /* output_config.effort → reasoning_effort; sglang maps xhigh → max (§4); reference too. */
    if (!strcmp(effort, "xhigh") && p != ST_RENDER_VLLM) effort = "max";
    c->sig.effort = effort;
  }
  return ST_OK;
}

/* ---------------------------------------------------------------- OpenAI /v1/responses (§5) */

static json_t *last_message(json_t *messages) {
  size_t n = json_array_size(messages);
  return n ? json_array_get(messages, n - 1) : NULL;
}

static int truthy_encrypted(const json_t *item) {
  json_t *e = json_object_get(item, "encrypted_content");
  return e && !json_is_null(e) && !(json_is_string(e) && !json_string_length(e));
}

static st_status from_responses(st_render_profile p, const json_t *req, chat_request *c) {
  if (p == ST_RENDER_ATOM) return st_fail(ST_EUNSUPPORTED, "ATOM has no /v1/responses endpoint (§5)");
  if (json_object_get(req, "previous_response_id") && !json_is_null(json_object_get(req, "previous_response_id")))
    return st_fail(ST_EUNSUPPORTED, "previous_response_id: the earlier turns are stored on the server; "
                   "render needs the whole conversation in the request");
  c->messages = json_array();
  json_t *instructions = json_object_get(req, "instructions");
  st_buf developer = {0};
  int n_developer = 0;
  json_t *input = json_object_get(req, "input");
  if (json_is_string(input)) {
    json_t *m = make_msg("user");
    json_object_set(m, "content", input);
    json_array_append_new(c->messages, m);
  } else if (json_is_array(input)) {
    size_t i;
    json_t *it;
    json_array_foreach(input, i, it) {
      const char *type = json_string_value(json_object_get(it, "type"));
      const char *role = json_string_value(json_object_get(it, "role"));
      json_t *prev = last_message(c->messages);
      int prev_assistant = prev && !strcmp(json_string_value(json_object_get(prev, "role")), "assistant");
      if ((!type || !strcmp(type, "message")) && role) {
        json_t *content = json_object_get(it, "content");
        if (p == ST_RENDER_SGLANG && !strcmp(role, "developer")) {
          /* sglang folds developer messages into the system message (§5). */
          if (n_developer++) st_buf_str(&developer, "\n\n");
          if (json_is_string(content)) st_buf_add(&developer, json_string_value(content), json_string_length(content));
          else join_text_parts(&developer, content, " ");
          continue;
        }
        if (!strcmp(role, "assistant")) {
          /* Output message items: the first part only (vLLM, §5); merged into an assistant
          ** turn opened by a reasoning item [I]. */
          json_t *text = json_is_string(content) ? json_incref(content) : NULL;
          if (!text && json_is_array(content) && json_array_size(content))
            text = json_object_get(json_array_get(content, 0), "text") ? json_incref(json_object_get(json_array_get(content, 0), "text")) : json_string("");
          if (!text) text = json_string("");
          if (prev_assistant && !json_object_get(prev, "content") && !json_object_get(prev, "tool_calls")) {
            json_object_set_new(prev, "content", text);
          } else {
            json_t *m = make_msg("assistant");
            json_object_set_new(m, "content", text);
            json_array_append_new(c->messages, m);
          }
          continue;
        }
        json_t *m = make_msg(role);
        json_object_set_new(m, "content", content ? json_incref(content) : json_string(""));
        json_array_append_new(c->messages, m);
      } else if (type && !strcmp(type, "function_call")) {
        json_t *fn = json_object(), *call = json_object();
        json_object_set_new(fn, "name", json_object_get(it, "name") ? json_incref(json_object_get(it, "name")) : json_string(""));
        json_object_set_new(fn, "arguments", json_object_get(it, "arguments") ? json_incref(json_object_get(it, "arguments")) : json_string("{}"));
        json_object_set_new(call, "id", json_object_get(it, "call_id") ? json_incref(json_object_get(it, "call_id")) : json_string(""));
        json_object_set_new(call, "type", json_string("function"));
        json_object_set_new(call, "function", fn);
        /* Appended to the preceding assistant message when there is one (§5). */
        json_t *target = prev_assistant ? prev : NULL;
        if (!target) {
          target = make_msg("assistant");
          json_array_append_new(c->messages, target);
        }
        json_t *calls = json_object_get(target, "tool_calls");
        if (!calls) json_object_set_new(target, "tool_calls", calls = json_array());
        json_array_append_new(calls, call);
      } else if (type && !strcmp(type, "function_call_output")) {
        json_t *m = make_msg("tool");
        json_object_set_new(m, "tool_call_id", json_object_get(it, "call_id") ? json_incref(json_object_get(it, "call_id")) : json_string(""));
        json_object_set_new(m, "content", json_object_get(it, "output") ? json_incref(json_object_get(it, "output")) : json_string(""));
        json_array_append_new(c->messages, m);
      } else if (type && !strcmp(type, "reasoning")) {
        if (truthy_encrypted(it)) {
          st_buf_free(&developer);
          return st_fail(ST_EUNSUPPORTED, "input[%zu]: reasoning with encrypted_content cannot be rendered (§5)", i);
        }
        /* reasoning items → assistant reasoning: first content text, else first summary text. */
        json_t *first = json_array_get(json_object_get(it, "content"), 0);
        if (!first) first = json_array_get(json_object_get(it, "summary"), 0);
        json_t *m = make_msg("assistant");
        json_object_set_new(m, "reasoning_content", json_object_get(first, "text") ? json_incref(json_object_get(first, "text")) : json_string(""));
        json_array_append_new(c->messages, m);
      } else {
        st_buf_free(&developer);
        return st_fail(ST_EUNSUPPORTED, "input[%zu]: item type \"%s\" is not rendered", i, type ? type : "?");
      }
    }
  } else if (input && !json_is_null(input)) {
    return st_fail(ST_EINVAL, "input: expected a string or a list of items");
  }
  /* instructions → a leading system message (§5); sglang appends its developer label. */
  if (json_is_string(instructions) || n_developer) {
    st_buf sys = {0};
    if (json_is_string(instructions)) st_buf_add(&sys, json_string_value(instructions), json_string_length(instructions));
    if (n_developer) {
      if (sys.len) st_buf_str(&sys, "\n\n");
      st_buf_str(&sys, "Developer instructions:\n");
      st_buf_add(&sys, developer.data ? developer.data : "", developer.len);
    }
    json_t *m = make_msg("system");
    set_str(m, "content", sys.data ? sys.data : "", sys.len);
    json_array_insert_new(c->messages, 0, m);
    st_buf_free(&sys);
  }
  st_buf_free(&developer);
  /* Tools: flat {"type": "function", "name", ...}; sglang exposes custom tools as functions with
  ** one string property "input" (§5, schema shape [I]); other tool types are skipped. */
  json_t *tools = json_object_get(req, "tools"), *t;
  size_t i;
  if (json_is_array(tools) && json_array_size(tools)) {
    c->tools = json_array();
    json_array_foreach(tools, i, t) {
      json_t *fn = NULL;
      if (is_type(t, "function")) {
        fn = json_deep_copy(t);
        json_object_del(fn, "type");
      } else if (is_type(t, "custom") && p == ST_RENDER_SGLANG) {
        fn = json_object();
        json_object_set(fn, "name", json_object_get(t, "name"));
        json_object_set_new(fn, "description", json_object_get(t, "description") ? json_incref(json_object_get(t, "description")) : json_string(""));
        json_object_set_new(fn, "parameters", json_pack("{s:s, s:{s:{s:s}}, s:[s]}", "type", "object", "properties",
                                                        "input", "type", "string", "required", "input"));
      }
      if (!fn) continue;
      json_array_append_new(c->tools, openai_tool(function_dump(p, fn)));
      json_decref(fn);
    }
  }
  json_t *kw = json_object_get(req, "chat_template_kwargs");
  c->sig.kwargs = json_is_object(kw) ? kw : NULL;
  c->sig.thinking_param = -1;
  c->sig.effort = json_string_value(json_object_get(json_object_get(req, "reasoning"), "effort"));
  return ST_OK;
}

/* ---------------------------------------------------------------- the engine's chat path */

/* Content lists → the string the engine gives the encoder. sglang joins text parts with " "
** and turns None into "" (§3.1 step 2); ATOM joins with "\n" (§3.3); vLLM passes lists to its
** encoder, which for system/user text is taken to join with "\n\n" (§3.2, [I] from the vision
** fixture) and which handles tool-result lists itself; reference: the same as vLLM. */
static st_status flatten_content(st_render_profile p, json_t *m, size_t i) {
  json_t *content = json_object_get(m, "content");
  const char *role = json_string_value(json_object_get(m, "role"));
  int tool = role && !strcmp(role, "tool");
  if (p == ST_RENDER_SGLANG && (!content || json_is_null(content))) {
    json_object_set_new(m, "content", json_string(""));
    return ST_OK;
  }
  if (!json_is_array(content)) {
    if (content && !json_is_string(content) && !json_is_null(content))
      return st_fail(ST_EINVAL, "messages[%zu].content: expected a string or a list of parts", i);
    return ST_OK;
  }
  if (tool && (p == ST_RENDER_REFERENCE || p == ST_RENDER_VLLM)) return ST_OK;
  const char *joiner = p == ST_RENDER_SGLANG ? " " : p == ST_RENDER_ATOM ? "\n" : "\n\n";
  json_object_set_new(m, "content", joined_text(content, joiner));
  return ST_OK;
}

/* History tool-call arguments (§3.1 step 1, §3.2, §3.3). */
static st_status history_arguments(st_render_profile p, json_t *m, size_t i) {
  json_t *calls = json_object_get(m, "tool_calls");
  size_t k;
  json_t *tc;
  json_array_foreach(calls, k, tc) {
    json_t *fn = json_object_get(tc, "function");
    json_t *args = json_object_get(fn, "arguments");
    if (!json_is_string(args) || p == ST_RENDER_REFERENCE) continue;
    json_error_t e;
    json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (p == ST_RENDER_ATOM) {
      /* ATOM parses into a dict, {"_raw": text} when that fails [R]; a non-object is treated
      ** the same [I]. The reference encoder then renders one "arguments" parameter. */
      if (!json_is_object(parsed)) {
        json_decref(parsed);
        parsed = json_object();
        json_object_set(parsed, "_raw", args);
      }
    } else if (!json_is_object(parsed)) {
      /* sglang: invalid JSON → 400; vLLM: arguments must be a JSON object. */
      json_decref(parsed);
      return st_fail(ST_EINVAL, "messages[%zu].tool_calls[%zu].function.arguments: %s rejects it (%s)",
                     i, k, p == ST_RENDER_SGLANG ? "sglang" : "vLLM",
                     p == ST_RENDER_SGLANG ? "not valid JSON" : "not a JSON object");
    }
    json_object_set_new(fn, "arguments", parsed);
  }
  return ST_OK;
}

/* Request tools onto the messages (§3.1 step 4, §3.2, §3.3). */
static void place_tools(st_render_profile p, json_t *messages, json_t *tools) {
  json_t *first = json_array_get(messages, 0);
  const char *role = first ? json_string_value(json_object_get(first, "role")) : NULL;
  int leading_system = role && !strcmp(role, "system");
  int leading_dev = role && !strcmp(role, "developer");
  if (p == ST_RENDER_SGLANG) {
    /* An empty system message is inserted when messages[0] is not a system message, and
    ** messages[0] gets all request tools. */
    if (!leading_system) {
      json_t *m = make_msg("system");
      json_object_set_new(m, "content", json_string(""));
      json_array_insert_new(messages, 0, m);
    }
    if (tools) json_object_set(json_array_get(messages, 0), "tools", tools);
    return;
  }
  if (!tools || !json_array_size(tools)) return;
  if (p == ST_RENDER_ATOM) {
    /* A synthetic {"role": "system", "tools": tools} in front: the tools block comes before the
    ** caller's system prompt. */
    json_t *m = make_msg("system");
    json_object_set(m, "tools", tools);
    json_array_insert_new(messages, 0, m);
    return;
  }
  /* vLLM (later revision) and reference: onto the leading system/developer message, replacing
  ** its own tools; a system message is inserted only when none leads. */
  if (leading_system || leading_dev) {
    json_object_set(first, "tools", tools);
  } else {
    json_t *m = make_msg("system");
    json_object_set_new(m, "content", json_string(""));
    json_object_set(m, "tools", tools);
    json_array_insert_new(messages, 0, m);
  }
}

static st_status to_encoder(st_render_profile p, chat_request *c, json_t **tail) {
  json_t *msgs = c->messages;
  size_t i;
  json_t *m;
  st_status st;
  *tail = NULL;
  json_array_foreach(msgs, i, m) {
    if ((st = flatten_content(p, m, i)) || (st = history_arguments(p, m, i))) return st;
  }
  size_t n = json_array_size(msgs);
  json_t *last = n ? json_array_get(msgs, n - 1) : NULL;
  const char *last_role = last ? json_string_value(json_object_get(last, "role")) : NULL;
  if (p == ST_RENDER_SGLANG && last_role && !strcmp(last_role, "assistant")) {
    json_t *content = json_object_get(last, "content");
    if (c->sig.continue_final) {
      /* §3.1 step 3: the final assistant message is removed and its text tokenised on its own,
      ** after the rest. */
      *tail = json_is_string(content) ? json_incref(content) : json_string("");
      json_array_remove(msgs, n - 1);
    } else if (json_is_string(content)) {
      /* ... otherwise a trailing assistant with string content is rewritten as a user turn. */
      json_object_set_new(last, "role", json_string("user"));
    }
  }
  place_tools(p, msgs, c->tools);
  if (c->sig.task && (p == ST_RENDER_SGLANG || p == ST_RENDER_REFERENCE)) {
    /* §3.1 step 8: request `task` goes on the last user/developer message. reference: the
    ** same. vLLM and ATOM take no request-level task (§3.2, §3.3 say nothing). */
    json_t *target = NULL;
    json_array_foreach(msgs, i, m) {
      const char *r = json_string_value(json_object_get(m, "role"));
      if (r && (!strcmp(r, "user") || !strcmp(r, "developer"))) target = m;
    }
    if (!target) return st_fail(ST_EINVAL, "task: needs a user or developer message");
    json_object_set_new(target, "task", json_string(c->sig.task));
  }
  return ST_OK;
}

/* ---------------------------------------------------------------- thinking and effort */

static int kw_bool(const json_t *kw, const char *key) {
  json_t *v = json_object_get(kw, key);
  return json_is_boolean(v) ? json_is_true(v) : -1;
}

/* Thinking mode, effort and drop_thinking as the engine decides them from the request. */
static st_status decide_mode(st_render_profile p, const request_signals *sig, const st_chat_options *opt,
                             st_chat_encoder *enc) {
  const json_t *kw = sig->kwargs;
  const char *effort = sig->effort;
  int thinking = -1;
  const char *kw_mode = json_string_value(json_object_get(kw, "thinking_mode"));
  const char *kw_effort = json_string_value(json_object_get(kw, "reasoning_effort"));
  int kw_think = kw_bool(kw, "thinking");
  if (kw_think < 0) kw_think = kw_bool(kw, "enable_thinking");
  switch (p) {
  case ST_RENDER_REFERENCE:
    /* reference: the encoder's own kwargs first (thinking_mode, reasoning_effort), then the
    ** common toggles (thinking / enable_thinking, Anthropic `thinking`), effort "none" = chat;
    ** default thinking (the checkpoint's golden cases are thinking-mode, §1.10). */
    if (kw_effort) effort = kw_effort;
    if (kw_mode) thinking = !strcmp(kw_mode, "thinking");
    else if (kw_think >= 0) thinking = kw_think;
    else if (sig->thinking_param >= 0) thinking = sig->thinking_param;
    else thinking = !(effort && !strcmp(effort, "none"));
    if (effort && !strcmp(effort, "none")) effort = NULL;
    break;
  case ST_RENDER_SGLANG:
    /* §3.1 step 6: chat_template_kwargs.thinking, default SGLANG_DEFAULT_THINKING=False; any
    ** non-none reasoning_effort or reasoning.enabled turns it on; Anthropic `thinking` sets the
    ** same toggle (§4). Step 7: effort passed only if the checkpoint's encoder accepts it. */
    thinking = kw_bool(kw, "thinking");
    if (thinking < 0) thinking = sig->thinking_param;
    if (thinking < 0) thinking = (effort && strcmp(effort, "none")) || sig->reasoning_enabled;
    if (effort && !(opt->effort_table == ST_EFFORT_LEGACY ? !strcmp(effort, "high") || !strcmp(effort, "max")
                                                          : !strcmp(effort, "low") || !strcmp(effort, "high") || !strcmp(effort, "max")))
      effort = NULL;
    break;
  case ST_RENDER_VLLM:
    /* §3.2 later revision: thinking on unless thinking/enable_thinking says otherwise; effort
    ** "none" → chat. 0731 table: default high, max → max, low/minimal/medium → low, anything else
    ** → high. Legacy table (the intermediate revision's mapping): minimal/low/medium/high → high,
    ** xhigh/max → max. */
    thinking = kw_think >= 0 ? kw_think : !(effort && !strcmp(effort, "none"));
    if (!thinking || (effort && !strcmp(effort, "none"))) {
      effort = NULL;
    } else if (opt->effort_table == ST_EFFORT_0731) {
      if (!effort) effort = "high";
      else if (!strcmp(effort, "max")) effort = "max";
      else if (!strcmp(effort, "low") || !strcmp(effort, "minimal") || !strcmp(effort, "medium")) effort = "low";
      else effort = "high";
    } else if (effort) {
      effort = !strcmp(effort, "xhigh") || !strcmp(effort, "max") ? "max" : "high";
    }
    break;
  case ST_RENDER_ATOM:
    /* §3.3: only chat_template_kwargs reach encode_messages (thinking_mode defaults to
    ** "thinking"); the OpenAI reasoning_effort field is passed under a name the DSV4 encoder
    ** does not take [I], so it is ignored here. */
    thinking = kw_mode ? !strcmp(kw_mode, "thinking") : 1;
    effort = kw_effort;
    break;
  default: return st_fail(ST_EINVAL, "render profile %d: unknown", (int)p);
  }
  /* drop_thinking from chat_template_kwargs (vLLM, ATOM, reference; sglang does not forward it). */
  int drop = p == ST_RENDER_SGLANG ? -1 : kw_bool(kw, "drop_thinking");
  if (opt->thinking >= 0) thinking = opt->thinking;
  if (opt->reasoning_effort) {
    effort = opt->reasoning_effort;
    if (!strcmp(effort, "none")) effort = NULL, thinking = opt->thinking >= 0 ? opt->thinking : 0;
  }
  if (opt->drop_thinking >= 0) drop = opt->drop_thinking;
  enc->thinking = thinking;
  enc->reasoning_effort = effort;
  enc->drop_thinking = drop >= 0 ? drop : 1;
  enc->effort_table = opt->effort_table;
  /* vLLM's encoder copy and (fixed) sglang take parsed argument objects (§1.6, §3.1 step 1). */
  enc->arguments_object_ok = p == ST_RENDER_SGLANG || p == ST_RENDER_VLLM;
  return ST_OK;
}

/* ---------------------------------------------------------------- entry points */

st_status st_chat_render_request(const json_t *request, const st_chat_options *opt, st_chat_prompt *out) {
  memset(out, 0, sizeof *out);
  if (!json_is_object(request)) return st_fail(ST_EINVAL, "request: not a JSON object");
  st_render_profile p = opt->profile;
  if (p < 0 || p >= ST_RENDER_PROFILE_COUNT) return st_fail(ST_EINVAL, "render profile %d: unknown", (int)p);
  st_chat_api api = opt->api == ST_API_AUTO ? st_chat_detect_api(request) : opt->api;
  chat_request c = {0};
  st_status st;
  switch (api) {
  case ST_API_CHAT: st = from_chat(p, request, &c); break;
  case ST_API_ANTHROPIC: st = from_anthropic(p, request, &c); break;
  case ST_API_RESPONSES: st = from_responses(p, request, &c); break;
  default: st = st_fail(ST_EINVAL, "api %d: unknown", (int)api); break;
  }
  json_t *tail = NULL;
  st_chat_encoder enc;
  st_chat_encoder_default(&enc);
  if (!st) st = to_encoder(p, &c, &tail);
  if (!st) st = decide_mode(p, &c.sig, opt, &enc);
  st_buf text = {0};
  if (!st) st = st_chat_encode_messages(c.messages, &enc, &text);
  if (!st) {
    size_t first_end = text.len;
    if (tail) st_buf_add(&text, json_string_value(tail), json_string_length(tail));
    if (!(st = st_buf_status(&text, "render"))) {
      out->text = st_buf_take(&text, &out->len);
      out->n_segments = tail ? 2 : 1;
      out->segment_end[0] = first_end;
      out->segment_end[1] = out->len;
      out->api = api;
      out->thinking = enc.thinking;
      snprintf(out->effort, sizeof out->effort, "%s", enc.reasoning_effort ? enc.reasoning_effort : "");
      out->messages = json_incref(c.messages);
    }
  }
  st_buf_free(&text);
  json_decref(tail);
  chat_request_free(&c);
  return st;
}

void st_chat_prompt_free(st_chat_prompt *p) {
  free(p->text);
  json_decref(p->messages);
  memset(p, 0, sizeof *p);
}

st_status st_chat_prompt_ids(st_tokenizer *tok, const st_chat_prompt *p, st_token_ids *out) {
  size_t start = 0;
  for (size_t s = 0; s < p->n_segments; s++) {
    st_status st = st_tokenizer_encode(tok, p->text + start, p->segment_end[s] - start, 0, out);
    if (st) return st;
    start = p->segment_end[s];
  }
  return ST_OK;
}
