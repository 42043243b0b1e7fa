/*
** cmd_render.c — `sparsetrace render`: a captured API request as the DeepSeek-V4 prompt (or its
** token ids) that a given serving engine builds from it, to diff against what the server logged.
*/
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "common/base.h"
#include "engine/text/chat.h"
#include "engine/text/pyjson.h"
#include "engine/text/tokenizer.h"

static const st_opt_use render_options[] = {
  {ST_OPT_REQUEST, "FILE", "the request body (JSON), or a record written by `sparsetrace requests\n"
                           "export` (its body and API are used); \"-\" reads standard input"},
  {ST_OPT_MODEL, NULL, "tokenizer.json (+ tokenizer_config.json) for --ids and --json"},
  {ST_OPT_RENDER, NULL, "reference (default), sglang, vllm or atom: how that engine maps the\n"
                        "request (tools placement, tool-schema key order, content-part joining,\n"
                        "thinking default, effort mapping); see engine/chat_requests.c"},
  {ST_OPT_IDS, NULL, "print the prompt's token ids as one JSON array (needs --model)"},
  {ST_OPT_JSON, NULL, "print {\"api\", \"render\", \"thinking\", \"reasoning_effort\", \"prompt\",\n"
                      "\"n_tokens\", \"ids\"} (ids and n_tokens when --model is given)"},
  {ST_OPT_API, NULL, "read the body as this API: auto (default: guessed from its shape), chat,\n"
                     "anthropic, responses"},
  {ST_OPT_THINKING, NULL, "force thinking or chat mode (default: the request, then the profile)"},
  {ST_OPT_EFFORT, NULL, "force reasoning_effort (none, low, high, max, ...)"},
  {ST_OPT_EFFORT_TABLE, NULL, "legacy (V4-Flash/-Pro, default) or 0731 (V4-Flash-0731): which\n"
                              "checkpoint's effort prompts; the config files cannot tell them apart"},
  {ST_OPT_DROP_THINKING, NULL, "the encoder's drop_thinking (default: the request, else on)"},
  {0}};

static const st_cmd_spec render_spec = {
  "render",
  "sparsetrace render --request FILE.json [--model DIR] [--render PROFILE] [--ids]\n"
  "                          [--api auto|chat|anthropic|responses] [--thinking on|off]\n"
  "                          [--effort E] [--effort-table legacy|0731] [--drop-thinking on|off]\n"
  "                          [--json]\n",
  "Prints the DeepSeek-V4 prompt a serving engine renders from an API request body (OpenAI\n"
  "/v1/chat/completions, Anthropic /v1/messages or OpenAI /v1/responses), byte for byte, or with\n"
  "--ids its token ids, so it can be compared with what the server logged or returned\n"
  "(sglang return_prompt_token_ids, vLLM return_token_ids, usage.prompt_tokens).\n",
  render_options,
  "Without --ids or --json the prompt is written as it is, with no newline added.\n"};

static int on_off(const char *s, int *out) {
  if (!strcmp(s, "on") || !strcmp(s, "true") || !strcmp(s, "1")) return *out = 1, 0;
  if (!strcmp(s, "off") || !strcmp(s, "false") || !strcmp(s, "0")) return *out = 0, 0;
  return -1;
}

/* The request body, from a bare body or from a `sparsetrace requests export` record
** (schemas/capture.schema.json: the body string under request.body, the API under "api"). */
static json_t *load_request(const char *path, st_chat_api *api) {
  json_error_t e;
  json_t *req = !strcmp(path, "-") ? json_loadf(stdin, JSON_ALLOW_NUL, &e)
                                   : json_load_file(path, JSON_ALLOW_NUL, &e);
  if (!req) {
    st_fail(ST_EINVAL, "%s:%d:%d: %s", path, e.line, e.column, e.text);
    return NULL;
  }
  const char *schema = json_string_value(json_object_get(req, "schema"));
  if (!schema || strcmp(schema, "sparsetrace.capture/1")) return req;
  json_t *body = json_object_get(json_object_get(req, "request"), "body");
  const char *kind = json_string_value(json_object_get(req, "api"));
  if (*api == ST_API_AUTO && kind) {
    if (!strcmp(kind, "anthropic.messages")) *api = ST_API_ANTHROPIC;
    else if (!strcmp(kind, "openai.chat")) *api = ST_API_CHAT;
    else if (!strcmp(kind, "openai.responses")) *api = ST_API_RESPONSES;
  }
  json_t *parsed = json_is_string(body) ? json_loadb(json_string_value(body), json_string_length(body),
                                                     JSON_ALLOW_NUL, &e) : NULL;
  if (!parsed)
    st_fail(ST_EINVAL, "%s: capture record %s has no JSON request body (request.body)", path,
            json_string_value(json_object_get(req, "id")) ? json_string_value(json_object_get(req, "id")) : "?");
  json_decref(req);
  return parsed;
}

