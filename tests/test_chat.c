/*
** test_chat.c — engine/text/chat.c (the DeepSeek-V4 encoder) and engine/text/chat_requests.c
** (request mappings and render profiles).
**
** The golden vectors are the .json files in tests/data/chat/, one case each: a request body, render options,
** and the expected prompt written by hand from ENCODING-dsv4.md (each case cites its section),
** as a list of parts joined without separators. Parts that are whole macros stand for the
** format's long strings, spelled out once below from §1.2, §1.6 and §1.7: @BOS@, @EOS@, @USER@,
** @ASSISTANT@, @TOOLS_HEAD@ (from "## Tools" to "### Available Tool Schemas\n\n"), @TOOLS_TAIL@
** ("\n\nYou MUST strictly follow ... tool calls.\n"), @EFFORT_ABSOLUTE_MAX@, @EFFORT_BEYOND_MAX@.
** A case may instead expect an error: {"status": "EINVAL", "message": "substring"}.
**
** Then: API detection, Python str()/json semantics inside the encoder, segment tokenisation, and
** (when DeepSeek's vocabulary can be fetched, see tests/tokenizer_fixture.h) the ids of a
** rendered V4 prompt with the V4 added tokens of §1.2.
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/text/chat.h"
#include "engine/text/pyjson.h"
#include "engine/text/tokenizer.h"
#include "tokenizer_fixture.h"

/* ------------------------------------------------------------------ the format's long strings */

#define DS "｜DSML｜"
static const struct {
  const char *name, *text;
} macros[] = {
  {"@BOS@", "<｜begin▁of▁sentence｜>"},
  {"@EOS@", "<｜end▁of▁sentence｜>"},
  {"@USER@", "<｜User｜>"},
  {"@ASSISTANT@", "<｜Assistant｜>"},
  {"@TOOLS_HEAD@",
   "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
   "writing a \"<" DS "tool_calls>\" block like the following:\n\n<" DS "tool_calls>\n<" DS
   "invoke name=\"$TOOL_NAME\">\n<" DS "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DS
   "parameter>\n...\n</" DS "invoke>\n<" DS "invoke name=\"$TOOL_NAME2\">\n...\n</" DS "invoke>\n</" DS
   "tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types "
   "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf "
   "thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
   "<think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> "
   "with tool calls or final response.\n\n### Available Tool Schemas\n\n"},
  {"@TOOLS_TAIL@", "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"},
  {"@EFFORT_ABSOLUTE_MAX@",
   "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking "
   "and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic "
   "against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire "
   "deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis "
   "to ensure absolutely no assumption is left unchecked.\n\n"},
  {"@EFFORT_BEYOND_MAX@",
   "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\nYou MUST reason with the "
   "utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose the problem into its "
   "most fundamental components, trace every causal chain to its root, and resolve the underlying cause rather "
   "than any surface symptom.\nDo not stop reasoning until you have independently verified the solution from "
   "multiple angles and are certain that no assumption remains unchecked and no error remains undiscovered.\n\n"},
};

static void expand_part(st_buf *out, const char *part) {
  for (size_t i = 0; i < sizeof macros / sizeof macros[0]; i++)
    if (!strcmp(part, macros[i].name)) {
      st_buf_str(out, macros[i].text);
      return;
    }
  st_buf_str(out, part);
}

/* ------------------------------------------------------------------ golden cases */

static int on(const char *s) { return !strcmp(s, "on"); }

static void options_from_json(const json_t *o, st_chat_options *opt, const char *file) {
  st_chat_options_default(opt);
  const char *s;
  if ((s = json_string_value(json_object_get(o, "render"))) && st_render_profile_parse(s, &opt->profile))
    fail_msg("%s: %s", file, st_errmsg());
  if ((s = json_string_value(json_object_get(o, "api"))) && st_chat_api_parse(s, &opt->api)) fail_msg("%s: %s", file, st_errmsg());
  if ((s = json_string_value(json_object_get(o, "thinking")))) opt->thinking = on(s);
  if ((s = json_string_value(json_object_get(o, "drop_thinking")))) opt->drop_thinking = on(s);
  opt->reasoning_effort = json_string_value(json_object_get(o, "effort"));
  if ((s = json_string_value(json_object_get(o, "effort_table")))) opt->effort_table = strcmp(s, "0731") ? ST_EFFORT_LEGACY : ST_EFFORT_0731;
}

