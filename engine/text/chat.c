/*
** chat.c — the DeepSeek-V4 reference encoder (`encode_messages`, ENCODING-dsv4.md §1) over
** jansson values.
**
** Written from the description in ENCODING-dsv4.md and the behaviour of the checkpoint's
** encoding/encoding_dsv4.py as quoted by the engines (§0 SGL-ENC, VLLM-ENC). Python semantics
** the prompt depends on are kept on purpose: "content or ''" (None and "" both give ""),
** truthiness of `tools` / `tool_calls` / `response_format` (empty lists render nothing),
** str() of non-string values inside f-strings ("None", "True"), json.loads of history
** arguments with the one-parameter fallback, the last-user index computed on the merged list,
** and the transition rule that looks at the next message's role.
**
** The prompt constants below (the tools block, the effort paragraphs) are the model's prompt
** format: byte-exact text the model was trained on, as it appears in the checkpoint's encoder
** (MIT) and in rendered prompts (GOLD test_output_1.txt, §1.6; COPY-A/COPY-B, §1.7).
*/
#include <stdlib.h>
#include <string.h>

#include "engine/text/chat.h"

/* ---------------------------------------------------------------- the format's strings */

#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define THINK_START "<think>"
#define THINK_END "</think>"
#define DSML "｜DSML｜"
#define USER_TOKEN "<｜User｜>"
#define ASSISTANT_TOKEN "<｜Assistant｜>"
#define LATEST_REMINDER_TOKEN "<｜latest_reminder｜>"

static const struct {
  const char *task, *token;
} task_tokens[] = {
  {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
  {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"},
};

/* §1.6: the tools block around the schema lines. */
static const char tools_head[] =
  "## Tools\n\n"
  "You have access to a set of tools to help answer the user's question. You can invoke tools "
  "by writing a \"<" DSML "tool_calls>\" block like the following:\n\n"
  "<" DSML "tool_calls>\n"
  "<" DSML "invoke name=\"$TOOL_NAME\">\n"
  "<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML "parameter>\n"
  "...\n"
  "</" DSML "invoke>\n"
  "<" DSML "invoke name=\"$TOOL_NAME2\">\n"
  "...\n"
  "</" DSML "invoke>\n"
  "</" DSML "tool_calls>\n\n"
  "String parameters should be specified as is and set `string=\"true\"`. For all other types "
  "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
  "If thinking_mode is enabled (triggered by " THINK_START "), you MUST output your complete "
  "reasoning inside " THINK_START "..." THINK_END " BEFORE any tool calls or final response.\n\n"
  "Otherwise, output directly after " THINK_END " with tool calls or final response.\n\n"
  "### Available Tool Schemas\n\n";
static const char tools_tail[] =
  "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

static const char response_format_head[] =
  "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/* §1.7: the legacy encoder's REASONING_EFFORT_MAX, which the 0731 encoder uses for "high". */
static const char effort_absolute_max[] =
  "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
  "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
  "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
  "edge cases, and adversarial scenarios.\n"
  "Explicitly write out your entire deliberation process, documenting every intermediate step, "
  "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
  "unchecked.\n\n";
/* §1.7: the 0731 encoder's "max". */
static const char effort_beyond_max[] =
  "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
  "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
  "exhaustively decompose the problem into its most fundamental components, trace every causal "
  "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
  "Do not stop reasoning until you have independently verified the solution from multiple "
  "angles and are certain that no assumption remains unchecked and no error remains "
  "undiscovered.\n\n";

void st_chat_encoder_default(st_chat_encoder *e) {
  memset(e, 0, sizeof *e);
  e->thinking = 1;
  e->drop_thinking = 1;
  e->add_bos = 1;
}

/* ---------------------------------------------------------------- Python value helpers */

static const char *role_of(const json_t *m) { return json_string_value(json_object_get(m, "role")); }

static int role_is(const json_t *m, const char *role) {
  const char *r = role_of(m);
  return r && !strcmp(r, role);
}

/* Python truthiness of msg.get(key). */
static int truthy(const json_t *v) {
  if (!v) return 0;
  switch (json_typeof(v)) {
  case JSON_NULL:
  case JSON_FALSE: return 0;
  case JSON_TRUE: return 1;
  case JSON_STRING: return json_string_length(v) > 0;
  case JSON_ARRAY: return json_array_size(v) > 0;
  case JSON_OBJECT: return json_object_size(v) > 0;
  case JSON_INTEGER: return json_integer_value(v) != 0;
  case JSON_REAL: return json_real_value(v) != 0;
  }
  return 0;
}

static void py_repr(st_buf *out, const json_t *v);

/* Python repr of a str: single quotes unless the text has ' and no ", escapes as CPython. */
static void py_repr_string(st_buf *out, const char *s, size_t n) {
  int has_single = memchr(s, '\'', n) != NULL, has_double = memchr(s, '"', n) != NULL;
  char q = has_single && !has_double ? '"' : '\'';
  st_buf_add(out, &q, 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\\') st_buf_str(out, "\\\\");
    else if (c == (unsigned char)q) st_buf_printf(out, "\\%c", q);
    else if (c == '\n') st_buf_str(out, "\\n");
    else if (c == '\r') st_buf_str(out, "\\r");
    else if (c == '\t') st_buf_str(out, "\\t");
    else if (c < 0x20 || c == 0x7f) st_buf_printf(out, "\\x%02x", c);
    else if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] <= 0x9f)
      st_buf_printf(out, "\\x%02x", (unsigned char)s[++i]); /* C1 controls are not printable */
    else st_buf_add(out, s + i, 1);
  }
  st_buf_add(out, &q, 1);
}