int st_cmd_render(int argc, char **argv) {
  const char *request_path = NULL;
  int ids = 0, c;
  st_chat_options o;
  st_chat_options_default(&o);
  st_opts op;
  st_opts_init(&op, &render_spec, argc, argv);
  while ((c = st_opts_next(&op)) > 0) {
    int bad = 0;
    switch (c) {
    case ST_OPT_REQUEST: request_path = op.arg; break;
    case ST_OPT_RENDER: bad = st_render_profile_parse(op.arg, &o.profile) != ST_OK; break;
    case ST_OPT_IDS: ids = 1; break;
    case ST_OPT_API: bad = st_chat_api_parse(op.arg, &o.api) != ST_OK; break;
    case ST_OPT_THINKING: bad = on_off(op.arg, &o.thinking); if (bad) st_fail(ST_EINVAL, "--thinking: on or off"); break;
    case ST_OPT_EFFORT: o.reasoning_effort = op.arg; break;
    case ST_OPT_EFFORT_TABLE:
      if (!strcmp(op.arg, "legacy")) o.effort_table = ST_EFFORT_LEGACY;
      else if (!strcmp(op.arg, "0731")) o.effort_table = ST_EFFORT_0731;
      else bad = 1, st_fail(ST_EINVAL, "--effort-table: legacy or 0731");
      break;
    case ST_OPT_DROP_THINKING: bad = on_off(op.arg, &o.drop_thinking); if (bad) st_fail(ST_EINVAL, "--drop-thinking: on or off"); break;
    default: bad = 1, st_fail(ST_EINVAL, "unexpected argument '%s'", op.arg);
    }
    if (bad) {
      st_opts_fail(&op);
      c = ST_OPTS_EXIT;
      break;
    }
  }
  const char *model = op.model;
  int json = op.json;
  st_opts_free(&op);
  if (c == ST_OPTS_EXIT) return op.exit_code;
  if (!request_path || (ids && !model)) {
    fprintf(stderr, "sparsetrace render: %s\n(sparsetrace render --help lists the options)\n",
            !request_path ? "--request is required" : "--ids needs --model");
    return 2;
  }
  json_t *req = load_request(request_path, &o.api);
  if (!req) return st_cli_report_error("render");
  st_chat_prompt prompt;
  st_status st = st_chat_render_request(req, &o, &prompt);
  json_decref(req);
  if (st) {
    st_fail_context(st, "%s (render profile %s): ", request_path, st_render_profile_name(o.profile));
    return st_cli_report_error("render");
  }
  st_tokenizer *tok = NULL;
  st_token_ids tids = {0};
  if (model && (ids || json)) {
    if (st_cli_open_tokenizer(model, &tok) || st_chat_prompt_ids(tok, &prompt, &tids)) {
      st_chat_prompt_free(&prompt);
      st_tokenizer_close(tok);
      return st_cli_report_error("render");
    }
  }
  st_buf out = {0};
  if (json) {
    st_buf_printf(&out, "{\"api\": \"%s\", \"render\": \"%s\", \"thinking\": %s, \"reasoning_effort\": ",
                   st_chat_api_name(prompt.api), st_render_profile_name(o.profile), prompt.thinking ? "true" : "false");
    if (prompt.effort[0]) st_pyjson_string(&out, prompt.effort, strlen(prompt.effort), 0);
    else st_buf_str(&out, "null");
    st_buf_str(&out, ", \"prompt\": ");
    st_pyjson_string(&out, prompt.text, prompt.len, 0);
    if (tok) {
      st_buf_printf(&out, ", \"n_tokens\": %zu, \"ids\": [", tids.n);
      for (size_t i = 0; i < tids.n; i++) st_buf_printf(&out, i ? ", %d" : "%d", tids.ids[i]);
      st_buf_str(&out, "]");
    }
    st_buf_str(&out, "}\n");
  } else if (ids) {
    st_buf_str(&out, "[");
    for (size_t i = 0; i < tids.n; i++) st_buf_printf(&out, i ? ", %d" : "%d", tids.ids[i]);
    st_buf_str(&out, "]\n");
  } else {
    st_buf_add(&out, prompt.text, prompt.len);
  }
  int rc = 0;
  if (st_buf_status(&out, "render")) rc = st_cli_report_error("render");
  else fwrite(out.data ? out.data : "", 1, out.len, stdout);
  st_buf_free(&out);
  st_token_ids_free(&tids);
  st_tokenizer_close(tok);
  st_chat_prompt_free(&prompt);
  return rc;
}