static void report_difference(const char *file, const char *got, size_t got_len, const char *want, size_t want_len) {
  size_t i = 0;
  while (i < got_len && i < want_len && got[i] == want[i]) i++;
  size_t from = i > 60 ? i - 60 : 0;
  fail_msg("%s: prompts differ at byte %zu (got %zu bytes, want %zu)\n  got:  ...%.*s|%.*s\n  want: ...%.*s|%.*s", file, i,
           got_len, want_len, (int)(i - from), got + from, (int)ST_MIN(60, got_len - i), got + i, (int)(i - from),
           want + from, (int)ST_MIN(60, want_len - i), want + i);
}

static const char *status_name(st_status s) {
  switch (s) {
  case ST_OK: return "OK";
  case ST_EINVAL: return "EINVAL";
  case ST_EUNSUPPORTED: return "EUNSUPPORTED";
  case ST_ENOMEM: return "ENOMEM";
  default: return "other";
  }
}

static int json_file(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 5 && !strcmp(d->d_name + n - 5, ".json");
}

static void test_golden_cases(void **state) {
  (void)state;
  const char *data = getenv("ST_TEST_DATA");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/chat", data ? data : "tests/data");
  struct dirent **names = NULL;
  int n = scandir(dir, &names, json_file, alphasort);
  assert_true(n > 30);
  int profiles_seen[ST_RENDER_PROFILE_COUNT] = {0};
  for (int k = 0; k < n; k++) {
    char path[4600];
    snprintf(path, sizeof path, "%s/%s", dir, names[k]->d_name);
    json_error_t e;
    json_t *c = json_load_file(path, 0, &e);
    if (!c) fail_msg("%s:%d: %s", path, e.line, e.text);
    if (!json_is_string(json_object_get(c, "cite"))) fail_msg("%s: every case cites its section", names[k]->d_name);
    st_chat_options opt;
    options_from_json(json_object_get(c, "options"), &opt, names[k]->d_name);
    profiles_seen[opt.profile]++;
    st_chat_prompt p;
    st_status st = st_chat_render_request(json_object_get(c, "request"), &opt, &p);
    json_t *err = json_object_get(c, "expected_error");
    if (err) {
      const char *want_status = json_string_value(json_object_get(err, "status"));
      const char *want_msg = json_string_value(json_object_get(err, "message"));
      if (st == ST_OK) fail_msg("%s: rendered, expected %s", names[k]->d_name, want_status);
      if (strcmp(status_name(st), want_status)) fail_msg("%s: status %s (%s), expected %s", names[k]->d_name, status_name(st), st_errmsg(), want_status);
      if (want_msg && !strstr(st_errmsg(), want_msg)) fail_msg("%s: message \"%s\" lacks \"%s\"", names[k]->d_name, st_errmsg(), want_msg);
    } else {
      if (st) fail_msg("%s: %s", names[k]->d_name, st_errmsg());
      st_buf want = {0};
      size_t i;
      json_t *part;
      json_array_foreach(json_object_get(c, "expected_parts"), i, part) expand_part(&want, json_string_value(part));
      if (p.len != want.len || memcmp(p.text, want.data, want.len)) report_difference(names[k]->d_name, p.text, p.len, want.data, want.len);
      json_int_t segs = json_integer_value(json_object_get(c, "expected_segments"));
      assert_int_equal(p.n_segments, segs ? (size_t)segs : 1);
      st_buf_free(&want);
      st_chat_prompt_free(&p);
    }
    json_decref(c);
    free(names[k]);
  }
  free(names);
  for (int i = 0; i < ST_RENDER_PROFILE_COUNT; i++)
    if (profiles_seen[i] < 3) fail_msg("profile %s has only %d golden cases", st_render_profile_name(i), profiles_seen[i]);
}

/* ------------------------------------------------------------------ unit checks */

static json_t *parse(const char *text) {
  json_error_t e;
  json_t *v = json_loads(text, 0, &e);
  if (!v) fail_msg("bad test JSON: %s", e.text);
  return v;
}

static void test_detect_api(void **state) {
  (void)state;
  static const struct {
    const char *body;
    st_chat_api api;
  } cases[] = {
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", ST_API_CHAT},
    {"{\"input\": \"x\"}", ST_API_RESPONSES},
    {"{\"instructions\": \"s\", \"input\": []}", ST_API_RESPONSES},
    {"{\"system\": \"s\", \"messages\": []}", ST_API_ANTHROPIC},
    {"{\"messages\": [], \"tools\": [{\"name\": \"t\", \"input_schema\": {}}]}", ST_API_ANTHROPIC},
    {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"a\"}]}]}", ST_API_ANTHROPIC},
    {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}]}", ST_API_CHAT},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_t *v = parse(cases[i].body);
    if (st_chat_detect_api(v) != cases[i].api) fail_msg("case %zu: detected %s", i, st_chat_api_name(st_chat_detect_api(v)));
    json_decref(v);
  }
  st_render_profile p;
  assert_int_equal(st_render_profile_parse("vllm", &p), ST_OK);
  assert_int_equal(p, ST_RENDER_VLLM);
  assert_int_equal(st_render_profile_parse("tgi", &p), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "reference, sglang, vllm or atom"));
}