static void py_repr(st_buf *out, const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_STRING: py_repr_string(out, json_string_value(v), json_string_length(v)); break;
  case JSON_ARRAY: {
    size_t i;
    json_t *x;
    st_buf_add(out, "[", 1);
    json_array_foreach(v, i, x) {
      if (i) st_buf_add(out, ", ", 2);
      py_repr(out, x);
    }
    st_buf_add(out, "]", 1);
    break;
  }
  case JSON_OBJECT: {
    const char *k;
    json_t *x;
    int first = 1;
    st_buf_add(out, "{", 1);
    json_object_foreach((json_t *)v, k, x) {
      if (!first) st_buf_add(out, ", ", 2);
      first = 0;
      py_repr_string(out, k, strlen(k));
      st_buf_add(out, ": ", 2);
      py_repr(out, x);
    }
    st_buf_add(out, "}", 1);
    break;
  }
  case JSON_NULL: st_buf_str(out, "None"); break;
  case JSON_TRUE: st_buf_str(out, "True"); break;
  case JSON_FALSE: st_buf_str(out, "False"); break;
  default: st_pyjson_dump(out, v, 0); break; /* numbers: str() == repr() == json spelling */
  }
}

/* str(v) as an f-string / str.format inserts it; NULL (a missing key) is None. */
static void py_str(st_buf *out, const json_t *v) {
  if (v && json_is_string(v)) st_buf_add(out, json_string_value(v), json_string_length(v));
  else if (!v) st_buf_str(out, "None");
  else py_repr(out, v);
}

/* `x or ""` then str(): None, "", [], {}, 0, false → ""; anything else as str(). */
static void py_str_or_empty(st_buf *out, const json_t *v) {
  if (truthy(v)) py_str(out, v);
}

/* ---------------------------------------------------------------- preprocessing (§1.3) */

/* msg.get(key, ""): a new reference. */
static json_t *get_or_empty(const json_t *msg, const char *key) {
  json_t *v = json_object_get(msg, key);
  return v ? json_incref(v) : json_string("");
}

