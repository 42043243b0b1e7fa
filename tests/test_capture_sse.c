/*
** test_capture_sse.c — the capture proxy's pure parts, without sockets: the SSE parser (line
** endings, comments, multi-line data, BOM, every possible chunk boundary, byte accounting), the
** final-message reassembly for each API from streams and from whole bodies, credential
** redaction (header names, query parameters, masking and scrubbing by value, URL userinfo),
** hop-by-hop classification and the API of a path.
*/
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "recorder/capture/capture_internal.h"

/* ---- SSE parser --------------------------------------------------------------------------- */

typedef struct seen {
  char event[16][32];
  char data[16][256];
  size_t offset[16], length[16];
  int n;
} seen;

static int collect(void *user, const char *event, size_t event_len, const char *data,
                   size_t data_len, size_t offset, size_t length) {
  seen *s = user;
  assert_true(s->n < 16);
  snprintf(s->event[s->n], 32, "%.*s", (int)event_len, event ? event : "");
  assert_true(data_len < 256);
  memcpy(s->data[s->n], data, data_len);
  s->data[s->n][data_len] = 0;
  assert_int_equal(strlen(data), data_len); /* NUL-terminated */
  s->offset[s->n] = offset;
  s->length[s->n] = length;
  s->n++;
  return 0;
}

/* Feeds text cut at every pair of positions (three pieces) and checks each result is the same
** as feeding it whole. */
static void parse_all_splits(const char *text, seen *whole) {
  size_t n = strlen(text);
  capture_sse_parser p;
  memset(whole, 0, sizeof *whole);
  capture_sse_init(&p, collect, whole);
  assert_int_equal(capture_sse_feed(&p, text, n), 0);
  capture_sse_free(&p);
  for (size_t i = 0; i <= n; i++) {
    for (size_t j = i; j <= n; j++) {
      seen s;
      memset(&s, 0, sizeof s);
      capture_sse_init(&p, collect, &s);
      assert_int_equal(capture_sse_feed(&p, text, i), 0);
      assert_int_equal(capture_sse_feed(&p, text + i, j - i), 0);
      assert_int_equal(capture_sse_feed(&p, text + j, n - j), 0);
      capture_sse_free(&p);
      assert_int_equal(s.n, whole->n);
      for (int k = 0; k < s.n; k++) {
        assert_string_equal(s.event[k], whole->event[k]);
        assert_string_equal(s.data[k], whole->data[k]);
        /* A CRLF split between pieces moves its LF to the next block: offsets may differ by
        ** one byte, never more, and blocks still tile. */
        assert_true(s.offset[k] + 1 >= whole->offset[k] && s.offset[k] <= whole->offset[k] + 1);
      }
    }
  }
}

static void test_sse_basic_fields(void **state) {
  seen s;
  parse_all_splits("event: message_start\ndata: {\"a\":1}\n\n"
                   ": this is a comment\n"
                   "data: line one\ndata: line two\n\n"
                   "event: ping\ndata:\n\n"
                   "data:no-space\nid: 7\nretry: 100\nunknown: x\n\n",
                   &s);
  assert_int_equal(s.n, 4);
  assert_string_equal(s.event[0], "message_start");
  assert_string_equal(s.data[0], "{\"a\":1}");
  assert_string_equal(s.event[1], "");
  assert_string_equal(s.data[1], "line one\nline two");
  assert_string_equal(s.event[2], "ping");
  assert_string_equal(s.data[2], "");
  assert_string_equal(s.data[3], "no-space");
  /* Blocks tile the stream: each starts where the previous one ended; the comment belongs to
  ** the second event's block. */
  assert_int_equal(s.offset[0], 0);
  assert_int_equal(s.length[0], strlen("event: message_start\ndata: {\"a\":1}\n\n"));
  for (int k = 1; k < s.n; k++) assert_int_equal(s.offset[k], s.offset[k - 1] + s.length[k - 1]);
}