static void expect_encoded(const char *messages, const st_chat_encoder *enc, const char *want) {
  json_t *m = parse(messages);
  st_buf t = {0};
  if (st_chat_encode_messages(m, enc, &t)) fail_msg("%s", st_errmsg());
  if (strcmp(t.data, want)) fail_msg("encoded\n  %s\nwant\n  %s", t.data, want);
  st_buf_free(&t);
  json_decref(m);
}

/* The encoder keeps Python's f-string and truthiness semantics where they show in the prompt. */
static void test_encoder_python_semantics(void **state) {
  (void)state;
  st_chat_encoder enc;
  st_chat_encoder_default(&enc);
  enc.thinking = 0;
  enc.add_bos = 0;
  /* tool content None → str(None); missing tool_call_id → ""; list content: text parts and
  ** "[Unsupported TYPE]" joined by \n\n (§1.4 user row). */
  expect_encoded("[{\"role\": \"tool\", \"content\": null}]", &enc, "<｜User｜><tool_result>None</tool_result><｜Assistant｜></think>");
  expect_encoded("[{\"role\": \"tool\", \"tool_call_id\": \"x\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
                 " {\"type\": \"image\"}, {\"type\": \"text\", \"text\": \"b\"}]}]",
                 &enc, "<｜User｜><tool_result>a\n\n[Unsupported image]\n\nb</tool_result><｜Assistant｜></think>");
  /* latest_reminder with None content → "None"; empty tool_calls list renders nothing. */
  expect_encoded("[{\"role\": \"latest_reminder\"}]", &enc, "<｜latest_reminder｜>None");
  expect_encoded("[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": []}]", &enc, "x<｜end▁of▁sentence｜>");
  /* wo_eos leaves the EOS out; a system message with empty tools renders no block. */
  expect_encoded("[{\"role\": \"system\", \"content\": \"s\", \"tools\": []}, {\"role\": \"user\", \"content\": \"u\"},"
                 " {\"role\": \"assistant\", \"content\": \"a\", \"wo_eos\": true}]",
                 &enc, "s<｜User｜>u<｜Assistant｜></think>a");
  /* response_format on a system message (§1.4 system row). */
  expect_encoded("[{\"role\": \"system\", \"content\": \"s\", \"response_format\": {\"type\": \"json_object\"}}]", &enc,
                 "s\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{\"type\": \"json_object\"}");
  /* A non-object JSON argument is an error (Python calls .items() on it). */
  json_t *m = parse("[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"[1]\"}}]}]");
  st_buf t = {0};
  assert_int_equal(st_chat_encode_messages(m, &enc, &t), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "messages[0].tool_calls[0].function"));
  json_decref(m);
  st_buf_free(&t);
  /* An arguments object: the checkpoint's file falls back to one parameter; vLLM's copy takes it. */
  const char *obj = "[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}]";
  expect_encoded(obj, &enc, "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS "parameter name=\"arguments\" string=\"false\">"
                            "{\"a\": 1}</" DS "parameter>\n</" DS "invoke>\n</" DS "tool_calls><｜end▁of▁sentence｜>");
  enc.arguments_object_ok = 1;
  expect_encoded(obj, &enc, "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS "parameter name=\"a\" string=\"false\">"
                            "1</" DS "parameter>\n</" DS "invoke>\n</" DS "tool_calls><｜end▁of▁sentence｜>");
  /* Unknown role and bad task name are errors naming the message. */
  m = parse("[{\"role\": \"wizard\", \"content\": \"x\"}]");
  assert_int_equal(st_chat_encode_messages(m, &enc, &t), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "messages[0]"));
  json_decref(m);
  st_buf_free(&t);
  m = parse("[{\"role\": \"user\", \"content\": \"x\", \"task\": \"dance\"}]");
  assert_int_equal(st_chat_encode_messages(m, &enc, &t), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "task"));
  json_decref(m);
  st_buf_free(&t);
}

/* ------------------------------------------------------------------ ids of rendered prompts */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