/* merge_tool_messages: tool messages become tool_result blocks of user messages; user messages
** get content_blocks and are appended to a preceding user message that has blocks and no task. */
static st_status merge_tool_messages(const json_t *messages, json_t **out) {
  json_t *merged = json_array();
  if (!merged) return st_fail(ST_ENOMEM, "chat: out of memory");
  size_t i;
  json_t *msg;
  json_array_foreach(messages, i, msg) {
    if (!json_is_object(msg)) {
      json_decref(merged);
      return st_fail(ST_EINVAL, "messages[%zu]: not an object", i);
    }
    size_t n = json_array_size(merged);
    json_t *last = n ? json_array_get(merged, n - 1) : NULL;
    int last_user_blocks = last && role_is(last, "user") && json_object_get(last, "content_blocks");
    if (role_is(msg, "tool")) {
      /* {"type": "tool_result", "tool_use_id": msg.get("tool_call_id", ""),
      **  "content": msg.get("content", "")} */
      json_t *block = json_object();
      json_object_set_new(block, "type", json_string("tool_result"));
      json_object_set_new(block, "tool_use_id", get_or_empty(msg, "tool_call_id"));
      json_object_set_new(block, "content", get_or_empty(msg, "content"));
      if (last_user_blocks) {
        json_array_append_new(json_object_get(last, "content_blocks"), block);
      } else {
        json_t *m = json_object(), *blocks = json_array();
        json_object_set_new(m, "role", json_string("user"));
        json_array_append_new(blocks, block);
        json_object_set_new(m, "content_blocks", blocks);
        json_array_append_new(merged, m);
      }
    } else if (role_is(msg, "user")) {
      json_t *block = json_object();
      json_object_set_new(block, "type", json_string("text"));
      json_object_set_new(block, "text", get_or_empty(msg, "content"));
      json_t *task = last ? json_object_get(last, "task") : NULL;
      if (last_user_blocks && (!task || json_is_null(task))) {
        json_array_append_new(json_object_get(last, "content_blocks"), block);
      } else {
        json_t *m = json_object(), *blocks = json_array();
        json_object_set_new(m, "role", json_string("user"));
        json_object_set_new(m, "content", get_or_empty(msg, "content"));
        json_array_append_new(blocks, block);
        json_object_set_new(m, "content_blocks", blocks);
        static const char *const keep[] = {"task", "wo_eos", "mask"};
        for (size_t k = 0; k < 3; k++)
          if (json_object_get(msg, keep[k])) json_object_set(m, keep[k], json_object_get(msg, keep[k]));
        json_array_append_new(merged, m);
      }
    } else {
      json_array_append_new(merged, json_deep_copy(msg));
    }
  }
  *out = merged;
  return ST_OK;
}