static void test_sse_line_endings_and_bom(void **state) {
  seen s;
  parse_all_splits("\xEF\xBB\xBF" "data: crlf\r\n\r\ndata: cr\r\rdata: lf\n\n", &s);
  assert_int_equal(s.n, 3);
  assert_string_equal(s.data[0], "crlf");
  assert_string_equal(s.data[1], "cr");
  assert_string_equal(s.data[2], "lf");
  assert_int_equal(s.offset[0], 0);
  assert_int_equal(s.offset[1], 3 + strlen("data: crlf\r\n\r\n"));
}

static void test_sse_no_dispatch_without_data(void **state) {
  seen s;
  capture_sse_parser p;
  memset(&s, 0, sizeof s);
  capture_sse_init(&p, collect, &s);
  const char *text = "event: lonely\n\n: keepalive\n\ndata: x\n";
  capture_sse_feed(&p, text, strlen(text));
  assert_int_equal(s.n, 0);          /* fields without data, comments: nothing dispatched */
  assert_true(capture_sse_pending(&p)); /* "data: x" waits for its blank line */
  capture_sse_feed(&p, "\n", 1);
  assert_int_equal(s.n, 1);
  assert_string_equal(s.event[0], ""); /* the event name was reset by the earlier blank line */
  assert_int_equal(s.offset[0], 0);    /* and the data-less blocks belong to this event */
  assert_false(capture_sse_pending(&p));
  capture_sse_free(&p);
}

static void test_sse_bom_lookalike(void **state) {
  seen s;
  parse_all_splits("\xEF\xBB" "X: y\ndata: after\n\n", &s); /* starts like a BOM, is not one */
  assert_int_equal(s.n, 1);
  assert_string_equal(s.data[0], "after");
}

/* ---- reassembly --------------------------------------------------------------------------- */

/* Parses an SSE text into capture events (the way the relay records them). */
typedef struct events {
  capture_event ev[64];
  size_t n;
} events;

static int to_events(void *user, const char *event, size_t event_len, const char *data,
                     size_t data_len, size_t offset, size_t length) {
  events *e = user;
  capture_event *c = &e->ev[e->n++];
  c->event = event ? strndup(event, event_len) : NULL;
  c->data = strndup(data, data_len);
  c->data_len = data_len;
  c->offset = offset;
  c->length = length;
  return 0;
}

static json_t *reassemble(capture_api api, const char *sse) {
  events e;
  memset(&e, 0, sizeof e);
  capture_sse_parser p;
  capture_sse_init(&p, to_events, &e);
  capture_sse_feed(&p, sse, strlen(sse));
  capture_sse_free(&p);
  json_t *m = capture_message_from_events(api, e.ev, e.n);
  for (size_t i = 0; i < e.n; i++) {
    free(e.ev[i].event);
    free(e.ev[i].data);
  }
  return m;
}

static const char *str(json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : "(null)";
}

static void check_weather_call(json_t *m, const char *id) {
  json_t *calls = json_object_get(m, "tool_calls");
  assert_int_equal(json_array_size(calls), 1);
  json_t *c = json_array_get(calls, 0);
  assert_string_equal(str(c, "name"), "get_weather");
  if (id) assert_string_equal(str(c, "id"), id);
  assert_string_equal(str(json_object_get(c, "arguments"), "location"), "San Francisco");
}