/* DeepSeek-V3's tokenizer.json with V4's added tokens of §1.2 declared in tokenizer_config.json
** (the real V4 file is not reachable here; the base BPE is the same, §2.1). */
static char *v4_tokenizer_dir(void) {
  const char *why = NULL, *src = fixture_deepseek_dir(&why);
  if (!src) {
    print_message("skipped: %s\n", why);
    return NULL;
  }
  char *dir = NULL, *link = NULL, *target = NULL, *cfg = NULL;
  assert_true(asprintf(&dir, "%s/st_chat_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") > 0);
  assert_non_null(mkdtemp(dir));
  assert_true(asprintf(&link, "%s/tokenizer.json", dir) > 0);
  assert_true(asprintf(&target, "%s/tokenizer.json", src) > 0);
  assert_int_equal(symlink(target, link), 0);
  assert_true(asprintf(&cfg, "%s/tokenizer_config.json", dir) > 0);
  FILE *f = fopen(cfg, "w");
  assert_non_null(f);
  fputs("{\"add_bos_token\": false, \"added_tokens_decoder\": {"
        "\"128821\": {\"content\": \"<think>\", \"normalized\": false},"
        "\"128822\": {\"content\": \"</think>\", \"normalized\": false},"
        "\"128825\": {\"content\": \"｜DSML｜\", \"normalized\": false},"
        "\"128828\": {\"content\": \"<｜latest_reminder｜>\", \"normalized\": false},"
        "\"128829\": {\"content\": \"<｜action｜>\", \"normalized\": false}}}", f);
  fclose(f);
  free(link), free(target), free(cfg);
  return dir;
}

static void test_prompt_ids(void **state) {
  (void)state;
  char *dir = v4_tokenizer_dir();
  if (!dir) skip();
  st_tokenizer *tok = NULL;
  if (st_tokenizer_open(dir, &tok)) fail_msg("%s", st_errmsg());
  st_chat_options opt;
  st_chat_options_default(&opt);
  json_t *req = parse("{\"messages\": [{\"role\": \"user\", \"content\": \"你好\"}, {\"role\": \"assistant\", "
                      "\"reasoning_content\": \"推理\", \"content\": \"答案\"}]}");
  st_chat_prompt p;
  assert_int_equal(st_chat_render_request(req, &opt, &p), ST_OK);
  /* §2.4's V4 vector, with the BOS the encoder writes in front. */
  assert_string_equal(p.text, "<｜begin▁of▁sentence｜><｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>");
  st_token_ids ids = {0};
  assert_int_equal(st_chat_prompt_ids(tok, &p, &ids), ST_OK);
  int32_t want[] = {0, 128803, 30594, 128804, 128821, 36101, 128822, 7624, 1};
  assert_int_equal(ids.n, 9);
  assert_memory_equal(ids.ids, want, sizeof want);
  st_chat_prompt_free(&p);
  json_decref(req);
  /* sglang continue_final_message: the assistant text is tokenised on its own (§3.1 step 3):
  ** "Hel" + "lo" as separate segments, not the one token "Hello". */
  req = parse("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}],"
              " \"continue_final_message\": true}");
  opt.profile = ST_RENDER_SGLANG;
  assert_int_equal(st_chat_render_request(req, &opt, &p), ST_OK);
  assert_int_equal(p.n_segments, 2);
  ids.n = 0;
  assert_int_equal(st_chat_prompt_ids(tok, &p, &ids), ST_OK);
  st_token_ids whole = {0};
  assert_int_equal(st_tokenizer_encode(tok, p.text, p.segment_end[0], 0, &whole), ST_OK);
  assert_int_equal(st_tokenizer_encode(tok, "Hello", 5, 0, &whole), ST_OK);
  assert_int_equal(ids.n, whole.n);
  assert_memory_equal(ids.ids, whole.ids, whole.n * sizeof *whole.ids);
  assert_int_equal(ids.ids[ids.n - 1], 19923);
  st_token_ids_free(&whole);
  st_token_ids_free(&ids);
  st_chat_prompt_free(&p);
  json_decref(req);
  st_tokenizer_close(tok);
  nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
  free(dir);
}


