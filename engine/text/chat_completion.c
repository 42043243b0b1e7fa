/*
** chat_completion.c — the model's completion text read back into its parts: the inverse of the
** assistant turn that chat.c renders (ENCODING-dsv4.md §1.5–§1.6).
**
** A completion is CONTENT, optionally followed by one DSML block
**
**   <｜DSML｜tool_calls>
**   <｜DSML｜invoke name="NAME">
**   <｜DSML｜parameter name="KEY" string="true">RAW TEXT</｜DSML｜parameter>
**   <｜DSML｜parameter name="KEY" string="false">JSON</｜DSML｜parameter>
**   </｜DSML｜invoke>
**   </｜DSML｜tool_calls>
**
** (the reasoning before </think> is split off earlier, by the caller). The reader is as strict
** about tags as the renderer is exact, and as loose about the whitespace between them as a model
** that was not trained on this exact spacing needs: any run of whitespace between two tags is
** accepted. A string="false" value that is not JSON is kept as the raw string (what sglang's
** and vLLM's DSML parsers do). Anything else that does not follow the grammar is ST_EFORMAT with
** the byte offset, and the caller answers the completion as plain text.
*/
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/chat.h"

#define DSML "｜DSML｜"
static const char block_open[] = "<" DSML "tool_calls>";
static const char block_close[] = "</" DSML "tool_calls>";
static const char invoke_open[] = "<" DSML "invoke name=\"";
static const char invoke_close[] = "</" DSML "invoke>";
static const char param_open[] = "<" DSML "parameter name=\"";
static const char param_close[] = "</" DSML "parameter>";

const char *st_chat_tool_calls_marker(void) { return block_open; }

typedef struct reader {
  const char *s;
  size_t n, at;
} reader;

static void skip_space(reader *r) {
  while (r->at < r->n && isspace((unsigned char)r->s[r->at])) r->at++;
}

static int take(reader *r, const char *lit) {
  size_t k = strlen(lit);
  if (r->n - r->at < k || memcmp(r->s + r->at, lit, k)) return 0;
  r->at += k;
  return 1;
}

/* Bytes up to `end` (not included; r moves past it), or -1 when `end` never comes. */
static long until(reader *r, const char *end, const char **start) {
  size_t k = strlen(end);
  *start = r->s + r->at;
  for (size_t i = r->at; i + k <= r->n; i++)
    if (!memcmp(r->s + i, end, k)) {
      long len = (long)(i - r->at);
      r->at = i + k;
      return len;
    }
  return -1;
}

static st_status bad(const reader *r, size_t base, const char *what) {
  return st_fail(ST_EFORMAT, "the completion's DSML tool-call block, byte %zu: expected %s",
                 base + r->at, what);
}

static st_status read_invoke(reader *r, size_t base, st_tool_call *call) {
  const char *name;
  long name_len = until(r, "\">", &name);
  if (name_len < 1 || memchr(name, '\n', (size_t)name_len))
    return bad(r, base, "a tool name and '\">'");
  call->name = strndup(name, (size_t)name_len);
  call->arguments = json_object();
  if (!call->name || !call->arguments) return st_fail(ST_ENOMEM, "a parsed tool call");
  for (;;) {
    skip_space(r);
    if (take(r, invoke_close)) return ST_OK;
    if (!take(r, param_open))
      return bad(r, base, "<" DSML "parameter name=\"...\"> or </" DSML "invoke>");
    const char *key;
    long key_len = until(r, "\"", &key);
    if (key_len < 1) return bad(r, base, "a parameter name and '\"'");
    int is_string;
    if (take(r, " string=\"true\">")) is_string = 1;
    else if (take(r, " string=\"false\">")) is_string = 0;
    else return bad(r, base, "' string=\"true\">' or ' string=\"false\">'");
    const char *value;
    long value_len = until(r, param_close, &value);
    if (value_len < 0) return bad(r, base, "</" DSML "parameter>");
    json_t *v = NULL;
    if (!is_string) {
      json_error_t e;
      v = json_loadb(value, (size_t)value_len, JSON_DECODE_ANY, &e);
    }
    if (!v) v = json_stringn(value, (size_t)value_len);
    char *k = strndup(key, (size_t)key_len);
    if (!v || !k || json_object_set_new(call->arguments, k, v)) {
      free(k);
      return st_fail(ST_ENOMEM, "a parsed tool call's arguments");
    }
    free(k);
  }
}

st_status st_chat_parse_completion(const char *text, size_t len, st_chat_completion *out) {
  memset(out, 0, sizeof *out);
  out->content_len = len;
  const char *open = NULL;
  for (size_t i = 0; i + sizeof block_open - 1 <= len; i++)
    if (!memcmp(text + i, block_open, sizeof block_open - 1)) {
      open = text + i;
      break;
    }
  if (!open) return ST_OK;
  size_t base = (size_t)(open - text);
  reader r = {open, len - base, sizeof block_open - 1};
  st_status st = ST_OK;
  for (;;) {
    skip_space(&r);
    if (take(&r, block_close)) break;
    if (!take(&r, invoke_open)) {
      st = bad(&r, base, out->n_calls ? "<" DSML "invoke name=\"...\"> or </" DSML "tool_calls>"
                                      : "<" DSML "invoke name=\"...\">");
      goto fail;
    }
    st_tool_call *grown = realloc(out->calls, sizeof *grown * (out->n_calls + 1));
    if (!grown) {
      st = st_fail(ST_ENOMEM, "parsed tool calls");
      goto fail;
    }
    out->calls = grown;
    memset(&out->calls[out->n_calls], 0, sizeof *out->calls);
    st = read_invoke(&r, base, &out->calls[out->n_calls++]);
    if (st) goto fail;
  }
  if (!out->n_calls) {
    st = bad(&r, base, "at least one <" DSML "invoke>");
    goto fail;
  }
  /* the content is what comes before the block, without the "\n\n" the renderer puts there */
  out->content_len = base;
  while (out->content_len > 0 && isspace((unsigned char)text[out->content_len - 1]))
    out->content_len--;
  return ST_OK;
fail:
  st_chat_completion_free(out);
  out->content_len = len;
  return st;
}

void st_chat_completion_free(st_chat_completion *c) {
  for (size_t i = 0; i < c->n_calls; i++) {
    free(c->calls[i].name);
    json_decref(c->calls[i].arguments);
  }
  free(c->calls);
  c->calls = NULL;
  c->n_calls = 0;
}