/* sort_tool_results_by_call_order: within a user message holding more than one tool_result, the
** results take the order of the calls of the latest assistant message with tool_calls (unknown
** ids sort as 0; the sort is stable). */
static void sort_tool_results(json_t *messages) {
  json_t *order = json_object(); /* call id → index */
  size_t i;
  json_t *msg;
  json_array_foreach(messages, i, msg) {
    if (role_is(msg, "assistant") && truthy(json_object_get(msg, "tool_calls"))) {
      json_object_clear(order);
      size_t k;
      json_t *tc;
      json_array_foreach(json_object_get(msg, "tool_calls"), k, tc) {
        json_t *id = json_object_get(tc, "id");
        if (!truthy(id)) id = json_object_get(json_object_get(tc, "function"), "id");
        if (truthy(id) && json_is_string(id)) json_object_set_new(order, json_string_value(id), json_integer((json_int_t)k));
      }
    } else if (role_is(msg, "user") && truthy(json_object_get(msg, "content_blocks"))) {
      json_t *blocks = json_object_get(msg, "content_blocks");
      size_t nb = json_array_size(blocks), nt = 0;
      json_t **tool = calloc(nb ? nb : 1, sizeof *tool);
      json_int_t *key = calloc(nb ? nb : 1, sizeof *key);
      if (!tool || !key) {
        free(tool), free(key);
        continue;
      }
      for (size_t b = 0; b < nb; b++) {
        json_t *blk = json_array_get(blocks, b);
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (type && !strcmp(type, "tool_result")) {
          const char *id = json_string_value(json_object_get(blk, "tool_use_id"));
          json_t *pos = id ? json_object_get(order, id) : NULL;
          key[nt] = pos ? json_integer_value(pos) : 0;
          tool[nt++] = blk;
        }
      }
      if (nt > 1 && json_object_size(order)) {
        /* stable insertion sort by key */
        for (size_t a = 1; a < nt; a++) {
          json_t *t = tool[a];
          json_int_t kk = key[a];
          size_t b = a;
          while (b > 0 && key[b - 1] > kk) tool[b] = tool[b - 1], key[b] = key[b - 1], b--;
          tool[b] = t, key[b] = kk;
        }
        json_t *fresh = json_array();
        size_t s = 0;
        for (size_t b = 0; b < nb; b++) {
          json_t *blk = json_array_get(blocks, b);
          const char *type = json_string_value(json_object_get(blk, "type"));
          json_array_append(fresh, type && !strcmp(type, "tool_result") ? tool[s++] : blk);
        }
        json_object_set_new(msg, "content_blocks", fresh);
      }
      free(tool);
      free(key);
    }
  }
  json_decref(order);
}

static int last_user_index(const json_t *messages) {
  for (size_t i = json_array_size(messages); i-- > 0;) {
    const json_t *m = json_array_get(messages, i);
    if (role_is(m, "user") || role_is(m, "developer")) return (int)i;
  }
  return -1;
}

/* _drop_thinking_messages: before the last user/developer message, assistants lose
** reasoning_content and roles other than user/system/tool/latest_reminder/direct_search_results
** are removed. */
static json_t *drop_thinking_messages(const json_t *messages) {
  int last = last_user_index(messages);
  json_t *out = json_array();
  size_t i;
  json_t *m;
  json_array_foreach(messages, i, m) {
    const char *r = role_of(m);
    int keep = r && (!strcmp(r, "user") || !strcmp(r, "system") || !strcmp(r, "tool") ||
                     !strcmp(r, "latest_reminder") || !strcmp(r, "direct_search_results"));
    if (keep || (int)i >= last) {
      json_array_append(out, m);
    } else if (r && !strcmp(r, "assistant")) {
      json_t *c = json_copy(m);
      json_object_del(c, "reasoning_content");
      json_array_append_new(out, c);
    }
  }
  return out;
}

/* ---------------------------------------------------------------- rendering (§1.4 - §1.6) */

static st_status render_tools(st_buf *out, const json_t *tools, size_t msg_index) {
  st_buf_str(out, tools_head);
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    json_t *fn = json_object_get(t, "function");
    if (!fn) return st_fail(ST_EINVAL, "messages[%zu].tools[%zu]: no \"function\" (OpenAI tool format expected)", msg_index, i);
    if (i) st_buf_add(out, "\n", 1);
    st_pyjson_dump(out, fn, 0);
  }
  st_buf_str(out, tools_tail);
  return ST_OK;
}

static void render_response_format(st_buf *out, const json_t *rf) {
  st_buf_add(out, "\n\n", 2);
  st_buf_str(out, response_format_head);
  st_pyjson_dump(out, rf, 0);
}