/* Reading a completion back: the assistant turn the reference encoder renders for a message with
** tool_calls is what a model trained on it writes, so encoding then parsing must give the
** calls back (names, arguments, order) and the content before the block. */
static void test_completion_tool_calls_round_trip(void **state) {
  (void)state;
  const char *messages =
    "[{\"role\":\"user\",\"content\":\"q\"},"
    "{\"role\":\"assistant\",\"content\":\"Let me look.\",\"tool_calls\":["
    "{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"arguments\":"
    "\"{\\\"path\\\":\\\"/srv/a <b> \\\\\\\"c\\\\\\\"\\\\nline2\\\",\\\"limit\\\":40,\\\"opts\\\":{\\\"x\\\":[1,true,null]}}\"}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ls\",\"arguments\":\"{}\"}}]}]";
  json_t *m = parse(messages);
  st_chat_encoder enc;
  st_chat_encoder_default(&enc);
  st_buf t = {0};
  if (st_chat_encode_messages(m, &enc, &t)) fail_msg("%s", st_errmsg());
  /* the assistant's content: after the last <｜Assistant｜> and its </think>, before EOS */
  const char *turn = NULL;
  for (const char *q = t.data; (q = strstr(q, "<｜Assistant｜>")); q++) turn = q + strlen("<｜Assistant｜>");
  assert_non_null(turn);
  if (strstr(turn, "</think>")) turn = strstr(turn, "</think>") + 8; /* the reasoning is split off first */
  const char *eos = strstr(turn, "<｜end▁of▁sentence｜>");
  assert_non_null(eos);
  st_chat_completion c;
  assert_int_equal(st_chat_parse_completion(turn, (size_t)(eos - turn), &c), ST_OK);
  assert_int_equal(c.n_calls, 2);
  if (c.content_len != strlen("Let me look.")) fail_msg("content [%.*s]", (int)c.content_len, turn);
  assert_memory_equal(turn, "Let me look.", c.content_len);
  assert_string_equal(c.calls[0].name, "read_file");
  assert_string_equal(c.calls[1].name, "ls");
  json_t *want0 = parse("{\"path\":\"/srv/a <b> \\\"c\\\"\\nline2\",\"limit\":40,\"opts\":{\"x\":[1,true,null]}}");
  assert_true(json_equal(c.calls[0].arguments, want0));
  assert_int_equal(json_object_size(c.calls[1].arguments), 0);
  /* key order as written (the OpenAI arguments string keeps it) */
  const char *first_key = json_object_iter_key(json_object_iter(c.calls[0].arguments));
  assert_string_equal(first_key, "path");
  json_decref(want0);
  st_chat_completion_free(&c);
  st_buf_free(&t);
  json_decref(m);
}

/* Hand cases: no block, loose whitespace, a non-JSON string="false" value, broken blocks. */
static void test_completion_parse_edges(void **state) {
  (void)state;
  st_chat_completion c;
  const char *plain = "Primary working directory: /a/b";
  assert_int_equal(st_chat_parse_completion(plain, strlen(plain), &c), ST_OK);
  assert_int_equal(c.n_calls, 0);
  assert_int_equal(c.content_len, strlen(plain));
  const char *loose = "<｜DSML｜tool_calls>  <｜DSML｜invoke name=\"f\">"
                      "<｜DSML｜parameter name=\"n\" string=\"false\">not json</｜DSML｜parameter>"
                      "\n\n</｜DSML｜invoke></｜DSML｜tool_calls>";
  assert_int_equal(st_chat_parse_completion(loose, strlen(loose), &c), ST_OK);
  assert_int_equal(c.n_calls, 1);
  assert_int_equal(c.content_len, 0);
  assert_string_equal(json_string_value(json_object_get(c.calls[0].arguments, "n")), "not json");
  st_chat_completion_free(&c);
  const char *cut = "ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"p\" string=\"true\">abc";
  assert_int_equal(st_chat_parse_completion(cut, strlen(cut), &c), ST_EFORMAT);
  assert_non_null(strstr(st_errmsg(), "</｜DSML｜parameter>"));
  assert_int_equal(c.n_calls, 0);
  assert_int_equal(c.content_len, strlen(cut)); /* all of it is text */
  const char *empty = "<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>";
  assert_int_equal(st_chat_parse_completion(empty, strlen(empty), &c), ST_EFORMAT);
  const char *odd = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"p\" kind=\"x\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  assert_int_equal(st_chat_parse_completion(odd, strlen(odd), &c), ST_EFORMAT);
  assert_non_null(strstr(st_errmsg(), "byte 80"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_completion_tool_calls_round_trip),
    cmocka_unit_test(test_completion_parse_edges),
    cmocka_unit_test(test_golden_cases),
    cmocka_unit_test(test_detect_api),
    cmocka_unit_test(test_encoder_python_semantics),
    cmocka_unit_test(test_prompt_ids),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