static void test_reassemble_anthropic(void **state) {
  const char *sse =
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\","
    "\"model\":\"claude-x\",\"role\":\"assistant\",\"content\":[],\"stop_reason\":null,"
    "\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":5,"
    "\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n"
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
    "\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n"
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
    "\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}\n\n"
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,"
    "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
    "event: ping\ndata: {\"type\": \"ping\"}\n\n"
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,"
    "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello \"}}\n\n"
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,"
    "\"delta\":{\"type\":\"text_delta\",\"text\":\"w\xC3\xB6rld\"}}\n\n"
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n"
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,"
    "\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\","
    "\"input\":{}}}\n\n"
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,"
    "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"location\\\": \\\"San\"}}\n\n"
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,"
    "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\" Francisco\\\"}\"}}\n\n"
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
    "\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":42}}\n\n"
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
  json_t *m = reassemble(CAPTURE_API_ANTHROPIC_MESSAGES, sse);
  assert_non_null(m);
  assert_string_equal(str(m, "id"), "msg_1");
  assert_string_equal(str(m, "model"), "claude-x");
  assert_string_equal(str(m, "text"), "Hello w\xC3\xB6rld");
  assert_string_equal(str(m, "thinking"), "hmm");
  assert_string_equal(str(m, "stop_reason"), "tool_use");
  assert_int_equal(json_integer_value(json_object_get(m, "input_tokens")), 115);
  assert_int_equal(json_integer_value(json_object_get(m, "output_tokens")), 42);
  assert_true(json_is_true(json_object_get(m, "complete")));
  check_weather_call(m, "toolu_1");
  json_decref(m);

  /* Cut before message_stop, with an error event: incomplete, error kept. */
  m = reassemble(CAPTURE_API_ANTHROPIC_MESSAGES,
                 "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\n"
                 "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
                 "\"message\":\"Overloaded\"}}\n\n");
  assert_false(json_is_true(json_object_get(m, "complete")));
  assert_string_equal(str(json_object_get(m, "error"), "type"), "overloaded_error");
  json_decref(m);
}

static void test_reassemble_openai_chat(void **state) {
  const char *sse =
    "data: {\"id\":\"c1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"role\":"
    "\"assistant\",\"content\":\"\",\"reasoning_content\":\"think \"}}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other choice\"}}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
    "\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"arguments\":\"\"}}]}}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
    "\"function\":{\"arguments\":\"{\\\"location\\\":\"}}]}}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
    "\"function\":{\"arguments\":\" \\\"San Francisco\\\"}\"}}]}}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\n"
    "data: [DONE]\n\n";
  json_t *m = reassemble(CAPTURE_API_OPENAI_CHAT, sse);
  assert_non_null(m);
  assert_string_equal(str(m, "text"), "Hi");
  assert_string_equal(str(m, "thinking"), "think ");
  assert_string_equal(str(m, "stop_reason"), "tool_calls");
  assert_int_equal(json_integer_value(json_object_get(m, "input_tokens")), 7);
  assert_int_equal(json_integer_value(json_object_get(m, "output_tokens")), 3);
  assert_true(json_is_true(json_object_get(m, "complete")));
  check_weather_call(m, "call_1");
  json_decref(m);

  /* Arguments that never became valid JSON are kept as text and flagged. */
  m = reassemble(CAPTURE_API_OPENAI_CHAT,
                 "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
                 "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": \"}}]}}]}\n\n");
  json_t *c = json_array_get(json_object_get(m, "tool_calls"), 0);
  assert_true(json_is_null(json_object_get(c, "arguments")));
  assert_string_equal(str(c, "arguments_text"), "{\"a\": ");
  assert_true(json_is_true(json_object_get(c, "arguments_malformed")));
  assert_false(json_is_true(json_object_get(m, "complete")));
  json_decref(m);

  /* A mid-stream error chunk, and a non-JSON event. */
  m = reassemble(CAPTURE_API_OPENAI_CHAT, "data: {\"error\":{\"message\":\"boom\"}}\n\ndata: oops\n\n");
  assert_string_equal(str(json_object_get(m, "error"), "message"), "boom");
  assert_int_equal(json_integer_value(json_object_get(m, "unparsed_events")), 1);
  json_decref(m);
}