/* encode_arguments_to_dsml: one <｜DSML｜parameter> line per argument, joined by "\n". */
static st_status render_arguments(st_buf *out, const json_t *arguments, const st_chat_encoder *enc,
                                  const char *where) {
  json_t *parsed = NULL, *owned = NULL;
  if (json_is_string(arguments)) {
    json_error_t e;
    parsed = owned = json_loadb(json_string_value(arguments), json_string_length(arguments),
                                JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
  } else if (enc->arguments_object_ok && json_is_object(arguments)) {
    parsed = (json_t *)arguments;
  }
  if (!parsed) {
    /* json.loads failed (or was handed a non-string): one parameter holding the raw value. */
    owned = parsed = json_object();
    json_object_set(parsed, "arguments", arguments ? (json_t *)arguments : json_null());
  }
  if (!json_is_object(parsed)) {
    json_decref(owned);
    return st_fail(ST_EINVAL, "%s: the arguments are JSON but not an object (the encoder calls .items() on them)", where);
  }
  const char *k;
  json_t *v;
  int first = 1;
  json_object_foreach(parsed, k, v) {
    if (!first) st_buf_add(out, "\n", 1);
    first = 0;
    int is_str = json_is_string(v);
    st_buf_str(out, "<" DSML "parameter name=\"");
    st_buf_str(out, k);
    st_buf_str(out, is_str ? "\" string=\"true\">" : "\" string=\"false\">");
    if (is_str) st_buf_add(out, json_string_value(v), json_string_length(v));
    else st_pyjson_dump(out, v, 0);
    st_buf_str(out, "</" DSML "parameter>");
  }
  json_decref(owned);
  return ST_OK;
}

static st_status render_tool_calls(st_buf *out, const json_t *calls, const st_chat_encoder *enc,
                                   size_t msg_index) {
  st_buf_str(out, "\n\n<" DSML "tool_calls>\n");
  size_t i;
  json_t *tc;
  json_array_foreach(calls, i, tc) {
    char where[96];
    snprintf(where, sizeof where, "messages[%zu].tool_calls[%zu].function", msg_index, i);
    json_t *fn = json_object_get(tc, "function");
    if (!json_is_object(fn) || !json_object_get(fn, "name") || !json_object_get(fn, "arguments"))
      return st_fail(ST_EINVAL, "%s: needs \"name\" and \"arguments\"", where);
    if (i) st_buf_add(out, "\n", 1);
    st_buf_str(out, "<" DSML "invoke name=\"");
    py_str(out, json_object_get(fn, "name"));
    st_buf_str(out, "\">\n");
    st_status st = render_arguments(out, json_object_get(fn, "arguments"), enc, where);
    if (st) return st;
    st_buf_str(out, "\n</" DSML "invoke>");
  }
  st_buf_str(out, "\n</" DSML "tool_calls>");
  return ST_OK;
}

/* A user message's content blocks (text, tool_result, anything else), joined by "\n\n". */
static st_status render_user_blocks(st_buf *out, const json_t *blocks, size_t msg_index) {
  size_t i;
  json_t *b;
  json_array_foreach(blocks, i, b) {
    if (i) st_buf_add(out, "\n\n", 2);
    const char *type = json_string_value(json_object_get(b, "type"));
    if (type && !strcmp(type, "text")) {
      json_t *text = json_object_get(b, "text");
      if (text && !json_is_string(text))
        return st_fail(ST_EINVAL, "messages[%zu]: user content must be a string (got %s; the "
                       "encoder's str.join fails)", msg_index, json_is_null(text) ? "null" : "a JSON value");
      if (text) st_buf_add(out, json_string_value(text), json_string_length(text));
    } else if (type && !strcmp(type, "tool_result")) {
      json_t *content = json_object_get(b, "content");
      st_buf_str(out, "<tool_result>");
      if (json_is_array(content)) {
        size_t k;
        json_t *part;
        json_array_foreach(content, k, part) {
          if (k) st_buf_add(out, "\n\n", 2);
          const char *pt = json_string_value(json_object_get(part, "type"));
          if (pt && !strcmp(pt, "text")) py_str_or_empty(out, json_object_get(part, "text"));
          else {
            st_buf_str(out, "[Unsupported ");
            py_str(out, json_object_get(part, "type"));
            st_buf_str(out, "]");
          }
        }
      } else {
        py_str(out, content);
      }
      st_buf_str(out, "</tool_result>");
    } else {
      st_buf_str(out, "[Unsupported ");
      py_str(out, json_object_get(b, "type"));
      st_buf_str(out, "]");
    }
  }
  return ST_OK;
}

/* A content value that must be text: a string, or null/"" (→ ""). Lists are the request
** layer's business (each engine joins parts its own way). */
static st_status text_content(st_buf *out, const json_t *content, size_t msg_index, const char *role) {
  if (!content || json_is_null(content)) return ST_OK;
  if (json_is_string(content)) {
    st_buf_add(out, json_string_value(content), json_string_length(content));
    return ST_OK;
  }
  if (!truthy(content)) return ST_OK;
  return st_fail(ST_EINVAL, "messages[%zu] (%s): content must be a string here, not a %s "
                 "(content parts are joined by the request mapping)", msg_index, role,
                 json_is_array(content) ? "list" : "JSON value");
}

static const char *effort_text(const st_chat_encoder *enc) {
  const char *e = enc->reasoning_effort;
  if (enc->effort_table == ST_EFFORT_LEGACY) return e && !strcmp(e, "max") ? effort_absolute_max : "";
  if (!e || !strcmp(e, "low")) return "";
  return !strcmp(e, "high") ? effort_absolute_max : effort_beyond_max;
}

static st_status render_message(st_buf *out, size_t index, const json_t *messages, int last_user,
                                int drop, const st_chat_encoder *enc) {
  const json_t *msg = json_array_get(messages, index);
  const char *role = role_of(msg);
  json_t *content = json_object_get(msg, "content");
  json_t *tools = json_object_get(msg, "tools");
  json_t *rf = json_object_get(msg, "response_format");
  st_status st;

  if (index == 0 && enc->thinking) st_buf_str(out, effort_text(enc));
  if (!role) return st_fail(ST_EINVAL, "messages[%zu]: no role", index);
  if (truthy(tools) && !json_is_array(tools)) return st_fail(ST_EINVAL, "messages[%zu].tools: not a list", index);

  if (!strcmp(role, "system")) {
    if ((st = text_content(out, content, index, role))) return st;
    if (truthy(tools)) {
      st_buf_add(out, "\n\n", 2);
      if ((st = render_tools(out, tools, index))) return st;
    }
    if (truthy(rf)) render_response_format(out, rf);
  } else if (!strcmp(role, "developer")) {
    if (!truthy(content)) return st_fail(ST_EINVAL, "messages[%zu]: a developer message needs content (the encoder asserts it)", index);
    st_buf_str(out, USER_TOKEN);
    if ((st = text_content(out, content, index, role))) return st;
    if (truthy(tools)) {
      st_buf_add(out, "\n\n", 2);
      if ((st = render_tools(out, tools, index))) return st;
    }
    if (truthy(rf)) render_response_format(out, rf);
  } else if (!strcmp(role, "user")) {
    st_buf_str(out, USER_TOKEN);
    json_t *blocks = json_object_get(msg, "content_blocks");
    if (truthy(blocks)) {
      if ((st = render_user_blocks(out, blocks, index))) return st;
    } else if ((st = text_content(out, content, index, role))) {
      return st;
    }
  } else if (!strcmp(role, "latest_reminder")) {
    st_buf_str(out, LATEST_REMINDER_TOKEN);
    py_str(out, content);
  } else if (!strcmp(role, "tool")) {
    return st_fail(ST_EINVAL, "messages[%zu]: a tool message reached rendering (merge failed)", index);
  } else if (!strcmp(role, "assistant")) {
    const json_t *prev = index ? json_array_get(messages, index - 1) : NULL;
    json_t *prev_task = prev ? json_object_get(prev, "task") : NULL;
    int prev_has_task = prev_task && !json_is_null(prev_task);
    if (enc->thinking && !prev_has_task && (!drop || (int)index > last_user)) {
      py_str_or_empty(out, json_object_get(msg, "reasoning_content"));
      st_buf_str(out, THINK_END);
    }
    if ((st = text_content(out, content, index, role))) return st;
    json_t *calls = json_object_get(msg, "tool_calls");
    if (truthy(calls)) {
      if (!json_is_array(calls)) return st_fail(ST_EINVAL, "messages[%zu].tool_calls: not a list", index);
      if ((st = render_tool_calls(out, calls, enc, index))) return st;
    }
    if (!truthy(json_object_get(msg, "wo_eos"))) st_buf_str(out, EOS);
  } else {
    return st_fail(ST_EINVAL, "messages[%zu]: unknown role \"%s\"", index, role);
  }

  /* §1.5 transitions: only before an assistant / latest_reminder message, or at the end. */
  const json_t *next = json_array_get(messages, index + 1);
  if (next && !role_is(next, "assistant") && !role_is(next, "latest_reminder")) return ST_OK;
  json_t *task = json_object_get(msg, "task");
  if (task && !json_is_null(task)) {
    const char *t = json_string_value(task), *token = NULL;
    for (size_t k = 0; t && k < sizeof task_tokens / sizeof task_tokens[0]; k++)
      if (!strcmp(t, task_tokens[k].task)) token = task_tokens[k].token;
    if (!token)
      return st_fail(ST_EINVAL, "messages[%zu].task: not one of action, query, authority, domain, title, read_url", index);
    if (strcmp(t, "action")) {
      st_buf_str(out, token);
    } else {
      st_buf_str(out, ASSISTANT_TOKEN);
      st_buf_str(out, enc->thinking ? THINK_START : THINK_END);
      st_buf_str(out, token);
    }
  } else if (!strcmp(role, "user") || !strcmp(role, "developer")) {
    st_buf_str(out, ASSISTANT_TOKEN);
    int open = enc->thinking && (!drop || (int)index >= last_user);
    st_buf_str(out, open ? THINK_START : THINK_END);
  }
  return ST_OK;
}

static st_status check_effort(const st_chat_encoder *enc) {
  const char *e = enc->reasoning_effort;
  if (enc->effort_table == ST_EFFORT_LEGACY) {
    if (e && strcmp(e, "high") && strcmp(e, "max"))
      return st_fail(ST_EINVAL, "reasoning_effort \"%s\": the legacy DeepSeek-V4 encoder accepts only "
                     "none, \"high\" and \"max\"", e);
  } else if (e && strcmp(e, "low") && strcmp(e, "high") && strcmp(e, "max")) {
    return st_fail(ST_EINVAL, "reasoning_effort \"%s\": the 0731 encoder accepts only \"low\", \"high\" and \"max\"", e);
  }
  return ST_OK;
}

st_status st_chat_encode_messages(const json_t *messages, const st_chat_encoder *enc, st_buf *out) {
  if (!json_is_array(messages)) return st_fail(ST_EINVAL, "messages: not a list");
  st_status st = check_effort(enc);
  if (st) return st;
  json_t *merged = NULL, *full = NULL;
  if ((st = merge_tool_messages(messages, &merged))) return st;
  sort_tool_results(merged);
  if (enc->add_bos) st_buf_str(out, BOS);
  int drop = enc->drop_thinking;
  size_t i;
  json_t *m;
  json_array_foreach(merged, i, m)
    if (truthy(json_object_get(m, "tools"))) drop = 0;
  full = enc->thinking && drop ? drop_thinking_messages(merged) : json_incref(merged);
  int last_user = last_user_index(full);
  for (i = 0; i < json_array_size(full) && !st; i++) st = render_message(out, i, full, last_user, drop, enc);
  json_decref(full);
  json_decref(merged);
  if (!st) st = st_buf_status(out, "chat");
  return st;
}