static void test_reassemble_openai_completions(void **state) {
  json_t *m = reassemble(CAPTURE_API_OPENAI_COMPLETIONS,
                         "data: {\"id\":\"x\",\"choices\":[{\"text\":\"one \",\"index\":0}]}\n\n"
                         "data: {\"id\":\"x\",\"choices\":[{\"text\":\"two\",\"index\":0,"
                         "\"finish_reason\":\"length\"}]}\n\n"
                         "data: [DONE]\n\n");
  assert_string_equal(str(m, "text"), "one two");
  assert_string_equal(str(m, "stop_reason"), "length");
  json_decref(m);
}

static void test_reassemble_openai_responses(void **state) {
  /* Deltas only (no response.completed): built from the deltas. */
  const char *deltas =
    "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\","
    "\"model\":\"gpt-5\",\"output\":[]}}\n\n"
    "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\","
    "\"output_index\":0,\"item\":{\"type\":\"reasoning\",\"summary\":[]}}\n\n"
    "event: response.reasoning_summary_text.delta\ndata: {\"type\":"
    "\"response.reasoning_summary_text.delta\",\"output_index\":0,\"delta\":\"plan\"}\n\n"
    "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\","
    "\"output_index\":1,\"item\":{\"type\":\"message\",\"content\":[]}}\n\n"
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\","
    "\"output_index\":1,\"delta\":\"Hel\"}\n\n"
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\","
    "\"output_index\":1,\"delta\":\"lo\"}\n\n"
    "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\","
    "\"output_index\":2,\"item\":{\"type\":\"function_call\",\"call_id\":\"call_9\",\"name\":"
    "\"get_weather\",\"arguments\":\"\"}}\n\n"
    "event: response.function_call_arguments.delta\ndata: {\"type\":"
    "\"response.function_call_arguments.delta\",\"output_index\":2,\"delta\":"
    "\"{\\\"location\\\":\\\"San Francisco\\\"}\"}\n\n";
  json_t *m = reassemble(CAPTURE_API_OPENAI_RESPONSES, deltas);
  assert_string_equal(str(m, "id"), "resp_1");
  assert_string_equal(str(m, "text"), "Hello");
  assert_string_equal(str(m, "thinking"), "plan");
  assert_false(json_is_true(json_object_get(m, "complete")));
  check_weather_call(m, "call_9");
  json_decref(m);

  /* With response.completed: its output is authoritative, usage and status come from it. */
  char *full = NULL;
  assert_true(asprintf(&full, "%s%s", deltas,
                       "event: response.completed\ndata: {\"type\":\"response.completed\","
                       "\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"output\":["
                       "{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":"
                       "\"Hello!\"}]},{\"type\":\"function_call\",\"call_id\":\"call_9\",\"name\":"
                       "\"get_weather\",\"arguments\":\"{\\\"location\\\":\\\"San Francisco\\\"}\"}],"
                       "\"usage\":{\"input_tokens\":12,\"output_tokens\":4}}}\n\n") > 0);
  m = reassemble(CAPTURE_API_OPENAI_RESPONSES, full);
  free(full);
  assert_string_equal(str(m, "text"), "Hello!");
  assert_string_equal(str(m, "stop_reason"), "completed");
  assert_int_equal(json_integer_value(json_object_get(m, "input_tokens")), 12);
  assert_true(json_is_true(json_object_get(m, "complete")));
  check_weather_call(m, "call_9");
  json_decref(m);
}

static void test_reassemble_bodies(void **state) {
  const char *anthropic =
    "{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":["
    "{\"type\":\"text\",\"text\":\"Hi\"},{\"type\":\"tool_use\",\"id\":\"t\",\"name\":"
    "\"get_weather\",\"input\":{\"location\":\"San Francisco\"}}],\"stop_reason\":\"tool_use\","
    "\"usage\":{\"input_tokens\":3,\"output_tokens\":2}}";
  json_t *m = capture_message_from_body(CAPTURE_API_ANTHROPIC_MESSAGES, anthropic, strlen(anthropic));
  assert_string_equal(str(m, "text"), "Hi");
  assert_string_equal(str(m, "stop_reason"), "tool_use");
  assert_int_equal(json_integer_value(json_object_get(m, "input_tokens")), 3);
  check_weather_call(m, "t");
  json_decref(m);

  const char *chat =
    "{\"id\":\"c\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
    "\"Yo\",\"tool_calls\":[{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":"
    "\"get_weather\",\"arguments\":\"{\\\"location\\\":\\\"San Francisco\\\"}\"}}]},"
    "\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1}}";
  m = capture_message_from_body(CAPTURE_API_OPENAI_CHAT, chat, strlen(chat));
  assert_string_equal(str(m, "text"), "Yo");
  assert_int_equal(json_integer_value(json_object_get(m, "input_tokens")), 9);
  check_weather_call(m, "call_2");
  json_decref(m);

  const char *err = "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"x\"}}";
  m = capture_message_from_body(CAPTURE_API_ANTHROPIC_MESSAGES, err, strlen(err));
  assert_string_equal(str(json_object_get(m, "error"), "type"), "invalid_request_error");
  json_decref(m);

  assert_null(capture_message_from_body(CAPTURE_API_OPENAI_CHAT, "not json", 8));
  assert_null(capture_message_from_body(CAPTURE_API_OTHER, chat, strlen(chat)));
}

static void test_event_names(void **state) {
  char scratch[64];
  capture_event a = {.event = "message_start", .data = "{}", .data_len = 2};
  capture_event b = {.data = "[DONE]", .data_len = 6};
  capture_event c = {.data = "{\"type\":\"response.created\"}", .data_len = 27};
  capture_event d = {.data = "{\"id\":1}", .data_len = 8};
  capture_event e = {.data = "{\"error\":{}}", .data_len = 12};
  assert_string_equal(capture_event_name(&a, scratch, sizeof scratch), "message_start");
  assert_string_equal(capture_event_name(&b, scratch, sizeof scratch), "[DONE]");
  assert_string_equal(capture_event_name(&c, scratch, sizeof scratch), "response.created");
  assert_string_equal(capture_event_name(&d, scratch, sizeof scratch), "message");
  assert_string_equal(capture_event_name(&e, scratch, sizeof scratch), "error");
}

/* ---- redaction and header rules ----------------------------------------------------------- */

static void test_secret_header_names(void **state) {
  const char *secret[] = {"Authorization", "authorization", "Proxy-Authorization", "x-api-key",
                          "X-Api-Key", "api-key", "anthropic-api-key", "openai-api-key",
                          "x-goog-api-key", "Cookie", "Set-Cookie", "x-auth-token",
                          "ocp-apim-subscription-key", "X-Session-Id", "x-amz-security-token"};
  for (size_t i = 0; i < sizeof secret / sizeof secret[0]; i++)
    assert_true(capture_header_is_secret(secret[i]));
  const char *plain[] = {"anthropic-version", "anthropic-beta", "content-type", "user-agent",
                         "openai-organization", "x-stainless-lang", "accept", "host"};
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
    assert_false(capture_header_is_secret(plain[i]));
  assert_true(capture_query_param_is_secret("key", 3));
  assert_true(capture_query_param_is_secret("api_key", 7));
  assert_true(capture_query_param_is_secret("access_token", 12));
  assert_false(capture_query_param_is_secret("beta", 4));
}

static void test_secrets_mask_and_scrub(void **state) {
  capture_secrets s = {0};
  assert_int_equal(capture_secrets_add_header(&s, "Authorization", "Bearer sk-live-0123456789"), 0);
  assert_int_equal(capture_secrets_add_header(&s, "Cookie", "session=abcdefghijkl; theme=dark"), 0);
  assert_int_equal(capture_secrets_add_header(&s, "content-type", "application/json"), 0);
  char body[] = "token sk-live-0123456789 and abcdefghijkl and dark and sk-live-0123456789";
  char expect[] = "token ****************** and ************ and dark and ******************";
  size_t n = capture_secrets_mask(&s, body, strlen(body));
  assert_int_equal(n, 3); /* "dark" is shorter than CAPTURE_SECRET_MIN: left alone */
  assert_string_equal(body, expect);
  char *text = capture_secrets_scrub(&s, "upstream said: bad key sk-live-0123456789!");
  assert_string_equal(text, "upstream said: bad key [redacted]!");
  free(text);
  int oom = 0;
  char *q = capture_redact_query(&s, "beta=true&key=AIzaSecretValue123&x=1", &oom);
  assert_string_equal(q, "beta=true&key=[redacted]&x=1");
  free(q);
  text = capture_secrets_scrub(&s, "GET /v1/models?key=AIzaSecretValue123");
  assert_null(strstr(text, "AIzaSecretValue123"));
  free(text);
  capture_secrets_free(&s);

  char *u = capture_url_without_credentials("https://user:pa55word@host.example:8443/api?x=1");
  assert_string_equal(u, "https://host.example:8443/api?x=1");
  free(u);
  u = capture_url_without_credentials("http://127.0.0.1:9/v1");
  assert_string_equal(u, "http://127.0.0.1:9/v1");
  free(u);
}

static void test_hop_by_hop_and_api(void **state) {
  assert_true(capture_header_is_hop_by_hop("Connection", NULL));
  assert_true(capture_header_is_hop_by_hop("keep-alive", NULL));
  assert_true(capture_header_is_hop_by_hop("Transfer-Encoding", NULL));
  assert_true(capture_header_is_hop_by_hop("TE", NULL));
  assert_true(capture_header_is_hop_by_hop("Upgrade", NULL));
  assert_true(capture_header_is_hop_by_hop("Host", NULL));
  assert_true(capture_header_is_hop_by_hop("X-Private", "close, X-Private"));
  assert_false(capture_header_is_hop_by_hop("X-Private", "close"));
  assert_false(capture_header_is_hop_by_hop("x-api-key", "keep-alive"));
  assert_false(capture_header_is_hop_by_hop("anthropic-version", NULL));

  assert_int_equal(capture_api_from_path("/v1/messages"), CAPTURE_API_ANTHROPIC_MESSAGES);
  assert_int_equal(capture_api_from_path("/api/v1/messages/"), CAPTURE_API_ANTHROPIC_MESSAGES);
  assert_int_equal(capture_api_from_path("/v1/messages/count_tokens"), CAPTURE_API_OTHER);
  assert_int_equal(capture_api_from_path("/v1/chat/completions"), CAPTURE_API_OPENAI_CHAT);
  assert_int_equal(capture_api_from_path("/v1/completions"), CAPTURE_API_OPENAI_COMPLETIONS);
  assert_int_equal(capture_api_from_path("/v1/responses"), CAPTURE_API_OPENAI_RESPONSES);
  assert_int_equal(capture_api_from_path("/v1/models"), CAPTURE_API_OTHER);
  assert_string_equal(capture_api_name(CAPTURE_API_OPENAI_RESPONSES), "openai.responses");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_sse_basic_fields),
    cmocka_unit_test(test_sse_line_endings_and_bom),
    cmocka_unit_test(test_sse_no_dispatch_without_data),
    cmocka_unit_test(test_sse_bom_lookalike),
    cmocka_unit_test(test_reassemble_anthropic),
    cmocka_unit_test(test_reassemble_openai_chat),
    cmocka_unit_test(test_reassemble_openai_completions),
    cmocka_unit_test(test_reassemble_openai_responses),
    cmocka_unit_test(test_reassemble_bodies),
    cmocka_unit_test(test_event_names),
    cmocka_unit_test(test_secret_header_names),
    cmocka_unit_test(test_secrets_mask_and_scrub),
    cmocka_unit_test(test_hop_by_hop_and_api),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
